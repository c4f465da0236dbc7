# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""DARE, the Dynamic Adaptive Routing Engine: how much each objective counts, decided from measured signals.

Every weighting strategy is a [`~trl_trapo.controllers.Controller`] — `value()`, `update(stats, step)`,
`state_dict()`, `load_state_dict()` — so a new strategy is one class. `value()` returns one *factor* per objective
(in the trainer's order of objectives); [`DARE`] combines factors with the curriculum mixture and the static multipliers (see
[`combine_weights`]) and decides when the strategy updates. The strategies: [`StaticWeighting`] (the default: every
factor 1), [`DAREWeighting`] (`weighting="dare"`, below), [`UncertaintyWeighting`] (Kendall et al. 2018),
[`GradNormWeighting`] (Chen et al. 2018) and [`GACWeighting`] (after GAC, arXiv 2605.26184); `TRAPOConfig.weighting`
selects one ([`build_weighting`]).

## What DARE measures

The source document names three signals — a throughput estimate for pretraining, gradient diversity for SFT and
reward sensitivity for RL — without defining them. We measure all three with one estimator so they share a unit and
can be compared: **split-half gradient agreement**. At a DARE update step the rows of each objective are split into
two disjoint halves A and B, and the cosine between the two halves' gradients is taken. In expectation
<g_A, g_B> = ||E g||^2 (independent noise cancels), so the cosine is the share of the objective's gradient that is
systematic rather than noise:

- pretraining — *throughput*: how much of the tokens spent on pretraining turns into a consistent update;
- SFT — *gradient diversity*: 1 - cosine is the diversity of the demonstrations' gradients; shuffled or
  contradictory demonstrations have gradients that disagree;
- RL — *reward sensitivity*: the RL gradient is the advantage-weighted score function, whose expectation is
  grad E[reward]; its agreement says how reliably the reward responds to the policy. A constant reward gives zero
  advantages and therefore signal 0 by construction.

The gradients are taken with respect to the output projection (the LM head) in closed form: for a token with
probabilities p, target y, hidden state h and loss coefficient c, dL/dW = c (p - e_y) h^T. That needs only the
forward pass the step already does (no extra forward, no extra backward) and works the same under DDP, ZeRO-3 or
FSDP. Two sketches keep it small: a fixed random subset of `dare_probe_vocab` vocabulary rows (all rows when the
vocabulary is smaller) and a random projection of h to `dare_probe_dim` dimensions. Cost at an update step: one
extra pass over the logits of the step's tokens (a log-sum-exp) and two small matrix products per objective;
nothing at other steps. The probe sums are all-reduced across ranks, so every rank computes the same factors.

## From signals to factors

Objectives differ by nature in how coherent their gradients are, so each is compared with its own history: the
target factor is the objective's *recent* signal over its running mean signal (about 1 for a useful objective, above
1 when its signal grows, below when it fades), and `dare_min_factor` when the mean signal is below the noise floor of
the probe (no signal at all). "Recent" is an exponential moving average of the measured signals with momentum 0.9,
bias-corrected like Adam's moments (so the first measurements are not pulled towards 0). Averaging the signal
*before* dividing and clipping matters for sparse signals: an RL objective whose rewards vary in only some probe
batches measures mostly 0 and sometimes ~1; the ratio of a single measurement to the mean would be clipped at
`dare_max_factor` on the rare spikes and sit at `dare_min_factor` in between, so its factor would settle far below 1
although the signal is stationary. Targets are clipped to [`dare_min_factor`, `dare_max_factor`], smoothed with
momentum 0.9, f_o <- 0.9 f_o + 0.1 t_o, and updated every ceil(sqrt(N)) optimizer steps by default.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .config import OBJECTIVES, TRAPOConfig, weighting_name
from .controllers import Controller


logger = logging.getLogger(__name__)


def combine_weights(static: Sequence[float], shares: Sequence[float], factors: Sequence[float]) -> tuple[float, ...]:
    """Effective loss weight per objective: w_o = c_o * s_o * f_o / sum_k c_k * s_k * f_k.

    Args:
        static (`Sequence[float]`): the user's static multipliers c_o (0 switches an objective off).
        shares (`Sequence[float]`): the curriculum shares s_o of this step (0 for objectives without data).
        factors (`Sequence[float]`): DARE's factors f_o.

    Returns:
        `tuple[float, ...]`: one weight per objective, summing to 1 (all 0 if every product is 0).
    """
    products = [c * s * f for c, s, f in zip(static, shares, factors)]
    total = sum(products)
    if total <= 0:
        return tuple(0.0 for _ in products)
    return tuple(p / total for p in products)


class StaticWeighting:
    """All factors 1: the loss weights are the curriculum mixture times the static multipliers (ablation mode).

    A [`~trl_trapo.controllers.Controller`] whose value never changes.

    Args:
        num_objectives (`int`): how many objectives (the built-in three by default).
    """

    def __init__(self, num_objectives: int = len(OBJECTIVES)):
        self.num_objectives = num_objectives

    def value(self) -> tuple[float, ...]:
        """The factors, one per objective: all 1."""
        return tuple(1.0 for _ in range(self.num_objectives))

    def update(self, stats: dict[str, float | None], step: int) -> None:
        return None

    def state_dict(self) -> dict:
        return {"strategy": "static"}

    def load_state_dict(self, state: dict) -> None:
        if state.get("strategy") != "static":
            raise ValueError(f"Cannot load a {state.get('strategy')!r} weighting state into StaticWeighting.")


