# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A drop-in replacement for TRL's `PPOTrainer` / `PPOConfig`, removed from TRL in 1.13 (last in
`trl.experimental.ppo`, TRL 1.10-1.12).

`from trl_trapo import PPOConfig, PPOTrainer` takes the same constructor (by keyword and in the same positional
order) and every `PPOConfig` field of TRL 1.12 with the same name, default and meaning. With no pretraining or SFT
data TRAPO *is* PPO: rewards = score at the end of the response - per-token KL penalty, optional reward whitening,
GAE, whitened advantages, clipped policy and value losses, `num_ppo_epochs` passes over `num_mini_batches`
mini-batches per rollout batch. Known bugs of 1.12 are fixed by construction (see `docs/migrating_from_ppo.md`).
Pretraining and SFT objectives can be switched on later through `pretrain_dataset=` / `sft_dataset=`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from .arguments import check_config_type
from .config import TRAPOConfig
from .data import check_dataset_object
from .trainer import TRAPOTrainer


logger = logging.getLogger(__name__)


@dataclass
class PPOConfig(TRAPOConfig):
    r"""
    Configuration of [`PPOTrainer`]: TRL 1.12's `PPOConfig` fields, names and defaults, on top of [`TRAPOConfig`].

    The batch-size fields written back by TRL 1.12's trainer (`local_batch_size`, `micro_batch_size`, `batch_size`,
    `local_mini_batch_size`, `mini_batch_size`, `num_total_batches`) are filled in the same way, in `trainer.args` (a
    copy): the config you pass in is never changed. Unlike 1.12, the
    `world_size` of `TrainingArguments` is not shadowed by a field (that made `PPOConfig(deepspeed=...)` crash).
    """

    # ---- TRL 1.12 PPOConfig defaults that differ from TRAPOConfig's --------------------------------------------
    learning_rate: float = field(default=3e-6, metadata={"help": "Initial learning rate (TRL 1.12 PPO default)."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature of rollouts."})
    response_length: int = field(default=53, metadata={"help": "Maximum number of generated tokens."})
    stop_token: Literal["eos"] | None = field(
        default=None,
        metadata={"help": "'eos': completions stop at the tokenizer's EOS. None: they run to `response_length`."},
    )
    num_generations: int = field(
        default=1, metadata={"help": "Completions per prompt (PPO: 1, advantages come from the critic)."}
    )
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = field(
        default="bnpo",
        metadata={"help": "Aggregation of the per-token losses; 'bnpo' is 1.12 PPO's masked mean per micro-batch."},
    )
    kl_estimator: Literal["auto", "k1", "k2", "k3"] = field(
        default="k1",
        metadata={
            "help": "Per-token KL estimator (TRL 1.12 PPO default: k1; 'auto': k1 in the reward, k2 in the loss)."
        },
    )
    kl_penalty: Literal["auto", "reward", "loss"] = field(
        default="reward", metadata={"help": "PPO puts the KL penalty in the per-token rewards."}
    )
    num_sample_generations: int = field(
        default=10, metadata={"help": "Number of debugging generations (`generate_completions`) during training."}
    )
    whiten_per_process: bool = field(
        default=True,
        metadata={"help": "TRL 1.12 PPO whitened each process's rollouts on their own (TRAPO: the whole round)."},
    )
    exploration: bool | None = field(
        default=False, metadata={"help": "TRL 1.12 samples every prompt at one temperature: off (TRAPO: auto)."}
    )
    self_imitation: bool | None = field(
        default=False, metadata={"help": "TRL 1.12 has no self-imitation: off (TRAPO: auto with SFT data)."}
    )
    dare_mode: Literal["dynamic", "static"] = field(
        default="static",
        metadata={
            "help": "TRL 1.12 PPO has no adaptive weighting: static, as TRAPOConfig's default. With one objective the "
            "weights are 1 anyway; 'dynamic' (DARE) only matters with ptx/SFT data."
        },
    )
    logging_steps: float | None = field(
        default=None,
        metadata={
            "help": "Optimizer steps between two logs (below 1: a fraction of the run's steps). None (the default): "
            "num_ppo_epochs x num_mini_batches, the optimizer steps of one rollout batch, so the PPO metrics are "
            "logged once per PPO update as TRL 1.12's PPOTrainer logged them. Give a number to log at another "
            "cadence (TRAPOConfig's default is 10)."
        },
    )
    # ---- TRL 1.12 PPOConfig fields TRAPOConfig does not have ---------------------------------------------------
    exp_name: str = field(
        default=os.path.basename(__file__)[: -len(".py")], metadata={"help": "Name of this experiment."}
    )
    reward_model_path: str = field(
        default="EleutherAI/pythia-160m", metadata={"help": "Path to the reward model (read by scripts, not here)."}
    )
    sft_model_path: str = field(
        default="EleutherAI/pythia-160m", metadata={"help": "Path to the SFT model (read by scripts, not here)."}
    )
    dataset_num_proc: int | None = field(default=None, metadata={"help": "Processes used to tokenise datasets."})
    # ---- derived by the trainer (TRL 1.12 wrote them back into the config) -------------------------------------
    num_total_batches: int | None = field(default=None, metadata={"help": "Filled in: rollout batches in total."})
    micro_batch_size: int | None = field(
        default=None, metadata={"help": "Filled in: per_device_train_batch_size * world size."}
    )
    local_batch_size: int | None = field(
        default=None, metadata={"help": "Filled in: per_device_train_batch_size * gradient_accumulation_steps."}
    )
    batch_size: int | None = field(default=None, metadata={"help": "Filled in: local_batch_size * world size."})
    local_mini_batch_size: int | None = field(
        default=None, metadata={"help": "Filled in: local_batch_size / num_mini_batches."}
    )
    mini_batch_size: int | None = field(default=None, metadata={"help": "Filled in: batch_size / num_mini_batches."})

    def __post_init__(self):
        if self.logging_steps is None:  # TRL 1.12 logged once per rollout batch; its optimizer steps are these
            epochs = self.num_ppo_epochs if self.num_iterations is None else self.num_iterations  # GRPO's alias
            self.logging_steps = max(epochs * self.num_mini_batches, 1)  # bad values are refused by name below
        super().__post_init__()


class PPOTrainer(TRAPOTrainer):
    """TRL 1.12's `PPOTrainer`, on TRAPO.

    Args (in TRL 1.12's positional order):
        args ([`PPOConfig`]): the configuration.
        processing_class: the policy's tokenizer (left padding for the prompts is handled internally).
        model (`PreTrainedModel`): the policy.
        ref_model (`PreTrainedModel` or None): the reference; None with PEFT (frozen copy of the starting adapter).
        reward_model (`PreTrainedModel`): `AutoModelForSequenceClassification` with `num_labels=1`.
        train_dataset (`Dataset`): prompts, tokenized (`input_ids`) as 1.12 expected, or a `prompt` column.
        value_model (`PreTrainedModel`): the critic, `AutoModelForSequenceClassification` with `num_labels=1`.
        data_collator: accepted for compatibility and not used (prompts are padded internally).
        eval_dataset (`Dataset`, *optional*): prompts for `generate_completions` / `evaluate`.
        optimizers, callbacks, peft_config: as in `transformers.Trainer` / TRL.
        **trapo_kwargs: TRAPO's extra arguments, e.g. `pretrain_dataset=` (PPO-ptx), `sft_dataset=`, `reward_funcs=`,
            `rollout_source=` (your own rollouts instead of sampling `train_dataset`; see `TRAPOTrainer`).

    Raises:
        ValueError: as 1.12 did when `gradient_accumulation_steps` is not divisible by `num_mini_batches`, or when
            `train_dataset` is None; plus every check of [`TRAPOTrainer`].
    """

    _tag_names = ["trl", "ppo", "trapo"]
    _name = "PPO"
    _paper = {
        "title": "Fine-Tuning Language Models from Human Preferences",
        "id": "1909.08593",
        "citation": (
            "@article{ziegler2019fine,\n    title   = {{Fine-Tuning Language Models from Human Preferences}},\n"
            "    author  = {Daniel M. Ziegler and Nisan Stiennon and Jeffrey Wu and Tom B. Brown and Alec Radford "
            "and Dario Amodei and Paul F. Christiano and Geoffrey Irving},\n    year    = 2019,\n"
            "    eprint  = {arXiv:1909.08593}\n}"
        ),
    }

    TRL0_NAMES = {
        "config": "args",
        "tokenizer": "processing_class",
        "policy": "model",
        "ref_policy": "ref_model",
        "dataset": "train_dataset",
    }
    """TRL 0.x `PPOTrainer` / `PPOv2Trainer` keyword names -> TRL 1.x's (this class's)."""

    TRL0_METHODS = {
        "step": "PPO is driven by `trainer.train()`, which samples `train_dataset`'s prompts, scores them with "
        "`reward_model` / `reward_funcs` and updates; for your own generation loop pass `rollout_func=` or "
        "`rollout_source=` (docs/writing_a_rollout_source.md)",
        "generate": "rollouts are generated inside `trainer.train()`; sample completions with "
        "`trainer.model.generate(...)` or `trainer.generate_completions()` (the eval prompts)",
        "log_stats": "metrics are logged by `trainer.train()` every `logging_steps` (report_to picks the tracker)",
        "batched_forward_pass": "log-probs and values are computed inside `trainer.train()`",
        "compute_rewards": "the per-token rewards (score - KL penalty) are computed inside `trainer.train()`",
    }
    """TRL 0.x `PPOTrainer` methods (the heart of a 0.x training loop) that TRL 1.x dropped -> what replaces each."""

    def __new__(cls, *args, **kwargs):
        # before Python binds the arguments: its "missing 4 required positional arguments" names no old name
        old = [name for name in cls.TRL0_NAMES if name in kwargs]
        if old:
            renames = ", ".join(f"{cls.TRL0_NAMES[name]}= (was {name}=)" for name in old)
            raise TypeError(
                f"PPOTrainer got TRL 0.x keyword names {old}: TRL 1.x's PPOTrainer, which this one follows, takes "
                f"{renames}. Rename them (docs/migrating_from_ppo.md)."
            )
        # TRL 0.x's positional order (config, model, ref_model, tokenizer, dataset, ...) puts a model where 1.x
        # has `processing_class`: said here, before a missing `reward_model` or the tokenizer check speaks
        if len(args) > 1 and isinstance(args[1], nn.Module):
            raise TypeError(
                f"PPOTrainer's second positional argument is a model ({type(args[1]).__name__}) where TRL 1.x's "
                "PPOTrainer, which this one follows, takes `processing_class`: the positional order is (args, "
                "processing_class, model, ref_model, reward_model, train_dataset, value_model); TRL 0.x's was "
                "(config, model, ref_model, tokenizer, dataset). Pass them by keyword: PPOTrainer(args=..., "
                "processing_class=tokenizer, model=..., ref_model=..., reward_model=..., train_dataset=..., "
                "value_model=...) (docs/migrating_from_ppo.md)."
            )
        return super().__new__(cls, *args, **kwargs)  # TRAPOTrainer names foreign arguments

    def __getattr__(self, name: str):
        # only reached for a missing attribute: a 0.x method gets its replacement, anything else Python's error
        if name in type(self).TRL0_METHODS:
            raise AttributeError(
                f"PPOTrainer has no `{name}()`: TRL 0.x's training loop (`ppo_trainer.{name}(...)`) was dropped in "
                f"TRL 1.x, which this PPOTrainer follows; {type(self).TRL0_METHODS[name]} (docs/migrating_from_ppo.md)."
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __init__(
        self,
        args: PPOConfig,
        processing_class,
        model,
        ref_model,
        reward_model,
        train_dataset,
        value_model=None,
        data_collator=None,
        eval_dataset=None,
        optimizers=(None, None),
        callbacks=None,
        peft_config=None,
        **trapo_kwargs,
    ):
        if train_dataset is None:
            raise ValueError("`train_dataset` is required: the prompts to roll out.")
        check_dataset_object(train_dataset, "train_dataset")  # its length sizes the run (below): one map-style split
        check_config_type(args, TRAPOConfig, "PPOConfig")
        mixed = any(
            trapo_kwargs.get(name) is not None and weight > 0
            for name, weight in (("pretrain_dataset", args.pretrain_weight), ("sft_dataset", args.sft_weight))
        )
        args = dataclasses.replace(args, **self.derived_batch_sizes(args, len(train_dataset), plan_steps=not mixed))
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            ref_model=ref_model,
            reward_model=reward_model,
            value_model=value_model,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            **trapo_kwargs,
        )

    @staticmethod
    def derived_batch_sizes(args: PPOConfig, dataset_size: int, plan_steps: bool = True) -> dict:
        """TRL 1.12's derived batch sizes, and the settings that make one optimizer step = one mini-batch.

        A rollout batch holds `per_device_train_batch_size * gradient_accumulation_steps` prompts per rank; it is
        split into `num_mini_batches` mini-batches, each one optimizer step over
        `gradient_accumulation_steps / num_mini_batches` micro-batches, for `num_ppo_epochs` epochs. With
        `plan_steps=False` (pretraining / SFT data share the steps' rows) `max_steps` is left to `TRAPOTrainer`,
        which plans it so that `total_episodes` RL episodes are still rolled out at the curriculum's RL share.

        A `max_steps` > 0 is honoured, as by `TRAPOTrainer` (`total_episodes` plans the steps only when `max_steps`
        is not set): `num_total_batches` then covers `max_steps` optimizer steps and an unset `total_episodes` is
        filled with the prompts they roll out; with both set, a warning says that `max_steps` wins. TRL 1.12's
        `PPOTrainer` ignored `max_steps` without a word (its `state.max_steps` came from `total_episodes`).

        TRL 1.12 wrote these back into the user's config; here they go into the trainer's own copy
        (`dataclasses.replace`), so the `PPOConfig` you pass in is never changed and can build a second trainer.

        Returns:
            `dict`: field -> value for `dataclasses.replace(args, ...)`.

        Raises:
            ValueError: if `gradient_accumulation_steps` is not divisible by `num_mini_batches`.
        """
        world = max(args.world_size, 1)
        grad_accum = args.gradient_accumulation_steps
        if grad_accum % args.num_mini_batches:
            raise ValueError(
                f"PPOConfig.gradient_accumulation_steps={grad_accum} must be divisible by "
                f"num_mini_batches={args.num_mini_batches} (each mini-batch is whole micro-batches)."
            )
        derived = {
            "local_batch_size": args.per_device_train_batch_size * grad_accum,
            "micro_batch_size": args.per_device_train_batch_size * world,
        }
        derived["batch_size"] = derived["local_batch_size"] * world
        derived["local_mini_batch_size"] = derived["local_batch_size"] // args.num_mini_batches
        derived["mini_batch_size"] = derived["batch_size"] // args.num_mini_batches
        derived["gradient_accumulation_steps"] = grad_accum // args.num_mini_batches
        steps_per_batch = args.num_ppo_epochs * args.num_mini_batches  # optimizer steps of one rollout batch
        if plan_steps and args.max_steps > 0:  # the user's max_steps wins, as in TRAPOTrainer (1.12 ignored it)
            derived["num_total_batches"] = math.ceil(args.max_steps / steps_per_batch)
            if args.total_episodes is None:
                derived["total_episodes"] = derived["num_total_batches"] * derived["batch_size"]
            else:
                logger.warning(
                    "PPOConfig sets both max_steps=%d and total_episodes=%d: max_steps wins (%d optimizer steps, "
                    "%d rollout batches of %d prompts); TRL 1.12's PPOTrainer ignored max_steps and ran "
                    "total_episodes. Set only one of them.",
                    args.max_steps,
                    args.total_episodes,
                    args.max_steps,
                    derived["num_total_batches"],
                    derived["batch_size"],
                )
            return derived
        total_episodes = args.total_episodes
        if total_episodes is None:
            total_episodes = derived["total_episodes"] = int(args.num_train_epochs * dataset_size)
        derived["num_total_batches"] = math.ceil(total_episodes / derived["batch_size"])
        if plan_steps:
            derived["max_steps"] = derived["num_total_batches"] * steps_per_batch
        return derived


__all__ = ["PPOConfig", "PPOTrainer"]
