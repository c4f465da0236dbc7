# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Every bad input, through the command line (`python examples/trapo.py ...`) and the API: one message naming the
field, the value and the fix; a non-zero exit (CLI); nothing the user had changed. One section per area.

Shared helpers: `run_cli(args, cwd)` runs the main job as a user would (offline, a short run) and returns
`(returncode, stdout + stderr)`; `snapshot(folder)` records every file's bytes, to check that nothing changed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward


ROOT = Path(__file__).resolve().parent.parent


def run_cli(args: list[str], cwd: Path | None = None, timeout: float = 300) -> tuple[int, str]:
    """`python examples/trapo.py <args>` with this checkout first on the path, offline, `--max_steps 2` unless
    `args` set it; returns `(returncode, stdout + stderr)`."""
    if not any(a == "--max_steps" or a.startswith("--max_steps=") for a in args):
        args = ["--max_steps", "2", *args]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "trapo.py"), *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return completed.returncode, completed.stdout + completed.stderr


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- output dir, disk, saves ----
def finished_run(folder: Path) -> dict[str, bytes]:
    """A folder as a finished run leaves it (a model's config and weights, eval_results.json); its snapshot."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights of the first run")
    (folder / "eval_results.json").write_text('{"eval_accuracy": 0.97}')
    return snapshot(folder)


def test_cli_refuses_to_train_over_a_finished_run(tmp_path):
    """The second run into the same output_dir stops before loading anything, names output_dir, what it found and
    the three fixes, and leaves the first run's files as they were."""
    out = tmp_path / "trapo-output"
    before = finished_run(out)
    code, output = run_cli(["--output_dir", str(out)])
    assert code != 0
    assert f"output_dir={str(out)!r}" in output and "eval_results.json" in output and "model.safetensors" in output
    assert "--overwrite_output_dir" in output and "another output_dir" in output
    assert snapshot(out) == before
    from trl_trapo.cli import parse_args
    from trl_trapo.saving import check_output_dir

    _, args, _ = parse_args(["--output_dir", str(out), "--overwrite_output_dir"])  # the fix parses and is accepted
    assert args.overwrite_output_dir is True
    check_output_dir(args)


