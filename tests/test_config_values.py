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
def test_max_grad_norm_none_is_refused_naming_zero_for_no_clipping(tmp_path, cls):
    """N07 (trial 13): `max_grad_norm=None`, a script's "no clipping", was accepted and `train()` died at its first
    optimizer step in transformers (`if self.args.max_grad_norm > 0: TypeError`, naming no field). The command line
    refuses `--max_grad_norm None` (argparse's "invalid float value"); Python now does too, naming the fix."""
    with pytest.raises(
        ValueError,
        match=rf"^{cls.__name__}\.max_grad_norm=None is invalid: it must be a number, not None .*"
        r"write max_grad_norm=0 for no clipping \(the gradient norm is still logged\)",
    ):
        cls(output_dir=str(tmp_path), report_to="none", max_grad_norm=None)


def transformers_number_fields() -> list[str]:
    """transformers' `TrainingArguments` fields annotated a plain int or float (found here from transformers' own
    annotations, not by the code under test): transformers compares or computes with each."""
    from transformers import TrainingArguments

    hints = typing.get_type_hints(TrainingArguments)
    return [f.name for f in dataclasses.fields(TrainingArguments) if f.init and hints[f.name] in (int, float)]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_no_number_field_of_transformers_takes_none(tmp_path, cls):
    """N07's siblings: transformers' number fields took None without a word and failed later with a bare TypeError:
    in training (`weight_decay` in torch's AdamW step, `adam_beta1/2` and `adam_epsilon` in the optimizer, `seed` in
    `torch.manual_seed`, `eval_delay` at the first evaluation) or in `TrainingArguments.__post_init__` (`max_steps`,
    `num_train_epochs`, `gradient_accumulation_steps`, `logging_steps`, `save_steps`, `warmup_steps`, ...). Each is
    now refused by name, except `local_rank` (only parsed, for the old launcher; None there does no harm) and a field
    TRAPO's config redefines to take None (`PPOConfig.logging_steps`: once per PPO update)."""
    names = transformers_number_fields()
    assert {"max_grad_norm", "weight_decay", "adam_beta1", "seed", "eval_delay", "learning_rate"} <= set(names)
    takes_none = {"local_rank"} | ({"logging_steps"} if cls is PPOConfig else set())
    problems = {}  # field -> "accepted" or the message that does not name it
    for name in names:
        try:
            cls(output_dir=str(tmp_path), report_to="none", **{name: None})
        except Exception as error:  # noqa: BLE001 - anything but our ValueError naming the field is a problem
            if name in takes_none or not (
                isinstance(error, ValueError) and str(error).startswith(f"{cls.__name__}.{name}=None is invalid: ")
            ):
                problems[name] = f"{type(error).__name__}: {error}"
        else:
            if name not in takes_none:
                problems[name] = "accepted"
    assert problems == {}


def test_max_grad_norm_zero_trains_and_logs_the_gradient_norm(tmp_path, tokenizer, suite, tiny_trainer):
    """The fix the refusal of None names: 0 trains unclipped, the gradient norm still logged (as the message says)."""
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=1, max_grad_norm=0)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    assert trainer.state.global_step == 1
    assert logged and all(math.isfinite(h["grad_norm"]) and h["grad_norm"] > 0 for h in logged)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_a_negative_weight_decay_is_refused_by_name(tmp_path, cls):
    """TA03: torch's optimizers refuse a negative decay in their constructor, but transformers puts `weight_decay` in
    the parameter groups, where torch does not check it: it trained, pushing the weights away from zero."""
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.weight_decay=-0\.1 is invalid: use a decay >= 0"):
        cls(output_dir=str(tmp_path), report_to="none", weight_decay=-0.1)
    assert cls(output_dir=str(tmp_path), report_to="none", weight_decay=0.01).weight_decay == 0.01


