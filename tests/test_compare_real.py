# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/experiments/compare_real.py`: the statistics by hand, the format check, the cache, and a `--quick` run
(a tiny random model with SmolLM2's real tokenizer and chat template, on the real GSM8K and Shakespeare files)."""

import json
import math
import shlex
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))

import compare_real  # noqa: E402
from runlib import write_json_atomic  # noqa: E402


# ---------------------------------------------------------------------------------------------------------------------
# pure functions
# ---------------------------------------------------------------------------------------------------------------------
def test_paired_difference_by_hand():
    # d = [1, 0, 0, -1, 1]: mean 0.2; deviations 0.8, -0.2, -0.2, -1.2, 0.8 -> s² = 2.8 / 4 = 0.7; se = √0.7 / √5
    out = compare_real.paired_difference([1, 1, 0, 0, 1], [0, 1, 0, 1, 0])
    se = math.sqrt(0.7) / math.sqrt(5)
    assert out["difference"] == pytest.approx(0.2)
    assert out["se"] == pytest.approx(se)
    assert (out["low"], out["high"]) == pytest.approx((0.2 - 1.959964 * se, 0.2 + 1.959964 * se), abs=1e-6)
    assert (out["a_only"], out["b_only"], out["n"]) == (2, 1, 5)
    assert not out["excludes_harm"]  # [-0.53, 0.93] contains negative differences
    # A solves 5 problems B misses, and nothing else differs: d = 1 five times, 0 five times
    out = compare_real.paired_difference([1] * 10, [0] * 5 + [1] * 5)
    half_width = 1.959964 * math.sqrt(2.5 / 9) / math.sqrt(10)
    assert (out["low"], out["high"]) == pytest.approx((0.5 - half_width, 0.5 + half_width), abs=1e-6)
    assert out["excludes_harm"] and out["low"] > 0
    # the same outcomes everywhere: no discordant pair, a zero-width interval at 0
    out = compare_real.paired_difference([1, 0, 1], [1, 0, 1])
    assert (out["difference"], out["low"], out["high"], out["a_only"], out["b_only"]) == (0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="equal lengths"):
        compare_real.paired_difference([1, 0], [1])
    with pytest.raises(ValueError, match="at least 2"):
        compare_real.paired_difference([1], [0])


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", True),
        ("#### 1,000\n", True),
        ("#### -3.5", True),
        ("#### 72\nThe answer is: 72", False),  # something after the answer line
        ("The answer is 72.", False),  # no `####`
        ("#### seventy-two", False),
        ("#### $18", False),  # not a plain number
        ("#### 72 clips", False),
    ],
)
def test_ends_with_answer(completion, expected):
    assert compare_real.ends_with_answer(completion) is expected


def test_forgetting_is_the_rise_over_the_initial_model_and_the_target_halves_serial():
    assert compare_real.forgetting(2.0, [2.5, 1.75]) == pytest.approx([0.5, -0.25])
    assert compare_real.forgetting_verdict(0.1, 0.4) == {"ratio": pytest.approx(0.25), "met": True}
    assert compare_real.forgetting_verdict(0.3, 0.4) == {"ratio": pytest.approx(0.75), "met": False}
    assert compare_real.forgetting_verdict(0.3, -0.1) == {"ratio": None, "met": None}  # nothing to halve


def test_the_docs_and_the_recipe_convert_the_data_as_the_script_does():
    """`compare_real.py` converts the data with `CONVERT_ARGV`; docs/real_models.md and the recipe's header give the
    same command, so the recipe run and the comparison's `trapo` arm read the same files."""
    expected = ["python", "scripts/gsm8k_to_trl.py", *compare_real.CONVERT_ARGV]
    for document in (ROOT / "docs" / "real_models.md", compare_real.RECIPE):
        text = document.read_text(encoding="utf-8")
        start = text.index("python scripts/gsm8k_to_trl.py examples/data/gsm8k/train_first1500.jsonl --conversational")
        lines = []
        for line in text[start:].splitlines():
            line = line.lstrip("# ").rstrip()
            lines.append(line.rstrip("\\").strip())
            if not line.endswith("\\"):
                break
        assert shlex.split(" ".join(lines)) == expected, document.name


def test_the_recorded_command_drops_only_the_flags_that_choose_what_runs_now():
    argv = ["--arms", "serial", "trapo", "--jobs", "1", "--threads=1", "--max_steps", "400", "--work_dir", "w"]
    assert compare_real.reproducing_argv(argv) == ["--max_steps", "400"]
    assert compare_real.reproducing_argv(["--arms", "--quick"]) == ["--quick"]  # `--arms` with no value


