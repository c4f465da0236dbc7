# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The jobs agree: the agent and VLM jobs train and save through the main job's steps (`cli.train_job`,
`cli.save_job`), so each leaves `trainer_state.json` next to its model and `eval_results.json`, and each resumes from
`--resume_from_checkpoint` (checked before the model is built).

They had their own copies of those steps: neither wrote `trainer_state.json` (the log history of the run), and both
trained from scratch whatever `--resume_from_checkpoint` said.
"""

from __future__ import annotations

import importlib
import json

import pytest


JOBS = {
    "agent": (
        "trl_trapo.jobs.agent",
        [
            "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1", "--num_generations", "4",
            "--response_length", "48", "--num_traces", "32", "--num_rl_prompts", "16", "--num_eval", "4",
            "--other_sft_per_task", "8", "--heldout_docs", "10",
        ],
    ),
    "vision": (
        "trl_trapo.jobs.vision",
        [
            "--num_pretrain_docs", "40", "--num_sft_per_task", "16", "--num_rl_per_task", "16",
            "--num_eval_per_task", "4", "--num_eval_captions", "4", "--per_device_train_batch_size", "8",
            "--num_generations", "4",
        ],
    ),
}  # fmt: skip


def checkpoints(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("checkpoint-"))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_the_job_writes_the_trainer_state_and_resumes_as_the_main_job(tmp_path, name):
    module, small = importlib.import_module(JOBS[name][0]), JOBS[name][1]
    steps = ["--max_steps", "2", "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "1"]
    first = tmp_path / "first"
    assert module.run([*small, *steps, "--output_dir", str(first)]) == 0
    state = json.loads((first / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert [log["step"] for log in state["log_history"] if "loss" in log] == [1, 2]
    results = json.loads((first / "eval_results.json").read_text())
    assert results["train_loss"] == state["log_history"][-1]["train_loss"]  # one run, two records that agree
    assert checkpoints(first) == ["checkpoint-1", "checkpoint-2"]

    resumed = tmp_path / "resumed"
    args = [*small, *steps, "--output_dir", str(resumed), "--resume_from_checkpoint", str(first / "checkpoint-1")]
    assert module.run(args) == 0
    assert checkpoints(resumed) == ["checkpoint-2"]  # only step 2 was trained: from scratch it would save both
    state = json.loads((resumed / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and [log["step"] for log in state["log_history"] if "loss" in log] == [1, 2]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_checkpoint_that_is_not_one_is_refused_before_the_model_is_built(tmp_path, name, capsys, monkeypatch):
    module = importlib.import_module(JOBS[name][0])
    built = []
    monkeypatch.setattr("trl_trapo.trainer.TRAPOTrainer.__init__", lambda *a, **k: built.append(1))
    missing = tmp_path / "checkpoint-7"
    assert module.run(["--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--resume_from_checkpoint={str(missing)!r}: no such directory" in err and not built
