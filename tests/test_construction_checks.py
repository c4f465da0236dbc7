# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Everything checkable is checked when the trainer (or its config) is built, before any training: eval prompts,
streaming SFT data, the best-model metric, and every `TrainingArguments` field whose hook TRAPO replaces — each one
works or is refused by name, never silently ignored."""

from __future__ import annotations

import pytest
from datasets import Dataset

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.tasks import build_tiny_model, exact_match_reward


def build(tmp_path, tokenizer, suite, tiny_config, eval_dataset=None, sft_dataset=None, **overrides):
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, **overrides),
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft if sft_dataset is None else sft_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )


def test_eval_prompts_longer_than_max_prompt_length_fail_at_construction(tmp_path, tokenizer, suite, tiny_config):
    long_eval = Dataset.from_dict({"prompt": ["rev abc=", "x" * 40], "answer": ["cba", "y"]})
    with pytest.raises(ValueError, match=r"prompts of `eval_dataset` are longer than max_prompt_length=16"):
        build(tmp_path, tokenizer, suite, tiny_config, eval_dataset=long_eval)
    with pytest.raises(ValueError, match=r"eval_dataset\['held_out'\]"):
        build(tmp_path, tokenizer, suite, tiny_config, eval_dataset={"ok": suite.eval, "held_out": long_eval})


def test_eval_prompts_that_overflow_the_context_name_the_fix(tmp_path, tokenizer, suite, tiny_config):
    context = build_tiny_model(tokenizer).config.max_position_embeddings
    eval_dataset = Dataset.from_dict({"prompt": ["y" * (context - 2)], "answer": ["z"]})  # + 4 new tokens > context
    with pytest.raises(ValueError, match=r"Lower response_length to at most 2"):
        build(tmp_path, tokenizer, suite, tiny_config, eval_dataset=eval_dataset, max_prompt_length=context)


def test_a_streaming_sft_dataset_is_refused_by_name(tmp_path, tokenizer, suite, tiny_config):
    with pytest.raises(ValueError, match="`sft_dataset` is an IterableDataset"):
        build(tmp_path, tokenizer, suite, tiny_config, sft_dataset=suite.sft.to_iterable_dataset())


def test_load_best_model_at_end_needs_a_metric_trapo_logs(tmp_path, tokenizer, suite, tiny_config):
    with pytest.raises(ValueError, match=r"metric_for_best_model='loss'.*metric_for_best_model='eval_reward'"):
        build(
            tmp_path,
            tokenizer,
            suite,
            tiny_config,
            eval_dataset=suite.eval,
            load_best_model_at_end=True,
            eval_strategy="steps",
            save_strategy="steps",
        )
    trainer = build(
        tmp_path,
        tokenizer,
        suite,
        tiny_config,
        eval_dataset=suite.eval,
        load_best_model_at_end=True,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        metric_for_best_model="eval_reward",
        greater_is_better=True,
    )
    trainer.train()  # evaluates, saves and compares checkpoints by eval_reward, then loads the best one
    assert trainer.state.best_metric is not None and trainer.state.best_model_checkpoint is not None


@pytest.mark.parametrize(
    "field, value",
    [
        ("train_sampling_strategy", "group_by_length"),
        ("length_column_name", "n_tokens"),
        ("dataloader_drop_last", True),
        ("dataloader_num_workers", 2),
        ("label_smoothing_factor", 0.1),
        ("average_tokens_across_devices", False),
        ("auto_find_batch_size", True),
        ("prediction_loss_only", True),
        ("eval_accumulation_steps", 2),
        ("batch_eval_metrics", True),
        ("eval_do_concat_batches", False),
        ("include_for_metrics", ["inputs"]),
        ("ignore_data_skip", True),
        ("remove_unused_columns", True),
        ("label_names", ["labels"]),
    ],
)
def test_trainer_fields_trapo_bypasses_are_refused_by_name(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"TRAPOConfig\.{field}=.*TRAPO does not use it"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", **{field: value})


def prompt_order(trainer, n: int = 12) -> list[str]:
    return [trainer._rl_dataset[i]["prompt"] for i in trainer.memory_pool.prompt_sampler.take(n)]


def test_sequential_sampling_serves_rl_prompts_in_dataset_order(tmp_path, tokenizer, suite, tiny_config):
    in_order = list(suite.rl_train["prompt"][:12])
    for overrides in ({"shuffle_dataset": False}, {"train_sampling_strategy": "sequential"}):
        assert prompt_order(build(tmp_path, tokenizer, suite, tiny_config, **overrides)) == in_order
    assert prompt_order(build(tmp_path, tokenizer, suite, tiny_config)) != in_order  # shuffled by default


def test_data_seed_seeds_the_samplers_and_nothing_else(tmp_path, tokenizer, suite, tiny_config):
    default = build(tmp_path, tokenizer, suite, tiny_config)
    same = build(tmp_path, tokenizer, suite, tiny_config, data_seed=0)  # seed=0 in the tiny config
    other = build(tmp_path, tokenizer, suite, tiny_config, data_seed=1)
    assert prompt_order(default) == prompt_order(same) != prompt_order(other)
    assert default.memory_pool.sft_pool.take(8)[0].input_ids.tolist() != [] and (
        [r.pool_index for r in default.memory_pool.sft_pool.take(8)]
        != [r.pool_index for r in other.memory_pool.sft_pool.take(8)]
    )


@pytest.mark.parametrize("alone", [True, False])
def test_a_train_prompt_beyond_the_context_says_which_fix_applies(tmp_path, tokenizer, suite, tiny_config, alone):
    context = build_tiny_model(tokenizer).config.max_position_embeddings
    length = context + 4 if alone else context - 2  # alone: no response_length can help
    prompts = Dataset.from_dict({"prompt": ["rev abc=", "y" * length], "answer": ["cba", "z"]})
    message = "no response_length can help: remove prompts longer than" if alone else "at most 2, or remove prompts"
    with pytest.raises(ValueError, match=message):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path, max_prompt_length=context + 8),
            train_dataset=prompts,
            processing_class=tokenizer,
        )


def test_kl_estimator_auto_is_the_unbiased_one_for_its_placement(tmp_path, tokenizer, suite, tiny_config, caplog):
    without_critic = build(tmp_path, tokenizer, suite, tiny_config, kl_coef=0.1)
    assert (without_critic.kl_penalty, without_critic.kl_estimator) == ("loss", "k2")
    reward_side = build(tmp_path, tokenizer, suite, tiny_config, kl_coef=0.1, kl_penalty="reward")
    assert reward_side.kl_estimator == "k1"
    with caplog.at_level("WARNING", logger="trl_trapo.trainer"):
        build(tmp_path, tokenizer, suite, tiny_config, kl_coef=0.1, kl_estimator="k3")
    assert any("reverse KL" in r.getMessage() and "'auto'" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("disable_tqdm", [False, True])
def test_evaluation_shows_progress_and_logs_what_it_generated(
    tmp_path, tokenizer, suite, tiny_config, capsys, caplog, disable_tqdm
):
    trainer = build(tmp_path, tokenizer, suite, tiny_config, eval_dataset=suite.eval, disable_tqdm=disable_tqdm)
    capsys.readouterr()
    with caplog.at_level("INFO", logger="trl_trapo.evaluation"):
        trainer.evaluate()
    bar = "Evaluating eval" in capsys.readouterr().err
    assert bar == (not disable_tqdm)
    assert any(f"{len(suite.eval)} prompts" in r.getMessage() and "tokens" in r.getMessage() for r in caplog.records)
