# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (a cluster preempting the job).

While `TRAPOTrainer.train()` runs, and only then, a `SignalCatcher` replaces the handlers of SIGINT and SIGTERM (in
the main thread; the previous handlers are put back when `train()` returns or raises; a signal the process ignores
stays ignored). A signal only sets a flag: the optimizer step in progress finishes (tool calls still running are
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
exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM), without a traceback.

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

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REPEAT_GRACE_S = 1.0  # a second SIGINT sooner than this is the launcher forwarding the first one


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on SIGINT / SIGTERM after saving a complete checkpoint; the message says how to resume.

    Args:
        interruption ([`Interruption`]): where and why it stopped (`interruption.exit_code`: 130 / 143).
    """

    def __init__(self, interruption: Interruption):
        super().__init__(interruption.message())
        self.interruption = interruption


class TrainingAborted(KeyboardInterrupt):
    """Training was aborted by a second Ctrl-C: nothing was saved for the step in progress (the message says which
    checkpoint is the newest complete one)."""


@dataclass(frozen=True)
class Interruption:
    """Where a run stopped after SIGINT / SIGTERM.

    Attributes:
        signal (`signal.Signals`): the signal (SIGTERM if ranks received different ones).
        step (`int`): the last optimizer step completed, `checkpoint-<step>`.
        checkpoint (`str`): the complete checkpoint written at that step (absolute path).
    """

    signal: signal.Signals
    step: int
    checkpoint: str

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by the signal: 128 + its number (130 SIGINT, 143 SIGTERM)."""
        return 128 + int(self.signal)

    def message(self) -> str:
        """One line: what stopped the run, where the checkpoint is, how to resume (command line and API)."""
        return (
            f"Interrupted by {self.signal.name} at step {self.step}: saved the complete checkpoint {self.checkpoint}. "
            f"Resume with the same command plus `--resume_from_checkpoint {self.checkpoint}` "
            f"(API: `trainer.train(resume_from_checkpoint={self.checkpoint!r})`)."
        )


class SignalCatcher:
    """Records SIGINT / SIGTERM while it is entered (a context manager), instead of the default behaviour.

    Args:
        announce (`bool`): write one line on stderr when the first signal arrives (the main process does), so that the
            wait for the step to finish is not a silent one.

    Attributes:
        received (`signal.Signals` or None): the first signal received since the catcher was entered.
    """

    def __init__(self, announce: bool = True):
        self.announce = announce
        self.received: signal.Signals | None = None
        self.first_at = 0.0
        self.previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> SignalCatcher:
        self.received = None
        self.previous = {}
        if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
            logger.debug("train() runs outside the main thread: SIGINT / SIGTERM keep their handlers.")
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
        """The signal handler: remember the first signal; a later SIGINT (after `REPEAT_GRACE_S`) aborts.

        Raises:
            TrainingAborted: on a second SIGINT.
        """
        now = time.monotonic()
        if self.received is None:
            self.received, self.first_at = signal.Signals(signum), now
            if self.announce:  # os.write: safe in a signal handler, unlike logging or print
                os.write(
                    2,
                    f"\n{self.received.name} received: finishing the current optimizer step, then saving a checkpoint "
                    "(Ctrl-C again to stop at once without saving it).\n".encode(),
                )
            return
        if signum == signal.SIGINT and now - self.first_at > REPEAT_GRACE_S:
            raise TrainingAborted()


__all__ = ["HANDLED_SIGNALS", "Interruption", "SignalCatcher", "TrainingAborted", "TrainingInterrupted"]
