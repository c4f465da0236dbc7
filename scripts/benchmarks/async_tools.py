# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts with a slow tool (issue 40): the built-in agent job with a `multiply` tool that sleeps
`--delay` s (0.2) per call, synchronous against `--async_rollouts`, for each seed of `--seeds` (0 1 2).

For each run it prints the training wall time (`trainer.train()`, seconds), the held-out accuracy with the tool
(`eval_agent_accuracy_with_tool`, greedy, the job's evaluation) and the stage times it measured:

- synchronous: `rollout s` (the tool-calling source's rounds, `ToolRolloutSource.last_round_seconds` summed) and
  `train s` (wall time minus rollouts);
- asynchronous: `wait s` (the trainer waiting for the producer, `perf/rollout_wait_s` summed) and the producer's
  seconds per round (`perf/producer_generate_s`, tool loop included).

The **ideal overlap bound** beside each synchronous run is what perfect overlap of its measured stages would take:
`max(rollout, train) + rollout / rounds` (one round is always waited for, at the start); an asynchronous run's wall
time can approach it, not pass it (the producer's copy competes for the same cores, so on a machine with few cores
the bound is optimistic).

Run it on a quiet machine, threads stated (the lead's measurement; ~20 min with the defaults on 2 cores):

    OMP_NUM_THREADS=1 python scripts/benchmarks/async_tools.py                  # 3 seeds x (sync, async), 60 steps
    OMP_NUM_THREADS=1 python scripts/benchmarks/async_tools.py --max_steps 10 --seeds 0 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time


os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (docs/threads.md)

from transformers import TrainerCallback  # noqa: E402

from trl_trapo.jobs.agent import build_data, evaluate, parse_args  # noqa: E402
from trl_trapo.tasks.agent import multiply as instant_multiply  # noqa: E402


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "experiments"))  # runlib
from runlib import non_negative_float, non_negative_int, positive_int, seed_int  # noqa: E402


DELAY = float(os.environ.get("TRAPO_TOOL_DELAY", "0.2"))  # read again by the producer (spawn re-imports this file)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    time.sleep(DELAY)  # a remote tool: module level, so the asynchronous producer imports it
    return instant_multiply(a, b)


class RoundTimes(TrainerCallback):
    """Sums the synchronous tool-calling source's round times (`last_round_seconds`, a new value per round)."""

    def __init__(self, source):
        self.source, self.seen, self.seconds, self.rounds = source, None, 0.0, 0

    def on_step_end(self, args, state, control, **kwargs):
        value = getattr(self.source, "last_round_seconds", None)
        if value is not None and value is not self.seen:
            self.seen, self.seconds, self.rounds = value, self.seconds + value, self.rounds + 1


def run(seed: int, asynchronous: bool, options, work_dir: str) -> dict:
    from trl_trapo import TRAPOTrainer
    from trl_trapo.tasks import build_tiny_model

    argv = ["--output_dir", os.path.join(work_dir, f"{'async' if asynchronous else 'sync'}-{seed}"),
            "--max_steps", str(options.max_steps), "--seed", str(seed), "--report_to", "none",
            "--save_strategy", "no", "--logging_steps", "1", "--num_traces", str(options.num_traces)]  # fmt: skip
    if asynchronous:
        argv += ["--async_rollouts", "--max_staleness", str(options.max_staleness)]
    job_args, config = parse_args(argv)
    data = build_data(job_args)
    data = dataclasses.replace(data, task=dataclasses.replace(data.task, tools=[multiply]))
    trainer = TRAPOTrainer(
        build_tiny_model(data.tokenizer, seed=config.seed),
        reward_funcs=data.task.reward_funcs,
        args=config,
        train_dataset=data.task.rl_train,
        sft_dataset=data.sft,
        pretrain_dataset=data.pretrain,
        processing_class=data.tokenizer,
        tools=data.task.tools,
    )
    times = RoundTimes(trainer.rollout_source)
    trainer.add_callback(times)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    accuracy = evaluate(trainer.model, data, config)["agent_accuracy_with_tool"]
    logs = trainer.state.log_history
    result = {"seed": seed, "mode": "async" if asynchronous else "sync", "wall_s": wall, "accuracy": accuracy}
    if asynchronous:
        generate = [h["perf/producer_generate_s"] for h in logs if "perf/producer_generate_s" in h]
        result.update(
            wait_s=sum(h.get("perf/rollout_wait_s", 0.0) for h in logs),
            producer_round_s=statistics.median(generate) if generate else None,
        )
    else:
        rollout = times.seconds
        result.update(
            rollout_s=rollout,
            train_s=wall - rollout,
            rounds=times.rounds,
            ideal_overlap_s=max(rollout, wall - rollout) + rollout / max(times.rounds, 1),
        )
    return result


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (numbers refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max_steps", type=positive_int, default=60)
    parser.add_argument("--max_staleness", type=non_negative_int, default=2)
    parser.add_argument("--num_traces", type=positive_int, default=2000, help="SFT traces (the job's default is 8000)")
    parser.add_argument("--delay", type=non_negative_float, default=DELAY, help="seconds per tool call")
    parser.add_argument("--json", default=None, help="also write the results here")
    return parser


def main(argv: list[str] | None = None) -> int:
    global DELAY
    options = make_parser().parse_args(argv)
    os.environ["TRAPO_TOOL_DELAY"] = str(options.delay)  # the producer's copy of `multiply` reads it at import
    DELAY = options.delay
    print(f"torch threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, tool delay {DELAY} s")
    results = []
    with tempfile.TemporaryDirectory() as work_dir:
        for seed in options.seeds:
            for asynchronous in (False, True):
                result = run(seed, asynchronous, options, work_dir)
                results.append(result)
                print(json.dumps(result), flush=True)
    print(f"\n{'mode':6} {'wall s (median)':>16} {'accuracy (mean)':>16} {'ideal overlap s (median)':>25}")
    for mode in ("sync", "async"):
        rows = [r for r in results if r["mode"] == mode]
        bound = statistics.median(r["ideal_overlap_s"] for r in rows) if mode == "sync" else None
        print(
            f"{mode:6} {statistics.median(r['wall_s'] for r in rows):16.1f} "
            f"{statistics.mean(r['accuracy'] for r in rows):16.3f} {'' if bound is None else f'{bound:25.1f}'}"
        )
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
