# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The curriculum schedule: phases, exponential transitions, renormalisation, the constant ablation, errors."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_trapo.curriculum import CurriculumSchedule


# the source document's schedule: 70/20/10 for the first 20 %, 30/50/20 until 80 %, then 10/30/60
BOUNDARIES = (0.2, 0.8)
M0, M1, M2 = (0.7, 0.2, 0.1), (0.3, 0.5, 0.2), (0.1, 0.3, 0.6)
MIXTURES = (M0, M1, M2)


def default_schedule(total_steps=1000, decay_steps=0.05, **kwargs):
    return CurriculumSchedule(BOUNDARIES, MIXTURES, total_steps=total_steps, decay_steps=decay_steps, **kwargs)


def blend(previous, target, ramp):
    return tuple(p + (q - p) * ramp for p, q in zip(previous, target))


def assert_mixture(actual, expected, abs_tol=1e-12):
    assert len(actual) == 3
    for a, e in zip(actual, expected):
        assert a == pytest.approx(e, abs=abs_tol)


def test_step_zero_is_first_target_and_first_phase_is_flat():
    schedule = default_schedule()
    assert schedule.mixture(0) == pytest.approx(M0, abs=1e-12)
    assert schedule.mixture(199) == pytest.approx(M0, abs=1e-12)  # the first phase starts *at* its target


def test_default_decay_is_a_fraction_of_total_steps():
    # decay_steps = 0.05 < 1 -> tau = 0.05 * 1000 = 50 steps; boundaries 0.2 * 1000 = 200 and 0.8 * 1000 = 800
    schedule = default_schedule()
    assert schedule.tau == 50.0
    assert schedule.boundary_steps == [200.0, 800.0]
    # a value >= 1 is in steps: decay_steps=50 gives the same schedule
    same = default_schedule(decay_steps=50)
    for step in (0, 210, 250, 790, 850, 999):
        assert same.mixture(step) == pytest.approx(schedule.mixture(step), abs=1e-12)


def test_decay_steps_one_is_one_step_not_the_whole_run():
    schedule = default_schedule(decay_steps=1)
    assert schedule.tau == 1.0
    # one step after the boundary: ramp 1 - e^-1 = 0.632121
    assert_mixture(schedule.mixture(201), blend(M0, M1, 1 - math.exp(-1)))


def test_mixture_equals_previous_target_exactly_at_boundaries():
    schedule = default_schedule()
    # at b_1 = 200: ramp = 1 - exp(0) = 0 -> M0 exactly
    assert schedule.mixture(200) == pytest.approx(M0, abs=1e-12)
    assert schedule.phase(199) == 0 and schedule.phase(200) == 1
    # at b_2 = 800 the schedule starts from M1 (the first transition has run 600 = 12 tau steps: e^-12 ~ 6e-6)
    assert_mixture(schedule.mixture(800), M1, abs_tol=1e-5)
    assert schedule.phase(799) == 1 and schedule.phase(800) == 2


def test_mixture_after_boundaries_by_hand():
    schedule = default_schedule()
    ramp = 1 - math.exp(-1)  # one time constant (50 steps) after a boundary: 0.6321206
    # step 250: 0.7 + (0.3 - 0.7) * 0.63212 = 0.447152, 0.2 + 0.3 * 0.63212 = 0.389636, 0.1 + 0.1 * 0.63212 = 0.163212
    assert_mixture(schedule.mixture(250), (0.4471518, 0.3896362, 0.1632121), abs_tol=1e-6)
    assert_mixture(schedule.mixture(250), blend(M0, M1, ramp))
    # step 850: 0.3 - 0.2 * 0.63212 = 0.173576, 0.5 - 0.2 * 0.63212 = 0.373576, 0.2 + 0.4 * 0.63212 = 0.452848
    assert_mixture(schedule.mixture(850), (0.1735759, 0.3735759, 0.4528482), abs_tol=1e-6)
    # long after: step 999 is 199 steps = 3.98 tau after b_2: ramp = 1 - e^-3.98
    late = schedule.mixture(999)
    # the last transition starts from the mixture reached at step 800 (600 steps = 12 tau into the middle phase)
    start = blend(M0, M1, 1 - math.exp(-600 / 50))
    assert_mixture(late, blend(start, M2, 1 - math.exp(-199 / 50)))
    assert max(abs(a - b) for a, b in zip(late, M2)) < 0.4 * math.exp(-3.9)
    # and step 799 (12 tau after b_1) is within 1e-5 of M1
    assert_mixture(schedule.mixture(799), M1, abs_tol=1e-5)


def test_transition_is_monotone_towards_target():
    schedule = default_schedule()
    pretrain = [schedule.mixture(step)[0] for step in range(200, 800)]
    assert all(a > b for a, b in zip(pretrain, pretrain[1:]))  # 0.7 -> 0.3, strictly decreasing
    assert pretrain[-1] > M1[0]


def test_mixture_is_continuous_at_every_boundary_even_with_slow_transitions():
    # tau = 50 steps with phases of 20 / 60 / 20 steps: the first transition reaches only 1 - e^(-59/50) = 69 % of M1
    schedule = default_schedule(total_steps=100, decay_steps=50)
    for boundary in (20, 80):
        before, at = schedule.mixture(boundary - 1), schedule.mixture(boundary)
        # one step of an exponential transition moves a share by at most |m_k - m_{k-1}| / tau <= 0.6 / 50
        assert max(abs(a - b) for a, b in zip(before, at)) < 0.6 / 50


