# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The sampler/trainer mismatch correction (`trl_trapo.sampler_correction`) on synthetic log-probabilities: TRL's four
modes against hand-worked values, the length-normalised sequence modes, the statistics before the bound, and the
trainer's log-probs over the sampler's kept top-k / top-p support."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from trl_trapo.sampler_correction import (
    MODES,
    TRL_MODES,
    check_bounds,
    correct_sampler_mismatch,
    kept_support_logps,
    sampler_importance_weights,
    sampler_log_ratio,
)


LN = math.log
# two rows: row 0 has three counted tokens with ratios 2, 4, 0.5; row 1 two counted tokens with ratios 0.25, 0.5 and a
# third position off the mask whose (absurd) log-ratio must be ignored everywhere
LOG_RATIO = torch.tensor([[LN(2), LN(4), LN(0.5)], [LN(0.25), LN(0.5), 99.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# sequence ratios: row 0 2 * 4 * 0.5 = 4, row 1 0.25 * 0.5 = 0.125; geometric means 4 ** (1/3), 0.125 ** (1/2)
SEQ = [4.0, 0.125]
GEO = [4.0 ** (1 / 3), 0.125**0.5]


# (mode, clip_min, clip_max) -> the (B, T) weights by hand; 1 off the mask
EXPECTED = {
    # per token, clipped to [0.3, 3]: 4 -> 3, 0.25 -> 0.3
    ("token_truncate", 0.3, 3.0): [[2.0, 3.0, 0.5], [0.3, 0.5, 1.0]],
    # per token, outside [0.3, 3] -> 0: 4 and 0.25
    ("token_mask", 0.3, 3.0): [[2.0, 0.0, 0.5], [0.0, 0.5, 1.0]],
    # TRL's default bounds (clip_min None): only the upper side acts
    ("token_truncate", None, 3.0): [[2.0, 3.0, 0.5], [0.25, 0.5, 1.0]],
    ("token_mask", None, 3.0): [[2.0, 0.0, 0.5], [0.25, 0.5, 1.0]],
    # one ratio per row, its tokens' product: 4 -> 3, 0.125 -> 0.3
    ("sequence_truncate", 0.3, 3.0): [[3.0, 3.0, 3.0], [0.3, 0.3, 1.0]],
    # both rows outside [0.3, 3]: masked whole
    ("sequence_mask", 0.3, 3.0): [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]],
    ("sequence_mask", None, 3.0): [[0.0, 0.0, 0.0], [0.125, 0.125, 1.0]],
    # the geometric means 1.587 and 0.354 are inside [0.3, 3]: kept as they are
    ("sequence_geo_truncate", 0.3, 3.0): [[GEO[0]] * 3, [GEO[1], GEO[1], 1.0]],
    ("sequence_geo_mask", 0.3, 3.0): [[GEO[0]] * 3, [GEO[1], GEO[1], 1.0]],
    # a tighter band: 1.587 -> 1.2 (truncate) or 0 (mask); 0.354 -> 0.5 or 0
    ("sequence_geo_truncate", 0.5, 1.2): [[1.2] * 3, [0.5, 0.5, 1.0]],
    ("sequence_geo_mask", 0.5, 1.2): [[0.0] * 3, [0.0, 0.0, 1.0]],
}


@pytest.mark.parametrize("mode, clip_min, clip_max", list(EXPECTED), ids=[f"{m}-{lo}-{hi}" for m, lo, hi in EXPECTED])
def test_each_mode_by_hand(mode, clip_min, clip_max):
    out = sampler_importance_weights(LOG_RATIO, MASK, mode, clip_max=clip_max, clip_min=clip_min)
    torch.testing.assert_close(out.weights, torch.tensor(EXPECTED[(mode, clip_min, clip_max)]), rtol=1e-6, atol=1e-6)
    assert out.weights.dtype == torch.float32


def test_units_and_statistics_before_and_after_the_bound():
    # token level: the 5 counted tokens, ratios 2, 4, 0.5, 0.25, 0.5 (mean 7.25 / 5 = 1.45)
    token = sampler_importance_weights(LOG_RATIO, MASK, "token_truncate", clip_max=3.0, clip_min=0.3).summary()
    assert token["units"] == 5
    assert token["raw_ratio/min"] == pytest.approx(0.25) and token["raw_ratio/max"] == pytest.approx(4.0)
    assert token["raw_ratio/mean"] == pytest.approx(7.25 / 5)
    # after: 2, 3, 0.5, 0.3, 0.5
    assert token["ratio/min"] == pytest.approx(0.3) and token["ratio/max"] == pytest.approx(3.0)
    assert token["ratio/mean"] == pytest.approx(6.3 / 5)
    assert token["clipped_frac"] == pytest.approx(2 / 5) and token["masked_frac"] == 0.0
    # sequence level: the 2 rows, ratios 4 and 0.125, both masked
    sequence = sampler_importance_weights(LOG_RATIO, MASK, "sequence_mask", clip_max=3.0, clip_min=0.3)
    stats = sequence.summary()
    assert stats["units"] == 2 and sequence.level == "sequence"
    assert stats["raw_ratio/mean"] == pytest.approx((4.0 + 0.125) / 2)
    assert stats["ratio/max"] == 0.0 and stats["masked_frac"] == 1.0 and stats["clipped_frac"] == 0.0
    # the geometric level keeps both rows
    geo = sampler_importance_weights(LOG_RATIO, MASK, "sequence_geo_mask", clip_max=3.0, clip_min=0.3).summary()
    assert geo["masked_frac"] == 0.0 and geo["ratio/mean"] == pytest.approx(sum(GEO) / 2)


def test_a_row_without_counted_tokens_is_no_unit_and_weighs_one():
    log_ratio = torch.tensor([[LN(2.0), 5.0], [7.0, 7.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    for mode in MODES:
        out = sampler_importance_weights(log_ratio, mask, mode, clip_max=3.0)
        assert out.ratio.numel() == 1, mode
        torch.testing.assert_close(out.weights[1], torch.ones(2))
        assert out.raw_ratio.item() == pytest.approx(2.0)


def test_empty_batch_statistics_are_zero_not_nan():
    out = sampler_importance_weights(torch.zeros(2, 3), torch.zeros(2, 3), "token_mask")
    assert all(value == 0.0 for value in out.summary().values())


def test_nan_sampler_logps_give_ratio_one_and_stay_out_of_the_difference():
    trainer = torch.tensor([[-1.0, -2.0, -3.0]])
    sampler = torch.tensor([[-1.5, float("nan"), -3.0]])
    mask = torch.ones(1, 3)
    log_ratio, known = sampler_log_ratio(trainer, sampler, mask)
    torch.testing.assert_close(log_ratio, torch.tensor([[0.5, 0.0, 0.0]]))
    assert known.tolist() == [[True, False, True]]
    out = correct_sampler_mismatch(trainer, sampler, mask, "token_truncate", clip_max=3.0)
    torch.testing.assert_close(out.weights, torch.tensor([[math.exp(0.5), 1.0, 1.0]]))
    stats = out.summary()
    assert stats["logp_difference/mean"] == pytest.approx(0.25) and stats["logp_difference/max"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "mode, clip_max, clip_min, message",
    [
        ("sequence", 3.0, None, "mode='sequence' is invalid: use one of 'token_truncate'"),
        ("token_truncate", None, None, "clip_max=None is invalid: mode 'token_truncate' truncates"),
        ("sequence_geo_truncate", None, None, "clip_max=None is invalid: mode 'sequence_geo_truncate' truncates"),
        ("token_mask", 0.9, None, "clip_max=0.9 is invalid: use a bound >= 1"),
        ("token_mask", 3.0, 1.5, "clip_min=1.5 is invalid: use a bound in \\[0, 1\\]"),
        (
            "token_mask",
            1.0,
            1.0,
            "clip_min=1.0 is invalid: it must be less than vllm_importance_sampling_clip_max=1.0",
        ),
        ("token_mask", math.inf, None, "clip_max=inf is invalid: use a finite number"),
    ],
)
def test_bad_modes_and_bounds_name_the_field_and_the_fix(mode, clip_max, clip_min, message):
    with pytest.raises(ValueError, match=message):
        check_bounds(mode, clip_max, clip_min)
    with pytest.raises(ValueError, match=message):
        sampler_importance_weights(LOG_RATIO, MASK, mode, clip_max=clip_max, clip_min=clip_min)


def test_mask_modes_without_bounds_change_nothing():
    for mode in ("token_mask", "sequence_mask", "sequence_geo_mask"):
        out = sampler_importance_weights(LOG_RATIO, MASK, mode, clip_max=None, clip_min=None)
        assert not out.masked.any()
    assert set(TRL_MODES) < set(MODES)


def noisy_long_completions(rows: int, length: int, noise: float, seed: int = 0):
    """Sampler log-probs and trainer log-probs of the same tokens, differing by small per-token noise (a bf16 sampler
    against an fp32 trainer): the trainer's log-prob is the sampler's plus N(-noise^2 / 2, noise^2), so that the
    ratio's mean under the sampler is 1 per token (E[exp(l)] = 1)."""
    generator = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(rows, length, generator=generator) * 3
    trainer = sampler + noise * torch.randn(rows, length, generator=generator) - noise**2 / 2
    return trainer, sampler, torch.ones(rows, length)


def test_the_exact_sequence_ratio_drifts_with_length_and_the_geometric_one_does_not():
    # 2048 tokens, per-token log-ratio noise 0.05: sum_t l_t ~ N(-2048 * 0.00125, 2048 * 0.0025) = N(-2.56, 2.26^2)
    trainer, sampler, mask = noisy_long_completions(rows=256, length=2048, noise=0.05)
    exact = correct_sampler_mismatch(trainer, sampler, mask, "sequence_mask", clip_max=3.0).summary()
    geo = correct_sampler_mismatch(trainer, sampler, mask, "sequence_geo_mask", clip_max=3.0).summary()
    token = correct_sampler_mismatch(trainer, sampler, mask, "token_mask", clip_max=3.0).summary()
    # a token's ratio has mean 1; the geometric mean of 2048 of them is exp(-0.00125) ~ 0.999
    assert token["raw_ratio/mean"] == pytest.approx(1.0, abs=0.01)
    assert geo["raw_ratio/mean"] == pytest.approx(1.0, abs=0.01) and geo["masked_frac"] == 0.0
    # the exact sequence ratio: a heavy-tailed spread over orders of magnitude, most of it far below 1 ...
    raw = correct_sampler_mismatch(trainer, sampler, mask, "sequence_mask", clip_max=3.0).raw_ratio
    assert float((raw < 0.5).float().mean()) > 0.5 and float(raw.max()) > 10
    # ... with TRL's default C_max = 3 the upper tail (P(sum > ln 3) ~ 5%) is masked and the kept rows weigh far less
    # than 1; with a two-sided band [1/3, 3] most rows are masked (P(|sum| > ln 3) ~ 79%), the geometric level none
    assert exact["masked_frac"] > 0.02 and exact["ratio/mean"] < 0.6
    band = dict(clip_max=3.0, clip_min=1 / 3)
    assert correct_sampler_mismatch(trainer, sampler, mask, "sequence_mask", **band).summary()["masked_frac"] > 0.6
    assert correct_sampler_mismatch(trainer, sampler, mask, "sequence_geo_mask", **band).summary()["masked_frac"] == 0


@pytest.mark.parametrize("top_k, top_p", [(0, 0.8), (20, 1.0), (50, 0.9)])
def test_kept_support_logps_equal_the_truncated_renormalised_distribution(top_k, top_p):
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 7, 300, generator=generator) * 2
    scores = logits.reshape(-1, 300)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    truncated = torch.log_softmax(scores, -1)  # the sampler's processed log-probs; -inf outside the kept support
    kept = torch.isfinite(truncated)
    tokens = torch.multinomial(truncated.exp(), 1, generator=generator).squeeze(-1)  # sampled inside the support
    got = kept_support_logps(logits, tokens.view(4, 7), top_k, top_p, chunk_rows=5)
    torch.testing.assert_close(got.reshape(-1), truncated.gather(-1, tokens[:, None]).squeeze(-1))
    assert bool(kept.sum(-1).lt(300).all())  # the truncation did remove tokens
    # no truncation: the plain log-softmax
    torch.testing.assert_close(
        kept_support_logps(logits, tokens.view(4, 7)),
        torch.log_softmax(logits, -1).gather(-1, tokens.view(4, 7, 1)).squeeze(-1),
    )


def test_top_p_ratio_is_one_on_the_kept_support_and_the_kept_mass_on_the_full_vocabulary():
    """TRL #6789: at top_p 0.8 a full-vocabulary trainer log-prob against the sampler's renormalised one gives a mean
    ratio of about 0.8 (the kept mass) on tokens sampled from the very same policy; over the kept support it is 1."""
    generator = torch.Generator().manual_seed(2)
    positions, vocab, top_p = 4096, 1000, 0.8
    logits = torch.randn(positions, vocab, generator=generator) * 1.5  # a flat-ish distribution: top-p cuts a lot
    warped = TopPLogitsWarper(top_p)(None, logits)
    sampler_logps_all = torch.log_softmax(warped, -1)
    tokens = torch.multinomial(sampler_logps_all.exp(), 1, generator=generator).squeeze(-1)
    sampler = sampler_logps_all.gather(-1, tokens[:, None]).squeeze(-1).view(1, -1)
    mask = torch.ones(1, positions)
    # the trainer's logits: the sampler's plus bf16-sized noise
    trainer_logits = logits + 0.01 * torch.randn(positions, vocab, generator=generator)
    naive = torch.log_softmax(trainer_logits, -1).gather(-1, tokens[:, None]).squeeze(-1).view(1, -1)
    kept = kept_support_logps(trainer_logits, tokens, top_p=top_p).view(1, -1)
    naive_ratio = correct_sampler_mismatch(naive, sampler, mask, "token_truncate", clip_max=3.0).summary()
    kept_ratio = correct_sampler_mismatch(kept, sampler, mask, "token_truncate", clip_max=3.0).summary()
    assert naive_ratio["raw_ratio/mean"] == pytest.approx(0.8, abs=0.02)
    assert kept_ratio["raw_ratio/mean"] == pytest.approx(1.0, abs=0.005)
    # the same logits in both engines: exactly 1 on the kept support
    exact = kept_support_logps(logits, tokens, top_p=top_p).view(1, -1)
    torch.testing.assert_close(exact, sampler)


def test_kept_support_logps_refuses_bad_settings():
    with pytest.raises(ValueError, match="top_p=1.5"):
        kept_support_logps(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), top_p=1.5)
    with pytest.raises(ValueError, match="do not match"):
        kept_support_logps(torch.zeros(2, 5), torch.zeros(3, dtype=torch.long))


# ---------------------------------------------------------------------------------------------------------------------
# Any engine: a rollout source that returns its sampler's log-probs (what the asynchronous producer will do)
# ---------------------------------------------------------------------------------------------------------------------
def sampler_source(suite, tokenizer, value: float, nan_at: int | None = None):
    from test_sources import FixedRounds, answers

    completions = answers(tokenizer, ["1", "22", "333", "4444"])

    def sampler_logps(n: int) -> list[torch.Tensor]:
        out = [torch.full((len(completions[i % 4]),), value) for i in range(n)]
        if nan_at is not None:
            out[0][nan_at] = float("nan")  # a token the engine gave no log-prob for
        return out

    return FixedRounds(suite.rl_train, completions, sampler_per_token_logps=sampler_logps)


def test_a_source_with_sampler_logps_gets_the_trainers_logps_and_the_mismatch_log_ratio(tmp_path, tokenizer, suite):
    from test_sources import rl_trainer

    from trl_trapo.models import completion_logps

    source = sampler_source(suite, tokenizer, -1.0, nan_at=0)
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, vllm_importance_sampling_mode="token_mask")
    batch = trainer.collect_rollouts(8, step=0)
    expected = completion_logps(trainer.model, batch.prompt_ids, batch.completion_ids, trainer.padding_id)
    for old, want in zip(batch.old_per_token_logps, expected):
        torch.testing.assert_close(old, want)  # the behaviour log-probs are the trainer's own, not the sampler's
    assert len(batch.trajectories) == len(batch.completion_ids)  # every completion scored: the same order
    for i, (trajectory, old) in enumerate(zip(batch.trajectories, batch.old_per_token_logps)):
        ratio = trajectory.sampler_log_ratio
        want = old + 1.0  # log pi_trainer - (-1), no truncation: the full-vocabulary log-probs
        if i == 0:
            want[0] = 0.0  # NaN sampler log-prob: ratio 1
        torch.testing.assert_close(ratio, want)
    stats = batch.sampler_correction.summary()
    assert stats["units"] == sum(c.numel() for c in batch.completion_ids)
    assert batch.sampler_correction.logp_difference.numel() == stats["units"] - 1


def test_a_source_with_sampler_logps_and_the_correction_off_is_trained_uncorrected(tmp_path, tokenizer, suite):
    from test_sources import rl_trainer

    source = sampler_source(suite, tokenizer, -1.0)
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, vllm_importance_sampling_correction=False)
    batch = trainer.collect_rollouts(8, step=0)
    assert batch.sampler_correction is None
    assert all(t.sampler_log_ratio is None for t in batch.trajectories)
    assert not any(bool((old == -1.0).all()) for old in batch.old_per_token_logps)  # the trainer's, not the sampler's


def test_sampled_round_refuses_bad_sampler_logps(suite):
    from trl_trapo.sources import SampledRound

    examples, completions = [dict(suite.rl_train[0])], [torch.tensor([3, 4])]
    with pytest.raises(ValueError, match="not both"):
        SampledRound(
            examples,
            completions,
            version=0,
            old_per_token_logps=[torch.tensor([-1.0, -1.0])],
            sampler_per_token_logps=[torch.tensor([-1.0, -1.0])],
        )
    with pytest.raises(ValueError, match="sampler_per_token_logps\\[0\\] must be log-probabilities <= 0"):
        SampledRound(examples, completions, version=0, sampler_per_token_logps=[torch.tensor([0.5, -1.0])])
    with pytest.raises(ValueError, match="sampler_per_token_logps must hold one \\(C_i,\\) tensor per completion"):
        SampledRound(examples, completions, version=0, sampler_per_token_logps=[torch.tensor([-1.0])])
    sampled = SampledRound(
        examples,
        completions,
        version=0,
        sampler_per_token_logps=[torch.tensor([float("nan"), -1.0])],
        completion_mask=[torch.tensor([1.0, 0.0])],
    )
    assert torch.isnan(sampled.sampler_per_token_logps[0][0]) and sampled.sampler_per_token_logps[0][1] == 0.0
