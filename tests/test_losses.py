# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Hand-worked values for every loss term of `trl_trapo.losses` (the arithmetic is in the comments)."""

import math

import pytest
import torch

from trl_trapo.losses import (
    aggregate_rl_loss,
    clipped_policy_loss,
    clipped_value_loss,
    gae_advantages,
    group_relative_advantages,
    kl_estimate,
    last_token_index,
    masked_mean,
    masked_sum,
    masked_whiten,
    per_token_rewards,
    sft_token_weights,
    truncated_is_policy_loss,
)


LN2 = math.log(2.0)
NAN = float("nan")


def t(values, dtype=torch.float64, requires_grad=False):
    return torch.tensor(values, dtype=dtype, requires_grad=requires_grad)


# ---------------------------------------------------------------------------------------------------------------------
# Masked reductions
# ---------------------------------------------------------------------------------------------------------------------
def test_masked_sum_and_mean_ignore_nan_in_masked_positions():
    values = t([[1.0, NAN, 3.0], [math.inf, 5.0, 6.0]])
    mask = t([[1, 0, 1], [0, 1, 0]])
    # 1 + 3 + 5 = 9 over 3 tokens
    assert masked_sum(values, mask).item() == 9.0
    assert masked_mean(values, mask).item() == 3.0
    # per row: (1 + 3) / 2 = 2, 5 / 1 = 5
    torch.testing.assert_close(masked_mean(values, mask, dim=-1), t([2.0, 5.0]))


def test_masked_mean_of_empty_mask_is_zero_not_nan():
    values = t([[NAN, 2.0], [1.0, 2.0]])
    mask = t([[0, 0], [0, 1]])
    torch.testing.assert_close(masked_mean(values, mask, dim=-1), t([0.0, 2.0]))
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_masked_whiten_by_hand():
    # masked entries 2, 4, 6: mean 4, unbiased variance (4 + 0 + 4) / (3 - 1) = 4, std 2
    values = t([[2.0, 4.0], [6.0, 100.0]])
    mask = t([[1, 1], [1, 0]])
    whitened = masked_whiten(values, mask)
    # (v - 4) / 2; the masked-out entry is transformed with the same statistics: (100 - 4) / 2 = 48
    torch.testing.assert_close(whitened, t([[-1.0, 0.0], [1.0, 48.0]]))
    # shift_mean=False adds the mean back: (v - 4) / 2 + 4
    torch.testing.assert_close(masked_whiten(values, mask, shift_mean=False), t([[3.0, 4.0], [5.0, 52.0]]))


def test_masked_whiten_uses_unbiased_variance():
    # two entries 0 and 2: mean 1, biased variance 1, unbiased variance 2 -> (0 - 1) / sqrt(2)
    whitened = masked_whiten(t([[0.0, 2.0]]), t([[1, 1]]))
    torch.testing.assert_close(whitened, t([[-1 / math.sqrt(2), 1 / math.sqrt(2)]]))


def test_masked_whiten_with_a_reduce_uses_every_shares_entries():
    """Two shares of one batch, the all-reduce simulated by adding the other share's part: each share is whitened with
    the statistics of both together (mean 4, std 2 as in the by-hand test), not its own."""
    share_a, mask_a = t([[2.0, 4.0]]), t([[1, 1]])
    share_b, mask_b = t([[6.0, 100.0]]), t([[1, 0]])
    parts = iter([mask_b.sum(), (share_b * mask_b).sum(), (((share_b - 4.0) ** 2) * mask_b).sum()])

    def reduce(tensor):  # this share's value + the other share's (in the order masked_whiten asks for them)
        return tensor + next(parts)

    torch.testing.assert_close(masked_whiten(share_a, mask_a, reduce=reduce), t([[-1.0, 0.0]]))
    # alone, the share would be whitened with its own mean 3 and std sqrt(2)
    torch.testing.assert_close(masked_whiten(share_a, mask_a), t([[-1 / math.sqrt(2), 1 / math.sqrt(2)]]))


