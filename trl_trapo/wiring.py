# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The run's assembly in the order `TRAPOTrainer.__init__` runs it (issue 39), as four functions that each return a
small frozen bundle the trainer stores:

1. [`assemble_run`] (before `Trainer.__init__`): the checks, the models, the rewards, the datasets, the plan →
   [`RunParts`];
2. [`assemble_rows`]: where each objective's rows come from and what decides each step — the pretraining stream and
   the user's objectives, the replay buffer, the memory pool, targeted exploration, the step controls →
   [`RowParts`];
3. [`assemble_rollouts`]: the frozen models, the rollout engine, the rollout source and the RL objective's supply →
   [`RolloutParts`];
4. [`assemble_training`]: the objectives, the evaluator, the step builder, TRAPO's checkpointed state and the
   callbacks → [`TrainingParts`].

Each calls the construction steps of `trl_trapo/assembly.py`. What the last three read of the running `Trainer` comes
in a [`TrainerLink`] of values and callables: no function here takes the trainer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .arguments import paths_as_strings
from .assembly import (
    Models,
    RunCallbacks,
    RunChecks,
    RunPlan,
    SourceParts,
    build_adapter_bank,
    build_callbacks,
    build_eval_tool_rollouts,
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
    state_settings,
    task_families,
    warn_unused_rewards,
)
from .config import TRAPOConfig
from .data import PreparedData, named_datasets
from .evaluation import Evaluator
from .handles import ModelHandles
from .interrupts import SignalCatcher
from .metrics import MetricsAccumulator, RunMetrics
from .models import CountedPositionHead, embedding_rows, embedding_safe_pad_id
from .objectives import Objective, ObjectiveSetup
from .rewards import RewardScorer
from .rl_supply import RLSupply, build_replay_buffer
from .rollout import RolloutEngine, rollout_generation_config, stop_token_ids
from .run_state import RunState
from .saving import CheckpointGuard, check_disk_space, checkpoint_nbytes
from .setup_checks import check_optimizer_covers, warn_warmup_covers_run
from .sources import note_rounds_follow_shares, warn_split_rounds
from .steps import StepBuilder
from .vision import model_context


MAX_LOGGED_TASKS = 32  # a `task` column with more distinct values is not a family label: no per-task metrics


# ---- 1. before the Trainer exists ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunParts:
    """What [`assemble_run`] built before the `Trainer` exists.

    Attributes:
        args ([`TRAPOConfig`]): the config, or a copy with `max_steps` set to the planned steps when the run's length
            comes from `num_train_epochs` / `total_episodes` (the config itself is never changed).
        checked ([`~trl_trapo.assembly.RunChecks`]): what the checks before anything slow found.
        models ([`~trl_trapo.assembly.Models`]): the policy, tokenizer, reference, critic and teacher.
        metrics ([`~trl_trapo.metrics.MetricsAccumulator`]): the run's metrics (its reward names and task families
            set).
        rewards ([`~trl_trapo.rewards.RewardScorer`]): the reward functions and models.
        data ([`~trl_trapo.data.PreparedData`]): the datasets, checked and tokenized.
        plan ([`~trl_trapo.assembly.RunPlan`]): the objectives' slots, the curriculum and the number of steps.
        task_families (`list[str]`, *optional*): the RL prompts' task families (per-task metrics), or None.
    """

    args: TRAPOConfig
    checked: RunChecks
    models: Models
    metrics: MetricsAccumulator
    rewards: RewardScorer
    data: PreparedData
    plan: RunPlan
    task_families: list[str] | None


