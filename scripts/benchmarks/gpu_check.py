# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""GPU check for a lent machine with no network: a short TRAPO job on a real-size, randomly initialised model.

Builds Qwen2.5-0.5B's architecture from its config (written below, nothing is downloaded) with random weights, a
character tokenizer padded to Qwen2.5's 151,936-token vocabulary, and the built-in task suite as data, then runs a
short joint pretraining + SFT + RL job — with transformers' `generate`, and again with vLLM (colocate mode) when vLLM
is importable — and prints, per run:

- training tokens/s (every token of every row the policy trained on, over the timed steps' wall time);
- MFU: model FLOPs utilisation of that throughput (`trl.trainer.utils.compute_mfu`, against the GPU's dense bf16
  peak), over the whole step and over the step minus generation;
- peak GPU memory (`torch.cuda.max_memory_allocated`);
- the share of step time spent in generation rounds (generate + reference / reward scoring), and the median step time.

The vLLM run also records the sampler/trainer mismatch its rounds logged last (`sampling/*`: vLLM's bf16 log-probs
against the trainer's, TRL's `vllm_importance_sampling_correction` at its defaults) in the JSON output.

The first `--warmup` steps are not timed. The whole script is meant to finish in under 8 minutes on one H100/H200
(`--time_budget_s` skips the vLLM run when the first one took too long). A tiny variant runs anywhere:

    python scripts/benchmarks/gpu_check.py                       # on the GPU machine
    python scripts/benchmarks/gpu_check.py --tiny --steps 4      # CPU smoke test (tests/test_gpu_check.py)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch


QWEN25_05B = dict(  # Qwen/Qwen2.5-0.5B-Instruct's config.json (architecture fields)
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    tie_word_embeddings=True,
    use_sliding_window=False,
    attention_dropout=0.0,
)
TINY = dict(QWEN25_05B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)  # fmt: skip
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}


