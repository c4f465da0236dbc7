# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The report of `scripts/experiments/compare_pipelines.py`: table, checkpoint CSV and plots, from the runs'
`result.json`.

    python scripts/experiments/pipeline_report.py compare-output          # rebuild the report of a finished comparison
    python scripts/experiments/pipeline_report.py --write_docs          # the results pages' tables from docs/results/ (no run)

`--write_docs` renders the results pages' tables from the committed `docs/results/checkpoints.csv` (the
comparison), `docs/results/ablations/checkpoints.csv` (the ablations) and `docs/results/seed_grid/suite*_checkpoints.csv`
(the 5 seeds x 2 task suites grid) and puts them between their `<!-- pipeline-table:... -->` / `<!-- ablation-table:... -->`
/ `<!-- seed-grid-table:... -->` markers; `tests/test_result_pages.py` checks that the
pages hold exactly that rendering.

Definitions (also stated in `results.md`):

- accuracy: held-out greedy exact match of the final checkpoint (overall, `sft_tasks`, `rl_only`);
- forgetting at a checkpoint: held-out pretraining loss minus its best (lowest) value at any earlier checkpoint of the
  same run (nats/token, >= 0); "final forgetting" is that of the last checkpoint;
- time to target: the first checkpoint's wall time (evaluation excluded) at which the run's accuracy reaches the
  final accuracy of the serial run *of the same seed* (same initial weights). It is an upper bound at the checkpoint
  resolution. A run that never reaches it is **censored**: it is counted with its total wall time as a lower bound,
  and the cell reads "> X (k/n censored)", X being the mean of those lower bounds and the uncensored times;
- generation share: time inside `model.generate` during training / training wall time;
- mean ± std over seeds (sample standard deviation; "± 0" is not printed for one seed).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import runlib  # noqa: E402
from result_blocks import ROOT, page_of, write_block  # noqa: E402


SPLITS = ("accuracy", "accuracy_sft_tasks", "accuracy_rl_only")
TIME_TARGET = 0.7  # TRAPO should reach the serial final accuracy within 70 % of the serial wall time ...
FORGETTING_TARGET = 0.5  # ... with at most half its forgetting (our targets: reported, never forced)
CSV_FIELDS = (
    "method", "seed", "stage", "reason", "step", "budget_fraction", "wall_s", "cpu_s", "eval_s", "generation_s",
    "generation_share", "tokens", "peak_rss_mb", "accuracy", "accuracy_sft_tasks", "accuracy_rl_only",
    "pretrain_loss", "best_pretrain_loss", "forgetting",
)  # fmt: skip


# =====================================================================================================================
# Pure helpers (unit-tested)
# =====================================================================================================================
def add_forgetting(checkpoints: list[dict]) -> list[dict]:
    """Copies of `checkpoints` (in order) with `best_pretrain_loss` (lowest so far) and `forgetting` (rise above it)."""
    best = math.inf
    out = []
    for row in checkpoints:
        best = min(best, row["pretrain_loss"])
        out.append({**row, "best_pretrain_loss": best, "forgetting": row["pretrain_loss"] - best})
    return out


