# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Reward functions and models as users write them: async functions that keep loop-bound state, trainers built inside
a running event loop (a notebook), reward models and critics without a pad id, reward tokenizers without a pad token,
and the names under which rewards are logged."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading

import pytest
import torch
from conftest import tiny_critic
from datasets import Dataset
from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

from trl_trapo import TRAPOTrainer
from trl_trapo.agents import environment_reward
from trl_trapo.rewards import call_reward_function, reward_function_name
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward


class SemaphoreReward:
    """Creates an `asyncio.Semaphore` on its first call and reuses it (a rate limit on a reward server, say): that
    only works when every call runs on the same event loop."""

    def __init__(self):
        self.semaphore = None
        self.loops = set()
        self.calls = 0

    async def score(self, completion) -> float:
        async with self.semaphore:  # contended: the semaphore binds to the running loop
            await asyncio.sleep(0)
            return float(len(str(completion)) % 2)

    async def __call__(self, prompts, completions, **kwargs):
        if self.semaphore is None:
            self.semaphore = asyncio.Semaphore(1)
        self.loops.add(id(asyncio.get_running_loop()))
        self.calls += 1
        return list(await asyncio.gather(*(self.score(c) for c in completions)))


def test_an_async_reward_with_loop_bound_state_works_across_calls(tmp_path, tokenizer, suite, tiny_config):
    reward = SemaphoreReward()
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        # with the defaults (exploration on): a round is one unit, so one reward call per round whatever the
        # families' temperatures
        args=tiny_config(tmp_path),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    trainer.collect_rollouts(8, step=0)  # the check at construction made the first two calls (2 rows, 1 row)
    trainer.collect_rollouts(8, step=1)
    assert reward.calls == 4 and len(reward.loops) == 1
    assert trainer.reward_func_names == ["SemaphoreReward"]


def test_the_trainer_can_be_built_and_run_inside_a_running_event_loop(tmp_path, tokenizer, suite, tiny_config):
    reward = SemaphoreReward()

    async def notebook_cell():
        trainer = TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=reward,
            args=tiny_config(tmp_path, max_steps=2),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )
        return trainer.train()

    output = asyncio.run(notebook_cell())
    assert output.global_step == 2 and reward.calls >= 2


def test_reward_names_unwrap_partials():
    assert reward_function_name(functools.partial(exact_match_reward)) == "exact_match_reward"


def classifier(tokenizer, pad_token_id=None):
    torch.manual_seed(1)
    return tiny_critic(tokenizer, max_position_embeddings=64, pad_token_id=pad_token_id)


@pytest.mark.parametrize("role", ["reward_model", "value_model"])
def test_models_without_a_pad_id_work_from_the_first_rollout(tmp_path, tokenizer, suite, tiny_config, role):
    """A reward model or critic whose config has no pad id used to fail at the first rollout ("Cannot handle batch
    sizes > 1 if no padding token is defined"); TRAPO gives it its tokenizer's pad id at construction, as TRL does."""
    model = classifier(tokenizer)
    assert model.config.pad_token_id is None
    kwargs = {role: model}
    if role == "value_model":
        kwargs["reward_funcs"] = exact_match_reward
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        args=tiny_config(tmp_path, num_generations=2 if role == "reward_model" else 1),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        **kwargs,
    )
    assert model.config.pad_token_id == tokenizer.pad_token_id
    trainer.collect_rollouts(4, step=0)
    assert len(trainer.replay) > 0


def test_a_reward_tokenizer_without_a_pad_token_defaults_to_eos(tmp_path, tokenizer, suite, tiny_config):
    import copy

    reward_tokenizer = copy.deepcopy(tokenizer)
    reward_tokenizer.pad_token = None
    reward_tokenizer.add_tokens(["<extra>"])  # another vocabulary: completions are re-tokenized and padded
    assert reward_tokenizer.pad_token_id is None
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        args=tiny_config(tmp_path),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        reward_model=classifier(reward_tokenizer),
        reward_processing_classes=reward_tokenizer,
    )
    assert reward_tokenizer.pad_token == reward_tokenizer.eos_token
    trainer.collect_rollouts(8, step=0)
    assert len(trainer.replay) == 8


