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
from trl_trapo.agents import ToolCall, ToolRunner


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


def test_the_tool_loop_gives_the_model_a_timeout_result_and_counts_a_failure(tool_tok):
    """End to end through the source: the model reads the timeout text, `tools/failure_frequency` moves."""

    def script(context):
        return "done</s>" if "t:" in context else call("sleeper", '{"seconds":5}') + "</s>"

    seen = {}

    def reads(completions, **kwargs):
        seen["completions"] = completions
        return [0.0] * len(completions)

    source, _, metrics = make_source(
        tool_tok,
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


# ---------------------------------------------------------------------------------------------------------------------
# SIGINT / SIGTERM while a tool call hangs (trial 12's N07): the graceful stop abandons the calls, never waits on them
# ---------------------------------------------------------------------------------------------------------------------
class Stopping:
    """A runner's `stopping`: None until `stop()`, then the reason (as `SignalCatcher.stopping` gives it)."""

    def __init__(self):
        self.reason = None

    def stop(self) -> None:
        self.reason = "the run is stopping (SIGTERM received)"

    def __call__(self):
        return self.reason


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stop_abandons_the_calls_still_running_and_runs_none_of_the_rest(kind, caplog):
    """Was: `SignalCatcher` only set a flag, and the round waited on the hung call forever (only SIGKILL ended it,
    without a checkpoint). Once `stopping` gives a reason, running calls fail as abandoned, later ones do not run."""
    release, ran = threading.Event(), []

    def hang() -> str:
        """Hang until released."""
        release.wait(30)
        return "late"

    async def async_hang() -> str:
        """Hang (cancelled when abandoned)."""
        await asyncio.sleep(30)
        return "late"

    def after() -> int:
        """Must not run once the run is stopping."""
        ran.append(1)
        return 1

    tool = hang if kind == "sync" else async_hang
    stopping = Stopping()
    runner = ToolRunner(4, stopping=stopping)
    threading.Timer(0.3, stopping.stop).start()
    start = time.perf_counter()
    try:
        with caplog.at_level("WARNING", logger="trl_trapo.agents"):
            outcomes = runner.run(
                [[ToolCall("fetch", {}, tool), ToolCall("after", {}, after)], [ToolCall("fetch", {}, tool)]]
            )
    finally:
        release.set()
        runner.close()
    assert time.perf_counter() - start < 5  # not the tools' 30 s
    (first, first_failed), (second, second_failed) = outcomes[0]
    assert first_failed and first["error"] == "abandoned after 0 s: the run is stopping (SIGTERM received)"
    assert second_failed and second["error"] == "not run: the run is stopping (SIGTERM received)" and not ran
    assert outcomes[1][0][1] and outcomes[1][0][0]["error"].startswith("abandoned after")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # one for the round, not a first-failure warning per tool
    assert warnings[0].startswith("3 tool call(s) were abandoned (`after` x1, `fetch` x2): the run is stopping")


def test_a_round_that_starts_after_the_stop_runs_no_call():
    ran = []

    def record() -> int:
        """Record that it ran."""
        ran.append(1)
        return 1

    stopping = Stopping()
    stopping.stop()
    runner = ToolRunner(2, stopping=stopping)
    outcomes = runner.run([[ToolCall("record", {}, record)], [ToolCall("unknown", error="Tool unknown not found.")]])
    runner.close()
    assert not ran
    assert outcomes == [
        [({"error": "not run: the run is stopping (SIGTERM received)"}, True)],
        [({"error": "Tool unknown not found."}, True)],  # the model's error stays its own
    ]


def test_without_a_stop_the_runner_waits_and_a_tools_own_timeout_error_is_its_own():
    """A tool raising the builtin `TimeoutError` (a socket's) is the tool's error, not `tool_timeout`'s: with
    `asyncio.wait_for` (Python 3.11: `asyncio.TimeoutError is TimeoutError`) it was reported as abandoned."""

    def socket_timeout() -> str:
        """Raise as a socket does."""
        raise TimeoutError("read timed out")

    runner = ToolRunner(2, timeout=30.0, stopping=Stopping())
    outcomes = runner.run(
        [[ToolCall("socket_timeout", {}, socket_timeout), ToolCall("nap", {"seconds": 0.3}, sleeper)]]
    )
    runner.close()
    assert outcomes == [[({"error": "read timed out"}, True), ("awake", False)]]


def test_slow_calls_are_warned_about_once_per_tool_and_round_counting_them(caplog):
    """Trial 12's N07: eight concurrent rollouts' calls of one hung tool printed the same 60 s warning eight times."""
    runner = ToolRunner(8, slow_after=0.1)
    turns = [[ToolCall("sleeper", {"seconds": 0.6}, sleeper)] for _ in range(5)]
    turns.append([ToolCall("async_sleeper", {"seconds": 0.6}, async_sleeper)])
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        runner.run(turns)
        runner.run(turns[:1])  # a new round warns again
    runner.close()
    slow = [r.getMessage() for r in caplog.records]
    assert len(slow) == 3, slow  # one per tool and round, however many of its calls run
    assert slow[0].startswith("The tool `async_sleeper` has been running for 0 s, called with the arguments")
    assert slow[1].startswith("5 calls of `sleeper` are still running, the longest for 0 s (the first was called with")
    assert "set tool_timeout (seconds)" in slow[1]
    assert slow[2].startswith("The tool `sleeper` has been running for 0 s")  # the next round's


class ForceFirstCall:
    """Makes the policy's first assistant turn of every rollout `call` (the tiny random model never writes one)."""

    def __init__(self, tok, call_text: str):
        self.tok, self.ids = tok, tok(call_text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def install(self, monkeypatch) -> None:
        import dataclasses

        import torch

        from trl_trapo.rollout import RolloutEngine

        original = RolloutEngine.sample

        def sample(engine, contexts, *args, **kwargs):
            out = original(engine, contexts, *args, **kwargs)
            if not all("prompt_ids" in c for c in contexts):
                return out
            turns = [
                torch.tensor(self.ids) if "<c>" not in self.tok.decode(c["prompt_ids"]) else turn
                for c, turn in zip(contexts, out.completion_ids)
            ]
            return dataclasses.replace(
                out, completion_ids=turns, old_per_token_logps=None, sampler_per_token_logps=None
            )

        monkeypatch.setattr(RolloutEngine, "sample", sample)


@pytest.fixture
def sigterm_raises():
    """SIGTERM outside `train()` raises (instead of ending pytest); restored after the test."""
    import signal

    def outside(signum, frame):
        raise AssertionError("SIGTERM reached the handler from before train()")

    previous = signal.signal(signal.SIGTERM, outside)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_while_a_tool_hangs_saves_the_checkpoint_and_stops(tmp_path, tool_tok, monkeypatch, sigterm_raises):
    """Trial 12's N07 end to end: a tool hangs with no `tool_timeout`, SIGTERM arrives; the calls are abandoned as
    failed calls, the step finishes, `checkpoint-1` is saved and `train()` raises `TrainingInterrupted`."""
    import os
    import signal

    from datasets import Dataset
    from test_agents import tiny_args

    from trl_trapo import TRAPOTrainer
    from trl_trapo.interrupts import TrainingInterrupted
    from trl_trapo.tasks import build_tiny_model

    release, signalled = threading.Event(), threading.Lock()

    def fetch_page(url: str) -> str:
        """Fetch a web page.

        Args:
            url: The address.
        """
        if signalled.acquire(blocking=False):  # the first call: the cluster preempts the job meanwhile
            os.kill(os.getpid(), signal.SIGTERM)
        release.wait(60)  # a network call without a timeout
        return "page"

    ForceFirstCall(tool_tok, '<c>{"name":"fetch_page","arguments":{"url":"http://x"}}</c>').install(monkeypatch)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}*7="}] for i in range(8)]})
    trainer = TRAPOTrainer(
        build_tiny_model(tool_tok, seed=0),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=tiny_args(tmp_path, max_steps=3, response_length=96),
        train_dataset=dataset,
        processing_class=tool_tok,
        tools=[fetch_page],
    )
    start = time.perf_counter()
    try:
        with pytest.raises(TrainingInterrupted) as stopped:
            trainer.train()
    finally:
        release.set()
    assert time.perf_counter() - start < 30  # not the tool's 60 s
    checkpoint = os.path.join(os.path.abspath(tmp_path), "checkpoint-1")
    assert stopped.value.interruption.checkpoint == checkpoint and os.path.isdir(checkpoint)
    assert stopped.value.interruption.signal == signal.SIGTERM and trainer.state.global_step == 1
    logged = [h for h in trainer.state.log_history if "tools/failure_frequency" in h]
    assert logged and logged[0]["tools/call_frequency"] == 1.0 and logged[0]["tools/failure_frequency"] == 1.0


def test_a_timeouts_warning_carries_no_traceback_of_the_runner(caplog):
    """The timeout is raised inside the runner: its traceback would point at the runner, not at the tool."""
    runner = ToolRunner(2, timeout=0.2)
    with caplog.at_level("WARNING", logger="trl_trapo.agents"):
        runner.run([[ToolCall("sleeper", {"seconds": 2}, sleeper)]])
    runner.close()
    (record,) = caplog.records
    assert "timed out" in record.getMessage() and not record.exc_info
