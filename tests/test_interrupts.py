# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""SIGINT / SIGTERM handling (trl_trapo/interrupts.py): the catcher records the first signal and puts the previous
handlers back; a second Ctrl-C (not the launcher's forwarded copy) aborts training at once, naming the newest complete
checkpoint; ignored signals stay ignored; nothing is installed outside the main thread.

The end-to-end cases are elsewhere: stop, checkpoint and exact resume in tests/test_durability.py, two processes in
tests/test_distributed.py, the command line in tests/test_user_errors.py.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest
from transformers import TrainerCallback

from trl_trapo import interrupts
from trl_trapo.interrupts import Interruption, SignalCatcher, TrainingAborted


@pytest.fixture
def default_handlers():
    """SIGINT -> KeyboardInterrupt, SIGTERM -> a recognisable exception, restored after the test."""

    class Terminated(Exception):
        pass

    def on_term(signum, frame):
        raise Terminated()

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_term)
    yield on_term, Terminated
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_first_signal_is_recorded_and_handlers_are_restored(default_handlers):
    on_term, terminated = default_handlers
    with SignalCatcher(announce=False) as catcher:
        os.kill(os.getpid(), signal.SIGTERM)
        assert catcher.received == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # repeated SIGTERMs change nothing (a cluster follows with SIGKILL)
        assert catcher.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is on_term
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(terminated):  # outside the block the process's own handler acts again
        os.kill(os.getpid(), signal.SIGTERM)


def test_second_ctrl_c_aborts_but_the_launchers_copy_does_not(default_handlers, monkeypatch):
    times = iter([100.0, 100.2, 101.5])  # first Ctrl-C; torchrun's forwarded copy 0.2 s later; a second Ctrl-C
    monkeypatch.setattr(interrupts.time, "monotonic", lambda: next(times))
    with SignalCatcher(announce=False) as catcher:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert catcher.received == signal.SIGINT
        with pytest.raises(TrainingAborted):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ignored_signal_stays_ignored_and_threads_install_nothing(default_handlers):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # e.g. a job started in the background by a shell script
    with SignalCatcher(announce=False):
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) != default_handlers[0]
    seen = []

    def in_thread():
        with SignalCatcher(announce=False):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen == [default_handlers[0]]


def test_a_closed_stdout_counts_as_sigpipe_and_drops_the_output(monkeypatch):
    # trial 15's C16: `trapo train | head`: the next log line raised BrokenPipeError inside the Trainer's logging
    read_end, write_end = os.pipe()
    piped = os.fdopen(write_end, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", piped)
    os.close(read_end)  # the reader went away
    with SignalCatcher(announce=False) as catcher:
        print("a log line")  # no BrokenPipeError: the output is dropped, the run asked to stop
        print("another one")
        sys.stdout.flush()
        assert catcher.received == signal.SIGPIPE
    assert sys.stdout is piped  # put back on the way out, its descriptor now os.devnull
    print("after training")
    piped.flush()
    assert not interrupts.output_pipe_closed(piped)
    piped.close()
    other_read, other_write = os.pipe()  # how the command line tells the console's pipe from a socket's
    with os.fdopen(other_write, "w") as other:
        assert not interrupts.output_pipe_closed(other)
        os.close(other_read)
        assert interrupts.output_pipe_closed(other)
    stop = Interruption(signal.SIGPIPE, 3, "/runs/x/checkpoint-3")
    assert stop.exit_code == 141 and stop.message().startswith("Stopped because the output was closed")


def test_interruption_exit_codes_and_message():
    stop = Interruption(signal.SIGTERM, 7, "/runs/x/checkpoint-7")
    assert (stop.exit_code, Interruption(signal.SIGINT, 7, "c").exit_code) == (143, 130)
    assert "\n" not in stop.message()
    assert "at step 7" in stop.message() and "--resume_from_checkpoint /runs/x/checkpoint-7" in stop.message()


class CtrlCTwice(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step - 1:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return control


def test_second_ctrl_c_during_training_aborts_naming_the_newest_checkpoint(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, default_handlers
):
    monkeypatch.setattr(interrupts, "REPEAT_GRACE_S", -1.0)  # the second Ctrl-C counts however soon it comes
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=4, save_strategy="steps", save_steps=2)
    trainer.add_callback(CtrlCTwice(step=3))
    with pytest.raises(TrainingAborted) as error:
        trainer.train()
    newest = os.path.join(os.path.abspath(tmp_path), "checkpoint-2")
    assert str(error.value) == (
        f"Aborted by a second Ctrl-C during step 3: nothing was saved for it; the newest complete checkpoint is "
        f"{newest}."
    )
    assert not os.path.exists(tmp_path / "checkpoint-3")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored on the way out


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_sighup_is_caught_like_sigterm_and_a_hung_up_terminal_is_detached(tmp_path):
    """Trial 15's C20: SIGHUP (the terminal closed) killed a run at once; it is now one of the stop signals. Its
    handler points stdout / stderr that were a terminal, and are none now (it hung up: writes fail with EIO), at
    os.devnull, so that the step and the checkpoint do not fail on a progress bar; a live terminal is left alone."""
    import pty

    assert signal.SIGHUP in interrupts.HANDLED_SIGNALS
    assert Interruption(signal.SIGHUP, 3, "c").exit_code == 129
    master, slave = pty.openpty()
    live_master, live_slave = pty.openpty()
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with SignalCatcher(announce=False) as catcher:
            assert signal.getsignal(signal.SIGHUP) == catcher.handle
            catcher.terminals = [slave, live_slave]  # stand-ins for stdout / stderr
            os.close(master)  # hangs the terminal up
            with pytest.raises(OSError):
                os.write(slave, b"x")
            os.kill(os.getpid(), signal.SIGHUP)
            assert catcher.received == signal.SIGHUP and catcher.stopping() == "the run is stopping (SIGHUP received)"
            assert os.write(slave, b"after the hang-up") == 17  # now os.devnull
            assert os.isatty(live_slave)  # the live terminal was not touched
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, previous)
        for fd in (slave, live_master, live_slave):
            os.close(fd)


def test_the_announcement_of_a_stop_never_fails_the_step(monkeypatch, default_handlers):
    """The line announcing the stop is written to stderr from the signal handler; a terminal or pipe already gone
    (EIO, EPIPE) must not raise out of the handler into the step."""

    def broken(fd, data):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(interrupts.os, "write", broken)
    with SignalCatcher(announce=True) as catcher:
        os.kill(os.getpid(), signal.SIGTERM)
        assert catcher.received == signal.SIGTERM


def test_a_helper_process_leaves_the_stop_signals_to_the_trainer():
    """The asynchronous producer ignores SIGINT / SIGTERM / SIGHUP (a closed terminal signals the whole process group):
    the trainer stops at a checkpoint, waiting for the producer's rounds."""
    code = (
        "import os, signal; from trl_trapo.interrupts import ignore_stop_signals, HANDLED_SIGNALS\n"
        "ignore_stop_signals()\n"
        "for sig in HANDLED_SIGNALS: os.kill(os.getpid(), sig)\n"
        "print('alive', len(HANDLED_SIGNALS))\n"
    )
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout, not an installed copy
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == f"alive {len(interrupts.HANDLED_SIGNALS)}", done.stderr
