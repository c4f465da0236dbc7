# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The multi-turn tool-calling source (trl_trapo/agents.py): TRL's `tools=` / `environment_factory=` contract.

Most tests drive [`ToolRolloutSource`] with a scripted engine: it answers each turn with token ids a script writes
from the decoded context (the tiny random model would never call a tool), through the same loop the trainer runs.
Two tests train the real tiny model with `TRAPOTrainer(tools=[...]).train()` for 2 steps.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import add, make_tiny_config, tool_tokenizer
from datasets import Dataset

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.agents import (
    AgentSpec,
    ToolRolloutSource,
    tool_suffix_ids,
    warn_no_tool_rounds,
)
from trl_trapo.rewards import RewardScorer
from trl_trapo.sources import SampledRound
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model


ROOT = Path(__file__).resolve().parent.parent
LOGP = -0.5  # the scripted engine's behaviour log-prob of every token it "samples"


def echo(text: str) -> str:
    """Return the text.

    Args:
        text: Any text.
    """
    return text


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Ignored.
    """
    raise RuntimeError("the tool broke")


def nap(x: int) -> int:
    """Sleep 0.2 s, then return x.

    Args:
        x: Returned.
    """
    time.sleep(0.2)
    return x


async def async_nap(x: int) -> int:
    """Sleep 0.2 s without blocking, then return x.

    Args:
        x: Returned.
    """
    await asyncio.sleep(0.2)
    return x


def call(name: str, arguments: str) -> str:
    """An assistant turn calling one tool, as the compact template writes it (before the EOS)."""
    return f'<c>{{"name":"{name}","arguments":{arguments}}}</c>'


def ids(tok, text: str) -> list[int]:
    """Token ids of `text` (`</s>` is the EOS token)."""
    return tok(text, add_special_tokens=False)["input_ids"]


class ScriptedEngine:
    """Stands in for `RolloutEngine.sample`: each row's turn is `script(decoded context)` (token ids), cut to
    `max_new_tokens`; every token's behaviour log-prob is `LOGP`. Records every call's contexts."""

    def __init__(self, tok, script):
        self.tok, self.script = tok, script
        self.calls: list[list[list[int]]] = []
        self.max_new_tokens: list[int] = []

    def sample(self, examples, group, step, temperature, max_new_tokens=None):
        contexts = [list(e["prompt_ids"]) for e in examples]
        self.calls.append(contexts)
        self.max_new_tokens.append(max_new_tokens)
        turns = []
        for context in contexts:
            turn = self.script(self.tok.decode(context))
            turns.append(turn if isinstance(turn, list) else ids(self.tok, turn))
        turns = [t[:max_new_tokens] for t in turns]
        return SampledRound(
            [{"prompt_ids": c} for c in contexts],
            turns,
            version=step,
            old_per_token_logps=[torch.full((len(t),), LOGP) for t in turns],
            prompt_ids=contexts,
        )


class FirstPrompts:
    """The memory pool's `select_prompts`: the first `n` rows; `rollout_temperature`: the configured one."""

    def select_prompts(self, n, step):
        return list(range(n))

    def rollout_temperature(self, default):
        return default


class Metrics(dict):
    def log(self, name, value):
        self.setdefault(name, []).append(value)


def prompts_dataset(n=4, **columns):
    rows = {"prompt": [[{"role": "user", "content": f"add {i} 1="}] for i in range(n)]}
    rows.update({k: list(v) for k, v in columns.items()})
    return Dataset.from_dict(rows)


def make_source(tok, script, tools=(), environment_factory=None, dataset=None, rewards=(), group=2, **kwargs):
    metrics = Metrics()
    spec = AgentSpec.build(list(tools), environment_factory)
    funcs = list(rewards) + spec.rewards
    scorer = RewardScorer(
        funcs or [lambda completions, **kw: [0.0] * len(completions)],
        [None] * max(len(funcs), 1),
        [1.0] * max(len(funcs), 1),
        tok,
        8,
        log_metric=lambda name, value: None,
        log_extra=lambda column, values: None,
        trainer_state=lambda: None,
    )
    settings = dict(
        group=group,
        num_mini_batches=1,
        temperature=1.0,
        response_length=96,
        context=256,
        max_iterations=4,
        log_metric=metrics.log,
    )
    settings.update(kwargs)
    engine = ScriptedEngine(tok, script)
    source = ToolRolloutSource(
        engine, dataset if dataset is not None else prompts_dataset(), FirstPrompts(), spec, tok, scorer, **settings
    )
    return source, engine, metrics


