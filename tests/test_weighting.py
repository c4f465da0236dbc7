# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""DARE: combined weights, factor updates by hand, state round trips, and the closed-form LM-head gradient probe."""

import json
import math

import pytest
import torch

from trl_trapo.weighting import (
    DARE,
    DAREWeighting,
    GradientProbe,
    StaticWeighting,
    combine_weights,
)


def signals(pretrain=None, sft=None, rl=None):
    return {"signal/pretrain": pretrain, "signal/sft": sft, "signal/rl": rl}


# ---------------------------------------------------------------------------------------------------------------------
# combine_weights
# ---------------------------------------------------------------------------------------------------------------------
def test_combine_weights_by_hand():
    # products c * s * f: 1 * 0.5 * 1 = 0.5, 1 * 0.3 * 2 = 0.6, 2 * 0.2 * 0.5 = 0.2; total 1.3
    weights = combine_weights((1.0, 1.0, 2.0), (0.5, 0.3, 0.2), (1.0, 2.0, 0.5))
    assert weights == pytest.approx((0.5 / 1.3, 0.6 / 1.3, 0.2 / 1.3), abs=1e-12)
    assert sum(weights) == pytest.approx(1.0)


def test_combine_weights_zero_static_switches_objective_off():
    # c_sft = 0: products 0.5, 0, 0.25 -> 2/3, 0, 1/3
    assert combine_weights((1.0, 0.0, 1.0), (0.5, 0.3, 0.2), (1.0, 1.0, 1.25)) == pytest.approx((2 / 3, 0.0, 1 / 3))


def test_combine_weights_all_zero():
    assert combine_weights((0.0, 0.0, 0.0), (0.5, 0.3, 0.2), (1.0, 1.0, 1.0)) == (0.0, 0.0, 0.0)


# ---------------------------------------------------------------------------------------------------------------------
# DAREWeighting
# ---------------------------------------------------------------------------------------------------------------------
def test_dare_one_update_by_hand():
    dare = DAREWeighting(noise_floor=0.05)
    assert dare.value() == (1.0, 1.0, 1.0)
    # first measurement: each running mean is the value itself -> target 1 for a signal above the floor;
    # rl: max(-0.3, 0) = 0, mean 0 < floor -> min factor 0.25
    dare.update(signals(0.8, 0.4, -0.3), step=5)
    # f <- 0.9 f + 0.1 t: 1.0, 1.0, 0.9 + 0.025 = 0.925
    assert dare.value() == pytest.approx((1.0, 1.0, 0.925), abs=1e-12)
    assert dare.signals == [0.8, 0.4, -0.3]
    assert dare.num_updates == 1 and dare.last_update_step == 5


def test_dare_several_updates_by_hand():
    dare = DAREWeighting(noise_floor=0.05)
    dare.update(signals(0.8, 0.4, -0.3), step=5)  # (1.0, 1.0, 0.925), see above
    # recent signal = EMA(momentum 0.9) / (1 - 0.9^k) (Adam's bias correction); target = recent / running mean
    ema = [0.1 * 0.8, 0.1 * 0.4, 0.0]
    dare.update(signals(0.2, 0.8, 0.6), step=10)
    ema = [0.9 * ema[0] + 0.1 * 0.2, 0.9 * ema[1] + 0.1 * 0.8, 0.9 * ema[2] + 0.1 * 0.6]
    targets = [ema[0] / 0.19 / 0.5, ema[1] / 0.19 / 0.6, ema[2] / 0.19 / 0.3]  # means (0.8+0.2)/2, (0.4+0.8)/2, 0.6/2
    expected = [0.9 * 1.0 + 0.1 * targets[0], 0.9 * 1.0 + 0.1 * targets[1], 0.9 * 0.925 + 0.1 * targets[2]]
    assert dare.value() == pytest.approx(tuple(expected), abs=1e-12)
    # pretrain (0.8, 0.2): the recent signal sits below the mean -> target below 1
    assert targets[0] == pytest.approx(0.092 / 0.19 / 0.5) and targets[0] < 1
    # a fading signal keeps lowering the factor, gradually: the recent signal decays towards 0
    dare.update(signals(0.0, 0.6, 0.3), step=15)
    target = 0.9 * ema[0] / (1 - 0.9**3) / ((0.8 + 0.2 + 0.0) / 3)
    assert dare.value()[0] == pytest.approx(0.9 * expected[0] + 0.1 * target, abs=1e-12)
    assert dare.value()[0] < expected[0]
    assert dare.num_updates == 3 and dare.last_update_step == 15


