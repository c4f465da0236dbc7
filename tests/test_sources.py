# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Rollout sources (`trl_trapo/sources.py`): the public seam through which RL rounds reach the trainer.

- A user's source feeds the trainer: it trains on exactly the completions the source returned (the worked example of
  `docs/writing_a_rollout_source.md`, run from the document), and a round sampled at an older policy version is that
  many versions old in the replay buffer (`replay_max_age` retires it).
- What a source may bring is used, not recomputed: scores (no reward function call), a completion mask (tool tokens
  count in no loss and no KL).
- The default source is the synchronous one; settings that configure it are refused with a source of your own, and a
  source that returns something else is named.
- The contract is a base class whose optional hooks are neutral; a duck-typed source (no base class) is adapted, its
  own hooks still called (prefetch, round_due, checkpoint state, close).
"""

from __future__ import annotations

import pytest
import torch
from conftest import RecordingTRAPOTrainer, make_tiny_config, trained_rows
from datasets import Dataset
from test_doc_commands import registered_block

from trl_trapo import TRAPOTrainer, sources
from trl_trapo.checkpoint import CheckpointError
from trl_trapo.config import RL
from trl_trapo.data import tokenize_prompt
from trl_trapo.sources import RolloutSource, SampledRound, SyncRolloutSource
from trl_trapo.tasks import build_tiny_model


WORKED_EXAMPLE = "docs/writing_a_rollout_source.md: # run: fixed completions as a rollout source"


class FixedRounds:
    """Answers each prompt of `dataset` with all of `completions`, one group per prompt; `lag` versions behind the
    trainer's step, with `extra` fields (scores, masks ...) on every round. Records the rounds it returned."""

    def __init__(self, dataset, completions: list[list[int]], lag: int = 0, **extra):
        self.dataset, self.completions, self.lag, self.extra = dataset, completions, lag, extra
        self.cursor = 0
        self.rounds: list[SampledRound] = []

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        group = len(self.completions)
        examples = []
        for _ in range(max(rows_needed // group, 1)):
            examples += [self.dataset[self.cursor % len(self.dataset)]] * group
            self.cursor += 1
        completions = [torch.tensor(self.completions[i % group]) for i in range(len(examples))]
        extra = {k: v(len(examples)) if callable(v) else v for k, v in self.extra.items()}
        self.rounds.append(SampledRound(examples, completions, version=step - self.lag, group=group, **extra))
        return self.rounds[-1]


def answers(tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in texts]


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def rl_trainer(tmp_path, tokenizer, suite, source, reward=length_reward, trainer_class=TRAPOTrainer, **overrides):
    """`trainer_class` on `suite`'s RL prompts alone, its rounds from `source`: 2 steps of `TINY_CONFIG`, then
    `overrides`."""
    return trainer_class(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        args=make_tiny_config(tmp_path, **{"max_steps": 2, **overrides}),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        rollout_source=source,
    )


# ---------------------------------------------------------------------------------------------------------------------
# A user's source feeds the trainer
# ---------------------------------------------------------------------------------------------------------------------
def test_the_worked_example_trains_on_exactly_its_completions(tmp_path, monkeypatch):
    """The document's block, as written: every RL row trained is a prompt of its dataset followed by one of the fixed
    completions, its completion tokens (and only those) counted; the policy changed."""
    seen = []
    compute_loss = TRAPOTrainer.compute_loss

    def recording(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        seen.append(
            {k: inputs[k].detach().cpu().clone() for k in ("objective", "input_ids", "attention_mask", "mask")}
        )
        return compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    monkeypatch.setattr(TRAPOTrainer, "compute_loss", recording)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    block = registered_block(WORKED_EXAMPLE)
    exec(compile(block.text, block.where(), "exec"), namespace)
    trainer, tokenizer, prompts = namespace["trainer"], namespace["tokenizer"], namespace["prompts"]
    completions = [c.tolist() for c in namespace["source"].completions]
    assert trainer.state.global_step == 3
    allowed = {tuple(tokenize_prompt(p, tokenizer) + c) for p in prompts["prompt"] for c in completions}
    rows = trained_rows(seen, RL)
    assert len(rows) == 3 * 8  # every row of every step is RL
    for ids, mask in rows:
        assert tuple(ids.tolist()) in allowed
        completion = next(c for c in completions if ids.tolist()[-len(c) :] == c)
        assert mask.tolist() == [0.0] * (ids.numel() - 1 - len(completion)) + [1.0] * len(completion)
    assert {tuple(ids.tolist()[-2:]) for ids, _ in rows} >= {tuple(c[-2:]) for c in completions}


def test_a_user_source_is_trained_on_and_recorded(tmp_path, tokenizer, suite):
    """Through `train()` with a recording trainer: the rows trained are the source's rounds, nothing sampled."""
    source = FixedRounds(suite.rl_train, answers(tokenizer, ["1", "22", "333", "4444"]))
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, trainer_class=RecordingTRAPOTrainer, max_steps=3)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    offered = {
        tuple(tokenize_prompt(e["prompt"], tokenizer) + c.tolist())
        for sampled in source.rounds
        for e, c in zip(sampled.examples, sampled.completion_ids)
    }
    rows = trained_rows(trainer.seen_batches, RL)
    assert rows and all(tuple(ids.tolist()) in offered for ids, _ in rows)
    assert trainer.state.episode == sum(len(r.examples) for r in source.rounds)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_a_round_sampled_at_an_older_version_is_that_old(tmp_path, tokenizer, suite):
    source = FixedRounds(suite.rl_train, answers(tokenizer, ["1", "22", "333", "4444"]), lag=3)
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, replay_max_age=4)
    batch = trainer.collect_rollouts(8, step=5)
    assert batch.version == 2 and {t.version for t in batch.trajectories} == {2}
    assert trainer.replay.metrics(5)["replay/age_mean"] == 3.0
    served = trainer.replay.sample(8, step=5)
    assert {(t.version, t.age) for t in served} == {(2, 3)}
    assert trainer.replay.num_available(6) == 8 and trainer.replay.num_available(7) == 0  # 5 versions > max_age 4


def test_given_rollouts_carry_their_version(tmp_path, tokenizer, suite):
    trainer = rl_trainer(tmp_path, tokenizer, suite, None)
    examples = [suite.rl_train[0]] * 4
    completions = [torch.tensor(c) for c in answers(tokenizer, ["1", "22", "333", "4444"])]
    assert {t.version for t in trainer.process_rollouts(examples, completions)} == {0}
    assert {t.version for t in trainer.process_rollouts(examples, completions, version=7)} == {7}


# ---------------------------------------------------------------------------------------------------------------------
# What a source brings is used
# ---------------------------------------------------------------------------------------------------------------------
def test_scores_from_the_source_are_used_and_no_reward_function_runs(tmp_path, tokenizer, suite):
    calls = []

    def counting_reward(completions, **kwargs):
        calls.append(len(completions))
        return [0.0] * len(completions)

    scores = lambda n: torch.arange(n, dtype=torch.float32)  # noqa: E731
    source = FixedRounds(suite.rl_train, answers(tokenizer, ["1", "22", "333", "4444"]), scores=scores)
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, reward=counting_reward)
    before = len(calls)  # the construction-time check of the reward functions
    batch = trainer.collect_rollouts(8, step=0)
    assert len(calls) == before
    assert batch.scores.tolist() == list(range(8))
    assert torch.isnan(batch.per_func).all()  # no per-function reward this round
    logs = trainer.metrics.collect(trainer.accelerator, trainer.schedules.kl_coef())
    assert logs["objective/scores"] == pytest.approx(3.5) and "rewards/counting_reward/mean" not in logs


