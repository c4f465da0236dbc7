# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What is sampled is what is trained: the recorded behaviour log-probs describe the sampled distribution whatever the
model's own `generation_config.json` says, what stops generation is exactly what cuts the completion mask, and
settings TRAPO cannot account for are refused when the config is built."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, GenerationMixin, LlamaConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from trl_trapo import PPOConfig, TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import StepContext, collate_rows
from trl_trapo.objectives import count_keys, step_counts
from trl_trapo.rollout import generate
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
    trainer.collect_rollouts(8, step=0)
    trajectories = trainer.replay.sample(8, step=0)
    batch = collate_rows([t.to_row() for t in trajectories], trainer.processing_class.pad_token_id)
    counts = dict(zip(count_keys(trainer.objectives), step_counts([batch], trainer.objectives).tolist()))
    context = StepContext(step=0, weights=(0.0, 0.0, 1.0), counts=counts, probe=False, num_micro=1)
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
        # the shared reason ("trains on log-probs at that value") fitted neither, nor said what to do (trial 6, M06, M08)
        (
            {"do_sample": False},
            "RL rollouts are always sampled.*greedy rollouts .* not supported.*lower `temperature`",
        ),
        ({"pad_token_id": 0}, "the pad id is the tokenizer's: set `processing_class.pad_token` \\(from the command"),
    ],
)
def test_generation_kwargs_that_break_the_log_probs_are_refused(tmp_path, generation_kwargs, message):
    with pytest.raises(ValueError, match=f"generation_kwargs=.*{message}"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", generation_kwargs=generation_kwargs)


def completions_and_masks(trainer) -> list[tuple[list[int], list[float]]]:
    trainer.collect_rollouts(8, step=0)
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


# ---- a round is one unit: one batched `generate` call, each row at its own temperature ------------------------------
def test_a_round_at_mixed_temperatures_is_one_generate_call_with_exact_first_use_ratios(
    tmp_path, tokenizer, suite, tiny_config
):
    """Targeted exploration heats two families: the whole round is one `generate` call, every row is sampled,
    recorded, referenced and trained at its own temperature, so the first PPO ratio of every token of every row is 1
    (fp32 rounding: per-token log-prob errors ~1e-6 nats at most)."""
    trainer = rl_only_trainer(
        tmp_path, tokenizer, suite, tiny_config, exploration=True, temperature=0.8, local_rollout_forward_batch_size=64
    )
    families = sorted(set(suite.rl_train["task"]))
    trainer.exploration.load_state_dict({"levels": {families[0]: 4, families[1]: 2}})  # 1.2 and 1.0; others 0.8
    policy = trainer._unwrapped_policy()
    calls = []
    original = policy.generate

    def counting_generate(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    policy.generate = counting_generate
    trainer.collect_rollouts(32, step=0)
    assert len(calls) == 1  # one batched call for the whole round (several temperatures)
    trajectories = trainer.replay.sample(trainer.replay.num_available(0), step=0)
    stamped = {None if t.temperature is None else round(t.temperature, 6) for t in trajectories}
    assert len(stamped) >= 2 and stamped <= {None, 1.0, 1.2}, stamped  # None: the configured 0.8
    captured = {}
    trainer.memory_pool.after_forward = lambda inputs, per_token_logps, sft_mask, rows: captured.update(
        logps=per_token_logps.detach()
    )
    batch = collate_rows([t.to_row() for t in trajectories], trainer.processing_class.pad_token_id)
    counts = dict(zip(count_keys(trainer.objectives), step_counts([batch], trainer.objectives).tolist()))
    context = StepContext(step=0, weights=(0.0, 0.0, 1.0), counts=counts, probe=False, num_micro=1)
    with torch.no_grad():
        trainer.compute_loss(trainer.model, batch, num_items_in_batch=context)
    mask = batch["mask"].bool()
    log_ratio = (captured["logps"] - batch["old_per_token_logps"])[mask]
    assert log_ratio.abs().max() <= 1e-5, log_ratio.abs().max()  # ratio 1 within 1e-5 on every token of every row
    # the reference log-probs were taken at each row's temperature too: policy == reference at step 0
    ref = batch["ref_per_token_logps"][mask]
    assert (captured["logps"][mask] - ref).abs().max() <= 1e-5


class FixedLogitsLM(PreTrainedModel, GenerationMixin):
    """A causal LM whose next-token logits are the same fixed vector at every position, for any input."""

    config_class = LlamaConfig

    def __init__(self, config, logits: torch.Tensor):
        super().__init__(config)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a parameter, for the device generate reads
        self.register_buffer("fixed", logits.clone())

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        batch, length = input_ids.shape
        logits = (self.fixed + 0 * self.anchor).expand(batch, length, -1)
        return CausalLMOutputWithPast(logits=logits)


def test_per_row_temperatures_sample_each_row_as_a_separate_call_at_its_temperature():
    """Token frequencies of one batched call at mixed temperatures against the exact softmax(logits / T) of each
    temperature, and against separate calls: each within 5 binomial standard deviations (2,000 draws per row set)."""
    vocab = 6
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0])
    config = LlamaConfig(vocab_size=vocab, hidden_size=8, num_hidden_layers=1, num_attention_heads=1)
    model = FixedLogitsLM(config, logits).eval()
    generation_config = GenerationConfig(
        max_new_tokens=1, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0, use_cache=False
    )
    n = 2000
    temperatures = [0.5] * n + [2.0] * n
    torch.manual_seed(0)
    out = generate(model, [[1]] * (2 * n), generation_config, 0, None, temperatures)
    tokens = torch.stack(out["completion_ids"]).squeeze(1)
    for part, temperature in ((tokens[:n], 0.5), (tokens[n:], 2.0)):
        expected = torch.softmax(logits / temperature, dim=-1)
        separate = torch.stack(generate(model, [[1]] * n, generation_config, 0, None, temperature)["completion_ids"])
        for sample in (part, separate.squeeze(1)):
            frequency = torch.bincount(sample, minlength=vocab).double() / n
            sigma = (expected * (1 - expected) / n).sqrt()
            assert ((frequency - expected).abs() <= 5 * sigma + 1e-12).all(), (temperature, frequency, expected)
    # the recorded behaviour log-probs are those of each row's own temperature
    recorded = torch.stack(out["old_per_token_logps"]).squeeze(1)
    exact = torch.cat(
        [torch.log_softmax(logits / 0.5, -1)[tokens[:n]], torch.log_softmax(logits / 2.0, -1)[tokens[n:]]]
    )
    assert torch.allclose(recorded, exact, atol=1e-6)
