# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What the real SmolLM2-135M-Instruct costs on this machine: generation throughput and TRAPO step time / memory.

Needs the model folder `python scripts/fetch_smollm2.py` makes. Prints (and writes as JSON with `--output`):

1. **generate**: one `model.generate` of 8 GSM8K chat prompts (the first 8 training questions with SmolLM2's chat
   template, left-padded), greedy, exactly `--new_tokens` new tokens each (`min_new_tokens` = `max_new_tokens`, so
   every run decodes the same number of tokens) — wall time and tokens/s, after a short warm-up call.
2. **TRAPO steps**: full fine-tuning, all three objectives with a constant mixture (per step: 2 Shakespeare
   pretraining rows of `--pretrain_length` tokens, 2 GSM8K SFT rows, one GSM8K prompt with `--num_generations`
   completions of up to `--response_length` tokens, scored by `numeric_answer_reward`), `num_ppo_epochs=1` so that
   every step generates (the costliest case; PPO-style reuse would generate once every `num_ppo_epochs` steps). The
   time of each optimizer step (from the end of the previous one, so batch building and generation count) and the
   process's peak resident memory (`ru_maxrss`; it also covers the generate benchmark, which needs less).
3. with `--profile`: one more step under cProfile (clock: this process's CPU time), its time per phase (rollout
   round, training forward, backward, optimizer) and its top-10 functions by self time.

