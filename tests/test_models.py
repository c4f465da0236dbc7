# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`model_forward`, the one forward call of every model: extra model inputs reach the model, combined over the rows
of each forward in their order, at every no-grad forward (behaviour / reference log-probs, critic values, reward
scores) and in the policy + critic wrapper. `disable_dropout`: no dropout left anywhere in the models the trainer
holds, so PPO's first ratio is exactly 1."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_SUITE, make_tiny_config
from peft import LoraConfig
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PretrainedConfig

from trl_trapo import TRAPOTrainer
from trl_trapo.async_rollouts import PolicyBlueprint
from trl_trapo.models import (
    PolicyAndValueWrapper,
    ReferencePolicy,
    completion_logps,
    model_forward,
    per_token_head_outputs,
    reward_model_scores,
    value_predictions,
)
from trl_trapo.tasks import DEFAULT_MODEL_CONFIG, build_char_tokenizer, build_tiny_model, make_task_suite
from trl_trapo.tasks.vision import DEFAULT_VLM_CONFIG, build_tiny_vlm, build_vlm_processor, make_visual_task_suite


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


# ---------------------------------------------------------------------------------------------------------------------
# disable_dropout (issue 37, item 5): TRL's `disable_dropout_in_model` zeroes `nn.Dropout` modules only; Llama, Qwen2
# and CLIP apply a float their attention modules copied from the config
# ---------------------------------------------------------------------------------------------------------------------
DROPOUT = 0.5


def dropout_left(model: nn.Module) -> list[str]:
    """Every place of `model` that would still drop something in train mode: `nn.Dropout` modules with `p > 0`,
    non-zero float `*drop*` attributes of its modules and of its configs (sub-configs included)."""
    left, configs = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout) and module.p > 0:
            left.append(f"{name}.p")
        left += [f"{name}.{k}" for k, v in vars(module).items() if type(v) is float and "drop" in k and v]
        if isinstance(getattr(module, "config", None), PretrainedConfig):
            configs.append(module.config)
    while configs:
        config = configs.pop()
        for key, value in vars(config).items():
            if isinstance(value, PretrainedConfig):
                configs.append(value)
            elif type(value) is float and "drop" in key and value:
                left.append(f"{type(config).__name__}.{key}")
    return left


def text_config_file(tmp_path, model_type: str) -> str:
    """The tiny causal LM's JSON as `model_type`, with attention dropout."""
    config = {**json.loads(open(DEFAULT_MODEL_CONFIG).read()), "model_type": model_type, "attention_dropout": DROPOUT}
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(config))
    return str(path)


def vlm_config_file(tmp_path) -> str:
    """The tiny LLaVA's JSON with attention dropout in its language model and in its CLIP vision tower."""
    config = json.loads(open(DEFAULT_VLM_CONFIG).read())
    config["text_config"]["attention_dropout"] = config["vision_config"]["attention_dropout"] = DROPOUT
    path = tmp_path / "llava.json"
    path.write_text(json.dumps(config))
    return str(path)


def rl_config(tmp_path, disable_dropout: bool = True, **overrides):
    """One RL-only step (KL to the reference in the loss) on `TINY_CONFIG`."""
    settings = dict(max_steps=1, pretrain_weight=0.0, sft_weight=0.0, kl_coef=0.05, disable_dropout=disable_dropout)
    return make_tiny_config(tmp_path, **{**settings, **overrides})


