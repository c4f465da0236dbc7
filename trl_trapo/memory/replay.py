# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The short-term RL replay buffer of the mixed memory pool: [`ReplayBuffer`] of [`Trajectory`] objects.

The replay buffer *is* the rollout buffer: trajectories are stored with their behaviour log-probs, and PPO's
"several epochs over a batch" becomes "each trajectory is served at most `max_uses` times". Serving least-used first
(random among equals) reproduces PPO's epoch structure exactly when a generation round is consumed before the next
one; a stale trajectory is corrected by the clipped ratio against its behaviour log-probs. The buffer is bounded in
trajectories (`capacity`) and bytes (`max_bytes`, zstd-compressing new trajectories past a threshold); trajectories
older than `max_age` steps are not served.

The long-term SFT pools are in `sft_pool.py`; `pool.py`'s `MemoryPool` is what the trainer talks to for them.
"""

from __future__ import annotations

import logging
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import torch
import zstandard
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from ..collator import ROW_FIELDS, Row, with_row_fields
from ..config import RL


logger = logging.getLogger(__name__)


def compress_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """zstd-compressed safetensors bytes of a dict of CPU tensors (lossless)."""
    return zstandard.ZstdCompressor(level=1).compress(safetensors_save(tensors))


def decompress_tensors(blob: bytes) -> dict[str, torch.Tensor]:
    """Inverse of `compress_tensors`."""
    return safetensors_load(zstandard.ZstdDecompressor().decompress(blob))


STORED_FIELDS = tuple(spec for spec in ROW_FIELDS if spec.stored)  # the fields of ROW_FIELDS trajectories carry
MODEL_INPUT_PREFIX = "model_inputs/"  # key prefix of a trajectory's model inputs among its stored tensors


@dataclass
@with_row_fields(ROW_FIELDS, stored_only=True)
class Trajectory:
    """One RL rollout as the replay buffer stores it (P prompt tokens, C completion tokens).

    Besides the attributes below, a trajectory has one keyword-only attribute per `stored` field of
    [`~trl_trapo.collator.ROW_FIELDS`]: per-token ones `(C,)`, one entry per completion token (e.g.
    `old_per_token_logps` and `advantages`, which it cannot be built without, or `ref_per_token_logps`), per-row ones
    scalars (e.g. `importance_weight`, `temperature`).
    """

    prompt_ids: torch.Tensor  # (P,) long, the prompt's tokens
    completion_ids: torch.Tensor  # (C,) long, the sampled tokens up to and including the stop token
    completion_mask: torch.Tensor  # (C,) float, 1 where the token counts in the loss
    # the prompt's extra model inputs, name -> tensor with a leading dimension (see `Row.model_inputs`)
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict, kw_only=True)
    uses: int = 0  # times served so far (set by the replay buffer when it serves it)
    age: int = 0  # policy versions behind the step it is served at: that step minus `version` (set when served)
    version: int = 0  # the policy version that sampled it: the optimizer step whose weights generated it

    # stored tensors (besides the model inputs) and JSON values, from the declaration
    TENSOR_FIELDS = ("prompt_ids", "completion_ids", "completion_mask") + tuple(
        spec.name for spec in STORED_FIELDS if spec.per_token
    )
    EXTRA_FIELDS = tuple(spec.name for spec in STORED_FIELDS if not spec.per_token)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors the buffer stores, compresses and checkpoints: the tensor fields that are set, and each model
        input `name` as `model_inputs/name`."""
        out = {name: getattr(self, name) for name in self.TENSOR_FIELDS if getattr(self, name) is not None}
        out.update({MODEL_INPUT_PREFIX + name: value for name, value in self.model_inputs.items()})
        return out

    def extras(self) -> dict:
        """The JSON fields that differ from their defaults."""
        out = {}
        for spec in STORED_FIELDS:
            value = getattr(self, spec.name)
            if not spec.per_token and not spec.is_default(value):
                out[spec.name] = spec.scalar(value)
        return out

    @classmethod
    def from_parts(
        cls, tensors: dict[str, torch.Tensor], extras: dict, uses: int = 0, age: int = 0, version: int = 0
    ) -> Trajectory:
        """The trajectory of stored `tensors` (as `tensors()` returns them) and `extras`, sampled by policy `version`;
        its model inputs in the order of their names (storage, compression and checkpoints do not keep the order they
        came in)."""
        fields = {k: v for k, v in tensors.items() if not k.startswith(MODEL_INPUT_PREFIX)}
        inputs = {
            k[len(MODEL_INPUT_PREFIX) :]: tensors[k] for k in sorted(tensors) if k.startswith(MODEL_INPUT_PREFIX)
        }
        values = {k: v for k, v in extras.items() if k in cls.EXTRA_FIELDS}
        return cls(**fields, **values, model_inputs=inputs, uses=uses, age=age, version=version)

    def nbytes(self) -> int:
        """Host-memory bytes held by its tensors (model inputs included)."""
        return trajectory_nbytes(self.tensors())

    def to_row(self) -> Row:
        """The training row: `input_ids` (P + C,), the mask and per-token fields placed at the target positions
        P - 1 ... P + C - 2 (0 elsewhere, in the field's dtype), the per-row fields, and the model inputs."""
        p, c = self.prompt_ids.numel(), self.completion_ids.numel()
        length = p + c - 1

        def targets(value: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
            if value is None:
                return None
            full = torch.zeros(length, dtype=dtype)
            full[p - 1 :] = value.to(dtype)
            return full

        values = {
            spec.name: targets(getattr(self, spec.name), spec.dtype)
            if spec.per_token
            else spec.scalar(getattr(self, spec.name))
            for spec in STORED_FIELDS
        }
        return Row(
            RL,
            torch.cat([self.prompt_ids, self.completion_ids]),
            targets(self.completion_mask, torch.float32),
            model_inputs=dict(self.model_inputs),
            **values,
        )


def trajectory_nbytes(tensors: dict[str, torch.Tensor]) -> int:
    """Host-memory bytes held by a dict of tensors."""
    return sum(v.numel() * v.element_size() for v in tensors.values())


class ReplayBuffer:
    """Short-term FIFO of RL trajectories with a capacity in trajectories and in bytes and a per-trajectory reuse cap.

    Trajectories live in host memory as dicts of CPU tensors (their model inputs included, e.g. a prompt's images). When the stored bytes pass `compress_threshold` of
    `max_bytes` (or always, with `compress=True`) new trajectories are kept as zstd-compressed safetensors blobs and
    decompressed when served; eviction (oldest first) counts the compressed size. Serving is least-used first, random
    among equally used ones, so a generation round is consumed like PPO's epochs: every trajectory once, then every
    trajectory a second time, and so on up to `max_uses`. Bookkeeping is O(1) per trajectory served (use-count buckets),
    so a 50k-trajectory buffer costs next to nothing per step.

    Args:
        capacity (`int`): maximum number of trajectories; the oldest are evicted first.
        max_bytes (`int`, *optional*): maximum host bytes of the stored trajectories; the oldest are evicted first.
        max_uses (`int`): a trajectory is served at most this many times (PPO's `num_ppo_epochs`; the trainer's
            `replay_max_uses` hook, which few-shot mode raises).
        max_age (`int`, *optional*): trajectories whose policy version is more than this many optimizer steps behind
            the current step are not served.
        seed (`int`): seed of the random choice among equally used trajectories.
        compress (`bool`): always store trajectories compressed.
        compress_threshold (`float`): fraction of `max_bytes` above which new trajectories are stored compressed.
    """

    def __init__(
        self,
        capacity: int = 50_000,
        max_bytes: int | None = None,
        max_uses: int = 4,
        max_age: int | None = None,
        seed: int = 0,
        compress: bool = False,
        compress_threshold: float = 0.85,
    ):
        if capacity < 1 or max_uses < 1:
            raise ValueError(f"ReplayBuffer needs capacity >= 1 and max_uses >= 1, got {capacity}, {max_uses}.")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.max_uses = max_uses
        self.max_age = max_age
        self.compress = compress
        self.compress_threshold = compress_threshold
        self.rng = random.Random(seed)
        self._items: OrderedDict[int, dict] = OrderedDict()  # insertion (= age) order
        self._buckets: list[dict[int, None]] = [{} for _ in range(max_uses)]  # servable ids by use count
        self._unexpired: deque[int] = deque()  # ids not yet checked against max_age, oldest first
        self._next_id = 0
        self.nbytes = 0
        self.num_evicted = 0
        self._total_uses = 0
        self._total_versions = 0  # sum of the stored trajectories' versions (for replay/age_mean)
        self._num_compressed = 0

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Drop every stored trajectory (e.g. after a policy rollback made their behaviour log-probs meaningless)."""
        for key in list(self._items):
            self._remove(key)
        self._unexpired.clear()

    def _remove(self, key: int) -> None:
        item = self._items.pop(key)
        if item["uses"] < self.max_uses:
            self._buckets[item["uses"]].pop(key, None)
        self.nbytes -= item["nbytes"]
        self._total_uses -= item["uses"]
        self._total_versions -= item["version"]
        self._num_compressed -= int(item["blob"] is not None)

    def _should_compress(self) -> bool:
        return self.compress or (
            self.max_bytes is not None and self.nbytes >= self.compress_threshold * self.max_bytes
        )

    def add(self, trajectories: list[Trajectory]) -> None:
        """Store trajectories (each with the policy `version` that sampled it), evicting the oldest beyond either
        capacity.

        Raises:
            ValueError: if a single trajectory is larger than `max_bytes` even compressed.
        """
        for trajectory in trajectories:
            tensors, extras = trajectory.tensors(), trajectory.extras()
            nbytes = trajectory_nbytes(tensors)
            blob = None
            if self._should_compress() or (self.max_bytes is not None and nbytes > self.max_bytes):
                candidate = compress_tensors(tensors)
                if len(candidate) < nbytes:  # tiny trajectories do not shrink: keep those as they are
                    blob, nbytes, tensors = candidate, len(candidate), None
            if self.max_bytes is not None and nbytes > self.max_bytes:
                raise ValueError(
                    f"One trajectory takes {nbytes} bytes (compressed), more than replay_max_bytes={self.max_bytes}: "
                    "raise replay_max_bytes."
                )
            key = self._next_id
            self._next_id += 1
            self._items[key] = {
                "tensors": tensors,
                "blob": blob,
                "extras": extras,
                "uses": 0,
                "version": int(trajectory.version),
                "nbytes": nbytes,
            }
            self._buckets[0][key] = None
            self._unexpired.append(key)
            self.nbytes += nbytes
            self._total_versions += int(trajectory.version)
            self._num_compressed += int(blob is not None)
            while len(self._items) > self.capacity or (self.max_bytes is not None and self.nbytes > self.max_bytes):
                self._remove(next(iter(self._items)))
                self.num_evicted += 1

    def _expire(self, step: int) -> None:
        if self.max_age is None:
            return
        while self._unexpired:
            key = self._unexpired[0]
            item = self._items.get(key)
            if item is not None and step - item["version"] <= self.max_age:
                break
            self._unexpired.popleft()
            if item is not None and item["uses"] < self.max_uses:
                self._buckets[item["uses"]].pop(key, None)

    def num_available(self, step: int) -> int:
        """Trajectories that can still be served at `step`."""
        self._expire(step)
        return sum(len(bucket) for bucket in self._buckets)

    def use_counts(self, step: int) -> list[int]:
        """`(max_uses,)` servable trajectories at `step` by the number of times they were served (what an asynchronous
        source forecasts the buffer's remaining steps from, see [`steps_covered`])."""
        self._expire(step)
        return [len(bucket) for bucket in self._buckets]

    def _tensors(self, item: dict) -> dict[str, torch.Tensor]:
        return item["tensors"] if item["blob"] is None else decompress_tensors(item["blob"])

    def sample(self, n: int, step: int) -> list[Trajectory]:
        """Serve `n` trajectories, least used first (random among equals), and count the use.

        Returns:
            `list[Trajectory]`: the trajectories, each with `uses` (after this one) and `age` (optimizer steps) set.

        Raises:
            ValueError: if fewer than `n` trajectories are available.
        """
        available = self.num_available(step)
        if available < n:
            raise ValueError(f"Replay buffer has {available} servable trajectories, {n} were requested.")
        chosen: list[int] = []
        for bucket in self._buckets:
            if len(chosen) == n:
                break
            take = min(n - len(chosen), len(bucket))
            chosen.extend(self.rng.sample(list(bucket), take))
        out = []
        for key in chosen:
            item = self._items[key]
            self._buckets[item["uses"]].pop(key)
            item["uses"] += 1
            self._total_uses += 1
            if item["uses"] < self.max_uses:
                self._buckets[item["uses"]][key] = None
            version = item["version"]
            out.append(
                Trajectory.from_parts(self._tensors(item), item["extras"], item["uses"], step - version, version)
            )
        return out

    def metrics(self, step: int) -> dict[str, float]:
        """`replay/size`, `replay/bytes`, `replay/reuse_mean`, `replay/age_mean` (policy versions behind `step`) and
        `replay/compressed` (fraction of stored trajectories kept compressed)."""
        size = len(self._items)
        return {
            "replay/size": float(size),
            "replay/bytes": float(self.nbytes),
            "replay/reuse_mean": self._total_uses / size if size else 0.0,
            "replay/age_mean": step - self._total_versions / size if size else 0.0,
            "replay/compressed": self._num_compressed / size if size else 0.0,
        }

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """Everything needed to restore the buffer exactly: JSON bookkeeping and flat tensors (no pickle).

        Each per-trajectory tensor field `f` is stored as `replay/f` (all trajectories concatenated) and
        `replay/f.offsets` (shape `(N + 1,)`), so the buffer round-trips bit-identically through safetensors;
        non-tensor fields (JSON values) go to `meta["extras"]`. Model inputs, which only some trajectories may have,
        are stored the same way as `replay/model_inputs/name` (a trajectory without one takes no entries), with each
        trajectory's shapes in `meta["model_inputs"]` (a list of `{name: shape}`; absent when no trajectory has any).

        Returns:
            tuple `(meta, tensors)`.

        Raises:
            ValueError: if a tensor field is present in some trajectories only, or a model input has different dtypes
                in different trajectories.
        """
        items = list(self._items.values())
        datas = [self._tensors(item) for item in items]
        fields = sorted({k for data in datas for k in data if not k.startswith(MODEL_INPUT_PREFIX)})
        tensors: dict[str, torch.Tensor] = {}
        for name in fields:
            if any(name not in data for data in datas):
                raise ValueError(f"Replay field '{name}' is present in some trajectories only; cannot serialise.")
            values = [data[name].reshape(-1) for data in datas]
            lengths = torch.tensor([0] + [v.numel() for v in values], dtype=torch.long)
            tensors[f"replay/{name}"] = torch.cat(values) if values else torch.zeros(0)
            tensors[f"replay/{name}.offsets"] = torch.cumsum(lengths, 0)
        inputs = sorted({k for data in datas for k in data if k.startswith(MODEL_INPUT_PREFIX)})
        for key in inputs:
            present = [data[key] for data in datas if key in data]
            if len({value.dtype for value in present}) > 1:
                raise ValueError(
                    f"Model input '{key[len(MODEL_INPUT_PREFIX) :]}' has dtypes {sorted({str(v.dtype) for v in present})} "
                    "in different replay trajectories; cannot serialise (give every prompt's input one dtype)."
                )
            values = [data[key].reshape(-1) if key in data else present[0].new_zeros(0) for data in datas]
            lengths = torch.tensor([0] + [v.numel() for v in values], dtype=torch.long)
            tensors[f"replay/{key}"] = torch.cat(values)
            tensors[f"replay/{key}.offsets"] = torch.cumsum(lengths, 0)
        version, internal, gauss = self.rng.getstate()
        position = {key: i for i, key in enumerate(self._items)}
        meta = {
            "buckets": [[position[key] for key in bucket] for bucket in self._buckets],
            "fields": fields,
            "extras": [item["extras"] for item in items],
            "compressed": [item["blob"] is not None for item in items],
            "uses": [item["uses"] for item in items],
            "versions": [item["version"] for item in items],
            "num_evicted": self.num_evicted,
            "rng": [version, list(internal), gauss],
        }
        if inputs:
            meta["model_inputs"] = [
                {key[len(MODEL_INPUT_PREFIX) :]: list(data[key].shape) for key in inputs if key in data}
                for data in datas
            ]
        return meta, tensors

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: if the bookkeeping and the tensors disagree (a corrupted checkpoint).
        """
        count = len(meta["uses"])
        versions = meta["versions"] if "versions" in meta else meta["births"]  # births: checkpoints before versions
        if len(versions) != count:
            raise ValueError("Corrupted replay state: 'uses' and 'versions' have different lengths.")
        columns = {}
        for name in meta["fields"]:
            data, offsets = tensors.get(f"replay/{name}"), tensors.get(f"replay/{name}.offsets")
            if data is None or offsets is None or offsets.numel() != count + 1 or int(offsets[-1]) != data.numel():
                raise ValueError(f"Corrupted replay state: field '{name}' does not match {count} trajectories.")
            columns[name] = [data[int(offsets[i]) : int(offsets[i + 1])].clone() for i in range(count)]
        shapes = meta.get("model_inputs") or [{} for _ in range(count)]  # absent: no trajectory has model inputs
        if len(shapes) != count:
            raise ValueError("Corrupted replay state: 'model_inputs' does not match the number of trajectories.")
        inputs: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
        for name in sorted({name for shape in shapes for name in shape}):
            key = f"replay/{MODEL_INPUT_PREFIX}{name}"
            data, offsets = tensors.get(key), tensors.get(f"{key}.offsets")
            if data is None or offsets is None or offsets.numel() != count + 1 or int(offsets[-1]) != data.numel():
                raise ValueError(f"Corrupted replay state: model input '{name}' does not match {count} trajectories.")
            for i in range(count):
                if name in shapes[i]:
                    value = data[int(offsets[i]) : int(offsets[i + 1])]
                    if value.numel() != math.prod(shapes[i][name]):
                        raise ValueError(f"Corrupted replay state: model input '{name}' of trajectory {i}.")
                    inputs[i][MODEL_INPUT_PREFIX + name] = value.reshape(shapes[i][name]).clone()
        extras = meta.get("extras") or [{} for _ in range(count)]
        compressed = meta.get("compressed") or [False] * count
        if len(extras) != count or len(compressed) != count:
            raise ValueError("Corrupted replay state: 'extras'/'compressed' do not match the number of trajectories.")
        self._items.clear()
        self._buckets = [{} for _ in range(self.max_uses)]
        self._unexpired = deque()
        self.nbytes = self._total_uses = self._total_versions = self._num_compressed = 0
        for i in range(count):
            tensors = {name: columns[name][i] for name in meta["fields"]} | inputs[i]
            blob = compress_tensors(tensors) if compressed[i] else None
            uses, version = int(meta["uses"][i]), int(versions[i])
            nbytes = len(blob) if blob is not None else trajectory_nbytes(tensors)
            self._items[i] = {
                "tensors": None if blob is not None else tensors,
                "blob": blob,
                "extras": dict(extras[i]),
                "uses": uses,
                "version": version,
                "nbytes": nbytes,
            }
            if uses < self.max_uses and "buckets" not in meta:
                self._buckets[uses][i] = None
            self._unexpired.append(i)
            self.nbytes += nbytes
            self._total_uses += uses
            self._total_versions += version
            self._num_compressed += int(blob is not None)
        if "buckets" in meta:  # the serving order among equally used trajectories, exactly
            if len(meta["buckets"]) != self.max_uses:
                raise ValueError(
                    f"Replay state has {len(meta['buckets'])} use buckets, this buffer serves at most "
                    f"{self.max_uses} times: resume with the same num_ppo_epochs."
                )
            for uses, positions in enumerate(meta["buckets"]):
                for i in positions:
                    if not 0 <= int(i) < count or self._items[int(i)]["uses"] != uses:
                        raise ValueError("Corrupted replay state: a use bucket disagrees with the use counts.")
                    self._buckets[uses][int(i)] = None
        self._next_id = count
        self.num_evicted = int(meta.get("num_evicted", 0))
        version, internal, gauss = meta["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


__all__ = ["ReplayBuffer", "Trajectory", "compress_tensors", "decompress_tensors", "trajectory_nbytes"]


def steps_covered(use_counts: list[int], n: int, rounds: list[int], horizon: int) -> int:
    """How many optimizer steps in a row, from the current one, a replay buffer can serve `n` trajectories each, as
    [`ReplayBuffer.sample`] serves them (least used first, each at most `len(use_counts)` times), when each of `rounds`
    (trajectory counts, in order) is added the first time the buffer runs dry. Counts up to `horizon + 1`.

    Args:
        use_counts (`list[int]`): `(max_uses,)` servable trajectories by uses so far ([`ReplayBuffer.use_counts`]).
        n (`int`): trajectories a step takes (> 0).
        rounds (`list[int]`): sizes of the rounds that will arrive, in order.
        horizon (`int`): stop counting past this many steps.
    """
    by_uses, queue, steps = list(use_counts), list(rounds), 0
    max_uses = len(by_uses)
    while steps <= horizon:
        while sum(by_uses) < n:  # the trainer asks for the next round when fewer than n are servable
            if not queue:
                return steps
            fresh = queue.pop(0)
            by_uses = [fresh + by_uses[uses] if uses == 0 else by_uses[uses] for uses in range(max_uses)]
        served, take = [0] * max_uses, n
        for uses in range(max_uses):
            served[uses] = min(take, by_uses[uses])
            take -= served[uses]
        for uses in range(max_uses):
            by_uses[uses] -= served[uses]
            if uses + 1 < max_uses:
                by_uses[uses + 1] += served[uses]
        steps += 1
    return steps
