# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Builds each optimizer step's mixed batch: how many rows per objective, which micro-batch, and the padded tensors.

A step holds `per_device_train_batch_size * gradient_accumulation_steps` rows per rank. [`RowAllocator`] splits them
between the objectives in the curriculum's shares with a deterministic running-deficit rule (every rank allocates
identically, and over many steps each objective gets exactly its share of rows even when a step is too small to
hold every objective). [`split_micro_batches`] groups rows of similar length so padding stays small, and
[`collate_rows`] right-pads them into tensors (generation uses left padding; training always right padding).
[`StepContext`] is what the loss of every micro-batch needs to know about the whole step; [`plan_steps`] and
[`StepTickets`] make the `Trainer` loop run the planned number of steps.

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
from dataclasses import dataclass

import torch
from trl.trainer.utils import pad

from .config import PRETRAIN, RL, SFT


OPTIONAL_TOKEN_FIELDS = ("old_per_token_logps", "ref_per_token_logps", "advantages", "returns", "old_values")


@dataclass
class Row:
    """One training row of any objective (L tokens, T = L - 1 target positions; per-token fields are target-aligned:
    entry t is about predicting token t + 1)."""

    objective: int  # PRETRAIN (0), SFT (1) or RL (2)
    input_ids: torch.Tensor  # (L,) long, the tokens
    mask: torch.Tensor  # (T,) float, 1 where predicting token t + 1 counts for the row's objective
    old_per_token_logps: torch.Tensor | None = None  # (T,) RL: log pi_old of the sampled token (nats), 0 elsewhere
    ref_per_token_logps: torch.Tensor | None = None  # (T,) RL with a KL term: log pi_ref (nats)
    advantages: torch.Tensor | None = None  # (T,) RL: per-token advantage
    returns: torch.Tensor | None = None  # (T,) RL with a critic: GAE return
    old_values: torch.Tensor | None = None  # (T,) RL with a critic: value at sampling time
    importance_weight: float = 1.0  # detached weight of the row's loss (prioritised SFT replay; 1 otherwise)
    half: int | None = None  # 0 / 1: DARE probe half, assigned when the step is built
    pool_index: int = -1  # SFT: the row's slot in the SFT pool (per-row feedback); -1 otherwise
    temperature: float | None = None  # RL: the row's own sampling temperature (few-shot mode); None: the config's
    off_policy: bool = False  # RL: a demonstration put in by guidance (loss and KL differ, see trl_trapo/guidance.py)


@dataclass
class StepContext:
    """What the loss of every micro-batch of one optimizer step needs to know about the whole step.

    Handed to `compute_loss` through the Trainer's per-step channel (`num_items_in_batch`, which the Trainer fills
    with the step's item count for exactly this purpose: normalising each micro-batch's loss by the whole step).
    """

    step: int  # the optimizer step (0-based) the micro-batches belong to
    weights: tuple[float, ...]  # loss weight w_o of each objective (in the trainer's order), summing to 1
    counts: dict[str, float]  # global counts of the step (all micro-batches, all ranks), see objectives.count_keys
    probe: bool  # a DARE update step: accumulate the gradient probe
    num_micro: int  # micro-batches of the step on this rank
    micro_index: int = 0  # micro-batches of the step done so far

    @property
    def last_micro_batch(self) -> bool:
        """Whether every micro-batch of the step has gone through the loss."""
        return self.micro_index >= self.num_micro


class StepTickets(torch.utils.data.Dataset):
    """The Trainer's train dataset: one placeholder item per row slot, so its epoch and step bookkeeping works.

    The real rows are drawn by `TRAPOTrainer.get_batch_samples` from the three objectives' pools.
    """

    def __init__(self, length: int):
        self.length = max(int(length), 1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, int]:
        return {"ticket": index}


def ticket_collator(features: list[dict]) -> dict[str, torch.Tensor]:
    """Collates step tickets (the Trainer's `data_collator`)."""
    return {"ticket": torch.tensor([f["ticket"] for f in features])}


def plan_steps(
    args, active: Sequence[bool], shares: Sequence[float], rl_prompts: int, sft_rows: int, pretrain_docs: int | None
) -> tuple[int, int]:
    """Planned optimizer steps N, and the length of the ticket dataset that makes the Trainer run N steps.

    `max_steps` wins. Otherwise N follows from the "primary" dataset at its mean curriculum share: the RL prompts
    (each of `total_episodes` — or `num_train_epochs` x prompts x completions per prompt — completions used
    `num_ppo_epochs` times), else the SFT rows, else the map-style pretraining documents. Without `max_steps` the
    trainer's copy of the config gets `max_steps = N`, so the Trainer runs exactly the plan (its own count, whole
    epochs of tickets, could round up by a step or more).

    Args:
        args ([`TRAPOConfig`]): the configuration.
        active (`Sequence[bool]`): which objectives have data.
        shares (`Sequence[float]`): the curriculum's time-averaged shares (pretrain, sft, rl).
        rl_prompts (`int`): RL prompts x completions per prompt (1 with a critic, else `num_generations`).
        sft_rows (`int`): SFT rows.
        pretrain_docs (`int`, *optional*): map-style pretraining documents (None when streaming).

    Raises:
        ValueError: with only a streaming pretraining dataset and no `max_steps`.
    """
    world = max(args.world_size, 1)
    rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    if args.max_steps > 0:
        return args.max_steps, rows_per_step * args.max_steps
    epochs = args.num_train_epochs
    if active[RL]:
        completions = args.total_episodes or rl_prompts * epochs
        rows, share = completions * args.num_ppo_epochs, shares[RL]
    elif active[SFT]:
        rows, share = sft_rows * epochs, shares[SFT]
    elif pretrain_docs is not None:
        rows, share = pretrain_docs * epochs, shares[PRETRAIN]
    else:
        raise ValueError(
            "With only a streaming `pretrain_dataset`, the number of steps cannot be derived: set `max_steps`."
        )
    total = max(math.ceil(rows / (rows_per_step * share)), 1)
    if args.total_episodes is not None:
        return total, rows_per_step * total
    steps_per_epoch = max(math.ceil(total / epochs), 1)
    return total, steps_per_epoch * rows_per_step


