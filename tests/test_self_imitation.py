# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Self-imitation (`trl_trapo/memory/successes.py`): which completions are kept, how they are served as SFT rows (the
share, round-robin, retirement), that a training run keeps its sampled successes and serves them as the step's SFT
rows, the auto default, and that the buffer survives a resume exactly."""

import math

import pytest
import torch
from conftest import make_tiny_config
from transformers import AutoModelForSequenceClassification

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.config import SFT
from trl_trapo.memory import SuccessReplay
from trl_trapo.tasks import build_tiny_model


NAN = float("nan")


def ids(*values):
    return [torch.tensor(v, dtype=torch.long) for v in values]


def test_only_news_is_kept_successes_of_groups_where_something_failed():
    replay = SuccessReplay(min_reward=1.0, fraction=0.5, max_uses=2, capacity=10)
    prompts = ids([1], [1], [2], [2], [3], [3], [4], [4])
    completions = ids([10], [11], [20], [21], [30], [31], [40], [41])
    # groups of 2: [1, 0] kept; [1, 1] solved (nothing failed): not kept; [1 truncated, 0]: not kept;
    # [1, NaN]: a completion without reward is no failure: not kept
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, NAN])
    truncated = torch.tensor([False, False, False, False, True, False, False, False])
    assert replay.observe(prompts, completions, scores, truncated, group=2) == 1
    assert [(r["prompt_ids"], r["completion_ids"]) for r in replay.rows] == [([1], [10])]
    # guidance's demonstration is never kept, and does not count as the group's failure either
    off_policy = torch.tensor([False, True])
    assert replay.observe(ids([5], [5]), ids([50], [51]), torch.tensor([1.0, 1.0]), torch.zeros(2, dtype=bool), 2) == 0
    assert replay.observe(ids([6], [6]), ids([60], [61]), torch.tensor([0.0, 1.0]), torch.zeros(2, dtype=bool), 2,
                          off_policy) == 0  # fmt: skip
    # no groups (a critic): every success counts
    assert replay.observe(ids([7]), ids([70]), torch.tensor([2.5]), torch.zeros(1, dtype=bool), 1) == 1
    assert replay.metrics() == {"self_imitation/size": 2.0, "self_imitation/kept": 2.0, "self_imitation/served": 0.0}


def test_serving_share_round_robin_retirement_and_capacity():
    replay = SuccessReplay(min_reward=1.0, fraction=0.25, max_uses=2, capacity=3)
    assert replay.split(6) == 0 and replay.credit == 0.0  # nothing accrues while the buffer is empty
    scores = torch.tensor([1.0, 0.0] * 4)
    prompts = ids(*[[p] for p in (1, 1, 2, 2, 3, 3, 4, 4)])
    completions = ids(*[[c, 0] for c in (10, 11, 20, 21, 30, 31, 40, 41)])
    replay.observe(prompts, completions, scores, torch.zeros(8, dtype=bool), 2)
    assert [r["prompt_ids"][0] for r in replay.rows] == [2, 3, 4]  # capacity 3: the oldest (prompt 1) went first
    # 0.25 x 6 = 1.5 rows per step: 1, 2, 1, 2 ... exactly 6 over 4 steps
    shares = [replay.split(6) for _ in range(4)]
    assert shares == [1, 2, 1, 2]
    rows = replay.take(4)
    assert [r.input_ids.tolist() for r in rows] == [[2, 20, 0], [3, 30, 0], [4, 40, 0], [2, 20, 0]]
    # the target-aligned mask counts the completion tokens (the prompt token is not a target)
    assert rows[0].objective == SFT and rows[0].mask.tolist() == [1.0, 1.0]
    assert len(replay) == 2  # prompt 2 was served twice (max_uses): it left
    replay.take(10)
    assert len(replay) == 0 and replay.metrics()["self_imitation/served"] == 6.0


def test_a_vlm_success_keeps_its_model_inputs_as_tensors_and_checkpoints_them_as_tensors():
    """A success's `pixel_values` stay one tensor (shared by the successes of its prompt), not Python lists: as lists a
    (1, 3, 56, 56) image took 305 KB of memory and 187 KB of JSON text per success (37 KB as a tensor), for up to
    `capacity` successes."""
    import json

    replay = SuccessReplay(min_reward=1.0, fraction=0.5, max_uses=2, capacity=10)
    images = [{"pixel_values": torch.rand(1, 3, 56, 56)}, {"pixel_values": torch.rand(2, 3, 56, 56)}]
    per_completion = [images[0]] * 3 + [images[1]] * 3  # groups of 3: one prompt's completions share its inputs
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    kept = replay.observe(
        ids([1], [1], [1], [2], [2], [2]), ids([10], [11], [12], [20], [21], [22]), scores, torch.zeros(6, dtype=bool),
        3, model_inputs=per_completion,
    )  # fmt: skip
    assert kept == 3
    assert all(isinstance(r["model_inputs"]["pixel_values"], torch.Tensor) for r in replay.rows)
    meta, tensors = replay.state_dict()
    assert len(json.dumps(meta)) < 1000  # ids and counters only
    assert sorted(t.shape for t in tensors.values()) == [(1, 3, 56, 56), (2, 3, 56, 56)]  # one per prompt
    restored = SuccessReplay(min_reward=1.0, fraction=0.5, max_uses=2, capacity=10)
    restored.load_state_dict(json.loads(json.dumps(meta)), tensors)
    for row, expected in zip(restored.take(3), [images[0], images[0], images[1]]):
        assert torch.equal(row.model_inputs["pixel_values"], expected["pixel_values"])
    # a checkpoint written while the inputs were nested lists in the JSON still loads
    old = {**meta, "rows": [{**r, "model_inputs": {"pixel_values": tensors[r["model_inputs"]["pixel_values"]].tolist()}}
                            for r in meta["rows"]]}  # fmt: skip
    restored.load_state_dict(old)
    assert torch.equal(restored.take(1)[0].model_inputs["pixel_values"], images[0]["pixel_values"])
    with pytest.raises(KeyError):
        restored.load_state_dict(meta, {})  # the tensors file lacks them


def test_bad_settings_fail_at_construction(tmp_path, tokenizer, suite):
    with pytest.raises(ValueError, match="self_imitation_fraction=0.0"):
        TRAPOConfig(output_dir=str(tmp_path), self_imitation_fraction=0.0)
    with pytest.raises(ValueError, match="self_imitation_min_reward=nan"):
        TRAPOConfig(output_dir=str(tmp_path), self_imitation_min_reward=math.nan)
    with pytest.raises(ValueError, match="self_imitation_max_uses=0"):
        TRAPOConfig(output_dir=str(tmp_path), self_imitation_max_uses=0)
    with pytest.raises(ValueError, match="self_imitation.*few-shot mode"):
        TRAPOConfig(output_dir=str(tmp_path), self_imitation=True, fewshot_mode=True)
    with pytest.raises(ValueError, match="self_imitation=True serves RL's successes as SFT rows.*SFT False"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=TRAPOConfig(output_dir=str(tmp_path), self_imitation=True, report_to="none", response_length=4),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )


def test_auto_is_on_with_sft_data_and_quietly_off_without(tmp_path, tokenizer, suite):
    """`self_imitation=None` (the default): on where its rows can be SFT rows, off (no error) where there is no SFT
    data; exploration's default likewise turns itself off with a value model instead of refusing the run."""

    def trainer(**kwargs):
        return TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=make_tiny_config(tmp_path / str(len(kwargs)), max_steps=1),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
            **kwargs,
        )

    with_sft = trainer(sft_dataset=suite.sft)
    assert with_sft.memory_pool.successes is not None and with_sft.exploration is not None
    rl_only = trainer()
    assert rl_only.memory_pool.successes is None and rl_only.exploration is not None
    config = build_tiny_model(tokenizer).config
    config.num_labels = 1  # a critic: a sequence-classification model with one output
    critic = trainer(sft_dataset=suite.sft, value_model=AutoModelForSequenceClassification.from_config(config))
    assert critic.exploration is None and critic.memory_pool.successes is not None


