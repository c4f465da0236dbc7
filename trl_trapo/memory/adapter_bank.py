# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The adapter bank of the mixed memory pool: periodic snapshots of a PEFT policy's adapter, rollback, Hub push.

Layout of `output_dir/adapter_bank/`:

| path | content |
|---|---|
| `step-N/adapter_model.safetensors` | the trained adapter's weights at optimizer step N (`get_peft_model_state_dict`) |
| `step-N/adapter_config.json` | its `PeftConfig` (so `PeftModel.from_pretrained(base, "step-N")` loads it) |
| `step-N/trapo_snapshot.json` | step, mean reward and mean KL of the rollouts since the previous snapshot, SHA-256 |
| `index.json` | the bank: every kept snapshot (oldest first), the rollback count |

A snapshot is written into a temporary directory and renamed into place, then the index is replaced atomically: a crash
leaves either the old or the new bank, never a half-written snapshot in the index. Snapshots beyond `max_snapshots`
(oldest first) leave the index at once, but their directories are deleted only when no `checkpoint-N` of the output
directory lists them any more (the Trainer's `save_total_limit` rotation frees them), so that resuming from any kept
checkpoint restores the bank exactly. The index is saved with every checkpoint (`checkpoint-N/trapo/
adapter_bank.json`); resuming restores it, checks every listed snapshot's files against their SHA-256 (a damaged or
missing one is an error naming the file) and deletes the snapshot directories written after that checkpoint by the
run that was killed (the resumed run writes them again).

Rolling back loads a snapshot's weights into the trainable adapter (bit-identical) and **resets Adam's moments and
step count of the adapter's parameters** (their optimizer state is deleted, so the next step re-initialises it and
bias correction starts again): moments accumulated on the abandoned trajectory would otherwise push the restored
weights straight back. The learning-rate schedule continues unchanged. The trainer also empties its replay buffer,
whose behaviour log-probs came from the abandoned policy.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
import time

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from ..checkpoint import CheckpointError, atomic_write_json, sha256_file
from ..models import in_adapter
from ..saving import hub_error, is_hub_error


logger = logging.getLogger(__name__)

INDEX_NAME = "index.json"
META_NAME = "trapo_snapshot.json"
WEIGHTS_NAME = "adapter_model.safetensors"
CONFIG_NAME = "adapter_config.json"
STEP_RE = re.compile(r"^step-(\d+)$")


def _fsync_directory_files(directory: str) -> None:
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as handle:
            os.fsync(handle.fileno())


