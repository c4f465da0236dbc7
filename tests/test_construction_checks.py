# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Everything checkable is checked when the trainer (or its config) is built, before any training: eval prompts,
streaming SFT data, the best-model metric, every `TrainingArguments` field whose hook TRAPO replaces, and mixed
precision the machine cannot run — each one works or is refused by name, never silently ignored."""

from __future__ import annotations

import re

import pytest
import torch
from datasets import Dataset, IterableDatasetDict
from transformers import AutoModelForSequenceClassification

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.evaluation import eval_metric_names
from trl_trapo.tasks import build_tiny_model, exact_match_reward


def build(
    tmp_path, tokenizer, suite, tiny_config, eval_dataset=None, sft_dataset=None, train_dataset=None, **overrides
):
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, **overrides),
        train_dataset=suite.rl_train if train_dataset is None else train_dataset,
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
    with pytest.raises(ValueError, match=r"lower response_length to at most 2, or remove prompts longer than 252"):
        build(tmp_path, tokenizer, suite, tiny_config, eval_dataset=eval_dataset, max_prompt_length=context)


def test_prompts_no_max_prompt_length_could_fit_are_said_at_the_first_refusal(tmp_path, tokenizer, suite, tiny_config):
    """Trial 13's C10: the first refusal said to raise max_prompt_length; doing so met a second refusal that the
    model's context cannot hold the prompts at all. The first one says it at once, with the numbers."""
    context = build_tiny_model(tokenizer).config.max_position_embeddings  # 256; response_length=4: room for 252
    prompts = ["rev ab=", "x" * 100 + "=", "y" * (context + 20) + "="]
    rl = Dataset.from_dict({"prompt": prompts, "answer": ["ba", "1", "2"]})
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, suite, tiny_config, train_dataset=rl)
    message = str(raised.value)
    for needle in [
        "2 prompts of `train_dataset` are longer than max_prompt_length=16 tokens (longest: ",
        "raising max_prompt_length cannot fit them all: the model's context of 256 positions leaves at most 252 "
        "tokens for a prompt beside response_length=4 new tokens, and 1 prompt is longer than that",
        "filter out the prompts longer than 252 tokens and set max_prompt_length to at most 252",
        "a model with a longer context",
    ]:
        assert needle in message, (needle, message)
    # prompts the context can hold: raising max_prompt_length is the fix, as before
    fits = Dataset.from_dict({"prompt": prompts[:2], "answer": ["ba", "1"]})
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, suite, tiny_config, train_dataset=fits)
    assert "Raise `max_prompt_length`" in str(raised.value) and "cannot" not in str(raised.value)


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


def test_save_strategy_best_names_the_metrics_trapo_logs(tmp_path, tokenizer, suite, tiny_config):
    """`--save_strategy best` without `--metric_for_best_model` got transformers' text, which does not say which
    metrics TRAPO logs (trial 8's JC29): the config refuses it naming them; with a metric TRAPO does not log for
    the eval data, the trainer refuses it at construction (not a KeyError at the first evaluation), as it does for
    `load_best_model_at_end`."""
    with pytest.raises(ValueError, match=r"save_strategy='best' needs metric_for_best_model.*'eval_reward'"):
        tiny_config(tmp_path, save_strategy="best", eval_strategy="steps", eval_steps=2)
    with pytest.raises(
        ValueError, match=r"metric_for_best_model='eval_accuracy' is not a metric evaluate\(\) returns "
    ):
        build(
            tmp_path,
            tokenizer,
            suite,
            tiny_config,
            eval_dataset=suite.eval,
            save_strategy="best",
            metric_for_best_model="eval_accuracy",
            eval_strategy="steps",
            eval_steps=2,
        )


