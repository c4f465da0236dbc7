# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What is sampled is what is trained: the recorded behaviour log-probs describe the sampled distribution whatever the
model's own `generation_config.json` says, what stops generation is exactly what cuts the completion mask, and
settings TRAPO cannot account for are refused when the config is built."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from trl_trapo import PPOConfig, TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import StepContext, collate_rows, step_counts
from trl_trapo.tasks import build_tiny_model


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def rl_only_trainer(tmp_path, tokenizer, suite, tiny_config, model=None, **overrides):
    return TRAPOTrainer(
        model if model is not None else build_tiny_model(tokenizer, seed=0),
        reward_funcs=constant_reward,
        args=tiny_config(tmp_path, kl_coef=0.05, **overrides),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )


def first_use_statistics(trainer) -> dict[str, float]:
    """`val/ratio` and `policy/approxkl_avg` of fresh rollouts, before any update (one micro-batch, the whole round)."""
    trainer._generate_round(8, step=0)
    trajectories = trainer.replay.sample(8, step=0)
    batch = collate_rows([t.to_row() for t in trajectories], trainer.processing_class.pad_token_id)
    counts = step_counts([batch]).tolist()
    keys = ("tokens_pretrain", "tokens_sft", "tokens_rl", "sequences_rl", "micro_batches_rl")
    context = StepContext(step=0, weights=(0.0, 0.0, 1.0), counts=dict(zip(keys, counts)), probe=False, num_micro=1)
    trainer.metrics.reset()
    with torch.no_grad():
        trainer.compute_loss(trainer.model, batch, num_items_in_batch=context)
    return {k: float(v) for k, v in trainer.metrics.step_sums.items()}


@pytest.mark.parametrize(
    "model_generation_config",
    [
        pytest.param({"repetition_penalty": 3.0}, id="repetition_penalty=3"),
        pytest.param({"no_repeat_ngram_size": 1}, id="no_repeat_ngram_size=1"),
        pytest.param({"bad_words_ids": [[5], [6]], "min_new_tokens": 3}, id="bad_words+min_new_tokens"),
    ],
)
def test_the_models_generation_config_does_not_leak_into_rollouts(
    tmp_path, tokenizer, suite, tiny_config, model_generation_config
):
    model = build_tiny_model(tokenizer, seed=0)
    model.generation_config = GenerationConfig(**model_generation_config)
    trainer = rl_only_trainer(tmp_path, tokenizer, suite, tiny_config, model=model)
    stats = first_use_statistics(trainer)
    assert stats["val/ratio"] == pytest.approx(1.0, abs=1e-6)
    assert stats["policy/approxkl_avg"] <= 1e-8
    # the user's model keeps its own generation config
    assert model.generation_config.to_dict()[next(iter(model_generation_config))] is not None


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"temperature": 0.7}, id="temperature"),
        pytest.param({"top_k": 5}, id="top_k"),
        pytest.param({"top_p": 0.8}, id="top_p"),
        pytest.param({"generation_kwargs": {"min_p": 0.05}}, id="min_p"),
        pytest.param({"generation_kwargs": {"typical_p": 0.9, "use_cache": False}}, id="typical_p+no_cache"),
        pytest.param({"stop_token": None}, id="no_stop"),
        pytest.param({"generation_kwargs": {"eos_token_id": [1, 5]}}, id="several_stop_ids"),
    ],
)
def test_every_accepted_generation_setting_gives_exact_first_use_ratios(
    tmp_path, tokenizer, suite, tiny_config, settings
):
    trainer = rl_only_trainer(tmp_path, tokenizer, suite, tiny_config, **settings)
    stats = first_use_statistics(trainer)
    assert stats["val/ratio"] == pytest.approx(1.0, abs=1e-6)
    assert stats["policy/approxkl_avg"] <= 1e-8


