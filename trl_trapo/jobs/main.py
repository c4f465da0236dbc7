# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The command line of the main TRAPO job (`examples/trapo.py`): its arguments, the loading of the user's data and
model (or of the built-in ones), and `main` — evaluate, train jointly, evaluate again, save.

    from trl_trapo.jobs.main import main, parse_args, run

    script_args, training_args, model_args = parse_args()  # sys.argv[1:]; `--config recipe.yaml` supported
    results = main(script_args, training_args, model_args)
    # or, as `examples/trapo.py` does: parse, run and turn a user error into a message and an exit status
    sys.exit(run())

**Built-in mode** is chosen by whether a model is given, in any form the parser accepts (`--model_name_or_path`,
`--model-name-or-path`, `--flag=value`, or `model_name_or_path` in the `--config` YAML). Without a model the job builds
a tiny causal LM from the config shipped in the package, a character-level tokenizer and the built-in verifiable task
suite (`trl_trapo.tasks`), with the hyper-parameters in `BUILTIN_DEFAULTS` for whatever you do not set: a flag you give
is never overridden, and defaults tied to one you changed follow it (`--save_steps` brings saving back, `--max_steps`
rescales the evaluation, logging and warm-up steps; see `builtin_defaults`). Data you name replaces the built-in data
of that role (`--dataset_name`: the RL prompts *and* the built-in held-out evaluation; `--sft_dataset_name`,
`--pretrain_dataset_name`) and `--reward_funcs` (or `--reward_model_name_or_path`) replaces the built-in `exact_match`
reward; one log line says which roles come from the built-in suite and which from you.

**Datasets** are Hub ids, local files (.json/.jsonl/.csv/.parquet/.txt) or directories (data files named by split, or a
`save_to_disk` directory); the Hub is contacted only for ids. A single local file has only a `train` split. The
held-out RL evaluation uses `--dataset_test_split` if given (an error if that split does not exist, naming the
available ones); by default it uses the `test` split of a directory or Hub dataset when there is one, and there is no
held-out RL evaluation otherwise (never the training rows, unless you ask for them with `--dataset_test_split train`).
`--dataset_test_split none` switches it off (in built-in mode, the built-in evaluation too); `--eval_strategy no`
switches off only the evaluations during training, and a line says so ([`eval_strategy_note`]).

**Arguments** are spelt in full: an abbreviation (`--learning_rat`), a misspelt flag or an unknown key in the
`--config` YAML is an error that suggests the closest argument ("Did you mean --learning_rate?"); several are named
together, in one message with a fix each (as are several bad keys of one recipe).

