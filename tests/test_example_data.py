"""`examples/data/`: the shipped GSM8K and Shakespeare files are complete, the evaluation files are held out, and the
Shakespeare split is the documented one."""

import hashlib
import json
from pathlib import Path

from datasets import load_dataset


DATA = Path(__file__).resolve().parent.parent / "examples" / "data"
# sha256 of tiny Shakespeare's `input.txt` (karpathy/char-rnn), which train.txt + "\n" + heldout.txt must rebuild
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_gsm8k_files_are_complete_and_the_test_split_shares_no_question_with_training():
    train = read_jsonl(DATA / "gsm8k" / "train_first1500.jsonl")
    test = read_jsonl(DATA / "gsm8k" / "test_first500.jsonl")
    assert (len(train), len(test)) == (1500, 500)
    for row in train + test:
        assert set(row) == {"question", "answer"}
        assert row["answer"].rsplit("####", 1)[-1].strip().replace(",", "").lstrip("-").isdigit()
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert "MIT License" in (DATA / "gsm8k" / "LICENSE").read_text(encoding="utf-8")


def test_shakespeare_split_rebuilds_the_original_at_a_paragraph_boundary():
    train = (DATA / "shakespeare" / "train.txt").read_text(encoding="utf-8")
    heldout = (DATA / "shakespeare" / "heldout.txt").read_text(encoding="utf-8")
    original = train + "\n" + heldout
    assert hashlib.sha256(original.encode("utf-8")).hexdigest() == SHAKESPEARE_SHA256
    # the documented rule: the first paragraph break at or after 90 % of the text
    cut = original.find("\n\n", int(len(original) * 0.9))
    assert (train, heldout) == (original[: cut + 1], original[cut + 2 :])
    assert heldout.startswith("GREMIO:\n") and train.endswith("?\n")


def test_shakespeare_loads_as_one_pretraining_row_per_paragraph():
    for name, paragraphs in (("train.txt", 6283), ("heldout.txt", 939)):
        dataset = load_dataset(
            "text", data_files=str(DATA / "shakespeare" / name), sample_by="paragraph", split="train"
        )
        assert dataset.column_names == ["text"]
        assert len(dataset) == paragraphs
