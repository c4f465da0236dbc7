# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/experiments/runlib.py`: the child environment, the launcher (timeout, the child's own peak memory and CPU
time, the log), the atomic results file, the statistics by hand, and the scripts' use of them."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))

import result_blocks  # noqa: E402
import runlib  # noqa: E402


PYTHON = sys.executable


# ---------------------------------------------------------------------------------------------------------------------
# the child's environment
# ---------------------------------------------------------------------------------------------------------------------
def test_child_env_sets_threads_offline_and_this_checkout_first(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the user allows downloads: kept
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("TRAPO_REWARD_URL", "http://old")
    before = dict(os.environ)
    env = runlib.child_env(3, {"TRAPO_REWARD_URL": None, "EXTRA": "x"})
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["HF_HUB_OFFLINE"] == "0" and env["HF_DATASETS_OFFLINE"] == "1"
    assert env["HF_HUB_DISABLE_TELEMETRY"] == "1" and env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/somewhere/else"]
    assert "TRAPO_REWARD_URL" not in env and env["EXTRA"] == "x"  # None removes, a value sets
    assert dict(os.environ) == before  # this process's environment is untouched


def test_child_env_without_threads_leaves_them_and_drop_removes(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert runlib.child_env(None)["OMP_NUM_THREADS"] == "7"
    env = runlib.child_env(None, {"OMP_NUM_THREADS": "2"}, drop=("OMP_NUM_THREADS", "OMP_WAIT_POLICY"))
    assert env["OMP_NUM_THREADS"] == "2" and "OMP_WAIT_POLICY" not in env
    assert env["PYTHONPATH"] == str(ROOT)  # no empty entry (the current directory) after it
    with pytest.raises(ValueError, match="threads=0"):
        runlib.child_env(0)


def test_go_offline_defaults_this_process_as_a_child_and_keeps_the_users_choice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_DISABLE_TELEMETRY", raising=False)
    runlib.go_offline()
    assert os.environ["HF_HUB_OFFLINE"] == "0" and os.environ["HF_DATASETS_OFFLINE"] == "1"
    assert os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1"


# ---------------------------------------------------------------------------------------------------------------------
# the launcher
# ---------------------------------------------------------------------------------------------------------------------
def test_a_child_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(grandchild.pid, flush=True)
        time.sleep(60)
        """
    )
    started = time.perf_counter()
    run = runlib.run_child([PYTHON, "-c", code], log_path=tmp_path / "slow.log", timeout_s=1.5, check=False)
    assert run.timed_out and run.returncode == -9 and time.perf_counter() - started < 20
    grandchild = int((tmp_path / "slow.log").read_text().split()[0])
    for _ in range(50):  # the whole process group went: the grandchild too (gone, or a zombie waiting for init)
        status = Path(f"/proc/{grandchild}/status")
        if not status.exists() or "\nState:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail("the grandchild survived the timeout")
    with pytest.raises(runlib.ChildFailed, match="ran out of time"):
        runlib.run_child([PYTHON, "-c", code], log_path=tmp_path / "again.log", timeout_s=1.0)


def test_the_childs_own_peak_memory_and_cpu_time_and_its_log(tmp_path):
    code = textwrap.dedent(
        """
        import sys, time
        block = bytearray(300 * 2**20)  # 300 MiB, touched
        for i in range(0, len(block), 4096):
            block[i] = 1
        start = time.process_time()
        while time.process_time() - start < 0.5:
            pass
        print("@@progress 50", flush=True)
        print("to the log", flush=True)
        print("an error", file=sys.stderr, flush=True)
        """
    )
    consumed = []
    run = runlib.run_child(
        [PYTHON, "-c", code],
        log_path=tmp_path / "logs" / "big.log",
        on_line=lambda line: line.startswith("@@progress") and not consumed.append(line),
    )
    assert run.returncode == 0 and not run.timed_out
    assert run.peak_rss_mb > 300  # the child's peak, not this process's
    assert run.peak_rss_mb > runlib.peak_rss_mb() or runlib.peak_rss_mb() > 300
    assert run.cpu_s >= 0.45 and run.wall_s >= run.cpu_s * 0.5
    log = (tmp_path / "logs" / "big.log").read_text()
    assert "to the log" in log and "an error" in log and "@@progress" not in log
    assert consumed == ["@@progress 50"]
    assert len(run.loadavg_start) == len(run.loadavg_end) == 3


def test_a_failing_child_raises_with_the_end_of_its_log(tmp_path):
    code = "import sys; print('x' * 5000); print('the cause', file=sys.stderr); sys.exit(3)"
    with pytest.raises(runlib.ChildFailed, match=r"(?s)run 7 failed \(exit code 3\).*the cause") as failure:
        runlib.run_child([PYTHON, "-c", code], log_path=tmp_path / "bad.log", name="run 7", tail_chars=100)
    assert failure.value.run.returncode == 3 and len(str(failure.value)) < 300  # only the tail
    assert runlib.run_child([PYTHON, "-c", code], log_path=tmp_path / "bad.log", check=False).returncode == 3


def test_launch_worker_writes_the_spec_and_runs_the_worker_in_the_child_env(tmp_path, monkeypatch):
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, sys
            spec = json.load(open(sys.argv[2]))
            json.dump({"spec": spec, "threads": os.environ["OMP_NUM_THREADS"], "extra": sys.argv[3:],
                       "path": os.environ["PYTHONPATH"].split(os.pathsep)[0]}, open(spec["out"], "w"))
            """
        )
    )
    monkeypatch.delenv("PYTHONPATH", raising=False)
    spec = {"out": str(tmp_path / "out.json"), "seed": 3}
    runlib.launch_worker(
        script, spec, tmp_path / "spec.json", threads=2, log_path=tmp_path / "log.txt", worker_args=["more"]
    )
    out = json.loads((tmp_path / "out.json").read_text())
    assert out == {"spec": spec, "threads": "2", "extra": ["more"], "path": str(ROOT)}
    assert runlib.read_json(tmp_path / "spec.json") == spec and runlib.read_json(tmp_path / "none.json") is None


