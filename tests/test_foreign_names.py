# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Another trainer's names given to TRAPO (a TRL SFTConfig / GRPOConfig / 0.x PPOConfig field, a TRL 0.x import) get
one message naming the name, the value and what replaces it, not Python's "unexpected keyword argument" (trial 6:
G13, G14, Q01, Q04)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import trl_trapo
from trl_trapo import GRPOConfig, PPOConfig, TRAPOConfig
from trl_trapo.config import TRANSFORMERS4_FIXES
from trl_trapo.jobs.main import REMOVED_ARGUMENTS, did_you_mean


RECIPES = Path(__file__).resolve().parents[1] / "examples" / "recipes"


@pytest.mark.parametrize(
    ("cls", "given", "needles"),
    [
        (TRAPOConfig, {"max_length": 64}, ["TRL SFTConfig", "max_length=64", "sft_max_length", "pretrain_max_length"]),
        (TRAPOConfig, {"packing": True, "dataset_text_field": "body"}, ["packing=True", "pretrain_packing", "'body'"]),
        (TRAPOConfig, {"max_seq_length": 64}, ["sft_max_length"]),  # older SFTConfigs' name
        (TRAPOConfig, {"padding_free": True}, ["TRL SFTConfig", "padding_free=True"]),
        (
            PPOConfig,
            {"model_name": "gpt2", "batch_size": 8, "mini_batch_size": 2, "ppo_epochs": 4, "log_with": None},
            [
                "TRL 0.x PPOConfig",
                "rename it num_ppo_epochs=4",
                "log_with=None: report_to",
                "model_name='gpt2'",
                "mini_batch_size=2: num_mini_batches",
                "batch_size=8: per_device_train_batch_size",
                "docs/migrating_from_ppo.md",
            ],
        ),
        (PPOConfig, {"init_kl_coef": 0.2, "adap_kl_ctrl": True, "target": 6}, ["kl_coef=0.2", "kl_target", "adap"]),
        (TRAPOConfig, {"early_stopping": True}, ["TRL 0.x PPOConfig", "no TRAPO equivalent"]),
        # trial 9's TR05: transformers 4 names (Python's "unexpected keyword argument 'no_cuda'" named no fix)
        (TRAPOConfig, {"no_cuda": True}, ["transformers 4 TrainingArguments", "no_cuda=True: rename it use_cpu=True"]),
        (
            GRPOConfig,
            {"evaluation_strategy": "steps", "warmup_ratio": 0.1},
            ["rename it eval_strategy='steps'", "warmup_ratio=0.1: use warmup_steps with the same value"],
        ),
    ],
)
def test_a_field_of_another_trl_config_is_refused_naming_it_and_its_replacement(tmp_path, cls, given, needles):
    with pytest.raises(TypeError) as caught:
        cls(output_dir=str(tmp_path), report_to="none", **given)
    message = str(caught.value)
    assert "unexpected keyword" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_the_python_table_of_transformers_4_names_matches_the_command_lines():
    """Every `TrainingArguments` name the command line maps (`REMOVED_ARGUMENTS`) is mapped in Python too, each to a
    field the config has (TR05: the command line named `--use_cpu`, Python nothing)."""
    removed = {name for name, text in REMOVED_ARGUMENTS.items() if "transformers 5" in text}
    assert removed == set(TRANSFORMERS4_FIXES)
    for name, fix in TRANSFORMERS4_FIXES.items():
        replacement = fix if fix.isidentifier() else None
        assert replacement is None or replacement in TRAPOConfig.__dataclass_fields__, name
        assert name not in TRAPOConfig.__dataclass_fields__, name


TRIAL10_TA16 = (
    "save_safetensors include_tokens_per_second split_batches dispatch_batches use_mps_device "
    "include_inputs_for_metrics fp16_backend tpu_num_cores use_legacy_prediction_loop ray_scope torchdynamo "
    "sharded_ddp jit_mode_eval use_ipex mp_parameters fsdp_min_num_params fsdp_transformer_layer_cls_to_wrap "
    "past_index"
).split()


