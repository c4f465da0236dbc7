# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A GRPO script on TRAPO keeps GRPO's semantics (`trl_trapo.GRPOConfig`), or is told at start what differs
(`trl_trapo.grpo.grpo_notice`)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from datasets import Dataset

from trl_trapo import GRPOConfig, TRAPOConfig, TRAPOTrainer
from trl_trapo.config import GRPO_ALIASES
from trl_trapo.grpo import grpo_notice
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model


ROOT = Path(__file__).resolve().parent.parent
# the script's config, as a TRL GRPO script on a CPU machine writes it (TRL needs use_cpu / bf16 there)
SCRIPT_CONFIG = dict(
    max_steps=6,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=4,
    learning_rate=1e-3,
    report_to="none",
    save_strategy="no",
    use_cpu=True,
    bf16=False,
)
# TRAPO's deliberate differences from a TRL GRPOConfig instance: its dataloader only serves step placeholders
DELIBERATE = {"dataloader_pin_memory"}


def test_grpo_config_has_every_default_of_trls(tmp_path):
    from trl import GRPOConfig as TRLGRPOConfig

    theirs = TRLGRPOConfig(output_dir=str(tmp_path), bf16=False)  # TRL's bf16 default fails on a CPU machine
    ours = GRPOConfig(output_dir=str(tmp_path))
    shared = [f.name for f in dataclasses.fields(TRLGRPOConfig) if hasattr(ours, f.name)]
    assert {"beta", "num_iterations", "epsilon", "max_completion_length", "learning_rate"} <= set(shared)
    differ = {name: (getattr(theirs, name), getattr(ours, name)) for name in shared if name not in DELIBERATE}
    assert {name: pair for name, pair in differ.items() if pair[0] != pair[1]} == {}
    # TRAPO's own names of the same settings hold GRPO's values; TRAPO's additions to sampling are off
    assert (ours.kl_coef, ours.num_ppo_epochs, ours.cliprange, ours.response_length) == (0.0, 1, 0.2, 512)
    assert ours.exploration is False and ours.self_imitation is False
    # a value given under either name is kept, under both names; the two names disagreeing is refused
    given = GRPOConfig(output_dir=str(tmp_path), beta=0.04, num_ppo_epochs=2)
    assert (given.beta, given.kl_coef, given.num_iterations, given.num_ppo_epochs) == (0.04, 0.04, 2, 2)
    with pytest.raises(ValueError, match="beta=0.04 and kl_coef=0.1 disagree"):
        GRPOConfig(output_dir=str(tmp_path), beta=0.04, kl_coef=0.1)
    with pytest.raises(TypeError, match="epsilon_high"):
        GRPOConfig(output_dir=str(tmp_path), epsilon_high=0.28)


def run_script(config_class, trainer_class, tmp_path) -> tuple[object, list[int]]:
    """The same GRPO script under `config_class` / `trainer_class`: the completions each reward call scored during
    training (construction-time checks of the reward function excluded)."""
    scored = []

    def reward(completions, **kwargs):
        scored.append(len(completions))
        return [float(len(c) % 2) for c in completions]

    tokenizer = build_char_tokenizer()
    trainer = trainer_class(
        model=build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        args=config_class(output_dir=str(tmp_path), **SCRIPT_CONFIG),
        train_dataset=Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(32)]}),
        processing_class=tokenizer,
    )
    scored.clear()
    trainer.train()
    return trainer, scored


