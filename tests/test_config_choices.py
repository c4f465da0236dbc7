# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The config refuses, when it is built, every value that would only fail (or silently do something else) once
training runs: a value outside a field's fixed choices (every `Literal[...]` field of TRAPOConfig / PPOConfig /
GRPOConfig and every enum field of transformers'), a `generation_kwargs` sampler value transformers would reject at
the first `generate`, interval and size fields transformers rewrites or accepts, seeds numpy refuses, a negative
`missing_eos_penalty`, a missing DeepSpeed file and a Hub repo id the Hub refuses. Each message names the field, the
value and the fix (the trial-3 cases C01, C03-C08, C12/X14, C13, X04, X09-X11)."""

from __future__ import annotations

import dataclasses
import enum
import typing

import huggingface_hub.constants
import pytest

from trl_trapo import GRPOConfig, PPOConfig, TRAPOConfig
from trl_trapo.config import TRL_ONLY_CHOICES, _choices


def choice_fields(cls) -> list[tuple[type, str, tuple]]:
    """(class, field, choices) of every field of `cls` whose annotation offers fixed choices."""
    hints = typing.get_type_hints(cls)
    return [
        (cls, f.name, _choices(hints[f.name])) for f in dataclasses.fields(cls) if f.init and _choices(hints[f.name])
    ]


CHOICE_FIELDS = [entry for cls in (TRAPOConfig, PPOConfig, GRPOConfig) for entry in choice_fields(cls)]


def test_the_choice_fields_include_every_literal_and_enum_field():
    # the parametrisation below is built from the annotations: it must see TRAPO's Literal fields and transformers'
    # enum fields, or it would test nothing
    names = {name for _, name, _ in CHOICE_FIELDS}
    assert {"dare_mode", "kl_estimator", "kl_penalty", "sft_loss_type", "scale_rewards", "loss_type"} <= names
    assert {"lr_scheduler_type", "optim", "eval_strategy", "save_strategy"} <= names
    literal = {
        f.name
        for f in dataclasses.fields(TRAPOConfig)
        if typing.get_origin(typing.get_type_hints(TRAPOConfig)[f.name]) is typing.Literal
    }
    assert literal <= names


@pytest.mark.parametrize(
    ("cls", "name", "choices"), CHOICE_FIELDS, ids=[f"{c.__name__}.{n}" for c, n, _ in CHOICE_FIELDS]
)
def test_a_value_outside_the_choices_is_refused_at_construction(tmp_path, cls, name, choices):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name}='nope' is invalid.*use one of"):
        cls(output_dir=str(tmp_path), **{name: "nope"})


@pytest.mark.parametrize(
    ("field", "value", "close"),
    [
        ("dare_mode", "dynamik", "dynamic"),  # C03: trained silently with static weights
        ("kl_estimator", "k4", None),  # C04: KeyError in losses.py
        ("kl_penalty", "both", None),  # C05
        ("sft_loss_type", "trustregion", "trust_region"),  # C06: refused only at the first loss
        ("scale_rewards", "maybe", None),  # C07
        ("lr_scheduler_type", "cosin", "cosine"),
    ],
)
def test_the_message_names_the_field_the_choices_and_a_close_one(tmp_path, field, value, close):
    with pytest.raises(ValueError) as error:
        TRAPOConfig(output_dir=str(tmp_path), **{field: value})
    message = str(error.value)
    assert f"TRAPOConfig.{field}={value!r} is invalid" in message
    for choice in _choices(typing.get_type_hints(TRAPOConfig)[field]):
        assert repr(choice) in message
    assert (f"did you mean {close!r}" in message) == (close is not None)


@pytest.mark.parametrize("loss_type", sorted(TRL_ONLY_CHOICES["loss_type"]))
def test_trl_only_loss_types_are_named_as_trl_s(tmp_path, loss_type):
    # C08: TRL 1.16's GRPOConfig accepts them; TRAPO has no equivalent and says so before anything runs
    with pytest.raises(ValueError, match=rf"TRL's '{loss_type}' .* has no TRAPO equivalent; use one of 'dapo'"):
        GRPOConfig(output_dir=str(tmp_path), loss_type=loss_type)


def test_choices_accept_every_listed_value_enum_members_and_none_where_annotated(tmp_path):
    from transformers.trainer_utils import SchedulerType

    for value in ("k1", "k2", "k3", "auto"):
        assert TRAPOConfig(output_dir=str(tmp_path), kl_estimator=value).kl_estimator == value
    assert PPOConfig(output_dir=str(tmp_path), kl_estimator="auto").kl_estimator == "auto"
    assert TRAPOConfig(output_dir=str(tmp_path), stop_token=None).stop_token is None
    config = TRAPOConfig(output_dir=str(tmp_path), lr_scheduler_type=SchedulerType.COSINE)
    assert config.lr_scheduler_type == SchedulerType.COSINE
    assert isinstance(dataclasses.replace(config).lr_scheduler_type, enum.Enum)  # a rebuilt copy holds the enum


@pytest.mark.parametrize(("cls", "given", "read"), [(TRAPOConfig, True, "group"), (GRPOConfig, False, "none")])
def test_scale_rewards_takes_trl_s_booleans(tmp_path, cls, given, read):
    # TRL's GRPOConfig reads True / False as "group" / "none"; a moved GRPO script keeps working
    assert cls(output_dir=str(tmp_path), scale_rewards=given).scale_rewards == read


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_p": "abc"}, r"`min_p` takes a number in \[0, 1\]"),  # C01: transformers' TypeError at generate
        ({"min_p": 1.5}, r"`min_p` takes a number in \[0, 1\]"),
        ({"typical_p": 0}, r"`typical_p` takes a number in \(0, 1\]"),
        ({"epsilon_cutoff": 2}, r"`epsilon_cutoff` takes a number in \[0, 1\)"),  # silently no warper
        ({"eta_cutoff": True}, r"`eta_cutoff` takes a number"),
        ({"use_cache": "yes"}, r"`use_cache` takes True or False"),
        ({"cache_implementation": "nope"}, r"Invalid `cache_implementation`"),
    ],
)
def test_generation_kwargs_values_are_checked_at_construction(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=rf"TRAPOConfig\.generation_kwargs=.* is invalid: {message}"):
        TRAPOConfig(output_dir=str(tmp_path), generation_kwargs=kwargs)


def test_valid_generation_kwargs_values_pass(tmp_path):
    kwargs = {"min_p": 0.1, "typical_p": 1.0, "epsilon_cutoff": 0, "eta_cutoff": 3e-4, "use_cache": False}
    assert TRAPOConfig(output_dir=str(tmp_path), generation_kwargs=kwargs).generation_kwargs == kwargs


@pytest.mark.parametrize(
    ("cls", "overrides", "message"),
    [
        (TRAPOConfig, {"eval_strategy": "steps", "eval_steps": 0}, r"eval_steps=0 is invalid"),  # C12 / X14
        (TRAPOConfig, {"per_device_eval_batch_size": 0}, r"per_device_eval_batch_size=0 is invalid"),  # X10
        (TRAPOConfig, {"seed": -1}, r"seed=-1 is invalid: use an integer in \[0, 2\*\*32 - 1\]"),  # X11
        (TRAPOConfig, {"data_seed": 2**32}, r"data_seed=4294967296 is invalid"),
        (PPOConfig, {"missing_eos_penalty": -1.0}, r"PPOConfig\.missing_eos_penalty=-1\.0 is invalid"),  # C13
        (TRAPOConfig, {"deepspeed": "nope.json"}, r"deepspeed='nope.json' is invalid: no such file"),  # X04
    ],
)
def test_settings_transformers_accepts_or_rewrites_are_refused(tmp_path, cls, overrides, message):
    with pytest.raises(ValueError, match=message):
        cls(output_dir=str(tmp_path), **overrides)


LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


def no_launcher(monkeypatch) -> None:
    """This process as `python examples/trapo.py` starts it: no launcher's environment, no mpi4py."""
    import importlib.util

    for key in LAUNCHER_ENV:
        monkeypatch.delenv(key, raising=False)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else find_spec(name, *a)
    )


