# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Which sampler/trainer mismatch correction keeps more useful samples, on synthetic long completions (CPU, seconds).

A sampler and a trainer hold the same weights but compute the logits differently: the sampler's are the trainer's
rounded to bf16 (plus optional Gaussian noise, `--noise`, for kernel differences). For each completion length, each
of `--rows` completions is sampled token by token from the sampler's softmax (optionally truncated to `--top_p`,
renormalised), and both engines' log-probs of the sampled tokens are kept: the sampler's as vLLM reports them
(`processed_logprobs`), the trainer's over the same kept support (`trl_trapo.sampler_correction.kept_support_logps`).
Then every mode of `vllm_importance_sampling_mode` is applied with the bounds given, and per mode it prints:

- `raw`: the mean ratio before the bound, over the mode's units (tokens, or sequences);
- `weight`: the mean weight after it;
- `clipped` / `masked`: the fraction of units the bound clipped or set to 0 (a clipped unit is kept, at the bound's
  weight rather than its ratio: a truncate mode that clips most units scales the gradient without correcting it);
- `seq kept`: the fraction of completions none of whose tokens got weight 0;
- `ESS`: the effective sample size of the per-token weights over all tokens, (sum w)^2 / (n sum w^2), as a fraction
  of n: 1 when every token counts equally, lower when a few tokens carry the gradient (Kish).

With `--top_p` < 1 it also prints the mean token ratio when the trainer's log-probs cover the whole vocabulary (what
TRL does, TRL issue #6789) against the kept support (TRAPO).

    python scripts/benchmarks/benchmark_is_modes.py
    python scripts/benchmarks/benchmark_is_modes.py --lengths 512 2048 --noise 0.02 --clip_min 0.5 --clip_max 2
    python scripts/benchmarks/benchmark_is_modes.py --top_p 0.8
