# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Evaluation: held-out metrics computed directly (the `evaluate` library's metrics live on the Hub and do not load
offline), by the format of the held-out data ([`Evaluator`]):

- prompt-only (`prompt` / `input_ids`): greedy completions scored by the reward functions (for an exact-match reward
  the mean reward is the exact-match accuracy); in a run with `tools` / `environment_factory`, greedy multi-turn
  rollouts through the training loop (the prompt rendered with its tools, the calls run, their results appended;
  `trl_trapo.agents.GreedyToolRollouts`), scored as training scores them, with the `tools/*` metrics;
- `text`: language-modelling loss (documents chunked on their own, EOS appended) — the pretraining-corpus loss whose
  rise measures forgetting;
- prompt-completion / `messages`: SFT loss (completion tokens only).

All losses are natural-log NLL per counted token (nats/token). Also TRL 1.12 `PPOTrainer`'s sample table
(`completions_table`).
"""

from __future__ import annotations

import difflib
import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import EarlyStoppingCallback, GenerationConfig
from transformers.trainer_utils import speed_metrics
from trl.trainer.utils import nanstd, print_prompt_completions_sample, selective_log_softmax

from .collator import MODEL_INPUTS, Row, collate_rows
from .config import PRETRAIN
from .data import (
    check_dataset_object,
    dataset_columns,
    dataset_to_evaluate,
    sft_row,
    tokenize_prompt_dataset,
    tokenize_sft_dataset,
)
from .distributed import gather_across_ranks, generation_synced_gpus, reduce_named_means
from .models import model_forward
from .rewards import RewardScorer, discard_extra, discard_metric
from .rollout import generate, prompt_model_inputs
from .setup_checks import METRIC_SCHEDULERS
from .vision import ImageRows, as_tensors, image_column


logger = logging.getLogger(__name__)

# the flags only sampling reads: `GenerationConfig.validate` warns about each one set beside `do_sample=False`
SAMPLING_ONLY_FLAGS = ("temperature", "top_p", "top_k", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff")
OWN_EVAL_SET = "the (first) eval_dataset"  # what `completions_table` calls the trainer's own eval set


def document_rows(texts: list[str], tokenizer, max_length: int) -> list[Row]:
    """Each document (+ EOS) cut into rows of at most `max_length` tokens; every target counts.

    Returns:
        `list[Row]`: rows with `input_ids` `(L,)` and `mask` `(L - 1,)`.
    """
    rows = []
    eos = tokenizer.eos_token_id
    for ids in tokenizer([t for t in texts if t], add_special_tokens=False)["input_ids"]:
        ids = ids + [eos]
        for start in range(0, len(ids), max_length):
            chunk = ids[start : start + max_length]
            if len(chunk) >= 2:
                rows.append(Row(PRETRAIN, torch.tensor(chunk), torch.ones(len(chunk) - 1)))
    return rows


def image_document_rows(dataset, column: str, images: ImageRows, max_length: int, role: str) -> list[Row]:
    """The documents of a VLM eval set with a `text` and an image column: a document with images is one row (its first
    `max_length` tokens, its `model_inputs`), as the pretraining stream makes it; a text document is cut as
    [`document_rows`] cuts it."""
    rows = []
    for index, example in enumerate(dataset):
        found = images.images_of(example, column, role, index)
        if not found:
            rows += document_rows([example["text"]], images.tokenizer, max_length)
            continue
        ids, inputs = images.document(example["text"], found, role, index)
        ids = ids[: images.cut(ids, max_length, role, index)]
        mask = images.document_mask(ids)  # the image tokens are read, not predicted (as in training)
        rows.append(Row(PRETRAIN, torch.tensor(ids), mask, model_inputs=as_tensors(inputs)))
    return rows


def sft_rows(tokenized) -> list[Row]:
    """Rows of a dataset tokenised by `tokenize_sft_dataset` (with their `model_inputs`, in a VLM run)."""
    inputs = tokenized[MODEL_INPUTS] if MODEL_INPUTS in tokenized.column_names else [None] * len(tokenized)
    return [
        sft_row(ids, mask, model_inputs=extra)
        for ids, mask, extra in zip(tokenized["input_ids"], tokenized["completion_mask"], inputs)
    ]


@torch.no_grad()
def nll_sum(model: nn.Module, rows: list[Row], pad_token_id: int, batch_size: int = 32) -> tuple[float, float]:
    """Sum of the NLL (nats) over the counted tokens of `rows`, and their number.

    Args:
        model (`nn.Module`): a causal LM.
        rows (`list[Row]`): rows with `input_ids` `(L,)` and target-aligned `mask` `(L - 1,)` (and their
            `model_inputs`, which the model gets).
        pad_token_id (`int`): padding id.
        batch_size (`int`): rows per forward.

    Returns:
        tuple `(total_nll, num_tokens)`.
    """
    device = next(model.parameters()).device
    total, count = 0.0, 0.0
    ordered = sorted(rows, key=lambda r: r.input_ids.numel())
    for start in range(0, len(ordered), batch_size):
        batch = collate_rows(ordered[start : start + batch_size], pad_token_id)
        input_ids = batch["input_ids"].to(device)
        attention_mask = batch["attention_mask"].to(device)
        logits = model_forward(model, input_ids, attention_mask, batch.get(MODEL_INPUTS)).logits
        logps = selective_log_softmax(logits[:, :-1].float(), input_ids[:, 1:])
        mask = batch["mask"].to(device)
        total += float(-(logps * mask).sum())
        count += float(mask.sum())
    return total, count


# ---- what `Evaluator.evaluate` returns: one table, read by the evaluator and by `check_best_model_metric` ------------
# Each key follows "<prefix>_" ("{}": a reward function's name, or a split), with whether greater is better (None:
# neither). TRL's `GRPOTrainer` names: `reward`, `reward_std`, `rewards/{}/mean|std`, `completions/*` (its eval log's
# keys, with the same meaning over the greedy completions) and transformers' speed metrics (`speed_metric_names`);
# TRAPO's own: `completion_length`, `rewards/{}`, `reward_{}`.
PROMPT_METRICS: dict[str, bool | None] = {
    "reward": True,
    "reward_std": None,
    "completion_length": None,
    "completions/mean_length": None,
    "completions/min_length": None,
    "completions/max_length": None,
    "completions/clipped_ratio": False,
    "completions/mean_terminated_length": None,
    "completions/min_terminated_length": None,
    "completions/max_terminated_length": None,
}
FUNCTION_METRICS: dict[str, bool | None] = {"rewards/{}": True, "rewards/{}/mean": True, "rewards/{}/std": None}
SPLIT_METRICS: dict[str, bool | None] = {"reward_{}": True}
TOOL_METRICS: dict[str, bool | None] = {
    "tools/call_frequency": None,
    "tools/failure_frequency": False,
    "tools/rollback_frequency": False,
    "tools/truncated_frequency": False,
    "tools/turns_mean": None,
}
LOSS_METRICS: dict[str, dict[str, bool | None]] = {"text": {"pretrain_loss": False}, "sft": {"sft_loss": False}}
TRL_EVAL_METRICS_NOT_RETURNED: dict[str, str] = {
    "loss": "TRL's GRPO loss on its eval rollouts; TRAPO's evaluation of prompts computes no training loss",
    "entropy": "the policy's token entropy from TRL's eval loss forward, which TRAPO's greedy evaluation does not run",
    "clip_ratio/low_mean": "PPO clipping in TRL's eval loss forward (always 0 there: on-policy)",
    "clip_ratio/low_min": "PPO clipping in TRL's eval loss forward (always 0 there: on-policy)",
    "clip_ratio/high_mean": "PPO clipping in TRL's eval loss forward (always 0 there: on-policy)",
    "clip_ratio/high_max": "PPO clipping in TRL's eval loss forward (always 0 there: on-policy)",
    "clip_ratio/region_mean": "PPO clipping in TRL's eval loss forward (always 0 there: on-policy)",
    "frac_reward_zero_std": "groups of sampled completions per prompt; a greedy evaluation has one completion per "
    "prompt, so every group would count (TRL reports 1.0 with num_generations_eval=1)",
    "kl": "the KL to the reference model in TRL's eval loss forward (with beta != 0), which TRAPO's greedy "
    "evaluation does not run",
    "num_tokens": "the tokens trained on so far (the training counter, not a property of the eval data)",
    "model_preparation_time": "transformers' time to wrap a model not yet prepared when evaluate() is called first; "
    "TRAPO's trainer prepares the model when it is built",
}
"""The keys TRL 1.16's `GRPOTrainer.evaluate()` returns (after "eval_", with its default loss) that TRAPO's evaluation
does not, and why: named by `check_best_model_metric` when one is chosen as `metric_for_best_model`."""


def eval_format(columns) -> str | None:
    """How a held-out dataset with these columns is evaluated: "text" (language-modelling loss), "sft"
    (prompt-completion / `messages`: SFT loss), "prompts" (`prompt` / `input_ids`: greedy rewards), or None."""
    columns = set(columns)
    if "text" in columns:
        return "text"
    if "completion" in columns or "messages" in columns:
        return "sft"
    if "prompt" in columns or "input_ids" in columns:
        return "prompts"
    return None


def speed_metric_names(prefix: str) -> dict[str, bool]:
    """The keys of transformers' `speed_metrics` as `evaluate` returns them (`<prefix>_runtime`, seconds, lower is
    better; `<prefix>_samples_per_second`, `<prefix>_steps_per_second`, higher is better), named by the helper itself."""
    keys = speed_metrics(prefix, time.time() - 1.0, num_samples=1, num_steps=1)
    return {key: key != f"{prefix}_runtime" for key in keys}


def dataset_metric_names(
    kind: str, prefix: str, reward_names: list[str], splits: list[str], tools: bool
) -> dict[str, bool | None]:
    """The keys `Evaluator.evaluate` computes for one dataset of format `kind` ([`eval_format`]), before the speed
    metrics: each key `<prefix>_<name>` and whether greater is better (None: neither).

    Args:
        kind (`str`): "text", "sft" or "prompts".
        prefix (`str`): e.g. "eval", or "eval_<name>" for a dataset of a dict.
        reward_names (`list[str]`): the reward functions' metric names ([`~trl_trapo.rewards.RewardScorer`]'s).
        splits (`list[str]`): the values of the dataset's `split` column (none: no such column).
        tools (`bool`): a run with `tools` / `environment_factory` (its `tools/*` metrics).
    """
    if kind in LOSS_METRICS:
        table = dict(LOSS_METRICS[kind])
    else:
        table = dict(PROMPT_METRICS)
        for name in reward_names:
            table.update({key.format(name): better for key, better in FUNCTION_METRICS.items()})
        for split in splits:
            table.update({key.format(split): better for key, better in SPLIT_METRICS.items()})
        if tools:
            table.update(TOOL_METRICS)
    return {f"{prefix}_{key}": better for key, better in table.items()}


def eval_metric_names(
    eval_dataset, reward_names: list[str], tools: bool, prefix: str = "eval"
) -> dict[str, bool | None]:
    """Every key `trainer.evaluate()` returns for `eval_dataset` in a run with these rewards (besides `epoch` and what
    reward functions report with `log_metric`, known only once logged), and whether greater is better (None:
    neither): [`dataset_metric_names`] and transformers' speed metrics of each dataset (a dict of datasets:
    `<prefix>_<name>_...`). Datasets of no format TRAPO evaluates add nothing (refused elsewhere).

    Args:
        eval_dataset: a `Dataset`, a dict of them, or None.
        reward_names (`list[str]`): the run's reward names ([`~trl_trapo.rewards.reward_names`]).
        tools (`bool`): a run with `tools` / `environment_factory`.
        prefix (`str`): `evaluate()`'s `metric_key_prefix`.
    """
    datasets = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    out: dict[str, bool | None] = {}
    for name, dataset in datasets:
        kind = eval_format(dataset_columns(dataset)) if dataset is not None else None
        if kind is None:
            continue
        base = prefix if name is None else f"{prefix}_{name}"
        splits = dataset_splits(dataset) if kind == "prompts" else []
        out.update(dataset_metric_names(kind, base, reward_names, splits, tools))
        out.update(speed_metric_names(base))
    return out


def dataset_splits(dataset) -> list[str]:
    """The sorted values of a dataset's `split` column, as strings (none without one)."""
    if "split" not in dataset_columns(dataset):
        return []
    values = dataset.unique("split") if hasattr(dataset, "unique") else set(dataset["split"])
    return sorted({str(v) for v in values})


