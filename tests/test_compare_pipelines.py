# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/experiments/compare_pipelines.py` and `scripts/experiments/pipeline_report.py`: the report's arithmetic
and a real smoke run."""

import csv
import json
import math
import os
import sys

import pytest


SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "experiments")
sys.path.insert(0, SCRIPTS)

import compare_pipelines  # noqa: E402
import pipeline_report  # noqa: E402
from runlib import write_json_atomic  # noqa: E402


def rows(*points):
    """Checkpoints from (wall_s, accuracy, pretrain_loss) triples."""
    return [{"wall_s": w, "accuracy": a, "pretrain_loss": p} for w, a, p in points]


def test_forgetting_is_rise_above_best_so_far():
    out = pipeline_report.add_forgetting(rows((0, 0, 3.0), (1, 0, 2.0), (2, 0, 2.5), (3, 0, 1.5)))
    assert [r["best_pretrain_loss"] for r in out] == [3.0, 2.0, 2.0, 1.5]
    assert [r["forgetting"] for r in out] == pytest.approx([0.0, 0.0, 0.5, 0.0])


def test_time_to_target_and_censoring():
    run = rows((0, 0.1, 1), (10, 0.4, 1), (20, 0.6, 1))
    assert pipeline_report.time_to_target(run, 0.4) == 10
    assert pipeline_report.time_to_target(run, 0.7) is None
    # a censored run counts with its total time as a lower bound, never dropped
    assert pipeline_report.format_censored([10.0, None], [30.0, 50.0]) == "> 30 (1/2 censored)"
    assert pipeline_report.format_censored([10.0, 20.0], [30.0, 50.0]) == "15 ± 7"


def test_summary_and_verdict_use_the_serial_run_of_the_same_seed():
    results = []
    for seed, serial_final in ((0, 0.5), (1, 0.8)):
        base = {"wall_s": 100.0, "cpu_s": 100.0, "generation_s": 10.0, "peak_rss_mb": 1.0, "tokens": 1, "steps": 10}
        results.append(
            {**base, "method": "serial", "seed": seed, "checkpoints": rows((0, 0, 2.0), (100, serial_final, 2.4))}
        )
        results.append({**base, "method": "trapo", "seed": seed, "checkpoints": rows((0, 0, 2.0), (50, 0.6, 2.1))})
    summary = pipeline_report.summarize(results)
    # seed 0: TRAPO reaches serial's 0.5 at 50 s; seed 1: never reaches 0.8 -> censored
    assert summary["trapo"]["time_to_target"] == [50, None]
    verdict = pipeline_report.verdict(summary)
    assert verdict["censored"] == 1 and verdict["time_ratio"] is None and not verdict["time_met"]
    assert verdict["forgetting_ratio"] == pytest.approx(0.1 / 0.4)
    assert verdict["forgetting_met"]
    assert "censored" in pipeline_report.markdown_table(summary)


def test_time_target_is_not_applicable_when_serial_ends_where_it_started():
    """`--quick` once printed "reached the serial pipeline's final accuracy in 0 % of the serial wall time (target
    <= 70 %: met)" when that accuracy was 0.000, which the initial model already has."""
    base = {"wall_s": 100.0, "cpu_s": 100.0, "generation_s": 10.0, "peak_rss_mb": 1.0, "tokens": 1, "steps": 10}
    results = [
        {**base, "method": "serial", "seed": 0, "checkpoints": rows((0, 0.0, 2.0), (100, 0.0, 2.4))},
        {**base, "method": "trapo", "seed": 0, "checkpoints": rows((0, 0.0, 2.0), (50, 0.3, 2.1))},
    ]
    verdict = pipeline_report.verdict(pipeline_report.summarize(results))
    assert not verdict["time_applicable"] and not verdict["time_met"]
    text = pipeline_report.verdict_text(verdict)
    assert "**n/a**" in text and "met**" not in text.split(";")[0]


def test_serial_budget_split_follows_trapo_curriculum():
    _, config, _, _ = compare_pipelines.parse_job([], quick=True)
    shares = compare_pipelines.time_averaged_mixture(config, (True, True, True))
    assert sum(shares) == pytest.approx(1.0)
    # the default schedule is pretraining-heavy first, RL-heavy last: all three stages get a real share
    assert all(0.15 < s < 0.5 for s in shares)
    counts = compare_pipelines.split_budget(120, shares)
    assert sum(counts) == 120 and all(c >= 1 for c in counts)
    assert compare_pipelines.split_budget(10, (0.0, 0.05, 0.95)) == [0, 1, 9]


