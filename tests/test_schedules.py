"""Hyper-parameter schedules: adaptive KL controller (hand-worked values), phase switches of the learning rate and
entropy coefficient in a real run, and the controller's state surviving a checkpoint."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import TrainerCallback

from trl_trapo import TRAPOConfig
from trl_trapo.controllers import AdaptiveKLController, FixedKLController
from trl_trapo.schedules import PhaseValues
from trl_trapo.tasks import make_task_suite


# ---------------------------------------------------------------------------------------------------------------------
# Pure pieces
# ---------------------------------------------------------------------------------------------------------------------
def test_adaptive_kl_hand_worked():
    ctl = AdaptiveKLController(0.2, target=6.0, horizon=10_000)
    ctl.update(
        {"kl": 9.0, "num_rollouts": 1000}, 0
    )  # error clip(9/6 - 1 = 0.5) = 0.2 -> x (1 + 0.2 * 1000 / 10000) = x 1.02
    assert ctl.value() == pytest.approx(0.204)
    ctl.update({"kl": 3.0, "num_rollouts": 2000}, 0)  # error clip(-0.5) = -0.2 -> x (1 - 0.2 * 0.2) = x 0.96
    assert ctl.value() == pytest.approx(0.204 * 0.96)
    ctl.update({"kl": 6.6, "num_rollouts": 5000}, 0)  # error 0.1 (inside the clip) -> x (1 + 0.1 * 0.5) = x 1.05
    assert ctl.value() == pytest.approx(0.204 * 0.96 * 1.05)
    value = ctl.value()
    ctl.update({"kl": float("nan"), "num_rollouts": 100}, 0)  # no information: unchanged
    ctl.update({"kl": 9.0, "num_rollouts": 0}, 0)
    assert ctl.value() == value


def test_adaptive_kl_stays_in_range_and_round_trips():
    ctl = AdaptiveKLController(0.3, target=1.0, horizon=10, kl_range=(0.1, 0.3))
    for _ in range(5):
        ctl.update(
            {"kl": 100.0, "num_rollouts": 10}, 0
        )  # far above the target: wants to grow, held at the upper bound
    assert ctl.value() == 0.3
    for _ in range(50):
        ctl.update({"kl": 0.0, "num_rollouts": 10}, 0)  # x 0.8 each time, held at the lower bound
    assert ctl.value() == 0.1
    restored = AdaptiveKLController(0.2, target=1.0, horizon=10, kl_range=(0.1, 0.3))
    restored.load_state_dict(ctl.state_dict())
    assert restored.value() == ctl.value()
    fixed = FixedKLController(0.05)
    fixed.update({"kl": 100.0, "num_rollouts": 1000}, 0)
    assert fixed.value() == 0.05


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(init_kl_coef=0.0, target=1.0, horizon=1.0),
        dict(init_kl_coef=0.1, target=1.0, horizon=1.0, kl_range=(0.3, 0.1)),
    ],
)
def test_adaptive_kl_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        AdaptiveKLController(**kwargs)


def test_phase_values():
    phases = PhaseValues(8.0, 5e-5, rl_phase_learning_rate=3e-5, entropy_coef=0.01, late_entropy_coef=0.005)
    assert [phases.lr_scale(s) for s in (0, 7, 8, 20)] == [1.0, 1.0, pytest.approx(0.6), pytest.approx(0.6)]
    assert [phases.entropy(s) for s in (7, 8)] == [0.01, 0.005]
    assert PhaseValues(None, 5e-5, 3e-5).lr_scale(100) == 1.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(kl_coef_range=[0.1, 0.3]), "set kl_target too"),
        (dict(kl_target=6.0, kl_coef=0.5, kl_coef_range=[0.1, 0.3]), "choose it within"),
        (dict(kl_target=6.0, kl_coef=0.0), "set kl_coef > 0"),
        (dict(kl_target=-1.0), "positive per-sequence KL"),
        (dict(rl_phase_learning_rate=0.0), "positive learning rate"),
        (dict(late_entropy_coef=-0.1), "value >= 0"),
        (
            dict(rl_phase_learning_rate=1e-5, curriculum_boundaries=[], curriculum_mixtures=[0.3, 0.3, 0.4]),
            "last phase",
        ),
    ],
)
def test_config_validation(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", **overrides)


# ---------------------------------------------------------------------------------------------------------------------
# In a real run
# ---------------------------------------------------------------------------------------------------------------------
class Recorder(TrainerCallback):
    """The learning rate and coefficients each optimizer step actually used (read just before `optimizer.step`); the
    coefficients in use live in the trainer's schedules, never in its config."""

    def __init__(self, trainer):
        self.rows = []
        self.schedules = trainer.schedules

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        step = state.global_step
        self.rows.append(
            (step, optimizer.param_groups[0]["lr"], self.schedules.entropy_coef(step), self.schedules.kl_coef())
        )
        return control


