# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""torch's CPU threads, chosen on purpose (trl_trapo/threads.py, `TRAPOConfig.torch_threads`).

- The share: usable cores ÷ processes the run starts, one less for a spinning process that would fill every core.
- The choice is made when the user set nothing, left alone when `OMP_NUM_THREADS` is set, when `torch.set_num_threads`
  was called (a fresh process tells them apart) or with `torch_threads=0`; `torch_threads=N` sets N.
- It is logged once (again only when it changes).
- The trainer makes it at construction; the async producer gets its share, waiting passively, without changing the
  trainer's environment.
Timings are in scripts/benchmarks/benchmark_threads.py, not here.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, make_tiny_config, make_tiny_trainer

from trl_trapo import TRAPOConfig, TRAPOTrainer, threads
from trl_trapo.tasks import build_tiny_model


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """This process as a fresh one with no thread setting: no OMP/MKL variables, torch's current threads taken as its
    default, nothing chosen or logged yet; torch's threads restored afterwards."""
    before = torch.get_num_threads()
    for name in (*threads.THREAD_VARIABLES, *threads.WAIT_VARIABLES, "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "torch_default_threads", lambda: before)
    monkeypatch.setattr(threads, "_chosen_here", None)
    monkeypatch.setattr(threads, "_logged", None)
    yield
    torch.set_num_threads(before)


def cores(monkeypatch, n: int) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: n)


@pytest.mark.parametrize(
    "n_cores, processes, spinning, expected",
    [
        (2, 1, True, 1),  # the machine, `python script.py`: one core stays free
        (2, 1, False, 2),  # ... waiting passively (the examples): both cores
        (2, 2, True, 1),  # async on 2 cores: one each
        (8, 2, True, 3),
        (8, 2, False, 4),
        (16, 1, True, 15),
        (3, 2, True, 1),  # shares that leave a core free already are not cut
        (1, 1, True, 1),
        (1, 4, False, 1),  # never below one
    ],
)
def test_thread_share(n_cores, processes, spinning, expected):
    assert threads.thread_share(n_cores, processes, spinning) == expected


def test_thread_share_refuses_zero():
    with pytest.raises(ValueError, match="processes=0"):
        threads.thread_share(4, 0, spinning=False)


def test_the_choice_is_made_when_the_user_set_nothing(monkeypatch):
    cores(monkeypatch, 4)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    choice = threads.choose_torch_threads(None)
    assert choice.chosen and choice.threads == 4 == torch.get_num_threads()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two trainer processes on this node, a producer each
    choice = threads.choose_torch_threads(None, producers_per_process=1)
    assert choice.chosen and choice.threads == 1 == torch.get_num_threads() and choice.producer_threads == 1
    monkeypatch.delenv("OMP_WAIT_POLICY")  # spinning: one core stays free
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    choice = threads.choose_torch_threads(None)
    assert choice.threads == 3 == torch.get_num_threads()


@pytest.mark.parametrize("variable", threads.THREAD_VARIABLES)
def test_left_alone_when_the_environment_sets_the_threads(monkeypatch, variable):
    cores(monkeypatch, 4)
    monkeypatch.setenv(variable, "3")
    before = torch.get_num_threads()
    choice = threads.choose_torch_threads(None, producers_per_process=1)
    assert not choice.chosen and torch.get_num_threads() == before == choice.threads
    assert choice.producer_threads == before  # the producer runs as the trainer does
    assert f"{variable}=3 is set" in choice.reason


def test_left_alone_after_torch_set_num_threads(monkeypatch):
    cores(monkeypatch, 4)
    default = torch.get_num_threads()
    torch.set_num_threads(default + 1)  # the user's call in their script
    choice = threads.choose_torch_threads(None)
    assert not choice.chosen and torch.get_num_threads() == default + 1
    assert f"torch.set_num_threads({default + 1}) was called" in choice.reason