# ---------------------------------------------------------------------------------------------------------------------
# What counts as a reward (TRL 1.16's GRPOTrainer builds `torch.tensor(rewards, dtype=torch.float32)`)
# ---------------------------------------------------------------------------------------------------------------------
def test_rewards_are_numbers_as_trl_accepts_them_and_none_stays_cannot_score():
    import math

    import numpy as np

    from trl_trapo.rewards import call_reward_function

    def reward(**kwargs):
        return [True, False, 2, np.float32(0.5), np.bool_(True), torch.tensor(0.25), None]

    values = call_reward_function(reward, "reward", 7, {})
    assert values[:6] == [1.0, 0.0, 2.0, 0.5, 1.0, 0.25] and math.isnan(values[6])


@pytest.mark.parametrize("output", [["1"], [[1.0]], "1", {"a": 1.0}, [torch.tensor([1.0, 2.0])]])
def test_a_reward_function_returning_no_number_is_named_with_the_value_and_row(output):
    from trl_trapo.rewards import call_reward_function

    with pytest.raises(ValueError, match=r"Reward function 'f' (returned .* for completion 0|must return a list)"):
        call_reward_function(lambda **kwargs: output, "f", 1, {"prompts": ["ab="]})


def test_a_non_numeric_reward_at_train_time_is_refused_by_name(tmp_path, tokenizer, suite, tiny_config):
    """Right at preflight (empty completions), a string once the policy writes something: refused when scored."""

    def parsed_reward(completions, **kwargs):
        return [0.0 if not c else str(len(c)) for c in completions]  # forgot float()

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=parsed_reward,
        args=tiny_config(tmp_path, max_steps=1),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    with pytest.raises(ValueError, match=r"Reward function 'parsed_reward' returned '\d+' \(str\) for completion \d+"):
        trainer.train()


@pytest.mark.parametrize("value", [None, float("nan")], ids=["None", "NaN"])
def test_a_round_no_reward_function_scored_is_said_at_once(tmp_path, tokenizer, suite, tiny_config, caplog, value):
    """None / NaN is 'no reward for this sample' (TRL): a round can lose some completions, so rounds are retried, and
    the run stops after 20 in a row. The first such round is now a warning naming the functions, not 19 silent rounds.
    (At construction the functions are called on empty completions, for which None is a legitimate answer, so that
    call cannot tell a broken function from a correct one.)"""

    def unscored(completions, **kwargs):
        return [value] * len(completions)

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer),
        reward_funcs=unscored,
        args=tiny_config(tmp_path, max_steps=1),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    with caplog.at_level("WARNING", logger="trl_trapo.trainer"), pytest.raises(RuntimeError, match="20 rollout"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "no completion of this rollout round" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once, at the first round
    assert warnings[0].startswith("Step 0: no completion of this rollout round got a reward: every reward function")
    assert "('unscored') returned None or NaN" in warnings[0]


def test_a_nan_reward_is_warned_about_once_per_function_and_none_is_not(caplog):
    """Trial 15's N44: a reward function that starts returning NaN (a judge's reply that did not parse) was taken as
    abstention without a word. The first NaN of each function is warned about (the function, how many of how many,
    that NaN is taken as None); None, the documented abstention, is not; completions no function scored are said once
    with their count, as TRL warns "All reward functions returned None"."""
    from trl_trapo.rewards import RewardScorer

    def judge(completions, **kwargs):
        return [float("nan") if i % 2 == 0 else 1.0 for i in range(len(completions))]

    def picky(completions, **kwargs):
        return [None if i % 4 == 0 else 0.5 for i in range(len(completions))]

    tokenizer = build_char_tokenizer()
    scorer = RewardScorer([judge, picky], [None, None], [1.0, 1.0], tokenizer, 8, print, print, lambda: None)
    ids = [torch.tensor(tokenizer.encode("4", add_special_tokens=False))] * 8
    examples = [{"prompt": "2+2=", "answer": "4"}] * 8
    with caplog.at_level(logging.WARNING, logger="trl_trapo.rewards"):
        scores, per_func = scorer.score(examples, ids, ids)
        scorer.score(examples, ids, ids)  # again: nothing more is said
    assert torch.isnan(per_func[:, 0]).sum() == 4 and torch.isnan(scores).sum() == 2  # rows 0 and 4: neither scored
    said = [r.getMessage() for r in caplog.records]
    nan = [m for m in said if "returned NaN" in m]
    assert len(nan) == 1, said
    assert nan[0].startswith("Reward function 'judge' returned NaN for 4 of 8 completions: NaN is treated as None")
    assert "rewards/judge/unscored_frac" in nan[0]
    assert not any("'picky' returned NaN" in m for m in said)  # None is abstention, not a failure
    unscored = [m for m in said if "got no reward from any reward function" in m]
    assert len(unscored) == 1 and unscored[0].startswith("2 of 8 completions got no reward"), said
    assert "'judge', 'picky'" in unscored[0] and "All reward functions returned None" in unscored[0]


def test_the_share_of_completions_a_reward_function_abstains_on_is_logged(tmp_path, tokenizer, suite, tiny_config):
    """`rewards/<function>/unscored_frac`: the share of the rollouts a function returned None or NaN for (trial 15's
    N44: a function failing on half its completions left only its mean, over the other half, in the log)."""

    def flaky(completions, trainer_state=None, **kwargs):
        step = trainer_state.global_step if trainer_state is not None else 0
        return [float("nan") if step >= 1 and i % 2 == 0 else 1.0 for i in range(len(completions))]

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer),
        reward_funcs=[flaky, exact_match_reward],
        args=tiny_config(tmp_path, max_steps=2, num_ppo_epochs=1, logging_steps=1, save_strategy="no"),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    trainer.train()
    logs = {h["step"]: h for h in trainer.state.log_history if "rewards/flaky/unscored_frac" in h}
    assert logs[1]["rewards/flaky/unscored_frac"] == 0.0 and logs[2]["rewards/flaky/unscored_frac"] == 0.5, logs
    assert logs[2]["rewards/exact_match_reward/unscored_frac"] == 0.0


