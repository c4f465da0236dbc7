"""Scale-out on 2 CPU processes: DDP (gloo) and DeepSpeed ZeRO-2 / ZeRO-3 (`DS_ACCELERATOR=cpu`) run the built-in job,
save, resume exactly and give a model that reloads, with identical logs and weights on both ranks; the 2-process
gradient equals the 1-process gradient of the same global batch; the DDP communication hooks run; every accelerate
config loads (DeepSpeed's pass DeepSpeed's own validation) and every recipe parses and validates; a launch that does
not match the run is refused before anything loads. The composed features on 2 processes (distillation, agents, async
rollouts, VLMs) are in tests/test_distributed_jobs.py.

Each job is launched with the shipped accelerate config it tests, overridden to 2 processes and fp32
(`--num_processes 2 --mixed_precision no`), through `tests/distributed_job.py`, which runs the main job
(`trl_trapo.jobs.main.main`) and writes a per-rank record (logs, step times, a digest of the final weights).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from two_processes import (
    BACKENDS,
    CONFIGS,
    EVAL_CAP,
    JOB_ARGS,
    RECIPES,
    ROOT,
    RUNTIME_KEYS,
    assert_ranks_agree,
    check,
    digest_of,
    free_port,
    launch,
    records,
)


pytestmark = pytest.mark.distributed


# ---------------------------------------------------------------------------------------------------------------------
# The built-in job on 2 processes: identical ranks, exact resume, a model that reloads
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "backend, resume",
    [
        ("ddp", True),
        # default-run sibling: test_job_on_two_processes_saves_resumes_and_reloads[zero3-save] (and [ddp] resuming)
        pytest.param("zero2", True, marks=pytest.mark.slow),
        ("zero3", False),  # ~30 s a launch: the DeepSpeed run, its save and the reload; the resume is [zero3]
        # default-run sibling: test_job_on_two_processes_saves_resumes_and_reloads[ddp] (the same resume, under DDP)
        pytest.param("zero3", True, marks=pytest.mark.slow),
    ],
    ids=["ddp", "zero2", "zero3-save", "zero3"],
)
@pytest.mark.slow
def test_job_on_two_processes_saves_resumes_and_reloads(tmp_path, backend, resume):
    """The built-in job on 2 processes: identical ranks, the checkpoint of every rank, a saved model that reloads as the
    trained one, and (`resume`) a run resumed from the middle that ends with the uninterrupted run's weights and logs."""
    if backend != "ddp":
        pytest.importorskip("deepspeed")
    from transformers import AutoModelForCausalLM

    config, distributed_type = BACKENDS[backend]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    check(launch(config, "tests/distributed_job.py", [*JOB_ARGS, "--output_dir", str(full)]))
    ranks = records(full)
    assert_ranks_agree(ranks, distributed_type)
    assert all(r["reference_matches_policy_at_start"] for r in ranks)  # ZeRO-3: copied, not a deep copy of partitions
    # only rank 0 writes the shared files; every rank its own TRAPO state
    assert (full / "eval_results.json").exists() and (full / "trainer_state.json").exists()
    for r in (0, 1):
        assert (full / "checkpoint-6" / "trapo" / f"rank{r}.complete.json").exists()
    # the saved model reloads and is the trained one
    assert digest_of(AutoModelForCausalLM.from_pretrained(full)) == ranks[0]["param_digest"]
    if not resume:
        return
    # resuming from the middle gives the uninterrupted run's weights and logs
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-6", resumed / "checkpoint-6")
    check(
        launch(
            config,
            "tests/distributed_job.py",
            [*JOB_ARGS, "--output_dir", str(resumed), "--resume_from_checkpoint", str(resumed / "checkpoint-6")],
        )
    )
    again = records(resumed)
    assert_ranks_agree(again, distributed_type)
    assert again[0]["param_digest"] == ranks[0]["param_digest"]
    # train_loss averages the steps this invocation ran; total_flos is the Trainer's estimate from parameter counts,
    # which differ for ZeRO-3 partitions before and after the engine is built
    skip = RUNTIME_KEYS | {"train_loss", "total_flos"}

    def after_checkpoint(record):
        return [{k: v for k, v in h.items() if k not in skip} for h in record["log_history"] if h["step"] > 6]

    assert after_checkpoint(again[0]) == after_checkpoint(ranks[0])