def test_a_completion_mask_keeps_tool_tokens_out_of_the_loss_and_the_kl(tmp_path, tokenizer, suite):
    """A multi-turn completion `answer, tool result, answer`: the tool tokens (mask 0) count in no loss and add no KL
    (tests/test_env_mask.py covers every other consumer, and GAE with a critic)."""
    completions = answers(tokenizer, ["12345", "1234", "123", "12"])
    masks = [torch.tensor([1.0, 0.0, 0.0] + [1.0] * (len(c) - 3)) for c in completions]
    source = FixedRounds(suite.rl_train, completions, completion_mask=lambda n: [masks[i % 4] for i in range(n)])
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, kl_coef=0.1)
    batch = trainer.collect_rollouts(8, step=0)
    for trajectory in batch.trajectories:
        n = trajectory.completion_ids.numel()
        assert trajectory.completion_mask.tolist() == masks[[len(c) for c in completions].index(n)].tolist()
    # the per-sequence KL sums the sampled tokens only
    per_token = [
        (o - r) * m for o, r, m in zip(batch.old_per_token_logps, batch.ref_per_token_logps, batch.completion_mask)
    ]
    assert trainer.kl_estimator == "k2"
    expected = torch.stack([(0.5 * d**2).sum() for d in per_token])
    torch.testing.assert_close(batch.kl, expected)


