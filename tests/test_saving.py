# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""trl_trapo/saving.py: a save that fails (a full disk, injected as `OSError(ENOSPC)`) never destroys or masks the
previous complete checkpoint or model and says where and why; a failed push to the Hub names it and keeps the local
save; the checkpoint size estimate counts weights and AdamW state."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import transformers.trainer
from transformers import AutoModelForCausalLM

from trl_trapo import TRAPOConfig
from trl_trapo import checkpoint as trapo_checkpoint
from trl_trapo.checkpoint import CheckpointError, last_complete_checkpoint, verify_checkpoint
from trl_trapo.saving import (
    HELD_LOCKS,
    RUN_LOCK,
    STAGING_DIR,
    CheckpointGuard,
    HubPushError,
    SaveError,
    acquire_run_lock,
    checkpoint_nbytes,
    hold_output_dir,
    output_dir_lock,
    release_run_lock,
    releases_job_holds,
    run_lock_path,
)
from trl_trapo.tasks import build_tiny_model


def full_disk_on(monkeypatch, module, name: str, when, path_arg: int = 1) -> list[str]:
    """Make the writer `module.name` raise ENOSPC for the paths (its positional argument `path_arg`) where
    `when(path)` holds; returns the list of paths it refused."""
    original = getattr(module, name)
    refused = []

    def writer(*args, **kwargs):
        path = str(args[path_arg])
        if when(path):
            refused.append(path)
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, writer)
    return refused


@pytest.mark.parametrize("stage", ["optimizer", "trapo_state"])
def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, stage
):
    """3 steps, a checkpoint after each; the save of checkpoint-3 fails with ENOSPC while writing the optimizer (the
    Trainer's files) or TRAPO's own state (after all of the Trainer's files): the error names the folder and the
    full disk, checkpoint-3 is gone (not left half-written), and checkpoint-2 is complete and the newest one."""
    import trl_trapo.checkpoint as checkpoint_module

    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=3, save_strategy="steps", save_steps=1)
    if stage == "optimizer":  # the Trainer's torch.save(optimizer state, path)
        refused = full_disk_on(monkeypatch, torch, "save", lambda p: "checkpoint-3" in p and "optimizer" in p)
    else:  # every file of TRAPO's state goes through atomic_write_bytes(path, data)
        refused = full_disk_on(monkeypatch, checkpoint_module, "atomic_write_bytes", lambda p: "checkpoint-3" in p, 0)
    with pytest.raises(SaveError) as raised:
        trainer.train()
    message = str(raised.value)
    assert str(tmp_path / "checkpoint-3") in message and "is full" in message and "free space" in message
    assert isinstance(raised.value.__cause__, OSError) and raised.value.__cause__.errno == errno.ENOSPC
    assert refused and not (tmp_path / "checkpoint-3").exists()
    verify_checkpoint(str(tmp_path / "checkpoint-2"), 1)
    assert last_complete_checkpoint(str(tmp_path), 1) == (str(tmp_path / "checkpoint-2"), [])


# trial 14's N30: on a 3 MB tmpfs the optimizer's torch.save died with this, naming neither the disk nor the path
TORCH_SHORT_WRITE = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 897024 vs 896912")


