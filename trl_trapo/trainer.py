# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""TRAPOTrainer: one policy, several objectives (pretraining, SFT, RL, and any added), one joint update per step.

How one optimizer step runs (the public `Trainer` hooks below, in the order they run):

1. `get_batch_samples`: the curriculum gives the step's shares of rows per objective and DARE's factors turn them
   into loss weights; each objective serves its rows (`trl_trapo/objectives.py`) — packed pretraining chunks, SFT
   samples from the memory pool, RL trajectories from the replay buffer, which a round of the rollout source refills
   when it runs dry (the RL objective's supply, `trl_trapo/rl_supply.py`: the source samples; the rollout engine
   scores and adds reference log-probs, values, advantages); they are split into gradient-accumulation micro-batches of similar length, right-padded, and
   the per-objective counts of the whole step are summed over micro-batches and ranks into the step's
   [`StepContext`];
2. `training_step` / `compute_loss`, per micro-batch: one forward of the policy over all its rows (whatever their
   objective), each objective's term (`objective.loss`), and one backward of L = sum_o w_o * L_o, each L_o
   normalised by its *global* count, so accumulation and data parallelism are exact; after the last micro-batch,
   DARE updates from its gradient probe;
3. the optimizer step (`create_optimizer`: skipped when the loss was not finite on any rank) and the learning-rate
   scheduler (`create_scheduler`: scaled by the curriculum phase);
4. `log`: TRAPO's metrics join the Trainer's logs; `evaluate` evaluates held-out data by its format; `train` and the
   state-checkpoint callback make TRAPO's own state (objectives, pools, replay buffer, controllers, RNG) durable.

Everything else — optimizer, accumulation, mixed precision, distribution, checkpoints — is the `transformers.Trainer`
loop, reached only through its public hooks. The collaborators each own their state and take their dependencies in
their constructors: the RL objective's supply [`~trl_trapo.rl_supply.RLSupply`] (its rollout source
[`~trl_trapo.sources.RolloutSource`], its replay buffer, targeted exploration), [`~trl_trapo.rollout.RolloutEngine`],
[`~trl_trapo.rewards.RewardScorer`], [`~trl_trapo.memory.MemoryPool`], [`~trl_trapo.memory.ReplayBuffer`],
[`~trl_trapo.curriculum.CurriculumSchedule`], [`~trl_trapo.weighting.DARE`], [`~trl_trapo.schedules.RLSchedules`],
[`~trl_trapo.evaluation.Evaluator`], [`~trl_trapo.metrics.MetricsAccumulator`], the objectives
([`~trl_trapo.objectives.Objective`]) and the distillation teacher they own ([`~trl_trapo.teacher.Teacher`]); the
callbacks are in `callbacks.py`. Two construction hooks let a subclass
change how samples are chosen and reused, `replay_max_uses` and `build_sample_selector`: few-shot mode
(`trl_trapo/experimental/fewshot.py`, `FewShotTRAPOTrainer`) overrides both; the trainer never imports it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset, IterableDataset
from huggingface_hub.errors import HFValidationError
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from trl.models import prepare_deepspeed, unwrap_model_for_generation
from trl.trainer.base_trainer import _BaseTrainer

from .assembly import (
    SourceParts,
    build_adapter_bank,
    build_callbacks,
    build_memory_pool,
    build_objectives,
    build_rewards,
    build_rl_supply,
    build_rollout_engine,
    build_run_exploration,
    build_step_controls,
    check_data_fits,
    check_run,
    load_models,
    plan_run,
    prepare_frozen_models,
    prepare_run_data,
    probe_noise_floor,
    setup_objectives,
    task_families,
)
from .checkpoint import (
    DATASETS_FILE,
    CheckpointError,
    check_checkpoint_fits,
    check_checkpoint_step,
    last_complete_checkpoint,
    read_rank_state,
    restore_rng,
    rng_tensors,
    verify_checkpoint,
    warn_settings_restored,
    write_rank_state,
)
from .collator import (
    MODEL_INPUTS,
    StepContext,
    StepTickets,
    collate_rows,
    split_micro_batches,
    ticket_collator,
)
from .config import TRAPOConfig, check_hub_repo_id
from .data import (
    check_eval_dataset,
    named_datasets,
    progress_bars,
)
from .distributed import (
    check_launch,
    sum_over_ranks,
)
from .evaluation import Evaluator
from .exploration import TargetedExploration
from .interrupts import Interruption, SignalCatcher, TrainingAborted, TrainingInterrupted
from .memory import (
    ReplayBuffer,
    SampleSelector,
    Trajectory,
    memory_pool_state,
)
from .metrics import MetricsAccumulator
from .models import (
    CountedPositionHead,
    PolicyAndValueWrapper,
    counted_log_probs,
    embeddable_saved_pad_ids,
    embedding_safe_pad_id,
    model_forward,
    quiet_checkpointing_deprecation,
)
from .nonfinite import NonFiniteGuard
from .objectives import (
    DistillationObjective,
    Objective,
    ObjectiveSetup,
    TermInputs,
    check_served_rows,
    check_term,
    count_keys,
    load_objective_states,
    step_counts,
)
from .rl_supply import build_replay_buffer
from .rollout import RolloutBatch, RolloutEngine, rollout_generation_config, stop_token_ids
from .saving import (
    CheckpointGuard,
    SaveError,
    check_disk_space,
    check_earlier_checkpoints,
    checkpoint_nbytes,
    describe_os_error,
    hub_error,
    is_hub_error,
    staged_save,
)
from .schedules import scale_scheduler
from .sources import RolloutSource, bind_rollout_func
from .vision import (
    model_context,
    needs_every_parameter,
    restore_converted_weights,
    text_tokenizer,
    vision_parameters,
)


try:
    from peft import NoMatchingPeftModuleError, PeftConfig, get_peft_model
except ImportError:  # peft is a dependency; keep the import error readable if it is missing
    PeftConfig = get_peft_model = None
    NoMatchingPeftModuleError = ValueError

logger = logging.getLogger(__name__)

RewardFunc = str | PreTrainedModel | Callable[..., list[float | None]]


MAX_LOGGED_TASKS = 32  # a `task` column with more distinct values is not a family label: no per-task metrics