def tiny_args(output_dir, **overrides) -> TRAPOConfig:
    """`TINY_CONFIG` with room for a tool call, its result and an answer: 2 steps, prompts of up to 40 tokens,
    48-token responses; then `overrides`."""
    return make_tiny_config(
        output_dir, **{"max_steps": 2, "max_prompt_length": 40, "response_length": 48, **overrides}
    )


# ---------------------------------------------------------------------------------------------------------------------
# The template
# ---------------------------------------------------------------------------------------------------------------------
def test_the_compact_template_renders_a_whole_exchange_within_128_characters(tool_tok):
    messages = [
        {"role": "user", "content": "add 2 3="},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    text = tool_tok.apply_chat_template(messages, tools=[add], tokenize=False)
    assert text == 'T:add(a,b)\nu:add 2 3=\na:<c>{"name":"add","arguments":{"a":2,"b":3}}</c></s>t:5\na:5</s>'
    assert len(ids(tool_tok, text)) <= 128
    parsed = tool_tok.parse_response(ids(tool_tok, call("add", '{"a":2,"b":3}') + "</s>"), prefix=ids(tool_tok, "a:"))
    assert parsed["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}


def test_trl_grpo_trainer_accepts_the_compact_template(tmp_path, tool_tok):
    from trl import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(
        build_tiny_model(tool_tok, seed=0),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=16,
            report_to="none",
            use_cpu=True,
            bf16=False,
        ),
        train_dataset=prompts_dataset(),
        processing_class=tool_tok,
        tools=[add],
    )
    assert trainer.tools == [add]


# ---------------------------------------------------------------------------------------------------------------------
# Token-level correctness
# ---------------------------------------------------------------------------------------------------------------------
def test_turns_are_joined_as_token_ids_never_retokenized(tool_tok):
    # the model spells `</s>` as four characters inside an argument: decoding and re-encoding would make them the
    # one EOS token (TRL issue #5224, a retokenised prefix drifts)
    first = ids(tool_tok, '<c>{"name":"echo","arguments":{"text":"') + ids(tool_tok, "<") + ids(tool_tok, "/s>")
    first += ids(tool_tok, '"}}</c></s>')
    assert ids(tool_tok, tool_tok.decode(first)) != first
    final = ids(tool_tok, "ok</s>")
    source, engine, _ = make_source(tool_tok, lambda c: final if "t:" in c else first, tools=[echo], group=1)
    round_ = source.sample(1, step=3)
    suffix = tool_suffix_ids(tool_tok, [{"role": "tool", "name": "echo", "content": "</s>"}])
    completion = round_.completion_ids[0].tolist()
    assert completion == first + suffix + final
    assert engine.calls[1][0] == round_.prompt_ids[0].tolist() + first + suffix  # the second turn's context
    assert round_.version == 3


def test_tool_tokens_are_masked_and_carry_no_behaviour_logprob(tool_tok):
    first, final = ids(tool_tok, call("add", '{"a":1,"b":2}') + "</s>"), ids(tool_tok, "3</s>")
    source, _, metrics = make_source(tool_tok, lambda c: final if "t:" in c else first, tools=[add])
    round_ = source.sample(2, step=0)
    suffix = tool_suffix_ids(tool_tok, [{"role": "tool", "name": "add", "content": "3"}])
    assert tool_tok.decode(suffix) == "t:3\na:"
    expected_mask = [1] * len(first) + [0] * len(suffix) + [1] * len(final)
    for mask, logps in zip(round_.completion_mask, round_.old_per_token_logps):
        assert mask.tolist() == expected_mask
        assert logps.tolist() == [LOGP if m else 0.0 for m in expected_mask]
    assert metrics["tools/call_frequency"] == [1.0] and metrics["tools/turns_mean"] == [2.0]
    assert metrics["tools/failure_frequency"] == [0.0]
    assert metrics["tools/rollback_frequency"] == [0.0]  # every result fitted


def test_a_tool_result_past_the_budget_is_rolled_back_counted_and_warned_once(tool_tok, caplog):
    first = ids(tool_tok, call("echo", '{"text":"' + "x" * 30 + '"}') + "</s>")
    source, engine, metrics = make_source(
        tool_tok, lambda c: "never</s>" if "t:" in c else first, tools=[echo], response_length=len(first) + 20
    )
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        round_ = source.sample(2, step=0)
        source.sample(2, step=1)
    for completion, mask in zip(round_.completion_ids, round_.completion_mask):
        assert completion.tolist() == first  # ends with the call as the model wrote it, no tool tokens
        assert mask.tolist() == [1] * len(first)
    assert len(engine.calls) == 2  # one turn per round
    assert metrics["tools/call_frequency"] == [1.0, 1.0]
    assert metrics["tools/rollback_frequency"] == [1.0, 1.0]  # every rollout of both rounds
    warnings = [r.getMessage() for r in caplog.records if "rolled back" in r.getMessage()]
    assert len(warnings) == 1  # once per run, not once per rollout or round
    suffix = len(tool_suffix_ids(tool_tok, [{"role": "tool", "name": "echo", "content": "x" * 30}]))
    assert f"A tool result of {suffix} tokens" in warnings[0]
    assert f"response_length={len(first) + 20} is the limit" in warnings[0]
    assert f"Raise TRAPOConfig.response_length above {len(first) + suffix}" in warnings[0]


def test_a_tool_result_past_the_context_is_rolled_back_and_the_warning_says_response_length_cannot_help(
    tool_tok, caplog
):
    first = ids(tool_tok, call("echo", '{"text":"' + "x" * 30 + '"}') + "</s>")
    source, _, metrics = make_source(
        tool_tok, lambda c: "never</s>" if "t:" in c else first, tools=[echo], response_length=200, context=120
    )
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        round_ = source.sample(2, step=0)
    assert round_.completion_ids[0].tolist() == first
    assert metrics["tools/rollback_frequency"] == [1.0]
    (warning,) = [r.getMessage() for r in caplog.records if "rolled back" in r.getMessage()]
    assert "context of 120 positions is the limit" in warning
    assert "Raising response_length cannot help" in warning and "max_prompt_length" in warning


def test_each_turn_is_limited_to_what_the_budget_leaves(tool_tok):
    first, long_answer = ids(tool_tok, call("add", '{"a":1,"b":2}') + "</s>"), ids(tool_tok, "y" * 200)
    source, engine, _ = make_source(
        tool_tok, lambda c: long_answer if "t:" in c else first, tools=[add], response_length=60
    )
    round_ = source.sample(2, step=0)
    assert all(c.numel() == 60 for c in round_.completion_ids)
    assert engine.max_new_tokens == [60, 60 - len(first) - len(ids(tool_tok, "t:3\na:"))]


def test_failing_unknown_and_unparsable_calls_are_counted_and_the_round_goes_on(tool_tok):
    turns = {
        0: call("broken", '{"x":1}') + "</s>",
        1: call("nowhere", "{}") + "</s>",
        2: '<c>{"name":"add","argu</c></s>',
    }

    def script(context):
        row = int(context.split("add ")[1][0])
        return "done</s>" if "t:" in context else turns[row]

    source, engine, metrics = make_source(tool_tok, script, tools=[add, broken], dataset=prompts_dataset(3), group=1)
    round_ = source.sample(3, step=0)
    texts = [tool_tok.decode(c) for c in round_.completion_ids]
    assert "t:{'error': 'the tool broke'}\na:done" in texts[0]
    assert "t:{'error': 'Tool nowhere not found.'}\na:done" in texts[1]
    assert "t:{'error': 'unparsable tool call'}" in texts[2] and texts[2].endswith("a:done</s>")
    assert len(engine.calls) == 2  # every rollout got its next turn
    assert metrics["tools/call_frequency"] == [1.0] and metrics["tools/failure_frequency"] == [1.0]


def test_a_call_that_is_not_an_object_with_a_name_fails_and_the_round_goes_on(tool_tok):
    """JSON the parser accepts between the call markers but that names no tool (a string, a number, a list, an object
    whose `name` is not text) is a failed call with a short error, not a crash of the round (found by the built-in
    agent task's evaluation: a trained model wrote `<c>"..."</c>` once the tool was withheld)."""
    turns = {
        0: '<c>"abc"</c></s>',
        1: "<c>7</c></s>",
        2: "<c>[1,2]</c></s>",
        3: '<c>{"name":3,"arguments":{}}</c></s>',
    }

    def script(context):
        row = int(context.split("add ")[1][0])
        return "done</s>" if "t:" in context else turns[row]

    source, engine, metrics = make_source(
        tool_tok, script, tools=[add], dataset=prompts_dataset(4), group=1, response_length=160
    )
    round_ = source.sample(4, step=0)
    error = "t:{'error': 'a tool call must be a JSON object with a string `name`'}\na:done</s>"
    assert [tool_tok.decode(c)[-len(error) :] for c in round_.completion_ids] == [error] * 4
    assert len(engine.calls) == 2  # every rollout got its next turn
    assert metrics["tools/call_frequency"] == [1.0] and metrics["tools/failure_frequency"] == [1.0]


def test_tool_calls_stop_after_max_tool_calling_iterations(tool_tok):
    turn = ids(tool_tok, call("add", '{"a":1,"b":1}') + "</s>")
    source, engine, metrics = make_source(tool_tok, lambda c: turn, tools=[add], max_iterations=2, response_length=200)
    round_ = source.sample(2, step=0)
    assert len(engine.calls) == 3 and metrics["tools/turns_mean"] == [3.0]
    assert metrics["tools/call_frequency"] == [2.0]
    assert round_.completion_ids[0].tolist()[-len(turn) :] == turn  # the last turn's call is not run


def test_zero_tool_calling_iterations_runs_no_call_as_in_trl_and_says_so(tool_tok, caplog):
    """TRL 1.16 reads 0 as a loop of no rounds: the first turn is the whole rollout and its calls are not run. That
    was accepted here silently (`--max_tool_calling_iterations 0`); the behaviour is TRL's and a warning says it."""
    turn = ids(tool_tok, call("add", '{"a":1,"b":1}') + "</s>")
    warn_no_tool_rounds.cache_clear()  # said once per process (the trainer and evaluation each build a source)
    with caplog.at_level(logging.WARNING, logger="trl_trapo.agents"):
        source, engine, metrics = make_source(
            tool_tok, lambda c: turn, tools=[add], max_iterations=0, response_length=200
        )
        make_source(tool_tok, lambda c: turn, tools=[add], max_iterations=0)
    notices = [r.getMessage() for r in caplog.records if "max_tool_calling_iterations=0" in r.getMessage()]
    assert len(notices) == 1 and "no tool call is run" in notices[0] and "1 or more" in notices[0], notices
    round_ = source.sample(2, step=0)
    assert len(engine.calls) == 1 and metrics["tools/turns_mean"] == [1.0]
    assert round_.completion_ids[0].tolist() == turn  # the call the model wrote, not run
    caplog.clear()
    warn_no_tool_rounds.cache_clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.agents"):
        make_source(tool_tok, lambda c: turn, tools=[add], max_iterations=1)
    assert not any("max_tool_calling_iterations" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------------------------------
# Latency
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tool", [nap, async_nap], ids=["sync", "async"])
def test_the_tool_calls_of_a_round_run_concurrently(tool_tok, tool):
    turn = ids(tool_tok, call(tool.__name__, '{"x":1}') + "</s>")
    source, _, metrics = make_source(
        tool_tok,
        lambda c: turn,
        tools=[tool],
        group=8,
        max_iterations=2,
        response_length=200,
        dataset=prompts_dataset(1),
    )
    start = time.perf_counter()
    source.sample(8, step=0)
    seconds = time.perf_counter() - start
    rounds_of_calls = 2
    print(f"8 rollouts x {rounds_of_calls} rounds of 0.2 s {tool.__name__} calls: {seconds:.3f} s")
    assert metrics["tools/call_frequency"] == [2.0]
    assert seconds < 2 * 0.2 * rounds_of_calls  # serial would be 8 * 0.2 * 2 = 3.2 s
    source.close()


# ---------------------------------------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------------------------------------
class Counter:
    """A counter environment: `reset` appends a hint to the prompt, `bump` is its tool, `get_reward` scores it."""

    created = 0

    def __init__(self):
        Counter.created += 1
        self.count = 0
        self.rows = []

    def reset(self, **row):
        self.count = 0
        self.rows.append(row)
        return " (start at 0)"

    def bump(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


def test_environment_factory_resets_each_rollout_and_scores_it(tool_tok):
    seen = {}

    def reads_environments(completions, environments, **kwargs):
        seen["environments"] = environments
        seen["completions"] = completions
        return [0.0] * len(completions)

    def script(context):
        row = int(context.split("add ")[1][0])
        return "done</s>" if "t:" in context else call("bump", f'{{"by":{row + 1}}}') + "</s>"

    Counter.created = 0
    source, _, _ = make_source(
        tool_tok,
        script,
        environment_factory=Counter,
        rewards=[reads_environments],
        dataset=prompts_dataset(2),
        group=2,
    )
    assert Counter.created == 1  # the construction-time probe
    round_ = source.sample(4, step=0)
    environments = seen["environments"]
    assert len({id(e) for e in environments}) == 4 and all(isinstance(e, Counter) for e in environments)
    assert [e.count for e in environments] == [1, 1, 2, 2]  # each rollout called its own instance
    assert [e.rows[-1]["prompt"][0]["content"] for e in environments] == ["add 0 1="] * 2 + ["add 1 1="] * 2
    assert round_.per_func[:, 1].tolist() == [1.0, 1.0, 2.0, 2.0]  # get_reward, named after the class
    assert source.scorer.names[-1] == "Counter"
    assert round_.scores.tolist() == [1.0, 1.0, 2.0, 2.0]
    assert tool_tok.decode(round_.prompt_ids[0]) == "T:bump(by)\nu:add 0 1= (start at 0)\na:"
    assert round_.examples[0]["prompt"][-1]["content"] == "add 0 1= (start at 0)"
    assert [m["role"] for m in seen["completions"][0]] == ["assistant", "tool", "assistant"]
    assert seen["completions"][0][0]["tool_calls"][0]["function"]["name"] == "bump"
    source.sample(4, step=1)  # instances are pooled: a second round creates none
    assert Counter.created == 5


class Quiet:
    """An environment whose `reset` returns nothing and whose tool is `shout`."""

    def reset(self, **row):
        self.row = row

    def shout(self, text: str) -> str:
        """Shout.

        Args:
            text: What to shout.
        """
        return text.upper()


def test_a_dict_environment_factory_routes_rows_by_their_environment_column(tool_tok):
    dataset = prompts_dataset(2, environment=["counter", "quiet"])
    seen = {}

    def reads_environments(environments, **kwargs):
        seen["environments"] = environments
        return [0.0] * len(environments)

    source, _, _ = make_source(
        tool_tok,
        lambda c: "x</s>",
        environment_factory={"counter": Counter, "quiet": Quiet},
        rewards=[reads_environments],
        dataset=dataset,
        group=1,
    )
    round_ = source.sample(2, step=0)
    assert [type(e) for e in seen["environments"]] == [Counter, Quiet]
    assert "environment" not in seen["environments"][1].row  # a control field, not given to reset
    assert tool_tok.decode(round_.prompt_ids[0]).startswith("T:bump(by)\n")
    assert tool_tok.decode(round_.prompt_ids[1]).startswith("T:shout(text)\n")
    assert math.isnan(float(round_.per_func[1, 1]))  # Quiet has no get_reward: no reward from Counter's


# ---------------------------------------------------------------------------------------------------------------------
# Construction refusals
# ---------------------------------------------------------------------------------------------------------------------
def no_hints(a):
    """No hints.

    Args:
        a: Something.
    """
    return a


def no_docstring(a: int) -> int:
    return a


class NoReset:
    def act(self, x: int) -> int:
        """Act.

        Args:
            x: Anything.
        """
        return x


class Adder:
    def __call__(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b


def test_a_partial_or_callable_object_tool_is_refused_naming_the_wrapper_fix():
    """A tool `functools.partial(power, exponent=3)` whose function has hints and a docstring was told to add hints
    and a docstring (trial 8's TL02): a partial has no signature or docstring of its own for transformers'
    `get_json_schema`; the message says so and shows the `def` wrapper. A callable object gets the same fix."""
    import functools

    from trl_trapo.agents import tool_schema

    assert tool_schema(add)["function"]["name"] == "add"  # the function itself has a schema
    with pytest.raises(ValueError, match=r"functools.partial\(add, ...\) has no schema: .* `def add_tool\(x: float\)"):
        tool_schema(functools.partial(add, b=3))
    with pytest.raises(
        ValueError, match=r"\(Adder\) has no usable schema .* reads plain functions and methods\. Wrap"
    ):
        tool_schema(Adder())


def test_every_tool_without_a_schema_is_named_in_one_message():
    """Trial 12's N49 sibling: `tools=[no_hints, add, partial, no_docstring]` was refused at `no_hints`, then at the
    partial after that fix, then at `no_docstring`. Now one message names each, with its own fix; `add` is not."""
    import functools

    from trl_trapo.agents import AgentSpec

    with pytest.raises(ValueError) as caught:
        AgentSpec.build([no_hints, add, functools.partial(add, b=3), no_docstring], None)
    head, *items = str(caught.value).split("\n- ")
    assert head == "tools: 3 tools have no schema the model could be shown, each with its fix:", head
    assert items[0].startswith("the tool `no_hints` has no usable schema") and "type hints" in items[0], items
    assert items[1].startswith("the tool functools.partial(add, ...) has no schema") and "def add_tool" in items[1]
    assert items[2].startswith("the tool `no_docstring` has no usable schema"), items
    assert caught.value.__cause__ is not None  # transformers' own error for the first, for TRAPO_DEBUG=1


@pytest.mark.parametrize(
    "case, message",
    [
        ("no_hints", "`no_hints` has no usable schema"),
        ("no_docstring", "`no_docstring` has no usable schema"),
        ("duplicate", "two tools are named `add`"),
        ("no_reset", "NoReset has no `reset` method"),
        ("dict_without_column", "has no `environment` column"),
        ("plain_template", "cannot express tool calls"),
        ("with_rollout_source", "a rollout_source was given too"),
        ("with_rollout_func", "a rollout_func was given too"),
        ("no_stop_token", "stop_token=None without a stop_token_id"),
        ("no_dataset_no_max_steps", "needs max_steps > 0"),
    ],
)
def test_what_cannot_work_is_refused_at_construction(tmp_path, tool_tok, case, message):
    tokenizer, tools, factory, dataset, overrides, extra = tool_tok, [add], None, prompts_dataset(), {}, {}
    if case == "no_hints":
        tools = [no_hints]
    elif case == "no_docstring":
        tools = [no_docstring]
    elif case == "duplicate":
        tools = [add, add]
    elif case == "no_reset":
        tools, factory = [], NoReset
    elif case == "dict_without_column":
        tools, factory = [], {"counter": Counter}
    elif case == "plain_template":
        tokenizer = build_char_tokenizer()
    elif case == "with_rollout_source":
        extra = {"rollout_source": FirstPromptsSource()}
    elif case == "with_rollout_func":
        extra = {"rollout_func": lambda prompts, trainer: {}}
    elif case == "no_stop_token":  # no turn would end: every call cut off by the length limit
        overrides = {"stop_token": None}
    elif case == "no_dataset_no_max_steps":
        tools, factory, dataset, overrides = [], Counter, None, {"max_steps": -1, "num_train_epochs": 1}
    with pytest.raises(ValueError, match=message):
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=tiny_args(tmp_path, **overrides),
            train_dataset=dataset,
            processing_class=tokenizer,
            tools=tools,
            environment_factory=factory,
            **extra,
        )


class FirstPromptsSource:
    def sample(self, rows_needed, step):
        raise AssertionError("never sampled")


def test_a_template_that_is_not_prefix_preserving_is_refused(tool_tok):
    from trl_trapo.agents import check_chat_template

    tokenizer = tool_tokenizer()
    # the assistant turn's end marker changes once a tool message follows it
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{% endif %}}</c>{% endfor %}</s>", "{% endif %}}</c>{% endfor %}{% if not loop.last %}|{% endif %}</s>"
    )
    with pytest.raises(ValueError, match="not prefix preserving"):
        check_chat_template(tokenizer)


