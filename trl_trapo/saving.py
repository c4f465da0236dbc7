# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What protects the files in `output_dir`: checks before anything slow, saves that never leave half a model.

- [`check_output_dir`] (construction, and the command line before it loads a model): `output_dir` must be a folder
  that can be written, and must not hold a *finished* run (a saved model or `eval_results.json`, see
  `FINISHED_RUN_FILES`) unless `overwrite_output_dir=True`.
- [`check_earlier_checkpoints`] (`train()`, and the command line before it loads a model): a folder holding an
  earlier run's checkpoints is refused unless this run resumes from one of them or `overwrite_output_dir=True`:
  a run from scratch would write its own `checkpoint-1`, `checkpoint-2` ... over them, destroying what a resume
  needs. A run whose newest checkpoint is at its `max_steps` (finished) is told the fixes that work for it: another
  output_dir, `overwrite_output_dir`, or a larger `max_steps` to continue it. Incomplete entries (a save killed
  mid-way) are told apart and never offered for resuming: empty folders alone are written over, partly written ones
  alone are refused with deleting them among the fixes, a file named `checkpoint-N` is refused even with
  `overwrite_output_dir`. (transformers' `Trainer` writes over them silently; transformers 5 has no
  `overwrite_output_dir`.)
- [`check_disk_space`] (construction): `checkpoint_nbytes` estimates one checkpoint, and a disk that cannot hold it is
  refused (checkpoints on) or warned about (checkpoints off: only a final `save_model` would need the weights).
- [`CheckpointGuard`] (every save): a `checkpoint-N` is complete once TRAPO's completion markers are written (see
  `checkpoint.py`). The guard notes the folder when the Trainer starts writing it and when the markers are in; a save
  that fails in between has its partial folder removed (a same-numbered checkpoint it replaced is put back), so the
  previous complete checkpoint is the newest one left, and the error names the folder and the cause
  ([`SaveError`]); a full disk is told as such with the bytes free and needed (`out_of_space`: ENOSPC, and torch's
  short-write `RuntimeError` when the disk is all but full at the failure, which names neither). Final saves go through [`staged_save`]: written into a temporary folder inside `output_dir`, then
  moved over the old files one by one, so a save that fails leaves the previous model whole.
- [`hub_error`]: a failed upload to the Hugging Face Hub, said in one sentence with the repo id and the fixes.
- [`output_dir_lock`] / [`holds_output_dir`] (`train()`) and [`hold_output_dir`] (the command line, before it loads a
  model): one run at a time per `output_dir`. The main process takes an exclusive advisory lock (`fcntl.flock`) on
  `<output_dir>/_trapo_run.lock` (its pid, host and start time in it), which a second run finds taken and is refused
  at once, naming them (trial 15's C18: two runs into one folder overwrote each other's checkpoints and model file by
  file, without a word). The OS releases the lock when the process ends however it ends, so a killed run leaves no
  stale lock (a leftover file is not locked, and is taken over); a clean end removes the file. Only `train()` and the
  jobs lock: building a trainer or evaluating into a folder in use stays allowed; a process holds each lock once,
  however many times it takes it (the job, then its `train()`; a resume in the same process). The file counts for
  none of the checks above, and its `_` keeps it out of transformers' `push_to_hub` uploads.
