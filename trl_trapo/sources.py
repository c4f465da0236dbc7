# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Rollout sources: where the RL objective's rows come from, one whole round at a time.

**The contract.** Whenever the replay buffer holds fewer servable trajectories than a step needs, the trainer asks its
source for a round (on every rank at the same time; each rank has its own source object):

    round = source.sample(rows_needed, step)  # -> SampledRound

A source decides *what* is sampled and *how*: which prompts, by which policy version, at which temperatures, with
transformers' `generate`, vLLM, a multi-turn agent with tools, or a producer in another process. It returns a
[`SampledRound`]: the rows (dataset examples), the completions' token ids, optionally their behaviour log-probs, each
row's sampling temperature, the policy version that sampled them, and optionally scores it already computed and a
completion mask (1 on tokens the policy sampled, 0 on tokens the environment wrote, e.g. tool results: TRL's
`env_mask`).

The trainer then *finishes* the round itself, at consumption time, in its own process where collectives are safe
([`~trl_trapo.rollout.RolloutEngine.finish`]): prompt ids (tokenized when absent), behaviour log-probs when the round
has none (the current policy's), scores when it has none (the trainer's reward functions) and the missing-stop penalty,
guidance's demonstrations, reference log-probs, critic values, advantages (GAE or group-relative, with the round's
statistics over every rank). The finished [`~trl_trapo.rollout.RolloutBatch`] goes whole to every consumer:
targeted exploration, the metrics, the adaptive KL window, the memory pool (few-shot, adapter bank, self-imitation)
and the replay buffer, which stamps each trajectory with the round's `version` (its age is the current step minus
that version; `replay_max_age` retires stale ones).

**Environment tokens.** Tokens with completion mask 0 stay in the sequence (the policy reads them) and count nowhere:
no policy, KL, entropy or value loss, no loss normaliser, no DARE probe, no ratio, clip, KL or entropy statistic, no
length metric (`completions/mean_length` counts the policy's tokens, `completions/mean_env_length` the
environment's), no stop (a stop token the environment wrote is not the policy's). Their behaviour log-probs are
ignored (0 is stored); GAE with a critic steps over them (`losses.gae_advantages`), so advantages, returns and values
are 0 there; the replay buffer, its checkpoint and self-imitation keep the mask.

What this contract leaves to the source, and what to the trainer, is chosen so that two kinds of sources fit:

