# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Shared builders of the tests: a tiny TRAPOConfig and a three-objective trainer on the built-in task suite."""

from __future__ import annotations

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.tasks import build_tiny_model, exact_match_reward


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


def tiny_config(tmp_path, **overrides) -> TRAPOConfig:
    """`TRAPOConfig` writing to `tmp_path` with `TINY_CONFIG`, then `overrides`."""
    return TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, **overrides})


def tiny_trainer(tmp_path, tokenizer, suite, model=None, train_dataset=None, **overrides) -> TRAPOTrainer:
    """`TRAPOTrainer` on all three objectives of `suite` (RL with exact match), tiny model seeded 0 by default."""
    return TRAPOTrainer(
        model if model is not None else build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, **overrides),
        train_dataset=suite.rl_train if train_dataset is None else train_dataset,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
