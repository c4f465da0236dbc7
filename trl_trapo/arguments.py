# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The types of `TRAPOTrainer`'s constructor arguments, checked before anything loads.

A value of the wrong type (a number for `model`, a dict for `peft_config`, a bare callback for `callbacks`) would
otherwise travel to the first library that touches it — TRL's `disable_dropout_in_model`, TRL's `is_async_callable`,
PEFT's `get_peft_model`, transformers' `Trainer.__init__` — and fail there with an `AttributeError` about an attribute
the user never named, often after the policy has loaded and the datasets are tokenized. [`check_trainer_arguments`]
refuses it first, naming the argument, the value and what to pass. The accepted types are TRL 1.16's (`GRPOTrainer`,
`transformers.Trainer`), plus tuples wherever a list is taken. A reward or value model must also have the head TRAPO
reads its score from, with one output ([`~trl_trapo.models.check_score_head`]): a causal LM, or `num_labels=2`, would
fail at the first step or, worse, train on its first label. One model passed in two roles where a loss term would
then vanish (`ref_model=model`, a critic that is a frozen reward model) is refused ([`check_distinct_models`]).
Arguments with checks of their own (the datasets,
`tools`' entries, `environment_factory`, `rollout_func`, `rollout_source`, `objectives`) are left to them.

Positional arguments in TRL `GRPOTrainer`'s or `SFTTrainer`'s order, which `TRAPOTrainer`'s leaves after
`eval_dataset` (a tokenizer landing in `pretrain_dataset`), are refused before Python binds them, naming the keyword
to pass each by ([`refuse_trl_positional_order`]).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import os
import pkgutil
import re
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import extract_model_from_parallel, is_compiled_module
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin, TrainerCallback

from .models import check_not_inference_tensors, check_score_head
from .rewards import REWARD_FUNCTIONS
from .setup_checks import TASK_HEAD_CLASSES


REWARD_FUNC = (
    "a reward function `f(completions, **kwargs) -> list[float]` (sync or async), a sequence-classification model "
    "(`AutoModelForSequenceClassification`, num_labels=1), or the id / local path of one (str or pathlib.Path)"
)
TOKENIZER = "a tokenizer or processor (`AutoTokenizer.from_pretrained(...)` / `AutoProcessor.from_pretrained(...)`)"


def _shown(value: Any) -> str:
    """`type (repr)`, the repr on one line (a module's spans many) cut to 60 characters."""
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} ({text[:57] + '...' if len(text) > 60 else text})"


def _refuse(name: str, value: Any, expected: str, fix: str = "") -> None:
    raise TypeError(f"`{name}` must be {expected}; got {_shown(value)}.{' ' + fix if fix else ''}")


def _is_reward_func(value: Any) -> bool:
    return _is_path(value) or isinstance(value, nn.Module) or callable(value)


def _is_tokenizer(value: Any) -> bool:
    return isinstance(value, (PreTrainedTokenizerBase, ProcessorMixin))


PATH_ARGUMENTS = ("model", "reward_funcs", "reward_model", "teacher_model")
"""The trainer arguments that take a model's id or local path (`reward_funcs` in each entry)."""


def _is_path(value: Any) -> bool:
    """A path as text or as an `os.PathLike` whose `os.fspath` is text (`pathlib.Path`)."""
    return isinstance(value, str) or (isinstance(value, os.PathLike) and isinstance(os.fspath(value), str))


