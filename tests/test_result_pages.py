# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The results pages' measured tables are what the committed results files render to, never numbers typed in by hand.

Each block lives in the page `scripts/experiments/result_blocks.py` (`PAGES`) names, under `docs/results/`:

- `main_job.md`: `scripts/experiments/main_job_seeds.py` renders the block between the
  `<!-- main-job-table:... -->` markers from `docs/results/main_job/results.json`;
- `pipeline.md` and `distillation.md`: `scripts/experiments/pipeline_report.py` renders the comparison, seed-grid,
  ablation and teacher tables from `docs/results/checkpoints.csv`, `docs/results/ablations/checkpoints.csv`, ...;
- `real_model.md`: `scripts/experiments/compare_real.py --write_docs` renders the block between the
  `<!-- real-smollm2-table:... -->` markers from `docs/results/real_smollm2/results.json`, and
  `scripts/benchmarks/real_model_report.py` the speed block from `docs/results/benchmarks/*.json`;
- guidance on the real model: `scripts/experiments/guidance_real.py --write_docs` renders the `guidance-real` block
  from `docs/results/real_smollm2/guidance.json`;
- asynchronous rollouts: `scripts/experiments/compare_async.py --write_docs` renders the `async-table` block from
  `docs/results/async/results.json`.

A number edited in a page (or in a results file without regenerating the page) fails here; the fix is to run
the script's `--write_docs`, or the experiment itself.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))

import compare_real  # noqa: E402
import main_job_seeds  # noqa: E402
import pipeline_report  # noqa: E402
from result_blocks import PAGES, page_of, read_block, replace_block  # noqa: E402


def page_text(name: str) -> str:
    """The text of the results page that holds the block `name`."""
    return page_of(name).read_text(encoding="utf-8")


def test_every_block_is_in_its_page_once_and_nowhere_else():
    """Each generated block is in the page `PAGES` names (exactly one marker pair) and in no other document, so the
    scripts' `--write_docs` and these tests read the one copy."""
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for name, page in PAGES.items():
        read_block(page.read_text(encoding="utf-8"), name)
        for document in documents:
            if document != page:
                assert f"<!-- {name}:start -->" not in document.read_text(encoding="utf-8"), (name, document)


def committed_main_job_results() -> dict:
    return json.loads(main_job_seeds.RESULTS.read_text(encoding="utf-8"))


def test_main_job_table_is_rendered_from_the_committed_results():
    expected = main_job_seeds.render_block(committed_main_job_results())
    assert read_block(page_text(main_job_seeds.BLOCK), main_job_seeds.BLOCK) == expected, (
        "docs/results/main_job.md's main-job table differs from docs/results/main_job/results.json: run "
        "`python scripts/experiments/main_job_seeds.py --write_docs` (or the experiment itself), never edit it"
    )


def test_main_job_results_have_every_run_and_the_machine():
    data = committed_main_job_results()
    assert set(data["runs"]) == set(main_job_seeds.RUNS)
    for name, run in data["runs"].items():
        assert run["command"].startswith("accelerate launch examples/trapo.py "), name
        assert run["max_steps"] == 1000, name  # the job as the README runs it, not a shortened one
        for split in main_job_seeds.SPLITS:
            assert 0.0 <= run["final"][split] <= 1.0 and 0.0 <= run["initial"][f"{split}_initial"] <= 1.0
        assert run["train_runtime_s"] > 0 and run["peak_rss_mb"] > 0
    for key in ("cpu_model", "torch", "transformers", "trl", "git_commit", "date"):
        assert data["machine"][key], key


def test_a_changed_number_changes_the_rendering():
    """The check above can fail: any result the table shows moves the rendering."""
    data = committed_main_job_results()
    before = main_job_seeds.render_block(data)
    for name in data["runs"]:
        changed = copy.deepcopy(data)
        changed["runs"][name]["final"]["eval_accuracy_rl_only"] += 0.01
        assert main_job_seeds.render_block(changed) != before, name


@pytest.mark.parametrize("name", list(pipeline_report.BLOCK_TABLES))
def test_results_tables_are_rendered_from_the_committed_csv(name):
    expected = pipeline_report.block_tables()[name]
    assert read_block(page_text(name), name) == expected, (
        f"{page_of(name).relative_to(ROOT)}'s {name} differs from {pipeline_report.BLOCK_TABLES[name][0]}: run "
        "`python scripts/experiments/pipeline_report.py --write_docs`, never edit it"
    )


def committed_real_results() -> dict:
    return json.loads((compare_real.RESULTS_DIR / "results.json").read_text(encoding="utf-8"))


def test_real_model_block_is_rendered_from_the_committed_results():
    expected = compare_real.render_block(committed_real_results())
    assert read_block(page_text(compare_real.BLOCK), compare_real.BLOCK) == expected, (
        "docs/results/real_model.md's real-model block differs from docs/results/real_smollm2/results.json: run "
        "`python scripts/experiments/compare_real.py --write_docs` (or the comparison itself), never edit it"
    )


