# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The weighting benchmark of docs/weighting_benchmark.md (issue 42): DARE against static weights, a searched static
mixture, uncertainty weighting, GradNorm and a GAC-style closed form, cell by cell, resumable across sessions.

    python scripts/experiments/weighting_benchmark.py --time_budget_s 3600   # run the next cells for an hour
    python scripts/experiments/weighting_benchmark.py --max_cells 5          # the next 5 cells
    python scripts/experiments/weighting_benchmark.py --list                 # the grid in its order, done or not
    python scripts/experiments/weighting_benchmark.py --report               # render the page from the cells (no run)
    python scripts/experiments/weighting_benchmark.py --shift                # the shift task's cells (only when asked)

The grid is the pre-registration's (`TASKS`, `ARMS`, `SEARCH_*`): a **cell** is one (task, arm, mixture, suite, seed)
run in its own process with one torch thread, and its result is one JSON file under `--results_dir` (default
`docs/results/weighting/cells/`, committed), written atomically when the run has finished. A rerun skips every cell
whose file holds the same settings (`Cell.settings`: the task, arm, weights, suite, seed and the job's arguments; not
the code version, which each file records), so the ~7–8 hours of the grid can be spread over sessions:
`--max_cells N` and `--time_budget_s S` (no cell is started that would not end before S seconds, judged by the mean
of the cells run so far) run a slice, `--tasks` / `--arms` narrow it.

Each cell runs the harness of the seed grid (`compare_pipelines.py`'s worker: the main job's configuration,
`--learning_rate 6e-4`, 1,000 steps, held-out evaluations at every 10 % of the budget; T2 adds the teacher, a main-job
run this script trains once into `--work_dir`) or, for T3, the VLM job (`trl_trapo.jobs.vision`, 900 steps) with the
same recorder, and its file holds what the pre-registration names: the held-out accuracy (overall and per split) at
each 10 % of the budget, the primary metric (their mean), forgetting (nats/token of held-out text above its best so
far, at the end), the first step with `rl_only` >= 0.8, wall and CPU time, and the weighting's curves (`weight/*`,
`dare/factor/*`, `dare/signal/*` from the run's log).

Order (`plan`): task by task (T1, T2, T3); within a task pair by pair (seed 0 on suite 0, seed 0 on suite 1, seed 1 on
suite 0, ...), each pair's arms in the declared order with `tuned_static` last; the task's static-weight search
(its cells are cells too, on the validation suite 2) runs just before the first `tuned_static` cell, which needs its
winner. T3 has no validation suite: its `tuned_static` uses T1's winner.

`--report` renders whatever cells are done into docs/weighting_benchmark.md between the `weighting-results` markers
(arms x tasks with paired 95 % t intervals from `runlib.paired_interval`, marked "partial: k of n cells" until the
grid is complete), applies the declared decision rule (`decide`) only when every cell it needs is present, and draws
one run per arm's weight / signal / factor curves (`docs/results/weighting/weights_<arm>.png`).
Arguments this script does not know go to every cell's job (a smoke run: `--max_steps 10`); such cells must go to
another `--results_dir`. They are checked by the jobs' own parsers before any cell runs (an option neither this script
nor the job takes is refused with the closest of both: `--lsit` is `--list`). The script exits 1 when a cell (or a
teacher) failed; the failed cells are named and run again next time.

The shift task (the pre-registration's "The shift task"; task `S`, cells `S-<arm>-suite0-seed<k>`) runs only when
asked (`--shift`, or `--tasks S`): T2's cells on suite 0, seeds 0-4, every arm (`tuned_static` with T2's search
winner), where after half of the steps (`SHIFT_SWAP_FRACTION`) the teacher's weights are replaced by the wrong
teacher's, T2's teacher trained on RL prompts whose `rl_only` answers are shifted by one letter (trained once into
`--work_dir` by `ensure_wrong_teacher`, which records its greedy accuracy on the held-out `lst` prompts against the
shifted and the true answers). The run-time pieces (the data shift, the swap callback, the workers) are in
`weighting_shift.py`. Its primary metric is the final `rl_only` accuracy (`final_rl_only` in the cell's file, next to
`teacher_swap`: the step at which the swap happened), decided by `decide_shift` (rule 1 with `static` in place of
`dare`) and reported in the page's "Shift task" section.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from result_blocks import page_of, write_block  # noqa: E402
from runlib import (  # noqa: E402
    ChildFailed,
    Job,
    check_job_arguments,
    child_env,
    fraction,
    launch_worker,
    map_jobs,
    non_negative_float,
    paired_interval,
    positive_int,
    read_json,
    run_child,
    seed_int,
    write_json_atomic,
)


logger = logging.getLogger("weighting_benchmark")

RESULTS_DIR = ROOT / "docs" / "results" / "weighting" / "cells"
COST_FILE = RESULTS_DIR.parent / "cost.json"  # benchmark_weighting.py's result, beside the cells' folder
PLOTS_DIR = ROOT / "docs" / "results" / "weighting"
BLOCK = "weighting-results"
CLAIM_BLOCK = "weighting-claim"  # README.md's claim about weighting ([`claim_block`])
LINE_WIDTH = 119

# ---------------------------------------------------------------------------------------------------------------------
# The pre-registered grid (docs/weighting_benchmark.md)
# ---------------------------------------------------------------------------------------------------------------------
ARMS = ("dare", "static", "tuned_static", "uncertainty", "gradnorm", "gac")
RUN_ORDER = ("dare", "static", "uncertainty", "gradnorm", "gac", "tuned_static")  # tuned_static waits for the search
# arm -> TRAPOConfig.weighting
WEIGHTING = {"dare": "dare", "static": "static", "tuned_static": "static", "search": "static"}
WEIGHTING.update({arm: arm for arm in ("uncertainty", "gradnorm", "gac")})


@dataclass(frozen=True)
class Task:
    """One task of the benchmark.

    Attributes:
        name: "T1", "T2" or "T3".
        title: in words, for the report.
        suites: the test suites (`--task_suite_seed`; T3 has one suite per seed, `(None,)`).
        seeds: the seeds run on each suite.
        teacher: whether the main job gets the teacher (the distillation objective).
        vlm: whether the cell runs the VLM job instead of the main job.
    """

    name: str
    title: str
    suites: tuple[int | None, ...]
    seeds: tuple[int, ...]
    teacher: bool = False
    vlm: bool = False

    def pairs(self) -> list[tuple[int | None, int]]:
        """The (suite, seed) pairs of the test cells, in run order (seed-major: the first pairs span both suites)."""
        return [(suite, seed) for seed in self.seeds for suite in self.suites]


TASKS = {
    "T1": Task("T1", "the built-in job's task suites (pretraining, SFT, RL)", (0, 1), (0, 1, 2, 3, 4)),
    "T2": Task("T2", "T1 with the teacher (+ distillation)", (0, 1), (0, 1, 2, 3, 4), teacher=True),
    "T3": Task("T3", "the VLM job's task", (None,), (0, 1, 2), vlm=True),
}
# the shift task (declared with the grid; run only when asked): T2 on suite 0, 5 seeds, the teacher wrong from half the
# budget on. Not in TASKS: the grid, its order and its size stay the main grid's.
SHIFT = Task("S", "T2 on suite 0 with a teacher that becomes wrong halfway", (0,), (0, 1, 2, 3, 4), teacher=True)
ALL_TASKS = {**TASKS, SHIFT.name: SHIFT}
SHIFT_SWAP_FRACTION = 0.5  # the swap after this fraction of the job's max_steps (500 of 1,000)
# the wrong teacher: T2's teacher trained with the rl_only families' RL answers shifted by one letter; `shifted_sft`:
# with shifted demonstrations of those families added to its SFT data (docs/weighting_benchmark.md, shift task note)
WRONG_TEACHER = {"families": ["lst"], "answer": "alphabet successor", "shifted_sft": False}
SWAP_RECORD = "teacher_swap.json"  # the swap's record in a shift cell's run folder (TeacherSwapCallback)
VALIDATION_SUITE = 2
SEARCH_SEEDS = (0, 1)
SEARCH_T1 = tuple({"rl_weight": rl, "sft_weight": sft} for rl in (0.5, 1.0, 2.0) for sft in (0.5, 1.0, 2.0))
SEARCH_T2_DISTILLATION = (0.5, 1.0, 2.0)
# the objective multipliers every cell starts from: TRAPOConfig's defaults when the grid was declared (all 1). Pinned,
# because the decision this benchmark took changed those defaults (`sft_weight`, `rl_weight` 2): a cell re-run today
# must run what the grid ran. A search or tuned_static cell's mixture overrides them.
PREREGISTERED_MULTIPLIERS = {"pretrain_weight": 1.0, "sft_weight": 1.0, "rl_weight": 1.0, "distillation_weight": 1.0}
# T2's teacher (and the wrong teacher) ran the main job under the defaults of that time: DARE, every multiplier 1
TEACHER_JOB_ARGV = (
    "--weighting",
    "dare",
    *(a for k, v in PREREGISTERED_MULTIPLIERS.items() for a in (f"--{k}", f"{v:g}")),
)
# the seed grid's harness settings (docs/results/seed_grid/*_meta.json)
BUILTIN_JOB_ARGV = ("--learning_rate", "6e-4")
EVAL_EVERY = 0.1
HELDOUT_DOCS = 300
RL_LEARNT = 0.8  # "steps until rl_only >= 0.8"
FORGETTING_MARGIN = 0.01  # nats/token (decision rule 1)
TUNED_MARGIN = -0.02  # decision rule 2


