# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/experiments/distill_real.py`: the cut student, the divergence measure, and a `--quick` run of both arms
(TRAPO with the teacher, TRL's `DistillationTrainer`) through the cache and the docs block."""

import json
import sys
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))
sys.path.insert(0, str(ROOT / "scripts"))

import compare_real  # noqa: E402
import distill_real  # noqa: E402


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return compare_real.make_tiny_model(tmp_path_factory.mktemp("teacher") / "tiny")


def test_the_student_is_the_teachers_first_layers(teacher, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = distill_real.make_student(teacher, tmp_path / "student", 1)
    student = AutoModelForCausalLM.from_pretrained(folder)
    full = AutoModelForCausalLM.from_pretrained(teacher)
    assert student.config.num_hidden_layers == 1 and len(student.model.layers) == 1
    assert full.config.num_hidden_layers == 2
    kept = dict(full.named_parameters())
    for name, value in student.named_parameters():
        assert torch.equal(value, kept[name]), name  # embeddings, layer 0, final norm: the teacher's weights
    assert (folder / "tokenizer_config.json").is_file()
    with pytest.raises(ValueError, match="--student_layers must be in \\[1, 2\\]"):
        distill_real.make_student(teacher, tmp_path / "too-deep", 3)


def test_divergences_are_zero_against_itself_and_match_the_definition(teacher, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(teacher).eval()
    other = AutoModelForCausalLM.from_pretrained(distill_real.make_student(teacher, tmp_path / "s", 1)).eval()
    prompts, completions = [[5, 6, 7], [8, 9]], [[10, 11], []]
    same = distill_real.divergences(model, model, prompts, completions, 0.7, 2)
    assert same["reverse_kl"] == pytest.approx(0.0, abs=1e-6) and same["tokens"] == 2
    assert same["per_row_reverse_kl"][1] is None  # an empty completion is skipped, not counted as 0
    out = distill_real.divergences(other, model, prompts, completions, 0.7, 2)
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 10, 11]])
        log_s = torch.log_softmax(other(input_ids=ids).logits[0, 2:4] / 0.7, -1)
        log_t = torch.log_softmax(model(input_ids=ids).logits[0, 2:4] / 0.7, -1)
    reverse = (log_s.exp() * (log_s - log_t)).sum(-1).mean().item()
    forward = (log_t.exp() * (log_t - log_s)).sum(-1).mean().item()
    assert out["reverse_kl"] == pytest.approx(reverse, rel=1e-5) and out["reverse_kl"] > 0
    assert out["forward_kl"] == pytest.approx(forward, rel=1e-5)


@pytest.mark.ci  # > 10 CPU-s; `.ci/run` runs it (`pytest -m ci`)
def test_quick_run_trains_both_arms_and_renders_the_block(tmp_path):
    work = tmp_path / "work"
    summary = distill_real.main(["--quick", "--work_dir", str(work)])
    assert summary["pending"] == []
    for name in distill_real.ARMS:
        arm = summary["arms"][name]
        assert [p["step"] for p in arm["points"]] == [0, 1, 2]
        assert all(p["reverse_kl"] >= 0 and p["heldout_loss"] > 0 for p in arm["points"])
    trapo = json.loads((work / "quick-results" / "arms" / "trapo.json").read_text())
    # the TRAPO arm trained the teacher's objective (not only the other three)
    assert any("loss/distill" in entry for entry in trapo["log_history"])
    assert trapo["config"]["distillation_temperature"] == 0.7
    block = distill_real.render_block(summary)
    flat = " ".join(block.split())  # prose wrapped where the machine's own strings put the breaks
    assert "TRL `DistillationTrainer`" in flat and "TRAPO (joint + teacher)" in flat
    # cached: a second run trains nothing (the arms' files are not rewritten)
    arm_file = work / "quick-results" / "arms" / "trapo.json"
    before = arm_file.stat().st_mtime_ns
    distill_real.main(["--quick", "--work_dir", str(work)])
    assert arm_file.stat().st_mtime_ns == before


def test_a_misspelt_option_is_named_before_a_model_is_fetched_or_a_run_starts(tmp_path, monkeypatch, capsys):
    """Unknown arguments go to every run of the main job: `--qiuck` (for `--quick`) went there unchecked, and the
    first run died of it (after the model was looked for). Now the main job's parser finds it unknown first."""
    monkeypatch.setattr(distill_real, "task_specs", lambda *a: pytest.fail("the runs were planned"))
    for typo, close in (("--qiuck", "--quick (this script)"), ("--max_step", "--max_steps")):
        with pytest.raises(SystemExit) as exit_:
            distill_real.main([typo, "--work_dir", str(tmp_path / "work")])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2
        assert (
            f"{typo}: neither this script nor the main job (examples/trapo.py) takes it. Did you mean {close}?" in err
        )
    assert not (tmp_path / "work").exists()
