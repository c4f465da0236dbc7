# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A GRPO agent script's first contact with TRAPO: faults a new user met, each fixed at its mechanism.

- reset / reward functions get the dataset's own columns, never TRAPO's `prompt_ids` / `demonstration_ids`;
- GRPOConfig's `beta`, `epsilon`, `num_iterations` are aliases; GRPO-only fields are refused naming the fix;
- `max_tool_calling_iterations=0` is TRL's "tools shown, none run";
- no reward source with `environment_factory` says so (and suggests `get_reward`);
- the construction-time calls of user code (reward functions on empty completions, trial resets) say where they
  failed and keep the cause;
- malformed tool-call traces in SFT data are refused at construction, naming the row, the field and the fix;
- a turn's tool calls run in the order written (stateful environments), a call cut off by the completion budget is
  never run (counted in `tools/truncated_frequency`), and a tool that raises is shown once (issue 37).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from conftest import add
from datasets import Dataset
from test_agent_traces import make_trainer, trace
from test_agents import Counter, Quiet, broken, call, ids, make_source, prompts_dataset, tiny_args
from transformers.utils import get_json_schema

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.agents import check_observation
from trl_trapo.data import INTERNAL_COLUMNS, tokenize_sft_dataset
from trl_trapo.rewards import RewardScorer
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model


def zero(completions, **kwargs):
    return [0.0] * len(completions)


# ---------------------------------------------------------------------------------------------------------------------
# A. reset and reward functions get the dataset's own columns
# ---------------------------------------------------------------------------------------------------------------------
class StrictReset:
    """TRL-style: `reset` names the dataset's columns and takes nothing else."""

    seen: list[dict] = []

    def reset(self, prompt, answer):
        StrictReset.seen.append({"prompt": prompt, "answer": answer})

    def guess(self, value: int) -> str:
        """Guess.

        Args:
            value: The guess.
        """
        return "ok"

    def get_reward(self) -> float:
        return 0.0


def test_reset_gets_exactly_the_dataset_columns_as_trl_passes_them(tmp_path, tool_tok):
    StrictReset.seen = []
    trainer = TRAPOTrainer(
        build_tiny_model(tool_tok, seed=0),
        args=tiny_args(tmp_path),
        train_dataset=prompts_dataset(4, answer=["1", "2", "3", "4"]),
        processing_class=tool_tok,
        environment_factory=StrictReset,
    )  # was: TypeError: StrictReset.reset() got an unexpected keyword argument 'prompt_ids'
    assert len(StrictReset.seen) == 2  # the construction-time trial resets
    source = trainer.rollout_source
    rows = [source.dataset[0]]
    assert "prompt_ids" in rows[0]  # the prepared rows carry it; reset does not get it
    rollouts = source.start(rows)
    assert StrictReset.seen[-1]["answer"] == "1" and rollouts[0].environment is not None


def test_reward_functions_get_no_internal_column():
    seen = {}

    def reward(completions, **kwargs):
        seen.update(kwargs)
        return [0.0] * len(completions)

    scorer = RewardScorer([reward], [None], [1.0], build_char_tokenizer(), 8, print, print, lambda: None)
    rows = [{"prompt": "p", "answer": "1", "prompt_ids": [1, 2], "demonstration_ids": [3]}]
    scorer.preflight(rows)
    assert "answer" in seen and not set(INTERNAL_COLUMNS) & set(seen)


