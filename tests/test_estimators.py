# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The weighting strategies beside DARE — uncertainty weighting, GradNorm, GAC-style — against hand-computed cases from
their papers' equations, their state round trips, the probe statistics they read, and a short training run each."""

import json
import math

import pytest
import torch

from trl_trapo.weighting import (
    DARE,
    GACWeighting,
    GradientProbe,
    GradNormWeighting,
    StaticWeighting,
    UncertaintyWeighting,
    build_weighting,
    weighting_name,
)


# ---------------------------------------------------------------------------------------------------------------------
# Uncertainty weighting (Kendall, Gal, Cipolla, CVPR 2018, eq. 7): loss sum_o exp(-s_o) L_o + s_o
# ---------------------------------------------------------------------------------------------------------------------
def losses(pretrain=None, sft=None, rl=None):
    return {"loss/pretrain": pretrain, "loss/sft": sft, "loss/rl": rl}


def test_uncertainty_two_updates_by_hand():
    weighting = UncertaintyWeighting(learning_rate=0.1, betas=(0.9, 0.999), eps=1e-8)
    assert weighting.value() == (1.0, 1.0, 1.0)
    # step 1 (one optimizer step since the start), s = 0: d/ds = 1 - exp(-s) L = 1 - 2 = -1 (pretrain), 1 - 0.5 = 0.5
    # (sft); rl not measured. Adam's first step is lr * m^ / sqrt(v^) = lr * g / |g| = 0.1 * sign(g):
    # s = (0.1, -0.1, 0) -> factors exp(-s) = (0.904837, 1.105171, 1)
    weighting.update(losses(2.0, 0.5, None), step=1)
    assert weighting.log_variances == pytest.approx([0.1, -0.1, 0.0], abs=1e-7)
    assert weighting.value() == pytest.approx((0.904837, 1.105171, 1.0), abs=1e-6)
    # step 2, pretrain: g = 1 - exp(-0.1) * 2 = -0.809675; m = 0.9 * -0.1 + 0.1 * g = -0.170967,
    # v = 0.999 * 0.001 + 0.001 * g^2 = 0.00165457; m^ = m / 0.19 = -0.899830, v^ = v / 0.001999 = 0.827700,
    # step = 0.1 * m^ / sqrt(v^) = -0.098906 -> s = 0.198906, factor exp(-s) = 0.819627
    weighting.update(losses(2.0, None, None), step=2)
    assert weighting.log_variances[0] == pytest.approx(0.198906, abs=1e-5)
    assert weighting.value()[0] == pytest.approx(0.819627, abs=1e-5)
    assert weighting.log_variances[1:] == pytest.approx([-0.1, 0.0], abs=1e-7)  # not measured: unchanged


def test_uncertainty_equals_adam_on_a_log_variance_in_the_loss():
    # the claim of the class docstring: stepping s inside `update` is what the model's optimizer would do with s as a
    # parameter of the loss exp(-s) L + s (L measured, held between updates)
    lr, betas, eps, loss, steps = 0.05, (0.9, 0.999), 1e-8, 3.0, 40
    s = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.Adam([s], lr=lr, betas=betas, eps=eps)
    for _ in range(steps):
        optimizer.zero_grad()
        (torch.exp(-s) * loss + s).backward()
        optimizer.step()
    weighting = UncertaintyWeighting(learning_rate=lr, betas=betas, eps=eps, max_factor=100.0, min_factor=0.01)
    weighting.update(losses(loss, None, None), step=steps)  # one update standing for 40 optimizer steps
    assert weighting.log_variances[0] == pytest.approx(float(s.detach()), abs=1e-5)


def test_uncertainty_reaches_the_papers_fixed_point():
    # d/ds (exp(-s) L + s) = 0 at s* = log L: the factor exp(-s*) = 1 / L
    weighting = UncertaintyWeighting(learning_rate=0.02, min_factor=0.01, max_factor=100.0)
    for step in range(1, 41):
        weighting.update(losses(2.0, 0.5, None), step=step * 100)
    assert weighting.log_variances[:2] == pytest.approx([math.log(2.0), math.log(0.5)], abs=0.02)
    assert weighting.value()[:2] == pytest.approx((0.5, 2.0), rel=0.03)


