# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Builds each optimizer step's mixed batch: how many rows per objective, which micro-batch, and the padded tensors.

A step holds `per_device_train_batch_size * gradient_accumulation_steps` rows per rank. [`RowAllocator`] splits them
between the objectives in the curriculum's shares with a deterministic running-deficit rule (every rank allocates
identically, and over many steps each objective gets exactly its share of rows even when a step is too small to
hold every objective). [`split_micro_batches`] groups rows of similar length so padding stays small, and
[`collate_rows`] right-pads them into tensors (generation uses left padding; training always right padding).
[`StepContext`] is what the loss of every micro-batch needs to know about the whole step; [`plan_steps`] and
[`StepTickets`] make the `Trainer` loop run the planned number of steps.

What a row carries besides its tokens is declared once, in [`ROW_FIELDS`]: each [`RowField`] says whether it is
per-token (target-aligned) or one value per row, its dtype and default, whether RL trajectories carry it through the
replay buffer (and its checkpoint), and when the micro-batch has its column. [`Row`], the replay buffer's
[`~trl_trapo.memory.Trajectory`] with its `to_row`, and [`collate_rows`] are all derived from it, so a new field (a
teacher's log-probs for distillation, an environment mask for agents) is one line there. Extra inputs of the model
(a vision-language model's `pixel_values`, `image_grid_thw` ...) ride in each row's `model_inputs` mapping and are
combined by [`combine_model_inputs`].

Tensor layout of a collated micro-batch (B rows, L = longest row, T = L - 1 target positions):

| key | shape | meaning |
|---|---|---|
| `input_ids` | (B, L) | tokens, right-padded with the pad id |
| `attention_mask` | (B, L) | 1 on real tokens |
| `objective` | (B,) | 0 pretrain, 1 SFT, 2 RL |
| `mask` | (B, T) | 1 where predicting token t + 1 counts for the row's objective |
| `half` | (B,) | 0/1, the DARE probe half of the row |
| `old_per_token_logps` | (B, T) | RL: behaviour log-probs (nats); 0 elsewhere |
| `ref_per_token_logps` | (B, T) | RL: reference log-probs (nats); 0 elsewhere |
| `advantages` | (B, T) | RL: per-token advantages; 0 elsewhere |
| `returns`, `old_values` | (B, T) | RL with a critic: GAE returns and rollout-time values |
| `sampler_log_ratio` | (B, T) | only when some row has one: RL rows another engine sampled, log pi_trainer - log pi_sampler (0: none measured, a weight of 1) |
| `importance_weight` | (B,) | RL: extra detached weight of a stale row; SFT: prioritised-replay weight (1 by default) |
| `pool_index` | (B,) | SFT: the row's slot in the SFT pool, for per-row feedback; -1 for other rows |
| `temperature` | (B,) | only when some row carries one: RL rows' own sampling temperature (0: the configured one) |
| `off_policy` | (B,) bool | only when some row is one: RL demonstrations put in by guidance |
| `model_inputs` | dict | only when some row has extra model inputs: name -> the rows' tensors concatenated along dim 0 |

Every key from `old_per_token_logps` to `off_policy` is a field of [`ROW_FIELDS`]: a per-token field is present when
some row has it (rows without it and padding hold 0), a per-row field always or when some row's value is not the
default, as its declaration says.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from trl.trainer.utils import pad


@dataclass(frozen=True)
class RowField:
    """One field that rows carry besides their tokens: how `Row` and `Trajectory` declare it, how the replay buffer
    keeps it and how [`collate_rows`] turns it into a micro-batch column (see [`ROW_FIELDS`]).

    Args:
        name (`str`): the attribute of `Row` (and `Trajectory`) and the key of the micro-batch.
        kind (`str`): "token": a target-aligned tensor, `(T,)` on a `Row` (entry t is about predicting token
            t + 1) and `(C,)` on a `Trajectory` (one entry per completion token; `to_row` places it at the
            completion's target positions, 0 elsewhere), collated to `(B, T)`, 0 on rows without it and on padding.
            "row": one scalar per row, collated to `(B,)`.
        dtype (`torch.dtype`): dtype of the micro-batch column (and of the `(T,)` tensor `to_row` builds); a per-row
            value is kept as the matching Python type (`float`, `int` or `bool`).
        default (*optional*): the value of a row that does not set it; None for per-token fields (absent).
        stored (`bool`): RL trajectories carry it: a `Trajectory` field, kept by the replay buffer and its checkpoint
            (per-token tensors with the trajectory's tensors, compressed with them; per-row values as JSON when they
            differ from the default). False: rows only (e.g. the SFT pool's `pool_index`).
        required (`bool`): a `Trajectory` cannot be built without it (every RL row has it).
        always (`bool`): per-row fields: the micro-batch always has the column. Otherwise the column is there only
            when some row's value differs from the default, and rows at the default give 0 (False).
        help (`str`): meaning and unit, for the reader.
    """

    name: str
    kind: Literal["token", "row"]
    dtype: torch.dtype
    default: Any = None
    stored: bool = True
    required: bool = False
    always: bool = False
    help: str = ""

    def __post_init__(self):
        if self.kind not in ("token", "row"):
            raise ValueError(f"RowField '{self.name}': kind must be 'token' or 'row', got {self.kind!r}.")
        if self.per_token and (self.default is not None or self.always):
            raise ValueError(f"RowField '{self.name}': a per-token field has no default and is collated when set.")
        if self.required and not self.stored:
            raise ValueError(f"RowField '{self.name}': `required` is about trajectories, so it needs `stored=True`.")

    @property
    def per_token(self) -> bool:
        """Whether the field is a target-aligned tensor (kind "token")."""
        return self.kind == "token"

    def is_default(self, value) -> bool:
        """Whether a row's `value` is the field's default (None for per-token fields)."""
        return value is None if self.default is None else bool(value == self.default)

    def scalar(self, value) -> float | int | bool | None:
        """A per-row `value` as the Python type of `dtype` (None stays None)."""
        if value is None:
            return None
        if self.dtype == torch.bool:
            return bool(value)
        return float(value) if self.dtype.is_floating_point else int(value)

    def annotation(self, required: bool) -> str:
        """The dataclass annotation of the field (`required`: no None)."""
        if self.per_token:
            base = "torch.Tensor"
        else:
            base = "bool" if self.dtype == torch.bool else "float" if self.dtype.is_floating_point else "int"
        return base if required or self.default is not None else f"{base} | None"


# The fields rows carry besides `objective`, `input_ids`, `mask`, `half` and `model_inputs`, one line each: `Row`,
# `Trajectory` (the `stored` ones), `Trajectory.to_row`, the replay buffer (storage, compression, checkpoint) and
# `collate_rows` all follow from it. Order: the attributes' and the micro-batch keys'.
# fmt: off
ROW_FIELDS: tuple[RowField, ...] = (
    RowField("old_per_token_logps", "token", torch.float32, required=True, help="RL: log pi_old(y_t | ...) at sampling, nats (temperature-scaled)"),
    RowField("ref_per_token_logps", "token", torch.float32, help="RL with a KL term: log pi_ref(y_t | ...), nats"),
    RowField("teacher_per_token_logps", "token", torch.float32, help="distillation's sampled-token estimator: log pi_teacher(y_t | ...) at distillation_temperature, nats"),
    RowField("advantages", "token", torch.float32, required=True, help="RL: per-token advantage"),
    RowField("returns", "token", torch.float32, help="RL with a critic: GAE return"),
    RowField("old_values", "token", torch.float32, help="RL with a critic: the critic's value at sampling"),
    RowField("sampler_log_ratio", "token", torch.float32, help="RL rounds another engine sampled (vLLM): log pi_trainer - log pi_sampler per token, nats, over the sampler's kept support; the mismatch weight is formed from it (vllm_importance_sampling_mode)"),
    RowField("importance_weight", "row", torch.float32, 1.0, always=True, help="detached weight of the row's loss (stale RL rows, prioritised SFT replay)"),
    RowField("pool_index", "row", torch.long, -1, stored=False, always=True, help="SFT: the row's slot in the SFT pool (per-row feedback); -1 otherwise"),
    RowField("temperature", "row", torch.float32, help="RL: the row's own sampling temperature (few-shot mode, exploration); None: the config's"),
    RowField("off_policy", "row", torch.bool, False, help="RL: a demonstration put in by guidance (loss and KL differ, see trl_trapo/guidance.py)"),
)
# fmt: on

# the per-token fields (all optional on a `Row`), in declaration order
OPTIONAL_TOKEN_FIELDS = tuple(spec.name for spec in ROW_FIELDS if spec.per_token)

MODEL_INPUTS = "model_inputs"  # the micro-batch key (and Row / Trajectory attribute) of the extra model inputs


def with_row_fields(fields: Sequence[RowField], stored_only: bool = False) -> Callable[[type], type]:
    """Class decorator, applied below `@dataclass`: adds one keyword-only dataclass field per declared [`RowField`].

    Args:
        fields (`Sequence[RowField]`): the declaration ([`ROW_FIELDS`]).
        stored_only (`bool`): only the `stored` fields, with `required` ones having no default (`Trajectory`);
            otherwise every field, each defaulting to its `default` (`Row`).

    Raises:
        TypeError: if the class already declares one of the fields itself.
    """

    def add(cls: type) -> type:
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for spec in fields:
            if stored_only and not spec.stored:
                continue
            if spec.name in annotations:
                raise TypeError(f"{cls.__name__} declares '{spec.name}' itself; it belongs in ROW_FIELDS only.")
            required = stored_only and spec.required
            annotations[spec.name] = spec.annotation(required)
            setattr(cls, spec.name, field(kw_only=True) if required else field(default=spec.default, kw_only=True))
        cls.__annotations__ = annotations
        return cls

    return add


@dataclass
@with_row_fields(ROW_FIELDS)
class Row:
    """One training row of any objective (L tokens, T = L - 1 target positions; per-token fields are target-aligned:
    entry t is about predicting token t + 1).

    Besides the attributes below, a row has one keyword-only attribute per field of [`ROW_FIELDS`] (per-token ones
    `(T,)` or None; per-row ones a scalar, at the field's default unless set).
    """

    objective: int  # PRETRAIN (0), SFT (1) or RL (2)
    input_ids: torch.Tensor  # (L,) long, the tokens
    mask: torch.Tensor  # (T,) float, 1 where predicting token t + 1 counts for the row's objective
    half: int | None = field(default=None, kw_only=True)  # 0 / 1: DARE probe half, assigned when the step is built
    # extra inputs of the model for this row, name -> tensor with a leading dimension (e.g. a VLM's `pixel_values`
    # (N_i, ...) and `image_grid_thw` (N_i, 3)); combined over rows by `combine_model_inputs`
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict, kw_only=True)


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

    The real rows are drawn by `TRAPOTrainer.get_batch_samples` from the objectives (`Objective.take`).
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


def plan_steps(args, shares: Sequence[float], primary: tuple[int, int | float] | None) -> tuple[int, int]:
    """Planned optimizer steps N, and the length of the ticket dataset that makes the Trainer run N steps.

    `max_steps` wins. Otherwise N follows from the "primary" dataset at its mean curriculum share: the rows its
    objective trains on over the whole run (`primary`, from [`~trl_trapo.objectives.planning_rows`]: the RL prompts'
    completions x `num_ppo_epochs`, else the SFT rows, else the reward-free distillation prompts, else the map-style
    pretraining documents, each x `num_train_epochs`). Without `max_steps` the trainer's copy of the config gets
    `max_steps = N`, so the Trainer runs exactly the plan (its own count, whole epochs of tickets, could round up by a
    step or more).

    Args:
        args ([`TRAPOConfig`]): the configuration.
        shares (`Sequence[float]`): the curriculum's time-averaged shares, one per objective.
        primary (`tuple[int, int | float]`, *optional*): `(objective index, rows of the whole run)` of the dataset
            that sizes the run; None when no dataset has a length.

    Raises:
        ValueError: with only a streaming pretraining dataset (`primary` None) and no `max_steps`.
    """
    world = max(args.world_size, 1)
    rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    if args.max_steps > 0:
        return args.max_steps, rows_per_step * args.max_steps
    if primary is None:
        raise ValueError(
            "With only a streaming `pretrain_dataset`, the number of steps cannot be derived: set `max_steps`."
        )
    index, rows = primary
    total = max(math.ceil(rows / (rows_per_step * shares[index])), 1)
    if args.total_episodes is not None:
        return total, rows_per_step * total
    steps_per_epoch = max(math.ceil(total / args.num_train_epochs), 1)
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

    `input_ids`, `attention_mask`, `objective`, `mask` and `half` (a row's own, else its index's parity) are always
    there; then one column per field of [`ROW_FIELDS`] that its declaration puts in (see [`RowField`]); then
    `model_inputs` (a dict, see [`combine_model_inputs`]) when some row has extra model inputs.

    Args:
        rows (`list[Row]`): the rows; RL rows carry the per-token fields.
        pad_token_id (`int`): id written in padding positions (never used to build a mask).

    Returns:
        `dict[str, torch.Tensor]`: the micro-batch.

    Raises:
        ValueError: if `rows` is empty, a row's mask does not have one entry less than its tokens, or the rows' model
            inputs cannot be combined.
    """
    if not rows:
        raise ValueError("collate_rows needs at least one row.")
    for i, row in enumerate(rows):
        if row.mask.numel() != row.input_ids.numel() - 1:
            raise ValueError(
                f"Row {i}: mask has {row.mask.numel()} entries for {row.input_ids.numel()} tokens "
                f"(expected {row.input_ids.numel() - 1})."
            )
    batch = {
        "input_ids": pad([r.input_ids.long() for r in rows], padding_value=pad_token_id),  # (B, L)
        "attention_mask": pad([torch.ones_like(r.input_ids, dtype=torch.long) for r in rows], padding_value=0),
        "objective": torch.tensor([int(r.objective) for r in rows], dtype=torch.long),  # (B,)
        "mask": pad([r.mask.float() for r in rows], padding_value=0.0),  # (B, T)
        "half": torch.tensor([i % 2 if r.half is None else int(r.half) for i, r in enumerate(rows)], dtype=torch.long),
    }
    for spec in ROW_FIELDS:
        values = [getattr(r, spec.name) for r in rows]
        if not spec.always and all(spec.is_default(v) for v in values):
            continue  # no row sets it: the column is left out
        if spec.per_token:  # (B, T); 0 on rows without the field and on padding
            columns = [
                torch.zeros(r.mask.numel(), dtype=spec.dtype) if v is None else v.to(spec.dtype)
                for r, v in zip(rows, values)
            ]
            batch[spec.name] = pad(columns, padding_value=0)
        else:  # (B,); rows without a value give 0
            batch[spec.name] = torch.tensor([spec.scalar(0 if v is None else v) for v in values], dtype=spec.dtype)
    model_inputs = combine_model_inputs([r.model_inputs for r in rows])
    if model_inputs:
        batch[MODEL_INPUTS] = model_inputs
    return batch


def combine_model_inputs(per_row: Sequence[Mapping[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """The extra model inputs of a batch, from each row's own: every input is the rows' tensors concatenated along
    dim 0, in row order.

    This is the convention of Hugging Face processors for images: `pixel_values` holds every image (or patch) of
    the batch one after the other, `(sum_i N_i, ...)`, with one `image_grid_thw` line per image, `(sum_i M_i, 3)`; the
    model matches them to the image tokens of `input_ids` in order. A row without an input (a text-only row, a
    pretraining row) adds nothing to it, so the order of the rows is the order of their images. Inputs padded to a
    batch-wide size (`(B, max_images, ...)` in some processors) do not follow this rule: rows with different sizes
    are refused.

    Args:
        per_row (`Sequence[Mapping[str, torch.Tensor] | None]`): each row's inputs, name -> tensor `(N_i, ...)`
            (None or empty: none).

    Returns:
        `dict[str, torch.Tensor]`: name -> `(sum_i N_i, ...)`, in the order names first appear; empty when no row has
            any.

    Raises:
        ValueError: if an input is not a tensor with a leading dimension, or two rows' tensors of one input differ in
            dtype or in a dimension other than the first.
    """
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for i, inputs in enumerate(per_row):
        for name, value in (inputs or {}).items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                got = "a 0-dim tensor" if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(
                    f"Model input '{name}' of row {i} must be a tensor with a leading dimension to concatenate rows "
                    f"along, got {got}."
                )
            parts.setdefault(name, []).append((i, value))
    combined = {}
    for name, values in parts.items():
        first, reference = values[0]
        for i, value in values[1:]:
            if value.dtype != reference.dtype or value.shape[1:] != reference.shape[1:]:
                raise ValueError(
                    f"Model input '{name}': row {first} has {reference.dtype} of shape {tuple(reference.shape)}, row "
                    f"{i} has {value.dtype} of shape {tuple(value.shape)}; rows are concatenated along dim 0, so the "
                    "other dimensions and the dtype must agree (pad them to one size in the processor, per row)."
                )
        combined[name] = torch.cat([value for _, value in values])
    return combined


def left_pad(sequences: list[list[int]] | list[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token sequences for generation.

    Returns:
        tuple `(input_ids, attention_mask)`, both shape `(B, L)`.
    """
    tensors = [torch.as_tensor(s, dtype=torch.long) for s in sequences]
    input_ids = pad(tensors, padding_value=pad_token_id, padding_side="left")
    attention_mask = pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left")
    return input_ids, attention_mask
