# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`trl_trapo.paths`: a model folder that cannot be loaded, and a Hub-shaped name that cannot be fetched, are named at
once, before anything is loaded, for every model and dataset flag of the main job.

From a fresh user's trial: a folder with a corrupted `model.safetensors` given as `--model_name_or_path` ended in a
raw `SafetensorError` traceback from inside transformers (after the data had loaded); a folder whose `config.json` is
`{"hello": 1}` in "Couldn't instantiate the backend tokenizer ... install sentencepiece"; a missing `models/nope`
(also a valid Hub id) in 52 s of Hub retries without a network.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from trl import ModelConfig

from trl_trapo import cli, paths
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    """A tiny causal LM and its tokenizer, as `save_pretrained` writes them."""
    folder = tmp_path_factory.mktemp("saved") / "tiny"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def corrupt_header(folder: Path) -> None:
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[20:30] = b"\xff" * 10  # inside the JSON header: invalid UTF-8, as the trial's flipped bytes
    (folder / "model.safetensors").write_bytes(bytes(data))


def truncate(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])  # an interrupted copy


def sharded_index_without_shard(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


BROKEN_FOLDERS = {
    "corrupted-safetensors": (corrupt_header, "model.safetensors is not a readable safetensors file"),
    "truncated-safetensors": (truncate, "model.safetensors is not a readable safetensors file"),
    "config-without-model_type": (
        lambda f: (f / "config.json").write_text('{"hello": 1}'),
        "config.json has no `model_type` (its keys: hello)",
    ),
    "config-not-json": (lambda f: (f / "config.json").write_text('{"model_type": "llama",'), "is not valid JSON"),
    "config-with-bom": (  # saved by an editor as "UTF-8 with BOM": transformers' `json` refuses it
        lambda f: (f / "config.json").write_bytes(b"\xef\xbb\xbf" + (f / "config.json").read_bytes()),
        "config.json starts with a UTF-8 byte-order mark (BOM), which transformers cannot read: save it as plain",
    ),
    "config-a-list": (lambda f: (f / "config.json").write_text("[1, 2]"), "holds a JSON list, not an object"),
    "no-weights": (lambda f: (f / "model.safetensors").unlink(), "has a config but no weights file"),
    "missing-shard": (sharded_index_without_shard, "names weight files that are not in the directory"),
}


@pytest.fixture(params=sorted(BROKEN_FOLDERS))
def broken(request, saved_model, tmp_path) -> tuple[Path, str]:
    """A copy of `saved_model` broken one way, and the words the error must hold."""
    folder = tmp_path / "broken"
    shutil.copytree(saved_model, folder)
    damage, needle = BROKEN_FOLDERS[request.param]
    damage(folder)
    return folder, needle


def build(tmp_path, model_args: ModelConfig | None = None, **script):
    values = {**cli.BUILTIN_DEFAULTS, "output_dir": str(tmp_path / "out")}
    args = cli.TRAPOConfig(**{k: v for k, v in values.items() if k not in cli.SCRIPT_FIELDS})
    teacher = script.pop("teacher_model_name_or_path", None)
    if teacher:
        args = cli.TRAPOConfig(
            **{k: v for k, v in values.items() if k not in cli.SCRIPT_FIELDS}, teacher_model_name_or_path=teacher
        )
    return cli.build_inputs(cli.TRAPOScriptArguments(**script), args, model_args or ModelConfig())


def test_a_saved_model_passes(saved_model):
    paths.check_model_source(str(saved_model), "--model_name_or_path")
    assert paths.model_directory_problem(str(saved_model)) is None


def test_a_broken_model_folder_is_named_for_every_model_flag(broken, tmp_path):
    """The file and what is wrong with it, under the flag that gave it, before anything is loaded."""
    folder, needle = broken
    with pytest.raises(
        ValueError, match=re.escape(f"--model_name_or_path={str(folder)!r}: ") + ".*" + re.escape(needle)
    ):
        build(tmp_path, model_args=ModelConfig(model_name_or_path=str(folder)))
    for flag in ("reward_model_name_or_path", "value_model_name_or_path", "teacher_model_name_or_path"):
        with pytest.raises(ValueError, match=re.escape(f"--{flag}={str(folder)!r}: ") + ".*" + re.escape(needle)):
            build(tmp_path, **{flag: str(folder)})
    with pytest.raises(ValueError, match=re.escape(f"model={str(folder)!r}: ") + ".*" + re.escape(needle)):
        paths.check_model_source(str(folder), "model")  # the trainer's own check of `model="..."`


def test_the_command_line_says_it_in_one_line(broken, tmp_path, monkeypatch, capsys):
    """`examples/trapo.py --model_name_or_path <corrupted folder>`: `trapo.py: error: ...`, exit status 2, no traceback
    (it was a `SafetensorError` traceback from inside transformers, after the data had loaded)."""
    folder, needle = broken
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAPO_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["examples/trapo.py"])
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    argv = ["--model_name_or_path", str(folder), "--dataset_name", str(data), "--reward_funcs", "numeric_answer"]
    status = cli.run([*argv, "--output_dir", str(tmp_path / "out"), "--report_to", "none"])
    output = capsys.readouterr()
    assert status == 2 and "Traceback" not in output.err
    assert f"trapo.py: error: --model_name_or_path={str(folder)!r}: " in output.err and needle in output.err


