# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Adapters on modules other than linear layers (trial 10's PE12 / CX41 / PE16 / PE11): LoRA on the input
embeddings (`target_modules=["embed_tokens"]`) and PEFT's `trainable_token_indices` train, are saved, copied into the
reference adapter and its sync, and rolled back with their optimizer state; an `exclude_modules` that removes every
target is named as the cause."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from trl_trapo import TRAPOTrainer
from trl_trapo.assembly import wrap_adapter
from trl_trapo.memory import AdapterBank
from trl_trapo.models import ReferencePolicy, add_frozen_adapter_copy, embedding_rows
from trl_trapo.tasks import build_tiny_model, exact_match_reward


EMBEDDING_ADAPTERS = {
    "lora_on_embed_tokens": dict(target_modules=["embed_tokens", "q_proj"]),
    "trainable_token_indices": dict(target_modules=["q_proj"], trainable_token_indices=[5, 6]),
}


def embedding_parameters(model) -> dict[str, torch.nn.Parameter]:
    """The trainable parameters of the adapter on `embed_tokens` (LoRA A/B, or the trainable tokens' delta)."""
    return {n: p for n, p in model.named_parameters() if "embed_tokens" in n and p.requires_grad}


@pytest.mark.parametrize("name", list(EMBEDDING_ADAPTERS))
def test_embedding_rows_reads_through_peft_wrappers(tokenizer, name):
    """PEFT's LoRA `Embedding` and `TrainableTokensWrapper` have no `num_embeddings`: the trainer read it and failed
    with torch's AttributeError at construction."""
    model = get_peft_model(build_tiny_model(tokenizer, seed=0), LoraConfig(r=4, **EMBEDDING_ADAPTERS[name]))
    assert embedding_rows(model) == len(tokenizer)


@pytest.mark.parametrize("name", list(EMBEDDING_ADAPTERS))
def test_an_adapter_on_the_input_embeddings_trains_and_saves(tmp_path, tokenizer, suite, tiny_config, name):
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, max_steps=2, learning_rate=1e-2),
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_dropout=0.0, task_type="CAUSAL_LM", **EMBEDDING_ADAPTERS[name]),
    )
    policy = trainer.accelerator.unwrap_model(trainer.model)
    before = {n: p.detach().clone() for n, p in embedding_parameters(policy).items()}
    assert before
    trainer.train()
    after = embedding_parameters(policy)
    for parameter, value in before.items():
        assert not torch.equal(after[parameter], value), parameter
    trainer.save_model(str(tmp_path / "final"))
    reloaded = PeftModel.from_pretrained(build_tiny_model(tokenizer, seed=0), str(tmp_path / "final")).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, policy.eval()(input_ids=ids).logits)


@pytest.mark.parametrize("name", list(EMBEDDING_ADAPTERS))
def test_the_reference_adapter_copies_and_follows_the_embedding_adapter(tokenizer, name):
    """The reference copy (`sync_ref_model`, a given trained PeftModel) and its sync selected adapter parameters by
    ".default.", which a LoRA embedding's `lora_embedding_A.default` and `trainable_tokens_delta.default` lack: the
    copy kept its fresh initialisation and the sync never moved it."""
    config = LoraConfig(r=4, init_lora_weights=False, **EMBEDDING_ADAPTERS[name])
    model = get_peft_model(build_tiny_model(tokenizer, seed=0), config)
    with torch.no_grad():  # a trained adapter: every parameter away from its initial value
        for parameter in embedding_parameters(model).values():
            parameter.add_(torch.randn_like(parameter))
    add_frozen_adapter_copy(model, "default", "ref")
    params = dict(model.named_parameters())
    trained = embedding_parameters(model)
    copies = {n: params[n.replace(".default", ".ref")] for n in trained}
    for parameter, value in trained.items():
        torch.testing.assert_close(copies[parameter], value, msg=parameter)
        assert not copies[parameter].requires_grad
    reference = ReferencePolicy(adapter="ref")
    assert {f"ref_adapter/{n.replace('.default', '.ref')}" for n in trained} <= set(reference.state_tensors(model))
    old = {n: p.detach().clone() for n, p in copies.items()}
    with torch.no_grad():
        for parameter in trained.values():
            parameter.add_(1.0)
    reference.sync(model, alpha=0.5)
    for parameter, copy in copies.items():
        torch.testing.assert_close(copy, old[parameter] + 0.5, msg=parameter)


