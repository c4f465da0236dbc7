# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""How a run is assembled: the construction steps of [`~trl_trapo.TRAPOTrainer`] that need no trainer.

Each function takes what it needs as arguments and returns what it builds; `TRAPOTrainer.__init__` calls them in
order and wires the results to the `Trainer` hooks (issue 39):

1. [`check_run`]: the checks that run before anything slow loads — the launch, the arguments' types, the rollout
   source and the agent arguments (TRL's `tools` / `environment_factory`), the output directory, the datasets, the
   training setup, the best-model metric, the checkpoint to resume from (hashed once, here, and checked to fit the
   run), and torch's CPU threads;
2. [`build_rollout_source`]: where the RL objective's rounds come from — the user's `rollout_source`, TRL's
   `rollout_func`, the tool-calling source of `tools` / `environment_factory`, the asynchronous producer
   (`async_rollouts=True`) or the default [`~trl_trapo.sources.SyncRolloutSource`];
3. [`build_objectives`]: the objectives in the order of their names, the built-in ones on their supply (the memory
   pool, the RL supply's rows, the teacher).

Optional capabilities (agents, asynchronous rollouts) are imported inside the function that builds them, so a run
that does not use them never loads them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accelerate.utils import DistributedType, is_peft_model
from datasets import Dataset
from torch import nn
from transformers import AutoProcessor, AutoTokenizer
from transformers.trainer_callback import DefaultFlowCallback

from .arguments import check_config_type, check_trainable, check_trainer_arguments
from .callbacks import (
    SHORT_CONSOLE_CALLBACKS,
    AdapterBankCallback,
    AdaptiveKLCallback,
    DDPCommHookCallback,
    EndProcessGroupAtExitCallback,
    EpochCallback,
    StateCheckpointCallback,
    StopOnSignalCallback,
    SyncReferenceCallback,
    WeightSnapshotCallback,
    warn_removed_callbacks,
)
from .checkpoint import (
    STATE_DIR,
    check_checkpoint_fits,
    check_checkpoint_step,
    datasets_summary,
    read_state_file,
    verify_checkpoint,
)
from .collator import RowAllocator, plan_steps
from .config import ADAPTER_BANK_FIELDS, DEFAULT_MAX_STALENESS, TRAPOConfig, changed_settings, warn_ignored_settings
from .curriculum import CurriculumSchedule, phase_mixtures
from .data import (
    DataSetup,
    PreparedData,
    ShardedSampler,
    apply_transforms,
    check_datasets,
    check_rl_prompts,
    check_templates_render,
    check_tokenizer,
    dataset_columns,
    eval_datasets,
    prepare_datasets,
    progress_bars,
    warn_missing_reward_cells,
)
from .distributed import (
    accelerator_distributed_type,
    check_launch,
    generation_synced_gpus,
    restore_kernel_functions,
    sum_over_ranks,
)
from .evaluation import check_best_model_metric, check_eval_on_start, check_eval_strategy
from .executor import SourceContext
from .grpo import grpo_notice
from .guidance import DemonstrationGuidance
from .interrupts import SignalCatcher
from .losses import kl_gradient_warning, resolve_kl_estimator
from .memory import AdapterBank, MemoryPool, build_sft_pool
from .models import (
    PolicyAndValueWrapper,
    ReferencePolicy,
    add_frozen_adapter_copy,
    check_trained_precision,
    check_vocabularies,
    create_reference,
    disable_dropout,
    embedding_rows,
    quiet_checkpointing_deprecation,
)
from .objectives import (
    BUILT_IN,
    WITH_DATA,
    DistillationObjective,
    Objective,
    ObjectiveSetup,
    ObjectiveSlots,
    PretrainingObjective,
    RLObjective,
    SFTObjective,
    check_checkpoint_objectives,
    check_objectives,
    check_state_dict,
    epoch_rows,
    objective_names,
    objective_slots,
    planning_rows,
    setup_objective,
    warn_epoch_passes,
    warn_step_over_pass,
)
from .paths import check_model_source, check_tokenizer_source
from .rewards import (
    RewardScorer,
    check_reward_paths,
    check_scored_columns,
    load_reward_funcs,
    reward_function_name,
    reward_names,
    set_pad_token_id,
)
from .rl_supply import RLSupply, build_exploration, build_successes
from .rollout import RolloutEngine, VLLMGenerator, stop_token_ids
from .saving import check_output_dir
from .schedules import RLSchedules
from .setup_checks import apply_log_level, check_neftune, check_training_setup
from .sources import RolloutFuncSource, RolloutSource, as_rollout_source, check_rollout_source
from .teacher import Teacher, check_teacher_prompts, load_teacher
from .threads import ThreadChoice, choose_torch_threads
from .vision import (
    ImageRows,
    adapter_config_outside_frozen_tower,
    check_vision_options,
    freeze_vision_tower,
    is_processor,
    is_vision_language_model,
    load_policy,
    model_context,
    rows_have_images,
    suppress_placeholder_tokens,
    text_tokenizer,
)
from .weighting import DARE, GradientProbe, build_weighting, weighting_name


try:
    from peft import NoMatchingPeftModuleError, get_peft_model
except ImportError:  # peft is a dependency; keep the import error readable if it is missing
    get_peft_model = None
    NoMatchingPeftModuleError = ValueError

if TYPE_CHECKING:  # optional capabilities, imported where they are built
    from transformers import GenerationConfig, PreTrainedTokenizerBase

    from .agents import AgentSpec
    from .executor import SourceSpec
    from .exploration import TargetedExploration
    from .memory import ReplayBuffer, SampleSelector
    from .metrics import MetricsAccumulator

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunChecks:
    """What [`check_run`] found and built.

    Attributes:
        agent ([`~trl_trapo.agents.AgentSpec`], *optional*): the tool-calling spec of `tools` /
            `environment_factory`, None without them.
        datasets (`dict`): the trainer's dataset arguments by name, as the run reads them: each dataset's transform
            applied ([`~trl_trapo.data.apply_transforms`]); `train_dataset` — also the attribute of that name — is
            the user's, or, with an `environment_factory` and no dataset, placeholder prompts its `reset` writes.
        own_source (`bool`): the run samples with a source of the user's (`rollout_source`, `rollout_func`, `tools` /
            `environment_factory`), not the default one.
        verified_checkpoint (`str`, *optional*): the absolute path of `args.resume_from_checkpoint` once every file's
            SHA-256 was verified and it fits the run; None when the run does not resume from a path.
        rollout_state (`bool`, *optional*): whether the run's rollout source keeps state in checkpoints (True with
            `async_rollouts`, False for the other built-in sources, None for a `rollout_source` of the user's, which
            checks its own): what a checkpoint to resume must hold (`checkpoint.check_checkpoint_rollouts`).
        datasets_summary (`dict`): what checkpoints record of the datasets (`checkpoint.datasets_summary`).
        thread_choice ([`~trl_trapo.threads.ThreadChoice`]): torch's CPU threads for this process and its producers.
    """

    agent: AgentSpec | None
    datasets: dict[str, Any]
    own_source: bool
    verified_checkpoint: str | None
    rollout_state: bool | None
    datasets_summary: dict
    thread_choice: ThreadChoice

    @property
    def train_dataset(self) -> Dataset | None:
        """The RL prompts the run reads (see `datasets`)."""
        return self.datasets.get(RLObjective.ARGUMENT)


def agent_prompts_checked(given: dict, train_dataset, agent, args) -> dict:
    """`given` (each objective's dataset by its name) with the RL prompts `check_agent` left (placeholders when an
    `environment_factory` writes each prompt and none was given). An environment's prompts are checked here, where
    empty user messages are allowed (its `reset` writes the prompt, TRL's usual dataset), and taken out of `given` so
    that [`~trl_trapo.data.check_datasets`] does not refuse them as a dataset without text."""
    given = {**given, RLObjective.NAME: train_dataset}
    if (
        agent is not None
        and agent.factories
        and train_dataset is not None
        and getattr(args, RLObjective.WEIGHT_FIELD) > 0
    ):
        check_rl_prompts(train_dataset, args, environment_prompts=True)
        given[RLObjective.NAME] = None
    return given


def check_run(
    args: TRAPOConfig,
    arguments: dict[str, Any],
    datasets: dict[str, Any],
    *,
    rollout_source: RolloutSource | None,
    rollout_func: Callable | None,
    environment_factory: Callable | dict[str, Callable] | None,
    objectives: list[Objective] | None = None,
) -> RunChecks:
    """The construction checks that run before anything slow loads, in this order: the config's type and values
    ([`~trl_trapo.config.TRAPOConfig.check_values`]), the launch (`trl_trapo.distributed.check_launch`), TRAPO's log
    level ([`~trl_trapo.setup_checks.apply_log_level`]), every argument's type
    ([`~trl_trapo.arguments.check_trainer_arguments`]), the datasets' transforms ([`~trl_trapo.data.apply_transforms`]),
    the `__main__` guard of an asynchronous run, the rollout source, the agent arguments, the output directory, the
    prompts distillation needs ([`check_distillation_prompts`]), the datasets, the training setup (trackers, optimizer,
    scheduler), the best-model metric, evaluation asked for without an `eval_dataset`, the checkpoint to resume from
    (every file's SHA-256, and that it fits the run; `train` does not hash it again), torch's threads. `arguments`: the
    trainer's model arguments by name; `datasets`: its dataset arguments by name (not changed: see
    `RunChecks.datasets`); `objectives`: the trainer's `objectives=` (their names are compared with the checkpoint's).

    Returns:
        [`RunChecks`].

    Raises:
        TypeError / ValueError: from the check that failed, naming the field, the bad value and the fix.
    """
    check_config_type(args, TRAPOConfig)
    args.check_values()  # a field set after construction (`args.rl_weight = "2"`): the constructor's refusal
    # the launch (FSDP or DeepSpeed asked for and off, processes lost): known from the process state the config set up
    check_launch(args.distributed_state)
    apply_log_level(args)  # an explicit `log_level` sets TRAPO's own logger too, as the Trainer sets transformers'
    tools, reward_funcs, reward_model = (arguments.get(k) for k in ("tools", "reward_funcs", "reward_model"))
    # every argument of the wrong type is refused by name now, not by the library that first touches it
    check_trainer_arguments(**arguments)
    datasets = apply_transforms(datasets)  # rows as a `set_transform` gives them (trial 15's N23)
    train_dataset, eval_dataset = datasets.get(RLObjective.ARGUMENT), datasets.get("eval_dataset")
    if args.async_rollouts:  # a script the producer's `spawn` would run again: refused before anything loads
        from .async_rollouts import check_main_guard  # optional capabilities are imported where they are used

        check_main_guard()
    if rollout_source is not None or rollout_func is not None:
        check_rollout_source(rollout_source, args, rollout_func)
    agent = None  # TRL's tools / environment_factory: a multi-turn tool-calling source (trl_trapo/agents.py)
    if tools or environment_factory is not None:
        agent, train_dataset = check_agent(
            args, tools, environment_factory, train_dataset, rollout_source, rollout_func, reward_funcs, reward_model
        )
    # not the default SyncRolloutSource
    own_source = rollout_source is not None or rollout_func is not None or agent is not None
    # before anything slow: output_dir can be written and holds no finished run this one would replace; the
    # datasets have the columns and cells their objectives read
    check_output_dir(args)
    given = {cls.NAME: datasets.get(cls.ARGUMENT) for cls in WITH_DATA}  # each objective's dataset, by its name
    given = agent_prompts_checked(given, train_dataset, agent, args)  # the agent's prompts, as `check_agent` left them
    check_distillation_prompts(args, arguments, given, own_source)  # a teacher's prompts; distillation alone
    check_datasets(args, given, eval_dataset, WITH_DATA)
    if agent is not None:  # evaluation rolls the eval prompts out through the tool loop too
        agent.check_eval_prompts(eval_dataset)
    rewarded, environments = agent is not None and bool(agent.rewards), agent is not None and bool(agent.factories)
    check_scored_columns(reward_funcs, train_dataset, eval_dataset, rewarded, environments)  # e.g. `completions`
    # trackers, optimizer and scheduler: built by `train()`, checked now; NEFTune's noise, which RL cannot take
    check_training_setup(args, arguments.get("optimizers", (None, None)))
    check_neftune(args, (train_dataset is not None or own_source) and args.rl_weight > 0)
    check_reward_paths(reward_funcs, reward_model)  # a reward model by local path is a classifier (its config only)
    names = reward_names(reward_funcs, reward_model, agent.rewards if agent is not None else ())  # as the scorer's
    check_best_model_metric(args, eval_dataset, arguments.get("callbacks"), names, tools=agent is not None)
    # evaluation during training needs held-out data (transformers' `Trainer.__init__` said so only after tokenizing)
    check_eval_strategy(args, eval_dataset)
    check_eval_on_start(args, eval_dataset)
    # what checkpoints record of the datasets, to refuse resuming one of them with others (check_checkpoint_fits)
    summary = datasets_summary({cls.ARGUMENT: given[cls.NAME] for cls in WITH_DATA})
    # the checkpoint to resume from is verified now (every file's SHA-256), not after a first evaluation
    rollout_state = True if args.async_rollouts else (None if rollout_source is not None else False)
    verified_checkpoint = check_resume(args, arguments, summary, rollout_state, objectives)
    # torch's CPU threads: the cores shared among the processes this run starts, unless the user chose (threads.py)
    thread_choice = choose_torch_threads(args.torch_threads, producers_per_process=int(args.async_rollouts))
    datasets = {**datasets, RLObjective.ARGUMENT: train_dataset}  # the agent's prompts, if `check_agent` wrote them
    return RunChecks(agent, datasets, own_source, verified_checkpoint, rollout_state, summary, thread_choice)


def check_distillation_prompts(
    args: TRAPOConfig, arguments: dict[str, Any], given: dict[str, Any], own_source: bool
) -> None:
    """[`~trl_trapo.teacher.check_teacher_prompts`] on the run's arguments: whether a teacher is given (`teacher_model`
    or `teacher_model_name_or_path`), and which objectives have data (`given`: objective name -> dataset or None;
    `own_source`: a rollout source of the user's supplies RL prompts).

    Raises:
        ValueError: from `check_teacher_prompts`, naming the weights, the missing teacher or prompts and the fix.
    """
    with_teacher = arguments.get("teacher_model") is not None or args.teacher_model_name_or_path is not None
    other_data = any(
        given[cls.NAME] is not None and getattr(args, cls.WEIGHT_FIELD) > 0
        for cls in WITH_DATA
        if cls not in (RLObjective, DistillationObjective)
    )
    rl_prompts = given[RLObjective.NAME] is not None or own_source
    check_teacher_prompts(args, with_teacher, given[DistillationObjective.NAME] is not None, rl_prompts, other_data)


def state_settings(args: TRAPOConfig, adapter_bank: bool | None) -> dict[str, Any]:
    """The run's values of the settings that shape TRAPO's state in a checkpoint
    ([`~trl_trapo.checkpoint.STATE_SETTINGS`]), as [`~trl_trapo.checkpoint.checkpoint_state_settings`] reads a
    checkpoint's: `sft_sampling`, the weighting strategy's name ([`~trl_trapo.weighting.weighting_name`]: `weighting`,
    or `dare_mode`'s), and `adapter_bank` (whether the run keeps an adapter bank; None: not known yet); and
    `objective_weights`, each built-in objective's (and the teacher's) config field, dataset argument and static
    weight by objective name, to refuse an objective switched off or on
    ([`~trl_trapo.checkpoint.check_objectives_switched`])."""
    return {
        "sft_sampling": args.sft_sampling,
        "weighting": weighting_name(args),
        "adapter_snapshot_steps": adapter_bank,
        "objective_weights": {
            cls.NAME: (cls.WEIGHT_FIELD, cls.ARGUMENT, getattr(args, cls.WEIGHT_FIELD)) for cls in WITH_DATA
        },
    }


def check_resume(
    args: TRAPOConfig,
    arguments: dict[str, Any],
    summary: dict,
    rollout_state: bool | None,
    objectives: list[Objective] | None,
) -> str | None:
    """Verify `args.resume_from_checkpoint` (every file's SHA-256) and check that it fits the run, before anything
    slow loads: a step below `max_steps`; LoRA adapter vs full weights, a PPO critic or none, the datasets (`summary`), the rollout
    source's state (`rollout_state`, see `checkpoint.check_checkpoint_rollouts`); the objectives' names (the model:
    once it is built, `load_models`).

    Returns:
        The checkpoint's absolute path, or None when the run does not resume from a path.

    Raises:
        CheckpointError: from the check that failed, naming the checkpoint and the fix.
    """
    checkpoint = args.resume_from_checkpoint
    if not isinstance(checkpoint, (str, os.PathLike)):
        return None
    verify_checkpoint(checkpoint, args.world_size)
    check_checkpoint_step(checkpoint, args.max_steps)  # past max_steps: nothing to train
    model = arguments.get("model")  # a path or Hub id is loaded later: a PeftModel only when given as one
    adapter = arguments.get("peft_config") is not None or (isinstance(model, nn.Module) and is_peft_model(model))
    critic = arguments.get("value_model") is not None
    # the adapter bank is off under ZeRO-3, which is known once the Trainer exists: under DeepSpeed, checked then
    deepspeed = accelerator_distributed_type(args.distributed_state) == DistributedType.DEEPSPEED
    bank = None if deepspeed else adapter and args.adapter_snapshot_steps > 0
    settings = state_settings(args, bank)
    check_checkpoint_fits(checkpoint, adapter, summary, rollout_state=rollout_state, critic=critic, settings=settings)
    objectives = [] if objectives is None else objectives
    if isinstance(objectives, (list, tuple)):  # another type: refused by name when the objectives are checked
        with_teacher = arguments.get("teacher_model") is not None or args.teacher_model_name_or_path is not None
        extra = [getattr(o, "name", None) for o in objectives]
        state = read_state_file(checkpoint, "rank0.json")
        if state is not None and all(isinstance(name, str) for name in extra):
            source = os.path.join(checkpoint, STATE_DIR, "rank0.json")
            check_checkpoint_objectives(objective_names(with_teacher, extra), state, source)
    return os.path.abspath(checkpoint)


def check_agent(
    args: TRAPOConfig,
    tools: list[Callable] | None,
    environment_factory: Callable | dict[str, Callable] | None,
    train_dataset: Dataset | None,
    rollout_source: RolloutSource | None,
    rollout_func: Callable | None,
    reward_funcs: Any,
    reward_model: Any,
) -> tuple[AgentSpec, Dataset | None]:
    """The tool-calling spec of TRL's `tools` / `environment_factory`, checked against the other arguments, and the
    train dataset (placeholder prompts when an `environment_factory` writes each prompt and none was given).

    Raises:
        ValueError: with a `rollout_func` too, with a `rollout_source`, on a dataset the agent cannot run, or when
            nothing could score the rollouts (no `reward_funcs`, `reward_model` or environment `get_reward`).
    """
    from .agents import AgentSpec, check_agent_arguments, placeholder_prompts

    if rollout_func is not None:
        raise ValueError(
            "tools / environment_factory build the tool-calling rollout source, but a rollout_func was given "
            "too: drop one of them (a rollout_func runs its own tool loop)."
        )
    check_agent_arguments(args, rollout_source)
    agent = AgentSpec.build(tools, environment_factory)
    agent.check_dataset(train_dataset, args.max_steps)
    if not reward_funcs and reward_model is None and not agent.rewards and args.rl_weight > 0:
        given = "a train_dataset" if train_dataset is not None else "no train_dataset"
        raise ValueError(
            f"tools / environment_factory with {given} and no reward source: the rollouts could not be "
            "scored. Pass `reward_funcs` (and/or `reward_model`), or give the environment class of "
            "`environment_factory` a `get_reward(self) -> float` method (called after each rollout; it becomes "
            "a reward of weight 1, as in TRL's GRPOTrainer)."
        )
    if train_dataset is None and agent.factories:  # the environment's `reset` writes each prompt
        train_dataset = placeholder_prompts(args)
    return agent, train_dataset


@dataclasses.dataclass(frozen=True)
class SourceParts:
    """What every rollout source may be built from (the arguments of [`build_rollout_source`] that describe the
    run, not the user's choice of source).

    Attributes:
        engine ([`~trl_trapo.rollout.RolloutEngine`]): samples with the live policy, scores, finishes a round.
        rl_dataset (`Dataset`, *optional*): the tokenized RL prompts (None without RL prompts).
        memory_pool ([`~trl_trapo.memory.MemoryPool`]): the RL prompt sampler (and sample selector).
        rewards ([`~trl_trapo.rewards.RewardScorer`]): the reward functions.
        tokenizer (`PreTrainedTokenizerBase`): the policy's text tokenizer.
        metrics ([`~trl_trapo.metrics.MetricsAccumulator`]): where a source logs (`tools/*`, `async/*`, env tokens).
        accelerator (`Accelerator`): the run's processes and device.
        generation_config (`GenerationConfig`): the rollouts' sampling settings.
        padding_id (`int`): the id in padding positions.
        stops (`list[int]`): the token ids that end a completion.
        policy (`Callable[[], nn.Module]`): the policy, unwrapped (the asynchronous producer's weights).
        context (`int`, *optional*): the policy's context in positions (None: unbounded).
        suppressed_token_ids (`list[int]`): ids the policy never samples (a VLM's image placeholders).
        producer_threads (`int`): torch's threads of an asynchronous producer process.
        zero3 (`bool`): the run is under DeepSpeed ZeRO-3.
        images ([`~trl_trapo.vision.ImageRows`], *optional*): a vision-language run's row builder (the tool-calling
            source renders image prompts with it); None for a text run.
        stopping (`Callable[[], str | None]`, *optional*): why the run is stopping (the trainer's SIGINT / SIGTERM
            catcher, [`~trl_trapo.interrupts.SignalCatcher.stopping`]), or None while it is not: the tool-calling
            source, here or in the asynchronous producer, then abandons the tool calls still running.
    """

    engine: RolloutEngine
    rl_dataset: Dataset | None
    memory_pool: MemoryPool
    rewards: RewardScorer
    tokenizer: PreTrainedTokenizerBase
    metrics: MetricsAccumulator
    accelerator: Any
    generation_config: GenerationConfig
    padding_id: int
    stops: list[int]
    policy: Callable[[], Any]
    context: int | None
    suppressed_token_ids: list[int]
    producer_threads: int
    zero3: bool
    images: ImageRows | None = None
    stopping: Callable[[], str | None] | None = None


def build_rollout_source(
    args: TRAPOConfig,
    parts: SourceParts,
    *,
    rollout_source: RolloutSource | None,
    rollout_func: Callable[[list], dict] | None,
    agent: AgentSpec | None,
    own_source: bool,
    active_rl: bool,
    has_critic: bool,
    exploration: TargetedExploration | None,
) -> RolloutSource:
    """Where the RL objective's rounds come from: the user's `rollout_source`; the tool-calling source of `tools` /
    `environment_factory` (`agent`, with RL prompts); TRL's `rollout_func` (here already bound to the trainer:
    `prompts -> dict`, by [`~trl_trapo.sources.bind_rollout_func`], which keeps the unbound function as `func`); otherwise the default
    [`~trl_trapo.sources.SyncRolloutSource`] sampling with the live policy. Each built-in source is described by a
    [`~trl_trapo.executor.SourceSpec`] and built from it: here, in the trainer's process, or with
    `async_rollouts=True` in the producer process, which runs the same source class ([`build_async_source`]). A
    source of the user's makes the metrics track environment tokens (completion mask 0).

    Raises:
        ValueError: a `rollout_func` without RL prompts; the conditions of [`build_async_source`].
    """
    from .executor import SourceSpec

    group = 1 if has_critic else args.num_generations
    spec = SourceSpec("default", group, args.num_mini_batches, float(args.temperature))
    if agent is not None and active_rl:
        spec = tool_source_spec(args, parts, agent, group)
    if rollout_func is not None:  # TRL's rollout_func is one more source (sources.RolloutFuncSource)
        spec = rollout_func_spec(args, parts, rollout_func, active_rl)
    if rollout_source is not None or spec.kind != "default":  # its rounds may carry environment tokens (mask 0)
        parts.metrics.track_env_tokens()
    if args.async_rollouts:  # a producer process runs the source and scores its rounds ahead (async_rollouts.py)
        if own_source and rollout_source is not None:
            raise ValueError(
                "TRAPOConfig.async_rollouts=True runs the rollout source in a producer process, which builds it from "
                "its settings; a rollout_source object of your own cannot be rebuilt there (it samples with what it "
                "holds): set async_rollouts=False, or drop rollout_source (tools / environment_factory and "
                "rollout_func run in the producer)."
            )
        if spec.kind == "rollout_func" and spec.rollout_func is None:
            raise ValueError(
                "async_rollouts=True needs the rollout_func unbound (as trl_trapo.sources.bind_rollout_func keeps it "
                "in `func`, which TRAPOTrainer passes) to bind it again in the producer process."
            )
        return build_async_source(args, parts, spec, active_rl, exploration)
    if rollout_source is not None:
        return rollout_source
    context = SourceContext(
        parts.engine,
        parts.rl_dataset,
        parts.memory_pool,
        exploration,
        parts.rewards,
        parts.tokenizer,
        parts.metrics.log_metric,
        sum_over_ranks=source_sum_over_ranks(parts.accelerator) if spec.kind == "tools" else None,
        stopping=parts.stopping,  # a tool call that hangs must not hold up a graceful stop
    )
    if spec.kind == "rollout_func":  # bound to the trainer already
        return RolloutFuncSource(
            rollout_func,
            parts.rl_dataset,
            parts.memory_pool,
            num_generations=args.num_generations,
            num_mini_batches=args.num_mini_batches,
            image_token_ids=parts.suppressed_token_ids,  # a VLM's placeholders: returned prompts must hold its images'
            # TRL syncs vLLM's weights before a rollout_func, which may sample through `trainer.vllm_generation`
            sync_weights=parts.engine.vllm.sync_for_step if parts.engine.vllm is not None else None,
        )
    return spec.build(context)


@dataclasses.dataclass(frozen=True)
class RLSupplyParts:
    """The RL objective's supply chain, as the trainer stores it.

    Attributes:
        source ([`~trl_trapo.sources.RolloutSource`] or an object with a `sample` method): the rollout source as
            built or given (`trainer.rollout_source`: the user's own object, not its adapter).
        supply ([`~trl_trapo.rl_supply.RLSupply`]): the source (adapted), the replay buffer and the orchestration
            between them.
        callbacks (`list[TrainerCallback]`): what the source needs run on the Trainer's schedule (the
            asynchronous producer's weight snapshots under ZeRO-3, [`async_weight_snapshots`]).
    """

    source: Any
    supply: RLSupply
    callbacks: list = dataclasses.field(default_factory=list)


def async_weight_snapshots(args: TRAPOConfig, parts: SourceParts) -> bool:
    """Whether the asynchronous producer's weights are taken on a schedule every rank reaches
    ([`~trl_trapo.callbacks.WeightSnapshotCallback`]) rather than when a rank asks for a round: under DeepSpeed
    ZeRO-3, where reading them gathers the partitioned parameters (a collective). Not with the vLLM server (the
    trainer pushes the weights to it, TRL's `sync_weights`, on its one process)."""
    return bool(args.async_rollouts and parts.zero3 and parts.engine.vllm is None)


def build_rl_supply(
    args: TRAPOConfig,
    parts: SourceParts,
    *,
    replay: ReplayBuffer,
    schedules: RLSchedules,
    rollout_source: RolloutSource | None,
    rollout_func: Callable[[list], dict] | None,
    agent: AgentSpec | None,
    own_source: bool,
    active_rl: bool,
    has_critic: bool,
    exploration: TargetedExploration | None,
    task_families: list[str] | None,
    on_episode: Callable[[int], None] | None,
) -> RLSupplyParts:
    """The rollout source ([`build_rollout_source`]) and the RL objective's supply around it
    ([`~trl_trapo.rl_supply.RLSupply`]: a duck-typed source of the user's is adapted by
    [`~trl_trapo.sources.as_rollout_source`]).

    Raises:
        ValueError: the conditions of [`build_rollout_source`].
    """
    source = build_rollout_source(
        args,
        parts,
        rollout_source=rollout_source,
        rollout_func=rollout_func,
        agent=agent,
        own_source=own_source,
        active_rl=active_rl,
        has_critic=has_critic,
        exploration=exploration,
    )
    supply = RLSupply(
        as_rollout_source(source),
        parts.engine,
        replay,
        parts.memory_pool,
        parts.metrics,
        schedules,
        parts.accelerator,
        args,
        policy=parts.policy,
        has_critic=has_critic,
        exploration=exploration,
        task_families=task_families,
        on_episode=on_episode,
    )
    callbacks = []
    if async_weight_snapshots(args, parts):  # every rank gathers the weights at the same steps (callbacks.py)
        callbacks.append(WeightSnapshotCallback(source.take_weight_snapshot, args.weight_sync_steps))
    return RLSupplyParts(source, supply, callbacks)


def rollout_func_spec(args: TRAPOConfig, parts: SourceParts, rollout_func: Callable, active_rl: bool) -> SourceSpec:
    """TRL's `rollout_func` source ([`~trl_trapo.sources.RolloutFuncSource`]) as settings, with the function unbound
    (`rollout_func.func`, [`~trl_trapo.sources.bind_rollout_func`]: a producer binds its own `trainer`).

    Raises:
        ValueError: without RL prompts (`active_rl` False).
    """
    from .executor import SourceSpec

    if not active_rl:
        raise ValueError(
            "rollout_func was given but there are no RL prompts: pass train_dataset (its `prompt` column is "
            "what rollout_func receives), with rl_weight > 0."
        )
    return SourceSpec(
        "rollout_func",
        args.num_generations,
        args.num_mini_batches,
        float(args.temperature),
        rollout_func=getattr(rollout_func, "func", None),
        first_row=dict(parts.rl_dataset[0]),  # the dataset's columns, in the producer
        image_token_ids=list(parts.suppressed_token_ids or []),
    )


def source_sum_over_ranks(accelerator) -> Callable | None:
    """The tool-calling source's sum over the trainer's ranks (its turns run in lockstep across ranks: a turn's
    generation can be a collective; `tools/*` cover the round), None on one process."""
    if accelerator.num_processes > 1:
        return lambda tensor: sum_over_ranks(accelerator, tensor)
    return None


def tool_source_spec(args: TRAPOConfig, parts: SourceParts, agent: AgentSpec, group: int) -> SourceSpec:
    """The multi-turn tool-calling source of TRL's `tools` / `environment_factory` (trl_trapo/agents.py), as settings."""
    from .executor import SourceSpec

    return SourceSpec(
        "tools",
        group,
        args.num_mini_batches,
        float(args.temperature),
        agent=agent,
        tool_settings=dict(
            response_length=args.response_length,
            context=parts.context,
            max_iterations=args.max_tool_calling_iterations,
            tool_timeout=args.tool_timeout,
            template_kwargs=args.chat_template_kwargs,
            generation_batch_size=args.local_rollout_forward_batch_size,
            stop_token_ids=parts.stops,  # a turn without one at its end was cut by the length limit
            images=parts.images,  # a VLM run: each turn generates with its row's images
        ),
        first_row=dict(parts.rl_dataset[0]),
    )


def build_eval_tool_rollouts(
    args: TRAPOConfig,
    agent: AgentSpec | None,
    tokenizer,
    padding_id: int,
    stops: list[int],
    context: int | None,
    images: ImageRows | None,
    accelerator,
) -> Any:
    """Evaluation's rollouts in a run with `tools` / `environment_factory` (None without them): each eval prompt rolled
    out greedily through the same loop as training ([`~trl_trapo.agents.GreedyToolRollouts`]), with the run's tools and
    environments, budget (`response_length`), rounds of calls (`max_tool_calling_iterations`), `tool_timeout`, chat
    template arguments, stop tokens, context and images (a VLM run), `per_device_eval_batch_size` rows per `generate`,
    and, on several processes, the ranks' turns in lockstep as in training (`source_sum_over_ranks`)."""
    if agent is None:
        return None
    from .agents import GreedyToolRollouts

    return GreedyToolRollouts(
        agent,
        tokenizer,
        padding_id,
        list(stops),
        response_length=args.response_length,
        context=context,
        max_iterations=args.max_tool_calling_iterations,
        template_kwargs=args.chat_template_kwargs,
        images=images,
        tool_timeout=args.tool_timeout,
        batch_size=args.per_device_eval_batch_size,
        sum_over_ranks=source_sum_over_ranks(accelerator),
        synced_gpus=functools.partial(generation_synced_gpus, accelerator),
    )


def build_async_source(
    args: TRAPOConfig,
    parts: SourceParts,
    spec: SourceSpec,
    active_rl: bool,
    exploration: TargetedExploration | None,
) -> RolloutSource:
    """The asynchronous rollout source (`async_rollouts=True`): a producer process builds the source `spec`
    describes (the default, tool-calling or `rollout_func` source, trl_trapo/executor.py) and runs and scores its
    rounds ahead. A tool-calling source is also built here once, so that its construction checks (the chat
    template, conversational prompts) refuse bad input now.

    Under DeepSpeed ZeRO-3 the producer's weights are snapshots taken on a schedule every rank reaches
    ([`async_weight_snapshots`], [`~trl_trapo.callbacks.WeightSnapshotCallback`]): a round asked for with nothing in
    flight is then sampled with the last one, up to `weight_sync_steps - 1` steps old.

    Raises:
        ValueError: naming the argument, without RL prompts; under DeepSpeed ZeRO-3, what
            [`check_async_weight_snapshots`] refuses; with the vLLM server on more than one process; or when a
            reward function, tool, environment factory or `rollout_func` cannot be pickled.
    """
    if not active_rl:
        raise ValueError(
            "TRAPOConfig.async_rollouts=True but the run has no RL prompts (train_dataset with rl_weight > 0): "
            "set async_rollouts=False."
        )
    from .async_rollouts import AsyncRolloutSource

    snapshots = async_weight_snapshots(args, parts)
    if snapshots:
        check_async_weight_snapshots(args, parts)
    accelerator = parts.accelerator
    if args.use_vllm and accelerator.num_processes > 1:
        raise ValueError(
            "TRAPOConfig.async_rollouts=True with the vLLM server runs on one training process: every rank's "
            f"producer samples from the one server, and a weight push ({accelerator.num_processes} processes "
            "here) would have to wait for all of them at once. Launch one process, or set async_rollouts=False "
            "(synchronous vLLM rollouts gather every rank's prompts)."
        )
    if spec.kind == "tools":  # its construction checks, in the trainer, before anything slow
        context = SourceContext(
            parts.engine, parts.rl_dataset, parts.memory_pool, None, parts.rewards, parts.tokenizer, lambda *a: None
        )
        spec.build(context).close()
    parts.metrics.track_async()
    return AsyncRolloutSource(
        parts.policy,
        parts.rl_dataset,
        parts.memory_pool,
        parts.rewards,
        parts.tokenizer,
        parts.generation_config,
        parts.padding_id,
        parts.stops,
        args,
        group=spec.group,
        num_mini_batches=args.num_mini_batches,
        rank=accelerator.process_index,
        device=str(accelerator.device),
        metrics=parts.metrics,
        exploration=exploration,
        vllm=parts.engine.vllm,  # server mode: the trainer's connection, for the weight pushes
        suppress_token_ids=parts.suppressed_token_ids,
        producer_threads=parts.producer_threads,
        source=spec,
        weight_snapshots=snapshots,
        stopping=parts.stopping,  # passed on to the producer: its hung tool calls must not hold up a graceful stop
    )


def check_async_weight_snapshots(args: TRAPOConfig, parts: SourceParts) -> None:
    """Refuse what the asynchronous producer's scheduled weight snapshots (DeepSpeed ZeRO-3,
    [`async_weight_snapshots`]) cannot do, before anything slow runs.

    Raises:
        ValueError: naming the fields and the fix, with `stale_rollouts="drop"` and `max_staleness <
            weight_sync_steps - 1` (a round asked for when the last snapshot is older than `max_staleness` would be
            dropped and asked for again with the same snapshot, forever), or with a policy the producer cannot
            rebuild from gathered weights (not a transformers model, nor a PEFT model with one adapter over one).
    """
    from .async_rollouts import PolicyBlueprint

    max_staleness = DEFAULT_MAX_STALENESS if args.max_staleness is None else args.max_staleness
    if args.stale_rollouts == "drop" and max_staleness < args.weight_sync_steps - 1:
        raise ValueError(
            f"TRAPOConfig.max_staleness={max_staleness} with weight_sync_steps={args.weight_sync_steps} under "
            "DeepSpeed ZeRO-3 and async_rollouts=True: the producer's weights are gathered every weight_sync_steps "
            "steps (a collective every rank reaches together), so a round asked for when none is in flight is "
            f"sampled with weights up to {args.weight_sync_steps - 1} steps old; with stale_rollouts='drop' such a "
            "round would be dropped and asked for again with the same weights, forever. Set max_staleness >= "
            f"{args.weight_sync_steps - 1} (weight_sync_steps - 1), weight_sync_steps <= {max_staleness + 1}, or "
            "stale_rollouts='downweight'."
        )
    policy = parts.policy()
    if PolicyBlueprint.parts(policy) is None:
        raise ValueError(
            "TRAPOConfig.async_rollouts=True under DeepSpeed ZeRO-3 rebuilds the policy in the producer from its "
            "gathered weights, which needs a transformers model (or a PEFT model with one adapter over one), not a "
            f"{type(policy).__name__}. Use ZeRO-2 or DDP, or async_rollouts=False."
        )


def build_objectives(
    args: TRAPOConfig,
    *,
    pretrain: Objective,
    memory_pool: MemoryPool,
    take_rl_rows: Callable[[int, int], list],
    schedules: RLSchedules,
    kl_penalty: str,
    kl_estimator: str,
    logging_step: Callable[[], bool],
    data: PreparedData,
    teacher: Teacher | None,
    sampler: RolloutEngine,
    extra: list[Objective],
    tokenizer: PreTrainedTokenizerBase,
    rank: int,
    world_size: int,
    planned_steps: int,
) -> list[Objective]:
    """The run's objectives in the order of their names (a row's `objective` is its objective's index here;
    trl_trapo/objectives.py): `pretrain` (already set up), SFT on the memory pool, RL on the RL supply's rows
    `take_rl_rows`, the teacher's distillation objective when there is a `teacher`, then the user's `extra` objectives
    (already set up). The SFT, RL and distillation objectives are set up here.

    Args:
        data ([`~trl_trapo.data.PreparedData`]): the run's datasets (the SFT and RL objectives have data when theirs
            is set).
        schedules ([`~trl_trapo.schedules.RLSchedules`]): the KL and entropy coefficients the RL term reads.
        logging_step (`Callable[[], bool]`): whether the current step logs (the RL term's extra statistics).
        sampler ([`~trl_trapo.rollout.RolloutEngine`]): samples the distillation prompts.
    """
    objectives: list[Objective] = [
        pretrain,
        SFTObjective.from_config(args, memory_pool, data),
        RLObjective.from_config(
            args,
            take_rl_rows,
            data,
            kl_coef=schedules.kl_coef,
            entropy_coef=schedules.entropy_coef,
            kl_penalty=kl_penalty,
            kl_estimator=kl_estimator,
            logging_step=logging_step,
        ),
    ]
    if teacher is not None:
        objectives.append(
            DistillationObjective.from_config(args, teacher, take_rl_rows, data.distill, sampler, rank, world_size)
        )
    for index, objective in enumerate(objectives[1:], start=1):  # pretrain and `extra` were set up before
        setup_objective(
            objective, ObjectiveSetup(index, args, tokenizer, rank, world_size, planned_steps=planned_steps)
        )
    return objectives + list(extra)


# ---- the policy, its tokenizer, reference and critic ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PolicyParts:
    """What [`build_policy`] loaded: the policy and how its inputs are written.

    Attributes:
        model (`nn.Module`): the policy as given or loaded (before any adapter; vision tower frozen if asked).
        model_id (`str`, *optional*): the id or path it was loaded from (None for a model object without one).
        processing_class: the user's `processing_class`, or the tokenizer / processor loaded from `model_id`.
        tokenizer (`PreTrainedTokenizerBase`): its text tokenizer.
        image_rows ([`~trl_trapo.vision.ImageRows`], *optional*): a VLM run's row builder (None for a tokenizer).
        suppressed_token_ids (`list[int]`): ids the policy never samples (a VLM's image placeholders).
    """

    model: Any
    model_id: str | None
    processing_class: Any
    tokenizer: PreTrainedTokenizerBase
    image_rows: ImageRows | None
    suppressed_token_ids: list[int]


def build_policy(
    model: Any,
    processing_class: Any,
    args: TRAPOConfig,
    agent: AgentSpec | None,
    train_dataset: Any,
    named_datasets: list[tuple[str, Any]] = (),
) -> PolicyParts:
    """Load the policy (a model id / path through `load_policy`, TRL's convention for vision-language models) and its
    tokenizer or processor, check the tokenizer (and the chat template a tool-calling run needs: a VLM's image prompts
    of `train_dataset`, and so their tool messages, are rendered by its processor, as in TRL), keep the policy
    from sampling image placeholders and freeze the vision tower when asked — before the reference is copied. A chat
    template that refuses a conversation of `named_datasets` (`(argument name, dataset)` pairs; one row of each
    sequence of roles rendered, `data.check_templates_render`) is found before the policy loads when
    `processing_class` is given, else as soon as its tokenizer is loaded.

    Raises:
        ValueError: `model_init_kwargs` with a model object; no `processing_class` and none loadable; a tokenizer or
            chat template that cannot work (`check_tokenizer`, `agents.check_chat_template`).
    """
    templates_checked = processing_class is not None
    if templates_checked:
        check_templates_render(named_datasets, processing_class, args.chat_template_kwargs)
    model_id = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
    if isinstance(model, str):
        check_model_source(model, "model")
    if processing_class is None and model_id:  # before the model loads: the tokenizer comes from its folder
        check_tokenizer_source(
            model_id,
            "model" if isinstance(model, str) else "model.config.name_or_path",
            "Fix: pass `processing_class=` (the policy's tokenizer, e.g. `AutoTokenizer.from_pretrained(...)`)",
        )
    if isinstance(model, str):
        model = load_policy(model, args.model_init_kwargs)  # a vision-language model as one (TRL's convention)
    elif args.model_init_kwargs:
        raise ValueError("`model_init_kwargs` is only used when `model` is a string; drop it or pass a model id.")
    if processing_class is None:
        if not model_id:
            raise ValueError("Pass `processing_class` (the policy's tokenizer): it cannot be loaded from the model.")
        processing_class = (
            AutoProcessor.from_pretrained(model_id)
            if is_vision_language_model(model)
            else AutoTokenizer.from_pretrained(model_id)
        )
    # a VLM run's processor turns image rows into ids and model inputs; every text path uses its tokenizer
    tokenizer = text_tokenizer(processing_class)
    image_rows = (
        ImageRows(processing_class, args.chat_template_kwargs, args.max_image_pixels)
        if is_processor(processing_class)
        else None
    )
    check_tokenizer(tokenizer)
    if not templates_checked:  # the tokenizer came with the model: now, before the reference and teacher load
        check_templates_render(named_datasets, processing_class, args.chat_template_kwargs)
    if agent is not None:
        from .agents import check_chat_template, prompt_renderer

        renderer = prompt_renderer(processing_class, dataset_columns(train_dataset))
        check_chat_template(tokenizer, args.chat_template_kwargs, renderer=renderer)
    suppressed: list[int] = []
    if image_rows is not None:  # the policy never samples an image placeholder (before the reference is copied)
        suppressed = suppress_placeholder_tokens(model, processing_class)
        logger.info("Vision-language run: placeholder tokens %s are never sampled.", suppressed)
    if args.freeze_vision_tower:  # before the reference is copied and any adapter wraps the policy
        frozen = freeze_vision_tower(model)
        logger.info("freeze_vision_tower=True: %d parameters of the vision encoder frozen.", frozen)
    return PolicyParts(model, model_id, processing_class, tokenizer, image_rows, suppressed)


def wrap_adapter(model: Any, peft_config: Any) -> Any:
    """`model` in a fresh PEFT adapter of `peft_config`.

    Raises:
        ImportError: without `peft`.
        ValueError: for a model that is already a PeftModel, `target_modules` that match no module (naming the
            model's linear modules) or only modules `exclude_modules` removes (naming both fields), or
            `modules_to_save` naming a module the model lacks (PEFT ignores it).
    """
    if get_peft_model is None:
        raise ImportError("`peft_config` needs the `peft` package: pip install peft.")
    if is_peft_model(model):
        raise ValueError("`model` is already a PeftModel; pass either a PeftModel or `peft_config`, not both.")
    linear_names = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})
    module_names = [name for name, _ in model.named_modules() if name]
    to_save = getattr(peft_config, "modules_to_save", None) or []
    missing = [key for key in to_save if not any(name.endswith(key) for name in module_names)]  # PEFT's own match
    if missing:  # PEFT skips them without a word: those modules would train frozen, or not be saved
        top = ", ".join(name for name in module_names if "." not in name)
        last = sorted({name.rsplit(".", 1)[-1] for name in module_names if not name.rsplit(".", 1)[-1].isdigit()})
        shown = ", ".join(n for n in last if "head" in n or "embed" in n or "score" in n) or ", ".join(last[:8])
        raise ValueError(
            f"peft_config.modules_to_save={list(to_save)!r}: {missing[0]!r} names no module of the model (its top "
            f"modules: {top}; e.g. {shown}). Name modules the model has (trained fully and saved with the adapter), "
            "or leave modules_to_save out."
        )
    check_adapter_layers(peft_config, module_names)
    skipped = targets_outside_layers(peft_config, module_names)
    if skipped:  # PEFT's behaviour is kept; only the silence is not
        logger.warning(
            "peft_config.target_modules names %s, which no layer of layers_to_transform=%r holds: with "
            "layers_to_transform set, PEFT adapts only modules inside those layers and skips the others without a "
            "word, so these stay as they are. Leave layers_to_transform out to adapt them, or list them in "
            "modules_to_save to train them fully.",
            ", ".join(map(repr, skipped)),
            peft_config.layers_to_transform,
        )
    try:
        with quiet_checkpointing_deprecation():  # PEFT reads the deprecated property too
            return get_peft_model(model, peft_config)
    except NoMatchingPeftModuleError as error:  # PEFT's message names neither the field nor the choices
        excluded = excluded_targets(peft_config, module_names)
        if excluded:
            raise ValueError(
                f"peft_config.exclude_modules={peft_config.exclude_modules!r} excludes every module "
                f"target_modules={getattr(peft_config, 'target_modules', None)!r} matches ({', '.join(excluded[:4])}"
                f"{', ...' if len(excluded) > 4 else ''}): the adapter would have nothing to train. Remove those "
                "names from exclude_modules, or target other modules."
            ) from error
        shown = ", ".join(linear_names[:8]) + (", ..." if len(linear_names) > 8 else "")
        layers = getattr(peft_config, "layers_to_transform", None)
        within = (
            f" in the layers peft_config.layers_to_transform={layers!r} selects "
            f"(layers_pattern={getattr(peft_config, 'layers_pattern', None)!r})"
            if layers not in (None, [])
            else ""
        )
        raise ValueError(
            f"peft_config.target_modules={getattr(peft_config, 'target_modules', None)!r} matches no module "
            f"of the model{within}. Its linear modules are named {shown or '(none)'}; name some of them, or use "
            "target_modules='all-linear' (every linear layer but the output head)."
        ) from error