class DAREWeighting:
    """DARE's dynamic factors from split-half gradient agreement (see the module docstring); a
    [`~trl_trapo.controllers.Controller`] whose `update` reads `signal/<objective>` (None: not measured).

    Each objective is compared with *itself*: the target factor is its recent signal divided by its running mean
    signal, t_o = ema(max(s_o, 0)) / mean_{updates}(max(s_o, 0)), the EMA with momentum `momentum` and Adam's bias
    correction (so a stationary but sparse signal gets t_o ~ 1; see the module docstring). Objectives differ a lot in how coherent
    their gradients are by nature (pretraining text shares frequent tokens; RL signal sits in the few groups whose
    rewards differ), so comparing raw signals across objectives would starve RL for good. Comparing each with its own
    history instead gives a useful objective a factor around 1, raises one whose signal is growing (e.g. RL once
    rewards start to vary), and lowers one whose signal is fading or was never there: an objective whose mean signal
    is below `noise_floor` (three standard deviations of the cosine of two random vectors of the probe's size) has
    no signal and gets `min_factor`. Targets are clipped to [`min_factor`, `max_factor`] and smoothed with `momentum`.

    Args:
        active (`Sequence[bool]`): which objectives take part, one flag per objective (the signals' order);
            inactive ones keep factor 1 and are ignored.
        momentum (`float`): smoothing momentum (0.9 in the source document).
        min_factor (`float`): lower bound of a factor.
        max_factor (`float`): upper bound of a factor.
        noise_floor (`float`): mean signal below which an objective counts as carrying no signal.
        names (`Sequence[str]`, *optional*): the objectives' names, in order (the built-in three by default); `update`
            reads `signal/<name>`.
    """

    def __init__(
        self,
        active: Sequence[bool] | None = None,
        momentum: float = 0.9,
        min_factor: float = 0.25,
        max_factor: float = 4.0,
        noise_floor: float = 0.01,
        names: Sequence[str] = OBJECTIVES,
    ):
        self.names = tuple(names)
        self.active = tuple(bool(a) for a in active) if active is not None else tuple(True for _ in self.names)
        if len(self.active) != len(self.names):
            raise ValueError(f"DAREWeighting: {len(self.active)} active flags for {len(self.names)} objectives.")
        self.momentum = momentum
        self.min_factor = min_factor
        self.max_factor = max_factor
        self.noise_floor = noise_floor
        count = len(self.names)
        self.factors = [1.0] * count
        self.signals: list[float | None] = [None] * count
        self.signal_sums = [0.0] * count  # sum of max(signal, 0) over the updates that measured it
        self.signal_counts = [0] * count
        self.signal_emas = [0.0] * count  # EMA of max(signal, 0), before bias correction
        self.num_updates = 0
        self.last_update_step = -1

    def value(self) -> tuple[float, ...]:
        """The smoothed factors, one per objective."""
        return tuple(self.factors)

    def _observe(self, signals: Sequence[float | None]) -> list[float | None]:
        """Add newly measured `signals` to the running means and EMAs; return the target factor per objective (None
        where nothing was measured). The first measurement of an objective above the noise floor gives a target of 1.
        """
        out: list[float | None] = [None] * len(self.names)
        for i, (active, signal) in enumerate(zip(self.active, signals)):
            if not active or signal is None or not math.isfinite(signal):
                continue
            value = max(float(signal), 0.0)
            self.signal_sums[i] += value
            self.signal_counts[i] += 1
            self.signal_emas[i] = self.momentum * self.signal_emas[i] + (1.0 - self.momentum) * value
            mean = self.signal_sums[i] / self.signal_counts[i]
            correction = 1.0 - self.momentum ** self.signal_counts[i]
            recent = self.signal_emas[i] / correction if correction > 0 else value
            target = self.min_factor if mean < self.noise_floor else recent / mean
            out[i] = min(max(target, self.min_factor), self.max_factor)
        return out

    def update(self, stats: dict[str, float | None], step: int) -> None:
        signals = [stats.get(f"signal/{name}") for name in self.names]
        self.signals = [None if s is None else float(s) for s in signals]
        for i, target in enumerate(self._observe(self.signals)):
            if target is not None:
                self.factors[i] = self.momentum * self.factors[i] + (1.0 - self.momentum) * target
        self.num_updates += 1
        self.last_update_step = step

    def state_dict(self) -> dict:
        return {
            "strategy": "dare",
            "names": list(self.names),
            "factors": list(self.factors),
            "signals": list(self.signals),
            "signal_sums": list(self.signal_sums),
            "signal_counts": list(self.signal_counts),
            "signal_emas": list(self.signal_emas),
            "num_updates": self.num_updates,
            "last_update_step": self.last_update_step,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned. A state without `names` (written before objectives were named) is the
        built-in three's.

        Raises:
            ValueError: if the state is another strategy's, was written for other objectives, or is corrupted (factors
                outside [min_factor, max_factor], non-finite numbers, lists of the wrong length).
        """
        if state.get("strategy") != "dare":
            raise ValueError(f"Cannot load a {state.get('strategy')!r} weighting state into DAREWeighting.")
        names = state.get("names", list(OBJECTIVES))
        if list(names) != list(self.names):
            raise ValueError(
                f"The DARE state was written for the objectives {list(names)}, this run has {list(self.names)}: "
                "resume with the same objectives."
            )
        count = len(self.names)

        def finite_numbers(values) -> bool:
            return (
                isinstance(values, list)
                and len(values) == count
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
            )

        factors = state.get("factors")
        if not finite_numbers(factors) or not all(
            self.min_factor - 1e-9 <= f <= self.max_factor + 1e-9 for f in factors
        ):
            raise ValueError(
                f"Corrupted DARE state: factors={factors!r} must be {count} finite numbers within "
                f"[{self.min_factor}, {self.max_factor}]."
            )
        signals = state.get("signals", [None] * count)
        if not isinstance(signals, list) or len(signals) != count:
            raise ValueError(f"Corrupted DARE state: signals={signals!r} must be a list of {count} entries.")
        self.factors = [float(f) for f in factors]
        self.signals = [None if s is None else float(s) for s in signals]
        sums, counts = state.get("signal_sums", [0.0] * count), state.get("signal_counts", [0] * count)
        if len(sums) != count or len(counts) != count or any(c < 0 for c in counts):
            raise ValueError(f"Corrupted DARE state: signal_sums={sums!r}, signal_counts={counts!r}.")
        self.signal_sums = [float(x) for x in sums]
        self.signal_counts = [int(c) for c in counts]
        emas = state.get("signal_emas", [0.0] * count)
        if not finite_numbers(emas):
            raise ValueError(f"Corrupted DARE state: signal_emas={emas!r} must be {count} finite numbers.")
        self.signal_emas = [float(e) for e in emas]
        self.num_updates = int(state.get("num_updates", 0))
        self.last_update_step = int(state.get("last_update_step", -1))


def _finite_list(values, count: int) -> bool:
    """Whether `values` is a list of `count` finite numbers (not bools)."""
    return (
        isinstance(values, list)
        and len(values) == count
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    )


class _ScalarAdam:
    """Adam (Kingma and Ba, 2015, Algorithm 1) on a few scalars: the update rule of the model's optimizer, applied by a
    weighting strategy to its own parameters (uncertainty weighting's log-variances, GradNorm's weights).

    Args:
        count (`int`): how many scalars.
        learning_rate (`float`): the step size.
        betas (`tuple[float, float]`): the moments' decay rates.
        eps (`float`): the denominator's guard.
    """

    def __init__(self, count: int, learning_rate: float, betas: tuple[float, float], eps: float):
        self.learning_rate = float(learning_rate)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.first = [0.0] * count
        self.second = [0.0] * count
        self.steps = [0] * count

    def step(self, index: int, value: float, gradient: float) -> float:
        """`value` after one Adam step along `gradient`."""
        beta1, beta2 = self.betas
        self.steps[index] += 1
        self.first[index] = beta1 * self.first[index] + (1.0 - beta1) * gradient
        self.second[index] = beta2 * self.second[index] + (1.0 - beta2) * gradient * gradient
        first = self.first[index] / (1.0 - beta1 ** self.steps[index])
        second = self.second[index] / (1.0 - beta2 ** self.steps[index])
        return value - self.learning_rate * first / (math.sqrt(second) + self.eps)

    def state_dict(self) -> dict:
        return {"first": list(self.first), "second": list(self.second), "steps": list(self.steps)}

    def load_state_dict(self, state: dict, owner: str) -> None:
        count = len(self.first)
        first, second, steps = state.get("first"), state.get("second"), state.get("steps")
        if not (_finite_list(first, count) and _finite_list(second, count) and isinstance(steps, list)):
            raise ValueError(f"Corrupted {owner} state: optimizer moments {state!r}.")
        if len(steps) != count or any(not isinstance(t, int) or t < 0 for t in steps) or min(second) < 0:
            raise ValueError(f"Corrupted {owner} state: optimizer steps {steps!r}, second moments {second!r}.")
        self.first, self.second, self.steps = [float(m) for m in first], [float(v) for v in second], list(steps)


def _check_names(state: dict, names: tuple[str, ...], owner: str) -> None:
    if state.get("names") != list(names):
        raise ValueError(
            f"The {owner} state was written for the objectives {state.get('names')}, this run has {list(names)}: "
            "resume with the same objectives."
        )


class UncertaintyWeighting:
    """Homoscedastic uncertainty weighting (Kendall, Gal and Cipolla, "Multi-Task Learning Using Uncertainty to Weigh
    Losses for Scene Geometry and Semantics", CVPR 2018, eq. 7; arxiv.org/abs/1705.07115): one learnt log-variance
    s_o per objective, the multi-task loss sum_o exp(-s_o) L_o + s_o, so the factor of objective o is exp(-s_o).
    (Eq. 7 is this up to a factor 1/2; the classification variant, eq. 10-12, halves the regulariser, which changes
    every factor by the same constant at the fixed point, and the weights are renormalised, see [`combine_weights`].)

    **Where the weights live and what the optimizer sees.** The log-variances live here, not in the model's
    optimizer, which never sees them. That is the same training as putting them in the optimizer: the gradient of
    the loss with respect to s_o is 1 - exp(-s_o) L_o, a closed form of the measured L_o (no model parameter enters
    it), and the model's gradient depends on s only through the factors. So `update` applies the model optimizer's
    rule to s itself — Adam with the model's `learning_rate`, `adam_beta1`, `adam_beta2`, `adam_epsilon` — once for
    each optimizer step since the previous update, holding L_o at its measured value in between. The fixed point is
    the paper's, s_o* = log E[L_o] (factor 1 / E[L_o]). What differs from s in the optimizer: the loss is measured at
    DARE's update steps only (every `dare_update_interval` steps), the learning rate is the configured peak one (no
    warm-up or decay), and s takes no part in the model's gradient clipping (`max_grad_norm`: there its gradient,
    of order L_o, would shrink the model's step) or weight decay. s is checkpointed with the weighting state
    (`state_dict`, written with DARE's state into TRAPO's checkpoints), together with its Adam moments.

    The derivation assumes a likelihood, L_o >= 0. An objective whose loss is not positive (an RL surrogate with
    zero-mean advantages) has no finite optimum: its s falls at the optimizer's pace; s is clipped so that factors
    stay within [`min_factor`, `max_factor`].

    `update` reads `loss/<name>` (None: not measured, s unchanged).

    Args:
        active (`Sequence[bool]`, *optional*): which objectives take part (the others keep factor 1).
        learning_rate (`float`): Adam's step size for s (the model's learning rate in the trainer).
        betas (`tuple[float, float]`): Adam's moment decays.
        eps (`float`): Adam's epsilon.
        min_factor, max_factor (`float`): bounds of exp(-s).
        names (`Sequence[str]`, *optional*): the objectives' names, in order.
    """

    def __init__(
        self,
        active: Sequence[bool] | None = None,
        learning_rate: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        min_factor: float = 0.25,
        max_factor: float = 4.0,
        names: Sequence[str] = OBJECTIVES,
    ):
        self.names = tuple(names)
        self.active = tuple(bool(a) for a in active) if active is not None else tuple(True for _ in self.names)
        if len(self.active) != len(self.names):
            raise ValueError(
                f"UncertaintyWeighting: {len(self.active)} active flags for {len(self.names)} objectives."
            )
        self.bounds = (-math.log(max_factor), -math.log(min_factor))  # of s
        self.log_variances = [0.0] * len(self.names)
        self.optimizer = _ScalarAdam(len(self.names), learning_rate, betas, eps)
        self.losses: list[float | None] = [None] * len(self.names)
        self.last_update_step = 0

    def value(self) -> tuple[float, ...]:
        """exp(-s_o) per objective (1 for inactive ones)."""
        return tuple(math.exp(-s) if a else 1.0 for s, a in zip(self.log_variances, self.active))

    def update(self, stats: dict[str, float | None], step: int) -> None:
        """One Adam step on each measured s_o per optimizer step since the previous update (see the class
        docstring)."""
        steps = max(step - self.last_update_step, 1)
        self.last_update_step = step
        losses = [stats.get(f"loss/{name}") for name in self.names]
        self.losses = [None if v is None or not math.isfinite(v) else float(v) for v in losses]
        low, high = self.bounds
        for i, (active, loss) in enumerate(zip(self.active, self.losses)):
            if not active or loss is None:
                continue
            s = self.log_variances[i]
            for _ in range(steps):
                s = min(max(self.optimizer.step(i, s, 1.0 - math.exp(-s) * loss), low), high)
            self.log_variances[i] = s

    def state_dict(self) -> dict:
        return {
            "strategy": "uncertainty",
            "names": list(self.names),
            "log_variances": list(self.log_variances),
            "optimizer": self.optimizer.state_dict(),
            "losses": list(self.losses),
            "last_update_step": self.last_update_step,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: if the state is another strategy's, another run's objectives', or corrupted.
        """
        if state.get("strategy") != "uncertainty":
            raise ValueError(f"Cannot load a {state.get('strategy')!r} weighting state into UncertaintyWeighting.")
        _check_names(state, self.names, "uncertainty weighting")
        values = state.get("log_variances")
        low, high = self.bounds
        if not _finite_list(values, len(self.names)) or not all(low - 1e-9 <= s <= high + 1e-9 for s in values):
            raise ValueError(
                f"Corrupted uncertainty-weighting state: log_variances={values!r} must be {len(self.names)} finite "
                f"numbers within [{low:.4g}, {high:.4g}]."
            )
        self.optimizer.load_state_dict(state.get("optimizer", {}), "uncertainty-weighting")
        self.log_variances = [float(s) for s in values]
        self.losses = [None if v is None else float(v) for v in state.get("losses", [None] * len(self.names))]
        self.last_update_step = int(state.get("last_update_step", 0))


