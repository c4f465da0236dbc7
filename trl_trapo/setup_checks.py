# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Training settings that only fail when `train()` builds them, checked when the trainer is built.

transformers' `Trainer` builds the optimizer and the learning-rate scheduler inside `train()` — after TRAPO has loaded
the models, tokenized the datasets and, in the command-line job, run the initial evaluation (minutes on a real model)
— and its trackers' callbacks (`report_to`) when it is constructed, with a bare `RuntimeError`. A missing package
(`--optim adamw_bnb_8bit` without bitsandbytes, `--report_to wandb` without wandb), a scheduler missing its argument
(`cosine_with_min_lr` without `min_lr_rate`) or a malformed `lr_scheduler_kwargs` then surfaces as a library traceback
that names no setting. [`check_training_setup`] builds the optimizer and scheduler once, with transformers' own
`Trainer.get_optimizer_cls_and_kwargs` and `get_scheduler`, on one dummy parameter (no model needed), and looks up
each tracker with transformers' availability checks, before anything loads; each failure is one message naming the
setting, its value and the fix.

An explicit `log_level` also sets the level of TRAPO's own `trl_trapo` logger ([`apply_log_level`]), as the
`Trainer` sets transformers' verbosity from it.

A policy loaded by id goes through [`check_model_loading`] once its config is read and before any weight loads
(flash attention without its package or a GPU, 4/8-bit loading without bitsandbytes, a classification checkpoint as
the policy), and a `model_init_kwargs` key the model's constructor refuses is named by [`unknown_model_keyword`].
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import logging
import os
import re
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformers import SchedulerType, Trainer, get_scheduler
from transformers.integrations import integration_utils
from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, GreedyLR


logger = logging.getLogger(__name__)


LIBRARY_LOGGER = "trl_trapo"
"""The logger of TRAPO's own messages (every module's `logging.getLogger(__name__)` is under it)."""


