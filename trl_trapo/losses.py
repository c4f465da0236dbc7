# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The loss terms of TRAPO as pure, stateless functions.

Shape letters, used in every docstring of this module:

- ``B``: rows of a (micro-)batch (one row = one sequence);
- ``T``: token positions, *target-aligned*: position ``t`` holds quantities about predicting token ``t + 1`` of the
  row's ``input_ids`` from its prefix (so ``T = seq_len - 1``);
- ``P``: prompts, ``G``: completions (generations) per prompt, ``P * G`` completions in all.

Masks are float or bool tensors where **1 means "this token counts"**. Every reduction is written so that a fully
masked row (or a fully masked batch) contributes exactly 0 — never NaN. Log-probabilities are natural logs (nats).

Nothing here normalises by a *global* count on its own: the trainer passes the global token / sequence counts of the
accumulated batch (summed over gradient-accumulation micro-batches and ranks), which is what makes gradient
accumulation and data parallelism exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from trl.trainer.utils import nanstd


KLEstimator = Literal["k1", "k2", "k3"]
LossType = Literal["dapo", "grpo", "dr_grpo", "bnpo"]


# ---------------------------------------------------------------------------------------------------------------------
# Masked reductions
# ---------------------------------------------------------------------------------------------------------------------
def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is 1.

    Args:
        values (`torch.Tensor`): any shape.
        mask (`torch.Tensor`): same shape as `values` (bool or 0/1 float).
        dim (`int`, *optional*): dimension to reduce; all dimensions when None.

    Returns:
        `torch.Tensor`: the masked sum (0 where everything is masked). Masked positions never propagate NaN/inf.
    """
    masked = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 (not NaN) where the mask is empty.

    Args:
        values (`torch.Tensor`): any shape.
        mask (`torch.Tensor`): same shape as `values`.
        dim (`int`, *optional*): dimension to reduce; all dimensions when None.

    Returns:
        `torch.Tensor`: the masked mean.
    """
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Whiten `values` with the mean and unbiased variance of its masked entries (PPO's `masked_whiten`).

    Args:
        values (`torch.Tensor`): shape `(B, T)`.
        mask (`torch.Tensor`): shape `(B, T)`.
        shift_mean (`bool`): when False the mean is added back (used for rewards, whose level matters).
        reduce (`Callable`, *optional*): sums a tensor over every process's part of the batch (an all-reduce); the
            mean and variance are then those of all parts together, as if one process held the whole batch. None:
            this process's entries only.

    Returns:
        `torch.Tensor`: shape `(B, T)`, `(values - mean) / sqrt(var + 1e-8)` (+ mean when `shift_mean=False`).

    Raises:
        ValueError: if fewer than 2 entries are unmasked (over all parts with `reduce`): the unbiased variance is
            undefined.
    """
    reduce = reduce or (lambda tensor: tensor)
    mask = mask.to(values.dtype)
    count = reduce(mask.sum())
    if count < 2:
        raise ValueError(f"masked_whiten needs at least 2 unmasked entries, got {int(count)}.")
    mean = reduce(masked_sum(values, mask)) / count
    centered = values - mean
    variance = reduce(masked_sum(centered**2, mask)) / count * (count / (count - 1))
    whitened = centered * torch.rsqrt(variance + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# ---------------------------------------------------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------------------------------------------------
def kl_estimate(
    per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor, estimator: KLEstimator = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence", 2020).

    With log r = log pi_ref(y_t) - log pi(y_t): k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r. k1 is unbiased
    but can be negative per token; k3 is unbiased and always >= 0; k2 is biased but low-variance.

    Args:
        per_token_logps (`torch.Tensor`): shape `(B, T)`, log pi of the sampled tokens (nats).
        ref_per_token_logps (`torch.Tensor`): shape `(B, T)`, log pi_ref of the same tokens (nats).
        estimator (`str`): "k1", "k2" or "k3".

    Returns:
        `torch.Tensor`: shape `(B, T)`, per-token KL estimate in nats (unmasked; mask it yourself).

    Raises:
        ValueError: for an unknown estimator.
    """
    log_ratio = ref_per_token_logps - per_token_logps
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"kl_estimator={estimator!r} is not one of 'k1', 'k2', 'k3'.")


KL_GRADIENT = {
    ("k1", "loss"): "zero in expectation: the term does not regularise (E_pi[grad log pi] = 0)",
    ("k2", "loss"): "grad KL(pi || pi_ref): unbiased on-policy",
    ("k3", "loss"): "grad of the reverse KL(pi_ref || pi), not of KL(pi || pi_ref): biased",
    ("k1", "reward"): "grad KL(pi || pi_ref): unbiased on-policy (REINFORCE with reward -log(pi / pi_ref))",
    ("k2", "reward"): "biased: REINFORCE misses the estimator's own dependence on pi",
    ("k3", "reward"): "biased, nearly no KL gradient: REINFORCE misses k3's own dependence on pi",
}
"""What the gradient of each (estimator, placement) is, on-policy, for the table of docs/sampling.md and the warnings.
Sources: Schulman, "Approximating KL divergence" (joschu.net/blog/kl-approx.html); "A Comedy of Estimators: On KL
Regularization in RL Training of LLMs" (huggingface.co/papers/2512.21852); TRL issue #4967 (k1-in-reward unbiased,
k3-in-loss biased) and PR #6503."""