@pytest.mark.parametrize("mask", [[[1, 0, 0]], [[0, 0, 0]]])
def test_masked_whiten_needs_two_entries(mask):
    with pytest.raises(ValueError, match="at least 2 unmasked entries"):
        masked_whiten(t([[1.0, 2.0, 3.0]]), t(mask))


# ---------------------------------------------------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "estimator, expected",
    [
        # log pi = log 0.5, log pi_ref = log 0.25 -> log r = log(0.25 / 0.5) = -ln 2, r = 0.5
        ("k1", LN2),  # -log r = ln 2 = 0.693147
        ("k2", 0.5 * LN2**2),  # (log r)^2 / 2 = 0.240227
        ("k3", LN2 - 0.5),  # (r - 1) - log r = -0.5 + ln 2 = 0.193147
    ],
)
def test_kl_estimators_by_hand(estimator, expected):
    kl = kl_estimate(t([[math.log(0.5)]]), t([[math.log(0.25)]]), estimator)
    assert kl.shape == (1, 1)
    assert kl.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "estimator, expected",
    [
        # log pi = log 0.25, log pi_ref = log 0.5 -> log r = ln 2, r = 2
        ("k1", -LN2),  # k1 is negative for this token (unbiased only in expectation)
        ("k2", 0.5 * LN2**2),
        ("k3", 1.0 - LN2),  # (2 - 1) - ln 2 = 0.306853
    ],
)
def test_kl_estimators_reversed_ratio(estimator, expected):
    kl = kl_estimate(t([[math.log(0.25)]]), t([[math.log(0.5)]]), estimator)
    assert kl.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_is_zero_when_policies_agree(estimator):
    logps = t([[-0.3, -2.0, -5.0]])
    assert torch.equal(kl_estimate(logps, logps.clone(), estimator), torch.zeros_like(logps))


def test_kl_unknown_estimator_raises():
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(t([[0.0]]), t([[0.0]]), "k4")


# ---------------------------------------------------------------------------------------------------------------------
# Clipped surrogate
# ---------------------------------------------------------------------------------------------------------------------
# eps = 0.2 (clip interval [0.8, 1.2]), old log-prob log 0.5; rho = exp(log pi - log pi_old)
@pytest.mark.parametrize(
    "advantage, ratio, expected_loss, clipped, expected_grad",
    [
        # A > 0, rho = 1.5 > 1.2: unclipped -1.5, clipped -1.2 -> max = -1.2, clipped branch, d/dlogp = 0
        (1.0, 1.5, -1.2, True, 0.0),
        # A > 0, rho = 0.5 < 0.8: unclipped -0.5, clipped -0.8 -> max = -0.5, unclipped, d/dlogp = -A * rho = -0.5
        (1.0, 0.5, -0.5, False, -0.5),
        # A < 0, rho = 1.5 > 1.2: unclipped 1.5, clipped 1.2 -> max = 1.5, unclipped, d/dlogp = -A * rho = 1.5
        (-1.0, 1.5, 1.5, False, 1.5),
        # A < 0, rho = 0.5 < 0.8: unclipped 0.5, clipped 0.8 -> max = 0.8, clipped branch, d/dlogp = 0
        (-1.0, 0.5, 0.8, True, 0.0),
        # inside the trust region, A = 2, rho = 1.1: both branches -2.2, gradient -A * rho = -2.2
        (2.0, 1.1, -2.2, False, -2.2),
    ],
)
def test_clipped_policy_loss_four_cases(advantage, ratio, expected_loss, clipped, expected_grad):
    old = t([[math.log(0.5)]])
    logps = (old + math.log(ratio)).detach().requires_grad_(True)
    out = clipped_policy_loss(logps, old, t([[advantage]]), cliprange=0.2)
    assert out.per_token_loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert bool(out.is_clipped.item()) is clipped
    assert out.ratio.item() == pytest.approx(ratio, rel=1e-12)
    assert out.approx_kl.item() == pytest.approx(0.5 * math.log(ratio) ** 2, rel=1e-12)
    out.per_token_loss.sum().backward()
    assert logps.grad.item() == pytest.approx(expected_grad, abs=1e-12)
    if clipped:
        assert logps.grad.item() == 0.0  # exactly 0, not just small


