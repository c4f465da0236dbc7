"""TRAPOTrainer: exactness of the joint loss, gradient accumulation, a short real run, and failing fast."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from datasets import Dataset
from transformers import LlamaForCausalLM

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import Row, StepContext, collate_rows
from trl_trapo.config import PRETRAIN, RL, SFT
from trl_trapo.memory import Trajectory
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward


# ---------------------------------------------------------------------------------------------------------------------
# Fixed rows: the joint gradient and gradient accumulation
# ---------------------------------------------------------------------------------------------------------------------
def fixed_rows(seed: int = 0) -> list[Row]:
    """Rows of all three objectives with different lengths; RL rows carry stale log-probs so some tokens clip."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for length in (12, 9, 15):
        ids = torch.randint(4, 90, (length,), generator=g)
        rows.append(Row(PRETRAIN, ids, torch.ones(length - 1)))
    for prompt_len, completion_len in ((5, 4), (7, 2)):
        ids = torch.randint(4, 90, (prompt_len + completion_len,), generator=g)
        mask = torch.zeros(prompt_len + completion_len - 1)
        mask[prompt_len - 1 :] = 1
        rows.append(Row(SFT, ids, mask))
    for prompt_len, completion_len in ((4, 5), (6, 3), (5, 6), (3, 2)):
        completion = torch.randint(4, 90, (completion_len,), generator=g)
        trajectory = Trajectory(
            prompt_ids=torch.randint(4, 90, (prompt_len,), generator=g),
            completion_ids=completion,
            completion_mask=torch.ones(completion_len),
            # log-probs around log(1/101) with noise, so ratios land on both sides of the clip range
            old_per_token_logps=-4.6 + 0.5 * torch.randn(completion_len, generator=g),
            ref_per_token_logps=-4.6 + 0.3 * torch.randn(completion_len, generator=g),
            advantages=torch.randn(1, generator=g).expand(completion_len).clone(),
        )
        rows.append(trajectory.to_row())
    for i, row in enumerate(rows):
        row.half = i % 2
    return rows


def step_info(rows: list[Row], groups: list[list[Row]], weights) -> StepContext:
    counts = {"tokens_pretrain": 0.0, "tokens_sft": 0.0, "tokens_rl": 0.0, "sequences_rl": 0.0}
    for row in rows:
        n = float(row.mask.sum())
        key = {PRETRAIN: "tokens_pretrain", SFT: "tokens_sft", RL: "tokens_rl"}[row.objective]
        counts[key] += n
        counts["sequences_rl"] += float(row.objective == RL and n > 0)
    counts["micro_batches_rl"] = float(sum(any(r.objective == RL for r in g) for g in groups))
    return StepContext(
        weights=weights,
        counts=counts,
        probe=False,
        step=0,
        num_micro=len(groups),
    )


def gradient(trainer, groups: list[list[Row]], info: StepContext) -> dict[str, torch.Tensor]:
    model = trainer.model
    model.zero_grad(set_to_none=True)
    pad = trainer.processing_class.pad_token_id
    for group in groups:
        loss = trainer.compute_loss(model, collate_rows(group, pad), num_items_in_batch=info)
        loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kl_penalty", ["reward", "loss"])