Every error about an input is a `ValueError` that names the argument, the bad value and the fix, raised before any
training (the trainer's own checks of the data and models name the flag too, not the trainer's Python argument:
`--distillation_dataset_name`, never `distillation_dataset`; see `flag_names`): every path (model, datasets,
`--resume_from_checkpoint`, `--config`) is checked before anything is loaded, and bad data is reported before any
model is loaded. On the command line (`run`) such an error is one message on
stderr, `trapo.py: error: ...`, and exit status 2 (argparse's, for a malformed command line), without a traceback;
`TRAPO_DEBUG=1` shows it. Which exceptions count as the user's, and when: `SETUP_USER_ERRORS`, `RUN_USER_ERRORS`.

**Reward functions** (`--reward_funcs`) are built-in names or, as in TRL's scripts, dotted import paths of your own
functions (`my_module.my_reward`, importable from the launch directory). **`--max_eval_samples N`** evaluates on the
first N rows of every evaluation dataset the job builds. The job ends with a short summary: output folder, files written,
headline metrics before -> after, wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import importlib
import json
import logging
import os
import re
import signal
import sys
import time
import traceback
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import yaml
from datasets import load_dataset, load_from_disk
from transformers import AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.checkpoint import CheckpointError, atomic_write_bytes
from trl_trapo.config import (
    ACCEPTED_TYPES,
    GRPO_ONLY_FIXES,
    TRANSFORMERS4_FIXES,
    changed_settings,
    foreign_fields,
    warn_ignored_settings,
)
from trl_trapo.distributed import (
    check_launch,
    end_process_group,
    exit_failed_rank,
    in_process_group_of_several,
    lost_peer,
)
from trl_trapo.experimental.fewshot import FewShotTRAPOTrainer
from trl_trapo.interrupts import SIGPIPE, TrainingInterrupted, drop_output, output_pipe_closed, say
from trl_trapo.jobs.launcher import launcher_option_hint
from trl_trapo.objectives import WITH_DATA, RLObjective
from trl_trapo.paths import (
    FILE_BUILDERS,
    check_data_source,
    check_model_source,
    check_tokenizer_source,
    folder_files_problem,
)
from trl_trapo.rewards import REWARD_FUNCTIONS, RewardFunctionError
from trl_trapo.saving import (
    HubPushError,
    SaveError,
    check_earlier_checkpoints,
    check_output_dir,
    describe_os_error,
    hold_output_dir,
    releases_job_holds,
)
from trl_trapo.setup_checks import apply_log_level


TRAINER_STATE_NAME = "trainer_state.json"  # what every checkpoint the Trainer writes holds


logger = logging.getLogger(__name__)

# Hyper-parameters of the built-in tiny job (used only when no model is given, and only for what the user does not
# set: see `builtin_defaults`). Tested on 2 CPU cores.
BUILTIN_DEFAULTS = dict(
    output_dir="trapo-output",
    max_steps=1000,
    per_device_train_batch_size=32,
    gradient_accumulation_steps=2,
    learning_rate=2e-3,
    lr_scheduler_type="cosine_with_min_lr",
    lr_scheduler_kwargs={"min_lr_rate": 0.1},
    warmup_steps=30,
    adam_beta2=0.99,
    weight_decay=0.0,
    max_grad_norm=1.0,
    logging_steps=10,
    eval_strategy="steps",
    eval_steps=250,
    save_strategy="no",
    report_to="none",
    activation_checkpointing=False,
    pretrain_max_length=64,
    sft_max_length=32,
    max_prompt_length=16,
    response_length=8,
    num_generations=8,
    temperature=1.0,
    kl_coef=0.01,
    sync_ref_model=True,  # the tiny model starts from random weights: anchor the KL to a lagging copy, not to noise
    ref_model_sync_steps=25,
    ref_model_mixup_alpha=0.5,
    seed=0,
    per_device_eval_batch_size=200,
    dataloader_num_workers=0,
)
# Built-in defaults that an argument the user sets (to a value other than the built-in one) makes wrong; they are
# dropped then, so `TRAPOConfig`'s own default applies: a user who asks for checkpoints gets them, epochs are not
# capped by the built-in `max_steps`, another scheduler does not receive cosine's `min_lr_rate`.
BUILTIN_YIELDS = {
    "save_strategy": (
        "save_steps",
        "save_total_limit",
        "save_only_model",
        "save_on_each_node",
        "load_best_model_at_end",
        "metric_for_best_model",
        "hub_strategy",
    ),
    "max_steps": ("num_train_epochs",),
    "lr_scheduler_kwargs": ("lr_scheduler_type",),
    "response_length": ("max_completion_length",),  # GRPO's name of the same setting: the user's value must win
    "kl_coef": ("beta",),  # GRPO's name of kl_coef (config.GRPO_ALIASES; the other aliases' targets have no built-in)
}
# Built-in defaults proportional to the run's length (set for `max_steps=1000`): they follow the user's run length.
BUILTIN_SCALED = ("eval_steps", "logging_steps", "warmup_steps")


# ---------------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class RLDataArguments(ScriptArguments):
    """The RL prompts' flags, TRL's `ScriptArguments` with this job's defaults and help (see
    [`TRAPOScriptArguments`]): the first fields of the job's data arguments."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "RL prompts: a Hub dataset id, a local file (.json/.jsonl/.csv/.parquet) or directory."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Configuration name of `dataset_name`."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split of `dataset_name` to train on."})
    dataset_test_split: str | None = field(
        default=None,
        metadata={
            "help": "Split of `dataset_name` for the held-out RL evaluation (an error if it does not exist). Default: "
            "`test` when the dataset (a directory or Hub id) has one, else no held-out RL evaluation; a single local "
            "file has only `train`. `none` switches the evaluation off, before, during and after training (in "
            "built-in mode the built-in one too; `--eval_strategy no` switches off only the evaluations during "
            "training)."
        },
    )
    dataset_streaming: bool = field(
        default=False,
        metadata={
            "help": "Not supported for the RL prompts (they are read into memory); an error if set. Stream the "
            "pretraining text with `pretrain_streaming`."
        },
    )
    ignore_bias_buffers: bool = field(
        default=False, metadata={"help": "Not supported by this job (TRL's DDP workaround); an error if set."}
    )


def flagged_objectives(base: type) -> list[type]:
    """The objectives of `trl_trapo.objectives.WITH_DATA` whose dataset flags the dataclass `base` does not declare
    (the job generates them: [`objective_data_fields`]), in their order."""
    declared = {f.name for f in dataclasses.fields(base)}
    return [cls for cls in WITH_DATA if f"{cls.DATA_FLAGS}_name" not in declared]


def objective_data_fields(base: type) -> list[tuple[str, typing.Any, typing.Any]]:
    """The dataset flags of each objective of `trl_trapo.objectives.WITH_DATA` that the dataclass `base` does not
    declare (TRL's `ScriptArguments` declares the RL prompts'), in the objectives' order, as
    `dataclasses.make_dataclass` takes them: `<DATA_FLAGS>_name` (help: the class's `DATA_HELP`), `<DATA_FLAGS>_config`,
    `<DATA_FLAGS>_split` (default `train`; help: `SPLIT_HELP`) and, for an objective that can stream its data, its
    `STREAMING_FLAG` (a bool)."""
    out: list[tuple[str, typing.Any, typing.Any]] = []
    for cls in flagged_objectives(base):
        out += [
            (f"{cls.DATA_FLAGS}_name", str | None, field(default=None, metadata={"help": cls.DATA_HELP})),
            (f"{cls.DATA_FLAGS}_config", str | None, field(default=None, metadata={"help": "Configuration name."})),
            (f"{cls.DATA_FLAGS}_split", str, field(default="train", metadata={"help": cls.SPLIT_HELP})),
        ]
        if cls.STREAMING_FLAG is not None:
            out.append((cls.STREAMING_FLAG, bool, field(default=False, metadata={"help": cls.STREAMING_HELP})))
    return out


ObjectiveDataArguments = dataclasses.make_dataclass(
    "ObjectiveDataArguments", objective_data_fields(RLDataArguments), bases=(RLDataArguments,)
)
ObjectiveDataArguments.__module__ = __name__
ObjectiveDataArguments.__doc__ = """The RL prompts' flags ([`RLDataArguments`]), then each other objective's dataset
flags ([`objective_data_fields`])."""


@dataclass
class TRAPOScriptArguments(ObjectiveDataArguments):
    """Data and reward arguments of the main job (model arguments come from TRL's `ModelConfig`, training arguments
    from `TRAPOConfig`).

    Extends TRL's `ScriptArguments` (the same `dataset_name`, `dataset_config`, `dataset_train_split`,
    `dataset_test_split` as TRL's scripts) with the pretraining and SFT datasets, the rewards and a critic. Differences
    from TRL's fields: `dataset_name` may be a local file or directory as well as a Hub id, and `dataset_test_split`
    defaults to None (the `test` split when the dataset has one, else no held-out RL evaluation) instead of `"test"`.
    TRL's `dataset_streaming` and `ignore_bias_buffers` are not supported: setting either is an error that says so.

    The flags of the other objectives' datasets (`--pretrain_dataset_name` / `_config` / `_split`,
    `--pretrain_streaming`, `--sft_dataset_*`, `--distillation_dataset_*`) are generated from the objectives that have
    data (`trl_trapo.objectives.WITH_DATA`: each class's `DATA_FLAGS`, `DATA_HELP`, `SPLIT_HELP`, `STREAMING_FLAG`),
    in their order, by [`objective_data_fields`].
    """

    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={
            "help": f"Reward functions: built-in names ({', '.join(sorted(REWARD_FUNCTIONS))}) or dotted import paths "
            "of your own functions (`my_module.my_reward`, importable from the current directory), as in TRL's "
            "scripts."
        },
    )
    reward_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Sequence-classification reward model (Hub id or local directory)."}
    )
    value_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Critic (sequence classification, num_labels=1); enables GAE advantages."}
    )
    task_suite_seed: int = field(default=0, metadata={"help": "Seed of the built-in task suite."})
    max_eval_samples: int | None = field(
        default=None,
        metadata={
            "help": "Evaluate on at most this many rows of every evaluation dataset the job builds (the held-out RL "
            "prompts, yours or the built-in ones; the first N rows, as in the Hugging Face example scripts), to "
            "shorten the evaluations before, during and after training. None: every row."
        },
    )

    def __post_init__(self):
        if self.max_eval_samples is not None and not (
            isinstance(self.max_eval_samples, int) and not isinstance(self.max_eval_samples, bool)
        ):
            raise ValueError(
                f"--max_eval_samples={self.max_eval_samples!r}: not a whole number. Fix: give a number of rows >= 1, "
                "or leave it unset to evaluate on every row."
            )
        if self.max_eval_samples is not None and self.max_eval_samples < 1:
            raise ValueError(
                f"--max_eval_samples={self.max_eval_samples}: must be >= 1 (rows of each evaluation dataset). Fix: give "
                "a number of rows >= 1, or leave it unset to evaluate on every row."
            )


SCRIPT_FIELDS = {f.name for f in dataclasses.fields(TRAPOScriptArguments)}


def make_parser(prog: str | None = None) -> TrlParser:
    """The job's command-line parser.

    Args:
        prog: the command its usage line and its errors name (default `examples/trapo.py` in the usage line and the
            script's file name in the errors, argparse's; `trapo train` for the `trapo` command).

    Returns:
        `TrlParser` over `(TRAPOScriptArguments, TRAPOConfig, ModelConfig)`; `--config recipe.yaml` supported.
        Abbreviations are refused (`allow_abbrev=False`): `--learning_rat` is an error, not `--learning_rate`.
    """
    builtin = ", ".join(f"{k}={v}" for k, v in BUILTIN_DEFAULTS.items() if k not in ("report_to", "output_dir"))
    parser = TrlParser(
        (TRAPOScriptArguments, TRAPOConfig, ModelConfig),
        allow_abbrev=False,
        **({"prog": prog} if prog else {}),  # argparse's error prefix; its default is the script's file name
        usage=f"{prog or MAIN_PROGRAM} [--config RECIPE.yaml] [--ARGUMENT VALUE ...]",
        epilog=(
            "--config RECIPE.yaml reads arguments from a YAML file (keys are the argument names above); flags given on "
            "the command line override the file. The defaults shown are TRAPOConfig's, which apply to your model "
            "(--model_name_or_path, or model_name_or_path in the recipe). Without a model the job trains the "
            "built-in tiny task suite and, for what you do not set, uses these instead: " + builtin + "."
        ),
    )
    return take_mixture_mappings(parser)


JOB_CLASSES = (TRAPOScriptArguments, TRAPOConfig, ModelConfig)
"""The argument dataclasses of the main job's parser. The helpers below take another tuple (and the program's name,
for their messages) for a job whose parser has other dataclasses, e.g. `examples/trapo_vlm.py`'s: see
[`parse_job_args`]."""
MAIN_PROGRAM = "examples/trapo.py"


def help_command(program: str, command: str | None = None) -> str:
    """The command that lists a job's arguments, as the user runs the job: `trapo train --help` under the `trapo`
    command (`command`, the command the user typed), else `python <program> --help` (the example script)."""
    return f"{command} --help" if command else f"python {program} --help"


def known_fields(classes: tuple = JOB_CLASSES) -> list[str]:
    """Every argument name the parser accepts (the fields of `classes`, the parser's dataclasses), without `--`."""
    return [f.name for cls in classes for f in dataclasses.fields(cls) if f.init]


REMOVED = "was removed in transformers 5: drop it; "
REMOVED_ARGUMENTS = {
    **{  # the Python table's, with flags (its replacement field, or its sentence)
        name: "was removed in transformers 5: " + (f"use --{fix}" if fix.isidentifier() else fix)
        for name, fix in TRANSFORMERS4_FIXES.items()
    },
    "logging_dir": REMOVED + "TensorBoard logs go under --output_dir (its `runs/` folder), or where the "
    "TENSORBOARD_LOGGING_DIR environment variable says",
    "evaluation_strategy": REMOVED + "use --eval_strategy",
    "warmup_ratio": REMOVED + "use --warmup_steps, which reads a value below 1 as a fraction of the training steps",
    "no_cuda": REMOVED + "use --use_cpu",
    "per_gpu_train_batch_size": REMOVED + "use --per_device_train_batch_size",
    "per_gpu_eval_batch_size": REMOVED + "use --per_device_eval_batch_size",
    "push_to_hub_token": REMOVED + "use --hub_token",
    "push_to_hub_model_id": REMOVED + "use --hub_model_id",
    "torch_dtype": "is TRL ModelConfig's old name of --dtype (renamed before TRL 1.0, as transformers renamed "
    "`from_pretrained(torch_dtype=)`). Fix: use --dtype (e.g. `--dtype bfloat16`)",
}
"""Fields that transformers 4 (`TrainingArguments`) and older TRL (`ModelConfig.torch_dtype`) had and that are gone
or renamed, which recipes and TRL scripts written for them still pass -> what happened to each and what replaces it
(a sentence after `--name`): `config.TRANSFORMERS4_FIXES`' entries with flags, the first ones in words of their own.
The closest surviving name can be unrelated (`--logging_dir` is closest to `--logging_first_step`, `--torch_dtype`
to `--torch_threads`), so these are said by name."""


TRL_ARGUMENT_FIXES = {
    "chat_template_path": "the chat template is the tokenizer's here: save the template with the tokenizer "
    "(`tok.chat_template = open(path).read(); tok.save_pretrained(folder)`) and pass --model_name_or_path folder",
    "max_length": "the SFT row length is --sft_max_length, the pretraining row length --pretrain_max_length",
    "packing": "pretraining documents are packed (--pretrain_packing, on by default); SFT rows are not packed",
    "dataset_text_field": "documents are read from a `text` column, and only as pretraining data "
    "(--pretrain_dataset_name): rename your column to `text`",
    **GRPO_ONLY_FIXES,
    "trust_remote_code": "the model loads with the keywords of --model_init_kwargs: "
    "`--model_init_kwargs '{\"trust_remote_code\": true}'` (--teacher_model_init_kwargs for a teacher), only for a "
    "model whose code you have read",
}
"""Arguments of TRL's `SFTConfig` / `GRPOConfig` scripts that this project has no field of -> what to do instead. The
closest surviving name is often something else (`--chat_template_path` is closest to `--chat_template_kwargs`), so
these are said by name; any other TRL field is named as TRL's, without a guess."""


@functools.cache
def trl_only_fields() -> dict[str, str]:
    """Field name -> the TRL config class that has it, for the fields of TRL's `SFTConfig` and `GRPOConfig` that the
    main job's parser does not have."""
    from trl import GRPOConfig, SFTConfig

    known = set(known_fields(JOB_CLASSES))
    found: dict[str, str] = {}
    for cls in (SFTConfig, GRPOConfig):
        for f in dataclasses.fields(cls):
            if f.init and f.name not in known:
                found.setdefault(f.name, cls.__name__)
    return found


def did_you_mean(name: str, classes: tuple = JOB_CLASSES, program: str = MAIN_PROGRAM, value: object = None) -> str:
    """A `did you mean --x?` hint for an unknown argument name: the known names it abbreviates, else the closest ones;
    for a `TrainingArguments` field transformers 5 removed or a renamed TRL field ([`REMOVED_ARGUMENTS`]), its
    replacement; for an argument of the main job given to another job (the built-in `vlm` and `tools` jobs), which
    job has it and where the user's own model and data go (the job's arguments class's `own_data` text); for a field of TRL's `SFTConfig` /
    `GRPOConfig` that the job lacks, that it is TRL's and what to use ([`TRL_ARGUMENT_FIXES`]); for an option of
    `accelerate launch` (`--num_processes`, `--dynamo_backend`, ...), that it is the launcher's and where it goes
    (`trl_trapo.jobs.launcher.launcher_option_hint`; the closest job argument, e.g. `--ddp_backend`, is another thing).

    Args:
        name: the unknown name, with or without leading dashes; hyphens count as underscores.
        classes: the parser's argument dataclasses (default: the main job's).
        program: the job's example script, which the launcher's fix names.
        value: the value given with it, which the launcher's fix shows (None: unknown).

    Returns:
        `" Did you mean --x?"` (`--x or --y` for an abbreviation of several), `" --x was removed in transformers 5:
        ..."` (`" --torch_dtype is TRL ModelConfig's old name ..."`), `" --x is an argument of the main job ... Fix: ..."`, `" --x is TRL SFTConfig's argument ... Fix:
        ..."`, `" --x is an option of ... accelerate launch ... Fix: ..."`, `" --x is TRL 0.x PPOConfig's argument
        ... Fix: ..."` (`config.foreign_fields`; the last four say their own fix), or `""` when nothing is close.
    """
    name = name.lstrip("-").replace("-", "_")
    known = known_fields(classes)
    if name in REMOVED_ARGUMENTS and name not in known:
        return f" --{name} {REMOVED_ARGUMENTS[name]}."
    if name not in known and name in known_fields(JOB_CLASSES):
        own_data = next((cls.own_data for cls in classes if getattr(cls, "own_data", None)), "")
        return (
            f" --{name} is an argument of the main job (`trapo train`, {MAIN_PROGRAM}), not of this one, which trains "
            f"its built-in model and data only. Fix: drop it here.{' ' + own_data if own_data else ''}"
        )
    if name not in known and name in trl_only_fields():
        owner = trl_only_fields()[name]
        fix = TRL_ARGUMENT_FIXES.get(name) or (
            "drop it; TRAPO has no field of that name (docs/agents.md, Moving a GRPOTrainer script over, compares "
            "GRPOConfig's settings with TRAPO's)"
            if owner == "GRPOConfig"
            else "drop it; TRAPO has no field of that name (the SFT objective's settings are the sft_* arguments)"
        )
        return f" --{name} is TRL {owner}'s argument, which this job does not have. Fix: {fix}."
    if name not in known and launcher_option_hint(name, value, program):
        return launcher_option_hint(name, value, program)
    matches = [k for k in known if k.startswith(name)][:3]  # an abbreviation of this job's flags first
    if not matches and name not in known:
        for _, source, fix in foreign_fields([name]):  # TRL 0.x PPOConfig's fields (and older SFTConfigs')
            return f" --{name} is {source}'s argument, which this job does not have. Fix: " + (
                f"use --{fix}." if fix.isidentifier() else f"{fix}."
            )
    matches = matches or difflib.get_close_matches(name, known, n=1)
    return f" Did you mean {' or '.join(f'--{m}' for m in matches)}?" if matches else ""


def optional_bool_fields(classes: tuple = JOB_CLASSES) -> set[str]:
    """The arguments typed `bool | None` (default None: "decide for me", e.g. `bf16`, `exploration`).

    `HfArgumentParser` gives a bare-flag form (`--fp16`) only to `bool` fields; these need a value (`--bf16 true`),
    so `normalize_argv` supplies `true` when the flag stands alone.

    Returns:
        Their names (without `--`).
    """
    names = set()
    for cls in classes:
        hints = typing.get_type_hints(cls)
        names |= {f.name for f in dataclasses.fields(cls) if f.init and hints[f.name] == bool | None}
    return names


# a negative number argparse would read as an option: Python 3.11's argparse knows `-1` and `-0.5` as numbers but not
# the exponent form (`-1e-3`), so `--learning_rate -1e-3` was "expected one argument"
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


MIXTURE_FLAGS = ("--curriculum_mixtures", "--curriculum-mixtures")
MIXTURE_FORMS = (
    "give 3 numbers (pretrain sft rl) per phase, e.g. --curriculum_mixtures 0.7 0.2 0.1 0.3 0.5 0.2 0.1 0.3 0.6, or "
    "one JSON object objective -> share per phase, e.g. --curriculum_mixtures "
    '\'[{"pretrain": 0.7, "sft": 0.2, "rl": 0.1}, {"pretrain": 0.3, "sft": 0.5, "rl": 0.2}, '
    '{"pretrain": 0.1, "sft": 0.3, "rl": 0.6}]\''
)
"""The two forms `--curriculum_mixtures` takes on the command line, for its messages."""
JSON_LIST_FLAGS = (*MIXTURE_FLAGS, "--curriculum_boundaries", "--curriculum-boundaries")
"""The flags that also take their list as one JSON value (`--curriculum_boundaries '[0.5]'`; `'[]'`: no boundary, one
phase, which the flags' own form, one value each, cannot say): [`normalize_argv`] spells it as one value per item."""


def mixture_item(text: str) -> float | dict | list:
    """One value of `--curriculum_mixtures` on the command line: a number (the three-number form), a JSON list of three
    numbers (one phase's triple: `TRAPOConfig` flattens a list of them) or a JSON object objective name -> share (one phase of the mapping form `TRAPOConfig.curriculum_mixtures` takes, as in Python);
    `normalize_argv` spells a JSON list of them as one value each. `TRAPOConfig` checks the shares.

    Raises:
        argparse.ArgumentTypeError: for text that is neither, naming both forms (argparse's "invalid float value").
    """
    try:
        return float(text)
    except ValueError:
        pass
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        value, problem = None, f"not a number, and not JSON ({error})"
    else:
        problem = "a JSON value that is neither a number nor an object"
    if isinstance(value, dict):
        return value
    if (
        isinstance(value, list)
        and len(value) == 3
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
    ):
        return value  # one (pretrain, sft, rl) triple per phase (a JSON list of them): TRAPOConfig flattens it
    raise argparse.ArgumentTypeError(f"{text!r} is {problem}. Fix: {MIXTURE_FORMS}.")


def take_mixture_mappings(parser: TrlParser) -> TrlParser:
    """`parser` with `--curriculum_mixtures` taking the mapping form too ([`mixture_item`]): `HfArgumentParser`
    types the `list[float]` field's values as floats, while `TRAPOConfig` also takes one mapping per phase (its
    `ACCEPTED_TYPES`), the only way to give an added objective (e.g. `distill`) its own share. `--curriculum_boundaries`
    takes no value too (`--curriculum_boundaries '[]'`, see `JSON_LIST_FLAGS`): no boundary, one phase, as
    `curriculum_boundaries=[]` in Python (`HfArgumentParser` asks a list for one value at least)."""
    for action in parser._actions:  # noqa: SLF001 (argparse has no public list of a parser's actions)
        if action.dest == "curriculum_mixtures":
            action.type = mixture_item
        elif action.dest == "curriculum_boundaries":
            action.nargs = "*"
    return parser


def json_list_items(text: str) -> list[str]:
    """The items of the JSON list `text`, one command-line value each (objects as JSON, numbers as text); `[text]`
    when it is no JSON list (then [`mixture_item`] says what is wrong)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return [text]
    if not isinstance(value, list):
        return [text]
    return [json.dumps(item) if isinstance(item, (dict, list)) else str(item) for item in value]


def normalize_argv(argv: list[str], classes: tuple = JOB_CLASSES) -> list[str]:
    """`argv` in the forms the parser reads as the user meant them.

    1. `--config=PATH` is spelt `--config PATH`, the only form `TrlParser` reads.
    2. A `bool | None` flag given alone (`--bf16`, followed by another flag or by nothing) gets the value `true`, as a
       `bool` flag (`--fp16`) does (see `optional_bool_fields`).
    3. A negative number after a flag is joined to it (`--learning_rate -1e-3` -> `--learning_rate=-1e-3`), so
       argparse does not take the exponent form for an option.
    4. A JSON list given to `--curriculum_mixtures` (`'[{"rl": 1.0}, ...]'`, the mapping form docs/seams.md shows)
       or `--curriculum_boundaries` (`'[]'`: one phase) is spelt as one value per item, as argparse reads a list
       ([`mixture_item`] reads each mixture item; `JSON_LIST_FLAGS`).

    Args:
        argv: command-line arguments, without the program name.
        classes: the parser's argument dataclasses (default: the main job's).

    Returns:
        A new list.
    """
    flags = {form for name in optional_bool_fields(classes) for form in (f"--{name}", f"--{name.replace('_', '-')}")}
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        following = argv[i + 1] if i + 1 < len(argv) else None
        name, eq, value = token.partition("=")
        if token.startswith("--config="):
            out += ["--config", token.split("=", 1)[1]]
        elif name in JSON_LIST_FLAGS and eq and value.lstrip().startswith("["):
            out += [name, *json_list_items(value)]
        elif token in JSON_LIST_FLAGS and following is not None and following.lstrip().startswith("["):
            out += [token, *json_list_items(following)]
            i += 1
        elif token in flags and (following is None or following.startswith("-")):
            out.append(f"{token}=true")
        elif token.startswith("--") and "=" not in token and following and NEGATIVE_NUMBER.match(following):
            out.append(f"{token}={following}")
            i += 1
        else:
            out.append(token)
        i += 1
    return out


EMPTY_MEANS_DEFAULT = {"reward_funcs": "the built-in reward (exact_match)"}
"""Recipe keys whose empty list is their default, which stands for something else (`--reward_funcs ''` on the command
line is refused as a name)."""


NULL_MEANS_FALLBACK = {"output_dir": "transformers' fallback folder, ./trainer_output"}
"""Recipe keys whose empty value (YAML null) the parser takes as given: the run then uses a fallback the job's
documentation never names, without a word (trial 11's C20: an empty `output_dir:` wrote to ./trainer_output)."""


ACCELERATE_CONFIG_KEYS = frozenset({"compute_environment", "distributed_type"})
"""Keys every accelerate config has (`accelerate config` writes both; accelerate refuses a file without
`distributed_type`): a `--config_file` without them is no accelerate config, and a `--config` recipe with them is one."""


def accelerate_config_hint(path: str, config: dict, program: str = MAIN_PROGRAM) -> str:
    """For a `--config` file that is an accelerate config (it has `compute_environment` or `distributed_type`,
    [`ACCELERATE_CONFIG_KEYS`]), what it is and where it goes; `""` for any other file."""
    keys = sorted(ACCELERATE_CONFIG_KEYS & set(config))
    if not keys:
        return ""
    return (
        f" It is an accelerate config (it has {', '.join(keys)}), not a training recipe. Fix: pass it as "
        f"--config_file {path} (or --accelerate_config {path}) to `trapo`, or `accelerate launch --config_file {path} "
        f"{program}`; --config takes a training recipe (examples/recipes/)."
    )


DEEPSPEED_CONFIG_KEYS = frozenset(
    {
        "zero_optimization",
        "train_micro_batch_size_per_gpu",
        "train_batch_size",
        "gradient_clipping",
        "steps_per_print",
        "wall_clock_breakdown",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
    }
)
"""Top-level keys of a DeepSpeed JSON config that no job argument has (`zero_optimization`, the batch sizes, ...):
a `--config` recipe with one of them is a DeepSpeed config."""


def deepspeed_config_hint(path: str, config: dict, program: str = MAIN_PROGRAM) -> str:
    """For a `--config` file that is a DeepSpeed config (it has a key of [`DEEPSPEED_CONFIG_KEYS`]), what it is and
    where it goes; `""` for any other file."""
    keys = sorted(DEEPSPEED_CONFIG_KEYS & set(config))
    if not keys:
        return ""
    return (
        f" It is a DeepSpeed config (it has {', '.join(keys)}), not a training recipe. Fix: pass it as --deepspeed "
        f"{path}, under a launcher (`accelerate launch --use_deepspeed --deepspeed_config_file {path} {program} ...`"
        ", docs/distributed.md), or launch with a DeepSpeed config TRL ships (`--accelerate_config zero2` to `trapo`); "
        "--config takes a training recipe (examples/recipes/)."
    )


def read_config_file(
    path: str, classes: tuple = JOB_CLASSES, program: str = MAIN_PROGRAM, command: str | None = None
) -> dict:
    """The mapping in the `--config` YAML file `path`, every key checked against the known argument names.

    Args:
        path: the value of `--config`.
        classes: the parser's argument dataclasses (default: the main job's).
        program: the script the messages name (`python <program> --help`).
        command: the command the user typed, when it is not `python <program>` (`trapo train`): the messages name
            `<command> --help` instead ([`help_command`]).

    Returns:
        The file's mapping (`{}` for an empty file); `env` (environment variables, as in `TrlParser`) is allowed.

    Raises:
        ValueError: naming `--config`, if the file does not exist, is not valid YAML (with the line and column), does
            not hold a YAML mapping; for keys that are no argument (with the closest known names) or whose value the
            argument cannot take: every such key in one message, one line and fix each (a file that is an accelerate
            or DeepSpeed config: one message saying where it goes).
    """
    if not os.path.isfile(path):
        raise ValueError(f"--config={path!r}: no such file. Fix: give the path of a YAML recipe.")
    try:
        with open(path, encoding="utf-8") as handle:
            config = yaml.load(handle, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except DuplicateKeyError as error:
        raise ValueError(f"--config={path!r}: {error}") from error
    except UnicodeDecodeError as error:
        raise ValueError(
            f"--config={path!r}: not UTF-8 text ({error.reason} at byte {error.start}). Fix: save it as UTF-8 (e.g. "
            f"`iconv -f latin1 -t utf-8 {path} > recipe.yaml`)."
        ) from error
    except yaml.YAMLError as error:  # the message says where: `line 3, column 7`
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(
            f"--config={path!r}: not valid YAML{where} ({getattr(error, 'problem', None) or error}). Fix: write one "
            "`key: value` per line (e.g. `learning_rate: 1.0e-5`), quoting values that hold `: ` or ` #`."
        ) from error
    if config is None:  # TRL's parser, which reads the file again, refuses it with "must contain a YAML mapping"
        raise ValueError(
            f"--config={path!r}: the file holds no settings (it is empty, or only comments). Fix: write one "
            "`key: value` per line (e.g. `max_steps: 100`), or drop --config."
        )
    if not isinstance(config, dict):
        raise ValueError(f"--config={path!r}: the file must hold a YAML mapping (`key: value` lines).")
    known = set(known_fields(classes)) | {"env"}
    kinds = field_types(classes)
    # an accelerate or DeepSpeed config: every key is unknown, and the one fix is to pass the file where it belongs
    file_hint = accelerate_config_hint(path, config, program) or deepspeed_config_hint(path, config, program)
    problems = []  # every key's problem, each with its fix: one run names them all (trial 12's C08)
    for key, value in config.items():
        if key == "config":  # `config: other.yaml` was "Did you mean --fsdp_config?"
            problems.append(
                f"config: {value!r}: recipes do not include other recipes. Fix: copy the other recipe's keys into "
                "this one (the command line's own --config takes one recipe; flags after it override its keys)."
            )
        elif key not in known:
            if file_hint:
                raise ValueError(f"--config={path!r}: unknown key {key!r}: no argument has this name.{file_hint}")
            hint = launcher_option_hint(str(key), value, program) or did_you_mean(str(key), classes, program)
            problems.append(
                f"unknown key {key!r}: no argument has this name.{hint}"
                + (
                    ""
                    if " Fix: " in hint
                    else f" Fix: correct or remove it (`{help_command(program, command)}` lists every argument)."
                )
            )
        elif isinstance(value, str) and is_text_list(kinds.get(key)) and key not in TEXT_FOR_LIST:
            # argparse keeps a YAML default as it is: the job would read the text one character at a time
            problems.append(
                f"{key}: {value!r} is text, but {key} is a list (YAML does not split text into one). Fix: write "
                f"`{key}: [{value}]` (or `{key}: [a, b]` for several)."
            )
        elif value == [] and key in EMPTY_MEANS_DEFAULT:  # the default is empty too: the run would take the built-in
            problems.append(
                f"{key}: [] names nothing, so the run would use {EMPTY_MEANS_DEFAULT[key]} without a word. Fix: list "
                f"at least one (`{key}: [a]`), or leave the key out for {EMPTY_MEANS_DEFAULT[key]}."
            )
        elif value is None and key in NULL_MEANS_FALLBACK:  # `str | None`: the type check takes it
            problems.append(
                f"{key}: is empty (YAML null), so the run would use {NULL_MEANS_FALLBACK[key]}, without a word. Fix: "
                f"give a value (e.g. `{key}: runs/my-run`), or leave the key out for the job's default (built-in "
                "mode: trapo-output)."
            )
        elif problem := config_value_problem(value, kinds.get(key)):
            # the parser passes YAML values on unconverted: a list for a number failed deep in the trainer
            problems.append(
                f"{key}: {value!r} {problem}. Fix: write it as the command line would take it "
                f"(`{help_command(program, command)}` shows the type of --{key})."
            )
    if len(problems) == 1:
        raise ValueError(f"--config={path!r}: {problems[0]}")
    if problems:
        raise ValueError(
            f"--config={path!r}: {len(problems)} keys are refused, each with its fix:"
            + "".join(f"\n- {problem}" for problem in problems)
        )
    return config


class DuplicateKeyError(yaml.YAMLError):
    """A YAML mapping gives one key twice (`yaml.safe_load` keeps the last value, silently)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping, naming the key and both lines."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            mark = key_node.start_mark
            where = (mark.line + 1, mark.column + 1)
            if key in seen:
                first = seen[key]
                places = (
                    f"lines {first[0]} and {where[0]}"
                    if first[0] != where[0]
                    else f"line {where[0]}, columns {first[1]} and {where[1]}"
                )
                raise DuplicateKeyError(
                    f"the key {key!r} is given twice ({places}); YAML would keep the last value silently. Fix: keep "
                    "one of them."
                )
            seen[key] = where
        return super().construct_mapping(node, deep=deep)


TEXT_FOR_LIST = {"lora_target_modules"}
"""List arguments that also take one text value in the `--config` YAML, because what reads them takes text: PEFT's
`target_modules` reads `all-linear` (or a regular expression) as a whole. Any other list argument given text would be
read one character at a time (argparse keeps a YAML value as it is, as in `TrlParser`)."""


def is_text_list(kind) -> bool:
    """Whether the type `kind` (see `field_types`) is a list of text and nothing else that takes a string
    (`list[str]`, `list[str] | None`; not `str | list[str]`)."""
    options = (
        [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind)
        in (
            typing.Union,
            types.UnionType,
        )
        else [kind]
    )
    return len(options) == 1 and typing.get_origin(options[0]) is list and typing.get_args(options[0]) == (str,)


def field_types(classes: tuple = JOB_CLASSES) -> dict[str, object]:
    """Argument name -> its type, for the fields of `classes` (default: the main job's dataclasses): the annotated
    one, or what the field takes besides (`config.ACCEPTED_TYPES`: `curriculum_mixtures` takes one mapping per phase
    too, in a `--config` recipe as on the command line)."""
    kinds: dict[str, object] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        kinds.update({f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init})
    return kinds | {name: kind for name, kind in ACCEPTED_TYPES.items() if name in kinds}


def config_value_problem(value, kind) -> str | None:
    """What is wrong with a `--config` YAML value for an argument of type `kind`, or None if the parser takes it.

    `TrlParser` hands YAML values to argparse as defaults, and argparse converts only strings: a list, a float or a
    boolean given for a number reached the trainer as is. Checked: numbers, booleans, text, lists of those, `X | None`
    and `Literal` choices; other types (unions of several types, dicts) are left to the parser.

    Args:
        value: the YAML value.
        kind: the argument's type (see `field_types`), or None (unknown: not checked).

    Returns:
        E.g. `"is a list; a number is needed"`, or None.
    """
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        if value is None:
            return None if len(others) < len(args) else "is empty; a value is needed"
        return config_value_problem(value, others[0]) if len(others) == 1 else None
    if origin is typing.Literal:
        return None if value in args else f"is not one of {list(args)}"
    if origin is list:
        if isinstance(value, str) and args and args[0] is str:  # one name, e.g. lora_target_modules: all-linear
            return None
        if not isinstance(value, list):
            return "is not a list; write `[a, b]`"
        problems = [(item, config_value_problem(item, args[0] if args else None)) for item in value]
        return next((f"has the item {item!r}, which {problem}" for item, problem in problems if problem), None)
    described = f"is {type(value).__name__ if value is not None else 'empty'}"
    if kind is bool:
        words = ("true", "false", "yes", "no", "1", "0")
        return (
            None if isinstance(value, bool) or str(value).lower() in words else f"{described}; true or false is needed"
        )
    if kind in (int, float):
        need = "a whole number" if kind is int else "a number"
        if isinstance(value, str):
            try:
                kind(value)  # what argparse will do with it (YAML reads `1e-5`, without a dot, as text)
                return None
            except ValueError:
                return f"is not {need}"
        numbers = (int,) if kind is int else (int, float)
        return None if isinstance(value, numbers) and not isinstance(value, bool) else f"{described}; {need} is needed"
    if kind is str:
        return None if isinstance(value, str) else f"{described}; text is needed (quote it)"
    return None


def split_config(
    argv: list[str], classes: tuple = JOB_CLASSES, program: str = MAIN_PROGRAM, command: str | None = None
) -> tuple[dict, list[str]]:
    """The `--config` YAML mapping of `argv` and the other arguments.

    Args:
        argv: command-line arguments (`--config=PATH` already spelt `--config PATH`, see `normalize_argv`).
        classes, program, command: as in [`read_config_file`].

    Returns:
        `(config, rest)`: the checked YAML mapping (`{}` without `--config`) and `argv` without `--config PATH`.

    Raises:
        ValueError: if `--config` has no value or is given more than once, or as `read_config_file`.
    """
    if "--config" not in argv:
        return {}, list(argv)
    given = [argv[j + 1] for j, token in enumerate(argv[:-1]) if token == "--config"]
    if len(given) > 1:  # the second was "--config: unknown argument. Did you mean --fsdp_config?"
        raise ValueError(
            f"--config is given {len(given)} times ({', '.join(map(repr, given))}): a run reads one recipe, and "
            "recipes do not include other recipes. Fix: copy the keys of the others into one recipe, or give them as "
            "flags after --config (flags override the recipe's keys)."
        )
    i = argv.index("--config")
    if i + 1 >= len(argv):
        raise ValueError("--config needs a value: the path of a YAML recipe.")
    return read_config_file(argv[i + 1], classes, program, command), argv[:i] + argv[i + 2 :]


NOT_GIVEN = object()  # the parser's default for every argument in `given_arguments`
RECIPE_SUFFIXES = (".json", ".yaml", ".yml")
"""The endings of a file a bare command-line value may be meant as a `--config` recipe ([`bare_value_fix`])."""


def bare_value_fix(value: str, program: str = MAIN_PROGRAM) -> str:
    """The fix for a command-line value with no argument name before it: for an existing `.json` / `.yaml` file, the
    habit of transformers' example scripts (`python run_clm.py args.json` reads a lone JSON file of arguments),
    `--config <file>` (what the file is and where it goes, for an accelerate or DeepSpeed config); else "put
    `--<name>` before it".

    A bare recipe is not read as one: TRL's scripts (`TrlParser`) take a recipe only as `--config`, as this job does,
    and the file may be a DeepSpeed or accelerate config, which goes elsewhere.

    Args:
        value: the value as typed.
        program: the script the messages name.

    Returns:
        The text after "a value without an argument name.", starting with a space.
    """
    if not (value.lower().endswith(RECIPE_SUFFIXES) and os.path.isfile(value)):
        return " Fix: put `--<name>` before it."
    try:
        with open(value, encoding="utf-8") as handle:
            mapping = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        mapping = None
    if isinstance(mapping, dict):
        hint = accelerate_config_hint(value, mapping, program) or deepspeed_config_hint(value, mapping, program)
        if hint:
            return hint
    return (
        f" Did you mean `--config {value}`? A recipe file is given with --config, as in TRL's scripts (transformers' "
        f"example scripts read a lone .json file; this job does not). Fix: put --config before it."
    )


def given_arguments(
    argv: list[str],
    classes: tuple = JOB_CLASSES,
    parser_factory=None,
    program: str = MAIN_PROGRAM,
    command: str | None = None,
) -> dict:
    """The arguments the user gave, in the `--config` YAML or on the command line (which wins), with their values.

    Args:
        argv: command-line arguments, without the program name.
        classes: the parser's argument dataclasses (default: the main job's).
        parser_factory: builds a fresh parser over `classes` (default: the main job's `make_parser`); the one it
            returns gets sentinel defaults, so it must not be the parser that parses the command line.
        program: the script the messages name.
        command: as in [`read_config_file`] (`trapo train`).

    Returns:
        Argument name -> value, only for the names the user gave (defaults are not included); `env` excluded.

    Raises:
        ValueError: for a bad `--config` (see `split_config`), or for unknown command-line arguments, with the
            closest known names (abbreviations are unknown arguments): all of them in one message, a fix each.
    """
    config, rest = split_config(normalize_argv(list(argv), classes), classes, program, command)
    parser = (parser_factory or make_parser)()
    parser.set_defaults(**dict.fromkeys(known_fields(classes), NOT_GIVEN))  # non-string sentinel: argparse keeps it
    namespace, unknown = parser.parse_known_args([a for a in rest if a not in ("-h", "--help")])
    problems = []  # every unknown argument, each with its fix: one run names them all
    i = 0
    while i < len(unknown):
        flag, eq, value = unknown[i].partition("=")
        if not flag.startswith("-"):
            problems.append(f"{unknown[i]!r}: a value without an argument name.{bare_value_fix(unknown[i], program)}")
            i += 1
            continue
        values = []  # the tokens up to the next flag are this one's value(s), not arguments of their own
        while not eq and i + 1 + len(values) < len(unknown) and not unknown[i + 1 + len(values)].startswith("-"):
            values.append(unknown[i + 1 + len(values)])
        hint = did_you_mean(flag, classes, program, value if eq else (values[0] if values else None))
        problems.append(
            f"{flag}: unknown argument.{hint}"
            + (
                ""
                if " Fix: " in hint
                else f" Fix: spell the argument in full (`{help_command(program, command)}` lists every argument)."
            )
        )
        i += 1 + len(values)
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValueError(
            f"{len(problems)} arguments are refused, each with its fix:" + "".join(f"\n- {p}" for p in problems)
        )
    given = {key: value for key, value in config.items() if key != "env"}
    given.update({key: value for key, value in vars(namespace).items() if value is not NOT_GIVEN})
    return given


def parse_job_args(parser_factory, classes: tuple, argv: list[str], program: str, command: str | None = None) -> tuple:
    """Parse a job's command line with the main job's checks: `normalize_argv`'s forms (`--config=PATH`, a bare
    `bool | None` flag, a negative number), `--config` YAML keys and value types, and unknown arguments refused with
    the closest known names, before `TrlParser.parse_args_and_config` builds the dataclasses. The VLM and agent jobs
    (`trl_trapo.jobs.vision`, `trl_trapo.jobs.agent`) parse with it. An explicit `--log_level` (`--log_level_replica`
    on the other processes) then sets the `trl_trapo` logger's level ([`~trl_trapo.setup_checks.apply_log_level`]),
    before the job logs its first line; with "passive" (the default) the job logs at the level its script set (INFO).

    Args:
        parser_factory: builds the job's parser over `classes`, with the job's defaults (called twice: once for the
            checks, once to parse).
        classes: the parser's argument dataclasses, in its order.
        argv: command-line arguments, without the program name.
        program: the script the messages name (e.g. `"examples/trapo_vlm.py"`).
        command: the command the user typed, when it is not `python <program>` (`trapo vlm`), for the messages.

    Returns:
        One instance of each of `classes`, as `parse_args_and_config` returns them.

    A job default that an argument the user sets makes wrong yields to the dataclass's own default, by the main
    job's rule (`BUILTIN_YIELDS`, see `builtin_defaults`): `--save_steps 10` without `--save_strategy` saves every 10
    steps instead of keeping the job's `save_strategy="no"` (which wrote no checkpoint without a word), and
    `--num_train_epochs` is not capped by the job's `max_steps`.

    Raises:
        ValueError: as [`given_arguments`], or for a value a dataclass refuses.
        SystemExit: from argparse, for `--help`.
    """
    argv = normalize_argv(list(argv), classes)
    given = given_arguments(argv, classes, parser_factory, program, command)
    parser = parser_factory()
    parser.set_defaults(**yielded_defaults(parser, classes, given))
    with config_errors_in_flags(classes):
        parsed = parser.parse_args_and_config(argv)
    apply_log_level(next(args for args in parsed if isinstance(args, TRAPOConfig)))  # before the job's first line
    return parsed


def yielded_defaults(parser, classes: tuple, given: dict) -> dict:
    """The job defaults of `parser` that the arguments the user gave make wrong (`BUILTIN_YIELDS`: an argument of
    the name's list given with a value other than the job's default), each mapped back to its dataclass default.

    Args:
        parser: the job's parser, with the job's defaults set.
        classes: the parser's argument dataclasses.
        given: argument name -> value the user gave (see [`given_arguments`]).

    Returns:
        Argument name -> the dataclass's default, for `parser.set_defaults`.
    """
    fields = {f.name: f for cls in classes for f in dataclasses.fields(cls)}
    yielded = {}
    for name in yielding_defaults(given, parser.get_default):
        if name not in fields:
            continue
        spec = fields[name]
        default = spec.default_factory() if spec.default is dataclasses.MISSING else spec.default
        if parser.get_default(name) != default:
            yielded[name] = default
    return yielded


def yielding_defaults(given: dict, job_default) -> list[str]:
    """The job defaults that the arguments the user gave make wrong: the one rule of every job (`BUILTIN_YIELDS`).

    A default yields when the user did not give it and gave one of its arguments (`BUILTIN_YIELDS[name]`) with a value
    other than the job's default of that argument.

    Args:
        given: argument name -> value the user gave (see [`given_arguments`]).
        job_default: argument name -> the job's default of it; `dataclasses.MISSING` for an argument the job has no
            default of (any value the user gives it counts).

    Returns:
        The names of `BUILTIN_YIELDS` whose job default yields, in its order.
    """
    return [
        name
        for name, users in BUILTIN_YIELDS.items()
        if name not in given and any(user in given and given[user] != job_default(user) for user in users)
    ]


def given_model(argv: list[str]) -> str | None:
    """The `model_name_or_path` that `argv` gives the parser, or None.

    Every form the parser accepts counts: `--model_name_or_path X`, `--model-name-or-path X`,
    `--model_name_or_path=X`, and `model_name_or_path` in the YAML of `--config` (command-line flags override the
    file, as in `TrlParser.parse_args_and_config`).

    Args:
        argv: command-line arguments, without the program name.

    Returns:
        The model id / directory, or None when no model is given.

    Raises:
        ValueError: as `given_arguments`.
    """
    return given_arguments(argv).get("model_name_or_path")


def builtin_mode(argv: list[str]) -> bool:
    """Whether `argv` selects the tiny built-in job.

    Args:
        argv: command-line arguments, without the program name.

    Returns:
        True when neither the command line nor the `--config` YAML gives a model.

    Raises:
        ValueError: as `given_arguments`.
    """
    return given_model(argv) is None


def builtin_defaults(given: dict) -> dict:
    """The built-in defaults that apply when the user gave `given`: they fill only what the user did not give.

    1. A name the user gave keeps the user's value.
    2. A built-in default that another argument the user set makes wrong is dropped (`BUILTIN_YIELDS`): e.g.
       `--save_steps 10` brings back `TRAPOConfig`'s `save_strategy="steps"` instead of the built-in `"no"`.
    3. Defaults proportional to the run's length (`BUILTIN_SCALED`: evaluation, logging and warm-up steps, set for
       `max_steps=1000`) follow the user's `max_steps`; with `num_train_epochs` (length unknown in advance) they
       become fractions of the run, which `TrainingArguments` reads as ratios of the total steps.

    Args:
        given: argument name -> value the user gave (see `given_arguments`).

    Returns:
        Argument name -> default, for `parser.set_defaults`.
    """
    defaults = {name: value for name, value in BUILTIN_DEFAULTS.items() if name not in given}
    for name in yielding_defaults(given, lambda user: BUILTIN_DEFAULTS.get(user, dataclasses.MISSING)):
        defaults.pop(name, None)
    if "max_steps" not in defaults:  # the user chose the run's length (`max_steps`, or epochs)
        max_steps = float(given.get("max_steps", -1))
        for name in BUILTIN_SCALED:
            if name in defaults:
                fraction = BUILTIN_DEFAULTS[name] / BUILTIN_DEFAULTS["max_steps"]
                if max_steps > 0:
                    defaults[name] = max(round(fraction * max_steps), 0 if name == "warmup_steps" else 1)
                else:
                    defaults[name] = fraction
    return defaults


def check_lora_arguments(model_args: ModelConfig) -> None:
    """Refuse, naming the flag, a LoRA setting of TRL's `ModelConfig` that PEFT would refuse (or silently misuse) only
    once the trainer builds the adapter: checked at parse time, when `--use_peft` is set (without it they are unused).

    Args:
        model_args: the parsed model arguments.

    Raises:
        ValueError: naming the flag, the value and the fix, for `--lora_r` < 1 (PEFT: "`r` should be a positive
            integer"), `--lora_alpha` <= 0 (a zero scale trains nothing, a negative one flips the update),
            `--lora_dropout` outside [0, 1) (torch refuses > 1; 1 drops every input), or a `--lora_task_type` other
            than `CAUSAL_LM` (the policy is a causal LM; another type builds the wrong PEFT model class).
    """
    if not model_args.use_peft:
        return
    r, alpha, dropout = model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"--lora_r={r!r}: the LoRA rank must be a whole number >= 1. Fix: e.g. --lora_r 16.")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ValueError(
            f"--lora_alpha={alpha!r}: must be > 0 (the adapter's update is scaled by lora_alpha / lora_r: 0 trains "
            "nothing, a negative value flips it). Fix: e.g. --lora_alpha 32 (twice --lora_r is common)."
        )
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(
            f"--lora_dropout={dropout!r}: must be a probability in [0, 1) (1 drops every input of the adapter). Fix: "
            "e.g. --lora_dropout 0.05, or 0 for none."
        )
    if model_args.lora_task_type != "CAUSAL_LM":
        raise ValueError(
            f"--lora_task_type={model_args.lora_task_type!r}: the policy is a causal language model, whose adapter is "
            "built for CAUSAL_LM (another task type wraps it in the wrong PEFT model class). Fix: leave it unset "
            "(CAUSAL_LM)."
        )


def evaluation_switched_off(split: str | None) -> bool:
    """Whether `--dataset_test_split` (`split`) switches the held-out evaluation off, before, during and after
    training (in built-in mode the built-in one): `none` (any case) or empty."""
    return split is not None and split.strip().lower() in ("", "none")


def eval_strategy_note(given: dict) -> str | None:
    """The line the job logs when the user gives `--eval_strategy no` (on the command line or in `--config`) and does
    not switch the held-out evaluation off (`--dataset_test_split none`): TRL's scripts evaluate only when
    `eval_strategy != "no"`, but here the flag sets the evaluations *during* training only (transformers' meaning);
    the job still evaluates before and after training, because its report is the metrics before -> after (the
    summary, `eval_results.json`, the result pages' tables). None otherwise.

    Args:
        given: the arguments the user gave ([`given_arguments`]).
    """
    strategy = given.get("eval_strategy")
    if str(getattr(strategy, "value", strategy)).strip().lower() != "no":
        return None
    if "dataset_test_split" in given and evaluation_switched_off(given["dataset_test_split"]):
        return None
    return (
        "--eval_strategy no sets the evaluations during training only: the job still evaluates its held-out split (if "
        "it has one) before and after training, for its report of the metrics before -> after. --dataset_test_split "
        "none switches those off too; --max_eval_samples N shortens them."
    )


def parse_args(
    argv: list[str] | None = None, defaults: dict | None = None, prog: str | None = None
) -> tuple[TRAPOScriptArguments, TRAPOConfig, ModelConfig]:
    """Parse the job's command line: the built-in defaults (built-in mode only, see `builtin_defaults`), then
    `defaults`, then the `--config` YAML, then the command-line flags (each later source wins). An explicit
    `--log_level` (`--log_level_replica` on the other processes) sets the `trl_trapo` logger's level
    ([`~trl_trapo.setup_checks.apply_log_level`]) before the job's first line; "passive" (the default) leaves the
    level the job's script set (INFO).

    Args:
        argv: command-line arguments without the program name (default `sys.argv[1:]`).
        defaults: extra parser defaults of a calling script (e.g. a shorter `max_steps` for a smoke run); like the
            built-in defaults, they fill only what the user did not give.
        prog: the command the usage line names (see `make_parser`).

    Returns:
        `(script_args, training_args, model_args)`.

    Raises:
        ValueError: for a bad `--config`, an unknown argument or key (with the closest known names), a value
            `TRAPOConfig` refuses (its message naming flags: `config_errors_in_flags`), or a bad LoRA setting with
            `--use_peft` (see `check_lora_arguments`).
    """
    return parse_args_and_builtin_defaults(argv, defaults, prog)[:3]


def parse_args_and_builtin_defaults(
    argv: list[str] | None = None, defaults: dict | None = None, prog: str | None = None
) -> tuple[TRAPOScriptArguments, TRAPOConfig, ModelConfig, dict]:
    """[`parse_args`], and the built-in defaults the run took (argument name -> value, as `builtin_defaults` gave
    them and no calling script's `defaults` replaced; {} when a model is given), which `build_trainer` names in the
    trainer's errors ([`name_builtin_defaults`]).

    Raises:
        ValueError: as [`parse_args`].
    """
    argv = normalize_argv(sys.argv[1:] if argv is None else list(argv))
    given = given_arguments(argv, parser_factory=lambda: make_parser(prog), command=prog)
    parser = make_parser(prog)
    taken = {}
    if given.get("model_name_or_path") is None and not {"-h", "--help"} & set(argv):  # help shows the real defaults
        taken = builtin_defaults(given)
        parser.set_defaults(**taken)
    if defaults:
        parser.set_defaults(**{name: value for name, value in defaults.items() if name not in given})
        taken = {name: value for name, value in taken.items() if name not in defaults}
    with config_errors_in_flags(JOB_CLASSES):
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    # `--log_level` / `--log_level_replica` set the `trl_trapo` logger before the job's first line (trial 15's C11)
    apply_log_level(training_args)
    if note := eval_strategy_note(given):
        logger.info(note)
    check_lora_arguments(model_args)
    warn_unused_lora_arguments(model_args)
    check_model_flags_have_a_model(model_args, training_args)
    warn_unused_dataset_arguments(script_args)
    return script_args, training_args, model_args, taken


def name_builtin_defaults(message: str, taken: dict, builtin: bool) -> str:
    """A trainer error as the built-in mode's user should read it: the built-in defaults it quotes (`name=value`, e.g.
    max_prompt_length=16, taken from `taken`: the built-in defaults the run took) are said to be the built-in mode's,
    not the user's, with the flags that set them; and, when it blames the model's context (`builtin`: no
    `--model_name_or_path`), that the model is the built-in tiny one (trial 13's C10: GSM8K prompts against the
    built-in defaults and model).

    Returns:
        The message with one note added, or unchanged when it quotes no built-in default and blames no context.
    """
    quoted = [
        f"{name}={value}"
        for name, value in taken.items()
        if isinstance(value, (int, float))
        and re.search(rf"(?<![\w.]){name}={re.escape(str(value))}(?![\w.])", message)
    ]
    notes = []
    if quoted:
        plural = len(quoted) > 1
        flags = " / ".join(f"--{text.split('=')[0]}" for text in quoted)
        notes.append(
            f"{' and '.join(quoted)} {'are' if plural else 'is'} the built-in mode's default{'s' if plural else ''} "
            f"(sized for its own tasks), not {'values' if plural else 'a value'} you set: set {flags} for your data"
        )
    if builtin and "the model's context" in message:
        notes.append(
            "the model is the built-in mode's tiny model (no --model_name_or_path): pass --model_name_or_path for a "
            "model whose context holds your prompts"
        )
    if not notes:
        return message
    return f"{message} Note: {'; '.join(notes)}."


MODEL_LOADING_FIELDS = ("model_revision", "dtype", "attn_implementation")
"""TRL `ModelConfig`'s settings of how `--model_name_or_path` loads (with `--model_init_kwargs`, a `TRAPOConfig` field)."""


def check_model_flags_have_a_model(model_args: ModelConfig, training_args: TRAPOConfig) -> None:
    """Refuse the settings of how a model loads in built-in mode (no `--model_name_or_path`), where the job builds its
    tiny model in-process and nothing loads: `--dtype bfloat16`, `--attn_implementation`, `--model_revision` were
    ignored without a word, and `--model_init_kwargs` was refused in the trainer's words ("only used when `model` is a
    string"), naming no flag (trial 11's C12).

    Raises:
        ValueError: naming the flags given and the fix.
    """
    if model_args.model_name_or_path is not None:
        return
    given = [f"--{name} {getattr(model_args, name)}" for name in changed_settings(model_args, MODEL_LOADING_FIELDS)]
    if training_args.model_init_kwargs:
        given.append(f"--model_init_kwargs '{json.dumps(training_args.model_init_kwargs)}'")
    if given:
        raise ValueError(
            f"{', '.join(given)}: {'these set' if len(given) > 1 else 'this sets'} how --model_name_or_path loads, and "
            "no model is given: built-in mode builds its tiny model in-process (float32), so nothing would use "
            f"{'them' if len(given) > 1 else 'it'}. Fix: pass --model_name_or_path (a Hub id or a local folder), or "
            f"drop {'them' if len(given) > 1 else 'it'}."
        )


MODEL_FLAG_KEYS = {
    "model_revision": "revision",
    "attn_implementation": "attn_implementation",
    "dtype": "dtype",
    "load_in_4bit": "quantization_config",
    "load_in_8bit": "quantization_config",
}
"""TRL `ModelConfig`'s loading flags -> the `from_pretrained` keyword each sets."""


def model_loading_kwargs(model_args: ModelConfig, given: dict | None) -> dict:
    """The `from_pretrained` keyword arguments of `--model_name_or_path`: those of TRL `ModelConfig`'s flags
    (`--model_revision`, `--dtype`, `--attn_implementation`, `--load_in_4bit` / `--load_in_8bit`), merged with
    `--model_init_kwargs` (`device_map`, `trust_remote_code`, ...), which the job used to replace with the flags'
    without a word (trial 15's N36: a `device_map` given there was dropped). A flag left at its default gives way to
    the same key in `--model_init_kwargs`.

    Args:
        model_args: TRL's model arguments.
        given: `--model_init_kwargs` (the config's `model_init_kwargs`), or None.

    Returns:
        The keyword arguments (no None values; `dtype` left out when `auto`, the checkpoint's own).

    Raises:
        ValueError: a key given both by a flag the user set and by `--model_init_kwargs`, to different values.
    """
    flags = dict(
        revision=model_args.model_revision,
        attn_implementation=model_args.attn_implementation,
        quantization_config=get_quantization_config(model_args),
        dtype=model_args.dtype if model_args.dtype not in (None, "auto") else None,
    )
    flags = {key: value for key, value in flags.items() if value is not None}
    given = dict(given or {})
    for name in changed_settings(model_args, MODEL_FLAG_KEYS):
        key = MODEL_FLAG_KEYS[name]
        if key in given and key in flags and given[key] != flags[key]:
            raise ValueError(
                f"--{name} {getattr(model_args, name)} and --model_init_kwargs '{json.dumps(given, default=str)}' "
                f"both set `{key}` of how --model_name_or_path loads, to different values. Fix: give it once "
                f"(drop `{key}` from --model_init_kwargs, or drop --{name})."
            )
    return {**flags, **given}


LORA_FIELDS = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_target_parameters",
    "lora_modules_to_save",
    "lora_task_type",
    "use_rslora",
    "use_dora",
)
"""TRL `ModelConfig`'s LoRA settings: read only with `--use_peft` (`trl.get_peft_config`)."""


def warn_unused_lora_arguments(model_args: ModelConfig) -> None:
    """Warn when a LoRA setting differs from TRL's default but `--use_peft` is not set: TRL's `get_peft_config`
    (and so this job) then ignores it and trains the full model, as TRL's scripts do; the warning keeps that behaviour
    and says so."""
    if model_args.use_peft:
        return
    warn_ignored_settings(
        logger,
        [f"--{name}" for name in changed_settings(model_args, LORA_FIELDS)],
        "--use_peft",
        " and the full model is trained (as TRL's scripts do)",
        "Add --use_peft to train a LoRA adapter with {them}.",
    )


def dataset_qualifier_fields(cls) -> tuple[str, ...]:
    """The flags that qualify the dataset of the objective `cls` (of `trl_trapo.objectives.WITH_DATA`) and are read only
    with its `--<DATA_FLAGS>_name`: its configuration and split(s) and, for one that can stream, its streaming flag.
    TRL's `--dataset_streaming` is left out: set, it is an error of its own."""
    flags = cls.DATA_FLAGS
    if f"{flags}_split" not in SCRIPT_FIELDS:  # the RL prompts: TRL's `ScriptArguments` names
        return (f"{flags}_config", f"{flags}_train_split", f"{flags}_test_split")
    streaming = (cls.STREAMING_FLAG,) if cls.STREAMING_FLAG is not None else ()
    return (f"{flags}_config", f"{flags}_split", *streaming)


def warn_unused_dataset_arguments(script_args) -> None:
    """Warn, for each objective's dataset (`trl_trapo.objectives.WITH_DATA`), when a flag that qualifies it
    ([`dataset_qualifier_fields`]: `--dataset_config`, `--dataset_train_split`, `--dataset_test_split`,
    `--sft_dataset_split`, `--pretrain_streaming`, ...) differs from its default but the dataset's `--<...>_name` is not
    given: the job never reads it (in built-in mode the built-in data is used; trial 11's C04 was silent about
    `--dataset_train_split nosuch`). The rule of `--lora_*` without `--use_peft` ([`warn_unused_lora_arguments`]):
    ignored, as before, with the same warning. `--dataset_test_split none` is read without `--dataset_name` too: it
    switches the built-in held-out evaluation off.

    Args:
        script_args: the job's [`TRAPOScriptArguments`].
    """
    for cls in WITH_DATA:
        name = f"{cls.DATA_FLAGS}_name"
        if getattr(script_args, name, None):
            continue
        given = [
            f"--{flag}"
            for flag in changed_settings(script_args, dataset_qualifier_fields(cls))
            # `none` is read without a dataset too: it switches the built-in evaluation off (`--eval_strategy no`)
            if not (flag == "dataset_test_split" and evaluation_switched_off(script_args.dataset_test_split))
        ]
        warn_ignored_settings(
            logger,
            given,
            f"--{name}",
            f" ({'it qualifies' if len(given) == 1 else 'they qualify'} the dataset --{name} names)",
            f"Add --{name} to load a dataset with {{them}}, or drop {{them}}.",
        )


# ---------------------------------------------------------------------------------------------------------------------
# Loading user data and models, with errors that name the argument
# ---------------------------------------------------------------------------------------------------------------------
SPLIT_PART = re.compile(r"^\s*([\w.-]+)\s*(\[[^\]]*\])?\s*$")  # `train`, `train[:90%]`, `test[10:20]`


def split_bases(split: str) -> list[str]:
    """The split names in a `datasets` split expression.

    Args:
        split: a split name or expression, e.g. `"train[:90%]+test"`.

    Returns:
        The names it reads, e.g. `["train", "test"]`; `[split]` when it is not a parsable expression.
    """
    parts = [SPLIT_PART.match(part) for part in split.split("+")]
    return [part.group(1) for part in parts] if all(parts) else [split]


def check_checkpoint(value: str | None, arg: str = "--resume_from_checkpoint") -> None:
    """Fail early, naming `arg`, when `value` is not a checkpoint directory the Trainer can resume from.

    Args:
        value: the checkpoint directory (`<output_dir>/checkpoint-<step>`), or None (start from scratch).
        arg: the argument that gave it.

    Raises:
        ValueError: for a folder of checkpoints (an `output_dir`; the message names the latest one), or a directory
            that does not exist or holds no `trainer_state.json`.
    """
    if value is None:
        return
    path = os.path.expanduser(value)
    latest = get_last_checkpoint(path) if os.path.isdir(path) else None
    if latest is not None and not os.path.basename(os.path.normpath(path)).startswith("checkpoint-"):
        raise ValueError(
            f"{arg}={value!r}: a folder of checkpoints (an output_dir), not a checkpoint. Fix: give one of them, e.g. "
            f"the latest: {latest!r}."
        )
    if os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)):
        return
    problem = (
        f"not a checkpoint (no {TRAINER_STATE_NAME})"
        if os.path.isdir(path)
        else f"no such directory ({os.path.abspath(path)})"
    )
    raise ValueError(
        f"{arg}={value!r}: {problem}. Fix: give a checkpoint directory written by the Trainer "
        "(`<output_dir>/checkpoint-<step>`), or leave it unset to start from scratch."
    )


@dataclass
class DatasetSplits:
    """The splits of one dataset argument (`--dataset_name` etc.), read once; `get` returns one of them, non-empty.

    Attributes:
        name: the argument's value (Hub id or local path).
        arg: the argument, e.g. `"--dataset_name"`, for error messages.
        splits: split name -> `Dataset` / `IterableDataset`.
        single: a single local file or a single `save_to_disk` dataset: its one split is `train`.
        reload: split expression -> dataset; None where expressions are unsupported (`save_to_disk`).
    """

    name: str
    arg: str
    splits: dict  # split name -> Dataset / IterableDataset
    single: bool  # a single local file or a single `save_to_disk` dataset: its one split is `train`
    reload: Callable | None = None  # split expression -> dataset (None: expressions unsupported, e.g. save_to_disk)

    def get(self, split: str, split_arg: str | None = None):
        """One split, non-empty.

        Args:
            split: a split name or an expression such as `train[:90%]`.
            split_arg: the argument that chose the split (e.g. `"--dataset_test_split"`), for error messages.

        Returns:
            The `Dataset` (or `IterableDataset` when streaming).

        Raises:
            ValueError: naming `split_arg` and the dataset argument, if the split does not exist (with the available
                splits) or is empty; a single file has only `train`.
        """
        which = f"{split_arg}={split!r}" if split_arg else f"split {split!r}"
        where = f"{self.arg}={self.name!r}"
        if split in self.splits:
            dataset = self.splits[split]
        else:
            missing = [base for base in split_bases(split) if base not in self.splits]
            if missing and self.single:
                raise ValueError(
                    f"{which}: {where} is a single file, which has only a 'train' split. Fix: put the splits in one "
                    f"directory as train.jsonl / {missing[0]}.jsonl (or .json/.csv/.parquet) and pass the directory"
                    + (f", or leave {split_arg} unset." if split_arg else ".")
                )
            if missing:
                raise ValueError(f"{which}: {where} has no split {missing[0]!r}; available: {sorted(self.splits)}.")
            if self.reload is None:
                raise ValueError(
                    f"{which}: split expressions are not supported for this dataset; available: {sorted(self.splits)}."
                )
            dataset = self.reload(split)
        if hasattr(dataset, "__len__"):
            empty = len(dataset) == 0
        else:  # streaming: look at the first row
            try:
                empty = next(iter(dataset.take(1)), None) is None
            except Exception as error:
                raise ValueError(f"{where}: cannot read split {split!r} ({type(error).__name__}: {error}).") from error
        if empty:
            raise ValueError(f"{where}: split {split!r} is empty (no rows). Fix: point at data with rows.")
        if hasattr(dataset, "__len__"):
            check_utf8(dataset, where, os.path.expanduser(self.name))
        return numbers_as_text(dataset, where)


NUMERIC_TEXT_COLUMNS = ("prompt", "completion", "text")
"""The columns the job reads as text that a file's reader may type as numbers (a CSV column of digits is int64)."""


def numbers_as_text(dataset, where: str):
    """`dataset` with its `NUMERIC_TEXT_COLUMNS` that the reader typed as numbers (int or float) cast to strings,
    with one warning naming them (trial 11's C16). A command-line user cannot `dataset.map(str)` the job's own
    loading, and quoting the numbers in a CSV does not help (the reader still infers int64); a digit completion is
    text to the tokenizer anyway. Arrow's cast writes each number as read (`3`, `3.5`; a file's `007` was already
    read as 7): for the exact text, write JSON lines with string values. The Python API keeps refusing such cells
    (`trl_trapo.data.check_cell_types`): there the user owns the dataset.

    Args:
        dataset: a `Dataset` or `IterableDataset` (one without known features is returned as it is).
        where: `--arg='value'`, for the warning.

    Returns:
        The dataset, those columns as `Value("string")` (missing cells stay missing).
    """
    from datasets import Value

    features = getattr(dataset, "features", None) or {}
    numeric = [
        column
        for column in NUMERIC_TEXT_COLUMNS
        if isinstance(features.get(column), Value)
        and any(features[column].dtype.startswith(kind) for kind in ("int", "uint", "float"))
    ]
    if not numeric:
        return dataset
    logger.warning(
        "%s: column(s) %s hold numbers (e.g. a CSV column of digits, typed %s); they are read as text (`3` -> '3'), "
        "as the tokenizer reads them anyway. For exact text (leading zeros, `1.50`), write the file as JSON lines "
        'with string values (`"completion": "007"`).',
        where,
        ", ".join(repr(c) for c in numeric),
        "/".join(sorted({features[c].dtype for c in numeric})),
    )
    for column in numeric:
        dataset = dataset.cast_column(column, Value("string"))
    return dataset


def check_utf8(dataset, where: str, path: str) -> None:
    """Refuse a map-style dataset whose text is not UTF-8: `datasets` loads such a JSON / CSV file without a word
    (Arrow keeps the bytes) and Python fails on the first row read, with only `'utf-8' codec can't decode byte ...`.
    Arrow's full validation checks every string, nested ones included.

    Args:
        dataset: a `datasets.Dataset`.
        where: `--arg='value'`, for the message.
        path: the local file or directory it was read from (to name the file and line), or a Hub id.

    Raises:
        ValueError: naming `where`, the file and line (local JSON) or the column, and the fix.
    """
    import pyarrow as pa

    table = dataset.data.table  # the Arrow table behind the rows (`Dataset.data`)
    for column in table.column_names:
        try:
            table.column(column).validate(full=True)
        except pa.ArrowInvalid as error:
            if "utf8" not in str(error).lower():
                raise
            raise encoding_error(where, path, f"column {column!r} holds text that is not UTF-8") from error


TEXT_DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".txt")  # data files `datasets` decodes as UTF-8 text


def data_files(path: str, suffixes: tuple[str, ...] = TEXT_DATA_SUFFIXES) -> list[str]:
    """The data files of a local dataset `path` with one of `suffixes`: the file itself, or a directory's files (every
    level, sorted; `save_to_disk` metadata excluded)."""
    if not os.path.isdir(path):
        return [path] if path.lower().endswith(suffixes) else []
    return sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(path)
        for name in names
        if name.lower().endswith(suffixes) and name not in ("dataset_info.json", "dataset_dict.json", "state.json")
    )


