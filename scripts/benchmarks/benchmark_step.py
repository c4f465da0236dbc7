# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""How much a TRAPO step costs over a plain causal-LM step, and rollout throughput over plain `generate`.

Prints, for a Llama of >= 20M parameters at sequence length 512 (every row of every objective is 512 tokens):

1. **step ratio** = median TRAPO optimizer-step time / median plain causal-LM step time (forward + backward +
   gradient clipping + AdamW step) on the same number of tokens. The timed TRAPO region is the whole step —
   drawing and collating rows, reference log-probs, reward scoring, advantages, the joint loss, backward, optimizer —
   minus only the time spent inside token generation. Critic-free mode (the target, <= 1.15) and, separately,
   with a critic of the same size.
2. **rollout ratio** = tokens/s of TRAPO's rollout generation (`trl_trapo.samplers.generate`: left padding, behaviour
   log-probs recorded on the fly, truncation at the stop token) / tokens/s of plain `model.generate` on the same
   prompts with the same generation config. Target >= 0.9.

Medians over `--steps` steps after `--warmup` warm-up steps; the baseline is timed before and after the TRAPO run
(median of both) to cancel slow drift in machine load. On CPU the clock is this process's CPU time (`--clock`), which
other jobs on a shared machine change far less than wall time; still, prefer an otherwise idle machine:

    python scripts/benchmarks/benchmark_step.py           # ~25M parameters, 512 tokens, 4 rows per step (CPU: ~10 min)
    python scripts/benchmarks/benchmark_step.py --steps 20 --rows 8 --device cuda
    python scripts/benchmarks/benchmark_step.py --model_dir models/SmolLM2-135M-Instruct \
        --steps 4 --warmup 1 --skip_critic    # the real model (49,152-token vocabulary): ~15 min on 1 CPU thread
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    TrainerCallback,
)

import trl_trapo.evaluation as evaluation
import trl_trapo.rollout as rollout
import trl_trapo.samplers as samplers
from trl_trapo import TRAPOConfig, TRAPOTrainer


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "experiments"))  # runlib
from runlib import config_refusals_as_usage, int_range, non_negative_int, positive_int  # noqa: E402


SEQ = 512
PROMPT = 256


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2} | {f"t{i}": i + 3 for i in range(vocab_size - 3)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


MODEL_DIR: str | None = None  # --model_dir: a real model folder instead of the synthetic Llama
CLOCK = time.perf_counter  # --clock: wall time, or this process's CPU time (all threads)


def clock() -> float:
    """Seconds on the clock chosen with `--clock`."""
    return CLOCK()


def build_model(vocab_size: int, seed: int = 0, critic: bool = False):
    """The synthetic Llama (seeded), or with `--model_dir` that model's weights (fp32; a critic gets a fresh score
    head on them). Token ids are random either way: only shapes and the vocabulary size matter for cost."""
    if MODEL_DIR is not None:
        torch.manual_seed(seed)
        auto = AutoModelForSequenceClassification if critic else AutoModelForCausalLM
        extra = {"num_labels": 1} if critic else {}
        return auto.from_pretrained(MODEL_DIR, dtype=torch.float32, **extra)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=SEQ + 8,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        num_labels=1,
    )
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(config) if critic else LlamaForCausalLM(config)


def words(generator: torch.Generator, n: int, vocab_size: int) -> str:
    # ids >= 3 only: no special token (and so no early EOS) inside the text
    return " ".join(f"t{i}" for i in torch.randint(0, vocab_size - 3, (n,), generator=generator).tolist())


def datasets(vocab_size: int, size: int = 256):
    g = torch.Generator().manual_seed(0)
    pretrain = Dataset.from_dict({"text": [words(g, 4 * SEQ, vocab_size) for _ in range(size)]})
    sft = Dataset.from_dict(
        {
            "prompt": [words(g, PROMPT, vocab_size) for _ in range(size)],
            "completion": [words(g, SEQ - PROMPT - 1, vocab_size) for _ in range(size)],  # + EOS = 512 tokens
        }
    )
    rl = Dataset.from_dict({"prompt": [words(g, PROMPT, vocab_size) for _ in range(size)]})
    return pretrain, sft, rl


def length_reward(prompts, completions, **kwargs):
    return [len(c) / 1000.0 for c in completions]


def plain_steps(model, tokens: torch.Tensor, steps: int, warmup: int, device: str) -> list[float]:
    """Plain causal-LM steps on `tokens` (B, T): forward with labels, backward, clip, AdamW step."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = tokens.to(device)
    times = []
    for step in range(warmup + steps):
        start = clock()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(clock() - start)
    return times


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step (end to end), minus the time spent inside token generation."""

    def __init__(self):
        self.last = None
        self.times: list[float] = []
        self.generation = 0.0
        self.generated_tokens = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = clock()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = clock()
        self.times.append(now - self.last - self.generation)
        self.generation = 0.0
        self.last = now


def trapo_config(rows: int, steps: int, warmup: int, device: str) -> TRAPOConfig:
    """The timed TRAPO run's configuration: `warmup + steps` optimizer steps of `rows` rows, every row `SEQ` tokens.

    Raises:
        ValueError: TRAPOConfig's refusal of a setting (`main` checks it before anything is timed).
    """
    return TRAPOConfig(
        output_dir="/tmp/trapo-benchmark",
        max_steps=warmup + steps,
        per_device_train_batch_size=rows,
        learning_rate=1e-5,
        curriculum_mode="constant",  # the time-average of the default schedule: 34 / 40 / 26 % of rows
        pretrain_max_length=SEQ,
        sft_max_length=SEQ,
        max_prompt_length=PROMPT,
        response_length=SEQ - PROMPT,
        num_generations=2,
        stop_token=None,  # every completion is exactly SEQ - PROMPT tokens: the same tokens as the plain step
        kl_coef=0.05,
        logging_steps=10,
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        use_cpu=device == "cpu",
        bf16=False,
        disable_tqdm=True,
        seed=0,
    )


