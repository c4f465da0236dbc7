# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Hyper-parameter schedules of the source document's recipe: learning rate and entropy bonus by curriculum phase,
and the adaptive KL coefficient.

The source document gives: learning rate 5e-5, lowered to 3e-5 in the RL phase; KL coefficient 0.2, then adaptive
within 0.1-0.3; entropy coefficient 0.01, lowered to 0.005 late in training. It does not say how the KL coefficient
adapts; we use the proportional controller of Ziegler et al., "Fine-Tuning Language Models from Human Preferences"
(huggingface.co/papers/1909.08593, section 2.2), which TRL's former `PPOTrainer` shipped as `AdaptiveKLController`:

    e_t = clip(KL_t / KL_target - 1, -0.2, 0.2),    beta_{t+1} = beta_t * (1 + e_t * n_t / horizon),

with KL_t the mean per-sequence KL to the reference (nats) of the n_t rollouts since the last update. We add the
document's range: beta is clipped to [min, max] after each update.

"The RL phase" and "late" are read as the curriculum's last phase (default: the last 20 % of steps, mixture
10/30/60), the one where RL has the largest share. At its first step the learning rate's *peak* becomes
`rl_phase_learning_rate` — the scheduler's warm-up / decay shape is kept, only its scale changes — and
`entropy_coef` becomes `late_entropy_coef`.

