# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Every script under `scripts/` and `examples/` starts the way its docstring says (`python PATH --help`): its imports
resolve from where it lives (helper modules without a `__main__` block: they import) (a benchmark moved to `scripts/benchmarks/` once failed with `ModuleNotFoundError:
fetch_smollm2`, unnoticed because nothing ran it) and its command line parses.

All scripts run in one child interpreter, each as `__main__` with `sys.path` and `sys.modules` reset to what a fresh
`python PATH` has, so one script's imports cannot hide another's missing path. `benchmark_tools.py` also runs for real,
with tiny arguments (the other benchmarks' runs live in their own test files, e.g. `tests/test_benchmark_trainers.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("scripts/**/*.py"), *ROOT.glob("examples/*.py")])


def child_failures(code: str, *args: str) -> dict:
    """Run `code` in a fresh interpreter (`python -c code ROOT *args`) and return the failures dict it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


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


@pytest.mark.slow
def test_every_script_starts_and_parses_help():
    assert len(SCRIPTS) >= 15, SCRIPTS
    paths = [str(p) for p in SCRIPTS]
    failures = child_failures(RUNNER, json.dumps(paths))
    assert failures == {}, failures


@pytest.mark.slow
def test_benchmark_tools_times_rounds_with_an_instant_and_a_slow_tool(tmp_path):
    """`scripts/benchmarks/benchmark_tools.py` with tiny arguments: 2 rollouts, 1 round of calls, a 0.05 s tool."""
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


# ---- every numeric argument states its range (trial 14's C09) -------------------------------------------------------
COMMAND_LINES = sorted(
    p
    for p in [*ROOT.glob("scripts/benchmarks/*.py"), *ROOT.glob("scripts/experiments/*.py")]
    if p.name != "runlib.py" and "ArgumentParser(" in p.read_text(encoding="utf-8")
)

# (script, argv, flag): values each valid alone, refused together by the script's `parser.error` after parsing, before
# anything slow
TOGETHER = [
    ("benchmarks/benchmark_distributed.py", ["--steps", "4", "--warmup", "4"], "--warmup"),
    ("benchmarks/benchmark_is_modes.py", ["--clip_max", "0.5"], "--clip_max"),
    ("benchmarks/benchmark_ppo.py", ["--accumulation", "3", "--mini-batches", "2"], "--mini-batches"),
    ("benchmarks/benchmark_replay.py", ["--capacity", "10", "--rl_rows", "38"], "--capacity"),
    ("benchmarks/benchmark_tools.py", ["--rollouts", "3"], "--rollouts"),
    ("benchmarks/benchmark_trainers.py", ["--batch_size", "6", "--num_generations", "4"], "--num_generations"),
    ("benchmarks/benchmark_weighting.py", ["--steps", "5", "--warmup", "4"], "--warmup"),
    ("experiments/agents_real.py", ["--quick", "--micro_batch", "3"], "--micro_batch"),
    ("experiments/compare_real.py", ["--eval_rows", "4", "--curve_rows", "5"], "--curve_rows"),
]

RANGES = r"""
import contextlib, inspect, io, json, math, os, runpy, sys
root, paths, together = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
base_path, base_modules = list(sys.path[1:]), set(sys.modules)


def load(path):
    # a fresh import, as `python PATH` sees it (the --help runner's reset)
    sys.path[:] = [os.path.dirname(path)] + base_path
    for name in [m for m in sys.modules if m not in base_modules]:
        module_file = getattr(sys.modules[name], "__file__", None) or ""
        if module_file.startswith(os.path.join(root, "scripts")):
            del sys.modules[name]
    return runpy.run_path(path, run_name="imported")


def refusal(call):
    # (exit status, stderr) of a call that should end in argparse's error
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            call()
    except SystemExit as exit_:
        return exit_.code, err.getvalue()
    except BaseException as error:
        return f"{type(error).__name__}: {error}"[:300], err.getvalue()
    return "no error", err.getvalue()


def outside(kind):
    # a value just outside a range type's range (None: the range has no bound)
    low, high = kind.minimum, kind.maximum
    if low is not None:
        return str(low if kind.minimum_open else low - 1)
    if high is not None:
        return str(high if kind.maximum_open else high + 1)
    return "inf" if kind.kind is float else None


report = {}
for path in paths:
    name = os.path.relpath(path, os.path.join(root, "scripts"))
    problems = report.setdefault(name, [])
    try:
        namespace = load(path)
    except BaseException as error:
        problems.append(f"import: {type(error).__name__}: {error}")
        continue
    if "make_parser" not in namespace:
        problems.append("no make_parser(): its command line cannot be checked without running the script")
        continue
    parser = namespace["make_parser"]()
    for action in parser._actions:  # argparse has no public list of a parser's arguments
        if not action.option_strings:
            continue
        flag, kind = action.option_strings[0], action.type
        if kind in (int, float):
            problems.append(f"{flag}: type={kind.__name__} states no range (use a runlib range type)")
            continue
        if not hasattr(kind, "contains"):  # not a number (a string, a path, a choice, a flag)
            continue
        defaults = action.default if isinstance(action.default, list) else [action.default]
        bad_defaults = [d for d in defaults if d is not None and not kind.contains(d)]
        if bad_defaults:
            problems.append(f"{flag}: the default {bad_defaults} lies outside {kind.describe()}")
        bad = outside(kind)
        if bad is None:
            problems.append(f"{flag}: {kind.describe()} has no bound")
            continue
        code, err = refusal(lambda: parser.parse_known_args([flag, bad]))
        if code != 2 or f"error: argument {flag}: " not in err or "usage:" not in err:
            problems.append(f"{flag} {bad}: exit {code!r}, stderr {err.strip()[-300:]!r}")
for script, argv, flag in together:
    path = os.path.join(root, "scripts", script)
    problems = report.setdefault(script, [])
    namespace = load(path)
    if "make_parser" not in namespace:  # reported above; its main would run the benchmark
        continue
    main = namespace["main"]
    sys.argv = [path, *argv]
    code, err = refusal(lambda: main(argv) if inspect.signature(main).parameters else main())
    if code != 2 or f"error: argument {flag}: " not in err:
        problems.append(f"{' '.join(argv)}: exit {code!r}, stderr {err.strip()[-300:]!r}")
print(json.dumps({name: problems for name, problems in report.items() if problems}))
"""


@pytest.mark.slow
def test_every_numeric_argument_refuses_a_value_outside_its_range():
    """Each script's parser (`make_parser()`, imported, nothing run): every numeric option has a range type
    (`runlib.NumberRange`), its default lies inside, and a value just outside is argparse's usage error (exit 2,
    `error: argument --flag: ...`); values valid alone but not together (`TOGETHER`) are refused by the script's
    `main` the same way before anything slow. `benchmark_step.py --steps 0` once ran the baseline for 6.5 s, then
    ended in a traceback naming `TRAPOConfig.max_steps`; `--rows -3` in torch's negative-dimension error."""
    assert len(COMMAND_LINES) >= 25, COMMAND_LINES
    failures = child_failures(RANGES, json.dumps([str(p) for p in COMMAND_LINES]), json.dumps(TOGETHER))
    assert failures == {}, json.dumps(failures, indent=1)
