# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Model and dataset arguments as the user gives them (a Hub id or a local path): checks that fail early, naming the
argument, before anything is loaded.

The command line (`cli.py`) checks every path it is given with these; the trainer and the reward loader check a model
given by name (`TRAPOTrainer(model="...")`, a reward model id in `reward_funcs`) with `check_model_source`, so a
missing local folder is named the same way everywhere. Nothing here imports the rest of the package.
"""

from __future__ import annotations

import os


# the `datasets` builder that reads a local data file, by extension
FILE_BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "txt": "text"}


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
        ValueError: if `name` can only be a local path (see `looks_like_path`) and nothing exists there.
    """
    path = os.path.expanduser(name)
    if not os.path.exists(path) and looks_like_path(name):
        raise ValueError(
            f"{arg}={name!r}: no such file or directory ({os.path.abspath(path)}). Fix: correct the path (a .jsonl/"
            ".json/.csv/.parquet/.txt file or a directory), or give a Hub dataset id (`owner/name`)."
        )


def check_model_source(value: str, arg: str) -> None:
    """Fail early, naming `arg`, when `value` is meant as a local model directory but is not one (no loading).

    Args:
        value: a Hub model id or a local model directory.
        arg: the argument that gave it, e.g. `"--model_name_or_path"`.

    Raises:
        ValueError: if `value` is empty, a file, a directory without `config.json` / `adapter_config.json`, or a
            path-like value (see `looks_like_path`) that does not exist.
    """
    path = os.path.expanduser(value)
    if not value.strip():
        raise ValueError(f"{arg}={value!r}: empty. Fix: give a Hub model id or a local model directory.")
    if os.path.isdir(path):
        if not any(os.path.isfile(os.path.join(path, f)) for f in ("config.json", "adapter_config.json")):
            raise ValueError(
                f"{arg}={value!r}: the directory has no config.json, so it is not a saved model. Fix: point at a "
                "directory written by `save_pretrained` (or `python scripts/save_tiny_model.py`)."
            )
    elif os.path.exists(path):
        raise ValueError(
            f"{arg}={value!r}: a file, not a model directory. Fix: point at a `save_pretrained` directory."
        )
    elif looks_like_path(value):
        raise ValueError(
            f"{arg}={value!r}: no such directory ({os.path.abspath(path)}). Fix: correct the path, or give a Hub "
            "model id (`owner/name`)."
        )


__all__ = ["FILE_BUILDERS", "check_data_source", "check_model_source", "looks_like_path"]