def time_to_target(checkpoints: list[dict], target: float, tolerance: float = 1e-9) -> float | None:
    """Wall time of the first checkpoint whose `accuracy` >= `target`; None if no checkpoint reaches it (censored)."""
    for row in checkpoints:
        if row["accuracy"] >= target - tolerance:
            return row["wall_s"]
    return None


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for fewer than two values) of the finite `values` (a split your data
    does not have is NaN in every run and is skipped)."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def format_mean_std(values: list[float], digits: int = 3) -> str:
    """'m ± s' (just 'm' for one value; '–' for none or only non-finite ones)."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def format_censored(times: list[float | None], bounds: list[float], digits: int = 0) -> str:
    """Times to target with censoring: 'm ± s' if every run reached it, else '> X (k/n censored)'.

    Args:
        times: per run, the time to target, or None when the run never reached it.
        bounds: per run, its total wall time (the lower bound used for a censored run).
    """
    if not times:
        return "–"
    censored = sum(t is None for t in times)
    if censored == 0:
        return format_mean_std([float(t) for t in times], digits)
    lower = statistics.mean(b if t is None else t for t, b in zip(times, bounds))
    return f"> {lower:.{digits}f} ({censored}/{len(times)} censored)"


def summarize(results: list[dict]) -> dict[str, dict]:
    """Per method: per-seed final metrics, times to the serial target, and the means used by the table."""
    serial_final = {r["seed"]: r["checkpoints"][-1]["accuracy"] for r in results if r["method"] == "serial"}
    fallback = statistics.mean(serial_final.values()) if serial_final else None
    summary: dict[str, dict] = {}
    for result in results:
        rows = add_forgetting(result["checkpoints"])
        final = rows[-1]
        target = serial_final.get(result["seed"], fallback)
        entry = summary.setdefault(result["method"], defaultdict(list))
        entry["seeds"].append(result["seed"])
        for key in SPLITS:
            entry[key].append(final.get(key, math.nan))
        entry["forgetting"].append(final["forgetting"])
        entry["initial_accuracy"].append(rows[0]["accuracy"])
        entry["pretrain_loss"].append(final["pretrain_loss"])
        entry["wall_s"].append(result["wall_s"])
        entry["cpu_s"].append(result["cpu_s"])
        entry["generation_share"].append(result["generation_s"] / result["wall_s"] if result["wall_s"] else 0.0)
        entry["peak_rss_mb"].append(result["peak_rss_mb"])
        entry["tokens"].append(result["tokens"])
        entry["steps"].append(result["steps"])
        entry["target"].append(target)
        if target is not None:  # without a serial run there is no target: the cell reads "–", not "censored"
            entry["time_to_target"].append(time_to_target(rows, target))
    return {method: dict(entry) for method, entry in summary.items()}


def verdict(summary: dict[str, dict], method: str = "trapo") -> dict:
    """Whether `method` met the targets against `serial`: time to target <= 70 % of the serial wall time (censored
    runs fail) and final forgetting <= half the serial forgetting, on the means over seeds. The time target does not
    apply (`time_applicable` False, neither met nor missed) when the serial pipeline ends no more accurate than the
    initial model: every run "reaches" that accuracy at time 0."""
    if method not in summary or "serial" not in summary:
        return {}
    ours, serial = summary[method], summary["serial"]
    serial_wall = statistics.mean(serial["wall_s"])
    times = ours["time_to_target"]
    censored = sum(t is None for t in times)
    time_mean = statistics.mean(t for t in times if t is not None) if censored < len(times) else None
    time_ratio = None if censored or time_mean is None else time_mean / serial_wall
    serial_forgetting = statistics.mean(serial["forgetting"])
    forgetting = statistics.mean(ours["forgetting"])
    forgetting_ratio = forgetting / serial_forgetting if serial_forgetting > 0 else math.inf if forgetting > 0 else 0
    serial_accuracy = statistics.mean(serial["accuracy"])
    initial_accuracy = statistics.mean(serial["initial_accuracy"])
    applicable = serial_accuracy > initial_accuracy + 1e-9
    return {
        "time_ratio": time_ratio,
        "censored": censored,
        "runs": len(times),
        "time_applicable": applicable,
        "initial_accuracy": initial_accuracy,
        "time_met": applicable and time_ratio is not None and time_ratio <= TIME_TARGET,
        "forgetting": forgetting,
        "serial_forgetting": serial_forgetting,
        "forgetting_ratio": forgetting_ratio,
        "forgetting_met": forgetting <= FORGETTING_TARGET * serial_forgetting + 1e-12,
        "accuracy": statistics.mean(ours["accuracy"]),
        "serial_accuracy": serial_accuracy,
    }


def markdown_table(summary: dict[str, dict]) -> str:
    """The results table (one row per method, mean ± std over seeds)."""
    header = (
        "| method | seeds | accuracy | sft_tasks | rl_only | forgetting (nats/token) | time to serial's final accuracy "
        "(s) | wall time (s) | generation share | peak memory (MB) | tokens (M) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    order = sorted(summary, key=lambda m: (m != "serial", m != "trapo", m))
    lines = []
    for method in order:
        entry = summary[method]
        lines.append(
            "| "
            + " | ".join(
                [
                    f"`{method}`",
                    str(len(entry["seeds"])),
                    format_mean_std(entry["accuracy"]),
                    format_mean_std(entry["accuracy_sft_tasks"]),
                    format_mean_std(entry["accuracy_rl_only"]),
                    format_mean_std(entry["forgetting"]),
                    format_censored(entry.get("time_to_target", []), entry["wall_s"]),
                    format_mean_std(entry["wall_s"], 0),
                    format_mean_std(entry["generation_share"], 2),
                    format_mean_std(entry["peak_rss_mb"], 0),
                    format_mean_std([t / 1e6 for t in entry["tokens"]], 2),
                ]
            )
            + " |"
        )
    return header + "\n".join(lines) + "\n"


# the docs' names of the ablations, in the docs' order (other methods follow, sorted)
ABLATION_LABELS = {
    "trapo": "full TRAPO (`trapo`)",
    "trapo_static": "static weights (`dare_mode=static`)",
    "trapo_dare": "DARE (`weighting=dare`)",
    "trapo_constant": "constant mixture (`curriculum_mode=constant`)",
    "trapo_no_pretrain": "no pretraining term (`pretrain_weight=0`)",
    "trapo_no_replay": "no replay reuse (`num_ppo_epochs=1`)",
    "trapo_no_exploration": "no targeted exploration (`exploration=False`)",
    "trapo_no_self_imitation": "no self-imitation (`self_imitation=False`)",
    "trapo_previous_defaults": "neither (the previous defaults)",
    "trapo_guidance": "+ guidance (`demonstration_column`)",
    # the distillation grid (issue 22): exploration and self-imitation off in every arm
    "distill_no_teacher": "no teacher",
    "distill_teacher": "teacher (DARE)",
    "distill_teacher_static": "teacher, static weights (`dare_mode=static`)",
    "distill_trl": "TRL `DistillationTrainer` alone (same teacher, RL prompts)",
    # variants of earlier commits, kept for their committed CSV files
    "trapo_exploration": "+ targeted exploration (`exploration=True`)",
}


def ablation_table(summary: dict[str, dict]) -> str:
    """The ablation table of docs/results/pipeline.md: one row per TRAPO variant, accuracy, `rl_only` and final forgetting."""
    seeds = sorted({seed for entry in summary.values() for seed in entry["seeds"]})
    label = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    order = [m for m in ABLATION_LABELS if m in summary] + sorted(m for m in summary if m not in ABLATION_LABELS)
    lines = [
        f"| TRAPO variant ({label}) | accuracy | rl_only | forgetting (nats/token) |",
        "|---|---|---|---|",
    ]
    for method in order:
        entry = summary[method]
        cells = [
            ABLATION_LABELS.get(method, f"`{method}`"),
            format_mean_std(entry["accuracy"]),
            format_mean_std(entry["accuracy_rl_only"], 2),
            format_mean_std(entry["forgetting"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# (column, what "better" is) of the paired comparison; forgetting is better when lower
PAIRED_METRICS = (("accuracy", 1), ("accuracy_rl_only", 1), ("forgetting", -1))


def paired_interval(differences: list[float]) -> tuple[float, float, float]:
    """Mean of paired differences and its two-sided 90 % Student t interval `(mean, low, high)`
    (`runlib.paired_interval`).

    Raises:
        ValueError: with fewer than 2 pairs.
    """
    interval = runlib.paired_interval(differences, confidence=0.9)
    return interval["mean"], interval["low"], interval["high"]


def component_verdict(mean: float, low: float, high: float, better: int) -> str:
    """ "helps" when the interval excludes 0 on the better side, "hurts" on the worse side, else "not shown"."""
    if (low > 0 and better > 0) or (high < 0 and better < 0):
        return "helps"
    if (high < 0 and better > 0) or (low > 0 and better < 0):
        return "hurts"
    return "not shown"


ADDED_COMPONENTS = ("trapo_guidance", "trapo_exploration")  # variants that add a component; the others remove one


def paired_component_table(summary: dict[str, dict], baseline: str = "trapo") -> str:
    """Each variant against `baseline`, paired by seed: mean ± std of accuracy, `rl_only` and final forgetting, and
    per metric the component's effect — with it minus without it: `baseline − variant` for a variant that removes a
    component, `variant − baseline` for one that adds it (`ADDED_COMPONENTS`) — as the mean paired difference with
    its 90 % t interval and the verdict (`component_verdict`: "helps" when the interval excludes 0 on the better
    side; "n/a" with fewer than 2 shared seeds)."""
    base = summary[baseline]
    seeds = sorted(base["seeds"])
    lines = [
        f"| variant (seeds {', '.join(map(str, seeds))}) | accuracy | rl_only | forgetting (nats/token) "
        "| component: Δ accuracy [90 % CI] | Δ rl_only [90 % CI] | Δ forgetting [90 % CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    order = [m for m in ABLATION_LABELS if m in summary and m != baseline]
    order += sorted(m for m in summary if m not in ABLATION_LABELS and m != baseline)
    for method in [baseline] + order:
        entry = summary[method]
        cells = [
            ABLATION_LABELS.get(method, f"`{method}`"),
            format_mean_std(entry["accuracy"]),
            format_mean_std(entry["accuracy_rl_only"], 2),
            format_mean_std(entry["forgetting"]),
        ]
        sign = 1.0 if method in ADDED_COMPONENTS else -1.0
        for key, better in PAIRED_METRICS:
            if method == baseline:
                cells.append("–")
                continue
            mine = dict(zip(entry["seeds"], entry[key]))
            theirs = dict(zip(base["seeds"], base[key]))
            shared = sorted(set(mine) & set(theirs))
            if len(shared) < 2:
                cells.append("n/a")
                continue
            mean, low, high = paired_interval([sign * (mine[s] - theirs[s]) for s in shared])
            cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] {component_verdict(mean, low, high, better)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def verdict_text(result: dict) -> str:
    if not result:
        return ""
    if not result.get("time_applicable", True):
        time_part = (
            f"the serial pipeline's final accuracy ({result['serial_accuracy']:.3f}) is no higher than the initial "
            f"model's ({result['initial_accuracy']:.3f}), so the time-to-accuracy target is **n/a**"
        )
    elif result["time_ratio"] is None:
        time_part = (
            f"TRAPO did **not** reach the serial pipeline's final accuracy in {result['censored']}/{result['runs']} "
            "runs (censored), so the time target is **not met**"
        )
    else:
        time_part = (
            f"TRAPO reached the serial pipeline's final accuracy in {100 * result['time_ratio']:.0f} % of the serial "
            f"wall time (target ≤ {100 * TIME_TARGET:.0f} %: **{'met' if result['time_met'] else 'not met'}**)"
        )
    forgetting_part = (
        f"its final forgetting is {result['forgetting']:.3f} nats/token against the serial pipeline's "
        f"{result['serial_forgetting']:.3f} (target ≤ {100 * FORGETTING_TARGET:.0f} %: "
        f"**{'met' if result['forgetting_met'] else 'not met'}**)"
    )
    return (
        f"{time_part}; {forgetting_part}. Final accuracy {result['accuracy']:.3f} vs {result['serial_accuracy']:.3f}."
    )


# =====================================================================================================================
# Files
# =====================================================================================================================
def write_csv(path: str, results: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for result in results:
            for row in add_forgetting(result["checkpoints"]):
                writer.writerow({"method": result["method"], "seed": result["seed"], **row})


def _curves(results: list[dict], method: str, key: str) -> tuple[list[list[tuple[float, float]]], list[tuple]]:
    """Per-seed (wall, value) curves of a method, and the mean curve grouped by budget fraction (2 decimals)."""
    per_seed, grouped = [], defaultdict(list)
    for result in results:
        if result["method"] != method:
            continue
        rows = add_forgetting(result["checkpoints"])
        per_seed.append([(r["wall_s"], r[key]) for r in rows])
        for r in rows:
            grouped[round(r["budget_fraction"], 2)].append((r["wall_s"], r[key]))
    mean = []
    for fraction in sorted(grouped):
        walls, values = zip(*grouped[fraction])
        mean.append((statistics.mean(walls), *mean_std(list(values))))
    return per_seed, mean


def plot_metric(results, methods, panels, path, title) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for axis, (key, label) in zip(axes[0], panels):
        for method in methods:
            per_seed, mean = _curves(results, method, key)
            for curve in per_seed:
                axis.plot(*zip(*curve), color=colors[method], alpha=0.25, linewidth=0.8)
            if mean:
                walls, means, stds = zip(*mean)
                axis.plot(walls, means, color=colors[method], marker=".", label=method)
                low = 0.0 if key.startswith("accuracy") or key == "forgetting" else -math.inf
                high = 1.0 if key.startswith("accuracy") else math.inf
                axis.fill_between(
                    walls,
                    [max(m - s, low) for m, s in zip(means, stds)],
                    [min(m + s, high) for m, s in zip(means, stds)],
                    color=colors[method],
                    alpha=0.12,
                )  # fmt: skip  (the band is clipped to the metric's range)
        serial = [r for r in results if r["method"] == "serial"]
        for stage_index in range(len(serial[0]["stage_ends"]) - 1 if serial else 0):
            wall = statistics.mean(r["stage_ends"][stage_index]["wall_s"] for r in serial)
            name = serial[0]["stage_ends"][stage_index]["stage"]
            axis.axvline(wall, color=colors["serial"], linestyle=":", linewidth=1)
            top = axis.get_ylim()[1]
            axis.text(
                wall, top * (1 - 0.06 * stage_index), f" end of {name}", fontsize=7, va="top", color=colors["serial"]
            )  # staggered: stage ends can be close
        if key == "accuracy" and serial:
            target = statistics.mean(r["checkpoints"][-1]["accuracy"] for r in serial)
            axis.axhline(target, color="grey", linestyle="--", linewidth=0.8, label="serial final (mean)")
        axis.set_xlabel("training wall time (s), evaluation excluded")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_trapo_schedule(output_dir: str, results: list[dict], path: str) -> bool:
    """DARE loss weights and curriculum row shares over steps, from TRAPO's `trainer_state.json` log history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    states = []
    for result in results:
        if result["method"] != "trapo":
            continue
        state_path = os.path.join(output_dir, "runs", f"trapo-seed{result['seed']}", "trainer_state.json")
        if os.path.exists(state_path):
            with open(state_path, encoding="utf-8") as handle:
                states.append(json.load(handle)["log_history"])
    if not states:
        return False
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for axis, prefix, title in (
        (axes[0], "weight/", "DARE loss weights w_o"),
        (axes[1], "curriculum/", "curriculum row shares s_o"),
    ):
        for color, objective in zip(("C0", "C1", "C2"), ("pretrain", "sft", "rl")):
            for seed_index, history in enumerate(states):
                points = [(h["step"], h[prefix + objective]) for h in history if prefix + objective in h]
                if points:
                    axis.plot(
                        *zip(*points),
                        color=color,
                        alpha=1.0 if seed_index == 0 else 0.3,
                        label=objective if seed_index == 0 else None,
                    )
        axis.set_xlabel("optimizer step")
        axis.set_title(title + " (TRAPO; faint lines: other seeds)", fontsize=10)
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def write_report(output_dir: str, results: list[dict], meta: dict) -> dict:
    """Write `results.md`, `checkpoints.csv` and the PNG plots; return the summary and the Markdown."""
    summary = summarize(results)
    methods = sorted(summary, key=lambda m: (m != "serial", m != "trapo", m))
    write_csv(os.path.join(output_dir, "checkpoints.csv"), results)
    budget = meta.get("budget", "steps")
    plot_metric(
        results,
        methods,
        [("accuracy", "held-out accuracy (greedy exact match)"), ("accuracy_rl_only", "rl_only accuracy")],
        os.path.join(output_dir, "accuracy_vs_time.png"),
        f"Held-out accuracy vs training wall time (budget: same {budget}; CPU: sample efficiency, not utilisation)",
    )
    plot_metric(
        results,
        methods,
        [("pretrain_loss", "held-out pretraining loss (nats/token)"), ("forgetting", "forgetting (nats/token)")],
        os.path.join(output_dir, "forgetting_vs_time.png"),
        "Held-out pretraining loss and forgetting (rise above the run's best so far) vs training wall time",
    )
    plot_trapo_schedule(output_dir, results, os.path.join(output_dir, "trapo_weights_curriculum.png"))
    result = verdict(summary)
    load = meta.get("loadavg_start"), meta.get("loadavg_end")
    lr = meta.get("lr_search") or {}
    lr_line = (
        "; ".join(
            f"{family}: {info['learning_rate']:.3g}, RL {info.get('rl_phase_learning_rate') or info['learning_rate']:.3g}"
            f" (candidates {', '.join(sorted(info['candidates']))}; RL {', '.join(sorted(info.get('rl_candidates', {})))}"
            f"; {info['steps']} steps, seed {info['seed']}"
            + (f"; reused from `{info['from']}`" if info.get("from") else "")
            + ")"
            for family, info in lr.items()
        )
        if lr
        else "the main job's learning rate for both (no `--lr_search`)"
    )
    rates = sorted(
        {
            f"{r['method']}: {r['learning_rate']:.3g}"
            + (f", RL {r['rl_phase_learning_rate']:.3g}" if r.get("rl_phase_learning_rate") else "")
            for r in results
        }
    )
    steps = ", ".join(f"{m} {statistics.mean(summary[m]['steps']):.0f} steps" for m in methods)
    markdown = (
        f"Command: `{meta.get('command', '')}`\n\n"
        f"Budget: same {budget} ({steps}); seeds {meta.get('seeds')}; {meta.get('cpu_count')} CPU cores, {meta.get('threads')} torch thread(s) per "
        f"run, {meta.get('jobs')} run(s) at a time; load average (1/5/15 min) "
        f"{_load(load[0])} at the start, {_load(load[1])} at the end; total {meta.get('total_s', 0) / 60:.1f} min.\n"
        f"On CPU there is no idle accelerator to reclaim: this measures sample efficiency and forgetting, not device "
        f"utilisation.\n\nLearning rates: {lr_line} ({'; '.join(rates)}).\n\n"
        + markdown_table(summary)
        + "\n"
        + verdict_text(result)
        + "\n"
    )
    with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown + "\n" + (__doc__.split("\n\n", 2)[2]))
    return {"summary": summary, "verdict": result, "markdown": markdown}