def encoding_problem(path: str) -> str | None:
    """The first local text data file of `path` (see `data_files`) that is not UTF-8, with the line, or None."""
    for file in data_files(path) if os.path.exists(path) else []:
        with open(file, "rb") as handle:
            data = handle.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data.count(b"\n", 0, error.start) + 1
            return f"{file}, line {line}: not UTF-8 text ({error.reason} at byte {error.start})"
    return None


def encoding_error(where: str, path: str, fallback: str) -> ValueError:
    """The error for data that is not UTF-8 text: the file and line `encoding_problem` finds (else `fallback`), and
    how to re-encode it."""
    located = encoding_problem(path)
    file = located.split(", line ")[0] if located else path
    return ValueError(
        f"{where}: {located or fallback}. Fix: re-encode the data as UTF-8, e.g. `iconv -f latin1 -t utf-8 {file} > "
        f"fixed{os.path.splitext(file)[1] or '.jsonl'}` (if it was written as Latin-1)."
    )


def dataset_subfolders(path: str) -> dict[str, list[str]]:
    """The sub-folders of a local directory `path` that hold data files, each with its files (relative to it)."""
    if not os.path.isdir(path):
        return {}
    folders = {}
    for entry in sorted(os.listdir(path)):
        if entry.startswith((".", "__")):  # ignored by `datasets` (Jupyter's .ipynb_checkpoints): no data folder
            continue
        sub = os.path.join(path, entry)
        files = data_files(sub, (*TEXT_DATA_SUFFIXES, ".parquet", ".arrow")) if os.path.isdir(sub) else []
        if files:
            folders[entry] = [os.path.relpath(f, sub) for f in files]
    return folders