def test_deepspeed_files_deepspeed_would_fail_on_are_refused_naming_the_field_and_file(tmp_path, monkeypatch):
    """Trial 8's JC07 / JC08 / JC08b: a malformed `--deepspeed` JSON was a bare "Expecting property name enclosed in
    double quotes" naming neither the flag nor the file; `"stage": 4` and any `--deepspeed` without a launcher ran
    12 s and failed with "No module named 'mpi4py'" (DeepSpeed asks MPI for the rank no launcher gave)."""
    no_launcher(monkeypatch)
    malformed = tmp_path / "ds_bad.json"
    malformed.write_text('{"zero_optimization": {"stage": 2,}, "train_micro_batch_size_per_gpu": "auto"')
    with pytest.raises(
        ValueError, match=rf"deepspeed='{malformed}' is invalid: the file {malformed} is not valid JSON"
    ):
        TRAPOConfig(output_dir=str(tmp_path), deepspeed=str(malformed))
    # trial 16's C14 (a BOM the converter refused): accelerate's reader refuses it too; the fix was "keys in double
    # quotes, no trailing commas", for a file whose JSON is fine
    bom = tmp_path / "ds_bom.json"
    bom.write_bytes(b'\xef\xbb\xbf{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}')
    with pytest.raises(ValueError) as error:
        TRAPOConfig(output_dir=str(tmp_path), deepspeed=str(bom))
    message = str(error.value)
    assert f"the file {bom} starts with a UTF-8 byte-order mark (BOM), which accelerate cannot read" in message
    assert "save it as plain UTF-8" in message and "double quotes" not in message, message
    stage4 = tmp_path / "ds_stage4.json"
    stage4.write_text('{"zero_optimization": {"stage": 4}, "train_micro_batch_size_per_gpu": "auto"}')
    with pytest.raises(ValueError, match=r"zero_optimization\.stage=4; DeepSpeed's ZeRO stages are 0, 1, 2 and 3"):
        TRAPOConfig(output_dir=str(tmp_path), deepspeed=str(stage4))
    with pytest.raises(ValueError, match=r"zero_optimization\.stage=4"):  # a dict too
        TRAPOConfig(output_dir=str(tmp_path), deepspeed={"zero_optimization": {"stage": 4}})
    stage2 = tmp_path / "ds_stage2.json"
    stage2.write_text('{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}')
    with pytest.raises(
        ValueError, match=r"deepspeed='.*ds_stage2.json' needs a distributed launch.*accelerate launch"
    ):
        TRAPOConfig(output_dir=str(tmp_path), deepspeed=str(stage2))