def excluded_targets(peft_config: Any, module_names: list[str]) -> list[str]:
    """The modules `peft_config.target_modules` matches that `peft_config.exclude_modules` removes, when it removes
    all of them (PEFT then raises "No modules were targeted for adaptation", naming neither field); empty otherwise.
    Uses PEFT's own match (`check_target_module_exists`) on a copy without `exclude_modules`."""
    if not getattr(peft_config, "exclude_modules", None) or getattr(peft_config, "target_modules", None) is None:
        return []
    from peft.tuners.tuners_utils import check_target_module_exists

    unexcluded = copy.copy(peft_config)  # a copy: the user's config is not changed
    unexcluded.exclude_modules = None
    matched = [name for name in module_names if check_target_module_exists(unexcluded, name)]
    return [] if any(check_target_module_exists(peft_config, name) for name in matched) else matched


def targets_outside_layers(peft_config: Any, module_names: list[str]) -> list[str]:
    """The names in a list `peft_config.target_modules` that match modules of the model, none of them inside a layer
    `peft_config.layers_to_transform` selects (e.g. `embed_tokens`, `lm_head`): PEFT skips them without a word.
    Empty without `layers_to_transform`, or with `target_modules` given as one string (a regex or 'all-linear')."""
    targets = getattr(peft_config, "target_modules", None)
    if getattr(peft_config, "layers_to_transform", None) in (None, []) or targets is None or isinstance(targets, str):
        return []
    from peft.tuners.tuners_utils import check_target_module_exists

    skipped = []
    for key in sorted(targets):
        named = [name for name in module_names if name == key or name.endswith(f".{key}")]
        if named and not any(check_target_module_exists(peft_config, name) for name in named):
            skipped.append(key)
    return skipped


