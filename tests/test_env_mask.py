# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Tokens the environment wrote into a completion (completion mask 0, TRL's `env_mask`: tool results) count nowhere.

- GAE steps over them: on the policy's tokens it equals plain GAE on the sequence with those tokens deleted, by hand
  and through a trainer with a critic (advantages, returns and values 0 there).
- Everything trained or logged is unchanged when their ids and the source's log-probs there change: the loss, KL,
  entropy, ratio and clip statistics, the DARE probe's factor, and the stop (an EOS the environment wrote is not the
  policy's stop); `completions/mean_length` counts the policy's tokens, `completions/mean_env_length` the others.
- With behaviour log-probs from the source (anything at the environment's tokens), the first PPO ratio is 1 on every
  policy token.
- The mask survives what stores rows: the replay buffer (compressed) and its checkpoint, self-imitation and its
  checkpoint, and a whole resume (a run resumed from a checkpoint continues exactly as an uninterrupted one).
"""

from __future__ import annotations

import fnmatch

import pytest
import torch
from conftest import tiny_critic
from test_sources import rl_trainer

import trl_trapo.objectives as objectives_module
from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import collate_rows
from trl_trapo.data import tokenize_prompt
from trl_trapo.losses import gae_advantages
from trl_trapo.memory import ReplayBuffer, SuccessReplay, Trajectory
from trl_trapo.models import completion_logps
from trl_trapo.sources import SampledRound
from trl_trapo.tasks import build_tiny_model


TIMING = ("eps", "step_time", "*runtime", "*per_second", "total_flos", "epoch")


def plain_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """GAE on one sequence whose every token is an action, written out (Schulman et al. 2016, eq. 16)."""
    advantages, next_value, next_advantage = [0.0] * len(rewards), 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        next_advantage = delta + gamma * lam * next_advantage
        advantages[t], next_value = next_advantage, values[t]
    return advantages


# ---------------------------------------------------------------------------------------------------------------------
# GAE over the policy's tokens
# ---------------------------------------------------------------------------------------------------------------------
def test_gae_by_hand_on_a_tool_call():
    """Model token, two tool tokens (huge garbage reward and value), model token with the score; gamma = lam = 1."""
    rewards = torch.tensor([[0.0, 100.0, -100.0, 1.0]])
    values = torch.tensor([[0.5, 50.0, -50.0, 0.25]])
    advantages, returns = gae_advantages(rewards, values, torch.tensor([[1, 0, 0, 1]]), gamma=1.0, lam=1.0)
    # compacted: rewards [0, 1], values [0.5, 0.25]: A_1 = 1 - 0.25, A_0 = 0 + 0.25 - 0.5 + A_1 = 0.5
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.0, 0.0, 0.75]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 0.0, 0.0, 1.0]]))


def test_gae_over_environment_tokens_equals_gae_on_the_compacted_sequence():
    generator = torch.Generator().manual_seed(0)
    rows, length, gamma, lam = 6, 12, 0.9, 0.8
    rewards = torch.randn(rows, length, generator=generator) * 10
    values = torch.randn(rows, length, generator=generator) * 10
    mask = (torch.rand(rows, length, generator=generator) > 0.4).float()
    mask[:, -2:] = 0  # padding after the completion as well
    mask[0] = 0  # a row without a single action
    advantages, returns = gae_advantages(rewards, values, mask, gamma, lam)
    for i in range(rows):
        keep = mask[i].bool()
        expected = plain_gae(rewards[i, keep].tolist(), values[i, keep].tolist(), gamma, lam)
        torch.testing.assert_close(advantages[i, keep], torch.tensor(expected), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(returns[i, keep], torch.tensor(expected) + values[i, keep], rtol=1e-5, atol=1e-5)
        assert advantages[i, ~keep].abs().sum() == 0 and returns[i, ~keep].abs().sum() == 0


def test_gae_with_a_prefix_mask_is_the_ppo_recursion_bit_for_bit():
    """Without environment tokens nothing changes: TRL 1.12 PPO's recursion over the padded row, exactly."""
    generator = torch.Generator().manual_seed(1)
    rewards, values = torch.randn(4, 7, generator=generator), torch.randn(4, 7, generator=generator)
    mask = (torch.arange(7) < torch.tensor([[7], [5], [1], [3]])).float()
    v, r = values * mask, rewards * mask
    expected, last = torch.zeros_like(v), torch.zeros(4)
    for t in reversed(range(7)):
        next_values = v[:, t + 1] if t + 1 < 7 else torch.zeros(4)
        last = r[:, t] + 0.95 * next_values - v[:, t] + 0.95 * 0.9 * last
        expected[:, t] = last
    advantages, _ = gae_advantages(rewards, values, mask, 0.95, 0.9)
    assert torch.equal(advantages, expected * mask)


class MaskedRounds:
    """Each round: every prompt of `dataset` in turn, answered with all of `completions` (one group per prompt), each
    with its completion mask; `scores` (a callable of the row count) when given; `logps(prompt_ids, completions)`
    gives the behaviour log-probs when set."""

    def __init__(self, tokenizer, dataset, completions, masks, scores=None, logps=None):
        self.tokenizer, self.dataset, self.completions, self.masks = tokenizer, dataset, completions, masks
        self.scores, self.logps, self.cursor = scores, logps, 0

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        group = len(self.completions)
        examples = []
        for _ in range(max(rows_needed // group, 1)):
            examples += [self.dataset[self.cursor % len(self.dataset)]] * group
            self.cursor += 1
        completions = [torch.tensor(self.completions[i % group]) for i in range(len(examples))]
        masks = [torch.tensor(self.masks[i % group], dtype=torch.float32) for i in range(len(examples))]
        prompt_ids = [torch.tensor(tokenize_prompt(e["prompt"], self.tokenizer)) for e in examples]
        return SampledRound(
            examples,
            completions,
            version=step,
            group=group,
            prompt_ids=prompt_ids,
            completion_mask=masks,
            scores=None if self.scores is None else self.scores(len(examples)),
            old_per_token_logps=None if self.logps is None else self.logps(prompt_ids, completions, masks),
        )


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_critic_trains_on_multi_turn_rounds_with_gae_over_the_policy_tokens(tmp_path, tokenizer, suite):
    """The refusal is gone: with a value model each trajectory's advantages on the policy's tokens are GAE on the
    compacted sequence (score on the last policy token, the critic's values of the policy tokens bootstrapping), and
    advantages, returns, values and behaviour log-probs are 0 on the tool's tokens; `train()` runs."""
    eos = tokenizer.eos_token_id
    completions = [ids(tokenizer, "1") + ids(tokenizer, "=42;") + ids(tokenizer, "7") + [eos]]
    masks = [[1, 0, 0, 0, 0, 1, 1]]
    torch.manual_seed(0)
    source = MaskedRounds(
        tokenizer, suite.rl_train, completions, masks, scores=lambda n: torch.arange(n, dtype=torch.float32)
    )
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=TRAPOConfig(
            output_dir=str(tmp_path),
            report_to="none",
            save_strategy="no",
            activation_checkpointing=False,
            num_generations=1,
            max_steps=2,
            logging_steps=1,
            per_device_train_batch_size=4,
            max_prompt_length=16,
            response_length=8,
            kl_coef=0.0,
            whiten_rewards=False,
            whiten_advantages=False,
            gamma=0.9,
            lam=0.7,
        ),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        value_model=tiny_critic(tokenizer),
        rollout_source=source,
    )
    batch = trainer.collect_rollouts(4, step=0)
    assert len(batch.trajectories) == 4
    for i, trajectory in enumerate(batch.trajectories):
        keep = torch.tensor(masks[0]).bool()
        assert trajectory.completion_mask.tolist() == [float(m) for m in masks[0]]
        for name in ("advantages", "returns", "old_values", "old_per_token_logps"):
            assert getattr(trajectory, name)[~keep].abs().sum() == 0, name
        values = trajectory.old_values[keep].tolist()
        assert all(v != 0 for v in values)  # the critic's predictions, not zeros
        rewards = [0.0] * (len(values) - 1) + [float(batch.scores[i])]
        expected = torch.tensor(plain_gae(rewards, values, 0.9, 0.7))
        torch.testing.assert_close(trajectory.advantages[keep], expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(trajectory.returns[keep], expected + torch.tensor(values), rtol=1e-5, atol=1e-6)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss/value_avg" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)


# ---------------------------------------------------------------------------------------------------------------------
# Nothing trained or logged sees the environment's tokens
# ---------------------------------------------------------------------------------------------------------------------
def masked_run(tmp_path, tokenizer, suite, environment: list, name: str):
    """Two steps on rounds `answer, tool result (middle), answer, trailing tool output`: the trailing tokens are
    `environment` (one per completion), the policy's own tokens never contain EOS (every completion is truncated)."""
    head, middle, tail = ids(tokenizer, "12"), ids(tokenizer, "=5;"), ids(tokenizer, "3")
    completions, masks = [], []
    for extra in environment:
        extra = ids(tokenizer, extra) if isinstance(extra, str) else extra
        completions.append(head + middle + tail + extra)
        masks.append([1] * len(head) + [0] * len(middle) + [1] * len(tail) + [0] * len(extra))
    source = MaskedRounds(
        tokenizer, suite.rl_train, completions, masks, scores=lambda n: torch.tensor([0.0, 1.0, 3.0, 2.0] * (n // 4))
    )
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=TRAPOConfig(
            output_dir=str(tmp_path / name),
            report_to="none",
            save_strategy="no",
            activation_checkpointing=False,
            max_steps=3,
            logging_steps=1,
            per_device_train_batch_size=16,
            num_generations=4,
            max_prompt_length=16,
            response_length=8,
            learning_rate=1e-2,
            kl_coef=0.1,
            entropy_coef=0.01,
            missing_eos_penalty=1.0,
            weighting="dare",  # DARE's probe-driven factors are compared too (the default is static weights)
            dare_update_interval=1,
            curriculum_mixtures=[0.5, 0.0, 0.5] * 3,  # constant shares: enough RL rows for both probe halves
            pretrain_max_length=16,
            cliprange=0.05,
        ),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,  # a second objective: DARE's probe compares them
        processing_class=tokenizer,
        rollout_source=source,
    )
    trainer.train()
    return trainer, [
        {k: v for k, v in h.items() if not any(fnmatch.fnmatch(k, p) for p in TIMING)}
        for h in trainer.state.log_history
    ]


def test_changing_the_environment_tokens_changes_nothing_trained_or_logged(tmp_path, tokenizer, suite):
    """Other ids at the environment's trailing tokens (an EOS among them) and log-probs the source never gave: every
    logged value of three steps (the loss, KL, entropy, ratio and clip statistics, DARE's probe-driven factors, the
    rollout metrics) is identical, bit for bit."""
    eos = tokenizer.eos_token_id
    _, calm = masked_run(tmp_path, tokenizer, suite, ["ok", "ok", "ok", "ok"], "calm")
    _, wild = masked_run(tmp_path, tokenizer, suite, ["z9", [eos, eos], "x!", "q#"], "wild")
    assert calm == wild
    step_logs = [h for h in calm if "loss" in h]
    assert len(step_logs) == 3
    for key in ("policy/kl_avg", "policy/entropy_avg", "policy/clipfrac_avg", "val/ratio", "dare/factor/rl"):
        assert key in step_logs[0], key
    assert any(h["policy/clipfrac_avg"] > 0 for h in step_logs)  # the clip statistic is measured, not 0 throughout
    assert any("dare/signal/rl" in h for h in step_logs)  # the probe measured the RL gradient
    rollout_logs = [h for h in calm if "completions/mean_length" in h]
    assert rollout_logs[0]["completions/mean_length"] == 3.0  # "12" + "3": the policy's tokens only
    assert rollout_logs[0]["completions/mean_env_length"] == 5.0  # "=5;" + "ok": the environment's
    assert rollout_logs[0]["completions/clipped_ratio"] == 1.0  # the EOS the tool wrote is not the policy's stop


def test_the_first_ratio_is_one_on_every_policy_token(tmp_path, tokenizer, suite, monkeypatch):
    """Behaviour log-probs from the source (the trainer's policy, at the sampling temperature; -30 at the tool's
    tokens, which are ignored): in the first step every policy token's ratio is 1 within 1e-6, and only the policy's
    tokens are counted."""
    seen = []

    def recording(per_token_logps, old_per_token_logps, advantages, mask, *args, **kwargs):
        seen.append((per_token_logps.detach().clone(), old_per_token_logps.clone(), mask.clone()))
        return rl_term(per_token_logps, old_per_token_logps, advantages, mask, *args, **kwargs)

    rl_term = objectives_module.rl_term
    monkeypatch.setattr(objectives_module, "rl_term", recording)
    eos = tokenizer.eos_token_id
    completions = [
        ids(tokenizer, "4") + ids(tokenizer, "<7>") + ids(tokenizer, "9") + [eos],
        ids(tokenizer, "12") + [eos],
        ids(tokenizer, "5") + ids(tokenizer, "[0]") + [eos],
        ids(tokenizer, "3") + ids(tokenizer, "##") + ids(tokenizer, "1") + ids(tokenizer, "#") + ids(tokenizer, "0"),
    ]
    masks = [[1, 0, 0, 0, 1, 1], [1, 1, 1], [1, 0, 0, 0, 1], [1, 0, 0, 1, 0, 1]]
    holder = {}

    def logps(prompt_ids, completion_ids, completion_masks):
        policy = holder["trainer"].accelerator.unwrap_model(holder["trainer"].model)
        exact = completion_logps(policy, prompt_ids, completion_ids, holder["trainer"].padding_id, 0.7)
        return [torch.where(m.bool(), lp, torch.tensor(-30.0)) for lp, m in zip(exact, completion_masks)]

    source = MaskedRounds(tokenizer, suite.rl_train, completions, masks, logps=logps)
    trainer = rl_trainer(tmp_path, tokenizer, suite, source, max_steps=1, response_length=8, temperature=0.7)
    holder["trainer"] = trainer
    trainer.train()
    assert seen
    counted = 0
    for per_token_logps, old, mask in seen:
        on = mask.bool()
        ratio = torch.exp(per_token_logps[on] - old[on])
        torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-6)
        assert bool((old[on] > -30.0).all())  # no environment position among the counted ones
        counted += int(on.sum())
    assert counted == 8 * sum(sum(m) for m in masks) // 4  # 8 rows, each of the 4 completions twice


# ---------------------------------------------------------------------------------------------------------------------
# What stores rows keeps the mask
# ---------------------------------------------------------------------------------------------------------------------
def test_the_replay_buffer_keeps_the_mask_compressed_and_through_its_checkpoint():
    mask = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0] * 40)  # long enough for compression to pay
    trajectory = Trajectory(
        prompt_ids=torch.tensor([5, 6, 7]),
        completion_ids=torch.arange(240) % 50,
        completion_mask=mask,
        old_per_token_logps=torch.full((240,), -1.0) * mask,
        advantages=torch.full((240,), 0.5) * mask,
    )
    buffer = ReplayBuffer(capacity=4, max_uses=2, compress=True)
    buffer.add([trajectory] * 3)
    assert buffer.metrics(0)["replay/compressed"] == 1.0  # kept as zstd blobs
    meta, tensors = buffer.state_dict()
    restored = ReplayBuffer(capacity=4, max_uses=2, compress=True)
    restored.load_state_dict(meta, tensors)
    for served in buffer.sample(3, 0) + restored.sample(3, 0):
        assert served.completion_mask.tolist() == mask.tolist()
        row = served.to_row()  # target-aligned: position P - 1 + t predicts completion token t
        assert row.mask.tolist() == [0.0, 0.0] + mask.tolist()
        batch = collate_rows([row], pad_token_id=0)
        assert batch["mask"][0].tolist() == [0.0, 0.0] + mask.tolist()


def test_self_imitation_keeps_a_multi_turn_success_with_its_mask_through_its_checkpoint():
    replay = SuccessReplay(min_reward=1.0, fraction=1.0, max_uses=2, capacity=4)
    prompts = [torch.tensor([1, 2]), torch.tensor([1, 2])]
    completions = [torch.tensor([10, 11, 12, 13]), torch.tensor([20, 21])]
    masks = [torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.ones(2)]
    kept = replay.observe(prompts, completions, torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.bool), 2,
                          completion_masks=masks)  # fmt: skip
    assert kept == 1
    restored = SuccessReplay(min_reward=1.0, fraction=1.0, max_uses=2, capacity=4)
    restored.load_state_dict(*replay.state_dict())
    for rows in (replay.take(1), restored.take(1)):
        assert rows[0].input_ids.tolist() == [1, 2, 10, 11, 12, 13]
        assert rows[0].mask.tolist() == [0.0, 1.0, 0.0, 0.0, 1.0]  # target-aligned; the tool's tokens are not imitated
    # a success without environment tokens is stored as before (no mask in its JSON)
    replay.observe(prompts, [torch.tensor([20, 21]), completions[0]], torch.tensor([1.0, 0.0]),
                   torch.zeros(2, dtype=torch.bool), 2, completion_masks=[torch.ones(2), masks[0]])  # fmt: skip
    assert "completion_mask" not in replay.state_dict()[0]["rows"][-1]


