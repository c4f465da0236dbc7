# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`TRAPOTrainer`'s durable state and saving: the public `train` hook (resuming from the newest complete
checkpoint), TRAPO's own per-rank state written into each `checkpoint-N` (by `callbacks.StateCheckpointCallback`) and read back,
and the public `save_model` hook.

`DurableStateMixin` is one of `TRAPOTrainer`'s bases; its methods are the trainer's own and use its attributes.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from .checkpoint import (
    CheckpointError,
    last_complete_checkpoint,
    read_rank_state,
    restore_rng,
    rng_tensors,
    verify_checkpoint,
    write_rank_state,
)
from .distributed import full_state_dict, load_full_state_dict


logger = logging.getLogger("trl_trapo.trainer")  # the trainer's logger: these are TRAPOTrainer's methods


class DurableStateMixin:
    """`TRAPOTrainer`'s resumable state and model saving (public Trainer hooks: `train`, `save_model`)."""

    # =================================================================================================================
    # Durable state (public Trainer hook: train; callback: on_save)
    # =================================================================================================================
    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train`, resuming TRAPO's own state too.

        `resume_from_checkpoint=True` picks the newest *complete* checkpoint of `output_dir` (one a run was killed
        while writing is skipped, with a warning saying why); an explicit path must be complete.

        Raises:
            CheckpointError: naming the file, if the checkpoint to resume from is incomplete or corrupted, or if
                `resume_from_checkpoint=True` finds no complete checkpoint.
        """
        world = self.accelerator.num_processes
        if resume_from_checkpoint is True:
            path, skipped = last_complete_checkpoint(self.args.output_dir, world)
            for reason in skipped:
                logger.warning("Not resuming from an incomplete checkpoint: %s", reason)
            if path is None:
                raise CheckpointError(
                    f"resume_from_checkpoint=True, but {self.args.output_dir} holds no complete checkpoint"
                    + (f" ({skipped[0]})" if skipped else "")
                    + ". Pass a path, or start without resuming."
                )
            resume_from_checkpoint = path
        self._train_start_time = time.perf_counter()
        if resume_from_checkpoint:
            verify_checkpoint(resume_from_checkpoint, world)
            self._load_trapo_state(resume_from_checkpoint)
            logger.info("Resuming from %s", resume_from_checkpoint)
        return super().train(
            resume_from_checkpoint=resume_from_checkpoint,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kwargs,
        )

    def _generators(self) -> dict[str, torch.Generator]:
        return {"rows": self._row_generator, "generation": self._generation_generator}

    def _save_trapo_state(self, checkpoint_dir: str) -> None:
        replay_meta, replay_tensors = self.replay.state_dict()
        state = {
            "format": 1,
            "global_step": self.state.global_step,
            "world_size": self.accelerator.num_processes,
            "episode": self._episode,
            "nonfinite_steps": self._nonfinite_steps,
            "allocator": self.allocator.state_dict(),
            "dare": self.dare.engine.state_dict(),
            "replay": replay_meta,
            "prompt_sampler": self._prompt_sampler.state_dict() if self._prompt_sampler else None,
            "sft_pool": self._sft_pool.state_dict() if self._sft_pool else None,
            "pretrain_stream": self._pretrain_stream.state_dict() if self._pretrain_stream else None,
            "schedules": self.schedules.state_dict(),
        }
        state["memory_pool"], memory_files = self.memory_pool.state_dict(
            self.state.global_step
        )  # SFT priorities, few-shot, adapter bank
        tensors = {**replay_tensors, **rng_tensors(self._generators())}
        if self.args.sync_ref_model and self.ref_model is not None:  # the reference has moved: keep it
            ref_state = full_state_dict(self.accelerator.unwrap_model(self.ref_model))  # ZeRO-3: gathered
            tensors.update({f"ref_model/{k}": v for k, v in ref_state.items()})
        compress = self.replay.nbytes > 64 * 2**20
        self.accelerator.wait_for_everyone()  # rank 0 fingerprints the Trainer's files: they must be complete
        write_rank_state(checkpoint_dir, self.accelerator.process_index, state, tensors, compress, memory_files)

    def _load_trapo_state(self, checkpoint_dir: str) -> None:
        rank = self.accelerator.process_index
        state, tensors = read_rank_state(checkpoint_dir, rank)
        source = os.path.join(checkpoint_dir, "trapo", f"rank{rank}.json")
        try:
            if state.get("format") != 1:
                raise CheckpointError(f"{source} has an unknown format {state.get('format')!r}.")
            for name, part in (
                ("prompt_sampler", self._prompt_sampler),
                ("sft_pool", self._sft_pool),
                ("pretrain_stream", self._pretrain_stream),
            ):
                if (state.get(name) is None) != (part is None):
                    raise CheckpointError(
                        f"{source}: the checkpoint was made with a different set of datasets ('{name}' "
                        f"{'missing' if state.get(name) is None else 'present'}); resume with the same datasets."
                    )
                if part is not None:
                    part.load_state_dict(state[name])
            self._episode = int(state["episode"])
            self._nonfinite_steps = int(state["nonfinite_steps"])
            self.allocator.load_state_dict(state["allocator"])
            self.dare.engine.load_state_dict(state["dare"])
            self.schedules.load_state_dict(state.get("schedules"))
            self.replay.load_state_dict(state["replay"], tensors)
            restore_rng(self._generators(), tensors, source)
            ref_state = {k[len("ref_model/") :]: v for k, v in tensors.items() if k.startswith("ref_model/")}
            if ref_state:
                load_full_state_dict(self.accelerator.unwrap_model(self.ref_model), ref_state)
            self.memory_pool.load_state_dict(state.get("memory_pool"), checkpoint_dir)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{source} cannot be restored: {type(error).__name__}: {error}") from error

    # =================================================================================================================
    # Saving (public Trainer hook: save_model)
    # =================================================================================================================
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the policy so that `from_pretrained` reloads it (only the adapter for a PEFT policy).

        Without a critic this is the Trainer's own `save_model` (which gathers DeepSpeed ZeRO-3 / FSDP weights). With
        a critic, checkpoints (`checkpoint-N` directories) hold the policy and the critic together so training can
        resume, and every other save writes the policy alone, gathered from the DDP / DeepSpeed wrapper first —
        never the wrapper itself.
        """
        is_checkpoint = (
            _internal_call
            and output_dir is not None
            and os.path.basename(os.path.normpath(output_dir)).startswith("checkpoint-")
        )
        if not self._has_critic or is_checkpoint:
            return super().save_model(output_dir, _internal_call)
        output_dir = output_dir or self.args.output_dir
        source = self.model_wrapped if self.is_deepspeed_enabled else self.model
        state = self.accelerator.get_state_dict(source)  # collective under ZeRO-3: every rank takes part
        if self.args.should_save:
            policy = self._unwrapped_policy()
            policy_state = {k[len("policy.") :]: v for k, v in state.items() if k.startswith("policy.")}
            os.makedirs(output_dir, exist_ok=True)
            policy.save_pretrained(output_dir, state_dict=policy_state)
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)