def check_adapter_layers(peft_config: Any, module_names: list[str]) -> None:
    """Refuse `peft_config.layers_to_transform` indices that no layer holding a `target_modules` module has.

    PEFT (`check_target_module_exists`, which this uses for every match) adapts the modules of the listed layers and
    ignores an index the model does not have without a word; when no index exists it raises "no target modules found"
    (blamed on `target_modules`, whose names do match). Left to PEFT: configs without `layers_to_transform`, and
    `target_modules` that match nothing in any layer (or a shorthand such as 'all-linear' PEFT expands itself).

    Args:
        peft_config: the PEFT config (`LoraConfig`, ...).
        module_names (`list[str]`): the model's module names (`model.named_modules()`).

    Raises:
        ValueError: naming `layers_to_transform`, the indices the model lacks, and the layer indices it has.
    """
    wanted = getattr(peft_config, "layers_to_transform", None)
    if wanted is None or wanted == [] or getattr(peft_config, "target_modules", None) is None:
        return
    from peft.tuners.tuners_utils import check_target_module_exists

    wanted = [wanted] if isinstance(wanted, int) else list(wanted)
    any_layer = copy.copy(peft_config)  # the same match, every layer (a copy: the user's config is not changed)
    any_layer.layers_to_transform = None
    matched = [name for name in module_names if check_target_module_exists(any_layer, name)]
    if not matched:
        return
    one_layer = copy.copy(peft_config)
    candidates = sorted({int(part) for name in matched for part in name.split(".") if part.isdigit()})
    present = []
    for index in candidates:
        one_layer.layers_to_transform = [index]
        if any(check_target_module_exists(one_layer, name) for name in matched):
            present.append(index)
    missing = [index for index in wanted if index not in present]
    if not missing:
        return
    pattern = getattr(peft_config, "layers_pattern", None)
    has = (
        f"the layers holding target_modules={peft_config.target_modules!r} are numbered "
        + (f"{present[0]}-{present[-1]}" if present == list(range(present[0], present[-1] + 1)) else str(present))
        if present
        else f"no module matching target_modules={peft_config.target_modules!r} sits in a numbered layer under "
        f"layers_pattern={pattern!r}"
    )
    raise ValueError(
        f"peft_config.layers_to_transform={peft_config.layers_to_transform!r} names layer(s) {missing} "
        f"the model does not have (PEFT would skip them without a word): {has}. Give indices the model has, or "
        "leave layers_to_transform out to adapt every layer."
    )


