# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`trainer.evaluate()` on prompts returns TRL `GRPOTrainer`'s eval keys with TRL's meaning (`eval_rewards/<f>/mean`
and `/std`, `eval_reward_std`, `eval_completions/*`) and transformers' speed metrics (`eval_runtime`, ...) beside
TRAPO's own (`eval_rewards/<f>`, `eval_completion_length`, `eval_reward_<split>`), and `metric_for_best_model`
accepts every key it returns — one table, `evaluation.eval_metric_names`, says which (trial 13's N13, N21). Before,
`evaluate()` returned five keys, and `eval_rewards/<f>` (which it returned) and TRL's `eval_rewards/<f>/mean` were both
refused as "not a metric TRAPO logs".

The tiny random model's `generate` is replaced by a scripted one (each prompt's completion is fixed), so the lengths
and the rewards are known by hand; everything around it (the evaluator, the scorer, the Trainer) is the real code.
"""

from __future__ import annotations

import logging
import statistics

import pytest
import torch
import trl
from conftest import make_tiny_config
from datasets import Dataset

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.evaluation import TRL_EVAL_METRICS_NOT_RETURNED, check_best_model_metric, eval_metric_names
from trl_trapo.tasks import build_tiny_model


PROMPTS = ["rev abcd=", "rev bcda=", "rev cdab=", "rev dabc=", "rev aabb="]
SPLITS = ["easy", "easy", "hard", "hard", "hard"]
GRADES = [1.0, 0.0, None, 0.5, 0.0]  # `graded`'s reward of each prompt's completion (None: not scored)
RESPONSE_LENGTH = 6
# each prompt's completion: terminated ("y" * k + EOS: k + 1 tokens) or clipped (no EOS, cut at RESPONSE_LENGTH)
SCRIPT = dict(zip(PROMPTS, ["y</s>", "z" * 9, "yyy</s>", "z" * 9, "yy</s>"]))
LENGTHS = [2, RESPONSE_LENGTH, 4, RESPONSE_LENGTH, 3]
CLIPPED = [False, True, False, True, False]


def graded(prompts, **kwargs):
    return [dict(zip(PROMPTS, GRADES)).get(p, 0.0) for p in prompts]


def constant(prompts, **kwargs):
    return [1.0] * len(prompts)


def never(prompts, **kwargs):
    """A reward function that scores none of these prompts (e.g. one for another task family)."""
    return [None] * len(prompts)


def eval_set() -> Dataset:
    return Dataset.from_dict({"prompt": PROMPTS, "split": SPLITS})


def config(tmp_path, **overrides) -> TRAPOConfig:
    """`TINY_CONFIG` for evaluating the scripted completions (three reward functions weighted 2, 1, 1); then
    `overrides`."""
    settings = dict(
        max_steps=2,
        per_device_eval_batch_size=2,
        response_length=RESPONSE_LENGTH,
        reward_weights=[2.0, 1.0, 1.0],
        disable_tqdm=True,
    )
    return make_tiny_config(tmp_path, **{**settings, **overrides})


def scripted_generate(tok):
    """The policy's `generate`: each row of the left-padded batch continues with its prompt's `SCRIPT` completion, cut
    to `max_new_tokens` and padded on the right."""

    def generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        turns = []
        for row, mask in zip(input_ids, attention_mask):
            prompt = tok.decode(row[mask.bool()], skip_special_tokens=True)
            turns.append(
                tok(SCRIPT[prompt], add_special_tokens=False)["input_ids"][: generation_config.max_new_tokens]
            )
        width = max(len(t) for t in turns)
        new = torch.tensor([t + [generation_config.pad_token_id] * (width - len(t)) for t in turns])
        return torch.cat([input_ids, new.to(input_ids.device)], dim=1)

    return generate


def test_evaluate_returns_trls_eval_keys_with_trls_meaning_beside_trapos_own(tmp_path, tokenizer, caplog):
    """N13: the keys and values, checked against a hand computation; every key the evaluator's table lists, and no
    other. A reward function that scores nothing has None, as TRL's `log` writes it; chosen as the best-model metric,
    that is warned about."""
    dataset = eval_set()
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=[graded, constant, never],
        args=config(tmp_path, metric_for_best_model="eval_rewards/never/mean"),
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.model.generate = scripted_generate(tokenizer)
    with caplog.at_level(logging.WARNING, logger="trl_trapo.evaluation"):
        metrics = trainer.evaluate()
    assert set(metrics) - {"epoch"} == set(eval_metric_names(dataset, ["graded", "constant", "never"], tools=False))

    scored = [g for g in GRADES if g is not None]
    scores = [2.0 * g + 1.0 if g is not None else 1.0 for g in GRADES]  # weights 2, 1, 1; `never` adds nothing
    terminated = [n for n, c in zip(LENGTHS, CLIPPED) if not c]
    expected = {
        # TRL's names
        "eval_reward": statistics.mean(scores),
        "eval_reward_std": statistics.stdev(scores),  # Bessel-corrected, as TRL's `nanstd`
        "eval_rewards/graded/mean": statistics.mean(scored),
        "eval_rewards/graded/std": statistics.stdev(scored),
        "eval_rewards/constant/mean": 1.0,
        "eval_rewards/constant/std": 0.0,
        "eval_rewards/never/mean": None,
        "eval_rewards/never/std": None,
        "eval_completions/mean_length": statistics.mean(LENGTHS),
        "eval_completions/min_length": min(LENGTHS),
        "eval_completions/max_length": max(LENGTHS),
        "eval_completions/clipped_ratio": sum(CLIPPED) / len(CLIPPED),
        "eval_completions/mean_terminated_length": statistics.mean(terminated),
        "eval_completions/min_terminated_length": min(terminated),
        "eval_completions/max_terminated_length": max(terminated),
        # TRAPO's own, as before
        "eval_rewards/graded": statistics.mean(scored),
        "eval_rewards/constant": 1.0,
        "eval_rewards/never": None,
        "eval_completion_length": statistics.mean(LENGTHS),
        "eval_reward_easy": statistics.mean(scores[:2]),
        "eval_reward_hard": statistics.mean(scores[2:]),
    }
    for key, value in expected.items():
        assert metrics[key] == (None if value is None else pytest.approx(value)), (key, metrics[key], value)
    # transformers' speed metrics: 5 rows in 3 batches of 2
    runtime = metrics["eval_runtime"]
    assert runtime > 0
    assert metrics["eval_samples_per_second"] == pytest.approx(5 / runtime, rel=0.02)
    assert metrics["eval_steps_per_second"] == pytest.approx(3 / runtime, rel=0.02)
    warned = [r.getMessage() for r in caplog.records if "has no value at this evaluation" in r.getMessage()]
    assert len(warned) == 1 and "metric_for_best_model='eval_rewards/never/mean'" in warned[0], warned


def test_trls_grpo_trainer_returns_the_same_keys_on_the_same_script(tmp_path, tokenizer):
    """Every key TRL's GRPOTrainer.evaluate() returns on the same model, rewards and eval prompts is one TRAPO returns,
    or one `TRL_EVAL_METRICS_NOT_RETURNED` gives the reason for; none of those is returned."""
    dataset = eval_set()
    funcs = [graded, constant, never]
    trapo = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=funcs,
        args=config(tmp_path / "trapo"),
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
    )
    trapo.model.generate = scripted_generate(tokenizer)
    ours = trapo.evaluate()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        max_steps=1,
        max_completion_length=RESPONSE_LENGTH,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        num_generations=4,
        reward_weights=[2.0, 1.0, 1.0],
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,
    )
    grpo = trl.GRPOTrainer(
        model=build_tiny_model(tokenizer, seed=0),
        reward_funcs=funcs,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
    )
    theirs = grpo.evaluate()
    not_returned = {f"eval_{key}" for key in TRL_EVAL_METRICS_NOT_RETURNED}
    assert set(theirs) - set(ours) == set(theirs) & not_returned, sorted(set(theirs) - set(ours))
    assert not set(ours) & not_returned
    shared = set(theirs) - not_returned
    for key in ("eval_reward_std", "eval_rewards/graded/mean", "eval_completions/mean_length", "eval_runtime"):
        assert key in shared, sorted(shared)
    # TRL's None for a function that scored nothing, as TRAPO's
    assert theirs["eval_rewards/never/mean"] is None and ours["eval_rewards/never/mean"] is None


def early(prompts, trainer_state, **kwargs):
    return [1.0 if trainer_state.global_step == 1 else 0.0] * len(prompts)


def late(prompts, trainer_state, **kwargs):
    return [float(trainer_state.global_step)] * len(prompts)


@pytest.mark.parametrize(
    "metric, best_step, best",
    [
        ("eval_rewards/early/mean", 1, 1.0),  # TRL's spelling
        ("rewards/early/mean", 1, 1.0),  # without the prefix, which transformers adds
        ("eval_rewards/early", 1, 1.0),  # TRAPO's own
        ("eval_rewards/late/mean", 2, 2.0),
    ],
)
def test_metric_for_best_model_selects_the_checkpoint_by_each_spelling(tmp_path, tokenizer, metric, best_step, best):
    """N21: each spelling evaluate() returns is accepted and selects the checkpoint whose evaluation was best on it
    (`early` is best at step 1, `late` at step 2)."""
    dataset = eval_set()
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=[early, late],
        args=config(
            tmp_path,
            reward_weights=None,
            response_length=4,
            eval_strategy="steps",
            eval_steps=1,
            save_strategy="steps",
            save_steps=1,
            load_best_model_at_end=True,
            metric_for_best_model=metric,
            greater_is_better=True,
        ),
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    assert trainer.state.best_metric == best
    assert trainer.state.best_model_checkpoint == str(tmp_path / f"checkpoint-{best_step}")


def test_metric_for_best_model_accepts_every_key_evaluate_returns_and_names_the_closest_otherwise(tmp_path, tokenizer):
    """Every key of the evaluator's table is accepted (one source of truth: the check reads the table `evaluate()`
    builds its result from); a key it does not return is refused naming the closest spellings, and a key of TRL's
    that TRAPO does not return says why."""
    dataset = eval_set()
    args = config(
        tmp_path,
        reward_weights=None,
        eval_strategy="steps",
        eval_steps=1,
        save_steps=1,
        save_strategy="steps",
        load_best_model_at_end=True,
    )
    names = ["graded", "constant"]
    eval_sets = {"prompts": dataset, "text": Dataset.from_dict({"text": ["abc"]})}
    keys = eval_metric_names(eval_sets, names, tools=False)
    assert {"eval_prompts_rewards/graded/mean", "eval_text_pretrain_loss", "eval_text_runtime"} <= set(keys)
    for key in keys:
        args.metric_for_best_model = key
        check_best_model_metric(args, eval_sets, None, names)
    for key in ("reward", "rewards/graded/mean", "eval_rewards/graded", "eval_reward_hard", "eval_runtime"):
        args.metric_for_best_model = key
        check_best_model_metric(args, dataset, None, names)
    args.metric_for_best_model = "eval_rewards/grade/mean"
    with pytest.raises(ValueError, match=r"Closest that it returns: 'eval_rewards/graded/mean'"):
        check_best_model_metric(args, dataset, None, names)
    args.metric_for_best_model = "eval_entropy"
    with pytest.raises(ValueError, match=r"TRL's GRPOTrainer returns eval_entropy: the policy's token entropy"):
        check_best_model_metric(args, dataset, None, names)
    # through the trainer: the run's reward names reach the check
    with pytest.raises(
        ValueError,
        match=r"'eval_rewards/graded_x' is not a metric evaluate\(\) returns.*"
        r"Closest that it returns: 'eval_rewards/graded'",
    ):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=[graded, constant],
            args=config(
                tmp_path,
                reward_weights=None,
                eval_strategy="steps",
                eval_steps=1,
                save_steps=1,
                save_strategy="steps",
                load_best_model_at_end=True,
                metric_for_best_model="eval_rewards/graded_x",
            ),
            train_dataset=dataset,
            eval_dataset=dataset,
            processing_class=tokenizer,
        )


def test_the_job_summary_keeps_its_lines_beside_trls_eval_keys(tmp_path):
    """The main job's summary compares headline metrics before and after training: TRL's `eval_rewards/<f>/mean` and
    `/std` are not lines of their own (the one reward function's `eval_rewards/<f>` is `eval_reward` already), and a
    function that scored nothing (None) is left out instead of failing the summary's number format."""
    from trl_trapo.jobs.main import job_summary

    after = {
        "eval_reward": 0.75,
        "eval_reward_std": 0.25,
        "eval_rewards/graded": 0.75,
        "eval_rewards/graded/mean": 0.75,
        "eval_rewards/graded/std": 0.25,
        "eval_rewards/never": None,
        "eval_rewards/never/mean": None,
    }
    results = {**after, **{f"{k}_initial": None if v is None else v - 0.5 for k, v in after.items()}}
    lines = job_summary(str(tmp_path), results, 1.0).splitlines()[2:]
    assert [line.split()[0] for line in lines] == ["eval_reward"], lines
    assert "0.25 -> 0.75" in lines[0]


def test_the_checks_reward_names_are_the_scorers_before_any_model_loads(tokenizer):
    """`metric_for_best_model` is checked before the reward models load: a model id is named as its loaded model
    will be (`from_pretrained` records the id as `name_or_path`), a repeated name gets the scorer's suffix, and each
    environment's `get_reward` comes last."""
    from trl_trapo.rewards import distinct_names, reward_function_name, reward_names

    model = build_tiny_model(tokenizer, seed=0)
    model.config._name_or_path = "org/tiny-rm"
    assert reward_function_name("org/tiny-rm") == reward_function_name(model) == "tiny-rm"
    given = reward_names([graded, "org/tiny-rm", graded], "./judge", [constant])
    assert given == ["graded", "tiny-rm", "graded_2", "judge", "constant"]
    judge = build_tiny_model(tokenizer, seed=0)
    judge.config._name_or_path = "./judge"
    loaded = [graded, model, graded, judge, constant]  # as the scorer holds them, its names computed as it does
    assert given == distinct_names([reward_function_name(f) for f in loaded])
