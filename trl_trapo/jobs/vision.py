# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The built-in vision-language job (`examples/trapo_vlm.py`): a tiny VLM learns the visual task in one loop.

    from trl_trapo.jobs.vision import main, parse_args

    job_args, config = parse_args([])  # the defaults of VLM_JOB_DEFAULTS; `--config recipe.yaml` supported
    results = main(job_args, config)  # evaluate, train, evaluate again, save; results as in eval_results.json

With no arguments and no network it builds the tiny LLaVA and its processor (`trl_trapo.tasks.vision`: a CLIP image
processor's PIL backend and the character tokenizer with an `<image>` token), the visual task suite (shapes and
colours drawn at 56x56 pixels: captions for pretraining, demonstrations of the `colour`, `count`, `same` and `text`
families, RL prompts of every family, `shape` RL-only), and trains one `TRAPOTrainer` on all three objectives at once.
Before and after training it measures ([`evaluate`]):

- `eval_accuracy`, `eval_accuracy_<split>` (`sft_tasks`, `rl_only`) and `eval_accuracy_<family>`: greedy exact match
  on held-out images (`vision_tasks.greedy_vlm_accuracy`);
- `eval_caption_loss`: language-modelling loss (nats/token) of held-out caption documents, which no run trains on
  (`vision_tasks.caption_loss`): forgetting of the pretraining objective;

each also with the suffix `_initial` (before training), plus `train_runtime_s` and `train_loss`, written to
`<output_dir>/eval_results.json` (atomically) next to the model, its processor and `trainer_state.json`, as the main
job writes them (`trl_trapo.jobs.main.save_job`); `--resume_from_checkpoint` resumes training as there
(`trl_trapo.jobs.main.train_job`).

`--per_modality` trains image rows and text rows as separate objectives (`DemonstrationObjective("sft_image")`,
`LanguageModelingObjective("pretrain_image")` next to the built-in `sft` and `pretrain` on the text rows; RL stays
one objective): the curriculum (and DARE, with `--weighting dare`) weighs each modality apart (docs/vision.md,
"Per-modality weights").
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import ClassVar

from datasets import Dataset
from trl import TrlParser

from ..config import OBJECTIVES, TRAPOConfig
from ..distributed import check_launch
from ..objectives import DemonstrationObjective, LanguageModelingObjective, PretrainingObjective, SFTObjective
from ..saving import releases_job_holds


logger = logging.getLogger(__name__)

# Hyper-parameters of the VLM job, for what the user does not set. The main job's `BUILTIN_DEFAULTS`
# (trl_trapo/jobs/main.py), except: 900 steps (the families with demonstrations are learnt; ~5-6 min of training on 2 CPU
# cores), room for images in the lengths (16 tokens per image, up to 2 per prompt), each trajectory trained on once
# (`num_ppo_epochs=1`, GRPO's on-policy default: the RL-only `shape` family needs ~4x the fresh rollouts that reuse x4
# leaves it - with reuse it collapsed to one constant answer, 0.33), no evaluation during training, logging every 20
# steps.
VLM_JOB_DEFAULTS = dict(
    output_dir="trapo-vlm-output",
    max_steps=900,
    per_device_train_batch_size=32,
    gradient_accumulation_steps=1,
    learning_rate=1e-3,
    lr_scheduler_type="cosine_with_min_lr",
    lr_scheduler_kwargs={"min_lr_rate": 0.1},
    warmup_steps=0.05,
    adam_beta2=0.99,
    weight_decay=0.0,
    max_grad_norm=1.0,
    logging_steps=20,
    eval_strategy="no",
    save_strategy="no",
    report_to="none",
    activation_checkpointing=False,
    pretrain_max_length=96,
    sft_max_length=96,
    max_prompt_length=80,
    response_length=12,
    num_generations=8,
    num_ppo_epochs=1,
    temperature=1.0,
    kl_coef=0.01,
    sync_ref_model=True,  # from random weights: anchor the KL to a lagging copy, as the main job does
    ref_model_sync_steps=25,
    ref_model_mixup_alpha=0.5,
    seed=0,
    dataloader_num_workers=0,
    disable_tqdm=True,
)
IMAGE_SUFFIX = "_image"  # the per-modality objectives: `pretrain_image`, `sft_image`