def resolve_kl_estimator(estimator: str, placement: str) -> str:
    """The estimator `kl_estimator="auto"` stands for: the unbiased one for `placement` ("loss": k2, "reward": k1);
    any other value is returned as it is."""
    if estimator != "auto":
        return estimator
    return "k2" if placement == "loss" else "k1"


def kl_gradient_warning(estimator: str, placement: str) -> str | None:
    """A warning for a biased (estimator, placement) combination, with the reason and the fix; None when unbiased."""
    if (estimator, placement) in (("k2", "loss"), ("k1", "reward")):
        return None
    unbiased = resolve_kl_estimator("auto", placement)
    return (
        f"kl_estimator={estimator!r} with the KL in the {placement}: its gradient is "
        f"{KL_GRADIENT[(estimator, placement)]}. kl_estimator='auto' uses {unbiased!r} there, whose gradient is "
        "grad KL(pi || pi_ref) on-policy."
    )


# ---------------------------------------------------------------------------------------------------------------------
# Policy and value losses
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class PolicyLossOutput:
    """Per-token policy loss and its statistics (all shape `(B, T)`; statistics detached), for PPO's clipped
    surrogate and for the truncated-importance-sampling loss alike."""

    per_token_loss: torch.Tensor  # (B, T) the loss that is optimised
    ratio: torch.Tensor  # (B, T) rho = pi / pi_old, detached
    is_clipped: torch.Tensor  # (B, T) bool: the rule cut this token (PPO: clipped branch active; TIS: rho > cap)
    approx_kl: torch.Tensor  # (B, T) 0.5 * (log rho)^2, detached (PPO's approxkl)
    logp_coef: torch.Tensor  # (B, T) -d per_token_loss / d log pi, detached: what multiplies grad log pi


def clipped_policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    cliprange: float,
    importance_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """PPO's clipped surrogate, per token (Schulman et al. 2017, huggingface.co/papers/1707.06347, eq. 7).

    L_t = max(-A_t * rho_t, -A_t * clip(rho_t, 1 - eps, 1 + eps)), rho_t = exp(log pi - log pi_old).

    Args:
        per_token_logps (`torch.Tensor`): shape `(B, T)`, log pi_theta (requires grad).
        old_per_token_logps (`torch.Tensor`): shape `(B, T)`, behaviour log-probs log pi_old.
        advantages (`torch.Tensor`): shape `(B, T)` (or `(B, 1)`, broadcast).
        cliprange (`float`): epsilon.
        importance_weights (`torch.Tensor`, *optional*): shape `(B, T)`, detached extra weights (e.g. a truncated
            importance weight for stale replay samples); multiplies the per-token loss.

    Returns:
        [`PolicyLossOutput`]: the unreduced per-token loss (mask and aggregate it with [`aggregate_rl_loss`]);
        `logp_coef` = A * rho * w where the unclipped branch is active, 0 where the clipped one is.
    """
    log_ratio = per_token_logps - old_per_token_logps
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token_loss = torch.maximum(loss_unclipped, loss_clipped)
    if importance_weights is not None:
        per_token_loss = per_token_loss * importance_weights
    with torch.no_grad():
        is_clipped = loss_clipped > loss_unclipped
        approx_kl = 0.5 * log_ratio.detach() ** 2
        logp_coef = advantages * ratio.detach() * (~is_clipped).float()
        if importance_weights is not None:
            logp_coef = logp_coef * importance_weights
    return PolicyLossOutput(per_token_loss, ratio.detach(), is_clipped, approx_kl, logp_coef)


def clip_ratio_stats(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, num_tokens: float, cliprange: float
) -> dict[str, torch.Tensor]:
    """TRL 1.16 GRPOTrainer's `clip_ratio/*` metrics of one micro-batch: which tokens the clipped surrogate cuts.

    A token is low-clipped when rho < 1 - eps and its advantage is negative, high-clipped when rho > 1 + eps and its
    advantage is positive, region-clipped when either (the same tokens as `policy/clipfrac_avg`).

    Args:
        ratio (`torch.Tensor`): `(B, T)` rho = pi / pi_old, detached.
        advantages (`torch.Tensor`): `(B, T)` or `(B, 1)`.
        mask (`torch.Tensor`): `(B, T)` 1 on the counted tokens.
        num_tokens (`float`): the step's global count of those tokens (the fractions' normaliser).
        cliprange (`float`): eps.

    Returns:
        `dict[str, torch.Tensor]`: 0-dim tensors: `clip_ratio/low_mean`, `clip_ratio/high_mean`,
        `clip_ratio/region_mean` (this micro-batch's share of the step's token fractions: they sum over micro-batches
        and ranks), `clip_ratio/low_min` / `clip_ratio/high_max` (the least low-clipped / most high-clipped fraction
        of a row's counted tokens, +inf / -inf when no row has one; reduced by their extreme, `metrics.STEP_EXTREMA`).
    """
    with torch.no_grad():
        low = ((ratio < 1.0 - cliprange) & (advantages < 0)).float()
        high = ((ratio > 1.0 + cliprange) & (advantages > 0)).float()
        tokens = mask.float().sum(-1)
        rows = tokens > 0  # rows without a counted token take no part in the extremes (no host sync to drop them)
        per_row = tokens.clamp(min=1.0)
        inf = torch.tensor(math.inf, device=ratio.device)
        return {
            "clip_ratio/low_mean": masked_sum(low, mask) / num_tokens,
            "clip_ratio/high_mean": masked_sum(high, mask) / num_tokens,
            "clip_ratio/region_mean": masked_sum(torch.maximum(low, high), mask) / num_tokens,
            "clip_ratio/low_min": torch.where(rows, masked_sum(low, mask, dim=-1) / per_row, inf).amin(),
            "clip_ratio/high_max": torch.where(rows, masked_sum(high, mask, dim=-1) / per_row, -inf).amax(),
        }