def test_a_round_whose_completion_mask_counts_nothing_is_warned_once(tmp_path, tokenizer, suite, caplog):
    """A source whose `completion_mask` is all zeros trained 2 steps on nothing (loss 0) without a word (trial 8's
    SR03): one warning naming the source and the fix, not repeated for later rounds, none for a mask that counts."""
    import logging

    completions = answers(tokenizer, ["12345", "1234", "123", "12"])
    zeros = FixedRounds(
        suite.rl_train, completions, completion_mask=lambda n: [torch.zeros(len(completions[i % 4])) for i in range(n)]
    )
    trainer = rl_trainer(tmp_path, tokenizer, suite, zeros)
    with caplog.at_level(logging.WARNING, logger="trl_trapo.rl_supply"):
        trainer.collect_rollouts(8, step=0)
        trainer.collect_rollouts(8, step=0)
    found = [r.getMessage() for r in caplog.records if "completion_mask is 0 on every token" in r.getMessage()]
    assert len(zeros.rounds) == 2 and len(found) == 1, found
    assert found[0].startswith("FixedRounds.sample returned a round whose completion_mask is 0 on every token of")
    assert "Put 1 on the tokens the policy sampled" in found[0]
    caplog.clear()
    some = FixedRounds(
        suite.rl_train,
        completions,
        completion_mask=lambda n: [torch.tensor([0.0] * (len(completions[i % 4]) - 1) + [1.0]) for i in range(n)],
    )
    with caplog.at_level(logging.WARNING, logger="trl_trapo.rl_supply"):
        rl_trainer(tmp_path, tokenizer, suite, some).collect_rollouts(8, step=0)
    assert "completion_mask is 0 on every token" not in caplog.text


# ---------------------------------------------------------------------------------------------------------------------
# The default source, and what is refused
# ---------------------------------------------------------------------------------------------------------------------
def test_the_default_source_is_synchronous_and_stamps_the_step(tmp_path, tokenizer, suite):
    trainer = rl_trainer(tmp_path, tokenizer, suite, None)
    assert isinstance(trainer.rollout_source, SyncRolloutSource)
    trainer.state.global_step = 2
    batch = trainer.collect_rollouts(8)
    assert batch.version == 2 and len(batch.examples) == 8 and batch.group == 4
    assert {t.version for t in trainer.replay.sample(8, step=2)} == {2}


def test_a_user_source_turns_exploration_off(tmp_path, tokenizer, suite):
    source = FixedRounds(suite.rl_train, answers(tokenizer, ["1", "22"]))
    assert rl_trainer(tmp_path, tokenizer, suite, source).exploration is None
    assert rl_trainer(tmp_path, tokenizer, suite, None).exploration is not None  # the default: on where it can run


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"fewshot_mode": True}, ValueError, "fewshot_mode=True configures the default rollout source"),
        ({"exploration": True}, ValueError, "exploration=True sets the default rollout source"),
    ],
)
def test_settings_of_the_default_source_are_refused(tmp_path, tokenizer, suite, overrides, error, message):
    source = FixedRounds(suite.rl_train, answers(tokenizer, ["1", "22"]))
    with pytest.raises(error, match=message):
        rl_trainer(tmp_path, tokenizer, suite, source, **overrides)


