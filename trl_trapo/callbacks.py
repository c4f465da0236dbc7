# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Every `TrainerCallback` of TRAPO, in one place. Each takes the narrow handles it needs, never the trainer.

| callback | hook | what it does |
|---|---|---|
| [`SyncReferenceCallback`] | `on_step_end` | ref <- alpha * policy + (1 - alpha) * ref every `ref_model_sync_steps` (TR-DPO) |
| [`AdaptiveKLCallback`] | `on_step_end` | updates the adaptive KL coefficient from the step's rollouts (all ranks) |
| [`StateCheckpointCallback`] | `on_save` | writes TRAPO's own state into each `checkpoint-N` after the Trainer's files |
| [`AdapterBankCallback`] | `on_step_end` | adapter snapshots every `adapter_snapshot_steps`, automatic rollback |
| [`DDPCommHookCallback`] | `on_train_begin` | registers the fp16 / bf16 / PowerSGD DDP communication hook |
| [`WeightSnapshotCallback`] | `on_train_begin`, `on_step_end` | the async producer's weights under ZeRO-3, every `weight_sync_steps` (all ranks) |
| [`StopOnSignalCallback`] | `on_step_end` | after SIGINT / SIGTERM / SIGHUP on any rank: save `checkpoint-N` and stop (all ranks) |
| [`EpochCallback`] | `on_step_end`, `on_epoch_end` | `state.epoch` = passes over the dataset that sizes the run; epoch-end log / eval / save at each pass's end |
| [`ShortProgressCallback`], [`ShortPrinterCallback`] | `on_log` | `console_metrics="short"`: the console's line of a training step shows `CONSOLE_METRICS` only |

What is not a callback — the curriculum, DARE, the KL / entropy / learning-rate schedules — is a plain object the
trainer asks at the right point of a step.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import signal
from collections.abc import Callable

import torch
from torch import nn
from transformers import TrainerCallback
from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback, ProgressCallback
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from .checkpoint import CheckpointError
from .distributed import end_process_group_at_exit, max_over_ranks, register_ddp_comm_hook
from .interrupts import Interruption, SignalCatcher
from .memory.adapter_bank import AdapterBank
from .models import ReferencePolicy
from .schedules import RLSchedules


logger = logging.getLogger(__name__)


class SyncReferenceCallback(TrainerCallback):
    """ref <- alpha * policy + (1 - alpha) * ref every `ref_model_sync_steps` optimizer steps (TR-DPO,
    huggingface.co/papers/2404.09656), through [`ReferencePolicy.sync`].

    Args:
        reference ([`ReferencePolicy`]): the reference to move.
        policy (`Callable[[], nn.Module]`): returns the unwrapped policy.
    """

    def __init__(self, reference: ReferencePolicy, policy: Callable[[], nn.Module]):
        self.reference = reference
        self.policy = policy

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps == 0:
            self.reference.sync(self.policy(), args.ref_model_mixup_alpha)
        return control


class AdaptiveKLCallback(TrainerCallback):
    """At the end of every optimizer step, feeds the step's rollouts to the adaptive KL controller (see
    [`~trl_trapo.schedules.RLSchedules.end_step`]); the next step's rollouts and loss use the new coefficient.

    Args:
        schedules ([`~trl_trapo.schedules.RLSchedules`]): holds the controller and the window of rollouts.
        reduce (`Callable[[torch.Tensor], torch.Tensor]`): sums a tensor over ranks.
    """

    def __init__(self, schedules: RLSchedules, reduce: Callable[[torch.Tensor], torch.Tensor]):
        self.schedules = schedules
        self.reduce = reduce

    def on_step_end(self, args, state, control, **kwargs):
        self.schedules.end_step(state.global_step - 1, self.reduce)
        return control