CSV_TEXT_FIELDS = ("method", "stage", "reason")
CSV_INT_FIELDS = ("seed", "step", "tokens")


def results_from_csv(path: str | Path) -> list[dict]:
    """The runs of a finished comparison rebuilt from its `checkpoints.csv` (what `docs/results/` keeps; the runs'
    `result.json` files are not committed), enough for `summarize`.

    Args:
        path: a `checkpoints.csv` written by `write_csv`.

    Returns:
        One dict per (method, seed), in file order: `checkpoints` (the rows, in order) and the run's totals, which are
        those of its last checkpoint (`wall_s`, `cpu_s`, `generation_s`, `tokens`, `steps`, `peak_rss_mb`; a run's
        `result.json` measures its peak memory a few lines later). An empty cell is NaN.
    """
    runs: dict[tuple[str, int], list[dict]] = {}
    with open(path, newline="", encoding="utf-8") as handle:
        for raw in csv.DictReader(handle):
            row = {}
            for key, value in raw.items():
                if key in CSV_TEXT_FIELDS:
                    row[key] = value
                elif key in CSV_INT_FIELDS:
                    row[key] = int(value)
                else:
                    row[key] = float(value) if value != "" else math.nan
            runs.setdefault((row["method"], row["seed"]), []).append(row)
    results = []
    for (method, seed), rows in runs.items():
        last = rows[-1]
        totals = {key: last[key] for key in ("wall_s", "cpu_s", "generation_s", "tokens", "peak_rss_mb")}
        results.append({"method": method, "seed": seed, "checkpoints": rows, "steps": last["step"], **totals})
    return results