def evaluation_metrics(eval_dataset, prefix: str = "eval") -> dict[str, bool]:
    """The headline metric `Evaluator.evaluate` logs for each held-out dataset, and whether greater is better:
    `<prefix>_reward` for prompts, `<prefix>_pretrain_loss` for text, `<prefix>_sft_loss` for demonstrations (a dict
    of datasets gets `<prefix>_<name>_...`)."""
    headline = {"prompts": ("reward", True), "text": ("pretrain_loss", False), "sft": ("sft_loss", False)}
    datasets = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    out: dict[str, bool] = {}
    for name, dataset in datasets:
        kind = eval_format(dataset_columns(dataset)) if dataset is not None else None
        if kind is not None:
            key, better = headline[kind]
            out[f"{prefix if name is None else f'{prefix}_{name}'}_{key}"] = better
    return out


def check_eval_strategy(args, eval_dataset) -> None:
    """`eval_strategy` other than "no" needs evaluation data: transformers' `Trainer.__init__` (`_validate_args`)
    refuses it without an `eval_dataset`, after the models were loaded and the datasets tokenized, as a traceback from
    inside transformers. Said here, with the construction's argument checks. (Its other refusals that depend on the
    datasets cannot happen here: the `Trainer`'s train dataset is TRAPO's plan, which has a length.)

    Args:
        args ([`TRAPOConfig`]): reads `eval_strategy`.
        eval_dataset: the trainer's `eval_dataset` argument.

    Raises:
        ValueError: naming `eval_strategy`, its value and the two fixes, when it is not "no" and `eval_dataset` is
            None.
    """
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)  # an IntervalStrategy after __post_init__
    if strategy not in (None, "no") and eval_dataset is None:
        raise ValueError(
            f"{type(args).__name__}.eval_strategy={strategy!r} evaluates during training, and there is no "
            'eval_dataset. Fix: pass eval_dataset= to the trainer, or set eval_strategy="no".'
        )


