# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Every script under `scripts/` and `examples/` starts the way its docstring says (`python PATH --help`): its imports
resolve from where it lives (helper modules without a `__main__` block: they import) (a benchmark moved to `scripts/benchmarks/` once failed with `ModuleNotFoundError:
fetch_smollm2`, unnoticed because nothing ran it) and its command line parses.

All scripts run in one child interpreter, each as `__main__` with `sys.path` and `sys.modules` reset to what a fresh
`python PATH` has, so one script's imports cannot hide another's missing path. `benchmark_tools.py` also runs for real,
with tiny arguments (the other benchmarks' runs live in their own test files, e.g. `tests/test_benchmark_trainers.py`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("scripts/**/*.py"), *ROOT.glob("examples/*.py")])

RUNNER = r"""
import io, json, os, runpy, sys, contextlib
root, paths = sys.argv[1], json.loads(sys.argv[2])
base_path, base_modules = list(sys.path[1:]), set(sys.modules)
failures = {}
for path in paths:
    sys.path[:] = [os.path.dirname(path)] + base_path  # what `python PATH` puts first
    for name in [m for m in sys.modules if m not in base_modules]:
        module_file = getattr(sys.modules[name], "__file__", None) or ""
        if module_file.startswith(os.path.join(root, "scripts")) or module_file.startswith(os.path.join(root, "examples")):
            del sys.modules[name]
    sys.argv = [path, "--help"]
    out = io.StringIO()
    if "__main__" not in open(path, encoding="utf-8").read():  # a helper module of other scripts: it must import
        try:
            runpy.run_path(path, run_name="imported")
        except BaseException as error:
            failures[path] = f"{type(error).__name__}: {error}"
        continue
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        failures[path] = "no SystemExit: --help did not print a usage and exit"
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            failures[path] = f"exit {exit_.code}"
        elif "usage" not in out.getvalue().lower():
            failures[path] = "no usage printed"
    except BaseException as error:
        failures[path] = f"{type(error).__name__}: {error}"
print(json.dumps(failures))
"""


def test_every_script_starts_and_parses_help():
    assert len(SCRIPTS) >= 15, SCRIPTS
    paths = [str(p) for p in SCRIPTS]
    import json

    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(ROOT), json.dumps(paths)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert failures == {}, failures


def test_benchmark_tools_times_rounds_with_an_instant_and_a_slow_tool(tmp_path):
    """`scripts/benchmarks/benchmark_tools.py` with tiny arguments: 2 rollouts, 1 round of calls, a 0.05 s tool."""
    import json

    out = tmp_path / "tools.json"
    script = ROOT / "scripts" / "benchmarks" / "benchmark_tools.py"
    args = ["--rollouts", "2", "--calls", "1", "--delay", "0.05", "--repeats", "1", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "instant-tool round s" in done.stdout and "serial bound s" in done.stdout
    results = json.loads(out.read_text())
    assert results["serial_bound_s"] == 2 * 0.05 * 1
    for kind in ("sync", "async"):
        figures = results[kind]
        assert figures["instant_round_s"] > 0
        assert figures["slow_round_s"] >= 0.05  # the round waits for its slow call at least once
        assert figures["difference_per_turn_s"] == figures["slow_round_s"] - figures["instant_round_s"]