def test_a_source_without_sample_or_returning_something_else_is_named(tmp_path, tokenizer, suite):
    with pytest.raises(TypeError, match="has no `sample"):
        rl_trainer(tmp_path, tokenizer, suite, object())

    class ReturnsADict:
        def sample(self, rows_needed, step):
            return {"completion_ids": []}

    trainer = rl_trainer(tmp_path, tokenizer, suite, ReturnsADict())
    with pytest.raises(TypeError, match="ReturnsADict.sample returned dict"):
        trainer.collect_rollouts(8, step=0)

    class NoPrompts:  # token ids only: nothing the reward functions could read
        def sample(self, rows_needed, step):
            return SampledRound([{"prompt_ids": [5, 6]}] * 2, [torch.tensor([7])] * 2, version=step, group=2)

    trainer = rl_trainer(tmp_path, tokenizer, suite, NoPrompts())
    with pytest.raises(ValueError, match="read each example's `prompt`"):
        trainer.collect_rollouts(8, step=0)


class FixedSubclass(RolloutSource):
    """`FixedRounds` as a subclass of the base class: only `sample`, every optional hook inherited."""

    def __init__(self, dataset, completions):
        self.rounds = FixedRounds(dataset, completions)

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        return self.rounds.sample(rows_needed, step)