def check_eval_on_start(args, eval_dataset) -> None:
    """`eval_on_start=True` needs evaluation data: transformers' `train()` evaluates before the first step, and
    without an `eval_dataset` that failed there, after the models were loaded and wrapped ("No `eval_dataset`").
    (`eval_strategy` other than "no" without one: `check_eval_strategy`.)

    Raises:
        ValueError: naming `eval_on_start` and the two fixes, when `args.eval_on_start` and `eval_dataset` is None.
    """
    if args.eval_on_start and eval_dataset is None:
        raise ValueError(
            f"{type(args).__name__}.eval_on_start=True evaluates before the first step, and there is no eval_dataset."
            " Fix: pass eval_dataset to the trainer, or set eval_on_start=False."
        )


def check_best_model_metric(
    args, eval_dataset, callbacks: list | None = None, reward_names: list[str] | None = None, tools: bool = False
) -> None:
    """With `load_best_model_at_end`, `save_strategy="best"`, or a `transformers.EarlyStoppingCallback` among
    `callbacks`, `metric_for_best_model` must be a key `evaluate()` returns for the eval data ([`eval_metric_names`]:
    the evaluator's own table, with the run's reward names and tools); early stopping also needs evaluations
    (`eval_strategy` not "no"). transformers' callback asserts both only when `train()` starts. The same for an
    `lr_scheduler_type` in `METRIC_SCHEDULERS` (transformers sets `metric_for_best_model='loss'` for it when unset,
    and raised a `KeyError` at the first evaluation after training began), whose `lr_scheduler_kwargs['mode']`
    (default 'min') must also match the metric's direction (when it has one: not for lengths or counts).

    Args:
        args ([`TRAPOConfig`]): reads `metric_for_best_model` and the settings that compare it.
        eval_dataset: the trainer's `eval_dataset` (a dataset, a dict of them, or None).
        callbacks (`list`, *optional*): the trainer's `callbacks` argument.
        reward_names (`list[str]`, *optional*): the run's reward names ([`~trl_trapo.rewards.reward_names`]).
        tools (`bool`): a run with `tools` / `environment_factory`.

    Raises:
        ValueError: naming the field, the value, the closest keys `evaluate()` returns (or, for a key of TRL's
            `GRPOTrainer` that TRAPO does not return, why) and the headline metrics to choose from (with
            `greater_is_better`), before training; TRAPO never returns the Trainer's default `eval_loss`.
    """
    early_stopping = any(
        isinstance(c, EarlyStoppingCallback) or (isinstance(c, type) and issubclass(c, EarlyStoppingCallback))
        for c in callbacks or []
    )
    kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    on_metric = kind in METRIC_SCHEDULERS  # steps on metric_for_best_model after every evaluation
    save_best = getattr(args.save_strategy, "value", args.save_strategy) == "best"
    if not (args.load_best_model_at_end or early_stopping or on_metric or save_best):
        return
    if early_stopping:
        user = "EarlyStoppingCallback"
    elif args.load_best_model_at_end:
        user = "load_best_model_at_end=True"
    elif save_best:
        user = "save_strategy='best'"
    else:
        user = f"lr_scheduler_type={kind!r}"
    headline = evaluation_metrics(eval_dataset)
    choices = ", ".join(
        f"metric_for_best_model={m!r} with greater_is_better={better}" for m, better in headline.items()
    )
    fix = (
        f"set {choices}."
        if choices
        else "pass an eval_dataset TRAPO can evaluate (it logs eval_reward for prompts, eval_pretrain_loss for text, "
        "eval_sft_loss for demonstrations) and name its metric."
    )
    if early_stopping and args.metric_for_best_model is None:
        raise ValueError(
            f"{type(args).__name__}.metric_for_best_model=None: the EarlyStoppingCallback stops on a metric, and none "
            f"is set: {fix}"
        )
    if early_stopping and getattr(args.eval_strategy, "value", args.eval_strategy) == "no":
        raise ValueError(
            f"{type(args).__name__}.eval_strategy='no': the EarlyStoppingCallback stops when {args.metric_for_best_model}"
            " stops improving at evaluations, and none run: set eval_strategy='steps' (with eval_steps) or 'epoch'."
        )
    available = eval_metric_names(eval_dataset, list(reward_names or []), tools)
    metric = args.metric_for_best_model or "loss"
    name = metric if metric.startswith("eval_") else f"eval_{metric}"  # transformers' own prefixing
    if name not in available:
        default = " (transformers' default)" if on_metric and metric == "loss" else ""
        mode = (
            " The scheduler's mode must match the metric: `lr_scheduler_kwargs={'mode': 'max'}` for one that is "
            "higher when better (its default 'min' is for a loss)."
            if on_metric
            else ""
        )
        trl_only = TRL_EVAL_METRICS_NOT_RETURNED.get(name[len("eval_") :])
        why = f" TRL's GRPOTrainer returns {name}: {trl_only}." if trl_only else ""
        close = difflib.get_close_matches(name, list(available), n=3, cutoff=0.6)
        closest = f" Closest that it returns: {', '.join(repr(c) for c in close)}." if close else ""
        raise ValueError(
            f"{type(args).__name__}.metric_for_best_model={metric!r}{default} is not a metric evaluate() returns for "
            f"this run's eval_dataset ({user} compares it after every evaluation).{why}{closest} Fix: "
            + ("name one of those, or " if close else "")
            + (fix if choices else f"{fix[:-1]}, or drop {user.split('=')[0]}.")
            + " (Every key it returns: docs/metrics.md, Evaluation.)"
            + mode
        )
    better = available[name]
    if on_metric and better is not None:  # transformers passes the metric as is; the scheduler's `mode` says which way
        mode = (args.lr_scheduler_kwargs or {}).get("mode", "min")
        wanted = "max" if better else "min"
        if mode != wanted:
            raise ValueError(
                f"{type(args).__name__}.lr_scheduler_type={kind!r} steps on metric_for_best_model={metric!r}, which is "
                f"{'higher' if better else 'lower'} when better, but the scheduler's mode is {mode!r}: it "
                f"would lower the learning rate while {name} improves. Fix: "
                f"`lr_scheduler_kwargs={{'mode': '{wanted}'}}` (`--lr_scheduler_kwargs '{{\"mode\": \"{wanted}\"}}'`)."
            )