def policy_and_reference(
    model: Any, model_id: str | None, ref_model: Any, args: TRAPOConfig, peft_config: Any
) -> tuple[Any, Any, str | None]:
    """The policy (wrapped in a fresh adapter with `peft_config`), and its reference: a frozen model, or — for a
    PEFT policy — an adapter name ("" = adapter disabled). With `kl_coef=0` there is none: a `ref_model` given is
    dropped, with an info line (the KL term is off, so it would only take device memory).

    Returns:
        `(policy, reference model or None, reference adapter name or None)`.

    Raises:
        ValueError: adapter names without a PeftModel policy, or a `model_adapter_name` / `ref_adapter_name` the
            policy does not have (naming the field, the value and the adapters it has); a policy without a trainable
            parameter once its adapter is added ([`~trl_trapo.arguments.check_trainable`]).
    """
    created_adapter = peft_config is not None
    if created_adapter:
        if args.freeze_vision_tower:  # adapters matched inside the frozen encoder would train there (trial 8's VL03)
            peft_config = adapter_config_outside_frozen_tower(model, peft_config)
        model = wrap_adapter(model, peft_config)
    if args.disable_dropout:
        disable_dropout(model, "policy")
    ref_adapter: str | None = None
    if (args.model_adapter_name or args.ref_adapter_name) and not is_peft_model(model):
        raise ValueError("`model_adapter_name` / `ref_adapter_name` need a PeftModel policy (or `peft_config`).")
    for setting in ("model_adapter_name", "ref_adapter_name"):  # PEFT's own error names neither (trial 10's PY30)
        name = getattr(args, setting)
        if name and name not in model.peft_config:
            created = (
                f" (`peft_config` creates one adapter, named {next(iter(model.peft_config))!r})"
                if created_adapter
                else ""
            )
            raise ValueError(
                f"{type(args).__name__}.{setting}={name!r} is not an adapter of the policy: it has "
                f"{list(model.peft_config)}{created}. Name one of those, or load it first with "
                "`model.load_adapter(path, adapter_name=...)` and pass that PeftModel as the model."
            )
    if args.model_adapter_name:
        model.set_adapter(args.model_adapter_name)
    # the policy as it will train: an adapter added frozen trains nothing (trial 15's N27)
    check_trainable("model", model, peft_config if created_adapter else None)
    if args.ref_adapter_name:
        ref_adapter = args.ref_adapter_name
    if ref_model is not None and args.kl_coef == 0:  # as TRL's GRPOTrainer, which keeps no reference with beta=0
        logger.info(
            "`ref_model` is given, but kl_coef=0: the KL penalty is off, so the reference is not used (not prepared "
            "or run, and `trainer.ref_model` is None). Set kl_coef > 0 to penalise the KL towards it, or drop it."
        )
        ref_model = None
    if ref_model is not None and is_peft_model(model):
        logger.info("An explicit `ref_model` is used as the reference even though the policy is a PeftModel.")
    if args.kl_coef > 0 and ref_model is None and ref_adapter is None:
        if is_peft_model(model):
            if created_adapter and not args.sync_ref_model:
                ref_adapter = ""  # a fresh adapter starts at the base model
            else:
                ref_adapter = add_frozen_adapter_copy(model, model.active_adapter)
                if args.disable_dropout:  # the copy's LoRA dropout is a new `nn.Dropout`
                    disable_dropout(model, "policy")
        else:
            ref_model = create_reference(model, model_id, args.model_init_kwargs)
    if ref_model is not None:
        ref_model.eval().requires_grad_(False)
        if args.disable_dropout:
            disable_dropout(ref_model, "reference model")
    return model, ref_model, ref_adapter


