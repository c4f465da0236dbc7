# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Rollouts: generation with behaviour log-probs, scoring by reward models and reward functions, no-grad forwards.

Shapes: `B` completions, `P` prompt tokens (left-padded for generation), `C` completion tokens, `V` vocabulary.
All masks are built from lengths (where the stop token first appears), never by comparing ids with the pad id, so
tokenizers whose pad token equals their EOS token are handled correctly.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from trl.trainer.utils import is_async_callable

from .collator import left_pad


logger = logging.getLogger(__name__)


class BehaviourLogprobRecorder(LogitsProcessor):
    """Records log pi_old(y_t) of each sampled token during `generate`, at no extra forward pass.

    `generate` calls a logits processor with the logits of step t before sampling; the token sampled at step t shows
    up in `input_ids` at step t + 1. The recorder keeps one step of log-softmax(logits / temperature) (shape `(B, V)`)
    and gathers it at the next call; `finish` handles the last token. The recorded distribution is the untruncated,
    temperature-scaled one — the same quantity the training forward computes — so the first PPO ratio is 1 up to
    floating-point error (top-k / top-p only decide which token is sampled).

    Args:
        temperature (`float`): sampling temperature.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs of every generated token, shape `(B, C)` (C = generated length)."""
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, sequences[:, -1:]).squeeze(-1))
        self.previous = None
        steps, self.steps = self.steps, []
        return torch.stack(steps, dim=1)


def truncate_at_stop(
    completion_ids: torch.Tensor, stop_token_id: int | None, valid_length: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion mask up to and including the first stop token.

    Args:
        completion_ids (`torch.Tensor`): shape `(B, C)`.
        stop_token_id (`int`, *optional*): the stop token; None means completions never stop early.
        valid_length (`torch.Tensor`, *optional*): shape `(B,)`, tokens actually generated per row (C if None).

    Returns:
        tuple `(completion_mask, is_truncated)`: `(B, C)` long mask (1 up to and including the first stop token, or
        on all valid tokens when there is none), and `(B,)` bool, True where no stop token was produced.
    """
    batch, length = completion_ids.shape
    positions = torch.arange(length, device=completion_ids.device).expand(batch, length)
    limit = torch.full((batch,), length, device=completion_ids.device) if valid_length is None else valid_length
    if stop_token_id is None:
        is_stop = torch.zeros_like(completion_ids, dtype=torch.bool)
    else:
        is_stop = (completion_ids == stop_token_id) & (positions < limit.unsqueeze(1))
    has_stop = is_stop.any(dim=1)
    first_stop = torch.where(has_stop, is_stop.float().argmax(dim=1), limit - 1)
    mask = (positions <= first_stop.unsqueeze(1)).long()
    return mask, ~has_stop


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    generation_config: GenerationConfig,
    pad_token_id: int,
    stop_token_id: int | None,
    temperature: float,
    batch_size: int | None = None,
    record_logps: bool = True,
    synced_gpus: bool | None = None,
) -> dict[str, Any]:
    """Sample one completion per prompt (repeat prompts for several generations) and record behaviour log-probs.

    Args:
        model (`nn.Module`): the policy, unwrapped for generation.
        prompt_ids (`Sequence[Sequence[int]]`): token ids of each prompt (unpadded).
        generation_config (`GenerationConfig`): sampling settings (`max_new_tokens` = response length).
        pad_token_id (`int`): id used for left padding.
        stop_token_id (`int`, *optional*): completions are cut after its first occurrence.
        temperature (`float`): the sampling temperature (for the recorded log-probs).
        batch_size (`int`, *optional*): prompts per `generate` call (all at once when None).
        record_logps (`bool`): record behaviour log-probs (False for greedy evaluation).
        synced_gpus (`bool`, *optional*): passed to `generate` when not None. False when the weights are local (e.g.
            ZeRO-3 weights gathered), so ranks need not generate in lockstep; None lets transformers decide.

    Returns:
        `dict` with `completion_ids` (list of `(C_i,)` tensors, cut after the stop token), `old_per_token_logps`
        (list of `(C_i,)`), `is_truncated` (`(B,)` bool), `num_tokens` (int, generated tokens counted).
    """
    device = next(model.parameters()).device
    batch_size = batch_size or len(prompt_ids)
    completions, logps, truncated = [], [], []
    for start in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        input_ids, attention_mask = left_pad(chunk, pad_token_id)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        recorder = BehaviourLogprobRecorder(temperature) if record_logps else None
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=generation_config,
            logits_processor=LogitsProcessorList([recorder] if recorder is not None else []),
            **({} if synced_gpus is None else {"synced_gpus": synced_gpus}),
        )
        completion_ids = sequences[:, input_ids.shape[1] :]
        chunk_logps = recorder.finish(sequences) if recorder is not None else torch.zeros(completion_ids.shape)
        mask, is_truncated = truncate_at_stop(completion_ids, stop_token_id)
        lengths = mask.sum(1).tolist()
        for i, n in enumerate(lengths):
            completions.append(completion_ids[i, :n].cpu())
            logps.append(chunk_logps[i, :n].float().cpu())
        truncated.append(is_truncated.cpu())
    return {
        "completion_ids": completions,
        "old_per_token_logps": logps,
        "is_truncated": torch.cat(truncated),
        "num_tokens": sum(c.numel() for c in completions),
    }


def reward_function_name(func: Callable | nn.Module) -> str:
    """A readable name of a reward function or reward model (for metrics and errors)."""
    if isinstance(func, nn.Module):
        config = getattr(func, "config", None)
        return str(getattr(config, "_name_or_path", "") or type(func).__name__).split("/")[-1] or "reward_model"
    return getattr(func, "__name__", None) or type(func).__name__


def call_reward_function(func: Callable, name: str, expected: int, kwargs: dict, loop=None) -> list[float]:
    """Call a TRL-contract reward function and check its output; None entries become NaN ("no reward").

    Raises:
        RuntimeError: naming the function, if it raises.
        ValueError: naming the function, if it returns the wrong number of rewards or a non-number.
    """
    try:
        if is_async_callable(func):
            coroutine = func(**kwargs)
            if loop is None:
                output = asyncio.run(coroutine)
            else:
                output = asyncio.run_coroutine_threadsafe(coroutine, loop).result()
        else:
            output = func(**kwargs)
    except Exception as error:  # re-raised with the function's name and the fix
        raise RuntimeError(
            f"Reward function '{name}' raised {type(error).__name__}: {error}. Reward functions are called as "
            "func(prompts=..., completions=..., completion_ids=..., **dataset_columns, trainer_state=..., "
            "log_metric=..., log_extra=...) and must return one float (or None) per completion."
        ) from error
    try:
        values = [math.nan if r is None else float(r) for r in output]
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Reward function '{name}' must return a list of floats (or None for 'no reward'), got {output!r:.200}."
        ) from error
    if any(math.isinf(v) for v in values):
        raise ValueError(f"Reward function '{name}' returned an infinite reward; return finite numbers (or None).")
    if len(values) != expected:
        raise ValueError(
            f"Reward function '{name}' returned {len(values)} rewards for {expected} completions; it must return "
            "exactly one reward per completion."
        )
    return values