class GradNormWeighting:
    """GradNorm (Chen, Badrinarayanan, Lee and Rabinovich, "GradNorm: Gradient Normalization for Adaptive Loss Balancing
    in Deep Multitask Networks", ICML 2018, eq. 1-2; arxiv.org/abs/1711.02257): the factors w_o are moved so that each
    objective's weighted gradient norm at the shared layer trains at the rate its loss asks for.

    With G_o the norm of objective o's gradient at the shared layer — here the probe's sketched LM-head gradient in
    loss units (`grad_norm/<name>`, see [`GradientProbe.statistics`]) — and L_o(t) its loss (`loss/<name>`):

        G_W^(o) = w_o G_o,   mean_G = mean_o G_W^(o),   L~_o = L_o(t) / L_o(0),   r_o = L~_o / mean_o L~_o,
        L_grad = sum_o | G_W^(o) - mean_G * r_o^alpha |        (eq. 2, the target mean_G * r_o^alpha held constant)

    and w_o takes a step along -dL_grad/dw_o = -sign(G_W^(o) - target_o) G_o with the model optimizer's rule (Adam,
    the model's learning rate and betas; as for [`UncertaintyWeighting`], the weights live here and the model's
    optimizer never sees them), once per optimizer step since the previous update with the measurements held, each
    step followed by the paper's renormalisation: the updated weights keep their sum (the number of objectives, as
    they start at 1). L_o(0) is the first measured loss. An objective whose first loss is not positive, or whose loss
    is negative now (an RL surrogate), has no training rate: r_o = 1. The factors multiply the curriculum mixture
    and the static multipliers (the weights GradNorm balances are the factors; the mixture stays the user's).

    Args:
        active (`Sequence[bool]`, *optional*): which objectives take part (the others keep factor 1).
        alpha (`float`): the restoring force's asymmetry (1.5 in the paper's NYUv2 experiments).
        learning_rate, betas, eps: Adam's, for the weights.
        names (`Sequence[str]`, *optional*): the objectives' names, in order.
    """

    min_weight = 1e-3  # a weight never reaches 0 (the objective would be switched off for good)

    def __init__(
        self,
        active: Sequence[bool] | None = None,
        alpha: float = 1.5,
        learning_rate: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        names: Sequence[str] = OBJECTIVES,
    ):
        self.names = tuple(names)
        self.active = tuple(bool(a) for a in active) if active is not None else tuple(True for _ in self.names)
        if len(self.active) != len(self.names):
            raise ValueError(f"GradNormWeighting: {len(self.active)} active flags for {len(self.names)} objectives.")
        self.alpha = float(alpha)
        self.weights = [1.0] * len(self.names)
        self.initial_losses: list[float | None] = [None] * len(self.names)
        self.optimizer = _ScalarAdam(len(self.names), learning_rate, betas, eps)
        self.last_update_step = 0

    def value(self) -> tuple[float, ...]:
        """The weights w_o (1 for inactive objectives)."""
        return tuple(self.weights)

    def rates(self, losses: Sequence[float | None], measured: Sequence[int]) -> dict[int, float]:
        """r_o, the relative inverse training rate of each objective in `measured` (1 where it has none)."""
        inverse = {}
        for i in measured:
            first, now = self.initial_losses[i], losses[i]
            if first is not None and first > 0 and now is not None and now >= 0:
                inverse[i] = now / first
        mean = sum(inverse.values()) / len(inverse) if inverse else 0.0
        return {i: inverse[i] / mean if i in inverse and mean > 0 else 1.0 for i in measured}

    def update(self, stats: dict[str, float | None], step: int) -> None:
        """Adam steps on the weights along dL_grad/dw (see the class docstring)."""
        steps = max(step - self.last_update_step, 1)
        self.last_update_step = step
        norms = [stats.get(f"grad_norm/{name}") for name in self.names]
        losses = [stats.get(f"loss/{name}") for name in self.names]
        losses = [None if v is None or not math.isfinite(v) else float(v) for v in losses]
        for i, loss in enumerate(losses):
            if self.active[i] and self.initial_losses[i] is None and loss is not None:
                self.initial_losses[i] = loss
        measured = [i for i, n in enumerate(norms) if self.active[i] and n is not None and math.isfinite(n)]
        if len(measured) < 2:
            return
        rates = self.rates(losses, measured)
        total = sum(self.weights[i] for i in measured)
        for _ in range(steps):
            weighted = {i: self.weights[i] * norms[i] for i in measured}
            mean = sum(weighted.values()) / len(measured)
            for i in measured:
                target = mean * rates[i] ** self.alpha
                gradient = math.copysign(norms[i], weighted[i] - target) if weighted[i] != target else 0.0
                self.weights[i] = max(self.optimizer.step(i, self.weights[i], gradient), self.min_weight)
            scale = total / sum(self.weights[i] for i in measured)
            for i in measured:
                self.weights[i] *= scale

    def state_dict(self) -> dict:
        return {
            "strategy": "gradnorm",
            "names": list(self.names),
            "weights": list(self.weights),
            "initial_losses": list(self.initial_losses),
            "optimizer": self.optimizer.state_dict(),
            "last_update_step": self.last_update_step,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: if the state is another strategy's, another run's objectives', or corrupted.
        """
        if state.get("strategy") != "gradnorm":
            raise ValueError(f"Cannot load a {state.get('strategy')!r} weighting state into GradNormWeighting.")
        _check_names(state, self.names, "GradNorm")
        weights, initial = state.get("weights"), state.get("initial_losses")
        count = len(self.names)
        if not _finite_list(weights, count) or min(weights) <= 0:
            raise ValueError(f"Corrupted GradNorm state: weights={weights!r} must be {count} positive numbers.")
        if not isinstance(initial, list) or len(initial) != count:
            raise ValueError(f"Corrupted GradNorm state: initial_losses={initial!r} must be a list of {count}.")
        self.optimizer.load_state_dict(state.get("optimizer", {}), "GradNorm")
        self.weights = [float(w) for w in weights]
        self.initial_losses = [None if v is None else float(v) for v in initial]
        self.last_update_step = int(state.get("last_update_step", 0))


class GACWeighting:
    """A GAC-style closed-form SFT/RL mixing weight from gradient noise and disagreement (after Hu, Yu, Cheng, Liu and
    Song, "GAC: Noise-Aware Adaptive Mixing for Hybrid SFT-RL Post-Training", arXiv 2605.26184).

    GAC mixes the two signals as g = mu g_sft + (1 - mu) g_rl and picks the mu that minimises an upper bound on the
    mean squared error of that step against the RL gradient. With independent noises of variance sigma_s^2 and
    sigma_r^2 and the disagreement Delta^2 = ||g_sft - g_rl||^2,

        E||mu g^_sft + (1 - mu) g^_rl - g_rl||^2 = mu^2 (Delta^2 + sigma_s^2) + (1 - mu)^2 sigma_r^2,
        mu* = sigma_r^2 / (sigma_r^2 + sigma_s^2 + Delta^2):

    lean on SFT while the RL gradient is noisy, away from it when the two disagree. (The stored copy of the paper
    available to us holds its abstract and figure 1 — sigma_r^2, sigma_s^2 and the disagreement proxy Delta~^2 as
    the controller's inputs; EMA smoothing, a schedule prior and capped updates around the closed form — not its
    numbered equations: this derivation and the constants below are ours.)

    Ours, from the probe ([`GradientProbe.statistics`]): sigma_s^2 = `noise/sft`, sigma_r^2 = `noise/rl`, Delta~^2 =
    `disagreement/sft/rl` (the measured gradients' distance, as the paper's proxy: its expectation also holds both
    noises). Each is smoothed by an EMA with momentum `momentum` and Adam's bias correction; the target is the closed
    form pulled towards the prior, t = (1 - `prior_weight`) mu* + `prior_weight` * 1/2, and mu moves towards it by
    at most `max_change` per update. mu = 1/2 is the prior: the curriculum's own SFT/RL split. The factors are
    f_sft = 2 mu and f_rl = 2 (1 - mu) (so the SFT/RL weight ratio is the curriculum's times mu / (1 - mu)); every
    other objective (pretraining, distillation) keeps factor 1, i.e. its static weight. An RL term with no gradient at
    all (every advantage 0) is a noiseless zero signal: sigma_r^2 = 0, so mu* = 0.

    Args:
        active (`Sequence[bool]`, *optional*): which objectives take part; without both SFT and RL, mu stays 1/2.
        momentum (`float`): EMA momentum of the statistics.
        max_change (`float`): the cap on |mu_t - mu_{t-1}| per update.
        prior_weight (`float`): how much the target leans on the prior 1/2 (0: the closed form alone).
        names (`Sequence[str]`, *optional*): the objectives' names, in order; must hold "sft" and "rl".

    Raises:
        ValueError: if `names` lacks "sft" or "rl", or a constant is out of range.
    """

    def __init__(
        self,
        active: Sequence[bool] | None = None,
        momentum: float = 0.9,
        max_change: float = 0.05,
        prior_weight: float = 0.5,
        names: Sequence[str] = OBJECTIVES,
    ):
        self.names = tuple(names)
        if "sft" not in self.names or "rl" not in self.names:
            raise ValueError(
                f"weighting='gac' weighs SFT against RL: the objectives {list(self.names)} lack 'sft' or 'rl'; "
                "choose another weighting."
            )
        if not (0 <= momentum < 1 and 0 < max_change <= 1 and 0 <= prior_weight <= 1):
            raise ValueError(
                f"GACWeighting needs 0 <= momentum < 1, 0 < max_change <= 1, 0 <= prior_weight <= 1; got {momentum}, "
                f"{max_change}, {prior_weight}."
            )
        self.active = tuple(bool(a) for a in active) if active is not None else tuple(True for _ in self.names)
        self.sft, self.rl = self.names.index("sft"), self.names.index("rl")
        self.momentum, self.max_change, self.prior_weight = momentum, max_change, prior_weight
        self.mu = 0.5
        self.emas = [0.0, 0.0, 0.0]  # sigma_s^2, sigma_r^2, Delta^2 (before bias correction)
        self.num_measured = 0

    def value(self) -> tuple[float, ...]:
        """f_sft = 2 mu, f_rl = 2 (1 - mu), 1 elsewhere."""
        factors = [1.0] * len(self.names)
        factors[self.sft], factors[self.rl] = 2.0 * self.mu, 2.0 * (1.0 - self.mu)
        return tuple(factors)

    def closed_form(self) -> float | None:
        """mu* from the smoothed statistics (None before any measurement, or when all three are 0)."""
        if self.num_measured == 0:
            return None
        correction = 1.0 - self.momentum**self.num_measured
        sft_noise, rl_noise, disagreement = (e / correction for e in self.emas)
        total = rl_noise + sft_noise + disagreement
        return rl_noise / total if total > 0 else None

    def update(self, stats: dict[str, float | None], step: int) -> None:
        """Fold in `noise/sft`, `noise/rl` and `disagreement/sft/rl` (all three, or nothing) and move mu."""
        if not (self.active[self.sft] and self.active[self.rl]):
            return
        sft, rl = self.names[self.sft], self.names[self.rl]
        measured = (stats.get(f"noise/{sft}"), stats.get(f"noise/{rl}"), stats.get(f"disagreement/{sft}/{rl}"))
        if any(v is None or not math.isfinite(v) for v in measured):
            return
        self.num_measured += 1
        self.emas = [
            self.momentum * e + (1.0 - self.momentum) * max(float(v), 0.0) for e, v in zip(self.emas, measured)
        ]
        optimum = self.closed_form()
        if optimum is None:
            return
        target = (1.0 - self.prior_weight) * optimum + self.prior_weight * 0.5
        self.mu += min(max(target - self.mu, -self.max_change), self.max_change)

    def state_dict(self) -> dict:
        return {
            "strategy": "gac",
            "names": list(self.names),
            "mu": self.mu,
            "emas": list(self.emas),
            "num_measured": self.num_measured,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: if the state is another strategy's, another run's objectives', or corrupted.
        """
        if state.get("strategy") != "gac":
            raise ValueError(f"Cannot load a {state.get('strategy')!r} weighting state into GACWeighting.")
        _check_names(state, self.names, "GAC")
        mu, emas, measured = state.get("mu"), state.get("emas"), state.get("num_measured")
        if not (_finite_list([mu], 1) and 0 <= mu <= 1 and _finite_list(emas, 3) and min(emas) >= 0):
            raise ValueError(f"Corrupted GAC state: mu={mu!r} must be in [0, 1], emas={emas!r} 3 numbers >= 0.")
        if not isinstance(measured, int) or measured < 0:
            raise ValueError(f"Corrupted GAC state: num_measured={measured!r}.")
        self.mu, self.emas, self.num_measured = float(mu), [float(e) for e in emas], measured


@dataclass(frozen=True)
class ProbeStatistics:
    """What [`GradientProbe.statistics`] measured at an update step, one entry per objective (None: not measured).

    Attributes:
        loss: the step's loss of each objective (its logged `loss/<objective>`; nats per token for the NLL terms).
        grad_norm: ||g_o||, the norm of the objective's sketched LM-head gradient in loss units.
        noise: the variance of that gradient estimate, E||g_o - E g_o||^2 (split-half estimate).
        signal: ||E g_o||^2 (split-half estimate <a, b>).
        disagreement: ||g_i - g_j||^2 for every ordered pair (i, j) of measured objectives.
    """

    loss: tuple[float | None, ...]
    grad_norm: tuple[float | None, ...]
    noise: tuple[float | None, ...]
    signal: tuple[float | None, ...]
    disagreement: dict[tuple[int, int], float]

    def as_stats(self, names: Sequence[str]) -> dict[str, float | None]:
        """Flat `stats` for a [`~trl_trapo.controllers.Controller`]: `loss/<name>`, `grad_norm/<name>`,
        `noise/<name>`, `agreement/<name>` (the signal) and `disagreement/<name_i>/<name_j>`."""
        out: dict[str, float | None] = {}
        for key, values in (
            ("loss", self.loss),
            ("grad_norm", self.grad_norm),
            ("noise", self.noise),
            ("agreement", self.signal),
        ):
            out.update({f"{key}/{name}": v for name, v in zip(names, values)})
        out.update({f"disagreement/{names[i]}/{names[j]}": v for (i, j), v in self.disagreement.items()})
        return out


class GradientProbe:
    """Accumulates the sketched closed-form LM-head gradient of each objective, for two halves of its rows.

    For token n with (temperature-scaled) logits z_n, target y_n, final hidden state h_n and loss coefficient c_n,
    the gradient of c_n * loss_n with respect to the output projection W (shape `(V, H)`) is c_n (p_n - e_{y_n}) h_n^T.
    We keep it on a fixed subset S of vocabulary rows and a random projection R (shape `(H, K)`) of the hidden states:
    G[o, half] += sum_n c_n (p_n[S] - e_{y_n}[S]) (h_n R)^T, shape `(|S|, K)`.

    Args:
        vocab_size (`int`): V.
        hidden_size (`int`): H.
        probe_vocab (`int`): |S| (all rows when V <= probe_vocab).
        probe_dim (`int`): K (the identity when H <= probe_dim).
        device (`torch.device`): where the sums live.
        seed (`int`): seed of S and R; the same on every rank.
        num_objectives (`int`): how many objectives it keeps sums for (the built-in three by default).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        probe_vocab: int = 4096,
        probe_dim: int = 256,
        device: torch.device | str = "cpu",
        seed: int = 0,
        num_objectives: int = len(OBJECTIVES),
    ):
        self.num_objectives = num_objectives
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        if vocab_size <= probe_vocab:
            self.rows = None
            num_rows = vocab_size
        else:
            self.rows = torch.randperm(vocab_size, generator=generator)[:probe_vocab].sort().values.to(device)
            num_rows = probe_vocab
        if hidden_size <= probe_dim:
            self.projection = None
            dim = hidden_size
        else:
            self.projection = (torch.randn(hidden_size, probe_dim, generator=generator) / math.sqrt(probe_dim)).to(
                device
            )
            dim = probe_dim
        # column index of every vocabulary id inside S (-1 when not in S)
        self.position = None
        if self.rows is not None:
            self.position = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
            self.position[self.rows] = torch.arange(num_rows, device=device)
        self.sums = torch.zeros(num_objectives, 2, num_rows, dim, device=device)
        self.counts = torch.zeros(num_objectives, 2, device=device)  # tokens seen per (objective, half)
        self.informative = torch.zeros(num_objectives, 2, device=device)  # of which with a non-zero coefficient
        self.losses = torch.zeros(num_objectives, device=device)  # each term's logged value, summed (`add_losses`)
        # > 0 where the sums came from `accumulate_logit_grad`: a term's own d loss / d logits, already divided by
        # its token count (`accumulate` sums unnormalised per-token coefficients); a tensor so ranks agree after `reduce`
        self.prescaled = torch.zeros(num_objectives, device=device)

    def reset(self) -> None:
        """Forget everything accumulated."""
        self.sums.zero_()
        self.counts.zero_()
        self.informative.zero_()
        self.losses.zero_()
        self.prescaled.zero_()

    @torch.no_grad()
    def add_losses(self, values: Sequence[torch.Tensor]) -> None:
        """Add one micro-batch's loss value of every objective (the terms' `value`, each already divided by the step's
        global count of its tokens, so the sum over micro-batches and ranks is the step's `loss/<objective>`)."""
        self.losses += torch.stack([v.detach().float().reshape(()) for v in values]).to(self.losses.device)

    @torch.no_grad()
    def accumulate(
        self,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        targets: torch.Tensor,
        coefficients: torch.Tensor,
        objective: torch.Tensor,
        half: torch.Tensor,
    ) -> None:
        """Add the probe gradients of a set of tokens.

        Args:
            hidden (`torch.Tensor`): shape `(N, H)`, final hidden states feeding the LM head.
            logits (`torch.Tensor`): shape `(N, V)`, the logits the loss used (temperature-scaled for RL).
            targets (`torch.Tensor`): shape `(N,)`, target token ids.
            coefficients (`torch.Tensor`): shape `(N,)`, c_n = -dloss/dlog p of each token (1 for NLL, A * rho for
                an unclipped policy-gradient token, 0 for a clipped one); `sums` accumulate d/dW of
                sum_n c_n * (-log p_n).
            objective (`torch.Tensor`): shape `(N,)`, the objective index of each token.
            half (`torch.Tensor`): shape `(N,)`, 0 or 1: the half of the token's row.
        """
        if hidden.shape[0] == 0:
            return
        hidden = hidden.float()
        if self.projection is not None:
            hidden = hidden @ self.projection
        logits = logits.float()
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        sub = logits if self.rows is None else logits.index_select(-1, self.rows)
        delta = torch.exp(sub - lse)  # (N, |S|)
        if self.position is None:
            columns = targets
            in_subset = torch.ones_like(targets, dtype=torch.bool)
        else:
            columns = self.position[targets]
            in_subset = columns >= 0
        rows = torch.arange(targets.shape[0], device=targets.device)[in_subset]
        delta[rows, columns[in_subset]] -= 1.0
        delta = delta * coefficients.float().unsqueeze(-1)
        for o in range(self.num_objectives):
            for h in range(2):
                selected = (objective == o) & (half == h)
                if selected.any():
                    self.sums[o, h] += delta[selected].T @ hidden[selected]
                    self.counts[o, h] += selected.sum()
                    self.informative[o, h] += (selected & (coefficients != 0)).sum()

    @torch.no_grad()
    def accumulate_logit_grad(
        self, hidden: torch.Tensor, logit_grad: torch.Tensor, objective: int, half: torch.Tensor
    ) -> None:
        """Add the probe gradients of one objective's tokens from their own gradient with respect to the logits, for
        terms whose gradient is not c (p - e_y) (e.g. a divergence to a teacher over the whole vocabulary).

        d loss / dW = sum_n g_n h_n^T, kept as G[objective, half] += g_n[S]^T (h_n R), exactly what `accumulate`
        builds from c_n (p_n - e_{y_n}) for the other terms.

        Args:
            hidden (`torch.Tensor`): shape `(N, H)`, the final hidden states feeding the LM head.
            logit_grad (`torch.Tensor`): shape `(N, V)`, d loss / d logits of each token (V: the full vocabulary).
            objective (`int`): the objective's index.
            half (`torch.Tensor`): shape `(N,)`, 0 or 1: the half of each token's row.
        """
        self.prescaled[objective] = 1.0
        if hidden.shape[0] == 0:
            return
        hidden = hidden.float()
        if self.projection is not None:
            hidden = hidden @ self.projection
        grad = logit_grad.float()
        grad = grad if self.rows is None else grad.index_select(-1, self.rows)
        nonzero = logit_grad.ne(0).any(dim=-1)
        for h in range(2):
            selected = half == h
            if selected.any():
                self.sums[objective, h] += grad[selected].T @ hidden[selected]
                self.counts[objective, h] += selected.sum()
                self.informative[objective, h] += (selected & nonzero).sum()

    def cosines(self) -> list[float | None]:
        """Split-half cosine per objective; call after reducing `sums`, `counts` and `informative` across ranks.

        None where the objective is missing from a half, or where only one half holds tokens with a non-zero
        coefficient (too little to compare); 0.0 where the objective is present but no token carries any gradient
        (e.g. RL with a constant reward: every advantage is 0).
        """
        out: list[float | None] = []
        for o in range(self.num_objectives):
            if self.counts[o, 0] == 0 or self.counts[o, 1] == 0:
                out.append(None)
                continue
            if self.informative[o, 0] == 0 and self.informative[o, 1] == 0:
                out.append(0.0)
                continue
            if self.informative[o, 0] == 0 or self.informative[o, 1] == 0:
                out.append(None)
                continue
            a, b = self.sums[o, 0].flatten(), self.sums[o, 1].flatten()
            norm = a.norm() * b.norm()
            out.append(float((a @ b) / norm) if norm > 1e-30 else 0.0)
        return out

    def statistics(self) -> ProbeStatistics:
        """Noise, signal and disagreement of the objectives' gradients, in loss units; call after reducing every tensor
        of the probe across ranks (as `cosines`).

        Each objective's probe gradient is put on the scale of its loss (a per-token mean): a half's gradient is
        a = G_A / N_A (G_A the half's sum, N_A its tokens; a term that hands its own logit gradient, already divided by
        its N tokens, gives a = G_A N / N_A), the step's gradient is g = (N_A a + N_B b) / N. Then, with independent
        halves of equal mean:

        - `noise` = ||a - b||^2 N_A N_B / N^2 estimates E||g - E g||^2, the variance of the step's gradient
          (||a - b||^2 / 4 for equal halves);
        - `signal` = <a, b> estimates ||E g||^2 (independent noise cancels in expectation);
        - `grad_norm` = ||g||, and `disagreement[(i, j)]` = ||g_i - g_j||^2 (its expectation also holds both noises).

        An RL term's per-token coefficients are those of its per-token loss before `loss_type`'s aggregation, so its
        scale is the token-mean one whatever `loss_type` does. The rules of `cosines` decide what is measured: None
        where a half is missing or only one half carries a gradient, 0 where no token carries any.

        Returns:
            [`ProbeStatistics`]: per objective, in order; `loss` is the summed `add_losses` (None where the
            objective had no tokens).
        """
        count = self.num_objectives
        losses: list[float | None] = [None] * count
        norms: list[float | None] = [None] * count
        noise: list[float | None] = [None] * count
        signal: list[float | None] = [None] * count
        gradients: dict[int, torch.Tensor] = {}
        for o in range(count):
            n_a, n_b = float(self.counts[o, 0]), float(self.counts[o, 1])
            if n_a + n_b > 0:
                losses[o] = float(self.losses[o])
            if n_a == 0 or n_b == 0:
                continue
            informative = (float(self.informative[o, 0]) > 0, float(self.informative[o, 1]) > 0)
            if informative[0] != informative[1]:
                continue
            n = n_a + n_b
            scale = n if float(self.prescaled[o]) > 0 else 1.0
            a = self.sums[o, 0].flatten().double() * (scale / n_a)
            b = self.sums[o, 1].flatten().double() * (scale / n_b)
            gradient = (n_a * a + n_b * b) / n
            gradients[o] = gradient
            noise[o] = float((a - b).square().sum()) * n_a * n_b / n**2
            signal[o] = float(a @ b)
            norms[o] = float(gradient.norm())
        disagreement = {
            (i, j): float((gradients[i] - gradients[j]).square().sum()) for i in gradients for j in gradients if i != j
        }
        return ProbeStatistics(tuple(losses), tuple(norms), tuple(noise), tuple(signal), disagreement)


class DARE:
    """Owns the weighting strategy, decides when it updates, and measures its signals with a [`GradientProbe`].

    At the steps where `is_update_step(step)` is true the trainer accumulates the probe during the step's forwards
    (`probe`), and `finish_step` reduces the probe sums across ranks and feeds the split-half cosines to the strategy.
    Between updates the factors are constant. Logs `weight/*`, `dare/factor/*`, `dare/signal/*`.

    Args:
        engine ([`~trl_trapo.controllers.Controller`]): the strategy (see [`build_weighting`]); its `update` gets
            `signal/<objective>` and the probe's statistics ([`ProbeStatistics.as_stats`]).
        update_interval (`int`): optimizer steps between updates (ceil(sqrt(N)) by default in the trainer).
        probe_factory (`Callable[[], GradientProbe]`, *optional*): builds the probe the first time it is needed (its
            sums take |S| x K floats per objective and half, so it is not allocated for static weighting).
        names (`Sequence[str]`, *optional*): the objectives' names, in order (the built-in three by default): the keys
            of the signals fed to the engine and of the metrics.
        active (`Sequence[bool]`, *optional*): which objectives are in the run (data and weight > 0; default: all):
            `dare/*` is logged for these only (`weight/*` for every objective).
    """

    def __init__(
        self,
        engine: Controller,
        update_interval: int,
        probe_factory: Callable[[], GradientProbe] | None = None,
        names: Sequence[str] = OBJECTIVES,
        active: Sequence[bool] | None = None,
    ):
        self.engine = engine
        self.update_interval = max(int(update_interval), 1)
        self.names = tuple(names)
        self.active = tuple(True for _ in self.names) if active is None else tuple(bool(a) for a in active)
        if len(self.active) != len(self.names):
            raise ValueError(f"DARE has {len(self.names)} objectives {list(self.names)}: give one active flag each.")
        self.last_weights: tuple[float, ...] = tuple(0.0 for _ in self.names)
        self.probe_factory = probe_factory
        self.probe: GradientProbe | None = None
        self.warned_without_signal: set[str] = set()  # objectives whose term gave no probe signal (warned once)

    @property
    def dynamic(self) -> bool:
        """Whether the engine measures signals at all."""
        return not isinstance(self.engine, StaticWeighting)

    def is_update_step(self, step: int) -> bool:
        """Whether optimizer step `step` (0-based, before it runs) measures signals and updates the factors."""
        return self.dynamic and step > 0 and step % self.update_interval == 0

    def load_state_dict(self, state: dict) -> None:
        """Restore the strategy's state from a checkpoint (`engine.state_dict()` as `RunState.save` wrote it).

        A checkpoint written with static weights (`{"strategy": "static"}`: nothing learnt) resumed with an adaptive
        strategy starts that strategy from its initial state (factors 1), exactly what a fresh run of it has, and one
        warning says so: switching from static weights to an adaptive strategy on resume is allowed. Every other
        state goes to the engine's `load_state_dict` (adaptive -> other strategy is refused before anything slow by
        [`~trl_trapo.checkpoint.check_checkpoint_settings`], since a learnt state would be lost).

        Raises:
            ValueError: as the engine's `load_state_dict` (another adaptive strategy's state, other objectives, a
                corrupted state).
        """
        if state.get("strategy") == "static" and self.dynamic:
            logger.warning(
                "The checkpoint was written with static weights (weighting='static'); this run's weighting=%r starts "
                "from its initial state (every factor 1), as a fresh run of it does.",
                self.engine.state_dict().get("strategy"),
            )
            return
        self.engine.load_state_dict(state)

    def step_weights(self, static, shares) -> tuple[float, ...]:
        """The loss weights of a step with curriculum `shares` (see [`combine_weights`]); kept for `metrics`."""
        self.last_weights = combine_weights(static, shares, self.engine.value())
        return self.last_weights

    def begin_step(self, step: int) -> bool:
        """Prepare optimizer step `step`; True (and a reset `probe`) when it measures signals."""
        measuring = self.is_update_step(step) and self.probe_factory is not None
        if measuring:
            if self.probe is None:
                self.probe = self.probe_factory()
            self.probe.reset()
        return measuring

    def finish_step(self, step: int, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Reduce the probe across ranks (`reduce` sums a tensor over ranks) and update the factors. Collective."""
        probe = self.probe
        for tensor in (probe.sums, probe.counts, probe.informative, probe.losses, probe.prescaled):
            tensor.copy_(reduce(tensor))
        self.update(probe.cosines(), step, probe.statistics().as_stats(self.names))

    def accumulate(self, hidden, logits, targets, objective, counted, half, rows, terms, views) -> None:
        """Hand the probe one micro-batch's counted tokens: LM-head inputs, logits, targets and the coefficient of
        each token (-d loss / d log p, `term.logp_coef`); a term that gives its own logit gradient (`logit_grad`) hands
        that instead. Called by the trainer's `compute_loss` at the steps `begin_step` said measure signals.

        Args:
            hidden (`torch.Tensor`): `(B, T, H)` the states the LM head reads.
            logits (`torch.Tensor`): `(N, V)` the logits of the `N` counted positions, in the order of
                `counted.nonzero()`; targets (`torch.Tensor`): `(N,)` their next tokens.
            objective (`torch.Tensor`): `(B,)` each row's objective index; counted (`torch.Tensor`): `(B, T)` bool,
                the counted positions; half (`torch.Tensor`): `(B,)` each row's half of the split.
            rows (`list[torch.Tensor]`): per objective, `(B,)` bool: its rows.
            terms (`list[TermOutput]`), views (`list[TermInputs]`): per objective, its term and what it saw.
        """
        self.probe.add_losses([term.value for term in terms])  # the loss-based strategies read them
        if not bool(counted.any()):
            return
        coefficients = torch.ones_like(counted, dtype=torch.float32)
        closed_form = torch.ones_like(objective, dtype=torch.bool)  # (B,) rows whose gradient is c (p - e_y)
        for index, term in enumerate(terms):
            if term.logit_grad is not None:
                closed_form &= ~rows[index]
                tokens = views[index].tokens
                self.probe.accumulate_logit_grad(
                    hidden[counted][tokens].detach(), term.logit_grad, index, half[views[index].token_rows[tokens]]
                )
            elif term.logp_coef is not None:
                coefficients = torch.where(rows[index].unsqueeze(1), term.logp_coef, coefficients)
            elif self.names[index] not in self.warned_without_signal and bool(views[index].tokens.any()):
                self.warn_without_signal(self.names[index])
        selected = closed_form.unsqueeze(1).expand_as(counted)[counted]  # (N,)
        if not bool(selected.all()):
            logits, targets = logits[selected], targets[selected]
            counted = counted & closed_form.unsqueeze(1)
        self.probe.accumulate(
            hidden[counted].detach(),
            logits.detach(),
            targets,
            coefficients[counted],
            objective.unsqueeze(1).expand_as(counted)[counted],
            half.unsqueeze(1).expand_as(counted)[counted],
        )

    def warn_without_signal(self, name: str) -> None:
        """Warn, once per objective, that its term gave neither `logp_coef` nor `logit_grad` at a step that measures
        signals: the probe then takes its counted tokens with coefficient 1 (the closed form of plain next-token
        cross-entropy, `losses.language_modeling_term`), so its factor follows the agreement of that gradient, not of
        its loss's. Kept (a term may well be a plain NLL), and said, since nothing else would say it."""
        self.warned_without_signal.add(name)
        logger.warning(
            "Objective '%s': loss() returned a TermOutput with neither logp_coef nor logit_grad at a step where the "
            "weighting measures its gradient (DARE's probe), so the probe takes its tokens as plain next-token "
            "cross-entropy (coefficient 1 per counted token): dare/factor/%s follows that gradient, not its loss's. "
            "Fix: return logp_coef=-d loss / d log p per token (B, T), or logit_grad=d loss / d logits (N_o, V) for "
            "a term whose gradient depends on the whole distribution (docs/seams.md, 'probe signal'); or "
            "weighting='static' to measure nothing.",
            name,
            name,
        )

    def update(
        self, signals: list[float | None], step: int, measurements: dict[str, float | None] | None = None
    ) -> None:
        """Feed the signals measured at `step` (the split-half cosines, as `signal/<objective>`) and any further
        `measurements` (see [`ProbeStatistics.as_stats`]) to the engine."""
        stats = {f"signal/{name}": s for name, s in zip(self.names, signals)}
        stats.update(measurements or {})
        self.engine.update(stats, step)
        logger.debug("DARE update at step %d: signals=%s factors=%s", step, signals, self.engine.value())

    def metrics(self) -> dict[str, float]:
        """`weight/<objective>` (last combined weights) of every objective; `dare/factor/<objective>` and
        `dare/signal/<objective>` (once measured) of the active ones."""
        out = {f"weight/{name}": w for name, w in zip(self.names, self.last_weights)}
        active = dict(zip(self.names, self.active))
        out.update({f"dare/factor/{name}": f for name, f in zip(self.names, self.engine.value()) if active[name]})
        signals = getattr(self.engine, "signals", None)
        if signals is not None:
            out.update(
                {f"dare/signal/{name}": s for name, s in zip(self.names, signals) if s is not None and active[name]}
            )
        return out


WEIGHTINGS = ("dare", "static", "uncertainty", "gradnorm", "gac")  # the values of `TRAPOConfig.weighting`


def build_weighting(
    args: TRAPOConfig, active: Sequence[bool], noise_floor: float, names: Sequence[str] = OBJECTIVES
) -> Controller:
    """The weighting strategy `args` selects (see [`weighting_name`]), for the objectives `names` of which `active`
    have data.

    With at most one active objective every strategy is [`StaticWeighting`]: the weights renormalise to 1 whatever the
    factors, so nothing is measured. The adaptive strategies take their bounds and smoothing from the `dare_*` fields;
    uncertainty weighting and GradNorm step their own parameters with the model optimizer's `learning_rate`,
    `adam_beta1`, `adam_beta2` and `adam_epsilon`.

    Args:
        args ([`TRAPOConfig`]): the run's config.
        active (`Sequence[bool]`): one flag per objective: it has data.
        noise_floor (`float`): DARE's noise floor of the probe's cosine (see [`DAREWeighting`]).
        names (`Sequence[str]`, *optional*): the objectives' names, in order.

    Returns:
        [`~trl_trapo.controllers.Controller`]: the strategy.
    """
    strategy = weighting_name(args)
    if strategy == "static" or sum(bool(a) for a in active) <= 1:
        return StaticWeighting(len(names))
    if strategy == "dare":
        return DAREWeighting(
            active,
            args.dare_momentum,
            args.dare_min_factor,
            args.dare_max_factor,
            noise_floor=noise_floor,
            names=names,
        )
    optimizer = dict(learning_rate=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    if strategy == "uncertainty":
        return UncertaintyWeighting(
            active, min_factor=args.dare_min_factor, max_factor=args.dare_max_factor, names=names, **optimizer
        )
    if strategy == "gradnorm":
        return GradNormWeighting(active, names=names, **optimizer)
    if strategy != "gac":
        raise ValueError(f"weighting={strategy!r} is not a weighting strategy: use one of {list(WEIGHTINGS)}.")
    gac = GACWeighting(active, momentum=args.dare_momentum, names=names)
    if not (gac.active[gac.sft] and gac.active[gac.rl]):
        logger.warning("weighting='gac' weighs SFT against RL, and this run lacks one of them: the factors stay 1.")
    return gac