@pytest.mark.parametrize("sft_loss_type", ["nll", "trust_region"])
def test_joint_gradient_equals_weighted_sum_of_separate_gradients(
    tmp_path, tokenizer, suite, kl_penalty, sft_loss_type, tiny_trainer
):
    trainer = tiny_trainer(
        tmp_path, tokenizer, suite, kl_coef=0.1, kl_penalty=kl_penalty, sft_loss_type=sft_loss_type, entropy_coef=0.01
    )
    rows = fixed_rows()
    weights = (0.2, 0.3, 0.5)
    joint = gradient(trainer, [rows], step_info(rows, [rows], weights))
    expected = None
    for o in (PRETRAIN, SFT, RL):
        part = [r for r in rows if r.objective == o]
        one_hot = tuple(1.0 if i == o else 0.0 for i in range(3))
        info = step_info(rows, [rows], one_hot)  # same global counts as the joint step
        grads = gradient(trainer, [part], info)
        scaled = {k: weights[o] * v for k, v in grads.items()}
        expected = scaled if expected is None else {k: expected[k] + scaled[k] for k in expected}
    assert set(joint) == set(expected)
    for name in joint:
        torch.testing.assert_close(joint[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)
    # the three terms really all contribute (no objective silently dropped)
    for o in (PRETRAIN, SFT, RL):
        info = step_info(rows, [rows], tuple(1.0 if i == o else 0.0 for i in range(3)))
        part = [r for r in rows if r.objective == o]
        assert any(v.abs().sum() > 0 for v in gradient(trainer, [part], info).values())


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_gradient_accumulation_equals_one_large_batch(tmp_path, tokenizer, suite, loss_type, tiny_trainer):
    trainer = tiny_trainer(tmp_path, tokenizer, suite, kl_coef=0.05, loss_type=loss_type)
    rows = fixed_rows(seed=1)
    weights = (0.25, 0.25, 0.5)
    big = gradient(trainer, [rows], step_info(rows, [rows], weights))
    # uneven micro-batches: one without any RL token, one with RL only, one mixed
    pretrain = [r for r in rows if r.objective == PRETRAIN]
    sft = [r for r in rows if r.objective == SFT]
    rl = [r for r in rows if r.objective == RL]
    groups = [pretrain[:2] + sft[:1], rl[:3], pretrain[2:] + sft[1:] + rl[3:]]
    assert not any(r.objective == RL for r in groups[0])
    accumulated = gradient(trainer, groups, step_info(rows, groups, weights))
    for name in big:
        torch.testing.assert_close(accumulated[name], big[name], atol=1e-5, rtol=1e-4, msg=name)


def test_probe_and_policy_metrics_follow_the_loss_actually_optimised(tmp_path, tokenizer, suite, tiny_trainer):
    """With truncated importance sampling, trust-region SFT and prioritised weights, the DARE probe weighs each token
    by -d loss / d log p of the optimised term, and the clip statistics count the tokens the cap truncated."""
    cap, alpha = 1.05, 0.1
    trainer = tiny_trainer(
        tmp_path,
        tokenizer,
        suite,
        importance_sampling_cap=cap,
        cliprange=0.2,  # wider than the cap: PPO's clip would mark other tokens than the truncation does
        sft_loss_type="trust_region",
        trust_region_alpha=alpha,
        kl_coef=0.0,
        entropy_coef=0.0,
    )
    rows = fixed_rows(seed=3)
    for row in rows:
        if row.objective == SFT:
            row.importance_weight = 0.5
    batch = collate_rows(rows, tokenizer.pad_token_id)
    recorded = {}
    trainer.dare.probe = trainer.dare.probe_factory()
    trainer.dare.probe.reset()

    def record(hidden, logits, targets, coefficients, objective, half):
        recorded.update(coefficients=coefficients.clone(), objective=objective.clone())

    trainer.dare.probe.accumulate = record
    context = step_info(rows, [rows], (0.2, 0.3, 0.5))
    context.probe = True
    trainer.metrics.reset()
    with torch.no_grad():
        trainer.compute_loss(trainer.model, batch, num_items_in_batch=context)
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        logps = torch.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    counted = batch["mask"].bool()
    objective = batch["objective"].unsqueeze(1).expand_as(counted)[counted]
    assert torch.equal(recorded["objective"], objective)
    coefficients = recorded["coefficients"]
    ratio = torch.exp(logps - batch["old_per_token_logps"])[counted]
    expected = torch.ones_like(ratio)
    sft, rl = objective == SFT, objective == RL
    expected[sft] = torch.clamp(logps.exp()[counted][sft] / alpha, max=1.0) * 0.5  # trust region x importance
    expected[rl] = torch.clamp(ratio[rl], max=cap) * batch["advantages"][counted][rl]  # min(cap, rho) x A
    torch.testing.assert_close(coefficients, expected, atol=1e-5, rtol=1e-4)
    assert bool((ratio[rl] > cap).any()) and bool((ratio[rl] <= cap).any())
    truncated = float((ratio[rl] > cap).float().mean())
    assert trainer.metrics.step_sums["policy/clipfrac_avg"].item() == pytest.approx(truncated, abs=1e-6)


def test_first_use_ratio_is_one_for_fresh_rollouts(tmp_path, tokenizer, suite, tiny_trainer):
    """Behaviour log-probs recorded during generation equal the training forward's log-probs (ratio 1)."""
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=1)
    trainer.create_optimizer()  # not needed for the forward; ensures the guard installs cleanly
    trainer.collect_rollouts(8, step=0)
    trajectories = trainer.replay.sample(8, step=0)
    rows = [t.to_row() for t in trajectories]
    batch = collate_rows(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps = torch.log_softmax(logits[:, :-1] / trainer.args.temperature, -1)
        logps = logps.gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = batch["mask"].bool()
    assert mask.sum() > 0
    torch.testing.assert_close(logps[mask], batch["old_per_token_logps"][mask], atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------------------------------
# A short real run
# ---------------------------------------------------------------------------------------------------------------------
REQUIRED_METRICS = (  # state: in every log
    "weight/pretrain",
    "weight/sft",
    "weight/rl",
    "curriculum/pretrain",
    "curriculum/sft",
    "curriculum/rl",
    "replay/size",
)
MEASURED_METRICS = ("loss/pretrain", "loss/sft", "loss/rl", "objective/kl", "objective/scores")  # where measured


def test_short_run_changes_every_parameter_and_logs_metrics(tmp_path, tokenizer, suite, tiny_trainer):
    model = build_tiny_model(tokenizer, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = tiny_trainer(
        tmp_path, tokenizer, suite, model=model, weight_decay=0.0, max_steps=4, dare_update_interval=2
    )
    trainer.train()
    for name, param in model.named_parameters():
        assert not torch.equal(param.detach(), before[name]), f"{name} did not change"
    train_logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(train_logs) == 4
    for log in train_logs:
        for key in REQUIRED_METRICS:
            assert key in log and math.isfinite(log[key]), (key, log)
        assert abs(log["weight/pretrain"] + log["weight/sft"] + log["weight/rl"] - 1) < 1e-6
        assert abs(log["curriculum/pretrain"] + log["curriculum/sft"] + log["curriculum/rl"] - 1) < 1e-6
        for key in MEASURED_METRICS:  # absent from a log that measured nothing (tests/test_metrics.py), never 0
            assert key not in log or math.isfinite(log[key]), (key, log)
    for key in MEASURED_METRICS:
        assert any(key in log for log in train_logs), key
    assert train_logs[-1]["replay/size"] > 0
    trainer.save_state()
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    assert all(key in state["log_history"][0] for key in REQUIRED_METRICS)


# ---------------------------------------------------------------------------------------------------------------------
# Extra model inputs (the slot a vision-language model's pixel_values take)
# ---------------------------------------------------------------------------------------------------------------------
class TaggedLlama(LlamaForCausalLM):
    """The tiny model, needing an extra input `row_tag`: `(B, 2)` long, one line per row, [P, sum of the P prompt
    ids]. Every forward checks it is there and that line b describes the first real tokens of row b (whatever the
    padding side), and records who ran it: `(role, phase)`, phase "generate", "train" (grad) or "no_grad"."""

    def forward(self, input_ids=None, attention_mask=None, row_tag=None, **kwargs):
        assert row_tag is not None, "a forward without its model inputs"
        assert row_tag.shape == (input_ids.shape[0], 2), (row_tag.shape, input_ids.shape)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None or cache.get_seq_length() == 0:  # a whole-sequence forward (not a cached decoding step)
            masks = torch.ones_like(input_ids) if attention_mask is None else attention_mask  # generate may give None
            for ids, mask, (length, total) in zip(input_ids, masks, row_tag.tolist()):
                assert int(ids[mask.bool()][:length].sum()) == total, "model inputs not aligned with their rows"
        phase = "generate" if self.generating else "train" if torch.is_grad_enabled() else "no_grad"
        self.calls.append((self.role, phase))
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def generate(self, *args, **kwargs):
        self.generating = True
        try:
            return super().generate(*args, **kwargs)
        finally:
            self.generating = False


def test_model_inputs_reach_generation_the_reference_and_the_training_forward(tmp_path, tokenizer, suite, tiny_config):
    from trl_trapo.data import tokenize_prompt

    def tag(example):
        ids = tokenize_prompt(example["prompt"], tokenizer)
        return {"model_inputs": {"row_tag": [[len(ids), sum(ids)]]}}

    model = build_tiny_model(tokenizer, seed=0)
    model.__class__ = TaggedLlama
    model.role, model.generating, model.calls = "policy", False, []
    trainer = TRAPOTrainer(
        model,
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, max_steps=2, per_device_train_batch_size=4),
        train_dataset=suite.rl_train.map(tag),
        processing_class=tokenizer,
    )
    trainer.ref_model.role, trainer.ref_model.calls = "reference", model.calls
    trainer.train()
    assert {("policy", "generate"), ("reference", "no_grad"), ("policy", "train")} <= set(model.calls)


# ---------------------------------------------------------------------------------------------------------------------
# Failing fast, before training
# ---------------------------------------------------------------------------------------------------------------------
def test_no_objective_has_data(tmp_path, tokenizer, tiny_config):
    with pytest.raises(ValueError, match="No objective has data"):
        TRAPOTrainer(build_tiny_model(tokenizer), args=tiny_config(tmp_path), processing_class=tokenizer)


def test_dataset_missing_columns(tmp_path, tokenizer, tiny_config):
    for data, missing in [
        (dict(pretrain_dataset=Dataset.from_dict({"content": ["abc"]})), "'text' column"),
        (dict(sft_dataset=Dataset.from_dict({"prompt": ["a"]})), "'prompt' and 'completion'"),
        (
            dict(train_dataset=Dataset.from_dict({"question": ["a"]}), reward_funcs=exact_match_reward),
            "'prompt' column",
        ),
    ]:
        with pytest.raises(ValueError, match=missing):
            TRAPOTrainer(build_tiny_model(tokenizer), args=tiny_config(tmp_path), processing_class=tokenizer, **data)


def test_rl_without_reward(tmp_path, tokenizer, suite, tiny_config):
    with pytest.raises(ValueError, match="without any reward"):
        TRAPOTrainer(
            build_tiny_model(tokenizer),
            args=tiny_config(tmp_path),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )


def test_sft_or_pretraining_rows_as_train_dataset_are_pointed_to_their_argument(
    tmp_path, tokenizer, suite, tiny_config
):
    """TRL's SFTTrainer takes its data as `train_dataset`, TRAPO's RL prompts slot (trial 11's N60): SFT rows were
    told to "set rl_weight=0" (dropping the only data) or "must have a 'prompt' column", never `sft_dataset=`."""
    messages = Dataset.from_dict(
        {"messages": [[{"role": "user", "content": "ab"}, {"role": "assistant", "content": "b"}]]}
    )
    for data, rewards, wanted in [
        (suite.sft, {}, "`sft_dataset=`"),
        (messages, {}, "`sft_dataset=`"),
        (messages, {"reward_funcs": exact_match_reward}, "`sft_dataset=`"),
        (suite.pretrain, {}, "`pretrain_dataset=`"),
    ]:
        with pytest.raises(ValueError) as raised:
            TRAPOTrainer(
                build_tiny_model(tokenizer),
                args=tiny_config(tmp_path),
                train_dataset=data,
                processing_class=tokenizer,
                **rewards,
            )
        message = str(raised.value)
        assert message.startswith("`train_dataset` is the RL prompts, and these rows have a"), message
        assert wanted in message, message
        assert "rl_weight=0" not in message, message
    # with a reward, a prompt-completion train_dataset stays RL prompts (its 'completion' unused, as in TRL's GRPO);
    # a reward's missing column then names the SFT slot too
    with pytest.raises(RuntimeError, match="needs the argument") as raised:
        TRAPOTrainer(
            build_tiny_model(tokenizer),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path),
            train_dataset=suite.sft,
            processing_class=tokenizer,
        )
    assert "Its 'completion' column is not passed to reward functions" in str(raised.value)
    assert "pass them as `sft_dataset=`: `train_dataset` is the RL prompts." in str(raised.value)


@pytest.mark.parametrize(
    "reward, message",
    [
        (lambda prompts, completions, **kw: [1.0], "returned 1 rewards for 2 completions"),
        (lambda prompts, completions, **kw: 1 / 0, "raised ZeroDivisionError"),
        (lambda prompts, completions, **kw: [math.inf] * len(prompts), "infinite reward"),
    ],
)
def test_bad_reward_functions_fail_before_training(tmp_path, tokenizer, suite, reward, message, tiny_config):
    with pytest.raises((ValueError, RuntimeError), match=message):
        TRAPOTrainer(
            build_tiny_model(tokenizer),
            reward_funcs=reward,
            args=tiny_config(tmp_path),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )


def test_prompt_longer_than_context(tmp_path, tokenizer, tiny_config):
    data = Dataset.from_dict({"prompt": ["rev abc=", "x" * 40], "answer": ["cba", "y"]})
    with pytest.raises(ValueError, match="longer than max_prompt_length=16"):
        TRAPOTrainer(
            build_tiny_model(tokenizer),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path),
            train_dataset=data,
            processing_class=tokenizer,
        )


