# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Few-shot mode changes what it says: reuse limit, annealed temperature with exact ratios, prototype preference; it
plugs in from `experimental/` (its trainer subclass), which `TRAPOTrainer` and the command line point to."""

import dataclasses
import math

import pytest
import torch
from conftest import TINY_CONFIG

from trl_trapo import TRAPOConfig, TRAPOTrainer, cli
from trl_trapo.collator import StepContext, collate_rows
from trl_trapo.data import tokenize_prompt
from trl_trapo.experimental.fewshot import FewShotController, FewShotTRAPOTrainer, PrototypeMemory, fewshot_sigma
from trl_trapo.rollout import generate
from trl_trapo.tasks import build_tiny_model, exact_match_reward


@pytest.fixture
def make_trainer(tiny_trainer):
    """Factory: the tiny few-shot trainer, 10 steps, temperature 0.9 (then `overrides`)."""

    def make(tmp_path, tokenizer, suite, train_dataset=None, **overrides):
        overrides = {"max_steps": 10, "temperature": 0.9, "fewshot_mode": True, **overrides}
        return tiny_trainer(
            tmp_path, tokenizer, suite, train_dataset=train_dataset, trainer_class=FewShotTRAPOTrainer, **overrides
        )

    return make


def test_trapo_trainer_refuses_fewshot_mode_and_names_the_trainer_that_runs_it(
    tmp_path, tokenizer, suite, tiny_trainer
):
    with pytest.raises(
        ValueError, match=r"fewshot_mode=True.*Fix: train with .*experimental\.fewshot\.FewShotTRAPOTrainer"
    ):
        tiny_trainer(tmp_path, tokenizer, suite, fewshot_mode=True)
    with pytest.raises(ValueError, match=r"fewshot_mode=False.*Fix: set fewshot_mode=True"):
        tiny_trainer(tmp_path, tokenizer, suite, trainer_class=FewShotTRAPOTrainer)
    assert tiny_trainer(tmp_path, tokenizer, suite).memory_pool.selector is None


def test_the_command_line_picks_the_fewshot_trainer(tmp_path):
    script_args, training_args, model_args = cli.parse_args(
        ["--output_dir", str(tmp_path), "--fewshot_mode", "--max_steps", "2", "--report_to", "none"]
    )
    trainer, _ = cli.build_trainer(script_args, training_args, model_args)
    assert type(trainer) is FewShotTRAPOTrainer and isinstance(trainer.memory_pool.selector, FewShotController)
    assert trainer.replay.max_uses == max(training_args.num_ppo_epochs, training_args.fewshot_max_uses)


def test_reuse_limit_is_raised(tmp_path, tokenizer, suite, make_trainer, tiny_trainer):
    assert tiny_trainer(tmp_path, tokenizer, suite, max_steps=10).replay.max_uses == 4
    assert type(tiny_trainer(tmp_path, tokenizer, suite)) is TRAPOTrainer
    assert make_trainer(tmp_path, tokenizer, suite).replay.max_uses == 5
    assert make_trainer(tmp_path, tokenizer, suite, num_ppo_epochs=6).replay.max_uses == 6
    assert make_trainer(tmp_path, tokenizer, suite, fewshot_max_uses=3, num_ppo_epochs=1).replay.max_uses == 3


def test_sigma_and_temperature_schedule(tmp_path, tokenizer, suite, make_trainer):
    assert fewshot_sigma(0, 10, (0.3, 0.1)) == pytest.approx(0.3)
    assert fewshot_sigma(5, 10, (0.3, 0.1)) == pytest.approx(0.2)
    assert fewshot_sigma(20, 10, (0.3, 0.1)) == pytest.approx(0.1)
    controller = make_trainer(tmp_path, tokenizer, suite).memory_pool.selector
    assert controller.temperature_at(0) == pytest.approx(0.9)
    assert controller.temperature_at(5) == pytest.approx(0.6)
    assert controller.temperature_at(10) == pytest.approx(0.3)


def test_each_trajectory_keeps_its_temperature_and_ratios_stay_exact(tmp_path, tokenizer, suite, make_trainer):
    trainer = make_trainer(tmp_path, tokenizer, suite, kl_coef=0.05)
    trainer.state.global_step = 5  # T = 0.9 * 0.2 / 0.3 = 0.6
    trainer.collect_rollouts(8, step=5)
    assert trainer.memory_pool.rollout_temperature(0.9) == pytest.approx(0.6)
    # the config is never changed; the generation config holds no temperature (each row's is applied by `generate`)
    assert trainer.args.temperature == 0.9 and trainer.generation_config.temperature == 1.0
    trainer.state.global_step = 10  # a later round at T = 0.3: the buffer now mixes two temperatures
    trainer.collect_rollouts(8, step=10)
    trajectories = trainer.replay.sample(len(trainer.replay), step=10)
    assert sorted({round(t.temperature, 6) for t in trajectories}) == [0.3, 0.6]
    rows = [t.to_row() for t in trajectories]
    batch = collate_rows(rows, tokenizer.pad_token_id)
    assert sorted(set(batch["temperature"].tolist())) == pytest.approx([0.3, 0.6])
    tokens = float(batch["mask"].sum())
    info = StepContext(
        weights=(0.0, 0.0, 1.0),
        counts={
            "tokens_pretrain": 0.0,
            "tokens_sft": 0.0,
            "tokens_rl": tokens,
            "sequences_rl": float(len(rows)),
            "micro_batches_rl": 1.0,
        },
        probe=False,
        step=10,
        num_micro=1,
    )
    assert trainer.args.temperature == 0.9  # the training forward must not depend on the current rollout temperature
    with torch.no_grad():
        trainer.compute_loss(trainer.model, batch, num_items_in_batch=info)
    assert trainer.metrics.step_sums["val/ratio"].item() == pytest.approx(1.0, abs=1e-5)
    assert trainer.metrics.step_sums["policy/approxkl_avg"].item() == pytest.approx(0.0, abs=1e-8)
    # without the per-row temperatures (one configured temperature for every row) the ratios would be wrong
    trainer.metrics.reset()
    del batch["temperature"]
    with torch.no_grad():
        trainer.compute_loss(trainer.model, batch, num_items_in_batch=dataclasses.replace(info, micro_index=0))
    assert trainer.metrics.step_sums["policy/approxkl_avg"].item() > 1e-3


def test_need_by_hand():
    memory = PrototypeMemory(max_prototypes=4, momentum=0.5)
    e = torch.eye(3)
    ids = memory.assign(e, ["a", "b", "c"])
    assert ids.tolist() == [0, 1, 2] and memory.labels == ["a", "b", "c"]
    memory.observe_rewards(torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, 0.0, 1.0, 1.0]))
    # rewards: a 0.5, b 1.0, c none (worst); served: a 2, b 2, c 0
    assert memory.reward[:2].tolist() == [0.5, 1.0] and math.isnan(float(memory.reward[2]))
    torch.testing.assert_close(memory.need("rl"), torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64))
    memory.observe_rewards(torch.tensor([0]), torch.tensor([1.0]))  # a: 0.5 * 0.5 + 0.5 * 1 = 0.75; counts decay
    assert float(memory.reward[0]) == pytest.approx(0.75)
    torch.testing.assert_close(memory.served["rl"], torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64))
    # unlabelled embeddings: the nearest prototype, or a new cluster while there is room
    assert memory.assign(torch.tensor([[0.9, 0.1, 0.0]]).div(0.9055)).tolist() == [3]
    assert memory.nearest(torch.tensor([[0.0, 0.0, 1.0]])).tolist() == [2]


def test_rl_prompts_prefer_under_served_prototypes(tmp_path, tokenizer, suite, make_trainer):
    def kept_share(strength):
        trainer = make_trainer(tmp_path, tokenizer, suite, fewshot_strength=strength)
        controller = trainer.memory_pool.selector
        tasks = suite.rl_train["task"]
        while len(controller.prototypes) < len(set(tasks)):  # one prototype per task, created on first sight
            controller.select_prompts(4, 0)
        memory = controller.prototypes
        for k, label in enumerate(memory.labels):  # `lst` scores 0, the others 1, all served equally
            memory.reward[k] = 0.0 if label == "lst" else 1.0
            memory.served["rl"][k] = 10.0
        picks = [tasks[i] for _ in range(40) for i in controller.select_prompts(4, 0)]
        return sum(t == "lst" for t in picks) / len(picks)

    baseline, preferred = kept_share(0.0), kept_share(3.0)
    # candidates are half `lst`; exp(3 * 0.5) = 4.5x more weight gives ~0.82 of the picks
    assert 0.35 < baseline < 0.65 and preferred > 0.7, (baseline, preferred)


def test_clusters_without_a_task_column(tmp_path, tokenizer, suite, make_trainer):
    trainer = make_trainer(
        tmp_path, tokenizer, suite, train_dataset=suite.rl_train.remove_columns("task"), fewshot_num_prototypes=3
    )
    controller = trainer.memory_pool.selector
    assert controller.task_labels is None
    for _ in range(5):
        controller.select_prompts(4, 0)
    assert 1 <= len(controller.prototypes) <= 3
    assert all(label.startswith("cluster-") for label in controller.prototypes.labels)


def test_sft_rows_prefer_under_served_prototypes_and_training_assigns_them(tmp_path, tokenizer, suite, make_trainer):
    trainer = make_trainer(tmp_path, tokenizer, suite, fewshot_strength=3.0, max_steps=3)
    controller, pool = trainer.memory_pool.selector, trainer.memory_pool.sft_pool
    trainer.train()
    assigned = controller.sft_assignment
    assert int((assigned >= 0).sum()) > 0 and float(controller.prototypes.served["sft"].sum()) > 0
    # make half the SFT rows belong to a prototype in need, the other half to a well-served one
    memory = controller.prototypes
    memory.reward[:] = 1.0
    memory.reward[0] = 0.0
    memory.served["sft"][:] = 1.0
    controller.sft_assignment = torch.tensor([0 if i % 2 else 1 for i in range(len(pool))])
    rows = [r for _ in range(30) for r in controller.sft_rows(pool, 4, step=0)]
    share = sum(r.pool_index % 2 for r in rows) / len(rows)
    assert share > 0.7, share  # ~0.82 expected (exp(3 * 0.5) = 4.5x the weight)


def test_state_round_trip(tmp_path, tokenizer, suite, make_trainer):
    trainer = make_trainer(tmp_path, tokenizer, suite)
    controller = trainer.memory_pool.selector
    for _ in range(3):
        controller.select_prompts(2, 0)
    controller.prototypes.observe_rewards(torch.tensor([0, 1]), torch.tensor([0.5, 0.25]))
    controller.sft_assignment[:3] = torch.tensor([1, 0, 1])
    meta, tensors = controller.state_dict()
    other = make_trainer(tmp_path / "b", tokenizer, suite).memory_pool.selector
    other.load_state_dict(meta, tensors)
    assert other.prototypes.labels == controller.prototypes.labels
    torch.testing.assert_close(other.prototypes.centroids, controller.prototypes.centroids)
    torch.testing.assert_close(other.prototypes.need("rl"), controller.prototypes.need("rl"))
    assert torch.equal(other.sft_assignment, controller.sft_assignment)
    other.prompt_sampler.load_state_dict(controller.prompt_sampler.state_dict())  # the trainer's own state
    assert other.select_prompts(3, 0) == controller.select_prompts(3, 0)


# ---------------------------------------------------------------------------------------------------------------------
# Few-shot mode with targeted exploration and with a rollout_func (issue 40: both were refused)
# ---------------------------------------------------------------------------------------------------------------------
def no_reward(completions, **kwargs):
    """0 for everything: every group is flat at the lowest score, so every family stays stuck."""
    return [0.0] * len(completions)


def rl_only_fewshot(tmp_path, tokenizer, suite, **kwargs):
    """Few-shot mode on RL prompts only, each trajectory used once: a round at every step, sampled at T(step)."""
    config = TRAPOConfig(
        output_dir=str(tmp_path),
        **{
            **TINY_CONFIG,
            "max_steps": 3,
            "temperature": 0.9,
            "fewshot_mode": True,
            "fewshot_max_uses": 1,
            "num_ppo_epochs": 1,
            "disable_tqdm": True,
            **kwargs.pop("config", {}),
        },
    )
    return FewShotTRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        args=config,
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        **{"reward_funcs": no_reward, **kwargs},
    )


def recording(trainer) -> tuple[list, list]:
    """`(sampled, stored)`: the per-row temperatures of every `sample` call of the rollout engine, and those every
    round's trajectories carry into the replay buffer (the configured one where they carry None), rounded to 1e-6."""
    sampled, stored = [], []
    sample, add = trainer.rollouts.sample, trainer.replay.add

    def recording_sample(examples, group, step, temperature, *args, **kwargs):
        values = temperature if isinstance(temperature, list) else [temperature] * len(examples)
        sampled.append((step, [round(float(t), 6) for t in values]))
        return sample(examples, group, step, temperature, *args, **kwargs)

    def recording_add(trajectories):
        configured = trainer.args.temperature
        stored.append([round(configured if t.temperature is None else t.temperature, 6) for t in trajectories])
        return add(trajectories)

    trainer.rollouts.sample, trainer.replay.add = recording_sample, recording_add
    return sampled, stored