def load_splits(
    name: str, config: str | None = None, streaming: bool = False, *, arg: str = "--dataset_name"
) -> DatasetSplits:
    """Every split of a local file (one split, `train`), a local directory (data files named by split, e.g.
    `train.jsonl` + `test.jsonl`, or a `save_to_disk` directory) or a Hub dataset id.

    Args:
        name: Hub dataset id, local file or directory.
        config: dataset configuration name (Hub / directory datasets).
        streaming: load as `IterableDataset`s.
        arg: the argument that gave `name`, for error messages.

    Returns:
        `DatasetSplits` holding every split.

    Raises:
        ValueError: naming `arg` and `name`, if the path does not exist, the file type is unknown, a file is empty or
            cannot be read, or the Hub id cannot be loaded.
    """
    path = os.path.expanduser(name)
    where = f"{arg}={name!r}"
    saved = os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, f)) for f in ("dataset_info.json", "dataset_dict.json", "state.json")
    )
    if config not in (None, "default") and (os.path.isfile(path) or saved):  # read without it: it would be dropped
        option, what = config_argument(arg), "a local file" if os.path.isfile(path) else "a `save_to_disk` directory"
        raise ValueError(
            f"{where}: {option}={config!r}, but {what} has only the 'default' configuration ({option} picks a Hub "
            f"dataset's configuration, e.g. `--dataset_name openai/gsm8k --dataset_config main`). Fix: drop {option}."
        )
    if os.path.isfile(path):
        extension = path.rsplit(".", 1)[-1].lower() if "." in os.path.basename(path) else ""
        builder = FILE_BUILDERS.get(extension)
        if builder is None:
            raise ValueError(
                f"{where}: cannot read a {extension or 'extension-less'!r} file. Fix: use a "
                ".json/.jsonl/.csv/.parquet/.txt file or a directory."
            )
        if os.path.getsize(path) == 0:
            raise ValueError(f"{where}: the file is empty (0 bytes). Fix: point at a file with rows.")

        def reload(split):
            return _load(where, builder, None, streaming, data_files=path, split=split)

        return DatasetSplits(name, arg, {"train": reload("train")}, single=True, reload=reload)
    if saved:  # `save_to_disk` output
        try:
            loaded = load_from_disk(path)
        except Exception as error:
            raise ValueError(f"{where}: cannot read this `save_to_disk` directory ({error}).") from error
        if hasattr(loaded, "keys"):
            return DatasetSplits(name, arg, dict(loaded), single=False)
        return DatasetSplits(name, arg, {"train": loaded}, single=True)
    check_data_source(name, arg)
    hint = (
        ""
        if os.path.isdir(path)
        else f"it is not a local file or directory ({os.path.abspath(path)} does not exist), and loading it as a Hub "
        "dataset failed; correct the path or the dataset id"
    )
    source = path if os.path.isdir(path) else name
    if os.path.isdir(path):  # the data files `datasets` will leave out (another format, no split name), said once
        left_out = folder_files_problem(path, where, config)
        if left_out:
            logger.warning(left_out)

    def reload(split):
        return _load(where, source, config, streaming, hint=hint, split=split)

    return DatasetSplits(name, arg, dict(_load(where, source, config, streaming, hint=hint)), False, reload)


