# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Configuration of the TRAPO trainer.

`TRAPOConfig` extends TRL's config base (itself a `transformers.TrainingArguments`). Everything PPO has keeps the name,
meaning and (where TRAPO does not need a different one) the default of TRL's former `PPOConfig`; everything GRPO has
keeps GRPO's spelling (`num_generations`, `loss_type`, `scale_rewards`, `entropy_coef`). TRAPO's own fields are grouped
below: objective weights, DARE, curriculum, replay, per-objective lengths, robustness.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import difflib
import enum
import functools
import json
import logging
import math
import numbers
import os
import re
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import huggingface_hub.constants
import torch
import transformers
from trl.trainer.base_config import _BaseConfig

from . import threads
from .distributed import bf16_comm_hook_problem, check_world_environment, rendezvous_notice
from .paths import byte_order_mark_problem
from .sampler_correction import CorrectionMode, bounds_problem
from .setup_checks import METRIC_SCHEDULERS, check_scheduler_kwargs
from .tool_schemas import row_tool_names


logger = logging.getLogger(__name__)
PRECISION_VARIABLE = "ACCELERATE_MIXED_PRECISION"
"""The environment variable accelerate reads its mixed precision from (its launcher sets it from `--mixed_precision`;
transformers' `TrainingArguments` reads it when neither `fp16` nor `bf16` is True)."""


OBJECTIVES = ("pretrain", "sft", "rl")
"""The three objectives, in the order used by every per-objective list, tensor and metric."""
PRETRAIN, SFT, RL = range(len(OBJECTIVES))
"""Indices of the objectives in `OBJECTIVES` (and the `objective` of a training row)."""

SAFE_GENERATION_KWARGS = frozenset(
    {"min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "use_cache", "cache_implementation", "cache_config"}
)
"""`generation_kwargs` keys that leave the recorded behaviour log-probs exact (besides `eos_token_id`): truncation
samplers only decide which token is drawn, like `top_k` / `top_p`; cache settings change no number."""
GENERATION_KWARG_RANGES = {
    "min_p": (0.0, 1.0, "[0, 1]", 0.1),
    "typical_p": (0.0, 1.0, "(0, 1], 1 = off", 0.9),
    "epsilon_cutoff": (0.0, 1.0, "[0, 1), 0 = off", 3e-4),
    "eta_cutoff": (0.0, 1.0, "[0, 1), 0 = off", 3e-4),
}
"""The number each sampler key of `SAFE_GENERATION_KWARGS` takes (key -> (low, high, the interval in words, an example)), as
transformers' logits warpers (`MinPLogitsWarper`, `TypicalLogitsWarper`, `EpsilonLogitsWarper`, `EtaLogitsWarper`)
check it at the first `generate`, or skip the warper without a word (`epsilon_cutoff=2`): checked at construction."""
OWN_GENERATION_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "max_new_tokens": "response_length",
    "do_sample": "temperature",
    "pad_token_id": "processing_class.pad_token",
}
"""`generation_kwargs` keys that duplicate a `TRAPOConfig` field (the field to set instead)."""
OWN_GENERATION_FIX = {
    "do_sample": "RL rollouts are always sampled: TRAPO learns from sampled completions and trains on the log-probs of "
    "sampling at `temperature`, so greedy rollouts (do_sample=False) are not supported and do_sample=True is what it "
    "does already. Drop the key; for less random rollouts lower `temperature` (e.g. 0.3; --temperature 0.3). "
    "Evaluation (eval_* metrics) decodes greedily already.",
    "pad_token_id": "the pad id is the tokenizer's: set `processing_class.pad_token` (from the command line: save the "
    "tokenizer with its pad token next to the model and pass that folder as --model_name_or_path).",
}
"""The fix named for an [`OWN_GENERATION_FIELDS`] key whose reason is not "TRAPO trains on log-probs at that value"
(the default message's, which fits the sampling settings)."""

OWN_CHAT_TEMPLATE_ARGUMENTS = {
    "conversation": "the row's messages",
    "add_generation_prompt": "True for a prompt, whatever its last role; False for an SFT row",
    "continue_final_message": "never: a prompt ending with an assistant message gets a new turn; give text to continue",
    "tokenize": "rows are tokenized by the template call",
    "return_dict": "rows are tokenized by the template call",
    "return_assistant_tokens_mask": "set by assistant_only_loss",
}
"""`apply_chat_template` arguments TRAPO passes itself when it renders a row (what each is set to), which
`chat_template_kwargs` cannot hold (`TRAPOConfig.chat_template_kwargs`)."""
LOGITS_CHANGING_GENERATION_KWARGS = frozenset(
    {
        "repetition_penalty",
        "encoder_repetition_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "sequence_bias",
        "suppress_tokens",
        "begin_suppress_tokens",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "min_length",
        "min_new_tokens",
        "exponential_decay_length_penalty",
        "renormalize_logits",
        "guidance_scale",
        "watermarking_config",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "penalty_alpha",
        "dola_layers",
        "length_penalty",
        "max_length",
    }
)
"""`generation_kwargs` keys that change the sampled distribution away from softmax(logits / temperature)."""


JOB_ARGUMENTS = {
    **{
        f"{dataset}_{part}": dataset
        for dataset in ("pretrain_dataset", "sft_dataset", "distillation_dataset")
        for part in ("name", "config", "split")
    },
    "pretrain_streaming": "pretrain_dataset",
    "reward_funcs": "reward_funcs",
    "reward_model_name_or_path": "reward_model",
    "value_model_name_or_path": "value_model",
    "max_eval_samples": "eval_dataset",
    "task_suite_seed": "",
}
"""The `trapo train` job's own arguments that are not TRAPOConfig fields, beyond TRL's `ModelConfig` and
`ScriptArguments` fields ([`job_arguments`] reads those from TRL's classes): the other objectives' dataset flags and
the job's data and reward arguments (`trl_trapo.jobs.main.TRAPOScriptArguments`) -> the `TRAPOTrainer` argument that
takes what each sets ("": the job's own setting). The core never imports the jobs (tests/test_layout.py), so
tests/test_foreign_names.py checks that these and TRL's fields are exactly the job's arguments."""


def job_argument_place(name: str) -> str | None:
    """The `TRAPOTrainer` argument that takes what the `trapo train` job's argument `name` sets ("model",
    "peft_config", "train_dataset", ...; "model_init_kwargs" for how the model loads; "" for the job's own setting), or
    None when `name` is no argument of the job (or is a TRAPOConfig field)."""
    from trl import ModelConfig, ScriptArguments

    if name in JOB_ARGUMENTS:
        return JOB_ARGUMENTS[name]
    if name in {f.name for f in dataclasses.fields(ScriptArguments)}:  # the RL prompts' flags
        return {"dataset_test_split": "eval_dataset", "ignore_bias_buffers": ""}.get(name, "train_dataset")
    if name in {f.name for f in dataclasses.fields(ModelConfig)}:
        if name == "model_name_or_path":
            return "model"
        adapter = name in ("use_peft", "use_rslora", "use_dora") or name.startswith("lora_")
        return "peft_config" if adapter else "model_init_kwargs"
    return None


JOB_ARGUMENT_PLACES = {
    "model": "`TRAPOTrainer(model=...)` (the id or path, which TRAPO loads, or a loaded model)",
    "peft_config": "`TRAPOTrainer(peft_config=peft.LoraConfig(...))` (TRL's `get_peft_config(model_args)` builds it)",
    "model_init_kwargs": "how the model loads: `TRAPOConfig(model_init_kwargs={...})`, e.g. `{'dtype': 'bfloat16'}`, "
    "when `model=` is an id or path, or your own `from_pretrained(...)`",
    "eval_dataset": "`TRAPOTrainer(eval_dataset=...)` (the held-out split you load; `.select(range(n))` for n rows)",
    "": "the job's own setting (`trapo train --help`), which the Python API has no argument of",
}
"""How [`job_arguments`] writes where the Python API takes a job argument, by [`job_argument_place`]; another
place `p` is written `TRAPOTrainer(p=...)` (a dataset argument: one you load)."""


def job_arguments(names: list[str]) -> str:
    """A sentence naming those of `names` that are arguments of the `trapo train` job and not TRAPOConfig fields (a
    recipe's `model_name_or_path`, `use_peft`, `lora_r`, `dataset_name`, `reward_funcs`, ...:
    [`job_argument_place`]), each with where the Python API takes it, and the other names when there are some; ""
    when none is (trial 15's N25: `TRAPOConfig(**yaml.safe_load(recipe))` got Python's bare "unexpected keyword
    argument 'model_name_or_path'")."""
    where: dict[str, list[str]] = {}
    job = []
    for name in names:
        place = job_argument_place(name)
        if place is None:
            continue
        job.append(name)
        destination = JOB_ARGUMENT_PLACES.get(place) or (
            f"`TRAPOTrainer({place}=...)`"
            + (", a dataset you load (`datasets.load_dataset(...)`)" if place.endswith("_dataset") else "")
        )
        where.setdefault(destination, []).append(name)
    if not job:
        return ""
    others = [name for name in names if name not in job]
    return (
        f"arguments of the `trapo train` job, which are not TRAPOConfig fields: {', '.join(job)} (a recipe, e.g. "
        "examples/recipes/*.yaml, holds the job's arguments and TRAPOConfig's together; the job's parser splits them). "
        "In Python: "
        + "; ".join(f"{', '.join(group)} -> {destination}" for destination, group in where.items())
        + ". Or run the recipe as it is: `trapo train --config FILE`."
        + (f" Neither TRAPOConfig nor the job takes {', '.join(others)}." if others else "")
    )


GRPO_ALIASES = {
    "max_completion_length": "response_length",
    "beta": "kl_coef",
    "epsilon": "cliprange",
    "num_iterations": "num_ppo_epochs",
}
"""TRL GRPOConfig's names of TRAPOConfig fields with the same meaning (GRPO name -> TRAPO field): each is a field of
its own (None by default) that, when given, sets TRAPO's at construction; both given and different is refused. After
construction each reads the value in effect (`max_completion_length` reads `response_length`, as a TRL `rollout_func`
reading `trainer.args.max_completion_length` expects); `grpo_names_given` records which were given."""

GRPO_ONLY_FIXES = {
    "epsilon_high": "TRAPO clips the ratio symmetrically to [1 - cliprange, 1 + cliprange] (`epsilon`, GRPO's name, "
    "is accepted): drop epsilon_high, or set epsilon to the bound you want on both sides",
    "delta": "TRAPO's ratio bound is `importance_sampling_cap` (it bounds pi_theta / pi_old); drop delta",
    "log_completions": "TRAPO logs no per-step completion table of training rollouts; drop it (a table of the eval "
    "prompts' completions: `trainer.generate_completions()`, printed and logged to W&B / Trackio)",
    "num_completions_to_print": "TRAPO logs no per-step completion table; drop it",
    "log_completions_hub_repo": "TRAPO logs no per-step completion table; drop it",
    "log_unique_prompts": "TRAPO logs no per-step completion table; drop it",
    "min_p": 'pass it as generation_kwargs={"min_p": ...} (a truncation sampler, allowed there)',
    "generation_batch_size": "a round's size follows per_device_train_batch_size x gradient_accumulation_steps x "
    "num_mini_batches (num_mini_batches: optimizer steps a generation round feeds); drop it",
    "steps_per_generation": "set num_mini_batches (optimizer steps a generation round feeds) instead",
    "trust_remote_code": 'a model loaded by id takes it in `model_init_kwargs={"trust_remote_code": True}` '
    "(`teacher_model_init_kwargs` for a teacher), only for a model whose code you have read",
}
"""TRL GRPOConfig fields a GRPO script commonly sets that TRAPOConfig has no equivalent of, with the fix the refusal
names (`TRAPOConfig.__new__`); any other GRPOConfig-only field is refused with a pointer to docs/agents.md's table."""

SFT_ONLY_FIXES = {
    "max_length": "the SFT row length is `sft_max_length` (prompt + completion + EOS), the pretraining row length "
    "`pretrain_max_length`",
    "max_seq_length": "the SFT row length is `sft_max_length` (prompt + completion + EOS), the pretraining row length "
    "`pretrain_max_length`",
    "packing": "pretraining rows are packed (`pretrain_packing`, on by default, into rows of `pretrain_max_length` "
    "tokens); SFT rows are never packed: drop packing",
    "packing_strategy": "pretraining rows are packed by concatenation (`pretrain_packing`); drop it",
    "eval_packing": "drop it (pretraining rows are packed, `pretrain_packing`; SFT rows are not)",
    "padding_free": "rows are padded per batch; drop it",
    "dataset_text_field": "pretraining text is read from a `text` column: rename yours "
    "(`dataset.rename_column(name, 'text')`) and pass the dataset as `pretrain_dataset=`",
    "completion_only_loss": "SFT rows of `prompt` / `completion` train on the completion only; drop it",
    "eos_token": "set the tokenizer's own (`processing_class.eos_token = ...`) and drop it",
    "pad_token": "set the tokenizer's own (`processing_class.pad_token = ...`) and drop it",
    "chat_template_path": "save the template with the tokenizer (`tok.chat_template = open(path).read()`) and pass "
    "that tokenizer as `processing_class`",
}
"""TRL SFTConfig fields (1.16's, and `max_seq_length` of older SFTConfigs) an SFT script commonly sets that TRAPOConfig
has no field of, with the fix the refusal names (`TRAPOConfig.__new__`); any other SFTConfig-only field is refused
as having no TRAPO equivalent."""

TRL0_PPO_FIXES = {
    "ppo_epochs": "num_ppo_epochs",
    "log_with": "report_to (e.g. report_to='wandb', or 'none')",
    "model_name": "load the model yourself and pass it as PPOTrainer(model=...)",
    "query_dataset": "pass the dataset as PPOTrainer(train_dataset=...)",
    "reward_model": "pass a reward model (`AutoModelForSequenceClassification`, num_labels=1) as "
    "PPOTrainer(reward_model=...), or reward functions as `reward_funcs=`",
    "steps": "total_episodes (prompts rolled out in all) or max_steps",
    "batch_size": "per_device_train_batch_size x gradient_accumulation_steps is the rollout batch per process "
    "(PPOConfig fills in batch_size from them)",
    "mini_batch_size": "num_mini_batches (optimizer steps per rollout batch; PPOConfig fills in mini_batch_size)",
    "forward_batch_size": "local_rollout_forward_batch_size",
    "backward_batch_size": "per_device_train_batch_size",
    "global_batch_size": "filled in from per_device_train_batch_size x gradient_accumulation_steps x processes; drop it",
    "global_backward_batch_size": "filled in; drop it",
    "world_size": "the launcher sets it (`accelerate launch --num_processes`); drop it",
    "init_kl_coef": "kl_coef",
    "adap_kl_ctrl": "adaptive KL control is on when kl_target is set (None: fixed kl_coef)",
    "target": "kl_target",
    "horizon": "kl_horizon",
    "tracker_project_name": "report_to picks the tracker; its project comes from its environment (WANDB_PROJECT); "
    "drop it",
    "tracker_kwargs": "drop it (report_to picks the tracker)",
    "accelerator_kwargs": "drop it (the launcher configures accelerate)",
    "project_kwargs": "drop it (logs go under output_dir)",
    "push_to_hub_if_best_kwargs": "push_to_hub / hub_model_id",
    "task_name": "run_name",
    "exp_name": "run_name",
    "dataset_num_proc": "drop it (PPOConfig takes it, for TRL 1.12 scripts)",
}
"""TRL 0.x `PPOConfig` fields (0.11, the last before PPOv2) that `PPOConfig` / `TRAPOConfig` have no field of -> what
replaces each; any other is refused as having no TRAPO equivalent (`early_stopping`, `target_kl`, `score_clip`, ...)."""

TRL0_PPO_FIELDS = frozenset(TRL0_PPO_FIXES) | {
    "optimize_cuda_cache",
    "optimize_device_cache",
    "early_stopping",
    "target_kl",
    "compare_steps",
    "ratio_threshold",
    "use_score_scaling",
    "use_score_norm",
    "score_clip",
    "is_encoder_decoder",
    "is_peft_model",
}
"""Every field of TRL 0.11's `PPOConfig` that `TRAPOConfig` has no field of (0.x is not installed to read them)."""


TRANSFORMERS4_FIXES = {
    "no_cuda": "use_cpu",
    "evaluation_strategy": "eval_strategy",
    "per_gpu_train_batch_size": "per_device_train_batch_size",
    "per_gpu_eval_batch_size": "per_device_eval_batch_size",
    "push_to_hub_token": "hub_token",
    "push_to_hub_model_id": "hub_model_id",
    "warmup_ratio": "use warmup_steps with the same value (transformers 5 reads a value below 1 as a fraction of the "
    "training steps)",
    "logging_dir": "drop it: TensorBoard logs go under output_dir (its `runs/` folder), or where the "
    "TENSORBOARD_LOGGING_DIR environment variable says",
    # trial 10's TA16: each was Python's bare "unexpected keyword argument"
    "save_safetensors": "drop it: transformers 5 always saves weights as safetensors",
    "include_tokens_per_second": "include_num_input_tokens_seen",  # it logs train_tokens_per_second too
    "split_batches": "give it inside accelerator_config: {'split_batches': True} (a dict, or a JSON object on the "
    "command line)",
    "dispatch_batches": "give it inside accelerator_config: {'dispatch_batches': True} (a dict, or a JSON object on "
    "the command line)",
    "use_mps_device": "drop it: transformers 5 uses an Apple GPU (MPS) whenever there is one (use_cpu=True keeps "
    "the run on the CPU)",
    "include_inputs_for_metrics": "drop it: TRAPO's evaluate computes its own metrics (transformers 5's name, "
    "include_for_metrics=['inputs'], is refused here for the same reason)",
    "fp16_backend": "drop it: transformers 5 has only torch's mixed precision (fp16=True or bf16=True)",
    "half_precision_backend": "drop it: transformers 5 has only torch's mixed precision (fp16=True or bf16=True)",
    "fp16_opt_level": "drop it: it was apex's optimisation level, and transformers 5 has no apex (fp16=True or "
    "bf16=True use torch's mixed precision)",
    "tpu_num_cores": "drop it: the TPU launcher (accelerate launch, torch_xla) sets the number of cores",
    "tpu_metrics_debug": "use debug='tpu_metrics_debug'",
    "use_legacy_prediction_loop": "drop it: transformers 5 has one evaluation loop (and TRAPO's evaluate computes "
    "its own metrics)",
    "ray_scope": "drop it: it served Ray Tune's hyperparameter_search, which TRAPOTrainer does not run (transformers "
    "5 reads the RAY_SCOPE environment variable)",
    "torchdynamo": "torch_compile_backend",
    "sharded_ddp": "drop it: FairScale's sharded DDP is gone; shard with DeepSpeed ZeRO or FSDP (docs/distributed.md)",
    "jit_mode_eval": "drop it: transformers 5 no longer traces the model with TorchScript for evaluation",
    "use_ipex": "drop it: transformers 5 no longer applies Intel Extension for PyTorch",
    "mp_parameters": "drop it: it passed SageMaker model-parallel settings, which transformers 5 no longer reads",
    "fsdp_min_num_params": "give it inside fsdp_config: {'min_num_params': N} (a dict, or a JSON object on the "
    "command line)",
    "fsdp_transformer_layer_cls_to_wrap": "give it inside fsdp_config: {'transformer_layer_cls_to_wrap': "
    "['LlamaDecoderLayer']} (a dict, or a JSON object on the command line)",
    "past_index": "drop it: transformers 5 no longer feeds a model's past (mems) back between steps",
    "group_by_length": "drop it: TRAPO groups each step's rows by length itself (transformers 5's name, "
    "train_sampling_strategy='group_by_length', is refused here for the same reason)",
}
"""`TrainingArguments` fields of transformers 4 that transformers 5 removed, which scripts written for it still pass
-> the field that replaces each (a name: same value) or what to do. The command line says the same with its flags
(`trl_trapo.jobs.main.REMOVED_ARGUMENTS`)."""


SETTING_TOKEN_FIELDS = ("stop_token",)
"""The config fields whose names end in `_token` that are settings, not credentials. transformers'
`TrainingArguments.to_dict()` masks every field so named as a secret (`'<STOP_TOKEN>'`, a rule meant for
`hub_token`): `TRAPOConfig.to_dict()` shows these as they are; every other `*_token` field (transformers' `hub_token`)
stays masked. A new `*_token` field must be listed here or be a credential (tests/test_config_values.py checks)."""


def masked_token(name: str) -> str:
    """The text transformers' `TrainingArguments.to_dict()` writes in place of the `*_token` field `name`."""
    return f"<{name.upper()}>"


def check_masked_tokens(config) -> None:
    """Refuse a `*_token` field holding the placeholder `to_dict()` writes in place of its value (`'<HUB_TOKEN>'`),
    which a rebuild `type(args)(**args.to_dict())` passes back: a token that would fail at the Hub, or a setting the
    user never wrote.

    Raises:
        ValueError: naming the field, the placeholder and the fix.
    """
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.init and f.name.endswith("_token") and value == masked_token(f.name):
            fix = (
                f"give its value (e.g. {f.name}={f.default!r}, the default)"
                if f.name in SETTING_TOKEN_FIELDS
                else f"pass the real token ({f.name}=...), or leave {f.name} unset to use the token of `hf auth login`"
            )
            raise ValueError(
                f"{type(config).__name__}.{f.name}={value!r} is the placeholder `to_dict()` writes in place of a "
                f"secret, not a value: a config rebuilt from `to_dict()` does not carry it. Fix: {fix}."
            )


def _bf16_supported() -> bool:
    return (torch.cuda.is_available() and torch.cuda.is_bf16_supported()) or (
        hasattr(torch, "xpu") and torch.xpu.is_available()
    )


def _grpo_config_fields() -> set[str]:
    """TRL GRPOConfig's field names (imported when a config is built with an unknown keyword only)."""
    from trl import GRPOConfig

    return set(GRPOConfig.__dataclass_fields__)


def _sft_config_fields() -> set[str]:
    """TRL SFTConfig's field names, and the older ones `SFT_ONLY_FIXES` maps (imported on an unknown keyword only)."""
    from trl import SFTConfig

    return set(SFTConfig.__dataclass_fields__) | set(SFT_ONLY_FIXES)


def foreign_fields(names) -> list[tuple[str, str, str]]:
    """The names among `names` that are fields of another trainer's config TRAPO's scripts come from, each with its
    source and what to use instead: transformers 4's `TrainingArguments` (`TRANSFORMERS4_FIXES`), TRL 1.16's
    `GRPOConfig` (`GRPO_ONLY_FIXES`), its `SFTConfig` (`SFT_ONLY_FIXES`), TRL 0.x's `PPOConfig` (`TRL0_PPO_FIXES`). A name several of them have is attributed to the first. Used by the
    config's refusal of unknown keywords and by the command line's "did you mean".

    Args:
        names: candidate field names (those a config class does not have).

    Returns:
        `list[tuple[str, str, str]]`: (name, source, fix) in the order given; names of none of them are left out.
    """
    names = list(names)
    if not names:
        return []
    sources = (
        ("transformers 4 TrainingArguments", TRANSFORMERS4_FIXES, TRANSFORMERS4_FIXES),
        ("TRL GRPOConfig", _grpo_config_fields(), GRPO_ONLY_FIXES),
        ("TRL SFTConfig", _sft_config_fields(), SFT_ONLY_FIXES),
        ("TRL 0.x PPOConfig", TRL0_PPO_FIELDS, TRL0_PPO_FIXES),
    )
    found = []
    for name in names:
        for source, fields_, fixes in sources:
            if name in fields_:
                found.append((name, source, fixes.get(name, "no TRAPO equivalent, drop it")))
                break
    return found


