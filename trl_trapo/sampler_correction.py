# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The sampler/trainer mismatch correction, as pure functions.

When a completion is sampled by another engine than the trainer's own forward (vLLM, an asynchronous producer), the
engine's probability of a sampled token, mu(y_t), differs from the trainer's, pi(y_t), for the same weights: other
kernels, another precision (a bf16 sampler against an fp32 trainer), batch-dependent reductions. The policy gradient
is an expectation under pi, the samples come from mu, so each token's policy loss is weighted by an importance ratio

    rho_t = pi(y_t | x, y_<t) / mu(y_t | x, y_<t),

bounded to keep its variance finite. This is TRL's `vllm_importance_sampling_correction` (GRPOTrainer), with TRL's
four modes, two choices each:

- *level*: one ratio per token ("token_*"), or one ratio per sequence, the product of its tokens' ratios
  prod_t rho_t = exp(sum_t log rho_t), given to each of its tokens ("sequence_*");
- *bound*: ratios outside [C_min, C_max] are clipped to the range ("*_truncate", truncated IS, TIS) or set to 0
  ("*_mask", masked IS, MIS / IcePop).

And a level TRL lacks, "sequence_geo_*": the length-normalised sequence ratio, the geometric mean of its tokens'
ratios exp(mean_t log rho_t), as GSPO's sequence ratio (huggingface.co/papers/2507.18071, eq. 7) and verl's "geometric"
rejection level. The exact sequence ratio of a long completion drifts far from 1 even when every token's ratio is
close to 1: its log is a sum of T small noisy terms whose mean under mu is -KL(mu || pi) per token, so it shrinks like
exp(-T * KL) and spreads like sqrt(T), and the bound then clips or masks most long sequences (TRL #5814: a mean ratio
of 0.569 with the sum where the length-normalised ratio gave 0.993; the fix was not merged). The geometric mean keeps
the scale of one token whatever the length. `scripts/benchmarks/benchmark_is_modes.py` measures how many samples each
mode keeps.