def test_a_grpo_script_generates_every_step_without_a_reference_as_under_trl(tmp_path, caplog):
    from trl import GRPOConfig as TRLGRPOConfig
    from trl import GRPOTrainer

    trl_trainer, trl_scored = run_script(TRLGRPOConfig, GRPOTrainer, tmp_path / "trl")
    assert trl_scored == [8] * 6 and trl_trainer.ref_model is None  # one round of 8 completions per step, no KL
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        trainer, scored = run_script(GRPOConfig, TRAPOTrainer, tmp_path / "ours")
    assert scored == trl_scored and trainer.ref_model is None and trainer.exploration is None
    assert "GRPO-style run" not in caplog.text  # nothing differs from GRPO's defaults
    # the config class renamed instead (`TRAPOConfig as GRPOConfig`): TRAPO's defaults, and a notice saying so
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        trainer, scored = run_script(TRAPOConfig, TRAPOTrainer, tmp_path / "renamed")
    assert scored == [8, 8]  # a round every num_ppo_epochs=4 steps
    notice = [r.getMessage() for r in caplog.records if "GRPO-style run" in r.getMessage()]
    assert len(notice) == 1 and "num_ppo_epochs=4" in notice[0] and "num_iterations=1" in notice[0]
    guide = ROOT.joinpath("docs", "agents.md").read_text()
    documented = guide.split("```text\nGRPO-style run: ", 1)[1].split(" ...\n```", 1)[0].removesuffix(";")
    assert notice[0].startswith(f"GRPO-style run: {documented}")  # docs/agents.md quotes it as the trainer says it


TRL_PER_ROUND = (
    "completions/min_length",
    "completions/max_length",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
)