# ---------------------------------------------------------------------------------------------------------------------
# B. GRPOConfig's names
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("alias", "target", "value"),
    [("beta", "kl_coef", 0.0), ("epsilon", "cliprange", 0.3), ("num_iterations", "num_ppo_epochs", 1)],
)
def test_grpo_names_are_aliases_set_once_and_a_disagreement_is_refused(tmp_path, alias, target, value):
    config = TRAPOConfig(output_dir=str(tmp_path), **{alias: value})
    assert getattr(config, target) == value and getattr(config, alias) == value
    plain = TRAPOConfig(output_dir=str(tmp_path))  # not given: it reads TRAPO's value in effect, as in TRL
    assert getattr(plain, alias) == getattr(plain, target) and plain.grpo_names_given == []
    same = TRAPOConfig(output_dir=str(tmp_path), **{alias: value, target: value})
    assert getattr(same, target) == value
    other = {"kl_coef": 0.2, "cliprange": 0.1, "num_ppo_epochs": 2}[target]
    with pytest.raises(ValueError, match=rf"{alias}={value!r} and {target}={other!r} disagree"):
        TRAPOConfig(output_dir=str(tmp_path), **{alias: value, target: other})


@pytest.mark.parametrize(
    ("field", "needle"),
    [
        ("log_completions", "generate_completions"),
        ("epsilon_high", "symmetrically"),
        ("vllm_server_host", "no TRAPO equivalent"),
    ],
)
def test_a_grpo_only_field_is_refused_naming_it_and_the_fix(tmp_path, field, needle):
    with pytest.raises(TypeError) as caught:
        TRAPOConfig(output_dir=str(tmp_path), **{field: True})
    message = str(caught.value)
    assert field in message and needle in message and "Moving a GRPOTrainer script over" in message
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_a_field'"):
        TRAPOConfig(output_dir=str(tmp_path), not_a_field=1)


def test_the_cli_parses_the_aliases_and_beta_wins_over_the_builtin_kl_coef():
    from trl_trapo import cli

    _, config, _ = cli.parse_args(["--beta", "0.0", "--epsilon", "0.25", "--num_iterations", "2"])
    assert (config.kl_coef, config.cliprange, config.num_ppo_epochs) == (0.0, 0.25, 2)
    _, builtin, _ = cli.parse_args([])
    assert builtin.kl_coef == builtin.beta == 0.01 and builtin.grpo_names_given == []  # beta reads kl_coef


# ---------------------------------------------------------------------------------------------------------------------
# D. max_tool_calling_iterations=0
# ---------------------------------------------------------------------------------------------------------------------
def test_zero_tool_calling_iterations_shows_the_tools_and_runs_none(tmp_path, tool_tok):
    config = tiny_args(tmp_path, max_tool_calling_iterations=0)
    assert config.max_tool_calling_iterations == 0
    with pytest.raises(ValueError, match="max_tool_calling_iterations=-1"):
        tiny_args(tmp_path, max_tool_calling_iterations=-1)
    source, engine, metrics = make_source(
        tool_tok, lambda context: call("add", '{"a":1,"b":2}') + "</s>", tools=[add], max_iterations=0
    )
    round_ = source.sample(4, step=0)
    assert tool_tok.decode(round_.prompt_ids[0]).startswith("T:add(a,b)\n")  # the tools are in the prompt
    assert metrics["tools/call_frequency"] == [0.0] and metrics["tools/turns_mean"] == [1.0]  # none ran


# ---------------------------------------------------------------------------------------------------------------------
# E. no reward source
# ---------------------------------------------------------------------------------------------------------------------
def test_an_environment_without_any_reward_source_is_told_about_get_reward(tmp_path, tool_tok):
    with pytest.raises(ValueError) as caught:
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            args=tiny_args(tmp_path),
            train_dataset=None,
            processing_class=tool_tok,
            environment_factory=Quiet,
        )
    message = str(caught.value)
    assert "get_reward" in message and "no train_dataset" in message and "was given without" not in message


# ---------------------------------------------------------------------------------------------------------------------
# F. construction-time calls of user code
# ---------------------------------------------------------------------------------------------------------------------
class Offline(Counter):
    def reset(self, **row):
        raise RuntimeError("database offline")


def test_a_failing_trial_reset_says_where_and_keeps_the_cause(tmp_path, tool_tok):
    with pytest.raises(RuntimeError) as caught:
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            args=tiny_args(tmp_path),
            train_dataset=prompts_dataset(),
            processing_class=tool_tok,
            environment_factory=Offline,
        )
    message = str(caught.value)
    assert "Offline.reset(**row) raised RuntimeError: database offline" in message
    assert "construction-time check" in message and "trial reset" in message and "['prompt']" in message
    assert str(caught.value.__cause__) == "database offline"