class UnlessRootHandles(logging.Filter):
    """Let a record through [`apply_log_level`]'s handler only while the root logger has no handler: once the user
    configures logging (`logging.basicConfig(...)`), the record reaches theirs and is not printed twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


def apply_log_level(args: Any) -> None:
    """Set the `trl_trapo` logger's level from an explicit `args.log_level`, as transformers' `Trainer` sets its own
    verbosity (`TrainingArguments.get_process_log_level`): `log_level` on the process that logs (`args.should_log`),
    `log_level_replica` on the others (trial 15's N20: `log_level="info"` showed transformers' info lines, never
    TRAPO's, which stayed at Python's default WARNING). With `log_level="passive"` (the default) logging is left as
    the user set it; on a process whose level is "passive", too. When the level is below WARNING and no handler would
    print the records (Python's last-resort handler prints warnings only), a stderr handler is added to the
    `trl_trapo` logger, as transformers adds one to its own; it stays silent while the root logger has a handler.

    Args:
        args: the config (`log_level`, `log_level_replica`: transformers' names, e.g. "info"; `should_log`).
    """
    from transformers.training_args import trainer_log_levels

    if args.log_level == "passive":
        return
    level = trainer_log_levels[args.log_level if args.should_log else args.log_level_replica]
    if level < 0:  # "passive" on this process
        return
    library = logging.getLogger(LIBRARY_LOGGER)
    library.setLevel(level)
    if level < logging.WARNING and not library.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(UnlessRootHandles())
        library.addHandler(handler)


TRACKER_PACKAGES = {
    "azure_ml": ("is_azureml_available", "azureml-core"),
    "comet_ml": ("is_comet_available", "comet_ml"),
    "mlflow": ("is_mlflow_available", "mlflow"),
    "neptune": ("is_neptune_available", "neptune"),
    "tensorboard": ("is_tensorboard_available", "tensorboard"),
    "trackio": ("is_trackio_available", "trackio"),
    "wandb": ("is_wandb_available", "wandb"),
    "codecarbon": ("is_codecarbon_available", "codecarbon"),
    "clearml": ("is_clearml_available", "clearml"),
    "dagshub": ("is_dagshub_available", "dagshub"),
    "flyte": ("is_flytekit_available", "flytekit"),
    "dvclive": ("is_dvclive_available", "dvclive"),
    "swanlab": ("is_swanlab_available", "swanlab"),
    "kubeflow": ("is_kubeflow_available", "kubeflow-training"),
}
"""`report_to` name -> (transformers' availability check in `transformers.integrations.integration_utils`, the pip
package that provides it)."""
MODEL_OPTIMIZERS = ("galore", "apollo", "lomo")
"""`optim` families whose `Trainer.get_optimizer_cls_and_kwargs` needs the model: only their import is checked here."""
CHECK_STEPS = 100
"""Planned steps of the dry-run scheduler when `max_steps` is not set (the real count is only known in `train()`)."""


def check_report_to(args) -> None:
    """Refuse a `report_to` tracker transformers does not know or whose package is not installed.

    Raises:
        ValueError: naming `report_to`, the tracker, the package to install, and `--report_to none`.
    """
    for name in args.report_to or []:
        if name not in integration_utils.INTEGRATION_TO_CALLBACK:
            raise ValueError(
                f"{type(args).__name__}.report_to={args.report_to!r} is invalid: {name!r} is not a tracker transformers "
                f"knows; use some of {', '.join(sorted(integration_utils.INTEGRATION_TO_CALLBACK))}, or 'none'."
            )
        available, package = TRACKER_PACKAGES.get(name, (None, name))
        if available is not None and not getattr(integration_utils, available, lambda: True)():
            raise ValueError(
                f"{type(args).__name__}.report_to={args.report_to!r} is invalid: the {name} tracker needs the "
                f"`{package}` package, which is not installed: `pip install {package}`, or drop it (`--report_to none` "
                "logs to the console only)."
            )


def _optimizer_settings(args) -> str:
    optim = getattr(args.optim, "value", args.optim)
    settings = f"optim={optim!r}, learning_rate={args.learning_rate}, weight_decay={args.weight_decay}"
    if "adam" in optim:
        settings += f", adam_beta1={args.adam_beta1}, adam_beta2={args.adam_beta2}, adam_epsilon={args.adam_epsilon}"
    return settings + (f", optim_args={args.optim_args!r}" if args.optim_args else "")


def check_optimizer(args) -> torch.optim.Optimizer | None:
    """Build the optimizer `args` asks for on one dummy parameter, as `Trainer.create_optimizer` will.

    Returns:
        The dry-run optimizer (for [`check_scheduler`]), or None for an optimizer that needs the model
        ([`MODEL_OPTIMIZERS`]: only its import is checked).

    Raises:
        ValueError: naming `optim` and the settings it was built with, the library's reason and the fix (the package
            to install, or `--optim adamw_torch`).
    """
    optim = getattr(args.optim, "value", args.optim)
    try:
        optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
        optimizer = optimizer_class([torch.nn.Parameter(torch.zeros(2))], **kwargs)
        warn_unread_optim_args(args, kwargs)
        return optimizer
    except ImportError as error:
        raise ValueError(
            f"{type(args).__name__}.optim={optim!r} cannot be used: {error}. Install it, or choose an optimizer of "
            "torch's own (`--optim adamw_torch`)."
        ) from None
    except (ValueError, TypeError, RuntimeError) as error:
        if any(family in optim for family in MODEL_OPTIMIZERS):
            return None  # it is built from the model's parameters: checked by transformers in train()
        raise ValueError(
            f"The optimizer cannot be built from {_optimizer_settings(args)}: {type(error).__name__}: {error}. Fix the "
            "setting it names (e.g. adam_beta1 and adam_beta2 in [0, 1), optim_args as 'key=value,key=value')."
        ) from None


class _OptimArgsView:
    """`args` with another `optim_args`, for `Trainer.get_optimizer_cls_and_kwargs` (the config is not changed)."""

    def __init__(self, args, optim_args: str | None):
        self.args, self.optim_args = args, optim_args

    def __getattr__(self, name: str):
        return getattr(self.args, name)


def warn_unread_optim_args(args, kwargs: dict) -> None:
    """Warn, naming them, about the keys of `optim_args` that the chosen `optim` does not read: transformers reads
    `optim_args` only in some optimizers' set-up (`transformers.trainer_optimizer`) and drops the rest without a word
    (trial 9's CM28: `--optim_args foo=bar` with adamw_torch). A key is unread when the optimizer's keyword arguments
    `Trainer.get_optimizer_cls_and_kwargs` builds are the same without it: the set comes from transformers' own code,
    as it runs, not from a list.

    Args:
        args: the training arguments (`optim`, `optim_args`, ...).
        kwargs: the optimizer's keyword arguments built from `args`.
    """
    if not args.optim_args:
        return
    pairs = [p for p in args.optim_args.replace(" ", "").split(",") if p]
    unread = []
    for pair in pairs:
        rest = ",".join(p for p in pairs if p != pair) or None
        try:
            if Trainer.get_optimizer_cls_and_kwargs(_OptimArgsView(args, rest))[1] == kwargs:
                unread.append(pair.split("=")[0])
        except (ImportError, ValueError, TypeError, RuntimeError):  # another key is needed: read, then
            continue
    if unread:
        optim = getattr(args.optim, "value", args.optim)
        logger.warning(
            "%s.optim_args=%r: optim=%r does not read %s (transformers ignores %s), so the optimizer is built "
            "without %s. Fix: drop %s, or choose an optim that reads %s (transformers reads optim_args only in the "
            "set-up of some: sgd, adagrad, rmsprop, adamw_anyprecision, the bitsandbytes, torchao, GaLore, APOLLO, "
            "GrokAdamW, schedule-free and StableAdamW ones); the adamw_* optimizers' settings are adam_beta1, "
            "adam_beta2, adam_epsilon and weight_decay.",
            type(args).__name__,
            args.optim_args,
            optim,
            ", ".join(repr(k) for k in unread),
            "them" if len(unread) > 1 else "it",
            "them" if len(unread) > 1 else "it",
            "them" if len(unread) > 1 else "it",
            "them" if len(unread) > 1 else "it",
        )


METRIC_SCHEDULERS = ("reduce_lr_on_plateau", "greedy")
"""transformers' `lr_scheduler_type`s that `Trainer` steps with the evaluation's `metric_for_best_model` (torch's
`ReduceLROnPlateau`, transformers' `GreedyLR`; both default to `mode='min'`): checked by
[`~trl_trapo.evaluation.check_best_model_metric`]."""


def check_scheduler(args, optimizer: torch.optim.Optimizer | None) -> None:
    """Build the learning-rate scheduler `args` asks for on `optimizer` (or a plain SGD over one dummy parameter), as
    `Trainer.create_scheduler` will, and take one step (none for [`METRIC_SCHEDULERS`], which step on an evaluation
    metric: building them checks their `lr_scheduler_kwargs`, which `train()` refused with torch's TypeError).

    Raises:
        ValueError: naming `lr_scheduler_type`, `lr_scheduler_kwargs`, the library's reason and the fix.
    """
    kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    optimizer = optimizer or torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=args.learning_rate)
    steps = args.max_steps if args.max_steps > 0 else CHECK_STEPS
    try:
        scheduler = get_scheduler(
            kind,
            optimizer=optimizer,
            num_warmup_steps=args.get_warmup_steps(steps),
            num_training_steps=steps,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs,
        )
        if kind not in METRIC_SCHEDULERS:  # they step on an evaluation metric: built only (their keys are torch's)
            optimizer.step()
            scheduler.step()
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"{type(args).__name__}.lr_scheduler_type={kind!r} with lr_scheduler_kwargs={args.lr_scheduler_kwargs!r} "
            f"cannot be built: {type(error).__name__}: {error}. Fix: {_scheduler_fix(kind, error)}."
        ) from None


def warn_warmup_covers_run(args, planned_steps: int, optimizers: tuple[Any, Any] = (None, None)) -> str | None:
    """Say once, at construction, when the learning-rate warm-up lasts the whole run, so that the rate never reaches
    `learning_rate` (trial 14's C16 / N38: the CPU recipe's `warmup_steps: 4` with `--max_steps 1` trained its one
    step at rate 0). transformers' `Trainer` does the same without a word; the run is kept as asked.

    The rates are those of transformers' `get_scheduler` for `lr_scheduler_type` over `planned_steps` (the rate
    optimizer step k trains at is the schedule's value after k - 1 steps). Nothing is said when `optimizers` or the
    DeepSpeed config gives the scheduler, for a scheduler stepped on a metric, or when some step reaches
    `learning_rate` (e.g. `constant`, which has no warm-up).

    Args:
        args ([`~trl_trapo.TRAPOConfig`]): `warmup_steps` (a count, or below 1 a fraction of the steps),
            `lr_scheduler_type`, `lr_scheduler_kwargs`, `learning_rate`, `max_steps`.
        planned_steps (`int`): the run's optimizer steps (the run plan's).
        optimizers (`tuple`): the trainer's `optimizers=(optimizer, lr_scheduler)` argument.

    Returns:
        The warning's text, or None.
    """
    deepspeed = getattr(getattr(args, "hf_deepspeed_config", None), "config", None) or {}
    kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    if optimizers[1] is not None or "scheduler" in deepspeed or kind in METRIC_SCHEDULERS or planned_steps < 1:
        return None
    warmup = args.get_warmup_steps(planned_steps)
    if warmup < planned_steps or args.learning_rate <= 0:
        return None
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    scheduler = get_scheduler(
        kind,
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=planned_steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if not lambdas:  # not a LambdaLR: its rates cannot be read without stepping it
        return None
    rates = [args.learning_rate * lambdas[0](step) for step in range(planned_steps)]
    if max(rates) >= args.learning_rate:  # the schedule reaches the rate (it has no warm-up)
        return None
    shown = [f"step {k + 1} at {rates[k]:.3g}" for k in range(min(planned_steps, 3))]
    if planned_steps > 3:
        shown[-1:] = ["...", f"step {planned_steps} (the last) at {rates[-1]:.3g}"]
    length = f"max_steps={args.max_steps}" if args.max_steps > 0 else "planned from num_train_epochs"
    given = f"warmup_steps={args.warmup_steps:g}" + (f" ({warmup} steps)" if args.warmup_steps < 1 else "")
    message = (
        f"{given} is at least the run's {planned_steps} optimizer step{'s' if planned_steps > 1 else ''} ({length}): "
        f"the whole run is warm-up under "
        f"lr_scheduler_type={kind!r}, so the learning rate never reaches learning_rate={args.learning_rate:g}: "
        + ", ".join(shown)
        + (" (a step at rate 0 does not change the model)" if rates[0] == 0 else "")
        + ". Fix: set warmup_steps=0"
        + (f", or at most {planned_steps - 1} (below 1 it is a fraction of the steps)" if planned_steps > 1 else "")
        + ", or raise max_steps."
    )
    logger.warning(message)
    return message


SCHEDULER_SET_BY_TRAINER = ("optimizer", "num_warmup_steps", "num_training_steps", "last_epoch")
"""Parameters of transformers' scheduler functions that `Trainer.create_scheduler` passes itself (`last_epoch`: the
default); the others are what `lr_scheduler_kwargs` may set."""


def scheduler_keywords(function: Callable) -> list[str]:
    """The keyword arguments of transformers' scheduler `function` that `lr_scheduler_kwargs` may set (its signature
    without [`SCHEDULER_SET_BY_TRAINER`] and `**kwargs`), in its order."""
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if name not in SCHEDULER_SET_BY_TRAINER and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    ]


FLOOR = "lr_scheduler_type='cosine_with_min_lr'"
"""The scheduler a fix names for a learning-rate floor, in the config's field language (the command line's messages
name it `--lr_scheduler_type cosine_with_min_lr`: `jobs.main.config_flag_names`)."""


def _scheduler_fix(kind: str, error: Exception) -> str:
    """The fix for a scheduler `get_scheduler` refused: the floor of `cosine_with_min_lr` and its kin, or the
    keyword arguments transformers' function for `kind` takes (read from its signature)."""
    function = TYPE_TO_SCHEDULER_FUNCTION.get(SchedulerType(kind))
    if function is None:  # a type this transformers has no function for: get_scheduler's error says it
        return "choose one of transformers' SchedulerType values"
    if "min_lr" in inspect.signature(function).parameters and "min_lr" in str(error):  # no floor
        return (
            'it needs a floor: lr_scheduler_kwargs={"min_lr_rate": 0.1} (10% of learning_rate) or {"min_lr": ...} '
            "(an absolute rate)"
        )
    own = scheduler_keywords(function)
    if kind in METRIC_SCHEDULERS:  # `**kwargs`, passed to the scheduler class (torch's ReduceLROnPlateau, GreedyLR)
        cls = {"reduce_lr_on_plateau": torch.optim.lr_scheduler.ReduceLROnPlateau, "greedy": GreedyLR}[kind]
        own = [name for name in scheduler_keywords(cls) if name not in ("self", "verbose")]
        return (
            f"{kind!r} (transformers' {function.__name__}: {cls.__module__}.{cls.__name__}) takes only "
            f"{', '.join(own)} in lr_scheduler_kwargs"
        )
    floor = f" (for a floor, {FLOOR})" if "min_lr" in str(error) else ""
    if not own:
        return f"{kind!r} (transformers' {function.__name__}) takes no lr_scheduler_kwargs: drop them{floor}"
    return (
        f"{kind!r} (transformers' {function.__name__}) takes only {', '.join(own)} in lr_scheduler_kwargs, with "
        f"numbers as numbers{floor}"
    )


