# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The mixed memory pool as the trainer sees it: one object that owns the long-term SFT pool, few-shot mode and the
adapter bank, and is the only place [`TRAPOTrainer`] talks to them (the short-term replay buffer is the trainer's own
`replay`).

| part | module | switched on by |
|---|---|---|
| SFT pool, uniform epochs or prioritised replay from disk | `sft_pool.py` | `sft_sampling` |
| few-shot mode: reuse, annealed temperature, prototypes | `fewshot.py` | `fewshot_mode` |
| adapter bank: snapshots, rollback, Hub push | `adapter_bank.py` | a PEFT policy and `adapter_snapshot_steps > 0` |
| self-imitation: RL's rare successes served as SFT rows | `successes.py` | `self_imitation` |

What the trainer calls, and when:

- `take_sft(n, step)` builds the step's SFT rows (self-imitation's share first, the SFT pool the rest);
  `select_prompts(n)` picks a generation round's RL prompts;
- `observe_rollouts(batch)` once a round is finished (before its trajectories enter the replay buffer), and
  `observe_successes(batch)` with the same round for self-imitation;
- `after_forward(inputs, per_token_logps, sft_mask)` in `compute_loss`: per-row SFT feedback (priority proxies,
  few-shot prompt embeddings) stays on the device and is handed over when the next step is drawn — no host sync
  per micro-batch;
- `state_dict()` / `load_state_dict()` with TRAPO's checkpoint (JSON in `rank{r}.json`, tensors in
  `rank{r}-sft_pool.safetensors`, the bank's index in `adapter_bank.json`); `metrics()` at log time.