def test_a_stale_or_missing_cache_entry_runs_again(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(compare_real, "worker", lambda spec: ran.append(spec["name"]))
    specs = [{"name": name, "cache": str(tmp_path / f"{name}.json"), "fingerprint": "abc"} for name in ("a", "b", "c")]
    write_json_atomic(tmp_path / "a.json", {"fingerprint": "abc"})
    write_json_atomic(tmp_path / "b.json", {"fingerprint": "made-with-other-settings"})
    assert compare_real.run_tasks(specs, jobs=0, log_dir=tmp_path) == ["b", "c"]
    assert ran == ["b", "c"]


# ---------------------------------------------------------------------------------------------------------------------
# a real --quick run (in this process), then a resume
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.ci  # > 10 CPU-s; `.ci/run` runs it (`pytest -m ci`)
def test_quick_run_measures_every_arm_and_resumes_without_rerunning(tmp_path, monkeypatch):
    work = tmp_path / "work"
    argv = ["--quick", "--jobs", "0", "--work_dir", str(work)]
    summary = compare_real.main(argv)
    results_dir = work / "quick-results"
    initial = json.loads((results_dir / "initial.json").read_text())
    assert set(summary["arms"]) == set(compare_real.ARMS) and summary["pending"] == []
    steps = compare_real.QUICK_JOB["max_steps"]
    for name, arm in summary["arms"].items():
        cached = json.loads((results_dir / "arms" / f"{name}.json").read_text())
        assert cached["steps"] == steps, name
        # 3 points: steps 1, 2, 3 (serial: its SFT stage ends at one of them); the last is the full evaluation
        assert [p["step"] for p in arm["points"]] == [1, 2, 3], name
        for point in arm["points"]:
            assert point["forgetting"] == pytest.approx(point["heldout_loss"] - initial["heldout_loss"])
        final = cached["final"]
        assert len(final["correct"]) == len(final["completions"]) == compare_real.QUICK_EVAL["eval_rows"]
        assert arm["accuracy"] == sum(final["correct"]) / len(final["correct"])
        assert arm["format"] == sum(map(compare_real.ends_with_answer, final["completions"])) / len(final["correct"])
        assert arm["train_wall_s"] > 0 and arm["train_cpu_s"] > 0 and arm["peak_rss_mb"] > 100
        assert math.isfinite(arm["forgetting_end"])
    serial = json.loads((results_dir / "arms" / "serial.json").read_text())
    assert [s["stage"] for s in serial["stages"]] == ["sft", "rl"] and sum(s["steps"] for s in serial["stages"]) == 3
    paired = summary["paired"]
    trapo = json.loads((results_dir / "arms" / "trapo.json").read_text())
    assert paired == compare_real.paired_difference(trapo["final"]["correct"], serial["final"]["correct"])
    assert (results_dir / "real_smollm2.png").stat().st_size > 1000
    block = compare_real.render_block(json.loads((results_dir / "results.json").read_text()))
    flat = " ".join(block.split())  # prose wrapped where the machine's own strings put the breaks
    assert "| `trapo` |" in flat and "| `serial` |" in flat and "95 % CI" in flat

    # resume: nothing is recomputed; an arm whose cache is gone is the only one that runs again
    ran = []
    real_worker = compare_real.worker
    monkeypatch.setattr(compare_real, "worker", lambda spec: ran.append(spec["name"]) or real_worker(spec))
    before = {p.name: p.read_text() for p in (results_dir / "arms").glob("*.json")}
    compare_real.main(argv)
    assert ran == []
    assert {p.name: p.read_text() for p in (results_dir / "arms").glob("*.json")} == before
    (results_dir / "arms" / "trapo_no_pretrain.json").unlink()
    compare_real.main(argv)
    assert ran == ["trapo_no_pretrain"]
    assert {p.name: p.read_text() for p in (results_dir / "arms").glob("*.json") if p.name != ran[0] + ".json"} == {
        k: v for k, v in before.items() if k != "trapo_no_pretrain.json"
    }


def test_a_misspelt_option_is_named_before_a_model_is_fetched_or_a_run_starts(tmp_path, monkeypatch, capsys):
    """Unknown arguments go to every run of the main job: `--qiuck` (for `--quick`) went there unchecked, and the
    first run died of it (after the model was looked for). Now the main job's parser finds it unknown first."""
    monkeypatch.setattr(compare_real, "task_specs", lambda *a: pytest.fail("the runs were planned"))
    for typo, close in (("--qiuck", "--quick (this script)"), ("--max_step", "--max_steps")):
        with pytest.raises(SystemExit) as exit_:
            compare_real.main([typo, "--work_dir", str(tmp_path / "work")])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2
        assert (
            f"{typo}: neither this script nor the main job (examples/trapo.py) takes it. Did you mean {close}?" in err
        )
    assert not (tmp_path / "work").exists()
