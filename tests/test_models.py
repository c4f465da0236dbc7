# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`model_forward`, the one forward call of every model: extra model inputs reach the model, combined over the rows
of each forward in their order, at every no-grad forward (behaviour / reference log-probs, critic values, reward
scores) and in the policy + critic wrapper."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trl_trapo.models import (
    PolicyAndValueWrapper,
    ReferencePolicy,
    completion_logps,
    model_forward,
    per_token_head_outputs,
    reward_model_scores,
    value_predictions,
)


VOCAB = 11


class TaggedModel(nn.Module):
    """A tiny model that needs an extra input `tag`, `(B,)`: one number per row, added to every position's hidden
    state (so each row's outputs depend on its own tag, and a tag count that differs from the rows fails). Its `score`
    head makes it usable as a critic or reward model too. Records the tags of every call."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, VOCAB)
        self.score = nn.Linear(VOCAB, 1)
        self.config = SimpleNamespace()
        self.tags: list[list[float]] = []

    def forward(self, input_ids, attention_mask, tag, use_cache=None, output_hidden_states=None):
        self.tags.append(tag.tolist())
        hidden = self.embed(input_ids) + tag.view(-1, 1, 1)  # (B, L, V)
        self.score(hidden)  # the per-token head output, read by a hook in per_token_head_outputs
        return SimpleNamespace(logits=hidden)


def rows():
    prompts = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 5, 6])]
    completions = [torch.tensor([7, 8, 9]), torch.tensor([1]), torch.tensor([2, 3])]
    inputs = [{"tag": torch.tensor([float(i + 1)])} for i in range(3)]  # each prompt's own, (1,)
    return prompts, completions, inputs


def test_model_forward_passes_the_model_inputs():
    model = TaggedModel()
    ids, mask = torch.tensor([[1, 2], [3, 4]]), torch.ones(2, 2, dtype=torch.long)
    out = model_forward(model, ids, mask, {"tag": torch.tensor([1.0, 2.0])}, use_cache=False)
    assert model.tags == [[1.0, 2.0]] and out.logits.shape == (2, 2, VOCAB)
    for name in ("input_ids", "attention_mask", "use_cache"):
        with pytest.raises(ValueError, match=f"Model inputs \\['{name}'\\] would replace arguments TRAPO sets"):
            model_forward(model, ids, mask, {name: torch.zeros(2)}, use_cache=False)


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_no_grad_forwards_give_each_row_its_own_model_inputs(batch_size):
    """Batched by `batch_size` rows, each completion's result equals that of its row alone with its own inputs."""
    prompts, completions, inputs = rows()
    model = TaggedModel()

    def alone(function, *args):
        return [function(model, [p], [c], *args, model_inputs=[x])[0] for p, c, x in zip(prompts, completions, inputs)]

    logps = completion_logps(model, prompts, completions, 0, 1.0, batch_size, model_inputs=inputs)
    for got, expected in zip(logps, alone(completion_logps, 0, 1.0, 1)):
        assert torch.allclose(got, expected)
    reference = ReferencePolicy(model=model).logps(model, prompts, completions, 0, 1.0, batch_size, inputs)
    assert all(torch.equal(a, b) for a, b in zip(reference, logps))
    values = value_predictions(model, prompts, completions, 0, batch_size, model_inputs=inputs)
    for got, expected in zip(values, alone(value_predictions, 0, 1)):
        assert torch.allclose(got, expected)
    ids = torch.tensor([[1, 2, 0], [3, 4, 5], [6, 0, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    scores = reward_model_scores(model, ids, mask, batch_size, model_inputs=inputs)
    for i in range(3):
        assert torch.allclose(scores[i], reward_model_scores(model, ids[i : i + 1], mask[i : i + 1], 1, [inputs[i]]))
    assert model.tags[-1] == [3.0]


def test_the_policy_and_critic_wrapper_gives_both_models_the_inputs():
    policy, critic = TaggedModel(0), TaggedModel(1)
    wrapper = PolicyAndValueWrapper(policy, critic)
    ids, mask = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]), torch.ones(3, 3, dtype=torch.long)
    tag = torch.tensor([1.0, 2.0, 3.0])
    value_rows = torch.tensor([0, 2])
    outputs, values = model_forward(wrapper, ids, mask, {"tag": tag}, use_cache=False, value_rows=value_rows)
    assert policy.tags == [[1.0, 2.0, 3.0]] and critic.tags == [[1.0, 2.0, 3.0]]  # combined over all rows
    assert torch.equal(outputs.logits, policy(ids, mask, tag).logits)
    assert torch.equal(values, per_token_head_outputs(critic, ids, mask, model_inputs={"tag": tag})[value_rows])
    assert values.requires_grad  # the training forward's critic keeps its graph