Truncated sampling. With `top_k` / `top_p`, vLLM returns the log-probability under the distribution it sampled from,
renormalised over the tokens the truncation kept (`logprobs_mode="processed_logprobs"`, what TRL requests), while a
trainer's log-softmax covers the whole vocabulary: the ratio then carries the kept probability mass S <= 1 of every
position, not a policy difference (TRL #6789: a mean ratio of 0.896 at top_p 0.8, 1.001 once renormalised).
[`kept_support_logps`] computes the trainer's side over the same kept support.

Statistics are returned before and after the bound (TRL logs only the latter; TRL #5231 asks for both and for the
fraction of ratios modified).

Shape letters as in `losses.py`: ``B`` rows, ``T`` target-aligned token positions, ``V`` vocabulary; ``U`` the counted
units of a mode (tokens for "token_*", rows with a counted token for the sequence modes). Masks: 1 = counts.
Log-probabilities in nats.

Differences from TRL: TRL computes the statistics over every row, rows without a counted token included (their
sequence ratio is exp(0) = 1); here they cover counted units only. The modes' weights are TRL's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper
from trl.trainer.utils import selective_log_softmax


CorrectionMode = Literal[
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
    "sequence_geo_truncate",
    "sequence_geo_mask",
]
TRL_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL 1.16's `vllm_importance_sampling_mode` values, with TRL's meaning."""
MODES = TRL_MODES + ("sequence_geo_truncate", "sequence_geo_mask")
"""Every accepted mode: TRL's four and the length-normalised sequence modes."""


@dataclass
class SamplerCorrection:
    """The importance weights of one batch and their statistics (all detached).

    `raw_ratio`, `ratio`, `clipped` and `masked` list the mode's counted units in row-major order: counted tokens for
    the token modes, rows with at least one counted token for the sequence modes.
    """

    weights: torch.Tensor  # (B, T) weight of each token's policy loss: its unit's bounded ratio; 1 off the mask
    raw_ratio: torch.Tensor  # (U,) each unit's ratio before the bound
    ratio: torch.Tensor  # (U,) each unit's ratio after the bound (the weight its tokens get)
    clipped: torch.Tensor  # (U,) bool: the ratio was outside the bounds and clipped to them ("*_truncate")
    masked: torch.Tensor  # (U,) bool: the ratio was outside the bounds and set to 0 ("*_mask")
    level: Literal["token", "sequence"]
    log_ratio: torch.Tensor | None = (
        None  # (B, T) log pi - log mu per token, 0 off the mask (when built from log-probs)
    )
    logp_difference: torch.Tensor | None = None  # (N,) |log pi - log mu| of the counted tokens mu gave a log-prob for

    def summary(self) -> dict[str, float]:
        """Means, extremes and fractions over the units, as Python floats (0 for an empty batch): `ratio/min|mean|max`
        (after the bound), `raw_ratio/min|mean|max` (before), `clipped_frac`, `masked_frac`, `units`, and
        `logp_difference/mean|max` when the log-probs were given."""
        out = {"units": float(self.ratio.numel())}
        for name, values in (("ratio", self.ratio), ("raw_ratio", self.raw_ratio)):
            values = values.double()
            empty = values.numel() == 0
            out[f"{name}/min"] = 0.0 if empty else float(values.min())
            out[f"{name}/mean"] = 0.0 if empty else float(values.mean())
            out[f"{name}/max"] = 0.0 if empty else float(values.max())
        units = max(self.ratio.numel(), 1)
        out["clipped_frac"] = float(self.clipped.sum()) / units
        out["masked_frac"] = float(self.masked.sum()) / units
        if self.logp_difference is not None:
            diff = self.logp_difference.double()
            out["logp_difference/mean"] = float(diff.mean()) if diff.numel() else 0.0
            out["logp_difference/max"] = float(diff.max()) if diff.numel() else 0.0
        return out


def bounds_problem(
    mode: str, clip_max: float | None, clip_min: float | None, correction: bool = True
) -> tuple[str, object, str] | None:
    """What is wrong with a mode and bounds, as `(field, value, fix)` with the `vllm_importance_sampling_*` field's
    name; None when they are usable. One rule set for `TRAPOConfig` and [`sampler_importance_weights`].

    Refused: a mode not in [`MODES`]; a bound that is not a finite number; `clip_max` < 1 or `clip_min` outside
    [0, 1] (a ratio of 1, sampler and trainer agreeing, would be clipped or masked); `clip_min >= clip_max` (TRL's
    rule); with `correction`, a "*_truncate" mode without either bound (TRL's rule).
    """
    if mode not in MODES:
        return "vllm_importance_sampling_mode", mode, f"use one of {', '.join(map(repr, MODES))}."
    for name, bound in (("clip_max", clip_max), ("clip_min", clip_min)):
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound)
        ):
            return f"vllm_importance_sampling_{name}", bound, "use a finite number, or None for no bound."
    if clip_max is not None and clip_max < 1:
        return (
            "vllm_importance_sampling_clip_max",
            clip_max,
            "use a bound >= 1 (TRL's default is 3.0), or None for no upper bound: below 1, a ratio of 1 (sampler and "
            "trainer agree) would be clipped or masked.",
        )
    if clip_min is not None and not 0 <= clip_min <= 1:
        return (
            "vllm_importance_sampling_clip_min",
            clip_min,
            "use a bound in [0, 1], or None for no lower bound: a ratio of 1 (sampler and trainer agree) must stay "
            "inside the bounds.",
        )
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        return (
            "vllm_importance_sampling_clip_min",
            clip_min,
            f"it must be less than vllm_importance_sampling_clip_max={clip_max!r}.",
        )
    if correction and mode.endswith("_truncate") and clip_min is None and clip_max is None:
        return (
            "vllm_importance_sampling_clip_max",
            None,
            f"mode {mode!r} truncates the ratio to [clip_min, clip_max]: set vllm_importance_sampling_clip_max "
            "(e.g. 3.0) or vllm_importance_sampling_clip_min.",
        )
    return None


def check_bounds(mode: str, clip_max: float | None, clip_min: float | None) -> None:
    """Raise for a mode or bounds [`sampler_importance_weights`] cannot use (see [`bounds_problem`]).

    Raises:
        ValueError: naming the field, the value and the fix.
    """
    problem = bounds_problem(mode, clip_max, clip_min)
    if problem is not None:
        name, value, fix = problem
        raise ValueError(f"{name}={value!r} is invalid: {fix}")


