# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Model and dataset arguments as the user gives them (a Hub id or a local path): checks that fail early, naming the
argument, before anything is loaded.

The command line (`cli.py`) checks every path it is given with these; the trainer and the reward loader check a model
given by name (`TRAPOTrainer(model="...")`, a reward model id in `reward_funcs`) with `check_model_source`, so a
missing local folder is named the same way everywhere. Nothing here imports the rest of the package.

What is checked, cheaply (nothing is loaded: a few small JSON files and the headers of the `.safetensors` files):

- a local model directory: `config.json` is a JSON object with a `model_type` (or `adapter_config.json` is a JSON
  object), there is a weights file, and every `.safetensors` file has a readable header (a corrupted or truncated
  file is named here, not as a `SafetensorError` from inside transformers);
- a local directory the tokenizer is to be loaded from (`check_tokenizer_source`): it holds a file transformers'
  tokenizer class for it reads (`tokenizer.json`, or the class's vocabulary files);
- a value that is not a local path (`owner/name`, `name`): the Hub is asked only when the Hugging Face cache has no
  copy of it. With `HF_HUB_OFFLINE=1`, or when the Hub cannot be reached (one request, `HUB_PROBE_TIMEOUT_S`) or has no
  such repository, the error comes at once and names both readings (the local folder that does not exist and the Hub
  id), instead of after a minute of transformers' / datasets' retries (`models/nope` is a Hub-shaped id too).
"""

from __future__ import annotations

import json
import os


# the `datasets` builder that reads a local data file, by extension
FILE_BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "txt": "text"}
# file endings of model weights `from_pretrained` reads (`training_args.bin` is the Trainer's arguments, not weights)
WEIGHT_ENDINGS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".safetensors.index.json", ".bin.index.json")
HUB_PROBE_TIMEOUT_S = 10.0  # the one request that asks the Hub whether a repository exists (see `check_hub_source`)


def looks_like_path(name: str) -> bool:
    """Whether a dataset or model argument can only be a local path.

    Args:
        name: the argument's value.

    Returns:
        True for absolute paths, `./`, `../` and `~` prefixes, two or more `/`, backslashes and data-file extensions;
        False for what may be a Hub id (`name` or `owner/name`).
    """
    return (
        os.path.isabs(name)
        or name.startswith(("./", "../", "~", ".\\", "..\\"))
        or name in (".", "..")
        or name.count("/") >= 2
        or "\\" in name
        or ("." in name and name.rsplit(".", 1)[-1].lower() in FILE_BUILDERS)
    )


def check_data_source(name: str, arg: str) -> None:
    """Fail early, naming `arg`, when a dataset argument is a local path that does not exist (no loading).

    Args:
        name: a Hub dataset id, a local file or a directory.
        arg: the argument that gave it, e.g. `"--dataset_name"`.

    Raises:
        ValueError: if `name` can only be a local path (see `looks_like_path`) and nothing exists there; or, when
            nothing exists there, as `check_hub_source` (offline or unreachable with no cached copy, no such repo).
    """
    path = os.path.expanduser(name)
    if os.path.exists(path):
        return
    if looks_like_path(name):
        raise ValueError(
            f"{arg}={name!r}: no such file or directory ({os.path.abspath(path)}). Fix: correct the path (a .jsonl/"
            ".json/.csv/.parquet/.txt file or a directory), or give a Hub dataset id (`owner/name`)."
        )
    check_hub_source(name, arg, "dataset")


def check_model_source(value: str, arg: str) -> None:
    """Fail early, naming `arg`, when `value` is meant as a local model directory but is not one, or as a Hub id that
    cannot be fetched (nothing is loaded: see the module docstring for what is read).

    Args:
        value: a Hub model id or a local model directory.
        arg: the argument that gave it, e.g. `"--model_name_or_path"`.

    Raises:
        ValueError: if `value` is empty, a file, a directory that is not a saved model (see `model_directory_problem`),
            a path-like value (see `looks_like_path`) that does not exist, or a Hub id that cannot be fetched (see
            `check_hub_source`).
    """
    path = os.path.expanduser(value)
    if not value.strip():
        raise ValueError(f"{arg}={value!r}: empty. Fix: give a Hub model id or a local model directory.")
    if os.path.isdir(path):
        problem = model_directory_problem(path)
        if problem:
            raise ValueError(f"{arg}={value!r}: {problem}")
    elif os.path.exists(path):
        raise ValueError(
            f"{arg}={value!r}: a file, not a model directory. Fix: point at a `save_pretrained` directory."
        )
    elif looks_like_path(value):
        raise ValueError(
            f"{arg}={value!r}: no such directory ({os.path.abspath(path)}). Fix: correct the path, or give a Hub "
            "model id (`owner/name`)."
        )
    else:
        check_hub_source(value, arg, "model")


SAVE_FIX = "Fix: point at a directory written by `save_pretrained` (or `python scripts/save_tiny_model.py`)."


def byte_order_mark_problem(error: json.JSONDecodeError, reader: str) -> str | None:
    """What is wrong with a JSON file that Python's `json` refused for its UTF-8 byte-order mark (BOM), for a file
    that `reader` (e.g. "transformers") reads with `json` too, so that it must be saved without one; None for any
    other JSON error.

    Returns:
        A clause to follow the file's name, with the fix, e.g. "starts with a UTF-8 byte-order mark (BOM), which
        transformers cannot read: ...".
    """
    if not error.msg.startswith("Unexpected UTF-8 BOM"):
        return None
    return (
        f"starts with a UTF-8 byte-order mark (BOM), which {reader} cannot read: save it as plain UTF-8, not "
        "'UTF-8 with BOM' (the editor's encoding setting)"
    )


def read_json_object(path: str) -> tuple[dict | None, str | None]:
    """The JSON object in the file `path`, or why there is none.

    Returns:
        `(mapping, None)`, or `(None, what is wrong)`: a UTF-8 byte-order mark (transformers' `json` refuses it too),
        not valid JSON (with the line and column), or not an object.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except json.JSONDecodeError as error:
        bom = byte_order_mark_problem(error, "transformers")
        if bom:
            return None, bom
        return None, f"is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
    except (OSError, UnicodeDecodeError) as error:
        return None, f"cannot be read ({type(error).__name__}: {error})"
    if not isinstance(content, dict):
        return None, f"holds a JSON {type(content).__name__}, not an object"
    return content, None


def model_directory_problem(path: str) -> str | None:
    """What makes the local directory `path` not a loadable saved model, or None; cheap (no weights are read).

    Checked: `config.json` (or a PEFT adapter's `adapter_config.json`) is a JSON object, `config.json` has the
    `model_type` transformers needs to pick the model class; a full model has a weights file (`WEIGHT_ENDINGS`); the
    header of every `.safetensors` file (a few bytes each) reads, so a corrupted or truncated file is named here.

    Args:
        path: an existing directory.

    Returns:
        The problem and its fix, as a sentence naming the file; None when the directory looks loadable.
    """
    names = set(os.listdir(path))
    if "config.json" not in names and "adapter_config.json" not in names:
        return f"the directory has no config.json, so it is not a saved model. {SAVE_FIX}"
    if "config.json" in names:
        config, problem = read_json_object(os.path.join(path, "config.json"))
        if problem:
            return f"{os.path.join(path, 'config.json')} {problem}. {SAVE_FIX}"
        if "model_type" not in config:
            shown = ", ".join(sorted(config)[:8]) or "none"
            return (
                f"{os.path.join(path, 'config.json')} has no `model_type` (its keys: {shown}), so it is not a "
                f"transformers model config. {SAVE_FIX}"
            )
    else:
        adapter, problem = read_json_object(os.path.join(path, "adapter_config.json"))
        if problem:
            return f"{os.path.join(path, 'adapter_config.json')} {problem}. {SAVE_FIX}"
    weights = sorted(
        name
        for name in names
        if name.endswith(WEIGHT_ENDINGS) and name != "training_args.bin" and not name.startswith(".")
    )
    if not weights:
        return (
            "the directory has a config but no weights file (model.safetensors, pytorch_model.bin, ...). Fix: point "
            "at a complete `save_pretrained` directory (a copy may have been interrupted)."
        )
    for name in weights:
        if name.endswith(".safetensors"):
            problem = safetensors_problem(os.path.join(path, name))
        elif name.endswith(".index.json"):
            problem = weight_index_problem(path, name)
        else:
            problem = None
        if problem:
            return problem
    return None


def tokenizer_directory_problem(path: str) -> str | None:
    """What keeps `AutoTokenizer.from_pretrained(path)` from finding a tokenizer in the local directory `path`, or None;
    cheap (the file names and `tokenizer_config.json` / `config.json` are read, no tokenizer is built).

    transformers is asked which files it would read: the tokenizer class is the one `tokenizer_config.json` names, else
    the one transformers registers for `config.json`'s `model_type` (`TOKENIZER_MAPPING_NAMES`), else its default
    (`TokenizersBackend`); that class's `vocab_files_names` (e.g. `tokenizer.model`, `vocab.json` + `merges.txt`) and
    `tokenizer.json` are what it can load from. A directory holding any of them passes (transformers decides the
    rest: a sentencepiece `tokenizer.model` without sentencepiece installed is its own error); so does one whose
    class needs no file (a byte-level tokenizer) or is custom code (`auto_map`), or whose named class transformers
    does not know.

    Args:
        path: an existing directory.

    Returns:
        The problem, as a clause naming the directory and the files missing (no fix: the caller knows which applies);
        None when transformers can try to load a tokenizer from it.
    """
    names = set(os.listdir(path))
    if "tokenizer.json" in names:
        return None
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    tokenizer_config, _ = (
        read_json_object(os.path.join(path, "tokenizer_config.json"))
        if "tokenizer_config.json" in names
        else (None, None)
    )
    if tokenizer_config is not None and tokenizer_config.get("auto_map"):
        return None  # the repository's own tokenizer code decides what it reads
    class_name = (tokenizer_config or {}).get("tokenizer_class")
    if not class_name and "config.json" in names:
        config, _ = read_json_object(os.path.join(path, "config.json"))
        class_name = TOKENIZER_MAPPING_NAMES.get((config or {}).get("model_type"))
    tokenizer_class = tokenizer_class_from_name(class_name or "TokenizersBackend")
    if tokenizer_class is None:
        return None  # a class this transformers does not know: its own error names it
    files = sorted(set(tokenizer_class.vocab_files_names.values()) - {"tokenizer.json"})
    if not tokenizer_class.vocab_files_names or any(name in names for name in files):
        return None
    wanted = " or ".join(["tokenizer.json", " + ".join(files)] if files else ["tokenizer.json"])
    return (
        f"the directory {path} has no tokenizer files, so the tokenizer cannot be loaded from it (transformers' "
        f"{tokenizer_class.__name__} reads {wanted}"
        + ("" if "tokenizer_config.json" in names else "; tokenizer_config.json is missing too")
        + ")"
    )


def check_tokenizer_source(value: str, arg: str, fix: str) -> None:
    """Fail early, naming `arg`, when the tokenizer is to be loaded from `value` and `value` is a local directory
    without tokenizer files (see `tokenizer_directory_problem`; a Hub id or a missing path is left to
    `check_model_source`).

    Args:
        value: a Hub model id or a local model directory the tokenizer would be loaded from.
        arg: the argument that gave it, e.g. `"model"` or `"--model_name_or_path"`.
        fix: what the caller's user can do instead, as a sentence starting with "Fix: " (e.g. pass
            `processing_class=`); "save the tokenizer into the directory" is always added.

    Raises:
        ValueError: naming `arg`, `value`, the files missing and the fixes.
    """
    path = os.path.expanduser(value)
    if not os.path.isdir(path):
        return
    problem = tokenizer_directory_problem(path)
    if problem:
        raise ValueError(
            f"{arg}={value!r}: {problem}. {fix.rstrip('.')}, or save the tokenizer into the directory "
            f"(`tokenizer.save_pretrained({value!r})`)."
        )


def safetensors_problem(file: str) -> str | None:
    """Why the `.safetensors` file `file` cannot be loaded (its header is unreadable, or the file is shorter than the
    header says), or None. Reads the header only."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt"):
            return None
    except (SafetensorError, OSError) as error:
        return (
            f"{file} is not a readable safetensors file ({error}); it is corrupted or was cut short. Fix: save or "
            "copy the model again (`save_pretrained`), or point at another checkpoint."
        )


def weight_index_problem(path: str, name: str) -> str | None:
    """Why the sharded-weights index `name` in `path` cannot be used (not JSON, no `weight_map`, a shard it names is
    missing), or None."""
    index, problem = read_json_object(os.path.join(path, name))
    if problem is None and not isinstance(index.get("weight_map"), dict):
        problem = "has no `weight_map`"
    if problem:
        return f"{os.path.join(path, name)} {problem}. Fix: save or copy the model again (`save_pretrained`)."
    missing = sorted(
        {shard for shard in index["weight_map"].values() if not os.path.isfile(os.path.join(path, shard))}
    )
    if missing:
        return (
            f"{os.path.join(path, name)} names weight files that are not in the directory: {', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}. Fix: copy every shard, or save the model again."
        )
    return None


def check_hub_source(value: str, arg: str, repo_type: str = "model") -> None:
    """Fail at once, naming both readings of `value`, when it is no local path and cannot be fetched from the Hub.

    A missing local folder of the form `a/b` (`models/nope`) is also a valid Hub id: transformers and datasets try
    the Hub, and without a network they retry for about a minute before failing. The Hub is not asked when the Hugging
    Face cache has a copy of the repository (a cached model works offline). Otherwise, with `HF_HUB_OFFLINE=1` the id
    cannot be fetched, and online one request (`HUB_PROBE_TIMEOUT_S`, no retries) says whether the Hub can be reached
    and has the repository; other answers (a gated repository, a server error) are left to the loader, which says
    more.

    Args:
        value: the argument's value, which does not exist as a local path.
        arg: the argument that gave it, e.g. `"--model_name_or_path"`.
        repo_type: `"model"` or `"dataset"`.

    Raises:
        ValueError: naming `arg`, the local path that does not exist and the Hub id, when offline with no cached copy,
            when the Hub cannot be reached, or when it has no such repository (or it is private: log in).
    """
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HFValidationError, OfflineModeIsEnabled, RepositoryNotFoundError
    from huggingface_hub.file_download import repo_folder_name

    try:
        cached = os.path.isdir(
            os.path.join(constants.HF_HUB_CACHE, repo_folder_name(repo_id=value, repo_type=repo_type))
        )
    except HFValidationError as error:
        raise ValueError(
            f"{arg}={value!r}: no such local {'path' if repo_type == 'dataset' else 'directory'} "
            f"({os.path.abspath(value)}), and not a valid Hub id ({error}). Fix: correct the path or the id."
        ) from None
    if repo_type == "dataset" and not cached:  # `datasets` keeps its own cache of prepared datasets too
        from datasets import config as datasets_config

        cached = os.path.isdir(os.path.join(datasets_config.HF_DATASETS_CACHE, value.replace("/", "___")))
    if cached:
        return
    local = f"no local {'file or directory' if repo_type == 'dataset' else 'directory'} {os.path.abspath(value)}"
    fix = (
        f"Fix: correct the path if you meant a local {'dataset' if repo_type == 'dataset' else 'folder'}; for the Hub "
        f"id {value!r}, "
    )
    offline = constants.HF_HUB_OFFLINE or (
        repo_type == "dataset" and os.environ.get("HF_DATASETS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    )
    if offline:
        raise ValueError(
            f"{arg}={value!r}: {local}, and as a Hub id it is not in the Hugging Face cache while offline mode is on "
            f"(HF_HUB_OFFLINE=1). {fix}unset HF_HUB_OFFLINE on a machine with network, or download it there first."
        )
    api = HfApi()
    try:
        info = api.model_info if repo_type == "model" else api.dataset_info
        info(value, timeout=HUB_PROBE_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise ValueError(
            f"{arg}={value!r}: {local}, and the Hub has no {repo_type} repository {value!r} (or it is private and you "
            f"are not logged in). {fix}check its spelling, or log in (`hf auth login`)."
        ) from None
    except (OfflineModeIsEnabled, OSError) as error:  # requests' / httpx's connection errors are OSErrors
        raise ValueError(
            f"{arg}={value!r}: {local}, and the Hub cannot be reached to fetch it as a Hub id "
            f"({type(error).__name__}: {error}). {fix}connect to the network, or set HF_HUB_OFFLINE=1 to use a cached "
            "copy."
        ) from None
    except Exception as error:  # a gated repository, a server error, a timeout: the loader says more
        if is_connection_error(error):
            raise ValueError(
                f"{arg}={value!r}: {local}, and the Hub cannot be reached to fetch it as a Hub id "
                f"({type(error).__name__}: {error}). {fix}connect to the network, or set HF_HUB_OFFLINE=1 to use a "
                "cached copy."
            ) from None


def is_connection_error(error: BaseException) -> bool:
    """Whether `error` (from `huggingface_hub`'s HTTP client, `httpx` or `requests`) means the Hub could not be
    reached: a connection or timeout error, by its class or the classes it derives from."""
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(
        names & {"ConnectError", "ConnectTimeout", "TimeoutException", "ConnectionError", "NetworkError", "Timeout"}
    )


__all__ = [
    "FILE_BUILDERS",
    "check_data_source",
    "check_hub_source",
    "check_model_source",
    "check_tokenizer_source",
    "looks_like_path",
    "model_directory_problem",
    "tokenizer_directory_problem",
]
