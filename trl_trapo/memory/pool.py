# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The mixed memory pool as the trainer sees it: one object that owns the RL prompt sampler, the long-term SFT pool,
an optional sample selector (few-shot mode), self-imitation and the adapter bank, and is the only place
[`TRAPOTrainer`] talks to them (the short-term replay buffer is the trainer's own `replay`).

| part | module | switched on by |
|---|---|---|
| RL prompt sampler: seeded epochs over this rank's shard | `ShardedSampler` (`trl_trapo/data.py`) | RL prompts |
| SFT pool, uniform epochs or prioritised replay from disk | `sft_pool.py` | `sft_sampling` |
| sample selector: picks RL prompts and SFT rows, sets the rollout temperature | a `SampleSelector` | a trainer hook |
| adapter bank: snapshots, rollback, Hub push | `adapter_bank.py` | a PEFT policy and `adapter_snapshot_steps > 0` |
| self-imitation: RL's rare successes served as SFT rows | `successes.py` | `self_imitation` |

The sample selector is whatever the trainer's `build_sample_selector` hook returns (none in [`TRAPOTrainer`]); few-shot
mode's is `trl_trapo/experimental/fewshot.py`'s `FewShotController`, built by `FewShotTRAPOTrainer` with
`fewshot_mode=True`.

What the trainer calls, and when:

- `take_sft(n, step)` builds the step's SFT rows (self-imitation's share first, the SFT pool the rest);
  `select_prompts(n)` picks a generation round's RL prompts;
- `observe_rollouts(batch)` once a round is finished (before its trajectories enter the replay buffer), and
  `observe_successes(batch)` with the same round for self-imitation;
- `after_forward(inputs, per_token_logps, sft_mask, rows)` in `compute_loss`: per-row SFT feedback (priority proxies,
  the selector's prompt embeddings) stays on the device and is handed over when the next step is drawn — no host
  sync per micro-batch;
- `state_dict()` / `load_state_dict()` with TRAPO's checkpoint: the state of every part the pool owns (the
  `memory_pool` entry of `rank{r}.json`, tensors in `rank{r}-sft_pool.safetensors`, the bank's index in
  `adapter_bank.json`); `memory_pool_state` reads checkpoints of earlier versions too; `metrics()` at log time.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

import torch

from ..checkpoint import CheckpointError, encode_tensors, read_state_file
from ..collator import MODEL_INPUTS, Row
from ..vision import examples_model_inputs
from .replay import Trajectory
from .sft_pool import PrioritizedSFTPool, SFTPool, free_disk_bytes, sft_priority_proxy
from .successes import SuccessReplay


logger = logging.getLogger(__name__)

DEFAULT_DISK_FRACTION = 0.05


def build_sft_pool(args, sft_dataset, total_steps: int, rank: int, world_size: int) -> SFTPool | PrioritizedSFTPool:
    """The long-term SFT pool `args.sft_sampling` asks for, over this rank's shard of the tokenized `sft_dataset`.

    The prioritised pool keeps a memory-mapped Arrow copy under `output_dir/sft_pool/rank{r}` within
    `sft_pool_max_bytes` (default: 5 % of the free disk there).
    """
    if args.sft_sampling == "prioritized":
        budget = args.sft_pool_max_bytes
        if budget is None:
            budget = int(DEFAULT_DISK_FRACTION * free_disk_bytes(args.output_dir))
        return PrioritizedSFTPool(
            sft_dataset,
            os.path.join(args.output_dir, "sft_pool", f"rank{rank}"),
            alpha=args.sft_priority_alpha,
            beta=args.sft_priority_beta,
            total_steps=total_steps,
            max_bytes=budget,
            seed=args.sampling_seed + 1,
            rank=rank,
            world_size=world_size,
        )
    return SFTPool(sft_dataset, seed=args.sampling_seed + 1, rank=rank, world_size=world_size)