SCHEDULER_RATES = {"min_lr_rate": "the floor", "min_lr_ratio": "the floor", "warmup_lr_rate": "the warm-up's start"}
"""`lr_scheduler_kwargs` keys of transformers' schedulers that are a fraction of `learning_rate` (in [0, 1]):
`cosine_with_min_lr` / `cosine_warmup_with_min_lr`'s `min_lr_rate` and `warmup_lr_rate`, `warmup_stable_decay`'s
`min_lr_ratio`. transformers does not check them: 2.0 made the rate rise to twice `learning_rate` (trial 15's N17)."""
SCHEDULER_FLOORS = {"min_lr": "the floor", "lr_end": "the final rate"}
"""`lr_scheduler_kwargs` keys that are an absolute learning rate, in [0, `learning_rate`]: `min_lr` (the
`cosine_with_min_lr` family), `lr_end` (`polynomial`, which itself refuses one >= the optimizer's rate)."""


def check_scheduler_kwargs(args) -> None:
    """Refuse, when the config is built, `lr_scheduler_kwargs` that transformers would take without a word and train
    wrongly with (trial 15's N17): keys given to a scheduler that takes none (transformers' `get_scheduler` drops them
    for `constant` and `constant_with_warmup`, where `linear` refuses the same key in `train()`), and a floor or rate
    outside its range ([`SCHEDULER_RATES`] in [0, 1], [`SCHEDULER_FLOORS`] in [0, learning_rate]): a floor above the
    peak makes the rate rise above `learning_rate` as the schedule "decays", a negative one makes it negative. Other
    mistakes (an unknown key, a string for a number) are refused when the trainer builds the scheduler once
    ([`check_scheduler`]). Nothing is checked when the DeepSpeed config gives the scheduler, or for the schedulers
    stepped on a metric ([`METRIC_SCHEDULERS`], whose keys are torch's).

    Args:
        args ([`~trl_trapo.TRAPOConfig`]): `lr_scheduler_type`, `lr_scheduler_kwargs` (a dict by now: transformers
            has parsed a JSON string), `learning_rate`.

    Raises:
        ValueError: naming `lr_scheduler_type`, `lr_scheduler_kwargs`, the key, its range and the fix.
    """
    kwargs = args.lr_scheduler_kwargs
    deepspeed = getattr(getattr(args, "hf_deepspeed_config", None), "config", None) or {}
    kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    if not kwargs or not isinstance(kwargs, Mapping) or "scheduler" in deepspeed or kind in METRIC_SCHEDULERS:
        return
    function = TYPE_TO_SCHEDULER_FUNCTION.get(SchedulerType(kind))
    if function is None:
        return
    subject = f"{type(args).__name__}.lr_scheduler_type={kind!r} with lr_scheduler_kwargs={dict(kwargs)!r} is invalid"
    own = scheduler_keywords(function)
    if not own:
        try:  # transformers' own handling, as it runs: `get_scheduler` drops them for some types, passes them on to others
            optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
            get_scheduler(kind, optimizer, num_warmup_steps=0, num_training_steps=1, scheduler_specific_kwargs=kwargs)
            handling = "transformers would ignore them without a word"
        except (TypeError, ValueError):
            handling = "transformers would refuse them when training starts"
        floor = f" (for a floor, {FLOOR})" if any("lr" in str(key) for key in kwargs) else ""
        raise ValueError(
            f"{subject}: {kind!r} (transformers' {function.__name__}) takes no lr_scheduler_kwargs ({handling}). "
            f"Fix: drop lr_scheduler_kwargs, or choose a scheduler that reads them{floor}."
        )
    for key, value in kwargs.items():
        if key not in own or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # a key the scheduler does not take, or not a number: refused by `check_scheduler`
        if key in SCHEDULER_RATES and not 0 <= value <= 1:
            effect = "the rate would rise above learning_rate" if value > 1 else "the rate would turn negative"
            raise ValueError(
                f"{subject}: {key} must be in [0, 1], got {value!r}. It is {SCHEDULER_RATES[key]} as a fraction of "
                f"learning_rate={args.learning_rate:g}: {effect} (transformers does not check it). Fix: e.g. "
                f"{key}=0.1 (10% of learning_rate)."
            )
        if key in SCHEDULER_FLOORS and not 0 <= value <= args.learning_rate:
            effect = "the rate would rise above learning_rate" if value > 0 else "the rate would turn negative"
            raise ValueError(
                f"{subject}: {key} must be in [0, learning_rate={args.learning_rate:g}], got {value!r}. It is "
                f"{SCHEDULER_FLOORS[key]}, an absolute learning rate: {effect} (transformers does not check it). "
                f"Fix: e.g. {key}={args.learning_rate / 10:g} (10% of learning_rate)."
            )