def per_modality_curriculum(config: TRAPOConfig) -> tuple[list[float], list[dict[str, float]]]:
    """`(boundaries, mixtures)` of the per-modality run: the config's phases with the pretraining and the SFT share
    each split half and half between the text objective and its image twin (RL's share unchanged)."""
    names = list(OBJECTIVES)
    flat = list(config.curriculum_mixtures)
    split = {PretrainingObjective.NAME, SFTObjective.NAME}
    mixtures = []
    for start in range(0, len(flat), len(names)):
        mixture: dict[str, float] = {}
        for name, share in zip(names, flat[start : start + len(names)]):
            if name in split:
                mixture[name] = mixture[name + IMAGE_SUFFIX] = share / 2
            else:
                mixture[name] = share
        mixtures.append(mixture)
    return list(config.curriculum_boundaries), mixtures


@dataclass
class VisionJobArguments:
    """The data arguments of the VLM job (the training arguments are `TRAPOConfig`'s)."""

    own_data: ClassVar[str] = (
        "For your own model and data: `trapo train` (it takes --model_name_or_path, --dataset_name, --use_peft, "
        "...), or "
        "`TRAPOTrainer` with a processor in Python for image rows (docs/vision.md)."
    )
    """Where a user's own model and data go: said when a main-job argument is given to this job."""

    task_seed: int = field(default=0, metadata={"help": "Seed of the visual task suite (images, splits, rows)."})
    num_pretrain_docs: int = field(default=2000, metadata={"help": "Pretraining documents (captions, text)."})
    num_sft_per_task: int = field(default=1000, metadata={"help": "SFT demonstrations per family that has them."})
    num_rl_per_task: int = field(default=500, metadata={"help": "RL prompts per family with demonstrations."})
    num_eval_per_task: int = field(default=48, metadata={"help": "Held-out eval prompts per family."})
    num_eval_captions: int = field(default=48, metadata={"help": "Held-out caption documents (forgetting)."})
    per_modality: bool = field(
        default=False,
        metadata={
            "help": "Train image rows and text rows as separate objectives (sft_image, pretrain_image next to sft "
            "and pretrain), weighed apart by the curriculum (and by DARE with --weighting dare); each image objective "
            "has its text objective's static weight (`--sft_weight`, `--pretrain_weight`: 0 turns both off)."
        },
    )

    def __post_init__(self):
        for name in (
            "num_pretrain_docs", "num_sft_per_task", "num_rl_per_task", "num_eval_per_task", "num_eval_captions"
        ):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name}={value!r}: must be a whole number >= 1. Fix: give one.")


def make_parser(prog: str | None = None) -> TrlParser:
    """The job's parser over `(VisionJobArguments, TRAPOConfig)`, with `VLM_JOB_DEFAULTS` as defaults."""
    from .main import take_mixture_mappings

    parser = TrlParser(
        (VisionJobArguments, TRAPOConfig),
        allow_abbrev=False,
        **({"prog": prog} if prog else {}),  # argparse's error prefix; its default is the script's file name
        usage=f"{prog or 'examples/trapo_vlm.py'} [--config RECIPE.yaml] [--ARGUMENT VALUE ...]",
    )
    parser.set_defaults(**VLM_JOB_DEFAULTS)
    return take_mixture_mappings(parser)


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> tuple[VisionJobArguments, TRAPOConfig]:
    """Parse the job's command line (`sys.argv[1:]` by default) over `VLM_JOB_DEFAULTS`.

    Raises:
        SystemExit: from argparse, for `--help`.
        ValueError: for an unknown argument or `--config` key (with the closest known names), or a value
            `TRAPOConfig` or [`VisionJobArguments`] refuses, naming the field.
    """
    import dataclasses

    from .main import parse_job_args

    job_args, config = parse_job_args(
        lambda: make_parser(prog),
        (VisionJobArguments, TRAPOConfig),
        sys.argv[1:] if argv is None else list(argv),
        "examples/trapo_vlm.py",
        command=prog,
    )
    given = config.curriculum_mixtures
    if job_args.per_modality and all(isinstance(share, (int, float)) for share in given):
        # phases given as numbers name the three built-in objectives; this run has five (mappings name them all)
        boundaries, mixtures = per_modality_curriculum(config)
        config = dataclasses.replace(config, curriculum_boundaries=boundaries, curriculum_mixtures=mixtures)
    return job_args, config


