# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/experiments/compare_async.py`: the summary and the docs block from results made by hand (the paired
interval, speed-ups, the async metrics of the log history), and the `--quick` run of the whole harness (arms `sync`
and `async1`, both reward settings, the HTTP reward server started and stopped by the script)."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))

import compare_async  # noqa: E402
from result_blocks import read_block  # noqa: E402


def check_results(data: dict, arms: list[str], rewards: list[str], seeds: list[int]) -> None:
    """The structure of a results file: every run with its measures, the summary, the machine."""
    assert set(data["runs"]) == {f"{r}-{a}-seed{s}" for r in rewards for a in arms for s in seeds}
    assert data["torch_threads"] == compare_async.TORCH_THREADS and data["jobs"] == 1
    assert data["http_delay_s"] == compare_async.HTTP_DELAY_S
    for key in ("cpu_model", "torch", "transformers", "trl", "git_commit", "date"):
        assert data["machine"][key], key
    assert len(data["loadavg_start"]) == len(data["loadavg_end"]) == 3
    for name, run in data["runs"].items():
        assert name == f"{run['reward']}-{run['arm']}-seed{run['seed']}"
        assert run["wall_s"] > run["train_runtime_s"] > 0, name
        assert 0.0 <= run["final"]["eval_accuracy"] <= 1.0 and "eval_accuracy_initial" in run["initial"]
        assert run["torch_threads"]["start"] == compare_async.ARM_THREADS[run["arm"]], name
        assert set(run["forgetting"]) == {"eval_pretrain_loss", "eval_pretrain_loss_initial", "pretrain_loss_end"}
        assert run["forgetting"]["pretrain_loss_end"] > 0  # the built-in job logs `loss/pretrain`
        assert set(run["async_metrics"]) == set(compare_async.ASYNC_METRICS)
        if run["arm"] == "sync":
            assert all(v is None for v in run["async_metrics"].values()), name  # a sync run logs none
            assert run["async_rollouts"] is False and "--async_rollouts" not in run["command"]
        else:
            assert run["async_rollouts"] is True and "--async_rollouts" in run["command"]
            for key in ("perf/rollout_wait_share", "sample/staleness_mean", "sample/staleness_max"):
                assert run["async_metrics"][key] is not None, (name, key)
                assert run["async_metrics"][key]["count"] >= 1
            assert 0.0 <= run["async_metrics"]["perf/rollout_wait_share"]["mean"] <= 1.0
            assert 0.0 < run["wait_share"] <= 1.0  # the first round is waited for
            # the rounds trained on are at most `--max_staleness` updates old (stale ones are dropped, and counted)
            assert run["async_metrics"]["sample/staleness_max"]["max"] <= max_staleness(compare_async.ARMS[run["arm"]])
        if run["reward"] == "http":
            assert "--reward_funcs scripts.reward_server.remote_exact_match" in run["command"]
            assert run["reward_calls"] >= 1, name  # the rewards came from the server
        else:
            assert run["reward_calls"] is None and "--reward_funcs" not in run["command"]
    assert set(data["summary"]) == set(rewards)  # (the results file's keys are sorted)
    for reward in rewards:
        assert set(data["summary"][reward]) == set(arms)
        sync = data["summary"][reward]["sync"]
        assert sync["speedup_wall_vs_sync"] == pytest.approx(1.0) and sync["target"] is None
        for arm in arms:
            entry = data["summary"][reward][arm]
            assert entry["seeds"] == seeds and entry["wall_s_mean"] > 0 and entry["eval_accuracy_mean"] is not None
            if arm != "sync" and len(seeds) == 1:
                assert entry["paired_accuracy_vs_sync"] is None and entry["target"] == "n/a"