def check_optimizer_covers(optimizer: torch.optim.Optimizer | None, trained: torch.nn.Module, adapter: bool) -> None:
    """Refuse a user's optimizer (`optimizers=(optimizer, ...)`) that holds none of the parameters the run trains,
    and warn when it holds only some: the `Trainer` steps it as given, so the policy would never move while the
    losses and gradient norms are logged as usual (trial 8's MD04). transformers does not check this.

    Args:
        optimizer (`torch.optim.Optimizer`, *optional*): the user's optimizer; None: nothing to check.
        trained (`nn.Module`): what the `Trainer` trains (the policy, or the policy-and-critic wrapper), as built
            (its adapter added, its frozen parts frozen).
        adapter (`bool`): the policy got its adapter from `peft_config` inside the trainer.

    Raises:
        ValueError: naming `optimizers[0]`, how many trainable tensors it holds (0) and the fix.
    """
    if optimizer is None:
        return
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trainable = [(name, p) for name, p in trained.named_parameters() if p.requires_grad]
    missing = [name for name, p in trainable if id(p) not in held]
    if trainable and len(missing) == len(trainable):
        fix = (
            "The LoRA adapter of `peft_config` is created inside the trainer, so an optimizer built before it holds "
            "none of its parameters: wrap the model yourself (`model = peft.get_peft_model(model, peft_config)`), "
            "build the optimizer over `model.parameters()` and pass both without peft_config, or drop `optimizers` "
            "(the Trainer builds one from `optim` / `learning_rate`)."
            if adapter
            else "Build it over the parameters of the model you pass as `model` (`torch.optim.AdamW(model.parameters(), "
            "lr=...)`; with a `value_model` also over its parameters), or drop `optimizers` (the Trainer builds one "
            "from `optim` / `learning_rate`)."
        )
        raise ValueError(
            f"`optimizers[0]` ({type(optimizer).__name__}) holds none of the {len(trainable)} trainable parameter "
            f"tensors of the model this run trains (e.g. {trainable[0][0]!r}): the policy would never move while the "
            f"losses were logged as usual. {fix}"
        )
    if missing:
        logger.warning(
            "`optimizers[0]` (%s) holds %d of the %d trainable parameter tensors of the model this run trains; the "
            "other %d (e.g. %r) get gradients but are never updated. Build the optimizer over all of them, or set "
            "requires_grad=False on those you mean to freeze.",
            type(optimizer).__name__,
            len(trainable) - len(missing),
            len(trainable),
            len(missing),
            missing[0],
        )