def test_dare_sparse_stationary_signal_keeps_a_factor_near_one():
    """Mostly-zero measurements with rare spikes (an RL objective whose rewards vary in few probe batches): the
    factor must not drift to the floor just because single measurements are far from their mean."""
    dare = DAREWeighting(noise_floor=0.05, min_factor=0.25, max_factor=4.0)
    pattern = [1.0] + [0.0] * 9  # mean 0.1, stationary
    factors = []
    for step in range(200):
        dare.update(signals(0.5, 0.5, pattern[step % 10]), step=step)
        factors.append(dare.value()[2])
    late = factors[100:]
    assert 0.8 < sum(late) / len(late) < 1.2
    assert min(late) > 0.5


def test_dare_targets_clipped_to_bounds():
    dare = DAREWeighting(min_factor=0.5, max_factor=2.0, momentum=0.0, noise_floor=0.01)
    dare.update(signals(0.1, 0.1, 0.1), step=1)  # targets 1 (each signal equals its own mean)
    # pretrain: mean (0.1 + 0.9) / 2 = 0.5, target 1.8; sft: mean 0.1, 0.1 / ... target 0.1/0.1 = 1 -> 1;
    # rl: 0.0 -> mean 0.05, target 0 -> clipped to 0.5
    dare.update(signals(0.9, 0.1, 0.0), step=2)  # momentum 0: the factors are the targets
    assert dare.value() == pytest.approx((1.8, 1.0, 0.5))
    dare.update(signals(5.0, 0.1, 0.0), step=3)  # pretrain: mean (0.1 + 0.9 + 5) / 3 = 2, target 2.5 -> 2.0
    assert dare.value()[0] == pytest.approx(2.0)


@pytest.mark.parametrize("missing", [None, float("nan"), float("inf")])
def test_dare_unmeasured_signal_leaves_factor_untouched(missing):
    dare = DAREWeighting(noise_floor=0.05)
    dare.factors = [1.0, 1.7, 1.0]
    dare.update(signals(0.5, missing, 0.25), step=3)  # measured ones: target 1 (first measurement)
    assert dare.value() == pytest.approx((1.0, 1.7, 1.0), abs=1e-12)
    assert dare.signal_counts == [1, 0, 1]


def test_dare_single_active_objective_is_compared_with_its_own_history_only():
    dare = DAREWeighting(active=(False, True, False), momentum=0.0, noise_floor=0.05)
    dare.update(signals(0.1, 0.6, 0.7), step=0)  # signals of inactive objectives are ignored
    assert dare.value() == (1.0, 1.0, 1.0)
    dare.update(signals(0.1, 0.2, 0.7), step=1)  # sft mean 0.4, target 0.5
    assert dare.value() == pytest.approx((1.0, 0.5, 1.0))
    assert dare.signal_counts == [0, 2, 0]


def test_dare_objective_without_signal_falls_to_the_minimum():
    """A constant reward gives signal 0 at every update: the RL factor decays geometrically to the floor."""
    dare = DAREWeighting(noise_floor=0.05)
    for step in range(1, 30):
        dare.update(signals(0.6, 0.5, 0.0), step=step)
    assert dare.value()[2] == pytest.approx(0.25 + 0.75 * 0.9**29, abs=1e-12)
    assert dare.value()[:2] == pytest.approx((1.0, 1.0))


