# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The long-term SFT pool of the mixed memory pool: uniform epochs or prioritised experience replay from disk.

- [`SFTPool`] (`sft_sampling="uniform"`): the tokenised demonstrations, served in seeded per-rank epochs.
- [`PrioritizedSFTPool`] (`sft_sampling="prioritized"`): a memory-mapped Arrow copy of this rank's shard under
  `output_dir` within a disk budget, sampled with probability proportional to a priority derived from each row's
  recent gradient magnitude ([`sft_priority_proxy`]), with importance-sampling weights (Schaul et al.,
  huggingface.co/papers/1511.05952).

Both put a `pool_index` on every row they serve (the row's slot in the pool), so the memory pool can hand per-row
feedback (priority proxies; prompt embeddings for a sample selector such as few-shot mode's) back after the step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile

import torch

from ..collator import MODEL_INPUTS, Row
from ..data import ShardedSampler, sft_row


logger = logging.getLogger(__name__)


class SFTPool:
    """The SFT sample pool: tokenised demonstrations served in seeded per-rank epochs (`sft_sampling="uniform"`).

    Args:
        dataset (`Dataset`): tokenised SFT dataset (`input_ids`, `completion_mask`), see `tokenize_sft_dataset`.
        seed, rank, world_size: sharding, as in [`ShardedSampler`].
    """

    wants_feedback = False

    def __init__(self, dataset, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.dataset = dataset
        self.sampler = ShardedSampler(len(dataset), seed=seed, rank=rank, world_size=world_size)

    def __len__(self) -> int:
        return len(self.dataset)

    def take(self, n: int, step: int | None = None) -> list[Row]:
        """The next `n` SFT rows (`input_ids` (L,), `mask` (L - 1,), `pool_index` = the dataset row)."""
        if n == 0:
            return []
        indices = self.sampler.take(n)
        batch = self.dataset[list(indices)]  # one Arrow take; `select` + column reads costs ~10x more per step
        inputs = batch.get(MODEL_INPUTS) or [None] * len(indices)  # a VLM row's pixel_values ...
        return [
            sft_row(ids, mask, pool_index=index, model_inputs=extra)
            for ids, mask, index, extra in zip(batch["input_ids"], batch["completion_mask"], indices, inputs)
        ]

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def metrics(self) -> dict[str, float]:
        return {}


# ---------------------------------------------------------------------------------------------------------------------
# Prioritised SFT pool (prioritised experience replay, Schaul et al. 2016, huggingface.co/papers/1511.05952)
# ---------------------------------------------------------------------------------------------------------------------
class SumMinTree:
    """A binary segment tree over `size` non-negative leaves holding subtree sums and minima (float64).

    Updates and prefix-sum searches are vectorised over a batch of leaves: O(log N) tensor operations per batch,
    whatever the batch size, so a pool of millions of rows costs microseconds per optimizer step. Parents are always
    recomputed from their children (never updated by differences), so the sums do not drift.

    Args:
        size (`int`): number of leaves (> 0).
    """

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"SumMinTree needs at least one leaf, got {size}.")
        self.size = size
        self.capacity = 1 << (size - 1).bit_length()  # a power of two >= size
        self.depth = self.capacity.bit_length() - 1
        self.sums = torch.zeros(2 * self.capacity, dtype=torch.float64)
        self.mins = torch.full((2 * self.capacity,), math.inf, dtype=torch.float64)

    @property
    def total(self) -> float:
        return float(self.sums[1])

    @property
    def minimum(self) -> float:
        return float(self.mins[1])

    def leaves(self) -> torch.Tensor:
        """The leaf values, shape `(size,)` (a view)."""
        return self.sums[self.capacity : self.capacity + self.size]

    def set(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaves `indices` (`(n,)` long, duplicates allowed: the last one wins) to `values` (`(n,)`, >= 0)."""
        indices = indices.long().reshape(-1)
        values = values.to(torch.float64).reshape(-1)
        if indices.numel() == 0:
            return
        unique, inverse = torch.unique(indices, return_inverse=True)
        last = torch.full((unique.numel(),), -1, dtype=torch.long)
        last.scatter_reduce_(0, inverse, torch.arange(indices.numel()), reduce="amax")
        nodes = unique + self.capacity
        self.sums[nodes] = values[last]
        self.mins[nodes] = values[last]
        for _ in range(self.depth):
            nodes = torch.unique(nodes // 2)
            self.sums[nodes] = self.sums[2 * nodes] + self.sums[2 * nodes + 1]
            self.mins[nodes] = torch.minimum(self.mins[2 * nodes], self.mins[2 * nodes + 1])

    def set_all(self, values: torch.Tensor) -> None:
        """Set every leaf at once (`(size,)`), rebuilding the tree bottom-up in O(N)."""
        self.sums.zero_()
        self.mins.fill_(math.inf)
        self.sums[self.capacity : self.capacity + self.size] = values.to(torch.float64)
        self.mins[self.capacity : self.capacity + self.size] = values.to(torch.float64)
        width = self.capacity
        while width > 1:
            parents = torch.arange(width // 2, width)
            self.sums[parents] = self.sums[2 * parents] + self.sums[2 * parents + 1]
            self.mins[parents] = torch.minimum(self.mins[2 * parents], self.mins[2 * parents + 1])
            width //= 2

    def find(self, targets: torch.Tensor) -> torch.Tensor:
        """For each target mass u in [0, total), the leaf i with prefix(i) <= u < prefix(i + 1); `(n,)` long."""
        node = torch.ones(targets.numel(), dtype=torch.long)
        u = targets.to(torch.float64).clone()
        for _ in range(self.depth):
            left = self.sums[2 * node]
            go_right = u >= left
            u = torch.where(go_right, u - left, u)
            node = 2 * node + go_right.long()
        # rounding at a boundary can end on an empty padding leaf: fall back to the last real one
        return (node - self.capacity).clamp(max=self.size - 1)


def free_disk_bytes(path: str) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return shutil.disk_usage(path).free


def directory_nbytes(path: str) -> int:
    """Total bytes of the regular files under `path`."""
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def sft_priority_proxy(per_token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row priority proxy: the mean over counted tokens of 1 - p(y_t), from the training forward's log-probs.

    Why this proxy: for softmax cross-entropy the gradient of a token's loss with respect to its logits is
    p - e_y, whose norm satisfies (1 - p_y) <= ||p - e_y||_2 <= sqrt(2) (1 - p_y) (the first coordinate alone is
    1 - p_y; the others sum to 1 - p_y, so their squares sum to at most (1 - p_y)^2). The proxy is therefore within a
    factor sqrt(2) of the exact per-token gradient norm with respect to the logits, in [0, 1], and free: the training
    forward already computed log p(y_t). It ignores the back-propagated part of the gradient (the hidden states'
    Jacobians), as every per-sample gradient-norm proxy that avoids per-sample backward passes does.

    Args:
        per_token_logps (`torch.Tensor`): `(B, T)` log p(y_t) in nats.
        mask (`torch.Tensor`): `(B, T)` 1 on tokens that count.

    Returns:
        `torch.Tensor`: `(B,)` proxies in [0, 1] (0 for a row without counted tokens), detached, float32.
    """
    with torch.no_grad():
        mask = mask.to(torch.float32)
        one_minus_p = -torch.expm1(per_token_logps.detach().float())  # 1 - p, accurate when p is close to 1
        total = (one_minus_p * mask).sum(-1)
        return total / mask.sum(-1).clamp(min=1.0)


class PrioritizedSFTPool:
    """Long-term SFT pool with prioritised experience replay, kept on disk as a memory-mapped Arrow dataset.

    Each rank keeps its shard of the tokenised SFT dataset (rows `r::world_size` of a seeded permutation, as
    [`ShardedSampler`]) in `directory` (written with `Dataset.save_to_disk` into a temporary directory renamed into
    place, read back memory-mapped), within `max_bytes / world_size` bytes of disk: when the shard does not fit, the
    longest prefix of its seeded permutation that does is kept (a uniform random subset) and the rest is dropped, with
    a warning. Token ids are stored as int32 and completion masks as int8.

    Sampling follows prioritised experience replay (Schaul et al., huggingface.co/papers/1511.05952, section 3.3):

        P(i) = p_i^alpha / sum_k p_k^alpha,        w_i = (N P(i))^-beta / max_k w_k = (min_k p_k^alpha / p_i^alpha)^beta,

    with p_i = proxy_i + epsilon, the proxy being [`sft_priority_proxy`] (mean over completion tokens of 1 - p(y_t),
    within a factor sqrt(2) of the per-token gradient norm with respect to the logits), refreshed every time row i is
    trained on. Rows never seen yet have the largest priority seen so far (1 + epsilon at the start, the proxy's
    maximum), so every row is visited early, as in the paper. beta is annealed linearly from `beta` at step 0 to 1 at
    `total_steps`. A batch is drawn by stratified sampling (one draw in each of n equal slices of the total mass, as in
    the paper's rank-based variant), from a [`SumMinTree`]: O(log N) per step.

    Differences from the paper: the priority is a gradient-norm proxy rather than the TD error (there is none in
    SFT); `max_k w_k` is taken over the whole pool (this rank's), not the batch, so a row's weight does not depend on
    what it was drawn with; under data parallelism each rank normalises by its own pool's maximum.

    Args:
        dataset (`Dataset`): tokenised SFT dataset (`input_ids`, `completion_mask`), see `tokenize_sft_dataset`.
        directory (`str`): where this rank's Arrow copy is written (replaced if it exists).
        alpha (`float`): priority exponent (0: uniform).
        beta (`float`): importance-sampling exponent at step 0, annealed to 1.
        total_steps (`int`): optimizer steps over which beta reaches 1.
        max_bytes (`int`, *optional*): disk budget of the pool over all ranks; None: no limit.
        seed, rank, world_size: sharding and sampling seed.
        epsilon (`float`): added to every proxy so that no row has probability 0.

    Raises:
        ValueError: for bad exponents, or a budget that cannot hold a single row.
    """

    wants_feedback = True

    def __init__(
        self,
        dataset,
        directory: str,
        alpha: float = 0.6,
        beta: float = 0.4,
        total_steps: int = 1,
        max_bytes: int | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        epsilon: float = 1e-2,
    ):
        if alpha < 0 or not 0 <= beta <= 1 or epsilon <= 0:
            raise ValueError(f"PrioritizedSFTPool needs alpha >= 0, 0 <= beta <= 1, epsilon > 0; got {alpha}, {beta}.")
        self.source = dataset
        self.directory = directory
        self.alpha, self.beta0, self.epsilon = float(alpha), float(beta), float(epsilon)
        self.total_steps = max(int(total_steps), 1)
        self.max_bytes = None if max_bytes is None else max(int(max_bytes) // max(world_size, 1), 0)
        self.generator = torch.Generator().manual_seed(seed + 7919 * rank)
        order = ShardedSampler(len(dataset), seed=seed, rank=rank, world_size=world_size).epoch_order(0)
        self._materialise(order, fit=True)
        self.max_priority = 1.0 + self.epsilon
        self.priorities = torch.full((len(self.indices),), self.max_priority, dtype=torch.float64)
        self.tree = SumMinTree(len(self.indices))
        self.tree.set_all(self.priorities.pow(self.alpha))
        self.beta = self.beta0
        self.num_refreshed = 0
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._last_weights = torch.ones(0)
        self._loaded_meta: dict | None = None

    # ---- the on-disk copy -------------------------------------------------------------------------------------------
    def _estimate_row_bytes(self, indices: list[int]) -> list[int]:
        rows = self.source.select(indices)
        lengths = rows["input_ids"]
        sizes = [5 * len(ids) + 8 for ids in lengths]  # int32 ids + int8 mask + two int32 list offsets
        if MODEL_INPUTS in rows.column_names:  # a VLM row's inputs, stored as JSON text
            sizes = [size + len(json.dumps(extra)) for size, extra in zip(sizes, rows[MODEL_INPUTS])]
        return sizes

    def _write(self, indices: list[int]) -> int:
        from datasets import Features, Sequence, Value, load_from_disk
        from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        features = Features({"input_ids": Sequence(Value("int32")), "completion_mask": Sequence(Value("int8"))})
        parent = os.path.dirname(os.path.abspath(self.directory)) or "."
        os.makedirs(parent, exist_ok=True)
        temporary = tempfile.mkdtemp(dir=parent, prefix=".tmp-sft-pool-")
        bars_were_disabled = are_progress_bars_disabled()
        disable_progress_bars()
        try:
            subset = self.source.select(indices)
            kept = ["input_ids", "completion_mask"] + [MODEL_INPUTS] * (MODEL_INPUTS in subset.column_names)
            subset = subset.select_columns(kept).cast(Features({**subset.features, **features}))
            subset.save_to_disk(temporary)
            old = None
            if os.path.exists(self.directory):
                old = tempfile.mkdtemp(dir=parent, prefix=".old-sft-pool-")
                os.replace(self.directory, os.path.join(old, "pool"))
            os.replace(temporary, self.directory)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        finally:
            if not bars_were_disabled:
                enable_progress_bars()
        self.dataset = load_from_disk(self.directory)  # memory-mapped
        return directory_nbytes(self.directory)

    def _materialise(self, order: list[int], fit: bool) -> None:
        """Write rows `order` (all of them, or with `fit` the longest prefix within the byte budget) to disk."""
        keep = len(order)
        if fit and self.max_bytes is not None:
            sizes = self._estimate_row_bytes(order)
            cumulative, keep = 0, 0
            for size in sizes:
                if cumulative + size > self.max_bytes:
                    break
                cumulative += size
                keep += 1
        for _ in range(8):  # the estimate ignores Arrow's small headers: shrink until the files really fit
            if keep < 1:
                raise ValueError(
                    f"The SFT pool's disk budget ({self.max_bytes} bytes on this rank) cannot hold a single row: "
                    "raise TRAPOConfig.sft_pool_max_bytes (or free disk space)."
                )
            self.nbytes = self._write(order[:keep])
            if not fit or self.max_bytes is None or self.nbytes <= self.max_bytes:
                break
            keep = min(keep - 1, int(keep * self.max_bytes / self.nbytes))
        else:
            raise ValueError(f"Could not fit the SFT pool into {self.max_bytes} bytes; raise sft_pool_max_bytes.")
        if keep < len(order):
            logger.warning(
                "The SFT pool keeps %d of this rank's %d rows (a seeded random subset) to stay within %d bytes of "
                "disk; raise TRAPOConfig.sft_pool_max_bytes to keep them all.",
                keep,
                len(order),
                self.max_bytes,
            )
        self.indices = [int(i) for i in order[:keep]]

    def __len__(self) -> int:
        return len(self.indices)

    # ---- sampling ---------------------------------------------------------------------------------------------------
    def beta_at(self, step: int) -> float:
        """The importance-sampling exponent at optimizer step `step`: linear from `beta` to 1 over `total_steps`."""
        return self.beta0 + (1.0 - self.beta0) * min(max(step, 0) / self.total_steps, 1.0)

    def probabilities(self) -> torch.Tensor:
        """P(i) of every row, shape `(N,)`."""
        self._flush()
        return self.tree.leaves() / self.tree.total

    def importance_weights(self, indices: torch.Tensor, step: int) -> torch.Tensor:
        """w_i = (min_k p_k^alpha / p_i^alpha)^beta(step) of rows `indices`, shape `(n,)`, in (0, 1]."""
        self._flush()
        return (self.tree.minimum / self.tree.leaves()[indices]).pow(self.beta_at(step)).to(torch.float32)

    def sample_indices(self, n: int) -> torch.Tensor:
        """Draw `n` pool rows with probability P(i) (stratified: one draw per slice of mass); `(n,)` long."""
        self._flush()
        total = self.tree.total
        targets = torch.arange(n, dtype=torch.float64) + torch.rand(n, generator=self.generator, dtype=torch.float64)
        return self.tree.find((targets * (total / n)).clamp(max=math.nextafter(total, 0.0)))

    def take(self, n: int, step: int = 0) -> list[Row]:
        """`n` SFT rows drawn by priority, each with `pool_index` and its `importance_weight` (the PER weight)."""
        if n == 0:
            return []
        indices = self.sample_indices(n)
        weights = self.importance_weights(indices, step)
        self.beta = self.beta_at(step)
        self._last_weights = weights
        batch = self.dataset[indices.tolist()]
        inputs = batch.get(MODEL_INPUTS) or [None] * len(weights)  # a VLM row's pixel_values ...
        return [
            sft_row(ids, mask, pool_index=index, importance_weight=float(weight), model_inputs=extra)
            for ids, mask, index, weight, extra in zip(
                batch["input_ids"], batch["completion_mask"], indices.tolist(), weights, inputs
            )
        ]

    # ---- feedback -------------------------------------------------------------------------------------------------
    def report(self, pool_indices: torch.Tensor, proxies: torch.Tensor) -> None:
        """Queue new proxies for rows (tensors may stay on the accelerator: nothing syncs until the next draw)."""
        self._pending.append((pool_indices.detach(), proxies.detach()))

    def update_priorities(self, pool_indices: torch.Tensor, proxies: torch.Tensor) -> None:
        """p_i <- proxy_i + epsilon for the given rows (the last report of a row wins), and the running maximum."""
        pool_indices = pool_indices.long().cpu().reshape(-1)
        proxies = proxies.to(torch.float64).cpu().reshape(-1)
        keep = (pool_indices >= 0) & (pool_indices < len(self.indices)) & torch.isfinite(proxies)
        pool_indices, proxies = pool_indices[keep], proxies[keep]
        if pool_indices.numel() == 0:
            return
        priorities = proxies.clamp(min=0.0) + self.epsilon
        self.priorities[pool_indices] = priorities
        self.tree.set(pool_indices, priorities.pow(self.alpha))
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.num_refreshed += int(pool_indices.numel())

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            # one device-to-host copy for all queued micro-batches, not one per micro-batch
            self.update_priorities(torch.cat([i for i, _ in pending]), torch.cat([p for _, p in pending]))

    # ---- metrics and state ----------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """`sft_pool/size`, `sft_pool/bytes`, `sft_pool/priority_mean`, `sft_pool/is_weight_mean` (last draw),
        `sft_pool/beta`, `sft_pool/refreshed` (priority updates so far)."""
        self._flush()
        return {
            "sft_pool/size": float(len(self.indices)),
            "sft_pool/bytes": float(self.nbytes),
            "sft_pool/priority_mean": float(self.priorities.mean()) if len(self.indices) else 0.0,
            "sft_pool/is_weight_mean": float(self._last_weights.mean()) if self._last_weights.numel() else 1.0,
            "sft_pool/beta": float(self.beta),
            "sft_pool/refreshed": float(self.num_refreshed),
        }

    def state_dict(self) -> dict:
        """JSON bookkeeping (the tensors are in `tensor_state`, saved to their own safetensors file)."""
        self._flush()
        return {
            "size": len(self.indices),
            "source_size": len(self.source),
            "alpha": self.alpha,
            "max_priority": self.max_priority,
            "num_refreshed": self.num_refreshed,
        }

    def tensor_state(self) -> dict[str, torch.Tensor]:
        """Source rows kept (`indices`), raw priorities, the sampling RNG."""
        self._flush()
        return {
            "indices": torch.tensor(self.indices, dtype=torch.long),
            "priorities": self.priorities.clone(),
            "rng": self.generator.get_state(),
        }

    def load_tensor_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Second half of a two-part restore: `load_state_dict(meta)` first, then this."""
        if self._loaded_meta is None:
            raise ValueError("SFT pool: load_state_dict(meta) must come before load_tensor_state(tensors).")
        meta, self._loaded_meta = self._loaded_meta, None
        self.load_state_dict(meta, tensors)

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Restore what `state_dict` and `tensor_state` returned (without `tensors`, the JSON part is kept until
        `load_tensor_state`); rewrites the on-disk copy if the kept rows differ (a different budget).

        Raises:
            ValueError: if the state does not fit this pool (another dataset) or is inconsistent (corrupted).
        """
        if tensors is None:
            for key in ("size", "source_size", "alpha", "max_priority"):
                if key not in meta:
                    raise ValueError(f"SFT pool state has no '{key}'.")
            self._loaded_meta = dict(meta)
            return
        for key in ("indices", "priorities", "rng"):
            if key not in tensors:
                raise ValueError(f"SFT pool state has no '{key}' tensor.")
        indices, priorities = tensors["indices"].long(), tensors["priorities"].to(torch.float64)
        size = int(meta["size"])
        if indices.numel() != size or priorities.numel() != size or size < 1:
            raise ValueError(
                f"SFT pool state is inconsistent: {indices.numel()} rows, {priorities.numel()} priorities."
            )
        if int(meta["source_size"]) != len(self.source) or int(indices.max()) >= len(self.source):
            raise ValueError(
                f"SFT pool state was saved for an SFT dataset of {meta['source_size']} rows, this one has "
                f"{len(self.source)}: resume with the same dataset."
            )
        if not bool(torch.isfinite(priorities).all()) or bool((priorities <= 0).any()):
            raise ValueError("SFT pool state holds non-finite or non-positive priorities.")
        if float(meta["alpha"]) != self.alpha:
            logger.warning("Resuming the SFT pool with alpha=%s (saved with %s).", self.alpha, meta["alpha"])
        if indices.tolist() != self.indices:
            self._materialise(indices.tolist(), fit=False)
        self._pending = []
        self.priorities = priorities.clone()
        self.tree = SumMinTree(size)
        self.tree.set_all(self.priorities.pow(self.alpha))
        self.max_priority = float(meta["max_priority"])
        self.num_refreshed = int(meta.get("num_refreshed", 0))
        self.generator.set_state(tensors["rng"])


__all__ = ["SFTPool", "PrioritizedSFTPool", "SumMinTree", "sft_priority_proxy", "free_disk_bytes", "directory_nbytes"]
