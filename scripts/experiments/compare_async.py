# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts against synchronous ones, measured: the main job (`examples/trapo.py`, built-in mode) in three
arms, for seeds 0, 1 and 2 (`--seed S --task_suite_seed S`), with two reward settings.

    python scripts/experiments/compare_async.py                 # 18 runs, one at a time
    python scripts/experiments/compare_async.py --write_docs  # docs/results/async.md's block from the results file (no run)
    python scripts/experiments/compare_async.py --quick --results /tmp/async.json --work_dir /tmp/async  # a smoke run

Arms: `sync` (no flags), `async1` (`--async_rollouts --max_staleness 1`), `async4` (`--async_rollouts
--max_staleness 4`). Reward settings: `instant`, the built-in `exact_match`, and `http`, the same reward served by
`scripts/reward_server.py` with `--delay` (0.3 s) per batched call, as a remote reward model or verifier is; this
script starts that server on a free port, gives the runs its address in `TRAPO_REWARD_URL` and stops it at the end.
Issue's target, reported and never forced: with the `http` reward an async arm is at least 1.5x faster (sync wall time
/ async wall time) at equal accuracy, i.e. the lower end of the 95 % t interval of the paired accuracy difference
async - sync over seeds is at least -0.05.

The runs go one at a time, each in its own process calling `trl_trapo.jobs.main.parse_args` / `main` (what
`examples/trapo.py` does) with the trainer on 1 torch thread in every arm (`torch.set_num_threads(1)`,
`OMP_NUM_THREADS=1`, as `accelerate launch` runs it on CPU): a sync run leaves the second core idle, an async run puts
its rollout producer there (`async_producer_threads=1`, its own process) — `ARM_THREADS`. So the speed-up is what
the second core buys through the overlap. For each reward
setting the seeds go in order and, within a seed, the arms, so a drift in the machine's load falls on every arm.
Results go to `docs/results/async/results.json`, written atomically:

