# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""DARE, the Dynamic Adaptive Routing Engine: how much each objective counts, decided from measured signals.

Every weighting strategy is a [`~trl_trapo.controllers.Controller`] — `value()`, `update(stats, step)`,
`state_dict()`, `load_state_dict()` — so a new strategy is one class. `value()` returns one *factor* per objective
(in the trainer's order of objectives); [`DARE`] combines factors with the curriculum mixture and the static multipliers (see
[`combine_weights`]) and decides when the strategy updates.

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

import torch

from .config import OBJECTIVES
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

    def reset(self) -> None:
        """Forget everything accumulated."""
        self.sums.zero_()
        self.counts.zero_()
        self.informative.zero_()

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


class DARE:
    """Owns the weighting strategy, decides when it updates, and measures its signals with a [`GradientProbe`].

    At the steps where `is_update_step(step)` is true the trainer accumulates the probe during the step's forwards
    (`probe`), and `finish_step` reduces the probe sums across ranks and feeds the split-half cosines to the strategy.
    Between updates the factors are constant. Logs `weight/*`, `dare/factor/*`, `dare/signal/*`.

    Args:
        engine ([`~trl_trapo.controllers.Controller`]): the strategy ([`DAREWeighting`] or [`StaticWeighting`]).
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

    @property
    def dynamic(self) -> bool:
        """Whether the engine measures signals at all."""
        return not isinstance(self.engine, StaticWeighting)

    def is_update_step(self, step: int) -> bool:
        """Whether optimizer step `step` (0-based, before it runs) measures signals and updates the factors."""
        return self.dynamic and step > 0 and step % self.update_interval == 0

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
        probe.sums.copy_(reduce(probe.sums))
        probe.counts.copy_(reduce(probe.counts))
        probe.informative.copy_(reduce(probe.informative))
        self.update(probe.cosines(), step)

    def update(self, signals: list[float | None], step: int) -> None:
        """Feed the signals measured at `step` to the engine."""
        stats = {f"signal/{name}": s for name, s in zip(self.names, signals)}
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