def test_real_model_results_agree_with_their_cached_arms():
    """results.json is the summary of the committed cache: each arm's accuracy and points are its cached arm's."""
    results = committed_real_results()
    assert results["meta"]["command"].startswith("python scripts/experiments/compare_real.py")
    for name, arm in results["arms"].items():
        cached = json.loads((compare_real.RESULTS_DIR / "arms" / f"{name}.json").read_text(encoding="utf-8"))
        assert cached["steps"] == arm["steps"] and arm["accuracy"] == sum(cached["final"]["correct"]) / len(
            cached["final"]["correct"]
        ), name
        assert len(cached["final"]["correct"]) == results["initial"]["n"] == 200, name
        changed = copy.deepcopy(results)
        changed["arms"][name]["accuracy"] += 0.01
        assert compare_real.render_block(changed) != compare_real.render_block(results), name


def test_csv_rebuild_gives_the_same_summary_as_the_runs(tmp_path):
    """`results_from_csv` reads back what `write_csv` wrote: the same table as from the runs themselves."""

    def run(method, seed, points):
        checkpoints = [
            {"stage": method, "reason": "grid", "step": 10 * i, "budget_fraction": i / 2, "wall_s": w, "cpu_s": w,
             "eval_s": 0.0, "generation_s": w / 10, "generation_share": 0.1, "tokens": 100 * i, "peak_rss_mb": 50.0 + i,
             "accuracy": a, "accuracy_sft_tasks": a, "accuracy_rl_only": a / 2, "pretrain_loss": p}
            for i, (w, a, p) in enumerate(points)
        ]  # fmt: skip
        last = checkpoints[-1]
        totals = {k: last[k] for k in ("wall_s", "cpu_s", "generation_s", "tokens", "peak_rss_mb")}
        return {"method": method, "seed": seed, "checkpoints": checkpoints, "steps": last["step"], **totals}

    results = [
        run("serial", 0, [(0, 0.0, 3.0), (5, 0.4, 2.0), (9, 0.5, 2.5)]),
        run("trapo", 0, [(0, 0.0, 3.0), (4, 0.6, 2.0), (8, 0.7, 2.1)]),
        run("trapo_static", 0, [(0, 0.0, 3.0), (4, 0.3, 2.0), (8, 0.4, 1.9)]),
    ]
    pipeline_report.write_csv(tmp_path / "checkpoints.csv", results)
    rebuilt = pipeline_report.results_from_csv(tmp_path / "checkpoints.csv")
    assert pipeline_report.markdown_table(pipeline_report.summarize(rebuilt)) == pipeline_report.markdown_table(
        pipeline_report.summarize(results)
    )
    table = pipeline_report.ablation_table(pipeline_report.summarize(rebuilt))
    assert "| static weights (`dare_mode=static`) | 0.400 | 0.20 | 0.000 |" in table
    assert "(seed 0)" in table


def test_result_blocks_need_exactly_one_marker_pair():
    text = "a\n<!-- t:start -->\nold\n<!-- t:end -->\nb\n"
    assert read_block(text, "t") == "old\n"
    assert replace_block(text, "t", "new") == "a\n<!-- t:start -->\nnew\n<!-- t:end -->\nb\n"
    with pytest.raises(ValueError, match="found 0"):
        read_block("no markers", "t")
    with pytest.raises(ValueError, match="found 2"):
        read_block(text + text, "t")


@pytest.mark.slow
def test_main_job_seeds_runs_shortened_and_writes_the_docs_block(tmp_path):
    """The results page's `main_job_seeds.py` commands, shortened: one run of 2 steps, results and page elsewhere."""
    results = tmp_path / "results.json"
    data = main_job_seeds.main(
        ["--runs", "seed1", "--jobs", "1", "--work_dir", str(tmp_path / "runs"), "--results", str(results),
         "--max_steps", "2", "--eval_strategy", "no"]
    )  # fmt: skip
    saved = json.loads(results.read_text(encoding="utf-8"))
    assert saved == json.loads(json.dumps(data))
    run = saved["runs"]["seed1"]
    assert (
        run["command"]
        == "accelerate launch examples/trapo.py --seed 1 --task_suite_seed 1 --max_steps 2 --eval_strategy no"
    )
    assert run["max_steps"] == 2 and set(run["final"]) == set(main_job_seeds.SPLITS)
    assert run["peak_rss_mb"] > 100  # a process that imported torch; RSS read in MB, not KiB
    assert saved["machine"]["git_commit"] is None or len(saved["machine"]["git_commit"]) == 40
    # the page's second command, on a copy of the page
    page = tmp_path / "main_job.md"
    page.write_text(page_text(main_job_seeds.BLOCK), encoding="utf-8")
    main_job_seeds.main(["--write_docs", "--results", str(results), "--page", str(page)])
    block = read_block(page.read_text(encoding="utf-8"), main_job_seeds.BLOCK)
    assert block == main_job_seeds.render_block(saved)
    # the prose is wrapped at a width, and where a line breaks depends on the machine's name (a CPU name of another
    # length moved "2" to the end of the previous line): compare with the whitespace collapsed
    flat = " ".join(block.split())
    assert "| seed 1 (`--seed 1 --task_suite_seed 1`) |" in flat and "2 joint steps" in flat


