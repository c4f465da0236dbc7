# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What every experiment and benchmark script shares: child processes, the machine's record, command-line range types,
atomic results files and paired statistics.

Scripts import it as they import `result_blocks` (`scripts/experiments` on `sys.path`; the benchmarks add it):

- **child processes**: `child_env` (the environment of a run: its torch threads, offline Hub, this checkout first on
  `PYTHONPATH`) and `go_offline` (the same defaults for this process), `run_child` (one subprocess in its own session,
  its log, a timeout that kills what it started, the child's own peak RSS and CPU time from `os.wait4`),
  `launch_worker` (the `script --_worker spec.json` pattern on top of it), `run_cached` (a run skipped when its folder
  holds a result of the same key), `map_jobs` (`--jobs` runs at a time, at most one per core; Ctrl-C kills every
  child: `kill_children`) and `peak_rss_mb` (this process's);
- **the machine**: `machine_info` (CPU model and vector units, cores, Python and library versions, git commit and
  whether the code differs from it, date), `machine_line`, `versions`, `versions_line`, `run_conditions` (jobs,
  threads, load before and after), `cpu_model`, `git`;
- **command lines**: the argparse types every numeric argument takes (`NumberRange`: `positive_int`,
  `non_negative_int`, `seed_int`, `positive_float`, `non_negative_float`, `fraction`, `int_range`, `float_range`), so
  a value out of range is argparse's usage error (exit 2) before anything slow, `config_refusals_as_usage` (a
  `TRAPOConfig` refusal as a usage error naming the script's flag, no traceback) and `check_job_arguments` (the
  arguments a script passes through to a job, checked by the job's own parser before any run: a misspelt option
  named with the closest of the script's and the job's);
- **files**: `write_json_atomic` (through the library's `atomic_write_bytes`: a reader never sees half a file),
  `read_json`;
- **statistics**: `t_quantile`, `paired_interval` (the mean of paired differences with a Student t or a normal
  interval) and `describe` (mean, standard deviation, range over seeds).

It imports nothing heavy at module level: rendering a results page's block from a results file needs no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar


ROOT = Path(__file__).resolve().parents[2]  # the repository
logger = logging.getLogger("runlib")

T = TypeVar("T")
R = TypeVar("R")


# =====================================================================================================================
# Child processes
# =====================================================================================================================
# the Hugging Face Hub and datasets offline, unless the user's environment says otherwise (the runs build or read their
# models and data locally)
OFFLINE_DEFAULTS = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def go_offline() -> None:
    """Put this process offline as `child_env` puts a child: `OFFLINE_DEFAULTS` where the environment does not set
    them, and `HF_HUB_DISABLE_TELEMETRY=1` unless set. Call it before anything imports `huggingface_hub`."""
    for key, value in {**OFFLINE_DEFAULTS, "HF_HUB_DISABLE_TELEMETRY": "1"}.items():
        os.environ.setdefault(key, value)


def child_env(
    threads: int | None, extra: Mapping[str, str | None] | None = None, *, drop: Iterable[str] = ()
) -> dict[str, str]:
    """The environment of a run's child process: this process's, with

    - `OMP_NUM_THREADS` and `MKL_NUM_THREADS` (`trl_trapo.threads.THREAD_VARIABLES`, what torch reads) set to
      `threads` (left as they are when `threads` is None);
    - the Hugging Face Hub and datasets offline (`HF_HUB_OFFLINE`, `HF_DATASETS_OFFLINE`: "1" unless this process sets
      them, so `HF_HUB_OFFLINE=0` lets a child download) and no telemetry (`HF_HUB_DISABLE_TELEMETRY=1`);
    - `TOKENIZERS_PARALLELISM=false` (the tokenizers' own threads would compete with torch's) and
      `TRANSFORMERS_VERBOSITY` "error" unless set (the run's log keeps its own messages);
    - this checkout first on `PYTHONPATH`, so the child runs this checkout's `trl_trapo` (not another installed one).

    Args:
        threads: torch intra-op threads of the child (>= 1), or None to leave the thread variables alone.
        extra: variables set last (they win); a value of None removes the variable.
        drop: variables removed from this process's environment before anything is set (e.g. the thread and
            OpenMP wait variables a thread benchmark varies itself).

    Returns:
        A new dict; `os.environ` is not changed.

    Raises:
        ValueError: if `threads` is below 1.
    """
    from trl_trapo.threads import THREAD_VARIABLES

    if threads is not None and threads < 1:
        raise ValueError(f"child_env: threads={threads} must be >= 1 (or None to leave the thread variables alone).")
    dropped = set(drop)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    if threads is not None:
        env.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    for key, value in OFFLINE_DEFAULTS.items():
        env.setdefault(key, value)
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.update(HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass(frozen=True)
class ChildRun:
    """What `run_child` measured of one child process.

    Attributes:
        name: the run's name (for messages).
        returncode: the exit status (negative: killed by that signal; `-9` after a timeout).
        timed_out: whether `timeout_s` ran out and the child's process group was killed.
        wall_s: seconds from the start to the child's exit.
        cpu_s: user + system CPU seconds of the child and of the children it waited for (`os.wait4`'s rusage).
        peak_rss_mb: the child's peak resident memory (MB; its largest waited-for descendant's if larger), from
            `os.wait4` — the child's own, not this process's.
        loadavg_start: the 1/5/15-minute load average when the child started.
        loadavg_end: the same when it ended.
        log_path: the file that holds the child's stdout and stderr.
    """

    name: str
    returncode: int
    timed_out: bool
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    loadavg_start: tuple[float, float, float]
    loadavg_end: tuple[float, float, float]
    log_path: str


class ChildFailed(RuntimeError):
    """A child process exited with a nonzero status or ran out of time; the message ends with its log's tail."""

    def __init__(self, run: ChildRun, tail: str):
        why = "ran out of time" if run.timed_out else f"exit code {run.returncode}"
        super().__init__(f"{run.name} failed ({why}); {run.log_path} ends with:\n{tail}")
        self.run = run


# the process groups of the children `run_child` is waiting for: each child has its own session (so that a timeout
# kills what it started too), so the terminal's Ctrl-C no longer reaches it; `kill_children` does
_live_groups: set[int] = set()
_live_lock = threading.Lock()


def kill_children() -> None:
    """SIGKILL the process group of every child `run_child` is waiting for (what Ctrl-C in the parent must do: the
    children run in their own sessions and do not get the terminal's SIGINT). Their `run_child` calls then return
    (or raise `ChildFailed`)."""
    with _live_lock:
        groups = list(_live_groups)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _rss_mb(maxrss: int) -> float:
    """`ru_maxrss` in MB: Linux reports KiB, macOS bytes."""
    return maxrss / (1024 * 1024) if sys.platform == "darwin" else maxrss / 1024


def peak_rss_mb() -> float:
    """Peak resident memory of this process (MB; `resource.getrusage(RUSAGE_SELF).ru_maxrss`)."""
    return _rss_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def run_child(
    argv: Sequence[str],
    *,
    log_path: str | Path,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    cwd: str | Path = ROOT,
    timeout_s: float | None = None,
    on_line: Callable[[str], bool] | None = None,
    check: bool = True,
    tail_chars: int = 3000,
) -> ChildRun:
    """Run `argv` as one child process (its own process group), its stdout and stderr into `log_path`.

    Args:
        argv: the command (`[sys.executable, script, ...]`).
        log_path: the log file (overwritten; its folder is created).
        env: the child's environment (`child_env(...)`; default this process's).
        name: the run's name in messages (default the log file's name).
        cwd: the child's working directory (default the repository).
        timeout_s: wall seconds after which the child's whole process group is killed (SIGKILL); None: no limit.
        on_line: called with each stdout line (without its newline); a line for which it returns True is consumed,
            any other goes to the log. None: stdout goes straight to the log.
        check: raise `ChildFailed` (with the log's last `tail_chars` characters) when the child fails or times out.

    Returns:
        The `ChildRun`: exit status, wall and CPU time, the child's peak RSS (from `os.wait4`, so several children run
        from threads each get their own), load averages.

    Raises:
        ChildFailed: with `check`, on a nonzero exit status or a timeout.
        OSError: if the command cannot be started.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    name = name or log_path.stem
    loadavg_start = os.getloadavg()
    started = time.perf_counter()
    killed = threading.Event()
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE if on_line else log,
            stderr=log if on_line else subprocess.STDOUT,
            text=True,
            env=dict(env) if env is not None else None,
            cwd=str(cwd),
            start_new_session=True,  # its own process group: a timeout kills what it started too
        )
        with _live_lock:
            _live_groups.add(process.pid)

        def kill() -> None:
            killed.set()
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout_s, kill) if timeout_s is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            if on_line is not None:
                for line in process.stdout:
                    if not on_line(line.rstrip("\n")):
                        log.write(line)
                        log.flush()
            # reap it here (not with process.wait()) to read the child's own resource usage
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:  # Ctrl-C (KeyboardInterrupt) in this thread: the child must not outlive it
            kill()
            os.waitpid(process.pid, 0)
            process.returncode = -signal.SIGKILL
            raise
        finally:
            with _live_lock:
                _live_groups.discard(process.pid)
            if timer is not None:
                timer.cancel()
            if process.stdout is not None:
                process.stdout.close()
    process.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for a reaped child
    run = ChildRun(
        name=name,
        returncode=process.returncode,
        timed_out=killed.is_set(),
        wall_s=time.perf_counter() - started,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_mb=_rss_mb(usage.ru_maxrss),
        loadavg_start=loadavg_start,
        loadavg_end=os.getloadavg(),
        log_path=str(log_path),
    )
    if check and (run.returncode != 0 or run.timed_out):
        raise ChildFailed(run, log_path.read_text(encoding="utf-8", errors="replace")[-tail_chars:])
    return run


def launch_worker(
    script: str | Path,
    spec: Any,
    spec_path: str | Path,
    *,
    threads: int | None,
    log_path: str | Path,
    name: str | None = None,
    extra_env: Mapping[str, str | None] | None = None,
    worker_args: Sequence[str] = (),
    **kwargs: Any,
) -> ChildRun:
    """Write `spec` to `spec_path` (atomically) and run `python script --_worker spec_path [worker_args]` in a child
    with `child_env(threads, extra_env)`: the scripts' one-process-per-run pattern.

    Args:
        script: the script whose `--_worker` mode runs the spec.
        spec: the run's JSON-serialisable description, read by the worker.
        spec_path: where it is written.
        threads: the child's torch threads (`child_env`).
        log_path, name, **kwargs: as `run_child` (`timeout_s`, `on_line`, `cwd`, `check`, `tail_chars`).
        extra_env: as `child_env`'s `extra`.
        worker_args: arguments after the spec path.

    Returns:
        `run_child`'s `ChildRun`.
    """
    write_json_atomic(spec_path, spec)
    argv = [sys.executable, str(Path(script).resolve()), "--_worker", str(spec_path), *worker_args]
    return run_child(argv, log_path=log_path, env=child_env(threads, extra_env), name=name, **kwargs)


def keyed_result(run_dir: str | Path, key: str) -> dict | None:
    """`<run_dir>/result.json` when it holds `"key": key` (made by the same code and settings), else None."""
    result = read_json(Path(run_dir) / "result.json")
    return result if result is not None and result.get("key") == key else None


def run_cached(
    spec: dict,
    worker: Callable[[dict], dict],
    script: str | Path,
    *,
    in_process: bool,
    name: str,
    log: logging.Logger = logger,
) -> dict:
    """Run one spec unless its run folder already holds a result of the same key; the result.

    Args:
        spec: `run_dir` (where the worker writes `result.json`), `key` (what decides the numbers: a result with
            another key is run again), `rerun` (run even when a result of the key exists) and `threads` (the
            child's torch threads), plus whatever `worker` reads.
        worker: the script's `worker(spec) -> result`, which writes `<run_dir>/result.json`.
        script: the script whose `--_worker <spec.json>` mode calls `worker` (for a child process).
        in_process: call `worker` in this process instead of a child.
        name: the run in log messages.
        log: the logger of those messages (the script's).

    Raises:
        ChildFailed: if the child process fails (with the end of its log, `<run_dir>/log.txt`).
    """
    cached = None if spec["rerun"] else keyed_result(spec["run_dir"], spec["key"])
    if cached is not None:
        log.info("%s: reused %s", name, Path(spec["run_dir"]) / "result.json")
        return cached
    log.info("%s: running", name)
    started = time.perf_counter()
    if in_process:
        result = worker(spec)
    else:
        run_dir = Path(spec["run_dir"])
        launch_worker(
            script, spec, run_dir / "spec.json", threads=spec["threads"], log_path=run_dir / "log.txt", name=name
        )
        result = read_json(run_dir / "result.json")
    log.info("%s: done in %.0f s", name, time.perf_counter() - started)
    return result


def usable_cores() -> int:
    """The physical cores this process may run on (`trl_trapo.threads.usable_cores`)."""
    from trl_trapo.threads import usable_cores as cores

    return cores()


def map_jobs(function: Callable[[T], R], items: Iterable[T], jobs: int) -> list[R]:
    """`function` over `items`, `jobs` at a time (threads of this process, each usually waiting for a child), at most
    one per usable core; results in the items' order.

    With `jobs <= 1` the items run one after the other in this thread (`function` may then run a task in this
    process). The first exception is raised once the running calls have finished; a KeyboardInterrupt (Ctrl-C, or
    raised by a call) first kills the children of the other calls (`kill_children`), whose sessions do not get the
    terminal's SIGINT.
    """
    items = list(items)
    if jobs <= 1 or len(items) <= 1:
        return [function(item) for item in items]
    cores = usable_cores()
    if jobs > cores:
        logger.warning("--jobs %d > %d usable cores: running %d at a time (one run per core).", jobs, cores, cores)
    with ThreadPoolExecutor(max_workers=min(jobs, cores, len(items))) as pool:
        try:
            return list(pool.map(function, items))
        except KeyboardInterrupt:
            kill_children()
            raise


# =====================================================================================================================
# The machine
# =====================================================================================================================
def cpuinfo(field: str) -> str | None:
    """The first `field` line of `/proc/cpuinfo` (None where there is no such file or line)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name from `/proc/cpuinfo` (`platform.processor()` or `platform.machine()` where there is none)."""
    return cpuinfo("model name") or platform.processor() or platform.machine() or "unknown"


def simd_flags() -> list[str]:
    """The vector instruction sets the CPU reports that change how fp32 sums are rounded (AVX2, AVX-512, AMX)."""
    flags = set((cpuinfo("flags") or "").split())
    return [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]


def git(*args: str) -> str | None:
    """Output of `git <args>` in this checkout (stripped), or None when git or the repository is missing."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine_line() -> str:
    """The processor and core count in words: `'<CPU model>, <n> cores'`."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def machine_info(code_paths: Sequence[str] = ("trl_trapo", "examples")) -> dict[str, Any]:
    """What a measurement depends on besides its seed: processor, cores, library versions, code version, date.

    Args:
        code_paths: the folders whose uncommitted changes set `code_differs_from_commit`.

    Returns:
        `cpu_model`, `cpu_simd` (`simd_flags`), `cpu_count`, `python`, `torch`, `transformers`, `trl`, `accelerate`
        (versions), `git_commit` (full hash, None outside a checkout), `code_differs_from_commit` (whether
        `code_paths` have uncommitted changes; None without git) and `date` (UTC, `YYYY-MM-DD`). The load average is
        the runs' own (`ChildRun.loadavg_start` / `loadavg_end`).
    """
    import accelerate
    import torch
    import transformers
    import trl

    changed = git("status", "--porcelain", "--", *code_paths)
    return {
        "cpu_model": cpu_model(),
        "cpu_simd": simd_flags(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
        "git_commit": git("rev-parse", "HEAD"),
        "code_differs_from_commit": bool(changed) if changed is not None else None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }


def versions() -> dict[str, str]:
    """The torch, transformers and trl versions (`{"torch": ..., "transformers": ..., "trl": ...}`)."""
    import torch
    import transformers
    import trl

    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}


def run_conditions(jobs: int, threads: int, loadavg_start: Sequence[float]) -> dict[str, Any]:
    """How a set of runs was made, for its results file: `cpu_count`, `jobs` (runs at a time), `threads` (torch
    threads per run), `loadavg_start` (given: taken before the runs), `loadavg_end` (now) and `versions`."""
    return {
        "cpu_count": os.cpu_count(),
        "jobs": jobs,
        "threads": threads,
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "versions": versions(),
    }


def versions_line() -> str:
    """The torch, transformers and trl versions in words: `'torch X, transformers Y, trl Z'`."""
    return ", ".join(f"{name} {version}" for name, version in versions().items())


# =====================================================================================================================
# Command lines
# =====================================================================================================================
class NumberRange:
    """An argparse `type=` for a number in a range: the text parsed as `kind`, refused outside the range with
    argparse's own error (`prog: error: argument --steps: 0 is invalid: use an integer >= 1`, exit status 2), before
    the script does anything slow. A float must also be finite (`nan`, `inf` are refused).

    Every numeric argument of the scripts under `scripts/benchmarks/` and `scripts/experiments/` takes one of these
    (`tests/test_scripts_run.py` checks it): `positive_int` for counts, sizes, lengths, steps, jobs and threads,
    `non_negative_int` where 0 means none, `seed_int`, `positive_float` / `non_negative_float` for seconds, rates and
    scales, `fraction` for a share in (0, 1], or `int_range` / `float_range` for any other range. A value valid only
    with another (`--warmup` < `--steps`) is the script's `parser.error` after parsing.

    Attributes:
        kind: `int` or `float`.
        minimum, maximum: the bounds (None: none on that side).
        minimum_open, maximum_open: whether the bound itself is refused.
    """

    def __init__(
        self,
        kind: type,
        minimum: float | None = None,
        maximum: float | None = None,
        *,
        minimum_open: bool = False,
        maximum_open: bool = False,
    ):
        if kind not in (int, float):
            raise ValueError(f"NumberRange: kind={kind!r}; use int or float.")
        self.kind, self.minimum, self.maximum = kind, minimum, maximum
        self.minimum_open, self.maximum_open = minimum_open, maximum_open
        self.__name__ = self.describe()  # argparse names a type by its __name__ in its own messages

    def describe(self) -> str:
        """The range in words: `'an integer >= 1'`, `'a number in (0, 1]'`, `'a finite number'`."""
        low, high = self.minimum, self.maximum
        what = "an integer" if self.kind is int else "a finite number" if low is None and high is None else "a number"
        if low is not None and high is not None:
            return f"{what} in {'(' if self.minimum_open else '['}{low}, {high}{')' if self.maximum_open else ']'}"
        if low is not None:
            return f"{what} {'>' if self.minimum_open else '>='} {low}"
        if high is not None:
            return f"{what} {'<' if self.maximum_open else '<='} {high}"
        return what

    def __repr__(self) -> str:
        return f"NumberRange({self.describe()})"

    def contains(self, value: float) -> bool:
        """Whether `value` lies in the range (a float also finite)."""
        if self.kind is float and not math.isfinite(value):
            return False
        if self.minimum is not None and (value <= self.minimum if self.minimum_open else value < self.minimum):
            return False
        return self.maximum is None or (value < self.maximum if self.maximum_open else value <= self.maximum)

    def __call__(self, text: str) -> int | float:
        """`text` as a number of the range.

        Raises:
            argparse.ArgumentTypeError: for text that is no such number, or one outside the range, naming the
                value and the range (argparse prefixes the argument: `argument --steps: ...`).
        """
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {self.describe()}.") from None
        if not self.contains(value):
            raise argparse.ArgumentTypeError(f"{text} is invalid: use {self.describe()}.")
        return value


def int_range(minimum: int | None = None, maximum: int | None = None) -> NumberRange:
    """An argparse type for an integer in [minimum, maximum] (None: unbounded on that side)."""
    return NumberRange(int, minimum, maximum)


def float_range(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    minimum_open: bool = False,
    maximum_open: bool = False,
) -> NumberRange:
    """An argparse type for a finite float between `minimum` and `maximum` (None: unbounded on that side; `*_open`:
    the bound itself refused)."""
    return NumberRange(float, minimum, maximum, minimum_open=minimum_open, maximum_open=maximum_open)


positive_int = int_range(1)
"""Counts, sizes, lengths, steps, jobs, threads: an integer >= 1."""
non_negative_int = int_range(0)
"""A count where 0 means none (or skip): an integer >= 0."""
seed_int = int_range(0, 2**32 - 1)
"""A seed: `transformers.set_seed` seeds NumPy too, which takes [0, 2**32 - 1]."""
positive_float = float_range(0, minimum_open=True)
"""Seconds, rates, scales: a finite number > 0."""
non_negative_float = float_range(0)
"""Seconds or tolerances where 0 means none: a finite number >= 0."""
fraction = float_range(0, 1, minimum_open=True)
"""A share of a budget: a number in (0, 1]."""


@dataclass(frozen=True)
class Job:
    """A job that a script passes the arguments it does not know to (`parse_known_args`), for `check_job_arguments`.

    Attributes:
        name: the job in messages, with its program (`"the main job (examples/trapo.py)"`).
        help: the command that lists its arguments (`"python examples/trapo.py --help"`).
        parser: builds the job's own parser (a `TrlParser` over its argument dataclasses, e.g.
            `trl_trapo.jobs.main.make_parser`): the options it accepts are the job's, no list kept here.
        check: the job's own parse of the arguments (as the script will give them), raising `ValueError` for what it
            refuses (a value out of range, a bad `--config`); None: only the options are checked.
    """

    name: str
    help: str
    parser: Callable[[], argparse.ArgumentParser]
    check: Callable[[list[str]], Any] | None = None


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """The long options `parser` takes, as `--name` (its destinations; the hidden `--_x` ones left out)."""
    namespace, _ = parser.parse_known_args([])
    return [f"--{name}" for name in vars(namespace) if not name.startswith("_")]


def unknown_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str] | None:
    """The options of `argv` (`--name` or `--name=value`, as `--name`) that the job's `parser` does not take, found by
    that parser itself (`parse_known_args`, after the job's `normalize_argv`: a bare `bool | None` flag, a negative
    number); `--config PATH` is the job's too (`TrlParser` reads it outside argparse). None when a value cannot be
    read (a bad value is the job's own check's to name)."""
    from trl_trapo.jobs.main import normalize_argv

    argv = normalize_argv(list(argv), tuple(getattr(parser, "dataclass_types", ())))
    rest, i = [], 0
    while i < len(argv):
        if argv[i] == "--config":
            i += 2
            continue
        rest.append(argv[i])
        i += 1
    parser.exit_on_error = False  # a bad value raises ArgumentError instead of ending the process with its usage
    try:
        _, unknown = parser.parse_known_args(rest)
    except argparse.ArgumentError:
        return None
    return list(dict.fromkeys(t.partition("=")[0] for t in unknown if t.startswith("-") and not _is_number(t)))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def main_job(check: Callable[[list[str]], Any] | None = None) -> Job:
    """The main job (`examples/trapo.py`, `trl_trapo.jobs.main`'s parser) as a `Job` the scripts' extra arguments go
    to, with `check` its parse of them (None: only the options are checked)."""
    from trl_trapo.jobs.main import make_parser

    return Job("the main job (examples/trapo.py)", "python examples/trapo.py --help", make_parser, check)


def check_job_arguments(parser: argparse.ArgumentParser, job_argv: Sequence[str], jobs: Sequence[Job]) -> None:
    """Refuse, before anything runs, the extra arguments (`parse_known_args`'s) that a job they go to does not take:
    each option no job's parser takes is named with the closest option (`difflib`) of the script's and the job's (a
    misspelt script option, `--lsit`, is the script's `--list`, not a job argument), then each job's own `check`
    runs. A script passes every job its runs use (a job for one task only when that task runs).

    Args:
        parser: the script's parser (its options, and its `error`).
        job_argv: the arguments the script did not know.
        jobs: the jobs they go to.

    Raises:
        SystemExit: `parser.error` (status 2): `argument --lsit: neither this script nor the main job
            (examples/trapo.py) takes it. Did you mean --list? ...`, or `the main job (examples/trapo.py) refuses the
            extra arguments [...]: <its message>`.
    """
    if not job_argv:
        return
    import difflib

    own = option_names(parser)
    for job in jobs:
        job_parser = job.parser()
        unknown = unknown_options(job_parser, job_argv) or []
        if unknown:
            names = own + option_names(job_parser)
            problems = []
            for flag in unknown:
                close = difflib.get_close_matches("--" + flag.lstrip("-").replace("-", "_"), names, n=1)
                hint = f" Did you mean {close[0]}{' (this script)' if close[0] in own else ''}?" if close else ""
                problems.append(f"{flag}: neither this script nor {job.name} takes it.{hint}")
            parser.error(
                " ".join(problems)
                + f" Fix: spell it as one of theirs (`{parser.prog} --help` lists this script's, `{job.help}` the"
                " job's; the script passes what it does not know to every run of the job)."
            )
        if job.check is not None:
            try:
                job.check(list(job_argv))
            except ValueError as error:
                parser.error(f"{job.name} refuses the extra arguments {list(job_argv)}: {error}")


CONFIG_REFUSAL = re.compile(r"^(?P<config>\w*Config)\.(?P<field>\w+)=")
"""The start of a configuration class's refusal (`TRAPOConfig.max_steps=0 is invalid: ...`, `PPOConfig....`)."""


@contextlib.contextmanager
def config_refusals_as_usage(parser: argparse.ArgumentParser, flags: Mapping[str, str] | None = None):
    """Inside it, a configuration class's refusal (a `ValueError` reading `<Name>Config.<field>=<value> ...`, as
    `TRAPOConfig.max_steps=0 is invalid: ...`) ends the script as a usage error (`parser.error`, exit status 2, no
    traceback): `argument --flag: <the message>` where `flags` maps the field to the script's flag that sets it
    directly, else the message alone. Any other exception goes through unchanged.

    Args:
        parser: the script's `argparse.ArgumentParser`.
        flags: configuration field -> the script's flag (`{"per_device_train_batch_size": "--rows"}`).
    """
    try:
        yield
    except ValueError as error:
        match = CONFIG_REFUSAL.match(str(error))
        if match is None:
            raise
        flag = (flags or {}).get(match["field"])
        parser.error(f"argument {flag}: {error}" if flag else str(error))


# =====================================================================================================================
# Files
# =====================================================================================================================
def write_json_atomic(
    path: str | Path, payload: Any, *, indent: int = 1, sort_keys: bool = True, newline: bool = True
) -> None:
    """Write `payload` as JSON through a temporary file and a rename (`trl_trapo.checkpoint.atomic_write_bytes`): an
    interrupted run never leaves half a file, and the previous file stays until the new one is complete. The folder
    is created if missing.

    Args:
        path: the file.
        payload: JSON-serialisable.
        indent, sort_keys: as `json.dumps` (each script keeps the layout of its committed files).
        newline: end the file with a newline.
    """
    from trl_trapo.checkpoint import atomic_write_bytes

    text = json.dumps(payload, indent=indent, sort_keys=sort_keys) + ("\n" if newline else "")
    atomic_write_bytes(str(path), text.encode("utf-8"))


def read_json(path: str | Path) -> Any:
    """The JSON in `path`, or None when there is no such file."""
    path = Path(path)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


# =====================================================================================================================
# Statistics
# =====================================================================================================================
# Student t quantiles t_{p, df} for df = 1..30 (two-sided intervals: p = 0.975 gives 95 %, p = 0.95 gives 90 %), to
# the 3 decimals of the standard tables (NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2); the rounding moves
# an interval's ends by less than 0.03 % of its half-width.
T_QUANTILES = {
    0.95: (
        6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
    ),
    0.975: (
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ),
}  # fmt: skip


def t_quantile(probability: float, df: int) -> float:
    """The Student t distribution's `probability` quantile with `df` degrees of freedom: `T_QUANTILES` where it holds
    them, else `scipy.stats.t.ppf`.

    The table comes first so that a report rendered from stored differences reads the same on every machine, with or
    without scipy (the results pages' blocks are checked against their rendering).

    Raises:
        ValueError: if `df` < 1, or for a quantile the table lacks (it holds p 0.95 and 0.975, df 1..30) when scipy
            is not installed (`pip install scipy`; for many pairs use `paired_interval(..., distribution="normal")`).
    """
    if df < 1:
        raise ValueError(f"t_quantile: df={df} must be >= 1 (an interval needs at least 2 values).")
    table = T_QUANTILES.get(probability, ())
    if df <= len(table):
        return table[df - 1]
    try:
        from scipy.stats import t as student_t
    except ImportError:
        raise ValueError(
            f"t_quantile({probability}, df={df}): the table holds p in {sorted(T_QUANTILES)} with df 1..30; "
            "`pip install scipy` for others, or use the normal interval for many pairs."
        ) from None
    return float(student_t.ppf(probability, df))


def normal_quantile(probability: float) -> float:
    """The standard normal distribution's `probability` quantile (`statistics.NormalDist().inv_cdf`)."""
    return statistics.NormalDist().inv_cdf(probability)


def describe(values: Sequence[float]) -> dict[str, float]:
    """`mean`, `std` (sample standard deviation; 0 for one value), `min`, `max` and `n` of `values` (at least one)."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def paired_interval(differences: Sequence[float], confidence: float = 0.95, distribution: str = "t") -> dict:
    """The mean of paired differences d_i = a_i − b_i (the same seed, or the same problem, in both arms) and its
    two-sided confidence interval d̄ ± q · s_d / √n, s_d the sample standard deviation of the d_i.

    `distribution="t"`: the paired t interval, q = t_{(1+confidence)/2, n−1} (Student 1908; e.g. Wasserman, *All of
    Statistics*, 2004, and NIST/SEMATECH e-Handbook 7.4.4.1 for paired samples) — for a handful of seeds.
    `distribution="normal"`: q = z_{(1+confidence)/2}, the normal approximation for many pairs (200 problems: the t
    quantile differs in the third digit).

    Args:
        differences: the paired differences, one per pair (at least 2).
        confidence: the interval's coverage (0.95: a 95 % interval; 0.9: 90 %).
        distribution: "t" or "normal".

    Returns:
        `n`, `mean`, `low`, `high`, `se` (s_d / √n), `quantile` (q) and `method` (words for a report).

    Raises:
        ValueError: with fewer than 2 differences, an unknown `distribution`, or (without scipy) a t quantile the
            table lacks (`t_quantile`).
    """
    n = len(differences)
    if n < 2:
        raise ValueError(f"paired_interval: got {n} pairs; an interval needs at least 2.")
    probability = round((1 + confidence) / 2, 10)
    if distribution == "t":
        quantile = t_quantile(probability, n - 1)
        method = f"paired t interval ({100 * confidence:g} %, {n - 1} df)"
    elif distribution == "normal":
        quantile = normal_quantile(probability)
        method = f"normal approximation of the mean paired difference ({100 * confidence:g} %)"
    else:
        raise ValueError(f"paired_interval: distribution={distribution!r}; use 't' or 'normal'.")
    mean = statistics.mean(differences)
    se = statistics.stdev(differences) / math.sqrt(n)
    return {
        "n": n,
        "mean": mean,
        "low": mean - quantile * se,
        "high": mean + quantile * se,
        "se": se,
        "quantile": quantile,
        "method": method,
    }