def test_uncertainty_non_positive_loss_is_bounded_by_max_factor():
    # L = 0 (an RL surrogate): d/ds = 1 everywhere, s falls at lr per step until exp(-s) = max_factor
    weighting = UncertaintyWeighting(learning_rate=0.1, max_factor=2.0)
    weighting.update(losses(None, None, 0.0), step=3)  # three Adam steps of 0.1
    assert weighting.log_variances[2] == pytest.approx(-0.3, abs=1e-6)
    weighting.update(losses(None, None, -0.5), step=100)
    assert weighting.value()[2] == pytest.approx(2.0)


def test_uncertainty_inactive_objective_keeps_factor_one():
    weighting = UncertaintyWeighting(active=(True, True, False), learning_rate=0.1)
    weighting.update(losses(2.0, 2.0, 5.0), step=1)
    assert weighting.value()[2] == 1.0 and weighting.log_variances[2] == 0.0


# ---------------------------------------------------------------------------------------------------------------------
# GradNorm (Chen et al., ICML 2018, eq. 1-2), alpha = 1.5
# ---------------------------------------------------------------------------------------------------------------------
def gradnorm_stats(norms, loss_values):
    names = ("pretrain", "sft", "rl")
    out = {f"grad_norm/{n}": g for n, g in zip(names, norms)}
    out.update({f"loss/{n}": v for n, v in zip(names, loss_values)})
    return out


def test_gradnorm_two_updates_by_hand():
    # betas (0, 0): every Adam step is lr * g / |g| = lr * sign(g), so the steps can be followed by hand
    weighting = GradNormWeighting(alpha=1.5, learning_rate=0.1, betas=(0.0, 0.0), eps=1e-12)
    # update 1: G = (1, 2, 3), the losses are the first ones (L(0) = 4 each) -> L~ = 1, r = 1.
    # G_W = w G = (1, 2, 3), mean 2, targets 2 * 1^1.5 = 2; dL_grad/dw = sign(G_W - target) G = (-1, 0, +3)
    # w = (1.1, 1.0, 0.9) (no step for a zero gradient); sum 3: the renormalisation keeps it
    weighting.update(gradnorm_stats((1.0, 2.0, 3.0), (4.0, 4.0, 4.0)), step=1)
    assert weighting.value() == pytest.approx((1.1, 1.0, 0.9), abs=1e-9)
    assert weighting.initial_losses == [4.0, 4.0, 4.0]
    # update 2: L = (1, 4, 4): L~ = (0.25, 1, 1), mean 0.75 -> r = (1/3, 4/3, 4/3), r^1.5 = (0.19245, 1.53960, 1.53960)
    # G_W = (1.1, 2.0, 2.7), mean 1.93333 -> targets (0.37208, 2.97656, 2.97656); signs (+, -, -)
    # w = (1.0, 1.1, 1.0), sum 3.1 -> times 3 / 3.1 = (0.967742, 1.064516, 0.967742)
    # (pretraining learnt fastest: its loss fell to a quarter, so its weight goes down)
    weighting.update(gradnorm_stats((1.0, 2.0, 3.0), (1.0, 4.0, 4.0)), step=2)
    assert weighting.value() == pytest.approx((0.967742, 1.064516, 0.967742), abs=1e-6)
    assert sum(weighting.value()) == pytest.approx(3.0)


def test_gradnorm_rates_without_a_positive_first_loss_are_one():
    weighting = GradNormWeighting()
    weighting.initial_losses = [4.0, 2.0, 0.0]  # rl: its first loss was 0 (a surrogate): no training rate
    # L~ = (0.5, 2.0, -) -> mean 1.25 -> r = (0.4, 1.6, 1)
    assert weighting.rates([2.0, 4.0, -0.3], [0, 1, 2]) == pytest.approx({0: 0.4, 1: 1.6, 2: 1.0})