"""

from __future__ import annotations

import logging
import os

import torch

from ..checkpoint import CheckpointError, encode_tensors, read_state_file
from ..config import SFT
from ..experimental.fewshot import FewShotController
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


class MemoryPool:
    """The SFT pool, few-shot controller and adapter bank of one trainer (see the module docstring).

    Args:
        sft_pool ([`SFTPool`] or [`PrioritizedSFTPool`], *optional*): the long-term SFT pool (None without SFT).
        prompt_sampler ([`~trl_trapo.data.ShardedSampler`], *optional*): this rank's RL prompt indices.
        fewshot ([`~trl_trapo.fewshot.FewShotController`], *optional*): few-shot mode, when on.
        adapter_bank ([`~trl_trapo.callbacks.AdapterBankCallback`], *optional*): the adapter bank, for PEFT policies.
        rank (`int`): this process's index (names its checkpoint files).
        successes ([`~trl_trapo.memory.SuccessReplay`], *optional*): self-imitation's buffer, when on.
    """

    def __init__(
        self,
        sft_pool=None,
        prompt_sampler=None,
        fewshot: FewShotController | None = None,
        adapter_bank=None,
        rank: int = 0,
        successes: SuccessReplay | None = None,
    ):
        self.sft_pool = sft_pool
        self.successes = successes
        self.prompt_sampler = prompt_sampler
        self.fewshot = fewshot
        self.adapter_bank = adapter_bank
        self.rank = rank

    # ---- drawing ----------------------------------------------------------------------------------------------------
    def take_sft(self, n: int, step: int) -> list[dict]:
        """The step's `n` SFT rows: self-imitation's share from its buffer (when on), the rest from the SFT pool
        (few-shot preference applied when on)."""
        rows = []
        if self.successes is not None:
            rows = self.successes.take(self.successes.split(n))
            n -= len(rows)
        if n == 0:
            return rows
        if self.fewshot is not None:
            return rows + self.fewshot.sft_rows(self.sft_pool, n, step)
        return rows + self.sft_pool.take(n, step)

    def select_prompts(self, n: int, step: int) -> list[int]:
        """Dataset indices of the `n` RL prompts of optimizer step `step`'s generation round."""
        if self.fewshot is not None:
            return self.fewshot.select_prompts(n, step)
        return self.prompt_sampler.take(n)

    def rollout_temperature(self, default: float) -> float:
        """The sampling temperature of the current generation round: few-shot mode's annealed one, else `default`."""
        return self.fewshot.temperature if self.fewshot is not None else default

    # ---- feedback ---------------------------------------------------------------------------------------------------
    def observe_rollouts(self, batch) -> None:
        """A finished round ([`~trl_trapo.rollout.RolloutBatch`]), before its trajectories enter the replay buffer:
        few-shot mode stamps them with the round's temperature and folds the `(B,)` scores into its prototypes; the
        adapter bank adds the scores and the `(B,)` per-sequence KL to its window."""
        if self.fewshot is not None:
            self.fewshot.observe_rollouts(batch.scores, batch.trajectories)
        if self.adapter_bank is not None:
            self.adapter_bank.observe_rollouts(batch.scores, batch.kl)

    def observe_successes(self, batch) -> None:
        """Self-imitation's input: a finished round ([`~trl_trapo.rollout.RolloutBatch`]; its prompts, completions,
        scores, truncation and guidance flags). Nothing happens without self-imitation, nor for a round with a
        completion mask (tokens the policy did not sample would be imitated)."""
        if self.successes is None or batch.completion_mask is not None:
            return
        self.successes.observe(
            batch.prompt_ids,
            batch.completion_ids,
            batch.scores,
            batch.is_truncated,
            batch.group,
            batch.off_policy,
        )

    def after_forward(self, inputs: dict, per_token_logps: torch.Tensor, sft_mask: torch.Tensor) -> None:
        """Per-row SFT feedback of a micro-batch, left on the device until the next draw."""
        pool_index = inputs.get("pool_index")
        if pool_index is None or self.sft_pool is None:
            return
        objective = inputs["objective"]
        if self.sft_pool.wants_feedback:
            index = torch.where(objective == SFT, pool_index, torch.full_like(pool_index, -1))
            self.sft_pool.report(index, sft_priority_proxy(per_token_logps, sft_mask))
        if self.fewshot is not None:
            self.fewshot.after_forward(objective, pool_index, sft_mask)

    # ---- metrics and state --------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        out = {}
        for part in (self.sft_pool, self.fewshot, self.adapter_bank, self.successes):
            if part is not None:
                out.update(part.metrics())
        return out

    def state_dict(self, global_step: int) -> tuple[dict, dict[str, bytes]]:
        """JSON for `rank{r}.json` and the extra files of this rank's checkpoint state at optimizer step
        `global_step`."""
        state: dict = {}
        if self.successes is not None:
            state["successes"] = self.successes.state_dict()
        tensors: dict[str, torch.Tensor] = {}
        if isinstance(self.sft_pool, PrioritizedSFTPool):  # its JSON part is the trainer's "sft_pool" entry
            tensors.update({f"sft_pool/{k}": v for k, v in self.sft_pool.tensor_state().items()})
        if self.fewshot is not None:
            meta, fewshot_tensors = self.fewshot.state_dict()
            state["fewshot"] = meta
            tensors.update(fewshot_tensors)
        files = {}
        if tensors:
            files[f"rank{self.rank}-sft_pool.safetensors"] = encode_tensors(tensors, compress=False)
        if self.adapter_bank is not None and self.rank == 0:
            import json

            files["adapter_bank.json"] = json.dumps(self.adapter_bank.state_dict(global_step), indent=1).encode(
                "utf-8"
            )
        return state, files

    def load_state_dict(self, state: dict | None, checkpoint_dir: str) -> None:
        """Restore from a verified checkpoint directory.

        Raises:
            CheckpointError: naming the file, if a part this run has is missing from the checkpoint or damaged.
        """
        state = state or {}
        if self.successes is not None:
            self.successes.load_state_dict(state.get("successes"))
        directory = os.path.join(checkpoint_dir, "trapo")
        name = f"rank{self.rank}-sft_pool.safetensors"
        needs_tensors = isinstance(self.sft_pool, PrioritizedSFTPool) or self.fewshot is not None
        tensors = read_state_file(checkpoint_dir, name) if needs_tensors else None
        source = os.path.join(directory, name)
        if needs_tensors and tensors is None:
            raise CheckpointError(
                f"{source} is missing: the checkpoint was made without the prioritised SFT pool / few-shot mode this "
                "run uses. Resume with the same sft_sampling and fewshot_mode."
            )
        try:
            if isinstance(self.sft_pool, PrioritizedSFTPool):  # after the trainer restored its JSON part
                self.sft_pool.load_tensor_state(
                    {k[len("sft_pool/") :]: v for k, v in tensors.items() if k.startswith("sft_pool/")}
                )
            if self.fewshot is not None:
                if "fewshot" not in state:
                    raise KeyError("fewshot")
                self.fewshot.load_state_dict(state["fewshot"], tensors)
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{source} cannot be restored: {type(error).__name__}: {error}") from error
        if self.adapter_bank is not None:
            bank_source = os.path.join(directory, "adapter_bank.json")
            bank_state = read_state_file(checkpoint_dir, "adapter_bank.json")
            if bank_state is None:
                raise CheckpointError(f"{bank_source} is missing: the checkpoint has no adapter bank index.")
            self.adapter_bank.load_state_dict(bank_state, bank_source)


__all__ = ["MemoryPool"]
