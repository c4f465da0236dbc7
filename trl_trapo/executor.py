# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The executor: where a rollout source runs — in the trainer's process, or in the asynchronous producer.

A run's rollout source is described once by a [`SourceSpec`]: which source class (the default
[`~trl_trapo.sources.SyncRolloutSource`], the tool-calling [`~trl_trapo.agents.ToolRolloutSource`] of `tools` /
`environment_factory`, or TRL's `rollout_func` adapter [`~trl_trapo.sources.RolloutFuncSource`]) and its settings,
all picklable. `spec.build(context)` builds that class on what a process has ([`SourceContext`]):

- **in the trainer** (`async_rollouts=False`): the live engine, the RL dataset, the memory pool's prompt choice,
  targeted exploration, the trainer's reward scorer and metrics. This is the synchronous path.
- **in the producer** (`async_rollouts=True`, [`~trl_trapo.async_rollouts.producer_main`]): an engine on the
  producer's copy of the policy, and a [`RequestedPrompts`] in place of the dataset, the prompt choice and
  exploration: it serves, for each round, the prompts and per-row temperatures the trainer chose when it asked for the
  round (so prompt choice stays in the trainer, checkpointed as before). The producer then calls the source's public
  `sample` as the trainer would, and scores the round with the reward functions when the source did not.

The producer therefore samples with the same source object type as the synchronous path, with no sampling or turn
loop of its own: adding a turn driver or a sampler touches neither the producer nor the trainer.