def test_gradnorm_needs_two_measured_objectives():
    weighting = GradNormWeighting(learning_rate=0.1)
    weighting.update(gradnorm_stats((1.0, None, None), (4.0, 4.0, None)), step=1)
    assert weighting.value() == (1.0, 1.0, 1.0)
    assert weighting.initial_losses == [4.0, 4.0, None]  # the first losses are kept all the same


def test_gradnorm_renormalises_to_the_number_of_objectives_and_balances():
    # held gradient norms and equal losses: GradNorm pushes w_o G_o to a common value, w ~ 1 / G renormalised to 3
    weighting = GradNormWeighting(learning_rate=0.01)
    for step in range(1, 31):
        weighting.update(gradnorm_stats((1.0, 2.0, 4.0), (4.0, 4.0, 4.0)), step=step * 20)
    weights = weighting.value()
    assert sum(weights) == pytest.approx(3.0)
    expected = [3 * (1 / g) / (1 + 1 / 2 + 1 / 4) for g in (1.0, 2.0, 4.0)]  # (1.714, 0.857, 0.429)
    assert weights == pytest.approx(expected, abs=0.03)


# ---------------------------------------------------------------------------------------------------------------------
# GAC-style closed form: mu* = sigma_r^2 / (sigma_r^2 + sigma_s^2 + Delta^2), EMA, prior, capped updates
# ---------------------------------------------------------------------------------------------------------------------
def gac_stats(sft_noise, rl_noise, disagreement):
    return {"noise/sft": sft_noise, "noise/rl": rl_noise, "disagreement/sft/rl": disagreement, "noise/pretrain": 9.0}


def test_gac_closed_form_prior_and_cap_by_hand():
    weighting = GACWeighting(momentum=0.9, max_change=0.05, prior_weight=0.5)
    assert weighting.value() == (1.0, 1.0, 1.0)  # mu = 1/2: the curriculum's own split
    # sigma_s^2 = 1, sigma_r^2 = 3, Delta^2 = 4 (the first EMA, bias-corrected, is the value itself):
    # mu* = 3 / (3 + 1 + 4) = 0.375; target = 0.5 * 0.375 + 0.5 * 0.5 = 0.4375; capped: mu = 0.5 - 0.05 = 0.45
    # factors: pretrain 1 (static), sft 2 mu = 0.9, rl 2 (1 - mu) = 1.1
    weighting.update(gac_stats(1.0, 3.0, 4.0), step=5)
    assert weighting.closed_form() == pytest.approx(0.375)
    assert weighting.value() == pytest.approx((1.0, 0.9, 1.1))
    # again: mu* and the target unchanged; |0.4375 - 0.45| = 0.0125 < cap -> mu = 0.4375 -> (1, 0.875, 1.125)
    weighting.update(gac_stats(1.0, 3.0, 4.0), step=10)
    assert weighting.value() == pytest.approx((1.0, 0.875, 1.125))


def test_gac_ema_of_the_statistics_by_hand():
    weighting = GACWeighting(momentum=0.9, max_change=1.0, prior_weight=0.0)  # mu = mu* after each update
    weighting.update(gac_stats(1.0, 3.0, 4.0), step=5)
    assert weighting.mu == pytest.approx(0.375)
    # EMA with bias correction after (1, 3, 4) then (3, 1, 4): sft (0.9 * 0.1 + 0.1 * 3) / 0.19 = 0.39 / 0.19 = 2.052632,
    # rl (0.9 * 0.3 + 0.1 * 1) / 0.19 = 1.947368, Delta 4 -> mu* = 1.947368 / 8 = 0.243421
    weighting.update(gac_stats(3.0, 1.0, 4.0), step=10)
    assert weighting.mu == pytest.approx(0.243421, abs=1e-6)
    assert weighting.value() == pytest.approx((1.0, 0.486842, 1.513158), abs=1e-6)


