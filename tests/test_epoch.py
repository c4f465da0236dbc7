"""`epoch` (logs, `trainer.state`, `TrainOutput`, checkpoints) counts passes over the dataset that sizes the run, as in
TRL; `save_strategy` / `eval_strategy="epoch"` act at the end of each pass (trl_trapo/callbacks.py, `EpochCallback`).

Trial 13's N02: after 4 steps x 8 rows on a 6,000-prompt RL dataset the logs said `epoch` 0.25, 0.5, 0.75, 1.0 — the
Trainer's count over TRAPO's step tickets (the run's planned steps), not the data; TRL's GRPOTrainer logs the
fraction of the prompts seen.
"""

from __future__ import annotations

import json
import os

import pytest
from transformers import TrainerCallback

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import RowAllocator
from trl_trapo.config import RL
from trl_trapo.tasks import build_tiny_model, exact_match_reward


# 8 rows a step, 4 completions a prompt, each served once: 2 prompts a step
RL_ONLY = dict(num_ppo_epochs=1, num_generations=4, per_device_train_batch_size=8)


class StepEndEpochs(TrainerCallback):
    """What a user's callback reads as `state.epoch` at each step's end."""

    def __init__(self):
        self.epochs = []

    def on_step_end(self, args, state, control, **kwargs):
        self.epochs.append(state.epoch)


def training_epochs(trainer) -> list[float]:
    return [h["epoch"] for h in trainer.state.log_history if "loss" in h]


def rl_trainer(tmp_path, tokenizer, prompts, callbacks=None, eval_dataset=None, **overrides):
    from conftest import TINY_CONFIG

    config = TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, **RL_ONLY, **overrides})
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=config,
        train_dataset=prompts,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def test_logged_epoch_is_the_prompts_served_over_the_dataset(tmp_path, tokenizer, suite):
    """4 steps of 2 prompts each on 40 prompts: epoch 0.05 a step in every log, in `trainer.state`, in
    `TrainOutput.metrics` and in what a callback reads at the step's end — and it is what the prompt stream says it
    served (its position over its length). The old code logged 0.25, 0.5, 0.75, 1.0 (steps over `max_steps`)."""
    seen = StepEndEpochs()
    trainer = rl_trainer(tmp_path, tokenizer, suite.rl_train.select(range(40)), callbacks=[seen])
    output = trainer.train()
    expected = [pytest.approx(step * 2 / 40) for step in (1, 2, 3, 4)]
    assert training_epochs(trainer) == expected
    assert seen.epochs == expected
    assert trainer.state.epoch == output.metrics["epoch"] == trainer.state.log_history[-1]["epoch"]
    sampler = trainer.memory_pool.prompt_sampler.state_dict()
    assert trainer.state.epoch == pytest.approx(sampler["epoch"] + sampler["position"] / sampler["size"]) == 0.2


def test_with_async_rollouts_epoch_counts_the_rows_trained_not_the_prompts_sampled_ahead(tmp_path, tokenizer, suite):
    """The producer samples rounds ahead of the steps (`max_staleness=2`); `epoch` counts what the steps trained on,
    so it reads as without async rollouts: 2 prompts a step."""
    trainer = rl_trainer(tmp_path, tokenizer, suite.rl_train.select(range(40)), async_rollouts=True, max_staleness=2)
    trainer.train()
    assert training_epochs(trainer) == [pytest.approx(step * 2 / 40) for step in (1, 2, 3, 4)]


def test_epoch_of_an_sft_run_is_the_demonstrations_served(tmp_path, tokenizer, suite):
    """Without RL prompts the SFT rows size the run and an epoch is a pass over them (here beside pretraining, at the
    curriculum's shares): the logged epoch is the SFT pool's own count of rows served over the dataset's length."""
    from conftest import TINY_CONFIG

    sft = suite.sft.select(range(4))
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        args=TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, "max_steps": 3}),
        sft_dataset=sft,
        pretrain_dataset=suite.pretrain,
        processing_class=tokenizer,
    )
    trainer.train()
    sampler = trainer.memory_pool.sft_pool.sampler.state_dict()
    served = sampler["epoch"] * len(sft) + sampler["position"]
    assert served > len(sft)  # more than one pass: the count goes on across passes
    assert trainer.state.epoch == pytest.approx(served / len(sft))
    assert training_epochs(trainer)[-1] == pytest.approx(served / len(sft))


def checkpoints(output_dir) -> list[int]:
    return sorted(int(name.split("-")[1]) for name in os.listdir(output_dir) if name.startswith("checkpoint-"))