ACCEPTED_TYPES = {"curriculum_mixtures": list[float | Mapping]}
"""Fields that take more in Python than their annotation (which is what the command line parses) says."""
TYPE_NAMES = {bool: "True or False", int: "an int", float: "a number", str: "a string", type(None): "None"}


def _type_name(kind) -> str:
    """`kind` (a field annotation) in words, e.g. "an int or None", "a list of numbers", "one of 'k1', 'k2'"."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple):
        return f"a list of {_type_name(args[0]).removeprefix('an ').removeprefix('a ')}s" if args else "a list"
    return TYPE_NAMES.get(kind, getattr(kind, "__name__", str(kind)))


def literal_choices(kind) -> tuple:
    """The values a `Literal[...]` annotation (or `Literal[...] | None`) allows, None included; () for any other."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Literal:
        return args
    if origin in (typing.Union, types.UnionType):
        parts = [literal_choices(a) if a is not type(None) else (None,) for a in args]
        return sum(parts, ()) if all(parts) else ()
    return ()


def _type_matches(value, kind) -> bool | None:
    """Whether `value` has the type a field annotated `kind` holds: True, False, or None where the annotation names a
    class this check leaves to the field's own validation (a dict of settings, an enum, a config object)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        results = [_type_matches(value, a) for a in args]
        return True if True in results else None if None in results else False
    if origin is Literal:  # the type only: `check_field_types` checks the value against the choices first
        return value in args or any(type(value) is type(a) for a in args)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        results = [_type_matches(v, args[0]) for v in value] if args else []
        return False if False in results else None if None in results else True
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):  # an int is a number; True is not a count
        return isinstance(value, numbers.Integral if kind is int else numbers.Real) and not isinstance(value, bool)
    if kind is str:  # a `pathlib.Path` where a path is a string (`output_dir`), as transformers converts it
        return isinstance(value, (str, os.PathLike))
    if kind is typing.Any:
        return True
    return True if isinstance(kind, type) and not issubclass(kind, enum.Enum) and isinstance(value, kind) else None


@functools.cache
def _annotations(cls: type) -> dict[str, object]:
    """Field -> its annotation, resolved (`typing.get_type_hints`, once per class)."""
    return typing.get_type_hints(cls)


NONE_FIXES = {
    "max_grad_norm": "write max_grad_norm=0 for no clipping (the gradient norm is still logged)",
    "weight_decay": "write weight_decay=0.0 for no weight decay",
    "warmup_steps": "write warmup_steps=0 for no warm-up",
    "max_steps": "write max_steps=-1 to train num_train_epochs epochs",
    "eval_delay": "write eval_delay=0 to evaluate from the first step",
}
"""What to write instead of None (a script's "off" or "unset") in a number field of transformers' `TrainingArguments`
that refuses it ([`_field_annotations`]), where a number means what the None was meant to; others get their default."""
NONE_ACCEPTED_NUMBERS = {"local_rank"}
"""Number fields of transformers' `TrainingArguments` that take None although annotated without it: `local_rank`
(only parsed, for `torch.distributed.launch`'s `--local_rank`; transformers 5 reads the rank from the environment)."""


@functools.cache
def _field_annotations(cls: type) -> dict[str, object]:
    """Field -> the type its values must have: the annotation (`ACCEPTED_TYPES` where wider), with None allowed in the
    fields of transformers' and TRL's classes, which do not always annotate a None they accept (`debug`), except their
    plain `int` and `float` fields (`max_grad_norm`, `seed`, `warmup_steps`, ...; `NONE_ACCEPTED_NUMBERS` aside):
    transformers compares or computes with them, so None passed `TrainingArguments` and failed later, in training, with
    a `TypeError` naming no field (trial 13's N07: `max_grad_norm=None` at the first optimizer step), or in its
    `__post_init__` with the same bare `TypeError`. The command line refuses `--max_grad_norm None` as argparse's
    "invalid float value"; Python gets [`check_field_types`]' message naming the field and the fix (`NONE_FIXES`)."""
    hints = _annotations(cls)
    own = {name for c in cls.__mro__ if issubclass(c, TRAPOConfig) for name in vars(c).get("__annotations__", {})}
    plain_numbers = {f.name for f in dataclasses.fields(cls) if hints[f.name] in (int, float)} - NONE_ACCEPTED_NUMBERS
    exact = own | plain_numbers
    return {
        f.name: ACCEPTED_TYPES.get(f.name, hints[f.name] if f.name in exact else hints[f.name] | None)
        for f in dataclasses.fields(cls)
        if f.init
    }


TRL_ONLY_CHOICES = {
    "loss_type": {
        "cispo": "CISPO, MiniMax-M1's clipped importance-sampling weights",
        "sapo": "SAPO, Soft Adaptive Policy Optimization's soft gate",
        "luspo": "LUSPO, a length-unbiased sequence-level loss",
        "vespo": "VESPO, a Gamma weighting of sequence-level ratios",
    },
}
"""Values TRL 1.16's `GRPOConfig` accepts for a field TRAPO shares but has no equivalent of (field -> value -> what it
is), named as such when refused: a GRPO script moved over gets "TRL's 'sapo' ... has no TRAPO equivalent"."""


def _choices(kind) -> tuple | None:
    """The values a field annotated `kind` must take one of, or None where it takes free values as well.

    Fixed choices come from `Literal[...]` (TRAPO's `dare_mode`, `kl_estimator`, ...) and from an enum (transformers'
    `lr_scheduler_type: SchedulerType | str`, `optim`, `eval_strategy`, ...: the enum's values; the `str` beside it is
    the enum's text form), plus None where the annotation allows it. A field that also takes free text or numbers
    (`trackio_static_space_id: str | None | Literal[False]`) has none.
    """
    parts = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    enums = [a for a in parts if isinstance(a, type) and issubclass(a, enum.Enum)]
    choices: list = []
    for a in parts:
        if typing.get_origin(a) is Literal:
            choices += typing.get_args(a)
        elif a in enums:
            choices += [member.value for member in a]
        elif a is type(None):
            choices.append(None)
        elif not (a is str and enums):
            return None
    return tuple(choices) if len(choices) > (None in choices) else None


def _check_choice(config, f: dataclasses.Field, value) -> None:
    """Refuse `value` of the field `f` when the annotation offers fixed choices ([`_choices`]) it is not one of.

    Raises:
        ValueError: naming the field, the value, the choices, a close one ("did you mean") and, for a value of TRL's
            only ([`TRL_ONLY_CHOICES`]), that it is TRL's and has no TRAPO equivalent.
    """
    choices = _choices(_annotations(type(config))[f.name])  # as annotated: transformers' enums take no None
    if choices is None or isinstance(value, enum.Enum) or any(value == c and type(value) is type(c) for c in choices):
        return
    shown = ", ".join(repr(c) for c in choices)
    trl_only = TRL_ONLY_CHOICES.get(f.name, {}).get(value, "") if isinstance(value, str) else None
    close = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1) if trl_only == "" else []
    if trl_only:
        problem = f": TRL's {value!r} ({trl_only}) has no TRAPO equivalent;"
    else:
        problem = f" (did you mean {close[0]!r}?):" if close else ":"
    default = "" if f.default is dataclasses.MISSING else f" (the default is {f.default!r})"
    raise ValueError(f"{type(config).__name__}.{f.name}={value!r} is invalid{problem} use one of {shown}{default}.")


def check_field_types(config) -> None:
    """Refuse a field whose value does not have its annotated type (`learning_rate="1e-3"`, `max_prompt_length=None`,
    `num_generations=2.5`), or is not one of its annotated choices (`dare_mode="dynamik"` of a
    `Literal["dynamic", "static"]`, `lr_scheduler_type="cosin"` of transformers' `SchedulerType`), before any other
    check compares or computes with it. A field at its default passes.

    Raises:
        ValueError: naming the field, the value, the type or the choices expected and the fix.
    """
    for f in dataclasses.fields(config):
        if not f.init or (value := getattr(config, f.name)) is f.default:
            continue
        kind = _field_annotations(type(config))[f.name]
        _check_choice(config, f, value)
        if _type_matches(value, kind) is not False:
            continue
        expected, got = _type_name(kind), "None" if value is None else type(value).__name__
        default = "" if f.default is dataclasses.MISSING else f" (the default is {f.default!r})"
        fix = f"give {expected}{default}"
        if isinstance(value, str) or (isinstance(value, float) and value.is_integer()):
            for convert in (int, float):  # the number the user meant, if the field takes it
                try:
                    number = convert(value)
                except ValueError:
                    continue
                if _type_matches(number, kind):
                    fix = f"write {f.name}={number!r}" + (
                        " (a number, not a string)" if isinstance(value, str) else ""
                    )
                    break
        elif value is None and _annotations(transformers.TrainingArguments).get(f.name) in (int, float):
            got = "None (transformers compares or computes with it: None would fail later, in a TypeError naming no field)"
            fix = f"{NONE_FIXES[f.name]}{default}" if f.name in NONE_FIXES else fix
        elif value is None:  # e.g. GRPOConfig's max_prompt_length=None of older TRL versions
            got = "None (a no-limit None of some TRL configs has no equivalent here)"
        elif isinstance(value, (list, tuple)) and (
            lists := [a for a in (kind, *typing.get_args(kind)) if typing.get_origin(a) in (list, tuple)]
        ):
            item = next((v for v in value if _type_matches(v, typing.get_args(lists[0])[0]) is False), None)
            got = f"a list holding {item!r}" if item is not None else got
        raise ValueError(
            f"{type(config).__name__}.{f.name}={value!r} is invalid: it must be {expected}, not {got}: {fix}."
        )


def paths_as_text(config) -> None:
    """Replace an `os.PathLike` (`pathlib.Path`) in a field by its `os.fspath`: [`check_field_types`] lets one through
    where a field takes a path as text (`resume_from_checkpoint`, `teacher_model_name_or_path`, `deepspeed`, ...), and
    the checks and messages that read the field compare and show text, as transformers converts `output_dir`
    (`resume_from_checkpoint=Path(...)` got advice about a `~` it did not hold, trial 13's N31)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.init and isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):
            setattr(config, f.name, os.fspath(value))


INFINITE_ALLOWED = {
    "max_grad_norm": "inf clips nothing and still computes and logs the gradient norm (torch's clip_grad_norm_ "
    "scales by min(1, inf / norm) = 1), as 0 does (transformers then computes the norm with inf)",
}
"""The float fields where +inf is a setting (field -> what it means); every other float field takes finite numbers
only, and none takes NaN or -inf ([`check_finite_numbers`])."""


def _holds_float(kind) -> bool:
    """Whether a field annotated `kind` holds floats: `float`, `float | None`, `list[float]`, `list[float | Mapping]`."""
    return kind is float or any(_holds_float(a) for a in typing.get_args(kind))


def _real_numbers(value) -> list:
    """The real numbers (bools aside) in a field's value: itself, a list's items, a mapping item's values (the form of
    `curriculum_mixtures`)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    items += [v for item in items if isinstance(item, Mapping) for v in item.values()]
    return [x for x in items if isinstance(x, numbers.Real) and not isinstance(x, bool)]


def check_finite_numbers(config) -> None:
    """Refuse NaN, -inf, and +inf where it is not a setting ([`INFINITE_ALLOWED`]), in every field annotated with
    `float` (lists of them included), before any range check runs. NaN fails every comparison, so a range check
    written `if value < 0: refuse` let it through and the term the field weighs was silently switched off (trial 10's
    PY41, PY42: `entropy_coef=nan`, `kl_coef=nan`); +inf passed `>= 0` and made the loss NaN steps later (PY43,
    `late_entropy_coef=inf`). One check over the fields' annotations, so a new float field is covered without a range
    check of its own.

    Raises:
        ValueError: naming the field, the value and the fix.
    """
    for f in dataclasses.fields(config):
        if not f.init or not _holds_float(_field_annotations(type(config))[f.name]):
            continue
        value = getattr(config, f.name)
        allowed = INFINITE_ALLOWED.get(f.name)
        wrong = [x for x in _real_numbers(value) if not math.isfinite(x) and not (x == math.inf and allowed)]
        if not wrong:
            continue
        default = "" if f.default is dataclasses.MISSING else f" (the default is {f.default!r})"
        what = (
            "NaN fails every range check, so it would silently switch off what the field controls"
            if math.isnan(wrong[0])
            else "an infinite value is no setting here: it passes a range check meant for finite numbers, then "
            "overflows what it enters (the loss becomes NaN)"
        )
        takes = f"a finite number{default}, or inf: {allowed}" if allowed else f"a finite number{default}"
        raise ValueError(f"{type(config).__name__}.{f.name}={value!r} is invalid: {what}. Give {takes}.")


PATH_OR_DICT_FIELDS = ("deepspeed", "fsdp_config", "accelerator_config")
"""transformers' dict fields that also take the path of a JSON file: a text value not starting with `{` is a path."""
JSON_EXAMPLES = {
    "generation_kwargs": '{"min_p": 0.1}',
    "chat_template_kwargs": '{"enable_thinking": false}',
    "model_init_kwargs": '{"dtype": "bfloat16"}',
    "teacher_model_init_kwargs": '{"dtype": "bfloat16"}',
    "lr_scheduler_kwargs": '{"num_cycles": 2}',
}
"""An example JSON object per dict field, for the message of `check_json_dicts` (others: a generic one)."""


def _is_dict_field(kind) -> bool:
    """Whether a field annotated `kind` holds a dict (`dict`, `dict[str, Any] | str | None`, ...)."""
    return any(a is dict or typing.get_origin(a) is dict for a in (kind, *typing.get_args(kind)))


def check_json_dicts(config) -> None:
    """Refuse a dict field given as text that is not a JSON object. The command line gives every dict field as text
    (`--generation_kwargs '{"min_p": 0.1}'`), as Python may; transformers' `__post_init__` parses the text of the
    fields in `_VALID_DICT_FIELDS` (TRL's configs list theirs there), raising a bare `JSONDecodeError` that names
    neither field nor value for malformed text, and leaving text that does not start with `{` as it is. Fields of
    `PATH_OR_DICT_FIELDS` also take a file path (any text not starting with `{`).

    Raises:
        ValueError: naming the field, the value, what is wrong with it and the form expected.
    """
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if not f.init or not isinstance(value, str) or not _is_dict_field(hints[f.name]):
            continue
        path = f.name in PATH_OR_DICT_FIELDS
        if path and not value.startswith("{"):
            continue
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            problem = f"it is not valid JSON ({error})"
        else:
            problem = (
                f"it is a JSON {type(parsed).__name__}, not an object"
                if not isinstance(parsed, dict)
                else "it does not start with '{'"  # leading spaces: transformers would leave it as text
                if not value.startswith("{")
                else None
            )
        if problem is not None:
            example = JSON_EXAMPLES.get(f.name, '{"key": "value"}')
            raise ValueError(
                f"{type(config).__name__}.{f.name}={value!r} is invalid: {problem}. It takes a JSON object, keys in "
                f"double quotes, e.g. `--{f.name} '{example}'` on the command line (in Python or a YAML recipe: a "
                f"dict{', or the path of a JSON file' if path else ''})."
            )


