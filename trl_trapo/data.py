# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Datasets of the built-in objectives: format checks, tokenisation, per-rank sampling and pretraining packing.

Accepted formats (TRL's standard dataset formats, https://huggingface.co/docs/trl/dataset_formats):

| objective | columns | notes |
|---|---|---|
| pretraining | `text` | map-style or streaming; packed (EOS between documents) or chunked to `pretrain_max_length` |
| SFT | `prompt` + `completion`, or `messages` | standard or conversational; loss on completion tokens + EOS only |
| RL | `prompt`, or `input_ids` (PPO's tokenized prompts) | standard or conversational; other columns go to rewards |

Every column TRAPO reads (`read_columns`: `text`; `prompt` / `completion` / `messages` and their message contents;
`prompt` or `input_ids`; `task`; an eval set's `split`) is checked before training: a missing value (None, or NaN as
pandas writes one) is refused naming the dataset, column and row (streamed pretraining rows as they are read); a
demonstration column may leave rows without one (None / NaN / blank: no demonstration). Reward columns are the user's
and reach reward functions as they are, None included (a function returns None for "cannot score"). Characters the
tokenizer cannot represent (its `unk_token_id`; byte-level tokenizers have none) are counted and warned about with
examples, and a row that is nothing but unknown tokens is refused.

Rows handed to the collator are dicts with `input_ids` (shape `(L,)`) and a target-aligned `mask` (shape `(L - 1,)`,
1 where predicting token t + 1 counts); masks always come from lengths, never from comparing ids with the pad id, so
a tokenizer whose pad token is its EOS token is handled correctly.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import re
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import datasets
import torch
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict
from trl.chat_template_utils import has_generation_markers, is_chat_template_stop_token_trained, supports_tool_calling
from trl.data_utils import common_prefix_length, is_conversational, is_conversational_from_value

from .collator import Row
from .config import PRETRAIN, SFT
from .tool_schemas import row_tool_names
from .vision import IMAGE_COLUMNS, ImageRows, as_tensors, check_no_images, image_column


logger = logging.getLogger(__name__)

# The columns TRAPO adds to the RL prompts when it prepares them (`tokenize_prompt_dataset`, `tokenize_demonstrations`):
# its own bookkeeping, never handed to user code that gets a row's columns (an environment's `reset(**row)`, reward
# functions' `**dataset_columns`), so that they get exactly the dataset's own columns, as TRL's GRPOTrainer passes them.
# columns TRAPO adds to a dataset's rows, which reward functions and environments' `reset` do not get (TRL has none):
# prompt ids, guidance's demonstration ids and a VLM row's processor outputs (`model_inputs`: its images as tensors)
INTERNAL_COLUMNS = ("prompt_ids", "demonstration_ids", "model_inputs")

# Rows `Dataset.map` holds before it writes them out when it stores a VLM row's processor outputs (`pixel_values` ...):
# `datasets` turns each row's arrays into Python lists before Arrow builds the column, so its default batch of 1,000
# rows peaks at ~5x the stored size (measured on the built-in visual task's 448 RL prompts: +107 MiB resident for a
# 19 MiB column; 16 rows: +49 MiB; the allocator keeps the peak, so it stays for the whole run).
IMAGE_WRITER_BATCH_SIZE = 16


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


def is_column_dict(value: Any) -> bool:
    """Whether `value` is a plain dict of columns (`{'text': [...]}`, what `Dataset.from_dict` takes), not a dict of
    splits or named datasets: no value is a dataset."""
    split_types = (Dataset, IterableDataset, DatasetDict, IterableDatasetDict)
    return type(value) is dict and bool(value) and not any(isinstance(v, split_types) for v in value.values())


def apply_transform(dataset: Any, role: str) -> Any:
    """`dataset` with the transform of its `set_transform` / `with_transform` applied to every row: a plain `Dataset`
    of the columns its rows have (trial 15's N23); any other value as it is.

    A transform builds a row's columns as the row is read (`dataset[i]`, what TRL's dataloader reads), while
    `column_names` still lists the stored ones, so a transform building `prompt` was refused for lacking it. TRAPO
    checks and tokenizes its datasets' columns before training (with `Dataset.map`, whose output would go through
    the same transform at every read, dropping the columns TRAPO adds), so the transform is applied once, up front,
    as `datasets` formats a row it reads: the format's `columns` go through the transform and, with
    `output_all_columns=True`, the other columns are added as they are. A transform that draws at random draws once
    per row, not at every read.

    Args:
        dataset: any value; only a `datasets.Dataset` whose format type is `"custom"` (a transform) is changed.
        role: the argument, for the messages (`"train_dataset"`, `"eval_dataset['math']"`).

    Returns:
        A new `Dataset` (no format set: rows are Python values), or `dataset` itself.

    Raises:
        ValueError: naming the argument and the transform, with the error it raised on the rows.
    """
    if not isinstance(dataset, Dataset) or dataset.format["type"] != "custom":
        return dataset
    transform = dataset.format["format_kwargs"]["transform"]
    columns, keep_all = dataset.format["columns"], dataset.format["output_all_columns"]
    plain = dataset.with_format(None)

    def transformed(batch: dict) -> dict:
        rows = transform({k: v for k, v in batch.items() if k in columns} if columns is not None else batch)
        if keep_all and columns is not None:  # `datasets.formatting.format_table`: the other columns as they are
            rows = {**rows, **{k: v for k, v in batch.items() if k not in columns}}
        return rows

    name = getattr(transform, "__qualname__", type(transform).__name__)
    try:
        applied = plain.map(
            transformed, batched=True, remove_columns=plain.column_names, desc=f"Applying {role}'s transform"
        )
    except Exception as error:  # the user's transform, on the stored rows
        raise ValueError(
            f"`{role}` has a transform ({name}, set with `set_transform` / `with_transform`), which TRAPO applies to "
            f"every row before training, and it failed on the dataset's stored columns {plain.column_names}: "
            f"{type(error).__name__}: {error}. Fix the transform, or give the rows as they should be read "
            "(`dataset.map(fn, batched=True)` in place of `with_transform(fn)`)."
        ) from error
    logger.info(
        "`%s` has a transform (%s): applied once to each of its %d rows before training (columns %s -> %s); a "
        "transform that draws at random drew once per row.",
        role,
        name,
        len(applied),
        plain.column_names,
        applied.column_names,
    )
    return applied


def apply_transforms(datasets: dict[str, Any]) -> dict[str, Any]:
    """The trainer's dataset arguments by name (`train_dataset`, `eval_dataset` (one dataset or a dict of them),
    ...) with each dataset's transform applied ([`apply_transform`]); a new dict, `datasets` is not changed.

    Raises:
        ValueError: from [`apply_transform`], naming the argument.
    """
    applied = {}
    for role, value in datasets.items():
        if isinstance(value, dict) and not is_column_dict(value):  # several eval sets (a `DatasetDict` too)
            value = type(value)({key: apply_transform(d, f"{role}[{key!r}]") for key, d in value.items()})
        applied[role] = apply_transform(value, role)
    return applied


def check_dataset_object(dataset: Any, role: str, streaming_ok: bool = False) -> None:
    """Raise a ValueError unless `dataset` is one `datasets.Dataset` (or, with `streaming_ok`, an `IterableDataset`).

    A `DatasetDict` (what `load_dataset` returns without `split=`) or a dict of datasets is one split too many; an
    `IterableDataset` where rows are drawn by index (RL prompts, SFT rows, evaluation) cannot work.

    Args:
        dataset: the object given.
        role (`str`): the argument's name, for the message (e.g. "sft_dataset", "eval_dataset['gsm8k']").
        streaming_ok (`bool`): whether an `IterableDataset` is accepted (pretraining text).
    """
    if is_column_dict(dataset):
        name = role.split("[")[0]
        raise ValueError(  # a dict of columns ({'text': [...]}), not of splits
            f"`{role}` is a dict of columns {list(dataset)[:5]}, not a `datasets.Dataset`: build one, "
            f"`{name}=Dataset.from_dict(columns)` (a dict of column name to list of values; `Dataset.from_list(rows)` "
            "for a list of row dicts)."
        )
    if isinstance(dataset, (DatasetDict, IterableDatasetDict, dict)):
        raise ValueError(
            f"`{role}` is a {type(dataset).__name__} with splits {list(dataset)}: pass one split, e.g. "
            f"`{role.split('[')[0]}=dataset[{next(iter(dataset), 'train')!r}]` "
            "(or `load_dataset(..., split='train')`)."
        )
    if isinstance(dataset, IterableDataset) and not streaming_ok:
        raise ValueError(
            f"`{role}` is an IterableDataset (streaming), but its rows are read by index (and every row is checked "
            "before training): pass a map-style `Dataset`, e.g. `Dataset.from_list(list(iterable.take(n)))`. "
            "Streaming is supported for `pretrain_dataset`."
        )
    if not isinstance(dataset, (Dataset, IterableDataset)):
        kind = type(dataset).__name__
        how = {  # the constructor `datasets` has for the object given
            "DataFrame": "`Dataset.from_pandas(frame)`",
            "list": "`Dataset.from_list(rows)`",
        }.get(kind, "`Dataset.from_list(rows)`, `Dataset.from_generator(...)`")
        raise ValueError(
            f"`{role}` is a {kind}, not a `datasets.Dataset`: build one, e.g. {how} or "
            "`load_dataset('json', data_files=..., split='train')`."
        )


def missing_part(value: Any) -> str | None:
    """What is missing in one cell, or None: the cell itself (None, or a float NaN as pandas writes a missing value),
    an element of a token-id list, or the `role` / `content` of a message of a conversational cell.

    Args:
        value: a cell of a dataset column (a string, a list of token ids, or a list of message dicts).

    Returns:
        `str` or None: e.g. "None", "NaN", "None content in message 1", "None at position 2", or, for a message
        without the key at all, "no 'content' key in message 0 (its keys: 'role', 'text')".
    """
    if value is None:
        return "None"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, (list, tuple)):
        for j, item in enumerate(value):
            if isinstance(item, dict) and "type" in item and "role" not in item:
                continue  # a content part of a multimodal message (an image part has no text)
            if isinstance(item, dict):
                for key in ("role", "content"):
                    if key not in item:  # a message in another format (e.g. {'role', 'text'}), not a missing value
                        return f"no {key!r} key in message {j} (its keys: {', '.join(map(repr, item))})"
                    what = missing_part(item[key])
                    if what is not None:
                        return f"{what} {key} in message {j}"
            elif (what := missing_part(item)) is not None:
                return f"{what} at position {j}"
    return None


def missing_value_error(role: str, column: str, row: int | str, what: str, count: int = 1) -> ValueError:
    """The error for a missing value (`what`, from `missing_part`): the dataset, column, row, what is missing and the
    fix, with a filter that drops exactly such rows (a message's missing role / content, a token list's None)."""
    more = f" (and {count - 1} more rows)" if count > 1 else ""
    key = re.match(r"no '(\w+)' key in message", what)
    if key and "'from'" in what and "'value'" in what:  # ShareGPT's turns (trial 16's N23): its roles differ too
        return ValueError(
            f"`{role}` column {column!r} has a message without a {key[1]!r} key at row {row}{more}: {what}. Its "
            "messages are ShareGPT turns ({'from', 'value'}); TRL's conversational format is {'role', 'content'} "
            "messages (human -> user, gpt -> assistant, system -> system). Fix: "
            f"{sharegpt_conversion(column, [], target=column)}."
        )
    if key:  # the messages are in another format: converting them is the fix, dropping rows would drop them all
        return ValueError(
            f"`{role}` column {column!r} has a message without a {key[1]!r} key at row {row}{more}: {what}. Each "
            "message must be a dict with 'role' and 'content' (TRL's conversational format): rename the key that "
            f"holds it, e.g. `dataset.map(lambda row: {{{column!r}: [{{'role': m['role'], 'content': m['text']}} "
            f"for m in row[{column!r}]]}})` for messages written with 'text'."
        )
    part = re.match(r".* (role|content) in message", what)
    if part:
        keep = f"all(m[{part[1]!r}] is not None for m in row[{column!r}])"
    elif " at position " in what:
        keep = f"None not in row[{column!r}]"
    else:
        keep = f"row[{column!r}] is not None"
    return ValueError(
        f"`{role}` column {column!r} has a missing value ({what}) at row {row}{more}. TRAPO never trains on a "
        f"missing value nor guesses one: fill it, or drop such rows, e.g. `dataset.filter(lambda row: {keep})`."
    )


def check_missing_values(dataset: Dataset, role: str, columns: Sequence[str]) -> None:
    """Raise a ValueError naming the dataset, column and first row with a missing value (see `missing_part`) in any of
    `columns` (those of them the dataset has). Flat string columns are checked with Arrow's null count; other columns
    row by row.

    Args:
        dataset (`Dataset`): a map-style dataset.
        role (`str`): its argument's name, for the message.
        columns (`Sequence[str]`): the columns TRAPO reads from it.
    """
    present = set(dataset_columns(dataset))
    for column in columns:
        if column not in present:
            continue
        array = dataset.with_format("arrow")[column]
        if array.null_count == 0 and str(array.type) in ("string", "large_string"):
            continue  # nothing missing (the common case, without reading the column into Python)
        bad = [(i, what) for i, value in enumerate(dataset[column]) if (what := missing_part(value)) is not None]
        if bad:
            raise missing_value_error(role, column, bad[0][0], bad[0][1], len(bad))


def warn_missing_reward_cells(dataset: Any, role: str, readers: Mapping[str, Sequence[str]]) -> list[str]:
    """Warn, once per column, about the columns TRAPO does not read (reward columns, passed to reward functions as
    they are) that hold None in some rows: the rows a JSON Lines file written from several sources lacks a key in.
    TRL passes such a None on too, and a reward function may use it on purpose ("cannot score"), so it stays a
    warning; what is said is which column, in how many rows (first at which), and which reward function takes the
    column by name. A column no reward function names is warned about only when some rows have a value.

    Args:
        dataset: the RL dataset (map-style; a streamed one is not read ahead).
        role (`str`): its argument's name, for the message.
        readers (`Mapping[str, Sequence[str]]`): column -> names of the reward functions with a parameter of that
            name (`RewardScorer.columns_read`).

    Returns:
        `list[str]`: the warnings logged.
    """
    if not isinstance(dataset, Dataset) or len(dataset) == 0:
        return []
    names = dataset_columns(dataset)
    said = []
    for column in [c for c in names if c not in read_columns(names) and c not in INTERNAL_COLUMNS]:
        array = dataset.with_format("arrow")[column]
        missing = array.null_count
        if missing == 0 or (missing == len(dataset) and column not in readers):
            continue
        first = next(i for i, value in enumerate(array.is_null().to_pylist()) if value)
        functions = list(readers.get(column, ()))
        takes = (
            f"reward function(s) {', '.join(repr(f) for f in functions)} take it by name and get None for those rows"
            if functions
            else "reward functions get None for those rows"
        )
        message = (
            f"`{role}` column {column!r} is missing (None) in {missing} of {len(dataset)} rows (first at row "
            f"{first}): {takes}, which usually means they go unscored. Fill the column, or drop such rows "
            f"(`dataset.filter(lambda row: row[{column!r}] is not None)`)."
        )
        logger.warning(message)
        said.append(message)
    return said


def row_text(value: Any) -> str:
    """The text a user wrote in one cell: a string, or the contents of a message list joined (no template; a
    multimodal message's text parts)."""
    if isinstance(value, (list, tuple)):
        return "".join(
            str(m.get("text") or "") if "type" in m and "role" not in m else row_text(m.get("content"))
            for m in value
            if isinstance(m, dict)
        )  # messages, or the content parts of a multimodal message (an image part has no text)
    return "" if value is None else str(value)


def only_unknown_tokens(text: str, tokenizer) -> bool:
    """Whether every token of `text` but whitespace is the tokenizer's unknown token (False without one)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    bare = "".join(text.split())
    if unk is None or not bare:
        return False
    return all(t == unk for t in tokenizer(bare, add_special_tokens=False)["input_ids"])


def unknown_row_error(role: str, column: str, row: int | str, text: str, tokenizer) -> ValueError:
    """The error for a row that is nothing but unknown tokens: the dataset, column, row, text and fix."""
    return ValueError(
        f"`{role}` column {column!r} row {row} is nothing but characters the tokenizer cannot represent "
        f"({text[:60]!r} is all {tokenizer.unk_token!r}): the model would see only unknown tokens. Remove or rewrite "
        "that row, or use a tokenizer that covers these characters (a byte-level one represents every text)."
    )


def unknown_characters(text: str, tokenizer) -> str:
    """The characters of `text` that became unknown tokens (e.g. `'’', '×'`), read from a fast tokenizer's offsets;
    the start of the text when the tokenizer has no offsets."""
    unk = tokenizer.unk_token_id
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):  # a slow tokenizer: no offsets
        return repr(text[:40])
    found = [text[a:b] for t, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if t == unk]
    return ", ".join(repr(c) for c in dict.fromkeys(found)) + f" in {text[:40]!r}"


def check_unknown_tokens(texts: Sequence[str], tokenizer, role: str, column: str, scope: str = "") -> int:
    """Count the tokens of `texts` the tokenizer cannot represent (its `unk_token_id`); warn with a few examples, and
    refuse a row that is nothing but unknown tokens (whitespace aside). A tokenizer without an unknown token
    (byte-level BPE) represents every text: nothing is checked.

    Args:
        texts (`Sequence[str]`): one text per row, in row order.
        tokenizer: the policy's tokenizer.
        role (`str`), column (`str`): the dataset's argument name and the column, for the messages.
        scope (`str`): what part of the dataset `texts` covers, for the warning (e.g. "of the first 10000 rows").

    Returns:
        `int`: the number of unknown tokens.

    Raises:
        ValueError: naming the dataset, column, row and fix, for a row whose every non-whitespace token is unknown.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not texts:
        return 0
    ids = tokenizer([str(t) for t in texts], add_special_tokens=False)["input_ids"]
    rows = [(i, seq.count(unk)) for i, seq in enumerate(ids) if unk in seq]
    if not rows:
        return 0
    for i, _ in rows:
        if only_unknown_tokens(str(texts[i]), tokenizer):
            raise unknown_row_error(role, column, i, str(texts[i]), tokenizer)
    total = sum(n for _, n in rows)
    examples = "; ".join(f"row {i}: {unknown_characters(str(texts[i]), tokenizer)}" for i, _ in rows[:3])
    logger.warning(
        "`%s` column %r: %d rows%s hold %d characters the tokenizer cannot represent; they become %r (e.g. %s). "
        "Rewrite them, or use a tokenizer that covers these characters.",
        role,
        column,
        len(rows),
        f" {scope}" if scope else "",
        total,
        tokenizer.unk_token,
        examples,
    )
    return total


PRETRAIN_SCAN_ROWS = 10_000  # map-style pretraining documents scanned for unknown tokens at construction


def read_columns(columns: Sequence[str], kind: str | None = None) -> list[str]:
    """The columns TRAPO reads from a dataset with `columns`, by its kind — "pretrain": `text`; "sft": `prompt` +
    `completion`, or `messages`; "prompts" (RL): `prompt`, or `input_ids` (+ `attention_mask`), with `task` (task
    families) and `split` (evaluation per split) — or, with `kind=None`, by the format evaluation reads (`text`, then
    SFT, then prompts). Other columns are the user's, passed to reward functions as they are (a reward function may
    return None for a row it cannot score)."""
    columns = set(columns)
    evaluated = kind is None
    if evaluated:
        kind = "pretrain" if "text" in columns else "sft" if columns & {"completion", "messages"} else "prompts"
    if kind == "pretrain":
        return ["text"]
    if kind == "sft":
        return ["prompt", "completion"] if "completion" in columns else ["messages"]
    read = ["prompt"] if "prompt" in columns else ["input_ids", "attention_mask"]
    return read + (["task", "split"] if evaluated else ["task"])


def is_messages(value: Any) -> bool:
    """Whether a cell is a conversation: a non-empty list of message dicts, each with a `role`."""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


# the form of each column TRAPO reads: a test of one cell, and what it must be (for the message)
CELL_FORMS = {
    "text": (lambda v: isinstance(v, str), "text (a string)"),
    "prompt": (
        lambda v: isinstance(v, str) or is_messages(v),
        "text (a string) or a list of {'role', 'content'} messages",
    ),
    "completion": (lambda v: isinstance(v, str) or is_messages(v), "text (a string) or a list of messages"),
    "messages": (is_messages, "a list of {'role', 'content'} messages"),
    "input_ids": (
        lambda v: isinstance(v, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in v),
        "a list of token ids (ints)",
    ),
}


def check_cell_types(dataset: Dataset, role: str, columns: Sequence[str]) -> None:
    """Refuse a cell of `columns` (those the dataset has and `CELL_FORMS` knows) that does not have its column's form,
    e.g. a prompt that is a number, or text in `input_ids`. A column Arrow stores as strings is accepted without
    reading it when its form is text.

    Raises:
        ValueError: naming the dataset, the column, the first bad row and its value, the form expected and the fix.
    """
    for column in columns:
        if column not in CELL_FORMS or column not in dataset_columns(dataset):
            continue
        ok, form = CELL_FORMS[column]
        if str(dataset.with_format("arrow")[column].type) in ("string", "large_string") and ok("text"):
            continue  # every cell is text, which the column takes (a missing one is `check_missing_values`'s)
        bad = [(i, value) for i, value in enumerate(dataset[column]) if value is not None and not ok(value)]
        if bad:
            row, value = bad[0]
            more = f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
            scalar = not isinstance(value, (list, tuple, dict))
            if isinstance(value, (bytes, bytearray)) and column in ("text", "prompt", "completion"):
                # `str(b"abc")` is "b'abc'": the run would train on Python's repr of the bytes (trial 10's PY64)
                fix = (
                    f"decode the bytes, e.g. `dataset.map(lambda row: {{{column!r}: row[{column!r}].decode('utf-8')}})`"
                    " (with the files' encoding)"
                )
            elif column == "text" and holds_messages(value):  # a conversation (trial 14's N46, renamed 'text')
                fix = (
                    "render each conversation with the chat template, e.g. `dataset.map(lambda row: {'text': "
                    "tokenizer.apply_chat_template(row['text'], tokenize=False)})`, or pass the conversations as "
                    "`sft_dataset=` in a 'messages' column"
                )
            elif scalar and column in ("text", "prompt", "completion"):
                fix = f"convert the column, e.g. `dataset.map(lambda row: {{{column!r}: str(row[{column!r}])}})`"
            elif isinstance(value, str) and column == "input_ids":  # text where token ids belong
                fix = (
                    "give text prompts in a 'prompt' column, which TRAPO tokenizes with the policy's tokenizer "
                    "(`dataset.rename_column('input_ids', 'prompt')`), or tokenize them into 'input_ids'"
                )
            else:
                fix = "rewrite the column in that form"
            raise ValueError(
                f"`{role}` column {column!r} holds a value of type {type(value).__name__} at row {row}{more}: "
                f"{str(value)[:60]!r}; each cell must be {form}. Fix: {fix}, or drop such rows."
            )
    if "prompt" in columns and "completion" in columns and "completion" in dataset_columns(dataset):
        check_pair_forms(dataset, role)


def check_pair_forms(dataset: Dataset, role: str) -> None:
    """Refuse a prompt-completion row whose prompt and completion differ in form (one text, the other a list of
    messages). TRL's `apply_chat_template` (`trl.data_utils`) renders a conversational row's `prompt + completion`
    with the chat template and fails on a mixed row with a bare `TypeError: can only concatenate list (not "str") to
    list` from inside `datasets.map`; a text prompt with message completions fails likewise.

    Raises:
        ValueError: naming the dataset, the first bad row, the two forms and the fix.
    """
    table = dataset.with_format("arrow")
    if {str(table[c].type) for c in ("prompt", "completion")} <= {"string", "large_string"}:
        return  # both columns text (Arrow holds one type per column)
    bad = [
        (i, prompt)
        for i, (prompt, completion) in enumerate(zip(dataset["prompt"], dataset["completion"], strict=True))
        if prompt is not None and completion is not None and is_messages(prompt) != is_messages(completion)
    ]
    if not bad:
        return
    row, prompt = bad[0]
    more = f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
    if is_messages(prompt):
        forms = "'prompt' is a list of messages but 'completion' is text"
        fix = (
            "make each completion the assistant's message, e.g. `dataset.map(lambda row: {'completion': [{'role': "
            "'assistant', 'content': row['completion']}]})`, or give the prompts as text"
        )
    else:
        forms = "'prompt' is text but 'completion' is a list of messages"
        fix = (
            "make each prompt a list of messages, e.g. `dataset.map(lambda row: {'prompt': [{'role': 'user', "
            "'content': row['prompt']}]})`, or give the completions as text"
        )
    raise ValueError(
        f"`{role}` row {row}{more}: {forms}; a row is rendered whole, by the chat template (both lists of messages, "
        f"TRL's conversational format) or as plain text (both text), so both must have the same form. Fix: {fix}."
    )


IMAGE_ROLES = ("system", "user", "assistant", "tool")
"""The roles TRL's `prepare_multimodal_messages` (`trl.data_utils`), which places a VLM row's images, takes for every
message; any other raises `Invalid role in message`."""


def check_prompt_roles(dataset: Dataset, role: str, kind: str | None = None) -> None:
    """Refuse, before anything slow, the conversational rows of a dataset with an image column whose messages TRL's
    `trl.data_utils.prepare_multimodal_messages` cannot place images in (see [`~trl_trapo.vision.ImageRows`]): a
    message, anywhere, whose role is not one of `IMAGE_ROLES`; naming the dataset, the row and the fix (rather than
    an error from inside `datasets.map`). Other roles are the chat template's to render, as in TRL 1.16's trainers: a
    prompt may end with any role (it is rendered with `add_generation_prompt=True`, a final assistant message
    included, see [`tokenize_prompt`]), a `messages` row too (rendered whole, see [`tokenize_sft_row`]); a template
    that refuses a conversation (e.g. roles that must alternate) is reported with the row when it is tokenized
    ([`template_errors_named`]).

    Args:
        dataset (`Dataset`): the rows, with the columns `read_columns(columns, kind)` names.
        role (`str`): how errors name the dataset.
        kind (`str`, *optional*): as in `read_columns`.

    Raises:
        ValueError: naming the dataset, the column, the first bad row, the role and the fix.
    """
    names = dataset_columns(dataset)
    columns = read_columns(names, kind)
    images = any(c in names for c in IMAGE_COLUMNS)
    column = "messages" if "messages" in columns else "prompt" if "prompt" in columns else None
    if not images or column is None or str(dataset.with_format("arrow")[column].type) in ("string", "large_string"):
        return  # no image rows, or no column of conversations (text rows are not rendered by a chat template)
    completions = dataset["completion"] if "completion" in columns else None
    bad: list[int] = []
    first = None  # the first unknown role
    for row, value in enumerate(dataset[column]):
        if not is_messages(value):
            continue  # text, or a cell `check_cell_types` refuses
        rendered = list(value) + (completions[row] if completions and is_messages(completions[row]) else [])
        unknown = next((m.get("role") for m in rendered if m.get("role") not in IMAGE_ROLES), None)
        if unknown is not None:
            bad.append(row)
            first = unknown if first is None else first
    if bad:
        more = f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
        raise ValueError(
            f"`{role}` column {column!r} row {bad[0]}{more}: has a message of role {first!r}, but TRL's "
            f"`prepare_multimodal_messages`, which places the row's images, takes only "
            f"{', '.join(repr(r) for r in IMAGE_ROLES)} (it would raise `Invalid role in message: {first}`). Fix: "
            f"rename the role {first!r} to one of those, or drop such rows."
        )


def check_sft_completions(dataset: Dataset, role: str, assistant_only_loss: bool = False) -> None:
    """Refuse SFT rows with nothing to learn: a `completion` (or, for `messages` rows with `assistant_only_loss`,
    every assistant turn) with no text (blank) and no tool call, which would train only the end-of-turn tokens, or
    (with `assistant_only_loss`) `messages` without any assistant turn, which TRL's SFTTrainer fails on ("at least
    one example has no assistant tokens"). Without `assistant_only_loss` a `messages` row trains every token of the
    conversation (as in TRL): nothing is checked.

    Raises:
        ValueError: naming the dataset, the column, the first empty row, how many there are and the fix.
    """
    column = "completion" if "completion" in dataset_columns(dataset) else "messages"
    if column not in dataset_columns(dataset) or (column == "messages" and not assistant_only_loss):
        return

    def empty(value: Any) -> bool:
        turns = [m for m in value if m.get("role") == "assistant"] if column == "messages" else value
        if isinstance(turns, str):
            return not turns.strip()
        return not any(row_text(m.get("content")).strip() or m.get("tool_calls") for m in turns)

    values = dataset[column]
    bad = [i for i, value in enumerate(values) if value is not None and empty(value)]
    if bad:
        more = f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
        if column == "messages" and not any(m.get("role") == "assistant" for m in values[bad[0]]):
            roles = ", ".join(str(m.get("role")) for m in values[bad[0]])
            raise ValueError(
                f"`{role}` column 'messages' has no assistant turn at row {bad[0]}, whose roles are {roles}{more}: "
                "an SFT row trains on the assistant's turns, and this one has none. Add the assistant's reply, or drop "
                "such rows, e.g. `dataset.filter(lambda row: any(m['content'] for m in row['messages'] if m['role'] "
                "== 'assistant'))`."
            )
        what = "completion" if column == "completion" else "assistant turn"
        keep = (
            f"row[{column!r}].strip()"
            if isinstance(dataset[bad[0]][column], str)
            else f"any(m['content'] for m in row[{column!r}] if m['role'] == 'assistant')"
        )
        raise ValueError(
            f"`{role}` column {column!r} has an empty {what} at row {bad[0]}{more}: an SFT row trains on its "
            f"completion, and this one would teach only to stop. Fill it, or drop such rows, e.g. "
            f"`dataset.filter(lambda row: {keep})`."
        )


def check_cells(
    dataset: Dataset, role: str, kind: str | None = None, assistant_only_loss: bool = False, allow_empty: bool = False
) -> None:
    """The checks of the cells TRAPO reads (`read_columns(columns, kind)`) that need no tokenizer: no missing value
    (`check_missing_values`), each of its column's form (`check_cell_types`), some text in some row
    (`check_not_all_empty`; not with `allow_empty`: an `environment_factory`'s `reset` writes the prompts of empty
    user messages, as in TRL), for SFT rows a completion to learn
    (`check_sft_completions`; with `assistant_only_loss`, an assistant turn of each `messages` row), and
    conversations TRAPO can place images in (`check_prompt_roles`).

    Raises:
        ValueError: naming the dataset, column, row and fix.
    """
    names = dataset_columns(dataset)
    columns = read_columns(names, kind)
    check_missing_values(dataset, role, columns)
    check_cell_types(dataset, role, columns)
    check_no_conversation_text(dataset, role, columns)
    if not allow_empty:
        check_not_all_empty(dataset, role, columns)
    if kind == "sft" or (kind is None and "text" not in names and {"completion", "messages"} & set(names)):
        check_sft_completions(dataset, role, assistant_only_loss)
    check_prompt_roles(dataset, role, kind)


def has_text(value: Any) -> bool:
    """Whether one cell holds anything a tokenizer or template writes: a non-empty string, or a message with content
    or a tool call (whitespace is text; an image part alone is not)."""
    if isinstance(value, (list, tuple)):
        return any(isinstance(m, dict) and (m.get("tool_calls") or row_text(m.get("content"))) for m in value)
    return bool(row_text(value))


def check_not_all_empty(dataset: Dataset, role: str, columns: Sequence[str]) -> None:
    """Refuse a dataset whose text columns among `columns` ('text', 'prompt', 'completion', 'messages') hold no text
    in any row: every value `''`, or conversations whose messages are all empty (a failed extraction; trial 15's
    C21, where an all-empty `text` column passed every check, then failed at the first step, after the model load and
    the initial evaluation). A column Arrow stores as strings is scanned by Arrow (no tokenizing, no Python per row);
    conversations row by row, stopping at the first with text. Rows without text among rows with text are not this
    check's (see docs/robustness.md for what happens to them), nor are datasets with an image column (an image alone
    is a row's content).

    Args:
        dataset (`Dataset`): a map-style dataset whose cells `check_missing_values` and `check_cell_types` passed.
        role (`str`): its argument's name, for the message.
        columns (`Sequence[str]`): the columns TRAPO reads from it (`read_columns`).

    Raises:
        ValueError: naming the dataset, the column(s), the row count and the fix.
    """
    import pyarrow.compute as pc

    names = dataset_columns(dataset)
    text_columns = [c for c in ("text", "prompt", "completion", "messages") if c in columns and c in names]
    if not text_columns or not len(dataset) or any(c in names for c in IMAGE_COLUMNS):
        return
    for column in text_columns:
        array = dataset.with_format("arrow")[column]
        if str(array.type) in ("string", "large_string"):
            if pc.max(pc.utf8_length(array)).as_py():
                return  # a row with text
        elif any(
            has_text(v) for batch in dataset.select_columns([column]).iter(batch_size=1000) for v in batch[column]
        ):
            return
    shown = " and ".join(repr(c) for c in text_columns)
    strings = [str(dataset.with_format("arrow")[c].type) in ("string", "large_string") for c in text_columns]
    values = "every value ''" if all(strings) else "no message with content" if not any(strings) else "no text"
    raise ValueError(
        f"`{role}` column{'s' if len(text_columns) > 1 else ''} {shown} {'are' if len(text_columns) > 1 else 'is'} "
        f"empty in all {len(dataset)} rows ({values}): no row has any text to train on or evaluate, which usually "
        "means it was lost upstream (a failed text extraction, the wrong column renamed). Fix: fill "
        f"{'them' if len(text_columns) > 1 else 'it'} from the source (look at `dataset[0]`), or drop the dataset."
    )


CONVERSATION_TEXT_ROWS = 16  # rows `check_no_conversation_text` reads: a column stored so holds it in every row


def check_no_conversation_text(dataset: Dataset, role: str, columns: list[str]) -> None:
    """Refuse a text cell of `prompt` / `completion` / `messages` that holds a JSON list of messages
    (`'[{"role": "user", "content": ...}]'`): how CSV files and spreadsheet exports store a conversation, since they
    cannot store lists. It would be trained on as plain text, brackets and quotes included. Reads the first
    [`CONVERSATION_TEXT_ROWS`] rows.

    Raises:
        ValueError: naming the dataset, the column, the row and the fix.
    """
    for column in [c for c in ("prompt", "completion", "messages") if c in columns]:
        for row, cell in enumerate(
            dataset.select_columns([column]).select(range(min(len(dataset), CONVERSATION_TEXT_ROWS)))[column]
        ):
            if not isinstance(cell, str) or not cell.lstrip().startswith("["):
                continue
            try:
                parsed = json.loads(cell)
            except ValueError:
                continue
            if parsed and isinstance(parsed, list) and is_messages(parsed):
                raise ValueError(
                    f"`{role}` column {column!r} row {row} is text that holds a JSON list of messages ({cell!r:.80}): "
                    "a conversation stored as text (CSV and spreadsheet exports cannot store lists) would be trained "
                    "on as plain text, brackets and quotes included. Fix: store the rows as JSONL or Parquet, or "
                    f"parse the column: `dataset.map(lambda r: {{{column!r}: json.loads(r[{column!r}])}})`."
                )


def check_conversations_renderable(
    dataset: Dataset, role: str, processing_class, template_kwargs: dict | None = None
) -> None:
    """Refuse conversational cells (`prompt` / `completion` messages, or a `messages` column) when there is no chat
    template to render them: neither `processing_class.chat_template` nor `chat_template` in `template_kwargs`.

    Raises:
        ValueError: naming the dataset, the column and the fixes.
    """
    if (template_kwargs or {}).get("chat_template") or getattr(processing_class, "chat_template", None):
        check_content_parts_rendered(dataset, role, processing_class, template_kwargs)
        return
    names = dataset_columns(dataset)
    for column in ("messages", "prompt", "completion"):
        if column in names and len(dataset) and is_messages(dataset[0][column]):
            raise ValueError(
                f"`{role}` column {column!r} holds conversations (lists of messages), but the tokenizer has no chat "
                "template to render them as text. Fix: set `tokenizer.chat_template` (the template of the model's "
                "instruct version, e.g. with trl's `clone_chat_template`), pass "
                "`chat_template_kwargs={'chat_template': ...}`, or give the rows as plain text."
            )


def _text_of_parts(messages: list[dict]) -> list[dict]:
    """`messages` with each list of `{"type": "text", "text": ...}` parts joined into one string."""
    return [
        {**m, "content": "".join(p.get("text") or "" for p in m["content"] if isinstance(p, dict))}
        if isinstance(m.get("content"), list)
        else m
        for m in messages
    ]


def check_content_parts_rendered(dataset: Dataset, role: str, processing_class, template_kwargs: dict | None) -> None:
    """Refuse messages whose content is a list of parts (`[{"type": "text", "text": ...}]`, TRL's multimodal form)
    when a tokenizer's chat template renders content as a string: the prompt would hold the Python text of the list
    (`user: [{'type': 'text', 'text': 'ab='}]`). TRL 1.16 passes such content to a text-only model's template as it is
    (`GRPOTrainer._tokenize_prompts` converts parts only for a vision-language processor), so a template that reads
    parts (e.g. Qwen3's) works, and one that does not trains on the list's text: the first row holding parts is rendered
    with its parts and with them joined into text, and refused when only the former shows a part's `type` key, or
    when only the former fails (a template that concatenates content as a string, e.g. SmolLM2's: jinja's
    `TypeError: can only concatenate str (not "list") to str`). A processor (vision-language model) renders parts itself: not checked.

    Raises:
        ValueError: naming the dataset, the column, the row, what the template made of it (or its error) and the fix.
    """
    from transformers import PreTrainedTokenizerBase

    if not isinstance(processing_class, PreTrainedTokenizerBase):
        return
    kwargs = dict(template_kwargs or {})
    for column in ("prompt", "completion", "messages"):
        if column not in dataset_columns(dataset) or "content: list" not in str(
            dataset.with_format("arrow")[column].type
        ):
            continue  # text, or messages whose content is text (Arrow holds one type per column)
        for row, value in enumerate(dataset[column]):
            if not is_messages(value) or not any(isinstance(m.get("content"), list) for m in value):
                continue
            try:
                joined = processing_class.apply_chat_template(_text_of_parts(value), tokenize=False, **kwargs)
            except Exception:  # a template that refuses these messages as text too: rendering names the row
                return
            fix = (
                "Fix: give each content as a string, e.g. `dataset.map(lambda row: "
                f"{{{column!r}: [{{**m, 'content': ''.join(p['text'] for p in m['content'])}} if "
                f"isinstance(m['content'], list) else m for m in row[{column!r}]]}})`, or use a chat template that "
                "reads content parts."
            )
            try:
                shown = processing_class.apply_chat_template(value, tokenize=False, **kwargs)
            except Exception as error:  # e.g. jinja's `can only concatenate str (not "list") to str` (SmolLM2)
                raise ValueError(
                    f"`{role}` column {column!r} row {row}: a message's content is a list of parts "
                    f"({str(value[0].get('content'))[:60]}), which the tokenizer's chat template cannot render "
                    f"({type(error).__name__}: {error}); it renders the same messages with the text parts joined "
                    "into a string. TRL passes such content to a text-only model's template unchanged (it converts "
                    f"parts only for vision-language processors). {fix}"
                ) from error
            keys = ("'type'", '"type"')
            if shown != joined and any(k in shown and k not in joined for k in keys):
                start = max(0, min(shown.find(k) for k in keys if k in shown) - 30)
                raise ValueError(
                    f"`{role}` column {column!r} row {row}: a message's content is a list of parts "
                    f"({str(value[0].get('content'))[:60]}), but the tokenizer's chat template renders content as a "
                    f"string: the text would hold the list's Python text ({shown[start : start + 70]!r}). TRL passes "
                    "such content to a text-only model's template unchanged (it converts parts only for "
                    f"vision-language processors). {fix}"
                )
            break  # one row shows what the template does with parts


def check_rows(
    dataset: Dataset, role: str, tokenizer, kind: str | None = None, limit: int | None = None, cells: bool = True
) -> None:
    """Refuse cells TRAPO cannot read (`check_cells`; skipped with `cells=False`, for data `check_datasets` has
    checked), and count the characters of their text the tokenizer cannot represent (`check_unknown_tokens`, over the
    first `limit` rows when given).

    Raises:
        ValueError: naming the dataset, column, row and fix.
    """
    columns = read_columns(dataset_columns(dataset), kind)
    if cells:
        check_cells(dataset, role, kind)
    scanned = dataset if limit is None or len(dataset) <= limit else dataset.select(range(limit))
    scope = "" if scanned is dataset else f"of the first {limit}"
    for column in columns:
        if column in dataset_columns(dataset) and column not in ("input_ids", "attention_mask", "task", "split"):
            check_unknown_tokens([row_text(v) for v in scanned[column]], tokenizer, role, column, scope)


def nested_rows_hint(dataset: Dataset | IterableDataset, wanted: set[str]) -> str:
    """A sentence for a dataset whose rows sit under one key of a JSON document (`{"data": [{...}, ...]}`, a common
    export shape: `datasets` reads it as one row whose `data` cell is the list of rows), when a cell of its first row
    is a list of objects with one of the `wanted` columns; "" otherwise (trial 10's CX05)."""
    if not isinstance(dataset, Dataset) or not len(dataset):
        return ""
    first = dataset[0]
    for column, cell in first.items():
        if isinstance(cell, list) and cell and isinstance(cell[0], dict) and wanted & set(cell[0]):
            return (
                f" Its rows seem to be nested under the key {column!r} ({len(cell)} object(s) with "
                f"{sorted(cell[0])} in the first row's {column!r}): write them as JSON Lines (one object per line) or "
                f"a top-level JSON list, or in Python load them with `load_dataset('json', data_files=path, "
                f"field={column!r})`."
            )
    return ""


PROMPT_COLUMNS = ("question", "query", "instruction", "problem", "input", "prompt_text", "source")
"""Column names that likely hold a prompt (raw datasets: GSM8K's `question`, Alpaca's `instruction`, ...), in the
order [`column_mapping_example`] prefers them."""
COMPLETION_COLUMNS = ("answer", "response", "output", "solution", "completion_text", "target", "reply")
"""Column names that likely hold a demonstration's completion (GSM8K's `answer`, Alpaca's `output`, ...)."""
TEXT_COLUMNS = ("content", "document", "body", "article", "passage", "story", "code")
"""Column names that likely hold a pretraining document."""


def likely_column(columns: Sequence[str], candidates: Sequence[str]) -> str | None:
    """The first of `candidates` (compared in lower case) that `columns` has, as `columns` spells it; None if none."""
    by_lower = {str(column).lower(): column for column in columns}
    return next((by_lower[name] for name in candidates if name in by_lower), None)


def first_row(dataset: Dataset | IterableDataset) -> Mapping | None:
    """The first row of a `Dataset` that has one; None for an empty or streaming one (not read here)."""
    return dataset[0] if isinstance(dataset, Dataset) and len(dataset) else None


def holds_messages(cell: Any) -> bool:
    """Whether a cell is a conversation: a non-empty list of messages (TRL's `is_conversational`)."""
    return isinstance(cell, list) and bool(cell) and is_conversational({"messages": cell})


def not_renamable_hint(row: Mapping | None, column: str | None, target: str) -> str | None:
    """The fix for a column whose cells no rename to `target` ('text', 'prompt' or 'completion') makes what TRL's
    format reads there: pretraining text must be a string, a prompt or completion a string or a list of messages
    (trial 14's N46: `rename_column('messages', 'text')` was suggested, then refused for holding lists). A column of
    conversations as pretraining text is rendered with the chat template or passed as `sft_dataset`.

    Returns:
        A sentence starting with " Fix:", or None when the rename would do (or the row is not known).
    """
    if row is None or column is None or column not in row:
        return None
    cell = row[column]
    conversation = holds_messages(cell)
    if isinstance(cell, str) or (conversation and target != "text"):
        return None
    if conversation:
        return (
            f" Fix: its {column!r} column holds conversations (lists of messages), which a rename does not make text: "
            f"pass the dataset as `sft_dataset=` (TRL's conversational format: the assistant turns are trained), or "
            f"render each conversation into a 'text' column with the chat template, e.g. `dataset.map(lambda row: "
            f"{{'text': tokenizer.apply_chat_template(row[{column!r}], tokenize=False)}})`."
        )
    wanted = "text (a string)" if target == "text" else "text (a string) or a list of messages"
    return (
        f" Fix: its {column!r} column holds values of type {type(cell).__name__}, not {wanted}, so renaming it "
        f"{target!r} would be refused: build a {target!r} column of such values from it, e.g. "
        f"`dataset.map(lambda row: {{{target!r}: <text made from row[{column!r}]>}})`."
    )


def column_mapping_example(columns: Sequence[str], slot: str, row: Mapping | None = None) -> str:
    """A one-line fix for a dataset without the columns of `slot` ('rl', 'sft' or 'pretrain'): the `datasets` call that
    maps its own columns to TRL's format (trial 13's N26: a raw GSM8K file, `question` / `answer`, was refused in each
    slot, with an example only in the pretraining one). Built from the columns it has when a likely one is there
    ([`PROMPT_COLUMNS`], [`COMPLETION_COLUMNS`], [`TEXT_COLUMNS`]), else with placeholders. With the dataset's first
    `row`, a column whose cells a rename would not make valid gets [`not_renamable_hint`]'s fix instead.

    Returns:
        `str`: a sentence starting with a space, e.g. " Fix: `dataset.rename_column('question', 'prompt')` (...)."
    """
    columns = list(columns)
    question, answer = likely_column(columns, PROMPT_COLUMNS), likely_column(columns, COMPLETION_COLUMNS)
    if slot == "rl":
        others = [c for c in columns if c != question]
        shown = ", ".join(map(repr, others[:3])) + (", ..." if len(others) > 3 else "")
        kept = (
            f" (the other column{'s' if len(others) > 1 else ''}, {shown}, reach{'' if len(others) > 1 else 'es'} the "
            "reward functions as keyword arguments)"
            if question and others
            else ""
        )
        column = question or "<prompt column>"
        hint = not_renamable_hint(row, question, "prompt")
        if hint:
            return hint
        return f" Fix: name the prompt column 'prompt', e.g. `dataset.rename_column({column!r}, 'prompt')`{kept}."
    if slot == "sft":
        mapping = {}
        if "prompt" not in columns:
            mapping[question or "<prompt column>"] = "prompt"
        if "completion" not in columns:
            mapping[answer or "<completion column>"] = "completion"
        hint = next(filter(None, (not_renamable_hint(row, k, v) for k, v in mapping.items())), None)
        if hint:
            return hint
        call = (
            f"dataset.rename_columns({mapping!r})"
            if len(mapping) > 1
            else "dataset.rename_column({!r}, {!r})".format(*next(iter(mapping.items())))
        )
        return f" Fix: map its columns to prompt-completion, e.g. `{call}`."
    text = likely_column(columns, TEXT_COLUMNS) or (columns[0] if len(columns) == 1 else None)
    conversations = [c for c in columns if row is not None and holds_messages(row.get(c))]
    hint = not_renamable_hint(row, conversations[0] if conversations else text, "text")
    if hint:
        return hint
    if text is None and question and answer:  # a question-answer pair: one document per row
        call = f"dataset.map(lambda row: {{'text': row[{question!r}] + '\\n' + row[{answer!r}]}})"
    else:
        call = f"dataset.rename_column({text or 'content'!r}, 'text')"
    return f" Fix: name the text column 'text', e.g. `{call}`."


def preference_rows_hint(dataset: Dataset | IterableDataset, name: str) -> str:
    """What to do with preference rows (TRL's preference format: `chosen` / `rejected`, with a `prompt` column or the
    prompt inside both) given as `name` (trial 15's N12: as `sft_dataset` they were told to rename a "<prompt
    column>" that does not exist). TRAPO trains no preference loss; the chosen answers can be demonstrations:

    - explicit prompt: `dataset.remove_columns('rejected').rename_column('chosen', 'completion')`;
    - implicit prompt, conversational (e.g. trl-lib/ultrafeedback_binarized): `rename_column('chosen', 'messages')`
      after removing `rejected` (the whole conversation, its assistant turns trained);
    - implicit prompt, text: TRL's `extract_prompt` first (the common start of chosen and rejected is the prompt).

    As RL prompts (`train_dataset`), rows without a `prompt` column get their prompts with `extract_prompt`.

    Args:
        dataset: the rows (the first one, when there is one, tells conversations from text: TRL's
            `is_conversational`).
        name: the argument they were given as (`sft_dataset`, `pretrain_dataset`, `train_dataset`, ...).

    Returns:
        `str`: sentences naming the format and the fix, "" for rows that are not preference data.
    """
    columns = set(dataset_columns(dataset))
    if not {"chosen", "rejected"} <= columns:
        return ""
    row = first_row(dataset)
    explicit = "prompt" in columns
    conversational = None if row is None else is_conversational({"chosen": row["chosen"]})
    keep_chosen = ".remove_columns('rejected').rename_column('chosen', {!r})"
    if explicit:
        demonstrations = "`dataset" + keep_chosen.format("completion") + "`"
    elif conversational:
        demonstrations = "`dataset" + keep_chosen.format("messages") + "`"
    elif conversational is False:
        demonstrations = "`dataset.map(extract_prompt)" + keep_chosen.format("completion") + "`"
    else:  # a streaming dataset: its rows are not read here
        demonstrations = (
            f"`dataset{keep_chosen.format('messages')}` for conversations, "
            f"`dataset.map(extract_prompt){keep_chosen.format('completion')}` for text"
        )
    prompt = "a 'prompt' column" if explicit else "the prompt inside both"
    hint = (
        f"`{name}` holds preference data (TRL's preference format: 'chosen' / 'rejected' columns, {prompt}), and "
        "TRAPO trains no preference loss (DPO is TRL's DPOTrainer). To use the chosen answers as demonstrations, pass "
        f"them as `sft_dataset`: {demonstrations}."
    )
    if name in ("train_dataset", "eval_dataset") and not explicit:
        hint += " To use its prompts for RL: `dataset.map(extract_prompt).remove_columns(['chosen', 'rejected'])`."
    if "extract_prompt" in hint:
        hint += (
            " (`from trl.data_utils import extract_prompt`: the start that chosen and rejected share becomes the "
            "'prompt'.)"
        )
    return hint


SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
"""ShareGPT's `from` values -> TRL's (OpenAI's) roles. TRL's `maybe_convert_to_chatml` renames the keys but keeps
the values, so a chat template gets the roles 'human' / 'gpt', which most templates do not know."""

ALPACA_COLUMNS = ("instruction", "input", "output")
"""The Alpaca format's columns (tatsu-lab/alpaca and its many copies): the prompt is the instruction followed by its
input (empty for many rows), the completion is the output."""


def sharegpt_column(dataset: Dataset | IterableDataset) -> str | None:
    """The column of the first row that holds a ShareGPT conversation (a non-empty list of `{"from", "value"}` turns:
    TRL's `is_conversational_from_value`, which reads the cell under `conversations`, the usual name); None if none
    (or the rows are not read here: an empty or streaming dataset)."""
    row = first_row(dataset)
    for column, cell in (row or {}).items():
        if isinstance(cell, list) and cell and is_conversational_from_value({"conversations": cell}):
            return column
    return None


def sharegpt_conversion(column: str, turns: list, target: str = "messages") -> str:
    """The `dataset.map(...)` call that turns the ShareGPT turns of column `column` into TRL's messages (role /
    content, with [`SHAREGPT_ROLES`]) in column `target`, with a note naming the `from` values of `turns` (a first
    row's) that the map lacks."""
    roles = dict(SHAREGPT_ROLES)
    unknown = sorted({str(t.get("from")) for t in turns if isinstance(t, dict)} - set(roles))
    removed = "" if column == target else f", remove_columns=[{column!r}]"
    call = (
        f"`dataset.map(lambda row: {{{target!r}: [{{'role': {roles!r}[turn['from']], 'content': turn['value']}} "
        f"for turn in row[{column!r}]]}}{removed})`"
    )
    note = f" (add the other 'from' values your rows use to the map: the first row has {unknown})" if unknown else ""
    return call + note


def community_format_hint(dataset: Dataset | IterableDataset, name: str, slot: str) -> str:
    """The fix for rows in one of the two most common community SFT layouts, given to `name` (trial 16's N23): the
    ShareGPT format (a `conversations` column of `{"from", "value"}` turns: one column, which no rename makes
    prompt-completion) and the Alpaca format (`instruction` / `input` / `output`: renaming `instruction` to
    `prompt` would drop `input`, the instruction's argument). Nothing is converted here: the message shows the
    one `dataset.map(...)` call that converts them.

    Args:
        dataset: the rows (a ShareGPT column is recognised from the first row: not for an empty or streaming one).
        name (`str`): the argument they were given as (`sft_dataset`, `eval_dataset['x']`, ...).
        slot (`str`): what the argument trains on: "sft" (demonstrations; an eval set's SFT loss too), "pretrain"
            (text) or "rl" (prompts).

    Returns:
        `str`: sentences starting with a space, naming the format and the fix; "" for rows in neither format.
    """
    columns = dataset_columns(dataset)
    column = sharegpt_column(dataset)
    if column is not None:
        convert = sharegpt_conversion(column, first_row(dataset)[column])
        said = (
            f" Its {column!r} column is in the ShareGPT format (turns of {{'from', 'value'}}); TRL's conversational "
            "format is a 'messages' column of {'role', 'content'} messages (human -> user, gpt -> assistant, "
            "system -> system)."
        )
        if slot == "sft":
            return f"{said} Fix: {convert}."
        if slot == "pretrain":
            return (
                f"{said} Conversations are SFT demonstrations: pass them as `sft_dataset=` after {convert}; or, to "
                "train every token as text, render each with the chat template after that: `.map(lambda row: "
                "{'text': tokenizer.apply_chat_template(row['messages'], tokenize=False)})`."
            )
        return f"{said} Conversations are SFT demonstrations: pass them as `sft_dataset=` after {convert}."
    if not set(ALPACA_COLUMNS) <= set(columns):
        return ""
    prompt = "row['instruction'] + ('\\n\\n' + row['input'] if row['input'] else '')"
    said = (
        f" `{name}` is in the Alpaca format (instruction / input / output): the prompt is the instruction followed "
        "by its input (as the Alpaca template joins them; an empty input adds nothing), so renaming 'instruction' "
        "alone would drop 'input'."
    )
    if slot == "sft":
        call = f"{{'prompt': {prompt}, 'completion': row['output']}}, remove_columns={list(ALPACA_COLUMNS)!r}"
        return f"{said} Fix: `dataset.map(lambda row: {call})`."
    if slot == "pretrain":
        call = f"{{'text': {prompt} + '\\n\\n' + row['output']}}, remove_columns={list(ALPACA_COLUMNS)!r}"
        return (
            f"{said} Fix: `dataset.map(lambda row: {call})` (or, to train on the outputs only, pass the rows as "
            "`sft_dataset=` with 'prompt' / 'completion' columns built the same way)."
        )
    call = f"{{'prompt': {prompt}}}, remove_columns=['instruction', 'input']"
    kept = "the 'output' column reaches the reward functions as `output`"
    return f"{said} Fix: `dataset.map(lambda row: {call})` ({kept})."


def check_pretrain_dataset(dataset: Dataset | IterableDataset) -> None:
    """Raise a ValueError unless `dataset` is a non-empty language-modelling dataset with a `text` column."""
    _check_not_empty(dataset, "pretrain_dataset")
    columns = dataset_columns(dataset)
    if columns and "text" not in columns:
        preference = preference_rows_hint(dataset, "pretrain_dataset")
        community = community_format_hint(dataset, "pretrain_dataset", "pretrain")
        raise ValueError(
            f"`pretrain_dataset` must have a 'text' column (TRL's language-modelling format); it has {columns}."
            + (
                community
                or (
                    " " + preference if preference else column_mapping_example(columns, "pretrain", first_row(dataset))
                )
            )
            + nested_rows_hint(dataset, {"text"})
        )


def check_sft_dataset(dataset: Dataset) -> None:
    """Raise a ValueError unless `dataset` is a non-empty prompt-completion or `messages` dataset (a `text` one is
    pointed to `pretrain_dataset`, which trains every token of it as TRL's SFTTrainer trains a text row)."""
    _check_not_empty(dataset, "sft_dataset")
    columns = dataset_columns(dataset)
    if not ({"prompt", "completion"} <= set(columns) or "messages" in columns):
        text = (
            " A 'text' column (TRL SFTTrainer's language-modeling form, `dataset_text_field`) trains every token: "
            "pass such rows as `pretrain_dataset` (each document with EOS appended, every token trained)."
            if "text" in columns
            else ""
        )
        preference = preference_rows_hint(dataset, "sft_dataset")
        fix = (
            community_format_hint(dataset, "sft_dataset", "sft")
            or text
            or (" " + preference if preference else column_mapping_example(columns, "sft", first_row(dataset)))
        )
        raise ValueError(
            f"`sft_dataset` must have 'prompt' and 'completion' columns (prompt-completion format) or a 'messages' "
            f"column (conversational format); it has {columns}.{fix} See https://huggingface.co/docs/trl/dataset_formats."
            + nested_rows_hint(dataset, {"prompt", "completion", "messages"})
        )
    if "label" in columns and has_bool_column(dataset, "label"):  # KTO's rows were imitated, label=False ones too
        raise ValueError(
            "`sft_dataset` has a boolean 'label' column: its rows are in TRL's unpaired preference format (KTO: "
            "label=False marks an undesirable completion), and the SFT objective imitates every completion, the "
            "label=False ones too. Fix: keep the desirable rows and drop the column, "
            "`dataset.filter(lambda row: row['label']).remove_columns('label')`. See "
            "https://huggingface.co/docs/trl/dataset_formats (unpaired preference)."
        )


def mixed_formats_notice(columns: Sequence[str], role: str, kind: str | None = None) -> str | None:
    """The warning for a dataset whose columns hold two of TRL's formats, of which `role` reads one and ignores the
    other without a word (a half-converted dataset would be trained or evaluated on half of its data), or None.

    Said: an SFT dataset (`kind="sft"`: `sft_dataset`, a `DemonstrationObjective`'s) or an eval set with both
    `messages` and `prompt` + `completion` (prompt-completion is read, TRL's `SFTTrainer` precedence); an eval set
    (`kind=None`, the format [`read_columns`] reads) with `text` and any of `prompt` / `completion` / `messages` (the
    language-modelling loss of `text` is evaluated), or with `prompt` and `messages` but no `completion` (the SFT loss
    of `messages` is evaluated, the prompts are not scored with rewards). Not said: RL prompts with a `messages`
    column (it reaches the reward functions) and `pretrain_dataset` with other columns (its one format is `text`;
    other columns are the user's, as for every dataset).

    Args:
        columns (`Sequence[str]`): the dataset's columns.
        role (`str`): how the message names the dataset (e.g. "sft_dataset", "eval_dataset['a']").
        kind (`str`, *optional*): "sft" for an SFT objective's dataset; None for an eval set.
    """
    columns = set(columns)
    if kind is None and "text" in columns:
        others = [c for c in ("prompt", "completion", "messages") if c in columns]
        if not others:
            return None
        listed = "/".join(f"`{c}`" for c in others)
        return (
            f"`{role}` has both `text` and {listed} columns: evaluating the language-modelling loss of `text`; "
            f"{listed} {'is' if len(others) == 1 else 'are'} ignored (remove one of them to silence this)"
        )
    if kind not in ("sft", None):
        return None
    if {"prompt", "completion"} <= columns and "messages" in columns:
        doing = "training on" if kind == "sft" else "evaluating the SFT loss of"
        return (
            f"`{role}` has both `messages` and `prompt`/`completion` columns: {doing} prompt/completion; `messages` is "
            "ignored (remove one of them to silence this)"
        )
    if kind is None and {"prompt", "messages"} <= columns and "completion" not in columns:
        return (
            f"`{role}` has both `prompt` and `messages` columns: evaluating the SFT loss of `messages`; the prompts "
            "are not scored with rewards (remove one of them to silence this)"
        )
    return None


def warn_mixed_formats(named: Sequence[tuple[str, Any]], kind: str | None = None) -> None:
    """Log [`mixed_formats_notice`] for each `(role, dataset)` of `named` whose columns hold two formats; called once
    per dataset at construction (and for a dataset passed to `evaluate()`)."""
    for role, dataset in named:
        notice = mixed_formats_notice(dataset_columns(dataset), role, kind)
        if notice:
            logger.warning(notice)


def has_bool_column(dataset: Dataset | IterableDataset, column: str) -> bool:
    """Whether `column` of `dataset` holds booleans: its feature is `Value("bool")`, or (a dataset without
    features) the first row's cell is a bool."""
    features = getattr(dataset, "features", None)
    if features is not None and column in features:
        return getattr(features[column], "dtype", None) == "bool"
    if isinstance(dataset, Dataset) and len(dataset):
        return isinstance(dataset[0][column], bool)
    return False


def misplaced_rows_hint(columns: Sequence[str], name: str = "train_dataset") -> str:
    """A sentence for RL prompts whose columns are another objective's (TRL's SFTTrainer takes its data as
    `train_dataset`, the first thing a migrating user writes; trial 11's N60): a 'completion' or 'messages' column is
    SFT's (`sft_dataset=`), a 'text' column without prompts is pretraining's (`pretrain_dataset=`); "" otherwise."""
    columns = set(columns)
    if "messages" in columns or "completion" in columns:
        column = "messages" if "messages" in columns else "completion"
        return (
            f"`{name}` is the RL prompts, and these rows have a {column!r} column: they are SFT demonstrations (TRL's "
            f"SFTTrainer takes them as its train_dataset): pass them as `sft_dataset=`."
        )
    if "text" in columns and not columns & {"prompt", "input_ids"}:
        return (
            f"`{name}` is the RL prompts, and these rows have a 'text' column: plain documents (every token trained, "
            "as TRL's SFTTrainer trains a 'text' row) go in `pretrain_dataset=`."
        )
    return ""


def check_prompt_dataset(dataset: Dataset, name: str = "train_dataset") -> None:
    """Raise a ValueError unless `dataset` is a non-empty prompt-only dataset (`prompt` or tokenized `input_ids`);
    SFT or pretraining rows are pointed to their argument first (`misplaced_rows_hint`)."""
    _check_not_empty(dataset, name)
    columns = dataset_columns(dataset)
    if "prompt" not in columns and "input_ids" not in columns:
        misplaced = misplaced_rows_hint(columns, name)
        preference = preference_rows_hint(dataset, name)
        raise ValueError(
            (misplaced + " " if misplaced else "")
            + f"`{name}` (RL prompts) must have a 'prompt' column (TRL's prompt-only format) or an 'input_ids' column "
            f"(tokenized prompts, as TRL's PPOTrainer took); it has {columns}."
            + (
                community_format_hint(dataset, name, "rl")
                or (
                    ""
                    if misplaced
                    else " " + preference
                    if preference
                    else column_mapping_example(columns, "rl", first_row(dataset))
                )
            )
            + nested_rows_hint(dataset, {"prompt", "input_ids"})
        )


def row_template_kwargs(example: dict, template_kwargs: dict | None) -> dict:
    """The `apply_chat_template` arguments of one row: `template_kwargs` (`TRAPOConfig.chat_template_kwargs`), then
    the row's `chat_template_kwargs` cell (a dict; TRL's `SFTTrainer` reads it per row) over them."""
    own = example.get("chat_template_kwargs")
    return {**(template_kwargs or {}), **(own if isinstance(own, dict) else {})}


def render_ids(messages: list, tokenizer, template_kwargs: dict | None = None, **options) -> dict:
    """`tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, ...)` as TRL 1.16's trainers call it:
    `tools` (from `template_kwargs`, a list of schemas or a JSON string of one, as TRL's SFT reads a row's `tools`)
    passed as `tools=... or None` (an empty list would make some templates write tool boilerplate), the other
    `template_kwargs` to the template, `options` (`add_generation_prompt`, `return_assistant_tokens_mask`) as given.

    Returns:
        `dict`: `input_ids` (a list of ids) and, with `return_assistant_tokens_mask=True`, `assistant_masks`.
    """
    kwargs = dict(template_kwargs or {})
    tools = _row_tools(kwargs.pop("tools", None))
    rendered = tokenizer.apply_chat_template(
        list(messages), tools=tools or None, tokenize=True, return_dict=True, **options, **kwargs
    )
    return {key: list(rendered[key]) for key in ("input_ids", "assistant_masks") if key in rendered}


def tokenize_prompt(prompt: Any, tokenizer, template_kwargs: dict | None = None) -> list[int]:
    """Token ids of one prompt, as used both for generation and as the prefix of SFT rows; rendered as TRL 1.16's
    `GRPOTrainer` renders its prompts (`_tokenize_prompts`), token for token.

    Conversational prompts: `tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, ...)`
    whatever the last message's role: after a final `user`, `tool`, `system` (or any) message, and after a final
    `assistant` message too, the template opens a new assistant turn (the final assistant message is not continued).
    Standard text prompts get the tokenizer's special tokens (e.g. BOS) as `tokenizer(text)` adds them.

    Args:
        prompt (`str` or `list[dict]`): a prompt in standard or conversational format.
        tokenizer: the policy's tokenizer.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template` (`tools`: the tool schemas).

    Returns:
        `list[int]`: the prompt's token ids.

    Raises:
        jinja2.TemplateError: whatever the chat template raises for the conversation (e.g. a template that requires
            alternating roles); `tokenize_prompt_dataset` names the dataset and the row.
    """
    if is_conversational({"prompt": prompt}):
        return render_ids(prompt, tokenizer, template_kwargs, add_generation_prompt=True)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def has_tool_calls(messages: Any) -> bool:
    """Whether a `messages` cell holds an assistant tool call or a `tool` message."""
    return isinstance(messages, (list, tuple)) and any(
        isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages
    )


def warn_trained_tool_results(dataset: Dataset, role: str = "sft_dataset", config_name: str = "TRAPOConfig") -> int:
    """With `assistant_only_loss=False`, log one warning when `messages` rows hold `tool` messages: every token of
    such a row is trained (as TRL's SFTTrainer trains a `messages` row), the tool results included, so the model
    learns to write what its tools return.

    Returns:
        `int`: the number of such rows (0: nothing logged).
    """
    if "messages" not in dataset_columns(dataset) or "completion" in dataset_columns(dataset):
        return 0
    count = sum(
        isinstance(messages, (list, tuple)) and any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
        for messages in dataset["messages"]
    )
    if count:
        logger.warning(
            "%d of %d `%s` rows have tool messages; with %s.assistant_only_loss=False every token of a 'messages' row "
            "is trained, as TRL's SFTTrainer trains it: the tool results, user and system messages too, so the model "
            "learns to write tool results. Set assistant_only_loss=True to train the assistant turns only (their tool "
            "calls included).",
            count,
            len(dataset),
            role,
            config_name,
        )
    return count


def check_assistant_only_loss(
    dataset: Dataset, tokenizer, template_kwargs: dict | None = None, role: str = "sft_dataset"
) -> None:
    """Refuse, before training, SFT data and a tokenizer that `assistant_only_loss=True` cannot train on.

    Raises:
        ValueError: naming `assistant_only_loss` and the fix, for prompt-completion text rows (completion-only loss
            already applies there), a chat template without `{% generation %}` markers (transformers' assistant mask
            would be all zeros), or rows with tool calls / tool messages whose template cannot render them (TRL's
            `supports_tool_calling`).
    """
    template_kwargs = template_kwargs or {}
    columns = dataset_columns(dataset)
    first = dataset[0]
    conversational = "messages" in columns or is_conversational({"prompt": first.get("prompt")})
    if not conversational:
        raise ValueError(
            f"assistant_only_loss=True trains the assistant turns of conversational rows (`messages`), but `{role}` "
            f"has prompt-completion text rows (columns {columns}): their loss is already on the completion only "
            "(completion-only loss). Set assistant_only_loss=False, or give conversational `messages` rows."
        )
    template = template_kwargs.get("chat_template") or tokenizer.chat_template
    if not template or not has_generation_markers(template):
        raise ValueError(
            "assistant_only_loss=True takes the trained tokens from the chat template's assistant mask, but the "
            f"tokenizer's chat template {'is None' if not template else 'has no `{% generation %}` markers'}: "
            "transformers would return an all-zero mask and nothing would be trained. Add "
            "`{% generation %}...{% endgeneration %}` around the assistant's content, tool calls and end-of-turn token "
            "in `tokenizer.chat_template`, or use a template that has them (for the character-level tokenizer: "
            "trl_trapo.agents.use_tool_chat_template; for a ChatML model such as SmolLM2: "
            "trl_trapo.agents.use_chatml_tool_template), or set assistant_only_loss=False."
        )
    cells = dataset["messages"] if "messages" in columns else list(dataset["prompt"]) + list(dataset["completion"])
    traced = next((i for i, messages in enumerate(cells) if has_tool_calls(messages)), None)
    if traced is not None and not supports_tool_calling(tokenizer):
        raise ValueError(
            f"`{role}` row {traced % len(dataset)} has tool calls or tool messages, but the tokenizer's chat template "
            "cannot render them (rendering an assistant tool call and a `tool` message loses one of them), so "
            "assistant_only_loss=True would train on a trace that is not there. Give the tokenizer a tool-calling "
            "template with `{% generation %}` markers (for the character-level tokenizer: "
            "trl_trapo.agents.use_tool_chat_template; for a ChatML model such as SmolLM2: "
            "trl_trapo.agents.use_chatml_tool_template), or drop such rows."
        )


def check_tool_rendering(dataset: Dataset, tokenizer, role: str = "sft_dataset") -> None:
    """Refuse `messages` rows with tool calls or `tool` messages when the tokenizer's chat template cannot render them
    (TRL's `supports_tool_calling`): the rendered context would silently lose them.

    Raises:
        ValueError: naming the dataset, the first such row and the fix.
    """
    if "messages" not in dataset_columns(dataset):
        return
    traced = next((i for i, messages in enumerate(dataset["messages"]) if has_tool_calls(messages)), None)
    if traced is not None and not supports_tool_calling(tokenizer):
        raise ValueError(
            f"`{role}` row {traced} has tool calls or tool messages, but the tokenizer's chat template cannot render "
            "them (rendering an assistant tool call and a `tool` message loses one of them), so the row would be "
            "trained on a conversation without them. Give the tokenizer a tool-calling template (for the "
            "character-level tokenizer: trl_trapo.agents.use_tool_chat_template; for a ChatML model such as SmolLM2: "
            "trl_trapo.agents.use_chatml_tool_template), or drop such rows."
        )


def warn_stop_token_untrained(tokenizer, template_kwargs: dict | None = None) -> bool:
    """Log a warning when the chat template's assistant mask leaves out the end-of-turn token (TRL's
    `is_chat_template_stop_token_trained`): with `assistant_only_loss=True` the model would not learn to stop.

    Returns:
        `bool`: whether the warning was logged.
    """
    chat_template = (template_kwargs or {}).get("chat_template")
    if is_chat_template_stop_token_trained(tokenizer, chat_template=chat_template):
        return False
    logger.warning(
        "assistant_only_loss=True: the chat template's assistant mask leaves out the end-of-turn token, so the model "
        "is not trained to stop. Move the end-of-turn token inside `{%% generation %%}...{%% endgeneration %%}`."
    )
    return True


def _row_tools(value: Any) -> list | None:
    """A row's `tools` cell as `apply_chat_template(tools=...)` takes it (TRL's SFT accepts a JSON string too); checked
    beforehand by [`check_tool_call_traces`]."""
    if isinstance(value, str):
        return json.loads(value) if value.strip() else None
    return value or None


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")
"""The message roles chat templates know (OpenAI's, `function` the legacy tool role, `ipython` Llama 3's)."""


def warn_unknown_roles(dataset: Dataset, role: str) -> None:
    """Warn when conversations of `dataset` (`messages`, or conversational `prompt` / `completion`) hold a role
    outside [`CHAT_ROLES`], e.g. a typo: most chat templates render any role as given, so the row would train
    silently (as with TRL's `SFTTrainer`, which accepts it too)."""
    columns = dataset_columns(dataset)
    found: dict[str, list[int]] = {}
    for column in ("messages", "prompt", "completion"):
        if column not in columns:
            continue
        for row, value in enumerate(dataset[column]):
            if not is_messages(value):
                continue
            for message in value:
                name = message.get("role")
                if isinstance(name, str) and name not in CHAT_ROLES:
                    found.setdefault(name, []).append(row)
    for name, rows in found.items():
        logger.warning(
            "%d rows of `%s` have role %r (first at row %d), which is none of %s: the chat template renders it as "
            "given (or refuses it). Did you mean 'user' or 'assistant'?",
            len(set(rows)), role, name, rows[0], ", ".join(CHAT_ROLES),
        )  # fmt: skip


def check_row_cells(dataset: Dataset, role: str) -> None:
    """Refuse per-row cells the chat template reads that would crash it with a raw JSON / transformers error, or be
    dropped without a word: a `tools` cell ([`row_tool_names`]) and a `chat_template_kwargs` cell that is not a dict
    (TRL's `SFTTrainer` passes it as `**cell`). Checked for every dataset a chat template renders (RL prompts, SFT
    and distillation rows, evaluation sets).

    Raises:
        ValueError: naming the dataset, the row, the column, the value and the fix.
    """
    columns = dataset_columns(dataset)
    if "tools" in columns:
        for row, tools_cell in enumerate(dataset["tools"]):

            def bad(field: str, problem: str, fix: str, row=row) -> ValueError:
                return ValueError(f"`{role}` row {row}, {field}: {problem}. {fix}")

            row_tool_names(tools_cell, bad)
    if "chat_template_kwargs" in columns:
        for row, cell in enumerate(dataset["chat_template_kwargs"]):
            if cell is not None and not isinstance(cell, dict):
                raise ValueError(
                    f"`{role}` row {row}, `chat_template_kwargs`: a {type(cell).__name__} ({str(cell)[:80]!r}), not "
                    'a dict of template arguments. Write it as an object, e.g. {"enable_thinking": false}, or None.'
                )
            if isinstance(cell, dict) and "tools" in cell:  # read as the row's `tools` (see `row_template_kwargs`)

                def bad(field: str, problem: str, fix: str, row=row) -> ValueError:
                    return ValueError(f"`{role}` row {row}, `chat_template_kwargs`[{field}]: {problem}. {fix}")

                row_tool_names(cell["tools"], bad)


def check_tool_call_traces(dataset: Dataset, role: str = "sft_dataset") -> None:
    """Refuse malformed tool-calling traces (TRL's conversational format: assistant messages with `tool_calls`, an
    optional `tools` column of JSON schemas) before anything is tokenized, where the chat template would crash with a
    Jinja or JSON traceback, or render a call the model should not learn.

    Each row's `tools` cell must be None, a list of schemas (each with a `name`) or a JSON string of one; each
    assistant message's `tool_calls` a list of calls, each a dict with a string `name` (at `function.name`, TRL's
    format, or at the top level), and `arguments`, when present, a dict or a JSON string of an object; when the row has
    tools, every call must name one of them.

    Raises:
        ValueError: naming the dataset, the row, the field and the fix.
    """
    columns = dataset_columns(dataset)
    if "messages" in columns and "completion" not in columns:
        cells = dataset["messages"]
    elif {"prompt", "completion"} <= set(columns):
        cells = [
            (list(p) if isinstance(p, list) else []) + (list(c) if isinstance(c, list) else [])
            for p, c in zip(dataset["prompt"], dataset["completion"])
        ]
    else:
        return
    tools_cells = dataset["tools"] if "tools" in columns else [None] * len(cells)
    for row, (messages, tools_cell) in enumerate(zip(cells, tools_cells)):

        def bad(field: str, problem: str, fix: str, row=row) -> ValueError:
            return ValueError(f"`{role}` row {row}, {field}: {problem}. {fix}")

        names = row_tool_names(tools_cell, bad)
        if not isinstance(messages, (list, tuple)):
            continue
        for turn, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            calls = message.get("tool_calls")
            if calls is None:
                continue
            where = f"message {turn} `tool_calls`"
            if not isinstance(calls, (list, tuple)):
                raise bad(
                    where,
                    f"a {type(calls).__name__} where a list of calls belongs",
                    'Write `tool_calls` as a list: [{"type": "function", "function": {"name": ..., "arguments": '
                    "{...}}}, ...].",
                )
            for index, call in enumerate(calls):
                here = f"{where}[{index}]"
                function = call.get("function") if isinstance(call, dict) and "function" in call else call
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise bad(
                        here,
                        f"a call without a string `name`: {call!r:.120}",
                        'Write each call as {"type": "function", "function": {"name": "<tool>", "arguments": {...}}}.',
                    )
                name, arguments = function["name"], function.get("arguments")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except json.JSONDecodeError as error:
                        raise bad(
                            f"{here} `arguments`",
                            f"the string does not parse as JSON ({error}): {function['arguments'][:80]!r}",
                            "Give the arguments as a dict, or as a JSON object string (json.dumps of the dict).",
                        ) from error
                if arguments is not None and not isinstance(arguments, dict):
                    raise bad(
                        f"{here} `arguments`",
                        f"{arguments!r:.80} is not a JSON object",
                        "Give the arguments as a dict of argument name -> value ({} for none).",
                    )
                if names is not None and name not in names:
                    raise bad(
                        here,
                        f"calls `{name}`, which is not among the row's `tools` ({names})",
                        "Fix the call's name, or add the tool's schema to the row's `tools`.",
                    )


def tokenize_sft_row(
    example: dict, tokenizer, template_kwargs: dict | None = None, assistant_only_loss: bool = False
) -> tuple[list[int], list[int], list[int]]:
    """`(input_ids, completion_mask, left_out)` of one SFT row, tokenized as TRL 1.16's `SFTTrainer` tokenizes it
    (`tokenize_fn` in `SFTTrainer._prepare_dataset`), token for token.

    - Prompt-completion rows: the prompt alone (conversational: rendered with `add_generation_prompt=True`, whatever
      its last role; text: `tokenizer(prompt)`) and prompt + completion (conversational: rendered whole; text:
      `tokenizer(prompt + completion)`, the completion ending with the EOS text, appended unless it ends with it).
      `input_ids` is the latter; the completion starts where the two diverge (TRL's `common_prefix_length`: usually
      after the prompt; earlier when the template renders the prompt alone differently, e.g. Gemma's empty thought
      block, or when tokens merge across the boundary) and `completion_mask` is 1 from there on. Nothing is
      appended to a conversational row: its completion ends as the template ends an assistant turn.
    - `messages` rows (TRL's language-modeling form): the conversation rendered whole, whatever its last role, and
      `completion_mask` 1 on every token (TRL's labels are the ids: every message is trained, user, system and tool
      messages included).
    - With `assistant_only_loss`: the chat template's assistant mask (`return_assistant_tokens_mask=True`: every
      assistant turn of a `messages` row), for a prompt-completion row further limited to the completion, as TRL
      combines both masks. To train the assistant's replies only, use it or prompt-completion rows.

    Conversational rows get the row's `tools` (a list of JSON schemas or a JSON string of one) and its
    `chat_template_kwargs` (over `template_kwargs`), as TRL's SFT reads them per row.

    Args:
        example (`dict`): the row.
        tokenizer: the policy's tokenizer.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template` (`chat_template_kwargs`).
        assistant_only_loss (`bool`): train the assistant turns (`TRAPOConfig.assistant_only_loss`).

    Returns:
        `input_ids` (L ids), `completion_mask` (L values, 1 = trained) and the ids at the end of the tokenized
        prompt that `input_ids` does not hold (empty when the prompt is a prefix of the row).

    Raises:
        ValueError: with `assistant_only_loss`, for a row without an assistant message or whose assistant mask is all
            zeros (TRL's SFTTrainer raises a RuntimeError then).
    """
    kwargs = dict(template_kwargs or {})
    if example.get("tools") is not None:
        kwargs["tools"] = example["tools"]  # the row's tools, as TRL's SFTTrainer renders them
    kwargs = row_template_kwargs(example, kwargs)
    masks = {"return_assistant_tokens_mask": True} if assistant_only_loss else {}
    if "messages" in example and example.get("messages") is not None and "completion" not in example:
        prompt, completion = None, list(example["messages"])  # rendered whole, every token trained (as TRL)
    else:
        prompt, completion = example["prompt"], example["completion"]
    if assistant_only_loss and not any(m.get("role") == "assistant" for m in list(prompt or []) + list(completion)):
        raise ValueError(
            "An `sft_dataset` row has no assistant message, so assistant_only_loss=True has nothing to train on it: "
            "give every row at least one assistant turn, or drop such rows."
        )
    if prompt is None or is_conversational({"prompt": prompt}):
        whole = render_ids(list(prompt or []) + list(completion), tokenizer, kwargs, **masks)
        input_ids = whole["input_ids"]
        prompt_ids = render_ids(prompt, tokenizer, kwargs, add_generation_prompt=True)["input_ids"] if prompt else []
    else:
        eos_text = tokenizer.eos_token
        completion = completion if completion.endswith(eos_text) else completion + eos_text
        prompt_ids = list(tokenizer(prompt)["input_ids"])
        input_ids = list(tokenizer(prompt + completion)["input_ids"])
        whole = {}
    start = common_prefix_length(prompt_ids, input_ids)
    mask = [0] * start + [1] * (len(input_ids) - start)
    if assistant_only_loss:
        if 1 not in whole["assistant_masks"]:
            raise ValueError(
                "assistant_only_loss=True: the chat template's assistant mask of an `sft_dataset` row with assistant "
                "turns is all zeros (its `{% generation %}` markers enclose no assistant token). Put "
                "`{% generation %}...{% endgeneration %}` around the assistant's content, tool calls and end-of-turn "
                "token."
            )
        mask = [int(m and a) for m, a in zip(mask, whole["assistant_masks"], strict=True)]
    return input_ids, mask, prompt_ids[start:]


def tokenize_sft_dataset(
    dataset: Dataset,
    tokenizer,
    max_length: int,
    template_kwargs: dict | None = None,
    num_proc: int | None = None,
    assistant_only_loss: bool = False,
    images: ImageRows | None = None,
    role: str = "sft_dataset",
) -> Dataset:
    """Tokenise an SFT dataset into `input_ids` and `completion_mask` (1 on the completion's tokens), each row as
    TRL 1.16's `SFTTrainer` tokenizes it (see [`tokenize_sft_row`]): a text completion ends with EOS (appended
    unless it ends with it), a conversational one as the chat template ends an assistant turn (nothing appended; a
    warning counts the rows whose trained tokens hold no EOS, which do not teach the model to stop). A warning counts
    the rows whose tokenized prompt is not a prefix of the row (the completion starts where they diverge, as in TRL).

    With `images` (a VLM run) and an `images` / `image` column, every row goes through the processor instead (see
    [`~trl_trapo.vision.ImageRows.sft`]) and the result also has a `model_inputs` column (the row's `pixel_values` ...,
    empty for a text row): a `messages` row trains every token but its image tokens (with `assistant_only_loss`, its
    assistant turns, from the processor's assistant mask); `assistant_only_loss` does not apply to prompt-completion
    image rows.

    Rows longer than `max_length` are truncated from the right; the number truncated is logged; rows left with no
    completion token are skipped.

    Args:
        dataset (`Dataset`): prompt-completion or `messages` dataset (optional `tools` and `chat_template_kwargs`
            columns, per row).
        tokenizer: the policy's tokenizer (must have an EOS token).
        max_length (`int`): maximum row length in tokens.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template`.
        num_proc (`int`, *optional*): processes for `Dataset.map`.
        assistant_only_loss (`bool`): train every assistant turn of conversational rows (`TRAPOConfig`'s field; the
            data and template are checked by `check_assistant_only_loss`).
        images ([`~trl_trapo.vision.ImageRows`], *optional*): the processor's row builder of a VLM run.
        role (`str`): how errors name the dataset.

    Returns:
        `Dataset` with columns `input_ids` and `completion_mask` (lists of equal length, in tokens).

    Raises:
        ValueError: if a row has no assistant message or an all-zero assistant mask (with `assistant_only_loss`), the
            chat template fails on a row (naming it), or no row keeps a completion token.
    """
    template_kwargs = template_kwargs or {}
    eos = tokenizer.eos_token_id
    column = image_column(dataset_columns(dataset), role)
    if column is not None and images is not None:
        return _tokenize_image_sft_dataset(dataset, images, column, max_length, role, num_proc, assistant_only_loss)
    if assistant_only_loss:
        check_assistant_only_loss(dataset, tokenizer, template_kwargs)

    def tokenize(example: dict, index: int) -> dict:
        with template_errors_named(role, index):
            input_ids, mask, left_out = tokenize_sft_row(example, tokenizer, template_kwargs, assistant_only_loss)
        stops = any(t == eos for t, m in zip(input_ids, mask) if m)
        return {
            "input_ids": input_ids[:max_length],
            "completion_mask": mask[:max_length],
            "truncated": len(input_ids) > max_length,
            "left_out": left_out,
            "stops": stops,
        }

    columns = dataset_columns(dataset)
    tokenized = dataset.map(
        tokenize, with_indices=True, remove_columns=columns, num_proc=num_proc, desc="Tokenizing SFT dataset"
    )
    num_truncated = sum(tokenized["truncated"])
    if num_truncated:
        logger.warning(
            "%d of %d SFT rows are longer than sft_max_length=%d tokens and were truncated.",
            num_truncated,
            len(tokenized),
            max_length,
        )
    left_out = [i for i, ids in enumerate(tokenized["left_out"]) if ids]
    if left_out:
        logger.warning(
            "%d of %d `%s` rows: the tokenized prompt is not a prefix of the tokenized prompt+completion (first: row "
            "%d, whose prompt ends with %r), usually because the chat template renders the prompt alone differently "
            "or because tokens merge across the boundary. The completion starts where they diverge and this end of "
            "the prompt is left out of the training sequence, as TRL's SFTTrainer does: the model is trained on a "
            "context that differs from the one it sees at generation. Use a chat template that renders the prompt "
            "the same way in both cases, or end each prompt on a token boundary.",
            len(left_out),
            len(tokenized),
            role,
            left_out[0],
            tokenizer.decode(tokenized[left_out[0]]["left_out"]),
        )
    silent = len(tokenized) - sum(tokenized["stops"])
    if silent and not assistant_only_loss:  # with it, `warn_stop_token_untrained` checks the template once
        logger.warning(
            "%d of %d `%s` rows train no EOS token (id %d): the chat template does not end an assistant turn with it, "
            "so the model is not trained to stop. TRL's SFTTrainer trains the same tokens; end each completion "
            "with the EOS token (e.g. a chat template that closes the assistant turn with it) to teach stopping.",
            silent,
            len(tokenized),
            role,
            eos,
        )
    tokenized = tokenized.remove_columns(["truncated", "left_out", "stops"])
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


@contextlib.contextmanager
def template_errors_named(role: str, row: int | str) -> Iterator[None]:
    """Re-raise an error of the chat template (Jinja's `TemplateError`, e.g. `raise_exception('Conversation roles
    must alternate ...')` in Llama's and Mistral's templates) as a ValueError naming the dataset and the row: TRL's
    trainers would fail on the row with the template's message alone, from inside `datasets.map`.

    Any other exception of rendering (e.g. a Python `TypeError` inside the template) is re-raised the same way.

    Raises:
        ValueError: naming the dataset, the row, the template's message and the fix; for a template that does not
            compile (Jinja's `TemplateSyntaxError`, also an unknown filter's `TemplateAssertionError`), the template.
    """
    from jinja2 import TemplateError, TemplateSyntaxError

    try:
        yield
    except TemplateSyntaxError as error:  # also TemplateAssertionError (an unknown filter or test): no row renders
        raise ValueError(
            f"The chat template does not compile (line {error.lineno}: {error.message}), so no row can be rendered "
            f"(found rendering `{role}` row {row}). Fix the template, or set a working one before building the "
            "trainer (`tokenizer.chat_template = ...`, e.g. the template of the model's original tokenizer)."
        ) from None
    except TemplateError as error:
        raise ValueError(
            f"`{role}` row {row}: the chat template refused its conversation ({type(error).__name__}: {error}). Fix "
            "the row (e.g. the order of its roles) to what the template takes, pass another template "
            "(`chat_template_kwargs={'chat_template': ...}`), or drop such rows."
        ) from error
    except (
        Exception
    ) as error:  # e.g. a Python error inside the template (`str + list`), or `apply_chat_template`'s own
        raise ValueError(
            f"`{role}` row {row} could not be rendered ({type(error).__name__}: {error}). Fix the row to what the "
            "chat template takes (e.g. each message's `content` a string for a text-only template, the keys its "
            "messages need), pass another template (`chat_template_kwargs={'chat_template': ...}`), or drop such rows."
        ) from error


def _tokenize_image_sft_dataset(
    dataset: Dataset,
    images: ImageRows,
    column: str,
    max_length: int,
    role: str,
    num_proc: int | None,
    assistant_only_loss: bool = False,
) -> Dataset:
    """The SFT rows of a VLM run through the processor: `input_ids`, `completion_mask`, `model_inputs` (see
    `tokenize_sft_dataset`). A row longer than `max_length` keeps its first `max_length` tokens when its image tokens
    all fit (refused otherwise, naming the row)."""

    def tokenize(example: dict, index: int) -> dict:
        ids, mask, inputs = images.sft(example, column, role, index, assistant_only_loss)
        keep = images.cut(ids, max_length, role, index)
        return {"input_ids": ids[:keep], "completion_mask": mask[:keep], "model_inputs": inputs}

    tokenized = dataset.map(
        tokenize,
        with_indices=True,
        remove_columns=dataset_columns(dataset),
        num_proc=num_proc,
        writer_batch_size=IMAGE_WRITER_BATCH_SIZE,
        desc=f"Processing {role} (images)",
    )
    keep = tokenized.filter(lambda m: sum(m) > 0, input_columns="completion_mask")
    if len(keep) < len(tokenized):
        logger.warning(
            "%d SFT rows have no completion token left within sft_max_length=%d and are skipped.",
            len(tokenized) - len(keep),
            max_length,
        )
    if len(keep) == 0:
        raise ValueError(
            f"No `{role}` row keeps a completion token within sft_max_length={max_length}: raise sft_max_length."
        )
    return keep


def check_token_ids(dataset: Dataset, role: str, vocab_size: int) -> None:
    """Refuse a tokenized prompt (`input_ids`) holding a token id outside [0, `vocab_size`): the policy's embedding
    would fail on it at the first rollout (`IndexError: index out of range in self`). One vectorised min / max over
    the whole column; only when it finds an id outside, the rows are read to name the first one (positions its
    `attention_mask` marks as padding do not count).

    Raises:
        ValueError: naming the dataset, the row, the id, the vocabulary and the fix.
    """
    import pyarrow.compute as pc

    bounds = pc.min_max(pc.list_flatten(dataset.with_format("arrow")["input_ids"])).as_py()
    if bounds["min"] is None or (bounds["min"] >= 0 and bounds["max"] < vocab_size):
        return
    masks = dataset["attention_mask"] if "attention_mask" in dataset_columns(dataset) else None
    for row, ids in enumerate(dataset["input_ids"]):
        mask = masks[row] if masks is not None and masks[row] is not None else [1] * len(ids)
        bad = [t for t, m in zip(ids, mask) if m and not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"`{role}` column 'input_ids' holds token id {bad[0]} at row {row}, outside the policy's vocabulary "
                f"[0, {vocab_size}): tokenize the prompts with the policy's tokenizer (`processing_class`), or give "
                "them as text in a 'prompt' column, which TRAPO tokenizes."
            )


def strip_pad_runs(ids: Sequence[int], pad_token_id: int | None, bos_token_id: int | None = None) -> list[int]:
    """A pre-tokenized prompt without an attention mask, its padding removed: the leading and trailing runs of
    `pad_token_id` (TRL's PPOTrainer masked pad ids in its queries the same way). Only the runs at the ends go; a pad
    id inside the prompt stays. When the pad token is the EOS token, a trailing EOS is removed too: a prompt ending in
    end-of-text is not one a completion can follow, so it is read as padding. When the pad token is the BOS token,
    one leading BOS is kept (the prompt's own) unless the row is all padding.

    Args:
        ids (`Sequence[int]`): the row's `input_ids`, length L.
        pad_token_id (`int`, *optional*): the tokenizer's pad id; None leaves the ids as they are.
        bos_token_id (`int`, *optional*): the tokenizer's BOS id.

    Returns:
        `list[int]`: the ids without the padding, length <= L (empty when the row is all padding).
    """
    ids = list(ids)
    if pad_token_id is None:
        return ids
    start, end = 0, len(ids)
    while start < end and ids[start] == pad_token_id:
        start += 1
    while end > start and ids[end - 1] == pad_token_id:
        end -= 1
    if 0 < start < end and pad_token_id == bos_token_id:
        start -= 1
    return ids[start:end]


def tokenize_prompt_dataset(
    dataset: Dataset,
    tokenizer,
    max_prompt_length: int,
    template_kwargs: dict | None = None,
    name: str = "train_dataset",
    num_proc: int | None = None,
    images: ImageRows | None = None,
    vocab_size: int | None = None,
    context: tuple[int, int] | None = None,
) -> Dataset:
    """Add a `prompt_ids` column (and a text `prompt` for PPO-style tokenized datasets); check prompt lengths and,
    with `vocab_size`, that tokenized prompts' ids exist in the policy's vocabulary (`check_token_ids`).

    With `images` (a VLM run) and an `images` / `image` column, prompts go through the processor (their image
    tokens expanded, see [`~trl_trapo.vision.ImageRows.prompt`]) and a `model_inputs` column is added (the row's
    `pixel_values` ..., empty for a text row), which rollouts and evaluation pass to the model.

    Args:
        dataset (`Dataset`): prompt-only dataset (`prompt` column, standard or conversational, or `input_ids`;
            padded `input_ids` lose their padding by the `attention_mask` column, or without one by the pad id's
            leading and trailing runs, see `strip_pad_runs`, logged once at info level).
        tokenizer: the policy's tokenizer.
        max_prompt_length (`int`): maximum prompt length in tokens.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template`.
        name (`str`): the argument's name, for error messages.
        num_proc (`int`, *optional*): processes for `Dataset.map`.
        images ([`~trl_trapo.vision.ImageRows`], *optional*): the processor's row builder of a VLM run.
        vocab_size (`int`, *optional*): the policy's embedding rows; `input_ids` must lie in [0, vocab_size).
        context (`tuple[int, int]`, *optional*): `(max_positions, response_length)`: the model's context and the new
            tokens each prompt needs room for. With it, prompts beyond `max_prompt_length` that no `max_prompt_length`
            could let through (longer than the context leaves) are said at once ([`prompt_length_message`]).

    Returns:
        `Dataset`: the original columns plus `prompt_ids` (and `prompt` decoded from `input_ids` when absent, and
        `model_inputs` for a VLM run's image column).

    Raises:
        ValueError: if any prompt is longer than `max_prompt_length` tokens (never silently truncated), or empty, or
            (with `vocab_size`) holds a token id outside the vocabulary.
    """
    template_kwargs = template_kwargs or {}
    columns = dataset_columns(dataset)
    has_prompt = "prompt" in columns
    column = image_column(columns, name) if images is not None else None
    if column is not None and not has_prompt:
        raise ValueError(
            f"`{name}` has an {column!r} column and tokenized `input_ids` but no 'prompt': the processor must expand "
            "each image's placeholder, so give the prompts as text or messages in a 'prompt' column."
        )

    if not has_prompt and vocab_size is not None:
        check_token_ids(dataset, name, vocab_size)

    def tokenize(example: dict, index: int) -> dict:
        if column is not None:
            ids, inputs = images.prompt(example, column, name, index)
            return {"prompt_ids": ids, "model_inputs": inputs}
        if has_prompt:
            with template_errors_named(name, index):
                ids = tokenize_prompt(example["prompt"], tokenizer, template_kwargs)
            return {"prompt_ids": ids}
        ids = list(example["input_ids"])
        # PPO-style datasets may arrive padded: the attention mask decides when there is one, else the pad id's runs
        if "attention_mask" in example and example["attention_mask"] is not None:
            ids = [t for t, m in zip(ids, example["attention_mask"]) if m]
        else:
            ids = strip_pad_runs(ids, tokenizer.pad_token_id, getattr(tokenizer, "bos_token_id", None))
        return {"prompt_ids": ids, "prompt": tokenizer.decode(ids, skip_special_tokens=True)}

    tokenized = dataset.map(
        tokenize,
        with_indices=True,
        num_proc=num_proc,
        writer_batch_size=IMAGE_WRITER_BATCH_SIZE if column is not None else 1000,  # 1000: `datasets`' default
        desc=f"Tokenizing {name}",
    )
    lengths = [len(ids) for ids in tokenized["prompt_ids"]]
    if column is None and not has_prompt and "attention_mask" not in columns:
        stripped = sum(n != len(ids) for n, ids in zip(lengths, dataset["input_ids"]))
        if stripped:
            logger.info(
                "`%s` has no 'attention_mask' column: removed the leading and trailing runs of the pad id (%s) from "
                "%d of %d rows' `input_ids` (padding, as TRL's PPOTrainer masked it). An 'attention_mask' column "
                "makes the padding explicit.",
                name,
                tokenizer.pad_token_id,
                stripped,
                len(lengths),
            )
    too_long = [i for i, n in enumerate(lengths) if n > max_prompt_length]
    if too_long:
        raise ValueError(prompt_length_message(name, lengths, too_long, max_prompt_length, context))
    empty = [i for i, n in enumerate(lengths) if n == 0]
    if empty:
        prompt = dataset[empty[0]]["prompt"] if has_prompt else None
        written = sum(len(str(m.get("content") or "")) for m in prompt) if is_messages(prompt) else 0
        if written:  # the conversation has text: the template wrote none of it
            raise ValueError(
                f"The chat template renders {len(empty)} prompts of `{name}` as no tokens (first at row {empty[0]}, "
                f"{len(prompt)} messages with {written} characters of content): check that the template "
                "(`tokenizer.chat_template`) writes each message's content."
            )
        raise ValueError(f"{len(empty)} prompts of `{name}` are empty (first at row {empty[0]}); remove them.")
    return tokenized


def prompt_length_message(
    name: str, lengths: list[int], too_long: list[int], max_prompt_length: int, context: tuple[int, int] | None
) -> str:
    """The error for prompts of `name` longer than `max_prompt_length` (`lengths`: every prompt's tokens; `too_long`:
    the rows beyond it). When `context` (`(max_positions, response_length)`) says that some of them cannot fit the
    model's context beside `response_length` new tokens, it says so at once, with the numbers and the fixes that can
    work (trial 13's C10: the built-in model's 256 positions against 877-token GSM8K prompts were said only after the
    user had raised `max_prompt_length` as told); else raising `max_prompt_length` is the fix.

    Returns:
        `str`: naming `name`, the count, the longest prompt, its first row and the fix.
    """
    longest = max(lengths)
    said = (
        f"{len(too_long)} prompts of `{name}` are longer than max_prompt_length={max_prompt_length} tokens (longest: "
        f"{longest} tokens, first at row {too_long[0]})"
    )
    max_positions, response_length = context if context is not None else (None, 0)
    if max_positions is None or longest + response_length <= max_positions:
        return (
            f"{said}. Raise `max_prompt_length` (the model must fit max_prompt_length + response_length positions) or "
            "filter those prompts out; they are never truncated silently."
        )
    said += "; they are never truncated silently, and"
    room = max_positions - response_length  # the longest prompt the context holds beside response_length tokens
    if room < 1:
        return (
            f"{said} raising max_prompt_length cannot help: response_length={response_length} new tokens alone fill "
            f"the model's context of {max_positions} positions. Lower response_length below {max_positions}, then "
            "keep prompts within what it leaves (or use a model with a longer context)."
        )
    beyond = sum(n > room for n in lengths)
    lower = f", lower response_length to at most {max_positions - longest}" if longest < max_positions else ""
    return (
        f"{said} raising max_prompt_length cannot fit them all: the model's context of {max_positions} positions "
        f"leaves at most {room} tokens for a prompt beside response_length={response_length} new tokens, and "
        f"{beyond} prompt{'s are' if beyond != 1 else ' is'} longer than that. Fix: filter out the prompts longer "
        f"than {room} tokens and set max_prompt_length to at most {room}{lower}, or use a model with a longer context."
    )


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
    counted in a warning), as are empty values: a row whose demonstration is missing (None, or NaN as pandas writes
    it) or blank has none (a demonstration column may cover only some prompts). Characters the tokenizer cannot
    represent are counted as in `check_unknown_tokens`.

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
        ValueError: if `column` is not a column of `dataset`, no row keeps a demonstration, or one is nothing but
            unknown tokens.
    """
    template_kwargs = template_kwargs or {}
    columns = dataset_columns(dataset)
    if column not in columns:
        raise ValueError(
            f"demonstration_column={column!r} is not a column of `train_dataset` (columns: {columns}); name the column "
            "holding each prompt's reference solution, or set demonstration_column=None."
        )
    stops = list(stop_token_ids) or [tokenizer.eos_token_id]

    def text_of(value: Any) -> str:
        if isinstance(value, list):  # an assistant message list
            value = [m for m in value if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
            return row_text(value)
        return "" if missing_part(value) is not None else str(value)  # None / NaN: no demonstration for this row

    check_unknown_tokens([text_of(v) for v in dataset[column]], tokenizer, "train_dataset", column)

    def tokenize(example: dict) -> dict:
        value = text_of(example[column])
        if not value.strip():
            return {"demonstration_ids": [], "demonstration_too_long": False}
        prompt = example.get("prompt")
        if prompt is not None and is_conversational({"prompt": prompt}):
            # what follows the prompt rendered as for generation (`prompt_ids`), as TRL's SFTTrainer splits a row
            row = {"prompt": prompt, "completion": [{"role": "assistant", "content": str(value)}]}
            ids, mask, _ = tokenize_sft_row(row, tokenizer, template_kwargs)
            ids = [t for t, m in zip(ids, mask) if m]
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


PRETRAIN_READ_LIMIT = 64  # most documents one read of a `PretrainStream` tokenizes together


@dataclass
class StreamDocument:
    """A document in a [`PretrainStream`]'s buffer: its tokens are `buffer[first:end]` (`first` lies before the buffer's
    start when a resumed position had served its first tokens already), read at `position` of the stream."""

    first: int
    end: int
    position: dict


class PretrainStream:
    """Rows of pretraining tokens from a `text` dataset: packed (EOS between documents) or chunked per document.

    Map-style datasets are read in a seeded per-rank permutation (see [`ShardedSampler`]); streaming datasets are split
    by rank with `datasets.distributed.split_dataset_by_node` and restarted (`set_epoch`) when exhausted. Every document
    is checked as it is read (a streamed one cannot be checked before training): a missing `text` (None / NaN) and a
    document that is nothing but unknown tokens are refused with the row and the fix, as at construction; unknown
    tokens are warned once.

    Documents are read as the rows need them, each tokenized once per pass: a read tokenizes the documents that the
    requested rows still need at the mean document length so far (1 to `PRETRAIN_READ_LIMIT`), so the buffer holds at
    most the rows' tokens plus the rest of that read, and a long document is cut into windows in order, row by row
    (cost per row proportional to `max_length`). The checkpointed position is where the next token lies — the stream
    position before its document and the tokens of it already served (`offset`); a resume reads that document again
    (tokenization is deterministic) — so the state holds no tokens, but fewer than `max_length` when a VLM document with
    images was read after them, and those a checkpoint of an earlier version held.

    Args:
        dataset (`Dataset` or `IterableDataset`): with a `text` column.
        tokenizer: the policy's tokenizer (must have an EOS token).
        max_length (`int`): tokens per row.
        packing (`bool`): pack across documents (True) or chunk each document on its own (False).
        seed, rank, world_size: sharding, as in [`ShardedSampler`].
        objective (`int`): the `objective` index its rows carry (the trainer's pretraining objective by default; another
            language-modelling objective's own index).
        role (`str`): how errors name the dataset (`pretrain_dataset`, or the objective's name).
        images ([`~trl_trapo.vision.ImageRows`], *optional*): a VLM run's row builder. With it, a document with
            images (an `images` / `image` column; its `text` holds one image placeholder per image) is a row of its
            own, never packed with others (a cut inside its image tokens would part them from their image): its
            first `max_length` tokens, refused when its image tokens do not fit. Documents are then read one at a
            time, so no image row waits in the stream between steps (the checkpointed state stays token ids only).
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
        objective: int = PRETRAIN,
        role: str = "pretrain_dataset",
        images: ImageRows | None = None,
    ):
        self.dataset = dataset
        self.objective = objective
        self.role = role
        self.images = images
        columns = dataset_columns(dataset)
        self.image_column = image_column(columns, role) if images is not None else None
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.packing = packing
        self.streaming = isinstance(dataset, IterableDataset)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.buffer: list[int] = []  # tokens read; `start` is the next one to serve (no copy of the tail per row)
        self.start = 0
        self.documents: deque[StreamDocument] = deque()  # the documents of the buffer from the one holding `start` on
        self.pending: deque[list[int]] = deque()  # chunks a checkpoint of an earlier version held (chunked mode)
        self.skip = 0  # tokens of the next document read that the resumed position had served already
        self.read_documents = self.read_tokens = 0  # documents read and their tokens: the mean sizes a read
        self._warned_unknown = False
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

    def position(self) -> dict:
        """Where the stream reads its next document: `{"sampler": ...}` (map-style) or `{"epoch", "consumed"}`."""
        if self.streaming:
            return {"epoch": self.epoch, "consumed": self.consumed}
        return {"sampler": self.sampler.state_dict()}

    def _seek(self, position: dict) -> None:
        if self.streaming:
            self.epoch, self.consumed = int(position["epoch"]), int(position["consumed"])
            self._iterator = None
        else:
            self.sampler.load_state_dict(position["sampler"])

    def _next_examples(self, n: int) -> list[tuple[dict, int | str, str, Any]]:
        """The next `n` documents of this rank as `(position before it, row, text, images)` (`row`: its index, or its
        place in this rank's stream; `images`: the image column's value, None without one)."""
        column = self.image_column
        if not self.streaming:
            positions, indices = [], []
            for _ in range(n):
                positions.append({"sampler": self.sampler.state_dict()})
                indices.extend(self.sampler.take(1))
            batch = self.dataset[indices]
            images = batch[column] if column is not None else [None] * len(indices)
            return [
                (position, *self._checked(i, text), value)
                for position, i, text, value in zip(positions, indices, batch["text"], images)
            ]
        docs: list[tuple[dict, int | str, str, Any]] = []
        empty_epochs = 0
        while len(docs) < n:
            if self._iterator is None:
                self._shard.set_epoch(self.epoch)
                # this rank's examples read past, not `skip` (datasets 5.2 skips before an example-level
                # `split_dataset_by_node` takes every world_size-th example: another rank's documents on resume)
                self._iterator = itertools.islice(iter(self._shard), self.consumed, None)
            try:
                position = self.position()
                example = next(self._iterator)
                row = f"{self.consumed} of this process's stream" + (f" (pass {self.epoch})" if self.epoch else "")
                checked = self._checked(row, example["text"])
                docs.append((position, *checked, example.get(column) if column else None))
                self.consumed += 1
                empty_epochs = 0
            except StopIteration:
                if self.consumed == 0:
                    empty_epochs += 1
                    if empty_epochs > 1:
                        raise ValueError(f"`{self.role}` (streaming) yielded no rows on this rank.") from None
                self.epoch += 1
                self.consumed = 0
                self._iterator = None
        return docs

    def _checked(self, row: int | str, text: Any) -> tuple[int | str, str]:
        """`(row, text)`, unless the text is missing (streamed rows cannot be checked before training).

        Raises:
            ValueError: naming the row and the fix (see `missing_value_error`).
        """
        what = missing_part(text)
        if what is not None:
            raise missing_value_error(self.role, "text", row, what)
        return row, text

    def _read(self, need: int) -> tuple[Row | None, int]:
        """Drop the served tokens, then read documents for `need` more tokens: `(a VLM document's row, tokens added)`.

        One read tokenizes `need` tokens' worth of documents at the mean document length so far, 1 to
        `PRETRAIN_READ_LIMIT` (1 with images, see `_read_one`).

        Raises:
            ValueError: for a document that is nothing but unknown tokens (warned once for unknown tokens).
        """
        if self.start:  # amortised: each token is dropped once
            del self.buffer[: self.start]
            for document in self.documents:
                document.first -= self.start
                document.end -= self.start
            self.start = 0
        if self.image_column is not None:
            return self._read_one()
        if not self.read_documents:
            count = 1
        elif not self.read_tokens:
            count = PRETRAIN_READ_LIMIT
        else:
            count = min(max(need * self.read_documents // self.read_tokens, 1), PRETRAIN_READ_LIMIT)
        return None, self._add_documents([(p, row, text) for p, row, text, _ in self._next_examples(count)])

    def _add_documents(self, docs: list[tuple[dict, int | str, str]]) -> int:
        """Tokenize text documents (one tokenizer call) into the buffer; return the tokens added."""
        eos = self.tokenizer.eos_token_id
        unk = getattr(self.tokenizer, "unk_token_id", None)
        self.read_documents += len(docs)
        docs = [(position, row, text) for position, row, text in docs if text]
        if not docs:
            return 0
        added = 0
        texts = [text for _, _, text in docs]
        for (position, row, text), ids in zip(docs, self.tokenizer(texts, add_special_tokens=False)["input_ids"]):
            if unk is not None and unk in ids:
                if only_unknown_tokens(text, self.tokenizer):
                    raise unknown_row_error(self.role, "text", row, text, self.tokenizer)
                if not self._warned_unknown:
                    self._warned_unknown = True
                    logger.warning(
                        "`%s` row %s holds %d characters the tokenizer cannot represent; they become "
                        "%r (e.g. %r). Warned once per run.",
                        self.role,
                        row,
                        ids.count(unk),
                        self.tokenizer.unk_token,
                        text[:40],
                    )
            ids = ids + [eos]
            self.read_tokens += len(ids)
            served, self.skip = self.skip, 0
            self._check_resumed(row, len(ids), served)
            end = len(self.buffer) + len(ids) - served
            self.documents.append(StreamDocument(len(self.buffer) - served, end, position))
            self.buffer.extend(ids[served:])
            added += len(ids) - served
        return added

    def _check_resumed(self, row: int | str, length: int, served: int) -> None:
        """Raises ValueError when the document a resumed position lies in is shorter than the tokens it had served."""
        if served and served >= length:
            raise ValueError(
                f"The checkpoint's `{self.role}` position lies {served} tokens into row {row}, which has {length} "
                "tokens (with the EOS) now: it was written with another dataset or tokenizer. Resume with the same "
                f"`{self.role}` and tokenizer, or start the run afresh."
            )

    def _read_one(self) -> tuple[Row | None, int]:
        """Read one document: `(its row, tokens)` when it has images (a row of its own, see the class docstring; the
        tokens still waiting before it, fewer than a row, are then checkpointed as they are), else `(None, tokens
        added)` after adding it to the stream as `_read` does."""
        ((position, row, text, value),) = self._next_examples(1)
        images = self.images.images_of({"images": value}, "images", self.role, row)
        if not images:
            return None, self._add_documents([(position, row, text)])
        self._check_resumed(row, 0, self.skip)
        self.read_documents += 1
        self.documents.clear()  # re-reading their documents would serve this row again
        ids, inputs = self.images.document(text, images, self.role, row)
        ids = ids[: self.images.cut(ids, self.max_length, self.role, row)]
        mask = self.images.document_mask(ids)  # the image tokens are read, not predicted
        row = Row(self.objective, torch.tensor(ids, dtype=torch.long), mask, model_inputs=as_tensors(inputs))
        return row, len(ids)

    def _next_chunk(self) -> list[int] | None:
        """The next row's tokens from what was read (None: read more): `max_length` tokens packed, or the next chunk
        of the current document (a 1-token tail, nothing to predict, is dropped)."""
        if self.pending:
            return self.pending.popleft()
        while True:
            available = len(self.buffer) - self.start
            if available < (self.max_length if self.packing else 1):
                return None
            if self.packing:
                end = self.start + self.max_length
            elif self.documents and self.documents[0].first <= self.start:  # the rest of this document, at most
                end = min(self.start + self.max_length, self.documents[0].end)
            else:  # tokens before the first document read here
                end = min(
                    self.start + self.max_length, self.documents[0].first if self.documents else len(self.buffer)
                )
            chunk = self.buffer[self.start : end]
            self.start = end
            while self.documents and self.documents[0].end <= self.start:
                self.documents.popleft()
            if len(chunk) >= 2:
                return chunk

    def take(self, n: int) -> list[Row]:
        """The next `n` pretraining rows (`input_ids` (L,), every one of the L - 1 targets counted, but a VLM
        document's image tokens; its `model_inputs`)."""
        rows = []
        empty_reads = 0  # consecutive reads that added nothing
        while len(rows) < n:
            chunk = self._next_chunk()
            if chunk is None:
                need = (n - len(rows)) * self.max_length - (len(self.buffer) - self.start)
                image_row, added = self._read(need)
                if image_row is not None:
                    rows.append(image_row)
                empty_reads = 0 if added else empty_reads + 1
                if empty_reads > 1000:
                    raise ValueError(f"`{self.role}` produced no tokens: are all its 'text' values empty?")
                continue
            ids = torch.tensor(chunk, dtype=torch.long)
            rows.append(Row(self.objective, ids, torch.ones(len(chunk) - 1)))
        return rows

    def state_dict(self) -> dict:
        """The stream's position: `sampler` (or `epoch` / `consumed` streaming) before the document of the next token
        and `offset`, its tokens already served; `buffer`, tokens before that document still to serve (fewer than
        `max_length`, see the class docstring), and `pending`, chunks of an earlier version's checkpoint."""
        pending = [list(c) for c in self.pending]
        if self.documents and self.documents[0].first <= self.start:  # the next token lies in a document read here
            document = self.documents[0]
            return {**document.position, "offset": self.start - document.first, "buffer": [], "pending": pending}
        position = self.documents[0].position if self.documents else self.position()
        stop = self.documents[0].first if self.documents else len(self.buffer)
        offset = 0 if self.documents else self.skip
        return {**position, "offset": offset, "buffer": self.buffer[self.start : stop], "pending": pending}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`'s position (or an earlier version's: tokens in `buffer` / `pending`, no `offset`)."""
        self.buffer = [int(t) for t in state["buffer"]]
        self.start = 0
        self.documents.clear()
        self.pending = deque([int(t) for t in c] for c in state.get("pending", []))
        self.skip = int(state.get("offset", 0))
        self._seek(state)


PRETRAIN_SAMPLE_CHARACTERS = 100_000  # characters of pretraining text tokenized to estimate a pass's rows


def pretrain_pass_rows(dataset: Dataset, tokenizer, max_length: int, packing: bool = True) -> tuple[float, int, bool]:
    """The rows one pass over a map-style pretraining dataset makes, as [`PretrainStream`] cuts them: windows of
    `max_length` tokens over its documents (each with its EOS) packed, or each document's chunks of `max_length`.

    Cheap at any document length: the documents' characters are counted in Arrow, and tokens per character come from
    tokenizing the documents' first `PRETRAIN_SAMPLE_CHARACTERS` characters in all; exact when that covers them all.

    Args:
        dataset (`Dataset`): documents in a `text` column.
        tokenizer: the policy's tokenizer.
        max_length (`int`): tokens per row (`pretrain_max_length`).
        packing (`bool`): packed windows (True) or chunks per document (False).

    Returns:
        `(rows, tokens, exact)`: rows of one pass (a float: the last window of a pass runs into the next), its tokens
        with the EOS of each document, and whether they were counted rather than estimated.
    """
    import pyarrow.compute as pc

    lengths = pc.utf8_length(
        dataset.with_format("arrow")["text"]
    ).to_pylist()  # None: a missing text (refused earlier)
    sample, budget = [], PRETRAIN_SAMPLE_CHARACTERS
    for start in range(0, len(dataset), PRETRAIN_READ_LIMIT):
        if budget <= 0:
            break
        for text in dataset[start : start + PRETRAIN_READ_LIMIT]["text"]:
            if text and budget > 0:
                sample.append(text[:budget])
                budget -= len(sample[-1])
    counted = [len(ids) for ids in tokenizer(sample, add_special_tokens=False)["input_ids"]] if sample else []
    characters = [n for n in lengths if n]
    exact = sum(len(t) for t in sample) == sum(characters)  # the sample is every document, whole
    per_character = sum(counted) / max(sum(len(t) for t in sample), 1)
    documents = counted if exact else [round(n * per_character) for n in characters]
    tokens = sum(documents) + len(documents)  # and the EOS of each
    if packing:
        return tokens / max_length, tokens, exact
    chunks = sum(n // max_length + (n % max_length >= 2) for n in (d + 1 for d in documents))  # 1-token tails dropped
    return float(chunks), tokens, exact


def sft_row(
    input_ids: list[int],
    completion_mask: list[int],
    pool_index: int = -1,
    importance_weight: float = 1.0,
    model_inputs: dict | None = None,
) -> Row:
    """An SFT row from tokenised lists: the target-aligned mask counts completion tokens (and the EOS); its stored
    `model_inputs` (a VLM row's `pixel_values` ..., see [`~trl_trapo.vision.as_tensors`]) ride with it."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)  # rows of a torch-formatted dataset hold tensors already
    mask = torch.as_tensor(completion_mask[1:], dtype=torch.float32)
    return Row(
        SFT,
        ids,
        mask,
        pool_index=pool_index,
        importance_weight=importance_weight,
        model_inputs=as_tensors(model_inputs),
    )


@dataclass
class PreparedData:
    """The datasets of one run after checks and tokenisation (None: that objective has no data or weight 0)."""

    rl: Dataset | None  # RL prompts with a `prompt_ids` column (and a text `prompt`)
    sft: Dataset | None  # tokenized SFT rows: `input_ids`, `completion_mask`
    pretrain: Dataset | IterableDataset | None  # raw `text` documents (tokenized as they are streamed)
    distill: Dataset | None = None  # reward-free distillation prompts with a `prompt_ids` column

    @property
    def empty(self) -> bool:
        """No objective has data."""
        return all(getattr(self, field.name) is None for field in fields(self))

    @property
    def prompt_sets(self) -> list[Dataset]:
        """The tokenized prompts the policy samples completions of (`prompt_ids`): the RL and distillation prompts."""
        return [d for d in (self.rl, self.distill) if d is not None]


def eval_datasets(eval_dataset) -> list[tuple[str, Any]]:
    """`(label, dataset)` pairs of an `eval_dataset` argument: `("eval_dataset", d)` for one dataset,
    `("eval_dataset['name']", d)` for each entry of a dict (None entries skipped)."""
    if isinstance(eval_dataset, dict):
        return [(f"eval_dataset[{name!r}]", d) for name, d in eval_dataset.items() if d is not None]
    return [] if eval_dataset is None else [("eval_dataset", eval_dataset)]


def named_datasets(datasets: dict[str, Any]) -> list[tuple[str, Any]]:
    """`(argument name, dataset)` pairs of the datasets whose rows a chat template renders: the trainer's
    `train_dataset`, `sft_dataset`, `distillation_dataset` (those given) and each evaluation set
    ([`eval_datasets`]); `datasets` maps the trainer's argument names to its dataset arguments."""
    rendered = ("train_dataset", "sft_dataset", "distillation_dataset")
    pairs = [(name, datasets[name]) for name in rendered if datasets.get(name) is not None]
    return pairs + eval_datasets(datasets.get("eval_dataset"))


def dataset_to_evaluate(
    eval_dataset,
    own,
    tokenizer=None,
    assistant_only_loss: bool = False,
    call: str = "evaluate(eval_dataset",
    processing_class=None,
    template_kwargs: dict | None = None,
):
    """What `evaluate(eval_dataset)` evaluates: `eval_dataset` (a transform applied and checked as at construction,
    [`apply_transforms`], [`check_eval_dataset`], and, with `processing_class` (the run's tokenizer or processor, with
    the config's `template_kwargs`), against it as construction checks it, [`check_readable_by`]: no chat template for
    its conversations is said as such; for `evaluate`, two formats in its columns are warned about,
    [`warn_mixed_formats`]), the trainer's own eval set(s) `own` (checked at construction) when it is None, or, for a
    string, the entry of that name of the trainer's eval dict, as transformers' `Trainer.evaluate` /
    `get_eval_dataloader` take it. `call` is how the messages write the call and its argument
    (`generate_completions(dataset` for that method).

    Raises:
        ValueError: with neither; for a string, when `own` is not a dict or has no such key (naming the keys).
    """
    if isinstance(eval_dataset, str):  # transformers: `self.eval_dataset[eval_dataset]`, a bare KeyError if absent
        if not isinstance(own, dict):
            raise ValueError(
                f"{call}={eval_dataset!r}): a name selects one of the trainer's eval datasets when its "
                f"`eval_dataset` is a dict, and this trainer's is {type(own).__name__}. Pass the dataset itself, "
                f"`{call}=dataset)`, or give the trainer `eval_dataset={{name: dataset, ...}}`."
            )
        if eval_dataset not in own:
            raise ValueError(
                f"{call}={eval_dataset!r}): the trainer's `eval_dataset` has no such key; its keys are "
                f"{list(own)}. Pass one of them, or the dataset itself."
            )
        return own[eval_dataset]
    if eval_dataset is None:
        if own is None:
            raise ValueError("No `eval_dataset`: pass one to the trainer or to `evaluate()`.")
        return own
    role = call.rsplit("(", 1)[-1]  # `eval_dataset`, or `generate_completions`' `dataset`
    eval_dataset = apply_transforms({role: eval_dataset})[role]  # a transform applied, as at construction
    check_eval_dataset(eval_dataset, tokenizer, assistant_only_loss=assistant_only_loss)
    if processing_class is not None:
        for label, dataset in eval_datasets(eval_dataset):
            check_readable_by(dataset, label, processing_class, template_kwargs)
    if call.startswith("evaluate("):  # generate_completions reads the prompts whatever else the rows hold
        warn_mixed_formats(eval_datasets(eval_dataset))
    return eval_dataset


def check_eval_dataset(eval_dataset, tokenizer=None, cells: bool = True, assistant_only_loss: bool = False) -> None:
    """Raise `ValueError` before training if an eval dataset is not a map-style `Dataset` (evaluation reads every row
    by index: a streaming one would fail at the first evaluation), has no column TRAPO can evaluate (`prompt` /
    `input_ids`: greedy rewards; `text`: pretraining loss; `completion` / `messages`: SFT loss), or a cell evaluation
    reads that it cannot (`check_cells`, and the tool calls of SFT-loss rows; skipped with `cells=False`, for sets
    `check_datasets` has checked; `assistant_only_loss`: the config's, which evaluation applies to `messages` rows),
    or has no rows; with `tokenizer`, also count characters it cannot represent (`check_rows`)."""
    if eval_dataset is not None and (
        not isinstance(eval_dataset, (Dataset, IterableDataset, dict)) or is_column_dict(eval_dataset)
    ):
        check_dataset_object(eval_dataset, "eval_dataset")  # a dict (a `DatasetDict` too) is several eval sets
    for label, dataset in eval_datasets(eval_dataset):
        check_dataset_object(dataset, label)
        _check_not_empty(dataset, label)  # 0 rows would score 0.0 (`evaluate`), or fail inside `datasets`
        columns = set(dataset_columns(dataset))
        if not columns & {"prompt", "input_ids", "text", "completion", "messages"}:
            raise ValueError(
                f"`{label}` has columns {sorted(columns)}, none of which TRAPO can evaluate: give 'prompt' "
                "(greedy rewards), 'text' (pretraining loss) or 'prompt'+'completion' / 'messages' (SFT loss)."
                + community_format_hint(dataset, label, "sft")
            )
        if cells:
            # evaluation masks `messages` rows to their assistant turns under assistant_only_loss (as training)
            check_cells(dataset, label, assistant_only_loss=assistant_only_loss and "messages" in columns)
            if columns & {"completion", "messages"}:  # SFT loss rows: their tool calls
                check_tool_call_traces(dataset, label)
            if isinstance(dataset, Dataset):
                check_row_cells(dataset, label)
        if tokenizer is not None:
            check_rows(dataset, label, tokenizer, cells=False)


def check_map_style(dataset: Any, role: str) -> None:
    """`dataset` (the argument `role`) is one map-style split whose cells `check_row_cells` can read.

    Raises:
        ValueError: for a streaming dataset (its rows are drawn by index and checked before training), or from the
            checks, naming the argument.
    """
    if isinstance(dataset, IterableDataset):
        raise ValueError(
            f"`{role}` is an IterableDataset (streaming), but its rows are drawn by index and checked before "
            "training: pass a map-style `Dataset` (e.g. `Dataset.from_list(list(iterable.take(n)))`). Streaming "
            "is supported for `pretrain_dataset`."
        )
    check_dataset_object(dataset, role)
    check_row_cells(dataset, role)


def check_rl_prompts(dataset: Any, args, environment_prompts: bool = False) -> None:
    """The RL objective's `train_dataset` before any model loads: a map-style prompt dataset whose cells can be read,
    with text in some row unless `environment_prompts` (an `environment_factory`'s `reset` writes each prompt: TRL's
    dataset of empty user messages is the usual one).

    Raises:
        ValueError: naming the column, the row and the fix.
    """
    check_map_style(dataset, "train_dataset")
    check_prompt_dataset(dataset)
    check_cells(dataset, "train_dataset", "prompts", allow_empty=environment_prompts)


def check_sft_rows(dataset: Any, args) -> None:
    """The SFT objective's `sft_dataset` before any model loads: map-style demonstrations whose cells can be read
    (`messages` rows train their assistant turns under the config's `assistant_only_loss`) and whose tool calls are
    consistent; roles no chat template knows, and `messages` beside `prompt`/`completion` (the latter trained), are
    warned about.

    Raises:
        ValueError: naming the column, the row and the fix.
    """
    check_map_style(dataset, "sft_dataset")
    check_sft_dataset(dataset)
    check_tool_call_traces(dataset, "sft_dataset")
    warn_unknown_roles(dataset, "sft_dataset")
    warn_mixed_formats([("sft_dataset", dataset)], "sft")
    check_cells(dataset, "sft_dataset", "sft", assistant_only_loss=getattr(args, "assistant_only_loss", False))


def check_distillation_prompts(dataset: Any, args) -> None:
    """The distillation objective's `distillation_dataset` before any model loads: map-style reward-free prompts
    whose cells can be read.

    Raises:
        ValueError: naming the column, the row and the fix.
    """
    check_map_style(dataset, "distillation_dataset")
    check_distillation_dataset(dataset)
    check_cells(dataset, "distillation_dataset", "prompts")


def check_pretrain_text(dataset: Any, args) -> None:
    """The pretraining objective's `pretrain_dataset` before any model loads: a `text` dataset (it may stream; the
    cells of a map-style one are read now, streamed documents as they are read by `PretrainStream`).

    Raises:
        ValueError: naming the column, the row and the fix.
    """
    check_dataset_object(dataset, "pretrain_dataset", streaming_ok=True)
    check_pretrain_dataset(dataset)
    if isinstance(dataset, Dataset):  # streaming documents are checked as they are read (PretrainStream)
        check_cells(dataset, "pretrain_dataset", "pretrain")


def check_datasets(
    args, datasets: Mapping[str, Dataset | IterableDataset | None], eval_dataset, objectives: Sequence[Any]
) -> None:
    """The checks of a run's datasets that need neither tokenizer nor model, so that the trainer makes them before it
    loads any (a column error after a model load took 51 s on a loaded machine): each objective with a weight > 0
    checks its dataset (its class's `check_data`: one map-style split, pretraining may stream, with the columns it
    reads, every cell of which can be read), then the eval sets (one whose columns hold two formats is warned about,
    [`warn_mixed_formats`]). [`prepare_datasets`] then tokenizes them, with the checks that need the tokenizer or the
    model.

    Args:
        args ([`TRAPOConfig`]): the objectives' weights (each class's `WEIGHT_FIELD`).
        datasets (`Mapping[str, Dataset | IterableDataset | None]`): each objective's dataset as the user gave it,
            keyed by the objective's `NAME` (a missing key: no data).
        eval_dataset: as given to the trainer.
        objectives (`Sequence[type[Objective]]`): the objective classes with data
            ([`~trl_trapo.objectives.WITH_DATA`]).

    Raises:
        ValueError: naming the argument, the column, the row and the fix.
    """
    for cls in objectives:
        dataset = datasets.get(cls.NAME)
        if dataset is not None and getattr(args, cls.WEIGHT_FIELD) > 0:
            cls.check_data(dataset, args)
    check_eval_dataset(eval_dataset, assistant_only_loss=getattr(args, "assistant_only_loss", False))
    warn_mixed_formats(eval_datasets(eval_dataset))


def check_distillation_dataset(dataset: Dataset) -> None:
    """Raise a ValueError unless `dataset` is a non-empty prompt-only dataset without demonstrations."""
    columns = dataset_columns(dataset)
    if not {"prompt", "input_ids"} & set(columns):
        raise ValueError(
            f"`distillation_dataset` needs a `prompt` column (text or conversational messages) or tokenized "
            f"`input_ids`; it has {columns}. Prompt-completion or `messages` rows are SFT data: pass them as "
            "`sft_dataset`."
        )
    demos = [c for c in ("completion", "messages") if c in columns]
    if demos:
        raise ValueError(
            f"`distillation_dataset` has a {demos[0]!r} column, but on-policy distillation trains on the "
            "student's own samples of the prompts and would ignore it: pass demonstrations as `sft_dataset` "
            f"(the SFT objective), and here the prompts only (`dataset.remove_columns({demos!r})`)."
        )
    if len(dataset) == 0:
        raise ValueError("`distillation_dataset` is empty: pass at least one prompt, or drop the argument.")


def context_overflow_message(label: str, longest: int, args, max_positions: int) -> str:
    """The error for prompts of `label` whose longest (`longest` tokens) and `response_length` new tokens do not fit
    the model's context of `max_positions` positions, with the fixes that can work: a shorter `response_length` (when
    the prompt leaves room for at least one token) and removing the prompts longer than what a full `response_length`
    leaves (when it leaves room for at least one prompt token); when neither alone can, both.

    Returns:
        `str`: naming `label`, the longest prompt, `response_length`, the context and the fix (never a length < 1).
    """
    room = max_positions - args.response_length  # the longest prompt that fits with a full response_length
    lower = f"lower response_length to at most {max_positions - longest}"
    remove = f"remove prompts longer than {room} tokens"
    let_through = (
        f"max_prompt_length={args.max_prompt_length} lets them through; lower it to find them at construction"
    )
    if longest < max_positions and room >= 1:
        fix = f"{lower}, or {remove}"
    elif longest < max_positions:
        fix = f"response_length alone leaves no room for a prompt: {lower}"
    elif room >= 1:
        fix = f"that prompt alone fills the context, so no response_length can help: {remove} ({let_through})"
    else:
        half = max_positions // 2
        fix = (
            f"that prompt alone fills the context, and response_length alone leaves no room for a prompt: lower "
            f"response_length below {max_positions} and remove the prompts longer than what it leaves (e.g. "
            f"response_length={half} and prompts of at most {max_positions - half} tokens; {let_through})"
        )
    return (
        f"`{label}` has a prompt of {longest} tokens; with response_length={args.response_length} new tokens it "
        f"exceeds the model's context of {max_positions} positions: {fix}."
    )


def check_templates_render(
    named: Sequence[tuple[str, Any]],
    processing_class,
    template_kwargs: dict | None = None,
) -> None:
    """Render with the chat template, before any model is built or copied, one row of each distinct sequence of
    roles (and tool calls, tools, per-row `chat_template_kwargs`) of each conversational dataset, as it will be
    tokenized (prompts with the generation prompt; prompt-completion SFT rows whole and their prompt; `messages`
    rows whole): a template that refuses a
    conversation (Jinja's `raise_exception`, e.g. Llama's and Mistral's "roles must alternate") depends on its roles,
    not its text, so one row of each kind finds it. TRL's trainers would fail on such a row from inside
    `datasets.map`, naming neither dataset nor row. A processor's rows (a VLM run) and streaming datasets are not
    checked here (they are tokenized by the processor, as they are read).

    Args:
        named (`Sequence[tuple[str, Dataset | None]]`): `(how errors name it, dataset)` pairs.
        processing_class: the policy's tokenizer.
        template_kwargs (`dict`, *optional*): `chat_template_kwargs`.

    Raises:
        ValueError: naming the dataset, the row, the template's message and the fix ([`template_errors_named`]).
    """
    from transformers import PreTrainedTokenizerBase

    if not isinstance(processing_class, PreTrainedTokenizerBase):
        return
    if not (processing_class.chat_template or (template_kwargs or {}).get("chat_template")):
        return  # no template: `check_conversations_renderable` says so
    for role, dataset in named:
        if not isinstance(dataset, Dataset) or any(c in dataset_columns(dataset) for c in IMAGE_COLUMNS):
            continue
        columns = dataset_columns(dataset)
        column = "messages" if "messages" in columns and "completion" not in columns else "prompt"
        if column not in columns or "content: list" in str(dataset.with_format("arrow")[column].type):
            continue  # no conversations, or content parts (`check_content_parts_rendered` renders those)
        seen = set()
        for row, value in enumerate(dataset[column]):
            if not is_messages(value):
                continue
            example = dataset[row]
            key = (
                tuple((m.get("role"), bool(m.get("tool_calls"))) for m in value),
                repr(example.get("chat_template_kwargs")),
                example.get("tools") is not None,
            )
            if key in seen:
                continue
            seen.add(key)
            kwargs = dict(template_kwargs or {})
            if example.get("tools") is not None:
                kwargs["tools"] = example["tools"]
            kwargs = row_template_kwargs(example, kwargs)
            completion = example.get("completion")
            conversations = [(value, column != "messages")]  # (messages, add_generation_prompt)
            if is_messages(completion):  # a prompt-completion row: also whole
                conversations.append((list(value) + list(completion), False))
            with template_errors_named(role, row):
                for messages, opens in conversations:
                    render_ids(messages, processing_class, kwargs, add_generation_prompt=opens)


def check_eval_prompts(
    args, tokenizer, eval_dataset, max_positions: int | None, images=None, vocab_size: int | None = None
) -> None:
    """Tokenize the prompts of every prompt-only eval dataset once, before training, so that a prompt longer than
    `max_prompt_length` (or than the context, with `response_length` new tokens), or one of token ids outside the
    policy's `vocab_size`, fails now, not at the first evaluation after hours of training.

    Raises:
        ValueError: naming the dataset, the longest prompt and the fix.
    """
    for label, dataset in eval_datasets(eval_dataset):
        columns = set(dataset_columns(dataset))
        if not columns & {"prompt", "input_ids"} or columns & {"text", "completion", "messages"}:
            continue  # evaluated by loss, not by generation
        tokenized = tokenize_prompt_dataset(
            dataset,
            tokenizer,
            args.max_prompt_length,
            args.chat_template_kwargs or {},
            name=label,
            images=images,
            vocab_size=vocab_size,
            context=None if max_positions is None else (max_positions, args.response_length),
        )
        longest = max((len(ids) for ids in tokenized["prompt_ids"]), default=0)
        if max_positions is not None and longest + args.response_length > max_positions:
            raise ValueError(context_overflow_message(label, longest, args, max_positions))


@contextlib.contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """Within the block, `datasets`' progress bars (`map`'s "Tokenizing ..." bars) are off when `enabled` is False;
    when it is True the process-wide setting is left as the caller has it (`datasets.disable_progress_bars()` or
    `HF_DATASETS_DISABLE_PROGRESS_BARS` still win). The setting is restored on exit, also after an error. The trainer
    wraps its dataset preparation in it with `enabled = not args.disable_tqdm`."""
    before = datasets.is_progress_bar_enabled()
    if not enabled:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        (datasets.enable_progress_bars if before else datasets.disable_progress_bars)()


@dataclass(frozen=True)
class DataSetup:
    """What an objective's data preparation reads besides its dataset: the run's config, tokenizer and model facts.

    Attributes:
        args ([`TRAPOConfig`]): lengths, weights and chat-template arguments.
        tokenizer: the policy's tokenizer.
        max_positions (`int`, *optional*): the model's context (`max_position_embeddings`).
        has_rewards (`bool`): whether any reward function or model was given.
        has_critic (`bool`): whether a value model was given.
        stop_token_ids (`list[int]`, *optional*): the ids that end a completion (for demonstrations).
        has_teacher (`bool`): whether a distillation teacher was given (`distillation_dataset` needs one).
        images ([`~trl_trapo.vision.ImageRows`], *optional*): a VLM run's row builder; without it (a tokenizer), a
            dataset with an `images` / `image` column is refused.
        user_source (`bool`): the RL rounds come from a source of the user's (`rollout_source`, `rollout_func`), not
            the default one: its completions are not `response_length` long (they are checked against the context as
            each round arrives, `sources.check_round`), so RL prompts need not leave `response_length` positions.
        vocab_size (`int`, *optional*): the policy's embedding rows: tokenized prompts (`input_ids`) must hold ids in
            [0, vocab_size) (`check_token_ids`).
    """

    args: Any
    tokenizer: Any
    max_positions: int | None
    has_rewards: bool
    has_critic: bool
    stop_token_ids: list[int] | None = None
    has_teacher: bool = False
    images: ImageRows | None = None
    user_source: bool = False
    vocab_size: int | None = None

    @property
    def config_name(self) -> str:
        """The config's class name, for error messages (`TRAPOConfig`, `PPOConfig`, ...)."""
        return type(self.args).__name__

    @property
    def template_kwargs(self) -> dict:
        """The config's `chat_template_kwargs` ({} when unset)."""
        return self.args.chat_template_kwargs or {}


def prepare_rl_prompts(dataset: Dataset, setup: DataSetup) -> Dataset:
    """The RL objective's prompts (`train_dataset`, its weight > 0) checked and tokenized: a `prompt_ids` column (and
    the demonstrations of `demonstration_column`).

    Raises:
        ValueError: RL prompts without a reward; prompts beyond `max_prompt_length` or (with `response_length` new
            tokens, for the default source and tools) the context; demonstrations with a value model; group-relative
            advantages with fewer than 2 completions per prompt.
    """
    args, tokenizer = setup.args, setup.tokenizer
    check_rows(dataset, "train_dataset", tokenizer, "prompts", cells=False)
    if not setup.has_rewards:
        misplaced = misplaced_rows_hint(dataset_columns(dataset))
        if misplaced:  # SFT data in the RL slot: rl_weight=0 would drop the only data there is
            raise ValueError(
                f"{misplaced} Without a `train_dataset` RL is off; RL prompts need a reward to score their "
                "completions (`reward_funcs` and/or `reward_model`)."
            )
        raise ValueError(
            "`train_dataset` (RL prompts) was given without any reward: pass `reward_funcs` and/or "
            "`reward_model`, or set rl_weight=0 to train without RL."
        )
    # `response_length` bounds the default source's (and the tools') completions, not those of a user's source
    max_positions = setup.max_positions
    context = None if max_positions is None or setup.user_source else (max_positions, args.response_length)
    rl = tokenize_prompt_dataset(
        dataset,
        tokenizer,
        args.max_prompt_length,
        setup.template_kwargs,
        images=setup.images,
        vocab_size=setup.vocab_size,
        context=context,
    )
    if args.demonstration_column is not None:
        rl = tokenize_demonstrations(
            rl,
            args.demonstration_column,
            tokenizer,
            setup.stop_token_ids,
            args.response_length,
            setup.template_kwargs,
        )
    longest = max(len(ids) for ids in rl["prompt_ids"])
    if context is not None and longest + args.response_length > max_positions:
        raise ValueError(context_overflow_message("train_dataset", longest, args, max_positions))
    if args.demonstration_column is not None and setup.has_critic:
        raise ValueError(
            f"{setup.config_name}.demonstration_column={args.demonstration_column!r} needs group-relative advantages "
            "(a demonstration joins a group of completions of its prompt), but a value_model was given: drop the "
            "value_model or set demonstration_column=None."
        )
    if not setup.has_critic and args.num_generations < 2:
        raise ValueError(
            f"{setup.config_name}.num_generations={args.num_generations}: without a value_model, advantages are "
            "group-relative and need at least 2 completions per prompt. Set num_generations >= 2 or pass a "
            "value_model."
        )
    return rl


def prepare_sft_rows(dataset: Dataset, setup: DataSetup) -> Dataset:
    """The SFT objective's demonstrations (`sft_dataset`, its weight > 0) checked and tokenized: `input_ids` and
    `completion_mask` columns.

    Raises:
        ValueError: rows beyond the model's context after `sft_max_length`, or from the tokenisation's checks.
    """
    args, tokenizer = setup.args, setup.tokenizer
    check_rows(dataset, "sft_dataset", tokenizer, "sft", cells=False)
    assistant_only_loss = getattr(args, "assistant_only_loss", False)
    if not assistant_only_loss:
        warn_trained_tool_results(dataset, "sft_dataset", setup.config_name)
        check_tool_rendering(dataset, tokenizer, "sft_dataset")
    sft = tokenize_sft_dataset(
        dataset,
        tokenizer,
        args.sft_max_length,
        setup.template_kwargs,
        assistant_only_loss=assistant_only_loss,
        images=setup.images,
    )
    if assistant_only_loss:  # the data and template passed `check_assistant_only_loss`
        warn_stop_token_untrained(tokenizer, setup.template_kwargs)
    longest = max((len(ids) for ids in sft["input_ids"]), default=0)
    if setup.max_positions is not None and longest > setup.max_positions:
        raise ValueError(
            f"{setup.config_name}.sft_max_length={args.sft_max_length} lets SFT rows of {longest} tokens through, "
            f"beyond the model's context of {setup.max_positions} positions: set sft_max_length <= "
            f"{setup.max_positions}."
        )
    return sft


def prepare_pretrain_text(dataset: Dataset | IterableDataset, setup: DataSetup) -> Dataset | IterableDataset:
    """The pretraining objective's documents (`pretrain_dataset`, its weight > 0), checked and returned as they are
    (they are tokenized as they are streamed, `PretrainStream`): the first `PRETRAIN_SCAN_ROWS` rows of a map-style
    dataset are read now.

    Raises:
        ValueError: `pretrain_max_length` beyond the model's context, or a row (or its images) that cannot work.
    """
    args = setup.args
    if setup.max_positions is not None and args.pretrain_max_length > setup.max_positions:
        raise ValueError(
            f"{setup.config_name}.pretrain_max_length={args.pretrain_max_length} exceeds the model's context of "
            f"{setup.max_positions} positions: set pretrain_max_length <= {setup.max_positions}."
        )
    if isinstance(dataset, Dataset):  # streaming documents are checked as they are read (PretrainStream)
        check_rows(dataset, "pretrain_dataset", setup.tokenizer, "pretrain", limit=PRETRAIN_SCAN_ROWS, cells=False)
        images = setup.images
        column = image_column(dataset_columns(dataset), "pretrain_dataset") if images else None
        if column is not None:  # images, placeholders and lengths, as far as the text check reads
            for index in range(min(len(dataset), PRETRAIN_SCAN_ROWS)):
                images.check_document(dataset[index], column, "pretrain_dataset", index, args.pretrain_max_length)
    return dataset


def prepare_distillation_prompts(dataset: Dataset, setup: DataSetup, weight: float) -> Dataset | None:
    """The distillation objective's reward-free prompts (`distillation_dataset`) checked and tokenized (a
    `prompt_ids` column), or None when its `weight` is 0.

    Raises:
        ValueError: prompts without a teacher (whatever the weight), or prompts beyond `max_prompt_length` or (with
            `response_length` new tokens) the context.
    """
    args = setup.args
    if not setup.has_teacher:
        raise ValueError(
            "`distillation_dataset` (reward-free prompts for on-policy distillation) was given without a teacher: "
            "pass `teacher_model` (or set teacher_model_name_or_path), or drop distillation_dataset."
        )
    if not weight > 0:
        return None
    check_rows(dataset, "distillation_dataset", setup.tokenizer, "prompts", cells=False)
    distill = tokenize_prompt_dataset(
        dataset,
        setup.tokenizer,
        args.max_prompt_length,
        setup.template_kwargs,
        name="distillation_dataset",
        images=setup.images,
        vocab_size=setup.vocab_size,
        context=None if setup.max_positions is None else (setup.max_positions, args.response_length),
    )
    longest = max(len(ids) for ids in distill["prompt_ids"])
    if setup.max_positions is not None and longest + args.response_length > setup.max_positions:
        raise ValueError(context_overflow_message("distillation_dataset", longest, args, setup.max_positions))
    return distill


def check_readable_by(dataset: Any, role: str, processing_class, template_kwargs: dict | None = None) -> None:
    """The checks of a dataset against the run's processing class that every dataset passes, at construction
    ([`prepare_datasets`]) and when one is given later (`evaluate(dataset)`, `generate_completions(dataset=...)`:
    trial 15's N45, where conversations without a chat template got "row 0 could not be rendered ... fix the row"
    there): no image column without a processor ([`~trl_trapo.vision.check_no_images`]), no conversations without
    a chat template and content parts the template can render ([`check_conversations_renderable`]).

    Args:
        dataset: a `Dataset` or streaming dataset (None and dicts of datasets are skipped: pass each entry).
        role (`str`): how errors name it (e.g. "eval_dataset['gsm8k']").
        processing_class: the policy's tokenizer, or a VLM run's processor.
        template_kwargs (`dict`, *optional*): the config's `chat_template_kwargs`.

    Raises:
        ValueError: naming the dataset, the column and the fixes.
    """
    if dataset is None or isinstance(dataset, dict):
        return
    check_no_images(dataset_columns(dataset) or [], role, processing_class)
    if isinstance(dataset, Dataset):
        check_conversations_renderable(dataset, role, processing_class, template_kwargs)


def prepare_datasets(
    setup: DataSetup,
    datasets: Mapping[str, Dataset | IterableDataset | None],
    eval_dataset,
    objectives: Sequence[Any],
) -> PreparedData:
    """Check and tokenise the datasets of a run, before anything is trained: the checks that need the tokenizer or
    the model (`check_datasets` has made the others, and must have passed). Each objective prepares its own data
    (its class's `prepare_data`); what is checked here is what every dataset shares (images, chat templates) and the
    eval sets.

    Args:
        setup ([`DataSetup`]): the config, tokenizer and model facts the preparation reads.
        datasets (`Mapping[str, Dataset | IterableDataset | None]`): each objective's dataset as the user gave it,
            keyed by the objective's `NAME` (a missing key: no data).
        eval_dataset: as given to the trainer.
        objectives (`Sequence[type[Objective]]`): the objective classes with data
            ([`~trl_trapo.objectives.WITH_DATA`]): each has `NAME`, `DATA_FIELD` (its field of [`PreparedData`]),
            `ARGUMENT` (the trainer's argument, for messages) and `prepare_data(dataset, setup)`.

    Returns:
        [`PreparedData`], each objective's prepared dataset under its `DATA_FIELD` (None: no data, or weight 0).

    Raises:
        ValueError: naming the argument and the fix, for a dataset that cannot work (the objectives' own checks, see
            their `prepare_data`; images without a processor, conversations without a chat template), a key of
            `datasets` no objective has, or no objective with data.
    """
    unknown = sorted(set(datasets) - {cls.NAME for cls in objectives})
    if unknown:
        raise ValueError(
            f"prepare_datasets: no objective is named {unknown}; the objectives are "
            f"{[cls.NAME for cls in objectives]}."
        )
    processing_class = setup.images.processor if setup.images is not None else setup.tokenizer
    given = [(cls.ARGUMENT, datasets.get(cls.NAME)) for cls in objectives]
    for role, dataset in [*given, *eval_datasets(eval_dataset)]:
        check_readable_by(dataset, role, processing_class, setup.template_kwargs)
    prepared = {cls.DATA_FIELD: cls.prepare_data(datasets.get(cls.NAME), setup) for cls in objectives}
    check_eval_dataset(eval_dataset, setup.tokenizer, cells=False)
    check_eval_prompts(setup.args, setup.tokenizer, eval_dataset, setup.max_positions, setup.images, setup.vocab_size)
    data = PreparedData(**prepared)
    if data.empty:
        arguments = [f"`{cls.ARGUMENT}`{cls.ARGUMENT_NOTE}" for cls in objectives]
        raise ValueError(
            f"No objective has data: pass at least one of {', '.join(arguments[:-1])} or {arguments[-1]}, with a "
            f"weight > 0 ({' / '.join(cls.WEIGHT_FIELD for cls in objectives)})."
        )
    return data


def check_tokenizer(tokenizer) -> None:
    """Raise before training if the policy's tokenizer lacks an EOS or pad token, or has a chat template that does
    not compile; warn when pad equals EOS.

    Raises:
        ValueError: naming the fix, when `eos_token_id` or `pad_token_id` is None, or when rendering one user message
            with the chat template raises a Jinja syntax error (with its line): the template is compiled at its first
            use, which would otherwise be the first conversational row, deep in dataset preparation.
    """
    if getattr(tokenizer, "chat_template", None):
        import jinja2

        try:
            tokenizer.apply_chat_template([{"role": "user", "content": "probe"}], tokenize=False)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(
                f"The chat template of `processing_class` does not compile (line {error.lineno}: {error.message}). "
                "Fix the template, or set a working one before building the trainer (`tokenizer.chat_template = "
                "...`, e.g. the template of the model's original tokenizer)."
            ) from None
        except Exception:  # noqa: BLE001 - the template's own checks of one user message (raise_exception) are its
            pass  # business: only a template that cannot compile is refused here
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