LEARNED = 0.8  # `rl_only` accuracy at which a run counts as having learnt the RL-only family (the bar)


def seed_grid_table(summaries: dict[int, dict[str, dict]], baseline: str | None = None) -> str:
    """`rl_only` per seed for every method and task suite, and how many runs learnt it (>= `LEARNED`).

    Args:
        summaries: task-suite seed -> `summarize(...)` of the runs made on that suite.
        baseline: a method to hold the others against over the runs both have (the same task suite and seed): the
            last column gives the change of mean `sft_tasks` accuracy and of mean final forgetting (nats/token).

    Returns:
        A Markdown table: one row per (method, suite), then one total row per method.
    """
    methods = sorted({m for summary in summaries.values() for m in summary}, key=lambda m: (m != "trapo", m))
    lines = [
        "| variant | task suite | rl_only per seed | learnt (≥ 0.8) | sft_tasks | forgetting (nats/token) |"
        + (f" vs `{baseline}` on the same runs: Δ sft_tasks, Δ forgetting |" if baseline else ""),
        "|---|---|---|---|---|---|" + ("---|" if baseline else ""),
    ]

    def per_run(method):
        return {
            (suite, seed): {key: entry[key][i] for key in ("accuracy_rl_only", "accuracy_sft_tasks", "forgetting")}
            for suite, summary in sorted(summaries.items())
            if (entry := summary.get(method))
            for i, seed in enumerate(entry["seeds"])
        }

    def delta(mine, theirs):
        shared = sorted(set(mine) & set(theirs))
        if not shared:
            return "–"
        d_sft = statistics.mean(mine[k]["accuracy_sft_tasks"] - theirs[k]["accuracy_sft_tasks"] for k in shared)
        d_forget = statistics.mean(mine[k]["forgetting"] - theirs[k]["forgetting"] for k in shared)
        return f"{d_sft:+.3f}, {d_forget:+.3f} ({len(shared)} runs)"

    base_runs = per_run(baseline) if baseline else {}
    for method in methods:
        runs = per_run(method)
        label = ABLATION_LABELS.get(method, f"`{method}`")
        for suite in sorted({suite for suite, _ in runs}):
            mine = {k: v for k, v in runs.items() if k[0] == suite}
            order = sorted(mine, key=lambda k: k[1])
            cells = [
                label,
                str(suite),
                " / ".join(f"{mine[k]['accuracy_rl_only']:.2f}" for k in order)
                + f" (seeds {', '.join(str(k[1]) for k in order)})",
                f"{sum(mine[k]['accuracy_rl_only'] >= LEARNED for k in order)} of {len(order)}",
                format_mean_std([mine[k]["accuracy_sft_tasks"] for k in order]),
                format_mean_std([mine[k]["forgetting"] for k in order]),
            ]
            if baseline:
                cells.append("–" if method == baseline else delta(mine, base_runs))
            lines.append("| " + " | ".join(cells) + " |")
        cells = [
            f"**{label}: all**",
            ", ".join(str(s) for s in sorted({suite for suite, _ in runs})),
            "",
            f"**{sum(v['accuracy_rl_only'] >= LEARNED for v in runs.values())} of {len(runs)}**",
            format_mean_std([v["accuracy_sft_tasks"] for v in runs.values()]),
            format_mean_std([v["forgetting"] for v in runs.values()]),
        ]
        if baseline:
            cells.append("–" if method == baseline else delta(runs, base_runs))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def common_seed_ablation_table(results: list[dict]) -> str:
    """`paired_component_table` over the seeds every method has (a comparison that gave some methods more seeds
    keeps the table's rows comparable)."""
    seeds_of: dict[str, set] = {}
    for result in results:
        seeds_of.setdefault(result["method"], set()).add(result["seed"])
    common = set.intersection(*seeds_of.values())
    return paired_component_table(summarize([r for r in results if r["seed"] in common]))