@pytest.mark.parametrize("name", TRIAL10_TA16)
def test_every_removed_transformers_4_field_names_its_replacement(tmp_path, name):
    """Trial 10's TA16: these transformers 4 fields, common in older scripts, were Python's bare "unexpected keyword
    argument"; each now gets its replacement or "drop it", in Python and on the command line."""
    from transformers import TrainingArguments

    assert name not in TrainingArguments.__dataclass_fields__  # transformers 5 removed it
    with pytest.raises(TypeError) as caught:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", **{name: 1})
    message = str(caught.value)
    assert "unexpected keyword" not in message and "transformers 4 TrainingArguments" in message, message
    assert f"{name}=1: " in message and ("rename it" in message or "drop it" in message or "inside" in message)
    assert "transformers 5" in did_you_mean(f"--{name}")


def test_a_grpo_and_an_sft_field_together_are_both_named(tmp_path):
    with pytest.raises(TypeError) as caught:
        TRAPOConfig(output_dir=str(tmp_path), epsilon_high=0.28, max_length=64)
    message = str(caught.value)
    assert "TRL GRPOConfig" in message and "epsilon_high" in message
    assert "TRL SFTConfig" in message and "sft_max_length" in message


def test_trust_remote_code_names_model_init_kwargs(tmp_path):
    """TRL GRPOConfig's `trust_remote_code` was "no TRAPO equivalent, drop it" (trial 9's CM04)."""
    with pytest.raises(
        TypeError, match=r'trust_remote_code=True: .*`model_init_kwargs=\{"trust_remote_code": True\}`'
    ):
        TRAPOConfig(output_dir=str(tmp_path), trust_remote_code=True)


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_a_recipe_given_to_trapo_config_names_the_jobs_arguments_and_where_each_goes(recipe):
    """Trial 15's N25: `TRAPOConfig(**yaml.safe_load(open(recipe)))` raised Python's bare "unexpected keyword argument
    'model_name_or_path'". Every key of the recipe that is an argument of the `trapo train` job and not a config field
    (the job's argument dataclasses say which) is named in one message, with the trainer argument that takes it."""
    import dataclasses

    import yaml

    from trl_trapo.jobs.main import JOB_CLASSES

    values = yaml.safe_load((RECIPES / recipe).read_text())
    fields = {f.name for f in dataclasses.fields(TRAPOConfig)}
    job_keys = [key for key in values if key not in fields]
    assert "model_name_or_path" in job_keys and {f.name for c in JOB_CLASSES for f in dataclasses.fields(c)} >= set(
        job_keys
    )
    with pytest.raises(TypeError) as caught:
        TRAPOConfig(**values)
    message = str(caught.value)
    assert message.startswith("TRAPOConfig got arguments of the `trapo train` job, which are not TRAPOConfig fields: ")
    for key in job_keys:
        assert key in message, (key, message)
    for needle in [
        "model_name_or_path -> `TRAPOTrainer(model=...)`",
        "reward_funcs -> `TRAPOTrainer(reward_funcs=...)`",
        "-> `TRAPOTrainer(train_dataset=...)`",
        "`TRAPOTrainer(peft_config=peft.LoraConfig(...))`" if "use_peft" in values else "TRAPOTrainer(sft_dataset=",
        "`trapo train --config FILE`",
    ]:
        assert needle in message, (needle, message)


