# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The progressive curriculum: which share of each step's examples goes to pretraining, SFT and RL.

The source document schedules the task mixture in three phases — the first 20 % of steps 70/20/10
(pretrain/SFT/RL), the middle 60 % 30/50/20, the last 20 % 10/30/60 — with "ratio = base * (1 - exp(-step /
decay_steps))". Taken literally per objective, that formula cancels out once the mixture is renormalised, so we read
it as the *transition* between phases: after a boundary at step b_k the mixture moves from the previous phase's
target m_{k-1} to the new target m_k as

    m(step) = m_{k-1} + (m_k - m_{k-1}) * (1 - exp(-(step - b_k) / tau)),

a convex combination, so it always sums to 1. Strictly, each transition starts from the mixture actually reached at
its boundary (s_k below, which equals m_{k-1} once the previous transition has settled), so the schedule is
continuous even when tau is long compared with a phase:

    m(step) = s_k + (m_k - s_k) * (1 - exp(-(step - b_k) / tau)),  s_1 = m_0,  s_{k+1} = m(b_{k+1}).

The first phase starts at its target. Objectives without data (or with a static weight of 0) are removed and the rest
renormalised.

The schedule covers every objective of the run: the built-in three and any added through `TRAPOTrainer(objectives=)`.
`curriculum_mixtures` gives each phase's target either as three numbers (pretrain, sft, rl; an added objective then
gets no share) or as a mapping objective name -> share ([`phase_mixtures`]).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from .config import OBJECTIVES


logger = logging.getLogger(__name__)


def phase_mixtures(
    mixtures: Sequence[float] | Sequence[Mapping[str, float]],
    num_phases: int,
    names: Sequence[str],
    halves: Mapping[str, str] | None = None,
) -> list[tuple[float, ...]]:
    """Each phase's target mixture as one share per objective, in the order of `names`.

    Args:
        mixtures: `curriculum_mixtures`: the flat list of one (pretrain, sft, rl) triple per phase (objectives after
            the built-in three get 0), or one mapping objective name -> share per phase (a name left out gets 0).
        num_phases (`int`): the number of phases (boundaries + 1).
        names (`Sequence[str]`): the run's objectives, the built-in three first.
        halves (`Mapping[str, str]`, *optional*): added objective -> built-in objective whose share it halves in the
            three-number form (the teacher's `distill` takes half of `rl`'s); ignored for mappings.

    Returns:
        `list[tuple[float, ...]]`: `num_phases` tuples of `len(names)` shares.

    Raises:
        ValueError: if a mapping names an objective the run does not have, or an added objective gets no share in any
            phase (it would never be trained), naming the fix.
    """
    mixtures = list(mixtures)
    extra = [name for name in names if name not in OBJECTIVES]
    if mixtures and all(isinstance(m, Mapping) for m in mixtures):
        known = set(names)
        for phase, mapping in enumerate(mixtures):
            unknown = sorted(set(mapping) - known)
            if unknown:
                raise ValueError(
                    f"curriculum_mixtures phase {phase} names {unknown}, which this run has no objective of (it has "
                    f"{list(names)}): fix the name or add the objective."
                )
        out = [tuple(float(mapping.get(name, 0.0)) for name in names) for mapping in mixtures]
    else:
        size = len(OBJECTIVES)
        out = [
            tuple(float(x) for x in mixtures[i : i + size]) + tuple(0.0 for _ in extra)
            for i in range(0, len(mixtures), size)
        ]
        for added, host in (halves or {}).items():
            i, j = list(names).index(added), list(names).index(host)
            out = [tuple(m[j] / 2 if k in (i, j) else x for k, x in enumerate(m)) for m in out]
    for name in extra:
        index = list(names).index(name)
        if all(m[index] == 0 for m in out):
            raise ValueError(
                f"The objective '{name}' gets no share in any curriculum phase, so it would never be trained: give "
                "curriculum_mixtures as one mapping objective -> share per phase, e.g. "
                f"[{{'pretrain': 0.6, 'sft': 0.2, 'rl': 0.1, '{name}': 0.1}}, ...]."
            )
    if len(out) != num_phases:
        raise ValueError(f"curriculum_mixtures gives {len(out)} phases, the boundaries make {num_phases}.")
    return out


