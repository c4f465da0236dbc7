# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The weighting settings of `TRAPOConfig` as a user gives them (trial 17's W04b-W17b): a value set after
construction gets the constructor's refusal at the trainer, a refusal names the field the user gave, and a setting
the chosen strategy does not read (or cannot use) is warned about by name."""

from __future__ import annotations

import pytest
from conftest import TINY_CONFIG

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.tasks import build_tiny_model, exact_match_reward


@pytest.mark.parametrize(
    "field, value",
    [
        ("rl_weight", "2"),  # W17: a bare TypeError from data.py before
        ("sft_weight", None),
        ("weighting", "Dare"),
        ("dare_momentum", 1.5),  # W17b: trained, DARE's factors went negative
        ("dare_max_factor", 0.5),  # W17b: no factor could reach 1
    ],
)
def test_a_field_set_after_construction_gets_the_constructors_refusal(tmp_path, tokenizer, suite, field, value):
    with pytest.raises(ValueError) as constructed:
        TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, "weighting": "dare", field: value})
    args = TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, "weighting": "dare"})
    setattr(args, field, value)  # as a TRL script does: `args.rl_weight = ...`, then the trainer
    before = args.to_dict()
    with pytest.raises(ValueError) as built:
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=exact_match_reward,
            args=args,
            train_dataset=suite.rl_train,
            sft_dataset=suite.sft,
            processing_class=tokenizer,
        )
    assert str(built.value) == str(constructed.value)
    assert f"TRAPOConfig.{field}={value!r} is invalid" in str(built.value)
    assert args.to_dict() == before  # the check ran on a copy


def test_check_values_leaves_the_config_unchanged_and_reads_dare_mode_as_it_is_now(tmp_path):
    from trl_trapo.weighting import weighting_name

    args = TRAPOConfig(output_dir=str(tmp_path), report_to="none")
    args.curriculum_mixtures = [[0.5, 0.25, 0.25], [0.2, 0.4, 0.4], [0.1, 0.3, 0.6]]  # triples: _validate flattens
    args.dare_mode = "dynamic"  # weighting=None follows it: DARE, as in the constructor
    args.check_values()
    assert args.curriculum_mixtures == [[0.5, 0.25, 0.25], [0.2, 0.4, 0.4], [0.1, 0.3, 0.6]]
    assert weighting_name(args) == "dare"
    args.dare_mode = "dynamik"
    with pytest.raises(ValueError, match=r"TRAPOConfig\.dare_mode='dynamik' is invalid \(did you mean 'dynamic'\?\)"):
        args.check_values()


@pytest.mark.parametrize(
    "given, needle",
    [
        (dict(dare_max_factor=0.5), "TRAPOConfig.dare_max_factor=0.5 is invalid: use a value >= 1"),
        (dict(dare_min_factor=1.5), "TRAPOConfig.dare_min_factor=1.5 is invalid: use a value in (0, 1]"),
        (dict(dare_min_factor=0.0, dare_max_factor=0.5), "TRAPOConfig.dare_min_factor=0.0 is invalid"),
    ],
)
def test_a_factor_bound_out_of_range_is_refused_by_its_own_name(tmp_path, given, needle):
    """W04b: `dare_max_factor=0.5` was refused as `dare_min_factor=(0.25, 0.5)`, a field the user had not given."""
    with pytest.raises(ValueError) as refused:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", **given)
    assert str(refused.value).startswith(needle), str(refused.value)
    assert "(0.25," not in str(refused.value) and "(0.0, 0.5)" not in str(refused.value)


def weighting_warnings(caplog, **given) -> list[str]:
    """The warnings of `TRAPOConfig(**given)` that name a weighting setting."""
    import logging

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        TRAPOConfig(output_dir="/tmp/unused", report_to="none", **given)
    return [r.getMessage() for r in caplog.records if "dare_" in r.getMessage() or "weighting" in r.getMessage()]


def test_dare_mode_beside_another_weighting_is_warned_about_naming_the_winner(caplog):
    """W04c: `--weighting static --dare_mode dynamic` ran static without a word."""
    found = weighting_warnings(caplog, weighting="static", dare_mode="dynamic")
    assert found == [
        "TRAPOConfig.dare_mode='dynamic' asks for DARE but weighting='static' is set, and weighting wins: the run uses "
        "weighting='static' and dare_mode is ignored. Drop dare_mode (weighting='dare' is what dare_mode='dynamic' "
        "selects), or set weighting='dare' (--weighting dare) for DARE."
    ]
    assert len(weighting_warnings(caplog, weighting="gradnorm", dare_mode="dynamic")) == 1
    assert weighting_warnings(caplog, weighting="dare", dare_mode="dynamic") == []  # the same strategy
    assert weighting_warnings(caplog, dare_mode="dynamic") == []  # weighting=None follows it


@pytest.mark.parametrize(
    "given, ignored, readers",
    [  # W06: each strategy's unread settings (trl_trapo/weighting.py's build_weighting)
        (
            dict(weighting="gradnorm", dare_min_factor=1.0, dare_max_factor=1.0),
            "dare_min_factor=1.0, dare_max_factor=1.0 are",
            "'dare' or 'uncertainty'",
        ),
        (dict(weighting="gac", dare_max_factor=2.0), "dare_max_factor=2.0 is", "'dare' or 'uncertainty'"),
        (dict(weighting="uncertainty", dare_momentum=0.0), "dare_momentum=0.0 is", "'dare' or 'gac'"),
        (dict(weighting="gradnorm", dare_momentum=0.5), "dare_momentum=0.5 is", "'dare' or 'gac'"),
        (dict(weighting="uncertainty", dare_probe_dim=64), "dare_probe_dim=64 is", "'dare' or 'gradnorm' or 'gac'"),
    ],
)
def test_a_dare_setting_the_chosen_strategy_does_not_read_is_warned_about(caplog, given, ignored, readers):
    found = weighting_warnings(caplog, **given)
    assert len(found) == 1, found
    assert found[0].startswith(f"{ignored} set but TRAPOConfig.weighting={readers} is not: "), found[0]
    assert f"(weighting={given['weighting']!r} reads only " in found[0]


@pytest.mark.parametrize(
    "given",
    [
        dict(weighting="dare", dare_momentum=0.5, dare_min_factor=0.5, dare_probe_dim=64, dare_update_interval=2),
        dict(weighting="uncertainty", dare_min_factor=0.5, dare_max_factor=2.0, dare_update_interval=2),
        dict(weighting="gradnorm", dare_probe_vocab=128, dare_update_interval=2),
        dict(weighting="gac", dare_momentum=0.5, dare_probe_dim=64),
    ],
)
def test_the_settings_a_strategy_reads_are_not_warned_about(caplog, given):
    assert weighting_warnings(caplog, max_steps=10, **given) == []


def test_an_update_interval_past_max_steps_is_warned_about(caplog):
    """W13: `--weighting dare --dare_update_interval 100 --max_steps 6` trained with every factor 1, without a word."""
    found = weighting_warnings(caplog, weighting="dare", dare_update_interval=100, max_steps=6)
    assert found == [
        "TRAPOConfig.dare_update_interval=100 is not below max_steps=6: weighting='dare' updates its factors at the "
        "steps k with 0 < k < max_steps that the interval divides, so it never updates and every factor stays 1 "
        "(static weights). Use dare_update_interval <= 5, or None (ceil(sqrt(max_steps)) = 3 steps)."
    ]
    assert len(weighting_warnings(caplog, weighting="gac", dare_update_interval=6, max_steps=6)) == 1
    assert weighting_warnings(caplog, weighting="dare", dare_update_interval=5, max_steps=6) == []  # updates at 5
    assert weighting_warnings(caplog, weighting="dare", dare_update_interval=100) == []  # max_steps not known


def test_a_distillation_weight_without_a_teacher_is_warned_about_by_the_trainer(
    tmp_path, tokenizer, suite, tiny_trainer, caplog
):
    """W04d: `--distillation_weight 5` without a teacher trained the default mixture without a word."""
    import logging

    with caplog.at_level(logging.WARNING, logger="trl_trapo.teacher"):
        tiny_trainer(tmp_path, tokenizer, suite, distillation_weight=5.0)
    assert [r.getMessage() for r in caplog.records if r.name == "trl_trapo.teacher"] == [
        "distillation_weight=5.0 is set but a teacher (`teacher_model` / teacher_model_name_or_path) is not: it is "
        "ignored (no distillation objective is built). Pass teacher_model= to the trainer or set "
        "teacher_model_name_or_path (--teacher_model_name_or_path) to distill with it, or drop it."
    ]


def distillation_trainer(tmp_path, tokenizer, suite, weights, teacher=True, **datasets):
    """A tiny trainer with a teacher (unless `teacher=False`), the datasets given only, and `weights`."""
    from conftest import make_tiny_config

    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=make_tiny_config(tmp_path, max_steps=2, **weights),
        processing_class=tokenizer,
        teacher_model=build_tiny_model(tokenizer, seed=1) if teacher else None,
        **datasets,
    )


def test_distillation_alone_trains_with_the_other_weights_zero(tmp_path, tokenizer, suite):
    """W07 (a): the documented pure on-policy distillation (a teacher and a distillation_dataset) with the other three
    weights set to 0 was refused by the config ("at least one of pretrain_weight, sft_weight, rl_weight")."""
    from datasets import Dataset

    prompts = Dataset.from_dict({"prompt": suite.rl_train["prompt"][:16]})
    zero = dict(pretrain_weight=0.0, sft_weight=0.0, rl_weight=0.0)
    trainer = distillation_trainer(tmp_path, tokenizer, suite, zero, distillation_dataset=prompts)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged and all(entry["weight/distill"] == 1.0 for entry in logged), logged


def test_a_teacher_without_prompts_to_sample_is_refused_saying_which_it_needs(tmp_path, tokenizer, suite):
    """W07 (b): a teacher with RL prompts and rl_weight=0 got "No objective has data: pass ... train_dataset", which
    had been given; the reason is that distillation samples the RL rollouts, which rl_weight=0 switches off."""
    with pytest.raises(ValueError) as refused:
        distillation_trainer(tmp_path, tokenizer, suite, dict(rl_weight=0.0), train_dataset=suite.rl_train)
    text = str(refused.value)
    assert "rl_weight=0.0 switches RL off, and with it the rollouts distillation samples from" in text, text
    assert "Fix: pass a `distillation_dataset` of reward-free prompts (a 'prompt' column) (distillation alone" in text


def test_distillation_alone_without_a_teacher_is_refused_before_anything_loads(tmp_path, tokenizer, suite):
    zero = dict(pretrain_weight=0.0, sft_weight=0.0, rl_weight=0.0)
    with pytest.raises(
        ValueError, match=r"which leaves distillation alone \(distillation_weight=1\.0\), and this run"
    ):
        distillation_trainer(tmp_path, tokenizer, suite, zero, teacher=False, train_dataset=suite.rl_train)
    with pytest.raises(ValueError, match=r"every objective's weight is 0 \(pretrain_weight, sft_weight, rl_weight, "):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", **zero, distillation_weight=0.0)