def has_vowel(completions, **kwargs):
    """1 where the completion has a lowercase vowel, else 0: a success the random tiny model hits now and then."""
    return [1.0 if set(c) & set("aeiou") else 0.0 for c in completions]


def imitating_trainer(output_dir, tokenizer, suite, **overrides):
    """Completions stop at any lowercase vowel (so the random tiny model's successes stop on their own)."""
    vowels = tokenizer.convert_tokens_to_ids(list("aeiou"))
    config = make_tiny_config(
        output_dir,
        generation_kwargs={"eos_token_id": vowels},
        self_imitation=True,
        self_imitation_fraction=1.0,
        self_imitation_max_uses=1000,
        num_ppo_epochs=1,
        disable_tqdm=True,
        **overrides,
    )
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=has_vowel,
        args=config,
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )


def test_sampled_successes_are_kept_and_served_as_the_steps_sft_rows(tmp_path, tokenizer, suite):
    trainer = imitating_trainer(tmp_path / "run", tokenizer, suite, max_steps=6)
    trainer.train()
    successes = trainer.memory_pool.successes
    assert successes.kept > 0 and successes.served > 0
    assert all(set(tokenizer.decode(r["completion_ids"])) & set("aeiou") for r in successes.rows)  # successes
    logged = [h for h in trainer.state.log_history if "self_imitation/served" in h]
    assert logged and logged[-1]["self_imitation/served"] == successes.served
    # with fraction 1 every SFT row of a step comes from the buffer while it has rows, in its order
    expected = [r["prompt_ids"] + r["completion_ids"] for r in list(successes.rows)[:3]]
    rows = trainer.memory_pool.take_sft(min(3, len(successes)), step=6)
    assert [r.input_ids.tolist() for r in rows] == expected[: len(rows)]
    assert all(r.objective == SFT for r in rows)
    # without self-imitation the same draw comes from the SFT pool (the suite's demonstrations)
    plain = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=has_vowel,
        args=make_tiny_config(tmp_path / "plain", max_steps=1, disable_tqdm=True, self_imitation=False),
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    assert plain.memory_pool.successes is None
    assert [r.input_ids.tolist() for r in plain.memory_pool.take_sft(3, step=0)] != expected[:3]


def test_the_buffer_survives_resume_exactly(tmp_path, tokenizer, suite):
    settings = dict(max_steps=6, save_strategy="steps", save_steps=3)
    whole = imitating_trainer(tmp_path / "whole", tokenizer, suite, **settings)
    whole.train()
    resumed = imitating_trainer(tmp_path / "resumed", tokenizer, suite, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-3"))
    assert whole.memory_pool.successes.kept > 0
    # without the saved buffer the resumed run would have lost the first 3 steps' successes and counters
    assert resumed.memory_pool.successes.state_dict() == whole.memory_pool.successes.state_dict()