def test_generate_completions_without_eval_prompts_is_refused_as_evaluate_is(tmp_path, tokenizer, suite, tiny_config):
    """`trainer.generate_completions()` without an eval dataset returned `[]` without a word while `evaluate()`
    refused the same case (trial 8's EV02): both refuse it, naming `eval_dataset`; eval data without prompts too."""
    trainer = build(tmp_path, tokenizer, suite, tiny_config)
    with pytest.raises(ValueError, match=r"No `eval_dataset`"):
        trainer.evaluate()
    with pytest.raises(
        ValueError, match=r"generate_completions\(\) completes the eval prompts, and there is no `eval_"
    ):
        trainer.generate_completions()
    assert trainer.generate_completions(sampling=True) == []  # during training: nothing to show, no error
    texts = Dataset.from_dict({"text": ["abc abc", "cba cba"]})
    trainer = build(tmp_path, tokenizer, suite, tiny_config, eval_dataset=texts)
    with pytest.raises(ValueError, match=r"its columns are \['text'\], with no `prompt`"):
        trainer.generate_completions()


def test_generate_completions_completes_the_dataset_passed_and_refuses_one_taken_as_sampling(
    tmp_path, tokenizer, suite, tiny_config
):
    """Trial 14's N25: `generate_completions(my_dataset)` took the dataset as `sampling` (truthy): `[]` without a word
    on a trainer without an eval set, the eval set's completions on one with it. A non-bool `sampling` is a TypeError
    naming `dataset=`; `dataset=` completes exactly its rows (as `evaluate(ds)` takes rows), checked as evaluate
    checks them; rows without prompts are refused even with `sampling=True`."""
    mine = Dataset.from_dict({"prompt": ["rev ab=", "nxt ab="], "answer": ["ba", "bc"]})
    for eval_dataset in (None, suite.eval):
        trainer = build(tmp_path, tokenizer, suite, tiny_config, eval_dataset=eval_dataset)
        with pytest.raises(
            TypeError, match=r"takes a bool .* got a Dataset.*generate_completions\(dataset=my_dataset\)"
        ):
            trainer.generate_completions(mine)
        table = trainer.generate_completions(dataset=mine)
        assert [row["prompt"] for row in table] == ["rev ab=", "nxt ab="]
        assert set(table[0]) == {"prompt", "completion", "score"}
        assert [row["prompt"] for row in trainer.generate_completions(True, mine)] == ["rev ab=", "nxt ab="]
    texts = Dataset.from_dict({"text": ["abc abc", "cba cba"]})
    with pytest.raises(ValueError, match=r"and `dataset` has no prompts: its columns are \['text'\]"):
        trainer.generate_completions(sampling=True, dataset=texts)
    with pytest.raises(ValueError, match=r"generate_completions\(dataset='held'\): a name selects one of the trainer"):
        trainer.generate_completions(dataset="held")


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


def test_a_response_length_beyond_the_context_is_told_to_shrink_never_a_negative_length(
    tmp_path, tokenizer, tiny_config
):
    """`response_length=300` on a 256-position model said "remove prompts longer than -44 tokens"; the fix now names
    only lengths that can work, through the trainer and for every case of the message's function."""
    import re
    from types import SimpleNamespace

    prompts = Dataset.from_dict({"prompt": ["rev abc="], "answer": ["cba"]})  # 9 tokens with the BOS
    with pytest.raises(ValueError) as caught:
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path, response_length=300),
            train_dataset=prompts,
            processing_class=tokenizer,
        )
    assert re.search(r"response_length=300 .*context of 256 positions: response_length alone leaves no room for a "
                     r"prompt: lower response_length to at most 24\d\.$", str(caught.value)), caught.value  # fmt: skip
    from trl_trapo.data import context_overflow_message

    cases = [  # (longest prompt, response_length) on 256 positions -> the fix
        ((250, 10), "lower response_length to at most 6, or remove prompts longer than 246 tokens."),
        ((10, 300), "response_length alone leaves no room for a prompt: lower response_length to at most 246."),
        ((260, 10), "no response_length can help: remove prompts longer than 246 tokens (max_prompt_length=512"),
        ((260, 256), "lower response_length below 256 and remove the prompts longer than what it leaves (e.g. "
                     "response_length=128 and prompts of at most 128 tokens"),
    ]  # fmt: skip
    for (longest, response_length), fix in cases:
        args = SimpleNamespace(response_length=response_length, max_prompt_length=512)
        message = context_overflow_message("train_dataset", longest, args, 256)
        assert fix in message and not re.search(r"(?<![\w=])-\d", message), message


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