def sampler_importance_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    mode: CorrectionMode = "sequence_mask",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> SamplerCorrection:
    """Importance weights that correct the policy loss for a sampler that is not the trainer, per TRL's
    `vllm_importance_sampling_mode` (GRPOTrainer, TRL 1.16) or a length-normalised sequence mode.

    With l_t = log pi(y_t) - log mu(y_t) at the counted tokens (0 elsewhere):

    - "token_*": rho_t = exp(l_t) for each token;
    - "sequence_*": rho = exp(sum_t l_t) for each row (TRL's sequence ratio, the exact ratio of the sequence);
    - "sequence_geo_*": rho = exp(sum_t l_t / n) for each row, n its counted tokens (the geometric mean of the
      tokens' ratios; GSPO huggingface.co/papers/2507.18071 eq. 7, verl's "geometric" level);
    - "*_truncate": w = clamp(rho, clip_min, clip_max) (truncated IS); "*_mask": w = rho inside
      [clip_min, clip_max], 0 outside (masked IS). A None bound is no bound on that side.

    A sequence mode gives every token of the row the row's weight. The weights multiply the per-token policy loss
    (after PPO's clip, before the KL and entropy terms), detached, and leave the loss normalisers unchanged, as TRL
    does.

    Args:
        log_ratio (`torch.Tensor`): `(B, T)` log pi - log mu per token (nats); read where `mask` is 1 (see
            [`sampler_log_ratio`] for NaN sampler log-probs).
        mask (`torch.Tensor`): `(B, T)` 1 on the counted tokens.
        mode (`str`): one of [`MODES`].
        clip_max (`float`, *optional*): C_max, >= 1.
        clip_min (`float`, *optional*): C_min, in [0, 1].

    Returns:
        [`SamplerCorrection`]: `(B, T)` weights (1 off the mask) and the units' ratios before and after the bound.

    Raises:
        ValueError: from [`check_bounds`], for an unknown mode or unusable bounds; if the shapes differ.
    """
    check_bounds(mode, clip_max, clip_min)
    if log_ratio.shape != mask.shape or log_ratio.dim() != 2:
        raise ValueError(
            f"sampler_importance_weights: log_ratio {tuple(log_ratio.shape)} and mask {tuple(mask.shape)} must both "
            "be (B, T)."
        )
    counted = mask.bool()
    log_ratio = torch.where(counted, log_ratio.detach().double(), 0.0)  # float64: exp of a long sum stays finite
    if mode.startswith("token_"):
        level = "token"
        raw = torch.exp(log_ratio)  # (B, T)
        units = counted
    else:
        level = "sequence"
        total = log_ratio.sum(-1, keepdim=True)  # (B, 1)
        if mode.startswith("sequence_geo_"):
            total = total / counted.sum(-1, keepdim=True).clamp(min=1)
        raw = torch.exp(total)  # (B, 1)
        units = counted.any(-1, keepdim=True)  # (B, 1)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    outside = (raw < low) | (raw > high)
    if mode.endswith("_truncate"):
        bounded = torch.clamp(raw, min=clip_min, max=clip_max)
        clipped, masked = outside, torch.zeros_like(outside)
    else:
        bounded = raw.masked_fill(outside, 0.0)
        clipped, masked = torch.zeros_like(outside), outside
    weights = torch.where(counted, bounded.expand_as(log_ratio), 1.0).to(torch.float32)
    return SamplerCorrection(
        weights=weights,
        raw_ratio=raw[units].float(),
        ratio=bounded[units].float(),
        clipped=clipped[units],
        masked=masked[units],
        level=level,
    )


