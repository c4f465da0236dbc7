# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What the replay buffer costs per training step at 50k trajectories, and how many bytes a trajectory takes.

Prints:

1. **step time of the default job** — `examples/trapo.py` with no arguments (tiny model, built-in tasks, 64 rows per
   optimizer step), run for `--job_steps` steps with the whole curriculum compressed into them (so every phase's RL
   share is represented), mean seconds per optimizer step (generation, scoring, forward, backward, optimizer).
2. **buffer cost per step at 50k capacity** — a `ReplayBuffer(capacity=50_000)` pre-filled to capacity, then driven
   exactly as the trainer drives it: each step takes `--rl_rows` trajectories (least used first) and converts them to
   training rows; when fewer are servable, a generation round of ceil(rl_rows / G) * G new trajectories is added
   (evicting the oldest). Reported: mean insert + sample (+ row conversion) time per step, and its share of the
   default job's step time (target <= 5 %). Twice: with the default job's own trajectories (~10 + 8 tokens) and with
   realistic ones (256 prompt + 256 completion tokens), uncompressed and zstd-compressed.
3. **bytes per trajectory** (256 + 256 tokens, critic-free: prompt and completion ids as int64, completion mask, behaviour
   and reference log-probs, advantages as float32), raw and compressed.

Realistic trajectories are synthetic but shaped like real ones: token ids drawn from a Zipf(1.1) law over a 151,936-token
vocabulary (Qwen2.5's), behaviour log-probs -Exp(1) (mean entropy ~1 nat per token), reference log-probs within
N(0, 0.05) of them, one advantage per sequence (group-relative advantages are constant over a completion). Compression
gains come from the int64 ids' zero high bytes and the constant advantages and mask; random float log-probs barely
compress, so the ratio is a fair estimate rather than a best case.

    OMP_NUM_THREADS=1 python scripts/benchmarks/benchmark_replay.py              # ~3 minutes on one CPU core
    python scripts/benchmarks/benchmark_replay.py --job_steps 0 --step_time 0.2  # skip the job: use this step time
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from trl_trapo.memory import ReplayBuffer, SumMinTree, Trajectory
from trl_trapo.memory.replay import compress_tensors


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "experiments"))  # runlib
from runlib import config_refusals_as_usage, non_negative_int, positive_float, positive_int  # noqa: E402


VOCAB = 151_936


def realistic_trajectory(rng: np.random.Generator, prompt_len: int, completion_len: int) -> Trajectory:
    ids = (rng.zipf(1.1, size=prompt_len + completion_len) - 1) % VOCAB
    old = -rng.exponential(1.0, size=completion_len).astype(np.float32)
    return Trajectory(
        prompt_ids=torch.from_numpy(ids[:prompt_len].astype(np.int64)),
        completion_ids=torch.from_numpy(ids[prompt_len:].astype(np.int64)),
        completion_mask=torch.ones(completion_len),
        old_per_token_logps=torch.from_numpy(old),
        ref_per_token_logps=torch.from_numpy(old + rng.normal(0, 0.05, size=completion_len).astype(np.float32)),
        advantages=torch.full((completion_len,), float(rng.normal())),
    )


def default_job_trajectory(rng: np.random.Generator) -> Trajectory:
    """A trajectory the size of the built-in job's: a 10-token prompt, up to 8 completion tokens, vocabulary 103."""
    completion_len = int(rng.integers(2, 9))
    trajectory = realistic_trajectory(rng, 10, completion_len)
    trajectory.prompt_ids %= 103
    trajectory.completion_ids %= 103
    return trajectory


def time_buffer(make, capacity: int, rl_rows: int, group: int, max_uses: int, steps: int, compress: bool) -> dict:
    """Mean seconds per step of (insert, sample, rows) in a steady state at full capacity."""
    rng = np.random.default_rng(0)
    pool = [make(rng) for _ in range(512)]  # a few distinct trajectories, cycled (building 50k takes long)
    buffer = ReplayBuffer(capacity=capacity, max_uses=max_uses, compress=compress, seed=0)
    start = time.perf_counter()
    for i in range(0, capacity, 1024):
        buffer.add([pool[(i + j) % len(pool)] for j in range(min(1024, capacity - i))])  # version 0
    prefill = time.perf_counter() - start
    while buffer.num_available(0):  # serve the pre-filled trajectories until used up: the steady state
        buffer.sample(min(1024, buffer.num_available(0)), 0)
    insert = sample = rows = 0.0
    round_size = math.ceil(rl_rows / group) * group
    cursor = 0
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        while buffer.num_available(step) < rl_rows:
            batch = [pool[(cursor + j) % len(pool)] for j in range(round_size)]
            cursor += round_size
            for trajectory in batch:  # sampled by this step's policy
                trajectory.version = step
            buffer.add(batch)
        t1 = time.perf_counter()
        served = buffer.sample(rl_rows, step)
        t2 = time.perf_counter()
        _ = [t.to_row() for t in served]
        t3 = time.perf_counter()
        insert, sample, rows = insert + t1 - t0, sample + t2 - t1, rows + t3 - t2
    assert len(buffer) == capacity
    return {
        "insert": insert / steps,
        "sample": sample / steps,
        "rows": rows / steps,
        "prefill_s": prefill,
        "bytes": buffer.nbytes,
    }