# ---------------------------------------------------------------------------------------------------------------------
# Every dataset role x {Dataset, IterableDataset, DatasetDict, dict}: works, or is refused at construction by name
# ---------------------------------------------------------------------------------------------------------------------
def streaming(dataset):
    return dataset.to_iterable_dataset()


def splits(dataset):
    from datasets import DatasetDict

    return DatasetDict({"train": dataset})


@pytest.mark.parametrize(
    ("role", "wrap", "message"),
    [
        ("eval_dataset", "streaming_text", r"`eval_dataset` is an IterableDataset \(streaming\).*Dataset\.from_list"),
        ("eval_dataset", "streaming_dict", r"`eval_dataset\['held'\]` is an IterableDataset"),
        ("eval_dataset", "list", r"`eval_dataset` is a list, not a `datasets.Dataset`"),
        ("train_dataset", "splits", r"`train_dataset` is a DatasetDict with splits \['train'\]: pass one split"),
        ("sft_dataset", "splits", r"`sft_dataset` is a DatasetDict with splits \['train'\]: pass one split"),
        ("pretrain_dataset", "splits", r"`pretrain_dataset` is a DatasetDict with splits \['train'\]"),
        ("pretrain_dataset", "streaming_splits", r"`pretrain_dataset` is a IterableDatasetDict with splits"),
        ("sft_dataset", "list", r"`sft_dataset` is a list, not a `datasets.Dataset`"),
        # PX67: a dict of columns was read as splits, and the fix (`dataset['text']`) was a list of strings
        ("pretrain_dataset", "columns", r"`pretrain_dataset` is a dict of columns \['text'\].*Dataset\.from_dict"),
        ("eval_dataset", "columns", r"`eval_dataset` is a dict of columns \['text'\].*Dataset\.from_dict"),
        ("sft_dataset", "columns", r"`sft_dataset` is a dict of columns \['prompt', .*Dataset\.from_dict"),
    ],
)
def test_dataset_objects_that_cannot_work_are_refused_at_construction(
    tmp_path, tokenizer, suite, tiny_config, role, wrap, message
):
    data = {"train_dataset": suite.rl_train, "sft_dataset": suite.sft, "pretrain_dataset": suite.pretrain}
    source = suite.pretrain if role == "eval_dataset" else data[role]
    data[role] = {
        "streaming_text": lambda: streaming(suite.pretrain),
        "streaming_dict": lambda: {"prompts": suite.eval, "held": streaming(suite.pretrain)},
        "list": lambda: source.to_list(),
        "columns": lambda: source.to_dict(),
        "splits": lambda: splits(source),
        "streaming_splits": lambda: IterableDatasetDict({"train": streaming(source)}),
    }[wrap]()
    with pytest.raises(ValueError, match=message):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path),
            processing_class=tokenizer,
            **data,
        )


def test_a_dataframe_is_told_the_constructor_datasets_has_for_it():
    """Trial 11's N02: a pandas DataFrame as `train_dataset` was told `Dataset.from_list(rows)`; `datasets` has
    `Dataset.from_pandas` for it."""
    import pandas

    from trl_trapo.data import check_dataset_object

    with pytest.raises(ValueError, match=r"`train_dataset` is a DataFrame, .*`Dataset\.from_pandas\(frame\)`"):
        check_dataset_object(pandas.DataFrame({"prompt": ["1+1="]}), "train_dataset")


def test_evaluate_refuses_a_streaming_dataset_given_to_it_by_name(tmp_path, tokenizer, suite, tiny_config):
    trainer = build(tmp_path, tokenizer, suite, tiny_config)
    with pytest.raises(ValueError, match=r"`eval_dataset` is an IterableDataset"):
        trainer.evaluate(streaming(suite.pretrain))


