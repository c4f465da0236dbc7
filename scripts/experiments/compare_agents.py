# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Evidence: on the built-in agent task, TRAPO (traces + environment in one loop) against TRL's serial relay.

    python scripts/experiments/compare_agents.py           # 3 seeds; writes docs/results/agents/results.json
    python scripts/experiments/compare_agents.py --quick   # 1 seed, a few steps, small data: the harness (< 1 min)

Every argument this script does not know is an argument of the agent job (`examples/trapo_tools.py`, its
`AGENT_JOB_DEFAULTS`): the TRAPO arm *is* that job's configuration and the relay's stages are derived from it.

Per seed, three runs (each in its own process with `--jobs 2`, in this one with `--jobs 1`):

1. `base`: the main job (`examples/trapo.py`'s configuration, `--base_steps` steps, default 200) trains the tiny model on the
   built-in suite: pretraining corpus, demonstrations of `rev` / `nxt` / `min`, RL prompts of all four families. The
   base solves the other families and has never seen the agent task or a tool. Both arms start from its weights.
2. `trapo`: `TRAPOTrainer` with the agent job's configuration, `--max_steps` steps (default 500; the example's 600
   would make 3 seeds take ~30 min on 2 CPU cores): pretraining on the corpus, SFT on
   the traces (`assistant_only_loss=True`), RL on the agent prompts with `tools=[multiply]`, one loop.
3. `serial`: TRL's relay with the same budget: `trl.SFTTrainer` on the traces (`assistant_only_loss=True`), then
   `trl.GRPOTrainer` on the agent prompts with the same tools, reward and `max_tool_calling_iterations`, from the SFT
   stage's weights. The steps are split between the stages in the proportion of TRAPO's time-averaged SFT and RL row
   shares (`compare_pipelines.time_averaged_mixture`); the relay has no pretraining stage (the base already had its
   pretraining), so every one of its steps is on agent data while TRAPO shares its rows with the corpus. The stages'
   settings come from `compare_pipelines.stage_configs` (learning rate, schedule, batch, clipping, GRPO's
   `num_generations`, `beta` = `kl_coef`, `num_iterations` = `num_ppo_epochs`, `max_completion_length` =
   `response_length`, ...).

What is held equal: the base weights, the tokenizer (the compact tool template), the traces, RL prompts, tool and
reward, the optimizer steps (each with `per_device_train_batch_size * gradient_accumulation_steps` rows), the
learning rate and schedule. What is not: TRAPO's rows include the pretraining corpus (its third objective), the
relay's do not.

Measured after each run (and for the relay after its SFT stage), with [`trl_trapo.jobs.agent.evaluate`] on the same
held-out data: agent accuracy with the tool and without it, tool-call validity, and forgetting of the other families:
their greedy accuracy (plain prompts, as the base learned them) and the held-out pretraining loss (nats/token, the
last `--heldout_docs` documents, which no run trains on), before (the base) and after. Wall time is training only.
`--output_dir` keeps the runs (`runs/<arm>-seed<k>/result.json`, the base models); a run whose result was made by the
same settings and code is reused (`--rerun` runs it again). The summary goes to `--results` (default
`docs/results/agents/results.json`; with `--quick`, `<output_dir>/results.json`) and a table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import logging
import os
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # compare_pipelines, pipeline_measure, runlib

import runlib  # noqa: E402


logger = logging.getLogger("compare_agents")

ARMS = ("trapo", "serial")
# what `--quick` lowers (explicit command-line values win): a smoke run of the whole harness
QUICK_JOB = {
    "max_steps": 4,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 4,
    "response_length": 64,
    "num_traces": 64,
    "num_rl_prompts": 32,
    "num_eval": 8,
    "heldout_docs": 20,
}
QUICK_BASE_STEPS = 2
# what the full comparison lowers: 500 agent steps instead of the example's 600 (3 seeds x 3 runs stay within ~25 min
# on 2 CPU cores)
FULL_JOB = {"max_steps": 500}
FULL_BASE_STEPS = 200
HEADLINE = (
    ("agent_accuracy_with_tool", "acc. with tool"),
    ("agent_accuracy_without_tool", "acc. without"),
    ("agent_tool_call_validity", "call validity"),
    ("other_accuracy", "other families"),
    ("heldout_loss", "held-out loss"),
)