def test_gac_noiseless_zero_rl_gradient_moves_weight_to_rl_and_missing_statistics_do_nothing():
    weighting = GACWeighting(max_change=0.05, prior_weight=0.5)
    weighting.update(gac_stats(1.0, None, None), step=5)  # rl not measured: nothing
    assert weighting.mu == 0.5 and weighting.num_measured == 0
    # every advantage 0: sigma_r^2 = 0 -> mu* = 0 -> target 0.25 -> mu = 0.45
    weighting.update(gac_stats(1.0, 0.0, 2.0), step=10)
    assert weighting.mu == pytest.approx(0.45)


def test_gac_needs_sft_and_rl():
    with pytest.raises(ValueError, match="lack 'sft' or 'rl'"):
        GACWeighting(names=("pretrain", "sft"))
    weighting = GACWeighting(active=(True, True, False))  # no RL data: nothing to mix
    weighting.update(gac_stats(1.0, 3.0, 4.0), step=5)
    assert weighting.value() == (1.0, 1.0, 1.0)


# ---------------------------------------------------------------------------------------------------------------------
# State round trips: JSON, the same factors, the same continuation; corrupted or foreign states refused
# ---------------------------------------------------------------------------------------------------------------------
def build(kind):
    if kind == "uncertainty":
        return UncertaintyWeighting(learning_rate=0.1), lambda k: losses(2.0 + k, 0.5, -0.1)
    if kind == "gradnorm":
        return GradNormWeighting(learning_rate=0.1), lambda k: gradnorm_stats((1.0, 2.0, 3.0), (4.0 - k, 3.0, 1.0))
    return GACWeighting(), lambda k: gac_stats(1.0 + k, 3.0, 4.0)


@pytest.mark.parametrize("kind", ["uncertainty", "gradnorm", "gac"])
def test_state_round_trip_is_json_and_continues_identically(kind):
    original, stats = build(kind)
    original.update(stats(0), step=4)
    original.update(stats(1), step=8)
    state = json.loads(json.dumps(original.state_dict()))
    restored, _ = build(kind)
    restored.load_state_dict(state)
    assert restored.value() == original.value()
    original.update(stats(2), step=12)
    restored.update(stats(2), step=12)
    assert restored.value() == original.value()
    assert restored.state_dict() == original.state_dict()
    assert original.value() != (1.0, 1.0, 1.0)  # it did move


@pytest.mark.parametrize("kind", ["uncertainty", "gradnorm", "gac"])
def test_load_refuses_other_strategies_and_corrupted_states(kind):
    weighting, stats = build(kind)
    weighting.update(stats(0), step=4)
    with pytest.raises(ValueError, match="Cannot load a 'dare'"):
        weighting.load_state_dict({"strategy": "dare", "factors": [1.0, 1.0, 1.0]})
    state = weighting.state_dict()
    with pytest.raises(ValueError, match="objectives"):
        weighting.load_state_dict({**state, "names": ["pretrain", "sft"]})
    key = {"uncertainty": "log_variances", "gradnorm": "weights", "gac": "emas"}[kind]
    with pytest.raises(ValueError, match="Corrupted"):
        weighting.load_state_dict({**state, key: [float("nan")] * len(state[key])})


def test_old_checkpoint_states_still_load():
    # checkpoints written before these strategies hold DARE's or the static state: both still load where they did
    dare_state = {"strategy": "dare", "factors": [1.0, 0.9, 1.1], "signals": [None, None, None]}
    args = make_args(weighting="dare")  # they were written with DARE, the default then (now: static)
    engine = build_weighting(args, (True, True, True), 0.01)
    engine.load_state_dict(dare_state)
    assert engine.value() == (1.0, 0.9, 1.1)
    StaticWeighting().load_state_dict({"strategy": "static"})


# ---------------------------------------------------------------------------------------------------------------------
# Selection from the config
# ---------------------------------------------------------------------------------------------------------------------
def make_args(**overrides):
    from trl_trapo import TRAPOConfig

    return TRAPOConfig(output_dir="/tmp/unused", report_to="none", **overrides)