Wall times depend on what else runs on the machine; CPU times (this process's, one torch thread) much less.
Measured on this project's 2-core CPU machine (defaults, one torch thread): generate 77.7 tokens per CPU second; a
TRAPO step 29 CPU seconds — rollout round 7.7 (generate 6.0, reference log-probs 1.6), training forward + loss 7.7,
backward 14.4, fused AdamW 0.1 — and 7.6 GB peak memory (by arithmetic, not measured: 2.7 GB are the weights, the
reference copy, gradients and AdamW's moments; the rest activations and (B, T, 49152) logits).

    python scripts/benchmarks/benchmark_smollm2.py                      # ~3.5 min, 2 min of CPU (7.6 GB peak)
    python scripts/benchmarks/benchmark_smollm2.py --profile --output bench-smollm2.json
    python scripts/benchmarks/benchmark_smollm2.py --skip_generate --steps 6 --async_rollouts   # sync vs async

With `--async_rollouts` the rounds are sampled by a producer process with its own torch thread (trainer 1 thread +
producer 1 thread on 2 cores), asked for one step ahead (`--max_staleness 1`); the results add the producer's times,
the lag and the sampler/trainer log-prob gap (`sampling/*`: the producer's log-probs against the trainer's own when
the round arrives, i.e. the staleness of one optimizer step plus any numerical difference).
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import json
import os
import pstats
import resource
import sys
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import left_pad
from trl_trapo.models import ReferencePolicy
from trl_trapo.rewards import RewardScorer, numeric_answer_reward
from trl_trapo.rollout import generate as rollout_generate


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # scripts/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "experiments"))  # runlib
from fetch_smollm2 import default_output_dir, is_complete  # noqa: E402
from gsm8k_to_trl import clean_solution  # noqa: E402
from runlib import (  # noqa: E402
    config_refusals_as_usage,
    int_range,
    non_negative_int,
    peak_rss_mb,
    positive_int,
    write_json_atomic,
)


DATA = __file__.rsplit("/scripts/", 1)[0] + "/examples/data"
GSM8K_ROWS = 1500  # examples/data/gsm8k/train_first1500.jsonl


def gsm8k(n: int) -> list[dict]:
    with open(f"{DATA}/gsm8k/train_first1500.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for _, line in zip(range(n), handle)]


class StepTimer(TrainerCallback):
    """Wall and CPU time of each optimizer step, measured between consecutive step ends (so batch building and
    rollout generation, which the Trainer runs before `on_step_begin`, are counted); profiles the steps listed.

    The CPU time is this process's (`time.process_time`), and so is the profiler's clock: with one torch thread it is
    the compute the step needs, whatever other jobs on the machine take from the wall clock."""

    def __init__(self, profile_steps: set[int]):
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self.profile_steps = profile_steps
        self.profiler = cProfile.Profile(time.process_time)
        self._last = self._last_cpu = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._last, self._last_cpu = time.perf_counter(), time.process_time()
        if 1 in self.profile_steps:
            self.profiler.enable()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.profile_steps:
            self.profiler.disable()
        now, now_cpu = time.perf_counter(), time.process_time()
        self.times.append(now - self._last)
        self.cpu_times.append(now_cpu - self._last_cpu)
        self._last, self._last_cpu = now, now_cpu
        if state.global_step + 1 in self.profile_steps:
            self.profiler.enable()


def benchmark_generate(model, tokenizer, new_tokens: int, num_prompts: int) -> dict:
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": row["question"]}], tokenize=False, add_generation_prompt=True
        )
        for row in gsm8k(num_prompts)
    ]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    input_ids, attention_mask = left_pad(ids, tokenizer.pad_token_id)
    kwargs = dict(
        input_ids=input_ids, attention_mask=attention_mask, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    with torch.no_grad():
        model.generate(**kwargs, max_new_tokens=4)  # warm-up
        start, start_cpu = time.perf_counter(), time.process_time()
        out = model.generate(**kwargs, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    generated = out.shape[1] - input_ids.shape[1]
    return {
        "prompts": num_prompts,
        "prompt_tokens_max": int(input_ids.shape[1]),
        "new_tokens_per_prompt": int(generated),
        "seconds": round(seconds, 2),
        "tokens_per_second": round(num_prompts * generated / seconds, 1),
        "cpu_seconds": round(cpu_seconds, 2),
        "tokens_per_cpu_second": round(num_prompts * generated / cpu_seconds, 1),
    }


def trapo_config(args: argparse.Namespace, output_dir: str) -> TRAPOConfig:
    """The timed TRAPO run's configuration (`--steps`, one more with `--profile`).

    Raises:
        ValueError: TRAPOConfig's refusal of a setting (`main` checks it before anything is timed).
    """
    return TRAPOConfig(
        output_dir=output_dir,
        max_steps=args.steps + (1 if args.profile else 0),
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-5,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        curriculum_mixtures=[0.25, 0.25, 0.5] * 3,
        pretrain_max_length=args.pretrain_length,
        sft_max_length=512,
        max_prompt_length=256,
        response_length=args.response_length,
        num_generations=args.num_generations,
        num_ppo_epochs=1,
        seed=0,
        async_rollouts=args.async_rollouts,
        max_staleness=args.max_staleness if args.async_rollouts else None,  # used only there (else a warning)
    )


CONFIG_FLAGS = {
    "max_steps": "--steps",
    "per_device_train_batch_size": "--batch_size",
    "pretrain_max_length": "--pretrain_length",
    "response_length": "--response_length",
    "num_generations": "--num_generations",
    "max_staleness": "--max_staleness",
}
"""TRAPOConfig field -> the flag that sets it, for a refusal's message."""


def benchmark_trapo(model_dir: str, args: argparse.Namespace) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = gsm8k(64)
    with open(f"{DATA}/shakespeare/train.txt", encoding="utf-8") as handle:
        paragraphs = handle.read().split("\n\n")[:256]
    datasets = dict(
        train_dataset=Dataset.from_list(
            [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]} for r in rows]
        ),
        sft_dataset=Dataset.from_list(
            [
                {
                    "prompt": [{"role": "user", "content": r["question"]}],
                    "completion": [{"role": "assistant", "content": clean_solution(r["answer"])}],
                }
                for r in rows
            ]
        ),
        pretrain_dataset=Dataset.from_list([{"text": p} for p in paragraphs]),
    )
    steps = args.steps + (1 if args.profile else 0)
    timer = StepTimer({steps} if args.profile else set())
    with tempfile.TemporaryDirectory() as output_dir:
        config = trapo_config(args, output_dir)
        trainer = TRAPOTrainer(
            model,
            reward_funcs=numeric_answer_reward,
            args=config,
            processing_class=tokenizer,
            callbacks=[timer],
            **datasets,
        )
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    result = {
        "batch_size": args.batch_size,
        "num_generations": args.num_generations,
        "response_length": args.response_length,
        "step_seconds": [round(t, 1) for t in timer.times[: args.steps]],
        "step_cpu_seconds": [round(t, 1) for t in timer.cpu_times[: args.steps]],
        "loss": [entry["loss"] for entry in logs[: args.steps]],
        "completions_mean_length": [entry.get("completions/mean_length") for entry in logs[: args.steps]],
        "peak_rss_mb": round(peak_rss_mb()),
    }
    if args.async_rollouts:  # what the producer did, and the gap between its log-probs and the trainer's
        for key in ("sample/staleness_mean", "perf/rollout_wait_s", "perf/producer_generate_s",
                    "sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
                    "sampling/importance_sampling_ratio/mean"):  # fmt: skip
            result[key] = [entry.get(key) for entry in logs[: args.steps]]
        result["peak_rss_children_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    if args.profile:
        stream = io.StringIO()
        stats = pstats.Stats(timer.profiler, stream=stream).sort_stats("tottime")
        stats.print_stats(10)
        result["profiled_step_seconds"] = round(timer.times[-1], 1)
        result["profiled_step_cpu_seconds"] = round(timer.cpu_times[-1], 1)
        result["profile_phases_seconds"] = profile_phases(stats)
        result["profile_top10_by_self_time"] = stream.getvalue()
        if args.profile_output:
            stats.dump_stats(args.profile_output)
    return result


def _code(function) -> tuple[str, int, str]:
    # the function's own code, not a decorator's: every `@torch.no_grad()` function shares torch's one wrapper code
    # object, so matching the wrapper would give each no-grad phase the time of all of them
    code = inspect.unwrap(function).__code__
    return code.co_filename, code.co_firstlineno, code.co_name


# where a step's time goes: cumulative time of the functions that make up its phases — the rollout round contains
# generation, the reference log-probs and the rewards; backward is torch's C++ engine. Functions are matched by their
# code objects (file, first line, name), so a renamed or moved function fails loudly instead of reading 0.
PHASES = {
    "rollout round (generate + reference log-probs + rewards)": _code(TRAPOTrainer.collect_rollouts),
    "  generate (sampling, behaviour log-probs recorded)": _code(rollout_generate),
    "  reference log-probs (no-grad forward of the frozen copy)": _code(ReferencePolicy.logps),
    "  rewards (numeric_answer_reward, math-verify)": _code(RewardScorer.score),
    "training forward + loss (compute_loss)": _code(TRAPOTrainer.compute_loss),
    "backward": ("~", 0, "<method 'run_backward' of 'torch._C._EngineBase' objects>"),
    "optimizer step (AdamW)": _code(getattr(torch.optim.AdamW.step, "__wrapped__", torch.optim.AdamW.step)),
}


def profile_phases(stats: pstats.Stats) -> dict[str, float]:
    """Seconds per phase of `PHASES` (cumulative CPU time of the phase's function in the profiled step).

    Raises:
        KeyError: a phase's function never ran in the profiled step (e.g. renamed), instead of reporting 0.
    """
    out = {}
    for label, key in PHASES.items():
        if key not in stats.stats:
            if "reference" in label:  # no reference forward when kl_coef = 0 (not the case here)
                out[label] = 0.0
                continue
            raise KeyError(f"profile has no entry for {label!r} ({key}); update PHASES")
        out[label] = round(stats.stats[key][3], 1)
    return out


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (numbers refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", default=None, help="Model folder (default: where fetch_smollm2.py puts it).")
    parser.add_argument("--new_tokens", type=positive_int, default=160)
    parser.add_argument(
        "--num_prompts", type=int_range(1, GSM8K_ROWS), default=8, help=f"GSM8K prompts (1 to {GSM8K_ROWS})"
    )
    parser.add_argument("--steps", type=positive_int, default=2)
    parser.add_argument("--batch_size", type=positive_int, default=8)
    parser.add_argument(
        "--num_generations", type=int_range(2), default=4, help="completions per prompt (>= 2: no value model)"
    )
    parser.add_argument("--response_length", type=positive_int, default=64)
    parser.add_argument("--pretrain_length", type=int_range(2), default=256)
    parser.add_argument("--profile", action="store_true", help="Profile one extra TRAPO step with cProfile.")
    parser.add_argument("--profile_output", default=None, help="Also write the raw cProfile stats here.")
    parser.add_argument("--skip_generate", action="store_true")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch threads (default 1, as `accelerate launch` uses on CPU; on a machine shared with other jobs more "
        "threads than free cores make every operator wait at OpenMP barriers, and times balloon).",
    )
    parser.add_argument(
        "--async_rollouts",
        action="store_true",
        help="Sample in a producer process (its own torch thread) while the trainer trains: the step time then "
        "overlaps generation and rewards; the results add the producer's times and the sampler/trainer log-prob gap.",
    )
    parser.add_argument("--max_staleness", type=non_negative_int, default=1, help="With --async_rollouts (default 1).")
    parser.add_argument("--output", default=None, help="Write the results as JSON here.")
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.async_rollouts and args.profile:
        parser.error("--profile measures one process; with --async_rollouts the rollouts run in another: drop one.")
    with tempfile.TemporaryDirectory() as output_dir, config_refusals_as_usage(parser, CONFIG_FLAGS):
        trapo_config(args, output_dir)  # the TRAPO run's settings, checked before anything is timed
    torch.set_num_threads(args.threads)
    model_dir = str(args.model_dir or default_output_dir())
    if not is_complete(model_dir):
        parser.error(f"{model_dir} is not a materialised SmolLM2 folder: run `python scripts/fetch_smollm2.py` first.")
    results = {
        "torch_threads": torch.get_num_threads(),
        "load_average_start": os.getloadavg()[0],
        "model_dir": model_dir,
        "rss_start_mb": round(peak_rss_mb()),
    }
    if not args.skip_generate:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        results["generate"] = benchmark_generate(model, tokenizer, args.new_tokens, args.num_prompts)
        print(json.dumps(results["generate"]), flush=True)
        del model
    results["trapo"] = benchmark_trapo(model_dir, args)
    results["load_average_end"] = os.getloadavg()[0]
    profile = results["trapo"].pop("profile_top10_by_self_time", None)
    print(json.dumps(results, indent=1))
    if profile:
        print(profile)
        results["trapo"]["profile_top10_by_self_time"] = profile
    if args.output:
        write_json_atomic(args.output, results, sort_keys=False, newline=False)
    return results


if __name__ == "__main__":
    main()
