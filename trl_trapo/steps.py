# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Building one optimizer step's rows (what `TRAPOTrainer.get_batch_samples` returns).

1. the curriculum gives the step's shares of rows per objective and DARE's factors turn them into loss weights;
2. the row allocator turns the shares into counts, each objective serves its rows (`objective.take`), and the rows
   are shuffled and split in two halves (DARE's split-half probe);
3. the rows are split into gradient-accumulation micro-batches of similar length and right-padded;
4. the per-objective counts of the whole step are summed over micro-batches and ranks into its [`StepContext`].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .collator import RowAllocator, StepContext, collate_rows, split_micro_batches
from .curriculum import CurriculumSchedule
from .objectives import Objective, check_served_rows, count_keys, step_counts
from .weighting import DARE


class StepBuilder:
    """Builds each optimizer step's micro-batches and [`StepContext`], and remembers the last step's shares.

    Args:
        rows_per_micro_batch (`int`): rows per micro-batch on this rank (`per_device_train_batch_size`).
        objectives (`list[Objective]`): the run's objectives, in the order of their names.
        allocator ([`~trl_trapo.collator.RowAllocator`]): turns shares into row counts.
        curriculum ([`~trl_trapo.curriculum.CurriculumSchedule`]): each step's shares.
        dare ([`~trl_trapo.weighting.DARE`]): each step's loss weights and its gradient probe.
        padding_id (`int`): the id in padding positions.
        reduce_sum (`Callable[[torch.Tensor], torch.Tensor]`): a tensor summed over ranks.
        seed (`int`): seeds the shuffle of a step's rows (this rank's: `seed + 4 + rank`).
        vocab_size (`int`, *optional*): the policy's embedding rows; an objective's rows holding an id outside
            [0, vocab_size) are refused, naming the objective ([`~trl_trapo.objectives.check_served_rows`]).
        context (`int`, *optional*): the policy's positions; an objective's row with more tokens is refused.
        on_start (`Callable[[], None]`, *optional*): called as a step starts being built (the metrics' `step_time`).
    """

    def __init__(
        self,
        rows_per_micro_batch: int,
        objectives: Sequence[Objective],
        allocator: RowAllocator,
        curriculum: CurriculumSchedule,
        dare: DARE,
        padding_id: int,
        reduce_sum: Callable[[torch.Tensor], torch.Tensor],
        seed: int,
        vocab_size: int | None = None,
        context: int | None = None,
        on_start: Callable[[], None] | None = None,
    ):
        self.on_start = on_start
        self.rows_per_micro_batch = rows_per_micro_batch
        self.objectives = list(objectives)
        self.allocator, self.curriculum, self.dare = allocator, curriculum, dare
        self.padding_id = padding_id
        self.vocab_size, self.context = vocab_size, context
        self.reduce_sum = reduce_sum
        self.generator = torch.Generator().manual_seed(seed)  # checkpointed as "rows" (trl_trapo/run_state.py)
        self.last_step = 0
        self.last_shares = curriculum.mixture(0)

    def build(self, step: int, num_micro: int) -> tuple[list[dict], StepContext]:
        """This rank's `num_micro` micro-batches of step `step` and the step's context (collective: every rank calls
        it at the same step)."""
        if self.on_start is not None:
            self.on_start()
        self.last_step = step
        # step 1. shares and weights
        shares = self.curriculum.mixture(step)
        weights = self.dare.step_weights([o.weight for o in self.objectives], shares)
        self.last_shares = shares
        # step 2. rows, from each objective's own source
        counts = self.allocator.allocate(self.rows_per_micro_batch * num_micro, shares)
        rows = []
        for objective, count in zip(self.objectives, counts):
            if count:
                served = objective.take(count, step)
                check_served_rows(objective, served, count, self.vocab_size, self.context)
                rows += served
        order = torch.randperm(len(rows), generator=self.generator).tolist()
        for position, index in enumerate(order):
            rows[index].half = position % 2
        # step 3. micro-batches
        batches = [collate_rows(group, self.padding_id) for group in split_micro_batches(rows, num_micro)]
        # step 4. global counts
        total = self.reduce_sum(step_counts(batches, self.objectives))
        context = StepContext(
            step=step,
            weights=weights,
            counts=dict(zip(count_keys(self.objectives), total.tolist())),
            probe=self.dare.begin_step(step),
            num_micro=num_micro,
        )
        return batches, context

    def metrics(self) -> dict[str, float]:
        """The curriculum's metrics at the last step built (`curriculum/<name>`, ...)."""
        return self.curriculum.metrics(self.last_step, self.last_shares)