def test_evaluate_takes_a_key_of_the_trainers_eval_dict_as_transformers_does(tmp_path, tokenizer, suite, tiny_config):
    """PX30: `evaluate(eval_dataset="hard")` (transformers' Trainer API for a dict of eval sets) was refused as "a str,
    not a `datasets.Dataset`", and an unknown key got the same text instead of the keys."""
    hard = suite.eval.select([0, 1])
    trainer = build(tmp_path, tokenizer, suite, tiny_config, eval_dataset={"easy": suite.eval, "hard": hard})
    by_name = trainer.evaluate(eval_dataset="hard")

    def measured(metrics):  # without transformers' speed metrics (wall time)
        return {k: v for k, v in metrics.items() if not k.endswith(("_runtime", "_per_second"))}

    assert measured(by_name) == measured(trainer.evaluate(eval_dataset=hard)) and "eval_reward" in by_name, by_name
    with pytest.raises(ValueError, match=r"eval_dataset='hardd'.*no such key; its keys are \['easy', 'hard'\]"):
        trainer.evaluate(eval_dataset="hardd")
    single = build(tmp_path / "single", tokenizer, suite, tiny_config, eval_dataset=suite.eval)
    with pytest.raises(ValueError, match=r"when its `eval_dataset` is a dict, and this trainer's is Dataset"):
        single.evaluate(eval_dataset="hard")


def test_an_empty_eval_dataset_is_refused_by_name_at_construction_and_in_evaluate(
    tmp_path, tokenizer, suite, tiny_config
):
    """0 eval rows (e.g. a filter removed them all) failed inside `datasets` ("Column 'prompt_ids' doesn't exist") at
    construction, and `evaluate()` of them returned eval_reward=0.0, a score from no prompts (trial 4's N18, N131,
    N18b)."""
    empty = suite.eval.select([])
    with pytest.raises(ValueError, match=r"`eval_dataset` is empty \(0 rows\)"):
        build(tmp_path, tokenizer, suite, tiny_config, eval_dataset=empty, eval_strategy="steps", eval_steps=1)
    with pytest.raises(ValueError, match=r"`eval_dataset\['b'\]` is empty \(0 rows\)"):
        build(tmp_path, tokenizer, suite, tiny_config, eval_dataset={"a": suite.eval, "b": empty})
    trainer = build(tmp_path, tokenizer, suite, tiny_config)
    with pytest.raises(ValueError, match=r"`eval_dataset` is empty \(0 rows\)"):
        trainer.evaluate(empty)


def test_a_streaming_pretraining_set_and_a_dataset_dict_of_eval_sets_work(tmp_path, tokenizer, suite, tiny_config):
    from datasets import DatasetDict

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, max_steps=1),
        train_dataset=suite.rl_train,
        pretrain_dataset=streaming(suite.pretrain),
        eval_dataset=DatasetDict({"prompts": suite.eval.select(range(4)), "text": suite.pretrain.select(range(4))}),
        processing_class=tokenizer,
    )
    trainer.train()
    metrics = trainer.evaluate()
    assert "eval_prompts_reward" in metrics and "eval_text_pretrain_loss" in metrics
    # each dataset's keys under its name, speed metrics included: those of the evaluator's table
    assert set(metrics) - {"epoch"} == set(eval_metric_names(trainer.eval_dataset, ["exact_match_reward"], False))
    assert {"eval_prompts_runtime", "eval_text_runtime", "eval_text_samples_per_second"} <= set(metrics)


# ---------------------------------------------------------------------------------------------------------------------
# Accepted means honoured: the run is as long as the plan
# ---------------------------------------------------------------------------------------------------------------------
def sft_rows(n):
    return Dataset.from_list([{"prompt": f"q{i}=", "completion": f"a{i}"} for i in range(n)])


