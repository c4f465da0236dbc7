# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The training forward runs the output layer only at counted positions (`models.CountedPositionHead`).

- Log-probabilities and gradients equal those of the full `(B, T, V)` path (same model, same loss) up to fp32
  rounding of a differently blocked matmul.
- In a TRAPO step the output layer receives `(N, H)` with N = the counted tokens, never the `(B, T + 1, H)` states
  (on the old code it received every position, prompts and padding included).
- A head that receives something else is left alone and the caller selects the positions itself.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from trl.trainer.utils import selective_log_softmax

from trl_trapo.models import CountedPositionHead, counted_log_probs


def tiny_llama(vocab: int = 97) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).float()


def batch(vocab: int = 97, rows: int = 4, length: int = 17):
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, vocab, (rows, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :5] = 0  # a left-padded row
    counted = torch.rand((rows, length - 1), generator=generator) > 0.5
    counted[0, :5] = False  # padding is never counted
    counted[3] = False  # a row with nothing counted
    return input_ids, attention_mask, counted


def test_restricted_forward_gives_the_counted_logits_and_the_same_gradients():
    input_ids, attention_mask, counted = batch()
    weights = torch.linspace(0.5, 2.0, int(counted.sum()))

    full_model = tiny_llama()
    logits = full_model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (B, T, V)
    full_logps = selective_log_softmax(logits, input_ids[:, 1:])[counted]
    (full_logps * weights).sum().backward()

    model = tiny_llama()
    head = CountedPositionHead(model)
    with head.restrict(counted):
        restricted = model(input_ids=input_ids, attention_mask=attention_mask).logits
    assert restricted.shape == (int(counted.sum()), 97) and CountedPositionHead.applies(restricted, counted)
    logps = counted_log_probs(restricted, input_ids[:, 1:][counted], chunk_tokens=7)  # several chunks
    (logps * weights).sum().backward()

    torch.testing.assert_close(logps, full_logps, rtol=0, atol=2e-6)
    for (name, a), (_, b) in zip(full_model.named_parameters(), model.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
    # outside the context the model is the plain model again
    assert model(input_ids=input_ids).logits.shape == (*input_ids.shape, 97)


def test_a_head_fed_something_else_is_left_alone():
    class TwoStageHead(nn.Module):
        """The output layer reads (B, T + 1, H) reshaped to 2-D: not what the restriction is for."""

        def __init__(self, lm: LlamaForCausalLM):
            super().__init__()
            self.lm = lm

        def get_output_embeddings(self):
            return self.lm.get_output_embeddings()

        def forward(self, input_ids):
            hidden = self.lm.model(input_ids=input_ids).last_hidden_state
            flat = self.lm.lm_head(hidden.reshape(-1, hidden.shape[-1]))
            return flat.view(*hidden.shape[:2], -1)

    input_ids, _, counted = batch()
    model = TwoStageHead(tiny_llama())
    with CountedPositionHead(model).restrict(counted):
        logits = model(input_ids)
    assert logits.shape == (*input_ids.shape, 97) and not CountedPositionHead.applies(logits, counted)


def test_a_trapo_step_runs_the_output_layer_on_counted_tokens_only(tmp_path, tokenizer, suite, tiny_trainer):
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=2)
    head = trainer.model.get_output_embeddings()
    seen: list[tuple[int, ...]] = []
    counted_tokens: list[int] = []

    def record(module, args, output):
        if torch.is_grad_enabled():  # training forwards (generation and evaluation run without grad)
            seen.append(tuple(args[0].shape))

    original = trainer.compute_loss

    def compute_loss(model, inputs, *args, **kwargs):
        counted_tokens.append(int(inputs["mask"].sum()))
        return original(model, inputs, *args, **kwargs)

    trainer.compute_loss = compute_loss
    handle = head.register_forward_hook(record)
    try:
        trainer.train()
    finally:
        handle.remove()
    assert seen and len(seen) == len(counted_tokens)
    assert [shape[0] for shape in seen] == counted_tokens and all(len(shape) == 2 for shape in seen)
