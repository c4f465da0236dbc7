# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/experiments/guidance_real.py --quick`: both arms run on a tiny model with SmolLM2's tokenizer and the real
GSM8K rows, and the logs show what guidance changes (demonstrations go into the flat groups, which then carry an RL
loss; the sampled completions' metrics leave them out)."""

import json
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))

import guidance_real  # noqa: E402


@pytest.mark.ci  # > 10 CPU-s; `.ci/run` runs it (`pytest -m ci`)
def test_quick_run_compares_the_arms(tmp_path):
    results = guidance_real.main(["--quick", "--work_dir", str(tmp_path)])
    assert json.loads((tmp_path / "guidance.json").read_text()) == json.loads(json.dumps(results))
    without, with_ = (results["arms"][a]["summary"] for a in ("without_guidance", "with_guidance"))
    # a random tiny model never writes `#### N`: every sampled group is flat in both arms
    assert without["rl/zero_variance_groups"]["mean"] == 1.0 == with_["rl/zero_variance_groups"]["mean"]
    assert without["objective/scores"]["mean"] == 0.0 == with_["objective/scores"]["mean"]  # samples only
    # without guidance the RL loss is 0 (all advantages 0); with it every flat group got its demonstration, which
    # scores 1 and gives the group advantages, hence a loss
    assert without["rl/guided_groups"]["steps"] == 0 and with_["rl/guided_groups"]["mean"] == 1.0
    assert abs(without["loss/rl"]["mean"]) < 1e-6 < abs(with_["loss/rl"]["mean"])
    # the same seed, data and steps: the arms differ only by guidance (the pretraining loss of step 1 agrees)
    first = [results["arms"][a]["steps"][0]["loss/pretrain"] for a in ("without_guidance", "with_guidance")]
    assert first[0] == first[1]