class WeightSnapshotCallback(TrainerCallback):
    """Takes the asynchronous producer's weights on a schedule every rank reaches: once at `on_train_begin` (the
    producer's first copy, the whole policy) and at the end of every `every`-th optimizer step (the trainable
    parameters, version `state.global_step`), through
    [`~trl_trapo.async_rollouts.AsyncRolloutSource.take_weight_snapshot`].

    Under DeepSpeed ZeRO-3 reading the weights gathers the partitioned parameters, a collective: a rank's rollout
    source asks for rounds at its own steps (its replay buffer runs low when it does), so it cannot gather there; it
    sends the last snapshot instead (docs/async.md, "Several processes").

    Args:
        snapshot (`Callable[[int, bool], None]`): `take_weight_snapshot(step, first)` (collective).
        every (`int`): `weight_sync_steps`.
    """

    def __init__(self, snapshot: Callable[[int, bool], None], every: int):
        self.snapshot = snapshot
        self.every = int(every)

    def on_train_begin(self, args, state, control, **kwargs):
        self.snapshot(state.global_step, True)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self.snapshot(state.global_step, False)
        return control


class StateCheckpointCallback(TrainerCallback):
    """Writes TRAPO's own state into each `checkpoint-N` directory right after the Trainer has written its files.

    Which directory, and whether there is one, comes from `checkpoint`: the folder the Trainer's checkpoint save was
    given (every rank is given the same), never from what this rank sees on disk. `save_state` is collective (its
    barriers), so every rank must decide alike: the folder may not exist yet for a rank that writes nothing into it
    before `on_save` (only rank 0 writes the model; with `save_only_model` no rank writes an RNG file) or may be
    moved aside for a moment while rank 0 replaces an earlier same-numbered folder — a rank deciding from
    `os.path.isdir` skipped the save that the others were waiting in (a hang, seen on a loaded 2-core machine).

    Args:
        save_state (`Callable[[str], None]`): writes the state into the checkpoint directory it is given (collective).
        checkpoint (`Callable[[], str | None]`): the checkpoint folder being saved, or None if none is.
    """

    def __init__(self, save_state: Callable[[str], None], checkpoint: Callable[[], str | None]):
        self.save_state = save_state
        self.checkpoint = checkpoint

    def on_save(self, args, state, control, **kwargs):
        directory = self.checkpoint()
        if directory is not None:
            self.save_state(directory)
        return control


