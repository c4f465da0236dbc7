"""`scripts/benchmarks/gpu_check.py` (meant for a lent GPU machine) runs end to end on CPU at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_check_tiny_on_cpu(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "benchmarks" / "gpu_check.py"), "--tiny", "--steps", "6", "--no_vllm",
         "--json", str(tmp_path / "results.json")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "tokens/s" in completed.stdout and "gen share" in completed.stdout
    (result,) = json.loads((tmp_path / "results.json").read_text())
    assert result["run"] == "hf-generate" and result["steps_timed"] == 6
    assert result["tokens_per_s"] > 0 and 0 <= result["generation_share"] < 1
    assert result["mfu_pct"] is None  # no peak FLOPs known for a CPU