def resolve_kl(args: TRAPOConfig, has_critic: bool) -> tuple[str, str]:
    """`(kl_penalty, kl_estimator)` of the run: "auto" resolved — PPO's KL-in-reward with a critic, GRPO's KL-in-loss
    for group-relative advantages; the estimator whose gradient is grad KL(pi || pi_ref) where the KL sits (k2 in the
    loss, k1 in the reward). Other combinations are biased and warned about (`losses.KL_GRADIENT`)."""
    kl_penalty = args.kl_penalty if args.kl_penalty != "auto" else ("reward" if has_critic else "loss")
    kl_estimator = resolve_kl_estimator(args.kl_estimator, kl_penalty)
    warning = kl_gradient_warning(kl_estimator, kl_penalty) if args.kl_coef > 0 else None
    if warning:
        logger.warning(warning)
    return kl_penalty, kl_estimator


def trained_model(model: Any, value_model: Any, tokenizer: PreTrainedTokenizerBase, args: TRAPOConfig) -> Any:
    """What the `Trainer` trains: the policy, or with a critic a [`~trl_trapo.models.PolicyAndValueWrapper`] of both
    (the critic's dropout off with `disable_dropout`, its pad id the tokenizer's)."""
    if value_model is None:
        return model
    if args.disable_dropout:
        disable_dropout(value_model, "value model")
    set_pad_token_id(value_model, tokenizer.pad_token_id, "value_model")
    return PolicyAndValueWrapper(model, value_model)


# ---- rewards ------------------------------------------------------------------------------------------------------
def build_rewards(
    args: TRAPOConfig,
    models: Models,
    reward_funcs: Any,
    reward_model: Any,
    reward_processing_classes: Any,
    *,
    agent: AgentSpec | None,
    metrics: MetricsAccumulator,
    trainer_state: Callable[[], Any],
) -> RewardScorer:
    """The run's [`~trl_trapo.rewards.RewardScorer`]: the reward functions and models (`reward_funcs`, then
    `reward_model`), weighted by `reward_weights`, then each environment's `get_reward` (weight 1, as TRL). Every id
    the run looks up or samples fits the policy's vocabulary, and every model reading the policy's ids embeds them:
    refused now, not as "index out of range in self" at the first step. They log through `metrics`. Weights that are
    all 0 are warned about (nothing could be learnt from the rewards; trial 11's N65).

    Raises:
        ValueError: `reward_weights` of the wrong length; ids outside a model's vocabulary (`check_vocabularies`).
    """
    tokenizer = models.tokenizer
    funcs, reward_tokenizers = load_reward_funcs(reward_funcs, reward_model, reward_processing_classes, tokenizer)
    extra_stops = (args.generation_kwargs or {}).get("eos_token_id", [])
    extra_stops = extra_stops if isinstance(extra_stops, (list, tuple)) else [extra_stops]
    check_vocabularies(
        tokenizer,
        models.policy,
        reference=models.ref_model,
        readers=[("value_model", models.value_model)]
        + [
            (f"reward model '{reward_function_name(func)}'", func)
            for func, tok in zip(funcs, reward_tokenizers)
            if isinstance(func, nn.Module) and (tok is tokenizer or tok.get_vocab() == tokenizer.get_vocab())
        ],
        stop_ids=[
            ("stop_token_id", [args.stop_token_id] if args.stop_token_id is not None else []),
            ("generation_kwargs['eos_token_id']", extra_stops),
        ],
    )
    if args.reward_weights is not None and len(args.reward_weights) != len(funcs):
        raise ValueError(
            f"{type(args).__name__}.reward_weights has {len(args.reward_weights)} entries for {len(funcs)} "
            "reward functions/models; give one weight per reward."
        )
    reward_weights = list(args.reward_weights or [1.0] * len(funcs))
    if agent is not None and agent.rewards:  # each environment's `get_reward`, weight 1 (as TRL)
        funcs, reward_tokenizers = funcs + agent.rewards, reward_tokenizers + [None] * len(agent.rewards)
        reward_weights += [1.0] * len(agent.rewards)
    if funcs and not any(reward_weights):  # TRL accepts it too, but nothing could be learnt from the rewards
        logger.warning(
            "%s.reward_weights=%r weighs every reward by 0: every completion's reward is 0, so RL rounds (the slow "
            "part of a step) carry no signal (every group's advantages are 0, and exploration takes every task "
            "family for stuck), and eval_reward is 0. Fix: give at least one reward a non-zero weight, or set "
            "rl_weight=0 to train without RL (a negative weight, to minimise a reward, is taken as given).",
            type(args).__name__,
            args.reward_weights,
        )
    return RewardScorer(
        funcs,
        reward_tokenizers,
        reward_weights,
        tokenizer,
        args.local_rollout_forward_batch_size,
        log_metric=metrics.log_metric,
        log_extra=metrics.log_extra,
        trainer_state=trainer_state,
    )