# ---------------------------------------------------------------------------------------------------------------------
# Several processes (tests/test_distributed_jobs.py runs the trainer on two)
# ---------------------------------------------------------------------------------------------------------------------
class ThreadRanks:
    """Ranks as threads: `collective(rank, op, tensor)` is a collective between them (every rank deposits its op and
    tensor, all wait, the tensors are summed). A rank that makes a collective the others do not make is an error here
    (ops that differ, or the barrier broken after `timeout` s) where processes would hang."""

    def __init__(self, n: int, timeout: float = 10.0):
        self.barrier = threading.Barrier(n, timeout=timeout)
        self.slots: list = [None] * n

    def collective(self, rank: int, op: str, tensor: torch.Tensor | None = None) -> torch.Tensor | None:
        self.slots[rank] = (op, tensor)
        self.barrier.wait()
        ops = [slot[0] for slot in self.slots]
        if len(set(ops)) > 1:
            self.barrier.abort()
            raise RuntimeError(f"mismatched collectives: {ops}")
        total = torch.stack([slot[1] for slot in self.slots]).sum(0) if tensor is not None else None
        self.barrier.wait()
        return total


class CollectiveEngine(ScriptedEngine):
    """A scripted engine whose every `sample` is a collective, as generation under ZeRO-3 is (the weights are
    gathered); records the `lockstep` flag of each call."""

    def __init__(self, tok, script, ranks: ThreadRanks, rank: int):
        super().__init__(tok, script)
        self.ranks, self.rank, self.lockstep = ranks, rank, []

    def sample(self, examples, group, step, temperature, max_new_tokens=None, lockstep=False):
        self.lockstep.append(lockstep)
        self.ranks.collective(self.rank, "generate")
        return super().sample(examples, group, step, temperature, max_new_tokens)


