# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The distillation teacher: a frozen causal LM sharing the policy's tokenizer, and the forwards the distillation
objective and the rollout engine run on it ([`Teacher`]); [`load_teacher`] loads and checks it.

Shape letters: B rows, L tokens of a row, H_t the teacher's hidden size, V the shared vocabulary, n positions,
C_i the tokens of completion i.

Who uses it: [`~trl_trapo.objectives.DistillationObjective`] (the full-vocabulary term: hidden states and output layer
in the training step), [`~trl_trapo.objectives.DistillationPrompts`] and [`~trl_trapo.rollout.RolloutEngine`] (the
sampled-token estimator: the teacher's log-probability of each sampled token, for reward-free prompts and for RL
rounds). The trainer loads it ([`load_teacher`]), builds one [`Teacher`] once its accelerator exists, and hands it to
those three; it keeps no handle of its own (`trainer.teacher_model` is a read-only view of it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from accelerate.utils import is_peft_model
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .config import TEACHER_FIELDS, changed_settings, warn_ignored_settings
from .models import completion_logps, disable_dropout, model_forward
from .paths import check_model_source
from .rollout import prompt_model_inputs
from .setup_checks import check_model_loading


logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .sources import SampledRound


def check_teacher_prompts(
    args, with_teacher: bool, distillation_prompts: bool, rl_prompts: bool, other_data: bool
) -> None:
    """Refuse, before anything loads, a run whose distillation term would have no samples, saying which prompts it
    needs (trial 17's W07): a teacher scores the student's own samples of either `distillation_dataset`'s reward-free
    prompts or the RL rollouts, which need RL prompts and `rl_weight` > 0; and distillation alone (`pretrain_weight`,
    `sft_weight`, `rl_weight` all 0) needs a teacher. These runs were refused later, after the models loaded, by
    "No objective has data" (naming `train_dataset`, which had been given) or by the plan.

    Args:
        args ([`~trl_trapo.TRAPOConfig`]): the weights.
        with_teacher (`bool`): a teacher is given (`teacher_model` or `teacher_model_name_or_path`).
        distillation_prompts (`bool`): a `distillation_dataset` is given.
        rl_prompts (`bool`): RL prompts are given (`train_dataset`, or a rollout source of the user's).
        other_data (`bool`): a pretraining or SFT dataset is given with a weight > 0.

    Raises:
        ValueError: naming the weights, the missing teacher or prompts, and the fix.
    """
    name = type(args).__name__
    if not with_teacher:
        if args.pretrain_weight == args.sft_weight == args.rl_weight == 0:
            raise ValueError(
                f"{name}: pretrain_weight, sft_weight and rl_weight are 0, which leaves distillation alone "
                f"(distillation_weight={args.distillation_weight!r}), and this run has no teacher. Fix: pass "
                "`teacher_model` (or set teacher_model_name_or_path) with a `distillation_dataset` of reward-free "
                "prompts, or give pretrain_weight, sft_weight or rl_weight a value > 0."
            )
        return
    if distillation_prompts or (rl_prompts and args.rl_weight > 0):
        return
    if rl_prompts:  # distillation samples the RL rollouts, and rl_weight=0 switches them off
        cause = (
            f"its RL prompts (`train_dataset`) are not rolled out: rl_weight={args.rl_weight!r} switches RL off, and "
            "with it the rollouts distillation samples from"
        )
    else:
        cause = "it has neither a `distillation_dataset` nor RL prompts (`train_dataset`)"
    alone = "" if other_data else " (distillation alone: pretrain_weight, sft_weight and rl_weight may then all be 0)"
    raise ValueError(
        "A teacher (`teacher_model` / teacher_model_name_or_path) scores the student's own samples of prompts, but "
        f"this run has none: {cause}. Fix: pass a `distillation_dataset` of reward-free prompts (a 'prompt' "
        f"column){alone}, or RL prompts (`train_dataset`, with `reward_funcs`) and rl_weight > 0 to distil on the RL "
        "rollouts."
    )


def load_teacher(teacher: str | nn.Module | None, policy: nn.Module, args, tokenizer) -> nn.Module | None:
    """The distillation teacher (`teacher_model`, or loaded from `args.teacher_model_name_or_path`), frozen (eval
    mode, no gradients, dropout off with `args.disable_dropout`) and checked against the policy; None without one.

    Args:
        teacher (`str`, `nn.Module` or None): the trainer's `teacher_model` argument (a model, a path or Hub id).
        policy (`nn.Module`): the policy (a `PeftModel` or not), whose vocabulary and dtype the teacher must share.
        args ([`~trl_trapo.TRAPOConfig`]): `teacher_model_name_or_path`, `teacher_model_revision`,
            `teacher_model_init_kwargs`, `disable_dropout`.
        tokenizer (`PreTrainedTokenizerBase`): the policy's tokenizer (a teacher loaded by name whose folder has a
            tokenizer must map tokens to the same ids).

    Returns:
        `nn.Module` or None: the frozen teacher, not yet prepared for the run's distribution ([`Teacher`] does that).

    Logs a warning naming them when teacher-only settings ([`~trl_trapo.config.TEACHER_FIELDS`]) are given without
    any teacher: they are ignored (trial 8's TD09), as `--lora_r` without `--use_peft` is.

    Raises:
        ValueError: as [`~trl_trapo.setup_checks.check_model_loading`] for a teacher given by name (an
            encoder-decoder checkpoint, a task-head checkpoint, flash attention or bitsandbytes unavailable), before
            any weight loads; naming the fix, for `teacher_model_init_kwargs` with a teacher object, a teacher that is
            the policy itself, a vocabulary of another size or another token mapping than the policy's tokenizer, or
            another dtype than the policy's.
    """
    arg = "teacher_model"
    if teacher is None:
        teacher, arg = args.teacher_model_name_or_path, "teacher_model_name_or_path"
    if teacher is None:
        warn_ignored_settings(
            logger,
            [f"{setting}={getattr(args, setting)!r}" for setting in changed_settings(args, TEACHER_FIELDS)],
            "a teacher (`teacher_model` / teacher_model_name_or_path)",
            " (no distillation objective is built)",
            "Pass teacher_model= to the trainer or set teacher_model_name_or_path (--teacher_model_name_or_path) to "
            "distill with {them}, or drop {them}.",
        )
        return None
    teacher_tokenizer = None
    if isinstance(teacher, str):
        check_model_source(teacher, "teacher_model")
        path, kwargs = teacher, dict(args.teacher_model_init_kwargs or {})
        # the policy's checks of a model loaded by id, with its config read and no weights: an encoder-decoder (T5)
        # teacher failed raw inside `AutoModelForCausalLM` ("Unrecognized configuration class")
        config = AutoConfig.from_pretrained(
            path, revision=args.teacher_model_revision, trust_remote_code=kwargs.get("trust_remote_code", False)
        )
        check_model_loading(path, config, kwargs, arg=arg, kwargs_name="teacher_model_init_kwargs")
        teacher = AutoModelForCausalLM.from_pretrained(path, revision=args.teacher_model_revision, **kwargs)
        try:
            teacher_tokenizer = AutoTokenizer.from_pretrained(path, revision=args.teacher_model_revision)
        except (OSError, ValueError):  # a model folder without a tokenizer: the vocabulary size is still checked
            teacher_tokenizer = None
    elif args.teacher_model_init_kwargs:
        raise ValueError(
            "`teacher_model_init_kwargs` is only used when the teacher is given by name; drop it or pass "
            "teacher_model_name_or_path."
        )
    policy_base = policy.get_base_model() if is_peft_model(policy) else policy
    if teacher is policy or teacher is policy_base:
        raise ValueError(
            "`teacher_model` is the policy itself: distilling a model into itself trains nothing. Pass a separate "
            "teacher (e.g. a larger model of the same family, or a frozen copy loaded from a checkpoint)."
        )
    student_vocab, teacher_vocab = output_rows(policy), output_rows(teacher)
    if student_vocab != teacher_vocab:
        raise ValueError(
            f"The teacher's vocabulary has {teacher_vocab} rows, the policy's {student_vocab}: the divergence "
            "compares the two next-token distributions token by token, so they must share a tokenizer. "
            "Cross-tokenizer distillation is TRL's GOLD (`trl.experimental.gold`), not supported here."
        )
    if teacher_tokenizer is not None and teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            "The teacher's tokenizer maps tokens to other ids than the policy's (same vocabulary size, another "
            "mapping): the divergence would compare unrelated tokens. Use a teacher trained with the policy's "
            "tokenizer (cross-tokenizer distillation is TRL's GOLD, not supported here)."
        )
    teacher_dtype, student_dtype = next(teacher.parameters()).dtype, next(policy.parameters()).dtype
    if teacher_dtype != student_dtype:
        raise ValueError(
            f"The teacher is {teacher_dtype}, the policy {student_dtype}: load the teacher in the policy's dtype "
            f"(teacher_model_init_kwargs={{'dtype': '{str(student_dtype).replace('torch.', '')}'}}, or "
            f"`teacher.to({student_dtype})`)."
        )
    teacher.eval().requires_grad_(False)
    if args.disable_dropout:
        disable_dropout(teacher, "teacher")
    return teacher


