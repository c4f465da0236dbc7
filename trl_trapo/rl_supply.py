# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The RL objective's supply chain: its rollout source, its replay buffer and the orchestration between them.

[`RLSupply`] serves the RL objective's rows (and the distillation objective's, when it trains on the student's RL
samples): whenever the replay buffer holds fewer servable trajectories than a step needs, a round of the rollout
source ([`~trl_trapo.sources.RolloutSource`]) refills it:

1. the source samples a [`~trl_trapo.sources.SampledRound`] (`sample`; an asynchronous source has asked for it ahead
   in `prefetch`, and may declare a round due before the buffer runs dry, `round_due`);
2. the rollout engine ([`~trl_trapo.rollout.RolloutEngine.finish`]) finishes it in this process, where collectives are
   safe: scores, guidance, reference log-probs, values, advantages with the round's statistics over every rank;
3. the finished [`~trl_trapo.rollout.RolloutBatch`] reaches every consumer, whole and in this order: targeted
   exploration, the episode count, the metrics, the adaptive KL window, the memory pool (few-shot, adapter bank),
   self-imitation, the replay buffer (its trajectories aged from the round's `version`), then exploration's search of
   the task families stuck at the temperature ceiling.

It owns the source, the replay buffer, targeted exploration and the episode count, and checkpoints them under the
keys TRAPO's checkpoints have always had (`episode`, `replay`, `exploration`, `rollout_source` in `trapo/rank{r}.json`;
the replay buffer's tensors and `rollout_source/<name>` tensors beside it). Its collaborators (the engine, the memory
pool, the metrics, the schedules) are shared with the rest of the run and come in through its constructor; it never
sees the trainer. The builders below make its parts from the configuration.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import gather_object

from .checkpoint import ROLLOUT_STATE_KEY, CheckpointError
from .collator import MODEL_INPUTS, Row
from .distributed import any_rank, max_over_ranks, reduce_replay_metrics
from .exploration import TargetedExploration
from .memory import MemoryPool, ReplayBuffer, SuccessReplay, Trajectory
from .models import embedding_rows
from .sources import (
    RolloutSource,
    SampledRound,
    check_checkpoint_state,
    check_round,
    check_round_due,
    source_name,
)
from .vision import examples_model_inputs


if TYPE_CHECKING:  # annotations only
    from torch import nn

    from .metrics import MetricsAccumulator
    from .rollout import RolloutBatch, RolloutEngine
    from .schedules import RLSchedules


logger = logging.getLogger(__name__)

MAX_ROUNDS_PER_STEP = 20  # rounds in a row without a usable trajectory before the run stops