def sampler_log_ratio(
    trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi - log mu at the counted tokens.

    A NaN sampler log-prob (vLLM could not score the token; TRL maps vLLM's None to NaN) gives a log-ratio of 0, a
    ratio of exactly 1 (no correction), as in TRL.

    Args:
        trainer_logps (`torch.Tensor`): `(B, T)` log pi(y_t), the trainer's, over the support the sampler sampled from
            (see [`kept_support_logps`]).
        sampler_logps (`torch.Tensor`): `(B, T)` log mu(y_t), the sampler's; NaN = unknown.
        mask (`torch.Tensor`): `(B, T)` 1 on the counted tokens.

    Returns:
        tuple `(log_ratio, known)`: `(B, T)` float32 log-ratios (0 off the mask and where mu is unknown) and `(B, T)`
        bool, the counted tokens with a known sampler log-prob.
    """
    known = mask.bool() & ~torch.isnan(sampler_logps)
    difference = trainer_logps.detach().float() - torch.nan_to_num(sampler_logps.float(), nan=0.0)
    return torch.where(known, difference, 0.0), known


def correct_sampler_mismatch(
    trainer_logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: CorrectionMode = "sequence_mask",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> SamplerCorrection:
    """[`sampler_importance_weights`] from the two log-probs: the log-ratio of [`sampler_log_ratio`], the weights, and
    TRL's `sampling/sampling_logp_difference` values (|log pi - log mu| at the counted tokens mu scored).

    Args:
        trainer_logps (`torch.Tensor`): `(B, T)` the trainer's log-probs of the sampled tokens, for the weights the
            sampler had, over the sampler's kept support ([`kept_support_logps`]) (nats).
        sampler_logps (`torch.Tensor`): `(B, T)` the sampler's log-probs of the same tokens (nats; NaN = unknown).
        mask (`torch.Tensor`): `(B, T)` 1 on the counted tokens.
        mode, clip_max, clip_min: see [`sampler_importance_weights`].

    Returns:
        [`SamplerCorrection`] with `log_ratio` and `logp_difference` set.

    Raises:
        ValueError: as [`sampler_importance_weights`].
    """
    log_ratio, known = sampler_log_ratio(trainer_logps, sampler_logps, mask)
    out = sampler_importance_weights(log_ratio, mask, mode, clip_max, clip_min)
    out.log_ratio = log_ratio
    out.logp_difference = log_ratio[known].abs()
    return out


def kept_support_logps(
    logits: torch.Tensor, index: torch.Tensor, top_k: int = 0, top_p: float = 1.0, chunk_rows: int = 1024
) -> torch.Tensor:
    """log q(y) where q is softmax(`logits`) restricted to the tokens `top_k` / `top_p` keep and renormalised: the
    distribution a sampler with those settings draws from, and what vLLM reports with
    `logprobs_mode="processed_logprobs"`.

    The kept set is transformers' (`TopKLogitsWarper`, then `TopPLogitsWarper` on what top-k kept, as `generate` and
    vLLM apply them), and log q(y) = log p(y) - log S with S the kept probability mass (TRL #6789). The kept set is
    computed from these logits, so where another engine's logits put the boundary elsewhere its set may differ by a
    token at the edge; a sampled token outside this set still gets log p(y) - log S (finite), not -inf.

    Args:
        logits (`torch.Tensor`): `(..., V)` logits, already divided by the sampling temperature.
        index (`torch.Tensor`): `(...)` long, the tokens.
        top_k (`int`): 0 = no top-k.
        top_p (`float`): 1 = no top-p.
        chunk_rows (`int`): positions sorted at once (top-p sorts `(chunk_rows, V)`).

    Returns:
        `torch.Tensor`: `(...)` float32 log-probs (nats); log p(y) itself without truncation.

    Raises:
        ValueError: for `top_k` < 0, `top_p` outside (0, 1], or shapes that do not match.
    """
    if top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"kept_support_logps: top_k={top_k} must be >= 0 and top_p={top_p} in (0, 1].")
    if logits.shape[:-1] != index.shape:
        raise ValueError(f"kept_support_logps: logits {tuple(logits.shape)} do not match index {tuple(index.shape)}.")
    logits = logits.float()
    full = selective_log_softmax(logits, index)
    if top_k == 0 and top_p == 1.0:
        return full
    warpers = ([TopKLogitsWarper(top_k)] if top_k > 0 else []) + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
    flat = logits.reshape(-1, logits.shape[-1])
    log_mass = []
    for start in range(0, flat.shape[0], chunk_rows):
        chunk = flat[start : start + chunk_rows]
        kept = chunk
        for warper in warpers:
            kept = warper(None, kept)
        log_mass.append(torch.logsumexp(kept, -1) - torch.logsumexp(chunk, -1))  # log S <= 0
    log_mass = torch.cat(log_mass).reshape(index.shape) if log_mass else full.new_zeros(index.shape)
    return full - log_mass


__all__ = [
    "MODES",
    "TRL_MODES",
    "CorrectionMode",
    "SamplerCorrection",
    "bounds_problem",
    "check_bounds",
    "correct_sampler_mismatch",
    "kept_support_logps",
    "sampler_importance_weights",
    "sampler_log_ratio",
]