def output_rows(model: nn.Module) -> int:
    """The rows of `model`'s output layer (`get_output_embeddings().weight`): the vocabulary V its next-token
    distribution is over, whole even when DeepSpeed ZeRO-3 has partitioned the weight.

    A partitioned parameter holds an empty local tensor (its `shape` is `(0,)` on every rank) and records its whole
    shape in `ds_shape`; reading `weight.shape` would give 0 rows for a policy loaded under ZeRO-3 and V for a teacher
    object built outside it (a false mismatch), and 0 for both when both are partitioned (a vacuous match).
    """
    weight = model.get_output_embeddings().weight
    return int(getattr(weight, "ds_shape", weight.shape)[0])


class Teacher:
    """A frozen distillation teacher prepared for the run, and its forwards (all without gradients).

    Args:
        model (`nn.Module`): the frozen teacher ([`load_teacher`]), a causal LM with the policy's vocabulary.
        prepare (`Callable[[nn.Module], nn.Module]`, *optional*): prepares it for inference under the run's
            distribution (the trainer's: a DeepSpeed engine, or the accelerator's evaluation-mode model); identity when
            None. Called once, here.
        unwrap (`Callable[[nn.Module], nn.Module]`, *optional*): maps the prepared model back to the plain module (the
            accelerator's `unwrap_model`); identity when None.
        partitioned (`bool`): its parameters are partitioned across ranks (DeepSpeed ZeRO-3), so each forward is a
            collective; its output layer is then gathered once, here, into a whole frozen copy (collective: every rank
            constructs its `Teacher` at the same point).
        temperature (`float`): the divergence's temperature (`distillation_temperature`) at which [`logps`] scores.
        pad_token_id (`int`): the id written in padding positions of [`logps`]' batches (one the teacher embeds).
        batch_size (`int`): rows per forward of [`logps`] (`local_rollout_forward_batch_size`).

    Attributes:
        model (`nn.Module`): the prepared teacher (what `trainer.teacher_model` returns).
        partitioned (`bool`): as given.
    """

    def __init__(
        self,
        model: nn.Module,
        prepare: Callable[[nn.Module], nn.Module] | None = None,
        unwrap: Callable[[nn.Module], nn.Module] | None = None,
        partitioned: bool = False,
        temperature: float = 1.0,
        pad_token_id: int = 0,
        batch_size: int = 64,
    ):
        self.model = prepare(model) if prepare is not None else model
        self.unwrap = unwrap or (lambda module: module)
        self.partitioned = bool(partitioned)
        self.temperature, self.pad_token_id, self.batch_size = float(temperature), int(pad_token_id), int(batch_size)
        self.head_copy = self._gather_head() if self.partitioned else None

    @classmethod
    def from_config(
        cls, model: nn.Module, args, accelerator, prepare: Callable[[nn.Module], nn.Module], pad_token_id: int
    ) -> Teacher:
        """The teacher of a run: prepared by `prepare`, unwrapped by `accelerator.unwrap_model`, partitioned when the
        accelerator runs DeepSpeed ZeRO-3, scoring at `args.distillation_temperature` in batches of
        `args.local_rollout_forward_batch_size` rows."""
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        return cls(
            model,
            prepare,
            accelerator.unwrap_model,
            partitioned=plugin is not None and plugin.zero_stage == 3,
            temperature=args.distillation_temperature,
            pad_token_id=pad_token_id,
            batch_size=args.local_rollout_forward_batch_size,
        )

    def _gather_head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A whole, frozen copy `(weight (V, H_t), bias (V,) or None)` of the partitioned teacher's output layer
        (collective: every rank gathers it; one V x H_t matrix per rank, e.g. 113 MB for a 49k x 576 fp32 head).

        A call of the partitioned module would gather it once per chunk of [`head`] (a collective whose count
        differs between ranks) and again in the backward's recomputation of each chunk, after the decoder's own
        forward has partitioned a tied weight again.
        """
        import deepspeed

        head = self.unwrap(self.model).get_output_embeddings()
        with deepspeed.zero.GatheredParameters(list(head.parameters()), modifier_rank=None):
            weight = head.weight.detach().clone()
            bias = head.bias.detach().clone() if getattr(head, "bias", None) is not None else None
        return weight, bias

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The teacher's final hidden states (its decoder body, no output layer), no grad.

        Args:
            input_ids (`torch.Tensor`): `(B, L)` token ids, right-padded.
            attention_mask (`torch.Tensor`): `(B, L)`, 1 on real tokens.

        Returns:
            `torch.Tensor`: `(B, L, H_t)`, the teacher's dtype, on its device.
        """
        teacher = self.unwrap(self.model)
        with torch.no_grad():
            return model_forward(teacher.get_decoder(), input_ids, attention_mask, use_cache=False).last_hidden_state

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The teacher's logits of final hidden states: `(n, H_t) -> (n, V)` (from the gathered copy when
        partitioned)."""
        if self.head_copy is not None:
            weight, bias = self.head_copy
            return torch.nn.functional.linear(hidden, weight, bias)
        return self.unwrap(self.model).get_output_embeddings()(hidden)

    def logps(
        self,
        prompt_ids: Sequence[torch.Tensor],
        completion_ids: Sequence[torch.Tensor],
        model_inputs: Sequence[Mapping[str, torch.Tensor]] | None = None,
    ) -> list[torch.Tensor]:
        """log p_teacher(y_t | prompt, y_<t) of each completion token at the divergence's temperature
        (`temperature`): the sampled-token estimator's teacher term
        ([`~trl_trapo.losses.sampled_token_distillation_term`]).

        Args:
            prompt_ids (`Sequence[torch.Tensor]`): `(P_i,)` each.
            completion_ids (`Sequence[torch.Tensor]`): `(C_i,)` each.
            model_inputs (`Sequence[Mapping]`, *optional*): each completion's prompt's extra model inputs.

        Returns:
            `list[torch.Tensor]`: `(C_i,)` each, nats, float32 on CPU.
        """
        temperatures = torch.full((len(prompt_ids),), self.temperature)
        return completion_logps(
            self.model, prompt_ids, completion_ids, self.pad_token_id, temperatures, self.batch_size, model_inputs
        )

    def round_logps(self, sampled: SampledRound) -> list[torch.Tensor]:
        """[`logps`] of a sampled round's completions (its `prompt_ids`, or its examples' when it has none), for rows
        that do not pass the rollout engine's `finish` (reward-free distillation prompts).

        Returns:
            `list[torch.Tensor]`: `(C_i,)` per completion, nats, float32 on CPU.
        """
        prompt_ids = sampled.prompt_ids or [torch.as_tensor(e["prompt_ids"]) for e in sampled.examples]
        return self.logps(prompt_ids, sampled.completion_ids, prompt_model_inputs(sampled.examples))
