# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The main TRAPO job: pretraining + SFT + RL in one loop.

Run it with no arguments and no network: it builds a tiny causal LM from the config shipped in the package, a
character-level tokenizer, and the built-in verifiable task suite (pretraining corpus, SFT demonstrations, RL prompts
with an exact-match reward, held-out prompts with and without SFT demonstrations), evaluates, trains jointly,
evaluates again and writes `<output_dir>/eval_results.json`:

    accelerate launch examples/trapo.py

Point it at your own model and data (Hub ids or local files / directories) — the Hub is contacted only for ids:

    accelerate launch examples/trapo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --use_peft \
        --dataset_name data/rl.jsonl --reward_funcs numeric_answer \
        --sft_dataset_name data/sft.jsonl --pretrain_dataset_name data/pretrain.jsonl \
        --output_dir qwen-trapo --report_to trackio

or with a recipe: `accelerate launch examples/trapo.py --config examples/recipes/gsm8k_qwen2.5_0.5b.yaml`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import yaml
from datasets import load_dataset, load_from_disk
from transformers import AutoTokenizer
from trl import ModelConfig, TrlParser, get_peft_config, get_quantization_config

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.rewards import REWARD_FUNCTIONS


logger = logging.getLogger("trapo")

# Hyper-parameters of the built-in tiny job (used only when no model is given). Tested on 2 CPU cores.
BUILTIN_DEFAULTS = dict(
    output_dir="trapo-output",
    max_steps=1000,
    per_device_train_batch_size=32,
    gradient_accumulation_steps=2,
    learning_rate=2e-3,
    lr_scheduler_type="cosine_with_min_lr",
    lr_scheduler_kwargs={"min_lr_rate": 0.1},
    warmup_steps=30,
    adam_beta2=0.99,
    weight_decay=0.0,
    max_grad_norm=1.0,
    logging_steps=10,
    eval_strategy="steps",
    eval_steps=250,
    save_strategy="no",
    report_to="none",
    gradient_checkpointing=False,
    pretrain_max_length=64,
    sft_max_length=32,
    max_prompt_length=16,
    response_length=8,
    num_generations=8,
    temperature=1.0,
    kl_coef=0.01,
    sync_ref_model=True,  # the tiny model starts from random weights: anchor the KL to a lagging copy, not to noise
    ref_model_sync_steps=25,
    ref_model_mixup_alpha=0.5,
    seed=0,
    per_device_eval_batch_size=200,
    dataloader_num_workers=0,
)


