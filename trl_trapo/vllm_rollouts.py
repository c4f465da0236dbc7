# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Rollout generation with vLLM, through TRL's `VLLMGeneration` (GPU only; `use_vllm=True`).

vLLM only samples the completions. Everything else stays TRAPO's: completions are cut after the stop token, and the
behaviour log-probs are recomputed by the training policy (the same forward as the HF-`generate` path's), so the
PPO ratio of a fresh rollout is exactly 1 and kernel differences between vLLM and the trainer cannot bias it.
The policy's weights (LoRA adapters merged) are pushed to vLLM before the first generation round of every optimizer
step; TRL's `VLLMGeneration` gathers ZeRO-3 / FSDP shards parameter by parameter while doing so.

Not tested on this project's CPU machines (vLLM needs a GPU); `scripts/gpu_check.py` exercises it when vLLM is
importable. Differences from the HF path: sampling is seeded by vLLM, not by the trainer's checkpointed generator,
so a resumed run does not draw the same completions; with `top_p < 1` or `top_k > 0` the recomputed behaviour
log-probs are those of the temperature-scaled distribution, not of the truncated one vLLM sampled from.
"""

from __future__ import annotations

import os

import torch
from trl.import_utils import is_vllm_available


class VLLMRollouts:
    """Completions from vLLM for lists of prompt token ids, with the weights synced once per optimizer step.

    Args:
        trainer: the [`TRAPOTrainer`] (policy, accelerator, tokenizer and `args`).

    Raises:
        ImportError: if vLLM is not installed.
        ValueError: if the policy was not loaded from a directory or Hub id (vLLM loads the model itself).
    """

    def __init__(self, trainer):
        if not is_vllm_available():
            raise ImportError(
                "TRAPOConfig.use_vllm=True needs vLLM, which is not installed: `pip install vllm` on a GPU machine, "
                "or set use_vllm=False (rollouts then use transformers' generate)."
            )
        from trl.generation.vllm_generation import VLLMGeneration

        args = trainer.args
        policy = trainer._unwrapped_policy()
        name = getattr(policy, "name_or_path", None) or ""
        if not (os.path.isdir(name) or (name.count("/") == 1 and not os.path.exists(name))):
            raise ValueError(
                f"TRAPOConfig.use_vllm=True: vLLM loads the model from its directory or Hub id, but the policy's "
                f"name_or_path is {name!r}. Save the model with `save_pretrained(path)` and pass `model=path`."
            )
        generation_kwargs = {}
        if args.stop_token_id is not None:
            generation_kwargs["stop_token_ids"] = [args.stop_token_id]
        generation_kwargs.update(args.generation_kwargs or {})
        self.generation = VLLMGeneration(
            model=policy,
            accelerator=trainer.accelerator,
            processing_class=trainer.processing_class,
            mode=args.vllm_mode,
            server_base_url=args.vllm_server_base_url,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_length=args.vllm_max_model_length or args.max_prompt_length + args.response_length,
            enable_sleep_mode=args.vllm_enable_sleep_mode,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_completion_length=args.response_length,
            logprobs=0,
            generation_kwargs=generation_kwargs,
        )
        self._synced_step: int | None = None

    def generate(self, prompt_ids: list[list[int]], group: int, step: int) -> list[torch.Tensor]:
        """Sample one completion per prompt (prompts come in consecutive groups of `group` copies).

        Collective (weight sync gathers sharded parameters; server mode gathers prompts): every rank calls it.

        Returns:
            `list[torch.Tensor]`: `(C_i,)` completion token ids, uncut (the caller cuts after the stop token).
        """
        if self._synced_step != step:
            self.generation.sync_weights()
            self._synced_step = step
        _, completion_ids, _, _ = self.generation.generate(prompts=prompt_ids, images=None, num_generations=group)
        return [torch.tensor(list(c), dtype=torch.long) for c in completion_ids]