def test_bad_arguments_fail_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        compare_pipelines.main(["--output_dir", str(tmp_path), "--eval_every", "2"])
    assert exit_.value.code == 2
    assert "argument --eval_every: 2 is invalid: use a number in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_misspelt_option_is_named_with_the_scripts_closest_before_any_run(tmp_path, capsys):
    """Unknown arguments go to the main job: a misspelt option of this script was the job's ValueError (a traceback,
    its closest names the job's only). Now it is a usage error naming the closest of both."""
    for typo, close in (("--ablation", "--ablations (this script)"), ("--max_step", "--max_steps")):
        with pytest.raises(SystemExit) as exit_:
            compare_pipelines.main(["--output_dir", str(tmp_path), "--quick", typo, "3"])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2
        assert (
            f"{typo}: neither this script nor the main job (examples/trapo.py) takes it. Did you mean {close}?" in err
        )
    assert not (tmp_path / "runs").exists()


@pytest.mark.ci  # > 10 CPU-s; `.ci/run` runs it (`pytest -m ci`)
def test_smoke_run_serial_vs_trapo_writes_table_csv_and_plots(tmp_path):
    """The `--quick` path end to end, shortened further: both arms run in their own processes with TRL's real
    SFTTrainer / GRPOTrainer for the serial arm, and the report is complete."""
    out = tmp_path / "cmp"
    report = compare_pipelines.main(
        ["--quick", "--output_dir", str(out), "--max_steps", "12", "--eval_every", "0.5", "--heldout_docs", "40"]
        + ["--eval_per_split_family", "4"]
    )
    summary = report["summary"]
    assert set(summary) == {"serial", "trapo"}
    for method in ("serial", "trapo"):
        entry = summary[method]
        assert entry["steps"] == [12]
        assert all(math.isfinite(v) and 0 <= v <= 1 for v in entry["accuracy"])
        assert all(math.isfinite(v) and v >= 0 for v in entry["forgetting"])
        assert entry["wall_s"][0] > 0 and entry["peak_rss_mb"][0] > 0 and entry["tokens"][0] > 0
    # the serial arm really ran three TRL stages, in order, on the split budget
    serial = json.loads((out / "runs" / "serial-seed0" / "result.json").read_text())
    assert [s["stage"] for s in serial["stage_ends"]] == ["pretrain", "sft", "rl"]
    trapo = json.loads((out / "runs" / "trapo-seed0" / "result.json").read_text())
    assert trapo["checkpoints"][0]["step"] == 0 and trapo["checkpoints"][-1]["step"] == 12
    with open(out / "checkpoints.csv", newline="", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    assert {r["method"] for r in table} == {"serial", "trapo"}
    assert set(pipeline_report.CSV_FIELDS) <= set(table[0])
    for name in ("results.md", "accuracy_vs_time.png", "forgetting_vs_time.png", "trapo_weights_curriculum.png"):
        assert (out / name).stat().st_size > 0, name
    assert "| `serial` |" in (out / "results.md").read_text() and "| `trapo` |" in report["markdown"]
    # the same command again resumes from the cached runs: nothing is re-run, the report is the same
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/result.json")}
    again = compare_pipelines.main(
        ["--quick", "--output_dir", str(out), "--max_steps", "12", "--eval_every", "0.5", "--heldout_docs", "40"]
        + ["--eval_per_split_family", "4"]
    )
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert again["summary"] == summary


def test_lr_from_reuses_an_earlier_search_and_checks_it(tmp_path, capsys):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"lr_search": {"trapo": {"learning_rate": 6e-4, "rl_phase_learning_rate": None}}}))
    rates = compare_pipelines.searched_rates(str(meta), ["trapo", "trapo_static"])
    assert rates == {"trapo": {"learning_rate": 6e-4, "rl_phase_learning_rate": None, "from": str(meta)}}
    with pytest.raises(ValueError, match=r"no searched rate for \['serial'\]"):
        compare_pipelines.searched_rates(str(meta), ["serial", "trapo"])
    with pytest.raises(ValueError, match="cannot read it"):
        compare_pipelines.searched_rates(str(tmp_path / "missing.json"), ["trapo"])
    with pytest.raises(SystemExit) as exit_:  # parser.error: usage and the fix, status 2
        compare_pipelines.main(["--output_dir", str(tmp_path), "--lr_from", str(meta), "--lr_search"])
    assert exit_.value.code == 2 and "drop --lr_search" in capsys.readouterr().err


