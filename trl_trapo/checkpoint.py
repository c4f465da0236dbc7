# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Durable checkpoints of TRAPO's own state, next to the `Trainer`'s files in each `checkpoint-N` directory.

Layout of `checkpoint-N/trapo/` (one set of files per rank r):

| file | format | content |
|---|---|---|
| `rank{r}.json` | JSON | counters, pretraining stream, row allocator, DARE, replay bookkeeping, the memory pool's part (samplers, SFT pool, selector, self-imitation) |
| `rank{r}-tensors.safetensors[.zst]` | safetensors (zstd-compressed when large) | replay trajectories, RNG states |
| `rank{r}-sft_pool.safetensors` | safetensors | prioritised SFT pool: rows kept, priorities, sampling RNG; a sample selector's tensors (few-shot mode) — if any |
| `adapter_bank.json` | JSON | rank 0: the adapter bank's index (snapshots with their files' SHA-256), if any |
| `rank{r}.complete.json` | JSON | written last: the SHA-256 of every file of the checkpoint this rank relies on |

Every file is written to a temporary name and renamed into place, so a file is either absent or complete; the
completion marker is renamed last, so a checkpoint without markers for all ranks is incomplete and is never
resumed from silently. Nothing is pickled: JSON and safetensors only (the `Trainer`'s own files are its own).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import stat
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
import zstandard
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save


logger = logging.getLogger(__name__)


STATE_DIR = "trapo"
ZSTD_MAGIC = b"TRAPOZST1"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
EMPTY_CHECKPOINT = "an empty folder: a save stopped before writing anything"  # see `incomplete_reason`
# Files of the Trainer's checkpoint we also fingerprint, so a truncated one is named before resuming.
TRAINER_FILES = (
    "trainer_state.json",
    "model.safetensors",
    "adapter_model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
)


class CheckpointError(ValueError):
    """A checkpoint is incomplete or corrupted; the message names the file and what is wrong."""


def new_file_mode(path: str) -> int:
    """The permission bits `open(path, "w")` would give: the existing file's, else 0o666 less the umask (a temporary
    file from `tempfile.mkstemp` is 0o600, which would leave results unreadable to the group on a shared machine)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory, fsync'ed, then renamed; the file gets
    the permissions a plain write would ([`new_file_mode`])."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), new_file_mode(path))
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def atomic_write_json(path: str, payload: Any) -> None:
    """`atomic_write_bytes` of a JSON document."""
    atomic_write_bytes(path, json.dumps(payload, indent=1, sort_keys=True).encode("utf-8"))


def encode_tensors(tensors: dict[str, torch.Tensor], compress: bool) -> bytes:
    """safetensors bytes of `tensors` (contiguous CPU copies), zstd-compressed behind a magic header if asked."""
    data = safetensors_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    if compress:
        return ZSTD_MAGIC + zstandard.ZstdCompressor(level=3).compress(data)
    return data


def decode_tensors(data: bytes, name: str) -> dict[str, torch.Tensor]:
    """Inverse of `encode_tensors`.

    Raises:
        CheckpointError: naming `name`, if the bytes are not a valid (compressed) safetensors payload.
    """
    try:
        if data.startswith(ZSTD_MAGIC):
            data = zstandard.ZstdDecompressor().decompress(data[len(ZSTD_MAGIC) :])
        return safetensors_load(data)
    except Exception as error:  # safetensors / zstd raise various types
        raise CheckpointError(f"{name} is corrupted or truncated ({type(error).__name__}: {error}).") from error


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def marker_path(checkpoint_dir: str, rank: int) -> str:
    return os.path.join(checkpoint_dir, STATE_DIR, f"rank{rank}.complete.json")


def write_rank_state(
    checkpoint_dir: str,
    rank: int,
    state: dict,
    tensors: dict[str, torch.Tensor],
    compress: bool,
    extra_files: dict[str, bytes] | None = None,
):
    """Write this rank's state files, then its completion marker (with the hashes of every file it relies on).

    Args:
        extra_files (`dict[str, bytes]`, *optional*): more files of this rank's state, by name inside `trapo/`
            (e.g. `rank0-sft_pool.safetensors`); written before the marker, which fingerprints them too.
    """
    directory = os.path.join(checkpoint_dir, STATE_DIR)
    json_path = os.path.join(directory, f"rank{rank}.json")
    tensor_path = os.path.join(directory, f"rank{rank}-tensors.safetensors" + (".zst" if compress else ""))
    atomic_write_json(json_path, state)
    atomic_write_bytes(tensor_path, encode_tensors(tensors, compress))
    paths = [json_path, tensor_path]
    for name, data in (extra_files or {}).items():
        paths.append(os.path.join(directory, name))
        atomic_write_bytes(paths[-1], data)
    files = {os.path.relpath(p, checkpoint_dir): sha256_file(p) for p in paths}
    # rank 0: the Trainer's shared files; every rank: the RNG state the Trainer wrote for it (several processes)
    for name in (*(TRAINER_FILES if rank == 0 else ()), f"rng_state_{rank}.pth"):
        path = os.path.join(checkpoint_dir, name)
        if os.path.isfile(path):
            files[name] = sha256_file(path)
    atomic_write_json(marker_path(checkpoint_dir, rank), {"files": files, "tensors": os.path.basename(tensor_path)})


RANK_FILE_RE = re.compile(r"^rank(\d+)[.-]")  # trapo/rank{r}.json, rank{r}-tensors..., rank{r}.complete.json
TRAINER_RNG_RE = re.compile(r"^rng_state_(\d+)\.pth$")  # transformers' per-process RNG file (several processes)


def checkpoint_processes(checkpoint_dir: str) -> int | None:
    """How many processes wrote `checkpoint_dir`: one more than the highest rank with a file of its own
    (`trapo/rank{r}.*`, or transformers' `rng_state_{r}.pth`, written before TRAPO's state). None when no rank
    wrote anything (nothing to tell from)."""
    ranks = [int(m.group(1)) for name in os.listdir(checkpoint_dir) if (m := TRAINER_RNG_RE.match(name))]
    state_dir = os.path.join(checkpoint_dir, STATE_DIR)
    ranks += [int(m.group(1)) for name in os.listdir(state_dir) if (m := RANK_FILE_RE.match(name))]
    return max(ranks) + 1 if ranks else None


def process_count_message(checkpoint_dir: str, written: int, world_size: int) -> str:
    """Why a checkpoint written by `written` processes cannot resume in a run of `world_size`, and the fix."""
    held = "trapo/rank0.*" if written == 1 else f"trapo/rank0.* ... rank{written - 1}.*"
    if written == 1:
        launch = "launch it as one process (`python script.py ...`, or `trapo train` without --num_processes)"
    else:
        launch = (
            f"launch it as the run that saved it was launched, with {written} processes (e.g. `accelerate launch "
            f"--multi_gpu --num_processes {written} ...` or `trapo train --multi_gpu --num_processes {written} ...` "
            "for DDP; docs/distributed.md)"
        )
    low, high = sorted((written, world_size))
    ranks = f"rank {low}" if high - low == 1 else f"ranks {low} to {high - 1}"
    loss = f"{ranks} would have no state" if written < world_size else f"the state of {ranks} would be dropped"
    return (
        f"{checkpoint_dir} was written by {written} process{'es' if written > 1 else ''} ({held}: each process's "
        f"replay buffer, random generators and data-shard position) and this run has {world_size}: a resumed run "
        f"needs the same number of processes ({loss}). Fix: {launch} to resume; or start a new run from its weights "
        f"(pass {checkpoint_dir} as the model, --model_name_or_path / `model=`, without resume_from_checkpoint)."
    )


def verify_checkpoint(checkpoint_dir: str | os.PathLike, world_size: int) -> None:
    """Check that every rank's marker exists and every file it lists is intact.

    Raises:
        CheckpointError: naming the missing directory, a number of processes other than the one that wrote it
            (both numbers, [`process_count_message`]), missing marker, missing file or file whose content changed,
            and the fix ([`damaged_checkpoint_fix`]).
    """
    checkpoint_dir = os.fspath(checkpoint_dir)  # a `pathlib.Path`: compared and shown as its text (trial 13's N31)
    if not os.path.isdir(checkpoint_dir):
        expanded = os.path.expanduser(checkpoint_dir)
        tilde = (
            f" `~` is not expanded in resume_from_checkpoint (as in transformers' Trainer, which expands it only in "
            f"output_dir): pass the full path, {expanded!r} (os.path.expanduser) in Python or $HOME/... on the "
            "command line."
            if expanded != checkpoint_dir
            else ""
        )
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} is not a directory.{tilde} Pass a `checkpoint-N` folder of a "
            "previous run's output_dir, or resume_from_checkpoint=True to take the newest complete one of output_dir."
        )
    if not os.path.basename(os.path.normpath(checkpoint_dir)).startswith("checkpoint-") and any(
        name.startswith("checkpoint-") for name in os.listdir(checkpoint_dir)
    ):
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} is an output directory, not a checkpoint: pass one of its "
            "`checkpoint-N` folders, or resume_from_checkpoint=True with output_dir set to it."
        )
    if not os.listdir(checkpoint_dir):  # not "not written by TRAPOTrainer ... pass it as the model": it has nothing
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} is an empty folder: a save stopped before writing anything "
            f"(the run was killed, or the disk was full), so there is nothing to resume. "
            + damaged_checkpoint_fix(checkpoint_dir)
        )
    if not os.path.isdir(os.path.join(checkpoint_dir, STATE_DIR)) and not os.path.isfile(
        os.path.join(checkpoint_dir, "trainer_state.json")
    ):  # the Trainer writes trainer_state.json, then TRAPO its state: neither is a save killed part-way
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} is incomplete: it has neither trainer_state.json nor a "
            f"{STATE_DIR}/ folder (a save stopped part-way, or it is not a checkpoint). "
            + damaged_checkpoint_fix(checkpoint_dir)
        )
    if not os.path.isdir(os.path.join(checkpoint_dir, STATE_DIR)):
        # transformers' files are there: a TRAPOTrainer whose StateCheckpointCallback was removed writes only them
        removed = (
            ", or a callback TRAPO needs (StateCheckpointCallback, which writes that folder) was removed from the "
            "trainer that wrote it (pop_callback / remove_callback; train() warns about it)"
            if os.path.isfile(os.path.join(checkpoint_dir, "trainer_state.json"))
            else ""
        )
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} has no {STATE_DIR}/ folder: it was not written by "
            f"TRAPOTrainer (e.g. a plain transformers Trainer's checkpoint), or the folder was not copied with it"
            f"{removed}. TRAPO resumes only its own checkpoints. Fix: to start from its weights, pass it as the model "
            "(--model_name_or_path / `model=`) and start without resume_from_checkpoint."
        )
    written = checkpoint_processes(checkpoint_dir)
    if written is not None and written != world_size:
        raise CheckpointError(process_count_message(checkpoint_dir, written, world_size))
    for rank in range(world_size):
        marker = marker_path(checkpoint_dir, rank)
        if not os.path.isfile(marker):
            raise CheckpointError(
                f"{checkpoint_dir} is incomplete: {os.path.relpath(marker, checkpoint_dir)} is missing (the run stopped "
                f"while writing it, or it was saved with another number of processes than {world_size}). "
                + damaged_checkpoint_fix(checkpoint_dir)
            )
        try:
            with open(marker, encoding="utf-8") as handle:
                listed = json.load(handle)["files"]
            if not isinstance(listed, dict):
                raise TypeError("'files' is not a mapping")
        except (ValueError, KeyError, TypeError) as error:  # ValueError: bad JSON or bytes that are not UTF-8
            raise CheckpointError(
                f"{marker} is corrupted ({error}). {damaged_checkpoint_fix(checkpoint_dir)}"
            ) from error
        for name, digest in listed.items():
            path = os.path.join(checkpoint_dir, name)
            if not os.path.isfile(path):
                raise CheckpointError(
                    f"{path} is missing from the checkpoint. {damaged_checkpoint_fix(checkpoint_dir, name)}"
                )
            if sha256_file(path) != digest:
                raise CheckpointError(
                    f"{path} is corrupted or truncated: its SHA-256 differs from the one recorded. "
                    + damaged_checkpoint_fix(checkpoint_dir, name)
                )


FIX_PREFIX = "Fix: "


def check_checkpoint_step(checkpoint_dir: str, max_steps: int) -> int:
    """Refuse a checkpoint at or past `max_steps`: the `Trainer` would train 0 steps and save the checkpoint as the
    final model. Made where the checkpoint is verified, before anything slow (not after a first evaluation).

    Args:
        checkpoint_dir (`str`): a `checkpoint-N` folder [`verify_checkpoint`] accepted.
        max_steps (`int`): the run's `max_steps` (<= 0: set by epochs, not compared).

    Returns:
        The checkpoint's `global_step` (its `trainer_state.json`).

    Raises:
        CheckpointError: naming both numbers and the fix.
    """
    with open(os.path.join(checkpoint_dir, "trainer_state.json"), encoding="utf-8") as handle:
        step = int(json.load(handle).get("global_step", 0))
    if 0 < max_steps <= step:
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir} is at step {step} and max_steps={max_steps}: nothing would be "
            f"trained, and the checkpoint would be saved as the final model. Raise max_steps above {step} to train "
            "on, or use the checkpoint as it is."
        )
    return step


def damaged_checkpoint_fix(checkpoint_dir: str, name: str | None = None) -> str:
    """What to do about a checkpoint [`verify_checkpoint`] refuses: resume from an earlier `checkpoint-N` of the same
    output_dir (named, when there is one), or start without resuming; when the damaged file (`name`, relative to the
    checkpoint) is not a weight file of a full-weights checkpoint, its weights can start a new run as its model. There is no resuming with a fresh
    optimizer: the `Trainer` loads `optimizer.pt` (and the rest) whenever it resumes."""
    parent = os.path.dirname(os.path.normpath(checkpoint_dir))
    match = CHECKPOINT_RE.match(os.path.basename(os.path.normpath(checkpoint_dir)))
    earlier = []
    if match and os.path.isdir(parent):
        step = int(match.group(1))
        earlier = sorted(
            (int(m.group(1)), n)
            for n in os.listdir(parent)
            if (m := CHECKPOINT_RE.match(n))
            and int(m.group(1)) < step
            and incomplete_reason(os.path.join(parent, n)) is None  # not one a save left half-written
        )
    resume = (
        f"resume from an earlier checkpoint (--resume_from_checkpoint {os.path.join(parent, earlier[-1][1])})"
        if earlier
        else "resume from an earlier checkpoint of the run if there is one"
    )
    fix = f"{FIX_PREFIX}{resume}, or start without --resume_from_checkpoint"
    full = os.path.isfile(os.path.join(checkpoint_dir, "model.safetensors"))
    if full and name is not None and not name.startswith((*FULL_FILES, *ADAPTER_FILES)):  # the weights are intact
        fix += (
            f"; its weights are intact, so a new run can start from them: pass {checkpoint_dir} as "
            "--model_name_or_path (`model=`; the optimizer, scheduler and TRAPO's state then start fresh)"
        )
    return fix + "."


ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")  # a PEFT policy's checkpoint: its adapter only
FULL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
DATASETS_FILE = "datasets.json"  # in `trapo/`: the datasets the run trained on (see `datasets_summary`)
# the model config fields that fix the shapes of the weights: a checkpoint whose config differs is another model
SHAPE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)


def datasets_summary(datasets: dict[str, Any]) -> dict[str, dict]:
    """What a checkpoint records of the datasets its run trained on, to refuse resuming with others: for each given
    dataset (by role, e.g. `train_dataset`), its columns and its number of rows (`None` for a streaming one)."""
    summary = {}
    for role, dataset in datasets.items():
        if dataset is None or not hasattr(dataset, "column_names"):
            continue
        rows = len(dataset) if hasattr(dataset, "__len__") else None
        summary[role] = {"columns": sorted(dataset.column_names or []), "rows": rows}
    return summary


def checkpoint_holds_adapter(checkpoint_dir: str) -> bool | None:
    """True when the checkpoint's weights are a PEFT adapter (`adapter_model.*`), False for full weights, None when it
    has neither (e.g. a DeepSpeed checkpoint, whose weights are in its own folder)."""
    names = set(os.listdir(checkpoint_dir))
    if names & set(ADAPTER_FILES):
        return True
    return False if names & set(FULL_FILES) else None


CRITIC_PREFIX = "value_model."  # a `PolicyAndValueWrapper`'s critic weights, beside its `policy.` ones (models.py)


def checkpoint_holds_critic(checkpoint_dir: str) -> bool | None:
    """True when the checkpoint's weights hold a PPO critic (`value_model.*` tensors: a run with a `value_model`
    saves its `PolicyAndValueWrapper`), False when they do not, None when no safetensors file or index says (a
    `.bin` or DeepSpeed checkpoint). Reads the safetensors header or index only, not the tensors."""
    from safetensors import safe_open

    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    single = os.path.join(checkpoint_dir, "model.safetensors")
    try:
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as handle:
                names = list(json.load(handle).get("weight_map", {}))
        elif os.path.isfile(single):
            with safe_open(single, framework="pt") as handle:
                names = list(handle.keys())
        else:
            return None
    except (OSError, ValueError, AttributeError):
        return None  # a damaged file: verify_checkpoint names it
    return any(name.startswith(CRITIC_PREFIX) for name in names)


def check_checkpoint_fits(
    checkpoint_dir: str,
    adapter: bool,
    datasets: dict[str, dict] | None = None,
    model: Any = None,
    rollout_state: bool | None = None,
    critic: bool | None = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """Refuse, before anything slow, a complete checkpoint (see `verify_checkpoint`) that the run cannot resume: its
    weights are a LoRA adapter and the run trains the full model, or the other way round; it is of another model
    (the config fields of `SHAPE_FIELDS` differ, for full weights; the adapter's type, rank or target modules, for an
    adapter); it was trained on other datasets (columns or number of rows differ from those `datasets_summary`
    recorded in it; a checkpoint written before that record is not compared); or its rollout source's state does not
    fit the run's source ([`check_checkpoint_rollouts`]). Without these checks each failed only in `train()`, after
    the initial evaluation, with transformers' `Can't find a checkpoint index` or TRAPO's state errors. Its weights
    hold a PPO critic and the run has no `value_model`, or the other way round ([`checkpoint_holds_critic`]): without
    this check the first failed in `train()` by building transformers' default-sized model from a folder without
    `config.json` (tens of GB), the second with torch's missing-keys error. An objective whose dataset is given is
    switched off or on (its weight 0 on one side, [`check_objectives_switched`]). It was written with another value
    of a setting that shapes TRAPO's state ([`check_checkpoint_settings`]).

    Args:
        checkpoint_dir (`str`): a `checkpoint-N` folder.
        adapter (`bool`): the run's policy is a PEFT model (a `peft_config`, `--use_peft`, or a `PeftModel`).
        datasets (`dict`, *optional*): this run's `datasets_summary`; None: not compared.
        model (*optional*): the run's policy, once built, to compare with the checkpoint's config; None: not compared.
        rollout_state (`bool`, *optional*): whether the run's rollout source keeps state in checkpoints (see
            [`check_checkpoint_rollouts`]); None: not compared.
        critic (`bool`, *optional*): the run trains a PPO critic (a `value_model`); None: not compared.
        settings (`dict`, *optional*): the run's settings that shape TRAPO's state ([`check_checkpoint_settings`]);
            None: not compared.

    Raises:
        CheckpointError: naming the checkpoint, what it holds, what the run has and the fix.
    """
    start_over = "or start without resume_from_checkpoint (--resume_from_checkpoint)"
    check_checkpoint_rollouts(checkpoint_dir, rollout_state)
    held = checkpoint_holds_adapter(checkpoint_dir)
    if held is True and not adapter:
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} holds a LoRA adapter (adapter_model.safetensors: it was "
            "trained with a peft_config / --use_peft), but this run trains the full model. Fix: pass the same "
            f"peft_config (--use_peft with the same --lora_* settings), {start_over}."
        )
    if held is False and adapter:
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} holds full model weights (model.safetensors: it was trained "
            "without a peft_config / --use_peft), but this run trains a LoRA adapter. Fix: drop peft_config "
            f"(--use_peft), {start_over}."
        )
    held_critic = checkpoint_holds_critic(checkpoint_dir) if critic is not None else None
    if held_critic is True and not critic:
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} holds a policy and a PPO critic (value_model.* weights: it "
            "was trained with a value_model, PPO with GAE), but this run has no value_model. Fix: pass the same "
            "value_model (`value_model=...`, --value_model_name_or_path) to resume it, "
            f"{start_over}."
        )
    if held_critic is False and critic:
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} holds a policy without a critic (it was trained without a "
            "value_model: group-relative advantages), but this run trains a value_model. Fix: drop value_model "
            f"(--value_model_name_or_path) to resume it, {start_over}."
        )
    if model is not None:
        problem = _model_mismatch(checkpoint_dir, held, model)
        if problem:
            raise CheckpointError(
                f"resume_from_checkpoint={checkpoint_dir!r} is of another model: {problem}. Fix: resume with the model "
                f"(--model_name_or_path) and LoRA settings that wrote it, {start_over}."
            )
    recorded = read_state_file(checkpoint_dir, DATASETS_FILE) if datasets is not None else None
    if recorded is not None and recorded != datasets:
        differences = []
        for role in sorted(set(recorded) | set(datasets)):
            before, now = recorded.get(role), datasets.get(role)
            if before != now:
                differences.append(f"{role}: {_described(before)} then, {_described(now)} now")
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} was trained on other datasets ({'; '.join(differences)}): "
            "its data samplers and pools are positions in those. Fix: resume with the same datasets, "
            f"{start_over}."
        )
    if settings is not None and datasets is not None:  # an objective switched off or on (its weight 0 on one side)
        check_objectives_switched(checkpoint_dir, settings, datasets)
    check_checkpoint_settings(checkpoint_dir, settings)


ROLLOUT_STATE_KEY = "rollout_source"  # in `trapo/rank{r}.json`: the rollout source's own state (rl_supply.RLSupply)


def check_checkpoint_rollouts(checkpoint_dir: str, rollout_state: bool | None) -> None:
    """Refuse a checkpoint whose rollout source's state does not fit the run's source, before anything slow (it was
    refused only in `train()`, after the CLI's initial evaluation, or not at all).

    A run with `async_rollouts=True` keeps its producer's rounds in flight in every checkpoint (the
    `rollout_source` entry of `trapo/rank0.json`) and cannot resume without them; the other built-in sources (the
    default one, a `rollout_func`, `tools` / `environment_factory`) keep no state, and resuming a checkpoint that
    holds some would drop those rounds without a word. A `rollout_source` of the user's checks what it restores
    itself (`RolloutSource.restore_checkpoint_state`).

    Args:
        checkpoint_dir (`str`): a `checkpoint-N` folder [`verify_checkpoint`] accepted.
        rollout_state (`bool`, *optional*): True: the run's source keeps state (`async_rollouts=True`); False: it
            keeps none (a built-in synchronous source); None: a source of the user's, not compared.

    Raises:
        CheckpointError: naming the checkpoint, what it holds, `async_rollouts` and the fix.
    """
    if rollout_state is None:
        return
    state = read_state_file(checkpoint_dir, "rank0.json")
    if state is None:  # not a TRAPO checkpoint: `verify_checkpoint` says so
        return
    held = state.get(ROLLOUT_STATE_KEY) is not None
    new_run = (
        f"or start a new run from its weights (pass {checkpoint_dir} as --model_name_or_path / `model=`, without "
        "resume_from_checkpoint)"
    )
    if rollout_state and not held:
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} was written by a run without asynchronous rollouts (its "
            f"{STATE_DIR}/rank0.json holds no producer's rounds in flight), but this run has async_rollouts=True. "
            f"Fix: drop async_rollouts (--async_rollouts) to resume this checkpoint, {new_run}."
        )
    if held and not rollout_state:
        raise CheckpointError(
            f"resume_from_checkpoint={checkpoint_dir!r} holds a rollout source's state (the asynchronous producer's "
            "rounds in flight: it was written by a run with async_rollouts=True, or with a rollout_source of its own "
            "that keeps state), but this run samples synchronously with a source that keeps none: the rounds would "
            f"be dropped. Fix: set async_rollouts=True (--async_rollouts) to resume this checkpoint, {new_run}."
        )


STATE_SETTINGS = {
    "sft_sampling": "the SFT pool's state is that sampling's: a uniform sampler's position, or a prioritised pool's "
    "rows and priorities",
    "weighting": "the weighting strategy's state is its own: DARE's factors, uncertainty's log-variances, ...; "
    "`weighting`, or `dare_mode` where it is None",
    "adapter_snapshot_steps": "the adapter bank's index (trapo/adapter_bank.json) is there only with "
    "adapter_snapshot_steps > 0 on a PEFT policy",
}
"""The settings that change the shape of TRAPO's state in a checkpoint (-> what it holds because of them), compared
by [`check_checkpoint_settings`]. The others that do are checked on their own: the number of processes
([`verify_checkpoint`]), `async_rollouts` ([`check_checkpoint_rollouts`]), the datasets, PEFT and a critic
([`check_checkpoint_fits`]). Those a resumed run may change are not here: a curriculum, replay buffer, KL controller,
exploration or self-imitation setting changes what the run does next, not what the checkpoint holds (self-imitation
turned off drops its successes, as asked)."""


WEIGHTING_DEFAULT_CHANGED = "The default weighting changed from 'dare' to 'static' in this release"
"""Said when a checkpoint written with DARE is resumed with static weights ([`check_checkpoint_settings`]): DARE was
the default (`dare_mode="dynamic"`) before the weighting benchmark (issue 42, docs/weighting_benchmark.md)."""


def checkpoint_state_settings(checkpoint_dir: str) -> dict[str, Any]:
    """The values of [`STATE_SETTINGS`] that wrote `checkpoint_dir`, read off what it holds (any checkpoint of this
    format, also one written before this check): `sft_sampling` "uniform" or "prioritized" (absent without SFT data),
    `weighting` the strategy's name (`weighting_name`: "dare", "static", ...), `adapter_snapshot_steps` whether it
    holds an adapter bank (a bool: the number itself is not kept). Empty for a checkpoint without `rank0.json`."""
    state = read_state_file(checkpoint_dir, "rank0.json")
    if not isinstance(state, dict):
        return {}
    found: dict[str, Any] = {}
    pool = (state.get("memory_pool") or {}).get("sft_pool", state.get("sft_pool"))  # the earlier layout: top level
    if isinstance(pool, dict):
        found["sft_sampling"] = "uniform" if "sampler" in pool else "prioritized"
    weighting = state.get("dare")  # the weighting strategy's state, whichever it is (`RunState.save`)
    strategy = weighting.get("strategy") if isinstance(weighting, dict) else None
    if isinstance(strategy, str):
        found["weighting"] = strategy
    found["adapter_snapshot_steps"] = os.path.isfile(os.path.join(checkpoint_dir, STATE_DIR, "adapter_bank.json"))
    return found


def check_checkpoint_settings(checkpoint_dir: str, settings: dict[str, Any] | None) -> None:
    """Refuse, before anything slow, a checkpoint written with another value of a setting that shapes TRAPO's state
    ([`STATE_SETTINGS`]): restoring it failed at `train()` with the state's own error, naming a file and a key
    (`rank0.json cannot be restored: KeyError: 'sampler'` for `sft_sampling="prioritized"` resumed with "uniform",
    trial 10's PY38; "Cannot load a 'dare' weighting state into StaticWeighting"). A checkpoint written with static
    weights resumed with an adaptive strategy is not refused: nothing was learnt, so the strategy starts from its
    initial state, as a fresh run of it does (`weighting.DARE.load_state_dict` warns).

    Args:
        checkpoint_dir (`str`): a `checkpoint-N` folder [`verify_checkpoint`] accepted.
        settings (`dict`, *optional*): the run's values, as [`checkpoint_state_settings`] reads the checkpoint's
            (`adapter_snapshot_steps`: True when the run keeps an adapter bank, None when not known before the
            `Trainer` exists, e.g. under DeepSpeed); a setting that is None, or that the checkpoint does not show, is
            not compared. None: nothing compared.

    Raises:
        CheckpointError: naming the checkpoint, each setting that differs with its value then and now, and the fix
            (resume with the checkpoint's values, or start a new run from its weights); for a checkpoint written with
            DARE resumed with static weights, also that the default changed from 'dare' to 'static'
            ([`WEIGHTING_DEFAULT_CHANGED`]) and `weighting="dare"` (`--weighting dare`) to continue as it was trained.
    """
    if settings is None:
        return
    then = checkpoint_state_settings(checkpoint_dir)
    differ = [
        name
        for name in STATE_SETTINGS
        if then.get(name) is not None
        and settings.get(name) is not None
        and then[name] != settings[name]
        and not (name == "adapter_snapshot_steps" and then[name])  # a bank the run no longer keeps: left on disk
        # a "static" state holds nothing learnt: an adaptive strategy resumed from it starts from its initial state
        # (`weighting.DARE.load_state_dict`, with a warning); it is also what every strategy keeps with at most one
        # objective that has data (`weighting.build_weighting`): an RL-only run with weighting="dare" writes it
        and not (name == "weighting" and then[name] == "static")
    ]
    if not differ:
        return
    described, fixes = [], []
    for name in differ:
        if name == "adapter_snapshot_steps":
            described.append(
                "the checkpoint holds no adapter bank (it was written with adapter_snapshot_steps=0 or without PEFT) "
                "and this run keeps one (adapter_snapshot_steps > 0 on a PEFT policy)"
            )
            fixes.append("adapter_snapshot_steps=0 (--adapter_snapshot_steps 0)")
            continue
        described.append(f"{name}={then[name]!r} when it was written, {settings[name]!r} now ({STATE_SETTINGS[name]})")
        fixes.append(f"{name}={then[name]!r} (--{name} {then[name]})")
        if name == "weighting" and (then[name], settings[name]) == ("dare", "static"):
            described[-1] += (
                f". {WEIGHTING_DEFAULT_CHANGED}: a run that did not set `weighting` (or `dare_mode`) trained with "
                "DARE then and asks for static weights now"
            )
            fixes[-1] += " to continue with DARE as it was trained"
            if checkpoint_static_weights(checkpoint_dir) is None:  # written before the release: the former weights
                fixes[-1] += (
                    ", with --sft_weight 1 --rl_weight 1 if it also had the former default weights (they changed "
                    "from 1 to 2 with it)"
                )
    raise CheckpointError(
        f"resume_from_checkpoint={checkpoint_dir!r} was written with other settings of what TRAPO's state holds: "
        f"{'; '.join(described)}. Its state cannot be restored into this run's. Fix: resume with the checkpoint's "
        f"value{'s' if len(fixes) > 1 else ''}, {' and '.join(fixes)}; or {new_run_fix(checkpoint_dir)}."
    )


def new_run_fix(checkpoint_dir: str) -> str:
    """The "start a new run from the checkpoint's weights" fix of a refused resume, true for the main job's built-in
    mode too: a model given (`--model_name_or_path`) leaves built-in mode, so such a run needs its own datasets (the
    built-in task suite is used only without a model, `trl_trapo.jobs.main`; trial 17's W09e)."""
    return (
        f"start a new run from its weights (pass {checkpoint_dir} as --model_name_or_path / `model=`, without "
        "resume_from_checkpoint, with your datasets: the built-in job, `trapo train` / examples/trapo.py, uses its "
        "task suite only when no model is given)"
    )


def check_objectives_switched(checkpoint_dir: str, settings: dict[str, Any], datasets: dict[str, dict]) -> None:
    """Refuse, before anything slow, resuming with an objective switched off (its weight 0 now, > 0 when the
    checkpoint was written) or on (0 then, > 0 now) while its dataset is given: an objective whose weight is 0 leaves
    its data out of the run (`data.prepare_datasets`), so its state (the SFT pool, the RL prompt sampler and supply,
    a pretraining stream's position) is in the checkpoint and not in the run, or the other way round. Without this
    check it failed in `train()`, after the initial evaluation, with "the checkpoint was made with a different set of
    datasets ('sft_pool' present)", naming neither the weight nor the fix (trial 17's W09c). Supporting the switch
    would mean building and restoring state for an objective that does not train (pool, sampler, supply, stream,
    allocator): not done.

    Args:
        checkpoint_dir (`str`): a `checkpoint-N` folder.
        settings (`dict`): the run's `state_settings`; its `objective_weights` (objective name -> (config field,
            dataset argument, static weight)) is compared; absent: nothing compared.
        datasets (`dict`): the run's `datasets_summary` (an objective whose dataset is not in it is not compared).

    Raises:
        CheckpointError: naming the checkpoint, each objective's weight field with its value then (the checkpoint's
            recorded `static_weights`; a checkpoint without that record is not compared) and now, and the fix.
    """
    weights, saved = settings.get("objective_weights"), checkpoint_static_weights(checkpoint_dir)
    if not weights or saved is None:
        return
    switched = [
        (name, field, saved[name], now)
        for name, (field, argument, now) in weights.items()
        if name in saved and argument in datasets and (saved[name] > 0) != (now > 0)
    ]
    if not switched:
        return
    described = "; ".join(
        f"{field}={then:g} when it was written, {now:g} now (objective '{name}' switched {'off' if now == 0 else 'on'})"
        for name, field, then, now in switched
    )
    fixes = " and ".join(
        f"{field} > 0 (--{field} {then:g} continues the checkpoint's mixture)"
        if then > 0
        else f"{field}=0 (--{field} 0)"
        for name, field, then, now in switched
    )
    raise CheckpointError(
        f"resume_from_checkpoint={checkpoint_dir!r} cannot be resumed with an objective switched off or on: "
        f"{described}. An objective with weight 0 leaves its dataset out of the run, so its state in the checkpoint "
        f"(data samplers, pools, stream positions) does not fit this run's. Fix: resume with {fixes}; or "
        f"{new_run_fix(checkpoint_dir)}."
    )


RESTORED_OPTIMIZER_SETTINGS = {
    "learning_rate": "the scheduler's base learning rate (scheduler.pt `base_lrs`)",
    "weight_decay": "the optimizer's parameter groups (optimizer.pt)",
    "adam_beta1": "the optimizer's parameter groups (optimizer.pt)",
    "adam_beta2": "the optimizer's parameter groups (optimizer.pt)",
    "adam_epsilon": "the optimizer's parameter groups (optimizer.pt)",
}
"""The `TrainingArguments` fields whose value a resumed run takes from the checkpoint, not from its arguments:
transformers' Trainer loads the optimizer's and the scheduler's state dicts, which hold them (-> where each is
read). The schedule's shape (`lr_scheduler_type`, `warmup_steps`, `max_steps`) is rebuilt from the arguments."""


def checkpoint_optimizer_settings(checkpoint_dir: str) -> dict[str, float]:
    """The values of [`RESTORED_OPTIMIZER_SETTINGS`] a checkpoint's `scheduler.pt` and `optimizer.pt` hold, read with
    `weights_only=True` (the optimizer's state tensors memory-mapped, not read).

    Args:
        checkpoint_dir (`str`): a `checkpoint-N` folder.

    Returns:
        Field name -> the checkpoint's value, for those found: `learning_rate` is the first parameter group's base
        rate, `weight_decay` the largest group's (the no-decay group has 0); empty for a checkpoint without those
        files (DeepSpeed and FSDP keep their own) or an optimizer without such settings (`betas`, `eps`).
    """
    found: dict[str, float] = {}
    try:
        scheduler = torch.load(os.path.join(checkpoint_dir, "scheduler.pt"), weights_only=True, map_location="cpu")
        found["learning_rate"] = float(scheduler["base_lrs"][0])
    except (OSError, KeyError, IndexError, TypeError, ValueError, RuntimeError):
        pass
    try:
        optimizer = torch.load(
            os.path.join(checkpoint_dir, "optimizer.pt"), weights_only=True, map_location="cpu", mmap=True
        )
        groups = optimizer["param_groups"]
        found.setdefault("learning_rate", float(groups[0]["initial_lr"]))
        found["weight_decay"] = max(float(g["weight_decay"]) for g in groups)
        found["adam_beta1"], found["adam_beta2"] = (float(b) for b in groups[0]["betas"])
        found["adam_epsilon"] = float(groups[0]["eps"])
    except (OSError, KeyError, IndexError, TypeError, ValueError, RuntimeError):
        pass
    return found


def holds_optimizer_state(checkpoint_dir: str) -> bool:
    """Whether the `Trainer` wrote optimizer or scheduler state into `checkpoint_dir`: `optimizer.pt` / `scheduler.pt`
    (or `optimizer.bin`), FSDP's `optimizer_*` folders, DeepSpeed's `global_step*` folders. A checkpoint written with
    `save_only_model=True` has none (transformers' `Trainer._save_checkpoint` skips them, and the RNG and grad
    scaler files)."""
    return any(name.startswith(("optimizer", "scheduler", "global_step")) for name in os.listdir(checkpoint_dir))


def warn_settings_restored(checkpoint_dir: str, args: Any, objectives: Sequence[Any] = ()) -> list[str]:
    """Warn, naming each field, when this run's arguments give an optimizer setting that resuming from
    `checkpoint_dir` replaces by the checkpoint's ([`RESTORED_OPTIMIZER_SETTINGS`]): transformers' Trainer restores
    the optimizer and scheduler states, so a new `--learning_rate` on resume trains at the checkpoint's rate without a
    word (its own check, `compare_trainer_and_checkpoint_args`, compares only batch size and step intervals). The
    behaviour is transformers'; the warning is TRAPO's.

    A checkpoint with no optimizer or scheduler state ([`holds_optimizer_state`]: written with `save_only_model=True`)
    restores nothing of them: transformers' Trainer resumes it without a word (its `_load_optimizer_and_scheduler`
    loads what exists), with fresh optimizer moments and the learning-rate schedule restarted from its first step
    (warmup included) at the checkpoint's global step. That is kept; one warning says so and names the fix.

    The objectives' static weights are compared with the checkpoint's too ([`warn_weights_changed`]).

    Args:
        checkpoint_dir (`str`): the checkpoint being resumed.
        args: the run's `TrainingArguments` (`TRAPOConfig`).
        objectives (`Sequence[Objective]`): the run's objectives (their `name`, `weight` and `WEIGHT_FIELD`); empty:
            their weights are not compared.

    Returns:
        The optimizer fields that differ (each warned once, in one message); empty when the checkpoint holds no
        optimizer state (then that is warned instead).
    """
    if objectives:
        warn_weights_changed(
            checkpoint_dir,
            {o.name: o.weight for o in objectives},
            {o.name: getattr(o, "WEIGHT_FIELD", None) for o in objectives},
        )
    if not holds_optimizer_state(checkpoint_dir):
        try:
            with open(os.path.join(checkpoint_dir, "trainer_state.json"), encoding="utf-8") as handle:
                step = json.load(handle).get("global_step")
        except (OSError, ValueError, AttributeError):
            step = "?"
        logger.warning(
            "resume_from_checkpoint=%r holds no optimizer or scheduler state (optimizer.pt, scheduler.pt): it was "
            "written with save_only_model=True. Resuming it, as transformers' Trainer does, restores the weights, the "
            "step and TRAPO's state, but the optimizer starts fresh (no Adam moments) and the learning-rate schedule "
            "restarts from its first step (warmup and decay from the beginning, at step %s), and the grad scaler is "
            "new. To keep them, resume from a checkpoint written without --save_only_model; to train on from these "
            "weights with a schedule of its own, start a new run with --model_name_or_path %s and without "
            "--resume_from_checkpoint.",
            checkpoint_dir,
            step,
            checkpoint_dir,
        )
        return []
    saved = checkpoint_optimizer_settings(checkpoint_dir)
    differ = [
        name
        for name, value in saved.items()
        if isinstance(getattr(args, name, None), (int, float))
        and not math.isclose(float(getattr(args, name)), value, rel_tol=1e-6, abs_tol=0.0)
    ]
    if differ:
        listed = "; ".join(f"{name}={getattr(args, name)!r} (the checkpoint's: {saved[name]!r})" for name in differ)
        logger.warning(
            "resume_from_checkpoint=%r: %s. Resuming restores the checkpoint's optimizer and scheduler, as "
            "transformers' Trainer does, so the checkpoint's value%s used, not this run's. To train with the new "
            "value%s, start a new run from the checkpoint's weights (--model_name_or_path %s, without "
            "--resume_from_checkpoint); to resume as it was, drop %s.",
            checkpoint_dir,
            listed,
            " is" if len(differ) == 1 else "s are",
            "" if len(differ) == 1 else "s",
            checkpoint_dir,
            ", ".join(f"--{name}" for name in differ),
        )
    return differ


FORMER_DEFAULT_WEIGHTS = {"sft_weight": (1.0, 2.0), "rl_weight": (1.0, 2.0)}
"""The config fields of static weights whose default changed with the weighting benchmark's decision (issue 42,
docs/weighting_benchmark.md): field -> (the former default, the default since)."""


def checkpoint_static_weights(checkpoint_dir: str) -> dict[str, float] | None:
    """Each objective's static weight (its multiplier: `pretrain_weight`, `sft_weight`, ... or an extra objective's
    `weight`) when `checkpoint_dir` was written, by objective name, as `trapo/rank0.json` records it; None for a
    checkpoint written before that record (or without TRAPO's state)."""
    state = read_state_file(checkpoint_dir, "rank0.json")
    weights = state.get("static_weights") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        return None
    return {str(k): float(v) for k, v in weights.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def warn_weights_changed(checkpoint_dir: str, weights: dict[str, float], fields: dict[str, str | None]) -> list[str]:
    """Warn when this run weighs its objectives otherwise than the run that wrote `checkpoint_dir` did. Resuming with
    other static weights is allowed (a mixture changed on purpose), but the default `sft_weight` and `rl_weight`
    changed from 1 to 2 in this release ([`FORMER_DEFAULT_WEIGHTS`]), so a run resumed with the defaults would change
    its mixture without a word.

    A checkpoint that records its weights ([`checkpoint_static_weights`]) is compared by the mixture they make: the
    weights are normalised (each over their sum, [`~trl_trapo.weighting.combine_weights`]), so the same ratios (2/4/4
    resumed on a 1/2/2 checkpoint) are the same mixture and not warned about; when the ratios differ, each objective
    whose weight differs is named with both values. Only objectives with a weight > 0 on both sides are compared
    (one switched off or on with its data is refused before, [`check_objectives_switched`]). One written before that
    record is warned about only when this run has the new default of `sft_weight` or
    `rl_weight` (it may have been trained with the former one; nothing tells which).

    Args:
        checkpoint_dir (`str`): the checkpoint being resumed.
        weights (`dict`): this run's static weight of each objective, by name (`Objective.weight`).
        fields (`dict`): the config field that sets each objective's weight, by name (`Objective.WEIGHT_FIELD`;
            None for an extra objective, weighted by its `weight=`).

    Returns:
        The names of the objectives warned about (in one message); empty when nothing was.
    """

    def flag(name: str, value: float) -> str:
        field = fields.get(name)
        return f"--{field} {value:g}" if field else f"weight={value:g} for objective '{name}'"

    def new_default(name: str, value: float) -> bool:  # the objective's weight is its field's new default
        field = fields.get(name)
        return field in FORMER_DEFAULT_WEIGHTS and math.isclose(value, FORMER_DEFAULT_WEIGHTS[field][1])

    saved = checkpoint_static_weights(checkpoint_dir)
    if saved is None:
        if read_state_file(checkpoint_dir, "rank0.json") is None:
            return []
        changed = [name for name, value in weights.items() if new_default(name, value)]
        if changed:
            logger.warning(
                "resume_from_checkpoint=%r was written before checkpoints recorded their objectives' static weights, "
                "and this run has %s: the defaults of %s changed from %s in this release (the weighting benchmark's "
                "searched mixture). If the checkpoint was trained with the former defaults, this run continues with "
                "another mixture; to continue with its own, pass %s.",
                checkpoint_dir,
                ", ".join(f"{fields[n]}={weights[n]:g}" for n in changed),
                " and ".join(fields[n] for n in changed),
                " and ".join("{:g} to {:g}".format(*FORMER_DEFAULT_WEIGHTS[fields[n]]) for n in changed),
                " ".join(flag(n, FORMER_DEFAULT_WEIGHTS[fields[n]][0]) for n in changed),
            )
        return changed
    # the mixture is each multiplier over their sum (`weighting.combine_weights`: w_o = c_o s_o f_o / sum_k ...), so
    # only the ratios count: compared over the objectives both runs weigh (> 0 on both sides; one switched off or on
    # with its dataset is refused before this, `check_objectives_switched`, and one without data weighs nothing)
    both = [name for name in weights if saved.get(name, 0.0) > 0 and weights[name] > 0]
    total_then, total_now = sum(saved[n] for n in both), sum(weights[n] for n in both)
    if all(math.isclose(weights[n] / total_now, saved[n] / total_then) for n in both):
        return []  # the same ratios (2/4/4 on a 1/2/2 checkpoint): the same mixture
    differ = [name for name in both if not math.isclose(weights[name], saved[name])]
    if differ:
        logger.warning(
            "resume_from_checkpoint=%r was trained with other static weights: %s. The run continues with this run's "
            "(a mixture changed on purpose is allowed)%s. To continue with the checkpoint's mixture, pass %s.",
            checkpoint_dir,
            "; ".join(f"'{n}' {saved[n]:g} then, {weights[n]:g} now" for n in differ),
            "; the defaults of sft_weight and rl_weight changed from 1 to 2 in this release"
            if any(new_default(n, weights[n]) for n in differ)
            else "",
            " and ".join(flag(n, saved[n]) for n in differ),
        )
    return differ


def _described(entry: dict | None) -> str:
    if entry is None:
        return "none"
    rows = "streaming" if entry["rows"] is None else f"{entry['rows']:,} rows"
    return f"{rows} ({', '.join(entry['columns'])})"


def _model_mismatch(checkpoint_dir: str, held: bool | None, model: Any) -> str | None:
    """How the checkpoint's model differs from `model`, or None (also when the checkpoint says too little)."""
    if held is False:
        path = os.path.join(checkpoint_dir, "config.json")
        try:
            with open(path, encoding="utf-8") as handle:
                saved = json.load(handle)
        except (OSError, ValueError):
            return None
        config = getattr(model, "config", None)
        config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
        saved = saved.get("text_config", saved) if "text_config" in saved and "hidden_size" not in saved else saved
        differing = [
            f"{name} {saved[name]!r} in its config.json, {getattr(config, name)!r} in this run's"
            for name in SHAPE_FIELDS
            if name in saved and config is not None and hasattr(config, name) and saved[name] != getattr(config, name)
        ]
        return "; ".join(differing) or None
    if held is True and getattr(model, "peft_config", None):
        path = os.path.join(checkpoint_dir, "adapter_config.json")
        try:
            with open(path, encoding="utf-8") as handle:
                saved = json.load(handle)
        except (OSError, ValueError):
            return None
        active = model.peft_config.get(getattr(model, "active_adapter", "default")) or next(
            iter(model.peft_config.values())
        )
        differing = []
        for name in ("peft_type", "r", "target_modules"):
            if name not in saved or not hasattr(active, name):
                continue
            now = getattr(active, name)
            now = getattr(now, "value", now)  # PeftType is an enum
            before = saved[name]
            if isinstance(now, (set, list, tuple)) and isinstance(before, (list, tuple)):
                now, before = sorted(now), sorted(before)
            if before != now:
                differing.append(f"{name} {before!r} in its adapter_config.json, {now!r} in this run's")
        return "; ".join(differing) or None
    return None


def read_rank_state(checkpoint_dir: str, rank: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """This rank's JSON state and tensors (call `verify_checkpoint` first).

    Raises:
        CheckpointError: naming the file, if it cannot be parsed.
    """
    directory = os.path.join(checkpoint_dir, STATE_DIR)
    with open(marker_path(checkpoint_dir, rank), encoding="utf-8") as handle:
        tensor_name = json.load(handle)["tensors"]
    json_path = os.path.join(directory, f"rank{rank}.json")
    try:
        with open(json_path, encoding="utf-8") as handle:
            state = json.load(handle)
    except ValueError as error:  # bad JSON, or bytes that are not UTF-8
        raise CheckpointError(f"{json_path} is corrupted ({error}).") from error
    tensor_path = os.path.join(directory, tensor_name)
    with open(tensor_path, "rb") as handle:
        tensors = decode_tensors(handle.read(), tensor_path)
    return state, tensors


def read_state_file(checkpoint_dir: str, name: str) -> dict | dict[str, torch.Tensor] | None:
    """An extra state file of `checkpoint-N/trapo/` (see `write_rank_state`): JSON for `.json` names, tensors for
    safetensors; None if the checkpoint has no such file (call `verify_checkpoint` first).

    Raises:
        CheckpointError: naming the file, if it cannot be parsed.
    """
    path = os.path.join(checkpoint_dir, STATE_DIR, name)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as handle:
        data = handle.read()
    if name.endswith(".json"):
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path} is corrupted ({error}).") from error
    return decode_tensors(data, path)


def checkpoint_entries(output_dir: str) -> list[tuple[int, str]]:
    """`(step, name)` of every `checkpoint-N` entry of `output_dir` (folder or not), by step; [] if it is missing."""
    if not os.path.isdir(output_dir):
        return []
    return sorted((int(m.group(1)), name) for name in os.listdir(output_dir) if (m := CHECKPOINT_RE.match(name)))


def last_complete_checkpoint(output_dir: str, world_size: int) -> tuple[str | None, list[str]]:
    """The highest-numbered `checkpoint-N` of `output_dir` that `verify_checkpoint` accepts, and why newer ones were not.

    Returns:
        tuple `(path or None, reasons)`: `reasons` lists, newest first, why each skipped checkpoint was rejected
        (typically a run killed while writing it).
    """
    if not os.path.isdir(output_dir):
        return None, []
    skipped = []
    for _, name in reversed(checkpoint_entries(output_dir)):
        path = os.path.join(output_dir, name)
        try:
            verify_checkpoint(path, world_size)
            return path, skipped
        except CheckpointError as error:  # the fix is this function's own search: the cause only
            skipped.append(str(error).split(" " + FIX_PREFIX)[0])
    return None, skipped


def incomplete_reason(path: str) -> str | None:
    """Why the entry `path` (a `checkpoint-N` of an output_dir) is not a complete TRAPO checkpoint, told from the
    names it holds, or None when it looks complete (`trainer_state.json` and `trapo/rank0.complete.json` are there).

    Cheap: no file is read or hashed (unlike [`verify_checkpoint`], which a resume runs on the one it resumes), so it
    can sort every entry of an output_dir before anything slow.

    Returns:
        `str` or None: one phrase, e.g. "a file, not a folder", "an empty folder: a save stopped before writing
        anything", "no trainer_state.json: a save stopped part-way".
    """
    if not os.path.isdir(path):
        return "a file, not a folder"
    names = os.listdir(path)
    if not names:
        return EMPTY_CHECKPOINT
    if "trainer_state.json" not in names:
        return "no trainer_state.json: a save stopped part-way"
    if STATE_DIR not in names:
        return (
            f"no {STATE_DIR}/ state: a save stopped part-way, or not written by TRAPOTrainer (or by one whose "
            "StateCheckpointCallback was removed)"
        )
    if not os.path.isfile(marker_path(path, 0)):
        return f"no {os.path.relpath(marker_path(path, 0), path)}: a save stopped part-way"
    return None


def newest_complete_checkpoint(output_dir: str, world_size: int) -> str:
    """The checkpoint `resume_from_checkpoint=True` resumes: the newest one of `output_dir` that
    [`verify_checkpoint`] accepts; each newer one skipped is warned about with its reason.

    Raises:
        CheckpointError: when there is none, with the first reason and the fixes that work: a checkpoint path, or
            starting without resuming (after deleting the partly written entries, which
            [`~trl_trapo.saving.check_earlier_checkpoints`] refuses to write over, or with overwrite_output_dir).
    """
    path, skipped = last_complete_checkpoint(output_dir, world_size)
    for reason in skipped:
        logger.warning("Not resuming from an incomplete checkpoint: %s", reason)
    if path is not None:
        return path
    names = [n for _, n in checkpoint_entries(output_dir)]
    kept = [n for n in names if incomplete_reason(os.path.join(output_dir, n)) != EMPTY_CHECKPOINT]  # hold something
    raise CheckpointError(
        f"resume_from_checkpoint=True, but {output_dir} holds no complete checkpoint"
        + (f" ({skipped[0]})" if skipped else "")
        + f". {FIX_PREFIX}pass a checkpoint path, or start without resuming"
        + (
            f" after deleting or moving away {', '.join(kept)} (a partly written checkpoint is not written over "
            "unless overwrite_output_dir=True)"
            if kept
            else ""
        )
        + "."
    )


def rng_tensors(generators: dict[str, torch.Generator]) -> dict[str, torch.Tensor]:
    """The states of named torch generators, as tensors."""
    return {f"rng/{name}": g.get_state() for name, g in generators.items()}


def restore_rng(generators: dict[str, torch.Generator], tensors: dict[str, torch.Tensor], source: str) -> None:
    for name, generator in generators.items():
        key = f"rng/{name}"
        if key not in tensors:
            raise CheckpointError(f"{source} has no RNG state '{name}'.")
        generator.set_state(tensors[key])


__all__ = [
    "CheckpointError",
    "DATASETS_FILE",
    "atomic_write_bytes",
    "check_checkpoint_fits",
    "check_objectives_switched",
    "check_checkpoint_settings",
    "checkpoint_state_settings",
    "check_checkpoint_step",
    "checkpoint_optimizer_settings",
    "datasets_summary",
    "atomic_write_json",
    "encode_tensors",
    "decode_tensors",
    "write_rank_state",
    "verify_checkpoint",
    "holds_optimizer_state",
    "warn_settings_restored",
    "new_run_fix",
    "warn_weights_changed",
    "read_rank_state",
    "read_state_file",
    "last_complete_checkpoint",
    "incomplete_reason",
    "newest_complete_checkpoint",
]