def assemble_run(
    args: TRAPOConfig,
    arguments: dict[str, Any],
    datasets: dict[str, Any],
    *,
    objectives: list[Objective] | None,
    rollout_source: Any,
    rollout_func: Callable | None,
    environment_factory: Any,
    trainer_state: Callable[[], Any],
) -> RunParts:
    """Steps 1-4 of `TRAPOTrainer.__init__`: `check_run` (before anything slow loads), `load_models`,
    `build_rewards`, `prepare_run_data` and `check_data_fits`, `plan_run`, and the disk space a checkpoint needs.

    Args:
        arguments (`dict`): the trainer's model arguments by name (`model`, `reward_funcs`, `processing_class`,
            `reward_processing_classes`, `ref_model`, `reward_model`, `value_model`, `teacher_model`, `peft_config`,
            `callbacks`, `optimizers`, `tools`), as `check_run` takes them.
        datasets (`dict`): `train_dataset`, `sft_dataset`, `pretrain_dataset`, `eval_dataset`,
            `distillation_dataset` (not changed: `RunParts.checked.datasets` holds them as the run reads them).
        trainer_state (`Callable[[], TrainerState | None]`): the `Trainer`'s state once it exists (reward functions
            get it).

    Raises:
        TypeError / ValueError / CheckpointError: from the steps above, before any training, naming the argument and
            the fix.
    """
    kinds = dict(rollout_source=rollout_source, rollout_func=rollout_func, environment_factory=environment_factory)
    arguments = paths_as_strings(arguments)  # `model=Path(folder)`: its text, as `from_pretrained` reads it
    checked = check_run(args, arguments, datasets, **kinds, objectives=objectives)
    datasets = checked.datasets  # as the run reads them: transforms applied, the agent's prompts when rewritten
    # ---- step 1. policy, tokenizer, reference, critic and teacher; step 2. rewards
    models = load_models(
        args,
        arguments["model"],
        **{k: arguments[k] for k in ("processing_class", "ref_model", "value_model", "teacher_model", "peft_config")},
        agent=checked.agent,
        train_dataset=checked.train_dataset,
        named_datasets=named_datasets(datasets),
        verified_checkpoint=checked.verified_checkpoint,
    )
    # a user's optimizer over none of the trained parameters: the policy would never move (setup_checks.py)
    adapter = arguments["peft_config"] is not None
    check_optimizer_covers((arguments.get("optimizers") or (None, None))[0], models.trained, adapter)
    metrics = MetricsAccumulator([], scale_rewards=args.scale_rewards)
    reward_arguments = (arguments["reward_funcs"], arguments["reward_model"], arguments["reward_processing_classes"])
    rewards = build_rewards(
        args, models, *reward_arguments, agent=checked.agent, metrics=metrics, trainer_state=trainer_state
    )
    metrics.reward_names = list(rewards.names)
    # ---- step 3. datasets (checked and tokenized before anything is trained)
    own_rounds = rollout_source is not None or rollout_func is not None
    if not own_rounds:
        warn_unused_rewards(rewards, *reward_arguments[:2], datasets)
    data = prepare_run_data(args, models, datasets, rewards=rewards, user_source=own_rounds)
    families = task_families(data.rl, MAX_LOGGED_TASKS)  # rl/zero_variance_groups per task family
    if families is not None:
        metrics.track_tasks(families)
    check_data_fits(args, data, models, rewards, checked.agent, rollout_func, datasets)  # contexts, reward checks
    # ---- step 4. the plan (objectives, curriculum phases, steps)
    with_teacher, eval_dataset = models.teacher is not None, datasets["eval_dataset"]
    plan = plan_run(
        args, data, objectives, with_teacher=with_teacher, has_critic=models.has_critic, eval_dataset=eval_dataset
    )
    warn_warmup_covers_run(args, plan.planned_steps, arguments.get("optimizers") or (None, None))  # lr never peaks
    check_disk_space(
        args.output_dir,
        checkpoint_nbytes(models.trained, args.optim, args.save_only_model),
        checkpoints=args.save_strategy != "no",
    )
    if args.max_steps <= 0:  # the run's length is the plan (the curriculum, schedules and pools are sized by it):
        # set it in the trainer's own copy, or the Trainer would round epochs of tickets up to its own length
        args = dataclasses.replace(args, max_steps=plan.planned_steps)
    return RunParts(args, checked, models, metrics, rewards, data, plan, families)


