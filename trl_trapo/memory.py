# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The mixed memory pool: the short-term RL replay buffer and the long-term SFT pool.

The replay buffer *is* the rollout buffer: trajectories are stored with their behaviour log-probs, and PPO's
"several epochs over a batch" becomes "each trajectory is served at most `max_uses` times". Serving least-used first
(random among equals) reproduces PPO's epoch structure exactly when a generation round is consumed before the next
one; a stale trajectory is corrected by the clipped ratio against its behaviour log-probs.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict

import torch

from .data import RL, SFT, ShardedSampler, sft_row


logger = logging.getLogger(__name__)

# Per-completion-token tensors a trajectory may carry, all shape (C,).
TOKEN_FIELDS = ("completion_mask", "old_per_token_logps", "ref_per_token_logps", "advantages", "returns", "old_values")


def trajectory_nbytes(trajectory: dict) -> int:
    """Host-memory bytes held by a trajectory's tensors."""
    return sum(v.numel() * v.element_size() for v in trajectory.values() if isinstance(v, torch.Tensor))


def trajectory_row(trajectory: dict) -> dict[str, torch.Tensor]:
    """Turn a stored trajectory into a training row with target-aligned per-token tensors.

    Args:
        trajectory (`dict`): `prompt_ids` (P,), `completion_ids` (C,) and the `TOKEN_FIELDS` present, shape (C,).

    Returns:
        `dict`: `input_ids` (P + C,), `mask` (P + C - 1,) 1 on completion targets that count, and each token field
        placed at target positions P - 1 ... P + C - 2 (0 elsewhere).
    """
    prompt, completion = trajectory["prompt_ids"], trajectory["completion_ids"]
    p, c = prompt.numel(), completion.numel()
    length = p + c - 1
    row = {"objective": RL, "input_ids": torch.cat([prompt, completion])}
    for name in TOKEN_FIELDS:
        value = trajectory.get(name)
        if value is None:
            continue
        full = torch.zeros(length, dtype=torch.float32)
        full[p - 1 :] = value.float()
        row["mask" if name == "completion_mask" else name] = full
    row["importance_weight"] = torch.tensor(float(trajectory.get("importance_weight", 1.0)))
    return row


