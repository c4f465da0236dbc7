# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Model plumbing: the policy + critic wrapper, the reference policy (a frozen model or a frozen adapter copy), and the
no-grad forwards of policy, reference, critic and reward models that rollouts need.

Shapes: `B` sequences, `P_i` / `C_i` prompt / completion tokens of sequence i, `L` padded length. Every mask comes from
lengths, never from comparing ids with the pad id, so tokenizers whose pad token equals their EOS token are handled
correctly; sequence-classification heads are read per position and indexed at the last real token ourselves for the
same reason.

Every forward TRAPO runs goes through [`model_forward`]: the training forward, reference and behaviour log-probs,
critic values, reward models, evaluation and few-shot prompt embeddings. It passes each batch's extra model inputs (a
vision-language model's `pixel_values` ..., see [`~trl_trapo.collator.combine_model_inputs`]) to the model, so a
model that needs more than `input_ids` gets it everywhere; rollouts pass them to `generate` the same way.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn
from transformers import PreTrainedModel
from trl.trainer.callbacks import SyncRefModelCallback
from trl.trainer.utils import disable_dropout_in_model, selective_log_softmax, use_adapter

from .collator import combine_model_inputs
from .sampler_correction import kept_support_logps


logger = logging.getLogger(__name__)


@contextlib.contextmanager
def quiet_checkpointing_deprecation() -> Iterator[None]:
    """Silence the FutureWarning transformers 5.24 raises when TRL's `unwrap_model_for_generation` or PEFT's
    `get_peft_model` reads the deprecated `is_gradient_checkpointing`, or TRL turns activation checkpointing off and on
    around generation with `gradient_checkpointing_disable` / `_enable` (every generation round / LoRA run would warn,
    and the user can do nothing about it)."""
    with warnings.catch_warnings():
        # `is_gradient_checkpointing`, `gradient_checkpointing_disable` / `_enable` (TRL toggles checkpointing off
        # around generation through the deprecated names)
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        yield


REF_ADAPTER = "trapo_ref"


def model_input_kwargs(
    model_inputs: Mapping[str, torch.Tensor] | None, device: torch.device, taken: Iterable[str] = ()
) -> dict[str, torch.Tensor]:
    """Keyword arguments of a forward or `generate` call from a batch's extra model inputs, on `device`.

    Args:
        model_inputs (`Mapping[str, torch.Tensor]`, *optional*): name -> tensor, combined over the batch's rows
            (see [`~trl_trapo.collator.combine_model_inputs`]).
        device (`torch.device`): the device of `input_ids` (a tensor already there is passed as it is).
        taken (`Iterable[str]`): the call's other keyword arguments, which a model input must not replace.

    Raises:
        ValueError: if a model input is named `input_ids`, `attention_mask` or one of `taken`.
    """
    if not model_inputs:
        return {}
    reserved = {"input_ids", "attention_mask", *taken}
    clash = sorted(reserved & set(model_inputs))
    if clash:
        raise ValueError(
            f"Model inputs {clash} would replace arguments TRAPO sets itself; rename them in the processor's output."
        )
    return {name: value.to(device) for name, value in model_inputs.items()}


def model_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    model_inputs: Mapping[str, torch.Tensor] | None = None,
    **kwargs,
):
    """The one forward call of every model TRAPO runs: `model(input_ids=, attention_mask=, **kwargs,
    **model_inputs)`.

    Args:
        model (`nn.Module`): a causal LM, a sequence-classification model, a decoder body, or the
            [`PolicyAndValueWrapper`] (possibly wrapped by DDP / DeepSpeed).
        input_ids (`torch.Tensor`): `(B, L)` token ids.
        attention_mask (`torch.Tensor`): `(B, L)`, 1 on real tokens.
        model_inputs (`Mapping[str, torch.Tensor]`, *optional*): the rows' extra model inputs (e.g. `pixel_values`
            `(sum_i N_i, ...)`), combined by [`~trl_trapo.collator.combine_model_inputs`] in the order of the rows;
            moved to `input_ids`' device.
        **kwargs: the call's own arguments (`use_cache`, `output_hidden_states`, `position_ids`, `value_rows` ...).

    Returns:
        the model's output.

    Raises:
        ValueError: if a model input would replace `input_ids`, `attention_mask` or one of `kwargs`.
    """
    extra = model_input_kwargs(model_inputs, input_ids.device, kwargs)
    return model(input_ids=input_ids, attention_mask=attention_mask, **kwargs, **extra)