# ---- what the assembly after Trainer.__init__ reads of the running Trainer -------------------------------------------
@dataclasses.dataclass(frozen=True)
class TrainerLink:
    """The running `Trainer` as the assembly sees it: values, and callables read at each call.

    Attributes:
        accelerator (`accelerate.Accelerator`): the `Trainer`'s.
        handles ([`~trl_trapo.handles.ModelHandles`]): the trained model as the collaborators reach it.
        zero3 (`bool`): the `Trainer` runs under DeepSpeed ZeRO-3.
        reduce_sum (`Callable[[torch.Tensor], torch.Tensor]`): a tensor summed over ranks.
        logging_step (`Callable[[], bool]`): whether the step in progress is logged.
        state (`Callable[[], TrainerState]`): the `Trainer`'s state.
        should_save (`Callable[[], bool]`): whether this process writes shared files (`args.should_save`).
        callbacks (`list[TrainerCallback]`): the `Trainer`'s callbacks so far.
        nonfinite ([`~trl_trapo.nonfinite.NonFiniteGuard`]): the trainer's guard (its count is checkpointed and
            logged).
    """

    accelerator: Any
    handles: ModelHandles
    zero3: bool
    reduce_sum: Callable[[torch.Tensor], torch.Tensor]
    logging_step: Callable[[], bool]
    state: Callable[[], Any]
    should_save: Callable[[], bool]
    callbacks: list
    nonfinite: Any


# ---- 2. the objectives' rows and what decides each step -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RowParts:
    """What [`assemble_rows`] built: the pretraining objective (its stream, set up with the user's objectives), the
    RL objective's replay buffer, the adapter bank (a callback to add; None unless `adapter_bank=True`), the memory
    pool, targeted exploration (None when off), and the step controls: the row allocator, the curriculum, DARE and
    the RL coefficient schedules; `state_settings`, the run's values of the settings a checkpoint's state must share
    ([`~trl_trapo.assembly.state_settings`], the adapter bank's now known), which `train()` compares with a checkpoint
    it resumes."""

    pretrain: Objective
    replay: Any
    adapter_bank: Any
    memory_pool: Any
    exploration: Any
    allocator: Any
    curriculum: Any
    dare: Any
    schedules: Any
    state_settings: dict = dataclasses.field(default_factory=dict)


def assemble_rows(
    run: RunParts, link: TrainerLink, *, replay_max_uses: int, build_sample_selector: Callable[..., Any]
) -> RowParts:
    """Step 5-6 of `TRAPOTrainer.__init__`: the objectives' rows (per rank) and the step controls.

    Args:
        replay_max_uses (`int`): how many times the replay buffer serves each trajectory (the trainer's hook).
        build_sample_selector (`Callable`): the trainer's construction hook `build_sample_selector`.
    """
    args, data, plan, models = run.args, run.data, run.plan, run.models
    rank, world = link.accelerator.process_index, link.accelerator.num_processes
    policy, steps = models.policy, plan.planned_steps
    pretrain = setup_objectives(  # the pretraining stream and the user's objectives, indexed by the plan
        args,
        data,
        plan,
        lambda index: ObjectiveSetup(
            index, args, models.tokenizer, rank, world, steps, model_context(policy), models.image_rows
        ),
    )
    # the RL objective's replay buffer: each trajectory served `replay_max_uses` times (few-shot mode raises it)
    replay = build_replay_buffer(args, replay_max_uses, rank)
    adapter_bank = build_adapter_bank(args, link.handles.policy, link.accelerator, link.zero3, replay)
    # the RL prompt sampler, the long-term SFT pool, a sample selector (none unless a subclass builds one:
    # few-shot mode) and the adapter bank (trl_trapo/memory/pool.py)
    memory_pool = build_memory_pool(
        args,
        data,
        steps,
        rank,
        world,
        selector=lambda sft_pool, prompt_sampler: build_sample_selector(
            sft_pool, prompt_sampler, data.rl, steps, link.handles.policy(), link.handles.for_rollouts
        ),
        adapter_bank=adapter_bank,
    )
    # targeted exploration: families whose groups carry no signal are sampled hotter (trl_trapo/exploration.py)
    exploration = build_run_exploration(
        args,
        data,
        models,
        own_source=run.checked.own_source,
        world_size=world,
        with_successes=memory_pool.successes is not None,
        agent=run.checked.agent,
    )
    # ---- step 6. what decides each step: curriculum, DARE, RL coefficient schedules
    controls = build_step_controls(
        args, plan, probe_noise_floor(policy, args), link.handles.policy, link.accelerator.device
    )
    settings = state_settings(args, adapter_bank is not None)
    return RowParts(pretrain, replay, adapter_bank, memory_pool, exploration, *controls, state_settings=settings)