class CurriculumSchedule:
    """The task mixture as a pure function of the optimizer step.

    Args:
        boundaries (`Sequence[float]`): phase boundaries as fractions of `total_steps`, strictly increasing in (0, 1).
        mixtures (`Sequence[Sequence[float]]`): one target per phase (len(boundaries) + 1), one share per objective
            (see [`phase_mixtures`]).
        total_steps (`int`): planned optimizer steps N.
        decay_steps (`float`): transition time constant tau in steps; a value < 1 is a fraction of `total_steps`.
        active (`Sequence[bool]`): which objectives are present; inactive ones get share 0 (default: all).
        mode (`str`): "phased", or "constant" for the time-average of the phased schedule at every step.
        names (`Sequence[str]`, *optional*): the objectives' names, in order (the built-in three by default).

    Raises:
        ValueError: if no objective is active, or the active objectives have zero mass in every phase.
    """

    def __init__(
        self,
        boundaries: Sequence[float],
        mixtures: Sequence[Sequence[float]],
        total_steps: int,
        decay_steps: float,
        active: Sequence[bool] | None = None,
        mode: str = "phased",
        names: Sequence[str] = OBJECTIVES,
    ):
        self.names = tuple(names)
        if active is None:
            active = tuple(True for _ in self.names)
        if len(active) != len(self.names) or any(len(m) != len(self.names) for m in mixtures):
            raise ValueError(
                f"The curriculum has {len(self.names)} objectives {list(self.names)}: give one active flag and one "
                "share per phase for each."
            )
        if len(mixtures) != len(boundaries) + 1:
            raise ValueError(f"{len(boundaries)} boundaries need {len(boundaries) + 1} mixtures, got {len(mixtures)}.")
        if not any(active):
            raise ValueError("The curriculum needs at least one active objective (one with data and weight > 0).")
        self.total_steps = max(int(total_steps), 1)
        self.boundary_steps = [b * self.total_steps for b in boundaries]
        if list(boundaries) != sorted(set(boundaries)) or any(not 0 < b < 1 for b in boundaries):
            raise ValueError(
                f"Curriculum boundaries {list(boundaries)} must be strictly increasing fractions in (0, 1)."
            )
        if decay_steps <= 0:
            raise ValueError(f"Curriculum decay_steps={decay_steps} must be positive.")
        self.mixtures = [tuple(float(x) for x in m) for m in mixtures]
        self.tau = decay_steps * self.total_steps if decay_steps < 1 else float(decay_steps)
        self._starts = self._phase_starts()
        self.active = tuple(bool(a) for a in active)
        self.mode = mode
        if mode == "constant":
            self._constant = self._time_average()
        elif mode != "phased":
            raise ValueError(f"curriculum_mode={mode!r} is not one of 'phased', 'constant'.")
        if all(sum(self._restrict(m)) == 0 for m in self.mixtures):
            raise ValueError(
                f"Every curriculum phase gives zero share to the active objectives {self._names()}; "
                "change `curriculum_mixtures`."
            )

    def _names(self) -> list[str]:
        return [name for name, a in zip(self.names, self.active) if a]

    def _restrict(self, mixture: Sequence[float]) -> tuple[float, ...]:
        return tuple(x if a else 0.0 for x, a in zip(mixture, self.active))

    def _raw(self, step: float) -> tuple[float, ...]:
        phase = sum(step >= b for b in self.boundary_steps)
        if phase == 0:
            return self.mixtures[0]
        start = self._starts[phase]
        target = self.mixtures[phase]
        ramp = 1.0 - math.exp(-(step - self.boundary_steps[phase - 1]) / self.tau)
        return tuple(s + (t - s) * ramp for s, t in zip(start, target))

    def _phase_starts(self) -> list[tuple[float, ...]]:
        """The mixture actually reached at each boundary (where the next transition starts from)."""
        starts = [self.mixtures[0], self.mixtures[0]]
        for k in range(2, len(self.mixtures)):
            previous_start, previous_target = starts[k - 1], self.mixtures[k - 1]
            span = self.boundary_steps[k - 1] - self.boundary_steps[k - 2]
            ramp = 1.0 - math.exp(-span / self.tau)
            starts.append(tuple(s + (t - s) * ramp for s, t in zip(previous_start, previous_target)))
        return starts

    def _time_average(self) -> tuple[float, ...]:
        n = self.total_steps
        sums = [0.0] * len(self.names)
        for step in range(n):
            for i, x in enumerate(self._raw(step)):
                sums[i] += x / n
        return tuple(sums)

    def phase(self, step: int) -> int:
        """Index of the phase that `step` belongs to (0-based)."""
        return sum(step >= b for b in self.boundary_steps)

    def mixture(self, step: int) -> tuple[float, ...]:
        """Share of the step's examples per objective (in the order of `names`), restricted to active ones, summing
        to 1.

        If the schedule gives the active objectives no mass at this step (e.g. only pretraining data exists and the
        phase is 0/0/100 on the others), the active objectives share equally.
        """
        raw = self._constant if self.mode == "constant" else self._raw(step)
        restricted = self._restrict(raw)
        total = sum(restricted)
        if total <= 0:
            count = sum(self.active)
            return tuple(1.0 / count if a else 0.0 for a in self.active)
        return tuple(x / total for x in restricted)

    def metrics(self, step: int, shares: Sequence[float] | None = None) -> dict[str, float]:
        """`curriculum/<objective>` shares of the active objectives and `curriculum/phase` of optimizer step `step`
        (shares recomputed if None). An inactive objective (no data, or weight 0) has no key: its share is always 0.

        The schedule is a pure function of the optimizer step, which the `Trainer` checkpoints, so a resumed run
        continues it exactly where it stopped.
        """
        mix = self.mixture(step) if shares is None else shares
        out = {f"curriculum/{name}": value for name, value, on in zip(self.names, mix, self.active) if on}
        out["curriculum/phase"] = float(self.phase(step))
        return out