class Numeric(Counter):
    def reset(self, **row):
        return 42


def test_a_reset_returning_neither_text_nor_none_is_refused_at_construction(tmp_path, tool_tok):
    """TRL's contract is `reset(**row) -> str | None`; 42 used to be appended to the prompt as "42" without a word."""
    with pytest.raises(TypeError) as caught:
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            args=tiny_args(tmp_path),
            train_dataset=prompts_dataset(),
            processing_class=tool_tok,
            environment_factory=Numeric,
        )
    message = str(caught.value)
    assert message.startswith("environment_factory, in TRAPOTrainer's construction-time trial reset: Numeric.reset")
    assert "returned int (42); it must return the text to append to the prompt (str) or None" in message
    assert check_observation("seen: 3", Numeric()) == "seen: 3" and check_observation(None, Numeric()) is None


def test_a_reward_function_failing_on_empty_completions_says_where_and_keeps_the_cause(tmp_path, tool_tok):
    def first_char(completions, **kwargs):
        return [float(c[-1]["content"][0] == "3") for c in completions]  # IndexError on an empty completion

    with pytest.raises(RuntimeError) as caught:
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            reward_funcs=first_char,
            args=tiny_args(tmp_path),
            train_dataset=prompts_dataset(),
            processing_class=tool_tok,
            tools=[add],
        )
    message = str(caught.value)
    assert "construction-time check" in message and "empty completions" in message and "'first_char'" in message
    assert isinstance(caught.value.__cause__, IndexError)


# ---------------------------------------------------------------------------------------------------------------------
# H. malformed tool-call traces
# ---------------------------------------------------------------------------------------------------------------------
def with_call(calls, tools=None) -> Dataset:
    """Row 0 a plain exchange, row 1 a trace whose first assistant turn makes `calls`."""
    messages = trace()
    messages[2] = {"role": "assistant", "content": "", "tool_calls": calls}
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    rows = [{"messages": plain}, {"messages": messages}]
    if tools is not None:
        rows = [{**rows[0], "tools": SCHEMAS}, {**rows[1], "tools": tools}]
    return Dataset.from_list(rows)


def function_call(name, arguments):
    return [{"type": "function", "function": {"name": name, "arguments": arguments}}]


SCHEMAS = json.dumps([get_json_schema(add)])


@pytest.mark.parametrize("assistant_only_loss", [True, False])
@pytest.mark.parametrize(
    ("dataset", "needles"),
    [
        (lambda: with_call(function_call("add", '{"a": 2,'), SCHEMAS), ("`arguments`", "does not parse as JSON")),
        (lambda: with_call(function_call("mul", '{"a": 2}'), SCHEMAS), ("calls `mul`", "not among the row's `tools`")),
        (lambda: with_call({"name": "add"}), ("`tool_calls`", "a dict where a list of calls belongs")),
        (lambda: with_call([{"type": "function", "function": {"arguments": "{}"}}]), ("without a string `name`",)),
        (lambda: with_call(function_call("add", "{}"), "[{not json"), ("`tools`", "JSON string does not parse")),
    ],
)
def test_malformed_tool_call_traces_are_refused_at_construction(
    tool_tok, tmp_path, dataset, needles, assistant_only_loss
):
    with pytest.raises(ValueError) as caught:
        make_trainer(tool_tok, tmp_path, dataset(), assistant_only_loss=assistant_only_loss)
    message = str(caught.value)
    assert "`sft_dataset` row 1" in message and all(n in message for n in needles), message


def test_the_tools_column_is_rendered_without_assistant_only_loss_too(tool_tok):
    """TRL's SFTTrainer renders a row's `tools` for every conversational row; the last-turn path dropped them."""
    rows = Dataset.from_list([{"messages": trace(), "tools": SCHEMAS}])
    out = tokenize_sft_dataset(rows, tool_tok, 256)[0]
    assert tool_tok.decode(out["input_ids"]).startswith("T:add(a,b)\n")