# =====================================================================================================================
# Command line
# =====================================================================================================================
def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other argument is passed to the agent job's parser (examples/trapo_tools.py).",
        allow_abbrev=False,
    )
    parser.add_argument("--output_dir", default="compare-agents-output", help="runs and base models go here")
    parser.add_argument("--results", default=None, help="summary JSON (default docs/results/agents/results.json)")
    parser.add_argument(
        "--seeds", type=runlib.seed_int, nargs="+", default=None, help="seeds (default 0 1 2; --quick: 0)"
    )
    parser.add_argument(
        "--base_steps", type=runlib.positive_int, default=None, help="steps of the base run (default 200)"
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, a few steps, small data: a smoke run")
    parser.add_argument(
        "--jobs", type=runlib.positive_int, default=None, help="runs in parallel (default 2; --quick: 1, in-process)"
    )
    parser.add_argument("--threads", type=runlib.positive_int, default=1, help="torch threads per run")
    parser.add_argument("--rerun", action="store_true", help="run again even where a result of the same code exists")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def resolve(args: argparse.Namespace, job_argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Fill the `--quick`-dependent defaults; the job arguments `--quick` lowers, unless given (each value's range is
    `make_parser`'s type)."""
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1, 2]
    if args.base_steps is None:
        args.base_steps = QUICK_BASE_STEPS if args.quick else FULL_BASE_STEPS
    if args.jobs is None:
        args.jobs = 1 if args.quick else 2
    if args.results is None:
        args.results = (
            os.path.join(args.output_dir, "results.json")
            if args.quick
            else os.path.join(ROOT, "docs", "results", "agents", "results.json")
        )
    given = {a.split("=", 1)[0].lstrip("-") for a in job_argv if a.startswith("--")}
    for name, value in (QUICK_JOB if args.quick else FULL_JOB).items():
        if name not in given:
            job_argv = [*job_argv, f"--{name}", str(value)]
    return args, job_argv


# =====================================================================================================================
# One run (in a worker process, or in this one with --jobs 1)
# =====================================================================================================================
def job_config(spec: dict, run_dir: str):
    """The agent job's `(AgentJobArguments, TRAPOConfig)` for this run: its arguments, the seed, the run directory."""
    from trl_trapo.jobs import agent as agent_job

    argv = [*spec["job_argv"], "--seed", str(spec["seed"]), "--output_dir", run_dir]
    return agent_job.parse_args(argv)


def comparison_data(job_args):
    """The agent job's data as both arms use it: traces only as SFT data (no other family's demonstrations), the
    built-in suite's corpus without its held-out documents, and the other families' held-out prompts as plain text
    (as the base learned them). Returns `(data, suite)`."""
    from trl_trapo.agents import use_tool_chat_template
    from trl_trapo.jobs.agent import AgentJobData
    from trl_trapo.tasks import build_char_tokenizer, make_task_suite
    from trl_trapo.tasks.agent import make_agent_task

    task = make_agent_task(
        job_args.task_seed, num_sft=job_args.num_traces, num_rl=job_args.num_rl_prompts, num_eval=job_args.num_eval
    )
    suite = make_task_suite(job_args.task_seed)
    cut = len(suite.pretrain) - job_args.heldout_docs
    data = AgentJobData(
        tokenizer=use_tool_chat_template(build_char_tokenizer()),
        task=task,
        pretrain=suite.pretrain.select(range(cut)),
        heldout_texts=suite.pretrain.select(range(cut, len(suite.pretrain)))["text"],
        sft=task.sft,
        other_eval=suite.eval,
    )
    return data, suite


def run_base(spec: dict, data, suite, config) -> dict:
    """The main job's configuration on the built-in suite for `base_steps` steps; the model is saved to `base/`."""
    from trl_trapo import TRAPOTrainer, cli
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model

    argv = ["--max_steps", str(spec["base_steps"]), "--seed", str(spec["seed"]), "--eval_strategy", "no"]
    argv += ["--output_dir", os.path.join(spec["run_dir"], "base"), "--disable_tqdm", "true"]
    if spec["quick"]:
        argv += ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1"]
    _, base_config, _ = cli.parse_args(argv)
    tokenizer = build_char_tokenizer()  # the main job's tokenizer: the same vocabulary, plain chat template
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=spec["seed"]),
        reward_funcs=suite.reward_funcs,
        args=base_config,
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        pretrain_dataset=data.pretrain,
        processing_class=tokenizer,
    )
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    trainer.save_model(base_config.output_dir)
    return {"train_s": train_s, "steps": trainer.state.global_step, "model": base_config.output_dir}