class HookedRounds(FixedRounds):
    """A duck-typed source (no base class) with every optional hook: records the calls, checkpoints a counter."""

    def __init__(self, *args, due_at=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.due_at, self.restored = [], set(due_at), None

    def prefetch(self, rows_needed, step, use_counts):
        self.calls.append(("prefetch", step, len(use_counts)))

    def round_due(self, step):  # once: until a round of that step was taken
        return step in self.due_at and all(r.version != step for r in self.rounds)

    def checkpoint_state(self):
        return {"cursor": self.cursor}, {"marker": torch.arange(3)}

    def restore_checkpoint_state(self, meta, tensors):
        self.restored = (meta, tensors)

    def close(self):
        self.calls.append(("close",))


def test_the_base_class_hooks_are_neutral():
    """`RolloutSource` is a class (not a Protocol): its optional hooks do nothing, `sample` must be overridden."""
    source = RolloutSource()
    assert source.prefetch(8, 0, [0]) is None and source.round_due(0) is False
    assert source.checkpoint_state() is None
    assert source.restore_checkpoint_state(None, {}) is None and source.close(timeout=0.5) is None
    with pytest.raises(NotImplementedError, match="RolloutSource does not implement `sample"):
        source.sample(8, 0)


def test_a_subclass_without_sample_is_refused_at_construction(tmp_path, tokenizer, suite):
    class Forgot(RolloutSource):
        pass

    with pytest.raises(TypeError, match="Forgot subclasses trl_trapo.sources.RolloutSource but does not implement"):
        rl_trainer(tmp_path, tokenizer, suite, Forgot())


def test_a_subclass_trains_with_the_neutral_hooks(tmp_path, tokenizer, suite):
    source = FixedSubclass(suite.rl_train, answers(tokenizer, ["1", "22", "333", "4444"]))
    trainer = rl_trainer(tmp_path, tokenizer, suite, source)
    assert trainer.rollout_source is source
    trainer.train()
    assert trainer.state.global_step == 2 and source.rounds.rounds


def test_a_duck_typed_source_is_adapted_and_its_hooks_called(tmp_path, tokenizer, suite):
    """The user's object is `trainer.rollout_source`, unchanged; `prefetch` runs at every step that takes RL rows,
    `round_due` forces a round although the buffer still has rows, `close` runs when `train()` returns, and its
    checkpoint state is saved and handed back on resume."""
    completions = answers(tokenizer, ["1", "22", "333", "4444"])
    source = HookedRounds(suite.rl_train, completions, due_at={1})
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, save_strategy="steps", save_steps=1, num_mini_batches=2)
    assert trainer.rollout_source is source
    trainer.train()
    uses = trainer.args.num_ppo_epochs  # `use_counts` has one entry per number of uses
    assert [c for c in source.calls if c[0] == "prefetch"] == [("prefetch", 0, uses), ("prefetch", 1, uses)]
    assert source.calls[-1] == ("close",)
    # a round feeds num_mini_batches=2 steps: step 1 takes a second round only because it is due
    assert [r.version for r in source.rounds] == [0, 1]
    resumed_source = HookedRounds(suite.rl_train, completions)
    resumed = rl_trainer(tmp_path, tokenizer, suite, resumed_source, max_steps=3, num_mini_batches=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    meta, tensors = resumed_source.restored
    assert meta == {"cursor": 2} and torch.equal(tensors["marker"], torch.arange(3))


def test_the_adapter_forwards_close_and_refuses_a_checkpoint_without_the_sources_state():
    class Plain:
        def sample(self, rows_needed, step): ...

        def close(self):
            self.closed = "plain"

    class Timed(Plain):
        def close(self, timeout=10.0):
            self.closed = timeout

    plain, timed = Plain(), Timed()
    sources.RolloutSourceAdapter(plain).close(timeout=0.5)
    sources.RolloutSourceAdapter(timed).close(timeout=0.5)
    assert (plain.closed, timed.closed) == ("plain", 0.5)
    sources.RolloutSourceAdapter(Plain()).restore_checkpoint_state(None, {})  # no state of its own: nothing to refuse
    with pytest.raises(ValueError, match="written without HookedRounds's state"):
        sources.RolloutSourceAdapter(HookedRounds(None, [[1]])).restore_checkpoint_state(None, {})


def test_a_sampled_round_checks_its_shapes():
    rows = [{"prompt": "a"}] * 4
    ids = [torch.tensor([1, 2])] * 4
    with pytest.raises(ValueError, match="do not form groups of group=3"):
        SampledRound(rows, ids, version=0, group=3)
    with pytest.raises(ValueError, match="3 completion_ids for 4 examples"):
        SampledRound(rows, ids[:3], version=0)
    with pytest.raises(ValueError, match="old_per_token_logps must hold one"):
        SampledRound(rows, ids, version=0, old_per_token_logps=[torch.zeros(3)] * 4)
    with pytest.raises(ValueError, match="per_func needs `scores`"):
        SampledRound(rows, ids, version=0, per_func=torch.zeros(4, 1))
    round_ = SampledRound(rows, [[1, 2]] * 4, version=0, prompt_ids=[[5]] * 4)
    assert round_.completion_ids[0].dtype == torch.long and round_.prompt_ids[0].tolist() == [5]


def test_a_sampled_rounds_examples_as_columns_are_refused_as_such():
    """`examples=dataset[:8]` (a Dataset slice: a dict of 2 columns) was "2 completions do not form groups of
    group=4", counting the columns as completions (trial 8's SR01); entries that are not row dicts are named too."""
    dataset = Dataset.from_dict({"prompt": ["a", "b"] * 4, "answer": ["1", "2"] * 4})
    ids = [torch.tensor([1, 2])] * 8
    with pytest.raises(
        ValueError, match=r"SampledRound\.examples is a dict of columns \['prompt', 'answer'\].*not a "
    ):
        SampledRound(dataset[:8], ids, version=0, group=4)
    with pytest.raises(ValueError, match=r"SampledRound\.examples\[0\] is a str, not a row dict"):
        SampledRound(["a"] * 8, ids, version=0, group=4)
    assert len(SampledRound(dataset.select(range(8)).to_list(), ids, version=0, group=4).examples) == 8  # the fix


class OneRound:
    """A source returning `make(step)` once (what a broken source would return)."""

    def __init__(self, make):
        self.make = make

    def sample(self, rows_needed, step):
        return self.make(step)


def prompts(suite, n=4):
    return [suite.rl_train[i] for i in range(n)]


@pytest.mark.parametrize(
    "case, message",
    [
        ("future_version", r"round of version 100 at step 0.*version <= step"),
        ("id_outside_vocabulary", r"completion_ids\[0\] holds token id 99999, outside the policy's vocabulary"),
        ("negative_id", r"completion_ids\[0\] holds token id -1, outside"),
        ("longer_than_context", r"completion 0 is 300 tokens, more than the policy's context of 256"),
        ("group_of_one", r"group=1, but advantages are group-relative"),
        # U09 / U11: samplers.py's "Sampling temperatures must be positive" named neither the field nor the source
        (
            "negative_temperature",
            r"SampledRound.temperatures holds \[-1.0\]: a sampling temperature is finite and > 0",
        ),
        ("temperatures_too_few", r"SampledRound.temperatures has 3 values for 4 completions"),
    ],
)
def test_a_round_the_trainer_cannot_train_on_is_refused_naming_the_source(tmp_path, tokenizer, suite, case, message):
    """Each of these trained silently (or crashed deep in torch) before: a new user's trial, issue 21."""
    eos = tokenizer.eos_token_id

    def make(step):
        rows = prompts(suite)
        completions = [torch.tensor([5, 6, eos])] * 4
        kwargs = dict(version=step, group=4)
        if case == "future_version":
            kwargs["version"] = 100
        elif case == "id_outside_vocabulary":
            completions = [torch.tensor([99999, eos])] + completions[1:]
        elif case == "negative_id":
            completions = [torch.tensor([-1, eos])] + completions[1:]
        elif case == "longer_than_context":
            completions = [torch.full((300,), 5)] + completions[1:]
        elif case == "group_of_one":
            kwargs["group"] = 1
        elif case == "negative_temperature":
            kwargs["temperatures"] = -1.0
        elif case == "temperatures_too_few":
            kwargs["temperatures"] = torch.ones(3)
        return SampledRound(rows, completions, **kwargs)

    trainer = rl_trainer(tmp_path, tokenizer, suite, OneRound(make))
    with pytest.raises(ValueError, match=message) as error:
        trainer.collect_rollouts(8, step=0)
    assert "OneRound.sample" in str(error.value)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("scores", torch.tensor([1.0, float("inf"), 0.0, 0.0]), r"scores must be \(B,\) finite rewards"),
        ("scores", torch.zeros(4, 2), r"scores must be \(B,\)"),
        ("old_per_token_logps", [torch.tensor([float("nan")])] * 4, r"old_per_token_logps\[0\] must be finite"),
        ("old_per_token_logps", [torch.tensor([0.5])] * 4, r"log-probabilities <= 0"),
        ("version", 1.5, r"version=1.5 must be an int >= 0"),
        ("completion_ids", [torch.tensor([], dtype=torch.long)] * 4, r"completion_ids\[0\] is empty"),
    ],
)
def test_a_sampled_round_refuses_non_finite_or_malformed_values(suite, field, value, message):
    kwargs = {
        **dict(examples=prompts(suite), completion_ids=[torch.tensor([5])] * 4, version=0, group=4),
        field: value,
    }
    with pytest.raises(ValueError, match=message):
        SampledRound(**kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# The seventh new-user trial (issue 37): each of these was a raw Python / torch / json error, or silent
# ---------------------------------------------------------------------------------------------------------------------
def test_a_source_class_is_refused_at_construction(tmp_path, tokenizer, suite):
    """U13: the class was accepted, and `train()` failed in the cleanup's unbound `close()`."""
    with pytest.raises(TypeError, match=r"rollout_source=FixedSubclass is a class: pass an instance"):
        rl_trainer(tmp_path, tokenizer, suite, FixedSubclass)


def test_a_sample_without_step_is_refused_at_construction(tmp_path, tokenizer, suite):
    """U15: `sample(self, rows_needed)` failed at the first round with Python's "takes 2 positional arguments but 3
    were given"; a signature that takes both (here through *args) is accepted."""

    class NoStep(RolloutSource):
        def sample(self, rows_needed):
            raise AssertionError("never called")

    with pytest.raises(
        TypeError, match=r"NoStep.sample\(rows_needed\) cannot be called as `sample\(rows_needed, step\)`"
    ):
        rl_trainer(tmp_path, tokenizer, suite, NoStep())

    class Flexible:  # *args / defaults are fine
        def sample(self, *args, extra=None): ...

    rl_trainer(tmp_path, tokenizer, suite, Flexible())


@pytest.mark.parametrize(
    "field, value, message",
    [  # U17: torch's "Tensors must have same number of dimensions" deep in the forward
        (
            "completion_ids",
            [torch.tensor([[5, 6]])] * 4,
            r"completion_ids\[0\] has shape \(1, 2\): each entry is a 1-D",
        ),
        ("prompt_ids", [torch.tensor(5)] * 4, r"prompt_ids\[0\] has shape \(\): each entry is a 1-D"),
        ("completion_mask", [torch.ones(1, 2)] * 4, r"completion_mask\[0\] has shape \(1, 2\)"),
        # U16: float ids were cast to long without a word (5.5 -> 5)
        (
            "completion_ids",
            [torch.tensor([5.0, 6.5])] * 4,
            r"completion_ids\[0\] holds torch.float32 values that are not",
        ),
    ],
)
def test_a_sampled_round_refuses_ids_of_the_wrong_shape_or_kind(suite, field, value, message):
    kwargs = {
        **dict(examples=prompts(suite), completion_ids=[torch.tensor([5, 6])] * 4, version=0, group=4),
        field: value,
    }
    with pytest.raises(ValueError, match=message):
        SampledRound(**kwargs)


def test_whole_float_ids_are_converted_without_loss(suite):
    round_ = SampledRound(prompts(suite), [torch.tensor([5.0, 6.0])] * 4, version=0, group=4)
    assert round_.completion_ids[0].dtype == torch.long and round_.completion_ids[0].tolist() == [5, 6]


class TensorInMeta(HookedRounds):
    def checkpoint_state(self):
        return {"cursor": torch.tensor(self.cursor)}, {}


def test_a_checkpoint_state_that_is_not_json_is_refused_naming_the_source_and_key(tmp_path, tokenizer, suite):
    """U18: json's "Object of type Tensor is not JSON serializable" came from the first save, 21 frames deep, naming
    neither the source nor its hook."""
    source = TensorInMeta(suite.rl_train, answers(tokenizer, ["1", "22", "333", "4444"]))
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, max_steps=1, save_strategy="steps", save_steps=1)
    with pytest.raises(TypeError, match=r"TensorInMeta.checkpoint_state\(\) meta\['cursor'\] is not JSON"):
        trainer.train()
    assert not (tmp_path / "checkpoint-1" / "trapo").exists()  # refused before its state was written