@pytest.mark.parametrize(
    "error",
    [
        TORCH_SHORT_WRITE,
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: ... })"),
    ],
    ids=["torch-short-write", "enospc", "safetensors"],
)
def test_a_checkpoint_that_runs_out_of_space_says_so_with_the_bytes(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, error
):
    """The save of checkpoint-2 fails for want of space (torch's RuntimeError from a short write, with the disk all
    but full at the failure; ENOSPC; safetensors' error naming os error 28): one SaveError naming the folder, the
    full disk, the bytes free and the bytes one checkpoint needs, and the fix, chained to the original error;
    checkpoint-2 is gone and checkpoint-1 is the newest complete one. The torch error alone used to reach the user."""
    import shutil

    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=2, save_strategy="steps", save_steps=1)
    needed = checkpoint_nbytes(trainer.model, trainer.args.optim)
    usage, original_save = shutil.disk_usage(tmp_path), torch.save

    def save(obj, path, *args, **kwargs):
        if "checkpoint-2" in str(path) and "optimizer" in str(path):
            monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=4096))
            raise error
        return original_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(SaveError) as raised:
        trainer.train()
    message = str(raised.value)
    assert message.startswith(f"Saving the checkpoint {tmp_path / 'checkpoint-2'} failed: the disk holding it is full")
    assert f"4,096 bytes free; one checkpoint needs at least {needed:,} bytes" in message, message
    assert f"{type(error).__name__}: {str(error).splitlines()[0]}" in message
    assert "Fix: free space on that disk or choose an output_dir on another disk" in message
    assert raised.value.__cause__ is error
    assert not (tmp_path / "checkpoint-2").exists()
    assert last_complete_checkpoint(str(tmp_path), 1) == (str(tmp_path / "checkpoint-1"), [])


def test_a_torch_write_error_with_room_on_the_disk_is_not_called_a_full_disk(tmp_path):
    """torch's short-write RuntimeError counts as a full disk only when the disk is (nearly) full at the failure:
    with room left it is re-raised as it is (the partial folder still removed)."""
    guard = CheckpointGuard(lambda: True, checkpoint_nbytes=1000)
    guard.begin(str(tmp_path / "checkpoint-1"))
    (tmp_path / "checkpoint-1").mkdir()
    assert guard.failed(TORCH_SHORT_WRITE) is None and not (tmp_path / "checkpoint-1").exists()


def test_a_failed_write_on_a_full_disk_lets_go_of_its_file(tmp_path, monkeypatch):
    """torch's zip writer that failed half-way keeps its (deleted) file open from the finished frames of the
    traceback, so the space came back only at the next garbage collection, after the free bytes were said (a 3 MB
    tmpfs showed 1.2 MB still used): the guard drops those frames' variables, and the file is closed at once."""
    import shutil
    import weakref

    writers = []

    class Writer:  # stands for torch._C.PyTorchFileWriter: holds the file open until it is dropped
        def __init__(self, path):
            self.file = open(path, "wb")  # noqa: SIM115
            writers.append(weakref.ref(self))

    def save(path):
        writer = Writer(path)  # noqa: F841 (held by this frame, as torch.save's `with` holds its writer)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise TORCH_SHORT_WRITE from None  # what __exit__'s write_end_of_file raises; the first error chained

    folder = tmp_path / "checkpoint-1"
    guard = CheckpointGuard(lambda: True, checkpoint_nbytes=1000)
    guard.begin(str(folder))
    folder.mkdir()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10))
    try:
        save(folder / "optimizer.pt")
    except RuntimeError as error:
        caught = error
    assert writers[0]() is not None  # held by the traceback
    assert isinstance(guard.failed(caught), SaveError)
    assert writers[0]() is None and not folder.exists()


def test_a_final_save_that_runs_out_of_space_says_so(tmp_path, tokenizer, suite, tiny_trainer, monkeypatch):
    """`save_model` whose torch.save stops on a full disk with torch's RuntimeError: a SaveError naming the folder,
    the full disk and the bytes free, chained to it; nothing is left in the folder."""
    import shutil

    out = tmp_path / "model"
    trainer = tiny_trainer(tmp_path / "run", tokenizer, suite)
    usage, original_save = shutil.disk_usage(tmp_path), torch.save

    def save(obj, path, *args, **kwargs):
        if str(path).endswith("training_args.bin"):
            monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=0))
            raise TORCH_SHORT_WRITE
        return original_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(
        SaveError, match=rf"Saving the model to {out} failed: the disk holding it is full \(no space left; 0 bytes"
    ):
        trainer.save_model(str(out))
    assert not os.listdir(out)