def test_compare_real_children_run_this_checkout(tmp_path, monkeypatch):
    """The launchers of compare_pipelines, compare_real and benchmark_trainers gave the child no `PYTHONPATH`: a child
    imported whichever `trl_trapo` was installed (in a second checkout or worktree, another one) instead of this
    checkout's. `runlib.child_env` puts this checkout first."""
    import compare_real

    script = tmp_path / "worker.py"
    script.write_text(
        "import json, os, sys\n"
        "spec = json.load(open(sys.argv[2]))\n"
        "json.dump({'path': os.environ.get('PYTHONPATH')}, open(spec['cache'], 'w'))\n"
    )
    monkeypatch.delenv("PYTHONPATH", raising=False)
    spec = {"name": "probe", "threads": 1, "cache": str(tmp_path / "probe.json")}
    result = compare_real.launch(spec, tmp_path / "logs", script)
    assert (result["path"] or "").split(os.pathsep)[0] == str(ROOT)


def test_map_jobs_keeps_the_order_and_runs_at_most_one_per_core(monkeypatch):
    monkeypatch.setattr(runlib, "usable_cores", lambda: 2)
    lock, running, most = threading.Lock(), [0], [0]

    def task(item):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return item * 10

    assert runlib.map_jobs(task, range(8), jobs=4) == [i * 10 for i in range(8)]
    assert most[0] == 2  # 4 asked, 2 cores
    caller = threading.get_ident()
    assert runlib.map_jobs(lambda _: threading.get_ident(), range(3), jobs=1) == [caller] * 3  # in this thread


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="SIGINT goes to the main thread")
def test_ctrl_c_kills_the_children_of_every_job(tmp_path, monkeypatch):
    """Each child has its own session (a timeout kills its group), so the terminal's SIGINT no longer reaches it:
    Ctrl-C in the parent must kill the children of every job, or they would train on, orphaned."""
    monkeypatch.setattr(runlib, "usable_cores", lambda: 2)
    sleeper = [PYTHON, "-c", "import time; time.sleep(60)"]

    def ctrl_c_once_both_children_sleep():  # not after a fixed delay: on a loaded machine a child may start late
        deadline = time.perf_counter() + 30
        while len(runlib._live_groups) < 2 and time.perf_counter() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    sent = []
    timer = threading.Thread(target=ctrl_c_once_both_children_sleep)
    # Ctrl-C as a fresh interpreter handles it: in the default run an earlier test on the same xdist worker can leave
    # another SIGINT handler, and the signal then interrupted nothing (the children slept their 60 s)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            runlib.map_jobs(lambda i: runlib.run_child(sleeper, log_path=tmp_path / f"{i}.log"), [0, 1], jobs=2)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.perf_counter() - sent[0] < 20  # both sleeping children were killed, not waited for (60 s)
    assert not runlib._live_groups  # nothing left to kill