class AdapterBank:
    """Snapshots of a PEFT adapter on disk, at most `max_snapshots` kept (oldest dropped first).

    Args:
        directory (`str`): the bank's directory (`output_dir/adapter_bank`).
        max_snapshots (`int`): snapshots kept.

    The bank holds no weights in memory; `snapshots` lists what is on disk, each a dict with `step`, `mean_reward`
    (`None` when no rollout was scored since the previous snapshot), `kl`, `path` (relative to `directory`) and
    `files` (name -> SHA-256).
    """

    def __init__(self, directory: str, max_snapshots: int = 10):
        if max_snapshots < 1:
            raise ValueError(f"AdapterBank needs max_snapshots >= 1, got {max_snapshots}.")
        self.directory = directory
        self.max_snapshots = max_snapshots
        self.snapshots: list[dict] = []
        self.rollbacks = 0

    # ---- reading --------------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, directory: str) -> AdapterBank:
        """The bank stored in `directory` (e.g. after training), from its `index.json`.

        Raises:
            CheckpointError: naming `index.json`, if it is missing or corrupted.
        """
        path = os.path.join(directory, INDEX_NAME)
        if not os.path.isfile(path):
            raise CheckpointError(f"{path} is missing: {directory} holds no adapter bank.")
        state = cls._read_index(path)
        bank = cls(directory, int(state.get("max_snapshots", 10)))
        bank.load_state_dict(state, source=path, clean=False)
        return bank

    @staticmethod
    def _read_index(path: str) -> dict:
        try:
            with open(path, encoding="utf-8") as handle:
                state = json.load(handle)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path} is corrupted ({error}).") from error
        if not isinstance(state, dict) or not isinstance(state.get("snapshots"), list):
            raise CheckpointError(f"{path} is corrupted: no 'snapshots' list.")
        return state

    def list(self) -> list[dict]:
        """The kept snapshots, oldest first (copies)."""
        return [dict(s) for s in self.snapshots]

    def get(self, step: int) -> dict:
        """The snapshot of optimizer step `step`.

        Raises:
            KeyError: naming the steps available, if there is none for `step`.
        """
        for snapshot in self.snapshots:
            if snapshot["step"] == step:
                return snapshot
        raise KeyError(
            f"No adapter snapshot of step {step}; the bank holds steps {[s['step'] for s in self.snapshots]}."
        )

    def path(self, step: int) -> str:
        """Directory of the snapshot of step `step` (loadable with `PeftModel.from_pretrained(base, path)`)."""
        return os.path.join(self.directory, self.get(step)["path"])

    def best(self, kl_max: float | None = None) -> dict | None:
        """The snapshot with the highest mean reward (the latest among equals), among those whose KL is at most
        `kl_max` when given; None if no snapshot has a mean reward."""
        candidates = [
            s
            for s in self.snapshots
            if s.get("mean_reward") is not None and (kl_max is None or s.get("kl") is None or s["kl"] <= kl_max)
        ]
        return max(candidates, key=lambda s: (s["mean_reward"], s["step"])) if candidates else None

    def verify(self, snapshot: dict) -> None:
        """Check a snapshot's files against the SHA-256 recorded when it was written.

        Raises:
            CheckpointError: naming the missing or damaged file.
        """
        directory = os.path.join(self.directory, snapshot["path"])
        for name, digest in snapshot["files"].items():
            path = os.path.join(directory, name)
            if not os.path.isfile(path):
                raise CheckpointError(f"{path} is missing from the adapter bank.")
            if sha256_file(path) != digest:
                raise CheckpointError(f"{path} is corrupted or truncated: its SHA-256 differs from the one recorded.")

    def read_weights(self, step: int, verify: bool = True) -> dict[str, torch.Tensor]:
        """The adapter weights of a snapshot (PEFT's keys, without the adapter name)."""
        snapshot = self.get(step)
        if verify:
            self.verify(snapshot)
        path = os.path.join(self.directory, snapshot["path"], WEIGHTS_NAME)
        with open(path, "rb") as handle:
            data = handle.read()
        try:
            return safetensors_load(data)
        except Exception as error:  # safetensors raises several types
            raise CheckpointError(f"{path} is corrupted ({type(error).__name__}: {error}).") from error

    # ---- writing --------------------------------------------------------------------------------------------------
    def snapshot(
        self, model, step: int, mean_reward: float | None = None, kl: float | None = None, adapter_name=None
    ) -> dict:
        """Write the adapter of `model` (a `PeftModel`) as the snapshot of step `step`, then drop the oldest beyond
        `max_snapshots`. Call on the main process only (the weights must be complete: not ZeRO-3 partitioned).

        Returns:
            `dict`: the snapshot's index entry.
        """
        from peft import get_peft_model_state_dict

        adapter_name = adapter_name or model.active_adapter
        state = get_peft_model_state_dict(model, adapter_name=adapter_name)
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
        os.makedirs(self.directory, exist_ok=True)
        name = f"step-{step}"
        temporary = tempfile.mkdtemp(dir=self.directory, prefix=f".tmp-{name}-")
        try:
            with open(os.path.join(temporary, WEIGHTS_NAME), "wb") as handle:
                handle.write(safetensors_save(tensors, metadata={"format": "pt"}))
            model.peft_config[adapter_name].save_pretrained(temporary)
            files = {f: sha256_file(os.path.join(temporary, f)) for f in sorted(os.listdir(temporary))}
            entry = {
                "step": int(step),
                "mean_reward": None if mean_reward is None or not math.isfinite(mean_reward) else float(mean_reward),
                "kl": None if kl is None or not math.isfinite(kl) else float(kl),
                "path": name,
                "adapter_name": adapter_name,
                "created": time.time(),
                "files": files,
            }
            with open(os.path.join(temporary, META_NAME), "w", encoding="utf-8") as handle:
                json.dump(entry, handle, indent=1, sort_keys=True)
            _fsync_directory_files(temporary)
            final = os.path.join(self.directory, name)
            if os.path.exists(final):  # a snapshot of this step from a killed run that the index does not list
                shutil.rmtree(final)
            os.replace(temporary, final)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        self.snapshots = [s for s in self.snapshots if s["step"] != step] + [entry]
        self.snapshots.sort(key=lambda s: s["step"])
        self.snapshots = self.snapshots[max(len(self.snapshots) - self.max_snapshots, 0) :]
        self.write_index()
        self.purge()
        return dict(entry)

    def pinned(self) -> set[str]:
        """Snapshot directories listed by a `checkpoint-N/trapo/adapter_bank.json` next to the bank (unreadable
        indexes of damaged checkpoints pin nothing)."""
        root = os.path.dirname(os.path.abspath(self.directory))
        out: set[str] = set()
        for name in os.listdir(root) if os.path.isdir(root) else []:
            path = os.path.join(root, name, "trapo", "adapter_bank.json")
            if name.startswith("checkpoint-") and os.path.isfile(path):
                try:
                    out.update(str(s["path"]) for s in self._read_index(path)["snapshots"])
                except (CheckpointError, KeyError, TypeError):
                    continue
        return out

    def purge(self, newer_than: int | None = None) -> None:
        """Delete snapshot directories that neither the index nor any checkpoint lists, and (`newer_than`) every
        unlisted one of a later step (left by a killed run), plus temporary directories of interrupted writes."""
        if not os.path.isdir(self.directory):
            return
        listed = {s["path"] for s in self.snapshots}
        pinned = self.pinned()
        for name in os.listdir(self.directory):
            match = STEP_RE.match(name)
            stale = match is not None and name not in listed
            if stale and name in pinned and (newer_than is None or int(match.group(1)) <= newer_than):
                stale = False
            if stale or name.startswith(".tmp-step-"):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def write_index(self) -> None:
        """Replace `index.json` atomically with the current state."""
        atomic_write_json(os.path.join(self.directory, INDEX_NAME), self.state_dict())

    # ---- restoring ------------------------------------------------------------------------------------------------
    def load(self, model, step: int, adapter_name=None, verify: bool = True) -> None:
        """Load the snapshot of `step` into the adapter `adapter_name` (default: the active one) of `model`, exactly.

        Raises:
            CheckpointError: naming the file, if the snapshot is damaged.
            ValueError: if the snapshot does not match the model's adapter (other target modules or rank).
        """
        from peft import set_peft_model_state_dict

        adapter_name = adapter_name or model.active_adapter
        weights = self.read_weights(step, verify=verify)
        params = dict(model.named_parameters())
        expected = {k for k in params if in_adapter(k, adapter_name)}
        result = set_peft_model_state_dict(model, weights, adapter_name=adapter_name)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        missing = [k for k in getattr(result, "missing_keys", []) or [] if k in expected]
        if unexpected or missing:
            raise ValueError(
                f"Adapter snapshot of step {step} does not match adapter '{adapter_name}' of the model "
                f"(unexpected {unexpected[:3]}, missing {missing[:3]}): it was taken from another adapter configuration."
            )

    def rollback(self, model, step: int, optimizer=None, adapter_name=None) -> list[torch.nn.Parameter]:
        """Load the snapshot of `step` and reset the optimizer state (Adam moments, step count) of the adapter's
        parameters; count the rollback.

        Returns:
            `list[nn.Parameter]`: the adapter parameters whose optimizer state was reset.
        """
        adapter_name = adapter_name or model.active_adapter
        self.load(model, step, adapter_name)
        params = [p for n, p in model.named_parameters() if in_adapter(n, adapter_name) and p.requires_grad]
        inner = optimizer
        while (
            inner is not None and not isinstance(getattr(inner, "state", None), dict) and hasattr(inner, "optimizer")
        ):
            inner = inner.optimizer  # accelerate's AcceleratedOptimizer wraps the torch optimizer
        if inner is not None and isinstance(getattr(inner, "state", None), dict):
            for param in params:
                inner.state.pop(param, None)
        self.rollbacks += 1
        return params

    def state_dict(self) -> dict:
        return {
            "format": 1,
            "max_snapshots": self.max_snapshots,
            "snapshots": [dict(s) for s in self.snapshots],
            "rollbacks": self.rollbacks,
        }

    def load_state_dict(
        self, state: dict, source: str = "adapter bank state", clean: bool = True, step: int | None = None
    ) -> None:
        """Restore the index from `state`, checking every listed snapshot's files.

        Args:
            clean (`bool`): also rewrite `index.json` and delete snapshot directories nothing lists (see `purge`).
            step (`int`, *optional*): the step resumed from: unlisted snapshots of later steps are deleted even if
                a (newer) checkpoint lists them.

        Raises:
            CheckpointError: naming `source` if the state is malformed, or the snapshot file that is damaged.
        """
        try:
            snapshots = [dict(s) for s in state["snapshots"]]
            for s in snapshots:
                int(s["step"]), str(s["path"]), dict(s["files"])
            rollbacks = int(state.get("rollbacks", 0))
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{source} is corrupted ({type(error).__name__}: {error}).") from error
        for snapshot in snapshots:
            self.verify(snapshot)
        self.snapshots = sorted(snapshots, key=lambda s: s["step"])
        self.rollbacks = rollbacks
        if clean and os.path.isdir(self.directory):
            self.write_index()
            self.purge(newer_than=step)

    # ---- the Hub --------------------------------------------------------------------------------------------------
    def model_card(self, step: int, repo_id: str, base_model: str | None = None) -> str:
        """A model card (README.md) for the snapshot of `step`."""
        snapshot = self.get(step)
        reward = "n/a" if snapshot.get("mean_reward") is None else f"{snapshot['mean_reward']:.4f}"
        kl = "n/a" if snapshot.get("kl") is None else f"{snapshot['kl']:.4f}"
        header = ["---", "library_name: peft"]
        if base_model:
            header.append(f"base_model: {base_model}")
        header += ["tags:", "- trl", "- trapo", "- lora", "---", ""]
        load_base = base_model or "<base model>"
        body = f"""# {repo_id}

A LoRA adapter snapshot taken by [trl-trapo](https://github.com/huggingface/trl)'s adapter bank at optimizer step
{snapshot["step"]} of a TRAPO run (pretraining, SFT and RL trained jointly).

| step | mean reward since the previous snapshot | mean per-sequence KL to the reference (nats) |
|---|---|---|
| {snapshot["step"]} | {reward} | {kl} |

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM

model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("{load_base}"), "{repo_id}")
```
"""
        return "\n".join(header) + body

    def push_to_hub(
        self,
        step: int,
        repo_id: str,
        *,
        base_model: str | None = None,
        token: str | None = None,
        private: bool | None = None,
        revision: str | None = None,
        commit_message: str | None = None,
    ):
        """Upload the snapshot of `step` (adapter weights, config, snapshot metadata) and its model card to the Hub.

        Creates the repository if needed, then makes one commit. Needs network access and a token.

        Returns:
            The `CommitInfo` of `HfApi.create_commit`.

        Raises:
            HubPushError: naming the Hugging Face Hub, `repo_id` and the fixes, if the Hub cannot be reached or
                refuses (the snapshot on disk is untouched).
        """
        from huggingface_hub import CommitOperationAdd, HfApi

        snapshot = self.get(step)
        self.verify(snapshot)
        directory = os.path.join(self.directory, snapshot["path"])
        operations = [
            CommitOperationAdd(path_in_repo=name, path_or_fileobj=os.path.join(directory, name))
            for name in sorted(os.listdir(directory))
        ]
        card = self.model_card(step, repo_id, base_model).encode("utf-8")
        operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card))
        try:
            api = HfApi(token=token)
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            return api.create_commit(
                repo_id,
                operations,
                commit_message=commit_message or f"TRAPO adapter snapshot of step {step}",
                repo_type="model",
                revision=revision,
            )
        except Exception as error:
            if not is_hub_error(error):
                raise
            raise hub_error(repo_id, error, directory) from error


__all__ = ["AdapterBank"]
