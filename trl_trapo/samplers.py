# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Samplers: one interface over the engines that sample completions — transformers' `generate`, a vLLM server, a
colocated vLLM engine.

A [`Sampler`] takes a batch of rows, each with its own prompt token ids (a prompt, or a conversation so far: the
tool-calling loop continues each turn from token ids), its own sampling temperature and its own model inputs (a VLM
prompt's processed `pixel_values` for transformers, its PIL images for vLLM, which takes them as `multi_modal_data`),
and one `max_new_tokens` for the call; it returns each row's completion cut after its first stop token, with the
log-probs it knows of them ([`SamplerOutput`]). The rollout engine ([`~trl_trapo.rollout.RolloutEngine.sample`]) and
every turn driver on top of it (the default source, the tool loop, exploration's search) sample through it; adding an
engine is one subclass, and touches neither the turn drivers nor the trainer.

- [`GenerateSampler`]: transformers' `generate`, every row at its own temperature in one batched call (see
  [`RowTemperatureLogitsWarper`]), behaviour log-probs recorded while sampling, seeded from the
  engine's checkpointed generator.
- [`VLLMServerSampler`], [`VLLMColocateSampler`]: TRL's `VLLMGeneration` (through
  [`~trl_trapo.rollout.VLLMGenerator`], which pushes the weights once per optimizer step). vLLM takes one temperature
  and one `max_tokens` per request, so the rows are sent in one call per distinct temperature (consecutive groups of
  one prompt at one temperature keep vLLM's `n=group`); the behaviour log-probs are recomputed by the training policy
  ([`~trl_trapo.rollout.RolloutEngine.finish`]), vLLM's own go to the sampler/trainer mismatch correction. A server
  gathers every rank's prompts in one request, so there all ranks make the same calls with as many rows each (padded
  with throwaway copies, dropped on return); a colocated engine samples each rank's rows alone.

Shapes: `B` rows, `C_i` completion tokens of row i.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from .collator import left_pad
from .distributed import generation_synced_gpus
from .models import batch_model_inputs, model_input_kwargs


if TYPE_CHECKING:
    from .rollout import VLLMGenerator

logger = logging.getLogger(__name__)


class RowTemperatureLogitsWarper(LogitsProcessor):
    """Divides each row's next-token logits by that row's own sampling temperature.

    transformers' `TemperatureLogitsWarper` takes one temperature for the whole batch; a generation round whose rows
    are sampled at different temperatures (targeted exploration heats some task families) would need one `generate`
    call per temperature. This warper runs where the single temperature would (custom processors run before
    transformers' top-k / top-p warpers), so one batched call samples every row at its own temperature.

    Args:
        temperatures (`torch.Tensor`): `(B,)` positive temperatures, one per row of the `generate` batch.
    """

    def __init__(self, temperatures: torch.Tensor):
        self.temperatures = temperatures.float().unsqueeze(1)  # (B, 1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores / self.temperatures.to(scores.device)