class SampleSelector(Protocol):
    """What the memory pool asks of an object that chooses the training samples in place of the plain samplers.

    The pool draws RL prompts from its prompt sampler and SFT rows from its SFT pool in their own order unless it has
    a selector; then the selector picks them (it draws its candidates from the same sampler and pool) and sets each
    generation round's sampling temperature. The trainer builds one in its `build_sample_selector` hook (none by
    default); few-shot mode's [`~trl_trapo.experimental.fewshot.FewShotController`] is one. A selector holds its
    own checkpointed state (RNG included) and never changes the config.

    Attributes:
        temperature (`float`): the sampling temperature of the current generation round (set by `select_prompts`).
    """

    temperature: float

    def select_prompts(self, n: int, step: int) -> list[int]:
        """Dataset indices of the `n` RL prompts of optimizer step `step`'s generation round; sets `temperature`."""
        ...

    def sft_rows(self, pool, n: int, step: int) -> list[Row]:
        """The step's `n` SFT rows (`Row`s with `pool_index`), drawn from `pool` (the [`SFTPool`] or
        [`PrioritizedSFTPool`]) at optimizer step `step`."""
        ...

    def observe_rollouts(self, scores: torch.Tensor, trajectories: list[Trajectory]) -> None:
        """A scored generation round: `(B,)` scores (NaN = no reward), prompts repeated in consecutive groups as
        generated, and the trajectories of the completions with a score, before they enter the replay buffer (each
        carries the temperature its source sampled it at, which it is trained at: a selector leaves it)."""
        ...

    def after_forward(self, rows: torch.Tensor, pool_index: torch.Tensor, mask: torch.Tensor) -> None:
        """A training micro-batch: `(B,)` bool, the SFT objective's rows, and `(B,)` SFT-pool slot (-1 for rows not
        from the pool) of each row, and the `(B, T)` target-aligned mask of the SFT completion tokens. Must not sync
        with the host."""
        ...

    def metrics(self) -> dict[str, float]:
        """Namespaced metrics (e.g. `fewshot/*`) logged at log time."""
        ...

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """`(meta, tensors)`: JSON-serialisable state (kept in the `memory_pool` entry of `rank{r}.json`) and CPU
        tensors with keys namespaced by the selector (kept in `rank{r}-sft_pool.safetensors`)."""
        ...

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Restore `state_dict()`'s output; raises `KeyError` / `TypeError` / `ValueError` if it does not fit."""
        ...


def memory_pool_state(rank_state: dict) -> dict:
    """The memory pool's part of a rank's checkpoint state (`rank{r}.json`), in the layout `MemoryPool.state_dict`
    writes.

    Checkpoints written before the pool owned all of its state keep the prompt sampler's and the SFT pool's JSON at the
    top level of the rank state (`prompt_sampler`, `sft_pool`) and few-shot mode's state under `fewshot` (now
    `selector`); they are read as if written now.

    Args:
        rank_state (`dict`): the whole JSON state of one rank.

    Returns:
        `dict`: what `MemoryPool.load_state_dict` takes (a new dict; `rank_state` is not changed).
    """
    state = dict(rank_state.get("memory_pool") or {})
    for name in ("prompt_sampler", "sft_pool"):
        if name not in state and name in rank_state:
            state[name] = rank_state[name]
    if "fewshot" in state and "selector" not in state:
        state["selector"] = state.pop("fewshot")
    return state