@dataclass
class TRAPOScriptArguments:
    """Data and reward arguments of `examples/trapo.py` (model arguments come from TRL's `ModelConfig`)."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "RL prompts: a Hub dataset id, a local file (.json/.jsonl/.csv/.parquet) or directory."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Configuration name of `dataset_name`."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split of `dataset_name` to train on."})
    dataset_test_split: str | None = field(
        default="test", metadata={"help": "Split of `dataset_name` to evaluate on (skipped if it does not exist)."}
    )
    pretrain_dataset_name: str | None = field(
        default=None, metadata={"help": "Pretraining text (`text` column): Hub id, local file or directory."}
    )
    pretrain_dataset_config: str | None = field(default=None, metadata={"help": "Configuration name."})
    pretrain_dataset_split: str = field(default="train", metadata={"help": "Split of the pretraining dataset."})
    pretrain_streaming: bool = field(default=False, metadata={"help": "Stream the pretraining dataset."})
    sft_dataset_name: str | None = field(
        default=None, metadata={"help": "SFT data (prompt-completion or messages): Hub id, local file or directory."}
    )
    sft_dataset_config: str | None = field(default=None, metadata={"help": "Configuration name."})
    sft_dataset_split: str = field(default="train", metadata={"help": "Split of the SFT dataset."})
    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={"help": f"Reward functions by name: {', '.join(sorted(REWARD_FUNCTIONS))}."},
    )
    reward_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Sequence-classification reward model (Hub id or local directory)."}
    )
    value_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Critic (sequence classification, num_labels=1); enables GAE advantages."}
    )
    task_suite_seed: int = field(default=0, metadata={"help": "Seed of the built-in task suite."})


SCRIPT_FIELDS = {f.name for f in dataclasses.fields(TRAPOScriptArguments)}


def builtin_mode(argv: list[str]) -> bool:
    """True when no model is named on the command line or in the `--config` YAML (the tiny built-in job)."""
    if any(a == "--model_name_or_path" or a.startswith("--model_name_or_path=") for a in argv):
        return False
    for i, a in enumerate(argv):
        path = (
            argv[i + 1]
            if a == "--config" and i + 1 < len(argv)
            else a.split("=", 1)[1]
            if a.startswith("--config=")
            else None
        )
        if path:
            with open(path, encoding="utf-8") as handle:
                if (yaml.safe_load(handle) or {}).get("model_name_or_path"):
                    return False
    return True


def load_any(name: str, config: str | None, split: str, streaming: bool = False):
    """A split of a Hub dataset or of a local file / directory (`save_to_disk` directories included)."""
    if os.path.isfile(name):
        extension = name.rsplit(".", 1)[-1].lower()
        builder = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "txt": "text"}.get(extension)
        if builder is None:
            raise ValueError(f"Cannot read {name!r}: use a .json/.jsonl/.csv/.parquet/.txt file or a directory.")
        return load_dataset(
            builder, data_files=name, split=split if split == "train" else "train", streaming=streaming
        )
    if os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_info.json")):
        loaded = load_from_disk(name)
        return loaded[split] if hasattr(loaded, "keys") else loaded
    return load_dataset(name, config, split=split, streaming=streaming)


def write_json_atomic(path: str, payload: dict) -> None:
    """Write JSON to `path` through a temporary file and a rename, so readers never see half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
        temporary = handle.name
    os.replace(temporary, path)


