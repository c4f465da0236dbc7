# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Rollouts: from prompts to replay trajectories — sample, then finish (score, reference log-probs, values, advantages).

[`RolloutEngine`] has the two halves of a round, kept apart so that sampling can happen elsewhere (see
`trl_trapo/sources.py` for the rollout-source contract):

- `sample` (the default source's sampler, [`~trl_trapo.sources.SyncRolloutSource`]) samples completions with the
  live policy and behaviour log-probs recorded during sampling (transformers' `generate`, or vLLM through
  [`VLLMGenerator`]), cuts them after the stop token, and returns a [`~trl_trapo.sources.SampledRound`] stamped with
  the policy version that sampled it;
- `finish` turns any source's round into a [`RolloutBatch`]: it scores the completions with the
  [`~trl_trapo.rewards.RewardScorer`] (unless the source did), puts in guidance's demonstrations, computes reference
  log-probs and critic values, and turns everything into advantages and [`~trl_trapo.memory.Trajectory`] objects (GAE
  with a critic, group-relative without), with the round's statistics over every rank.

The trainer hands the finished batch whole to every consumer (exploration, metrics, KL window, memory pool, replay).

`sample` draws through the run's sampler (`trl_trapo/samplers.py`: transformers' `generate`, a vLLM server or a
colocated vLLM engine), which takes each row's temperature, `max_new_tokens` and model inputs.

A prompt's extra model inputs (its example's `model_inputs`, e.g. a VLM processor's `pixel_values`; see
[`prompt_model_inputs`]; vLLM gets the row's images instead) go to `generate`, to the behaviour, reference and critic forwards, and into its trajectories.

Shapes: `B` completions, `P` prompt tokens (left-padded for generation), `C` completion tokens, `V` vocabulary.
All masks are built from lengths (where the stop token first appears), never by comparing ids with the pad id, so
tokenizers whose pad token equals their EOS token are handled correctly.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import GenerationConfig
from trl.import_utils import is_vllm_available

from .data import tokenize_prompt
from .distributed import gather_across_ranks, sum_over_ranks
from .guidance import DemonstrationGuidance
from .losses import gae_advantages, group_relative_advantages, kl_estimate, masked_whiten, per_token_rewards
from .memory.replay import Trajectory
from .models import (
    PolicyAndValueWrapper,
    ReferencePolicy,
    completion_logps,
    completion_logps_and_kept_support,
    value_predictions,
)
from .rewards import SKIPPED_COLUMNS, RewardScorer, check_reward_columns, discard_extra, discard_metric
from .sampler_correction import SamplerCorrection, correct_sampler_mismatch
from .samplers import (
    BehaviourLogprobRecorder,
    GenerateSampler,
    RowTemperatureLogitsWarper,
    Sampler,
    VLLMColocateSampler,
    VLLMServerSampler,
    cut_after_stop,
    generate,
    neutral_generation_defaults,
    row_temperatures,
    truncate_at_stop,
)
from .sources import SampledRound
from .vision import examples_model_inputs, row_images


if TYPE_CHECKING:
    from .teacher import Teacher

logger = logging.getLogger(__name__)

SLOW_ROUND_SECONDS = 5.0  # generation rounds at least this long are logged at INFO level


def prompt_model_inputs(examples: Sequence[Mapping]) -> list[dict[str, torch.Tensor]] | None:
    """Each example's extra model inputs as tensors: its `model_inputs` column, name -> a tensor (or nested lists,
    as a `datasets.Dataset` returns them) with a leading dimension (e.g. a VLM processor's `pixel_values` and
    `image_grid_thw` for the prompt, see [`~trl_trapo.vision.as_tensors`]); a missing, None or empty entry is no
    input. None when no example has any.

    This is where a prompt's model inputs enter rollouts: `generate`, the behaviour and reference log-probs, the
    critic and the trajectories (so the training forward) all get them. Reward models and functions do not (they
    see the prompt's text and ids only), nor do few-shot prompt embeddings, self-imitation's SFT rows and vLLM.
    """
    inputs = examples_model_inputs(examples)  # the rows of one prompt share its tensors
    return inputs if any(inputs) else None


def stop_token_ids(args, tokenizer) -> list[int]:
    """The ids that end a completion: `stop_token_id` (or the tokenizer's EOS with `stop_token="eos"`), plus
    `generation_kwargs["eos_token_id"]`; empty: completions never stop early (TRL 1.12 PPO's `stop_token=None`)."""
    ids = []
    if args.stop_token_id is not None:
        ids.append(args.stop_token_id)
    elif args.stop_token == "eos":
        ids.append(tokenizer.eos_token_id)
    extra = (args.generation_kwargs or {}).get("eos_token_id")
    if extra is not None:
        ids.extend(extra if isinstance(extra, (list, tuple)) else [extra])
    return sorted(set(int(i) for i in ids))


def rollout_generation_config(args, tokenizer, pad_token_id: int | None = None) -> GenerationConfig:
    """The sampling settings of rollouts: `response_length` new tokens, `top_p` / `top_k`, the stop
    ids of [`stop_token_ids`] (none: generation never stops early), every logits processor the trainer does not model
    pinned to neutral, then the accepted `generation_kwargs` (see `TRAPOConfig.generation_kwargs`). Generation runs
    under [`neutral_generation_defaults`], so nothing comes from the model's own `generation_config.json`.
    `pad_token_id` (default: the tokenizer's) fills finished rows; it must be an id the model embeds. Its
    `temperature` is 1: [`generate`] applies each row's sampling temperature itself, before top-k / top-p."""
    stops = stop_token_ids(args, tokenizer)
    kwargs = dict(
        max_new_tokens=args.response_length,
        do_sample=True,
        temperature=1.0,  # applied per row by `generate` (RowTemperatureLogitsWarper), where this one would be
        top_p=args.top_p,
        top_k=args.top_k,
        pad_token_id=tokenizer.pad_token_id if pad_token_id is None else pad_token_id,
        eos_token_id=stops or None,
        bos_token_id=tokenizer.bos_token_id,
        use_cache=True,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
    )
    kwargs.update({k: v for k, v in (args.generation_kwargs or {}).items() if k != "eos_token_id"})
    return GenerationConfig(**kwargs)