@pytest.mark.slow  # 4 main-job runs, two with a producer: 1-2.5 min; the summary and the block are tested below
def test_quick_run_writes_the_results_and_the_docs_block(tmp_path):
    """`--quick` into tmp_path: 4 runs (sync and async1, instant and http rewards), then `--write_docs` into a copy
    of a page with the markers. Needs `--async_rollouts` in the main job."""
    results = tmp_path / "async.json"
    argv = ["--quick", "--results", str(results), "--work_dir", str(tmp_path / "work")]
    data = compare_async.main(argv)
    assert json.loads(results.read_text()) == json.loads(json.dumps(data))
    check_results(data, list(compare_async.QUICK_ARMS), list(compare_async.REWARDS), [0])
    assert all(run["max_steps"] == 4 for run in data["runs"].values())
    page = tmp_path / "async.md"
    page.write_text("# title\n\n<!-- async-table:start -->\nold\n<!-- async-table:end -->\n\nafter\n")
    compare_async.main(["--write_docs", "--results", str(results), "--page", str(page)])
    block = read_block(page.read_text(), compare_async.BLOCK)
    assert block == compare_async.render_block(data)
    for row in ("| `instant` | `sync` |", "| `instant` | `async1` |", "| `http` | `sync` |", "| `http` | `async1` |"):
        assert row in block, row
    flat = " ".join(block.split())  # prose wrapped where the machine's own strings put the breaks
    assert "Target with the `http` reward" in flat and "`async1` n/a" in flat
    assert page.read_text().endswith("<!-- async-table:end -->\n\nafter\n")


def test_arguments_the_main_job_refuses_stop_the_script_before_any_run(tmp_path, capsys):
    """Every run's arguments are parsed first: a flag the main job does not know (as `--async_rollouts` in a checkout
    without asynchronous rollouts) ends the script before the first run (the main job's parser finds it unknown), and
    so does a value the main job refuses, naming the run."""
    work = tmp_path / "work"
    argv = ["--quick", "--arms", "sync", "--results", str(tmp_path / "r.json"), "--work_dir", str(work)]
    with pytest.raises(SystemExit) as exit_:
        compare_async.main([*argv, "--no_such_flag"])
    assert exit_.value.code == 2
    assert (
        "--no_such_flag: neither this script nor the main job (examples/trapo.py) takes it" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit, match=r"run instant-sync-seed0: the main job refuses .*--max_steps 0 is invalid"):
        compare_async.main([*argv, "--max_steps", "0"])
    assert not work.exists() and not (tmp_path / "r.json").exists()


def test_a_shortened_run_never_overwrites_the_committed_results():
    for argv in (["--quick"], ["--max_steps", "3"]):
        with pytest.raises(SystemExit, match="pass --results PATH"):
            compare_async.main(argv)


def test_a_misspelt_option_of_the_script_is_named_as_one(tmp_path, capsys):
    """`--wirte_docs` went to the main job: the script answered "pass --results PATH", then the job's closest names."""
    for argv, close in ((["--wirte_docs"], "--write_docs (this script)"), (["--deley", "1"], "--delay (this script)")):
        with pytest.raises(SystemExit) as exit_:
            compare_async.main([*argv, "--work_dir", str(tmp_path / "work")])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2
        assert (
            f"{argv[0]}: neither this script nor the main job (examples/trapo.py) takes it. Did you mean {close}?"
            in err
        )
    assert not (tmp_path / "work").exists()


# ---------------------------------------------------------------------------------------------------------------------
# The summary and the block from results made by hand (no run)
# ---------------------------------------------------------------------------------------------------------------------
def metric(mean: float, top: float) -> dict:
    return {"mean": mean, "max": top, "last": top, "count": 10}


def fake_run(reward: str, arm: str, seed: int, accuracy: float, wall: float, wait_share: float | None) -> dict:
    asynchronous = arm != "sync"
    return {
        "reward": reward,
        "arm": arm,
        "seed": seed,
        "command": "python examples/trapo.py " + " ".join(compare_async.ARMS[arm]),
        "final": {"eval_accuracy": accuracy, "eval_accuracy_sft_tasks": 1.0, "eval_accuracy_rl_only": accuracy - 0.1},
        "initial": {k + "_initial": 0.0 for k in compare_async.SPLITS},
        "eval_history": [],
        "forgetting": {"eval_pretrain_loss": None, "eval_pretrain_loss_initial": None, "pretrain_loss_end": 0.5},
        "async_metrics": {
            "perf/rollout_wait_share": metric(wait_share, wait_share) if asynchronous else None,
            "perf/rollout_wait_s": metric(1.0, 2.0) if asynchronous else None,
            "perf/weight_sync_s": metric(0.01, 0.02) if asynchronous else None,
            "sample/staleness_mean": metric(0.5, 1.0) if asynchronous else None,
            "sample/staleness_max": metric(1.0, 1.0 if arm == "async1" else 3.0) if asynchronous else None,
            "sample/dropped_stale_total": metric(2.0, 4.0) if asynchronous else None,
        },
        "async_rollouts": asynchronous,
        "wait_share": wait_share,
        "torch_threads": {"start": 2, "end": 2},
        "reward_calls": 100 if reward == "http" else None,
        "max_steps": 1000,
        "train_runtime_s": wall - 10,
        "train_loss": 1.0,
        "peak_rss_mb": 600.0,
        "peak_rss_children_mb": 500.0,
        "loadavg_1min_start": 1.0,
        "wall_s": wall,
    }