@pytest.mark.parametrize(("epochs", "rows", "batch"), [(3, 11, 2), (2, 5, 4), (1.5, 7, 2)])
def test_the_trainer_runs_exactly_the_planned_steps_with_epochs(tmp_path, tokenizer, epochs, rows, batch):
    import math

    config = TRAPOConfig(
        output_dir=str(tmp_path),
        num_train_epochs=epochs,
        per_device_train_batch_size=batch,
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        sft_max_length=16,
        logging_steps=1,
    )
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0), args=config, sft_dataset=sft_rows(rows), processing_class=tokenizer
    )
    planned = math.ceil(rows * epochs / batch)  # every SFT row `epochs` times, `batch` rows per step
    trainer.train()
    assert trainer.state.global_step == planned
    assert config.max_steps == -1  # the user's config is untouched; the trainer's copy holds the plan


def test_save_steps_as_a_fraction_of_an_epoch_run_fall_on_the_plan(tmp_path, tokenizer):
    config = TRAPOConfig(
        output_dir=str(tmp_path),
        num_train_epochs=3,
        per_device_train_batch_size=2,
        report_to="none",
        save_strategy="steps",
        save_steps=0.5,
        activation_checkpointing=False,
        sft_max_length=16,
    )
    TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0), args=config, sft_dataset=sft_rows(11), processing_class=tokenizer
    ).train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-17", "checkpoint-9"]


def test_total_episodes_without_rl_prompts_is_refused_not_ignored(tmp_path, tokenizer):
    config = TRAPOConfig(output_dir=str(tmp_path), total_episodes=1000, report_to="none", sft_max_length=16)
    with pytest.raises(ValueError, match=r"total_episodes=1000 counts RL prompts.*no RL prompts.*set max_steps"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0), args=config, sft_dataset=sft_rows(4), processing_class=tokenizer
        )


# ---- mixed precision this machine cannot run: refused by field, never ignored ----
def without_gpu(monkeypatch):
    """This machine as one without any accelerator (and so without a bf16 GPU), whatever it has."""
    import transformers.utils

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(transformers.utils, "is_torch_bf16_gpu_available", lambda: False)
    monkeypatch.setattr(transformers.utils, "is_torch_xla_available", lambda *args, **kwargs: False)


@pytest.mark.parametrize("use_cpu", [False, True])
def test_fp16_on_the_cpu_is_refused_not_ignored(tmp_path, monkeypatch, use_cpu):
    """accelerate turns fp16 autocast on only off the CPU: on it the run was silently fp32."""
    without_gpu(monkeypatch)
    why = "use_cpu=True" if use_cpu else "this machine has no GPU"
    with pytest.raises(ValueError, match=re.escape(f"TRAPOConfig.fp16=True, but training runs on the CPU ({why})")):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", fp16=True, use_cpu=use_cpu)


def test_fp16_with_use_cpu_is_refused_even_with_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    with pytest.raises(ValueError, match=re.escape("TRAPOConfig.fp16=True, but training runs on the CPU (use_cpu")):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", fp16=True, use_cpu=True)


@pytest.mark.parametrize("use_cpu", [False, True])
def test_fp16_from_the_environment_on_the_cpu_is_refused_naming_the_variable(tmp_path, monkeypatch, use_cpu):
    """Trial 11's C05 / N41: `ACCELERATE_MIXED_PRECISION=fp16` left in the shell on a CPU machine: transformers hands it
    to accelerate, which reports fp16 and trains in fp32 (no autocast on the CPU), without a word. Refused as
    `fp16=True` is, naming the variable and `unset`; a field that chooses the precision wins over it, as in
    transformers."""
    without_gpu(monkeypatch)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    why = "use_cpu=True" if use_cpu else "this machine has no GPU"
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=use_cpu)
    message = str(raised.value)
    for needle in [
        f"The environment variable ACCELERATE_MIXED_PRECISION='fp16' asks for fp16 mixed precision, but training runs "
        f"on the CPU ({why})",
        "unset ACCELERATE_MIXED_PRECISION",
        "--mixed_precision no",
    ]:
        assert needle in message, (needle, message)
    if use_cpu:  # bf16=True chooses the precision: transformers and accelerate ignore the variable
        assert (
            TRAPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=True).mixed_precision == "bf16"
        )
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp32")
    with pytest.raises(ValueError, match=r"ACCELERATE_MIXED_PRECISION='fp32' is no mixed precision accelerate knows"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=use_cpu)