def main(script_args: TRAPOScriptArguments, training_args: TRAPOConfig, model_args: ModelConfig) -> dict:
    """Build everything, evaluate, train, evaluate again, save; return the eval results."""
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, make_task_suite

    builtin = model_args.model_name_or_path is None
    if builtin:
        # step 1 (built-in). tiny model, tokenizer and task suite, all generated in-process
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=training_args.seed)
        suite = make_task_suite(seed=script_args.task_suite_seed)
        train_dataset = suite.rl_train if script_args.dataset_name is None else None
        sft_dataset = suite.sft if script_args.sft_dataset_name is None else None
        pretrain_dataset = suite.pretrain if script_args.pretrain_dataset_name is None else None
        eval_dataset = suite.eval
        reward_funcs = list(suite.reward_funcs)
    else:
        # step 1. a real model and tokenizer
        model = model_args.model_name_or_path
        tokenizer = AutoTokenizer.from_pretrained(model, revision=model_args.model_revision)
        init_kwargs = dict(
            revision=model_args.model_revision,
            attn_implementation=model_args.attn_implementation,
            quantization_config=get_quantization_config(model_args),
        )
        if model_args.dtype not in (None, "auto"):
            init_kwargs["dtype"] = model_args.dtype
        training_args.model_init_kwargs = {k: v for k, v in init_kwargs.items() if v is not None}
        train_dataset = sft_dataset = pretrain_dataset = eval_dataset = None
        reward_funcs = []
    # step 2. user data (Hub ids or local paths) replaces the built-in parts it names
    if script_args.dataset_name:
        train_dataset = load_any(script_args.dataset_name, script_args.dataset_config, script_args.dataset_train_split)
        if script_args.dataset_test_split:
            try:
                eval_dataset = load_any(
                    script_args.dataset_name, script_args.dataset_config, script_args.dataset_test_split
                )
            except (ValueError, KeyError):
                logger.info(
                    "No %r split in %s: no held-out RL evaluation.",
                    script_args.dataset_test_split,
                    script_args.dataset_name,
                )
    if script_args.sft_dataset_name:
        sft_dataset = load_any(
            script_args.sft_dataset_name, script_args.sft_dataset_config, script_args.sft_dataset_split
        )
    if script_args.pretrain_dataset_name:
        pretrain_dataset = load_any(
            script_args.pretrain_dataset_name,
            script_args.pretrain_dataset_config,
            script_args.pretrain_dataset_split,
            streaming=script_args.pretrain_streaming,
        )
    for name in script_args.reward_funcs:
        if name not in REWARD_FUNCTIONS:
            raise ValueError(f"--reward_funcs {name!r} is unknown; choose from {sorted(REWARD_FUNCTIONS)}.")
        reward_funcs.append(REWARD_FUNCTIONS[name])
    value_model = None
    if script_args.value_model_name_or_path:
        from transformers import AutoModelForSequenceClassification

        value_model = AutoModelForSequenceClassification.from_pretrained(
            script_args.value_model_name_or_path, num_labels=1
        )
    if training_args.eval_strategy != "no" and eval_dataset is None:
        training_args.eval_strategy = "no"

    # step 3. the trainer
    trainer = TRAPOTrainer(
        model=model,
        reward_funcs=reward_funcs or None,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        pretrain_dataset=pretrain_dataset,
        sft_dataset=sft_dataset,
        processing_class=tokenizer,
        reward_model=script_args.reward_model_name_or_path,
        value_model=value_model,
        peft_config=get_peft_config(model_args),
    )

    # step 4. evaluate, train, evaluate
    results: dict[str, float] = {}
    if eval_dataset is not None:
        initial = trainer.evaluate(metric_key_prefix="eval")
        results.update({f"{k}_initial": v for k, v in initial.items()})
    if builtin:  # exact-match accuracy, computed directly (the RL reward adds partial credit for exploration)
        results.update({f"eval_{k}_initial": v for k, v in builtin_accuracy(trainer, tokenizer, eval_dataset).items()})
    start = time.perf_counter()
    train_output = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    results["train_runtime_s"] = time.perf_counter() - start
    results["train_loss"] = train_output.training_loss
    if eval_dataset is not None:
        results.update(trainer.evaluate(metric_key_prefix="eval"))
    if builtin:
        results.update({f"eval_{k}": v for k, v in builtin_accuracy(trainer, tokenizer, eval_dataset).items()})

    # step 5. save model (or adapter), trainer state and results
    trainer.save_model(training_args.output_dir)
    trainer.save_state()
    if trainer.accelerator.is_main_process:
        write_json_atomic(os.path.join(training_args.output_dir, "eval_results.json"), results)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    return results


def builtin_accuracy(trainer: TRAPOTrainer, tokenizer, dataset) -> dict[str, float]:
    """Greedy exact-match accuracy of the trained policy on the built-in held-out prompts, overall and per split."""
    from trl.models import unwrap_model_for_generation

    from trl_trapo.tasks import greedy_accuracy

    # gathers DeepSpeed ZeRO-3 partitions (collectively: every rank evaluates); a no-op unwrap otherwise
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        return greedy_accuracy(model, tokenizer, dataset, max_new_tokens=trainer.args.response_length)


def make_parser() -> TrlParser:
    """The command-line parser (script, TRAPO and model arguments; `--config recipe.yaml` supported)."""
    return TrlParser((TRAPOScriptArguments, TRAPOConfig, ModelConfig))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = make_parser()
    if builtin_mode(sys.argv[1:]):
        parser.set_defaults(**BUILTIN_DEFAULTS)
    script_args, training_args, model_args = parser.parse_args_and_config()
    results = main(script_args, training_args, model_args)
    logger.info("results: %s", json.dumps(results, sort_keys=True))