def rows_note(dataset) -> str:
    """The note `, N rows` for a loaded map-style dataset, for the job's log line of its inputs (trial 16's C16: a
    folder's left-out file shows there as a smaller count); "" for a streaming one (its length is not known)."""
    try:
        return f", {len(dataset)} rows"
    except TypeError:
        return ""


def config_argument(arg: str) -> str:
    """The argument that names the configuration of the dataset `arg` names (`--dataset_name` ->
    `--dataset_config`)."""
    return arg.removesuffix("_name") + "_config"


def _load(where: str, path: str, config: str | None, streaming: bool, hint: str = "", **kwargs):
    """`datasets.load_dataset(path, config, ...)` with its errors turned into a `ValueError` that names `where`."""
    try:
        return load_dataset(path, config, streaming=streaming, **kwargs)
    except StopIteration as error:  # datasets' JSON builder on an empty file
        raise ValueError(f"{where}: a data file is empty (no rows). Fix: point at data with rows.") from error
    except Exception as error:
        message = str(error) or type(error).__name__
        if "corresponds to no data" in message:  # e.g. a CSV file with a header line only
            raise ValueError(f"{where}: a data file has no rows. Fix: point at data with rows.") from error
        local = kwargs.get("data_files") or path
        if config is not None and os.path.isdir(path) and re.search(r"BuilderConfig .* not found", message):
            option = config_argument(where.split("=", 1)[0])
            raise ValueError(  # was "check the files' format and columns": the files are fine (trial 7, Y21)
                f"{where}: {option}={config!r} is no configuration of this local folder ({message}): a folder has "
                f"only the 'default' configuration, unless its README.md declares others; {option} picks a Hub "
                f"dataset's configuration (e.g. `--dataset_name openai/gsm8k --dataset_config main`). Fix: drop "
                f"{option}."
            ) from error
        causes, cause = [], error
        while cause is not None and len(causes) < 20:  # datasets wraps the reader's error in DatasetGenerationError
            causes.append(cause)
            cause = cause.__cause__ or cause.__context__
        if isinstance(local, str) and any(isinstance(c, UnicodeDecodeError) for c in causes):
            raise encoding_error(where, local, "a data file is not UTF-8 text") from error
        cache_problem = dataset_cache_problem(causes, kwargs.get("cache_dir"))
        if cache_problem:  # was "check the files' format and columns": the files are fine (trial 10's CX04)
            raise ValueError(f"{where}: {cache_problem}") from error
        folders = dataset_subfolders(local) if isinstance(local, str) else {}
        if folders:  # datasets reads the files of every sub-folder as one dataset
            listed = "; ".join(
                f"{name}/ ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})"
                for name, files in folders.items()
            )
            arg = where.split("=", 1)[0]
            wanted = {f"--{cls.DATA_FLAGS}_name": cls.NAME for cls in WITH_DATA}.get(arg, RLObjective.NAME)
            pick = next((name for name in folders if wanted in name.lower()), next(iter(folders)))
            raise ValueError(
                f"{where}: cannot load the folder as one dataset ({type(error).__name__}: {message}): it holds the "
                f"data folders {listed}, whose files `datasets` reads together (they must share their columns). Fix: "
                f"name one of them, e.g. `{arg} {os.path.join(local, pick)}`."
            ) from error
        columns = split_file_columns(local) if isinstance(local, str) and os.path.isdir(local) else {}
        if len({frozenset(c) for c in columns.values()}) > 1:  # datasets' CastError: "column names don't match"
            listed = "; ".join(f"{name} has ({', '.join(c)})" for name, c in columns.items())
            raise ValueError(
                f"{where}: the folder's data files have different columns: {listed}. Every split of a dataset must "
                "have the same columns. Fix: rename the columns so that they match (e.g. the answer column of every "
                "file named alike), or point at one file."
            ) from error
        problem = json_syntax_problem(local) if isinstance(local, str) and os.path.exists(local) else None
        if problem:  # datasets says "An error occurred while generating the dataset", naming neither file nor line
            raise ValueError(
                f"{where}: {problem}. Fix: repair or remove that line (each line of a .jsonl file is one JSON object, "
                "e.g. a write that was cut short leaves a truncated last line)."
            ) from error
        fix = f"Fix: {hint}." if hint else "Fix: check the files' format and columns."
        raise ValueError(f"{where}: cannot load the dataset ({type(error).__name__}: {message}). {fix}") from error


def dataset_cache_problem(causes: list[BaseException], cache_dir: str | None = None) -> str | None:
    """What is wrong when `datasets` failed on its cache folder, not on the data: an `OSError` among `causes` (the
    error and its causes) about a path inside the cache (`cache_dir`, else `datasets.config.HF_DATASETS_CACHE`, which
    `HF_DATASETS_CACHE` or `HF_HOME` set when `datasets` was imported). None when no cause is about the cache."""
    import datasets

    cache = os.path.abspath(os.path.expanduser(str(cache_dir or datasets.config.HF_DATASETS_CACHE)))
    for cause in causes:
        path = getattr(cause, "filename", None) if isinstance(cause, OSError) else None
        if not isinstance(path, (str, os.PathLike)):
            continue
        path = os.path.abspath(os.fspath(path))
        if path == cache or path.startswith(cache + os.sep) or cache.startswith(path + os.sep):
            if cache_dir:
                setting = f"the cache_dir {cache}"
            elif "HF_DATASETS_CACHE" in os.environ:
                setting = f"HF_DATASETS_CACHE={os.environ['HF_DATASETS_CACHE']!r}"
            elif "HF_HOME" in os.environ:
                setting = f"HF_HOME={os.environ['HF_HOME']!r} (its datasets/ folder)"
            else:
                setting = f"the default cache folder {cache}"
            return (
                f"the datasets cache cannot be used ({type(cause).__name__}: {cause}): `datasets` writes a prepared "
                f"copy of every dataset it loads into its cache folder, {setting}, and cannot create or write it. "
                "The data files are not the problem. Fix: point HF_DATASETS_CACHE at a folder you can write (e.g. "
                "`HF_DATASETS_CACHE=$TMPDIR/hf_datasets`), or unset it."
            )
    return None


def split_file_columns(folder: str) -> dict[str, list[str]]:
    """The columns of each JSON Lines / CSV / Parquet file directly in `folder` (by file name, sorted), read from its
    first row, header or schema (past a UTF-8 byte-order mark, as `datasets` reads them); read only after `datasets`
    failed to load the folder, to say which files differ (its `CastError` is wrapped in "An error occurred while
    generating the dataset")."""
    import csv

    found = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        try:
            if name.endswith((".jsonl", ".json")):
                with open(path, encoding="utf-8-sig") as handle:  # a byte-order mark, as datasets reads it
                    first = next((line for line in handle if line.strip()), None)
                row = json.loads(first) if first is not None else None
                if isinstance(row, dict):
                    found[name] = list(row)
            elif name.endswith(".csv"):
                with open(path, encoding="utf-8-sig", newline="") as handle:
                    found[name] = next(csv.reader(handle), [])
            elif name.endswith(".parquet"):
                import pyarrow.parquet

                found[name] = list(pyarrow.parquet.read_schema(path).names)
        except (OSError, ValueError, StopIteration):  # unreadable: datasets' own message stands
            continue
    return found


def json_syntax_problem(path: str) -> str | None:
    """The first line that is not a JSON object in the local JSON / JSON Lines data at `path`, or None; read only
    after `datasets` failed to load it, to say where (its own message names neither the file nor the line). A UTF-8
    byte-order mark at the start of a file is read past, as `datasets` reads it.

    Args:
        path: a `.json` / `.jsonl` file, or a directory (its `.json` / `.jsonl` files, in sorted order).

    Returns:
        E.g. `"data/rl.jsonl, line 2: not valid JSON (Unterminated string ...): '{"prompt": "b=", "answ'"`, or a
        `\\ud800` escape without its pair (`lone_surrogate`: Python's `json` reads it, `datasets` does not); None
        when every file reads (a `.json` file as one JSON document or as JSON Lines) or there is no such file.
    """
    if os.path.isdir(path):
        files = sorted(
            os.path.join(root, name)
            for root, _, names in os.walk(path)
            for name in names
            if name.endswith((".json", ".jsonl"))
            and name not in ("dataset_info.json", "dataset_dict.json", "state.json")
        )
    else:
        files = [path] if path.endswith((".json", ".jsonl")) else []
    for file in files:
        try:
            with open(file, encoding="utf-8") as handle:  # not utf-8-sig, whose error offsets skip the mark
                text = handle.read().removeprefix("\ufeff")  # a byte-order mark: datasets reads past it
        except UnicodeDecodeError as error:
            line = text_line_of_byte(file, error.start)
            return f"{file}, line {line}: not UTF-8 text ({error.reason} at byte {error.start})"
        if file.endswith(".json"):
            try:
                document = json.loads(text)
            except json.JSONDecodeError:
                pass  # JSON Lines in a .json file, as datasets reads it too
            else:
                surrogate = lone_surrogate(document)
                if surrogate is None:
                    continue  # one JSON document
                return f"{file}: {surrogate_problem(surrogate)}"
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                shown = line if len(line) <= 80 else line[:77] + "..."
                return f"{file}, line {number}: not valid JSON ({error.msg}, column {error.colno}): {shown!r}"
            if not isinstance(row, dict):
                return f"{file}, line {number}: a JSON {type(row).__name__}, not an object (one row per line)"
            surrogate = lone_surrogate(row)
            if surrogate is not None:
                return f"{file}, line {number}: {surrogate_problem(surrogate)}"
    return None