@pytest.mark.slow
def test_sigterm_on_one_rank_stops_every_rank_at_the_same_step_with_a_complete_checkpoint(tmp_path):
    """A preemption that reaches rank 1 only: both ranks agree (a collective at every step end) to stop after step 3,
    the 2-rank checkpoint-3 is complete, nothing final is written, and the one line comes from rank 0 only."""
    from trl_trapo.checkpoint import verify_checkpoint

    args = ["--max_steps", "8", "--eval_strategy", "no", *EVAL_CAP, "--output_dir", str(tmp_path)]
    completed = launch("multi_gpu.yaml", "tests/distributed_job.py", args, env={"TRAPO_TEST_SIGNAL": "1:3:SIGTERM"})
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output[-4000:]
    ranks = records(tmp_path)
    assert [r["global_step"] for r in ranks] == [3, 3], output[-4000:]
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]
    verify_checkpoint(str(tmp_path / "checkpoint-3"), 2)  # both ranks' TRAPO state, fingerprinted
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3"]
    assert not (tmp_path / "eval_results.json").exists() and not (tmp_path / "model.safetensors").exists()
    assert output.count("Interrupted by SIGTERM at step 3: saved the complete checkpoint") == 1
    # torchrun's report of the workers' status: 128 + SIGTERM. Once, with the suite on two xdist workers, a rank
    # aborted while exiting after the complete save (torchrun reported "Signal 6 (SIGABRT)"; everything above held):
    # an open shutdown race, accepted here only as that signal and only after the checks above passed.
    assert "exitcode  : 143" in output or "Signal 6 (SIGABRT)" in output, output[-4000:]


@pytest.mark.parametrize(
    "save_only_model",
    [pytest.param(False, marks=pytest.mark.slow), True],  # ~32 s each; `save_only_model` hangs the old code at once
    ids=["full", "save_only_model"],
)
@pytest.mark.slow
def test_every_rank_saves_every_checkpoint_however_late_rank_0_creates_its_folder(tmp_path, save_only_model):
    """A loaded machine once hung this job: rank 1 decided from `os.path.isdir(checkpoint-N)` whether to take part in
    the collective save of TRAPO's state, and did not see the folder — rank 0 had not created it yet, or had just moved
    aside the one rank 1 had created for its RNG file (taking it for an earlier run's) — so rank 0 waited in a barrier
    while rank 1 trained on. `TRAPO_TEST_SLOW_CHECKPOINT` makes that schedule certain (rank 0 slow to start each
    folder): both ranks complete every step, each checkpoint has both ranks' state, and rank 1's RNG file is kept and
    fingerprinted."""
    from trl_trapo.checkpoint import marker_path, verify_checkpoint

    args = ["--max_steps", "4", "--eval_strategy", "no", *EVAL_CAP, "--save_strategy", "steps", "--save_steps", "2"]
    args += ["--output_dir", str(tmp_path)] + (["--save_only_model", "true"] if save_only_model else [])
    check(
        launch(
            "multi_gpu.yaml", "tests/distributed_job.py", args, timeout=300, env={"TRAPO_TEST_SLOW_CHECKPOINT": "1"}
        )
    )
    assert [r["global_step"] for r in records(tmp_path)] == [4, 4]
    for step in (2, 4):
        checkpoint = tmp_path / f"checkpoint-{step}"
        verify_checkpoint(str(checkpoint), 2)
        assert not checkpoint.with_name(f"checkpoint-{step}.replaced").exists()
        for rank in (0, 1):
            listed = json.loads(Path(marker_path(str(checkpoint), rank)).read_text())["files"]
            assert (f"rng_state_{rank}.pth" in listed) is not save_only_model, (step, rank, listed)