"""

from __future__ import annotations

import atexit
import errno
import functools
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from accelerate.utils import is_peft_model
from huggingface_hub.errors import HfHubHTTPError
from torch import nn

from .checkpoint import ADAPTER_FILES, EMPTY_CHECKPOINT, FULL_FILES, checkpoint_entries, incomplete_reason


logger = logging.getLogger(__name__)

# Top-level files a finished run leaves in output_dir (the final `save_model`, `save_state`, the job's results)
FINISHED_RUN_FILES = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "adapter_config.json",
    "adapter_model.safetensors",
    "trainer_state.json",
    "eval_results.json",
)
STAGING_DIR = ".trapo-incomplete-save"  # inside output_dir: a final save being written (removed when done)
REPLACED_SUFFIX = ".replaced"  # `checkpoint-N.replaced`: an older same-numbered checkpoint, until the new one is done
CHECKPOINT_MARGIN = 1.05  # + 5% and 16 MiB for tokenizer, trainer state, RNG and TRAPO's own state
CHECKPOINT_MARGIN_BYTES = 16 * 2**20


# what the Hub client raises when the Hub cannot be reached or refuses: HfHubHTTPError (an HTTP error status),
# ConnectionError (HF_HUB_OFFLINE's OfflineModeIsEnabled), TimeoutError, and its HTTP library's own errors (DNS,
# connection, timeouts), recognised by their module since huggingface_hub's HTTP library changes between versions
HUB_ERRORS = (HfHubHTTPError, ConnectionError, TimeoutError)
HTTP_LIBRARIES = ("httpx", "httpx2", "httpcore", "requests", "urllib3")


# what a write that ran out of space says when it is not an OSError: safetensors' SafetensorError ("No space left on
# device (os error 28)"), and torch's zip writer, whose short write surfaces as a RuntimeError naming neither the
# disk nor the errno ("[enforce fail at inline_container.cc:...] . unexpected pos N vs M", "PytorchStreamWriter
# failed writing file ...: file write failed"); the latter counts as a full disk only when the disk is (nearly) full
NO_SPACE_WORDS = ("no space left", "storagefull", "os error 28", "disk quota exceeded", "os error 122")
SHORT_WRITE_WORDS = ("inline_container.cc", "pytorchstreamwriter failed", "file write failed")
NEARLY_FULL_BYTES = 2**20  # free bytes left when a write failed that point to a full disk


class SaveError(OSError):
    """Writing a checkpoint or the final model failed; the message names the path, the cause and the fix."""


class HubPushError(ConnectionError):
    """An upload to the Hugging Face Hub failed; the message names the Hub, the repo id and the fixes."""


def is_hub_error(error: BaseException) -> bool:
    """Whether `error` comes from reaching the Hugging Face Hub (see `HUB_ERRORS`, `HTTP_LIBRARIES`), not from a
    local save."""
    if isinstance(error, (SaveError, HubPushError)):
        return False
    return isinstance(error, HUB_ERRORS) or type(error).__module__.split(".")[0] in HTTP_LIBRARIES


def describe_os_error(path: str, error: OSError) -> str:
    """One sentence on why writing under `path` failed, with the fix: a full disk (ENOSPC / EDQUOT) says how much is
    free."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = f"{shutil.disk_usage(path if os.path.isdir(path) else os.path.dirname(path) or '.').free:,} bytes"
        except OSError:
            free = "an unknown number of bytes"
        return (
            f"the disk holding {path} is full ({error.strerror or error}; {free} free): free space on it or choose "
            "another output_dir"
        )
    if error.errno in (errno.ENOTDIR, errno.EEXIST) or (os.path.exists(path) and not os.path.isdir(path)):
        blocking = file_in_the_way(path)
        if blocking is not None:
            return (
                f"{blocking} is a file, where a folder is needed ({type(error).__name__}: {error.strerror or error}): "
                "pass a folder path (created if missing), or move the file away"
            )
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"{type(error).__name__}: {error} (no permission to write there, or a read-only file system): choose a "
            "folder you can write to"
        )
    # e.g. FileNotFoundError under /proc, or a path whose parent cannot be created
    return f"{type(error).__name__}: {error}: pass a folder you can create and write to"


def free_bytes(path: str) -> int | None:
    """Free bytes (for this user) on the disk holding `path`, or of its nearest existing parent; None if unknown."""
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def out_of_space(error: BaseException, free_at_failure: int | None, needed: int | None = None) -> bool:
    """Whether the write that raised `error` failed for want of disk space.

    Args:
        error: what the save raised.
        free_at_failure (`int`, *optional*): free bytes on that disk measured right after the failure (before any
            partial file is removed).
        needed (`int`, *optional*): bytes the save needs at least (`checkpoint_nbytes`).

    Returns:
        `bool`: True for `ENOSPC` / `EDQUOT`, for an error whose text says so (safetensors), and for torch's short-write
        `RuntimeError` when fewer than `NEARLY_FULL_BYTES` (or fewer than `needed`) bytes were free at the failure.
    """
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(error).lower()
    if any(word in text for word in NO_SPACE_WORDS):
        return True
    if not any(word in text for word in SHORT_WRITE_WORDS) or free_at_failure is None:
        return False
    return free_at_failure < max(NEARLY_FULL_BYTES, needed or 0)