def test_exploration_scales_the_annealed_temperature_and_rows_train_at_it(tmp_path, tokenizer, suite):
    """Exploration's per-family boost is a factor on few-shot mode's annealed round temperature: the round of step k
    samples family f at T(k) * temperature_of(f) / temperature, each trajectory carries that temperature, and the
    training forward scores it there (the first PPO ratio stays 1)."""
    trainer = rl_only_fewshot(
        tmp_path,
        tokenizer,
        suite,
        config={"exploration": True, "exploration_temperature_step": 0.1, "exploration_max_temperature": 1.35},
    )
    explore, controller = trainer.exploration, trainer.memory_pool.selector
    assert explore is not None
    sampled, stored = recording(trainer)
    boosts = []  # each round's rows' exploration factor, temperature_of(f) / temperature, when it was sampled
    sample = trainer.rollouts.sample

    def with_boosts(examples, group, step, temperature, *args, **kwargs):
        boosts.append([explore.temperature_of(f) / 0.9 for f in explore.families(examples)])
        return sample(examples, group, step, temperature, *args, **kwargs)

    trainer.rollouts.sample = with_boosts
    trainer.train()
    assert [step for step, _ in sampled] == [0, 1, 2]
    for (step, temperatures), factors, kept in zip(sampled, boosts, stored):
        expected = [round(controller.temperature_at(step) * factor, 6) for factor in factors]
        assert temperatures == expected, (step, temperatures, expected)
        assert kept == temperatures, (step, kept)  # trained at what it was sampled at
    # the rule acted: a stuck family was boosted on top of T(step) (every family is stuck: no reward varies)
    assert max(boosts[2]) > 1.0 and max(sampled[2][1]) > round(controller.temperature_at(2), 6)
    approx_kl = [entry["policy/approxkl_avg"] for entry in trainer.state.log_history if "val/ratio" in entry]
    assert len(approx_kl) == 3 and max(approx_kl) < 1e-8, approx_kl


