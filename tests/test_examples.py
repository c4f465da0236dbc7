"""The main job, `examples/trapo.py`: built-in mode, local model + local datasets, GSM8K, CLI and recipes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import load_script, run_script
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import ModelConfig

from trl_trapo import cli


ROOT = Path(__file__).resolve().parent.parent
GSM8K = ROOT / "examples" / "data" / "gsm8k" / "train_first1500.jsonl"  # committed: never skipped


def tiny_args(output_dir, **overrides):
    """The built-in defaults, shortened to a smoke test."""
    values = {**cli.BUILTIN_DEFAULTS, "output_dir": str(output_dir), "max_steps": 6, "eval_steps": 3}
    values.update(overrides)
    script = cli.TRAPOScriptArguments(**{k: values.pop(k) for k in list(values) if k in cli.SCRIPT_FIELDS})
    return script, cli.TRAPOConfig(**values), ModelConfig()


def test_builtin_job_writes_results_and_a_model_that_reloads(tmp_path):
    from trl_trapo.tasks import greedy_accuracy, make_task_suite

    script, args, model_args = tiny_args(tmp_path)  # 6 steps, an evaluation every 3
    results = cli.main(script, args, model_args)
    saved = json.loads((tmp_path / "eval_results.json").read_text())
    assert saved == pytest.approx(results)
    for key in ("eval_accuracy", "eval_accuracy_initial", "eval_accuracy_sft_tasks", "eval_accuracy_rl_only"):
        assert 0.0 <= saved[key] <= 1.0, key
    assert (tmp_path / "trainer_state.json").exists()
    # the saved model reloads with from_pretrained and reproduces the reported accuracy
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    reproduced = greedy_accuracy(model, tokenizer, make_task_suite(seed=script.task_suite_seed).eval, max_new_tokens=8)
    assert reproduced["accuracy"] == pytest.approx(saved["eval_accuracy"])
    assert reproduced["accuracy_rl_only"] == pytest.approx(saved["eval_accuracy_rl_only"])
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert sum("eval_reward" in h for h in history) >= 2  # evaluation during training (eval_strategy)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("conversational", [False, True])
def test_local_model_and_local_json_datasets(tmp_path, conversational):
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")

    def prompt(text):
        return [{"role": "user", "content": text}] if conversational else text

    def completion(text):
        return [{"role": "assistant", "content": text}] if conversational else text

    rl = write_jsonl(tmp_path / "rl.jsonl", [{"prompt": prompt(f"rev ab{c}="), "answer": f"{c}ba"} for c in "cdefgh"])
    sft = write_jsonl(
        tmp_path / "sft.jsonl", [{"prompt": prompt(f"rev b{c}="), "completion": completion(f"{c}b")} for c in "abc"]
    )
    messages = [
        {"messages": [{"role": "user", "content": f"nxt {c}="}, {"role": "assistant", "content": chr(ord(c) + 1)}]}
        for c in "abc"
    ]
    sft_messages = write_jsonl(tmp_path / "sft_messages.jsonl", messages)
    pretrain = write_jsonl(tmp_path / "pt.jsonl", [{"text": "after a comes b. " * 5} for _ in range(8)])
    script, args, model_args = tiny_args(
        tmp_path / "out",
        dataset_name=rl,
        sft_dataset_name=sft_messages if conversational else sft,
        pretrain_dataset_name=pretrain,
        reward_funcs=["exact_match"],
        eval_strategy="steps",  # a single file has no held-out split: the trainer's copy gets eval_strategy="no"
        max_steps=3,
        max_prompt_length=48,  # the chat template adds "user: ...\nassistant: "
    )
    model_args = ModelConfig(model_name_or_path=str(tmp_path / "model"), dtype="float32")
    before = args.to_dict()
    results = cli.main(script, args, model_args)
    assert args.to_dict() == before  # the parsed config is never changed (model_init_kwargs go into a copy)
    assert results["train_loss"] == results["train_loss"]  # finite, and the run completed
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    original = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert any(not torch.equal(a, b) for a, b in zip(reloaded.parameters(), original.parameters()))


def test_gsm8k_conversion_and_a_short_run_with_the_numeric_reward(tmp_path):
    convert = load_script("scripts/gsm8k_to_trl.py")
    counts = convert.main([str(GSM8K), "--output_dir", str(tmp_path / "gsm8k"), "--test_size", "20"])
    assert counts == {"rl/train": 1480, "rl/test": 20, "sft/train": 1480, "pretrain/train": 1480}
    first = json.loads((tmp_path / "gsm8k" / "sft" / "train.jsonl").read_text().splitlines()[0])
    assert first["completion"].rstrip().split("####")[-1].strip().replace(",", "").isdigit()
    assert "<<" not in first["completion"]  # calculator annotations removed
    save_tiny = load_script("scripts/save_tiny_model.py")
    save_tiny.main(["--output_dir", str(tmp_path / "tiny"), "--max_position_embeddings", "2048"])
    script, args, model_args = tiny_args(
        tmp_path / "out",
        dataset_name=str(tmp_path / "gsm8k" / "rl"),
        sft_dataset_name=str(tmp_path / "gsm8k" / "sft"),
        pretrain_dataset_name=str(tmp_path / "gsm8k" / "pretrain"),
        reward_funcs=["numeric_answer"],
        max_steps=2,
        eval_strategy="no",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_generations=2,
        response_length=8,
        max_prompt_length=1024,
        sft_max_length=1536,
        pretrain_max_length=256,
        per_device_eval_batch_size=20,
    )
    model_args = ModelConfig(model_name_or_path=str(tmp_path / "tiny"))
    results = cli.main(script, args, model_args)
    assert "eval_rewards/numeric_answer_reward" in results  # the held-out split (rl/test.jsonl) was evaluated


def test_cli_with_a_recipe_yaml(tmp_path, monkeypatch):
    """`python examples/trapo.py --config recipe.yaml` (TrlParser) runs; command-line flags override the file. The
    script runs in this process (`run_script`): its subject is the command line, not the process."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'out'}\nmax_steps: 2\neval_strategy: 'no'\nlearning_rate: 0.001\n")
    monkeypatch.chdir(tmp_path)
    status = run_script(ROOT / "examples" / "trapo.py", ["--config", str(recipe), "--logging_steps", "2"], monkeypatch)
    assert status == 0
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert "eval_accuracy" in results
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    # --logging_steps 2 from the command line (without it, the built-in default scaled to 2 steps logs both)
    assert [h["step"] for h in history if "loss" in h] == [2]