class BehaviourLogprobRecorder(LogitsProcessor):
    """Records log pi_old(y_t) of each sampled token during `generate`, at no extra forward pass.

    `generate` calls a logits processor with the logits of step t before sampling; the token sampled at step t shows
    up in `input_ids` at step t + 1. The recorder keeps one step of log-softmax(scores) (shape `(B, V)`, fp32) and
    gathers it at the next call; `finish` handles the last token. It runs after [`RowTemperatureLogitsWarper`] and
    before transformers' top-k / top-p warpers, so what it records is the untruncated, temperature-scaled
    distribution — the same quantity the training forward computes — and the first PPO ratio is 1 up to
    floating-point error (top-k / top-p only decide which token is sampled).
    """

    def __init__(self):
        self.previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs of every generated token, shape `(B, C)` (C = generated length)."""
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, sequences[:, -1:]).squeeze(-1))
        self.previous = None
        steps, self.steps = self.steps, []
        return torch.stack(steps, dim=1)


def row_temperatures(temperature: float | Sequence[float] | torch.Tensor, rows: int) -> torch.Tensor:
    """`(rows,)` float32 sampling temperatures from one temperature or one per row.

    Raises:
        ValueError: if a per-row sequence does not have `rows` entries, or a temperature is not positive and finite.
    """
    temperatures = torch.as_tensor(temperature, dtype=torch.float32).flatten()
    if temperatures.numel() == 1:
        temperatures = temperatures.expand(rows)
    if temperatures.numel() != rows:
        raise ValueError(f"{temperatures.numel()} sampling temperatures for {rows} rows; give one, or one per row.")
    if not bool(torch.isfinite(temperatures).all() and (temperatures > 0).all()):
        raise ValueError(f"Sampling temperatures must be positive and finite, got {temperatures.unique().tolist()}.")
    return temperatures.contiguous()


def truncate_at_stop(
    completion_ids: torch.Tensor, stop_token_ids: Sequence[int] | None, valid_length: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion mask up to and including the first stop token.

    Args:
        completion_ids (`torch.Tensor`): shape `(B, C)`.
        stop_token_ids (`Sequence[int]`, *optional*): the ids that end a completion (any of them); None or empty
            means completions never stop early.
        valid_length (`torch.Tensor`, *optional*): shape `(B,)`, tokens actually generated per row (C if None).

    Returns:
        tuple `(completion_mask, is_truncated)`: `(B, C)` long mask (1 up to and including the first stop token, or
        on all valid tokens when there is none), and `(B,)` bool, True where no stop token was produced.
    """
    batch, length = completion_ids.shape
    positions = torch.arange(length, device=completion_ids.device).expand(batch, length)
    limit = torch.full((batch,), length, device=completion_ids.device) if valid_length is None else valid_length
    if not stop_token_ids:
        is_stop = torch.zeros_like(completion_ids, dtype=torch.bool)
    else:
        stops = torch.tensor(list(stop_token_ids), device=completion_ids.device)
        is_stop = torch.isin(completion_ids, stops) & (positions < limit.unsqueeze(1))
    has_stop = is_stop.any(dim=1)
    first_stop = torch.where(has_stop, is_stop.float().argmax(dim=1), limit - 1)
    mask = (positions <= first_stop.unsqueeze(1)).long()
    return mask, ~has_stop


def cut_after_stop(completion: torch.Tensor, stop_token_ids: Sequence[int] | None) -> torch.Tensor:
    """A `(C,)` completion up to and including its first stop token (unchanged when it has none)."""
    if stop_token_ids:
        hits = torch.isin(completion, torch.tensor(list(stop_token_ids))).nonzero()
        if hits.numel():
            return completion[: int(hits[0]) + 1]
    return completion


