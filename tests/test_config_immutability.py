# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The config is built once and never changed: not the object the user passes in, and not `trainer.args` after
`__init__` (values that adapt live in their controllers). A `PPOConfig` builds two identical trainers."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from conftest import TINY_CONFIG
from test_ppo import load, ppo_config, saved_models, tokenized_prompts  # noqa: F401  (saved_models is a fixture)
from transformers import AutoTokenizer, TrainerCallback

from trl_trapo import PPOTrainer, TRAPOConfig, TRAPOTrainer
from trl_trapo.experimental.fewshot import FewShotTRAPOTrainer


def comparable(config) -> dict:
    return {k: v for k, v in config.to_dict().items() if k != "_n_gpu"}


class ArgsWatcher(TrainerCallback):
    """Records `args.to_dict()` at every step end (the object the Trainer hands to callbacks is `trainer.args`)."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(comparable(args))


def test_schedules_and_fewshot_leave_the_config_unchanged(tmp_path, tokenizer, suite, tiny_trainer):
    trainer = tiny_trainer(
        tmp_path,
        tokenizer,
        suite,
        trainer_class=FewShotTRAPOTrainer,
        max_steps=6,
        fewshot_mode=True,  # anneals the rollout temperature
        kl_target=1e6,  # adaptive KL coefficient
        kl_coef_range=[0.01, 0.3],
        kl_coef=0.2,
        rl_phase_learning_rate=5e-4,  # learning-rate scale in the last phase
        entropy_coef=0.01,
        late_entropy_coef=0.005,
    )
    after_init = comparable(trainer.args)
    watcher = ArgsWatcher()
    trainer.add_callback(watcher)
    trainer.train()
    assert watcher.seen and all(seen == after_init for seen in watcher.seen)
    assert comparable(trainer.args) == after_init
    # the values did move — in their controllers
    assert trainer.schedules.kl_coef() < 0.2
    assert trainer.schedules.entropy_coef(5) == 0.005 and trainer.schedules.lr_scale(5) == pytest.approx(0.5)
    assert trainer.memory_pool.selector.temperature_at(5) < trainer.args.temperature


def test_ppo_sizing_uses_a_copy_and_one_config_builds_two_identical_trainers(tmp_path, saved_models):  # noqa: F811
    tokenizer = AutoTokenizer.from_pretrained(saved_models / "tokenizer")
    config = ppo_config(tmp_path, gradient_accumulation_steps=4, num_mini_batches=2, total_episodes=None)
    before = comparable(config)

    def run():
        torch.manual_seed(0)
        trainer = PPOTrainer(
            args=config,
            processing_class=tokenizer,
            model=load(saved_models, "policy"),
            ref_model=load(saved_models, "ref"),
            reward_model=load(saved_models, "reward"),
            value_model=load(saved_models, "value"),
            train_dataset=tokenized_prompts(tokenizer),
        )
        assert trainer.args is not config
        derived = comparable(trainer.args)
        trainer.train()
        assert comparable(trainer.args) == derived  # never changed after __init__
        return trainer, derived

    first, derived = run()
    assert comparable(config) == before  # the user's PPOConfig is untouched
    assert config.gradient_accumulation_steps == 4 and config.batch_size is None and config.max_steps == -1
    # TRL 1.12's derived sizes, in the trainer's copy
    assert derived["gradient_accumulation_steps"] == 2 and derived["local_batch_size"] == 16
    assert derived["total_episodes"] == 48 and derived["num_total_batches"] == 3 and derived["max_steps"] == 12
    second, derived_again = run()
    assert derived_again == derived
    assert first.state.global_step == second.state.global_step == 12
    for (name, a), (_, b) in zip(first.model.named_parameters(), second.model.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    ("kwargs", "expected", "warns"),
    [
        ({}, True, False),  # TRL's default, without transformers' deprecation warning
        ({"activation_checkpointing": False}, False, False),
        ({"gradient_checkpointing": False}, False, True),  # the deprecated alias is still honoured, never overridden
        ({"gradient_checkpointing": True, "activation_checkpointing": False}, False, False),  # the new name wins
    ],
)
def test_activation_checkpointing_default_and_alias(tmp_path, kwargs, expected, warns):
    import warnings

    from trl_trapo import TRAPOConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = TRAPOConfig(output_dir=str(tmp_path), **kwargs)
    assert config.activation_checkpointing is expected and config.gradient_checkpointing is expected
    deprecation = [w for w in caught if "gradient_checkpointing` is deprecated" in str(w.message)]
    assert bool(deprecation) is warns


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"max_completion_length": 32}, 32),  # GRPO's name sets the budget
        ({"max_completion_length": 32, "response_length": 32}, 32),  # both, agreeing
        ({"response_length": 40}, 40),  # PPO's name alone: GRPO's reads it too
        ({}, 128),
    ],
)
def test_max_completion_length_is_grpos_name_of_response_length(tmp_path, kwargs, expected):
    import dataclasses

    from trl_trapo import TRAPOConfig

    config = TRAPOConfig(output_dir=str(tmp_path), **kwargs)
    assert config.response_length == expected
    assert config.max_completion_length == expected  # as a TRL rollout_func reads it
    assert config.grpo_names_given == (["max_completion_length"] if "max_completion_length" in kwargs else [])
    assert comparable(dataclasses.replace(config, max_steps=3))["response_length"] == expected  # a copy keeps it
    assert config.to_dict()["response_length"] == expected


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"max_completion_length": 32, "response_length": 64}, ("max_completion_length=32", "response_length=64")),
        ({"max_completion_length": 0}, ("max_completion_length=0", "positive number of tokens")),
    ],
)
def test_max_completion_length_that_disagrees_or_is_not_positive_is_refused(tmp_path, kwargs, needles):
    from trl_trapo import TRAPOConfig

    with pytest.raises(ValueError) as caught:
        TRAPOConfig(output_dir=str(tmp_path), **kwargs)
    assert all(needle in str(caught.value) for needle in needles), str(caught.value)


def test_max_completion_length_on_the_command_line_wins_over_the_builtin_response_length():
    from trl_trapo import cli

    _, builtin, _ = cli.parse_args([])
    _, grpo, _ = cli.parse_args(["--max_completion_length", "16"])
    assert builtin.response_length == builtin.max_completion_length == 8  # the built-in job's own budget
    assert builtin.grpo_names_given == [] and grpo.grpo_names_given == ["max_completion_length"]
    assert grpo.response_length == grpo.max_completion_length == 16
    with pytest.raises(ValueError, match="--max_completion_length 16 and --response_length 9 disagree"):  # in flags
        cli.parse_args(["--max_completion_length", "16", "--response_length", "9"])


# ---- trainer.args changed after construction (trial 15's N33) ---------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_length", 2),  # the rollouts' generation config
        ("num_generations", 2),  # the plan's groups
        ("per_device_train_batch_size", 4),  # the plan's rows per step
        ("kl_coef", 0.5),  # the KL controller
        ("max_steps", 8),  # the plan: curriculum phases, schedules, pools (transformers alone would run 8 steps)
    ],
)
def test_a_field_read_only_at_construction_changed_before_train_is_refused(
    field, value, tmp_path, tokenizer, suite, tiny_trainer
):
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=2, save_strategy="steps", save_steps=1)
    old = getattr(trainer.args, field)
    setattr(trainer.args, field, value)
    with pytest.raises(ValueError) as refused:
        trainer.train()
    message = str(refused.value)
    assert message.startswith(f"trainer.args was changed after the trainer was built ({field}: {old!r} -> {value!r})")
    assert f"dataclasses.replace(trainer.args, {field}={value!r})" in message, message
    assert trainer.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))  # refused before anything
    setattr(trainer.args, field, old)  # set back: the trainer trains as built
    trainer.train()
    assert trainer.state.global_step == 2


def test_fields_train_reads_may_change_in_place(tmp_path, tokenizer, suite, tiny_trainer):
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=2, learning_rate=1e-3, logging_steps=1)
    trainer.args.learning_rate = 1e-1  # transformers builds the optimizer and the scheduler in train()
    trainer.args.logging_steps = 2
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [2]  # the new logging interval
    assert logged[0]["learning_rate"] > 1e-3  # the new peak: 1e-1 on the linear decay's step 2 is 5e-2


class ReadsRecorded:
    """Which fields of a `RecordingConfig` were read, by phase and by the package of the code that read them."""

    phase = "built"
    reads: dict = {}


CONFIG_FIELDS = {f.name for f in dataclasses.fields(TRAPOConfig)}


class RecordingConfig(TRAPOConfig):
    """A `TRAPOConfig` that records each read of a field in `ReadsRecorded` (module level: `training_args.bin` pickles
    it)."""

    def __getattribute__(self, name):
        if name in CONFIG_FIELDS:
            package = sys._getframe(1).f_globals.get("__name__", "").split(".")[0]
            ReadsRecorded.reads.setdefault((ReadsRecorded.phase, package), set()).add(name)
        return object.__getattribute__(self, name)


def test_the_fields_allowed_to_change_are_those_train_reads(tmp_path, tokenizer, suite, tiny_trainer):
    """How `setup_checks.LIVE_FIELDS` was derived, kept true: every field it allows to change after construction is
    read by transformers while `train()` runs (one run that evaluates, saves and logs: the fields read only in other
    runs are listed), and the fields the refusal's examples name are read by TRAPO at construction."""
    from trl_trapo.setup_checks import LIVE_FIELDS
    from trl_trapo.tasks import build_tiny_model, exact_match_reward

    ReadsRecorded.reads = {}
    ReadsRecorded.phase = "built"
    overrides = dict(max_steps=2, save_strategy="steps", save_steps=1, eval_strategy="steps", eval_steps=1)
    args = RecordingConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, **overrides})
    ReadsRecorded.phase = "construction"
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=args,
        train_dataset=suite.rl_train,
        eval_dataset=suite.eval.select(range(4)),
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    ReadsRecorded.phase = "train"
    trainer.train()
    ReadsRecorded.phase = "built"
    read_in_train = ReadsRecorded.reads.get(("train", "transformers"), set()) | ReadsRecorded.reads.get(
        ("train", "trl_trapo"), set()
    )
    elsewhere = {  # read by transformers in train() only in runs unlike this one
        "greater_is_better",  # with metric_for_best_model: which checkpoint is best
        "run_name",  # the trackers of report_to, at the start of train()
        "ignore_data_skip",  # a resumed run
        "debug",  # debug="underflow_overflow"
    }
    assert LIVE_FIELDS - elsewhere <= read_in_train, sorted(LIVE_FIELDS - elsewhere - read_in_train)
    at_construction = ReadsRecorded.reads[("construction", "trl_trapo")]
    refused = {"response_length", "num_generations", "per_device_train_batch_size", "kl_coef", "max_steps"}
    assert refused <= at_construction - LIVE_FIELDS, sorted(refused - at_construction)


def test_an_in_place_change_is_seen_and_resume_from_checkpoint_is_told_where_it_goes(tmp_path):
    from trl_trapo.setup_checks import check_args_unchanged, snapshot_args

    args = TRAPOConfig(output_dir=str(tmp_path), report_to="none", reward_weights=[1.0])
    built = snapshot_args(args)
    check_args_unchanged(args, built)  # nothing changed
    args.reward_weights[0] = 2.0  # in place: the list the trainer read at construction
    with pytest.raises(ValueError, match=r"\(reward_weights: \[1\.0\] -> \[2\.0\]\)\. This field is read once"):
        check_args_unchanged(args, built)
    args.reward_weights[0] = 1.0
    args.resume_from_checkpoint = str(tmp_path / "checkpoint-1")  # read by train()'s argument, never by the field
    with pytest.raises(ValueError, match=r"Fix: resume_from_checkpoint: pass it to train\(\) instead"):
        check_args_unchanged(args, built)
    args.learning_rate = 5e-4  # read when train() starts
    args.resume_from_checkpoint = None
    check_args_unchanged(args, built)