@dataclass
class RolloutBatch:
    """One round, finished: sampled, scored, with reference log-probs, values and advantages (B completions; `P_i`
    prompt tokens and `C_i` completion tokens of row i). What every consumer of a round reads (the trainer hands it
    whole to targeted exploration, the metrics, the adaptive KL window, the memory pool and the replay buffer)."""

    examples: list[dict]  # (B,) the dataset row of each completion's prompt
    prompt_ids: list[torch.Tensor]  # (P_i,) long each: the prompts' tokens
    trajectories: list[Trajectory]  # the completions with a score (those whose every reward is None are dropped)
    completion_ids: list[torch.Tensor]  # (C_i,) each: every completion as trained (demonstrations put in by guidance)
    old_per_token_logps: list[torch.Tensor]  # (C_i,) each: behaviour log-probs (nats)
    ref_per_token_logps: list[torch.Tensor] | None  # (C_i,) each: reference log-probs (nats); None without a KL term
    scores: torch.Tensor  # (B,) weighted reward (missing-stop penalty included); NaN = no reward
    per_func: torch.Tensor  # (B, F) reward of each reward function / model; NaN = none
    is_truncated: torch.Tensor  # (B,) bool: no stop token was generated
    temperatures: torch.Tensor  # (B,) float32: each completion's sampling temperature
    group: int = 1  # consecutive completions that share a prompt (group-relative advantages)
    version: int = 0  # the policy version that sampled the round (the optimizer step whose weights generated it)
    tasks: list[str] | None = None  # (B,) the RL dataset's `task` of each completion's prompt, when it has one
    off_policy: torch.Tensor | None = None  # (B,) bool: a demonstration put in by guidance; None without guidance
    on_policy_scores: torch.Tensor | None = None  # (B,) the sampled completions' scores, before guidance
    kl: torch.Tensor | None = None  # (B,) float: per-sequence KL estimate to the reference, summed over the counted
    # tokens (nats); None without a reference
    completion_mask: list[torch.Tensor] | None = None  # (C_i,) each: the source's mask (0 = not sampled by the
    # policy, e.g. tool results); None: every token was sampled
    sampler_correction: SamplerCorrection | None = None  # the sampler/trainer mismatch correction of a round another
    # engine sampled (statistics over every completion it returned); None: the trainer sampled, or no correction
    rewards: torch.Tensor | None = None  # (B,) weighted reward of each completion as sampled: before guidance put a
    # demonstration in and before `missing_eos_penalty` (TRL GRPO's `reward`); None: `scores`


# where TRL's VLLMGeneration looks for the server without server_base_url (host 0.0.0.0, port 8000)
DEFAULT_VLLM_SERVER_URL = "http://0.0.0.0:8000"


def vllm_generation_kwargs(args, tokenizer) -> dict:
    """The `generation_kwargs` vLLM samples rollouts with: the user's (less `eos_token_id`, which becomes a stop
    token), with the ids of [`stop_token_ids`] as vLLM's `stop_token_ids`, or `ignore_eos` when there are none
    (`stop_token=None`: completions never stop early). The synchronous ([`VLLMGenerator`]) and the asynchronous server
    producer (`trl_trapo/async_rollouts.py`) sample with the same."""
    kwargs = {k: v for k, v in (args.generation_kwargs or {}).items() if k != "eos_token_id"}
    stops = stop_token_ids(args, tokenizer)
    if stops:
        kwargs["stop_token_ids"] = stops
    else:
        kwargs["ignore_eos"] = True
    return kwargs


def sampled_token_logps(logprobs: list) -> list[torch.Tensor]:
    """vLLM's log-probs of the sampled tokens, `(C_i,)` float32 each, from `VLLMClient.generate`'s `(num_sequences,
    C_i, num_logprobs)` lists (the sampled token's first); a None (a NaN vLLM dropped) becomes NaN."""
    return [
        torch.tensor([math.nan if lp[0] is None else float(lp[0]) for lp in row], dtype=torch.float32)
        for row in logprobs
    ]


def vllm_server_url(args) -> str:
    """The vLLM server's base URL in server mode (`vllm_server_base_url`, else TRL's default)."""
    return args.vllm_server_base_url or DEFAULT_VLLM_SERVER_URL


def vllm_server_unreachable(url: str, timeout: float, model: str, who: str, error: BaseException) -> str:
    """The message of a vLLM server that does not answer: where it was looked for, the settings, and the fix."""
    detail = str(error).rstrip(".")
    return (
        f"No vLLM server answers at {url} (TRAPOConfig.vllm_server_base_url; {who}, after waiting "
        f"vllm_server_timeout={timeout:g} s): {type(error).__name__}: {detail}. Start the server first, on the GPU(s) "
        f"it should use, e.g. `trl vllm-serve --model {model or '<model directory>'} --port 8000` (it sets the "
        "weight-transfer and log-prob flags TRAPO needs), then point vllm_server_base_url at it "
        "(http://<host>:<port>); raise vllm_server_timeout for a server that is still loading."
    )


def unreachable_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a server that does not answer: requests' `ConnectionError` (what TRL's `VLLMClient` raises
    from its health check and, after its retries, from a request) and Python's."""
    try:
        from requests.exceptions import ConnectionError as RequestsConnectionError
    except ImportError:  # TRL's client needs requests; without it there is no server to reach
        return (ConnectionError,)
    return (RequestsConnectionError, ConnectionError)


class VLLMServerError(ConnectionError):
    """The vLLM server (`vllm_mode="server"`) cannot be reached: the message names `vllm_server_base_url` and the
    fix."""