def truncated_is_policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    cap: float,
    importance_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Policy-gradient loss with a truncated importance weight instead of PPO's clip, per token.

    L_t = -min(cap, rho_t).detach() * A_t * log pi(y_t), rho_t = pi / pi_old, so the gradient is
    -min(cap, rho_t) * A_t * grad log pi: the unbiased off-policy gradient while rho_t <= cap, with bounded variance
    above (truncated importance sampling, IMPALA huggingface.co/papers/1802.01561, eq. 1 with rho-bar = cap). Unlike
    the clipped surrogate it keeps a (bounded) gradient for stale samples far from the behaviour policy.

    Args:
        per_token_logps (`torch.Tensor`): shape `(B, T)`, log pi_theta (requires grad).
        old_per_token_logps (`torch.Tensor`): shape `(B, T)`, behaviour log-probs.
        advantages (`torch.Tensor`): shape `(B, T)`.
        cap (`float`): rho-bar.
        importance_weights (`torch.Tensor`, *optional*): extra detached weights, `(B, T)` or broadcastable.

    Returns:
        [`PolicyLossOutput`]: the unreduced per-token loss and its statistics; `is_clipped` marks the tokens whose
        weight was truncated (rho > cap), `logp_coef` = min(cap, rho) * w * A.
    """
    log_ratio = per_token_logps.detach() - old_per_token_logps
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, max=cap)
    if importance_weights is not None:
        weight = weight * importance_weights
    per_token_loss = -weight * advantages * per_token_logps
    with torch.no_grad():
        logp_coef = (weight * advantages).expand_as(per_token_loss)
    return PolicyLossOutput(per_token_loss, ratio, ratio > cap, 0.5 * log_ratio**2, logp_coef)


def shaped_off_policy_loss(per_token_logps: torch.Tensor, advantages: torch.Tensor, gamma: float) -> PolicyLossOutput:
    """Policy loss of off-policy demonstration tokens with policy shaping, per token (LUFFY, Yan et al. 2025,
    arXiv 2504.14945, eq. 6-7).

    L_t = -A_t * f(p_t), f(p) = p / (p + gamma), p_t = pi_theta(y_t) = exp(log pi_theta(y_t)): the importance ratio
    pi_theta / pi_expert with the expert's probability taken as 1, unclipped (a demonstration has no behaviour
    probability to clip against), and shaped by f. Its gradient, -A_t * gamma * p_t / (p_t + gamma)^2 * grad log p_t,
    stays large for improbable expert tokens, where the unshaped -A_t * p_t * grad log p_t would vanish.

    Args:
        per_token_logps (`torch.Tensor`): shape `(B, T)`, log pi_theta in nats (requires grad).
        advantages (`torch.Tensor`): shape `(B, T)`.
        gamma (`float`): the shaping constant (> 0; LUFFY uses 0.1).

    Returns:
        [`PolicyLossOutput`]: the unreduced per-token loss; `ratio` = p_t, `is_clipped` all False, `approx_kl` 0 (no
        behaviour policy), `logp_coef` = A_t * gamma * p_t / (p_t + gamma)^2.
    """
    probability = torch.exp(per_token_logps)
    per_token_loss = -advantages * probability / (probability + gamma)
    with torch.no_grad():
        p = probability.detach()
        logp_coef = (advantages * gamma * p / (p + gamma) ** 2).expand_as(per_token_loss)
        zeros = torch.zeros_like(p)
    return PolicyLossOutput(per_token_loss, p, zeros.bool(), zeros, logp_coef)


@dataclass
class ValueLossOutput:
    """Per-token clipped value loss and its statistics (shape `(B, T)`; statistics detached)."""

    per_token_loss: torch.Tensor  # (B, T) 0.5 * max((V - R)^2, (V_clipped - R)^2)
    is_clipped: torch.Tensor  # (B, T) bool, the clipped branch was larger


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, cliprange_value: float
) -> ValueLossOutput:
    """PPO's clipped value loss, per token: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2).

    Args:
        values (`torch.Tensor`): shape `(B, T)`, current value predictions (requires grad).
        old_values (`torch.Tensor`): shape `(B, T)`, value predictions at rollout time.
        returns (`torch.Tensor`): shape `(B, T)`, GAE returns (advantages + old values).
        cliprange_value (`float`): c.

    Returns:
        [`ValueLossOutput`]: the unreduced per-token loss.
    """
    values_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (values_clipped - returns) ** 2
    per_token_loss = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    return ValueLossOutput(per_token_loss, (loss_clipped > loss_unclipped).detach())


def aggregate_rl_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: LossType,
    num_tokens: float,
    num_sequences: float,
    response_length: int,
    num_micro_batches: float = 1.0,
) -> torch.Tensor:
    """Reduce a per-token RL loss to the scalar this micro-batch contributes to the step's loss.

    The normalisers are *global* (the whole accumulated batch on all ranks), so the sum of the returned values over
    micro-batches and ranks is the loss of the step, whatever the split:

    - "dapo" (DAPO, huggingface.co/papers/2503.14476): sum over tokens / `num_tokens`;
    - "grpo" (GRPO, huggingface.co/papers/2402.03300): each row's token mean, summed / `num_sequences`;
    - "dr_grpo" (Dr. GRPO, huggingface.co/papers/2503.20783): sum / (`num_sequences` * `response_length`);
    - "bnpo": this micro-batch's token mean / `num_micro_batches` (TRL 1.12 PPOTrainer's `masked_mean` per
      micro-batch, averaged over micro-batches; depends on how the batch is split).

    Args:
        per_token_loss (`torch.Tensor`): shape `(B, T)`.
        mask (`torch.Tensor`): shape `(B, T)`, 1 on tokens that count.
        loss_type (`str`): one of the four above.
        num_tokens (`float`): global number of counted tokens ("dapo").
        num_sequences (`float`): global number of rows with at least one counted token ("grpo", "dr_grpo").
        response_length (`int`): the constant of "dr_grpo".
        num_micro_batches (`float`): global number of micro-batches holding counted tokens ("bnpo").

    Returns:
        `torch.Tensor`: scalar; exactly 0 when the mask is empty.

    Raises:
        ValueError: for an unknown `loss_type`.
    """
    if loss_type == "dapo":
        return masked_sum(per_token_loss, mask) / max(num_tokens, 1.0)
    if loss_type == "grpo":
        return masked_mean(per_token_loss, mask, dim=-1).sum() / max(num_sequences, 1.0)
    if loss_type == "dr_grpo":
        return masked_sum(per_token_loss, mask) / max(num_sequences * response_length, 1.0)
    if loss_type == "bnpo":
        return masked_mean(per_token_loss, mask) / max(num_micro_batches, 1.0)
    raise ValueError(f"loss_type={loss_type!r} is not one of 'dapo', 'grpo', 'dr_grpo', 'bnpo'.")


def sft_token_weights(
    per_token_logps: torch.Tensor, sft_loss_type: Literal["nll", "trust_region"], alpha: float = 0.1
) -> torch.Tensor | None:
    """Per-token weights of the SFT negative log-likelihood.

    "nll" returns None (every token weighs 1). "trust_region" returns min(1, p / alpha), detached: the gradient of
    -w * log p is then -grad(log p) for tokens the policy already finds likely (p >= alpha) and -grad(p) / alpha for
    unlikely ones, which bounds how hard off-policy demonstrations pull the policy (Trust-Region Adaptive Policy
    Optimization, huggingface.co/papers/2512.17636, section 3).

    Args:
        per_token_logps (`torch.Tensor`): shape `(B, T)`, log p of the demonstration tokens (nats).
        sft_loss_type (`str`): "nll" or "trust_region".
        alpha (`float`): the trust-region threshold (0.1 in the paper).

    Returns:
        `torch.Tensor` of shape `(B, T)`, or None.
    """
    if sft_loss_type == "nll":
        return None
    if sft_loss_type == "trust_region":
        return torch.clamp(per_token_logps.detach().exp() / alpha, max=1.0)
    raise ValueError(f"sft_loss_type={sft_loss_type!r} is not one of 'nll', 'trust_region'.")


# ---------------------------------------------------------------------------------------------------------------------
# Whole terms: what one objective contributes to a micro-batch's loss
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class TermOutput:
    """What one objective's term returns for one micro-batch: the loss it adds, the value it logs, its probe signal
    and its statistics.

    The probe signal is how the DARE probe sees the term's gradient with respect to the logits at the term's counted
    positions. Most terms are weighted sums of -log p(target), whose logit gradient is c * (p - e_target): they give
    `logp_coef` (c per token) and the probe builds the gradient in closed form. A term whose gradient depends on the
    whole distribution (a divergence to a teacher) gives `logit_grad` instead: d loss / d logits for each of its
    counted tokens, `(N_o, V)`, in the order of `mask.nonzero()` restricted to its rows.
    """

    loss: torch.Tensor  # scalar: what is optimised, normalised by the step's global count of the term
    value: torch.Tensor  # scalar, detached: what `loss/<objective>` logs (e.g. the plain NLL of a weighted SFT term)
    logp_coef: torch.Tensor | None = None  # (B, T) detached: -d loss / d log p per counted token (probe signal)
    logit_grad: torch.Tensor | None = None  # (N_o, V) detached: d loss / d logits of its counted tokens, instead
    stats: dict[str, torch.Tensor] = field(default_factory=dict)  # detached scalars, summed over micro-batches


def language_modeling_term(per_token_logps: torch.Tensor, mask: torch.Tensor, num_tokens: float) -> TermOutput:
    """Next-token negative log-likelihood (nats per token) over the step's counted tokens: pretraining text, or any
    language-modelling corpus.

    L = -sum_t mask_t * log p_t / num_tokens.

    Args:
        per_token_logps (`torch.Tensor`): shape `(B, T)`, log p of each target (nats; requires grad).
        mask (`torch.Tensor`): shape `(B, T)`, 1 on the term's counted targets.
        num_tokens (`float`): the step's global count of the term's tokens (all micro-batches, all ranks).

    Returns:
        [`TermOutput`]: `logp_coef` = 1 on every token.
    """
    loss = masked_sum(-per_token_logps, mask) / max(num_tokens, 1.0)
    return TermOutput(loss, loss.detach(), logp_coef=torch.ones_like(per_token_logps))


def sft_term(
    per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: float,
    importance_weights: torch.Tensor,
    sft_loss_type: Literal["nll", "trust_region"] = "nll",
    alpha: float = 0.1,
) -> TermOutput:
    """The SFT term: negative log-likelihood of demonstration tokens, weighted per token by the trust-region weight
    (see [`sft_token_weights`]) and per row by the prioritised pool's importance weight.

    L = sum_t mask_t * w_t * u_row * (-log p_t) / num_tokens; the logged value is the plain NLL.

    Args:
        per_token_logps (`torch.Tensor`): shape `(B, T)`, nats.
        mask (`torch.Tensor`): shape `(B, T)`, 1 on the term's counted targets.
        num_tokens (`float`): the step's global count of SFT tokens.
        importance_weights (`torch.Tensor`): shape `(B,)`, detached row weights u (1 unless prioritised replay).
        sft_loss_type (`str`): "nll" or "trust_region".
        alpha (`float`): the trust-region threshold.

    Returns:
        [`TermOutput`]: `logp_coef` = w_t * u_row.
    """
    nll = -per_token_logps
    weights = sft_token_weights(per_token_logps, sft_loss_type, alpha)
    weighted = nll if weights is None else nll * weights
    importance = importance_weights.unsqueeze(1).to(weighted.dtype)
    weighted = weighted * importance
    loss = masked_sum(weighted, mask) / max(num_tokens, 1.0)
    value = masked_sum(nll, mask).detach() / max(num_tokens, 1.0)
    coef = importance.expand_as(per_token_logps) if weights is None else weights * importance
    return TermOutput(loss, value, logp_coef=coef.detach())


@dataclass
class RLTermCounts:
    """The step's global counts the RL term normalises by (all micro-batches, all ranks)."""

    tokens: float  # counted RL tokens
    sequences: float  # RL rows with a counted token
    micro_batches: float  # micro-batches holding such a row
    sampled_tokens: float  # counted RL tokens that were sampled (not demonstrations put in by guidance)