def test_run_cached_reuses_only_a_result_of_the_same_key(tmp_path):
    calls = []

    def worker(spec):
        calls.append(spec["key"])
        result = {"key": spec["key"], "value": len(calls)}
        runlib.write_json_atomic(Path(spec["run_dir"]) / "result.json", result)
        return result

    spec = {"run_dir": str(tmp_path), "key": "a", "rerun": False, "threads": 1}
    first = runlib.run_cached(spec, worker, __file__, in_process=True, name="r")
    assert runlib.run_cached(spec, worker, __file__, in_process=True, name="r") == first and calls == ["a"]
    assert runlib.run_cached({**spec, "key": "b"}, worker, __file__, in_process=True, name="r")["value"] == 2
    assert (
        runlib.run_cached({**spec, "key": "b", "rerun": True}, worker, __file__, in_process=True, name="r")["value"]
        == 3
    )
    assert runlib.keyed_result(tmp_path, "b") is not None and runlib.keyed_result(tmp_path, "a") is None


# ---------------------------------------------------------------------------------------------------------------------
# command lines: range types, configuration refusals as usage errors
# ---------------------------------------------------------------------------------------------------------------------
def test_range_types_parse_inside_and_refuse_outside_with_argparses_error(capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="bench.py")
    parser.add_argument("--steps", type=runlib.positive_int, default=20)
    parser.add_argument("--seed", type=runlib.seed_int, default=0)
    parser.add_argument("--share", type=runlib.fraction, nargs="+", default=[1.0])
    parser.add_argument("--delay", type=runlib.non_negative_float, default=0.2)
    args = parser.parse_args(["--steps", "1", "--seed", str(2**32 - 1), "--share", "0.5", "1", "--delay", "0"])
    assert (args.steps, args.seed, args.share, args.delay) == (1, 2**32 - 1, [0.5, 1.0], 0.0)
    for argv, message in (
        (["--steps", "0"], "argument --steps: 0 is invalid: use an integer >= 1."),
        (["--steps", "-3"], "argument --steps: -3 is invalid: use an integer >= 1."),
        (["--steps", "1.5"], "argument --steps: '1.5' is not an integer >= 1."),
        (["--seed", str(2**32)], f"argument --seed: {2**32} is invalid: use an integer in [0, {2**32 - 1}]."),
        (["--share", "0.5", "0"], "argument --share: 0 is invalid: use a number in (0, 1]."),
        (["--delay", "nan"], "argument --delay: nan is invalid: use a number >= 0."),
        (["--delay", "inf"], "argument --delay: inf is invalid: use a number >= 0."),
    ):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: bench.py") and f"bench.py: error: {message}" in err, (argv, err)
    assert runlib.float_range().describe() == "a finite number" and not runlib.float_range().contains(math.inf)
    assert runlib.int_range(2, 5).describe() == "an integer in [2, 5]" and runlib.int_range(2, 5).contains(5)
    with pytest.raises(ValueError, match="kind=<class 'str'>"):
        runlib.NumberRange(str)


def test_a_config_refusal_is_a_usage_error_naming_the_scripts_flag(tmp_path, capsys):
    import argparse

    from trl_trapo import TRAPOConfig

    parser = argparse.ArgumentParser(prog="bench.py")
    with pytest.raises(SystemExit) as exit_, runlib.config_refusals_as_usage(parser, {"max_steps": "--steps"}):
        TRAPOConfig(output_dir=str(tmp_path), max_steps=0)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "bench.py: error: argument --steps: TRAPOConfig.max_steps=0 is invalid: " in err and "Traceback" not in err
    with pytest.raises(SystemExit), runlib.config_refusals_as_usage(parser):  # no flag for the field: the message
        TRAPOConfig(output_dir=str(tmp_path), max_steps=0)
    assert "bench.py: error: TRAPOConfig.max_steps=0 is invalid: " in capsys.readouterr().err
    with (
        pytest.raises(ValueError, match="not a refusal"),
        runlib.config_refusals_as_usage(parser, {"max_steps": "-s"}),
    ):
        raise ValueError("not a refusal: a bug keeps its traceback")


