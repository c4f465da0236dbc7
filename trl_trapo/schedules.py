# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Hyper-parameter schedules of the source document's recipe: learning rate and entropy bonus by curriculum phase,
and the KL coefficient (fixed, or adaptive through a [`~trl_trapo.controllers.Controller`]).

The source document gives: learning rate 5e-5, lowered to 3e-5 in the RL phase; KL coefficient 0.2, then adaptive
within 0.1-0.3; entropy coefficient 0.01, lowered to 0.005 late in training. It does not say how the KL coefficient
adapts; we use the proportional controller of Ziegler et al. (see `controllers.py`).

"The RL phase" and "late" are read as the curriculum's last phase (default: the last 20 % of steps, mixture
10/30/60), the one where RL has the largest share. From its first step the learning rate's *peak* becomes
`rl_phase_learning_rate` — the scheduler's warm-up / decay shape is kept, only its scale changes — and
`entropy_coef` becomes `late_entropy_coef`. Both are pure functions of the optimizer step: the learning-rate scale
multiplies the scheduler's own factor inside the scheduler ([`scale_scheduler`], applied through the trainer's public
`create_scheduler` hook), so a resumed run needs no special case.

Differences from the source: the switches are immediate at the phase boundary (the document gives no transition);
the KL controller is updated once per optimizer step on the rollouts generated for it, reduced over all ranks, so
every rank uses the same coefficient. The config is never changed: the values in use live here and are logged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .controllers import AdaptiveKLController, FixedKLController


class PhaseValues:
    """Learning-rate scale and entropy coefficient as pure functions of the optimizer step.

    Args:
        late_start (`float` or None): first step of the late (RL-heavy) phase; None: there is none.
        learning_rate (`float`): the configured peak learning rate.
        rl_phase_learning_rate (`float`, *optional*): peak learning rate from `late_start` on.
        entropy_coef (`float`): entropy coefficient before `late_start`.
        late_entropy_coef (`float`, *optional*): entropy coefficient from `late_start` on.
    """

    def __init__(
        self,
        late_start: float | None,
        learning_rate: float,
        rl_phase_learning_rate: float | None = None,
        entropy_coef: float = 0.0,
        late_entropy_coef: float | None = None,
    ):
        self.late_start = late_start
        self.late_lr_scale = 1.0 if rl_phase_learning_rate is None else rl_phase_learning_rate / learning_rate
        self.entropy_coef = entropy_coef
        self.late_entropy_coef = entropy_coef if late_entropy_coef is None else late_entropy_coef

    def is_late(self, step: int) -> bool:
        return self.late_start is not None and step >= self.late_start

    def lr_scale(self, step: int) -> float:
        """Multiplier of the scheduler's base learning rates at `step` (1.0 before the late phase)."""
        return self.late_lr_scale if self.is_late(step) else 1.0

    def entropy(self, step: int) -> float:
        """Entropy coefficient at `step`."""
        return self.late_entropy_coef if self.is_late(step) else self.entropy_coef


def scale_scheduler(scheduler, lr_scale: Callable[[int], float]) -> None:
    """Multiply every factor of a `LambdaLR` learning-rate scheduler by `lr_scale(step)`, in place.

    The scheduler's learning rate at step t becomes base_lr * lambda(t) * lr_scale(t), for a scheduler created at step
    0 with lr_scale(0) = 1 (as the trainer's `create_scheduler` does). The wrapped factors are closures, which
    `LambdaLR.state_dict` leaves out, so checkpoints hold nothing that depends on this.

    Args:
        scheduler: a `torch.optim.lr_scheduler.LambdaLR` (as `transformers.get_scheduler` builds for every
            `lr_scheduler_type` except `reduce_lr_on_plateau`).
        lr_scale (`Callable[[int], float]`): the multiplier as a function of the optimizer step.

    Raises:
        ValueError: if `scheduler` is not a `LambdaLR`, naming the fix.
    """
    if not (hasattr(scheduler, "lr_lambdas") and hasattr(scheduler, "base_lrs")):
        raise ValueError(
            "TRAPOConfig.rl_phase_learning_rate needs a LambdaLR learning-rate scheduler (every `lr_scheduler_type` "
            f"of transformers except 'reduce_lr_on_plateau'; not a DeepSpeed `scheduler` block), got "
            f"{type(scheduler).__name__}. Drop rl_phase_learning_rate or change the scheduler."
        )

    def scaled(factor: Callable[[int], float]) -> Callable[[int], float]:
        def phase_scaled_factor(step: int) -> float:
            return factor(step) * lr_scale(step)

        return phase_scaled_factor

    # the current learning rates need no update: a scheduler is created at step 0, where no phase has begun
    # (phase boundaries are fractions in (0, 1) of the planned steps)
    scheduler.lr_lambdas = [scaled(factor) for factor in scheduler.lr_lambdas]


