# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The built-in VLM job (`examples/trapo_vlm.py`, `trl_trapo.jobs.vision`) and a TRL GRPO VLM script on TRAPO."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parent.parent
SMALL = [
    "--num_pretrain_docs", "40", "--num_sft_per_task", "16", "--num_rl_per_task", "16", "--num_eval_per_task", "4",
    "--num_eval_captions", "4", "--per_device_train_batch_size", "8", "--num_generations", "4",
]  # fmt: skip


def run(args: list[str], cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    completed = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-6000:]
    return completed


@pytest.mark.parametrize("per_modality", [False, True], ids=["three-objectives", "per-modality"])
def test_the_vlm_job_writes_results_and_a_model_that_reloads(tmp_path, per_modality):
    """`examples/trapo_vlm.py` as docs/vision.md runs it, shortened: it evaluates before and after, writes
    `eval_results.json` with every documented metric, and saves a model and processor that `AutoModelForImageTextToText`
    / `AutoProcessor` reload offline and that answer an image prompt; `--per_modality` trains image rows as objectives
    of their own."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "out"
    extra = ["--per_modality"] if per_modality else []
    completed = run(["examples/trapo_vlm.py", "--max_steps", "3", "--output_dir", str(out), *SMALL, *extra])
    assert "accuracy_sft_tasks" in completed.stdout and "caption_loss" in completed.stdout
    results = json.loads((out / "eval_results.json").read_text())
    for name in ("accuracy", "accuracy_sft_tasks", "accuracy_rl_only", "accuracy_shape", "caption_loss"):
        assert f"eval_{name}" in results and f"eval_{name}_initial" in results, name
    assert results["eval_caption_loss"] < results["eval_caption_loss_initial"]
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    from trl_trapo.tasks.vision import greedy_vlm_accuracy, make_visual_task_suite

    suite = make_visual_task_suite(0, num_pretrain_docs=8, num_sft_per_task=8, num_rl_per_task=8, num_eval_per_task=2)
    assert 0.0 <= greedy_vlm_accuracy(model, processor, suite.eval)["accuracy"] <= 1.0
    assert isinstance(model.get_output_embeddings().weight, torch.Tensor)


def test_a_grpo_vlm_script_runs_with_only_the_import_changed(tmp_path):
    """tests/distributed_vlm_job.py — a TRL GRPOTrainer VLM script (model, processor, TRL-format image prompts, reward
    functions) with `from trl_trapo import TRAPOConfig as GRPOConfig, TRAPOTrainer as GRPOTrainer` — trains on one
    process; its two-process run is in tests/test_distributed_jobs.py."""
    run(["tests/distributed_vlm_job.py", "--output_dir", str(tmp_path)])
    record = json.loads((tmp_path / "ranks" / "vlm0.json").read_text())
    assert record["initial_digest"] != record["final_digest"]
    logs = json.loads((tmp_path / "ranks" / "rank0.json").read_text())["log_history"]
    assert any("loss/rl" in log for log in logs)


@pytest.mark.parametrize(
    "name", ["num_pretrain_docs", "num_sft_per_task", "num_rl_per_task", "num_eval_per_task", "num_eval_captions"]
)
def test_a_size_of_zero_is_refused_naming_the_flag(name):
    """`--num_eval_captions 0` crashed in the caption loss after training with "`dataset` is empty" (a fresh user's
    trial); every size flag is checked when the arguments are parsed."""
    from trl_trapo.jobs import vision as vision_job

    with pytest.raises(ValueError, match=f"--{name}=0: must be a whole number >= 1"):
        vision_job.parse_args([f"--{name}", "0"])


@pytest.mark.parametrize("flag, objective", [("--sft_weight", "sft"), ("--pretrain_weight", "pretrain")])
def test_per_modality_weight_zero_turns_off_the_image_twin_too(tmp_path, flag, objective):
    """`--per_modality --sft_weight 0` switched off the text demonstrations only: `sft_image` still trained at
    weight 1 (a fresh user's trial). An image objective has its text objective's static weight."""
    from trl_trapo.jobs import vision as vision_job

    job_args, config = vision_job.parse_args(
        [*SMALL, "--per_modality", flag, "0", "--output_dir", str(tmp_path), "--max_steps", "2"]
    )
    trainer = vision_job.build_trainer(vision_job.build_data(job_args), config)
    weights = {o.name: o.weight for o in trainer.objectives}
    assert weights[objective] == weights[objective + "_image"] == 0.0, weights
    other = "pretrain" if objective == "sft" else "sft"
    assert weights[other] == weights[other + "_image"] == getattr(config, f"{other}_weight") > 0, weights