# ---------------------------------------------------------------------------------------------------------------------
# A sibling: the trainer closes its rollout source when train() ends; the tool runner must start again
# ---------------------------------------------------------------------------------------------------------------------
def test_the_tool_runner_runs_tools_again_after_close():
    """Was: every call after `close` failed with 'cannot schedule new futures after shutdown' (a second `train()`, or
    a round sampled after training, had all its tool calls counted as failures)."""
    from trl_trapo.agents import ToolCall, ToolRunner

    async def twice(x: int) -> int:
        return 2 * x

    turns = [[ToolCall("add", {"a": 1, "b": 2}, add)], [ToolCall("twice", {"x": 3}, twice)]]
    runner = ToolRunner(2)
    assert runner.run(turns) == [[(3, False)], [(6, False)]]
    runner.close()
    assert runner.run(turns) == [[(3, False)], [(6, False)]]
    runner.close()


# ---------------------------------------------------------------------------------------------------------------------
# Tool calls: a turn's calls run in the order written, a call cut by the budget never runs, a raising tool is shown
# ---------------------------------------------------------------------------------------------------------------------
class Locker:
    """A stateful environment: `store` is slow, `fetch` reads what `store` wrote (TRL's environments are stateful)."""

    def reset(self, **row):
        self.value = None

    def store(self, value: int) -> str:
        """Store a value (slowly).

        Args:
            value: The value to store.
        """
        time.sleep(0.2)
        self.value = value
        return "stored"

    def fetch(self) -> str:
        """Fetch the stored value."""
        return str(self.value)


class AsyncLocker:
    """`Locker` with async tools (TRL 1.16 gathers a turn's async calls, so `fetch` ran while `store` slept)."""

    def reset(self, **row):
        self.value = None

    async def store(self, value: int) -> str:
        """Store a value (slowly).

        Args:
            value: The value to store.
        """
        await asyncio.sleep(0.2)
        self.value = value
        return "stored"

    async def fetch(self) -> str:
        """Fetch the stored value."""
        return str(self.value)


@pytest.mark.parametrize("environment", [Locker, AsyncLocker], ids=["sync", "async"])
def test_a_turns_tool_calls_run_in_the_order_written_and_rollouts_still_run_concurrently(tool_tok, environment):
    """Was: every call of a round was submitted at once, so `fetch` ran before `store` had finished and read None."""

    def script(context):
        row = int(context.split("add ")[1][0])
        if "t:" in context:
            return "done</s>"
        return call("store", f'{{"value":{row + 7}}}') + call("fetch", "{}") + "</s>"

    seen = {}

    def reads(completions, **kwargs):
        seen["completions"] = completions
        return [0.0] * len(completions)

    source, _, metrics = make_source(
        tool_tok,
        script,
        environment_factory=environment,
        rewards=[reads],
        dataset=prompts_dataset(2),
        group=4,
        response_length=160,
    )
    start = time.perf_counter()
    source.sample(8, step=0)
    seconds = time.perf_counter() - start
    source.close()
    results = [[m["content"] for m in completion if m["role"] == "tool"] for completion in seen["completions"]]
    assert results == [["stored", "7"]] * 4 + [["stored", "8"]] * 4
    assert metrics["tools/call_frequency"] == [2.0] and metrics["tools/failure_frequency"] == [0.0]
    assert seconds < 8 * 0.2 / 2, seconds  # 8 rollouts' `store`s one after another would take 1.6 s


class Wallet:
    """A tool with an effect: how often `pay` ran."""

    payments = 0

    @staticmethod
    def pay(amount: int) -> str:
        """Pay an amount.

        Args:
            amount: How much to pay.
        """
        Wallet.payments += 1
        return "paid"


PAY = call("pay", '{"amount":5}')


