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


FILE_SUFFIXES = (".json", ".jsonl", ".txt", ".csv", ".parquet")  # a source with one is a file, never a Hub id


def read_json_rows(path: str, label: str) -> list[tuple[str, object]]:
    """The rows of a local JSON array or JSON-lines file, each with where it is: `line N` (1-based, the file's line)
    in a JSON-lines file, `row N` (0-based, the index) in a JSON array. A UTF-8 byte-order mark, Windows line ends
    (CRLF) and blank lines are accepted, as `datasets` (which the main job reads the output with) accepts them.

    Raises:
        ValueError: naming `label`, the file and the fix, if it is missing, a folder, not UTF-8 or not JSON (with the
            line).
    """
    if os.path.isdir(path):
        raise ValueError(f"{label} {path!r} is a folder; give the GSM8K-style JSONL file inside it.")
    if not os.path.isfile(path):
        raise ValueError(
            f"{label} {path!r}: no such file (for a Hub dataset give its id, e.g. openai/gsm8k --config main)."
        )
    try:
        with open(path, encoding="utf-8") as handle:  # not utf-8-sig, whose error offsets skip the mark's 3 bytes
            text = handle.read().removeprefix("\ufeff")  # a byte-order mark (Windows editors write one)
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{label} {path!r} is not UTF-8 text ({error.reason} at byte {error.start}); re-encode it, e.g. "
            f"`iconv -f latin1 -t utf-8 {path} > fixed.jsonl`."
        ) from error
    if text.lstrip().startswith("["):
        try:
            return [(f"row {i}", row) for i, row in enumerate(json.loads(text))]
        except json.JSONDecodeError as error:
            raise ValueError(f"{label} {path!r} is not valid JSON (line {error.lineno}: {error.msg}).") from error
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{label} {path!r} line {number} is not a JSON object ({error.msg}); a JSONL file holds one "
                    '`{"question": ..., "answer": ...}` per line.'
                ) from error
    return rows


def read_rows(source: str, config: str | None, split: str, label: str = "source") -> list[dict]:
    """Rows with `question` and `answer` from a local JSONL / JSON file or a Hub dataset id (a source that is not a
    local path: no such file, no file suffix).

    Raises:
        ValueError: naming `label` and the source, if the file cannot be read (`read_json_rows`), the Hub dataset
            cannot be loaded, a row is not an object or lacks a text `question` or `answer`, or an answer has no
            `####` line; a row of a JSON-lines file is named by its line (`line 4 of data.jsonl`, 1-based), a row of
            a JSON array or a Hub dataset by its index (`row 3 of openai/gsm8k`, 0-based, as `dataset[3]`).
    """
    if os.path.exists(source) or source.lower().endswith(FILE_SUFFIXES) or source.startswith((".", "/", "~")):
        located = read_json_rows(source, label)
    else:
        from datasets import load_dataset

        try:
            located = [(f"row {i}", row) for i, row in enumerate(load_dataset(source, config, split=split))]
        except Exception as error:  # offline, no such dataset / config / split: datasets' many exception types
            raise ValueError(
                f"{label} {source!r}: no such file, and the Hub dataset {source!r} (config {config!r}, split "
                f"{split!r}) cannot be loaded ({type(error).__name__}: {str(error).splitlines()[0][:200]}). Give "
                "the path of a local JSONL file, or a Hub id such as openai/gsm8k --config main (needs the network)."
            ) from error
    for where, row in located:
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            has = sorted(row) if isinstance(row, dict) else f"a {type(row).__name__}"
            raise ValueError(
                f"{where} of {source} lacks 'question'/'answer' (it has {has}); each row must be "
                '`{"question": ..., "answer": "... #### N"}`.'
            )
        for key in ("question", "answer"):
            if not isinstance(row[key], str):
                raise ValueError(
                    f"{where} of {source}: {key!r} is a {type(row[key]).__name__} ({str(row[key])[:60]!r}); it "
                    "must be text."
                )
        if "####" not in row["answer"]:
            raise ValueError(
                f"{where} of {source}: the answer has no '#### N' line: {row['answer'][-80:]!r}; GSM8K answers end "
                "with `#### <number>` (fix or drop the row)."
            )
    return [row for _, row in located]


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
    """The paragraphs (blocks separated by blank lines) of a UTF-8 text file (a byte-order mark dropped) as
    `{"text": ...}` documents, in order.

    One document per paragraph keeps each speech or section whole; a plain-text file loaded with `datasets`' `text`
    builder would instead give one document per line (and an EOS after every line once packed).

    Raises:
        ValueError: if the file holds no non-blank paragraph.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--pretrain_text {path!r}: no such file; give a UTF-8 text file.")
    try:
        with open(path, encoding="utf-8") as handle:  # a leading byte-order mark is no text
            paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", handle.read().removeprefix("\ufeff"))]
    except UnicodeDecodeError as error:
        raise ValueError(
            f"--pretrain_text {path!r} is not UTF-8 text ({error.reason} at byte {error.start}); re-encode it, e.g. "
            f"`iconv -f latin1 -t utf-8 {path} > fixed.txt`."
        ) from error
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


def convert_all(args: argparse.Namespace) -> dict[str, list[dict]]:
    """The rows of every output file, from the parsed arguments.

    Raises:
        ValueError: naming the argument, for input that cannot be converted (see `read_rows`, `text_paragraphs`).
    """
    rows = read_rows(args.source, args.config, args.split)
    if args.test_rows is not None and (args.test_file is None or args.test_rows < 1):
        raise ValueError(
            f"--test_rows {args.test_rows}: give a number >= 1, with --test_file (it counts that file's rows)."
        )
    test_size = 0 if args.test_file else args.test_size
    if not 0 <= test_size < len(rows):
        raise ValueError(f"--test_size must be in [0, {len(rows)}) for {len(rows)} rows, got {args.test_size}.")
    converted = convert(rows, test_size, args.seed, args.conversational)
    if args.test_file:
        held_out = read_rows(args.test_file, args.config, "test", label="--test_file")[: args.test_rows]
        converted["rl/test"] = convert(held_out, len(held_out), args.seed, args.conversational)["rl/test"]
    if args.pretrain_text:
        converted["pretrain/train"] = text_paragraphs(args.pretrain_text)
    return converted


def check_output_dir(output_dir: str, names: list[str]) -> None:
    """Refuse an `output_dir` where the files `<name>.jsonl` cannot go: a folder on their way is a file.

    Raises:
        ValueError: naming `--output_dir`, the file in the way and the fix.
    """
    for name in names:
        path = os.path.abspath(os.path.join(output_dir, os.path.dirname(name)))
        while not os.path.isdir(path):
            if os.path.exists(path):
                raise ValueError(
                    f"--output_dir {output_dir!r}: {path!r} is a file, where a folder is needed; give another "
                    "--output_dir (a folder, created if missing)."
                )
            path = os.path.dirname(path)


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
    try:
        converted = convert_all(args)
        check_output_dir(args.output_dir, [name for name, part in converted.items() if part])
        for name, part in converted.items():
            if part:
                write_jsonl(os.path.join(args.output_dir, f"{name}.jsonl"), part)
    except ValueError as error:  # the user's input: argparse's `prog: error: ...` and exit 2, no traceback
        parser.error(str(error))
    except OSError as error:  # e.g. a read-only or full disk
        parser.error(f"--output_dir {args.output_dir!r}: cannot write ({error.strerror or error}: {error.filename}).")
    counts = {name: len(part) for name, part in converted.items()}
    print(json.dumps(counts))
    return counts


if __name__ == "__main__":
    main()