def test_gsm8k_conversion_with_the_official_test_file(tmp_path):
    """`--test_file`: the first `--test_rows` rows of the official test split become rl/test (in order), and every
    training row trains; no test question reaches a training set."""
    convert = load_script("scripts/gsm8k_to_trl.py")
    data = ROOT / "examples" / "data" / "gsm8k"
    counts = convert.main(
        [
            str(data / "train_first1500.jsonl"),
            "--conversational",
            "--test_file",
            str(data / "test_first500.jsonl"),
            "--test_rows",
            "20",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert counts == {"rl/train": 1500, "rl/test": 20, "sft/train": 1500, "pretrain/train": 1500}
    test_rows = [json.loads(line) for line in (tmp_path / "rl" / "test.jsonl").read_text().splitlines()]
    official = [json.loads(line) for line in (data / "test_first500.jsonl").read_text().splitlines()][:20]
    assert [r["prompt"][-1]["content"] for r in test_rows] == [r["question"].strip() for r in official]
    train_questions = {
        json.loads(line)["prompt"][-1]["content"]
        for line in (tmp_path / "rl" / "train.jsonl").read_text().splitlines()
    }
    assert not train_questions & {r["question"].strip() for r in official}


def test_gsm8k_conversion_with_general_pretraining_text(tmp_path):
    """`--pretrain_text`: pretrain/train.jsonl holds the file's paragraphs (one document each, in order, blank lines
    between them dropped) instead of the GSM8K documents; the RL and SFT files are unchanged."""
    convert = load_script("scripts/gsm8k_to_trl.py")
    text = tmp_path / "general.txt"
    text.write_text("First Citizen:\nSpeak, speak.\n\n\nAll:\nResolved.\n  \nLast one.\n", encoding="utf-8")
    counts = convert.main([str(GSM8K), "--pretrain_text", str(text), "--output_dir", str(tmp_path / "out")])
    documents = [json.loads(line)["text"] for line in (tmp_path / "out" / "pretrain" / "train.jsonl").open()]
    assert documents == ["First Citizen:\nSpeak, speak.", "All:\nResolved.", "Last one."]
    assert counts["pretrain/train"] == 3 and counts["sft/train"] == counts["rl/train"] == 1400
    shakespeare = convert.text_paragraphs(str(ROOT / "examples" / "data" / "shakespeare" / "train.txt"))
    assert len(shakespeare) == 6283  # the paragraph count examples/data/README.md gives
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match="no paragraph"):
        convert.text_paragraphs(str(tmp_path / "blank.txt"))


@pytest.mark.parametrize(
    "make, extra, needles",
    [
        # tried as a Hub dataset: datasets' ConnectionError after ~25 s (S02)
        (None, ["nope.jsonl"], ["source 'nope.jsonl': no such file", "openai/gsm8k --config main"]),
        # its own messages were tracebacks, exit 1 (S03, S04)
        ({"question": "q", "answer": "no hashes"}, [], ["line 1 of", "no '#### N' line", "fix or drop the row"]),
        ({"q": "q"}, [], ["line 1 of", "lacks 'question'/'answer' (it has ['q'])"]),
        ({"question": "q", "answer": 7}, [], ["line 1 of", "'answer' is a int", "must be text"]),
        # an --output_dir that is a file: a raw NotADirectoryError (S05)
        ({"question": "q", "answer": "#### 1"}, ["--output_dir", "{tmp}/afile"], ["--output_dir", "afile' is a file"]),
        (b"\xe9\n", [], ["is not UTF-8 text", "iconv -f latin1"]),
        (b"\xef\xbb\xbf\xe9\n", [], ["is not UTF-8 text (invalid continuation byte at byte 3)"]),  # the file's byte
        (b"{oops\n", [], ["line 1 is not a JSON object"]),
        (
            {"question": "q", "answer": "#### 1"},
            ["--pretrain_text", "{tmp}/none.txt"],
            ["--pretrain_text", "none.txt': no such file"],
        ),
    ],
    ids=[
        "missing-file",
        "no-hashes",
        "no-keys",
        "answer-not-text",
        "output-dir-is-a-file",
        "latin1",
        "latin1-after-a-byte-order-mark",
        "not-json",
        "no-text",
    ],
)
def test_gsm8k_conversion_refuses_bad_input_as_an_argparse_error(tmp_path, capsys, make, extra, needles):
    """Every input error of scripts/gsm8k_to_trl.py is argparse's `error:` line and exit 2, before anything is
    written: no traceback, no Hub attempt for a missing file."""
    convert = load_script("scripts/gsm8k_to_trl.py")
    source = tmp_path / "in.jsonl"
    if make is not None:
        source.write_bytes(make if isinstance(make, bytes) else (json.dumps(make) + "\n").encode())
    (tmp_path / "afile").write_text("")
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    positional = [] if extra and not extra[0].startswith("--") else [str(source)]
    argv = positional + extra
    if "--output_dir" not in argv:
        argv += ["--output_dir", str(tmp_path / "out")]
    if "--test_size" not in argv:
        argv += ["--test_size", "0"]
    with pytest.raises(SystemExit) as exit_:
        convert.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "error:" in err and "Traceback" not in err, err
    message = err.split("error:", 1)[1]  # not the usage lines above it, which name every argument
    for needle in needles:
        assert needle in message, err
    assert not (tmp_path / "out").exists()


def test_gsm8k_conversion_reads_a_file_saved_on_windows(tmp_path):
    """Trial 16's C14: a JSONL file with a UTF-8 byte-order mark (and CRLF line ends, a trailing blank line) was
    refused, "line 1 is not a JSON object (Unexpected UTF-8 BOM (decode using utf-8-sig))", though the main job reads
    the same file (`datasets` drops the mark). It converts, the first question without the mark; a `--pretrain_text`
    file's mark does not reach the first document."""
    convert = load_script("scripts/gsm8k_to_trl.py")
    rows = [{"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"} for i in range(5)]
    source = tmp_path / "windows.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\r\n" for r in rows).encode() + b"\r\n")
    text = tmp_path / "general.txt"
    text.write_bytes(b"\xef\xbb\xbfFirst Citizen:\r\nSpeak.\r\n\r\nAll:\r\nResolved.\r\n")
    argv = [str(source), "--test_size", "2", "--pretrain_text", str(text), "--output_dir", str(tmp_path / "out")]
    counts = convert.main(argv)
    assert counts == {"rl/train": 3, "rl/test": 2, "sft/train": 3, "pretrain/train": 2}
    written = [
        json.loads(line) for part in ("train", "test") for line in (tmp_path / "out" / "rl" / f"{part}.jsonl").open()
    ]
    assert sorted(r["prompt"] for r in written) == [f"Question: What is {i}+1?\nAnswer:" for i in range(5)]
    documents = [json.loads(line)["text"] for line in (tmp_path / "out" / "pretrain" / "train.jsonl").open()]
    assert documents[0] == "First Citizen:\nSpeak."