class VLLMGenerator:
    """Completions from vLLM for lists of prompt token ids, with the weights synced once per optimizer step (GPU only;
    `use_vllm=True`), through TRL's `VLLMGeneration`.

    vLLM only samples the completions (and reports its log-probs of them). Everything else stays TRAPO's: completions
    are cut after the stop token, and the behaviour log-probs are recomputed by the training policy (the same forward
    as the HF-`generate` path's), so the PPO ratio of a fresh rollout is exactly 1. The kernel differences between
    vLLM and the trainer are corrected by importance weights (`vllm_importance_sampling_correction`, TRL's default):
    vLLM's log-probs go to the round as `sampler_per_token_logps` and [`RolloutEngine.finish`] weighs them against
    the trainer's, taken over the same top-k / top-p support.
    The policy's weights (LoRA adapters merged) are pushed to vLLM before the first generation round of every
    optimizer step; TRL's `VLLMGeneration` gathers ZeRO-3 / FSDP shards parameter by parameter while doing so.

    With `async_rollouts=True` (server mode only) the trainer keeps this object for the weights alone
    ([`push_weights`]): the asynchronous source's producer process sends the prompts to the server itself
    (`trl_trapo/async_rollouts.py`).

    Not tested on this project's CPU machines (vLLM needs a GPU); `scripts/gpu_check.py` exercises it when vLLM is
    importable. Differences from the HF path: sampling is seeded by vLLM, not by the trainer's checkpointed
    generator, so a resumed run does not draw the same completions; with `top_p < 1` or `top_k > 0` the recomputed
    behaviour log-probs (PPO's ratio) are those of the temperature-scaled distribution, as on the HF path, not of the
    truncated one vLLM sampled from (only the mismatch weight is taken over the truncated support).

    Args:
        args ([`TRAPOConfig`]): the `vllm_*` settings and sampling parameters.
        policy (`nn.Module`): the unwrapped policy (vLLM loads the model from its `name_or_path`).
        accelerator: the Trainer's `Accelerator`.
        tokenizer: the policy's tokenizer.
        processor (*optional*): a VLM's processor, given to `VLLMGeneration` as its `processing_class` (TRL's: the
            server places a prompt's image features at the processor's `image_token_id`); None: the tokenizer.

    Raises:
        ImportError: if vLLM is not installed.
        ValueError: if the policy was not loaded from a directory or Hub id (vLLM loads the model itself).
        VLLMServerError: in server mode, if no server answers at `vllm_server_base_url` within `vllm_server_timeout`.
    """

    def __init__(self, args, policy: nn.Module, accelerator, tokenizer, processor=None):
        if not is_vllm_available():
            raise ImportError(
                "TRAPOConfig.use_vllm=True needs vLLM, which is not installed: `pip install vllm` on a GPU machine, "
                "or set use_vllm=False (rollouts then use transformers' generate)."
            )
        from trl.generation.vllm_generation import VLLMGeneration

        name = getattr(policy, "name_or_path", None) or ""
        if not (os.path.isdir(name) or (name.count("/") == 1 and not os.path.exists(name))):
            raise ValueError(
                f"TRAPOConfig.use_vllm=True: vLLM loads the model from its directory or Hub id, but the policy's "
                f"name_or_path is {name!r}. Save the model with `save_pretrained(path)` and pass `model=path`."
            )
        self.model_name = name
        self.server_url, self.server_timeout = vllm_server_url(args), float(args.vllm_server_timeout)
        try:
            self.generation = VLLMGeneration(
                model=policy,
                accelerator=accelerator,
                processing_class=tokenizer if processor is None else processor,
                mode=args.vllm_mode,
                server_base_url=args.vllm_server_base_url,
                server_timeout=self.server_timeout,
                tensor_parallel_size=args.vllm_tensor_parallel_size,
                gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                max_model_length=args.vllm_max_model_length or args.max_prompt_length + args.response_length,
                enable_sleep_mode=args.vllm_enable_sleep_mode,
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=args.top_k,
                max_completion_length=args.response_length,
                logprobs=0,
                generation_kwargs=vllm_generation_kwargs(args, tokenizer),
            )
        except unreachable_errors() as error:  # TRL's VLLMClient.check_server raises requests' ConnectionError
            if args.vllm_mode != "server":
                raise
            raise VLLMServerError(
                vllm_server_unreachable(self.server_url, self.server_timeout, name, "from the trainer", error)
            ) from error
        self.synced_step: int | None = None
        self.mode, self.tensor_parallel_size = args.vllm_mode, int(args.vllm_tensor_parallel_size)
        if args.vllm_mode == "server" and args.vllm_importance_sampling_correction and accelerator.is_main_process:
            # the correction compares the trainer's log-probs over the kept support with vLLM's processed ones
            mode = self.generation.vllm_client.get_server_info()["model_config"]["logprobs_mode"]
            if mode != "processed_logprobs":
                logger.warning(
                    "The vLLM server runs with `--logprobs-mode %s`: its log-probs are not those of the distribution "
                    "it samples from (temperature, top_k / top_p applied), which biases the sampler/trainer mismatch "
                    "correction. Restart it with `--logprobs-mode processed_logprobs` (what `trl vllm-serve` sets), "
                    "or set vllm_importance_sampling_correction=False.",
                    mode,
                )

    def push_weights(self) -> None:
        """Push the policy's weights to vLLM now (TRL's `VLLMGeneration.sync_weights`: every parameter, LoRA adapters
        merged, ZeRO-3 / FSDP shards gathered, then vLLM's prefix cache reset). In server mode the main process first
        checks that the server answers (waiting up to `vllm_server_timeout`), so that a server that went away is a
        clear error rather than minutes of HTTP retries.

        Raises:
            VLLMServerError: naming `vllm_server_base_url`, if the server does not answer.
        """
        client = getattr(self.generation, "vllm_client", None)  # server mode, main process
        if client is not None:
            try:
                client.check_server(self.server_timeout)
            except unreachable_errors() as error:
                raise VLLMServerError(
                    vllm_server_unreachable(
                        self.server_url, self.server_timeout, self.model_name, "pushing the weights", error
                    )
                ) from error
        self.generation.sync_weights()

    def sync_for_step(self, step: int) -> None:
        """Push the weights ([`push_weights`]) unless they were pushed already for optimizer step `step` (TRL's
        `GRPOTrainer` syncs once per `global_step`). Collective, like the push."""
        if self.synced_step != step:
            self.push_weights()
            self.synced_step = step

    def generate(
        self,
        prompt_ids: list[list[int]],
        group: int,
        step: int,
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        images: list[list | None] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Sample one completion per prompt (prompts come in consecutive groups of `group` copies), all at one
        temperature.

        Collective (weight sync gathers sharded parameters; server mode gathers prompts): every rank calls it.

        Args:
            prompt_ids (`list[list[int]]`): the prompts' token ids.
            group (`int`): consecutive copies of one prompt (vLLM's `n`).
            step (`int`): the optimizer step (the weights are pushed before its first call).
            temperature (`float`, *optional*): the sampling temperature (default: `TRAPOConfig.temperature`).
            max_new_tokens (`int`, *optional*): vLLM's `max_tokens` (default: `response_length`).
            images (`list[list | None]`, *optional*): each prompt's PIL images, or None (TRL's `VLLMGeneration`
                passes them to vLLM as `multi_modal_data`; a server processes them first).

        `VLLMGeneration` reads its sampling settings from its public `temperature` and `max_completion_length`
        attributes at each call: they are set for this call and put back afterwards.

        Returns:
            tuple `(completion_ids, logps)`: `(C_i,)` completion token ids, uncut (the caller cuts after the stop
            token), and vLLM's `(C_i,)` float32 log-probs of them (nats, after temperature and top-k / top-p: TRL's
            `processed_logprobs`; NaN where vLLM gave none), or None when vLLM returned none.
        """
        self.sync_for_step(step)
        generation = self.generation
        saved = generation.temperature, generation.max_completion_length
        if temperature is not None:
            generation.temperature = float(temperature)
        if max_new_tokens is not None:
            generation.max_completion_length = int(max_new_tokens)
        try:
            _, completion_ids, logprobs, _ = generation.generate(
                prompts=prompt_ids, images=images, num_generations=group
            )
        finally:
            generation.temperature, generation.max_completion_length = saved
        completions = [torch.tensor(list(c), dtype=torch.long) for c in completion_ids]
        if logprobs is None:
            return completions, None
        return completions, sampled_token_logps(logprobs)  # (C_i, num_logprobs) per completion, sampled token first


class RolloutEngine:
    """Rounds: prompts -> completions (`sample`); completions -> scores, reference log-probs, values -> advantages ->
    trajectories (`finish`).

    Args:
        args ([`TRAPOConfig`]): the configuration (read only).
        tokenizer: the policy's tokenizer.
        scorer ([`~trl_trapo.rewards.RewardScorer`]): scores completions.
        reference ([`~trl_trapo.models.ReferencePolicy`], *optional*): the KL term's reference (None: no KL term).
        has_critic (`bool`): advantages from GAE with the critic (else group-relative).
        kl_penalty (`str`): "reward" (the KL enters the per-token rewards here) or "loss".
        kl_estimator (`str`): the per-token KL estimator ("k1", "k2" or "k3"; resolved, not "auto").
        kl_coef (`Callable[[], float]`): the KL coefficient in use (adaptive or fixed).
        unwrapped_model (`Callable[[], AbstractContextManager[nn.Module]]`): enters a context holding the trained
            model (the policy, or the policy + critic wrapper) unwrapped for generation, in eval mode.
        accelerator: the Trainer's `Accelerator`.
        generation_config (`GenerationConfig`): sampling settings.
        stop_token_ids (`list[int]`): completions are cut after the first of them (empty: they never stop early).
        pad_token_id (`int`): the id written in padding positions (one the models embed, see
            [`~trl_trapo.models.embedding_safe_pad_id`]).
        guidance ([`~trl_trapo.guidance.DemonstrationGuidance`], *optional*): puts the prompt's demonstration into
            the groups it chooses (examples need `demonstration_ids`).
        vllm ([`VLLMGenerator`], *optional*): samples with vLLM instead of `generate`.
        teacher ([`~trl_trapo.teacher.Teacher`], *optional*): the distillation teacher, when its sampled-token
            estimator is on: each round's trajectories carry its log-probability of every sampled token
            (`teacher_per_token_logps`, at the divergence's temperature), computed next to the reference's.

    The sampling seed of every round comes from the engine's own `generator` (checkpointed), so a resumed run samples
    exactly what an uninterrupted one would, whatever the Trainer does with the global RNG.
    """

    def __init__(
        self,
        args,
        tokenizer,
        scorer: RewardScorer,
        reference: ReferencePolicy | None,
        has_critic: bool,
        kl_penalty: str,
        kl_estimator: str,
        kl_coef: Callable[[], float],
        unwrapped_model: Callable[[], AbstractContextManager[nn.Module]],
        accelerator,
        generation_config: GenerationConfig,
        stop_token_ids: list[int],
        pad_token_id: int,
        guidance: DemonstrationGuidance | None = None,
        vllm: VLLMGenerator | None = None,
        teacher: Teacher | None = None,
    ):
        self.args = args
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.reference = reference
        self.has_critic = has_critic
        self.kl_penalty = kl_penalty
        self.kl_estimator = kl_estimator
        self.kl_coef = kl_coef
        self.unwrapped_model = unwrapped_model
        self.accelerator = accelerator
        self.generation_config = generation_config
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.guidance = guidance
        self.vllm = vllm
        self.teacher = teacher
        self.generator = torch.Generator().manual_seed(args.seed + 5 + accelerator.process_index)
        self.sampler = self.build_sampler()

    def build_sampler(self) -> Sampler:
        """The sampler every round is drawn with ([`~trl_trapo.samplers`]): vLLM's (server or colocate) with `vllm`,
        else transformers' `generate` seeded from the engine's `generator`."""
        args = self.args
        if self.vllm is not None:
            kind = VLLMServerSampler if self.vllm.mode == "server" else VLLMColocateSampler
            return kind(self.vllm, self.accelerator, self.stop_token_ids, args.vllm_importance_sampling_correction)
        return GenerateSampler(
            self.unwrapped_model,
            self.policy_of,
            self.accelerator,
            self.generation_config,
            self.stop_token_ids,
            self.pad_token_id,
            self.generator,
            args.local_rollout_forward_batch_size,
            args.ds3_gather_for_generation,
            self.progress_description,
        )

    def progress_description(self, description: str) -> str | None:
        """`description` when per-round progress bars are on (`disable_tqdm=False`, `console_metrics="all"`, main
        process), else None: by default the training bar is the only one during training."""
        shown = not self.args.disable_tqdm and self.args.console_metrics == "all" and self.accelerator.is_main_process
        return description if shown else None

    @staticmethod
    def policy_of(model: nn.Module) -> nn.Module:
        """The policy inside the trained model (the model itself without a critic)."""
        return model.policy if isinstance(model, PolicyAndValueWrapper) else model

    @torch.no_grad()
    def sample(
        self,
        examples: list[dict],
        group: int,
        step: int,
        temperature: float | Sequence[float],
        max_new_tokens: int | None = None,
        lockstep: bool = False,
    ) -> SampledRound:
        """Sample one round on `examples` (dataset rows with `prompt_ids`, repeated `group` times in a row) with the
        live policy, through the run's sampler ([`~trl_trapo.samplers.Sampler`]): transformers' `generate` in one
        batched call (per `local_rollout_forward_batch_size` prompts) whatever the temperatures, or vLLM in one call
        per distinct temperature, with each row's images; nothing is scored here ([`finish`] does that).

        Args:
            examples (`list[dict]`): the round's rows, B of them.
            group (`int`): consecutive rows per prompt.
            step (`int`): the optimizer step (the round's version; for logs and vLLM's weight sync).
            temperature (`float`, or B floats): the sampling temperature of every row, or one per row (targeted
                exploration); behaviour, reference and training log-probs all use each row's own.
            max_new_tokens (`int`, *optional*): new tokens at most (default `response_length`); a multi-turn source
                ([`~trl_trapo.agents.ToolRolloutSource`]) passes what its rollouts' budget and context leave.
            lockstep (`bool`): every rank makes this call together with at most `local_rollout_forward_batch_size`
                rows (the tool-calling loop's turns, one `generate` call each): generate in lockstep under ZeRO-3 even
                with the weights gathered (see [`~trl_trapo.distributed.generation_synced_gpus`]).

        Returns:
            [`~trl_trapo.sources.SampledRound`]: completions cut after their stop token, with behaviour log-probs
            recorded while sampling (with vLLM: none, [`finish`] computes them with the training policy, and vLLM's
            own as `sampler_per_token_logps` when the mismatch correction is on), version `step`.

        Raises:
            RuntimeError: naming the fix, when the policy's probabilities are not finite (training diverged).
            ValueError: with vLLM, when the rows carry model inputs but no images (vLLM takes images only).
        """
        args = self.args
        # `as_tensor`: a torch-formatted dataset's rows hold tensors, which `torch.tensor` copies with a warning
        prompt_ids = [torch.as_tensor(e["prompt_ids"], dtype=torch.long) for e in examples]
        model_inputs = prompt_model_inputs(examples)
        temperatures = row_temperatures(temperature, len(examples))
        images = row_images(examples) if self.vllm is not None else None  # vLLM processes the images itself
        try:
            output = self.sampler.sample(
                [p.tolist() for p in prompt_ids],
                temperatures,
                group,
                step,
                max_new_tokens=max_new_tokens,
                model_inputs=model_inputs,
                images=images,
                lockstep=lockstep,
            )
        except RuntimeError as error:
            if "probability tensor" not in str(error):
                raise
            raise RuntimeError(
                f"Training diverged before step {step}: the policy's next-token probabilities are not finite "
                f"(`{error}`), so no rollout can be sampled. Lower learning_rate (now {args.learning_rate}) "
                f"or max_grad_norm (now {args.max_grad_norm}) and resume from the last checkpoint of "
                f"{args.output_dir}; `train/nonfinite_steps` counts the steps already skipped."
            ) from error
        if self.vllm is None:
            logger.log(  # a sign of life for slow rounds (real models on CPU); quick ones stay quiet
                logging.INFO if output.seconds >= SLOW_ROUND_SECONDS else logging.DEBUG,
                "Step %d: generated %d completions (%d prompts x %d) in %.1f s: %d tokens, %.0f tokens/s.",
                step,
                len(examples),
                len(examples) // max(group, 1),
                group,
                output.seconds,
                output.num_tokens,
                output.num_tokens / max(output.seconds, 1e-9),
            )
        return SampledRound(
            examples,
            output.completion_ids,
            version=step,
            group=group,
            old_per_token_logps=output.logps,
            temperatures=temperatures,
            prompt_ids=prompt_ids,
            sampler_per_token_logps=output.sampler_logps,
        )

    def finish(self, sampled: SampledRound, across_ranks: bool = True, source: str = "SampledRound") -> RolloutBatch:
        """Finish a sampled round into a scored [`RolloutBatch`], in this process, at consumption time: prompt ids
        (tokenized from `prompt` when absent), behaviour log-probs when the round has none (the current policy's, at
        each row's temperature), scores when it has none (the reward functions), the missing-stop penalty, guidance's
        demonstrations, reference log-probs, critic values, advantages and trajectories stamped with the round's
        version. The completions are taken as they are (never cut). A round with `sampler_per_token_logps` (another
        engine sampled it) gets the trainer's log-probs as behaviour log-probs and, with
        `vllm_importance_sampling_correction`, the mismatch log-ratios and statistics ([`sampler_correction`]).

        Args:
            sampled ([`~trl_trapo.sources.SampledRound`]): the round.
            across_ranks (`bool`): every rank calls this at the same time with its part of one round, and the round's
                statistics cover all parts (collective, see [`make_trajectories`]); False: they cover this round only.

        A round's `completion_mask` (0 on tokens the environment wrote, TRL's `env_mask`) is kept whole: those tokens
        count in no loss, KL, entropy, ratio statistic or length metric, their behaviour and reference log-probs are
        0 in the trajectories, GAE steps over them (see [`~trl_trapo.losses.gae_advantages`]), and a completion has
        stopped when the *policy* wrote a stop token.

        `source` names what returned the round in errors (e.g. "MySource.sample").

        Raises:
            ValueError: if the round is to be scored here and an example has no `prompt`, or lacks a column a reward
                function takes by name without a default.
        """
        if sampled.scores is None:
            self.check_scorable(sampled, source)
        template = self.args.chat_template_kwargs or {}
        prompt_ids = sampled.prompt_ids
        if prompt_ids is None:
            prompt_ids = [
                torch.as_tensor(  # a torch-formatted row's `prompt_ids` is a tensor already
                    e["prompt_ids"] if "prompt_ids" in e else tokenize_prompt(e["prompt"], self.tokenizer, template),
                    dtype=torch.long,
                )
                for e in sampled.examples
            ]
        temperature = self.args.temperature if sampled.temperatures is None else sampled.temperatures
        temperatures = row_temperatures(temperature, len(sampled.examples))
        with self.unwrapped_model() as unwrapped:
            return self._score(unwrapped, sampled, prompt_ids, temperatures, across_ranks)

    def check_scorable(self, sampled: SampledRound, source: str) -> None:
        """Refuse a round without `scores` that the reward functions cannot be called on, naming `source` and the
        column, before anything is computed: the reward functions read each example's `prompt` and take the other
        columns by name (a parameter without a default must be in every example).

        Raises:
            ValueError: naming the source, the column, the first example that lacks it and the reward function(s); or
                naming the key, for an example with a key named like a keyword every reward call carries
                ([`~trl_trapo.rewards.check_reward_columns`]: `completions`, `trainer_state`, ...).
        """
        if not all("prompt" in e for e in sampled.examples):
            raise ValueError(
                f"{source}: a round without `scores` is scored by the reward functions, which read each example's "
                "`prompt`: give every example its dataset row's `prompt`, or return the round with `scores`."
            )
        if self.scorer.has_functions:  # the first example's keys are the reward functions' keyword arguments
            check_reward_columns(
                [k for k in sampled.examples[0] if k not in SKIPPED_COLUMNS] if sampled.examples else [],
                f"{source}: SampledRound.examples[0] key",
                "give the examples their dataset rows (whose columns TRAPO checked at construction) and the extra "
                "reward column under another name, e.g. 'my_{column}'",
            )
        for column, functions in self.scorer.columns_required().items():
            lacking = [i for i, e in enumerate(sampled.examples) if column not in e]
            if lacking:
                raise ValueError(
                    f"{source}: SampledRound.examples[{lacking[0]}] has no {column!r} ({len(lacking)} of "
                    f"{len(sampled.examples)} examples lack it; it has {sorted(sampled.examples[lacking[0]])}), which "
                    f"reward function(s) {', '.join(repr(f) for f in functions)} take by name: give each example its "
                    "whole dataset row (the reward columns too), or return the round with `scores`."
                )

    @torch.no_grad()
    def process(
        self,
        examples: list[dict],
        completion_ids: list[torch.Tensor],
        old_per_token_logps: list[torch.Tensor] | None,
        group: int,
        temperature: float | Sequence[float],
        across_ranks: bool = False,
        version: int = 0,
    ) -> RolloutBatch:
        """Given rollouts (`(C_i,)` token ids, and optionally `(C_i,)` behaviour log-probs), exactly as generated ones
        are processed: each is cut after its first stop token, then the round is finished by [`finish`] (see
        `TRAPOTrainer.process_rollouts`). `temperature`: their sampling temperature, one or one per completion.
        `across_ranks`: every rank calls this at the same time with its part of one round, and the round's statistics
        cover all parts (see [`make_trajectories`]); False: they cover the given rollouts only. `version`: the policy
        version that sampled them."""
        cut = [cut_after_stop(torch.as_tensor(c, dtype=torch.long), self.stop_token_ids) for c in completion_ids]
        if old_per_token_logps is not None:
            old_per_token_logps = [lp[: c.numel()] for lp, c in zip(old_per_token_logps, cut)]
        sampled = SampledRound(
            examples,
            cut,
            version=version,
            group=group,
            old_per_token_logps=old_per_token_logps,
            temperatures=temperature,
        )
        return self.finish(sampled, across_ranks)

    def _score(self, unwrapped, sampled: SampledRound, prompt_ids, temperatures, across_ranks) -> RolloutBatch:
        args = self.args
        examples, group = sampled.examples, sampled.group
        model_inputs = prompt_model_inputs(examples)  # the prompts' extra model inputs (a `model_inputs` column)
        pad_id = self.pad_token_id
        batch_size = args.local_rollout_forward_batch_size
        policy = self.policy_of(unwrapped)
        completion_ids, old_logps = sampled.completion_ids, sampled.old_per_token_logps
        masks = list(sampled.completion_mask) if sampled.completion_mask is not None else None
        correction = log_ratios = None
        if sampled.sampler_per_token_logps is not None and args.vllm_importance_sampling_correction:
            # another engine sampled: the trainer's own log-probs are the behaviour log-probs, and over the sampler's
            # kept top-k / top-p support they give the mismatch weight (TRL's vllm_importance_sampling_correction)
            old_logps, kept_logps = completion_logps_and_kept_support(
                policy,
                prompt_ids,
                completion_ids,
                pad_id,
                temperatures,
                batch_size,
                model_inputs,
                args.top_k,
                args.top_p,
            )
            correction = self.sampler_correction(kept_logps, sampled.sampler_per_token_logps, completion_ids, masks)
            log_ratios = [correction.log_ratio[i, : c.numel()].clone() for i, c in enumerate(completion_ids)]
        elif old_logps is None:
            old_logps = completion_logps(
                policy, prompt_ids, completion_ids, pad_id, temperatures, batch_size, model_inputs
            )
        completion_ids, old_logps = list(completion_ids), list(old_logps)
        if masks is not None:  # behaviour log-probs of the policy's tokens only (0 where the environment wrote)
            old_logps = [torch.where(m.bool(), lp.float(), 0.0) for lp, m in zip(old_logps, masks)]
        # step 2. scores (reward functions / models), unless the source brought them
        if sampled.scores is None:
            scores, per_func = self.scorer.score(examples, prompt_ids, completion_ids)
        else:
            scores = torch.as_tensor(sampled.scores, dtype=torch.float32).clone()
            per_func = (
                torch.full((len(examples), len(self.scorer.names)), math.nan)
                if sampled.per_func is None
                else torch.as_tensor(sampled.per_func, dtype=torch.float32).clone()
            )
        # the missing-stop penalty is judged by the stop ids (EOS when completions never stop early)
        stops = torch.tensor(self.stop_token_ids or [self.tokenizer.eos_token_id])

        def stopped(completions: list[torch.Tensor], token_masks: list[torch.Tensor] | None) -> torch.Tensor:
            """(B,) bool: the policy wrote a stop token (a stop id in an environment's tokens does not count)."""
            hits = [torch.isin(c, stops) for c in completions]
            if token_masks is not None:
                hits = [h & m.bool() for h, m in zip(hits, token_masks)]
            return torch.tensor([bool(h.any()) for h in hits], dtype=torch.bool)

        rewards = scores.clone()  # as sampled, no penalty: TRL GRPO's `reward` (metrics.py)
        on_policy_scores = scores.clone()
        if args.missing_eos_penalty is not None:
            on_policy_scores = on_policy_scores - args.missing_eos_penalty * (~stopped(completion_ids, masks)).float()
        # step 3. guidance: a chosen group's last completion becomes the prompt's demonstration (off-policy; its
        # "behaviour" log-probs are the current policy's, used for metrics and a KL in the reward only)
        off_policy = torch.zeros(len(completion_ids), dtype=torch.bool)
        if self.guidance is not None:
            chosen = self.guidance.select(examples, scores, group)
            if chosen:
                demos = [torch.as_tensor(examples[i]["demonstration_ids"], dtype=torch.long) for i in chosen]
                demo_prompts = [prompt_ids[i] for i in chosen]
                # what reward functions log about demonstrations is dropped: the rollout metrics describe samples
                demo_scores, demo_per_func = self.scorer.score(
                    [examples[i] for i in chosen], demo_prompts, demos, discard_metric, discard_extra
                )
                demo_inputs = None if model_inputs is None else [model_inputs[i] for i in chosen]
                demo_logps = completion_logps(
                    policy, demo_prompts, demos, pad_id, temperatures[chosen], batch_size, demo_inputs
                )
                for k, i in enumerate(chosen):
                    completion_ids[i], old_logps[i] = demos[k], demo_logps[k]
                    if log_ratios is not None:  # a demonstration was not sampled: no mismatch to correct
                        log_ratios[i] = torch.zeros(demos[k].numel())
                    scores[i], per_func[i] = demo_scores[k], demo_per_func[k]
                    off_policy[i] = True
                    if masks is not None:  # every token of a demonstration counts
                        masks[i] = torch.ones(demos[k].numel())
        # step 4. reference log-probs and values
        ref_logps = None
        kl = None
        if self.reference is not None:
            ref_logps = self.reference.logps(
                policy, prompt_ids, completion_ids, pad_id, temperatures, batch_size, model_inputs
            )
            per_token_kl = [kl_estimate(o, r, self.kl_estimator) for o, r in zip(old_logps, ref_logps)]
            if masks is not None:
                per_token_kl = [k * m.to(k.dtype) for k, m in zip(per_token_kl, masks)]
            kl = torch.stack([k.sum() for k in per_token_kl])  # (B,) nats per sequence
        teacher_logps = None
        if self.teacher is not None:  # distillation's sampled-token estimator: the teacher's log-prob of each token
            teacher_logps = self.teacher.logps(prompt_ids, completion_ids, model_inputs)
        values = None
        if self.has_critic:
            values = value_predictions(
                unwrapped.value_model, prompt_ids, completion_ids, pad_id, batch_size, model_inputs
            )
        has_stop = stopped(completion_ids, masks)
        if args.missing_eos_penalty is not None:
            scores = scores - args.missing_eos_penalty * (~has_stop).float()
        # step 5. advantages
        trajectories = self.make_trajectories(
            prompt_ids,
            completion_ids,
            old_logps,
            ref_logps,
            values,
            scores,
            ~has_stop,
            group,
            off_policy,
            temperatures=temperatures,
            across_ranks=across_ranks,
            model_inputs=model_inputs,
            completion_masks=masks,
            version=sampled.version,
            teacher_logps=teacher_logps,
            sampler_log_ratios=log_ratios,
        )
        tasks = [str(e["task"]) for e in examples] if all("task" in e for e in examples) else None
        return RolloutBatch(
            examples=examples,
            prompt_ids=prompt_ids,
            trajectories=trajectories,
            completion_ids=completion_ids,
            old_per_token_logps=old_logps,
            ref_per_token_logps=ref_logps,
            scores=scores,
            per_func=per_func,
            is_truncated=~has_stop,
            temperatures=temperatures,
            group=group,
            version=sampled.version,
            tasks=tasks,
            off_policy=off_policy if self.guidance is not None else None,
            on_policy_scores=on_policy_scores,
            kl=kl,
            completion_mask=masks,
            sampler_correction=correction,
            rewards=rewards,
        )

    def sampler_correction(
        self,
        trainer_logps: list[torch.Tensor],
        sampler_logps: list[torch.Tensor],
        completion_ids: list[torch.Tensor],
        masks: list[torch.Tensor] | None,
    ) -> SamplerCorrection:
        """The round's sampler/trainer mismatch correction (`vllm_importance_sampling_*`) over the policy's tokens of
        every completion the sampler returned: the per-token log-ratios trajectories carry (`sampler_log_ratio`; the
        training step turns them into weights, [`~trl_trapo.objectives.RLObjective`]) and the round's statistics.

        Args:
            trainer_logps (`list[torch.Tensor]`): `(C_i,)` the trainer's log-probs over the sampler's kept support.
            sampler_logps (`list[torch.Tensor]`): `(C_i,)` the sampler's (NaN: unknown).
            completion_ids (`list[torch.Tensor]`): `(C_i,)` the completions (for their lengths).
            masks (`list[torch.Tensor]`, *optional*): `(C_i,)` 1 on the policy's tokens; None: all.

        Returns:
            [`~trl_trapo.sampler_correction.SamplerCorrection`] over `(B, max C_i)` padded tensors.
        """
        args = self.args
        length = max(c.numel() for c in completion_ids)
        trainer = torch.zeros(len(completion_ids), length)
        sampler = torch.zeros(len(completion_ids), length)
        mask = torch.zeros(len(completion_ids), length)
        for i, c in enumerate(completion_ids):
            n = c.numel()
            trainer[i, :n], sampler[i, :n] = trainer_logps[i].float(), sampler_logps[i].float()
            mask[i, :n] = 1.0 if masks is None else masks[i].float()
        return correct_sampler_mismatch(
            trainer,
            sampler,
            mask,
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_max,
            args.vllm_importance_sampling_clip_min,
        )

    def make_trajectories(
        self,
        prompt_ids,
        completion_ids,
        old_logps,
        ref_logps,
        values,
        scores,
        is_truncated,
        group,
        off_policy=None,
        temperatures: torch.Tensor | None = None,
        across_ranks: bool = False,
        model_inputs: list[dict[str, torch.Tensor]] | None = None,
        completion_masks: list[torch.Tensor] | None = None,
        version: int = 0,
        teacher_logps: list[torch.Tensor] | None = None,
        sampler_log_ratios: list[torch.Tensor] | None = None,
    ) -> list[Trajectory]:
        """Advantages (GAE with a critic, with the KL in the per-token rewards when `kl_penalty="reward"`;
        group-relative over consecutive groups of `group` completions otherwise) and the trajectories of the
        completions that have a score. Arguments are lists of `(C_i,)` tensors and `(B,)` scores / flags
        (`off_policy`: demonstrations put in by guidance); `temperatures` `(B,)`: each completion's sampling
        temperature (a trajectory whose temperature is not the configured one carries it, for the training forward);
        `model_inputs`: each completion's prompt's extra model inputs, which its trajectory carries.
        `completion_masks`: `(C_i,)` each, 0 on tokens the policy did not sample (TRL's `env_mask`): they count in no
        loss and no KL, GAE steps over them (the score lands on the last model token), and every per-token field of
        the trajectory (behaviour, reference and teacher log-probs, advantages, returns, values) is 0 there;
        `version`: the policy version that sampled them, stamped on every trajectory. `sampler_log_ratios`: `(C_i,)`
        each, log pi_trainer - log pi_sampler per token of a round another engine sampled (0 off the policy's tokens
        and on demonstrations), carried by the trajectories for the mismatch weight.

        Statistics over the batch — `scale_rewards="batch"`'s standard deviation, `whiten_rewards`' and
        `whiten_advantages`' mean and variance — cover the whole round: with `across_ranks` every rank calls this
        at the same time with its share of one round and they are taken over all shares (collective), except the
        whitening under `whiten_per_process` (TRL 1.12 PPO's per-process whitening).
        """
        args = self.args
        batch = len(completion_ids)
        world_wide = across_ranks and self.accelerator.num_processes > 1
        reduce = (
            (lambda tensor: sum_over_ranks(self.accelerator, tensor))
            if world_wide and not args.whiten_per_process
            else None
        )
        length = max(max(c.numel() for c in completion_ids), 1)
        mask = torch.zeros(batch, length)
        old = torch.zeros(batch, length)
        ref = torch.zeros(batch, length)
        for i, c in enumerate(completion_ids):
            mask[i, : c.numel()] = 1
            old[i, : c.numel()] = old_logps[i]
            if ref_logps is not None:
                ref[i, : c.numel()] = ref_logps[i]
        policy_mask = mask  # (B, L): 1 on the tokens the policy sampled (every completion token without masks)
        if completion_masks is not None:
            policy_mask = torch.zeros(batch, length)
            for i, m in enumerate(completion_masks):
                policy_mask[i, : m.numel()] = m.float()
            old, ref = old * policy_mask, ref * policy_mask  # log-probs of the policy's tokens only
        kl = (
            kl_estimate(old, ref, self.kl_estimator) * policy_mask if ref_logps is not None else torch.zeros_like(mask)
        )
        kl_coef_reward = self.kl_coef() if (self.kl_penalty == "reward" and ref_logps is not None) else 0.0
        valid = ~torch.isnan(scores)
        safe_scores = torch.nan_to_num(scores, nan=0.0)
        returns = old_values = None
        if self.has_critic:
            value_tensor = torch.zeros(batch, length)
            for i, v in enumerate(values):
                value_tensor[i, : v.numel()] = v
            # the actions are the policy's tokens: the score lands on the last one, GAE steps over the environment's
            rewards, _ = per_token_rewards(safe_scores, kl, policy_mask, kl_coef_reward)
            train_mask = policy_mask * valid.unsqueeze(1)
            # whitening needs 2 counted tokens in the whole batch it covers (every rank takes the same branch)
            whiten = (reduce or (lambda tensor: tensor))(train_mask.sum()) >= 2
            if args.whiten_rewards and whiten:
                rewards = masked_whiten(rewards, train_mask, shift_mean=False, reduce=reduce) * train_mask
            advantages, returns = gae_advantages(rewards, value_tensor, train_mask, args.gamma, args.lam)
            if args.whiten_advantages and whiten:
                advantages = masked_whiten(advantages, train_mask, reduce=reduce) * train_mask
            old_values = value_tensor * policy_mask if completion_masks is not None else value_tensor
        else:
            sequence_reward = scores - kl_coef_reward * kl.sum(dim=1)
            batch_rewards = None  # GRPO's "batch" std is over the whole round: every rank's share of it
            if args.scale_rewards == "batch" and world_wide:
                batch_rewards = gather_across_ranks(self.accelerator, sequence_reward)
            advantages = group_relative_advantages(sequence_reward, group, args.scale_rewards, batch_rewards)
            advantages = advantages.unsqueeze(1).expand(batch, length) * policy_mask
        # (B,) bool: sampled at another temperature than the configured one (compared in the float32 it was applied in)
        own_temperature = None if temperatures is None else temperatures != torch.tensor(args.temperature).float()
        trajectories = []
        for i in range(batch):
            if not valid[i]:
                continue
            n = completion_ids[i].numel()
            counted = policy_mask[i, :n].clone()
            if args.mask_truncated_completions and bool(is_truncated[i]):
                counted.zero_()
            trajectories.append(
                Trajectory(
                    prompt_ids=prompt_ids[i],
                    completion_ids=completion_ids[i],
                    completion_mask=counted,
                    old_per_token_logps=old[i, :n].clone(),
                    advantages=advantages[i, :n].clone().float(),
                    ref_per_token_logps=ref[i, :n].clone() if ref_logps is not None else None,
                    returns=returns[i, :n].clone().float() if self.has_critic else None,
                    old_values=old_values[i, :n].clone().float() if self.has_critic else None,
                    off_policy=bool(off_policy[i]) if off_policy is not None else False,
                    temperature=float(temperatures[i]) if own_temperature is not None and own_temperature[i] else None,
                    model_inputs=dict(model_inputs[i]) if model_inputs is not None else {},
                    version=version,
                    teacher_per_token_logps=None
                    if teacher_logps is None
                    else teacher_logps[i][:n].clone().float()
                    if completion_masks is None
                    else teacher_logps[i][:n].float() * policy_mask[i, :n],
                    sampler_log_ratio=None
                    if sampler_log_ratios is None
                    else sampler_log_ratios[i][:n].float() * policy_mask[i, :n],
                )
            )
        return trajectories

    def state_dict(self) -> dict[str, torch.Generator]:
        """The generators to checkpoint (name -> generator)."""
        return {"generation": self.generator}


__all__ = [
    "DEFAULT_VLLM_SERVER_URL",
    "SLOW_ROUND_SECONDS",
    "RolloutBatch",
    "RolloutEngine",
    "VLLMGenerator",
    "VLLMServerError",
    "prompt_model_inputs",
    "rollout_generation_config",
    "sampled_token_logps",
    "stop_token_ids",
    "unreachable_errors",
    "vllm_generation_kwargs",
    "vllm_server_unreachable",
    "vllm_server_url",
    # the transformers sampler's primitives (trl_trapo/samplers.py), importable from here as before they moved
    "BehaviourLogprobRecorder",
    "RowTemperatureLogitsWarper",
    "cut_after_stop",
    "generate",
    "neutral_generation_defaults",
    "row_temperatures",
    "truncate_at_stop",
]