def test_ranks_run_the_same_generation_calls_and_log_the_whole_rounds_tool_metrics(tool_tok):
    """Two ranks, one rollout loop each, in threads: rank 0's rollouts answer at once (1 turn), rank 1's call `add`,
    then `broken`, then answer (3 turns); turns are generated in calls of at most 3 rows (4 rollouts: 2 calls). Every
    `engine.sample` is a collective, as under ZeRO-3: rank 0 takes part in rank 1's later turns with throwaway 1-token
    calls (before the fix it made 2 calls to rank 1's 6, the processes hung), all with `lockstep=True`; and both ranks
    log the round's metrics over both ranks' rollouts (failures / calls of the round: 4 / 8, where the mean of the
    ranks' own ratios, 0 and 0.5, is 0.25)."""

    def rank1(context):
        results = context.count("</s>t:")
        return [call("add", '{"a":1,"b":2}'), call("broken", '{"x":1}'), "done"][results] + "</s>"

    ranks = ThreadRanks(2)
    scripts = [lambda context: "ok</s>", rank1]
    sources, engines, metrics = [], [], []
    for rank, script in enumerate(scripts):
        source, _, logged = make_source(
            tool_tok,
            script,
            tools=[add, broken],
            group=2,
            response_length=160,
            sum_over_ranks=lambda tensor, rank=rank: ranks.collective(rank, "sum", tensor),
            generation_batch_size=3,
        )
        source.engine = CollectiveEngine(tool_tok, script, ranks, rank)
        sources.append(source)
        engines.append(source.engine)
        metrics.append(logged)
    rounds, errors = [None, None], []

    def run(rank):
        try:
            rounds[rank] = sources[rank].sample(4, step=0)
        except Exception as error:  # noqa: BLE001 - reported below, with the other rank's
            errors.append(error)
            ranks.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    texts = [[tool_tok.decode(c) for c in round_.completion_ids] for round_ in rounds]
    assert texts[0] == ["ok</s>"] * 4
    ending = "t:3\na:" + call("broken", '{"x":1}') + "</s>t:{'error': 'the tool broke'}\na:done</s>"
    assert all(text.endswith(ending) for text in texts[1]), texts[1]
    # the same 6 calls on both ranks: 3 turns of 2 calls (3 rows, then 1); rank 0's last 4 throwaway, 1 row, 1 token
    assert [len(c) for c in engines[1].calls] == [3, 1] * 3
    assert [len(c) for c in engines[0].calls] == [3, 1, 1, 1, 1, 1]
    assert engines[0].max_new_tokens[2:] == [1] * 4
    assert engines[0].lockstep == engines[1].lockstep == [True] * 6
    for logged in metrics:
        assert logged["tools/call_frequency"] == [1.0]  # 8 calls, 8 rollouts
        assert logged["tools/failure_frequency"] == [0.5]
        assert logged["tools/turns_mean"] == [2.0]  # (4 x 1 + 4 x 3) / 8
        assert logged["tools/rollback_frequency"] == [0.0]


