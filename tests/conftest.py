# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Test-wide settings and fixtures: everything runs offline on the CPU, without telemetry, on the tiny built-in model.

Fixtures:
- `tokenizer`: the character-level tokenizer of the built-in tasks (one per test module);
- `suite`: the built-in task suite at `TINY_SUITE` sizes (one per test module; a module may override it);
- `tiny_config`: factory `tiny_config(output_dir, **overrides) -> TRAPOConfig` (`TINY_CONFIG`, then `overrides`);
- `tiny_trainer`: factory `tiny_trainer(output_dir, tokenizer, suite, model=None, train_dataset=None,
  trainer_class=TRAPOTrainer, **overrides) -> TRAPOTrainer` on all three objectives of `suite` (RL with exact match),
  tiny model seeded 0 by default (`trainer_class`: a subclass such as few-shot mode's `FewShotTRAPOTrainer`).

Real data in chat format (GSM8K rows, Shakespeare paragraphs) and a trainer that records every micro-batch it trains
on: `gsm8k_rows`, `gsm8k_chat_datasets`, `RecordingTRAPOTrainer`, `trained_rows` (`from conftest import ...`).

`TINY_CONFIG` and `TINY_SUITE` are plain dicts so that the worker scripts the tests launch in subprocesses
(`tests/durability_worker.py`, `tests/distributed_worker.py`) share them: `from conftest import TINY_CONFIG`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from trl_trapo import TRAPOConfig, TRAPOTrainer  # noqa: E402
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite  # noqa: E402


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
    activation_checkpointing=False,
    pretrain_max_length=24,
    sft_max_length=24,
    max_prompt_length=16,
    response_length=4,
    num_generations=4,
    seed=0,
)
# sizes of the built-in task suite most trainer tests use (`make_task_suite(seed=0, **TINY_SUITE)`)
TINY_SUITE = dict(num_pretrain_docs=60, num_sft_per_task=20, num_rl_per_task=20, num_eval_per_task=4)


def make_tiny_config(output_dir, **overrides) -> TRAPOConfig:
    """`TRAPOConfig` writing to `output_dir` with `TINY_CONFIG`, then `overrides`."""
    return TRAPOConfig(output_dir=str(output_dir), **{**TINY_CONFIG, **overrides})


def make_tiny_trainer(
    output_dir, tokenizer, suite, model=None, train_dataset=None, trainer_class=TRAPOTrainer, **overrides
) -> TRAPOTrainer:
    """`trainer_class` (a `TRAPOTrainer`) on all three objectives of `suite` (RL with exact match), tiny model seeded
    0 by default."""
    return trainer_class(
        model if model is not None else build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=make_tiny_config(output_dir, **overrides),
        train_dataset=suite.rl_train if train_dataset is None else train_dataset,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )


@pytest.fixture(scope="module")
def tokenizer():
    """The character-level tokenizer of the built-in tasks."""
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def suite():
    """The built-in task suite at `TINY_SUITE` sizes, seed 0."""
    return make_task_suite(seed=0, **TINY_SUITE)


@pytest.fixture
def tiny_config():
    """Factory: `tiny_config(output_dir, **overrides)` -> `TRAPOConfig` (`TINY_CONFIG`, then `overrides`)."""
    return make_tiny_config


@pytest.fixture
def tiny_trainer():
    """Factory: `tiny_trainer(output_dir, tokenizer, suite, model=None, train_dataset=None, trainer_class=TRAPOTrainer,
    **overrides)`."""
    return make_tiny_trainer


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
