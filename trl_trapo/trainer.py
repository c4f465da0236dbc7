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
[`~trl_trapo.evaluation.Evaluator`], [`~trl_trapo.metrics.MetricsAccumulator`] and what each log adds
([`~trl_trapo.metrics.RunMetrics`]), the builder of each step's rows ([`~trl_trapo.steps.StepBuilder`]), TRAPO's
state in checkpoints ([`~trl_trapo.run_state.RunState`]), the model as they reach it
([`~trl_trapo.handles.ModelHandles`]), the objectives ([`~trl_trapo.objectives.Objective`]) and the distillation
teacher they own ([`~trl_trapo.teacher.Teacher`]); the callbacks are in `callbacks.py`. The constructor builds them
with the four assembly functions of `trl_trapo/wiring.py` (docs/seams.md, "How a run is assembled") and stores what
they return. Two construction hooks let a subclass change how samples are chosen and reused, `replay_max_uses` and
`build_sample_selector`: few-shot mode (`trl_trapo/experimental/fewshot.py`, `FewShotTRAPOTrainer`) overrides both;
the trainer never imports it.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset, IterableDataset
from huggingface_hub.errors import HFValidationError
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from trl.trainer.base_trainer import _BaseTrainer

from . import direct_calls, saving, setup_checks
from .arguments import refuse_foreign_arguments
from .checkpoint import (
    check_checkpoint_fits,
    check_checkpoint_step,
    newest_complete_checkpoint,
    verify_checkpoint,
    warn_settings_restored,
)
from .collator import MODEL_INPUTS, StepContext, StepTickets, ticket_collator
from .config import TRAPOConfig, check_hub_repo_id
from .data import progress_bars
from .distributed import check_launch, sum_over_ranks
from .exploration import TargetedExploration
from .handles import ModelHandles
from .interrupts import Interruption, TrainingAborted, TrainingInterrupted, aborted
from .memory import ReplayBuffer, SampleSelector, Trajectory
from .models import (
    CountedPositionHead,
    PolicyAndValueWrapper,
    counted_log_probs,
    embeddable_saved_pad_ids,
    model_forward,
)
from .nonfinite import NonFiniteGuard
from .objectives import DistillationObjective, Objective, TermInputs, check_term, row_logit_scales
from .rollout import RolloutBatch
from .saving import SaveError, check_earlier_checkpoints, describe_os_error, hub_error, is_hub_error, staged_save
from .schedules import scale_scheduler
from .setup_checks import built_outside_inference_mode, check_train_call, refuse_hyperparameter_search
from .sources import RolloutSource, bind_rollout_func
from .vision import needs_every_parameter, vision_parameters
from .wiring import TrainerLink, assemble_rollouts, assemble_rows, assemble_run, assemble_training


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

    def __new__(cls, *args, **kwargs):
        refuse_foreign_arguments(cls, kwargs, args)  # before Python binds them: its errors name no fix
        return super().__new__(cls)

    @built_outside_inference_mode  # its tensors must train even when it is built in `torch.inference_mode()`
    @setup_checks.remembers_args  # the config as built: `train` refuses a field changed since that only this reads
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
        args = TRAPOConfig(output_dir="trapo-output") if args is None else args
        # ---- steps 1-4, before the Trainer exists (trl_trapo/wiring.py): the checks before anything slow loads, the
        # policy, tokenizer, reference, critic and teacher, the rewards, the datasets (checked and tokenized), the plan
        run = assemble_run(
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
            dict(
                train_dataset=train_dataset,
                sft_dataset=sft_dataset,
                pretrain_dataset=pretrain_dataset,
                eval_dataset=eval_dataset,
                distillation_dataset=distillation_dataset,
            ),
            objectives=objectives,
            rollout_source=rollout_source,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
            trainer_state=lambda: getattr(self, "state", None),
        )
        models, checked = run.models, run.checked
        self._verified_checkpoint = checked.verified_checkpoint  # `train` does not hash it again
        self.thread_choice = checked.thread_choice
        # skips an optimizer step whose loss was not finite on any rank (see create_optimizer)
        self.nonfinite = NonFiniteGuard(args.max_nonfinite_steps, self._reduce_sum)
        self._has_critic = models.has_critic
        self.kl_penalty, self.kl_estimator = models.kl_penalty, models.kl_estimator
        self.metrics, self.rewards = run.metrics, run.rewards
        self._rl_dataset = run.data.rl  # the RL prompts (the default rollout source's)
        self._sft_dataset = run.data.sft  # the tokenized demonstrations (the memory pool's)
        self._planned_steps = run.plan.planned_steps
        # the Trainer, on one ticket per row slot of the plan
        super().__init__(
            model=models.trained,
            args=run.args,
            data_collator=ticket_collator,
            train_dataset=StepTickets(run.plan.tickets),
            eval_dataset=run.checked.datasets["eval_dataset"],  # a transform applied (data.apply_transforms)
            processing_class=models.processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        check_launch(self.accelerator)
        # a VLM under DDP: text-only micro-batches take the vision encoder into the graph with a zero term
        with_images = models.image_rows is not None and self.accelerator.num_processes > 1
        self._vision_parameters = vision_parameters(models.policy) if with_images else []
        # how the collaborators reach the trained model, which the Trainer re-wraps as it runs (trl_trapo/handles.py)
        self.handles = ModelHandles(
            self.accelerator,
            lambda: self.model,
            lambda: self.model_wrapped,
            gather_for_generation=self.args.ds3_gather_for_generation,
            deepspeed=self.is_deepspeed_enabled,
        )
        link = TrainerLink(
            self.accelerator,
            self.handles,
            zero3=self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3,
            reduce_sum=self._reduce_sum,
            logging_step=self._is_logging_step,
            state=lambda: self.state,
            should_save=lambda: self.args.should_save,
            callbacks=self.callback_handler.callbacks,
            nonfinite=self.nonfinite,
        )
        # ---- steps 5-6. the objectives' rows (per rank) and what decides each step ----------------------------------
        rows = assemble_rows(
            run, link, replay_max_uses=self.replay_max_uses(), build_sample_selector=self.build_sample_selector
        )
        if rows.adapter_bank is not None:
            self.add_callback(rows.adapter_bank)
        # what train() compares with a checkpoint it resumes
        fit = dict(datasets=checked.datasets_summary, rollout_state=checked.rollout_state, critic=models.has_critic)
        self._resume_fit = dict(fit, settings=rows.state_settings)
        self.memory_pool, self.allocator, self.curriculum = rows.memory_pool, rows.allocator, rows.curriculum
        self.dare, self.schedules = rows.dare, rows.schedules

        # ---- steps 7-8. frozen models, the rollout engine, the rollout source and the RL objective's supply ---------
        bound = bind_rollout_func(rollout_func, self) if rollout_func is not None else None  # TRL's: gets the trainer
        rollouts = assemble_rollouts(run, link, rows, rollout_source=rollout_source, rollout_func=bound)
        self.padding_id, self.ref_model, self.reference = rollouts.padding_id, rollouts.ref_model, rollouts.reference
        self.counted_head, self.generation_config = rollouts.counted_head, rollouts.generation_config
        self.rollouts, self.rollout_source, self.rl_supply = rollouts.engine, rollouts.source, rollouts.supply

        # ---- steps 9-10. the objectives, evaluation, the step builder, durable state, callbacks ---------------------
        training = assemble_training(run, link, rows, rollouts)
        self.objectives: list[Objective] = training.objectives
        self.evaluator, self.step_builder, self.run_state = training.evaluator, training.steps, training.state
        self.run_metrics = training.metrics  # what `log` adds
        self._checkpoint_guard, self._signal_catcher = training.checkpoint_guard, training.signal_catcher
        training.callbacks.apply(add=self.add_callback, remove=self.remove_callback)
        self._run_callbacks = training.callbacks  # TRAPO's own; train() warns when one it needs was removed since

    # =================================================================================================================
    # Construction hooks: what a subclass may override to change how samples are chosen and reused
    # =================================================================================================================
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
    # Read-only views of the collaborators
    # =================================================================================================================
    def _unwrapped_policy(self) -> nn.Module:
        return self.handles.policy()

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
        return self.step_builder.build(self.state.global_step, len(tickets))

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
            TypeError: without the step's [`StepContext`] (TRAPOTrainer builds it in `get_batch_samples`), e.g.
                `trainer.compute_loss(model, {"input_ids": ...})`: the message says what to use instead.
        """
        context = num_items_in_batch
        if not isinstance(context, StepContext):
            raise TypeError(direct_calls.compute_loss_without_context(context))
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
        row_scale = row_logit_scales(self.objectives, inputs, rows)
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
            check_term(term_objective, term, view)
            self.nonfinite.record_term(term_objective.name, term.loss)  # names it if the step is skipped
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
            hidden = outputs.hidden_states[-1][:, :-1]  # (B, T, H): the states the LM head reads
            self.dare.accumulate(hidden, logits, targets, objective, counted, inputs["half"], rows, terms, views)

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
            logs.update(self.run_metrics.collect(self.state.global_step))
            if "learning_rate" in logs:
                # TRL 1.12's `lr`: the rate the logged step used, which is what the Trainer logs as `learning_rate`
                # (read before its scheduler steps); the scheduler's `get_last_lr()` would be the next step's
                logs["lr"] = logs["learning_rate"]
        super().log(logs, start_time)

    @torch.no_grad()
    def generate_completions(self, sampling: bool = False, dataset=None) -> list[dict[str, Any]]:
        """Greedy completions of the prompts of `dataset` (default: the eval set) with their scores, printed as a table
        and logged to W&B / Trackio when in `report_to`, as TRL 1.12's PPOTrainer did (see `Evaluator`'s method).

        Args:
            sampling (`bool`): only the first `per_device_eval_batch_size` prompts (used during training).
            dataset (`Dataset`, *optional*): prompts to complete instead of the eval set, taken as `evaluate()` takes.

        Returns `list[dict]`: one `{"prompt", "completion", "score"}` per prompt on this rank. Raises `TypeError` if
        `sampling` is not a bool (a dataset passed as it); `ValueError` without prompts (`sampling=True`: `[]`).
        """
        return self.evaluator.generate_completions(self.eval_dataset, self.state.global_step, sampling, dataset)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate held-out data by its format (see [`~trl_trapo.evaluation.Evaluator.evaluate`]); a dict of datasets
        is evaluated one by one with prefix `<prefix>_<name>`.

        Args:
            eval_dataset: a dataset or dict of datasets; a key of the trainer's eval dict (transformers' Trainer API);
                None: the trainer's own (`Evaluator.dataset_given`).

        Raises:
            ValueError: if there is no eval dataset, a key the trainer's eval dict lacks, or a dataset given here is
                not one TRAPO evaluates (checked as at construction: format, map-style, missing values, conversations
                without a chat template).
        """
        dataset = self.evaluator.dataset_given(eval_dataset, self.eval_dataset)  # checked as at construction
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
            "`trainer.generate_completions(dataset=dataset)` for the policy's greedy completions and their scores."
        )

    # Trainer methods a user calls directly to look at the data (trl_trapo/direct_calls.py)
    get_eval_dataloader, get_test_dataloader = direct_calls.get_eval_dataloader, direct_calls.get_test_dataloader
    rows_dataloader, prediction_step = direct_calls.rows_dataloader, direct_calls.prediction_step
    hyperparameter_search = refuse_hyperparameter_search  # no `model_init`: one trainer per setting

    @setup_checks.refuses_changed_args  # trainer.args changed since construction in a field read only then: ValueError
    @saving.holds_output_dir  # one run at a time per output_dir: the main process locks it while this runs (saving.py)
    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train`, resuming TRAPO's own state too.

        `resume_from_checkpoint=True` picks the newest *complete* checkpoint of `output_dir` (one a run was killed
        while writing is skipped, with a warning saying why); an explicit path must be complete.

        SIGINT (Ctrl-C), SIGTERM or SIGHUP during training finishes the optimizer step in progress, saves the normal
        `checkpoint-N` (TRAPO's state included) and stops on every rank at the same step; `train()` then raises
        `TrainingInterrupted` (see `trl_trapo.interrupts`). The previous signal handlers are restored when `train()`
        returns or raises.

        Raises:
            ValueError: before anything is written: `output_dir` is in use by another run (`saving.holds_output_dir`)
                or holds checkpoints of an unfinished run this one does not resume, without `overwrite_output_dir=True`
                (`saving.check_earlier_checkpoints`); a field of `trainer.args` read only at construction was changed
                since (`setup_checks.check_args_unchanged`).
            CheckpointError: naming the file, if the checkpoint to resume from is incomplete, corrupted or does not
                fit the run (`check_checkpoint_fits`), or if `resume_from_checkpoint=True` finds no complete one.
            TypeError: `resume_from_checkpoint` is neither a path, a bool nor None (e.g. an int).
            ValueError: `trial` is given: it is the hyperparameter search's handle, and TRAPOTrainer has no search
                (see [`~trl_trapo.setup_checks.check_train_call`]).
            RuntimeError: gradients are disabled (inside `torch.no_grad()` / `torch.inference_mode()`).
            TrainingInterrupted: (a `KeyboardInterrupt`) after SIGINT / SIGTERM / SIGHUP, the checkpoint saved; its
                message is one line saying how to resume, its `interruption` (also `trainer.interruption`) says where.
            TrainingAborted: (a `KeyboardInterrupt`) on a second Ctrl-C, with nothing saved for the step in progress;
                the message names the newest complete checkpoint.
        """
        resume_from_checkpoint = check_train_call(resume_from_checkpoint, trial)  # path as text, grads on, no trial
        self._run_callbacks.warn_removed(self.callback_handler.callbacks)  # one TRAPO needs, popped by the user
        # an unfinished run's checkpoints in output_dir: resumed, or replaced only when told to (before any write)
        check_earlier_checkpoints(self.args, resume_from_checkpoint, cli=False)
        world = self.accelerator.num_processes
        if resume_from_checkpoint is True:  # the newest complete one (newer incomplete ones are warned about)
            resume_from_checkpoint = newest_complete_checkpoint(self.args.output_dir, world)
        self.run_metrics.start()
        if resume_from_checkpoint:
            if os.path.abspath(resume_from_checkpoint) != self._verified_checkpoint:  # verified at construction
                verify_checkpoint(resume_from_checkpoint, world)
                policy = self._unwrapped_policy()
                check_checkpoint_fits(resume_from_checkpoint, is_peft_model(policy), model=policy, **self._resume_fit)
            check_checkpoint_step(resume_from_checkpoint, self.args.max_steps)
            if self.accelerator.is_main_process:  # a new learning rate would not be used, without a word (trial 6)
                warn_settings_restored(resume_from_checkpoint, self.args, self.objectives)  # and static weights
            self.run_state.load(resume_from_checkpoint)
            self.handles.restore_converted_weights(resume_from_checkpoint)
            logger.info("Resuming from %s", resume_from_checkpoint)
        try:
            with (catcher := self._signal_catcher):  # SIGINT / SIGTERM handlers only while training (interrupts.py)
                output = super().train(
                    resume_from_checkpoint=resume_from_checkpoint,
                    trial=trial,
                    ignore_keys_for_eval=ignore_keys_for_eval,
                    **kwargs,
                )
        except TrainingAborted:
            self.rl_supply.close(abort=True)
            raise aborted(self.state.global_step + 1, self.args.output_dir, world) from None
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
            self.handles.restore_converted_weights(best)  # the Trainer loaded it as it resumes: the same blind spot
        if self.interruption is not None:  # checkpoint saved, on_train_end run: stop the caller too (interrupts.py)
            raise TrainingInterrupted(self.interruption)
        if catcher.received is not None:  # arrived after the last step had ended: let it act as it would have
            signal.raise_signal(catcher.received)
        return output

    @property
    def interruption(self) -> Interruption | None:
        """Where the last `train()` stopped after SIGINT / SIGTERM (step, signal, checkpoint), or None if it was not
        interrupted (the `TrainingInterrupted` it raised carries the same). `interruption.exit_code` is what a command
        line exits with (130 / 143)."""
        return self._run_callbacks.stop_on_signal.interruption

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