def lone_surrogate(value) -> str | None:
    """The first lone UTF-16 surrogate (U+D800-U+DFFF) in the strings (keys included) of a parsed JSON value, or None.

    Python's `json` decodes an escape such as `\\ud800` without its pair into such a character; `datasets`' JSON
    reader (Arrow) refuses it ("The surrogate pair in string is invalid"), naming neither file nor line.
    """
    if isinstance(value, str):
        return next((char for char in value if "\ud800" <= char <= "\udfff"), None)
    items = [*value, *value.values()] if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        found = lone_surrogate(item)
        if found is not None:
            return found
    return None


def surrogate_problem(char: str) -> str:
    """What a lone surrogate found by [`lone_surrogate`] is, for [`json_syntax_problem`]'s message."""
    return (
        f"a \\u{ord(char):04x} escape is half of a UTF-16 surrogate pair (invalid Unicode, which datasets' JSON reader "
        "refuses); fix the text or the program that wrote it"
    )


def text_line_of_byte(file: str, offset: int) -> int:
    """The 1-based line of `file` that holds byte `offset`."""
    with open(file, "rb") as handle:
        return handle.read(offset).count(b"\n") + 1


def load_any(
    name: str,
    config: str | None,
    split: str,
    streaming: bool = False,
    *,
    arg: str = "--dataset_name",
    split_arg: str | None = None,
):
    """One non-empty split of a Hub dataset or of a local file / directory (`save_to_disk` directories included).

    A single local file has only a `train` split: asking it for another split is an error (never its training rows).

    Args:
        name: Hub dataset id, local file or directory.
        config: dataset configuration name.
        split: split name or expression.
        streaming: load as an `IterableDataset`.
        arg: the argument that gave `name`, for error messages.
        split_arg: the argument that gave `split`, for error messages.

    Returns:
        The split.

    Raises:
        ValueError: naming `arg` / `split_arg`, for a missing path or split, an empty or unreadable dataset.
    """
    return load_splits(name, config, streaming, arg=arg).get(split, split_arg)


def local_or_hub(value: str) -> str:
    """A model argument as `from_pretrained` must receive it: `~` expanded when it names an existing local path.

    The checks (`paths.check_model_source`) expand `~`, transformers does not (it takes `~/models/x` for a malformed Hub id),
    so a `~` path from a recipe or from `--flag=~/...` (which the shell leaves alone) would pass the check and fail
    to load.

    Args:
        value: a Hub model id or a local directory.

    Returns:
        The expanded path if it exists, else `value` unchanged.
    """
    path = os.path.expanduser(value)
    return path if os.path.exists(path) else value


# a model folder without tokenizer files, on the command line (no flag gives a tokenizer of its own)
NO_TOKENIZER_FIX = "Fix: point at the folder the model was saved to with its tokenizer"


def load_pretrained(loader, value: str, arg: str, **kwargs):
    """`loader.from_pretrained(value, **kwargs)` with a model or tokenizer that cannot be loaded reported as a
    `ValueError` naming `arg`.

    Args:
        loader: a class with `from_pretrained` (e.g. `AutoTokenizer`).
        value: Hub id or local directory.
        arg: the argument that gave `value`, for error messages.
        **kwargs: passed to `from_pretrained`.

    Returns:
        What `from_pretrained` returns.

    Raises:
        ValueError: naming `arg`, when `from_pretrained` raises an `OSError` (missing directory, unreachable Hub id),
            or, for a local directory, a `ValueError` (a folder without tokenizer files is refused before this, by
            `paths.check_tokenizer_source`).
    """
    path = os.path.expanduser(value)
    local = os.path.isdir(path)
    try:
        return loader.from_pretrained(local_or_hub(value), **kwargs)
    except (OSError, ValueError) as error:  # OSError includes huggingface_hub's validation and connection errors
        if isinstance(error, ValueError) and not local:
            raise
        where = (
            "cannot load this local directory"
            if local
            else f"no local directory {os.path.abspath(path)}, and loading it from the Hub (or its cache) failed"
        )
        raise ValueError(
            f"{arg}={value!r}: {where} ({type(error).__name__}: {error}). Fix: give an existing local model directory "
            "or a Hub model id you can reach."
        ) from error


@dataclass
class JobInputs:
    """Everything the trainer is built from, and where each part came from.

    Attributes:
        builtin: built-in mode (no model given).
        model: the built-in model, or the Hub id / directory the trainer loads.
        tokenizer: the processing class.
        train_dataset: RL prompts.
        eval_dataset: held-out RL prompts (at most `--max_eval_samples` rows), or None (no held-out RL evaluation).
        sft_dataset: SFT demonstrations, or None.
        pretrain_dataset: pretraining text, or None.
        distillation_dataset: reward-free prompts for on-policy distillation, or None.
        reward_funcs: reward functions (the reward model, if any, is passed to the trainer by name).
        value_model: the critic, or None.
        builtin_eval: `eval_dataset` is the built-in held-out suite (exact-match accuracy is computed on it).
        sources: role -> "built-in", "none" or the argument that gave it.
        model_init_kwargs: in real-model mode, the `from_pretrained` keyword arguments from the model arguments.
    """

    builtin: bool
    model: object  # a model, or a Hub id / directory the trainer loads
    tokenizer: object
    train_dataset: object = None
    eval_dataset: object = None
    sft_dataset: object = None
    pretrain_dataset: object = None
    distillation_dataset: object = None
    reward_funcs: list = field(default_factory=list)
    value_model: object = None
    builtin_eval: bool = False  # eval_dataset is the built-in held-out suite (exact-match accuracy is computed on it)
    sources: dict[str, str] = field(default_factory=dict)  # role -> "built-in" or the argument that gave it
    model_init_kwargs: dict | None = None  # `from_pretrained` keyword arguments of a real model


def load_rl_data(script_args: TRAPOScriptArguments):
    """The RL training split and the held-out RL split of `--dataset_name`.

    Args:
        script_args: `dataset_name`, `dataset_config`, `dataset_train_split` and `dataset_test_split` are read.

    Returns:
        `(train, evaluation)`; `evaluation` is None when there is no held-out RL evaluation (no `test` split by
        default, or `--dataset_test_split none`).

    Raises:
        ValueError: naming the argument, for a missing path or split, an empty or unreadable dataset.
    """
    name = script_args.dataset_name
    data = load_splits(name, script_args.dataset_config, arg="--dataset_name")
    train = data.get(script_args.dataset_train_split, "--dataset_train_split")
    test_split = script_args.dataset_test_split
    if test_split is None:  # the default: the `test` split of a directory / Hub dataset, if there is one
        if data.single or "test" not in data.splits:
            reason = (
                "a single file has only a 'train' split" if data.single else f"its splits are {sorted(data.splits)}"
            )
            logger.info(
                "No held-out RL evaluation: --dataset_name=%r has no 'test' split (%s); set --dataset_test_split to "
                "choose one.",
                name,
                reason,
            )
            return train, None
        test_split = "test"
    elif evaluation_switched_off(test_split):
        return train, None
    if test_split == script_args.dataset_train_split:
        logger.warning("--dataset_test_split=%r is the training split: the evaluation is not held out.", test_split)
    evaluation = data.get(test_split, "--dataset_test_split")
    return train, evaluation


def cap_rows(dataset, max_rows: int, what: str):
    """The first `max_rows` rows of an evaluation dataset (`--max_eval_samples`), logged when rows are dropped.

    Args:
        dataset: a `Dataset`.
        max_rows: the cap (>= 1).
        what: the dataset's role, for the log line.

    Returns:
        `dataset` itself when it has at most `max_rows` rows, else `dataset.select(range(max_rows))`.
    """
    if len(dataset) <= max_rows:
        return dataset
    logger.info("Evaluating on the first %d of the %d rows of %s (--max_eval_samples).", max_rows, len(dataset), what)
    return dataset.select(range(max_rows))


def reward_file_fix(path: str) -> str:
    """The fix for `--reward_funcs path/to/my_rewards.py`: the dotted form `my_rewards.<function>`, with the file's
    top-level functions (read with `ast`, without running the file) — the one named after a colon first
    (`my_rewards.py:good`) — and, when the file is not in the current directory, how to make it importable."""
    import ast

    path, colon, named = path.partition(".py:")  # `my_rewards.py:good`, the file:function form of other tools
    path += ".py" if colon else ""
    stem = os.path.splitext(os.path.basename(path.rstrip("/" + os.sep)))[0] or "my_rewards"
    functions = []
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
            functions = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            pass
    if named and (named in functions or not functions):
        functions = [named] + [f for f in functions if f != named]
        dotted = f"{stem}.{named}"
    else:
        dotted = " ".join(f"{stem}.{f}" for f in functions[:4]) or f"{stem}.my_reward"
    folder = os.path.dirname(os.path.abspath(path))
    where = "" if folder == os.getcwd() else f" (run from {folder}, or add it to the path: `PYTHONPATH={folder}`)"
    return (
        f"Fix: name the function by its dotted import path, module then function: `--reward_funcs {dotted}`{where}; "
        f"{'the file defines ' + ', '.join(functions) if functions else 'give the name of a function the file defines'}."
    )


def resolve_reward_func(name: str) -> Callable:
    """The reward function `--reward_funcs` names: a built-in one, or one of yours by its dotted import path.

    As in TRL's scripts (`trl/scripts/grpo.py`), `my_module.my_reward` imports `my_module` (the current directory is
    searched first, so a `my_module.py` next to where you launch works) and takes its attribute `my_reward`.

    Args:
        name: a key of `REWARD_FUNCTIONS` or `module.path.function`.

    Returns:
        The function (called as TRL calls reward functions: `func(prompts=..., completions=..., **columns)`).

    Raises:
        ValueError: naming `--reward_funcs`, the value, the built-in names and the dotted form, if the name is a
            file path (`./my_rewards.py`: the dotted form with the file's functions), is not built in and has no dot, its module cannot be imported, the module has no such attribute, or the
            attribute is not callable or is a class (a module-level instance of it is named as the fix).
    """
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    fix = (
        f"Fix: use a built-in name ({', '.join(sorted(REWARD_FUNCTIONS))}) or the dotted import path of your function "
        "(`my_module.my_reward` for `def my_reward(completions, **kwargs)` in my_module.py, importable from the "
        "current directory)."
    )
    if name.endswith(".py") or ".py:" in name or "/" in name or os.sep in name:  # a relative-import TypeError
        raise ValueError(f"--reward_funcs {name!r}: a file path is not taken. {reward_file_fix(name)}")
    module_name, _, attribute = name.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"--reward_funcs {name!r}: not a built-in reward function nor a dotted import path. {fix}")
    if os.getcwd() not in sys.path:  # TRL's scripts import reward functions from the launch directory too
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a missing module, or an error raised while importing the user's module
        raise ValueError(
            f"--reward_funcs {name!r}: cannot import module {module_name!r} ({type(error).__name__}: {error}). {fix}"
        ) from error
    func = getattr(module, attribute, None)
    if func is None:
        raise ValueError(f"--reward_funcs {name!r}: module {module_name!r} has no attribute {attribute!r}. {fix}")
    if not callable(func):
        raise ValueError(f"--reward_funcs {name!r}: {attribute!r} is a {type(func).__name__}, not a function. {fix}")
    if isinstance(func, type):  # callable, but calling it builds an instance (trial 14's C13)
        instance = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", attribute).lower()
        instance = instance if instance != attribute else f"{attribute}_instance"
        raise ValueError(
            f"--reward_funcs {name!r}: {attribute!r} is a class, not a function: the trainer would call the class "
            f"itself, building an instance with the reward keywords. Fix: name a function, or a module-level instance "
            f"of the class: `{instance} = {attribute}()` in module {module_name}, then `--reward_funcs "
            f"{module_name}.{instance}`."
        )
    return func


UNFIT_REWARD_ROWS = 8  # built-in RL rows `warn_rewards_unfit_for_prompts` scores


def warn_rewards_unfit_for_prompts(reward_funcs: list, dataset) -> None:
    """Warn when a reward function of the user's returns None ("cannot score") for most of the first
    [`UNFIT_REWARD_ROWS`] built-in RL prompts even when the completion is the prompt's own answer: those prompts
    would never be trained on by RL (e.g. `--reward_funcs numeric_answer` without `--dataset_name`: the built-in
    answers are mostly letters). Called once, with the `answer` column as the completions; a function that raises is
    left to the trainer's construction-time check, which names it."""
    import inspect
    import math

    from torch import nn
    from transformers import TrainerState

    from trl_trapo.rewards import (
        discard_extra,
        discard_metric,
        reward_call_kwargs,
        reward_function_name,
        reward_value,
    )

    rows = [dataset[i] for i in range(min(len(dataset), UNFIT_REWARD_ROWS))]
    if not rows or "answer" not in rows[0]:
        return
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    for func in reward_funcs:
        if not callable(func) or isinstance(func, nn.Module) or inspect.iscoroutinefunction(func):
            continue
        try:
            values = list(
                func(
                    **reward_call_kwargs(
                        columns,
                        prompts=[r["prompt"] for r in rows],
                        completions=[r["answer"] for r in rows],
                        completion_ids=[[] for _ in rows],
                        trainer_state=TrainerState(),
                        log_metric=discard_metric,
                        log_extra=discard_extra,
                    )
                )
            )
        except Exception:  # the trainer's check reports it, by name
            continue
        scores = [reward_value(v) for v in values]
        unscored = sum(1 for v in scores if v is None or math.isnan(v))
        if unscored * 2 > len(rows):
            logger.warning(
                "--reward_funcs %s returns None ('cannot score') for %d of the first %d built-in RL prompts even when "
                "the completion is the prompt's answer, so RL would not train on them. The built-in prompts' "
                "answers are mostly not numbers: did you forget --dataset_name (your RL prompts)?",
                reward_function_name(func),
                unscored,
                len(rows),
            )