@pytest.mark.parametrize(
    "suffix, content, where",
    [
        # a blank line and a good row before it: the 2nd row is on the file's line 4 (was "row 1", 0-based)
        (
            ".jsonl",
            '\ufeff{"question": "q", "answer": "#### 1"}\n\n\n{"question": "q2", "answer": "7"}\n',
            "line 4 of",
        ),
        # a JSON array has no line per row: its 0-based index, as the job's dataset messages name rows
        (".json", '[{"question": "q", "answer": "#### 1"}, {"question": "q2", "answer": "7"}]', "row 1 of"),
    ],
    ids=["jsonl-line", "json-array-index"],
)
def test_gsm8k_conversion_names_a_bad_row_where_the_user_finds_it(tmp_path, capsys, suffix, content, where):
    """Trial 16's C14: a JSONL row without `#### N` was "row 3 of data.jsonl" (0-based, blank lines not counted),
    where the job's JSONL messages say the file's 1-based line; it says `line N`, the line an editor shows."""
    convert = load_script("scripts/gsm8k_to_trl.py")
    source = tmp_path / f"in{suffix}"
    source.write_text(content, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        convert.main([str(source), "--test_size", "0", "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert f"{where} {source}: the answer has no '#### N' line: '7'" in err, err


@pytest.mark.parametrize("recipe", sorted((ROOT / "examples" / "recipes").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_shipped_recipe_sets_no_setting_the_job_warns_it_ignores(recipe, caplog):
    """Trial 14's C16: the CPU recipe carried `lora_*` keys with `use_peft: false`, so its first run warned
    "--lora_target_modules is set but --use_peft is not" about a setting the user never wrote."""
    import dataclasses
    import logging

    from trl_trapo.jobs.main import read_config_file, warn_unused_lora_arguments

    settings = read_config_file(str(recipe))
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    model_args = ModelConfig(**{k: v for k, v in settings.items() if k in names})
    with caplog.at_level(logging.WARNING):
        warn_unused_lora_arguments(model_args)
    assert not [r.getMessage() for r in caplog.records if "--use_peft" in r.getMessage()]
