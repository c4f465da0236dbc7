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