# ---- 3. the frozen models, the rollout engine and the RL objective's supply ------------------------------------------
@dataclasses.dataclass(frozen=True)
class RolloutParts:
    """What [`assemble_rollouts`] built: the id in padding positions, the prepared reference model (or None), the
    KL's reference ([`~trl_trapo.models.ReferencePolicy`] or None), the distillation teacher (or None), the training
    forward's output layer restricted to counted positions, the rollouts' generation config and stop tokens, the
    rollout engine, the rollout source as given or built (`trainer.rollout_source`), the RL objective's supply and what the supply
    needs run on the Trainer's schedule (`assembly.RLSupplyParts.callbacks`), and the run's SIGINT / SIGTERM catcher
    (made here: the tool-calling source asks it whether the run is stopping, so that a hung tool call does not hold
    up the stop; [`assemble_training`] gives it to the callback that stops the run)."""

    padding_id: int
    ref_model: Any
    reference: Any
    teacher: Any
    counted_head: CountedPositionHead
    generation_config: Any
    stops: list[int]
    engine: RolloutEngine
    source: Any
    supply: RLSupply
    supply_callbacks: list = dataclasses.field(default_factory=list)
    signal_catcher: SignalCatcher = dataclasses.field(default_factory=SignalCatcher)


def assemble_rollouts(
    run: RunParts, link: TrainerLink, rows: RowParts, *, rollout_source: Any, rollout_func: Callable | None
) -> RolloutParts:
    """Step 7-8 of `TRAPOTrainer.__init__`: the frozen models and the rollout engine, then where RL rounds come from
    (the user's source, or the default one sampling with the live policy), the replay buffer and the orchestration
    between them (`assembly.build_rl_supply`, trl_trapo/rl_supply.py).

    Args:
        rollout_func (`Callable`, *optional*): TRL's `rollout_func`, already bound to the trainer (TRL's contract).
    """
    args, models, tokenizer = run.args, run.models, run.models.tokenizer
    # the id in padding positions: the tokenizer's pad id, unless the models cannot embed it (TRL 1.12's PPO
    # example adds a [PAD] token without resizing the embeddings); padding is never read (masks come from lengths)
    padding_id = embedding_safe_pad_id(tokenizer, link.handles.policy(), models.value_model)
    ref_model, teacher, reference = prepare_frozen_models(
        args, models, run.rewards, link.handles.prepare_frozen, link.accelerator, padding_id
    )
    counted_head = CountedPositionHead(link.handles.policy())  # the output layer runs only at counted positions
    generation_config = rollout_generation_config(args, tokenizer, padding_id)
    stops = stop_token_ids(args, tokenizer)  # what stops generation is exactly what cuts the mask
    active_rl = run.data.rl is not None
    # SIGINT / SIGTERM: the step finishes without waiting on tool calls (agents.ToolRunner), then a checkpoint, stop
    catcher = SignalCatcher(announce=link.accelerator.is_main_process)
    common = dict(schedules=rows.schedules, padding_id=padding_id, stops=stops, generation_config=generation_config)
    engine = build_rollout_engine(
        args,
        models,
        run.rewards,
        reference,
        unwrapped_for_rollouts=link.handles.for_rollouts,
        accelerator=link.accelerator,
        policy=link.handles.policy(),
        active_rl=active_rl,
        teacher=teacher,
        **common,
    )
    parts = SourceParts(
        engine=engine,
        rl_dataset=run.data.rl,
        memory_pool=rows.memory_pool,
        rewards=run.rewards,
        tokenizer=tokenizer,
        metrics=run.metrics,
        accelerator=link.accelerator,
        policy=link.handles.policy,
        context=model_context(models.policy),
        suppressed_token_ids=list(models.suppressed_token_ids),
        producer_threads=run.checked.thread_choice.producer_threads,
        zero3=link.zero3,
        images=models.image_rows,
        stopping=catcher.stopping,
        **{k: v for k, v in common.items() if k != "schedules"},
    )
    supply = build_rl_supply(
        args,
        parts,
        replay=rows.replay,
        schedules=rows.schedules,
        rollout_source=rollout_source,
        rollout_func=rollout_func,
        agent=run.checked.agent,
        own_source=run.checked.own_source,
        active_rl=active_rl,
        has_critic=models.has_critic,
        exploration=rows.exploration,
        task_families=run.task_families,
        on_episode=lambda episode: setattr(link.state(), "episode", episode),  # current even between logs
    )
    # a built-in source (the default, tools, TRL's rollout_func: rounds of whole groups) in a run whose one objective
    # is RL (fixed RL rows per step): a round that does not fit whole steps is said
    active = [name for name, on in zip(run.plan.slots.names, run.plan.active) if on]
    group = 1 if models.has_critic and rollout_func is None else args.num_generations
    if rollout_source is None and active == ["rl"]:
        batch, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
        warn_split_rounds(batch, accumulation, group, args.num_mini_batches)
    elif rollout_source is None and "rl" in active:  # a step's RL rows follow the shares: said, not warned
        note_rounds_follow_shares(group, args.num_mini_batches)
    frozen = (padding_id, ref_model, reference, teacher, counted_head)
    built = (generation_config, stops, engine, supply.source, supply.supply, supply.callbacks, catcher)
    return RolloutParts(*frozen, *built)