def test_tokenizer_without_pad_token(tmp_path, suite, tiny_config):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer)
    tokenizer.pad_token = None
    with pytest.raises(ValueError, match="pad_token"):
        TRAPOTrainer(model, args=tiny_config(tmp_path), sft_dataset=suite.sft, processing_class=tokenizer)


def test_pad_equal_to_eos_still_trains_on_eos(tmp_path, suite, tiny_config):
    """pad == EOS is handled by construction: the SFT mask still counts the EOS token."""
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer), args=tiny_config(tmp_path), sft_dataset=suite.sft, processing_class=tokenizer
    )
    rows = trainer.memory_pool.sft_pool.take(4)
    for row in rows:
        eos_positions = (row.input_ids[1:] == tokenizer.eos_token_id).nonzero().squeeze(-1)
        assert eos_positions.numel() == 1 and row.mask[eos_positions].item() == 1


def test_nonfinite_loss_skips_steps_then_stops(tmp_path, tokenizer, suite, tiny_trainer):
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=6, max_nonfinite_steps=3)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    original = trainer.compute_loss

    def poisoned(*args, **kwargs):
        return original(*args, **kwargs) * torch.tensor(float("nan"))

    trainer.compute_loss = poisoned
    with pytest.raises(RuntimeError, match="3 optimizer steps had a non-finite loss"):
        trainer.train()
    assert trainer.nonfinite.steps == 3
    for name, param in trainer.model.named_parameters():  # every poisoned step was skipped
        assert torch.equal(param.detach(), before[name]), name


