# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Convert GSM8K-style data (`question`, `answer` ending in `#### N`) into TRL's dataset formats for the main job.

Writes, under `--output_dir`:

| directory | format | rows | used as |
|---|---|---|---|
| `rl/train.jsonl`, `rl/test.jsonl` | prompt-only + `answer` | question -> prompt, full reference answer kept | `--dataset_name` |
| `sft/train.jsonl` | prompt-completion | question -> worked solution ending in `#### N` | `--sft_dataset_name` |
| `pretrain/train.jsonl` | language modelling (`text`) | question and solution as one document (or, with `--pretrain_text`, one paragraph of that file) | `--pretrain_dataset_name` |

The test split is held out of all three training sets. Calculator annotations (`<<48/2=24>>`) are removed from the
solutions. Reward: `--reward_funcs numeric_answer` (math-verify with a plain-number extraction config; TRL's
`accuracy_reward` expects LaTeX and scores `#### 72` as 0).

    python scripts/gsm8k_to_trl.py examples/data/gsm8k/train_first1500.jsonl --output_dir data/gsm8k
    python scripts/gsm8k_to_trl.py examples/data/gsm8k/train_first1500.jsonl --conversational \
        --test_file examples/data/gsm8k/test_first500.jsonl --test_rows 200 --output_dir data/gsm8k-chat
    python scripts/gsm8k_to_trl.py openai/gsm8k --config main --output_dir data/gsm8k   # from the Hub (network)

Add `--conversational` to write prompts and completions as chat messages (TRL's conversational format), and
`--pretrain_text examples/data/shakespeare/train.txt` to make the pretraining documents the paragraphs of a text file
(general text) instead of the GSM8K questions and solutions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile


CALCULATOR = re.compile(r"<<[^<>]*>>")
PROMPT_TEMPLATE = "Question: {question}\nAnswer:"
SYSTEM_HINT = "Solve the problem. End with '#### <number>'."


def clean_solution(answer: str) -> str:
    """GSM8K's solution without calculator annotations, ending in `#### N`."""
    return CALCULATOR.sub("", answer).strip()


def read_rows(source: str, config: str | None, split: str) -> list[dict]:
    """Rows with `question` and `answer` from a local JSONL / JSON file or a Hub dataset id.

    Raises:
        ValueError: if a row lacks `question` or `answer`, or an answer has no `####` line.
    """
    if os.path.isfile(source):
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    else:
        from datasets import load_dataset

        rows = list(load_dataset(source, config, split=split))
    for i, row in enumerate(rows):
        if "question" not in row or "answer" not in row:
            raise ValueError(f"Row {i} of {source} lacks 'question'/'answer' (it has {sorted(row)}).")
        if "####" not in row["answer"]:
            raise ValueError(f"Row {i} of {source}: the answer has no '#### N' line: {row['answer'][-80:]!r}")
    return rows


def convert(rows: list[dict], test_size: int, seed: int, conversational: bool) -> dict[str, list[dict]]:
    """The RL (train/test), SFT and pretraining rows, with the test questions held out of every training set."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    test_ids = set(order[:test_size])
    out: dict[str, list[dict]] = {"rl/train": [], "rl/test": [], "sft/train": [], "pretrain/train": []}
    for i, row in enumerate(rows):
        question, solution = row["question"].strip(), clean_solution(row["answer"])
        if conversational:
            prompt = [{"role": "system", "content": SYSTEM_HINT}, {"role": "user", "content": question}]
            completion = [{"role": "assistant", "content": solution}]
        else:
            prompt, completion = PROMPT_TEMPLATE.format(question=question), " " + solution
        rl_row = {"prompt": prompt, "answer": row["answer"]}
        if i in test_ids:
            out["rl/test"].append(rl_row)
            continue
        out["rl/train"].append(rl_row)
        out["sft/train"].append({"prompt": prompt, "completion": completion})
        out["pretrain/train"].append({"text": f"{question}\n{solution}"})
    return out


def text_paragraphs(path: str) -> list[dict]:
    """The paragraphs (blocks separated by blank lines) of a UTF-8 text file as `{"text": ...}` documents, in order.

    One document per paragraph keeps each speech or section whole; a plain-text file loaded with `datasets`' `text`
    builder would instead give one document per line (and an EOS after every line once packed).

    Raises:
        ValueError: if the file holds no non-blank paragraph.
    """
    with open(path, encoding="utf-8") as handle:
        paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", handle.read())]
    documents = [{"text": p} for p in paragraphs if p.strip()]
    if not documents:
        raise ValueError(f"--pretrain_text {path!r}: no paragraph (the file is empty or blank).")
    return documents


def write_jsonl(path: str, rows: list[dict]) -> None:
    """Write rows as JSON lines, atomically (temporary file + rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        temporary = handle.name
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="GSM8K-style JSONL/JSON file, or a Hub dataset id (e.g. openai/gsm8k)")
    parser.add_argument("--config", default="main", help="Hub dataset configuration (ignored for files)")
    parser.add_argument("--split", default="train", help="Hub split to read (ignored for files)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--test_size", type=int, default=100, help="questions held out for evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--conversational", action="store_true", help="write chat messages instead of plain text")
    parser.add_argument(
        "--test_file",
        default=None,
        help="a separate GSM8K-style file whose first --test_rows rows become rl/test (e.g. the official test split, "
        "examples/data/gsm8k/test_first500.jsonl); every source row then trains (--test_size is ignored)",
    )
    parser.add_argument("--test_rows", type=int, default=None, help="rows of --test_file to keep (default: all)")
    parser.add_argument(
        "--pretrain_text",
        default=None,
        help="a UTF-8 text file whose paragraphs (separated by blank lines) become pretrain/train.jsonl instead of "
        "the GSM8K documents (e.g. examples/data/shakespeare/train.txt, general English)",
    )
    args = parser.parse_args(argv)
    rows = read_rows(args.source, args.config, args.split)
    test_size = 0 if args.test_file else args.test_size
    if not 0 <= test_size < len(rows):
        parser.error(f"--test_size must be in [0, {len(rows)}) for {len(rows)} rows, got {args.test_size}.")
    converted = convert(rows, test_size, args.seed, args.conversational)
    if args.test_file:
        held_out = read_rows(args.test_file, args.config, "test")[: args.test_rows]
        converted["rl/test"] = convert(held_out, len(held_out), args.seed, args.conversational)["rl/test"]
    if args.pretrain_text:
        converted["pretrain/train"] = text_paragraphs(args.pretrain_text)
    for name, part in converted.items():
        if part:
            write_jsonl(os.path.join(args.output_dir, f"{name}.jsonl"), part)
    counts = {name: len(part) for name, part in converted.items()}
    print(json.dumps(counts))
    return counts


if __name__ == "__main__":
    main()