def test_one_process_makes_one_generation_call_per_turn_without_lockstep(tool_tok):
    """Without `sum_over_ranks` nothing changes: one `engine.sample` per turn, all running rows, no `lockstep`."""
    turn = ids(tool_tok, call("add", '{"a":1,"b":1}') + "</s>")
    source, engine, _ = make_source(
        tool_tok, lambda c: "ok</s>" if "t:" in c else turn, tools=[add], generation_batch_size=1, response_length=200
    )
    source.sample(2, step=0)
    assert [len(c) for c in engine.calls] == [2, 2]  # ScriptedEngine.sample takes no `lockstep`: none was passed


@pytest.mark.parametrize(
    "zero_stage, gathered, lockstep, expected",
    [(0, True, True, False), (3, True, False, False), (3, True, True, None), (3, False, False, None)],
)
def test_lockstep_generation_is_synced_under_zero3_even_with_gathered_weights(
    zero_stage, gathered, lockstep, expected
):
    """`synced_gpus`: None lets transformers sync the ranks' forwards (ZeRO-3 on several processes); the tool loop's
    turns ask for it even with gathered weights (DeepSpeed's forward pre-hook broadcasts while it re-records its
    parameter trace, which TRL invalidates after every generation: a rank that stopped after 1 token hung)."""
    from types import SimpleNamespace

    from trl_trapo.distributed import generation_synced_gpus

    plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage else None
    accelerator = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin, fsdp_plugin=None))
    assert generation_synced_gpus(accelerator, gathered, lockstep=lockstep) is expected