def test_the_configs_table_of_job_arguments_is_the_jobs_parser():
    """The core never imports the jobs, so `TRAPOConfig` reads TRL's `ModelConfig` / `ScriptArguments` fields and
    its own table of the job's other arguments: together they must be exactly the main job's arguments that are not
    config fields (a new job argument fails here until it is placed), each placed at a `TRAPOTrainer` parameter."""
    import dataclasses

    from trl import ModelConfig, ScriptArguments

    from trl_trapo import TRAPOTrainer
    from trl_trapo.config import JOB_ARGUMENT_PLACES, JOB_ARGUMENTS, job_argument_place
    from trl_trapo.jobs.main import JOB_CLASSES, known_fields
    from trl_trapo.objectives import WITH_DATA

    config_fields = {f.name for f in dataclasses.fields(TRAPOConfig)}
    job_only = set(known_fields(JOB_CLASSES)) - config_fields
    trl_fields = {f.name for cls in (ModelConfig, ScriptArguments) for f in dataclasses.fields(cls)}
    placed = {name for name in job_only | set(JOB_ARGUMENTS) | trl_fields if job_argument_place(name) is not None}
    assert placed - config_fields == job_only
    parameters = inspect.signature(TRAPOTrainer.__init__).parameters
    assert all(job_argument_place(n) in JOB_ARGUMENT_PLACES or job_argument_place(n) in parameters for n in job_only)
    for objective in WITH_DATA:  # each objective's dataset flags go to its dataset argument
        assert job_argument_place(f"{objective.DATA_FLAGS}_name") == objective.ARGUMENT, objective


def test_a_job_argument_beside_a_trl_field_and_an_unknown_name_are_all_named(tmp_path):
    with pytest.raises(TypeError) as caught:
        TRAPOConfig(output_dir=str(tmp_path), max_length=64, value_model_name_or_path="critic", not_a_field=1)
    message = str(caught.value)
    for needle in [
        "TRL SFTConfig",
        "It also got arguments of the `trapo train` job",
        "value_model_name_or_path -> `TRAPOTrainer(value_model=...)`",
        "Neither TRAPOConfig nor the job takes not_a_field.",
    ]:
        assert needle in message, (needle, message)


def test_a_name_of_no_trl_config_keeps_pythons_error(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_a_field'"):
        TRAPOConfig(output_dir=str(tmp_path), not_a_field=1)


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("--ppo_epochs", "TRL 0.x PPOConfig's argument, which this job does not have. Fix: use --num_ppo_epochs."),
        ("--init_kl_coef", "TRL 0.x PPOConfig's argument, which this job does not have. Fix: use --kl_coef."),
        ("--max_seq_length", "TRL SFTConfig's argument, which this job does not have. Fix: the SFT row length is"),
        ("--model_name", "Did you mean --model_name_or_path?"),  # an abbreviation of the job's own flag wins
    ],
)
def test_the_command_line_names_the_replacement_of_a_trl_0x_flag(flag, needle):
    """SFTConfig's and GRPOConfig's flags are named by `TRL_ARGUMENT_FIXES` (tests/test_job_arguments.py); a 0.x
    PPOConfig flag got a guess at the closest name."""
    assert needle in did_you_mean(flag)


def test_a_trl_0x_value_head_class_names_the_value_model_when_used():
    from trl_trapo import AutoModelForCausalLMWithValueHead  # a 0.x script's import line runs

    with pytest.raises(ImportError, match=r"AutoModelForCausalLMWithValueHead.*value_model=.*num_labels=1"):
        AutoModelForCausalLMWithValueHead.from_pretrained("gpt2")
    with pytest.raises(ImportError, match="use PPOTrainer"):
        trl_trapo.PPOv2Trainer(None)
    assert "AutoModelForCausalLMWithValueHead" not in dir(trl_trapo)
    with pytest.raises(AttributeError, match="has no attribute 'NotAName'"):
        trl_trapo.NotAName  # noqa: B018


def test_use_liger_kernel_without_the_package_says_what_it_does_here(tmp_path):
    """transformers' "liger-kernel >= 0.3.0 is not available" came when the trainer was built and said nothing of what
    the flag does under TRAPO, whose losses do not use TRL's Liger GRPO loss (trial 6's G09)."""
    from transformers.utils import is_liger_kernel_available

    from trl_trapo import GRPOConfig

    if is_liger_kernel_available():
        pytest.skip("liger-kernel is installed")
    with pytest.raises(
        ImportError, match=r"GRPOConfig\.use_liger_kernel=True needs liger-kernel.*no TRAPO equivalent"
    ):
        GRPOConfig(output_dir=str(tmp_path), use_liger_kernel=True)