- **TRL's `rollout_func`** (`rollout_func(prompts, trainer) -> dict(prompt_ids, completion_ids, logprobs[, env_mask,
  extra keys])`, `TRAPOTrainer(rollout_func=...)`): [`RolloutFuncSource`] draws prompts, calls the function with them
  as TRL's code does (each prompt `num_generations` times in a row, one completion back per entry), and returns
  `SampledRound(examples=rows with the extra keys as reward columns, prompt_ids, completion_ids,
  sampler_per_token_logps=logprobs, completion_mask=env_mask, version=step, group=num_generations)`. As in TRL, `logprobs` are the *sampler's* log-probs: the trainer's own forward gives PPO's
  behaviour log-probs (first-use ratio exactly 1), and the sampler's weight the policy loss by the mismatch (below).
  Multi-turn completions are returned as they are: the trainer never cuts a source's completions.
- **An asynchronous producer**: another process samples with a snapshot of the policy, computes the behaviour
  log-probs and the rewards there, and hands over finished samples with `version` = the step whose weights it had and
  `scores` set; `sample` returns the next ready round. An engine whose log-probs are not the trainer's own (vLLM, a
  producer in another precision) returns them as `sampler_per_token_logps`: the trainer then computes its own when it
  finishes the round (PPO's behaviour log-probs) and weights the policy loss by the sampler/trainer mismatch
  (`vllm_importance_sampling_*`, `trl_trapo/sampler_correction.py`). For a round older than the current step, the
  trainer's log-probs are the current policy's, so the weight then also covers the staleness (decoupled PPO's
  proximal policy, AReaL huggingface.co/papers/2505.24298). Reference log-probs, values, advantages and every round or
  cross-rank statistic are still computed by the trainer when it consumes the round.

[`SyncRolloutSource`] is the default: today's synchronous sampling with the live policy, in the trainer's process.
[`RolloutFuncSource`] is TRL's `rollout_func`.

**The base class.** A source subclasses [`RolloutSource`] and overrides `sample`; its optional hooks (`prefetch`,
`round_due`, `checkpoint_state` / `restore_checkpoint_state`, `close`) have neutral defaults, and the trainer calls
them directly. An object that only has a `sample` method (a source written against the earlier, duck-typed contract)
is wrapped in a [`RolloutSourceAdapter`], which forwards the hooks it defines.

Limits: a source's own state is checkpointed only through its `checkpoint_state` (the default source's prompt order
and sampling seed live in the memory pool and the engine, which are checkpointed as before). Sampling and finishing
each enter the unwrapped model, so under ZeRO-3 with `ds3_gather_for_generation` a default round gathers the weights
twice (one gather served both before the split).

`docs/writing_a_rollout_source.md` has a worked example. Shapes: `B` completions, `group` consecutive ones per prompt,
`P_i` prompt tokens and `C_i` completion tokens of row i.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .rewards import check_reward_columns


if TYPE_CHECKING:  # annotations only: rollout.py imports this module
    from datasets import Dataset

    from .exploration import TargetedExploration
    from .memory import MemoryPool
    from .rollout import RolloutEngine


logger = logging.getLogger(__name__)


def per_token(values: Any, field: str, index: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Entry `index` of the per-token field `field` of a [`SampledRound`] as a 1-D tensor (of `dtype` when given).

    Raises:
        ValueError: naming the field and entry, if it is not 1-D (e.g. a `(1, C)` row of a batch).
    """
    tensor = torch.as_tensor(values)
    if tensor.dim() != 1:
        raise ValueError(
            f"SampledRound.{field}[{index}] has shape {tuple(tensor.shape)}: each entry is a 1-D tensor, one value "
            "per token of its completion (a (1, C) row of a batch: `.squeeze(0)`, or `.view(-1)`)."
        )
    return tensor if dtype is None else tensor.to(dtype)


def token_ids(values: Any, field: str, index: int) -> torch.Tensor:
    """Entry `index` of `completion_ids` / `prompt_ids` of a [`SampledRound`] as a 1-D long tensor. Whole numbers
    stored as floats are converted (nothing is lost); anything else is refused.

    Raises:
        ValueError: naming the field and entry, if it is not 1-D, or holds numbers that are not whole (or not
            real): token ids are the tokenizer's integers.
    """
    tensor = per_token(values, field, index)
    if tensor.is_complex() or (tensor.is_floating_point() and not bool((tensor == tensor.round()).all())):
        bad = tensor[tensor != tensor.round()] if not tensor.is_complex() else tensor
        raise ValueError(
            f"SampledRound.{field}[{index}] holds {tensor.dtype} values that are not token ids (e.g. "
            f"{bad[:4].tolist()}): token ids are the tokenizer's whole numbers; give the ids themselves (a long "
            "tensor or a list of ints), not log-probs, scores or ids shifted by arithmetic."
        )
    return tensor.to(torch.long)


@dataclass
class SampledRound:
    """One round as a source samples it: `B` completions, `group` consecutive ones per prompt.

    Raises:
        ValueError: naming the field, if the per-row fields do not have one entry per completion (or one value per
            token of its completion), `B` is not a multiple of `group`, the round is empty, a completion mask holds
            something other than 0 and 1, behaviour log-probs at the policy's tokens are not finite and <= 0,
            sampler log-probs are not <= 0 or NaN, or both kinds of log-probs are given.
    """

    examples: list[dict[str, Any]]  # (B,) the dataset row of each completion's prompt: `prompt_ids` or `prompt`, and
    # the columns the reward functions read; rows of one prompt are `group` consecutive entries
    completion_ids: list[torch.Tensor]  # (C_i,) long each: the completion as it is trained (never cut by the trainer)
    version: int  # the policy version that sampled it: the optimizer step whose weights generated it
    group: int = 1  # consecutive completions that share a prompt (group-relative advantages)
    old_per_token_logps: list[torch.Tensor] | None = None  # (C_i,) each: behaviour log-probs (nats) at the row's
    # temperature; None: the trainer computes them with the current policy (exact only when `version` is current);
    # set to 0 where `completion_mask` is 0 (what a source puts there is ignored)
    temperatures: float | Sequence[float] | torch.Tensor | None = None  # the sampling temperature, one or (B,);
    # None: the configured `temperature`
    prompt_ids: list[torch.Tensor] | None = None  # (P_i,) long each; None: each example's `prompt_ids`, else its
    # `prompt` tokenized as the trainer tokenizes prompts
    completion_mask: list[torch.Tensor] | None = None  # (C_i,) each, 0/1: 1 on tokens the policy sampled, 0 on tokens
    # the environment wrote (tool results: TRL's `env_mask`); 0-tokens count nowhere (module docstring); None: all 1
    scores: torch.Tensor | None = None  # (B,) rewards the source computed (NaN = no reward), before the trainer's
    # `missing_eos_penalty`; None: the trainer's reward functions score the round
    per_func: torch.Tensor | None = None  # (B, F) each of the trainer's F reward functions' reward, with `scores`
    # (for `rewards/<name>/mean`); None: no per-function metrics for this round
    sampler_per_token_logps: list[torch.Tensor] | None = None  # (C_i,) each: the log-probs of the sampled tokens
    # as a separate sampling engine computed them (vLLM, a `rollout_func`'s `logprobs`, an asynchronous producer;
    # nats, at the row's temperature,
    # over the support the configured `top_k` / `top_p` keep, renormalised: vLLM's "processed_logprobs"); NaN where
    # the engine gave none. With them the trainer computes the behaviour log-probs itself (`old_per_token_logps`
    # must be None) and weights the policy loss by the sampler/trainer mismatch (`vllm_importance_sampling_*`);
    # ignored when `vllm_importance_sampling_correction=False`; set to 0 where `completion_mask` is 0
    importance_weight: float = 1.0  # a detached weight of every one of the round's losses (e.g. an asynchronous
    # source's late round, `stale_rollouts="downweight"`); stamped on its trajectories (`importance_weight`)

    def __post_init__(self):
        self.completion_ids = [token_ids(c, "completion_ids", i) for i, c in enumerate(self.completion_ids)]
        if self.prompt_ids is not None:
            self.prompt_ids = [token_ids(p, "prompt_ids", i) for i, p in enumerate(self.prompt_ids)]
        if self.completion_mask is not None:
            self.completion_mask = [
                per_token(m, "completion_mask", i).float() for i, m in enumerate(self.completion_mask)
            ]
        if self.old_per_token_logps is not None:
            self.old_per_token_logps = [
                per_token(lp, "old_per_token_logps", i, torch.float32) for i, lp in enumerate(self.old_per_token_logps)
            ]
        if self.sampler_per_token_logps is not None:
            self.sampler_per_token_logps = [
                per_token(lp, "sampler_per_token_logps", i, torch.float32)
                for i, lp in enumerate(self.sampler_per_token_logps)
            ]
            if self.old_per_token_logps is not None:
                raise ValueError(
                    "SampledRound: give the behaviour log-probs either as `old_per_token_logps` (the trainer's own, "
                    "used as they are) or as `sampler_per_token_logps` (another engine's: the trainer computes its "
                    "own and corrects for the mismatch), not both."
                )
        if isinstance(self.examples, Mapping):  # its len() is the number of columns: "2 completions do not form ..."
            columns = list(self.examples)
            raise ValueError(
                f"SampledRound.examples is a {type(self.examples).__name__} of columns {columns[:6]} (what a Dataset "
                "slice `dataset[a:b]` returns), not a list of rows: give one row dict per completion, e.g. "
                "`[dataset[i] for i in indices]` or `dataset.select(indices).to_list()`."
            )
        bad = next((i for i, e in enumerate(self.examples) if not isinstance(e, Mapping)), None)
        if bad is not None:
            raise ValueError(
                f"SampledRound.examples[{bad}] is a {type(self.examples[bad]).__name__}, not a row dict: give one dict "
                "per completion (the dataset row of its prompt: `prompt` or `prompt_ids` and the reward columns)."
            )
        rows = len(self.examples)
        if rows == 0:
            raise ValueError("SampledRound: a round needs at least one completion (`examples` is empty).")
        if self.group < 1 or rows % self.group:
            raise ValueError(
                f"SampledRound: {rows} completions do not form groups of group={self.group}; give `group` "
                "consecutive completions per prompt."
            )
        lengths = [int(c.numel()) for c in self.completion_ids]
        if len(lengths) != rows:
            raise ValueError(f"SampledRound: {len(lengths)} completion_ids for {rows} examples; give one per example.")
        for name in ("old_per_token_logps", "sampler_per_token_logps", "completion_mask"):
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != rows or any(v.numel() != n for v, n in zip(values, lengths)):
                raise ValueError(
                    f"SampledRound.{name} must hold one (C_i,) tensor per completion, of its completion's length."
                )
        for name in ("prompt_ids", "scores", "per_func"):
            values = getattr(self, name)
            if values is not None and len(values) != rows:
                raise ValueError(f"SampledRound.{name} has {len(values)} entries for {rows} completions.")
        if self.per_func is not None and self.scores is None:
            raise ValueError("SampledRound.per_func needs `scores` (the weighted reward) too.")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 0:
            raise ValueError(
                f"SampledRound.version={self.version!r} must be an int >= 0: the optimizer step whose weights sampled "
                "the round (`step` for a round sampled with the current weights)."
            )
        if not (math.isfinite(self.importance_weight) and self.importance_weight > 0):
            raise ValueError(
                f"SampledRound.importance_weight={self.importance_weight!r} must be a finite weight > 0 (1: none)."
            )
        empty = [i for i, n in enumerate(lengths) if n == 0]
        if empty:
            raise ValueError(
                f"SampledRound.completion_ids[{empty[0]}] is empty ({len(empty)} empty in all): a completion needs at "
                "least one token (end it with the EOS token to train a stop)."
            )
        if self.scores is not None:
            scores = torch.as_tensor(self.scores, dtype=torch.float32)
            if scores.dim() != 1 or bool(torch.isinf(scores).any()):
                raise ValueError(
                    f"SampledRound.scores must be (B,) finite rewards (NaN = no reward), got shape "
                    f"{tuple(scores.shape)} with {int(torch.isinf(scores).sum())} infinite: a reward of +-inf would "
                    "make every advantage of its group infinite."
                )
        if self.completion_mask is not None:
            for i, mask in enumerate(self.completion_mask):
                if not bool(((mask == 0) | (mask == 1)).all()):
                    raise ValueError(
                        f"SampledRound.completion_mask[{i}] holds {sorted(set(mask.tolist()) - {0.0, 1.0})[:4]}: a "
                        "completion mask is 1 on tokens the policy sampled and 0 on tokens the environment wrote, "
                        "nothing else (pass TRL's `env_mask` as it is)."
                    )
            for name in ("old_per_token_logps", "sampler_per_token_logps"):  # ignored at the environment's tokens
                if getattr(self, name) is not None:
                    setattr(
                        self,
                        name,
                        [torch.where(m.bool(), lp, 0.0) for lp, m in zip(getattr(self, name), self.completion_mask)],
                    )
        if self.old_per_token_logps is not None:
            for i, logps in enumerate(self.old_per_token_logps):
                if not bool(torch.isfinite(logps).all()) or bool((logps > 1e-4).any()):
                    raise ValueError(
                        f"SampledRound.old_per_token_logps[{i}] must be finite log-probabilities <= 0 (nats), got "
                        f"{logps.tolist()[:8]}...: pass the sampler's log-probs of the sampled tokens, or None to "
                        "have the trainer compute them."
                    )
        if self.sampler_per_token_logps is not None:
            for i, logps in enumerate(self.sampler_per_token_logps):
                known = logps[~torch.isnan(logps)]
                if not bool(torch.isfinite(known).all()) or bool((known > 1e-4).any()):
                    raise ValueError(
                        f"SampledRound.sampler_per_token_logps[{i}] must be log-probabilities <= 0 (nats), NaN where "
                        f"the engine gave none, got {logps.tolist()[:8]}...: pass the sampler's log-probs of the "
                        "sampled tokens."
                    )


def check_round(sampled: SampledRound, step: int, vocab_size: int, context: int | None, source: str) -> None:
    """Refuse a round the trainer cannot train on, before anything is computed from it, naming the source.

    Args:
        sampled ([`SampledRound`]): the round.
        step (`int`): the current optimizer step (no round can come from a later policy).
        vocab_size (`int`): the policy's embedding rows (ids must be in [0, vocab_size)).
        context (`int`, *optional*): the policy's positions (prompt + completion must fit).
        source (`str`): how the error names the source.

    Raises:
        ValueError: for a `version` after `step`, `temperatures` that are not one or one per completion, positive and
            finite, a token id outside the vocabulary, or a prompt + completion longer than the context.
    """
    if sampled.version > step:
        raise ValueError(
            f"{source} returned a round of version {sampled.version} at step {step}: a round is sampled by the weights "
            "of a step already taken (version <= step); stamp it with the step whose weights sampled it."
        )
    if sampled.temperatures is not None:
        rows = len(sampled.examples)
        try:
            temperatures = torch.as_tensor(sampled.temperatures, dtype=torch.float32).flatten()
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(
                f"{source}: SampledRound.temperatures={sampled.temperatures!r} is not numbers ({error}): give the "
                "sampling temperature as one float, or one per completion, or None for the configured temperature."
            ) from None
        if temperatures.numel() not in (1, rows):
            raise ValueError(
                f"{source}: SampledRound.temperatures has {temperatures.numel()} values for {rows} completions: give "
                "one temperature for the whole round, or one per completion (B,), or None for the configured "
                "temperature."
            )
        bad = temperatures[~(torch.isfinite(temperatures) & (temperatures > 0))]
        if bad.numel():
            raise ValueError(
                f"{source}: SampledRound.temperatures holds {bad.unique().tolist()[:4]}: a sampling temperature is "
                "finite and > 0 (the one your sampler divided the logits by; 1.0 for plain sampling), or None for "
                "the configured temperature."
            )
    prompts = sampled.prompt_ids
    if prompts is None:
        prompts = [torch.as_tensor(e["prompt_ids"]) if "prompt_ids" in e else None for e in sampled.examples]
    for i, completion in enumerate(sampled.completion_ids):
        for what, ids in (("completion_ids", completion), ("prompt_ids", prompts[i])):
            if ids is not None and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                raise ValueError(
                    f"{source}: {what}[{i}] holds token id {int(ids.min()) if int(ids.min()) < 0 else int(ids.max())}, "
                    f"outside the policy's vocabulary [0, {vocab_size}): tokenize with the policy's tokenizer."
                )
        length = completion.numel() + (prompts[i].numel() if prompts[i] is not None else 0)
        if context is not None and length > context:  # a prompt given as text is not counted here
            raise ValueError(
                f"{source}: {'prompt + ' if prompts[i] is not None else ''}completion {i} is {length} tokens, more "
                f"than the policy's context of {context} positions: shorten the prompt or cut the completion."
            )


class RolloutSource:
    """Base class of rollout sources: what the RL objective asks for rounds (the module docstring has the contract).

    A source subclasses it and overrides `sample`; the other hooks are optional, and their defaults are neutral (no
    prefetch, no forced round, no state of its own, nothing to stop). The RL objective's supply
    ([`~trl_trapo.rl_supply.RLSupply`]) calls every hook directly. An object that does not subclass it but has a
    `sample` method (a source written before the base class) still works: the trainer wraps it in a
    [`RolloutSourceAdapter`] ([`as_rollout_source`]), which forwards the hooks it defines.
    """

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        """The next round. Called whenever the replay buffer has fewer servable trajectories than a step needs (up to
        20 times per step), on every rank at the same time.

        Args:
            rows_needed (`int`): RL rows the current optimizer step still needs on this rank (a hint: a round of any
                size is accepted, and `sample` is called again while the replay buffer has too few).
            step (`int`): the current optimizer step, i.e. the version of the policy being trained.

        Returns:
            [`SampledRound`]: the round, stamped with the version of the policy that sampled it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement `sample(rows_needed, step)`.")

    def prefetch(self, rows_needed: int, step: int, use_counts: list[int]) -> None:
        """Ask for rounds ahead (a source that samples in the background). Called whenever a step takes RL rows,
        before the replay buffer is checked; not a collective. Default: nothing.

        Args:
            rows_needed (`int`): the step's RL rows on this rank.
            step (`int`): the current optimizer step.
            use_counts (`list[int]`): `(max_uses,)` the replay buffer's servable trajectories by the number of times
                they were served ([`~trl_trapo.memory.ReplayBuffer.use_counts`]).
        """
        return None

    def round_due(self, step: int) -> bool:
        """Whether a round must be taken at `step` although the replay buffer still has rows (e.g. a round asked for
        ahead that would otherwise get too old). Called before each round decision; the ranks agree (any rank's True
        takes a round on every rank). Default: False."""
        return False

    def checkpoint_state(self) -> tuple[dict, dict[str, torch.Tensor]] | None:
        """The source's own state for this rank's checkpoint: JSON metadata and flat tensors (stored under the
        `rollout_source` key of `trapo/rank{r}.json` and `rollout_source/<name>` tensors), or None when it has none.
        Called at every checkpoint save. Default: None."""
        return None

    def restore_checkpoint_state(self, meta: dict | None, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what `checkpoint_state` returned, when resuming (before the first step).

        Args:
            meta (`dict`, *optional*): the metadata, or None when the checkpoint holds none (written by a run whose
                source had no state, e.g. another kind of source).
            tensors (`dict[str, torch.Tensor]`): the tensors, their `rollout_source/` prefix removed.

        Raises:
            ValueError: a source with state should raise it for `meta=None` (resume with the same kind of source);
                the trainer reports it as a `CheckpointError` naming the file. Default: accepts anything, restores
                nothing.
        """
        return None

    def close(self, timeout: float | None = None) -> None:
        """Stop what the source runs (a process, a thread pool) when `train()` returns or raises; the source must work
        again afterwards (a later `train()` or `collect_rollouts`). Default: nothing.

        Args:
            timeout (`float`, *optional*): seconds to give what is stopped before it is killed; None: the source's
                own default. A second Ctrl-C passes a short one.
        """
        return None


class RolloutSourceAdapter(RolloutSource):
    """A rollout source that does not subclass [`RolloutSource`] (an object with a `sample` method, as the contract
    allowed before the base class), as one: `sample` and each optional hook the object defines are forwarded to it;
    the hooks it lacks keep the base's neutral defaults.

    Args:
        source: the object; it is used as it is, never changed (`source` is it).

    Raises:
        TypeError: if `source` has no `sample` method.
    """

    def __init__(self, source: Any):
        if not callable(getattr(source, "sample", None)):
            raise TypeError(
                f"rollout_source={type(source).__name__} has no `sample(rows_needed, step)` method; pass an object "
                "that returns a trl_trapo.sources.SampledRound from it (see docs/writing_a_rollout_source.md)."
            )
        self.source = source

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        return self.source.sample(rows_needed, step)

    def prefetch(self, rows_needed: int, step: int, use_counts: list[int]) -> None:
        hook = getattr(self.source, "prefetch", None)
        if hook is not None:
            hook(rows_needed, step, use_counts)

    def round_due(self, step: int) -> bool:
        hook = getattr(self.source, "round_due", None)
        return hook(step) if hook is not None else False  # checked by the caller (`check_round_due`)

    def checkpoint_state(self) -> tuple[dict, dict[str, torch.Tensor]] | None:
        hook = getattr(self.source, "checkpoint_state", None)
        return hook() if hook is not None else None

    def restore_checkpoint_state(self, meta: dict | None, tensors: dict[str, torch.Tensor]) -> None:
        """Forwarded when the object defines it; a checkpoint without its state is then refused (ValueError)."""
        hook = getattr(self.source, "restore_checkpoint_state", None)
        if hook is None:
            return
        if meta is None:
            raise ValueError(
                f"the checkpoint was written without {type(self.source).__name__}'s state (a run with another rollout "
                "source); resume with the same one."
            )
        hook(meta, tensors)

    def close(self, timeout: float | None = None) -> None:
        """Forwarded when the object defines `close`; `timeout` only to a `close` that takes one."""
        hook = getattr(self.source, "close", None)
        if hook is None:
            return
        if timeout is not None and "timeout" in inspect.signature(hook).parameters:
            hook(timeout=timeout)
        else:
            hook()


def as_rollout_source(source: Any) -> RolloutSource:
    """`source` as a [`RolloutSource`]: itself when it subclasses the base class, else wrapped in a
    [`RolloutSourceAdapter`].

    Raises:
        TypeError: if it has no `sample` method, or subclasses [`RolloutSource`] without overriding `sample`.
    """
    if not isinstance(source, RolloutSource):
        return RolloutSourceAdapter(source)
    if type(source).sample is RolloutSource.sample:
        raise TypeError(
            f"{type(source).__name__} subclasses trl_trapo.sources.RolloutSource but does not implement "
            "`sample(rows_needed, step) -> SampledRound`."
        )
    return source


def check_round_due(value: Any, name: str) -> bool:
    """What a source's `round_due(step)` returned, as a bool: `True` / `False` (NumPy's too).

    Raises:
        TypeError: naming the source (`name`), the value and the fix, for anything else (a truthy `"yes"` was taken as
            True without a word).
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(
        f"{name}.round_due(step) returned {value!r:.60} ({type(value).__name__}); it must return True (take a round "
        "now, although the replay buffer still has rows) or False."
    )


def source_name(source: RolloutSource) -> str:
    """How errors name a source: its class name (the wrapped object's for a [`RolloutSourceAdapter`])."""
    return type(source.source if isinstance(source, RolloutSourceAdapter) else source).__name__


def check_rollout_source(source: Any, args, rollout_func: Callable | None = None) -> None:
    """Refuse a user's rollout source or `rollout_func`, at construction, where it cannot work with the configuration.

    Args:
        source: what was passed as `rollout_source` (None when only `rollout_func` was).
        args ([`~trl_trapo.TRAPOConfig`]): the configuration.
        rollout_func (`Callable`, *optional*): what was passed as `rollout_func`.

    Raises:
        TypeError: if `source` has no `sample(rows_needed, step)` method (or subclasses [`RolloutSource`] without
            implementing it), or `rollout_func` is not callable or is an `async def` function (TRL calls it
            synchronously: a coroutine would come back instead of the dict).
        ValueError: naming the setting, for both a `rollout_source` and a `rollout_func`, and for `use_vllm=True` or
            `fewshot_mode=True` (with a `rollout_source`) or `exploration=True`: they set how the default source
            samples (vLLM, few-shot prompt choice and annealed temperature, per-family temperatures), which a source
            of your own (or your `rollout_func`) decides itself. A `rollout_func` runs in few-shot mode: it is
            handed the prompts few-shot mode chooses, its trajectories are reused as few-shot mode says, and it
            samples at the temperature it chooses (its rows are trained at `temperature`, as always); and with
            `use_vllm=True`: it may sample through the trainer's vLLM (`trainer.vllm_generation`, as in TRL).
    """
    if source is not None and rollout_func is not None:
        raise ValueError(
            "Both rollout_source and rollout_func were given; they are two ways to say where RL rounds come from "
            "(rollout_func is wrapped in a trl_trapo.sources.RolloutFuncSource): pass one of them."
        )
    given = "rollout_func" if rollout_func is not None else "rollout_source"
    if rollout_func is not None and not callable(rollout_func):
        raise TypeError(
            f"rollout_func={rollout_func!r} is not callable: pass a function `rollout_func(prompts, trainer) -> dict` "
            "(TRL's contract, see docs/writing_a_rollout_source.md)."
        )
    if rollout_func is not None and (
        inspect.iscoroutinefunction(rollout_func) or inspect.iscoroutinefunction(type(rollout_func).__call__)
    ):
        name = getattr(rollout_func, "__name__", type(rollout_func).__name__)
        raise TypeError(
            f"rollout_func={name} is an async function, but it is called as a plain one, as TRL's GRPOTrainer calls it "
            "(its result is used at once; TRL 1.16 has no await there either): define it with `def`, and run your "
            "async code inside it with `asyncio.run(...)`."
        )
    if rollout_func is not None:
        check_rollout_func_signature(rollout_func)
    if source is not None:
        check_source_object(source)
        as_rollout_source(source)  # no `sample`, or a subclass that does not implement it: refused now
    # few-shot mode runs with a rollout_func, which is handed the prompts few-shot mode chooses (from the memory pool),
    # and so does vLLM: the function may sample through `trainer.vllm_generation` (weights pushed before each call, as
    # TRL's GRPOTrainer does); a rollout_source chooses its own prompts and has no trainer to reach vLLM from
    settings = (
        ("use_vllm", args.use_vllm and rollout_func is None),
        ("fewshot_mode", args.fewshot_mode and rollout_func is None),
    )
    for name, value in settings:
        if value:
            raise ValueError(
                f"{type(args).__name__}.{name}=True configures the default rollout source, but a {given} was "
                f"given (it samples by itself): set {name}=False, or drop {given}."
            )
    if args.exploration is True:
        raise ValueError(
            f"{type(args).__name__}.exploration=True sets the default rollout source's per-family temperatures, but a "
            f"{given} was given (it chooses its own temperatures; its rows are trained at `temperature`): set "
            "exploration=None or False."
        )


def check_source_object(source: Any) -> None:
    """Refuse a `rollout_source` that cannot be called as the contract calls it, at construction: a class instead of
    an instance, or a `sample` method that cannot be called as `sample(rows_needed, step)`.

    Raises:
        TypeError: naming the source's class, the bad value and the fix.
    """
    if isinstance(source, type):
        raise TypeError(
            f"rollout_source={source.__name__} is a class: pass an instance, e.g. `rollout_source="
            f"{source.__name__}(...)` (docs/writing_a_rollout_source.md)."
        )
    sample = getattr(source, "sample", None)
    if not callable(sample):
        return  # refused by `as_rollout_source`, with its own message
    try:
        signature = inspect.signature(sample)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    try:
        signature.bind(0, 0)
    except TypeError as error:
        raise TypeError(
            f"{type(source).__name__}.sample{signature} cannot be called as `sample(rows_needed, step)` ({error}): "
            "the trainer passes both, positionally; define it as `def sample(self, rows_needed, step)` "
            "(docs/writing_a_rollout_source.md)."
        ) from None


