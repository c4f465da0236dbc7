# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Evidence: on the built-in visual task, TRAPO (one loop, three or five objectives) against TRL's serial relay.

    python scripts/experiments/compare_vlm.py                 # seeds 0 1 2; writes docs/results/vlm/results.json
    python scripts/experiments/compare_vlm.py --quick         # 1 seed, 4 steps, tiny data: the harness (< 1 min)
    python scripts/experiments/compare_vlm.py --write_docs  # docs/results/vision.md's vlm-table block from --results (no run)

Every argument this script does not know is an argument of the VLM job (`examples/trapo_vlm.py`, its
`VLM_JOB_DEFAULTS`): the TRAPO arms *are* that job's configuration and the relay's stages are derived from it.

Per seed `S`, every arm starts from a fresh tiny LLaVA (`build_tiny_vlm(processor, seed=S)`) and the same data
(`make_visual_task_suite(S)`: `--task_seed S`), for the same number of optimizer steps (`--max_steps`, default the
job's 900), each run in its own process (`--jobs 2` by default; `--jobs 1`, and `--quick`, run in this one):

1. `trapo`: `vision_job.build_trainer` with the job's configuration: pretraining on the captions, SFT on the
   demonstrations, RL on the prompts, one `TRAPOTrainer` (three objectives).
2. `trapo_modality`: the same with `--per_modality`: image rows and text rows of the captions and of the
   demonstrations as objectives of their own (five in all), weighed apart by DARE and the curriculum.
3. `serial`: TRL's relay. The steps are split in the proportion of TRAPO's time-averaged (pretrain, SFT, RL) row
   shares (`compare_pipelines.time_averaged_mixture` / `split_budget`); the stages' settings come from
   `compare_pipelines.stage_configs` (learning rate, schedule, batch, clipping, GRPO's `num_generations`, `beta` =
   `kl_coef`, `max_completion_length` = `response_length`, ...), with these changes for images:
   - `trl.SFTTrainer` on the captions: TRL 1.16's vision collator does language modelling on a `text` column with
     an `images` column (`DataCollatorForVisionLanguageModeling._collate_language_modeling`), so the captions go in
     as they are, with the eos text appended (the vision path adds none; TRAPO's pretraining rows end in eos).
     `packing=False` (TRL refuses packing for vision data) and `max_length=None` (a cut inside the image tokens
     fails). `remove_unused_columns=False`: for a vision dataset TRL keeps only `messages`, `prompt`,
     `completion` and `image(s)`, which would drop `text` (the captions have no other column). TRL's labels there include the image placeholder tokens (TRAPO's exclude them): the relay spends part
     of this stage's loss on predicting placeholders.
   - `trl.SFTTrainer` on the demonstrations (prompt/completion, completion-only loss), `max_length=None`.
   - `trl.GRPOTrainer` on the image rows of `rl_train` (`relay_rl_dataset`: TRL 1.16's GRPOTrainer fails on a batch
     that mixes text-only and image prompts, so the `text` family is left out of the relay's RL stage) with the
     suite's reward and the same processor (TRL suppresses the image token in generation itself, as TRAPO does),
     from the SFT stage's weights saved to disk.
   TRL removes the columns its collators do not use (`remove_unused_columns=True`); GRPO still hands `answer` and
   `task` to the reward (see `trl_trapo/tasks/vision.py`'s docstring).

Measured per run, with `vision_job.evaluate` on the suite's held-out data: greedy exact-match accuracy on
`suite.eval` (overall, per split `sft_tasks` / `rl_only`, per family) and the caption loss (nats/token) of
`suite.eval_captions`, which no run trains on (forgetting), before (the random init) and after; training wall time
(seconds, training only). `--work_dir` keeps the runs (`runs/<arm>-seed<k>/result.json`); a run whose result was
made by the same settings and code is reused (`--rerun` runs it again). The summary goes to `--results` (default
`docs/results/vlm/results.json`; with `--quick`, `<work_dir>/results.json`) and a table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # compare_pipelines, result_blocks, runlib

import runlib  # noqa: E402
from result_blocks import file_link, page_of, write_block_from_results  # noqa: E402


logger = logging.getLogger("compare_vlm")

ARMS = ("trapo", "trapo_modality", "serial")
RESULTS = os.path.join(ROOT, "docs", "results", "vlm", "results.json")
BLOCK = "vlm-table"
# what `--quick` lowers (explicit command-line values win): a smoke run of the whole harness
QUICK_JOB = {
    "max_steps": 4,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 4,
    "num_pretrain_docs": 32,
    "num_sft_per_task": 8,
    "num_rl_per_task": 8,
    "num_eval_per_task": 4,
    "num_eval_captions": 4,
    "logging_steps": 1,
}
HEADLINE = (
    ("accuracy", "accuracy"),
    ("accuracy_sft_tasks", "sft_tasks"),
    ("accuracy_rl_only", "rl_only"),
    ("caption_loss", "caption loss"),
)


# =====================================================================================================================
# Command line
# =====================================================================================================================
def make_parser() -> argparse.ArgumentParser:
    """The script's parser; unknown arguments are the VLM job's (`parse_known_args`)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other argument is passed to the VLM job's parser (examples/trapo_vlm.py).",
        allow_abbrev=False,
    )
    parser.add_argument("--work_dir", default="compare-vlm-output", help="runs go here (runs/<arm>-seed<k>/)")
    parser.add_argument("--results", default=None, help="summary JSON (default docs/results/vlm/results.json)")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="arms to run (default all)")
    parser.add_argument(
        "--seeds", type=runlib.seed_int, nargs="+", default=None, help="seeds (default 0 1 2; --quick: 0)"
    )
    parser.add_argument(
        "--max_steps",
        type=runlib.positive_int,
        default=None,
        help="optimizer steps of every arm (default: the job's, 900)",
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 steps, tiny data: a smoke run")
    parser.add_argument(
        "--jobs", type=runlib.positive_int, default=None, help="runs in parallel (default 2; --quick: 1, in-process)"
    )
    parser.add_argument("--threads", type=runlib.positive_int, default=1, help="torch threads per run")
    parser.add_argument("--rerun", action="store_true", help="run again even where a result of the same code exists")
    parser.add_argument(
        "--collect_only",
        action="store_true",
        help="run nothing: summarize the finished runs of the same code (the others are listed under `missing`)",
    )
    parser.add_argument("--write_docs", action="store_true", help="only render the docs block from --results")
    parser.add_argument("--page", default=str(page_of(BLOCK)), help="the page to write with --write_docs")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def resolve(args: argparse.Namespace, job_argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Fill the `--quick`-dependent defaults and add the job arguments `--quick` lowers, unless given (each value's
    range is `make_parser`'s type)."""
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1, 2]
    if args.jobs is None:
        args.jobs = 1 if args.quick else 2
    if args.results is None:
        args.results = os.path.join(args.work_dir, "results.json") if args.quick else RESULTS
    given = {a.split("=", 1)[0].lstrip("-") for a in job_argv if a.startswith("--")}
    lowered = dict(QUICK_JOB) if args.quick else {}
    if args.max_steps is not None:
        lowered["max_steps"] = args.max_steps
    for name, value in lowered.items():
        if name not in given:
            job_argv = [*job_argv, f"--{name}", str(value)]
    return args, job_argv


# =====================================================================================================================
# One run (in a worker process, or in this one with --jobs 1)
# =====================================================================================================================
def job_config(spec: dict, run_dir: str):
    """The VLM job's `(VisionJobArguments, TRAPOConfig)` of this run: its arguments, the seed (model and task suite),
    the run directory, and `--per_modality` for the `trapo_modality` arm."""
    from trl_trapo.jobs import vision as vision_job

    argv = [*spec["job_argv"], "--seed", str(spec["seed"]), "--task_seed", str(spec["seed"]), "--output_dir", run_dir]
    if spec["arm"] == "trapo_modality":
        argv.append("--per_modality")
    return vision_job.parse_args(argv)


def relay_steps(config) -> list[int]:
    """The relay's `[pretrain, sft, rl]` steps: `config.max_steps` split as TRAPO's time-averaged row shares."""
    from compare_pipelines import split_budget, time_averaged_mixture

    shares = time_averaged_mixture(config, (True, True, True))
    return split_budget(int(config.max_steps), shares)


def run_trapo(data, config) -> dict:
    """`TRAPOTrainer` from `vision_job.build_trainer` (three or, per modality, five objectives) on a fresh model.

    Returns:
        `{"train_s": seconds of trainer.train(), "steps": optimizer steps, "model": the trained model}`.
    """
    from trl_trapo.jobs.vision import build_trainer

    trainer = build_trainer(data, config)
    start = time.perf_counter()
    trainer.train()
    return {"train_s": time.perf_counter() - start, "steps": trainer.state.global_step, "model": trainer.model}


def relay_configs(config, steps: list[int], workdir: str) -> list:
    """The relay's `[SFTConfig (captions), SFTConfig (demonstrations), GRPOConfig]` from `stage_configs`, with the
    changes images need (module docstring): no packing and no truncation in the SFT stages."""
    import dataclasses

    from compare_pipelines import Setup, stage_configs

    setup = Setup(None, config, None, True, None, None, [], None, None, None, [])
    pretrain_config, sft_config, grpo_config = stage_configs(setup, steps, {"budget": "steps"}, workdir)
    if pretrain_config is not None:
        # TRL keeps only messages/prompt/completion/image(s) of a vision dataset: `text` would be dropped
        pretrain_config = dataclasses.replace(
            pretrain_config, packing=False, max_length=None, remove_unused_columns=False
        )
    if sft_config is not None:
        sft_config = dataclasses.replace(sft_config, max_length=None)
    if grpo_config is not None:  # generation_batch_size is re-derived from steps_per_generation
        grpo_config = dataclasses.replace(grpo_config, generation_batch_size=None)
    return [pretrain_config, sft_config, grpo_config]


def relay_rl_dataset(rl_train):
    """The GRPO stage's prompts: the rows of `rl_train` with at least one image.

    TRL 1.16's `GRPOTrainer` cannot mix text-only and image prompts in one generation batch: it turns a text-only
    prompt's images into `None` (`_generate`) and the processor then fails with "only a single or a list of entries
    is supported but got type=<class 'NoneType'>". The relay's RL stage therefore leaves out the `text` family
    (text-only prompts; it keeps its SFT demonstrations), which TRAPO's RL objective trains on.
    """
    from trl_trapo.jobs.vision import split_by_images

    return split_by_images(rl_train)[0]


def run_serial(data, config, seed: int, workdir: str) -> dict:
    """TRL's relay on a fresh model: SFTTrainer on the captions, SFTTrainer on the demonstrations, GRPOTrainer on the
    RL prompts, each stage from the previous one's weights.

    Returns:
        `{"train_s": seconds of the three `train()` calls, "steps": their optimizer steps, "stages": per stage its
        name, steps and seconds, "model": the trained model}`.
    """
    from trl import GRPOTrainer, SFTTrainer

    from trl_trapo.tasks.vision import build_tiny_vlm

    steps = relay_steps(config)
    pretrain_config, sft_config, grpo_config = relay_configs(config, steps, workdir)
    suite, processor = data.suite, data.processor
    eos = processor.tokenizer.eos_token
    model = build_tiny_vlm(processor, seed=seed)
    stages, trainer = [], None
    if pretrain_config is not None:
        captions = suite.pretrain.map(lambda row: {"text": row["text"] + eos})  # TRL's vision path adds no eos
        trainer = SFTTrainer(
            model=model, args=pretrain_config, train_dataset=captions, processing_class=copy.deepcopy(processor)
        )
        start = time.perf_counter()
        trainer.train()
        stages.append(("pretrain", trainer, time.perf_counter() - start))
        model = trainer.accelerator.unwrap_model(trainer.model)
    if sft_config is not None:
        trainer = SFTTrainer(
            model=model, args=sft_config, train_dataset=suite.sft, processing_class=copy.deepcopy(processor)
        )
        start = time.perf_counter()
        trainer.train()
        stages.append(("sft", trainer, time.perf_counter() - start))
        model = trainer.accelerator.unwrap_model(trainer.model)
    if grpo_config is not None:
        path = os.path.join(workdir, "before-rl")  # GRPOTrainer loads its reference model from a path
        model.save_pretrained(path)
        processor.save_pretrained(path)
        trainer = GRPOTrainer(
            model=path,
            reward_funcs=suite.reward_funcs,
            args=grpo_config,
            train_dataset=relay_rl_dataset(suite.rl_train),
            processing_class=copy.deepcopy(processor),
        )
        start = time.perf_counter()
        trainer.train()
        stages.append(("rl", trainer, time.perf_counter() - start))
        model = trainer.accelerator.unwrap_model(trainer.model)
    return {
        "train_s": sum(seconds for _, _, seconds in stages),
        "steps": sum(t.state.global_step for _, t, _ in stages),
        "stages": [
            {"stage": name, "planned_steps": planned, "steps": t.state.global_step, "train_s": seconds}
            for (name, t, seconds), planned in zip(stages, [s for s in steps if s])
        ],
        "model": model,
    }


def worker(spec: dict) -> dict:
    """Run one (arm, seed): evaluate the fresh model, train, evaluate again; write `<run_dir>/result.json`.

    Returns:
        The result: `arm`, `seed`, `steps`, `train_s` (seconds), `initial` and `metrics` (each `vision_job.evaluate`'s
        dict: accuracies in [0, 1], `caption_loss` in nats/token), for `serial` its `stages`, load averages, `key`.
    """
    import shutil

    import torch

    from trl_trapo.jobs.vision import build_data, evaluate
    from trl_trapo.tasks.vision import build_tiny_vlm

    torch.set_num_threads(spec["threads"])
    os.makedirs(spec["run_dir"], exist_ok=True)
    job_args, config = job_config(spec, spec["run_dir"])
    data = build_data(job_args)
    initial = evaluate(build_tiny_vlm(data.processor, seed=spec["seed"]), data)  # the init every arm starts from
    load_start = os.getloadavg()
    if spec["arm"] == "serial":
        workdir = tempfile.mkdtemp(prefix="relay-", dir=spec["run_dir"])
        info = run_serial(data, config, spec["seed"], workdir)
    else:
        workdir = None
        info = run_trapo(data, config)
    model = info.pop("model")
    result = {
        "arm": spec["arm"],
        "seed": spec["seed"],
        **info,
        "initial": initial,
        "metrics": evaluate(model, data),
        "learning_rate": config.learning_rate,
        "rows_per_step": config.per_device_train_batch_size * config.gradient_accumulation_steps,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "key": spec["key"],
    }
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    runlib.write_json_atomic(os.path.join(spec["run_dir"], "result.json"), result)
    return result


# =====================================================================================================================
# Orchestration
# =====================================================================================================================
def code_key(args, job_argv: list[str], arm: str) -> str:
    """A 16-hex-digit key of what decides the numbers of an `arm`'s runs: the package, the functions of this script
    the arm executes (`RUN_FUNCTIONS[arm]`: editing the table, the docs or another arm keeps the finished runs), its
    settings and TRL's version
    (`compare_pipelines.code_fingerprint` covers the package, compare_pipelines and torch / transformers /
    datasets)."""
    import importlib.metadata
    import inspect

    from compare_pipelines import code_fingerprint

    digest = hashlib.sha256(code_fingerprint().encode())
    for function in RUN_FUNCTIONS[arm]:
        digest.update(inspect.getsource(globals()[function]).encode())
    digest.update(json.dumps(QUICK_JOB, sort_keys=True).encode())
    digest.update(json.dumps([job_argv, args.quick, args.threads]).encode())
    digest.update(importlib.metadata.version("trl").encode())
    return digest.hexdigest()[:16]


_TRAPO_FUNCTIONS = ("job_config", "run_trapo", "worker")
RUN_FUNCTIONS = {
    "trapo": _TRAPO_FUNCTIONS,
    "trapo_modality": _TRAPO_FUNCTIONS,
    "serial": ("job_config", "relay_steps", "relay_configs", "relay_rl_dataset", "run_serial", "worker"),
}


def run_all(specs: list[dict], jobs: int) -> list[dict]:
    """Launch every spec, `jobs` at a time (`jobs == 1`: in this process, in order); results in `specs`' order."""

    def run(spec: dict) -> dict:
        name = f"{spec['arm']}-seed{spec['seed']}"
        return runlib.run_cached(spec, worker, __file__, in_process=jobs == 1, name=name, log=logger)

    return runlib.map_jobs(run, specs, jobs)


def summarize(results: list[dict]) -> dict:
    """Per arm: mean, standard deviation, min and max over seeds of every headline metric, its change from the
    random init (`<name>_change`) and the training wall time (`train_s`, seconds)."""
    summary = {}
    for arm in ARMS:
        rows = [r for r in results if r["arm"] == arm]
        if not rows:
            continue
        values: dict[str, list[float]] = {}
        for r in rows:
            for name, _ in HEADLINE:
                values.setdefault(name, []).append(r["metrics"][name])
                values.setdefault(f"{name}_change", []).append(r["metrics"][name] - r["initial"][name])
            values.setdefault("train_s", []).append(r["train_s"])
        summary[arm] = {name: runlib.describe(v) for name, v in values.items()}
    return summary


def table(results: list[dict]) -> str:
    """Markdown: one row per arm with the mean over seeds of each headline metric and of the training wall time,
    then the per-seed values (`seed: value`, comma-separated) of accuracy, caption loss and wall time."""
    summary = summarize(results)
    header = "| arm | seeds | " + " | ".join(label for _, label in HEADLINE) + " | caption loss Δ | train (s) |"
    header += " per seed: accuracy / caption loss / train (s) |"
    lines = [header, "|" + "---|" * (len(HEADLINE) + 5)]
    initial = {r["seed"]: r["initial"] for r in results}
    if initial:
        m = {name: statistics.fmean(i[name] for i in initial.values()) for name, _ in HEADLINE}
        cells = " | ".join(f"{m[name]:.3f}" for name, _ in HEADLINE)
        per_seed = ", ".join(
            f"{seed}: {i['accuracy']:.3f} / {i['caption_loss']:.3f}" for seed, i in sorted(initial.items())
        )
        lines.append(f"| init | {len(initial)} | {cells} |  |  | {per_seed} |")
    for arm in ARMS:
        if arm not in summary:
            continue
        s, rows = summary[arm], sorted((r for r in results if r["arm"] == arm), key=lambda r: r["seed"])
        cells = " | ".join(f"{s[name]['mean']:.3f}" for name, _ in HEADLINE)
        per_seed = ", ".join(
            f"{r['seed']}: {r['metrics']['accuracy']:.3f} / {r['metrics']['caption_loss']:.3f} / {r['train_s']:.0f}"
            for r in rows
        )
        lines.append(
            f"| {arm} | {len(rows)} | {cells} | {s['caption_loss_change']['mean']:+.3f} | "
            f"{s['train_s']['mean']:.0f} | {per_seed} |"
        )
    return "\n".join(lines)


def render_block(data: dict) -> str:
    """The `vlm-table` block of docs/results/vision.md: how it was measured (budget, relay split, machine) and the table.

    Args:
        data: the contents of the results file (`budget`, `seeds`, `machine`, `table`).

    Returns:
        Markdown, ending with a newline.
    """
    budget, machine = data["budget"], data["machine"]
    load = ["/".join(f"{v:.1f}" for v in machine[k]) for k in ("loadavg_start", "loadavg_end")]
    versions = machine["versions"]
    intro = (
        f"Measured by `python scripts/experiments/compare_vlm.py` "
        f"({file_link('docs/results/vlm/results.json', BLOCK)}): seeds "
        f"{', '.join(map(str, data['seeds']))}, every arm from a fresh tiny LLaVA (0.57 M parameters) for "
        f"{budget['max_steps']} optimizer steps of {budget['rows_per_step']} rows; the relay (TRL `SFTTrainer` on the "
        f"captions, `SFTTrainer` on the demonstrations, `GRPOTrainer`) split them "
        f"{budget['relay_pretrain_steps']} / {budget['relay_sft_steps']} / {budget['relay_rl_steps']}. "
        f"{machine['cpu_count']} CPU cores, {machine['jobs']} runs at a time with {machine['threads']} torch "
        f"thread(s) each, load average {load[0]} at the start and {load[1]} at the end; torch {versions['torch']}, "
        f"transformers {versions['transformers']}, trl {versions['trl']}. Accuracy: greedy exact match on held-out "
        "images (`sft_tasks`: families with demonstrations; `rl_only`: `shape`, RL prompts only). Caption loss: "
        "nats/token on held-out captions (forgetting of pretraining); Δ from the random init. Train: training wall "
        "time, seconds (mean; per seed after the table's last bar)."
    )
    return intro + "\n\n" + data["table"] + "\n"


def main(argv: list[str] | None = None) -> dict:
    """Run the arms for the seeds (reusing finished runs) and write the results file; with `--write_docs`, only
    render the docs block from the results file.

    Returns:
        The results file's contents (`{}` in a worker process).

    Raises:
        SystemExit: from argparse, or for a bad VLM job argument.
        RuntimeError: if a run fails (with the end of its log).
    """
    parser = make_parser()
    args, job_argv = parser.parse_known_args(argv)
    if args._worker:
        with open(args._worker, encoding="utf-8") as handle:
            worker(json.load(handle))
        return {}
    if args.write_docs:
        return write_block_from_results(BLOCK, render_block, args.results or RESULTS, args.page)
    from trl_trapo.jobs import vision as vision_job

    # a misspelt option of this script (`--qiuck`) is named as one, not as the VLM job's unknown argument
    vlm = runlib.Job(
        "the VLM job (examples/trapo_vlm.py)", "python examples/trapo_vlm.py --help", vision_job.make_parser
    )
    runlib.check_job_arguments(parser, job_argv, [vlm])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runlib.go_offline()
    args, job_argv = resolve(args, job_argv)

    _, config = vision_job.parse_args([*job_argv, "--output_dir", args.work_dir])  # bad job arguments fail here
    started, load_start = time.perf_counter(), os.getloadavg()

    def spec(arm: str, seed: int) -> dict:
        return {
            "arm": arm,
            "seed": seed,
            "run_dir": os.path.abspath(os.path.join(args.work_dir, "runs", f"{arm}-seed{seed}")),
            "job_argv": job_argv,
            "quick": args.quick,
            "threads": args.threads,
            "rerun": args.rerun,
            "key": code_key(args, job_argv, arm),
        }

    specs = [spec(arm, seed) for seed in args.seeds for arm in args.arms]
    missing = []
    if args.collect_only:
        finished = [runlib.keyed_result(s["run_dir"], s["key"]) is not None for s in specs]
        missing = [f"{s['arm']}-seed{s['seed']}" for s, done in zip(specs, finished) if not done]
        specs = [s for s, done in zip(specs, finished) if done]
        if missing:
            logger.warning("--collect_only: no finished result for %s; left out.", ", ".join(missing))
    results = run_all(specs, args.jobs)
    pretrain_steps, sft_steps, rl_steps = relay_steps(config)
    payload = {
        "command": " ".join(
            ["python", "scripts/experiments/compare_vlm.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "job_argv": job_argv,
        "arms": list(args.arms),
        "seeds": args.seeds,
        "budget": {
            "max_steps": int(config.max_steps),
            "relay_pretrain_steps": pretrain_steps,
            "relay_sft_steps": sft_steps,
            "relay_rl_steps": rl_steps,
            "rows_per_step": config.per_device_train_batch_size * config.gradient_accumulation_steps,
            "learning_rate": config.learning_rate,
        },
        "runs": [{k: v for k, v in r.items() if k != "key"} for r in results],
        "missing": missing,
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