def test_a_second_choice_is_not_taken_for_the_users(monkeypatch):
    """What this module set is recognised as its own: a second trainer in the process chooses again."""
    cores(monkeypatch, 4)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert threads.choose_torch_threads(None).threads == 4
    assert threads.choose_torch_threads(None, producers_per_process=1).threads == 2


def test_opt_out_and_explicit_setting(monkeypatch):
    cores(monkeypatch, 4)
    before = torch.get_num_threads()
    choice = threads.choose_torch_threads(0, producers_per_process=1)
    assert not choice.chosen and torch.get_num_threads() == before and choice.producer_threads is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # an explicit torch_threads wins over the environment
    choice = threads.choose_torch_threads(3, producers_per_process=1)
    assert choice.chosen and torch.get_num_threads() == 3 and choice.producer_threads == 3
    with pytest.raises(ValueError, match="torch_threads=-1"):
        threads.choose_torch_threads(-1)


@pytest.mark.parametrize(
    "field, value", [("torch_threads", -1), ("torch_threads", 1.5), ("async_producer_threads", 0)]
)
def test_config_refuses_a_bad_value(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"TRAPOConfig\.{field}={value!r} is invalid: "):
        TRAPOConfig(output_dir=str(tmp_path), **{field: value})


@pytest.mark.parametrize(
    "overrides, warned",
    [
        (dict(async_rollouts=True, async_producer_threads=1000), "TRAPOConfig.async_producer_threads=1000"),
        (dict(torch_threads=64), "TRAPOConfig.torch_threads=64"),
        (dict(async_rollouts=True, async_producer_threads=2, torch_threads=2), None),
    ],
)
def test_more_threads_than_usable_cores_are_warned_at_construction(tmp_path, monkeypatch, caplog, overrides, warned):
    """`async_producer_threads=1000` on a 2-core machine was accepted without a word (trial 7, A11), though
    oversubscribed cores slow every process down (docs/threads.md); `torch_threads` is its sibling."""
    cores(monkeypatch, 2)
    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        TRAPOConfig(output_dir=str(tmp_path), **overrides)
    found = [r.getMessage() for r in caplog.records if "usable core(s)" in r.getMessage()]
    if warned is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(f"{warned} is more than the 2 usable core(s)"), found
        assert "Use at most 2" in found[0] and "docs/threads.md" in found[0]


def test_the_choice_is_logged_once(monkeypatch, caplog):
    cores(monkeypatch, 4)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    with caplog.at_level(logging.INFO, logger="trl_trapo.threads"):
        threads.choose_torch_threads(None)
        threads.choose_torch_threads(None)
        threads.choose_torch_threads(None)
    chosen = [r for r in caplog.records if r.name == "trl_trapo.threads"]
    assert len(chosen) == 1 and "4 torch thread(s)" in chosen[0].getMessage()
    assert "4 usable core(s) for 1 process(es)" in chosen[0].getMessage()
    with caplog.at_level(logging.INFO, logger="trl_trapo.threads"):
        threads.choose_torch_threads(None, producers_per_process=1)  # a different choice: logged again
    assert len([r for r in caplog.records if r.name == "trl_trapo.threads"]) == 2


def test_passive_waiting_is_given_to_children_only(monkeypatch):
    with threads.passive_waiting_for_children():
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in os.environ  # restored
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")  # the user chose how threads wait: left alone
    with threads.passive_waiting_for_children():
        assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.delenv("GOMP_SPINCOUNT")
    with pytest.raises(RuntimeError), threads.passive_waiting_for_children():
        raise RuntimeError("start failed")
    assert "OMP_WAIT_POLICY" not in os.environ


