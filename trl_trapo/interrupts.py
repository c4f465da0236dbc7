# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Stopping a run cleanly on SIGINT (Ctrl-C), SIGTERM (a cluster preempting the job) or SIGHUP (the terminal closed:
an ssh session dropped, a terminal window shut, on platforms that have the signal).

While `TRAPOTrainer.train()` runs, and only then, a `SignalCatcher` replaces the handlers of these signals
(`HANDLED_SIGNALS`, in the main thread; the previous handlers are put back when `train()` returns or raises; a signal
the process ignores stays ignored: under `nohup` SIGHUP is ignored, and the run goes on). A signal only sets a flag: the optimizer step in progress finishes (tool calls still running are
abandoned as failed calls, [`~trl_trapo.agents.ToolRunner`] asks [`SignalCatcher.stopping`], so that the step never
waits on a hung tool), then
[`~trl_trapo.callbacks.StopOnSignalCallback`] — at the end of every optimizer step, on every rank — agrees over the
ranks whether any of them received one (one all-gather of one number per step, `distributed.max_over_ranks`), and if
so asks the Trainer to save the normal `checkpoint-N` (TRAPO's state included, by `StateCheckpointCallback`) and stop.
When the Trainer's loop has ended (`on_train_end` has run), `train()` raises [`TrainingInterrupted`], a
`KeyboardInterrupt` whose message is one line saying where the checkpoint is and how to resume (`trainer.interruption`
holds the same [`Interruption`]). It raises rather than returns so that a script does what Ctrl-C always made it do —
stop — instead of going on to save, evaluate or push a half-trained model as if it were the final one; and a
`KeyboardInterrupt` passes through `except Exception`. The command line (`examples/trapo.py`) prints the line and
exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), without a traceback.

After SIGHUP the terminal may be gone: writing to it fails (`EIO`), which would make the step or the checkpoint fail
on the next progress bar or log line. So on SIGHUP, each of stdout / stderr that was a terminal when training started
and is no longer one (a hung-up terminal answers no terminal request) is pointed at `os.devnull`
([`SignalCatcher.handle`]); one redirected to a file or a pipe keeps its output.

A closed output is stopped the same way (trial 15's C16): while the catcher is entered, `sys.stdout` and `sys.stderr`
are [`GuardedStream`]s, so that a write to a pipe whose reader has gone away (`trapo train | head`, quitting `| less`)
raises no `BrokenPipeError` into the Trainer's logging (transformers' `ProgressCallback` killed the run there, with a
traceback and nothing saved): the stream's file descriptor is pointed at `os.devnull` (Python's own advice for
SIGPIPE: https://docs.python.org/3/library/signal.html#note-on-sigpipe), console output is dropped from then on, and
the catcher records SIGPIPE as if it were received, so the run saves `checkpoint-N` at the end of the step and stops;
the command line exits with 141 (128 + SIGPIPE, the status a shell reports for a process SIGPIPE ended) and its line
goes to stderr. Stopping rather than training on without output is what a reader leaving means on Unix (`yes | head`
ends): the shell waits for every process of a pipeline, so a run that went on would hold the prompt for the rest of
the training, showing nothing. Outside the training steps (loading, evaluation, saving) the command line does what
it does for Ctrl-C there: one line on stderr, nothing more saved, exit 141 ([`output_pipe_closed`] tells that
`BrokenPipeError` from one of a socket the run uses).

A second Ctrl-C, more than `REPEAT_GRACE_S` after the first, aborts at once with [`TrainingAborted`] (a
`KeyboardInterrupt`) and saves nothing more: the usual convention for "stop now". A copy that arrives sooner is taken
for the launcher forwarding the same Ctrl-C (torchrun's agent sends the signal it received to every worker, which the
terminal has already signalled) and is ignored, as are repeated SIGTERMs (a cluster follows up with SIGKILL).