class RowAllocator:
    """Splits a step's rows between objectives so that cumulative counts track cumulative shares.

    At each step the ideal cumulative count of objective o grows by `share_o * rows`; the rows go, one at a time, to
    the objective furthest behind its ideal (ties to the lower index). Deterministic, so identical on every rank.

    Args:
        num_objectives (`int`): number of objectives.
    """

    def __init__(self, num_objectives: int):
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


def split_micro_batches(rows: list[Row], num_micro_batches: int) -> list[list[Row]]:
    """Split a step's rows into `num_micro_batches` groups of (nearly) equal row counts, grouping similar lengths.

    Rows are sorted by length (longest first, stable) and cut into contiguous groups, which keeps padding low; a
    micro-batch may then hold one objective only, and some may hold none of an objective's tokens — the loss is
    normalised by global counts, so this does not change the gradient.

    Args:
        rows (`list[Row]`): the step's rows.
        num_micro_batches (`int`): gradient-accumulation steps.

    Returns:
        `list[list[Row]]`: exactly `num_micro_batches` lists (some possibly empty if there are fewer rows).
    """
    order = sorted(rows, key=lambda r: -r.input_ids.numel())
    base, extra = divmod(len(order), num_micro_batches)
    out, start = [], 0
    for i in range(num_micro_batches):
        size = base + (1 if i < extra else 0)
        out.append(order[start : start + size])
        start += size
    return out


def collate_rows(rows: list[Row], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows into the micro-batch tensors described in the module docstring.

    Args:
        rows (`list[Row]`): the rows; RL rows carry the optional per-token fields.
        pad_token_id (`int`): id written in padding positions (never used to build a mask).

    Returns:
        `dict[str, torch.Tensor]`: the micro-batch.

    Raises:
        ValueError: if `rows` is empty or a row's mask does not have one entry less than its tokens.
    """
    if not rows:
        raise ValueError("collate_rows needs at least one row.")
    for i, row in enumerate(rows):
        if row.mask.numel() != row.input_ids.numel() - 1:
            raise ValueError(
                f"Row {i}: mask has {row.mask.numel()} entries for {row.input_ids.numel()} tokens "
                f"(expected {row.input_ids.numel() - 1})."
            )
    input_ids = pad([r.input_ids.long() for r in rows], padding_value=pad_token_id)
    batch = {
        "input_ids": input_ids,
        "attention_mask": pad([torch.ones_like(r.input_ids, dtype=torch.long) for r in rows], padding_value=0),
        "objective": torch.tensor([int(r.objective) for r in rows], dtype=torch.long),
        "mask": pad([r.mask.float() for r in rows], padding_value=0.0),
        "importance_weight": torch.tensor([float(r.importance_weight) for r in rows]),
        "half": torch.tensor([i % 2 if r.half is None else int(r.half) for i, r in enumerate(rows)], dtype=torch.long),
        "pool_index": torch.tensor([int(r.pool_index) for r in rows], dtype=torch.long),
    }
    for name in OPTIONAL_TOKEN_FIELDS:  # (B, T) each; 0 on rows without the field and on padding
        if any(getattr(r, name) is not None for r in rows):
            values = [
                torch.zeros(r.mask.numel()) if getattr(r, name) is None else getattr(r, name).float() for r in rows
            ]
            batch[name] = pad(values, padding_value=0.0)
    if any(r.temperature is not None for r in rows):
        batch["temperature"] = torch.tensor([0.0 if r.temperature is None else float(r.temperature) for r in rows])
    if any(r.off_policy for r in rows):
        batch["off_policy"] = torch.tensor([bool(r.off_policy) for r in rows], dtype=torch.bool)
    return batch


def left_pad(sequences: list[list[int]] | list[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token sequences for generation.

    Returns:
        tuple `(input_ids, attention_mask)`, both shape `(B, L)`.
    """
    tensors = [torch.as_tensor(s, dtype=torch.long) for s in sequences]
    input_ids = pad(tensors, padding_value=pad_token_id, padding_side="left")
    attention_mask = pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left")
    return input_ids, attention_mask
