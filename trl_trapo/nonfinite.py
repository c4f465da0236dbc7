# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Skipping an optimizer step whose loss was not finite on any rank, and stopping after `max_nonfinite_steps`.

`training_step` records each micro-batch's loss ([`NonFiniteGuard.record`], no host sync: the flag stays on the
device); the optimizer's `step`, wrapped by [`NonFiniteGuard.guard`] in `create_optimizer`, sums the flag over ranks
and, when any rank saw a NaN or an infinity, zeroes the gradients instead of stepping, so every rank skips the same
step.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any

import torch


logger = logging.getLogger(__name__)


class NonFiniteGuard:
    """Counts the optimizer steps skipped for a non-finite loss and skips them.

    Args:
        max_steps (`int`): `max_nonfinite_steps`: the run stops (`RuntimeError`) at this many skipped steps.
        reduce_sum (`Callable[[torch.Tensor], torch.Tensor]`): a tensor summed over ranks (collective).

    Attributes:
        steps (`int`): optimizer steps skipped so far (checkpointed as `nonfinite_steps`, logged as
            `train/nonfinite_steps`).
    """

    def __init__(self, max_steps: int, reduce_sum: Callable[[torch.Tensor], torch.Tensor]):
        self.max_steps, self.reduce_sum = max_steps, reduce_sum
        self.steps = 0
        self.flag = torch.zeros((), dtype=torch.bool)  # () a micro-batch of this step had a non-finite loss
        self.terms: dict[str, torch.Tensor] = {}  # objective name -> () its term was not finite in this step
        self.guarded: Any = None  # the optimizer whose step is guarded

    def record(self, loss: torch.Tensor) -> None:
        """Note whether `loss` (a micro-batch's, `()`) is finite; no host sync."""
        self.flag = self.flag.to(loss.device) | ~torch.isfinite(loss.detach())

    def record_term(self, name: str, loss: torch.Tensor) -> None:
        """Note whether objective `name`'s term (`()`, one micro-batch) is finite, so a skipped step's warning names
        the objective(s) at fault; no host sync."""
        bad = ~torch.isfinite(loss.detach())
        self.terms[name] = bad if name not in self.terms else self.terms[name].to(bad.device) | bad

    def guard(self, optimizer: Any, step: Callable[[], int]) -> Any:
        """`optimizer`, its `step` skipping (gradients zeroed) a step whose loss was not finite on any rank; an
        optimizer already guarded, or accelerate's wrapper of it (a second `train()`), is returned as it is.
        `step()` is the optimizer step for the warning."""
        inner = optimizer
        while inner is not None and inner is not self.guarded:
            inner = getattr(inner, "optimizer", None)
        if inner is None:
            original_step = optimizer.step

            def guarded_step(opt, *step_args, **step_kwargs):
                if self.consume(step()):
                    opt.zero_grad(set_to_none=True)
                    return None
                return original_step(*step_args, **step_kwargs)

            # a bound method, as torch's LR schedulers require of `optimizer.step` (they wrap its `__func__`)
            optimizer.step = types.MethodType(guarded_step, optimizer)
            self.guarded = optimizer
        return optimizer

    def consume(self, step: int) -> bool:
        """Whether the step ends skipped (collective: every rank calls it); resets the flag.

        Raises:
            RuntimeError: at the `max_steps`-th skipped step, saying what to change.
        """
        flag = self.reduce_sum(self.flag.float())
        self.flag = torch.zeros((), dtype=torch.bool)
        terms, self.terms = self.terms, {}
        if float(flag) == 0:
            return False
        self.steps += 1
        culprits = [name for name, bad in terms.items() if bool(bad)]  # read only on a skipped step
        where = (
            f" (on this rank, the loss() of objective(s) {culprits} returned NaN or inf)"
            if culprits
            else " (on another rank)"
            if terms
            else ""
        )
        logger.warning(
            "Step %d: the loss was not finite%s; the optimizer step is skipped (%d/%d allowed).",
            step,
            where,
            self.steps,
            self.max_steps,
        )
        if self.steps >= self.max_steps:
            raise RuntimeError(
                f"{self.steps} optimizer steps had a non-finite loss{where} (max_nonfinite_steps={self.max_steps}); "
                "stopping. Lower the learning rate, check the rewards for NaN/inf, the data for empty rows and a "
                "custom objective's loss() for a division by zero or log(0), or raise `max_nonfinite_steps`."
            )
        return True