def run_trapo(spec: dict, data, model, config) -> dict:
    """TRAPOTrainer with the agent job's configuration, from the base weights."""
    from trl_trapo.jobs.agent import build_trainer

    trainer = build_trainer(data, config, model=model)
    start = time.perf_counter()
    trainer.train()
    return {"train_s": time.perf_counter() - start, "steps": trainer.state.global_step, "model": trainer.model}


def relay_steps(config) -> tuple[int, int]:
    """The relay's (SFT, RL) steps: `max_steps` split as TRAPO's time-averaged SFT and RL row shares."""
    from compare_pipelines import split_budget, time_averaged_mixture

    _, sft, rl = time_averaged_mixture(config, (True, True, True))
    sft_steps, rl_steps = split_budget(int(config.max_steps), (sft / (sft + rl), rl / (sft + rl)))
    return sft_steps, rl_steps


def run_serial(spec: dict, data, model, config, evaluate) -> dict:
    """TRL's SFTTrainer on the traces, then TRL's GRPOTrainer with the tools, from the base weights."""
    import dataclasses

    from compare_pipelines import Setup, stage_configs
    from trl import GRPOTrainer, SFTTrainer

    sft_steps, rl_steps = relay_steps(config)
    workdir = tempfile.mkdtemp(prefix="relay-", dir=spec["run_dir"])
    setup = Setup(
        None, config, None, True, data.tokenizer, data.pretrain, data.heldout_texts, data.sft, None, None, []
    )
    _, sft_config, grpo_config = stage_configs(setup, [0, sft_steps, rl_steps], {"budget": "steps"}, workdir)
    # the traces: every assistant turn (tool calls included), as TRAPO's assistant_only_loss trains them
    sft_config = dataclasses.replace(
        sft_config, completion_only_loss=None, assistant_only_loss=True, max_length=config.sft_max_length
    )
    grpo_config = dataclasses.replace(  # generation_batch_size is re-derived from steps_per_generation
        grpo_config, max_tool_calling_iterations=config.max_tool_calling_iterations, generation_batch_size=None
    )
    sft = SFTTrainer(
        model=model, args=sft_config, train_dataset=data.task.sft, processing_class=copy.deepcopy(data.tokenizer)
    )
    start = time.perf_counter()
    sft.train()
    sft_s = time.perf_counter() - start
    model = sft.accelerator.unwrap_model(sft.model)
    after_sft = evaluate(model)
    path = os.path.join(workdir, "after-sft")  # GRPOTrainer loads its reference model from a path
    model.save_pretrained(path)
    data.tokenizer.save_pretrained(path)
    grpo = GRPOTrainer(
        model=path,
        reward_funcs=data.task.reward_funcs,
        args=grpo_config,
        train_dataset=data.task.rl_train,
        processing_class=copy.deepcopy(data.tokenizer),
        tools=data.task.tools,
    )
    start = time.perf_counter()
    grpo.train()
    rl_s = time.perf_counter() - start
    tool_logs = [h for h in grpo.state.log_history if "tools/call_frequency" in h]
    return {
        "train_s": sft_s + rl_s,
        "steps": sft.state.global_step + grpo.state.global_step,
        "stages": [
            {"stage": "sft", "steps": sft.state.global_step, "train_s": sft_s, "metrics": after_sft},
            {
                "stage": "rl",
                "steps": grpo.state.global_step,
                "train_s": rl_s,
                "last_logged": {
                    k: v for k, v in (tool_logs[-1] if tool_logs else {}).items() if k.startswith(("tools/", "reward"))
                },
            },
        ],
        "model": grpo.accelerator.unwrap_model(grpo.model),
        "workdir": workdir,
    }