def test_dare_state_round_trip_is_json_and_continues_identically():
    dare = DAREWeighting()
    dare.update(signals(0.8, 0.4, -0.3), step=5)
    dare.update(signals(0.2, None, 0.8), step=10)
    state = json.loads(json.dumps(dare.state_dict()))
    restored = DAREWeighting()
    restored.load_state_dict(state)
    assert restored.value() == dare.value()
    assert restored.signals == dare.signals
    assert (restored.num_updates, restored.last_update_step) == (2, 10)
    for engine in (dare, restored):
        engine.update(signals(0.3, 0.6, 0.1), step=15)
    assert restored.value() == dare.value()


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (lambda s: s.update(strategy="static"), "'static'"),
        (lambda s: s.update(factors=[1.0, 1.0]), "Corrupted DARE state"),
        (lambda s: s.update(factors=[1.0, float("nan"), 1.0]), "Corrupted DARE state"),
        (lambda s: s.update(factors=[1.0, float("inf"), 1.0]), "Corrupted DARE state"),
        (lambda s: s.update(factors=[1.0, "1.0", 1.0]), "Corrupted DARE state"),
    ],
)
def test_dare_load_rejects_corrupted_state(corrupt, match):
    dare = DAREWeighting()
    dare.update(signals(0.8, 0.4, -0.3), step=5)
    state = dare.state_dict()
    corrupt(state)
    fresh = DAREWeighting()
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(state)
    assert fresh.value() == (1.0, 1.0, 1.0)  # nothing half-loaded


def test_static_weighting():
    static = StaticWeighting()
    static.update(signals(0.9, 0.0, 0.1), step=1)
    assert static.value() == (1.0, 1.0, 1.0)
    static.load_state_dict(static.state_dict())
    with pytest.raises(ValueError, match="'dare'"):
        static.load_state_dict(DAREWeighting().state_dict())
    with pytest.raises(ValueError, match="'static'"):
        DAREWeighting().load_state_dict(static.state_dict())


# ---------------------------------------------------------------------------------------------------------------------
# DARE
# ---------------------------------------------------------------------------------------------------------------------
def test_dare_update_steps():
    callback = DARE(DAREWeighting(), update_interval=3)
    assert [s for s in range(10) if callback.is_update_step(s)] == [3, 6, 9]  # never step 0
    assert DARE(DAREWeighting(), update_interval=0).update_interval == 1
    assert [s for s in range(4) if DARE(DAREWeighting(), update_interval=1).is_update_step(s)] == [1, 2, 3]
    static = DARE(StaticWeighting(), update_interval=1)
    assert not static.dynamic
    assert not any(static.is_update_step(s) for s in range(10))


def test_dare_update_and_metrics():
    callback = DARE(DAREWeighting(noise_floor=0.05), update_interval=2)
    callback.update([0.8, 0.4, None], step=2)
    callback.update([0.4, 0.4, None], step=4)
    # pretrain: mean 0.6, recent (0.9 * 0.08 + 0.04) / 0.19, target recent / 0.6
    callback.last_weights = (0.5, 0.3, 0.2)
    metrics = callback.metrics()
    assert metrics["weight/sft"] == 0.3
    assert metrics["dare/factor/pretrain"] == pytest.approx(0.9 + 0.1 * (0.112 / 0.19) / 0.6)
    assert metrics["dare/factor/rl"] == 1.0
    assert metrics["dare/signal/sft"] == 0.4
    assert "dare/signal/rl" not in metrics  # unmeasured


# ---------------------------------------------------------------------------------------------------------------------
# GradientProbe
# ---------------------------------------------------------------------------------------------------------------------
def autograd_lm_head_gradient(hidden, weight, targets, coefficients):
    """dL/dW of L = sum_n c_n * (-log softmax(h_n W^T)[y_n]), by autograd."""
    weight = weight.clone().requires_grad_(True)
    logits = hidden @ weight.T
    nll = -torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (coefficients * nll).sum().backward()
    return weight.grad, logits.detach()


def make_tokens(n=7, hidden_size=5, vocab_size=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, hidden_size, generator=generator)
    weight = torch.randn(vocab_size, hidden_size, generator=generator)
    targets = torch.randint(0, vocab_size, (n,), generator=generator)
    coefficients = torch.randn(n, generator=generator)
    return hidden, weight, targets, coefficients


