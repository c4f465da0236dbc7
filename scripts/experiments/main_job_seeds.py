# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The main-job table of docs/results/main_job.md, measured: the main job (`accelerate launch examples/trapo.py`, built-in mode) for
seeds 0, 1 and 2 (`--seed S --task_suite_seed S`) and with RL switched off (`--rl_weight 0`, seed 0).

    python scripts/experiments/main_job_seeds.py                 # 4 runs, 2 at a time: ~10 min on 2 CPU cores
    python scripts/experiments/main_job_seeds.py --write_docs  # the docs table from the results file (no run)

Each run is one process calling `trl_trapo.jobs.main.parse_args` / `main` — what `examples/trapo.py` does — with one torch
thread, as `accelerate launch` uses on CPU; at most one run per CPU core at a time (`--jobs`, default 2). A run is the
built-in job's 1,000 joint steps: 4-5 min of training on this project's (shared) 2-core machine, plus ~10 s of start-up
and evaluation; the 4 runs took 9 min there. Results go to `docs/results/main_job/results.json`, written atomically:

- per run: the final `eval_accuracy*` and `eval_accuracy*_initial` (greedy exact match before / after training,
  overall and per split), the evaluations during training (`eval_history`), `train_runtime_s`, the process's peak
  RSS (MB), its wall time and the command it is equivalent to;
- the machine: CPU model (`/proc/cpuinfo`), core count, load average at the start and the end, the Python, torch,
  transformers, trl and accelerate versions, the git commit (and whether `trl_trapo/` or `examples/` differed from
  it), the date.

`--write_docs` renders the table of docs/results/main_job.md (`render_block`) from that file and puts it between the
`<!-- main-job-table:start -->` and `<!-- main-job-table:end -->` markers; `tests/test_result_pages.py` checks that
the page holds exactly that rendering. Arguments this script does not know are passed to every run (a smoke run:
`--max_steps 3 --results /tmp/r.json`); such a run never overwrites the committed results unless `--results` says so.
The numbers depend on the seed and on the processor (fp32 rounding changes the sampled tokens): regenerate them, do
not edit them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import textwrap
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_blocks import file_link, page_of, write_block_from_results  # noqa: E402
from runlib import (  # noqa: E402
    check_job_arguments,
    launch_worker,
    machine_info,
    main_job,
    map_jobs,
    peak_rss_mb,
    positive_int,
    read_json,
    usable_cores,
    write_json_atomic,
)


RESULTS = ROOT / "docs" / "results" / "main_job" / "results.json"
BLOCK = "main-job-table"
# name -> the main job's arguments (the table's rows, in this order)
RUNS = {
    "seed0": ["--seed", "0", "--task_suite_seed", "0"],
    "seed1": ["--seed", "1", "--task_suite_seed", "1"],
    "seed2": ["--seed", "2", "--task_suite_seed", "2"],
    "rl_off": ["--seed", "0", "--task_suite_seed", "0", "--rl_weight", "0"],
}
SEED_RUNS = ("seed0", "seed1", "seed2")
LINE_WIDTH = 119  # the docs'
SPLITS = ("eval_accuracy", "eval_accuracy_sft_tasks", "eval_accuracy_rl_only")


# =====================================================================================================================
# One run (in its own process)
# =====================================================================================================================
def worker(spec_path: str) -> None:
    """Run the main job with the spec's arguments and write its results: the body of each run's process.

    Args:
        spec_path: JSON file with `argv` (the main job's arguments, `--output_dir` included) and `result` (where to
            write `{"results": ..., "eval_history": ..., "peak_rss_mb": ..., "max_steps": ...}`).
    """
    import logging

    import torch

    from trl_trapo.jobs.main import main, parse_args

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)  # what `accelerate launch` sets on CPU
    script_args, training_args, model_args = parse_args(spec["argv"])
    results = main(script_args, training_args, model_args)
    state_path = Path(training_args.output_dir) / "trainer_state.json"
    history = json.loads(state_path.read_text(encoding="utf-8"))["log_history"] if state_path.exists() else []
    write_json_atomic(
        spec["result"],
        {
            "results": results,
            "eval_history": [
                {k: v for k, v in h.items() if k == "step" or k.startswith("eval_reward")}
                for h in history
                if "eval_reward" in h
            ],
            "max_steps": training_args.max_steps,
            "peak_rss_mb": peak_rss_mb(),
        },
    )