def check_neftune(args, trains_on_samples: bool) -> None:
    """Refuse `neftune_noise_alpha` (transformers' NEFTune, https://huggingface.co/papers/2310.05914) in a run that
    trains on its own samples. `Trainer.train` adds the noise to the input embeddings of every training forward, of
    every row of a mixed batch, but not to the sampler's: the RL log-probs then differ from the behaviour log-probs
    the completions were sampled with (the first PPO ratio is no longer 1; trial 8's CF08: `val/ratio` 0.997,
    `policy/approxkl_avg` 0.007 instead of 1 / 4e-14), without a word. A mixed batch's forward cannot give the
    noise to its SFT rows alone, so it is refused rather than scoped; an SFT / pretraining run keeps it.

    Args:
        args ([`~trl_trapo.TRAPOConfig`]): the configuration (read only).
        trains_on_samples (`bool`): the run has an active RL objective (RL prompts or the user's rollouts, with
            `rl_weight` > 0).

    Raises:
        ValueError: naming `neftune_noise_alpha`, its value and the fix.
    """
    alpha = getattr(args, "neftune_noise_alpha", None)
    if alpha is None or not trains_on_samples:
        return
    raise ValueError(
        f"{type(args).__name__}.neftune_noise_alpha={alpha!r} cannot be used in a run with RL: transformers' NEFTune "
        "adds noise to the input embeddings of every training forward (every objective's rows of a batch), not to "
        "the sampler's, so the RL log-probs no longer match those the completions were sampled with (the PPO ratio "
        "starts away from 1). Fix: drop neftune_noise_alpha (--neftune_noise_alpha), or use it in an SFT-only run "
        "(no train_dataset, or rl_weight=0)."
    )


def check_training_setup(args, optimizers: tuple[Any, Any] = (None, None)) -> None:
    """Check, before any model loads, what `train()` and the Trainer's constructor would otherwise fail on late
    (see the module docstring): the `report_to` trackers, and the optimizer and scheduler `args` ask for (each only
    when neither `optimizers` nor the DeepSpeed config gives it).

    Args:
        args ([`~trl_trapo.TRAPOConfig`]): the configuration (read only).
        optimizers (`tuple`): the trainer's `optimizers=(optimizer, lr_scheduler)` argument.

    Raises:
        ValueError: as [`check_report_to`], [`check_optimizer`] and [`check_scheduler`].
    """
    check_report_to(args)
    optimizer, scheduler = optimizers
    deepspeed = getattr(getattr(args, "hf_deepspeed_config", None), "config", None) or {}
    optimizer = optimizer if "optimizer" not in deepspeed else "deepspeed"  # DeepSpeed's own replaces the Trainer's
    scheduler = scheduler if "scheduler" not in deepspeed else "deepspeed"
    dry_run = check_optimizer(args) if optimizer is None else None
    if scheduler is None:
        check_scheduler(args, dry_run)


# ---- from_pretrained of a policy loaded by id (`trl_trapo.vision.load_policy`) ---------------------------------------
TASK_HEAD_CLASSES = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
"""Endings of transformers' model classes whose task head replaces the language-model head a policy samples from."""


FROM_PRETRAINED_KEYWORDS = (
    "dtype",
    "device_map",
    "attn_implementation",
    "quantization_config",
    "trust_remote_code",
    "max_memory",
    "offload_folder",
    "subfolder",
    "variant",
    "tp_plan",
    "key_mapping",
)
"""`from_pretrained` keywords read from its `**kwargs` (not in its signature), offered as "did you mean" names."""


def unknown_model_keyword(
    error: TypeError,
    kwargs: Mapping,
    config,
    model_id: str,
    arg: str = "model",
    kwargs_name: str = "model_init_kwargs",
) -> ValueError | None:
    """The error to raise for `from_pretrained(model_id, **kwargs)`'s `TypeError` about a key of `kwargs`.

    transformers passes a keyword that is neither its own nor a setting of the config to the model's constructor,
    which refuses it (`LlamaForCausalLM.__init__() got an unexpected keyword argument 'torch_dtipe'`). The keywords
    `from_pretrained` takes vary by version (some only by name, in its body), so the refusal is read from that
    error, before any weight is loaded, rather than guessed beforehand.

    Returns:
        A `ValueError` naming `kwargs_name[key]`, the model and the closest accepted name; None when `error` is
        about something else.
    """
    from transformers import PreTrainedModel

    match = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if match is None or match.group(1) not in kwargs:
        return None
    key = match.group(1)
    names = set(inspect.signature(PreTrainedModel.from_pretrained).parameters) - {"kwargs", "model_args"}
    names |= set(FROM_PRETRAINED_KEYWORDS) | set(config.to_dict())
    close = difflib.get_close_matches(key, sorted(names | {"torch_dtype"}), n=1, cutoff=0.6)
    close = ["dtype" if name == "torch_dtype" else name for name in close]  # transformers' new name of it
    return ValueError(
        f"{kwargs_name}[{key!r}] is not an argument of `from_pretrained` nor a setting of the config of "
        f"{arg}={model_id!r} ({type(config).__name__}), so the model's constructor refused it."
        + (f" Did you mean {close[0]!r}?" if close else " Drop it.")
    )


SPREAD_DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
"""`device_map` values with which accelerate spreads the model over the devices `max_memory` names (all visible
ones when it is not given)."""


def accelerator_devices(device) -> list[str]:
    """The accelerator devices (GPUs) one `device_map` or `max_memory` entry names: an int or a `torch.device` /
    string with an index is the accelerator of that index, `"cuda"` / `"cuda:N"` / `"xpu"` / ... names one; `"cpu"`,
    `"disk"`, `"meta"` name none.

    Returns:
        `[]` or one name, as `"GPU 0"` / `"'cuda:1'"`.
    """
    if isinstance(device, bool):
        return []
    if isinstance(device, int):
        return [f"GPU {device}"]
    if isinstance(device, torch.device):
        device = str(device)
    if isinstance(device, str):
        kind = device.split(":", 1)[0].strip().lower()
        if kind.isdigit():
            return [f"GPU {kind}"]
        return [] if kind in ("cpu", "disk", "meta", "") or kind in SPREAD_DEVICE_MAPS else [repr(device)]
    return []