def worker(spec: dict) -> dict:
    """Run one (arm, seed) and write `<run_dir>/result.json`."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from trl_trapo.jobs.agent import evaluate as evaluate_job

    torch.set_num_threads(spec["threads"])
    os.makedirs(spec["run_dir"], exist_ok=True)
    job_args, config = job_config(spec, spec["run_dir"])
    data, suite = comparison_data(job_args)

    def evaluate(model) -> dict:
        return evaluate_job(model, data, config)

    load_start = os.getloadavg()
    if spec["arm"] == "base":
        info = run_base(spec, data, suite, config)
        model = AutoModelForCausalLM.from_pretrained(info.pop("model"))
    else:
        model = AutoModelForCausalLM.from_pretrained(spec["base_model"])
        if spec["arm"] == "trapo":
            info = run_trapo(spec, data, model, config)
        else:
            info = run_serial(spec, data, model, config, evaluate)
        model = info.pop("model")
        shutil.rmtree(info.pop("workdir", ""), ignore_errors=True)
    result = {
        "arm": spec["arm"],
        "seed": spec["seed"],
        **info,
        "metrics": evaluate(model),
        "learning_rate": config.learning_rate,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "key": spec["key"],
    }
    runlib.write_json_atomic(os.path.join(spec["run_dir"], "result.json"), result)
    return result


# =====================================================================================================================
# Orchestration
# =====================================================================================================================
def code_key(args, job_argv: list[str]) -> str:
    """What decides a run's numbers: the package, this script, its settings and the library versions."""
    import importlib.metadata

    from compare_pipelines import code_fingerprint

    digest = hashlib.sha256(code_fingerprint().encode())
    with open(os.path.abspath(__file__), "rb") as handle:
        digest.update(handle.read())
    digest.update(json.dumps([job_argv, args.base_steps, args.quick, args.threads]).encode())
    digest.update(importlib.metadata.version("trl").encode())
    return digest.hexdigest()[:16]


def run_all(specs: list[dict], jobs: int) -> list[dict]:
    """Launch every spec, `jobs` at a time (`jobs == 1`: in this process, in order); results in `specs`' order."""

    def run(spec: dict) -> dict:
        name = f"{spec['arm']}-seed{spec['seed']}"
        return runlib.run_cached(spec, worker, __file__, in_process=jobs == 1, name=name, log=logger)

    return runlib.map_jobs(run, specs, jobs)


def summarize(results: list[dict]) -> dict:
    """Per arm: mean, standard deviation, min, max and count over seeds (`runlib.describe`) of every headline
    metric, the forgetting (after minus the seed's base) and the training wall time."""
    bases = {r["seed"]: r for r in results if r["arm"] == "base"}
    summary = {}
    for arm in ("base", *ARMS):
        rows = [r for r in results if r["arm"] == arm]
        if not rows:
            continue
        values: dict[str, list[float]] = {}
        for r in rows:
            for name, _ in HEADLINE:
                values.setdefault(name, []).append(r["metrics"][name])
            if arm != "base":
                base = bases[r["seed"]]["metrics"]
                values.setdefault("other_accuracy_change", []).append(
                    r["metrics"]["other_accuracy"] - base["other_accuracy"]
                )
                values.setdefault("heldout_loss_change", []).append(
                    r["metrics"]["heldout_loss"] - base["heldout_loss"]
                )
            values.setdefault("train_s", []).append(r["train_s"])
        summary[arm] = {name: runlib.describe(v) for name, v in values.items()}
    return summary


