# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The migration guide's edit list is complete and correct, checked mechanically.

`docs/migrating_from_ppo.md` lists, in a table between `<!-- migration-edits:start -->` and `<!-- migration-edits:end
-->`, every replacement a PPO script in the style of TRL 1.12's example needs on TRL 1.16 + trl-trapo. Here:

- the table's replacements, applied in order (each to every occurrence, each occurring at least once) to
  `tests/fixtures/ppo_trl112_style_before.py` (the script as written for `trl.experimental.ppo`), must give
  `examples/ppo_trl112_style.py` character for character: editing the guide or either script alone fails this test;
- `examples/ppo_trl112_style.py` runs in a subprocess on tiny local models (a Llama policy / reference, two
  `LlamaForSequenceClassification` for the reward and the critic, the character tokenizer to which the script adds
  `[PAD]` without resizing), saves the policy and its tokenizer and prints the table of completions, and the saved
  policy reloads with plain `from_pretrained`;
- the reasons the table gives hold for the installed packages (`get_kbit_device_map` and
  `ModelConfig.trust_remote_code` are gone, `apply_chat_template` returns a `BatchEncoding` unless `return_dict=False`);
- every old flag of the command-line table (between `<!-- migration-flags:start -->` and `<!-- migration-flags:end
  -->`) is rejected by the script's parser and every replacement flag parses.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
)
from transformers.utils import is_bitsandbytes_available
from trl import ModelConfig, ScriptArguments

from trl_trapo import PPOConfig
from trl_trapo.tasks import build_char_tokenizer


ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "migrating_from_ppo.md"
BEFORE = ROOT / "tests" / "fixtures" / "ppo_trl112_style_before.py"
AFTER = ROOT / "examples" / "ppo_trl112_style.py"
GSM8K_TRAIN = ROOT / "examples" / "data" / "gsm8k" / "train_first1500.jsonl"


def script_env(**extra: str) -> dict[str, str]:
    """The environment the example runs in as a user's process: this one's, the repository importable, one thread,
    the Hub offline, transformers' warnings quiet; then `extra`."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        **extra,
    }


# =====================================================================================================================
# Reading the guide's tables
# =====================================================================================================================
def table_rows(markdown: str, name: str) -> list[list[str]]:
    """The body rows of the Markdown table between `<!-- migration-<name>:start -->` and `<!-- migration-<name>:end
    -->`, each a list of its stripped cells (the header and the `|---|` separator are dropped).

    Raises:
        AssertionError: if the markers are missing or repeated, or the rows do not all have the header's cell count.
    """
    start, end = f"<!-- migration-{name}:start -->", f"<!-- migration-{name}:end -->"
    assert markdown.count(start) == 1 and markdown.count(end) == 1, f"{GUIDE.name} needs one {start} ... {end}"
    block = markdown[markdown.index(start) + len(start) : markdown.index(end)]
    lines = [line.strip() for line in block.strip().splitlines()]
    assert all(line.startswith("|") and line.endswith("|") for line in lines), f"only a table goes inside {start}"
    rows = [[cell.strip() for cell in line[1:-1].split("|")] for line in lines]
    header, separator, body = rows[0], rows[1], rows[2:]
    assert all(set(cell) <= {"-", ":"} for cell in separator), f"the second line inside {start} is the separator"
    assert body and all(len(row) == len(header) for row in body), f"every row inside {start} has {len(header)} cells"
    return body


def code_span(cell: str) -> str | None:
    """The text of the cell's single `code span`; None when the cell holds no code span.

    Raises:
        AssertionError: if the cell holds several code spans (a replacement is one piece of text).
    """
    spans = re.findall(r"`([^`]+)`", cell)
    assert len(spans) <= 1, f"a replacement cell holds one code span, not {len(spans)}: {cell!r}"
    return spans[0] if spans else None


def guide_edits() -> list[tuple[str, str]]:
    """The guide's replacements `(TRL 1.12-style code, TRL 1.16 + trl-trapo code)`, in table order."""
    edits = []
    for number, before, after, why in table_rows(GUIDE.read_text(encoding="utf-8"), "edits"):
        old, new = code_span(before), code_span(after)
        assert old and new and why, f"row {number}: two code spans and a reason"
        edits.append((old, new))
    return edits


