# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""scripts/experiments/weighting_benchmark.py: the grid and its order, a tiny end-to-end run (cells written, a rerun
skips them, a partial report), the committed page's block, and the pre-registered decision rule on hand-made cells
(one case per branch)."""

import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))

import weighting_benchmark as wb  # noqa: E402
from result_blocks import read_block  # noqa: E402


# =====================================================================================================================
# The grid
# =====================================================================================================================
def test_the_plan_follows_the_declared_order_and_holds_the_whole_grid():
    cells = wb.plan({})
    ids = [c.id for c in cells]
    # the first pair's arms, then T1's search (9 mixtures x 2 seeds on the validation suite), then tuned_static
    assert ids[:5] == [f"T1-{arm}-suite0-seed0" for arm in ("dare", "static", "uncertainty", "gradnorm", "gac")]
    assert ids[5:23] == [
        f"T1-search-rl{rl}-sft{sft}-suite2-seed{seed}" for rl in ("0.5", "1", "2") for sft in ("0.5", "1", "2")
        for seed in (0, 1)
    ]  # fmt: skip
    assert ids[23] == "T1-tuned_static-suite0-seed0" and ids[24] == "T1-dare-suite1-seed0"
    assert not cells[23].mixture  # it waits for the search
    assert len(ids) == len(set(ids)) == 60 + 18 + 60 + 18  # T2's search needs T1's winner
    assert wb.grid_size() == 60 + 18 + 60 + 6 + 18


def _search_cell(cell, primary):
    return {"cell": cell.id, "task": cell.task, "arm": cell.arm, "suite": cell.suite, "seed": cell.seed,
            "primary": primary, "cpu_s": 10.0}  # fmt: skip


def test_the_search_picks_the_best_mean_mixture_and_plans_t2s_search_and_the_tuned_cells():
    t1 = wb.search_cells("T1", None)
    scores = {"rl2-sft0.5": (0.9, 0.7), "rl1-sft1": (0.8, 0.8)}  # equal means: the first in grid order wins
    cells = {}
    for cell in t1:
        pair = scores.get(wb.mixture_label(dict(cell.mixture)), (0.1, 0.1))
        cells[cell.id] = _search_cell(cell, pair[cell.seed])
    won = wb.search_winner("T1", cells, None)
    assert won["mixture"] == {"rl_weight": 1.0, "sft_weight": 1.0} and won["primary"] == pytest.approx(0.8)
    assert won["cpu_s"] == 180.0
    planned = wb.plan(cells)
    tuned = [c for c in planned if c.arm == "tuned_static"]
    assert {dict(c.mixture)["rl_weight"] for c in tuned if c.task in ("T1", "T3")} == {1.0}
    t2_search = [c for c in planned if c.task == "T2" and c.arm == "search"]
    assert [dict(c.mixture)["distillation_weight"] for c in t2_search] == [0.5, 0.5, 1.0, 1.0, 2.0, 2.0]
    assert all(dict(c.mixture)["sft_weight"] == 1.0 for c in t2_search)
    assert all(not c.mixture for c in tuned if c.task == "T2")  # T2's own search is not done


def test_summarize_run_computes_the_declared_metrics():
    rows = [
        {"budget_fraction": f / 10, "step": 100 * f, "accuracy": min(f / 5, 1.0), "accuracy_rl_only": f / 10,
         "pretrain_loss": [5.0, 3.0, 2.0, 2.5, 2.2, 2.0, 2.1, 2.3, 2.4, 2.6, 2.45][f]}
        for f in range(11)
    ]  # fmt: skip
    log = [{"step": 10, "weight/rl": 0.2, "dare/factor/rl": 1.1, "loss": 3.0}, {"step": 10, "loss/rl": 1.0}]
    out = wb.summarize_run({"checkpoints": rows, "wall_s": 5.0, "cpu_s": 4.0}, log)
    assert out["primary"] == pytest.approx(statistics.fmean(min(f / 5, 1.0) for f in range(1, 11)))
    assert out["forgetting"] == pytest.approx(2.45 - 2.0)  # above the best so far, at the end
    assert out["rl_learnt_step"] == 800
    assert out["weights"] == [{"step": 10, "weight/rl": 0.2, "dare/factor/rl": 1.1}]
    assert out["final"] == {"accuracy": 1.0, "accuracy_rl_only": 1.0}


def test_every_cell_runs_the_preregistered_multipliers_not_todays_defaults(tmp_path):
    """The decision changed TRAPOConfig's defaults (sft_weight, rl_weight 2): a cell or teacher trained today must
    still get the multipliers the grid ran with (all 1), a mixture over them, and the teacher DARE."""
    from transformers import HfArgumentParser

    from trl_trapo import TRAPOConfig

    def config(extra):
        argv = ["--output_dir", str(tmp_path), *(a for k, v in extra.items() for a in (f"--{k}", str(v)))]
        return HfArgumentParser(TRAPOConfig).parse_args_into_dataclasses(argv)[0]

    weights = ("pretrain_weight", "sft_weight", "rl_weight", "distillation_weight")
    for arm in ("dare", "static", "uncertainty", "gradnorm", "gac"):
        for task in ("T1", "T2", "T3", "S"):
            got = config(wb.job_extra(wb.Cell(task, arm, 0, 0)))
            assert {k: getattr(got, k) for k in weights} == dict.fromkeys(weights, 1.0), (task, arm)
            assert got.weighting == wb.WEIGHTING[arm]
    mixture = (("distillation_weight", 0.5), ("rl_weight", 2.0), ("sft_weight", 2.0))
    tuned = config(wb.job_extra(wb.Cell("T2", "tuned_static", 0, 0, mixture)))
    assert (tuned.pretrain_weight, tuned.sft_weight, tuned.rl_weight, tuned.distillation_weight) == (1, 2, 2, 0.5)
    teacher = HfArgumentParser(TRAPOConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), *wb.TEACHER_JOB_ARGV]
    )[0]
    assert teacher.weighting == "dare" and (teacher.sft_weight, teacher.rl_weight) == (1.0, 1.0)


# =====================================================================================================================
# A tiny end-to-end run
# =====================================================================================================================
PAGE = "# page\n\n<!-- weighting-results:start -->\n<!-- weighting-results:end -->\n"


@pytest.mark.ci
def test_a_tiny_run_writes_cells_skips_them_on_rerun_and_reports_them_as_partial(tmp_path):
    results = tmp_path / "cells"
    argv = ["--tasks", "T1", "--arms", "dare", "static", "--suites", "0", "--seeds", "0", "1",
            "--results_dir", str(results), "--work_dir", str(tmp_path / "work"),
            "--max_steps", "10", "--eval_per_split_family", "2", "--heldout_docs", "20"]  # fmt: skip
    ran = wb.main(argv)
    expected = [f"T1-{arm}-suite0-seed{seed}" for seed in (0, 1) for arm in ("dare", "static")]
    assert ran == expected
    assert sorted(p.stem for p in results.glob("*.json")) == sorted(expected)
    cell = json.loads((results / "T1-static-suite0-seed1.json").read_text(encoding="utf-8"))
    assert cell["settings"]["weighting"] == "static" and cell["settings"]["job_argv"] == ["--max_steps", "10"]
    assert [row["fraction"] for row in cell["curve"]] == pytest.approx([i / 10 for i in range(11)])
    assert cell["primary"] == pytest.approx(statistics.fmean(r["accuracy"] for r in cell["curve"][1:]))
    assert cell["cpu_s"] > 0 and cell["weights"] and all("weight/rl" in row for row in cell["weights"])
    dare = json.loads((results / "T1-dare-suite0-seed0.json").read_text(encoding="utf-8"))
    assert any("dare/factor/rl" in row for row in dare["weights"])
    # a rerun skips the done cells; --max_cells runs a slice
    stamps = {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")}
    assert wb.main(argv) == []
    assert {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")} == stamps
    # the report: partial tables with paired intervals of the 2 pairs, no decision, the plots
    page = tmp_path / "page.md"
    page.write_text(PAGE, encoding="utf-8")
    wb.main(["--report", "--results_dir", str(results), "--page", str(page), "--plots_dir", str(tmp_path / "plots")])
    block = read_block(page.read_text(encoding="utf-8"), wb.BLOCK)
    flat = " ".join(block.split())
    assert "**partial: 4 of 162 cells**" in flat
    assert "| `dare` | 2 of 10 |" in flat and "| `gac` | 0 of 10 |" in flat
    static_row = next(line for line in block.splitlines() if line.startswith("| `static` | 2 of 10"))
    assert static_row.count("(2)") == 2  # against dare: the primary metric and forgetting, 2 pairs each
    assert "Not applied" in flat
    assert (tmp_path / "plots" / "weights_dare.png").stat().st_size > 1000
    assert "[`static`](plots/weights_static.png)" in flat


def test_extra_job_arguments_need_another_results_dir():
    with pytest.raises(SystemExit, match="--results_dir"):
        wb.main(["--max_steps", "3"])


def _no_cell_may_run(monkeypatch) -> list:
    """`run_cell` and the teachers replaced by a recorder that fails the test: nothing may start."""
    started = []

    def refuse(*args):
        started.append(args)
        raise AssertionError("a cell (or a teacher) was started")

    for name in ("run_cell", "ensure_teacher", "ensure_wrong_teacher"):
        monkeypatch.setattr(wb, name, refuse)
    return started


def test_a_misspelt_option_is_refused_with_the_scripts_closest_before_any_cell_runs(tmp_path, monkeypatch, capsys):
    """Trial 17's W12b: `--lsit` (for `--list`) went to every cell's job; the script asked for --results_dir, then each
    cell died of it. Now the job's own parser finds it unknown and the closest option of the script's and the job's is
    named, before anything runs."""
    started = _no_cell_may_run(monkeypatch)
    where = ["--results_dir", str(tmp_path / "cells"), "--work_dir", str(tmp_path / "work")]
    for argv, unknown, close in (
        (["--lsit"], "--lsit", "Did you mean --list (this script)?"),
        ([*where, "--lsit"], "--lsit", "Did you mean --list (this script)?"),
        ([*where, "--tasks", "T1", "--max_step", "3"], "--max_step", "Did you mean --max_steps?"),  # the job's
    ):
        with pytest.raises(SystemExit) as exit_:
            wb.main(argv)
        assert exit_.value.code == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"{unknown}: neither this script nor the main job of the" in err and close in err, err
        assert "examples/trapo.py --help" in err
    assert not started and not (tmp_path / "cells").exists() and not (tmp_path / "work").exists()


def test_the_t3_cells_job_checks_the_extra_arguments_too_and_values_are_the_jobs_to_refuse(
    tmp_path, monkeypatch, capsys
):
    started = _no_cell_may_run(monkeypatch)
    where = ["--results_dir", str(tmp_path / "cells"), "--work_dir", str(tmp_path / "work")]
    # a main-job argument the VLM job lacks: refused when T3 runs, by the VLM job's parser (its closest name)
    with pytest.raises(SystemExit) as exit_:
        wb.main([*where, "--tasks", "T1", "T3", "--task_suite_seed", "1"])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_.value.code == 2 and "--task_suite_seed: neither this script nor the VLM job of the T3 cells" in err
    assert "Did you mean --task_seed?" in err and "examples/trapo_vlm.py --help" in err
    # a known option with a value the job refuses: the job's own message, before any cell
    with pytest.raises(SystemExit) as exit_:
        wb.main([*where, "--tasks", "T1", "--max_steps", "0"])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_.value.code == 2
    assert "the main job of the T1 cells (examples/trapo.py) refuses the extra arguments ['--max_steps', '0']" in err
    assert "--max_steps 0 is invalid" in err
    # arguments both jobs take pass (here to --list, which runs nothing)
    assert wb.main([*where, "--tasks", "T1", "T3", "--max_steps", "3", "--list"]) == []
    assert "T3-dare-vlm-seed0: to run" in capsys.readouterr().out
    assert not started


def test_the_command_exits_1_when_a_cell_failed(tmp_path, monkeypatch):
    """A failed cell was logged and the script still exited 0 (W12b). The `__main__` path now exits 1; `main` still
    returns the cells run."""
    import runpy

    import runlib

    def fail(script, spec, spec_path, *, name=None, **kwargs):
        run = runlib.ChildRun(name, 1, False, 0.1, 0.1, 1.0, (0, 0, 0), (0, 0, 0), str(tmp_path / "log.txt"))
        raise runlib.ChildFailed(run, "Traceback ... ValueError: the cell's job failed")

    monkeypatch.setattr(runlib, "launch_worker", fail)  # the script's fresh copy below imports it from runlib
    monkeypatch.setattr(wb, "launch_worker", fail)
    argv = ["--tasks", "T1", "--arms", "dare", "--suites", "0", "--seeds", "0", "--max_steps", "3",
            "--results_dir", str(tmp_path / "cells"), "--work_dir", str(tmp_path / "work")]  # fmt: skip
    assert wb.main(argv) == []  # for callers: the ids of the cells run (none)
    monkeypatch.setattr(sys, "argv", [wb.__file__, *argv])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(wb.__file__, run_name="__main__")
    assert exit_.value.code == 1
    assert not (tmp_path / "cells").exists()  # no file for the failed cell


def test_the_committed_page_holds_the_rendering_of_the_committed_cells():
    cells = wb.load_cells(wb.RESULTS_DIR)
    page = wb.page_of(wb.BLOCK)
    expected = wb.render_block(cells, wb.plot_links(cells, wb.PLOTS_DIR, page), wb.read_json(wb.COST_FILE))
    assert read_block(page.read_text(encoding="utf-8"), wb.BLOCK) == expected, (
        "docs/weighting_benchmark.md's results differ from its cells: run "
        "`python scripts/experiments/weighting_benchmark.py --report`"
    )
    for link in wb.plot_links(cells, wb.PLOTS_DIR, page).values():
        assert (page.parent / link).is_file()
    readme = wb.page_of(wb.CLAIM_BLOCK).read_text(encoding="utf-8")
    assert read_block(readme, wb.CLAIM_BLOCK) == wb.claim_block(cells), (
        "README.md's weighting claim differs from the committed cells: run "
        "`python scripts/experiments/weighting_benchmark.py --report`"
    )


# =====================================================================================================================
# The decision rule, on hand-made cells
# =====================================================================================================================
def synthetic(effects: dict[tuple[str, str], float], forgetting: dict[tuple[str, str], float] | None = None):
    """Every test cell of the grid: the primary metric is a per-pair base plus `effects[(arm, task)]` and, for an arm
    with an effect, a +-0.004 wobble that averages to 0 (so its interval is narrow but not a point); arms without an
    effect equal `dare` exactly (their intervals are [0, 0])."""
    forgetting = forgetting or {}
    cells = {}
    for name, task in wb.TASKS.items():
        for index, (suite, seed) in enumerate(task.pairs()):
            base = 0.5 + 0.03 * ((index * 7) % 5)
            wobble = (0.004, -0.004, 0.0)[index % 3] if len(task.pairs()) == 3 else (0.004, -0.004)[index % 2]
            for arm in wb.ARMS:
                effect = effects.get((arm, name))
                primary = base + (effect + wobble if effect is not None else 0.0)
                extra = forgetting.get((arm, name))
                cell = wb.Cell(name, arm, suite, seed)
                cells[cell.id] = {
                    "cell": cell.id, "task": name, "arm": arm, "suite": suite, "seed": seed, "primary": primary,
                    "forgetting": 0.001 + (extra + wobble if extra is not None else 0.0),
                }  # fmt: skip
    return cells


def test_rule_1_an_arm_that_beats_dare_becomes_the_default():
    decision = wb.decide(synthetic({("gac", "T1"): 0.05}))
    assert (decision["rule"], decision["default"], decision["shift_task"]) == (1, "gac", False)


def test_rule_1_of_several_arms_the_larger_mean_gain_wins():
    decision = wb.decide(synthetic({("uncertainty", "T1"): 0.03, ("gac", "T2"): 0.05}))
    assert (decision["rule"], decision["default"]) == (1, "gac")
    assert "also qualified: `uncertainty`" in decision["reasons"][-1]


def test_rule_4_t3_vetoes_an_arm_that_wins_on_t1():
    decision = wb.decide(synthetic({("gac", "T1"): 0.05, ("gac", "T3"): -0.05}))
    assert (decision["rule"], decision["default"], decision["shift_task"]) == (3, "static", True)
    assert any("`gac` beats `dare` on T1 but its interval lies below 0 on T3" in r for r in decision["reasons"])


def test_rule_1_an_arm_that_forgets_more_does_not_become_the_default():
    decision = wb.decide(synthetic({("gac", "T1"): 0.05}, forgetting={("gac", "T1"): 0.05}))
    assert decision["rule"] == 3 and decision["default"] == "static"
    assert any("forgetting interval lies above +0.01 on T1" in r for r in decision["reasons"])
    # +0.005 nats/token more forgetting is within the declared margin
    assert wb.decide(synthetic({("gac", "T1"): 0.05}, forgetting={("gac", "T1"): 0.005}))["default"] == "gac"


def test_rule_2_dare_stays_when_it_beats_static_and_matches_the_tuned_mixture():
    decision = wb.decide(synthetic({("static", "T2"): -0.05, ("tuned_static", "T1"): -0.01}))
    assert (decision["rule"], decision["default"], decision["shift_task"]) == (2, "dare", False)


def test_rule_2_fails_when_the_tuned_mixture_is_better_by_more_than_two_points():
    # tuned_static beats dare by 0.05 on T1 but forgets more (so rule 1 does not make it the default)
    cells = synthetic({("static", "T1"): -0.05, ("tuned_static", "T1"): 0.05}, {("tuned_static", "T1"): 0.05})
    decision = wb.decide(cells)
    assert (decision["rule"], decision["default"], decision["shift_task"]) == (3, "dare", True)
    assert any("below -0.02 against `tuned_static` on T1" in r for r in decision["reasons"])


def test_rule_3_static_becomes_the_default_when_nothing_is_better():
    decision = wb.decide(synthetic({}))
    assert (decision["rule"], decision["default"], decision["shift_task"]) == (3, "static", True)


def test_rule_3_dare_stays_when_static_is_worse_somewhere():
    # static is worse on T3 only: dare does not beat it on T1 or T2 (no rule 2), but static is not "not worse"
    decision = wb.decide(synthetic({("static", "T3"): -0.05}))
    assert (decision["rule"], decision["default"], decision["shift_task"]) == (3, "dare", True)


def test_the_rule_waits_for_every_cell_it_needs():
    cells = synthetic({("gac", "T1"): 0.05})
    del cells["T3-gradnorm-vlm-seed2"]
    decision = wb.decide(cells)
    assert decision == {"applied": False, "missing": ["T3-gradnorm-vlm-seed2"]}
    assert "Not applied" in wb.render_block({k: {**v, **FILLER} for k, v in cells.items()})


FILLER = {"final": {"accuracy": 0.5}, "rl_learnt_step": None, "cpu_s": 1.0, "loadavg_start": [1.0, 1.0, 1.0],
          "loadavg_end": [1.0, 1.0, 1.0], "machine": {"cpu_count": 2}}  # fmt: skip


def test_the_report_states_the_decision_once_complete():
    cells = {k: {**v, **FILLER} for k, v in synthetic({("gac", "T1"): 0.05}).items()}
    block = wb.render_block(cells)
    assert "Rule 1 applies: the default becomes `gac`." in block
    assert "| `gac` | 10 of 10 | " in block and "+0.050 [" in block


@pytest.mark.parametrize("logged", [10, 50, 51, 100, 1000])
def test_the_weight_curves_are_compacted_to_at_most_50_points_keeping_both_ends(logged):
    rows = [{"step": 10 * i, "weight/rl": 1 / 3} for i in range(logged)]
    kept = wb.compact_weights(rows)
    assert len(kept) == min(logged, 50) or 25 <= len(kept) <= 50
    assert kept[0]["step"] == 0 and kept[-1]["step"] == 10 * (logged - 1)
    assert kept[0]["weight/rl"] == 0.33333 and wb.compact_weights(kept) == kept


class FakeRuns:
    """`run_cell` without a run: writes a cell whose primary metric favours the search mixture rl2-sft0.5 and advances
    a fake clock by `wall_s` (so `--time_budget_s` can be tested without waiting)."""

    def __init__(self, wall_s: float = 100.0):
        self.now, self.wall_s, self.ran = 0.0, wall_s, []

    def clock(self) -> float:
        return self.now

    def __call__(self, bench, cell):
        self.now += self.wall_s
        self.ran.append(cell)
        best = cell.mixture == (("rl_weight", 2.0), ("sft_weight", 0.5))
        out = {"cell": cell.id, "task": cell.task, "arm": cell.arm, "suite": cell.suite, "seed": cell.seed,
               "mixture": dict(cell.mixture), "settings": bench.settings(cell), "primary": 0.9 if best else 0.5,
               "cpu_s": 1.0, "wall_s": self.wall_s}  # fmt: skip
        wb.write_json_atomic(bench.cell_path(cell), out)
        return out


def test_run_cells_resumes_runs_slices_and_waits_for_the_search(tmp_path, monkeypatch):
    fake = FakeRuns()
    monkeypatch.setattr(wb, "run_cell", fake)
    monkeypatch.setattr(wb.time, "perf_counter", fake.clock)
    bench = wb.Bench(tmp_path / "cells", tmp_path / "work", [])
    order = [c.id for c in wb.plan({}, ("T1",))]
    assert wb.run_cells(bench, ("T1",), wb.ARMS, 3, None) == order[:3]
    assert wb.run_cells(bench, ("T1",), wb.ARMS, 2, None) == order[3:5]  # the done cells are skipped
    # a time budget starts no cell that would end after it (judged by the mean of this call's cells): 2 of 100 s
    assert len(wb.run_cells(bench, ("T1",), wb.ARMS, None, 250.0)) == 2
    # a cell with other settings runs again
    cell = wb.load_cells(bench.results_dir)[order[0]]
    wb.write_json_atomic(bench.results_dir / f"{order[0]}.json", {**cell, "settings": {"other": 1}})
    assert wb.run_cells(bench, ("T1",), ("dare",), None, None, seeds=(0,), suites=(0,)) == [order[0]]
    # tuned_static waits for the whole search, then runs with its winner
    ran = wb.run_cells(bench, ("T1",), ("dare", "tuned_static"), None, None)
    tuned = [c for c in fake.ran if c.arm == "tuned_static"]
    assert len(tuned) == 10 and all(dict(c.mixture) == {"rl_weight": 2.0, "sft_weight": 0.5} for c in tuned)
    assert [c.arm for c in fake.ran[-len(ran) :]].count("search") == 18 - 2  # 2 search cells ran in the slices above
    cells = wb.load_cells(bench.results_dir)
    assert all(
        wb.is_done(bench, c, cells) for c in wb.plan(cells, ("T1",)) if c.arm in ("dare", "search", "tuned_static")
    )


def test_run_cells_trains_each_teacher_once_before_cells_run_side_by_side(tmp_path, monkeypatch):
    """With --jobs 2 each cell used to train a missing teacher itself: two at once into one folder, one refused."""
    import threading

    trained, seen, lock = [], [], threading.Lock()

    def train(kind):
        def ensure(bench):
            with lock:
                trained.append(kind)
            time.sleep(0.05)
            return str(tmp_path / kind)

        return ensure

    def run_cell(bench, cell):  # what the real run_cell needs of the bench before its child starts
        bench.teacher = bench.teacher or wb.ensure_teacher(bench)
        if cell.task == "S":
            bench.wrong_teacher = bench.wrong_teacher or wb.ensure_wrong_teacher(bench)
        seen.append((bench.teacher, bench.wrong_teacher))
        out = {"cell": cell.id, "task": cell.task, "arm": cell.arm, "suite": cell.suite, "seed": cell.seed,
               "primary": 0.5, "wall_s": 1.0, "settings": bench.settings(cell)}  # fmt: skip
        wb.write_json_atomic(bench.cell_path(cell), out)
        return out

    monkeypatch.setattr(wb, "ensure_teacher", train("teacher"))
    monkeypatch.setattr(wb, "ensure_wrong_teacher", train("wrong"))
    monkeypatch.setattr(wb, "run_cell", run_cell)
    bench = wb.Bench(tmp_path / "cells", tmp_path / "work", [])
    ran = wb.run_cells(bench, ("S",), ("dare", "static", "gac"), None, None, jobs=2)
    assert len(ran) == 15
    assert sorted(trained) == ["teacher", "wrong"]
    assert set(seen) == {(str(tmp_path / "teacher"), str(tmp_path / "wrong"))}


# =====================================================================================================================
# The shift task (a teacher that becomes wrong halfway)
# =====================================================================================================================
def test_the_shift_cells_run_only_when_asked_and_leave_the_main_grid_as_it_was(tmp_path, capsys):
    shift = wb.plan({}, ("S",))
    assert [c.id for c in shift[:6]] == [f"S-{arm}-suite0-seed0" for arm in wb.RUN_ORDER]
    assert len(shift) == 30 and {c.seed for c in shift} == {0, 1, 2, 3, 4} and {c.suite for c in shift} == {0}
    # a main-grid cell's settings hold no shift key (a changed setting would run the done cells again)
    bench = wb.Bench(tmp_path / "cells", tmp_path / "work", [])
    t2, s = wb.Cell("T2", "dare", 0, 0), wb.Cell("S", "dare", 0, 0)
    assert set(bench.settings(t2)) == {"task", "arm", "weighting", "mixture", "suite", "seed", "job_argv",
                                       "eval_every", "heldout_docs", "threads", "eval_per_split_family"}  # fmt: skip
    assert bench.settings(s) == {**bench.settings(t2), "task": "S", "swap_fraction": 0.5,
                                 "wrong_teacher": wb.WRONG_TEACHER}  # fmt: skip
    # the default invocation lists the main grid only; --shift (or --tasks S) the shift cells only
    wb.main(["--list", "--results_dir", str(tmp_path / "cells")])
    listed = capsys.readouterr().out
    assert "T1-dare-suite0-seed0: to run" in listed and "S-" not in listed
    wb.main(["--list", "--shift", "--results_dir", str(tmp_path / "cells")])
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 30 and all(line.startswith("S-") for line in listed)
    assert "S-tuned_static-suite0-seed0: waits for its search" in listed  # T2's search winner


def test_the_wrong_teachers_answers_shift_only_the_rl_only_family_each_to_its_successor():
    import weighting_shift as ws

    from trl_trapo.tasks import make_task_suite, successor

    rl = make_task_suite(seed=0, num_pretrain_docs=1, num_sft_per_task=1, num_rl_per_task=20).rl_train
    shifted = ws.shift_answers(rl)
    assert ws.RL_ONLY_FAMILIES == ("lst",)
    assert shifted["prompt"] == rl["prompt"] and shifted["task"] == rl["task"]
    lst = [(a, b) for a, b, task in zip(rl["answer"], shifted["answer"], rl["task"]) if task == "lst"]
    others = [(a, b) for a, b, task in zip(rl["answer"], shifted["answer"], rl["task"]) if task != "lst"]
    assert len(lst) == len(others) == 60  # rl_only_fraction 0.5
    assert all(b == successor(a) and len(b) == 1 and b != a for a, b in lst)
    assert all(a == b for a, b in others)
    demos = ws.shifted_demonstrations(shifted)
    assert set(demos.column_names) == {"prompt", "completion"} and all(p.startswith("lst ") for p in demos["prompt"])
    with pytest.raises(ValueError, match="no `task` column"):
        ws.shift_answers(rl.remove_columns("task"))
    with pytest.raises(ValueError, match="'j' has no successor"):
        successor("aj")


def test_the_swap_callback_loads_the_wrong_teachers_weights_once_at_its_step():
    import torch
    import weighting_shift as ws
    from transformers import TrainerControl, TrainerState

    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    running = build_tiny_model(tokenizer, seed=0).eval().requires_grad_(False)
    wrong = build_tiny_model(tokenizer, seed=1)
    records = []
    callback = ws.TeacherSwapCallback(lambda: running, wrong.state_dict(), swap_step=3, record=records.append)
    state, control = TrainerState(), TrainerControl()

    def same() -> bool:
        theirs = wrong.state_dict()
        return all(torch.equal(value, theirs[name]) for name, value in running.state_dict().items())

    callback.on_train_begin(None, state, control)
    for step in (1, 2):
        state.global_step = step
        callback.on_step_end(None, state, control)
        assert not same() and callback.swapped_at is None
    state.global_step = 3
    callback.on_step_end(None, state, control)
    assert same() and callback.swapped_at == 3
    assert not any(p.requires_grad for p in running.parameters())  # still the frozen teacher
    with torch.no_grad():
        next(running.parameters()).add_(1.0)  # a later step must not swap again
    for step in (4, 5):
        state.global_step = step
        callback.on_step_end(None, state, control)
    assert not same() and callback.swapped_at == 3
    assert len(records) == 1 and records[0]["step"] == records[0]["swap_step"] == 3
    assert records[0]["max_abs_difference"] == 0.0 and records[0]["changed_parameters"] > 0
    # weights of another shape are refused before the first step, and so is a run without a teacher
    other = {**wrong.state_dict(), "lm_head.weight": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match="do not fit the running teacher"):
        ws.TeacherSwapCallback(lambda: running, other, 3).on_train_begin(None, TrainerState(), control)
    with pytest.raises(ValueError, match="no teacher to swap"):
        ws.TeacherSwapCallback(lambda: None, wrong.state_dict(), 3).on_train_begin(None, TrainerState(), control)


def shift_cells(final: dict[str, float], forgetting: dict[str, float] | None = None, seeds=(0, 1, 2, 3, 4)):
    """Shift cells of every arm: the final rl_only accuracy is a per-seed base plus `final[arm]` (with a wobble that
    averages to 0 over the 5 seeds, for an arm with an effect); `forgetting[arm]` adds to the forgetting likewise."""
    forgetting = forgetting or {}
    cells = {}
    for seed in seeds:
        base, wobble = 0.3 + 0.05 * seed, (0.01, -0.01, 0.02, -0.02, 0.0)[seed]
        for arm in wb.ARMS:
            cell = wb.Cell("S", arm, 0, seed)
            value = base + (final[arm] + wobble if arm in final else 0.0)
            cells[cell.id] = {
                "cell": cell.id, "task": "S", "arm": arm, "suite": 0, "seed": seed, "final_rl_only": value,
                "primary": 0.6, "forgetting": 0.001 + (forgetting[arm] + wobble if arm in forgetting else 0.0),
                "cpu_s": 200.0, "teacher_swap": {"step": 500, "swap_step": 500},
                "curve": [{"step": 500, "accuracy_rl_only": 0.9}, {"step": 1000, "accuracy_rl_only": value}],
                "wrong_teacher": {"args": {"shifted_sft": False}, "cpu_s": 240.0,
                                  "wrong_teacher": {"against_shifted": 0.97, "against_true": 0.0, "prompts": 100},
                                  "true_teacher": {"against_shifted": 0.0, "against_true": 1.0, "prompts": 100}},
            }  # fmt: skip
    return cells


def test_the_shift_decision_is_rule_1_against_static():
    decision = wb.decide_shift(shift_cells({"gac": 0.2, "dare": 0.1}))
    assert decision["applied"] and decision["best"] == "gac" and set(decision["winners"]) == {"gac", "dare"}
    assert decision["winners"]["gac"] == pytest.approx(0.2)
    # more forgetting than static by more than 0.01 nats/token disqualifies
    decision = wb.decide_shift(shift_cells({"gac": 0.2}, forgetting={"gac": 0.05}))
    assert decision["best"] is None and decision["winners"] == {}
    assert any("`gac` beats `static`" in r and "forgetting" in r for r in decision["reasons"])
    assert wb.decide_shift(shift_cells({}))["best"] is None  # no effect: nothing beats static
    # a static mixture that wins: said with its interval, and that no adaptive weighting beat static, with theirs
    decision = wb.decide_shift(shift_cells({"tuned_static": 0.2}))
    assert decision["best"] == "tuned_static" and decision["reasons"][0].startswith("`tuned_static` beats `static` (")
    assert decision["reasons"][1].startswith("No adaptive weighting beats `static` on the final `rl_only` accuracy")
    assert all(name in decision["reasons"][1] for name in ("DARE", "uncertainty", "GradNorm", "GAC-style"))
    assert not any("No adaptive" in r for r in wb.decide_shift(shift_cells({"gac": 0.2}))["reasons"])
    # a partial task is not decided
    partial = shift_cells({"gac": 0.2}, seeds=(0, 1, 2))
    assert wb.decide_shift(partial) == {"applied": False, "missing": wb.missing_shift(partial)}
    assert len(wb.missing_shift(partial)) == 12


def test_rule_1_won_by_tuned_static_asks_for_the_shift_task():
    decision = wb.decide(synthetic({("tuned_static", "T1"): 0.05}))
    assert (decision["rule"], decision["default"], decision["shift_task"]) == (1, "tuned_static", True)
    assert "no adaptive weighting beat static weights" in decision["reasons"][-1]
    block = wb.render_block({k: {**v, **FILLER} for k, v in synthetic({("tuned_static", "T1"): 0.05}).items()})
    assert "Rule 1 applies: the default becomes `tuned_static`; the shift task is to be run." in " ".join(
        block.split()
    )


def test_the_report_has_a_shift_section_for_no_partial_and_complete_shift_cells():
    main = {k: {**v, **FILLER} for k, v in synthetic({}).items()}
    flat = " ".join(wb.render_block(main).split())
    assert "### Shift task: T2 on suite 0 with a teacher that becomes wrong halfway" in flat
    assert "Not run yet (30 cells: `python scripts/experiments/weighting_benchmark.py --shift`" in flat
    partial = shift_cells({"gac": 0.2}, seeds=(0, 1))
    flat = " ".join(wb.render_block({**main, **partial}).split())
    assert f"**partial: {len(main)} of 162 cells**" in flat  # the shift cells are not counted in the main grid
    assert "**partial: 12 of 30 cells**" in flat and "Decision: not applied, 18 of 30 cells missing." in flat
    assert "0.970 against the shifted answers, 0.000 against the true ones (T2's teacher: 1.000" in flat
    assert "The swap, as the cells' files record it (`teacher_swap`): at step 500 in 12 of 12 cells." in flat
    assert "| `gac` | 2 of 5 | 0.525 ± 0.021 | +0.200 [" in flat
    complete = wb.render_block({**main, **shift_cells({"gac": 0.2})})
    assert "**complete: 30 cells**" in complete and "Decision: `gac` beats `static` on the shift task." in complete
    assert "Rule 3 applies" in complete  # the main grid's decision is the main cells' alone


def test_the_report_renders_the_weightings_own_cost_or_says_it_is_not_measured():
    """The declaration's secondary metric (the weighting's own cost per step, measured alone) is on the page once
    `benchmark_weighting.py --json` wrote it beside the cells, with its command and the machine's load."""
    main = {k: {**v, **FILLER} for k, v in synthetic({}).items()}
    flat = " ".join(wb.render_block(main).split())
    assert "Not measured yet: `OMP_NUM_THREADS=1 python scripts/benchmarks/benchmark_weighting.py" in flat
    arm = {"cpu_ms": 160.0, "delta_cpu_ms": 5.25, "delta_cpu_ms_range": [-30.0, 15.0], "wall_ms": 161.0,
           "delta_wall_ms": 5.0, "delta_wall_ms_range": [-31.0, 15.0], "delta_update_cpu_ms": 4.0,
           "delta_update_cpu_ms_range": [-13.0, 20.0], "own_update_ms": 3.56, "updates_per_100": 20.0,
           "own_amortised_ms": 0.9, "own_job_interval_ms": 0.13}  # fmt: skip
    cost = {
        "settings": {
            "steps": 30,
            "repeats": 5,
            "update_interval": 5,
            "job_update_interval": 32,
            "load_average_before": "0.10 0.20 0.30",
            "load_average_after": "1.00 1.10 1.20",
        },  # fmt: skip
        "summary": {"dare": arm, "static": {**arm, "own_update_ms": 0.02}},
    }
    flat = " ".join(wb.render_block(main, cost=cost).split())
    assert "--steps 30 --repeats 5 --json docs/results/weighting/cost.json" in flat
    assert "load average 0.10 0.20 0.30 before (it lags a pause) and 1.00 1.10 1.20 after" in flat
    assert "| `dare` | 160.0 | +5.2 [-30.0, +15.0] |" in flat and "| 3.56 | 20.0 | 0.90 | 0.13 |" in flat


