"""Every bad input, through the command line (`examples/trapo.py`) and through the API, gets one clean message that
names the field, the bad value and the fix; the command line exits non-zero without a Python traceback; nothing the
user had (files, folders, the config object) is changed.

Helpers shared by every section:
- `cli_env(env)`: the environment of a command-line run (offline, this repository first on `PYTHONPATH`);
- `run_cli(*args, cwd=...)`: `python examples/trapo.py ARGS` in a subprocess, with a short `--max_steps` and an
  `--output_dir` under `cwd` unless the arguments give them; returns `(returncode, stdout + stderr)`.

Sections, one per area: `# ---- <area> ----`.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trl_trapo import cli
from trl_trapo.checkpoint import verify_checkpoint
from trl_trapo.interrupts import Interruption, TrainingInterrupted


ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "trapo.py"


def cli_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a command-line run: offline, quiet, this repository first on `PYTHONPATH`, then `env`."""
    environment = dict(os.environ)
    environment.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TRANSFORMERS_VERBOSITY="error",
        OMP_NUM_THREADS="1",
    )
    environment.update(env or {})
    return environment


def cli_args(args: tuple[str, ...], cwd: Path) -> list[str]:
    """`args` plus `--max_steps 2` and `--output_dir <cwd>/out` unless they set them."""
    argv = list(args)
    names = {a.split("=", 1)[0] for a in argv}
    if "--max_steps" not in names and "--config" not in names:
        argv += ["--max_steps", "2"]
    if "--output_dir" not in names:
        argv += ["--output_dir", str(cwd / "out")]
    return argv


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run the main job as a user would, `python examples/trapo.py ARGS`, in a subprocess.

    Returns:
        `(returncode, output)`: the exit status and stdout followed by stderr.
    """
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), *cli_args(args, cwd)],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return completed.returncode, completed.stdout + completed.stderr


# ---- interrupts and launches ----
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_interrupted_during_training_saves_says_how_to_resume_and_exits(tmp_path, sig):
    """Ctrl-C / a preemption mid-run: a complete checkpoint, one line naming it and the resume flag, exit 130 / 143,
    no traceback, no final model or results (the run is not finished)."""
    out = tmp_path / "out"
    args = cli_args(
        ("--max_steps", "300", "--save_strategy", "steps", "--save_steps", "2", "--output_dir", str(out)), tmp_path
    )
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal, even if pytest's is not
    )
    first = out / "checkpoint-2" / "trapo" / "rank0.complete.json"
    deadline = time.monotonic() + 240
    try:
        while not first.exists():  # training has started
            assert process.poll() is None, f"the run ended early:\n{process.stdout.read()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint-2 in time"
            time.sleep(0.02)
        process.send_signal(sig)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + sig, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "Interrupted by" in line]
    assert len(lines) == 1, output[-3000:]
    found = re.search(
        rf"Interrupted by {sig.name} at step (\d+): saved the complete checkpoint (\S+)\. Resume with the same command "
        r"plus `--resume_from_checkpoint (\S+)`",
        lines[0],
    )
    assert found, lines[0]
    step = int(found[1])
    assert 2 < step < 300 and found[2] == found[3] == str(out / f"checkpoint-{step}")
    verify_checkpoint(found[2], 1)
    assert not (out / "eval_results.json").exists() and not (out / "model.safetensors").exists()


def test_ctrl_c_outside_training_is_one_line_and_exit_130(capsys):
    with pytest.raises(SystemExit) as exit_:
        with cli.exits_cleanly():
            raise KeyboardInterrupt
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip() == (
        "Interrupted by SIGINT outside the training steps (only those stop at a checkpoint): nothing more was saved."
    )
    with pytest.raises(SystemExit) as exit_:
        with cli.exits_cleanly():
            raise TrainingInterrupted(Interruption(signal.SIGTERM, 5, "/runs/out/checkpoint-5"))
    assert exit_.value.code == 143
    assert capsys.readouterr().out.strip().startswith("Interrupted by SIGTERM at step 5")


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="with several GPUs accelerate launches several processes")
def test_accelerate_launch_of_two_processes_that_starts_one_is_refused(tmp_path):
    """`accelerate launch --num_processes 2` without `--multi_gpu` runs one process on a machine without GPUs: refused
    before anything is loaded, saying what to pass."""
    out = tmp_path / "out"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.accelerate_cli",
            "launch",
            "--num_processes",
            "2",
            "--main_process_port",
            str(free_port()),
            str(SCRIPT),
            "--max_steps",
            "2",
            "--output_dir",
            str(out),
        ],  # fmt: skip
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output[-3000:]
    message = "`accelerate launch` was asked for --num_processes 2 but started this process alone"
    assert output.count(message) == 1, output[-3000:]
    assert "Pass `--multi_gpu`, e.g. `accelerate launch --multi_gpu --num_processes 2 examples/trapo.py ...`" in output
    assert not out.exists()  # refused before anything was built or written


class FakeLauncher:
    """Stands for `psutil.Process(parent)`: the launcher's environment and command line."""

    def __init__(self, environ: dict | None, cmdline: list[str]):
        self._environ, self._cmdline = environ, cmdline

    def __call__(self, pid):
        return self

    def environ(self):
        if self._environ is None:
            import psutil

            raise psutil.AccessDenied()
        return self._environ

    def cmdline(self):
        return self._cmdline


LAUNCHER_ARGV = ["python", "accelerate", "launch", "--num_processes=4", "examples/trapo.py"]


@pytest.mark.parametrize(
    ("launcher_env", "child_env", "outcome"),
    [
        ({}, {}, "error"),  # the launcher set MASTER_ADDR (asked for 4) and started one process
        ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, {}, "ok"),  # the user's own MASTER_ADDR, one process
        ({}, {"WORLD_SIZE": "4", "RANK": "0"}, "ok"),  # torchrun / --multi_gpu: really distributed
        (None, {}, "warning"),  # the launcher's environment cannot be read: say it, do not refuse
    ],
    ids=["lost-processes", "inherited-master-addr", "torchrun", "unreadable"],
)
def test_processes_started_check(monkeypatch, caplog, launcher_env, child_env, outcome):
    import psutil

    from trl_trapo.distributed import check_processes_started

    for name in ("WORLD_SIZE", "RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    env = {"ACCELERATE_DYNAMO_BACKEND": "NO", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", **child_env}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(psutil, "Process", FakeLauncher(launcher_env, LAUNCHER_ARGV))
    if outcome == "error":
        with pytest.raises(ValueError, match=r"asked for --num_processes 4 but started this process alone") as error:
            check_processes_started()
        assert "accelerate launch --multi_gpu --num_processes 4 examples/trapo.py" in str(error.value)
    else:
        check_processes_started()
        assert ("started this process alone" in caplog.text) == (outcome == "warning")