def paths_as_strings(arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` (the trainer's, by name) with an `os.PathLike` (`pathlib.Path`) in a [`PATH_ARGUMENTS`] argument,
    or in an entry of `reward_funcs`, replaced by its `os.fspath`, as `from_pretrained` reads it: `model=Path(folder)`
    was refused ("Pass it as a string", trial 13's N31) and the checks after this one compare and show text.

    Returns:
        A new dict; `arguments` is not changed.
    """

    def text(value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) and _is_path(value) else value

    converted = {name: text(arguments[name]) for name in PATH_ARGUMENTS if name in arguments}
    if isinstance(arguments.get("reward_funcs"), (list, tuple)):
        converted["reward_funcs"] = type(arguments["reward_funcs"])(text(e) for e in arguments["reward_funcs"])
    return {**arguments, **converted}


def _check_model(
    name: str, value: Any, loadable: bool, example: str = "AutoModelForCausalLM.from_pretrained(...)"
) -> None:
    """`value` is an `nn.Module` with weights (or, when `loadable`, a model id / local path: a `str` or `os.PathLike`)."""
    ok = isinstance(value, nn.Module) or (loadable and _is_path(value))
    if not ok:
        expected = f"a loaded model (`nn.Module`, e.g. `{example}`)"
        fix = ""
        if _is_path(value):  # a path where a loaded model is needed: load it
            fix = f"Load it first: `{example.replace('...', repr(os.fspath(value)), 1)}`."
        _refuse(name, value, f"{expected} or its id / local path (str or pathlib.Path)" if loadable else expected, fix)
    _check_weights(name, value)


def _check_weights(name: str, value: Any) -> None:
    """Refuse a module whose parameters or buffers are on the meta device (shapes, no data: built under
    `torch.device("meta")` or accelerate's `init_empty_weights()`): the `Trainer` moving it to the device failed with
    torch's "Cannot copy out of meta tensor; no data!" (trial 9's MO02), a reward model scored nothing. Left alone:
    the processes other than each machine's first under FSDP's `cpu_ram_efficient_loading`, where transformers'
    `from_pretrained` itself leaves the weights on the meta device and FSDP copies them from the first."""
    from transformers.integrations import is_fsdp_enabled

    if not isinstance(value, nn.Module) or (is_fsdp_enabled() and os.environ.get("LOCAL_RANK", "0") != "0"):
        return
    empty = next((n for n, t in [*value.named_parameters(), *value.named_buffers()] if t.is_meta), None)
    if empty is not None:
        raise ValueError(
            f"`{name}` ({type(value).__name__}) has tensors on the meta device, e.g. {empty!r}: shapes without "
            "weights, as a model built under `torch.device('meta')` or accelerate's `init_empty_weights()` is. Load "
            "its weights first: `from_pretrained(...)`, or `model.to_empty(device='cpu')` then "
            "`model.load_state_dict(state_dict)` (or `model.init_weights()` for a model trained from scratch)."
        )


def _check_policy(value: Any) -> None:
    _check_model("model", value, loadable=True)
    if not isinstance(value, nn.Module):
        return
    if type(value).__name__.endswith(TASK_HEAD_CLASSES):
        raise ValueError(
            f"`model` is a {type(value).__name__}: a policy generates text, so it needs a language-model head, which "
            "this class replaces by a classification head. Did you swap the policy and the reward model? Pass a causal "
            "LM (`AutoModelForCausalLM.from_pretrained(...)`) as `model`, and a sequence-classification model as "
            "`reward_funcs` or `value_model`."
        )
    _check_language_model("model", value)


def _check_language_model(name: str, value: Any) -> None:
    """`value` (an `nn.Module`) is a transformers model with a language-model head, or a PEFT model wrapping one.

    TRAPO samples with the policy's `generate`, reads every causal LM's `config`, `get_input_embeddings()` /
    `get_output_embeddings()` and calls it with `input_ids=`; a plain torch module failed with torch's AttributeError
    (`model`, `teacher_model`, at construction) or TypeError (`ref_model`, at the first step)."""
    from peft import PeftModel  # optional capabilities are imported where they are used

    if not isinstance(value, nn.Module):
        return
    base = value.get_base_model() if isinstance(value, PeftModel) else value
    if is_compiled_module(value):  # `torch.compile(model)`: a wrapper, not "not a transformers model" (trial 15's N28)
        inner = type(extract_model_from_parallel(value, keep_torch_compile=False)).__name__  # the compiled model
        uses = "samples with its `generate`, saves it with `save_pretrained`, " if name == "model" else ""
        fix = (
            " and set `torch_compile=True` in the config for the trainer to compile the model it trains (as "
            "transformers' Trainer does: it compiles the model after wrapping it, and saves the model itself)."
            if name == "model"
            else f"; TRAPO runs the {'reference' if name == 'ref_model' else 'teacher'} as given (`torch_compile=True`"
            " compiles the trained policy only)."
        )
        raise TypeError(
            f"`{name}` is a `torch.compile` wrapper (OptimizedModule) of a {inner}: TRAPO reads the model's `config`, "
            f"{uses}and calls it with `input_ids=`, on the model itself, not a wrapper. Fix: pass the model itself "
            f"(`{name}._orig_mod`, or the model before `torch.compile`){fix}"
        )
    if not isinstance(base, PreTrainedModel) or not base.can_generate():
        what = (
            "a transformers model without a language-model head"
            if isinstance(base, PreTrainedModel)
            else ("not a transformers model")
        )
        uses = "samples with `model.generate`, " if name == "model" else ""
        raise TypeError(
            f"`{name}` must be a transformers language model (a `PreTrainedModel` with a language-model head, e.g. "
            "`AutoModelForCausalLM.from_pretrained(...)`, or a PEFT model wrapping one)"
            + (" or its id / local path (str or pathlib.Path)" if name != "ref_model" else "")
            + f"; got {_shown(value)}: {what}. TRAPO {uses}reads its `config` and `get_input_embeddings()`, calls it "
            "with `input_ids=` and saves the policy with `save_pretrained`. Fix: load the model with its "
            "language-model head (`AutoModelForCausalLM`, or `AutoModelForImageTextToText` for a vision-language "
            "model), or write your architecture as a `PreTrainedModel` + `GenerationMixin` subclass "
            "(https://huggingface.co/docs/transformers/custom_models)."
        )
    if getattr(base.config, "is_encoder_decoder", False):  # T5's forward refused `input_ids=` alone at train()
        raise ValueError(
            f"`{name}` is an encoder-decoder model ({type(base).__name__}, `config.is_encoder_decoder=True`): TRAPO "
            "trains decoder-only causal language models, whose forward reads the prompt and the completion as one "
            "sequence (`input_ids=`). Use a decoder-only model (`AutoModelForCausalLM.from_pretrained(...)`, e.g. "
            "Qwen, Llama, SmolLM; `AutoModelForImageTextToText` for a vision-language model)."
        )


def _check_peft_config(value: Any) -> None:
    from peft import PeftConfig

    if isinstance(value, PeftConfig):
        task_type = getattr(getattr(value, "task_type", None), "value", getattr(value, "task_type", None))
        if task_type not in (None, "CAUSAL_LM"):  # PEFT would wrap the policy in PeftModelFor<task_type>
            raise ValueError(
                f"`peft_config` has task_type={task_type!r}, but the adapter is put on the policy, a causal language "
                f"model: PEFT would wrap it for another task (saved and reloaded as a {task_type} adapter). Use "
                "task_type='CAUSAL_LM' (`peft.LoraConfig(task_type='CAUSAL_LM', ...)`, `--lora_task_type CAUSAL_LM`)."
            )
        if getattr(value, "inference_mode", False):  # PEFT adds the adapter frozen: nothing trains (trial 15's N27)
            raise ValueError(
                f"`peft_config` ({type(value).__name__}) has peft_config.inference_mode=True, which adds the adapter "
                "frozen (requires_grad=False on its weights, as for serving it): the run would log its losses while "
                "the policy never moved. Fix: set inference_mode=False (the default; inference snippets set it True), "
                f"e.g. `peft.{type(value).__name__}(..., inference_mode=False)`."
            )
        if value.is_prompt_learning:  # virtual tokens lengthen the logits past the completion mask: IndexError later
            raise ValueError(
                f"`peft_config` is a prompt-learning config ({type(value).__name__}), which TRAPO does not support: "
                "its virtual tokens lengthen the model's logits past the token masks TRAPO scores. Use a LoRA-style "
                "adapter instead (`peft.LoraConfig`, `AdaLoraConfig`, `IA3Config`, ...), e.g. "
                "`peft.LoraConfig(r=16, lora_alpha=32, target_modules='all-linear')`."
            )
        _check_lora_numbers(value)
        return
    fix = (
        f"Build the config object: `peft.LoraConfig(**{value!r})` (TRL's trainers refuse a dict too)."
        if isinstance(value, dict)
        else "Pass a PEFT config, e.g. `peft.LoraConfig(r=16, lora_alpha=32, target_modules='all-linear')`."
    )
    _refuse("peft_config", value, "a `peft.PeftConfig` (e.g. `peft.LoraConfig`)", fix)


def _check_lora_numbers(value: Any) -> None:
    """Refuse, naming the field, the LoRA numbers PEFT or torch refuse only when the adapter is built (PEFT:
    "`r` should be a positive integer"; torch: "dropout probability has to be between 0 and 1") or silently misuse
    (`lora_alpha` 0 scales the update to nothing, a negative one flips it): the same rules as the command line's
    `--lora_r` / `--lora_alpha` / `--lora_dropout` (`trl_trapo.jobs.main.check_lora_arguments`)."""
    from peft import AdaLoraConfig, LoraConfig

    if not isinstance(value, LoraConfig):
        return
    ranks = {} if isinstance(value, AdaLoraConfig) else {"r": value.r}  # AdaLoRA sets its ranks from init_r
    ranks.update({f"rank_pattern[{k!r}]": v for k, v in (value.rank_pattern or {}).items()})
    for field, r in ranks.items():
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(
                f"peft_config.{field}={r!r} is invalid: the LoRA rank must be a whole number >= 1. Fix: e.g. "
                "`peft.LoraConfig(r=16, ...)`."
            )
    alphas = {"lora_alpha": value.lora_alpha}
    alphas.update({f"alpha_pattern[{k!r}]": v for k, v in (value.alpha_pattern or {}).items()})
    for field, alpha in alphas.items():
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ValueError(
                f"peft_config.{field}={alpha!r} is invalid: it must be > 0 (the adapter's update is scaled by "
                "lora_alpha / r: 0 trains nothing, a negative value flips it). Fix: e.g. `lora_alpha=32` (twice r is "
                "common)."
            )
    dropout = value.lora_dropout
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(
            f"peft_config.lora_dropout={dropout!r} is invalid: it must be a probability in [0, 1) (1 drops every "
            "input of the adapter). Fix: e.g. `lora_dropout=0.05`, or 0 for none."
        )


def _check_entries(name: str, checks: list[Callable[[], None]]) -> None:
    """Run the checks of the entries of the list argument `name`, each independent of the others, and refuse every
    entry that fails in one message: `reward_funcs=[lambda, 42, "exact_match"]` was refused one entry per run.

    Raises:
        TypeError / ValueError: one entry's error as it is; for several, the first one's type with each entry's
            message on a line of its own.
    """
    errors = []
    for check in checks:
        try:
            check()
        except (TypeError, ValueError) as error:
            errors.append(error)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise type(errors[0])(
            f"`{name}` has {len(errors)} entries that cannot be used, each with its fix:"
            + "".join(f"\n- {error}" for error in errors)
        )


def _check_reward_funcs(value: Any) -> None:
    entries = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
    _check_entries(
        "reward_funcs",
        [
            functools.partial(_check_reward, "reward_funcs" if index is None else f"reward_funcs[{index}]", entry)
            for index, entry in entries
        ],
    )


DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")  # `module.function`, as the command line's --reward_funcs


def _imported(value: str) -> Any:
    """What the dotted import path `value` names (`pkgutil.resolve_name`, importing its module), or None when it is
    not one or does not import: then it is left to be read as a Hub id / local path."""
    if not DOTTED_NAME.fullmatch(value):
        return None
    try:
        return pkgutil.resolve_name(value)
    except Exception:  # not a module, no such attribute, or an error raised while importing it
        return None


def _check_reward(name: str, value: Any) -> None:
    if isinstance(value, type):  # callable, but calling it builds an instance (trial 14's C13)
        raise TypeError(
            f"`{name}` is the class {value.__module__}.{value.__qualname__}, not a reward function: each batch would "
            f"call the class itself, building an instance with the reward keywords. Pass an instance whose "
            f"`__call__(completions, **kwargs)` returns the rewards (`{value.__name__}(...)`), or a function."
        )
    if not _is_reward_func(value):
        _refuse(name, value, REWARD_FUNC)
    if isinstance(value, str) and value in REWARD_FUNCTIONS and not os.path.exists(value):
        function = REWARD_FUNCTIONS[value].__name__
        raise ValueError(
            f"{name}={value!r} is the command line's name of a built-in reward function; in Python a string is a "
            f"reward model's Hub id or local path. Pass the function: `from trl_trapo.rewards import {function}`, "
            f"then `reward_funcs=[{function}]`."
        )
    if isinstance(value, str) and not os.path.exists(value) and callable(target := _imported(value)):
        # trial 14's N23: TRL's GRPOTrainer, too, reads every string as a reward model (`from_pretrained`)
        module, _, attribute = value.rpartition(".")
        instance = f"{attribute}(...)" if isinstance(target, type) else attribute
        raise ValueError(
            f"{name}={value!r} is the dotted import path of a {'class' if isinstance(target, type) else 'function'} "
            "(the command line's --reward_funcs takes that form); in Python a string is a reward model's Hub id or "
            f"local path, as in TRL's GRPOTrainer. Pass the {'instance' if isinstance(target, type) else 'function'}"
            f": `from {module} import {attribute}`, then `reward_funcs=[{instance}]`."
        )
    if isinstance(value, nn.Module):
        _check_weights(name, value)
        check_score_head(value, name)


def _check_value_model(value: Any) -> None:
    example = "AutoModelForSequenceClassification.from_pretrained(..., num_labels=1)"
    _check_model("value_model", value, loadable=False, example=example)
    check_score_head(value, "value_model")


def _check_reward_processing_classes(value: Any) -> None:
    entries = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
    _check_entries(
        "reward_processing_classes",
        [
            functools.partial(
                _refuse,
                "reward_processing_classes" if index is None else f"reward_processing_classes[{index}]",
                entry,
                f"{TOKENIZER}, None, or a list of them (one per reward)",
            )
            for index, entry in entries
            if entry is not None and not _is_tokenizer(entry)
        ],
    )


def _check_callbacks(value: Any) -> None:
    expected = "a list of `transformers.TrainerCallback` instances or classes"
    if not isinstance(value, (list, tuple)):
        fix = "Wrap it in a list: `callbacks=[...]`." if _is_callback(value) else ""
        _refuse("callbacks", value, expected, fix)
    _check_entries(
        "callbacks",
        [
            functools.partial(
                _refuse, f"callbacks[{index}]", entry, "a `transformers.TrainerCallback` instance or class"
            )
            for index, entry in enumerate(value)
            if not _is_callback(entry)
        ],
    )


def _is_callback(value: Any) -> bool:
    return isinstance(value, TrainerCallback) or (isinstance(value, type) and issubclass(value, TrainerCallback))


def _check_optimizers(value: Any) -> None:
    expected = "a pair `(optimizer, lr_scheduler)`, each a torch object or None (transformers.Trainer's contract)"
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        fix = "Pass `optimizers=(optimizer, None)`." if isinstance(value, torch.optim.Optimizer) else ""
        _refuse("optimizers", value, expected, fix)
    optimizer, scheduler = value
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        _refuse("optimizers[0]", optimizer, "a `torch.optim.Optimizer` or None")
    if scheduler is not None and not callable(getattr(scheduler, "step", None)):
        _refuse("optimizers[1]", scheduler, "a learning-rate scheduler (`torch.optim.lr_scheduler.*`) or None")


def _check_tools(value: Any) -> None:
    if not isinstance(value, (list, tuple)):
        fix = "Wrap it in a list: `tools=[...]`." if callable(value) else ""
        _refuse("tools", value, "a list of functions (TRL's `tools=`)", fix)


# argument -> its check (called with the value when it is not None)
CHECKS: dict[str, Callable[[Any], None]] = {
    "model": _check_policy,
    "reward_funcs": _check_reward_funcs,
    "processing_class": lambda v: None if _is_tokenizer(v) else _refuse("processing_class", v, TOKENIZER),
    "reward_processing_classes": _check_reward_processing_classes,
    "ref_model": lambda v: (_check_model("ref_model", v, loadable=False), _check_language_model("ref_model", v)),
    "reward_model": lambda v: _check_reward("reward_model", v),
    "value_model": _check_value_model,
    "teacher_model": lambda v: (
        _check_model("teacher_model", v, loadable=True),
        _check_language_model("teacher_model", v),
    ),
    "peft_config": _check_peft_config,
    "callbacks": _check_callbacks,
    "optimizers": _check_optimizers,
    "tools": _check_tools,
}


TRL_CONFIG_FIXES = {
    "GRPOConfig": "use `from trl_trapo import GRPOConfig` (TRL's GRPO defaults on TRAPOConfig) with the same fields",
    "PPOConfig": "use `from trl_trapo import PPOConfig` (TRL's PPO fields and defaults on TRAPOConfig)",
}
"""TRL config classes a TRL script passes as `args`, and the TRAPO class that takes the same fields."""


def check_config_type(args: Any, expected: type, shown: str | None = None) -> None:
    """Refuse `args` that is not an `expected` (a `TRAPOConfig` class) instance; `shown`: the class the message asks
    for (default `expected`'s name).

    Raises:
        TypeError: naming the class given and, for TRL's `GRPOConfig` / `PPOConfig`, the TRAPO class of the same name.
    """
    if isinstance(args, expected):
        return
    name, shown = type(args).__name__, shown or expected.__name__
    if type(args).__module__.split(".")[0] == "trl" and name in TRL_CONFIG_FIXES:
        fix = f"TRL's {name} is not one: {TRL_CONFIG_FIXES[name]}."
    else:
        fix = f"Build one: `{shown}(output_dir=..., ...)`."
    raise TypeError(f"`args` must be a {shown}, got {name}. {fix}")


def check_trainer_arguments(**arguments: Any) -> None:
    """Refuse a constructor argument of the wrong type (see the module docstring), before anything loads.

    Args:
        **arguments: `TRAPOTrainer`'s arguments by name; those `CHECKS` knows are checked (None is accepted, as "not
            given", for all but `model`, which is required).

    Raises:
        TypeError: naming the argument (with the index of a bad list entry), the type and value given, what it must
            be and, where one applies, the fix (e.g. `peft.LoraConfig(**{...})` for a dict); for `model=None`. Every
            bad entry of a list (`reward_funcs`, `reward_processing_classes`, `callbacks`) is named in one message.
        TypeError: for a `model`, `ref_model` or `teacher_model` that is a loaded module but not a transformers
            model with a language-model head (a plain `nn.Module`, or a body without its head such as `AutoModel`'s),
            or a `torch.compile` wrapper of one (the fix: the model itself, with `torch_compile=True` for the policy).
        ValueError: for a classification model as `model` (`*ForSequenceClassification`: no language-model head), a
            `peft_config` whose task_type is not CAUSAL_LM, a string reward that is the command line's name of a
            built-in reward (`"exact_match"`: in Python the function is meant), a reward or value model without a
            one-output score head ([`~trl_trapo.models.check_score_head`]: a causal LM, or `num_labels` > 1), and
            for a prompt-learning `peft_config` (`PromptTuningConfig`, `PrefixTuningConfig`, ...:
            `peft_config.is_prompt_learning`), whose virtual tokens lengthen the logits, and for a `peft_config`
            with `inference_mode=True` (its adapter added frozen: nothing would train).
        ValueError: for a loaded `model`, `ref_model`, `teacher_model`, `value_model`, `reward_model` or reward-model
            entry of `reward_funcs` with tensors on the meta device (no weights); an encoder-decoder `model`,
            `ref_model` or `teacher_model` (`config.is_encoder_decoder`, e.g. T5: TRAPO trains decoder-only causal
            LMs); a loaded `model` without a trainable parameter when no `peft_config` adds an adapter, and a
            `value_model` without one; a loaded `model` or `value_model` with parameters created inside
            `torch.inference_mode()` ([`~trl_trapo.models.check_not_inference_tensors`]).
    """
    if "model" in arguments and arguments["model"] is None:
        raise TypeError(
            "`model` is required: a model id (e.g. 'Qwen/Qwen2.5-0.5B-Instruct'), the path of a model saved with "
            "`save_pretrained`, or a loaded model (`AutoModelForCausalLM.from_pretrained(...)`); got None."
        )
    for name, value in arguments.items():
        if value is not None and name in CHECKS:
            CHECKS[name](value)
    check_distinct_models(arguments)  # before `check_trainable`: a reward model given as the critic is frozen later
    if arguments.get("peft_config") is None:  # an adapter of `peft_config` would be trainable (checked once added)
        check_trainable("model", arguments.get("model"))
    check_trainable("value_model", arguments.get("value_model"))  # `peft_config` wraps the policy only
    for name in ("model", "value_model"):  # parameters made in `torch.inference_mode()` can never train
        check_not_inference_tensors(name, arguments.get(name))


def _shared_trainable(model: nn.Module, other: nn.Module) -> int:
    """How many of `other`'s parameter tensors are trainable tensors of `model` (the same objects)."""
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    return sum(id(p) in trainable for p in other.parameters())


def check_distinct_models(arguments: dict[str, Any]) -> None:
    """Refuse a model passed in two roles where that makes a term of the loss vanish without a word (trial 15's N14):

    - `ref_model` that is `model` itself (or, for a `PeftModel` policy, its base model, which carries the adapter),
      or that holds trainable tensors of `model`: the reference moves with the policy, so the KL penalty is always 0
      while the policy moves. TRL's PPOTrainer and DPOTrainer refuse the same object too.
    - `value_model` that is also a reward model (`reward_model`, or an entry of `reward_funcs`): reward models are
      frozen, so the critic would never learn (and a trained one would move the rewards).

    `teacher_model` that is the policy is refused where the teacher is loaded (`teacher.load_teacher`); a reward or
    value model that is the policy lacks the score head its own check asks for.

    Args:
        arguments: `TRAPOTrainer`'s arguments by name (`model`, `ref_model`, `value_model`, `reward_model`,
            `reward_funcs`, `peft_config`; missing ones count as not given).

    Raises:
        ValueError: naming both arguments, what vanishes and the fix.
    """
    model, ref_model = arguments.get("model"), arguments.get("ref_model")
    if isinstance(model, nn.Module) and isinstance(ref_model, nn.Module):
        base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
        shared = 0 if arguments.get("peft_config") is not None else _shared_trainable(model, ref_model)
        if ref_model is model or ref_model is base or shared:
            what = (
                "is the same object as `model`"
                if ref_model is model
                else "is the base model of the PeftModel `model`, which carries its adapter"
                if ref_model is base
                else f"shares {shared} trainable parameter tensor(s) with `model`"
            )
            raise ValueError(
                f"`ref_model` {what}: the reference would move with the policy, so the KL penalty towards it would "
                "always be 0 (kl_coef would do nothing). Fix: ref_model=None (TRAPO makes a frozen copy of the policy; "
                "with PEFT, the adapter's starting point: the base model with the adapter disabled, or a frozen copy "
                "of an adapter already trained), or pass a separate copy, `ref_model=copy.deepcopy(model)`."
            )
    value_model = arguments.get("value_model")
    if not isinstance(value_model, nn.Module):
        return
    funcs = arguments.get("reward_funcs")
    rewards = [("reward_model", arguments.get("reward_model"))] + [
        (f"reward_funcs[{i}]" if isinstance(funcs, (list, tuple)) else "reward_funcs", func)
        for i, func in enumerate(funcs if isinstance(funcs, (list, tuple)) else [funcs])
    ]
    for name, reward in rewards:
        if reward is value_model:
            raise ValueError(
                f"`value_model` is the same object as `{name}`: reward models are frozen, so the critic would never "
                "learn its value estimates (and if it did, the rewards would move with it). Fix: pass a separate "
                "critic, e.g. `value_model=copy.deepcopy(reward_model)` (TRL's PPO starts the critic from the reward "
                "model's weights), or value_model=None for group-relative advantages."
            )


def check_trainable(name: str, model: Any, peft_config: Any = None) -> None:
    """Refuse a loaded policy or critic without one trainable parameter (`requires_grad=False` everywhere): it
    trained silently, the losses logged as usual, `grad_norm` 0 and the policy never moving (trial 9's MO01).
    Called on the arguments before anything loads, and on the policy as it will train, once `peft_config`'s adapter
    wraps it (`assembly.policy_and_reference`): an adapter added frozen trained nothing too (trial 15's N27).

    Args:
        name: the argument, `"model"` or `"value_model"`.
        model: its value (anything but an `nn.Module` is left alone).
        peft_config: the config whose adapter was just added to `model`, named in the message; None otherwise.

    Raises:
        ValueError: naming the argument, the model's class and the fix.
    """
    from peft import PeftModel

    if not isinstance(model, nn.Module) or any(p.requires_grad for p in model.parameters()):
        return
    what = "the policy" if name == "model" else "the critic's value estimates"
    if peft_config is not None:
        shown = f"the policy with the {type(peft_config).__name__} adapter of `peft_config` added"
        raise ValueError(
            f"`{name}` ({type(model).__name__}, {shown}) has no trainable parameters (requires_grad=False on every "
            f"one, the adapter's included): the run would log its losses while {what} never moved. PEFT adds an "
            "adapter frozen when peft_config.inference_mode=True (set inference_mode=False, the default) or when "
            "something froze it afterwards. Fix: give a `peft_config` whose adapter trains, or wrap the model "
            "yourself (`peft.get_peft_model(model, peft_config)`), check `model.print_trainable_parameters()`, and "
            "pass that PeftModel as `model`."
        )
    fix = (
        "A PEFT model loaded with `PeftModel.from_pretrained(model, path)` is frozen: load it with "
        "`is_trainable=True` to train its adapter."
        if isinstance(model, PeftModel)
        else f"Unfreeze what should train (`{name}.requires_grad_(True)`, or `module.requires_grad_(True)` for a part)"
        + (
            ", or pass `peft_config` (e.g. `peft.LoraConfig(r=16, lora_alpha=32, target_modules='all-linear')`) to "
            "train an adapter on the frozen model."
            if name == "model"
            else "."
        )
    )
    raise ValueError(
        f"`{name}` ({type(model).__name__}) has no trainable parameters (requires_grad=False on every one): the run "
        f"would log its losses while {what} never moved. {fix}"
    )


FOREIGN_TRAINER_ARGUMENTS = {
    "tokenizer": "pass it as `processing_class=` (transformers 4.46 renamed the Trainer's `tokenizer` argument "
    "`processing_class`; TRL's trainers take `processing_class` too)",
    "formatting_func": "map your rows to prompt/completion (or messages) columns with `dataset.map(...)` and pass them "
    "as `sft_dataset=` (TRL's SFTTrainer applies formatting_func to its rows; TRAPO reads the columns as they are)",
    "data_collator": "drop it: TRAPO batches each objective's rows itself (padding, masks and the completion-only "
    "loss of `sft_dataset` rows); a different way of building rows is an objective (`objectives=`, docs/seams.md)",
    "compute_loss_func": "drop it: TRAPO computes its own losses; add a loss term as an objective (`objectives=`, "
    "docs/seams.md)",
    "compute_metrics": "drop it: evaluation logs TRAPO's own metrics (docs/metrics.md)",
    "preprocess_logits_for_metrics": "drop it: evaluation logs TRAPO's own metrics (docs/metrics.md)",
    "model_init": "pass the model (or its name or path) as `model=`",
    "optimizer_cls_and_kwargs": "pass `optimizers=(optimizer, lr_scheduler)`, or choose it in the config "
    "(`optim=`, `learning_rate=`)",
    "quantization_config": "put it in the config, `TRAPOConfig(model_init_kwargs={'quantization_config': ...})`, "
    "which loads `model` (an id or path) with it, or pass a model loaded with it",
}
"""Arguments of TRL's `SFTTrainer` / `GRPOTrainer` / transformers' `Trainer` that `TRAPOTrainer` has no parameter of -> what to do
instead (`TRAPOTrainer.__new__`; Python's "unexpected keyword argument 'data_collator'" named no fix, as the config's
fields of other TRL configs are mapped by `TRAPOConfig.__new__`)."""


def refuse_foreign_arguments(cls: type, kwargs: dict[str, Any], positional: tuple = ()) -> None:
    """Refuse, naming the fix, an argument of TRL's `SFTTrainer` / transformers' `Trainer` that `cls` (a
    `TRAPOTrainer` class) has no parameter of ([`FOREIGN_TRAINER_ARGUMENTS`]), and `positional` arguments in TRL's
    `GRPOTrainer` / `SFTTrainer` order ([`refuse_trl_positional_order`]); called by `TRAPOTrainer.__new__`,
    before Python binds the arguments. A subclass whose `__init__` takes one of them (TRL 1.12's `PPOTrainer` took
    `data_collator`) keeps it.

    Also refuses a field of the config given as a trainer argument (`TRAPOTrainer(..., reward_weights=[2.0])`),
    naming the config to put it in; a class taking `**kwargs` (PPOTrainer) is checked with its base's parameters,
    to which it hands them.

    Raises:
        TypeError: naming each such argument and what to do instead.
    """
    refuse_trl_positional_order(cls, positional)
    parameters = inspect.signature(cls.__init__).parameters
    accepted, closed = set(), False
    for klass in cls.__mro__:  # a class taking **kwargs (PPOTrainer) hands them to its base's __init__
        accepted |= set(inspect.signature(klass.__init__).parameters)
        if not any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(klass.__init__).parameters.values()
        ):
            closed = True  # no **kwargs left to take an unknown name
            break
    foreign = [name for name in FOREIGN_TRAINER_ARGUMENTS if name in kwargs and name not in accepted]
    if foreign:
        raise TypeError(
            f"{cls.__name__} got TRL SFTTrainer / transformers Trainer argument(s) it does not take: "
            + "; ".join(f"{name}=: {FOREIGN_TRAINER_ARGUMENTS[name]}" for name in foreign)
            + "."
        )
    from .config import TRAPOConfig  # here: config imports much, and this module is imported by the trainer only

    fields = {f.name for f in dataclasses.fields(TRAPOConfig)}
    misplaced = [name for name in kwargs if name not in accepted and name in fields]
    if misplaced:
        annotation = parameters["args"].annotation if "args" in parameters else None
        config = str(annotation).split(" ")[0] if isinstance(annotation, str) else "TRAPOConfig"
        given = ", ".join(f"{name}={kwargs[name]!r}" for name in misplaced)
        raise TypeError(
            f"{cls.__name__} got config field(s) as its own argument(s): {', '.join(misplaced)}. They are {config} "
            "fields, not trainer arguments: pass them in the config, "
            f"`{cls.__name__}(..., args={config}(..., {given}))`."
        )
    unknown = [name for name in kwargs if name not in accepted]
    if closed and unknown:  # Python's own TypeError names no parameter it meant (trial 14's N49: `eval_datasets=`)
        names = sorted(accepted - {"self", "args", "kwargs"}) + ["args"]
        raise TypeError(
            f"{cls.__name__} got unexpected keyword argument(s): "
            + "; ".join(
                f"{name}= (did you mean {' or '.join(close)}?)" if close else f"{name}= (no parameter is close)"
                for name, close in ((n, difflib.get_close_matches(n, names, n=2, cutoff=0.6)) for n in unknown)
            )
            + f". Its keyword arguments: {', '.join(names)}."
        )


TRL_POSITIONAL_ORDERS: dict[str, tuple[str, ...]] = {
    "GRPOTrainer": (
        "model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class",
        "reward_processing_classes", "callbacks", "optimizers", "quantization_config", "peft_config", "tools",
        "rollout_func", "environment_factory",
    ),
    "SFTTrainer": (
        "model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class", "compute_loss_func",
        "compute_metrics", "callbacks", "optimizers", "optimizer_cls_and_kwargs", "preprocess_logits_for_metrics",
        "quantization_config", "peft_config", "formatting_func",
    ),
}  # fmt: skip
"""TRL 1.16's `GRPOTrainer.__init__` / `SFTTrainer.__init__` parameters in their positional order (written out, not
read from TRL: importing its trainers takes seconds; tests/test_arguments.py compares them with the installed TRL's).
`TRAPOTrainer`'s order is `GRPOTrainer`'s up to `eval_dataset`, then its own."""

ARGUMENT_KINDS: dict[str, frozenset[str]] = {
    "model": frozenset({"model"}),
    "reward_funcs": frozenset({"model", "function", "functions"}),
    "args": frozenset({"config"}),
    "processing_class": frozenset({"tokenizer"}),
    "reward_processing_classes": frozenset({"tokenizer", "tokenizers"}),
    **{name: frozenset({"model"}) for name in ("ref_model", "value_model", "teacher_model")},
    "reward_model": frozenset({"model", "function"}),
    "callbacks": frozenset({"callbacks"}),
    "optimizers": frozenset({"optimizers"}),
    "quantization_config": frozenset({"quantization_config"}),
    "peft_config": frozenset({"peft_config"}),
    "tools": frozenset({"functions"}),
    "optimizer_cls_and_kwargs": frozenset({"optimizer_cls_and_kwargs"}),
    **dict.fromkeys(
        (
            "data_collator",
            "compute_loss_func",
            "compute_metrics",
            "preprocess_logits_for_metrics",
            "formatting_func",
            "rollout_func",
            "environment_factory",
        ),
        frozenset({"function"}),
    ),
}
"""Trainer parameter (TRAPO's or TRL's) -> the kinds of value ([`positional_kind`]) it takes; a dataset parameter
(`*_dataset`) takes none of them."""

KIND_TEXT = {
    "tokenizer": "a tokenizer or processor",
    "tokenizers": "a list of tokenizers",
    "config": "a training config",
    "model": "a model",
    "peft_config": "a PEFT config",
    "quantization_config": "a quantization config",
    "callbacks": "trainer callbacks",
    "optimizers": "an (optimizer, lr_scheduler) pair",
    "optimizer_cls_and_kwargs": "an (optimizer class, keyword arguments) pair",
    "functions": "a list of functions",
    "function": "a callable",
}


def positional_kind(value: Any) -> str | None:
    """What `value` is, as a key of [`KIND_TEXT`] (`"tokenizer"`, `"model"`, `"callbacks"`, ...), or None when it is
    none of them or could be several things (None, a string, a dataset, a list of rows, an empty list)."""
    from peft import PeftConfig
    from transformers import TrainingArguments
    from transformers.utils.quantization_config import QuantizationConfigMixin

    scheduler = torch.optim.lr_scheduler.LRScheduler
    if _is_tokenizer(value):  # before "function": a tokenizer is callable
        return "tokenizer"
    for kind, cls in (
        ("config", TrainingArguments),
        ("model", nn.Module),
        ("peft_config", PeftConfig),
        ("quantization_config", QuantizationConfigMixin),
    ):
        if isinstance(value, cls):
            return kind
    if _is_callback(value):
        return "callbacks"
    if not isinstance(value, (list, tuple)):
        return "function" if callable(value) else None
    if not value:
        return None
    if all(_is_callback(v) for v in value):
        return "callbacks"
    if all(v is None or _is_tokenizer(v) for v in value) and any(v is not None for v in value):
        return "tokenizers"
    if len(value) == 2 and any(v is not None for v in value):
        if all(v is None or isinstance(v, (torch.optim.Optimizer, scheduler)) for v in value):
            return "optimizers"
        if isinstance(value[0], type) and issubclass(value[0], torch.optim.Optimizer) and isinstance(value[1], dict):
            return "optimizer_cls_and_kwargs"
    return "functions" if all(positional_kind(v) == "function" for v in value) else None


def _ordinal(number: int) -> str:
    suffix = "th" if number % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def refuse_trl_positional_order(cls: type, positional: tuple) -> None:
    """Refuse positional arguments given in TRL's `GRPOTrainer` or `SFTTrainer` order ([`TRL_POSITIONAL_ORDERS`])
    where `cls`'s differs: `TRAPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, tokenizer)`, TRL
    GRPOTrainer's order, put the tokenizer in `pretrain_dataset`, whose dataset check then proposed building a dataset
    from it (trial 13's N30). A value is refused when it is clearly of a kind ([`positional_kind`]: a tokenizer, a
    model, a config, callbacks, ...) that its slot does not take and either a TRL trainer takes at that position, or
    the slot is a dataset; every call `cls` accepts passes. Only for classes whose positional order starts as
    GRPOTrainer's (`PPOTrainer` follows TRL 1.12 PPOTrainer's order and checks its own).

    Args:
        cls: the trainer class being built (`TRAPOTrainer` or a subclass).
        positional: the positional arguments of the call, `self` excluded.

    Raises:
        TypeError: naming each such position, `cls`'s parameter there, the TRL trainer(s) and parameter its value
            fits, the value's type, and the fix (pass it by that keyword, or what replaces a parameter `cls` lacks).
    """
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    names = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    shared = TRL_POSITIONAL_ORDERS["GRPOTrainer"][:5]
    if tuple(names[:5]) != shared:
        return
    problems, sft_order = [], False
    for index, (name, value) in enumerate(zip(names, positional)):
        kind = None if value is None else positional_kind(value)
        taken = ARGUMENT_KINDS.get(name, frozenset() if name.endswith("_dataset") else None)
        if kind is None or taken is None or kind in taken:
            continue
        meant: dict[str, list[str]] = {}  # TRL's parameter at this position -> the TRL trainers that have it
        for trainer, order in TRL_POSITIONAL_ORDERS.items():
            if index < len(order) and kind in ARGUMENT_KINDS.get(order[index], ()):
                meant.setdefault(order[index], []).append(trainer)
        if not meant and (not name.endswith("_dataset") or kind in ("function", "functions")):
            continue  # no other order explains it: the argument's own check names it (a generator: from_generator)
        sft_order |= bool(meant) and "GRPOTrainer" not in sum(meant.values(), [])
        shown = f"{KIND_TEXT[kind]} ({type(value).__name__})"
        problem = f"{cls.__name__}'s {_ordinal(index + 1)} positional argument is `{name}`"
        if meant:
            where = "; ".join(
                f"TRL's {' and '.join(trainers)} take{'s' if len(trainers) == 1 else ''} `{trl}`"
                for trl, trainers in meant.items()
            )
            fixes = []
            for trl in meant:
                if trl in names:
                    fixes.append(f"pass {trl}=... by keyword")
                else:
                    fix = FOREIGN_TRAINER_ARGUMENTS.get(trl, "drop it")
                    fixes.append(f"{cls.__name__} takes no `{trl}`: {fix}")
            problems.append(f"{problem}, where {where}, and it got {shown}: {'; '.join(fixes)}")
        else:
            takers = [n for n in names if kind in ARGUMENT_KINDS.get(n, ()) and n != "model"]
            keywords = " or ".join(f"`{n}=`" for n in takers)
            fix = f"pass it by keyword ({keywords})" if takers else "pass a `datasets.Dataset` there"
            problems.append(f"{problem}, a dataset, and it got {shown}: {fix}")
    if not problems:
        return
    note = (
        f"{cls.__name__}'s positional order is TRL GRPOTrainer's up to `eval_dataset` ({', '.join(shared)}), then its "
        f"own ({', '.join(names[5:9])}, ...): pass the arguments after eval_dataset by keyword."
    )
    if sft_order:  # an SFTTrainer call
        note += (
            f" It is not TRL SFTTrainer's ({', '.join(TRL_POSITIONAL_ORDERS['SFTTrainer'][:4])}, ...), and SFTTrainer's"
            f" `train_dataset`, the demonstrations, is {cls.__name__}'s `sft_dataset=` (its `train_dataset` holds the RL"
            " prompts)."
        )
    if len(problems) == 1:
        raise TypeError(f"{problems[0]}. {note}")
    raise TypeError(
        f"{cls.__name__} got positional arguments in another trainer's order:"
        + "".join(f"\n- {p}" for p in problems)
        + f"\n{note}"
    )