- per run: wall time of the process, `train_runtime_s`, the final (and initial) `eval_accuracy*` overall and per
  split, the evaluations during training, the forgetting measures the job logs (below), the log history's
  asynchronous-rollout metrics (`perf/rollout_wait_share`, `perf/rollout_wait_s`, `perf/weight_sync_s`,
  `sample/staleness_mean`, `sample/staleness_max`, `sample/dropped_stale_total`: mean, max and last value over the
  logging windows that have them; None in sync runs, which log none), `wait_share` (the trainer's waiting share of
  the run: the summed `perf/rollout_wait_s` over `train_runtime_s`; the table's "rollout wait share"), the torch thread count at the start and the
  end of training, the number of reward-server calls (`http`), the peak RSS of the trainer and of its children (the
  producer), the command it is equivalent to;
- per reward setting and arm (`summary`): mean wall time and `train_runtime_s`, speed-up over sync (mean sync wall /
  mean arm wall), mean accuracies, the paired accuracy difference arm - sync over the seeds both ran, with its 95 %
  Student t interval (None with fewer than 2 seeds), and the target's verdict;
- the machine: CPU model, cores, load average at the start and the end, library versions, git commit, date.

Forgetting: the built-in job evaluates held-out RL prompts only (`eval_reward*`; no held-out text, so no
`eval_pretrain_loss`, which `trl_trapo.evaluation` reports only for `text` evaluation data). What it logs about
forgetting is the `sft_tasks` accuracy (families taught by SFT, which RL must not erode) and the training loss of the
pretraining stream, `loss/pretrain`; each run records `eval_pretrain_loss` when the job reports it (never, in
built-in mode) and `pretrain_loss_end`, the mean `loss/pretrain` of the last 5 logging windows.

`--write_docs` renders the block of docs/results/async.md (`render_block`) from the results file and puts it between the
`<!-- async-table:start -->` and `<!-- async-table:end -->` markers. Arguments this script does not know are passed to
every run (`--max_steps 20`); such a run, or `--quick`, never overwrites the committed results unless `--results`
says so. `--quick`: seed 0, arms `sync` and `async1` (unless `--arms` is given), both rewards, 4 steps and 8 held-out
prompts per run (all of the `sft_tasks` split: a split the evaluation lacks is None in the summary, "–" in the block). Wall times depend on the machine and its load: regenerate the numbers, do not edit them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import sys
import textwrap
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
if str(ROOT) not in sys.path:  # `scripts.reward_server`, the module the `http` runs import the reward from
    sys.path.append(str(ROOT))

import runlib  # noqa: E402
from main_job_seeds import SPLITS  # noqa: E402
from result_blocks import file_link, page_of, write_block_from_results  # noqa: E402


RESULTS = ROOT / "docs" / "results" / "async" / "results.json"
BLOCK = "async-table"
ARMS = {
    "sync": [],
    "async1": ["--async_rollouts", "--max_staleness", "1"],
    "async4": ["--async_rollouts", "--max_staleness", "4"],
    # the other correction (`async_correction`): PPO's clip against the producer's policy, no proximal forward
    "async4_behaviour": ["--async_rollouts", "--max_staleness", "4", "--async_correction", "behaviour"],
}
DEFAULT_ARMS = ("sync", "async1", "async4")
REMOTE_REWARD = "scripts.reward_server.remote_exact_match"
REWARDS = {"instant": [], "http": ["--reward_funcs", REMOTE_REWARD]}
SEEDS = (0, 1, 2)
HTTP_DELAY_S = 0.3
TORCH_THREADS = 2  # the machine's cores: a sync run's trainer uses 1 (the 2nd is idle), an async run both
# the trainer's torch threads per arm: 1 in every arm, as `accelerate launch` uses on CPU (2 threads on a machine that
# is not idle make every operator wait at OpenMP barriers: a sync run with 2 threads took 2.5 s a step instead of
# ~0.3); an async run's producer has its own thread (`async_producer_threads`, 1) on the second core
ARM_THREADS = dict.fromkeys(ARMS, 1)
QUICK_ARGS = ["--max_steps", "4", "--max_eval_samples", "8", "--eval_strategy", "no"]
QUICK_ARMS = ("sync", "async1")
ASYNC_METRICS = (
    "perf/rollout_wait_share",
    "perf/rollout_wait_s",
    "perf/weight_sync_s",
    "sample/staleness_mean",
    "sample/staleness_max",
    "sample/dropped_stale_total",
)
PRETRAIN_END_WINDOWS = 5  # logging windows averaged for `pretrain_loss_end`
TARGET_SPEEDUP = 1.5
TARGET_ACCURACY_LOW = -0.05
LINE_WIDTH = 119  # the docs'
URL_VARIABLE = "TRAPO_REWARD_URL"  # scripts/reward_server.py's


# =====================================================================================================================
# One run (in its own process)
# =====================================================================================================================
def metric_summary(history: list[dict], key: str) -> dict | None:
    """Mean, max, last value, sum and count of `key` over the log entries that have it (None when none has it)."""
    values = [float(h[key]) for h in history if isinstance(h.get(key), (int, float))]
    if not values:
        return None
    return {
        "mean": statistics.mean(values),
        "max": max(values),
        "last": values[-1],
        "sum": sum(values),
        "count": len(values),
    }


def pretrain_loss_end(history: list[dict], windows: int = PRETRAIN_END_WINDOWS) -> float | None:
    """Mean `loss/pretrain` of the last `windows` logging windows that have it (None without any)."""
    values = [float(h["loss/pretrain"]) for h in history if isinstance(h.get("loss/pretrain"), (int, float))]
    return statistics.mean(values[-windows:]) if values else None


def worker(spec_path: str) -> None:
    """Run the main job with the spec's arguments and torch threads and write what the run's entry needs.

    Args:
        spec_path: JSON file with `argv` (the main job's arguments, `--output_dir` included), `threads` (the
            trainer's torch threads) and `result` (where to
            write `{"results", "history", "max_steps", "torch_threads", "peak_rss_mb", "peak_rss_children_mb"}`).
    """
    import logging

    import torch

    from trl_trapo.jobs.main import main, parse_args

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(int(spec["threads"]))
    threads_start = torch.get_num_threads()
    script_args, training_args, model_args = parse_args(spec["argv"])
    results = main(script_args, training_args, model_args)
    state_path = Path(training_args.output_dir) / "trainer_state.json"
    history = json.loads(state_path.read_text(encoding="utf-8"))["log_history"] if state_path.exists() else []
    runlib.write_json_atomic(
        spec["result"],
        {
            "results": results,
            "history": history,
            "max_steps": training_args.max_steps,
            "torch_threads": {"start": threads_start, "end": torch.get_num_threads()},
            "async_rollouts": bool(getattr(training_args, "async_rollouts", False)),
            "peak_rss_mb": runlib.peak_rss_mb(),
            "peak_rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,  # the producer
        },
    )


def run_name(reward: str, arm: str, seed: int) -> str:
    """A run's name: its key in the results file and its folder under `--work_dir`."""
    return f"{reward}-{arm}-seed{seed}"


def check_arguments(argvs: dict[str, list[str]], work_dir: Path) -> None:
    """Parse every run's arguments as the main job will, before any run, so that an arm the main job does not know
    (an old checkout without `--async_rollouts`) stops the script at once instead of after the runs before it.

    Raises:
        SystemExit: naming the run and the main job's error.
    """
    from trl_trapo.jobs.main import parse_args

    for name, argv in argvs.items():
        try:
            parse_args([*argv, "--output_dir", str(work_dir / name / "output")])
        except (ValueError, SystemExit) as error:
            raise SystemExit(
                f"run {name}: the main job refuses its arguments {argv}: {error} Nothing was run."
            ) from error


def reward_calls(server) -> int | None:
    """The `/score` calls the reward server has answered (None without a server)."""
    if server is None:
        return None
    with server.lock:
        return server.calls


def launch(name: str, argv: list[str], work_dir: Path, reward_url: str | None, server=None) -> dict:
    """Run one job in a subprocess (this script with `--_worker`) and return its entry of the results file.

    Args:
        name: the run's name (its folder under `work_dir`).
        argv: the main job's arguments (`--output_dir` is added).
        work_dir: where the runs' folders go.
        reward_url: the reward server's address, given to the run as `TRAPO_REWARD_URL` (None: the variable is
            removed from the run's environment).
        server: the `RewardServer`, to count the run's reward calls.

    Raises:
        RuntimeError: with the end of the run's log, if the run fails.
    """
    run_dir = work_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    job_argv = [*argv, "--output_dir", str(run_dir / "output"), "--overwrite_output_dir"]  # a re-run replaces it
    threads = ARM_THREADS[name.split("-")[1]] if name.count("-") >= 2 else TORCH_THREADS
    spec = {"argv": job_argv, "result": str(run_dir / "result.json"), "threads": threads}
    calls_before = reward_calls(server)
    # cwd: the repository (the default), where `--reward_funcs scripts.reward_server.remote_exact_match` is imported
    run = runlib.launch_worker(
        __file__,
        spec,
        run_dir / "spec.json",
        threads=threads,
        extra_env={URL_VARIABLE: reward_url or None},  # no address: the variable is removed
        log_path=run_dir / "job.log",
        name=f"run {name}",
    )
    out = runlib.read_json(run_dir / "result.json")
    results, history = out["results"], out["history"]
    prefix = [f"OMP_NUM_THREADS={threads}"] + ([f"{URL_VARIABLE}=..."] if reward_url else [])
    return {
        "command": shlex.join([*prefix, "python", "examples/trapo.py", *argv]),
        "final": {k: v for k, v in results.items() if k.startswith("eval_accuracy") and not k.endswith("_initial")},
        "initial": {k: v for k, v in results.items() if k.startswith("eval_accuracy") and k.endswith("_initial")},
        "eval_history": [
            {k: v for k, v in h.items() if k == "step" or k.startswith("eval_reward")}
            for h in history
            if "eval_reward" in h
        ],
        "forgetting": {
            "eval_pretrain_loss": results.get("eval_pretrain_loss"),
            "eval_pretrain_loss_initial": results.get("eval_pretrain_loss_initial"),
            "pretrain_loss_end": pretrain_loss_end(history),
        },
        "async_metrics": {key: metric_summary(history, key) for key in ASYNC_METRICS},
        # the trainer's waiting share over the whole run: the seconds it waited for the producer / training time
        "wait_share": None
        if metric_summary(history, "perf/rollout_wait_s") is None
        else metric_summary(history, "perf/rollout_wait_s")["sum"] / results["train_runtime_s"],
        "async_rollouts": out.get("async_rollouts", False),
        "torch_threads": out["torch_threads"],
        "reward_calls": None if calls_before is None else reward_calls(server) - calls_before,
        "max_steps": out["max_steps"],
        "train_runtime_s": results["train_runtime_s"],
        "train_loss": results.get("train_loss"),
        "peak_rss_mb": out["peak_rss_mb"],
        "peak_rss_children_mb": out["peak_rss_children_mb"],
        "loadavg_1min_start": run.loadavg_start[0],
        "wall_s": run.wall_s,
    }


# =====================================================================================================================
# Summary
# =====================================================================================================================
def paired_interval(differences: list[float]) -> dict | None:
    """Mean of paired differences and its two-sided 95 % Student t interval (`runlib.paired_interval`),
    `{"n", "mean", "low", "high"}`; None with fewer than 2 pairs."""
    if len(differences) < 2:
        return None
    interval = runlib.paired_interval(differences, confidence=0.95)
    return {key: interval[key] for key in ("n", "mean", "low", "high")}


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def verdict(speedup: float | None, interval: dict | None) -> str:
    """The target: at least `TARGET_SPEEDUP` faster and the paired interval's lower end at least
    `TARGET_ACCURACY_LOW`; "n/a" without a speed-up or an interval (fewer than 2 seeds)."""
    if speedup is None or interval is None:
        return "n/a"
    return "met" if speedup >= TARGET_SPEEDUP and interval["low"] >= TARGET_ACCURACY_LOW else "not met"


def summarize(runs: dict) -> dict:
    """Per reward setting and arm: seeds, mean wall time / `train_runtime_s`, speed-up over sync, mean accuracies and
    forgetting measures, mean async metrics, the paired accuracy difference arm - sync and the target's verdict.

    Args:
        runs: the results file's `runs` (entries with `reward`, `arm`, `seed`).
    """
    summary: dict = {}
    for reward in [r for r in REWARDS if any(run["reward"] == r for run in runs.values())]:
        by_arm: dict[str, dict[int, dict]] = {}
        for run in runs.values():
            if run["reward"] == reward:
                by_arm.setdefault(run["arm"], {})[run["seed"]] = run
        sync = by_arm.get("sync", {})
        sync_wall = _mean([r["wall_s"] for r in sync.values()])
        sync_train = _mean([r["train_runtime_s"] for r in sync.values()])
        arms = {}
        for arm in [a for a in ARMS if a in by_arm]:
            seeds = by_arm[arm]
            wall = statistics.mean(r["wall_s"] for r in seeds.values())
            train = statistics.mean(r["train_runtime_s"] for r in seeds.values())
            entry = {
                "seeds": sorted(seeds),
                "wall_s_mean": wall,
                "train_runtime_s_mean": train,
                "speedup_wall_vs_sync": sync_wall / wall if sync_wall else None,
                "speedup_train_vs_sync": sync_train / train if sync_train else None,
                **{f"{k}_mean": _mean([r["final"].get(k) for r in seeds.values()]) for k in SPLITS},
                "pretrain_loss_end_mean": _mean([r["forgetting"]["pretrain_loss_end"] for r in seeds.values()]),
                "reward_calls_mean": _mean([r.get("reward_calls") for r in seeds.values()]),
                "async_metrics_mean": {
                    key: _mean([(r["async_metrics"].get(key) or {}).get("mean") for r in seeds.values()])
                    for key in ASYNC_METRICS
                },
                "wait_share_mean": _mean([r.get("wait_share") for r in seeds.values()]),
                "dropped_stale_total_end_mean": _mean(
                    [(r["async_metrics"].get("sample/dropped_stale_total") or {}).get("last") for r in seeds.values()]
                ),
                "staleness_max": _max(
                    [(r["async_metrics"].get("sample/staleness_max") or {}) for r in seeds.values()]
                ),
                "paired_accuracy_vs_sync": None,
                "target": None,
            }
            if arm != "sync":
                paired = sorted(set(seeds) & set(sync))
                entry["paired_accuracy_vs_sync"] = paired_interval(
                    [seeds[s]["final"]["eval_accuracy"] - sync[s]["final"]["eval_accuracy"] for s in paired]
                )
                entry["target"] = verdict(entry["speedup_wall_vs_sync"], entry["paired_accuracy_vs_sync"])
            arms[arm] = entry
        summary[reward] = arms
    return summary


def _max(summaries: list[dict]) -> float | None:
    values = [s["max"] for s in summaries if s]
    return max(values) if values else None


# =====================================================================================================================
# The results page's block
# =====================================================================================================================
def _num(value: float | None, digits: int = 3, sign: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _interval(interval: dict | None) -> str:
    if interval is None:
        return "n/a (1 seed)"
    return f"{interval['mean']:+.3f} [{interval['low']:+.3f}, {interval['high']:+.3f}]"


def render_block(data: dict) -> str:
    """The asynchronous-rollouts block of docs/results/async.md: how it was measured, one table row per reward setting and arm, and
    the target's verdict for the `http` reward.

    Args:
        data: the contents of the results file (`machine`, `runs`, `summary`, `http_delay_s`, `torch_threads`,
            `loadavg_start`, `loadavg_end`).

    Returns:
        Markdown, ending with a newline.
    """
    machine_info, runs, summary = data["machine"], data["runs"], data["summary"]
    steps = sorted({run["max_steps"] for run in runs.values()})
    seeds = sorted({run["seed"] for run in runs.values()})
    load = "/".join(f"{v:.1f}" for v in data["loadavg_start"]), "/".join(f"{v:.1f}" for v in data["loadavg_end"])
    intro = (
        f"Measured by `python scripts/experiments/compare_async.py` on {machine_info['date']} "
        f"({file_link('docs/results/async/results.json', BLOCK)}): {machine_info['cpu_model']}, "
        f"{machine_info['cpu_count']} cores, one run at a time on {data['torch_threads']} cores (every trainer with 1 torch thread; an async "
        f"run's rollout producer with 1 more, on the second core, which a sync run leaves idle), load average (1/5/15 min) {load[0]} at the start and "
        f"{load[1]} at the end; torch {machine_info['torch']}, transformers {machine_info['transformers']}, trl "
        f"{machine_info['trl']}, commit `{(machine_info['git_commit'] or 'unknown')[:7]}`. Each run: "
        f"{', '.join(f'{s:,}' for s in steps)} joint steps of the built-in job, {'seed' if len(seeds) == 1 else 'seeds'} {', '.join(map(str, seeds))} "
        f"(`--seed S --task_suite_seed S`). Rewards: `instant` is the built-in `exact_match`; `http` is the same reward "
        f"from `scripts/reward_server.py` with {data['http_delay_s']:g} s per batched call. Speed-up: mean sync wall "
        "time / mean arm wall time (whole process: start-up, evaluations, training). Δ accuracy: arm − sync paired "
        "by seed, mean [95 % t interval]. `loss/pretrain` (end): the pretraining stream's training loss over the last "
        f"{PRETRAIN_END_WINDOWS} logging windows (the built-in job evaluates no held-out text). Async columns: means "
        "over the logging windows, then over seeds; staleness max over every window; dropped stale rounds at the end."
    )
    lines = [
        textwrap.fill(intro, width=LINE_WIDTH, break_long_words=False, break_on_hyphens=False),
        "",
        "| reward | arm | wall (s) | speed-up | train (s) | `eval_accuracy` | `sft_tasks` | `rl_only` "
        "| Δ accuracy vs sync | `loss/pretrain` (end) | rollout wait share | staleness mean / max | dropped stale |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    targets = []
    for reward in [r for r in REWARDS if r in summary]:  # the file's keys are sorted: the order is ours
        for arm in [a for a in ARMS if a in summary[reward]]:
            entry = summary[reward][arm]
            metrics = entry["async_metrics_mean"]
            cells = [
                f"`{reward}`",
                f"`{arm}`",
                f"{entry['wall_s_mean']:.0f}",
                "–"
                if arm == "sync" or entry["speedup_wall_vs_sync"] is None
                else f"{entry['speedup_wall_vs_sync']:.2f}×",
                f"{entry['train_runtime_s_mean']:.0f}",
                *(_num(entry[f"{k}_mean"]) for k in SPLITS),
                "–" if arm == "sync" else _interval(entry["paired_accuracy_vs_sync"]),
                _num(entry["pretrain_loss_end_mean"]),
                _num(entry.get("wait_share_mean"), 2),
                f"{_num(metrics.get('sample/staleness_mean'), 2)} / {_num(entry['staleness_max'], 0)}",
                _num(entry["dropped_stale_total_end_mean"], 0),
            ]
            lines.append("| " + " | ".join(cells) + " |")
            if reward == "http" and arm != "sync":
                speed = entry["speedup_wall_vs_sync"]
                interval = entry["paired_accuracy_vs_sync"]
                low = "n/a" if interval is None else f"{interval['low']:+.3f}"
                targets.append(f"`{arm}` {entry['target']} ({_num(speed, 2)}× faster, lower end {low})")
    if targets:
        sentence = (
            f"Target with the `http` reward: ≥ {TARGET_SPEEDUP:g}× faster than sync at equal accuracy (the paired "
            f"interval's lower end ≥ {TARGET_ACCURACY_LOW:+.2f}): " + "; ".join(targets) + "."
        )
        lines += ["", textwrap.fill(sentence, width=LINE_WIDTH, break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines) + "\n"


# =====================================================================================================================
# Command line
# =====================================================================================================================
def _csv(kind, choices: list | None = None):
    """An argparse type for a comma-separated list of `kind` values (`str`, or a `runlib.NumberRange`, whose own
    refusal names the bad value and the range), each one of `choices` when given."""

    def parse(text: str) -> list:
        values = [kind(v) for v in text.split(",") if v.strip()]
        bad = [v for v in values if choices is not None and v not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {choices or kind.__name__}, got {text!r}"
            )
        return values

    return parse


def make_parser() -> argparse.ArgumentParser:
    """This script's arguments (anything else goes to every run of the main job)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--arms",
        type=_csv(str, list(ARMS)),
        default=None,
        help=f"arms, of {','.join(ARMS)} (default {','.join(DEFAULT_ARMS)})",
    )
    parser.add_argument("--seeds", type=_csv(runlib.seed_int), default=None, help="seeds, e.g. 0,1 (default 0,1,2)")
    parser.add_argument(
        "--rewards",
        type=_csv(str, list(REWARDS)),
        default=list(REWARDS),
        help="reward settings: instant,http (default both)",
    )
    parser.add_argument(
        "--delay",
        type=runlib.non_negative_float,
        default=HTTP_DELAY_S,
        help=f"seconds per reward-server call (default {HTTP_DELAY_S})",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: seed 0, arms sync and async1, 4 steps, 8 eval prompts"
    )
    parser.add_argument("--work_dir", default="compare-async-output", help="the runs' output folders and logs")
    parser.add_argument("--results", default=None, help=f"results file (default {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--write_docs", action="store_true", help="only render the docs block from --results")
    parser.add_argument("--page", default=str(page_of(BLOCK)), help="the page to write with --write_docs")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Make the runs and write the results file (or, with `--write_docs`, only the docs block).

    Returns:
        The results file's contents.

    Raises:
        SystemExit: for a shortened run (`--quick` or extra job arguments) that would overwrite the committed
            results; argparse's (status 2) for a value out of its range (`runlib.NumberRange`).
        RuntimeError: if a run fails (with the end of its log); the server is stopped first.
    """
    parser = make_parser()
    args, job_argv = parser.parse_known_args(argv)
    if args._worker:
        worker(args._worker)
        return {}
    results_path = Path(args.results) if args.results else RESULTS
    if job_argv:  # a misspelt option of this script (`--wirte_docs`) is named as one; `check_arguments` parses runs
        runlib.check_job_arguments(parser, job_argv, [runlib.main_job()])
    if args.write_docs:
        return write_block_from_results(BLOCK, render_block, results_path, args.page)
    if (job_argv or args.quick) and args.results is None:
        raise SystemExit(
            f"{'--quick' if args.quick else f'extra main-job arguments {job_argv}'} change the runs: pass --results "
            f"PATH so that they do not overwrite {RESULTS.relative_to(ROOT)}."
        )
    arms = args.arms or list(QUICK_ARMS if args.quick else DEFAULT_ARMS)
    seeds = args.seeds or ([0] if args.quick else list(SEEDS))
    job_argv = [*(QUICK_ARGS if args.quick else []), *job_argv]  # the caller's arguments come last and win
    from scripts.reward_server import start_server

    work_dir = Path(args.work_dir).resolve()
    # (reward, arm, seed) -> the main job's arguments; per reward setting, the seeds in order and, within a seed, the
    # arms, so that a drift in the machine's load falls on every arm
    plan = {
        (reward, arm, seed): [
            *("--seed", str(seed), "--task_suite_seed", str(seed)),
            *ARMS[arm],
            *REWARDS[reward],
            *job_argv,
        ]
        for reward in args.rewards
        for seed in seeds
        for arm in arms
    }
    check_arguments({run_name(*key): argv for key, argv in plan.items()}, work_dir)
    load_start = os.getloadavg()
    started = time.perf_counter()
    runs: dict = {}
    for reward in args.rewards:
        server = thread = None
        if reward == "http":
            server, thread = start_server(port=0, delay=args.delay)
        try:
            for (run_reward, arm, seed), run_argv in plan.items():
                if run_reward != reward:
                    continue
                name = run_name(reward, arm, seed)
                print(f"[{len(runs) + 1}/{len(plan)}] {name}", flush=True)
                entry = launch(name, run_argv, work_dir, server.url if server else None, server)
                runs[name] = {"reward": reward, "arm": arm, "seed": seed, **entry}
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
                thread.join(timeout=10)
    data = {
        "command": shlex.join(
            ["python", "scripts/experiments/compare_async.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "arms": {arm: ARMS[arm] for arm in arms},
        "rewards": {reward: REWARDS[reward] for reward in args.rewards},
        "seeds": seeds,
        "job_args": job_argv,
        "http_delay_s": args.delay,
        "jobs": 1,
        "torch_threads": TORCH_THREADS,
        "thread_split": {arm: ARM_THREADS[arm] for arm in arms},
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        "total_wall_s": time.perf_counter() - started,
        "machine": runlib.machine_info(),
        "runs": runs,
        "summary": summarize(runs),
    }
    runlib.write_json_atomic(results_path, data, indent=2, newline=False)
    print(render_block(data))
    print(f"Written to {results_path}; `--write_docs` puts the block into {page_of(BLOCK).relative_to(ROOT)}.")
    return data


if __name__ == "__main__":
    main()
