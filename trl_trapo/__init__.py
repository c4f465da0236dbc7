# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""trl-trapo: pretraining, SFT and RL objectives in one TRL training loop (TRAPO).

Imports are lazy (PEP 562, as TRL's own package is lazy): `import trl_trapo` loads no submodule, and each public name
(`from trl_trapo import TRAPOTrainer`, `trl_trapo.PPOConfig`) loads its module on first use. So a script never pays
for a capability it does not use: the tool-calling agents (`trl_trapo.agents`), asynchronous rollouts
(`trl_trapo.async_rollouts`), the jobs and the command line are imported where they are built.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING


__version__ = "0.1.0.dev0"

# public name -> the submodule that defines it
_EXPORTS = {
    "TRAPOConfig": "config",
    "TRAPOTrainer": "trainer",
    "PPOConfig": "ppo",
    "PPOTrainer": "ppo",
    "GRPOConfig": "grpo",
    "Controller": "controllers",
    "AdaptiveKLController": "controllers",
    "FixedKLController": "controllers",
    "CurriculumSchedule": "curriculum",
    "DARE": "weighting",
    "DAREWeighting": "weighting",
    "StaticWeighting": "weighting",
    "Objective": "objectives",
    "DemonstrationObjective": "objectives",
    "LanguageModelingObjective": "objectives",
    "numeric_answer_reward": "rewards",
    "TrainingInterrupted": "interrupts",
    "TrainingAborted": "interrupts",
}

__all__ = [  # the names of `_EXPORTS` (tests/test_layout.py resolves each one)
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

if TYPE_CHECKING:  # what type checkers and IDEs see; never runs
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


def __getattr__(name: str):
    """A public name of `__all__` (its module imported now, the value cached here), or a submodule
    (`trl_trapo.tasks`).

    Raises:
        AttributeError: for any other name, as a module without it would.
    """
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # later lookups do not come back here
        return value
    here = Path(__file__).parent
    if not name.startswith("_") and ((here / f"{name}.py").is_file() or (here / name / "__init__.py").is_file()):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