def test_fsdp_on_cpu_fails_with_a_clear_message(tmp_path):
    completed = launch("fsdp2.yaml", "tests/distributed_job.py", ["--max_steps", "2", "--output_dir", str(tmp_path)])
    assert completed.returncode != 0
    assert "accelerate switches to FSDP only on GPU" in completed.stdout + completed.stderr


def test_a_launch_mismatch_is_a_user_error_of_the_main_job(monkeypatch):
    """An FSDP accelerate config on CPU reached the user as a `[rank0]` RuntimeError traceback with exit 1 (trial 8's
    JC10), though docs/main_job.md promises one line and exit 2 for the user's mistakes: `check_launch` raises a
    ValueError, which the main job prints as one line (`SETUP_USER_ERRORS`)."""
    import types

    from accelerate.utils import DistributedType

    from trl_trapo.distributed import check_launch
    from trl_trapo.jobs.main import SETUP_USER_ERRORS

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    accelerator = types.SimpleNamespace(distributed_type=DistributedType.NO, num_processes=1)
    with pytest.raises(ValueError, match="The launcher asked for FSDP but the run uses") as info:
        check_launch(accelerator)
    assert isinstance(info.value, SETUP_USER_ERRORS)


FSDP_ON_CPU = "The launcher asked for FSDP but the run uses DistributedType.NO"


@pytest.mark.slow
def test_trapo_train_refuses_fsdp_on_cpu_before_it_loads_anything(tmp_path):
    """Trial 8's JC10 as the user ran it: `trapo train --config_file <FSDP2 config>` on one CPU process printed the
    refusal only after the built-in model was built and every dataset tokenized (the check read the `Accelerator`,
    which exists once `Trainer.__init__` ran). It is now one `trapo train: error:` line, exit status 2, before the job
    says which data it uses."""
    config = tmp_path / "fsdp_cpu.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
        "machine_rank: 0\nmixed_precision: 'no'\nnum_machines: 1\nnum_processes: 1\nuse_cpu: true\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    command = [sys.executable, "-m", "trl_trapo.jobs.commands", "train", "--config_file", str(config)]
    command += ["--main_process_port", str(free_port()), "--max_steps", "2", "--output_dir", str(tmp_path / "out")]
    completed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in completed.stderr.splitlines() if line.startswith("trapo train: error:")]
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert len(errors) == 1 and FSDP_ON_CPU in errors[0], completed.stderr[-3000:]
    for slow in ("Built-in mode", "Tokenizing"):  # the job's data log line; the trainer's tokenizing progress bars
        assert slow not in completed.stderr, completed.stderr[-3000:]


RANK1_REWARDS = """import os


def flaky(completions, **kwargs):
    if os.environ.get("RANK") == "1" and any(completions):  # not in the construction probe (empty completions)
        raise RuntimeError("reward server unreachable on rank 1")
    return [len(c) / 100 for c in completions]


def probe_fails_on_rank1(completions, **kwargs):
    if os.environ.get("RANK") == "1":
        raise RuntimeError("reward server unreachable on rank 1")
    return [len(c) / 100 for c in completions]
"""