def test_probe_closed_form_equals_autograd_gradient():
    hidden, weight, targets, coefficients = make_tokens()
    grad, logits = autograd_lm_head_gradient(hidden, weight, targets, coefficients)
    probe = GradientProbe(vocab_size=6, hidden_size=5, probe_vocab=64, probe_dim=64)
    assert probe.rows is None and probe.projection is None
    n = hidden.shape[0]
    # objective SFT (1), half 0; coefficient 1 for NLL -> the sum is +dL/dW of the (weighted) NLL
    probe.accumulate(hidden, logits, targets, coefficients, torch.ones(n, dtype=torch.long), torch.zeros(n))
    torch.testing.assert_close(probe.sums[1, 0], grad, rtol=1e-5, atol=1e-6)
    assert probe.counts.tolist() == [[0, 0], [n, 0], [0, 0]]
    assert probe.sums[0].abs().sum() == 0 and probe.sums[2].abs().sum() == 0 and probe.sums[1, 1].abs().sum() == 0


def test_probe_vocab_subset_and_projection_sketches():
    vocab_size, hidden_size = 12, 8
    hidden, weight, targets, coefficients = make_tokens(n=20, hidden_size=hidden_size, vocab_size=vocab_size, seed=1)
    grad, logits = autograd_lm_head_gradient(hidden, weight, targets, coefficients)
    probe = GradientProbe(vocab_size, hidden_size, probe_vocab=5, probe_dim=3, seed=7)
    assert probe.rows.shape == (5,) and torch.equal(probe.rows, probe.rows.sort().values)
    assert probe.projection.shape == (hidden_size, 3)
    # some targets must fall outside the subset for the test to exercise that path
    assert (~torch.isin(targets, probe.rows)).any() and torch.isin(targets, probe.rows).any()
    n = hidden.shape[0]
    probe.accumulate(hidden, logits, targets, coefficients, torch.full((n,), 2), torch.ones(n, dtype=torch.long))
    # sum_n c_n (p_n - e_y)[S] (h_n R)^T = (dL/dW)[S] @ R
    torch.testing.assert_close(probe.sums[2, 1], grad[probe.rows] @ probe.projection, rtol=1e-5, atol=1e-5)


def test_probe_subset_without_projection():
    hidden, weight, targets, coefficients = make_tokens(n=15, hidden_size=4, vocab_size=10, seed=2)
    grad, logits = autograd_lm_head_gradient(hidden, weight, targets, coefficients)
    probe = GradientProbe(10, 4, probe_vocab=4, probe_dim=16, seed=3)
    assert probe.projection is None
    n = hidden.shape[0]
    probe.accumulate(hidden, logits, targets, coefficients, torch.zeros(n, dtype=torch.long), torch.zeros(n))
    torch.testing.assert_close(probe.sums[0, 0], grad[probe.rows], rtol=1e-5, atol=1e-6)


def test_probe_same_seed_same_sketch():
    a, b = GradientProbe(100, 32, 10, 4, seed=5), GradientProbe(100, 32, 10, 4, seed=5)
    assert torch.equal(a.rows, b.rows) and torch.equal(a.projection, b.projection)
    c = GradientProbe(100, 32, 10, 4, seed=6)
    assert not torch.equal(a.projection, c.projection)


def test_probe_routes_objectives_and_halves_and_accumulates_additively():
    hidden, weight, targets, coefficients = make_tokens(n=12)
    logits = hidden @ weight.T
    objective = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])
    half = torch.tensor([0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1])
    once = GradientProbe(6, 5, 64, 64)
    once.accumulate(hidden, logits, targets, coefficients, objective, half)
    twice = GradientProbe(6, 5, 64, 64)
    twice.accumulate(hidden[:5], logits[:5], targets[:5], coefficients[:5], objective[:5], half[:5])
    twice.accumulate(hidden[5:], logits[5:], targets[5:], coefficients[5:], objective[5:], half[5:])
    torch.testing.assert_close(once.sums, twice.sums)
    assert once.counts.tolist() == [[2, 2]] * 3
    for o in range(3):
        for h in range(2):
            rows = (objective == o) & (half == h)
            grad, _ = autograd_lm_head_gradient(hidden[rows], weight, targets[rows], coefficients[rows])
            torch.testing.assert_close(once.sums[o, h], grad, rtol=1e-5, atol=1e-6)
    once.reset()
    assert once.sums.abs().sum() == 0 and once.counts.sum() == 0
    assert once.cosines() == [None, None, None]