def mixture_label(mixture: dict[str, float]) -> str:
    """`{"rl_weight": 2.0, "sft_weight": 0.5}` -> "rl2-sft0.5" ("default" for no weights)."""
    short = {"rl_weight": "rl", "sft_weight": "sft", "pretrain_weight": "pre", "distillation_weight": "distill"}
    return "-".join(f"{short[k]}{v:g}" for k, v in sorted(mixture.items())) or "default"


@dataclass(frozen=True)
class Cell:
    """One run of the grid. `mixture` is the static weights it sets (the search's and `tuned_static`'s); a
    `tuned_static` cell's mixture is its task's search winner, known once the search is done."""

    task: str
    arm: str  # one of ARMS, or "search"
    suite: int | None
    seed: int
    mixture: tuple[tuple[str, float], ...] = ()

    @property
    def id(self) -> str:
        suite = "vlm" if self.suite is None else f"suite{self.suite}"
        what = mixture_label(dict(self.mixture)) if self.arm == "search" else "default"
        return f"{self.task}-{self.arm}-{what}-{suite}-seed{self.seed}".replace("-default", "")

    def settings(self, job_argv: list[str], eval_every: float, heldout_docs: int) -> dict[str, Any]:
        """What decides the cell's numbers besides the code: a file with other settings is run again."""
        return {
            "task": self.task,
            "arm": self.arm,
            "weighting": WEIGHTING[self.arm],
            "mixture": dict(self.mixture),
            "suite": self.suite,
            "seed": self.seed,
            "job_argv": list(job_argv),
            "eval_every": eval_every,
            "heldout_docs": heldout_docs,
            "threads": 1,
        }


def search_cells(task: str, t1_winner: dict[str, float] | None) -> list[Cell]:
    """The static-weight search of `task` on the validation suite: T1's 9 mixtures, or T2's 3 distillation weights
    with T1's winner (None while T1's search is not done: then T2's search cannot be planned yet)."""
    if task == "T1":
        mixtures = SEARCH_T1
    elif task == "T2":
        if t1_winner is None:
            return []
        mixtures = tuple({**t1_winner, "distillation_weight": d} for d in SEARCH_T2_DISTILLATION)
    else:
        return []
    return [
        Cell(task, "search", VALIDATION_SUITE, seed, tuple(sorted(m.items())))
        for m in mixtures
        for seed in SEARCH_SEEDS
    ]


def search_winner(task: str, cells: dict[str, dict], t1_winner: dict[str, float] | None) -> dict | None:
    """The search's winner from the done cells: `{"mixture", "primary" (mean over the search seeds), "table",
    "cpu_s"}`, or None while a search cell is missing. Ties go to the first mixture in the grid's order."""
    planned = search_cells(task, t1_winner)
    if not planned or any(c.id not in cells for c in planned):
        return None
    table = []
    for start in range(0, len(planned), len(SEARCH_SEEDS)):
        group = planned[start : start + len(SEARCH_SEEDS)]
        table.append(
            {"mixture": dict(group[0].mixture), "primary": statistics.fmean(cells[c.id]["primary"] for c in group)}
        )
    best = max(table, key=lambda row: row["primary"])  # max keeps the first of equals
    return {
        "mixture": best["mixture"],
        "primary": best["primary"],
        "table": table,
        "cpu_s": sum(cells[c.id]["cpu_s"] for c in planned),
    }


def winners(cells: dict[str, dict]) -> dict[str, dict | None]:
    """Each task's search winner (T3 borrows T1's: it has no validation suite; the shift task T2's)."""
    t1 = search_winner("T1", cells, None)
    t1_mixture = t1["mixture"] if t1 else None
    t2 = search_winner("T2", cells, t1_mixture)
    return {"T1": t1, "T2": t2, "T3": t1, SHIFT.name: t2}


def plan(cells: dict[str, dict], tasks: tuple[str, ...] = tuple(TASKS)) -> list[Cell]:
    """The grid in run order (module docstring). `tuned_static` cells whose search is not done yet carry no mixture
    (they cannot run until it is); T2's search cells appear once T1's search is done. `tasks` may name the shift task
    (`S`), whose `tuned_static` cells take T2's winner."""
    won = winners(cells)
    t1_mixture = won["T1"]["mixture"] if won["T1"] else None
    out: list[Cell] = []
    for name in tasks:
        task = ALL_TASKS[name]
        mixture = tuple(sorted(won[name]["mixture"].items())) if won[name] else ()
        for index, (suite, seed) in enumerate(task.pairs()):
            for arm in RUN_ORDER:
                if arm == "tuned_static" and index == 0:
                    out += search_cells(name, t1_mixture)
                out.append(Cell(name, arm, suite, seed, mixture if arm == "tuned_static" else ()))
    return out


def grid_size() -> int:
    """Cells in the whole grid: every test cell plus both searches (T2's has 3 mixtures x 2 seeds)."""
    tests = sum(len(task.pairs()) * len(ARMS) for task in TASKS.values())
    return tests + len(SEARCH_T1) * len(SEARCH_SEEDS) + len(SEARCH_T2_DISTILLATION) * len(SEARCH_SEEDS)


# =====================================================================================================================
# One cell
# =====================================================================================================================
def job_extra(cell: Cell) -> dict[str, Any]:
    """The TRAPOConfig values the cell sets on top of the job's configuration: its arm's weighting, the
    pre-registered multipliers (`PREREGISTERED_MULTIPLIERS`, not today's defaults) and its mixture over them."""
    return {"weighting": WEIGHTING[cell.arm], **PREREGISTERED_MULTIPLIERS, **dict(cell.mixture)}


