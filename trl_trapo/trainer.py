# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""TRAPOTrainer: one policy, three objectives (pretraining, SFT, RL), one joint update per optimizer step.

How one optimizer step runs (see `get_batch_samples` and `compute_loss`):

1. the curriculum gives the step's shares of rows (pretrain / SFT / RL), DARE's factors turn them into loss weights;
2. the rows are drawn: packed pretraining chunks, SFT samples, RL trajectories from the replay buffer — which is
   refilled by a generation round (generate, score, reference log-probs, values, advantages) when it runs dry;
3. the rows are split into gradient-accumulation micro-batches of similar length and right-padded;
4. the per-objective token counts of the whole step are summed over micro-batches and ranks;
5. each micro-batch is one forward of the policy over all its rows (whatever their objective) and one backward of
   L = sum_o w_o * L_o, each L_o normalised by its *global* count, so accumulation and data parallelism are exact.

Everything else — optimizer, scheduler, accumulation, mixed precision, distribution, checkpoints — is the
`transformers.Trainer` loop, reached only through its public hooks.

This module holds the constructor, the loss and the optimizer step; the rest of `TRAPOTrainer` comes from mixins, by
concept: construction helpers and reference syncing (`trainer_setup.py`), step planning and building
(`trainer_steps.py`), rollouts (`trainer_rollouts.py`), metrics and logging (`trainer_metrics.py`), durable state and
saving (`trainer_state.py`), evaluation and sample completions (`trainer_eval.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset, IterableDataset
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.utils import disable_dropout_in_model, entropy_from_logits, selective_log_softmax

from .adapter_bank import AdapterBank
from .callbacks import (
    AdapterBankCallback,
    AdaptiveKLCallback,
    DDPCommHookCallback,
    StateCheckpointCallback,
    SyncReferenceCallback,
)
from .collator import RowAllocator
from .config import TRAPOConfig
from .curriculum import CurriculumSchedule
from .data import (
    PRETRAIN,
    RL,
    SFT,
    PretrainStream,
    ShardedSampler,
    check_pretrain_dataset,
    check_prompt_dataset,
    check_sft_dataset,
    tokenize_prompt_dataset,
    tokenize_sft_dataset,
)
from .distributed import check_launch
from .fewshot import FewShotController, prompt_embeddings, replay_max_uses
from .losses import (
    aggregate_rl_loss,
    clipped_policy_loss,
    clipped_value_loss,
    kl_estimate,
    masked_sum,
    sft_token_weights,
    truncated_is_policy_loss,
)
from .memory import ReplayBuffer
from .memory_pool import MemoryPool, build_sft_pool
from .models import PolicyAndValueWrapper, ReferencePolicy, add_frozen_adapter_copy
from .rollout import reward_function_name
from .schedules import RLSchedules, scale_scheduler
from .trainer_eval import EvaluationMixin
from .trainer_metrics import MetricsMixin
from .trainer_rollouts import RolloutMixin
from .trainer_setup import SetupMixin
from .trainer_state import DurableStateMixin
from .trainer_steps import StepsMixin, _StepTickets, _ticket_collator
from .weighting import DARE, DAREWeighting, GradientProbe, StaticWeighting


try:
    from peft import PeftConfig, PeftModel, get_peft_model
except ImportError:  # peft is a dependency; keep the import error readable if it is missing
    PeftConfig = PeftModel = get_peft_model = None

logger = logging.getLogger(__name__)

RewardFunc = str | PreTrainedModel | Callable[..., list[float | None]]


class TRAPOTrainer(
    SetupMixin, StepsMixin, RolloutMixin, MetricsMixin, DurableStateMixin, EvaluationMixin, _BaseTrainer
):
    r"""
    Trains one causal LM on pretraining, SFT and RL objectives jointly (TRAPO).

    Each optimizer step is one joint update L = w_pt * L_pretrain + w_sft * L_sft + w_rl * L_rl (see [`TRAPOConfig`]
    for how the curriculum and DARE set the shares and weights):

    - L_pretrain: mean next-token NLL (nats/token) over the step's pretraining tokens;
    - L_sft: mean NLL over completion tokens (plain or trust-region, `sft_loss_type`);
    - L_rl: PPO's clipped surrogate on completion tokens against behaviour log-probs, aggregated by `loss_type`,
      + `vf_coef` * clipped value loss with a critic, - `entropy_coef` * entropy, with the KL to the reference in the
      reward (PPO) or in the loss (`kl_penalty`). Advantages come from GAE with a `value_model`, otherwise they are
      group-relative over `num_generations` completions per prompt.

    Args:
        model (`str`, `PreTrainedModel` or `PeftModel`):
            The policy, or a model id / local path loaded with `AutoModelForCausalLM.from_pretrained`.
        reward_funcs (reward function, model id, `PreTrainedModel`, or a list of them, *optional*):
            TRL's reward functions: callables `f(prompts, completions, completion_ids, **columns, trainer_state,
            log_metric, log_extra) -> list[float | None]` (sync or async), or sequence-classification models.
        args ([`TRAPOConfig`], *optional*): the configuration.
        train_dataset (`Dataset`, *optional*): RL prompts (prompt-only format, or tokenized `input_ids`).
        eval_dataset (`Dataset` or `dict[str, Dataset]`, *optional*): evaluated by format — prompt-only datasets by
            greedy generation and rewards, `text` datasets by pretraining loss, prompt-completion by SFT loss.
        pretrain_dataset (`Dataset` or `IterableDataset`, *optional*): language-modelling text (`text` column).
        sft_dataset (`Dataset`, *optional*): prompt-completion or `messages` demonstrations.
        processing_class (`PreTrainedTokenizerBase`, *optional*): the policy's tokenizer (loaded from `model` if None).
        reward_processing_classes (tokenizer or list, *optional*): tokenizers of the reward models, aligned with
            `reward_funcs` (+ `reward_model` last); None entries reuse the policy's tokenizer when vocabularies match.
        ref_model (`PreTrainedModel`, *optional*): the reference policy of the KL term. Default: a frozen copy of the
            initial policy, or — with PEFT — the adapter's starting point (adapter disabled, or a frozen copy of an
            adapter that was already trained).
        reward_model (`PreTrainedModel`, *optional*): a sequence-classification reward model (PPO-style argument).
        value_model (`PreTrainedModel`, *optional*): a critic (`AutoModelForSequenceClassification`, `num_labels=1`);
            with it advantages come from GAE and `trainer.model` is a wrapper with `.policy` and `.value_model`.
        callbacks (`list[TrainerCallback]`, *optional*): extra callbacks.
        optimizers (`tuple`, *optional*): `(optimizer, lr_scheduler)` to use instead of the defaults.
        peft_config (`PeftConfig`, *optional*): wraps the policy in a fresh adapter.

    Raises:
        ValueError: before any training, for data or settings that cannot work (no objective has data, missing
            columns, prompts longer than the context, reward functions that fail or return the wrong length, a
            tokenizer without a pad token, ...), with a message naming the argument and the fix.
    """

    _tag_names = ["trl", "trapo"]
    _name = "TRAPO"
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: str | PreTrainedModel | nn.Module,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: TRAPOConfig | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        pretrain_dataset: Dataset | IterableDataset | None = None,
        sft_dataset: Dataset | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes: PreTrainedTokenizerBase | list[PreTrainedTokenizerBase | None] | None = None,
        ref_model: PreTrainedModel | None = None,
        reward_model: PreTrainedModel | None = None,
        value_model: PreTrainedModel | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: PeftConfig | None = None,
    ):
        if args is None:
            args = TRAPOConfig(output_dir="trapo-output")
        if not isinstance(args, TRAPOConfig):
            raise TypeError(f"`args` must be a TRAPOConfig, got {type(args).__name__}.")

        # ---- step 1. policy, tokenizer, reference and critic -----------------------------------------------------
        model_id = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
        if isinstance(model, str):
            model = AutoModelForCausalLM.from_pretrained(model, **(args.model_init_kwargs or {}))
        elif args.model_init_kwargs:
            raise ValueError("`model_init_kwargs` is only used when `model` is a string; drop it or pass a model id.")
        if processing_class is None:
            if not model_id:
                raise ValueError(
                    "Pass `processing_class` (the policy's tokenizer): it cannot be loaded from the model."
                )
            processing_class = AutoTokenizer.from_pretrained(model_id)
        self._check_tokenizer(processing_class)

        created_adapter = False
        if peft_config is not None:
            if get_peft_model is None:
                raise ImportError("`peft_config` needs the `peft` package: pip install peft.")
            if is_peft_model(model):
                raise ValueError("`model` is already a PeftModel; pass either a PeftModel or `peft_config`, not both.")
            model = get_peft_model(model, peft_config)
            created_adapter = True
        if args.disable_dropout:
            disable_dropout_in_model(model)

        ref_adapter: str | None = None  # PEFT reference: an adapter name, or "" for "adapter disabled"
        needs_ref = args.kl_coef > 0
        if (args.model_adapter_name or args.ref_adapter_name) and not is_peft_model(model):
            raise ValueError("`model_adapter_name` / `ref_adapter_name` need a PeftModel policy (or `peft_config`).")
        if args.model_adapter_name:
            model.set_adapter(args.model_adapter_name)
        if args.ref_adapter_name:
            if args.ref_adapter_name not in model.peft_config:
                raise ValueError(
                    f"{type(args).__name__}.ref_adapter_name={args.ref_adapter_name!r} is not an adapter of the policy "
                    f"({list(model.peft_config)}); load it first with `model.load_adapter(path, adapter_name=...)`."
                )
            ref_adapter = args.ref_adapter_name
        if ref_model is not None and is_peft_model(model):
            logger.info("An explicit `ref_model` is used as the reference even though the policy is a PeftModel.")
        if needs_ref and ref_model is None and ref_adapter is None:
            if is_peft_model(model):
                if created_adapter and not args.sync_ref_model:
                    ref_adapter = ""  # a fresh adapter starts at the base model
                else:
                    ref_adapter = add_frozen_adapter_copy(model, model.active_adapter)
            else:
                ref_model = self._create_reference(model, model_id, args)
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
            if args.disable_dropout:
                disable_dropout_in_model(ref_model)

        self._has_critic = value_model is not None
        # "auto": PPO's KL-in-reward with a critic; GRPO's KL-in-loss for group-relative advantages
        self.kl_penalty = args.kl_penalty if args.kl_penalty != "auto" else ("reward" if self._has_critic else "loss")
        if self.kl_penalty == "loss" and args.kl_estimator == "k1" and args.kl_coef > 0:
            logger.warning(
                "kl_penalty='loss' with kl_estimator='k1': the gradient of k1 is zero in expectation, so the KL term "
                "barely regularises. Use kl_estimator='k3' (or k2)."
            )
        if self._has_critic:
            if args.disable_dropout:
                disable_dropout_in_model(value_model)
            train_model = PolicyAndValueWrapper(model, value_model)
        else:
            train_model = model

        # ---- step 2. rewards ------------------------------------------------------------------------------------
        if reward_funcs is None:
            reward_funcs = []
        elif not isinstance(reward_funcs, list):
            reward_funcs = [reward_funcs]
        reward_funcs = list(reward_funcs) + ([reward_model] if reward_model is not None else [])
        if not isinstance(reward_processing_classes, list):
            reward_processing_classes = [reward_processing_classes] * len(reward_funcs)
        if len(reward_processing_classes) != len(reward_funcs):
            raise ValueError(
                f"`reward_processing_classes` has {len(reward_processing_classes)} entries for {len(reward_funcs)} "
                "reward functions/models; give one per reward (None reuses the policy's tokenizer)."
            )
        self.reward_funcs, self.reward_processing_classes = [], []
        for func, tok in zip(reward_funcs, reward_processing_classes):
            if isinstance(func, str):
                tok = tok or AutoTokenizer.from_pretrained(func)
                func = AutoModelForSequenceClassification.from_pretrained(func, num_labels=1)
            if isinstance(func, nn.Module):
                func.eval().requires_grad_(False)
                if tok is None:
                    tok = processing_class
            self.reward_funcs.append(func)
            self.reward_processing_classes.append(tok)
        self.reward_func_names = [reward_function_name(f) for f in self.reward_funcs]
        if args.reward_weights is not None and len(args.reward_weights) != len(self.reward_funcs):
            raise ValueError(
                f"{type(args).__name__}.reward_weights has {len(args.reward_weights)} entries for {len(self.reward_funcs)} "
                "reward functions/models; give one weight per reward."
            )
        self.reward_weights = torch.tensor(args.reward_weights or [1.0] * len(self.reward_funcs), dtype=torch.float32)

        # ---- step 3. datasets -----------------------------------------------------------------------------------
        template_kwargs = args.chat_template_kwargs or {}
        self._rl_dataset = None
        max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if train_dataset is not None and args.rl_weight > 0:
            if isinstance(train_dataset, IterableDataset):
                raise ValueError(
                    "`train_dataset` (RL prompts) is an IterableDataset, but prompts are sampled by index and "
                    "checked for length before training: pass a map-style `Dataset` (e.g. "
                    "`Dataset.from_list(list(iterable.take(n)))`). Streaming is supported for `pretrain_dataset`."
                )
            check_prompt_dataset(train_dataset)
            if not self.reward_funcs:
                raise ValueError(
                    "`train_dataset` (RL prompts) was given without any reward: pass `reward_funcs` and/or "
                    "`reward_model`, or set rl_weight=0 to train without RL."
                )
            self._rl_dataset = tokenize_prompt_dataset(
                train_dataset, processing_class, args.max_prompt_length, template_kwargs
            )
            longest = max(len(ids) for ids in self._rl_dataset["prompt_ids"])
            if max_positions is not None and longest + args.response_length > max_positions:
                raise ValueError(
                    f"The longest prompt ({longest} tokens) + response_length={args.response_length} exceeds the "
                    f"model's context of {max_positions} positions. Lower `response_length` or filter long prompts."
                )
        self._sft_dataset = None
        if sft_dataset is not None and args.sft_weight > 0:
            check_sft_dataset(sft_dataset)
            self._sft_dataset = tokenize_sft_dataset(
                sft_dataset, processing_class, args.sft_max_length, template_kwargs
            )
            longest = max((len(ids) for ids in self._sft_dataset["input_ids"]), default=0)
            if max_positions is not None and longest > max_positions:
                raise ValueError(
                    f"{type(args).__name__}.sft_max_length={args.sft_max_length} lets SFT rows of {longest} tokens through, "
                    f"beyond the model's context of {max_positions} positions: set sft_max_length <= {max_positions}."
                )
        if (
            pretrain_dataset is not None
            and args.pretrain_weight > 0
            and max_positions is not None
            and args.pretrain_max_length > max_positions
        ):
            raise ValueError(
                f"{type(args).__name__}.pretrain_max_length={args.pretrain_max_length} exceeds the model's context of "
                f"{max_positions} positions: set pretrain_max_length <= {max_positions}."
            )
        self._check_eval_dataset(eval_dataset)
        self._pretrain_source = None
        if pretrain_dataset is not None and args.pretrain_weight > 0:
            check_pretrain_dataset(pretrain_dataset)
            self._pretrain_source = pretrain_dataset
        self.active = (self._pretrain_source is not None, self._sft_dataset is not None, self._rl_dataset is not None)
        if not any(self.active):
            raise ValueError(
                "No objective has data: pass at least one of `train_dataset` (RL prompts, with rewards), "
                "`sft_dataset` or `pretrain_dataset`, with a weight > 0 (pretrain_weight / sft_weight / rl_weight)."
            )
        if self.active[RL] and not self._has_critic and args.num_generations < 2:
            raise ValueError(
                f"{type(args).__name__}.num_generations={args.num_generations}: without a value_model, advantages are "
                "group-relative and need at least 2 completions per prompt. Set num_generations >= 2 or pass a "
                "value_model."
            )
        if self.active[RL]:
            self._preflight_reward_funcs(processing_class)

        # ---- step 4. the Trainer -------------------------------------------------------------------------------
        self._planned_steps, tickets = self._plan_steps(args)
        if args.total_episodes is not None and args.max_steps <= 0:  # the run's length, in the trainer's own copy
            args = dataclasses.replace(args, max_steps=self._planned_steps)
        super().__init__(
            model=train_model,
            args=args,
            data_collator=_ticket_collator,
            train_dataset=_StepTickets(tickets),
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        check_launch(self.accelerator)

        # ---- step 5. per-rank pools, curriculum, DARE, replay ----------------------------------------------------
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        seed = args.seed
        self._pretrain_stream = (
            PretrainStream(
                self._pretrain_source,
                processing_class,
                args.pretrain_max_length,
                packing=args.pretrain_packing,
                seed=seed,
                rank=rank,
                world_size=world,
            )
            if self.active[PRETRAIN]
            else None
        )
        self._sft_pool = (
            build_sft_pool(args, self._sft_dataset, self._planned_steps, rank, world) if self.active[SFT] else None
        )
        self._prompt_sampler = (
            ShardedSampler(len(self._rl_dataset), seed=seed + 2, rank=rank, world_size=world)
            if self.active[RL]
            else None
        )
        self.replay = ReplayBuffer(
            capacity=args.replay_capacity,
            max_bytes=args.replay_max_bytes,
            max_uses=replay_max_uses(args),  # num_ppo_epochs, raised in few-shot mode
            max_age=args.replay_max_age,
            seed=seed + 3 + rank,
            compress=args.replay_compress,
            compress_threshold=args.replay_compress_threshold,
        )
        # the long-term SFT pool (uniform or prioritised), few-shot mode and the adapter bank (trl_trapo/memory_pool.py)
        self.memory_pool = MemoryPool(
            self._sft_pool,
            self._prompt_sampler,
            fewshot=self._build_fewshot(args) if args.fewshot_mode else None,
            adapter_bank=self._build_adapter_bank(args),
            rank=rank,
            kl_estimator=args.kl_estimator,
        )
        self.allocator = RowAllocator()
        schedule = CurriculumSchedule(
            args.curriculum_boundaries,
            [args.curriculum_mixtures[i : i + 3] for i in range(0, len(args.curriculum_mixtures), 3)],
            self._planned_steps,
            args.curriculum_decay_steps,
            active=tuple(a and c > 0 for a, c in zip(self.active, args.objective_weights)),
            mode=args.curriculum_mode,
        )
        self.curriculum = schedule
        engine = (
            DAREWeighting(
                self.active,
                args.dare_momentum,
                args.dare_min_factor,
                args.dare_max_factor,
                noise_floor=self._probe_noise_floor(model, args),
            )
            if args.dare_mode == "dynamic" and sum(self.active) > 1
            else StaticWeighting()  # one objective: weights renormalise to 1 whatever DARE says, so do not probe
        )
        interval = args.dare_update_interval or math.ceil(math.sqrt(self._planned_steps))
        self.dare = DARE(engine, interval, probe_factory=self._make_probe if args.dare_mode == "dynamic" else None)
        # learning rate / entropy by curriculum phase, adaptive KL (trl_trapo/schedules.py)
        self.schedules = RLSchedules(args, (schedule.boundary_steps or [None])[-1])
        if self.schedules.adaptive_kl:
            self.add_callback(AdaptiveKLCallback(self.schedules, self._reduce_sum))
        self.add_callback(DDPCommHookCallback(lambda: self.model_wrapped, self.accelerator))
        self._row_generator = torch.Generator().manual_seed(seed + 4 + rank)
        # Rollout sampling draws from its own checkpointed generator (through `fork_rng`), so a resumed run samples
        # exactly what an uninterrupted one would, whatever the Trainer does with the global RNG.
        self._generation_generator = torch.Generator().manual_seed(seed + 5 + rank)
        self.add_callback(StateCheckpointCallback(self._save_trapo_state))

        self.ref_model = ref_model
        if self.ref_model is not None:
            self.ref_model = self._prepare_frozen(self.ref_model)
        self.reference = None  # the KL term's reference (none when kl_coef = 0)
        if args.kl_coef > 0 and (self.ref_model is not None or ref_adapter is not None):
            self.reference = ReferencePolicy(self.ref_model, ref_adapter, unwrap=self.accelerator.unwrap_model)
        if args.sync_ref_model and args.kl_coef > 0:
            if self.reference is None or not self.reference.syncable:
                raise ValueError(
                    "sync_ref_model=True needs a reference to update: a `ref_model`, or a PEFT policy (its reference "
                    "adapter is then a synced copy); not an explicit `ref_adapter_name` you manage yourself."
                )
            self.add_callback(SyncReferenceCallback(self.reference, self._unwrapped_policy))
        for i, func in enumerate(self.reward_funcs):
            if isinstance(func, nn.Module):
                self.reward_funcs[i] = self._prepare_frozen(func)

        self.generation_config = self._build_generation_config(args, processing_class)
        self._vllm = None
        if args.use_vllm and self.active[RL]:
            from .vllm_rollouts import VLLMRollouts

            self._vllm = VLLMRollouts(self)
        self._stop_token_id = self.generation_config.eos_token_id
        if isinstance(self._stop_token_id, list):
            self._stop_token_id = self._stop_token_id[0]

        self._episode = 0
        self._nonfinite_steps = 0
        self._step_nonfinite = torch.zeros((), dtype=torch.bool)
        self._step_context: dict[str, Any] = {}
        self._metric_sums: dict[str, torch.Tensor] = {}
        self._metric_steps: dict[str, int] = {}  # steps that contributed to each metric since the last log
        self._step_metric_keys: set[str] = set()
        self._rollout_sums: dict[str, float] = defaultdict(float)
        self._pending_reward_metrics: dict[str, list[float]] = defaultdict(list)
        self._pending_extra: dict[str, list] = defaultdict(list)
        self._same_tokenizer: dict[int, bool] = {}
        self._train_start_time: float | None = None
        self._last_shares = self.curriculum.mixture(0)
        self._last_step_built = 0

    # =================================================================================================================
    # The loss (public Trainer hook: compute_loss)
    # =================================================================================================================
    @staticmethod
    def _probe_noise_floor(model, args: TRAPOConfig) -> float:
        """Three standard deviations of the cosine of two random vectors of the probe's dimension, 3 / sqrt(D)."""
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        rows = min(config.vocab_size, args.dare_probe_vocab)
        dim = min(config.hidden_size, args.dare_probe_dim)
        return 3.0 / math.sqrt(rows * dim)

    def _make_probe(self) -> GradientProbe:
        policy = self._unwrapped_policy()
        config = policy.config.get_text_config() if hasattr(policy.config, "get_text_config") else policy.config
        return GradientProbe(
            config.vocab_size,
            config.hidden_size,
            self.args.dare_probe_vocab,
            self.args.dare_probe_dim,
            device=self.accelerator.device,
            seed=self.args.seed,
        )

    def _build_fewshot(self, args: TRAPOConfig) -> FewShotController:
        policy = self._unwrapped_policy()
        return FewShotController(
            args,
            self._planned_steps,
            self.accelerator.process_index,
            self._prompt_sampler,
            self._rl_dataset,
            self._embed_prompts,
            lm_head=policy.get_output_embeddings() if self._sft_pool is not None else None,
            sft_pool_size=len(self._sft_pool) if self._sft_pool is not None else 0,
            kl_penalty=self.kl_penalty,
        )

    def _embed_prompts(self, prompt_ids: list[list[int]]) -> torch.Tensor:
        """`(n, H)` prompt embeddings for few-shot mode (a no-grad forward of the policy's decoder)."""
        with self._unwrapped_for_rollouts() as unwrapped:
            return prompt_embeddings(
                self._policy_for_generation(unwrapped),
                prompt_ids,
                self.processing_class.pad_token_id,
                self.args.local_rollout_forward_batch_size,
            )

    def _build_adapter_bank(self, args: TRAPOConfig) -> AdapterBankCallback | None:
        """Snapshots of a PEFT policy's adapter (off without PEFT, with `adapter_snapshot_steps=0`, under ZeRO-3)."""
        if args.adapter_snapshot_steps <= 0 or not is_peft_model(self._unwrapped_policy()):
            return None
        if self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3:
            logger.warning("The adapter bank does not gather ZeRO-3 partitioned adapters: it is off.")
            return None
        callback = AdapterBankCallback(
            AdapterBank(os.path.join(args.output_dir, "adapter_bank"), args.max_adapter_snapshots),
            self._unwrapped_policy,
            self.accelerator,
            on_rollback=self.replay.clear,
            every=args.adapter_snapshot_steps,
            reward_drop=args.adapter_rollback_reward_drop,
            kl_max=args.adapter_rollback_kl_max,
        )
        self.add_callback(callback)
        return callback

    def _unwrapped_policy(self) -> nn.Module:
        model = self.accelerator.unwrap_model(self.model)
        return model.policy if isinstance(model, PolicyAndValueWrapper) else model

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch: dict | None = None):
        """L = sum_o w_o * L_o for one micro-batch, with every L_o normalised by its global count of the step.

        The returned value is multiplied by the number of processes because DDP / DeepSpeed average gradients over
        ranks; summed over micro-batches and averaged over ranks it is the step's loss.
        """
        info = num_items_in_batch if isinstance(num_items_in_batch, dict) else self._step_context
        if not info:
            raise RuntimeError(
                "compute_loss got no step information; TRAPOTrainer builds batches in get_batch_samples."
            )
        args = self.args
        weights, counts = info["weights"], info["counts"]
        objective, mask = inputs["objective"], inputs["mask"]
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
        rl_rows = objective == RL
        probe = info["probe"]

        # step 1. one forward of the policy over every row (and of the critic over the RL rows)
        forward_kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        if probe:
            forward_kwargs["output_hidden_states"] = True
        values = None
        if self._has_critic:
            outputs, values = model(**forward_kwargs, value_rows=rl_rows.nonzero().squeeze(-1))
        else:
            outputs = model(**forward_kwargs)
        logits = outputs.logits[:, :-1]  # (B, T, V)
        targets = input_ids[:, 1:]  # (B, T)
        temperature = args.temperature
        if "temperature" in inputs:  # RL rows' own sampling temperatures (few-shot mode anneals it); 0: configured
            row_temperature = torch.where(inputs["temperature"] > 0, inputs["temperature"], temperature)
            scale = torch.where(rl_rows, 1.0 / row_temperature, 1.0).to(logits.dtype)
            logits = logits * scale[:, None, None]
        elif temperature != 1.0 and bool(rl_rows.any()):
            scale = torch.where(rl_rows, 1.0 / temperature, 1.0).to(logits.dtype)
            logits = logits * scale[:, None, None]
        per_token_logps = selective_log_softmax(logits, targets)  # (B, T) nats

        # step 2. the three terms
        masks = [mask * (objective == o).unsqueeze(1).to(mask.dtype) for o in (PRETRAIN, SFT, RL)]
        total_counts = [counts["tokens_pretrain"], counts["tokens_sft"], counts["tokens_rl"]]
        nll = -per_token_logps
        loss_pretrain = masked_sum(nll, masks[PRETRAIN]) / max(total_counts[PRETRAIN], 1.0)
        sft_weights = sft_token_weights(per_token_logps, args.sft_loss_type, args.trust_region_alpha)
        sft_term = nll if sft_weights is None else nll * sft_weights
        sft_term = sft_term * inputs["importance_weight"].unsqueeze(1).to(sft_term.dtype)  # prioritised pool; else 1
        loss_sft_opt = masked_sum(sft_term, masks[SFT]) / max(total_counts[SFT], 1.0)
        loss_sft = masked_sum(nll, masks[SFT]).detach() / max(total_counts[SFT], 1.0)

        loss_rl = torch.zeros((), device=logits.device)
        stats: dict[str, torch.Tensor] = {}
        rl_mask = masks[RL]
        if bool(rl_rows.any()):
            loss_rl, stats, pg_coef = self._rl_loss(inputs, per_token_logps, logits, values, rl_mask, counts, info)
        else:
            pg_coef = None

        total = weights[PRETRAIN] * loss_pretrain + weights[SFT] * loss_sft_opt + weights[RL] * loss_rl
        total = total * self.accelerator.num_processes

        # step 3. DARE probe (update steps only): closed-form LM-head gradients of each objective's two halves
        if probe:
            self._accumulate_probe(outputs, logits, targets, objective, mask, inputs["half"], pg_coef)

        # step 4. metrics (summed over micro-batches; every term already carries its global normaliser)
        with torch.no_grad():
            self._add_metric("loss/pretrain", loss_pretrain)
            self._add_metric("loss/sft", loss_sft)
            self._add_metric("loss/rl", loss_rl)
            for key, value in stats.items():
                self._add_metric(key, value)
        # step 5. per-row SFT feedback to the memory pool (priority proxies, few-shot embeddings), left on the device
        self.memory_pool.after_forward(inputs, per_token_logps, masks[SFT])
        info["micro_index"] += 1
        return (total, outputs) if return_outputs else total

    def _rl_loss(self, inputs, per_token_logps, logits, values, rl_mask, counts, info):
        args = self.args
        n_tokens = max(counts["tokens_rl"], 1.0)
        loss_kwargs = dict(
            loss_type=args.loss_type,
            num_tokens=counts["tokens_rl"],
            num_sequences=counts["sequences_rl"],
            response_length=args.response_length,
            num_micro_batches=counts["micro_batches_rl"],
        )
        old = inputs["old_per_token_logps"]
        advantages = inputs["advantages"]
        importance = inputs["importance_weight"].unsqueeze(1)
        policy = clipped_policy_loss(per_token_logps, old, advantages, args.cliprange, importance)
        per_token = policy.per_token_loss
        if args.importance_sampling_cap is not None:
            per_token = truncated_is_policy_loss(
                per_token_logps, old, advantages, args.importance_sampling_cap, importance
            )
        stats: dict[str, torch.Tensor] = {}
        kl_coef, entropy_coef = self.schedules.kl_coef(), self.schedules.entropy_coef(info["step"])
        if kl_coef > 0 and "ref_per_token_logps" in inputs:
            kl = kl_estimate(per_token_logps, inputs["ref_per_token_logps"], args.kl_estimator)
            if self.kl_penalty == "loss":
                per_token = per_token + kl_coef * kl
            stats["policy/kl_avg"] = masked_sum(kl.detach(), rl_mask) / n_tokens
        if entropy_coef > 0 or self._is_logging_step():
            rows = (inputs["objective"] == RL).nonzero().squeeze(-1)
            with torch.set_grad_enabled(entropy_coef > 0 and torch.is_grad_enabled()):
                entropy = torch.zeros_like(per_token_logps)
                entropy[rows] = entropy_from_logits(logits[rows]).to(entropy.dtype)
            if entropy_coef > 0:
                per_token = per_token - entropy_coef * entropy
            stats["policy/entropy_avg"] = masked_sum(entropy.detach(), rl_mask) / n_tokens
        loss = aggregate_rl_loss(per_token, rl_mask, **loss_kwargs)
        stats["loss/policy_avg"] = aggregate_rl_loss(policy.per_token_loss.detach(), rl_mask, **loss_kwargs)
        stats["policy/clipfrac_avg"] = masked_sum(policy.is_clipped.float(), rl_mask) / n_tokens
        stats["policy/approxkl_avg"] = masked_sum(policy.approx_kl, rl_mask) / n_tokens
        stats["val/ratio"] = masked_sum(policy.ratio, rl_mask) / n_tokens
        stats["val/ratio_sq"] = masked_sum(policy.ratio**2, rl_mask) / n_tokens
        if self._has_critic and values is not None:
            rows = (inputs["objective"] == RL).nonzero().squeeze(-1)
            value_pred = values[:, :-1].to(per_token_logps.dtype)  # (B_rl, T) value at position t predicts token t+1
            value_mask = rl_mask[rows]
            value_out = clipped_value_loss(
                value_pred, inputs["old_values"][rows], inputs["returns"][rows], args.cliprange_value
            )
            value_kwargs = dict(loss_kwargs)
            value_loss = aggregate_rl_loss(value_out.per_token_loss, value_mask, **value_kwargs)
            loss = loss + args.vf_coef * value_loss
            stats["loss/value_avg"] = value_loss.detach()
            stats["val/clipfrac_avg"] = masked_sum(value_out.is_clipped.float(), value_mask) / n_tokens
        # d loss / d log pi per token for the DARE probe: A * rho where the unclipped branch is active
        pg_coef = (advantages * policy.ratio * (~policy.is_clipped).float() * rl_mask).detach()
        return loss, stats, pg_coef

    def _accumulate_probe(self, outputs, logits, targets, objective, mask, half, pg_coef) -> None:
        hidden = outputs.hidden_states[-1][:, :-1]  # (B, T, H): the states the LM head reads
        coefficients = torch.ones_like(mask)
        if pg_coef is not None:
            coefficients = torch.where((objective == RL).unsqueeze(1), pg_coef, coefficients)
        counted = mask.bool()
        if not bool(counted.any()):
            return
        token_objective = objective.unsqueeze(1).expand_as(mask)[counted]
        token_half = half.unsqueeze(1).expand_as(mask)[counted]
        self.dare.probe.accumulate(
            hidden[counted].detach(),
            logits[counted].detach(),
            targets[counted],
            coefficients[counted],
            token_objective,
            token_half,
        )

    # =================================================================================================================
    # The optimizer step: non-finite guard and DARE update (public hooks)
    # =================================================================================================================
    def create_optimizer(self, model=None):
        """The Trainer's optimizer, with a guard that skips a step whose loss was not finite on any rank."""
        optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        if not getattr(optimizer, "_trapo_guarded", False):
            original_step = optimizer.step

            def guarded_step(*step_args, **step_kwargs):
                if self._consume_nonfinite_flag():
                    optimizer.zero_grad(set_to_none=True)
                    return None
                return original_step(*step_args, **step_kwargs)

            optimizer.step = guarded_step
            optimizer._trapo_guarded = True
        return optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The Trainer's scheduler, its factor multiplied by the curriculum phase's learning-rate scale
        (`rl_phase_learning_rate`; a pure function of the step, see `schedules.scale_scheduler`)."""
        wrap = self.lr_scheduler is None and self.schedules.scales_lr
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if wrap:
            scale_scheduler(scheduler, self.schedules.lr_scale)
        return scheduler

    def _reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over ranks, on the tensor's own device (the tensor itself on one process)."""
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.reduce(tensor.to(self.accelerator.device), reduction="sum").to(tensor.device)

    def _consume_nonfinite_flag(self) -> bool:
        flag = self._step_nonfinite.float().to(self.accelerator.device)
        flag = self.accelerator.reduce(flag, reduction="sum")
        self._step_nonfinite = torch.zeros((), dtype=torch.bool)
        if float(flag) == 0:
            return False
        self._nonfinite_steps += 1
        logger.warning(
            "Step %d: the loss was not finite; the optimizer step is skipped (%d/%d allowed).",
            self.state.global_step,
            self._nonfinite_steps,
            self.args.max_nonfinite_steps,
        )
        if self._nonfinite_steps >= self.args.max_nonfinite_steps:
            raise RuntimeError(
                f"{self._nonfinite_steps} optimizer steps had a non-finite loss (max_nonfinite_steps="
                f"{self.args.max_nonfinite_steps}); stopping. Lower the learning rate, check the rewards for NaN/inf "
                "and the data for empty rows, or raise `max_nonfinite_steps`."
            )
        return True

    def training_step(self, model, inputs, num_items_in_batch=None):
        """The Trainer's step, plus: at the last micro-batch of a step, metrics bookkeeping and the DARE update."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        # no host sync: the flag stays on the device until the optimizer step reads it
        self._step_nonfinite = self._step_nonfinite.to(loss.device) | ~torch.isfinite(loss.detach())
        info = self._step_context
        if info and info["micro_index"] >= info["num_micro"]:
            for key in self._step_metric_keys:
                self._metric_steps[key] = self._metric_steps.get(key, 0) + 1
            self._step_metric_keys = set()
            if info["probe"]:
                self.dare.finish_step(info["step"], self._reduce_sum)
            info["micro_index"] = -1  # done
            samples = self.args.num_sample_generations
            if samples > 0 and info["step"] % max(1, self._planned_steps // samples) == 0:
                self.generate_completions(sampling=True)
        return loss