class MemoryPool:
    """The RL prompt sampler, SFT pool, sample selector, self-imitation buffer and adapter bank of one trainer (see the
    module docstring).

    Args:
        sft_pool ([`SFTPool`] or [`PrioritizedSFTPool`], *optional*): the long-term SFT pool (None without SFT).
        prompt_sampler ([`~trl_trapo.data.ShardedSampler`], *optional*): this rank's RL prompt indices (None without
            RL prompts).
        selector ([`SampleSelector`], *optional*): picks RL prompts and SFT rows and sets the rollout temperature
            (few-shot mode); None: the sampler's and the SFT pool's own order, the configured temperature.
        adapter_bank ([`~trl_trapo.callbacks.AdapterBankCallback`], *optional*): the adapter bank, for PEFT policies.
        rank (`int`): this process's index (names its checkpoint files).
        successes ([`~trl_trapo.memory.SuccessReplay`], *optional*): self-imitation's buffer, when on.
    """

    def __init__(
        self,
        sft_pool=None,
        prompt_sampler=None,
        selector: SampleSelector | None = None,
        adapter_bank=None,
        rank: int = 0,
        successes: SuccessReplay | None = None,
    ):
        self.sft_pool = sft_pool
        self.successes = successes
        self.prompt_sampler = prompt_sampler
        self.selector = selector
        self.adapter_bank = adapter_bank
        self.rank = rank

    # ---- drawing ----------------------------------------------------------------------------------------------------
    def take_sft(self, n: int, step: int) -> list[dict]:
        """The step's `n` SFT rows: self-imitation's share from its buffer (when on), the rest from the SFT pool
        (through the selector, when there is one)."""
        rows = []
        if self.successes is not None:
            rows = self.successes.take(self.successes.split(n))
            n -= len(rows)
        if n == 0:
            return rows
        if self.selector is not None:
            return rows + self.selector.sft_rows(self.sft_pool, n, step)
        return rows + self.sft_pool.take(n, step)

    def select_prompts(self, n: int, step: int) -> list[int]:
        """Dataset indices of the `n` RL prompts of optimizer step `step`'s generation round."""
        if self.selector is not None:
            return self.selector.select_prompts(n, step)
        return self.prompt_sampler.take(n)

    def rollout_temperature(self, default: float) -> float:
        """The sampling temperature of the current generation round: the selector's (few-shot mode anneals it), else
        `default`."""
        return self.selector.temperature if self.selector is not None else default

    # ---- feedback ---------------------------------------------------------------------------------------------------
    def observe_rollouts(self, batch) -> None:
        """A finished round ([`~trl_trapo.rollout.RolloutBatch`]), before its trajectories enter the replay buffer:
        the sample selector (few-shot mode) folds the `(B,)` scores into its prototypes; the adapter bank adds the
        scores and the `(B,)` per-sequence KL to its window."""
        if self.selector is not None:
            self.selector.observe_rollouts(batch.scores, batch.trajectories)
        if self.adapter_bank is not None:
            self.adapter_bank.observe_rollouts(batch.scores, batch.kl)

    def observe_successes(self, batch) -> None:
        """Self-imitation's input: a finished round ([`~trl_trapo.rollout.RolloutBatch`]; its prompts, completions,
        scores, truncation and guidance flags, and its completion mask: a multi-turn success is imitated on the
        policy's tokens only). Nothing happens without self-imitation."""
        if self.successes is None:
            return
        self.successes.observe(
            batch.prompt_ids,
            batch.completion_ids,
            batch.scores,
            batch.is_truncated,
            batch.group,
            batch.off_policy,
            batch.completion_mask,
            examples_model_inputs(batch.examples, MODEL_INPUTS),  # a VLM prompt's images ride with its success
        )

    def after_forward(
        self, inputs: dict, per_token_logps: torch.Tensor, sft_mask: torch.Tensor, rows: torch.Tensor
    ) -> None:
        """Per-row SFT feedback of a micro-batch (`rows`: `(B,)` bool, the SFT objective's rows), left on the device
        until the next draw."""
        pool_index = inputs.get("pool_index")
        if pool_index is None or self.sft_pool is None:
            return
        if self.sft_pool.wants_feedback:
            index = torch.where(rows, pool_index, torch.full_like(pool_index, -1))
            self.sft_pool.report(index, sft_priority_proxy(per_token_logps, sft_mask))
        if self.selector is not None:
            self.selector.after_forward(rows, pool_index, sft_mask)

    # ---- metrics and state --------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        out = {}
        for part in (self.sft_pool, self.selector, self.adapter_bank, self.successes):
            if part is not None:
                out.update(part.metrics())
        return out

    def state_dict(self, global_step: int) -> tuple[dict, dict[str, bytes]]:
        """This rank's state of every part the pool owns, at optimizer step `global_step`.

        Returns:
            `tuple[dict, dict[str, bytes]]`: the JSON of the `memory_pool` entry of `rank{r}.json` (`prompt_sampler`
            and `sft_pool`, None for a part this run does not have; `successes` and `selector` when there are) and
            the extra files by name inside `trapo/` (`rank{r}-sft_pool.safetensors` with the prioritised pool's and
            the selector's tensors and self-imitation's model inputs; `adapter_bank.json` on rank 0).
        """
        state: dict = {
            "prompt_sampler": self.prompt_sampler.state_dict() if self.prompt_sampler else None,
            "sft_pool": self.sft_pool.state_dict() if self.sft_pool else None,  # the prioritised pool's JSON part
        }
        tensors: dict[str, torch.Tensor] = {}
        if self.successes is not None:
            state["successes"], success_tensors = self.successes.state_dict()
            tensors.update({f"successes/{k}": v for k, v in success_tensors.items()})
        if isinstance(self.sft_pool, PrioritizedSFTPool):
            tensors.update({f"sft_pool/{k}": v for k, v in self.sft_pool.tensor_state().items()})
        if self.selector is not None:
            meta, selector_tensors = self.selector.state_dict()
            state["selector"] = meta
            tensors.update(selector_tensors)
        files = {}
        if tensors:
            files[f"rank{self.rank}-sft_pool.safetensors"] = encode_tensors(tensors, compress=False)
        if self.adapter_bank is not None and self.rank == 0:
            import json

            files["adapter_bank.json"] = json.dumps(self.adapter_bank.state_dict(global_step), indent=1).encode(
                "utf-8"
            )
        return state, files

    def check_datasets(self, state: dict, checkpoint_dir: str) -> None:
        """Check that the checkpoint was made with the same set of datasets as this run (RL prompts, SFT data), before
        anything is restored.

        Args:
            state (`dict`): the pool's part of the rank state (see `memory_pool_state`).
            checkpoint_dir (`str`): the checkpoint directory (names the file in the error).

        Raises:
            CheckpointError: naming `rank{r}.json`, if the checkpoint has a prompt sampler or an SFT pool this run does
                not have, or the other way round.
        """
        source = os.path.join(checkpoint_dir, "trapo", f"rank{self.rank}.json")
        for name, part in (("prompt_sampler", self.prompt_sampler), ("sft_pool", self.sft_pool)):
            if (state.get(name) is None) != (part is None):
                raise CheckpointError(
                    f"{source}: the checkpoint was made with a different set of datasets ('{name}' "
                    f"{'missing' if state.get(name) is None else 'present'}); resume with the same datasets."
                )

    def load_state_dict(self, state: dict | None, checkpoint_dir: str) -> None:
        """Restore from a verified checkpoint directory what `state_dict` wrote.

        Args:
            state (`dict`, *optional*): the pool's part of the rank state (`memory_pool_state` of `rank{r}.json`).
            checkpoint_dir (`str`): the checkpoint directory, for the pool's own files.

        Raises:
            CheckpointError: naming the file, if the checkpoint was made with other datasets (see `check_datasets`),
                or a part this run has is missing from the checkpoint or damaged.
        """
        state = state or {}
        self.check_datasets(state, checkpoint_dir)
        rank_source = os.path.join(checkpoint_dir, "trapo", f"rank{self.rank}.json")
        try:
            for name, part in (("prompt_sampler", self.prompt_sampler), ("sft_pool", self.sft_pool)):
                if part is not None:
                    part.load_state_dict(state[name])  # the prioritised pool's JSON part, before its tensors
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{rank_source} cannot be restored: {type(error).__name__}: {error}") from error
        directory = os.path.join(checkpoint_dir, "trapo")
        name = f"rank{self.rank}-sft_pool.safetensors"
        source = os.path.join(directory, name)
        successes = state.get("successes") if self.successes is not None else None
        has_refs = any(
            isinstance(ref, str)
            for row in (successes or {}).get("rows", [])
            for ref in row.get("model_inputs", {}).values()
        )
        needs_tensors = isinstance(self.sft_pool, PrioritizedSFTPool) or self.selector is not None or has_refs
        tensors = read_state_file(checkpoint_dir, name) if needs_tensors else None
        if needs_tensors and tensors is None:
            raise CheckpointError(
                f"{source} is missing: the checkpoint was made without the prioritised SFT pool / few-shot mode this "
                "run uses, or its self-imitation successes' model inputs are gone. Resume with the same sft_sampling "
                "and fewshot_mode, from a complete checkpoint."
            )
        if self.successes is not None:
            prefix = "successes/"
            try:
                self.successes.load_state_dict(
                    successes, {k[len(prefix) :]: v for k, v in (tensors or {}).items() if k.startswith(prefix)}
                )
            except (KeyError, TypeError, ValueError) as error:
                raise CheckpointError(f"{source} cannot be restored: {type(error).__name__}: {error}") from error
        try:
            if isinstance(self.sft_pool, PrioritizedSFTPool):
                self.sft_pool.load_tensor_state(
                    {k[len("sft_pool/") :]: v for k, v in tensors.items() if k.startswith("sft_pool/")}
                )
            if self.selector is not None:
                if "selector" not in state:
                    raise KeyError("selector")
                self.selector.load_state_dict(state["selector"], tensors)
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{source} cannot be restored: {type(error).__name__}: {error}") from error
        if self.adapter_bank is not None:
            bank_source = os.path.join(directory, "adapter_bank.json")
            bank_state = read_state_file(checkpoint_dir, "adapter_bank.json")
            if bank_state is None:
                raise CheckpointError(f"{bank_source} is missing: the checkpoint has no adapter bank index.")
            self.adapter_bank.load_state_dict(bank_state, bank_source)


__all__ = ["MemoryPool", "SampleSelector", "build_sft_pool", "memory_pool_state"]