@dataclass
class VisionJobData:
    """What the VLM job trains and evaluates on.

    Attributes:
        processor: the tiny VLM's processor (`vision_tasks.build_vlm_processor`).
        suite: the visual task suite (`vision_tasks.VisualTaskSuite`).
        per_modality (`bool`): split image and text rows into objectives of their own.
    """

    processor: object
    suite: object
    per_modality: bool = False


def build_data(job_args: VisionJobArguments) -> VisionJobData:
    """Generate the visual task suite from `job_args.task_seed` and build the processor (no download)."""
    from ..tasks.vision import build_vlm_processor, make_visual_task_suite

    suite = make_visual_task_suite(
        job_args.task_seed,
        num_pretrain_docs=job_args.num_pretrain_docs,
        num_sft_per_task=job_args.num_sft_per_task,
        num_rl_per_task=job_args.num_rl_per_task,
        num_eval_per_task=job_args.num_eval_per_task,
        num_eval_captions=job_args.num_eval_captions,
    )
    return VisionJobData(processor=build_vlm_processor(), suite=suite, per_modality=job_args.per_modality)


def split_by_images(dataset: Dataset) -> tuple[Dataset, Dataset]:
    """`(rows with images, rows without)` of a dataset with an `images` column."""
    counts = [len(images or []) for images in dataset["images"]]
    return (
        dataset.select([i for i, n in enumerate(counts) if n]),
        dataset.select([i for i, n in enumerate(counts) if not n]),
    )


def evaluate(model, data: VisionJobData) -> dict[str, float]:
    """The job's held-out metrics of `model` (module docstring), without the `eval_` prefix: `accuracy`,
    `accuracy_<split>`, `accuracy_<family>` (fractions in [0, 1]) and `caption_loss` (nats/token)."""
    from ..tasks.vision import caption_loss, greedy_vlm_accuracy

    metrics = greedy_vlm_accuracy(model, data.processor, data.suite.eval)
    metrics["caption_loss"] = caption_loss(model, data.processor, data.suite.eval_captions)
    return metrics


def build_trainer(data: VisionJobData, config: TRAPOConfig, model=None):
    """The job's `TRAPOTrainer`: pretraining on the captions, SFT on the demonstrations, RL on the prompts (per
    modality: image rows as objectives of their own); `model` defaults to a fresh tiny VLM
    (`build_tiny_vlm(processor, seed=config.seed)`).

    Raises:
        ValueError: if `resume_from_checkpoint` is not a checkpoint, or `output_dir` is in use by another run or
            holds checkpoints this run does not resume (checked first, as the main job does), or for what the trainer
            refuses.
    """
    from ..saving import check_earlier_checkpoints, hold_output_dir
    from ..tasks.vision import build_tiny_vlm
    from ..trainer import TRAPOTrainer
    from .main import check_checkpoint

    check_checkpoint(config.resume_from_checkpoint)  # before the model: `train_job` resumes from it
    hold_output_dir(config)  # no other run writes into output_dir: its lock, until this process ends
    check_earlier_checkpoints(config, config.resume_from_checkpoint, cli=True)  # an unfinished run there is resumed
    suite = data.suite
    sft, pretrain, objectives = suite.sft, suite.pretrain, []
    if data.per_modality:
        sft_image, sft = split_by_images(suite.sft)
        pretrain_image, pretrain = split_by_images(suite.pretrain)
        objectives = [  # each image twin weighs as its text objective (`--sft_weight 0` turns both off)
            DemonstrationObjective(SFTObjective.NAME + IMAGE_SUFFIX, sft_image, weight=config.sft_weight),
            LanguageModelingObjective(
                PretrainingObjective.NAME + IMAGE_SUFFIX, pretrain_image, weight=config.pretrain_weight
            ),
        ]
    return TRAPOTrainer(
        model if model is not None else build_tiny_vlm(data.processor, seed=config.seed),
        reward_funcs=suite.reward_funcs,
        args=config,
        train_dataset=suite.rl_train,
        sft_dataset=sft,
        pretrain_dataset=pretrain,
        processing_class=data.processor,
        objectives=objectives or None,
    )