def max_staleness(arm_args: list[str]) -> int:
    return int(arm_args[arm_args.index("--max_staleness") + 1])


def fake_results() -> dict:
    runs = {}
    accuracy = {"sync": [0.90, 0.95, 1.00], "async1": [0.91, 0.93, 1.00], "async4": [0.80, 0.85, 0.70]}
    walls = {("instant", "sync"): 150, ("instant", "async1"): 140, ("instant", "async4"): 135}
    walls |= {("http", "sync"): 450, ("http", "async1"): 250, ("http", "async4"): 200}
    for reward in compare_async.REWARDS:
        for seed in compare_async.SEEDS:
            for arm in compare_async.DEFAULT_ARMS:
                share = None if arm == "sync" else 0.1
                run = fake_run(reward, arm, seed, accuracy[arm][seed], walls[reward, arm] + seed, share)
                runs[f"{reward}-{arm}-seed{seed}"] = run
    machine = {
        "cpu_model": "Some CPU",
        "cpu_count": 2,
        "torch": "2.x",
        "transformers": "5.x",
        "trl": "1.x",
        "git_commit": "0123456789",
        "date": "2026-12-02",
    }
    return {
        "http_delay_s": 0.3,
        "torch_threads": 2,
        "loadavg_start": [1.0, 1.0, 1.0],
        "loadavg_end": [2.0, 2.0, 2.0],
        "machine": machine,
        "runs": runs,
        "summary": compare_async.summarize(runs),
    }


def test_paired_interval_by_hand():
    interval = compare_async.paired_interval([0.01, -0.02, 0.0])
    mean, sd = -1 / 300, math.sqrt(((0.01 + 1 / 300) ** 2 + (-0.02 + 1 / 300) ** 2 + (1 / 300) ** 2) / 2)
    half = 4.303 * sd / math.sqrt(3)
    assert interval == pytest.approx({"n": 3, "mean": mean, "low": mean - half, "high": mean + half})
    assert compare_async.paired_interval([0.1]) is None


def test_summary_speedups_paired_differences_and_the_target():
    summary = fake_results()["summary"]
    http = summary["http"]
    assert http["async1"]["speedup_wall_vs_sync"] == pytest.approx(451 / 251)
    assert http["async1"]["paired_accuracy_vs_sync"]["mean"] == pytest.approx((0.01 - 0.02 + 0.0) / 3)
    assert http["async1"]["target"] == "met"  # 1.8x, and the interval's lower end is above -0.05
    assert http["async4"]["speedup_wall_vs_sync"] > 2 and http["async4"]["target"] == "not met"  # accuracy fell
    assert summary["instant"]["async1"]["target"] == "not met"  # not 1.5x faster
    assert http["async4"]["dropped_stale_total_end_mean"] == 4.0
    assert http["async4"]["staleness_max"] == 3.0 and http["sync"]["staleness_max"] is None
    assert http["async1"]["async_metrics_mean"]["perf/rollout_wait_share"] == pytest.approx(0.1)
    assert http["sync"]["async_metrics_mean"]["perf/rollout_wait_share"] is None
    assert http["async1"]["wait_share_mean"] == pytest.approx(0.1) and http["sync"]["wait_share_mean"] is None
    assert http["sync"]["reward_calls_mean"] == 100 and summary["instant"]["sync"]["reward_calls_mean"] is None


def test_the_block_shows_every_arm_and_moves_with_the_numbers():
    data = fake_results()
    block = compare_async.render_block(data)
    assert block.count("\n| `") == 6  # a row per reward setting and arm
    assert "| `http` | `async1` | 251 | 1.80× |" in block
    assert "`async1` met (1.80× faster" in block and "`async4` not met" in block
    for line in block.splitlines():
        assert line.startswith("|") or len(line) <= compare_async.LINE_WIDTH, line
    changed = copy.deepcopy(data)
    changed["runs"]["http-async1-seed0"]["final"]["eval_accuracy"] += 0.01
    changed["summary"] = compare_async.summarize(changed["runs"])
    assert compare_async.render_block(changed) != block