@pytest.mark.parametrize(
    "turn, cut, truncated",
    [
        (PAY + "</s>", len(PAY) - len("</c>"), 1.0),  # in the closing tag: the parser takes the call for complete
        (PAY + "</s>", len(PAY) - len("5}}</c>"), 1.0),  # in the arguments: unparsable, was a failed call
        (PAY + "</s>", len(PAY), 1.0),  # after the call, before the turn's end: no result can follow
        ("the answer is 5</s>", len("the answer"), 0.0),  # cut text: no tool call to count
    ],
    ids=["unclosed_tag", "in_the_arguments", "before_the_eos", "plain_text"],
)
def test_a_tool_call_cut_off_by_the_budget_is_never_run_and_counted_as_truncated(
    tool_tok, caplog, turn, cut, truncated
):
    """Was: transformers' parser reads `<c>{...}` without `</c>` as a complete call, and the loop ran it (a payment
    made), then rolled its result back for want of room."""
    Wallet.payments = 0
    source, engine, metrics = make_source(tool_tok, lambda c: turn, tools=[Wallet.pay], response_length=cut)
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        round_ = source.sample(2, step=0)
        source.sample(2, step=1)
    assert Wallet.payments == 0
    assert len(engine.calls) == 2  # one turn per round: the rollouts ended at the cut
    assert [c.tolist() for c in round_.completion_ids] == [ids(tool_tok, turn)[:cut]] * 2  # what the model wrote, kept
    assert metrics["tools/truncated_frequency"] == [truncated] * 2
    assert metrics["tools/call_frequency"] == [0.0] * 2 and metrics["tools/failure_frequency"] == [0.0] * 2
    assert metrics["tools/rollback_frequency"] == [0.0] * 2
    warnings = [r.getMessage() for r in caplog.records if "cut by the length limit" in r.getMessage()]
    assert len(warnings) == int(truncated)  # once per run
    if warnings:
        assert f"response_length={cut} is the limit" in warnings[0] and "not run" in warnings[0]


def also_broken(text: str) -> str:
    """Always fails, differently.

    Args:
        text: Ignored.
    """
    raise KeyError(text)


def test_the_first_failure_of_each_tool_is_warned_once_with_its_exception_and_arguments(tool_tok, caplog):
    """Was: only `tools/failure_frequency` moved; the exception appeared nowhere."""
    turns = [call("broken", '{"x":1}'), call("also_broken", '{"text":"abc"}'), call("nowhere", "{}")]

    def script(context):
        row = int(context.split("add ")[1][0])
        return "done</s>" if "t:" in context else turns[row] + "</s>"

    source, _, metrics = make_source(
        tool_tok, script, tools=[add, broken, also_broken], dataset=prompts_dataset(3), group=2, response_length=120
    )
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        source.sample(6, step=0)
        source.sample(6, step=1)
    source.close()
    assert metrics["tools/failure_frequency"] == [1.0, 1.0]  # 6 failed calls of 6, in each round
    warnings = [r for r in caplog.records if r.getMessage().startswith("The tool `")]
    assert [r.getMessage().split("`")[1] for r in warnings] == ["broken", "also_broken"]  # one each, 4 failures each
    first, second = (r.getMessage() for r in warnings)
    assert "RuntimeError: the tool broke" in first and "{'x': 1}" in first
    assert "KeyError: 'abc'" in second and "{'text': 'abc'}" in second
    assert warnings[0].exc_info is not None  # the traceback, to find the line that raised
    assert not [r for r in caplog.records if "nowhere" in r.getMessage()]  # the model's error, not a tool's


def test_a_turn_the_parser_refuses_reaches_the_reward_functions_as_plain_text(tool_tok):
    """Was: with no call run after it (the last turn, `max_tool_calling_iterations` spent), the loop's internal
    `unparsable` marker stayed in the assistant message the reward functions got."""
    seen = {}

    def reads(completions, **kwargs):
        seen["completions"] = completions
        return [0.0] * len(completions)

    source, _, metrics = make_source(
        tool_tok, lambda c: '<c>{"name":"add","argu</c></s>', tools=[add], rewards=[reads], max_iterations=0
    )
    source.sample(2, step=0)
    assert seen["completions"][0] == [{"role": "assistant", "content": '<c>{"name":"add","argu</c>'}]
    assert metrics["tools/call_frequency"] == [0.0]


