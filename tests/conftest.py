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

`run_script(path, argv, monkeypatch)` runs a script as `python PATH ARGV` would, in this process (command-line tests whose
subject is not the process boundary; a fresh interpreter costs ~5 CPU-seconds of imports).

`finished_round(examples, scores, group, ...)` builds a finished round (`RolloutBatch`) by hand, for the unit tests of
the round's consumers (exploration, metrics, KL schedules).

Tool calling (the agent and tool tests): `tool_tokenizer()` (the character tokenizer with the tool-calling chat
template), the fixture `tool_tok` (one per test module) and the documented tool `add(a, b)`.

`tiny_critic(tokenizer, **config)`: a one-layer Llama sequence classifier with one output (a critic or reward model).
`load_script(name)`: a repository file (`scripts/...py`) imported as a module.
`logging_as_it_was` (autouse): each test leaves the loggers' levels and handlers as it found them.
`one_thread`: module fixture that runs a module's tests on one intra-op thread
(`pytestmark = pytest.mark.usefixtures("one_thread")`).

`TINY_CONFIG` and `TINY_SUITE` are plain dicts so that the worker scripts the tests launch in subprocesses
(`tests/durability_worker.py`, `tests/distributed_worker.py`) share them: `from conftest import TINY_CONFIG`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import runpy
import sys
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForSequenceClassification, LlamaConfig  # noqa: E402

from trl_trapo import TRAPOConfig, TRAPOTrainer  # noqa: E402
from trl_trapo.agents import use_tool_chat_template  # noqa: E402
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


# the loggers a run may reconfigure: `log_level` sets `trl_trapo`'s and transformers' levels, the jobs call
# `logging.basicConfig`, and a library may add a handler to its own logger
RESTORED_LOGGERS = ("trl_trapo", "transformers", "trl", "accelerate", "datasets", "peft")


@contextlib.contextmanager
def restored_logging():
    """Leaves logging as it found it: the levels, handlers and `propagate` of `RESTORED_LOGGERS`, and the root
    logger's level and the handlers added to it meanwhile (pytest's own capture handlers are pytest's to manage)."""
    loggers = {name: logging.getLogger(name) for name in RESTORED_LOGGERS}
    saved = {name: (log.level, list(log.handlers), log.propagate) for name, log in loggers.items()}
    root = logging.getLogger()
    root_level, root_handlers = root.level, set(root.handlers)
    try:
        yield
    finally:
        for name, log in loggers.items():
            level, handlers, propagate = saved[name]
            log.setLevel(level)
            log.handlers[:] = handlers
            log.propagate = propagate
        root.setLevel(root_level)
        for handler in list(root.handlers):
            if handler not in root_handlers and not type(handler).__module__.startswith("_pytest"):
                root.removeHandler(handler)


@pytest.fixture(autouse=True)
def logging_as_it_was():
    """Every test runs inside [`restored_logging`]. Without it a test with `log_level="info"` (or a job's
    `--log_level debug`) left TRAPO's and transformers' loggers at that level for every later test of its worker,
    which then saw records it never asked for."""
    with restored_logging():
        yield


@pytest.fixture(scope="module")
def one_thread():
    """Runs a module's tests on one intra-op thread (restored after): its models are tiny, and a second thread only
    adds contention on a shared 2-core machine. Opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


# ---------------------------------------------------------------------------------------------------------------------
# A script's command line in this process (tests/test_examples.py, tests/test_reward_server.py)
# ---------------------------------------------------------------------------------------------------------------------
def run_script(path, argv: list[str], monkeypatch) -> int:
    """Run the file `path` as `__main__` with `sys.argv = [path, *argv]` (restored by `monkeypatch`), as `python PATH
    ARGV` would, and return its exit status (`sys.exit(n)` -> `n`; returning -> 0). An exception the script does not
    turn into an exit status propagates, so a traceback fails the test. The working directory, `sys.path` and the
    environment are the caller's (`monkeypatch.chdir` / `.syspath_prepend` / `.setenv`)."""
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# A finished round by hand (tests of the round's consumers; tests/statistics_worker.py)
# ---------------------------------------------------------------------------------------------------------------------
def finished_round(
    examples: list[dict],
    scores: torch.Tensor,
    group: int = 1,
    completion_ids: list[torch.Tensor] | None = None,
    old_logps: list[torch.Tensor] | None = None,
    ref_logps: list[torch.Tensor] | None = None,
    kl_estimator: str = "k1",
    per_func: torch.Tensor | None = None,
    is_truncated: torch.Tensor | None = None,
    off_policy: torch.Tensor | None = None,
    on_policy_scores: torch.Tensor | None = None,
):
    """A `RolloutBatch` of `len(examples)` completions: what is not given is neutral (one-token completions, zero
    behaviour log-probs, no reward functions, nothing truncated, no guidance, the sampled scores are `scores`); its
    per-sequence `kl` is computed from `old_logps` and `ref_logps` as the rollout engine computes it."""
    from trl_trapo.losses import kl_estimate
    from trl_trapo.rollout import RolloutBatch

    n = len(examples)
    completion_ids = completion_ids if completion_ids is not None else [torch.tensor([1])] * n
    old_logps = old_logps if old_logps is not None else [torch.zeros(c.numel()) for c in completion_ids]
    kl = None
    if ref_logps is not None:
        kl = torch.stack([kl_estimate(o, r, kl_estimator).sum() for o, r in zip(old_logps, ref_logps)])
    return RolloutBatch(
        examples=examples,
        prompt_ids=[torch.tensor([0])] * n,
        trajectories=[],
        completion_ids=completion_ids,
        old_per_token_logps=old_logps,
        ref_per_token_logps=ref_logps,
        scores=scores,
        per_func=per_func if per_func is not None else torch.zeros(n, 0),
        is_truncated=is_truncated if is_truncated is not None else torch.zeros(n, dtype=torch.bool),
        temperatures=torch.ones(n),
        group=group,
        tasks=[str(e["task"]) for e in examples] if all("task" in e for e in examples) else None,
        off_policy=off_policy,
        on_policy_scores=scores if on_policy_scores is None else on_policy_scores,
        kl=kl,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Tool calling (the agent and tool tests: tests/test_agents.py, tests/test_agent_traces.py, ...)
# ---------------------------------------------------------------------------------------------------------------------
def tool_tokenizer():
    """A new character-level tokenizer of the built-in tasks with the tool-calling chat template
    (`use_tool_chat_template`)."""
    return use_tool_chat_template(build_char_tokenizer())


@pytest.fixture(scope="module")
def tool_tok():
    """`tool_tokenizer()`, one per test module."""
    return tool_tokenizer()


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


# ---------------------------------------------------------------------------------------------------------------------
# Small models and scripts
# ---------------------------------------------------------------------------------------------------------------------
def tiny_critic(tokenizer, **config) -> AutoModelForSequenceClassification:
    """A randomly initialised (from torch's global seed) one-layer Llama sequence classifier with one output over
    `tokenizer`'s vocabulary, padding with its pad id: a critic (`value_model`) or a reward model. `config` replaces
    `LlamaConfig` fields (e.g. `pad_token_id=None`, `max_position_embeddings=64`)."""
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    return AutoModelForSequenceClassification.from_config(LlamaConfig(**{**settings, **config}))


def load_script(name: str):
    """The repository's Python file `name` (a path relative to the repository root, e.g. `scripts/gsm8k_to_trl.py`)
    imported as the module `name` with `/` as `_`, registered in `sys.modules` first: dataclasses look their module
    up while the file executes."""
    spec = importlib.util.spec_from_file_location(name.replace("/", "_"), ROOT / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