@dataclass
class Completed:
    """The greedy completions of one rank's eval prompts (`B` of them), as [`Evaluator`] scores them.

    Attributes:
        examples (`list[dict]`): the rows (a tools run's: with the environment's `reset` text in the prompt).
        prompt_ids (`list[torch.Tensor]`): `(P_i,)` prompt ids (a tools run's: rendered with the tools).
        completion_ids (`list[torch.Tensor]`): `(C_i,)` completion ids (a tools run's: every turn and tool result).
        policy_lengths (`list[int]`): `B` counts of the tokens the policy generated (a tools run's: not the tool
            results or template glue, as TRL counts with its tool mask; otherwise `C_i`).
        clipped (`list[bool]`): `B` flags: the (last) turn ended without a stop token (the length limit cut it).
        score_kwargs (`dict`): the reward scorer's `completions=` / `extra_kwargs=` (a tools run's: TRL's structured
            completions and the `environments`, as training passes them); empty otherwise.
        tool_counts (`dict[str, list[float]]`): a tools run's per-rollout counts ([`TOOL_COUNTS`]: `calls`,
            `failures`, `rolled_back`, `truncated`, `turns`); empty otherwise.
        num_tokens (`int`): tokens in the completions. seconds (`float`): wall time.
    """

    examples: list[dict]
    prompt_ids: list[torch.Tensor]
    completion_ids: list[torch.Tensor]
    policy_lengths: list[int]
    clipped: list[bool]
    score_kwargs: dict = field(default_factory=dict)
    tool_counts: dict[str, list[float]] = field(default_factory=dict)
    num_tokens: int = 0
    seconds: float = 0.0


TOOL_COUNTS = ("calls", "failures", "rolled_back", "truncated", "turns")  # a tools run's per-rollout counts


def completed_rollouts(rollouts: list, seconds: float) -> Completed:
    """[`Completed`] of finished tool-loop rollouts (`trl_trapo.agents.Rollout`: `example`, `prompt_ids`,
    `completion_ids`, `mask`, `turn_ended`, `messages`, `environment` and the counts of [`TOOL_COUNTS`]), scored as
    training scores them."""
    completion_ids = [torch.tensor(r.completion_ids, dtype=torch.long) for r in rollouts]
    score_kwargs: dict[str, Any] = {"completions": [r.messages for r in rollouts]}
    if any(r.environment is not None for r in rollouts):
        score_kwargs["extra_kwargs"] = {"environments": [r.environment for r in rollouts]}
    return Completed(
        [r.example for r in rollouts],
        [torch.tensor(r.prompt_ids, dtype=torch.long) for r in rollouts],
        completion_ids,
        [int(sum(r.mask)) for r in rollouts],
        [not r.turn_ended for r in rollouts],
        score_kwargs,
        {name: [float(getattr(r, name)) for r in rollouts] for name in TOOL_COUNTS},
        sum(c.numel() for c in completion_ids),
        seconds,
    )