# ---------------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------------
def test_a_trl_grpo_agent_script_runs_under_trapo_with_only_the_import_changed(tmp_path, tool_tok):
    # was: from trl import GRPOConfig, GRPOTrainer; the config keeps GRPO's max_completion_length (TRAPOConfig's
    # response_length, PPO's name, accepted under both)
    from trl_trapo import TRAPOConfig as GRPOConfig
    from trl_trapo import TRAPOTrainer as GRPOTrainer

    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a * b

    def reward_answer(completions, answer, **kwargs):
        return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]

    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"{i}*3="}] for i in range(4)],
            "answer": [str(3 * i) for i in range(4)],
        }
    )
    config = GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=32, max_tool_calling_iterations=2, logging_steps=1, report_to="none",
        save_strategy="no", learning_rate=1e-3, activation_checkpointing=False,
    )  # fmt: skip
    assert config.response_length == 32
    trainer = GRPOTrainer(
        model=build_tiny_model(tool_tok, seed=0),
        reward_funcs=reward_answer,
        args=config,
        train_dataset=dataset,
        processing_class=tool_tok,
        tools=[multiply],
    )
    assert isinstance(trainer.rollout_source, ToolRolloutSource)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert {"tools/call_frequency", "tools/failure_frequency", "tools/rollback_frequency", "tools/turns_mean"} <= set(
        logged
    )
    assert trainer.state.global_step == 2


