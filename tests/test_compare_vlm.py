# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/experiments/compare_vlm.py`: the relay's step split and the `--quick` run of the whole harness (TRAPO,
TRAPO per modality, TRL's SFTTrainer -> SFTTrainer -> GRPOTrainer on the tiny VLM), reused on a second call; the
docs block; and `scripts/benchmarks/benchmark_vlm.py --quick`."""

import json
import os
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "experiments"))
sys.path.insert(0, os.path.join(ROOT, "scripts", "benchmarks"))

import compare_vlm  # noqa: E402


METRICS = {"accuracy", "accuracy_sft_tasks", "accuracy_rl_only", "accuracy_shape", "caption_loss"}


def test_the_relay_splits_the_steps_as_trapos_three_row_shares():
    from trl_trapo.jobs import vision as vision_job

    _, config = vision_job.parse_args([])
    steps = compare_vlm.relay_steps(config)
    assert sum(steps) == config.max_steps == 900 and all(s > 0 for s in steps)


def test_the_relay_rl_stage_keeps_only_image_prompts():
    from trl_trapo.tasks.vision import make_visual_task_suite

    suite = make_visual_task_suite(0, num_pretrain_docs=4, num_sft_per_task=2, num_rl_per_task=4, num_eval_per_task=1)
    kept = compare_vlm.relay_rl_dataset(suite.rl_train)
    assert len(kept) and all(images for images in kept["images"])
    assert "text" not in set(kept["task"]) and "text" in set(suite.rl_train["task"])


def test_quick_run_measures_every_arm_and_reuses_them(tmp_path, caplog):
    out = tmp_path / "compare"
    payload = compare_vlm.main(["--quick", "--work_dir", str(out)])
    assert json.loads((out / "results.json").read_text())["table"] == payload["table"]
    runs = {run["arm"]: run for run in payload["runs"]}
    assert set(runs) == set(compare_vlm.ARMS) and payload["seeds"] == [0]
    budget = payload["budget"]
    for run in runs.values():
        assert run["steps"] == budget["max_steps"] == 4  # the same optimizer steps
        assert METRICS <= set(run["metrics"]) and METRICS <= set(run["initial"])
        assert run["train_s"] > 0
        assert run["initial"]["caption_loss"] != run["metrics"]["caption_loss"]  # training moved the model
    # every arm starts from the same random init
    assert runs["trapo"]["initial"] == runs["trapo_modality"]["initial"] == runs["serial"]["initial"]
    stages = runs["serial"]["stages"]
    assert [s["stage"] for s in stages] == ["pretrain", "sft", "rl"]
    planned = [budget["relay_pretrain_steps"], budget["relay_sft_steps"], budget["relay_rl_steps"]]
    assert [s["steps"] for s in stages] == planned
    summary = payload["summary"]["serial"]
    assert summary["caption_loss_change"]["mean"] == pytest.approx(
        runs["serial"]["metrics"]["caption_loss"] - runs["serial"]["initial"]["caption_loss"]
    )
    assert payload["table"].count("\n") == 5  # header, rule, init, three arms
    # a second call reuses every run (same code, same settings)
    with caplog.at_level("INFO", logger="compare_vlm"):
        again = compare_vlm.main(["--quick", "--work_dir", str(out)])
    assert sum("reused" in r.getMessage() for r in caplog.records) == 3
    assert again["table"] == payload["table"]
    # --collect_only runs nothing: a seed without finished runs is listed as missing
    collected = compare_vlm.main(["--quick", "--work_dir", str(out), "--seeds", "0", "1", "--collect_only"])
    assert collected["table"] == payload["table"] and not (out / "runs" / "trapo-seed1").exists()
    assert collected["missing"] == ["trapo-seed1", "trapo_modality-seed1", "serial-seed1"]
    # the docs block renders from the results file, between its markers
    page = tmp_path / "vision.md"
    page.write_text("intro\n<!-- vlm-table:start -->\nold\n<!-- vlm-table:end -->\nend\n", encoding="utf-8")
    compare_vlm.main(["--write_docs", "--results", str(out / "results.json"), "--page", str(page)])
    text = page.read_text(encoding="utf-8")
    assert payload["table"] in text and "old" not in text and text.endswith("end\n")


@pytest.mark.ci  # > 10 CPU-s; `.ci/run` runs it (`pytest -m ci`)
def test_cost_benchmark_quick_mode_runs(tmp_path):
    import benchmark_vlm

    out = tmp_path / "cost.json"
    payload = benchmark_vlm.main(["--quick", "--output_json", str(out)])
    assert json.loads(out.read_text())["ratios"] == payload["ratios"]
    assert set(payload["runs"]) == {"trl", "trapo"}
    for record in payload["runs"].values():
        assert len(record["steps"]) == 1 + 2  # warm-up + measured
        assert record["step_time_cpu_s"] > 0 and record["peak_rss_mib"] > 0
    assert {"step_time_cpu_s", "peak_rss_mib"} <= set(payload["ratios"])


def test_a_misspelt_option_of_the_script_is_named_as_one(tmp_path, capsys):
    """Unknown arguments go to the VLM job (examples/trapo_vlm.py): `--qiuck` (for `--quick`) was the job's ValueError (a traceback naming the
    job's closest names only). Now it is a usage error naming the closest of the script's and the job's."""
    for typo, close in (("--qiuck", "--quick (this script)"), ("--learning_rat", "--learning_rate")):
        with pytest.raises(SystemExit) as exit_:
            compare_vlm.main([typo, "--work_dir", str(tmp_path / "out")])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2
        assert (
            f"{typo}: neither this script nor the VLM job (examples/trapo_vlm.py) takes it. Did you mean {close}?"
            in err
        ), err
    assert not (tmp_path / "out").exists()