def test_clipped_policy_loss_batched_gradient_zero_exactly_where_clipped():
    # the four cases above in one (1, 4) tensor; the gradient must be zero exactly on the clipped ones
    old = t([[math.log(0.5)] * 4])
    ratios = t([[1.5, 0.5, 1.5, 0.5]])
    logps = (old + ratios.log()).detach().requires_grad_(True)
    advantages = t([[1.0, 1.0, -1.0, -1.0]])
    out = clipped_policy_loss(logps, old, advantages, cliprange=0.2)
    out.per_token_loss.sum().backward()
    assert out.is_clipped.tolist() == [[True, False, False, True]]
    assert (logps.grad == 0).tolist() == out.is_clipped.tolist()
    torch.testing.assert_close(logps.grad, t([[0.0, -0.5, 1.5, 0.0]]))
    assert not out.ratio.requires_grad and not out.approx_kl.requires_grad


def test_clipped_policy_loss_broadcasts_sequence_advantage_and_applies_importance_weight():
    old = t([[0.0, 0.0]])
    # rho = 1.5 (clipped to 1.2 for A > 0) and rho = 1.0
    logps = t([[math.log(1.5), 0.0]], requires_grad=True)
    weights = t([[0.5, 0.25]])
    out = clipped_policy_loss(logps, old, t([[2.0]]), cliprange=0.2, importance_weights=weights)
    # token 0: max(-2 * 1.5, -2 * 1.2) * 0.5 = -1.2 ; token 1: -2 * 1.0 * 0.25 = -0.5
    torch.testing.assert_close(out.per_token_loss, t([[-1.2, -0.5]]))
    out.per_token_loss.sum().backward()
    # token 0 clipped -> 0; token 1: d/dlogp (-2 * rho * 0.25) = -0.5 * rho = -0.5
    torch.testing.assert_close(logps.grad, t([[0.0, -0.5]]))


