# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""TRAPOTrainer (RL only) against TRL's GRPOTrainer on the tiny VLM: time per optimizer step and peak memory.

    python scripts/benchmarks/benchmark_vlm.py          # 2 warm-up + 10 measured steps per trainer (~2-4 min on CPU)
    python scripts/benchmarks/benchmark_vlm.py --quick  # 1 + 2 steps, 4 prompts x 2 completions: the harness (~30 s)

The RL comparison of `benchmark_trainers.py` with images: two runs, each in its own child process (so its peak
memory is its own), one after the other. Both load the same tiny LLaVA (`vision_tasks.build_tiny_vlm(processor,
seed=--seed)`, 0.57 M parameters, saved once to a temporary directory), use the same processor
(`build_vlm_processor`), the same RL prompts (the rows of `make_visual_task_suite(--seed).rl_train` with images: 1 or
2 images of 56x56 pixels per prompt, 16 image tokens each; TRL 1.16's GRPOTrainer fails on a batch that mixes
text-only and image prompts, so the `text` family is left out for both) and reward (`exact_match_reward`), and per optimizer step generate
`--prompts` x `--num_generations` completions and train on them once. The GRPOConfig is derived from the TRAPOConfig
by `compare_pipelines.stage_configs`. Every completion is exactly `--seq_len` tokens (TRAPO `stop_token=None`, GRPO
`min_new_tokens`), so both do the same work. TRAPO has only RL data (no pretraining or SFT dataset: those objectives
are off); its exploration stays at its default (one batched `generate` call per round, as GRPO).

Measured as in `benchmark_trainers.py` (its `GenerationMeter` and step timer): per optimizer step, the interval
between consecutive `on_step_end` callbacks, with and without the time inside the policy's `generate`, on the
process CPU clock (`time.process_time`, all threads: the headline on a shared CPU machine) and the wall clock;
medians over `--steps` steps after `--warmup`. Peak memory: the child's peak resident set size (`ru_maxrss`, MiB) and
its rise over the value just before the trainer was built. Ratios are TRAPO / TRL; the target for step time and
memory is <= 1.10. Results go to `--output_json` (default `docs/results/vlm/cost.json`; with `--quick`, not
written unless given).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "experiments"))
sys.path.insert(0, os.path.join(ROOT, "scripts", "benchmarks"))

from benchmark_trainers import GenerationMeter, make_step_timer  # noqa: E402
from compare_pipelines import stage_configs  # noqa: E402
from runlib import (  # noqa: E402
    config_refusals_as_usage,
    int_range,
    launch_worker,
    non_negative_int,
    peak_rss_mb,
    positive_int,
    read_json,
    seed_int,
    versions,
    write_json_atomic,
)


TARGET = 1.10
OUTPUT = os.path.join(ROOT, "docs", "results", "vlm", "cost.json")
HEADLINE = (
    ("step_time_cpu_s", "step CPU s excl. generation (median)"),
    ("step_time_wall_s", "step wall s excl. generation (median)"),
    ("total_step_cpu_s", "step CPU s incl. generation (median)"),
    ("total_step_wall_s", "step wall s incl. generation (median)"),
    ("peak_rss_mib", "peak RSS MiB"),
    ("peak_rss_increase_mib", "peak RSS rise MiB"),
)


def trapo_config(spec: dict, output_dir: str):
    """The RL-only `TRAPOConfig` of both runs (the GRPOConfig is derived from it)."""
    from trl_trapo import TRAPOConfig

    return TRAPOConfig(
        output_dir=output_dir,
        max_steps=spec["warmup"] + spec["steps"],
        per_device_train_batch_size=spec["prompts"] * spec["num_generations"],
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        logging_steps=1000,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        seed=spec["seed"],
        use_cpu=True,
        dataloader_num_workers=0,
        num_generations=spec["num_generations"],
        response_length=spec["seq_len"],
        max_prompt_length=80,
        kl_coef=0.01,
        num_ppo_epochs=1,
        num_mini_batches=1,
        temperature=1.0,
        stop_token=None,  # fixed lengths (GRPO: min_new_tokens)
    )