def rl_term(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    counts: RLTermCounts,
    *,
    loss_type: LossType,
    response_length: int,
    cliprange: float,
    importance_weights: torch.Tensor,
    importance_sampling_cap: float | None = None,
    sampling_weights: torch.Tensor | None = None,
    off_policy: torch.Tensor | None = None,
    guidance_gamma: float = 0.1,
    kl: torch.Tensor | None = None,
    kl_coef_in_loss: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    values: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    value_mask: torch.Tensor | None = None,
    cliprange_value: float = 0.2,
    vf_coef: float = 0.1,
) -> TermOutput:
    """The RL term of one micro-batch: the policy loss (PPO's clipped surrogate, or truncated importance sampling
    with `importance_sampling_cap`), LUFFY's shaped loss on demonstration rows, + `kl_coef_in_loss` * KL, -
    `entropy_coef` * entropy, aggregated by `loss_type` (see [`aggregate_rl_loss`]), + `vf_coef` * the clipped value
    loss with a critic.

    Args:
        per_token_logps (`torch.Tensor`): `(B, T)` log pi_theta (temperature-scaled; requires grad).
        old_per_token_logps, advantages (`torch.Tensor`): `(B, T)` behaviour log-probs (nats) and advantages.
        mask (`torch.Tensor`): `(B, T)` 1 on the RL rows' counted tokens.
        counts ([`RLTermCounts`]): global normalisers.
        loss_type, response_length, cliprange: see [`aggregate_rl_loss`] and [`clipped_policy_loss`].
        importance_weights (`torch.Tensor`): `(B,)` detached row weights (stale replay rows).
        importance_sampling_cap (`float`, *optional*): truncated importance sampling instead of the clip.
        sampling_weights (`torch.Tensor`, *optional*): `(B, T)` detached per-token weights of the policy loss for a
            sampler that is not the trainer (the sampler/trainer mismatch correction,
            [`~trl_trapo.sampler_correction.sampler_importance_weights`]); multiply it after PPO's clip (or the
            truncated-IS weight), not the KL or entropy terms, and leave the normalisers unchanged, as TRL's GRPO does.
        off_policy (`torch.Tensor`, *optional*): `(B,)` bool, rows that are demonstrations put in by guidance: shaped
            loss (`guidance_gamma`), no KL term, out of the ratio statistics.
        kl (`torch.Tensor`, *optional*): `(B, T)` per-token KL estimate to the reference (statistics; in the loss with
            `kl_coef_in_loss` > 0).
        entropy (`torch.Tensor`, *optional*): `(B, T)` per-token entropy of the policy (nats; in the loss with
            `entropy_coef` > 0, with a gradient then).
        values, old_values, returns, value_mask (`torch.Tensor`, *optional*): `(B_rl, T)` critic predictions (requires
            grad), rollout-time values, GAE returns and the RL rows' mask, with a critic.

    Returns:
        [`TermOutput`]: `logp_coef` = -d policy loss / d log pi per token (0 off the mask); `stats`
        `loss/policy_avg`, `policy/clipfrac_avg`, `policy/approxkl_avg`, `val/ratio`, `val/ratio_sq`, TRL GRPO's
        `clip_ratio/*` with the clipped surrogate ([`clip_ratio_stats`]), and when given `policy/kl_avg`,
        `policy/entropy_avg` (with `entropy_coef` > 0 also TRL's `policy_loss`, the term before the entropy bonus),
        `loss/value_avg`, `val/clipfrac_avg`.
    """
    n_tokens = max(counts.tokens, 1.0)
    aggregate = dict(
        loss_type=loss_type,
        num_tokens=counts.tokens,
        num_sequences=counts.sequences,
        response_length=response_length,
        num_micro_batches=counts.micro_batches,
    )
    importance = importance_weights.unsqueeze(1)
    if sampling_weights is not None:
        importance = importance * sampling_weights.to(importance.dtype)
    if importance_sampling_cap is None:
        policy = clipped_policy_loss(per_token_logps, old_per_token_logps, advantages, cliprange, importance)
    else:  # its statistics and probe coefficients are the truncated-IS loss's own (it is what is optimised)
        policy = truncated_is_policy_loss(
            per_token_logps, old_per_token_logps, advantages, importance_sampling_cap, importance
        )
    per_token, logp_coef = policy.per_token_loss, policy.logp_coef
    # demonstrations put in by guidance: LUFFY's shaped loss instead of PPO's ratio, no KL term, no ratio statistics
    sampled, n_sampled = mask, max(counts.sampled_tokens, 1.0)
    if off_policy is not None:
        off = off_policy.unsqueeze(1) & mask.bool()
        shaped = shaped_off_policy_loss(per_token_logps, advantages * importance, guidance_gamma)
        per_token = torch.where(off, shaped.per_token_loss, per_token)
        logp_coef = torch.where(off, shaped.logp_coef, logp_coef)
        sampled = mask * (~off).to(mask.dtype)
    policy_loss = per_token
    stats: dict[str, torch.Tensor] = {}
    if kl is not None:
        if kl_coef_in_loss > 0:
            per_token = per_token + kl_coef_in_loss * (kl if sampled is mask else kl * sampled)
        stats["policy/kl_avg"] = masked_sum(kl.detach(), sampled) / n_sampled
    if entropy is not None:
        if entropy_coef > 0:
            # TRL GRPO's `policy_loss`, logged with its entropy bonus only: the term before the bonus (KL included)
            stats["policy_loss"] = aggregate_rl_loss(per_token.detach(), mask, **aggregate)
            per_token = per_token - entropy_coef * entropy
        stats["policy/entropy_avg"] = masked_sum(entropy.detach(), mask) / n_tokens
    loss = aggregate_rl_loss(per_token, mask, **aggregate)
    stats["loss/policy_avg"] = aggregate_rl_loss(policy_loss.detach(), mask, **aggregate)
    stats["policy/clipfrac_avg"] = masked_sum(policy.is_clipped.float(), sampled) / n_sampled
    stats["policy/approxkl_avg"] = masked_sum(policy.approx_kl, sampled) / n_sampled
    stats["val/ratio"] = masked_sum(policy.ratio, sampled) / n_sampled
    if importance_sampling_cap is None:  # the clipped surrogate: TRL GRPO's clip_ratio/* of the same tokens
        stats.update(clip_ratio_stats(policy.ratio, advantages, sampled, n_sampled, cliprange))
    stats["val/ratio_sq"] = masked_sum(policy.ratio**2, sampled) / n_sampled
    if values is not None:
        value_out = clipped_value_loss(values, old_values, returns, cliprange_value)
        value_loss = aggregate_rl_loss(value_out.per_token_loss, value_mask, **aggregate)
        loss = loss + vf_coef * value_loss
        stats["loss/value_avg"] = value_loss.detach()
        stats["val/clipfrac_avg"] = masked_sum(value_out.is_clipped.float(), value_mask) / n_tokens
    return TermOutput(loss, loss.detach(), logp_coef=logp_coef * mask, stats=stats)