@pytest.fixture(scope="module")
def suite():
    return make_task_suite(seed=0, num_pretrain_docs=40, num_sft_per_task=10, num_rl_per_task=10, num_eval_per_task=2)


@pytest.fixture
def make_trainer(tiny_trainer, tokenizer, suite):
    """Factory: the tiny trainer for 10 steps, constant learning rate, KL 0.2, entropy 0.01 (then `overrides`)."""

    def make(tmp_path, **overrides):
        overrides = {
            "max_steps": 10,
            "lr_scheduler_type": "constant",
            "kl_coef": 0.2,
            "entropy_coef": 0.01,
            **overrides,
        }
        return tiny_trainer(tmp_path, tokenizer, suite, **overrides)

    return make


def test_learning_rate_and_entropy_switch_at_the_last_phase(tmp_path, make_trainer):
    trainer = make_trainer(tmp_path, rl_phase_learning_rate=4e-4, late_entropy_coef=0.005)
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    late = trainer.curriculum.boundary_steps[-1]  # 0.8 * 10 = step 8
    assert late == 8
    for step, lr, entropy, _ in recorder.rows:
        assert lr == pytest.approx(4e-4 if step >= late else 1e-3), step
        assert entropy == (0.005 if step >= late else 0.01), step
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["schedule/lr_scale"] for h in logs][-1] == pytest.approx(0.4)
    assert logs[-1]["schedule/entropy_coef"] == 0.005


def test_learning_rate_switch_keeps_the_scheduler_shape(tmp_path, make_trainer):
    trainer = make_trainer(
        tmp_path, rl_phase_learning_rate=5e-4, lr_scheduler_type="cosine", warmup_steps=0, learning_rate=1e-3
    )
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    for step, lr, _, _ in recorder.rows:
        cosine = 0.5 * (1 + math.cos(math.pi * step / 10))
        assert lr == pytest.approx((5e-4 if step >= 8 else 1e-3) * cosine, rel=1e-6), step


def test_logged_lr_is_the_rate_each_logged_step_used(tmp_path, make_trainer):
    """`lr` (TRL 1.12's name) and the Trainer's `learning_rate` are one value: the rate the logged step used. `lr`
    was read from the scheduler after it stepped (the next step's rate): 5e-06 next to 0 at step 1 of a warm-up."""
    trainer = make_trainer(
        tmp_path, lr_scheduler_type="linear", warmup_steps=3, rl_phase_learning_rate=5e-4, learning_rate=1e-3
    )
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    used = {step + 1: lr for step, lr, _, _ in recorder.rows}  # logs carry the step count after the step
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logs] == list(range(1, 11))
    assert logs[0]["learning_rate"] == 0.0  # linear warm-up from 0
    for h in logs:
        assert h["lr"] == h["learning_rate"] == pytest.approx(used[h["step"]], abs=1e-12), h["step"]


def test_adaptive_kl_follows_the_controller_and_survives_a_checkpoint(tmp_path, make_trainer):
    # the target is far above any measured KL, so every update multiplies by 1 - 0.2 * n / horizon
    trainer = make_trainer(
        tmp_path,
        kl_target=1e6,
        kl_horizon=40,
        kl_coef_range=[0.1, 0.3],
        save_strategy="steps",
        save_steps=5,
    )
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    expected, episodes = 0.2, 0.0
    for log in logs:
        new_rollouts = log["episode"] - episodes
        episodes = log["episode"]
        expected = max(expected * (1 - 0.2 * new_rollouts / 40), 0.1)
        assert log["schedule/kl_coef"] == pytest.approx(expected, rel=1e-9), log["step"]
    assert logs[-1]["schedule/kl_coef"] < 0.2
    # the loss of step s uses the coefficient after step s - 1's update
    used = {step: kl for step, _, _, kl in recorder.rows}
    assert used[0] == 0.2
    for log in logs[:-1]:
        assert used[log["step"]] == pytest.approx(log["schedule/kl_coef"])
    # a resumed trainer starts from the checkpointed coefficient, not from kl_coef
    at_5 = next(h["schedule/kl_coef"] for h in logs if h["step"] == 5)
    resumed = make_trainer(tmp_path, kl_target=1e6, kl_horizon=40, kl_coef_range=[0.1, 0.3])
    resumed.run_state.load(str(tmp_path / "checkpoint-5"))
    assert resumed.schedules.kl_coef() == pytest.approx(at_5)
    assert resumed.schedules.kl.value() == pytest.approx(at_5)
    assert resumed.args.kl_coef == trainer.args.kl_coef == 0.2  # the config is never changed


def test_schedules_off_by_default_change_nothing(tmp_path, make_trainer):
    trainer = make_trainer(tmp_path, max_steps=3)
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    assert {(lr, entropy, kl) for _, lr, entropy, kl in recorder.rows} == {(1e-3, 0.01, 0.2)}
    assert not any(k.startswith("schedule/") for h in trainer.state.log_history for k in h)
    assert torch.is_tensor(trainer.schedules.window)