What differs in the producer, by construction: the policy is a copy updated at weight syncs (the round's `version`
says which); it is one process of its own, so a tool-calling source runs its turns without cross-rank lockstep
(`sum_over_ranks=None`: the `tools/*` metrics cover this rank's rounds); a `rollout_func` gets a [`ProducerTrainer`]
as its `trainer` (the producer's policy copy, tokenizer, settings and sampling settings: no optimizer, no vLLM).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from .sources import RolloutFuncSource, RolloutSource, SyncRolloutSource, bind_rollout_func


if TYPE_CHECKING:
    from .agents import AgentSpec


@dataclasses.dataclass
class SourceContext:
    """What a process builds a rollout source on (see the module docstring).

    Attributes:
        engine ([`~trl_trapo.rollout.RolloutEngine`]): samples (`engine.sample`).
        dataset: the RL rows by index (a `Dataset`, or a [`RequestedPrompts`]).
        prompts: chooses a round's prompts (`select_prompts(n, step)`, `rollout_temperature(default)`).
        exploration: per-row temperatures (`row_temperatures(examples, base)`), or None.
        scorer ([`~trl_trapo.rewards.RewardScorer`]): the reward functions.
        tokenizer: the policy's tokenizer.
        log_metric (`Callable[[str, float], None]`): where a source logs (`tools/*`).
        sum_over_ranks (`Callable`, *optional*): a collective sum over the trainer's ranks (None in the producer).
        trainer_view: what a `rollout_func` gets as `trainer` (in the producer, a [`ProducerTrainer`]).
        stopping (`Callable[[], str | None]`, *optional*): why the run is stopping, or None (the tool-calling source
            abandons the tool calls still running once it gives a reason: the trainer's SIGINT / SIGTERM catcher, or
            in the producer the trainer's word that it stops); None: never.
    """

    engine: Any
    dataset: Any
    prompts: Any
    exploration: Any
    scorer: Any
    tokenizer: Any
    log_metric: Callable[[str, float], None]
    sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None
    trainer_view: Any = None
    stopping: Callable[[], str | None] | None = None


@dataclasses.dataclass
class SourceSpec:
    """A rollout source as picklable settings: built by [`build`] in the trainer or in the producer.

    Attributes:
        kind (`str`): "default" ([`~trl_trapo.sources.SyncRolloutSource`]), "tools"
            ([`~trl_trapo.agents.ToolRolloutSource`]) or "rollout_func" ([`~trl_trapo.sources.RolloutFuncSource`]).
        group (`int`): completions per prompt. num_mini_batches (`int`): optimizer steps a round feeds.
        temperature (`float`): the configured sampling temperature.
        agent ([`~trl_trapo.agents.AgentSpec`], *optional*): the tools and environments ("tools").
        tool_settings (`dict`): the tool source's other keyword arguments (`response_length`, `context`,
            `max_iterations`, `template_kwargs`, `generation_batch_size`, `stop_token_ids`).
        rollout_func (`Callable`, *optional*): TRL's `rollout_func(prompts, trainer)`, unbound ("rollout_func").
        first_row (`dict`, *optional*): the RL dataset's row 0 (the tool source checks the prompts' format with it,
            the `rollout_func` source reads the columns, when they are built in the producer, where only a round's
            rows are at hand).
        image_token_ids (`list[int]`): a VLM's image placeholder ids ("rollout_func": returned prompts must hold
            its images').
    """

    kind: Literal["default", "tools", "rollout_func"]
    group: int
    num_mini_batches: int
    temperature: float
    agent: AgentSpec | None = None
    tool_settings: dict = dataclasses.field(default_factory=dict)
    rollout_func: Callable | None = None
    first_row: dict | None = None
    image_token_ids: list[int] = dataclasses.field(default_factory=list)

    def build(self, context: SourceContext) -> RolloutSource:
        """The source of this kind on `context`."""
        if self.kind == "tools":
            from .agents import ToolRolloutSource

            return ToolRolloutSource(
                context.engine,
                context.dataset,
                context.prompts,
                self.agent,
                context.tokenizer,
                context.scorer,
                group=self.group,
                num_mini_batches=self.num_mini_batches,
                temperature=self.temperature,
                log_metric=context.log_metric,
                sum_over_ranks=context.sum_over_ranks,
                exploration=context.exploration,
                stopping=context.stopping,
                **self.tool_settings,
            )
        if self.kind == "rollout_func":
            return RolloutFuncSource(
                bind_rollout_func(self.rollout_func, context.trainer_view),
                context.dataset,
                context.prompts,
                num_generations=self.group,
                num_mini_batches=self.num_mini_batches,
                image_token_ids=self.image_token_ids,
            )
        return SyncRolloutSource(
            context.engine,
            context.dataset,
            context.prompts,
            group=self.group,
            num_mini_batches=self.num_mini_batches,
            temperature=self.temperature,
            exploration=context.exploration,
        )

    def picklable_parts(self) -> list[tuple[str, list]]:
        """What must be pickled to reach a producer, as `(what, objects)` for
        [`~trl_trapo.async_rollouts.check_picklable`]: the tools, the environment factories, the `rollout_func`."""
        parts = []
        if self.agent is not None:
            parts.append(("tool", list(self.agent.tools)))
            parts.append(("environment factory", list(self.agent.factories.values())))
        if self.rollout_func is not None:
            parts.append(("rollout_func", [self.rollout_func]))
        return parts


class RequestedPrompts:
    """In the producer, the dataset, prompt choice and exploration of a source: it serves the prompts and per-row
    temperatures the trainer chose when it asked for the round.

    Args:
        first_row (`dict`, *optional*): the RL dataset's row 0, served as row 0 until a round sets its rows.
    """

    def __init__(self, first_row: dict | None = None):
        self.rows: dict[int, dict] = {} if first_row is None else {0: first_row}
        self.first_columns = [] if first_row is None else list(first_row)
        self.indices: list[int] = []
        self.temperatures: list[float] = []

    def serve(self, indices: Sequence[int], rows: Sequence[dict], temperatures: Sequence[float]) -> None:
        """The next round's prompts: dataset `indices`, their `rows` (one per index), and per-row temperatures (one
        per completion: each prompt's rows `group` times in a row)."""
        self.indices = [int(i) for i in indices]
        self.rows = dict(zip(self.indices, rows))
        self.temperatures = [float(t) for t in temperatures]

    # the memory pool's interface
    def select_prompts(self, n: int, step: int) -> list[int]:
        """The round's prompts (`n`: the source computes the trainer's number again).

        Raises:
            RuntimeError: if `n` is not the number the trainer chose (the source and the request disagree).
        """
        if n != len(self.indices):
            raise RuntimeError(
                f"the producer's rollout source asked for {n} prompts, the trainer chose {len(self.indices)}: both "
                "compute ceil(rows_needed * num_mini_batches / group); this is a bug, please report it."
            )
        return list(self.indices)

    def rollout_temperature(self, default: float) -> float:
        return float(default)

    # the dataset's interface
    @property
    def column_names(self) -> list[str]:
        """The RL dataset's columns (those of its row 0, which every row has)."""
        return list(self.first_columns)

    def __getitem__(self, index: int) -> dict:
        return dict(self.rows[int(index)])

    def __len__(self) -> int:
        return len(self.rows)

    # targeted exploration's interface: the temperatures chosen when the round was asked for
    def row_temperatures(self, examples: list[dict], base: float | None = None) -> list[float]:
        if len(examples) != len(self.temperatures):
            raise RuntimeError(
                f"the producer's round has {len(examples)} rows, the trainer chose {len(self.temperatures)} "
                "temperatures; this is a bug, please report it."
            )
        return list(self.temperatures)


class ProducerAccelerator:
    """The producer's accelerator as the engine reads it: one process (the producer's rank for seeds and names) on
    `device`, local weights (no DeepSpeed, no FSDP), no progress bars, `unwrap_model` the identity."""

    num_processes = 1
    is_main_process = False

    def __init__(self, device: str, process_index: int):
        self.device = torch.device(device)
        self.process_index = int(process_index)
        self.state = types.SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None)

    def unwrap_model(self, model: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
        return model


@dataclasses.dataclass
class ProducerTrainer:
    """What a `rollout_func` gets as `trainer` in the producer: the names TRL's `rollout_func` examples read.

    Attributes:
        model (`nn.Module`): the producer's copy of the policy (eval mode, the weights of the last sync); also
            `model_wrapped`.
        processing_class: the tokenizer. args ([`~trl_trapo.TRAPOConfig`]): the settings (read only).
        accelerator ([`ProducerAccelerator`]): `unwrap_model`, `device`.
        generation_config (`GenerationConfig`), padding_id (`int`): the trainer's sampling settings.
        state: `global_step`, the step that asked for the round.
        use_vllm (`bool`), vllm_generation: False and None, as on a TRL trainer without vLLM.
    """

    model: Any
    processing_class: Any
    args: Any
    accelerator: ProducerAccelerator
    generation_config: Any
    padding_id: int
    state: Any = dataclasses.field(default_factory=lambda: types.SimpleNamespace(global_step=0))
    use_vllm: bool = False  # TRL's names: no vLLM in the producer (async with vLLM samples the default source only)
    vllm_generation: Any = None

    @property
    def model_wrapped(self) -> Any:
        """The model as `Trainer.model_wrapped` names it (nothing wraps it here)."""
        return self.model


def producer_engine(args, model, tokenizer, scorer, generation_config, stop_token_ids, pad_token_id, accelerator):
    """The producer's [`~trl_trapo.rollout.RolloutEngine`]: samples with `model` (its own copy of the policy); only
    its `sample` is used (the trainer finishes every round)."""
    from .rollout import RolloutEngine

    return RolloutEngine(
        args,
        tokenizer,
        scorer,
        reference=None,
        has_critic=False,
        kl_penalty="loss",
        kl_estimator="k1",
        kl_coef=lambda: 0.0,
        unwrapped_model=lambda: contextlib.nullcontext(model),
        accelerator=accelerator,
        generation_config=generation_config,
        stop_token_ids=stop_token_ids,
        pad_token_id=pad_token_id,
    )


__all__ = [
    "ProducerAccelerator",
    "ProducerTrainer",
    "RequestedPrompts",
    "SourceContext",
    "SourceSpec",
    "producer_engine",
]