@pytest.mark.parametrize(
    "overrides, name, kind",
    [
        ({}, "static", "StaticWeighting"),  # the default (issue 42): static weights, every factor 1
        ({"weighting": "dare"}, "dare", "DAREWeighting"),  # DARE stays selectable
        ({"dare_mode": "dynamic"}, "dare", "DAREWeighting"),  # the old switch keeps working
        ({"dare_mode": "static"}, "static", "StaticWeighting"),
        ({"weighting": "static"}, "static", "StaticWeighting"),
        ({"weighting": "static", "dare_mode": "dynamic"}, "static", "StaticWeighting"),  # `weighting` wins when set
        ({"weighting": "dare", "dare_mode": "static"}, "dare", "DAREWeighting"),
        ({"weighting": "uncertainty"}, "uncertainty", "UncertaintyWeighting"),
        ({"weighting": "gradnorm"}, "gradnorm", "GradNormWeighting"),
        ({"weighting": "gac"}, "gac", "GACWeighting"),
        ({"weighting": "gac", "dare_mode": "static"}, "gac", "GACWeighting"),  # `weighting` wins when set
    ],
)
def test_config_selects_the_strategy(overrides, name, kind):
    args = make_args(**overrides)
    assert weighting_name(args) == name
    assert type(build_weighting(args, (True, True, True), 0.01)).__name__ == kind
    assert type(build_weighting(args, (False, False, True), 0.01)).__name__ == "StaticWeighting"  # one objective


def test_config_refuses_an_unknown_weighting():
    with pytest.raises(ValueError, match=r"weighting='gradient_norm' is invalid.*use one of .*'dare'.*'gradnorm'"):
        make_args(weighting="gradient_norm")


def test_strategies_take_the_model_optimizers_rule():
    args = make_args(weighting="uncertainty", learning_rate=3e-4, adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6)
    engine = build_weighting(args, (True, True, True), 0.01)
    assert (engine.optimizer.learning_rate, engine.optimizer.betas, engine.optimizer.eps) == (3e-4, (0.8, 0.99), 1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# GradientProbe.statistics: noise, signal, disagreement in loss units
# ---------------------------------------------------------------------------------------------------------------------
def test_probe_statistics_by_hand():
    probe = GradientProbe(vocab_size=3, hidden_size=2, probe_vocab=64, probe_dim=64)
    probe.counts[:] = torch.tensor([[2.0, 2.0], [1.0, 3.0], [0.0, 4.0]])
    probe.informative[:] = probe.counts
    probe.losses[:] = torch.tensor([4.5, 2.0, 0.0])
    # pretrain (closed-form sums, per-token coefficients): half means a = G_A / 2 = (1, 0, 0, 0, 0, 1),
    # b = G_B / 2 = (1, 0, 0, 0, 0, -1); g = (2a + 2b) / 4 = (1, 0, ..., 0):
    # noise = ||a - b||^2 * 2 * 2 / 4^2 = 4 / 4 = 1, signal <a, b> = 0, norm 1
    probe.sums[0, 0] = torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    probe.sums[0, 1] = torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, -2.0]])
    # sft as a prescaled term (its own logit gradient, already / N = 4): a = G_A * 4 / 1 = (1, 0, ..., 0),
    # b = G_B * 4 / 3 = (1, 0, 0, 0, 0, 1); g = (1 a + 3 b) / 4 = (1, 0, 0, 0, 0, 0.75):
    # noise = ||a - b||^2 * 1 * 3 / 16 = 0.1875, signal 1, norm sqrt(1 + 0.5625) = 1.25
    probe.prescaled[1] = 1.0
    probe.sums[1, 0] = torch.tensor([[0.25, 0.0], [0.0, 0.0], [0.0, 0.0]])
    probe.sums[1, 1] = torch.tensor([[0.75, 0.0], [0.0, 0.0], [0.0, 0.75]])
    stats = probe.statistics()
    assert stats.loss == pytest.approx((4.5, 2.0, 0.0))
    assert stats.noise[:2] == pytest.approx((1.0, 0.1875))
    assert stats.signal[:2] == pytest.approx((0.0, 1.0))
    assert stats.grad_norm[:2] == pytest.approx((1.0, 1.25))
    assert stats.noise[2] is None and stats.grad_norm[2] is None  # rl: one half missing
    # disagreement ||g_pretrain - g_sft||^2 = 0.75^2
    assert stats.disagreement == pytest.approx({(0, 1): 0.5625, (1, 0): 0.5625})
    flat = stats.as_stats(("pretrain", "sft", "rl"))
    assert flat["disagreement/sft/pretrain"] == pytest.approx(0.5625) and flat["agreement/sft"] == pytest.approx(1.0)
    assert flat["loss/rl"] == 0.0 and flat["noise/rl"] is None