@pytest.mark.parametrize(
    "generation_kwargs, message",
    [
        ({"repetition_penalty": 1.5}, "repetition_penalty.*changes the logits"),
        ({"no_repeat_ngram_size": 1}, "no_repeat_ngram_size.*changes the logits"),
        ({"num_beams": 2}, "num_beams.*changes the logits"),
        ({"stop_strings": ["."]}, "stop strings are not supported"),
        ({"temperature": 0.5}, "set `temperature` instead"),
        ({"max_new_tokens": 5}, "set `response_length` instead"),
        ({"eos_token_id": []}, "non-empty list of token ids"),
        ({"output_scores": True}, "not a setting TRAPO can account for"),
    ],
)
def test_generation_kwargs_that_break_the_log_probs_are_refused(tmp_path, generation_kwargs, message):
    with pytest.raises(ValueError, match=f"generation_kwargs=.*{message}"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", generation_kwargs=generation_kwargs)


def completions_and_masks(trainer) -> list[tuple[list[int], list[float]]]:
    trainer._generate_round(8, step=0)
    return [(t.completion_ids.tolist(), t.completion_mask.tolist()) for t in trainer.replay.sample(8, step=0)]


def eos_likely_model(tokenizer):
    """The tiny model with EOS made very likely, and an EOS in its own generation config."""
    model = build_tiny_model(tokenizer, seed=0)
    old_head = model.get_output_embeddings()
    head = torch.nn.Linear(old_head.in_features, old_head.out_features, bias=True)
    head.weight = old_head.weight  # still tied to the input embeddings
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 4.0
    model.set_output_embeddings(head)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
    return model


def padding_after_eos(completions: list[list[int]], tokenizer) -> int:
    """Pad ids after a first EOS: what a generation that stopped at EOS leaves (a sampled continuation rarely
    draws the pad token)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    return sum(ids[ids.index(eos) :].count(pad) for ids in completions if eos in ids)


def test_stop_token_none_never_stops_early_even_if_the_model_has_an_eos(tmp_path, tokenizer, suite, tiny_config):
    trainer = rl_only_trainer(
        tmp_path, tokenizer, suite, tiny_config, model=eos_likely_model(tokenizer), stop_token=None
    )
    completions = completions_and_masks(trainer)
    assert sum(tokenizer.eos_token_id in ids for ids, _ in completions) >= 4  # EOS was sampled mid-completion
    for ids, mask in completions:
        assert len(ids) == trainer.args.response_length and mask == [1.0] * len(ids)
    assert padding_after_eos([ids for ids, _ in completions], tokenizer) <= 2


def test_ppo_config_default_stop_token_none_trains_no_padding(tmp_path, tokenizer, suite):
    """TRL 1.12's PPOConfig default (stop_token=None) with a model whose generation config has an EOS: every
    completion runs to response_length, so no padding after an EOS is trained, scored or counted in the KL."""
    model = eos_likely_model(tokenizer)
    args = PPOConfig(
        output_dir=str(tmp_path),
        report_to="none",
        response_length=8,
        num_generations=2,
        per_device_train_batch_size=4,
        total_episodes=8,
        max_prompt_length=16,
        activation_checkpointing=False,
        num_sample_generations=0,
    )
    trainer = TRAPOTrainer(
        model, reward_funcs=constant_reward, args=args, train_dataset=suite.rl_train, processing_class=tokenizer
    )
    completions = completions_and_masks(trainer)
    for ids, mask in completions:
        assert len(ids) == 8 and sum(mask) == 8
    assert padding_after_eos([ids for ids, _ in completions], tokenizer) <= 2


def test_several_stop_ids_stop_generation_and_cut_the_mask(tmp_path, tokenizer, suite, tiny_config):
    """`eos_token_id=[eos, id_of(".")]`: a completion ending at "." is cut there and counts as stopped."""
    dot = tokenizer.convert_tokens_to_ids(".")
    stops = sorted({tokenizer.eos_token_id, dot})
    model = build_tiny_model(tokenizer, seed=0)
    with torch.no_grad():  # make "." likely, so that some completions stop at it
        model.get_output_embeddings().weight[dot] *= 4.0
    trainer = rl_only_trainer(
        tmp_path,
        tokenizer,
        suite,
        tiny_config,
        model=model,
        generation_kwargs={"eos_token_id": stops},
        temperature=2.0,
    )
    ended_at_dot = 0
    for ids, mask in completions_and_masks(trainer):
        hits = [i for i, t in enumerate(ids) if t in stops]
        if hits:  # cut right after the first stop id, every token before it counted
            assert hits[0] == len(ids) - 1 and mask == [1.0] * len(ids)
            ended_at_dot += ids[-1] == dot
        else:
            assert len(ids) == trainer.args.response_length
    assert ended_at_dot > 0
    # a completion that ended at "." is not truncated: the clipped ratio counts only those without any stop id
    logs = trainer.metrics.collect(trainer.accelerator, trainer.schedules.kl_coef())
    assert logs["completions/clipped_ratio"] < 1.0


def test_bf16_training_log_probs_match_the_recorded_ones(tmp_path, tokenizer, suite, tiny_config):
    """With a bf16 policy, behaviour, reference and training log-probs are computed the same way (fp32 log-softmax of
    the same bf16 logits): at step 1, policy == reference and the first ratio is 1."""
    model = build_tiny_model(tokenizer, seed=0).to(torch.bfloat16)
    trainer = rl_only_trainer(tmp_path, tokenizer, suite, tiny_config, model=model, bf16=False)
    trainer.model.to(torch.bfloat16)
    stats = first_use_statistics(trainer)
    assert stats["policy/approxkl_avg"] <= 1e-6
    assert stats["policy/kl_avg"] <= 1e-6