def test_a_grpo_scripts_logs_have_trls_keys_with_trls_values(tmp_path):
    """Trial 13's N01: the same GRPO script under TRL's GRPOTrainer and ours, with a reward that depends only on a
    completion's place in its round (a flat group, then a group of 0 1 0 1): at every step both log each of TRL's
    keys, and the same values — `reward`, `reward_std`, `frac_reward_zero_std`, `rewards/<name>/std` equal (and
    the hand values), the length statistics are each trainer's own completions' (the ids its reward function got)
    by one hand computation, `num_tokens` grows by the round's prompt and completion tokens, the clip ratios are 0
    (one update per round: the ratio is 1), `entropy` is nats per token (ours: `policy/entropy_avg`). Before: 17 of
    these keys were never logged (a callback reading `logs["reward"]` raised KeyError)."""
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLGRPOConfig
    from trl import GRPOTrainer

    tokenizer = build_char_tokenizer()
    prompts = [f"{i:02d}+{i:02d}=" for i in range(32)]  # one length: each prompt is 6 tokens under both trainers
    prompt_tokens = len(tokenizer(prompts[0])["input_ids"])

    class Keys(TrainerCallback):
        def __init__(self):
            self.seen = set()

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.seen |= set(logs or {})

    def run(config_class, trainer_class, where):
        rounds = []

        def positional_reward(completions, completion_ids, **kwargs):
            rounds.append([list(ids) for ids in completion_ids])
            return [1.0 if (j // 4) % 2 == 0 else float(j % 2) for j in range(len(completions))]

        callback = Keys()
        trainer = trainer_class(
            model=build_tiny_model(tokenizer, seed=0),
            reward_funcs=positional_reward,
            args=config_class(output_dir=str(where), logging_steps=1, **{**SCRIPT_CONFIG, "max_completion_length": 6}),
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            callbacks=[callback],
        )
        rounds.clear()  # construction-time checks of the reward function
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
        return logs, rounds, callback.seen

    theirs, their_rounds, their_keys = run(TRLGRPOConfig, GRPOTrainer, tmp_path / "trl")
    ours, our_rounds, our_keys = run(GRPOConfig, TRAPOTrainer, tmp_path / "ours")
    assert len(theirs) == len(ours) == len(their_rounds) == len(our_rounds) == 6  # one round of 8 per step
    assert their_keys - our_keys == set()  # every key a callback finds under TRL, it finds under ours
    rewards = [1.0] * 4 + [0.0, 1.0, 0.0, 1.0]
    std = (sum((r - 0.75) ** 2 for r in rewards) / 7) ** 0.5
    by_hand = {"reward": 0.75, "reward_std": std, "frac_reward_zero_std": 0.5, "rewards/positional_reward/std": std}

    def lengths_by_hand(completions: list[list[int]]) -> dict[str, float]:
        lengths = [len(ids) for ids in completions]
        ended = [len(ids) for ids in completions if ids and ids[-1] == tokenizer.eos_token_id] or [0]
        return dict(zip(TRL_PER_ROUND, (min(lengths), max(lengths), sum(ended) / len(ended), min(ended), max(ended))))

    for logs, rounds in ((theirs, their_rounds), (ours, our_rounds)):
        tokens = 0
        for log, completions in zip(logs, rounds):
            assert {key: log[key] for key in by_hand} == pytest.approx(by_hand, abs=1e-6)
            assert {key: log[key] for key in TRL_PER_ROUND} == pytest.approx(lengths_by_hand(completions))
            tokens += len(completions) * prompt_tokens + sum(len(ids) for ids in completions)
            assert log["num_tokens"] == tokens
            for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
                assert log[key] == 0.0, key
            assert log["clip_ratio/low_min"] == log["clip_ratio/high_max"] == 0.0
            assert 0.0 < log["step_time"] < 60.0
    assert any(lengths_by_hand(c)["completions/min_terminated_length"] > 0 for c in our_rounds)  # some stopped
    for mine, trls in zip(ours, theirs):
        assert mine["entropy"] == mine["policy/entropy_avg"]
        assert mine["entropy"] == pytest.approx(trls["entropy"], rel=0.05)  # per token, one model: near log(V)


@pytest.mark.parametrize(
    ("config_class", "values", "expected"),
    [
        (TRAPOConfig, {}, None),  # no GRPO name: a TRAPO user, no notice
        (
            TRAPOConfig,
            {"max_completion_length": 16},
            [
                "kl_coef=0.05",
                "GRPO: beta=0.0",
                "num_ppo_epochs=4",
                "GRPO: num_iterations=1",
                "learning_rate=5e-05",
                "GRPO: learning_rate=1e-06",
                "disable_dropout=True",
                "exploration=False",
                "KL estimator k2 in the loss",
                "kl_estimator='k3'",
                "from trl_trapo import GRPOConfig",
            ],
        ),
        (TRAPOConfig, {"beta": 0.05, "num_iterations": 1, "exploration": False}, ["learning_rate=5e-05"]),
        (
            TRAPOConfig,
            dict(beta=0.0, num_iterations=1, max_completion_length=512, learning_rate=1e-6, disable_dropout=False)
            | {"exploration": False},
            None,  # every GRPO default given: nothing to say
        ),
        (
            TRAPOConfig,
            dict(beta=0.0, num_iterations=1, max_completion_length=512, learning_rate=1e-6, disable_dropout=False),
            ["exploration=False"],  # every GRPO default given but one
        ),
        (GRPOConfig, {}, None),
        (GRPOConfig, {"beta": 0.04}, ["KL estimator k2 in the loss (GRPO: k3"]),
        (GRPOConfig, {"beta": 0.04, "kl_estimator": "k2"}, None),  # an estimator the user chose is theirs
    ],
)
def test_the_notice_lists_each_default_that_differs_from_grpos_and_the_value_for_grpos(
    tmp_path, config_class, values, expected
):
    config = config_class(output_dir=str(tmp_path), **values)
    exploration = config.exploration is None  # what the trainer resolves for a critic-free run on HF generate
    notice = grpo_notice(config, exploration, tools=False, kl_estimator="k2", kl_penalty="loss")
    if expected is None:
        assert notice is None
        return
    assert notice is not None and "\n" not in notice
    for needle in expected:
        assert needle in notice, needle
    if "beta" in values:  # given under GRPO's name: the user's choice, not listed
        assert "kl_coef=" not in notice
    assert "max_tool_calling_iterations" not in notice  # no tools in this run
    tools = grpo_notice(TRAPOConfig(output_dir=str(tmp_path), beta=0.0), False, True, "k2", "loss")
    assert "max_tool_calling_iterations=4" in tools and "GRPO: max_tool_calling_iterations=None" in tools


def test_grpo_names_read_the_values_in_effect_and_the_notice_names_exactly_those_given(tmp_path):
    """After construction each GRPO name reads TRAPO's value in effect (before: None unless given, so a TRL script
    reading `args.max_completion_length` got None under `TRAPOConfig`). Which names were given is recorded at
    construction (`grpo_names_given`), not read from None-ness, so the notice names exactly them, on the config and on
    each copy the trainer or a script makes (`dataclasses.replace`, a `to_dict()` rebuild, a pickle, a YAML recipe)."""
    import json
    import pickle

    from trl_trapo import cli

    plain = TRAPOConfig(output_dir=str(tmp_path), response_length=40, report_to="none")
    read = (plain.max_completion_length, plain.beta, plain.epsilon, plain.num_iterations)
    assert read == (plain.response_length, plain.kl_coef, plain.cliprange, plain.num_ppo_epochs) == (40, 0.05, 0.2, 4)
    given = TRAPOConfig(output_dir=str(tmp_path), beta=0.05, max_completion_length=16, report_to="none")
    assert (given.response_length, given.max_completion_length, given.beta) == (16, 16, 0.05)

    def rebuilt(config):  # a to_dict() rebuild, from the JSON a tracker keeps
        return TRAPOConfig(**json.loads(config.to_json_string()))

    def source(config):
        notice = grpo_notice(config, False, tools=False, kl_estimator="k2", kl_penalty="loss")
        return notice and notice.split(" differs from", 1)[0]

    for config, names in [(plain, []), (given, ["max_completion_length", "beta"])]:
        copies = [
            config,
            dataclasses.replace(config, max_steps=3),
            rebuilt(config),
            pickle.loads(pickle.dumps(config)),
        ]
        for copy in copies:
            assert copy.grpo_names_given == names
            assert copy.max_completion_length == copy.response_length == config.response_length
            expected = f"GRPO-style run: TRAPOConfig with GRPO's names ({', '.join(names)})" if names else None
            assert source(copy) == expected
    # a copy that changes TRAPO's name: the GRPO name follows it; one that changes a GRPO name: it sets TRAPO's
    assert dataclasses.replace(plain, response_length=64).max_completion_length == 64
    changed = dataclasses.replace(plain, num_iterations=1)
    assert (changed.num_ppo_epochs, changed.grpo_names_given) == (1, ["num_iterations"])
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text("beta: 0.0\nnum_iterations: 1\nuse_cpu: true\nreport_to: none\n")
    _, config, _ = cli.parse_args(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert (config.beta, config.kl_coef, config.num_iterations, config.max_completion_length) == (0.0, 0.0, 1, 8)
    assert config.grpo_names_given == ["beta", "num_iterations"]
    with pytest.raises(ValueError, match=r"grpo_names_given=\['beta', 'top_k'\] is invalid: \['top_k'\]"):
        TRAPOConfig(output_dir=str(tmp_path), grpo_names_given=["beta", "top_k"])


NEW_VALUES = {"max_completion_length": 32, "beta": 0.1, "epsilon": 0.3, "num_iterations": 2}


@pytest.mark.parametrize(("alias", "target"), list(GRPO_ALIASES.items()))
@pytest.mark.parametrize("cls", [GRPOConfig, TRAPOConfig])
def test_a_copy_that_changes_one_name_of_a_setting_takes_it(tmp_path, cls, alias, target):
    """Trial 13's N24: `dataclasses.replace(args, max_completion_length=32)` on a config built with GRPO's names was
    refused ("max_completion_length=32 and response_length=64 disagree ... Give only one of them"): the user gave one;
    `replace()` copied the other, which held the old value. The value both held is recorded at construction
    (`grpo_values_built`), so a copy that changes either name takes it, whichever name built the config; one that
    changes both, to different values, is refused with the call that works."""
    import json

    built_with = {"max_completion_length": 64, "beta": 0.04, "epsilon": 0.25, "num_iterations": 3}
    by_alias = cls(output_dir=str(tmp_path), report_to="none", **built_with)
    by_target = cls(output_dir=str(tmp_path), report_to="none", **{GRPO_ALIASES[a]: v for a, v in built_with.items()})
    new = NEW_VALUES[alias]
    for args in (by_alias, by_target):
        for name in (alias, target):
            copy = dataclasses.replace(args, **{name: new})
            assert getattr(copy, alias) == getattr(copy, target) == new, (name, args.grpo_names_given)
            assert set(args.grpo_names_given) <= set(copy.grpo_names_given)
            assert (alias in copy.grpo_names_given) == (alias in args.grpo_names_given or name == alias)
            values = json.loads(args.to_json_string())  # a rebuild from the logged config with one key edited
            assert getattr(cls(**{**values, name: new}), target) == new
        with pytest.raises(ValueError) as info:
            dataclasses.replace(args, **{alias: new, target: built_with[alias] + 1})
        message = str(info.value)
        assert f"{alias}={new!r} and {target}={built_with[alias] + 1!r} disagree" in message, message
        assert f"a copy of one built with {target}={built_with[alias]!r}" in message, message
        assert f"`dataclasses.replace(args, {alias}={new!r}, {target}={new!r})`" in message, message


def construction_notes(tmp_path, caplog, config: dict, prompts: int, marker: str, **kwargs) -> list[str]:
    """The warnings holding `marker` that building a GRPO script's trainer (`GRPOConfig(**config)`, a zero reward,
    `prompts` RL prompts, `kwargs` to the trainer) logs."""
    tokenizer = build_char_tokenizer()
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        TRAPOTrainer(
            model=build_tiny_model(tokenizer, seed=0),
            reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
            args=GRPOConfig(output_dir=str(tmp_path), **config),
            train_dataset=Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(prompts)]}),
            processing_class=tokenizer,
            **kwargs,
        )
    return [r.getMessage() for r in caplog.records if marker in r.getMessage()]