def test_bf16_from_the_environment_is_said_once_not_refused(tmp_path, monkeypatch, caplog):
    """Trial 11's N41: `ACCELERATE_MIXED_PRECISION=bf16` on a CPU machine trained under bf16 autocast while the config
    (and what it saves) said `bf16=False`, without a word. accelerate's launcher sets the variable from
    `--mixed_precision bf16`, so it is not refused: one warning names the precision in effect and the variable."""
    without_gpu(monkeypatch)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    with caplog.at_level("WARNING", logger="trl_trapo.config"):
        config = TRAPOConfig(output_dir=str(tmp_path), report_to="none")
    notes = [r.getMessage() for r in caplog.records if "ACCELERATE_MIXED_PRECISION=bf16" in r.getMessage()]
    assert len(notes) == 1, caplog.text
    assert "bf16 autocast" in notes[0] and "bf16=False" in notes[0] and "unset ACCELERATE_MIXED_PRECISION" in notes[0]
    assert (
        config.mixed_precision == "bf16" and config.bf16 is False
    )  # what accelerate will run, as transformers reads it
    caplog.clear()
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    with caplog.at_level("WARNING", logger="trl_trapo.config"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none")
    assert "ACCELERATE_MIXED_PRECISION" not in caplog.text


@pytest.mark.parametrize("field", ["bf16", "bf16_full_eval"])
def test_bf16_without_a_bf16_gpu_names_the_field_and_the_fix(tmp_path, monkeypatch, field):
    """transformers' own refusal ("Your setup doesn't support bf16/gpu ...") named neither."""
    without_gpu(monkeypatch)
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", **{field: True})
    message = str(raised.value)
    assert message.startswith(f"TRAPOConfig.{field}=True, but this machine has no GPU with bf16 support")
    assert "Drop it" in message and "use_cpu=True" in message
    # what transformers accepts is accepted: bf16 autocast on the CPU when asked for with use_cpu
    config = TRAPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **{field: True})
    assert getattr(config, field) is True
    TRAPOConfig(output_dir=str(tmp_path), report_to="none")  # left unset, bf16 is decided for the machine


# ---- trainable float16 weights (trial 13's N28) ---------------------------------------------------------------------
def critic(tokenizer):
    config = build_tiny_model(tokenizer).config
    config.num_labels = 1
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config)


@pytest.mark.parametrize(
    "case, warned",
    [
        ("float16 policy", "`model` (LlamaForCausalLM) has 20 trainable float16 parameter tensors"),
        ("float16 critic", "`value_model` (LlamaForSequenceClassification) has 21 trainable float16 parameter"),
        ("float32 policy", None),
        ("LoRA on a float16 base", None),  # PEFT's adapter weights are float32: only trainable parameters count
        ("frozen float16 reward model", None),  # never updated
    ],
)
def test_trainable_float16_weights_without_fp16_mixed_precision_are_warned_about(
    tmp_path, tokenizer, suite, tiny_config, caplog, case, warned
):
    """Trial 13's N28: a policy loaded with `from_pretrained(dtype=torch.float16)` and trained with fp32 arguments (no
    autocast, float16 AdamW states: eps=1e-8 is 0 there) diverged at step 3 (loss 4.06 -> 13.1, grad norm 363)
    without a word. A warning at construction names the model, the dtype, what goes wrong and the fixes."""
    from peft import LoraConfig

    model, arguments = build_tiny_model(tokenizer, seed=0), {}
    if case == "float16 policy":
        model = model.half()
    elif case == "float16 critic":
        arguments["value_model"] = critic(tokenizer).half()
    elif case == "LoRA on a float16 base":
        model = model.half()
        arguments["peft_config"] = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    elif case == "frozen float16 reward model":
        arguments["reward_funcs"] = [exact_match_reward, critic(tokenizer).half()]
        arguments["reward_processing_classes"] = [None, tokenizer]
    reward_funcs = arguments.pop("reward_funcs", exact_match_reward)
    with caplog.at_level("WARNING", logger="trl_trapo"):
        trainer = TRAPOTrainer(
            model,
            reward_funcs=reward_funcs,
            args=tiny_config(tmp_path, max_steps=1),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
            **arguments,
        )
    notes = [r.getMessage() for r in caplog.records if "trainable float16" in r.getMessage()]
    if warned is None:
        assert notes == [], notes
        if case == "LoRA on a float16 base":  # what makes it fine: the trained weights are float32
            trained = [p.dtype for p in trainer.model.parameters() if p.requires_grad]
            assert trained and set(trained) == {torch.float32}, set(trained)
        return
    assert len(notes) == 1, notes
    for needle in [
        warned,
        "no fp16 mixed precision (mixed_precision='no')",
        "AdamW's default eps=1e-8 is 0",
        "from_pretrained(..., dtype=torch.float32)",
        "`fp16=True` then trains under fp16 autocast with float32 weights",
        "dtype=torch.bfloat16",
    ]:
        assert needle in notes[0], (needle, notes[0])