def prompt_metric_values(
    table: torch.Tensor, reward_names: list[str], splits: list[str], tools: bool
) -> dict[str, float | None]:
    """The values of [`dataset_metric_names`]'s prompt keys (without the prefix) from every rank's completions.

    Args:
        table (`torch.Tensor`): `(N, K)` float64, one row per completion of all ranks, columns as
            [`Evaluator`] gathers them: score (weighted reward, NaN: none), `F` rewards per function (NaN: none),
            the policy's tokens, all tokens, clipped (0/1), the index of its split in `splits` (-1: none), then with
            `tools` the counts of [`TOOL_COUNTS`].
        reward_names (`list[str]`): the `F` reward functions' names.
        splits (`list[str]`): every rank's split names.
        tools (`bool`): the table has the tool counts.

    Returns:
        `dict`: TRAPO's keys as before (`reward` and `reward_<split>`: 0.0 when nothing was scored); TRL's with its
        statistics (`torch.nanmean`, TRL's `nanstd`: Bessel-corrected), None where TRL's `log` has None (a mean of
        nothing, a std of fewer than two values) — `rewards/<f>` too; lengths over the policy's tokens, the
        terminated ones' 0 when every completion was clipped (as TRL), every length 0 without completions.
    """
    count = len(reward_names)
    scores, per_func = table[:, 0], table[:, 1 : 1 + count]
    policy, total, clipped, split = (table[:, 1 + count + i] for i in range(4))
    n = table.shape[0]

    def number(value: torch.Tensor) -> float | None:  # NaN as TRL's `log` writes it: None
        value = float(value)
        return None if value != value else value

    def stats(lengths: torch.Tensor, name: str) -> dict[str, float]:
        lengths = lengths if lengths.numel() else torch.zeros(1, dtype=table.dtype)
        return {
            f"completions/mean_{name}": float(lengths.mean()),
            f"completions/min_{name}": float(lengths.min()),
            f"completions/max_{name}": float(lengths.max()),
        }

    values: dict[str, float | None] = {
        "reward": float(torch.nan_to_num(scores, nan=0.0).sum()) / max(float((~torch.isnan(scores)).sum()), 1.0),
        "reward_std": number(nanstd(scores)) if n else None,
        "completion_length": float(total.sum()) / max(n, 1),
        **stats(policy, "length"),
        "completions/clipped_ratio": float(clipped.mean()) if n else 0.0,
        **stats(policy[clipped == 0] if n else policy, "terminated_length"),
    }
    for i, name in enumerate(reward_names):
        mean = number(torch.nanmean(per_func[:, i])) if n else None
        values[f"rewards/{name}"] = values[f"rewards/{name}/mean"] = mean
        values[f"rewards/{name}/std"] = number(nanstd(per_func[:, i])) if n else None
    for index, name in enumerate(splits):
        of_split = scores[(split == index) & ~torch.isnan(scores)]
        values[f"reward_{name}"] = float(of_split.sum()) / max(of_split.numel(), 1)
    if tools:  # training's `tools/*` (trl_trapo/agents.py), over every rank's rollouts
        calls, failures, rolled_back, truncated, turns = (table[:, 5 + count + i].sum() for i in range(5))
        per = max(n, 1)
        values["tools/call_frequency"] = float(calls) / per
        values["tools/failure_frequency"] = float(failures / calls) if calls else 0.0
        values["tools/rollback_frequency"] = float(rolled_back) / per
        values["tools/truncated_frequency"] = float(truncated) / per
        values["tools/turns_mean"] = float(turns) / per
    return values


