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

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import EarlyStoppingCallback, GenerationConfig
from trl.trainer.utils import print_prompt_completions_sample, selective_log_softmax

from .collator import MODEL_INPUTS, Row, collate_rows
from .config import PRETRAIN
from .data import check_dataset_object, dataset_columns, sft_row, tokenize_prompt_dataset, tokenize_sft_dataset
from .distributed import generation_synced_gpus, reduce_named_means
from .models import model_forward
from .rewards import RewardScorer, discard_extra, discard_metric
from .rollout import generate, prompt_model_inputs
from .setup_checks import METRIC_SCHEDULERS
from .vision import ImageRows, as_tensors, image_column


logger = logging.getLogger(__name__)

# the flags only sampling reads: `GenerationConfig.validate` warns about each one set beside `do_sample=False`
SAMPLING_ONLY_FLAGS = ("temperature", "top_p", "top_k", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff")


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


def evaluation_metrics(eval_dataset, prefix: str = "eval") -> dict[str, bool]:
    """The headline metric `Evaluator.evaluate` logs for each held-out dataset, and whether greater is better:
    `<prefix>_reward` for prompts, `<prefix>_pretrain_loss` for text, `<prefix>_sft_loss` for demonstrations (a dict
    of datasets gets `<prefix>_<name>_...`)."""
    datasets = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    out: dict[str, bool] = {}
    for name, dataset in datasets:
        if dataset is None:
            continue
        columns = set(dataset_columns(dataset))
        base = prefix if name is None else f"{prefix}_{name}"
        if "text" in columns:
            out[f"{base}_pretrain_loss"] = False
        elif "completion" in columns or "messages" in columns:
            out[f"{base}_sft_loss"] = False
        elif "prompt" in columns or "input_ids" in columns:
            out[f"{base}_reward"] = True
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


def check_best_model_metric(args, eval_dataset, callbacks: list | None = None) -> None:
    """With `load_best_model_at_end`, `save_strategy="best"`, or a `transformers.EarlyStoppingCallback` among
    `callbacks`, `metric_for_best_model` must be a metric TRAPO logs for the eval data; early stopping also needs
    evaluations (`eval_strategy` not "no"). transformers' callback asserts both only when `train()` starts. The same
    for an `lr_scheduler_type` in `METRIC_SCHEDULERS` (transformers sets `metric_for_best_model='loss'` for it when
    unset, and raised a `KeyError` at the first evaluation after training began), whose
    `lr_scheduler_kwargs['mode']` (default 'min') must also match the metric's direction.

    Raises:
        ValueError: naming the field, the value and the metrics to choose from (with `greater_is_better`), before
            training; TRAPO never logs the Trainer's default `eval_loss`.
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
    available = evaluation_metrics(eval_dataset)
    choices = ", ".join(
        f"metric_for_best_model={m!r} with greater_is_better={better}" for m, better in available.items()
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
    metric = args.metric_for_best_model or "loss"
    name = metric if metric.startswith("eval_") else f"eval_{metric}"
    if name not in available:
        default = " (transformers' default)" if on_metric and metric == "loss" else ""
        mode = (
            " The scheduler's mode must match the metric: `lr_scheduler_kwargs={'mode': 'max'}` for one that is "
            "higher when better (its default 'min' is for a loss)."
            if on_metric
            else ""
        )
        raise ValueError(
            f"{type(args).__name__}.metric_for_best_model={metric!r}{default} is not a metric TRAPO logs ({user} "
            "compares it after every evaluation): "
            + (fix if choices else f"{fix[:-1]}, or drop {user.split('=')[0]}.")
            + mode
        )
    if on_metric:  # transformers passes the metric as is; the scheduler's `mode` says which way is better
        mode = (args.lr_scheduler_kwargs or {}).get("mode", "min")
        wanted = "max" if available[name] else "min"
        if mode != wanted:
            raise ValueError(
                f"{type(args).__name__}.lr_scheduler_type={kind!r} steps on metric_for_best_model={metric!r}, which is "
                f"{'higher' if available[name] else 'lower'} when better, but the scheduler's mode is {mode!r}: it "
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
        score_kwargs (`dict`): the reward scorer's `completions=` / `extra_kwargs=` (a tools run's: TRL's structured
            completions and the `environments`, as training passes them); empty otherwise.
        tool_counts (`dict[str, float]`): a tools run's counts over these rollouts (`calls`, `failures`,
            `rolled_back`, `truncated`, `turns`); empty otherwise.
        num_tokens (`int`): tokens in the completions. seconds (`float`): wall time.
    """

    examples: list[dict]
    prompt_ids: list[torch.Tensor]
    completion_ids: list[torch.Tensor]
    score_kwargs: dict = field(default_factory=dict)
    tool_counts: dict[str, float] = field(default_factory=dict)
    num_tokens: int = 0
    seconds: float = 0.0


TOOL_COUNTS = ("calls", "failures", "rolled_back", "truncated", "turns")  # a tools run's per-rollout counts


def completed_rollouts(rollouts: list, seconds: float) -> Completed:
    """[`Completed`] of finished tool-loop rollouts (`trl_trapo.agents.Rollout`: `example`, `prompt_ids`,
    `completion_ids`, `messages`, `environment` and the counts of [`TOOL_COUNTS`]), scored as training scores them."""
    completion_ids = [torch.tensor(r.completion_ids, dtype=torch.long) for r in rollouts]
    score_kwargs: dict[str, Any] = {"completions": [r.messages for r in rollouts]}
    if any(r.environment is not None for r in rollouts):
        score_kwargs["extra_kwargs"] = {"environments": [r.environment for r in rollouts]}
    return Completed(
        [r.example for r in rollouts],
        [torch.tensor(r.prompt_ids, dtype=torch.long) for r in rollouts],
        completion_ids,
        score_kwargs,
        {name: float(sum(getattr(r, name) for r in rollouts)) for name in TOOL_COUNTS},
        sum(c.numel() for c in completion_ids),
        seconds,
    )


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
    @torch.no_grad()
    def completions_table(self, dataset, step: int, sampling: bool = False) -> list[dict[str, Any]]:
        """Greedy completions of the prompts of `dataset` with their scores, printed as a table (and logged to W&B /
        Trackio when they are in `report_to`), as TRL 1.12's `PPOTrainer.generate_completions` did.

        Args:
            dataset (`Dataset` or `dict[str, Dataset]`): eval prompts (the first dataset of a dict).
            step (`int`): the optimizer step, for the table's title.
            sampling (`bool`): only the first `per_device_eval_batch_size` prompts (used during training).

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
            if sampling:
                return []
            if dataset is None:
                raise ValueError(
                    "generate_completions() completes the eval prompts, and there is no `eval_dataset`: pass one of "
                    "prompts (a `prompt` column) to the trainer (`eval_dataset=`)."
                )
            raise ValueError(
                f"generate_completions() completes the eval prompts, and the (first) eval_dataset has no prompts: its "
                f"columns are {columns}, with no `prompt` (or tokenized `input_ids`). Pass an eval_dataset of prompts, "
                "or use evaluate() for text / demonstrations (their losses)."
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
    def evaluate(self, dataset, prefix: str) -> dict[str, float]:
        """Metrics of one held-out dataset, by its format (see the module docstring).

        - prompt-only: `<prefix>_reward` (weighted, mean over completions with a reward), `<prefix>_rewards/<name>`,
          `<prefix>_completion_length`; with a `split` column, also `<prefix>_reward_<split>` per split; what reward
          functions report with `log_metric(name, value)` while scoring these completions, as `<prefix>_<name>` (mean
          over the calls, all ranks) — never in a training log; their `log_extra` columns are dropped. In a run with
          tools (`tool_rollouts`), each prompt is a greedy multi-turn rollout through the training loop, scored with
          TRL's structured completions and the `environments`, and training's `tools/*` metrics are reported over
          every rank's rollouts as `<prefix>_tools/call_frequency`, `<prefix>_tools/failure_frequency`,
          `<prefix>_tools/rollback_frequency`, `<prefix>_tools/truncated_frequency`, `<prefix>_tools/turns_mean`
          (the completion length counts every turn and tool result);
        - `text`: `<prefix>_pretrain_loss` (nats/token, documents chunked to `pretrain_max_length`);
        - prompt-completion / `messages`: `<prefix>_sft_loss` (nats per completion token).

        Collective: every rank must call it (its shard may be empty).

        Raises:
            ValueError: if the dataset's format is none of the above, it is not a map-style `Dataset` (a streaming
                one cannot be sharded by index), or, in a run with tools, its prompts are not chat messages.
        """
        check_dataset_object(dataset, f"eval_dataset ({prefix})")
        if self.tool_rollouts is not None:  # before anything slow: prompts the tool loop cannot render
            self.tool_rollouts.check_dataset(dataset)
        columns = dataset_columns(dataset)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        shard = dataset.select(range(rank, len(dataset), world)) if len(dataset) > rank else dataset.select([])
        args, pad_id = self.args, self.pad_token_id
        # every rank enters (gathering ZeRO-3 weights is collective), so shards may hold different numbers of rows
        with self.unwrapped_policy(True) as policy:
            if "text" in columns:
                rows = document_rows(shard["text"], self.tokenizer, args.pretrain_max_length)
                column = image_column(columns, prefix) if self.images is not None else None
                if column is not None:  # documents with images are rows of their own (see PretrainStream)
                    rows = image_document_rows(shard, column, self.images, args.pretrain_max_length, prefix)
                sums = self._reduce_floats(nll_sum(policy, rows, pad_id, args.per_device_eval_batch_size))
                return {f"{prefix}_pretrain_loss": sums[0] / max(sums[1], 1.0)}
            if "completion" in columns or "messages" in columns:
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
                return {f"{prefix}_sft_loss": sums[0] / max(sums[1], 1.0)}
            if "prompt" in columns or "input_ids" in columns:
                return self._evaluate_prompts(shard, prefix, policy)
        raise ValueError(
            f"Cannot evaluate a dataset with columns {columns}: expected 'prompt' (greedy rewards), 'text' "
            "(pretraining loss) or 'prompt'+'completion' / 'messages' (SFT loss)."
        )

    def _reduce_floats(self, values) -> list[float]:
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(tensor, reduction="sum").cpu().tolist()

    @torch.no_grad()
    def _evaluate_prompts(self, shard, prefix: str, policy: nn.Module) -> dict[str, float]:
        args = self.args
        names = self.scorer.names
        splits = sorted(set(shard["split"])) if "split" in dataset_columns(shard) and len(shard) else []
        all_splits = self._gather_strings(splits)
        sums: dict[str, float] = {"n": 0.0, "scored": 0.0, "reward": 0.0, "length": 0.0}
        for name in names:
            sums[f"r/{name}"] = sums[f"c/{name}"] = 0.0
        for split in all_splits:
            sums[f"s/{split}"] = sums[f"sc/{split}"] = 0.0
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
        if tokenized is not None or self.tool_rollouts is not None:  # a tools run's turns: every rank, rows or none
            done = self._complete(
                policy,
                shard if tokenized is None else tokenized,
                True,
                generation_synced_gpus(self.accelerator, gathered=True),
                None if args.disable_tqdm or not self.accelerator.is_main_process else f"Evaluating {prefix}",
                f"eval_dataset ({prefix})",
            )
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
            valid = ~torch.isnan(scores)
            sums["n"] = float(len(done.examples))
            sums["scored"] = float(valid.sum())
            sums["reward"] = float(torch.nan_to_num(scores, nan=0.0).sum())
            sums["length"] = float(sum(c.numel() for c in done.completion_ids))
            for i, name in enumerate(names):
                column = per_func[:, i]
                sums[f"r/{name}"] = float(torch.nan_to_num(column, nan=0.0).sum())
                sums[f"c/{name}"] = float((~torch.isnan(column)).sum())
            if splits:
                for example, score in zip(done.examples, scores.tolist()):
                    if score == score:  # not NaN
                        sums[f"s/{example['split']}"] += score
                        sums[f"sc/{example['split']}"] += 1.0
        if self.tool_rollouts is not None:  # the same keys on every rank (the reduction below is collective)
            for name in TOOL_COUNTS:
                sums[f"t/{name}"] = done.tool_counts[name] if done is not None else 0.0
        keys = sorted(sums)
        reduced = dict(zip(keys, self._reduce_floats([sums[k] for k in keys])))
        metrics = {
            f"{prefix}_reward": reduced["reward"] / max(reduced["scored"], 1.0),
            f"{prefix}_completion_length": reduced["length"] / max(reduced["n"], 1.0),
        }
        for name in names:
            if reduced[f"c/{name}"]:
                metrics[f"{prefix}_rewards/{name}"] = reduced[f"r/{name}"] / reduced[f"c/{name}"]
        for split in all_splits:
            metrics[f"{prefix}_reward_{split}"] = reduced[f"s/{split}"] / max(reduced[f"sc/{split}"], 1.0)
        if self.tool_rollouts is not None:  # training's `tools/*` (trl_trapo/agents.py), over every rank's rollouts
            total, calls = max(reduced["n"], 1.0), reduced["t/calls"]
            metrics[f"{prefix}_tools/call_frequency"] = calls / total
            metrics[f"{prefix}_tools/failure_frequency"] = reduced["t/failures"] / calls if calls else 0.0
            metrics[f"{prefix}_tools/rollback_frequency"] = reduced["t/rolled_back"] / total
            metrics[f"{prefix}_tools/truncated_frequency"] = reduced["t/truncated"] / total
            metrics[f"{prefix}_tools/turns_mean"] = reduced["t/turns"] / total
        for name, value in reduce_named_means(self.accelerator, logged).items():  # collective, as `_reduce_floats`
            metrics.setdefault(f"{prefix}_{name}", value)  # TRAPO's own metrics win a name clash
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
        prompt_ids = [torch.tensor(e["prompt_ids"]) for e in examples]
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
        return Completed(
            examples, prompt_ids, completion_ids, num_tokens=generated["num_tokens"], seconds=generated["seconds"]
        )

    def _gather_strings(self, values: list[str]) -> list[str]:
        if self.accelerator.num_processes == 1:
            return sorted(values)
        from accelerate.utils import gather_object

        return sorted(set(gather_object(list(values))))
