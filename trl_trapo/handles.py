# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""How the run's collaborators reach the model the `Trainer` trains.

The `Trainer` replaces its model handles as it runs (`model_wrapped` becomes the DDP / DeepSpeed engine when
`train()` prepares it), so a collaborator never keeps the model itself: it keeps a [`ModelHandles`] and asks it each
time — for the policy (unwrapped, without the critic), for the trained model unwrapped for generation (ZeRO-3 weights
gathered), or to prepare a frozen model the way the `Trainer` prepared the trained one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from accelerate.utils import is_peft_model
from torch import nn
from trl.models import prepare_deepspeed, unwrap_model_for_generation

from .models import PolicyAndValueWrapper, quiet_checkpointing_deprecation
from .vision import restore_converted_weights


logger = logging.getLogger(__name__)


def policy_of(model: nn.Module) -> nn.Module:
    """The policy inside the trained model (the model itself without a critic)."""
    return model.policy if isinstance(model, PolicyAndValueWrapper) else model


class ModelHandles:
    """The trained model as the collaborators reach it, read from the `Trainer` at each call.

    Args:
        accelerator (`accelerate.Accelerator`): the `Trainer`'s.
        model (`Callable[[], nn.Module]`): returns the `Trainer`'s `model` (the policy, or a
            [`~trl_trapo.models.PolicyAndValueWrapper`] with a critic).
        model_wrapped (`Callable[[], nn.Module]`): returns the `Trainer`'s `model_wrapped` (DDP / DeepSpeed engine).
        gather_for_generation (`bool`): gather ZeRO-3 weights for rollouts (`ds3_gather_for_generation`).
        deepspeed (`bool`): the `Trainer` runs under DeepSpeed (frozen models are prepared by TRL's
            `prepare_deepspeed`).
    """

    def __init__(
        self,
        accelerator: Any,
        model: Callable[[], nn.Module],
        model_wrapped: Callable[[], nn.Module],
        gather_for_generation: bool,
        deepspeed: bool,
    ):
        self.accelerator = accelerator
        self.model = model
        self.model_wrapped = model_wrapped
        self.gather_for_generation = gather_for_generation
        self.deepspeed = deepspeed

    def policy(self) -> nn.Module:
        """The policy, unwrapped from DDP / DeepSpeed and from the policy-and-critic wrapper."""
        return policy_of(self.accelerator.unwrap_model(self.model()))

    def prepare_frozen(self, module: nn.Module) -> nn.Module:
        """A frozen model (reference, teacher, reward model) prepared for evaluation as the trained one is."""
        if self.deepspeed:
            return prepare_deepspeed(module, self.accelerator)
        return self.accelerator.prepare_model(module, evaluation_mode=True)

    @contextmanager
    def for_rollouts(self) -> Iterator[nn.Module]:
        """The trained model unwrapped for generation (weights gathered under ZeRO-3 when
        `ds3_gather_for_generation`), in eval mode for the duration."""
        with self.unwrapped_for_generation(self.gather_for_generation) as unwrapped:
            was_training = unwrapped.training
            unwrapped.eval()
            try:
                yield unwrapped
            finally:
                unwrapped.train(was_training)

    @contextmanager
    def policy_for_eval(self, gather: bool) -> Iterator[nn.Module]:
        """The policy unwrapped for generation (ZeRO-3 weights gathered when `gather`), in eval mode."""
        with self.unwrapped_for_generation(gather) as unwrapped:
            policy = policy_of(unwrapped)
            was_training = policy.training
            policy.eval()
            try:
                yield policy
            finally:
                policy.train(was_training)

    @contextmanager
    def unwrapped_for_generation(self, gather: bool) -> Iterator[nn.Module]:
        """TRL's `unwrap_model_for_generation` of `model_wrapped`, without transformers' checkpointing warning."""
        with (
            quiet_checkpointing_deprecation(),
            unwrap_model_for_generation(
                self.model_wrapped(), self.accelerator, gather_deepspeed3_params=gather
            ) as unwrapped,
        ):
            yield unwrapped

    def restore_converted_weights(self, checkpoint_dir: str) -> None:
        """Load a checkpoint's model weights through `from_pretrained` when the Trainer's plain `load_state_dict`
        cannot (a file in the architecture's original key layout, as transformers saves LLaVA; see
        [`~trl_trapo.vision.restore_converted_weights`]). PEFT adapters and a policy-and-critic pair are saved in the
        Trainer's own layout and left to it."""
        model = self.accelerator.unwrap_model(self.model())
        if is_peft_model(model) or isinstance(model, PolicyAndValueWrapper):
            return
        if restore_converted_weights(model, checkpoint_dir):
            logger.info("Loaded the weights of %s through from_pretrained (key conversion).", checkpoint_dir)