def first_step_approx_kl(tmp_path, model_type: str, disable_dropout: bool) -> tuple[float, list[str]]:
    """One RL step of a model with attention dropout 0.5: the step's `policy/approxkl_avg` (the behaviour log-probs
    are no-grad forwards, the step's are train-mode forwards of the same weights) and the policy's dropout left after
    construction."""
    if model_type == "llava":
        processing_class = build_vlm_processor()
        model = build_tiny_vlm(processing_class, vlm_config_file(tmp_path), seed=0)
        suite = make_visual_task_suite(0, num_pretrain_docs=4, num_sft_per_task=4, num_rl_per_task=8)
        args = rl_config(tmp_path, disable_dropout, max_prompt_length=80, response_length=3)
    else:
        processing_class = build_char_tokenizer()
        model = build_tiny_model(processing_class, text_config_file(tmp_path, model_type), seed=0)
        suite = make_task_suite(seed=0, **TINY_SUITE)
        args = rl_config(tmp_path, disable_dropout)
    trainer = TRAPOTrainer(
        model,
        reward_funcs=suite.reward_funcs,
        args=args,
        train_dataset=suite.rl_train,
        processing_class=processing_class,
    )
    left = dropout_left(trainer.model)
    trainer.train()
    (kl,) = [h["policy/approxkl_avg"] for h in trainer.state.log_history if "policy/approxkl_avg" in h]
    return kl, left


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "llava"])
def test_disable_dropout_makes_the_first_ratio_exactly_one(tmp_path, model_type):
    """With `disable_dropout=True` (the default) the first step's approx-KL between the behaviour log-probs and the
    step's own is 0 (float noise) for Llama, Qwen2 and the tiny LLaVA (Llama + CLIP) with attention dropout 0.5; with
    `disable_dropout=False` the same run shows the dropout (the check can fail) and the model keeps its dropout."""
    (tmp_path / "off").mkdir(), (tmp_path / "on").mkdir()
    kl, left = first_step_approx_kl(tmp_path / "off", model_type, disable_dropout=True)
    assert left == [] and kl < 1e-8, (kl, left)
    kl_on, left_on = first_step_approx_kl(tmp_path / "on", model_type, disable_dropout=False)
    assert kl_on > 1e-5 and left_on, (kl_on, left_on)


def test_no_model_the_trainer_holds_has_dropout(tmp_path):
    """Policy, reference (given, or the trainer's copy), value model and teacher lose every dropout, and so does a
    copy rebuilt from the policy's config (the async producer's, as a ZeRO-3 reference is rebuilt)."""
    tokenizer = build_char_tokenizer()
    suite = make_task_suite(seed=0, **TINY_SUITE)
    path = text_config_file(tmp_path, "llama")
    value_config = AutoConfig.for_model(
        **json.loads(open(path).read()), num_labels=1, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id
    )
    value_model = AutoModelForSequenceClassification.from_config(value_config)
    ref_model, teacher = build_tiny_model(tokenizer, path, seed=1), build_tiny_model(tokenizer, path, seed=2)
    assert dropout_left(value_model) and dropout_left(ref_model) and dropout_left(teacher)

    def trainer(**models):
        policy = build_tiny_model(tokenizer, path, seed=0)
        return TRAPOTrainer(
            policy, reward_funcs=suite.reward_funcs, args=rl_config(tmp_path), train_dataset=suite.rl_train,
            processing_class=tokenizer, **models,
        )  # fmt: skip

    copied = trainer()  # the reference is the trainer's copy of the policy
    assert dropout_left(copied.model) == [] and dropout_left(copied.ref_model) == []
    assert copied.model.config.attention_dropout == 0.0
    assert dropout_left(PolicyBlueprint.of(copied.model).build()) == []
    given = trainer(ref_model=ref_model, value_model=value_model, teacher_model=teacher)
    for model in (given.model.policy, given.ref_model, value_model, given.teacher_model):
        assert dropout_left(model) == [], type(model).__name__
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
    adapters = TRAPOTrainer(  # the reference is a frozen copy of the adapter, with LoRA dropout modules of its own
        build_tiny_model(tokenizer, path, seed=0), reward_funcs=suite.reward_funcs,
        args=rl_config(tmp_path, sync_ref_model=True), train_dataset=suite.rl_train, processing_class=tokenizer,
        peft_config=lora,
    )  # fmt: skip
    assert len(adapters.model.peft_config) == 2 and dropout_left(adapters.model) == []