"""

from __future__ import annotations

import argparse
import os
import sys

import torch


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))  # runlib

from runlib import float_range, fraction, non_negative_float, positive_int, seed_int  # noqa: E402

from trl_trapo.sampler_correction import MODES, kept_support_logps, sampler_importance_weights  # noqa: E402


def sample_completions(
    rows: int, length: int, vocab: int, scale: float, noise: float, top_p: float, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """`(rows, length)` log-probs of tokens drawn from the sampler: `sampler` (its processed log-probs), `trainer`
    (the trainer's over the same kept support) and `trainer_full` (over the whole vocabulary)."""
    out = {name: torch.zeros(rows, length) for name in ("sampler", "trainer", "trainer_full")}
    for row in range(rows):
        logits = torch.randn(length, vocab, generator=generator) * scale  # the trainer's (fp32)
        sampler_logits = logits.to(torch.bfloat16).float()  # the sampler's: rounded to bf16 ...
        if noise:
            sampler_logits = sampler_logits + noise * torch.randn(length, vocab, generator=generator)  # ... and noisy
        if top_p < 1:
            from transformers import TopPLogitsWarper

            sampler_logits = TopPLogitsWarper(top_p)(None, sampler_logits)
        sampler_logps = torch.log_softmax(sampler_logits, -1)
        tokens = torch.multinomial(sampler_logps.exp(), 1, generator=generator).squeeze(-1)
        out["sampler"][row] = sampler_logps.gather(-1, tokens[:, None]).squeeze(-1)
        out["trainer"][row] = kept_support_logps(logits, tokens, top_p=top_p)
        out["trainer_full"][row] = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    return out


def measure(log_ratio: torch.Tensor, mode: str, clip_max: float | None, clip_min: float | None) -> dict[str, float]:
    mask = torch.ones_like(log_ratio)
    correction = sampler_importance_weights(log_ratio, mask, mode, clip_max=clip_max, clip_min=clip_min)
    stats = correction.summary()
    weights = correction.weights.double()
    ess = float(weights.sum() ** 2 / (weights.numel() * (weights**2).sum())) if bool((weights > 0).any()) else 0.0
    return {
        "units": stats["units"],
        "raw": stats["raw_ratio/mean"],
        "weight": stats["ratio/mean"],
        "clipped": stats["clipped_frac"],
        "masked": stats["masked_frac"],
        "seq kept": float((weights > 0).all(-1).double().mean()),
        "ESS": ess,
    }


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (numbers refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--lengths", type=positive_int, nargs="+", default=[512, 1024, 2048], help="completion lengths"
    )
    parser.add_argument("--rows", type=positive_int, default=64, help="completions per length")
    parser.add_argument("--vocab", type=positive_int, default=1024, help="vocabulary size of the synthetic logits")
    parser.add_argument(
        "--scale", type=non_negative_float, default=4.0, help="standard deviation of the synthetic logits"
    )
    parser.add_argument(
        "--noise", type=non_negative_float, default=0.0, help="extra Gaussian noise on the sampler's logits"
    )
    parser.add_argument("--top_p", type=fraction, default=1.0, help="the sampler's top-p in (0, 1] (1: none)")
    parser.add_argument(
        "--clip_max", type=float_range(), default=3.0, help="C_max >= 1 (TRL's default 3.0); a negative value: None"
    )
    parser.add_argument(
        "--clip_min", type=float_range(0, 1), default=None, help="C_min in [0, 1] (default None, TRL's)"
    )
    parser.add_argument("--seed", type=seed_int, default=0)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser()
    args = parser.parse_args(argv)
    if 0 <= args.clip_max < 1:  # a ratio of 1 (sampler and trainer agree) would be clipped or masked
        parser.error(
            f"argument --clip_max: {args.clip_max} is invalid: use a bound >= 1, or a negative value for none."
        )
    if args.clip_min is not None and args.clip_max >= 0 and args.clip_min >= args.clip_max:
        parser.error(f"argument --clip_min: {args.clip_min} is invalid: use a bound below --clip_max={args.clip_max}.")
    if args.clip_max < 0 and args.clip_min is None:  # TRL's rule: a truncate mode needs a bound
        parser.error("argument --clip_max: the *_truncate modes need a bound: give --clip_max >= 1 or --clip_min.")
    clip_max = None if args.clip_max < 0 else args.clip_max
    generator = torch.Generator().manual_seed(args.seed)
    print(
        f"{args.rows} completions per length, vocabulary {args.vocab}, logits N(0, {args.scale}^2), sampler = bf16 "
        f"logits + N(0, {args.noise}^2) noise, top_p {args.top_p}; bounds [{args.clip_min}, {clip_max}]",
        flush=True,
    )
    results = {}
    columns = ("raw", "weight", "clipped", "masked", "seq kept", "ESS")
    for length in args.lengths:
        logps = sample_completions(args.rows, length, args.vocab, args.scale, args.noise, args.top_p, generator)
        log_ratio = logps["trainer"] - logps["sampler"]
        per_token = log_ratio.flatten()
        print(
            f"\nlength {length}: |log ratio| per token mean {float(per_token.abs().mean()):.4f}, "
            f"sum per completion mean {float(log_ratio.sum(-1).mean()):+.3f} (std {float(log_ratio.sum(-1).std()):.3f})"
        )
        if args.top_p < 1:
            full = (logps["trainer_full"] - logps["sampler"]).exp().mean()
            kept = log_ratio.exp().mean()
            print(f"  token ratio mean: trainer over the full vocabulary {float(full):.3f}, over the kept support "
                  f"{float(kept):.3f}")  # fmt: skip
        print(f"  {'mode':<22}" + "".join(f"{c:>10}" for c in columns))
        results[length] = {}
        for mode in MODES:
            row = measure(log_ratio, mode, clip_max, args.clip_min)
            results[length][mode] = row
            print(f"  {mode:<22}" + "".join(f"{row[c]:>10.3f}" for c in columns))
    return results


if __name__ == "__main__":
    main()