def build_evaluator(run: RunParts, link: TrainerLink, rollouts: RolloutParts) -> Evaluator:
    """The evaluator of held-out data: the rollouts' generation config, stops and padding, the policy for eval; in a
    run with tools, the greedy multi-turn rollouts that evaluate its prompts through the training loop."""
    models = run.models
    tool_rollouts = build_eval_tool_rollouts(
        run.args,
        run.checked.agent,
        models.tokenizer,
        rollouts.padding_id,
        rollouts.stops,
        model_context(models.policy),
        models.image_rows,
        link.accelerator,
    )
    return Evaluator(
        run.args,
        models.tokenizer,
        run.rewards,
        link.accelerator,
        link.handles.policy_for_eval,
        rollouts.generation_config,
        rollouts.stops,
        rollouts.padding_id,
        images=models.image_rows,
        vocab_size=embedding_rows(models.policy),
        tool_rollouts=tool_rollouts,
    )


# ---- 4. the objectives, evaluation, the step builder, durable state, callbacks ---------------------------------------
@dataclasses.dataclass(frozen=True)
class TrainingParts:
    """What [`assemble_training`] built: the objectives in the order of their names, the evaluator, the builder of
    each step's rows ([`~trl_trapo.steps.StepBuilder`]), TRAPO's checkpointed state
    ([`~trl_trapo.run_state.RunState`]), the guard that undoes a failed checkpoint save, the SIGINT / SIGTERM catcher,
    the callbacks to remove and add ([`~trl_trapo.assembly.RunCallbacks`]) and what each log adds
    ([`~trl_trapo.metrics.RunMetrics`])."""

    objectives: list[Objective]
    evaluator: Evaluator
    steps: StepBuilder
    state: RunState
    checkpoint_guard: CheckpointGuard
    signal_catcher: SignalCatcher
    callbacks: RunCallbacks
    metrics: RunMetrics