def test_a_leftover_accelerate_use_deepspeed_variable_is_named(tmp_path, monkeypatch):
    """Trial 10's CX10: `ACCELERATE_USE_DEEPSPEED=true` left exported in the shell made `python examples/trapo.py` fail
    after 22 s with "No module named 'mpi4py'" (DeepSpeed's MPI discovery), naming no variable; now refused at
    construction, naming the variable and `unset`. Under a launcher's environment it is DeepSpeed's run, not refused."""
    no_launcher(monkeypatch)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(output_dir=str(tmp_path))
    message = str(raised.value)
    for needle in ["ACCELERATE_USE_DEEPSPEED=true", "unset ACCELERATE_USE_DEEPSPEED", "mpi4py", "accelerate launch"]:
        assert needle in message, (needle, message)
    # on the CPU accelerate leaves DeepSpeed off: nothing to refuse
    TRAPOConfig(output_dir=str(tmp_path), use_cpu=True)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "false")
    TRAPOConfig(output_dir=str(tmp_path))  # off: nothing to refuse


def test_fsdp_without_a_launcher_is_refused_at_construction_with_the_launch_command(tmp_path, monkeypatch):
    """Trial 8's JC18: `--fsdp full_shard` in one process was transformers' "Using fsdp only works in distributed
    training." from the Trainer, after the data and models were loaded, naming no fix."""
    no_launcher(monkeypatch)
    with pytest.raises(ValueError, match=r"fsdp='full_shard' needs a distributed launch.*fsdp2\.yaml"):
        TRAPOConfig(output_dir=str(tmp_path), fsdp="full_shard")
    assert not TRAPOConfig(output_dir=str(tmp_path)).fsdp  # no fsdp: nothing to refuse