@pytest.mark.parametrize("length", [1, 2, 3])
def test_a_reward_of_fixed_length_is_refused_at_construction(tmp_path, tokenizer, suite, tiny_config, length):
    """A function that ignores `len(completions)` returns the right count for at most one batch size: one
    construction-time call of 2 rows passed `[1.0, 0.0]`, refused only after the first generation (trial 6's R01)."""

    def fixed(completions, **kwargs):
        return [1.0] * length

    with pytest.raises(ValueError, match=rf"construction-time check.*'fixed' failed.*returned {length} rewards for"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=fixed,
            args=tiny_config(tmp_path, max_steps=1),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )


def test_a_reward_needing_a_column_the_data_lacks_names_the_column_and_the_rename(
    tmp_path, tokenizer, suite, tiny_config
):
    """TRL's `accuracy_reward(completions, solution, **kwargs)` on data whose column is `answer` failed with Python's
    "missing 1 required positional argument: 'solution'" and the generic calling convention (trial 8's JC22): the
    message names the missing column, the columns the data has and the rename."""
    import trl.rewards

    with pytest.raises(
        RuntimeError, match=r"'accuracy_reward' needs the argument\(s\) 'solution', which reward "
    ) as info:
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=trl.rewards.accuracy_reward,
            args=tiny_config(tmp_path, max_steps=1),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )
    assert "its other columns: ['answer'" in str(info.value), info.value
    assert "rename_column('<your column>', 'solution')" in str(info.value), info.value


def test_rows_lacking_a_reward_column_are_warned_about_naming_the_column_and_function(
    tmp_path, tokenizer, suite, tiny_config, caplog
):
    """A JSON Lines file whose odd rows lack `answer` trained without a word: datasets fills the key with None and
    the reward leaves those rows unscored (trial 6's M18). TRL passes the None on as well: a warning, not a refusal."""

    def needs_answer(completions, answer, **kwargs):
        return [None if a is None else float(c == a) for c, a in zip(completions, answer)]

    rows = suite.rl_train.select(range(8)).to_list()
    for row in rows[1::2]:
        row["answer"] = None
    for row in rows:
        row["note"] = None  # None in every row and read by no function by name: not said
    dataset = Dataset.from_list(rows)
    held_out = Dataset.from_list([{**row, "answer": None} if i == 2 else row for i, row in enumerate(rows[::2])])
    with caplog.at_level(logging.WARNING, logger="trl_trapo.data"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=needs_answer,
            args=tiny_config(tmp_path, max_steps=1),
            train_dataset=dataset,
            eval_dataset=held_out,
            processing_class=tokenizer,
        )
    said = [r.getMessage() for r in caplog.records if "is missing (None)" in r.getMessage()]
    assert len(said) == 2, said
    # the Python API names the trainer's argument (the command line names its flag: test_main_job_inputs.py)
    assert said[0].startswith("`train_dataset` column 'answer' is missing (None) in 4 of 8 rows (first at row 1)")
    assert "'needs_answer'" in said[0]
    assert said[1].startswith("`eval_dataset` column 'answer' is missing (None) in 1 of 4 rows (first at row 2)")