def build_trainer(spec: dict, processor, dataset, reward_funcs, callbacks: list):
    """The run's `TRAPOTrainer` or `GRPOTrainer`, loading the saved model from `spec["model_dir"]`."""
    from trl import GRPOTrainer

    from trl_trapo import TRAPOTrainer

    config = trapo_config(spec, os.path.join(spec["workdir"], "trapo"))
    if spec["trainer"] == "trapo":
        return TRAPOTrainer(
            spec["model_dir"],
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=dataset,
            processing_class=processor,
            callbacks=callbacks,
        )
    steps = [0, 0, int(config.max_steps)]
    grpo_config = stage_configs(
        argparse.Namespace(config=config), steps, {"budget": "steps"}, os.path.join(spec["workdir"], "trl")
    )[2]
    grpo_config.generation_kwargs = {"min_new_tokens": spec["seq_len"]}
    return GRPOTrainer(
        model=spec["model_dir"],
        reward_funcs=reward_funcs,
        args=grpo_config,
        train_dataset=dataset,
        processing_class=processor,
        callbacks=callbacks,
    )


def worker(spec_path: str) -> None:
    """Run one trainer in this process and write its record (JSON) to `spec["result_path"]`.

    Raises:
        RuntimeError: if the trainer did not make `warmup + steps` optimizer steps.
    """
    import torch
    import trl  # noqa: F401  (both runs import the same modules: they start from the same memory)
    from trl import GRPOTrainer  # noqa: F401

    import trl_trapo  # noqa: F401
    from trl_trapo.jobs.vision import split_by_images
    from trl_trapo.tasks.vision import build_vlm_processor, make_visual_task_suite

    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    torch.set_num_threads(spec["threads"])
    load_start = os.getloadavg()
    processor = build_vlm_processor()
    suite = make_visual_task_suite(
        spec["seed"], num_pretrain_docs=0, num_sft_per_task=0, num_rl_per_task=64, num_eval_per_task=1
    )
    rss_before = peak_rss_mb()
    meter = GenerationMeter(None, lambda: None)  # fixed lengths: every generated position is a token
    timer = make_step_timer(meter, lambda: None)
    prompts = split_by_images(suite.rl_train)[0]  # TRL 1.16's GRPO cannot mix text-only and image prompts
    trainer = build_trainer(spec, processor, prompts, suite.reward_funcs, [timer])
    meter.instrument(trainer.accelerator.unwrap_model(trainer.model))
    started = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - started
    measured = timer.steps[spec["warmup"] :]
    if len(measured) != spec["steps"]:
        raise RuntimeError(f"{spec['trainer']}: expected {spec['steps']} measured steps, got {len(measured)}.")
    peak = peak_rss_mb()
    record = {
        "trainer": "TRAPOTrainer" if spec["trainer"] == "trapo" else "GRPOTrainer",
        "step_time_cpu_s": statistics.median(s["step_cpu_s"] for s in measured),
        "step_time_wall_s": statistics.median(s["step_wall_s"] for s in measured),
        "total_step_cpu_s": statistics.median(s["cpu_s"] for s in measured),
        "total_step_wall_s": statistics.median(s["wall_s"] for s in measured),
        "generation_cpu_s": statistics.median(s["generation_cpu_s"] for s in measured),
        "generate_calls_per_step": statistics.median(s["generate_calls"] for s in measured),
        "peak_rss_mib": peak,
        "rss_before_trainer_mib": rss_before,
        "peak_rss_increase_mib": peak - rss_before,
        "train_s": train_s,
        "steps": timer.steps,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    write_json_atomic(spec["result_path"], record)


def launch(spec: dict) -> dict:
    """Run one spec in a child process and return its record.

    Raises:
        runlib.ChildFailed: if the child fails, with the end of its log.
    """
    launch_worker(
        __file__,
        spec,
        os.path.join(spec["workdir"], "spec.json"),
        threads=spec["threads"],
        extra_env={"PYTHONWARNINGS": "ignore"},
        log_path=os.path.join(spec["workdir"], "log.txt"),
        name=spec["trainer"],
        tail_chars=4000,
    )
    return read_json(spec["result_path"])


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--prompts", type=positive_int, default=None, help="prompts per step (default 8; --quick: 4)")
    parser.add_argument(
        "--num_generations", type=int_range(2), default=None, help="completions per prompt, >= 2 (4; --quick: 2)"
    )
    parser.add_argument(
        "--seq_len", type=positive_int, default=12, help="completion tokens (the VLM job's response_length)"
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default=None, help="warm-up steps, not measured (2; --quick: 1)"
    )
    parser.add_argument("--steps", type=positive_int, default=None, help="measured steps (10; --quick: 2)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads per run")
    parser.add_argument("--seed", type=seed_int, default=0, help="model and task seed")
    parser.add_argument("--quick", action="store_true", help="a few steps, a small batch: the harness")
    parser.add_argument("--output_json", default=None, help="results (default docs/results/vlm/cost.json)")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run both trainers, print the table and the ratios, write the JSON.

    Returns:
        `{"runs": {"trl": record, "trapo": record}, "ratios": TRAPO / TRL per headline field, "settings": ...}`.

    Raises:
        RuntimeError: if a run fails.
    """
    parser = make_parser()
    args = parser.parse_args(argv)
    if args._worker:
        worker(args._worker)
        return {}
    quick = args.quick
    for name, full, small in (("prompts", 8, 4), ("num_generations", 4, 2), ("warmup", 2, 1), ("steps", 10, 2)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    output = args.output_json or (None if quick else OUTPUT)
    settings = {k: getattr(args, k) for k in ("prompts", "num_generations", "seq_len", "warmup", "steps", "threads")}
    settings["seed"] = args.seed
    flags = {"num_generations": "--num_generations", "response_length": "--seq_len", "seed": "--seed"}
    with tempfile.TemporaryDirectory(prefix="bench-vlm-") as workdir, config_refusals_as_usage(parser, flags):
        trapo_config(settings, workdir)  # both runs' settings, checked before the model is built
    from trl_trapo.tasks.vision import build_tiny_vlm, build_vlm_processor

    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench-vlm-") as workdir:
        model_dir = os.path.join(workdir, "model")
        processor = build_vlm_processor()
        build_tiny_vlm(processor, seed=args.seed).save_pretrained(model_dir)
        processor.save_pretrained(model_dir)
        for trainer in ("trl", "trapo"):
            spec = dict(settings, trainer=trainer, model_dir=model_dir, workdir=os.path.join(workdir, trainer))
            spec["result_path"] = os.path.join(workdir, f"{trainer}.json")
            runs[trainer] = launch(spec)
    ratios = {name: runs["trapo"][name] / runs["trl"][name] for name, _ in HEADLINE if runs["trl"][name]}
    lines = ["| measure | GRPOTrainer | TRAPOTrainer | ratio |", "|---|---|---|---|"]
    for name, label in HEADLINE:
        lines.append(
            f"| {label} | {runs['trl'][name]:.4g} | {runs['trapo'][name]:.4g} | {ratios.get(name, float('nan')):.3f} |"
        )
    payload = {
        "settings": settings,
        "runs": runs,
        "ratios": ratios,
        "target": TARGET,
        "table": "\n".join(lines),
        "versions": versions(),
        "cpu_count": os.cpu_count(),
    }
    print(payload["table"])
    headline = ratios.get("step_time_cpu_s", float("nan"))
    verdict = "within" if headline <= TARGET else "above"
    print(f"\nStep-time ratio (CPU, excl. generation): {headline:.3f} ({verdict} the {TARGET:.2f} target)")
    if output:
        write_json_atomic(output, payload)
        print(f"Written to {output}")
    return payload


if __name__ == "__main__":
    main()