class AdapterBankCallback(TrainerCallback):
    """Snapshots the PEFT policy's adapter every `every` optimizer steps and, optionally, rolls back automatically.

    The memory pool reports each generation round with `observe_rollouts` (scores and per-sequence KL); at every
    snapshot step the window since the previous snapshot is reduced over ranks (every rank takes the same decision)
    and:

    - with `reward_drop = f`: if the window's mean reward is below `best - f * |best|` (best: the highest mean reward
      of a kept snapshot whose KL is within `kl_max`), or
    - with `kl_max = k`: if the window's mean per-sequence KL is above `k`,

    the policy is rolled back to that best snapshot (see [`AdapterBank.rollback`]), `on_rollback` runs (the trainer
    empties its replay buffer, whose behaviour log-probs came from the abandoned policy), the rollback is logged
    (warning, and `adapter_bank/rollbacks`), and no snapshot is taken of the abandoned policy. Otherwise a snapshot is
    written (main process). `rollback(step)` rolls back by hand at any time.

    Args:
        bank ([`AdapterBank`]): where the snapshots live.
        policy (`Callable[[], nn.Module]`): returns the unwrapped PEFT policy.
        accelerator: the Trainer's `Accelerator` (rank, reductions, barriers).
        on_rollback (`Callable[[], None]`): called after every rollback.
        every (`int`): `adapter_snapshot_steps`.
        reward_drop (`float`, *optional*): `adapter_rollback_reward_drop`.
        kl_max (`float`, *optional*): `adapter_rollback_kl_max`.
    """

    def __init__(
        self,
        bank: AdapterBank,
        policy: Callable[[], nn.Module],
        accelerator,
        on_rollback: Callable[[], None],
        every: int,
        reward_drop: float | None = None,
        kl_max: float | None = None,
    ):
        self.bank = bank
        self.policy = policy
        self.accelerator = accelerator
        self.on_rollback = on_rollback
        self.every = int(every)
        self.reward_drop = reward_drop
        self.kl_max = kl_max
        self.window = torch.zeros(3, dtype=torch.float64)  # (sum of scores, sum of per-sequence KL, rollouts)
        self.optimizer = None  # the Trainer's, once training runs (its Adam moments are reset on rollback)
        self.global_step = 0

    def observe_rollouts(self, scores: torch.Tensor, kl_per_sequence: torch.Tensor | None) -> None:
        """Add a generation round: `(B,)` scores (NaN = no reward, skipped) and `(B,)` per-sequence KL (nats)."""
        valid = ~torch.isnan(scores)
        self.window[0] += float(scores[valid].sum())
        if kl_per_sequence is not None:
            self.window[1] += float(kl_per_sequence[valid].sum())
        self.window[2] += float(valid.sum())

    def _reduced_window(self) -> tuple[float | None, float | None]:
        window = self.window
        if self.accelerator.num_processes > 1:
            window = self.accelerator.reduce(window.to(self.accelerator.device), reduction="sum").cpu()
        if window[2] <= 0:
            return None, None
        return float(window[0] / window[2]), float(window[1] / window[2])

    def should_roll_back(self, mean_reward: float | None, kl: float | None) -> dict | None:
        """The snapshot to roll back to, or None (see the class docstring for the rule)."""
        if mean_reward is None or (self.reward_drop is None and self.kl_max is None):
            return None
        best = self.bank.best(self.kl_max)
        if best is None:
            return None
        dropped = self.reward_drop is not None and mean_reward < best["mean_reward"] - self.reward_drop * abs(
            best["mean_reward"]
        )
        too_far = self.kl_max is not None and kl is not None and kl > self.kl_max
        return best if (dropped or too_far) else None

    def rollback(self, step: int) -> None:
        """Roll the policy back to the snapshot of `step` (every rank), reset the adapter's optimizer state, run
        `on_rollback`."""
        self.bank.rollback(self.policy(), step, self.optimizer)
        self.on_rollback()
        logger.warning(
            "Step %d: rolled the adapter back to the snapshot of step %d (rollback %d); Adam moments of the adapter "
            "reset, replay buffer emptied.",
            self.global_step,
            step,
            self.bank.rollbacks,
        )

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        self.optimizer = optimizer
        self.global_step = state.global_step
        return control

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self.optimizer = optimizer if optimizer is not None else self.optimizer
        step = self.global_step = state.global_step
        if self.every <= 0 or step % self.every:
            return control
        mean_reward, kl = self._reduced_window()
        self.window.zero_()
        target = self.should_roll_back(mean_reward, kl)
        if target is not None:
            logger.warning(
                "Step %d: mean reward %.4g / KL %s against the best snapshot (step %d, reward %.4g): rolling back.",
                step,
                mean_reward,
                "n/a" if kl is None else f"{kl:.4g}",
                target["step"],
                target["mean_reward"],
            )
            self.rollback(target["step"])
            if self.accelerator.is_main_process:
                self.bank.write_index()
            return control
        if self.accelerator.is_main_process:
            self.bank.snapshot(self.policy(), step, mean_reward, kl)
        else:  # keep every rank's index identical (the files are rank 0's)
            entry = {"step": step, "mean_reward": mean_reward, "kl": kl, "path": f"step-{step}", "files": {}}
            self.bank.snapshots = sorted(
                [s for s in self.bank.snapshots if s["step"] != step] + [entry], key=lambda s: s["step"]
            )[-self.bank.max_snapshots :]
        self.accelerator.wait_for_everyone()
        return control

    def metrics(self) -> dict[str, float]:
        """`adapter_bank/snapshots` (kept) and `adapter_bank/rollbacks` (so far)."""
        return {
            "adapter_bank/snapshots": float(len(self.bank.snapshots)),
            "adapter_bank/rollbacks": float(self.bank.rollbacks),
        }

    def state_dict(self, global_step: int) -> dict:
        """The bank's index and the current window, for the checkpoint of optimizer step `global_step`."""
        return {**self.bank.state_dict(), "window": self.window.tolist(), "global_step": global_step}

    def load_state_dict(self, state: dict, source: str) -> None:
        """Restore the bank's index (checking the snapshots on disk) and the current window.

        Raises:
            CheckpointError: naming `source`, if the state is damaged.
        """
        if self.accelerator.is_main_process:
            self.bank.load_state_dict(state, source=source, clean=True, step=state.get("global_step"))
        else:
            self.bank.snapshots = [dict(s) for s in state["snapshots"]]
            self.bank.rollbacks = int(state.get("rollbacks", 0))
        try:
            self.window = torch.tensor([float(x) for x in state["window"]], dtype=torch.float64)
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{source} is corrupted (window: {error}).") from error