def check_device_map(kwargs: Mapping, kwargs_name: str = "model_init_kwargs") -> None:
    """Refuse, before anything loads, a `device_map` that places the model on a GPU (accelerator) when none is
    visible: `"cuda"`, `"cuda:1"`, `0`, `{"": 0}`, or `"auto"` (`"balanced"`, ...) with a `max_memory` naming GPUs.
    Left to `from_pretrained`, it failed in torch (`AssertionError: Torch not compiled with CUDA enabled`) or
    transformers (`RuntimeError: Cannot access accelerator device when none is available`), naming neither
    (trial 15's N36). A `device_map` of `"cpu"`, or `"auto"` alone, loads on the CPU and is left alone.

    Args:
        kwargs (`Mapping`): the `from_pretrained` keyword arguments.
        kwargs_name (`str`): how the message names them (`model_init_kwargs`, `teacher_model_init_kwargs`).

    Raises:
        ValueError: naming `kwargs_name['device_map']`, its value, the device it names and the fix (drop it: the
            trainer places the model).
    """
    if "device_map" not in kwargs:
        return
    device_map = kwargs["device_map"]
    given = f"{kwargs_name}['device_map']={device_map!r}"
    if isinstance(device_map, str) and device_map in SPREAD_DEVICE_MAPS:
        memory = kwargs.get("max_memory")
        named = [d for key in (memory if isinstance(memory, Mapping) else {}) for d in accelerator_devices(key)]
        given += f" with max_memory={memory!r}"
    elif isinstance(device_map, Mapping):
        named = [d for device in device_map.values() for d in accelerator_devices(device)]
    else:
        named = accelerator_devices(device_map)
    if not named:
        return
    wants_cuda = any(name.startswith("'cuda") for name in named)
    if torch.cuda.is_available() if wants_cuda else torch.accelerator.is_available():
        return
    raise ValueError(
        f"{given} (`--{kwargs_name}`) places the model on {named[0]}, but no GPU is visible on this machine "
        f"(torch.{'cuda' if wants_cuda else 'accelerator'}.is_available() is False). Fix: drop device_map"
        + (" and max_memory" if "max_memory" in kwargs else "")
        + ": the trainer places the model on the run's device itself (under accelerate or DeepSpeed a device_map "
        "is not used for training)."
    )


def check_model_loading(
    model_id: str, config, kwargs: Mapping, arg: str = "model", kwargs_name: str = "model_init_kwargs"
):
    """Refuse, with the model's config read but no weights, what `from_pretrained(model_id, **kwargs)` of a policy
    would fail on (or silently get wrong) with a message naming neither the argument nor the fix.

    Checked: `attn_implementation="flash_attention_2"` / `"flash_attention_3"` without its package or a
    CUDA device; a `device_map` naming a GPU when none is visible ([`check_device_map`]); a bitsandbytes `quantization_config` (`--load_in_4bit` / `--load_in_8bit`) without bitsandbytes;
    a checkpoint whose `architectures` are all task heads (`*ForSequenceClassification`, ...), whose language-model
    head would be newly initialised; and an encoder-decoder checkpoint (T5) that `AutoModelForCausalLM` cannot load.

    Args:
        model_id (`str`): the model's id or path, as given.
        config (`PretrainedConfig`): its config (`AutoConfig.from_pretrained(model_id)`).
        kwargs (`Mapping`): the `from_pretrained` keyword arguments.
        arg, kwargs_name (`str`): how the message names the model and its keyword arguments.

    Raises:
        ValueError: naming the argument, the value and the fix (with the command-line flag that sets it).
    """
    from transformers.utils import is_bitsandbytes_available, is_flash_attn_2_available, is_flash_attn_3_available

    attention = kwargs.get("attn_implementation")
    flash = {"flash_attention_2": is_flash_attn_2_available, "flash_attention_3": is_flash_attn_3_available}
    if attention in flash and not (torch.cuda.is_available() and flash[attention]()):
        problem = "no CUDA GPU is available" if not torch.cuda.is_available() else "the flash-attn package is missing"
        raise ValueError(
            f"{kwargs_name}['attn_implementation']={attention!r} (`--attn_implementation`) cannot be used: {problem}. "
            "Use 'sdpa' (PyTorch's fused attention, any device) or 'eager', or install flash-attn on a CUDA machine."
        )
    check_device_map(kwargs, kwargs_name)
    quantization = kwargs.get("quantization_config")
    bits = [
        n
        for n in (4, 8)
        if getattr(quantization, f"load_in_{n}bit", None)
        or (isinstance(quantization, Mapping) and quantization.get(f"load_in_{n}bit"))
    ]
    if bits and not is_bitsandbytes_available():
        raise ValueError(
            f"{kwargs_name}['quantization_config'] loads the model in {bits[0]}-bit (`--load_in_{bits[0]}bit`), which "
            "needs the bitsandbytes package: `pip install bitsandbytes` (a CUDA GPU is needed for most of it), or "
            f"drop --load_in_{bits[0]}bit."
        )
    architectures = getattr(config, "architectures", None) or []
    if architectures and all(name.endswith(TASK_HEAD_CLASSES) for name in architectures):
        raise ValueError(
            f"{arg}={model_id!r} is a {architectures[0]} checkpoint (config.json's `architectures`): loaded as a "
            "policy, its task head is dropped and a language-model head newly initialised. Did you swap the policy "
            "and the reward model (`--model_name_or_path` / `--reward_model_name_or_path`)? Give a causal LM as the "
            "policy; to train this one anyway, load it yourself (`AutoModelForCausalLM.from_pretrained(...)`) and "
            "pass the model."
        )
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    # an encoder-decoder checkpoint with no causal-LM class: transformers' "Unrecognized configuration class" listed
    # every config it knows (a loaded one is refused by `arguments.check_trainer_arguments`, trial 9's MO04)
    if getattr(config, "is_encoder_decoder", False) and type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(
            f"{arg}={model_id!r} is an encoder-decoder model ({type(config).__name__}, `is_encoder_decoder=True`): "
            "TRAPO trains decoder-only causal language models (`AutoModelForCausalLM`), and this architecture has "
            "none. Use a decoder-only model (e.g. Qwen, Llama, SmolLM)."
        )