@contextmanager
def neutral_generation_defaults(model: nn.Module) -> Iterator[None]:
    """Generate with no defaults from the model's own `generation_config.json`.

    transformers fills every field a `GenerationConfig` leaves at None from the model's `generation_config` (a
    `repetition_penalty`, a `no_repeat_ngram_size`, its `eos_token_id` ...). Such a field would change the sampled
    distribution, or stop generation, without TRAPO knowing: the recorded behaviour log-probs, the completion mask and
    the PPO ratio would no longer describe what was sampled. For the duration, the generating model's
    `generation_config` is a fresh `GenerationConfig()`, so only what TRAPO sets applies; it is put back afterwards.
    """
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = getattr(target, "generation_config", None)
    target.generation_config = GenerationConfig()
    try:
        yield
    finally:
        target.generation_config = saved


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    generation_config: GenerationConfig,
    pad_token_id: int,
    stop_token_ids: Sequence[int] | None,
    temperature: float | Sequence[float] | torch.Tensor,
    batch_size: int | None = None,
    record_logps: bool = True,
    synced_gpus: bool | None = None,
    progress: str | None = None,
    model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> dict[str, Any]:
    """Sample one completion per prompt (repeat prompts for several generations) and record behaviour log-probs.

    Every row is sampled at its own temperature in the same batched `generate` call (see
    [`RowTemperatureLogitsWarper`]); `generation_config.temperature` must be 1 (or None): the temperature is applied
    here, before transformers' top-k / top-p warpers, exactly where its own temperature warper would be.

    Args:
        model (`nn.Module`): the policy, unwrapped for generation.
        prompt_ids (`Sequence[Sequence[int]]`): token ids of each prompt (unpadded).
        generation_config (`GenerationConfig`): sampling settings (`max_new_tokens` = response length).
        pad_token_id (`int`): id used for left padding.
        stop_token_ids (`Sequence[int]`, *optional*): completions are cut after the first of them (the same ids
            `generation_config.eos_token_id` stops generation at); None: they run to `max_new_tokens`.
        temperature (`float`, or `(B,)` floats): the sampling temperature, one for every row or one per row.
        batch_size (`int`, *optional*): prompts per `generate` call (all at once when None).
        record_logps (`bool`): record behaviour log-probs (False for greedy evaluation).
        synced_gpus (`bool`, *optional*): passed to `generate` when not None. False when the weights are local (e.g.
            ZeRO-3 weights gathered), so ranks need not generate in lockstep; None lets transformers decide.
        progress (`str`, *optional*): show a progress bar (tqdm, in prompts) with this description.
        model_inputs (`Sequence[Mapping[str, torch.Tensor]]`, *optional*): each prompt's extra model inputs (e.g.
            `pixel_values`), combined per `generate` call as in training (see
            [`~trl_trapo.collator.combine_model_inputs`]) and passed to it.

    Returns:
        `dict` with `completion_ids` (list of `(C_i,)` tensors, cut after the stop token), `old_per_token_logps`
        (list of `(C_i,)`), `is_truncated` (`(B,)` bool), `num_tokens` (int, generated tokens counted), `seconds`
        (float, wall time).

    Raises:
        ValueError: if `generation_config` carries its own temperature (it would be applied a second time), or the
            temperatures are not one or one per prompt, positive and finite.
    """
    if generation_config.do_sample and generation_config.temperature not in (None, 1.0):
        raise ValueError(
            f"generate() applies the sampling temperature per row; pass it as `temperature`, and leave "
            f"generation_config.temperature at 1.0 (it is {generation_config.temperature})."
        )
    start_time = time.perf_counter()
    temperatures = row_temperatures(temperature, len(prompt_ids))
    scaled = bool((temperatures != 1.0).any())
    device = next(model.parameters()).device
    batch_size = batch_size or len(prompt_ids)
    completions, logps, truncated = [], [], []
    bar = tqdm(total=len(prompt_ids), desc=progress, unit="prompt", leave=False, disable=progress is None)
    for start in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        input_ids, attention_mask = left_pad(chunk, pad_token_id)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        processors = LogitsProcessorList()
        if scaled:
            processors.append(RowTemperatureLogitsWarper(temperatures[start : start + len(chunk)]))
        recorder = BehaviourLogprobRecorder() if record_logps else None
        if recorder is not None:
            processors.append(recorder)
        kwargs = {} if synced_gpus is None else {"synced_gpus": synced_gpus}
        extra = model_input_kwargs(
            batch_model_inputs(model_inputs, start, len(chunk)),
            device,
            ["generation_config", "logits_processor", *kwargs],
        )
        with neutral_generation_defaults(model):
            sequences = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=generation_config,
                logits_processor=processors,
                **kwargs,
                **extra,
            )
        completion_ids = sequences[:, input_ids.shape[1] :]
        chunk_logps = recorder.finish(sequences) if recorder is not None else torch.zeros(completion_ids.shape)
        mask, is_truncated = truncate_at_stop(completion_ids, stop_token_ids)
        lengths = mask.sum(1).tolist()
        for i, n in enumerate(lengths):
            completions.append(completion_ids[i, :n].cpu())
            logps.append(chunk_logps[i, :n].float().cpu())
        truncated.append(is_truncated.cpu())
        bar.update(len(chunk))
    bar.close()
    return {
        "completion_ids": completions,
        "old_per_token_logps": logps,
        "is_truncated": torch.cat(truncated),
        "num_tokens": sum(c.numel() for c in completions),
        "seconds": time.perf_counter() - start_time,
    }