# ---------------------------------------------------------------------------------------------------------------------
# Clipped value loss
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, old_value, ret, expected_loss, clipped, expected_grad",
    [
        # V = 2, V_old = 1, c = 0.2 -> V_clip = 1.2; R = 0: (2 - 0)^2 = 4 > (1.2 - 0)^2 = 1.44 -> 0.5 * 4 = 2,
        # unclipped branch active, dL/dV = V - R = 2
        (2.0, 1.0, 0.0, 2.0, False, 2.0),
        # R = 3: (2 - 3)^2 = 1 < (1.2 - 3)^2 = 3.24 -> 0.5 * 3.24 = 1.62, clipped branch, dL/dV = 0
        (2.0, 1.0, 3.0, 1.62, True, 0.0),
        # V = 1.1 inside [0.8, 1.2]: both branches (1.1 - 0)^2 = 1.21 -> 0.605, dL/dV = 1.1
        (1.1, 1.0, 0.0, 0.605, False, 1.1),
    ],
)
def test_clipped_value_loss_by_hand(value, old_value, ret, expected_loss, clipped, expected_grad):
    values = t([[value]], requires_grad=True)
    out = clipped_value_loss(values, t([[old_value]]), t([[ret]]), cliprange_value=0.2)
    assert out.per_token_loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert bool(out.is_clipped.item()) is clipped
    out.per_token_loss.sum().backward()
    assert values.grad.item() == pytest.approx(expected_grad, abs=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------------------
LOSS_2x3 = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
MASK_2x3 = [[1, 1, 0], [1, 0, 0]]  # 3 counted tokens, 2 sequences


@pytest.mark.parametrize(
    "loss_type, num_micro_batches, expected",
    [
        ("dapo", 1, 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("grpo", 1, 2.75),  # row means (1 + 2) / 2 = 1.5 and 4 / 1 = 4, (1.5 + 4) / 2 sequences
        ("dr_grpo", 1, 7 / 6),  # (1 + 2 + 4) / (2 sequences * response_length 3)
        ("bnpo", 1, 7 / 3),  # micro-batch token mean 7 / 3, one micro-batch
        ("bnpo", 2, 7 / 6),  # 7 / 3 / 2 micro-batches
    ],
)
def test_aggregate_rl_loss_by_hand(loss_type, num_micro_batches, expected):
    loss = aggregate_rl_loss(
        t(LOSS_2x3),
        t(MASK_2x3),
        loss_type,
        num_tokens=3,
        num_sequences=2,
        response_length=3,
        num_micro_batches=num_micro_batches,
    )
    assert loss.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "loss_type, expected",
    [
        ("dapo", 1.5),  # (1 + 2) / 2 tokens
        ("grpo", 1.5),  # row mean 1.5 + empty row 0, / 1 sequence with tokens
        ("dr_grpo", 1.0),  # 3 / (1 * 3)
        ("bnpo", 1.5),  # token mean 3 / 2
    ],
)
def test_aggregate_rl_loss_fully_masked_row_contributes_zero(loss_type, expected):
    per_token = t([[1.0, 2.0, NAN], [NAN, math.inf, -math.inf]], requires_grad=True)
    mask = t([[1, 1, 0], [0, 0, 0]])
    loss = aggregate_rl_loss(per_token, mask, loss_type, num_tokens=2, num_sequences=1, response_length=3)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.backward()
    assert torch.isfinite(per_token.grad).all()
    assert per_token.grad[1].abs().sum().item() == 0.0


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
def test_aggregate_rl_loss_fully_masked_batch_is_exactly_zero(loss_type):
    # realistic padding: finite current log-probs against zero old log-probs, everything masked
    logps = t([[-3.0, -20.0, -0.1], [-1.0, -2.0, -50.0]], requires_grad=True)
    policy = clipped_policy_loss(logps, torch.zeros_like(logps), t([[1.0], [-1.0]]), cliprange=0.2)
    mask = torch.zeros(2, 3, dtype=torch.float64)
    loss = aggregate_rl_loss(
        policy.per_token_loss,
        mask,
        loss_type,
        num_tokens=0,
        num_sequences=0,
        response_length=3,
        num_micro_batches=0,
    )
    assert loss.item() == 0.0
    assert not torch.isnan(loss)
    loss.backward()
    assert torch.isfinite(logps.grad).all()
    assert logps.grad.abs().sum().item() == 0.0


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_aggregate_rl_loss_global_normalisers_make_micro_batches_add_up(loss_type):
    # 4 rows split into 2 micro-batches of 2 rows with global counts == the whole batch at once
    loss = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.0, 1.0, 2.0]])
    mask = t([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]])
    kwargs = dict(num_tokens=6, num_sequences=3, response_length=3)
    whole = aggregate_rl_loss(loss, mask, loss_type, **kwargs)
    parts = aggregate_rl_loss(loss[:2], mask[:2], loss_type, **kwargs) + aggregate_rl_loss(
        loss[2:], mask[2:], loss_type, **kwargs
    )
    torch.testing.assert_close(parts, whole)


def test_aggregate_rl_loss_unknown_type_raises():
    with pytest.raises(ValueError, match="sapo"):
        aggregate_rl_loss(t(LOSS_2x3), t(MASK_2x3), "sapo", 3, 2, 3)


# ---------------------------------------------------------------------------------------------------------------------
# SFT weights
# ---------------------------------------------------------------------------------------------------------------------
def test_sft_token_weights_trust_region_by_hand():
    logps = t([[math.log(0.05), math.log(0.5), math.log(0.1), math.log(0.01)]], requires_grad=True)
    weights = sft_token_weights(logps, "trust_region", alpha=0.1)
    # min(1, p / alpha): 0.05 / 0.1 = 0.5; 0.5 / 0.1 = 5 -> 1; 0.1 / 0.1 = 1; 0.01 / 0.1 = 0.1
    torch.testing.assert_close(weights, t([[0.5, 1.0, 1.0, 0.1]]))
    assert not weights.requires_grad  # detached: the weight is a constant of the loss


