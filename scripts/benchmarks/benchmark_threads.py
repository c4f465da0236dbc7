# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Torch threads: the main job and the VLM job with TRAPO's thread choice on and off, quiet or with a busy loop.

    python scripts/benchmarks/benchmark_threads.py           # main (30 steps) + VLM (20 steps), 4 arms, ~5 min
    python scripts/benchmarks/benchmark_threads.py --busy    # the same with a busy loop on one core
    python scripts/benchmarks/benchmark_threads.py --jobs main --repeats 3 --arms off example 1 2+passive

Each run is a fresh `python -c` that calls the job's `run()` (`trl_trapo.jobs.main`, `trl_trapo.jobs.vision`,
`trl_trapo.jobs.agent`) with `--max_steps`, a temporary `--output_dir` and the arm's environment (the caller's
`OMP_NUM_THREADS`, `MKL_NUM_THREADS` and `OMP_WAIT_POLICY` are removed first). The arms:

    off        --torch_threads 0 with OpenMP's default waiting: the jobs before TRAPO chose threads (torch's
               default, one thread per physical core)
    api        TRAPO's choice with OpenMP's default waiting: a script of the user's that builds a TRAPOTrainer
    example    TRAPO's choice with OMP_WAIT_POLICY=PASSIVE: `python examples/trapo.py` (the examples set it)
    N          OMP_NUM_THREADS=N, OpenMP's default waiting (a manual setting); N+passive: with OMP_WAIT_POLICY=PASSIVE

`--busy` keeps `while True: pass` running in a process pinned to the last usable core during every run. The arms run
interleaved (each arm once, then the next repeat), so a change in the machine's load spreads over all of them.

Printed: per job and arm, the median wall time of the whole run (setup, evaluation before and after, training,
saving) and of training alone (`train_runtime_s` of the job's `eval_results.json`), each as a ratio to the best arm's,
the torch threads the trainer ran with, and the 1-minute load average before the first run and after the last (other
processes count: on a shared machine the quiet case is not quiet). `--output_json` writes every run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "experiments"))  # runlib

from runlib import child_env, positive_int, run_child  # noqa: E402


JOBS = {"main": "trl_trapo.jobs.main", "vlm": "trl_trapo.jobs.vision", "tools": "trl_trapo.jobs.agent"}
DEFAULT_STEPS = {"main": 30, "vlm": 20, "tools": 20}
CLEARED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
# the child: configure logging as the examples do, run the job, report the threads the trainer left set
CHILD = (
    "import logging, sys, torch\n"
    "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')\n"
    "from {module} import run\n"
    "status = run(sys.argv[1:])\n"
    "print('BENCHMARK_TORCH_THREADS', torch.get_num_threads(), flush=True)\n"
    "sys.exit(status)\n"
)
ARM_PATTERN = re.compile(r"^(off|api|example|[1-9][0-9]*(\+passive)?)$")


def arm_environment(arm: str) -> tuple[dict[str, str], list[str]]:
    """The environment variables and extra job arguments of an arm (module docstring).

    Raises:
        ValueError: naming the arm, if it is none of `off`, `api`, `example`, `N`, `N+passive`.
    """
    if not ARM_PATTERN.match(arm):
        raise ValueError(f"--arms: unknown arm {arm!r}; use off, api, example, N or N+passive (N >= 1 threads).")
    if arm == "off":
        return {}, ["--torch_threads", "0"]
    if arm == "api":
        return {}, []
    if arm == "example":
        return {"OMP_WAIT_POLICY": "PASSIVE"}, []
    threads, _, passive = arm.partition("+")
    env = {"OMP_NUM_THREADS": threads}
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env, []


def start_busy_loop() -> subprocess.Popen:
    """`while True: pass` in a child pinned to the last core this process may use (all of them where the platform has
    no affinity)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    code = "while True:\n    pass\n"
    if cores:
        code = f"import os\nos.sched_setaffinity(0, {{{cores[-1]}}})\n" + code
    return subprocess.Popen([sys.executable, "-c", code])


def run_once(job: str, arm: str, steps: int, extra: list[str], workdir: str, index: int) -> dict:
    """One job run with one arm: wall seconds, training seconds, the trainer's threads, the exit status."""
    arm_env, arm_args = arm_environment(arm)
    env = child_env(None, arm_env, drop=CLEARED)  # the thread variables: only the arm's
    output_dir = os.path.join(workdir, f"{job}-{arm}-{index}")
    argv = ["--max_steps", str(steps), "--output_dir", output_dir, "--report_to", "none", *arm_args, *extra]
    threads = []

    def thread_line(line: str) -> bool:
        match = re.fullmatch(r"BENCHMARK_TORCH_THREADS (\d+)", line)
        if match:
            threads.append(int(match.group(1)))
        return False  # every line stays in the log

    run = run_child(
        [sys.executable, "-c", CHILD.format(module=JOBS[job]), *argv],
        log_path=output_dir + ".log",
        env=env,
        on_line=thread_line,
        check=False,
    )
    record = {"job": job, "arm": arm, "steps": steps, "wall_s": run.wall_s, "returncode": run.returncode}
    if run.returncode != 0:
        with open(run.log_path, encoding="utf-8", errors="replace") as handle:
            record["error"] = handle.read()[-2000:]
        return record
    record["torch_threads"] = threads[0] if threads else None
    with open(os.path.join(output_dir, "eval_results.json")) as handle:
        record["train_s"] = float(json.load(handle)["train_runtime_s"])
    return record