def trapo_steps(rows: int, steps: int, warmup: int, critic: bool, device: str, vocab_size: int) -> list[float]:
    tokenizer = build_tokenizer(vocab_size)
    pretrain, sft, rl = datasets(vocab_size)
    timer = StepTimer()
    original = rollout.generate
    # the modules that call `generate`: rollout rounds (the transformers sampler), and sample completions / evaluation
    callers = (samplers, evaluation)

    def timed_generate(*args, **kwargs):
        start = clock()
        out = original(*args, **kwargs)
        timer.generation += clock() - start
        return out

    for module in callers:
        module.generate = timed_generate
    args = trapo_config(rows, steps, warmup, device)
    trainer = TRAPOTrainer(
        build_model(vocab_size),
        reward_funcs=length_reward,
        args=args,
        train_dataset=rl,
        sft_dataset=sft,
        pretrain_dataset=pretrain,
        processing_class=tokenizer,
        value_model=build_model(vocab_size, seed=1, critic=True) if critic else None,
        callbacks=[timer],
    )
    try:
        trainer.train()
    finally:
        for module in callers:
            module.generate = original
    return timer.times[warmup:]


def rollout_ratio(prompts: int, new_tokens: int, device: str, vocab_size: int, repeats: int = 3) -> dict:
    model = build_model(vocab_size).to(device).eval()
    g = torch.Generator().manual_seed(1)
    prompt_ids = [torch.randint(3, vocab_size, (PROMPT,), generator=g).tolist() for _ in range(prompts)]
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # same number of tokens in both runs
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=0,
        eos_token_id=1,
    )
    input_ids = torch.tensor(prompt_ids, device=device)
    attention_mask = torch.ones_like(input_ids)
    plain, ours = [], []
    for _ in range(repeats):
        start = clock()
        with torch.no_grad():
            model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        plain.append(clock() - start)
        start = clock()
        rollout.generate(model, prompt_ids, config, 0, [1], 1.0)
        ours.append(clock() - start)
    tokens = prompts * new_tokens
    return {
        "plain_tokens_per_s": tokens / statistics.median(plain),
        "trapo_tokens_per_s": tokens / statistics.median(ours),
        "ratio": statistics.median(plain) / statistics.median(ours),
    }


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (counts refused below their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=positive_int, default=4, help="rows (sequences of 512 tokens) per optimizer step"
    )
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps per run (>= 1)")
    parser.add_argument("--warmup", type=non_negative_int, default=5, help="untimed first steps per run (>= 0)")
    parser.add_argument("--vocab_size", type=int_range(4), default=8000, help="synthetic vocabulary (>= 4)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip_critic", action="store_true")
    parser.add_argument(
        "--model_dir",
        default=None,
        help="Time a real model instead (e.g. models/SmolLM2-135M-Instruct from "
        "scripts/fetch_smollm2.py); --vocab_size then comes from its config.",
    )
    parser.add_argument(
        "--clock",
        default=None,
        choices=("cpu", "wall"),
        help="process CPU time (default on CPU: other jobs on a shared machine barely change it) or wall time "
        "(default on CUDA)",
    )
    parser.add_argument("--rollout_prompts", type=positive_int, default=8)
    parser.add_argument("--rollout_tokens", type=positive_int, default=64)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser()
    args = parser.parse_args(argv)
    # the TRAPO run's settings, checked before the baseline runs (TRAPOConfig's refusal as a usage error)
    with config_refusals_as_usage(parser, {"per_device_train_batch_size": "--rows"}):
        trapo_config(args.rows, args.steps, args.warmup, args.device)
    global MODEL_DIR, CLOCK
    MODEL_DIR = args.model_dir
    clock_name = args.clock or ("cpu" if args.device == "cpu" else "wall")
    CLOCK = time.process_time if clock_name == "cpu" else time.perf_counter
    if MODEL_DIR is not None:
        args.vocab_size = AutoConfig.from_pretrained(MODEL_DIR).vocab_size
    model = build_model(args.vocab_size)
    parameters = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(3, args.vocab_size, (args.rows, SEQ), generator=torch.Generator().manual_seed(2))
    before = plain_steps(model, tokens, args.steps, args.warmup, args.device)
    trapo = trapo_steps(args.rows, args.steps, args.warmup, False, args.device, args.vocab_size)
    after = plain_steps(build_model(args.vocab_size), tokens, args.steps, args.warmup, args.device)
    plain = statistics.median(before + after)
    results = {
        "parameters": parameters,
        "sequence_length": SEQ,
        "rows_per_step": args.rows,
        "plain_step_s": plain,
        "trapo_step_s": statistics.median(trapo),
        "step_ratio": statistics.median(trapo) / plain,
    }
    if not args.skip_critic:
        critic = trapo_steps(args.rows, args.steps, args.warmup, True, args.device, args.vocab_size)
        results["trapo_critic_step_s"] = statistics.median(critic)
        results["critic_step_ratio"] = statistics.median(critic) / plain
    results["rollout"] = rollout_ratio(args.rollout_prompts, args.rollout_tokens, args.device, args.vocab_size)
    results["model"] = MODEL_DIR or "synthetic Llama"
    results["clock"] = clock_name
    results["load_average"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