def loaded(*args, **kwargs):
    raise AssertionError("loaded before the check that refuses it")


def test_a_model_folder_without_tokenizer_files_says_so(saved_model, tmp_path, monkeypatch):
    """It was transformers' "Couldn't instantiate the backend tokenizer ... install sentencepiece", naming neither the
    flag nor the folder; now it is said with the model flags' checks, before any data or model loads. The reward
    model's tokenizer is loaded from its folder too (the critic needs none of its own)."""
    folder = tmp_path / "no_tokenizer"
    shutil.copytree(saved_model, folder, ignore=shutil.ignore_patterns("tokenizer*", "chat_template*"))
    monkeypatch.setattr(cli, "load_rl_data", loaded)  # the data would load after the checks
    with pytest.raises(
        ValueError, match=re.escape(f"--model_name_or_path={str(folder)!r}: ") + ".*no tokenizer files.*tokenizer.json"
    ):
        build(tmp_path, model_args=ModelConfig(model_name_or_path=str(folder)), dataset_name=str(tmp_path))
    reward = tmp_path / "no_tokenizer_reward"
    shutil.copytree(folder, reward)
    config = json.loads((reward / "config.json").read_text())
    (reward / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(
        ValueError, match=re.escape(f"--reward_model_name_or_path={str(reward)!r}: ") + ".*no tokenizer files"
    ):
        build(tmp_path, reward_model_name_or_path=str(reward))


def test_the_trainer_names_a_model_folder_without_tokenizer_files_before_loading_it(
    saved_model, tmp_path, monkeypatch
):
    """Trial 11's N15: `TRAPOTrainer(model="<folder without tokenizer files>")` and no `processing_class` was
    transformers' raw "Couldn't instantiate the backend tokenizer ... install sentencepiece" after the model loaded; a
    reward model folder without them the same, from `load_reward_funcs`."""
    from trl_trapo import TRAPOConfig, TRAPOTrainer, assembly
    from trl_trapo.rewards import exact_match_reward, load_reward_funcs
    from trl_trapo.tasks import make_task_suite

    folder = tmp_path / "no_tokenizer"
    shutil.copytree(saved_model, folder, ignore=shutil.ignore_patterns("tokenizer*", "chat_template*"))
    monkeypatch.setattr(assembly, "load_policy", loaded)  # refused before the model loads
    suite = make_task_suite(seed=0)
    args = TRAPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, report_to="none")
    with pytest.raises(ValueError) as raised:
        TRAPOTrainer(model=str(folder), reward_funcs=exact_match_reward, args=args, train_dataset=suite.rl_train)
    message = str(raised.value)
    assert message.startswith(f"model={str(folder)!r}: the directory {folder} has no tokenizer files"), message
    assert "tokenizer.json" in message and "processing_class=" in message and "save_pretrained(" in message
    reward = tmp_path / "no_tokenizer_reward"
    shutil.copytree(folder, reward)
    config = json.loads((reward / "config.json").read_text())
    (reward / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(ValueError, match=re.escape(f"reward_funcs={str(reward)!r}: ") + ".*reward_processing_classes"):
        load_reward_funcs([str(reward)], None, None, build_char_tokenizer())


def test_a_tokenizer_folder_is_judged_by_what_transformers_reads(saved_model, tmp_path):
    """What transformers can load passes (a lone `tokenizer.json`, a GPT-2 `vocab.json` + `merges.txt`, a sentencepiece
    `tokenizer.model`, a byte-level class with no files); a folder with none of the files its tokenizer class reads is
    named with those files."""
    from transformers import AutoTokenizer

    def folder(name: str, files: dict[str, str], model_type: str = "llama") -> str:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"model_type": model_type}))
        for file, text in files.items():
            (path / file).write_text(text)
        return str(path)

    only_fast = tmp_path / "only_tokenizer_json"
    only_fast.mkdir()
    shutil.copy(saved_model / "tokenizer.json", only_fast / "tokenizer.json")
    shutil.copy(saved_model / "config.json", only_fast / "config.json")
    assert paths.tokenizer_directory_problem(str(only_fast)) is None
    assert AutoTokenizer.from_pretrained(str(only_fast)).vocab_size == build_char_tokenizer().vocab_size
    assert paths.tokenizer_directory_problem(folder("gpt2", {"vocab.json": "{}", "merges.txt": ""}, "gpt2")) is None
    assert paths.tokenizer_directory_problem(folder("spm", {"tokenizer.model": ""})) is None
    byte_level = {"tokenizer_config.json": json.dumps({"tokenizer_class": "ByT5Tokenizer"})}
    assert paths.tokenizer_directory_problem(folder("byt5", byte_level, "t5")) is None
    gpt2 = folder("gpt2_config_only", {"tokenizer_config.json": "{}"}, "gpt2")
    problem = paths.tokenizer_directory_problem(gpt2)
    assert problem and "GPT2Tokenizer reads tokenizer.json or merges.txt + vocab.json" in problem, problem
    assert "tokenizer_config.json is missing" not in problem
    with pytest.raises(ValueError, match=re.escape(f"--x={gpt2!r}: the directory {gpt2} has no tokenizer files")):
        paths.check_tokenizer_source(gpt2, "--x", "Fix: something")
    paths.check_tokenizer_source(str(tmp_path / "missing"), "--x", "Fix: something")  # check_model_source's to say