GRID_METHODS = ("trapo", "trapo_previous_defaults")


def seed_grid_from_csvs(*per_suite: list[dict]) -> str:
    """`seed_grid_table` of `GRID_METHODS` from one result list per task-suite seed (0, 1, ...), against the previous
    defaults."""
    summaries = {
        suite: summarize([r for r in results if r["method"] in GRID_METHODS])
        for suite, results in enumerate(per_suite)
    }
    return seed_grid_table(summaries, baseline="trapo_previous_defaults")


DISTILL_METHODS = {"trapo": "distill_teacher", "trapo_static": "distill_teacher_static", "distill_trl": "distill_trl"}


def distill_grid_from_csvs(teacher0: list[dict], teacher1: list[dict], plain0: list[dict], plain1: list[dict]) -> str:
    """The distillation grid (issue 22): `rl_only` per seed with a teacher (DARE, and static weights on suite 0) and
    without, exploration and self-imitation off everywhere; then the steps each run took to reach the teacher's
    `rl_only` accuracy (1.00), and DARE against static weights with the teacher, paired by seed.

    Args:
        teacher0, teacher1: the runs with `--teacher_model_name_or_path` on task suites 0 and 1 (`trapo`, and
            `trapo_static` and `distill_trl` where run).
        plain0, plain1: the runs without a teacher on suites 0 and 1 (`trapo`).
    """

    def relabel(results, mapping):
        return [{**r, "method": mapping[r["method"]]} for r in results if r["method"] in mapping]

    suites = [
        relabel(teacher, DISTILL_METHODS) + relabel(plain, {"trapo": "distill_no_teacher"})
        for teacher, plain in ((teacher0, plain0), (teacher1, plain1))
    ]
    summaries = {suite: summarize(results) for suite, results in enumerate(suites)}
    table = seed_grid_table(summaries, baseline="distill_no_teacher")
    lines = ["", "| variant | steps to `rl_only` = 1.00 (the teacher's), per run | reached |", "|---|---|---|"]
    present = {r["method"] for results in suites for r in results}
    for method in [m for m in (*DISTILL_METHODS.values(), "distill_no_teacher") if m in present]:
        steps = []
        for suite, results in enumerate(suites):
            for run in sorted((r for r in results if r["method"] == method), key=lambda r: r["seed"]):
                first = next((c["step"] for c in run["checkpoints"] if c["accuracy_rl_only"] >= 1.0 - 1e-9), None)
                steps.append(f"{'–' if first is None else first} (s{suite}/{run['seed']})")
        reached = sum(not cell.startswith("–") for cell in steps)
        lines.append(f"| {ABLATION_LABELS[method]} | {', '.join(steps)} | {reached} of {len(steps)} |")
    pairs = {}
    for run in suites[0]:
        pairs.setdefault(run["seed"], {})[run["method"]] = run["checkpoints"][-1]
    shared = sorted(s for s, m in pairs.items() if {"distill_teacher", "distill_teacher_static"} <= set(m))
    if len(shared) >= 2:
        lines += [
            "",
            "| DARE − static, with the teacher (suite 0, paired by seed) | mean | 90 % interval |",
            "|---|---|---|",
        ]
        for key, name in (
            ("accuracy", "accuracy"),
            ("accuracy_rl_only", "rl_only"),
            ("accuracy_sft_tasks", "sft_tasks"),
            ("forgetting", "forgetting (nats/token)"),
        ):
            diffs = [pairs[s]["distill_teacher"][key] - pairs[s]["distill_teacher_static"][key] for s in shared]
            mean, low, high = paired_interval(diffs)
            lines.append(f"| {name} ({len(shared)} seeds) | {mean:+.4f} | {low:+.4f} … {high:+.4f} |")
    return table + "\n".join(lines) + "\n"


