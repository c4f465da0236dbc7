# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`TRAPOTrainer`'s evaluation: the public `evaluate` hook (held-out data evaluated by format: greedy rewards for
prompts, pretraining loss for text, SFT loss for demonstrations) and `generate_completions` (TRL 1.12 PPOTrainer's
sample table).

`EvaluationMixin` is one of `TRAPOTrainer`'s bases; its methods are the trainer's own and use its attributes.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any

import torch
from transformers import GenerationConfig
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import print_prompt_completions_sample

from .data import dataset_columns, tokenize_prompt_dataset, tokenize_sft_dataset
from .distributed import generation_synced_gpus
from .rollout import generate


logger = logging.getLogger("trl_trapo.trainer")  # the trainer's logger: these are TRAPOTrainer's methods


class EvaluationMixin:
    """`TRAPOTrainer`'s evaluation and sample completions (public Trainer hook: `evaluate`)."""

    # =================================================================================================================
    # Sample completions (TRL 1.12 PPOTrainer's generate_completions)
    # =================================================================================================================
    @torch.no_grad()
    def generate_completions(self, sampling: bool = False) -> list[dict[str, Any]]:
        """Greedy completions of the eval prompts with their scores, printed as a table (and logged to W&B /
        Trackio when they are in `report_to`), as TRL 1.12's `PPOTrainer.generate_completions` did.

        Args:
            sampling (`bool`): only the first `per_device_eval_batch_size` prompts (used during training).

        Returns:
            `list[dict]`: one `{"prompt", "completion", "score"}` per prompt on this rank (empty without an
            eval dataset of prompts).
        """
        dataset = self.eval_dataset
        if isinstance(dataset, dict):
            dataset = next(iter(dataset.values()), None)
        if dataset is None or not ({"prompt", "input_ids"} & set(dataset_columns(dataset))):
            return []
        if sampling:
            dataset = dataset.select(range(min(len(dataset), self.args.per_device_eval_batch_size)))
        tokenized = tokenize_prompt_dataset(
            dataset, self.processing_class, self.args.max_prompt_length, self.args.chat_template_kwargs, "eval_dataset"
        )
        examples = [tokenized[i] for i in range(len(tokenized))]
        prompt_ids = [torch.tensor(e["prompt_ids"]) for e in examples]
        with self._unwrapped_for_rollouts() as unwrapped:
            generated = generate(
                self._policy_for_generation(unwrapped),
                [p.tolist() for p in prompt_ids],
                self._greedy_generation_config(),
                self.processing_class.pad_token_id,
                self._stop_token_id,
                1.0,
                batch_size=self.args.per_device_eval_batch_size,
                record_logps=False,
            )
        scores, _ = self._score(examples, prompt_ids, generated["completion_ids"])
        completions = self.processing_class.batch_decode(generated["completion_ids"], skip_special_tokens=True)
        table = [
            {"prompt": e["prompt"], "completion": c, "score": float(s)}
            for e, c, s in zip(examples, completions, scores.tolist())
        ]
        if self.accelerator.is_main_process:
            try:
                print_prompt_completions_sample(
                    [r["prompt"] for r in table],
                    completions,
                    {"score": scores.tolist()},
                    None,
                    self.state.global_step,
                    5,
                )
            except ImportError:  # `rich` is optional
                for row in table[:5]:
                    logger.info("step %d | %r -> %r (score %.4f)", self.state.global_step, *row.values())
            report_to = self.args.report_to or []
            if "wandb" in report_to:
                import wandb

                if wandb.run is not None:
                    wandb.log(
                        {"completions": wandb.Table(columns=list(table[0]), rows=[list(r.values()) for r in table])}
                    )
            if "trackio" in report_to:
                import trackio

                trackio.log(
                    {"completions": trackio.Table(columns=list(table[0]), data=[list(r.values()) for r in table])}
                )
        return table

    def _greedy_generation_config(self) -> GenerationConfig:
        greedy = GenerationConfig(**{**self.generation_config.to_dict(), "do_sample": False})
        greedy.temperature = greedy.top_p = greedy.top_k = None
        return greedy

    # =================================================================================================================
    # Evaluation (public Trainer hook: evaluate)
    # =================================================================================================================
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate held-out data by its format, on every rank's shard, reduced across ranks.

        - prompt-only (`prompt` / `input_ids`): greedy completions scored by the reward functions:
          `<prefix>_reward` (weighted, mean over completions with a reward), `<prefix>_rewards/<name>`,
          `<prefix>_completion_length`; with a `split` column, also `<prefix>_reward_<split>` per split.
        - `text`: `<prefix>_pretrain_loss` (nats/token, documents chunked to `pretrain_max_length`).
        - prompt-completion / `messages`: `<prefix>_sft_loss` (nats per completion token).

        A dict of datasets is evaluated one by one with prefix `<prefix>_<name>`.

        Raises:
            ValueError: if there is no eval dataset, or its format is not one of the above.
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("No `eval_dataset`: pass one to the trainer or to `evaluate()`.")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self._evaluate_one(part, f"{metric_key_prefix}_{name}"))
        else:
            metrics = self._evaluate_one(dataset, metric_key_prefix)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _evaluate_one(self, dataset, prefix: str) -> dict[str, float]:
        from .evaluation import document_rows, nll_sum, sft_rows

        columns = dataset_columns(dataset)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        shard = dataset.select(range(rank, len(dataset), world)) if len(dataset) > rank else dataset.select([])
        # every rank enters (gathering ZeRO-3 weights is collective), so shards may hold different numbers of rows
        stack = ExitStack()
        policy = self._policy_for_generation(
            stack.enter_context(unwrap_model_for_generation(self.model_wrapped, self.accelerator))
        )
        was_training = policy.training
        policy.eval()
        pad_id = self.processing_class.pad_token_id
        try:
            if "text" in columns:
                rows = document_rows(shard["text"], self.processing_class, self.args.pretrain_max_length)
                total = nll_sum(policy, rows, pad_id, self.args.per_device_eval_batch_size)
                sums = self._reduce_floats(total)
                return {f"{prefix}_pretrain_loss": sums[0] / max(sums[1], 1.0)}
            if "completion" in columns or "messages" in columns:
                tokenized = (
                    tokenize_sft_dataset(
                        shard, self.processing_class, self.args.sft_max_length, self.args.chat_template_kwargs
                    )
                    if len(shard)
                    else None
                )
                total = (
                    nll_sum(policy, sft_rows(tokenized), pad_id, self.args.per_device_eval_batch_size)
                    if tokenized
                    else (0.0, 0.0)
                )
                sums = self._reduce_floats(total)
                return {f"{prefix}_sft_loss": sums[0] / max(sums[1], 1.0)}
            if "prompt" in columns or "input_ids" in columns:
                return self._evaluate_prompts(shard, prefix, policy)
        finally:
            policy.train(was_training)
            stack.close()
        raise ValueError(
            f"Cannot evaluate a dataset with columns {columns}: expected 'prompt' (greedy rewards), 'text' "
            "(pretraining loss) or 'prompt'+'completion' / 'messages' (SFT loss)."
        )

    def _reduce_floats(self, values) -> list[float]:
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(tensor, reduction="sum").cpu().tolist()

    @torch.no_grad()
    def _evaluate_prompts(self, shard, prefix: str, policy) -> dict[str, float]:
        args = self.args
        names = self.reward_func_names
        splits = sorted(set(shard["split"])) if "split" in dataset_columns(shard) and len(shard) else []
        all_splits = self._gather_strings(splits)
        sums: dict[str, float] = {"n": 0.0, "scored": 0.0, "reward": 0.0, "length": 0.0}
        for name in names:
            sums[f"r/{name}"] = sums[f"c/{name}"] = 0.0
        for split in all_splits:
            sums[f"s/{split}"] = sums[f"sc/{split}"] = 0.0
        if len(shard):
            tokenized = tokenize_prompt_dataset(
                shard, self.processing_class, args.max_prompt_length, args.chat_template_kwargs, name="eval_dataset"
            )
            greedy = self._greedy_generation_config()
            examples = [tokenized[i] for i in range(len(tokenized))]
            prompt_ids = [torch.tensor(e["prompt_ids"]) for e in examples]
            generated = generate(  # `policy` is unwrapped (and gathered) by `_evaluate_one`
                policy,
                [p.tolist() for p in prompt_ids],
                greedy,
                self.processing_class.pad_token_id,
                self._stop_token_id,
                1.0,
                batch_size=args.per_device_eval_batch_size,
                record_logps=False,
                synced_gpus=generation_synced_gpus(self.accelerator, gathered=True),
            )
            scores, per_func = self._score(examples, prompt_ids, generated["completion_ids"])
            valid = ~torch.isnan(scores)
            sums["n"] = float(len(examples))
            sums["scored"] = float(valid.sum())
            sums["reward"] = float(torch.nan_to_num(scores, nan=0.0).sum())
            sums["length"] = float(sum(c.numel() for c in generated["completion_ids"]))
            for i, name in enumerate(names):
                column = per_func[:, i]
                sums[f"r/{name}"] = float(torch.nan_to_num(column, nan=0.0).sum())
                sums[f"c/{name}"] = float((~torch.isnan(column)).sum())
            if splits:
                for split, score in zip(tokenized["split"], scores.tolist()):
                    if score == score:  # not NaN
                        sums[f"s/{split}"] += score
                        sums[f"sc/{split}"] += 1.0
        keys = sorted(sums)
        reduced = dict(zip(keys, self._reduce_floats([sums[k] for k in keys])))
        metrics = {
            f"{prefix}_reward": reduced["reward"] / max(reduced["scored"], 1.0),
            f"{prefix}_completion_length": reduced["length"] / max(reduced["n"], 1.0),
        }
        for name in names:
            if reduced[f"c/{name}"]:
                metrics[f"{prefix}_rewards/{name}"] = reduced[f"r/{name}"] / reduced[f"c/{name}"]
        for split in all_splits:
            metrics[f"{prefix}_reward_{split}"] = reduced[f"s/{split}"] / max(reduced[f"sc/{split}"], 1.0)
        return metrics

    def _gather_strings(self, values: list[str]) -> list[str]:
        if self.accelerator.num_processes == 1:
            return sorted(values)
        from accelerate.utils import gather_object

        return sorted(set(gather_object(list(values))))