def test_job_arguments_are_checked_by_the_jobs_own_parser_with_the_closest_of_both(capsys):
    import argparse
    import dataclasses

    from transformers import HfArgumentParser

    @dataclasses.dataclass
    class JobArgs:
        max_steps: int = 10
        packing: bool = True  # the parser also takes --no_packing
        bf16: bool | None = None  # taken bare (the job's normalize_argv)

    script = argparse.ArgumentParser(prog="bench.py", allow_abbrev=False)
    script.add_argument("--list", action="store_true")
    script.add_argument("--_worker", default=None)
    checked = []

    def check(argv):
        checked.append(argv)
        if "--max_steps=0" in argv or argv[-2:] == ["--max_steps", "0"]:
            raise ValueError("--max_steps 0 is invalid: use a positive number.")

    job = runlib.Job(
        "the job (job.py)", "python job.py --help", lambda: HfArgumentParser(JobArgs, allow_abbrev=False), check
    )
    for argv, expected in (
        (["--lsit"], "--lsit: neither this script nor the job (job.py) takes it. Did you mean --list (this script)?"),
        (
            ["--max-step", "3"],
            "--max-step: neither this script nor the job (job.py) takes it. Did you mean --max_steps?",
        ),
        (["--worker", "x"], "--worker: neither this script nor the job (job.py) takes it. Fix: spell it"),  # hidden
    ):
        with pytest.raises(SystemExit) as exit_:
            runlib.check_job_arguments(script, argv, [job])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2 and f"bench.py: error: {expected}" in err, err
        assert "`python job.py --help` the job's" in err
    assert not checked  # an unknown option ends it before the job's own check
    with pytest.raises(SystemExit):
        runlib.check_job_arguments(script, ["--max_steps", "0"], [job])
    err = " ".join(capsys.readouterr().err.split())
    assert "the job (job.py) refuses the extra arguments ['--max_steps', '0']: --max_steps 0 is invalid" in err
    good = ["--max_steps", "3", "--no_packing", "--bf16", "--config", "recipe.yaml", "--max_steps=-1"]
    runlib.check_job_arguments(script, good, [job])
    runlib.check_job_arguments(script, [], [job])  # nothing to check: the job's check is not run
    assert checked[-1] == good and len(checked) == 2


# ---------------------------------------------------------------------------------------------------------------------
# the machine, the files
# ---------------------------------------------------------------------------------------------------------------------
def test_machine_info_names_what_the_numbers_depend_on():
    info = runlib.machine_info()
    assert set(info) == {
        "cpu_model", "cpu_simd", "cpu_count", "python", "torch", "transformers", "trl", "accelerate", "git_commit",
        "code_differs_from_commit", "date",
    }  # fmt: skip
    assert info["cpu_count"] == os.cpu_count() and info["cpu_model"]
    assert info["git_commit"] is None or len(info["git_commit"]) == 40
    assert runlib.machine_line().endswith(f", {os.cpu_count()} cores")
    assert runlib.versions_line().startswith("torch ")


def test_write_json_atomic_keeps_the_previous_file_when_a_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "results.json"
    runlib.write_json_atomic(path, {"b": 1, "a": [1, 2]})
    assert path.read_text() == '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n'  # indent 1, keys sorted, a final newline
    runlib.write_json_atomic(path, {"b": 1, "a": 2}, indent=2, sort_keys=False, newline=False)
    assert path.read_text() == '{\n  "b": 1,\n  "a": 2\n}'
    with pytest.raises(TypeError):
        runlib.write_json_atomic(path, {"a": object()})  # not serialisable: nothing is written

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runlib.write_json_atomic(path, {"new": True})
    assert json.loads(path.read_text()) == {"b": 1, "a": 2}  # the previous file, whole
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]  # no temporary file left