def vlm_job_argv(job_argv: list[str], seed: int, run_dir: str, extra: dict[str, Any]) -> list[str]:
    """The VLM job's command line of a T3 cell: the extra job arguments, the cell's seed, its run folder, no
    evaluation or saving of the trainer's own, then `extra` (`job_extra`) as flags."""
    argv = [*job_argv, "--seed", str(seed), "--task_seed", str(seed)]
    argv += ["--output_dir", run_dir, "--overwrite_output_dir", "True"]
    argv += ["--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "True"]
    for key, value in extra.items():
        argv += [f"--{key}", str(value)]
    return argv


def main_job_argv(suite: int | None, job_argv: list[str]) -> list[str]:
    """The main job's arguments of a T1 / T2 / shift cell on `suite` (`compare_pipelines`' worker adds the rest)."""
    return [*BUILTIN_JOB_ARGV, "--task_suite_seed", str(suite), *job_argv]


def job_checks(tasks: tuple[str, ...]) -> list[Job]:
    """The jobs the cells of `tasks` pass the extra job arguments to (`runlib.check_job_arguments`): the main job
    (T1, T2, the shift task), checked as `compare_pipelines`' worker parses a cell's arguments, and the VLM job (T3),
    as `vlm_worker` does."""
    import tempfile

    from trl_trapo.jobs import main as main_job
    from trl_trapo.jobs import vision as vlm_job

    jobs = []
    main_tasks = [name for name in tasks if not ALL_TASKS[name].vlm]
    if main_tasks:
        import compare_pipelines

        main_cell = Cell(main_tasks[0], "dare", ALL_TASKS[main_tasks[0]].suites[0], 0)
        jobs.append(
            Job(
                f"the main job of the {'/'.join(main_tasks)} cells (examples/trapo.py)",
                "python examples/trapo.py --help",
                main_job.make_parser,
                lambda argv: compare_pipelines.parse_job(
                    main_job_argv(main_cell.suite, argv), False, job_extra(main_cell)
                ),
            )
        )
    vlm_tasks = [name for name in tasks if ALL_TASKS[name].vlm]
    if vlm_tasks:
        vlm_cell = Cell(vlm_tasks[0], "dare", None, 0)
        run_dir = os.path.join(tempfile.gettempdir(), "weighting-benchmark-check")  # parsed, never written
        jobs.append(
            Job(
                f"the VLM job of the {'/'.join(vlm_tasks)} cells (examples/trapo_vlm.py; leave them out with --tasks)",
                "python examples/trapo_vlm.py --help",
                vlm_job.make_parser,
                lambda argv: vlm_job.parse_args(vlm_job_argv(argv, 0, run_dir, job_extra(vlm_cell))),
            )
        )
    return jobs


def vlm_worker(spec_path: str) -> None:
    """T3's cell, in its own process: the VLM job's trainer with the cell's weighting, evaluated at every
    `eval_every` of the budget by `pipeline_measure.Recorder` (caption loss in the place of the pretraining loss);
    writes `<run_dir>/result.json` in the layout of `compare_pipelines.worker`'s."""
    import torch
    from pipeline_measure import Recorder, recorder_callback

    from trl_trapo.jobs.vision import build_data, build_trainer, evaluate, parse_args

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(spec["threads"])
    job_args, config = parse_args(vlm_job_argv(spec["job_argv"], spec["seed"], spec["run_dir"], spec["job_extra"]))
    data = build_data(job_args)

    def measure(model) -> dict[str, float]:
        metrics = evaluate(model, data)
        metrics["pretrain_loss"] = metrics.pop("caption_loss")
        return metrics

    recorder = Recorder(measure, "steps", config.max_steps, spec["eval_every"])
    trainer = build_trainer(data, config)
    trainer.add_callback(recorder_callback(recorder, "trapo", 0, None, first=True))
    trainer.train()
    trainer.save_state()
    final = recorder.rows[-1]
    write_json_atomic(
        Path(spec["run_dir"]) / "result.json",
        {"checkpoints": recorder.rows, "wall_s": final["wall_s"], "cpu_s": final["cpu_s"], "eval_s": recorder.eval_s},
    )


CURVE_POINTS = 50  # logged rows kept per cell: enough to draw the curves, ~10 KB a file for the 162 committed cells


def compact_weights(rows: list[dict], points: int = CURVE_POINTS) -> list[dict]:
    """At most `points` of the logged weight rows, evenly spaced (the first and the last kept), values rounded to 5
    decimals (idempotent: compacting compacted rows changes nothing)."""
    if len(rows) > points:
        stride = math.ceil((len(rows) - 1) / (points - 1))
        rows = [row for i, row in enumerate(rows) if i % stride == 0 or i == len(rows) - 1]
    return [{k: v if k == "step" else round(v, 5) for k, v in row.items()} for row in rows]


def summarize_run(result: dict, log_history: list[dict]) -> dict[str, Any]:
    """The cell's metrics from a run's `result.json` (its `checkpoints`) and its `trainer_state.json` log.

    Returns:
        `curve` (one row per evaluation: `fraction` of the budget, `step`, `accuracy*` in [0, 1], `pretrain_loss`
        and `forgetting` in nats/token), `primary` (mean `accuracy` over the evaluations after the start: the area
        under the accuracy curve), `final` (the last row's accuracies), `forgetting` (the last row's), `rl_learnt_step`
        (first evaluated step with `accuracy_rl_only` >= 0.8; None if never), `train_wall_s`, `train_cpu_s` and
        `weights` (the logged `weight/*`, `dare/factor/*` and `dare/signal/*` with their `step`).
    """
    curve, best = [], math.inf
    for row in result["checkpoints"]:
        best = min(best, row["pretrain_loss"])
        entry = {"fraction": round(row["budget_fraction"], 4), "step": row["step"]}
        entry.update({k: v for k, v in row.items() if k.startswith("accuracy")})
        entry.update(pretrain_loss=row["pretrain_loss"], forgetting=row["pretrain_loss"] - best)
        curve.append(entry)
    after_start = [row for row in curve if row["fraction"] > 0]
    learnt = [row["step"] for row in after_start if row.get("accuracy_rl_only", 0.0) >= RL_LEARNT]
    weights = compact_weights(
        [
            {
                "step": h["step"],
                **{k: v for k, v in h.items() if k.startswith(("weight/", "dare/factor/", "dare/signal/"))},
            }
            for h in log_history
            if any(k.startswith("weight/") for k in h)
        ]
    )
    return {
        "curve": curve,
        "primary": statistics.fmean(row["accuracy"] for row in after_start),
        "final": {k: v for k, v in curve[-1].items() if k.startswith("accuracy")},
        "forgetting": curve[-1]["forgetting"],
        "rl_learnt_step": learnt[0] if learnt else None,
        "train_wall_s": result["wall_s"],
        "train_cpu_s": result["cpu_s"],
        "weights": weights,
    }


@dataclass
class Bench:
    """One invocation's settings (`main` builds it from the command line)."""

    results_dir: Path
    work_dir: Path
    job_argv: list[str]
    eval_every: float = EVAL_EVERY
    heldout_docs: int = HELDOUT_DOCS
    eval_per_split_family: int | None = None
    teacher: str | None = None  # the teacher's folder, once trained
    wrong_teacher: str | None = None  # the shift task's wrong teacher's folder, once trained
    machine: dict = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)  # the cells that failed in this invocation (`run_cells`)

    def cell_path(self, cell: Cell) -> Path:
        return self.results_dir / f"{cell.id}.json"

    def settings(self, cell: Cell) -> dict[str, Any]:
        out = cell.settings(self.job_argv, self.eval_every, self.heldout_docs) | {
            "eval_per_split_family": self.eval_per_split_family
        }
        if cell.task == SHIFT.name:  # only the shift cells' settings say how the teacher changes
            out |= {"swap_fraction": SHIFT_SWAP_FRACTION, "wrong_teacher": WRONG_TEACHER}
        return out


def load_cells(results_dir: Path) -> dict[str, dict]:
    """Every cell file of `results_dir` by its id (a file that is not a cell's is ignored)."""
    cells = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        data = read_json(path)
        if isinstance(data, dict) and "cell" in data:
            cells[data["cell"]] = data
    return cells


def is_done(bench: Bench, cell: Cell, cells: dict[str, dict]) -> bool:
    """Whether the cell's file exists with the cell's settings (another file is run again, with a warning)."""
    done = cells.get(cell.id)
    if done is None:
        return False
    if done.get("settings") != bench.settings(cell):
        logger.warning("%s: its file was made with other settings; running it again", cell.id)
        return False
    return True


def ensure_teacher(bench: Bench) -> str:
    """T2's teacher: a run of the main job (`examples/trapo.py` under the defaults of when the grid was declared,
    pinned by `TEACHER_JOB_ARGV`; what docs/results/distillation.md used), trained once into `<work_dir>/teacher` with the cells' extra job arguments; reused when its marker file
    says it was made with the same arguments."""
    folder = bench.work_dir / "teacher"
    marker = folder / "benchmark_teacher.json"
    argv = [
        "examples/trapo.py",
        "--output_dir",
        str(folder),
        "--report_to",
        "none",
        *TEACHER_JOB_ARGV,
        *bench.job_argv,
    ]
    if (read_json(marker) or {}).get("argv") != argv:
        logger.info("training T2's teacher into %s", folder)
        run = run_child(
            [sys.executable, *argv, "--overwrite_output_dir", "True"],
            log_path=bench.work_dir / "teacher.log",
            env=child_env(1),
        )
        write_json_atomic(marker, {"argv": argv, "cpu_s": run.cpu_s, "wall_s": run.wall_s})
    return str(folder)


