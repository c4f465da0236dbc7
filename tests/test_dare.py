"""DARE reacts to signal, not noise: an objective fed useless data loses weight against its static value."""

from __future__ import annotations

import pytest

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.config import RL
from trl_trapo.tasks import build_tiny_model, make_task_suite
from trl_trapo.weighting import combine_weights


def constant_reward(prompts, completions, **kwargs):
    """Useless for learning: every completion gets the same reward, so every advantage is 0."""
    return [1.0] * len(completions)


def letter_a_reward(prompts, completions, **kwargs):
    """Informative from the first step: the share of 'a' characters, which the policy can learn to raise."""
    return [c.count("a") / max(len(c), 1) for c in completions]


@pytest.fixture(scope="module")
def setup(tokenizer):
    suite = make_task_suite(
        seed=0, num_pretrain_docs=200, num_sft_per_task=50, num_rl_per_task=50, num_eval_per_task=4
    )
    return tokenizer, suite


def run(tmp_path, setup, reward, updates: int):
    tokenizer, suite = setup
    args = TRAPOConfig(
        output_dir=str(tmp_path),
        max_steps=updates + 1,
        per_device_train_batch_size=32,
        learning_rate=2e-3,
        weighting="dare",  # DARE is this file's subject; the default is static weights
        dare_update_interval=1,  # an update after every step
        curriculum_mixtures=[0.25, 0.25, 0.5] * 3,  # constant shares: the weights move only through DARE
        kl_coef=0.0,
        num_generations=8,
        response_length=6,
        pretrain_max_length=32,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        activation_checkpointing=False,
        seed=0,
    )
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        args=args,
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        pretrain_dataset=suite.pretrain,
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer


UPDATES = 3  # stated bound: the weight of a useless objective is below its static value within 3 updates


def test_constant_reward_loses_weight_within_three_updates(tmp_path, setup):
    trainer = run(tmp_path, setup, constant_reward, UPDATES)
    engine = trainer.dare.engine
    assert engine.num_updates == UPDATES
    assert engine.signals[RL] == 0.0  # zero advantages: no RL signal at all, by construction
    static = combine_weights([o.weight for o in trainer.objectives], trainer.step_builder.last_shares, (1.0, 1.0, 1.0))
    dynamic = combine_weights([o.weight for o in trainer.objectives], trainer.step_builder.last_shares, engine.value())
    assert dynamic[RL] < static[RL]
    assert engine.value()[RL] < 1.0 < max(engine.value()[:RL])


def test_informative_reward_keeps_more_weight_than_constant_reward(tmp_path, setup):
    # single measurements are noisy (a split-half cosine over a few rows); over 10 updates the informative reward's
    # mean signal is clearly above the probe's noise floor and its factor stays near 1
    informative = run(tmp_path / "informative", setup, letter_a_reward, 10).dare.engine
    useless = run(tmp_path / "useless", setup, constant_reward, 10).dare.engine
    assert informative.signal_sums[RL] / informative.signal_counts[RL] > informative.noise_floor
    assert useless.signal_sums[RL] == 0.0
    assert informative.value()[RL] > useless.value()[RL] + 0.2