def test_write_block_from_results(tmp_path, monkeypatch, capsys):
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- t:start -->\nold\n<!-- t:end -->\nb\n", encoding="utf-8")
    results = tmp_path / "results.json"
    render = lambda data: f"n = {data['n']}"  # noqa: E731
    with pytest.raises(SystemExit, match="run the comparison first"):
        result_blocks.write_block_from_results("t", render, results, page)
    runlib.write_json_atomic(results, {"n": 3})
    assert result_blocks.write_block_from_results("t", render, results, page) == {"n": 3}
    assert page.read_text(encoding="utf-8") == "a\n<!-- t:start -->\nn = 3\n<!-- t:end -->\nb\n"
    # without a page: the results page that holds the block (`PAGES`)
    monkeypatch.setitem(result_blocks.PAGES, "t", page)
    runlib.write_json_atomic(results, {"n": 4})
    capsys.readouterr()
    result_blocks.write_block_from_results("t", render, results)
    assert page.read_text(encoding="utf-8") == "a\n<!-- t:start -->\nn = 4\n<!-- t:end -->\nb\n"
    assert "the t block updated" in capsys.readouterr().out
    result_blocks.write_block_from_results("t", render, results)
    assert "the t block is already up to date" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------------------------------
def test_paired_interval_by_hand():
    # d = 1, 0, 1: mean 2/3; deviations 1/3, -2/3, 1/3 -> s² = (1/9 + 4/9 + 1/9) / 2 = 1/3; se = √(1/3) / √3 = 1/3
    out = runlib.paired_interval([1.0, 0.0, 1.0])
    assert out["n"] == 3 and out["mean"] == pytest.approx(2 / 3) and out["se"] == pytest.approx(1 / 3)
    assert (out["low"], out["high"]) == pytest.approx((2 / 3 - 4.303 / 3, 2 / 3 + 4.303 / 3))  # t_{0.975, 2}
    assert out["quantile"] == 4.303 and "t interval (95 %, 2 df)" in out["method"]
    ninety = runlib.paired_interval([1.0, 0.0, 1.0], confidence=0.9)
    assert (ninety["low"], ninety["high"]) == pytest.approx((2 / 3 - 2.920 / 3, 2 / 3 + 2.920 / 3))  # t_{0.95, 2}
    normal = runlib.paired_interval([1.0, 0.0, 1.0], distribution="normal")
    assert normal["low"] == pytest.approx(2 / 3 - 1.959964 / 3, abs=1e-6)
    flat = runlib.paired_interval([0.2, 0.2])  # no spread: a zero-width interval at the mean
    assert flat["low"] == flat["high"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="got 1 pairs"):
        runlib.paired_interval([0.5])
    with pytest.raises(ValueError, match="'t' or 'normal'"):
        runlib.paired_interval([0.5, 0.1], distribution="bootstrap")


def _student_t_cdf(x: float, df: int, steps: int = 4000) -> float:
    """P(T <= x) for x >= 0: 1/2 + Simpson's rule over the Student t density (its definition)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = [math.exp(log_c - (df + 1) / 2 * math.log1p((x * i / steps) ** 2 / df)) for i in range(steps + 1)]
    h = x / steps
    return 0.5 + h / 3 * (density[0] + density[-1] + 4 * sum(density[1:-1:2]) + 2 * sum(density[2:-1:2]))


@pytest.mark.parametrize("probability", sorted(runlib.T_QUANTILES))
def test_every_tabled_t_quantile_has_its_probability(probability):
    for df, quantile in enumerate(runlib.T_QUANTILES[probability], start=1):
        # 3 decimals: the true quantile lies within 0.0005, so the CDF there is within density * 0.0005 of p
        assert _student_t_cdf(quantile, df) == pytest.approx(probability, abs=2.5e-4), df


def test_a_t_quantile_the_table_lacks_needs_scipy(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.stats", None)  # as if scipy were not installed
    assert runlib.t_quantile(0.975, 30) == 2.042
    with pytest.raises(ValueError, match="pip install scipy"):
        runlib.t_quantile(0.975, 31)
    with pytest.raises(ValueError, match="pip install scipy"):
        runlib.t_quantile(0.99, 3)
    with pytest.raises(ValueError, match="df=0"):
        runlib.t_quantile(0.975, 0)


def test_describe():
    assert runlib.describe([1.0, 3.0]) == {"mean": 2.0, "std": math.sqrt(2.0), "min": 1.0, "max": 3.0, "n": 2}
    assert runlib.describe([5.0])["std"] == 0.0