def test_a_turn_ends_at_the_configured_stop_token_and_no_stop_token_is_refused(tmp_path, tool_tok):
    """The turn's end is judged by the ids generation stops at (the trainer's `stop_token_id` here, not the EOS)."""
    stop = ids(tool_tok, "#")[0]
    trainer = TRAPOTrainer(
        build_tiny_model(tool_tok, seed=0),
        reward_funcs=zero,
        args=tiny_args(tmp_path, stop_token_id=stop),
        train_dataset=prompts_dataset(),
        processing_class=tool_tok,
        tools=[add],
    )
    assert trainer.rollout_source.stop_token_ids == {stop}
    Wallet.payments = 0
    source, _, metrics = make_source(
        tool_tok, lambda c: PAY + "#", tools=[Wallet.pay], max_iterations=0, stop_token_ids=[stop]
    )
    source.sample(2, step=0)
    assert metrics["tools/truncated_frequency"] == [0.0]  # ended at `#`: not cut (with the EOS as the stop: cut)
    with pytest.raises(ValueError, match="stop_token_ids is empty"):
        make_source(tool_tok, lambda c: "x</s>", tools=[add], stop_token_ids=[])


def test_a_row_offering_a_tool_no_function_implements_is_warned_about(caplog):
    """A row's `tools` schema for `divide` with tools=[add] trained without a word; a call to it could only fail
    (trial 5, W43). A schema that `tools=` implements gives no warning."""
    from trl_trapo.agents import AgentSpec

    def divide(a: int, b: int) -> int:
        """Divide.

        Args:
            a: The dividend.
            b: The divisor.
        """
        return a // b

    spec = AgentSpec.build([add], None)
    rows = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": "x"}]] * 3, "tools": [json.dumps([get_json_schema(divide)])] * 3}
    )
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        spec.check_dataset(rows, max_steps=-1)
    assert "3 rows of `train_dataset` offer tool 'divide' in their `tools` column (first at row 0)" in caplog.text
    assert "they have ['add']" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        spec.check_dataset(rows.map(lambda row: {"tools": json.dumps([get_json_schema(add)])}), max_steps=-1)
    assert "offer tool" not in caplog.text


def test_an_environments_column_is_refused_in_an_environment_factory_run(tmp_path, tool_tok):
    """Trial 9's RW03 for the keyword an environment_factory run adds: reward functions (here the environment's
    `get_reward`) get `environments`, so a dataset column of that name would be replaced (or collide)."""
    with pytest.raises(ValueError, match=r"`train_dataset` column 'environments' is named like an argument .*"):
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            args=tiny_args(tmp_path),
            train_dataset=prompts_dataset(4, environments=["a", "b", "c", "d"]),
            processing_class=tool_tok,
            environment_factory=Counter,
        )


# ---------------------------------------------------------------------------------------------------------------------
# An environment's get_reward() failing is the environment's method, not a reward function (trial 12's N41)
# ---------------------------------------------------------------------------------------------------------------------
class JudgedEnvironment:
    """An environment scored by an LLM judge in `get_reward()`; `value` / `error` say what the judge gives."""

    value: object = 1.0
    error: Exception | None = None

    def reset(self, **row) -> None:
        return None

    def get_reward(self):
        if self.error is not None:
            raise self.error
        return self.value


class AsyncJudgedEnvironment(JudgedEnvironment):
    async def get_reward(self):
        return JudgedEnvironment.get_reward(self)