# ---------------------------------------------------------------------------------------------------------------------
# What transformers' TrainingArguments (`__post_init__`, `_validate_args`) and accelerate's plugins refuse
# ---------------------------------------------------------------------------------------------------------------------
REFUSED_BEFORE_TRANSFORMERS = [
    pytest.param(
        dict(tf32=True), r"^TRAPOConfig\.tf32=True, but this machine has no GPU with TF32.*Drop it", id="TA01"
    ),
    pytest.param(
        dict(load_best_model_at_end=True),
        r"^TRAPOConfig\.load_best_model_at_end=True needs an evaluation at every checkpoint.*eval_strategy='no' and "
        r"save_strategy='steps' differ\. Set eval_strategy='steps'.*metric_for_best_model='eval_reward'",
        id="TA08",
    ),
    pytest.param(
        dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=3, save_steps=4),
        r"^TRAPOConfig\.load_best_model_at_end=True .* save_steps=4 is not a multiple of eval_steps=3",
        id="save-not-a-multiple",
    ),
    pytest.param(
        dict(torch_compile=True, torch_compile_backend="nope"),
        r"^TRAPOConfig\.torch_compile_backend='nope' is invalid: use one of 'no', 'eager', 'aot_eager', 'inductor'",
        id="TA10",
    ),
    pytest.param(
        dict(torch_compile_mode="fast"),
        r"^TRAPOConfig\.torch_compile_mode='fast' is invalid: use one of 'default'.*'max-autotune'",
        id="compile-mode",
    ),
    pytest.param(dict(save_steps=2.5), r"^TRAPOConfig\.save_steps=2\.5 is invalid: .* a whole one", id="steps-2.5"),
    pytest.param(
        dict(eval_strategy="steps", logging_strategy="epoch", logging_steps=0),
        r"^TRAPOConfig\.eval_steps=None is invalid here: .* takes logging_steps, which is 0",
        id="eval-steps-from-logging-0",
    ),
    pytest.param(dict(warmup_steps=-1), r"^TRAPOConfig\.warmup_steps=-1 is invalid: use .* >= 0", id="warmup"),
    pytest.param(dict(torch_empty_cache_steps=0), r"^TRAPOConfig\.torch_empty_cache_steps=0 is invalid", id="cache"),
    pytest.param(
        dict(dataloader_prefetch_factor=2),
        r"^TRAPOConfig\.dataloader_prefetch_factor=2 is invalid: TRAPO does not use it",
        id="prefetch",
    ),
    pytest.param(
        dict(dataloader_persistent_workers=True),
        r"^TRAPOConfig\.dataloader_persistent_workers=True is invalid: TRAPO does not use it.* drop it",
        id="TA22-persistent-workers",
    ),
    pytest.param(
        dict(use_cpu=True, bf16=True, fp16_full_eval=True, bf16_full_eval=True),
        r"^TRAPOConfig\.fp16_full_eval=True and bf16_full_eval=True: choose one",
        id="fp16-and-bf16",
    ),
    pytest.param(
        dict(accelerator_config={"bogus": 1}),
        r"^TRAPOConfig\.accelerator_config=\{'bogus': 1\} is invalid: transformers' AcceleratorConfig has no bogus",
        id="accelerator-key",
    ),
    pytest.param(
        dict(accelerator_config="no_such_accelerator_config.json"),
        r"^TRAPOConfig\.accelerator_config='no_such_accelerator_config\.json' is invalid: no such file",
        id="accelerator-file",
    ),
    pytest.param(
        dict(accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True, "bogus": 1}}),
        r"^TRAPOConfig\.accelerator_config\['gradient_accumulation_kwargs'\]=.* GradientAccumulationPlugin has no bogus",
        id="accumulation-key",
    ),
    pytest.param(
        dict(accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 2}}),
        r"^TRAPOConfig\.accelerator_config\['gradient_accumulation_kwargs'\]=.* set gradient_accumulation_steps=2",
        id="accumulation-num-steps",
    ),
]


