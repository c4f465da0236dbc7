# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Guidance from demonstrations: a group whose completions all score the same learns from the prompt's reference.

With group-relative advantages, a group of `num_generations` completions that all get the same reward (a small model
on GSM8K: all 0) has advantages 0 and gives RL no gradient, however long training runs. When the RL dataset holds a
reference solution for the prompt (`TRAPOConfig.demonstration_column`), TRAPO puts it into such a group in place of
the group's last completion, as an *off-policy* sample, and computes the group's advantages with it (LUFFY, Yan et al.
2025, arXiv 2504.14945: mixed-policy GRPO). A correct demonstration among failed samples gets a positive advantage,
the failed samples a negative one.

Off-policy tokens are not sampled from the policy, so three things change for them (see
[`~trl_trapo.losses.shaped_off_policy_loss`]):

- **Ratio.** PPO's ratio pi_theta / pi_old needs the behaviour probability, which a demonstration does not have.
  LUFFY takes the expert's probability to be 1, so the ratio is pi_theta(y_t) itself, unclipped, and shapes it with
  f(p) = p / (p + gamma) (its eq. 6-7): the loss -A * f(p) has gradient -A * gamma * p / (p + gamma)^2 * grad log p,
  which, unlike -A * p * grad log p, does not vanish for the improbable tokens an expert writes and a small policy
  would not.
- **KL.** The per-token KL estimators assume tokens sampled from the policy; demonstration tokens are left out of the
  KL term in the loss. (With the KL in the reward, the k1 log-ratio of the demonstration under the current policy
  enters its reward like any completion's.)
- **Metrics.** PPO's ratio statistics (`policy/clipfrac_avg`, `policy/approxkl_avg`, `val/ratio*`) are over on-policy
  tokens only; `rl/guided_groups` is the fraction of groups that received a demonstration.

Demonstrations are tokenised once, at construction (`data.tokenize_demonstrations`): a demonstration ends with the
stop token like a finished completion and is at most `response_length` tokens.
"""

from __future__ import annotations

import torch


class DemonstrationGuidance:
    """Chooses the groups of a generation round that get their prompt's demonstration.

    Args:
        mode (`str`): "zero_variance" (groups whose scored completions all score the same: they carry no gradient) or
            "always" (every group with a demonstration, as LUFFY does).
        gamma (`float`): the policy-shaping constant of demonstration tokens (LUFFY's gamma, 0.1).

    Raises:
        ValueError: for an unknown `mode` or a non-positive `gamma`.
    """

    def __init__(self, mode: str, gamma: float):
        if mode not in ("zero_variance", "always"):
            raise ValueError(f"guidance={mode!r}: use 'zero_variance' or 'always'.")
        if not gamma > 0:
            raise ValueError(f"guidance_gamma={gamma!r}: use a positive number (LUFFY uses 0.1).")
        self.mode = mode
        self.gamma = float(gamma)

    def select(self, examples: list[dict], scores: torch.Tensor, group: int) -> list[int]:
        """The completions to replace by their prompt's demonstration: the last of each chosen group.

        Args:
            examples (`list[dict]`): one dataset row per completion (groups of `group` consecutive rows share a
                prompt), with `demonstration_ids` (empty list: none).
            scores (`torch.Tensor`): `(B,)` the on-policy completions' scores (NaN: no reward).
            group (`int`): completions per prompt.

        Returns:
            `list[int]`: indices into the round, at most one per group.
        """
        if group < 2 or len(examples) % group:
            return []
        chosen = []
        for start in range(0, len(examples), group):
            last = start + group - 1
            if not examples[last].get("demonstration_ids"):
                continue
            if self.mode == "zero_variance":
                scored = scores[start : start + group]
                scored = scored[~torch.isnan(scored)]
                if scored.numel() > 1 and float(scored.max() - scored.min()) > 1e-6:
                    continue  # the group already has a signal
            chosen.append(last)
        return chosen


__all__ = ["DemonstrationGuidance"]