@pytest.mark.parametrize(
    ("batch", "group", "said"),
    [
        (6, 4, "A generation round is 8 completions (2 prompts x num_generations=4), but an optimizer step takes 6 RL "
         "rows (per_device_train_batch_size=6): the other 2 of each round are trained at later steps"),
        (2, 8, "A generation round is 8 completions (1 prompt x num_generations=8), but an optimizer step takes 2 RL "
         "rows (per_device_train_batch_size=2): the other 6 of each round are trained at later steps"),
        (8, 4, None),
    ],
)  # fmt: skip
def test_rounds_that_do_not_fit_whole_steps_are_said_once_at_construction(tmp_path, caplog, batch, group, said):
    """Trial 11's N46: per_device_train_batch_size not a multiple of num_generations (6 with 4; 2 with 8) trained
    without a word, although a round then feeds later steps too (samples of an older policy), which TRL's GRPOConfig
    refuses. The split is TRAPO's replay design (advantages over whole groups first), so it is warned about once at
    construction, naming the fields and the settings that make rounds fit; a fitting batch says nothing."""
    config = dict(SCRIPT_CONFIG, per_device_train_batch_size=batch, num_generations=group, max_steps=1)
    notes = construction_notes(tmp_path, caplog, config, 32, "generation round is")
    if said is None:
        assert notes == []
        return
    assert len(notes) == 1 and notes[0].startswith(said), notes
    assert "make the RL rows per step a multiple of num_generations: e.g. per_device_train_batch_size=8" in notes[0]


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (dict(gradient_accumulation_steps=50, max_steps=1),
         "One optimizer step takes 400 rows (per_device_train_batch_size=8 x gradient_accumulation_steps=50 x world "
         "size 1), more than train_dataset holds (16 prompts x num_generations=4 completions = 64 rows): each prompt "
         "is rolled out ~6.2 times within one update (~25 completions of it), where TRL's GRPOTrainer would train no "
         "step at all. The run trains 1 optimizer step, each ~6.25 epochs as the logged epoch counts them. For each "
         "prompt at most once per update, use e.g. gradient_accumulation_steps=8, or give train_dataset more "
         "prompts."),
        (dict(gradient_accumulation_steps=10, max_steps=-1, num_train_epochs=1),
         "One optimizer step takes 80 rows (per_device_train_batch_size=8 x gradient_accumulation_steps=10 x world "
         "size 1), more than train_dataset holds (16 prompts x num_generations=4 completions = 64 rows): each prompt "
         "is rolled out ~1.2 times within one update (~5 completions of it), where TRL's GRPOTrainer would train no "
         "step at all. The run trains 1 optimizer step,"),
        (dict(gradient_accumulation_steps=8, max_steps=1), None),  # 64 rows: each prompt once per update
    ],
    ids=["N08", "planned-from-epochs", "one-pass"],
)  # fmt: skip
def test_a_step_over_more_rows_than_the_prompts_is_said_once_at_construction(tmp_path, caplog, settings, said):
    """Trial 13's N08: 16 RL prompts with per_device_train_batch_size=8 and gradient_accumulation_steps=50 (400 RL
    rows per optimizer step: each prompt rolled out ~6 times within one update) trained one step without a word, where
    TRL's GRPOTrainer trains none ("There seems not to be a single sample in your epoch_iterator"). Said once at
    construction, naming the batch settings, the world size, the dataset's size and a fit; one pass says nothing."""
    notes = construction_notes(tmp_path, caplog, dict(SCRIPT_CONFIG, **settings), 16, "One optimizer step takes")
    if said is None:
        assert notes == []
        return
    assert len(notes) == 1 and notes[0].startswith(said), notes