@pytest.mark.parametrize("environment", [JudgedEnvironment, AsyncJudgedEnvironment], ids=["sync", "async"])
def test_a_get_reward_that_raises_is_reported_as_the_environments_method(tool_tok, monkeypatch, environment):
    """Was: "Reward function 'JudgedEnvironment' raised RuntimeError ... Reward functions are called as
    func(prompts=..., ...)": a lecture about a reward function the user never wrote."""
    judge = RuntimeError("judge timed out")
    monkeypatch.setattr(JudgedEnvironment, "error", judge)
    source, _, _ = make_source(tool_tok, lambda context: "done</s>", environment_factory=environment, rewards=[zero])
    with pytest.raises(RuntimeError) as raised:
        source.sample(2, step=0)
    source.close()
    name = environment.__name__
    assert type(raised.value).__name__ == "EnvironmentRewardError"
    assert str(raised.value).startswith(
        f"environment {name}: get_reward() raised RuntimeError: judge timed out (rollout 0 of 2, after its last turn)"
    )
    assert "return None from get_reward()" in str(raised.value)
    assert "Reward function" not in str(raised.value) and "func(prompts=" not in str(raised.value)
    assert raised.value.__cause__ is judge  # the user's exception, chained


@pytest.mark.parametrize(
    "value, shown", [("1.0", "'1.0' (str)"), ([1.0], "[1.0] (list)"), (float("inf"), "inf (float)")]
)
def test_a_get_reward_returning_no_number_is_named_with_its_value(tool_tok, monkeypatch, value, shown):
    monkeypatch.setattr(JudgedEnvironment, "value", value)
    source, _, _ = make_source(
        tool_tok, lambda context: "done</s>", environment_factory=JudgedEnvironment, rewards=[zero]
    )
    with pytest.raises(RuntimeError) as raised:
        source.sample(2, step=0)
    source.close()
    assert str(raised.value).startswith(
        f"environment JudgedEnvironment: get_reward() returned {shown} for rollout 0 of 2: it must return one finite "
        "number (int, float or bool, as TRL's GRPOTrainer accepts) for its rollout, or None for no reward."
    )
    assert "Reward function" not in str(raised.value)


def test_none_from_get_reward_is_no_reward_and_numbers_pass(tool_tok, monkeypatch):
    monkeypatch.setattr(JudgedEnvironment, "value", None)
    source, _, _ = make_source(
        tool_tok, lambda context: "done</s>", environment_factory=JudgedEnvironment, rewards=[zero]
    )
    none = source.sample(2, step=0)
    monkeypatch.setattr(JudgedEnvironment, "value", True)
    true = source.sample(2, step=0)
    source.close()
    assert none.per_func[:, 1].isnan().all() and true.per_func[:, 1].tolist() == [1.0, 1.0]


def test_a_get_reward_failing_in_the_construction_check_says_so(tmp_path, tool_tok, monkeypatch):
    monkeypatch.setattr(JudgedEnvironment, "error", KeyError("score"))
    with pytest.raises(RuntimeError) as raised:
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            reward_funcs=zero,
            args=tiny_args(tmp_path),
            train_dataset=prompts_dataset(),
            processing_class=tool_tok,
            environment_factory=JudgedEnvironment,
        )
    message = str(raised.value)
    assert message.startswith(
        "In TRAPOTrainer's construction-time check (each environment's get_reward() is called once on fresh "
        "instances reset with the first 2 row(s) of `train_dataset`, before any tool call and before anything slow), "
        "environment JudgedEnvironment: get_reward() raised KeyError: 'score'"
    )
    assert "no tool was called on" in message and "reward function" not in message.lower()
    assert isinstance(raised.value.__cause__, KeyError)


# ---------------------------------------------------------------------------------------------------------------------
# An environment's public helper method (trial 12's N50)
# ---------------------------------------------------------------------------------------------------------------------
class WithHelper:
    def reset(self, **row) -> None:
        self.state = self.normalize(" x ")

    def normalize(self, s):
        return s.strip()

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a * b


class WithPrivateHelper(WithHelper):
    normalize = None  # the helper under its private name only

    def reset(self, **row) -> None:
        self.state = self._normalize(" x ")

    def _normalize(self, s):
        return s.strip()


