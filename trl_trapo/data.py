# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Datasets of the three objectives: format checks, tokenisation, per-rank sampling and pretraining packing.

Accepted formats (TRL's standard dataset formats, https://huggingface.co/docs/trl/dataset_formats):

| objective | columns | notes |
|---|---|---|
| pretraining | `text` | map-style or streaming; packed (EOS between documents) or chunked to `pretrain_max_length` |
| SFT | `prompt` + `completion`, or `messages` | standard or conversational; loss on completion tokens + EOS only |
| RL | `prompt`, or `input_ids` (PPO's tokenized prompts) | standard or conversational; other columns go to rewards |

Rows handed to the collator are dicts with `input_ids` (shape `(L,)`) and a target-aligned `mask` (shape `(L - 1,)`,
1 where predicting token t + 1 counts); masks always come from lengths, never from comparing ids with the pad id, so
a tokenizer whose pad token is its EOS token is handled correctly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from trl.data_utils import apply_chat_template, is_conversational

from .collator import Row
from .config import PRETRAIN, SFT


logger = logging.getLogger(__name__)


def dataset_columns(dataset: Dataset | IterableDataset) -> list[str]:
    """Column names of a map-style or streaming dataset (empty list if unknown)."""
    names = getattr(dataset, "column_names", None)
    if names is None and isinstance(dataset, IterableDataset):
        features = dataset.features
        names = list(features) if features is not None else []
    return list(names or [])


def _check_not_empty(dataset: Dataset | IterableDataset, name: str) -> None:
    if isinstance(dataset, Dataset) and len(dataset) == 0:
        raise ValueError(f"`{name}` is empty (0 rows). Pass a dataset with at least one row, or None to drop it.")


def check_pretrain_dataset(dataset: Dataset | IterableDataset) -> None:
    """Raise a ValueError unless `dataset` is a non-empty language-modelling dataset with a `text` column."""
    _check_not_empty(dataset, "pretrain_dataset")
    columns = dataset_columns(dataset)
    if columns and "text" not in columns:
        raise ValueError(
            f"`pretrain_dataset` must have a 'text' column (TRL's language-modelling format); it has {columns}. "
            "Rename your text column to 'text', e.g. `dataset.rename_column('content', 'text')`."
        )


def check_sft_dataset(dataset: Dataset) -> None:
    """Raise a ValueError unless `dataset` is a non-empty prompt-completion or `messages` dataset."""
    _check_not_empty(dataset, "sft_dataset")
    columns = dataset_columns(dataset)
    if not ({"prompt", "completion"} <= set(columns) or "messages" in columns):
        raise ValueError(
            f"`sft_dataset` must have 'prompt' and 'completion' columns (prompt-completion format) or a 'messages' "
            f"column (conversational format); it has {columns}. See https://huggingface.co/docs/trl/dataset_formats."
        )


def check_prompt_dataset(dataset: Dataset, name: str = "train_dataset") -> None:
    """Raise a ValueError unless `dataset` is a non-empty prompt-only dataset (`prompt` or tokenized `input_ids`)."""
    _check_not_empty(dataset, name)
    columns = dataset_columns(dataset)
    if "prompt" not in columns and "input_ids" not in columns:
        raise ValueError(
            f"`{name}` (RL prompts) must have a 'prompt' column (TRL's prompt-only format) or an 'input_ids' column "
            f"(tokenized prompts, as TRL's PPOTrainer took); it has {columns}."
        )


def _prompt_text(prompt: Any, tokenizer, template_kwargs: dict) -> str:
    if is_conversational({"prompt": prompt}):
        return apply_chat_template({"prompt": prompt}, tokenizer, **template_kwargs)["prompt"]
    return prompt


def tokenize_prompt(prompt: Any, tokenizer, template_kwargs: dict | None = None) -> list[int]:
    """Token ids of one prompt, as used both for generation and as the prefix of SFT rows.

    Conversational prompts get the chat template (with the generation prompt) and no extra special tokens; standard
    text prompts get the tokenizer's special tokens (e.g. BOS) as `tokenizer(text)` adds them.

    Args:
        prompt (`str` or `list[dict]`): a prompt in standard or conversational format.
        tokenizer: the policy's tokenizer.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template`.

    Returns:
        `list[int]`: the prompt's token ids.
    """
    template_kwargs = template_kwargs or {}
    if is_conversational({"prompt": prompt}):
        text = _prompt_text(prompt, tokenizer, template_kwargs)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def tokenize_sft_dataset(
    dataset: Dataset, tokenizer, max_length: int, template_kwargs: dict | None = None, num_proc: int | None = None
) -> Dataset:
    """Tokenise an SFT dataset into `input_ids` and `completion_mask` (1 on completion tokens and the final EOS).

    The completion ends with exactly one EOS: a standard completion gets one appended unless it ends with it; a
    conversational completion keeps what the chat template renders when that already ends the turn with EOS (as
    ChatML's `<|im_end|>\n` does; TRL's SFT appends nothing to such rows) and gets one appended otherwise.

    `messages` rows are split into a prompt (every message before the last one) and a completion (the last message,
    which must be the assistant's), so the loss is on the final assistant turn. Rows longer than `max_length` are
    truncated from the right; the number truncated is logged.

    Args:
        dataset (`Dataset`): prompt-completion or `messages` dataset.
        tokenizer: the policy's tokenizer (must have an EOS token).
        max_length (`int`): maximum row length in tokens.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template`.
        num_proc (`int`, *optional*): processes for `Dataset.map`.

    Returns:
        `Dataset` with columns `input_ids` and `completion_mask` (lists of equal length).

    Raises:
        ValueError: if a `messages` row does not end with an assistant message, or no row keeps a completion token.
    """
    template_kwargs = template_kwargs or {}
    eos = tokenizer.eos_token_id

    def tokenize(example: dict) -> dict:
        if "messages" in example and example.get("messages") is not None and "completion" not in example:
            messages = example["messages"]
            if not messages or messages[-1].get("role") != "assistant":
                raise ValueError(
                    "An `sft_dataset` 'messages' row must end with an assistant message (the completion to learn); "
                    f"got last role {messages[-1].get('role') if messages else None!r}."
                )
            example = {"prompt": messages[:-1], "completion": messages[-1:]}
        prompt, completion = example["prompt"], example["completion"]
        if is_conversational({"prompt": prompt}):
            rendered = apply_chat_template({"prompt": prompt, "completion": completion}, tokenizer, **template_kwargs)
            prompt_ids = tokenizer(rendered["prompt"], add_special_tokens=False)["input_ids"]
            completion_ids = tokenizer(rendered["completion"], add_special_tokens=False)["input_ids"]
            ends_turn = eos in completion_ids  # the template ends the turn itself (e.g. ChatML's "<|im_end|>\n")
        else:
            prompt_ids = tokenizer(prompt)["input_ids"]
            completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
            ends_turn = bool(completion_ids) and completion_ids[-1] == eos
        if not ends_turn:
            completion_ids = completion_ids + [eos]
        input_ids = prompt_ids + completion_ids
        mask = [0] * len(prompt_ids) + [1] * len(completion_ids)
        truncated = len(input_ids) > max_length
        return {"input_ids": input_ids[:max_length], "completion_mask": mask[:max_length], "truncated": truncated}

    columns = dataset_columns(dataset)
    tokenized = dataset.map(tokenize, remove_columns=columns, num_proc=num_proc, desc="Tokenizing SFT dataset")
    num_truncated = sum(tokenized["truncated"])
    if num_truncated:
        logger.warning(
            "%d of %d SFT rows are longer than sft_max_length=%d tokens and were truncated.",
            num_truncated,
            len(tokenized),
            max_length,
        )
    tokenized = tokenized.remove_columns("truncated")
    keep = tokenized.filter(lambda m: sum(m) > 0, input_columns="completion_mask")
    if len(keep) < len(tokenized):
        logger.warning(
            "%d SFT rows have no completion token left within sft_max_length=%d and are skipped.",
            len(tokenized) - len(keep),
            max_length,
        )
    if len(keep) == 0:
        raise ValueError(
            f"No `sft_dataset` row keeps a completion token within sft_max_length={max_length}: raise sft_max_length."
        )
    return keep


def tokenize_prompt_dataset(
    dataset: Dataset,
    tokenizer,
    max_prompt_length: int,
    template_kwargs: dict | None = None,
    name: str = "train_dataset",
    num_proc: int | None = None,
) -> Dataset:
    """Add a `prompt_ids` column (and a text `prompt` for PPO-style tokenized datasets); check prompt lengths.

    Args:
        dataset (`Dataset`): prompt-only dataset (`prompt` column, standard or conversational, or `input_ids`).
        tokenizer: the policy's tokenizer.
        max_prompt_length (`int`): maximum prompt length in tokens.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template`.
        name (`str`): the argument's name, for error messages.
        num_proc (`int`, *optional*): processes for `Dataset.map`.

    Returns:
        `Dataset`: the original columns plus `prompt_ids` (and `prompt` decoded from `input_ids` when absent).

    Raises:
        ValueError: if any prompt is longer than `max_prompt_length` tokens (never silently truncated), or empty.
    """
    template_kwargs = template_kwargs or {}
    columns = dataset_columns(dataset)
    has_prompt = "prompt" in columns

    def tokenize(example: dict) -> dict:
        if has_prompt:
            ids = tokenize_prompt(example["prompt"], tokenizer, template_kwargs)
            return {"prompt_ids": ids}
        ids = list(example["input_ids"])
        # PPO-style datasets may arrive left-padded; strip padding by the attention mask when there is one
        if "attention_mask" in example and example["attention_mask"] is not None:
            ids = [t for t, m in zip(ids, example["attention_mask"]) if m]
        return {"prompt_ids": ids, "prompt": tokenizer.decode(ids, skip_special_tokens=True)}

    tokenized = dataset.map(tokenize, num_proc=num_proc, desc=f"Tokenizing {name}")
    lengths = [len(ids) for ids in tokenized["prompt_ids"]]
    too_long = [i for i, n in enumerate(lengths) if n > max_prompt_length]
    if too_long:
        raise ValueError(
            f"{len(too_long)} prompts of `{name}` are longer than max_prompt_length={max_prompt_length} tokens "
            f"(longest: {max(lengths)} tokens, first at row {too_long[0]}). Raise `max_prompt_length` (the model must "
            f"fit max_prompt_length + response_length positions) or filter those prompts out; they are never "
            "truncated silently."
        )
    empty = [i for i, n in enumerate(lengths) if n == 0]
    if empty:
        raise ValueError(f"{len(empty)} prompts of `{name}` are empty (first at row {empty[0]}); remove them.")
    return tokenized


def tokenize_demonstrations(
    dataset: Dataset,
    column: str,
    tokenizer,
    stop_token_ids: list[int],
    response_length: int,
    template_kwargs: dict | None = None,
) -> Dataset:
    """Add a `demonstration_ids` column: each row's demonstration as a completion of its prompt (empty: none).

    The completion is what the policy would have to generate after the row's `prompt_ids`: for a conversational
    prompt, the chat template's rendering of an assistant turn holding the demonstration (its text, or the content of
    an assistant message list), cut after its first stop token; for a standard prompt, the tokenised text with the
    first stop token appended unless it already holds one. So a demonstration ends exactly as a completion that
    stopped does. Demonstrations longer than `response_length` tokens are dropped (the policy could not produce them;
    counted in a warning), as are empty values.

    Args:
        dataset (`Dataset`): the tokenised RL prompts (`prompt`, `prompt_ids`, and `column`).
        column (`str`): the demonstration column (`TRAPOConfig.demonstration_column`).
        tokenizer: the policy's tokenizer.
        stop_token_ids (`list[int]`): the ids that end a completion (EOS when empty).
        response_length (`int`): the longest completion, in tokens.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template`.

    Returns:
        `Dataset`: `dataset` plus `demonstration_ids` (list of token ids per row, empty when there is none).

    Raises:
        ValueError: if `column` is not a column of `dataset`, or no row keeps a demonstration.
    """
    template_kwargs = template_kwargs or {}
    columns = dataset_columns(dataset)
    if column not in columns:
        raise ValueError(
            f"demonstration_column={column!r} is not a column of `train_dataset` (columns: {columns}); name the column "
            "holding each prompt's reference solution, or set demonstration_column=None."
        )
    stops = list(stop_token_ids) or [tokenizer.eos_token_id]

    def tokenize(example: dict) -> dict:
        value = example[column]
        if isinstance(value, list):  # an assistant message list
            value = "".join(str(m.get("content", "")) for m in value if m.get("role", "assistant") == "assistant")
        if value is None or not str(value).strip():
            return {"demonstration_ids": [], "demonstration_too_long": False}
        prompt = example.get("prompt")
        if prompt is not None and is_conversational({"prompt": prompt}):
            rendered = apply_chat_template(
                {"prompt": prompt, "completion": [{"role": "assistant", "content": str(value)}]},
                tokenizer,
                **template_kwargs,
            )
            ids = tokenizer(rendered["completion"], add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(str(value), add_special_tokens=False)["input_ids"]
        cut = next((i for i, t in enumerate(ids) if t in stops), None)
        ids = ids[: cut + 1] if cut is not None else ids + [stops[0]]
        too_long = len(ids) > response_length
        return {"demonstration_ids": [] if too_long else ids, "demonstration_too_long": too_long}

    out = dataset.map(tokenize, desc="Tokenizing demonstrations")
    too_long = sum(out["demonstration_too_long"])
    out = out.remove_columns("demonstration_too_long")
    kept = sum(1 for ids in out["demonstration_ids"] if ids)
    if too_long:
        logger.warning(
            "%d of %d demonstrations (`%s`) are longer than response_length=%d tokens and are not used.",
            too_long,
            len(out),
            column,
            response_length,
        )
    if kept == 0:
        raise ValueError(
            f"No row of `train_dataset` keeps a demonstration from column {column!r} (empty, or longer than "
            f"response_length={response_length} tokens): raise response_length or set demonstration_column=None."
        )
    return out


class ShardedSampler:
    """Endless per-rank stream of dataset indices: a fresh seeded permutation each epoch, rank r takes r::world.

    Every rank draws the same permutation (same seed), so shards are disjoint and together cover the dataset once
    per epoch. The position is checkpointable.

    Args:
        size (`int`): dataset length (> 0).
        seed (`int`): base seed; epoch e uses seed + e.
        rank (`int`): this process's index.
        world_size (`int`): number of processes.
        shuffle (`bool`): permute each epoch (True) or keep the dataset order.
    """

    def __init__(self, size: int, seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True):
        if size < 1:
            raise ValueError("ShardedSampler needs a non-empty dataset.")
        self.size, self.seed, self.rank, self.world_size, self.shuffle = size, seed, rank, world_size, shuffle
        self.epoch = 0
        self.position = 0
        self._order: list[int] = self.epoch_order(0)

    def epoch_order(self, epoch: int) -> list[int]:
        """This rank's indices of epoch `epoch`, in serving order."""
        if self.shuffle:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        else:
            order = list(range(self.size))
        if self.size < self.world_size:  # fewer rows than ranks: every rank cycles through all rows
            return order[self.rank % self.size :] + order[: self.rank % self.size]
        return order[self.rank :: self.world_size]

    def take(self, n: int) -> list[int]:
        """The next `n` indices of this rank (crossing epoch boundaries as needed)."""
        out: list[int] = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self.epoch_order(self.epoch)
            take = min(n - len(out), len(self._order) - self.position)
            out.extend(self._order[self.position : self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("size") != self.size:
            raise ValueError(
                f"Sampler state was saved for a dataset of {state.get('size')} rows, this dataset has {self.size}: "
                "resume with the same dataset."
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self.epoch_order(self.epoch)


class PretrainStream:
    """Rows of pretraining tokens from a `text` dataset: packed (EOS between documents) or chunked per document.

    Map-style datasets are read in a seeded per-rank permutation (see [`ShardedSampler`]); streaming datasets are split
    by rank with `datasets.distributed.split_dataset_by_node` and restarted (`set_epoch`) when exhausted. The stream
    position (epoch, documents consumed, leftover tokens) is checkpointable.

    Args:
        dataset (`Dataset` or `IterableDataset`): with a `text` column.
        tokenizer: the policy's tokenizer (must have an EOS token).
        max_length (`int`): tokens per row.
        packing (`bool`): pack across documents (True) or chunk each document on its own (False).
        seed, rank, world_size: sharding, as in [`ShardedSampler`].
    """

    def __init__(
        self,
        dataset: Dataset | IterableDataset,
        tokenizer,
        max_length: int,
        packing: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.packing = packing
        self.streaming = isinstance(dataset, IterableDataset)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.buffer: list[int] = []
        self.pending: list[list[int]] = []  # chunks ready to serve (chunked mode)
        if self.streaming:
            from datasets.distributed import split_dataset_by_node

            self._shard = (
                split_dataset_by_node(dataset, rank=rank, world_size=world_size) if world_size > 1 else dataset
            )
            self.epoch = 0
            self.consumed = 0
            self._iterator: Iterator | None = None
        else:
            self.sampler = ShardedSampler(len(dataset), seed=seed, rank=rank, world_size=world_size)

    def _next_documents(self, n: int) -> list[str]:
        if not self.streaming:
            return self.dataset[list(self.sampler.take(n))]["text"]
        docs: list[str] = []
        empty_epochs = 0
        while len(docs) < n:
            if self._iterator is None:
                self._shard.set_epoch(self.epoch)
                self._iterator = iter(self._shard.skip(self.consumed) if self.consumed else self._shard)
            try:
                docs.append(next(self._iterator)["text"])
                self.consumed += 1
                empty_epochs = 0
            except StopIteration:
                if self.consumed == 0:
                    empty_epochs += 1
                    if empty_epochs > 1:
                        raise ValueError("`pretrain_dataset` (streaming) yielded no rows on this rank.") from None
                self.epoch += 1
                self.consumed = 0
                self._iterator = None
        return docs

    def _fill(self) -> int:
        """Read up to 64 documents into the buffer; return the number of tokens added."""
        eos = self.tokenizer.eos_token_id
        docs = [d for d in self._next_documents(64) if d]
        if not docs:
            return 0
        added = 0
        for ids in self.tokenizer(docs, add_special_tokens=False)["input_ids"]:
            ids = ids + [eos]
            added += len(ids)
            if self.packing:
                self.buffer.extend(ids)
            else:
                for start in range(0, len(ids), self.max_length):
                    chunk = ids[start : start + self.max_length]
                    if len(chunk) >= 2:
                        self.pending.append(chunk)
        return added

    def take(self, n: int) -> list[Row]:
        """The next `n` pretraining rows (`input_ids` (L,), every one of the L - 1 targets counted)."""
        rows = []
        empty_fills = 0  # consecutive fills that added nothing
        while len(rows) < n:
            if self.packing and len(self.buffer) >= self.max_length:
                chunk, self.buffer = self.buffer[: self.max_length], self.buffer[self.max_length :]
            elif not self.packing and self.pending:
                chunk = self.pending.pop(0)
            else:
                empty_fills = 0 if self._fill() else empty_fills + 1
                if empty_fills > 1000:
                    raise ValueError("`pretrain_dataset` produced no tokens: are all its 'text' values empty?")
                continue
            ids = torch.tensor(chunk, dtype=torch.long)
            rows.append(Row(PRETRAIN, ids, torch.ones(len(chunk) - 1)))
        return rows

    def state_dict(self) -> dict:
        state = {"buffer": list(self.buffer), "pending": [list(c) for c in self.pending]}
        if self.streaming:
            state.update({"epoch": self.epoch, "consumed": self.consumed})
        else:
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.buffer = [int(t) for t in state["buffer"]]
        self.pending = [[int(t) for t in c] for c in state.get("pending", [])]
        if self.streaming:
            self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
            self._iterator = None
        else:
            self.sampler.load_state_dict(state["sampler"])


def sft_row(
    input_ids: list[int], completion_mask: list[int], pool_index: int = -1, importance_weight: float = 1.0
) -> Row:
    """An SFT row from tokenised lists: the target-aligned mask counts completion tokens (and the EOS)."""
    ids = torch.tensor(input_ids, dtype=torch.long)
    mask = torch.tensor(completion_mask[1:], dtype=torch.float32)
    return Row(SFT, ids, mask, pool_index=pool_index, importance_weight=importance_weight)


@dataclass
class PreparedData:
    """The datasets of one run after checks and tokenisation (None: that objective has no data or weight 0)."""

    rl: Dataset | None  # RL prompts with a `prompt_ids` column (and a text `prompt`)
    sft: Dataset | None  # tokenized SFT rows: `input_ids`, `completion_mask`
    pretrain: Dataset | IterableDataset | None  # raw `text` documents (tokenized as they are streamed)

    @property
    def active(self) -> tuple[bool, bool, bool]:
        """Which objectives (pretrain, sft, rl) have data."""
        return (self.pretrain is not None, self.sft is not None, self.rl is not None)


def check_eval_dataset(eval_dataset) -> None:
    """Raise `ValueError` before training if an eval dataset has no column TRAPO can evaluate (`prompt` /
    `input_ids`: greedy rewards; `text`: pretraining loss; `completion` / `messages`: SFT loss)."""
    datasets = eval_dataset.items() if isinstance(eval_dataset, dict) else [("eval_dataset", eval_dataset)]
    for name, dataset in datasets:
        columns = set(dataset_columns(dataset)) if dataset is not None else None
        if columns is not None and not columns & {"prompt", "input_ids", "text", "completion", "messages"}:
            raise ValueError(
                f"`{name}` has columns {sorted(columns)}, none of which TRAPO can evaluate: give 'prompt' "
                "(greedy rewards), 'text' (pretraining loss) or 'prompt'+'completion' / 'messages' (SFT loss)."
            )


def check_eval_prompts(args, tokenizer, eval_dataset, max_positions: int | None) -> None:
    """Tokenize the prompts of every prompt-only eval dataset once, before training, so that a prompt longer than
    `max_prompt_length` (or than the context, with `response_length` new tokens) fails now, not at the first
    evaluation after hours of training.

    Raises:
        ValueError: naming the dataset, the longest prompt and the fix.
    """
    datasets = eval_dataset.items() if isinstance(eval_dataset, dict) else [("eval_dataset", eval_dataset)]
    for name, dataset in datasets:
        if dataset is None or isinstance(dataset, IterableDataset):
            continue
        columns = set(dataset_columns(dataset))
        if not columns & {"prompt", "input_ids"} or columns & {"text", "completion", "messages"}:
            continue  # evaluated by loss, not by generation
        label = name if name == "eval_dataset" else f"eval_dataset['{name}']"
        tokenized = tokenize_prompt_dataset(
            dataset, tokenizer, args.max_prompt_length, args.chat_template_kwargs or {}, name=label
        )
        longest = max((len(ids) for ids in tokenized["prompt_ids"]), default=0)
        if max_positions is not None and longest + args.response_length > max_positions:
            raise ValueError(
                f"`{label}` has a prompt of {longest} tokens; with response_length={args.response_length} new tokens "
                f"it exceeds the model's context of {max_positions} positions. Lower response_length to at most "
                f"{max_positions - longest}, or remove prompts longer than {max_positions - args.response_length} "
                "tokens from the eval data."
            )


def prepare_datasets(
    args,
    tokenizer,
    train_dataset: Dataset | None,
    sft_dataset: Dataset | None,
    pretrain_dataset: Dataset | IterableDataset | None,
    eval_dataset,
    max_positions: int | None,
    has_rewards: bool,
    has_critic: bool,
    stop_token_ids: list[int] | None = None,
) -> PreparedData:
    """Check and tokenise the datasets of a run, before anything is trained.

    Args:
        args ([`TRAPOConfig`]): lengths, weights and chat-template arguments.
        tokenizer: the policy's tokenizer.
        train_dataset, sft_dataset, pretrain_dataset, eval_dataset: as given to the trainer.
        max_positions (`int`, *optional*): the model's context (`max_position_embeddings`).
        has_rewards (`bool`): whether any reward function or model was given.
        has_critic (`bool`): whether a value model was given.
        stop_token_ids (`list[int]`, *optional*): the ids that end a completion (for demonstrations).

    Raises:
        ValueError: naming the argument and the fix, for a dataset that cannot work: missing columns, empty, RL prompts
            that stream or exceed `max_prompt_length` / the context, RL prompts without a reward, SFT / pretraining
            lengths beyond the context, an eval set TRAPO cannot evaluate, no objective with data, or group-relative
            advantages with fewer than 2 completions per prompt.
    """
    config_name = type(args).__name__
    template_kwargs = args.chat_template_kwargs or {}
    rl = sft = pretrain = None
    if train_dataset is not None and args.rl_weight > 0:
        if isinstance(train_dataset, IterableDataset):
            raise ValueError(
                "`train_dataset` (RL prompts) is an IterableDataset, but prompts are sampled by index and "
                "checked for length before training: pass a map-style `Dataset` (e.g. "
                "`Dataset.from_list(list(iterable.take(n)))`). Streaming is supported for `pretrain_dataset`."
            )
        check_prompt_dataset(train_dataset)
        if not has_rewards:
            raise ValueError(
                "`train_dataset` (RL prompts) was given without any reward: pass `reward_funcs` and/or "
                "`reward_model`, or set rl_weight=0 to train without RL."
            )
        rl = tokenize_prompt_dataset(train_dataset, tokenizer, args.max_prompt_length, template_kwargs)
        if args.demonstration_column is not None:
            rl = tokenize_demonstrations(
                rl, args.demonstration_column, tokenizer, stop_token_ids, args.response_length, template_kwargs
            )
        longest = max(len(ids) for ids in rl["prompt_ids"])
        if max_positions is not None and longest + args.response_length > max_positions:
            if longest >= max_positions:
                fix = (
                    f"that prompt alone fills the context, so no response_length can help: remove prompts longer than "
                    f"{max_positions - args.response_length} tokens (max_prompt_length={args.max_prompt_length} "
                    "lets them through; lower it to find them at construction)"
                )
            else:
                fix = (
                    f"lower response_length to at most {max_positions - longest}, or remove prompts longer than "
                    f"{max_positions - args.response_length} tokens"
                )
            raise ValueError(
                f"`train_dataset` has a prompt of {longest} tokens; with response_length={args.response_length} new "
                f"tokens it exceeds the model's context of {max_positions} positions: {fix}."
            )
    if sft_dataset is not None and args.sft_weight > 0:
        if isinstance(sft_dataset, IterableDataset):
            raise ValueError(
                "`sft_dataset` is an IterableDataset (streaming), but SFT rows are tokenized once and drawn by index "
                "(uniformly or by priority): pass a map-style `Dataset` (e.g. "
                "`Dataset.from_list(list(iterable.take(n)))`). Streaming is supported for `pretrain_dataset`."
            )
        check_sft_dataset(sft_dataset)
        sft = tokenize_sft_dataset(sft_dataset, tokenizer, args.sft_max_length, template_kwargs)
        longest = max((len(ids) for ids in sft["input_ids"]), default=0)
        if max_positions is not None and longest > max_positions:
            raise ValueError(
                f"{config_name}.sft_max_length={args.sft_max_length} lets SFT rows of {longest} tokens through, "
                f"beyond the model's context of {max_positions} positions: set sft_max_length <= {max_positions}."
            )
    if (
        pretrain_dataset is not None
        and args.pretrain_weight > 0
        and max_positions is not None
        and args.pretrain_max_length > max_positions
    ):
        raise ValueError(
            f"{config_name}.pretrain_max_length={args.pretrain_max_length} exceeds the model's context of "
            f"{max_positions} positions: set pretrain_max_length <= {max_positions}."
        )
    check_eval_dataset(eval_dataset)
    check_eval_prompts(args, tokenizer, eval_dataset, max_positions)
    if pretrain_dataset is not None and args.pretrain_weight > 0:
        check_pretrain_dataset(pretrain_dataset)
        pretrain = pretrain_dataset
    data = PreparedData(rl=rl, sft=sft, pretrain=pretrain)
    if not any(data.active):
        raise ValueError(
            "No objective has data: pass at least one of `train_dataset` (RL prompts, with rewards), "
            "`sft_dataset` or `pretrain_dataset`, with a weight > 0 (pretrain_weight / sft_weight / rl_weight)."
        )
    if data.rl is not None and args.demonstration_column is not None and has_critic:
        raise ValueError(
            f"{config_name}.demonstration_column={args.demonstration_column!r} needs group-relative advantages (a "
            "demonstration joins a group of completions of its prompt), but a value_model was given: drop the "
            "value_model or set demonstration_column=None."
        )
    if data.rl is not None and args.exploration is True and has_critic:
        raise ValueError(
            f"{config_name}.exploration=True watches groups of completions of one prompt for equal scores, but a "
            "value_model was given (one completion per prompt): drop the value_model or set exploration=False."
        )
    if data.rl is not None and not has_critic and args.num_generations < 2:
        raise ValueError(
            f"{config_name}.num_generations={args.num_generations}: without a value_model, advantages are "
            "group-relative and need at least 2 completions per prompt. Set num_generations >= 2 or pass a "
            "value_model."
        )
    return data


def check_tokenizer(tokenizer) -> None:
    """Raise before training if the policy's tokenizer lacks an EOS or pad token; warn when pad equals EOS.

    Raises:
        ValueError: naming the fix, when `eos_token_id` or `pad_token_id` is None.
    """
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise ValueError(
            "`processing_class` has no EOS token (eos_token_id is None); TRAPO needs one to end completions and "
            "separate pretraining documents. Set `tokenizer.eos_token`."
        )
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "`processing_class.pad_token` is None. Set one before creating the trainer, e.g. "
            "`tokenizer.pad_token = tokenizer.eos_token` (safe with TRAPO: its masks come from lengths, never from "
            "the pad id) or add a dedicated pad token and resize the model's embeddings."
        )
    if tokenizer.pad_token_id == tokenizer.eos_token_id:
        logger.warning(
            "The tokenizer's pad token is its EOS token (id %d). TRAPO builds every mask from sequence lengths, "
            "so EOS tokens are still trained on and rewards are still read at the EOS.",
            tokenizer.eos_token_id,
        )
