# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Evidence: TRAPO against the serial pipeline built from TRL's own trainers, on the same model, data and budget.

    python scripts/experiments/compare_pipelines.py                # LR search, then serial vs TRAPO, 3 seeds
    python scripts/experiments/compare_pipelines.py --quick        # 1 seed, short runs, no search (< 5 min)
    python scripts/experiments/compare_pipelines.py --ablations    # + TRAPO ablations
    python scripts/experiments/compare_pipelines.py --budget time  # same wall clock instead of same steps
    python scripts/experiments/compare_pipelines.py --model_name_or_path models/tiny --dataset_name data/rl \
        --sft_dataset_name data/sft --pretrain_dataset_name data/pretrain --reward_funcs numeric_answer

Every argument this script does not know is an argument of the main job, `examples/trapo.py` (its parser, its
`BUILTIN_DEFAULTS` when no model is named, `--config recipe.yaml`): the TRAPO arm *is* the main job's configuration,
and the serial arm is derived from it. On CPU there is no idle accelerator to reclaim, so this measures **sample
efficiency and forgetting, not device utilisation** (the source document's claimed wall-clock gain comes from GPUs
idling between stages, which a CPU run cannot show).

Methods (each run in its own process, so peak memory is its own):

- `serial`: three TRL trainers one after the other, each starting from the previous one's weights:
  1. `trl.SFTTrainer` on the pretraining corpus (`text`, language modelling on every token, documents packed with
     EOS between them into rows of `pretrain_max_length` tokens: `packing=True, packing_strategy="wrapped"`, which is
     how TRAPO packs its pretraining rows);
  2. `trl.SFTTrainer` on the SFT data (prompt-completion, `completion_only_loss=True`, `max_length=sft_max_length`);
  3. `trl.GRPOTrainer` on the RL prompts with the same reward functions.
- `trapo`: `TRAPOTrainer` with the main job's configuration (static weights + the phased curriculum; DARE was the
  default, with every multiplier 1, before the weighting benchmark's decision: pages measured then say so, and
  `--weighting dare --sft_weight 1 --rl_weight 1` reproduces them).
- with `--ablations`: `trapo_static` (`weighting=static`), `trapo_dare` (`weighting=dare`), `trapo_constant` (`curriculum_mode=constant`, the
  time-averaged mixture at every step), `trapo_no_pretrain` (`pretrain_weight=0`), `trapo_no_replay`
  (`num_ppo_epochs=1`: each trajectory trained on once), `trapo_no_exploration` (`exploration=False`),
  `trapo_no_self_imitation` (`self_imitation=False`), `trapo_previous_defaults` (both off), and one that *adds* the opt-in component: `trapo_guidance`
  (`demonstration_column="demonstration"`: the built-in suite's answers of the families with SFT data; `lst` has
  none).

What is held equal (every choice, so nothing is tuned for TRAPO that is not equally tuned for the baseline):

- the initial weights (the main job's model: for the built-in task, `build_tiny_model(tokenizer, seed=seed)`), the
  tokenizer, the seed, and the data (the same pretraining / SFT / RL / eval datasets; the last `--heldout_docs`
  pretraining documents are held out from *every* run to measure forgetting);
- the budget. `--budget steps` (default): the serial pipeline takes as many optimizer steps as TRAPO's `max_steps`,
  split across its stages in the proportions of TRAPO's time-averaged curriculum (the mean over steps of the row
  shares; 37 / 39 / 24 % pretrain / SFT / RL for the main job's 1,000 steps). Every step of either method has
  `per_device_train_batch_size * gradient_accumulation_steps` rows, so both see the same number of rows of each
  objective over the run. `--budget time`: each serial run gets the wall time (evaluation excluded) of the TRAPO run
  of the same seed, split across stages in the same proportions; a stage stops when its share is used, and its
  learning-rate schedule runs on the fraction of its time used (same shape, time instead of steps);
- the optimizer and schedule: learning rate, `lr_scheduler_type` and its kwargs, AdamW betas / epsilon, weight
  decay, gradient clipping, batch size, gradient accumulation, precision. Each serial stage runs the whole schedule
  over its own steps (warmup scaled to the stage: `warmup_steps * stage_steps / max_steps`), as three separate jobs
  would;
- sequence lengths: `pretrain_max_length`, `sft_max_length`, `response_length` (= GRPO `max_completion_length`);
- RL: GRPO `num_generations` = TRAPO `num_generations`; `beta` = `kl_coef` (both put a k3 KL in the loss for
  critic-free advantages); `num_iterations` = `num_ppo_epochs` (TRAPO uses each trajectory up to that many times;
  GRPO reuses each generation batch that many times); `epsilon` = `cliprange`; `loss_type`, `scale_rewards`,
  `temperature`, `top_p`, `top_k`, `mask_truncated_completions`, `entropy_coef`, `reward_weights` and the reference
  syncing (`sync_ref_model`, `ref_model_mixup_alpha`, `ref_model_sync_steps`) copied over;
- the learning rate: both arms get the same two-round search (on by default; `--no-lr_search` uses the main job's
  rate for both), each candidate a short run (`--lr_search_fraction` of the budget, seed `--lr_search_seed`, which is
  not an evaluation seed), the best final held-out accuracy winning (ties: the lower held-out pretraining loss).
  Round 1: `--lr_factors` (default 0.1, 0.3, 1, 3) times the main job's rate. Round 2: `--rl_lr_factors` (default
  0.1, 0.3, 1) times the round-1 winner as `rl_phase_learning_rate`, which is TRAPO's rate in its RL-heavy phase and
  the serial arm's rate for its GRPO stage (a fresh optimizer on a noisy RL gradient usually wants a lower rate than
  SFT). The main job's rate was chosen for TRAPO, so without the search the comparison would favour it (at that rate
  the serial GRPO stage took accuracy from 0.75 to 0 in a first comparison). Ablations use TRAPO's rates.