def run_job(data: VisionJobData, trainer, config: TRAPOConfig, job_start: float) -> dict[str, float]:
    """Evaluate, train jointly (resuming from `resume_from_checkpoint` when given), evaluate again, save the model,
    its processor, `trainer_state.json` and `eval_results.json` (`trl_trapo.jobs.main.train_job` and `save_job`, shared
    with the main job).

    Raises:
        trl_trapo.checkpoint.CheckpointError: if `resume_from_checkpoint` is incomplete or corrupted.
        trl_trapo.saving.SaveError: if a file of the output folder cannot be written.
    """
    from .main import save_job, train_job

    # evaluate, train (resuming from resume_from_checkpoint when given), evaluate; save as the main job does
    results = {f"eval_{k}_initial": v for k, v in evaluate(trainer.model, data).items()}
    results.update(train_job(trainer))
    results.update({f"eval_{k}": v for k, v in evaluate(trainer.model, data).items()})
    save_job(trainer, results)
    if trainer.accelerator.is_main_process:
        print(summary(config.output_dir, results, time.perf_counter() - job_start), flush=True)
    return results


@releases_job_holds  # the hold on output_dir it takes (saving.hold_output_dir) ends with it
def main(job_args: VisionJobArguments, config: TRAPOConfig) -> dict[str, float]:
    """The job: build, evaluate, train jointly, evaluate again, save.

    Returns:
        The results written to `<output_dir>/eval_results.json`: `eval_<metric>_initial` and `eval_<metric>` for
        every metric of [`evaluate`], `train_runtime_s` (seconds) and `train_loss`.
    """
    job_start = time.perf_counter()
    check_launch(config.distributed_state)  # a launch that does not match the run: before data and model
    data = build_data(job_args)
    return run_job(data, build_trainer(data, config), config, job_start)


SUMMARY_METRICS = ("accuracy", "accuracy_sft_tasks", "accuracy_rl_only", "caption_loss")


def summary(output_dir: str, results: dict[str, float], seconds: float) -> str:
    """A few lines for the human who launched the job: where the results are, the headline metrics before -> after,
    wall time."""
    names = [n for n in SUMMARY_METRICS if f"eval_{n}" in results]
    width = max(len(name) for name in names)
    lines = [f"Done in {seconds:.0f} s (training {results['train_runtime_s']:.0f} s). Output: {output_dir}"]
    for name in names:
        lines.append(f"  {name:<{width}}  {results[f'eval_{name}_initial']:.3f} -> {results[f'eval_{name}']:.3f}")
    return "\n".join(lines)


@releases_job_holds  # the hold on output_dir it takes (saving.hold_output_dir) ends with it
def run(argv: list[str] | None = None, program: str | None = None) -> int:
    """The command line: parse, build, run the job; a user error becomes one message on stderr and exit status 2, as
    in the main job (`TRAPO_DEBUG=1` raises it with its traceback instead).

    Returns:
        0 after a complete job, 2 after a user error.

    Raises:
        SystemExit: from argparse, for `--help` (status 0) or a malformed command line (status 2).
    """
    from .main import RUN_USER_ERRORS, SETUP_USER_ERRORS, debug_requested, report_user_error

    user_errors = SETUP_USER_ERRORS
    try:
        job_args, config = parse_args(argv, prog=program)
        job_start = time.perf_counter()
        data = build_data(job_args)
        trainer = build_trainer(data, config)
        user_errors = RUN_USER_ERRORS
        run_job(data, trainer, config, job_start)
    except Exception as error:
        if not isinstance(error, user_errors) or debug_requested():
            raise
        return report_user_error(error, program or os.path.basename(sys.argv[0]) or "trapo_vlm.py")
    return 0


__all__ = [
    "VLM_JOB_DEFAULTS",
    "VisionJobArguments",
    "VisionJobData",
    "build_data",
    "build_trainer",
    "evaluate",
    "main",
    "make_parser",
    "parse_args",
    "run",
    "run_job",
    "split_by_images",
]