def changed_settings(config, names) -> list[str]:
    """The fields of `names` whose value differs from the dataclass field's default, in the order of the fields: the
    settings the user gave (a dataclass cannot tell an explicit default apart, which counts as not given).

    Args:
        config: a dataclass instance (`TRAPOConfig`, TRL's `ModelConfig`).
        names: field names.
    """
    changed = []
    for f in dataclasses.fields(config):
        if f.name not in names:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        if getattr(config, f.name) != default:
            changed.append(f.name)
    return changed


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 phase`, `3 phases` (`nouns`: the plural when it is not `noun` + s)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def curriculum_phases_refusal(config, mixtures: list) -> tuple[str, object, str]:
    """Why `curriculum_mixtures` and `curriculum_boundaries` disagree on the number of phases, blaming the one the
    user set (trial 16's N04: `curriculum_boundaries=[]` alone was refused as an invalid `curriculum_mixtures`, a field
    left at its default, without saying that the boundaries made one phase).

    Args:
        config: the config (its `curriculum_boundaries`, and which of the two fields differ from their defaults).
        mixtures: `curriculum_mixtures`, flattened (numbers, or one mapping per phase).

    Returns:
        `(field, value, text)` for the config's refusal: the field the user set (`curriculum_mixtures` when both
        or neither), its value, and the text naming both fields, the phases each makes and the fix.
    """
    boundaries = list(config.curriculum_boundaries)
    phases = len(boundaries) + 1
    given = changed_settings(config, ("curriculum_boundaries", "curriculum_mixtures"))
    name = "curriculum_boundaries" if given == ["curriculum_boundaries"] else "curriculum_mixtures"
    left = {  # a field left at its default is shown with its value: the user may not know it
        "curriculum_boundaries": "" if "curriculum_boundaries" in given else ", left at its default,",
        "curriculum_mixtures": "" if "curriculum_mixtures" in given else f"={mixtures!r}, left at its default,",
    }
    mappings = bool(mixtures) and all(isinstance(m, Mapping) for m in mixtures)
    if mappings:
        has = len(mixtures)
        held = f"has {plural(has, 'phase')} ({plural(has, 'mapping')}, one per phase)"
    elif any(isinstance(m, Mapping) for m in mixtures):
        has, held = None, "mixes numbers and mappings (give one form: 3 numbers per phase, or one mapping per phase)"
    elif len(mixtures) % 3 == 0:
        has = len(mixtures) // 3
        held = f"has {plural(has, 'phase')} ({plural(len(mixtures), 'number')}, 3 (pretrain, sft, rl) per phase)"
    else:
        has, held = None, f"has {plural(len(mixtures), 'number')}, not a whole number of (pretrain, sft, rl) triples"
    cause = (
        f"curriculum_boundaries={boundaries!r}{left['curriculum_boundaries']} makes {plural(phases, 'phase')} (one "
        f"more than its boundaries), but curriculum_mixtures{left['curriculum_mixtures']} {held}"
    )
    if mappings:
        to_boundaries = f"give one mapping per phase: {phases} phases need {phases}"
    else:
        numbers = "p, s, r" if phases == 1 else ", ".join(f"p{i}, s{i}, r{i}" for i in range(1, phases + 1))
        if phases > 3:
            numbers = f"p1, s1, r1, ..., p{phases}, s{phases}, r{phases}"
        to_boundaries = (
            f"give 3 numbers (pretrain, sft, rl) per phase: {plural(phases, 'phase needs', 'phases need')} "
            f"{3 * phases}, curriculum_mixtures=[{numbers}] (each phase's three shares sum to 1), or one mapping "
            f"objective -> share per phase ({'one' if phases == 1 else f'{phases} of them, each'} like "
            '{"pretrain": p, "sft": s, "rl": r})'
        )
    fixes = [to_boundaries]
    if has:
        fit = [0.2, 0.8] if has == 3 else [round(i / has, 2) for i in range(1, has)]
        count = "no boundary" if has == 1 else plural(has - 1, "boundary", "boundaries")
        to_mixtures = f"give curriculum_boundaries={fit!r} ({count}: {plural(has, 'phase')})"
        fixes.insert(0 if name == "curriculum_mixtures" else 1, to_mixtures)
    return name, getattr(config, name), f"{cause}. Fix: {'; or '.join(fixes)}."


def warn_ignored_settings(log: logging.Logger, given: list[str], gate: str, consequence: str, fix: str) -> None:
    """Warn, naming them, that settings the user gave are ignored because `gate` is not set (the run keeps that
    behaviour; the warning says so): "--lora_r is set but --use_peft is not: it is ignored and ...".

    Args:
        log: the logger of the module that checks (the warning names it).
        given: the settings as the user wrote them (`--lora_r`, `max_staleness=0`); nothing is logged when empty.
        gate: the setting they need (`--use_peft`).
        consequence: what happens instead, appended to "ignored" (e.g. " and the full model is trained").
        fix: the fix; `{them}` reads "it" or "them".
    """
    if not given:
        return
    one = len(given) == 1
    log.warning(
        "%s %s set but %s is not: %s ignored%s. %s",
        ", ".join(given),
        "is" if one else "are",
        gate,
        "it is" if one else "they are",
        consequence,
        fix.format(them="it" if one else "them"),
    )


MIN_TRAJECTORY_BYTES = 28
"""Host bytes of the smallest trajectory the replay buffer can hold: one prompt and one completion token, int64 ids
(8 + 8) and the float32 completion mask, behaviour log-prob and advantage (4 + 4 + 4) that every trajectory carries
(`rollout.py` builds them; `memory.Trajectory`'s required fields), uncompressed (the buffer keeps a trajectory
compressed only when that is smaller, never at this size). A `replay_max_bytes` below it can hold no trajectory."""
DEFAULT_MAX_STALENESS = 4
"""The `max_staleness` that None stands for with `async_rollouts=True`: TRL's `AsyncGRPOConfig` default."""
ASYNC_FIELDS = (
    "max_staleness",
    "stale_rollouts",
    "weight_sync_steps",
    "async_correction",
    "async_deterministic",
    "async_producer_threads",
)
"""`TRAPOConfig`'s settings that only `async_rollouts=True` reads (the producer, its rounds and their lag)."""
TEACHER_FIELDS = (
    "distillation_weight",  # the distillation objective's weight: no objective without a teacher (trial 17's W04d)
    "teacher_model_revision",
    "teacher_model_init_kwargs",
    "distillation_beta",
    "distillation_estimator",
    "distillation_temperature",
)
"""`TRAPOConfig`'s settings that only a distillation teacher reads (`teacher_model` or `teacher_model_name_or_path`;
warned about by `teacher.load_teacher` when given without one)."""
VLLM_FIELDS = (
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "vllm_max_model_length",
    "vllm_enable_sleep_mode",
    "vllm_server_base_url",
    "vllm_server_timeout",
)
"""`TRAPOConfig`'s settings that only `use_vllm=True` reads (the `vllm_importance_sampling_*` ones are not among them:
they also correct a `rollout_func`'s log-probs)."""
ADAPTER_BANK_FIELDS = (
    "adapter_snapshot_steps",
    "max_adapter_snapshots",
    "adapter_rollback_reward_drop",
    "adapter_rollback_kl_max",
)
"""`TRAPOConfig`'s settings that only the adapter bank reads: a PEFT policy with `adapter_snapshot_steps > 0`
(warned about by `assembly.build_adapter_bank` otherwise)."""
POWERSGD_FIELDS = ("powersgd_rank", "powersgd_start_iter")
"""`TRAPOConfig`'s settings that only `ddp_comm_hook="powersgd"` reads."""
DARE_FIELDS = (
    "dare_momentum",
    "dare_update_interval",
    "dare_min_factor",
    "dare_max_factor",
    "dare_probe_vocab",
    "dare_probe_dim",
)
"""`TRAPOConfig`'s settings of DARE (the adaptive strategies share some of them), which static weights, the default,
ignore."""
WEIGHTING_READS = {
    "static": (),
    "dare": DARE_FIELDS,
    "uncertainty": ("dare_update_interval", "dare_min_factor", "dare_max_factor"),
    "gradnorm": ("dare_update_interval", "dare_probe_vocab", "dare_probe_dim"),
    "gac": ("dare_momentum", "dare_update_interval", "dare_probe_vocab", "dare_probe_dim"),
}
"""Which of [`DARE_FIELDS`] each weighting strategy reads (`weighting.build_weighting`, `assembly.build_step_controls`):
every adaptive strategy updates every `dare_update_interval` steps; DARE smooths with `dare_momentum` and clips to
[`dare_min_factor`, `dare_max_factor`]; uncertainty weighting clips its factors to those bounds and learns from the
objectives' losses (not the probe's gradients, so the probe's size does not change it); GradNorm balances the probe's
gradient norms with its own Adam step (no momentum, no bounds); GAC smooths its closed form with `dare_momentum` (no
bounds). A setting the chosen strategy does not read is warned about (`TRAPOConfig._warn_unused_settings`)."""
THREAD_FIELDS = ("torch_threads", "async_producer_threads")
"""`TRAPOConfig`'s numbers of torch threads per process (warned about when more than the usable cores)."""


def check_hub_repo_id(args, hub_model_id: str | None = None) -> None:
    """Refuse a Hub repo id that the Hub would refuse, before anything trains: `hub_model_id` (default
    `args.hub_model_id`), or, when it is None, the last part of `output_dir`, as `Trainer.init_hf_repo` and
    `Trainer.push_to_hub` derive it (`"my run"` from `output_dir="runs/my run"`).

    Raises:
        ValueError: naming the field the id comes from, the id, huggingface_hub's reason and the fix (`hub_model_id`).
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo_id = hub_model_id or args.hub_model_id
    source = "hub_model_id" if repo_id else "output_dir"
    repo_id = repo_id or os.path.basename(os.path.abspath(args.output_dir))
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        derived = f" (the last part of output_dir={args.output_dir!r})" if source == "output_dir" else ""
        raise ValueError(
            f"{type(args).__name__}.{source}: the Hub repo id {repo_id!r}{derived} is not a valid repo id: {error} "
            "Set hub_model_id (`--hub_model_id`) to a valid one, e.g. 'your-name/"
            f"{re.sub(r'[^A-Za-z0-9._-]+', '-', repo_id.split('/')[-1]).strip('-.') or 'my-model'}'."
        ) from None


def weighting_name(args: TRAPOConfig) -> str:
    """The strategy a config selects: `weighting`, or, where that is None, `dare_mode` ("dynamic" -> "dare",
    "static" -> "static"). The default config (`weighting=None`, `dare_mode="static"`) gives "static"."""
    if args.weighting is not None:
        return args.weighting
    return "dare" if args.dare_mode == "dynamic" else "static"


@dataclass
class TRAPOConfig(_BaseConfig):
    r"""
    Configuration for [`TRAPOTrainer`]: one policy trained on pretraining (causal LM), SFT and RL objectives in one
    loop.

    Only the fields TRAPO adds are listed here; the rest are [`~transformers.TrainingArguments`]. Every field carries
    `metadata["help"]`, which `TrlParser` shows with `--help`.

    How the objectives combine (see docs/how_it_works.md, "The curriculum and DARE"):

    - the **share** s_o of a step's examples (rows) given to objective o is the curriculum mixture, restricted to the
      objectives that have data and a non-zero weight, renormalised to sum to 1;
    - the **loss weight** w_o = c_o · s_o · f_o / Σ_k c_k · s_k · f_k, where c_o is the user's static multiplier
      (`pretrain_weight`, `sft_weight`, `rl_weight`) and f_o is the weighting strategy's factor: 1 with the default
      static weighting, DARE's measured factor with `weighting="dare"` (or another strategy's, see `weighting`);
    - the loss of one optimizer step is L = Σ_o w_o · L_o, each L_o averaged over its own tokens across all
      gradient-accumulation micro-batches and all ranks.

    Raises:
        ValueError: from `__post_init__`, naming the field, the bad value and the fix, for any inconsistent setting.
    """

    # dict fields whose JSON text (the command line's form) transformers' `__post_init__` parses, as in TRL's configs
    _VALID_DICT_FIELDS = _BaseConfig._VALID_DICT_FIELDS + [
        "liger_kernel_config",
        "model_init_kwargs",
        "teacher_model_init_kwargs",
        "generation_kwargs",
        "chat_template_kwargs",
        "grpo_values_built",
    ]

    def __new__(cls, *args, **kwargs):
        # the dataclass __init__ refuses an unknown keyword with a bare TypeError; a TRL GRPOConfig field is refused
        # here first, naming it and the fix (GRPO's names of TRAPO's own settings are fields: `GRPO_ALIASES`)
        # and so are an SFTConfig field and a TRL 0.x PPOConfig field (`foreign_fields`), and an argument of the
        # `trapo train` job a recipe holds (`job_arguments`)
        unknown = sorted(set(kwargs) - set(cls.__dataclass_fields__))
        found = foreign_fields(unknown)
        if any(source == "TRL 0.x PPOConfig" for _, source, _ in found):  # 0.x meanings of names PPOConfig fills in
            found += [
                (n, "TRL 0.x PPOConfig", TRL0_PPO_FIXES[n])
                for n in ("batch_size", "mini_batch_size")
                if n in kwargs and n not in unknown
            ]
        named = {name for name, _, _ in found}
        job = job_arguments([name for name in unknown if name not in named]) if len(unknown) > len(named) else ""
        if job and not found:
            raise TypeError(f"{cls.__name__} got {job}")
        if found:
            parts = []
            for source in dict.fromkeys(source for _, source, _ in found):
                fixes = "; ".join(
                    f"{name}={kwargs[name]!r}: " + (f"rename it {fix}={kwargs[name]!r}" if fix.isidentifier() else fix)
                    for name, where, fix in found
                    if where == source
                )
                parts.append(f"{source} field(s) it does not have: {fixes}.")
            guides = {
                "transformers 4 TrainingArguments": "transformers 5 removed or renamed them.",
                "TRL GRPOConfig": "GRPOConfig's names that TRAPOConfig accepts as aliases: "
                f"{', '.join(f'{a} (= {t})' for a, t in GRPO_ALIASES.items())}; the full mapping is in "
                "docs/agents.md, 'Moving a GRPOTrainer script over'.",
                "TRL SFTConfig": "SFT rows are passed to the trainer as `sft_dataset=` (docs/python.md).",
                "TRL 0.x PPOConfig": "TRL 1.x's PPOConfig, which this one follows, renamed or dropped them "
                "(docs/migrating_from_ppo.md).",
            }
            sources = dict.fromkeys(source for _, source, _ in found)
            raise TypeError(
                f"{cls.__name__} got "
                + " It got ".join(parts)
                + " "
                + " ".join(guides[s] for s in sources)
                + (f" It also got {job}" if job else "")
            )
        return super().__new__(cls)

    # ------------------------------------------------------------------------------------------------------------
    # Overridden TrainingArguments / _BaseConfig defaults
    # ------------------------------------------------------------------------------------------------------------
    learning_rate: float = field(
        default=5e-5,
        metadata={
            "help": "Initial AdamW learning rate. The source document uses 5e-5, lowered to 3e-5 in the RL phase."
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "Whether to use bf16 mixed precision. If not set, it is turned on only when a CUDA device with "
            "bf16 support (or an XPU) is present, so CPU runs use fp32 (TRL's base config would turn it on)."
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of `activation_checkpointing` (transformers 5); use that instead."},
    )
    liger_kernel_config: dict[str, bool] | str | None = field(
        default=None,
        metadata={
            "help": "Configuration for Liger Kernel (`use_liger_kernel`), passed as kwargs to its patching function; "
            "None: its default. A dict, or its JSON text (transformers' `dict[str, bool] | None` could not be given "
            "on the command line)."
        },
    )
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Recompute activations in the backward pass to save memory (~20%% slower steps). If not set, the "
            "deprecated `gradient_checkpointing` alias decides when given, else it is on, as in TRL. (TRL's configs set "
            "that alias by default, which made transformers warn on every run.)"
        },
    )
    dataloader_pin_memory: bool = field(
        default=False,
        metadata={"help": "The Trainer's own dataloader only carries step placeholders; pinning them buys nothing."},
    )
    remove_unused_columns: bool = field(
        default=False,
        metadata={"help": "Kept False: extra dataset columns are passed to reward functions as keyword arguments."},
    )

    # ------------------------------------------------------------------------------------------------------------
    # Console (what the terminal shows; `trainer_state.json` and the trackers of `report_to` get every metric)
    # ------------------------------------------------------------------------------------------------------------
    console_metrics: Literal["short", "all"] = field(
        default="short",
        metadata={
            "help": "What a training step's log line on the console shows. 'short': the Trainer's own (loss, "
            "grad_norm, learning_rate, epoch), each objective's loss and weight and the rollouts' mean score and KL "
            "(`trl_trapo.callbacks.CONSOLE_METRICS`, docs/metrics.md); 'all': every metric, and a progress bar per "
            "rollout round beside the training bar. Evaluation lines and lines you log yourself are shown whole "
            "either way."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Model loading
    # ------------------------------------------------------------------------------------------------------------
    model_init_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments of `AutoModelForCausalLM.from_pretrained` when `model` is a string (e.g. "
            "{'dtype': 'bfloat16'})."
        },
    )
    model_adapter_name: str | None = field(
        default=None,
        metadata={"help": "PEFT: name of the adapter to train, when the policy holds several."},
    )
    ref_adapter_name: str | None = field(
        default=None,
        metadata={
            "help": "PEFT: name of an adapter to use as the reference policy. Default: a frozen copy of the policy's "
            "adapter as it was at the start (or the adapter disabled when `peft_config` creates a fresh one)."
        },
    )
    disable_dropout: bool = field(
        default=True,
        metadata={
            "help": "Disable dropout in the policy, reference, value model and teacher, so behaviour, current and "
            "reference log-probs of a token are computed by the same function (PPO's first ratio is exactly 1). "
            "Beyond TRL's `disable_dropout_in_model` (p = 0 on every `nn.Dropout`), the float dropout probabilities "
            "attention modules copy from their config (Llama / Qwen2 / Mistral `attention_dropout`, CLIP's "
            "`dropout`, ...) are set to 0.0, and so are the `*drop*` fields of each model's config and sub-configs "
            "(so copies rebuilt from it, e.g. a ZeRO-3 reference, have none): the model's config then says 0.0, "
            "also in a model saved from the run; each changed field is logged (WARNING) with its old value. "
            "Reward models are frozen in eval mode, where dropout never runs, and are left as given."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # On-policy distillation: a fourth objective when a teacher is given (trl_trapo/objectives.py)
    # ------------------------------------------------------------------------------------------------------------
    teacher_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A teacher (model id or local path, as TRL's DistillationConfig spells it): the student's own "
            "sampled completions are scored by it and the divergence to it is a fourth objective, `distill`, "
            "weighted by DARE like the others. It must share the policy's tokenizer (cross-tokenizer distillation "
            "is TRL's GOLD, not supported here). With the three-number `curriculum_mixtures` the distillation "
            "objective takes half of RL's share in every phase; give one mapping per phase to choose. None: off."
        },
    )
    teacher_model_revision: str | None = field(
        default=None, metadata={"help": "The teacher's revision (branch, tag or commit) on the Hub."}
    )
    teacher_model_init_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of `AutoModelForCausalLM.from_pretrained` for the teacher."},
    )
    distillation_weight: float = field(
        default=1.0,
        metadata={"help": "Static multiplier c_distill of the distillation objective (0 switches it off)."},
    )
    distillation_beta: float = field(
        default=1.0,
        metadata={
            "help": "Which divergence to the teacher (TRL DistillationConfig's `beta`, renamed so it is not GRPO's "
            "KL coefficient): 0 forward KL(teacher || student), 1 reverse KL(student || teacher), in between the "
            "generalised JSD with mixture (1 - beta) p_student + beta p_teacher (GKD, "
            "huggingface.co/papers/2306.13649)."
        },
    )
    distillation_estimator: Literal["full", "sampled_token"] = field(
        default="full",
        metadata={
            "help": "'full': the divergence over the whole vocabulary, the teacher's forward in the training step. "
            "'sampled_token': the reverse KL estimated from the teacher's log-probability of each sampled token only "
            "(computed once per round, next to the reference's; what a teacher behind a server returning "
            "log-probabilities allows), trained as a policy gradient with per-token reward log p_teacher - "
            "log p_student. It estimates KL(student || teacher) only on rows sampled at distillation_temperature: "
            "rows sampled at another temperature (targeted exploration) are left out of it."
        },
    )
    distillation_temperature: float = field(
        default=1.0,
        metadata={
            "help": "Softmax temperature of both distributions in the divergence (TRL DistillationConfig's "
            "`temperature` in the loss); not the rows' sampling temperature."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Objective weights
    # ------------------------------------------------------------------------------------------------------------
    pretrain_weight: float = field(
        default=1.0,
        metadata={
            "help": "Static multiplier c_pretrain of the pretraining (causal-LM, 'ptx') term. 0 switches the "
            "objective off (it then gets no examples either)."
        },
    )
    sft_weight: float = field(
        default=2.0,
        metadata={
            "help": "Static multiplier c_sft of the SFT term. 0 switches the objective off. The default 2 (with "
            "`pretrain_weight` and `distillation_weight` 1, `rl_weight` 2) is the mixture the weighting benchmark's "
            "search chose (docs/weighting_benchmark.md); the weights are normalised, so only their ratios count."
        },
    )
    rl_weight: float = field(
        default=2.0,
        metadata={
            "help": "Static multiplier c_rl of the RL term. 0 switches the objective off. The default 2: see "
            "`sft_weight`."
        },
    )
    sft_loss_type: Literal["nll", "trust_region"] = field(
        default="nll",
        metadata={
            "help": "SFT loss. 'nll': mean negative log-likelihood of completion tokens. 'trust_region': the "
            "trust-region SFT loss of Trust-Region Adaptive Policy Optimization (huggingface.co/papers/2512.17636), "
            "which weights each token's log-likelihood gradient by min(1, p/alpha)."
        },
    )
    trust_region_alpha: float = field(
        default=0.1,
        metadata={"help": "alpha of the trust-region SFT loss (huggingface.co/papers/2512.17636); 0.1 in the paper."},
    )

    # ------------------------------------------------------------------------------------------------------------
    # The weighting strategy (default: static) and DARE, the dynamic weighting engine
    # ------------------------------------------------------------------------------------------------------------
    dare_mode: Literal["dynamic", "static"] = field(
        default="static",
        metadata={
            "help": "'static' (the default): all factors stay 1, the weights are the curriculum mixture times the "
            "static multipliers. 'dynamic': DARE multiplies them by factors measured from training signals (the "
            "default of earlier versions; the same as `weighting='dare'`). `weighting`, when set, wins."
        },
    )
    weighting: Literal["dare", "static", "uncertainty", "gradnorm", "gac"] | None = field(
        default=None,
        metadata={
            "help": "The weighting strategy (docs/how_it_works.md): 'dare' (split-half gradient agreement), 'static' "
            "(all factors 1), 'uncertainty' (Kendall et al. 2018's learnt log-variances), 'gradnorm' (Chen et al. "
            "2018, alpha 1.5), 'gac' (a GAC-style closed-form SFT/RL weight from gradient noise and disagreement; "
            "other objectives static). None (the default): follow `dare_mode` ('static', its default, -> 'static'; "
            "'dynamic' -> 'dare'). When set, it wins over `dare_mode`."
        },
    )
    dare_momentum: float = field(
        default=0.9,
        metadata={"help": "Momentum of the exponential smoothing of DARE's factors (0.9 in the source document)."},
    )
    dare_update_interval: int | None = field(
        default=None,
        metadata={
            "help": "Optimizer steps between two DARE updates. None: ceil(sqrt(N)) with N the planned number of "
            "optimizer steps (our reading of the source's 'every sqrt(n) batches')."
        },
    )
    dare_min_factor: float = field(
        default=0.25, metadata={"help": "Lower bound of a DARE factor (before renormalisation with the mixture)."}
    )
    dare_max_factor: float = field(
        default=4.0, metadata={"help": "Upper bound of a DARE factor (before renormalisation with the mixture)."}
    )
    dare_probe_vocab: int = field(
        default=4096,
        metadata={
            "help": "DARE measures each objective's gradient with respect to the output projection in closed form "
            "(no extra forward or backward). For vocabularies larger than this, a fixed random subset of this many "
            "vocabulary rows is probed."
        },
    )
    dare_probe_dim: int = field(
        default=256,
        metadata={
            "help": "Hidden states are randomly projected to this many dimensions before forming the probe "
            "gradient (a Johnson-Lindenstrauss sketch that keeps cosines), so the cross-rank reduction stays small."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Curriculum
    # ------------------------------------------------------------------------------------------------------------
    curriculum_mode: Literal["phased", "constant"] = field(
        default="phased",
        metadata={
            "help": "'phased': the source document's schedule of task mixtures. 'constant': the time-average of "
            "that schedule at every step (same total examples per objective, no curriculum; for ablations)."
        },
    )
    curriculum_boundaries: list[float] = field(
        default_factory=lambda: [0.2, 0.8],
        metadata={
            "help": "Phase boundaries as fractions of the planned optimizer steps (default: 20%% / 60%% / 20%%); "
            "one phase more than boundaries, each with its mixture in `curriculum_mixtures`. [] (on the command line "
            "`--curriculum_boundaries '[]'`): one phase, one constant mixture."
        },
    )
    curriculum_mixtures: list[float] = field(
        default_factory=lambda: [0.7, 0.2, 0.1, 0.3, 0.5, 0.2, 0.1, 0.3, 0.6],
        metadata={
            "help": "Target (pretrain, sft, rl) mixture of each phase, flattened: 3 numbers per phase, each triple "
            "summing to 1 (a list of triples, one per phase, is flattened to this form). Default 70/20/10 -> 30/50/20 -> 10/30/60 (the source document). It may instead be one "
            "mapping objective name -> share per phase, which is how the teacher's `distill` objective and objectives "
            "added with `TRAPOTrainer(objectives=...)` get a share: in Python `TRAPOConfig(curriculum_mixtures=[{...}, "
            "...])`, in a recipe a YAML list of mappings, on the command line a JSON list "
            """`--curriculum_mixtures '[{"pretrain": 0.5, "sft": 0.3, "rl": 0.1, "distill": 0.1}, ...]'`."""
        },
    )
    curriculum_decay_steps: float = field(
        default=0.05,
        metadata={
            "help": "Time constant tau of the exponential transition between phases: after a boundary at step b, the "
            "mixture is prev + (target - prev) * (1 - exp(-(step - b) / tau)). A value < 1 is a fraction of the "
            "planned optimizer steps."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Per-objective lengths
    # ------------------------------------------------------------------------------------------------------------
    pretrain_max_length: int = field(
        default=512, metadata={"help": "Tokens per pretraining row (documents are packed or chunked to this length)."}
    )
    pretrain_packing: bool = field(
        default=True,
        metadata={
            "help": "True: documents are concatenated with EOS between them and cut into rows of "
            "`pretrain_max_length` tokens. False: each document is chunked on its own (the last chunk is shorter)."
        },
    )
    sft_max_length: int = field(
        default=1024,
        metadata={"help": "Maximum tokens of an SFT row (prompt + completion + EOS); longer rows are truncated."},
    )
    assistant_only_loss: bool = field(
        default=False,
        metadata={  # no percent sign in help texts: argparse formats them (`--help` fails on a lone one)
            "help": "TRL SFTConfig's option, for conversational rows of `sft_dataset` (e.g. agent traces with tool "
            "calls): each conversation is rendered whole with the chat template (`tools=` from a `tools` column). "
            "True trains every assistant turn, its tool calls and end-of-turn token included, and no system, user or "
            "tool token (transformers' assistant mask: the template needs `generation` ... `endgeneration` markers; "
            "for prompt-completion rows, the assistant turns of the completion). False, as TRL's SFTTrainer: every "
            "token of a `messages` row is trained, the completion of a prompt-completion row. Prompt-completion "
            "text rows are refused with True (their loss is already on the completion only)."
        },
    )
    shuffle_dataset: bool = field(
        default=True,
        metadata={
            "help": "Serve the RL prompts in a fresh seeded order each epoch (True) or in dataset order (False, for "
            "an ordered curriculum of prompts; `train_sampling_strategy='sequential'` means the same). TRL GRPO's "
            "spelling."
        },
    )
    max_prompt_length: int = field(
        default=512,
        metadata={
            "help": "Maximum tokens of an RL prompt. A longer prompt is an error raised before training (never a "
            "silent truncation)."
        },
    )
    max_image_pixels: int | None = field(
        default=None,
        metadata={
            "help": "Vision-language runs: the largest image accepted, in pixels (width x height). A larger image is "
            "refused when the trainer is built, naming its row (resize it, or raise the limit), not met as an "
            "out-of-memory error mid-run. None: no limit (the processor resizes as it is configured to)."
        },
    )
    freeze_vision_tower: bool = field(
        default=False,
        metadata={
            "help": "Vision-language runs: freeze the vision encoder (the `vision_tower` / `visual` module, and the "
            "multimodal projector with it), so the three objectives train the language model only."
        },
    )
    response_length: int = field(
        default=128,
        metadata={
            "help": "Maximum number of generated tokens per completion (PPO's name; GRPO's is `max_completion_length`, "
            "also accepted). With `tools` / `environment_factory` it covers every assistant turn and every tool result "
            "of a rollout."
        },
    )
    max_completion_length: int | None = field(
        default=None,
        metadata={
            "help": "TRL GRPOConfig's name of `response_length`, accepted so that a GRPO script runs with only the "
            "import and the config class changed. When given, it sets `response_length` at construction (both then "
            "hold the value); giving both with different values is an error. A `response_length` equal to its default "
            "counts as not given. None: use `response_length`. After construction it reads `response_length`, as "
            "a TRL `rollout_func` reading `trainer.args.max_completion_length` expects."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # RL: generation
    # ------------------------------------------------------------------------------------------------------------
    num_generations: int = field(
        default=8,
        metadata={
            "help": "Completions generated per prompt. Without a value model the advantage is group-relative over "
            "these completions (GRPO, huggingface.co/papers/2402.03300), which needs at least 2."
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of rollouts."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold of rollouts."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling of rollouts; 0 disables it."})
    stop_token: Literal["eos"] | None = field(
        default="eos",
        metadata={"help": "'eos': completions stop at the tokenizer's EOS. Overridden by `stop_token_id`."},
    )
    stop_token_id: int | None = field(
        default=None, metadata={"help": "Token id that ends a completion; takes precedence over `stop_token`."}
    )
    missing_eos_penalty: float | None = field(
        default=None,
        metadata={
            "help": "Subtracted from the score of a completion that did not produce the stop token within "
            "`response_length` tokens."
        },
    )
    local_rollout_forward_batch_size: int = field(
        default=64,
        metadata={"help": "Rows per no-grad forward pass at rollout time (reference, value and reward models)."},
    )
    max_tool_calling_iterations: int | None = field(
        default=4,
        metadata={
            "help": "With `tools` or `environment_factory`: rounds of tool calls a rollout may make (each followed by "
            "one more generated assistant turn); calls in the turn after the last round are not run. 0 (as in TRL): "
            "the tools are shown in the prompt but none is run, each rollout is one assistant turn. TRL's name; TRL "
            "leaves it unbounded (None, also accepted here). TRAPO bounds it by default: every round is one more "
            "batched `generate` for the whole round, waiting for its slowest rollout, so a policy that keeps calling "
            "tools would stall RL steps (the `response_length` budget alone allows one round per few tokens)."
        },
    )
    tool_timeout: float | None = field(
        default=None,
        metadata={
            "help": "With `tools` or `environment_factory`: seconds one tool call may run. A call still running then "
            "is abandoned and fails: the model reads a timeout error result, the call counts in "
            "`tools/failure_frequency`, and the first failure of each tool is warned about, naming the timeout. An "
            "async tool is cancelled; a sync tool's thread cannot be stopped and is left to finish on its own (its "
            "result is ignored; it does not hold up the process's exit). None (the default, TRL's behaviour): no "
            "limit. Either way calls running longer than 60 s are warned about (once per tool and round of calls), "
            "and after SIGINT / SIGTERM the calls still running are abandoned the same way, so that the graceful stop "
            "(finish the step, save a checkpoint) never waits on a hung tool."
        },
    )
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata={
            "help": "Under DeepSpeed ZeRO-3, gather the policy's weights once for generation (fast, needs memory for "
            "the full model) instead of gathering layer by layer."
        },
    )
    generation_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Extra settings of rollout generation, limited to those that leave the recorded log-probs exact: "
            "`eos_token_id` (an id or a list of ids that stop a completion, besides `stop_token` / `stop_token_id`), "
            "truncation samplers (`min_p`, `typical_p`, `epsilon_cutoff`, `eta_cutoff`, like `top_k` / `top_p` "
            "they only decide which token is drawn), and cache settings (`use_cache`, `cache_implementation`, "
            "`cache_config`). Settings that change the logits (e.g. `repetition_penalty`, `no_repeat_ngram_size`) "
            "are refused: the trained log-probs would not describe the sampled distribution."
        },
    )
    chat_template_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Extra keyword arguments of `apply_chat_template` for conversational data."}
    )

    # ------------------------------------------------------------------------------------------------------------
    # RL: rewards, advantages and the policy loss
    # ------------------------------------------------------------------------------------------------------------
    reward_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "Weight of each reward function / reward model (in the order given). None: all 1. All 0 is "
            "warned about (every completion would score 0: RL has no signal)."
        },
    )
    scale_rewards: Literal["group", "batch", "none"] = field(
        default="group",
        metadata={
            "help": "Critic-free mode: divide group-centred rewards by the group std ('group', GRPO), the std of the "
            "whole generation round, every process's share of it, as TRL's GRPO gathers it ('batch'), or nothing "
            "('none', Dr. GRPO huggingface.co/papers/2503.20783). In Python, TRL's True / False mean 'group' / "
            "'none' and are read as those at construction, as TRL's GRPOConfig reads them."
        },
    )
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = field(
        default="dapo",
        metadata={
            "help": "Aggregation of the per-token RL loss. 'dapo': sum over tokens / RL tokens in the global "
            "accumulated batch. 'grpo': per-sequence token mean, averaged over sequences. 'dr_grpo': sum / "
            "(sequences * response_length). 'bnpo': token mean within each micro-batch, averaged over micro-batches "
            "(what TRL 1.12's PPOTrainer did)."
        },
    )
    cliprange: float = field(
        default=0.2,
        metadata={"help": "PPO clip range epsilon of the ratio (huggingface.co/papers/1707.06347, eq. 7)."},
    )
    epsilon: float | None = field(
        default=None,
        metadata={
            "help": "TRL GRPOConfig's name of `cliprange` (the ratio is clipped to [1 - epsilon, 1 + epsilon]); when "
            "given it sets `cliprange` at construction, and giving both with different values is an error (a "
            "`cliprange` equal to its default counts as not given). None: use `cliprange`; after construction it "
            "reads `cliprange`. Both default to 0.2. GRPO's `epsilon_high` (an asymmetric upper bound) has no TRAPO "
            "equivalent: the clip is symmetric."
        },
    )
    kl_coef: float = field(default=0.05, metadata={"help": "KL coefficient of the penalty towards the reference."})
    beta: float | None = field(
        default=None,
        metadata={
            "help": "TRL GRPOConfig's name of `kl_coef`, accepted so that a GRPO script runs with only the import and "
            "the config class changed; when given it sets `kl_coef` at construction (both then hold the value), and "
            "giving both with different values is an error (a `kl_coef` equal to its default counts as not given). "
            "None: use `kl_coef`; after construction it reads `kl_coef`. Note the defaults differ: GRPO's beta is "
            "0.0 (no KL), TRAPO's kl_coef 0.05, so a GRPO script that never set beta trains with a KL term here: "
            "pass beta=0.0 for GRPO's default."
        },
    )
    kl_estimator: Literal["auto", "k1", "k2", "k3"] = field(
        default="auto",
        metadata={
            "help": "Per-token KL estimator (Schulman, 'Approximating KL divergence', joschu.net/blog/kl-approx.html), "
            "with log r = log pi_ref - log pi: k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r. 'auto': the "
            "one whose gradient is the gradient of KL(pi || pi_ref) where the KL is placed (on-policy): k2 in the "
            "loss, k1 in the reward. The other combinations are biased (k3 in the loss follows the reverse KL, k1 "
            "in the loss has a zero expected gradient, k2 / k3 in the reward miss the gradient through their own "
            "dependence on pi) and are warned about; see the KL table of docs/sampling.md."
        },
    )
    kl_penalty: Literal["auto", "reward", "loss"] = field(
        default="auto",
        metadata={
            "help": "'reward': -kl_coef * KL is added to the rewards, as in PPO (per token). 'loss': kl_coef * KL is a "
            "differentiable term of the loss, as in GRPO. 'auto': 'reward' with a value model, 'loss' without — "
            "with group-relative advantages a KL in the reward is divided by the group's reward std, which turns "
            "KL noise into full-size advantages in groups whose scores are all equal."
        },
    )
    sync_ref_model: bool = field(
        default=False,
        metadata={
            "help": "Move the reference towards the policy every `ref_model_sync_steps` optimizer steps, "
            "ref <- alpha * policy + (1 - alpha) * ref (TR-DPO, huggingface.co/papers/2404.09656). Useful when the "
            "policy starts far from where it should stay close to, e.g. from random weights in joint training."
        },
    )
    ref_model_mixup_alpha: float = field(
        default=0.6, metadata={"help": "alpha of the reference update (1.0 copies the policy)."}
    )
    ref_model_sync_steps: int = field(default=512, metadata={"help": "Optimizer steps between two reference updates."})
    entropy_coef: float = field(
        default=0.0, metadata={"help": "Coefficient of the entropy bonus (in nats) subtracted from the RL loss."}
    )
    whiten_rewards: bool = field(
        default=False,
        metadata={"help": "Whiten per-token rewards before GAE over the whole generation round (PPO)."},
    )
    whiten_advantages: bool = field(
        default=True,
        metadata={"help": "With a critic: whiten advantages over the whole generation round, every process's share."},
    )
    whiten_per_process: bool = field(
        default=False,
        metadata={
            "help": "Whiten rewards / advantages over each process's share of a round instead of the whole round "
            "(TRL 1.12 PPO's behaviour, which `PPOConfig` keeps; one process: no difference)."
        },
    )
    gamma: float = field(default=1.0, metadata={"help": "Discount factor of GAE (huggingface.co/papers/1506.02438)."})
    lam: float = field(default=0.95, metadata={"help": "Lambda of GAE (huggingface.co/papers/1506.02438)."})
    vf_coef: float = field(default=0.1, metadata={"help": "Coefficient of the value loss (with a critic)."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clip range of the value function."})
    mask_truncated_completions: bool = field(
        default=False,
        metadata={"help": "Exclude completions that never produced the stop token from the RL loss (DAPO)."},
    )

    # ------------------------------------------------------------------------------------------------------------
    # Replay (the rollout buffer)
    # ------------------------------------------------------------------------------------------------------------
    num_ppo_epochs: int = field(
        default=4,
        metadata={"help": "Each trajectory in the replay buffer is used for at most this many updates."},
    )
    num_iterations: int | None = field(
        default=None,
        metadata={
            "help": "TRL GRPOConfig's name of `num_ppo_epochs` (GRPO's mu: updates per generated batch); when given it "
            "sets `num_ppo_epochs` at construction, and giving both with different values is an error (a "
            "`num_ppo_epochs` equal to its default counts as not given). None: use `num_ppo_epochs`; after "
            "construction it reads `num_ppo_epochs`. Note the defaults differ: GRPO's is 1, TRAPO's 4; pass "
            "num_iterations=1 for GRPO's."
        },
    )
    grpo_names_given: list[str] | None = field(
        default=None,
        metadata={
            "help": "Filled in at construction, not a setting: which of TRL GRPOConfig's names of TRAPO fields "
            "(max_completion_length, beta, epsilon, num_iterations) were given. After construction those names read "
            "the value in effect, so a copy of the config (`dataclasses.replace`, a `to_dict()` rebuild) could not "
            "tell them from the user's otherwise; the start-up notice of a GRPO-style run names them. None: the GRPO "
            "names that are not None were given."
        },
    )
    grpo_values_built: dict[str, float] | str | None = field(
        default=None,
        metadata={
            "help": "Filled in at construction, not a setting: the value in effect of each setting that has a TRL "
            "GRPOConfig name (response_length, kl_coef, cliprange, num_ppo_epochs) when the config was built. A copy "
            "(`dataclasses.replace`, a `to_dict()` rebuild) carries both names of each setting; the one it changed "
            "differs from this value and sets the setting, so `replace(args, max_completion_length=32)` and "
            "`replace(args, response_length=32)` both work; both names changed to different values is an error. "
            "None: the config is not a copy."
        },
    )
    num_mini_batches: int = field(
        default=1,
        metadata={
            "help": "A generation round produces enough trajectories for this many optimizer steps (PPO: mini-batches "
            "per rollout batch)."
        },
    )
    replay_capacity: int = field(
        default=50_000, metadata={"help": "Short-term replay capacity in trajectories (FIFO, oldest evicted first)."}
    )
    replay_max_bytes: int | None = field(
        default=None,
        metadata={
            "help": "Short-term replay capacity in bytes of host memory, at least 28 (the smallest trajectory: about 8 "
            "bytes per prompt token and 20 per completion token). None: no byte limit."
        },
    )
    replay_compress: bool = field(
        default=False,
        metadata={"help": "Always keep replay trajectories zstd-compressed in host memory (lossless)."},
    )
    replay_compress_threshold: float = field(
        default=0.85,
        metadata={
            "help": "With `replay_max_bytes`, trajectories added once the buffer holds more than this fraction of "
            "its byte budget are kept compressed (the source document's 85%% trigger)."
        },
    )
    importance_sampling_cap: float | None = field(
        default=None,
        metadata={
            "help": "Replace PPO's clipping by a truncated importance weight min(cap, pi/pi_old) (detached), for "
            "heavily reused or stale replay (truncated IS, as in IMPALA huggingface.co/papers/1802.01561). None keeps "
            "the clipped surrogate. It bounds the trained policy's drift from the behaviour policy (pi_theta / "
            "pi_old, which grows with reuse and staleness); not to be confused with "
            "`vllm_importance_sampling_clip_max` (TRL's older `vllm_importance_sampling_cap`), which bounds the "
            "sampler/trainer mismatch pi_old / pi_sampler of rounds sampled by another engine. The two weights "
            "multiply."
        },
    )
    demonstration_column: str | None = field(
        default=None,
        metadata={
            "help": "Column of the RL dataset holding a reference solution of each prompt (text, or an assistant "
            "message list), e.g. GSM8K's `answer`. With it, groups whose completions all score the same get the "
            "demonstration as an off-policy sample (`guidance`). None: no guidance. Rows with an empty value, or a "
            "demonstration longer than `response_length`, get none."
        },
    )
    guidance: Literal["zero_variance", "always"] = field(
        default="zero_variance",
        metadata={
            "help": "Which groups get the demonstration (it replaces the group's last completion): 'zero_variance' "
            "only groups whose on-policy completions all score the same (they carry no RL gradient otherwise); "
            "'always' every group that has one (LUFFY, arXiv 2504.14945)."
        },
    )
    guidance_gamma: float = field(
        default=0.1,
        metadata={
            "help": "Policy shaping of demonstration tokens: their loss is -A * p / (p + gamma), p = pi_theta(token) "
            "(LUFFY, arXiv 2504.14945, eq. 6-7), which keeps the gradient of improbable expert tokens from vanishing."
        },
    )
    exploration: bool | None = field(
        default=None,
        metadata={
            "help": "Targeted exploration: a task family (the RL dataset's `task` column; the whole dataset without "
            "one) whose groups mostly score flat at the lowest score seen (all wrong) in a round is sampled "
            "`exploration_temperature_step` hotter in the next, up to `exploration_max_temperature`, and cools down "
            "again once its groups carry a signal (trl_trapo/exploration.py); a round stays one batched `generate` "
            "call, each row at its family's temperature (with vLLM, one call per distinct temperature; in the "
            "tool-calling loop, every turn of a rollout at its family's). With a value model (one completion per "
            "prompt) a family is stuck when all its completions of a round score the lowest score seen; in few-shot "
            "mode a family's boost scales the round's annealed temperature. None (default): on with groups (no value "
            "model), HF generate (not vLLM), the default rollout source and no few-shot mode, off elsewhere. True: on "
            "(vLLM and tools / environment_factory included), and an error where it cannot run. "
            "False: off."
        },
    )
    exploration_temperature_step: float = field(
        default=0.1, metadata={"help": "How much one generation round moves a family's sampling temperature."}
    )
    exploration_max_temperature: float | None = field(
        default=None,
        metadata={"help": "The highest sampling temperature exploration uses. None: 1.5 x `temperature`."},
    )
    exploration_max_search: int = field(
        default=8,
        metadata={
            "help": "Search once heat has run out: a family still stuck in a round sampled at "
            "`exploration_max_temperature` has each of its groups sampled again in the next rounds, 1, 2, 4, ... "
            "times (doubling per consecutive such round) up to this many times, and the successes among those extra "
            "completions go to self-imitation only (trl_trapo/exploration.py). Needs exploration and self-imitation; "
            "0: no search."
        },
    )
    self_imitation: bool | None = field(
        default=None,
        metadata={
            "help": "Self-imitation: an RL completion that scores at least `self_imitation_min_reward`, stopped on its "
            "own and comes from a group where another completion failed is kept, and a share "
            "`self_imitation_fraction` of each step's SFT rows is served from those successes, each at most "
            "`self_imitation_max_uses` times (trl_trapo/memory/successes.py; Oh et al. 2018, arXiv 1806.05635). "
            "None (default): on when the run has RL prompts and SFT data and no few-shot mode, off elsewhere. "
            "True: on, and an error without SFT data. False: off."
        },
    )
    self_imitation_min_reward: float = field(
        default=1.0,
        metadata={
            "help": "The score (weighted reward, as in `objective/scores`) a completion needs to count as a success."
        },
    )
    self_imitation_fraction: float = field(
        default=0.25, metadata={"help": "Share of a step's SFT rows served from the successes while there are any."}
    )
    self_imitation_max_uses: int = field(
        default=4, metadata={"help": "Servings of one success before it leaves the buffer."}
    )
    self_imitation_capacity: int = field(default=1024, metadata={"help": "Successes kept (first in, first out)."})
    replay_max_age: int | None = field(
        default=None,
        metadata={
            "help": "Trajectories sampled by a policy version more than this many optimizer steps behind the current "
            "step are not served any more (a rollout source's rounds carry their version). None: no limit."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Memory pool: long-term SFT pool, adapter bank, few-shot mode (trl_trapo/memory/, trl_trapo/experimental/fewshot.py)
    # ------------------------------------------------------------------------------------------------------------
    sft_sampling: Literal["uniform", "prioritized"] = field(
        default="uniform",
        metadata={
            "help": "How SFT rows are drawn. 'uniform': seeded epochs over the dataset (every row once per epoch). "
            "'prioritized': prioritised experience replay (huggingface.co/papers/1511.05952) from a memory-mapped "
            "copy of the tokenised SFT data under output_dir/sft_pool, P(i) ~ p_i^alpha with p_i the mean over "
            "completion tokens of 1 - p(y_t) (a gradient-norm proxy from the training forward) and importance weights "
            "multiplying the SFT loss. 'uniform' is the default: it keeps every demonstration equally weighted and "
            "needs no disk copy, and prioritising high-loss rows also oversamples noisy or unlearnable ones."
        },
    )
    sft_priority_alpha: float = field(
        default=0.6,
        metadata={"help": "Priority exponent alpha of the prioritised SFT pool (0: uniform; paper: 0.6)."},
    )
    sft_priority_beta: float = field(
        default=0.4,
        metadata={
            "help": "Importance-sampling exponent beta of the prioritised SFT pool at step 0, annealed linearly to 1 "
            "at the last planned step (huggingface.co/papers/1511.05952: 0.4 -> 1)."
        },
    )
    sft_pool_max_bytes: int | None = field(
        default=None,
        metadata={
            "help": "Disk budget of the prioritised SFT pool (all ranks together). None: 5%% of the free space of "
            "output_dir's filesystem at start (the source document's figure). Rows beyond it are dropped (a seeded "
            "random subset is kept, with a warning)."
        },
    )
    adapter_snapshot_steps: int = field(
        default=1000,
        metadata={
            "help": "PEFT policies: snapshot the adapter every this many optimizer steps into "
            "output_dir/adapter_bank/step-N (0 disables the bank)."
        },
    )
    max_adapter_snapshots: int = field(
        default=10, metadata={"help": "Adapter snapshots kept (the oldest is deleted first)."}
    )
    adapter_rollback_reward_drop: float | None = field(
        default=None,
        metadata={
            "help": "Automatic rollback: at a snapshot step, if the mean reward since the previous snapshot is below "
            "best - this * |best| (best: the best kept snapshot's mean reward), the adapter is restored from that "
            "snapshot (Adam moments of the adapter reset, replay emptied). None: off."
        },
    )
    adapter_rollback_kl_max: float | None = field(
        default=None,
        metadata={
            "help": "Automatic rollback when the mean per-sequence KL to the reference (nats) since the previous "
            "snapshot exceeds this bound (to the best snapshot within the bound). None: off."
        },
    )
    fewshot_mode: bool = field(
        default=False,
        metadata={
            "help": "Few-shot mode (trl_trapo/experimental/fewshot.py): replay trajectories reused up to `fewshot_max_uses` "
            "times, rollout temperature annealed with sigma (`fewshot_sigma`), and RL prompts and SFT rows drawn "
            "preferring prototypes (tasks or clusters of prompt embeddings) with low recent reward or few samples. "
            "An experimental extension: train with trl_trapo.experimental.fewshot.FewShotTRAPOTrainer (TRAPOTrainer "
            "refuses it; the command line picks that trainer)."
        },
    )
    fewshot_max_uses: int = field(
        default=5,
        metadata={"help": "Few-shot mode: uses per replay trajectory (the larger of this and num_ppo_epochs)."},
    )
    fewshot_sigma: list[float] = field(
        default_factory=lambda: [0.3, 0.1],
        metadata={
            "help": "Few-shot mode: [start, end] of the exploration noise sigma, linear over the planned steps; the "
            "rollout temperature is temperature * sigma(t) / start (the source document: 0.3 -> 0.1)."
        },
    )
    fewshot_task_column: str | None = field(
        default="task",
        metadata={
            "help": "Few-shot mode: RL dataset column naming each prompt's task (one prototype per task). Without it "
            "(or None), prototypes are clusters of prompt embeddings."
        },
    )
    fewshot_num_prototypes: int = field(
        default=8, metadata={"help": "Few-shot mode without a task column: number of prompt clusters."}
    )
    fewshot_candidates: int = field(
        default=4,
        metadata={
            "help": "Few-shot mode: candidates drawn per RL prompt / SFT row kept (the preference acts on them)."
        },
    )
    fewshot_strength: float = field(
        default=2.0,
        metadata={
            "help": "Few-shot mode: candidates are kept with probability ~ exp(strength * need), need in [0, 1] "
            "(so at most e^strength times more likely). 0: no preference."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Robustness
    # ------------------------------------------------------------------------------------------------------------
    max_nonfinite_steps: int = field(
        default=10,
        metadata={
            "help": "A step whose loss is not finite is skipped and counted (`train/nonfinite_steps`); training "
            "stops with an error after this many."
        },
    )
    total_episodes: int | None = field(
        default=None,
        metadata={
            "help": "Total RL prompts to roll out (PPO's name). Used to plan the number of optimizer steps when "
            "`max_steps` is not set."
        },
    )
    num_sample_generations: int = field(
        default=0,
        metadata={"help": "How many times during training to log a table of sample completions (0: never)."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Train into an `output_dir` that holds a finished run (a saved model or `eval_results.json`) or "
            "an unfinished run's `checkpoint-N` folders, replacing its files. Without it a finished run is refused at "
            "construction and checkpoints by `train()` unless it resumes from one of them, so a re-run never "
            "silently replaces the last result or what a resume needs (the flag transformers 5 removed from "
            "`TrainingArguments`)."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Hyper-parameter schedules (the source document's recipe; see trl_trapo/schedules.py)
    # ------------------------------------------------------------------------------------------------------------
    rl_phase_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate from the curriculum's last (RL-heavy) phase on: the scheduler's peak learning rate "
            "becomes this value at the phase boundary (warm-up / decay shape unchanged). The source document drops "
            "5e-5 to 3e-5. None: keep `learning_rate` throughout."
        },
    )
    late_entropy_coef: float | None = field(
        default=None,
        metadata={
            "help": "`entropy_coef` from the curriculum's last phase on (the source document: 0.01 -> 0.005). None: "
            "keep `entropy_coef` throughout."
        },
    )
    kl_target: float | None = field(
        default=None,
        metadata={
            "help": "Adaptive KL control (Ziegler et al., huggingface.co/papers/1909.08593, section 2.2): the target "
            "per-sequence KL to the reference (nats, `objective/kl`). After each optimizer step with new rollouts, "
            "kl_coef <- kl_coef * (1 + clip((KL - target) / target, -0.2, 0.2) * n / kl_horizon), n = rollouts "
            "since the last update (all ranks). Starts from `kl_coef`. None: `kl_coef` stays fixed."
        },
    )
    kl_horizon: float = field(
        default=10_000,
        metadata={"help": "Horizon of the adaptive KL controller, in rollouts (10000 in TRL's former PPOTrainer)."},
    )
    kl_coef_range: list[float] | None = field(
        default=None,
        metadata={
            "help": "[min, max] the adaptive KL coefficient is clipped to (the source document: [0.1, 0.3]). Only "
            "with `kl_target`. None: unbounded."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Distributed training
    # ------------------------------------------------------------------------------------------------------------
    ddp_comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = field(
        default="none",
        metadata={
            "help": "DDP gradient-communication hook (PyTorch's, registered through accelerate): 'fp16' / 'bf16' "
            "all-reduce the gradient buckets in half precision (half the bytes; 'bf16' needs NCCL >= 2.10 or XPU); "
            "'powersgd' sends a rank-`powersgd_rank` PowerSGD approximation with error feedback "
            "(huggingface.co/papers/1905.13727). DDP only (not DeepSpeed / FSDP, which communicate differently). "
            "'none': plain fp32 all-reduce."
        },
    )
    powersgd_rank: int = field(
        default=1, metadata={"help": "Matrix approximation rank of PowerSGD (`ddp_comm_hook='powersgd'`)."}
    )
    powersgd_start_iter: int = field(
        default=1_000,
        metadata={
            "help": "PowerSGD runs plain all-reduce for this many backward passes before compressing (PyTorch's "
            "default warm-up; must be >= 2)."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # CPU threads (trl_trapo/threads.py)
    # ------------------------------------------------------------------------------------------------------------
    torch_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch's CPU threads in each process of the run. None (default): unless OMP_NUM_THREADS / "
            "MKL_NUM_THREADS is set or torch.set_num_threads was called (then they are left alone), the trainer sets "
            "usable cores // processes this run starts on the node (trainer processes, plus a producer each with "
            "async_rollouts), one less when that fills every core and OpenMP spins while it waits (no "
            "OMP_WAIT_POLICY=PASSIVE), and logs it once. 0: torch's threads are left as they are. N >= 1: N threads "
            "in every process (the producer too unless async_producer_threads is set). docs/threads.md has the "
            "measurements."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Rollouts with vLLM (GPU only; untested on this project's CPU CI)
    # ------------------------------------------------------------------------------------------------------------
    use_vllm: bool = field(
        default=False,
        metadata={
            "help": "Generate rollouts with vLLM through TRL's `VLLMGeneration` (weights, LoRA merged, are pushed to "
            "vLLM after every optimizer step that is followed by a generation round). Behaviour log-probs are then "
            "recomputed by the training model, so PPO's first-use ratio stays exactly 1, and vLLM's own log-probs "
            "weight the policy loss by the sampler/trainer mismatch (`vllm_importance_sampling_correction`). Needs "
            "`pip install vllm` and a GPU; the model must be a local directory or Hub id (vLLM loads it itself). "
            "With async_rollouts=True (server mode only): the producer process sends each round's prompts to the "
            "server, the trainer pushes the weights every weight_sync_steps steps (docs/async.md)."
        },
    )
    vllm_mode: Literal["colocate", "server"] = field(
        default="colocate",
        metadata={
            "help": "'colocate': one vLLM engine inside every training process, sharing its GPU. 'server': a "
            "separate `trl vllm-serve` server at `vllm_server_base_url`."
        },
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3,
        metadata={"help": "Colocate mode: fraction of each GPU's memory vLLM may take (weights + KV cache)."},
    )
    vllm_tensor_parallel_size: int = field(
        default=1, metadata={"help": "Colocate mode: GPUs per vLLM engine (must divide the number of processes)."}
    )
    vllm_max_model_length: int | None = field(
        default=None,
        metadata={"help": "vLLM context length. None: max_prompt_length + response_length."},
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={"help": "Colocate mode: offload vLLM's weights and KV cache during the optimizer step."},
    )
    vllm_server_base_url: str | None = field(
        default=None, metadata={"help": "Server mode: base URL of the vLLM server (default http://0.0.0.0:8000)."}
    )
    vllm_server_timeout: float = field(
        default=240.0,
        metadata={
            "help": "Server mode (TRL's name and default): seconds to wait for the vLLM server to answer, when the "
            "trainer connects and, with async_rollouts, when the producer connects and before each weight push."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Asynchronous rollouts: a producer process samples and scores rounds while the trainer trains (async_rollouts.py)
    # ------------------------------------------------------------------------------------------------------------
    async_rollouts: bool = field(
        default=False,
        metadata={
            "help": "Sample RL rounds in a separate producer process while the trainer trains: with transformers' "
            "generate and a copy of the policy (behaviour log-probs recorded there), or with use_vllm=True and "
            "vllm_mode='server' through the vLLM server (no copy of the policy: the producer sends the prompts, the "
            "trainer pushes the weights; vLLM's log-probs always go to the sampler/trainer mismatch correction). The "
            "producer calls the reward functions; the trainer takes finished rounds from a bounded queue and "
            "computes reference log-probs, values, advantages and every round statistic itself when it consumes "
            "them. Reward functions must be picklable (module-level). The prompt choice and targeted exploration's "
            "temperatures apply when a round is asked for, guidance when it is consumed; see docs/async.md. Under "
            "DeepSpeed ZeRO-3 the producer's weights are gathered on a schedule every rank reaches (the start of "
            "training and every weight_sync_steps steps). Not with vLLM's colocate mode (its engine belongs to the "
            "trainer's process group), fewshot_mode, or a rollout_source of your own."
        },
    )
    max_staleness: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name and unit: optimizer steps between the policy that sampled a round and the policy "
            "being trained when the round enters training. The producer is asked for a round early enough that it "
            "arrives at most this many steps late; one that arrives later is dropped (`sample/dropped_stale_total`) "
            "or down-weighted (`stale_rollouts`). Its trajectories are then reused for up to num_ppo_epochs steps, "
            "as in synchronous training (their age at each use is `replay/age_mean`; `replay_max_age` bounds that). "
            "None: 4 (TRL's default) with async_rollouts; it is unused without them. 0: strictly on-policy (no "
            "overlap)."
        },
    )
    stale_rollouts: Literal["drop", "downweight"] = field(
        default="drop",
        metadata={
            "help": "A round that arrives more than max_staleness steps late: 'drop' (TRL's behaviour; the next round "
            "is taken) or 'downweight': trained with its loss weighted by (max_staleness + 1) / (lag + 1)."
        },
    )
    weight_sync_steps: int = field(
        default=1,
        metadata={
            "help": "TRL's name: the producer receives the trained weights (only the trainable ones: a LoRA run sends "
            "only the adapter) at most every this many optimizer steps."
        },
    )
    async_correction: Literal["decoupled", "behaviour"] = field(
        default="decoupled",
        metadata={
            "help": "How a late round is corrected. 'decoupled' (AReaL's decoupled PPO, huggingface.co/papers/"
            "2505.24298 eq. 5): the trainer recomputes the log-probs with the policy it is training when the round "
            "arrives (the proximal policy: PPO's ratio and clip are taken against it) and weights the loss by the "
            "truncated importance ratio proximal / producer (`vllm_importance_sampling_*`, which must be on). "
            "'behaviour': the producer's log-probs are PPO's old log-probs (the clipped ratio against the sampling "
            "policy is the only correction, as TRL's AsyncGRPOTrainer); no extra forward per round. "
            "scripts/experiments/compare_async.py measures both."
        },
    )
    async_deterministic: bool = field(
        default=True,
        metadata={
            "help": "True: each round is sampled with the weights the trainer had sent when it asked for the round and "
            "an RNG seeded by (seed, rank, round), so a run does not depend on timing and a resumed run (even after "
            "kill -9) equals an uninterrupted one. False (free-running): the producer samples with the newest "
            "weights it has received when it starts a round: fresher samples, runs are not bit-reproducible."
        },
    )
    async_producer_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch threads of the producer process. None (default): as `torch_threads` decides, its share of "
            "the cores (on a 2-core CPU machine: 1 for the producer, 1 for the trainer), the trainer's own threads "
            "when the user set them, torch's default with torch_threads=0."
        },
    )

    # ------------------------------------------------------------------------------------------------------------
    # Sampler/trainer mismatch correction: TRL GRPOConfig's names, defaults and values (trl_trapo/sampler_correction.py)
    # ------------------------------------------------------------------------------------------------------------
    vllm_importance_sampling_correction: bool = field(
        default=True,
        metadata={
            "help": "When a round is sampled by another engine than the trainer's forward, weight each token's "
            "policy loss by the importance ratio pi_trainer / pi_sampler of the token, bounded per "
            "`vllm_importance_sampling_mode`, as TRL's GRPO does (TRL's name and default). It applies whenever the "
            "sampler's log-probs exist: vLLM with use_vllm=True, a `rollout_func` that returns `logprobs`, or a "
            "rollout source that returns `SampledRound.sampler_per_token_logps`. TRL applies it only with "
            "use_vllm=True; a `rollout_func` may sample with an engine of its own, so TRAPO corrects its rounds "
            "too. The trainer's own log-probs, computed when the round is finished, are "
            "PPO's behaviour log-probs in every case. It changes nothing where the trainer samples itself "
            "(transformers' generate, the default). False: the sampler's log-probs are ignored (no correction, as "
            "TRL without vLLM)."
        },
    )
    vllm_importance_sampling_mode: CorrectionMode = field(
        default="sequence_mask",
        metadata={
            "help": "How the ratios are formed and bounded, with TRL's values and meaning: 'token_truncate' / "
            "'token_mask': one ratio per token, clipped to [clip_min, clip_max] or set to 0 outside it; "
            "'sequence_truncate' / 'sequence_mask' (TRL's default): one ratio per completion, the product of its "
            "tokens' ratios, clipped or masked whole. TRAPO adds 'sequence_geo_truncate' / 'sequence_geo_mask': "
            "the geometric mean of the tokens' ratios (length-normalised, as GSPO huggingface.co/papers/2507.18071 "
            "eq. 7 and verl's 'geometric' level). On long completions the product drifts far from 1 even when every "
            "token's ratio is close to 1, and the bound then masks, clips or shrinks most of them (TRL issue #5814); "
            "scripts/benchmarks/benchmark_is_modes.py measures how many samples each mode keeps. With top_k / top_p "
            "the trainer's side is taken over the sampler's kept support (TRL issue #6789)."
        },
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0,
        metadata={
            "help": "C_max (TRL's name and default): '*_truncate' modes clip ratios above it, '*_mask' modes set them "
            "to 0. At least 1; None: no upper bound. It bounds the sampler mismatch pi_old / pi_sampler, fixed when "
            "a round is finished; `importance_sampling_cap` bounds the trained policy's drift pi_theta / pi_old. "
            "Two ratios, two knobs; their weights multiply."
        },
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None,
        metadata={
            "help": "C_min (TRL's name): '*_truncate' modes clip ratios below it, '*_mask' modes set them to 0. In "
            "[0, 1]; None (default): no lower bound. To mask only below C_min, set "
            "vllm_importance_sampling_clip_max=None."
        },
    )
    vllm_importance_sampling_cap: float | None = field(
        default=None,
        metadata={
            "help": "Deprecated (TRL's name before 1.6, deprecated there too): use "
            "vllm_importance_sampling_clip_max, which a value given here sets, with a FutureWarning. Not TRAPO's "
            "`importance_sampling_cap`."
        },
    )

    def _check_liger(self) -> None:
        """`use_liger_kernel=True` without liger-kernel, refused at construction and saying what the flag does here.

        transformers patches the model's layers with Liger's kernels when the trainer is built, and raises there
        without the package; a GRPO script sets the flag for TRL's fused Liger GRPO loss, which TRAPO's losses do not
        use.

        Raises:
            ImportError: when `use_liger_kernel` is set and `liger-kernel` (>= 0.3.0) is not installed.
        """
        from transformers.utils import is_liger_kernel_available

        if self.use_liger_kernel and not is_liger_kernel_available():
            raise ImportError(
                f"{type(self).__name__}.use_liger_kernel=True needs liger-kernel >= 0.3.0, which is not installed: "
                "`pip install liger-kernel`, or drop use_liger_kernel. Here it patches the model's layers with Liger's "
                "kernels (transformers' `_apply_liger_kernel_to_instance`, `liger_kernel_config`); TRL GRPOTrainer's "
                "fused Liger GRPO loss has no TRAPO equivalent (TRAPO computes its own losses)."
            )

    def __post_init__(self):
        built_by_user = self.grpo_names_given is None  # a copy of a built config (dataclasses.replace) records it
        check_masked_tokens(self)  # before the type checks: '<STOP_TOKEN>' is to_dict()'s, not the user's
        check_json_dicts(self)  # before transformers' parse of the text, whose error names no field
        if isinstance(self.scale_rewards, bool):  # TRL GRPOConfig's older spelling, read as TRL reads it
            self.scale_rewards = "group" if self.scale_rewards else "none"
        check_field_types(self)  # first: every check below compares or computes with the values
        paths_as_text(self)  # a `pathlib.Path` where a field takes a path: its text
        check_finite_numbers(self)  # before the range checks, which NaN passes
        self._check_intervals()  # before transformers' own reading of them
        check_world_environment()  # before anything reads WORLD_SIZE: a leftover one failed with a misleading fix
        self._check_deepspeed()
        self._cpu_distributed_defaults()
        self._check_precision()  # before transformers' own check, whose bf16 message names neither field nor fix
        self._check_torch_compile()  # accelerate's TorchDynamoPlugin refused it at the trainer, naming no field
        self._check_accelerator_config()  # transformers' and accelerate's refusals named no field
        self._check_liger()
        self._check_best_model_settings()  # before transformers' own checks, whose text names no metric TRAPO logs
        self._validate_bypassed_trainer_fields(self._refuse)  # before transformers' dataloader_prefetch_factor check
        if self.bf16 is None:
            self.bf16 = (not self.fp16) and (not self.use_cpu) and _bf16_supported()
        self._check_environment_precision()  # transformers hands the variable to accelerate when no field chooses
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True  # TRL's default; an explicit value of either name is kept
        given = self._grpo_names_given() if built_by_user else self._resolve_copied_names()
        for alias, target in GRPO_ALIASES.items():
            if alias not in given:
                continue
            if alias == "max_completion_length":
                self._resolve_max_completion_length()
            else:
                self._resolve_alias(alias, target)
        for alias, target in GRPO_ALIASES.items():  # each GRPO name reads the value in effect, as in TRL's config
            setattr(self, alias, getattr(self, target))
        self.grpo_names_given = given
        self.grpo_values_built = {target: getattr(self, target) for target in GRPO_ALIASES.values()}  # for copies
        if self.vllm_importance_sampling_cap is not None:  # TRL's own deprecated alias, with TRL's meaning
            warnings.warn(
                f"{type(self).__name__}.vllm_importance_sampling_cap is deprecated (as in TRL since 1.6): use "
                f"vllm_importance_sampling_clip_max={self.vllm_importance_sampling_cap!r} instead, which it sets "
                "here. (TRAPO's `importance_sampling_cap` is another knob: it bounds pi_theta / pi_old.)",
                FutureWarning,
                stacklevel=3,
            )
            self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
        fsdp_given = self.fsdp  # transformers' `__post_init__` turns it into True
        self._check_ddp_backend_launch()  # before transformers' device setup, which fails on it with torch's text
        try:
            with rendezvous_notice():  # transformers joins the process group here (its `device`): a hang says why
                super().__post_init__()
        except ValueError as error:  # what no check above foresaw: one message naming this class, not a traceback
            raise ValueError(self._refused_by_transformers(str(error))) from None
        self._check_fsdp_launch(fsdp_given)
        self._validate()
        if built_by_user:  # once: not again for each copy the job and the trainer make
            self._warn_unused_settings()
            self._warn_environment_precision()

    def check_values(self) -> None:
        """Run the value checks of `__post_init__` again, on the values the config holds now: the type and choice
        checks ([`check_field_types`]), the finite-number check ([`check_finite_numbers`]) and the range and
        consistency checks (`_validate`, which subclasses extend). `TRAPOTrainer` calls it before anything slow, so a
        field set after construction (`args.rl_weight = "2"`, `args.sft_weight = None`, `args.dare_momentum = 1.5`:
        transformers' `TrainingArguments` is a mutable dataclass and TRL scripts set fields on it) is refused with
        the constructor's message instead of a bare `TypeError` later, or used unchecked (trial 17's W17, W17b).

        The checks run on a shallow copy, so the config is not changed (`_validate` writes `curriculum_mixtures`'
        flat form). Nothing that `__post_init__` derives is re-derived: the weighting strategy is read from
        `weighting` and `dare_mode` where it is used ([`weighting_name`]), so `dare_mode="dynamic"` set after
        construction with `weighting=None` selects DARE, as it would in the constructor. The warnings about ignored
        settings are given once, by the constructor.

        Raises:
            ValueError: naming the field, the value and the fix, as the constructor does.
        """
        checked = copy.copy(self)
        check_field_types(checked)
        check_finite_numbers(checked)
        self._validate.__func__(checked)  # this class's range checks (subclasses extend them), run on the copy

    def to_dict(self) -> dict[str, typing.Any]:
        """The config as a JSON-ready dict (transformers' `TrainingArguments.to_dict()`: every field of `__init__`, enums
        as their values), which trackers log and `type(args)(**args.to_dict())` rebuilds.

        transformers masks every field whose name ends in `_token` as a secret (`'<HUB_TOKEN>'`); here the settings so
        named ([`SETTING_TOKEN_FIELDS`]: `stop_token`) show their values, and a credential left unset shows None
        (there is nothing to hide), so the rebuild of a config without a token equals it. A `hub_token` that is set
        stays masked: the rebuild then refuses the placeholder, naming it ([`check_masked_tokens`]).

        Returns:
            `dict[str, Any]`: field name -> value.
        """
        values = super().to_dict()
        for name in values:
            if name in SETTING_TOKEN_FIELDS or (name.endswith("_token") and getattr(self, name) is None):
                values[name] = getattr(self, name)
        return values

    def _refused_by_transformers(self, text: str) -> str:
        """The message for a `ValueError` of transformers' `TrainingArguments.__post_init__` that no check here
        foresaw: its text, and the fields it names (whole words, as `--name` or `name`) to change. When it names none,
        the message says so and points at the environment (accelerate reads `WORLD_SIZE`, `ACCELERATE_*`, ... there),
        instead of a field that is not named (trial 11's C05).

        Args:
            text: transformers' error text.

        Returns:
            The message, naming this class.
        """
        name = type(self).__name__
        named = [f.name for f in dataclasses.fields(self) if f.init and re.search(rf"(?<![\w.]){f.name}(?!\w)", text)]
        head = f"{name} is invalid: transformers' TrainingArguments refused its settings: «{text}». "
        if named:
            flags = ", ".join(f"--{field_name}" for field_name in named)
            return f"{head}Change the {name} field it names ({flags}), or leave it at its default."
        return (
            f"{head}It names no {name} field: the cause may be a variable of the environment (accelerate and "
            "transformers read e.g. WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and ACCELERATE_* there; a launcher sets "
            "them for the processes it starts; one left over in your shell is removed with `unset NAME`) or a "
            "combination of settings."
        )

    def _warn_unused_settings(self) -> None:
        """Warn about settings that are valid but would do nothing or harm without a word: async-only settings
        ([`ASYNC_FIELDS`]) given without `async_rollouts` and vLLM-only settings ([`VLLM_FIELDS`]) without `use_vllm`
        (ignored, as `--lora_r` without `--use_peft` is: the same warning), PowerSGD's settings ([`POWERSGD_FIELDS`])
        without `ddp_comm_hook="powersgd"`, the weighting settings that do nothing
        ([`_warn_unused_weighting_settings`]: DARE's settings with static weights, the default since issue 42, where a
        script tuned for DARE, the earlier default, would lose it without a word), and a number of torch
        threads ([`THREAD_FIELDS`]) above the cores this process may use (`threads.usable_cores`: oversubscribed cores
        slow every process down, docs/threads.md)."""
        name = type(self).__name__
        if not self.async_rollouts:
            warn_ignored_settings(
                logger,
                [f"{setting}={getattr(self, setting)!r}" for setting in changed_settings(self, ASYNC_FIELDS)],
                f"{name}.async_rollouts",
                " (rounds are sampled synchronously, in the training process)",
                "Set async_rollouts=True (--async_rollouts) to sample in a producer process with {them}, or drop "
                "{them}.",
            )
        if not self.use_vllm:  # TRL checks none of them either way; TRAPO checks their ranges with use_vllm=True
            warn_ignored_settings(
                logger,
                [f"{setting}={getattr(self, setting)!r}" for setting in changed_settings(self, VLLM_FIELDS)],
                f"{name}.use_vllm",
                " (completions are sampled with transformers' generate; their ranges are checked only with use_vllm)",
                "Set use_vllm=True (--use_vllm) to sample with vLLM, or drop {them}.",
            )
        if self.ddp_comm_hook != "powersgd":
            warn_ignored_settings(
                logger,
                [f"{setting}={getattr(self, setting)!r}" for setting in changed_settings(self, POWERSGD_FIELDS)],
                f"{name}.ddp_comm_hook='powersgd'",
                f" (ddp_comm_hook={self.ddp_comm_hook!r})",
                "Set ddp_comm_hook='powersgd' (--ddp_comm_hook powersgd) to compress DDP's gradients with {them}, or "
                "drop {them}.",
            )
        self._warn_unused_weighting_settings()
        cores = threads.usable_cores()
        for setting in THREAD_FIELDS:
            count = getattr(self, setting)
            unused = setting == "async_producer_threads" and not self.async_rollouts  # warned about above
            if count is not None and count > cores and not unused:
                logger.warning(
                    "%s.%s=%d is more than the %d usable core(s) of this machine (its CPU affinity, "
                    "os.sched_getaffinity, in physical cores): the threads oversubscribe them, and OpenMP threads "
                    "that spin while they wait slow every process down (docs/threads.md measures it). Use at most %d, "
                    "or leave it None (TRAPO gives each process its share of the cores).",
                    name,
                    setting,
                    count,
                    cores,
                    cores,
                )

    def _warn_unused_weighting_settings(self) -> None:
        """Warn about weighting settings that do nothing (trial 17's W04c, W06, W13): `dare_mode="dynamic"` beside a
        `weighting` that is not 'dare' (`weighting` wins, as its help says), a setting of [`DARE_FIELDS`] the chosen
        strategy does not read ([`WEIGHTING_READS`]: all of them with static weights, the default since issue 42),
        and a `dare_update_interval` that leaves no update within `max_steps` (when it is set: the strategy then
        never measures and every factor stays 1)."""
        name, strategy = type(self).__name__, weighting_name(self)
        if self.weighting not in (None, "dare") and "dare_mode" in changed_settings(self, ("dare_mode",)):
            logger.warning(
                "%s.dare_mode=%r asks for DARE but weighting=%r is set, and weighting wins: the run uses weighting=%r "
                "and dare_mode is ignored. Drop dare_mode (weighting='dare' is what dare_mode='dynamic' selects), or "
                "set weighting='dare' (--weighting dare) for DARE.",
                name,
                self.dare_mode,
                self.weighting,
                self.weighting,
            )
        reads = WEIGHTING_READS[strategy]
        ignored = [setting for setting in changed_settings(self, DARE_FIELDS) if setting not in reads]
        given = [f"{setting}={getattr(self, setting)!r}" for setting in ignored]
        if strategy == "static":
            warn_ignored_settings(
                logger,
                given,
                f"{name}.weighting='dare' (or another adaptive strategy)",
                " (the weighting is static: every factor stays 1; TRAPOConfig's default was DARE before this release)",
                "Set weighting='dare' (--weighting dare) to weigh the objectives with DARE using {them}, or drop {them}.",
            )
        else:
            readers = [other for other, fields in WEIGHTING_READS.items() if set(ignored) <= set(fields)]
            warn_ignored_settings(
                logger,
                given,
                f"{name}.weighting={' or '.join(repr(reader) for reader in readers)}",
                f" (weighting={strategy!r} reads only {', '.join(reads)} of the dare_* settings)",
                "Drop {them}, or choose a strategy that reads {them} (--weighting "
                + " / ".join(readers)
                + "; docs/how_it_works.md, 'Other weighting strategies').",
            )
        interval = self.dare_update_interval
        if strategy != "static" and interval is not None and 0 < self.max_steps <= interval:
            logger.warning(
                "%s.dare_update_interval=%d is not below max_steps=%d: weighting=%r updates its factors at the steps "
                "k with 0 < k < max_steps that the interval divides, so it never updates and every factor stays 1 "
                "(static weights). %s",
                name,
                interval,
                self.max_steps,
                strategy,
                f"Use dare_update_interval <= {self.max_steps - 1}, or None (ceil(sqrt(max_steps)) = "
                f"{math.ceil(math.sqrt(self.max_steps))} steps)."
                if self.max_steps > 1
                else "A run of one step never updates: use max_steps >= 2 to weigh adaptively.",
            )

    def _check_best_model_settings(self) -> None:
        """Refuse `save_strategy="best"` without `metric_for_best_model`, naming the metrics TRAPO logs (trial 8's
        JC29): transformers refuses it too, in words that do not say which metrics exist (TRAPO never logs its
        default `eval_loss`). Which of them the run logs depends on the eval data, checked by the trainer
        (`evaluation.check_best_model_metric`). Likewise an `lr_scheduler_type` that steps on that metric
        (`setup_checks.METRIC_SCHEDULERS`: reduce_lr_on_plateau, greedy) with `eval_strategy="no"` (trial 9's PX55,
        CM30: transformers' "requires an eval strategy" named no fix), and `load_best_model_at_end` without an
        evaluation at every checkpoint (trial 10's TA08), on transformers' own conditions (`_validate_args`).

        Raises:
            ValueError: naming the field, the value, the metrics TRAPO logs and the fix.
        """
        name = type(self).__name__
        if getattr(self.save_strategy, "value", self.save_strategy) == "best" and self.metric_for_best_model is None:
            raise ValueError(
                f"{type(self).__name__}.save_strategy='best' needs metric_for_best_model (None here): it keeps the "
                "checkpoint whose metric is best. Set a metric TRAPO logs for the eval data: "
                "metric_for_best_model='eval_reward' with greater_is_better=True for prompts, 'eval_pretrain_loss' "
                "for text or 'eval_sft_loss' for demonstrations with greater_is_better=False (a dict of eval "
                "datasets: eval_<name>_reward, ...); or use save_strategy='steps'."
            )
        kind = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)
        if kind in METRIC_SCHEDULERS and getattr(self.eval_strategy, "value", self.eval_strategy) == "no":
            raise ValueError(  # transformers' "requires an eval strategy" named neither the metric nor the fix
                f"{type(self).__name__}.lr_scheduler_type={kind!r} needs an evaluation to step on (it adapts the "
                "learning rate to metric_for_best_model after each evaluation), and eval_strategy='no' runs none. Set "
                "eval_strategy='steps' (with eval_steps) or 'epoch', pass an eval_dataset, and name a metric TRAPO logs "
                "for it: metric_for_best_model='eval_reward' with greater_is_better=True and "
                "lr_scheduler_kwargs={'mode': 'max'} for prompts ('eval_pretrain_loss' / 'eval_sft_loss' for text / "
                "demonstrations, mode 'min'); or use another scheduler (e.g. lr_scheduler_type='linear' or 'cosine')."
            )
        save = str(getattr(self.save_strategy, "value", self.save_strategy))
        evaluation = str(getattr(self.eval_strategy, "value", self.eval_strategy))
        if not self.load_best_model_at_end or save == "best":
            return
        metric = (
            "pass an eval_dataset and name a metric TRAPO logs for it: metric_for_best_model='eval_reward' with "
            "greater_is_better=True for prompts ('eval_pretrain_loss' / 'eval_sft_loss' for text / demonstrations)"
        )
        if evaluation != save:
            steps = " (with eval_steps; save_steps a multiple of it)" if save == "steps" else ""
            raise ValueError(
                f"{name}.load_best_model_at_end=True needs an evaluation at every checkpoint, to know which one is "
                f"best, but eval_strategy={evaluation!r} and save_strategy={save!r} differ. Set eval_strategy="
                f"{save!r}{steps}, {metric}; or use save_strategy='best' (a checkpoint at each evaluation that "
                "improves the metric); or drop load_best_model_at_end."
            )
        eval_steps = self.eval_steps or self.logging_steps  # transformers' value when eval_steps is unset
        if evaluation == "steps" and self.save_steps and eval_steps and self.save_steps % eval_steps != 0:
            fractions = self.save_steps < 1 and eval_steps < 1  # transformers' test, in integer arithmetic for them
            if not fractions or (self.save_steps * 1_000_000) % (eval_steps * 1_000_000) != 0:
                unset = " (eval_steps unset: logging_steps)" if not self.eval_steps else ""
                raise ValueError(
                    f"{name}.load_best_model_at_end=True needs an evaluation at every checkpoint, but save_steps="
                    f"{self.save_steps!r} is not a multiple of eval_steps={eval_steps!r}{unset}. Give save_steps a "
                    "multiple of eval_steps (both numbers of steps, or both fractions of the run), or use "
                    "save_strategy='best'."
                )

    def _check_intervals(self) -> None:
        """Refuse an interval field the Trainer reads under its strategy "steps" that is not > 0, before
        transformers' `__post_init__` reads it: a value <= 0 there never fires or divides by zero, and transformers
        silently turns `eval_steps=0` into `logging_steps`. Below 1 it is a fraction of the run's steps; above 1 a
        whole number of steps. Also transformers' other refusals of step counts (`_validate_args`), in words that
        name the field and the fix: `eval_steps` unset with no `logging_steps` to take, a negative `warmup_steps`,
        `torch_empty_cache_steps` <= 0.

        Raises:
            ValueError: naming the field, the value and the fix.
        """
        for name, strategy in (
            ("save_steps", self.save_strategy),
            ("eval_steps", self.eval_strategy),
            ("logging_steps", self.logging_strategy),
        ):
            value = getattr(self, name)
            if str(getattr(strategy, "value", strategy)) == "steps" and value is not None and not value > 0:
                fix = " (None: every logging_steps)" if name == "eval_steps" else ""
                raise ValueError(
                    f"{type(self).__name__}.{name}={value!r} is invalid: use a positive number of optimizer steps "
                    f"(or a fraction < 1 of the run's steps){fix}."
                )
            if str(getattr(strategy, "value", strategy)) == "steps" and value is not None and value > 1:
                if value != int(value):  # transformers: "must be an integer if bigger than 1"
                    raise ValueError(
                        f"{type(self).__name__}.{name}={value!r} is invalid: above 1 it is a number of optimizer "
                        f"steps, a whole one (e.g. {name}={round(value)}); below 1 it is a fraction of the run's steps."
                    )
        evaluation = str(getattr(self.eval_strategy, "value", self.eval_strategy))
        if evaluation == "steps" and self.eval_steps is None and not (self.logging_steps or 0) > 0:
            raise ValueError(  # transformers evaluates every logging_steps when eval_steps is unset
                f"{type(self).__name__}.eval_steps=None is invalid here: with eval_strategy='steps' it takes "
                f"logging_steps, which is {self.logging_steps!r}. Set eval_steps to a positive number of steps."
            )
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(
                f"{type(self).__name__}.warmup_steps={self.warmup_steps!r} is invalid: use a number of warm-up steps "
                ">= 0 (below 1: a fraction of the run's steps; 0, the default: no warm-up)."
            )
        if self.torch_empty_cache_steps is not None and not self.torch_empty_cache_steps > 0:
            raise ValueError(
                f"{type(self).__name__}.torch_empty_cache_steps={self.torch_empty_cache_steps!r} is invalid: use a "
                "positive number of steps between emptying the accelerator's cache, or None (never)."
            )

    def _check_deepspeed(self) -> None:
        """Refuse a `deepspeed` config that DeepSpeed would fail on later with a message naming neither the field nor
        the fix, before transformers' `__post_init__` reads it:

        - a path that names no file (transformers' error names neither the field nor the fix);
        - a file that is not a JSON object (transformers' bare `JSONDecodeError` names neither `--deepspeed` nor the
          file);
        - `zero_optimization.stage` other than 0-3 (DeepSpeed's ZeRO stages; stage 4 was never checked before the
          launch failed);
        - no distributed launch: DeepSpeed reads its rank from the launcher's environment (`RANK`, `WORLD_SIZE`,
          `MASTER_ADDR`, `MASTER_PORT`, `LOCAL_RANK`) and, without it, asks MPI (`deepspeed.comm.init_distributed`'s
          `mpi_discovery`): without mpi4py the run failed at the first model DeepSpeed wraps with "No module named
          'mpi4py'". Refused only when DeepSpeed itself would fail so (no launcher's environment, no process group,
          no mpi4py, not on AzureML / SageMaker, whose environments DeepSpeed reads).

        A dict, JSON text and transformers' base64-encoded form pass the path check; their stage is checked.

        Raises:
            ValueError: naming the field, the value and the fix.
        """
        value = self.deepspeed
        if value is None or value == "":
            on_cpu = self.use_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("true", "1", "yes")
            if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and not on_cpu:  # CPU: DeepSpeed off
                self._check_deepspeed_launch(
                    "the environment variable ACCELERATE_USE_DEEPSPEED=true", environment=True
                )
            return
        name = f"{type(self).__name__}.deepspeed={str(value)!r}"
        loaded = value if isinstance(value, dict) else None
        if isinstance(value, (str, os.PathLike)) and not str(value).lstrip().startswith("{"):
            if os.path.isfile(value):
                try:
                    with open(value, encoding="utf-8") as handle:
                        loaded = json.load(handle)
                except (json.JSONDecodeError, UnicodeDecodeError) as error:
                    bom = isinstance(error, json.JSONDecodeError) and byte_order_mark_problem(error, "accelerate")
                    if bom:  # accelerate's DeepSpeed config reader refuses it too
                        raise ValueError(f"{name} is invalid: the file {os.path.abspath(value)} {bom}.") from error
                    raise ValueError(
                        f"{name} is invalid: the file {os.path.abspath(value)} is not valid JSON ({error}). --deepspeed "
                        'takes a DeepSpeed JSON config (keys in double quotes, no trailing commas), e.g. `{"'
                        'zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}`; fix the file, '
                        "or use a config TRL ships: `trapo train --accelerate_config zero2 ...`."
                    ) from error
                if not isinstance(loaded, dict):
                    raise ValueError(
                        f"{name} is invalid: the file {os.path.abspath(value)} holds a JSON "
                        f"{type(loaded).__name__}, not an object. --deepspeed takes a DeepSpeed JSON config, e.g. "
                        '`{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}`.'
                    )
            else:
                try:  # transformers also takes the config as base64-encoded JSON
                    json.loads(base64.urlsafe_b64decode(str(value)).decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    where = "a directory, not a file" if os.path.isdir(value) else "no such file"
                    raise ValueError(
                        f"{name} is invalid: {where} (from {os.getcwd()}). Give the path of a DeepSpeed JSON config "
                        "(or a dict), or drop --deepspeed and choose DeepSpeed with `accelerate launch --config_file "
                        "examples/accelerate_configs/deepspeed_zero2.yaml`."
                    ) from None
        zero = loaded.get("zero_optimization") if isinstance(loaded, dict) else None
        stage = zero.get("stage") if isinstance(zero, dict) else None
        if stage is not None and (isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3):
            raise ValueError(
                f"{name} is invalid: zero_optimization.stage={stage!r}; DeepSpeed's ZeRO stages are 0, 1, 2 and 3 "
                "(2 shards optimizer states and gradients, 3 also the parameters). Set it to one of them."
            )
        self._check_deepspeed_launch(name)

    @staticmethod
    def _check_deepspeed_launch(name: str, environment: bool = False) -> None:
        """Refuse DeepSpeed in a process no launcher started, when DeepSpeed would fail on it (see [`_check_deepspeed`]).

        `environment=True` when DeepSpeed was chosen not by `--deepspeed` but by `ACCELERATE_USE_DEEPSPEED=true` left in
        the environment (accelerate's launcher sets it for its children; exported in a shell, a later `python
        script.py` ran into MPI discovery and "No module named 'mpi4py'", naming no variable: trial 10's CX10).

        Raises:
            ValueError: naming the field and the launch commands.
        """
        import importlib.util

        launcher_env = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")  # DeepSpeed's `required_env`
        if (
            all(key in os.environ for key in launcher_env)
            or (torch.distributed.is_available() and torch.distributed.is_initialized())
            or importlib.util.find_spec("mpi4py") is not None
            or "AZUREML_EXPERIMENT_ID" in os.environ  # DeepSpeed's `in_aml`
            or "SM_TRAINING_ENV" in os.environ  # DeepSpeed's `in_aws_sm`
        ):
            return
        missing = [key for key in launcher_env if key not in os.environ]
        if environment:
            raise ValueError(
                f"{name} asks for DeepSpeed (accelerate reads it; its launcher sets it for the processes it starts), "
                f"but this process was not started by a launcher ({', '.join(missing)} not set), so DeepSpeed would "
                'ask MPI for its rank, and mpi4py is not installed (it failed later with "No module named '
                "'mpi4py'\"). If it is left over in your shell, `unset ACCELERATE_USE_DEEPSPEED` to train in this "
                "process; to train with DeepSpeed, launch the script with `accelerate launch --config_file "
                "examples/accelerate_configs/deepspeed_zero2.yaml ...` or `trapo train --accelerate_config zero2 ...`."
            )
        raise ValueError(
            f"{name} needs a distributed launch: DeepSpeed reads its rank from the launcher's environment "
            f"({', '.join(missing)} not set: this process was not started by a launcher) and otherwise asks MPI, and "
            "mpi4py is not installed (it failed later with \"No module named 'mpi4py'\"). Launch the script with "
            "`accelerate launch --config_file examples/accelerate_configs/deepspeed_zero2.yaml examples/trapo.py "
            "...` (that config chooses DeepSpeed; drop --deepspeed), or `trapo train --accelerate_config zero2 ...`; "
            "for your own JSON, `accelerate launch --use_deepspeed --deepspeed_config_file FILE --num_processes N "
            "examples/trapo.py ...` (a plain `accelerate launch` of one process sets no rank either). On a machine "
            "without a GPU prefix `DS_ACCELERATOR=cpu` (docs/distributed.md). Or drop --deepspeed to train in this "
            "process."
        )

    def _check_ddp_backend_launch(self) -> None:
        """Refuse `ddp_backend` in a process no launcher started, at construction: transformers' device setup hands it
        to accelerate's `PartialState`, which then asks torch for the size of a process group nobody formed (torch's
        "Default process group has not been initialized", trial 10's TA19 / CX29; TRL's `GRPOConfig` fails the same
        way). A launcher sets `LOCAL_RANK` (or an MPI / `WORLD_SIZE` count above 1, accelerate's own test); a process
        group the script formed itself, and XLA, are left to accelerate.

        Raises:
            ValueError: naming the field, the value, and the fixes (drop it, or launch several processes).
        """
        if self.ddp_backend is None or "LOCAL_RANK" in os.environ or torch.distributed.is_initialized():
            return
        sizes = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE")
        if any(os.environ.get(name, "1").strip() not in ("", "0", "1") for name in sizes):
            return
        if transformers.utils.is_torch_xla_available():
            return
        raise ValueError(
            f"{type(self).__name__}.ddp_backend={self.ddp_backend!r} is for a run of several processes (their DDP "
            "process group), but no launcher started this one, so there is no group to form. Fix: drop ddp_backend "
            "(--ddp_backend) to train in this process; or launch several, e.g. `accelerate launch --multi_gpu "
            "--num_processes 2 script.py ...` or `trapo train --multi_gpu --num_processes 2 ...` (docs/distributed.md)."
        )

    def _check_fsdp_launch(self, given) -> None:
        """Refuse `fsdp` in a process no launcher started, at construction: transformers' `Trainer` refuses it later
        ("Using fsdp only works in distributed training.", after the data and models are loaded) naming no fix. The
        condition is transformers' own (not XLA, `parallel_mode` not distributed), read only when no launcher set
        `LOCAL_RANK`, so nothing transformers accepts is refused. `given`: `fsdp` as the user gave it (for the message).

        Raises:
            ValueError: naming the field, the value and the launch commands.
        """
        if not self.fsdp or self.fsdp_config.get("xla", False) or "LOCAL_RANK" in os.environ:
            return
        if self.parallel_mode == transformers.training_args.ParallelMode.DISTRIBUTED:
            return
        raise ValueError(
            f"{type(self).__name__}.fsdp={given!r} needs a distributed launch (FSDP shards the model over processes "
            "started by a launcher; this one was not). Launch with `accelerate launch --config_file "
            "examples/accelerate_configs/fsdp2.yaml examples/trapo.py ...` or `trapo train --accelerate_config fsdp2 "
            "...` (that config chooses FSDP; drop --fsdp). FSDP needs GPUs (accelerate has no FSDP on the CPU: there "
            "use DDP, `--multi_gpu`, or DeepSpeed with `DS_ACCELERATOR=cpu`, docs/distributed.md). Or drop --fsdp to "
            "train in this process."
        )

    def _cpu_distributed_defaults(self) -> None:
        """Make a multi-process launch on a machine without an accelerator really distributed.

        On such a machine accelerate only forms a process group when told to: `accelerate launch --multi_gpu
        --num_processes 2` otherwise starts two *independent* single-process runs (no gradient synchronisation, both
        "rank 0", both writing the same files), and under DeepSpeed (`DS_ACCELERATOR=cpu`) it reports one process
        while DeepSpeed averages gradients over all of them. So: plain multi-process -> `use_cpu=True` (gloo DDP);
        DeepSpeed -> `ddp_backend="gloo"` (a CPU `use_cpu` would switch DeepSpeed off). FSDP is left alone: accelerate
        has no FSDP without an accelerator, and the trainer raises a clear error.
        """
        import os

        if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or torch.accelerator.is_available():
            return
        if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
            return  # accelerate has no FSDP without an accelerator; the trainer says so (distributed.check_launch)
        if bool(self.deepspeed) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
            if self.ddp_backend is None:
                self.ddp_backend = "gloo"
        elif not self.use_cpu:
            self.use_cpu = True

    def _check_precision(self) -> None:
        """Refuse mixed precision that this machine cannot run, naming the field, the value and the fix.

        - `bf16=True` / `bf16_full_eval=True` without a bf16 GPU (or XLA) and without `use_cpu=True`: transformers
          refuses it ("Your setup doesn't support bf16/gpu. You need to assign use_cpu ..."), naming neither the field
          nor the fix. The condition is transformers' own, so nothing it accepts is refused here; with `use_cpu=True`
          accelerate runs bf16 autocast on the CPU.
        - `fp16=True` when training runs on the CPU (`use_cpu=True`, or no accelerator): accelerate turns fp16 autocast
          on only off the CPU and silently ignores it there (the run is fp32). DeepSpeed runs are left to DeepSpeed,
          which handles precision itself (its CPU accelerator has fp16 on some CPUs).
        - `fp16=True` with `bf16=True` (or the `_full_eval` pair): transformers refuses "at most one" of them.
        - `tf32=True` without a GPU with TF32 (trial 10's TA01): transformers' "--tf32 requires Ampere or a newer GPU
          arch" named no fix (`tf32=None`, the default, leaves torch's setting).

        Raises:
            ValueError: naming `bf16` / `bf16_full_eval` / `fp16` / `tf32`, its value and the fix.
        """
        from transformers.utils import is_torch_bf16_gpu_available, is_torch_tf32_available, is_torch_xla_available

        name = type(self).__name__
        for field_name in ("bf16", "bf16_full_eval"):
            if getattr(self, field_name) is True and not (
                self.use_cpu or is_torch_bf16_gpu_available() or is_torch_xla_available()
            ):
                raise ValueError(
                    f"{name}.{field_name}=True, but this machine has no GPU with bf16 support (transformers refuses "
                    f"bf16 here). Drop it ({name}.bf16 left unset turns bf16 on only where a bf16 GPU is present), or "
                    "set use_cpu=True to train with bf16 autocast on the CPU."
                )
        deepspeed = bool(self.deepspeed) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
        if self.fp16 and (self.use_cpu or not torch.accelerator.is_available()) and not deepspeed:
            why = "use_cpu=True" if self.use_cpu else "this machine has no GPU"
            raise ValueError(
                f"{name}.fp16=True, but training runs on the CPU ({why}), where accelerate has no fp16 mixed "
                "precision: it would ignore the setting and train in fp32. Drop fp16, or train on a GPU."
            )
        for half, brain in (("fp16", "bf16"), ("fp16_full_eval", "bf16_full_eval")):
            if getattr(self, half) and getattr(self, brain) is True:
                raise ValueError(
                    f"{name}.{half}=True and {brain}=True: choose one (transformers runs one mixed precision). bf16 "
                    "has fp32's range and needs no loss scaling; fp16 is for GPUs without bf16."
                )
        if self.tf32 is True and not is_torch_tf32_available():
            raise ValueError(
                f"{name}.tf32=True, but this machine has no GPU with TF32 (an NVIDIA Ampere or newer GPU, CUDA >= 11): "
                "transformers refuses it here. Drop it (tf32=None, the default, leaves torch's matmul precision as "
                "it is), or train on such a GPU."
            )

    def _environment_precision(self) -> str | None:
        """The mixed precision `ACCELERATE_MIXED_PRECISION` chooses for this run: its value when no field chooses one
        (transformers' `TrainingArguments` reads the variable and lets `fp16=True` / `bf16=True` override it, then
        hands it to accelerate's `Accelerator`) and DeepSpeed is off (DeepSpeed sets its precision from its own
        config); else None."""
        value = os.environ.get(PRECISION_VARIABLE)
        deepspeed = bool(self.deepspeed) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
        if value is None or self.fp16 or self.bf16 is True or deepspeed:
            return None
        return value

    def _check_environment_precision(self) -> None:
        """Refuse, at construction, a mixed precision from the environment (`ACCELERATE_MIXED_PRECISION`, which
        accelerate's launcher sets for its processes from `--mixed_precision`, and which a shell may keep) that this
        machine would ignore or refuse, as [`_check_precision`] refuses the same from the fields (trial 11's C05 /
        N41):

        - `fp16` when training runs on the CPU: accelerate turns fp16 autocast on only off the CPU (its
          `native_amp` stays False) and the run was fp32 without a word;
        - `bf16` on a GPU without bf16: accelerate's "bf16 mixed precision requires a supported device", once the
          trainer was built;
        - a value accelerate does not know (its `PrecisionType`, case-sensitive): its "Unknown mixed_precision mode",
          once the trainer was built.

        `bf16` on the CPU runs (bf16 autocast): [`_warn_environment_precision`] says so.

        Raises:
            ValueError: naming the variable, its value and the fixes (`unset`, or the field).
        """
        from accelerate.utils import PrecisionType
        from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

        value = self._environment_precision()
        if value is None:
            return
        where = f"The environment variable {PRECISION_VARIABLE}={value!r}"
        unset = (
            f"If it is left over in your shell, `unset {PRECISION_VARIABLE}` (then the config's fp16 / bf16 choose); "
            "under `accelerate launch` it comes from --mixed_precision"
        )
        choices = [member.value for member in PrecisionType]
        if value not in choices:
            raise ValueError(
                f"{where} is no mixed precision accelerate knows ({', '.join(map(repr, choices))}): accelerate refused "
                f"it when the trainer was built. {unset}; or set it to one of them."
            )
        on_cpu = self.use_cpu or not torch.accelerator.is_available()
        if value == "fp16" and on_cpu:
            why = "use_cpu=True" if self.use_cpu else "this machine has no GPU"
            raise ValueError(
                f"{where} asks for fp16 mixed precision, but training runs on the CPU ({why}), where accelerate has "
                f"no fp16: it would ignore it and train in fp32. {unset}: drop it, or pass `--mixed_precision no` "
                "(or `bf16`, with bf16 autocast on the CPU); or train on a GPU."
            )
        if value == "bf16" and not (on_cpu or is_torch_bf16_gpu_available() or is_torch_xla_available()):
            raise ValueError(
                f"{where} asks for bf16 mixed precision, but this machine's GPU has no bf16 support (accelerate "
                f"refused it when the trainer was built). {unset}: drop it, or pass `--mixed_precision fp16`."
            )

    def _warn_environment_precision(self) -> None:
        """Say, once when the config is built, that the run trains under bf16 autocast because
        `ACCELERATE_MIXED_PRECISION=bf16` says so while the config's `bf16` is False (trial 11's N41: the saved config
        said `bf16=False` of a bf16 run, without a word). Not refused: accelerate's launcher sets the variable from
        `--mixed_precision bf16`, a choice of the user's."""
        if self._environment_precision() != "bf16":
            return
        logger.warning(
            "Mixed precision: bf16 autocast, from the environment variable %s=bf16 (accelerate's launcher sets it from "
            "--mixed_precision), while %s.bf16=False: the config saved with the run says bf16=False. To train in "
            "fp32, `unset %s` (or launch with --mixed_precision no); to record it, set bf16=True (with use_cpu=True "
            "on a machine without a bf16 GPU).",
            PRECISION_VARIABLE,
            type(self).__name__,
            PRECISION_VARIABLE,
        )

    def _check_torch_compile(self) -> None:
        """Refuse a `torch_compile_backend` accelerate does not know and a `torch_compile_mode` torch's inductor does
        not know, at construction: accelerate's `TorchDynamoPlugin` refused the backend only when the trainer was
        built, with Python's "'NOPE' is not a valid DynamoBackend" naming neither the field nor the choices (trial
        10's TA10), and torch refused the mode only when the model was compiled. The choices are accelerate's
        `DynamoBackend` and torch's `torch._inductor.list_mode_options()` (the mode of the default backend).

        Raises:
            ValueError: naming the field, the value and the choices.
        """
        from accelerate.utils import DynamoBackend

        name = type(self).__name__
        backend = self.torch_compile_backend
        backends = [member.value.lower() for member in DynamoBackend]
        if backend is not None and backend.lower() not in backends:
            raise ValueError(
                f"{name}.torch_compile_backend={backend!r} is invalid: use one of {', '.join(map(repr, backends))} "
                "(accelerate's DynamoBackend; 'inductor', torch.compile's default, fits most), or leave it None."
            )
        if self.torch_compile_mode is not None and (backend is None or backend.lower() == "inductor"):
            from torch._inductor import list_mode_options

            modes = list(list_mode_options())
            if self.torch_compile_mode not in modes:
                raise ValueError(
                    f"{name}.torch_compile_mode={self.torch_compile_mode!r} is invalid: use one of "
                    f"{', '.join(map(repr, modes))} (torch.compile's modes of the inductor backend), or leave it None."
                )

    def _check_accelerator_config(self) -> None:
        """Refuse an `accelerator_config` (a dict, or the path of a JSON file) that transformers or accelerate would
        refuse naming no field, at construction: a key `AcceleratorConfig` does not have (Python's "unexpected keyword
        argument"), a file that does not exist, and in `gradient_accumulation_kwargs` a key accelerate's
        `GradientAccumulationPlugin` does not have (refused only when the trainer was built) or `num_steps`, which
        transformers' trainer copies over `gradient_accumulation_steps` when it is built (or refuses, when that is > 1).

        Raises:
            ValueError: naming the field, the key or path and the fix.
        """
        from accelerate.utils import GradientAccumulationPlugin
        from transformers.trainer_pt_utils import AcceleratorConfig

        value, name = self.accelerator_config, f"{type(self).__name__}.accelerator_config"
        if isinstance(value, (str, os.PathLike)) and not str(value).startswith("{"):  # JSON text: check_json_dicts
            if not os.path.isfile(value):
                raise ValueError(
                    f"{name}={str(value)!r} is invalid: no such file (from {os.getcwd()}). Give the path of a JSON "
                    "file of AcceleratorConfig's settings, or a dict."
                )
            return  # transformers reads it and names the file and its unknown keys
        settings = value if isinstance(value, dict) else vars(value) if isinstance(value, AcceleratorConfig) else {}
        known = [f.name for f in dataclasses.fields(AcceleratorConfig)]
        unknown = sorted(str(key) for key in settings if key not in known)
        if unknown:
            raise ValueError(
                f"{name}={value!r} is invalid: transformers' AcceleratorConfig has no {', '.join(unknown)}. Its keys "
                f"are {', '.join(known)}."
            )
        accumulation = settings.get("gradient_accumulation_kwargs") or {}
        plugin = [f.name for f in dataclasses.fields(GradientAccumulationPlugin) if f.name != "num_steps"]
        if "num_steps" in accumulation:
            raise ValueError(
                f"{name}['gradient_accumulation_kwargs']={accumulation!r} is invalid: set gradient_accumulation_steps="
                f"{accumulation['num_steps']!r} instead of num_steps (transformers' trainer copies num_steps over "
                "gradient_accumulation_steps when it is built, changing the config TRAPO planned its steps on)."
            )
        unknown = sorted(str(key) for key in accumulation if key not in plugin)
        if unknown:
            raise ValueError(
                f"{name}['gradient_accumulation_kwargs']={accumulation!r} is invalid: accelerate's "
                f"GradientAccumulationPlugin has no {', '.join(unknown)}. Its keys are {', '.join(plugin)}."
            )

    def _grpo_names_given(self) -> list[str]:
        """The GRPO names (`GRPO_ALIASES`) a config built from the user's arguments was given: those not None.

        Raises:
            ValueError: naming the field, for `grpo_values_built` given without `grpo_names_given` (both are filled in
                at construction, and a copy carries both).
        """
        if self.grpo_values_built is not None:
            self._refuse(
                "grpo_values_built",
                self.grpo_values_built,
                "it is filled in at construction (with grpo_names_given, which is None here): leave it unset.",
            )
        return [alias for alias in GRPO_ALIASES if getattr(self, alias) is not None]

    def _resolve_copied_names(self) -> list[str]:
        """For a copy of a built config (`dataclasses.replace`, a `to_dict()` rebuild: `grpo_names_given` filled in),
        whose GRPO names held the values in effect: the GRPO names given, the recorded ones and any the copy changed.

        The copy passes both names of each setting, so which one the user changed is read from `grpo_values_built`
        (the value both held): a GRPO name that differs from it sets TRAPO's field (and counts as given); a TRAPO
        field that differs from it is read by its GRPO name. Never one of two values the user gave: both names
        changed to different values, or a copy without `grpo_values_built` whose two names differ, is refused.

        Returns:
            The GRPO names given, in `GRPO_ALIASES`' order (the resolution loop of `__post_init__` then finds each
            pair agreeing).

        Raises:
            ValueError: naming the field(s), for a recorded name that is not a GRPO name, a malformed
                `grpo_values_built`, or two names of one setting that disagree, with the call that works.
        """
        unknown = [name for name in self.grpo_names_given if name not in GRPO_ALIASES]
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.grpo_names_given={self.grpo_names_given!r} is invalid: {unknown} are not TRL "
                f"GRPOConfig names of TRAPO fields ({', '.join(GRPO_ALIASES)}). It is filled in at construction: "
                "leave it unset."
            )
        built = self.grpo_values_built
        if isinstance(built, str):  # the command line's JSON text (`check_json_dicts` found it a JSON object)
            built = json.loads(built)
        if built is not None and (not isinstance(built, Mapping) or set(built) != set(GRPO_ALIASES.values())):
            self._refuse(
                "grpo_values_built",
                built,
                f"it is filled in at construction, a dict with the keys {', '.join(GRPO_ALIASES.values())}: leave it "
                "unset.",
            )
        given = []
        for alias, target in GRPO_ALIASES.items():
            value, in_effect = getattr(self, alias), getattr(self, target)
            if value is None or value == in_effect or (built is not None and value == built[target]):
                # unchanged, or the copy changed TRAPO's name only: the GRPO name reads it
                setattr(self, alias, None if value is None else in_effect)
                given += [alias] if alias in self.grpo_names_given else []
            elif built is not None and in_effect == built[target]:  # the copy changed the GRPO name: it sets TRAPO's
                setattr(self, target, value)
                given.append(alias)
            else:
                self._refuse_copied_pair(alias, target, None if built is None else built[target])
        return given

    def _refuse_copied_pair(self, alias: str, target: str, built) -> None:
        """Raise the ValueError of a copy whose two names of one setting disagree (see `_resolve_copied_names`).

        Args:
            alias: the GRPO name (`GRPO_ALIASES`).
            target: TRAPO's name.
            built: the value both held in the config copied (`grpo_values_built`), None when not recorded.
        """
        value, in_effect = getattr(self, alias), getattr(self, target)
        name = type(self).__name__
        if built is not None:
            why = (
                f"this config is a copy of one built with {target}={built!r} (`dataclasses.replace`, a `to_dict()` "
                "rebuild), which carries both names, and both were changed, to different values"
            )
        else:
            why = (
                "this config is a copy of a built one (grpo_names_given is filled in) that does not record the value "
                "both names held (grpo_values_built), so which of them was changed cannot be told"
            )
        raise ValueError(
            f"{name}.{alias}={value!r} and {target}={in_effect!r} disagree: they are one setting (TRL GRPOConfig's "
            f"name and TRAPO's); {why}. Fix: give one of them, or both the value you mean, e.g. "
            f"`dataclasses.replace(args, {alias}={value!r}, {target}={value!r})` (or "
            f"`{alias}={in_effect!r}, {target}={in_effect!r}`; in a `to_dict()` rebuild, set both keys)."
        )

    def _resolve_max_completion_length(self) -> None:
        """GRPO's `max_completion_length`, when given, becomes `response_length` (set once, at construction).

        `response_length` at its default counts as not given (a dataclass cannot tell an explicit default apart).

        Raises:
            ValueError: naming both fields, when both are given with different values.
        """
        if self.max_completion_length is None:
            return
        default = type(self).__dataclass_fields__["response_length"].default
        if self.response_length not in (default, self.max_completion_length):
            raise ValueError(
                f"{type(self).__name__}.max_completion_length={self.max_completion_length!r} and response_length="
                f"{self.response_length!r} disagree: they are one setting (GRPO's name and PPO's for the completion "
                "budget in tokens). Give only one of them."
            )
        self.response_length = self.max_completion_length

    def _resolve_alias(self, alias: str, target: str) -> None:
        """A GRPO name (`GRPO_ALIASES`), when given, sets TRAPO's field (once, at construction), as
        [`_resolve_max_completion_length`] does: the target at its default counts as not given.

        Raises:
            ValueError: naming both fields, when both are given with different values.
        """
        value = getattr(self, alias)
        if value is None:
            return
        default = type(self).__dataclass_fields__[target].default
        if getattr(self, target) not in (default, value):
            raise ValueError(
                f"{type(self).__name__}.{alias}={value!r} and {target}={getattr(self, target)!r} disagree: they are "
                f"one setting (TRL GRPOConfig's name and TRAPO's). Give only one of them."
            )
        setattr(self, target, value)

    def _refuse(self, name: str, value, fix: str) -> None:
        """Raise the ValueError of an invalid field: `<Config>.<name>=<value> is invalid: <fix>`."""
        raise ValueError(f"{type(self).__name__}.{name}={value!r} is invalid: {fix}")

    # A separate method so subclasses (e.g. PPOConfig) can extend the checks.
    def _validate(self) -> None:
        bad = self._refuse
        # every Literal field's choices: check_field_types, before this method runs
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            bad("learning_rate", self.learning_rate, "use a finite learning rate > 0 (e.g. 1e-5 for a real model).")
        # lr_scheduler_kwargs transformers would train wrongly with; other mistakes: when the trainer builds it
        check_scheduler_kwargs(self)
        if self.weight_decay is not None and self.weight_decay < 0:  # torch refuses it; transformers bypasses that
            bad(
                "weight_decay",
                self.weight_decay,
                "use a decay >= 0 (0, the default: none; e.g. 0.01, AdamW's own default). A negative one pushes the "
                "weights away from zero: torch's optimizers refuse it ('Invalid weight_decay value'), but transformers "
                "passes it in the parameter groups, where torch does not check it, so it trained without a word.",
            )
        if self.save_total_limit is not None and self.save_total_limit < 1:  # transformers: <= 0 keeps every one
            bad(
                "save_total_limit",
                self.save_total_limit,
                "transformers reads a value <= 0 as 'no limit' and keeps every checkpoint. Use a number >= 1, leave "
                "it unset (None) for no limit, or set save_strategy='no' to save no checkpoints.",
            )
        if "max_completion_length" in self.grpo_names_given and self.max_completion_length < 1:
            bad(
                "max_completion_length",
                self.max_completion_length,
                "use a positive number of tokens (it is GRPO's name of response_length), or None.",
            )
        if self.max_tool_calling_iterations is not None and not (
            isinstance(self.max_tool_calling_iterations, int)
            and not isinstance(self.max_tool_calling_iterations, bool)
            and self.max_tool_calling_iterations >= 0
        ):
            bad(
                "max_tool_calling_iterations",
                self.max_tool_calling_iterations,
                "use an int >= 0 (rounds of tool calls per rollout; 0: tools shown, none run), or None for no bound.",
            )
        if self.tool_timeout is not None and not (
            isinstance(self.tool_timeout, (int, float))
            and not isinstance(self.tool_timeout, bool)
            and math.isfinite(self.tool_timeout)
            and self.tool_timeout > 0
        ):
            bad(
                "tool_timeout",
                self.tool_timeout,
                "use a finite number of seconds > 0 (a tool call running longer is abandoned and fails), or None for "
                "no limit (TRL's behaviour).",
            )

        for name in ("model_init_kwargs", "teacher_model_init_kwargs"):
            kwargs = getattr(self, name)
            for key in ("dtype", "torch_dtype"):  # `from_pretrained` reads a string one as `getattr(torch, value)`
                value = kwargs.get(key) if isinstance(kwargs, dict) else None
                if value is None or value == "auto" or isinstance(value, torch.dtype):
                    continue
                if not (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)):
                    bad(
                        f"{name}[{key!r}]",
                        value,
                        "use 'auto', a torch.dtype, or the name of one (e.g. 'bfloat16', 'float16', 'float32').",
                    )
        if not (0.0 <= self.distillation_beta <= 1.0):
            bad("distillation_beta", self.distillation_beta, "use a value in [0, 1] (0 forward KL, 1 reverse KL).")
        if not (self.distillation_temperature > 0 and math.isfinite(self.distillation_temperature)):
            bad("distillation_temperature", self.distillation_temperature, "use a finite temperature > 0.")
        for name in ("pretrain_weight", "sft_weight", "rl_weight", "distillation_weight"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                bad(name, value, "use a finite number >= 0 (0 switches the objective off).")
        if self.pretrain_weight == self.sft_weight == self.rl_weight == self.distillation_weight == 0:
            bad(  # distillation alone is a run (trial 17's W07): its weight counts
                "rl_weight",
                0.0,
                "every objective's weight is 0 (pretrain_weight, sft_weight, rl_weight, distillation_weight): give at "
                "least one of them > 0. distillation_weight alone needs a teacher (teacher_model / "
                "--teacher_model_name_or_path) and a distillation_dataset of reward-free prompts (docs/distillation.md).",
            )
        if not 0 < self.trust_region_alpha <= 1:
            bad("trust_region_alpha", self.trust_region_alpha, "use a value in (0, 1]; the paper uses 0.1.")
        if not 0 <= self.dare_momentum < 1:
            bad("dare_momentum", self.dare_momentum, "use a value in [0, 1); the source document uses 0.9.")
        if self.dare_update_interval is not None and self.dare_update_interval < 1:
            bad("dare_update_interval", self.dare_update_interval, "use an integer >= 1, or None for ceil(sqrt(N)).")
        if not 0 < self.dare_min_factor <= 1:  # each bound by its own name (trial 17's W04b: not a tuple)
            bad(
                "dare_min_factor",
                self.dare_min_factor,
                "use a value in (0, 1] (the lowest factor an objective may get; the default is 0.25): the factors "
                f"start at 1 and need 0 < dare_min_factor <= 1 <= dare_max_factor (={self.dare_max_factor!r}).",
            )
        if not self.dare_max_factor >= 1:
            bad(
                "dare_max_factor",
                self.dare_max_factor,
                "use a value >= 1 (the highest factor an objective may get; the default is 4.0): the factors start at "
                f"1 and need 0 < dare_min_factor (={self.dare_min_factor!r}) <= 1 <= dare_max_factor.",
            )
        if self.dare_probe_vocab < 2:
            bad("dare_probe_vocab", self.dare_probe_vocab, "use at least 2 vocabulary rows.")
        if self.dare_probe_dim < 1:
            bad("dare_probe_dim", self.dare_probe_dim, "use a positive projection dimension.")
        boundaries = list(self.curriculum_boundaries)
        if any(not 0 < b < 1 for b in boundaries) or boundaries != sorted(set(boundaries)):
            bad("curriculum_boundaries", boundaries, "use strictly increasing fractions in (0, 1), e.g. [0.2, 0.8].")
        mixtures = list(self.curriculum_mixtures)
        phases = len(boundaries) + 1
        if mixtures and all(isinstance(m, (list, tuple)) and len(m) == 3 for m in mixtures):
            # one (pretrain, sft, rl) triple per phase, as the docs word it (trial 12's N13): the flat form, a new list
            mixtures = [x for triple in mixtures for x in triple]
            self.curriculum_mixtures = mixtures
        if mixtures and all(isinstance(m, Mapping) for m in mixtures):  # one mapping objective -> share per phase
            if len(mixtures) != phases:
                bad(*curriculum_phases_refusal(self, mixtures))
            for i, mapping in enumerate(mixtures):
                shares = list(mapping.values())
                if not all(isinstance(k, str) for k in mapping) or any(
                    not isinstance(x, (int, float)) or isinstance(x, bool) or not (x >= 0 and math.isfinite(x))
                    for x in shares
                ):
                    bad("curriculum_mixtures", mixtures, f"phase {i} must map objective names to finite shares >= 0.")
                if not abs(sum(shares) - 1) <= 1e-6:
                    bad("curriculum_mixtures", mixtures, f"phase {i} {dict(mapping)} must sum to 1.")
        else:
            if any(isinstance(m, Mapping) for m in mixtures) or len(mixtures) != 3 * phases:
                bad(*curriculum_phases_refusal(self, mixtures))
            for i in range(0, len(mixtures), 3):
                triple = mixtures[i : i + 3]
                if any(not (x >= 0 and math.isfinite(x)) for x in triple) or not abs(sum(triple) - 1) <= 1e-6:
                    bad("curriculum_mixtures", mixtures, f"phase {i // 3} {triple} must be finite, >= 0 and sum to 1.")
        if self.curriculum_decay_steps <= 0:
            bad("curriculum_decay_steps", self.curriculum_decay_steps, "use a positive number (< 1: a fraction).")
        for name in ("pretrain_max_length", "sft_max_length", "max_prompt_length", "response_length"):
            if getattr(self, name) < 1:
                bad(name, getattr(self, name), "use a positive number of tokens.")
        if self.pretrain_max_length < 2:
            bad("pretrain_max_length", self.pretrain_max_length, "a row needs at least 2 tokens to predict one.")
        if self.num_generations < 1:
            bad("num_generations", self.num_generations, "use an integer >= 1 (>= 2 without a value model).")
        if self.per_device_train_batch_size < 1:
            bad(
                "per_device_train_batch_size", self.per_device_train_batch_size, "use an integer >= 1 (rows per step)."
            )
        if self.gradient_accumulation_steps < 1:
            bad("gradient_accumulation_steps", self.gradient_accumulation_steps, "use an integer >= 1.")
        if self.max_steps == 0 or self.max_steps < -1:  # the Trainer reads <= 0 as "not set" (-1: the documented one)
            bad(
                "max_steps",
                self.max_steps,
                "use a positive number of optimizer steps, or -1 (the default) to train for num_train_epochs. To "
                "evaluate without training, call trainer.evaluate() on a trainer you do not train.",
            )
        if self.per_device_eval_batch_size < 1:
            bad(
                "per_device_eval_batch_size",
                self.per_device_eval_batch_size,
                "use an integer >= 1 (prompts and rows per evaluation batch).",
            )
        for name in ("seed", "data_seed"):  # numpy's seeds, which `transformers.set_seed` sets too
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 2**32 - 1:
                bad(name, value, "use an integer in [0, 2**32 - 1] (e.g. 42).")
        if self.missing_eos_penalty is not None and not (
            self.missing_eos_penalty >= 0 and math.isfinite(self.missing_eos_penalty)
        ):
            bad(
                "missing_eos_penalty",
                self.missing_eos_penalty,
                "use a finite number >= 0, or None: it is subtracted from the score of a completion without the "
                "stop token (a negative one would reward running to response_length; TRL documents it as positive).",
            )
        if self.push_to_hub:  # the repo id first: it is wrong whether or not the Hub can be reached
            check_hub_repo_id(self)
        if self.push_to_hub and huggingface_hub.constants.is_offline_mode():
            bad(
                "push_to_hub",
                True,
                "HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1) is set, so the Hugging Face Hub cannot be reached: unset "
                "it, or drop push_to_hub and upload the saved output_dir later (`hf upload <repo_id> <output_dir>`).",
            )
        if self.max_steps <= 0 and self.total_episodes is None and not self.num_train_epochs > 0:
            bad(
                "num_train_epochs",
                self.num_train_epochs,
                "use a positive number of epochs, or set max_steps (> 0) or total_episodes to fix the run's length.",
            )
        if not self.temperature > 0:
            bad("temperature", self.temperature, "use a positive sampling temperature.")
        if not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "use a value in (0, 1].")
        if self.top_k < 0:
            bad("top_k", self.top_k, "use 0 (disabled) or a positive integer.")
        if not self.cliprange > 0:
            bad("cliprange", self.cliprange, "use a positive clip range, e.g. 0.2.")
        if not self.cliprange_value > 0:
            bad("cliprange_value", self.cliprange_value, "use a positive clip range, e.g. 0.2.")
        if self.kl_coef < 0:
            bad("kl_coef", self.kl_coef, "use a value >= 0 (0 disables the KL penalty and the reference model).")
        if not 0 < self.ref_model_mixup_alpha <= 1:
            bad("ref_model_mixup_alpha", self.ref_model_mixup_alpha, "use a value in (0, 1].")
        if self.ref_model_sync_steps < 1:
            bad("ref_model_sync_steps", self.ref_model_sync_steps, "use a positive number of steps.")
        if self.entropy_coef < 0:
            bad("entropy_coef", self.entropy_coef, "use a value >= 0.")
        if not 0 <= self.gamma <= 1:
            bad("gamma", self.gamma, "use a discount in [0, 1].")
        if not 0 <= self.lam <= 1:
            bad("lam", self.lam, "use a GAE lambda in [0, 1].")
        if self.vf_coef < 0:
            bad("vf_coef", self.vf_coef, "use a value >= 0.")
        if self.num_ppo_epochs < 1:
            bad("num_ppo_epochs", self.num_ppo_epochs, "use an integer >= 1 (uses per trajectory).")
        if self.num_mini_batches < 1:
            bad("num_mini_batches", self.num_mini_batches, "use an integer >= 1.")
        if self.replay_capacity < 1:
            bad("replay_capacity", self.replay_capacity, "use a positive number of trajectories.")
        if self.replay_max_bytes is not None and self.replay_max_bytes < MIN_TRAJECTORY_BYTES:  # trial 10's PY02
            bad(
                "replay_max_bytes",
                self.replay_max_bytes,
                f"the smallest trajectory takes {MIN_TRAJECTORY_BYTES} bytes (one prompt and one completion token), "
                "so the buffer could hold none and the first rollout round would fail. A trajectory takes about 8 "
                "bytes per prompt token and 20 per completion token (more with a KL reference or a critic; zstd "
                "shrinks long ones): use a budget of many of them (e.g. 2**30 for 1 GiB), or None (no byte limit).",
            )
        if not 0 < self.replay_compress_threshold <= 1:
            bad("replay_compress_threshold", self.replay_compress_threshold, "use a fraction in (0, 1].")
        if self.importance_sampling_cap is not None and not self.importance_sampling_cap > 0:
            bad("importance_sampling_cap", self.importance_sampling_cap, "use a positive cap (e.g. 2.0) or None.")
        problem = bounds_problem(
            self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_max,
            self.vllm_importance_sampling_clip_min,
            correction=self.vllm_importance_sampling_correction,
        )
        if problem is not None:
            bad(*problem)
        if self.use_vllm and self.vllm_importance_sampling_correction and "min_p" in (self.generation_kwargs or {}):
            bad(
                "generation_kwargs",
                {"min_p": self.generation_kwargs["min_p"]},
                "with vllm_importance_sampling_correction, vLLM's log-probs are renormalised over what min_p keeps "
                "but the trainer's side models top_k / top_p only, so every ratio would carry the kept mass: drop "
                "min_p (use top_p / top_k), or set vllm_importance_sampling_correction=False.",
            )
        if self.guidance not in ("zero_variance", "always"):
            bad("guidance", self.guidance, "use 'zero_variance' or 'always'.")
        if not (math.isfinite(self.guidance_gamma) and self.guidance_gamma > 0):
            bad("guidance_gamma", self.guidance_gamma, "use a positive number (LUFFY uses 0.1).")
        if self.demonstration_column is not None and not self.demonstration_column:
            bad("demonstration_column", self.demonstration_column, "name a column of the RL dataset, or use None.")
        if not (math.isfinite(self.exploration_temperature_step) and self.exploration_temperature_step > 0):
            bad("exploration_temperature_step", self.exploration_temperature_step, "use a positive step (e.g. 0.1).")
        if self.exploration_max_temperature is not None and not (
            math.isfinite(self.exploration_max_temperature) and self.exploration_max_temperature > self.temperature
        ):
            bad(
                "exploration_max_temperature",
                self.exploration_max_temperature,
                f"use a temperature above `temperature` ({self.temperature}), or None (1.5 x temperature).",
            )
        if (
            isinstance(self.exploration_max_search, bool)
            or not isinstance(self.exploration_max_search, int)
            or self.exploration_max_search < 0
        ):
            bad("exploration_max_search", self.exploration_max_search, "use an integer >= 0 (0: no search).")
        if not math.isfinite(self.self_imitation_min_reward):
            bad("self_imitation_min_reward", self.self_imitation_min_reward, "use a finite score (e.g. 1.0).")
        if not 0.0 < self.self_imitation_fraction <= 1.0:
            bad("self_imitation_fraction", self.self_imitation_fraction, "use a share of the SFT rows in (0, 1].")
        if self.self_imitation_max_uses < 1:
            bad("self_imitation_max_uses", self.self_imitation_max_uses, "use an integer >= 1.")
        if self.self_imitation_capacity < 1:
            bad("self_imitation_capacity", self.self_imitation_capacity, "use an integer >= 1.")
        if self.self_imitation is True and self.fewshot_mode:
            bad("self_imitation", True, "few-shot mode chooses the SFT rows itself: use one of the two, not both.")
        if self.replay_max_age is not None and self.replay_max_age < 1:
            bad("replay_max_age", self.replay_max_age, "use a positive number of optimizer steps, or None.")
        if self.max_staleness is not None and not (isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            bad(
                "max_staleness",
                self.max_staleness,
                f"use a number of optimizer steps >= 0 (0: strictly on-policy), or None: {DEFAULT_MAX_STALENESS} "
                "steps with async_rollouts=True (TRL's AsyncGRPOConfig default), unused without them.",
            )
        if not (isinstance(self.weight_sync_steps, int) and self.weight_sync_steps >= 1):
            bad("weight_sync_steps", self.weight_sync_steps, "use an integer >= 1 (optimizer steps).")
        if self.stale_rollouts not in ("drop", "downweight"):
            bad("stale_rollouts", self.stale_rollouts, "use 'drop' or 'downweight'.")
        if self.async_correction not in ("decoupled", "behaviour"):
            bad("async_correction", self.async_correction, "use 'decoupled' or 'behaviour'.")
        if self.max_image_pixels is not None and not (
            isinstance(self.max_image_pixels, int) and self.max_image_pixels >= 1
        ):
            bad("max_image_pixels", self.max_image_pixels, "use a number of pixels >= 1 (width x height), or None.")
        if self.async_producer_threads is not None and not (
            isinstance(self.async_producer_threads, int) and self.async_producer_threads >= 1
        ):
            bad(
                "async_producer_threads",
                self.async_producer_threads,
                "use an integer >= 1, or None (the producer's share of the cores, as `torch_threads` decides).",
            )
        if self.torch_threads is not None and not (isinstance(self.torch_threads, int) and self.torch_threads >= 0):
            bad("torch_threads", self.torch_threads, "use None (TRAPO chooses), 0 (torch's default) or N >= 1.")
        if self.async_rollouts:
            if self.async_correction == "decoupled" and not self.vllm_importance_sampling_correction:
                bad(
                    "async_correction",
                    "decoupled",
                    "the decoupled objective weights the loss by the truncated ratio proximal / producer, which is "
                    "vllm_importance_sampling_correction: set it to True, or use async_correction='behaviour'.",
                )
            if self.use_vllm and self.vllm_mode != "server":
                bad(
                    "vllm_mode",
                    self.vllm_mode,
                    "async_rollouts samples in a producer process, and TRL's colocate engine cannot live there: "
                    "it is one shard of a vLLM world built on the trainer's torch.distributed world (the trainer's "
                    "rank and world size, distributed_executor_backend='external_launcher', tensor-parallel groups "
                    "of the trainer's ranks, a barrier over every rank when it starts) and it loads its weights "
                    "from the trainer's live, possibly ZeRO-3-partitioned, model; a spawned producer has neither. "
                    "An engine of the producer's own beside the trainer would be a vLLM server without its HTTP, "
                    "which is vllm_mode='server' (TRL's AsyncGRPOTrainer samples from a server only). Start a vLLM "
                    "server (`trl vllm-serve --model <model>`, on other GPUs) and set vllm_mode='server' with "
                    "vllm_server_base_url, or set async_rollouts=False (synchronous colocate rollouts).",
                )
            if self.use_vllm and self.async_correction == "behaviour":
                bad(
                    "async_correction",
                    "behaviour",
                    "with use_vllm=True the sampled log-probs are vLLM's (its kernels, its top-k / top-p support), "
                    "not the training model's: PPO's old log-probs are recomputed by the trainer and vLLM's weight "
                    "the loss through the mismatch correction, which is async_correction='decoupled'. Use it, or "
                    "use_vllm=False.",
                )
            if self.fewshot_mode:
                bad(
                    "fewshot_mode",
                    True,
                    "few-shot prompt embeddings are not available in the asynchronous producer: set "
                    "fewshot_mode=False, or async_rollouts=False.",
                )
        if self.local_rollout_forward_batch_size < 1:
            bad("local_rollout_forward_batch_size", self.local_rollout_forward_batch_size, "use an integer >= 1.")
        if self.max_nonfinite_steps < 1:
            bad("max_nonfinite_steps", self.max_nonfinite_steps, "use an integer >= 1.")
        if self.total_episodes is not None and self.total_episodes < 1:
            bad("total_episodes", self.total_episodes, "use a positive number of prompts, or None.")
        if self.reward_weights is not None and any(not math.isfinite(w) for w in self.reward_weights):
            bad("reward_weights", self.reward_weights, "use finite numbers.")
        if self.stop_token is not None and self.stop_token != "eos":
            bad("stop_token", self.stop_token, "use 'eos' or None (or set stop_token_id).")
        if self.stop_token_id is not None and (isinstance(self.stop_token_id, bool) or self.stop_token_id < 0):
            bad("stop_token_id", self.stop_token_id, "use a token id >= 0 of the policy's tokenizer, or None.")
        self._validate_generation_kwargs(bad)
        self._validate_chat_template_kwargs(bad)
        self._validate_schedules_and_distribution(bad)
        self._validate_memory_pool(bad)

    def _validate_bypassed_trainer_fields(self, bad) -> None:
        """`TrainingArguments` fields whose hooks TRAPO replaces (sampler, dataloader, loss, evaluation loop): each
        works here or is refused, never silently ignored. Run before transformers' `__post_init__`, whose own
        refusal of `dataloader_prefetch_factor` without workers named no fix."""
        own_data = (
            "TRAPO draws each step's rows from its own pools in the training process (get_batch_samples); the "
            "Trainer's dataloader only serves step placeholders"
        )
        own_eval = "TRAPO's evaluate computes its metrics directly, without the Trainer's prediction loop"
        checks = (
            (
                "train_sampling_strategy",
                self.train_sampling_strategy == "group_by_length",
                "TRAPO groups each step's rows by length itself. Use 'random' (RL prompts in a seeded order) or "
                "'sequential' (RL prompts in dataset order, as shuffle_dataset=False).",
            ),
            ("length_column_name", self.length_column_name != "length", "it only serves group_by_length; drop it."),
            ("dataloader_drop_last", self.dataloader_drop_last, f"{own_data}, so nothing is dropped; drop it."),
            ("dataloader_num_workers", self.dataloader_num_workers != 0, f"{own_data}; use 0."),
            ("dataloader_prefetch_factor", self.dataloader_prefetch_factor is not None, f"{own_data}; drop it."),
            (
                "dataloader_persistent_workers",
                self.dataloader_persistent_workers,
                f"{own_data}, without worker processes to keep; drop it.",
            ),
            ("label_smoothing_factor", self.label_smoothing_factor != 0, "TRAPO's losses have no label smoothing."),
            (
                "average_tokens_across_devices",
                not self.average_tokens_across_devices,
                "TRAPO always normalises each objective by its token count over all micro-batches and ranks; "
                "leave it True.",
            ),
            (
                "auto_find_batch_size",
                self.auto_find_batch_size,
                "the step plan (rows per objective, planned steps, curriculum) is fixed from "
                "per_device_train_batch_size at construction; set the batch size yourself.",
            ),
            ("prediction_loss_only", self.prediction_loss_only, f"{own_eval}; drop it."),
            ("eval_accumulation_steps", self.eval_accumulation_steps is not None, f"{own_eval}; drop it."),
            ("batch_eval_metrics", self.batch_eval_metrics, f"{own_eval}; drop it."),
            ("eval_do_concat_batches", not self.eval_do_concat_batches, f"{own_eval}; drop it."),
            ("include_for_metrics", bool(self.include_for_metrics), f"{own_eval}; drop it."),
            (
                "ignore_data_skip",
                self.ignore_data_skip,
                "TRAPO restores its own data position (samplers, streams, replay buffer) from the checkpoint; "
                "there is no data to skip.",
            ),
            (
                "remove_unused_columns",
                self.remove_unused_columns,
                "TRAPO passes the extra dataset columns to the reward functions; leave it False.",
            ),
            ("label_names", self.label_names is not None, "TRAPO's rows carry no labels; drop it."),
        )
        for name, refused, fix in checks:
            if refused:
                bad(name, getattr(self, name), f"TRAPO does not use it: {fix}")

    @property
    def shuffle_rl_prompts(self) -> bool:
        """Whether RL prompts are served in a seeded order (`shuffle_dataset`, and not
        `train_sampling_strategy='sequential'`)."""
        return self.shuffle_dataset and self.train_sampling_strategy != "sequential"

    @property
    def sampling_seed(self) -> int:
        """The seed of the data samplers (`data_seed`, or `seed` when unset)."""
        return self.seed if self.data_seed is None else self.data_seed

    def _validate_chat_template_kwargs(self, bad) -> None:
        """`chat_template_kwargs` go to the chat template; the arguments TRAPO sets itself, as TRL's trainers do
        (where GRPOTrainer fails with `got multiple values for keyword argument`), are refused by name; `tools`, read
        as every row's tool schemas (as a row's `tools` cell), is checked as that cell is (transformers' template
        call failed on `{"tools": 5}` with `'int' object is not iterable`)."""
        kwargs = self.chat_template_kwargs or {}
        if not isinstance(kwargs, dict):
            bad("chat_template_kwargs", kwargs, "use a dict of the chat template's variables, or None.")
        if "tools" in kwargs:

            def bad_tools(field: str, problem: str, fix: str) -> ValueError:
                return ValueError(
                    f"{type(self).__name__}.chat_template_kwargs['tools']={kwargs['tools']!r} is invalid: {problem}. "
                    f"{fix} Tools to call are given as `tools=` (functions) or `environment_factory=`."
                )

            row_tool_names(kwargs["tools"], bad_tools)
        own = sorted(set(kwargs) & set(OWN_CHAT_TEMPLATE_ARGUMENTS))
        if own:
            bad(
                "chat_template_kwargs",
                {key: kwargs[key] for key in own},
                f"drop {', '.join(repr(k) for k in own)}: TRAPO sets {'it' if len(own) == 1 else 'them'} itself, as "
                "TRL's trainers do (" + "; ".join(OWN_CHAT_TEMPLATE_ARGUMENTS[k] for k in own) + ").",
            )

    def _validate_generation_kwargs(self, bad) -> None:
        kwargs = self.generation_kwargs or {}
        if not isinstance(kwargs, dict):
            bad("generation_kwargs", kwargs, "use a dict of generation settings, or None.")
        for key, value in kwargs.items():
            if key in OWN_GENERATION_FIELDS:
                bad(
                    "generation_kwargs",
                    {key: value},
                    OWN_GENERATION_FIX.get(key)
                    or f"set `{OWN_GENERATION_FIELDS[key]}` instead: TRAPO records and trains on log-probs at that "
                    "value.",
                )
            if key == "stop_strings":
                bad(
                    "generation_kwargs",
                    {key: value},
                    "stop strings are not supported (the completion mask is cut by token ids): give the ids that end "
                    "a completion, e.g. generation_kwargs={'eos_token_id': [tokenizer.eos_token_id, id_of_stop]}.",
                )
            if key == "eos_token_id":
                ids = value if isinstance(value, (list, tuple)) else [value]
                if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                    bad("generation_kwargs", {key: value}, "use a token id or a non-empty list of token ids.")
                continue
            if key in GENERATION_KWARG_RANGES:
                low, high, interval, example = GENERATION_KWARG_RANGES[key]
                number = isinstance(value, numbers.Real) and not isinstance(value, bool)
                inside = number and (
                    low <= value <= high
                    if key == "min_p"
                    else low < value <= high
                    if key == "typical_p"
                    else low <= value < high
                )
                if not inside:
                    bad("generation_kwargs", {key: value}, f"`{key}` takes a number in {interval}, e.g. {example}.")
            if key == "use_cache" and not isinstance(value, bool):
                bad("generation_kwargs", {key: value}, "`use_cache` takes True or False.")
            if key == "cache_implementation":
                try:  # transformers' own list of cache implementations
                    transformers.GenerationConfig(cache_implementation=value).validate()
                except ValueError as error:
                    bad("generation_kwargs", {key: value}, f"{error}.")
            if key not in SAFE_GENERATION_KWARGS:
                reason = (
                    "it changes the logits the completion is sampled from, so the behaviour log-probs TRAPO records "
                    "(and the PPO ratio and KL computed from them) would not describe the sampled distribution"
                    if key in LOGITS_CHANGING_GENERATION_KWARGS
                    else "it is not a setting TRAPO can account for"
                )
                bad(
                    "generation_kwargs",
                    {key: value},
                    f"drop `{key}`: {reason}. Accepted: `eos_token_id`, "
                    f"{', '.join(f'`{k}`' for k in sorted(SAFE_GENERATION_KWARGS))}.",
                )

    def _validate_schedules_and_distribution(self, bad) -> None:
        late = ("rl_phase_learning_rate", "late_entropy_coef")
        if any(getattr(self, name) is not None for name in late) and not self.curriculum_boundaries:
            name = next(name for name in late if getattr(self, name) is not None)
            bad(name, getattr(self, name), "it applies from the curriculum's last phase: keep curriculum_boundaries.")
        if self.rl_phase_learning_rate is not None and not self.rl_phase_learning_rate > 0:
            bad("rl_phase_learning_rate", self.rl_phase_learning_rate, "use a positive learning rate, or None.")
        if self.late_entropy_coef is not None and self.late_entropy_coef < 0:
            bad("late_entropy_coef", self.late_entropy_coef, "use a value >= 0, or None.")
        if self.kl_target is not None:
            if not self.kl_target > 0:
                bad("kl_target", self.kl_target, "use a positive per-sequence KL in nats (e.g. 6.0), or None.")
            if not self.kl_coef > 0:
                bad("kl_target", self.kl_target, "adaptive KL starts from kl_coef: set kl_coef > 0.")
        if not self.kl_horizon > 0:
            bad("kl_horizon", self.kl_horizon, "use a positive number of rollouts (e.g. 10000).")
        if self.kl_coef_range is not None:
            bounds = list(self.kl_coef_range)
            if self.kl_target is None:
                bad("kl_coef_range", bounds, "it bounds the adaptive KL coefficient: set kl_target too, or drop it.")
            if len(bounds) != 2 or not 0 < bounds[0] <= bounds[1]:
                bad("kl_coef_range", bounds, "give [min, max] with 0 < min <= max, e.g. [0.1, 0.3].")
            if not bounds[0] <= self.kl_coef <= bounds[1]:
                bad("kl_coef", self.kl_coef, f"the adaptive KL starts from kl_coef: choose it within {bounds}.")
        if self.ddp_comm_hook == "bf16" and (problem := bf16_comm_hook_problem()) is not None:
            bad(
                "ddp_comm_hook",
                self.ddp_comm_hook,
                "PyTorch's bf16 hook needs a CUDA build of torch with NCCL >= 2.10 (or XPU with XCCL), and "
                f"{problem}: torch would refuse it at the start of training on every rank. Use 'fp16' (also half the "
                "bytes) or 'none'.",
            )
        if self.powersgd_rank < 1:
            bad("powersgd_rank", self.powersgd_rank, "use a matrix approximation rank >= 1.")
        if self.powersgd_start_iter < 2:
            bad("powersgd_start_iter", self.powersgd_start_iter, "PyTorch's PowerSGD needs at least 2.")
        if self.use_vllm:
            if not (math.isfinite(self.vllm_server_timeout) and self.vllm_server_timeout >= 0):
                bad("vllm_server_timeout", self.vllm_server_timeout, "use a number of seconds >= 0 (TRL: 240).")
            if not 0 < self.vllm_gpu_memory_utilization <= 1:
                bad("vllm_gpu_memory_utilization", self.vllm_gpu_memory_utilization, "use a fraction in (0, 1].")
            if self.vllm_tensor_parallel_size < 1:
                bad("vllm_tensor_parallel_size", self.vllm_tensor_parallel_size, "use an integer >= 1.")
            if self.vllm_max_model_length is not None and (
                self.vllm_max_model_length < self.max_prompt_length + self.response_length
            ):
                bad(
                    "vllm_max_model_length",
                    self.vllm_max_model_length,
                    f"use at least max_prompt_length + response_length = "
                    f"{self.max_prompt_length + self.response_length}, or None.",
                )

    def _validate_memory_pool(self, bad) -> None:
        if self.sft_priority_alpha < 0:
            bad("sft_priority_alpha", self.sft_priority_alpha, "use a value >= 0 (0 samples uniformly; paper: 0.6).")
        if not 0 <= self.sft_priority_beta <= 1:
            bad("sft_priority_beta", self.sft_priority_beta, "use a value in [0, 1] (paper: 0.4, annealed to 1).")
        if self.sft_pool_max_bytes is not None and self.sft_pool_max_bytes < 1:
            bad(
                "sft_pool_max_bytes",
                self.sft_pool_max_bytes,
                "use a positive number of bytes, or None (5% of the free space of output_dir's filesystem at start).",
            )
        if self.adapter_snapshot_steps < 0:
            bad("adapter_snapshot_steps", self.adapter_snapshot_steps, "use a positive number of steps, or 0 (off).")
        if self.max_adapter_snapshots < 1:
            bad("max_adapter_snapshots", self.max_adapter_snapshots, "keep at least 1 snapshot.")
        if self.adapter_rollback_reward_drop is not None and not self.adapter_rollback_reward_drop >= 0:
            bad("adapter_rollback_reward_drop", self.adapter_rollback_reward_drop, "use a fraction >= 0, or None.")
        if self.adapter_rollback_kl_max is not None and not self.adapter_rollback_kl_max > 0:
            bad("adapter_rollback_kl_max", self.adapter_rollback_kl_max, "use a positive KL in nats, or None.")
        if self.fewshot_max_uses < 1:
            bad("fewshot_max_uses", self.fewshot_max_uses, "use an integer >= 1 (the source document: 5).")
        sigma = list(self.fewshot_sigma)
        if len(sigma) != 2 or not (sigma[0] > 0 and sigma[1] > 0):
            bad("fewshot_sigma", sigma, "give [start, end], both > 0, e.g. [0.3, 0.1].")
        if self.fewshot_num_prototypes < 1:
            bad("fewshot_num_prototypes", self.fewshot_num_prototypes, "use an integer >= 1.")
        if self.fewshot_candidates < 1:
            bad("fewshot_candidates", self.fewshot_candidates, "use an integer >= 1 (1: no preference).")
        if self.fewshot_strength < 0:
            bad("fewshot_strength", self.fewshot_strength, "use a value >= 0.")
        if self.fewshot_mode and self.use_vllm:
            bad(
                "fewshot_mode",
                True,
                "few-shot mode anneals the sampling temperature per round, which vLLM rollouts do not support yet: "
                "set use_vllm=False.",
            )

    @property
    def exploration_ceiling(self) -> float:
        """The highest sampling temperature targeted exploration uses (`exploration_max_temperature`, or 1.5 x
        `temperature` when that is None)."""
        if self.exploration_max_temperature is not None:
            return self.exploration_max_temperature
        return 1.5 * self.temperature