def test_a_cached_run_is_reused_only_for_the_same_settings_and_code(tmp_path):
    spec = {"method": "trapo", "seed": 0, "run_dir": str(tmp_path), "job_extra": {"learning_rate": 6e-4}}
    spec["code"], spec["rerun"] = compare_pipelines.code_fingerprint(), False
    write_json_atomic(str(tmp_path / "spec.json"), spec)
    write_json_atomic(str(tmp_path / "result.json"), {"method": "trapo", "seed": 0})
    assert compare_pipelines.cached_result(spec) == {"method": "trapo", "seed": 0}
    # a run directory copied into another comparison (other paths, same settings) is reused there
    moved = {**spec, "run_dir": str(tmp_path), "job_extra": {**spec["job_extra"], "output_dir": "/elsewhere"}}
    write_json_atomic(str(tmp_path / "spec.json"), {**spec, "run_dir": "/old/place"})
    assert compare_pipelines.cached_result(moved) == {"method": "trapo", "seed": 0}
    assert compare_pipelines.cached_result({**spec, "job_extra": {"learning_rate": 1e-3}}) is None
    assert compare_pipelines.cached_result({**spec, "code": "0" * 64}) is None  # the code changed
    assert compare_pipelines.cached_result({**spec, "rerun": True}) is None
    (tmp_path / "result.json").write_text("{truncated")  # a damaged result is run again, not trusted
    assert compare_pipelines.cached_result(spec) is None


def test_without_a_serial_run_time_to_target_is_absent_not_censored():
    base = {"wall_s": 100.0, "cpu_s": 100.0, "generation_s": 1.0, "peak_rss_mb": 1.0, "tokens": 1, "steps": 10}
    results = [
        {**base, "method": m, "seed": 0, "checkpoints": rows((0, 0, 2.0), (100, 0.5, 2.0))}
        for m in ("trapo", "trapo_static")
    ]
    table = pipeline_report.markdown_table(pipeline_report.summarize(results))
    assert "censored" not in table and "| `trapo_static` | 1 |" in table
    assert pipeline_report.verdict(pipeline_report.summarize(results)) == {}


@pytest.mark.parametrize("ablation", sorted(compare_pipelines.ABLATIONS))
def test_every_ablation_builds_a_trainer_on_the_main_jobs_data(tmp_path, ablation):
    """Each `--ablations` variant is a valid main-job configuration whose setting reaches the trainer (guidance finds
    its column in the built-in suite, with no demonstration for the RL-only family)."""
    from trl_trapo import TRAPOTrainer, cli

    method, overrides = compare_pipelines.ABLATIONS[ablation]
    extra = {**compare_pipelines.method_overrides(method), "output_dir": str(tmp_path), "max_steps": 2}
    script_args, config, model_args, builtin = compare_pipelines.parse_job([], quick=True, extra=extra)
    assert builtin and all(getattr(config, k) == v for k, v in overrides.items())
    inputs = cli.build_inputs(script_args, config, model_args)
    trainer = TRAPOTrainer(
        model=inputs.model,
        reward_funcs=inputs.reward_funcs,
        args=config,
        train_dataset=inputs.train_dataset,
        pretrain_dataset=inputs.pretrain_dataset,
        sft_dataset=inputs.sft_dataset,
        eval_dataset=inputs.eval_dataset,
        processing_class=inputs.tokenizer,
    )
    # exploration and self-imitation are on by default on the built-in task (auto); their ablations turn them off
    assert (trainer.exploration is not None) == overrides.get("exploration", True)
    assert (trainer.memory_pool.successes is not None) == overrides.get("self_imitation", True)
    assert (trainer.rollouts.guidance is not None) == ("demonstration_column" in overrides)


def test_paired_interval_and_verdict_by_hand():
    # differences 1, 0, 1: mean 2/3, s = sqrt(1/3), se = s / sqrt(3) = 1/3; t_{0.95, 2} = 2.920
    mean, low, high = pipeline_report.paired_interval([1.0, 0.0, 1.0])
    assert (mean, low, high) == pytest.approx((2 / 3, 2 / 3 - 2.920 / 3, 2 / 3 + 2.920 / 3))
    assert pipeline_report.component_verdict(mean, low, high, better=1) == "not shown"  # [-0.31, 1.64] holds 0
    mean, low, high = pipeline_report.paired_interval([0.5, 0.6, 0.4, 0.5, 0.55])
    assert low > 0 and pipeline_report.component_verdict(mean, low, high, better=1) == "helps"
    assert pipeline_report.component_verdict(mean, low, high, better=-1) == "hurts"  # e.g. more forgetting
    assert pipeline_report.component_verdict(-mean, -high, -low, better=-1) == "helps"
    with pytest.raises(ValueError, match="1 pairs"):
        pipeline_report.paired_interval([0.3])


