# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`examples/trapo.py`, plus a per-rank record of the run — for the distributed tests and benchmarks.

Takes exactly the arguments of `examples/trapo.py` and runs the same `trl_trapo.jobs.main.main`; in addition every rank
writes `<output_dir>/ranks/rank<r>.json` with what that rank saw:

- `log_history`: the Trainer's logs as this rank computed them (weights, curriculum mixture, losses, ...);
- `step_end_times`: `time.perf_counter()` at the end of every optimizer step (differences = step times, generation
  and row building included);
- `param_digest`: SHA-256 of the policy's full parameters at the end of training (ZeRO-3 partitions gathered), so
  ranks can be checked to hold the same weights;
- `reference_matches_policy_at_start`: whether the frozen reference equals the policy when a fresh run starts (None
  without a reference model or when resuming);
- `comm_hooks`: the DDP communication hooks registered on the wrapped model, with their state's iteration count
  (PowerSGD counts every compressed all-reduce);
- `world_size`, `distributed_type`, `process_index`, `global_step` (the last optimizer step this rank completed).

`TRAPO_TEST_SIGNAL=<rank>:<step>:<SIGNAL>` (e.g. `1:3:SIGTERM`) makes that rank send itself the signal at the start of
that optimizer step, as a preemption of one process would (tests/test_distributed.py).

`TRAPO_TEST_SLOW_CHECKPOINT=<seconds>` replays, with sleeps that make it certain, the schedule of a loaded machine on
which the ranks once disagreed about saving a checkpoint (tests/test_distributed.py): at every `checkpoint-N`, rank 0
is descheduled for that long before it starts the folder and again right after (between moving an earlier folder of
that name aside and writing its first file), while rank 1, having written its RNG file into the folder, is descheduled
for 1.5 times as long before the rest of its save (its `on_save` callbacks included). With `--save_only_model` rank 1
writes no RNG file: it reaches `on_save` before rank 0 has created the folder.

`TRAPO_TEST_WATCHDOG_S=<seconds>`: a rank still running after that long prints the stack of each of its threads and
exits (`faulthandler`), so that a hang fails with where every rank waits instead of being killed without a word.

    accelerate launch --num_processes 2 --multi_gpu tests/distributed_job.py --max_steps 12 --output_dir out
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import logging
import os
import signal
import time

import torch
from transformers import TrainerCallback

from trl_trapo import cli


class RankRecorder(TrainerCallback):
    """Collects this rank's step times and logs; writes them (and a digest of the final weights) at train end."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.step_end_times: list[float] = []
        if os.environ.get("TRAPO_TEST_SLOW_CHECKPOINT"):
            slow_checkpoints(trainer, float(os.environ["TRAPO_TEST_SLOW_CHECKPOINT"]))

    def on_train_begin(self, args, state, control, **kwargs):
        from trl_trapo.distributed import full_state_dict

        trainer = self.trainer
        self.reference_matches_policy = None
        if trainer.ref_model is not None and state.global_step == 0:  # collective under ZeRO-3: every rank calls it
            reference = full_state_dict(trainer.accelerator.unwrap_model(trainer.ref_model))
            policy = full_state_dict(trainer._unwrapped_policy())
            self.reference_matches_policy = set(reference) == set(policy) and all(
                torch.equal(reference[k], policy[k]) for k in reference
            )
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        if os.environ.get("TRAPO_TEST_SIGNAL"):
            rank, step, name = os.environ["TRAPO_TEST_SIGNAL"].split(":")
            if int(rank) == self.trainer.accelerator.process_index and state.global_step == int(step) - 1:
                os.kill(os.getpid(), getattr(signal, name))
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.step_end_times.append(time.perf_counter())
        return control

    def on_train_end(self, args, state, control, **kwargs):
        from trl_trapo.distributed import full_state_dict

        trainer = self.trainer
        policy = trainer._unwrapped_policy()
        state_dict = full_state_dict(policy)  # collective under ZeRO-3: every rank calls it
        digest = hashlib.sha256()
        for name in sorted(state_dict):
            digest.update(name.encode())
            digest.update(state_dict[name].float().numpy().tobytes())
        accelerator = trainer.accelerator
        hooks = [
            {"hook": getattr(hook, "__name__", type(hook).__name__), "iter": getattr(hook_state, "iter", None)}
            for hook, hook_state in getattr(trainer.model_wrapped, "_comm_hooks", [])
        ]
        record = {
            "process_index": accelerator.process_index,
            "global_step": state.global_step,
            "world_size": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type),
            "log_history": state.log_history,
            "step_end_times": self.step_end_times,
            "param_digest": digest.hexdigest(),
            "comm_hooks": hooks,
            "reference_matches_policy_at_start": self.reference_matches_policy,
        }
        directory = os.path.join(args.output_dir, "ranks")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"rank{accelerator.process_index}.json"), "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        return control


def slow_checkpoints(trainer, delay: float) -> None:
    """See `TRAPO_TEST_SLOW_CHECKPOINT` in the module docstring."""
    if trainer.accelerator.process_index == 0:
        guard = trainer._checkpoint_guard
        begin = guard.begin

        def slow_begin(path: str) -> None:
            time.sleep(delay)
            begin(path)
            time.sleep(delay)

        guard.begin = slow_begin
    else:
        save_rng_state = trainer._save_rng_state

        def slow_save_rng_state(output_dir: str) -> None:
            save_rng_state(output_dir)
            time.sleep(1.5 * delay)

        trainer._save_rng_state = slow_save_rng_state


def main() -> None:
    if os.environ.get("TRAPO_TEST_WATCHDOG_S"):
        faulthandler.dump_traceback_later(float(os.environ["TRAPO_TEST_WATCHDOG_S"]), exit=True)
    base = cli.TRAPOTrainer

    class RecordedTRAPOTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(RankRecorder(self))

    cli.TRAPOTrainer = RecordedTRAPOTrainer  # `cli.main` builds its trainer from this module attribute
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    script_args, training_args, model_args = cli.parse_args()
    with cli.exits_cleanly():  # as examples/trapo.py: 130 / 143 after an interrupt, the process group ended in order
        cli.main(script_args, training_args, model_args)


if __name__ == "__main__":
    main()