def test_api_refuses_a_finished_run_unless_resumed_or_overwritten(tmp_path, tokenizer, suite, tiny_trainer):
    """At construction, before the model is even looked at (a missing model path is not reached); resuming from it
    or `overwrite_output_dir=True` is accepted; a folder of checkpoints only (an interrupted run) is not finished."""
    before = finished_run(tmp_path)
    with pytest.raises(ValueError, match=r"output_dir=.*holds a finished run \(config\.json.*overwrite_output_dir"):
        TRAPOTrainer("no/such/model-folder", args=TRAPOConfig(output_dir=str(tmp_path), report_to="none"))
    assert snapshot(tmp_path) == before
    (tmp_path / "checkpoint-2").mkdir()
    with pytest.raises(ValueError, match=r"resume it \(--resume_from_checkpoint .*checkpoint-2"):
        tiny_trainer(tmp_path, tokenizer, suite)
    tiny_trainer(tmp_path, tokenizer, suite, overwrite_output_dir=True)
    tiny_trainer(tmp_path, tokenizer, suite, resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    interrupted = tmp_path / "interrupted"
    (interrupted / "checkpoint-2").mkdir(parents=True)
    tiny_trainer(interrupted, tokenizer, suite)


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_output_dir_that_cannot_be_written_is_refused_first(tmp_path, where):
    """A file, or a path under a file, fails at once with a ValueError naming output_dir (CLI: before any model
    loads; API: before the model argument is looked at), and the file is left alone."""
    blocker = tmp_path / "results.txt"
    blocker.write_text("the user's notes")
    out = blocker if where == "file" else blocker / "run"
    problem = "is a file, not a folder" if where == "file" else f"cannot be created: it is under {blocker}, which is"
    with pytest.raises(ValueError, match=rf"TRAPOConfig\.output_dir={str(out)!r} {problem}"):
        TRAPOTrainer("no/such/model-folder", args=TRAPOConfig(output_dir=str(out), report_to="none"))
    code, output = run_cli(["--output_dir", str(out)])
    assert code != 0 and output.splitlines()[-1].startswith(
        f"ValueError: TRAPOConfig.output_dir={str(out)!r} {problem}"
    )
    assert blocker.read_text() == "the user's notes"


def test_max_steps_zero_is_refused(tmp_path):
    """`max_steps=0` trained one step; it is refused with the fix (-1 = epochs, evaluate() to only evaluate)."""
    with pytest.raises(ValueError, match=r"TRAPOConfig\.max_steps=0 is invalid: .*-1.*num_train_epochs.*evaluate"):
        TRAPOConfig(output_dir=str(tmp_path), max_steps=0, report_to="none")
    code, output = run_cli(["--max_steps", "0", "--output_dir", str(tmp_path / "out")])
    assert code != 0 and "max_steps=0 is invalid" in output
    assert not (tmp_path / "out").exists()


def test_push_to_hub_offline_is_refused_at_construction(tmp_path):
    """With HF_HUB_OFFLINE=1 (set by the test suite and the helper), `push_to_hub` cannot succeed: refused in the
    config, naming push_to_hub, the variable and the fixes."""
    with pytest.raises(ValueError, match=r"push_to_hub=True is invalid: HF_HUB_OFFLINE=1 .*Hugging Face Hub"):
        TRAPOConfig(output_dir=str(tmp_path), push_to_hub=True, report_to="none")
    code, output = run_cli(["--push_to_hub", "--output_dir", str(tmp_path / "out")])
    assert code != 0 and "push_to_hub=True is invalid: HF_HUB_OFFLINE=1" in output


def test_a_disk_too_small_for_one_checkpoint_is_refused(tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, caplog):
    """With checkpoints on, fewer free bytes than one checkpoint's weights + AdamW state is an error naming
    output_dir, needed and free bytes and the fix; with checkpoints off it is only a warning."""
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000))
    with pytest.raises(ValueError, match=r"output_dir=.* has 1,000 bytes free.*needs at least [\d,]+ bytes.*Free"):
        tiny_trainer(tmp_path / "a", tokenizer, suite, save_strategy="steps", save_steps=1)
    with caplog.at_level("WARNING", logger="trl_trapo.saving"):
        tiny_trainer(tmp_path / "b", tokenizer, suite, save_strategy="no")
    assert "a final save_model may not fit" in caplog.text


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---- data and rewards ----
@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


RL = [{"prompt": "ab=", "answer": "ab"}, {"prompt": "cd=", "answer": "cd"}, {"prompt": "ef=", "answer": "ef"}]
SFT = [{"prompt": "ab=", "completion": "ab"}, {"prompt": "cd=", "completion": "cd"}]
TEXT = [{"text": "abc def"}, {"text": "ghi jkl"}]


def build(tmp_path, tok, reward=exact_match_reward, **datasets):
    """A tiny trainer on the given datasets (lists of rows or datasets); RL prompts come with `reward`."""

    def to_dataset(value):
        if isinstance(value, dict):
            return {k: to_dataset(v) for k, v in value.items()}
        return Dataset.from_list(value) if isinstance(value, list) else value

    datasets = {k: to_dataset(v) for k, v in datasets.items()}
    config = TRAPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=4,
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        pretrain_max_length=16,
        sft_max_length=16,
        max_prompt_length=16,
        response_length=4,
        num_generations=2,
    )
    return TRAPOTrainer(
        build_tiny_model(tok, seed=0),
        reward_funcs=reward if "train_dataset" in datasets else None,
        args=config,
        processing_class=tok,
        **datasets,
    )


def conv(text):
    return [{"role": "user", "content": text}]