def test_probe_statistics_gradient_is_the_mean_loss_gradient():
    # the scale the strategies compare objectives on: g = d(mean NLL)/dW, by autograd
    generator = torch.Generator().manual_seed(0)
    n, hidden_size, vocab = 9, 4, 5
    hidden, weight = (
        torch.randn(n, hidden_size, generator=generator),
        torch.randn(vocab, hidden_size, generator=generator),
    )
    targets = torch.randint(0, vocab, (n,), generator=generator)
    w = weight.clone().requires_grad_(True)
    logits = hidden @ w.T
    torch.nn.functional.cross_entropy(logits, targets).backward()
    probe = GradientProbe(vocab_size=vocab, hidden_size=hidden_size, probe_vocab=64, probe_dim=64)
    half = torch.arange(n) % 2
    probe.accumulate(hidden, logits.detach(), targets, torch.ones(n), torch.zeros(n, dtype=torch.long), half)
    assert probe.statistics().grad_norm[0] == pytest.approx(float(w.grad.norm()), rel=1e-5)


def test_probe_cosines_unchanged_by_the_statistics():
    probe = GradientProbe(vocab_size=3, hidden_size=2, probe_vocab=64, probe_dim=64)
    probe.counts[:] = 1.0
    probe.informative[:] = 1.0
    probe.sums[:, 0] = torch.randn(3, 3, 2, generator=torch.Generator().manual_seed(1))
    probe.sums[:, 1] = torch.randn(3, 3, 2, generator=torch.Generator().manual_seed(2))
    before = probe.cosines()
    probe.statistics()
    assert probe.cosines() == before


def test_dare_feeds_the_statistics_to_the_engine():
    seen = {}

    class Recorder(StaticWeighting):
        def update(self, stats, step):
            seen.update(stats)

    dare = DARE(Recorder(), update_interval=1)
    dare.update([0.5, None, 0.1], step=3, measurements={"loss/sft": 2.0})
    assert seen == {"signal/pretrain": 0.5, "signal/sft": None, "signal/rl": 0.1, "loss/sft": 2.0}


def test_the_default_config_is_static_weights():
    """Issue 42: the default weighting is static (every factor 1); DARE is asked for with `weighting="dare"`."""
    from trl_trapo import TRAPOConfig

    assert TRAPOConfig.__dataclass_fields__["dare_mode"].default == "static"
    assert TRAPOConfig.__dataclass_fields__["weighting"].default is None
    args = make_args()
    assert (args.weighting, args.dare_mode, weighting_name(args)) == (None, "static", "static")