def test_a_reward_reading_trainer_state_is_called_with_a_state_at_construction(
    tmp_path, tokenizer, suite, tiny_config
):
    """TRL always passes a `TrainerState` as `trainer_state`; the construction-time check passed None, so a valid TRL
    reward reading `trainer_state.global_step` was refused at construction, blamed on the function (trial 8's RS03).
    Now it gets a fresh state at step 0 there, and the Trainer's own state during training."""
    steps = []

    def by_step(completions, trainer_state, **kwargs):
        steps.append(trainer_state.global_step)
        return [float(trainer_state.epoch or 0.0)] * len(completions)

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=by_step,
        args=tiny_config(tmp_path, max_steps=1),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    assert steps == [0, 0]  # the construction-time calls (2 rows, then 1)
    trainer.collect_rollouts(8, step=0)
    assert len(steps) == 3 and steps[-1] == trainer.state.global_step


@pytest.mark.parametrize(
    "column", ["completions", "prompts", "completion_ids", "trainer_state", "log_metric", "log_extra"]
)
@pytest.mark.parametrize("argument", ["train_dataset", "eval_dataset"])
def test_a_column_named_like_a_reward_keyword_is_refused_before_anything_loads(
    tmp_path, tokenizer, suite, tiny_config, column, argument, monkeypatch
):
    """Trial 9's RW03 / RW04: a `completions` (or `prompts`) column made Python's "dict() got multiple values for
    keyword argument 'completions'" at construction; a `trainer_state` (`log_metric`, `log_extra`) column was silently
    replaced in the reward's arguments by the trainer's own. TRL 1.16's GRPOTrainer does the same (`reward_func(
    prompts=..., completions=..., **reward_kwargs)`, then `reward_kwargs["trainer_state"] = self.state`). Trial 16's
    N27: a `completion_ids` column was replaced by TRAPO's token ids without a word (as TRL does: it skips the column
    and passes its own)."""
    import trl_trapo.wiring

    def must_not_load(*args, **kwargs):
        raise AssertionError("the models were loaded before the column was refused")

    monkeypatch.setattr(trl_trapo.wiring, "load_models", must_not_load)
    rows = suite.rl_train.select(range(4))
    dataset = rows.add_column(column, ["mine"] * 4)
    datasets = {"train_dataset": dataset} if argument == "train_dataset" else {"train_dataset": rows}
    if argument == "eval_dataset":
        datasets["eval_dataset"] = {"held_out": dataset}
    with pytest.raises(ValueError) as error:
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path, max_steps=1),
            processing_class=tokenizer,
            **datasets,
        )
    label = "train_dataset" if argument == "train_dataset" else "eval_dataset['held_out']"
    assert str(error.value).startswith(
        f"`{label}` column '{column}' is named like an argument TRAPO passes to every reward function (completion_ids, "
        "completions, log_extra, log_metric, prompts, trainer_state)"
    ), error.value
    assert f"`dataset.rename_column('{column}', 'my_{column}')`" in str(error.value)


def test_every_keyword_a_reward_call_passes_is_refused_as_a_column(tokenizer):
    """Trial 16's N27: the names refused as columns were a list of their own, which missed `completion_ids`, so such a
    column reached the reward functions as TRAPO's token ids. Every keyword of every reward call TRAPO makes (the
    construction-time check, scoring, a tool run's `environments`, the job's check of the built-in prompts) that is
    not a column of the row must be one `check_reward_columns` refuses."""
    from trl_trapo.jobs.main import warn_rewards_unfit_for_prompts
    from trl_trapo.rewards import RESERVED_REWARD_COLUMNS, RewardScorer, check_reward_columns

    calls = []

    def spy(**kwargs):
        calls.append(set(kwargs))
        return [0.0] * len(kwargs["completions"])

    scorer = RewardScorer([spy], [None], [1.0], tokenizer, 4, lambda *a: None, lambda *a: None, lambda: None)
    row = {"prompt": "2+2=", "answer": "4"}
    ids = [torch.tensor(tokenizer.encode("4", add_special_tokens=False))]
    scorer.preflight([row])
    scorer.score([row], ids, ids)
    scorer.score([row], ids, ids, extra_kwargs={"environments": [None]})
    warn_rewards_unfit_for_prompts([spy], Dataset.from_list([row]))
    assert len(calls) == 4, calls
    for keys in calls:
        passed = keys - {"answer", "environments"}  # the row's column; the tool run's keyword (refused there)
        assert passed <= RESERVED_REWARD_COLUMNS, sorted(passed - RESERVED_REWARD_COLUMNS)
        for keyword in passed:
            with pytest.raises(ValueError, match=rf"'{keyword}' is named like an argument"):
                check_reward_columns(["answer", keyword], "`train_dataset` column", "rename {column}")