def warn_unused_rewards(rewards: RewardScorer, reward_funcs: Any, reward_model: Any, datasets: dict[str, Any]) -> None:
    """Warn, naming them, when reward functions or models are given but nothing the run does reads them: no RL prompts
    (`train_dataset`), no evaluation prompts (`eval_dataset`, scored with them) and no rollout source of the user's
    (which the caller checks). An SFT-only run with `reward_funcs` trained without a word (trial 9's PX53), as
    `teacher_model_init_kwargs` without a teacher is warned about ([`~trl_trapo.config.warn_ignored_settings`])."""
    if not rewards.funcs or any(datasets.get(name) is not None for name in ("train_dataset", "eval_dataset")):
        return
    kinds = [
        name for name, value in (("reward_funcs", reward_funcs), ("reward_model", reward_model)) if value is not None
    ]
    given = [f"{' and '.join(kinds)} ({', '.join(rewards.names)})"]
    warn_ignored_settings(
        logger,
        given,
        "a `train_dataset` of RL prompts (or an `eval_dataset` to score)",
        " (no RL objective is built; the run trains on its other data)",
        "Pass a `train_dataset` of prompts to train with {them} (RL), or drop {them}.",
    )


# ---- the datasets -------------------------------------------------------------------------------------------------
def prepare_run_data(
    args: TRAPOConfig,
    models: Models,
    datasets: dict[str, Any],
    *,
    rewards: RewardScorer,
    user_source: bool,
) -> PreparedData:
    """The run's datasets checked and tokenized before anything is trained ([`~trl_trapo.data.prepare_datasets`];
    `datasets`: its dataset keyword arguments, as the user gave them; the policy's context and vocabulary bound the
    rows), then — in a VLM run — the options image prompts cannot go through.

    Raises:
        ValueError: from [`~trl_trapo.data.prepare_datasets`] or [`~trl_trapo.vision.check_vision_options`].
    """
    model, tokenizer, image_rows, has_critic = models.policy, models.tokenizer, models.image_rows, models.has_critic
    setup = DataSetup(
        args,
        tokenizer,
        max_positions=model_context(model),
        has_rewards=bool(rewards.funcs),
        has_critic=has_critic,
        stop_token_ids=stop_token_ids(args, tokenizer),
        has_teacher=models.teacher is not None,
        images=image_rows,
        user_source=user_source,
        vocab_size=embedding_rows(model),
    )
    given = {cls.NAME: datasets.get(cls.ARGUMENT) for cls in WITH_DATA}  # keyed by objective
    with progress_bars(enabled=not args.disable_tqdm):
        data = prepare_datasets(setup, given, datasets.get("eval_dataset"), WITH_DATA)
    if image_rows is not None:  # a VLM run: what image prompts cannot go through is refused now
        check_vision_options(
            args,
            prompts_have_images=rows_have_images(data.rl) or rows_have_images(data.distill),
            has_critic=has_critic,
            reward_models=[n for f, n in zip(rewards.funcs, rewards.names) if isinstance(f, nn.Module)],
        )
    return data


def task_families(rl_dataset: Dataset | None, max_families: int) -> list[str] | None:
    """The RL dataset's task families (its `task` column's distinct values, sorted) when there are at most
    `max_families` of them (more are not a family label), else None: `rl/zero_variance_groups` is logged per family."""
    if rl_dataset is None or "task" not in rl_dataset.column_names:
        return None
    families = set(map(str, rl_dataset["task"]))
    return sorted(families) if len(families) <= max_families else None


def check_reader_contexts(
    args: TRAPOConfig,
    prompt_sets: list[Dataset],
    tokenizer: PreTrainedTokenizerBase,
    readers: list[tuple[str, Any, Any]],
) -> None:
    """Every model that reads the policy's tokens (`readers`: `(what, model or None, its tokenizer)`) fits the
    longest prompt of `prompt_sets` + `response_length` (checked only for readers with the policy's `tokenizer`).

    Raises:
        ValueError: naming the model, its context and the longest prompt + response.
    """
    if not prompt_sets:
        return
    longest = max(len(ids) for d in prompt_sets for ids in d["prompt_ids"]) + args.response_length
    for what, reader, reader_tokenizer in readers:
        context = model_context(reader)
        same_tokens = reader_tokenizer is tokenizer
        if reader is not None and context is not None and same_tokens and longest > context:
            raise ValueError(
                f"The {what} has a context of {context} positions, but the longest prompt + response_length "
                f"is {longest} tokens: lower response_length or max_prompt_length, or use a model with a "
                "longer context."
            )


def warn_without_sample_prompts(args: TRAPOConfig, eval_dataset: Any) -> None:
    """`num_sample_generations` > 0 with no eval dataset of prompts: say that no table will be logged."""
    if args.num_sample_generations > 0 and not any(
        {"prompt", "input_ids"} & set(dataset_columns(d)) for _, d in eval_datasets(eval_dataset)
    ):
        logger.warning(
            "num_sample_generations=%d: there is no eval_dataset of prompts to show sample completions of; no "
            "table will be logged. Pass an eval_dataset with a 'prompt' column, or set num_sample_generations=0.",
            args.num_sample_generations,
        )


# ---- the plan of the run: its objectives' slots, the curriculum's phases, the number of steps ---------------------
@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What [`plan_run`] decided before the `Trainer` starts.

    Attributes:
        slots ([`~trl_trapo.objectives.ObjectiveSlots`]): the objectives' names, data and static weights.
        extra (`list[Objective]`): the user's objectives (`TRAPOTrainer(objectives=...)`), checked.
        active (`tuple[bool, ...]`): per objective, it has data and a weight > 0.
        phase_shares (`list[bool]`): per objective, some curriculum phase gives it a share.
        curriculum_args (`tuple`): `(boundaries, mixtures)` of the [`~trl_trapo.curriculum.CurriculumSchedule`].
        planned_steps (`int`): optimizer steps of the run.
        tickets (`int`): the length of the ticket dataset that makes the `Trainer` run `planned_steps`.
        epoch_rows (`tuple[int, int]`, *optional*): `(objective index, rows of one pass)` of the dataset whose passes
            are the run's epochs ([`~trl_trapo.objectives.epoch_rows`]); None when no dataset has a length.
    """

    slots: ObjectiveSlots
    extra: list[Objective]
    active: tuple[bool, ...]
    phase_shares: list[bool]
    curriculum_args: tuple
    planned_steps: int
    tickets: int
    epoch_rows: tuple[int, int] | None = None


def plan_run(
    args: TRAPOConfig,
    data: PreparedData,
    objectives: list[Objective] | None,
    *,
    with_teacher: bool,
    has_critic: bool,
    eval_dataset: Any,
    tokenizer: Any,
) -> RunPlan:
    """The run's objectives (the built-in ones, `distill` with a teacher, the user's `extra`), the curriculum's
    phases and the number of steps ([`~trl_trapo.collator.plan_steps`], at the curriculum's average shares).
    `objectives`: the user's, as given; `tokenizer`: the policy's (what pretraining documents make in rows of
    `pretrain_max_length` tokens, for [`~trl_trapo.objectives.warn_step_over_pass`]).

    Raises:
        ValueError: `total_episodes` without RL prompts; a teacher without prompts to sample; objectives the trainer
            cannot run (`check_objectives`, `objective_slots`); the errors of `phase_mixtures` and `plan_steps`.
    """
    if args.total_episodes is not None and data.rl is None:  # it would be ignored: the run follows epochs
        raise ValueError(
            f"{type(args).__name__}.total_episodes={args.total_episodes} counts RL prompts rolled out, but this run "
            "has no RL prompts (a `train_dataset` with rewards and rl_weight > 0): set max_steps or "
            "num_train_epochs to fix the run's length, or drop total_episodes."
        )
    check_objectives(objectives if objectives is not None else [])
    extra = list(objectives or [])
    if with_teacher and data.rl is None and data.distill is None:
        raise ValueError(
            "A teacher (`teacher_model` / teacher_model_name_or_path) scores the student's own samples of "
            "prompts, but this run has none: pass a `distillation_dataset` of prompts (reward-free), or a "
            "`train_dataset` of RL prompts (with reward_funcs) and rl_weight > 0."
        )
    slots = objective_slots(args, data, with_teacher, extra)
    names = slots.names
    warn_without_sample_prompts(args, eval_dataset)
    # the teacher's objective takes half of RL's share when the phases are given as three numbers
    mixtures = phase_mixtures(args.curriculum_mixtures, len(args.curriculum_boundaries) + 1, names, slots.halves)
    curriculum_args = (args.curriculum_boundaries, mixtures)
    active = tuple(a and c > 0 for a, c in zip(slots.has_data, slots.weights))
    phase_shares = [any(m[i] > 0 for m in mixtures) for i in range(len(names))]
    average_shares = CurriculumSchedule(
        *curriculum_args, 1000, args.curriculum_decay_steps, active=active, mode="constant", names=names
    ).mixture(0)
    primary = planning_rows(args, data, names, has_critic)
    planned_steps, tickets = plan_steps(args, average_shares, primary)
    warn_epoch_passes(args, data, names, average_shares, planned_steps, primary, has_critic)  # what an epoch is
    warn_step_over_pass(
        args, data, names, average_shares, planned_steps, primary, has_critic, tokenizer
    )  # step > pass
    epochs = epoch_rows(args, data, names, has_critic)  # what `state.epoch` counts passes of
    return RunPlan(slots, extra, active, phase_shares, curriculum_args, planned_steps, tickets, epochs)


def warn_idle_objectives(plan: RunPlan, first_extra: int) -> None:
    """The objectives from index `first_extra` on that have a curriculum share but no data or a weight of 0."""
    idle = [
        name
        for name, shared, on in list(zip(plan.slots.names, plan.phase_shares, plan.active))[first_extra:]
        if shared and not on
    ]
    if idle:
        logger.warning(
            "The objectives %s have a curriculum share but no data or a weight of 0: their share goes to the others.",
            idle,
        )


# ---- after the Trainer started: the objectives' rows, what decides each step, the frozen models -------------------
def setup_objectives(
    args: TRAPOConfig,
    data: PreparedData,
    plan: RunPlan,
    setup: Callable[[int], ObjectiveSetup],
) -> PretrainingObjective:
    """The pretraining objective on the checked `data.pretrain`, set up with the user's objectives (`plan.extra`)
    before the others are built: each gets its index in the plan's names (`setup(index)` builds its
    [`~trl_trapo.objectives.ObjectiveSetup`]); an added objective tokenizes its dataset here. The user's state must
    go into the checkpoint's JSON: refused now if it cannot. Objectives with a curriculum share but nothing to train
    are said once.

    Returns:
        [`~trl_trapo.objectives.PretrainingObjective`].

    Raises:
        TypeError: an objective of `plan.extra` whose `state_dict()` is not JSON (`check_state_dict`).
    """
    pretrain = PretrainingObjective(data.pretrain, getattr(args, PretrainingObjective.WEIGHT_FIELD), check=False)
    with progress_bars(enabled=not args.disable_tqdm):
        for objective in (pretrain, *plan.extra):
            setup_objective(objective, setup(plan.slots.names.index(objective.name)))
    for objective in plan.extra:  # its state goes into the checkpoint's JSON: refuse what cannot, now
        check_state_dict(objective)
    warn_idle_objectives(plan, len(BUILT_IN))
    return pretrain


def build_memory_pool(
    args: TRAPOConfig,
    data: PreparedData,
    planned_steps: int,
    rank: int,
    world_size: int,
    *,
    selector: Callable[[Any, Any], SampleSelector | None],
    adapter_bank: AdapterBankCallback | None,
) -> MemoryPool:
    """This rank's [`~trl_trapo.memory.MemoryPool`]: the RL prompt sampler, the long-term SFT pool (uniform or
    prioritised), a sample selector (`selector(sft_pool, prompt_sampler)`: the trainer's `build_sample_selector`
    hook), the adapter bank ([`build_adapter_bank`]) and self-imitation's buffer."""
    sft_pool = build_sft_pool(args, data.sft, planned_steps, rank, world_size) if data.sft is not None else None
    prompt_sampler = None
    if data.rl is not None:
        seed = args.sampling_seed + 2
        prompt_sampler = ShardedSampler(len(data.rl), seed, rank, world_size, shuffle=args.shuffle_rl_prompts)
    return MemoryPool(
        sft_pool,
        prompt_sampler,
        selector=selector(sft_pool, prompt_sampler),
        adapter_bank=adapter_bank,
        rank=rank,
        successes=build_successes(args, data.rl is not None, data.sft is not None),
    )


