# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Model plumbing: the policy + critic wrapper and the policy's reference (frozen model or frozen adapter copy)."""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn


logger = logging.getLogger(__name__)

REF_ADAPTER = "trapo_ref"


class PolicyAndValueWrapper(nn.Module):
    """Holds the policy and the critic so one optimizer, one DDP/DeepSpeed wrapper and one backward cover both.

    Exposes `policy` and `value_model` as TRL's former `PPOTrainer` did (`trainer.model.policy`,
    `trainer.model.value_model`). `forward` runs the policy on every row and the critic on the rows listed in
    `value_rows` only (RL rows), and returns `(policy_outputs, values)` with `values` of shape `(len(value_rows), L)`.

    Args:
        policy (`nn.Module`): the causal LM (or `PeftModel`).
        value_model (`nn.Module`): a sequence-classification model (`num_labels=1`) used per token.
    """

    def __init__(self, policy: nn.Module, value_model: nn.Module):
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.config = policy.config

    def forward(self, input_ids, attention_mask, value_rows: torch.Tensor | None = None, **kwargs):
        from .rollout import per_token_head_outputs

        outputs = self.policy(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        values = None
        if value_rows is not None and value_rows.numel() > 0:
            values = per_token_head_outputs(
                self.value_model, input_ids[value_rows], attention_mask[value_rows], grad=torch.is_grad_enabled()
            )
        return outputs, values

    def state_dict(self, *args, **kwargs):
        """The module's state dict without aliases: a tensor shared by several keys (tied embeddings) appears once.

        Safetensors refuses shared tensors; loading back with `strict=False` restores the alias through the tie.
        """
        state = super().state_dict(*args, **kwargs)
        seen: set[tuple[int, int]] = set()
        for key in list(state):
            tensor = state[key]
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta" or tensor.numel() == 0:
                continue
            identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            if identity in seen:
                del state[key]
            else:
                seen.add(identity)
        return state

    # Delegation used by `generate`, gradient checkpointing and `unwrap_model_for_generation`.
    def generate(self, *args, **kwargs):
        return self.policy.generate(*args, **kwargs)

    @property
    def is_gradient_checkpointing(self) -> bool:
        return bool(getattr(self.policy, "is_gradient_checkpointing", False))

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        """Called by `Trainer.train` (transformers 5.24) when `gradient_checkpointing` is on, the default of TRL's
        configs; `kwargs` (`every_n_layers`, `offload`) are passed on to both models."""
        for module in (self.policy, self.value_model):
            if hasattr(module, "activation_checkpointing_enable"):
                module.activation_checkpointing_enable(activation_checkpointing_kwargs, **kwargs)
            elif hasattr(module, "gradient_checkpointing_enable"):
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=activation_checkpointing_kwargs)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self):
        for module in (self.policy, self.value_model):
            if hasattr(module, "gradient_checkpointing_disable"):
                module.gradient_checkpointing_disable()

    @property
    def generation_config(self):
        return self.policy.generation_config


def add_frozen_adapter_copy(peft_model, source: str, name: str = REF_ADAPTER) -> str:
    """Add a frozen copy of adapter `source` under `name` to a `PeftModel`, to serve as the reference policy.

    "Adapter disabled" is the base model, which is the right reference only when the adapter starts at zero. A
    policy whose adapter was already trained (e.g. by SFT) must be compared with that trained adapter, so we copy it
    once, freeze the copy and switch to it for reference forwards.

    Returns:
        `str`: the name of the reference adapter.
    """
    config = copy.deepcopy(peft_model.peft_config[source])
    config.inference_mode = True
    peft_model.add_adapter(name, config)
    source_state = {k: v for k, v in peft_model.state_dict().items() if f".{source}." in k}
    copied = {k.replace(f".{source}.", f".{name}."): v.detach().clone() for k, v in source_state.items()}
    missing = [k for k in copied if k not in dict(peft_model.named_parameters()) and k not in peft_model.state_dict()]
    if missing:
        raise RuntimeError(f"Could not map adapter '{source}' to its reference copy; unmatched keys: {missing[:3]}")
    peft_model.load_state_dict(copied, strict=False)
    for param_name, param in peft_model.named_parameters():
        if f".{name}." in param_name:
            param.requires_grad_(False)
    peft_model.set_adapter(source)
    # `set_adapter` may mark only the active adapter trainable; make sure the copy stays frozen.
    for param_name, param in peft_model.named_parameters():
        if f".{name}." in param_name:
            param.requires_grad_(False)
    logger.info("Reference policy: frozen copy '%s' of the trained adapter '%s'.", name, source)
    return name
