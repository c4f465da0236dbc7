# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Config values that no range check of a single field catches: NaN and inf in every float field
(`check_finite_numbers`), and the values transformers' `TrainingArguments` and accelerate's plugins refuse, which reach
the user as one message of ours naming the field (trial 10 of issue 37: TA01, TA03, TA08, TA10, PY34, PY41-PY43)."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from trl_trapo import GRPOConfig, PPOConfig, TRAPOConfig, config


CONFIGS = (TRAPOConfig, PPOConfig, GRPOConfig)
INFINITE_OK = {"max_grad_norm"}
"""The fields where +inf is a setting (config.INFINITE_ALLOWED says what it means)."""


def _has_float(kind) -> bool:
    return kind is float or any(_has_float(a) for a in typing.get_args(kind))


def float_fields(cls) -> list[tuple[str, bool]]:
    """(name, holds a list) of every field of `cls` annotated with `float` (found here, not by the code under test)."""
    hints = typing.get_type_hints(cls)
    return [
        (f.name, "list" in str(hints[f.name])) for f in dataclasses.fields(cls) if f.init and _has_float(hints[f.name])
    ]


def test_the_float_fields_are_found():
    """The generic tests below cover the fields they should: the ones trial 10 found, transformers' and TRAPO's own."""
    names = {name for name, _ in float_fields(TRAPOConfig)}
    assert {"entropy_coef", "kl_coef", "vf_coef", "late_entropy_coef", "beta", "weight_decay"} <= names
    assert {"curriculum_mixtures", "kl_coef_range", "max_grad_norm"} <= names
    assert len(names) > 50


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_every_float_field_refuses_a_non_finite_value_by_name(tmp_path, cls, bad):
    """Every float field (a list's items too) refuses NaN and -inf, and +inf unless it means something there
    (`INFINITE_ALLOWED`), with one message naming the class, the field and the fix: NaN passed every `>= 0` check
    and silently switched the term off (PY41 entropy_coef, PY42 kl_coef, PY34 late_entropy_coef, vf_coef)."""
    problems = {}  # field -> "accepted" or the message that does not name it
    for name, is_list in float_fields(cls):
        if bad == math.inf and name in INFINITE_OK:
            continue
        value = [bad] if is_list else bad
        try:
            cls(output_dir=str(tmp_path), report_to="none", **{name: value})
        except Exception as error:  # noqa: BLE001 - anything but our ValueError naming the field is a problem
            if not (isinstance(error, ValueError) and str(error).startswith(f"{cls.__name__}.{name}=")):
                problems[name] = f"{type(error).__name__}: {error}"
        else:
            problems[name] = "accepted"
    assert problems == {}


@pytest.mark.parametrize("name", sorted(INFINITE_OK))
def test_inf_is_accepted_where_it_is_a_setting(tmp_path, name):
    assert set(config.INFINITE_ALLOWED) == INFINITE_OK
    assert getattr(TRAPOConfig(output_dir=str(tmp_path), report_to="none", **{name: math.inf}), name) == math.inf


def test_max_grad_norm_inf_trains_and_logs_a_finite_gradient_norm(tmp_path, tokenizer, suite, tiny_trainer):
    """inf (INFINITE_ALLOWED) clips nothing and the gradient norm is still computed and logged."""
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=1, max_grad_norm=math.inf)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    assert logged and all(math.isfinite(h["grad_norm"]) and h["grad_norm"] > 0 for h in logged)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_a_negative_weight_decay_is_refused_by_name(tmp_path, cls):
    """TA03: torch's optimizers refuse a negative decay in their constructor, but transformers puts `weight_decay` in
    the parameter groups, where torch does not check it: it trained, pushing the weights away from zero."""
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.weight_decay=-0\.1 is invalid: use a decay >= 0"):
        cls(output_dir=str(tmp_path), report_to="none", weight_decay=-0.1)
    assert cls(output_dir=str(tmp_path), report_to="none", weight_decay=0.01).weight_decay == 0.01
