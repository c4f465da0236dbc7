# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Controllers: values that adapt from measurements during training, behind one small interface.

Everything in TRAPO that moves a number from what it measures — DARE's weighting strategies
([`~trl_trapo.weighting.DAREWeighting`], [`~trl_trapo.weighting.StaticWeighting`] and the estimators beside them)
and the KL coefficient ([`AdaptiveKLController`], [`FixedKLController`]) — implements [`Controller`]:

- `value()`: the current output (a tuple of per-objective factors, or a coefficient);
- `update(stats, step)`: fold in the measurements of optimizer step `step` (a dict of floats; None = not measured);
- `state_dict()` / `load_state_dict()`: JSON-serialisable state, written into TRAPO's checkpoints.

The values live in the controller, never in the config: `TRAPOConfig` is built once and not changed by training.

The adaptive KL coefficient is the proportional controller of Ziegler et al., "Fine-Tuning Language Models from Human
Preferences" (huggingface.co/papers/1909.08593, section 2.2), which TRL's former `PPOTrainer` shipped as
`AdaptiveKLController`:

    e_t = clip(KL_t / KL_target - 1, -0.2, 0.2),    beta_{t+1} = beta_t * (1 + e_t * n_t / horizon),

with KL_t the mean per-sequence KL to the reference (nats) of the n_t rollouts since the last update. We add the
source document's range (0.1-0.3 there): beta is clipped to [min, max] after each update.
"""

from __future__ import annotations

import math
from typing import Any, Protocol


class Controller(Protocol):
    """The interface of everything that adapts a value from measurements (weighting strategies, KL controllers)."""

    def value(self) -> Any:
        """The current output."""
        ...

    def update(self, stats: dict[str, float | None], step: int) -> None:
        """Fold in the measurements `stats` of optimizer step `step` (None entries: not measured)."""
        ...

    def state_dict(self) -> dict:
        """JSON-serialisable state."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""
        ...


class FixedKLController:
    """A constant KL coefficient (the default), with the [`Controller`] interface.

    Args:
        kl_coef (`float`): the coefficient.
    """

    def __init__(self, kl_coef: float):
        self.coefficient = float(kl_coef)

    def value(self) -> float:
        """The coefficient."""
        return self.coefficient

    def update(self, stats: dict[str, float | None], step: int) -> None:
        """Does nothing (the coefficient is fixed)."""

    def state_dict(self) -> dict:
        return {"value": self.coefficient}

    def load_state_dict(self, state: dict) -> None:
        self.coefficient = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (huggingface.co/papers/1909.08593, section 2.2), optionally clipped.

    `update` reads `stats["kl"]` (mean per-sequence KL in nats of the rollouts since the last update) and
    `stats["num_rollouts"]` (their number, all ranks); it does nothing when either is missing or not finite.

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
        self.coefficient = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)
        self.kl_range = None if kl_range is None else (float(kl_range[0]), float(kl_range[1]))

    def value(self) -> float:
        """The current coefficient beta."""
        return self.coefficient

    def update(self, stats: dict[str, float | None], step: int) -> None:
        """Move the coefficient towards keeping the KL at the target (see the module docstring)."""
        current_kl, n = stats.get("kl"), stats.get("num_rollouts")
        if current_kl is None or n is None or not math.isfinite(current_kl) or n <= 0:
            return
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.coefficient *= 1.0 + proportional_error * n / self.horizon
        if self.kl_range is not None:
            self.coefficient = min(max(self.coefficient, self.kl_range[0]), self.kl_range[1])

    def state_dict(self) -> dict:
        return {"value": self.coefficient, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.coefficient = float(state["value"])


__all__ = ["Controller", "FixedKLController", "AdaptiveKLController"]
