# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A tool call that hangs (trial 12's N07, issue 37): it is warned about while it runs, and `tool_timeout` abandons it
as a failed call (the model reads a timeout error, `tools/failure_frequency` moves), so the round goes on."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
from test_agents import call, make_source, prompts_dataset

from trl_trapo import TRAPOConfig
from trl_trapo.agents import ToolCall, ToolRunner, use_tool_chat_template
from trl_trapo.tasks import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return use_tool_chat_template(build_char_tokenizer())


def sleeper(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


async def async_sleeper(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "awake"


@pytest.mark.parametrize("tool", [sleeper, async_sleeper], ids=["sync", "async"])
def test_a_tool_call_running_past_the_threshold_is_warned_about_once_naming_it(tool, caplog):
    """Was: a tool call that hung stalled the run without a word."""
    runner = ToolRunner(2, slow_after=0.1)
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        outcomes = runner.run([[ToolCall(tool.__name__, {"seconds": 0.4}, tool)], [ToolCall("fast", {}, lambda: 1)]])
    runner.close()
    assert outcomes == [[("awake", False)], [(1, False)]]
    slow = [r.getMessage() for r in caplog.records if "has been running for" in r.getMessage()]
    assert len(slow) == 1, slow  # once per call, and not for the fast one
    assert f"`{tool.__name__}`" in slow[0] and "{'seconds': 0.4}" in slow[0] and "tool_timeout" in slow[0]


@pytest.mark.parametrize("tool", [sleeper, async_sleeper], ids=["sync", "async"])
def test_a_tool_call_past_tool_timeout_is_abandoned_as_a_failed_call(tool, caplog):
    """Was: no limit at all; a hung call held the round (and the run) forever."""
    runner = ToolRunner(2, timeout=0.2)
    start = time.perf_counter()
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        outcomes = runner.run([[ToolCall(tool.__name__, {"seconds": 5}, tool), ToolCall("fast", {}, lambda: 1)]])
    seconds = time.perf_counter() - start
    runner.close()
    assert seconds < 2, seconds  # not the tool's 5 s
    (result, failed), after = outcomes[0]
    assert failed and "tool_timeout=0.2" in result["error"] and after == (1, False)  # the turn goes on
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"The tool `{tool.__name__}`")]
    assert len(warnings) == 1 and "timed out" in warnings[0] and "tool_timeout=0.2" in warnings[0]


def test_an_abandoned_sync_call_runs_on_in_a_daemon_thread_and_frees_its_slot():
    """The thread of an abandoned sync call cannot be stopped: it must not hold up the process's exit (a pool's
    worker threads are joined at exit), nor the next calls (one slot here)."""
    release = threading.Event()

    def hang() -> str:
        """Hang until released."""
        release.wait(10)
        return "late"

    runner = ToolRunner(1, timeout=0.2)
    outcomes = runner.run([[ToolCall("hang", {}, hang)], [ToolCall("fast", {}, lambda: 1)]])
    hung = [t for t in threading.enumerate() if t.name == "trl-trapo-tool-hang"]
    assert outcomes[0][0][1] and outcomes[1] == [(1, False)]
    assert hung and all(t.daemon for t in hung)
    release.set()
    runner.close()


def test_the_tool_loop_gives_the_model_a_timeout_result_and_counts_a_failure(tok):
    """End to end through the source: the model reads the timeout text, `tools/failure_frequency` moves."""

    def script(context):
        return "done</s>" if "t:" in context else call("sleeper", '{"seconds":5}') + "</s>"

    seen = {}

    def reads(completions, **kwargs):
        seen["completions"] = completions
        return [0.0] * len(completions)

    source, _, metrics = make_source(
        tok,
        script,
        tools=[sleeper],
        rewards=[reads],
        dataset=prompts_dataset(1),
        group=2,
        tool_timeout=0.2,
        response_length=200,
    )
    start = time.perf_counter()
    source.sample(2, step=0)
    seconds = time.perf_counter() - start
    source.close()
    assert seconds < 4, seconds
    assert metrics["tools/failure_frequency"] == [1.0]
    results = [[m["content"] for m in c if m["role"] == "tool"] for c in seen["completions"]]
    assert all(len(r) == 1 and "tool_timeout=0.2" in r[0] for r in results), results


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, True, "5"])
def test_tool_timeout_is_validated(tmp_path, value):
    with pytest.raises(ValueError, match="tool_timeout") as error:
        TRAPOConfig(output_dir=str(tmp_path), tool_timeout=value)
    assert "None" in str(error.value)  # the fix names the no-limit value


def test_tool_timeout_defaults_to_no_limit_and_takes_seconds(tmp_path):
    assert TRAPOConfig(output_dir=str(tmp_path)).tool_timeout is None
    assert TRAPOConfig(output_dir=str(tmp_path), tool_timeout=2.5).tool_timeout == 2.5


def exits(code: int) -> str:
    """A command-line helper wrapped as a tool.

    Args:
        code: The exit status.
    """
    import sys

    sys.exit(code)


async def async_exits(code: int) -> str:
    """A command-line helper wrapped as an async tool.

    Args:
        code: The exit status.
    """
    import sys

    sys.exit(code)


@pytest.mark.parametrize("tool", [exits, async_exits], ids=["sync", "async"])
def test_a_tool_that_calls_sys_exit_is_a_failed_call_not_a_hang(tool):
    """Trial 12's N46: `sys.exit(1)` in a sync tool ended its thread without a word (threads swallow SystemExit) and
    the round waited forever; SIGTERM could not stop the run. It is a failed call whose error names sys.exit."""
    runner = ToolRunner(2, timeout=30.0)
    started = time.monotonic()
    outcomes = runner.run([[ToolCall(tool.__name__, {"code": 1}, tool), ToolCall("next", {}, lambda: 2)]])
    runner.close()
    assert time.monotonic() - started < 10  # not the timeout: the exit is seen at once
    (result, failed), after = outcomes[0]
    assert failed and "sys.exit(1)" in result["error"], result
    assert after == (2, False)  # the turn goes on