def test_a_rollout_func_gets_the_prompts_fewshot_mode_chooses_and_trains_at_its_temperature(
    tmp_path, tokenizer, suite
):
    """A `rollout_func` in few-shot mode: it is handed the prompts few-shot mode chose (prototype-guided; each
    `num_generations` times in a row, as TRL passes them), their scores reach the prototypes, and its rows are trained
    at the temperature it sampled at (`temperature`, as every rollout_func's), not at few-shot mode's T(step): the
    controller no longer stamps T(step) over the round."""
    received, chosen = [], []

    def rollout_func(prompts, trainer):
        received.append(list(prompts))
        policy = trainer.accelerator.unwrap_model(trainer.model)
        prompt_ids = [tokenize_prompt(p, trainer.processing_class) for p in prompts]
        turns = generate(
            policy, prompt_ids, trainer.generation_config, trainer.padding_id, None, trainer.args.temperature
        )
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [c.tolist() for c in turns["completion_ids"]],
            "logprobs": [lp.tolist() for lp in turns["old_per_token_logps"]],
        }

    trainer = rl_only_fewshot(tmp_path, tokenizer, suite, rollout_func=rollout_func, reward_funcs=exact_match_reward)
    controller = trainer.memory_pool.selector
    select = controller.select_prompts
    controller.select_prompts = lambda n, step: chosen.append(select(n, step)) or chosen[-1]
    _, stored = recording(trainer)
    trainer.train()
    group = trainer.args.num_generations
    assert len(received) == len(chosen) == 3
    for prompts, indices in zip(received, chosen):
        assert prompts == [suite.rl_train[i]["prompt"] for i in indices for _ in range(group)]
    assert controller.temperature_at(2) < 0.9  # few-shot mode's own temperature has annealed ...
    assert len(stored) == 3 and all(set(kept) == {0.9} for kept in stored)  # ... the rows train at the function's
    assert not bool(torch.isnan(controller.prototypes.reward).all())  # the rounds' scores reached the prototypes
    approx_kl = [entry["policy/approxkl_avg"] for entry in trainer.state.log_history if "val/ratio" in entry]
    assert len(approx_kl) == 3 and max(approx_kl) < 1e-8, approx_kl


def test_a_task_column_the_user_named_that_the_data_lacks_is_refused(tmp_path, tokenizer, suite, make_trainer):
    """Trial 10's CX12: `fewshot_task_column="family"` (no such column) silently clustered the prompts instead; the
    default column's absence is the documented switch to clustering (test above), a named one is refused."""
    with pytest.raises(ValueError, match=r"fewshot_task_column='family' is not a column of the RL dataset"):
        make_trainer(tmp_path, tokenizer, suite, fewshot_task_column="family")
