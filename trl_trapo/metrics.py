# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Training metrics between two logs: per-step sums the loss adds, rollout sums, and what reward functions log.

- Step metrics (`loss/*`, `policy/*`, `val/*`): each micro-batch adds its contribution (every term already carries
  its global normaliser, so the sum over a step's micro-batches is the step's value); at log time each key is
  averaged over the optimizer steps that measured it and reduced over ranks. Sums stay on the device: nothing syncs
  until the log.
- Rollout metrics (`objective/*`, `completions/*`, `rewards/*`, `val/num_eos_tokens`): sums over the rollouts
  generated since the last log, divided by their count at log time. `rl/zero_variance_groups`: the fraction of
  groups (the `num_generations` completions of one prompt, at least two of them scored) whose scores are all equal —
  their group-relative advantages are 0, so they give RL no gradient; per task family as
  `rl/zero_variance_groups/<task>` when the RL dataset has a `task` column.
- Lengths count the policy's own tokens: `completions/mean_length` is the mean number of tokens the policy sampled
  per completion (as TRL's GRPO counts with an `env_mask`); tokens an environment wrote into a multi-turn completion
  (completion mask 0, e.g. tool results) count in no length, and `completions/mean_env_length` (logged when the
  trainer has a rollout source of its own or a `rollout_func`, see `track_env_tokens`) is their mean number per
  completion. `objective/entropy` (minus the summed behaviour log-probs) and `objective/kl` sum the policy's tokens
  only as well.

- Sampler/trainer mismatch (`sampling/*`, rounds another engine sampled: vLLM, a `rollout_func` returning
  `logprobs`, a source's `sampler_per_token_logps`; with `vllm_importance_sampling_correction`; TRL GRPO's names):
  over every such round since the last log, `sampling/sampling_logp_difference/mean|max` (|log pi_trainer - log
  pi_sampler| per token), `sampling/importance_sampling_ratio/min|mean|max` (the weights, after the bound),
  `sampling/raw_importance_sampling_ratio/min|mean|max` (before it, TRL #5231 / #5243) and
  `sampling/importance_sampling_ratio/clipped_frac|masked_frac` (the fraction of the mode's units, tokens or
  sequences, clipped or set to 0). Means are over all units of all ranks; min and max over all ranks.

- Asynchronous rollouts (`async_rollouts=True`, see `trl_trapo/async_rollouts.py`; TRL's AsyncGRPO names):
  `sample/staleness_mean` and `sample/staleness_max` (lag in optimizer steps of the rounds that arrived since the last
  log: the consuming step minus the weights version that sampled them; mean over rounds of all ranks, max over all
  ranks), `sample/dropped_stale_total` (rounds dropped for arriving later than `max_staleness`, since the start of the
  run, summed over ranks), `perf/rollout_wait_s` (seconds the trainer waited for the producer since the last log,
  mean over ranks), `perf/rollout_wait_share` (that wait over the wall time since the last log),
  `perf/weight_sync_s` (seconds spent sending weights to the producer, mean over ranks),
  `perf/producer_generate_s` and `perf/producer_reward_s` (the producer's generation and reward seconds per round).
  With an asynchronous source (`track_async`): `sample/dropped_stale_total` at every log, the round metrics when a
  round arrived since the last log, `perf/weight_sync_s` when weights were sent.

- TRL 1.16 `GRPOTrainer`'s keys, with its definitions, beside ours (docs/metrics.md, "TRL GRPOTrainer's keys"):
  from each round, over every rank's share of it — `reward` and `reward_std` (mean and standard deviation, Bessel's,
  of the weighted reward before `missing_eos_penalty`, over the round's completions as sampled),
  `frac_reward_zero_std` (the completions whose group's reward std is 0, `torch.isclose`; the whole round's under
  `scale_rewards="batch"`), `rewards/<name>/std`, `completions/min_length|max_length` and
  `completions/mean|min|max_terminated_length` (completions that wrote a stop token; 0 when none did, as TRL logs
  it); each averaged over the rounds since the last log, as TRL averages its per-round values. `num_tokens`: prompt
  and policy tokens of every round since the start of the run, all ranks (checkpointed). From the loss:
  `clip_ratio/low_mean|high_mean|region_mean` (token fractions whose ratio fell below 1 - epsilon with a negative
  advantage, above 1 + epsilon with a positive one, either), `clip_ratio/low_min|high_max` (per optimizer step, the
  least / most of those fractions per sequence over every rank, averaged over the steps), `entropy` and `kl` (our
  `policy/entropy_avg` and `policy/kl_avg`), `step_time` (host seconds from building a step's rows, rollouts
  included, to the end of its last backward; mean over ranks and steps).

A metric nothing measured since the last log is absent from that log, never 0.
- `log_metric(name, value)` / `log_extra(column, values)`: what reward functions report through TRL's contract.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from trl.trainer.utils import nanstd

from .distributed import reduce_named_means
from .exploration import zero_variance_groups


# step metrics reduced by their extreme, not summed: the loss adds one value per micro-batch (TRL GRPO's names)
STEP_EXTREMA = {"clip_ratio/low_min": "min", "clip_ratio/high_max": "max"}


class Moments(NamedTuple):
    """A sample's count, mean and sum of squared deviations from the mean (what [`merge_moments`] combines)."""

    count: float
    mean: float
    m2: float


def moments(values: torch.Tensor) -> Moments:
    """`(count, mean, sum of squared deviations from the mean)` of the non-NaN entries of `values` (float64), the
    parts [`merge_moments`] combines exactly (a constant sample keeps a deviation sum of exactly 0)."""
    valid = values[~torch.isnan(values)].double()
    if not valid.numel():
        return Moments(0.0, 0.0, 0.0)
    mean = valid.mean()
    return Moments(float(valid.numel()), float(mean), float(((valid - mean) ** 2).sum()))


def merge_moments(parts: Sequence[Sequence[float]]) -> Moments:
    """The [`moments`] of the union of samples from theirs (Chan, Golub and LeVeque's pairwise update)."""
    count, mean, m2 = 0.0, 0.0, 0.0
    for n, part_mean, part_m2 in parts:
        if not n:
            continue
        total = count + n
        delta = part_mean - mean
        mean += delta * n / total
        m2 += part_m2 + delta**2 * count * n / total
        count = total
    return Moments(count, mean, m2)


def sample_std(count: float, m2: float) -> float:
    """Standard deviation with Bessel's correction (TRL's `nanstd`); NaN under two values."""
    return math.sqrt(max(m2, 0.0) / (count - 1)) if count > 1 else math.nan


def objective_metrics(objective: Any) -> dict[str, float]:
    """An objective's own metrics (`Objective.metrics()`) as the log takes them: each value a Python float. A number of
    another type — a one-element tensor (`torch.tensor(n)`), a numpy scalar, an int — is converted with `float()`;
    logged as it was, a tensor reached `trainer_state.json` and the first checkpoint's save failed inside transformers
    with "Object of type Tensor is not JSON serializable", naming neither the objective nor `metrics()`, after the
    model shards were written (trial 12's N33).

    Raises:
        TypeError: naming the objective, the key and the value's type, when `metrics()` does not return a mapping of
            names to numbers (a tensor of several elements, a string, None).
    """
    name = getattr(objective, "name", type(objective).__name__)
    given = objective.metrics()
    if not isinstance(given, dict):
        raise TypeError(
            f"Objective {name!r}: metrics() returned a {type(given).__name__}; return a dict of metric name -> float."
        )
    out = {}
    for key, value in given.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        elif hasattr(value, "item") and getattr(value, "size", None) == 1:  # a numpy scalar or one-element array
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            shape = f" of shape {tuple(value.shape)}" if hasattr(value, "shape") else ""
            raise TypeError(
                f"Objective {name!r}: metrics()[{key!r}] is a {type(value).__name__}{shape} ({str(value)[:80]}); each "
                "value is logged and saved in trainer_state.json: return a float (e.g. `float(x)` / `x.item()`)."
            )
        out[key] = float(value)
    return out


class MetricsAccumulator:
    """Collects training metrics between two logs (see the module docstring).

    Args:
        reward_names (`list[str]`): names of the reward functions / models (for `rewards/<name>/mean`).
        scale_rewards (`str`): the run's `scale_rewards`; under "batch" `frac_reward_zero_std` asks whether the whole
            round's reward std is 0, as TRL's GRPO does (per group otherwise).
    """

    def __init__(self, reward_names: list[str], scale_rewards: str = "group"):
        self.reward_names = list(reward_names)
        self.scale_rewards = scale_rewards
        self.tokens_seen = 0  # prompt and policy tokens of every round on this rank since the start (`num_tokens`)
        self.step_started: float | None = None  # when the current optimizer step began to be built (`step_time`)
        self.task_names: list[str] = []
        self.env_tokens = False
        self.async_rollouts = False
        self.dropped_stale_total = 0
        self.reset()

    def track_env_tokens(self) -> None:
        """Log `completions/mean_env_length`, the environment's tokens per completion (for a rollout source that
        may return a completion mask; every rank calls this, so that the cross-rank reduction sees the same keys)."""
        self.env_tokens = True

    def track_async(self) -> None:
        """Log the asynchronous-rollout metrics (module docstring) at every log; every rank calls this."""
        self.async_rollouts = True

    def add_async_round(self, lag: int, generate_seconds: float, reward_seconds: float) -> None:
        """A round from the producer entered training `lag` optimizer steps after the weights that sampled it."""
        sums = self.async_sums
        sums["sample/rounds"] += 1.0
        sums["sample/staleness_sum"] += float(lag)
        sums["perf/producer_generate_s"] += float(generate_seconds)
        sums["perf/producer_reward_s"] += float(reward_seconds)
        self.async_extrema["sample/staleness_max"] = max(self.async_extrema["sample/staleness_max"], float(lag))

    def add_async_wait(self, seconds: float) -> None:
        """The trainer waited `seconds` for the producer."""
        self.async_sums["perf/rollout_wait_s"] += float(seconds)

    def add_weight_sync(self, seconds: float) -> None:
        """Sending weights to the producer took `seconds`."""
        self.async_sums["perf/weight_sync_s"] += float(seconds)
        self.async_sums["perf/weight_syncs"] += 1.0

    def set_dropped_stale_total(self, total: int) -> None:
        """Rounds this rank's source has dropped since the start of the run (checkpointed by the source)."""
        self.dropped_stale_total = int(total)

    def track_tasks(self, task_names: list[str]) -> None:
        """Log `rl/zero_variance_groups/<task>` for these task families (the RL dataset's `task` values; the same
        list on every rank, so that the cross-rank reduction sees the same keys)."""
        self.task_names = sorted(set(task_names))

    def reset(self) -> None:
        """Forget everything collected since the last log."""
        self.step_sums: dict[str, torch.Tensor] = {}
        self.step_counts: dict[str, int] = {}  # optimizer steps that contributed to each key since the last log
        self._keys_this_step: set[str] = set()
        self.rollout_sums: dict[str, float] = defaultdict(float)
        self.rollout_extrema: dict[str, float] = {}  # largest value since the last log (a minimum is stored negated)
        self.reward_metrics: dict[str, list[float]] = defaultdict(list)
        self.extra_columns: dict[str, list] = defaultdict(list)
        # asynchronous rollouts: apart from `rollout_sums`, whose keys must agree across ranks (a weight sync is not)
        self.async_sums: dict[str, float] = defaultdict(float)
        self.async_extrema: dict[str, float] = {"sample/staleness_max": 0.0}
        self.window_start = time.perf_counter()
        self.trl_rounds: list[dict] = []  # TRL GRPO's statistics of each round (this rank's share), in order
        self.step_extrema: dict[str, torch.Tensor] = {}  # STEP_EXTREMA of the current step (a minimum negated)
        self.step_extrema_steps: list[dict[str, torch.Tensor]] = []  # one per optimizer step since the last log

    # ---- what the loss adds -----------------------------------------------------------------------------------------
    def add(self, key: str, value: torch.Tensor) -> None:
        """Add a micro-batch's contribution to a step metric (averaged at log time over the steps that had it); a
        key of `STEP_EXTREMA` keeps the step's least or largest value instead (over every rank at log time)."""
        if key in STEP_EXTREMA:
            signed = value.detach().double() * (-1.0 if STEP_EXTREMA[key] == "min" else 1.0)
            held = self.step_extrema.get(key)
            self.step_extrema[key] = signed if held is None else torch.maximum(held, signed.to(held.device))
            return
        value = torch.nan_to_num(value.detach().double(), nan=0.0, posinf=0.0, neginf=0.0)
        self.step_sums[key] = self.step_sums[key] + value if key in self.step_sums else value
        self._keys_this_step.add(key)

    def start_step(self) -> None:
        """An optimizer step starts being built (its rows drawn, a generation round run when one is due)."""
        self.step_started = time.perf_counter()

    def end_step(self) -> None:
        """Count the optimizer step that just ended (after its last backward) for every key it added; its
        `step_time` is the host time since [`start_step`] (TRL GRPO's: the step's work without the optimizer's)."""
        if self.step_started is not None:
            self.add("step_time", torch.tensor(time.perf_counter() - self.step_started, dtype=torch.float64))
            self.step_started = None
        for key in self._keys_this_step:
            self.step_counts[key] = self.step_counts.get(key, 0) + 1
        self._keys_this_step = set()
        self.step_extrema_steps.append(self.step_extrema)  # every step, on every rank: the same count to gather
        self.step_extrema = {}

    # ---- what rollouts and reward functions add --------------------------------------------------------------------
    def add_rollouts(self, batch) -> None:
        """Add a finished round ([`~trl_trapo.rollout.RolloutBatch`], B completions): its completions, behaviour
        log-probs, per-sequence KL, `(B,)` scores (NaN = no reward), `(B, F)` rewards per function and truncation
        flags; its groups of `group` completions (one prompt, whose task family is `tasks[i]`). With guidance
        (`off_policy` set) the rollout metrics describe sampled completions only, the zero-variance fraction the groups
        as sampled (`on_policy_scores`), and `rl/guided_groups` counts the groups that got a demonstration."""
        guided = batch.off_policy
        group = batch.group
        group_scores = batch.scores if batch.on_policy_scores is None else batch.on_policy_scores
        completion_ids, old_logps, kl = batch.completion_ids, batch.old_per_token_logps, batch.kl
        scores, per_func, is_truncated = batch.scores, batch.per_func, batch.is_truncated
        masks = batch.completion_mask  # (C_i,) each: 1 on the policy's tokens; None: every token is the policy's
        if guided is not None:
            n_groups = len(completion_ids) // max(group, 1)
            self.rollout_sums["rl/all_groups"] += float(n_groups)
            self.rollout_sums["rl/guided_groups"] += float(guided.sum())
            if bool(guided.any()):
                keep = (~guided).nonzero().squeeze(-1).tolist()
                completion_ids = [completion_ids[i] for i in keep]
                old_logps = [old_logps[i] for i in keep]
                masks = [masks[i] for i in keep] if masks is not None else None
                kl = kl[keep] if kl is not None else None
                scores, per_func, is_truncated = scores[keep], per_func[keep], is_truncated[keep]
        if batch.sampler_correction is not None:  # over every completion the sampler returned, guided ones too
            self._add_sampler_correction(batch.sampler_correction)
        self._add_sampled(completion_ids, old_logps, kl, scores, per_func, is_truncated, masks)
        self._add_trl_round(batch, completion_ids, masks, per_func, is_truncated)
        if group > 1 and group_scores.numel() % group == 0:
            self._add_groups(group_scores.view(-1, group), batch.tasks[::group] if batch.tasks is not None else None)

    def _add_sampled(self, completion_ids, old_logps, kl, scores, per_func, is_truncated, masks=None) -> None:
        sums = self.rollout_sums
        n = len(completion_ids)
        valid = ~torch.isnan(scores)
        sums["rollouts"] += n
        sums["rollouts_scored"] += float(valid.sum())
        sums["objective/scores"] += float(torch.nan_to_num(scores, nan=0.0).sum())
        sums["objective/kl"] += sum(kl.tolist()) if kl is not None else 0.0
        if masks is None:
            sums["objective/entropy"] += float(sum(-o.sum() for o in old_logps))
            sums["completions/mean_length"] += float(sum(c.numel() for c in completion_ids))
        else:  # the policy's tokens only (mask 1); the environment's are counted apart
            sums["objective/entropy"] += float(sum(-(o * m).sum() for o, m in zip(old_logps, masks)))
            sums["completions/mean_length"] += float(sum(m.sum() for m in masks))
        if self.env_tokens:  # the key on every rank, rounds without a mask included
            env = sum(float((1 - m).sum()) for m in masks) if masks is not None else 0.0
            sums["completions/mean_env_length"] += env
        sums["completions/clipped_ratio"] += float(is_truncated.float().sum())
        for i, name in enumerate(self.reward_names):
            column = per_func[:, i]
            sums[f"rewards/{name}/mean"] += float(torch.nan_to_num(column, nan=0.0).sum())
            sums[f"rewards/{name}/count"] += float((~torch.isnan(column)).sum())
            sums[f"rewards/{name}/unscored"] += float(torch.isnan(column).sum())  # None or NaN: abstained

    def _add_trl_round(self, batch, completion_ids, masks, per_func, is_truncated) -> None:
        """TRL GRPO's statistics of a round (this rank's share; merged over ranks per round at log time): lengths of
        the sampled completions (`completion_ids`, `masks`, `per_func`, `is_truncated`: guided rows left out), the
        weighted reward of every completion as sampled (`batch.rewards`), its groups' zero-std flags, and the
        round's prompt and policy tokens (`num_tokens`)."""
        lengths = torch.tensor(
            [float(c.numel()) for c in completion_ids] if masks is None else [float(m.sum()) for m in masks],
            dtype=torch.float64,
        )
        ended = lengths[~is_truncated.bool()]
        rewards = (batch.rewards if batch.rewards is not None else batch.scores).double()
        group = batch.group
        zero, grouped = 0.0, 0.0
        if group > 1 and rewards.numel() % group == 0:
            grouped = float(rewards.numel())
            std = nanstd(rewards.view(-1, group), dim=1)  # NaN under two scores: not zero, as in TRL
            zero = float(torch.isclose(std, torch.zeros_like(std)).sum()) * group
        policy_tokens = (
            sum(c.numel() for c in batch.completion_ids)
            if batch.completion_mask is None
            else int(sum(float(m.sum()) for m in batch.completion_mask))
        )
        self.tokens_seen += sum(p.numel() for p in batch.prompt_ids) + policy_tokens
        self.trl_rounds.append(
            {
                "n": float(lengths.numel()),
                "len_min": float(lengths.min()) if lengths.numel() else math.inf,
                "len_max": float(lengths.max()) if lengths.numel() else -math.inf,
                "term_n": float(ended.numel()),
                "term_sum": float(ended.sum()),
                "term_min": float(ended.min()) if ended.numel() else math.inf,
                "term_max": float(ended.max()) if ended.numel() else -math.inf,
                "reward": moments(rewards),
                "zero": zero,
                "grouped": grouped,
                "funcs": [moments(per_func[:, i]) for i in range(len(self.reward_names))],
            }
        )

    def _add_sampler_correction(self, correction) -> None:
        """Sums and extremes of a round's [`~trl_trapo.sampler_correction.SamplerCorrection`] (every key on every rank,
        an empty round included, so that the cross-rank reduction sees the same keys)."""
        sums = self.rollout_sums
        sums["sampling/units"] += float(correction.ratio.numel())
        sums["sampling/raw_sum"] += float(correction.raw_ratio.double().sum())
        sums["sampling/ratio_sum"] += float(correction.ratio.double().sum())
        sums["sampling/clipped"] += float(correction.clipped.sum())
        sums["sampling/masked"] += float(correction.masked.sum())
        difference = correction.logp_difference if correction.logp_difference is not None else torch.zeros(0)
        sums["sampling/difference_sum"] += float(difference.double().sum())
        sums["sampling/difference_count"] += float(difference.numel())

        def largest(key: str, values: torch.Tensor) -> None:
            value = float(values.max()) if values.numel() else -float("inf")
            self.rollout_extrema[key] = max(self.rollout_extrema.get(key, -float("inf")), value)

        largest("sampling/importance_sampling_ratio/max", correction.ratio)
        largest("sampling/importance_sampling_ratio/min", -correction.ratio)
        largest("sampling/raw_importance_sampling_ratio/max", correction.raw_ratio)
        largest("sampling/raw_importance_sampling_ratio/min", -correction.raw_ratio)
        largest("sampling/sampling_logp_difference/max", difference)

    def _add_groups(self, scores: torch.Tensor, tasks: list[str] | None) -> None:
        """Count the groups (rows of `(G, group)` scores) with at least two scores, and those whose scores are equal
        (to 1e-6: identical up to rounding)."""
        sums = self.rollout_sums
        scored = (~torch.isnan(scores)).sum(1) >= 2
        flat = zero_variance_groups(scores.reshape(-1), scores.shape[1])
        sums["rl/groups"] += float(scored.sum())
        sums["rl/zero_variance_groups"] += float(flat.sum())
        for name in self.task_names:  # every known family, 0 included: the same keys on every rank
            of_task = torch.tensor([t == name for t in tasks]) if tasks is not None else torch.zeros_like(scored)
            sums[f"rl/groups/{name}"] += float((scored & of_task).sum())
            sums[f"rl/zero_variance_groups/{name}"] += float((flat & of_task).sum())

    def log_metric(self, name: str, value: float) -> None:
        """A reward function's `log_metric(name, value)`."""
        self.reward_metrics[name].append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        """A reward function's `log_extra(column, values)`."""
        self.extra_columns[column].extend(values)

    # ---- log time ---------------------------------------------------------------------------------------------------
    def collect(self, accelerator, kl_coef: float) -> dict[str, float]:
        """Every metric since the last log, reduced over ranks (collective), then forget them.

        Args:
            accelerator: the Trainer's `Accelerator` (device and cross-rank reductions).
            kl_coef (`float`): the KL coefficient in use (for `objective/non_score_reward`).
        """
        out: dict[str, float] = {}
        keys = sorted(self.step_sums)
        if keys:
            stacked = torch.stack([self.step_sums[k].to(accelerator.device) for k in keys])
            steps = torch.tensor([max(self.step_counts.get(k, 0), 1) for k in keys], dtype=torch.float64)
            reduced = accelerator.reduce(stacked, reduction="sum").cpu() / steps
            values = dict(zip(keys, reduced.tolist()))
            if "val/ratio_sq" in values:
                values["val/ratio_var"] = max(values.pop("val/ratio_sq") - values.get("val/ratio", 0.0) ** 2, 0.0)
            if "step_time" in values:  # seconds each rank spent: their mean, not their sum
                values["step_time"] /= max(accelerator.num_processes, 1)
            out.update(values)
            for trl_key, ours in (("entropy", "policy/entropy_avg"), ("kl", "policy/kl_avg")):  # TRL GRPO's names
                if ours in values:
                    out[trl_key] = values[ours]
        if self.step_extrema_steps:
            out.update(self._step_extrema_metrics(accelerator))
        rollout_keys = sorted(self.rollout_sums)
        if rollout_keys:
            stacked = torch.tensor([self.rollout_sums[k] for k in rollout_keys], dtype=torch.float64)
            reduced = dict(zip(rollout_keys, accelerator.reduce(stacked.to(accelerator.device), "sum").cpu().tolist()))
            rollouts = max(reduced.get("rollouts", 0.0), 1.0)
            scored = max(reduced.get("rollouts_scored", 0.0), 1.0)
            out["objective/scores"] = reduced.get("objective/scores", 0.0) / scored
            out["objective/kl"] = reduced.get("objective/kl", 0.0) / rollouts
            out["objective/entropy"] = reduced.get("objective/entropy", 0.0) / rollouts
            out["objective/non_score_reward"] = -kl_coef * out["objective/kl"]
            out["objective/rlhf_reward"] = out["objective/scores"] + out["objective/non_score_reward"]
            out["completions/mean_length"] = reduced.get("completions/mean_length", 0.0) / rollouts
            out["completions/clipped_ratio"] = reduced.get("completions/clipped_ratio", 0.0) / rollouts
            if self.env_tokens:
                out["completions/mean_env_length"] = reduced.get("completions/mean_env_length", 0.0) / rollouts
            out["val/num_eos_tokens"] = rollouts - reduced.get("completions/clipped_ratio", 0.0)
            for name in self.reward_names:
                count = reduced.get(f"rewards/{name}/count", 0.0)
                if count:
                    out[f"rewards/{name}/mean"] = reduced[f"rewards/{name}/mean"] / count
                if reduced.get("rollouts", 0.0):
                    out[f"rewards/{name}/unscored_frac"] = reduced.get(f"rewards/{name}/unscored", 0.0) / rollouts
            if reduced.get("rl/all_groups", 0.0):
                out["rl/guided_groups"] = reduced["rl/guided_groups"] / reduced["rl/all_groups"]
            for suffix in ["", *(f"/{name}" for name in self.task_names)]:
                groups = reduced.get(f"rl/groups{suffix}", 0.0)
                if groups:
                    out[f"rl/zero_variance_groups{suffix}"] = reduced[f"rl/zero_variance_groups{suffix}"] / groups
            if "sampling/units" in reduced:
                out.update(self._sampler_correction_metrics(accelerator, reduced))
            out.update(self._trl_round_metrics(accelerator))
        if self.async_rollouts:
            out.update(self._async_metrics(accelerator))
        out.update(reduce_named_means(accelerator, self.reward_metrics))  # `log_metric` of reward functions
        self.reset()
        return out

    def _step_extrema_metrics(self, accelerator) -> dict[str, float]:
        """`STEP_EXTREMA`: each optimizer step's extreme over every rank, averaged over the steps that measured it
        (collective: every rank has as many steps since the last log)."""
        keys = sorted(STEP_EXTREMA)
        none = torch.full((), -math.inf, dtype=torch.float64, device=accelerator.device)
        steps = self.step_extrema_steps
        rows = torch.stack(
            [torch.stack([s[k].to(accelerator.device) if k in s else none for k in keys]) for s in steps]
        )
        best = accelerator.gather(rows).view(-1, *rows.shape).amax(0).cpu()  # (S, K): the largest over ranks
        out = {}
        for j, key in enumerate(keys):
            measured = best[:, j][torch.isfinite(best[:, j])]
            if measured.numel():
                value = float(measured.mean())
                out[key] = 0.0 - value if STEP_EXTREMA[key] == "min" else value  # 0.0 - 0.0 is 0.0, not -0.0
        return out

    def _trl_round_metrics(self, accelerator) -> dict[str, float]:
        """TRL GRPOTrainer's per-round metrics: each round's shares merged over ranks, each value averaged over the
        rounds that define it (NaN ones left out, as TRL's `log` does), and `num_tokens` (collective on several
        processes: every rank consumes every round)."""
        ranks = [(self.tokens_seen, self.trl_rounds)]
        if accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            ranks = gather_object(ranks)
        values: dict[str, list[float]] = defaultdict(list)
        for index in range(max(len(rounds) for _, rounds in ranks)):
            parts = [rounds[index] for _, rounds in ranks if index < len(rounds)]
            for key, value in self._trl_round_values(parts).items():
                if not math.isnan(value):
                    values[key].append(value)
        out = {key: sum(v) / len(v) for key, v in values.items() if v}
        out["num_tokens"] = float(sum(tokens for tokens, _ in ranks))
        return out

    def _trl_round_values(self, parts: list[dict]) -> dict[str, float]:
        """One round's TRL GRPO metrics from every rank's share of it (NaN where the round defines none)."""
        n = sum(p["n"] for p in parts)
        term_n = sum(p["term_n"] for p in parts)
        count, mean, m2 = merge_moments([p["reward"] for p in parts])
        std = sample_std(count, m2)
        grouped = sum(p["grouped"] for p in parts)
        if not grouped:  # groups of one (a critic): no group-relative advantage to vanish
            zero_std = math.nan
        elif self.scale_rewards == "batch":  # TRL: the whole batch's std, the same flag for every completion
            zero_std = float(not math.isnan(std) and abs(std) <= 1e-8)  # torch.isclose(std, 0)'s tolerance
        else:
            zero_std = sum(p["zero"] for p in parts) / grouped
        out = {
            "reward": mean if count else math.nan,
            "reward_std": std,
            "frac_reward_zero_std": zero_std,
            "completions/min_length": min(p["len_min"] for p in parts) if n else math.nan,
            "completions/max_length": max(p["len_max"] for p in parts) if n else math.nan,
            # no completion stopped: 0, as TRL logs it
            "completions/mean_terminated_length": sum(p["term_sum"] for p in parts) / term_n if term_n else 0.0,
            "completions/min_terminated_length": min(p["term_min"] for p in parts) if term_n else 0.0,
            "completions/max_terminated_length": max(p["term_max"] for p in parts) if term_n else 0.0,
        }
        for i, name in enumerate(self.reward_names):
            func_count, _, func_m2 = merge_moments([p["funcs"][i] for p in parts])
            out[f"rewards/{name}/std"] = sample_std(func_count, func_m2)
        return out

    def _async_metrics(self, accelerator) -> dict[str, float]:
        """The asynchronous-rollout metrics (module docstring): sums over ranks, the lag's max over ranks (collective:
        every rank tracking them calls this, with the same keys). Those about rounds only when a round arrived on some
        rank since the last log, `perf/weight_sync_s` only when weights were sent."""
        keys = ("sample/rounds", "sample/staleness_sum", "perf/rollout_wait_s", "perf/weight_syncs",
                "perf/weight_sync_s", "perf/producer_generate_s", "perf/producer_reward_s")  # fmt: skip
        local = [self.async_sums[k] for k in keys] + [float(self.dropped_stale_total)]
        stacked = torch.tensor(local, dtype=torch.float64).to(accelerator.device)
        sums = dict(zip([*keys, "dropped"], accelerator.reduce(stacked, "sum").cpu().tolist()))
        largest = torch.tensor([self.async_extrema["sample/staleness_max"]], dtype=torch.float64)
        lag_max = float(accelerator.gather(largest.to(accelerator.device)).max())
        ranks = max(accelerator.num_processes, 1)
        out = {"sample/dropped_stale_total": sums["dropped"]}
        rounds = sums["sample/rounds"]
        if rounds:
            wall = max(time.perf_counter() - self.window_start, 1e-9)
            wait = sums["perf/rollout_wait_s"] / ranks
            out.update(
                {
                    "sample/staleness_mean": sums["sample/staleness_sum"] / rounds,
                    "sample/staleness_max": lag_max,
                    "perf/rollout_wait_s": wait,
                    "perf/rollout_wait_share": min(wait / wall, 1.0),
                    "perf/producer_generate_s": sums["perf/producer_generate_s"] / rounds,
                    "perf/producer_reward_s": sums["perf/producer_reward_s"] / rounds,
                }
            )
        if sums["perf/weight_syncs"]:
            out["perf/weight_sync_s"] = sums["perf/weight_sync_s"] / ranks
        return out

    def _sampler_correction_metrics(self, accelerator, reduced: dict[str, float]) -> dict[str, float]:
        """The `sampling/*` metrics from the rank-summed sums and the extremes, reduced here (max over ranks; a
        collective, on every rank that has the sums). 0 where nothing was measured, as TRL logs an empty batch."""
        keys = sorted(self.rollout_extrema)
        local = torch.tensor([[self.rollout_extrema[k] for k in keys]], dtype=torch.float64)
        extrema = dict(zip(keys, accelerator.gather(local.to(accelerator.device)).amax(0).cpu().tolist()))
        units = reduced["sampling/units"]
        count = reduced["sampling/difference_count"]
        out = {}
        for name in ("importance_sampling_ratio", "raw_importance_sampling_ratio"):
            total = reduced["sampling/ratio_sum" if name == "importance_sampling_ratio" else "sampling/raw_sum"]
            out[f"sampling/{name}/min"] = -extrema[f"sampling/{name}/min"] if units else 0.0
            out[f"sampling/{name}/mean"] = total / units if units else 0.0
            out[f"sampling/{name}/max"] = extrema[f"sampling/{name}/max"] if units else 0.0
        out["sampling/importance_sampling_ratio/clipped_frac"] = reduced["sampling/clipped"] / max(units, 1.0)
        out["sampling/importance_sampling_ratio/masked_frac"] = reduced["sampling/masked"] / max(units, 1.0)
        out["sampling/sampling_logp_difference/mean"] = reduced["sampling/difference_sum"] / count if count else 0.0
        out["sampling/sampling_logp_difference/max"] = (
            extrema["sampling/sampling_logp_difference/max"] if count else 0.0
        )
        return out


__all__ = ["MetricsAccumulator"]


class RunMetrics:
    """What `TRAPOTrainer.log` adds to a logged step: the metrics accumulated since the last log
    ([`MetricsAccumulator.collect`]), then each collaborator's own — the curriculum's shares at the last step built,
    DARE's weights and factors, the RL schedules, the memory pool's, each objective's, the RL supply's (exploration,
    replay) — and `episode` (completions sampled so far), `eps` (episodes per second of `train()`) and
    `train/nonfinite_steps` (optimizer steps skipped for a non-finite loss).

    Args:
        metrics ([`MetricsAccumulator`]): the run's accumulated metrics.
        accelerator (`accelerate.Accelerator`): reduces them over ranks.
        step_builder ([`~trl_trapo.steps.StepBuilder`]): the last step built and its curriculum metrics.
        dare ([`~trl_trapo.weighting.DARE`]): its weights and factors are logged.
        schedules ([`~trl_trapo.schedules.RLSchedules`]): the RL schedules' values are logged.
        memory_pool ([`~trl_trapo.memory.MemoryPool`]): its metrics are logged.
        objectives (`list[Objective]`): each one's metrics are logged.
        rl_supply ([`~trl_trapo.rl_supply.RLSupply`]): exploration's and replay's metrics are logged.
        nonfinite ([`~trl_trapo.nonfinite.NonFiniteGuard`]): the count of skipped steps is logged.
        on_episode (`Callable[[int], None]`): gets the episode count at each log (TRL 1.12's `PPOTrainer` kept it on
            the `Trainer`'s state).
    """

    def __init__(
        self,
        metrics: MetricsAccumulator,
        accelerator: Any,
        *,
        step_builder: Any,
        dare: Any,
        schedules: Any,
        memory_pool: Any,
        objectives: Sequence[Any],
        rl_supply: Any,
        nonfinite: Any,
        on_episode: Callable[[int], None],
    ):
        self.metrics, self.accelerator = metrics, accelerator
        self.step_builder, self.dare, self.schedules, self.memory_pool = step_builder, dare, schedules, memory_pool
        self.objectives, self.rl_supply, self.nonfinite = list(objectives), rl_supply, nonfinite
        self.on_episode = on_episode
        self.start_time: float | None = None

    def start(self) -> None:
        """`train()` starts: `eps` counts from now."""
        self.start_time = time.perf_counter()

    def collect(self, global_step: int) -> dict[str, float]:
        """Every metric of the log at optimizer step `global_step` (collective: every rank calls it)."""
        out = self.metrics.collect(self.accelerator, self.schedules.kl_coef())
        out.update(self.step_builder.metrics())
        out.update(self.dare.metrics())
        out.update(self.schedules.metrics(self.step_builder.last_step))
        out.update(self.memory_pool.metrics())  # sft_pool/*, fewshot/*, adapter_bank/*
        for objective in self.objectives:  # each objective's own (none for the built-in three)
            out.update(objective_metrics(objective))
        out.update(self.rl_supply.metrics(global_step))  # exploration/*, replay/*
        episode = self.rl_supply.episode
        out["episode"] = float(episode)
        self.on_episode(episode)
        elapsed = time.perf_counter() - self.start_time if self.start_time else 0.0
        out["eps"] = float(int(episode / elapsed)) if elapsed > 0 else 0.0
        out["train/nonfinite_steps"] = float(self.nonfinite.steps)
        return out
