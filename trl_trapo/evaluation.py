# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Held-out metrics computed directly (the `evaluate` library's metrics live on the Hub and do not load offline).

- language-modelling loss of a `text` dataset (documents chunked on their own, EOS appended): the pretraining-corpus
  loss whose rise measures forgetting;
- SFT loss of a prompt-completion / `messages` dataset (completion tokens only);
- greedy-decoding rewards of a prompt-only dataset are computed by `TRAPOTrainer.evaluate` with its reward functions
  (for an exact-match reward, the mean reward is the exact-match accuracy).

All losses are natural-log NLL per counted token (nats/token).
"""

from __future__ import annotations

import torch
from torch import nn
from trl.trainer.utils import selective_log_softmax

from .collator import collate_rows
from .data import PRETRAIN, sft_row


def document_rows(texts: list[str], tokenizer, max_length: int) -> list[dict[str, torch.Tensor]]:
    """Each document (+ EOS) cut into rows of at most `max_length` tokens; every target counts.

    Returns:
        `list[dict]`: rows with `input_ids` `(L,)` and `mask` `(L - 1,)`.
    """
    rows = []
    eos = tokenizer.eos_token_id
    for ids in tokenizer([t for t in texts if t], add_special_tokens=False)["input_ids"]:
        ids = ids + [eos]
        for start in range(0, len(ids), max_length):
            chunk = ids[start : start + max_length]
            if len(chunk) >= 2:
                rows.append(
                    {"objective": PRETRAIN, "input_ids": torch.tensor(chunk), "mask": torch.ones(len(chunk) - 1)}
                )
    return rows


def sft_rows(tokenized) -> list[dict[str, torch.Tensor]]:
    """Rows of a dataset tokenised by `tokenize_sft_dataset`."""
    return [sft_row(ids, mask) for ids, mask in zip(tokenized["input_ids"], tokenized["completion_mask"])]


@torch.no_grad()
def nll_sum(
    model: nn.Module, rows: list[dict[str, torch.Tensor]], pad_token_id: int, batch_size: int = 32
) -> tuple[float, float]:
    """Sum of the NLL (nats) over the counted tokens of `rows`, and their number.

    Args:
        model (`nn.Module`): a causal LM.
        rows (`list[dict]`): rows with `input_ids` `(L,)` and target-aligned `mask` `(L - 1,)`.
        pad_token_id (`int`): padding id.
        batch_size (`int`): rows per forward.

    Returns:
        tuple `(total_nll, num_tokens)`.
    """
    device = next(model.parameters()).device
    total, count = 0.0, 0.0
    ordered = sorted(rows, key=lambda r: r["input_ids"].numel())
    for start in range(0, len(ordered), batch_size):
        batch = collate_rows(ordered[start : start + batch_size], pad_token_id)
        input_ids = batch["input_ids"].to(device)
        logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"].to(device)).logits
        logps = selective_log_softmax(logits[:, :-1].float(), input_ids[:, 1:])
        mask = batch["mask"].to(device)
        total += float(-(logps * mask).sum())
        count += float(mask.sum())
    return total, count