def test_dare_settings_with_static_weights_are_warned_about(caplog):
    """A script tuned for DARE when it was the default (`dare_update_interval=3`, ...) would train with static weights
    without a word: one warning names the settings and the fix, not again for the config's copies; nothing for the
    default config or for a strategy that reads them."""
    import dataclasses
    import logging

    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        config = make_args(dare_update_interval=3, dare_momentum=0.8)
        dataclasses.replace(config, max_steps=3)  # the trainer's and the job's copies
    found = [r.getMessage() for r in caplog.records if "dare_" in r.getMessage()]
    assert found == [
        "dare_momentum=0.8, dare_update_interval=3 are set but TRAPOConfig.weighting='dare' (or another adaptive "
        "strategy) is not: they are ignored (the weighting is static: every factor stays 1; TRAPOConfig's default was "
        "DARE before this release). Set weighting='dare' (--weighting dare) to weigh the objectives with DARE using "
        "them, or drop them."
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        make_args()
        make_args(dare_momentum=0.9)  # an explicit default: not given
        make_args(weighting="dare", dare_update_interval=3)
        make_args(dare_mode="dynamic", dare_min_factor=0.5)
        make_args(weighting="gac", dare_momentum=0.8)
    assert "dare_" not in caplog.text, caplog.text


@pytest.mark.parametrize("weighting", [None, "dare"])
def test_a_default_run_measures_nothing_and_dare_still_does(weighting, tmp_path, tokenizer, suite, tiny_trainer):
    """The default run (static weights) never runs DARE's probe: no `dare/signal/*` in its logs, every factor 1 and
    its weights the curriculum's shares; `weighting="dare"` measures and logs the signals, and its factors move."""
    chosen = {} if weighting is None else {"weighting": weighting}
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=4, dare_update_interval=1, **chosen)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "weight/rl" in entry]
    assert len(logs) == 4
    signals = [key for entry in logs for key in entry if key.startswith("dare/signal/")]
    factors = [entry[f"dare/factor/{name}"] for entry in logs for name in ("pretrain", "sft", "rl")]
    if weighting is None:
        assert not trainer.dare.dynamic and type(trainer.dare.engine).__name__ == "StaticWeighting"
        assert signals == [], signals
        assert factors == [1.0] * len(factors), factors
        multipliers = {name: getattr(trainer.args, f"{name}_weight") for name in ("pretrain", "sft", "rl")}
        assert multipliers == {"pretrain": 1.0, "sft": 2.0, "rl": 2.0}  # the searched mixture (issue 42's rule 1)
        for entry in logs:  # the loss weights are the curriculum's shares times the static multipliers, normalised
            total = sum(multipliers[name] * entry[f"curriculum/{name}"] for name in multipliers)
            for name in multipliers:
                expected = multipliers[name] * entry[f"curriculum/{name}"] / total
                assert entry[f"weight/{name}"] == pytest.approx(expected, rel=1e-6), entry
    else:
        assert trainer.dare.dynamic and type(trainer.dare.engine).__name__ == "DAREWeighting"
        # RL's few rows (10 % of 8 early on) seldom fill both halves of the probe: pretraining's and SFT's suffice
        assert {"dare/signal/pretrain", "dare/signal/sft"} <= set(signals), signals
        assert any(f != 1.0 for f in factors), factors


# ---------------------------------------------------------------------------------------------------------------------
# 20 training steps per strategy: the factors move, the run finishes, the checkpointed state is the strategy's
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weighting", ["uncertainty", "gradnorm", "gac"])
def test_training_smoke(weighting, tmp_path, tokenizer, suite, tiny_trainer):
    trainer = tiny_trainer(
        tmp_path, tokenizer, suite, max_steps=20, weighting=weighting, logging_steps=5, learning_rate=1e-2
    )
    trainer.train()
    engine = trainer.dare.engine
    assert type(engine).__name__.lower().startswith(weighting[:3])
    factors = engine.value()
    assert all(math.isfinite(f) and f > 0 for f in factors)
    assert factors != (1.0, 1.0, 1.0), f"{weighting}: the factors never moved in 20 steps"
    state = json.loads(json.dumps(engine.state_dict()))
    assert state["strategy"] == weighting
    logged = [entry for entry in trainer.state.log_history if "dare/factor/sft" in entry]
    assert logged and logged[-1]["dare/factor/sft"] == pytest.approx(factors[1])
    if weighting != "gac":  # the losses the strategies read are the logged ones: positive NLLs for pretrain and SFT
        measured = engine.losses if weighting == "uncertainty" else engine.initial_losses
        assert measured[0] > 0 and measured[1] > 0
