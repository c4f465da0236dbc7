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
        --output_dir qwen-trapo --report_to none

or with a recipe: `accelerate launch examples/trapo.py --config examples/recipes/gsm8k_qwen2.5_0.5b.yaml`.

Without a model, data you name replaces the built-in data of that role (`--dataset_name`: the RL prompts *and* the
built-in held-out evaluation; `--sft_dataset_name`, `--pretrain_dataset_name`) and `--reward_funcs` replaces the
built-in `exact_match` reward. The arguments, the loaders and the job itself live in `trl_trapo.jobs.main` (its docstring
says how modes, splits and errors work); `python examples/trapo.py --help` lists every argument.
"""

import logging
import os
import sys


# before torch loads (OpenMP reads it then): threads that wait sleep instead of spinning, so that a core taken by
# another process does not stall every parallel region; set OMP_WAIT_POLICY yourself to choose (docs/threads.md)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from trl_trapo.jobs.main import exits_cleanly, run


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # parse the script arguments (data, rewards), TRAPOConfig and TRL's ModelConfig (the built-in defaults fill what you
    # do not set when no model is given; unknown or abbreviated names are errors); evaluate, train, evaluate again;
    # save the model, the trainer state and eval_results.json; print a summary. A user error (a bad value, path, file
    # or dataset) prints one message and exits with status 2; TRAPO_DEBUG=1 shows its traceback. Ctrl-C / SIGTERM
    # during training: checkpoint, one line saying how to resume, exit 130 / 143 (no traceback).
    with exits_cleanly():
        status = run()
    sys.exit(status)