@pytest.mark.parametrize(
    ("given", "needles"),
    [
        ({"data_collator": object()}, ["TRAPOTrainer got TRL SFTTrainer", "data_collator=: drop it", "objectives="]),
        ({"formatting_func": str}, ["formatting_func=: map your rows", "dataset.map(...)", "sft_dataset="]),
        ({"compute_metrics": str, "model_init": str}, ["compute_metrics=: drop it", "model_init=: pass the model"]),
        (  # TRL GRPOTrainer's / SFTTrainer's `quantization_config=` (trial 13's N30 sibling)
            {"quantization_config": object()},
            ["quantization_config=: put it in the config", "model_init_kwargs={'quantization_config': ...}"],
        ),
        (  # PX63: a config field given to the trainer was Python's "unexpected keyword argument"
            {"reward_weights": [2.0]},
            ["got config field(s)", "reward_weights", "args=TRAPOConfig(..., reward_weights=[2.0])"],
        ),
    ],
)
def test_an_sft_trainer_argument_is_refused_naming_it_and_the_fix(tmp_path, given, needles):
    """`TRAPOTrainer(..., data_collator=...)` / `formatting_func=` (TRL SFTTrainer's arguments) were Python's
    "unexpected keyword argument" naming no fix (trial 8's DC01 / DC02); refused before anything loads."""
    from trl_trapo import TRAPOTrainer

    with pytest.raises(TypeError) as raised:
        TRAPOTrainer("no/such-model", args=TRAPOConfig(output_dir=str(tmp_path)), **given)
    for needle in needles:
        assert needle in str(raised.value), str(raised.value)
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument\(s\): not_an_argument= \(no parameter is close\)"
    ):
        TRAPOTrainer("no/such-model", args=TRAPOConfig(output_dir=str(tmp_path)), not_an_argument=1)


@pytest.mark.parametrize(
    ("cls", "given", "needles"),
    [
        ("TRAPOTrainer", {"tokenizer": None}, ["tokenizer=: pass it as `processing_class=`", "transformers 4.46"]),
        (
            "TRAPOTrainer",
            {"eval_datasets": None},
            ["eval_datasets= (did you mean eval_dataset", "Its keyword arguments"],
        ),
        ("PPOTrainer", {"value_models": None}, ["value_models= (did you mean value_model"]),
    ],
)
def test_a_removed_or_misspelt_trainer_keyword_names_the_parameter_meant(tmp_path, cls, given, needles):
    """Trial 14's N49: `TRAPOTrainer(..., tokenizer=tok)` (transformers 4's name, the commonest leftover in old TRL
    scripts) and a typo `eval_datasets=` got Python's bare "unexpected keyword argument", naming no parameter."""
    import trl_trapo

    with pytest.raises(TypeError) as raised:
        getattr(trl_trapo, cls)("no/such-model", args=TRAPOConfig(output_dir=str(tmp_path)), **given)
    for needle in needles:
        assert needle in str(raised.value), str(raised.value)


def test_a_config_field_given_to_ppo_trainer_names_its_config(tmp_path):
    """PX63's sibling: PPOTrainer hands unknown keywords to TRAPOTrainer, whose bare TypeError came after the setup."""
    from trl_trapo import PPOConfig, PPOTrainer

    with pytest.raises(TypeError, match=r"got config field\(s\).*args=PPOConfig\(\.\.\., reward_weights=\[2\.0\]\)"):
        PPOTrainer(args=PPOConfig(output_dir=str(tmp_path)), model="no/such-model", reward_weights=[2.0])


def test_ppo_trainer_still_takes_trl_1x_data_collator(tmp_path):
    """TRL 1.12's PPOTrainer took `data_collator` (accepted, unused): the refusal is only for classes without it."""
    from trl_trapo import PPOTrainer, TRAPOTrainer

    assert "data_collator" in inspect.signature(PPOTrainer.__init__).parameters
    with pytest.raises(TypeError, match="formatting_func=: map your rows"):
        PPOTrainer(args=PPOConfig(output_dir=str(tmp_path)), processing_class=None, model=None, formatting_func=str)
    assert issubclass(PPOTrainer, TRAPOTrainer)
