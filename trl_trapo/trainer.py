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
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset, IterableDataset
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
)
from trl.data_utils import is_conversational
from trl.models import prepare_deepspeed, unwrap_model_for_generation
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.callbacks import SyncRefModelCallback
from trl.trainer.utils import (
    disable_dropout_in_model,
    entropy_from_logits,
    print_prompt_completions_sample,
    selective_log_softmax,
    use_adapter,
)

from .checkpoint import (
    CheckpointError,
    last_complete_checkpoint,
    read_rank_state,
    restore_rng,
    rng_tensors,
    verify_checkpoint,
    write_rank_state,
)
from .collator import RowAllocator, collate_rows, split_micro_batches
from .config import OBJECTIVES, TRAPOConfig
from .curriculum import CurriculumCallback, CurriculumSchedule
from .data import (
    PRETRAIN,
    RL,
    SFT,
    PretrainStream,
    ShardedSampler,
    check_pretrain_dataset,
    check_prompt_dataset,
    check_sft_dataset,
    dataset_columns,
    tokenize_prompt,
    tokenize_prompt_dataset,
    tokenize_sft_dataset,
)
from .distributed import (
    DDPCommHookCallback,
    any_rank,
    check_launch,
    full_state_dict,
    generation_synced_gpus,
    load_full_state_dict,
    reduce_named_means,
    reduce_replay_metrics,
    zero3_reference_copy,
)
from .fewshot import replay_max_uses
from .losses import (
    aggregate_rl_loss,
    clipped_policy_loss,
    clipped_value_loss,
    gae_advantages,
    group_relative_advantages,
    kl_estimate,
    masked_sum,
    masked_whiten,
    per_token_rewards,
    sft_token_weights,
    truncated_is_policy_loss,
)
from .memory import ReplayBuffer, trajectory_row
from .memory_pool import MemoryPool
from .models import PolicyAndValueWrapper, add_frozen_adapter_copy
from .rollout import (
    call_reward_function,
    completion_logps,
    generate,
    reward_function_name,
    reward_model_scores,
    value_predictions,
)
from .schedules import ScheduleCallback
from .weighting import DARECallback, DAREWeighting, GradientProbe, StaticWeighting, combine_weights


try:
    from peft import PeftConfig, PeftModel, get_peft_model
except ImportError:  # peft is a dependency; keep the import error readable if it is missing
    PeftConfig = PeftModel = get_peft_model = None

logger = logging.getLogger(__name__)

RewardFunc = str | PreTrainedModel | Callable[..., list[float | None]]
COUNT_KEYS = ("tokens_pretrain", "tokens_sft", "tokens_rl", "sequences_rl", "micro_batches_rl")


class _StepTickets(torch.utils.data.Dataset):
    """The Trainer's train dataset: one placeholder item per row slot, so its epoch and step bookkeeping works.

    The real rows are drawn by `TRAPOTrainer.get_batch_samples` from the three objectives' pools.
    """

    def __init__(self, length: int):
        self.length = max(int(length), 1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, int]:
        return {"ticket": index}


def _ticket_collator(features: list[dict]) -> dict[str, torch.Tensor]:
    return {"ticket": torch.tensor([f["ticket"] for f in features])}