def ensure_wrong_teacher(bench: Bench) -> str:
    """The shift task's wrong teacher: T2's teacher's run (`ensure_teacher`'s arguments, another folder) with the RL
    prompts' `rl_only` answers shifted by one letter (`weighting_shift.wrong_teacher_worker`, a child process), trained
    once into `<work_dir>/wrong_teacher`; reused when its marker file says it was made with the same arguments.

    The marker (`benchmark_wrong_teacher.json`, copied into every shift cell's file) holds the arguments, the child's
    CPU and wall seconds, and the greedy accuracy on the suite's held-out `lst` prompts of the wrong teacher
    (`wrong_teacher`: `against_shifted`, `against_true`) and of T2's teacher (`true_teacher`).

    Returns:
        The wrong teacher's folder.
    """
    folder = bench.work_dir / "wrong_teacher"
    marker = folder / "benchmark_wrong_teacher.json"
    argv = ["--output_dir", str(folder), "--report_to", "none", *TEACHER_JOB_ARGV, *bench.job_argv]
    args = {"argv": argv, **WRONG_TEACHER}
    if (read_json(marker) or {}).get("args") != args:
        bench.teacher = bench.teacher or ensure_teacher(bench)
        logger.info("training the shift task's wrong teacher into %s", folder)
        result_path = bench.work_dir / "wrong_teacher.result.json"
        result_path.unlink(missing_ok=True)
        spec = {
            "job_argv": [*argv, "--overwrite_output_dir", "True"],
            "shifted_sft": WRONG_TEACHER["shifted_sft"],
            "true_teacher": bench.teacher,
            "threads": 1,
            "result_path": str(result_path),
        }
        run = launch_worker(
            __file__,
            spec,
            bench.work_dir / "wrong_teacher.spec.json",
            threads=1,
            log_path=bench.work_dir / "wrong_teacher.log",
            name="the wrong teacher",
            worker_args=["--_wrong_teacher"],
        )
        write_json_atomic(marker, {"args": args, "cpu_s": run.cpu_s, "wall_s": run.wall_s, **read_json(result_path)})
    return str(folder)


