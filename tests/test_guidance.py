# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Guidance from demonstrations (`trl_trapo/guidance.py`, LUFFY arXiv 2504.14945).

- The shaped off-policy loss is -A * p / (p + gamma) and its `logp_coef` is minus its gradient in log p.
- Demonstrations are tokenised as completions that stopped: the chat template's assistant turn cut after the stop
  token (conversational), or the text plus the stop token (standard); too long or empty ones are dropped.
- A group whose samples all score 0 gets the demonstration: one training step raises log pi(demonstration), where
  without guidance the same step leaves every parameter exactly as it was (all advantages 0).
- Demonstration tokens are left out of the KL term in the loss and of PPO's ratio statistics.
- The off-policy flag survives the replay buffer's checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_critic
from datasets import Dataset
from transformers import AutoTokenizer

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import StepContext, collate_rows
from trl_trapo.data import tokenize_demonstrations, tokenize_prompt_dataset
from trl_trapo.guidance import DemonstrationGuidance
from trl_trapo.losses import shaped_off_policy_loss
from trl_trapo.memory import ReplayBuffer
from trl_trapo.objectives import count_keys, step_counts
from trl_trapo.tasks import build_tiny_model


SMOLLM2 = Path(__file__).resolve().parent / "fixtures" / "smollm2_tokenizer"


def test_shaped_loss_and_its_gradient():
    logps = torch.tensor([[-0.1, -2.0, -6.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0, -0.5]])
    out = shaped_off_policy_loss(logps, advantages, gamma=0.1)
    p = logps.detach().exp()
    torch.testing.assert_close(out.per_token_loss.detach(), -advantages * p / (p + 0.1))
    out.per_token_loss.sum().backward()
    torch.testing.assert_close(out.logp_coef, -logps.grad)  # logp_coef = -d loss / d log p
    # the shaping keeps improbable expert tokens' gradient: at p = e^-6 << gamma the coefficient is ~1/gamma = 10
    # times the unshaped importance-sampling one, A * p
    unshaped = advantages * p
    assert float(out.logp_coef[0, 2] / unshaped[0, 2]) == pytest.approx(float(0.1 / (p[0, 2] + 0.1) ** 2), rel=1e-5)
    assert float(out.logp_coef[0, 2] / unshaped[0, 2]) > 9
    assert not bool(out.is_clipped.any()) and float(out.approx_kl.abs().sum()) == 0.0


def test_demonstrations_are_tokenised_like_stopped_completions(tokenizer):
    smollm2 = AutoTokenizer.from_pretrained(SMOLLM2)
    rows = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "2 + 3 = 5\n#### 5"},
            {"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "answer": ""},  # none
            {"prompt": [{"role": "user", "content": "Long?"}], "answer": "word " * 200},  # too long
        ]
    )
    rl = tokenize_prompt_dataset(rows, smollm2, 64)
    out = tokenize_demonstrations(rl, "answer", smollm2, [smollm2.eos_token_id], response_length=32)
    demo = out["demonstration_ids"]
    assert demo[1] == [] and demo[2] == []
    # ChatML: "2 + 3 = 5\n#### 5<|im_end|>" -- cut after the stop token, as a finished completion is
    assert demo[0][-1] == smollm2.eos_token_id and demo[0].count(smollm2.eos_token_id) == 1
    assert smollm2.decode(demo[0]) == "2 + 3 = 5\n#### 5<|im_end|>"
    # standard prompts: the text plus the stop token
    plain = tokenize_prompt_dataset(Dataset.from_list([{"prompt": "abc=", "answer": "cab"}]), tokenizer, 16)
    ids = tokenize_demonstrations(plain, "answer", tokenizer, [], response_length=8)["demonstration_ids"][0]
    assert ids == tokenizer("cab", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with pytest.raises(ValueError, match="demonstration_column='solution' is not a column"):
        tokenize_demonstrations(plain, "solution", tokenizer, [], response_length=8)
    with pytest.raises(ValueError, match="No row of `train_dataset` keeps a demonstration"):
        tokenize_demonstrations(plain, "answer", tokenizer, [], response_length=2)


def test_guidance_chooses_groups_without_signal():
    examples = [{"demonstration_ids": [1, 2]}] * 8 + [{"demonstration_ids": []}] * 4
    scores = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert DemonstrationGuidance("zero_variance", 0.1).select(examples, scores, 4) == [3]  # not 7 (signal), 11 (none)
    assert DemonstrationGuidance("always", 0.1).select(examples, scores, 4) == [3, 7]


def copy_reward(completions, solution, **kwargs):
    """1 when the completion holds the demonstration's text, else 0 (a random tiny model never writes it)."""
    return [1.0 if s in c else 0.0 for c, s in zip(completions, solution)]


def make_trainer(tmp_path, tokenizer, model, **overrides):
    data = Dataset.from_list([{"prompt": "abc=", "solution": "zyxw"}] * 8)
    config = TRAPOConfig(
        output_dir=str(tmp_path),
        **{
            "max_steps": 1,
            "per_device_train_batch_size": 4,
            "num_generations": 4,
            "response_length": 6,
            "max_prompt_length": 8,
            "learning_rate": 1e-2,
            "kl_coef": 0.0,
            "logging_steps": 1,
            "report_to": "none",
            "save_strategy": "no",
            "activation_checkpointing": False,
            "disable_tqdm": True,
            "seed": 0,
            **overrides,
        },
    )
    return TRAPOTrainer(model, reward_funcs=copy_reward, args=config, train_dataset=data, processing_class=tokenizer)


def demo_logp(model, tokenizer) -> float:
    prompt = tokenizer("abc=")["input_ids"]
    demo = tokenizer("zyxw", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + demo])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    targets = ids[0, 1:]
    return float(logps[torch.arange(len(targets)), targets][len(prompt) - 1 :].sum())