@settings(max_examples=60, deadline=None)
@given(
    step=st.integers(min_value=0, max_value=400),
    active=st.tuples(st.booleans(), st.booleans(), st.booleans()).filter(any),
    mode=st.sampled_from(["phased", "constant"]),
    decay=st.sampled_from([0.01, 0.05, 0.5, 3.0, 30.0]),
)
def test_mixture_always_sums_to_one_and_inactive_objectives_get_zero(step, active, mode, decay):
    schedule = default_schedule(total_steps=300, decay_steps=decay, active=active, mode=mode)
    mix = schedule.mixture(step)
    assert sum(mix) == pytest.approx(1.0, abs=1e-12)
    assert all(x >= 0 for x in mix)
    assert all(x == 0.0 for x, a in zip(mix, active) if not a)


def test_inactive_objective_is_renormalised_by_hand():
    schedule = default_schedule(active=(True, False, True))
    # step 0: (0.7, 0, 0.1) / 0.8 = (0.875, 0, 0.125)
    assert_mixture(schedule.mixture(0), (0.875, 0.0, 0.125))
    # step 250: raw (0.447152, -, 0.163212) / 0.610364
    raw = blend(M0, M1, 1 - math.exp(-1))
    total = raw[0] + raw[2]
    assert_mixture(schedule.mixture(250), (raw[0] / total, 0.0, raw[2] / total))
    only_rl = default_schedule(active=(False, False, True))
    assert only_rl.mixture(0) == (0.0, 0.0, 1.0)


def test_active_objectives_share_equally_when_phase_gives_them_no_mass():
    # only SFT and RL have data, but the first phase is 100 % pretraining
    schedule = CurriculumSchedule((0.5,), ((1.0, 0.0, 0.0), (0.0, 0.25, 0.75)), 10, 1, active=(False, True, True))
    assert schedule.mixture(0) == (0.0, 0.5, 0.5)
    # after the boundary the mass appears and is renormalised: step 6, ramp 1 - e^-1: raw sft 0.25 r, rl 0.75 r
    assert_mixture(schedule.mixture(6), (0.0, 0.25, 0.75))


def test_constant_mode_is_time_average_of_phased_schedule():
    # N = 10, boundaries at steps 2 and 8, tau = 2 steps. Steps 0-1: M0; steps 2-7: M0 + (M1 - M0) r_k with
    # r_k = 1 - e^(-k/2), k = 0..5; the last transition starts from the value reached at step 8,
    # S2 = M0 + (M1 - M0)(1 - q^6); steps 8-9: S2 + (M2 - S2) r_k, k = 0..1.
    q = math.exp(-0.5)
    ramp_sum_6 = 6 - (1 - q**6) / (1 - q)  # sum_{k=0}^{5} r_k = 6 - (1 + q + ... + q^5)
    ramp_sum_2 = 2 - (1 + q)  # r_0 + r_1
    starts = tuple(m0 + (m1 - m0) * (1 - q**6) for m0, m1 in zip(M0, M1))
    expected = tuple(
        (2 * m0 + 6 * m0 + (m1 - m0) * ramp_sum_6 + 2 * s2 + (m2 - s2) * ramp_sum_2) / 10
        for m0, m1, m2, s2 in zip(M0, M1, M2, starts)
    )
    schedule = default_schedule(total_steps=10, decay_steps=2, mode="constant")
    for step in (0, 3, 9, 50):
        assert_mixture(schedule.mixture(step), expected)
    assert sum(expected) == pytest.approx(1.0)


def test_constant_mode_matches_mean_of_phased_mixture():
    # every objective gets the same total number of examples as in the phased run
    phased = default_schedule(total_steps=200, decay_steps=0.05)
    constant = default_schedule(total_steps=200, decay_steps=0.05, mode="constant")
    for i in range(3):
        total = sum(phased.mixture(step)[i] for step in range(200))
        assert constant.mixture(0)[i] * 200 == pytest.approx(total, rel=1e-9)


def test_schedule_metrics():
    callback = default_schedule()
    assert callback.mixture(250) == default_schedule().mixture(250)
    metrics = callback.metrics(850)
    assert set(metrics) == {"curriculum/pretrain", "curriculum/sft", "curriculum/rl", "curriculum/phase"}
    assert metrics["curriculum/phase"] == 2.0
    assert metrics["curriculum/rl"] == pytest.approx(0.4528482, abs=1e-6)
    given_shares = callback.metrics(0, shares=(0.1, 0.2, 0.7))
    assert given_shares["curriculum/sft"] == 0.2 and given_shares["curriculum/phase"] == 0.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mixtures=(M0, M1)), "2 boundaries need 3 mixtures"),
        (dict(active=(False, False, False)), "at least one active objective"),
        (dict(mode="linear"), "curriculum_mode='linear'"),
        (dict(mixtures=((1, 0, 0), (1, 0, 0), (0.5, 0.5, 0)), active=(False, False, True)), "curriculum_mixtures"),
    ],
)
def test_errors(kwargs, match):
    args = dict(boundaries=BOUNDARIES, mixtures=MIXTURES, total_steps=100, decay_steps=0.05)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        CurriculumSchedule(**args)