class RLSchedules:
    """The RL coefficients in use: the KL coefficient (fixed or adaptive), and the entropy coefficient and the
    learning-rate scale by curriculum phase.

    The trainer reports each finished round with `observe_rollouts` and calls `end_step` at the end of every
    optimizer step: the window is all-reduced (every rank takes part, so every rank gets the same coefficient) and fed
    to the KL controller.

    Args:
        args ([`TRAPOConfig`]): the configuration (read, never written).
        late_start (`float` or None): first step of the curriculum's last phase.
    """

    def __init__(self, args, late_start: float | None):
        self.phases = PhaseValues(
            late_start, args.learning_rate, args.rl_phase_learning_rate, args.entropy_coef, args.late_entropy_coef
        )
        if args.kl_target is not None:
            self.kl = AdaptiveKLController(
                args.kl_coef,
                args.kl_target,
                args.kl_horizon,
                tuple(args.kl_coef_range) if args.kl_coef_range else None,
            )
        else:
            self.kl = FixedKLController(args.kl_coef)
        self.window = torch.zeros(2, dtype=torch.float64)  # (sum of per-sequence KL, rollouts) since last update

    @property
    def adaptive_kl(self) -> bool:
        """Whether the KL coefficient adapts."""
        return isinstance(self.kl, AdaptiveKLController)

    def kl_coef(self) -> float:
        """The KL coefficient in use."""
        return self.kl.value()

    def entropy_coef(self, step: int) -> float:
        """The entropy coefficient of optimizer step `step`."""
        return self.phases.entropy(step)

    def lr_scale(self, step: int) -> float:
        """The learning-rate multiplier of optimizer step `step`."""
        return self.phases.lr_scale(step)

    @property
    def scales_lr(self) -> bool:
        """Whether the learning rate changes with the phase (`rl_phase_learning_rate` set)."""
        return self.phases.late_lr_scale != 1.0

    def observe_rollouts(self, batch) -> None:
        """Add a finished round ([`~trl_trapo.rollout.RolloutBatch`], this rank's share): its summed per-sequence KL
        (nats; every completion kept for training, guidance's demonstrations included) and its number of rollouts."""
        self.window[0] += sum(batch.kl.tolist()) if batch.kl is not None else 0.0
        self.window[1] += float(len(batch.completion_ids))

    def end_step(self, step: int, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Update the KL controller with the rollouts of optimizer step `step` (collective when adaptive).

        Args:
            step (`int`): the optimizer step that ends.
            reduce (`Callable`): sums a float64 tensor over ranks (identity on one process).
        """
        if self.adaptive_kl:
            window = reduce(self.window)
            if window[1] > 0:
                self.kl.update({"kl": float(window[0] / window[1]), "num_rollouts": int(window[1])}, step)
        self.window.zero_()

    def metrics(self, step: int) -> dict[str, float]:
        """`schedule/kl_coef`, `schedule/entropy_coef`, `schedule/lr_scale` of optimizer step `step` (each only when
        that schedule is on), and TRL GRPO's `entropy_coef` (the coefficient in use) when there is an entropy bonus."""
        out = {}
        if self.phases.entropy_coef > 0 or self.phases.late_entropy_coef > 0:
            out["entropy_coef"] = self.phases.entropy(step)
        if self.adaptive_kl:
            out["schedule/kl_coef"] = self.kl.value()
        if self.phases.late_entropy_coef != self.phases.entropy_coef:
            out["schedule/entropy_coef"] = self.phases.entropy(step)
        if self.scales_lr:
            out["schedule/lr_scale"] = self.phases.lr_scale(step)
        return out

    def state_dict(self) -> dict:
        return {"kl": self.kl.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        if state and self.adaptive_kl:
            self.kl.load_state_dict(state["kl"])