class PolicyAndValueWrapper(nn.Module):
    """Holds the policy and the critic so one optimizer, one DDP/DeepSpeed wrapper and one backward cover both.

    Exposes `policy` and `value_model` as TRL's former `PPOTrainer` did (`trainer.model.policy`,
    `trainer.model.value_model`). `forward` runs the policy on every row and the critic on the rows listed in
    `value_rows` only (RL rows), and returns `(policy_outputs, values)` with `values` of shape `(len(value_rows), L)`.
    Its keyword arguments other than `value_rows`, `use_cache` and `output_hidden_states` are the rows' extra model
    inputs (see [`model_forward`]), which both models get; as they are combined over all rows (and cannot be split
    by row here), the critic then runs on every row and its values are selected afterwards.

    Args:
        policy (`nn.Module`): the causal LM (or `PeftModel`).
        value_model (`nn.Module`): a sequence-classification model (`num_labels=1`) used per token.
    """

    def __init__(self, policy: nn.Module, value_model: nn.Module):
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.config = policy.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        value_rows: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **model_inputs,
    ):
        flags = {"use_cache": use_cache, "output_hidden_states": output_hidden_states}
        flags = {name: value for name, value in flags.items() if value is not None}
        outputs = model_forward(self.policy, input_ids, attention_mask, model_inputs, **flags)
        values = None
        if value_rows is not None and value_rows.numel() > 0:
            grad = torch.is_grad_enabled()
            if model_inputs:  # combined over every row: the critic sees every row, the RL rows' values are kept
                values = per_token_head_outputs(self.value_model, input_ids, attention_mask, grad, model_inputs)
                values = values[value_rows]
            else:
                values = per_token_head_outputs(
                    self.value_model, input_ids[value_rows], attention_mask[value_rows], grad=grad
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
        return self.is_activation_checkpointing

    @property
    def is_activation_checkpointing(self) -> bool:
        return bool(getattr(self.policy, "is_activation_checkpointing", False))

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


class CountedPositionHead:
    """Runs a causal LM's output layer only at the positions a loss counts.

    A training forward needs logits at the positions whose next token is counted (completion tokens of RL rows,
    completion tokens of SFT rows, text tokens of pretraining rows), not at prompts or padding. With a large
    vocabulary the output layer and the log-softmax over its `(B, T, V)` logits dominate memory (SmolLM2: 49,152 x 4
    bytes = 192 KiB per position, three copies live in the backward). Inside `restrict(counted)` a forward pre-hook on
    the model's output embeddings (`get_output_embeddings()`) hands it `hidden[:, :-1][counted]` instead of
    `hidden`, so the model returns logits of shape `(N, V)`, N = `counted.sum()`, in the order of `counted.nonzero()`.
    The model's own forward (and so DDP's and DeepSpeed's hooks) is unchanged.

    A model whose output layer receives something else than the `(B, T + 1, H)` hidden states (a custom head) is left
    alone: the forward returns its usual `(B, T + 1, V)` logits and the caller selects the counted positions itself;
    `applies(logits, counted)` tells which of the two happened.

    Args:
        policy (`nn.Module`): the causal LM (or `PeftModel`); without `get_output_embeddings()` nothing is restricted.
    """

    def __init__(self, policy: nn.Module):
        getter = getattr(policy, "get_output_embeddings", None)
        self.head = getter() if callable(getter) else None

    @contextlib.contextmanager
    def restrict(self, counted: torch.Tensor) -> Iterator[None]:
        """Compute the next forward's logits only where `counted` (`(B, T)` bool: position t predicts token t + 1)."""
        if self.head is None:
            yield
            return
        expected = (counted.shape[0], counted.shape[1] + 1)

        def select_counted(module, args, kwargs):
            hidden = args[0] if args else None
            if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or tuple(hidden.shape[:2]) != expected:
                return None  # not the hidden states this forward was restricted for: leave the head alone
            return (hidden[:, :-1][counted],) + tuple(args[1:]), kwargs

        handle = self.head.register_forward_pre_hook(select_counted, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    @staticmethod
    def applies(logits: torch.Tensor, counted: torch.Tensor) -> bool:
        """Whether `logits` (a restricted forward's output) are the counted positions' `(N, V)` logits."""
        return logits.dim() == 2 and logits.shape[0] == int(counted.sum())


def counted_log_probs(logits: torch.Tensor, targets: torch.Tensor, chunk_tokens: int = 512) -> torch.Tensor:
    """log softmax(logits)[target] per counted token, in fp32, `chunk_tokens` tokens at a time.

    TRL's `selective_log_softmax` (fused kernel where available) on `(1, chunk, V)` slices: its memory-saving loop runs
    over the leading dimension, which for `(N, V)` inputs would be one Python iteration per token.

    Args:
        logits (`torch.Tensor`): `(N, V)`.
        targets (`torch.Tensor`): `(N,)` token ids.
        chunk_tokens (`int`): tokens per log-softmax call (peak extra memory: chunk_tokens x V floats).

    Returns:
        `torch.Tensor`: `(N,)` log-probabilities in nats (fp32).
    """
    logits = logits if logits.dtype == torch.float32 else logits.float()
    if logits.shape[0] == 0:
        return logits.new_zeros((0,)) + logits.sum() * 0  # keeps the graph (every rank must reach the output layer)
    parts = [
        selective_log_softmax(chunk.unsqueeze(0), index.unsqueeze(0)).squeeze(0)
        for chunk, index in zip(logits.split(chunk_tokens), targets.split(chunk_tokens), strict=True)
    ]
    return torch.cat(parts)


def in_adapter(parameter_name: str, adapter: str) -> bool:
    """Whether `parameter_name` (a `named_parameters()` / `state_dict()` key of a `PeftModel`) belongs to adapter
    `adapter`: the name is one of its dotted parts. A LoRA linear layer's weight is `...q_proj.lora_A.<adapter>.weight`
    (a `ModuleDict` entry), but a LoRA embedding's is `...embed_tokens.lora_embedding_A.<adapter>` and
    `trainable_token_indices`' is `...token_adapter.trainable_tokens_delta.<adapter>` (`ParameterDict` entries, the
    adapter name last): a test for `".<adapter>."` misses them."""
    return adapter in parameter_name.split(".")


def adapter_renamed(parameter_name: str, source: str, target: str) -> str:
    """`parameter_name` of adapter `source` as the same parameter of adapter `target` (see [`in_adapter`])."""
    return ".".join(target if part == source else part for part in parameter_name.split("."))


class ReferencePolicy:
    """The reference policy of the KL term: a frozen model, or a frozen adapter of a PEFT policy.

    Args:
        model (`nn.Module`, *optional*): a frozen reference model, prepared for inference (may be wrapped by DeepSpeed).
        adapter (`str`, *optional*): with a PEFT policy and no `model`, the name of the frozen reference adapter, or
            `""` for "adapter disabled" (the base model: the right reference for a freshly created adapter).
        unwrap (`Callable`, *optional*): maps the prepared `model` to the plain module (the Trainer's
            `accelerator.unwrap_model`); identity when None.

    Raises:
        ValueError: if neither or both of `model` and `adapter` are given.
    """

    def __init__(self, model: nn.Module | None = None, adapter: str | None = None, unwrap=None):
        if (model is None) == (adapter is None):
            raise ValueError("ReferencePolicy needs exactly one of `model` and `adapter`.")
        self.model = model
        self.adapter = adapter
        self.unwrap = unwrap or (lambda module: module)

    def logps(
        self,
        policy: nn.Module,
        prompt_ids: Sequence[torch.Tensor],
        completion_ids: Sequence[torch.Tensor],
        pad_token_id: int,
        temperature: float | Sequence[float] | torch.Tensor,
        batch_size: int,
        model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
    ) -> list[torch.Tensor]:
        """log pi_ref(y_t | prompt, y_<t) of each completion token, `(C_i,)` each, float32 on CPU (see
        [`completion_logps`]; `temperature`: one, or one per completion; `model_inputs`: each completion's prompt's
        extra model inputs); `policy` is the unwrapped policy, used with its reference adapter when there is no
        reference model."""
        if self.model is not None:
            return completion_logps(
                self.model, prompt_ids, completion_ids, pad_token_id, temperature, batch_size, model_inputs
            )
        with use_adapter(policy, self.adapter or None):
            return completion_logps(
                policy, prompt_ids, completion_ids, pad_token_id, temperature, batch_size, model_inputs
            )

    @property
    def syncable(self) -> bool:
        """Whether `sync` can move this reference (a model, or a named adapter copy; not "adapter disabled")."""
        return self.model is not None or bool(self.adapter)

    def state_tensors(self, policy: nn.Module) -> dict[str, torch.Tensor]:
        """CPU copies of the reference's weights, for checkpoints of a run whose reference moves (`sync_ref_model`):
        `ref_model/<name>` (gathered parameter by parameter under ZeRO-3; collective) or `ref_adapter/<name>`."""
        from .distributed import full_state_dict

        if self.model is not None:
            return {f"ref_model/{k}": v for k, v in full_state_dict(self.unwrap(self.model)).items()}
        return {
            f"ref_adapter/{n}": p.detach().cpu().clone()
            for n, p in policy.named_parameters()
            if in_adapter(n, self.adapter)
        }

    def load_state_tensors(self, policy: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` wrote (entries of other prefixes are ignored; collective under ZeRO-3)."""
        from .distributed import load_full_state_dict

        model_state = {k[len("ref_model/") :]: v for k, v in tensors.items() if k.startswith("ref_model/")}
        if model_state and self.model is not None:
            load_full_state_dict(self.unwrap(self.model), model_state)
        adapter_state = {k[len("ref_adapter/") :]: v for k, v in tensors.items() if k.startswith("ref_adapter/")}
        if adapter_state and self.adapter:
            params = dict(policy.named_parameters())
            with torch.no_grad():
                for name, value in adapter_state.items():
                    params[name].copy_(value.to(params[name].device, params[name].dtype))

    def sync(self, policy: nn.Module, alpha: float) -> None:
        """ref <- alpha * policy + (1 - alpha) * ref (TR-DPO, huggingface.co/papers/2404.09656): TRL's own update
        for a reference model (it gathers ZeRO-3 parameters), a parameter-wise update of the reference adapter from
        the policy's active adapter otherwise."""
        if self.model is not None:
            SyncRefModelCallback.sync_target_model(policy, self.unwrap(self.model), alpha)
            return
        source, target = policy.active_adapter, self.adapter
        params = dict(policy.named_parameters())
        with torch.no_grad():
            for name, param in params.items():
                if in_adapter(name, source):
                    params[adapter_renamed(name, source, target)].mul_(1.0 - alpha).add_(param, alpha=alpha)


def embedding_rows(model: nn.Module | None) -> int | None:
    """The rows of `model`'s input embedding matrix (`get_input_embeddings().num_embeddings`): the token ids it can
    read are [0, rows). None for a model without one.

    An adapted embedding is read through its PEFT wrapper: a LoRA `Embedding` (`target_modules=["embed_tokens"]`)
    keeps the table in its `base_layer`, a `TrainableTokensWrapper` (`trainable_token_indices`) in its
    `original_module`; neither has `num_embeddings` itself.
    """
    getter = getattr(model, "get_input_embeddings", None)
    module = getter() if getter is not None else None
    for _ in range(8):  # a wrapper of a wrapper at most a few levels deep
        if module is None:
            return None
        rows = getattr(module, "num_embeddings", None)
        if isinstance(rows, int):
            return rows
        module = getattr(module, "base_layer", None) or getattr(module, "original_module", None)
    return None


def check_vocabularies(
    tokenizer,
    policy: nn.Module,
    reference: nn.Module | None = None,
    readers: Sequence[tuple[str, nn.Module | None]] = (),
    stop_ids: Sequence[tuple[str, Sequence[int]]] = (),
) -> None:
    """Refuse, before training, every token id a run would look up outside an embedding matrix or sample outside the
    policy's vocabulary (V = the policy's input embedding rows). Each of these otherwise builds and then fails at the
    first step ("IndexError: index out of range in self") or trains with a stop condition that can never fire.

    Args:
        tokenizer: the policy's (text) tokenizer. Every id it can produce (`len(tokenizer)` ids and its special ids)
            must lie in [0, V), except the pad id: a pad token added without resizing (TRL 1.12's PPO example) is
            never looked up (see [`embedding_safe_pad_id`]).
        policy (`nn.Module`): the policy (or `PeftModel`).
        reference (`nn.Module`, *optional*): the reference model: its log-probs are read at the policy's tokens, so it
            must have the policy's V rows (as the distillation teacher).
        readers (`Sequence[tuple[str, nn.Module | None]]`): (argument name, model) of each model fed the policy's
            token ids (the value model, reward models without their own `reward_processing_class`): at least V rows.
        stop_ids (`Sequence[tuple[str, Sequence[int]]]`): (field name, ids) of each configured stop id: in [0, V).

    Raises:
        ValueError: naming the argument or field, the id or vocabulary size, and the fix.
    """
    rows = embedding_rows(policy)
    if rows is None:
        return
    special = [i for i in getattr(tokenizer, "all_special_ids", []) if i is not None]
    outside = {i for i in special if i >= rows} | set(range(rows, len(tokenizer)))
    outside.discard(tokenizer.pad_token_id)
    if outside:
        raise ValueError(
            f"`processing_class` has {len(tokenizer)} tokens (largest id {max(outside)}), but the policy embeds only "
            f'{rows} (`model.get_input_embeddings()`): token id {min(outside)} would fail at the first step ("index '
            "out of range in self\"). Resize the policy's embeddings to the tokenizer "
            "(`model.resize_token_embeddings(len(tokenizer))`), or pass the tokenizer the model was trained with."
        )
    if reference is not None and embedding_rows(reference) not in (None, rows):
        raise ValueError(
            f"`ref_model` embeds {embedding_rows(reference)} tokens, the policy {rows}: the KL term reads the "
            "reference's log-probs at the policy's tokens, so both must share the policy's vocabulary. Pass a "
            "reference with the policy's tokenizer (or ref_model=None: a frozen copy of the policy)."
        )
    for name, reader in readers:
        reader_rows = embedding_rows(reader) if reader is not None else None
        if reader_rows is not None and reader_rows < rows:
            raise ValueError(
                f"The {name} embeds {reader_rows} tokens, but it reads the policy's token ids, which go up to "
                f"{rows - 1}: use a model with the policy's vocabulary ({rows} rows), or (a reward model) pass its own "
                "tokenizer in `reward_processing_classes` so completions are re-tokenized for it."
            )
    for name, ids in stop_ids:
        bad = [i for i in ids if not 0 <= i < rows]
        if bad:
            raise ValueError(
                f"{name}={bad[0]} is outside the policy's vocabulary [0, {rows}): that stop token can never be "
                "sampled, so completions would never stop. Use an id of the policy's tokenizer (e.g. "
                "`tokenizer.convert_tokens_to_ids('<|im_end|>')`)."
            )


def embedding_safe_pad_id(tokenizer, *models: nn.Module | None) -> int:
    """The id written in padding positions of every input the given models see: the tokenizer's pad id when every
    model embeds it, else its EOS id (else 0).

    TRL 1.12's PPO example adds a `[PAD]` token without resizing the embeddings, so the pad id equals the vocabulary
    size and an embedding lookup of it fails ("index out of range in self"); TRL 1.12 replaced pad ids before every
    forward. TRAPO never reads padding positions (every mask comes from lengths), so any in-range id will do.
    """
    pad = tokenizer.pad_token_id
    sizes = [rows for rows in map(embedding_rows, models) if rows is not None]
    limit = min(sizes) if sizes else None
    if limit is None or pad < limit:
        return pad
    eos = tokenizer.eos_token_id
    safe = eos if eos is not None and eos < limit else 0
    logger.info(
        "The pad id %d is outside the model's %d embeddings (a pad token added without resizing them): padding "
        "positions hold id %d instead (they are masked, never read).",
        pad,
        limit,
        safe,
    )
    return safe


@contextlib.contextmanager
def embeddable_saved_pad_ids(pad_id: int, *models: nn.Module | None) -> Iterator[None]:
    """While saving: every model's `config.pad_token_id` / `generation_config.pad_token_id` that its embeddings cannot
    hold reads `pad_id` (the id TRAPO pads with, see [`embedding_safe_pad_id`]); restored on exit.

    transformers' `Trainer.train` copies the tokenizer's pad id into the model's configs (`align_special_tokens`).
    With a pad token added without resizing (TRL 1.12's PPO example), that id equals the vocabulary size and the saved
    `config.json` could not be reloaded (`from_pretrained`: "Padding_idx must be within num_embeddings"). The live
    model is left as it was; only what is written changes, and a warning says so.

    Args:
        pad_id (`int`): an id every model embeds.
        *models: the models about to be saved (`None` entries are skipped).
    """
    changed: list[tuple[object, int]] = []
    for model in models:
        size = embedding_rows(model)
        if size is None:
            continue
        config = getattr(model, "config", None)
        configs = [config.get_text_config() if hasattr(config, "get_text_config") else config]
        configs.append(getattr(model, "generation_config", None))
        for holder in configs:
            value = getattr(holder, "pad_token_id", None) if holder is not None else None
            if isinstance(value, int) and not 0 <= value < size:
                changed.append((holder, value))
                holder.pad_token_id = pad_id
    if changed:
        logger.warning(
            "The model's pad_token_id %d is outside its %d embeddings (a pad token added without resizing them): the "
            "saved config uses %d, the id padding positions held in training, so that from_pretrained reloads it.",
            changed[0][1],
            size,
            pad_id,
        )
    try:
        yield
    finally:
        for holder, value in changed:
            holder.pad_token_id = value


def _dropout_fields(holder) -> Iterator[tuple[str, float]]:
    """`(name, value)` of each non-zero float attribute of `holder` whose name says it is a dropout probability."""
    for name, value in vars(holder).items():
        if type(value) is float and value != 0.0 and "drop" in name.lower():
            yield name, value


def _configs(model: nn.Module) -> list:
    """Every distinct `PretrainedConfig` `model`'s modules hold, with their sub-configs (a VLM's `text_config` ...)."""
    from transformers import PretrainedConfig

    found: dict[int, PretrainedConfig] = {}
    pending = [getattr(module, "config", None) for module in model.modules()]
    while pending:
        config = pending.pop()
        if isinstance(config, PretrainedConfig) and id(config) not in found:
            found[id(config)] = config
            pending.extend(value for value in vars(config).values() if isinstance(value, PretrainedConfig))
    return list(found.values())


def disable_dropout(model: nn.Module, role: str) -> list[str]:
    """Switch every dropout of `model` off (`TRAPOConfig.disable_dropout`), so that a token's behaviour, current and
    reference log-probs are one function of the weights and PPO's first ratio is exactly 1.

    TRL's `disable_dropout_in_model` sets `p = 0` on `nn.Dropout` modules only, but many architectures apply a float
    they copied from their config when they were built (Llama, Qwen2, Mistral: `dropout=0.0 if not self.training else
    self.attention_dropout`; CLIP's and SigLIP's attention: `self.dropout`), and a few read the config at forward time
    (Persimmon's `config.attention_dropout`). So, in this order:

    1. every `nn.Dropout` gets `p = 0` (TRL's `disable_dropout_in_model`);
    2. every module's float attribute whose name contains "drop" (`attention_dropout`, `dropout`, `layerdrop`,
       `drop_prob`, `resid_pdrop`, ...) is set to 0.0;
    3. the same in the model's configs and their sub-configs (`attention_dropout`, `hidden_dropout_prob`,
       `drop_path_rate`, ...), so a copy rebuilt from the config (a ZeRO-3 reference, the async producer's copy) has
       no dropout either.

    Step 3 changes the model's own config: a model saved afterwards says 0.0 where it said otherwise. Each config
    field changed is logged (WARNING) with its old value.

    Args:
        model (`nn.Module`): the model, changed in place (a `PeftModel` included: its LoRA dropout is an `nn.Dropout`).
        role (`str`): what the model is, for the log ("policy", "reference model", ...).

    Returns:
        `list[str]`: the config fields set to 0.0, as `"<ConfigClass>.<field>=<old value>"` (empty when the config
        had no dropout).
    """
    disable_dropout_in_model(model)
    modules = 0
    for module in model.modules():
        for name, _ in list(_dropout_fields(module)):
            setattr(module, name, 0.0)
            modules += 1
    changed = []
    for config in _configs(model):
        for name, value in list(_dropout_fields(config)):
            setattr(config, name, 0.0)
            changed.append(f"{type(config).__name__}.{name}={value}")
    if changed:
        logger.warning(
            "disable_dropout=True: the %s's config had dropout (%s), now 0.0 there and in %d module attributes "
            "copied from it; a model saved from this run says 0.0 (set the values back in its config.json to train "
            "it with dropout later).",
            role,
            ", ".join(changed),
            modules,
        )
    elif modules:
        logger.info("disable_dropout=True: %d float dropout attributes of the %s's modules set to 0.0.", modules, role)
    return changed


def _float32_fix(name: str) -> str:
    """How to give `name` (a trained model's argument) float32 weights; the policy may be loaded by TRAPO by name."""
    by_name = "; `model_init_kwargs={'dtype': 'float32'}` / `--dtype float32` when TRAPO loads it by name"
    return f"load it in float32 (`from_pretrained(..., dtype=torch.float32)` or `{name}.float()`" + (
        f"{by_name})" if name == "model" else ")"
    )


def check_trained_precision(
    trained: Sequence[tuple[str, nn.Module | None]], mixed_precision: str, float32_master_weights: bool
) -> None:
    """Say when a model the optimizer trains has trainable float16 parameters that no mixed precision covers (trial
    13's N28: a policy loaded with `from_pretrained(dtype=torch.float16)` and trained with fp32 arguments diverged at
    step 3, loss 4.06 -> 13.1 and grad norm 363, without a word; TRL's trainers say nothing either). Only *trainable*
    parameters count: a LoRA adapter on a float16 base is float32 (PEFT's `autocast_adapter_dtype=True`), so that
    run is fine; frozen models (reference, reward models, teacher) are never updated.

    - no fp16 mixed precision (`mixed_precision` 'no' or 'bf16'): a warning. The optimizer keeps float16 weights,
      gradients and states: AdamW's default eps=1e-8 is 0 in float16 and small gradients and updates underflow, so
      training can diverge or stall. Not refused: a user may train pure float16 on purpose (e.g. with a larger eps).
    - fp16 mixed precision (`fp16=True`, or `ACCELERATE_MIXED_PRECISION=fp16`, on a GPU): refused. accelerate scales
      the loss with torch's `GradScaler`, whose `unscale_` raises "Attempting to unscale FP16 gradients." for float16
      gradients at the first optimizer step (torch 2.x, accelerate 1.x, transformers 5: none of them upcasts the
      weights outside FSDP), after the first rollouts; fp16 mixed precision needs float32 weights.

    Nothing is said when `float32_master_weights`: DeepSpeed casts the model to its config's precision and keeps
    float32 master weights, and accelerate upcasts FSDP's trainable parameters to float32 under mixed precision.

    Args:
        trained: `(argument name, model or None)` of each model the optimizer trains: the policy (`"model"`, a
            `PeftModel` counts its trainable adapter weights) and the critic (`"value_model"`, None without one).
        mixed_precision (`str`): the run's mixed precision, `TrainingArguments.mixed_precision` ('no', 'fp16',
            'bf16', ...).
        float32_master_weights (`bool`): DeepSpeed, or FSDP under mixed precision, holds the trained weights.

    Raises:
        ValueError: under fp16 mixed precision, naming the model, its float16 parameters and the fix.
    """
    if float32_master_weights:
        return
    for name, model in trained:
        if model is None:
            continue
        half = [(key, p) for key, p in model.named_parameters() if p.requires_grad and p.dtype == torch.float16]
        if not half:
            continue
        what = (
            f"`{name}` ({type(model).__name__}) has {len(half)} trainable float16 parameter tensor"
            f"{'s' if len(half) > 1 else ''} ({sum(p.numel() for _, p in half):,} values, e.g. {half[0][0]!r})"
        )
        if mixed_precision == "fp16":
            raise ValueError(
                f"{what} and fp16 mixed precision is on (mixed_precision='fp16': `fp16=True`, or "
                "ACCELERATE_MIXED_PRECISION=fp16): torch's GradScaler refuses float16 gradients at the first "
                'optimizer step ("Attempting to unscale FP16 gradients."), after the first rollouts. fp16 mixed '
                "precision computes in float16 under autocast but needs float32 trainable weights. Fix: "
                f"{_float32_fix(name)} and keep fp16=True; or load it in bfloat16 (`dtype=torch.bfloat16`) and train "
                "with bf16=True instead of fp16 on a GPU with bf16."
            )
        logger.warning(
            "%s and the run has no fp16 mixed precision (mixed_precision=%r): the optimizer updates float16 weights "
            "with float16 gradients and states, where AdamW's default eps=1e-8 is 0 and small gradients and updates "
            "underflow, so the loss can diverge or stall without an error (no loss scaling covers it). Fix: %s; on a "
            "GPU, `fp16=True` then trains under fp16 autocast with float32 weights. Or load it in bfloat16 "
            "(`dtype=torch.bfloat16`: float32's range, no loss scaling needed).",
            what,
            mixed_precision,
            _float32_fix(name),
        )


def check_not_inference_tensors(name: str, model: object) -> None:
    """Refuse a model the optimizer trains (the policy, `model`, or the critic, `value_model`) whose parameters were
    created inside `torch.inference_mode()` (inference tensors, `param.is_inference()`; e.g. a model loaded in an
    evaluation cell wrapped in it): autograd can never save them for backward, so the first training forward failed
    with torch's "Inference tensors cannot be saved for backward" (trial 14's N53; TRL's trainers fail the same way).
    A LoRA adapter on such a base fails the same way (its frozen base weights are saved for the adapter's gradient).
    Frozen models (reference, reward model, teacher) only run under `torch.no_grad()`: not checked.

    Args:
        name (`str`): the argument's name, for the message.
        model: the loaded model (anything else, e.g. a name TRAPO loads, is not checked).

    Raises:
        ValueError: naming the argument, the model's class, how many parameter tensors are inference tensors (with
            the first's name) and the fix.
    """
    if not isinstance(model, nn.Module):
        return
    inference = [key for key, parameter in model.named_parameters() if parameter.is_inference()]
    if inference:
        raise ValueError(
            f"`{name}` ({type(model).__name__}) was created inside `torch.inference_mode()`: {len(inference)} of its "
            f"parameter tensors are inference tensors (e.g. {inference[0]!r}, `.is_inference()` is True), which "
            'autograd can never train (the first forward would fail with "Inference tensors cannot be saved for '
            'backward"). Fix: build or load the model outside `with torch.inference_mode():` (for evaluation '
            "without gradients use `torch.no_grad()`, whose tensors can train), or pass its name or path as "
            f"`{name}=` for TRAPO to load."
        )


def create_reference(model: nn.Module, model_id: str | None, model_init_kwargs: dict | None) -> nn.Module:
    """A frozen reference policy, without deep-copying a model that ZeRO-3 may already have partitioned.

    Raises:
        ValueError: under ZeRO-3, when the policy is neither partitioned-and-rebuildable nor loadable by id.
    """
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    from .distributed import zero3_reference_copy
    from .vision import load_policy

    if is_deepspeed_zero3_enabled():
        if not model_id or not (os.path.isdir(model_id) or "/" in model_id or not os.path.exists(model_id)):
            if any(hasattr(p, "ds_id") for p in model.parameters()):  # partitioned, e.g. built from a config
                return zero3_reference_copy(model)  # rebuilt from the config, filled parameter by parameter
            raise ValueError(
                "Under DeepSpeed ZeRO-3 the reference model cannot be deep-copied from the (partitioned) policy; "
                "pass `ref_model` explicitly or pass `model` as a model id / path."
            )
        return load_policy(model_id, model_init_kwargs)
    return copy.deepcopy(model)


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
    source_state = {k: v for k, v in peft_model.state_dict().items() if in_adapter(k, source)}
    copied = {adapter_renamed(k, source, name): v.detach().clone() for k, v in source_state.items()}
    missing = [k for k in copied if k not in dict(peft_model.named_parameters()) and k not in peft_model.state_dict()]
    if missing:
        raise RuntimeError(f"Could not map adapter '{source}' to its reference copy; unmatched keys: {missing[:3]}")
    peft_model.load_state_dict(copied, strict=False)
    for param_name, param in peft_model.named_parameters():
        if in_adapter(param_name, name):
            param.requires_grad_(False)
    peft_model.set_adapter(source)
    # `set_adapter` may mark only the active adapter trainable; make sure the copy stays frozen.
    for param_name, param in peft_model.named_parameters():
        if in_adapter(param_name, name):
            param.requires_grad_(False)
    logger.info("Reference policy: frozen copy '%s' of the trained adapter '%s'.", name, source)
    return name


def _right_pad_pairs(
    prompt_ids: Sequence[torch.Tensor], completion_ids: Sequence[torch.Tensor], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths_p = torch.tensor([p.numel() for p in prompt_ids])
    lengths_c = torch.tensor([c.numel() for c in completion_ids])
    length = int((lengths_p + lengths_c).max())
    input_ids = torch.full((len(prompt_ids), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        n = p.numel() + c.numel()
        input_ids[i, :n] = torch.cat([p, c])
        attention_mask[i, :n] = 1
    return input_ids, attention_mask, lengths_p, lengths_c


def batch_model_inputs(
    model_inputs: Sequence[Mapping[str, torch.Tensor]] | None, start: int, size: int
) -> dict[str, torch.Tensor]:
    """The combined extra model inputs of rows `start ... start + size - 1` (empty without any)."""
    if model_inputs is None:
        return {}
    return combine_model_inputs(model_inputs[start : start + size])


def _completion_logits(
    model: nn.Module,
    prompt_ids: Sequence[torch.Tensor],
    completion_ids: Sequence[torch.Tensor],
    pad_token_id: int,
    temperature: float | Sequence[float] | torch.Tensor,
    batch_size: int,
    model_inputs: Sequence[Mapping[str, torch.Tensor]] | None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, float | None, list[slice]]]:
    """Per forward of `batch_size` rows: `(logits (b, L - 1, V) fp32, targets (b, L - 1), temperature, rows)` where
    `temperature` is the one temperature of the batch (None: `logits` are already divided by each row's own) and
    `rows[i]` the positions of row i's completion targets."""
    device = next(model.parameters()).device
    temperatures = torch.as_tensor(temperature, dtype=torch.float32).flatten()
    per_row = temperatures.numel() > 1 and bool((temperatures != temperatures[0]).any())
    if temperatures.numel() > 1 and temperatures.numel() != len(prompt_ids):
        raise ValueError(
            f"{temperatures.numel()} temperatures for {len(prompt_ids)} completions; give one or one each."
        )
    for start in range(0, len(prompt_ids), batch_size):
        p, c = prompt_ids[start : start + batch_size], completion_ids[start : start + batch_size]
        input_ids, attention_mask, lengths_p, lengths_c = _right_pad_pairs(p, c, pad_token_id)
        inputs = batch_model_inputs(model_inputs, start, len(p))
        logits = model_forward(model, input_ids.to(device), attention_mask.to(device), inputs).logits[:, :-1].float()
        scalar = None
        if per_row:  # each row at its own temperature (one temperature keeps TRL's scalar path)
            logits = logits / temperatures[start : start + len(p)].to(device).view(-1, 1, 1)
        else:
            scalar = float(temperatures[0])
        rows = [slice(int(lp) - 1, int(lp) - 1 + int(lc)) for lp, lc in zip(lengths_p, lengths_c)]
        yield logits, input_ids[:, 1:].to(device), scalar, rows


@torch.no_grad()
def completion_logps(
    model: nn.Module,
    prompt_ids: Sequence[torch.Tensor],
    completion_ids: Sequence[torch.Tensor],
    pad_token_id: int,
    temperature: float | Sequence[float] | torch.Tensor = 1.0,
    batch_size: int = 64,
    model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> list[torch.Tensor]:
    """log pi(y_t | prompt, y_<t) of each completion token under `model` (no grad; for reference / old log-probs).

    Args:
        model (`nn.Module`): a causal LM.
        prompt_ids (`Sequence[torch.Tensor]`): `(P_i,)` each.
        completion_ids (`Sequence[torch.Tensor]`): `(C_i,)` each.
        pad_token_id (`int`): padding id (right padding).
        temperature (`float`, or one per completion): logits are divided by it (as in the policy loss); per-row
            temperatures are those a round sampled each completion at (targeted exploration).
        batch_size (`int`): rows per forward.
        model_inputs (`Sequence[Mapping[str, torch.Tensor]]`, *optional*): each completion's extra model inputs
            (its prompt's), combined per forward by [`~trl_trapo.collator.combine_model_inputs`].

    Returns:
        `list[torch.Tensor]`: `(C_i,)` log-probs in nats, on CPU, float32.
    """
    out: list[torch.Tensor] = []
    chunks = _completion_logits(model, prompt_ids, completion_ids, pad_token_id, temperature, batch_size, model_inputs)
    for logits, targets, scalar, rows in chunks:
        logps = selective_log_softmax(logits, targets, temperature=1.0 if scalar is None else scalar)
        out.extend(logps[i, row].cpu() for i, row in enumerate(rows))
    return out


@torch.no_grad()
def completion_logps_and_kept_support(
    model: nn.Module,
    prompt_ids: Sequence[torch.Tensor],
    completion_ids: Sequence[torch.Tensor],
    pad_token_id: int,
    temperature: float | Sequence[float] | torch.Tensor = 1.0,
    batch_size: int = 64,
    model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """[`completion_logps`], and from the same forward the log-probs over the support a `top_k` / `top_p` sampler
    draws from (renormalised; [`~trl_trapo.sampler_correction.kept_support_logps`]): the trainer's side of the
    sampler/trainer importance ratio, which must be taken over the support the sampler's log-probs are (TRL #6789).

    Args:
        model, prompt_ids, completion_ids, pad_token_id, temperature, batch_size, model_inputs: as
            [`completion_logps`].
        top_k (`int`): the sampler's top-k (0: none).
        top_p (`float`): the sampler's top-p (1: none).

    Returns:
        tuple `(full, kept)`: each a list of `(C_i,)` float32 CPU log-probs in nats; `full` is exactly what
        [`completion_logps`] returns (PPO's behaviour log-probs), `kept` equals it without truncation.
    """
    full: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []
    chunks = _completion_logits(model, prompt_ids, completion_ids, pad_token_id, temperature, batch_size, model_inputs)
    for logits, targets, scalar, rows in chunks:
        logps = selective_log_softmax(logits, targets, temperature=1.0 if scalar is None else scalar)
        full.extend(logps[i, row].cpu() for i, row in enumerate(rows))
        scaled = logits if scalar is None or scalar == 1.0 else logits / scalar
        for i, row in enumerate(rows):  # the completion's positions only: top-p sorts (C_i, V)
            kept.append(kept_support_logps(scaled[i, row], targets[i, row], top_k, top_p).cpu())
    return full, kept


def find_score_head(model: nn.Module, what: str = "reward_model / value_model") -> nn.Module:
    """The module of a sequence-classification model that maps hidden states to class logits (`score`/`classifier`).

    Raises:
        ValueError: if the model has neither, naming `what` (the argument it came from).
    """
    for module in (
        model,
        getattr(model, "base_model", None),
        getattr(getattr(model, "base_model", None), "model", None),
    ):
        if module is None:
            continue
        for name in ("score", "classifier", "v_head"):
            head = getattr(module, name, None)
            if isinstance(head, nn.Module):
                return head
    if what.startswith("reward_funcs") and not isinstance(model, PreTrainedModel):  # trial 14's N40: a scorer
        raise ValueError(
            f"{what} is a torch module ({type(model).__name__}) without a `score`/`classifier` head: a module among "
            "reward_funcs is taken as a reward model that reads the tokenized completions (as TRL does), never called "
            "with the completions. Fix: to score completions with your own module, wrap it in a reward function, "
            "e.g. `def my_reward(completions, **kwargs): return scorer(completions).tolist()`, and pass "
            "`reward_funcs=[my_reward]`; or pass an `AutoModelForSequenceClassification` (num_labels=1)."
        )
    raise ValueError(
        f"{type(model).__name__} has no `score`/`classifier` head; pass an `AutoModelForSequenceClassification` "
        f"(num_labels=1) as {what}."
    )


def check_score_head(model: nn.Module, what: str) -> None:
    """Refuse a reward or value model that TRAPO cannot read one score per position from: no `score` / `classifier` /
    `v_head` head (a causal LM, say), or a head with more than one output (`num_labels` > 1), whose first output
    [`per_token_head_outputs`] would silently use as the score. TRL's contract is a sequence-classification model
    with `num_labels=1` (its trainers load reward models that way).

    Args:
        model (`nn.Module`): the reward or value model.
        what (`str`): how the message names it (e.g. "value_model", "reward_funcs[1]").

    Raises:
        ValueError: naming `what`, the number of outputs and the fix.
    """
    head = find_score_head(model, what)
    outputs = getattr(head, "out_features", None)
    if outputs is None:  # a head wrapping its projection (a PEFT `ModulesToSaveWrapper`, TRL's `ValueHead`)
        linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
        outputs = linears[-1].out_features if linears else None
    if outputs is not None and outputs != 1:
        raise ValueError(
            f"The {what} ({type(model).__name__}) has a head of {outputs} outputs (num_labels={outputs}), but a "
            "reward or value model gives one score: TRAPO would read its first output and ignore the others. Load it "
            "with one: `AutoModelForSequenceClassification.from_pretrained(..., num_labels=1)` (TRL's contract)."
        )


def per_token_head_outputs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    grad: bool = False,
    model_inputs: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-position output of a sequence-classification model's head, shape `(B, L)` (first label).

    Sequence-classification models pool at "the last non-pad token", found by comparing ids with the pad id, which is
    wrong when pad == EOS. We read the head's per-position output with a forward hook instead and index it
    ourselves. Models whose head only sees a pooled vector (BERT-style) return that value broadcast over positions.
    `model_inputs` are the rows' extra model inputs, combined (see [`model_forward`]).
    """
    with torch.set_grad_enabled(grad):
        head = find_score_head(model)
        captured: dict[str, torch.Tensor] = {}

        def hook(module, args, output):
            captured["out"] = output

        handle = head.register_forward_hook(hook)
        try:
            outputs = model_forward(model, input_ids, attention_mask, model_inputs, use_cache=False)
        finally:
            handle.remove()
        out = captured.get("out")
        if out is None or out.dim() != 3:
            pooled = outputs.logits[:, 0]
            return pooled.unsqueeze(1).expand(-1, input_ids.shape[1])
        return out[..., 0]


def last_real_token(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row, for either padding side; shape `(B,)`."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device).expand_as(attention_mask)
    return torch.where(attention_mask.bool(), positions, torch.full_like(positions, -1)).amax(dim=1).clamp(min=0)


@torch.no_grad()
def reward_model_scores(
    reward_model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    batch_size: int = 64,
    model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Score of each sequence: the reward head's output at its last real token (whatever the padding side).

    Args:
        reward_model (`nn.Module`): `AutoModelForSequenceClassification` with `num_labels=1`.
        input_ids (`torch.Tensor`): shape `(B, L)`.
        attention_mask (`torch.Tensor`): shape `(B, L)`.
        batch_size (`int`): rows per forward.
        model_inputs (`Sequence[Mapping[str, torch.Tensor]]`, *optional*): each sequence's extra inputs of the
            reward model, combined per forward.

    Returns:
        `torch.Tensor`: shape `(B,)`, float32, on CPU.
    """
    device = next(reward_model.parameters()).device
    scores = []
    for start in range(0, input_ids.shape[0], batch_size):
        ids = input_ids[start : start + batch_size].to(device)
        mask = attention_mask[start : start + batch_size].to(device)
        if bool((mask[:, 1:] > mask[:, :-1]).any()):  # left padding: move real tokens first so positions start at 0
            order = torch.argsort((mask == 0).int(), dim=1, stable=True)  # (absolute-position models, e.g. GPT-2)
            ids, mask = ids.gather(1, order), mask.gather(1, order)
        per_token = per_token_head_outputs(
            reward_model, ids, mask, model_inputs=batch_model_inputs(model_inputs, start, ids.shape[0])
        )
        index = last_real_token(mask)
        scores.append(per_token[torch.arange(ids.shape[0], device=device), index].float().cpu())
    return torch.cat(scores)


@torch.no_grad()
def value_predictions(
    value_model: nn.Module,
    prompt_ids: Sequence[torch.Tensor],
    completion_ids: Sequence[torch.Tensor],
    pad_token_id: int,
    batch_size: int = 64,
    model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> list[torch.Tensor]:
    """Critic values V(prompt, y_<t) aligned with each completion token t, `(C_i,)` each, float32 on CPU
    (`model_inputs`: each completion's prompt's extra model inputs, as in [`completion_logps`])."""
    device = next(value_model.parameters()).device
    out = []
    for start in range(0, len(prompt_ids), batch_size):
        p, c = prompt_ids[start : start + batch_size], completion_ids[start : start + batch_size]
        input_ids, attention_mask, lengths_p, lengths_c = _right_pad_pairs(p, c, pad_token_id)
        inputs = batch_model_inputs(model_inputs, start, len(p))
        values = per_token_head_outputs(
            value_model, input_ids.to(device), attention_mask.to(device), model_inputs=inputs
        ).float()
        for i in range(len(p)):
            first = int(lengths_p[i]) - 1
            out.append(values[i, first : first + int(lengths_c[i])].cpu())
    return out