@pytest.mark.slow  # ~50 s and ~100 s on 2 busy cores; the default run covers the mechanism in one process
# (tests/test_user_errors.py::test_a_rank_that_fails_on_several_processes_exits_at_once)
@pytest.mark.parametrize("reward", ["probe_fails_on_rank1", "flaky"])
def test_a_reward_that_fails_on_one_rank_ends_the_run(tmp_path, reward):
    """Trial 9's CD01 / CD03: `trapo train` on two DDP processes with a reward function that raises on rank 1 only,
    during training (`flaky`) or in the construction probe. Rank 1 printed its one-line error and then waited in
    `end_process_group`'s barrier while rank 0 waited for it in a collective (the step's gather, DDP's parameter
    check): the run hung until gloo's 30-minute timeout. The failed rank now exits at once with status 2
    (`distributed.exit_failed_rank`), the launcher ends rank 0, and the run ends with rank 1's line."""
    (tmp_path / "rank_rewards.py").write_text(RANK1_REWARDS)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "trl_trapo.jobs.commands", "train", "--multi_gpu", "--num_processes", "2"]
    command += ["--mixed_precision", "no", "--main_process_port", str(free_port()), "--max_steps", "2"]
    command += ["--reward_funcs", f"rank_rewards.{reward}", "--output_dir", str(tmp_path / "out")]
    command += ["--per_device_train_batch_size", "8", "--eval_strategy", "no", "--dataset_test_split", "none"]
    # a session of its own, so that the old code's hang is killed with every worker (as `launch` does)
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=240)  # runs take 50-100 s on 2 busy cores; the old code never ended
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        import psutil  # accelerate's dependency: torchrun's workers run in sessions of their own

        for worker in psutil.process_iter():  # the workers of this test's run only (its output folder)
            try:
                if str(tmp_path / "out") in worker.cmdline():
                    worker.kill()
            except psutil.Error:
                pass
        _, stderr = process.communicate()
        raise AssertionError(f"the run hung after rank 1's error:\n{stderr[-3000:]}") from None
    errors = [line for line in stderr.splitlines() if line.startswith("trapo train: error:")]
    assert process.returncode == 2, stderr[-3000:]
    assert errors and all("reward server unreachable on rank 1" in line for line in errors), stderr[-3000:]


def test_the_trainer_refuses_a_launch_mismatch_before_it_loads_a_model(tmp_path, monkeypatch):
    """The Python API: the launch is checked first among `TRAPOTrainer`'s construction checks (on the process state
    the config set up), not after the policy, reference and datasets are loaded and tokenized."""
    from conftest import make_tiny_trainer

    import trl_trapo.wiring
    from trl_trapo.tasks import build_char_tokenizer, make_task_suite

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def load_models(*args, **kwargs):
        pytest.fail("the models were loaded before the launch was checked")

    monkeypatch.setattr(trl_trapo.wiring, "load_models", load_models)
    suite = make_task_suite(seed=0, num_pretrain_docs=8, num_sft_per_task=2, num_rl_per_task=2, num_eval_per_task=1)
    with pytest.raises(ValueError, match=FSDP_ON_CPU):
        make_tiny_trainer(tmp_path, build_char_tokenizer(), suite)


@pytest.mark.parametrize("job", ["main", "vision", "agent"])
def test_the_jobs_refuse_a_launch_mismatch_before_they_build_data_or_models(job, tmp_path, monkeypatch):
    """Each job checks the launch before it builds its data and model (the main job's `build_inputs`, the vision and
    agent jobs' `build_data`): those come before the trainer, whose own check would come after them."""
    import importlib

    from trl import ModelConfig

    from trl_trapo import TRAPOConfig

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    module = importlib.import_module(f"trl_trapo.jobs.{job}")

    def build(*args, **kwargs):
        pytest.fail("the job built its data or model before the launch was checked")

    monkeypatch.setattr(module, "build_inputs" if job == "main" else "build_data", build)
    config = TRAPOConfig(output_dir=str(tmp_path), report_to="none")
    with pytest.raises(ValueError, match=FSDP_ON_CPU):
        if job == "main":
            module.build_trainer(module.TRAPOScriptArguments(), config, ModelConfig())
        else:
            module.main(None, config)