def test_every_column_named_like_a_reward_keyword_is_named_at_once():
    """Trial 12's N49 sibling: a dataset with `completions` and `trainer_state` columns was refused at the first, then
    at the second once renamed. Now both are named, a rename each."""
    from trl_trapo.rewards import check_reward_columns

    with pytest.raises(ValueError) as caught:
        check_reward_columns(
            ["prompt", "completions", "answer", "trainer_state"], "`train_dataset` column", "rn {column}"
        )
    head, *items = str(caught.value).split("\n- ")
    assert head.startswith("`train_dataset` columns 'completions', 'trainer_state' are named like arguments TRAPO"), (
        head
    )
    assert items == ["rn completions", "rn trainer_state"], items


def test_a_reward_keyword_column_is_kept_when_no_reward_function_reads_columns(
    tmp_path, tokenizer, suite, tiny_config
):
    """Reward models get no columns (as in TRL), so a `completions` column harms nothing there and is not refused."""
    TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_model=classifier(tokenizer, pad_token_id=tokenizer.pad_token_id),
        args=tiny_config(tmp_path, max_steps=1),
        train_dataset=suite.rl_train.add_column("completions", ["mine"] * len(suite.rl_train)),
        processing_class=tokenizer,
    )


def test_the_scorer_refuses_a_row_key_named_like_a_reward_keyword():
    """The last line for rows that reach the scorer another way than a checked dataset or source round: one message
    naming the key, not Python's "got multiple values for keyword argument" or a silently replaced value."""
    from trl_trapo.rewards import RewardScorer

    tokenizer = build_char_tokenizer()
    scorer = RewardScorer(
        [exact_match_reward], [None], [1.0], tokenizer, 4, lambda *a: None, lambda *a: None, lambda: None
    )
    ids = [torch.tensor(tokenizer.encode("4", add_special_tokens=False))]
    examples = [{"prompt": "2+2=", "answer": "4"}]
    assert scorer.score(examples, ids, ids)[0].tolist() == [1.0]
    for key in ("completions", "log_extra"):
        with pytest.raises(ValueError, match=rf"rows' key '{key}' is named like an argument TRAPO passes"):
            scorer.score([{**examples[0], key: "x"}], ids, ids)
    with pytest.raises(ValueError, match=r"rows' key 'environments' is named like"):  # a tool run's extra keyword
        scorer.score([{**examples[0], "environments": "x"}], ids, ids, extra_kwargs={"environments": [None]})


def startswith_think(completions, **kwargs):
    return [float(c.startswith("<think>")) for c in completions]  # strings only


def always_fails(completions, **kwargs):
    raise IndexError("not about the form")


@pytest.mark.parametrize(
    ("func", "prompt", "expected"),
    [
        # trial 9's RW05: TRL's think_format_reward reads completion[0]["content"]; text prompts give strings
        ("think_format_reward", "2+2=", ["expects conversational completions", '[{"role": "user", "content": ...}]']),
        (startswith_think, [{"role": "user", "content": "2+2="}], ["are conversational", "expects strings"]),
    ],
)
def test_a_reward_expecting_the_other_completion_form_is_named_at_construction(func, prompt, expected):
    """A reward function that fails on the completions' form (set by the prompts') and works on the other one is told
    so, with the fix; before, the message blamed the empty completion of the construction-time check."""
    from trl_trapo.rewards import RewardFunctionError, RewardScorer

    if func == "think_format_reward":
        from trl.rewards import think_format_reward as func
    scorer = RewardScorer([func], [None], [1.0], build_char_tokenizer(), 8, print, print, lambda: None)
    with pytest.raises(RewardFunctionError) as caught:
        scorer.preflight([{"prompt": prompt}], source="`train_dataset`")
    message = str(caught.value)
    assert all(part in message for part in expected), message
    assert "must also accept an empty completion" not in message
    assert isinstance(caught.value.__cause__, (IndexError, TypeError, AttributeError))