@dataclass
class SamplerOutput:
    """What a sampler returns for `B` rows, in row order."""

    completion_ids: list[torch.Tensor]  # (C_i,) long each: cut after the first stop token
    logps: list[torch.Tensor] | None  # (C_i,) float32 each: behaviour log-probs recorded while sampling (nats, at the
    # row's temperature, over the full vocabulary); None: the sampler has none (the trainer computes them)
    sampler_logps: list[torch.Tensor] | None = None  # (C_i,) float32 each: the sampling engine's own log-probs of
    # the sampled tokens (vLLM's `processed_logprobs`; NaN where it gave none); None: no separate engine, or none given
    seconds: float = 0.0  # wall time of the call
    num_tokens: int = 0  # tokens generated (kept after the cut)


class Sampler:
    """Samples one completion per row (the module docstring). Subclasses implement [`sample`]."""

    def sample(
        self,
        prompt_ids: Sequence[Sequence[int]],
        temperatures: torch.Tensor,
        group: int,
        step: int,
        max_new_tokens: int | None = None,
        model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
        images: Sequence[list | None] | None = None,
        lockstep: bool = False,
    ) -> SamplerOutput:
        """Sample one completion per row.

        Args:
            prompt_ids (`Sequence[Sequence[int]]`): each row's token ids to continue (unpadded), `B` of them, in
                consecutive groups of `group` copies of one prompt.
            temperatures (`torch.Tensor`): `(B,)` float32, each row's sampling temperature (positive).
            group (`int`): consecutive rows that share a prompt (1: every row its own).
            step (`int`): the optimizer step (weights are pushed to a separate engine once per step).
            max_new_tokens (`int`, *optional*): new tokens at most for every row (None: `response_length`).
            model_inputs (`Sequence[Mapping[str, torch.Tensor]]`, *optional*): each row's processed extra model inputs
                (e.g. `pixel_values`), for a sampler that runs the training model.
            images (`Sequence[list | None]`, *optional*): each row's PIL images, for a sampler that
                processes images itself (vLLM); see [`~trl_trapo.vision.row_images`].
            lockstep (`bool`): every rank makes this call together (see
                [`~trl_trapo.distributed.generation_synced_gpus`]).

        Returns:
            [`SamplerOutput`].
        """
        raise NotImplementedError


class GenerateSampler(Sampler):
    """transformers' `generate` with the live policy ([`generate`]): every row at its own
    temperature in one batched call per `batch_size` rows, behaviour log-probs recorded while sampling, each call
    seeded from `generator` (the engine's, checkpointed: a resumed run samples what an uninterrupted one would).

    Args:
        unwrapped_model (`Callable[[], AbstractContextManager[nn.Module]]`): enters a context holding the trained
            model unwrapped for generation.
        policy_of (`Callable[[nn.Module], nn.Module]`): the policy inside that model (it may hold a critic too).
        accelerator: the Trainer's `Accelerator`.
        generation_config (`GenerationConfig`): sampling settings (`max_new_tokens` = `response_length`).
        stop_token_ids (`list[int]`): completions are cut after the first of them.
        pad_token_id (`int`): the id written in padding positions.
        generator (`torch.Generator`): draws each call's sampling seed.
        batch_size (`int`, *optional*): rows per `generate` call.
        ds3_gather_for_generation (`bool`): TRL's setting (see [`~trl_trapo.distributed.generation_synced_gpus`]).
        progress (`Callable[[str], str | None]`): the progress bar's description of a round (None: no bar).
    """

    def __init__(
        self,
        unwrapped_model: Callable[[], AbstractContextManager[nn.Module]],
        policy_of: Callable[[nn.Module], nn.Module],
        accelerator,
        generation_config: GenerationConfig,
        stop_token_ids: list[int],
        pad_token_id: int,
        generator: torch.Generator,
        batch_size: int | None,
        ds3_gather_for_generation: bool,
        progress: Callable[[str], str | None],
    ):
        self.unwrapped_model, self.policy_of, self.accelerator = unwrapped_model, policy_of, accelerator
        self.generation_config, self.stop_token_ids, self.pad_token_id = (
            generation_config,
            stop_token_ids,
            pad_token_id,
        )
        self.generator, self.batch_size = generator, batch_size
        self.ds3_gather_for_generation, self.progress = ds3_gather_for_generation, progress

    def sample(
        self,
        prompt_ids: Sequence[Sequence[int]],
        temperatures: torch.Tensor,
        group: int,
        step: int,
        max_new_tokens: int | None = None,
        model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
        images: Sequence[list | None] | None = None,
        lockstep: bool = False,
    ) -> SamplerOutput:
        """See [`Sampler.sample`]; `images` are not used (the rows' `model_inputs` carry them, processed)."""
        generation_config = self.generation_config
        if max_new_tokens is not None and max_new_tokens != generation_config.max_new_tokens:
            generation_config = copy.deepcopy(generation_config)
            generation_config.max_new_tokens = int(max_new_tokens)
        with self.unwrapped_model() as unwrapped:
            sampling_seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
            device = self.accelerator.device
            devices = [device.index or 0] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(sampling_seed)
                generated = generate(
                    self.policy_of(unwrapped),
                    [list(p) for p in prompt_ids],
                    generation_config,
                    self.pad_token_id,
                    self.stop_token_ids,
                    temperatures,
                    batch_size=self.batch_size,
                    synced_gpus=generation_synced_gpus(
                        self.accelerator, self.ds3_gather_for_generation, lockstep=lockstep
                    ),
                    progress=self.progress(f"Rollouts, step {step}"),
                    model_inputs=model_inputs,
                )
        return SamplerOutput(
            generated["completion_ids"],
            generated["old_per_token_logps"],
            seconds=generated["seconds"],
            num_tokens=generated["num_tokens"],
        )