def assemble_training(run: RunParts, link: TrainerLink, rows: RowParts, rollouts: RolloutParts) -> TrainingParts:
    """Step 9-10 of `TRAPOTrainer.__init__`: the objectives, evaluator, step builder, checkpoint state, callbacks
    (`assembly.build_callbacks`) and what each log adds."""
    args, models, accelerator = run.args, run.models, link.accelerator
    rank, world = accelerator.process_index, accelerator.num_processes
    # in the order of `names` (a row's `objective` is its objective's index here; trl_trapo/objectives.py)
    objectives = build_objectives(
        args,
        pretrain=rows.pretrain,
        memory_pool=rows.memory_pool,
        take_rl_rows=rollouts.supply.take_rows,
        schedules=rows.schedules,
        kl_penalty=models.kl_penalty,
        kl_estimator=models.kl_estimator,
        logging_step=link.logging_step,
        data=run.data,
        teacher=rollouts.teacher,
        sampler=rollouts.engine,
        extra=run.plan.extra,
        tokenizer=models.tokenizer,
        rank=rank,
        world_size=world,
        planned_steps=run.plan.planned_steps,
    )
    evaluator = build_evaluator(run, link, rollouts)
    steps = StepBuilder(
        args.per_device_train_batch_size,
        objectives,
        *(rows.allocator, rows.curriculum, rows.dare),
        *(rollouts.padding_id, link.reduce_sum),
        args.seed + 4 + rank,
        vocab_size=embedding_rows(models.policy),
        context=model_context(models.policy),
        on_start=run.metrics.start_step,
    )
    # a checkpoint is complete once TRAPO's markers are in; a save failing before that is undone (saving.py)
    guard = CheckpointGuard(link.should_save, checkpoint_nbytes(models.trained, args.optim, args.save_only_model))
    state = RunState(
        accelerator,
        lambda: link.state().global_step,
        objectives,
        nonfinite=link.nonfinite,
        allocator=rows.allocator,
        dare=rows.dare,
        schedules=rows.schedules,
        rl_supply=rollouts.supply,
        memory_pool=rows.memory_pool,
        reference=rollouts.reference,
        generators=lambda: {"rows": steps.generator, **rollouts.engine.state_dict()},
        policy=link.handles.policy,
        sync_reference=args.sync_ref_model,
        datasets_summary=run.checked.datasets_summary,
        on_complete=guard.end,
    )
    # SIGINT / SIGTERM save a checkpoint and stop (train()), by the callback added last
    catcher = rollouts.signal_catcher
    callbacks = build_callbacks(
        args,
        existing=link.callbacks,
        schedules=rows.schedules,
        reduce_sum=link.reduce_sum,
        model_wrapped=link.handles.model_wrapped,
        accelerator=accelerator,
        save_state=state.save,
        pending=lambda: guard.pending,
        reference=rollouts.reference,
        policy=link.handles.policy,
        signal_catcher=catcher,
        supply_callbacks=rollouts.supply_callbacks,
        allocator=rows.allocator,
        epoch_rows=run.plan.epoch_rows,
    )
    metrics = build_run_metrics(run, link, rows, rollouts, objectives, steps)
    return TrainingParts(objectives, evaluator, steps, state, guard, catcher, callbacks, metrics)


def build_run_metrics(
    run: RunParts, link: TrainerLink, rows: RowParts, rollouts: RolloutParts, objectives: list, steps: StepBuilder
) -> RunMetrics:
    """What each log adds: the run's accumulated metrics and every collaborator's own."""
    return RunMetrics(
        run.metrics,
        link.accelerator,
        step_builder=steps,
        dare=rows.dare,
        schedules=rows.schedules,
        memory_pool=rows.memory_pool,
        objectives=objectives,
        rl_supply=rollouts.supply,
        nonfinite=link.nonfinite,
        on_episode=lambda episode: setattr(link.state(), "episode", episode),
    )