def check_checkpoint_state(state: Any, source: str) -> tuple[dict, dict[str, torch.Tensor]] | None:
    """Refuse what a source's `checkpoint_state()` returned when a checkpoint cannot hold it, before anything is written.

    Args:
        state: what it returned: None, or `(meta, tensors)`.
        source (`str`): how the error names the source (its class).

    Returns:
        `state`, unchanged.

    Raises:
        TypeError: naming the source, the hook and the key at fault, if `state` is not None or a pair of a
            JSON-serialisable dict (it goes into `trapo/rank{r}.json`) and a dict of tensors.
    """
    hook = f"{source}.checkpoint_state()"
    if state is None:
        return None
    if not isinstance(state, tuple | list) or len(state) != 2:
        raise TypeError(
            f"{hook} returned {type(state).__name__}; return None (no state) or a pair `(meta, tensors)`: a JSON "
            "dict and a dict of tensors (docs/writing_a_rollout_source.md)."
        )
    meta, tensors = state
    if not isinstance(meta, dict):
        raise TypeError(f"{hook} meta is a {type(meta).__name__}; it must be a JSON-serialisable dict.")
    for key, value in meta.items():
        try:
            json.dumps({key: value})
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"{hook} meta[{key!r}] is not JSON ({error}): the meta goes into the checkpoint's rank{{r}}.json. Put "
                "tensors in the second element (`tensors`), or store plain numbers and lists (`.tolist()`, "
                "`.item()`)."
            ) from None
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        kinds = sorted({type(v).__name__ for v in tensors.values()}) if isinstance(tensors, dict) else None
        raise TypeError(
            f"{hook} tensors must be a dict of torch.Tensor, got "
            f"{type(tensors).__name__ if kinds is None else f'values of type {kinds}'}: put what is not a tensor "
            "in the meta (JSON)."
        )
    return state