def fixed_rollout_func(prompts, trainer):
    """TRL-style: one completion per prompt entry (each prompt comes num_generations=2 times in a row: "1" for the
    first, "22" for the second), a tool result in the middle (env_mask 0); behaviour log-probs left to the trainer
    (None)."""
    tokenizer = trainer.processing_class
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": None, "env_mask": []}
    for i, prompt in enumerate(prompts):
        answer = ("1", "22")[i % 2]
        completion = ids(tokenizer, answer) + ids(tokenizer, "=9;") + ids(tokenizer, answer)
        completion.append(tokenizer.eos_token_id)
        out["prompt_ids"].append(tokenizer.encode(prompt, add_special_tokens=False))
        out["completion_ids"].append(completion)
        out["env_mask"].append([1] * len(answer) + [0, 0, 0] + [1] * len(answer) + [1])
    return out


def resumable(output_dir, tokenizer, suite, **overrides):
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=lambda completions, prompts, **kwargs: [
            float(len(c) + len(p) % 3) for c, p in zip(completions, prompts)
        ],
        args=TRAPOConfig(
            output_dir=str(output_dir),
            report_to="none",
            activation_checkpointing=False,
            max_steps=4,
            logging_steps=1,
            save_strategy="steps",
            save_steps=1,
            per_device_train_batch_size=4,
            num_generations=2,
            num_mini_batches=2,
            num_ppo_epochs=1,
            max_prompt_length=16,
            response_length=8,
            kl_coef=0.05,
            seed=0,
            **overrides,
        ),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        rollout_func=fixed_rollout_func,
    )