def test_sft_token_weights_nll_is_none_and_unknown_raises():
    assert sft_token_weights(t([[-1.0]]), "nll") is None
    with pytest.raises(ValueError, match="dft"):
        sft_token_weights(t([[-1.0]]), "dft")


# ---------------------------------------------------------------------------------------------------------------------
# Rewards and advantages
# ---------------------------------------------------------------------------------------------------------------------
def test_last_token_index():
    mask = t([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [1, 0, 2, 3]


def test_per_token_rewards_by_hand():
    scores = t([2.0, 3.0, 7.0])
    kl = t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.1, 0.1, 0.1]])
    mask = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    rewards, non_score = per_token_rewards(scores, kl, mask, kl_coef=0.5)
    # non-score: -0.5 * kl on counted tokens, 0 elsewhere
    expected_non_score = t([[-0.05, -0.1, 0.0], [-0.2, -0.25, -0.3], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(non_score, expected_non_score)
    # score on the last counted token: row 0 index 1 (-0.1 + 2 = 1.9), row 1 index 2 (-0.3 + 3 = 2.7);
    # an empty row gets no score at all
    torch.testing.assert_close(rewards, t([[-0.05, 1.9, 0.0], [-0.2, -0.25, 2.7], [0.0, 0.0, 0.0]]))


def test_per_token_rewards_position_comes_from_mask_not_token_ids():
    # pad id == EOS id (2). Row 0 stopped with EOS at index 1; row 1 was truncated (no EOS) and padded with "EOS".
    eos = 2
    completion_ids = torch.tensor([[5, eos, eos, eos], [5, 6, 7, eos]])
    lengths = torch.tensor([2, 3])  # real tokens, known from generation, not from the ids
    mask = (torch.arange(4).unsqueeze(0) < lengths.unsqueeze(1)).double()
    rewards, _ = per_token_rewards(t([1.0, 1.0]), torch.zeros(2, 4, dtype=torch.float64), mask, kl_coef=0.1)
    assert rewards.nonzero().tolist() == [[0, 1], [1, 2]]
    # an id-based rule ("last EOS" / "first pad") would put row 1's score at index 3 and row 0's at index 3 or 1
    last_eos = [int((row == eos).nonzero().max()) for row in completion_ids]
    assert last_eos == [3, 3]
    assert rewards[0, 3] == 0 and rewards[1, 3] == 0


def test_gae_by_hand_lambda_one():
    # rewards [0, 0, 1], values 0.5, gamma = lam = 1:
    # t=2: delta = 1 + 0 - 0.5 = 0.5, A = 0.5; t=1: delta = 0 + 0.5 - 0.5 = 0, A = 0.5; t=0: A = 0.5
    adv, ret = gae_advantages(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.5, 0.5]]), t([[1, 1, 1]]), gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, t([[0.5, 0.5, 0.5]]))
    torch.testing.assert_close(ret, t([[1.0, 1.0, 1.0]]))  # returns = A + V = 1 (the Monte-Carlo return)


def test_gae_by_hand_lambda_half():
    # deltas as above [0, 0, 0.5]; A2 = 0.5, A1 = 0 + 0.5 * 0.5 = 0.25, A0 = 0 + 0.5 * 0.25 = 0.125
    adv, ret = gae_advantages(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.5, 0.5]]), t([[1, 1, 1]]), gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, t([[0.125, 0.25, 0.5]]))
    torch.testing.assert_close(ret, t([[0.625, 0.75, 1.0]]))


def test_gae_discount_with_zero_values():
    # V = 0, gamma = 0.9, lam = 1: A_t = 0.9^(2 - t) * 1
    adv, _ = gae_advantages(t([[0.0, 0.0, 1.0]]), t([[0.0, 0.0, 0.0]]), t([[1, 1, 1]]), gamma=0.9, lam=1.0)
    torch.testing.assert_close(adv, t([[0.81, 0.9, 1.0]]))


