# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Guidance on the real model: SmolLM2-135M-Instruct on GSM8K, ~20 TRAPO steps with and without demonstrations.

    python scripts/experiments/guidance_real.py            # two runs of 20 steps (~15 min each on one CPU core)
    python scripts/experiments/guidance_real.py --quick    # a tiny random model with SmolLM2's tokenizer (< 1 min)
    python scripts/experiments/guidance_real.py --write_docs  # the docs block from the committed results

Both arms are the CPU recipe (`examples/recipes/gsm8k_smollm2_135m_cpu.yaml`) with one change: a constant mixture of
25 % pretraining, 25 % SFT and 50 % RL rows (`curriculum_mixtures`), because the recipe's early phase gives a 20-step
run about one RL row per step — too few groups to count. The `with_guidance` arm adds `demonstration_column=solution`:
GSM8K's reference solution with its calculator annotations removed (as the SFT data has them), a column this script
adds to the RL prompts. What is read from the training logs (no GSM8K evaluation): per step, the mean reward of the
*sampled* completions (`objective/scores`: demonstrations are excluded from it), the fraction of groups whose sampled
completions all score the same (`rl/zero_variance_groups`) and the fraction that got a demonstration
(`rl/guided_groups`). Each arm runs in its own process; the results (`--output`, default
`docs/results/real_smollm2/guidance.json`) hold every logged step and the means over the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # compare_real, runlib
sys.path.insert(0, str(HERE.parent))  # gsm8k_to_trl, fetch_smollm2

from runlib import launch_worker, machine_line, positive_int, read_json, seed_int, write_json_atomic  # noqa: E402


RECIPE = ROOT / "examples" / "recipes" / "gsm8k_smollm2_135m_cpu.yaml"
OUTPUT = ROOT / "docs" / "results" / "real_smollm2" / "guidance.json"
MIXTURE = [0.25, 0.25, 0.5] * 3  # every curriculum phase: 25 % pretraining, 25 % SFT, 50 % RL rows
ARMS = {"without_guidance": [], "with_guidance": ["--demonstration_column", "solution"]}
KEYS = ("objective/scores", "rl/zero_variance_groups", "rl/guided_groups", "loss/rl", "loss/sft", "loss/pretrain")