def numeric_match(completions, answer, **kwargs):
    return [float(float(c) == float(a)) for c, a in zip(completions, answer)]  # ValueError on an empty completion


def test_the_empty_completion_advice_goes_to_a_function_that_fails_on_empty_completions_only():
    """Trial 14's C13 / C14: "A reward function must also accept an empty completion" was added to every failure of
    the construction-time check, a class's constructor or an unreachable server included. Now only to a function
    that scores filled completions (the rows' answers) and fails on the empty ones; a function failing on both, or
    with an OSError in its error (called once: a second call could wait for the same timeout), is told its error
    alone."""
    from trl_trapo.rewards import RewardFunctionError, RewardScorer

    calls = []

    def unreachable(completions, **kwargs):
        calls.append(len(completions))
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as error:
            raise RuntimeError("cannot reach the reward server") from error

    rows = [{"prompt": "2+2=", "answer": "4"}]
    for func, advised in ((numeric_match, True), (always_fails, False), (unreachable, False)):
        scorer = RewardScorer([func], [None], [1.0], build_char_tokenizer(), 8, print, print, lambda: None)
        with pytest.raises(RewardFunctionError) as caught:
            scorer.preflight(rows)
        message = str(caught.value)
        assert ("must also accept an empty completion" in message) == advised, message
        assert f"reward function '{func.__name__}' failed." in message
    assert calls == [1]


def test_every_reward_function_failing_the_construction_time_check_is_named_in_one_message():
    """Trial 12's N49 sibling: with several reward functions that fail on the data (a typo in each, the form one
    expects), the check named the first, then the next after each fix. Now one message names each with its error and
    fix; a function that passes is not named, and the first one's exception is chained."""
    from trl_trapo.rewards import RewardFunctionError, RewardScorer

    def fixed(completions, **kwargs):
        return [1.0]

    def needs_solution(completions, solution, **kwargs):
        return [0.0] * len(completions)

    def first_turn_is_the_answer(completions, answer, **kwargs):  # IndexError on an empty completion
        return [float(c[0]["content"][0] == a[0]) for c, a in zip(completions, answer)]

    funcs = [always_fails, exact_match_reward, fixed, startswith_think, first_turn_is_the_answer]
    scorer = RewardScorer(funcs, [None] * 5, [1.0] * 5, build_char_tokenizer(), 8, print, print, lambda: None)
    rows = [{"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"}] * 2
    with pytest.raises(RewardFunctionError) as caught:
        scorer.preflight(rows, source="`train_dataset`")
    head, *items = str(caught.value).split("\n- ")
    assert head.startswith("In TRAPOTrainer's construction-time check (each reward function is called on the first 2")
    assert head.endswith(", 4 reward functions failed, each with its error:"), head
    assert [item.split(" failed. ")[0].split(" raised ")[0] for item in items] == [
        "reward function 'always_fails'",
        "reward function 'fixed'",
        "reward function 'startswith_think'",
        "reward function 'first_turn_is_the_answer'",
    ], items
    assert "returned 1 rewards for 2" in items[1] and "expects strings" in items[2], items
    # the advice on empty completions names the one function it is about (trial 14's C13 / C14)
    assert items[-1].endswith(
        "A reward function must also accept an empty completion (return 0.0 or None for it) "
        "('first_turn_is_the_answer' scored filled ones)."
    ), items[-1]
    assert "empty completion" not in "".join(items[:-1])
    assert isinstance(caught.value.__cause__, IndexError)  # always_fails's own error
    scorer = RewardScorer([needs_solution], [None], [1.0], build_char_tokenizer(), 8, print, print, lambda: None)
    with pytest.raises(RewardFunctionError) as caught:  # one function: the message as before
        scorer.preflight(rows, source="`train_dataset`")
    assert "\n" not in str(caught.value) and "reward function 'needs_solution' failed." in str(caught.value)