def apply_edits(text: str, edits: list[tuple[str, str]]) -> str:
    """`text` with each `(old, new)` applied in order to every occurrence of `old`.

    Raises:
        AssertionError: naming the row, if an `old` does not occur in the text it is applied to (a row that edits
            nothing is not an edit of this script).
    """
    for number, (old, new) in enumerate(edits, start=1):
        assert old in text, f"row {number} of the guide's table: {old!r} is not in the script it edits"
        text = text.replace(old, new)
    return text


# =====================================================================================================================
# The edit table turns the "before" script into the example
# =====================================================================================================================
def test_the_guide_edits_turn_the_trl_1_12_script_into_the_example():
    """Applying the table to the "before" script, then the project's formatter (ruff, which drops the parentheses
    row 3's replacement needs inside a longer conditional expression), gives the example exactly; on a mismatch the
    message is the diff."""
    edited = apply_edits(BEFORE.read_text(encoding="utf-8"), guide_edits())
    migrated = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(AFTER), "-"],
        input=edited,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    example = AFTER.read_text(encoding="utf-8")
    diff = "".join(
        difflib.unified_diff(
            migrated.splitlines(keepends=True),
            example.splitlines(keepends=True),
            "before + the guide's edits",
            str(AFTER.relative_to(ROOT)),
        )
    )
    assert migrated == example, (
        "the migration guide and the example have drifted apart: the guide's edit table, applied to "
        f"{BEFORE.relative_to(ROOT)}, does not give {AFTER.relative_to(ROOT)}. Either the guide lacks an edit the "
        "example makes, or lists one it does not:\n" + diff
    )


def code_of(path: Path) -> str:
    """The text of a Python file after its module docstring."""
    text = path.read_text(encoding="utf-8")
    docstring = ast.parse(text).body[0]
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant), f"{path} has a docstring"
    return "\n".join(text.splitlines()[docstring.end_lineno :])


def test_the_before_script_is_the_trl_1_12_version():
    """The "before" file's code really targets TRL 1.12 (it uses the removed names) and the example's code does not
    (their shared module docstring may name them)."""
    before, after = code_of(BEFORE), code_of(AFTER)
    for name in ("trl.experimental.ppo", "get_kbit_device_map", "model_args.trust_remote_code"):
        assert name in before and name not in after, name
    assert 'tokenizer.add_special_tokens({"pad_token": "[PAD]"})' in after and "resize_token_embeddings" not in after


def test_the_reasons_the_guide_gives_hold_for_the_installed_packages():
    """Rows 2-5: what fails without each edit, on the installed TRL 1.16 and transformers 5."""
    import trl

    with pytest.raises(ImportError):
        exec("from trl import get_kbit_device_map", {})
    with pytest.raises(ImportError):
        exec("from trl.experimental.ppo import PPOConfig", {})
    assert not hasattr(ModelConfig(), "trust_remote_code") and not hasattr(PPOConfig, "trust_remote_code")
    assert hasattr(trl, "get_peft_config") and hasattr(trl, "get_quantization_config")
    tokenizer = build_char_tokenizer()
    messages = [{"role": "user", "content": "2+2?"}]
    as_dict = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    as_list = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert set(as_dict.keys()) == {"input_ids", "attention_mask"} and len(as_dict) == 2
    assert as_list == as_dict["input_ids"] and tokenizer.decode(as_list) == "user: 2+2?\nassistant: "


# =====================================================================================================================
# The command-line table
# =====================================================================================================================
def parse(flags: list[str], output_dir: Path):
    """Parse `flags` the way the example does (`HfArgumentParser` over its three dataclasses).

    Raises:
        ValueError or SystemExit: for an unknown flag (HfArgumentParser / argparse).
    """
    parser = HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig))
    return parser.parse_args_into_dataclasses(args=[*flags, "--output_dir", str(output_dir)])