def test_gae_masked_tail_terminates_episode():
    # completion of 2 tokens then padding holding garbage (reward 5, value 9) that must be ignored:
    # t=1: delta = 1 + gamma * 0 (no bootstrap past the end) - 0.5 = 0.5, A1 = 0.5; t=0: delta = 0 + 0.5 - 0.5 = 0,
    # A0 = 0 + 1 * 0.5 = 0.5
    rewards = t([[0.0, 1.0, 5.0, 5.0], [0.0, 1.0, 0.0, 0.0]])
    values = t([[0.5, 0.5, 9.0, 9.0], [0.5, 0.5, 0.0, 0.0]])
    mask = t([[1, 1, 0, 0], [1, 1, 0, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, t([[0.5, 0.5, 0.0, 0.0]] * 2))
    torch.testing.assert_close(ret, t([[1.0, 1.0, 0.0, 0.0]] * 2))


def test_group_relative_advantages_group_scale():
    rewards = t([1.0, 2.0, 3.0, 4.0, 4.0, 4.0])
    adv = group_relative_advantages(rewards, num_generations=3, scale="group")
    # group 1: mean 2, unbiased std sqrt(((-1)^2 + 0 + 1^2) / 2) = 1 -> (r - 2) / (1 + 1e-4)
    # group 2: all equal -> 0 (0 / (0 + 1e-4)), never NaN
    expected = t([-1 / 1.0001, 0.0, 1 / 1.0001, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected)


def test_group_relative_advantages_batch_scale():
    rewards = t([1.0, 2.0, 3.0, 4.0, 4.0, 4.0])
    adv = group_relative_advantages(rewards, num_generations=3, scale="batch")
    # batch mean 3, squared deviations 4 + 1 + 0 + 1 + 1 + 1 = 8, unbiased variance 8 / 5 = 1.6
    std = math.sqrt(1.6)
    expected = t([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]) / (std + 1e-4)  # centred on the *group* mean
    torch.testing.assert_close(adv, expected)


def test_group_relative_advantages_batch_scale_over_the_whole_round():
    """One process's share of a round: the "batch" std is the whole round's (`batch_rewards`), not the share's."""
    share = t([1.0, 2.0, 3.0])
    whole = t([1.0, 2.0, 3.0, 4.0, 4.0, 4.0])
    adv = group_relative_advantages(share, num_generations=3, scale="batch", batch_rewards=whole)
    torch.testing.assert_close(adv, t([-1.0, 0.0, 1.0]) / (math.sqrt(1.6) + 1e-4))
    alone = group_relative_advantages(share, num_generations=3, scale="batch")  # the share's own std is 1
    torch.testing.assert_close(alone, t([-1.0, 0.0, 1.0]) / (1.0 + 1e-4))


def test_group_relative_advantages_no_scaling():
    rewards = t([1.0, 2.0, 6.0, 4.0, 4.0, 4.0])
    # group means 3 and 4
    torch.testing.assert_close(
        group_relative_advantages(rewards, num_generations=3, scale="none"), t([-2.0, -1.0, 3.0, 0.0, 0.0, 0.0])
    )


def test_group_relative_advantages_missing_rewards():
    # a reward function returned None -> NaN. Group 1: valid rewards 1 and 3, mean 2, unbiased std sqrt(2).
    # Group 2: a single valid reward -> 0. Group 3: no valid reward -> all NaN.
    rewards = t([1.0, NAN, 3.0, NAN, 5.0, NAN, NAN, NAN, NAN])
    adv = group_relative_advantages(rewards, num_generations=3, scale="group")
    s = math.sqrt(2.0) + 1e-4
    torch.testing.assert_close(adv, t([-1 / s, NAN, 1 / s, NAN, 0.0, NAN, NAN, NAN, NAN]), equal_nan=True)
    adv_none = group_relative_advantages(rewards, num_generations=3, scale="none")
    torch.testing.assert_close(adv_none, t([-1.0, NAN, 1.0, NAN, 0.0, NAN, NAN, NAN, NAN]), equal_nan=True)


def test_group_relative_advantages_batch_scale_ignores_missing_rewards():
    rewards = t([1.0, 3.0, NAN, 5.0])
    # groups [1, 3] (mean 2) and [NaN, 5] (mean 5); batch std over 1, 3, 5: mean 3, unbiased variance
    # (4 + 0 + 4) / 2 = 4 -> std 2
    adv = group_relative_advantages(rewards, num_generations=2, scale="batch")
    torch.testing.assert_close(adv, t([-1 / 2.0001, 1 / 2.0001, NAN, 0.0]), equal_nan=True)


def test_group_relative_advantages_errors():
    with pytest.raises(ValueError, match="num_generations=4"):
        group_relative_advantages(t([1.0, 2.0, 3.0]), num_generations=4)
    with pytest.raises(ValueError, match="scale_rewards='rank'"):
        group_relative_advantages(t([1.0, 2.0]), num_generations=2, scale="rank")


def test_truncated_is_policy_loss_gradient_is_capped_importance_weight():
    # rho = exp(logp - old): tokens with rho 0.5, 1.0, 3.0; cap 2.0 -> weights 0.5, 1.0, 2.0
    old = torch.log(torch.tensor([[0.4, 0.2, 0.1]]))
    logp = torch.log(torch.tensor([[0.2, 0.2, 0.3]])).requires_grad_(True)
    advantages = torch.tensor([[1.0, -2.0, 0.5]])
    out = truncated_is_policy_loss(logp, old, advantages, cap=2.0)
    loss = out.per_token_loss
    # value: -w * A * logp
    expected = -torch.tensor([[0.5 * 1.0, 1.0 * -2.0, 2.0 * 0.5]]) * logp.detach()
    torch.testing.assert_close(loss, expected)
    loss.sum().backward()
    # gradient w.r.t. log pi is -w * A: the weight is detached (no gradient through rho)
    torch.testing.assert_close(logp.grad, -torch.tensor([[0.5, -2.0, 1.0]]))
    # its statistics describe this loss, not PPO's clip: only the token with rho = 3 > cap was truncated
    assert out.is_clipped.tolist() == [[False, False, True]]
    torch.testing.assert_close(out.ratio, torch.tensor([[0.5, 1.0, 3.0]]))
    torch.testing.assert_close(out.logp_coef, torch.tensor([[0.5, -2.0, 1.0]]))


@pytest.mark.parametrize("rule", ["clip", "truncated_is"])
def test_policy_loss_logp_coef_is_minus_the_gradient_wrt_log_pi(rule):
    """`logp_coef` (what the DARE probe weighs grad log pi with) is -d loss / d log pi of the loss itself, importance
    weights included, for tokens on both sides of the clip range and the cap."""
    g = torch.Generator().manual_seed(0)
    old = -2.0 + 0.6 * torch.randn(3, 8, generator=g)
    logp = (old + 0.4 * torch.randn(3, 8, generator=g)).requires_grad_(True)
    advantages = torch.randn(3, 1, generator=g).expand(3, 8)
    importance = torch.tensor([[0.5], [1.0], [2.0]])
    if rule == "clip":
        out = clipped_policy_loss(logp, old, advantages, cliprange=0.2, importance_weights=importance)
    else:
        out = truncated_is_policy_loss(logp, old, advantages, cap=1.2, importance_weights=importance)
    assert out.is_clipped.any() and not out.is_clipped.all()  # both kinds of tokens are present
    out.per_token_loss.sum().backward()
    torch.testing.assert_close(out.logp_coef, -logp.grad, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# KL estimator x placement: which gradient each combination follows (the table of docs/sampling.md, losses.KL_GRADIENT)
# ---------------------------------------------------------------------------------------------------------------------
def expected_kl_gradients(estimator: str) -> dict[str, torch.Tensor]:
    """Exact on-policy expected gradients w.r.t. the logits theta of a categorical pi = softmax(theta), summing over
    the outcomes with probabilities pi (what the training estimates average to), next to the analytic gradient."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=g, dtype=torch.float64).requires_grad_(True)
    ref_logp = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    pi = logp.exp().detach()
    kl = (logp.exp() * (logp - ref_logp)).sum()  # KL(pi || pi_ref)
    (analytic,) = torch.autograd.grad(kl, theta, retain_graph=True)
    per_outcome = kl_estimate(logp, ref_logp, estimator)  # k(y) for every outcome y, as a function of theta
    # in the loss: E_{y ~ pi}[grad k(y)] (samples are drawn from pi, the gradient flows through k)
    (in_loss,) = torch.autograd.grad((pi * per_outcome).sum(), theta, retain_graph=True)
    # in the reward: REINFORCE with reward -k(y): the loss -A log pi with A = -k(y) detached
    (in_reward,) = torch.autograd.grad((pi * per_outcome.detach() * logp).sum(), theta)
    return {"analytic": analytic, "loss": in_loss, "reward": in_reward}


@pytest.mark.parametrize(
    "estimator, placement, unbiased",
    [
        ("k1", "loss", False),
        ("k2", "loss", True),
        ("k3", "loss", False),
        ("k1", "reward", True),
        ("k2", "reward", False),
        ("k3", "reward", False),
    ],
)
def test_kl_estimator_placement_gradients(estimator, placement, unbiased):
    from trl_trapo.losses import KL_GRADIENT, kl_gradient_warning, resolve_kl_estimator

    grads = expected_kl_gradients(estimator)
    error = float((grads[placement] - grads["analytic"]).norm() / grads["analytic"].norm())
    if unbiased:
        assert error < 1e-9, error
        assert kl_gradient_warning(estimator, placement) is None
        assert resolve_kl_estimator("auto", placement) == estimator
        assert "unbiased" in KL_GRADIENT[(estimator, placement)]
    else:
        assert error > 0.05, error  # a real bias, not rounding
        assert "auto" in kl_gradient_warning(estimator, placement)


@pytest.mark.parametrize("cap", [None, 2.0], ids=["clipped", "truncated-is"])
def test_rl_term_sampling_weights_multiply_the_policy_loss_only(cap):
    from trl_trapo.losses import RLTermCounts, rl_term

    # first use (log pi = log pi_old): ratio 1, policy loss per token -A; dapo over the 3 counted tokens
    logps = t([[-1.0, -2.0, -0.5]], requires_grad=True)
    advantages = t([[1.0, -2.0, 4.0]])
    mask = t([[1.0, 1.0, 0.0]])
    kl = t([[0.3, 0.1, 9.0]])
    weights = t([[2.0, 0.5, 7.0]])  # the sampler/trainer mismatch weights (the third token is off the mask)
    counts = RLTermCounts(tokens=2.0, sequences=1.0, micro_batches=1.0, sampled_tokens=2.0)
    common = dict(
        loss_type="dapo",
        response_length=3,
        cliprange=0.2,
        importance_weights=t([1.0]),
        importance_sampling_cap=cap,
        kl=kl,
        kl_coef_in_loss=0.5,
    )
    out = rl_term(logps, logps.detach(), advantages, mask, counts, sampling_weights=weights, **common)
    plain = rl_term(logps, logps.detach(), advantages, mask, counts, **common)
    # the gradient of the policy part, -A * w / 2 on the counted tokens (the KL here is a constant): -1, 0.5, 0
    (grad,) = torch.autograd.grad(out.loss, logps)
    torch.testing.assert_close(grad, t([[-1.0, 0.5, 0.0]]))
    # what multiplies grad log pi (the DARE probe's signal) carries the weights too: A * w on the counted tokens
    torch.testing.assert_close(out.logp_coef, t([[2.0, -1.0, 0.0]]))
    if cap is None:  # the clipped surrogate's value: (-1 * 2 + 2 * 0.5) / 2 = -0.5; the KL unweighted: 0.5 * 0.4 / 2
        assert out.loss.item() == pytest.approx(-0.5 + 0.1)
        assert plain.loss.item() == pytest.approx((-1.0 + 2.0) / 2 + 0.1)
        assert out.stats["loss/policy_avg"].item() == pytest.approx(-0.5)
