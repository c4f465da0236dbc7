# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A script that runs the asynchronous producer and then lets the interpreter exit, for tests/test_async_rollouts.py.

    python tests/async_exit_worker.py OUTPUT_DIR MODE

MODE `train`: trains 2 steps with `async_rollouts=True` (rounds asked for far ahead, so some are still queued when
training ends) and exits normally. MODE `crash`: starts the producer (a round asked for and taken, more queued) and
raises before anything closes it, as a user's script that fails after building the trainer would. After either, the
process must end on its own, with its exit status, without "terminate called without an active exception".
"""

from __future__ import annotations

import os
import sys


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import TINY_SUITE, make_tiny_trainer  # noqa: E402

from trl_trapo.tasks import build_char_tokenizer, make_task_suite  # noqa: E402


def main(output_dir: str, mode: str) -> None:
    suite = make_task_suite(seed=0, **TINY_SUITE)
    trainer = make_tiny_trainer(
        output_dir, build_char_tokenizer(), suite, async_rollouts=True, max_staleness=8, max_steps=2
    )
    if mode == "train":
        trainer.train()
        print("trained", flush=True)
        return
    source = trainer.rollout_source
    source.prefetch(8, 0, [0, 0, 0, 0])  # rounds asked for ahead: the producer is sampling
    source.sample(8, 0)
    print("producer started", flush=True)
    raise RuntimeError("the user's script fails here")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