def test_every_old_flag_is_rejected_and_every_replacement_parses(tmp_path):
    """Each old flag of the command-line table fails to parse; each replacement that is a flag parses."""
    rows = table_rows(GUIDE.read_text(encoding="utf-8"), "flags")
    assert len(rows) >= 5
    for old, new, why in rows:
        old_flags, new_flags = code_span(old), code_span(new)
        assert old_flags and why, old
        with pytest.raises((ValueError, SystemExit)):
            parse(shlex.split(old_flags), tmp_path)
        if new_flags is not None and new_flags.startswith("--"):
            parse(shlex.split(new_flags), tmp_path)
    _, config, _ = parse(["--warmup_steps", "0.1"], tmp_path)
    assert config.get_warmup_steps(100) == 10  # "a warmup_steps below 1 is a fraction of the training steps"


# =====================================================================================================================
# The example runs
# =====================================================================================================================
def save_tiny_models(root: Path) -> dict[str, Path]:
    """A tiny Llama policy (with the character tokenizer saved next to it) and two tiny
    `LlamaForSequenceClassification` (reward, critic; `num_labels=1`), saved with `save_pretrained`. The models embed
    exactly the tokenizer's vocabulary: the `[PAD]` the script adds has no embedding row."""
    tokenizer = build_char_tokenizer()
    config = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    paths = {name: root / name for name in ("policy", "reward", "value")}
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(paths["policy"])
    tokenizer.save_pretrained(paths["policy"])
    for seed, name in enumerate(("reward", "value"), start=1):
        torch.manual_seed(seed)
        LlamaForSequenceClassification(LlamaConfig(**config, num_labels=1)).save_pretrained(paths[name])
    return paths