ACCELERATOR_TYPE_SCRIPT = """
import importlib.machinery, importlib.util, json, os, sys
from accelerate import Accelerator
from trl_trapo import TRAPOConfig
from trl_trapo.distributed import accelerator_distributed_type

results = []
for env, use_cpu in json.loads(sys.argv[1]):
    for name in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_CPU"):
        os.environ.pop(name, None)
    os.environ.update(env)
    # as where mpi4py is installed: TRAPOConfig then leaves DeepSpeed in one process to DeepSpeed (without it, and
    # without a launcher's environment, it refuses: the run would fail at DeepSpeed's MPI discovery)
    find_spec, importlib.util.find_spec = importlib.util.find_spec, lambda name, *a: (
        importlib.machinery.ModuleSpec(name, None) if name == "mpi4py" else find_spec(name, *a)
    )
    config = TRAPOConfig(output_dir=sys.argv[2], report_to="none", use_cpu=use_cpu)  # resets accelerate's state
    importlib.util.find_spec = find_spec
    predicted = accelerator_distributed_type(config.distributed_state)
    # what the Trainer builds (transformers' `Trainer.create_accelerator_and_postprocess`: no `cpu` argument)
    accelerator = Accelerator(mixed_precision=config.mixed_precision, deepspeed_plugin=config.deepspeed_plugin)
    results.append([str(predicted), str(accelerator.distributed_type)])
print(json.dumps(results))
"""


def test_the_predicted_distributed_type_is_the_accelerators(tmp_path):
    """`accelerator_distributed_type` reads, before the Trainer exists, the type accelerate's `AcceleratorState` gives
    the Trainer's `Accelerator`: the early launch check refuses exactly what the Accelerator would show (never a run
    that would work). The cases run in a subprocess (an `Accelerator` fixes accelerate's shared state)."""
    cases = [
        ({}, False),
        ({"ACCELERATE_USE_FSDP": "true"}, False),
        ({"ACCELERATE_USE_FSDP": "true", "ACCELERATE_USE_CPU": "true"}, False),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, False),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, True),
        ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_CPU": "true"}, False),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "TRANSFORMERS_VERBOSITY": "error"}
    for name in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_CPU", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    command = [sys.executable, "-c", ACCELERATOR_TYPE_SCRIPT, json.dumps(cases), str(tmp_path)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    assert [predicted for predicted, _ in results] == [actual for _, actual in results], results
    # the cases differ: DeepSpeed where accelerate turns it on (`ACCELERATE_USE_CPU` off), and only there
    assert [actual for _, actual in results].count("DistributedType.DEEPSPEED") == 2, results


# ---------------------------------------------------------------------------------------------------------------------
# Gradient of a 2-process step == gradient of the same global batch on 1 process
# ---------------------------------------------------------------------------------------------------------------------
def load_worker():
    spec = importlib.util.spec_from_file_location("distributed_worker", ROOT / "tests" / "distributed_worker.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_two_process_gradient_equals_one_process_gradient(tmp_path):
    from safetensors.torch import load_file

    worker = load_worker()
    check(launch("multi_gpu.yaml", "tests/distributed_worker.py", [str(tmp_path)]))
    rows = [worker.rank_rows(0), worker.rank_rows(1)]
    per_rank = [worker.local_counts(r) for r in rows]
    assert not torch.equal(per_rank[0][:3], per_rank[1][:3])  # uneven per-objective token counts across ranks
    assert per_rank[1][1] == 0  # rank 1 has no SFT token at all
    trainer = worker.make_trainer(str(tmp_path / "single"))
    assert trainer.accelerator.num_processes == 1
    for loss_type in worker.LOSS_TYPES:
        trainer.args.loss_type = loss_type
        expected = worker.gradient(trainer, trainer.model, rows[0] + rows[1], per_rank[0] + per_rank[1])
        got = load_file(str(tmp_path / f"grads_{loss_type}.safetensors"))
        assert set(got) == set(expected)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=0, msg=f"{loss_type} {name}")


