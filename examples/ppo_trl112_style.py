# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""PPO on GSM8K questions, written in the style of TRL's PPO example scripts (`examples/scripts/ppo/ppo.py` and
`ppo_tldr.py` of TRL 1.x): argument dataclasses parsed with `HfArgumentParser`, a `[PAD]` token added to the tokenizer
without resizing the embeddings, value and reward models loaded from a path with `num_labels=1`, policy and reference
policy from `--sft_model_path`, prompts pre-tokenized with `dataset.map`, then `train()`, `save_model()` and
`generate_completions()`.

Two copies of this script are kept, and they differ by exactly the edits listed in the table of
`docs/migrating_from_ppo.md` ("Migrating a TRL 1.12 PPO script"), nothing else:

- `tests/fixtures/ppo_trl112_style_before.py`: as written for TRL's `trl.experimental.ppo` (TRL 1.10-1.12);
- `examples/ppo_trl112_style.py`: the same script on TRL 1.16 + trl-trapo.

`tests/test_migration_guide.py` applies the table to the first and checks that the result is the second, then runs
the second on tiny models. With SmolLM2-135M-Instruct (`python scripts/fetch_smollm2.py`) as policy, reference, value
and reward model (the value and reward heads start random, as TRL's example does with an SFT checkpoint):

    python examples/ppo_trl112_style.py \
        --model_name_or_path models/SmolLM2-135M-Instruct \
        --sft_model_path models/SmolLM2-135M-Instruct \
        --reward_model_path models/SmolLM2-135M-Instruct \
        --max_prompts 24 --eval_samples 4 \
        --total_episodes 16 --response_length 32 --per_device_train_batch_size 4 --num_ppo_epochs 1 \
        --stop_token eos --output_dir ppo-smollm2 --report_to none

Offline, on the built-in tiny model (`python scripts/save_tiny_model.py --output_dir models/tiny`; a character-level
tokenizer and a context of 256 positions, so shorter prompts and responses; ~10 s on a CPU):

    python examples/ppo_trl112_style.py \
        --model_name_or_path models/tiny --sft_model_path models/tiny --reward_model_path models/tiny \
        --max_prompts 24 --eval_samples 4 --max_prompt_tokens 200 --total_episodes 8 --response_length 16 \
        --per_device_train_batch_size 4 --num_ppo_epochs 1 --stop_token eos --output_dir ppo-tiny --report_to none

Both run from any folder: the default `--dataset_name` is the GSM8K file shipped next to this script. Without
`--model_name_or_path` it stops at once and says what to pass; a model folder or data file that does not exist, a
data file without the `--dataset_text_field` column, `--load_in_4bit` without bitsandbytes (trl-trapo's main-job
checks: `trl_trapo.setup_checks.check_model_loading`), a model id the Hub cannot give (`trl_trapo.paths.
check_model_source`), a `--max_prompts`, `--eval_samples` or `--max_prompt_tokens` below 1 or that leaves no prompt to
train on, an unknown or abbreviated flag (`--total_episode`), a value the configuration refuses and an `--output_dir`
(which the script deletes, as TRL's does) that holds a model, the data file, the current folder or the home folder stop
it at once too, with one line naming the flag, before any model is loaded or `output_dir` deleted. A `--max_prompt_tokens` that keeps no
prompt stops it with one line too, right after the length filter, naming the length that keeps one. Each of these
lines is `ppo_trl112_style.py: error: ...` with exit status 2, as argparse's own errors (`--kl_estimator k4`) are.
"""

import os
import shutil
from dataclasses import dataclass, field
from typing import NoReturn

import torch
from accelerate import PartialState
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    HfArgumentParser,
)
from trl import ModelConfig, ScriptArguments, get_peft_config, get_quantization_config

from trl_trapo import PPOConfig, PPOTrainer
from trl_trapo.data import check_missing_values
from trl_trapo.paths import check_model_source
from trl_trapo.setup_checks import check_model_loading


@dataclass
class PPOScriptArguments(ScriptArguments):
    """TRL's `ScriptArguments` (`dataset_name`, `dataset_train_split`, ...) plus what this script needs to turn a
    local JSON Lines file of questions into prompts."""

    dataset_name: str = field(
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gsm8k", "train_first1500.jsonl"),
        metadata={
            "help": "Local JSON / JSON Lines file of prompts (one row per prompt). Default: the first 1500 GSM8K "
            "training questions shipped next to this script (examples/data/gsm8k/train_first1500.jsonl)."
        },
    )
    dataset_text_field: str = field(default="question", metadata={"help": "Column holding the prompt text."})
    max_prompts: int | None = field(
        default=None, metadata={"help": "Use only the first N rows of the file (all rows when unset)."}
    )
    eval_samples: int = field(
        default=100, metadata={"help": "Rows at the end (of the first `max_prompts`) held out for evaluation."}
    )
    max_prompt_tokens: int = field(
        default=512, metadata={"help": "Drop prompts longer than this many tokens (chat template included)."}
    )
    value_model_path: str | None = field(
        default=None, metadata={"help": "Initial critic; `--reward_model_path` when unset (as in TRL's example)."}
    )


def usage_error(parser: HfArgumentParser, message: str) -> NoReturn:
    """Stop with one line, `<script>: error: <message>`, on stderr and exit status 2, as argparse does for a malformed
    command line (`--kl_estimator k4`): a flag, path, data file or value this script refuses is the same kind of error,
    said the same way (a shell or CI step tells it from a run that failed by its status)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def local_path_problem(path: str) -> str | None:
    """Why `path` (a model folder or Hub id) cannot be loaded, when that is clear without loading it: it does not
    exist here and cannot be a Hub id (a `./`, `/` or `~` path, or more than one `/`), or its parent folder exists
    here (`models/nope` next to `models/`: a mistyped local folder, not a Hub id to try for a minute offline)."""
    if os.path.exists(os.path.expanduser(path)):
        return None if os.path.isdir(os.path.expanduser(path)) else "a file, not a model folder"
    parent = os.path.dirname(os.path.normpath(path))
    if path.startswith((".", "/", "~")) or path.count("/") > 1 or (parent and os.path.isdir(parent)):
        return f"no such folder ({os.path.abspath(os.path.expanduser(path))})"
    return None


if __name__ == "__main__":
    # abbreviations are refused (`--total_episode` is not taken for `--total_episodes`), as in the project's other jobs
    parser = HfArgumentParser((PPOScriptArguments, PPOConfig, ModelConfig), allow_abbrev=False)
    try:
        script_args, training_args, model_args = parser.parse_args_into_dataclasses()
    except ValueError as error:  # an unknown flag, or a value a configuration refuses: one line, no traceback
        unknown = "not used by the HfArgumentParser" in str(error)
        fix = ". Fix: spell each flag in full (`--help` lists them)." if unknown else ""
        usage_error(parser, f"{error}{fix}")
    if model_args.model_name_or_path is None:  # say what to pass before anything is loaded or deleted
        usage_error(
            parser,
            "no model given: pass --model_name_or_path (its tokenizer), --sft_model_path "
            "(policy and reference) and --reward_model_path (reward model and critic), local folders or Hub ids. "
            "Offline, on the built-in tiny model: `python scripts/save_tiny_model.py --output_dir models/tiny`, then "
            "models/tiny for all three (the docstring has a full command).",
        )
    # every path is checked before anything is loaded or deleted (a missing `models/x` would be tried as a Hub id)
    for flag, path in (
        ("--model_name_or_path", model_args.model_name_or_path),
        ("--sft_model_path", training_args.sft_model_path),
        ("--reward_model_path", training_args.reward_model_path),
        ("--value_model_path", script_args.value_model_path),
    ):
        problem = path is not None and local_path_problem(path)
        if problem:
            usage_error(
                parser,
                f"{flag}={path!r}: {problem}. Fix: give a model folder written by "
                "`save_pretrained` (offline: `python scripts/save_tiny_model.py --output_dir models/tiny`) or a Hub id.",
            )
        if path is not None and not os.path.exists(os.path.expanduser(path)):
            # a Hub id (`nope_dir`, `owner/name`): asked once, or found in the cache, as trl-trapo's main job does
            # (from_pretrained retried the Hub for 30 s offline, then raised an OSError traceback)
            try:
                check_model_source(path, flag)
            except ValueError as error:
                usage_error(parser, str(error))
    if not os.path.isfile(script_args.dataset_name):
        usage_error(
            parser,
            f"--dataset_name={script_args.dataset_name!r}: no such file "
            f"({os.path.abspath(script_args.dataset_name)}). Fix: give a local JSON / JSON Lines file of prompts, or "
            "leave it unset for the GSM8K questions shipped next to this script.",
        )
    # the prompt column is checked before anything is loaded or deleted (it was datasets' KeyError after the models
    # had loaded), and its cells with the check trl-trapo's main job runs on its datasets
    dataset = load_dataset("json", data_files=script_args.dataset_name, split=script_args.dataset_train_split)
    if script_args.dataset_text_field not in dataset.column_names:
        guess = "prompt" if "prompt" in dataset.column_names else dataset.column_names[0]
        usage_error(
            parser,
            f"--dataset_text_field={script_args.dataset_text_field!r}: "
            f"{script_args.dataset_name!r} has no such column; its columns are {dataset.column_names}. Fix: name the "
            f"column that holds the prompt text (e.g. `--dataset_text_field {guess}`), or rename it in the file.",
        )
    try:
        check_missing_values(dataset, "--dataset_name", [script_args.dataset_text_field])
    except ValueError as error:
        usage_error(parser, str(error))
    # the numbers that pick the prompts, checked before anything is loaded or deleted (each was datasets' IndexError
    # after the models had loaded): at least one prompt to train on and one held out for evaluation
    for flag, value, meaning in (
        ("--max_prompts", script_args.max_prompts, f"the first N rows of the file to use; unset: all {len(dataset)}"),
        ("--eval_samples", script_args.eval_samples, "the prompts held out for evaluation and generate_completions()"),
        ("--max_prompt_tokens", script_args.max_prompt_tokens, "the longest prompt kept, in tokens"),
    ):
        if value is not None and value < 1:
            usage_error(parser, f"{flag}={value}: must be >= 1 ({meaning}). Fix: pass a positive {flag}.")
    rows = len(dataset) if script_args.max_prompts is None else min(script_args.max_prompts, len(dataset))
    if script_args.eval_samples >= rows:
        usage_error(
            parser,
            f"--eval_samples={script_args.eval_samples} holds out all {rows} prompts "
            f"(--max_prompts={script_args.max_prompts}, {len(dataset)} rows in {script_args.dataset_name!r}), "
            "leaving none to train on. Fix: make --eval_samples smaller than the number of prompts, or raise "
            "--max_prompts.",
        )

    ################
    # Model & Tokenizer
    ################
    dtype = model_args.dtype if model_args.dtype in ["auto", None] else getattr(torch, model_args.dtype)
    model_kwargs = dict(
        revision=model_args.model_revision,
        attn_implementation=model_args.attn_implementation,
        dtype=dtype,
    )
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        # passing device_map=None is not the same as leaving it out, so it is set only with quantization
        model_kwargs["device_map"] = {"": PartialState().local_process_index} if torch.cuda.is_available() else None
        model_kwargs["quantization_config"] = quantization_config
    # what the first from_pretrained would fail on, checked on the policy's config as trl-trapo's main job does:
    # --load_in_4bit / --load_in_8bit without bitsandbytes, flash attention without a GPU, a classification checkpoint
    try:
        sft_config = AutoConfig.from_pretrained(training_args.sft_model_path)
        check_model_loading(training_args.sft_model_path, sft_config, model_kwargs, "--sft_model_path", "model_kwargs")
    except ValueError as error:
        usage_error(parser, str(error))
    # `output_dir` is deleted next (as TRL's example does): refuse one that holds this run's inputs or the folder the
    # script runs in (`--output_dir models/tiny` deleted the model it was asked to train)
    output = os.path.realpath(os.path.expanduser(training_args.output_dir))
    for flag, path in (
        ("--model_name_or_path", model_args.model_name_or_path),
        ("--sft_model_path", training_args.sft_model_path),
        ("--reward_model_path", training_args.reward_model_path),
        ("--value_model_path", script_args.value_model_path),
        ("--dataset_name", script_args.dataset_name),
        ("the current folder", os.getcwd()),
        ("your home folder", os.path.expanduser("~")),
    ):
        if path is None or not os.path.exists(os.path.expanduser(path)):
            continue
        held = os.path.realpath(os.path.expanduser(path))
        if os.path.commonpath([output, held]) == output:
            what = flag if flag.startswith("the ") or flag.startswith("your ") else f"{flag}={path!r}"
            usage_error(
                parser,
                f"--output_dir={training_args.output_dir!r} holds {what}, and this script "
                "deletes --output_dir before it trains. Fix: give a new folder, e.g. --output_dir ppo-out.",
            )
    # remove output_dir if exists
    shutil.rmtree(training_args.output_dir, ignore_errors=True)

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, padding_side="left", trust_remote_code=False
    )
    # a new pad token, and the embeddings are NOT resized: its id is one past the last row of every model
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    value_model = AutoModelForSequenceClassification.from_pretrained(
        script_args.value_model_path or training_args.reward_model_path,
        trust_remote_code=False,
        num_labels=1,
        **model_kwargs,
    )
    reward_model = AutoModelForSequenceClassification.from_pretrained(
        training_args.reward_model_path,
        trust_remote_code=False,
        num_labels=1,
        **model_kwargs,
    )
    policy = AutoModelForCausalLM.from_pretrained(
        training_args.sft_model_path, trust_remote_code=False, **model_kwargs
    )

    peft_config = get_peft_config(model_args)
    if peft_config is None:
        ref_policy = AutoModelForCausalLM.from_pretrained(
            training_args.sft_model_path, trust_remote_code=False, **model_kwargs
        )
    else:
        ref_policy = None

    ################
    # Dataset
    ################
    if script_args.max_prompts is not None:
        dataset = dataset.select(range(min(script_args.max_prompts, len(dataset))))
    eval_samples = script_args.eval_samples
    train_dataset = dataset.select(range(len(dataset) - eval_samples))
    eval_dataset = dataset.select(range(len(dataset) - eval_samples, len(dataset)))

    def prepare_dataset(dataset, tokenizer):
        """Pre-tokenize the prompts (a user turn of the chat template, with the generation prompt); the trainer
        only pads them."""

        def tokenize(element):
            """One row -> `input_ids` (list of token ids) and `lengths` (their number)."""
            messages = [{"role": "user", "content": element[script_args.dataset_text_field]}]
            input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
            return {"input_ids": input_ids, "lengths": len(input_ids)}

        return dataset.map(
            tokenize,
            remove_columns=dataset.column_names,
            num_proc=training_args.dataset_num_proc,
        )

    # Compute that only on the main process for faster data processing.
    with PartialState().local_main_process_first():
        train_dataset = prepare_dataset(train_dataset, tokenizer)
        eval_dataset = prepare_dataset(eval_dataset, tokenizer)
        prepared = {"train": train_dataset, "eval": eval_dataset}
        # filter out prompts that are too long
        train_dataset = train_dataset.filter(
            lambda x: x["lengths"] <= script_args.max_prompt_tokens, num_proc=training_args.dataset_num_proc
        )
        eval_dataset = eval_dataset.filter(
            lambda x: x["lengths"] <= script_args.max_prompt_tokens, num_proc=training_args.dataset_num_proc
        )

    # a filter that keeps no prompt ended in datasets' IndexError: said here, with the length that keeps one
    for split, kept in (("train", train_dataset), ("eval", eval_dataset)):
        if len(kept) == 0:
            shortest = min(prepared[split]["lengths"])
            usage_error(
                parser,
                f"--max_prompt_tokens={script_args.max_prompt_tokens} keeps 0 of the "
                f"{len(prepared[split])} {split} prompts (the shortest has {shortest} tokens, chat template included). "
                f"Fix: pass --max_prompt_tokens {shortest} or more, or shorter prompts.",
            )

    assert train_dataset[0]["input_ids"][-1] != tokenizer.eos_token_id, "The last token should not be an EOS token"

    ################
    # Training
    ################
    trainer = PPOTrainer(
        args=training_args,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=peft_config,
    )
    trainer.train()

    # Save and push to hub
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)

    trainer.generate_completions()
