# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Builds each optimizer step's mixed batch: how many rows per objective, which micro-batch, and the padded tensors.

A step holds `per_device_train_batch_size * gradient_accumulation_steps` rows per rank. [`RowAllocator`] splits them
between the objectives in the curriculum's shares with a deterministic running-deficit rule (every rank allocates
identically, and over many steps each objective gets exactly its share of rows even when a step is too small to
hold every objective). [`split_micro_batches`] groups rows of similar length so padding stays small, and
[`collate_rows`] right-pads them into tensors (generation uses left padding; training always right padding).

Tensor layout of a collated micro-batch (B rows, L = longest row, T = L - 1 target positions):

| key | shape | meaning |
|---|---|---|
| `input_ids` | (B, L) | tokens, right-padded with the pad id |
| `attention_mask` | (B, L) | 1 on real tokens |
| `objective` | (B,) | 0 pretrain, 1 SFT, 2 RL |
| `mask` | (B, T) | 1 where predicting token t + 1 counts for the row's objective |
| `old_per_token_logps` | (B, T) | RL: behaviour log-probs (nats); 0 elsewhere |
| `ref_per_token_logps` | (B, T) | RL: reference log-probs (nats); 0 elsewhere |
| `advantages` | (B, T) | RL: per-token advantages; 0 elsewhere |
| `returns`, `old_values` | (B, T) | RL with a critic: GAE returns and rollout-time values |
| `importance_weight` | (B,) | RL: extra detached weight of a stale row; SFT: prioritised-replay weight (1 by default) |
| `half` | (B,) | 0/1, the DARE probe half of the row |
| `pool_index` | (B,) | SFT: the row's slot in the SFT pool, for per-row feedback; -1 for other rows |
| `temperature` | (B,) | only when some row carries one: RL rows' own sampling temperature (0: the configured one) |
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


OPTIONAL_TOKEN_FIELDS = ("old_per_token_logps", "ref_per_token_logps", "advantages", "returns", "old_values")


class RowAllocator:
    """Splits a step's rows between objectives so that cumulative counts track cumulative shares.

    At each step the ideal cumulative count of objective o grows by `share_o * rows`; the rows go, one at a time, to
    the objective furthest behind its ideal (ties to the lower index). Deterministic, so identical on every rank.

    Args:
        num_objectives (`int`): number of objectives (3).
    """

    def __init__(self, num_objectives: int = 3):
        self.ideal = [0.0] * num_objectives
        self.given = [0] * num_objectives

    def allocate(self, rows: int, shares: Sequence[float]) -> list[int]:
        """Rows per objective for a step of `rows` rows with the given shares (which sum to 1).

        Returns:
            `list[int]`: counts summing to `rows`; 0 for every objective whose share is 0.
        """
        for i, share in enumerate(shares):
            self.ideal[i] += share * rows
        counts = [0] * len(shares)
        for _ in range(rows):
            deficits = [
                (self.ideal[i] - self.given[i] - counts[i]) if shares[i] > 0 else -math.inf for i in range(len(shares))
            ]
            best = max(range(len(shares)), key=lambda i: (deficits[i], -i))
            counts[best] += 1
        for i, c in enumerate(counts):
            self.given[i] += c
        return counts

    def state_dict(self) -> dict:
        return {"ideal": list(self.ideal), "given": list(self.given)}

    def load_state_dict(self, state: dict) -> None:
        self.ideal = [float(x) for x in state["ideal"]]
        self.given = [int(x) for x in state["given"]]


def split_micro_batches(rows: list[dict], num_micro_batches: int) -> list[list[dict]]:
    """Split a step's rows into `num_micro_batches` groups of (nearly) equal row counts, grouping similar lengths.

    Rows are sorted by length (longest first, stable) and cut into contiguous groups, which keeps padding low; a
    micro-batch may then hold one objective only, and some may hold none of an objective's tokens — the loss is
    normalised by global counts, so this does not change the gradient.

    Args:
        rows (`list[dict]`): the step's rows.
        num_micro_batches (`int`): gradient-accumulation steps.

    Returns:
        `list[list[dict]]`: exactly `num_micro_batches` lists (some possibly empty if there are fewer rows).
    """
    order = sorted(rows, key=lambda r: -r["input_ids"].numel())
    base, extra = divmod(len(order), num_micro_batches)
    out, start = [], 0
    for i in range(num_micro_batches):
        size = base + (1 if i < extra else 0)
        out.append(order[start : start + size])
        start += size
    return out


def collate_rows(rows: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows into the micro-batch tensors described in the module docstring.

    Args:
        rows (`list[dict]`): rows with `objective`, `input_ids` (L_i,), `mask` (L_i - 1,) and, for RL rows, the
            optional per-token fields of shape (L_i - 1,).
        pad_token_id (`int`): id written in padding positions (never used to build a mask).

    Returns:
        `dict[str, torch.Tensor]`: the micro-batch.

    Raises:
        ValueError: if `rows` is empty or a row's mask does not have one entry less than its tokens.
    """
    if not rows:
        raise ValueError("collate_rows needs at least one row.")
    batch_size = len(rows)
    length = max(r["input_ids"].numel() for r in rows)
    input_ids = torch.full((batch_size, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, length), dtype=torch.long)
    mask = torch.zeros((batch_size, length - 1), dtype=torch.float32)
    present = [name for name in OPTIONAL_TOKEN_FIELDS if any(name in r for r in rows)]
    fields = {name: torch.zeros((batch_size, length - 1), dtype=torch.float32) for name in present}
    for i, row in enumerate(rows):
        n = row["input_ids"].numel()
        if row["mask"].numel() != n - 1:
            raise ValueError(f"Row {i}: mask has {row['mask'].numel()} entries for {n} tokens (expected {n - 1}).")
        input_ids[i, :n] = row["input_ids"]
        attention_mask[i, :n] = 1
        mask[i, : n - 1] = row["mask"]
        for name in present:
            if name in row:
                fields[name][i, : n - 1] = row[name]
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "objective": torch.tensor([int(r["objective"]) for r in rows], dtype=torch.long),
        "mask": mask,
        "importance_weight": torch.tensor([float(r.get("importance_weight", 1.0)) for r in rows]),
        "half": torch.tensor([int(r.get("half", i % 2)) for i, r in enumerate(rows)], dtype=torch.long),
        "pool_index": torch.tensor([int(r.get("pool_index", -1)) for r in rows], dtype=torch.long),
        **fields,
    }
    if any("temperature" in r for r in rows):
        batch["temperature"] = torch.tensor([float(r.get("temperature", 0.0)) for r in rows])
    return batch


def left_pad(sequences: list[list[int]] | list[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token sequences for generation.

    Returns:
        tuple `(input_ids, attention_mask)`, both shape `(B, L)`.
    """
    tensors = [torch.as_tensor(s, dtype=torch.long) for s in sequences]
    length = max(t.numel() for t in tensors)
    input_ids = torch.full((len(tensors), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(tensors), length), dtype=torch.long)
    for i, t in enumerate(tensors):
        input_ids[i, length - t.numel() :] = t
        attention_mask[i, length - t.numel() :] = 1
    return input_ids, attention_mask