def test_a_full_disk_at_the_final_save_leaves_the_previous_model_whole(tmp_path, tokenizer, suite, tiny_trainer):
    """`save_model` twice into one folder, the second failing with ENOSPC on its last file: SaveError naming the
    folder and the full disk, the first save's files byte for byte as they were, no temporary folder left."""
    out = tmp_path / "model"
    trainer = tiny_trainer(tmp_path / "run", tokenizer, suite)
    trainer.save_model(str(out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with torch.no_grad():
        next(trainer.model.parameters()).add_(1.0)  # the second save would write other weights
    with pytest.MonkeyPatch.context() as patch:
        full_disk_on(patch, torch, "save", lambda p: p.endswith("training_args.bin"))
        with pytest.raises(SaveError, match=rf"Saving the model to {out} failed: the disk holding .* is full"):
            trainer.save_model(str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not (out / STAGING_DIR).exists()
    trainer.save_model(str(out))  # the disk has room again: the new weights replace the old
    assert (out / "model.safetensors").read_bytes() != before["model.safetensors"]
    AutoModelForCausalLM.from_pretrained(out)


@pytest.mark.parametrize("target", ["afile", "afile/model"], ids=["a-file", "inside-a-file"])
def test_save_model_to_a_file_path_names_the_file_and_the_fix(tmp_path, tokenizer, suite, tiny_trainer, target):
    """`save_model(path)` where `path` (or a folder on its way) is a file: the SaveError named only
    `NotADirectoryError: ... '.trapo-incomplete-save'` (T02); now the file, and the fix, and the file is kept."""
    (tmp_path / "afile").write_text("mine")
    trainer = tiny_trainer(tmp_path / "run", tokenizer, suite)
    with pytest.raises(SaveError) as raised:
        trainer.save_model(str(tmp_path / target))
    assert str(raised.value) == (
        f"Saving the model to {tmp_path / target} failed: {tmp_path / 'afile'} is a file, not a folder. Fix: pass a "
        "folder path (created if missing), or move the file away. The file was left as it was."
    )
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize(
    "error, needles",
    [
        (OSError(errno.ENOTDIR, "Not a directory"), ["is a file, where a folder is needed", "pass a folder path"]),
        (PermissionError(errno.EACCES, "Permission denied"), ["no permission to write there", "choose a folder"]),
        # trial 4's N25: save_model("/proc/trapo_model") said the cause only
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory"),
            ["No such file or directory: pass a folder you can create and write to"],
        ),
    ],
    ids=["not-a-directory", "permission", "cannot-be-created"],
)
def test_every_save_error_says_what_to_do_about_its_cause(tmp_path, error, needles):
    """`describe_os_error` words every SaveError (checkpoints, the final model, trainer_state.json, the CLI's
    files): a file in the way and a folder without permission say the fix, not only the OSError."""
    from trl_trapo.saving import describe_os_error

    (tmp_path / "afile").write_text("")
    text = describe_os_error(str(tmp_path / "afile" / "checkpoint-2"), error)
    for needle in needles:
        assert needle in text, text


def test_the_guard_puts_back_a_same_numbered_checkpoint_a_failed_save_replaced(tmp_path):
    """An earlier run's `checkpoint-2` is moved aside while the new one is written, restored when that save fails,
    dropped when it completes; an error outside a save is left alone."""
    old = tmp_path / "checkpoint-2"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"old")
    guard = CheckpointGuard(lambda: True)
    guard.begin(str(old))
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"ne")  # half-written
    error = guard.failed(OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(error, SaveError) and (old / "model.safetensors").read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]
    guard.begin(str(old))
    old.mkdir()
    guard.end(str(old))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"] and not (old / "model.safetensors").exists()
    assert guard.failed(RuntimeError("not a save")) is None