class Evaluator:
    """Evaluates held-out data by its format (see the module docstring), on every rank's shard, reduced over ranks.

    Args:
        args ([`TRAPOConfig`]): lengths and batch sizes (read only).
        tokenizer: the policy's tokenizer.
        scorer ([`~trl_trapo.rewards.RewardScorer`]): scores greedy completions.
        accelerator: the Trainer's `Accelerator`.
        unwrapped_policy (`Callable[[bool], AbstractContextManager[nn.Module]]`): enters a context holding the policy
            unwrapped for generation, in eval mode; its argument says whether to gather ZeRO-3 weights (collective).
        generation_config (`GenerationConfig`): the rollout config; evaluation uses it greedily.
        stop_token_ids (`list[int]`): completions are cut after the first of them (empty: never early).
        pad_token_id (`int`, *optional*): the id written in padding positions (default: the tokenizer's); one the
            policy embeds.
        images ([`~trl_trapo.vision.ImageRows`], *optional*): a VLM run's row builder: eval rows with an `images` /
            `image` column go through the processor, as training rows do.
        vocab_size (`int`, *optional*): the policy's embedding rows: tokenized eval prompts (`input_ids`) with an id
            outside [0, vocab_size) are refused before generation (`data.check_token_ids`).
        tool_rollouts ([`~trl_trapo.agents.GreedyToolRollouts`], *optional*): a run with `tools` /
            `environment_factory`: prompts are rolled out greedily through the training loop by it
            (`tool_rollouts(policy, rows, generation_config, gathered, role) -> list[Rollout]`, collective on several
            processes; `tool_rollouts.check_dataset(eval_dataset)` refuses prompts it cannot roll out), not completed
            in one `generate`. None: one greedy completion per prompt.
    """

    def __init__(
        self,
        args,
        tokenizer,
        scorer: RewardScorer,
        accelerator,
        unwrapped_policy: Callable[[bool], AbstractContextManager[nn.Module]],
        generation_config: GenerationConfig,
        stop_token_ids: list[int],
        pad_token_id: int | None = None,
        images: ImageRows | None = None,
        vocab_size: int | None = None,
        tool_rollouts: Any = None,
    ):
        self.args = args
        self.tool_rollouts = tool_rollouts
        self.tokenizer = tokenizer
        self.images = images
        self.vocab_size = vocab_size
        self.scorer = scorer
        self.accelerator = accelerator
        self.unwrapped_policy = unwrapped_policy
        self.generation_config = generation_config
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = tokenizer.pad_token_id if pad_token_id is None else pad_token_id

    def greedy_generation_config(self) -> GenerationConfig:
        """The rollout config with sampling off: the sampler-only flags (`SAMPLING_ONLY_FLAGS`) are left unset.

        They are unset in the constructor, not after it: `GenerationConfig` validates itself when it is built, and a
        sampler flag beside `do_sample=False` (the rollouts' `top_k=0`) is its "generation flags are not valid"
        warning, which fired on every run that evaluated. Greedy decoding ignores those flags, so no number changes.
        """
        unset = dict.fromkeys(SAMPLING_ONLY_FLAGS)
        return GenerationConfig(**{**self.generation_config.to_dict(), "do_sample": False, **unset})

    # ---- TRL 1.12 PPOTrainer's sample table -------------------------------------------------------------------------
    def generate_completions(self, own, step: int, sampling: bool = False, dataset=None) -> list[dict[str, Any]]:
        """`TRAPOTrainer.generate_completions(sampling, dataset)`: the [`completions_table`] of `dataset`, or of the
        trainer's eval set(s) `own` when it is None.

        Args:
            own (`Dataset`, `dict[str, Dataset]` or None): the trainer's `eval_dataset`.
            step (`int`): the optimizer step, for the table's title.
            sampling (`bool`): only the first `per_device_eval_batch_size` prompts (used during training). TRL 1.12's
                `PPOTrainer.generate_completions(sampling=False)` had only this argument.
            dataset (`Dataset`, `dict[str, Dataset]` or `str`, *optional*): prompts to complete instead, as
                `evaluate(eval_dataset)` takes them (a string: a key of the trainer's eval dict); checked as it checks.

        Raises:
            TypeError: if `sampling` is not a bool, e.g. a dataset passed positionally (it was taken as
                `sampling=True`: `[]` without an eval set, else the eval set's completions), naming `dataset=`.
            ValueError: as `evaluate()` for a `dataset` it cannot use, and as [`completions_table`] without prompts.
        """
        if not isinstance(sampling, bool):
            raise TypeError(
                f"generate_completions(sampling=...) takes a bool (True: only the first per_device_eval_batch_size "
                f"prompts, as during training), and got a {type(sampling).__name__}. To complete the prompts of a "
                "dataset of your own, pass it by name: `trainer.generate_completions(dataset=my_dataset)`."
            )
        if dataset is None:
            return self.completions_table(own, step, sampling)
        dataset = self.dataset_given(dataset, own, "generate_completions(dataset")
        return self.completions_table(dataset, step, sampling, source="`dataset`")

    def dataset_given(self, dataset, own, call: str = "evaluate(eval_dataset"):
        """The dataset `evaluate(dataset)` / `generate_completions(dataset=...)` (`call`) works on, checked as the
        trainer's construction checks eval sets ([`~trl_trapo.data.dataset_to_evaluate`], against the run's tokenizer
        or processor and chat template too); `own` (the trainer's `eval_dataset`) when `dataset` is None.

        Raises:
            ValueError: as [`~trl_trapo.data.dataset_to_evaluate`], naming the dataset and the fix.
        """
        processing_class = self.images.processor if self.images is not None else self.tokenizer
        return dataset_to_evaluate(
            dataset,
            own,
            self.tokenizer,
            self.args.assistant_only_loss,
            call,
            processing_class,
            self.args.chat_template_kwargs,
        )

    @torch.no_grad()
    def completions_table(
        self, dataset, step: int, sampling: bool = False, source: str = OWN_EVAL_SET
    ) -> list[dict[str, Any]]:
        """Greedy completions of the prompts of `dataset` with their scores, printed as a table (and logged to W&B /
        Trackio when they are in `report_to`), as TRL 1.12's `PPOTrainer.generate_completions` did.

        Args:
            dataset (`Dataset` or `dict[str, Dataset]`): eval prompts (the first dataset of a dict).
            step (`int`): the optimizer step, for the table's title.
            sampling (`bool`): only the first `per_device_eval_batch_size` prompts (used during training).
            source (`str`): what the messages call `dataset`; not `OWN_EVAL_SET` (a dataset the user passed):
                refused without prompts even with `sampling`.

        In a run with tools, each prompt is rolled out greedily through the tool loop (see `evaluate`): the
        completion is the whole rollout (every turn and tool result), scored as training scores it.

        Returns:
            `list[dict]`: one `{"prompt", "completion", "score"}` per prompt on this rank (with `sampling`: empty
            without prompts).

        Raises:
            ValueError: without `sampling` (the user's call), when there is no dataset or it has no prompts (a
                `prompt` or `input_ids` column), as `evaluate()` refuses a missing eval dataset; in a run with tools,
                when its prompts are not chat messages (`AgentSpec.check_eval_prompts`).
        """
        if isinstance(dataset, dict):
            dataset = next(iter(dataset.values()), None)
        columns = sorted(dataset_columns(dataset)) if dataset is not None else []
        if not {"prompt", "input_ids"} & set(columns):
            if sampling and source == OWN_EVAL_SET:  # during training: nothing to show
                return []
            if dataset is None:
                raise ValueError(
                    "generate_completions() completes the eval prompts, and there is no `eval_dataset`: pass one of "
                    "prompts (a `prompt` column) to the trainer (`eval_dataset=`)."
                )
            raise ValueError(
                f"generate_completions() completes prompts, and {source} has no prompts: its columns are {columns}, "
                "with no `prompt` (or tokenized `input_ids`). Pass a dataset of prompts, or use evaluate() for text / "
                "demonstrations (their losses)."
            )
        args = self.args
        if self.tool_rollouts is not None:
            self.tool_rollouts.check_dataset(dataset)
        if sampling:
            dataset = dataset.select(range(min(len(dataset), args.per_device_eval_batch_size)))
        tokenized = tokenize_prompt_dataset(
            dataset,
            self.tokenizer,
            args.max_prompt_length,
            args.chat_template_kwargs,
            "eval_dataset",
            images=self.images,
            vocab_size=self.vocab_size,
        )
        with self.unwrapped_policy(args.ds3_gather_for_generation) as policy:
            # every rank completes every prompt: the same rows, so a tools run's turns are in step across ranks
            done = self._complete(policy, tokenized, args.ds3_gather_for_generation, None, None, "eval_dataset")
        # what reward functions log here describes no training rollout: dropped, never in a training log
        scores, _ = self.scorer.score(
            done.examples, done.prompt_ids, done.completion_ids, discard_metric, discard_extra, **done.score_kwargs
        )
        completions = self.tokenizer.batch_decode(done.completion_ids, skip_special_tokens=True)
        table = [
            {"prompt": e["prompt"], "completion": c, "score": float(s)}
            for e, c, s in zip(done.examples, completions, scores.tolist())
        ]
        if self.accelerator.is_main_process:
            self._report_table(table, completions, scores, step)
        return table

    def _report_table(self, table: list[dict], completions: list[str], scores: torch.Tensor, step: int) -> None:
        try:
            print_prompt_completions_sample(
                [r["prompt"] for r in table], completions, {"score": scores.tolist()}, None, step, 5
            )
        except ImportError:  # `rich` is optional
            for row in table[:5]:
                logger.info("step %d | %r -> %r (score %.4f)", step, *row.values())
        report_to = self.args.report_to or []
        if "wandb" in report_to:
            import wandb

            if wandb.run is not None:
                wandb.log({"completions": wandb.Table(columns=list(table[0]), rows=[list(r.values()) for r in table])})
        if "trackio" in report_to:
            import trackio

            trackio.log({"completions": trackio.Table(columns=list(table[0]), data=[list(r.values()) for r in table])})

    # ---- held-out metrics -------------------------------------------------------------------------------------------
    def evaluate(self, dataset, prefix: str) -> dict[str, float | None]:
        """Metrics of one held-out dataset, by its format (see the module docstring); every key is listed by
        [`dataset_metric_names`] (the table `check_best_model_metric` reads), then transformers' speed metrics.

        - prompt-only: TRAPO's `<prefix>_reward` (weighted, mean over completions with a reward; 0.0 when none has
          one), `<prefix>_rewards/<name>` (None when the function scored none), `<prefix>_completion_length` (every
          token of the completion); with a `split` column, also `<prefix>_reward_<split>` per split; TRL
          `GRPOTrainer`'s eval keys over the greedy completions: `<prefix>_reward_std`, `<prefix>_rewards/<name>/mean`
          and `/std`, `<prefix>_completions/mean_length`, `min_length`, `max_length` (the policy's tokens),
          `clipped_ratio` (no stop token), `mean_terminated_length`, `min_terminated_length`,
          `max_terminated_length` (see [`prompt_metric_values`]; over the whole set's greedy completions, one per
          prompt, where TRL averages each eval batch's statistics over its `num_generations_eval` sampled
          completions per prompt: the same numbers when the set is one batch and TRL decodes greedily); what reward
          functions report with `log_metric(name, value)` while scoring these completions, as `<prefix>_<name>`
          (mean over the calls, all ranks) — never in a training log; their `log_extra` columns are dropped. A
          `metric_for_best_model` whose value is None is warned about. In a run with tools
          (`tool_rollouts`), each prompt is a greedy multi-turn rollout through the training loop, scored with TRL's
          structured completions and the `environments`, and training's `tools/*` metrics are reported over every
          rank's rollouts as `<prefix>_tools/call_frequency`, `<prefix>_tools/failure_frequency`,
          `<prefix>_tools/rollback_frequency`, `<prefix>_tools/truncated_frequency`, `<prefix>_tools/turns_mean`
          (`completion_length` counts every turn and tool result, `completions/*` the policy's turns only; clipped:
          the last turn ended without a stop token);
        - `text`: `<prefix>_pretrain_loss` (nats/token, documents chunked to `pretrain_max_length`);
        - prompt-completion / `messages`: `<prefix>_sft_loss` (nats per completion token);
        - every format: `<prefix>_runtime` (seconds), `<prefix>_samples_per_second` (rows of the whole dataset),
          `<prefix>_steps_per_second` (batches of `per_device_eval_batch_size` x processes), from transformers'
          `speed_metrics`, as `Trainer.evaluate` computes them.

        Collective: every rank must call it (its shard may be empty).

        Raises:
            ValueError: if the dataset's format is none of the above, it is not a map-style `Dataset` (a streaming
                one cannot be sharded by index), or, in a run with tools, its prompts are not chat messages.
        """
        start = time.time()
        check_dataset_object(dataset, f"eval_dataset ({prefix})")
        columns = dataset_columns(dataset)
        kind = eval_format(columns)
        if kind is None:
            raise ValueError(
                f"Cannot evaluate a dataset with columns {columns}: expected 'prompt' (greedy rewards), 'text' "
                "(pretraining loss) or 'prompt'+'completion' / 'messages' (SFT loss)."
            )
        if self.tool_rollouts is not None:  # before anything slow: prompts the tool loop cannot render
            self.tool_rollouts.check_dataset(dataset)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        shard = dataset.select(range(rank, len(dataset), world)) if len(dataset) > rank else dataset.select([])
        args, pad_id = self.args, self.pad_token_id
        # every rank enters (gathering ZeRO-3 weights is collective), so shards may hold different numbers of rows
        with self.unwrapped_policy(True) as policy:
            if kind == "text":
                rows = document_rows(shard["text"], self.tokenizer, args.pretrain_max_length)
                column = image_column(columns, prefix) if self.images is not None else None
                if column is not None:  # documents with images are rows of their own (see PretrainStream)
                    rows = image_document_rows(shard, column, self.images, args.pretrain_max_length, prefix)
                sums = self._reduce_floats(nll_sum(policy, rows, pad_id, args.per_device_eval_batch_size))
                metrics = {f"{prefix}_pretrain_loss": sums[0] / max(sums[1], 1.0)}
            elif kind == "sft":
                tokenized = (
                    tokenize_sft_dataset(
                        shard,
                        self.tokenizer,
                        args.sft_max_length,
                        args.chat_template_kwargs,
                        # the SFT objective's masking, for conversational rows (text rows: completion-only already)
                        assistant_only_loss=args.assistant_only_loss and "messages" in columns,
                        images=self.images,
                        role=f"eval_dataset ({prefix})",
                    )
                    if len(shard)
                    else None
                )
                total = (
                    nll_sum(policy, sft_rows(tokenized), pad_id, args.per_device_eval_batch_size)
                    if tokenized
                    else (0.0, 0.0)
                )
                sums = self._reduce_floats(total)
                metrics = {f"{prefix}_sft_loss": sums[0] / max(sums[1], 1.0)}
            else:
                metrics = self._evaluate_prompts(shard, prefix, policy)
        batches = math.ceil(len(dataset) / (args.per_device_eval_batch_size * world))  # `Trainer.evaluate`'s steps
        metrics.update(speed_metrics(prefix, start, num_samples=len(dataset), num_steps=batches))
        best = args.metric_for_best_model or ""
        best = best if best.startswith("eval_") else f"eval_{best}"  # transformers' own prefixing
        if best in metrics and metrics[best] is None:  # transformers compares it with `np.greater`: a TypeError
            logger.warning(
                "metric_for_best_model=%r has no value at this evaluation of %s (None: the reward function returned "
                "None for every completion, or a standard deviation had fewer than two scores), and a best-model "
                "comparison (load_best_model_at_end, save_strategy='best', a metric scheduler) cannot compare None. "
                "Fix: name a reward function that scores these prompts, or metric_for_best_model='%s_reward'.",
                args.metric_for_best_model,
                prefix,
                prefix,
            )
        return metrics

    def _reduce_floats(self, values) -> list[float]:
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(tensor, reduction="sum").cpu().tolist()

    @torch.no_grad()
    def _evaluate_prompts(self, shard, prefix: str, policy: nn.Module) -> dict[str, float | None]:
        args = self.args
        names = self.scorer.names
        tools = self.tool_rollouts is not None
        all_splits = self._gather_strings(dataset_splits(shard) if len(shard) else [])
        logged: dict[str, list[float]] = {}  # what reward functions `log_metric` while scoring these completions

        def log_metric(name: str, value: float) -> None:
            logged.setdefault(name, []).append(float(value))

        tokenized = None
        if len(shard):
            tokenized = tokenize_prompt_dataset(
                shard,
                self.tokenizer,
                args.max_prompt_length,
                args.chat_template_kwargs,
                name="eval_dataset",
                images=self.images,
                vocab_size=self.vocab_size,
            )
        done = None
        if tokenized is not None or tools:  # a tools run's turns: every rank, rows or none
            done = self._complete(
                policy,
                shard if tokenized is None else tokenized,
                True,
                generation_synced_gpus(self.accelerator, gathered=True),
                None if args.disable_tqdm or not self.accelerator.is_main_process else f"Evaluating {prefix}",
                f"eval_dataset ({prefix})",
            )
        # one row per completion (columns: see `prompt_metric_values`), gathered from every rank (collective)
        width = 5 + len(names) + (len(TOOL_COUNTS) if tools else 0)
        rows = torch.zeros((0, width), dtype=torch.float64)
        if done is not None and done.examples:
            logger.info(
                "Evaluation %s: %d prompts, %d tokens in their completions (greedy) in %.1f s.",
                prefix,
                len(done.examples),
                done.num_tokens,
                done.seconds,
            )
            scores, per_func = self.scorer.score(
                done.examples, done.prompt_ids, done.completion_ids, log_metric, discard_extra, **done.score_kwargs
            )
            split_index = {name: index for index, name in enumerate(all_splits)}
            columns = [
                scores.double().unsqueeze(1),
                per_func.double().reshape(len(done.examples), len(names)),
                torch.tensor(done.policy_lengths, dtype=torch.float64).unsqueeze(1),
                torch.tensor([float(c.numel()) for c in done.completion_ids], dtype=torch.float64).unsqueeze(1),
                torch.tensor(done.clipped, dtype=torch.float64).unsqueeze(1),
                torch.tensor(
                    [float(split_index.get(str(e.get("split")), -1)) for e in done.examples], dtype=torch.float64
                ).unsqueeze(1),
            ]
            if tools:
                columns.append(torch.tensor([done.tool_counts[k] for k in TOOL_COUNTS], dtype=torch.float64).T)
            rows = torch.cat(columns, dim=1)
        table = gather_across_ranks(self.accelerator, rows).cpu()
        values = prompt_metric_values(table, names, all_splits, tools)
        # the evaluator's table of keys (`dataset_metric_names`, which `check_best_model_metric` reads) says what
        # this returns: a key it lists and nothing computed is a KeyError here, not a best-model metric gone missing
        metrics = {
            key: values[key[len(prefix) + 1 :]]
            for key in dataset_metric_names("prompts", prefix, names, all_splits, tools)
        }
        # what the reward functions logged (collective, as `gather_across_ranks`); TRAPO's own metrics win a clash
        for name, value in reduce_named_means(self.accelerator, logged).items():
            metrics.setdefault(f"{prefix}_{name}", value)
        return metrics

    def _complete(
        self, policy: nn.Module, rows, gathered: bool, synced_gpus: bool | None, progress: str | None, role: str
    ) -> Completed:
        """The greedy completions of `rows` (tokenized prompts, with `prompt_ids`): one `generate`, or in a run with
        tools the tool loop's rollouts (`tool_rollouts`; collective on several processes, so every rank calls this
        then, with or without rows). `gathered`: whether the policy's ZeRO-3 weights are gathered; `synced_gpus` and
        `progress`: the single `generate`'s."""
        if self.tool_rollouts is not None:
            start = time.perf_counter()
            rollouts = self.tool_rollouts(policy, rows, self.greedy_generation_config(), gathered=gathered, role=role)
            return completed_rollouts(rollouts, time.perf_counter() - start)
        examples = [rows[i] for i in range(len(rows))]
        # `as_tensor`: a torch-formatted eval set's rows hold tensors, which `torch.tensor` copies with a warning
        prompt_ids = [torch.as_tensor(e["prompt_ids"], dtype=torch.long) for e in examples]
        generated = generate(
            policy,
            [p.tolist() for p in prompt_ids],
            self.greedy_generation_config(),
            self.pad_token_id,
            self.stop_token_ids,
            1.0,
            batch_size=self.args.per_device_eval_batch_size,
            record_logps=False,
            model_inputs=prompt_model_inputs(examples),
            synced_gpus=synced_gpus,
            progress=progress,
        )
        completion_ids = generated["completion_ids"]
        stops = torch.tensor(self.stop_token_ids or [self.tokenizer.eos_token_id])  # training's missing-stop test
        clipped = [not bool(torch.isin(c, stops).any()) for c in completion_ids]
        return Completed(
            examples,
            prompt_ids,
            completion_ids,
            [c.numel() for c in completion_ids],
            clipped,
            num_tokens=generated["num_tokens"],
            seconds=generated["seconds"],
        )

    def _gather_strings(self, values: list[str]) -> list[str]:
        if self.accelerator.num_processes == 1:
            return sorted(values)
        from accelerate.utils import gather_object

        return sorted(set(gather_object(list(values))))