def test_paired_component_table_pairs_by_seed():
    def entry(seeds, acc, rl, forget):
        return {"seeds": seeds, "accuracy": acc, "accuracy_rl_only": rl, "forgetting": forget}

    summary = {
        "trapo": entry([0, 1, 2], [0.75, 1.0, 0.75], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]),
        # listed in another seed order: pairing must follow the seed, not the position
        "trapo_exploration": entry([2, 0, 1], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),
    }
    table = pipeline_report.paired_component_table(summary)
    row = next(line for line in table.splitlines() if "exploration" in line)
    # rl_only differences (seeds 0, 1, 2): 1, 0, 1 -> +0.667, interval +0.667 -+ 2.920/3
    assert "+0.667 [-0.307, +1.640] not shown" in row
    assert "| seeds 0, 1, 2" in table.splitlines()[0] or "(seeds 0, 1, 2)" in table.splitlines()[0]
    # a variant that *removes* a component reports the component's effect the other way round (with - without):
    # the same numbers as `trapo_no_exploration` give -0.667, and 5 seeds of a consistent loss are "helps"
    removed = {"trapo": summary["trapo"], "trapo_no_exploration": summary["trapo_exploration"]}
    row = next(line for line in pipeline_report.paired_component_table(removed).splitlines() if "no targeted" in line)
    assert "-0.667 [-1.640, +0.307] not shown" in row
    consistent = {
        "trapo": entry([0, 1, 2, 3, 4], [1.0] * 5, [1.0, 0.9, 1.0, 0.95, 1.0], [0.0] * 5),
        "trapo_no_self_imitation": entry([0, 1, 2, 3, 4], [0.8] * 5, [0.1, 0.2, 0.0, 0.3, 0.1], [0.0] * 5),
    }
    row = pipeline_report.paired_component_table(consistent).splitlines()[-1]
    assert "helps" in row.split("|")[6]  # rl_only: with self-imitation is better in every seed


@pytest.mark.ci  # > 10 CPU-s; `.ci/run` runs it (`pytest -m ci`)
def test_trl_distillation_trainer_alone_runs_as_a_method_of_the_comparison(tmp_path, capsys):
    """`--methods distill_trl`: TRL's DistillationTrainer on the RL prompts from the main job's teacher, evaluated at
    the same checkpoints as TRAPO; the teacher is required, and so is a fixed learning rate."""
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model

    teacher = tmp_path / "teacher"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, seed=1).save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    out = tmp_path / "cmp"
    common = ["--quick", "--output_dir", str(out), "--max_steps", "6", "--eval_every", "0.5", "--heldout_docs", "40"]
    common += ["--eval_per_split_family", "4", "--methods", "distill_trl", "trapo"]
    with pytest.raises(SystemExit) as exit_:  # parser.error: usage and the fix, status 2
        compare_pipelines.main([*common, "--lr_search"])
    assert exit_.value.code == 2 and "--no-lr_search" in capsys.readouterr().err
    report = compare_pipelines.main([*common, "--teacher_model_name_or_path", str(teacher)])
    assert set(report["summary"]) == {"distill_trl", "trapo"}
    run = json.loads((out / "runs" / "distill_trl-seed0" / "result.json").read_text())
    assert [c["step"] for c in run["checkpoints"]] == [0, 3, 6] and run["tokens"] > 0
    trapo = json.loads((out / "runs" / "trapo-seed0" / "result.json").read_text())
    assert trapo["checkpoints"][-1]["step"] == 6


def test_build_setup_with_no_held_out_documents_trains_on_the_whole_corpus():
    # heldout_docs=0 (the weighting benchmark's wrong teacher: the main job's own data) once failed in `select`
    setup = compare_pipelines.build_setup({"job_argv": [], "quick": True, "job_extra": {}, "heldout_docs": 0})
    assert len(setup.pretrain) == 3000 and setup.heldout_texts == []
    held = compare_pipelines.build_setup({"job_argv": [], "quick": True, "job_extra": {}, "heldout_docs": 300})
    assert len(held.pretrain) == 2700 and len(held.heldout_texts) == 300
