# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Test-wide settings and fixtures: everything runs offline on the CPU, without telemetry, on the tiny built-in model.

Fixtures:
- `tokenizer`: the character-level tokenizer of the built-in tasks (one per test module);
- `suite`: the built-in task suite at `TINY_SUITE` sizes (one per test module; a module may override it);
- `tiny_config`: factory `tiny_config(output_dir, **overrides) -> TRAPOConfig` (`TINY_CONFIG`, then `overrides`);
- `tiny_trainer`: factory `tiny_trainer(output_dir, tokenizer, suite, model=None, train_dataset=None, **overrides)
  -> TRAPOTrainer` on all three objectives of `suite` (RL with exact match), tiny model seeded 0 by default.

`TINY_CONFIG` and `TINY_SUITE` are plain dicts so that the worker scripts the tests launch in subprocesses
(`tests/durability_worker.py`, `tests/distributed_worker.py`) share them: `from conftest import TINY_CONFIG`.
"""

from __future__ import annotations

import os


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402

from trl_trapo import TRAPOConfig, TRAPOTrainer  # noqa: E402
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite  # noqa: E402


# a few fast CPU steps on the tiny model: short sequences, small groups, no saving or reporting
TINY_CONFIG = dict(
    max_steps=4,
    per_device_train_batch_size=8,
    learning_rate=1e-3,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    gradient_checkpointing=False,
    pretrain_max_length=24,
    sft_max_length=24,
    max_prompt_length=16,
    response_length=4,
    num_generations=4,
    seed=0,
)
# sizes of the built-in task suite most trainer tests use (`make_task_suite(seed=0, **TINY_SUITE)`)
TINY_SUITE = dict(num_pretrain_docs=60, num_sft_per_task=20, num_rl_per_task=20, num_eval_per_task=4)


def make_tiny_config(output_dir, **overrides) -> TRAPOConfig:
    """`TRAPOConfig` writing to `output_dir` with `TINY_CONFIG`, then `overrides`."""
    return TRAPOConfig(output_dir=str(output_dir), **{**TINY_CONFIG, **overrides})


def make_tiny_trainer(output_dir, tokenizer, suite, model=None, train_dataset=None, **overrides) -> TRAPOTrainer:
    """`TRAPOTrainer` on all three objectives of `suite` (RL with exact match), tiny model seeded 0 by default."""
    return TRAPOTrainer(
        model if model is not None else build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=make_tiny_config(output_dir, **overrides),
        train_dataset=suite.rl_train if train_dataset is None else train_dataset,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )


@pytest.fixture(scope="module")
def tokenizer():
    """The character-level tokenizer of the built-in tasks."""
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def suite():
    """The built-in task suite at `TINY_SUITE` sizes, seed 0."""
    return make_task_suite(seed=0, **TINY_SUITE)


@pytest.fixture
def tiny_config():
    """Factory: `tiny_config(output_dir, **overrides)` -> `TRAPOConfig` (`TINY_CONFIG`, then `overrides`)."""
    return make_tiny_config


@pytest.fixture
def tiny_trainer():
    """Factory: `tiny_trainer(output_dir, tokenizer, suite, model=None, train_dataset=None, **overrides)`."""
    return make_tiny_trainer