def test_trainable_float16_weights_under_fp16_mixed_precision_are_refused():
    """With `fp16=True` (a GPU) accelerate scales the loss with torch's GradScaler, which refuses float16 gradients at
    the first optimizer step: refused at construction, naming the fix (float32 weights with fp16=True, or bfloat16).
    DeepSpeed, and FSDP under mixed precision, keep float32 master weights: nothing to say."""
    from trl_trapo.models import check_trained_precision
    from trl_trapo.tasks import build_char_tokenizer

    half = build_tiny_model(build_char_tokenizer(), seed=0).half()
    with pytest.raises(ValueError) as raised:
        check_trained_precision([("model", half), ("value_model", None)], "fp16", float32_master_weights=False)
    message = str(raised.value)
    for needle in [
        "`model` (LlamaForCausalLM) has 20 trainable float16 parameter tensors",
        "mixed_precision='fp16'",
        "Attempting to unscale FP16 gradients.",
        "from_pretrained(..., dtype=torch.float32)",
        "keep fp16=True",
        "bf16=True",
    ]:
        assert needle in message, (needle, message)
    check_trained_precision([("model", half)], "fp16", float32_master_weights=True)
    check_trained_precision([("model", half.requires_grad_(False))], "fp16", float32_master_weights=False)


def test_torch_grad_scaler_refuses_float16_gradients():
    """The library behaviour the refusal above rests on (torch 2.x): fp16 mixed precision's GradScaler will not
    unscale float16 gradients. If torch ever accepts them, that refusal is stale."""
    weight = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    optimizer = torch.optim.AdamW([weight])
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(weight.float().sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.step(optimizer)


# ---- token ids and vocabularies (every id looked up or sampled fits the matrix that reads it) -------------------------


def vocabulary_trainer(tmp_path, tokenizer, suite, tiny_config, model=None, **arguments):
    config = {k: arguments.pop(k) for k in ("stop_token_id", "generation_kwargs") if k in arguments}
    return TRAPOTrainer(
        model if model is not None else build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, **config),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        **arguments,
    )


def shrunk(model, rows: int):
    model.resize_token_embeddings(rows)
    return model


def test_a_policy_embedding_fewer_tokens_than_its_tokenizer_is_refused(tmp_path, tokenizer, suite, tiny_config):
    """Built, it failed at the first step with "IndexError: index out of range in self"."""
    policy = shrunk(build_tiny_model(tokenizer), 10)
    with pytest.raises(
        ValueError,
        match=rf"`processing_class` has {len(tokenizer)} tokens .* embeds only 10 .*"
        r"resize_token_embeddings\(len\(tokenizer\)\)",
    ):
        vocabulary_trainer(tmp_path, tokenizer, suite, tiny_config, model=policy)