def run_cell(bench: Bench, cell: Cell) -> dict:
    """Run one cell in a child process and write its file atomically; its contents. A shift cell (task `S`) runs
    `weighting_shift.shift_worker` with the wrong teacher (`ensure_wrong_teacher`) and records `final_rl_only`, the
    swap (`teacher_swap`) and the wrong teacher's marker."""
    import compare_pipelines

    run_dir = bench.work_dir / "runs" / cell.id
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("result.json", SWAP_RECORD):
        (run_dir / stale).unlink(missing_ok=True)
    task = ALL_TASKS[cell.task]
    if task.vlm:
        spec = {
            "seed": cell.seed,
            "run_dir": str(run_dir),
            "job_argv": bench.job_argv,
            "job_extra": job_extra(cell),
            "eval_every": bench.eval_every,
            "threads": 1,
        }
        script, worker_args = __file__, ["--_vlm"]
    else:
        job_argv = main_job_argv(cell.suite, bench.job_argv)
        if task.teacher:
            bench.teacher = bench.teacher or ensure_teacher(bench)
            job_argv += ["--teacher_model_name_or_path", bench.teacher]
        args = SimpleNamespace(
            quick=False, budget="steps", eval_every=bench.eval_every, heldout_docs=bench.heldout_docs,
            eval_per_split_family=bench.eval_per_split_family, threads=1, code="", rerun=True,
        )  # fmt: skip
        spec = compare_pipelines.make_spec(args, job_argv, "trapo", cell.seed, str(run_dir), job_extra(cell))
        script, worker_args = compare_pipelines.__file__, []
        if cell.task == SHIFT.name:
            bench.wrong_teacher = bench.wrong_teacher or ensure_wrong_teacher(bench)
            spec |= {
                "wrong_teacher": bench.wrong_teacher,
                "swap_fraction": SHIFT_SWAP_FRACTION,
                "swap_record": str(run_dir / SWAP_RECORD),
            }
            script, worker_args = __file__, ["--_shift"]
    logger.info("%s: running", cell.id)
    run = launch_worker(
        script,
        spec,
        run_dir / "spec.json",
        threads=1,
        log_path=run_dir / "log.txt",
        name=cell.id,
        worker_args=worker_args,
    )
    state = read_json(run_dir / "trainer_state.json") or {}
    out = {
        "cell": cell.id,
        "task": cell.task,
        "arm": cell.arm,
        "mixture": dict(cell.mixture),
        "suite": cell.suite,
        "seed": cell.seed,
        "settings": bench.settings(cell),
        **summarize_run(read_json(run_dir / "result.json"), state.get("log_history", [])),
        "wall_s": run.wall_s,
        "cpu_s": run.cpu_s,
        "peak_rss_mb": run.peak_rss_mb,
        "loadavg_start": list(run.loadavg_start),
        "loadavg_end": list(run.loadavg_end),
        "machine": bench.machine,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if task.teacher:  # which teacher (its settings and cost; the folder itself is not committed)
        out["teacher"] = read_json(Path(bench.teacher) / "benchmark_teacher.json")
    if cell.task == SHIFT.name:
        swap = read_json(run_dir / SWAP_RECORD)
        if swap is None:  # a fault of the code, not of the run: no file is written for the cell
            raise RuntimeError(f"{cell.id}: the run ended without swapping its teacher (no {run_dir / SWAP_RECORD}).")
        out |= {
            "final_rl_only": out["final"]["accuracy_rl_only"],
            "teacher_swap": swap,
            "wrong_teacher": read_json(Path(bench.wrong_teacher) / "benchmark_wrong_teacher.json"),
        }
    write_json_atomic(bench.cell_path(cell), out)
    logger.info("%s: done in %.0f s (primary %.3f)", cell.id, run.wall_s, out["primary"])
    return out


def prepare_teachers(bench: Bench, cells: list[Cell]) -> None:
    """Train (or find) the teachers `cells` need, one after the other, before they run side by side: two cells that
    each trained a missing teacher would write into one folder (the second is refused while the first holds it).

    Raises:
        ChildFailed: a teacher's run failed.
    """
    if any(ALL_TASKS[c.task].teacher for c in cells):
        bench.teacher = bench.teacher or ensure_teacher(bench)
    if any(c.task == SHIFT.name for c in cells):
        bench.wrong_teacher = bench.wrong_teacher or ensure_wrong_teacher(bench)


def run_cells(
    bench: Bench,
    tasks: tuple[str, ...],
    arms: tuple[str, ...],
    max_cells: int | None,
    time_budget_s: float | None,
    jobs: int = 1,
    seeds: tuple[int, ...] | None = None,
    suites: tuple[int, ...] | None = None,
) -> list[str]:
    """Run the grid's cells that are not done, in `plan` order, within `max_cells` and `time_budget_s`.

    A `tuned_static` cell waits for its task's search (the plan is rebuilt after each batch of runs, so T2's search
    and the tuned mixture appear once the cells that decide them are done). `arms` filters the test cells (the search
    runs with `tuned_static`), `seeds` and `suites` (None: all) the test cells' pairs. A failed cell is logged and
    left without a file (it runs again next time); its id is added to `bench.failed` (the script then exits 1).

    Returns:
        The ids of the cells run (files written) in this call.
    """
    started, ran, failed, walls = time.perf_counter(), [], [], []

    def budget_left() -> bool:
        if max_cells is not None and len(ran) + len(failed) >= max_cells:
            return False
        if time_budget_s is None:
            return True
        expected = statistics.fmean(walls) if walls else 0.0
        return time.perf_counter() - started + expected <= time_budget_s

    def wanted(cell: Cell) -> bool:
        if cell.arm == "search":
            return "tuned_static" in arms
        return (
            cell.arm in arms
            and (seeds is None or cell.seed in seeds)
            and (suites is None or cell.suite is None or cell.suite in suites)
        )

    def one(cell: Cell) -> None:
        if not budget_left():
            return
        try:
            out = run_cell(bench, cell)
        except ChildFailed as error:
            logger.error("%s failed: %s", cell.id, error)
            failed.append(cell.id)
            return
        ran.append(cell.id)
        walls.append(out["wall_s"])

    while budget_left():
        cells = load_cells(bench.results_dir)
        todo = [c for c in plan(cells, tasks) if wanted(c) and c.id not in failed and not is_done(bench, c, cells)]
        runnable = []
        for cell in todo:
            if cell.arm == "tuned_static" and not cell.mixture:
                break  # its search is not done: run what comes before, then plan again
            runnable.append(cell)
        if not runnable:
            if todo:
                logger.warning("%d cells wait for a search that did not finish (failed cells?)", len(todo))
            break
        if max_cells is not None:
            runnable = runnable[: max_cells - len(ran) - len(failed)]
        try:
            prepare_teachers(bench, runnable)
        except ChildFailed as error:
            logger.error("%s", error)
            failed += [c.id for c in runnable]
            break
        map_jobs(one, runnable, jobs)
    if failed:
        logger.error("failed cells (no file written; they run again next time): %s", ", ".join(failed))
    bench.failed += failed
    return ran


# =====================================================================================================================
# Statistics, the decision rule and the report
# =====================================================================================================================
def test_cells(cells: dict[str, dict], task: str, arm: str) -> dict[tuple, dict]:
    """The done test cells of (task, arm) by their (suite, seed) pair."""
    return {(c["suite"], c["seed"]): c for c in cells.values() if c["task"] == task and c["arm"] == arm}


def paired(cells: dict[str, dict], task: str, arm: str, reference: str, metric: str = "primary") -> dict | None:
    """The paired 95 % t interval of `metric`(arm) − `metric`(reference) over the (suite, seed) pairs both have done
    (`runlib.paired_interval`), with `pairs`; None with fewer than 2 pairs."""
    a, b = test_cells(cells, task, arm), test_cells(cells, task, reference)
    keys = sorted(set(a) & set(b), key=lambda k: (k[1], -1 if k[0] is None else k[0]))
    if len(keys) < 2:
        return None
    return paired_interval([a[k][metric] - b[k][metric] for k in keys])


def missing_tests(cells: dict[str, dict]) -> list[str]:
    """The test cells the decision rule needs (every arm on every task's pairs) that have no file."""
    done = {(c["task"], c["arm"], c["suite"], c["seed"]) for c in cells.values()}
    return [
        Cell(name, arm, suite, seed).id
        for name, task in TASKS.items()
        for suite, seed in task.pairs()
        for arm in ARMS
        if (name, arm, suite, seed) not in done
    ]


def decide(cells: dict[str, dict]) -> dict[str, Any]:
    """The pre-registered decision rule (docs/weighting_benchmark.md), applied to complete cells.

    Intervals are paired 95 % t intervals of the primary metric (forgetting for rule 1's last condition) over the
    (suite, seed) pairs; "above 0" means its low end > 0, "below" its high end < the bound.

    1. An arm becomes the default if its interval against `dare` lies above 0 on T1 or T2, no task's (T1, T2, T3)
       lies below 0, and no task's forgetting interval against `dare` lies above +0.01 nats/token; of several, the
       larger mean gain over T1 and T2 together (the mean of their pooled differences) wins.
    2. Else `dare` stays if its interval against `static` lies above 0 on T1 or T2, none lies below 0 (T3 included),
       and its interval against `tuned_static` lies below −0.02 on neither T1 nor T2.
    3. Else: "static" if no task's interval of `static` against `dare` lies below 0, else `dare` (the simplest arm not
       worse); the shift task must be run.
    (4. T3 only vetoes: it enters the "no task's interval below 0" conditions.)

    The shift task is also to be run when rule 1 picks `tuned_static` (a static mixture: no adaptive weighting beat
    static weights; implementation note of 2026-12-05).

    Returns:
        `{"applied": False, "missing": [...]}` while a needed cell is missing; else `{"applied": True, "rule": 1|2|3,
        "default": arm, "shift_task": bool, "reasons": [sentences]}`.
    """
    missing = missing_tests(cells)
    if missing:
        return {"applied": False, "missing": missing}
    deciding, every = ("T1", "T2"), tuple(TASKS)

    def above(arm, ref, tasks, metric="primary", bound=0.0):
        return [t for t in tasks if paired(cells, t, arm, ref, metric)["low"] > bound]

    def below(arm, ref, tasks, metric="primary", bound=0.0):
        return [t for t in tasks if paired(cells, t, arm, ref, metric)["high"] < bound]

    reasons, qualified = [], {}
    for arm in ARMS:
        if arm == "dare":
            continue
        wins, losses = above(arm, "dare", deciding), below(arm, "dare", every)
        forgets = [t for t in every if paired(cells, t, arm, "dare", "forgetting")["low"] > FORGETTING_MARGIN]
        if wins and not losses and not forgets:
            pooled = [
                test_cells(cells, t, arm)[k]["primary"] - test_cells(cells, t, "dare")[k]["primary"]
                for t in deciding
                for k in test_cells(cells, t, arm)
            ]
            qualified[arm] = statistics.fmean(pooled)
        elif wins:
            why = (f"its interval lies below 0 on {', '.join(losses)}" if losses else "") or (
                f"its forgetting interval lies above +{FORGETTING_MARGIN} on {', '.join(forgets)}"
            )
            reasons.append(f"`{arm}` beats `dare` on {', '.join(wins)} but {why}.")
    if qualified:
        best = max(qualified, key=qualified.get)
        reasons.append(
            f"rule 1: `{best}` beats `dare` (mean gain over T1 and T2 {qualified[best]:+.3f}"
            + (
                f"; also qualified: {', '.join(f'`{a}`' for a in qualified if a != best)}"
                if len(qualified) > 1
                else ""
            )
            + ")."
        )
        static_win = best == "tuned_static"
        if static_win:
            reasons.append(
                "the winner is a static mixture: no adaptive weighting beat static weights, so the shift task is to be "
                "run (implementation note of 2026-12-05)."
            )
        return {"applied": True, "rule": 1, "default": best, "shift_task": static_win, "reasons": reasons}
    wins, losses = above("dare", "static", deciding), below("dare", "static", every)
    short = below("dare", "tuned_static", deciding, bound=TUNED_MARGIN)
    if wins and not losses and not short:
        reasons.append(
            f"rule 2: `dare` beats `static` on {', '.join(wins)} and is within {-TUNED_MARGIN:g} of `tuned_static`."
        )
        return {"applied": True, "rule": 2, "default": "dare", "shift_task": False, "reasons": reasons}
    if wins:
        why = f"lies below 0 against `static` on {', '.join(losses)}" if losses else (
            f"lies below {TUNED_MARGIN} against `tuned_static` on {', '.join(short)}"
        )  # fmt: skip
        reasons.append(f"`dare` beats `static` on {', '.join(wins)} but its interval {why}.")
    worse = below("static", "dare", every)
    default = "dare" if worse else "static"
    reasons.append(
        "rule 3: no weighting beat static weights; "
        + (
            f"`static` is worse than `dare` on {', '.join(worse)}, so `dare` stays."
            if worse
            else "`static` is not worse."
        )
    )
    return {"applied": True, "rule": 3, "default": default, "shift_task": True, "reasons": reasons}


SHIFT_METRIC = "final_rl_only"  # the shift task's primary metric: the last evaluation's rl_only accuracy


def missing_shift(cells: dict[str, dict]) -> list[str]:
    """The shift cells (every arm on the shift task's pairs) that have no file."""
    done = {(c["arm"], c["suite"], c["seed"]) for c in cells.values() if c["task"] == SHIFT.name}
    return [
        Cell(SHIFT.name, arm, suite, seed).id
        for suite, seed in SHIFT.pairs()
        for arm in ARMS
        if (arm, suite, seed) not in done
    ]


def decide_shift(cells: dict[str, dict]) -> dict[str, Any]:
    """The shift task's decision (docs/weighting_benchmark.md: "decision as rule 1 with `static` in place of
    `dare`"), applied when all its cells are done: an arm beats `static` if its paired 95 % t interval of the final
    `rl_only` accuracy (`final_rl_only`) against `static` lies above 0 (low end > 0) and its forgetting interval
    against `static` does not lie above +0.01 nats/token (low end > 0.01); of several, the larger mean gain is named
    first.

    Returns:
        `{"applied": False, "missing": [...]}` while a shift cell is missing; else `{"applied": True, "winners":
        {arm: mean gain in final rl_only accuracy}, "best": arm or None, "reasons": [sentences]}`.
    """
    missing = missing_shift(cells)
    if missing:
        return {"applied": False, "missing": missing}
    reasons, qualified, gains = [], {}, {}
    for arm in ARMS:
        if arm == "static":
            continue
        gain = gains[arm] = paired(cells, SHIFT.name, arm, "static", SHIFT_METRIC)
        forgets = paired(cells, SHIFT.name, arm, "static", "forgetting")["low"] > FORGETTING_MARGIN
        if gain["low"] > 0 and not forgets:
            qualified[arm] = gain["mean"]
        elif gain["low"] > 0:
            reasons.append(
                f"`{arm}` beats `static` on the final `rl_only` accuracy but its forgetting interval against `static` "
                f"lies above +{FORGETTING_MARGIN}."
            )
    adaptive = [arm for arm in ARMS if arm not in ("static", "tuned_static")]
    if not any(arm in qualified for arm in adaptive):  # said plainly, with each one's interval
        reasons.append(
            "No adaptive weighting beats `static` on the final `rl_only` accuracy (paired by seed): "
            + ", ".join(f"{ARM_NAMES[arm]} {_interval(gains[arm])}" for arm in adaptive)
            + "."
        )
    if not qualified:
        reasons.append(
            "no arm's interval of the final `rl_only` accuracy against `static` lies above 0 (or it forgets more)."
        )
        return {"applied": True, "winners": {}, "best": None, "reasons": reasons}
    ranked = sorted(qualified, key=qualified.get, reverse=True)  # sorted is stable: ties keep the arms' order
    reasons.insert(
        0,
        f"`{ranked[0]}` beats `static` (final `rl_only` accuracy {_interval(gains[ranked[0]])}"
        + (f"; also: {', '.join(f'`{a}` {_interval(gains[a])}' for a in ranked[1:])}" if len(ranked) > 1 else "")
        + ").",
    )
    return {"applied": True, "winners": qualified, "best": ranked[0], "reasons": reasons}


def shift_lines(cells: dict[str, dict]) -> list[str]:
    """The report's "Shift task" section from the done shift cells of `cells` (none: "not run yet")."""
    mine = {k: c for k, c in cells.items() if c["task"] == SHIFT.name}
    total = len(SHIFT.pairs()) * len(ARMS)
    lines = [f"### Shift task: {SHIFT.title}", ""]
    if not mine:
        return lines + [
            _wrap(
                f"Not run yet ({total} cells: `python scripts/experiments/weighting_benchmark.py --shift`; the "
                "pre-registration runs it when rule 3 applies, and the implementation note of 2026-12-05 when rule 1 "
                "picks `tuned_static`)."
            )
        ]
    status = f"**complete: {total} cells**" if len(mine) >= total else f"**partial: {len(mine)} of {total} cells**"
    lines += [
        _wrap(
            f"{status}. Primary metric: the final `rl_only` accuracy (the last evaluation's), paired by seed against "
            f"`static`; the teacher's weights are replaced by the wrong teacher's after {100 * SHIFT_SWAP_FRACTION:g} % "
            "of the steps."
        ),
        "",
    ]
    wrong = next((c["wrong_teacher"] for c in mine.values() if c.get("wrong_teacher")), None)
    if wrong:
        accuracy, true = wrong["wrong_teacher"], wrong.get("true_teacher")
        lines += [
            _wrap(
                "The wrong teacher (T2's teacher's run with every `lst` RL answer shifted by one letter"
                + (", and shifted `lst` demonstrations in its SFT data" if wrong["args"].get("shifted_sft") else "")
                + f"; trained once, {wrong['cpu_s']:,.0f} CPU s): greedy accuracy on the {accuracy['prompts']} held-out "
                f"`lst` prompts {accuracy['against_shifted']:.3f} against the shifted answers, "
                f"{accuracy['against_true']:.3f} against the true ones"
                + (f" (T2's teacher: {true['against_true']:.3f} against the true ones)." if true else ".")
            ),
            "",
        ]
    steps = {}
    for c in mine.values():
        steps[c["teacher_swap"]["step"]] = steps.get(c["teacher_swap"]["step"], 0) + 1
    at = ", ".join(f"at step {step} in {n} of {len(mine)} cells" for step, n in sorted(steps.items()))
    lines += [
        _wrap(f"The swap, as the cells' files record it (`teacher_swap`): {at}."),
        "",
        "| arm | cells | primary: final `rl_only` accuracy | vs `static` | `rl_only` at the swap | accuracy area | "
        "forgetting | forgetting vs `static` | CPU s/cell |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        done = list(test_cells(cells, SHIFT.name, arm).values())
        if not done:
            lines.append(f"| `{arm}` | 0 of {len(SHIFT.pairs())} |" + " – |" * 7)
            continue
        at_swap = [
            row["accuracy_rl_only"]
            for c in done
            for row in c["curve"]
            if row["step"] == c["teacher_swap"]["swap_step"] and "accuracy_rl_only" in row
        ]
        cols = [
            f"`{arm}`",
            f"{len(done)} of {len(SHIFT.pairs())}",
            _mean_std([c[SHIFT_METRIC] for c in done]),
            "" if arm == "static" else _interval(paired(cells, SHIFT.name, arm, "static", SHIFT_METRIC)),
            _mean_std(at_swap),
            _mean_std([c["primary"] for c in done]),
            _mean_std([c["forgetting"] for c in done]),
            "" if arm == "static" else _interval(paired(cells, SHIFT.name, arm, "static", "forgetting")),
            f"{statistics.fmean(c['cpu_s'] for c in done):,.0f}",
        ]
        lines.append("| " + " | ".join(cols) + " |")
    lines.append("")
    decision = decide_shift(cells)
    if not decision["applied"]:
        lines.append(_wrap(f"Decision: not applied, {len(decision['missing'])} of {total} cells missing."))
    else:
        lines.append(
            _wrap(
                f"Decision: `{decision['best']}` beats `static` on the shift task."
                if decision["best"]
                else "Decision: no arm beats `static` on the shift task."
            )
        )
        lines += ["", *(_wrap(f"- {reason}") for reason in decision["reasons"])]
    return lines


def _interval(interval: dict | None) -> str:
    if interval is None:
        return "–"
    return f"{interval['mean']:+.3f} [{interval['low']:+.3f}, {interval['high']:+.3f}] ({interval['n']})"


def _mean_std(values: list[float], digits: int = 3) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=LINE_WIDTH, break_long_words=False, break_on_hyphens=False)


def plot_weights(cells: dict[str, dict], plots_dir: Path) -> dict[str, Path]:
    """One PNG per arm (`weights_<arm>.png`): the weight, signal and factor curves of each objective over the steps of
    the arm's first done cell in plan order (T1, seed 0, suite 0 when done). Returns arm -> file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = {cell.id: i for i, cell in enumerate(plan(cells))}
    out = {}
    for arm in ARMS:  # a cell of the arm's own (the search's cells run static weights) in the main grid
        mine = [c for c in cells.values() if c["arm"] == arm and c.get("weights") and c["task"] in TASKS]
        mine.sort(key=lambda c: order.get(c["cell"], len(order)))
        if not mine:
            continue
        cell = mine[0]
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4), sharex=True)
        for ax, (prefix, title) in zip(
            axes, (("weight/", "effective weight"), ("dare/signal/", "signal"), ("dare/factor/", "factor"))
        ):
            names = sorted({k[len(prefix) :] for row in cell["weights"] for k in row if k.startswith(prefix)})
            for name in names:
                points = [(row["step"], row[prefix + name]) for row in cell["weights"] if prefix + name in row]
                ax.plot([p[0] for p in points], [p[1] for p in points], label=name)
            ax.set_title(title)
            ax.set_xlabel("step")
            if names:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        fig.suptitle(f"{arm}: {cell['cell']}")
        fig.tight_layout()
        plots_dir.mkdir(parents=True, exist_ok=True)
        path = plots_dir / f"weights_{arm}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        out[arm] = path
    return out


SPLIT_KEYS = ("accuracy", "accuracy_sft_tasks", "accuracy_rl_only")


def family_lines(cells: dict[str, dict], task: str) -> list[str]:
    """A sentence per arm with the final accuracy of each task family (mean over its done cells), for tasks whose
    evaluation reports families besides the splits (T3's `shape`, ...); [] otherwise."""
    lines = []
    for arm in ARMS:
        mine = list(test_cells(cells, task, arm).values())
        families = sorted({k for c in mine for k in c["final"] if k not in SPLIT_KEYS})
        if families:
            parts = ", ".join(
                f"`{k.removeprefix('accuracy_')}` {statistics.fmean(c['final'][k] for c in mine if k in c['final']):.3f}"
                for k in families
            )
            lines.append(f"- final accuracy per family, `{arm}`: {parts}.")
    return [*lines, ""] if lines else []


def render_block(cells: dict[str, dict], plots: dict[str, str] | None = None, cost: dict | None = None) -> str:
    """The results block of docs/weighting_benchmark.md from the done cells (any subset of the grid).

    Args:
        cells: cell id -> cell file contents (the shift task's cells go to its own section, after the main grid's).
        plots: arm -> the plot's link target relative to the page (None: no plot links).
        cost: `benchmark_weighting.py --json`'s result (None: not measured yet), rendered last ([`cost_lines`]).
    """
    everything, cells = cells, {k: c for k, c in cells.items() if c["task"] in TASKS}
    total, done = grid_size(), len(cells)
    status = f"**complete: {total} cells**" if done >= total else f"**partial: {done} of {total} cells**"
    cpu = sum(c["cpu_s"] for c in cells.values())
    lines = [
        _wrap(
            f"{status} (`python scripts/experiments/weighting_benchmark.py --report` renders this from "
            f"`docs/results/weighting/cells/`; `python scripts/experiments/weighting_benchmark.py` runs the missing "
            f"cells in the declared order). CPU time of the done cells: {cpu / 3600:.2f} h ({cpu:,.0f} s, each cell's "
            "process, evaluations included). Intervals: mean paired difference [95 % t interval] (pairs), paired by "
            "(suite, seed); `–` where fewer than 2 pairs are done."
        ),
        "",
    ]
    teacher = next((c["teacher"] for c in cells.values() if c.get("teacher")), None)
    if teacher:
        lines += [f"T2's teacher (not a cell, trained once): {teacher['cpu_s']:,.0f} CPU s.", ""]
    loads = [c["loadavg_start"][0] for c in cells.values()] + [c["loadavg_end"][0] for c in cells.values()]
    if loads:
        lines += [
            _wrap(
                f"The cells' 1-minute load average ranged {min(loads):.1f}–{max(loads):.1f} on "
                f"{next(iter(cells.values()))['machine'].get('cpu_count', '?')} cores: wall times from a shared "
                "machine are not measurements of the arms' cost (the weighting's cost per step is to be measured alone)."
            ),
            "",
        ]
    for name, task in TASKS.items():
        n_pairs = len(task.pairs())
        lines += [
            f"### {name}: {task.title}",
            "",
            "| arm | cells | primary: accuracy area | vs `dare` | vs `static` | vs `tuned_static` | final accuracy | "
            "`sft_tasks` | `rl_only` | `rl_only` ≥ 0.8 (first step) | forgetting | forgetting vs `dare` | CPU s/cell |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for arm in ARMS:
            mine = list(test_cells(cells, name, arm).values())
            if not mine:
                lines.append(f"| `{arm}` | 0 of {n_pairs} |" + " – |" * 11)
                continue
            learnt = [c["rl_learnt_step"] for c in mine if c["rl_learnt_step"] is not None]
            steps = f"{len(learnt)} of {len(mine)}" + (f" ({statistics.fmean(learnt):,.0f})" if learnt else "")
            cols = [
                f"`{arm}`",
                f"{len(mine)} of {n_pairs}",
                _mean_std([c["primary"] for c in mine]),
                *(
                    "" if ref == arm else _interval(paired(cells, name, arm, ref))
                    for ref in ("dare", "static", "tuned_static")
                ),
                *(_mean_std([c["final"][k] for c in mine if k in c["final"]]) for k in SPLIT_KEYS),
                steps,
                _mean_std([c["forgetting"] for c in mine]),
                "" if arm == "dare" else _interval(paired(cells, name, arm, "dare", "forgetting")),
                f"{statistics.fmean(c['cpu_s'] for c in mine):,.0f}",
            ]
            lines.append("| " + " | ".join(cols) + " |")
        lines += ["", *family_lines(cells, name)]
    won = winners(cells)
    lines += ["### The static-weight search (validation suite 2, seeds 0 and 1)", ""]
    for name in ("T1", "T2"):
        winner = won[name]
        planned = search_cells(name, won["T1"]["mixture"] if won["T1"] else None)
        done_search = [c for c in planned if c.id in cells]
        if winner is None:
            cpu = sum(cells[c.id]["cpu_s"] for c in done_search)
            left = f"{len(done_search)} of {len(planned)}" if planned else "0 (it needs T1's winner)"
            lines.append(f"- {name}: {left} search cells done ({cpu:,.0f} CPU s so far).")
            continue
        table = ", ".join(f"{mixture_label(r['mixture'])} {r['primary']:.3f}" for r in winner["table"])
        lines.append(
            _wrap(
                f"- {name}: winner `{mixture_label(winner['mixture'])}` (mean primary {winner['primary']:.3f}); "
                f"{table}. The search cost {winner['cpu_s']:,.0f} CPU s ({winner['cpu_s'] / 3600:.2f} h)."
            )
        )
    lines += ["", "### Decision", ""]
    decision = decide(cells)
    if not decision["applied"]:
        lines.append(
            _wrap(
                f"Not applied: the rule needs every arm's test cells on T1, T2 and T3 "
                f"({len(decision['missing'])} of them missing)."
            )
        )
    else:
        lines.append(
            _wrap(
                f"Rule {decision['rule']} applies: the default becomes `{decision['default']}`"
                + ("; the shift task is to be run." if decision["shift_task"] else ".")
            )
        )
        lines += ["", *(_wrap(f"- {reason}") for reason in decision["reasons"])]
    if plots:
        lines += [
            "",
            "Weights, signals and factors of one run per arm (its first done cell): "
            + ", ".join(f"[`{arm}`]({target})" for arm, target in plots.items())
            + ".",
        ]
    lines += ["", *shift_lines(everything)]
    lines += cost_lines(cost)
    return "\n".join(lines) + "\n"


def cost_lines(cost: dict | None) -> list[str]:
    """The section of the weighting's own cost per step: `benchmark_weighting.py --json`'s result (`COST_FILE`,
    measured alone on a quiet machine, as the declaration's secondary metric asks), its table and its command; a line
    saying it is not measured yet without one."""
    title = ["", "### The weighting's own cost per step (measured alone)", ""]
    command = (
        "`OMP_NUM_THREADS=1 python scripts/benchmarks/benchmark_weighting.py --steps {steps} --repeats {repeats} "
        f"--json {COST_FILE.relative_to(ROOT)}`"
    )
    if not cost:
        return [*title, _wrap(f"Not measured yet: {command.format(steps=30, repeats=5)}, on a quiet machine.")]
    settings = cost["settings"]
    bench = load_module(ROOT / "scripts" / "benchmarks" / "benchmark_weighting.py")
    return [
        *title,
        _wrap(
            f"{command.format(**settings)} ({settings.get('finished', 'date not recorded')}; T1's setup, "
            f"{settings['steps']} steps per run, updates every {settings['update_interval']} steps, one torch "
            f"thread, the benchmark's cells paused: load average {settings.get('load_average_before', '?')} before (it "
            "lags a pause) and "
            f"{settings.get('load_average_after', '?')} after). Milliseconds; Δ against `static` in the same round, "
            f"median [min, max] over {settings['repeats']} rounds. `tuned_static` costs what `static` costs."
        ),
        "",
        bench.table(cost),
    ]


def load_module(path: Path):
    """A script of this repository imported by its path (not on `sys.path`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ARM_NAMES = {"dare": "DARE", "uncertainty": "uncertainty weighting", "gradnorm": "GradNorm", "gac": "GAC-style"}


def claim_block(cells: dict[str, dict]) -> str:
    """README.md's claim about weighting (the `weighting-claim` block), rendered from the cells so that it says
    exactly what the benchmark's table shows: each adaptive arm's paired interval against the default static weights
    per task, the searched static mixture's against DARE, the decision rule's outcome and the shift task's; while the
    rule cannot be applied yet, only how far the benchmark is and that no claim is made."""
    main = {k: c for k, c in cells.items() if c["task"] in TASKS}
    decision = decide(main)
    link = "[the weighting benchmark](docs/weighting_benchmark.md)"
    if not decision["applied"]:
        return (
            _wrap(
                f"**Which weighting is better is being measured.** {link} (pre-registered: DARE, static weights, a "
                "searched static mixture, uncertainty weighting, GradNorm and a GAC-style weight on three tasks) has "
                f"{len(main)} of {grid_size()} cells done; until its decision rule is applied this README claims no "
                "weighting beats another."
            )
            + "\n"
        )

    def cell(arm: str, reference: str, task: str) -> str:
        return _interval(paired(main, task, arm, reference))

    tasks = list(TASKS)
    lines = [
        _wrap(
            f"**Which weighting is better, measured.** {link} (pre-registered; primary metric the area under the "
            "held-out accuracy curve; paired 95 % intervals over (suite, seed): T1 the built-in job's suites, T2 "
            "the same with a teacher, 10 pairs each, T3 the VLM task, 3 seeds):"
        ),
        "",
        "| difference | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for arm in ("dare", "uncertainty", "gradnorm", "gac"):
        lines.append(f"| {ARM_NAMES[arm]} − static | " + " | ".join(cell(arm, "static", t) for t in tasks) + " |")
    lines.append(
        "| searched static mixture − DARE | " + " | ".join(cell("tuned_static", "dare", t) for t in tasks) + " |"
    )
    won = winners(cells)
    named = {"T1": "T1 and T3 (which has no validation suite)", "T2": "T2"}
    mixtures = "; ".join(f"{named[t]}: `{mixture_label(won[t]['mixture'])}`" for t in named if won[t])
    mixtures = f" ({mixtures}; the weights are normalised, so only their ratios count)" if mixtures else ""
    reasons = " ".join(reason[:1].upper() + reason[1:] for reason in decision["reasons"])
    default = decision["default"]
    if default == "tuned_static" and won["T2"]:  # T2's winner holds every multiplier the search set
        settings = ", ".join(f"`{key}={value:g}`" for key, value in sorted(won["T2"]["mixture"].items()))
        reasons += f" So the default is static weights with the searched mixture ({settings}, `pretrain_weight=1`)."
    else:
        reasons += f" So the default is `weighting={WEIGHTING.get(default, default)!r}`."
    reasons += " The other strategies stay selectable with `weighting=`."
    lines += [
        "",
        _wrap(
            "The searched static mixture is the best of a small grid of `*_weight` multipliers on a validation "
            f"suite{mixtures}. Decision: {reasons}"
        ),
    ]
    shift = decide_shift(cells)
    if decision["shift_task"]:
        lines += [
            "",
            _wrap(
                "The declared shift task (a teacher that becomes wrong halfway): "
                + (" ".join(shift["reasons"]) if shift["applied"] else f"{len(shift['missing'])} of its cells to run.")
                + (
                    " The default stays the searched static mixture."
                    if shift.get("best") == decision.get("default") == "tuned_static"
                    else ""
                )
            ),
        ]
    return "\n".join(lines) + "\n"


def plot_links(cells: dict[str, dict], plots_dir: Path, page: Path) -> dict[str, str]:
    """arm -> the link from `page` to the arm's plot in `plots_dir` (`plot_weights` draws one for every arm with a
    done cell that logged weights)."""
    arms = {c["arm"] for c in cells.values() if c.get("weights") and c["task"] in TASKS}
    return {
        arm: os.path.relpath(plots_dir / f"weights_{arm}.png", page.parent).replace(os.sep, "/")
        for arm in ARMS
        if arm in arms
    }


def write_report(results_dir: Path, page: Path, plots_dir: Path) -> str:
    """Render the block from `results_dir`'s cells into `page` and draw the plots into `plots_dir`."""
    cells = load_cells(results_dir)
    plot_weights(cells, plots_dir)
    block = render_block(cells, plot_links(cells, plots_dir, page), read_json(results_dir.parent / COST_FILE.name))
    changed = write_block(BLOCK, block, page)
    logger.info("%s: the %s block %s", page, BLOCK, "updated" if changed else "is already up to date")
    if results_dir.resolve() == RESULTS_DIR.resolve():  # README's claim comes from the committed cells only
        readme = page_of(CLAIM_BLOCK)
        changed = write_block(CLAIM_BLOCK, claim_block(cells), readme)
        logger.info("%s: the %s block %s", readme, CLAIM_BLOCK, "updated" if changed else "is already up to date")
    return block


# =====================================================================================================================
# Command line
# =====================================================================================================================
def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other argument goes to every cell's job (with --results_dir elsewhere).",
        allow_abbrev=False,
    )
    parser.add_argument("--results_dir", default=None, help=f"cell files (default {RESULTS_DIR.relative_to(ROOT)})")
    parser.add_argument("--work_dir", default="weighting-benchmark-output", help="the runs' folders, logs, teacher")
    parser.add_argument("--max_cells", type=positive_int, default=None, help="run at most this many cells")
    parser.add_argument(
        "--time_budget_s", type=non_negative_float, default=None, help="start no cell that would end after this"
    )
    parser.add_argument(
        "--tasks", nargs="+", choices=list(ALL_TASKS), default=None,
        help="the tasks to run (default the main grid's T1 T2 T3; S is the shift task)",
    )  # fmt: skip
    parser.add_argument("--shift", action="store_true", help="run the shift task's cells (with --tasks: as well)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=None, help="only these seeds' test cells")
    parser.add_argument(
        "--suites", type=seed_int, nargs="+", default=None, help="only these suites' test cells (T1, T2)"
    )
    parser.add_argument("--jobs", type=positive_int, default=1, help="cells at a time (one torch thread each)")
    parser.add_argument("--eval_every", type=fraction, default=EVAL_EVERY, help=argparse.SUPPRESS)
    parser.add_argument("--heldout_docs", type=positive_int, default=HELDOUT_DOCS, help=argparse.SUPPRESS)
    parser.add_argument("--eval_per_split_family", type=positive_int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--list", action="store_true", help="print the grid in run order with each cell's state")
    parser.add_argument("--report", action="store_true", help="only render the page and the plots from the cells")
    parser.add_argument("--page", default=None, help="the page --report writes (default docs/weighting_benchmark.md)")
    parser.add_argument("--plots_dir", default=None, help=f"plots (default {PLOTS_DIR.relative_to(ROOT)})")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_vlm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_shift", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_wrong_teacher", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> list[str]:
    """Run cells (default), list them (`--list`) or render the report (`--report`).

    Returns:
        The ids of the cells run (`run` also gives the failed ones; the command line exits 1 when there are any).

    Raises:
        SystemExit: as `run`.
    """
    return run(argv).ran


@dataclass(frozen=True)
class Outcome:
    """What one invocation did: the ids of the cells `ran` (files written) and of those that `failed`."""

    ran: list[str]
    failed: list[str]


def run(argv: list[str] | None = None) -> Outcome:
    """`main`'s work, with the failed cells too (the script's exit status: 1 when a cell or a teacher failed).

    Raises:
        SystemExit: argparse's (status 2) for a value out of its range (`runlib.NumberRange`) and for extra job
            arguments a cell's job does not take or refuses (`runlib.check_job_arguments`, before any cell runs);
            status 1 for extra job arguments or changed evaluation settings without `--results_dir`.
    """
    parser = make_parser()
    args, job_argv = parser.parse_known_args(argv)
    if args._worker:
        if args._shift or args._wrong_teacher:
            import weighting_shift

            (weighting_shift.shift_worker if args._shift else weighting_shift.wrong_teacher_worker)(args._worker)
        else:
            vlm_worker(args._worker)
        return Outcome([], [])
    tasks = list(
        dict.fromkeys([*(args.tasks or ([] if args.shift else TASKS)), *([SHIFT.name] if args.shift else [])])
    )
    if job_argv:  # a misspelt option of this script would otherwise go to every cell, each dying of it
        check_job_arguments(parser, job_argv, job_checks(tuple(tasks)))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    results_dir = Path(args.results_dir) if args.results_dir else RESULTS_DIR
    page = Path(args.page) if args.page else page_of(BLOCK)
    plots_dir = Path(args.plots_dir) if args.plots_dir else PLOTS_DIR
    if args.report:
        print(write_report(results_dir, page, plots_dir))
        return Outcome([], [])
    changed = job_argv or (args.eval_every, args.heldout_docs, args.eval_per_split_family) != (
        EVAL_EVERY, HELDOUT_DOCS, None)  # fmt: skip
    if changed and args.results_dir is None:
        raise SystemExit(
            f"extra job arguments {job_argv} or changed evaluation settings change the cells: pass --results_dir "
            f"PATH so that they do not go to {RESULTS_DIR.relative_to(ROOT)}."
        )
    bench = Bench(
        results_dir, Path(args.work_dir).resolve(), job_argv, args.eval_every, args.heldout_docs,
        args.eval_per_split_family,
    )  # fmt: skip
    if args.list:
        cells = load_cells(results_dir)
        for cell in plan(cells, tuple(tasks)):
            state = "done" if is_done(bench, cell, cells) else "waits for its search" if (
                cell.arm == "tuned_static" and not cell.mixture) else "to run"  # fmt: skip
            print(f"{cell.id}: {state}")
        return Outcome([], [])
    from runlib import go_offline, machine_info

    go_offline()
    info = machine_info()
    bench.machine = {
        k: info[k] for k in ("cpu_model", "cpu_count", "torch", "trl", "git_commit", "code_differs_from_commit")
    }
    ran = run_cells(
        bench,
        tuple(tasks),
        tuple(args.arms),
        args.max_cells,
        args.time_budget_s,
        args.jobs,
        tuple(args.seeds) if args.seeds else None,
        tuple(args.suites) if args.suites else None,
    )
    return Outcome(ran, list(bench.failed))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(1 if run().failed else 0)
