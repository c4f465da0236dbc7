# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Construction helpers of `TRAPOTrainer`: tokenizer checks, the reference policy (creation and preparation) and the
rollout generation config.

`SetupMixin` is one of `TRAPOTrainer`'s bases; its methods are the trainer's own and use its attributes.
"""

from __future__ import annotations

import logging
import os

from torch import nn
from transformers import AutoModelForCausalLM, GenerationConfig
from trl.models import prepare_deepspeed

from .config import TRAPOConfig
from .data import dataset_columns
from .distributed import zero3_reference_copy


logger = logging.getLogger("trl_trapo.trainer")  # the trainer's logger: these are TRAPOTrainer's methods


class SetupMixin:
    """`TRAPOTrainer`'s construction helpers (called from `TRAPOTrainer.__init__`)."""

    # =================================================================================================================
    # Construction helpers
    # =================================================================================================================
    @staticmethod
    def _check_eval_dataset(eval_dataset) -> None:
        """Raise `ValueError` before training if an eval dataset has no column TRAPO can evaluate (`prompt` /
        `input_ids`: greedy rewards; `text`: pretraining loss; `completion` / `messages`: SFT loss)."""
        datasets = eval_dataset.items() if isinstance(eval_dataset, dict) else [("eval_dataset", eval_dataset)]
        for name, dataset in datasets:
            columns = set(dataset_columns(dataset)) if dataset is not None else None
            if columns is not None and not columns & {"prompt", "input_ids", "text", "completion", "messages"}:
                raise ValueError(
                    f"`{name}` has columns {sorted(columns)}, none of which TRAPO can evaluate: give 'prompt' "
                    "(greedy rewards), 'text' (pretraining loss) or 'prompt'+'completion' / 'messages' (SFT loss)."
                )

    @staticmethod
    def _check_tokenizer(tokenizer) -> None:
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError(
                "`processing_class` has no EOS token (eos_token_id is None); TRAPO needs one to end completions and "
                "separate pretraining documents. Set `tokenizer.eos_token`."
            )
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "`processing_class.pad_token` is None. Set one before creating the trainer, e.g. "
                "`tokenizer.pad_token = tokenizer.eos_token` (safe with TRAPO: its masks come from lengths, never from "
                "the pad id) or add a dedicated pad token and resize the model's embeddings."
            )
        if tokenizer.pad_token_id == tokenizer.eos_token_id:
            logger.warning(
                "The tokenizer's pad token is its EOS token (id %d). TRAPO builds every mask from sequence lengths, "
                "so EOS tokens are still trained on and rewards are still read at the EOS.",
                tokenizer.eos_token_id,
            )

    @staticmethod
    def _create_reference(model: nn.Module, model_id: str | None, args: TRAPOConfig) -> nn.Module:
        """A frozen reference policy without deep-copying a model that ZeRO-3 may already have partitioned."""
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        if is_deepspeed_zero3_enabled():
            if not model_id or not (os.path.isdir(model_id) or "/" in model_id or not os.path.exists(model_id)):
                if any(hasattr(p, "ds_id") for p in model.parameters()):  # partitioned, e.g. built from a config
                    return zero3_reference_copy(model)  # rebuilt from the config, filled parameter by parameter
                raise ValueError(
                    "Under DeepSpeed ZeRO-3 the reference model cannot be deep-copied from the (partitioned) policy; "
                    "pass `ref_model` explicitly or pass `model` as a model id / path."
                )
            return AutoModelForCausalLM.from_pretrained(model_id, **(args.model_init_kwargs or {}))
        import copy

        return copy.deepcopy(model)

    def _prepare_frozen(self, module: nn.Module) -> nn.Module:
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(module, self.accelerator)
        return self.accelerator.prepare_model(module, evaluation_mode=True)

    @staticmethod
    def _build_generation_config(args: TRAPOConfig, tokenizer) -> GenerationConfig:
        stop_id = args.stop_token_id if args.stop_token_id is not None else tokenizer.eos_token_id
        kwargs = dict(
            max_new_tokens=args.response_length,
            do_sample=True,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=stop_id if (args.stop_token or args.stop_token_id is not None) else None,
            bos_token_id=tokenizer.bos_token_id,
            use_cache=True,
        )
        kwargs.update(args.generation_kwargs or {})
        return GenerationConfig(**kwargs)
