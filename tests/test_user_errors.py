# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Every bad input, through the command line (`python examples/trapo.py ...`) and the API: one message naming the
field, the value and the fix; a non-zero exit (CLI); nothing the user had changed. One section per area.

Shared helpers: `run_cli(args, cwd)` runs the main job as a user would (offline, a short run) and returns
`(returncode, stdout + stderr)`; `snapshot(folder)` records every file's bytes, to check that nothing changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_trapo import TRAPOConfig, TRAPOTrainer


ROOT = Path(__file__).resolve().parent.parent


def run_cli(args: list[str], cwd: Path | None = None, timeout: float = 300) -> tuple[int, str]:
    """`python examples/trapo.py <args>` with this checkout first on the path, offline, `--max_steps 2` unless
    `args` set it; returns `(returncode, stdout + stderr)`."""
    if not any(a == "--max_steps" or a.startswith("--max_steps=") for a in args):
        args = ["--max_steps", "2", *args]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "trapo.py"), *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return completed.returncode, completed.stdout + completed.stderr


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- output dir, disk, saves ----
def finished_run(folder: Path) -> dict[str, bytes]:
    """A folder as a finished run leaves it (a model's config and weights, eval_results.json); its snapshot."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights of the first run")
    (folder / "eval_results.json").write_text('{"eval_accuracy": 0.97}')
    return snapshot(folder)


def test_cli_refuses_to_train_over_a_finished_run(tmp_path):
    """The second run into the same output_dir stops before loading anything, names output_dir, what it found and
    the three fixes, and leaves the first run's files as they were."""
    out = tmp_path / "trapo-output"
    before = finished_run(out)
    code, output = run_cli(["--output_dir", str(out)])
    assert code != 0
    assert f"output_dir={str(out)!r}" in output and "eval_results.json" in output and "model.safetensors" in output
    assert "--overwrite_output_dir" in output and "another output_dir" in output
    assert snapshot(out) == before
    from trl_trapo.cli import parse_args
    from trl_trapo.saving import check_output_dir

    _, args, _ = parse_args(["--output_dir", str(out), "--overwrite_output_dir"])  # the fix parses and is accepted
    assert args.overwrite_output_dir is True
    check_output_dir(args)


def test_api_refuses_a_finished_run_unless_resumed_or_overwritten(tmp_path, tokenizer, suite, tiny_trainer):
    """At construction, before the model is even looked at (a missing model path is not reached); resuming from it
    or `overwrite_output_dir=True` is accepted; a folder of checkpoints only (an interrupted run) is not finished."""
    before = finished_run(tmp_path)
    with pytest.raises(ValueError, match=r"output_dir=.*holds a finished run \(config\.json.*overwrite_output_dir"):
        TRAPOTrainer("no/such/model-folder", args=TRAPOConfig(output_dir=str(tmp_path), report_to="none"))
    assert snapshot(tmp_path) == before
    (tmp_path / "checkpoint-2").mkdir()
    with pytest.raises(ValueError, match=r"resume it \(--resume_from_checkpoint .*checkpoint-2"):
        tiny_trainer(tmp_path, tokenizer, suite)
    tiny_trainer(tmp_path, tokenizer, suite, overwrite_output_dir=True)
    tiny_trainer(tmp_path, tokenizer, suite, resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    interrupted = tmp_path / "interrupted"
    (interrupted / "checkpoint-2").mkdir(parents=True)
    tiny_trainer(interrupted, tokenizer, suite)


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_output_dir_that_cannot_be_written_is_refused_first(tmp_path, where):
    """A file, or a path under a file, fails at once with a ValueError naming output_dir (CLI: before any model
    loads; API: before the model argument is looked at), and the file is left alone."""
    blocker = tmp_path / "results.txt"
    blocker.write_text("the user's notes")
    out = blocker if where == "file" else blocker / "run"
    problem = "is a file, not a folder" if where == "file" else f"cannot be created: it is under {blocker}, which is"
    with pytest.raises(ValueError, match=rf"TRAPOConfig\.output_dir={str(out)!r} {problem}"):
        TRAPOTrainer("no/such/model-folder", args=TRAPOConfig(output_dir=str(out), report_to="none"))
    code, output = run_cli(["--output_dir", str(out)])
    assert code != 0 and output.splitlines()[-1].startswith(
        f"ValueError: TRAPOConfig.output_dir={str(out)!r} {problem}"
    )
    assert blocker.read_text() == "the user's notes"


def test_max_steps_zero_is_refused(tmp_path):
    """`max_steps=0` trained one step; it is refused with the fix (-1 = epochs, evaluate() to only evaluate)."""
    with pytest.raises(ValueError, match=r"TRAPOConfig\.max_steps=0 is invalid: .*-1.*num_train_epochs.*evaluate"):
        TRAPOConfig(output_dir=str(tmp_path), max_steps=0, report_to="none")
    code, output = run_cli(["--max_steps", "0", "--output_dir", str(tmp_path / "out")])
    assert code != 0 and "max_steps=0 is invalid" in output
    assert not (tmp_path / "out").exists()


def test_push_to_hub_offline_is_refused_at_construction(tmp_path):
    """With HF_HUB_OFFLINE=1 (set by the test suite and the helper), `push_to_hub` cannot succeed: refused in the
    config, naming push_to_hub, the variable and the fixes."""
    with pytest.raises(ValueError, match=r"push_to_hub=True is invalid: HF_HUB_OFFLINE=1 .*Hugging Face Hub"):
        TRAPOConfig(output_dir=str(tmp_path), push_to_hub=True, report_to="none")
    code, output = run_cli(["--push_to_hub", "--output_dir", str(tmp_path / "out")])
    assert code != 0 and "push_to_hub=True is invalid: HF_HUB_OFFLINE=1" in output


def test_a_disk_too_small_for_one_checkpoint_is_refused(tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, caplog):
    """With checkpoints on, fewer free bytes than one checkpoint's weights + AdamW state is an error naming
    output_dir, needed and free bytes and the fix; with checkpoints off it is only a warning."""
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000))
    with pytest.raises(ValueError, match=r"output_dir=.* has 1,000 bytes free.*needs at least [\d,]+ bytes.*Free"):
        tiny_trainer(tmp_path / "a", tokenizer, suite, save_strategy="steps", save_steps=1)
    with caplog.at_level("WARNING", logger="trl_trapo.saving"):
        tiny_trainer(tmp_path / "b", tokenizer, suite, save_strategy="no")
    assert "a final save_model may not fit" in caplog.text