def test_a_fresh_process_tells_a_set_num_threads_call_from_none():
    """The detection itself, without the fixture's stand-in for torch's default: a new interpreter, no variables."""
    code = (
        "import torch\n"
        "from trl_trapo import threads\n"
        "print(threads.user_thread_setting())\n"
        "torch.set_num_threads(threads.torch_default_threads() + 1)\n"
        "print(threads.user_thread_setting())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in threads.THREAD_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    fresh, after_call = out.strip().splitlines()[-2:]
    assert fresh == "None" and after_call.startswith("torch.set_num_threads(") and after_call.endswith("was called")


# ---- the trainer and its producer ---------------------------------------------------------------------------------


def producer_torch_threads(completions, **kwargs):
    """A 'reward' reporting the torch threads of the process that scores (the producer, with async rollouts)."""
    return [float(torch.get_num_threads())] * len(completions)


def producer_waits_passively(completions, **kwargs):
    """A 'reward' of 1 when the scoring process's OpenMP threads wait passively."""
    return [float(os.environ.get("OMP_WAIT_POLICY") == "PASSIVE")] * len(completions)


def test_the_trainer_chooses_at_construction(tmp_path, tokenizer, suite, monkeypatch):
    cores(monkeypatch, 4)
    trainer = make_tiny_trainer(tmp_path, tokenizer, suite)
    assert trainer.thread_choice.chosen and torch.get_num_threads() == 3  # spinning: one of 4 cores stays free
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    trainer = make_tiny_trainer(tmp_path / "set", tokenizer, suite)
    assert not trainer.thread_choice.chosen and torch.get_num_threads() == 3  # left as it was


def test_the_producer_gets_its_share_and_waits_passively(tmp_path, tokenizer, suite, monkeypatch):
    cores(monkeypatch, 4)  # 2 processes (trainer + producer): the trainer spins (keeps a core free), the producer not
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=[producer_torch_threads, producer_waits_passively],  # both called in the producer
        args=make_tiny_config(tmp_path, async_rollouts=True, max_staleness=0),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    assert torch.get_num_threads() == 1 and trainer.thread_choice.producer_threads == 2
    source = trainer.rollout_source
    try:
        sampled = source.sample(8, 0)
    finally:
        source.close()
    assert set(sampled.per_func[:, 0].tolist()) == {2.0}  # the producer's torch threads
    assert set(sampled.per_func[:, 1].tolist()) == {1.0}  # OMP_WAIT_POLICY=PASSIVE in the producer ...
    assert "OMP_WAIT_POLICY" not in os.environ  # ... and not in the trainer's environment


def test_async_producer_threads_overrides_the_share(tmp_path, tokenizer, suite, monkeypatch):
    cores(monkeypatch, 4)
    trainer = make_tiny_trainer(tmp_path, tokenizer, suite, async_rollouts=True, async_producer_threads=3)
    assert trainer.rollout_source.producer_threads == 3


# ---- the benchmark's harness (its figures are machine-dependent: nothing here times anything) ----------------------


def load_benchmark():
    path = ROOT / "scripts" / "benchmarks" / "benchmark_threads.py"
    spec = importlib.util.spec_from_file_location("benchmark_threads", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_arms():
    bench = load_benchmark()
    assert bench.arm_environment("off") == ({}, ["--torch_threads", "0"])
    assert bench.arm_environment("api") == ({}, [])
    assert bench.arm_environment("example") == ({"OMP_WAIT_POLICY": "PASSIVE"}, [])
    assert bench.arm_environment("2+passive") == ({"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}, [])
    with pytest.raises(ValueError, match="unknown arm 'fast'"):
        bench.arm_environment("fast")


@pytest.mark.ci  # > 10 CPU-s (14-15 measured: the script and its job, two interpreters); `.ci/run` runs it
def test_benchmark_runs_a_job_with_the_choice(tmp_path):
    """One real run (the main job, 1 step) in a fresh process without thread variables: TRAPO's choice is made."""
    out = tmp_path / "runs.json"
    command = [sys.executable, str(ROOT / "scripts" / "benchmarks" / "benchmark_threads.py"), "--jobs", "main"]
    command += ["--max_steps", "1", "--arms", "api", "--job_args", "--eval_strategy no", "--output_json", str(out)]
    printed = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    (run,) = json.loads(out.read_text())["runs"]
    assert run["returncode"] == 0 and run["train_s"] > 0
    assert run["torch_threads"] == threads.thread_share(threads.usable_cores(), 1, spinning=True)
    assert "main   api" in printed and "usable CPUs" in printed
