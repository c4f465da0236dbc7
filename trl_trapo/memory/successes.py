# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Self-imitation: the policy's own rare successes in RL become SFT rows (`self_imitation=True`).

A prompt without a demonstration (the built-in suite's `lst` family; any RL-only data) gives RL a gradient only in
the rounds where one of its group's completions happens to succeed. Such a success is rare early on, and RL uses it
once or twice (`num_ppo_epochs`) with an advantage that the group's size bounds; by the time the next one is sampled,
the other objectives may have moved the policy further from it. Self-imitation keeps those successes: a completion
that scored at least `self_imitation_min_reward`, stopped on its own (not truncated), was sampled (not a guidance
demonstration), and came from a group where some completion *failed* (below the threshold: the success is news, not
a solved prompt) joins a bounded buffer, and a share `self_imitation_fraction` of every step's SFT rows is served
from it, each success at most `self_imitation_max_uses` times. Its SFT loss is the usual negative log-likelihood of
the completion tokens, so the policy imitates what it got right — the idea of self-imitation learning (Oh et al.
2018, arXiv 1806.05635: replay of past good decisions) and of rejection-sampling fine-tuning (STaR, Zelikman et al.
2022, arXiv 2203.14465; RAFT, Dong et al. 2023, arXiv 2304.06767), here inside TRAPO's joint loop: successes move from
the RL side of the memory pool to its SFT side.

Bookkeeping: the buffer is first-in first-out (`self_imitation_capacity` rows; the oldest goes first), rows are
served round-robin, a row retires after `self_imitation_max_uses` servings, and the number of success rows per step
is exact in the long run (a running credit of `fraction x n` per step, its whole part taken). Everything is in the
checkpoint: token ids as JSON, a VLM success's model inputs (`pixel_values` ...) as tensors (`state_dict`).

A multi-turn success (a completion with tokens the environment wrote, completion mask 0, e.g. tool results) is kept
with its mask: its SFT row counts the policy's tokens only, so the policy imitates its own turns and never learns to
write the tool's results.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from ..collator import Row
from ..data import sft_row
from ..vision import as_tensors


class SuccessReplay:
    """The buffer of self-imitation rows (module docstring).

    Args:
        min_reward (`float`): the score a completion needs to count as a success (the weighted reward, as logged in
            `rl/score`).
        fraction (`float`): share of a step's SFT rows served from the buffer while it has rows, in (0, 1].
        max_uses (`int`): servings before a row retires (>= 1).
        capacity (`int`): rows kept (>= 1); the oldest is dropped first.

    Raises:
        ValueError: if `min_reward` is not finite, `fraction` is outside (0, 1], or `max_uses` / `capacity` < 1.
    """

    def __init__(self, min_reward: float, fraction: float, max_uses: int, capacity: int):
        if not math.isfinite(min_reward):
            raise ValueError(f"self_imitation_min_reward={min_reward!r}: use a finite score (e.g. 1.0).")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"self_imitation_fraction={fraction!r}: use a share of the SFT rows in (0, 1].")
        if max_uses < 1 or capacity < 1:
            raise ValueError(
                f"self_imitation_max_uses={max_uses!r}, self_imitation_capacity={capacity!r}: both must be >= 1."
            )
        self.min_reward = float(min_reward)
        self.fraction = float(fraction)
        self.max_uses = int(max_uses)
        self.capacity = int(capacity)
        # {"prompt_ids": [...], "completion_ids": [...], "uses": int[, "completion_mask": [...] with environment tokens]}
        self.rows: deque[dict] = deque()
        self.credit = 0.0  # success rows owed to the steps so far (its whole part is served next)
        self.kept = 0  # successes kept so far
        self.served = 0  # success rows served so far
        self.searched = 0  # completions targeted exploration's search offered so far (`observe(..., search=True)`)
        self.search_kept = 0  # successes kept from them

    def __len__(self) -> int:
        return len(self.rows)

    def observe(
        self,
        prompt_ids: list,
        completion_ids: list[torch.Tensor],
        scores: torch.Tensor,
        is_truncated: torch.Tensor,
        group: int,
        off_policy: torch.Tensor | None = None,
        completion_masks: list[torch.Tensor] | None = None,
        model_inputs: list[dict[str, torch.Tensor]] | None = None,
        search: bool = False,
    ) -> int:
        """Keep the successes of a scored generation round.

        Args:
            prompt_ids (`list`): `(P_i,)` prompt token ids per completion (B entries; lists or tensors).
            completion_ids (`list[torch.Tensor]`): `(C_i,)` completion tokens per completion, cut after the stop token.
            scores (`torch.Tensor`): `(B,)` scores (NaN: no reward).
            is_truncated (`torch.Tensor`): `(B,)` bool, True where no stop token was generated.
            group (`int`): consecutive completions that share a prompt (1: no groups, every success is kept).
            off_policy (`torch.Tensor`, *optional*): `(B,)` bool, True for guidance's demonstrations (never kept).
            completion_masks (`list[torch.Tensor]`, *optional*): `(C_i,)` each, 1 on tokens the policy sampled and 0 on
                tokens the environment wrote; a success keeps its mask, and its SFT row counts mask-1 tokens only.
            model_inputs (`list[dict]`, *optional*): each completion's prompt's extra model inputs (a VLM prompt's
                `pixel_values` ...); a success keeps them (the tensors themselves: the completions of one prompt share
                them) and its SFT row carries them.
            search (`bool`): the completions come from targeted exploration's search (trl_trapo/exploration.py), not
                from a training round: kept the same way, counted apart (`self_imitation/searched`, `/search_kept`).

        Returns:
            `int`: the number of successes kept.
        """
        scores = scores.double()
        success = torch.nan_to_num(scores, nan=-math.inf) >= self.min_reward
        success &= ~is_truncated.bool()
        if off_policy is not None:
            success &= ~off_policy.bool()
        if group > 1:  # news only: some scored completion of the same group failed
            failed = (~torch.isnan(scores)) & (scores < self.min_reward)
            if off_policy is not None:
                failed &= ~off_policy.bool()
            success &= failed.reshape(-1, group).any(dim=1).repeat_interleave(group)
        kept = 0
        stored: dict[int, torch.Tensor] = {}  # id(a completion's input tensor) -> the tensor the buffer keeps
        for i in success.nonzero().flatten().tolist():
            row = {
                "prompt_ids": [int(t) for t in prompt_ids[i]],
                "completion_ids": completion_ids[i].tolist(),
                "uses": 0,
            }
            if completion_masks is not None and not bool(completion_masks[i].bool().all()):
                row["completion_mask"] = [int(m) for m in completion_masks[i].tolist()]
            if model_inputs is not None and model_inputs[i]:
                # tensors, not lists: a (1, 3, 56, 56) image as Python floats takes 8x its 37 KB (305 KB), and the buffer
                # holds up to `capacity` successes
                for value in model_inputs[i].values():
                    if id(value) not in stored:  # one tensor per prompt: its successes share it
                        stored[id(value)] = value.detach().cpu()
                row["model_inputs"] = {name: stored[id(value)] for name, value in model_inputs[i].items()}
            self.rows.append(row)
            kept += 1
            if len(self.rows) > self.capacity:
                self.rows.popleft()
        self.kept += kept
        if search:
            self.searched += len(completion_ids)
            self.search_kept += kept
        return kept

    def split(self, n: int) -> int:
        """How many of a step's `n` SFT rows come from the buffer (the rest from the SFT pool): the whole part of
        the running credit, at most the rows available. Nothing accrues while the buffer is empty."""
        if not self.rows:
            return 0
        self.credit += self.fraction * n
        k = min(int(self.credit + 1e-9), n, len(self.rows))
        self.credit -= k
        return k

    def take(self, k: int) -> list[Row]:
        """`k` SFT rows from the buffer, round-robin from the front (`input_ids` (P + C,), target-aligned mask
        counting the completion tokens the policy sampled); a row that reaches `max_uses` leaves the buffer."""
        out = []
        while len(out) < k and self.rows:
            row = self.rows.popleft()
            ids = row["prompt_ids"] + row["completion_ids"]
            mask = [0] * len(row["prompt_ids"]) + row.get("completion_mask", [1] * len(row["completion_ids"]))
            out.append(sft_row(ids, mask, model_inputs=row.get("model_inputs")))
            row["uses"] += 1
            if row["uses"] < self.max_uses:
                self.rows.append(row)  # back of the queue: served again after the others
        self.served += len(out)
        return out

    def metrics(self) -> dict[str, float]:
        """`self_imitation/size` (rows in the buffer), `self_imitation/kept` and `self_imitation/served` (successes
        kept and success rows served so far, this rank); once exploration's search has offered completions,
        `self_imitation/searched` and `self_imitation/search_kept` (completions offered and successes kept from them so
        far, this rank; every rank searches as many, see `RLSupply.search_stuck_families`)."""
        out = {
            "self_imitation/size": float(len(self.rows)),
            "self_imitation/kept": float(self.kept),
            "self_imitation/served": float(self.served),
        }
        if self.searched:
            out["self_imitation/searched"] = float(self.searched)
            out["self_imitation/search_kept"] = float(self.search_kept)
        return out

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """`(meta, tensors)`: the buffer, its order and uses, the credit and the counters (JSON-serialisable), and the
        successes' model inputs by key (`"0"`, `"1"`, ...; a row's `model_inputs` maps each name to its key, and the
        successes of one prompt share one key)."""
        tensors: dict[str, torch.Tensor] = {}
        keys: dict[int, str] = {}  # id(tensor) -> key
        rows = []
        for row in self.rows:
            row = dict(row)
            if "model_inputs" in row:
                refs = {}
                for name, value in row["model_inputs"].items():
                    if id(value) not in keys:
                        keys[id(value)] = str(len(tensors))
                        tensors[keys[id(value)]] = value.clone()  # own storage: safetensors refuses shared memory
                    refs[name] = keys[id(value)]
                row["model_inputs"] = refs
            rows.append(row)
        meta = {
            "rows": rows,
            "credit": self.credit,
            "kept": self.kept,
            "served": self.served,
            "searched": self.searched,
            "search_kept": self.search_kept,
        }
        return meta, tensors

    def load_state_dict(self, state: dict | None, tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Restore `state_dict()`'s `(meta, tensors)`; None (a checkpoint made without self-imitation) starts empty.
        A row whose `model_inputs` holds nested lists (checkpoints written before they were tensors) is read as is.

        Raises:
            KeyError: if a row refers to a tensor that `tensors` lacks.
        """
        state = state or {}
        tensors = tensors or {}

        def inputs_of(refs: dict) -> dict[str, torch.Tensor]:
            return as_tensors({name: tensors[ref] if isinstance(ref, str) else ref for name, ref in refs.items()})

        self.rows = deque(
            {"prompt_ids": list(r["prompt_ids"]), "completion_ids": list(r["completion_ids"]), "uses": int(r["uses"])}
            | ({"completion_mask": [int(m) for m in r["completion_mask"]]} if "completion_mask" in r else {})
            | ({"model_inputs": inputs_of(r["model_inputs"])} if "model_inputs" in r else {})
            for r in state.get("rows", [])
        )
        self.credit = float(state.get("credit", 0.0))
        self.kept = int(state.get("kept", 0))
        self.served = int(state.get("served", 0))
        self.searched = int(state.get("searched", 0))
        self.search_kept = int(state.get("search_kept", 0))


__all__ = ["SuccessReplay"]