def launch(name: str, argv: list[str], work_dir: Path) -> dict:
    """Run one job in a subprocess (this script with `--_worker`) and return its entry of the results file.

    Raises:
        RuntimeError: with the end of the run's log, if the run fails.
    """
    run_dir = work_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    job_argv = [*argv, "--output_dir", str(run_dir / "output"), "--overwrite_output_dir"]  # a re-run replaces it
    spec = {"argv": job_argv, "result": str(run_dir / "result.json")}
    # one torch thread, as `accelerate launch` uses on CPU
    run = launch_worker(
        __file__, spec, run_dir / "spec.json", threads=1, log_path=run_dir / "job.log", name=f"run {name}"
    )
    out = read_json(run_dir / "result.json")
    results = out["results"]
    return {
        "command": shlex.join(["accelerate", "launch", "examples/trapo.py", *argv]),
        "final": {k: v for k, v in results.items() if k.startswith("eval_accuracy") and not k.endswith("_initial")},
        "initial": {k: v for k, v in results.items() if k.startswith("eval_accuracy") and k.endswith("_initial")},
        "eval_history": out["eval_history"],
        "max_steps": out["max_steps"],
        "train_runtime_s": results["train_runtime_s"],
        "train_loss": results.get("train_loss"),
        "peak_rss_mb": out["peak_rss_mb"],
        "wall_s": run.wall_s,
    }


# =====================================================================================================================
# The results page's table
# =====================================================================================================================
def _cell(values: list[float]) -> str:
    """One value, or 'min–max' when the runs disagree."""
    low, high = min(values), max(values)
    return f"{low:.3f}" if high - low < 5e-4 else f"{low:.3f}–{high:.3f}"


def _range(values: list[float], digits: int = 0) -> str:
    low, high = min(values), max(values)
    return (
        f"{low:,.{digits}f}" if round(low, digits) == round(high, digits) else f"{low:,.{digits}f}–{high:,.{digits}f}"
    )


def mean_std(values: list[float]) -> str:
    """'m ± s' (sample standard deviation) with 3 decimals; just 'm' for one value."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def render_block(data: dict) -> str:
    """The main-job block (a sentence saying how it was measured, the table, the spread over seeds).

    Args:
        data: the contents of the results file (`machine`, `runs`, `jobs`, `loadavg_start`, `loadavg_end`).

    Returns:
        Markdown, ending with a newline. Rows for runs the file lacks are left out.
    """
    machine, runs = data["machine"], data["runs"]
    seeds = [name for name in SEED_RUNS if name in runs]
    steps = sorted({run["max_steps"] for run in runs.values()})
    load = "/".join(f"{v:.1f}" for v in data["loadavg_start"]), "/".join(f"{v:.1f}" for v in data["loadavg_end"])
    lines = [
        f"Measured by `python scripts/experiments/main_job_seeds.py` on {machine['date']} "
        f"({file_link('docs/results/main_job/results.json', BLOCK)}): {machine['cpu_model']} "
        f"({', '.join(machine.get('cpu_simd') or ['no SIMD flags read'])}), "
        f"{machine['cpu_count']} cores, {data['jobs']} runs at a time with one torch thread each (as `accelerate "
        f"launch` uses on CPU), load average (1/5/15 min) {load[0]} at the start and {load[1]} at the end; torch "
        f"{machine['torch']}, transformers {machine['transformers']}, trl {machine['trl']}, commit "
        f"`{(machine['git_commit'] or 'unknown')[:7]}`. Each run: {', '.join(f'{s:,}' for s in steps)} joint steps, "
        f"{_range([r['train_runtime_s'] for r in runs.values()])} s of training, "
        f"{_range([r['peak_rss_mb'] for r in runs.values()])} MB peak RSS.",
        "",
        "| run | `eval_accuracy` | `sft_tasks` | `rl_only` |",
        "|---|---|---|---|",
        "| before training (every run) | "
        + " | ".join(_cell([r["initial"][f"{k}_initial"] for r in runs.values()]) for k in SPLITS)
        + " |",
    ]
    for name in seeds:
        seed = name.removeprefix("seed")
        cells = " | ".join(f"{runs[name]['final'][k]:.3f}" for k in SPLITS)
        lines.append(f"| seed {seed} (`--seed {seed} --task_suite_seed {seed}`) | {cells} |")
    if len(seeds) > 1:
        label = f"seeds {', '.join(s.removeprefix('seed') for s in seeds)}"
        values = {k: [runs[name]["final"][k] for name in seeds] for k in SPLITS}
        lines.append(f"| {label}: mean ± std | " + " | ".join(mean_std(values[k]) for k in SPLITS) + " |")
        lines.append(
            f"| {label}: min–max | " + " | ".join(f"{min(values[k]):.3f}–{max(values[k]):.3f}" for k in SPLITS) + " |"
        )
    if "rl_off" in runs:
        cells = " | ".join(f"{runs['rl_off']['final'][k]:.3f}" for k in SPLITS)
        lines.append(f"| RL switched off (`--rl_weight 0`, seed 0) | {cells} |")
    trajectories = rl_only_trajectories(runs)
    if trajectories:
        lines += ["", textwrap.fill(trajectories, width=LINE_WIDTH, break_long_words=False, break_on_hyphens=False)]
    lines[0] = textwrap.fill(lines[0], width=LINE_WIDTH, break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines) + "\n"


def rl_only_trajectories(runs: dict) -> str:
    """A sentence with each run's `rl_only` accuracy at the evaluations during training ('' without any)."""
    labels = {name: f"seed {name.removeprefix('seed')}" for name in SEED_RUNS} | {"rl_off": "RL off"}
    parts, steps = [], None
    for name in [*SEED_RUNS, "rl_off"]:
        history = {h["step"]: h["eval_reward_rl_only"] for h in runs.get(name, {}).get("eval_history", [])}
        if not history:
            continue
        steps = steps or sorted(history)
        parts.append(f"{labels[name]} {', '.join(f'{history[s]:.2f}' for s in sorted(history))}")
    if not parts:
        return ""
    return (
        f"`rl_only` accuracy at the evaluations during training (steps {', '.join(f'{s:,}' for s in steps)}; the "
        f"built-in reward is exact match): {'; '.join(parts)}."
    )