def generalized_jsd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float = 1.0
) -> torch.Tensor:
    """Per-token generalised Jensen-Shannon divergence between the student's and the teacher's next-token
    distributions (nats), the family of on-policy distillation (GKD, Agarwal et al. 2024, huggingface.co/papers/2306.13649,
    eq. 1; TRL's `DistillationTrainer`).

    With p_s = softmax(z_s / tau), p_t = softmax(z_t / tau) and m = (1 - beta) p_s + beta p_t:
    beta = 0 is the forward KL(p_t || p_s), beta = 1 the reverse KL(p_s || p_t), and in between
    beta * KL(p_t || m) + (1 - beta) * KL(p_s || m) (0.5: the symmetric JSD). `beta` is TRL `DistillationConfig.beta`
    (TRAPO's `distillation_beta`).

    Args:
        student_logits (`torch.Tensor`): `(N, V)` (requires grad).
        teacher_logits (`torch.Tensor`): `(N, V)`, the same vocabulary.
        beta (`float`): in [0, 1].
        temperature (`float`): tau > 0, applied to both.

    Returns:
        `torch.Tensor`: `(N,)` fp32 divergences, >= 0.
    """
    log_ps = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    log_pt = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0.0:
        return (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    if beta == 1.0:
        return (log_ps.exp() * (log_ps - log_pt)).sum(-1)
    log_m = torch.logaddexp(log_ps + math.log(1.0 - beta), log_pt + math.log(beta))
    return beta * (log_pt.exp() * (log_pt - log_m)).sum(-1) + (1.0 - beta) * (log_ps.exp() * (log_ps - log_m)).sum(-1)


def distillation_term(
    student_logits: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_head: Callable[[torch.Tensor], torch.Tensor],
    num_tokens: float,
    beta: float = 1.0,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    probe: bool = False,
) -> TermOutput:
    """The on-policy distillation term: the mean [`generalized_jsd`] to a teacher over the student's counted tokens.

    L = sum_n D_beta(p_s,n || p_t,n) / num_tokens. The teacher's logits are formed `chunk_size` tokens at a time from
    its final hidden states, inside an activation checkpoint, so neither `(N, V)` teacher logits nor the divergence's
    `(N, V)` intermediates are kept for the backward (only the student's logits, which the shared forward made).

    Args:
        student_logits (`torch.Tensor`): `(N, V)` the student's logits at the term's counted positions (requires grad).
        teacher_hidden (`torch.Tensor`): `(N, H_t)` the teacher's final hidden states at the same positions (no grad).
        teacher_head (`Callable`): the teacher's output layer, `(n, H_t) -> (n, V)`.
        num_tokens (`float`): the step's global count of the term's tokens.
        beta, temperature: see [`generalized_jsd`].
        chunk_size (`int`): tokens per chunk.
        probe (`bool`): also return `logit_grad` `(N, V)`, d loss / d student logits, for the DARE probe (its
            gradient is not c (p - e_y)).

    Returns:
        [`TermOutput`]: `stats` `distill/divergence_avg` (nats per token).
    """
    from torch.utils.checkpoint import checkpoint

    def chunk_divergence(student: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = teacher_head(hidden)
        return generalized_jsd(student, teacher_logits, beta, temperature)

    total = student_logits.new_zeros((), dtype=torch.float32)
    grads = []
    for start in range(0, student_logits.shape[0], chunk_size):
        student, hidden = student_logits[start : start + chunk_size], teacher_hidden[start : start + chunk_size]
        total = total + checkpoint(chunk_divergence, student, hidden, use_reentrant=False).sum()
        if probe:
            with torch.enable_grad():
                detached = student.detach().requires_grad_(True)
                divergence = chunk_divergence(detached, hidden).sum() / max(num_tokens, 1.0)
                grads.append(torch.autograd.grad(divergence, detached)[0])
    loss = total / max(num_tokens, 1.0)
    logit_grad = torch.cat(grads) if probe and grads else None
    if probe and logit_grad is None:
        logit_grad = student_logits.new_zeros((0, student_logits.shape[-1]))
    return TermOutput(loss, loss.detach(), logit_grad=logit_grad, stats={"distill/divergence_avg": loss.detach()})


def sampled_token_distillation_term(
    per_token_logps: torch.Tensor, teacher_per_token_logps: torch.Tensor, mask: torch.Tensor, num_tokens: float
) -> TermOutput:
    """The reverse KL(student || teacher) estimated from the sampled tokens only (on-policy distillation with a teacher
    that returns log-probabilities of given tokens, as in Thinking Machines' "On-Policy Distillation", 2025).

    For y_t sampled from the student at the divergence's temperature, k_t = log p_s(y_t) - log p_t(y_t) is an unbiased
    per-token estimate of KL(p_s || p_t), and its score-function gradient is E[k_t grad log p_s(y_t)]: the loss is
    sum_t mask_t * sg(k_t) * log p_s(y_t) / num_tokens, a policy gradient whose per-token advantage is -k_t. The
    logged value is the estimate, sum_t mask_t * k_t / num_tokens (nats per token). Valid only on rows sampled at the
    divergence's temperature: the caller leaves the others out of `mask`.

    Args:
        per_token_logps (`torch.Tensor`): `(B, T)` log p_s of each target at the divergence's temperature (grad).
        teacher_per_token_logps (`torch.Tensor`): `(B, T)` log p_t of the same tokens, same temperature.
        mask (`torch.Tensor`): `(B, T)` 1 on the counted sampled tokens.
        num_tokens (`float`): the step's global count of them.

    Returns:
        [`TermOutput`]: `logp_coef` = -k_t (closed form for the probe); `stats` `distill/divergence_avg`.
    """
    k = (per_token_logps.detach() - teacher_per_token_logps) * mask
    loss = masked_sum(k * per_token_logps, mask) / max(num_tokens, 1.0)
    value = masked_sum(k, mask) / max(num_tokens, 1.0)
    return TermOutput(loss, value, logp_coef=-k, stats={"distill/divergence_avg": value})


# ---------------------------------------------------------------------------------------------------------------------
# Rewards and advantages
# ---------------------------------------------------------------------------------------------------------------------
def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last position where `mask` is 1 in each row (0 for an all-zero row).

    Args:
        mask (`torch.Tensor`): shape `(B, T)`.

    Returns:
        `torch.Tensor`: shape `(B,)`, long.
    """
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.zeros_like(positions)).amax(dim=-1)


def per_token_rewards(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token rewards: -kl_coef * KL on every completion token, plus the score on the last one.

    The score sits on the last *real* completion token (the stop token when there is one), found from the mask —
    never from token ids, so a pad token equal to EOS cannot move it.

    Args:
        scores (`torch.Tensor`): shape `(B,)`, sequence-level scores (reward model / functions, penalties applied).
        kl (`torch.Tensor`): shape `(B, T)`, per-token KL estimates.
        mask (`torch.Tensor`): shape `(B, T)`, 1 on completion tokens.
        kl_coef (`float`): KL coefficient.

    Returns:
        tuple `(rewards, non_score_rewards)`, both shape `(B, T)` and 0 outside the mask.
    """
    mask = mask.to(kl.dtype)
    non_score = -kl_coef * kl * mask
    rewards = non_score.clone()
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows, last_token_index(mask)] += scores.to(rewards.dtype) * (mask.sum(-1) > 0).to(rewards.dtype)
    return rewards, non_score


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over the policy's own tokens (Schulman et al. 2016, "High-Dimensional
    Continuous Control Using Generalized Advantage Estimation", huggingface.co/papers/1506.02438, eq. 16).

    The actions are the positions where `mask` is 1: the tokens the policy sampled. Positions where it is 0 are not
    actions — padding after the completion, or tokens the environment wrote into a multi-turn completion (tool
    results, TRL's `env_mask` = 0) — and the recursion steps over them: from one model token to the next *model*
    token, whose value bootstraps,

        delta_t = r_t + gamma * V_{next(t)} - V_t,    A_t = delta_t + gamma * lam * A_{next(t)},

    where next(t) is the first position after t with mask 1 (V_{next(t)} = 0 and A_{next(t)} = 0 after the last one:
    the episode ends at its last model token). Rewards and values at positions with mask 0 are ignored, so the
    sequence-level reward belongs on the last model token (see [`per_token_rewards`] with the same mask). On each row
    the result at the model tokens equals plain GAE on the row with its mask-0 tokens deleted; with a mask that is a
    prefix of each row (no environment tokens) it is the usual PPO recursion, bit for bit.

    Args:
        rewards (`torch.Tensor`): shape `(B, T)`, per-token rewards (read where `mask` is 1).
        values (`torch.Tensor`): shape `(B, T)`, value predictions at rollout time (read where `mask` is 1).
        mask (`torch.Tensor`): shape `(B, T)`, 1 on the policy's tokens (actions), 0 on padding and environment tokens.
        gamma (`float`): discount per action (environment tokens are not discounted over).
        lam (`float`): GAE lambda.

    Returns:
        tuple `(advantages, returns)`, both `(B, T)`; returns = advantages + values (the value targets); both 0 where
        `mask` is 0.
    """
    mask = mask.to(values.dtype)
    values = values * mask
    rewards = rewards * mask
    advantages = torch.zeros_like(values)
    last_gae = torch.zeros_like(values[:, 0])  # A at the next action (0 after the last one)
    next_values = torch.zeros_like(last_gae)  # V at the next action (0 after the last one)
    for t in reversed(range(values.shape[1])):
        action = mask[:, t].bool()
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = torch.where(action, delta + gamma * lam * last_gae, last_gae)
        next_values = torch.where(action, values[:, t], next_values)
        advantages[:, t] = last_gae
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def group_relative_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    scale: Literal["group", "batch", "none"] = "group",
    batch_rewards: torch.Tensor | None = None,
) -> torch.Tensor:
    """Critic-free advantages: each reward minus the mean of its group of `num_generations` completions.

    GRPO (huggingface.co/papers/2402.03300, eq. 3) divides by the group standard deviation ("group"); "batch" divides
    by the standard deviation of the whole batch; "none" does not divide (Dr. GRPO, huggingface.co/papers/2503.20783).
    NaN rewards mean "no reward for this completion" (a reward function returned None): they are left out of the
    group statistics and get a NaN advantage (the caller drops those completions). A group whose valid rewards are
    all equal — or that has a single valid reward — gets advantage 0, never NaN.

    Args:
        rewards (`torch.Tensor`): shape `(P * G,)`, completions of one prompt contiguous; NaN = no reward.
        num_generations (`int`): G.
        scale (`str`): "group", "batch" or "none".
        batch_rewards (`torch.Tensor`, *optional*): `(N,)` every reward of the generation batch the "batch" standard
            deviation is taken over, when `rewards` is only part of it (one process's share of a round under data
            parallelism: GRPO's batch is the whole round, as TRL gathers it). Default: `rewards`.

    Returns:
        `torch.Tensor`: shape `(P * G,)`.

    Raises:
        ValueError: if the number of rewards is not a multiple of `num_generations`, or `scale` is unknown.
    """
    if rewards.numel() % num_generations:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of num_generations={num_generations}."
        )
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards={scale!r} is not one of 'group', 'batch', 'none'.")
    grouped = rewards.view(-1, num_generations)
    valid = ~torch.isnan(grouped)
    count = valid.sum(dim=1, keepdim=True)
    mean = torch.where(valid, grouped, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)
    centered = grouped - mean  # NaN stays NaN
    if scale == "none":
        return centered.view(-1)
    if scale == "group":
        std = nanstd(grouped, dim=1, keepdim=True)
    else:
        std = nanstd(rewards if batch_rewards is None else batch_rewards).expand(1, 1)
    std = torch.nan_to_num(std, nan=0.0)
    return (centered / (std + 1e-4)).view(-1)