@pytest.mark.parametrize("settings, message", REFUSED_BEFORE_TRANSFORMERS)
def test_what_transformers_or_accelerate_refuse_is_one_message_naming_the_field(
    tmp_path, monkeypatch, settings, message
):
    """Each value transformers' TrainingArguments or accelerate's plugins refuse (trial 10's TA01 tf32 on the CPU, TA08
    load_best_model_at_end without evaluations, TA10 an unknown compile backend, refused by accelerate only at the
    trainer) is refused at construction, naming the field and the fix, before transformers reads it."""
    if settings.get("tf32"):
        monkeypatch.setattr("transformers.utils.is_torch_tf32_available", lambda: False)  # any machine is a CPU one
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", **settings)


def test_what_no_check_foresaw_in_transformers_is_still_one_message_of_ours(tmp_path, monkeypatch):
    """A ValueError of transformers' `__post_init__` that no check of ours foresaw is quoted in a message naming the
    config class, not shown as transformers' traceback: a real one (an accelerator_config file with an unknown key,
    which transformers names) and any future one (`_validate_args` made to raise)."""
    path = tmp_path / "accelerate.json"
    path.write_text('{"bogus": 1}')
    with pytest.raises(ValueError, match=r"^TRAPOConfig is invalid: transformers' TrainingArguments refused .*bogus"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", accelerator_config=str(path))

    def refuse(args):
        raise ValueError("--made_up requires something")

    monkeypatch.setattr("transformers.TrainingArguments._validate_args", refuse)
    with pytest.raises(
        ValueError,
        match=r"^PPOConfig is invalid: .*«--made_up requires something»\. It names no PPOConfig field: .*unset NAME",
    ) as info:
        PPOConfig(output_dir=str(tmp_path), report_to="none")
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_the_accepted_forms_of_those_settings_still_construct(tmp_path):
    """The checks refuse what transformers / accelerate refuse, nothing they accept."""
    TRAPOConfig(
        output_dir=str(tmp_path),
        report_to="none",
        load_best_model_at_end=True,
        eval_strategy="steps",
        eval_steps=3,
        save_steps=6,
        metric_for_best_model="eval_reward",
    )
    TRAPOConfig(
        output_dir=str(tmp_path),
        report_to="none",
        load_best_model_at_end=True,
        eval_strategy="steps",
        eval_steps=0.1,
        save_steps=0.2,
        metric_for_best_model="eval_reward",
    )
    TRAPOConfig(
        output_dir=str(tmp_path),
        report_to="none",
        load_best_model_at_end=True,
        save_strategy="best",
        eval_strategy="steps",
        eval_steps=3,
        metric_for_best_model="eval_reward",
    )
    TRAPOConfig(
        output_dir=str(tmp_path),
        report_to="none",
        torch_compile_backend="EAGER",
        save_steps=2.0,
        accelerator_config={"split_batches": True, "gradient_accumulation_kwargs": {"sync_each_batch": True}},
    )
    TRAPOConfig(output_dir=str(tmp_path), report_to="none", torch_compile_mode="max-autotune", tf32=False)


def test_max_staleness_says_what_none_stands_for(tmp_path):
    """Trial 12's N10: `max_staleness=-1` was refused with "..., or None (4).", a bare number nobody could read. The
    message now says what None resolves to (the producer's own default, by its value) and when."""
    from trl_trapo.config import DEFAULT_MAX_STALENESS

    with pytest.raises(ValueError) as info:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", async_rollouts=True, max_staleness=-1)
    message = str(info.value)
    assert message.startswith("TRAPOConfig.max_staleness=-1 is invalid: use a number of optimizer steps >= 0"), message
    assert f"or None: {DEFAULT_MAX_STALENESS} steps with async_rollouts=True" in message, message
    assert "(TRL's AsyncGRPOConfig default)" in message and "(4)" not in message, message


def test_no_config_message_ends_in_a_bare_parenthesised_number():
    """N10's pattern anywhere in the config module: a fix that says "or None (4)" names a number without saying what
    it is. Every string of trl_trapo/config.py is read (the messages are built from them)."""
    import ast
    import re
    from pathlib import Path

    source = Path(config.__file__).read_text(encoding="utf-8")
    bare = re.compile(r"\(\s*-?\d+(?:\.\d+)?\s*\)")
    found = [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and bare.search(node.value)
    ]
    assert found == [], found


NON_DEFAULT = {  # one non-default config per class: a `*_token` setting, an alias pair, a dict, an enum, a bool
    TRAPOConfig: dict(
        stop_token=None,
        max_completion_length=32,
        beta=0.1,
        learning_rate=3e-4,
        lr_scheduler_type="cosine_with_restarts",
        lr_scheduler_kwargs={"num_cycles": 2},
        activation_checkpointing=False,
    ),
    GRPOConfig: dict(stop_token=None, max_completion_length=32, beta=0.1, num_iterations=2, save_strategy="no"),
    PPOConfig: dict(
        stop_token="eos", response_length=20, kl_coef=0.2, logging_steps=3, eval_strategy="steps", eval_steps=5
    ),
}


def test_every_token_field_is_a_setting_or_a_credential():
    """transformers' `to_dict()` masks every field whose name ends in `_token` as a secret: each such field of the
    configs is either a setting `to_dict()` shows (`SETTING_TOKEN_FIELDS`) or a credential of transformers'."""
    from transformers import TrainingArguments

    credentials = {f.name for f in dataclasses.fields(TrainingArguments) if f.name.endswith("_token")}
    assert credentials == {"hub_token"}
    for cls in CONFIGS:
        tokens = {f.name for f in dataclasses.fields(cls) if f.name.endswith("_token")}
        assert tokens == credentials | set(config.SETTING_TOKEN_FIELDS), cls


@pytest.mark.parametrize("cls", CONFIGS)
@pytest.mark.parametrize("default", [True, False], ids=["default", "non_default"])
def test_to_dict_shows_the_token_settings_and_rebuilds_the_config(tmp_path, cls, default):
    """Trial 13's N23: transformers' `to_dict()` masked `stop_token` as if it were a secret (`'<STOP_TOKEN>'`), so a
    tracker logged no setting and the rebuild `cls(**args.to_dict())`, which docs/agents.md says works, failed for
    every config ("stop_token='<STOP_TOKEN>' is invalid"). Now the rebuild, from the dict and from the JSON a tracker
    keeps, equals the original, for each config class, with its defaults and without."""
    import json

    args = cls(output_dir=str(tmp_path), report_to="none", **({} if default else NON_DEFAULT[cls]))
    values = args.to_dict()
    assert values["stop_token"] == args.stop_token and values["hub_token"] is None
    assert json.loads(args.to_json_string())["stop_token"] == args.stop_token
    assert cls(**values) == args
    assert cls(**json.loads(args.to_json_string())) == args


def test_a_set_hub_token_stays_masked_and_its_placeholder_is_refused_by_name(tmp_path):
    """A real credential stays masked in `to_dict()`; the rebuild gets the placeholder back and refuses it, naming
    the field and the fix, instead of keeping `'<HUB_TOKEN>'` as a token that fails at the Hub. A log written before
    `stop_token` was shown gives `'<STOP_TOKEN>'`: refused the same way, not as an invalid choice."""
    args = TRAPOConfig(output_dir=str(tmp_path), report_to="none", hub_token="hf_secret")
    values = args.to_dict()
    assert values["hub_token"] == "<HUB_TOKEN>" and "hf_secret" not in args.to_json_string()
    with pytest.raises(ValueError) as info:
        TRAPOConfig(**values)
    message = str(info.value)
    assert message.startswith("TRAPOConfig.hub_token='<HUB_TOKEN>' is the placeholder `to_dict()` writes"), message
    assert "pass the real token (hub_token=...)" in message, message
    with pytest.raises(ValueError, match=r"stop_token='<STOP_TOKEN>' is the placeholder .* stop_token='eos'"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", stop_token="<STOP_TOKEN>")