@pytest.mark.parametrize(
    "state, message",
    [
        ({"cursor": 1}, r"returned dict; return None \(no state\) or a pair"),
        (([1], {}), r"meta is a list"),
        (({"a": 1}, {"t": [1, 2]}), r"tensors must be a dict of torch.Tensor, got values of type \['list'\]"),
    ],
)
def test_a_checkpoint_state_of_the_wrong_shape_is_refused(state, message):
    with pytest.raises(TypeError, match="Mine.checkpoint_state\\(\\) " + message.split(" ", 1)[0]):
        sources.check_checkpoint_state(state, "Mine")
    with pytest.raises(TypeError, match=message):
        sources.check_checkpoint_state(state, "Mine")
    assert sources.check_checkpoint_state(({"a": [1.5]}, {"t": torch.ones(2)}), "Mine")[0] == {"a": [1.5]}


def answer_reward(completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def test_examples_lacking_a_reward_column_are_refused_naming_the_source_and_column(tmp_path, tokenizer, suite):
    """U12: the reward function's own "missing 1 required positional argument: 'answer'" pointed at the reward; the
    cause is the source's examples, which lack the dataset row's `answer`."""

    def make(step):
        rows = [{k: v for k, v in row.items() if k != "answer"} for row in prompts(suite)]
        return SampledRound(rows, [torch.tensor([5, tokenizer.eos_token_id])] * 4, version=step, group=4)

    trainer = rl_trainer(tmp_path, tokenizer, suite, OneRound(make), reward=answer_reward)
    with pytest.raises(
        ValueError, match=r"OneRound.sample: SampledRound.examples\[0\] has no 'answer' \(4 of 4 examples lack it"
    ) as error:
        trainer.collect_rollouts(8, step=0)
    assert "'answer_reward' take by name" in str(error.value)


@pytest.mark.parametrize("key", ["completions", "trainer_state"])
def test_examples_with_a_key_named_like_a_reward_keyword_are_refused_naming_the_source(
    tmp_path, tokenizer, suite, key
):
    """Trial 9's RW03 / RW04 for a source's examples: `completions` made Python's "got multiple values for keyword
    argument"; `trainer_state` was silently replaced by the trainer's state in the reward's arguments."""

    def make(step):
        rows = [{**row, key: "mine"} for row in prompts(suite)]
        return SampledRound(rows, [torch.tensor([5, tokenizer.eos_token_id])] * 4, version=step, group=4)

    trainer = rl_trainer(tmp_path, tokenizer, suite, OneRound(make))
    with pytest.raises(
        ValueError, match=rf"OneRound.sample: SampledRound.examples\[0\] key '{key}' is named like an argument TRAPO "
    ) as error:
        trainer.collect_rollouts(8, step=0)
    assert "my_" + key in str(error.value)


class DueRounds(FixedRounds):
    """A duck-typed source whose `round_due` returns `due` at every call."""

    def __init__(self, *args, due=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.due = due

    def round_due(self, step):
        return self.due


def test_round_due_returning_something_else_than_a_bool_is_refused_naming_the_source(tmp_path, tokenizer, suite):
    """Trial 9's PX82: a truthy "yes" was taken as True without a word."""
    source = DueRounds(suite.rl_train, answers(tokenizer, ["1", "22", "333", "4444"]), due="yes")
    with pytest.raises(TypeError, match=r"DueRounds.round_due\(step\) returned 'yes' \(str\); it must return True"):
        rl_trainer(tmp_path, tokenizer, suite, source, max_steps=1).train()


def test_a_source_always_due_is_named_not_blamed_on_the_rewards(tmp_path, tokenizer, suite):
    """Trial 9's PX82c: `round_due` is asked again after every round it forces, so a source returning True at every
    call took 20 rounds and stopped the run with "every reward function returned None or NaN ... or the rounds were
    more than replay_max_age steps old", though its rewards and versions were fine."""
    source = DueRounds(suite.rl_train, answers(tokenizer, ["1", "22", "333", "4444"]))
    with pytest.raises(RuntimeError) as error:
        rl_trainer(tmp_path, tokenizer, suite, source, max_steps=1).train()
    assert str(error.value).startswith(
        "DueRounds.round_due(0) returned True before each of the last 19 rounds at step"
    )
    assert "reward function" not in str(error.value) and "return True only until a round of that step" in str(
        error.value
    )
    assert len(source.rounds) == 20


class ReadsAnotherKey(HookedRounds):
    def restore_checkpoint_state(self, meta, tensors):
        self.cursor = meta["position"]  # a key checkpoint_state never wrote


def test_a_source_failing_to_restore_its_state_is_named_with_the_state_and_the_fix(tmp_path, tokenizer, suite):
    """Trial 9's PX87: "checkpoint-2/trapo/rank0.json cannot be restored: KeyError: 'position'" named neither the
    source, nor its hook, nor the fix (as objectives' `load_state_dict` errors are named)."""
    completions = answers(tokenizer, ["1", "22", "333", "4444"])
    source = HookedRounds(suite.rl_train, completions)
    rl_trainer(tmp_path, tokenizer, suite, source, max_steps=1, save_strategy="steps", save_steps=1).train()
    resumed = rl_trainer(tmp_path, tokenizer, suite, ReadsAnotherKey(suite.rl_train, completions), max_steps=2)
    with pytest.raises(CheckpointError) as error:
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert str(error.value) == (
        f"{tmp_path / 'checkpoint-1' / 'trapo' / 'rank0.json'}: rollout source ReadsAnotherKey.restore_checkpoint_state "
        "raised KeyError: 'position', given the checkpoint's state for it: {\"cursor\": 2}. Fix: make "
        "restore_checkpoint_state read what checkpoint_state returns (keys it may lack: meta.get(key, default))."
    )