def test_a_run_on_rounds_with_environment_tokens_resumes_exactly(tmp_path, tokenizer, suite):
    """Checkpointed at step 1 with half a round still in the replay buffer (a round feeds two steps); the resumed run
    trains on it, then on a round of its own, and its logs and weights equal the uninterrupted run's."""
    whole = resumable(tmp_path / "whole", tokenizer, suite)
    whole.train()
    checkpoint = tmp_path / "whole" / "checkpoint-1"
    assert (checkpoint / "trapo").is_dir()
    resumed = resumable(tmp_path / "resumed", tokenizer, suite)
    resumed.train(resume_from_checkpoint=str(checkpoint))

    def after_step_1(trainer):
        return [
            {k: v for k, v in h.items() if not any(fnmatch.fnmatch(k, p) for p in TIMING)}
            for h in trainer.state.log_history
            if h.get("step", 0) > 1 and "train_loss" not in h  # the Trainer averages train_loss over its own steps
        ]

    assert len(after_step_1(whole)) == 3 and after_step_1(resumed) == after_step_1(whole)
    assert any("completions/mean_env_length" in h for h in after_step_1(whole))  # a round after the resume
    for (name, a), (_, b) in zip(whole.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("bad", [[1, 0, 2], [1, 0.5, 1]])
def test_a_mask_that_is_not_zero_or_one_is_refused(bad):
    with pytest.raises(ValueError, match=r"completion_mask\[0\].*1 on tokens the policy sampled"):
        SampledRound([{"prompt": "x"}], [torch.tensor([1, 2, 3])], version=0, completion_mask=[torch.tensor(bad)])


def test_log_probs_at_environment_tokens_are_ignored_by_the_round():
    """A source may put anything finite there, or nothing sensible (0, +5): the round keeps 0."""
    round_ = SampledRound(
        [{"prompt": "x"}],
        [torch.tensor([1, 2, 3])],
        version=0,
        old_per_token_logps=[torch.tensor([-0.5, 5.0, -0.25])],
        completion_mask=[torch.tensor([1, 0, 1])],
    )
    assert round_.old_per_token_logps[0].tolist() == [-0.5, 0.0, -0.25]
    with pytest.raises(ValueError, match=r"old_per_token_logps\[0\]"):  # at the policy's tokens they are checked
        SampledRound([{"prompt": "x"}], [torch.tensor([1, 2])], version=0,
                     old_per_token_logps=[torch.tensor([5.0, -1.0])], completion_mask=[torch.tensor([1, 0])])  # fmt: skip