MISSING = [
    # (datasets, the message's dataset / column / row / what)
    (
        dict(train_dataset=[RL[0], {"prompt": None, "answer": "x"}]),
        r"`train_dataset` column 'prompt'.*\(None\) at row 1",
    ),
    (
        dict(train_dataset=[{"prompt": conv("ab="), "answer": "ab"}, {"prompt": conv(None), "answer": "x"}]),
        r"`train_dataset` column 'prompt'.*\(None content in message 0\) at row 1",
    ),
    (
        dict(train_dataset=[{**RL[0], "task": "copy"}, {**RL[1], "task": None}]),
        r"`train_dataset` column 'task'.*at row 1",
    ),
    (dict(train_dataset=[{"input_ids": [5, 6]}, {"input_ids": [5, None]}]), r"column 'input_ids'.*at row 1"),
    (dict(sft_dataset=[SFT[0], {"prompt": "x", "completion": None}]), r"`sft_dataset` column 'completion'.*row 1"),
    (dict(sft_dataset=[{"prompt": None, "completion": "x"}, SFT[0]]), r"`sft_dataset` column 'prompt'.*row 0"),
    (
        dict(sft_dataset=[{"messages": conv("a") + [{"role": "assistant", "content": None}]}]),
        r"`sft_dataset` column 'messages'.*\(None content in message 1\) at row 0",
    ),
    (dict(pretrain_dataset=[TEXT[0], {"text": None}]), r"`pretrain_dataset` column 'text'.*\(None\) at row 1"),
    (
        dict(pretrain_dataset=TEXT, eval_dataset={"held": [{"text": "abc"}, {"text": None}]}),
        r"`eval_dataset\['held'\]` column 'text'.*row 1",
    ),
    (dict(pretrain_dataset=TEXT, eval_dataset=[{"prompt": None}]), r"`eval_dataset` column 'prompt'.*row 0"),
    (
        dict(pretrain_dataset=TEXT, eval_dataset=[{"prompt": "a", "completion": math.nan}]),
        r"`eval_dataset` column 'completion'.*\(NaN\) at row 0",
    ),
    (
        dict(pretrain_dataset=TEXT, eval_dataset=[{"text": math.nan}]),  # a float column where text is expected
        r"`eval_dataset` column 'text'.*\(NaN\) at row 0",
    ),
]


@pytest.mark.parametrize(("datasets", "message"), MISSING)
def test_a_missing_value_in_a_column_trapo_reads_is_refused_by_dataset_column_and_row(
    tmp_path, tok, datasets, message
):
    before = {k: list(v) if isinstance(v, list) else v for k, v in datasets.items()}
    with pytest.raises(ValueError, match=message) as error:
        build(tmp_path, tok, **datasets)
    assert "fill it, or drop such rows" in str(error.value)  # the fix
    assert datasets == before  # nothing the user had is changed
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_missing_values_in_reward_columns_reach_the_reward_function(tmp_path, tok):
    """Reward columns are the user's: a None there is passed as it is (a reward function may return None for "cannot
    score", as `numeric_answer_reward` does for a reference without a number)."""
    seen = []

    def reward(completions, answer, **kwargs):
        seen.extend(answer)
        return [None if a is None else 0.0 for a in answer]

    build(tmp_path, tok, reward=reward, train_dataset=[RL[0], {"prompt": "cd=", "answer": None}])
    assert None in seen


def test_a_missing_demonstration_is_no_demonstration_never_the_text_nan(tmp_path, tok):
    from trl_trapo.data import tokenize_demonstrations, tokenize_prompt_dataset

    rows = tokenize_prompt_dataset(
        Dataset.from_list([{"prompt": "ab=", "demo": "ab"}, {"prompt": "cd=", "demo": None}]), tok, 16
    )
    out = tokenize_demonstrations(rows, "demo", tok, [tok.eos_token_id], 8)
    assert out["demonstration_ids"][1] == []
    nan_rows = tokenize_prompt_dataset(Dataset.from_list([{"prompt": "ab=", "demo": math.nan}]), tok, 16)
    with pytest.raises(ValueError, match="No row of `train_dataset` keeps a demonstration"):  # NaN is not "nan"
        tokenize_demonstrations(nan_rows, "demo", tok, [tok.eos_token_id], 8)


UNKNOWN = [
    (dict(train_dataset=[RL[0], {"prompt": "🙂🙂", "answer": "x"}]), r"`train_dataset` column 'prompt' row 1"),
    (
        dict(train_dataset=[{"prompt": conv("ab="), "answer": "ab"}, {"prompt": conv("🙂 🙂"), "answer": "x"}]),
        r"`train_dataset` column 'prompt' row 1",
    ),
    (dict(sft_dataset=[SFT[0], {"prompt": "ab=", "completion": "😀"}]), r"`sft_dataset` column 'completion' row 1"),
    (dict(pretrain_dataset=[TEXT[0], {"text": "😀 😀\n"}]), r"`pretrain_dataset` column 'text' row 1"),
    (dict(pretrain_dataset=TEXT, eval_dataset=[{"prompt": "🙂"}]), r"`eval_dataset` column 'prompt' row 0"),
]