def build_tokenizer(vocab_size: int):
    """The built-in character tokenizer, its vocabulary padded with `<x_i>` tokens to `vocab_size` entries, so that
    every id the random model can sample decodes (the fillers never occur in the data)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trl_trapo import tasks

    base = list(tasks.SPECIAL_TOKENS + tasks.CHARACTERS)
    vocab = {token: i for i, token in enumerate(base + [f"<x{i}>" for i in range(vocab_size - len(base))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=tasks.UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=tasks.PAD_TOKEN,
        eos_token=tasks.EOS_TOKEN,
        bos_token=tasks.BOS_TOKEN,
        unk_token=tasks.UNK_TOKEN,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.chat_template = tasks.CHAT_TEMPLATE
    return tokenizer


def build_model(arch: dict, tokenizer, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in arch.items() if k != "model_type"}
    fields.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    config = AutoConfig.for_model(arch["model_type"], **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


class Probe:
    """Wraps a trainer's step building and generation rounds with timers and a token counter."""

    def __init__(self, trainer, device: torch.device):
        self.device = device
        self.step_tokens: list[int] = []
        self.step_generation: list[float] = []
        self.step_ends: list[float] = []
        self._generation = 0.0
        build, generate = trainer.get_batch_samples, trainer.collect_rollouts

        def get_batch_samples(*args, **kwargs):
            batches, info = build(*args, **kwargs)
            self.step_tokens.append(int(sum(int(b["attention_mask"].sum()) for b in batches)))
            return batches, info

        def generate_round(*args, **kwargs):
            self._sync()
            start = time.perf_counter()
            result = generate(*args, **kwargs)
            self._sync()
            self._generation += time.perf_counter() - start
            return result

        trainer.get_batch_samples = get_batch_samples
        trainer.collect_rollouts = generate_round
        from transformers import TrainerCallback

        probe = self

        class StepEnd(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                probe._sync()
                probe.step_ends.append(time.perf_counter())
                probe.step_generation.append(probe._generation)
                probe._generation = 0.0
                return control

        trainer.add_callback(StepEnd())

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def run(name: str, arch: dict, args, device: torch.device, use_vllm: bool) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import compute_flops_per_token, compute_mfu

    from trl_trapo import TRAPOConfig, TRAPOTrainer
    from trl_trapo.tasks import exact_match_reward, make_task_suite

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer = build_tokenizer(arch["vocab_size"])
    model = build_model(arch, tokenizer, dtype)
    workdir = tempfile.mkdtemp(prefix="trapo-gpu-check-")
    if use_vllm:  # vLLM loads the model from a directory
        model.save_pretrained(os.path.join(workdir, "model"))
        tokenizer.save_pretrained(os.path.join(workdir, "model"))
        model = AutoModelForCausalLM.from_pretrained(os.path.join(workdir, "model"), dtype=dtype)
    suite = make_task_suite(seed=0, num_pretrain_docs=400, num_sft_per_task=200, num_rl_per_task=200,
                            num_eval_per_task=2)  # fmt: skip
    long_text = Dataset.from_dict({"text": [" ".join(suite.pretrain["text"][i : i + 40]) for i in range(0, 400, 4)]})
    config = TRAPOConfig(
        output_dir=os.path.join(workdir, "out"),
        max_steps=args.steps + args.warmup,
        per_device_train_batch_size=args.rows,
        gradient_accumulation_steps=1,
        learning_rate=1e-5,
        logging_steps=max(args.steps, 1),
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        activation_checkpointing=False,
        use_cpu=device.type == "cpu",
        pretrain_max_length=args.seq_len,
        sft_max_length=args.seq_len,
        max_prompt_length=32,
        response_length=args.response_length,
        num_generations=8,
        num_ppo_epochs=2,  # as in the 7B recipes: each rollout is trained on twice
        local_rollout_forward_batch_size=64,
        curriculum_mode="constant",  # the same mixture every step, so steps are comparable
        kl_coef=0.05,
        use_vllm=use_vllm,
        vllm_gpu_memory_utilization=0.3,
        seed=0,
    )
    trainer = TRAPOTrainer(
        model,
        reward_funcs=exact_match_reward,
        args=config,
        train_dataset=suite.rl_train,
        pretrain_dataset=long_text,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    probe = Probe(trainer, trainer.accelerator.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    ends = probe.step_ends
    times = [b - a for a, b in zip(ends[args.warmup - 1 : -1], ends[args.warmup :])] if args.warmup else []
    if not args.warmup:
        times = [ends[0] - start] + [b - a for a, b in zip(ends[:-1], ends[1:])]
    timed = slice(len(ends) - len(times), len(ends))
    tokens = sum(probe.step_tokens[timed])
    generation = sum(probe.step_generation[timed])
    wall = sum(times)
    tokens_per_s = tokens / wall if wall else 0.0
    flops = compute_flops_per_token(trainer.model.config, args.seq_len)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    if peak is None and device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in gpu), None)
    train_wall = wall - generation
    result = {
        "run": name,
        "steps_timed": len(times),
        "tokens_per_s": tokens_per_s,
        "mfu_pct": compute_mfu(flops, tokens_per_s, 1, peak) if peak else None,
        "mfu_pct_without_generation": compute_mfu(flops, tokens / train_wall, 1, peak)
        if peak and train_wall
        else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "generation_share": generation / wall if wall else 0.0,
        "median_step_s": statistics.median(times) if times else None,
        "total_s": total,
        "parameters_m": sum(p.numel() for p in trainer.model.parameters()) / 1e6,
    }
    for entry in trainer.state.log_history:  # vLLM runs: the mismatch statistics, last logged values
        result.update({k: v for k, v in entry.items() if k.startswith("sampling/")})
    del trainer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model with a 512-token vocabulary (CPU test)")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    parser.add_argument("--rows", type=int, default=16, help="rows per optimizer step")
    parser.add_argument("--seq_len", type=int, default=512, help="pretraining / SFT row length (tokens)")
    parser.add_argument("--response_length", type=int, default=128, help="generated tokens per completion")
    parser.add_argument("--peak_tflops", type=float, default=None, help="dense peak TFLOP/s (default: from GPU name)")
    parser.add_argument("--time_budget_s", type=float, default=420, help="skip the vLLM run after this many seconds")
    parser.add_argument("--no_vllm", action="store_true", help="skip the vLLM run even if vLLM is importable")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.seq_len, args.response_length, args.rows = min(args.seq_len, 64), min(args.response_length, 16), 8
    arch = TINY if args.tiny else QWEN25_05B
    start = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}", flush=True)
    results = [run("hf-generate", arch, args, device, use_vllm=False)]
    try:
        import vllm  # noqa: F401

        has_vllm = device.type == "cuda"
    except ImportError:
        has_vllm = False
    if not has_vllm or args.no_vllm:
        print("vLLM run skipped: " + ("--no_vllm" if args.no_vllm else "vllm not importable or no GPU"), flush=True)
    elif time.perf_counter() - start > args.time_budget_s:
        print(f"vLLM run skipped: the first run used up the {args.time_budget_s:.0f} s budget", flush=True)
    else:
        try:
            results.append(run("vllm-colocate", arch, args, device, use_vllm=True))
        except Exception as error:  # report, do not hide the first run's numbers
            print(f"vLLM run failed: {type(error).__name__}: {error}", flush=True)
    header = ("run", "params (M)", "tokens/s", "MFU %", "MFU % w/o gen", "peak GiB", "gen share", "step s")
    print(" | ".join(header))
    for r in results:

        def fmt(value, spec):
            return "n/a" if value is None else format(value, spec)

        print(
            " | ".join(
                [
                    r["run"],
                    fmt(r["parameters_m"], ".1f"),
                    fmt(r["tokens_per_s"], ".0f"),
                    fmt(r["mfu_pct"], ".1f"),
                    fmt(r["mfu_pct_without_generation"], ".1f"),
                    fmt(r["peak_memory_gib"], ".2f"),
                    fmt(r["generation_share"], ".2f"),
                    fmt(r["median_step_s"], ".3f"),
                ]
            ),
            flush=True,
        )
    print(f"total wall time: {time.perf_counter() - start:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