class _StateCheckpointCallback(TrainerCallback):
    """Writes TRAPO's own state into each `checkpoint-N` directory right after the Trainer has written its files."""

    def __init__(self, trainer: TRAPOTrainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        directory = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(directory):
            self.trainer._save_trapo_state(directory)
        return control


class _SyncReferenceCallback(TrainerCallback):
    """ref <- alpha * policy + (1 - alpha) * ref every `ref_model_sync_steps` (TR-DPO), with TRL's own update for a
    separate reference model (which gathers ZeRO-3 parameters) and a parameter-wise update of the frozen reference
    adapter for PEFT policies."""

    def __init__(self, trainer: TRAPOTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps:
            return control
        trainer, alpha = self.trainer, args.ref_model_mixup_alpha
        policy = trainer._unwrapped_policy()
        if trainer.ref_model is not None:
            SyncRefModelCallback.sync_target_model(policy, trainer.accelerator.unwrap_model(trainer.ref_model), alpha)
        else:
            source, target = f".{policy.active_adapter}.", f".{trainer._ref_adapter}."
            params = dict(policy.named_parameters())
            with torch.no_grad():
                for name, param in params.items():
                    if source in name:
                        params[name.replace(source, target)].mul_(1.0 - alpha).add_(param, alpha=alpha)
        return control


class TRAPOTrainer(_BaseTrainer):
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

        self._ref_adapter: str | None = None  # PEFT reference: an adapter name, or "" for "adapter disabled"
        needs_ref = args.kl_coef > 0
        if (args.model_adapter_name or args.ref_adapter_name) and not is_peft_model(model):
            raise ValueError("`model_adapter_name` / `ref_adapter_name` need a PeftModel policy (or `peft_config`).")
        if args.model_adapter_name:
            model.set_adapter(args.model_adapter_name)
        if args.ref_adapter_name:
            if args.ref_adapter_name not in model.peft_config:
                raise ValueError(
                    f"TRAPOConfig.ref_adapter_name={args.ref_adapter_name!r} is not an adapter of the policy "
                    f"({list(model.peft_config)}); load it first with `model.load_adapter(path, adapter_name=...)`."
                )
            self._ref_adapter = args.ref_adapter_name
        if ref_model is not None and is_peft_model(model):
            logger.info("An explicit `ref_model` is used as the reference even though the policy is a PeftModel.")
        if needs_ref and ref_model is None and self._ref_adapter is None:
            if is_peft_model(model):
                if created_adapter and not args.sync_ref_model:
                    self._ref_adapter = ""  # a fresh adapter starts at the base model
                else:
                    self._ref_adapter = add_frozen_adapter_copy(model, model.active_adapter)
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
                f"TRAPOConfig.reward_weights has {len(args.reward_weights)} entries for {len(self.reward_funcs)} "
                "reward functions/models; give one weight per reward."
            )
        self.reward_weights = torch.tensor(args.reward_weights or [1.0] * len(self.reward_funcs), dtype=torch.float32)

        # ---- step 3. datasets -----------------------------------------------------------------------------------
        template_kwargs = args.chat_template_kwargs or {}
        self._rl_dataset = None
        if train_dataset is not None and args.rl_weight > 0:
            check_prompt_dataset(train_dataset)
            if not self.reward_funcs:
                raise ValueError(
                    "`train_dataset` (RL prompts) was given without any reward: pass `reward_funcs` and/or "
                    "`reward_model`, or set rl_weight=0 to train without RL."
                )
            self._rl_dataset = tokenize_prompt_dataset(
                train_dataset, processing_class, args.max_prompt_length, template_kwargs
            )
            max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
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
                f"TRAPOConfig.num_generations={args.num_generations}: without a value_model, advantages are "
                "group-relative and need at least 2 completions per prompt. Set num_generations >= 2 or pass a "
                "value_model."
            )
        if self.active[RL]:
            self._preflight_reward_funcs(processing_class)

        # ---- step 4. the Trainer -------------------------------------------------------------------------------
        self._planned_steps, tickets = self._plan_steps(args)
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
        # the long-term SFT pool (uniform or prioritised), few-shot mode and the adapter bank (trl_trapo/memory_pool.py)
        self.memory_pool = MemoryPool(self, rank, world)
        self._sft_pool = self.memory_pool.sft_pool
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
        self.allocator = RowAllocator()
        schedule = CurriculumSchedule(
            args.curriculum_boundaries,
            [args.curriculum_mixtures[i : i + 3] for i in range(0, len(args.curriculum_mixtures), 3)],
            self._planned_steps,
            args.curriculum_decay_steps,
            active=tuple(a and c > 0 for a, c in zip(self.active, args.objective_weights)),
            mode=args.curriculum_mode,
        )
        self.curriculum = CurriculumCallback(schedule)
        engine = (
            DAREWeighting(
                self.active,
                args.dare_momentum,
                args.dare_min_factor,
                args.dare_max_factor,
                noise_floor=self._probe_noise_floor(model, args),
            )
            if args.dare_mode == "dynamic"
            else StaticWeighting()
        )
        interval = args.dare_update_interval or math.ceil(math.sqrt(self._planned_steps))
        self.dare = DARECallback(engine, interval)
        self.add_callback(self.curriculum)
        self.add_callback(self.dare)
        # learning rate / entropy by curriculum phase, adaptive KL (trl_trapo/schedules.py)
        self.schedules = ScheduleCallback(self, (schedule.boundary_steps or [None])[-1])
        self.add_callback(self.schedules)
        self.add_callback(DDPCommHookCallback(self))
        self._probe: GradientProbe | None = None
        self._row_generator = torch.Generator().manual_seed(seed + 4 + rank)
        # Rollout sampling draws from its own checkpointed generator (through `fork_rng`), so a resumed run samples
        # exactly what an uninterrupted one would, whatever the Trainer does with the global RNG.
        self._generation_generator = torch.Generator().manual_seed(seed + 5 + rank)
        self.add_callback(_StateCheckpointCallback(self))

        self.ref_model = ref_model
        if self.ref_model is not None:
            self.ref_model = self._prepare_frozen(self.ref_model)
        if args.sync_ref_model and args.kl_coef > 0:
            if self.ref_model is None and not self._ref_adapter:
                raise ValueError(
                    "sync_ref_model=True needs a reference to update: a `ref_model`, or a PEFT policy (its reference "
                    "adapter is then a synced copy); not an explicit `ref_adapter_name` you manage yourself."
                )
            self.add_callback(_SyncReferenceCallback(self))
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
    # Construction helpers
    # =================================================================================================================
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

    def _plan_steps(self, args: TRAPOConfig) -> tuple[int, int]:
        """Planned optimizer steps N, and the length of the ticket dataset that makes the Trainer run N steps.

        `max_steps` wins. Otherwise N follows from the "primary" dataset at its mean curriculum share: the RL prompts
        (each of `total_episodes` — or `num_train_epochs` x prompts x `num_generations` — completions used
        `num_ppo_epochs` times), else the SFT rows, else the map-style pretraining documents. `total_episodes` sets
        `args.max_steps` to N (it fixes the length of the run whatever `num_train_epochs` says).
        """
        world = max(args.world_size, 1)
        rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
        if args.max_steps > 0:
            return args.max_steps, rows_per_step * args.max_steps
        shares = CurriculumSchedule(
            args.curriculum_boundaries,
            [args.curriculum_mixtures[i : i + 3] for i in range(0, len(args.curriculum_mixtures), 3)],
            1000,
            args.curriculum_decay_steps,
            active=tuple(a and c > 0 for a, c in zip(self.active, args.objective_weights)),
            mode="constant",
        ).mixture(0)
        epochs = args.num_train_epochs
        if self.active[RL]:
            group = 1 if self._has_critic else args.num_generations
            completions = args.total_episodes or len(self._rl_dataset) * group * epochs
            rows, share = completions * args.num_ppo_epochs, shares[RL]
        elif self.active[SFT]:
            rows, share = len(self._sft_dataset) * epochs, shares[SFT]
        elif isinstance(self._pretrain_source, Dataset):
            rows, share = len(self._pretrain_source) * epochs, shares[PRETRAIN]
        else:
            raise ValueError(
                "With only a streaming `pretrain_dataset`, the number of steps cannot be derived: set `max_steps`."
            )
        total = max(math.ceil(rows / (rows_per_step * share)), 1)
        if args.total_episodes is not None:
            args.max_steps = total
            return total, rows_per_step * total
        steps_per_epoch = max(math.ceil(total / epochs), 1)
        return total, steps_per_epoch * rows_per_step

    def _reward_kwargs(self, examples: list[dict]) -> dict[str, Any]:
        keys = [k for k in examples[0] if k not in ("prompt", "completion", "completion_ids", "prompt_ids")]
        kwargs = {k: [e[k] for e in examples] for k in keys}
        kwargs["trainer_state"] = getattr(self, "state", None)
        kwargs["log_metric"] = lambda name, value: self._pending_reward_metrics[name].append(float(value))
        kwargs["log_extra"] = lambda column, values: self._pending_extra[column].extend(values)
        return kwargs

    def _preflight_reward_funcs(self, tokenizer) -> None:
        """Call every reward function once on two dataset rows with placeholder completions, before training."""
        rows = [self._rl_dataset[i] for i in range(min(2, len(self._rl_dataset)))]
        prompts = [r["prompt"] for r in rows]
        conversational = is_conversational({"prompt": prompts[0]})
        completions = [[{"role": "assistant", "content": ""}] if conversational else "" for _ in rows]
        self._pending_reward_metrics = defaultdict(list)
        self._pending_extra = defaultdict(list)
        for func, name in zip(self.reward_funcs, self.reward_func_names):
            if isinstance(func, nn.Module):
                continue
            call_reward_function(
                func,
                name,
                len(rows),
                dict(
                    prompts=prompts,
                    completions=completions,
                    completion_ids=[[] for _ in rows],
                    **self._reward_kwargs(rows),
                ),
            )

    # =================================================================================================================
    # Building a step (public Trainer hook: get_batch_samples)
    # =================================================================================================================
    def get_batch_samples(self, epoch_iterator, num_batches: int, device) -> tuple[list, dict | None]:
        """Draw this optimizer step's rows from the three pools and split them into `num_batches` micro-batches.

        Returns `(micro_batches, step_info)`; `step_info` (passed to `compute_loss` as `num_items_in_batch`) holds the
        loss weights and the global per-objective counts of the whole step.
        """
        tickets = []
        for _ in range(num_batches):
            try:
                tickets.append(next(epoch_iterator))
            except StopIteration:
                break
        if not tickets:
            return [], None
        return self._build_step(len(tickets))

    def _build_step(self, num_micro: int) -> tuple[list[dict], dict]:
        args = self.args
        step = self.state.global_step
        self._last_step_built = step
        # step 1. shares and weights
        shares = self.curriculum.mixture(step)
        weights = combine_weights(args.objective_weights, shares, self.dare.engine.weights())
        self.dare.last_weights = weights
        self._last_shares = shares
        # step 2. rows
        counts = self.allocator.allocate(args.per_device_train_batch_size * num_micro, shares)
        rows: list[dict] = []
        if counts[PRETRAIN]:
            rows += self._pretrain_stream.take(counts[PRETRAIN])
        if counts[SFT]:
            rows += self.memory_pool.take_sft(counts[SFT], step)
        if counts[RL]:
            rows += self._take_rl(counts[RL], step)
        order = torch.randperm(len(rows), generator=self._row_generator).tolist()
        for position, index in enumerate(order):
            rows[index]["half"] = position % 2
        # step 3. micro-batches
        groups = split_micro_batches(rows, num_micro)
        batches = [collate_rows(group, self.processing_class.pad_token_id) for group in groups]
        # step 4. global counts
        local = torch.zeros(len(COUNT_KEYS), dtype=torch.float64)
        for batch in batches:
            token_counts = batch["mask"].sum(-1)
            for o, key in ((PRETRAIN, 0), (SFT, 1), (RL, 2)):
                local[key] += token_counts[batch["objective"] == o].sum()
            rl_rows = (batch["objective"] == RL) & (token_counts > 0)
            local[3] += rl_rows.sum()
            local[4] += float(rl_rows.any())
        total = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").cpu()
        probe = self.dare.is_update_step(step)
        if probe and self._probe is None:
            self._probe = self._make_probe()
        if probe:
            self._probe.reset()
        info = {
            "weights": weights,
            "counts": dict(zip(COUNT_KEYS, total.tolist())),
            "probe": probe,
            "step": step,
            "micro_index": 0,
            "num_micro": num_micro,
        }
        self._step_context = info
        return batches, info

    def _take_rl(self, n: int, step: int) -> list[dict]:
        for _ in range(20):
            # every rank generates when any rank needs to: a round gathers ZeRO-3 weights (a collective), and
            # replay buffers can differ across ranks (rewards of None drop rollouts)
            if not any_rank(self.accelerator, self.replay.num_available(step) < n):
                break
            self._generate_round(n, step)
        else:
            raise RuntimeError(
                "20 generation rounds in a row produced no usable trajectory: every reward function returned None "
                "for every completion? Check the reward functions."
            )
        return [trajectory_row(t) for t in self.replay.sample(n, step)]

    # =================================================================================================================
    # Rollouts
    # =================================================================================================================
    def _policy_for_generation(self, unwrapped: nn.Module) -> nn.Module:
        return unwrapped.policy if isinstance(unwrapped, PolicyAndValueWrapper) else unwrapped

    @torch.no_grad()
    def _generate_round(self, rows_needed: int, step: int) -> None:
        """Generate, score and store enough trajectories for `num_mini_batches` steps of `rows_needed` RL rows."""
        args = self.args
        group = 1 if self._has_critic else args.num_generations
        num_prompts = max(math.ceil(rows_needed * args.num_mini_batches / group), 1)
        examples = [self._rl_dataset[i] for i in self.memory_pool.select_prompts(num_prompts)]
        examples = [e for e in examples for _ in range(group)]
        prompt_ids = [torch.tensor(e["prompt_ids"], dtype=torch.long) for e in examples]
        if self._vllm is not None:  # vLLM samples; cutting, behaviour log-probs and scoring are process_rollouts'
            completion_ids = self._vllm.generate([p.tolist() for p in prompt_ids], group, step)
            self.replay.add(self.process_rollouts(examples, completion_ids, None, group), step)
            return
        with self._unwrapped_for_rollouts() as unwrapped:
            # step 1. generate (behaviour log-probs are recorded during sampling)
            policy = self._policy_for_generation(unwrapped)
            sampling_seed = int(torch.randint(0, 2**62, (1,), generator=self._generation_generator))
            devices = [self.accelerator.device.index or 0] if self.accelerator.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(sampling_seed)
                generated = generate(
                    policy,
                    [p.tolist() for p in prompt_ids],
                    self.generation_config,
                    self.processing_class.pad_token_id,
                    self._stop_token_id,
                    args.temperature,
                    batch_size=args.local_rollout_forward_batch_size,
                    synced_gpus=generation_synced_gpus(self.accelerator, args.ds3_gather_for_generation),
                )
            # steps 2-4. reference log-probs, values, scores, advantages
            trajectories = self._score_rollouts(
                unwrapped, examples, prompt_ids, generated["completion_ids"], generated["old_per_token_logps"], group
            )
        self.replay.add(trajectories, step)

    @contextmanager
    def _unwrapped_for_rollouts(self):
        """The model unwrapped for generation (weights gathered under ZeRO-3), in eval mode for the duration."""
        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation
        ) as unwrapped:
            was_training = unwrapped.training
            unwrapped.eval()
            try:
                yield unwrapped
            finally:
                unwrapped.train(was_training)

    @torch.no_grad()
    def process_rollouts(
        self,
        examples: list[dict],
        completion_ids: list[torch.Tensor],
        old_per_token_logps: list[torch.Tensor] | None = None,
        group: int | None = None,
    ) -> list[dict]:
        """Turn given rollouts into replay trajectories, exactly as generated ones are (for fixed / external rollouts).

        Each completion is cut after its first stop token; then come the reference log-probs, the critic's values,
        the scores (reward functions / models, `missing_eos_penalty`) and the advantages (GAE with a critic, else
        group-relative over consecutive groups of `group` completions).

        Args:
            examples (`list[dict]`): one dataset row per completion (`prompt` and reward columns; `prompt_ids` is
                computed when absent).
            completion_ids (`list[torch.Tensor]`): `(C_i,)` token ids per completion.
            old_per_token_logps (`list[torch.Tensor]`, *optional*): `(C_i,)` behaviour log-probs; computed with the
                current policy (temperature-scaled) when None.
            group (`int`, *optional*): completions per prompt (default: 1 with a critic, else `num_generations`).

        Returns:
            `list[dict]`: trajectories (see `ReplayBuffer`), not yet added to the buffer; completions whose every
            reward is None are dropped.
        """
        group = group or (1 if self._has_critic else self.args.num_generations)
        template = self.args.chat_template_kwargs or {}
        prompt_ids = [
            torch.tensor(
                e["prompt_ids"] if "prompt_ids" in e else tokenize_prompt(e["prompt"], self.processing_class, template)
            )
            for e in examples
        ]
        cut = []
        for c in completion_ids:
            c = torch.as_tensor(c, dtype=torch.long)
            if self._stop_token_id is not None and (c == self._stop_token_id).any():
                c = c[: int((c == self._stop_token_id).nonzero()[0]) + 1]
            cut.append(c)
        if old_per_token_logps is not None:
            old_per_token_logps = [lp[: c.numel()] for lp, c in zip(old_per_token_logps, cut)]
        with self._unwrapped_for_rollouts() as unwrapped:
            return self._score_rollouts(unwrapped, examples, prompt_ids, cut, old_per_token_logps, group)

    def _score_rollouts(self, unwrapped, examples, prompt_ids, completion_ids, old_logps, group) -> list[dict]:
        args = self.args
        pad_id = self.processing_class.pad_token_id
        policy = self._policy_for_generation(unwrapped)
        if old_logps is None:
            old_logps = completion_logps(
                policy, prompt_ids, completion_ids, pad_id, args.temperature, args.local_rollout_forward_batch_size
            )
        # step 2. reference log-probs and values
        ref_logps = self._reference_logps(policy, prompt_ids, completion_ids)
        values = None
        if self._has_critic:
            values = value_predictions(
                unwrapped.value_model, prompt_ids, completion_ids, pad_id, args.local_rollout_forward_batch_size
            )
        # step 3. scores; the missing-stop penalty is judged by the configured stop token (EOS if there is none)
        scores, per_func = self._score(examples, prompt_ids, completion_ids)
        stop = self._stop_token_id if self._stop_token_id is not None else self.processing_class.eos_token_id
        has_stop = torch.tensor([bool((c == stop).any()) for c in completion_ids], dtype=torch.bool)
        if args.missing_eos_penalty is not None:
            scores = scores - args.missing_eos_penalty * (~has_stop).float()
        # step 4. advantages
        trajectories = self._make_trajectories(
            prompt_ids, completion_ids, old_logps, ref_logps, values, scores, ~has_stop, group
        )
        self._episode += len(examples) * self.accelerator.num_processes
        self.state.episode = self._episode  # TRL 1.12's OnlineTrainerState.episode, current even between logs
        self._record_rollout_metrics(completion_ids, old_logps, ref_logps, scores, per_func, ~has_stop)
        # few-shot temperature stamps and prototype rewards; adapter-bank reward / KL window
        self.memory_pool.observe_rollouts(scores, old_logps, ref_logps, trajectories)
        return trajectories

    def _reference_logps(self, policy, prompt_ids, completion_ids) -> list[torch.Tensor] | None:
        if self.args.kl_coef <= 0:
            return None
        pad_id = self.processing_class.pad_token_id
        batch = self.args.local_rollout_forward_batch_size
        temperature = self.args.temperature
        if self.ref_model is not None:
            return completion_logps(self.ref_model, prompt_ids, completion_ids, pad_id, temperature, batch)
        with use_adapter(policy, self._ref_adapter or None):
            return completion_logps(policy, prompt_ids, completion_ids, pad_id, temperature, batch)

    def _score(self, examples, prompt_ids, completion_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted score per completion, shape `(B,)` (NaN = no reward), and the per-function rewards `(B, F)`."""
        tokenizer = self.processing_class
        prompts = [e["prompt"] for e in examples]
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        conversational = is_conversational({"prompt": prompts[0]})
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        per_func = torch.full((len(examples), len(self.reward_funcs)), math.nan)
        kwargs = self._reward_kwargs(examples)
        for i, (func, name, reward_tokenizer) in enumerate(
            zip(self.reward_funcs, self.reward_func_names, self.reward_processing_classes)
        ):
            if isinstance(func, nn.Module):
                per_func[:, i] = self._reward_model_scores(
                    func, reward_tokenizer, prompts, texts, prompt_ids, completion_ids
                )
            else:
                values = call_reward_function(
                    func,
                    name,
                    len(examples),
                    dict(
                        prompts=prompts,
                        completions=completions,
                        completion_ids=[c.tolist() for c in completion_ids],
                        **kwargs,
                    ),
                )
                per_func[:, i] = torch.tensor(values)
        valid = ~torch.isnan(per_func)
        weighted = torch.where(valid, per_func * self.reward_weights, torch.zeros(()))
        scores = torch.where(valid.any(dim=1), weighted.sum(dim=1), torch.full((len(examples),), math.nan))
        return scores, per_func

    def _reward_model_scores(self, model, tokenizer, prompts, texts, prompt_ids, completion_ids) -> torch.Tensor:
        same = self._same_tokenizer.get(id(tokenizer))
        if same is None:
            same = tokenizer is self.processing_class or tokenizer.get_vocab() == self.processing_class.get_vocab()
            self._same_tokenizer[id(tokenizer)] = same
        if same:
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            sequences = [torch.cat([p, c]) for p, c in zip(prompt_ids, completion_ids)]
            length = max(s.numel() for s in sequences)
            input_ids = torch.full((len(sequences), length), pad, dtype=torch.long)
            attention_mask = torch.zeros_like(input_ids)
            for i, s in enumerate(sequences):
                input_ids[i, : s.numel()] = s
                attention_mask[i, : s.numel()] = 1
        else:
            if is_conversational({"prompt": prompts[0]}):
                full = [
                    tokenizer.apply_chat_template(p + [{"role": "assistant", "content": t}], tokenize=False)
                    for p, t in zip(prompts, texts)
                ]
            else:
                full = [p + t for p, t in zip(prompts, texts)]
            encoded = tokenizer(
                full, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
            )
            input_ids, attention_mask = encoded["input_ids"], encoded["attention_mask"]
        return reward_model_scores(model, input_ids, attention_mask, self.args.local_rollout_forward_batch_size)

    def _make_trajectories(
        self, prompt_ids, completion_ids, old_logps, ref_logps, values, scores, is_truncated, group
    ) -> list[dict]:
        args = self.args
        batch = len(completion_ids)
        length = max(max(c.numel() for c in completion_ids), 1)
        mask = torch.zeros(batch, length)
        old = torch.zeros(batch, length)
        ref = torch.zeros(batch, length)
        for i, c in enumerate(completion_ids):
            mask[i, : c.numel()] = 1
            old[i, : c.numel()] = old_logps[i]
            if ref_logps is not None:
                ref[i, : c.numel()] = ref_logps[i]
        kl = kl_estimate(old, ref, args.kl_estimator) * mask if ref_logps is not None else torch.zeros_like(mask)
        kl_coef_reward = args.kl_coef if (self.kl_penalty == "reward" and ref_logps is not None) else 0.0
        valid = ~torch.isnan(scores)
        safe_scores = torch.nan_to_num(scores, nan=0.0)
        returns = old_values = None
        if self._has_critic:
            value_tensor = torch.zeros(batch, length)
            for i, v in enumerate(values):
                value_tensor[i, : v.numel()] = v
            rewards, _ = per_token_rewards(safe_scores, kl, mask, kl_coef_reward)
            train_mask = mask * valid.unsqueeze(1)
            if args.whiten_rewards and train_mask.sum() >= 2:
                rewards = masked_whiten(rewards, train_mask, shift_mean=False) * train_mask
            advantages, returns = gae_advantages(rewards, value_tensor, train_mask, args.gamma, args.lam)
            if args.whiten_advantages and train_mask.sum() >= 2:
                advantages = masked_whiten(advantages, train_mask) * train_mask
            old_values = value_tensor
        else:
            sequence_reward = scores - kl_coef_reward * kl.sum(dim=1)
            advantages = group_relative_advantages(sequence_reward, group, args.scale_rewards)
            advantages = advantages.unsqueeze(1).expand(batch, length) * mask
        trajectories = []
        for i in range(batch):
            if not valid[i]:
                continue
            n = completion_ids[i].numel()
            counted = mask[i, :n].clone()
            if args.mask_truncated_completions and bool(is_truncated[i]):
                counted.zero_()
            trajectory = {
                "prompt_ids": prompt_ids[i],
                "completion_ids": completion_ids[i],
                "completion_mask": counted,
                "old_per_token_logps": old[i, :n].clone(),
                "advantages": advantages[i, :n].clone().float(),
            }
            if ref_logps is not None:
                trajectory["ref_per_token_logps"] = ref[i, :n].clone()
            if self._has_critic:
                trajectory["returns"] = returns[i, :n].clone().float()
                trajectory["old_values"] = old_values[i, :n].clone().float()
            trajectories.append(trajectory)
        return trajectories

    def _record_rollout_metrics(self, completion_ids, old_logps, ref_logps, scores, per_func, is_truncated) -> None:
        sums = self._rollout_sums
        n = len(completion_ids)
        valid = ~torch.isnan(scores)
        sums["rollouts"] += n
        sums["rollouts_scored"] += float(valid.sum())
        sums["objective/scores"] += float(torch.nan_to_num(scores, nan=0.0).sum())
        kl_sum = 0.0
        if ref_logps is not None:
            for o, r in zip(old_logps, ref_logps):
                kl_sum += float(kl_estimate(o, r, self.args.kl_estimator).sum())
        sums["objective/kl"] += kl_sum
        self.schedules.observe_rollouts(kl_sum, n)  # the adaptive KL controller's input
        sums["objective/entropy"] += float(sum(-o.sum() for o in old_logps))
        sums["completions/mean_length"] += float(sum(c.numel() for c in completion_ids))
        sums["completions/clipped_ratio"] += float(is_truncated.float().sum())
        for i, name in enumerate(self.reward_func_names):
            column = per_func[:, i]
            sums[f"rewards/{name}/mean"] += float(torch.nan_to_num(column, nan=0.0).sum())
            sums[f"rewards/{name}/count"] += float((~torch.isnan(column)).sum())

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
        probe = info["probe"] and self._probe is not None

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
        if args.kl_coef > 0 and "ref_per_token_logps" in inputs:
            kl = kl_estimate(per_token_logps, inputs["ref_per_token_logps"], args.kl_estimator)
            if self.kl_penalty == "loss":
                per_token = per_token + args.kl_coef * kl
            stats["policy/kl_avg"] = masked_sum(kl.detach(), rl_mask) / n_tokens
        if args.entropy_coef > 0 or self._is_logging_step():
            rows = (inputs["objective"] == RL).nonzero().squeeze(-1)
            with torch.set_grad_enabled(args.entropy_coef > 0 and torch.is_grad_enabled()):
                entropy = torch.zeros_like(per_token_logps)
                entropy[rows] = entropy_from_logits(logits[rows]).to(entropy.dtype)
            if args.entropy_coef > 0:
                per_token = per_token - args.entropy_coef * entropy
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
        self._probe.accumulate(
            hidden[counted].detach(),
            logits[counted].detach(),
            targets[counted],
            coefficients[counted],
            token_objective,
            token_half,
        )

    def _is_logging_step(self) -> bool:
        steps = self.args.logging_steps
        if not steps or steps <= 0:
            return False
        steps = int(steps) if steps >= 1 else max(int(steps * self.state.max_steps), 1)
        return (self.state.global_step + 1) % steps == 0

    def _add_metric(self, key: str, value: torch.Tensor) -> None:
        """Add a micro-batch's contribution to a step metric (averaged at log time over the steps that had it)."""
        value = torch.nan_to_num(value.detach().double(), nan=0.0, posinf=0.0, neginf=0.0)
        self._metric_sums[key] = self._metric_sums[key] + value if key in self._metric_sums else value
        self._step_metric_keys.add(key)

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
            if info["probe"] and self._probe is not None:
                sums = self.accelerator.reduce(self._probe.sums, reduction="sum")
                self._probe.sums.copy_(sums)
                self._probe.counts.copy_(self.accelerator.reduce(self._probe.counts, reduction="sum"))
                self._probe.informative.copy_(self.accelerator.reduce(self._probe.informative, reduction="sum"))
                self.dare.update(self._probe.cosines(), info["step"])
            info["micro_index"] = -1  # done
            samples = self.args.num_sample_generations
            if samples > 0 and info["step"] % max(1, self._planned_steps // samples) == 0:
                self.generate_completions(sampling=True)
        return loss

    # =================================================================================================================
    # Logging
    # =================================================================================================================
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add TRAPO's metrics (losses per objective, weights, curriculum, rollouts, replay) to the Trainer's logs."""
        if "loss" in logs:
            logs.update(self._collect_metrics())
        super().log(logs, start_time)

    def _collect_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        keys = sorted(self._metric_sums)
        if keys:
            stacked = torch.stack([self._metric_sums[k].to(self.accelerator.device) for k in keys])
            steps = torch.tensor([max(self._metric_steps.get(k, 0), 1) for k in keys], dtype=torch.float64)
            reduced = self.accelerator.reduce(stacked, reduction="sum").cpu() / steps
            values = dict(zip(keys, reduced.tolist()))
            if "val/ratio_sq" in values:
                values["val/ratio_var"] = max(values.pop("val/ratio_sq") - values.get("val/ratio", 0.0) ** 2, 0.0)
            out.update(values)
        for name in OBJECTIVES:
            out.setdefault(f"loss/{name}", 0.0)
        rollout_keys = sorted(self._rollout_sums)
        if rollout_keys:
            stacked = torch.tensor([self._rollout_sums[k] for k in rollout_keys], dtype=torch.float64)
            reduced = dict(
                zip(rollout_keys, self.accelerator.reduce(stacked.to(self.accelerator.device), "sum").cpu().tolist())
            )
            rollouts = max(reduced.get("rollouts", 0.0), 1.0)
            scored = max(reduced.get("rollouts_scored", 0.0), 1.0)
            out["objective/scores"] = reduced.get("objective/scores", 0.0) / scored
            out["objective/kl"] = reduced.get("objective/kl", 0.0) / rollouts
            out["objective/entropy"] = reduced.get("objective/entropy", 0.0) / rollouts
            out["objective/non_score_reward"] = -self.args.kl_coef * out["objective/kl"]
            out["objective/rlhf_reward"] = out["objective/scores"] + out["objective/non_score_reward"]
            out["completions/mean_length"] = reduced.get("completions/mean_length", 0.0) / rollouts
            out["completions/clipped_ratio"] = reduced.get("completions/clipped_ratio", 0.0) / rollouts
            out["val/num_eos_tokens"] = rollouts - reduced.get("completions/clipped_ratio", 0.0)
            for name in self.reward_func_names:
                count = reduced.get(f"rewards/{name}/count", 0.0)
                if count:
                    out[f"rewards/{name}/mean"] = reduced[f"rewards/{name}/mean"] / count
        else:
            out.setdefault("objective/scores", 0.0)
            out.setdefault("objective/kl", 0.0)
        out.update(reduce_named_means(self.accelerator, self._pending_reward_metrics))  # `log_metric` of rewards
        out.update(self.curriculum.metrics(self._last_step_built, self._last_shares))
        out.update(self.dare.metrics())
        out.update(self.schedules.metrics())
        out.update(self.memory_pool.metrics())  # sft_pool/*, fewshot/*, adapter_bank/*
        out.update(reduce_replay_metrics(self.accelerator, self.replay.metrics(self.state.global_step)))
        out["episode"] = float(self._episode)
        self.state.episode = self._episode  # TRL 1.12 PPOTrainer kept the counter on the state
        elapsed = time.perf_counter() - self._train_start_time if self._train_start_time else 0.0
        out["eps"] = float(int(self._episode / elapsed)) if elapsed > 0 else 0.0
        if self.lr_scheduler is not None:
            out["lr"] = float(self.lr_scheduler.get_last_lr()[0])
        out["train/nonfinite_steps"] = float(self._nonfinite_steps)
        self._metric_sums = {}
        self._metric_steps = {}
        self._pending_extra = defaultdict(list)
        self._rollout_sums = defaultdict(float)
        self._pending_reward_metrics = defaultdict(list)
        return out

    # =================================================================================================================
    # Durable state (public Trainer hook: train; callback: on_save)
    # =================================================================================================================
    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train`, resuming TRAPO's own state too.

        `resume_from_checkpoint=True` picks the newest *complete* checkpoint of `output_dir` (one a run was killed
        while writing is skipped, with a warning saying why); an explicit path must be complete.

        Raises:
            CheckpointError: naming the file, if the checkpoint to resume from is incomplete or corrupted, or if
                `resume_from_checkpoint=True` finds no complete checkpoint.
        """
        world = self.accelerator.num_processes
        if resume_from_checkpoint is True:
            path, skipped = last_complete_checkpoint(self.args.output_dir, world)
            for reason in skipped:
                logger.warning("Not resuming from an incomplete checkpoint: %s", reason)
            if path is None:
                raise CheckpointError(
                    f"resume_from_checkpoint=True, but {self.args.output_dir} holds no complete checkpoint"
                    + (f" ({skipped[0]})" if skipped else "")
                    + ". Pass a path, or start without resuming."
                )
            resume_from_checkpoint = path
        self._train_start_time = time.perf_counter()
        if resume_from_checkpoint:
            verify_checkpoint(resume_from_checkpoint, world)
            self._load_trapo_state(resume_from_checkpoint)
            logger.info("Resuming from %s", resume_from_checkpoint)
        return super().train(
            resume_from_checkpoint=resume_from_checkpoint,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kwargs,
        )

    def _generators(self) -> dict[str, torch.Generator]:
        return {"rows": self._row_generator, "generation": self._generation_generator}

    def _save_trapo_state(self, checkpoint_dir: str) -> None:
        replay_meta, replay_tensors = self.replay.state_dict()
        state = {
            "format": 1,
            "global_step": self.state.global_step,
            "world_size": self.accelerator.num_processes,
            "episode": self._episode,
            "nonfinite_steps": self._nonfinite_steps,
            "allocator": self.allocator.state_dict(),
            "dare": self.dare.engine.state_dict(),
            "replay": replay_meta,
            "prompt_sampler": self._prompt_sampler.state_dict() if self._prompt_sampler else None,
            "sft_pool": self._sft_pool.state_dict() if self._sft_pool else None,
            "pretrain_stream": self._pretrain_stream.state_dict() if self._pretrain_stream else None,
            "schedules": self.schedules.state_dict(),
        }
        state["memory_pool"], memory_files = self.memory_pool.state_dict()  # SFT priorities, few-shot, adapter bank
        tensors = {**replay_tensors, **rng_tensors(self._generators())}
        if self.args.sync_ref_model and self.ref_model is not None:  # the reference has moved: keep it
            ref_state = full_state_dict(self.accelerator.unwrap_model(self.ref_model))  # ZeRO-3: gathered
            tensors.update({f"ref_model/{k}": v for k, v in ref_state.items()})
        compress = self.replay.nbytes > 64 * 2**20
        self.accelerator.wait_for_everyone()  # rank 0 fingerprints the Trainer's files: they must be complete
        write_rank_state(checkpoint_dir, self.accelerator.process_index, state, tensors, compress, memory_files)

    def _load_trapo_state(self, checkpoint_dir: str) -> None:
        rank = self.accelerator.process_index
        state, tensors = read_rank_state(checkpoint_dir, rank)
        source = os.path.join(checkpoint_dir, "trapo", f"rank{rank}.json")
        try:
            if state.get("format") != 1:
                raise CheckpointError(f"{source} has an unknown format {state.get('format')!r}.")
            for name, part in (
                ("prompt_sampler", self._prompt_sampler),
                ("sft_pool", self._sft_pool),
                ("pretrain_stream", self._pretrain_stream),
            ):
                if (state.get(name) is None) != (part is None):
                    raise CheckpointError(
                        f"{source}: the checkpoint was made with a different set of datasets ('{name}' "
                        f"{'missing' if state.get(name) is None else 'present'}); resume with the same datasets."
                    )
                if part is not None:
                    part.load_state_dict(state[name])
            self._episode = int(state["episode"])
            self._nonfinite_steps = int(state["nonfinite_steps"])
            self.allocator.load_state_dict(state["allocator"])
            self.dare.engine.load_state_dict(state["dare"])
            self.schedules.load_state_dict(state.get("schedules"))
            self.replay.load_state_dict(state["replay"], tensors)
            restore_rng(self._generators(), tensors, source)
            ref_state = {k[len("ref_model/") :]: v for k, v in tensors.items() if k.startswith("ref_model/")}
            if ref_state:
                load_full_state_dict(self.accelerator.unwrap_model(self.ref_model), ref_state)
            self.memory_pool.load_state_dict(state.get("memory_pool"), checkpoint_dir)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{source} cannot be restored: {type(error).__name__}: {error}") from error

    # =================================================================================================================
    # Saving (public Trainer hook: save_model)
    # =================================================================================================================
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the policy so that `from_pretrained` reloads it (only the adapter for a PEFT policy).

        Without a critic this is the Trainer's own `save_model` (which gathers DeepSpeed ZeRO-3 / FSDP weights). With
        a critic, checkpoints (`checkpoint-N` directories) hold the policy and the critic together so training can
        resume, and every other save writes the policy alone, gathered from the DDP / DeepSpeed wrapper first —
        never the wrapper itself.
        """
        is_checkpoint = (
            _internal_call
            and output_dir is not None
            and os.path.basename(os.path.normpath(output_dir)).startswith("checkpoint-")
        )
        if not self._has_critic or is_checkpoint:
            return super().save_model(output_dir, _internal_call)
        output_dir = output_dir or self.args.output_dir
        source = self.model_wrapped if self.is_deepspeed_enabled else self.model
        state = self.accelerator.get_state_dict(source)  # collective under ZeRO-3: every rank takes part
        if self.args.should_save:
            policy = self._unwrapped_policy()
            policy_state = {k[len("policy.") :]: v for k, v in state.items() if k.startswith("policy.")}
            os.makedirs(output_dir, exist_ok=True)
            policy.save_pretrained(output_dir, state_dict=policy_state)
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    # =================================================================================================================
    # Sample completions (TRL 1.12 PPOTrainer's generate_completions)
    # =================================================================================================================
    @torch.no_grad()
    def generate_completions(self, sampling: bool = False) -> list[dict[str, Any]]:
        """Greedy completions of the eval prompts with their scores, printed as a table (and logged to W&B /
        Trackio when they are in `report_to`), as TRL 1.12's `PPOTrainer.generate_completions` did.

        Args:
            sampling (`bool`): only the first `per_device_eval_batch_size` prompts (used during training).

        Returns:
            `list[dict]`: one `{"prompt", "completion", "score"}` per prompt on this rank (empty without an
            eval dataset of prompts).
        """
        dataset = self.eval_dataset
        if isinstance(dataset, dict):
            dataset = next(iter(dataset.values()), None)
        if dataset is None or not ({"prompt", "input_ids"} & set(dataset_columns(dataset))):
            return []
        if sampling:
            dataset = dataset.select(range(min(len(dataset), self.args.per_device_eval_batch_size)))
        tokenized = tokenize_prompt_dataset(
            dataset, self.processing_class, self.args.max_prompt_length, self.args.chat_template_kwargs, "eval_dataset"
        )
        examples = [tokenized[i] for i in range(len(tokenized))]
        prompt_ids = [torch.tensor(e["prompt_ids"]) for e in examples]
        with self._unwrapped_for_rollouts() as unwrapped:
            generated = generate(
                self._policy_for_generation(unwrapped),
                [p.tolist() for p in prompt_ids],
                self._greedy_generation_config(),
                self.processing_class.pad_token_id,
                self._stop_token_id,
                1.0,
                batch_size=self.args.per_device_eval_batch_size,
                record_logps=False,
            )
        scores, _ = self._score(examples, prompt_ids, generated["completion_ids"])
        completions = self.processing_class.batch_decode(generated["completion_ids"], skip_special_tokens=True)
        table = [
            {"prompt": e["prompt"], "completion": c, "score": float(s)}
            for e, c, s in zip(examples, completions, scores.tolist())
        ]
        if self.accelerator.is_main_process:
            try:
                print_prompt_completions_sample(
                    [r["prompt"] for r in table],
                    completions,
                    {"score": scores.tolist()},
                    None,
                    self.state.global_step,
                    5,
                )
            except ImportError:  # `rich` is optional
                for row in table[:5]:
                    logger.info("step %d | %r -> %r (score %.4f)", self.state.global_step, *row.values())
            report_to = self.args.report_to or []
            if "wandb" in report_to:
                import wandb

                if wandb.run is not None:
                    wandb.log(
                        {"completions": wandb.Table(columns=list(table[0]), rows=[list(r.values()) for r in table])}
                    )
            if "trackio" in report_to:
                import trackio

                trackio.log(
                    {"completions": trackio.Table(columns=list(table[0]), data=[list(r.values()) for r in table])}
                )
        return table

    def _greedy_generation_config(self) -> GenerationConfig:
        greedy = GenerationConfig(**{**self.generation_config.to_dict(), "do_sample": False})
        greedy.temperature = greedy.top_p = greedy.top_k = None
        return greedy

    # =================================================================================================================
    # Evaluation (public Trainer hook: evaluate)
    # =================================================================================================================
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate held-out data by its format, on every rank's shard, reduced across ranks.

        - prompt-only (`prompt` / `input_ids`): greedy completions scored by the reward functions:
          `<prefix>_reward` (weighted, mean over completions with a reward), `<prefix>_rewards/<name>`,
          `<prefix>_completion_length`; with a `split` column, also `<prefix>_reward_<split>` per split.
        - `text`: `<prefix>_pretrain_loss` (nats/token, documents chunked to `pretrain_max_length`).
        - prompt-completion / `messages`: `<prefix>_sft_loss` (nats per completion token).

        A dict of datasets is evaluated one by one with prefix `<prefix>_<name>`.

        Raises:
            ValueError: if there is no eval dataset, or its format is not one of the above.
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("No `eval_dataset`: pass one to the trainer or to `evaluate()`.")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self._evaluate_one(part, f"{metric_key_prefix}_{name}"))
        else:
            metrics = self._evaluate_one(dataset, metric_key_prefix)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _evaluate_one(self, dataset, prefix: str) -> dict[str, float]:
        from .evaluation import document_rows, nll_sum, sft_rows

        columns = dataset_columns(dataset)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        shard = dataset.select(range(rank, len(dataset), world)) if len(dataset) > rank else dataset.select([])
        # every rank enters (gathering ZeRO-3 weights is collective), so shards may hold different numbers of rows
        stack = ExitStack()
        policy = self._policy_for_generation(
            stack.enter_context(unwrap_model_for_generation(self.model_wrapped, self.accelerator))
        )
        was_training = policy.training
        policy.eval()
        pad_id = self.processing_class.pad_token_id
        try:
            if "text" in columns:
                rows = document_rows(shard["text"], self.processing_class, self.args.pretrain_max_length)
                total = nll_sum(policy, rows, pad_id, self.args.per_device_eval_batch_size)
                sums = self._reduce_floats(total)
                return {f"{prefix}_pretrain_loss": sums[0] / max(sums[1], 1.0)}
            if "completion" in columns or "messages" in columns:
                tokenized = (
                    tokenize_sft_dataset(
                        shard, self.processing_class, self.args.sft_max_length, self.args.chat_template_kwargs
                    )
                    if len(shard)
                    else None
                )
                total = (
                    nll_sum(policy, sft_rows(tokenized), pad_id, self.args.per_device_eval_batch_size)
                    if tokenized
                    else (0.0, 0.0)
                )
                sums = self._reduce_floats(total)
                return {f"{prefix}_sft_loss": sums[0] / max(sums[1], 1.0)}
            if "prompt" in columns or "input_ids" in columns:
                return self._evaluate_prompts(shard, prefix, policy)
        finally:
            policy.train(was_training)
            stack.close()
        raise ValueError(
            f"Cannot evaluate a dataset with columns {columns}: expected 'prompt' (greedy rewards), 'text' "
            "(pretraining loss) or 'prompt'+'completion' / 'messages' (SFT loss)."
        )

    def _reduce_floats(self, values) -> list[float]:
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(tensor, reduction="sum").cpu().tolist()

    @torch.no_grad()
    def _evaluate_prompts(self, shard, prefix: str, policy) -> dict[str, float]:
        args = self.args
        names = self.reward_func_names
        splits = sorted(set(shard["split"])) if "split" in dataset_columns(shard) and len(shard) else []
        all_splits = self._gather_strings(splits)
        sums: dict[str, float] = {"n": 0.0, "scored": 0.0, "reward": 0.0, "length": 0.0}
        for name in names:
            sums[f"r/{name}"] = sums[f"c/{name}"] = 0.0
        for split in all_splits:
            sums[f"s/{split}"] = sums[f"sc/{split}"] = 0.0
        if len(shard):
            tokenized = tokenize_prompt_dataset(
                shard, self.processing_class, args.max_prompt_length, args.chat_template_kwargs, name="eval_dataset"
            )
            greedy = self._greedy_generation_config()
            examples = [tokenized[i] for i in range(len(tokenized))]
            prompt_ids = [torch.tensor(e["prompt_ids"]) for e in examples]
            generated = generate(  # `policy` is unwrapped (and gathered) by `_evaluate_one`
                policy,
                [p.tolist() for p in prompt_ids],
                greedy,
                self.processing_class.pad_token_id,
                self._stop_token_id,
                1.0,
                batch_size=args.per_device_eval_batch_size,
                record_logps=False,
                synced_gpus=generation_synced_gpus(self.accelerator, gathered=True),
            )
            scores, per_func = self._score(examples, prompt_ids, generated["completion_ids"])
            valid = ~torch.isnan(scores)
            sums["n"] = float(len(examples))
            sums["scored"] = float(valid.sum())
            sums["reward"] = float(torch.nan_to_num(scores, nan=0.0).sum())
            sums["length"] = float(sum(c.numel() for c in generated["completion_ids"]))
            for i, name in enumerate(names):
                column = per_func[:, i]
                sums[f"r/{name}"] = float(torch.nan_to_num(column, nan=0.0).sum())
                sums[f"c/{name}"] = float((~torch.isnan(column)).sum())
            if splits:
                for split, score in zip(tokenized["split"], scores.tolist()):
                    if score == score:  # not NaN
                        sums[f"s/{split}"] += score
                        sums[f"sc/{split}"] += 1.0
        keys = sorted(sums)
        reduced = dict(zip(keys, self._reduce_floats([sums[k] for k in keys])))
        metrics = {
            f"{prefix}_reward": reduced["reward"] / max(reduced["scored"], 1.0),
            f"{prefix}_completion_length": reduced["length"] / max(reduced["n"], 1.0),
        }
        for name in names:
            if reduced[f"c/{name}"]:
                metrics[f"{prefix}_rewards/{name}"] = reduced[f"r/{name}"] / reduced[f"c/{name}"]
        for split in all_splits:
            metrics[f"{prefix}_reward_{split}"] = reduced[f"s/{split}"] / max(reduced[f"sc/{split}"], 1.0)
        return metrics

    def _gather_strings(self, values: list[str]) -> list[str]:
        if self.accelerator.num_processes == 1:
            return sorted(values)
        from accelerate.utils import gather_object

        return sorted(set(gather_object(list(values))))