class TRAPOTrainer(_BaseTrainer):
    r"""
    Trains one causal LM on pretraining, SFT and RL objectives jointly (TRAPO).

    Each optimizer step is one joint update L = w_pt * L_pretrain + w_sft * L_sft + w_rl * L_rl (see [`TRAPOConfig`]
    for how the curriculum and DARE set the shares and weights):

    - L_pretrain: mean next-token NLL (nats/token) over the step's pretraining tokens;
    - L_sft: mean NLL over completion tokens (plain or trust-region, `sft_loss_type`);
    - L_rl: PPO's clipped surrogate on completion tokens against behaviour log-probs, aggregated by `loss_type`,
      + `vf_coef` * clipped value loss with a critic, - `entropy_coef` * entropy, with the KL to the reference in the
      reward (PPO) or in the loss (`kl_penalty`). Advantages come from GAE with a `value_model`, otherwise they are
      group-relative over `num_generations` completions per prompt.

    Args:
        model (`str`, `PreTrainedModel` or `PeftModel`):
            The policy, or a model id / local path loaded with `AutoModelForCausalLM.from_pretrained`.
        reward_funcs (reward function, model id, `PreTrainedModel`, or a list of them, *optional*):
            TRL's reward functions: callables `f(prompts, completions, completion_ids, **columns, trainer_state,
            log_metric, log_extra) -> list[float | None]` (sync or async), or sequence-classification models.
        args ([`TRAPOConfig`], *optional*): the configuration; never changed (`trainer.args` is the same object, or
            a derived copy with `max_steps` set to the planned steps when the run's length comes from
            `num_train_epochs` or `total_episodes`).
        train_dataset (`Dataset`, *optional*): RL prompts (prompt-only format, or tokenized `input_ids`).
        eval_dataset (`Dataset` or `dict[str, Dataset]`, *optional*): evaluated by format — prompt-only datasets by
            greedy generation and rewards, `text` datasets by pretraining loss, prompt-completion by SFT loss.
        pretrain_dataset (`Dataset` or `IterableDataset`, *optional*): language-modelling text (`text` column).
        sft_dataset (`Dataset`, *optional*): prompt-completion or `messages` demonstrations.
        processing_class (`PreTrainedTokenizerBase`, *optional*): the policy's tokenizer (loaded from `model` if None).
        reward_processing_classes (tokenizer or list, *optional*): tokenizers of the reward models, aligned with
            `reward_funcs` (+ `reward_model` last); None entries reuse the policy's tokenizer when vocabularies match.
        ref_model (`PreTrainedModel`, *optional*): the reference policy of the KL term. Default: a frozen copy of the
            initial policy, or — with PEFT — the adapter's starting point (adapter disabled, or a frozen copy of an
            adapter that was already trained).
        reward_model (`PreTrainedModel`, *optional*): a sequence-classification reward model (PPO-style argument).
        value_model (`PreTrainedModel`, *optional*): a critic (`AutoModelForSequenceClassification`, `num_labels=1`);
            with it advantages come from GAE and `trainer.model` is a wrapper with `.policy` and `.value_model`.
        callbacks (`list[TrainerCallback]`, *optional*): extra callbacks.
        optimizers (`tuple`, *optional*): `(optimizer, lr_scheduler)` to use instead of the defaults.
        peft_config (`PeftConfig`, *optional*): wraps the policy in a fresh adapter.
        objectives (`list[Objective]`, *optional*): objectives trained next to the built-in three, each with its own
            name, static weight, rows and loss term (see [`~trl_trapo.objectives.Objective`]; e.g. a second corpus:
            `LanguageModelingObjective("code", code_dataset, weight=0.5)`). DARE weights them like the others; the
            curriculum gives them a share when `curriculum_mixtures` is one mapping objective -> share per phase.
        teacher_model (`str` or `PreTrainedModel`, *optional*): a teacher for on-policy distillation (default: loaded
            from `teacher_model_name_or_path`): the divergence to it on the student's own samples becomes the
            objective `distill` ([`~trl_trapo.objectives.DistillationObjective`]), weighted by DARE. It must share the
            policy's tokenizer, dtype and vocabulary, and needs prompts to sample from: the RL prompts
            (`train_dataset`), or `distillation_dataset`.
        distillation_dataset (`Dataset`, *optional*): reward-free prompts for the teacher's objective (prompt-only
            format, or tokenized `input_ids`; no reward columns): pure distillation. Each step the policy samples
            one completion per prompt of the objective's rows, fresh, at `distillation_temperature`; they are never
            scored and skip targeted exploration, self-imitation and the replay buffer
            ([`~trl_trapo.objectives.DistillationPrompts`]). When given, the teacher's objective trains on these
            only (not on the RL rollouts); with no other dataset the run is TRL's `DistillationTrainer`'s job.
        rollout_source ([`~trl_trapo.sources.RolloutSource`], *optional*): where RL rounds come from: a subclass that
            implements `sample(rows_needed, step) -> SampledRound` and the optional hooks it needs (an object with
            only a `sample` method is wrapped in a [`~trl_trapo.sources.RolloutSourceAdapter`]; see
            `trl_trapo/sources.py` and `docs/writing_a_rollout_source.md`). The trainer finishes each round (scores unless the source did,
            reference log-probs, values, advantages) and ages its trajectories by the round's `version`. Default: a
            [`~trl_trapo.sources.SyncRolloutSource`], which samples `train_dataset`'s prompts with the live policy.
            With your own source, `train_dataset` still sizes the run and checks the rewards, and targeted exploration
            is off; `use_vllm`, `fewshot_mode` and `exploration=True` (settings of the default source) are refused.
            `trainer.rollout_source` is the source in use. A source's rounds may carry a `completion_mask` (0 on
            tokens the environment wrote, e.g. tool results): those count in no loss, KL, entropy, ratio statistic or
            length metric, and GAE with a critic steps over them.
        tools (`list[Callable]`, *optional*): TRL's `tools=`: functions (sync or async, type hints and a Google-style
            docstring) the policy may call in multi-turn rollouts ([`~trl_trapo.agents.ToolRolloutSource`], up to
            `max_tool_calling_iterations` rounds of calls; `docs/agents.md`). Needs conversational prompts and a chat
            template that expresses tool calls (`trl_trapo.agents.use_chatml_tool_template` for a ChatML model whose
            own template cannot, such as SmolLM2; `trl_trapo.agents.use_tool_chat_template` for the built-in
            tokenizer).
        environment_factory (class, callable or `dict[str, callable]`, *optional*): TRL's `environment_factory=`: one
            instance per rollout, `reset(**row)` before it (returned text is appended to the prompt), its public
            methods are its tools, an optional `get_reward()` is an extra reward; a dict is chosen by the dataset's
            `environment` column. Without a `train_dataset`, `max_steps` sets the run's length. With `tools` or an
            environment, `rollout_source` and `exploration=True` are refused (targeted exploration is off).
        rollout_func (`Callable`, *optional*): TRL 1.16's `rollout_func(prompts, trainer) -> dict` (as
            `GRPOTrainer(rollout_func=...)` runs it), wrapped in a [`~trl_trapo.sources.RolloutFuncSource`]: it gets
            this process's prompts of a round, each `num_generations` times in a row as TRL passes them (the dataset's
            `prompt` as it is, messages or text), and returns one completion per entry as `prompt_ids`,
            `completion_ids`, `logprobs` and optionally `env_mask` (1 on the policy's tokens); any other key reaches
            the reward functions as a column. `logprobs` are the sampler's (TRL's meaning): the trainer computes PPO's
            behaviour log-probs itself, and with `vllm_importance_sampling_correction` weights the policy loss by the
            sampler/trainer mismatch. Its rows are trained at `temperature`; its completions need not fit in
            `response_length` (each round's prompt + completion must fit the policy's context). Refused together with
            `rollout_source`, without `train_dataset`, and with `use_vllm` or `exploration=True`. In few-shot mode
            (`FewShotTRAPOTrainer`) it gets the prompts few-shot mode chooses and its trajectories are reused as
            few-shot mode says; it samples at its own temperature (few-shot's annealing is the default source's).

    Raises:
        TypeError: before anything loads, for an argument of the wrong type (`args` not a `TRAPOConfig`; `model`,
            `reward_funcs`, `peft_config`, `callbacks`, ...: see `trl_trapo.arguments.check_trainer_arguments`),
            naming the argument, the value and what to pass.
        ValueError: before any training, for data or settings that cannot work (no objective has data, missing
            columns, prompts longer than the context, reward functions that fail or return the wrong length, a
            tokenizer without a pad token, ...), with a message naming the argument and the fix.
        CheckpointError: (a `ValueError`) if `args.resume_from_checkpoint` names a checkpoint that is incomplete or
            corrupted, before any model is loaded.
    """

    _tag_names = ["trl", "trapo"]
    _name = "TRAPO"
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: str | PreTrainedModel | nn.Module,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: TRAPOConfig | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        pretrain_dataset: Dataset | IterableDataset | None = None,
        sft_dataset: Dataset | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes: PreTrainedTokenizerBase | list[PreTrainedTokenizerBase | None] | None = None,
        ref_model: PreTrainedModel | None = None,
        reward_model: PreTrainedModel | None = None,
        value_model: PreTrainedModel | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: PeftConfig | None = None,
        objectives: list[Objective] | None = None,
        rollout_source: RolloutSource | None = None,
        teacher_model: str | PreTrainedModel | None = None,
        distillation_dataset: Dataset | None = None,
        tools: list[Callable] | None = None,
        environment_factory: Callable | dict[str, Callable] | None = None,
        rollout_func: Callable[[list, Any], dict] | None = None,
    ):
        if args is None:
            args = TRAPOConfig(output_dir="trapo-output")
        # before anything slow: the arguments' types, the rollout source and agent arguments, output_dir, the
        # datasets, the checkpoint to resume from, torch's threads (trl_trapo/assembly.py)
        datasets = dict(
            train_dataset=train_dataset,
            sft_dataset=sft_dataset,
            pretrain_dataset=pretrain_dataset,
            eval_dataset=eval_dataset,
            distillation_dataset=distillation_dataset,
        )
        checked = check_run(
            args,
            dict(
                model=model,
                reward_funcs=reward_funcs,
                processing_class=processing_class,
                reward_processing_classes=reward_processing_classes,
                ref_model=ref_model,
                reward_model=reward_model,
                value_model=value_model,
                teacher_model=teacher_model,
                peft_config=peft_config,
                callbacks=callbacks,
                optimizers=optimizers,
                tools=tools,
            ),
            datasets,
            rollout_source=rollout_source,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
        )
        agent, datasets["train_dataset"] = checked.agent, checked.train_dataset
        self._verified_checkpoint = checked.verified_checkpoint  # `train` does not hash it again
        self._datasets_summary = checked.datasets_summary  # to refuse resuming with other datasets
        self.thread_choice = checked.thread_choice
        # skips an optimizer step whose loss was not finite on any rank (see create_optimizer)
        self.nonfinite = NonFiniteGuard(args.max_nonfinite_steps, self._reduce_sum)

        # ---- step 1. policy, tokenizer, reference, critic and teacher; step 2. rewards ---------------------------------
        models = load_models(
            args,
            model,
            processing_class=processing_class,
            ref_model=ref_model,
            value_model=value_model,
            teacher_model=teacher_model,
            peft_config=peft_config,
            agent=agent,
            train_dataset=datasets["train_dataset"],
            named_datasets=named_datasets(datasets),
            verified_checkpoint=self._verified_checkpoint,
        )
        model, tokenizer, image_rows = models.policy, models.tokenizer, models.image_rows
        self._has_critic, self.kl_penalty, self.kl_estimator = (
            models.has_critic,
            models.kl_penalty,
            models.kl_estimator,
        )
        self.metrics = MetricsAccumulator([])
        self.rewards = build_rewards(
            args,
            models,
            reward_funcs,
            reward_model,
            reward_processing_classes,
            agent=agent,
            metrics=self.metrics,
            trainer_state=lambda: getattr(self, "state", None),
        )
        self.metrics.reward_names = list(self.rewards.names)

        # ---- step 3. datasets (checked and tokenized before anything is trained) ------------------------------------
        own_rounds = rollout_source is not None or rollout_func is not None
        data = prepare_run_data(args, models, datasets, rewards=self.rewards, user_source=own_rounds)
        self._rl_dataset = data.rl  # the RL prompts (the default rollout source's)
        self._sft_dataset = data.sft  # the tokenized demonstrations (the memory pool's)
        self._task_families = task_families(data.rl, MAX_LOGGED_TASKS)  # rl/zero_variance_groups per task family
        if self._task_families is not None:
            self.metrics.track_tasks(self._task_families)
        check_data_fits(args, data, models, self.rewards, agent, rollout_func, datasets)  # contexts, reward checks

        # ---- step 4. the plan (objectives, curriculum phases, steps) and the Trainer, one ticket per row slot -------
        plan = plan_run(
            args,
            data,
            objectives,
            with_teacher=models.teacher is not None,
            has_critic=self._has_critic,
            eval_dataset=eval_dataset,
        )
        self._planned_steps = plan.planned_steps
        check_disk_space(
            args.output_dir,
            checkpoint_nbytes(models.trained, args.optim, args.save_only_model),
            checkpoints=args.save_strategy != "no",
        )
        if args.max_steps <= 0:  # the run's length is the plan (the curriculum, schedules and pools are sized by it):
            # set it in the trainer's own copy, or the Trainer would round epochs of tickets up to its own length
            args = dataclasses.replace(args, max_steps=self._planned_steps)
        super().__init__(
            model=models.trained,
            args=args,
            data_collator=ticket_collator,
            train_dataset=StepTickets(plan.tickets),
            eval_dataset=eval_dataset,
            processing_class=models.processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        check_launch(self.accelerator)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        zero3 = self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3
        # a VLM under DDP: text-only micro-batches take the vision encoder into the graph with a zero term
        self._vision_parameters = vision_parameters(model) if image_rows is not None and world > 1 else []
        self._suppressed_token_ids = list(models.suppressed_token_ids)

        # ---- step 5. the objectives' rows (per rank): text streams, the memory pool, the replay buffer --------------
        pretrain = setup_objectives(  # the pretraining stream and the user's objectives, indexed by the plan
            args,
            data,
            plan,
            lambda index: ObjectiveSetup(
                index, args, tokenizer, rank, world, self._planned_steps, model_context(model), image_rows
            ),
        )
        # the RL objective's replay buffer: each trajectory served num_ppo_epochs times (a construction hook:
        # few-shot mode raises it)
        replay = build_replay_buffer(args, self.replay_max_uses(), rank)
        adapter_bank = build_adapter_bank(args, self._unwrapped_policy, self.accelerator, zero3, replay)
        if adapter_bank is not None:
            self.add_callback(adapter_bank)
        # the RL prompt sampler, the long-term SFT pool, a sample selector (none unless a subclass builds one:
        # few-shot mode) and the adapter bank (trl_trapo/memory/pool.py)
        self.memory_pool = build_memory_pool(
            args,
            data,
            self._planned_steps,
            rank,
            world,
            selector=lambda sft_pool, prompt_sampler: self.build_sample_selector(
                sft_pool,
                prompt_sampler,
                data.rl,
                self._planned_steps,
                self._unwrapped_policy(),
                self._unwrapped_for_rollouts,
            ),
            adapter_bank=adapter_bank,
        )
        # targeted exploration: families whose groups carry no signal are sampled hotter (trl_trapo/exploration.py)
        exploration = build_run_exploration(
            args,
            data,
            models,
            own_source=checked.own_source,
            world_size=world,
            with_successes=self.memory_pool.successes is not None,
            agent=agent,
        )

        # ---- step 6. what decides each step: curriculum, DARE, RL coefficient schedules -----------------------------
        self.allocator, self.curriculum, self.dare, self.schedules = build_step_controls(
            args, plan, probe_noise_floor(model, args), self._unwrapped_policy, self.accelerator.device
        )
        self._row_generator = torch.Generator().manual_seed(args.seed + 4 + rank)

        # ---- step 7. frozen models and the rollout engine -----------------------------------------------------------
        # the id in padding positions: the tokenizer's pad id, unless the models cannot embed it (TRL 1.12's PPO
        # example adds a [PAD] token without resizing the embeddings); padding is never read (masks come from lengths)
        self.padding_id = embedding_safe_pad_id(tokenizer, self._unwrapped_policy(), value_model)
        self.ref_model, distill_teacher, self.reference = prepare_frozen_models(
            args, models, self.rewards, self._prepare_frozen, self.accelerator, self.padding_id
        )
        # the training forward's output layer runs only at counted positions
        self.counted_head = CountedPositionHead(self._unwrapped_policy())
        self.generation_config = rollout_generation_config(args, tokenizer, self.padding_id)
        stops = stop_token_ids(args, tokenizer)  # what stops generation is exactly what cuts the mask
        self.rollouts = build_rollout_engine(
            args,
            models,
            self.rewards,
            self.reference,
            schedules=self.schedules,
            unwrapped_for_rollouts=self._unwrapped_for_rollouts,
            accelerator=self.accelerator,
            generation_config=self.generation_config,
            stops=stops,
            padding_id=self.padding_id,
            policy=self._unwrapped_policy(),
            active_rl=data.rl is not None,
            teacher=distill_teacher,
        )

        # ---- step 8. the rollout source and the RL objective's supply -----------------------------------------------
        # where RL rounds come from (the user's source, or the default one sampling with the live policy), the replay
        # buffer and the orchestration between them (assembly.build_rl_supply, trl_trapo/rl_supply.py)
        supply = build_rl_supply(
            args,
            SourceParts(
                engine=self.rollouts,
                rl_dataset=self._rl_dataset,
                memory_pool=self.memory_pool,
                rewards=self.rewards,
                tokenizer=tokenizer,
                metrics=self.metrics,
                accelerator=self.accelerator,
                generation_config=self.generation_config,
                padding_id=self.padding_id,
                stops=stops,
                policy=self._unwrapped_policy,
                context=model_context(model),
                suppressed_token_ids=self._suppressed_token_ids,
                producer_threads=self.thread_choice.producer_threads,
                zero3=zero3,
                images=image_rows,
            ),
            replay=replay,
            schedules=self.schedules,
            rollout_source=rollout_source,
            # TRL's contract: the function gets the trainer
            rollout_func=bind_rollout_func(rollout_func, self) if rollout_func is not None else None,
            agent=agent,
            own_source=checked.own_source,
            active_rl=data.rl is not None,
            has_critic=self._has_critic,
            exploration=exploration,
            task_families=self._task_families,
            on_episode=lambda episode: setattr(self.state, "episode", episode),  # current even between logs
        )
        self.rollout_source, self.rl_supply = supply.source, supply.supply

        # ---- step 9. the objectives and evaluation ------------------------------------------------------------------
        # in the order of `names` (a row's `objective` is its objective's index here; trl_trapo/objectives.py)
        self.objectives: list[Objective] = build_objectives(
            args,
            pretrain=pretrain,
            memory_pool=self.memory_pool,
            take_rl_rows=self.rl_supply.take_rows,
            schedules=self.schedules,
            kl_penalty=self.kl_penalty,
            kl_estimator=self.kl_estimator,
            logging_step=self._is_logging_step,
            data=data,
            teacher=distill_teacher,
            sampler=self.rollouts,
            extra=plan.extra,
            tokenizer=tokenizer,
            rank=rank,
            world_size=world,
            planned_steps=self._planned_steps,
        )
        self.evaluator = Evaluator(
            args,
            tokenizer,
            self.rewards,
            self.accelerator,
            self._unwrapped_policy_for_eval,
            self.generation_config,
            stops,
            self.padding_id,
            images=image_rows,
            vocab_size=model.get_input_embeddings().num_embeddings,
        )

        # ---- step 10. callbacks -------------------------------------------------------------------------------------
        # a checkpoint is complete once TRAPO's markers are in; a save failing before that is undone (saving.py)
        self._checkpoint_guard = CheckpointGuard(lambda: self.args.should_save)
        # SIGINT / SIGTERM save a checkpoint and stop (train()), by the callback added last
        self._signal_catcher = SignalCatcher(announce=self.accelerator.is_main_process)
        wiring = build_callbacks(
            args,
            existing=self.callback_handler.callbacks,
            schedules=self.schedules,
            reduce_sum=self._reduce_sum,
            model_wrapped=lambda: self.model_wrapped,
            accelerator=self.accelerator,
            save_state=self._save_trapo_state,
            pending=lambda: self._checkpoint_guard.pending,
            reference=self.reference,
            policy=self._unwrapped_policy,
            signal_catcher=self._signal_catcher,
            supply_callbacks=supply.callbacks,
        )
        wiring.apply(add=self.add_callback, remove=self.remove_callback)
        self._stop_on_signal = wiring.stop_on_signal

        self._train_start_time: float | None = None
        self._last_shares = self.curriculum.mixture(0)
        self._last_step_built = 0

    # =================================================================================================================
    # Construction helpers
    # =================================================================================================================
    def _prepare_frozen(self, module: nn.Module) -> nn.Module:
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(module, self.accelerator)
        return self.accelerator.prepare_model(module, evaluation_mode=True)

    # ---- construction hooks: what a subclass may override to change how samples are chosen and reused ----------
    def replay_max_uses(self) -> int:
        """Construction hook: how many times the replay buffer serves each trajectory (`num_ppo_epochs`).

        Called once in `__init__`, when the replay buffer is built;
        [`~trl_trapo.experimental.fewshot.FewShotTRAPOTrainer`] raises it to `fewshot_max_uses`.

        Returns:
            `int`: the reuse cap, at least 1.
        """
        return int(self.args.num_ppo_epochs)

    def build_sample_selector(
        self,
        sft_pool,
        prompt_sampler,
        rl_dataset: Dataset | None,
        total_steps: int,
        policy: nn.Module,
        unwrapped_for_rollouts: Callable[[], AbstractContextManager[nn.Module]],
    ) -> SampleSelector | None:
        """Construction hook: the object that chooses the RL prompts and SFT rows and sets each generation round's
        temperature in place of the plain samplers (see [`~trl_trapo.memory.pool.SampleSelector`]), or None.

        Called once in `__init__`, after the datasets are tokenized and the model is prepared, before the memory pool
        is built. TRAPOTrainer builds none; [`~trl_trapo.experimental.fewshot.FewShotTRAPOTrainer`] builds few-shot
        mode's controller.

        Args:
            sft_pool ([`~trl_trapo.memory.SFTPool`] or [`~trl_trapo.memory.PrioritizedSFTPool`], *optional*): this
                rank's long-term SFT pool (None without SFT).
            prompt_sampler ([`~trl_trapo.data.ShardedSampler`], *optional*): this rank's stream of RL prompt indices
                (None without RL prompts).
            rl_dataset (`Dataset`, *optional*): the tokenized RL prompts (`prompt_ids`, and the dataset's own columns).
            total_steps (`int`): planned optimizer steps.
            policy (`nn.Module`): the policy, unwrapped from DDP / DeepSpeed (e.g. to hook its LM head).
            unwrapped_for_rollouts (`Callable[[], AbstractContextManager[nn.Module]]`): the trained model unwrapped
                for a no-grad forward at rollout time (ZeRO-3 weights gathered as for generation), in eval mode for
                the duration; `RolloutEngine.policy_of` takes the policy out of it.

        Returns:
            [`~trl_trapo.memory.pool.SampleSelector`] or None.

        Raises:
            ValueError: if `fewshot_mode=True`: few-shot mode is an experimental extension this trainer does not run.
        """
        if self.args.fewshot_mode:
            raise ValueError(
                f"{type(self.args).__name__}.fewshot_mode=True: few-shot mode is an experimental extension that "
                f"{type(self).__name__} does not run. Fix: train with "
                "`trl_trapo.experimental.fewshot.FewShotTRAPOTrainer` (same arguments), or set fewshot_mode=False."
            )
        return None

    # =================================================================================================================
    # Handles the collaborators use
    # =================================================================================================================
    def _unwrapped_policy(self) -> nn.Module:
        model = self.accelerator.unwrap_model(self.model)
        return model.policy if isinstance(model, PolicyAndValueWrapper) else model

    @property
    def teacher_model(self) -> nn.Module | None:
        """The distillation teacher as prepared for the run (read-only; None without one). The `distill` objective
        owns it ([`~trl_trapo.teacher.Teacher`], `DistillationObjective.teacher`); the trainer keeps no handle."""
        teachers = [o.teacher for o in self.objectives if isinstance(o, DistillationObjective)]
        return teachers[0].model if teachers else None

    @property
    def vllm_generation(self):
        """TRL's `VLLMGeneration` the rollouts sample with (`use_vllm=True`; None otherwise), as TRL 1.16's
        `GRPOTrainer.vllm_generation`: a `rollout_func` samples through it (`trainer.vllm_generation.generate(prompts=
        prompt_ids, images=None, num_generations=n)`), its weights pushed before each call of the function."""
        return self.rollouts.vllm.generation if self.rollouts.vllm is not None else None

    @property
    def reward_funcs(self) -> list:
        """The reward functions and (prepared) reward models, in the order of `reward_weights`."""
        return self.rewards.funcs

    @property
    def reward_func_names(self) -> list[str]:
        """Their names, as in `rewards/<name>/mean`."""
        return self.rewards.names

    @contextmanager
    def _unwrapped_for_rollouts(self) -> Iterator[nn.Module]:
        """The trained model unwrapped for generation (weights gathered under ZeRO-3 when
        `ds3_gather_for_generation`), in eval mode for the duration."""
        with (
            quiet_checkpointing_deprecation(),
            unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation
            ) as unwrapped,
        ):
            was_training = unwrapped.training
            unwrapped.eval()
            try:
                yield unwrapped
            finally:
                unwrapped.train(was_training)

    @contextmanager
    def _unwrapped_policy_for_eval(self, gather: bool) -> Iterator[nn.Module]:
        """The policy unwrapped for generation (ZeRO-3 weights gathered when `gather`), in eval mode."""
        with (
            quiet_checkpointing_deprecation(),
            unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=gather
            ) as unwrapped,
        ):
            policy = RolloutEngine.policy_of(unwrapped)
            was_training = policy.training
            policy.eval()
            try:
                yield policy
            finally:
                policy.train(was_training)

    def _reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over ranks, on the tensor's own device (the tensor itself on one process)."""
        return sum_over_ranks(self.accelerator, tensor)

    # =================================================================================================================
    # 1. Building a step (public Trainer hook: get_batch_samples)
    # =================================================================================================================
    def get_batch_samples(self, epoch_iterator, num_batches: int, device) -> tuple[list, StepContext | None]:
        """Draw this optimizer step's rows from every objective (`objective.take`) and split them into `num_batches`
        micro-batches.

        Returns `(micro_batches, context)`: the Trainer hands the [`StepContext`] (loss weights and the global
        per-objective counts of the whole step) to `training_step` / `compute_loss` as `num_items_in_batch`.
        """
        tickets = []
        for _ in range(num_batches):
            try:
                tickets.append(next(epoch_iterator))
            except StopIteration:
                break
        if not tickets:
            return [], None
        return self._build_step(len(tickets))

    def _build_step(self, num_micro: int) -> tuple[list[dict], StepContext]:
        args = self.args
        step = self.state.global_step
        self._last_step_built = step
        # step 1. shares and weights
        shares = self.curriculum.mixture(step)
        weights = self.dare.step_weights([o.weight for o in self.objectives], shares)
        self._last_shares = shares
        # step 2. rows, from each objective's own source
        counts = self.allocator.allocate(args.per_device_train_batch_size * num_micro, shares)
        rows = []
        for objective, count in zip(self.objectives, counts):
            if count:
                served = objective.take(count, step)
                check_served_rows(objective, served, count)
                rows += served
        order = torch.randperm(len(rows), generator=self._row_generator).tolist()
        for position, index in enumerate(order):
            rows[index].half = position % 2
        # step 3. micro-batches
        batches = [collate_rows(group, self.padding_id) for group in split_micro_batches(rows, num_micro)]
        # step 4. global counts
        total = self._reduce_sum(step_counts(batches, self.objectives))
        context = StepContext(
            step=step,
            weights=weights,
            counts=dict(zip(count_keys(self.objectives), total.tolist())),
            probe=self.dare.begin_step(step),
            num_micro=num_micro,
        )
        return batches, context

    # =================================================================================================================
    # 1a. Rollouts: the RL objective's supply (trl_trapo/rl_supply.py); public entry points for scripts
    # =================================================================================================================
    @property
    def replay(self) -> ReplayBuffer:
        """The RL objective's replay buffer (this rank's trajectories; `trainer.replay.add(...)` stores given ones)."""
        return self.rl_supply.replay

    @property
    def exploration(self) -> TargetedExploration | None:
        """Targeted exploration (per-family temperatures of the default source), or None when it is off."""
        return self.rl_supply.exploration

    def collect_rollouts(self, rows_needed: int, step: int | None = None) -> RolloutBatch:
        """Run one round: the rollout source samples it, the rollout engine finishes it, every consumer takes it.

        1. `rollout_source.sample(rows_needed, step)` returns a [`~trl_trapo.sources.SampledRound`];
        2. the engine finishes it here, at consumption time: scores (unless the source brought them), guidance,
           reference log-probs, values, advantages with the round's statistics over every rank;
        3. the finished [`~trl_trapo.rollout.RolloutBatch`] goes whole to targeted exploration, the episode count, the
           metrics, the adaptive KL window, the memory pool (few-shot, adapter bank, self-imitation) and the replay
           buffer (its trajectories aged from the round's `version`).

        The RL objective's supply ([`~trl_trapo.rl_supply.RLSupply.collect`]) runs one whenever the replay buffer
        runs dry; call this to run a round outside `train()`. Collective under data parallelism: every rank calls it
        at the same time.

        Args:
            rows_needed (`int`): RL rows a step needs on this rank (the default source samples
                `ceil(rows_needed * num_mini_batches / group)` prompts x `group`).
            step (`int`, *optional*): the current optimizer step, i.e. the policy version being trained (default:
                `state.global_step`).

        Returns:
            [`~trl_trapo.rollout.RolloutBatch`]: the finished round (its trajectories are in the replay buffer).

        Raises:
            TypeError: if the source does not return a `SampledRound`.
            ValueError: naming the source, for a round sampled by a later policy than `step`, token ids outside the
                vocabulary, a prompt + completion longer than the context, or `group=1` with group-relative
                advantages (see [`~trl_trapo.sources.check_round`]).
        """
        return self.rl_supply.collect(rows_needed, self.state.global_step if step is None else step)

    def process_rollouts(
        self,
        examples: list[dict],
        completion_ids: list[torch.Tensor],
        old_per_token_logps: list[torch.Tensor] | None = None,
        group: int | None = None,
        temperature: float | None = None,
        version: int | None = None,
    ) -> list[Trajectory]:
        """Turn given rollouts into replay trajectories, exactly as generated ones are (for fixed / external rollouts).

        Each completion is cut after its first stop token; then come the reference log-probs, the critic's values,
        the scores (reward functions / models, `missing_eos_penalty`) and the advantages (GAE with a critic, else
        group-relative over consecutive groups of `group` completions). The round reaches the metrics, the adaptive
        KL window and the memory pool, not targeted exploration, self-imitation or the replay buffer: add the
        trajectories with `trainer.replay.add(...)`. To have the trainer draw rounds from your rollouts while it
        trains, pass a `rollout_source` instead (see `docs/writing_a_rollout_source.md`).

        Args:
            examples (`list[dict]`): one dataset row per completion (`prompt` and reward columns; `prompt_ids` is
                computed when absent).
            completion_ids (`list[torch.Tensor]`): `(C_i,)` token ids per completion.
            old_per_token_logps (`list[torch.Tensor]`, *optional*): `(C_i,)` behaviour log-probs; computed with the
                current policy (temperature-scaled) when None.
            group (`int`, *optional*): completions per prompt (default: 1 with a critic, else `num_generations`).
            temperature (`float`, *optional*): the sampling temperature of the completions (default: `temperature`).
            version (`int`, *optional*): the policy version that sampled them, i.e. the optimizer step whose weights
                generated them (default: `state.global_step`); their replay age counts from it.

        Returns:
            `list[Trajectory]`: trajectories (see `ReplayBuffer`), not yet added to the buffer; completions whose every
            reward is None are dropped.
        """
        version = self.state.global_step if version is None else version
        return self.rl_supply.process(examples, completion_ids, old_per_token_logps, group, temperature, version)

    # =================================================================================================================
    # 2. The loss (public Trainer hooks: training_step, compute_loss)
    # =================================================================================================================
    def training_step(self, model, inputs, num_items_in_batch: StepContext | None = None):
        """The Trainer's step, plus: at the last micro-batch of a step, metrics bookkeeping and the DARE update."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.nonfinite.record(loss)  # no host sync: read by the optimizer step
        context = num_items_in_batch
        if context.last_micro_batch:
            self.metrics.end_step()
            if context.probe:
                self.dare.finish_step(context.step, self._reduce_sum)
            samples = self.args.num_sample_generations
            if samples > 0 and context.step % max(1, self._planned_steps // samples) == 0:
                self.generate_completions(sampling=True)
        return loss

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch: StepContext | None = None):
        """L = sum_o w_o * L_o for one micro-batch, with every L_o normalised by its global count of the step.

        The returned value is multiplied by the number of processes because DDP / DeepSpeed average gradients over
        ranks; summed over micro-batches and averaged over ranks it is the step's loss.

        Raises:
            TypeError: without the step's [`StepContext`] (TRAPOTrainer builds it in `get_batch_samples`).
        """
        context = num_items_in_batch
        if not isinstance(context, StepContext):
            raise TypeError(
                "compute_loss needs the step's StepContext as `num_items_in_batch`; TRAPOTrainer builds batches and "
                f"their context in get_batch_samples (got {type(context).__name__})."
            )
        weights, counts = context.weights, context.counts
        objective, mask = inputs["objective"], inputs["mask"]
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
        rows = [objective == index for index in range(len(self.objectives))]  # (B,) bool per objective

        # step 1. one forward of the policy over every row (and of the critic over the RL rows); the output layer runs
        # only at counted positions: `logits` is (N, V), N = mask.sum(), in the order of `counted.nonzero()`
        counted = mask.bool()  # (B, T)
        forward_kwargs = dict(use_cache=False)
        if context.probe:
            forward_kwargs["output_hidden_states"] = True
        model_inputs = inputs.get(MODEL_INPUTS)  # the rows' extra model inputs (e.g. pixel_values), when any
        values = None
        with self.counted_head.restrict(counted):
            if self._has_critic:
                outputs, values = model_forward(
                    model,
                    input_ids,
                    attention_mask,
                    model_inputs,
                    **forward_kwargs,
                    value_rows=torch.stack([r for r, o in zip(rows, self.objectives) if o.reads_values])
                    .any(0)
                    .nonzero()
                    .squeeze(-1),
                )
            else:
                outputs = model_forward(model, input_ids, attention_mask, model_inputs, **forward_kwargs)
        logits = outputs.logits
        if not CountedPositionHead.applies(logits, counted):  # a head the hook left alone: select here
            logits = logits[:, :-1][counted]
        token_rows = counted.nonzero()[:, 0]  # (N,) the row of each counted token
        targets = input_ids[:, 1:][counted]  # (N,)
        # a row's logits scaled by its objective's factor (RL: 1 / the row's sampling temperature)
        row_scale = None
        for index, term_objective in enumerate(self.objectives):
            scale = term_objective.logit_scale(inputs, rows[index])
            if scale is not None:
                row_scale = scale if row_scale is None else torch.where(rows[index], scale, row_scale)
        if row_scale is not None:
            logits = logits * row_scale[token_rows].to(logits.dtype).unsqueeze(1)
        # (B, T) nats, 0 where not counted, in fp32 as the behaviour and reference log-probs are (a bf16 log-softmax
        # alone would put the first PPO ratio ~1e-2 away from 1)
        per_token_logps = torch.zeros(counted.shape, dtype=torch.float32, device=logits.device).masked_scatter(
            counted, counted_log_probs(logits, targets)
        )

        # step 2. the terms: L = sum_o w_o * L_o (each L_o normalised by its global count of the step)
        terms, views = [], []
        total = 0.0
        for index, term_objective in enumerate(self.objectives):
            view = TermInputs(
                inputs=inputs,
                rows=rows[index],
                mask=mask * rows[index].unsqueeze(1).to(mask.dtype),
                per_token_logps=per_token_logps,
                logits=logits,
                token_rows=token_rows,
                targets=targets,
                tokens=rows[index][token_rows],
                values=values if term_objective.reads_values else None,
                context=context,
            )
            term = term_objective.loss(view)
            check_term(term_objective, term, tuple(mask.shape))
            total = total + weights[index] * term.loss if index else weights[index] * term.loss
            terms.append(term)
            views.append(view)
        total = total * self.accelerator.num_processes
        if self._vision_parameters and needs_every_parameter(
            model
        ):  # every vision parameter takes part, images or not
            total = total + 0.0 * sum(p.view(-1)[0] for p in self._vision_parameters)

        # step 3. DARE probe (update steps only): each objective's LM-head gradient, split in two halves of its rows —
        # in closed form from -d loss / d log p per token (`logp_coef`), or from the term's own logit gradient
        if context.probe:
            self._accumulate_probe(outputs, logits, targets, objective, counted, inputs["half"], rows, terms, views)

        # step 4. metrics (summed over micro-batches; every term already carries its global normaliser). An
        # objective's loss is measured only in steps that have its tokens: a step without them adds nothing (not 0)
        with torch.no_grad():
            for term_objective, term in zip(self.objectives, terms):
                if counts[f"tokens_{term_objective.name}"] > 0:
                    self.metrics.add(f"loss/{term_objective.name}", term.value)
            for term in terms:
                for key, value in term.stats.items():
                    self.metrics.add(key, value)
        # step 5. per-row feedback (the SFT pool's priority proxies, few-shot embeddings), left on the device
        for term_objective, view in zip(self.objectives, views):
            term_objective.after_forward(view)
        context.micro_index += 1
        return (total, outputs) if return_outputs else total

    def _accumulate_probe(self, outputs, logits, targets, objective, counted, half, rows, terms, views) -> None:
        """Hand the DARE probe the counted tokens: LM-head inputs, `(N, V)` logits, `(N,)` targets and the
        coefficient of each token; a term that gives its own logit gradient hands that instead."""
        self.dare.probe.add_losses([term.value for term in terms])  # the loss-based strategies read them
        if not bool(counted.any()):
            return
        hidden = outputs.hidden_states[-1][:, :-1]  # (B, T, H): the states the LM head reads
        coefficients = torch.ones_like(counted, dtype=torch.float32)
        closed_form = torch.ones_like(objective, dtype=torch.bool)  # (B,) rows whose gradient is c (p - e_y)
        for index, term in enumerate(terms):
            if term.logit_grad is not None:
                closed_form &= ~rows[index]
                tokens = views[index].tokens
                self.dare.probe.accumulate_logit_grad(
                    hidden[counted][tokens].detach(), term.logit_grad, index, half[views[index].token_rows[tokens]]
                )
            elif term.logp_coef is not None:
                coefficients = torch.where(rows[index].unsqueeze(1), term.logp_coef, coefficients)
        selected = closed_form.unsqueeze(1).expand_as(counted)[counted]  # (N,)
        if not bool(selected.all()):
            logits, targets = logits[selected], targets[selected]
            counted = counted & closed_form.unsqueeze(1)
        self.dare.probe.accumulate(
            hidden[counted].detach(),
            logits.detach(),
            targets,
            coefficients[counted],
            objective.unsqueeze(1).expand_as(counted)[counted],
            half.unsqueeze(1).expand_as(counted)[counted],
        )

    def _is_logging_step(self) -> bool:
        steps = self.args.logging_steps
        if not steps or steps <= 0:
            return False
        steps = int(steps) if steps >= 1 else max(int(steps * self.state.max_steps), 1)
        return (self.state.global_step + 1) % steps == 0

    # =================================================================================================================
    # 3. The optimizer step (public hooks: create_optimizer, create_scheduler)
    # =================================================================================================================
    def create_optimizer(self, model=None):
        """The Trainer's optimizer, with a guard that skips a step whose loss was not finite on any rank."""
        optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        return self.nonfinite.guard(optimizer, lambda: self.state.global_step)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The Trainer's scheduler, its factor multiplied by the curriculum phase's learning-rate scale
        (`rl_phase_learning_rate`; a pure function of the step, see `schedules.scale_scheduler`)."""
        wrap = self.lr_scheduler is None and self.schedules.scales_lr
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if wrap:
            scale_scheduler(scheduler, self.schedules.lr_scale)
        return scheduler

    # =================================================================================================================
    # 4. Logging, evaluation, durable state, saving (public hooks: log, evaluate, train, save_model)
    # =================================================================================================================
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add TRAPO's metrics (losses per objective, weights, curriculum, rollouts, replay) to the Trainer's logs."""
        if "loss" in logs:
            logs.update(self._collect_metrics())
            if "learning_rate" in logs:
                # TRL 1.12's `lr`: the rate the logged step used, which is what the Trainer logs as `learning_rate`
                # (read before its scheduler steps); the scheduler's `get_last_lr()` would be the next step's
                logs["lr"] = logs["learning_rate"]
        super().log(logs, start_time)

    def _collect_metrics(self) -> dict[str, float]:
        out = self.metrics.collect(self.accelerator, self.schedules.kl_coef())
        out.update(self.curriculum.metrics(self._last_step_built, self._last_shares))
        out.update(self.dare.metrics())
        out.update(self.schedules.metrics(self._last_step_built))
        out.update(self.memory_pool.metrics())  # sft_pool/*, fewshot/*, adapter_bank/*
        for objective in self.objectives:  # each objective's own (none for the built-in three)
            out.update(objective.metrics())
        out.update(self.rl_supply.metrics(self.state.global_step))  # exploration/*, replay/*
        episode = self.rl_supply.episode
        out["episode"] = float(episode)
        self.state.episode = episode  # TRL 1.12 PPOTrainer kept the counter on the state
        elapsed = time.perf_counter() - self._train_start_time if self._train_start_time else 0.0
        out["eps"] = float(int(episode / elapsed)) if elapsed > 0 else 0.0
        out["train/nonfinite_steps"] = float(self.nonfinite.steps)
        return out

    @torch.no_grad()
    def generate_completions(self, sampling: bool = False) -> list[dict[str, Any]]:
        """Greedy completions of the eval prompts with their scores, printed as a table (and logged to W&B /
        Trackio when they are in `report_to`), as TRL 1.12's `PPOTrainer.generate_completions` did.

        Args:
            sampling (`bool`): only the first `per_device_eval_batch_size` prompts (used during training).

        Returns:
            `list[dict]`: one `{"prompt", "completion", "score"}` per prompt on this rank (empty without an
            eval dataset of prompts).
        """
        return self.evaluator.completions_table(self.eval_dataset, self.state.global_step, sampling)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate held-out data by its format (see [`~trl_trapo.evaluation.Evaluator.evaluate`]); a dict of datasets
        is evaluated one by one with prefix `<prefix>_<name>`.

        Raises:
            ValueError: if there is no eval dataset, or one given here is not one TRAPO evaluates (checked as at
                construction: format, map-style, missing values).
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("No `eval_dataset`: pass one to the trainer or to `evaluate()`.")
        if eval_dataset is not None:  # the trainer's own was checked at construction
            check_eval_dataset(
                eval_dataset, text_tokenizer(self.processing_class), assistant_only_loss=self.args.assistant_only_loss
            )
        parts = dataset.items() if isinstance(dataset, dict) else [(None, dataset)]
        metrics = {}
        # the evaluator tokenizes its shards at each call: their bars only with `console_metrics="all"`
        with progress_bars(enabled=not self.args.disable_tqdm and self.args.console_metrics == "all"):
            for name, part in parts:
                metrics.update(
                    self.evaluator.evaluate(part, metric_key_prefix if name is None else f"{metric_key_prefix}_{name}")
                )
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset=None, ignore_keys=None, metric_key_prefix: str = "test"):
        """Not supported: `Trainer.predict` runs the loss collator's batches through the model for logits, which TRAPO's
        batches (prompt tickets, not model inputs) are not; TRL's `GRPOTrainer` has no meaningful `predict` either.

        Raises:
            NotImplementedError: always, naming what to use instead.
        """
        raise NotImplementedError(
            "TRAPOTrainer has no `predict`: use `trainer.evaluate(dataset)` for rewards and losses on held-out rows, or "
            "`trainer.generate_completions()` for sampled completions."
        )

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train`, resuming TRAPO's own state too.

        `resume_from_checkpoint=True` picks the newest *complete* checkpoint of `output_dir` (one a run was killed
        while writing is skipped, with a warning saying why); an explicit path must be complete.

        SIGINT (Ctrl-C) or SIGTERM during training finishes the optimizer step in progress, saves the normal
        `checkpoint-N` (TRAPO's state included) and stops on every rank at the same step; `train()` then raises
        `TrainingInterrupted` (see `trl_trapo.interrupts`). The previous signal handlers are restored when `train()`
        returns or raises.

        Raises:
            ValueError: before anything is written, if `output_dir` holds checkpoints of an unfinished run and this
                one neither resumes from one of them nor has `overwrite_output_dir=True` (see
                [`~trl_trapo.saving.check_earlier_checkpoints`]).
            CheckpointError: naming the file, if the checkpoint to resume from is incomplete or corrupted, or if
                `resume_from_checkpoint=True` finds no complete checkpoint.
            TypeError: `resume_from_checkpoint` is neither a path, a bool nor None (e.g. an int).
            TrainingInterrupted: (a `KeyboardInterrupt`) after SIGINT / SIGTERM, once the checkpoint is saved; its
                message is one line saying how to resume, its `interruption` (also `trainer.interruption`) says where.
            TrainingAborted: (a `KeyboardInterrupt`) on a second Ctrl-C, with nothing saved for the step in progress;
                the message names the newest complete checkpoint.
        """
        if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint, (str, bool, os.PathLike)):
            raise TypeError(
                f"resume_from_checkpoint={resume_from_checkpoint!r} ({type(resume_from_checkpoint).__name__}) is not a path: pass "
                "a checkpoint folder's path, True (the newest complete checkpoint in output_dir) or None."
            )
        # an unfinished run's checkpoints in output_dir: resumed, or replaced only when told to (before any write)
        check_earlier_checkpoints(self.args, resume_from_checkpoint)
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
            if os.path.abspath(resume_from_checkpoint) != self._verified_checkpoint:  # verified at construction
                verify_checkpoint(resume_from_checkpoint, world)
                policy = self._unwrapped_policy()
                check_checkpoint_fits(resume_from_checkpoint, is_peft_model(policy), self._datasets_summary, policy)
            check_checkpoint_step(resume_from_checkpoint, self.args.max_steps)
            if (
                self.accelerator.is_main_process
            ):  # a new learning rate would not be used, without a word (trial 6, M12)
                warn_settings_restored(resume_from_checkpoint, self.args)
            self._load_trapo_state(resume_from_checkpoint)
            self._restore_converted_weights(resume_from_checkpoint)
            logger.info("Resuming from %s", resume_from_checkpoint)
        catcher = self._signal_catcher
        try:
            with catcher:  # SIGINT / SIGTERM handlers only while training (see interrupts.py)
                output = super().train(
                    resume_from_checkpoint=resume_from_checkpoint,
                    trial=trial,
                    ignore_keys_for_eval=ignore_keys_for_eval,
                    **kwargs,
                )
        except TrainingAborted:
            self.rl_supply.close(abort=True)
            newest, _ = last_complete_checkpoint(self.args.output_dir, world)
            raise TrainingAborted(
                f"Aborted by a second Ctrl-C during step {self.state.global_step + 1}: nothing was saved for it; the "
                f"newest complete checkpoint is {os.path.abspath(newest) if newest else 'none'}."
            ) from None
        except Exception as error:
            self.rl_supply.close()
            # a checkpoint save that failed half-way: its folder is removed, the error names it and the cause (a
            # KeyboardInterrupt / SystemExit leaves it as a kill would: without markers, resuming skips it)
            replacement = self._checkpoint_guard.failed(error)
            if replacement is not None:
                raise replacement from error
            raise
        self.rl_supply.close()
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and os.path.isdir(best):
            self._restore_converted_weights(best)  # the Trainer loaded it as it resumes: the same blind spot
        if self.interruption is not None:  # checkpoint saved, on_train_end run: stop the caller too (interrupts.py)
            raise TrainingInterrupted(self.interruption)
        if catcher.received is not None:  # arrived after the last step had ended: let it act as it would have
            signal.raise_signal(catcher.received)
        return output

    def _restore_converted_weights(self, checkpoint_dir: str) -> None:
        """Load a checkpoint's model weights through `from_pretrained` when the Trainer's plain `load_state_dict`
        cannot (a file in the architecture's original key layout, as transformers saves LLaVA; see
        [`~trl_trapo.vision.restore_converted_weights`]). PEFT adapters and a policy-and-critic pair are saved in the
        Trainer's own layout and left to it."""
        policy = self.accelerator.unwrap_model(self.model)
        if is_peft_model(policy) or isinstance(policy, PolicyAndValueWrapper):
            return
        if restore_converted_weights(policy, checkpoint_dir):
            logger.info("Loaded the weights of %s through from_pretrained (key conversion).", checkpoint_dir)

    @property
    def interruption(self) -> Interruption | None:
        """Where the last `train()` stopped after SIGINT / SIGTERM (step, signal, checkpoint), or None if it was not
        interrupted (the `TrainingInterrupted` it raised carries the same). `interruption.exit_code` is what a command
        line exits with (130 / 143)."""
        return self._stop_on_signal.interruption

    def _generators(self) -> dict[str, torch.Generator]:
        return {"rows": self._row_generator, **self.rollouts.state_dict()}

    def _save_trapo_state(self, checkpoint_dir: str) -> None:
        """Write TRAPO's own per-rank state into `checkpoint_dir/trapo/` (called by `StateCheckpointCallback`)."""
        # the RL supply's: episode, replay buffer, exploration, and the rollout source's own state (rounds in flight)
        supply_meta, supply_tensors = self.rl_supply.state_dict()
        state = {
            "format": 1,
            "global_step": self.state.global_step,
            "world_size": self.accelerator.num_processes,
            "nonfinite_steps": self.nonfinite.steps,
            "allocator": self.allocator.state_dict(),
            "dare": self.dare.engine.state_dict(),
            # each objective's own state (the pretraining stream's position, ...); keyed by name
            "objectives": {o.name: o.state_dict() for o in self.objectives},
            "schedules": self.schedules.state_dict(),
            **supply_meta,
        }
        # prompt sampler, SFT pool (priorities), sample selector (few-shot mode), self-imitation, adapter bank
        state["memory_pool"], memory_files = self.memory_pool.state_dict(self.state.global_step)
        if self.accelerator.process_index == 0:  # the datasets it was trained on (check_checkpoint_fits)
            memory_files[DATASETS_FILE] = json.dumps(self._datasets_summary, indent=1).encode("utf-8")
        tensors = {**supply_tensors, **rng_tensors(self._generators())}
        if self.args.sync_ref_model and self.reference is not None:  # the reference has moved: keep it
            tensors.update(self.reference.state_tensors(self._unwrapped_policy()))
        compress = self.replay.nbytes > 64 * 2**20
        self.accelerator.wait_for_everyone()  # rank 0 fingerprints the Trainer's files: they must be complete
        write_rank_state(checkpoint_dir, self.accelerator.process_index, state, tensors, compress, memory_files)
        self.accelerator.wait_for_everyone()  # every rank's marker is in: the checkpoint is complete
        self._checkpoint_guard.end(checkpoint_dir)

    def _load_trapo_state(self, checkpoint_dir: str) -> None:
        """Restore what `_save_trapo_state` wrote (this rank's part).

        Raises:
            CheckpointError: naming the file, if the state is missing, damaged, or made with other datasets.
        """
        rank = self.accelerator.process_index
        state, tensors = read_rank_state(checkpoint_dir, rank)
        source = os.path.join(checkpoint_dir, "trapo", f"rank{rank}.json")
        pool = self.memory_pool
        try:
            if state.get("format") != 1:
                raise CheckpointError(f"{source} has an unknown format {state.get('format')!r}.")
            pool_state = memory_pool_state(state)  # this layout, or the earlier one (samplers at the top level)
            pool.check_datasets(pool_state, checkpoint_dir)  # the clearest error first, before anything is restored
            load_objective_states(self.objectives, state, source)  # checked first: same objectives, datasets
            self.nonfinite.steps = int(state["nonfinite_steps"])
            self.allocator.load_state_dict(state["allocator"])
            self.dare.engine.load_state_dict(state["dare"])
            self.schedules.load_state_dict(state.get("schedules"))
            self.rl_supply.load_state_dict(state, tensors)  # episode, exploration, replay, the source's own state
            restore_rng(self._generators(), tensors, source)
            if self.reference is not None:
                self.reference.load_state_tensors(self._unwrapped_policy(), tensors)
            pool.load_state_dict(pool_state, checkpoint_dir)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{source} cannot be restored: {type(error).__name__}: {error}") from error

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save what is trained so that `from_pretrained` reloads it: the policy, or only its adapter for a PEFT policy.

        Checkpoints (`checkpoint-N` directories) are the Trainer's own saves and hold everything resuming needs (with
        a critic: the policy and the critic together; with PEFT: the reference adapter copy too). Every other save —
        and so `push_to_hub` — writes the policy alone (gathered from the DDP / DeepSpeed wrapper first, never the
        wrapper itself), and for a PEFT policy only its active adapter, not the frozen reference copy
        (`trapo_ref`). Without a critic or a reference adapter this is the Trainer's own `save_model`.
        """
        is_checkpoint = (
            _internal_call
            and output_dir is not None
            and os.path.basename(os.path.normpath(output_dir)).startswith("checkpoint-")
        )
        # transformers' train() copied the tokenizer's pad id into the configs; one the embeddings cannot hold would
        # make the saved folder unloadable (see embeddable_saved_pad_ids)
        unwrapped = self.accelerator.unwrap_model(self.model)
        critic = unwrapped.value_model if isinstance(unwrapped, PolicyAndValueWrapper) else None
        with embeddable_saved_pad_ids(self.padding_id, self._unwrapped_policy(), critic):
            if is_checkpoint:  # written in place; the guard undoes it if the save fails before its markers
                self._checkpoint_guard.begin(output_dir)
                # every rank: rank 0 has moved an earlier folder of that name aside before any rank writes into the
                # new one (a rank ahead of it wrote its RNG file into the folder rank 0 then moved away and dropped)
                self.accelerator.wait_for_everyone()
                self._save_model(output_dir, is_checkpoint)
            else:  # staged: a failed save leaves the model already in output_dir whole
                output_dir = output_dir or self.args.output_dir
                with staged_save(output_dir, self.args.should_save, self.accelerator.wait_for_everyone) as staging:
                    self._save_model(staging, is_checkpoint)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def save_state(self) -> None:
        """`Trainer.save_state`, written atomically: `output_dir/trainer_state.json` is either the old or the new one.

        Raises:
            SaveError: naming the file and the cause, if it cannot be written.
        """
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, "trainer_state.json")
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            self.state.save_to_json(temporary)
            os.replace(temporary, path)
        except OSError as error:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise SaveError(f"Writing {path} failed: {describe_os_error(path, error)}.") from error

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """`Trainer.init_hf_repo` (creates the Hub repo; the Trainer calls it at construction with `push_to_hub`).

        Raises:
            HubPushError: naming the Hugging Face Hub, the repo id and the fixes, if the Hub cannot be reached.
        """
        try:
            super().init_hf_repo(token=token, private=private)
        except Exception as error:
            if isinstance(error, HFValidationError):
                check_hub_repo_id(self.args)  # one message for a bad repo id, the one the config check gives
                raise
            repo_id = self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir))
            if not is_hub_error(error):
                raise
            # nothing saved yet: at construction (push_to_hub=True), or first in a push_to_hub() the user called
            raise hub_error(repo_id, error, None, by_hand=not self.args.push_to_hub) from error

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs,
    ):
        """`Trainer.push_to_hub`: save the model into `output_dir` (staged, see `save_model`), then upload it.

        Raises:
            HubPushError: naming the Hugging Face Hub, the repo id and the fixes, if the upload fails (the local save
                is complete by then).
            SaveError: if the local save fails.
            ValueError: before anything is saved, if the repo id (`hub_model_id`, or output_dir's last part) is not
                one the Hub accepts ([`~trl_trapo.config.check_hub_repo_id`]).
        """
        check_hub_repo_id(self.args, self.hub_model_id)
        try:
            return super().push_to_hub(
                commit_message=commit_message,
                blocking=blocking,
                token=token,
                revision=revision,
                private=private,
                **kwargs,
            )
        except Exception as error:
            if not is_hub_error(error):  # a failed local save (SaveError) is said as such
                raise
            repo_id = (
                self.hub_model_id or self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir))
            )
            raise hub_error(repo_id, error, self.args.output_dir, by_hand=not self.args.push_to_hub) from error

    def _save_model(self, output_dir: str, is_checkpoint: bool) -> None:
        reference_adapter = self.reference is not None and bool(self.reference.adapter)  # a frozen copy in the policy
        if is_checkpoint or not (self._has_critic or reference_adapter):
            return super().save_model(output_dir, _internal_call=True)
        source = self.model_wrapped if self.is_deepspeed_enabled else self.model
        state = self.accelerator.get_state_dict(source)  # collective under ZeRO-3: every rank takes part
        if self.args.should_save:
            policy = self._unwrapped_policy()
            if self._has_critic:
                state = {k[len("policy.") :]: v for k, v in state.items() if k.startswith("policy.")}
            # only what is trained: the policy's active adapter, never the reference copy (checkpoints keep it)
            selected = {"selected_adapters": [policy.active_adapter]} if is_peft_model(policy) else {}
            os.makedirs(output_dir, exist_ok=True)
            policy.save_pretrained(output_dir, state_dict=state, **selected)
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