class RLSupply:
    """Serves RL rows from the replay buffer, which rounds of the rollout source refill (module docstring).

    Args:
        source ([`~trl_trapo.sources.RolloutSource`]): where rounds come from (a duck-typed object already adapted,
            [`~trl_trapo.sources.as_rollout_source`]).
        engine ([`~trl_trapo.rollout.RolloutEngine`]): finishes rounds (`finish`, `process`); samples and scores
            exploration's search (`sample`, `scorer`, `stop_token_ids`).
        replay ([`~trl_trapo.memory.ReplayBuffer`]): this rank's trajectories.
        memory_pool ([`~trl_trapo.memory.MemoryPool`]): takes each round (`observe_rollouts`, `observe_successes`)
            and holds self-imitation's buffer (`successes`).
        metrics ([`~trl_trapo.metrics.MetricsAccumulator`]): takes each round (`add_rollouts`).
        schedules ([`~trl_trapo.schedules.RLSchedules`]): the adaptive KL controller's window (`observe_rollouts`).
        accelerator (`accelerate.Accelerator`): the ranks (round decisions and the search are collectives).
        args ([`~trl_trapo.TRAPOConfig`]): `num_generations`, `temperature` (read only).
        policy (`Callable[[], nn.Module]`): the trained policy, unwrapped (its vocabulary and context check rounds).
        has_critic (`bool`): advantages come from GAE (a `value_model`), not from groups.
        exploration ([`~trl_trapo.exploration.TargetedExploration`], *optional*): per-family temperatures; sees
            every round, and searches the families stuck at its ceiling (with self-imitation).
        task_families (`list[str]`, *optional*): the families `exploration/*` metrics are logged for.
        on_episode (`Callable[[int], None]`, *optional*): called with the run's episode count after every round (the
            trainer keeps `state.episode` current between logs, as TRL 1.12's `PPOTrainer` did).
    """

    def __init__(
        self,
        source: RolloutSource,
        engine: RolloutEngine,
        replay: ReplayBuffer,
        memory_pool: MemoryPool,
        metrics: MetricsAccumulator,
        schedules: RLSchedules,
        accelerator: Any,
        args: Any,
        policy: Callable[[], nn.Module],
        has_critic: bool,
        exploration: TargetedExploration | None = None,
        task_families: list[str] | None = None,
        on_episode: Callable[[int], None] | None = None,
    ):
        self.source, self.engine, self.replay, self.memory_pool = source, engine, replay, memory_pool
        self.accumulator, self.schedules, self.accelerator, self.args = metrics, schedules, accelerator, args
        self.policy, self.has_critic = policy, has_critic
        self.exploration, self.task_families, self.on_episode = exploration, task_families, on_episode
        self.episode = 0  # completions rolled out over every rank (TRL's `episode`), checkpointed
        self.warned_unmasked = False  # a round whose completion_mask counts no token: warned about once

    # ---- rows -------------------------------------------------------------------------------------------------------
    def take_rows(self, n: int, step: int) -> list[Row]:
        """`n` rows of the student's own samples at optimizer step `step` (the RL objective's rows, and the
        distillation objective's, which relabels them with its index). Collective: see [`take_trajectories`]."""
        return [t.to_row() for t in self.take_trajectories(n, step)]

    def take_trajectories(self, n: int, step: int) -> list[Trajectory]:
        """`n` trajectories from the replay buffer, after as many rounds as it needs (at most 20).

        Every rank collects when any rank needs to: a round gathers ZeRO-3 weights and takes its statistics over every
        rank (collectives), and replay buffers can differ across ranks (rewards of None drop rollouts). An
        asynchronous source's round is also taken before the buffer runs dry when the source says it is due (waiting
        longer would make it later than `max_staleness`; its trajectories join what the buffer holds).

        Raises:
            RuntimeError: after 20 rounds in a row without enough usable trajectories (no reward for any completion,
                or rounds older than `replay_max_age`), or when the source's `round_due(step)` forced the last rounds
                although the buffer held enough rows (it is asked again after every round, so a source always due
                never lets the step start: the message names the hook).
            TypeError: if `round_due` returns something other than True or False.
        """
        self.source.prefetch(n, step, self.replay.use_counts(step))  # a source that samples ahead asks for rounds
        name, forced = source_name(self.source), 0  # rounds in a row taken only because the source said one was due
        for attempt in range(MAX_ROUNDS_PER_STEP):
            due = check_round_due(self.source.round_due(step), name)
            short = self.replay.num_available(step) < n
            if not any_rank(self.accelerator, due or short):
                break
            forced = forced + 1 if due and not short else 0
            batch = self.collect(n, step)
            unscored = batch.per_func.numel() > 0 and bool(torch.isnan(batch.per_func).all())
            if attempt == 0 and unscored:  # said at once: the error below comes only after 19 more rounds
                logger.warning(
                    "Step %d: no completion of this rollout round got a reward: every reward function (%s) returned "
                    "None or NaN ('no reward for this sample', as in TRL) for all %d completions, so none can be "
                    "trained on. Rounds are retried (20 in a row without a usable trajectory stop the run); if your "
                    "reward functions cannot score any completion, fix them now.",
                    step,
                    ", ".join(repr(name) for name in self.engine.scorer.names),
                    batch.per_func.shape[0],
                )
        else:
            if forced:  # trial 9's PX82: a source always due was reported as rounds without rewards
                raise RuntimeError(
                    f"{name}.round_due({step}) returned True before each of the last {forced} rounds at step {step}, "
                    f"although the replay buffer held the {n} rows the step needs, so the step never started "
                    f"({MAX_ROUNDS_PER_STEP} rounds). round_due is asked again after every round it forces: return "
                    "True only until a round of that step was taken (e.g. note the step in `sample` and return "
                    "`step != self.last_round_step`), or leave round_due out (a round is then taken whenever the "
                    "buffer runs short)."
                )
            raise RuntimeError(
                "20 rollout rounds in a row produced no usable trajectory: every reward function returned None or NaN "
                "(both mean 'no reward for this sample', as in TRL) for every completion, or the rollout source's "
                "rounds were more than replay_max_age steps old. Check the reward functions (`rewards/<function>/mean` "
                "is logged only over the samples they scored) and the `version` your rollout source stamps."
            )
        return self.replay.sample(n, step)

    # ---- rounds -----------------------------------------------------------------------------------------------------
    def collect(self, rows_needed: int, step: int) -> RolloutBatch:
        """Run one round: the source samples it, the engine finishes it, every consumer takes it (module docstring).
        Collective under data parallelism: every rank calls it at the same time.

        Args:
            rows_needed (`int`): RL rows a step needs on this rank (the default source samples
                `ceil(rows_needed * num_mini_batches / group)` prompts x `group`).
            step (`int`): the current optimizer step, i.e. the policy version being trained.

        Returns:
            [`~trl_trapo.rollout.RolloutBatch`]: the finished round (its trajectories are in the replay buffer).

        Raises:
            TypeError: if the source does not return a `SampledRound`.
            ValueError: naming the source, for a round sampled by a later policy than `step`, token ids outside the
                vocabulary, a prompt + completion longer than the context, or `group=1` with group-relative
                advantages (see [`~trl_trapo.sources.check_round`]).
        """
        sampled = self.source.sample(rows_needed, step)
        name = f"{source_name(self.source)}.sample"
        if not isinstance(sampled, SampledRound):
            raise TypeError(
                f"{name} returned {type(sampled).__name__}; a rollout source returns a trl_trapo.sources.SampledRound."
            )
        policy = self.policy()
        config = policy.config.get_text_config() if hasattr(policy.config, "get_text_config") else policy.config
        check_round(
            sampled,
            step,
            embedding_rows(policy),
            getattr(config, "max_position_embeddings", None),
            name,
        )
        self.warn_unmasked(sampled, name)
        if sampled.group == 1 and not self.has_critic:
            raise ValueError(
                f"{name} returned a round with group=1, but advantages are group-relative (no value_model): every "
                f"completion would get advantage 0. Return `group` completions per prompt (num_generations="
                f"{self.args.num_generations}) consecutively and set SampledRound.group, or train with a value_model."
            )
        batch = self.engine.finish(sampled, across_ranks=True, source=name)
        if sampled.importance_weight != 1.0:  # e.g. a late asynchronous round, down-weighted
            for trajectory in batch.trajectories:
                trajectory.importance_weight = sampled.importance_weight
        self.consume(batch, step)
        return batch

    def warn_unmasked(self, sampled: SampledRound, name: str) -> None:
        """Warn once when a round's `completion_mask` is 0 on every token (trial 8's SR03): no sampled token counts,
        so the round trains nothing (RL loss 0) though it looks like a round."""
        masks = sampled.completion_mask
        if self.warned_unmasked or masks is None or any(bool(m.any()) for m in masks):
            return
        self.warned_unmasked = True
        logger.warning(
            "%s returned a round whose completion_mask is 0 on every token of its %d completions: no token counts "
            "(1 = the policy sampled it, 0 = the environment wrote it), so the round trains nothing. Put 1 on the "
            "tokens the policy sampled (TRL's `env_mask`), or completion_mask=None when it sampled them all. "
            "(Warned once.)",
            name,
            len(masks),
        )

    def consume(self, batch: RolloutBatch, step: int) -> None:
        """A finished round reaches every consumer, whole and in this order: targeted exploration (collective: the
        whole round's groups decide each family's temperature), then [`observe`], self-imitation, the replay buffer;
        then exploration's search of the families stuck at the ceiling ([`search_stuck_families`])."""
        if self.exploration is not None:
            self.exploration.observe(batch)
        self.observe(batch)
        self.memory_pool.observe_successes(batch)  # self-imitation keeps the rare successes
        self.replay.add(batch.trajectories)
        self.search_stuck_families(batch, step)

    def observe(self, batch: RolloutBatch) -> None:
        """A finished round reaches everything that learns from rollouts: the episode count, the metrics, the adaptive
        KL controller's window, the memory pool (few-shot prototypes, adapter-bank window)."""
        self.episode += len(batch.completion_ids) * self.accelerator.num_processes
        if self.on_episode is not None:
            self.on_episode(self.episode)
        self.accumulator.add_rollouts(batch)
        self.schedules.observe_rollouts(batch)  # the adaptive KL controller's input
        self.memory_pool.observe_rollouts(batch)  # few-shot prototypes; adapter-bank window

    def search_stuck_families(self, batch: RolloutBatch, step: int) -> None:
        """Targeted exploration's search (trl_trapo/exploration.py): the round's groups of a family stuck at the
        temperature ceiling are sampled again `exploration.search_repeats(family)` times (at the family's temperature,
        in one batched `generate` call, by the policy of version `step`), scored by the reward functions, and their
        successes go to self-imitation (a success is news there: its search group is stuck or mostly failing).
        Nothing else sees these completions. Needs exploration (with `exploration_max_search` > 0), self-imitation,
        and prompts that carry `prompt_ids` (the default rollout source's do). Collective under data parallelism:
        every rank samples and scores as many rows (the most any rank has to search; a rank with fewer repeats its
        own searched groups, or its round's first groups when it has none), so generation and reward models stay in
        lockstep."""
        explore, successes = self.exploration, self.memory_pool.successes
        if explore is None or successes is None or not explore.max_search or batch.group < 2:
            return
        group = batch.group
        examples = []
        for start in range(0, len(batch.examples), group):
            rows = batch.examples[start : start + group]
            examples += rows * explore.search_repeats(explore.families(rows[:1])[0])
        needed = max_over_ranks(self.accelerator, len(examples))  # the same on every rank
        if not needed or not all("prompt_ids" in e for e in batch.examples):
            return
        pool = examples or list(batch.examples)
        examples = [pool[i % len(pool)] for i in range(needed)]  # whole groups: every count is a multiple of group
        sampled = self.engine.sample(examples, group, step, explore.row_temperatures(examples))
        prompt_ids = sampled.prompt_ids or [torch.as_tensor(e["prompt_ids"]) for e in examples]
        scores, _ = self.engine.scorer.score(examples, prompt_ids, sampled.completion_ids)
        stops = torch.tensor(self.engine.stop_token_ids, dtype=torch.long)  # none: completions never stop early
        is_truncated = torch.tensor([not bool(torch.isin(c, stops).any()) for c in sampled.completion_ids])
        model_inputs = examples_model_inputs(examples, MODEL_INPUTS)  # a VLM prompt's images ride along
        successes.observe(
            prompt_ids, sampled.completion_ids, scores, is_truncated, group, model_inputs=model_inputs, search=True
        )

    @torch.no_grad()
    def process(
        self,
        examples: list[dict],
        completion_ids: list[torch.Tensor],
        old_per_token_logps: list[torch.Tensor] | None,
        group: int | None,
        temperature: float | None,
        version: int,
    ) -> list[Trajectory]:
        """Given rollouts as trajectories, finished as a round is, observed ([`observe`]) but not stored (see
        `TRAPOTrainer.process_rollouts`). `group` None: 1 with a critic, else `num_generations`; `temperature` None:
        the configured one."""
        group = group or (1 if self.has_critic else self.args.num_generations)
        temperature = self.args.temperature if temperature is None else temperature
        batch = self.engine.process(examples, completion_ids, old_per_token_logps, group, temperature, version=version)
        self.observe(batch)
        return batch.trajectories

    # ---- the run's edges: metrics, checkpoints, closing -------------------------------------------------------------
    def metrics(self, step: int) -> dict[str, float]:
        """`exploration/*` (the family temperatures, the same on every rank) and `replay/*` (reduced over ranks: a
        collective) at a logging step."""
        out = self.exploration.metrics(self.task_families) if self.exploration is not None else {}
        out.update(reduce_replay_metrics(self.accelerator, self.replay.metrics(step)))
        return out

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """`(meta, tensors)` for this rank's checkpoint: JSON entries `episode`, `num_tokens`, `replay`, `exploration`
        (None without it) and `rollout_source` (only for a source with state), and the replay buffer's tensors and the
        source's (prefixed `rollout_source/`). Waits for an asynchronous source's rounds in flight."""
        replay_meta, tensors = self.replay.state_dict()
        meta = {
            "episode": self.episode,
            "num_tokens": self.accumulator.tokens_seen,  # this rank's prompt and policy tokens (TRL's `num_tokens`)
            "replay": replay_meta,
            "exploration": self.exploration.state_dict() if self.exploration is not None else None,
        }
        source_state = check_checkpoint_state(self.source.checkpoint_state(), source_name(self.source))
        if source_state is not None:  # a source with state of its own (the asynchronous one: rounds in flight)
            meta[ROLLOUT_STATE_KEY], source_tensors = source_state
            tensors = {**tensors, **{f"rollout_source/{k}": v for k, v in source_tensors.items()}}
        return meta, tensors

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor], where: str = "the checkpoint") -> None:
        """Restore what [`state_dict`] wrote (`meta` may be the whole rank state: only its own keys are read; `where`
        names the file it was read from, for errors).

        Raises:
            KeyError: if `episode` or `replay` is missing.
            CheckpointError: naming the source, what its `restore_checkpoint_state` raised, the state it was given
                and the fix (for a checkpoint without the state a source with state needs, too).
        """
        self.episode = int(meta["episode"])
        self.accumulator.tokens_seen = int(meta.get("num_tokens", 0))  # absent from checkpoints before it was logged
        if self.exploration is not None:
            self.exploration.load_state_dict(meta.get("exploration"))
        self.replay.load_state_dict(meta["replay"], tensors)
        prefix = "rollout_source/"
        source_meta = meta.get(ROLLOUT_STATE_KEY)
        try:
            self.source.restore_checkpoint_state(
                source_meta, {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            )
        except CheckpointError:
            raise
        except Exception as error:  # the source's own code (trial 9's PX87: a bare "KeyError: 'position'")
            name = source_name(self.source)
            fix = (
                "the checkpoint holds no state of this source (written by a run with another rollout source, or "
                "one without state): resume with the same rollout source"
                if source_meta is None
                else "make restore_checkpoint_state read what checkpoint_state returns (keys it may lack: "
                "meta.get(key, default))"
            )
            raise CheckpointError(
                f"{where}: rollout source {name}.restore_checkpoint_state raised {type(error).__name__}: {error}, given the "
                f"checkpoint's state for it: {json.dumps(source_meta, default=str)[:200]}. Fix: {fix}."
            ) from error

    def close(self, abort: bool = False) -> None:
        """Stop the source's own process or pool when `train()` ends (a later round starts it again); on a second
        Ctrl-C (`abort`) with a short timeout, so the run stops at once even while a reward call hangs."""
        self.source.close(timeout=0.5 if abort else None)


# ---- builders: the supply's parts from the configuration ------------------------------------------------------------
def build_replay_buffer(args: Any, max_uses: int, rank: int) -> ReplayBuffer:
    """This rank's replay buffer: `replay_capacity` / `replay_max_bytes` / `replay_max_age` / `replay_compress*`,
    each trajectory served `max_uses` times (the trainer's `replay_max_uses` hook), seeded by rank."""
    return ReplayBuffer(
        capacity=args.replay_capacity,
        max_bytes=args.replay_max_bytes,
        max_uses=max_uses,
        max_age=args.replay_max_age,
        seed=args.seed + 3 + rank,
        compress=args.replay_compress,
        compress_threshold=args.replay_compress_threshold,
    )


def build_successes(args: Any, rl_active: bool, sft_active: bool) -> SuccessReplay | None:
    """Self-imitation's buffer (`self_imitation` True, or None where the run has RL prompts and SFT data and no
    few-shot mode; trl_trapo/memory/successes.py), or None.

    Raises:
        ValueError: if `self_imitation=True` without RL prompts or without SFT data (its rows are SFT rows).
    """
    if args.self_imitation is False:
        return None
    if args.self_imitation is None:
        if not (rl_active and sft_active) or args.fewshot_mode:
            return None
    elif not (rl_active and sft_active):
        raise ValueError(
            "self_imitation=True serves RL's successes as SFT rows, so it needs both RL prompts and SFT data with "
            f"a positive weight (this run has RL {rl_active}, SFT {sft_active}). Give an sft_dataset (any "
            "demonstrations; the SFT weight makes room for the successes), or set self_imitation=False."
        )
    return SuccessReplay(
        args.self_imitation_min_reward,
        args.self_imitation_fraction,
        args.self_imitation_max_uses,
        args.self_imitation_capacity,
    )


def build_exploration(
    args: Any,
    rl_active: bool,
    has_critic: bool,
    own_source: bool,
    world_size: int,
    with_successes: bool,
    tool_loop: bool = False,
) -> TargetedExploration | None:
    """Targeted exploration (trl_trapo/exploration.py): families whose groups carry no signal are sampled hotter.

    On with `exploration=True`, or None (auto) where it runs as it always has: RL prompts, groups (no value model), HF
    generate, no few-shot mode, the default rollout source. `exploration=True` also runs with a value model (one
    completion per prompt: a family is watched through all its completions of a round, and there is no search, which
    needs groups), in few-shot mode (a family's boost scales the round's annealed temperature), with vLLM (one vLLM
    call per distinct temperature, [`~trl_trapo.samplers.VLLMSampler`]) and in the tool-calling loop (every turn of a
    rollout at its family's; no search there); a source of the user's is refused by `check_rollout_source`. A round
    stays one `generate` call whatever the temperatures, so it runs under every distribution strategy, ZeRO-3 / FSDP
    included.

    Args:
        own_source (`bool`): the rounds come from a source of the user's (`rollout_source`, `rollout_func`, tools),
            which sets its own temperatures: off, except for the tool loop with `exploration=True`.
        world_size (`int`): processes (above 1, the decisions take the whole round, every rank's share).
        with_successes (`bool`): self-imitation is on; the search of stuck families feeds it only.
        tool_loop (`bool`): the rounds come from the tool-calling loop (`tools` / `environment_factory`). It samples
            at exploration's temperatures with `exploration=True`; the search of stuck families, a single-turn round
            of the default source, is off there (its completions would not be the tool loop's).
    """
    explicit_tools = tool_loop and args.exploration is True
    if (own_source and not explicit_tools) or args.exploration is False or not rl_active:
        return None
    if args.exploration is None and (has_critic or args.use_vllm or args.fewshot_mode):
        logger.info("exploration=None: off in this run (it needs groups, HF generate, no few-shot mode).")
        return None
    return TargetedExploration(
        args.temperature,
        args.exploration_ceiling,
        args.exploration_temperature_step,
        gather=gather_object if world_size > 1 else None,  # decides from the whole round, every rank's share
        # the search feeds self-imitation only: without it there is nothing to search for; it re-samples groups of the
        # default source (not a critic's single completions, not the tool loop's multi-turn rollouts)
        max_search=args.exploration_max_search if with_successes and not has_critic and not tool_loop else 0,
    )


__all__ = ["RLSupply", "build_exploration", "build_replay_buffer", "build_successes"]
