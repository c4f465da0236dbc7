"""The code of `docs/migrating_from_ppo.md` runs as written.

Every ```python block whose first line is `# run: ...` is executed in order, in a namespace holding the objects a
TRL 1.12 PPO pipeline already has (`tokenizer`, `policy`, `ref_policy`, `reward_model`, `value_model`,
`train_dataset`), built from the tiny fixture models. The blocks carry their own assertions. They also pin three
drop-in regressions: training with TRL's default `gradient_checkpointing=True` (the policy + critic wrapper must
accept transformers' `activation_checkpointing_enable` call), `trainer.state.episode` being set without a log, and
`total_episodes` still counting RL episodes when pretraining / SFT data share the steps.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer


torch.set_num_threads(1)

DOC = Path(__file__).parent.parent / "docs" / "migrating_from_ppo.md"
FIXTURES = Path(__file__).parent / "fixtures" / "ppo_1_12"
BLOCKS = [code for code in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if code.startswith("# run:")]


def pipeline_objects() -> dict:
    models = FIXTURES / "models"
    return {
        "tokenizer": AutoTokenizer.from_pretrained(FIXTURES / "tokenizer"),
        "policy": AutoModelForCausalLM.from_pretrained(models / "policy"),
        "ref_policy": AutoModelForCausalLM.from_pretrained(models / "ref"),
        "reward_model": AutoModelForSequenceClassification.from_pretrained(models / "reward", num_labels=1),
        "value_model": AutoModelForSequenceClassification.from_pretrained(models / "value", num_labels=1),
        "train_dataset": Dataset.from_dict(
            {"input_ids": [[2 + (7 * i + 3 * j) % 30 for j in range(1 + i % 4)] for i in range(32)]}
        ),
    }


def test_doc_has_runnable_blocks():
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_block_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = pipeline_objects()
    exec(compile(BLOCKS[index], f"{DOC.name} block {index}", "exec"), namespace)