def test_models_reading_the_policy_tokens_need_its_vocabulary(tmp_path, tokenizer, suite, tiny_config):
    """A reference (or value model) of another vocabulary built, then failed at the first RL step."""
    rows = len(tokenizer)
    with pytest.raises(ValueError, match=rf"`ref_model` embeds 50 tokens, the policy {rows}"):
        vocabulary_trainer(tmp_path, tokenizer, suite, tiny_config, ref_model=shrunk(build_tiny_model(tokenizer), 50))
    value_model = sequence_classifier_of(tokenizer)
    value_model.resize_token_embeddings(50)
    with pytest.raises(ValueError, match=rf"The value_model embeds 50 tokens, .* go up to {rows - 1}"):
        vocabulary_trainer(tmp_path, tokenizer, suite, tiny_config, value_model=value_model)


def sequence_classifier_of(tokenizer):
    config = build_tiny_model(tokenizer).config
    config.num_labels = 1
    return AutoModelForSequenceClassification.from_config(config)


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("stop_token_id", 99999, "stop_token_id=99999"),
        ("generation_kwargs", {"eos_token_id": [5, 99999]}, r"generation_kwargs\['eos_token_id'\]=99999"),
        ("generation_kwargs", {"eos_token_id": 99999}, r"generation_kwargs\['eos_token_id'\]=99999"),
    ],
)
def test_a_stop_id_outside_the_vocabulary_is_refused_by_name(
    tmp_path, tokenizer, suite, tiny_config, field, value, shown
):
    """It trained silently with a stop condition that can never fire."""
    with pytest.raises(ValueError, match=rf"{shown} is outside the policy's vocabulary \[0, {len(tokenizer)}\)"):
        vocabulary_trainer(tmp_path, tokenizer, suite, tiny_config, **{field: value})


def test_a_negative_stop_token_id_is_refused_by_the_config(tmp_path):
    with pytest.raises(ValueError, match=r"TRAPOConfig.stop_token_id=-1 is invalid: use a token id >= 0"):
        TRAPOConfig(output_dir=str(tmp_path), stop_token_id=-1)


@pytest.mark.parametrize(
    ("field", "key", "value"),
    [
        ("model_init_kwargs", "dtype", "float17"),
        ("model_init_kwargs", "torch_dtype", "bf16"),
        ("teacher_model_init_kwargs", "dtype", 16),
    ],
)
def test_a_dtype_torch_does_not_have_is_refused_by_field_with_examples(tmp_path, field, key, value):
    """The old code built the config, then `from_pretrained` raised `module 'torch' has no attribute 'float17'`."""
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", **{field: {key: value}})
    message = str(raised.value)
    for needle in [f"{field}[{key!r}]={value!r}", "'auto'", "'bfloat16'"]:
        assert needle in message, (needle, message)


def test_the_dtypes_from_pretrained_takes_are_accepted(tmp_path):
    for dtype in ("auto", "bfloat16", "float32", torch.float16, None):
        TRAPOConfig(
            output_dir=str(tmp_path), report_to="none", model_init_kwargs={"dtype": dtype, "torch_dtype": dtype}
        )


@pytest.mark.parametrize("field", ["model_adapter_name", "ref_adapter_name"])
def test_an_adapter_name_the_policy_lacks_is_refused_by_field(tmp_path, tokenizer, suite, tiny_config, field):
    """`model_adapter_name="nope"` with a `peft_config` (whose one adapter is `default`) ended in PEFT's raw `Adapter
    nope not found.` from `set_adapter` (trial 10's PY30); its twin `ref_adapter_name` already named itself."""
    from peft import LoraConfig

    with pytest.raises(ValueError) as raised:
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path, kl_coef=0.05, **{field: "nope"}),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
            peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        )
    message = str(raised.value)
    for needle in [f"TRAPOConfig.{field}='nope'", "['default']", "named 'default'", "model.load_adapter("]:
        assert needle in message, (needle, message)
