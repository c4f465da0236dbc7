"""Every bad input, through the command line (`examples/trapo.py`) and through the API, gets one clean message that
names the field, the bad value and the fix; the command line exits non-zero without a Python traceback; nothing the
user had (files, folders, the config object) is changed.

Helpers shared by every section:
- `run_cli(*args, cwd=...)`: `python examples/trapo.py ARGS` in a subprocess, offline, with a short `--max_steps` and an
  `--output_dir` under `cwd` unless the arguments give them; returns `(returncode, stdout + stderr)`;
- `cli_error(returncode, output, *needles)`: asserts a non-zero exit, no traceback, exactly one `error:` line, and
  every needle in the message; returns the message;
- `api_error(call, *needles, error=ValueError)`: asserts `call()` raises `error` whose message holds every needle;
  returns the message;
- `snapshot(path)`: every file under `path` (or the file itself) -> its bytes' SHA-256, to compare before and after.

Sections, one per area: `# ---- <area> ----`. Command-line cases should fail before any model is loaded, so each
costs an interpreter start (a few seconds) and no training.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "trapo.py"


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run the main job as a user would, `python examples/trapo.py ARGS`, in a subprocess.

    Args:
        *args: the command-line arguments. Unless they set them: `--max_steps 2` (a run the error failed to stop
            stays short) and `--output_dir <cwd>/out`.
        cwd: the working directory (a test's `tmp_path`).
        env: extra environment variables (e.g. `{"TRAPO_DEBUG": "1"}`); the run is offline and `TRAPO_DEBUG` is unset
            unless given here; this repository comes first on `PYTHONPATH`.
        timeout: seconds before the run is killed (the test then fails).

    Returns:
        `(returncode, output)`: the exit status and stdout followed by stderr.
    """
    argv = list(args)
    names = {a.split("=", 1)[0] for a in argv}
    if "--max_steps" not in names and "--config" not in names:
        argv += ["--max_steps", "2"]
    if "--output_dir" not in names:
        argv += ["--output_dir", str(cwd / "out")]
    environment = {k: v for k, v in os.environ.items() if k != "TRAPO_DEBUG"}
    environment.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    environment.update(env or {})
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return completed.returncode, completed.stdout + completed.stderr


def cli_error(returncode: int, output: str, *needles: str) -> str:
    """The one error message of a command-line run that should have failed cleanly.

    Args:
        returncode: the run's exit status (must be non-zero).
        output: its stdout + stderr (must hold no traceback and exactly one line with `error:`).
        *needles: strings the message must contain (the field, the bad value, words of the fix).

    Returns:
        The message: the `error:` line and the lines after it.
    """
    assert returncode != 0, f"the run succeeded (exit 0):\n{output[-3000:]}"
    assert "Traceback" not in output, f"a traceback is shown:\n{output[-3000:]}"
    lines = output.splitlines()
    errors = [i for i, line in enumerate(lines) if "error:" in line]
    assert len(errors) == 1, f"expected one `error:` line, got {len(errors)}:\n{output[-3000:]}"
    message = "\n".join(lines[errors[0] :])
    for needle in needles:
        assert needle in message, f"{needle!r} not in the message:\n{message}"
    return message


def api_error(call: Callable[[], object], *needles: str, error: type[BaseException] = ValueError) -> str:
    """The message of the error `call()` must raise.

    Args:
        call: what to run, e.g. `lambda: TRAPOConfig(output_dir=..., max_steps=0)`.
        *needles: strings the message must contain (the field, the bad value, words of the fix).
        error: the exception type expected.

    Returns:
        The message.
    """
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in the message: {message}"
    return message


def snapshot(path: Path) -> dict[str, str]:
    """Every file under `path` (or `path` itself, if a file) -> the SHA-256 of its bytes; `{}` if nothing is there.

    Args:
        path: a file or folder the user had before the run.

    Returns:
        Relative path (`"."` for a file) -> hex digest.
    """
    path = Path(path)
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    if not path.is_dir():
        return {}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


# ---- command line ----