def build_inputs(script_args: TRAPOScriptArguments, training_args: TRAPOConfig, model_args: ModelConfig) -> JobInputs:
    """Check the arguments, load the user's data and model (or build the built-in ones); no training.

    Args:
        script_args: data and reward arguments.
        training_args: `seed` is read (never changed).
        model_args: `model_name_or_path` (None: built-in mode), revision, dtype, attention, quantization.

    Returns:
        `JobInputs`.

    Raises:
        ValueError: naming the argument, for a reward function that is neither built in nor importable, an
            unsupported TRL script argument, a
            missing model, dataset or checkpoint path (all checked before anything is loaded), or bad data (raised
            before any model is loaded).
    """
    # step 0. arguments that need no loading
    for arg, value in (
        ("--dataset_streaming", script_args.dataset_streaming),
        ("--ignore_bias_buffers", script_args.ignore_bias_buffers),
    ):
        if value:
            raise ValueError(
                f"{arg}=True: not supported by this job (a field of TRL's `ScriptArguments`). Fix: leave it unset"
                + (
                    "; to stream the pretraining text, use --pretrain_streaming."
                    if arg == "--dataset_streaming"
                    else "."
                )
            )
    check_lora_arguments(model_args)  # again for a caller of `main` who built the ModelConfig in Python
    reward_funcs = [resolve_reward_func(name) for name in script_args.reward_funcs]  # imports user code, loads nothing
    builtin = model_args.model_name_or_path is None
    model_init_kwargs = None
    if not builtin:
        check_model_source(model_args.model_name_or_path, "--model_name_or_path")
        check_tokenizer_source(model_args.model_name_or_path, "--model_name_or_path", NO_TOKENIZER_FIX)
    for arg, value in (
        ("--reward_model_name_or_path", script_args.reward_model_name_or_path),
        ("--value_model_name_or_path", script_args.value_model_name_or_path),
        ("--teacher_model_name_or_path", training_args.teacher_model_name_or_path),
    ):
        if value is not None:
            check_model_source(value, arg)
    if script_args.reward_model_name_or_path is not None:  # its tokenizer is loaded from it (`load_reward_funcs`)
        check_tokenizer_source(script_args.reward_model_name_or_path, "--reward_model_name_or_path", NO_TOKENIZER_FIX)
    for flags in [cls.DATA_FLAGS for cls in WITH_DATA]:  # every objective's dataset, RL's (TRL's flags) included
        if getattr(script_args, f"{flags}_name"):
            check_data_source(getattr(script_args, f"{flags}_name"), f"--{flags}_name")
    if script_args.distillation_dataset_name and not training_args.teacher_model_name_or_path:
        raise ValueError(
            f"--distillation_dataset_name={script_args.distillation_dataset_name!r} gives prompts for on-policy "
            "distillation, which needs a teacher: add --teacher_model_name_or_path, or drop --distillation_dataset_name."
        )
    check_checkpoint(training_args.resume_from_checkpoint)
    sources: dict[str, str] = {}

    # step 1. the user's data (Hub ids or local paths), loaded before any model so that bad data fails fast
    train_dataset = eval_dataset = None
    if script_args.dataset_name:
        train_dataset, eval_dataset = load_rl_data(script_args)
        sources["rl"] = f"--dataset_name={script_args.dataset_name!r}{rows_note(train_dataset)}"
        sources["eval"] = (
            f"--dataset_name={script_args.dataset_name!r} ({script_args.dataset_test_split or 'test'} split)"
            if eval_dataset is not None
            else "none"
        )
    if training_args.eval_on_start and eval_dataset is None and (script_args.dataset_name or not builtin):
        # before any model: the trainer would refuse it once the model is loaded (`check_eval_on_start`)
        split = (script_args.dataset_test_split or "").strip().lower()
        if not script_args.dataset_name:
            which = "no --dataset_name"
        elif split in ("", "none") and script_args.dataset_test_split is not None:
            which = f"--dataset_test_split={script_args.dataset_test_split!r} switches it off"
        elif os.path.isfile(script_args.dataset_name):
            which = f"--dataset_name={script_args.dataset_name!r} is a single file: it has only a 'train' split"
        else:
            which = f"--dataset_name={script_args.dataset_name!r} has no 'test' split"
        raise ValueError(
            f"--eval_on_start=True evaluates before the first step, and this run has no evaluation data ({which})."
            " Fix: set --dataset_test_split to a split of --dataset_name held out for evaluation, or drop "
            "--eval_on_start."
        )
    loaded: dict[str, typing.Any] = {}  # the other objectives' datasets, by the trainer's argument
    for cls in flagged_objectives(RLDataArguments):
        flags = cls.DATA_FLAGS
        name = getattr(script_args, f"{flags}_name")
        if name:
            loaded[cls.ARGUMENT] = load_any(
                name,
                getattr(script_args, f"{flags}_config"),
                getattr(script_args, f"{flags}_split"),
                streaming=cls.STREAMING_FLAG is not None and getattr(script_args, cls.STREAMING_FLAG),
                arg=f"--{flags}_name",
                split_arg=f"--{flags}_split",
            )
            sources[cls.NAME] = f"--{flags}_name={name!r}{rows_note(loaded[cls.ARGUMENT])}"
    given_rewards = [f"--reward_funcs={list(script_args.reward_funcs)}"] if reward_funcs else []
    if script_args.reward_model_name_or_path:
        given_rewards.append(f"--reward_model_name_or_path={script_args.reward_model_name_or_path!r}")
    if given_rewards:
        sources["reward"] = " + ".join(given_rewards)

    # step 2. the model and tokenizer, and the built-in parts the user did not replace
    builtin_eval = False
    if builtin:
        from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, make_task_suite

        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=training_args.seed)
        sources["model"] = "built-in"
        suite = make_task_suite(seed=script_args.task_suite_seed)
        if "rl" not in sources:  # the user's RL data replaces the built-in prompts and the built-in evaluation
            train_dataset, sources["rl"] = suite.rl_train, "built-in"
            if evaluation_switched_off(script_args.dataset_test_split):  # `--dataset_test_split none`
                sources["eval"] = "none"
            else:
                eval_dataset, builtin_eval, sources["eval"] = suite.eval, True, "built-in"
        if "sft" not in sources:
            loaded["sft_dataset"], sources["sft"] = suite.sft, "built-in"
        if "pretrain" not in sources:
            loaded["pretrain_dataset"], sources["pretrain"] = suite.pretrain, "built-in"
        if "reward" not in sources:  # the user's reward functions or reward model replace exact_match
            reward_funcs = list(suite.reward_funcs)
            sources["reward"] = "built-in"
        elif sources["rl"] == "built-in":  # the user's rewards on the built-in prompts: can they score them?
            warn_rewards_unfit_for_prompts(reward_funcs, train_dataset)
        built_in = [role for role, source in sources.items() if source == "built-in"]
        user = [f"{role} ({source})" for role, source in sources.items() if source not in ("built-in", "none")]
        logger.info(
            "Built-in mode (no --model_name_or_path): from the built-in suite: %s; from you: %s%s.",
            ", ".join(built_in) or "nothing",
            ", ".join(user) or "nothing",
            "; no held-out RL evaluation" if sources.get("eval") == "none" else "",
        )
    else:
        # a real model: the trainer loads it from this id / directory with these keyword arguments
        model = local_or_hub(model_args.model_name_or_path)
        tokenizer = load_pretrained(AutoTokenizer, model, "--model_name_or_path", revision=model_args.model_revision)
        model_init_kwargs = model_loading_kwargs(model_args, training_args.model_init_kwargs)
        sources["model"] = f"--model_name_or_path={model!r}"
        logger.info("Inputs: %s.", ", ".join(f"{role} ({source})" for role, source in sources.items()))
    if eval_dataset is not None and script_args.max_eval_samples is not None:
        eval_dataset = cap_rows(eval_dataset, script_args.max_eval_samples, "the held-out RL evaluation")
    value_model = None
    if script_args.value_model_name_or_path:
        from transformers import AutoModelForSequenceClassification

        value_model = load_pretrained(
            AutoModelForSequenceClassification,
            script_args.value_model_name_or_path,
            "--value_model_name_or_path",
            num_labels=1,
        )
    return JobInputs(
        builtin=builtin,
        model=model,
        tokenizer=tokenizer,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        **loaded,
        reward_funcs=reward_funcs,
        value_model=value_model,
        builtin_eval=builtin_eval,
        sources=sources,
        model_init_kwargs=model_init_kwargs,
    )


# The trainer's arguments the job fills from flags, and how the command line spells each: the trainer's errors name its
# Python arguments (`distillation_dataset`), the job's own errors name the flag (`arg=` above); `flag_names` turns the
# first into the second for the errors the trainer raises while the job builds it.
TRAINER_ARGUMENT_FLAGS = {
    **{cls.ARGUMENT: f"--{cls.DATA_FLAGS}_name" for cls in WITH_DATA},
    "eval_dataset": "--dataset_name",  # its held-out split (`--dataset_test_split`)
    "reward_funcs": "--reward_funcs",
    "reward_model": "--reward_model_name_or_path",
    "value_model": "--value_model_name_or_path",
    "teacher_model": "--teacher_model_name_or_path",
}
TRAINER_ARGUMENT = re.compile(
    r"(`?)(?<![\w.-])(" + "|".join(sorted(TRAINER_ARGUMENT_FLAGS, key=len, reverse=True)) + r")(?![\w\[])(`?)"
)


def flag_names(message: str) -> str:
    """An error message of the trainer as the command line's user should read it: each trainer argument the job fills
    from a flag named by that flag (`TRAINER_ARGUMENT_FLAGS`), with its backticks if it had them.

    `eval_dataset` becomes `--dataset_name` with "(held-out split)"; a config field spelt like the flag it duplicates
    (`teacher_model` / teacher_model_name_or_path) is said once.

    Args:
        message: the trainer's message.

    Returns:
        The message with flags for arguments (unchanged if it names none).
    """

    def flag(match: re.Match) -> str:
        opening, name, closing = match.groups()
        quoted = opening and closing
        text = f"`{TRAINER_ARGUMENT_FLAGS[name]}`" if quoted else TRAINER_ARGUMENT_FLAGS[name]
        if name == "eval_dataset":
            text += " (held-out split)"
        return text if quoted else opening + text + closing

    renamed = TRAINER_ARGUMENT.sub(flag, message)
    for name in set(TRAINER_ARGUMENT_FLAGS.values()):  # `--x` / x, `--x` (or set x): the flag says it already
        field_name = re.escape(name.removeprefix("--"))
        renamed = re.sub(rf"({re.escape(name)}`?)(?: / {field_name}\b| \(or set {field_name}\))", r"\1", renamed)
    return renamed


PYTHON_LITERAL = r"(?:True|False|None|-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|'[^'\n]*'|\"[^\"\n]*\")"
"""A Python literal a config message writes after `field=`: a bool, None, a number or a quoted string."""
PYTHON_CODE = re.compile(r"`[^`\n]*[(,][^`\n]*`|\w\([^()]*(?:\([^()]*\)[^()]*)*\)|\{[^{}]*\}|\[[^\[\]]*\]")
"""A code span with a call or a list of arguments (`` `a=1, b=2` ``), a call (`replace(args, a=1)`, one level of
nested parentheses), a dict or a list in a message: Python, left as it is by [`config_flag_names`]."""


def flag_value(literal: str) -> str | None:
    """A Python literal of a config message (`True`, `0.3`, `'eos'`) as the command line spells it (`true`, `0.3`,
    `eos`); None for `None` (the command line cannot give it to most fields) and for a string the shell would split."""
    if literal in ("True", "False"):
        return literal.lower()
    if literal == "None":
        return None
    if literal[0] in "'\"":
        text = literal[1:-1]
        return text if text and re.fullmatch(r"[\w.:/@+-]+", text) else None
    return literal


def config_flag_names(message: str, classes: tuple = JOB_CLASSES) -> str:
    """A message of the config (or of the trainer about the config) as the command line's user should read it: the
    fields it names as the flags that set them (docs/main_job.md, "Errors").

    - `TRAPOConfig.bf16=True` (the subject of every config refusal: `<Class>.<field>=<value>`) becomes `--bf16 true`,
      `TRAPOConfig.bf16` becomes `--bf16`; a value that is not a bool, a number or a plain string stays in Python's
      form after `=` (`--curriculum_mixtures=[...]`).
    - `use_cpu=True` elsewhere in the text (the fix: "set use_cpu=True") becomes `--use_cpu true`, for every field of
      `classes` given a bool, a number or a plain string, outside Python code (a call such as
      `dataclasses.replace(args, beta=0.1)`, a dict, a list), which stays Python.
    - `curriculum_boundaries=[0.2, 0.8]` / `curriculum_mixtures=[p, s, r]` in the text (a list of numbers, or of
      letters standing for them) becomes `--curriculum_boundaries 0.2 0.8` / `--curriculum_mixtures p s r`, and
      `curriculum_boundaries=[]` `--curriculum_boundaries '[]'` (`JSON_LIST_FLAGS`, the flags that take that form).

    Args:
        message: the message.
        classes: the parser's dataclasses (their names are the `<Class>.` prefixes, their fields the flags).

    Returns:
        The message with flags (unchanged if it names no field).
    """
    fields = set(known_fields(classes))
    names = "|".join(re.escape(cls.__name__) for cls in classes)
    literal = re.compile(rf"(?<![\w.-])(\w+)=({PYTHON_LITERAL})(?![\w(\[{{])")

    def as_flag(match: re.Match) -> str:  # `name=value` (value None: `name` alone, any `=...` after it kept)
        name, value = match.group(1), match.group(2)
        if name not in fields:
            return match.group(0)
        if value is None:
            return f"--{name}"
        spelt = flag_value(value)
        return f"--{name} {spelt}" if spelt is not None else f"--{name}={value}"

    subject = re.compile(rf"(?<![\w.])(?:{names})\.(\w+)(?:=({PYTHON_LITERAL})(?![\w(\[{{]))?")
    renamed = subject.sub(as_flag, message)
    list_fix = re.compile(rf"(?<![\w.-])({'|'.join(flag[2:] for flag in JSON_LIST_FLAGS if '_' in flag)})=$")
    parts, start = [], 0  # the text outside Python code gets the flags
    for code in PYTHON_CODE.finditer(renamed):
        text, span = literal.sub(as_flag, renamed[start : code.start()]), code.group(0)
        fix = list_fix.search(text) if re.fullmatch(r"\[[\w.,\s-]*\]", span) else None
        # `curriculum_boundaries=[0.5]` (numbers, or letters standing for them) -> `--curriculum_boundaries 0.5`
        if fix:
            items = span[1:-1].replace(",", " ").split()
            text, span = text[: fix.start()], f"--{fix.group(1)} {' '.join(items) if items else repr('[]')}"
        parts += [text, span]
        start = code.end()
    return "".join(parts) + literal.sub(as_flag, renamed[start:])


@contextmanager
def config_errors_in_flags(classes: tuple = JOB_CLASSES) -> Iterator[None]:
    """While a job's command line is parsed into its dataclasses: a `ValueError` they raise (the config's refusals,
    `TRAPOConfig.bf16=True ... set use_cpu=True`) is raised again in the command line's words ([`config_flag_names`]:
    `--bf16 true ... set --use_cpu true`). Other exceptions, and a subclass of ValueError, pass as they are.

    Args:
        classes: the parser's dataclasses.

    Raises:
        ValueError: the same message, with flags.
    """
    try:
        yield
    except ValueError as error:
        renamed = config_flag_names(str(error), classes)
        if type(error) is not ValueError or renamed == str(error):
            raise
        raise ValueError(renamed) from error