@pytest.mark.parametrize(("datasets", "message"), UNKNOWN)
def test_a_row_of_nothing_but_unknown_tokens_is_refused(tmp_path, tok, datasets, message):
    with pytest.raises(ValueError, match=message + r".*nothing but characters the tokenizer cannot represent"):
        build(tmp_path, tok, **datasets)


def test_unknown_tokens_are_counted_and_warned_with_examples(tmp_path, tok, caplog):
    rows = [RL[0], {"prompt": "ab🙂=", "answer": "ab"}, {"prompt": "c🙂🙂=", "answer": "c"}]
    with caplog.at_level("WARNING", logger="trl_trapo.data"):
        build(tmp_path, tok, train_dataset=rows)
    text = caplog.text
    assert "`train_dataset` column 'prompt': 2 rows hold 3 characters the tokenizer cannot represent" in text
    assert "row 1: '🙂' in 'ab🙂='" in text and "row 2: '🙂' in 'c🙂🙂='" in text  # the characters, where


NOT_NUMBERS = [("1", "str"), ([1.0], "list"), (b"1", "bytes"), ({"score": 1}, "dict"), (1 + 2j, "complex")]


@pytest.mark.parametrize(("value", "kind"), NOT_NUMBERS)
def test_a_reward_that_is_not_a_number_is_refused_at_construction(tmp_path, tok, value, kind):
    def stringly_reward(completions, **kwargs):
        return [value for _ in completions]

    with pytest.raises(
        ValueError, match=rf"Reward function 'stringly_reward' returned .* \({kind}\) for completion 0"
    ):
        build(tmp_path, tok, reward=stringly_reward, train_dataset=RL)


def test_cli_refuses_missing_values_in_local_data_files(tmp_path):
    rl = write_jsonl(tmp_path / "rl.jsonl", [{"prompt": "ab=", "answer": "ab"}, {"prompt": None, "answer": "x"}])
    code, out = run_cli(["--max_steps", "1", "--dataset_name", str(rl), "--output_dir", str(tmp_path / "out")])
    assert code != 0
    assert "`train_dataset` column 'prompt' has a missing value (None) at row 1" in out
    assert "dataset.filter(lambda row: row['prompt'] is not None)" in out  # the fix
    sft = write_jsonl(
        tmp_path / "sft.jsonl", [{"prompt": "ab=", "completion": "ab"}, {"prompt": "c", "completion": None}]
    )
    code, out = run_cli(["--max_steps", "1", "--sft_dataset_name", str(sft), "--output_dir", str(tmp_path / "out")])
    assert code != 0 and "`sft_dataset` column 'completion' has a missing value (None) at row 1" in out
    # refused before anything was written (the output_dir check may have created the empty folder, as the Trainer would)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("kind", ["streaming", "splits"])
def test_ppo_trainer_refuses_a_train_dataset_it_cannot_size_by_name(tmp_path, kind):
    """PPOTrainer sizes the run from `len(train_dataset)` before TRAPOTrainer's checks: a streaming set was a raw
    `TypeError`, a `DatasetDict` was sized by its number of splits."""
    from datasets import DatasetDict

    from trl_trapo import PPOConfig, PPOTrainer

    prompts = Dataset.from_list([{"input_ids": [5, 6]}] * 4)
    dataset = prompts.to_iterable_dataset() if kind == "streaming" else DatasetDict({"train": prompts})
    message = r"`train_dataset` is an IterableDataset" if kind == "streaming" else r"`train_dataset` is a DatasetDict"
    with pytest.raises(ValueError, match=message):
        PPOTrainer(
            args=PPOConfig(output_dir=str(tmp_path), report_to="none"),
            processing_class=None,
            model=None,
            ref_model=None,
            reward_model=None,
            train_dataset=dataset,
        )
