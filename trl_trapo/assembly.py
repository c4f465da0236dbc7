# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""How a run is assembled: the construction steps of [`~trl_trapo.TRAPOTrainer`] that need no trainer.

Each function takes what it needs as arguments and returns what it builds; `TRAPOTrainer.__init__` calls them in
order and wires the results to the `Trainer` hooks (issue 39):

1. [`check_run`]: the checks that run before anything slow loads — the arguments' types, the rollout source and the
   agent arguments (TRL's `tools` / `environment_factory`), the output directory, the datasets, the training setup,
   the best-model metric, the checkpoint to resume from (hashed once, here, and checked to fit the run), and torch's
   CPU threads;
2. [`build_rollout_source`]: where the RL objective's rounds come from — the user's `rollout_source`, TRL's
   `rollout_func`, the tool-calling source of `tools` / `environment_factory`, the asynchronous producer
   (`async_rollouts=True`) or the default [`~trl_trapo.sources.SyncRolloutSource`];
3. [`build_objectives`]: the objectives in the order of their names, the built-in ones on their supply (the memory
   pool, the RL supply's rows, the teacher).

Optional capabilities (agents, asynchronous rollouts) are imported inside the function that builds them, so a run
that does not use them never loads them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accelerate.utils import is_peft_model

from .arguments import check_config_type, check_trainer_arguments
from .checkpoint import check_checkpoint_fits, check_checkpoint_step, datasets_summary, verify_checkpoint
from .config import RL, SFT, TRAPOConfig
from .data import check_datasets
from .distributed import sum_over_ranks
from .evaluation import check_best_model_metric
from .objectives import DistillationObjective, Objective, ObjectiveSetup, RLObjective, SFTObjective
from .rewards import check_reward_checkpoint
from .saving import check_output_dir
from .setup_checks import check_training_setup
from .sources import RolloutFuncSource, RolloutSource, SyncRolloutSource, check_rollout_source
from .threads import ThreadChoice, choose_torch_threads


if TYPE_CHECKING:  # optional capabilities, imported where they are built
    from datasets import Dataset
    from transformers import GenerationConfig, PreTrainedTokenizerBase

    from .agents import AgentSpec
    from .exploration import TargetedExploration
    from .memory import MemoryPool
    from .metrics import MetricsAccumulator
    from .rewards import RewardScorer
    from .rollout import RolloutEngine
    from .schedules import RLSchedules
    from .teacher import Teacher
    from .vision import ImageRows


@dataclasses.dataclass(frozen=True)
class RunChecks:
    """What [`check_run`] found and built.

    Attributes:
        agent ([`~trl_trapo.agents.AgentSpec`], *optional*): the tool-calling spec of `tools` /
            `environment_factory`, None without them.
        train_dataset (`Dataset`, *optional*): the user's `train_dataset`, or — with an `environment_factory` and no
            dataset — placeholder prompts the environment's `reset` writes.
        own_source (`bool`): the run samples with a source of the user's (`rollout_source`, `rollout_func`, `tools` /
            `environment_factory`), not the default one.
        verified_checkpoint (`str`, *optional*): the absolute path of `args.resume_from_checkpoint` once every file's
            SHA-256 was verified and it fits the run; None when the run does not resume from a path.
        datasets_summary (`dict`): what checkpoints record of the datasets (`checkpoint.datasets_summary`).
        thread_choice ([`~trl_trapo.threads.ThreadChoice`]): torch's CPU threads for this process and its producers.
    """

    agent: AgentSpec | None
    train_dataset: Dataset | None
    own_source: bool
    verified_checkpoint: str | None
    datasets_summary: dict
    thread_choice: ThreadChoice


def check_run(
    args: TRAPOConfig,
    arguments: dict[str, Any],
    *,
    train_dataset: Dataset | None,
    eval_dataset: Any,
    pretrain_dataset: Any,
    sft_dataset: Dataset | None,
    distillation_dataset: Dataset | None,
    rollout_source: RolloutSource | None,
    rollout_func: Callable | None,
    tools: list[Callable] | None,
    environment_factory: Callable | dict[str, Callable] | None,
    reward_funcs: Any,
    reward_model: Any,
) -> RunChecks:
    """The construction checks that run before anything slow loads, in this order: the config's type, every
    argument's type (`arguments`: the keyword arguments of [`~trl_trapo.arguments.check_trainer_arguments`]), the
    `__main__` guard of an asynchronous run, the rollout source, the agent arguments, the output directory, the
    datasets, the training setup (trackers, optimizer, scheduler), the best-model metric, the checkpoint to resume
    from (every file's SHA-256, and that it fits the run; `train` does not hash it again), torch's threads.
    `arguments` also gives `model`, `peft_config`, `callbacks` and `optimizers` to the checks that read them.

    Returns:
        [`RunChecks`].

    Raises:
        TypeError / ValueError: from the check that failed, naming the field, the bad value and the fix.
    """
    check_config_type(args, TRAPOConfig)
    # every argument of the wrong type is refused by name now, not by the library that first touches it
    check_trainer_arguments(**arguments)
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
    check_datasets(args, train_dataset, sft_dataset, pretrain_dataset, eval_dataset, distillation_dataset)
    # trackers, optimizer and scheduler: built by `train()`, checked now
    check_training_setup(args, arguments.get("optimizers", (None, None)))
    # a reward model given by local path is a sequence-classification checkpoint (its config only, no weights)
    entries = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    for given_as, entry in [*(("reward_funcs", e) for e in entries), ("reward_model", reward_model)]:
        if isinstance(entry, str) and os.path.isdir(os.path.expanduser(entry)):  # a Hub id: when it loads
            check_reward_checkpoint(os.path.expanduser(entry), given_as)
    check_best_model_metric(args, eval_dataset, arguments.get("callbacks"))
    # what checkpoints record of the datasets, to refuse resuming one of them with others (check_checkpoint_fits)
    summary = datasets_summary(
        {
            "train_dataset": train_dataset,
            "sft_dataset": sft_dataset,
            "pretrain_dataset": pretrain_dataset,
            "distillation_dataset": distillation_dataset,
        }
    )
    # the checkpoint to resume from is verified now (every file's SHA-256), not after a first evaluation
    verified_checkpoint = None
    if isinstance(args.resume_from_checkpoint, (str, os.PathLike)):
        verify_checkpoint(args.resume_from_checkpoint, args.world_size)
        check_checkpoint_step(args.resume_from_checkpoint, args.max_steps)  # past max_steps: nothing to train
        # and that it fits this run: LoRA adapter vs full weights, the datasets (the model: once it is built)
        adapter = arguments.get("peft_config") is not None or is_peft_model(arguments.get("model"))
        check_checkpoint_fits(args.resume_from_checkpoint, adapter, summary)
        verified_checkpoint = os.path.abspath(args.resume_from_checkpoint)
    # torch's CPU threads: the cores shared among the processes this run starts, unless the user chose (threads.py)
    thread_choice = choose_torch_threads(args.torch_threads, producers_per_process=int(args.async_rollouts))
    return RunChecks(agent, train_dataset, own_source, verified_checkpoint, summary, thread_choice)


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
    `prompts -> dict`); the asynchronous producer (`async_rollouts=True`); otherwise the default
    [`~trl_trapo.sources.SyncRolloutSource`] sampling with the live policy. A source of the user's makes the metrics
    track environment tokens (completion mask 0).

    Raises:
        ValueError: a `rollout_func` without RL prompts; the conditions of [`build_async_source`].
    """
    group = 1 if has_critic else args.num_generations
    if agent is not None and active_rl:
        rollout_source = build_tool_source(args, parts, agent, group)
    if rollout_func is not None:  # TRL's rollout_func is one more source (sources.RolloutFuncSource)
        if not active_rl:
            raise ValueError(
                "rollout_func was given but there are no RL prompts: pass train_dataset (its `prompt` column is "
                "what rollout_func receives), with rl_weight > 0."
            )
        rollout_source = RolloutFuncSource(
            rollout_func,
            parts.rl_dataset,
            parts.memory_pool,
            num_generations=args.num_generations,
            num_mini_batches=args.num_mini_batches,
            image_token_ids=parts.suppressed_token_ids,  # a VLM's placeholders: returned prompts must hold its images'
        )
    if rollout_source is not None:  # its rounds may carry environment tokens (completion mask 0)
        parts.metrics.track_env_tokens()
    if args.async_rollouts:  # a producer process samples and scores rounds ahead (async_rollouts.py)
        rollout_source = build_async_source(args, parts, own_source, active_rl, group, exploration)
    if rollout_source is not None:
        return rollout_source
    return SyncRolloutSource(
        parts.engine,
        parts.rl_dataset,
        parts.memory_pool,
        group=group,
        num_mini_batches=args.num_mini_batches,
        temperature=args.temperature,
        exploration=exploration,
    )


def build_tool_source(args: TRAPOConfig, parts: SourceParts, agent: AgentSpec, group: int) -> RolloutSource:
    """The multi-turn tool-calling source of TRL's `tools` / `environment_factory` (trl_trapo/agents.py)."""
    from .agents import ToolRolloutSource

    accelerator = parts.accelerator
    return ToolRolloutSource(
        parts.engine,
        parts.rl_dataset,
        parts.memory_pool,
        agent,
        parts.tokenizer,
        parts.rewards,
        group=group,
        num_mini_batches=args.num_mini_batches,
        temperature=args.temperature,
        response_length=args.response_length,
        context=parts.context,
        max_iterations=args.max_tool_calling_iterations,
        log_metric=parts.metrics.log_metric,
        template_kwargs=args.chat_template_kwargs,
        # turns in lockstep across ranks (a turn's generation can be a collective) and `tools/*` over the round
        sum_over_ranks=(lambda tensor: sum_over_ranks(accelerator, tensor)) if accelerator.num_processes > 1 else None,
        generation_batch_size=args.local_rollout_forward_batch_size,
        stop_token_ids=parts.stops,  # a turn without one at its end was cut by the length limit
        images=parts.images,  # a VLM run: each turn generates with its row's images
    )


def build_async_source(
    args: TRAPOConfig,
    parts: SourceParts,
    own_source: bool,
    active_rl: bool,
    group: int,
    exploration: TargetedExploration | None,
) -> RolloutSource:
    """The asynchronous rollout source (`async_rollouts=True`): a producer process samples and scores rounds ahead.

    Raises:
        ValueError: naming the argument, with a rollout source of the user's (`rollout_source`, `rollout_func`,
            `tools` / `environment_factory`: they sample by themselves), without RL prompts, under DeepSpeed
            ZeRO-3 (a weight sync would gather the partitioned weights, a collective the ranks would reach at
            different steps), with the vLLM server on more than one process, or when a reward function cannot be
            pickled.
    """
    if own_source:
        raise ValueError(
            "TRAPOConfig.async_rollouts=True replaces the default rollout source by a producer process, but a "
            "rollout_source, rollout_func or tools / environment_factory was given (they sample by themselves): "
            "set async_rollouts=False, or drop them."
        )
    if not active_rl:
        raise ValueError(
            "TRAPOConfig.async_rollouts=True but the run has no RL prompts (train_dataset with rl_weight > 0): "
            "set async_rollouts=False."
        )
    if parts.zero3:
        raise ValueError(
            "TRAPOConfig.async_rollouts=True is not available under DeepSpeed ZeRO-3: sending the weights to the "
            "producer would gather the partitioned parameters, a collective that each rank reaches when its own "
            "replay buffer runs low. Use ZeRO-2 or DDP, or async_rollouts=False."
        )
    accelerator = parts.accelerator
    if args.use_vllm and accelerator.num_processes > 1:
        raise ValueError(
            "TRAPOConfig.async_rollouts=True with the vLLM server runs on one training process: every rank's "
            f"producer samples from the one server, and a weight push ({accelerator.num_processes} processes "
            "here) would have to wait for all of them at once. Launch one process, or set async_rollouts=False "
            "(synchronous vLLM rollouts gather every rank's prompts)."
        )
    parts.metrics.track_async()
    from .async_rollouts import AsyncRolloutSource

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
        group=group,
        num_mini_batches=args.num_mini_batches,
        rank=accelerator.process_index,
        device=str(accelerator.device),
        metrics=parts.metrics,
        exploration=exploration,
        vllm=parts.engine.vllm,  # server mode: the trainer's connection, for the weight pushes
        suppress_token_ids=parts.suppressed_token_ids,
        producer_threads=parts.producer_threads,
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
    active: tuple[bool, ...],
    teacher: Teacher | None,
    distill_prompts: Dataset | None,
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
        active (`tuple[bool, ...]`): whether the pretraining, SFT and RL objectives have data (config.OBJECTIVES).
        schedules ([`~trl_trapo.schedules.RLSchedules`]): the KL and entropy coefficients the RL term reads.
        logging_step (`Callable[[], bool]`): whether the current step logs (the RL term's extra statistics).
        sampler ([`~trl_trapo.rollout.RolloutEngine`]): samples the distillation prompts.
    """
    objectives: list[Objective] = [
        pretrain,
        SFTObjective(
            memory_pool,
            has_data=active[SFT],
            sft_loss_type=args.sft_loss_type,
            alpha=args.trust_region_alpha,
            weight=args.sft_weight,
        ),
        RLObjective(
            take_rl_rows,
            args,
            kl_coef=schedules.kl_coef,
            entropy_coef=schedules.entropy_coef,
            kl_penalty=kl_penalty,
            kl_estimator=kl_estimator,
            logging_step=logging_step,
            has_data=active[RL],
            weight=args.rl_weight,
        ),
    ]
    if teacher is not None:
        objectives.append(
            DistillationObjective.from_config(args, teacher, take_rl_rows, distill_prompts, sampler, rank, world_size)
        )
    for index, objective in enumerate(objectives[1:], start=1):  # pretrain and `extra` were set up before
        objective.setup(ObjectiveSetup(index, args, tokenizer, rank, world_size, planned_steps=planned_steps))
    return objectives + list(extra)