class ReplayBuffer:
    """Short-term FIFO of RL trajectories with a capacity in trajectories and in bytes and a per-trajectory reuse cap.

    Args:
        capacity (`int`): maximum number of trajectories; the oldest are evicted first.
        max_bytes (`int`, *optional*): maximum host bytes of the stored tensors; the oldest are evicted first.
        max_uses (`int`): a trajectory is served at most this many times (PPO's `num_ppo_epochs`).
        max_age (`int`, *optional*): trajectories born more than this many optimizer steps ago are not served.
        seed (`int`): seed of the random tie-breaking among equally used trajectories.
    """

    def __init__(
        self,
        capacity: int = 50_000,
        max_bytes: int | None = None,
        max_uses: int = 4,
        max_age: int | None = None,
        seed: int = 0,
    ):
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.max_uses = max_uses
        self.max_age = max_age
        self.rng = random.Random(seed)
        self._items: OrderedDict[int, dict] = OrderedDict()  # insertion (= age) order
        self._next_id = 0
        self.nbytes = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._items)

    def _evict_oldest(self) -> None:
        _, item = self._items.popitem(last=False)
        self.nbytes -= item["nbytes"]
        self.num_evicted += 1

    def add(self, trajectories: list[dict], step: int) -> None:
        """Store trajectories born at optimizer step `step`, evicting the oldest beyond either capacity.

        Raises:
            ValueError: if a single trajectory is larger than `max_bytes`.
        """
        for trajectory in trajectories:
            nbytes = trajectory_nbytes(trajectory)
            if self.max_bytes is not None and nbytes > self.max_bytes:
                raise ValueError(
                    f"One trajectory takes {nbytes} bytes, more than replay_max_bytes={self.max_bytes}: raise it."
                )
            self._items[self._next_id] = {"data": trajectory, "uses": 0, "birth": step, "nbytes": nbytes}
            self._next_id += 1
            self.nbytes += nbytes
            while len(self._items) > self.capacity or (self.max_bytes is not None and self.nbytes > self.max_bytes):
                self._evict_oldest()

    def _eligible(self, step: int) -> list[int]:
        return [
            key
            for key, item in self._items.items()
            if item["uses"] < self.max_uses and (self.max_age is None or step - item["birth"] <= self.max_age)
        ]

    def num_available(self, step: int) -> int:
        """Trajectories that can still be served at `step`."""
        return len(self._eligible(step))

    def sample(self, n: int, step: int) -> list[dict]:
        """Serve `n` trajectories, least used first (random among equals), and count the use.

        Raises:
            ValueError: if fewer than `n` trajectories are available.
        """
        eligible = self._eligible(step)
        if len(eligible) < n:
            raise ValueError(f"Replay buffer has {len(eligible)} servable trajectories, {n} were requested.")
        self.rng.shuffle(eligible)
        eligible.sort(key=lambda key: self._items[key]["uses"])  # stable: random order within equal use counts
        out = []
        for key in eligible[:n]:
            item = self._items[key]
            item["uses"] += 1
            out.append({**item["data"], "uses": item["uses"], "age": step - item["birth"]})
        return out

    def metrics(self, step: int) -> dict[str, float]:
        """`replay/size`, `replay/bytes`, `replay/reuse_mean`, `replay/age_mean` (optimizer steps)."""
        size = len(self._items)
        uses = sum(item["uses"] for item in self._items.values())
        ages = sum(step - item["birth"] for item in self._items.values())
        return {
            "replay/size": float(size),
            "replay/bytes": float(self.nbytes),
            "replay/reuse_mean": uses / size if size else 0.0,
            "replay/age_mean": ages / size if size else 0.0,
        }

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """Everything needed to restore the buffer exactly: JSON bookkeeping and flat tensors (no pickle).

        Each per-trajectory tensor field `f` is stored as `replay/f` (all trajectories concatenated) and
        `replay/f.offsets` (shape `(N + 1,)`), so the buffer round-trips bit-identically through safetensors;
        non-tensor fields (JSON values) go to `meta["extras"]`.

        Returns:
            tuple `(meta, tensors)`.
        """
        items = list(self._items.values())
        fields = sorted({k for item in items for k, v in item["data"].items() if isinstance(v, torch.Tensor)})
        tensors: dict[str, torch.Tensor] = {}
        for name in fields:
            if any(name not in item["data"] for item in items):
                raise ValueError(f"Replay field '{name}' is present in some trajectories only; cannot serialise.")
            values = [item["data"][name].reshape(-1) for item in items]
            lengths = torch.tensor([0] + [v.numel() for v in values], dtype=torch.long)
            tensors[f"replay/{name}"] = torch.cat(values) if values else torch.zeros(0)
            tensors[f"replay/{name}.offsets"] = torch.cumsum(lengths, 0)
        version, internal, gauss = self.rng.getstate()
        extras = [{k: v for k, v in item["data"].items() if not isinstance(v, torch.Tensor)} for item in items]
        meta = {
            "fields": fields,
            "extras": extras,
            "uses": [item["uses"] for item in items],
            "births": [item["birth"] for item in items],
            "num_evicted": self.num_evicted,
            "rng": [version, list(internal), gauss],
        }
        return meta, tensors

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: if the bookkeeping and the tensors disagree (a corrupted checkpoint).
        """
        count = len(meta["uses"])
        if len(meta["births"]) != count:
            raise ValueError("Corrupted replay state: 'uses' and 'births' have different lengths.")
        columns = {}
        for name in meta["fields"]:
            data, offsets = tensors.get(f"replay/{name}"), tensors.get(f"replay/{name}.offsets")
            if data is None or offsets is None or offsets.numel() != count + 1 or int(offsets[-1]) != data.numel():
                raise ValueError(f"Corrupted replay state: field '{name}' does not match {count} trajectories.")
            columns[name] = [data[int(offsets[i]) : int(offsets[i + 1])].clone() for i in range(count)]
        self._items.clear()
        self.nbytes = 0
        extras = meta.get("extras") or [{} for _ in range(count)]
        if len(extras) != count:
            raise ValueError("Corrupted replay state: 'extras' does not match the number of trajectories.")
        for i in range(count):
            data = {**extras[i], **{name: columns[name][i] for name in meta["fields"]}}
            nbytes = trajectory_nbytes(data)
            self._items[i] = {
                "data": data,
                "uses": int(meta["uses"][i]),
                "birth": int(meta["births"][i]),
                "nbytes": nbytes,
            }
            self.nbytes += nbytes
        self._next_id = count
        self.num_evicted = int(meta.get("num_evicted", 0))
        version, internal, gauss = meta["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


class SFTPool:
    """The SFT sample pool: tokenised demonstrations served in seeded per-rank epochs.

    Args:
        dataset (`Dataset`): tokenised SFT dataset (`input_ids`, `completion_mask`), see `tokenize_sft_dataset`.
        seed, rank, world_size: sharding, as in [`ShardedSampler`].
    """

    def __init__(self, dataset, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.dataset = dataset
        self.sampler = ShardedSampler(len(dataset), seed=seed, rank=rank, world_size=world_size)

    def take(self, n: int) -> list[dict[str, torch.Tensor]]:
        """The next `n` SFT rows (`input_ids` (L,), `mask` (L - 1,))."""
        if n == 0:
            return []
        batch = self.dataset.select(self.sampler.take(n))
        return [sft_row(ids, mask) for ids, mask in zip(batch["input_ids"], batch["completion_mask"])]

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])


__all__ = ["ReplayBuffer", "SFTPool", "trajectory_row", "TOKEN_FIELDS", "SFT"]