def check_train_call(resume_from_checkpoint, trial=None) -> str | bool | None:
    """Refuse a `train()` call that cannot train, before anything of the run is read or written (`TRAPOTrainer.train`
    calls it first).

    Args:
        resume_from_checkpoint: `train()`'s argument (a path, a bool or None).
        trial: `train()`'s `trial` (transformers' hyperparameter-search handle: an optuna trial or a dict of values).

    Returns:
        `resume_from_checkpoint`, a `pathlib.Path` (any `os.PathLike`) as its `os.fspath`: the checks and messages
        after this one compare and show text (trial 13's N31).

    Raises:
        TypeError: `resume_from_checkpoint` is neither a path, a bool nor None (e.g. an int).
        ValueError: `trial` is not None. transformers applies a trial's values only inside `hyperparameter_search`,
            which TRAPOTrainer does not support ([`refuse_hyperparameter_search`]); outside it, transformers records
            a dict only with ray or wandb installed (its values unused) and otherwise fails in the first step's
            setup, after the model is prepared, with "Unknown type for trial" (trial 10's TM07).
        RuntimeError: gradients are disabled in this thread (`torch.is_grad_enabled()` is False: inside
            `torch.no_grad()`, `torch.inference_mode()` or after `torch.set_grad_enabled(False)`), where the first
            backward would fail with torch's "element 0 of tensors does not require grad" after the first rollout.
    """
    if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint, (str, bool, os.PathLike)):
        raise TypeError(
            f"resume_from_checkpoint={resume_from_checkpoint!r} ({type(resume_from_checkpoint).__name__}) is not a "
            "path: pass a checkpoint folder's path, True (the newest complete checkpoint in output_dir) or None."
        )
    if trial is not None:
        example = (
            ", ".join(f"{key}={value!r}" for key, value in trial.items())
            if isinstance(trial, dict) and trial
            else "learning_rate=..."
        )
        raise ValueError(
            f"train(trial={trial!r}): `trial` is the hyperparameter search's handle, and TRAPOTrainer has no "
            "hyperparameter_search (transformers applies a trial's values only inside one). Fix: drop `trial` and "
            f"set the values on the config (TRAPOConfig({example}, ...)); to compare settings, run one trainer "
            "per setting."
        )
    if torch.is_inference_mode_enabled():  # `set_grad_enabled(True)` does not lift it: tensors are still inference
        raise RuntimeError(
            "train() was called inside `torch.inference_mode()`: every tensor it creates is an inference tensor, "
            "which autograd cannot train (torch.set_grad_enabled(True) does not change that). Fix: call "
            "trainer.train() outside the `with torch.inference_mode():` block (the trainer itself may stay as built: "
            "it builds its tensors outside inference mode); to evaluate without gradients, use `torch.no_grad()`."
        )
    if not torch.is_grad_enabled():
        raise RuntimeError(
            "train() was called with gradients disabled: torch.is_grad_enabled() is False, so no loss could be "
            "backpropagated. Fix: call trainer.train() outside `with torch.no_grad():`, or call "
            "torch.set_grad_enabled(True) first."
        )
    path = isinstance(resume_from_checkpoint, os.PathLike)
    return os.fspath(resume_from_checkpoint) if path else resume_from_checkpoint


def built_outside_inference_mode(init: Callable) -> Callable:
    """Wrap a trainer's `__init__` so that, called inside `torch.inference_mode()` (e.g. a notebook cell wrapped in
    it), it runs with inference mode off, as if called outside the block: the tensors it creates (the schedules' KL
    window, optimizer and objective state, a reference copy of the policy) are then ordinary tensors that training,
    outside the block, may update in place. Otherwise they were inference tensors, and the first optimizer step failed
    with torch's "Inplace update to inference tensor outside InferenceMode" (trial 14's N52). Outside inference mode
    (grad mode on or off, e.g. `torch.no_grad()`) the call is unchanged. A model the user built inside the block has
    inference-tensor parameters all the same: it is refused by name ([`~trl_trapo.models.check_not_inference_tensors`]).
    """

    @functools.wraps(init)
    def init_outside_inference_mode(*args, **kwargs):
        if not torch.is_inference_mode_enabled():
            return init(*args, **kwargs)
        with torch.inference_mode(False):
            return init(*args, **kwargs)

    return init_outside_inference_mode


# ---- the config after construction -------------------------------------------------------------------------------
LIVE_FIELDS = frozenset(
    {
        # the optimizer and the learning-rate schedule: transformers builds them when `train()` starts
        "learning_rate",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "optim",
        "optim_args",
        "max_grad_norm",
        "lr_scheduler_type",
        "lr_scheduler_kwargs",
        "warmup_steps",
        # when the Trainer logs, evaluates and saves, and what a save keeps (its flow at every step, its save)
        "logging_strategy",
        "logging_steps",
        "logging_first_step",
        "logging_nan_inf_filter",
        "include_num_input_tokens_seen",
        "run_name",
        "eval_strategy",
        "eval_steps",
        "eval_delay",
        "eval_on_start",
        "per_device_eval_batch_size",
        "metric_for_best_model",
        "greater_is_better",
        "load_best_model_at_end",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "save_only_model",
        "save_on_each_node",
        "ignore_data_skip",
        # the step and its dataloader (of TRAPO's step tickets: its rows are the plan's)
        "activation_checkpointing",
        "torch_empty_cache_steps",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "debug",
    }
)
"""Fields of `transformers.TrainingArguments` that a change to `trainer.args` after construction still reaches:
transformers' `Trainer` reads them when `train()` runs (its optimizer and scheduler, the loop's intervals, the
dataloader, the saves), and TRAPO reads them at construction at most to check or warn. Every other field is read once,
at construction, by TRAPO (its own fields: `response_length` sizes the rollouts' generation config, `num_generations`
and `per_device_train_batch_size` the plan's rows, `kl_coef` the KL controller; `max_steps` and `num_train_epochs` the
plan itself — its curriculum phases, schedules and pools —, `seed`, `output_dir`, whose finished-run check runs at
construction) or by transformers (`report_to`, `bf16`, `push_to_hub`, `disable_tqdm`, ...): a change would not be used,
or only in part. How they were told apart: tests/test_config_immutability.py records every read of the config during
construction and `train()`."""

ARGS_AT_CONSTRUCTION: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Each trainer's config as its construction left it (field -> a copy of its value), for [`check_args_unchanged`]."""