def test_a_second_train_trains_again_as_a_transformers_trainer_does(tmp_path, tokenizer, suite, tiny_trainer):
    """A second `train()` was torch's `AttributeError: 'function' object has no attribute '__func__'`: the scheduler
    transformers builds anew for it wraps `optimizer.step`, which the non-finite guard had made a plain function (T01).
    As with a transformers `Trainer`: the same optimizer, a fresh scheduler and step count, `max_steps` more steps;
    the guard still skips a non-finite step."""
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=2)
    trainer.train()
    after_first = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), after_first[n]) for n, p in trainer.model.named_parameters())
    after_second = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    original = trainer.compute_loss
    trainer.compute_loss = lambda *args, **kwargs: original(*args, **kwargs) * torch.tensor(float("nan"))
    trainer.train()  # a third run, every loss poisoned: each step skipped (max_nonfinite_steps is 10)
    assert trainer.nonfinite.steps == 2
    for name, param in trainer.model.named_parameters():
        assert torch.equal(param.detach(), after_second[name]), name


def test_sync_ref_model_moves_the_reference_and_survives_resume(tmp_path, tokenizer, suite, tiny_trainer):
    trainer = tiny_trainer(
        tmp_path,
        tokenizer,
        suite,
        kl_coef=0.05,
        sync_ref_model=True,
        ref_model_sync_steps=2,
        ref_model_mixup_alpha=0.5,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
    )
    initial = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    policy = dict(trainer.model.named_parameters())
    for name, param in trainer.ref_model.named_parameters():
        assert not torch.equal(param, initial[name]), name  # the reference moved towards the policy
        assert not torch.equal(param, policy[name]), name  # but is not a copy of it (alpha = 0.5)
    resumed = tiny_trainer(
        tmp_path,
        tokenizer,
        suite,
        kl_coef=0.05,
        sync_ref_model=True,
        ref_model_sync_steps=2,
        ref_model_mixup_alpha=0.5,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
    )
    resumed.run_state.load(str(tmp_path / "checkpoint-2"))
    saved = __import__("safetensors.torch", fromlist=["load_file"]).load_file(
        str(tmp_path / "checkpoint-2" / "trapo" / "rank0-tensors.safetensors")
    )
    for name, param in resumed.ref_model.named_parameters():
        if f"ref_model/{name}" in saved:
            torch.testing.assert_close(param, saved[f"ref_model/{name}"])