def test_end_process_group_leaves_no_collective_holding_a_tensor(tmp_path):
    """`end_process_group` returns only once every gloo group's collectives are finished and released: a tensor an
    asynchronous all-reduce on a second group holds (as ZeRO-3's parameter gathers on DeepSpeed's clone of the world
    group) is released, and gloo's worker threads are parked. Before, only the world group's barrier ran: the
    all-reduce was still running at exit, and a gloo worker that drops such a tensor while the interpreter finalises
    aborts the process (SIGABRT, "terminate called without an active exception"; the tests' ZeRO-3 jobs did under
    load)."""
    check(launch("multi_gpu.yaml", "tests/shutdown_worker.py", [str(tmp_path)], timeout=300))
    for rank in (0, 1):
        record = json.loads((tmp_path / f"shutdown{rank}.json").read_text())
        assert record["released"], record
        assert record["worker_states"] and set(record["worker_states"]) == {"S"}, record


# ---------------------------------------------------------------------------------------------------------------------
# DDP communication hooks
# ---------------------------------------------------------------------------------------------------------------------
HOOK_NAMES = {"powersgd": "powerSGD_hook", "fp16": "fp16_compress_hook"}


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["powersgd", pytest.param("fp16", marks=pytest.mark.slow)])
def test_ddp_comm_hook_runs_on_two_processes(tmp_path, hook):
    args = ["--max_steps", "8", "--eval_strategy", "no", *EVAL_CAP, "--output_dir", str(tmp_path)]
    args += ["--ddp_comm_hook", hook]
    if hook == "powersgd":
        # compress from the 2nd all-reduce on; on gloo PowerSGD's chained collectives must not interleave with DDP's
        # other ones (pytorch/pytorch#58467): one bucket, no unused-parameter search (docs/distributed.md)
        args += ["--powersgd_start_iter", "2", "--ddp_bucket_cap_mb", "100", "--ddp_find_unused_parameters", "false"]
    check(launch("multi_gpu.yaml", "tests/distributed_job.py", args))
    ranks = records(tmp_path)
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]  # replicas stay identical under lossy compression
    for record in ranks:
        assert [h["hook"] for h in record["comm_hooks"]] == [HOOK_NAMES[hook]]
        if hook == "powersgd":
            assert record["comm_hooks"][0]["iter"] >= 8  # the hook ran at every optimizer step
    losses = [h["loss"] for h in ranks[0]["log_history"] if "loss" in h]
    assert all(0 < loss < 10 for loss in losses)


@pytest.mark.slow
def test_bf16_comm_hook_needs_nccl(tmp_path):
    """PyTorch's bf16 hook needs CUDA 11+ with NCCL 2.10+ (or XPU); without them the config refuses it, before the
    model loads (trial 10's CX15: torch refused it at registration, a traceback on each rank after the model and
    data had loaded)."""
    from trl_trapo.distributed import bf16_comm_hook_problem

    if bf16_comm_hook_problem() is None:
        pytest.skip("this torch can register the bf16 hook")
    args = ["--max_steps", "2", "--eval_strategy", "no", "--output_dir", str(tmp_path), "--ddp_comm_hook", "bf16"]
    completed = launch("multi_gpu.yaml", "tests/distributed_job.py", args)
    assert completed.returncode != 0
    output = completed.stdout + completed.stderr
    assert "--ddp_comm_hook bf16 is invalid" in output  # the config's refusal, in the command line's flags
    assert "BF16 all reduce communication hook required CUDA" not in output


def test_bf16_comm_hook_is_refused_at_construction_where_torch_would_refuse_it(monkeypatch):
    """Trial 10's CX15: `--ddp_comm_hook bf16` on a torch without NCCL >= 2.10 (or XPU) was refused by torch only
    at the start of training, on every rank; the config refuses it, naming the field, the reason and the fix. The
    reason follows torch's own condition: a CUDA build with NCCL 2.10+ passes, NCCL 2.9 or a CPU build does not."""
    import torch.distributed as dist

    from trl_trapo import TRAPOConfig
    from trl_trapo.distributed import bf16_comm_hook_problem

    monkeypatch.setattr(dist, "is_xccl_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert "is a CPU build" in bf16_comm_hook_problem()
    with pytest.raises(ValueError, match=r"^TRAPOConfig\.ddp_comm_hook='bf16' is invalid: PyTorch's bf16 hook needs "):
        TRAPOConfig(output_dir="unused", report_to="none", ddp_comm_hook="bf16")
    TRAPOConfig(output_dir="unused", report_to="none", ddp_comm_hook="fp16")  # fp16 runs on gloo: accepted

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 9, 6))
    assert "NCCL is 2.9.6 (< 2.10)" in bf16_comm_hook_problem()
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    assert bf16_comm_hook_problem() is None
    assert TRAPOConfig(output_dir="unused", report_to="none", ddp_comm_hook="bf16").ddp_comm_hook == "bf16"