# ---------------------------------------------------------------------------------------------------------------------
# A Hub-shaped name that is no local path: the Hub is asked once, or not at all
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache (hub and datasets), online mode (the test suite sets HF_HUB_OFFLINE=1)."""
    from datasets import config as datasets_config
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets_config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def unreachable(*args, **kwargs):
    """What huggingface_hub's HTTP client raises when the Hub's name does not resolve (it uses httpx2 from
    huggingface_hub 2, httpx before)."""
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx
    raise httpx.ConnectError("[Errno -2] Name or service not known")


@pytest.mark.parametrize(
    "repo_type, check", [("model", paths.check_model_source), ("dataset", paths.check_data_source)]
)
def test_a_missing_folder_shaped_like_a_hub_id_fails_at_once_without_a_network(
    empty_cache, monkeypatch, repo_type, check
):
    """`models/nope` (a mistyped local folder, and a valid Hub id): transformers retried the Hub for 52 s (datasets
    24 s) without a network. Now one request, and the message names both readings."""
    from huggingface_hub import HfApi

    calls = []
    monkeypatch.setattr(HfApi, f"{repo_type}_info", lambda self, *a, **k: calls.append(a) or unreachable())
    start = time.perf_counter()
    with pytest.raises(ValueError) as raised:
        check("models/nope", "--flag")
    assert time.perf_counter() - start < 5 and len(calls) == 1
    message = str(raised.value)
    assert message.startswith("--flag='models/nope': no local ") and str(empty_cache / "models" / "nope") in message
    assert "the Hub cannot be reached" in message and "HF_HUB_OFFLINE=1" in message


@pytest.mark.parametrize(
    "repo_type, check", [("model", paths.check_model_source), ("dataset", paths.check_data_source)]
)
def test_a_hub_id_that_does_not_exist_or_is_offline_is_named_with_both_readings(
    empty_cache, monkeypatch, repo_type, check
):
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError

    def not_found(self, *args, **kwargs):
        error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its constructor wants an HTTP response
        Exception.__init__(error, "404 Client Error: Repository Not Found")
        raise error

    monkeypatch.setattr(HfApi, f"{repo_type}_info", not_found)
    with pytest.raises(ValueError, match=f"no local .*and the Hub has no {repo_type} repository 'owner/nope'"):
        check("owner/nope", "--flag")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # offline: the Hub is not asked
    monkeypatch.setattr(HfApi, f"{repo_type}_info", lambda *a, **k: pytest.fail("asked the Hub in offline mode"))
    with pytest.raises(ValueError, match=r"no local .*not in the Hugging Face cache while offline mode is on"):
        check("owner/nope", "--flag")


@pytest.mark.parametrize(
    "repo_type, check", [("model", paths.check_model_source), ("dataset", paths.check_data_source)]
)
def test_a_hub_id_that_exists_or_is_cached_passes(empty_cache, monkeypatch, repo_type, check):
    """A real Hub id stays legitimate: it passes when the Hub has it, and offline when the cache has it."""
    from huggingface_hub import HfApi, constants

    monkeypatch.setattr(HfApi, f"{repo_type}_info", lambda self, repo_id, **k: {"id": repo_id})
    check("Qwen/Qwen2.5-0.5B", "--flag")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(HfApi, f"{repo_type}_info", lambda *a, **k: pytest.fail("asked the Hub for a cached repo"))
    (empty_cache / "hub" / f"{repo_type}s--Qwen--Qwen2.5-0.5B").mkdir(parents=True)
    check("Qwen/Qwen2.5-0.5B", "--flag")