def test_save_and_eval_strategy_epoch_act_at_each_pass_over_the_data(tmp_path, tokenizer, suite):
    """8 prompts, 2 a step: a pass every 4 steps. With `max_steps=10`, `save_strategy` and `eval_strategy` "epoch"
    save and evaluate at steps 4 and 8 (passes 1 and 2) and at the run's end (step 10, as TRL's Trainer does when
    `max_steps` stops it inside an epoch), once each. The old code's only epoch was the 10 steps: one save, one
    evaluation, at step 10."""
    trainer = rl_trainer(
        tmp_path,
        tokenizer,
        suite.rl_train.select(range(8)),
        eval_dataset=suite.eval.select(range(2)),
        max_steps=10,
        save_strategy="epoch",
        eval_strategy="epoch",
    )
    trainer.train()
    assert checkpoints(tmp_path) == [4, 8, 10]
    evaluations = [(h["step"], h["epoch"]) for h in trainer.state.log_history if "eval_reward" in h]
    assert evaluations == [(4, 1.0), (8, 2.0), (10, 2.5)]
    saved = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert saved["epoch"] == 1.0


def test_num_train_epochs_saves_where_each_pass_ends_under_a_curriculum(tmp_path, tokenizer, suite):
    """`num_train_epochs=2` on 8 RL prompts beside SFT rows, the RL share 0.25 in the first half of the run and 0.75
    in the second: the first pass over the prompts ends two thirds into the run, where the checkpoint of
    `save_strategy="epoch"` is, with epoch 1.0 logged there. The old code saved at the Trainer's own half-way point
    (its tickets split in two), logging epoch 1.0 after half a pass."""
    from conftest import TINY_CONFIG

    config = TRAPOConfig(
        output_dir=str(tmp_path),
        **{
            **TINY_CONFIG,
            **RL_ONLY,
            "max_steps": -1,
            "num_train_epochs": 2,
            "save_strategy": "epoch",
            "curriculum_boundaries": [0.5],
            "curriculum_mixtures": [0.0, 0.75, 0.25, 0.0, 0.25, 0.75],
            "curriculum_decay_steps": 0.01,
        },
    )
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=config,
        train_dataset=suite.rl_train.select(range(8)),
        sft_dataset=suite.sft.select(range(16)),
        processing_class=tokenizer,
    )
    trainer.train()
    steps = trainer.state.global_step
    # the step whose RL rows complete 32 (8 prompts x 4 completions), from the curriculum's shares and the allocation
    # rule the steps were built with
    allocator, served, first_pass = RowAllocator(3), 0, None
    for step in range(steps):
        served += allocator.allocate(8, trainer.curriculum.mixture(step))[RL]
        if served >= 32 and first_pass is None:
            first_pass = step + 1
    assert steps // 2 + 1 < first_pass < steps  # the Trainer's own epoch would end at step 9 of 17
    assert checkpoints(tmp_path) == [first_pass, steps]
    epochs = {h["step"]: h["epoch"] for h in trainer.state.log_history if "loss" in h}
    assert epochs[first_pass - 1] < 1.0 <= epochs[first_pass]
    # the plan: 2 passes of 32 rows at the curriculum's mean share (the steps it planned round up: 66 rows here)
    assert epochs[steps] == pytest.approx(2.0, abs=0.1)


def test_a_resumed_run_logs_the_uninterrupted_runs_epochs(tmp_path, tokenizer, suite):
    """Resuming from `checkpoint-3` (its `trainer_state.json` says epoch 0.75: 6 of 8 prompts) goes on counting from
    there: the same epochs as the run that was not stopped."""
    prompts = suite.rl_train.select(range(8))
    settings = dict(max_steps=6, save_strategy="steps", save_steps=3)
    full = rl_trainer(tmp_path / "full", tokenizer, prompts, **settings)
    full.train()
    assert json.loads((tmp_path / "full" / "checkpoint-3" / "trainer_state.json").read_text())["epoch"] == 0.75
    resumed = rl_trainer(tmp_path / "resumed", tokenizer, prompts, **settings)
    os.makedirs(tmp_path / "resumed", exist_ok=True)
    os.rename(tmp_path / "full" / "checkpoint-3", tmp_path / "resumed" / "checkpoint-3")
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-3"))
    assert training_epochs(full) == [pytest.approx(s / 4) for s in range(1, 7)]
    assert training_epochs(resumed) == training_epochs(full)
    assert resumed.state.epoch == full.state.epoch == 1.5


@pytest.mark.distributed
@pytest.mark.slow
def test_an_epoch_is_a_pass_over_the_whole_dataset_by_all_ranks_together(tmp_path):
    """2 processes, 8 prompts, one prompt a rank a step (each rank's shard is 4 prompts): the ranks log the same
    epochs, 2 prompts a step over the 8 (0.25, 0.5, ..., 1.5), each rank's stream has served 1.5 passes of its
    shard, and `save_strategy="epoch"` saved at the pass's end (step 4) and at the run's end (6)."""
    from two_processes import check, launch

    check(launch("multi_gpu.yaml", "tests/epoch_worker.py", [str(tmp_path)], timeout=600))
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for record in ranks:
        assert record["world_size"] == 2
        assert record["epochs"] == [pytest.approx(step / 4) for step in range(1, 7)]
        assert record["state_epoch"] == 1.5
        sampler = record["prompt_sampler"]
        assert record["shard"] == 4 and sampler["epoch"] + sampler["position"] / record["shard"] == 1.5
    assert checkpoints(tmp_path) == [4, 6]