def test_the_state_callback_decides_from_the_folder_being_saved_not_from_the_disk(tmp_path):
    """Saving TRAPO's state is collective: every rank must decide alike. The decision comes from the folder the
    Trainer's save was given (the same on every rank), not from `os.path.isdir`, which differed between ranks on a
    loaded machine (rank 0 had not created the folder yet, or had moved it aside for a moment): a hang."""
    from types import SimpleNamespace

    from trl_trapo.callbacks import StateCheckpointCallback

    saved, being_saved = [], []
    callback = StateCheckpointCallback(saved.append, lambda: being_saved[-1] if being_saved else None)
    args, state = SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=2)
    (tmp_path / "checkpoint-2").mkdir()
    assert callback.on_save(args, state, "control") == "control" and saved == []  # a folder, but no save in progress
    being_saved.append(str(tmp_path / "checkpoint-4"))  # not on this rank's disk (yet)
    callback.on_save(args, SimpleNamespace(global_step=4), "control")
    assert saved == [str(tmp_path / "checkpoint-4")]


def test_a_checkpoint_save_waits_for_every_rank_after_an_earlier_folder_is_moved_aside(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch
):
    """Rank 0 moves an earlier same-numbered folder aside (`CheckpointGuard.begin`); a rank that wrote into the new
    folder before that (its RNG file) lost the file with the folder. The ranks wait for each other in between, and the
    marker of each rank fingerprints its RNG file, so that a checkpoint without it is not taken for complete."""
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=1, save_strategy="steps", save_steps=1)
    events = []

    def recorded(name, original):
        def call(*args):
            events.append(name)
            return original(*args)

        return call

    monkeypatch.setattr(trainer._checkpoint_guard, "begin", recorded("begin", trainer._checkpoint_guard.begin))
    monkeypatch.setattr(trainer, "_save_model", recorded("_save_model", trainer._save_model))
    monkeypatch.setattr(trainer.accelerator, "wait_for_everyone", recorded("barrier", lambda: None))
    trainer.train()
    assert events[:3] == ["begin", "barrier", "_save_model"], events
    checkpoint = tmp_path / "checkpoint-1"
    verify_checkpoint(str(checkpoint), 1)
    (checkpoint / "rng_state_1.pth").write_bytes(b"rank 1")  # as a second rank would have written it
    trapo_checkpoint.write_rank_state(str(checkpoint), 1, {}, {}, False)
    verify_checkpoint(str(checkpoint), 2)
    (checkpoint / "rng_state_1.pth").unlink()
    with pytest.raises(CheckpointError, match="rng_state_1.pth is missing"):
        verify_checkpoint(str(checkpoint), 2)