Metrics, at every `--eval_every` of the budget (both methods on the same grid of budget fractions; the serial
stages share one timeline and are also evaluated at each stage's end):

- held-out accuracy: greedy exact match on the held-out prompts, overall and per split (`sft_tasks`, `rl_only`);
  with your own data, the mean greedy reward of the held-out prompts;
- held-out pretraining loss (nats/token) on the held-out documents; forgetting = its rise above its best value so
  far in the same run;
- wall time of training (evaluation excluded; setup — building trainers, tokenising, saving between stages — is
  recorded separately as `setup_s`), CPU time, optimizer steps, tokens processed (non-padding tokens of the training
  forwards: prompt + completion for RL rows), generation time (inside `model.generate` during training) and peak
  resident memory of the run's process (`ru_maxrss`).

Output under `--output_dir`: `results.md` (the table: mean ± std over seeds), `checkpoints.csv` (every checkpoint
of every run), `accuracy_vs_time.png`, `forgetting_vs_time.png`, `trapo_weights_curriculum.png` (DARE weights and
curriculum shares from TRAPO's `trainer_state.json`), `runs/<method>-seed<k>/` (result, trainer states, log).
`python scripts/experiments/pipeline_report.py <output_dir>` rebuilds the report from the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import glob
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # pipeline_measure, pipeline_report, runlib

from runlib import (  # noqa: E402
    check_job_arguments,
    fraction,
    go_offline,
    launch_worker,
    main_job,
    map_jobs,
    peak_rss_mb,
    positive_float,
    positive_int,
    seed_int,
    write_json_atomic,
)


logger = logging.getLogger("compare_pipelines")

# name -> TRAPOConfig overrides of each TRAPO ablation
ABLATIONS = {
    # explicit `weighting` (it wins over `dare_mode`), so each ablation holds whatever the job's own arguments say
    "static": ("trapo_static", {"weighting": "static"}),
    "dare": ("trapo_dare", {"weighting": "dare"}),
    "constant": ("trapo_constant", {"curriculum_mode": "constant"}),
    "no_pretrain": ("trapo_no_pretrain", {"pretrain_weight": 0.0}),
    "no_replay": ("trapo_no_replay", {"num_ppo_epochs": 1}),
    "no_exploration": ("trapo_no_exploration", {"exploration": False}),
    "no_self_imitation": ("trapo_no_self_imitation", {"self_imitation": False}),
    # both zero-variance components off: TRAPO's defaults before they were measured (the baseline of their claim)
    "previous_defaults": ("trapo_previous_defaults", {"exploration": False, "self_imitation": False}),
    # opt-in: this one adds a component to the default TRAPO instead of removing one
    "guidance": ("trapo_guidance", {"demonstration_column": "demonstration"}),
}
# main-job defaults that `--quick` lowers (explicit command-line values still win)
QUICK_JOB_DEFAULTS = {"max_steps": 120}
# TrainingArguments fields every serial stage copies from the TRAPO configuration
SHARED_TRAINING_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "optim",
    "seed",
    "data_seed",
    "dataloader_num_workers",
    "use_cpu",
    "logging_steps",
    "activation_checkpointing",
)


# =====================================================================================================================
# Command line
# =====================================================================================================================
def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other argument is passed to the main job's parser (examples/trapo.py).",
        allow_abbrev=False,  # `--seed` (a main-job argument) must not be read as `--seeds`
    )
    parser.add_argument("--output_dir", default="compare-output", help="where the report and the runs go")
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=None, help="seeds (default 0 1 2; --quick: 0)")
    parser.add_argument("--budget", choices=("steps", "time"), default="steps", help="same steps or same wall time")
    parser.add_argument(
        "--ablations",
        nargs="*",
        choices=sorted(ABLATIONS),
        default=None,
        help="TRAPO ablations to add (no value: all of them)",
    )
    parser.add_argument(
        "--lr_search",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="give every method the same learning-rate search (default: on, off with --quick)",
    )
    parser.add_argument(
        "--lr_from",
        default=None,
        help="reuse the learning rates an earlier comparison's search chose: the path of its meta.json (e.g. "
        "docs/results/meta.json); every TRAPO variant gets TRAPO's, the serial arm its own (instead of --lr_search)",
    )
    parser.add_argument(
        "--lr_factors",
        type=positive_float,
        nargs="+",
        default=[0.1, 0.3, 1.0, 3.0],
        help="round 1: factors of the main job's learning rate tried (each > 0)",
    )
    parser.add_argument(
        "--rl_lr_factors",
        type=positive_float,
        nargs="+",
        default=[0.1, 0.3, 1.0],
        help="round 2: factors of the round-1 rate tried as the RL rate (TRAPO's RL phase, the serial GRPO stage)",
    )
    parser.add_argument(
        "--lr_search_fraction", type=fraction, default=0.3, help="budget of a search run (a fraction in (0, 1])"
    )
    parser.add_argument("--lr_search_seed", type=seed_int, default=100)
    parser.add_argument(
        "--eval_every", type=fraction, default=None, help="checkpoint spacing, in (0, 1] (default 0.05; quick 0.2)"
    )
    parser.add_argument(
        "--eval_per_split_family",
        type=positive_int,
        default=None,
        help="held-out prompts per task family (default all)",
    )
    parser.add_argument(
        "--heldout_docs", type=positive_int, default=None, help="held-out documents (default 300; quick 100)"
    )
    parser.add_argument("--quick", action="store_true", help="120 steps, 1 seed, small eval: a smoke run")
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="runs in parallel, each its own process (default: one per CPU core, at most 2 — the tiny built-in model "
        "gains nothing from a second torch thread, so two single-thread runs halve the total time)",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch threads per run (default cores / jobs)"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["serial", "trapo"],
        choices=["serial", "trapo", "distill_trl"],
        help="serial and/or trapo; distill_trl: TRL's DistillationTrainer alone on the RL prompts, from the main "
        "job's --teacher_model_name_or_path (needs it, and --no-lr_search)",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="run every (method, seed) again even where `runs/` holds a result made by the same code and settings",
    )
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def resolve_defaults(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill the `--quick`-dependent defaults, and check the flags valid only together (each value's range is
    `make_parser`'s type).

    Raises:
        SystemExit: `parser.error` (status 2) for flags that do not go together.
    """
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1, 2]
    if args.eval_every is None:
        args.eval_every = 0.2 if args.quick else 0.05
    if args.heldout_docs is None:
        args.heldout_docs = 100 if args.quick else 300
    if args.eval_per_split_family is None and args.quick:
        args.eval_per_split_family = 25
    if args.lr_from is not None and args.lr_search:
        parser.error("--lr_from reuses an earlier search: drop --lr_search (or --lr_from to search anew).")
    if args.lr_search is None:
        args.lr_search = not args.quick and args.lr_from is None
    if "distill_trl" in args.methods and (args.lr_search or args.lr_from is not None or args.budget == "time"):
        parser.error(
            "--methods distill_trl runs at the main job's learning rate and a step budget: add --no-lr_search (and "
            "drop --lr_from / --budget time)."
        )
    if args.jobs is None:
        args.jobs = max(min(os.cpu_count() or 1, 2), 1)
    if args.threads is None:
        args.threads = max((os.cpu_count() or 1) // args.jobs, 1)
    return args


def method_overrides(method: str) -> dict[str, Any]:
    """TRAPOConfig overrides of a TRAPO-family method (`trapo` and the ablations)."""
    for name, overrides in ABLATIONS.values():
        if name == method:
            return dict(overrides)
    if method != "trapo":
        raise ValueError(f"{method!r} is not a TRAPO method.")
    return {}


# =====================================================================================================================
# The main job's configuration and data
# =====================================================================================================================
def parse_job(job_argv: list[str], quick: bool, extra: dict[str, Any] | None = None):
    """The main job's `(script_args, TRAPOConfig, ModelConfig)` for `job_argv`, plus `extra` TRAPOConfig values."""
    from trl_trapo import cli

    builtin = cli.builtin_mode(job_argv)
    argv = list(job_argv)
    for key, value in (extra or {}).items():
        argv += [f"--{key}", json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    script_args, config, model_args = cli.parse_args(argv, defaults=QUICK_JOB_DEFAULTS if quick else None)
    return script_args, config, model_args, builtin


def time_averaged_mixture(config, active: tuple[bool, bool, bool]) -> tuple[float, float, float]:
    """Mean over TRAPO's planned steps of its curriculum's (pretrain, sft, rl) row shares, for `active` objectives."""
    from trl_trapo import CurriculumSchedule

    steps = max(int(config.max_steps), 1)
    mixtures = config.curriculum_mixtures
    schedule = CurriculumSchedule(
        config.curriculum_boundaries,
        [mixtures[i : i + 3] for i in range(0, len(mixtures), 3)],
        steps,
        config.curriculum_decay_steps,
        active=active,
        mode="phased",
    )
    sums = [0.0, 0.0, 0.0]
    for step in range(steps):
        for i, share in enumerate(schedule.mixture(step)):
            sums[i] += share / steps
    return tuple(sums)


def split_budget(total: int, shares: tuple[float, ...]) -> list[int]:
    """Split `total` steps in proportion to `shares` (largest remainder); every stage with a share gets >= 1."""
    raw = [total * s for s in shares]
    counts = [math.floor(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)[: total - sum(counts)]:
        counts[i] += 1
    for i, s in enumerate(shares):
        if s > 0 and counts[i] == 0:
            counts[i] = 1
            counts[max(range(len(counts)), key=counts.__getitem__)] -= 1
    return counts


@dataclass
class Setup:
    """Everything a run needs besides its trainer: the configuration, model factory, tokenizer and data."""

    script_args: Any
    config: Any
    model_args: Any
    builtin: bool
    tokenizer: Any
    pretrain: Any
    heldout_texts: list[str]
    sft: Any
    rl: Any
    eval: Any
    reward_funcs: list
    model_factory: Any = None
    extra: dict = field(default_factory=dict)


def build_setup(spec: dict) -> Setup:
    """Parse the main job's arguments for this run and build its tokenizer and data, as `examples/trapo.py` does."""
    from trl_trapo import cli

    script_args, config, model_args, builtin = parse_job(spec["job_argv"], spec["quick"], spec["job_extra"])
    if builtin:
        from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, make_task_suite

        tokenizer = build_char_tokenizer()
        suite = make_task_suite(seed=script_args.task_suite_seed)
        pretrain, sft, rl, eval_dataset = suite.pretrain, suite.sft, suite.rl_train, suite.eval
        reward_funcs = list(suite.reward_funcs)

        def model_factory():
            return build_tiny_model(tokenizer, seed=config.seed)

    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
        pretrain = sft = rl = eval_dataset = None
        reward_funcs = []

        def model_factory():
            return model_args.model_name_or_path

    if script_args.dataset_name:
        rl = cli.load_any(script_args.dataset_name, script_args.dataset_config, script_args.dataset_train_split)
        eval_dataset = cli.load_any(
            script_args.dataset_name, script_args.dataset_config, script_args.dataset_test_split or "test"
        )
    if script_args.sft_dataset_name:
        sft = cli.load_any(script_args.sft_dataset_name, script_args.sft_dataset_config, script_args.sft_dataset_split)
    if script_args.pretrain_dataset_name:
        pretrain = cli.load_any(
            script_args.pretrain_dataset_name, script_args.pretrain_dataset_config, script_args.pretrain_dataset_split
        )
    for name in script_args.reward_funcs:
        reward_funcs.append(cli.REWARD_FUNCTIONS[name])
    if eval_dataset is None or not reward_funcs:
        raise ValueError("The comparison needs held-out RL prompts (a `test` split of --dataset_name) and rewards.")
    if pretrain is None or len(pretrain) <= spec["heldout_docs"]:
        raise ValueError(
            f"The comparison needs a map-style pretraining dataset with more than --heldout_docs="
            f"{spec['heldout_docs']} documents: the last ones are held out to measure forgetting."
        )
    # the last `heldout_docs` documents are seen by no run (0: none held out, the whole corpus trained on)
    cut = len(pretrain) - spec["heldout_docs"]
    heldout_texts = pretrain.select(range(cut, len(pretrain)))["text"] if cut < len(pretrain) else []
    pretrain = pretrain.select(range(cut)) if cut < len(pretrain) else pretrain
    per_family = spec.get("eval_per_split_family")
    if per_family and "task" in eval_dataset.column_names:
        seen: dict[str, int] = {}
        keep = []
        for i, task in enumerate(eval_dataset["task"]):
            if seen.get(task, 0) < per_family:
                seen[task] = seen.get(task, 0) + 1
                keep.append(i)
        eval_dataset = eval_dataset.select(keep)
    return Setup(
        script_args, config, model_args, builtin, tokenizer, pretrain, heldout_texts, sft, rl, eval_dataset,
        reward_funcs, model_factory,
    )  # fmt: skip


from pipeline_measure import (  # noqa: E402  (scripts/ is on sys.path)
    PROGRESS_PREFIX,
    Recorder,
    make_evaluator,
    measured,
    recorder_callback,
)


# =====================================================================================================================
# The two pipelines
# =====================================================================================================================
def run_trapo(setup: Setup, spec: dict, extra_callbacks: Callable | None = None) -> tuple[Recorder, dict]:
    """TRAPOTrainer with the main job's configuration (plus the method's overrides).

    `extra_callbacks(trainer)`, when given, returns callbacks added to the built trainer before it trains (for a
    callback that needs the trainer itself, e.g. its `teacher_model`)."""
    from trl_trapo import TRAPOTrainer

    config = setup.config
    recorder = Recorder(make_evaluator(setup), "steps", config.max_steps, spec["eval_every"])
    model = setup.model_factory()
    started = time.perf_counter()
    trainer = measured(TRAPOTrainer, recorder)(
        model=model,
        reward_funcs=setup.reward_funcs,
        args=config,
        train_dataset=setup.rl,
        pretrain_dataset=setup.pretrain,
        sft_dataset=setup.sft,
        processing_class=setup.tokenizer,
        callbacks=[recorder_callback(recorder, "trapo", 0, None, first=True)],
    )
    recorder.instrument_generate(trainer.accelerator.unwrap_model(trainer.model))
    for callback in extra_callbacks(trainer) if extra_callbacks is not None else ():
        trainer.add_callback(callback)
    trainer.train()
    trainer.save_state()
    setup_s = time.perf_counter() - started - recorder.wall.read() - recorder.eval_s
    return recorder, {"setup_s": setup_s, "stages": [{"stage": "trapo", "steps": config.max_steps}]}


def stage_configs(setup: Setup, stage_steps: list[int], spec: dict, workdir: str) -> list:
    """The SFTConfig / GRPOConfig of each serial stage, copied from the TRAPO configuration (see the docstring)."""
    from trl import GRPOConfig, SFTConfig

    config = setup.config
    total = max(int(config.max_steps), 1)
    shared = {name: getattr(config, name) for name in SHARED_TRAINING_FIELDS}
    shared.update(
        bf16=bool(config.bf16),
        fp16=bool(config.fp16),
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        per_device_eval_batch_size=config.per_device_eval_batch_size,
    )
    time_budget = spec["budget"] == "time"
    warmup = config.warmup_steps

    def stage_args(steps: int) -> dict:
        if time_budget:  # nominal steps: the schedule runs on time, the stage stops on time
            nominal = max(10 * steps, 100)
            return {"max_steps": nominal, "warmup_steps": float(warmup) / total if warmup >= 1 else warmup}
        return {"max_steps": steps, "warmup_steps": round(warmup * steps / total) if warmup >= 1 else warmup}

    configs = []
    if stage_steps[0]:
        configs.append(
            SFTConfig(
                output_dir=os.path.join(workdir, "pretrain"),
                **shared,
                **stage_args(stage_steps[0]),
                dataset_text_field="text",
                max_length=config.pretrain_max_length,
                packing=config.pretrain_packing,
                packing_strategy="wrapped",
            )
        )
    else:
        configs.append(None)
    if stage_steps[1]:
        configs.append(
            SFTConfig(
                output_dir=os.path.join(workdir, "sft"),
                **shared,
                **stage_args(stage_steps[1]),
                max_length=config.sft_max_length,
                completion_only_loss=True,
                packing=False,
            )
        )
    else:
        configs.append(None)
    if stage_steps[2]:
        if config.kl_estimator != "k3" and config.kl_coef > 0:
            logger.warning(
                "GRPO's KL term is k3; TRAPO uses kl_estimator=%s: the KL terms differ.", config.kl_estimator
            )
        rl_shared = dict(shared)
        if config.rl_phase_learning_rate is not None:  # TRAPO's rate for its RL-heavy phase = the GRPO stage's rate
            rl_shared["learning_rate"] = config.rl_phase_learning_rate
        configs.append(
            GRPOConfig(
                output_dir=os.path.join(workdir, "rl"),
                **rl_shared,
                **stage_args(stage_steps[2]),
                num_generations=config.num_generations,
                max_completion_length=config.response_length,
                temperature=config.temperature,
                top_p=config.top_p,
                top_k=config.top_k,
                beta=config.kl_coef,
                num_iterations=config.num_ppo_epochs,
                epsilon=config.cliprange,
                loss_type=config.loss_type,
                scale_rewards=config.scale_rewards,
                mask_truncated_completions=config.mask_truncated_completions,
                entropy_coef=config.entropy_coef,
                reward_weights=config.reward_weights,
                sync_ref_model=config.sync_ref_model and config.kl_coef > 0,
                ref_model_mixup_alpha=config.ref_model_mixup_alpha,
                ref_model_sync_steps=config.ref_model_sync_steps,
                disable_dropout=config.disable_dropout,
            )
        )
    else:
        configs.append(None)
    return configs


def run_serial(setup: Setup, spec: dict) -> tuple[Recorder, dict]:
    """SFTTrainer (pretraining corpus) -> SFTTrainer (SFT data) -> GRPOTrainer (RL prompts), one shared timeline."""
    from trl import GRPOTrainer, SFTTrainer

    config = setup.config
    active = (setup.pretrain is not None, setup.sft is not None, setup.rl is not None)
    shares = time_averaged_mixture(config, active)
    steps = split_budget(int(config.max_steps), shares)
    time_budget = spec["budget"] == "time"
    total = spec["time_budget_s"] if time_budget else config.max_steps
    recorder = Recorder(make_evaluator(setup), spec["budget"], total, spec["eval_every"])
    workdir = tempfile.mkdtemp(prefix="serial-", dir=spec["run_dir"])
    configs = stage_configs(setup, steps, spec, workdir)
    model = setup.model_factory()
    started = time.perf_counter()
    stages = []
    offset, stage_start_s, first = 0, 0.0, True
    for index, (name, stage_config) in enumerate(zip(("pretrain", "sft", "rl"), configs)):
        if stage_config is None:
            continue
        stop_at = None
        time_fraction = None
        if time_budget:
            stop_at = stage_start_s + shares[index] * total
            allowance = max(shares[index] * total, 1e-9)

            def time_fraction(start=stage_start_s, allowance=allowance):
                return min(max((recorder.wall.read() - start) / allowance, 0.0), 1.0)

        callback = recorder_callback(recorder, name, offset, stop_at, first)
        tokenizer = copy.deepcopy(setup.tokenizer)
        if name == "rl":
            if not isinstance(model, str):  # GRPOTrainer loads its reference model from a path
                path = os.path.join(workdir, "before-rl")
                model.save_pretrained(path)
                tokenizer.save_pretrained(path)
                model = path
            trainer = measured(GRPOTrainer, recorder, time_fraction)(
                model=model,
                reward_funcs=setup.reward_funcs,
                args=stage_config,
                train_dataset=setup.rl,
                processing_class=tokenizer,
                callbacks=[callback],
            )
        else:
            trainer = measured(SFTTrainer, recorder, time_fraction)(
                model=model,
                args=stage_config,
                train_dataset=setup.pretrain if name == "pretrain" else setup.sft,
                processing_class=tokenizer,
                callbacks=[callback],
            )
        recorder.instrument_generate(trainer.accelerator.unwrap_model(trainer.model))
        trainer.train()
        trainer.save_state()
        shutil.copy(
            os.path.join(stage_config.output_dir, "trainer_state.json"),
            os.path.join(spec["run_dir"], f"trainer_state_{name}.json"),
        )
        model = trainer.accelerator.unwrap_model(trainer.model)
        stage_steps = recorder.global_step - offset
        stages.append({"stage": name, "steps": stage_steps, "planned_steps": steps[index], "share": shares[index]})
        offset, stage_start_s, first = recorder.global_step, recorder.wall.read(), False
    shutil.rmtree(workdir, ignore_errors=True)
    setup_s = time.perf_counter() - started - recorder.wall.read() - recorder.eval_s
    return recorder, {"setup_s": setup_s, "stages": stages, "shares": list(shares)}


def run_distill_trl(setup: Setup, spec: dict) -> tuple[Recorder, dict]:
    """TRL's `DistillationTrainer` alone: on-policy distillation from the main job's `teacher_model_name_or_path` on
    the RL prompts (no reward, no pretraining or SFT data), with the TRAPO configuration's steps, batch (prompts per
    step, one completion each), optimizer and schedule (as the serial GRPO stage copies them), completion length
    (`max_completion_length` = `response_length`) and divergence (`beta` = `distillation_beta`, `temperature` =
    `distillation_temperature`, for sampling and the divergence)."""
    from trl import DistillationConfig, DistillationTrainer

    config = setup.config
    if not config.teacher_model_name_or_path:
        raise ValueError("--methods distill_trl needs the main job's --teacher_model_name_or_path (the teacher).")
    recorder = Recorder(make_evaluator(setup), "steps", config.max_steps, spec["eval_every"])
    workdir = tempfile.mkdtemp(prefix="distill-", dir=spec["run_dir"])
    grpo = stage_configs(setup, [0, 0, int(config.max_steps)], spec, workdir)[2]
    copied = (*SHARED_TRAINING_FIELDS, "bf16", "fp16", "max_steps", "warmup_steps")
    # the main job's base rate (the GRPO stage's copy holds rl_phase_learning_rate when one is set)
    values = {**{name: getattr(grpo, name) for name in dict.fromkeys(copied)}, "learning_rate": config.learning_rate}
    args = DistillationConfig(
        output_dir=os.path.join(workdir, "distill"),
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        max_completion_length=config.response_length,
        temperature=config.distillation_temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        beta=config.distillation_beta,
        disable_dropout=config.disable_dropout,
        **values,
    )
    model = setup.model_factory()
    started = time.perf_counter()
    trainer = measured(DistillationTrainer, recorder)(
        model=model,
        teacher_model=config.teacher_model_name_or_path,
        args=args,
        train_dataset=setup.rl.select_columns(["prompt"]),
        processing_class=copy.deepcopy(setup.tokenizer),
        callbacks=[recorder_callback(recorder, "distill", 0, None, first=True)],
    )
    recorder.instrument_generate(trainer.accelerator.unwrap_model(trainer.model))
    trainer.train()
    shutil.rmtree(workdir, ignore_errors=True)
    setup_s = time.perf_counter() - started - recorder.wall.read() - recorder.eval_s
    return recorder, {"setup_s": setup_s, "stages": [{"stage": "distill", "steps": recorder.global_step}]}


def worker(spec_path: str, extra_callbacks: Callable | None = None) -> None:
    """Run one (method, seed) in this process and write `<run_dir>/result.json`. `extra_callbacks`: as `run_trapo`'s
    (TRAPO-family methods only)."""
    import torch

    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(spec["threads"])
    load_start = os.getloadavg()
    setup = build_setup(spec)
    if spec["method"] == "serial":
        recorder, info = run_serial(setup, spec)
    elif spec["method"] == "distill_trl":
        recorder, info = run_distill_trl(setup, spec)
    else:
        recorder, info = run_trapo(setup, spec, extra_callbacks)
    final = recorder.rows[-1]
    result = {
        "method": spec["method"],
        "seed": spec["seed"],
        "learning_rate": setup.config.learning_rate,
        "rl_phase_learning_rate": setup.config.rl_phase_learning_rate,
        "budget": spec["budget"],
        "max_steps": setup.config.max_steps,
        "checkpoints": recorder.rows,
        "stage_ends": recorder.stage_ends,
        "wall_s": final["wall_s"],
        "cpu_s": final["cpu_s"],
        "eval_s": recorder.eval_s,
        "generation_s": recorder.generation_s,
        "tokens": recorder.tokens,
        "steps": recorder.global_step,
        "peak_rss_mb": peak_rss_mb(),
        "threads": spec["threads"],
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        **info,
    }
    write_json_atomic(os.path.join(spec["run_dir"], "result.json"), result)


# =====================================================================================================================
# Orchestration
# =====================================================================================================================
class Progress:
    """One progress bar over all runs (each run counts 100 units), fed by the workers' progress lines."""

    def __init__(self, runs: int, description: str):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=100 * runs, desc=description, unit="%", dynamic_ncols=True)
        self.lock = threading.Lock()

    def add(self, units: int) -> None:
        with self.lock:
            self.bar.update(units)

    def note(self, text: str) -> None:
        with self.lock:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        self.bar.close()


def code_fingerprint() -> str:
    """SHA-256 of everything that decides a run's numbers: the `trl_trapo` package (sources and configs), the main
    job, this script, its measuring module and its launcher (`runlib`: the child's environment), and the versions of torch / transformers / TRL / PEFT / datasets.
    Documentation and the report code are left out, so editing them keeps the cached runs."""
    import importlib.metadata

    digest = hashlib.sha256()
    paths = sorted(glob.glob(os.path.join(ROOT, "trl_trapo", "**", "*.py"), recursive=True))
    paths += sorted(glob.glob(os.path.join(ROOT, "trl_trapo", "configs", "*")))
    paths += [os.path.join(ROOT, "examples", "trapo.py"), os.path.abspath(__file__)]
    paths += [
        os.path.join(os.path.dirname(os.path.abspath(__file__)), name) for name in ("pipeline_measure.py", "runlib.py")
    ]
    for path in paths:
        digest.update(os.path.relpath(path, ROOT).encode())
        with open(path, "rb") as handle:
            digest.update(handle.read())
    for package in ("torch", "transformers", "trl", "peft", "datasets"):
        digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
    return digest.hexdigest()


def cached_result(spec: dict) -> dict | None:
    """The result in `spec["run_dir"]` when it was made from the same settings and code (`_numbers_key`), else None."""
    spec_path, result_path = (os.path.join(spec["run_dir"], name) for name in ("spec.json", "result.json"))
    if spec.get("rerun") or not (os.path.exists(spec_path) and os.path.exists(result_path)):
        return None
    try:
        with open(spec_path, encoding="utf-8") as handle:
            previous = json.load(handle)
        with open(result_path, encoding="utf-8") as handle:
            result = json.load(handle)
    except (OSError, ValueError):
        return None
    return result if _numbers_key(previous) == _numbers_key(spec) else None


def _numbers_key(spec: dict) -> dict:
    """What decides a run's numbers: the spec without where it is written (`run_dir`, the job's `output_dir` and
    `overwrite_output_dir`) and without `rerun`, so a run directory copied into another comparison is reused there
    too."""
    key = {k: v for k, v in spec.items() if k not in ("rerun", "run_dir")}
    where = ("output_dir", "overwrite_output_dir")
    key["job_extra"] = {k: v for k, v in spec.get("job_extra", {}).items() if k not in where}
    return key


def launch(spec: dict, progress: Progress) -> dict:
    """Run one spec in a child process; return its result (raises with the log's tail if it fails).

    A run whose directory holds a result made from the same spec (same settings, same code fingerprint) is not run
    again: the harness resumes across sessions. `--rerun` turns that off."""
    cached = cached_result(spec)
    if cached is not None:
        progress.note(f"{os.path.basename(spec['run_dir'])} (cached)")
        progress.add(100)
        return cached
    os.makedirs(spec["run_dir"], exist_ok=True)
    result_path = os.path.join(spec["run_dir"], "result.json")
    if os.path.exists(result_path):
        os.remove(result_path)  # a result of other settings or code must not survive next to this spec
    progress.note(os.path.basename(spec["run_dir"]))
    done = 0

    def progress_line(line: str) -> bool:  # the worker's progress lines feed the bar; the others go to the log
        nonlocal done
        if not line.startswith(PROGRESS_PREFIX):
            return False
        percent = int(line[len(PROGRESS_PREFIX) :])
        if percent > done:
            progress.add(percent - done)
            done = percent
        return True

    try:
        launch_worker(
            __file__,
            spec,
            os.path.join(spec["run_dir"], "spec.json"),
            threads=spec["threads"],
            log_path=os.path.join(spec["run_dir"], "log.txt"),
            name=f"Run {spec['run_dir']}",
            on_line=progress_line,
        )
    finally:
        progress.add(100 - done)
    with open(os.path.join(spec["run_dir"], "result.json"), encoding="utf-8") as handle:
        return json.load(handle)


def run_all(specs: list[dict], jobs: int, description: str) -> list[dict]:
    progress = Progress(len(specs), description)
    try:
        return map_jobs(lambda s: launch(s, progress), specs, jobs)
    finally:
        progress.close()


def make_spec(args, job_argv, method, seed, run_dir, job_extra=None, time_budget_s=None) -> dict:
    extra = {"seed": seed, "output_dir": run_dir, "eval_strategy": "no", "save_strategy": "no", "report_to": "none"}
    extra["overwrite_output_dir"] = True  # a re-run (`--rerun`, changed settings) replaces the run on purpose
    extra["disable_tqdm"] = True
    if method not in ("serial", "distill_trl"):
        extra.update(method_overrides(method))
    extra.update(job_extra or {})
    return {
        "method": method,
        "seed": seed,
        "run_dir": run_dir,
        "job_argv": job_argv,
        "job_extra": extra,
        "quick": args.quick,
        "budget": args.budget,
        "time_budget_s": time_budget_s,
        "eval_every": args.eval_every,
        "eval_per_split_family": args.eval_per_split_family,
        "heldout_docs": args.heldout_docs,
        "threads": args.threads,
        "code": args.code,
        "rerun": args.rerun,
    }


def run_methods(args, job_argv, methods, seeds, out_dir, job_extra_of=None, description="runs") -> list[dict]:
    """TRAPO-family runs first (with `--budget time` a serial run needs the wall time of its seed's TRAPO run)."""
    job_extra_of = job_extra_of or (lambda method: {})
    trapo_methods = [m for m in methods if m != "serial"]
    specs = [
        make_spec(args, job_argv, m, s, os.path.join(out_dir, f"{m}-seed{s}"), job_extra_of(m))
        for s in seeds
        for m in trapo_methods
    ]
    if args.budget == "steps" and "serial" in methods:
        specs += [
            make_spec(args, job_argv, "serial", s, os.path.join(out_dir, f"serial-seed{s}"), job_extra_of("serial"))
            for s in seeds
        ]
        return run_all(specs, args.jobs, description)
    results = run_all(specs, args.jobs, description) if specs else []
    if "serial" in methods:
        if "trapo" not in methods:
            raise ValueError("--budget time gives the serial pipeline the wall time of TRAPO's run: include trapo.")
        budget = {r["seed"]: r["wall_s"] for r in results if r["method"] == "trapo"}
        serial = [
            make_spec(
                args,
                job_argv,
                "serial",
                s,
                os.path.join(out_dir, f"serial-seed{s}"),
                job_extra_of("serial"),
                budget[s],
            )
            for s in seeds
        ]
        results += run_all(serial, args.jobs, description + " (serial)")
    return results


def lr_search(args, job_argv, methods) -> dict[str, dict]:
    """The same two-round search for each arm, short runs, best held-out accuracy (ties: lower pretraining loss).

    Round 1: `lr_factors` x the main job's rate as `learning_rate`. Round 2: `rl_lr_factors` x the round-1 winner as
    `rl_phase_learning_rate` — TRAPO's rate in its RL-heavy curriculum phase, the serial arm's rate for its GRPO stage
    (RL usually wants a lower rate than SFT; both arms get the same chance to lower it). Factor 1 is the round-1 run.
    """
    _, config, _, _ = parse_job(job_argv, args.quick)
    base_lr, base_steps = config.learning_rate, int(config.max_steps)
    steps = max(int(round(base_steps * args.lr_search_fraction)), 1)
    families = ["serial", "trapo"] if "serial" in methods else ["trapo"]
    search_args = copy.copy(args)
    search_args.budget = "steps"  # search runs compare learning rates at equal steps
    search_args.eval_every = 1.0  # only the initial and the final evaluation
    out_dir = os.path.join(args.output_dir, "lr_search")

    def score(result):
        final = result["checkpoints"][-1]
        return final["accuracy"], -final["pretrain_loss"]

    def summary(result):
        final = result["checkpoints"][-1]
        return {"accuracy": final["accuracy"], "pretrain_loss": final["pretrain_loss"]}

    specs = []
    for family in families:
        for lr in [base_lr * f for f in args.lr_factors]:
            run_dir = os.path.join(out_dir, f"{family}-lr{lr:.3g}")
            extra = {"learning_rate": lr, "max_steps": steps}
            specs.append(make_spec(search_args, job_argv, family, args.lr_search_seed, run_dir, extra))
    first = run_all(specs, args.jobs, "lr search (1/2)")
    chosen: dict[str, dict] = {}
    for family in families:
        rows = [r for r in first if r["method"] == family]
        best = max(rows, key=score)
        chosen[family] = {
            "learning_rate": best["learning_rate"],
            "rl_phase_learning_rate": None,
            "best": best,
            "candidates": {f"{r['learning_rate']:.3g}": summary(r) for r in rows},
            "rl_candidates": {},
            "steps": steps,
            "seed": args.lr_search_seed,
        }
    specs = []
    for family in families:
        lr = chosen[family]["learning_rate"]
        for factor in args.rl_lr_factors:
            if factor == 1.0:
                continue  # that run is round 1's winner
            run_dir = os.path.join(out_dir, f"{family}-lr{lr:.3g}-rl{lr * factor:.3g}")
            extra = {"learning_rate": lr, "rl_phase_learning_rate": lr * factor, "max_steps": steps}
            specs.append(make_spec(search_args, job_argv, family, args.lr_search_seed, run_dir, extra))
    second = run_all(specs, args.jobs, "lr search (2/2)") if specs else []
    for family in families:
        entry = chosen[family]
        rows = [(entry["learning_rate"], entry.pop("best"))]
        rows += [(r["rl_phase_learning_rate"], r) for r in second if r["method"] == family]
        rate, _ = max(rows, key=lambda pair: score(pair[1]))
        entry["rl_phase_learning_rate"] = None if rate == entry["learning_rate"] else rate
        entry["rl_candidates"] = {f"{rate:.3g}": summary(r) for rate, r in rows}
    return chosen


def searched_rates(meta_path: str, methods: list[str]) -> dict[str, dict]:
    """The `lr_search` entry of an earlier comparison's `meta.json` (`--lr_from`).

    Raises:
        ValueError: if the file cannot be read, has no search, or lacks the rate of an arm in `methods`.
    """
    try:
        with open(meta_path, encoding="utf-8") as handle:
            rates = json.load(handle).get("lr_search") or {}
    except (OSError, ValueError) as error:
        raise ValueError(
            f"--lr_from={meta_path!r}: cannot read it ({error}). Give a comparison's meta.json."
        ) from None
    needed = {"serial" if m == "serial" else "trapo" for m in methods}
    missing = sorted(needed - set(rates))
    if missing:
        raise ValueError(
            f"--lr_from={meta_path!r} has no searched rate for {missing}: give the meta.json of a comparison run "
            "with --lr_search and those arms, or drop --lr_from."
        )
    return {family: {**rates[family], "from": meta_path} for family in needed}


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser()
    args, job_argv = parser.parse_known_args(argv)
    if args._worker:
        worker(args._worker)
        return {}
    args = resolve_defaults(args, parser)
    args.code = code_fingerprint()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    go_offline()
    from pipeline_report import write_report

    methods = list(dict.fromkeys(args.methods))
    if args.ablations is not None:
        methods += [ABLATIONS[name][0] for name in (args.ablations or sorted(ABLATIONS))]
    # fail early on bad main-job arguments: a misspelt option of this script (`--ablation`) is named as one
    check_job_arguments(parser, job_argv, [main_job(lambda argv: parse_job(argv, args.quick))])
    os.makedirs(args.output_dir, exist_ok=True)
    started = time.perf_counter()
    load_start = os.getloadavg()
    learning_rates: dict[str, Any] = {}
    if args.lr_from is not None:
        learning_rates = searched_rates(args.lr_from, methods)
    elif args.lr_search:
        learning_rates = lr_search(args, job_argv, methods)
        logger.info("learning-rate search: %s", json.dumps(learning_rates))

    def job_extra_of(method: str) -> dict:
        family = "serial" if method == "serial" else "trapo"
        if family not in learning_rates:
            return {}
        extra = {"learning_rate": learning_rates[family]["learning_rate"]}
        if learning_rates[family]["rl_phase_learning_rate"] is not None:
            extra["rl_phase_learning_rate"] = learning_rates[family]["rl_phase_learning_rate"]
        return extra

    results = run_methods(
        args, job_argv, methods, args.seeds, os.path.join(args.output_dir, "runs"), job_extra_of, "comparison"
    )
    meta = {
        "command": " ".join(
            ["python", "scripts/experiments/compare_pipelines.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "job_argv": job_argv,
        "methods": methods,
        "seeds": args.seeds,
        "budget": args.budget,
        "quick": args.quick,
        "jobs": args.jobs,
        "threads": args.threads,
        "eval_every": args.eval_every,
        "lr_search": learning_rates,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "total_s": time.perf_counter() - started,
        "cpu_count": os.cpu_count(),
    }
    write_json_atomic(os.path.join(args.output_dir, "meta.json"), meta, sort_keys=False, newline=False)
    report = write_report(args.output_dir, results, meta)
    print(report["markdown"])
    print(f"\nWritten to {args.output_dir}/ ({meta['total_s']:.0f} s).")
    return report


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