def test_a_ddp_backend_without_a_launcher_is_refused_by_name(tmp_path, monkeypatch):
    """Trial 10's TA19 / CX29: `ddp_backend="gloo"` in one process failed in transformers' device setup with torch's
    "Default process group has not been initialized" (TRL's GRPOConfig too), naming neither the field nor a fix."""
    no_launcher(monkeypatch)
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(output_dir=str(tmp_path), ddp_backend="gloo")
    message = str(raised.value)
    for needle in [
        "TRAPOConfig.ddp_backend='gloo'",
        "no launcher started this one",
        "drop ddp_backend",
        "--multi_gpu",
    ]:
        assert needle in message, (needle, message)


def test_eval_steps_none_still_follows_logging_steps(tmp_path):
    config = TRAPOConfig(output_dir=str(tmp_path), eval_strategy="steps", logging_steps=3)
    assert config.eval_steps == 3


def test_push_to_hub_refuses_a_repo_id_the_hub_refuses(tmp_path, monkeypatch):
    # X09: the repo id comes from output_dir's last part; "my run" was refused by huggingface_hub only at the push
    with pytest.raises(
        ValueError, match=r"TRAPOConfig\.output_dir: the Hub repo id 'my run' .*--hub_model_id.*my-run"
    ):
        TRAPOConfig(output_dir=str(tmp_path / "my run"), push_to_hub=True)
    with pytest.raises(ValueError, match=r"TRAPOConfig\.hub_model_id: the Hub repo id 'a b/c'"):
        TRAPOConfig(output_dir=str(tmp_path), push_to_hub=True, hub_model_id="a b/c")
    # a valid hub_model_id passes (the tests run offline: the Hub is reported as reachable here)
    monkeypatch.setattr(huggingface_hub.constants, "is_offline_mode", lambda: False)
    assert TRAPOConfig(output_dir=str(tmp_path / "my run"), push_to_hub=True, hub_model_id="me/my-run").push_to_hub


def test_vllm_settings_without_use_vllm_are_warned_once(tmp_path, caplog):
    """`vllm_gpu_memory_utilization=1.5` (trial 8's CF04) or `--vllm_tensor_parallel_size 0` (JC25) without
    `use_vllm` was accepted without a word. TRL's GRPOConfig checks none of them, on or off, so they are not refused
    there: one warning names them and says they are ignored, as async-only settings get; the ranges are refused with
    `use_vllm=True`; nothing for the defaults or a copy of the config."""
    import logging

    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        config = GRPOConfig(output_dir=str(tmp_path), vllm_gpu_memory_utilization=1.5, vllm_tensor_parallel_size=0)
        dataclasses.replace(config, max_steps=3)  # the trainer's and the job's copies
    found = [r.getMessage() for r in caplog.records if "use_vllm is not" in r.getMessage()]
    assert found == [
        "vllm_gpu_memory_utilization=1.5, vllm_tensor_parallel_size=0 are set but GRPOConfig.use_vllm is not: they "
        "are ignored (completions are sampled with transformers' generate; their ranges are checked only with "
        "use_vllm). Set use_vllm=True (--use_vllm) to sample with vLLM, or drop them."
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        TRAPOConfig(output_dir=str(tmp_path))
        TRAPOConfig(output_dir=str(tmp_path), vllm_gpu_memory_utilization=0.3)  # an explicit default: not given
        TRAPOConfig(output_dir=str(tmp_path), vllm_importance_sampling_correction=False)  # also read without vLLM
    assert "use_vllm is not" not in caplog.text
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization"):
        TRAPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_gpu_memory_utilization=1.5)