def live_fields(args) -> frozenset[str]:
    """[`LIVE_FIELDS`], less those that `args` makes TRAPO read at construction too: `learning_rate` (and
    `lr_scheduler_type`) with `rl_phase_learning_rate` (its scale is their ratio, fixed then:
    `schedules.PhaseValues`), `learning_rate` and the Adam settings with `weighting="uncertainty"` / `"gradnorm"`
    (the weighting's own optimizer takes them: `weighting.build_weighting`)."""
    fixed = set()
    if getattr(args, "rl_phase_learning_rate", None) is not None:
        fixed |= {"learning_rate", "lr_scheduler_type"}
    if getattr(args, "weighting", None) in ("uncertainty", "gradnorm"):
        fixed |= {"learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon"}
    return LIVE_FIELDS - fixed


def same_value(a: Any, b: Any) -> bool:
    """Whether two config values are equal (`==`; only the same object, for values whose `==` raises, e.g. tensors)."""
    try:
        return bool(a == b)
    except Exception:
        return a is b


def snapshot_args(args) -> dict[str, Any]:
    """Every init field of the config `args` -> a deep copy of its value, so that an in-place change
    (`trainer.args.reward_weights[0] = 2`) shows too; the value itself where a copy would not compare equal to it (an
    object without value equality, or that cannot be copied): compared by identity then."""
    values = {}
    for f in dataclasses.fields(args):
        if f.init:
            value = getattr(args, f.name)
            try:
                copied = copy.deepcopy(value)
            except Exception:
                copied = value
            values[f.name] = copied if same_value(copied, value) else value
    return values


def changed_fields(args, snapshot: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The fields of `args` whose value differs from `snapshot` ([`snapshot_args`]): field -> (old, new)."""
    changed = {}
    for name, old in snapshot.items():
        new = getattr(args, name, None)
        if not same_value(old, new):
            changed[name] = (old, new)
    return changed


FIELD_FIXES = {
    "resume_from_checkpoint": "pass it to train() instead: `trainer.train(resume_from_checkpoint=...)` (train() "
    "reads its argument, never this field)",
}
"""Fields changed after construction whose fix is not a new trainer -> the fix."""


def check_args_unchanged(args, snapshot: Mapping[str, Any] | None, trainer_class: str = "TRAPOTrainer") -> None:
    """Refuse a `train()` whose config was changed, since the trainer was built, in a field that the change would not
    reach ([`live_fields`]): the run used the construction-time value without a word (trial 15's N33:
    `trainer.args.response_length = 4` still sampled 8-token completions). A field that `train()` reads when it runs
    (`learning_rate`, `logging_steps`, `save_steps`, ...) may be changed.

    Args:
        args ([`TRAPOConfig`]): `trainer.args` now.
        snapshot (`Mapping`): [`snapshot_args`] of it at the end of construction (None: nothing to compare).
        trainer_class (`str`): the trainer's class, named in the fix.

    Raises:
        ValueError: naming each such field, its value at construction -> now, and the fix (a new trainer).
    """
    if snapshot is None:
        return
    live = live_fields(args)
    fixed = {name: values for name, values in changed_fields(args, snapshot).items() if name not in live}
    if not fixed:
        return

    def shown(name: str, value: Any) -> str:
        return "<hidden>" if name == "hub_token" and value else repr(value)

    listed = "; ".join(f"{name}: {shown(name, old)} -> {shown(name, new)}" for name, (old, new) in fixed.items())
    example = ", ".join(f"{name}={shown(name, new)}" for name, (_, new) in list(fixed.items())[:2])
    if set(fixed) <= set(FIELD_FIXES):
        fixes = "; ".join(f"{name}: {FIELD_FIXES[name]}" for name in fixed)
        raise ValueError(f"trainer.args was changed after the trainer was built ({listed}). Fix: {fixes}.")
    raise ValueError(
        f"trainer.args was changed after the trainer was built ({listed}). "
        f"{'These fields are' if len(fixed) > 1 else 'This field is'} read once, when the trainer is built (such "
        "fields size its rollouts, batches, plan and controllers), so the new value would not be used, or only in "
        f"part. Fix: build a new trainer with the new config, e.g. `{trainer_class}(..., "
        f"args=dataclasses.replace(trainer.args, {example}))`, or set it back. Fields that train() reads when it runs "
        "(learning_rate, logging_steps, save_steps, ...) may be changed in place."
    )


def remembers_args(init: Callable) -> Callable:
    """Wrap a trainer's `__init__` so that its config, as construction leaves it, is remembered
    ([`ARGS_AT_CONSTRUCTION`]) for [`refuses_changed_args`]."""

    @functools.wraps(init)
    def init_and_remember(trainer, *args, **kwargs):
        init(trainer, *args, **kwargs)
        ARGS_AT_CONSTRUCTION[trainer] = snapshot_args(trainer.args)

    return init_and_remember


def refuses_changed_args(train: Callable) -> Callable:
    """Wrap a trainer's `train` so that it first refuses a config changed since construction in a field the change
    would not reach ([`check_args_unchanged`])."""

    @functools.wraps(train)
    def train_with_unchanged_args(trainer, *args, **kwargs):
        check_args_unchanged(trainer.args, ARGS_AT_CONSTRUCTION.get(trainer), type(trainer).__name__)
        return train(trainer, *args, **kwargs)

    return train_with_unchanged_args


def refuse_hyperparameter_search(trainer, *args, **kwargs):
    """`TRAPOTrainer.hyperparameter_search`: not supported. transformers' search builds a fresh model for every trial
    from `model_init`, which `TRAPOTrainer` does not take (it builds its policy, reference and value models once, from
    `model=`); without this refusal the call ended in transformers' "No hyperparameter search backend available" (or,
    with optuna installed, "you need to pass your model through a model_init function").

    Raises:
        NotImplementedError: always, saying what to do instead.
    """
    raise NotImplementedError(
        f"{type(trainer).__name__} does not support hyperparameter_search(): transformers' search rebuilds the model "
        "for every trial from `model_init`, and TRAPOTrainer builds its models once, from `model=`. Fix: run one "
        "trainer per setting (a new TRAPOConfig and TRAPOTrainer each, e.g. in a loop or an optuna objective that "
        "builds them) and compare their trainer.evaluate() results."
    )