class DDPCommHookCallback(TrainerCallback):
    """Registers `args.ddp_comm_hook` (fp16 / bf16 / PowerSGD) on the DDP-wrapped model at the start of training.

    Args:
        wrapped_model (`Callable[[], nn.Module]`): returns the model as the Trainer wrapped it (the DDP module once
            training starts).
        accelerator: the Trainer's `Accelerator`.

    Raises:
        ValueError: at `train()`, if a hook is asked for on several processes that are not DDP (DeepSpeed and FSDP
            communicate through their own collectives, which these hooks do not apply to).
    """

    def __init__(self, wrapped_model: Callable[[], nn.Module], accelerator):
        self.wrapped_model = wrapped_model
        self.accelerator = accelerator

    def on_train_begin(self, args, state, control, **kwargs):
        name = args.ddp_comm_hook
        if name == "none":
            return control
        model = self.wrapped_model()
        if not isinstance(model, nn.parallel.DistributedDataParallel):
            if self.accelerator.num_processes == 1:  # warned about at construction (`assembly.build_callbacks`)
                return control
            raise ValueError(
                f"TRAPOConfig.ddp_comm_hook={name!r} needs DDP, but this run uses "
                f"{self.accelerator.distributed_type}. Set ddp_comm_hook='none' (DeepSpeed / FSDP have their "
                "own communication settings) or launch with plain DDP."
            )
        register_ddp_comm_hook(model, name, args.powersgd_rank, args.powersgd_start_iter)
        return control


class EndProcessGroupAtExitCallback(TrainerCallback):
    """Once training has finished on every rank, have the process group ended in order when the interpreter exits
    ([`~trl_trapo.distributed.end_process_group_at_exit`]): a multi-process script that does not end it itself (a TRL
    script) no longer risks gloo's abort at exit. A no-op in one process."""

    def on_train_end(self, args, state, control, **kwargs):
        end_process_group_at_exit()
        return control


