# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""How `TRAPOTrainer` plans and builds its optimizer steps: the ticket dataset that makes the Trainer loop run the
planned number of steps, and the public `get_batch_samples` hook that draws each step's rows from the three pools
(RL rows from the replay buffer, refilled by generation rounds) and splits them into micro-batches.

`StepsMixin` is one of `TRAPOTrainer`'s bases; its methods are the trainer's own and use its attributes.
"""

from __future__ import annotations

import math

import torch
from datasets import Dataset

from .collator import collate_rows, split_micro_batches
from .config import TRAPOConfig
from .curriculum import CurriculumSchedule
from .data import PRETRAIN, RL, SFT
from .distributed import any_rank
from .memory import trajectory_row


COUNT_KEYS = ("tokens_pretrain", "tokens_sft", "tokens_rl", "sequences_rl", "micro_batches_rl")


class _StepTickets(torch.utils.data.Dataset):
    """The Trainer's train dataset: one placeholder item per row slot, so its epoch and step bookkeeping works.

    The real rows are drawn by `TRAPOTrainer.get_batch_samples` from the three objectives' pools.
    """

    def __init__(self, length: int):
        self.length = max(int(length), 1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, int]:
        return {"ticket": index}


def _ticket_collator(features: list[dict]) -> dict[str, torch.Tensor]:
    return {"ticket": torch.tensor([f["ticket"] for f in features])}


class StepsMixin:
    """`TRAPOTrainer`'s step planning and step building (public Trainer hook: `get_batch_samples`)."""

    # =================================================================================================================
    # Planning the run
    # =================================================================================================================
    def _plan_steps(self, args: TRAPOConfig) -> tuple[int, int]:
        """Planned optimizer steps N, and the length of the ticket dataset that makes the Trainer run N steps.

        `max_steps` wins. Otherwise N follows from the "primary" dataset at its mean curriculum share: the RL prompts
        (each of `total_episodes` — or `num_train_epochs` x prompts x `num_generations` — completions used
        `num_ppo_epochs` times), else the SFT rows, else the map-style pretraining documents. `total_episodes` fixes
        the length of the run whatever `num_train_epochs` says: the trainer's copy of the config gets
        `max_steps = N` (see `__init__`).
        """
        world = max(args.world_size, 1)
        rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
        if args.max_steps > 0:
            return args.max_steps, rows_per_step * args.max_steps
        shares = CurriculumSchedule(
            args.curriculum_boundaries,
            [args.curriculum_mixtures[i : i + 3] for i in range(0, len(args.curriculum_mixtures), 3)],
            1000,
            args.curriculum_decay_steps,
            active=tuple(a and c > 0 for a, c in zip(self.active, args.objective_weights)),
            mode="constant",
        ).mixture(0)
        epochs = args.num_train_epochs
        if self.active[RL]:
            group = 1 if self._has_critic else args.num_generations
            completions = args.total_episodes or len(self._rl_dataset) * group * epochs
            rows, share = completions * args.num_ppo_epochs, shares[RL]
        elif self.active[SFT]:
            rows, share = len(self._sft_dataset) * epochs, shares[SFT]
        elif isinstance(self._pretrain_source, Dataset):
            rows, share = len(self._pretrain_source) * epochs, shares[PRETRAIN]
        else:
            raise ValueError(
                "With only a streaming `pretrain_dataset`, the number of steps cannot be derived: set `max_steps`."
            )
        total = max(math.ceil(rows / (rows_per_step * share)), 1)
        if args.total_episodes is not None:
            return total, rows_per_step * total
        steps_per_epoch = max(math.ceil(total / epochs), 1)
        return total, steps_per_epoch * rows_per_step

    # =================================================================================================================
    # Building a step (public Trainer hook: get_batch_samples)
    # =================================================================================================================
    def get_batch_samples(self, epoch_iterator, num_batches: int, device) -> tuple[list, dict | None]:
        """Draw this optimizer step's rows from the three pools and split them into `num_batches` micro-batches.

        Returns `(micro_batches, step_info)`; `step_info` (passed to `compute_loss` as `num_items_in_batch`) holds the
        loss weights and the global per-objective counts of the whole step.
        """
        tickets = []
        for _ in range(num_batches):
            try:
                tickets.append(next(epoch_iterator))
            except StopIteration:
                break
        if not tickets:
            return [], None
        return self._build_step(len(tickets))

    def _build_step(self, num_micro: int) -> tuple[list[dict], dict]:
        args = self.args
        step = self.state.global_step
        self._last_step_built = step
        # step 1. shares and weights
        shares = self.curriculum.mixture(step)
        weights = self.dare.step_weights(args.objective_weights, shares)
        self._last_shares = shares
        # step 2. rows
        counts = self.allocator.allocate(args.per_device_train_batch_size * num_micro, shares)
        rows: list[dict] = []
        if counts[PRETRAIN]:
            rows += self._pretrain_stream.take(counts[PRETRAIN])
        if counts[SFT]:
            rows += self.memory_pool.take_sft(counts[SFT], step)
        if counts[RL]:
            rows += self._take_rl(counts[RL], step)
        order = torch.randperm(len(rows), generator=self._row_generator).tolist()
        for position, index in enumerate(order):
            rows[index]["half"] = position % 2
        # step 3. micro-batches
        groups = split_micro_batches(rows, num_micro)
        batches = [collate_rows(group, self.processing_class.pad_token_id) for group in groups]
        # step 4. global counts
        local = torch.zeros(len(COUNT_KEYS), dtype=torch.float64)
        for batch in batches:
            token_counts = batch["mask"].sum(-1)
            for o, key in ((PRETRAIN, 0), (SFT, 1), (RL, 2)):
                local[key] += token_counts[batch["objective"] == o].sum()
            rl_rows = (batch["objective"] == RL) & (token_counts > 0)
            local[3] += rl_rows.sum()
            local[4] += float(rl_rows.any())
        total = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").cpu()
        probe = self.dare.begin_step(step)
        info = {
            "weights": weights,
            "counts": dict(zip(COUNT_KEYS, total.tolist())),
            "probe": probe,
            "step": step,
            "micro_index": 0,
            "num_micro": num_micro,
        }
        self._step_context = info
        return batches, info

    def _take_rl(self, n: int, step: int) -> list[dict]:
        for _ in range(20):
            # every rank generates when any rank needs to: a round gathers ZeRO-3 weights (a collective), and
            # replay buffers can differ across ranks (rewards of None drop rollouts)
            if not any_rank(self.accelerator, self.replay.num_available(step) < n):
                break
            self._generate_round(n, step)
        else:
            raise RuntimeError(
                "20 generation rounds in a row produced no usable trajectory: every reward function returned None "
                "or NaN (both mean 'no reward for this sample', as in TRL) for every completion. Check the reward "
                "functions: `rewards/<function>/mean` is logged only over the samples they scored."
            )
        return [trajectory_row(t) for t in self.replay.sample(n, step)]