Launchers: `accelerate launch --multi_gpu` (torchrun) forwards SIGINT / SIGTERM to its workers and waits for them
`TORCH_ELASTIC_SHUTDOWN_TIMEOUT` seconds (default 30) before killing them: raise it when a step plus a checkpoint takes
longer. Both of accelerate's launchers print their own traceback when they are interrupted themselves (that code is
accelerate's and torch's); the single-process launcher does not wait for its child after a Ctrl-C, so the shell prompt
may come back before the checkpoint line. `python examples/trapo.py` runs one process without a launcher.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


logger = logging.getLogger(__name__)

HANDLED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals that stop training at a checkpoint (SIGHUP where the platform has it: not on Windows)."""
REPEAT_GRACE_S = 1.0  # a second SIGINT sooner than this is the launcher forwarding the first one
SIGPIPE = getattr(signal, "SIGPIPE", None)  # what a closed output counts as (None on Windows: no guard)
GUARDED_STREAMS = ("stdout", "stderr")


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on SIGINT / SIGTERM / SIGHUP after saving a complete checkpoint; the message says how to
    resume.

    Args:
        interruption ([`Interruption`]): where and why it stopped (`interruption.exit_code`: 130 / 143 / 129).
    """

    def __init__(self, interruption: Interruption):
        super().__init__(interruption.message())
        self.interruption = interruption


class TrainingAborted(KeyboardInterrupt):
    """Training was aborted by a second Ctrl-C: nothing was saved for the step in progress (the message says which
    checkpoint is the newest complete one)."""


def aborted(step: int, output_dir: str, world_size: int) -> TrainingAborted:
    """The `TrainingAborted` that `train()` raises after a second Ctrl-C during `step`, naming the newest complete
    checkpoint of `output_dir` (`checkpoint.last_complete_checkpoint`), or none.

    Args:
        step (`int`): the optimizer step that was running (nothing of it is saved).
        output_dir (`str`): the run's output folder.
        world_size (`int`): the run's processes (a checkpoint is complete when every rank's part is).
    """
    from .checkpoint import last_complete_checkpoint

    newest, _ = last_complete_checkpoint(output_dir, world_size)
    return TrainingAborted(
        f"Aborted by a second Ctrl-C during step {step}: nothing was saved for it; the newest complete checkpoint is "
        f"{os.path.abspath(newest) if newest else 'none'}."
    )


