# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Measure few-shot mode on the built-in tasks with a small SFT set: the same short job with and without it.

Each arm is the built-in job of `examples/trapo.py` (tiny Llama, character tokenizer, the same hyper-parameters) on
`make_task_suite(num_sft_per_task=...)` (50 demonstrations per SFT family by default: the few-shot regime), trained for
`--max_steps` steps, then evaluated by greedy exact-match accuracy on the held-out prompts, overall and per split
(`sft_tasks`: families with demonstrations; `rl_only`: families learned by RL alone). Arms:

- `baseline`: the default job;
- `fewshot`: the same with `fewshot_mode=True` (reuse up to 5, temperature annealed 1.0 -> 0.33, prototype preference),
  trained by `trl_trapo.experimental.fewshot.FewShotTRAPOTrainer`;
- `prioritized`: the default job with `sft_sampling="prioritized"` (optional);
- `fewshot_constant_temperature`, `fewshot_no_preference`, `fewshot_k2`: ablations of few-shot mode (optional).

Each run also reports the largest training-time KL to the reference it logged (`policy/kl_avg`, max over logs) and
the largest gradient norm, which show the instability of the k3 KL estimator at low temperatures.

    OMP_NUM_THREADS=1 python scripts/experiments/compare_fewshot.py --max_steps 400 --seeds 0 1
    python scripts/experiments/compare_fewshot.py --arms baseline fewshot prioritized --output fewshot.json

Prints one line per run and the mean over seeds per arm; `--output` writes everything as JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # runlib
from runlib import (  # noqa: E402
    config_refusals_as_usage,
    go_offline,
    positive_int,
    seed_int,
    write_json_atomic,
)


ARMS = {
    "baseline": {},
    "fewshot": {"fewshot_mode": True},
    "prioritized": {"sft_sampling": "prioritized"},
    # ablations of few-shot mode: without the temperature annealing / without the prototype preference
    "fewshot_constant_temperature": {"fewshot_mode": True, "fewshot_sigma": [0.3, 0.3]},
    "fewshot_no_preference": {"fewshot_mode": True, "fewshot_strength": 0.0},
    # few-shot mode with the k2 KL estimator (quadratic in the log-ratio; k3 is exponential on stale tokens)
    "fewshot_k2": {"fewshot_mode": True, "kl_estimator": "k2"},
}


def arm_config(arm: str, seed: int, max_steps: int, output_dir: str):
    """The arm's `TRAPOConfig`: the built-in job's settings, `max_steps`, `seed` and the arm's own.

    Raises:
        ValueError: TRAPOConfig's refusal of a setting (`main` checks every arm's before the first run).
    """
    from trl_trapo import TRAPOConfig
    from trl_trapo.jobs.main import BUILTIN_DEFAULTS

    values = dict(BUILTIN_DEFAULTS)
    values.update(output_dir=output_dir, max_steps=max_steps, eval_strategy="no")
    values.update(seed=seed, logging_steps=max(max_steps // 10, 1), disable_tqdm=True)
    values.update(ARMS[arm])
    return TRAPOConfig(**values)


def run(arm: str, seed: int, max_steps: int, num_sft_per_task: int) -> dict:
    from trl_trapo import TRAPOTrainer
    from trl_trapo.experimental.fewshot import FewShotTRAPOTrainer
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, greedy_accuracy, make_task_suite

    tokenizer = build_char_tokenizer()
    suite = make_task_suite(seed=0, num_sft_per_task=num_sft_per_task)
    config = arm_config(arm, seed, max_steps, tempfile.mkdtemp(prefix=f"fewshot-{arm}-"))
    trainer_class = FewShotTRAPOTrainer if config.fewshot_mode else TRAPOTrainer  # the extension's trainer
    trainer = trainer_class(
        build_tiny_model(tokenizer, seed=seed),
        reward_funcs=suite.reward_funcs,
        args=config,
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    accuracy = greedy_accuracy(trainer.model, tokenizer, suite.eval, max_new_tokens=trainer.args.response_length)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "arm": arm,
        "seed": seed,
        "train_seconds": seconds,
        "max_kl": max((h.get("policy/kl_avg", 0.0) for h in logs), default=0.0),
        "max_grad_norm": max((h.get("grad_norm", 0.0) for h in logs), default=0.0),
        **accuracy,
    }


def make_parser() -> argparse.ArgumentParser:
    """The script's command line (numbers refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=["baseline", "fewshot"], choices=sorted(ARMS))
    parser.add_argument("--seeds", nargs="+", type=seed_int, default=[0])
    parser.add_argument("--max_steps", type=positive_int, default=400)
    parser.add_argument("--num_sft_per_task", type=positive_int, default=50, help="SFT demonstrations per task family")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    return parser


def main() -> None:
    parser = make_parser()
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as output_dir, config_refusals_as_usage(parser, {"max_steps": "--max_steps"}):
        for arm in args.arms:  # every arm's settings, checked before the first run
            arm_config(arm, args.seeds[0], args.max_steps, output_dir)
    go_offline()
    results = []
    for seed in args.seeds:
        for arm in args.arms:
            result = run(arm, seed, args.max_steps, args.num_sft_per_task)
            results.append(result)
            splits = " ".join(
                f"{k[len('accuracy_') :]}={v:.3f}" for k, v in sorted(result.items()) if "accuracy_" in k
            )
            print(
                f"{arm:12s} seed {seed}: accuracy {result['accuracy']:.3f} ({splits}), "
                f"{result['train_seconds']:.0f} s, max policy/kl_avg {result['max_kl']:.3g}, "
                f"max grad_norm {result['max_grad_norm']:.3g}",
                flush=True,
            )
    print(f"\nmean over seeds {args.seeds}, {args.max_steps} steps, {args.num_sft_per_task} SFT rows per family:")
    summary = {}
    for arm in args.arms:
        rows = [r for r in results if r["arm"] == arm]
        keys = sorted(k for k in rows[0] if k.startswith(("accuracy", "max_")) or k == "train_seconds")
        summary[arm] = {k: statistics.mean(r[k] for r in rows) for k in keys}
        print(f"  {arm:12s} " + "  ".join(f"{k}={v:.3f}" for k, v in summary[arm].items()))
    if args.output:
        payload = {"args": vars(args), "runs": results, "summary": summary}
        write_json_atomic(args.output, payload, indent=2, sort_keys=False, newline=False)


if __name__ == "__main__":
    main()