@pytest.fixture(scope="module")
def example_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`examples/ppo_trl112_style.py` run once, as a user runs it, on the tiny models of `save_tiny_models` and the
    first 40 GSM8K questions (8 held out, prompts of at most 300 characters): 8 episodes, 8-token responses, 2 PPO
    steps. The finished process (exit status not checked here) and the output folder."""
    root = tmp_path_factory.mktemp("migration_example")
    paths = save_tiny_models(root)
    output_dir = root / "out"
    command = [
        sys.executable,
        str(AFTER),
        *("--model_name_or_path", str(paths["policy"]), "--sft_model_path", str(paths["policy"])),
        *("--reward_model_path", str(paths["reward"]), "--value_model_path", str(paths["value"])),
        *("--dataset_name", str(GSM8K_TRAIN), "--max_prompts", "40", "--eval_samples", "8"),
        *("--max_prompt_tokens", "300", "--total_episodes", "8", "--response_length", "8"),
        *("--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--num_ppo_epochs", "1"),
        *("--stop_token", "eos", "--learning_rate", "1e-3", "--num_sample_generations", "0", "--logging_steps", "1"),
        *("--save_strategy", "no", "--report_to", "none", "--output_dir", str(output_dir)),
    ]
    # COLUMNS: the width of the completions table `rich` prints
    env = script_env(HF_DATASETS_OFFLINE="1", COLUMNS="200")
    completed = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    completed.args = shlex.join(command)
    return completed, output_dir


def test_the_example_runs_on_tiny_models_with_pad_added_without_resizing(example_run):
    """Exit status 0, the trained policy and its tokenizer saved (`[PAD]` the pad token, the embeddings not resized:
    the pad id is one past the last row), the table of completions printed by `generate_completions()`."""
    completed, output_dir = example_run
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"{completed.args} failed:\n{output[-6000:]}"
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (output_dir / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    config = AutoConfig.from_pretrained(output_dir)
    assert tokenizer.pad_token == "[PAD]" and tokenizer.pad_token_id == config.vocab_size == len(tokenizer) - 1
    table = completed.stdout
    assert "Completion" in table and "score" in table and "assistant:" in table, table[-3000:]


def test_the_policy_the_example_saves_reloads_with_from_pretrained(example_run):
    """`save_model()`'s folder reloads with plain `from_pretrained`, though training aligned the policy config's
    pad_token_id with the unembeddable `[PAD]` (transformers' `align_special_tokens`)."""
    completed, output_dir = example_run
    assert completed.returncode == 0
    AutoModelForCausalLM.from_pretrained(output_dir)


def test_the_example_without_a_model_says_what_to_pass_at_once(tmp_path):
    """With no arguments the example went on to load `None` from the Hub and ended, 52 s later, in a raw `OSError`
    traceback (a fresh user's trial). It now stops after parsing with one line naming the three model flags and the
    offline tiny model, before it loads anything or deletes `output_dir` (the script's `rmtree`, kept from TRL's
    example)."""
    out = tmp_path / "earlier-results"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    env = script_env()
    completed = subprocess.run(
        [sys.executable, str(AFTER), "--output_dir", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = [line for line in (completed.stdout + completed.stderr).splitlines() if "[WARNING]" not in line]
    assert completed.returncode == 2 and len(lines) == 1, (completed.returncode, lines)
    assert lines[0].startswith("ppo_trl112_style.py: error: no model given: pass --model_name_or_path"), lines
    for needle in ("--sft_model_path", "--reward_model_path", "scripts/save_tiny_model.py --output_dir models/tiny"):
        assert needle in lines[0], needle
    assert (out / "notes.txt").read_text() == "kept"


@pytest.mark.slow  # ~12 CPU-s (two interpreters); default-run sibling: test_the_example_runs_on_tiny_models_with_pad_...
def test_the_docstrings_offline_command_runs_from_another_folder(tmp_path):
    """The offline command the example's docstring gives runs, on the tiny model `scripts/save_tiny_model.py`
    writes, from a folder other than the repository root (its default `--dataset_name` was relative to the working
    directory: a raw `FileNotFoundError` from datasets anywhere else)."""
    env = script_env()
    docstring = AFTER.read_text(encoding="utf-8").split("Offline, on the built-in tiny model")[1].split('"""')[0]
    command = shlex.split(docstring[docstring.index("python examples") :].split("\n\n")[0].replace("\\\n", " "))
    assert command[:2] == ["python", "examples/ppo_trl112_style.py"] and command.count("models/tiny") == 3, command
    save_tiny_model = subprocess.run(
        [sys.executable, "scripts/save_tiny_model.py", "--output_dir", str(tmp_path / "tiny")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert save_tiny_model.returncode == 0, save_tiny_model.stderr[-3000:]
    paths = {"models/tiny": str(tmp_path / "tiny"), "ppo-tiny": str(tmp_path / "ppo-tiny")}
    away = tmp_path / "elsewhere"  # not the repository root: the default --dataset_name is found next to the script
    away.mkdir()
    offline = subprocess.run(
        [sys.executable, str(AFTER), *(paths.get(part, part) for part in command[2:])],
        cwd=away, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert offline.returncode == 0, (offline.stdout + offline.stderr)[-3000:]
    assert (tmp_path / "ppo-tiny" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "flags, needle",
    [
        # a missing local folder of the form `a/b` was tried as a Hub id: 53 s of retries offline, then a raw OSError
        (["--reward_model_path", "models/nope_rm"], "--reward_model_path='models/nope_rm': no such folder"),
        (["--sft_model_path", "./nope"], "--sft_model_path='./nope': no such folder"),
        # a data file that does not exist: a raw FileNotFoundError from datasets, after the models had loaded
        (["--dataset_name", "nope.jsonl"], "--dataset_name='nope.jsonl': no such file"),
        # an abbreviation was silently taken for --total_episodes (argparse's prefix matching)
        (["--total_episode", "8"], "['--total_episode', '8']"),
        # a value the configuration refuses: its message, without a traceback
        (["--total_episodes", "-3"], "total_episodes=-3 is invalid"),
        # trial 8's JC24: datasets' KeyError: 'question' traceback, after the models had loaded
        (["--dataset_name", "prompts.jsonl"], "--dataset_text_field='question': 'prompts.jsonl' has no such column"),
        # trial 8's JC14: transformers' ImportError traceback from the first from_pretrained (the main job's check)
        # trial 9's CL40 / CN06: datasets' IndexError traceback, after the models had loaded
        (["--max_prompts", "0"], "--max_prompts=0: must be >= 1"),
        (["--eval_samples", "0"], "--eval_samples=0: must be >= 1"),
        (["--max_prompts", "4", "--eval_samples", "4"], "--eval_samples=4 holds out all 4 prompts"),
        (["--max_prompt_tokens", "-1"], "--max_prompt_tokens=-1: must be >= 1"),
        # trial 9's CL41: a Hub-shaped name that is no folder here: 30 s of Hub retries, then an OSError traceback
        (["--sft_model_path", "nope_dir"], "--sft_model_path='nope_dir': no local directory"),
        pytest.param(
            ["--load_in_4bit"],
            "loads the model in 4-bit (`--load_in_4bit`), which needs the bitsandbytes package",
            marks=pytest.mark.skipif(is_bitsandbytes_available(), reason="bitsandbytes is installed"),
        ),
    ],
    ids=[
        "missing-reward-model",
        "missing-sft-model",
        "missing-data",
        "abbreviation",
        "bad-value",
        "no-column",
        "no-prompts",
        "no-eval-prompts",
        "eval-takes-all",
        "negative-prompt-tokens",
        "sft-hub-id",
        "4bit",
    ],
)
def test_the_example_refuses_bad_paths_and_flags_at_once_in_one_line(tmp_path, flags, needle):
    """A fresh user's trial: each bad input ended in a traceback (or was silently taken). Now one line, the flag and
    value named, a non-zero exit, before any model is loaded or `output_dir` deleted."""
    (tmp_path / "models" / "tiny").mkdir(parents=True)  # a local `models/` folder: `models/nope_rm` is a typo
    (tmp_path / "models" / "tiny" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "2+2=", "answer": "4"}\n')  # no `question` column
    out = tmp_path / "earlier-results"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    env = script_env()
    env.pop("HF_HUB_OFFLINE", None)  # as the user ran it: online mode, no network
    models = [
        "--model_name_or_path",
        "models/tiny",
        "--sft_model_path",
        "models/tiny",
        "--reward_model_path",
        "models/tiny",
    ]
    completed = subprocess.run(
        [sys.executable, str(AFTER), *models, *flags, "--output_dir", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # datasets' progress bar while it reads the file (`Generating train split`) is not a message
    noise = ("[WARNING]", "Generating train split")
    output = (completed.stdout + completed.stderr).splitlines()
    lines = [line for line in output if line.strip() and not any(word in line for word in noise)]
    assert completed.returncode == 2 and len(lines) == 1, (completed.returncode, lines)
    assert lines[0].startswith("ppo_trl112_style.py: error: ") and needle in lines[0], lines
    assert (out / "notes.txt").read_text() == "kept"


@pytest.mark.slow
def test_a_value_the_configuration_refuses_exits_2_as_argparse_does(tmp_path):
    """Trial 12's C06: `--kl_estimator k4` (argparse's choices) exited 2, `--missing_eos_penalty -1.0` (PPOConfig's
    check) printed the same `ppo_trl112_style.py: error:` line but exited 1. Both are usage errors found before
    anything loads: both exit 2 now, as the `trapo` commands and the other examples do."""
    env = script_env()
    models = ["--model_name_or_path", "m", "--sft_model_path", "m", "--reward_model_path", "m"]  # never read
    for flag, value, needle in (
        ("--kl_estimator", "k4", "argument --kl_estimator/--kl-estimator: invalid choice: 'k4'"),
        ("--missing_eos_penalty", "-1.0", "PPOConfig.missing_eos_penalty=-1.0 is invalid"),
    ):
        completed = subprocess.run(
            [sys.executable, str(AFTER), *models, flag, value, "--output_dir", str(tmp_path / "out")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        last = completed.stderr.strip().splitlines()[-1]
        assert completed.returncode == 2, (flag, completed.returncode, completed.stderr[-2000:])
        assert last.startswith("ppo_trl112_style.py: error: ") and needle in last, last


@pytest.mark.parametrize(
    "output_dir, needle",
    [
        ("models/tiny", "holds --model_name_or_path='models/tiny'"),  # trial 10's CX11: the model folder was deleted
        ("models", "holds --model_name_or_path='models/tiny'"),  # a folder above the model
        ("data", "holds --dataset_name='data/prompts.jsonl'"),
        (".", "holds the current folder"),
    ],
    ids=["model-folder", "above-the-model", "data-folder", "current-folder"],
)
def test_the_example_never_deletes_an_output_dir_that_holds_its_inputs(tmp_path, output_dir, needle):
    """Trial 10's CX11: the script deletes `--output_dir` before it trains (as TRL's PPO example does); given the model
    folder as `--output_dir`, it deleted the user's model, then failed to load it. Now such an `--output_dir` is refused
    in one line before anything is deleted, and every file is still there."""
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "tiny" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "prompts.jsonl").write_text(
        '{"question": "2+2="}\n{"question": "3+3="}\n{"question": "1+1="}\n'
    )
    env = script_env()
    # "." runs from an empty folder beside the inputs: the current folder is the only thing `--output_dir` holds
    cwd, up = (tmp_path / "run", "../") if output_dir == "." else (tmp_path, "")
    cwd.mkdir(exist_ok=True)
    model = f"{up}models/tiny"
    models = ["--model_name_or_path", model, "--sft_model_path", model, "--reward_model_path", model]
    completed = subprocess.run(
        [sys.executable, str(AFTER), *models, "--dataset_name", f"{up}data/prompts.jsonl", "--eval_samples", "1",
         "--output_dir", output_dir],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    noise = ("[WARNING]", "Generating train split")
    output = (completed.stdout + completed.stderr).splitlines()
    lines = [line for line in output if line.strip() and not any(word in line for word in noise)]
    assert completed.returncode == 2 and len(lines) == 1, (completed.returncode, lines)
    assert lines[0].startswith("ppo_trl112_style.py: error: --output_dir=") and needle in lines[0], lines
    assert (tmp_path / "models" / "tiny" / "config.json").is_file() and (tmp_path / "data" / "prompts.jsonl").is_file()


def test_the_example_says_when_the_length_filter_keeps_no_prompt(tmp_path):
    """Trial 9's CN01: a `--max_prompt_tokens` below every prompt's length emptied the training set, and the script
    ended in datasets' `IndexError: Invalid key: 0 is out of bounds for size 0`. Now one line right after the filter,
    naming the flag, how many prompts it kept and the shortest prompt's length (the value that keeps one)."""
    paths = save_tiny_models(tmp_path)
    env = script_env(HF_DATASETS_OFFLINE="1")
    models = ["--model_name_or_path", "--sft_model_path", "--reward_model_path"]
    completed = subprocess.run(
        [sys.executable, str(AFTER), *(part for flag in models for part in (flag, str(paths["policy"]))),
         "--max_prompts", "8", "--eval_samples", "2", "--max_prompt_tokens", "5", "--output_dir", str(tmp_path / "o")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    assert completed.returncode == 2 and "Traceback" not in output, output[-3000:]
    line = output.strip().splitlines()[-1]
    match = re.fullmatch(
        r"ppo_trl112_style\.py: error: --max_prompt_tokens=5 keeps 0 of the 6 train prompts \(the shortest has "
        r"(\d+) tokens, chat template included\)\. Fix: pass --max_prompt_tokens \1 or more, or shorter prompts\.",
        line,
    )
    assert match and int(match.group(1)) > 5, line
