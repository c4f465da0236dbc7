# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""trl-trapo: pretraining, SFT and RL objectives in one TRL training loop (TRAPO)."""

__version__ = "0.1.0.dev0"

from .config import TRAPOConfig
from .controllers import AdaptiveKLController, Controller, FixedKLController
from .curriculum import CurriculumSchedule
from .grpo import GRPOConfig
from .interrupts import TrainingAborted, TrainingInterrupted
from .objectives import DemonstrationObjective, LanguageModelingObjective, Objective
from .ppo import PPOConfig, PPOTrainer
from .rewards import numeric_answer_reward
from .trainer import TRAPOTrainer
from .weighting import DARE, DAREWeighting, StaticWeighting


__all__ = [
    "TRAPOConfig",
    "TRAPOTrainer",
    "PPOConfig",
    "PPOTrainer",
    "GRPOConfig",
    "Controller",
    "AdaptiveKLController",
    "FixedKLController",
    "CurriculumSchedule",
    "DARE",
    "DAREWeighting",
    "StaticWeighting",
    "Objective",
    "DemonstrationObjective",
    "LanguageModelingObjective",
    "numeric_answer_reward",
    "TrainingInterrupted",
    "TrainingAborted",
]