def build_adapter_bank(
    args: TRAPOConfig, policy: Callable[[], Any], accelerator: Any, zero3: bool, replay: ReplayBuffer
) -> AdapterBankCallback | None:
    """Snapshots of a PEFT policy's adapter (off without PEFT, with `adapter_snapshot_steps=0`, under ZeRO-3); a
    rollback empties `replay` (trajectories of the abandoned policy). `policy()`: the policy, unwrapped. The bank's
    settings ([`~trl_trapo.config.ADAPTER_BANK_FIELDS`]) given where it is off are warned about (trial 10's PY10)."""
    given = [
        f"{setting}={getattr(args, setting)!r}"
        for setting in changed_settings(args, ADAPTER_BANK_FIELDS)
        if setting != "adapter_snapshot_steps" or args.adapter_snapshot_steps > 0  # 0 turns the bank off: as meant
    ]
    if not is_peft_model(policy()):
        warn_ignored_settings(
            logger,
            given,
            "a PEFT policy (`peft_config`, --use_peft, or a PeftModel)",
            " (the adapter bank snapshots and rolls back adapters; this run trains the full model)",
            "Pass a peft_config (--use_peft) to snapshot and roll back an adapter with {them}, or drop {them}.",
        )
        return None
    if args.adapter_snapshot_steps <= 0:
        warn_ignored_settings(
            logger,
            given,
            f"adapter_snapshot_steps > 0 (it is {args.adapter_snapshot_steps})",
            " (the adapter bank is off)",
            "Set adapter_snapshot_steps to a number of steps (e.g. 100) to keep snapshots with {them}, or drop {them}.",
        )
        return None
    if zero3:
        logger.warning("The adapter bank does not gather ZeRO-3 partitioned adapters: it is off.")
        return None
    return AdapterBankCallback(
        AdapterBank(os.path.join(args.output_dir, "adapter_bank"), args.max_adapter_snapshots),
        policy,
        accelerator,
        on_rollback=replay.clear,
        every=args.adapter_snapshot_steps,
        reward_drop=args.adapter_rollback_reward_drop,
        kl_max=args.adapter_rollback_kl_max,
    )


def probe_noise_floor(model: Any, args: TRAPOConfig) -> float:
    """Three standard deviations of the cosine of two random vectors of DARE's probe's dimension, 3 / sqrt(D)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rows = min(config.vocab_size, args.dare_probe_vocab)
    dim = min(config.hidden_size, args.dare_probe_dim)
    return 3.0 / math.sqrt(rows * dim)


def build_probe(args: TRAPOConfig, policy: Callable[[], Any], device: Any, num_objectives: int) -> GradientProbe:
    """DARE's gradient probe of the policy's output layer (`dare_probe_vocab` x `dare_probe_dim`), sized by the
    policy's text config; built the first time DARE measures, so `policy()` is the prepared policy."""
    model = policy()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return GradientProbe(
        config.vocab_size,
        config.hidden_size,
        args.dare_probe_vocab,
        args.dare_probe_dim,
        device=device,
        seed=args.seed,
        num_objectives=num_objectives,
    )


def build_step_controls(
    args: TRAPOConfig, plan: RunPlan, noise_floor: float, policy: Callable[[], Any], device: Any
) -> tuple[RowAllocator, CurriculumSchedule, DARE, RLSchedules]:
    """What decides each step: the row allocator, the curriculum (shares per objective), DARE (weights; its probe
    of `policy()` on `device` built when first needed by [`build_probe`], no probe for static weights) and the RL
    coefficient schedules (learning rate / entropy by curriculum phase, adaptive KL)."""
    names = plan.slots.names
    allocator = RowAllocator(len(names))
    curriculum = CurriculumSchedule(
        *plan.curriculum_args,
        plan.planned_steps,
        args.curriculum_decay_steps,
        active=plan.active,
        mode=args.curriculum_mode,
        names=names,
    )
    engine = build_weighting(args, plan.slots.has_data, noise_floor, names)  # trl_trapo/weighting.py
    interval = args.dare_update_interval or math.ceil(math.sqrt(plan.planned_steps))
    probe_factory = functools.partial(build_probe, args, policy, device, len(names))
    dare = DARE(engine, interval, probe_factory=probe_factory, names=names, active=plan.active)
    schedules = RLSchedules(args, (curriculum.boundary_steps or [None])[-1])
    return allocator, curriculum, dare, schedules


def build_reference(
    args: TRAPOConfig, ref_model: Any, ref_adapter: str | None, unwrap: Callable
) -> ReferencePolicy | None:
    """The KL term's reference ([`~trl_trapo.models.ReferencePolicy`]: the prepared `ref_model`, or an adapter of
    the policy), None when `kl_coef` = 0 or there is none."""
    if args.kl_coef > 0 and (ref_model is not None or ref_adapter is not None):
        return ReferencePolicy(ref_model, ref_adapter, unwrap=unwrap)
    return None


def build_rollout_engine(
    args: TRAPOConfig,
    models: Models,
    rewards: RewardScorer,
    reference: ReferencePolicy | None,
    *,
    schedules: RLSchedules,
    unwrapped_for_rollouts: Callable,
    accelerator: Any,
    generation_config: GenerationConfig,
    stops: list[int],
    padding_id: int,
    policy: Any,
    active_rl: bool,
    teacher: Teacher | None,
) -> RolloutEngine:
    """The [`~trl_trapo.rollout.RolloutEngine`]: samples with the live policy (or vLLM with `use_vllm` and RL
    prompts), scores, adds reference log-probs, values and advantages (the KL as `models` resolved it), with
    demonstration guidance when `demonstration_column` is set and the teacher when distillation's estimator is
    `sampled_token` (it scores each sampled token in the round)."""
    guidance = None
    if args.demonstration_column is not None:
        guidance = DemonstrationGuidance(args.guidance, args.guidance_gamma)
    tokenizer = models.tokenizer
    return RolloutEngine(
        args,
        tokenizer,
        rewards,
        reference,
        models.has_critic,
        models.kl_penalty,
        models.kl_estimator,
        schedules.kl_coef,
        unwrapped_for_rollouts,
        accelerator,
        generation_config,
        stops,
        padding_id,
        guidance=guidance,
        vllm=VLLMGenerator(args, policy, accelerator, tokenizer, models.processing_class)
        if args.use_vllm and active_rl
        else None,
        teacher=teacher if args.distillation_estimator == "sampled_token" else None,
    )


@dataclasses.dataclass(frozen=True)
class RunCallbacks:
    """How [`build_callbacks`] changes the `Trainer`'s callbacks: remove `removed`, then add `added` in order, and
    put `leading` right after the Trainer's `DefaultFlowCallback` in `existing`.

    Attributes:
        removed (`list[TrainerCallback]`): the console callbacks `console_metrics="short"` replaces.
        added (`list[TrainerCallback]`): their short replacements, TRAPO's callbacks, and `stop_on_signal` last (so
            that every other callback has seen the step).
        stop_on_signal ([`~trl_trapo.callbacks.StopOnSignalCallback`]): saves a checkpoint and stops after SIGINT /
            SIGTERM (its `interruption` is `trainer.interruption`).
        leading (`list[TrainerCallback]`): callbacks that set what every other one reads at the same event (the
            [`~trl_trapo.callbacks.EpochCallback`]'s `state.epoch`), after the Trainer's flow (whose epoch-end flags it
            may undo).
        existing (`list`, *optional*): the Trainer's callback list (`Trainer.callback_handler.callbacks`) that
            `leading` goes into.
    """

    removed: list
    added: list
    stop_on_signal: StopOnSignalCallback
    leading: list = dataclasses.field(default_factory=list)
    existing: list | None = None

    def warn_removed(self, present: list) -> str | None:
        """Warn when a callback of `added` that TRAPO needs is no longer among `present` (the trainer's callbacks at
        `train()`): [`~trl_trapo.callbacks.warn_removed_callbacks`]."""
        return warn_removed_callbacks(self.added, present)

    def apply(self, add: Callable[[Any], None], remove: Callable[[Any], None]) -> None:
        """Remove `removed`, then add `added` in order (`Trainer.add_callback` / `remove_callback`), then insert
        `leading` right after the `DefaultFlowCallback` of `existing` (first when there is none)."""
        for callback in self.removed:
            remove(callback)
        for callback in self.added:
            add(callback)
        for offset, callback in enumerate(self.leading):
            flow = [i for i, c in enumerate(self.existing) if isinstance(c, DefaultFlowCallback)]
            self.existing.insert((flow[0] + 1 if flow else 0) + offset, callback)


def build_callbacks(
    args: TRAPOConfig,
    *,
    existing: list,
    schedules: RLSchedules,
    reduce_sum: Callable,
    model_wrapped: Callable[[], Any],
    accelerator: Any,
    save_state: Callable[[str], None],
    pending: Callable[[], Any],
    reference: ReferencePolicy | None,
    policy: Callable[[], Any],
    signal_catcher: SignalCatcher,
    supply_callbacks: list | None = None,
    allocator: RowAllocator | None = None,
    epoch_rows: tuple[int, int] | None = None,
) -> RunCallbacks:
    """TRAPO's callbacks, in the order they are added: the short console line's (`console_metrics="short"`, in
    place of `existing` console callbacks), the adaptive KL window, DDP's communication hook, TRAPO's state in every
    checkpoint (`save_state(checkpoint_dir)`; `pending()`: the checkpoint being written), the reference's sync
    (`sync_ref_model`), the RL supply's (`supply_callbacks`: [`RLSupplyParts.callbacks`]), and last the stop on
    SIGINT / SIGTERM (`signal_catcher`). With `epoch_rows` (`(objective index, rows of one pass)`, see
    [`RunPlan`]), an [`~trl_trapo.callbacks.EpochCallback`] leads the others: `state.epoch` is that objective's rows
    the row `allocator` gave so far (the same on every rank) x the processes, over a pass's rows.

    Raises:
        ValueError: `sync_ref_model=True` with no reference to update.
    """
    replaced = short_console_callbacks(existing) if args.console_metrics == "short" else []
    callbacks: list = [short for _, short in replaced]
    if schedules.adaptive_kl:
        callbacks.append(AdaptiveKLCallback(schedules, reduce_sum))
    if accelerator.num_processes == 1:  # warned now, not at train() (trial 10's PY16, as A08 / CF04 / TD09 are)
        warn_ignored_settings(
            logger,
            [f"ddp_comm_hook={args.ddp_comm_hook!r}"] if args.ddp_comm_hook != "none" else [],
            "a launch of several DDP processes",
            " (one process has no gradients to all-reduce)",
            "Launch with `accelerate launch --multi_gpu --num_processes N ...` (`trapo train --multi_gpu "
            "--num_processes N`) to compress DDP's gradient all-reduce with {them}, or drop {them}.",
        )
    callbacks.append(DDPCommHookCallback(model_wrapped, accelerator))
    callbacks.append(EndProcessGroupAtExitCallback())
    callbacks.append(StateCheckpointCallback(save_state, pending))
    if args.sync_ref_model and args.kl_coef > 0:
        if reference is None or not reference.syncable:
            raise ValueError(
                "sync_ref_model=True needs a reference to update: a `ref_model`, or a PEFT policy (its reference "
                "adapter is then a synced copy); not an explicit `ref_adapter_name` you manage yourself."
            )
        callbacks.append(SyncReferenceCallback(reference, policy))
    callbacks.extend(supply_callbacks or [])
    stop_on_signal = StopOnSignalCallback(signal_catcher, accelerator)
    leading = []
    if epoch_rows is not None and allocator is not None:
        index, rows_per_pass = epoch_rows
        world = accelerator.num_processes
        leading.append(EpochCallback(lambda: allocator.given[index] * world, rows_per_pass))
    return RunCallbacks(
        [callback for callback, _ in replaced], [*callbacks, stop_on_signal], stop_on_signal, leading, existing
    )