def test_ddp_comm_hook_is_rejected_without_ddp():
    from types import SimpleNamespace

    from trl_trapo import TRAPOConfig
    from trl_trapo.callbacks import DDPCommHookCallback

    args = TRAPOConfig(output_dir="unused", report_to="none", ddp_comm_hook="fp16")
    model = torch.nn.Linear(2, 2)
    accelerator = SimpleNamespace(num_processes=2, distributed_type="DistributedType.DEEPSPEED")
    with pytest.raises(ValueError, match="ddp_comm_hook='fp16' needs DDP"):
        DDPCommHookCallback(lambda: model, accelerator).on_train_begin(args, None, None)
    accelerator.num_processes = 1  # one process: nothing to communicate, nothing to register
    assert DDPCommHookCallback(lambda: model, accelerator).on_train_begin(args, None, "control") == "control"


def test_a_ddp_comm_hook_in_one_process_is_warned_at_construction(tmp_path, tokenizer, suite, tiny_trainer, caplog):
    """`ddp_comm_hook="powersgd"` in a one-process run trained without a word that the hook is not used (trial 10's
    PY16); now one warning when the trainer is built, as async settings without `async_rollouts` get (A08). PowerSGD's
    own settings without the PowerSGD hook are warned about by the config, the same way."""
    import logging

    from trl_trapo import TRAPOConfig

    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        tiny_trainer(tmp_path, tokenizer, suite, ddp_comm_hook="powersgd", powersgd_start_iter=10)
    found = [r.getMessage() for r in caplog.records if "ddp_comm_hook" in r.getMessage()]
    assert found == [
        "ddp_comm_hook='powersgd' is set but a launch of several DDP processes is not: it is ignored (one process has "
        "no gradients to all-reduce). Launch with `accelerate launch --multi_gpu --num_processes N ...` (`trapo train "
        "--multi_gpu --num_processes N`) to compress DDP's gradient all-reduce with it, or drop it."
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", ddp_comm_hook="fp16", powersgd_rank=4)
    assert (
        "powersgd_rank=4 is set but TRAPOConfig.ddp_comm_hook='powersgd' is not: it is ignored (ddp_comm_hook='fp16')"
        in caplog.text
    )


# ---------------------------------------------------------------------------------------------------------------------
# Configs and recipes
# ---------------------------------------------------------------------------------------------------------------------
def fill_auto(config: dict, values: dict) -> dict:
    out = {}
    for key, value in config.items():
        out[key] = fill_auto(value, values) if isinstance(value, dict) else values.get(key, value)
        if out[key] == "auto":
            raise AssertionError(f"no test value for the 'auto' entry {key}")
    return out


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_config_loads_and_validates(path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin

    text = path.read_text()
    assert text.startswith("#") and "accelerate launch --config_file examples/accelerate_configs/" + path.name in text
    config = load_config_from_file(str(path))
    assert config.compute_environment.value == "LOCAL_MACHINE"
    if config.distributed_type == DistributedType.DEEPSPEED:
        from deepspeed.runtime.config import DeepSpeedConfig

        fields = {f.name for f in dataclasses.fields(DeepSpeedPlugin)}
        assert set(config.deepspeed_config) <= fields | {"deepspeed_multinode_launcher"}
        options = {k: v for k, v in config.deepspeed_config.items() if k in fields and k != "zero3_init_flag"}
        plugin = DeepSpeedPlugin(**options)  # zero3_init_flag left out: it would switch ZeRO-3 on process-wide
        filled = fill_auto(
            plugin.deepspeed_config,
            {
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 4,
                "train_batch_size": 2 * 4,  # DeepSpeed validates against the current world: 1 process here
                "gradient_clipping": 1.0,
            },
        )
        filled["bf16"] = {"enabled": config.mixed_precision == "bf16"}
        validated = DeepSpeedConfig(filled)  # DeepSpeed's own validation (batch arithmetic, ZeRO options)
        assert validated.zero_optimization_stage == config.deepspeed_config["zero_stage"]
        if validated.zero_optimization_stage == 3:
            assert config.deepspeed_config["zero3_save_16bit_model"] is True  # save_model writes a loadable model
    if config.distributed_type == DistributedType.FSDP:
        saved = dict(os.environ)
        try:
            options = {}
            for key, value in config.fsdp_config.items():
                name = key if key == "fsdp_version" else key.removeprefix("fsdp_")
                options[{"offload_params": "cpu_offload"}.get(name, name)] = value
            plugin = FullyShardedDataParallelPlugin(**options)
            assert plugin.fsdp_version == 2
        finally:
            os.environ.clear()
            os.environ.update(saved)


@pytest.mark.parametrize("path", sorted(RECIPES.glob("trapo_qwen2.5_7b_*.yaml")), ids=lambda p: p.name)
def test_recipes_parse_and_validate(path):
    from trl_trapo import cli

    text = path.read_text()
    assert "NOT TESTED ON THE TARGET HARDWARE" in text and "accelerate launch --config_file" in text
    named = text.split("--config_file ", 1)[1].split()[0]
    assert (ROOT / named).is_file(), named
    script, args, model = cli.make_parser().parse_args_and_config(["--config", str(path)])
    assert not cli.builtin_mode(["--config", str(path)])
    assert model.model_name_or_path == "Qwen/Qwen2.5-7B-Instruct" and model.use_peft
    # the source document's hyper-parameters, as real schedules
    assert (args.learning_rate, args.rl_phase_learning_rate) == (5e-5, 3e-5)
    assert (args.kl_coef, list(args.kl_coef_range)) == (0.2, [0.1, 0.3]) and args.kl_target > 0
    assert (args.entropy_coef, args.late_entropy_coef) == (0.01, 0.005)
    assert args.max_grad_norm == 1.0 and args.gradient_checkpointing
    assert script.reward_funcs == ["numeric_answer"]


def test_a_lone_process_waiting_for_a_world_named_by_the_environment_says_so(tmp_path):
    """Trial 10's CX03: `WORLD_SIZE=2 RANK=0 MASTER_PORT=...` left over in the shell, and the job started with plain
    `python`: torch's rendezvous waited (30 minutes) for a rank 1 that never came, printing nothing. Now, once the
    wait is long (`RENDEZVOUS_NOTICE_S`, 1 s here), one warning names the world size, this rank, the meeting point,
    that they came from the environment, and the fix."""
    code = (
        "import trl_trapo.distributed as d; d.RENDEZVOUS_NOTICE_S = 1.0\n"
        "from trl_trapo import TRAPOConfig\n"
        f"TRAPOConfig(output_dir={str(tmp_path)!r}, report_to='none')\n"
    )
    port = str(free_port())
    env = {
        **os.environ,
        "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and not any("WORLD_SIZE=2" in line for line in lines):
            assert process.poll() is None, "".join(lines)[-3000:]  # it waits: it must not have ended
            time.sleep(0.2)
    finally:
        process.kill()
        process.wait()
    notice = [line for line in lines if "WORLD_SIZE=2" in line]
    assert notice, "".join(lines)[-3000:]
    assert "RANK=0" in notice[0] and f"127.0.0.1:{port}" in notice[0] and "from the environment" in notice[0]
    assert "unset WORLD_SIZE RANK LOCAL_RANK MASTER_ADDR MASTER_PORT" in notice[0]