class StopOnSignalCallback(TrainerCallback):
    """Stops training cleanly after SIGINT / SIGTERM / SIGHUP: at the end of the optimizer step during which a rank
    received one (see [`~trl_trapo.interrupts.SignalCatcher`]), every rank agrees to stop (one all-gather per step, at
    the same point on every rank), the Trainer saves the normal `checkpoint-N` (with TRAPO's state,
    `StateCheckpointCallback`) whatever `save_strategy` says, skips any evaluation due at that step, and stops.
    `interruption` then says where.

    Args:
        catcher ([`~trl_trapo.interrupts.SignalCatcher`]): the flag the signal handlers set.
        accelerator: the Trainer's `Accelerator` (the agreement is a collective).

    Attributes:
        interruption ([`~trl_trapo.interrupts.Interruption`] or None): set when the run stopped on a signal; reset at
            the start of every `train()`.
    """

    def __init__(self, catcher: SignalCatcher, accelerator):
        self.catcher = catcher
        self.accelerator = accelerator
        self.interruption: Interruption | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.interruption = None
        return control

    def on_step_end(self, args, state, control, **kwargs):
        received = self.catcher.received
        signum = max_over_ranks(self.accelerator, int(received) if received is not None else 0)
        if signum:
            directory = os.path.abspath(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
            self.interruption = Interruption(signal.Signals(signum), state.global_step, directory)
            control.should_save = True
            control.should_training_stop = True
            control.should_evaluate = False
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.interruption is not None:  # saved at the step's end already; no evaluation either
            control.should_save = False
            control.should_evaluate = False
        return control


class EpochCallback(TrainerCallback):
    """`state.epoch` as passes over the dataset whose passes are the run's epochs, and the Trainer's end-of-epoch log,
    evaluation and save (`logging_strategy` / `eval_strategy` / `save_strategy="epoch"`) at the end of each pass.

    transformers counts epochs over the train dataloader, which in TRAPO is a stream of step tickets (one epoch of them
    is the planned steps split in `num_train_epochs`, the whole run with `max_steps`): that count said nothing about
    the data. Here an epoch is one pass over the dataset that sizes the run
    ([`~trl_trapo.objectives.epoch_rows`]: the RL prompts, else the SFT rows, ...), measured by the rows its objective
    was served so far, all ranks together (the row allocator's, identical on every rank and restored on resume):
    `epoch = rows served / rows of one pass`, fractional. It is set at every step's end, before any other callback
    reads it (the trainer places this callback right after the Trainer's `DefaultFlowCallback`), so the logs,
    `TrainOutput.metrics["epoch"]` and each checkpoint's `trainer_state.json` carry it.

    When a step ends a pass, the step gets what the Trainer does at an epoch's end (`DefaultFlowCallback.on_epoch_end`:
    log, evaluate past `eval_delay`, save, as the strategies say). At the Trainer's own epoch ends of its tickets that
    flow is undone (they are not passes over the data), except at the run's last, where the Trainer (as TRL does)
    logs, evaluates and saves unless this step's pass end already did. Callbacks' own `on_epoch_end` still run at the
    Trainer's epoch ends.

    Args:
        rows_served (`Callable[[], int]`): rows the dataset's objective was served so far by all ranks together, the
            same value on every rank.
        rows_per_pass (`int`): rows one pass over the dataset gives its objective (> 0).
    """

    def __init__(self, rows_served: Callable[[], int], rows_per_pass: int):
        if rows_per_pass < 1:
            raise ValueError(f"EpochCallback needs rows_per_pass >= 1, got {rows_per_pass}.")
        self.rows_served, self.rows_per_pass = rows_served, int(rows_per_pass)
        self.flow = DefaultFlowCallback()  # what the Trainer does at an epoch's end
        self.passes = 0  # whole passes done at the last step's end
        self.pass_end_step: int | None = None  # the last step that ended a pass

    def epoch(self) -> float:
        """Passes over the dataset so far (fractional)."""
        return self.rows_served() / self.rows_per_pass

    def on_train_begin(self, args, state, control, **kwargs):
        self.passes = self.rows_served() // self.rows_per_pass  # a resumed run's allocator is restored by now
        self.pass_end_step = None
        return control

    def on_step_end(self, args, state, control, **kwargs):
        served = self.rows_served()
        state.epoch = served / self.rows_per_pass
        if served // self.rows_per_pass > self.passes:
            self.passes = served // self.rows_per_pass
            self.pass_end_step = state.global_step
            control = self.flow.on_epoch_end(args, state, control)
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_training_stop and state.global_step != self.pass_end_step:
            return control  # the run's end: the Trainer's epoch-end flow stands
        if args.logging_strategy == IntervalStrategy.EPOCH:
            control.should_log = False
        if args.eval_strategy == IntervalStrategy.EPOCH:
            control.should_evaluate = False
        if args.save_strategy == SaveStrategy.EPOCH:
            control.should_save = False
        return control


NEEDED_CALLBACKS = {
    StateCheckpointCallback: (
        "it writes TRAPO's state (trapo/: the data positions, DARE's weights, the random generators, ...) into each "
        "checkpoint-N, so the checkpoints this run saves cannot be resumed (resume_from_checkpoint refuses them)"
    ),
    StopOnSignalCallback: (
        "it saves a checkpoint and stops at the end of the step when Ctrl-C / SIGTERM arrives, so a signal is held "
        "until training ends (a second Ctrl-C aborts without a checkpoint)"
    ),
}
"""TRAPO's callbacks a resumable run needs -> what is lost without them (`trainer.pop_callback` /
`remove_callback` take them out as any other; trial 15's N31)."""


def warn_removed_callbacks(added: list, present: list) -> str | None:
    """Warn when a callback TRAPO added at construction and needs ([`NEEDED_CALLBACKS`]) is no longer among the
    trainer's callbacks (`trainer.callback_handler.callbacks`), and no other instance of its class replaces it: the run
    trains as usual, and what it does is lost without a word (trial 15's N31: checkpoints without `trapo/`, which
    resuming then refused as "not written by TRAPOTrainer"). Called at the start of every `train()`.

    Args:
        added (`list`): the callbacks TRAPO added ([`~trl_trapo.assembly.RunCallbacks`]).
        present (`list`): the trainer's callbacks now.

    Returns:
        The warning's text, or None.
    """
    missing = [
        callback
        for callback in added
        if type(callback) in NEEDED_CALLBACKS and not any(isinstance(c, type(callback)) for c in present)
    ]
    if not missing:
        return None
    lost = "; ".join(f"{type(c).__name__}: {NEEDED_CALLBACKS[type(c)]}" for c in missing)
    names = " / ".join(type(c).__name__ for c in missing)
    message = (
        f"A callback TRAPO needs was removed from the trainer (pop_callback / remove_callback): {lost}. Fix: keep "
        f"{names}, or add it back before train(): `trainer.add_callback(callback)` with the instance pop_callback "
        "returned."
    )
    logger.warning(message)
    return message


__all__ = [
    "AdaptiveKLCallback",
    "AdapterBankCallback",
    "DDPCommHookCallback",
    "EpochCallback",
    "StateCheckpointCallback",
    "StopOnSignalCallback",
    "SyncReferenceCallback",
]


# ---------------------------------------------------------------------------------------------------------------------
# The console
# ---------------------------------------------------------------------------------------------------------------------
CONSOLE_METRICS = (
    "loss",
    "grad_norm",
    "learning_rate",
    "epoch",
    "loss/*",
    "weight/*",
    "objective/scores",
    "objective/kl",
)
"""What the console's line of a training step shows with `console_metrics="short"` (shell patterns, in this order):
the Trainer's own keys, each objective's loss `loss/<objective>` and weight `weight/<objective>`, and the rollouts'
mean score and KL to the reference (TRL's `GRPOTrainer` prints its `reward` and `kl`). Every other metric is still in
`trainer_state.json` and the trackers of `report_to` (docs/metrics.md lists them all)."""
CONSOLE_EXCLUDED = ("loss/*_avg",)
"""Matches of `CONSOLE_METRICS` left out too: the parts of the RL loss (`loss/policy_avg`, `loss/value_avg`)."""


def console_view(logs: dict) -> dict:
    """The part of a log entry the console shows with `console_metrics="short"`.

    Args:
        logs (`dict`): one entry, as the Trainer hands it to `on_log`.

    Returns:
        `dict`: for a training step's entry (one with `loss`), its keys that match `CONSOLE_METRICS` and not
        `CONSOLE_EXCLUDED`, in the entry's order; any other entry (evaluation, the end of training, your own
        `trainer.log(...)`) whole, as a new dict.
    """
    if "loss" not in logs:
        return dict(logs)

    def shown(key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, p) for p in CONSOLE_METRICS) and not any(
            fnmatch.fnmatchcase(key, p) for p in CONSOLE_EXCLUDED
        )

    return {key: value for key, value in logs.items() if shown(key)}


class ShortProgressCallback(ProgressCallback):
    """transformers' `ProgressCallback` (the training bar, and each log entry written above it), whose log line of a
    training step shows [`console_view`] of the entry: the logs themselves are not changed."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return super().on_log(args, state, control, logs=None if logs is None else console_view(logs), **kwargs)


class ShortPrinterCallback(PrinterCallback):
    """transformers' `PrinterCallback` (`disable_tqdm=True`: each log entry printed), printing [`console_view`] of
    the entry. Like its parent it drops `total_flos` from the entry itself."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None:
            logs.pop("total_flos", None)  # what `PrinterCallback` does to the logged entry, kept as it was
        return super().on_log(args, state, control, logs=None if logs is None else console_view(logs), **kwargs)


SHORT_CONSOLE_CALLBACKS = {ProgressCallback: ShortProgressCallback, PrinterCallback: ShortPrinterCallback}
"""The Trainer's console callback -> the one `console_metrics="short"` puts in its place."""