def test_a_public_helper_method_is_told_trls_rule_and_how_to_keep_it_private():
    """Was: "the tool normalize has no usable schema ... Give it type hints ... and a docstring": the only fix
    offered exposed the helper to the model."""
    from trl_trapo.agents import AgentSpec

    with pytest.raises(ValueError) as raised:
        AgentSpec.build(None, WithHelper)
    message = str(raised.value)
    assert message.startswith(
        "environment_factory (WithHelper): `normalize` is a public method of the environment WithHelper, so it is a "
        "tool the model may call (TRL's rule: every public method other than `reset` and `get_reward` is one)"
    )
    assert "rename it `_normalize` (and its uses)" in message and "give it type hints" in message
    spec = AgentSpec.build(None, WithPrivateHelper)  # the fix: only `multiply` is a tool
    assert [s["function"]["name"] for s in spec.schemas[None]] == ["multiply"]


def test_a_standalone_tool_without_a_schema_keeps_the_tools_message():
    from trl_trapo.agents import AgentSpec

    def loose(s):
        return s

    with pytest.raises(ValueError, match=r"^tools: the tool `loose` has no usable schema .* Give it type hints"):
        AgentSpec.build([loose], None)


# ---------------------------------------------------------------------------------------------------------------------
# Tool signatures a call by keyword can or cannot fill (trial 12's N01)
# ---------------------------------------------------------------------------------------------------------------------
def add_all(*args: int) -> int:
    """Add integers.

    Args:
        args: The integers.
    """
    return sum(args)


def first_of(a: int, /) -> int:
    """Return a.

    Args:
        a: Returned.
    """
    return a


def scaled(a: int, *, factor: int = 2) -> int:
    """Scale a.

    Args:
        a: The integer.
        factor: The factor.
    """
    return a * factor


def tagged(a: int, **kwargs: str) -> str:
    """Tag a.

    Args:
        a: The integer.
        kwargs: The tags.
    """
    return f"{a}{sorted(kwargs.items())}"


@pytest.mark.parametrize(
    "tool, message",
    [
        (add_all, "tools: the tool `add_all` takes `*args`, which a tool call can never fill"),
        (first_of, "tools: the tool `first_of` takes `a` as a positional-only parameter (before `/`)"),
    ],
)
def test_a_tool_whose_parameters_no_call_can_fill_is_refused_naming_it(tool, message):
    """Was: `*args` was accepted (transformers' schema made `args` a required integer) and every call failed with
    "got an unexpected keyword argument 'args'"."""
    from trl_trapo.agents import AgentSpec

    with pytest.raises(ValueError) as raised:
        AgentSpec.build([tool], None)
    assert str(raised.value).startswith(message)
    if tool is add_all:
        assert "`numbers: list[int]`" in str(raised.value)


def test_keyword_only_and_kwargs_tools_are_called_by_keyword(tool_tok, caplog):
    """A call passes its JSON arguments by keyword: keyword-only parameters and `**kwargs` receive them."""
    calls = [call("scaled", '{"a":3,"factor":5}'), call("tagged", '{"a":1,"kwargs":"x"}')]

    def script(context):
        return "done</s>" if "t:" in context else calls[int(context.split("add ")[1][0])] + "</s>"

    seen = {}

    def reads(completions, **kwargs):
        seen["completions"] = completions
        return [0.0] * len(completions)

    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        source, _, metrics = make_source(
            tool_tok,
            script,
            tools=[scaled, tagged],
            rewards=[reads],
            dataset=prompts_dataset(2),
            group=1,
            response_length=120,
        )
    source.sample(2, step=0)
    source.close()
    assert metrics["tools/failure_frequency"] == [0.0]
    results = [[m["content"] for m in c if m["role"] == "tool"] for c in seen["completions"]]
    assert results == [["15"], ["1[('kwargs', 'x')]"]]
    warned = [r.getMessage() for r in caplog.records if "`**kwargs`" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("tools: the tool `tagged` takes `**kwargs`")