def test_probe_cosines():
    hidden, weight, targets, coefficients = make_tokens(n=6)
    logits = hidden @ weight.T
    n = hidden.shape[0]
    probe = GradientProbe(6, 5, 64, 64)
    # objective 0: the same tokens in both halves -> cosine 1
    for h in (0, 1):
        probe.accumulate(hidden, logits, targets, coefficients, torch.zeros(n, dtype=torch.long), torch.full((n,), h))
    # objective 1: half 0 with hidden states along e_0, half 1 along e_1 -> gradients (p - e_y) h^T orthogonal
    e0, e1 = torch.eye(5)[0].expand(n, 5), torch.eye(5)[1].expand(n, 5)
    ones = torch.ones(n, dtype=torch.long)
    probe.accumulate(e0, logits, targets, coefficients, ones, torch.zeros(n))
    probe.accumulate(e1, logits, targets, coefficients, ones, ones)
    # objective 2: only half 0 has tokens -> None
    probe.accumulate(hidden, logits, targets, coefficients, torch.full((n,), 2), torch.zeros(n))
    cosines = probe.cosines()
    assert cosines[0] == pytest.approx(1.0, abs=1e-6)
    assert cosines[1] == pytest.approx(0.0, abs=1e-6)
    assert cosines[2] is None


def test_probe_opposite_halves_and_zero_coefficients():
    hidden, weight, targets, coefficients = make_tokens(n=6)
    logits = hidden @ weight.T
    n = hidden.shape[0]
    probe = GradientProbe(6, 5, 64, 64)
    zeros = torch.zeros(n, dtype=torch.long)
    probe.accumulate(hidden, logits, targets, coefficients, zeros, zeros)
    probe.accumulate(hidden, logits, targets, -coefficients, zeros, torch.ones(n))  # negated advantages
    # zero coefficients (a constant reward -> zero advantages): halves are counted but the gradient is 0
    probe.accumulate(hidden, logits, targets, torch.zeros(n), torch.full((n,), 2), zeros)
    probe.accumulate(hidden, logits, targets, torch.zeros(n), torch.full((n,), 2), torch.ones(n))
    cosines = probe.cosines()
    assert cosines[0] == pytest.approx(-1.0, abs=1e-6)
    assert cosines[1] is None
    assert cosines[2] == 0.0


def test_probe_ignores_empty_input():
    probe = GradientProbe(6, 5, 64, 64)
    empty = torch.zeros(0, dtype=torch.long)
    probe.accumulate(torch.zeros(0, 5), torch.zeros(0, 6), empty, torch.zeros(0), empty, empty)
    assert probe.counts.sum() == 0


def test_probe_cosine_matches_flattened_autograd_gradients():
    # the signal is the cosine between two halves' gradients: compare with autograd for random halves
    hidden, weight, targets, coefficients = make_tokens(n=16, seed=4)
    logits = hidden @ weight.T
    half = torch.arange(16) % 2
    probe = GradientProbe(6, 5, 64, 64)
    probe.accumulate(hidden, logits, targets, coefficients, torch.ones(16, dtype=torch.long), half)
    g0, _ = autograd_lm_head_gradient(hidden[half == 0], weight, targets[half == 0], coefficients[half == 0])
    g1, _ = autograd_lm_head_gradient(hidden[half == 1], weight, targets[half == 1], coefficients[half == 1])
    expected = torch.nn.functional.cosine_similarity(g0.flatten(), g1.flatten(), dim=0).item()
    assert probe.cosines()[1] == pytest.approx(expected, abs=1e-5)
    assert math.isfinite(expected) and abs(expected) > 1e-3  # a non-trivial case