def short_console_callbacks(callbacks: list) -> list[tuple[Any, Any]]:
    """`(callback, replacement)` for each of the `Trainer`'s console callbacks that `console_metrics="short"`
    replaces by its short step line (the logs keep every metric)."""
    pairs = [(callback, SHORT_CONSOLE_CALLBACKS.get(type(callback))) for callback in list(callbacks)]
    return [(callback, short) for callback, short in pairs if short is not None]


# ---- the models of a run, loaded and checked together --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Models:
    """The run's models as [`load_models`] built them (before the `Trainer` prepares any).

    Attributes:
        policy (`nn.Module`): the policy (in its adapter with `peft_config`).
        trained (`nn.Module`): what the `Trainer` trains: the policy, or with a critic a
            [`~trl_trapo.models.PolicyAndValueWrapper`].
        processing_class: the tokenizer or processor the `Trainer` saves.
        tokenizer (`PreTrainedTokenizerBase`): the policy's text tokenizer.
        image_rows ([`~trl_trapo.vision.ImageRows`], *optional*): a VLM run's row builder.
        suppressed_token_ids (`list[int]`): ids the policy never samples.
        ref_model (`nn.Module`, *optional*): the frozen reference model (None with a reference adapter or no KL).
        ref_adapter (`str`, *optional*): the reference adapter of a PEFT policy ("" = adapter disabled).
        value_model (`nn.Module`, *optional*): the critic.
        teacher (`nn.Module`, *optional*): the distillation teacher, frozen and checked.
        kl_penalty (`str`), kl_estimator (`str`): resolved ([`resolve_kl`]).
    """

    policy: Any
    trained: Any
    processing_class: Any
    tokenizer: PreTrainedTokenizerBase
    image_rows: ImageRows | None
    suppressed_token_ids: list[int]
    ref_model: Any
    ref_adapter: str | None
    value_model: Any
    teacher: Any
    kl_penalty: str
    kl_estimator: str

    @property
    def has_critic(self) -> bool:
        return self.value_model is not None

    def token_readers(self, rewards: RewardScorer) -> list[tuple[str, Any, Any]]:
        """`(what, model or None, its tokenizer)` of every model that reads the policy's tokens: the critic, the
        teacher and the reward models."""
        return [("value_model", self.value_model, self.tokenizer), ("teacher_model", self.teacher, self.tokenizer)] + [
            (f"reward model '{name}'", func, tok)
            for func, tok, name in zip(rewards.funcs, rewards.processing_classes, rewards.names)
            if isinstance(func, nn.Module)
        ]


def load_models(
    args: TRAPOConfig,
    model: Any,
    *,
    processing_class: Any,
    ref_model: Any,
    value_model: Any,
    teacher_model: Any,
    peft_config: Any,
    agent: AgentSpec | None,
    train_dataset: Any,
    named_datasets: list[tuple[str, Any]],
    verified_checkpoint: str | None,
) -> Models:
    """Load the policy and its tokenizer ([`build_policy`]), its reference ([`policy_and_reference`]), the critic
    and the teacher (`teacher.load_teacher`), and check that the checkpoint to resume from (`verified_checkpoint`) is
    of this model. Trainable float16 weights of the policy or critic are warned about without fp16 mixed precision and
    refused with it ([`~trl_trapo.models.check_trained_precision`]).

    Raises:
        ValueError / CheckpointError: from the steps above, naming the argument and the fix.
    """
    built = build_policy(model, processing_class, args, agent, train_dataset, named_datasets)
    policy, ref_model, ref_adapter = policy_and_reference(built.model, built.model_id, ref_model, args, peft_config)
    # trainable float16 weights without fp16 mixed precision (trial 13's N28), or with it (GradScaler refuses them)
    check_trained_precision([("model", policy), ("value_model", value_model)], *trained_precision(args))
    if verified_checkpoint is not None:  # the checkpoint is of this model (config, LoRA settings)
        check_checkpoint_fits(verified_checkpoint, is_peft_model(policy), model=policy)
    kl_penalty, kl_estimator = resolve_kl(args, value_model is not None)
    trained = trained_model(policy, value_model, built.tokenizer, args)
    teacher = load_teacher(teacher_model, policy, args, built.tokenizer)  # frozen and checked (teacher.py)
    return Models(
        policy,
        trained,
        built.processing_class,
        built.tokenizer,
        built.image_rows,
        built.suppressed_token_ids,
        ref_model,
        ref_adapter,
        value_model,
        teacher,
        kl_penalty,
        kl_estimator,
    )


def trained_precision(args: TRAPOConfig) -> tuple[str, bool]:
    """`(mixed precision, float32 master weights)` of the run, read before the `Accelerator` exists, for
    [`~trl_trapo.models.check_trained_precision`]: transformers' `TrainingArguments.mixed_precision` ('no', 'fp16',
    'bf16'; from `fp16` / `bf16` or `ACCELERATE_MIXED_PRECISION`), and whether DeepSpeed (always: its config casts the
    model and keeps float32 master weights) or FSDP under mixed precision (accelerate upcasts the trainable
    parameters) holds the trained weights in float32 whatever their loaded dtype."""
    state = args.distributed_state
    kind = accelerator_distributed_type(state) if state is not None else None
    deepspeed = args.deepspeed_plugin is not None or kind == DistributedType.DEEPSPEED
    fsdp = bool(args.fsdp) or kind == DistributedType.FSDP
    return args.mixed_precision, deepspeed or (fsdp and args.mixed_precision != "no")


def check_data_fits(
    args: TRAPOConfig,
    data: PreparedData,
    models: Models,
    rewards: RewardScorer,
    agent: AgentSpec | None,
    rollout_func: Callable | None,
    datasets: dict[str, Any],
) -> None:
    """What needs both the tokenized data and the models, before the `Trainer` starts: every model that reads the
    policy's tokens fits the longest prompt + completion ([`check_reader_contexts`]); every reward function is called
    on the first 2 RL rows and on the first one ([`preflight_sizes`]; what they log is discarded; not with a
    `rollout_func`, whose extra keys — columns the reward functions may require — the dataset's rows do not have), and
    likewise on the prompt rows of each eval set (`datasets`: the trainer's dataset arguments by name; with tools /
    an `environment_factory`, with fresh environments `reset` with those rows, as evaluation's rollouts get them).

    Raises:
        ValueError: naming the model or the reward function at fault.
    """
    check_reader_contexts(args, data.prompt_sets, models.tokenizer, models.token_readers(rewards))
    if data.rl is not None and rewards.funcs:
        warn_missing_reward_cells(datasets.get("train_dataset"), "train_dataset", rewards.columns_read())
    if data.rl is not None and rollout_func is None:
        sizes = preflight_sizes(len(data.rl))
        rows = [data.rl[i] for i in range(sizes[0])]
        extra = agent.preflight_kwargs(rows) if agent is not None else None  # environments reset once per row
        for size in sizes:
            rows_kwargs = {key: values[:size] for key, values in extra.items()} if extra is not None else None
            rewards.preflight(rows[:size], rows_kwargs, source="`train_dataset`")
    # and on the prompts of each eval set, which evaluation scores with the same functions (a column the rewards read,
    # missing there, failed at the first evaluation, after training steps)
    if rollout_func is None and rewards.funcs:
        train_dataset = datasets.get("train_dataset")
        train_columns = dataset_columns(train_dataset) if train_dataset is not None else None
        for label, dataset in eval_datasets(datasets.get("eval_dataset")):
            columns = set(dataset_columns(dataset))
            if "prompt" not in columns or columns & {"text", "completion", "messages"}:
                continue  # token-id prompts carry no text to score; the others are evaluated by loss
            warn_missing_reward_cells(dataset, label, rewards.columns_read())
            for size in preflight_sizes(len(dataset)):
                rows = [dataset[i] for i in range(size)]
                extra = agent.preflight_kwargs(rows) if agent is not None else None  # evaluation's `environments`
                rewards.preflight(rows, extra, source=f"`{label}`", train_columns=train_columns)


def preflight_sizes(num_rows: int) -> list[int]:
    """How many rows each construction-time call of the reward functions gets: the first 2 rows, then the first one.

    Two calls of different sizes: a function returning a list of fixed length (one that ignores `len(completions)`,
    e.g. zips with a constant list) returns the right count for at most one of them, so it is refused before
    generation; one call of 2 rows passed a function that always returns 2 values (trial 6's R01).

    Returns:
        `list[int]`: the row counts, `[2, 1]`, or `[num_rows]` when `num_rows` is 0 or 1.
    """
    return [2, 1] if num_rows >= 2 else [num_rows]


def prepare_frozen_models(
    args: TRAPOConfig,
    models: Models,
    rewards: RewardScorer,
    prepare: Callable[[Any], Any],
    accelerator: Any,
    padding_id: int,
) -> tuple[Any, Teacher | None, ReferencePolicy | None]:
    """The frozen models prepared for the run (`prepare`: DeepSpeed or accelerate's evaluation-mode preparation):
    the reference model, the distillation teacher ([`~trl_trapo.teacher.Teacher`]) and the reward models (replaced in
    `rewards.funcs`). Models built after ZeRO-3 built the policy may miss the kernel functions their forward reads:
    they are restored first (`distributed.restore_kernel_functions`).

    Returns:
        `(prepared ref_model or None, teacher or None, the KL term's reference or None)`.
    """
    reward_models = [func for func in rewards.funcs if isinstance(func, nn.Module)]
    restore_kernel_functions(models.policy, models.ref_model, models.value_model, models.teacher, *reward_models)
    ref_model = prepare(models.ref_model) if models.ref_model is not None else None
    # the distillation objective and (for the sampled-token estimator) the rollout engine run its forwards
    teacher = None
    if models.teacher is not None:
        teacher = Teacher.from_config(models.teacher, args, accelerator, prepare, padding_id)
    reference = build_reference(args, ref_model, models.ref_adapter, accelerator.unwrap_model)
    for i, func in enumerate(rewards.funcs):
        if isinstance(func, nn.Module):
            rewards.funcs[i] = prepare(func)
    return ref_model, teacher, reference


def build_run_exploration(
    args: TRAPOConfig,
    data: PreparedData,
    models: Models,
    *,
    own_source: bool,
    world_size: int,
    with_successes: bool,
    agent: AgentSpec | None,
) -> TargetedExploration | None:
    """Targeted exploration (`rl_supply.build_exploration`: families whose groups carry no signal are sampled
    hotter), and — for a GRPO-style run (RL prompts, no critic) — the notice of the GRPO defaults this run lacks, said
    once."""
    has_rl = data.rl is not None
    exploration = build_exploration(
        args, has_rl, models.has_critic, own_source, world_size, with_successes, tool_loop=agent is not None
    )
    if has_rl and not models.has_critic:
        notice = grpo_notice(args, exploration is not None, agent is not None, models.kl_estimator, models.kl_penalty)
        if notice:
            logger.warning(notice)
    return exploration