class FlagNamedRecords(logging.Filter):
    """A handler filter that gives the records of the library's loggers (`trl_trapo.*`, not the jobs' own) the names
    the command line's user typed: the trainer's warnings name its Python arguments (`train_dataset`), which the job
    fills from flags (`--dataset_name`), as its errors do (`flag_names`, applied to the message; the record keeps its
    level and logger).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("trl_trapo.") and not record.name.startswith("trl_trapo.jobs."):  # the jobs' own
            # messages name flags already, and YAML keys (`reward_funcs: [...]`) that are not to be renamed
            message = record.getMessage()
            renamed = flag_names(message)
            if renamed != message:
                record.msg, record.args = renamed, None
        return True


@contextmanager
def flag_named_logs() -> Iterator[None]:
    """While the command-line job runs, the log handlers in place (the root logger's and `trl_trapo`'s) say flags, not
    the trainer's arguments ([`FlagNamedRecords`]); the Python API (`main`, `TRAPOTrainer`) keeps the arguments'
    names. Removed afterwards."""
    handlers = [*logging.getLogger().handlers, *logging.getLogger("trl_trapo").handlers]
    flag_filter = FlagNamedRecords()
    for handler in handlers:
        handler.addFilter(flag_filter)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(flag_filter)


def write_json_atomic(path: str, payload: dict) -> None:
    """Write JSON to `path` through a temporary file and a rename, so readers never see half a file.

    Args:
        path: the file to write; its directory is created if missing.
        payload: a JSON-serialisable mapping (written indented, keys sorted).

    Raises:
        SaveError: naming `path` and the cause (a full disk: how much is free), if it cannot be written.
    """
    try:  # a failed write leaves no temporary file and the previous `path` as it was
        atomic_write_bytes(path, json.dumps(payload, indent=2, sort_keys=True).encode("utf-8"))
    except OSError as error:
        raise SaveError(f"Writing {path} failed: {describe_os_error(path, error)}.") from error


def train_job(trainer: TRAPOTrainer) -> dict[str, float]:
    """Train, resuming from `trainer.args.resume_from_checkpoint` when it is set: the training step of every job (the
    main job here, `trl_trapo.jobs.agent`, `trl_trapo.jobs.vision`).

    Args:
        trainer: the job's trainer.

    Returns:
        `{"train_runtime_s": seconds of `train()`, "train_loss": the Trainer's mean training loss}`.

    Raises:
        CheckpointError: if `resume_from_checkpoint` is incomplete or corrupted.
    """
    start = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    return {"train_runtime_s": time.perf_counter() - start, "train_loss": output.training_loss}


def save_job(trainer: TRAPOTrainer, results: dict, dataset_name: str | None = None) -> None:
    """What every job leaves in `trainer.args.output_dir` after training (the main job here, `trl_trapo.jobs.agent`,
    `trl_trapo.jobs.vision`): the model (or adapter) with its processing class, `trainer_state.json` (the log history,
    the best checkpoint), `eval_results.json` written atomically by the main process, and, with `push_to_hub`, all of
    it on the Hub.

    Args:
        trainer: the trained trainer.
        results: the job's results (JSON-serialisable).
        dataset_name: the training dataset's name for the Hub's model card (None: not named).

    Raises:
        SaveError: if a file cannot be written (naming it and the cause).
        HubPushError: if the Hub cannot be reached with `push_to_hub`.
    """
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    trainer.save_state()
    if trainer.accelerator.is_main_process:
        write_json_atomic(os.path.join(output_dir, "eval_results.json"), results)
    if trainer.args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)


def build_trainer(
    script_args: TRAPOScriptArguments,
    training_args: TRAPOConfig,
    model_args: ModelConfig,
    builtin_defaults: dict | None = None,
) -> tuple[TRAPOTrainer, JobInputs]:
    """The job's trainer, built from the user's (or the built-in) data, model and rewards; no training.

    Args:
        script_args: data and reward arguments.
        training_args: the trainer's configuration, never changed: the trainer gets a copy with `eval_strategy="no"`
            when there is no held-out data, and the model arguments' `model_init_kwargs` in real-model mode.
        model_args: model arguments (`model_name_or_path` None: built-in mode).
        builtin_defaults: the built-in defaults the run took ([`parse_args_and_builtin_defaults`]): the trainer's
            errors that quote one say it is the built-in mode's ([`name_builtin_defaults`]).

    Returns:
        `(trainer, inputs)`.

    Raises:
        ValueError: for bad arguments, paths, data or models (see `build_inputs`), and for what the trainer refuses at
            construction; also, before anything is loaded, if the launch does not match the run: FSDP or DeepSpeed
            asked for and off, `accelerate launch` asked for several processes and started one
            (`trl_trapo.distributed.check_launch`). The trainer's ValueErrors name the flags, not its arguments
            (`flag_names`), and so do those of these checks and of the trainer about the config's fields
            (`config_flag_names`: `--output_dir ...`, not `TRAPOConfig.output_dir=...`).
        RewardFunctionError: if a reward function fails the trainer's construction-time call (naming the flags too).
    """
    # before loading anything: a launch that does not match the run (FSDP on the CPU, a lost `--multi_gpu`) is said
    # at once, not after the model and the datasets (the trainer checks again)
    with config_errors_in_flags():  # their messages name the config's fields (`TRAPOConfig.output_dir=...`)
        check_launch(training_args.distributed_state)
        # the checkpoint to resume from first (a wrong path is the more specific mistake), then output_dir: no other
        # run is writing into it (its lock, held until this process ends), it can be written, holds no finished run
        # and no unfinished one this run would not resume, checked before any model loads (the trainer checks again)
        check_checkpoint(training_args.resume_from_checkpoint)
        hold_output_dir(training_args)
        check_output_dir(training_args)
        check_earlier_checkpoints(training_args, training_args.resume_from_checkpoint, cli=True)
    # steps 1-2. data, model, tokenizer and rewards (built-in or the user's; errors name the argument)
    inputs = build_inputs(script_args, training_args, model_args)
    derived = {}
    if training_args.eval_strategy != "no" and inputs.eval_dataset is None:
        derived["eval_strategy"] = "no"
    if inputs.model_init_kwargs:
        derived["model_init_kwargs"] = inputs.model_init_kwargs
    if derived:
        training_args = dataclasses.replace(training_args, **derived)

    # step 3. the trainer (few-shot mode is an experimental extension: its own trainer subclass)
    trainer_class = FewShotTRAPOTrainer if training_args.fewshot_mode else TRAPOTrainer
    try:
        trainer = trainer_class(
            model=inputs.model,
            reward_funcs=inputs.reward_funcs or None,
            args=training_args,
            train_dataset=inputs.train_dataset,
            eval_dataset=inputs.eval_dataset,
            pretrain_dataset=inputs.pretrain_dataset,
            sft_dataset=inputs.sft_dataset,
            distillation_dataset=inputs.distillation_dataset,
            processing_class=inputs.tokenizer,
            reward_model=script_args.reward_model_name_or_path and local_or_hub(script_args.reward_model_name_or_path),
            value_model=inputs.value_model,
            peft_config=get_peft_config(model_args),
        )
    except (ValueError, RewardFunctionError) as error:  # the trainer names its arguments (`sft_dataset`); the user
        # typed flags. A reward function failing the construction-time call names `train_dataset` too (M18's sibling)
        renamed = name_builtin_defaults(flag_names(str(error)), builtin_defaults or {}, inputs.builtin)
        renamed = config_flag_names(renamed)  # then the config fields it names (`--bf16 true`), notes included
        if type(error) not in (ValueError, RewardFunctionError) or renamed == str(error):  # other subclasses: as is
            raise
        raise type(error)(renamed) from error
    return trainer, inputs


def run_job(
    trainer: TRAPOTrainer,
    inputs: JobInputs,
    script_args: TRAPOScriptArguments,
    training_args: TRAPOConfig,
    job_start: float,
) -> dict:
    """Evaluate, train, evaluate again, save, print the summary (steps 4-6 of the job).

    Args:
        trainer: from `build_trainer`.
        inputs: from `build_trainer` (the evaluation dataset and the tokenizer are read).
        script_args: `dataset_name` is read (for the Hub's model card).
        training_args: the user's configuration (`output_dir`, for the summary; the trainer's copy of it decides the
            rest: `resume_from_checkpoint`, `push_to_hub`, see `train_job` and `save_job`).
        job_start: `time.perf_counter()` when the job started (for the summary's wall time).

    Returns:
        The results, also written to `<output_dir>/eval_results.json` (see `main`).

    Raises:
        CheckpointError: if `resume_from_checkpoint` is incomplete or corrupted.
    """
    tokenizer, eval_dataset = inputs.tokenizer, inputs.eval_dataset
    # step 4. evaluate, train, evaluate
    results: dict[str, float] = {}
    if eval_dataset is not None:
        initial = trainer.evaluate(metric_key_prefix="eval")
        results.update({f"{k}_initial": v for k, v in initial.items()})
    if inputs.builtin_eval:  # exact-match accuracy, computed directly (the RL reward adds partial credit)
        results.update({f"eval_{k}_initial": v for k, v in builtin_accuracy(trainer, tokenizer, eval_dataset).items()})
    results.update(train_job(trainer))
    if eval_dataset is not None:
        results.update(trainer.evaluate(metric_key_prefix="eval"))
    if inputs.builtin_eval:
        results.update({f"eval_{k}": v for k, v in builtin_accuracy(trainer, tokenizer, eval_dataset).items()})

    # step 5. save model (or adapter), trainer state and results
    save_job(trainer, results, dataset_name=script_args.dataset_name)

    # step 6. a short summary for the human who launched the job
    if trainer.accelerator.is_main_process:
        summary = job_summary(training_args.output_dir, results, time.perf_counter() - job_start)
        print(summary, flush=True)  # once, on stdout (the log lines above go to stderr)
    return results


@releases_job_holds  # the hold on output_dir it takes (saving.hold_output_dir) ends with it
def main(script_args: TRAPOScriptArguments, training_args: TRAPOConfig, model_args: ModelConfig) -> dict:
    """The job: build everything, evaluate, train, evaluate again, save.

    Args:
        script_args: data and reward arguments.
        training_args: the trainer's configuration, never changed: the trainer gets a copy with `eval_strategy="no"`
            when there is no held-out data, and the model arguments' `model_init_kwargs` in real-model mode.
        model_args: model arguments (`model_name_or_path` None: built-in mode).

    Returns:
        The results also written to `<output_dir>/eval_results.json`: evaluation metrics before (`*_initial`) and
        after training, `train_loss` and `train_runtime_s`.

    The job ends with a short summary (`job_summary`), printed on the main process.

    Raises:
        ValueError: for bad arguments, paths, data or models (see `build_inputs`), before any training.
        CheckpointError: if `resume_from_checkpoint` is incomplete or corrupted (at the start of training).
        TrainingInterrupted: (a `KeyboardInterrupt`) when SIGINT / SIGTERM stopped training: the trainer saved a
            complete checkpoint; nothing else is evaluated or saved (`exits_cleanly` turns it into one line and exit
            status 130 / 143).
    """
    job_start = time.perf_counter()
    trainer, inputs = build_trainer(script_args, training_args, model_args)  # steps 1-3
    return run_job(trainer, inputs, script_args, training_args, job_start)  # steps 4-6


# Errors that are the user's to fix, by phase of the job. Before training (parsing, loading, building the trainer) the
# project refuses a bad value, path, dataset or model with a `ValueError` naming the argument, the value and the fix;
# a missing or unreadable path the user gave surfaces as an `OSError` subclass; a missing optional package (`peft`,
# `vllm`) as an `ImportError` that says what to install. Once training has started only the project's own types that
# can mean nothing but a bad input or the machine count (a corrupted checkpoint to resume from, a full disk, a Hub that
# cannot be reached, the user's reward function raising: each message names the path, repo or function and the fix);
# anything else there is a fault of the program and keeps its traceback. A `TypeError` is never a user error (the parser converts every type).
SETUP_USER_ERRORS = (
    ValueError,
    SaveError,
    HubPushError,
    RewardFunctionError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    ImportError,
)
RUN_USER_ERRORS = (CheckpointError, SaveError, HubPushError, RewardFunctionError)
DEBUG_VARIABLE = "TRAPO_DEBUG"  # set to 1 to see the traceback of a user error
# how long a rank whose collective failed because another rank's process ended waits before it exits, so that the
# launcher sees the failed rank's exit status first (`exits_cleanly`); seconds
LOST_PEER_GRACE_S = 10.0
USER_ERROR_EXIT_CODE = 2  # as argparse exits for a malformed command line


def debug_requested() -> bool:
    """Whether the environment asks for tracebacks of user errors (`TRAPO_DEBUG=1`, `true`, `yes` or `on`)."""
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


@releases_job_holds  # the hold on output_dir it takes (saving.hold_output_dir) ends with it
def run(argv: list[str] | None = None, program: str | None = None) -> int:
    """The command line (`examples/trapo.py`): parse, build, run the job; a user error becomes one message and an exit
    status, not a traceback.

    A user error (see `SETUP_USER_ERRORS` / `RUN_USER_ERRORS`) prints `<program>: error: <message>` and a line saying
    how to see the traceback, on stderr, and returns `USER_ERROR_EXIT_CODE` (2, as argparse does for a malformed
    command line, which it reports the same way). The trainer's errors (`build_trainer`) and warnings
    (`flag_named_logs`) name the flags the user typed, not its arguments (`flag_names`: `--dataset_name`, not
    `train_dataset`). With `TRAPO_DEBUG=1` it is raised with its traceback instead. Any
    other exception is raised as is: it is a fault of the program, whose traceback is needed to fix it.

    Args:
        argv: command-line arguments without the program name (default `sys.argv[1:]`).
        program: the command its usage line and its errors name (default: the script's file name; `trapo train`
            for the `trapo` command).

    Returns:
        The exit status: 0 after a complete job, `USER_ERROR_EXIT_CODE` after a user error.

    Raises:
        SystemExit: from argparse, for `--help` (status 0) or a malformed command line (status 2).
    """
    user_errors = SETUP_USER_ERRORS
    try:
        script_args, training_args, model_args, taken = parse_args_and_builtin_defaults(argv, prog=program)
        job_start = time.perf_counter()
        with flag_named_logs():  # the trainer's warnings name the flags, as its errors do (`flag_names`)
            trainer, inputs = build_trainer(script_args, training_args, model_args, taken)
            user_errors = RUN_USER_ERRORS  # from here on, only errors that cannot be a fault of the program
            run_job(trainer, inputs, script_args, training_args, job_start)
    except Exception as error:
        if not isinstance(error, user_errors) or debug_requested():
            raise
        return report_user_error(error, program or os.path.basename(sys.argv[0]) or "trapo.py")
    return 0


def report_user_error(error: BaseException, program: str) -> int:
    """A user error on the command line: `<program>: error: <message>` and how to see the traceback, on stderr.

    On one rank of a multi-process run the rank then exits at once with `USER_ERROR_EXIT_CODE`
    (`distributed.exit_failed_rank`): the other ranks may be waiting for it in a collective (a reward function that
    failed on this rank only), and the launcher ends them once it sees the failure.

    Args:
        error: the user error (its text is the message).
        program: the command the message names (`trapo train`, `trapo.py`).

    Returns:
        `USER_ERROR_EXIT_CODE` (on one process; on several this rank has exited).
    """
    print(
        f"{program}: error: {error}\n(Run with {DEBUG_VARIABLE}=1 to see the traceback.)", file=sys.stderr, flush=True
    )
    exit_failed_rank(USER_ERROR_EXIT_CODE)
    return USER_ERROR_EXIT_CODE


def say_interrupted(error: TrainingInterrupted) -> None:
    """The line of a run stopped at a checkpoint by a signal (where it is, how to resume): on stdout after SIGINT /
    SIGTERM; after SIGHUP (the terminal closed) or SIGPIPE (stdout's reader went away: `trapo train | head`) on
    stderr, where a log redirected with `2>` or `&>` keeps it, and a write that fails there (a terminal or pipe already
    gone) is dropped: the checkpoint is saved, and the exit status must stay 129 / 141."""
    if error.interruption.signal not in (getattr(signal, "SIGHUP", None), SIGPIPE):
        print(error, flush=True)
        return
    try:
        print(error, file=sys.stderr, flush=True)
    except OSError:
        drop_output(sys.stderr)  # nor a BrokenPipeError when the interpreter flushes it at exit


@contextmanager
def exits_cleanly() -> Iterator[None]:
    """The job's process, for a script's `__main__`: interrupted, it exits without a traceback; finished, it ends the
    process group in order.

    - SIGINT / SIGTERM / SIGHUP during training (`TrainingInterrupted`, after the checkpoint): its one line (main
      process; [`say_interrupted`]) and exit status 130 / 143 / 129; every rank stopped at the same step, so the
      process group is ended too. The output closed during training (`trapo train | head`: the reader went away)
      stops the same way, with the line on stderr and exit status 141 (128 + SIGPIPE; see `trl_trapo.interrupts`).
    - Ctrl-C anywhere else (loading, evaluation, saving), or a second Ctrl-C during training (`TrainingAborted`): one
      line on stderr (main process) and exit status 130, instead of the `KeyboardInterrupt` traceback. The output
      closed there (a `BrokenPipeError` of stdout or stderr): stdout and stderr dropped (Python's advice), one line on
      stderr, exit status 141, no traceback.
    - After the job: `distributed.end_process_group` (every rank reaches it together), so that no rank aborts at
      interpreter exit.
    - Any other exception on one rank of a multi-process run: its traceback, then the rank exits at once with status 1
      (`distributed.exit_failed_rank`), without waiting for the other ranks, which the launcher then ends (a rank
      that reported a user error exits the same way, from `run`). Waiting for them would hang the run: they wait for
      the failed rank in a collective. A rank whose collective failed because another rank's process ended
      (`distributed.lost_peer`) prints one line saying so instead of its traceback (`TRAPO_DEBUG=1` shows it), and
      waits `LOST_PEER_GRACE_S` before it exits, so that the launcher takes the failed rank's status as the run's
      (torchrun ends the waiting rank as soon as it sees that exit).

    Raises:
        SystemExit: 130 / 143 on a `KeyboardInterrupt`; 141 when the output was closed.
    """
    main_process = os.environ.get("RANK", "0") == "0"
    try:
        yield
    except TrainingInterrupted as error:
        if main_process:
            say_interrupted(error)
        end_process_group()
        raise SystemExit(error.interruption.exit_code) from None
    except KeyboardInterrupt as error:
        if main_process:
            message = str(error) or (
                "Interrupted by SIGINT outside the training steps (only those stop at a checkpoint): nothing more was "
                "saved."
            )
            print(message, file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None
    except Exception as error:
        if isinstance(error, BrokenPipeError) and output_pipe_closed() and not debug_requested():
            for stream in (sys.stdout, sys.stderr):
                if output_pipe_closed(stream):
                    drop_output(stream)
            if main_process:
                say(
                    "Stopped because the output was closed (SIGPIPE: the program reading it went away) outside the "
                    "training steps (only those stop at a checkpoint): nothing more was saved."
                )
            exit_failed_rank(128 + SIGPIPE)  # one rank of several: at once, as any failed rank
            raise SystemExit(128 + SIGPIPE) from None
        if in_process_group_of_several():
            if lost_peer(error) and not debug_requested():  # the rank that ended printed the cause
                rank = os.environ.get("RANK", "?")
                print(
                    f"rank {rank}: stopped, another process of this run ended during a collective (its error is "
                    f"above; {DEBUG_VARIABLE}=1 shows this rank's traceback).",
                    file=sys.stderr,
                    flush=True,
                )
                # the launcher takes the first failure it sees as the run's exit status: exiting at once here raced
                # the rank that failed (its status 2 for a user error became this rank's 1); torchrun ends this
                # process as soon as it sees that rank's exit (it polls every 0.1 s), so waiting costs nothing there
                time.sleep(LOST_PEER_GRACE_S)
            else:
                traceback.print_exc()  # as the interpreter would, before this rank exits without it
            exit_failed_rank(1)
        raise
    end_process_group()


# evaluation metrics worth a line in the summary, when measured both before and after training
HEADLINE_METRICS = re.compile(r"^eval_(accuracy\w*|reward|rewards/[^/]+|loss)$")  # not TRL's `rewards/<f>/mean`


def format_duration(seconds: float) -> str:
    """A duration for humans.

    Args:
        seconds: the duration.

    Returns:
        `42.1 s`, `3 min 05 s` or `2 h 07 min`.
    """
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def job_summary(output_dir: str, results: dict, seconds: float) -> str:
    """A few lines that say what the job wrote and what it changed.

    Args:
        output_dir: the job's output folder (listed: weights, checkpoints, `eval_results.json`, `trainer_state.json`).
        results: what `main` returns (`<metric>_initial` before training, `<metric>` after).
        seconds: the job's wall time.

    Returns:
        The summary: output folder, files written, headline metrics before -> after (`HEADLINE_METRICS`), train
        loss, wall time.
    """
    names = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
    weights = [n for n in names if n.endswith((".safetensors", ".bin")) and n != "training_args.bin"]
    checkpoints = sorted(
        (n for n in names if n.startswith("checkpoint-") and os.path.isdir(os.path.join(output_dir, n))),
        key=lambda n: int(n.rsplit("-", 1)[1]) if n.rsplit("-", 1)[1].isdigit() else -1,
    )
    written = []
    if weights:
        written.append(f"{'adapter' if 'adapter_config.json' in names else 'model'} ({', '.join(weights)})")
    if checkpoints:
        shown = checkpoints if len(checkpoints) <= 3 else [checkpoints[0], "...", checkpoints[-1]]
        written.append(f"{len(checkpoints)} checkpoint{'s' if len(checkpoints) > 1 else ''} ({', '.join(shown)})")
    written += [n for n in ("eval_results.json", "trainer_state.json") if n in names]
    training = f" (training {format_duration(results['train_runtime_s'])})" if "train_runtime_s" in results else ""
    lines = [
        f"Done in {format_duration(seconds)}{training}. Output folder: {os.path.abspath(output_dir)}",
        f"  written: {'; '.join(written) or 'nothing'}",
    ]
    metrics = [  # a reward function that scored no eval prompt has None (no mean)
        k for k in results if HEADLINE_METRICS.match(k) and None not in (results[k], results.get(f"{k}_initial"))
    ]
    if sum(k.startswith("eval_rewards/") for k in metrics) == 1:  # one reward function: the same as eval_reward
        metrics = [k for k in metrics if not k.startswith("eval_rewards/")]
    metrics = sorted(metrics, key=lambda k: (not k.startswith("eval_accuracy"), k != "eval_accuracy", k))[:8]
    width = max((len(k) for k in metrics), default=0)
    for key in metrics:
        lines.append(f"  {key:<{width}}  {results[f'{key}_initial']:.2f} -> {results[key]:.2f}")
    if "train_loss" in results:
        lines.append(f"  {'train_loss':<{width}}  {results['train_loss']:.4g}")
    return "\n".join(lines)


def builtin_accuracy(trainer: TRAPOTrainer, tokenizer, dataset) -> dict[str, float]:
    """Greedy exact-match accuracy of the policy on the built-in held-out prompts, overall and per split.

    Collective under DeepSpeed ZeRO-3 (every rank must call it).

    Args:
        trainer: the job's trainer (its wrapped model and accelerator are used).
        tokenizer: the processing class.
        dataset: the built-in held-out suite (`make_task_suite(...).eval`).

    Returns:
        `{"accuracy": ..., "accuracy_<split>": ...}`, fractions in [0, 1].
    """
    from trl.models import unwrap_model_for_generation

    from trl_trapo.models import quiet_checkpointing_deprecation
    from trl_trapo.tasks import greedy_accuracy

    # gathers DeepSpeed ZeRO-3 partitions (collectively: every rank evaluates); a no-op unwrap otherwise
    with (
        quiet_checkpointing_deprecation(),
        unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model,
    ):
        return greedy_accuracy(model, tokenizer, dataset, max_new_tokens=trainer.args.response_length)