def test_trapo_trains_through_tool_calls_end_to_end(tmp_path, tool_tok):
    trainer = TRAPOTrainer(
        build_tiny_model(tool_tok, seed=0),
        args=tiny_args(tmp_path, response_length=64),
        train_dataset=None,
        processing_class=tool_tok,
        environment_factory=Counter,
    )
    # the random model never calls a tool: script its turns, through the same loop (the trainer's engine replaced)
    bumps = itertools.cycle([1, 2, 2, 3])  # rewards that differ within a group: a gradient

    def script(context):
        return "ok</s>" if "t:" in context else call("bump", f'{{"by":{next(bumps)}}}') + "</s>"

    trainer.rollout_source.engine = ScriptedEngine(tool_tok, script)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/turns_mean"] == 2.0
    assert logged["rewards/Counter/mean"] == 2.0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_the_documented_tool_example_trains(tmp_path, monkeypatch):
    """docs/agents.md's block, as written: two steps through the tool-calling source, its metrics logged."""
    from test_doc_commands import registered_block

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    block = registered_block("docs/agents.md: # run: a tool the policy may call")
    exec(compile(block.text, block.where(), "exec"), namespace)
    trainer = namespace["trainer"]
    assert isinstance(trainer.rollout_source, ToolRolloutSource) and trainer.state.global_step == 2
    assert "tools/turns_mean" in trainer.state.log_history[0]
    # its budget holds the exchange it is about: a call, its result and the answer (the random model never calls a
    # tool: a perfect policy's turns are scripted, through the same source); at response_length=48 the call alone
    # was cut short and no rollout reached a second turn
    source = trainer.rollout_source

    def perfect(context):
        if "t:" in context:  # the tool's result is in: answer with it
            return context.rsplit("t:", 1)[1].split("\n")[0] + "</s>"
        a = context.rsplit("u:", 1)[1].split("*")[0]
        return call("multiply", f'{{"a":{a},"b":7}}') + "</s>"

    source.engine = ScriptedEngine(source.tokenizer, perfect)
    round_ = source.sample(trainer.args.per_device_train_batch_size, step=trainer.state.global_step)
    texts = [source.tokenizer.decode(c) for c in round_.completion_ids]
    for example, text in zip(round_.examples, texts):
        assert text.endswith(f"t:{example['answer']}\na:{example['answer']}</s>"), text
    assert round_.scores.tolist() == [1.0] * len(texts)  # the reward reads the second turn's answer
    longest = max(c.numel() for c in round_.completion_ids)
    assert longest <= trainer.args.response_length, (longest, trainer.args.response_length)
    prose = " ".join((ROOT / block.document).read_text(encoding="utf-8").split())
    assert f"= {longest} of the {trainer.args.response_length} tokens" in prose  # the doc's count of the budget


def test_an_environment_without_tool_methods_is_warned_about(caplog):
    """An environment class with only `reset` trained as single-turn RL without a word (trial 4's K13b); TRL 1.16's
    GRPOTrainer accepts it silently too. Kept, with a warning naming the class and the fix."""
    from trl_trapo.agents import AgentSpec

    class ResetOnly:
        def reset(self, **row):
            return None

    class Counter:
        def reset(self, **row):
            self.n = 0

        def increment(self, by: int) -> int:
            """Add `by` to the counter.

            Args:
                by: how much to add.
            """
            self.n += by
            return self.n

    with caplog.at_level(logging.WARNING, logger="trl_trapo.agents"):
        spec = AgentSpec.build(None, ResetOnly)
    assert spec.schemas == {None: []}
    assert "environment_factory: ResetOnly exposes no tool methods" in caplog.text and "type hints" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.agents"):
        AgentSpec.build(None, Counter)
        AgentSpec.build(None, {"a": Counter, "b": Counter})
    assert "exposes no tool methods" not in caplog.text