def prepare_data(work: Path, quick: bool) -> Path:
    """The recipe's data (docs/real_models.md's conversion command) plus an RL copy with a `solution` column."""
    import compare_real
    from gsm8k_to_trl import clean_solution
    from gsm8k_to_trl import main as convert

    data = work / "data"
    if not (data / "rl" / "train.jsonl").is_file():
        argv = [a if a != "data/gsm8k-chat" else str(data) for a in compare_real.CONVERT_ARGV]
        convert([str(ROOT / a) if a.startswith("examples/") else a for a in argv])
    for split in ("train", "test"):  # the test prompts are only loaded (evaluation is off), never trained on
        rows = [json.loads(line) for line in (data / "rl" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        target = work / "rl-with-solutions" / f"{split}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            for row in rows[:32] if quick else rows:
                handle.write(json.dumps({**row, "solution": clean_solution(row["answer"])}) + "\n")
    return data


def job_argv(args, model: str, data: Path, work: Path, arm: str) -> list[str]:
    """The main job's command line of one arm."""
    argv = ["--config", str(args.recipe), "--model_name_or_path", model]
    argv += ["--dataset_name", str(work / "rl-with-solutions")]
    argv += ["--sft_dataset_name", str(data / "sft"), "--pretrain_dataset_name", str(data / "pretrain")]
    argv += ["--curriculum_mixtures", *map(str, MIXTURE), "--max_steps", str(args.max_steps)]
    argv += ["--output_dir", str(work / "runs" / arm), "--overwrite_output_dir", "--save_strategy", "no"]
    argv += ["--eval_strategy", "no"]
    argv += ["--logging_steps", "1", "--disable_tqdm", "true", "--seed", str(args.seed)]
    if args.quick:
        argv += ["--per_device_train_batch_size", "8", "--pretrain_max_length", "64"]
        argv += ["--sft_max_length", "128", "--max_prompt_length", "256"]
    return argv + ARMS[arm]


def run_arm(argv: list[str], output: Path) -> None:
    """Train one arm in this process and write its log history (worker mode)."""
    from trl import get_peft_config

    from trl_trapo import TRAPOTrainer, cli

    script_args, config, model_args = cli.parse_args(argv)
    inputs = cli.build_inputs(script_args, config, model_args)
    started = time.process_time()
    trainer = TRAPOTrainer(
        model=inputs.model,
        reward_funcs=inputs.reward_funcs,
        args=config,
        train_dataset=inputs.train_dataset,
        pretrain_dataset=inputs.pretrain_dataset,
        sft_dataset=inputs.sft_dataset,
        processing_class=inputs.tokenizer,
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    steps = [
        {"step": entry["step"], **{k: entry[k] for k in KEYS if k in entry}}
        for entry in trainer.state.log_history
        if "loss" in entry and "train_runtime" not in entry
    ]
    write_json_atomic(output, {"argv": argv, "cpu_s": time.process_time() - started, "steps": steps})


def summarise(steps: list[dict]) -> dict:
    """Means over the logged steps that measured each quantity (a step without a generation round has none)."""
    out = {}
    for key in KEYS:
        values = [s[key] for s in steps if key in s]
        out[key] = {"mean": sum(values) / len(values) if values else None, "steps": len(values)}
    return out


BLOCK = "guidance-real"


def render_block(results: dict) -> str:
    """The docs block: per arm, the means over the logged steps of the sampled completions' reward, the fraction
    of flat groups, the fraction of groups that got a demonstration and the RL loss, and the arm's CPU time."""

    def cell(summary: dict, key: str, digits: int = 3) -> str:
        mean = summary[key]["mean"]
        return "–" if mean is None else f"{mean:.{digits}f}"

    lines = [
        f"Measured by `{results['command']}` on {results['date']} ({results['machine']}), {results['max_steps']} "
        "steps per arm, one torch thread each:",
        "",
        "| arm | mean reward of the sampled completions | flat groups (`rl/zero_variance_groups`) | groups given "
        "a demonstration | `loss/rl` | CPU (min) |",
        "|---|---|---|---|---|---|",
    ]
    for arm, data in results["arms"].items():
        summary = data["summary"]
        lines.append(
            f"| `{arm}` | {cell(summary, 'objective/scores')} | {cell(summary, 'rl/zero_variance_groups', 2)} | "
            f"{cell(summary, 'rl/guided_groups', 2)} | {cell(summary, 'loss/rl', 4)} | {data['cpu_s'] / 60:.1f} |"
        )
    return "\n".join(lines) + "\n"


def make_parser() -> argparse.ArgumentParser:
    """The script's command line (numbers refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--max_steps", type=positive_int, default=20)
    parser.add_argument("--seed", type=seed_int, default=0)
    parser.add_argument("--work_dir", default="guidance-real-output", help="data, trainer outputs, per-arm logs")
    parser.add_argument("--output", default=None, help=f"results JSON (default {OUTPUT}; --quick: in --work_dir)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads of each arm's process")
    parser.add_argument("--quick", action="store_true", help="a tiny random model with SmolLM2's tokenizer")
    parser.add_argument("--write_docs", action="store_true", help="only render the docs block from --output")
    parser.add_argument("--_worker", nargs=2, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = make_parser().parse_args(argv)
    if args.write_docs:
        from result_blocks import write_block_from_results

        return write_block_from_results(BLOCK, render_block, args.output or OUTPUT)
    if args._worker:
        spec = json.loads(Path(args._worker[0]).read_text(encoding="utf-8"))
        run_arm(spec, Path(args._worker[1]))
        return {}
    import compare_real

    work = Path(args.work_dir).resolve()
    if args.quick:
        model = str(compare_real.make_tiny_model(work / "tiny-smollm2"))
        args.max_steps = min(args.max_steps, 3)
    else:
        import yaml

        model = compare_real.resolve_model(yaml.safe_load(Path(args.recipe).read_text(encoding="utf-8")))
    output = Path(args.output) if args.output else (work / "guidance.json" if args.quick else OUTPUT)
    data = prepare_data(work, args.quick)
    results = {
        "command": " ".join(["python scripts/experiments/guidance_real.py", *(argv or sys.argv[1:])]),
        "machine": machine_line(),
        "date": time.strftime("%Y-%m-%d"),
        "max_steps": args.max_steps,
        "arms": {},
    }
    for arm in ARMS:
        spec_path, arm_output = work / "logs" / f"{arm}.argv.json", work / "logs" / f"{arm}.json"
        run = launch_worker(
            __file__,
            job_argv(args, model, data, work, arm),
            spec_path,
            threads=args.threads,
            log_path=work / "logs" / f"{arm}.log",
            name=arm,
            worker_args=[str(arm_output)],
        )
        history = read_json(arm_output)
        results["arms"][arm] = {
            "wall_s": run.wall_s,
            "cpu_s": history["cpu_s"],
            "summary": summarise(history["steps"]),
            "steps": history["steps"],
        }
        print(arm, json.dumps(results["arms"][arm]["summary"]), flush=True)
    write_json_atomic(output, results)
    return results


if __name__ == "__main__":
    main()
