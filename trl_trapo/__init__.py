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
    "UncertaintyWeighting": "weighting",
    "GradNormWeighting": "weighting",
    "GACWeighting": "weighting",
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
    "UncertaintyWeighting",
    "GradNormWeighting",
    "GACWeighting",
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
    from .weighting import DARE, DAREWeighting, GACWeighting, GradNormWeighting, StaticWeighting, UncertaintyWeighting


_VALUE_HEAD = (
    "pass the policy as `model=` (an `AutoModelForCausalLM`) and the critic as `value_model=` "
    "(`AutoModelForSequenceClassification.from_pretrained(..., num_labels=1)`) to PPOTrainer"
)
TRL0_NAMES = {
    "AutoModelForCausalLMWithValueHead": _VALUE_HEAD,
    "AutoModelForSeq2SeqLMWithValueHead": _VALUE_HEAD + " (decoder-only models only)",
    "PPOv2Trainer": "use PPOTrainer (TRL 1.x's name of PPOv2Trainer, same arguments)",
    "PPOv2Config": "use PPOConfig (TRL 1.x's name of PPOv2Config, same fields)",
    "create_reference_model": "pass `ref_model=None`: PPOTrainer copies the policy as the frozen reference",
}
"""Names TRL 0.x scripts import next to `PPOTrainer` that TRL 1.x (and so trl_trapo) dropped -> what to use."""


class _RemovedName(type):
    """Metaclass of the placeholder a TRL 0.x name resolves to (as transformers' `DummyObject` stands for a class
    whose backend is missing): `from trl_trapo import X` works, and any use of `X` raises the message naming the
    replacement, which an `AttributeError` from `__getattr__` would lose to Python's "cannot import name"."""

    def _refuse(cls):
        raise ImportError(
            f"trl_trapo has no {cls.__name__}: it is a TRL 0.x name that TRL 1.x's PPOTrainer, which trl_trapo "
            f"follows, dropped; {TRL0_NAMES[cls.__name__]} (docs/migrating_from_ppo.md)."
        )

    def __call__(cls, *args, **kwargs):
        cls._refuse()

    def __getattr__(cls, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        cls._refuse()


def __getattr__(name: str):
    """A public name of `__all__` (its module imported now, the value cached here), a submodule
    (`trl_trapo.tasks`), or for a TRL 0.x name of `TRL0_NAMES` a placeholder whose use raises an `ImportError` naming
    the replacement.

    Raises:
        AttributeError: for any other name, as a module without it would.
    """
    if name in TRL0_NAMES:
        return _RemovedName(name, (), {"__module__": __name__})
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
