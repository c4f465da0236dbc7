# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`TRAPOTrainer`'s training metrics: per-step sums added by the loss, and the public `log` hook that reduces them
across ranks and adds the rollout, curriculum, DARE, schedule, memory-pool and replay metrics to the Trainer's logs.

`MetricsMixin` is one of `TRAPOTrainer`'s bases; its methods are the trainer's own and use its attributes.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from .config import OBJECTIVES
from .distributed import reduce_named_means, reduce_replay_metrics


class MetricsMixin:
    """`TRAPOTrainer`'s metric bookkeeping and logging (public Trainer hook: `log`)."""

    # =================================================================================================================
    # Step metrics (added by compute_loss)
    # =================================================================================================================
    def _is_logging_step(self) -> bool:
        steps = self.args.logging_steps
        if not steps or steps <= 0:
            return False
        steps = int(steps) if steps >= 1 else max(int(steps * self.state.max_steps), 1)
        return (self.state.global_step + 1) % steps == 0

    def _add_metric(self, key: str, value: torch.Tensor) -> None:
        """Add a micro-batch's contribution to a step metric (averaged at log time over the steps that had it)."""
        value = torch.nan_to_num(value.detach().double(), nan=0.0, posinf=0.0, neginf=0.0)
        self._metric_sums[key] = self._metric_sums[key] + value if key in self._metric_sums else value
        self._step_metric_keys.add(key)

    # =================================================================================================================
    # Logging
    # =================================================================================================================
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add TRAPO's metrics (losses per objective, weights, curriculum, rollouts, replay) to the Trainer's logs."""
        if "loss" in logs:
            logs.update(self._collect_metrics())
        super().log(logs, start_time)

    def _collect_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        keys = sorted(self._metric_sums)
        if keys:
            stacked = torch.stack([self._metric_sums[k].to(self.accelerator.device) for k in keys])
            steps = torch.tensor([max(self._metric_steps.get(k, 0), 1) for k in keys], dtype=torch.float64)
            reduced = self.accelerator.reduce(stacked, reduction="sum").cpu() / steps
            values = dict(zip(keys, reduced.tolist()))
            if "val/ratio_sq" in values:
                values["val/ratio_var"] = max(values.pop("val/ratio_sq") - values.get("val/ratio", 0.0) ** 2, 0.0)
            out.update(values)
        for name in OBJECTIVES:
            out.setdefault(f"loss/{name}", 0.0)
        rollout_keys = sorted(self._rollout_sums)
        if rollout_keys:
            stacked = torch.tensor([self._rollout_sums[k] for k in rollout_keys], dtype=torch.float64)
            reduced = dict(
                zip(rollout_keys, self.accelerator.reduce(stacked.to(self.accelerator.device), "sum").cpu().tolist())
            )
            rollouts = max(reduced.get("rollouts", 0.0), 1.0)
            scored = max(reduced.get("rollouts_scored", 0.0), 1.0)
            out["objective/scores"] = reduced.get("objective/scores", 0.0) / scored
            out["objective/kl"] = reduced.get("objective/kl", 0.0) / rollouts
            out["objective/entropy"] = reduced.get("objective/entropy", 0.0) / rollouts
            out["objective/non_score_reward"] = -self.schedules.kl_coef() * out["objective/kl"]
            out["objective/rlhf_reward"] = out["objective/scores"] + out["objective/non_score_reward"]
            out["completions/mean_length"] = reduced.get("completions/mean_length", 0.0) / rollouts
            out["completions/clipped_ratio"] = reduced.get("completions/clipped_ratio", 0.0) / rollouts
            out["val/num_eos_tokens"] = rollouts - reduced.get("completions/clipped_ratio", 0.0)
            for name in self.reward_func_names:
                count = reduced.get(f"rewards/{name}/count", 0.0)
                if count:
                    out[f"rewards/{name}/mean"] = reduced[f"rewards/{name}/mean"] / count
        else:
            out.setdefault("objective/scores", 0.0)
            out.setdefault("objective/kl", 0.0)
        out.update(reduce_named_means(self.accelerator, self._pending_reward_metrics))  # `log_metric` of rewards
        out.update(self.curriculum.metrics(self._last_step_built, self._last_shares))
        out.update(self.dare.metrics())
        out.update(self.schedules.metrics(self._last_step_built))
        out.update(self.memory_pool.metrics())  # sft_pool/*, fewshot/*, adapter_bank/*
        out.update(reduce_replay_metrics(self.accelerator, self.replay.metrics(self.state.global_step)))
        out["episode"] = float(self._episode)
        self.state.episode = self._episode  # TRL 1.12 PPOTrainer kept the counter on the state
        elapsed = time.perf_counter() - self._train_start_time if self._train_start_time else 0.0
        out["eps"] = float(int(self._episode / elapsed)) if elapsed > 0 else 0.0
        if self.lr_scheduler is not None:
            out["lr"] = float(self.lr_scheduler.get_last_lr()[0])
        out["train/nonfinite_steps"] = float(self._nonfinite_steps)
        self._metric_sums = {}
        self._metric_steps = {}
        self._pending_extra = defaultdict(list)
        self._rollout_sums = defaultdict(float)
        self._pending_reward_metrics = defaultdict(list)
        return out