def test_a_rollback_resets_the_embedding_adapters_adam_moments(tmp_path, tokenizer):
    model = get_peft_model(build_tiny_model(tokenizer, seed=0), LoraConfig(r=4, target_modules=["embed_tokens"]))
    trained = embedding_parameters(model)
    bank = AdapterBank(str(tmp_path / "bank"))
    bank.snapshot(model, 1)
    saved = {n: p.detach().clone() for n, p in trained.items()}
    optimizer = torch.optim.AdamW(list(trained.values()), lr=1e-2)
    ids = torch.tensor([[5, 6, 7, 8]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert all(p in optimizer.state for p in trained.values())
    reset = bank.rollback(model, 1, optimizer)
    assert len(reset) == len(trained)
    for parameter, value in trained.items():
        assert torch.equal(value, saved[parameter]) and value not in optimizer.state, parameter


def test_exclude_modules_removing_every_target_is_named(tokenizer):
    """The message blamed target_modules ("matches no module", q_proj listed among the names the model has; trial
    10's PE11)."""
    given = LoraConfig(r=4, target_modules=["q_proj"], exclude_modules=["q_proj"], task_type="CAUSAL_LM")
    with pytest.raises(
        ValueError, match=r"exclude_modules=\{'q_proj'\} excludes every module target_modules=\{'q_proj'\} matches"
    ):
        wrap_adapter(build_tiny_model(tokenizer, seed=0), given)
    assert given.exclude_modules == {"q_proj"}  # the user's config is not changed
    partly = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], exclude_modules=["q_proj"], task_type="CAUSAL_LM")
    wrapped = wrap_adapter(build_tiny_model(tokenizer, seed=0), partly)
    assert {n.split(".")[-2] for n, _ in wrapped.named_modules() if n.endswith(".lora_A")} == {"v_proj"}


def test_a_target_outside_the_selected_layers_is_named(tokenizer, caplog):
    """PEFT adapts only modules inside numbered layers when `layers_to_transform` is set: `embed_tokens` in
    `target_modules` was dropped without a word."""
    import logging

    given = LoraConfig(r=4, target_modules=["embed_tokens", "q_proj"], layers_to_transform=[1], task_type="CAUSAL_LM")
    with caplog.at_level(logging.WARNING, logger="trl_trapo.assembly"):
        wrapped = wrap_adapter(build_tiny_model(tokenizer, seed=0), given)
    assert not embedding_parameters(wrapped)  # PEFT's behaviour, kept
    assert "target_modules names 'embed_tokens', which no layer of layers_to_transform=[1] holds" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.assembly"):
        wrap_adapter(
            build_tiny_model(tokenizer, seed=0), LoraConfig(r=4, target_modules=["q_proj"], layers_to_transform=[1])
        )
    assert "layers_to_transform" not in caplog.text


@pytest.mark.parametrize("name", list(EMBEDDING_ADAPTERS))
def test_a_pad_id_outside_a_wrapped_embedding_is_replaced(name):
    """A pad token added without resizing (TRL 1.12's PPO example) is replaced by an id the embeddings hold; the
    guard read `num_embeddings` and skipped a PEFT-wrapped embedding, so the pad id stayed out of range."""
    from trl_trapo.models import embedding_safe_pad_id
    from trl_trapo.tasks import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = get_peft_model(build_tiny_model(tokenizer, seed=0), LoraConfig(r=4, **EMBEDDING_ADAPTERS[name]))
    tokenizer.add_special_tokens({"pad_token": "<new_pad>"})
    assert tokenizer.pad_token_id == len(tokenizer) - 1 == embedding_rows(model)
    assert embedding_safe_pad_id(tokenizer, model) == tokenizer.eos_token_id
