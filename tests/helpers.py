# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Shared builders of the tests: a tiny TRAPOConfig and a three-objective trainer on the built-in task suite; real
GSM8K / Shakespeare datasets in chat format and a trainer that records what it trains on (real tokenizer / model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from datasets import Dataset

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.tasks import build_tiny_model, exact_match_reward


ROOT = Path(__file__).resolve().parent.parent
GSM8K_TRAIN = ROOT / "examples" / "data" / "gsm8k" / "train_first1500.jsonl"
SHAKESPEARE_TRAIN = ROOT / "examples" / "data" / "shakespeare" / "train.txt"
CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, as scripts/gsm8k_to_trl.py removes them


# a few fast CPU steps on the tiny model: short sequences, small groups, no saving or reporting
TINY_CONFIG = dict(
    max_steps=4,
    per_device_train_batch_size=8,
    learning_rate=1e-3,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    gradient_checkpointing=False,
    pretrain_max_length=24,
    sft_max_length=24,
    max_prompt_length=16,
    response_length=4,
    num_generations=4,
    seed=0,
)


def tiny_config(tmp_path, **overrides) -> TRAPOConfig:
    """`TRAPOConfig` writing to `tmp_path` with `TINY_CONFIG`, then `overrides`."""
    return TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, **overrides})


def tiny_trainer(tmp_path, tokenizer, suite, model=None, train_dataset=None, **overrides) -> TRAPOTrainer:
    """`TRAPOTrainer` on all three objectives of `suite` (RL with exact match), tiny model seeded 0 by default."""
    return TRAPOTrainer(
        model if model is not None else build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, **overrides),
        train_dataset=suite.rl_train if train_dataset is None else train_dataset,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Real data in chat format (tests/test_real_tokenizer.py, tests/test_real_model.py)
# ---------------------------------------------------------------------------------------------------------------------
def gsm8k_rows(tokenizer, n: int) -> list[dict]:
    """The `n` GSM8K training rows with the fewest question + solution tokens (deterministic; keeps steps short).

    Each row has `question`, `answer` (GSM8K's, ending in `#### N`) and `solution` (the answer without calculator
    annotations).
    """
    rows = [json.loads(line) for line in GSM8K_TRAIN.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        row["solution"] = CALCULATOR.sub("", row["answer"]).strip()
    lengths = tokenizer([r["question"] + r["solution"] for r in rows], add_special_tokens=False)["input_ids"]
    order = sorted(range(len(rows)), key=lambda i: (len(lengths[i]), i))
    return [rows[i] for i in order[:n]]


def gsm8k_chat_datasets(tokenizer, n: int = 4, paragraphs: int = 16) -> dict[str, Dataset]:
    """`train_dataset` (conversational RL prompts with `answer` for `numeric_answer_reward`), `sft_dataset`
    (conversational prompt-completion: the worked solution) and `pretrain_dataset` (Shakespeare paragraphs)."""
    rows = gsm8k_rows(tokenizer, n)
    text = SHAKESPEARE_TRAIN.read_text(encoding="utf-8").split("\n\n")[:paragraphs]
    return dict(
        train_dataset=Dataset.from_list(
            [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]} for r in rows]
        ),
        sft_dataset=Dataset.from_list(
            [
                {
                    "prompt": [{"role": "user", "content": r["question"]}],
                    "completion": [{"role": "assistant", "content": r["solution"]}],
                }
                for r in rows
            ]
        ),
        pretrain_dataset=Dataset.from_list([{"text": p} for p in text]),
    )


class RecordingTRAPOTrainer(TRAPOTrainer):
    """Keeps a CPU copy of every micro-batch `compute_loss` sees (the public hook), to check what is trained on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen_batches: list[dict[str, torch.Tensor]] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        keep = ("objective", "input_ids", "attention_mask", "mask")
        self.seen_batches.append({k: inputs[k].detach().cpu().clone() for k in keep})
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def trained_rows(batches: list[dict], objective: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`(input_ids (L,), mask (L - 1,))` of every trained row of one objective, padding removed."""
    out = []
    for batch in batches:
        for i in (batch["objective"] == objective).nonzero().flatten().tolist():
            n = int(batch["attention_mask"][i].sum())
            out.append((batch["input_ids"][i, :n], batch["mask"][i, : n - 1]))
    return out