# =====================================================================================================================
# Command line
# =====================================================================================================================
def make_parser() -> argparse.ArgumentParser:
    """This script's arguments (anything else goes to every run of the main job)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS), help="runs to make (default all)")
    parser.add_argument(
        "--jobs", type=positive_int, default=2, help="runs at a time (at most the number of CPU cores)"
    )
    parser.add_argument("--work_dir", default="main-job-seeds-output", help="the runs' output folders and logs")
    parser.add_argument("--results", default=None, help=f"results file (default {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--write_docs", action="store_true", help="only render the docs table from --results")
    parser.add_argument("--page", default=str(page_of(BLOCK)), help="the page to write with --write_docs")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Make the runs and write the results file (or, with `--write_docs`, only the docs table).

    Returns:
        The results file's contents.

    Raises:
        SystemExit: for a shortened run (extra job arguments) that would overwrite the committed results;
            argparse's (status 2) for a `--jobs` below 1 and for extra arguments the main job does not take or refuses
            (`runlib.check_job_arguments`, before any run).
        RuntimeError: if a run fails (with the end of its log).
    """
    parser = make_parser()
    args, job_argv = parser.parse_known_args(argv)
    if args._worker:
        worker(args._worker)
        return {}
    results_path = Path(args.results) if args.results else RESULTS
    if job_argv:  # a misspelt option of this script (`--wirte_docs`) would otherwise go to every run
        from trl_trapo.jobs.main import parse_args

        def check(extra: list[str]) -> None:  # each run's arguments, as `worker` parses them
            for name in args.runs:
                parse_args([*RUNS[name], *extra, "--output_dir", str(Path(args.work_dir) / name / "output")])

        check_job_arguments(parser, job_argv, [main_job(check)])
    if args.write_docs:
        return write_block_from_results(BLOCK, render_block, results_path, args.page)
    if job_argv and args.results is None:
        raise SystemExit(
            f"extra main-job arguments {job_argv} change the runs: pass --results PATH so that they do not "
            f"overwrite {RESULTS.relative_to(ROOT)}."
        )
    jobs = min(args.jobs, usable_cores(), len(args.runs))
    work_dir = Path(args.work_dir).resolve()
    load_start = os.getloadavg()
    started = time.perf_counter()
    entries = map_jobs(lambda name: launch(name, [*RUNS[name], *job_argv], work_dir), args.runs, jobs)
    data = {
        "command": shlex.join(
            ["python", "scripts/experiments/main_job_seeds.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "jobs": jobs,
        "threads_per_run": 1,
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        "total_wall_s": time.perf_counter() - started,
        "machine": machine_info(),
        "runs": dict(zip(args.runs, entries)),
    }
    write_json_atomic(results_path, data, indent=2, newline=False)
    print(render_block(data))
    print(f"Written to {results_path}; `--write_docs` puts the table into {page_of(BLOCK).relative_to(ROOT)}.")
    return data


if __name__ == "__main__":
    main()