@dataclass(frozen=True)
class Interruption:
    """Where a run stopped after SIGINT / SIGTERM / SIGHUP.

    Attributes:
        signal (`signal.Signals`): the signal (the highest-numbered one if ranks received different ones).
        step (`int`): the last optimizer step completed, `checkpoint-<step>`.
        checkpoint (`str`): the complete checkpoint written at that step (absolute path).
    """

    signal: signal.Signals
    step: int
    checkpoint: str

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by the signal: 128 + its number (130 SIGINT, 143 SIGTERM, 129
        SIGHUP, 141 SIGPIPE)."""
        return 128 + int(self.signal)

    def message(self) -> str:
        """One line: what stopped the run, where the checkpoint is, how to resume (command line and API)."""
        cause = (
            "Stopped because the output was closed (SIGPIPE: the program reading it went away)"
            if self.signal == SIGPIPE
            else f"Interrupted by {self.signal.name}"
        )
        return (
            f"{cause} at step {self.step}: saved the complete checkpoint {self.checkpoint}. "
            f"Resume with the same command plus `--resume_from_checkpoint {self.checkpoint}` "
            f"(API: `trainer.train(resume_from_checkpoint={self.checkpoint!r})`)."
        )


def is_terminal(fd: int) -> bool:
    """`os.isatty(fd)`, False for a closed or invalid descriptor (and for a hung-up terminal: its requests fail)."""
    try:
        return os.isatty(fd)
    except OSError:
        return False


def output_pipe_closed(*streams) -> bool:
    """Whether one of `streams` (default `sys.stdout`, `sys.stderr`) is a pipe or socket whose reader has gone away:
    `poll` reports an error or a hang-up on its file descriptor (Linux: a pipe with no reader left). Tells a `BrokenPipeError` of
    the console from one of a connection the run uses (a reward server, a vLLM server).

    Returns:
        `bool`: False too where it cannot be told (no file descriptor, no `poll`).
    """
    for stream in streams or [getattr(sys, name) for name in GUARDED_STREAMS]:
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
            if any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
                return True
        except (AttributeError, OSError, ValueError):  # no fileno (a test's capture), closed, or no poll here
            continue
    return False


def drop_output(stream) -> None:
    """Point `stream`'s file descriptor at `os.devnull` (Python's advice for a closed pipe): what is still buffered, and
    everything written after, goes nowhere, and the interpreter's flush at exit raises no `BrokenPipeError`. A stream
    without a file descriptor is left as it is."""
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)


def say(message: str) -> None:
    """`message` on stderr, or nowhere when stderr is a closed pipe too (`2>&1 | head`): never a `BrokenPipeError`."""
    try:
        print(message, file=sys.stderr, flush=True)
    except BrokenPipeError:
        drop_output(sys.stderr)


class GuardedStream:
    """`sys.stdout` / `sys.stderr` while training: a write or flush that fails with `BrokenPipeError` (the reader of
    the pipe went away) drops the stream's output from then on ([`drop_output`]) and calls `on_closed(name)` once,
    instead of raising into whatever was logging. Everything else is the stream's own (attributes are passed through).

    Args:
        stream: the stream it stands for.
        name (`str`): `"stdout"` or `"stderr"`.
        on_closed (`Callable[[str], None]`): called with `name` the first time the pipe is found closed.
    """

    def __init__(self, stream, name: str, on_closed: Callable[[str], None]):
        self.stream = stream
        self.stream_name = name
        self.on_closed = on_closed
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if self.closed_pipe:
            return len(text)
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self.close_pipe()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.closed_pipe:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            self.close_pipe()

    def close_pipe(self) -> None:
        self.closed_pipe = True
        drop_output(self.stream)
        self.on_closed(self.stream_name)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


class SignalCatcher:
    """Records SIGINT / SIGTERM / SIGHUP (`HANDLED_SIGNALS`) while it is entered (a context manager), instead of the
    default behaviour.

    Args:
        announce (`bool`): write one line on stderr when the first signal arrives (the main process does), so that the
            wait for the step to finish is not a silent one.

    While entered, `sys.stdout` and `sys.stderr` are [`GuardedStream`]s: a closed pipe counts as SIGPIPE received
    (see the module docstring).

    Attributes:
        received (`signal.Signals` or None): the first signal received since the catcher was entered.
        terminals (`list[int]`): which of stdout (1) and stderr (2) were terminals when it was entered.
    """

    def __init__(self, announce: bool = True):
        self.announce = announce
        self.received: signal.Signals | None = None
        self.first_at = 0.0
        self.previous: dict[signal.Signals, object] = {}
        self.terminals: list[int] = []
        self.guarded: dict[str, GuardedStream] = {}

    def __enter__(self) -> SignalCatcher:
        self.received = None
        self.previous = {}
        self.terminals = [fd for fd in (1, 2) if is_terminal(fd)]
        self.guard_streams()
        if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
            logger.debug("train() runs outside the main thread: SIGINT / SIGTERM / SIGHUP keep their handlers.")
            return self
        for sig in HANDLED_SIGNALS:
            current = signal.getsignal(sig)
            if current in (signal.SIG_IGN, None):  # ignored on purpose (a background job), or set outside Python
                continue
            self.previous[sig] = current
            signal.signal(sig, self.handle)
        return self

    def stopping(self) -> str | None:
        """Why the run is stopping, for what must not hold up the stop (a tool call that hangs: the tool-calling
        source abandons the calls still running, `agents.ToolRunner`), or None while no signal has been received.

        Returns:
            `str` or None: e.g. "the run is stopping (SIGTERM received)".
        """
        received = self.received
        return None if received is None else f"the run is stopping ({received.name} received)"

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}
        for name, guard in self.guarded.items():
            if getattr(sys, name) is guard:  # not if something replaced it since (it restores its own)
                setattr(sys, name, guard.stream)
        self.guarded = {}

    def guard_streams(self) -> None:
        """Put a [`GuardedStream`] in place of `sys.stdout` and `sys.stderr` (not of a missing one, nor of a guard)."""
        self.guarded = {}
        if SIGPIPE is None:
            return
        for name in GUARDED_STREAMS:
            stream = getattr(sys, name)
            if stream is not None and not isinstance(stream, GuardedStream):
                self.guarded[name] = GuardedStream(stream, name, self.output_closed)
                setattr(sys, name, self.guarded[name])

    def output_closed(self, name: str) -> None:
        """A [`GuardedStream`] found its pipe closed: the run stops as on a signal (SIGPIPE), unless one came first."""
        if self.received is not None:
            return
        self.received, self.first_at = SIGPIPE, time.monotonic()
        if self.announce:
            say(
                f"\n{name} was closed (the program reading it went away): finishing the current optimizer step, then "
                "saving a checkpoint; console output is dropped from here on."
            )

    def handle(self, signum: int, frame) -> None:
        """The signal handler: remember the first signal; a later SIGINT (after `REPEAT_GRACE_S`) aborts. On SIGHUP,
        stdout / stderr are detached from a terminal that hung up ([`detach_hung_up_terminals`]) first. The line
        announcing the stop is written with `os.write` (safe in a signal handler, unlike logging or print), and a
        failure to write it (a closed terminal or pipe) is ignored: it must not stop the step.

        Raises:
            TrainingAborted: on a second SIGINT.
        """
        now = time.monotonic()
        if self.received is None:
            self.received, self.first_at = signal.Signals(signum), now
            if signum == getattr(signal, "SIGHUP", None):
                self.detach_hung_up_terminals()
            if self.announce:
                try:
                    os.write(
                        2,
                        f"\n{self.received.name} received: finishing the current optimizer step, then saving a "
                        "checkpoint (Ctrl-C again to stop at once without saving it).\n".encode(),
                    )
                except OSError:
                    pass
            return
        if signum == signal.SIGINT and now - self.first_at > REPEAT_GRACE_S:
            raise TrainingAborted()

    def detach_hung_up_terminals(self) -> list[int]:
        """[`detach_hung_up_terminals`] of the descriptors that were terminals when the catcher was entered."""
        return detach_hung_up_terminals(self.terminals)


def detach_hung_up_terminals(terminals: list[int]) -> list[int]:
    """Point each descriptor of `terminals` (stdout / stderr that were terminals earlier) that is no terminal now (the
    terminal hung up: it answers no terminal request, and a write fails with `EIO`) at `os.devnull`, so that the rest
    of the step, the checkpoint and the exit write nowhere instead of failing. A terminal still there (a SIGHUP sent by
    hand) and a file or pipe are left as they are.

    Args:
        terminals (`list[int]`): descriptors that were terminals (e.g. `SignalCatcher.terminals`).

    Returns:
        `list[int]`: the descriptors pointed at `os.devnull`.
    """
    gone = [fd for fd in terminals if not is_terminal(fd)]
    if gone:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            for fd in gone:
                os.dup2(null, fd)
        finally:
            os.close(null)
    return gone


def ignore_stop_signals() -> None:
    """For a helper process of the run (the asynchronous producer, `async_rollouts.py`): SIGINT / SIGTERM / SIGHUP
    (`HANDLED_SIGNALS`) are the trainer's to act on, so they are ignored here, except that on SIGHUP stdout / stderr
    are detached from a terminal that hung up ([`detach_hung_up_terminals`]), as the trainer's are: a closed terminal
    signals the whole process group, and a write to it would fail."""
    terminals = [fd for fd in (1, 2) if is_terminal(fd)]
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP") and terminals:
        signal.signal(signal.SIGHUP, lambda signum, frame: detach_hung_up_terminals(terminals))


__all__ = [
    "HANDLED_SIGNALS",
    "GuardedStream",
    "Interruption",
    "SignalCatcher",
    "TrainingAborted",
    "TrainingInterrupted",
    "aborted",
    "detach_hung_up_terminals",
    "drop_output",
    "ignore_stop_signals",
    "output_pipe_closed",
    "say",
]