def test_lengths_beyond_the_model_context_fail_before_training(tmp_path, tokenizer, suite, tiny_config):
    model = build_tiny_model(tokenizer)
    context = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"pretrain_max_length={context + 1} exceeds the model's context"):
        TRAPOTrainer(
            model,
            args=tiny_config(tmp_path, pretrain_max_length=context + 1),
            pretrain_dataset=suite.pretrain,
            processing_class=tokenizer,
        )
    long_sft = Dataset.from_dict({"prompt": ["a" * context], "completion": ["b" * 8]})
    with pytest.raises(ValueError, match=f"sft_max_length={context + 64}.*set sft_max_length <= {context}"):
        TRAPOTrainer(
            model,
            args=tiny_config(tmp_path, sft_max_length=context + 64),
            sft_dataset=long_sft,
            processing_class=tokenizer,
        )


def test_streaming_rl_prompts_and_unevaluable_eval_data_fail_before_training(tmp_path, tokenizer, suite, tiny_config):
    with pytest.raises(ValueError, match="IterableDataset.*map-style"):
        TRAPOTrainer(
            build_tiny_model(tokenizer),
            reward_funcs=exact_match_reward,
            args=tiny_config(tmp_path),
            train_dataset=suite.rl_train.to_iterable_dataset(),
            processing_class=tokenizer,
        )
    with pytest.raises(ValueError, match=r"`eval_dataset` has columns \['answer', 'q'\]"):
        TRAPOTrainer(
            build_tiny_model(tokenizer),
            args=tiny_config(tmp_path),
            sft_dataset=suite.sft,
            eval_dataset=Dataset.from_dict({"q": ["a"], "answer": ["b"]}),
            processing_class=tokenizer,
        )