@pytest.mark.parametrize(("written", "resumed"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumed_with_another_number_of_processes_names_both_and_the_fix(tmp_path, written, resumed):
    """CD02 (2 processes resumed in 1: rank 1's state silently dropped) and CD06 (1 resumed in 2: 'incomplete, resume
    from an earlier checkpoint', which fails the same way): refused up front, naming both counts and how to resume."""
    checkpoint = tmp_path / "checkpoint-2"
    for rank in range(written):
        if written > 1:  # transformers' per-process RNG file, as a multi-process Trainer writes it
            (checkpoint / f"rng_state_{rank}.pth").parent.mkdir(parents=True, exist_ok=True)
            (checkpoint / f"rng_state_{rank}.pth").write_bytes(b"rng")
        trapo_checkpoint.write_rank_state(str(checkpoint), rank, {}, {}, False)
    verify_checkpoint(str(checkpoint), written)
    with pytest.raises(CheckpointError) as raised:
        verify_checkpoint(str(checkpoint), resumed)
    message = str(raised.value)
    assert f"written by {written} process" in message and f"this run has {resumed}" in message, message
    assert "same number of processes" in message and "earlier checkpoint" not in message, message
    assert ("--num_processes 2" if written == 2 else "as one process") in message, message
    assert last_complete_checkpoint(str(tmp_path), resumed)[0] is None


class FakeHubApi:
    """The Hub client as seen offline: the repo exists, the upload fails to resolve the Hub's name."""

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, **kwargs):
        import importlib

        for name in ("httpx2", "httpx"):  # the HTTP library huggingface_hub uses
            try:
                http = importlib.import_module(name)
                break
            except ImportError:
                continue
        raise http.ConnectError("[Errno -2] Name or service not known")


def test_a_failed_push_names_the_hub_and_keeps_the_local_save(tmp_path, tokenizer, suite, tiny_trainer, monkeypatch):
    """`push_to_hub` without network: HubPushError naming the Hugging Face Hub, the repo id and the fixes; the model
    saved locally reloads. A repo that cannot be created at construction says the same."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite runs offline
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: FakeHubApi())
    trainer = tiny_trainer(tmp_path, tokenizer, suite, push_to_hub=True, hub_model_id="me/trapo-tiny")
    with pytest.raises(HubPushError) as raised:
        trainer.push_to_hub()
    message = str(raised.value)
    assert "Hugging Face Hub" in message and "'me/trapo-tiny'" in message and "Name or service not known" in message
    assert f"hf upload me/trapo-tiny {tmp_path}" in message and "--push_to_hub" in message and "HF_TOKEN" in message
    AutoModelForCausalLM.from_pretrained(tmp_path)

    def unreachable(self, repo_id, **kwargs):
        raise FakeHubApi().upload_folder()

    monkeypatch.setattr(FakeHubApi, "create_repo", unreachable)
    # at construction nothing is saved yet: the message must not claim a local save (a new user trusted that claim)
    with pytest.raises(
        HubPushError, match=r"creating the repo 'me/trapo-tiny' on the Hugging Face Hub failed"
    ) as raised:
        tiny_trainer(tmp_path / "b", tokenizer, suite, push_to_hub=True, hub_model_id="me/trapo-tiny")
    assert "nothing was trained or saved" in str(raised.value) and "is complete" not in str(raised.value)


def test_a_push_by_hand_that_cannot_create_the_repo_says_what_is_true(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch
):
    """`trainer.push_to_hub()` called by the user's code (push_to_hub=False) after training, offline: the message said
    "push_to_hub=True ... failed before any training; nothing was trained or saved ... drop --push_to_hub", none of it
    true there (T03). Now: this call saved and uploaded nothing, the model in memory is kept, how to save and upload
    it. A repo id the Hub refuses (an output_dir with a space, no hub_model_id) was huggingface_hub's raw
    HFValidationError (T04): one message naming hub_model_id."""
    import huggingface_hub.constants
    from huggingface_hub.utils import validate_repo_id

    def unreachable(self, repo_id, **kwargs):
        validate_repo_id(repo_id)  # as huggingface_hub does before any request (offline too)
        raise FakeHubApi().upload_folder()

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: FakeHubApi())
    monkeypatch.setattr(FakeHubApi, "create_repo", unreachable)
    trainer = tiny_trainer(tmp_path / "run", tokenizer, suite, max_steps=1, hub_model_id="me/trapo-tiny")
    trainer.train()
    with pytest.raises(HubPushError) as raised:
        trainer.push_to_hub()
    message = str(raised.value)
    assert message.startswith("push_to_hub(): creating the repo 'me/trapo-tiny' on the Hugging Face Hub failed")
    for needle in ("nothing was saved or uploaded by this call", "trainer.save_model('<folder>')", "hf upload"):
        assert needle in message, message
    for wrong in ("push_to_hub=True", "before any training", "--push_to_hub"):
        assert wrong not in message, message
    spaced = tiny_trainer(tmp_path / "my run", tokenizer, suite, max_steps=1)
    with pytest.raises(ValueError, match=r"repo id 'my run'.*last part of output_dir.*(?i:set hub_model_id)"):
        spaced.push_to_hub()


def test_checkpoint_size_counts_weights_and_adamw_moments(tokenizer):
    """Full model: every parameter's bytes + 8 bytes per trainable parameter for AdamW; none for SGD or with
    `save_only_model`; frozen parameters count as weights, not as optimizer state."""
    model = build_tiny_model(tokenizer, seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert checkpoint_nbytes(model, "adamw_torch") == 4 * n + 8 * n
    assert checkpoint_nbytes(model, "sgd") == checkpoint_nbytes(model, "adamw_torch", save_only_model=True) == 4 * n
    model.get_input_embeddings().weight.requires_grad_(False)
    frozen = model.get_input_embeddings().weight.numel()
    assert checkpoint_nbytes(model, "adamw_torch") == 4 * n + 8 * (n - frozen)


def test_checkpoint_size_counts_adamw_named_by_the_config(tmp_path, tokenizer):
    """`TrainingArguments.optim` is transformers' `OptimizerNames`, a str enum whose `str()` is
    "OptimizerNames.ADAMW_TORCH_FUSED": the estimate read that as "not AdamW" and left out the two fp32 moments, 2/3
    of a real checkpoint (trial 14's N30: 2,151,424 bytes estimated for a 6.5 MB checkpoint)."""
    from transformers.training_args import OptimizerNames

    from trl_trapo import TRAPOConfig

    model = build_tiny_model(tokenizer, seed=0)
    n = sum(p.numel() for p in model.parameters())
    default = TRAPOConfig(output_dir=str(tmp_path), report_to="none").optim
    assert isinstance(default, OptimizerNames) and str(default).startswith("OptimizerNames.")
    assert checkpoint_nbytes(model, default) == checkpoint_nbytes(model, OptimizerNames.ADAMW_TORCH) == 12 * n
    assert checkpoint_nbytes(model, OptimizerNames.SGD) == 4 * n


def test_checkpoint_size_counts_partitioned_parameters_whole(tokenizer):
    """Under DeepSpeed ZeRO-3 a parameter holds an empty local tensor and its whole size in `ds_numel`: the estimate
    counts it whole (reading `numel()` counted 0 bytes, so the disk check could never fire; the sibling of the
    teacher's vocabulary check reading a partitioned weight's shape, issue 40)."""
    model = build_tiny_model(tokenizer, seed=0)
    expected = checkpoint_nbytes(model, "adamw_torch")
    replaced = {}  # tied weights stay one parameter
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in replaced:
                empty = torch.nn.Parameter(torch.empty(0, dtype=param.dtype), requires_grad=param.requires_grad)
                empty.ds_numel = param.numel()
                replaced[id(param)] = empty
            setattr(module, name, replaced[id(param)])
    assert sum(p.numel() for p in model.parameters()) == 0
    assert checkpoint_nbytes(model, "adamw_torch") == expected > 0


def test_atomic_writes_get_the_permissions_of_a_plain_write(tmp_path):
    """`tempfile.mkstemp` makes 0o600 files, so every atomically written file (`eval_results.json`, checkpoint
    state) was unreadable to the group on a shared machine (a fresh user's trial). A new file gets 0o666 less the
    umask, as `open(path, "w")` gives; a replaced file keeps its mode."""
    import stat

    from trl_trapo.checkpoint import atomic_write_json

    umask = os.umask(0o022)
    try:
        path = tmp_path / "results.json"
        atomic_write_json(str(path), {"a": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        os.chmod(path, 0o640)
        atomic_write_json(str(path), {"a": 2})
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
        assert json.loads(path.read_text()) == {"a": 2}
    finally:
        os.umask(umask)


# ---- one run at a time per output_dir (trial 15's C18) ---------------------------------------------------------------
HOLD_LOCK = """
import sys, time
from trl_trapo.saving import hold_output_dir
from trl_trapo import TRAPOConfig
hold_output_dir(TRAPOConfig(output_dir=sys.argv[1], report_to="none"))
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def lock_held_elsewhere(tmp_path):
    """A process that holds the run lock of `tmp_path / "out"` (as a run's job does); yields its pid."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "held"
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_a_run_into_a_folder_in_use_is_refused_naming_the_other_run(
    tmp_path, tokenizer, suite, tiny_trainer, lock_held_elsewhere
):
    out = tmp_path / "out"
    trainer = tiny_trainer(out, tokenizer, suite, max_steps=1)  # building a trainer there is fine
    assert "eval_reward" in trainer.evaluate(suite.eval.select(range(4)))  # so is evaluating
    with pytest.raises(ValueError) as refused:
        trainer.train()
    started = re.escape(", started ") + r"\d\d:\d\d:\d\d"
    assert re.match(
        rf"TRAPOConfig\.output_dir='{re.escape(str(out))}' is in use by another run \(pid {lock_held_elsewhere}"
        rf"{started}\): two runs writing into one folder replace each other's checkpoints and model file by file\. "
        r"Fix: choose another output_dir",
        str(refused.value),
    ), str(refused.value)
    assert trainer.state.global_step == 0 and sorted(os.listdir(out)) == [RUN_LOCK]  # nothing written


def test_the_lock_is_the_processs_own_and_gone_once_the_run_ends(tmp_path, tokenizer, suite, tiny_trainer):
    out = tmp_path / "out"
    args = TRAPOConfig(output_dir=str(out), report_to="none")
    (out).mkdir()
    (out / RUN_LOCK).write_text("{not json")  # left by a run that was killed: not locked, so not in use

    @releases_job_holds
    def job():  # as the jobs do: hold output_dir before building anything; train() takes the hold again
        hold_output_dir(args)
        trainer = tiny_trainer(out, tokenizer, suite, max_steps=1, save_strategy="steps", save_steps=1)
        trainer.train()
        assert (out / RUN_LOCK).exists()  # still the job's, for its final save
        assert json.loads((out / RUN_LOCK).read_text())["pid"] == os.getpid()

    job()
    assert not (out / RUN_LOCK).exists() and run_lock_path(out) not in HELD_LOCKS  # the job's end gives it back
    with pytest.raises(ValueError, match=r"holds the checkpoints of a finished run \(checkpoint-1;"):
        tiny_trainer(out, tokenizer, suite, max_steps=2).train()  # the folder's own checks, as before the lock
    trainer = tiny_trainer(tmp_path / "fresh", tokenizer, suite, max_steps=1)
    trainer.train()  # the API alone: locked while train() runs, the file removed after
    assert not (tmp_path / "fresh" / RUN_LOCK).exists()


def test_the_lock_file_makes_no_folder_look_used(tmp_path):
    from transformers.trainer_utils import get_last_checkpoint

    from trl_trapo.saving import check_earlier_checkpoints, check_output_dir

    args = TRAPOConfig(output_dir=str(tmp_path / "out"), report_to="none")
    path = acquire_run_lock(args)
    try:
        check_output_dir(args)  # not a finished run
        check_earlier_checkpoints(args, None)  # not an unfinished one
        assert get_last_checkpoint(args.output_dir) is None
        assert os.listdir(args.output_dir) == [RUN_LOCK]
    finally:
        release_run_lock(path)


def test_only_the_main_process_locks_and_every_rank_learns_a_refusal(tmp_path, lock_held_elsewhere):
    args = TRAPOConfig(output_dir=str(tmp_path / "out"), report_to="none")
    with output_dir_lock(args, is_main_process=False, agree=lambda refused: refused):  # another rank: no lock
        assert run_lock_path(args.output_dir) not in HELD_LOCKS
    with pytest.raises(ValueError, match=rf"in use by another run \(pid {lock_held_elsewhere}"):
        with output_dir_lock(args, is_main_process=False, agree=lambda refused: 1):  # the main process was refused
            pass
    with pytest.raises(ValueError, match=rf"in use by another run \(pid {lock_held_elsewhere}"):
        with output_dir_lock(args, is_main_process=True):
            pass


@pytest.mark.parametrize("job", ["train", "vlm", "tools"])
def test_each_job_into_a_folder_in_use_is_refused_before_its_model(job, tmp_path, capsys, lock_held_elsewhere):
    from trl_trapo.jobs import commands

    assert commands.main([job, "--output_dir", str(tmp_path / "out"), "--max_steps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"is in use by another run (pid {lock_held_elsewhere}, started " in err, err[-2000:]
    assert os.listdir(tmp_path / "out") == [RUN_LOCK]  # nothing of this run written