def test_a_group_without_signal_learns_from_the_demonstration(tmp_path, tokenizer):
    unguided = build_tiny_model(tokenizer, seed=0)
    before = {k: v.clone() for k, v in unguided.state_dict().items()}
    trainer = make_trainer(tmp_path / "off", tokenizer, unguided)
    trainer.train()
    log = next(e for e in trainer.state.log_history if "rl/zero_variance_groups" in e)
    assert log["rl/zero_variance_groups"] == 1.0  # every sample scored 0: no RL gradient at all
    assert all(torch.equal(before[k], v) for k, v in unguided.state_dict().items())

    model = build_tiny_model(tokenizer, seed=0)
    start = demo_logp(model, tokenizer)
    trainer = make_trainer(tmp_path / "on", tokenizer, model, demonstration_column="solution")
    trainer.train()
    log = next(e for e in trainer.state.log_history if "rl/guided_groups" in e)
    assert log["rl/guided_groups"] == 1.0 and log["rl/zero_variance_groups"] == 1.0
    assert log["objective/scores"] == 0.0  # rollout metrics describe the samples, not the demonstration
    assert demo_logp(model, tokenizer) > start + 0.5  # nats: the policy moved toward the demonstration


def test_demonstration_tokens_have_no_kl_and_no_ratio_statistics(tmp_path, tokenizer):
    trainer = make_trainer(
        tmp_path, tokenizer, build_tiny_model(tokenizer, seed=0), demonstration_column="solution", kl_coef=0.5
    )
    trainer.collect_rollouts(4, step=0)
    trajectories = trainer.replay.sample(4, step=0)
    assert sum(t.off_policy for t in trajectories) == 1

    def loss_and_stats(shift_demo_ref: float):
        rows = [t.to_row() for t in trajectories]
        for row, t in zip(rows, trajectories):
            if t.off_policy:  # move the demonstration's reference log-probs: the loss must not see it
                row.ref_per_token_logps = row.ref_per_token_logps + shift_demo_ref * row.mask
        batch = collate_rows(rows, tokenizer.pad_token_id)
        context = StepContext(
            step=0,
            weights=(0.0, 0.0, 1.0),
            counts=dict(zip(count_keys(trainer.objectives), step_counts([batch], trainer.objectives).tolist())),
            probe=False,
            num_micro=1,
        )
        trainer.metrics.reset()
        with torch.no_grad():
            loss = trainer.compute_loss(trainer.model, batch, num_items_in_batch=context)
        return float(loss), {k: float(v) for k, v in trainer.metrics.step_sums.items()}

    loss, stats = loss_and_stats(0.0)
    shifted_loss, shifted_stats = loss_and_stats(-5.0)
    assert trainer.kl_penalty == "loss" and shifted_loss == pytest.approx(loss, abs=1e-6)
    assert shifted_stats["policy/kl_avg"] == pytest.approx(stats["policy/kl_avg"], abs=1e-6)
    # first use of the samples: their ratio is 1, whatever pi_theta(demonstration) is
    assert stats["val/ratio"] == pytest.approx(1.0, abs=1e-5) and stats["policy/approxkl_avg"] < 1e-9


def test_the_off_policy_flag_survives_the_replay_checkpoint(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, build_tiny_model(tokenizer, seed=0), demonstration_column="solution")
    trainer.collect_rollouts(4, step=0)
    meta, tensors = trainer.replay.state_dict()
    restored = ReplayBuffer(capacity=100, max_uses=trainer.replay.max_uses)
    restored.load_state_dict(meta, tensors)
    served = restored.sample(4, step=0)
    assert sorted(t.off_policy for t in served) == [False, False, False, True]
    assert collate_rows([t.to_row() for t in served], 0)["off_policy"].tolist() == [t.off_policy for t in served]


def test_guidance_with_a_value_model_is_refused_at_construction(tmp_path, tokenizer):
    critic = tiny_critic(tokenizer)
    data = Dataset.from_list([{"prompt": "abc=", "solution": "zyxw"}] * 8)
    config = TRAPOConfig(
        output_dir=str(tmp_path), demonstration_column="solution", report_to="none", max_prompt_length=8
    )
    with pytest.raises(ValueError, match="demonstration_column='solution' needs group-relative advantages"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=copy_reward,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            value_model=critic,
        )
