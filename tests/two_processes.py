# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What the two-process tests share (tests/test_distributed.py, tests/test_distributed_jobs.py): `launch` a script on
2 CPU processes with a shipped accelerate config, `check` its exit, read the per-rank `records` and
`assert_ranks_agree`."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "examples" / "accelerate_configs"
RECIPES = ROOT / "examples" / "recipes"
# differ between ranks by nature (wall-clock)
RUNTIME_KEYS = {
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "eps",
    "step_time",
    "eval_runtime",
    "eval_samples_per_second",
    "eval_steps_per_second",
}
# per-rank state, logged as "this rank" (docs/metrics.md's table): each rank keeps successes from its own rollouts, so
# these may differ between ranks while everything the ranks train on together agrees (exploration decides from the
# whole round, every rank's share: its temperatures agree)
RANK_LOCAL_PREFIXES = ("self_imitation/", "distill/sampled_tokens")
# the job with every schedule of the recipes switched on (scaled to the tiny model and 12 steps); the evaluations
# before and after training on the first 16 held-out prompts (`--max_eval_samples`), 8 a rank: the full 400 cost a
# few seconds a launch and test nothing more here (tests/test_examples.py evaluates on all of them)
EVAL_CAP = ["--max_eval_samples", "16"]
JOB_ARGS = [
    "--max_steps", "12", "--logging_steps", "2", "--eval_strategy", "no", "--per_device_eval_batch_size", "100",
    *EVAL_CAP,
    "--save_strategy", "steps", "--save_steps", "6",
    "--kl_target", "0.5", "--kl_horizon", "200", "--kl_coef_range", "0.005", "0.05",
    "--rl_phase_learning_rate", "1e-3", "--entropy_coef", "0.01", "--late_entropy_coef", "0.001",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    config: str, script: str, args: list[str], timeout: int = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file <config> --num_processes 2 --mixed_precision no <script> <args>` on CPU.

    The timeout only guards against a hang: a job takes ~45 s on an idle 2-core machine; in a new user's run of the
    suite beside a real-model job the ZeRO-3 job failed once (error not captured) and passed alone, most likely the
    former 240 s limit (two ranks sharing two busy cores, plus DeepSpeed's one-time build of its CPU op). Half a minute
    before it, `tests/distributed_job.py` prints every rank's stacks and exits (`TRAPO_TEST_WATCHDOG_S`): a hang fails
    saying which collective each rank waits in."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TRAPO_TEST_WATCHDOG_S": str(max(timeout - 30, 1)),
        **(env or {}),
    }
    command = [
        sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch",
        "--config_file", str(CONFIGS / config), "--num_processes", "2", "--mixed_precision", "no",
        "--main_process_port", str(free_port()), str(ROOT / script), *args,
    ]  # fmt: skip
    # a session of its own for the launcher; torchrun starts each worker in a session of its own too, so after a hang
    # the workers are killed one by one (a worker stuck in a collective would otherwise outlive the test, for gloo's
    # 30-minute timeout), then the launcher's group
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import psutil  # accelerate's dependency

        try:
            workers = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            workers = []
        for worker in workers:
            try:
                worker.kill()
            except psutil.NoSuchProcess:
                pass
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"timed out after {timeout} s:\n{(stdout + stderr)[-4000:]}") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def check(completed: subprocess.CompletedProcess) -> str:
    output = completed.stdout + completed.stderr
    hung = output.find("Timeout (0:")  # faulthandler's header: the ranks' stacks when the watchdog fired (launch)
    assert completed.returncode == 0, output[-6000:] if hung < 0 else f"the job hung:\n{output[hung:][:12000]}"
    return output


def records(output_dir: Path) -> list[dict]:
    return [json.loads((output_dir / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]


def assert_ranks_agree(ranks: list[dict], distributed_type: str) -> None:
    for record in ranks:
        assert record["world_size"] == 2 and record["distributed_type"] == distributed_type, record
    first, second = (r["log_history"] for r in ranks)
    assert len(first) == len(second)
    train_logs = [h for h in first if "loss" in h]
    assert train_logs, first
    for key in ("weight/rl", "curriculum/rl", "dare/factor/rl", "schedule/kl_coef", "schedule/lr_scale"):
        assert all(key in h for h in train_logs), key
    for a, b in zip(first, second):
        assert set(a) == set(b)
        assert {k: v for k, v in a.items() if k not in RUNTIME_KEYS and not k.startswith(RANK_LOCAL_PREFIXES)} == {
            k: v for k, v in b.items() if k not in RUNTIME_KEYS and not k.startswith(RANK_LOCAL_PREFIXES)
        }
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]


def digest_of(model) -> str:
    state = model.state_dict()
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].float().numpy().tobytes())
    return digest.hexdigest()


# the shipped accelerate config of each backend, and the distributed type accelerate reports for it on CPU
BACKENDS = {
    "ddp": ("multi_gpu.yaml", "DistributedType.MULTI_CPU"),
    "zero2": ("deepspeed_zero2.yaml", "DistributedType.DEEPSPEED"),
    "zero3": ("deepspeed_zero3.yaml", "DistributedType.DEEPSPEED"),
}