def table(results: list[dict]) -> str:
    """One markdown row per run: the headline metrics and the training wall time."""
    bases = {r["seed"]: r["metrics"] for r in results if r["arm"] == "base"}
    header = (
        "| arm | seed | " + " | ".join(label for _, label in HEADLINE) + " | other families Δ | loss Δ | train (s) |"
    )
    lines = [header, "|" + "---|" * (len(HEADLINE) + 5)]
    for r in sorted(results, key=lambda r: (("base", *ARMS).index(r["arm"]), r["seed"])):
        m, b = r["metrics"], bases.get(r["seed"], r["metrics"])
        cells = [f"{m[name]:.3f}" for name, _ in HEADLINE]
        delta_acc = "" if r["arm"] == "base" else f"{m['other_accuracy'] - b['other_accuracy']:+.3f}"
        delta_loss = "" if r["arm"] == "base" else f"{m['heldout_loss'] - b['heldout_loss']:+.3f}"
        lines.append(
            f"| {r['arm']} | {r['seed']} | "
            + " | ".join(cells)
            + f" | {delta_acc} | {delta_loss} | {r['train_s']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser()
    args, job_argv = parser.parse_known_args(argv)
    if args._worker:
        with open(args._worker, encoding="utf-8") as handle:
            worker(json.load(handle))
        return {}
    from trl_trapo.jobs import agent as agent_job

    # a misspelt option of this script (`--qiuck`) is named as one, not as the agent job's unknown argument
    agent = runlib.Job(
        "the agent job (examples/trapo_tools.py)", "python examples/trapo_tools.py --help", agent_job.make_parser
    )
    runlib.check_job_arguments(parser, job_argv, [agent])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runlib.go_offline()
    args, job_argv = resolve(args, job_argv)

    _, config = agent_job.parse_args([*job_argv, "--output_dir", args.output_dir])  # bad job arguments fail here
    key = code_key(args, job_argv)
    started, load_start = time.perf_counter(), os.getloadavg()

    def spec(arm: str, seed: int) -> dict:
        return {
            "arm": arm,
            "seed": seed,
            "run_dir": os.path.abspath(os.path.join(args.output_dir, "runs", f"{arm}-seed{seed}")),
            "base_model": os.path.abspath(os.path.join(args.output_dir, "runs", f"base-seed{seed}", "base")),
            "job_argv": job_argv,
            "base_steps": args.base_steps,
            "quick": args.quick,
            "threads": args.threads,
            "rerun": args.rerun,
            "key": key,
        }

    results = run_all([spec("base", seed) for seed in args.seeds], args.jobs)
    results += run_all([spec(arm, seed) for seed in args.seeds for arm in ARMS], args.jobs)
    sft_steps, rl_steps = relay_steps(config)
    payload = {
        "command": " ".join(
            ["python", "scripts/experiments/compare_agents.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "job_argv": job_argv,
        "seeds": args.seeds,
        "budget": {
            "base_steps": args.base_steps,
            "agent_steps": int(config.max_steps),
            "relay_sft_steps": sft_steps,
            "relay_rl_steps": rl_steps,
            "rows_per_step": config.per_device_train_batch_size * config.gradient_accumulation_steps,
            "learning_rate": config.learning_rate,
        },
        "runs": [{k: v for k, v in r.items() if k != "key"} for r in results],
        "summary": summarize(results),
        "table": table(results),
        "machine": runlib.run_conditions(args.jobs, args.threads, load_start),
        "total_s": time.perf_counter() - started,
    }
    runlib.write_json_atomic(args.results, payload)
    print(payload["table"])
    print(f"\nWritten to {args.results} ({payload['total_s']:.0f} s).")
    return payload


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