def test_a_step_over_more_sft_rows_than_the_data_is_said_too(tmp_path, caplog):
    """N08 in a run sized by its demonstrations (no RL prompts): each row is trained several times in one update."""
    tokenizer = build_char_tokenizer()
    rows = Dataset.from_dict(
        {"prompt": [f"{i}+{i}=" for i in range(10)], "completion": [f"{2 * i}" for i in range(10)]}
    )
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        TRAPOTrainer(
            model=build_tiny_model(tokenizer, seed=0),
            args=TRAPOConfig(output_dir=str(tmp_path), **dict(SCRIPT_CONFIG, gradient_accumulation_steps=5)),
            sft_dataset=rows,
            processing_class=tokenizer,
        )
    notes = [r.getMessage() for r in caplog.records if "One optimizer step takes" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith(
        "One optimizer step takes 40 rows (per_device_train_batch_size=8 x gradient_accumulation_steps=5 x world size "
        "1), more than sft_dataset holds (10 rows): each row is trained ~4.0 times within one update. The run trains "
        "6 optimizer steps, each ~4.00 epochs as the logged epoch counts them. For each row at most once per update, "
        "use e.g. gradient_accumulation_steps=1, or give sft_dataset more rows."
    ), notes


def test_a_rollout_func_rounds_split_over_steps_are_said_too(tmp_path, caplog):
    """TRL's rollout_func source sizes its rounds as the default source does (whole groups of num_generations): the
    same warning (trial 11's N46, sibling)."""
    config = dict(SCRIPT_CONFIG, per_device_train_batch_size=6, num_generations=4, max_steps=1)
    notes = construction_notes(
        tmp_path, caplog, config, 32, "generation round is", rollout_func=lambda prompts, trainer: {}
    )
    assert any("A generation round is 8 completions (2 prompts x num_generations=4)" in note for note in notes), notes


def test_a_mixed_run_says_how_its_rounds_map_to_steps(tmp_path, tokenizer, suite, tiny_trainer, caplog):
    """Trial 11's C22 (N46 from the command line, built-in mode: three objectives): a step's RL rows follow the
    objectives' shares there, so no batch size makes rounds end at steps; one info line says how they map (the
    RL-only warning, whose fix is a batch size, would mislead)."""
    with caplog.at_level(logging.INFO, logger="trl_trapo"):
        tiny_trainer(tmp_path, tokenizer, suite, num_generations=3)
    notes = [r for r in caplog.records if r.getMessage().startswith("Generation rounds: each is")]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO
    assert "whole groups of num_generations=3" in notes[0].getMessage() and "curriculum/*" in notes[0].getMessage()
    assert "generation round is" not in caplog.text  # the RL-only warning