@pytest.mark.parametrize("prompts", [None, "train_dataset", "eval_dataset"])
def test_rewards_no_prompts_read_are_warned_about_once(tmp_path, tokenizer, suite, tiny_config, caplog, prompts):
    """`reward_funcs` with only an `sft_dataset` trained SFT and never scored anything, without a word (trial 9's
    PX53); RL prompts or evaluation prompts read them, so nothing is said then."""
    datasets = {"sft_dataset": suite.sft}
    if prompts is not None:
        datasets[prompts] = suite.rl_train.select(range(8))
    with caplog.at_level(logging.WARNING, logger="trl_trapo.assembly"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path, max_steps=1),
            processing_class=tokenizer,
            **datasets,
        )
    said = [r.getMessage() for r in caplog.records if "reward_funcs" in r.getMessage()]
    if prompts is not None:
        assert said == []
        return
    assert said == [
        "reward_funcs (exact_match_reward) is set but a `train_dataset` of RL prompts (or an `eval_dataset` to "
        "score) is not: it is ignored (no RL objective is built; the run trains on its other data). Pass a "
        "`train_dataset` of prompts to train with it (RL), or drop it."
    ], said


def test_a_reward_that_changes_its_lists_in_place_cannot_change_the_next_functions(
    tmp_path, tokenizer, suite, tiny_config
):
    """Trial 10's DA06: one list object went to every reward function, so a function that emptied `completions`
    after scoring made the next, innocent function fail ("returned 0 rewards for 2 completions") at construction; a
    function that sorted it would have misaligned the next one's rewards silently. Each function gets its own copies."""
    seen, given = [], []

    def mutating(completions, prompts, **kwargs):
        n = len(completions)
        given.append(list(prompts))
        completions.clear()
        prompts.reverse()
        return [0.5] * n

    def recording(completions, prompts, completion_ids, **kwargs):
        seen.append((len(completions), len(completion_ids), list(prompts)))
        return [1.0] * len(completions)

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=[mutating, recording],
        args=tiny_config(tmp_path),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    trainer.collect_rollouts(8, step=0)
    assert seen and all(n == m and n > 0 for n, m, _ in seen), seen
    # the second function saw the prompts in the rows' order, not reversed by the first
    assert [prompts for _, _, prompts in seen] == given


class InterruptedJudge:
    """An environment whose async `get_reward()` is interrupted (a judge call wrapped around a subprocess, say)."""

    async def get_reward(self):
        raise KeyboardInterrupt("the judge was interrupted")


async def interrupted_reward(completions, **kwargs):
    raise KeyboardInterrupt("the judge was interrupted")


async def exiting_reward(completions, **kwargs):
    raise SystemExit(3)


@pytest.mark.parametrize(
    "func, kwargs, raised",
    [
        (interrupted_reward, {}, KeyboardInterrupt),
        (exiting_reward, {}, SystemExit),
        (
            environment_reward(InterruptedJudge),
            {"environments": [InterruptedJudge(), InterruptedJudge()]},
            KeyboardInterrupt,
        ),
    ],
    ids=["async-function-KeyboardInterrupt", "async-function-SystemExit", "async-get_reward-KeyboardInterrupt"],
)
def test_an_async_reward_raising_keyboardinterrupt_or_systemexit_reaches_the_caller_and_the_loop_survives(
    func, kwargs, raised
):
    # asyncio re-raises these two out of the loop's thread: the thread ended, the call's future was never settled
    # and the call waited forever. Now the caller gets the exception (as from a sync function) and the loop serves on.
    async def fine(completions, **kwargs):
        return [1.0] * len(completions)

    thread, loop, ready = start_event_loop_in_daemon(name="test-rewards")
    ready.wait()
    outcome = {}

    def call():
        try:
            call_reward_function(func, "judge", 2, {"completions": ["a", "b"], **kwargs}, loop=loop)
        except BaseException as error:  # noqa: BLE001  (what the call raised is the point)
            outcome["raised"] = error

    caller = threading.Thread(target=call, daemon=True)
    try:
        caller.start()
        caller.join(timeout=20)
        assert not caller.is_alive(), "the reward call hung: the event loop's thread ended without settling it"
        assert type(outcome.get("raised")) is raised
        assert call_reward_function(fine, "fine", 2, {"completions": ["a", "b"]}, loop=loop) == [1.0, 1.0]
    finally:
        shutdown_event_loop_in_daemon(thread, loop)