class VLLMSampler(Sampler):
    """vLLM through TRL's `VLLMGeneration` (module docstring); [`VLLMServerSampler`] and [`VLLMColocateSampler`] are
    the two modes.

    Args:
        vllm ([`~trl_trapo.rollout.VLLMGenerator`]): the connection (server) or engine (colocate), and the weight push.
        accelerator: the Trainer's `Accelerator`.
        stop_token_ids (`list[int]`): completions are cut after the first of them.
        keep_sampler_logps (`bool`): return vLLM's log-probs (`vllm_importance_sampling_correction`).
    """

    collective = False  # whether every rank must make the same calls with as many rows (server mode)

    def __init__(self, vllm: VLLMGenerator, accelerator, stop_token_ids: list[int], keep_sampler_logps: bool):
        self.vllm, self.accelerator = vllm, accelerator
        self.stop_token_ids, self.keep_sampler_logps = list(stop_token_ids), bool(keep_sampler_logps)

    def plan(
        self, temperatures: torch.Tensor, group: int, max_new_tokens: int | None
    ) -> tuple[int, list[tuple[float, list[int]]], int | None]:
        """The calls to make: `(group, [(temperature, its rows)], max_new_tokens)`. Consecutive groups of `group`
        rows keep vLLM's `n=group` when each group has one temperature (else every row is its own prompt); with
        `collective`, the temperatures and `max_new_tokens` are agreed over the ranks (a collective): the union of
        the temperatures (a rank without rows at one still makes that call) and the largest `max_new_tokens` (a rank
        whose rows have less room cuts their completions itself, as the tool loop does; a rank's throwaway call of 1
        token must not cut the others'). A temperature is sent as the shortest decimal of its float32 (0.9, not
        0.8999999761...): the value the run configured."""
        values = [float(str(numpy.float32(t))) for t in temperatures.tolist()]
        rows = len(values)
        if group < 1 or rows % group or any(len(set(values[s : s + group])) > 1 for s in range(0, rows, group)):
            group = 1
        by_temperature: dict[float, list[int]] = {}
        for row, value in enumerate(values):
            by_temperature.setdefault(value, []).append(row)
        keys = sorted(by_temperature)
        if self.collective and self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            shared = gather_object([(group, keys, max_new_tokens)])
            group = min(g for g, _, _ in shared)  # a rank that cannot keep its groups: nobody does
            keys = sorted({k for _, ks, _ in shared for k in ks})
            limits = [m for _, _, m in shared if m is not None]
            max_new_tokens = max(limits) if limits else None
        return group, [(k, by_temperature.get(k, [])) for k in keys], max_new_tokens

    def sample(
        self,
        prompt_ids: Sequence[Sequence[int]],
        temperatures: torch.Tensor,
        group: int,
        step: int,
        max_new_tokens: int | None = None,
        model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
        images: Sequence[list | None] | None = None,
        lockstep: bool = False,
    ) -> SamplerOutput:
        """See [`Sampler.sample`]; `model_inputs` are not used (vLLM processes the rows' `images` itself).

        Raises:
            ValueError: if rows carry model inputs but no images (vLLM cannot take processed inputs).
        """
        if model_inputs is not None and images is None:
            raise ValueError(
                "The RL prompts carry model inputs (a `model_inputs` column) without images in an `images` / `image` "
                "column, and vLLM takes images only (it processes them itself): give the rows their images, or set "
                "use_vllm=False (rollouts then use transformers' generate, which gets the model inputs)."
            )
        start_time = time.perf_counter()
        temperatures = row_temperatures(temperatures, len(prompt_ids))
        group, calls, max_new_tokens = self.plan(temperatures, group, max_new_tokens)
        completions: list[torch.Tensor | None] = [None] * len(prompt_ids)
        logps: list[torch.Tensor | None] = [None] * len(prompt_ids)
        have_logps = True
        counts = self.agreed_counts([len(rows) // group for _, rows in calls])
        for (temperature, rows), prompts_needed in zip(calls, counts):
            padded = list(rows)
            filler = list(range(group)) if group > 1 else [0]  # throwaway rows: this rank's first prompt (group)
            while len(padded) < prompts_needed * group:
                padded += filler
            if not padded:
                continue
            batch_images = None if images is None else [images[r] for r in padded]
            ids, vllm_logps = self.vllm.generate(
                [list(prompt_ids[r]) for r in padded],
                group,
                step,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                images=batch_images,
            )
            have_logps = have_logps and vllm_logps is not None
            for k, row in enumerate(rows):
                completions[row] = cut_after_stop(torch.as_tensor(ids[k], dtype=torch.long), self.stop_token_ids)
                if vllm_logps is not None:
                    logps[row] = vllm_logps[k][: completions[row].numel()]
        kept = [c for c in completions if c is not None]
        sampler_logps = [lp for lp in logps if lp is not None] if have_logps and self.keep_sampler_logps else None
        return SamplerOutput(
            kept,
            None,
            sampler_logps=sampler_logps,
            seconds=time.perf_counter() - start_time,
            num_tokens=sum(c.numel() for c in kept),
        )

    def agreed_counts(self, counts: list[int]) -> list[int]:
        """Prompts per call: this rank's, or (with `collective`, a collective) the most any rank sends."""
        if not (self.collective and self.accelerator.num_processes > 1):
            return counts
        from accelerate.utils import gather_object

        shared = gather_object([counts])
        return [max(c[k] for c in shared) for k in range(len(counts))]


class VLLMServerSampler(VLLMSampler):
    """A vLLM server (`vllm_mode="server"`): the main process sends every rank's prompts in one request, so the ranks
    agree on the calls and pad to as many rows each."""

    collective = True


class VLLMColocateSampler(VLLMSampler):
    """A vLLM engine in each trainer process (`vllm_mode="colocate"`): each rank samples its own rows (with
    `vllm_tensor_parallel_size > 1` the ranks of a tensor-parallel group gather their prompts, so they agree on the
    calls as a server's do)."""

    def __init__(self, vllm: VLLMGenerator, accelerator, stop_token_ids: list[int], keep_sampler_logps: bool):
        super().__init__(vllm, accelerator, stop_token_ids, keep_sampler_logps)
        self.collective = vllm.tensor_parallel_size > 1


__all__ = [
    "BehaviourLogprobRecorder",
    "GenerateSampler",
    "RowTemperatureLogitsWarper",
    "Sampler",
    "SamplerOutput",
    "VLLMColocateSampler",
    "VLLMSampler",
    "VLLMServerSampler",
    "cut_after_stop",
    "generate",
    "neutral_generation_defaults",
    "row_temperatures",
    "truncate_at_stop",
]