def check_rollout_func_signature(rollout_func: Callable) -> None:
    """Refuse a `rollout_func` that cannot be called as TRL calls it, `rollout_func(prompts, trainer)`, at construction
    (TRL 1.16's GRPOTrainer finds out at the first round, with Python's own TypeError).

    Raises:
        TypeError: naming the function, its signature and the fix.
    """
    try:
        signature = inspect.signature(rollout_func)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    try:
        signature.bind([], None)
    except TypeError as error:
        name = getattr(rollout_func, "__name__", type(rollout_func).__name__)
        raise TypeError(
            f"rollout_func={name}{signature} cannot be called as `rollout_func(prompts, trainer)` ({error}), as TRL's "
            "GRPOTrainer calls it: define it as `def rollout_func(prompts, trainer)` (docs/writing_a_rollout_source.md)."
        ) from None


def warn_split_rounds(batch_size: int, accumulation: int, group: int, num_mini_batches: int) -> str | None:
    """Warn once, at construction, when the default source's rounds do not fit whole optimizer steps.

    A round of [`SyncRolloutSource`] is `ceil(rows * num_mini_batches / group)` prompts x `group` completions for a
    step of `rows` RL rows; its advantages are computed over whole groups, then the replay buffer serves each step's
    rows. When `rows * num_mini_batches` is not a multiple of `group`, the round holds more than its steps take: the
    rest are trained at later steps, sampled by an older policy (the policy-ratio clip weighs them), and a step mixes
    rounds, which TRL's `GRPOConfig` refuses ("generation_batch_size must be divisible by num_generations"). Called
    for a run whose one objective is RL (its rows per step are then fixed: with other objectives a step's RL rows
    follow the objectives' shares).

    Args:
        batch_size (`int`): `per_device_train_batch_size`.
        accumulation (`int`): `gradient_accumulation_steps` (a step's rows on this rank: `batch_size * accumulation`).
        group (`int`): completions per prompt, `num_generations` (1 with a critic: nothing to warn about).
        num_mini_batches (`int`): optimizer steps a round feeds.

    Returns:
        The warning's text, or None when the rounds fit.
    """
    wanted = batch_size * accumulation * num_mini_batches
    if group <= 1 or wanted % group == 0:
        return None
    prompts = math.ceil(wanted / group)
    made = prompts * group
    rows = f"per_device_train_batch_size={batch_size}" + (
        f" x gradient_accumulation_steps={accumulation}" if accumulation > 1 else ""
    )
    steps = "an optimizer step takes" if num_mini_batches == 1 else f"num_mini_batches={num_mini_batches} steps take"
    fits = next(
        b for b in range(batch_size + 1, batch_size + group + 1) if b * accumulation * num_mini_batches % group == 0
    )
    divisor = math.gcd(wanted, group)
    message = (
        f"A generation round is {made} completions ({prompts} prompt{'s' if prompts > 1 else ''} x "
        f"num_generations={group}), but {steps} {wanted} RL rows ({rows}"
        + (f" x num_mini_batches={num_mini_batches}" if num_mini_batches > 1 else "")
        + f"): the other {made - wanted} of each round are trained at later steps, sampled by an older policy "
        "(advantages are computed over whole groups first; the policy-ratio clip weighs the older samples). TRL's GRPO refuses this (generation_batch_size must be divisible by num_generations). For whole "
        f"rounds per step, make the RL rows per step a multiple of num_generations: e.g. "
        f"per_device_train_batch_size={fits}" + (f", or num_generations={divisor}" if divisor > 1 else "") + "."
    )
    logger.warning(message)
    return message