# docs block -> (the committed CSV files it is rendered from, the table function of their result lists)
BLOCK_TABLES = {
    "pipeline-table": (("docs/results/checkpoints.csv",), lambda results: markdown_table(summarize(results))),
    "ablation-table": (("docs/results/ablations/checkpoints.csv",), common_seed_ablation_table),
    "seed-grid-table": (
        ("docs/results/seed_grid/suite0_checkpoints.csv", "docs/results/seed_grid/suite1_checkpoints.csv"),
        seed_grid_from_csvs,
    ),
    "distill-grid-table": (
        (
            "docs/results/distill_grid/teacher_suite0_checkpoints.csv",
            "docs/results/distill_grid/teacher_suite1_checkpoints.csv",
            "docs/results/distill_grid/no_teacher_suite0_checkpoints.csv",
            "docs/results/distill_grid/no_teacher_suite1_checkpoints.csv",
        ),
        distill_grid_from_csvs,
    ),
}


def block_tables(root: str | Path = ROOT) -> dict[str, str]:
    """The results pages' tables (block name -> Markdown), rendered from the CSV files under `root`."""
    return {
        name: render(*(results_from_csv(Path(root) / path) for path in paths))
        for name, (paths, render) in BLOCK_TABLES.items()
    }


def _load(values) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"


def make_parser() -> argparse.ArgumentParser:
    """The command line (no numeric argument)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("output_dir", nargs="?", help="A comparison's output directory (holds runs/*/result.json).")
    parser.add_argument("--write_docs", action="store_true", help="Render the results pages' tables instead.")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Rebuild a comparison's report from its runs (`OUTPUT_DIR`), or the results pages' tables (`--write_docs`)."""
    parser = make_parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if ns.write_docs:
        for name, table in block_tables().items():
            changed = write_block(name, table)
            print(f"{page_of(name).relative_to(ROOT)} {name}: {'updated' if changed else 'already up to date'}")
        return
    if ns.output_dir is None:
        parser.error("give OUTPUT_DIR (a comparison's output directory) or --write_docs")
    output_dir = ns.output_dir
    results = []
    for path in sorted(glob.glob(os.path.join(output_dir, "runs", "*", "result.json"))):
        with open(path, encoding="utf-8") as handle:
            results.append(json.load(handle))
    meta_path = os.path.join(output_dir, "meta.json")
    meta = json.load(open(meta_path, encoding="utf-8")) if os.path.exists(meta_path) else {}
    print(write_report(output_dir, results, meta)["markdown"])


if __name__ == "__main__":
    main()