def default_job_config(steps: int):
    """The `TRAPOConfig` of examples/trapo.py's built-in job, curriculum compressed into `steps`.

    Raises:
        ValueError: TRAPOConfig's refusal of a setting (`main` checks it before anything is timed).
    """
    from trl_trapo import TRAPOConfig
    from trl_trapo.jobs.main import BUILTIN_DEFAULTS

    values = dict(BUILTIN_DEFAULTS)
    values.update(
        output_dir=tempfile.mkdtemp(),
        max_steps=steps,
        eval_strategy="no",
        logging_steps=10**6,
        warmup_steps=0,
        disable_tqdm=True,
    )
    return TRAPOConfig(**values)


def default_job_step_time(config) -> float:
    """Mean seconds per optimizer step of examples/trapo.py's built-in job with `config` (`default_job_config`)."""
    from trl_trapo import TRAPOTrainer
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, make_task_suite

    tokenizer = build_char_tokenizer()
    suite = make_task_suite(seed=0)
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=suite.reward_funcs,
        args=config,
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    start = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - start) / config.max_steps


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (numbers refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=positive_int, default=50_000)
    parser.add_argument(
        "--job_steps", type=non_negative_int, default=100, help="steps of the default job to time (0: skip)"
    )
    parser.add_argument(
        "--step_time", type=positive_float, default=None, help="use this step time (s) instead of timing"
    )
    parser.add_argument(
        "--rl_rows", type=positive_int, default=38, help="RL rows per step: 64 rows x 0.6 (last phase)"
    )
    parser.add_argument("--group", type=positive_int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--max_uses", type=positive_int, default=4, help="num_ppo_epochs")
    parser.add_argument("--steps", type=positive_int, default=400, help="buffer steps timed per configuration")
    return parser


def main() -> None:
    parser = make_parser()
    args = parser.parse_args()
    round_size = math.ceil(args.rl_rows / args.group) * args.group
    if round_size > args.capacity:  # a step could never find --rl_rows servable trajectories
        parser.error(
            f"argument --capacity: {args.capacity} is invalid: it must hold a generation round of {round_size} "
            f"trajectories (--rl_rows {args.rl_rows} rounded up to whole groups of --group {args.group})."
        )
    torch.set_num_threads(1)

    step_time = args.step_time
    if step_time is None and args.job_steps > 0:
        with config_refusals_as_usage(parser, {"max_steps": "--job_steps"}):
            config = default_job_config(args.job_steps)
        step_time = default_job_step_time(config)
    print(f"default job: {step_time * 1e3:.1f} ms per optimizer step" if step_time else "default job: not timed")

    rng = np.random.default_rng(1)
    samples = [realistic_trajectory(rng, 256, 256) for _ in range(200)]
    raw = statistics.mean(t.nbytes() for t in samples)
    packed = statistics.mean(len(compress_tensors(t.tensors())) for t in samples)
    print(f"bytes per trajectory (256 + 256 tokens): {raw:,.0f} raw, {packed:,.0f} zstd ({raw / packed:.2f}x)")
    print(
        f"  -> {args.capacity:,} trajectories: {raw * args.capacity / 2**30:.2f} GiB raw, "
        f"{packed * args.capacity / 2**30:.2f} GiB compressed"
    )

    print(
        f"buffer cost per step at capacity {args.capacity:,} ({args.rl_rows} RL rows per step, rounds of "
        f"{math.ceil(args.rl_rows / args.group) * args.group}, {args.max_uses} uses):"
    )
    cases = [
        ("default-job trajectories", default_job_trajectory, False),
        ("256+256 trajectories", lambda r: realistic_trajectory(r, 256, 256), False),
        ("256+256 trajectories, compressed", lambda r: realistic_trajectory(r, 256, 256), True),
    ]
    for name, make, compress in cases:
        result = time_buffer(make, args.capacity, args.rl_rows, args.group, args.max_uses, args.steps, compress)
        total = result["insert"] + result["sample"]
        share = f", {100 * total / step_time:.2f} % of a default-job step" if step_time else ""
        print(
            f"  {name:34s} insert {result['insert'] * 1e3:6.3f} ms + sample {result['sample'] * 1e3:6.3f} ms = "
            f"{total * 1e3:6.3f} ms{share}; +rows {result['rows'] * 1e3:.3f} ms; "
            f"{result['bytes'] / 2**20:,.0f} MiB held"
        )

    tree = SumMinTree(args.capacity)
    tree.set_all(torch.rand(args.capacity, dtype=torch.float64))
    start = time.perf_counter()
    for _ in range(200):
        picked = tree.find(torch.rand(13, dtype=torch.float64) * tree.total)
        tree.set(picked, torch.rand(13, dtype=torch.float64))
    elapsed = (time.perf_counter() - start) / 200
    print(
        f"prioritised SFT pool sum tree ({args.capacity:,} rows, 13 draws + 13 updates): {elapsed * 1e3:.3f} ms/step"
    )


if __name__ == "__main__":
    main()