def note_rounds_follow_shares(group: int, num_mini_batches: int) -> str | None:
    """Say once (info), at construction of a run with RL and other objectives, how generation rounds map to steps:
    a step's RL rows follow the objectives' shares, so a round (that step's RL rows x `num_mini_batches`, rounded up
    to whole groups) seldom ends at a step whatever the batch size ([`warn_split_rounds`] covers RL-only runs).

    Returns:
        The text logged, or None (`group` 1: rounds are exactly the rows asked for).
    """
    if group <= 1:
        return None
    message = (
        f"Generation rounds: each is an optimizer step's RL rows x num_mini_batches={num_mini_batches}, rounded up to "
        f"whole groups of num_generations={group}. A step's RL rows follow the objectives' shares (curriculum/* in the "
        "logs), so rounds seldom end at a step: the completions over are trained at later steps, sampled by an older "
        "policy (advantages are computed over whole groups first; the policy-ratio clip weighs them)."
    )
    logger.info(message)
    return message


class SyncRolloutSource(RolloutSource):
    """The default source: each round is sampled when the trainer asks, by the live policy, in the trainer's process.

    A round holds `ceil(rows_needed * num_mini_batches / group)` prompts (PPO's rollout batch: `num_mini_batches`
    steps' worth), each repeated `group` times in a row; the prompts come from the memory pool (the RL prompt sampler,
    or few-shot mode's choice and annealed temperature), targeted exploration sets each row's temperature from its task
    family, and the whole round is one batched `sample` call of the engine (behaviour log-probs recorded while
    sampling, or recomputed for vLLM). Its version is `step`.

    Args:
        engine ([`~trl_trapo.rollout.RolloutEngine`]): samples a round (`engine.sample`).
        dataset (`Dataset`): the tokenized RL prompts (`prompt_ids`, and the reward columns).
        prompts ([`~trl_trapo.memory.MemoryPool`]): chooses each round's prompts (`select_prompts(n, step)`) and its
            temperature (`rollout_temperature(default)`).
        group (`int`): completions per prompt (1 with a critic, else `num_generations`).
        num_mini_batches (`int`): optimizer steps a round feeds.
        temperature (`float`): the configured sampling temperature.
        exploration ([`~trl_trapo.exploration.TargetedExploration`], *optional*): per-row temperatures by task family.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        dataset: Dataset,
        prompts: MemoryPool,
        group: int,
        num_mini_batches: int,
        temperature: float,
        exploration: TargetedExploration | None = None,
    ):
        self.engine = engine
        self.dataset = dataset
        self.prompts = prompts
        self.group = int(group)
        self.num_mini_batches = int(num_mini_batches)
        self.temperature = float(temperature)
        self.exploration = exploration

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        """Sample a round of `ceil(rows_needed * num_mini_batches / group)` prompts x `group` (see the class).

        Returns:
            [`SampledRound`]: completions cut after their stop token, behaviour log-probs (None with vLLM), each row's
            temperature, prompt ids, version `step`.

        Raises:
            RuntimeError: naming the fix, when the policy's probabilities are not finite (training diverged).
        """
        num_prompts = max(math.ceil(rows_needed * self.num_mini_batches / self.group), 1)
        # step 1. prompts (few-shot mode prefers under-served tasks and anneals the round's temperature)
        indices = self.prompts.select_prompts(num_prompts, step)
        temperature = self.prompts.rollout_temperature(self.temperature)
        examples = [example for example in (self.dataset[i] for i in indices) for _ in range(self.group)]
        # targeted exploration samples each family at its own temperature, all in the same batched call (a family's
        # boost is a factor on the round's temperature when few-shot mode has annealed it)
        if self.exploration is not None:
            temperature = self.exploration.row_temperatures(examples, temperature)
        # step 2. generate (behaviour log-probs recorded while sampling)
        return self.engine.sample(examples, self.group, step, temperature)


ROLLOUT_FUNC_KEYS = ("prompt_ids", "completion_ids", "logprobs")  # what TRL's `rollout_func` must return
ENV_MASK = "env_mask"  # its optional key: 1 on tokens the policy sampled, 0 on tokens the environment wrote


class RolloutFuncSource(RolloutSource):
    """TRL's `rollout_func` as a rollout source: `TRAPOTrainer(..., rollout_func=f)` wraps `f` in this adapter.

    The contract is TRL 1.16 `GRPOTrainer`'s as its code runs it: `rollout_func(prompts, trainer) -> dict`. Each
    round, the adapter draws `ceil(rows_needed * num_mini_batches / num_generations)` prompts from the memory pool's
    RL prompt sampler (the default source's order, checkpointed), and calls `rollout_func` once with this process's
    `B` = prompts x `num_generations` **entries: each prompt `num_generations` times in a row**, as TRL's
    `RepeatSampler` hands them out (TRL's docstring says the prompts come "with no duplication", but its code passes
    the repeated per-process slice; scripts are written against the code). Each entry is the example's `prompt` as
    the dataset holds it, a copy of its own (a list of messages for a conversational dataset, a string for a standard
    one; chat templating is the function's business, as in TRL). Unlike TRL, whose per-process slice may split a
    prompt's group across processes, every process here gets whole groups. The function returns **one completion per
    entry**, in the entries' order, in a dict with

    - `prompt_ids`: `B` lists of ints, the prompt each completion was generated from (as trained);
    - `completion_ids`: `B` lists of ints, the completions as trained (never cut by the trainer);
    - `logprobs`: `B` lists of floats, the sampler's log-probs (nats) of the completion tokens at `temperature`, over
      the support the configured `top_k` / `top_p` keep (vLLM's `processed_logprobs`), or None; values at
      environment tokens are ignored. TRL's meaning: they are the round's `sampler_per_token_logps`, not PPO's
      behaviour log-probs. The trainer computes those itself with the current policy when it finishes the round (so
      PPO's first ratio is exactly 1 whatever engine sampled), and with `vllm_importance_sampling_correction` (the
      default) weights each token's policy loss by pi_trainer / pi_sampler, bounded per
      `vllm_importance_sampling_mode` (`sampling/*` metrics). TRL applies that correction only with
      `use_vllm=True`; a `rollout_func` may sample with an engine of its own, so here it
      applies whenever `logprobs` are given. `vllm_importance_sampling_correction=False` or `logprobs=None`: no
      correction (the log-probs are then unused, as in TRL without vLLM);
    - `env_mask` (optional): `B` lists of 0/1, 1 on tokens the policy sampled, 0 on tokens the environment wrote
      (tool results): those count in no loss, KL, entropy, ratio statistic or length metric, and GAE steps over them;
    - any other key: a reward column, handed to the reward functions as a keyword argument (a list gives each
      completion its entry, any other value is given to every completion).

    The round is a [`SampledRound`] of version `step` (the function samples with the current weights), `group` =
    `num_generations`, trained at the configured `temperature`. Nothing else distinguishes it from any other source's
    round.

    Image prompts (a vision-language run, an `images` / `image` column): the function gets what TRL 1.16's code gives
    it, each conversational prompt in TRL's multimodal format with its row's images in its image parts
    (`prepare_multimodal_messages(prompt, images)`: `{"type": "image", "image": <PIL.Image>}`, every content a list of
    parts; unchanged when no row of the round has an image, as in TRL), so it renders them with the processor
    (`trainer.processing_class.apply_chat_template(prompts, tokenize=True, return_dict=True, ...)`, which expands each
    image's placeholder and returns `pixel_values`) and samples with them. The trainer trains each completion with its
    row's model inputs (the processor's outputs for the row's prompt and images, as TRL processes the dataset images
    for its forward), so the `prompt_ids` it returns must hold the image tokens of the row's images, as many as the
    processor's rendering does; a prompt whose image tokens do not match is refused (a forward would fail with "Image
    features and image tokens do not match").

    Args:
        rollout_func (`Callable[[list], dict]`): the function with its trainer bound, `prompts -> dict` (the trainer
            passes `lambda prompts: rollout_func(prompts, trainer)`: no source holds the trainer).
        dataset (`Dataset`): the RL prompts (`prompt`, and the reward columns).
        prompts ([`~trl_trapo.memory.MemoryPool`]): chooses each round's prompts (`select_prompts(n, step)`).
        num_generations (`int`): completions per prompt.
        num_mini_batches (`int`): optimizer steps a round feeds.
        image_token_ids (`Sequence[int]`): a VLM's image placeholder ids (`vision.placeholder_token_ids`): each
            returned prompt must hold as many of them as its row's prepared `prompt_ids`; empty: not checked.
        sync_weights (`Callable[[int], None]`, *optional*): called with the round's step before `rollout_func`
            (with `use_vllm=True`: push the policy's weights to vLLM once per optimizer step, as TRL's `GRPOTrainer`
            does before it calls a `rollout_func`, so a function that samples through `trainer.vllm_generation`
            samples the current policy).

    Raises:
        ValueError: from `sample`, with TRL's message when a required key is missing (`rollout_func must return keys
            [...] in its output dict.`), and naming the key, the row and the fix when the output is not a dict, a
            key does not have one entry per prompt entry received (`num_generations` per entry, the reading of TRL's
            docstring, is named as such), a completion's `logprobs` or `env_mask` does not have one value per
            completion token, or its `logprobs` are not finite and <= 0 at the policy's tokens, or (image prompts)
            a returned prompt's image tokens do not match its row's images. At construction: image prompts that are
            not conversational (TRL's "Multimodal training requires conversational prompts").
    """

    def __init__(
        self,
        rollout_func: Callable[[list], dict],
        dataset: Dataset,
        prompts: MemoryPool,
        num_generations: int,
        num_mini_batches: int,
        image_token_ids: Sequence[int] = (),
        sync_weights: Callable[[int], None] | None = None,
    ):
        from trl.data_utils import is_conversational

        from .vision import image_column, rows_have_images

        if not callable(rollout_func):
            raise TypeError(
                f"rollout_func={rollout_func!r} is not callable: pass a function `prompts -> dict` (TRL's "
                "`rollout_func(prompts, trainer)` with its trainer bound)."
            )
        self.rollout_func = rollout_func
        self.dataset = dataset
        self.prompts = prompts
        self.group = int(num_generations)
        self.num_mini_batches = int(num_mini_batches)
        self.sync_weights = sync_weights
        self.image_token_ids = sorted({int(t) for t in image_token_ids})
        self.image_column = image_column(dataset.column_names, "train_dataset")
        if self.image_column is not None and rows_have_images(dataset) and not is_conversational(dataset[0]):
            raise ValueError(
                "rollout_func with image prompts: TRL passes a rollout_func each prompt's images inside its messages "
                "(Multimodal training requires conversational prompts), but train_dataset's prompts are text: give "
                'conversational prompts (`[{"role": "user", "content": [{"type": "image"}, {"type": "text", ...}]}]`) '
                "and let the function render them with the processor."
            )

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        """Call `rollout_func` on the round's prompts and check its output (see the class).

        Returns:
            [`SampledRound`]: `num_generations` completions per prompt, version `step`.
        """
        num_prompts = max(math.ceil(rows_needed * self.num_mini_batches / self.group), 1)
        indices = self.prompts.select_prompts(num_prompts, step)
        # TRL's RepeatSampler: each prompt `num_generations` times in a row, one completion back per entry
        rows = [self.dataset[i] for i in indices for _ in range(self.group)]
        # a copy each, as TRL passes them: what the function does to its prompts never reaches the reward functions'
        prompts = [copy.deepcopy(row["prompt"]) for row in rows]
        images = self.row_images(rows)
        if images is not None:  # TRL's `_generate_and_score_completions`: the images go inside the messages
            from trl.data_utils import prepare_multimodal_messages

            prompts = [prepare_multimodal_messages(p, images=i) for p, i in zip(prompts, images)]
        if self.sync_weights is not None:  # vLLM samples the current policy (TRL syncs before a rollout_func)
            self.sync_weights(step)
        output = self.rollout_func(prompts)
        sampled = rollout_func_round(output, rows, self.group, step)
        self.check_image_tokens(sampled)
        return sampled

    def row_images(self, rows: list[dict[str, Any]]) -> list[list | None] | None:
        """Each row's images as TRL 1.16 reads them for its prompts (`images`: the list; `image`: one, or None), or
        None when the dataset has no image column or no row of the round has an image (TRL then leaves the prompts
        as they are)."""
        if self.image_column is None:
            return None
        if self.image_column == "images":
            images = [row.get("images") for row in rows]
        else:
            images = [[row["image"]] if row.get("image") is not None else None for row in rows]
        return None if all(not i for i in images) else images

    def check_image_tokens(self, sampled: SampledRound) -> None:
        """Refuse a returned prompt whose image placeholder tokens are not as many as its row's prepared prompt's
        (the row's model inputs, which its forwards get, are the processor's for the row's images).

        Raises:
            ValueError: naming the entry, both counts and the fix.
        """
        if not self.image_token_ids:
            return
        placeholders = torch.tensor(self.image_token_ids)
        for i, (example, ids) in enumerate(zip(sampled.examples, sampled.prompt_ids)):
            expected = int(torch.isin(torch.as_tensor(example["prompt_ids"]), placeholders).sum())
            got = int(torch.isin(ids, placeholders).sum())
            if got != expected:
                raise ValueError(
                    f"rollout_func's 'prompt_ids'[{i}] holds {got} image placeholder tokens (ids {self.image_token_ids}), "
                    f"but its row's images take {expected} (the processor's rendering of the row's prompt): the "
                    "trainer trains each completion with its row's images, so the model would find image features "
                    "and image tokens that do not match. Render each prompt with its images through the processor "
                    "(`trainer.processing_class.apply_chat_template(prompts, tokenize=True, return_dict=True, "
                    "add_generation_prompt=True)`) and return those ids."
                )


def bind_rollout_func(func: Callable, trainer: Any) -> Callable[[list], dict]:
    """TRL's `rollout_func(prompts, trainer)` with its `trainer` bound: `prompts -> dict` (what
    [`~trl_trapo.sources.RolloutFuncSource`] calls); its `func` attribute is the user's function, unbound (what a
    producer gets, to bind its own [`~trl_trapo.executor.ProducerTrainer`])."""

    def bound(prompts: list) -> dict:
        return func(prompts, trainer)

    bound.func = func
    return bound


def rollout_func_round(output: Any, rows: list[dict[str, Any]], group: int, step: int) -> SampledRound:
    """The [`SampledRound`] of one `rollout_func` call (see [`RolloutFuncSource`]).

    Args:
        output (`dict`): what `rollout_func` returned.
        rows (`list[dict]`): `B` dataset rows, one per prompt entry it was given, in order: each prompt's row `group`
            times in a row.
        group (`int`): completions per prompt (`num_generations`): the round's group.
        step (`int`): the round's version.

    Raises:
        ValueError: see [`RolloutFuncSource`].
    """
    if not isinstance(output, Mapping):
        raise ValueError(
            f"rollout_func returned {type(output).__name__}; it must return a dict with keys {list(ROLLOUT_FUNC_KEYS)} "
            "(and optionally 'env_mask' and reward columns)."
        )
    missing = sorted(set(ROLLOUT_FUNC_KEYS) - set(output))
    if missing:
        raise ValueError(f"rollout_func must return keys {missing} in its output dict.")  # TRL's message
    rows_out = len(rows)  # one completion per prompt entry it was given
    fix = (
        f"return one completion per prompt entry it was given, in their order (the {rows_out} entries are "
        f"{rows_out // group} prompts, each repeated num_generations={group} times in a row, as TRL 1.16 passes them)"
    )
    per_entry = (
        f"it returned num_generations={group} completions for each of the {rows_out} prompt entries it was given. "
        "Two readings of TRL 1.16's `rollout_func`: its code (what TRL runs, and TRAPO follows) passes each prompt "
        "repeated num_generations times and takes one completion per entry; its docstring says the prompts come "
        "without duplication and the function returns num_generations completions per prompt. Return one "
        "completion per entry received (drop the loop over num_generations)"
    )

    def per_completion(key: str) -> list:
        values = output[key]
        is_list = isinstance(values, Sequence) and not isinstance(values, (str, bytes))
        if not is_list:  # a tensor or an array: the count may be right, the type is not
            shape = getattr(values, "shape", None)
            shown = type(values).__name__ + (f" of shape {tuple(shape)}" if shape is not None else "")
            convert = (
                " Convert it with `.tolist()` (and cut each row at its real length: a padded row's pad ids would be "
                "trained as tokens)."
                if hasattr(values, "tolist")
                else ""
            )
            raise ValueError(
                f"rollout_func's '{key}' is a {shown}; it must be a list with one entry per completion "
                f"({rows_out}), each a list (TRL's contract: list[list[int]] for ids).{convert}"
            )
        if len(values) != rows_out:
            why = per_entry if group > 1 and len(values) == rows_out * group else fix
            raise ValueError(f"rollout_func's '{key}' has {len(values)} entries, expected {rows_out}: {why}.")
        return list(values)

    def token_ids(key: str) -> list[torch.Tensor]:
        out = []
        for i, ids in enumerate(per_completion(key)):
            if isinstance(ids, (str, bytes)) or not all(
                isinstance(t, int) or (isinstance(t, torch.Tensor) and t.dim() == 0) for t in ids
            ):
                raise ValueError(
                    f"rollout_func's '{key}'[{i}] is {str(ids)[:60]!r}, not a list of token ids: tokenize it with the "
                    "trainer's tokenizer (`trainer.processing_class`) and return the ids."
                )
            out.append(torch.as_tensor([int(t) for t in ids], dtype=torch.long))
        return out

    completion_ids = token_ids("completion_ids")
    prompt_ids = token_ids("prompt_ids")

    def per_token(key: str, dtype: torch.dtype) -> list[torch.Tensor]:
        values = []
        for i, (value, completion) in enumerate(zip(per_completion(key), completion_ids)):
            value = [math.nan if v is None else v for v in value]  # vLLM's None log-prob: refused below as non-finite
            if len(value) != completion.numel():
                raise ValueError(
                    f"rollout_func's '{key}'[{i}] has {len(value)} values for the {completion.numel()} tokens of "
                    f"completion_ids[{i}]: give one value per completion token (0 for the environment's tokens in "
                    "'logprobs')."
                )
            values.append(torch.tensor(value, dtype=dtype))
        return values

    logprobs = None if output["logprobs"] is None else per_token("logprobs", torch.float32)
    env_mask = per_token(ENV_MASK, torch.float32) if output.get(ENV_MASK) is not None else None
    if env_mask is not None:
        empty = [i for i, m in enumerate(env_mask) if not bool((m == 1).any())]
        if empty:
            raise ValueError(
                f"rollout_func's '{ENV_MASK}'[{empty[0]}] has no 1 ({len(empty)} such completions): no token of it was "
                "sampled by the policy, so it trains nothing. Mark the policy's tokens with 1 (the environment's 0)."
            )
    if logprobs is not None:  # the sampler's log-probs, checked at the policy's tokens (the environment's are ignored)
        for i, logps in enumerate(logprobs):
            policy = logps if env_mask is None else logps[env_mask[i] != 0]
            if not bool(torch.isfinite(policy).all()) or bool((policy > 1e-4).any()):
                raise ValueError(
                    f"rollout_func's 'logprobs'[{i}] must be finite log-probabilities <= 0 (nats) at the policy's "
                    f"tokens, got {logps.tolist()[:8]}...: return the sampler's log-prob of each sampled token (any "
                    "value at the environment's tokens, env_mask 0), or logprobs=None."
                )
    extra = [key for key in output if key not in ROLLOUT_FUNC_KEYS and key != ENV_MASK]
    check_reward_columns(  # TRL's `rollout_func` returning `completions`: "got multiple values for keyword argument"
        extra,
        "rollout_func's output key",
        "return it under another name, e.g. 'my_{column}' (other keys reach the reward functions as keyword "
        "arguments: docs/writing_a_rollout_source.md)",
    )
    columns = {}
    for key in extra:
        value = output[key]
        is_list = isinstance(value, list)
        columns[key] = per_completion(key) if is_list else [value] * rows_out
    examples = [{**row, **{key: values[i] for key, values in columns.items()}} for i, row in enumerate(rows)]
    return SampledRound(
        examples,
        completion_ids,
        version=step,
        group=group,
        prompt_ids=prompt_ids,
        completion_mask=env_mask,
        sampler_per_token_logps=logprobs,  # TRL's meaning: the sampler's, not PPO's behaviour log-probs
    )


__all__ = [
    "RolloutFuncSource",
    "RolloutSource",
    "RolloutSourceAdapter",
    "SampledRound",
    "SyncRolloutSource",
    "as_rollout_source",
    "bind_rollout_func",
    "check_checkpoint_state",
    "check_round_due",
    "check_rollout_source",
    "rollout_func_round",
    "source_name",
]
