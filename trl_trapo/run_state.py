# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""TRAPO's own per-rank state in a checkpoint (`checkpoint-N/trapo/`), next to what the `Trainer` saves.

[`RunState`] gathers it from the collaborators that own it — each objective, the RL objective's supply (episode,
replay buffer, exploration, the rollout source's rounds in flight), the memory pool, the step controls (allocator,
DARE, RL schedules), the non-finite guard, the random generators and a moving reference — and writes it with
`checkpoint.write_rank_state`; `load` restores it in the order that gives the clearest error first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .checkpoint import DATASETS_FILE, CheckpointError, read_rank_state, restore_rng, rng_tensors, write_rank_state
from .memory import memory_pool_state
from .objectives import Objective, load_objective_states


FORMAT = 1


class RunState:
    """Writes and restores TRAPO's per-rank state (see the module docstring).

    Args:
        accelerator (`accelerate.Accelerator`): the `Trainer`'s (this rank, the barriers).
        global_step (`Callable[[], int]`): the `Trainer`'s current step.
        objectives (`list[Objective]`): each one's `state_dict()`, keyed by its name.
        nonfinite ([`~trl_trapo.nonfinite.NonFiniteGuard`]): checkpointed by its own `state_dict()`, as are the
            next five.
        allocator ([`~trl_trapo.collator.RowAllocator`]): the rows' allocation state.
        dare ([`~trl_trapo.weighting.DARE`]): the weighting's state.
        schedules ([`~trl_trapo.schedules.RLSchedules`]): the RL schedules' state.
        rl_supply ([`~trl_trapo.rl_supply.RLSupply`]): the replay buffer's and the source's state.
        memory_pool ([`~trl_trapo.memory.MemoryPool`]): the memory pool's state.
        reference ([`~trl_trapo.models.ReferencePolicy`], *optional*): the KL's reference (its moving weights).
        generators (`Callable[[], dict[str, torch.Generator]]`): the random generators to checkpoint, by name.
        policy (`Callable[[], nn.Module]`): the unwrapped policy (a reference adapter's weights live in it).
        sync_reference (`bool`): the reference moves during the run (`sync_ref_model`): its weights are saved.
        datasets_summary (`dict`): the datasets of the run, written by rank 0 to refuse resuming with others.
        on_complete (`Callable[[str], None]`): called once every rank's state is in (the checkpoint is complete).
    """

    def __init__(
        self,
        accelerator: Any,
        global_step: Callable[[], int],
        objectives: Sequence[Objective],
        *,
        nonfinite: Any,
        allocator: Any,
        dare: Any,
        schedules: Any,
        rl_supply: Any,
        memory_pool: Any,
        reference: Any,
        generators: Callable[[], dict[str, torch.Generator]],
        policy: Callable[[], Any],
        sync_reference: bool,
        datasets_summary: dict,
        on_complete: Callable[[str], None],
    ):
        self.accelerator, self.global_step, self.objectives = accelerator, global_step, list(objectives)
        self.nonfinite, self.allocator, self.dare, self.schedules = nonfinite, allocator, dare, schedules
        self.rl_supply, self.memory_pool, self.reference = rl_supply, memory_pool, reference
        self.generators, self.policy, self.sync_reference = generators, policy, sync_reference
        self.datasets_summary, self.on_complete = datasets_summary, on_complete

    def save(self, checkpoint_dir: str) -> None:
        """Write this rank's state into `checkpoint_dir/trapo/` (called by `StateCheckpointCallback`; collective)."""
        # the RL supply's: episode, replay buffer, exploration, and the rollout source's own state (rounds in flight)
        supply_meta, supply_tensors = self.rl_supply.state_dict()
        step = self.global_step()
        state = {
            "format": FORMAT,
            "global_step": step,
            "world_size": self.accelerator.num_processes,
            "nonfinite_steps": self.nonfinite.steps,
            "allocator": self.allocator.state_dict(),
            "dare": self.dare.engine.state_dict(),
            # each objective's own state (the pretraining stream's position, ...); keyed by name
            "objectives": {o.name: o.state_dict() for o in self.objectives},
            # each objective's static weight (multiplier), to warn when a resumed run's differ (warn_weights_changed)
            "static_weights": {o.name: o.weight for o in self.objectives},
            "schedules": self.schedules.state_dict(),
            **supply_meta,
        }
        # prompt sampler, SFT pool (priorities), sample selector (few-shot mode), self-imitation, adapter bank
        state["memory_pool"], memory_files = self.memory_pool.state_dict(step)
        if self.accelerator.process_index == 0:  # the datasets it was trained on (check_checkpoint_fits)
            memory_files[DATASETS_FILE] = json.dumps(self.datasets_summary, indent=1).encode("utf-8")
        tensors = {**supply_tensors, **rng_tensors(self.generators())}
        if self.sync_reference and self.reference is not None:  # the reference has moved: keep it
            tensors.update(self.reference.state_tensors(self.policy()))
        compress = self.rl_supply.replay.nbytes > 64 * 2**20
        self.accelerator.wait_for_everyone()  # rank 0 fingerprints the Trainer's files: they must be complete
        write_rank_state(checkpoint_dir, self.accelerator.process_index, state, tensors, compress, memory_files)
        self.accelerator.wait_for_everyone()  # every rank's marker is in: the checkpoint is complete
        self.on_complete(checkpoint_dir)

    def load(self, checkpoint_dir: str) -> None:
        """Restore what `save` wrote (this rank's part).

        Raises:
            CheckpointError: naming the file, if the state is missing, damaged, or made with other datasets.
        """
        rank = self.accelerator.process_index
        state, tensors = read_rank_state(checkpoint_dir, rank)
        source = os.path.join(checkpoint_dir, "trapo", f"rank{rank}.json")
        pool = self.memory_pool
        try:
            if state.get("format") != FORMAT:
                raise CheckpointError(f"{source} has an unknown format {state.get('format')!r}.")
            pool_state = memory_pool_state(state)  # this layout, or the earlier one (samplers at the top level)
            pool.check_datasets(pool_state, checkpoint_dir)  # the clearest error first, before anything is restored
            load_objective_states(self.objectives, state, source)  # checked first: same objectives, datasets
            self.nonfinite.steps = int(state["nonfinite_steps"])
            self.allocator.load_state_dict(state["allocator"])
            self.dare.load_state_dict(state["dare"])  # a static state into an adaptive strategy: it starts fresh
            self.schedules.load_state_dict(state.get("schedules"))
            self.rl_supply.load_state_dict(state, tensors, source)  # episode, exploration, replay, the source's state
            restore_rng(self.generators(), tensors, source)
            if self.reference is not None:
                self.reference.load_state_tensors(self.policy(), tensors)
            pool.load_state_dict(pool_state, checkpoint_dir)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{source} cannot be restored: {type(error).__name__}: {error}") from error
