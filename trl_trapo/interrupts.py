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
import signal
import threading
import time
from dataclasses import dataclass


logger = logging.getLogger(__name__)

HANDLED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals that stop training at a checkpoint (SIGHUP where the platform has it: not on Windows)."""
REPEAT_GRACE_S = 1.0  # a second SIGINT sooner than this is the launcher forwarding the first one


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
        SIGHUP)."""
        return 128 + int(self.signal)

    def message(self) -> str:
        """One line: what stopped the run, where the checkpoint is, how to resume (command line and API)."""
        return (
            f"Interrupted by {self.signal.name} at step {self.step}: saved the complete checkpoint {self.checkpoint}. "
            f"Resume with the same command plus `--resume_from_checkpoint {self.checkpoint}` "
            f"(API: `trainer.train(resume_from_checkpoint={self.checkpoint!r})`)."
        )


def is_terminal(fd: int) -> bool:
    """`os.isatty(fd)`, False for a closed or invalid descriptor (and for a hung-up terminal: its requests fail)."""
    try:
        return os.isatty(fd)
    except OSError:
        return False


class SignalCatcher:
    """Records SIGINT / SIGTERM / SIGHUP (`HANDLED_SIGNALS`) while it is entered (a context manager), instead of the
    default behaviour.

    Args:
        announce (`bool`): write one line on stderr when the first signal arrives (the main process does), so that the
            wait for the step to finish is not a silent one.

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

    def __enter__(self) -> SignalCatcher:
        self.received = None
        self.previous = {}
        self.terminals = [fd for fd in (1, 2) if is_terminal(fd)]
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
    "Interruption",
    "SignalCatcher",
    "TrainingAborted",
    "TrainingInterrupted",
    "detach_hung_up_terminals",
    "ignore_stop_signals",
]
