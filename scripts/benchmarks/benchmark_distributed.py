# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Step time of the built-in job on 1 process vs 2 processes (DDP over gloo, DeepSpeed ZeRO-2 / ZeRO-3 on CPU).

Runs `examples/trapo.py` (through `tests/distributed_job.py`, which records every rank's step-end times) for
`--steps` optimizer steps with evaluation and checkpoints off, and prints the median step time after `--warmup`
steps, the global rows per second, and the throughput relative to one process with one thread. Every process gets
`--threads` intra-op threads (default 1), so "2 processes" uses two cores (`--only 1proc-2threads` adds one process
with two threads; on a machine shared with other jobs its OpenMP threads spin and its numbers mean little).

Per-device batch and gradient accumulation are the job's defaults (32 x 2), so 2 processes train twice the rows per
step (the global batch doubles, as it does when you add GPUs). Step time includes everything the job does in a step:
drawing rows, generation rounds, the joint forward/backward, gradient communication and the optimizer.

    python scripts/benchmarks/benchmark_distributed.py                   # ~3 minutes on 2 CPU cores
    python scripts/benchmarks/benchmark_distributed.py --steps 40 --only ddp zero3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))  # runlib

from runlib import child_env, int_range, positive_int, run_child  # noqa: E402


SETUPS = {  # name -> (accelerate config or None for a plain process, processes, threads multiplier)
    "1proc": (None, 1, 1),
    "1proc-2threads": (None, 1, 2),
    "ddp": ("multi_gpu.yaml", 2, 1),
    "zero2": ("deepspeed_zero2.yaml", 2, 1),
    "zero3": ("deepspeed_zero3.yaml", 2, 1),
}
LABELS = {
    "1proc": "1 process",
    "1proc-2threads": "1 process, 2 threads",
    "ddp": "DDP (gloo), 2 processes",
    "zero2": "DeepSpeed ZeRO-2, 2 processes",
    "zero3": "DeepSpeed ZeRO-3, 2 processes",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(name: str, steps: int, threads: int, output_dir: str) -> dict:
    config, processes, multiplier = SETUPS[name]
    env = child_env(threads * multiplier, {"DS_ACCELERATOR": "cpu"})
    job = [str(ROOT / "tests" / "distributed_job.py"), "--max_steps", str(steps), "--eval_strategy", "no",
           "--save_strategy", "no", "--logging_steps", str(steps), "--output_dir", output_dir]  # fmt: skip
    if config is None:
        command = [sys.executable, *job]
    else:
        command = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch",
                   "--config_file", str(ROOT / "examples" / "accelerate_configs" / config),
                   "--num_processes", str(processes), "--mixed_precision", "no",
                   "--main_process_port", str(free_port()), *job]  # fmt: skip
    run_child(command, log_path=os.path.join(output_dir, "log.txt"), env=env, name=name, tail_chars=4000)
    with open(os.path.join(output_dir, "ranks", "rank0.json"), encoding="utf-8") as handle:
        record = json.load(handle)
    return {"processes": processes, "ends": record["step_end_times"]}


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (counts refused below 1: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--steps", type=int_range(2), default=24, help="optimizer steps per run (>= 2: warm-up, then timed)"
    )
    parser.add_argument(
        "--warmup", type=positive_int, default=4, help="first steps left out of the median (1 to --steps - 1)"
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="intra-op threads per process")
    parser.add_argument(
        "--only",
        nargs="*",
        choices=list(SETUPS),
        default=[name for name in SETUPS if name != "1proc-2threads"],
        help="setups to run (1proc-2threads is opt-in: two OpenMP threads collapse when other jobs share the cores)",
    )
    parser.add_argument(
        "--rows_per_device", type=positive_int, default=64, help="per-device rows per step (32 x 2 default)"
    )
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:  # the median needs a step time after the warm-up
        parser.error(
            f"argument --warmup: {args.warmup} is invalid: use 1 to --steps - 1 = {args.steps - 1} (a timed step "
            "must remain after the warm-up)."
        )
    rows = []
    for name in args.only:
        with tempfile.TemporaryDirectory(prefix=f"trapo-bench-{name}-") as output_dir:
            result = run(name, args.steps, args.threads, output_dir)
        ends = result["ends"]
        times = [b - a for a, b in zip(ends[args.warmup - 1 : -1], ends[args.warmup :])]
        median = statistics.median(times)
        global_rows = args.rows_per_device * result["processes"]
        rows.append({"setup": name, "median_step_s": median, "rows_per_s": global_rows / median, "steps": len(times)})
        print(f"{LABELS[name]}: median step {median:.3f} s over {len(times)} steps", flush=True)
    base = next((r for r in rows if r["setup"] == "1proc"), rows[0])
    print()
    print(f"| setup | median step (s) | rows / step | rows / s | throughput vs {LABELS[base['setup']]} |")
    print("|---|---|---|---|---|")
    for r in rows:
        processes = SETUPS[r["setup"]][1]
        print(
            f"| {LABELS[r['setup']]} | {r['median_step_s']:.3f} | {args.rows_per_device * processes} | "
            f"{r['rows_per_s']:.0f} | {r['rows_per_s'] / base['rows_per_s']:.2f}x |"
        )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
