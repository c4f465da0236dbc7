# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`TRAPOTrainer`'s rollouts: generation rounds, scoring by reward functions / models, reference log-probs,
critic values, advantages and replay trajectories (also for given rollouts: `process_rollouts`), rollout metrics,
and the pre-training check of the reward functions.

`RolloutMixin` is one of `TRAPOTrainer`'s bases; its methods are the trainer's own and use its attributes.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from trl.data_utils import is_conversational
from trl.models import unwrap_model_for_generation

from .data import tokenize_prompt
from .distributed import generation_synced_gpus
from .losses import gae_advantages, group_relative_advantages, kl_estimate, masked_whiten, per_token_rewards
from .models import PolicyAndValueWrapper, completion_logps, reward_model_scores, value_predictions
from .rollout import call_reward_function, generate


class RolloutMixin:
    """`TRAPOTrainer`'s rollout generation, scoring and trajectory building."""

    # =================================================================================================================
    # Reward functions: call arguments and the pre-training check
    # =================================================================================================================
    def _reward_kwargs(self, examples: list[dict]) -> dict[str, Any]:
        keys = [k for k in examples[0] if k not in ("prompt", "completion", "completion_ids", "prompt_ids")]
        kwargs = {k: [e[k] for e in examples] for k in keys}
        kwargs["trainer_state"] = getattr(self, "state", None)
        kwargs["log_metric"] = lambda name, value: self._pending_reward_metrics[name].append(float(value))
        kwargs["log_extra"] = lambda column, values: self._pending_extra[column].extend(values)
        return kwargs

    def _preflight_reward_funcs(self, tokenizer) -> None:
        """Call every reward function once on two dataset rows with placeholder completions, before training."""
        rows = [self._rl_dataset[i] for i in range(min(2, len(self._rl_dataset)))]
        prompts = [r["prompt"] for r in rows]
        conversational = is_conversational({"prompt": prompts[0]})
        completions = [[{"role": "assistant", "content": ""}] if conversational else "" for _ in rows]
        self._pending_reward_metrics = defaultdict(list)
        self._pending_extra = defaultdict(list)
        for func, name in zip(self.reward_funcs, self.reward_func_names):
            if isinstance(func, nn.Module):
                continue
            call_reward_function(
                func,
                name,
                len(rows),
                dict(
                    prompts=prompts,
                    completions=completions,
                    completion_ids=[[] for _ in rows],
                    **self._reward_kwargs(rows),
                ),
            )

    # =================================================================================================================
    # Rollouts
    # =================================================================================================================
    def _policy_for_generation(self, unwrapped: nn.Module) -> nn.Module:
        return unwrapped.policy if isinstance(unwrapped, PolicyAndValueWrapper) else unwrapped

    @torch.no_grad()
    def _generate_round(self, rows_needed: int, step: int) -> None:
        """Generate, score and store enough trajectories for `num_mini_batches` steps of `rows_needed` RL rows."""
        args = self.args
        group = 1 if self._has_critic else args.num_generations
        num_prompts = max(math.ceil(rows_needed * args.num_mini_batches / group), 1)
        examples = [self._rl_dataset[i] for i in self.memory_pool.select_prompts(num_prompts, step)]
        examples = [e for e in examples for _ in range(group)]
        temperature = self.memory_pool.rollout_temperature(args.temperature)  # few-shot mode anneals it
        generation_config = self.generation_config
        if temperature != generation_config.temperature:
            generation_config = copy.deepcopy(generation_config)
            generation_config.temperature = temperature
        prompt_ids = [torch.tensor(e["prompt_ids"], dtype=torch.long) for e in examples]
        if self._vllm is not None:  # vLLM samples; cutting, behaviour log-probs and scoring are process_rollouts'
            completion_ids = self._vllm.generate([p.tolist() for p in prompt_ids], group, step)
            self.replay.add(self.process_rollouts(examples, completion_ids, None, group, temperature), step)
            return
        with self._unwrapped_for_rollouts() as unwrapped:
            # step 1. generate (behaviour log-probs are recorded during sampling)
            policy = self._policy_for_generation(unwrapped)
            sampling_seed = int(torch.randint(0, 2**62, (1,), generator=self._generation_generator))
            devices = [self.accelerator.device.index or 0] if self.accelerator.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(sampling_seed)
                try:
                    generated = generate(
                        policy,
                        [p.tolist() for p in prompt_ids],
                        generation_config,
                        self.processing_class.pad_token_id,
                        self._stop_token_id,
                        temperature,
                        batch_size=args.local_rollout_forward_batch_size,
                        synced_gpus=generation_synced_gpus(self.accelerator, args.ds3_gather_for_generation),
                    )
                except RuntimeError as error:
                    if "probability tensor" not in str(error):
                        raise
                    raise RuntimeError(
                        f"Training diverged before step {step}: the policy's next-token probabilities are not finite "
                        f"(`{error}`), so no rollout can be sampled. Lower learning_rate (now {args.learning_rate}) "
                        f"or max_grad_norm (now {args.max_grad_norm}) and resume from the last checkpoint of "
                        f"{args.output_dir}; `train/nonfinite_steps` counts the steps already skipped."
                    ) from error
            # steps 2-4. reference log-probs, values, scores, advantages
            trajectories = self._score_rollouts(
                unwrapped,
                examples,
                prompt_ids,
                generated["completion_ids"],
                generated["old_per_token_logps"],
                group,
                temperature,
            )
        self.replay.add(trajectories, step)

    @contextmanager
    def _unwrapped_for_rollouts(self):
        """The model unwrapped for generation (weights gathered under ZeRO-3), in eval mode for the duration."""
        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation
        ) as unwrapped:
            was_training = unwrapped.training
            unwrapped.eval()
            try:
                yield unwrapped
            finally:
                unwrapped.train(was_training)

    @torch.no_grad()
    def process_rollouts(
        self,
        examples: list[dict],
        completion_ids: list[torch.Tensor],
        old_per_token_logps: list[torch.Tensor] | None = None,
        group: int | None = None,
        temperature: float | None = None,
    ) -> list[dict]:
        """Turn given rollouts into replay trajectories, exactly as generated ones are (for fixed / external rollouts).

        Each completion is cut after its first stop token; then come the reference log-probs, the critic's values,
        the scores (reward functions / models, `missing_eos_penalty`) and the advantages (GAE with a critic, else
        group-relative over consecutive groups of `group` completions).

        Args:
            examples (`list[dict]`): one dataset row per completion (`prompt` and reward columns; `prompt_ids` is
                computed when absent).
            completion_ids (`list[torch.Tensor]`): `(C_i,)` token ids per completion.
            old_per_token_logps (`list[torch.Tensor]`, *optional*): `(C_i,)` behaviour log-probs; computed with the
                current policy (temperature-scaled) when None.
            group (`int`, *optional*): completions per prompt (default: 1 with a critic, else `num_generations`).
            temperature (`float`, *optional*): the sampling temperature of the completions (default: `temperature`).

        Returns:
            `list[dict]`: trajectories (see `ReplayBuffer`), not yet added to the buffer; completions whose every
            reward is None are dropped.
        """
        group = group or (1 if self._has_critic else self.args.num_generations)
        temperature = self.args.temperature if temperature is None else temperature
        template = self.args.chat_template_kwargs or {}
        prompt_ids = [
            torch.tensor(
                e["prompt_ids"] if "prompt_ids" in e else tokenize_prompt(e["prompt"], self.processing_class, template)
            )
            for e in examples
        ]
        cut = []
        for c in completion_ids:
            c = torch.as_tensor(c, dtype=torch.long)
            if self._stop_token_id is not None and (c == self._stop_token_id).any():
                c = c[: int((c == self._stop_token_id).nonzero()[0]) + 1]
            cut.append(c)
        if old_per_token_logps is not None:
            old_per_token_logps = [lp[: c.numel()] for lp, c in zip(old_per_token_logps, cut)]
        with self._unwrapped_for_rollouts() as unwrapped:
            return self._score_rollouts(unwrapped, examples, prompt_ids, cut, old_per_token_logps, group, temperature)

    def _score_rollouts(
        self, unwrapped, examples, prompt_ids, completion_ids, old_logps, group, temperature
    ) -> list[dict]:
        args = self.args
        pad_id = self.processing_class.pad_token_id
        policy = self._policy_for_generation(unwrapped)
        if old_logps is None:
            old_logps = completion_logps(
                policy, prompt_ids, completion_ids, pad_id, temperature, args.local_rollout_forward_batch_size
            )
        # step 2. reference log-probs and values
        ref_logps = self._reference_logps(policy, prompt_ids, completion_ids, temperature)
        values = None
        if self._has_critic:
            values = value_predictions(
                unwrapped.value_model, prompt_ids, completion_ids, pad_id, args.local_rollout_forward_batch_size
            )
        # step 3. scores; the missing-stop penalty is judged by the configured stop token (EOS if there is none)
        scores, per_func = self._score(examples, prompt_ids, completion_ids)
        stop = self._stop_token_id if self._stop_token_id is not None else self.processing_class.eos_token_id
        has_stop = torch.tensor([bool((c == stop).any()) for c in completion_ids], dtype=torch.bool)
        if args.missing_eos_penalty is not None:
            scores = scores - args.missing_eos_penalty * (~has_stop).float()
        # step 4. advantages
        trajectories = self._make_trajectories(
            prompt_ids, completion_ids, old_logps, ref_logps, values, scores, ~has_stop, group
        )
        self._episode += len(examples) * self.accelerator.num_processes
        self.state.episode = self._episode  # TRL 1.12's OnlineTrainerState.episode, current even between logs
        self._record_rollout_metrics(completion_ids, old_logps, ref_logps, scores, per_func, ~has_stop)
        # few-shot temperature stamps and prototype rewards; adapter-bank reward / KL window
        self.memory_pool.observe_rollouts(scores, old_logps, ref_logps, trajectories, temperature)
        return trajectories

    def _reference_logps(self, policy, prompt_ids, completion_ids, temperature) -> list[torch.Tensor] | None:
        if self.reference is None:
            return None
        pad_id = self.processing_class.pad_token_id
        return self.reference.logps(
            policy, prompt_ids, completion_ids, pad_id, temperature, self.args.local_rollout_forward_batch_size
        )

    def _score(self, examples, prompt_ids, completion_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted score per completion, shape `(B,)` (NaN = no reward), and the per-function rewards `(B, F)`."""
        tokenizer = self.processing_class
        prompts = [e["prompt"] for e in examples]
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        conversational = is_conversational({"prompt": prompts[0]})
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        per_func = torch.full((len(examples), len(self.reward_funcs)), math.nan)
        kwargs = self._reward_kwargs(examples)
        for i, (func, name, reward_tokenizer) in enumerate(
            zip(self.reward_funcs, self.reward_func_names, self.reward_processing_classes)
        ):
            if isinstance(func, nn.Module):
                per_func[:, i] = self._reward_model_scores(
                    func, reward_tokenizer, prompts, texts, prompt_ids, completion_ids
                )
            else:
                values = call_reward_function(
                    func,
                    name,
                    len(examples),
                    dict(
                        prompts=prompts,
                        completions=completions,
                        completion_ids=[c.tolist() for c in completion_ids],
                        **kwargs,
                    ),
                )
                per_func[:, i] = torch.tensor(values)
        valid = ~torch.isnan(per_func)
        weighted = torch.where(valid, per_func * self.reward_weights, torch.zeros(()))
        scores = torch.where(valid.any(dim=1), weighted.sum(dim=1), torch.full((len(examples),), math.nan))
        return scores, per_func

    def _reward_model_scores(self, model, tokenizer, prompts, texts, prompt_ids, completion_ids) -> torch.Tensor:
        same = self._same_tokenizer.get(id(tokenizer))
        if same is None:
            same = tokenizer is self.processing_class or tokenizer.get_vocab() == self.processing_class.get_vocab()
            self._same_tokenizer[id(tokenizer)] = same
        if same:
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            sequences = [torch.cat([p, c]) for p, c in zip(prompt_ids, completion_ids)]
            length = max(s.numel() for s in sequences)
            input_ids = torch.full((len(sequences), length), pad, dtype=torch.long)
            attention_mask = torch.zeros_like(input_ids)
            for i, s in enumerate(sequences):
                input_ids[i, : s.numel()] = s
                attention_mask[i, : s.numel()] = 1
        else:
            if is_conversational({"prompt": prompts[0]}):
                full = [
                    tokenizer.apply_chat_template(p + [{"role": "assistant", "content": t}], tokenize=False)
                    for p, t in zip(prompts, texts)
                ]
            else:
                full = [p + t for p, t in zip(prompts, texts)]
            encoded = tokenizer(
                full, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
            )
            input_ids, attention_mask = encoded["input_ids"], encoded["attention_mask"]
        return reward_model_scores(model, input_ids, attention_mask, self.args.local_rollout_forward_batch_size)

    def _make_trajectories(
        self, prompt_ids, completion_ids, old_logps, ref_logps, values, scores, is_truncated, group
    ) -> list[dict]:
        args = self.args
        batch = len(completion_ids)
        length = max(max(c.numel() for c in completion_ids), 1)
        mask = torch.zeros(batch, length)
        old = torch.zeros(batch, length)
        ref = torch.zeros(batch, length)
        for i, c in enumerate(completion_ids):
            mask[i, : c.numel()] = 1
            old[i, : c.numel()] = old_logps[i]
            if ref_logps is not None:
                ref[i, : c.numel()] = ref_logps[i]
        kl = kl_estimate(old, ref, args.kl_estimator) * mask if ref_logps is not None else torch.zeros_like(mask)
        kl_coef_reward = self.schedules.kl_coef() if (self.kl_penalty == "reward" and ref_logps is not None) else 0.0
        valid = ~torch.isnan(scores)
        safe_scores = torch.nan_to_num(scores, nan=0.0)
        returns = old_values = None
        if self._has_critic:
            value_tensor = torch.zeros(batch, length)
            for i, v in enumerate(values):
                value_tensor[i, : v.numel()] = v
            rewards, _ = per_token_rewards(safe_scores, kl, mask, kl_coef_reward)
            train_mask = mask * valid.unsqueeze(1)
            if args.whiten_rewards and train_mask.sum() >= 2:
                rewards = masked_whiten(rewards, train_mask, shift_mean=False) * train_mask
            advantages, returns = gae_advantages(rewards, value_tensor, train_mask, args.gamma, args.lam)
            if args.whiten_advantages and train_mask.sum() >= 2:
                advantages = masked_whiten(advantages, train_mask) * train_mask
            old_values = value_tensor
        else:
            sequence_reward = scores - kl_coef_reward * kl.sum(dim=1)
            advantages = group_relative_advantages(sequence_reward, group, args.scale_rewards)
            advantages = advantages.unsqueeze(1).expand(batch, length) * mask
        trajectories = []
        for i in range(batch):
            if not valid[i]:
                continue
            n = completion_ids[i].numel()
            counted = mask[i, :n].clone()
            if args.mask_truncated_completions and bool(is_truncated[i]):
                counted.zero_()
            trajectory = {
                "prompt_ids": prompt_ids[i],
                "completion_ids": completion_ids[i],
                "completion_mask": counted,
                "old_per_token_logps": old[i, :n].clone(),
                "advantages": advantages[i, :n].clone().float(),
            }
            if ref_logps is not None:
                trajectory["ref_per_token_logps"] = ref[i, :n].clone()
            if self._has_critic:
                trajectory["returns"] = returns[i, :n].clone().float()
                trajectory["old_values"] = old_values[i, :n].clone().float()
            trajectories.append(trajectory)
        return trajectories

    def _record_rollout_metrics(self, completion_ids, old_logps, ref_logps, scores, per_func, is_truncated) -> None:
        sums = self._rollout_sums
        n = len(completion_ids)
        valid = ~torch.isnan(scores)
        sums["rollouts"] += n
        sums["rollouts_scored"] += float(valid.sum())
        sums["objective/scores"] += float(torch.nan_to_num(scores, nan=0.0).sum())
        kl_sum = 0.0
        if ref_logps is not None:
            for o, r in zip(old_logps, ref_logps):
                kl_sum += float(kl_estimate(o, r, self.args.kl_estimator).sum())
        sums["objective/kl"] += kl_sum
        self.schedules.observe_rollouts(kl_sum, n)  # the adaptive KL controller's input
        sums["objective/entropy"] += float(sum(-o.sum() for o in old_logps))
        sums["completions/mean_length"] += float(sum(c.numel() for c in completion_ids))
        sums["completions/clipped_ratio"] += float(is_truncated.float().sum())
        for i, name in enumerate(self.reward_func_names):
            column = per_func[:, i]
            sums[f"rewards/{name}/mean"] += float(torch.nan_to_num(column, nan=0.0).sum())
            sums[f"rewards/{name}/count"] += float((~torch.isnan(column)).sum())