def test_a_shortened_run_never_overwrites_the_committed_results():
    with pytest.raises(SystemExit, match="--results"):
        main_job_seeds.main(["--max_steps", "2"])


def test_main_job_seeds_names_a_misspelt_option_before_any_run(tmp_path, monkeypatch, capsys):
    """Unknown arguments go to every run of the main job: `--wirte_docs` was answered "pass --results PATH", and with
    it every run died of the argument. Now the main job's parser finds it unknown, named with the closest option."""
    monkeypatch.setattr(main_job_seeds, "launch", lambda *a: pytest.fail("a run was started"))
    where = ["--results", str(tmp_path / "r.json"), "--work_dir", str(tmp_path / "runs")]
    for argv, expected in (
        (["--wirte_docs"], "--wirte_docs: neither this script nor the main job (examples/trapo.py) takes it. Did you "
         "mean --write_docs (this script)?"),
        ([*where, "--max_step", "2"], "--max_step: neither this script nor the main job (examples/trapo.py) takes it. "
         "Did you mean --max_steps?"),
        ([*where, "--runs", "rl_off", "--rl_weight", "-1"], "the main job (examples/trapo.py) refuses the extra "
         "arguments ['--rl_weight', '-1']"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            main_job_seeds.main(argv)
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2 and expected in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "r.json").exists()


def test_real_model_speed_block_is_rendered_from_the_committed_benchmarks():
    sys.path.insert(0, str(ROOT / "scripts" / "benchmarks"))
    import real_model_report

    expected = real_model_report.main([])
    assert read_block(page_text(real_model_report.BLOCK), real_model_report.BLOCK) == expected, (
        "docs/results/real_model.md's speed block differs from what docs/results/benchmarks/*.json render to: run "
        "`python scripts/benchmarks/real_model_report.py --write_docs` (or the benchmarks), never edit it"
    )


def test_guidance_real_block_is_rendered_from_the_committed_results():
    import guidance_real

    results = json.loads((ROOT / "docs" / "results" / "real_smollm2" / "guidance.json").read_text(encoding="utf-8"))
    assert set(results["arms"]) == set(guidance_real.ARMS) and results["max_steps"] >= 10
    assert read_block(page_text(guidance_real.BLOCK), guidance_real.BLOCK) == guidance_real.render_block(results), (
        "docs/results/real_model.md's guidance-real block differs from docs/results/real_smollm2/guidance.json: run "
        "`python scripts/experiments/guidance_real.py --write_docs` (or the experiment), never edit it"
    )


def test_distill_real_block_is_rendered_from_the_committed_results():
    """The real-teacher distillation block (issue 22) is `distill_real.py --write_docs` of the committed results,
    and those are the summary of the committed arms (their final reverse KL is the cached final point's)."""
    import distill_real

    results = json.loads((distill_real.RESULTS_DIR / "results.json").read_text(encoding="utf-8"))
    assert results["pending"] == [] and set(results["arms"]) == set(distill_real.ARMS)
    for name, arm in results["arms"].items():
        cached = json.loads((distill_real.RESULTS_DIR / "arms" / f"{name}.json").read_text(encoding="utf-8"))
        assert arm["points"][-1]["reverse_kl"] == cached["points"][-1]["reverse_kl"], name
        assert arm["steps"] == cached["steps"] == distill_real.JOB["max_steps"], name
    assert read_block(page_text(distill_real.BLOCK), distill_real.BLOCK) == distill_real.render_block(results), (
        "docs/results/distillation.md's distill-real block differs from docs/results/distill_real/results.json: run "
        "`python scripts/experiments/distill_real.py --write_docs` (or the comparison), never edit it"
    )


def test_async_block_is_rendered_from_the_committed_results():
    """The asynchronous-rollout block (issue 24) is `compare_async.py --write_docs` of the committed results, which
    hold every arm and seed of both reward settings."""
    import compare_async

    results = json.loads(compare_async.RESULTS.read_text(encoding="utf-8"))
    expected_runs = {
        compare_async.run_name(reward, arm, seed)
        for reward in compare_async.REWARDS
        for arm in compare_async.DEFAULT_ARMS
        for seed in compare_async.SEEDS
    }
    assert expected_runs <= set(results["runs"])
    assert read_block(page_text(compare_async.BLOCK), compare_async.BLOCK) == compare_async.render_block(results), (
        "`python scripts/experiments/compare_async.py --write_docs` (or the experiment), never edit it"
    )