Differences from the source: the switches are immediate at the phase boundary (the document gives no transition);
the KL controller is updated once per optimizer step on the rollouts generated for it, reduced over all ranks, so
every rank uses the same coefficient.
"""

from __future__ import annotations

import logging
import math

import torch
from transformers import TrainerCallback


logger = logging.getLogger(__name__)


class FixedKLController:
    """A constant KL coefficient, with the same interface as [`AdaptiveKLController`].

    Args:
        kl_coef (`float`): the coefficient.
    """

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Does nothing (the coefficient is fixed)."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (huggingface.co/papers/1909.08593, section 2.2), optionally clipped.

    Args:
        init_kl_coef (`float`): starting coefficient beta_0 (> 0).
        target (`float`): target KL per sequence (nats, > 0).
        horizon (`float`): horizon in rollouts (> 0); a larger horizon adapts more slowly.
        kl_range (`tuple[float, float]`, *optional*): `(min, max)` the coefficient is clipped to after each update.

    Raises:
        ValueError: for a non-positive coefficient, target or horizon, or an empty range.
    """

    def __init__(
        self, init_kl_coef: float, target: float, horizon: float, kl_range: tuple[float, float] | None = None
    ):
        if not (init_kl_coef > 0 and target > 0 and horizon > 0):
            raise ValueError(
                f"AdaptiveKLController needs init_kl_coef, target and horizon > 0, got {init_kl_coef}, {target}, "
                f"{horizon}."
            )
        if kl_range is not None and not 0 < kl_range[0] <= kl_range[1]:
            raise ValueError(f"kl_range={kl_range} must be (min, max) with 0 < min <= max.")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)
        self.kl_range = None if kl_range is None else (float(kl_range[0]), float(kl_range[1]))

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards keeping the KL at the target.

        Args:
            current_kl (`float`): mean per-sequence KL (nats) of the rollouts since the last update.
            n_steps (`int`): number of those rollouts (all ranks).
        """
        if not math.isfinite(current_kl) or n_steps <= 0:
            return
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
        if self.kl_range is not None:
            self.value = min(max(self.value, self.kl_range[0]), self.kl_range[1])

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


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


def _lambda_scheduler(scheduler):
    """The `LambdaLR` inside accelerate's / DeepSpeed's scheduler wrappers, or None."""
    seen = 0
    while scheduler is not None and seen < 4:
        if hasattr(scheduler, "lr_lambdas") and hasattr(scheduler, "base_lrs"):
            return scheduler
        scheduler = getattr(scheduler, "scheduler", None)
        seen += 1
    return None


class ScheduleCallback(TrainerCallback):
    """Applies the phase-dependent learning rate and entropy coefficient, and updates the KL coefficient.

    The trainer reports each generation round's KL with `observe_rollouts`; at the end of every optimizer step the
    sums are all-reduced (every rank takes part, so every rank gets the same coefficient) and fed to the controller.
    `args.kl_coef` and `args.entropy_coef` are what the trainer reads, so they are set in place.

    Args:
        trainer: the [`TRAPOTrainer`] (for its `args` and `accelerator`).
        late_start (`float` or None): first step of the curriculum's last phase.
    """

    def __init__(self, trainer, late_start: float | None):
        args = trainer.args
        self.trainer = trainer
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
        self._window = torch.zeros(2, dtype=torch.float64)  # (sum of per-sequence KL, rollouts) since last update
        self._applied_scale: float | None = None

    @property
    def adaptive_kl(self) -> bool:
        return isinstance(self.kl, AdaptiveKLController)

    def observe_rollouts(self, kl_sum: float, num_rollouts: int) -> None:
        """Add a generation round's summed per-sequence KL (nats) and its number of rollouts (this rank)."""
        self._window[0] += float(kl_sum)
        self._window[1] += float(num_rollouts)

    def _apply_lr(self, step: int, lr_scheduler) -> None:
        scale = self.phases.lr_scale(step)
        if scale == self._applied_scale:
            return
        inner = _lambda_scheduler(lr_scheduler)
        if inner is None:
            if scale != 1.0:
                raise ValueError(
                    "TRAPOConfig.rl_phase_learning_rate needs a LambdaLR learning-rate scheduler (every "
                    "`lr_scheduler_type` of transformers except 'reduce_lr_on_plateau'; not a DeepSpeed `scheduler` "
                    "block). Drop rl_phase_learning_rate or change the scheduler."
                )
            return
        for i, group in enumerate(inner.optimizer.param_groups):
            base = group.get("initial_lr", inner.base_lrs[i]) * scale  # idempotent: always from the initial lr
            inner.base_lrs[i] = base
            group["lr"] = base * inner.lr_lambdas[i](inner.last_epoch)
        if self._applied_scale is not None:
            logger.info("Step %d: learning-rate scale %.4g (curriculum phase change).", step, scale)
        self._applied_scale = scale

    def on_train_begin(self, args, state, control, **kwargs):
        if self.adaptive_kl:
            args.kl_coef = self.kl.value
        self._applied_scale = None
        return control

    def on_step_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        step = state.global_step
        if self.phases.late_lr_scale != 1.0:
            self._apply_lr(step, lr_scheduler)
        if self.phases.late_entropy_coef != self.phases.entropy_coef:
            args.entropy_coef = self.phases.entropy(step)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.adaptive_kl:
            accelerator = self.trainer.accelerator
            window = self._window
            if accelerator.num_processes > 1:
                window = accelerator.reduce(window.to(accelerator.device), reduction="sum").cpu()
            if window[1] > 0:
                self.kl.update(float(window[0] / window[1]), int(window[1]))
                args.kl_coef = self.kl.value
        self._window.zero_()
        return control

    def metrics(self) -> dict[str, float]:
        """`schedule/kl_coef`, `schedule/entropy_coef`, `schedule/lr_scale` (each only when that schedule is on)."""
        out = {}
        if self.adaptive_kl:
            out["schedule/kl_coef"] = self.kl.value
        if self.phases.late_entropy_coef != self.phases.entropy_coef:
            out["schedule/entropy_coef"] = self.trainer.args.entropy_coef
        if self.phases.late_lr_scale != 1.0:
            out["schedule/lr_scale"] = self._applied_scale if self._applied_scale is not None else 1.0
        return out

    def state_dict(self) -> dict:
        return {"kl": self.kl.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        if state and self.adaptive_kl:
            self.kl.load_state_dict(state["kl"])
            self.trainer.args.kl_coef = self.kl.value