@pytest.mark.parametrize(
    ("leftover", "unset"),
    [
        ({"WORLD_SIZE": "2"}, "unset WORLD_SIZE`"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, "unset WORLD_SIZE RANK LOCAL_RANK`"),
    ],
    ids=["world-size", "world-size-rank-local-rank"],
)
def test_a_leftover_world_size_without_a_launcher_is_refused_naming_the_variables(
    tmp_path, monkeypatch, leftover, unset
):
    """Trial 11's C05: `WORLD_SIZE=2` (with or without `RANK=0 LOCAL_RANK=0`) left in the shell, no launcher: the job
    failed with accelerate's "Tried to launch on distributed with multinode, but `MASTER_ADDR` env was not set, please
    try exporting ..." wrapped in "Change the field it names": no field was named, and exporting `MASTER_ADDR` makes
    the lone process wait for a rank that never comes. Refused at construction, naming the variables and both fixes."""
    no_launcher(monkeypatch)
    for name, value in leftover.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none")
    message = str(raised.value)
    shown = ", ".join(f"{name}={value!r}" for name, value in leftover.items())
    for needle in [f"set here: {shown})", "MASTER_ADDR", unset, "accelerate launch --num_processes 2", "trapo train"]:
        assert needle in message, (needle, message)
    assert "Change the field" not in message


def test_a_world_size_a_launcher_or_the_script_set_up_is_not_refused(monkeypatch):
    """What a launcher sets (torchrun and `accelerate launch` set `MASTER_ADDR` with `WORLD_SIZE`), a process group the
    script formed itself, and a world of one pass [`check_world_environment`]; a `WORLD_SIZE` that is not a number is
    refused naming it."""
    import torch

    from trl_trapo.distributed import check_world_environment

    no_launcher(monkeypatch)
    check_world_environment()  # nothing set
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_world_environment()
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    check_world_environment()  # a launcher's environment
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    check_world_environment()  # the script formed its own group
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    with pytest.raises(ValueError, match=r"one of 2 processes .*`unset WORLD_SIZE RANK LOCAL_RANK MASTER_PORT`"):
        check_world_environment()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match=r"WORLD_SIZE='two' is not a whole number"):
        check_world_environment()


def test_transformers_refusal_names_the_fields_it_names_and_no_other(tmp_path, monkeypatch):
    """The catch-all around transformers' `TrainingArguments.__post_init__` said "Change the field it names" even when
    transformers' text named none (trial 11's C05: an environment variable was the cause); now it lists the fields the
    text names, or says that it names none and points at the environment."""
    import transformers

    def refuse(text):
        def post_init(self):
            raise ValueError(text)

        monkeypatch.setattr(transformers.TrainingArguments, "__post_init__", post_init)
        with pytest.raises(ValueError, match="transformers' TrainingArguments refused its settings") as raised:
            TRAPOConfig(output_dir=str(tmp_path), report_to="none")
        return str(raised.value)

    named = refuse("--eval_steps must be a whole number when save_steps is")
    assert "Change the TRAPOConfig field it names (--eval_steps, --save_steps)" in named
    unnamed = refuse("Tried to launch on distributed with multinode")
    assert "Change the" not in unnamed and "It names no TRAPOConfig field" in unnamed and "WORLD_SIZE" in unnamed