def release_failed_writes(error: BaseException) -> None:
    """Drop the local variables of the finished frames in `error`'s tracebacks (and those of the errors it chains):
    a write that failed half-way (torch's zip writer) holds its file open from them, so its space would come back
    only at the next garbage collection, after the partial folder is removed and the free bytes are said. The
    tracebacks still print in full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)  # skips the frames still running
        error = error.__cause__ or error.__context__


def no_space_message(what: str, error: BaseException, free: int | None, needed: int | None) -> str:
    """`what` (e.g. "Saving the checkpoint <path>") failed on a full disk: the sentence naming the folder, the cause
    with the bytes free (`free`, measured once the partial files are gone) and needed, and the original error."""
    quota = isinstance(error, OSError) and error.errno == errno.EDQUOT or "quota" in str(error).lower()
    cause = "the disk quota is exceeded on the disk holding it" if quota else "the disk holding it is full"
    counts = ["no space left", f"{free:,} bytes free" if free is not None else "free space unknown"]
    if needed:
        counts.append(f"one checkpoint needs at least {needed:,} bytes (weights + optimizer state)")
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{what} failed: {cause} ({'; '.join(counts)}; {type(error).__name__}: {first_line})"


def file_in_the_way(path: str) -> str | None:
    """The first existing file (not a folder) among `path` and its parents, or None: what stops a folder `path`."""
    path = os.path.abspath(path)
    while True:
        if os.path.exists(path):
            return None if os.path.isdir(path) else path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def check_output_dir(args) -> None:
    """Check, before anything slow, that `args.output_dir` can be written and holds no finished run.

    Creates `output_dir` if it is missing (as the `Trainer` does at construction) and writes and removes a probe
    file in it.

    Args:
        args ([`TRAPOConfig`]): reads `output_dir`, `overwrite_output_dir` and `resume_from_checkpoint`.

    Raises:
        ValueError: naming `output_dir`, its value and the fix, if it is a file, cannot be created or written, or
            holds a finished run (a file of `FINISHED_RUN_FILES` at its top level) and `overwrite_output_dir` is
            not set — resuming one of its checkpoints in place included, since the final save would replace the
            finished model (resume into another output_dir instead).
    """
    name = f"{type(args).__name__}.output_dir"
    output_dir = args.output_dir
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(
            f"{name}={output_dir!r} is a file, not a folder: the run writes its checkpoints and model there. Pass a "
            f"folder path (e.g. --output_dir {output_dir}-run), or move the file away."
        )
    parent = os.path.dirname(os.path.abspath(output_dir))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(
            f"{name}={output_dir!r} cannot be created: it is under {parent}, which is a file. Pass a folder path "
            "whose parents are folders."
        )
    try:
        os.makedirs(output_dir, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=output_dir, prefix=".trapo-write-check-")
        os.close(handle)
        os.remove(probe)
    except OSError as error:
        raise ValueError(f"{name}={output_dir!r} cannot be written: {describe_os_error(output_dir, error)}.") from None
    if args.overwrite_output_dir:
        return
    checkpoints = [n for n in checkpoint_names(output_dir) if incomplete_reason(os.path.join(output_dir, n)) is None]
    latest = os.path.join(output_dir, checkpoints[-1]) if checkpoints else "<a checkpoint-N of it>"
    found = [f for f in FINISHED_RUN_FILES if os.path.isfile(os.path.join(output_dir, f))]
    if found:  # resuming here would replace the finished model too (its final save goes to output_dir)
        raise ValueError(
            f"{name}={output_dir!r} holds a finished run ({', '.join(found)}), which this run would replace"
            + (
                " when it saves its final model (resuming in place replaces it too)"
                if resumes_in(output_dir, args.resume_from_checkpoint)
                else ""
            )
            + ". Fix: choose another output_dir"
            + (
                f" (to continue from one of its checkpoints: --output_dir NEW --resume_from_checkpoint {latest})"
                if checkpoints
                else ""
            )
            + ", or pass --overwrite_output_dir (TRAPOConfig(overwrite_output_dir=True)) to replace it."
        )


def checkpoint_names(output_dir: str) -> list[str]:
    """The `checkpoint-N` entries of `output_dir`, by step (complete or not, folders or not); [] if it does not
    exist."""
    return [name for _, name in checkpoint_entries(output_dir)]


def resumes_in(output_dir: str, resume_from_checkpoint: str | os.PathLike | bool | None) -> bool:
    """Whether `resume_from_checkpoint` (a `train()` argument) resumes a checkpoint of `output_dir`: True (its newest
    complete one) or a path inside it."""
    here = os.path.abspath(output_dir)
    return resume_from_checkpoint is True or (
        isinstance(resume_from_checkpoint, (str, os.PathLike))
        and os.path.commonpath([os.path.abspath(os.path.expanduser(resume_from_checkpoint)), here]) == here
    )


def checkpoint_steps(checkpoint_dir: str) -> tuple[int, int] | None:
    """The `(global_step, max_steps)` a checkpoint's `trainer_state.json` records (read with transformers'
    `TrainerState.load_from_json`), or None when it has none or it cannot be read (a checkpoint cut short)."""
    from transformers import TrainerState

    try:
        state = TrainerState.load_from_json(os.path.join(checkpoint_dir, "trainer_state.json"))
        return int(state.global_step), int(state.max_steps or 0)
    except (OSError, ValueError, TypeError):
        return None


def check_earlier_checkpoints(args, resume_from_checkpoint: str | bool | None, cli: bool | None = None) -> None:
    """Refuse to start a run whose checkpoints would replace an earlier run's, before anything is written.

    A run into an `output_dir` that holds complete `checkpoint-N` folders must resume from one of them
    (`resume_from_checkpoint` True, or a path inside `output_dir`) or be told to replace them
    (`overwrite_output_dir=True`): started from scratch, or from another folder's checkpoint, it would write its own
    `checkpoint-N` over theirs, destroying what a resume of the earlier run needs, and mixing two runs' checkpoints in
    one folder.

    The newest *complete* checkpoint says which fixes work: one at its run's `max_steps` (its `trainer_state.json`:
    that run finished), or at or past this run's `max_steps` (resuming it would train nothing,
    `check_checkpoint_step`), is refused with another output_dir, `overwrite_output_dir`, or a larger `max_steps` to
    continue it; an unfinished run's with resuming it, another output_dir or `overwrite_output_dir`.

    Incomplete entries ([`~trl_trapo.checkpoint.incomplete_reason`], a save killed mid-way) cannot be resumed, so
    resuming is never offered for them: empty `checkpoint-N` folders alone are written over (a warning names them:
    they hold nothing); partly written ones alone are refused, naming each and why, with deleting them, another
    output_dir or `overwrite_output_dir` (one may hold the only copy of a model's weights); a *file* named
    `checkpoint-N` is refused even with `overwrite_output_dir`, when the run saves checkpoints (its save would fail on
    it mid-run).

    Args:
        args ([`TRAPOConfig`]): reads `output_dir`, `overwrite_output_dir`, `save_strategy` and `max_steps`.
        resume_from_checkpoint: what the run resumes from (`train()`'s argument; the command line's
            `--resume_from_checkpoint`): None / False (from scratch), True, or a checkpoint path.
        cli: who reads the message: True, a command line's user (flags: `--overwrite_output_dir`); False, a Python
            user (`TRAPOConfig(overwrite_output_dir=True)`, `trainer.train(resume_from_checkpoint=True)`); None, not
            known (both).

    Raises:
        ValueError: naming `output_dir`, its checkpoints, whether their run finished or which are incomplete and why,
            and the fixes that work.
    """
    output_dir = args.output_dir
    checkpoints = checkpoint_names(output_dir)
    if not checkpoints:
        return
    config = type(args).__name__

    def spelt(flag: str, python: str) -> str:
        return flag if cli else python if cli is False else f"{flag} ({python})"

    def listing(names: list[str]) -> str:
        return ", ".join(names) if len(names) <= 3 else f"{names[0]} ... {names[-1]}"

    gaps = {name: incomplete_reason(os.path.join(output_dir, name)) for name in checkpoints}
    files = [name for name in checkpoints if not os.path.isdir(os.path.join(output_dir, name))]
    if files and str(getattr(args.save_strategy, "value", args.save_strategy)) != "no":
        raise ValueError(
            f"{config}.output_dir={output_dir!r} holds {'a file' if len(files) == 1 else 'files'} named "
            f"{listing(files)}, where this run saves its checkpoint folders: its save would fail on it mid-run "
            f"(overwrite_output_dir replaces checkpoints, not files). Fix: move or delete "
            f"{os.path.join(output_dir, files[0]) if len(files) == 1 else 'them'}, or choose another output_dir."
        )
    if args.overwrite_output_dir or resumes_in(output_dir, resume_from_checkpoint):
        return
    complete = [name for name in checkpoints if gaps[name] is None]
    partial = [name for name in checkpoints if gaps[name] is not None and name not in files]
    how = f"resumes from {resume_from_checkpoint}" if resume_from_checkpoint else "starts from scratch"
    other_dir = "choose another output_dir"
    overwrite = spelt("--overwrite_output_dir", f"{config}(overwrite_output_dir=True)")
    if not complete:
        held = [name for name in partial if gaps[name] != EMPTY_CHECKPOINT]
        if not held:  # empty folders only: nothing a resume needs, nothing to lose (as transformers, write over them)
            if partial:
                logger.warning(
                    "output_dir=%r holds %s (%s): nothing to resume from; this run's checkpoints are written over it.",
                    output_dir,
                    listing(partial),
                    EMPTY_CHECKPOINT,
                )
            return
        weights = [
            name
            for name in held
            if any(os.path.exists(os.path.join(output_dir, name, f)) for f in (*FULL_FILES, *ADAPTER_FILES))
        ]
        raise ValueError(
            f"{config}.output_dir={output_dir!r} holds incomplete checkpoints and no complete one ("
            + "; ".join(f"{name}: {gaps[name]}" for name in partial[-3:])
            + f"), so there is nothing to resume, and this run {how}: its own checkpoints would replace them"
            + (
                f" ({listing(weights)} holds model weights, perhaps their only copy: copy them out first if you need "
                "them)"
                if weights
                else ""
            )
            + f". Fix: delete them, {other_dir}, or pass {overwrite} to replace them."
        )
    listed = listing(complete)
    if partial:
        listed += "; incomplete, not resumable: " + "; ".join(f"{name} ({gaps[name]})" for name in partial[-3:])
    newest = os.path.join(output_dir, complete[-1])
    resume = spelt(f"--resume_from_checkpoint {newest}", "trainer.train(resume_from_checkpoint=True)")
    steps = checkpoint_steps(newest)
    step, its_max = steps if steps is not None else (None, 0)
    ended = step is not None and 0 < its_max <= step  # that run reached its own max_steps
    nothing_left = step is not None and 0 < args.max_steps <= step  # resuming it would train 0 steps
    if ended or nothing_left:
        more = (
            f"continue it to this run's max_steps={args.max_steps} ({resume})"
            if args.max_steps > step
            else f"raise max_steps above {step} to continue it ({resume})"
        )
        held = (
            f"the checkpoints of a finished run ({listed}; {complete[-1]} is at step {step}, its max_steps)"
            if ended
            else f"checkpoints of an earlier run ({listed}; {complete[-1]} is at step {step}, and this run's "
            f"max_steps={args.max_steps}: resuming it would train nothing)"
        )
        raise ValueError(
            f"{config}.output_dir={output_dir!r} holds {held} and this run {how}: its own checkpoints would replace "
            f"them. Fix: {other_dir}, pass {overwrite} to replace them, or {more}."
        )
    raise ValueError(
        f"{config}.output_dir={output_dir!r} holds checkpoints of an unfinished run ({listed}) and this "
        f"run {how}: its own checkpoints would replace them, and the earlier run could no longer be resumed. Fix: "
        f"continue that run from {complete[-1]} ({resume}), {other_dir}, or pass {overwrite} to replace them."
    )


def checkpoint_nbytes(model: nn.Module, optim: str, save_only_model: bool = False) -> int:
    """A lower bound on one `checkpoint-N`'s size: the weights it saves plus AdamW's state.

    - weights: every parameter (in its dtype) for a full model; the trainable ones only for a PEFT model (the
      adapter: the frozen base is not saved);
    - optimizer (unless `save_only_model`): the AdamW family keeps two fp32 moments per trainable parameter
      (8 bytes each); other optimizers are counted as 0 (their state is smaller or unknown).

    Parameters partitioned by DeepSpeed ZeRO-3 count whole (`ds_numel`): the ranks' shards of one checkpoint add up
    to the whole model.

    The tokenizer, trainer state, RNG and TRAPO's own state (replay buffer, pools) are left out: the estimate is what
    certainly has to fit; `check_disk_space` adds `CHECKPOINT_MARGIN` for them.

    Args:
        model (`nn.Module`): what the Trainer trains (the policy, or policy and critic).
        optim (`str`): `TrainingArguments.optim`.
        save_only_model (`bool`): `TrainingArguments.save_only_model` (no optimizer state in checkpoints).

    Returns:
        `int`: bytes.
    """
    peft = any(is_peft_model(module) for module in model.modules())
    params = list(model.parameters())  # shared (tied) parameters once
    # a parameter DeepSpeed ZeRO-3 has partitioned holds an empty local tensor; `ds_numel` is its whole size
    weights = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in params if p.requires_grad or not peft)
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad)
    # `optim` is usually transformers' `OptimizerNames`, a str enum whose `str()` is "OptimizerNames.ADAMW_TORCH"
    adam = str(getattr(optim, "value", optim)).lower().startswith("adam") and not save_only_model
    return weights + (8 * trainable if adam else 0)


def check_disk_space(output_dir: str, needed: int, checkpoints: bool) -> None:
    """Compare one checkpoint's estimated size with the free space of `output_dir`'s filesystem.

    Args:
        output_dir (`str`): an existing folder (see `check_output_dir`).
        needed (`int`): bytes, from `checkpoint_nbytes`.
        checkpoints (`bool`): whether the run writes checkpoints (`save_strategy != "no"`).

    Raises:
        ValueError: if checkpoints are written and fewer than `needed` bytes are free (the first checkpoint would
            certainly fail). With less than `needed * CHECKPOINT_MARGIN + CHECKPOINT_MARGIN_BYTES` free, or with
            checkpoints off (only a final `save_model` would need the space), it only warns.
    """
    free = shutil.disk_usage(output_dir).free
    comfortable = int(needed * CHECKPOINT_MARGIN) + CHECKPOINT_MARGIN_BYTES
    what = (
        f"output_dir={output_dir!r} has {free:,} bytes free, and one checkpoint needs at least {needed:,} bytes "
        f"(weights + AdamW state; ~{comfortable:,} with {CHECKPOINT_MARGIN_BYTES // 2**20} MiB + 5% allowed for "
        "the tokenizer files, trainer, RNG and TRAPO state)"
    )
    if checkpoints and free < needed:
        raise ValueError(
            f"{what}: the first checkpoint cannot fit. Free space on that disk, choose an output_dir on another "
            "disk, or turn checkpoints off (--save_strategy no)."
        )
    if free < comfortable:
        logger.warning(
            "%s: %s may not fit. Free space on that disk or choose an output_dir on another disk.",
            what,
            "the first checkpoint" if checkpoints else "a final save_model",
        )


class CheckpointGuard:
    """Keeps a failed save from destroying or masking the previous complete checkpoint (see the module docstring).

    `begin(path)` when the Trainer starts writing `checkpoint-N` (from `save_model`), `end(path)` when its
    completion markers are written (from the state-checkpoint callback), `failed(error)` from `train` when anything
    raised in between. Only the main process moves or removes folders; `begin` is called on every rank, and the ranks
    wait for each other after it (`TRAPOTrainer.save_model`) so that no rank writes into the new folder before an
    earlier one of that name has been moved aside.

    Args:
        is_main_process (`Callable[[], bool]`): whether this process writes shared files.
        checkpoint_nbytes (`int`, *optional*): bytes one checkpoint needs at least (`checkpoint_nbytes`), said when a
            save fails on a full disk.

    Attributes:
        pending (`str` or None): the checkpoint folder being written, the same on every rank; None outside a save.
    """

    def __init__(self, is_main_process: Callable[[], bool], checkpoint_nbytes: int | None = None):
        self.is_main_process = is_main_process
        self.checkpoint_nbytes = checkpoint_nbytes
        self.pending: str | None = None

    def begin(self, path: str) -> None:
        """The Trainer is about to write the checkpoint folder `path`: an existing folder of that name (from an
        earlier run) is moved aside to `path + REPLACED_SUFFIX` until the new one is complete."""
        self.pending = path
        if self.is_main_process() and os.path.isdir(path):
            aside = path + REPLACED_SUFFIX
            if os.path.isdir(aside):
                shutil.rmtree(aside)
            os.replace(path, aside)

    def end(self, path: str) -> None:
        """`path` is complete: drop the folder it replaced."""
        if self.pending == path and self.is_main_process() and os.path.isdir(path + REPLACED_SUFFIX):
            shutil.rmtree(path + REPLACED_SUFFIX, ignore_errors=True)
        self.pending = None

    def failed(self, error: BaseException) -> BaseException | None:
        """A save was interrupted by `error`: remove the partial folder, put back the one it replaced.

        Returns:
            A [`SaveError`] naming the folder and the cause when `error` is an `OSError`, or any error of a write that
            ran out of disk space (`out_of_space`: torch's short-write `RuntimeError` included), with the bytes free
            and needed (raise it from `error`); else None (re-raise `error` itself). None too when no save was in
            progress.
        """
        path, self.pending = self.pending, None
        if path is None:
            return None
        full = not isinstance(error, SaveError) and out_of_space(error, free_bytes(path), self.checkpoint_nbytes)
        if full:
            release_failed_writes(error)
        if self.is_main_process():
            shutil.rmtree(path, ignore_errors=True)
            if os.path.isdir(path + REPLACED_SUFFIX):
                os.replace(path + REPLACED_SUFFIX, path)
        if not (full or isinstance(error, OSError)) or isinstance(error, SaveError):
            return None
        kept = "; the complete checkpoints before it are untouched" if self.is_main_process() else ""
        resume = (
            "then resume from the newest complete checkpoint-N of that folder (--resume_from_checkpoint <it>; API: "
            "train(resume_from_checkpoint=True))"
        )
        if full:
            told = no_space_message(f"Saving the checkpoint {path}", error, free_bytes(path), self.checkpoint_nbytes)
            return SaveError(
                f"{told}. The partial folder was removed{kept}. Fix: free space on that disk or choose an output_dir "
                f"on another disk (save_total_limit caps how many checkpoints are kept), {resume}."
            )
        return SaveError(
            f"Saving the checkpoint {path} failed: {describe_os_error(path, error)}. The partial folder was removed"
            f"{kept}. Once that is fixed, {resume}."
        )


@contextmanager
def staged_save(output_dir: str, is_main_process: bool, wait_for_everyone: Callable[[], None]) -> Iterator[str]:
    """Write a save into a temporary folder inside `output_dir`, then move its files over the old ones.

    Yields the temporary folder (the same on every process: collective saves write into it from every rank). When
    the block succeeds, every entry is moved into `output_dir` (`os.replace`, a folder replacing a folder of the same
    name); when it raises, the temporary folder is removed and `output_dir`'s files are untouched.

    Args:
        output_dir (`str`): where the files end up.
        is_main_process (`bool`): this process creates, moves and removes.
        wait_for_everyone (`Callable[[], None]`): a barrier over processes.

    Raises:
        SaveError: naming `output_dir` and the cause, for an `OSError` while writing or moving, or a write that ran
            out of disk space (`out_of_space`).
    """
    staging = os.path.join(output_dir, STAGING_DIR)
    try:
        blocking = file_in_the_way(output_dir)
        if blocking is not None:  # nothing written yet: the file stays as it is
            raise SaveError(
                f"Saving the model to {output_dir} failed: {blocking} is a file, not a folder. Fix: pass a folder path "
                "(created if missing), or move the file away. The file was left as it was."
            )
        if is_main_process:
            if os.path.isdir(staging):
                shutil.rmtree(staging)
            os.makedirs(staging)
        wait_for_everyone()
        yield staging
        wait_for_everyone()
        if is_main_process:
            for name in sorted(os.listdir(staging)):
                target = os.path.join(output_dir, name)
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                os.replace(os.path.join(staging, name), target)
            os.rmdir(staging)
    except BaseException as error:
        # torch's short write on a full disk is a RuntimeError: measured before the partial files are removed
        full = not isinstance(error, OSError) and out_of_space(error, free_bytes(output_dir))
        if full:
            release_failed_writes(error)
        if is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, SaveError) or not (full or isinstance(error, OSError)):
            raise
        what = f"Saving the model to {output_dir}"
        told = (
            f"{no_space_message(what, error, free_bytes(output_dir), None)}. Fix: free space on that disk "
            "or choose another folder"
            if full
            else f"{what} failed: {describe_os_error(output_dir, error)}"
        )
        raise SaveError(f"{told}. The files already there were left as they were.") from error


def hub_error(
    repo_id: str | None, error: BaseException, output_dir: str | None, by_hand: bool = False
) -> HubPushError:
    """The error to raise when an upload to (or repo creation on) the Hugging Face Hub fails.

    Args:
        repo_id (`str`, *optional*): the repo (`hub_model_id`, or the one derived from `output_dir`).
        error: what the Hub client raised (a connection, HTTP or offline-mode error).
        output_dir (`str`, *optional*): the local folder, complete on disk, to upload later; None when nothing was
            saved yet (the repo is created first: when the trainer is built with `push_to_hub=True`, or at the start
            of a `push_to_hub()` call).
        by_hand (`bool`): `push_to_hub()` was called by the user's code, not by the trainer for `push_to_hub=True`
            (the message then says nothing of `--push_to_hub` or of training).
    """
    cause = str(error).splitlines()[0] if str(error) else type(error).__name__
    fix = "check the network and HF_TOKEN (`hf auth login`)"
    if output_dir is None and by_hand:
        return HubPushError(
            f"push_to_hub(): creating the repo {repo_id!r} on the Hugging Face Hub failed ({type(error).__name__}: "
            f"{cause}); nothing was saved or uploaded by this call, and the model in memory is as it was. Fix: {fix} "
            f"and call push_to_hub() again, or save it locally with `trainer.save_model('<folder>')` and upload that "
            f"folder later (`hf upload {repo_id} <folder>`)."
        )
    if output_dir is None:
        return HubPushError(
            f"push_to_hub=True: creating the repo {repo_id!r} on the Hugging Face Hub failed before any training "
            f"({type(error).__name__}: {cause}); nothing was trained or saved. Fix: {fix}, or drop --push_to_hub and "
            "upload the output_dir after training (`hf upload`)."
        )
    return HubPushError(
        f"Pushing to the Hugging Face Hub (repo {repo_id!r}) failed: {type(error).__name__}: {cause}. The local "
        f"save in {output_dir} is complete. Fix: {fix}, then upload it with `hf upload {repo_id} {output_dir}`"
        + ("." if by_hand else "; or drop --push_to_hub.")
    )


# ---- one run at a time per output_dir -----------------------------------------------------------------------------
RUN_LOCK = "_trapo_run.lock"
"""The lock file in `output_dir` (see the module docstring): transformers' `push_to_hub` leaves `_*` out of uploads."""

HELD_LOCKS: dict[str, list[int]] = {}
"""This process's run locks: the lock file's real path -> `[file descriptor, holds]`."""


def run_lock_path(output_dir: str | os.PathLike) -> str:
    """The lock file of `output_dir`, as a real path (one key per folder, however it is spelt)."""
    return os.path.join(os.path.realpath(os.path.expanduser(os.fspath(output_dir))), RUN_LOCK)


def lock_holder(path: str) -> str:
    """Who holds the run lock at `path`, from what it wrote there: `"pid 4242, started 14:03:07"` (with `on <host>`
    when it is another machine's, and the date when it is not today's), or why that cannot be told."""
    try:
        with open(path, encoding="utf-8") as handle:
            info = json.load(handle)
        pid, host, started = info["pid"], info["host"], float(info["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid is not written yet"
    same_day = time.strftime("%Y-%m-%d", time.localtime(started)) == time.strftime("%Y-%m-%d")
    when = time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", time.localtime(started))
    return f"pid {pid}{'' if host == socket.gethostname() else f' on {host}'}, started {when}"


def in_use_error(args, holder: str) -> ValueError:
    """The refusal of a run into `args.output_dir` while another run holds its lock (`holder`: [`lock_holder`])."""
    return ValueError(
        f"{type(args).__name__}.output_dir={args.output_dir!r} is in use by another run ({holder}): two runs writing "
        "into one folder replace each other's checkpoints and model file by file. Fix: choose another output_dir, or "
        "wait until that run has ended."
    )


def acquire_run_lock(args) -> str | None:
    """Take the run lock of `args.output_dir` for this process (once more if it holds it already: the holds count).

    Args:
        args ([`TRAPOConfig`]): reads `output_dir`.

    Returns:
        `str` or None: the lock file (give it to [`release_run_lock`]), or None when no lock can be taken here (no
        `fcntl`: not a POSIX system; a file system without `flock`: warned; a folder that cannot be created or written,
        which `check_output_dir` names): the run goes on unlocked.

    Raises:
        ValueError: another process holds it ([`in_use_error`]).
    """
    path = run_lock_path(args.output_dir)
    if path in HELD_LOCKS:
        HELD_LOCKS[path][1] += 1
        return path
    try:
        import fcntl
    except ImportError:
        return None
    for _ in range(8):  # the holder removes the file as it lets go: a file locked after that is locked again anew
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise in_use_error(args, lock_holder(path)) from None
        except OSError as error:  # ENOLCK, EOPNOTSUPP: a network or FUSE file system without flock
            os.close(descriptor)
            logger.warning(
                "output_dir=%r cannot be locked (%s): a second run started into it would not be refused.",
                args.output_dir,
                describe_os_error(path, error),
            )
            return None
        try:
            if os.path.samestat(os.fstat(descriptor), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(descriptor)
    else:
        return None
    # written in place (the lock is on this very file; a reader that finds it half-written says so)
    info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}).encode()
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, info, 0)
    HELD_LOCKS[path] = [descriptor, 1]
    return path


def release_run_lock(path: str | None) -> None:
    """Give back one hold of the run lock at `path` ([`acquire_run_lock`]'s return; None: nothing); the last one
    removes the file (while still locked, so that no other run locks it in between) and unlocks it."""
    held = HELD_LOCKS.get(path)
    if held is None:
        return
    held[1] -= 1
    if held[1] > 0:
        return
    del HELD_LOCKS[path]
    descriptor = held[0]
    try:
        if os.path.samestat(os.fstat(descriptor), os.stat(path)):
            os.remove(path)
    except OSError:
        pass
    os.close(descriptor)  # the lock goes with the last descriptor of the file


@contextmanager
def output_dir_lock(args, is_main_process: bool, agree: Callable[[int], int] | None = None) -> Iterator[None]:
    """Hold the run lock of `args.output_dir` on the main process for the block (see the module docstring).

    Args:
        args ([`TRAPOConfig`]): reads `output_dir`.
        is_main_process (`bool`): this process takes the lock (the other ranks of a run do not).
        agree (`Callable[[int], int]`, *optional*): the largest of every rank's value (a collective, e.g.
            `distributed.max_over_ranks`): every rank learns that the main process was refused, and raises too.

    Raises:
        ValueError: another run holds the lock ([`in_use_error`]), before the block, on every rank.
    """
    path, refused = None, None
    if is_main_process:
        try:
            path = acquire_run_lock(args)
        except ValueError as error:
            refused = error
    try:
        if agree is not None and agree(int(refused is not None)) and refused is None:  # the main process's refusal
            refused = in_use_error(args, lock_holder(run_lock_path(args.output_dir)))
        if refused is not None:
            raise refused
        yield
    finally:
        release_run_lock(path)


def holds_output_dir(train: Callable) -> Callable:
    """Decorator of `TRAPOTrainer.train`: the run lock of `output_dir` ([`output_dir_lock`]) is held from the start
    of the call, before anything is checked or written there, until it returns or raises; every rank agrees on a
    refusal (`distributed.max_over_ranks`)."""
    from .distributed import max_over_ranks

    @functools.wraps(train)
    def locked_train(trainer, *args, **kwargs):
        accelerator = trainer.accelerator
        with output_dir_lock(
            trainer.args, accelerator.is_main_process, lambda refused: max_over_ranks(accelerator, refused)
        ):
            return train(trainer, *args, **kwargs)

    return locked_train


JOB_HOLDS: list[str] = []
"""The run locks the jobs of this process hold ([`hold_output_dir`]), in the order taken."""


def release_job_holds(start: int = 0) -> None:
    """Give back the jobs' holds taken after the first `start` ones (all by default: at the interpreter's exit)."""
    while len(JOB_HOLDS) > start:
        release_run_lock(JOB_HOLDS.pop())


atexit.register(release_job_holds)


def hold_output_dir(args) -> None:
    """A job's hold on `args.output_dir`: the run lock, taken on the main process (`args.process_index` 0) before a
    model loads and kept until the job returns ([`releases_job_holds`]: its final save and `eval_results.json`
    included) or, run otherwise, until the process exits.

    Raises:
        ValueError: another run holds it ([`in_use_error`]).
    """
    if args.process_index != 0:
        return
    path = acquire_run_lock(args)
    if path is not None:
        JOB_HOLDS.append(path)


def releases_job_holds(job: Callable) -> Callable:
    """Decorator of a job's entry point (`run`, `main`): the holds on `output_dir` it takes ([`hold_output_dir`]) are
    given back when it returns or raises, so that a job run in a process that goes on (a test, a notebook) leaves the
    folder free."""

    @functools.wraps(job)
    def job_then_release(*args, **kwargs):
        start = len(JOB_HOLDS)
        try:
            return job(*args, **kwargs)
        finally:
            release_job_holds(start)

    return job_then_release


__all__ = [
    "FINISHED_RUN_FILES",
    "RUN_LOCK",
    "is_hub_error",
    "CheckpointGuard",
    "HubPushError",
    "SaveError",
    "check_disk_space",
    "check_earlier_checkpoints",
    "check_output_dir",
    "checkpoint_nbytes",
    "hold_output_dir",
    "holds_output_dir",
    "hub_error",
    "output_dir_lock",
    "releases_job_holds",
    "staged_save",
]
