# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Targeted exploration: a task family whose groups keep scoring the same is sampled at a higher temperature.

A group of `num_generations` completions that all get the same reward has group-relative advantages 0 and gives RL no
gradient. Where the prompt has a demonstration, guidance (`trl_trapo/guidance.py`) supplies the missing signal; where
it has none (the built-in suite's `lst` family; any RL-only data), the only way out is for the policy to sample
something different. This module raises the sampling temperature of the task families whose groups carry no signal,
and lowers it again once they do — the per-family temperature adaptation that curriculum samplers for RL use to
spend exploration where the signal is missing (cf. the "zero-advantage" filtering and resampling of DAPO, Yu et al.
2025, arXiv 2503.14476, which discards such groups instead; here they are re-sampled hotter).

A flat group is *stuck* only when its common score is the lowest score seen so far in the run (all wrong); a group
whose completions all score above that (all right: solved) carries no gradient either, but sampling it hotter only
spends rollouts on a family that has nothing left to find (DAPO drops both kinds; only the stuck kind needs more
exploration). The rule, after every generation round, per family f (the RL dataset's `task` value; one family "all"
without a `task` column), with z_f = the fraction of f's groups in the round that are stuck:

    boost_f <- min(boost_f + step, max_temperature - temperature)   if z_f >= 0.5
    boost_f <- max(boost_f - step, 0)                               otherwise

and the next round samples f's prompts at `temperature + boost_f` (in few-shot mode, whose rounds are sampled at an
annealed temperature T(step), at `T(step) * (temperature + boost_f) / temperature`: the family's boost is a factor on
the round's temperature, see `row_temperatures`). A round is still one unit: every row is sampled at
its own temperature in the same batched `generate` call (`samplers.RowTemperatureLogitsWarper`, applied where the one
temperature would be, before top-k / top-p). Every trajectory carries its sampling temperature, and the training
forward scores it at that temperature (the same temperature-scaled log-probs its behaviour and reference log-probs
were recorded with), so the PPO ratio of a fresh trajectory is 1 whatever its temperature.

Heat can run out. On the built-in suite's `lst` family a policy that writes several letters reaches a correct
answer (one letter, then stop) with probability ~1e-3 per completion at *every* temperature from 0.5 to 2 (measured
on the failing seed-grid runs, see CHANGELOG): the family then sits at the ceiling for hundreds of steps with one
group of 8 completions every few steps, and no success is ever sampled. Only more samples help then, so a family
that is still stuck in a round it was sampled at the ceiling is *searched*: each of its groups in the next rounds is
sampled again 1, 2, 4, ... times (doubling with every consecutive stuck round at the ceiling — the doubling search for
an unknown success rate — up to `exploration_max_search` times), and any success among those extra completions
reaches self-imitation (a rejection-sampling step, STaR / RAFT; `trl_trapo/memory/successes.py`), which makes it an
SFT row. The extra completions feed nothing else (not RL, not this rule), so the RL data and the temperature rule are
what they were; the search stops as soon as a round of the family carries a signal or leaves the ceiling.

With a `value_model` there is one completion per prompt (PPO: advantages come from GAE, not from groups), so there
are no groups to find flat. The unit is then the family's completions in the round, and the same question is asked of
it: f is stuck (z_f = 1, else 0) when it has at least one scored completion in the round and every one of them scored
the lowest score seen so far. That is when the critic's advantages die out too: a family that never succeeds gives
returns the value head learns to predict (its advantages r - V go to 0), and only a different sample brings signal
back. A family that scores above the floor anywhere in the round has something to learn from and cools. The search
below needs groups (self-imitation keeps a success found among a group's repeats): it is off with a `value_model`.

z_f and the lowest score are taken over the whole round: under data parallelism every rank's share of it (the
`gather` the trainer hands in), so every rank reaches the same boosts. The state is checkpointed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


ALL_FAMILIES = "all"
"""The family name of every prompt when the RL dataset has no `task` column."""


def zero_variance_groups(scores: torch.Tensor, group: int) -> torch.Tensor:
    """Which groups of a round carry no group-relative signal.

    Args:
        scores (`torch.Tensor`): `(B,)` scores of the round's completions (NaN: no reward), `group` consecutive
            completions per prompt.
        group (`int`): completions per prompt (>= 2).

    Returns:
        `torch.Tensor`: `(B // group,)` bool, True where at least two completions are scored and all of them score
        the same (within 1e-6, the tolerance `DemonstrationGuidance` uses); False for groups with fewer than two
        scored completions (no verdict).

    Raises:
        ValueError: if `B` is not a multiple of `group` or `group` < 2.
    """
    if group < 2 or scores.numel() % group:
        raise ValueError(f"zero_variance_groups: {scores.numel()} scores do not form groups of {group} (>= 2).")
    grouped = scores.reshape(-1, group).double()
    valid = ~torch.isnan(grouped)
    high = torch.where(valid, grouped, -torch.inf).amax(dim=1)
    low = torch.where(valid, grouped, torch.inf).amin(dim=1)
    return (valid.sum(dim=1) >= 2) & ((high - low) <= 1e-6)


class TargetedExploration:
    """Per-family sampling temperatures that rise while a family's groups carry no signal (module docstring).

    Args:
        temperature (`float`): the configured sampling temperature (the floor).
        max_temperature (`float`): the ceiling (> `temperature`).
        step (`float`): how much one round moves a family's temperature (> 0).
        gather (`Callable[[list], list]`, *optional*): concatenates a list over every rank, in rank order, the same
            on every rank (collective; e.g. accelerate's `gather_object`). With it, `observe` decides from the whole
            round, every rank's share; None: from this process's rows only (one process).
        max_search (`int`): the most extra samplings of one stuck group per round once its family is stuck at the
            ceiling (module docstring; >= 0, 0: no search).

    Raises:
        ValueError: if `max_temperature <= temperature`, `step <= 0` or `max_search` is not an integer >= 0.
    """

    THRESHOLD = 0.5  # a family is "stuck" in a round when at least half of its groups carry no signal

    def __init__(
        self,
        temperature: float,
        max_temperature: float,
        step: float,
        gather: Callable[[list], list] | None = None,
        max_search: int = 0,
    ):
        if not max_temperature > temperature:
            raise ValueError(
                f"exploration_max_temperature={max_temperature!r} must exceed temperature={temperature!r}: raise it "
                "(e.g. 1.5 x temperature) or turn exploration off."
            )
        if not step > 0:
            raise ValueError(f"exploration_temperature_step={step!r}: use a positive step (e.g. 0.1).")
        if isinstance(max_search, bool) or not isinstance(max_search, int) or max_search < 0:
            raise ValueError(f"exploration_max_search={max_search!r}: use an integer >= 0 (0: no search).")
        self.temperature = float(temperature)
        self.max_boost = float(max_temperature) - float(temperature)
        self.step = float(step)
        self.gather = gather
        self.levels: dict[str, int] = {}  # family -> boost in steps (0 = the configured temperature)
        self.lowest_score: float | None = None  # the lowest score seen so far (a flat group at it is stuck)
        self.max_search = int(max_search)
        # family -> consecutive rounds stuck at the ceiling (k: each group is sampled again min(2^(k-1), max_search) x)
        self.search_levels: dict[str, int] = {}

    @property
    def max_level(self) -> int:
        """The highest boost, in steps (the last step may be partial: the temperature never passes the ceiling)."""
        return max(1, math.ceil(self.max_boost / self.step - 1e-9))

    @property
    def max_search_level(self) -> int:
        """The search level at which the repeats reach `max_search` (0 without search)."""
        return 1 + math.ceil(math.log2(self.max_search)) if self.max_search else 0

    def search_repeats(self, family: str) -> int:
        """How many more times each of `family`'s groups in a round is sampled for the search: 0 unless the family
        was stuck at the ceiling in its last round(s), then 1, 2, 4, ... (one doubling per consecutive such round) up
        to `max_search`."""
        level = self.search_levels.get(family, 0)
        return min(2 ** (level - 1), self.max_search) if level else 0

    def temperature_of(self, family: str) -> float:
        """The sampling temperature of `family`'s next prompts."""
        return self.temperature + min(self.levels.get(family, 0) * self.step, self.max_boost)

    @staticmethod
    def families(examples: list[dict]) -> list[str]:
        """The family of each row: its `task` value, or `ALL_FAMILIES` when a row has none."""
        return [str(e["task"]) if "task" in e else ALL_FAMILIES for e in examples]

    def row_temperatures(self, examples: list[dict], base: float | None = None) -> list[float]:
        """The sampling temperature of each row of a round (its family's), for one batched `generate` call.

        Args:
            examples (`list[dict]`): the round's rows.
            base (`float`, *optional*): the round's own temperature when it is not the configured one (few-shot
                mode's annealed T(step)): each family's boost then scales it by the same factor it scales the
                configured temperature, `base * temperature_of(f) / temperature` (so the ceiling is
                `base * max_temperature / temperature`). None, or the configured temperature: `temperature_of(f)`.

        Returns:
            `list[float]`: one temperature per row.
        """
        temperatures = [self.temperature_of(family) for family in self.families(examples)]
        if base is None or base == self.temperature:
            return temperatures
        return [base * (t / self.temperature) for t in temperatures]

    def observe(self, batch) -> None:
        """Update the families from a finished round's scores (the sampled completions', before guidance).

        A group is stuck when its scored completions all score the same and that score is the lowest score seen so
        far (this round included), within 1e-6; a family is stuck when at least `THRESHOLD` of its groups in the
        round are. With one completion per prompt (`group` 1: a value_model), a family is stuck when it has a scored
        completion in the round and every scored one is at that lowest score (module docstring). With `gather`, the round is every rank's share together (collective: every rank calls this). A
        family stuck in a round it was sampled at the ceiling moves one search level up (its repeats double, see
        `search_repeats`); a family not stuck, or not at the ceiling, stops searching.

        Args:
            batch ([`~trl_trapo.rollout.RolloutBatch`]): this rank's share of the round; reads its `examples` (B rows,
                `group` consecutive rows per prompt, `group` >= 1) and `on_policy_scores` (`(B,)`, NaN: no reward).

        Raises:
            ValueError: if `group` >= 2 and the round's rows do not form groups of `group`.
        """
        group, scores = batch.group, batch.on_policy_scores
        families = self.families(batch.examples)[::group]
        if self.gather is not None:  # (family, scores of the group) of every group of the round, rank by rank
            records = self.gather(list(zip(families, scores.reshape(-1, group).tolist())))
            families = [family for family, _ in records]
            scores = torch.tensor(
                [value for _, group_scores in records for value in group_scores], dtype=torch.float64
            )
        flat = zero_variance_groups(scores, group) if group != 1 else None
        finite = scores[torch.isfinite(scores)]
        if finite.numel():
            low = float(finite.double().min())
            self.lowest_score = low if self.lowest_score is None else min(self.lowest_score, low)
        if flat is None:  # one completion per prompt (a value_model): a family's completions of the round are one unit
            stuck_families = self._stuck_families_of_singles(families, scores)
        else:
            if self.lowest_score is not None:
                grouped = scores.reshape(-1, group).double()
                group_low = torch.where(torch.isnan(grouped), torch.inf, grouped).amin(dim=1)
                flat = flat & (group_low <= self.lowest_score + 1e-6)
            stuck_families = {}
            for family in dict.fromkeys(families):
                mine = torch.tensor([f == family for f in families])
                stuck_families[family] = float(flat[mine].double().mean()) >= self.THRESHOLD
        for family, stuck in stuck_families.items():
            level = self.levels.get(family, 0)
            if stuck and level >= self.max_level and self.max_search:  # heat has run out: search by volume
                self.search_levels[family] = min(self.search_levels.get(family, 0) + 1, self.max_search_level)
            else:
                self.search_levels.pop(family, None)
            level = min(level + 1, self.max_level) if stuck else max(level - 1, 0)
            if level:
                self.levels[family] = level
            else:
                self.levels.pop(family, None)

    def _stuck_families_of_singles(self, families: list[str], scores: torch.Tensor) -> dict[str, bool]:
        """Which families of a round of one completion per prompt are stuck: those with at least one scored completion
        in the round, every scored one at the lowest score seen so far (within 1e-6). See the module docstring."""
        scored = ~torch.isnan(scores)
        floor = self.lowest_score if self.lowest_score is not None else -math.inf  # no finite score yet: none stuck
        at_floor = scored & (scores.double() <= floor + 1e-6)
        out = {}
        for family in dict.fromkeys(families):
            mine = torch.tensor([f == family for f in families])
            out[family] = bool((mine & scored).any()) and bool((at_floor[mine] == scored[mine]).all())
        return out

    def metrics(self, families: list[str] | None) -> dict[str, float]:
        """`exploration/temperature` (mean over the tracked families, or of "all") and, per tracked family,
        `exploration/temperature/<family>`; with search, per tracked family `exploration/search/<family>` (the
        repeats of its next round; what the search sampled and kept is counted by self-imitation, per rank)."""
        names = families or [ALL_FAMILIES]
        out = {f"exploration/temperature/{name}": self.temperature_of(name) for name in names} if families else {}
        out["exploration/temperature"] = sum(self.temperature_of(n) for n in names) / len(names)
        if self.max_search and families:
            out.update({f"exploration/search/{name}": float(self.search_repeats(name)) for name in names})
        return out

    def state_dict(self) -> dict:
        """The per-family boosts and search levels and the lowest score seen (JSON-serialisable; the same on every
        rank)."""
        return {
            "levels": dict(self.levels),
            "lowest_score": self.lowest_score,
            "search_levels": dict(self.search_levels),
        }

    def load_state_dict(self, state: dict | None) -> None:
        """Restore `state_dict()`; None (a checkpoint made without exploration) starts every family at the floor."""
        state = state or {}
        self.levels = {str(k): int(v) for k, v in state.get("levels", {}).items()}
        lowest = state.get("lowest_score")
        self.lowest_score = None if lowest is None else float(lowest)
        self.search_levels = {str(k): int(v) for k, v in state.get("search_levels", {}).items()}