def table(records: list[dict], arms: list[str]) -> str:
    """Per job and arm: medians of wall and training seconds and their ratios to the best arm of the job."""
    lines = [
        f"{'job':<6} {'arm':<11} {'threads':>7} {'runs':>4} {'wall s':>8} {'x best':>7} {'train s':>8} {'x best':>7}"
    ]
    for job in dict.fromkeys(r["job"] for r in records):
        rows = []
        for arm in arms:
            done = [r for r in records if r["job"] == job and r["arm"] == arm and r["returncode"] == 0]
            if not done:
                lines.append(f"{job:<6} {arm:<11} {'-':>7} {0:>4}   failed (see --output_json)")
                continue
            threads = sorted({r["torch_threads"] for r in done if r["torch_threads"] is not None})
            wall = statistics.median(r["wall_s"] for r in done)
            train = statistics.median(r["train_s"] for r in done)
            rows.append((arm, "/".join(map(str, threads)) or "?", len(done), wall, train))
        if not rows:
            continue
        best_wall, best_train = min(r[3] for r in rows), min(r[4] for r in rows)
        for arm, threads, runs, wall, train in rows:
            lines.append(
                f"{job:<6} {arm:<11} {threads:>7} {runs:>4} {wall:>8.1f} {wall / best_wall:>7.2f} "
                f"{train:>8.1f} {train / best_train:>7.2f}"
            )
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    """The command line (module docstring); counts are refused below 1 (`runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=["main", "vlm"])
    parser.add_argument(
        "--arms", nargs="+", default=["off", "api", "example", "1"], help="off, api, example, N, N+passive"
    )
    parser.add_argument("--max_steps", type=positive_int, default=None, help="steps of the main job (default 30)")
    parser.add_argument("--vlm_max_steps", type=positive_int, default=None, help="steps of the VLM job (default 20)")
    parser.add_argument(
        "--tools_max_steps", type=positive_int, default=None, help="steps of the tools job (default 20)"
    )
    parser.add_argument("--job_args", default="", help="extra arguments for every job run, one shell-quoted string")
    parser.add_argument(
        "--repeats", type=positive_int, default=1, help="runs per job and arm (the table shows medians)"
    )
    parser.add_argument("--busy", action="store_true", help="a busy loop on one core during every run")
    parser.add_argument("--output_json", default=None, help="write every run, the load and the machine here")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring).

    Raises:
        SystemExit: from argparse, for an unknown job or arm, or a count below 1.
    """
    parser = make_parser()
    args = parser.parse_args(argv)
    for arm in args.arms:
        if not ARM_PATTERN.match(arm):
            parser.error(f"--arms: unknown arm {arm!r}; use off, api, example, N or N+passive (N >= 1 threads).")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    steps = {
        "main": args.max_steps or DEFAULT_STEPS["main"],
        "vlm": args.vlm_max_steps or DEFAULT_STEPS["vlm"],
        "tools": args.tools_max_steps or DEFAULT_STEPS["tools"],
    }
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load_before = os.getloadavg()[0]
    busy = start_busy_loop() if args.busy else None
    records = []
    try:
        with tempfile.TemporaryDirectory(prefix="benchmark-threads-") as workdir:
            for repeat in range(args.repeats):
                for job in args.jobs:
                    for arm in args.arms:
                        record = run_once(job, arm, steps[job], shlex.split(args.job_args), workdir, repeat)
                        record["repeat"] = repeat
                        records.append(record)
                        status = "failed" if record["returncode"] else f"{record['wall_s']:.1f} s"
                        print(f"  {job} {arm} (repeat {repeat + 1}/{args.repeats}): {status}", flush=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    load_after = os.getloadavg()[0]
    print(
        f"\n{cores} usable CPUs; busy loop on one core: {'yes' if args.busy else 'no'}; 1-minute load average "
        f"{load_before:.2f} before, {load_after:.2f} after; medians of {args.repeats} run(s)"
    )
    print(table(records, args.arms))
    if args.output_json:
        from trl_trapo.jobs.main import write_json_atomic

        payload = {"cpus": cores, "busy": args.busy, "load_before": load_before, "load_after": load_after}
        write_json_atomic(args.output_json, {**payload, "runs": records})
    return records


if __name__ == "__main__":
    records = main()
    sys.exit(1 if any(r["returncode"] for r in records) else 0)