def test_the_readme_claim_says_nothing_before_the_rule_and_exactly_the_table_after():
    """README.md's weighting claim is rendered from the cells: before the decision rule can be applied it claims
    nothing; after, each interval it shows is the page's and the decision is the rule's."""
    partial = {k: {**v, **FILLER} for k, v in synthetic({("tuned_static", "T2"): 0.04}).items()}
    dropped = next(k for k, c in partial.items() if c["task"] == "T3")
    pending = " ".join(wb.claim_block({k: c for k, c in partial.items() if k != dropped}).split())
    assert "claims no weighting beats another" in pending and "|" not in pending
    claim = wb.claim_block(partial)
    flat = " ".join(claim.split())
    row = next(line for line in claim.splitlines() if line.startswith("| searched static mixture − DARE |"))
    assert row.split(" | ")[2] == wb._interval(wb.paired(partial, "T2", "tuned_static", "dare"))
    assert "+0.040 [" in row.split(" | ")[2]
    assert "Decision: Rule 1: `tuned_static` beats `dare`" in flat
    assert "The declared shift task (a teacher that becomes wrong halfway): 30 of its cells to run." in flat
    static_wins = " ".join(wb.claim_block({k: {**v, **FILLER} for k, v in synthetic({}).items()}).split())
    assert "Rule 3: no weighting beat static weights; `static` is not worse." in static_wins


def test_trapoconfigs_defaults_are_what_the_committed_decision_chose():
    """The README says which weighting is the default because the benchmark chose it: the code's defaults must be
    that choice (a default changed by hand, or a decision the code does not follow, fails here)."""
    from trl_trapo import TRAPOConfig
    from trl_trapo.config import weighting_name

    cells = wb.load_cells(wb.RESULTS_DIR)
    decision = wb.decide({k: c for k, c in cells.items() if c["task"] in wb.TASKS})
    if not decision["applied"]:
        pytest.skip("the committed cells do not decide yet")
    fields = TRAPOConfig.__dataclass_fields__
    defaults = SimpleNamespace(weighting=fields["weighting"].default, dare_mode=fields["dare_mode"].default)
    assert weighting_name(defaults) == wb.WEIGHTING.get(decision["default"], decision["default"])
    if decision["default"] == "tuned_static":
        mixture = {"pretrain_weight": 1.0, **wb.winners(cells)["T2"]["mixture"]}
        assert {key: fields[key].default for key in mixture} == mixture
