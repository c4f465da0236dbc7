# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Save the built-in tiny causal LM and its character tokenizer to a directory (offline), e.g. to try the main job's
`--model_name_or_path` path without downloading a model:

    python scripts/save_tiny_model.py --output_dir models/tiny
    accelerate launch examples/trapo.py --model_name_or_path models/tiny --dataset_name data/gsm8k/rl ...
"""

import argparse
import os

from trl_trapo.tasks import build_char_tokenizer, build_tiny_model


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument(
        "--config", default=None, help="JSON model config (default: trl_trapo/configs/tiny_causal_lm.json)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max_position_embeddings", type=positive_int, default=None, help="context length >= 1 (default: config)"
    )
    args = parser.parse_args(argv)
    if not args.output_dir.strip():
        parser.error("--output_dir must not be empty.")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        # transformers' save_pretrained only logs "should be a directory, not a file" and saves nothing (exit 0)
        parser.error(f"--output_dir {args.output_dir!r} is a file; give a folder (created if missing).")
    if args.config is not None and not os.path.isfile(args.config):
        parser.error(f"--config {args.config!r}: no such file.")
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, config_path=args.config, seed=args.seed)
    if args.max_position_embeddings is not None:  # RoPE models take a longer context without new weights
        model.config.max_position_embeddings = args.max_position_embeddings
        tokenizer.model_max_length = args.max_position_embeddings
    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    print(args.output_dir)
    return args.output_dir


if __name__ == "__main__":
    main()