@pytest.mark.parametrize("rate", [-1e-3, 0.0, math.nan])
def test_learning_rate_must_be_positive(tmp_path, rate):
    with pytest.raises(ValueError, match="TRAPOConfig.learning_rate="):
        TRAPOConfig(output_dir=str(tmp_path), learning_rate=rate)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"per_device_train_batch_size": 0}, "per_device_train_batch_size=0"),
        ({"per_device_train_batch_size": -4}, "per_device_train_batch_size=-4"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0"),
        ({"max_steps": -1, "num_train_epochs": 0}, "num_train_epochs=0"),  # was a ZeroDivisionError at construction
    ],
)
def test_batch_and_run_length_are_checked_by_the_config(tmp_path, kwargs, field):
    # a new user's report: torch's "batch_size should be a positive integer" after the model loaded, no field named
    with pytest.raises(ValueError, match=f"TRAPOConfig.{field} is invalid"):
        TRAPOConfig(output_dir=str(tmp_path), **kwargs)


def test_a_missing_model_folder_is_named_by_the_python_api(tmp_path, tokenizer, suite):
    # a new user's report: transformers' "Repo id must be in the form ..." for a mistyped local path
    missing = str(tmp_path / "no_model")
    with pytest.raises(ValueError, match=r"model='.*no_model': no such directory"):
        TRAPOTrainer(missing, args=TRAPOConfig(output_dir=str(tmp_path)), sft_dataset=suite.sft)
    with pytest.raises(ValueError, match=r"reward_funcs='.*no_model': no such directory"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=missing,
            args=TRAPOConfig(output_dir=str(tmp_path)),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )


def test_diverged_policy_gives_a_clear_error_at_the_next_rollout(tmp_path, tokenizer, suite, tiny_trainer):
    trainer = tiny_trainer(tmp_path, tokenizer, suite)
    with torch.no_grad():
        trainer.model.lm_head.weight.fill_(math.nan)
    with pytest.raises(RuntimeError, match="Training diverged before step 3.*Lower learning_rate"):
        trainer.collect_rollouts(4, step=3)


@pytest.mark.parametrize("lora, checkpointing", [(True, False), (False, True)], ids=["lora", "checkpointing"])
def test_no_transformers_deprecation_warnings_the_user_cannot_fix(tmp_path, tokenizer, suite, lora, checkpointing):
    # new users' reports: FutureWarnings on every run, raised by the project's own calls — "`is_gradient_checkpointing`
    # is deprecated" from get_peft_model (LoRA) and TRL's unwrap_model_for_generation, "`gradient_checkpointing_disable`
    # is deprecated" when unwrap_model_for_generation turns activation checkpointing off and on around generation
    from peft import LoraConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=lambda completions, **kw: [float(len(c) % 2) for c in completions],
            args=TRAPOConfig(
                output_dir=str(tmp_path),
                max_steps=1,
                per_device_train_batch_size=8,
                num_generations=4,
                response_length=4,
                max_prompt_length=16,
                report_to="none",
                activation_checkpointing=checkpointing,
                disable_tqdm=True,
            ),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
            if lora
            else None,
        )
        trainer.train()
    deprecations = [str(w.message) for w in caught if "gradient_checkpointing" in str(w.message)]
    assert not deprecations, deprecations
