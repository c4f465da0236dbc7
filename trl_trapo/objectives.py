# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The objectives TRAPO trains jointly, as objects: the registry of what "an objective" is.

An objective has a name, a static weight c_o, a source of training rows, a loss term (a pure function of
`losses.py` returning a [`~trl_trapo.losses.TermOutput`]), its own state (checkpointed) and its own metrics. The
trainer holds a list of them — the three built-ins first, in the order of `config.OBJECTIVES` (pretraining, SFT, RL),
then `distill` when a teacher is given ([`DistillationObjective`]), then any the user adds with
`TRAPOTrainer(objectives=[...])` — and everything that is "per objective" is sized from
that list and keyed by name: the curriculum's shares, DARE's signals and factors, the rows of a step, the step's
token counts, the gradient probe, the checkpoint and the metrics (`loss/<name>`, `weight/<name>`,
`curriculum/<name>`, `dare/factor/<name>`, `dare/signal/<name>`). A row's `objective` is its objective's index in
the list.

One optimizer step, as the objectives see it:

1. `take(n, step)`: the `n` rows the curriculum gave the objective this step ([`~trl_trapo.collator.Row`]s whose
   `objective` is the objective's index);
2. `counts(batch, rows)`: the extra global counts its loss normalises by (`count_keys`; the trainer counts every
   objective's tokens itself, as `tokens_<name>`), summed over micro-batches and ranks into the
   [`~trl_trapo.collator.StepContext`];
3. per micro-batch, after the one forward of the policy over every row: `logit_scale(inputs, rows)` (a per-row
   factor on the logits before the log-softmax, e.g. RL's 1 / sampling temperature), then `loss(term)` with a
   [`TermInputs`] view of the micro-batch, then `after_forward(term)`;
4. `state_dict()` / `load_state_dict()` with TRAPO's checkpoint, `metrics()` at logging.

Adding an objective is subclassing [`Objective`] (see `docs/seams.md`, "Adding an objective"):
[`LanguageModelingObjective`] is the whole of a second language-modelling corpus with its own weight.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from datasets import Dataset, IterableDataset
from trl.trainer.utils import entropy_from_logits

from .checkpoint import CheckpointError
from .collator import Row, StepContext
from .config import OBJECTIVES, RL
from .data import (
    DataSetup,
    PretrainStream,
    check_cells,
    check_conversations_renderable,
    check_dataset_object,
    check_distillation_prompts,
    check_pretrain_text,
    check_rl_prompts,
    check_rows,
    check_sft_rows,
    dataset_columns,
    prepare_distillation_prompts,
    prepare_pretrain_text,
    prepare_rl_prompts,
    prepare_sft_rows,
    warn_mixed_formats,
)
from .losses import (
    RLTermCounts,
    TermOutput,
    distillation_term,
    kl_estimate,
    language_modeling_term,
    rl_term,
    sampled_token_distillation_term,
    sft_term,
)
from .sampler_correction import sampler_importance_weights


if TYPE_CHECKING:
    from .rollout import RolloutEngine
    from .teacher import Teacher


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ObjectiveSetup:
    """What an objective may need from the run when the trainer sets it up (once, before training).

    Attributes:
        index (`int`): the objective's position in the trainer's list (the `objective` its rows carry).
        args ([`TRAPOConfig`]): the configuration (read only).
        tokenizer: the policy's tokenizer.
        rank (`int`), world_size (`int`): this process and the number of processes (shard the data by them).
        planned_steps (`int`): the run's optimizer steps.
        max_positions (`int`, *optional*): the policy's context (rows must not be longer); None if unknown.
        images ([`~trl_trapo.vision.ImageRows`], *optional*): a VLM run's row builder (the processor), for rows with
            images; None in a text run.
    """

    index: int
    args: Any
    tokenizer: Any
    rank: int
    world_size: int
    planned_steps: int
    max_positions: int | None = None
    images: Any = None


@dataclass
class TermInputs:
    """One micro-batch as an objective's loss sees it (B rows, T target positions, N counted positions, V vocabulary).

    The policy's forward runs once over every row of the micro-batch, whatever their objective; the output layer runs
    only at counted positions, so `logits` holds the N counted positions of *all* rows, in the order of
    `inputs["mask"].nonzero()`; `tokens` marks this objective's among them.
    """

    inputs: dict[str, torch.Tensor]  # the collated micro-batch (see trl_trapo/collator.py)
    rows: torch.Tensor  # (B,) bool: the objective's rows
    mask: torch.Tensor  # (B, T) float: 1 on the objective's counted targets
    per_token_logps: torch.Tensor  # (B, T) fp32 nats: log p of each target after the row's logit scale; 0 uncounted
    logits: torch.Tensor  # (N, V) the counted positions' logits (after the rows' logit scales)
    token_rows: torch.Tensor  # (N,) long: the row of each counted position
    targets: torch.Tensor  # (N,) long: the target token of each counted position
    tokens: torch.Tensor  # (N,) bool: the counted positions that belong to the objective
    values: torch.Tensor | None  # (B_rl, L) critic values of the RL rows, with a critic
    context: StepContext  # the whole step: weights, global counts, step


class Objective:
    """One training objective: a name, a static weight, a source of rows, a loss term, state and metrics.

    Subclasses implement `take` and `loss`, and override the other hooks they need (all have neutral defaults).

    Args:
        name (`str`): its name in metrics (`loss/<name>`, `weight/<name>`, ...), the curriculum's mappings and the
            checkpoint; unique among the trainer's objectives.
        weight (`float`): the static multiplier c_o (0 switches it off: no rows, no loss).

    Attributes:
        count_keys (`tuple[str, ...]`): the names of the extra global counts `counts` returns, in order.
        reads_values (`bool`): its loss reads the critic's values of its rows (`TermInputs.values`); with a
            `value_model`, the critic's forward runs on the rows of such objectives.
    """

    count_keys: tuple[str, ...] = ()
    reads_values: bool = False  # its loss reads the critic's values `(B, T)` of its rows (the critic runs on them)

    def __init__(self, name: str, weight: float = 1.0):
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"An objective's name must be a non-empty string without '/', got {name!r}.")
        if (
            not isinstance(weight, numbers.Real)
            or isinstance(weight, bool)
            or not (weight >= 0 and math.isfinite(weight))
        ):
            raise ValueError(
                f"Objective '{name}': weight={weight!r} must be a finite number >= 0 (0 switches it off)."
            )
        self.name = name
        self.weight = float(weight)
        self.index: int | None = None

    @property
    def has_data(self) -> bool:
        """Whether the objective has rows to serve (an objective without them takes no share of the steps)."""
        return True

    def setup(self, setup: ObjectiveSetup) -> None:
        """Prepare for training (build data streams, check the data); called once by the trainer.

        Raises:
            ValueError: for data that cannot work, naming the objective and the fix.
        """
        self.index = setup.index

    def take(self, n: int, step: int) -> list[Row]:
        """The objective's `n` rows of optimizer step `step` (their `objective` is this objective's index)."""
        raise NotImplementedError

    def counts(self, batch: dict[str, torch.Tensor], rows: torch.Tensor) -> list[torch.Tensor | float]:
        """This micro-batch's contribution to each of `count_keys` (`rows`: `(B,)` bool, the objective's rows)."""
        return []

    def logit_scale(self, inputs: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor | None:
        """`(B,)` factor on each row's logits before the log-softmax (only its own rows are read), or None (1)."""
        return None

    def loss(self, term: TermInputs) -> TermOutput:
        """The objective's term of one micro-batch, normalised by the step's global counts."""
        raise NotImplementedError

    def after_forward(self, term: TermInputs) -> None:
        """Per-row feedback after the loss (e.g. the SFT pool's priorities); nothing by default."""
        return None

    def state_dict(self) -> dict:
        """What resuming needs (JSON); nothing by default."""
        return {}

    def check_resume(self, state: dict | None) -> str | None:
        """What does not fit in a checkpoint's `state` of this objective (None when it was not written), said in a
        few words for the checkpoint's error, or None when it can be restored. Called before anything is restored."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""
        return None

    def metrics(self) -> dict[str, float]:
        """The objective's own metrics at a logging step (besides `loss/<name>` and its statistics)."""
        return {}


class LanguageModelingObjective(Objective):
    """Next-token prediction on a text corpus: the built-in pretraining objective, or any further corpus with its own
    weight (e.g. code next to prose) — [`~trl_trapo.losses.language_modeling_term`].

    Rows are packed (EOS between documents) or chunked chunks of `max_length` tokens of the `text` column
    ([`~trl_trapo.data.PretrainStream`]), sharded by rank; the stream position is checkpointed.

    Args:
        name (`str`): the objective's name.
        dataset (`Dataset` or `IterableDataset`): documents in a `text` column (map-style or streaming).
        weight (`float`): the static multiplier c_o.
        max_length (`int`, *optional*): tokens per row (default: `pretrain_max_length`).
        packing (`bool`, *optional*): pack across documents (default: `pretrain_packing`).
        seed (`int`, *optional*): the shuffling seed (default: `sampling_seed` + the objective's index).
        check (`bool`): check the dataset at setup (format, missing values, unknown tokens).

    Raises:
        ValueError: at setup, if the dataset is empty, has no `text` column or unusable rows.
    """

    def __init__(
        self,
        name: str,
        dataset: Dataset | IterableDataset | None,
        weight: float = 1.0,
        max_length: int | None = None,
        packing: bool | None = None,
        seed: int | None = None,
        check: bool = True,
    ):
        super().__init__(name, weight)
        self.dataset = dataset
        self.max_length, self.packing, self.seed, self.check = max_length, packing, seed, check
        self.stream: PretrainStream | None = None

    @property
    def has_data(self) -> bool:
        return self.dataset is not None

    def setup(self, setup: ObjectiveSetup) -> None:
        super().setup(setup)
        if self.dataset is None or self.weight <= 0:
            return
        args = setup.args
        role = "pretrain_dataset" if not self.check else f"objective '{self.name}' dataset"
        max_length = self.max_length or args.pretrain_max_length
        if self.check and (
            not isinstance(max_length, int)
            or max_length < 2
            or (setup.max_positions is not None and max_length > setup.max_positions)
        ):
            raise ValueError(
                f"LanguageModelingObjective('{self.name}'): max_length={max_length!r} must be an int in [2, "
                f"{setup.max_positions or 'the context'}] (a row predicts max_length - 1 tokens and must fit the "
                "policy's context)."
            )
        if self.check:
            check_dataset_object(self.dataset, role, streaming_ok=True)
            if "text" not in dataset_columns(self.dataset):
                raise ValueError(
                    f"The {role} needs a 'text' column (language-modelling format); it has "
                    f"{dataset_columns(self.dataset)}. Rename the column holding the documents to 'text'."
                )
            if isinstance(self.dataset, Dataset):
                if len(self.dataset) == 0:
                    raise ValueError(f"The {role} is empty: give it documents, or drop the objective.")
                check_rows(self.dataset, role, setup.tokenizer, "pretrain", limit=10_000)
        self.stream = PretrainStream(
            self.dataset,
            setup.tokenizer,
            max_length,
            packing=args.pretrain_packing if self.packing is None else self.packing,
            seed=args.sampling_seed + setup.index if self.seed is None else self.seed,
            rank=setup.rank,
            world_size=setup.world_size,
            objective=setup.index,
            role=role,
            images=setup.images,
        )

    def take(self, n: int, step: int) -> list[Row]:
        return self.stream.take(n)

    def loss(self, term: TermInputs) -> TermOutput:
        return language_modeling_term(term.per_token_logps, term.mask, term.context.counts[f"tokens_{self.name}"])

    def state_dict(self) -> dict:
        return self.stream.state_dict() if self.stream is not None else {}

    def check_resume(self, state: dict | None) -> str | None:
        """A checkpoint of a run with a stream when this one has none, or the other way round."""
        written, mine = state or None, self.state_dict() or None  # {} when there is no stream
        if (written is None) != (mine is None):
            return f"'{self.name}_stream' {'missing' if written is None else 'present'}"
        return None

    def load_state_dict(self, state: dict) -> None:
        if self.stream is not None:
            self.stream.load_state_dict(state)


class PretrainingObjective(LanguageModelingObjective):
    """The built-in pretraining objective: a [`LanguageModelingObjective`] named "pretrain" on `pretrain_dataset`,
    weighted by `pretrain_weight`, with the config's `pretrain_max_length` / `pretrain_packing`."""

    NAME = "pretrain"
    WEIGHT_FIELD = "pretrain_weight"  # the config field of its static weight
    DATA_FIELD = "pretrain"  # its dataset in `data.PreparedData`
    ARGUMENT = "pretrain_dataset"  # the trainer's argument of its dataset
    ARGUMENT_NOTE = ""  # what the "no objective has data" error adds to the argument's name
    # the main job's flags of its dataset (`trl_trapo.jobs.main`): --<DATA_FLAGS>_name / _config / _split, with help
    DATA_FLAGS = "pretrain_dataset"
    DATA_HELP = "Pretraining text (`text` column): Hub id, local file or directory."
    SPLIT_HELP = "Split of the pretraining dataset."
    STREAMING_FLAG = "pretrain_streaming"  # the job's flag that streams its dataset (None: it cannot stream)
    STREAMING_HELP = "Stream the pretraining dataset."

    @classmethod
    def check_data(cls, dataset: Any, args: Any) -> None:
        """Its dataset's checks before any model loads ([`~trl_trapo.data.check_pretrain_text`]; its weight is > 0)."""
        check_pretrain_text(dataset, args)

    @classmethod
    def prepare_data(cls, dataset: Dataset | IterableDataset | None, setup: DataSetup) -> Any:
        """Its documents checked ([`~trl_trapo.data.prepare_pretrain_text`]), or None without data or weight."""
        if dataset is None or not getattr(setup.args, cls.WEIGHT_FIELD) > 0:
            return None
        return prepare_pretrain_text(dataset, setup)

    def __init__(self, dataset: Dataset | IterableDataset | None, weight: float = 1.0, check: bool = True):
        super().__init__(self.NAME, dataset, weight, check=check)

    @classmethod
    def pass_rows(cls, args: Any, dataset: Any, has_critic: bool) -> int | None:
        """Rows of one pass over `dataset`: its map-style documents, one row each as the plan counts them (None when
        streaming: no length)."""
        return len(dataset) if isinstance(dataset, Dataset) else None

    @classmethod
    def run_rows(cls, args: Any, dataset: Any, has_critic: bool) -> int | float | None:
        """Rows of the whole run: the map-style documents x epochs (None when streaming: no length to plan by)."""
        rows = cls.pass_rows(args, dataset, has_critic)
        return rows * args.num_train_epochs if rows is not None else None


class SFTObjective(Objective):
    """Supervised fine-tuning on demonstrations served by the memory pool (uniform or prioritised replay, few-shot
    mode, self-imitation's successes) — [`~trl_trapo.losses.sft_term`], plain or trust-region NLL.

    Args:
        pool ([`~trl_trapo.memory.MemoryPool`], *optional*): serves the rows (`take_sft(n, step)`) and takes the
            per-row feedback after the forward (`after_forward(inputs, per_token_logps, mask, rows)`: the prioritised pool's
            priorities, few-shot embeddings).
        has_data (`bool`): whether there are demonstrations to serve.
        sft_loss_type (`str`), alpha (`float`): "nll" or "trust_region" and its threshold.
        weight (`float`): the static multiplier c_sft.
        name (`str`): "sft".
    """

    NAME = "sft"
    WEIGHT_FIELD = "sft_weight"
    DATA_FIELD = "sft"
    ARGUMENT = "sft_dataset"
    ARGUMENT_NOTE = ""
    DATA_FLAGS = "sft_dataset"
    DATA_HELP = "SFT data (prompt-completion or messages): Hub id, local file or directory."
    SPLIT_HELP = "Split of the SFT dataset."
    STREAMING_FLAG = None

    @classmethod
    def check_data(cls, dataset: Any, args: Any) -> None:
        """Its dataset's checks before any model loads ([`~trl_trapo.data.check_sft_rows`]; its weight is > 0)."""
        check_sft_rows(dataset, args)

    @classmethod
    def prepare_data(cls, dataset: Dataset | None, setup: DataSetup) -> Dataset | None:
        """Its demonstrations tokenized ([`~trl_trapo.data.prepare_sft_rows`]), or None without data or weight."""
        if dataset is None or not getattr(setup.args, cls.WEIGHT_FIELD) > 0:
            return None
        return prepare_sft_rows(dataset, setup)

    def __init__(
        self,
        pool,
        has_data: bool = True,
        sft_loss_type: str = "nll",
        alpha: float = 0.1,
        weight: float = 1.0,
        name: str = "sft",
    ):
        super().__init__(name, weight)
        self.pool, self.with_data = pool, has_data
        self.sft_loss_type, self.alpha = sft_loss_type, alpha

    @property
    def has_data(self) -> bool:
        return self.with_data

    @classmethod
    def from_config(cls, args: Any, pool: Any, data: Any) -> SFTObjective:
        """The built-in SFT objective on the memory pool `pool`, as the config sets it (`sft_loss_type`,
        `trust_region_alpha`, `sft_weight`); it has data when `data` (a [`~trl_trapo.data.PreparedData`]) holds
        demonstrations."""
        return cls(
            pool,
            has_data=getattr(data, cls.DATA_FIELD) is not None,
            sft_loss_type=args.sft_loss_type,
            alpha=args.trust_region_alpha,
            weight=getattr(args, cls.WEIGHT_FIELD),
        )

    @classmethod
    def pass_rows(cls, args: Any, dataset: Any, has_critic: bool) -> int | None:
        """Rows of one pass over `dataset`: its demonstrations."""
        return len(dataset)

    @classmethod
    def run_rows(cls, args: Any, dataset: Any, has_critic: bool) -> int | float | None:
        """Rows of the whole run: the demonstrations x epochs."""
        return cls.pass_rows(args, dataset, has_critic) * args.num_train_epochs

    def take(self, n: int, step: int) -> list[Row]:
        return self.pool.take_sft(n, step)

    def loss(self, term: TermInputs) -> TermOutput:
        return sft_term(
            term.per_token_logps,
            term.mask,
            term.context.counts[f"tokens_{self.name}"],
            term.inputs["importance_weight"],
            self.sft_loss_type,
            self.alpha,
        )

    def after_forward(self, term: TermInputs) -> None:
        self.pool.after_forward(term.inputs, term.per_token_logps, term.mask, term.rows)


class DemonstrationObjective(SFTObjective):
    """SFT on a further set of demonstrations with its own weight, so DARE and the curriculum weigh it apart from the
    built-in `sft` (e.g. image demonstrations next to text ones: the loss-level analogue of per-modality weights) —
    [`~trl_trapo.losses.sft_term`].

    Rows are tokenised at setup as the built-in SFT data is (`tokenize_sft_dataset`: prompt-completion or `messages`,
    the latter's assistant turns only under `assistant_only_loss`, as TRL; a VLM run's image rows through the
    processor) and served in seeded per-rank epochs (uniform sampling, as
    `sft_sampling="uniform"`); the sampler's position is checkpointed. Self-imitation, prioritised replay and few-shot
    mode serve the built-in `sft` only.

    Args:
        name (`str`): the objective's name.
        dataset (`Dataset`): the demonstrations (map-style).
        weight (`float`): the static multiplier c_o.
        max_length (`int`, *optional*): tokens per row (default: `sft_max_length`).
        sft_loss_type (`str`), alpha (`float`): "nll" or "trust_region" and its threshold.
        seed (`int`, *optional*): the sampling seed (default: `sampling_seed` + the objective's index).

    Raises:
        ValueError: at setup, for a dataset that is not map-style, is empty, has neither 'prompt' + 'completion'
            nor 'messages', a cell of the wrong form or missing, an empty completion (`trl_trapo.data.check_cells`),
            conversations without a chat template (and for rows `tokenize_sft_dataset` refuses).
    """

    def __init__(
        self,
        name: str,
        dataset: Dataset | None,
        weight: float = 1.0,
        max_length: int | None = None,
        sft_loss_type: str = "nll",
        alpha: float = 0.1,
        seed: int | None = None,
    ):
        super().__init__(None, dataset is not None, sft_loss_type, alpha, weight, name)
        self.dataset, self.max_length, self.seed = dataset, max_length, seed

    def setup(self, setup: ObjectiveSetup) -> None:
        from .data import tokenize_sft_dataset
        from .memory.sft_pool import SFTPool

        super().setup(setup)
        if self.dataset is None or self.weight <= 0:
            return
        role = f"objective '{self.name}' dataset"
        check_dataset_object(self.dataset, role)
        columns = dataset_columns(self.dataset)
        if not ({"prompt", "completion"} <= set(columns) or "messages" in columns):
            raise ValueError(
                f"The {role} needs 'prompt' and 'completion' columns or a 'messages' column (TRL's SFT formats); it "
                f"has {columns}."
            )
        if len(self.dataset) == 0:
            raise ValueError(f"The {role} is empty: give it demonstrations, or drop the objective.")
        warn_mixed_formats([(role, self.dataset)], "sft")  # prompt-completion read, as for `sft_dataset`
        args = setup.args
        # as the built-in SFT data: `messages` rows trained whole, or their assistant turns with assistant_only_loss
        masked = bool(getattr(args, "assistant_only_loss", False)) and "messages" in columns
        check_cells(self.dataset, role, "sft", assistant_only_loss=masked)  # values of the right form, a completion
        renderer = setup.images.processor if setup.images is not None else setup.tokenizer
        check_conversations_renderable(self.dataset, role, renderer, args.chat_template_kwargs)
        tokenized = tokenize_sft_dataset(
            self.dataset,
            setup.tokenizer,
            self.max_length or args.sft_max_length,
            args.chat_template_kwargs,
            assistant_only_loss=masked,
            images=setup.images,
            role=role,
        )
        seed = args.sampling_seed + setup.index if self.seed is None else self.seed
        self.pool = SFTPool(tokenized, seed=seed, rank=setup.rank, world_size=setup.world_size)

    def take(self, n: int, step: int) -> list[Row]:
        rows = self.pool.take(n, step)
        for row in rows:
            row.objective = self.index
        return rows

    def after_forward(self, term: TermInputs) -> None:
        return None

    def state_dict(self) -> dict:
        return self.pool.state_dict() if self.pool is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.pool is not None and state:
            self.pool.load_state_dict(state)


class RLObjective(Objective):
    """Reinforcement learning on scored rollouts served by the replay buffer — [`~trl_trapo.losses.rl_term`]: PPO's
    clipped surrogate (or truncated importance sampling), guidance's shaped loss on demonstration rows, the KL to the
    reference in the loss (`kl_penalty="loss"`), the entropy bonus and, with a critic, the clipped value loss. Rows
    another engine sampled (vLLM) carry their per-token sampler/trainer log-ratio, from which the mismatch weight of
    the policy loss is formed ([`~trl_trapo.sampler_correction.sampler_importance_weights`], per
    `vllm_importance_sampling_mode`; a whole row is in the micro-batch, so its sequence ratio is the round's).

    It owns what only RL rows need: their sampling temperatures (a row sampled at temperature tau is trained on
    logits / tau, `logit_scale`), the per-row flags of guidance, and its normalisers (`sequences_rl`,
    `micro_batches_rl`, `tokens_rl_sampled`).

    Args:
        take_rows (`Callable[[int, int], list[Row]]`): serves `n` RL rows at a step: the RL supply's
            [`~trl_trapo.rl_supply.RLSupply.take_rows`] (from the replay buffer, which a rollout round refills).
        args ([`TRAPOConfig`]): the configuration (read only).
        kl_coef (`Callable[[], float]`): the KL coefficient in use (fixed or adaptive).
        entropy_coef (`Callable[[int], float]`): the entropy coefficient of a step.
        kl_penalty (`str`): "loss" or "reward" (resolved).
        kl_estimator (`str`): "k1", "k2" or "k3" (resolved).
        logging_step (`Callable[[], bool]`): whether the step being trained is logged (the entropy, which costs a pass
            over the logits, is then measured even when it is not in the loss).
        has_data (`bool`): whether there are RL prompts.
        weight (`float`): the static multiplier c_rl.
        name (`str`): "rl".
    """

    count_keys = ("sequences_rl", "micro_batches_rl", "tokens_rl_sampled")
    reads_values = True  # the clipped value loss, with a critic
    NAME = "rl"
    WEIGHT_FIELD = "rl_weight"
    DATA_FIELD = "rl"
    ARGUMENT = "train_dataset"
    ARGUMENT_NOTE = " (RL prompts, with rewards)"
    # TRL's `ScriptArguments` declares its flags (--dataset_name, --dataset_config, --dataset_train_split and the
    # held-out --dataset_test_split); the job reads them itself
    DATA_FLAGS = "dataset"
    DATA_HELP = SPLIT_HELP = STREAMING_FLAG = None

    @classmethod
    def check_data(cls, dataset: Any, args: Any) -> None:
        """Its dataset's checks before any model loads ([`~trl_trapo.data.check_rl_prompts`]; its weight is > 0)."""
        check_rl_prompts(dataset, args)

    @classmethod
    def prepare_data(cls, dataset: Dataset | None, setup: DataSetup) -> Dataset | None:
        """Its prompts tokenized ([`~trl_trapo.data.prepare_rl_prompts`]), or None without data or weight."""
        if dataset is None or not getattr(setup.args, cls.WEIGHT_FIELD) > 0:
            return None
        return prepare_rl_prompts(dataset, setup)

    def __init__(
        self,
        take_rows: Callable[[int, int], list[Row]] | None,
        args,
        kl_coef: Callable[[], float],
        entropy_coef: Callable[[int], float],
        kl_penalty: str,
        kl_estimator: str,
        logging_step: Callable[[], bool] = lambda: False,
        has_data: bool = True,
        weight: float = 1.0,
        name: str = "rl",
    ):
        super().__init__(name, weight)
        self.take_rows, self.args = take_rows, args
        self.kl_coef, self.entropy_coef = kl_coef, entropy_coef
        self.kl_penalty, self.kl_estimator = kl_penalty, kl_estimator
        self.logging_step = logging_step
        self.with_data = has_data

    @property
    def has_data(self) -> bool:
        return self.with_data

    @classmethod
    def from_config(
        cls,
        args: Any,
        take_rows: Callable[[int, int], list[Row]],
        data: Any,
        *,
        kl_coef: Callable[[], float],
        entropy_coef: Callable[[int], float],
        kl_penalty: str,
        kl_estimator: str,
        logging_step: Callable[[], bool],
    ) -> RLObjective:
        """The built-in RL objective on the RL supply's rows `take_rows`, weighted by `rl_weight`; it has data when
        `data` (a [`~trl_trapo.data.PreparedData`]) holds RL prompts. The other arguments are the constructor's."""
        return cls(
            take_rows,
            args,
            kl_coef=kl_coef,
            entropy_coef=entropy_coef,
            kl_penalty=kl_penalty,
            kl_estimator=kl_estimator,
            logging_step=logging_step,
            has_data=getattr(data, cls.DATA_FIELD) is not None,
            weight=getattr(args, cls.WEIGHT_FIELD),
        )

    @classmethod
    def pass_rows(cls, args: Any, dataset: Any, has_critic: bool) -> int | None:
        """Rows of one pass over the prompts of `dataset`: each prompt's completions (1 with a critic, else
        `num_generations`), each served `num_ppo_epochs` times."""
        return len(dataset) * (1 if has_critic else args.num_generations) * args.num_ppo_epochs

    @classmethod
    def run_rows(cls, args: Any, dataset: Any, has_critic: bool) -> int | float | None:
        """Rows of the whole run: each of `total_episodes` completions — or `num_train_epochs` x prompts x
        completions per prompt (1 with a critic, else `num_generations`) — served `num_ppo_epochs` times."""
        if args.total_episodes:
            return args.total_episodes * args.num_ppo_epochs
        return cls.pass_rows(args, dataset, has_critic) * args.num_train_epochs

    def take(self, n: int, step: int) -> list[Row]:
        return self.take_rows(n, step)

    def counts(self, batch: dict[str, torch.Tensor], rows: torch.Tensor) -> list[torch.Tensor | float]:
        """RL rows with a counted token, whether the micro-batch holds one, and counted RL tokens that were sampled
        (not demonstrations put in by guidance)."""
        token_counts = batch["mask"].sum(-1)
        counted_rows = rows & (token_counts > 0)
        sampled = rows & ~batch["off_policy"] if "off_policy" in batch else rows
        return [counted_rows.sum(), float(counted_rows.any()), token_counts[sampled].sum()]

    def logit_scale(self, inputs: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor | None:
        """1 / the row's sampling temperature (its own when it carries one, else `temperature`), 1 off its rows."""
        temperature = self.args.temperature
        if "temperature" in inputs:  # RL rows' own sampling temperatures (exploration, few-shot mode); 0: configured
            row_temperature = torch.where(inputs["temperature"] > 0, inputs["temperature"], temperature)
            return torch.where(rows, 1.0 / row_temperature, 1.0)
        if temperature != 1.0 and bool(rows.any()):
            return torch.where(rows, 1.0 / temperature, 1.0)
        return None

    def loss(self, term: TermInputs) -> TermOutput:
        if not bool(term.rows.any()):
            return TermOutput(torch.zeros((), device=term.logits.device), torch.zeros((), device=term.logits.device))
        args, inputs, counts = self.args, term.inputs, term.context.counts
        mask, per_token_logps = term.mask, term.per_token_logps
        kl_coef, entropy_coef = self.kl_coef(), self.entropy_coef(term.context.step)
        kl = None
        if kl_coef > 0 and "ref_per_token_logps" in inputs:
            kl = kl_estimate(per_token_logps, inputs["ref_per_token_logps"], self.kl_estimator)
        entropy = None
        if entropy_coef > 0 or self.logging_step():
            with torch.set_grad_enabled(entropy_coef > 0 and torch.is_grad_enabled()):
                rl_entropy = entropy_from_logits(term.logits[term.tokens]).to(per_token_logps.dtype)
                entropy = torch.zeros_like(per_token_logps).masked_scatter(mask.bool(), rl_entropy)
        critic = {}
        if term.values is not None:
            rows = term.rows.nonzero().squeeze(-1)
            critic = dict(
                values=term.values[:, :-1].to(per_token_logps.dtype),  # (B_rl, T) value at t predicts token t + 1
                old_values=inputs["old_values"][rows],
                returns=inputs["returns"][rows],
                value_mask=mask[rows],
                cliprange_value=args.cliprange_value,
                vf_coef=args.vf_coef,
            )
        sampling_weights = None
        if args.vllm_importance_sampling_correction and "sampler_log_ratio" in inputs:  # another engine sampled
            sampling_weights = sampler_importance_weights(
                inputs["sampler_log_ratio"],
                mask,
                args.vllm_importance_sampling_mode,
                args.vllm_importance_sampling_clip_max,
                args.vllm_importance_sampling_clip_min,
            ).weights.to(per_token_logps.dtype)
        return rl_term(
            per_token_logps,
            inputs["old_per_token_logps"],
            inputs["advantages"],
            mask,
            # a hand-built StepContext without `tokens_rl_sampled` has only sampled tokens
            RLTermCounts(
                counts[f"tokens_{self.name}"],
                counts["sequences_rl"],
                counts["micro_batches_rl"],
                counts.get("tokens_rl_sampled", counts[f"tokens_{self.name}"]),
            ),
            loss_type=args.loss_type,
            response_length=args.response_length,
            cliprange=args.cliprange,
            importance_weights=inputs["importance_weight"],
            importance_sampling_cap=args.importance_sampling_cap,
            sampling_weights=sampling_weights,
            off_policy=inputs.get("off_policy"),
            guidance_gamma=args.guidance_gamma,
            kl=kl,
            kl_coef_in_loss=kl_coef if self.kl_penalty == "loss" else 0.0,
            entropy=entropy,
            entropy_coef=entropy_coef,
            **critic,
        )


class DistillationObjective(Objective):
    """On-policy distillation from a teacher — [`~trl_trapo.losses.distillation_term`]: on the student's own sampled
    completions (RL rollouts served by the replay buffer), the generalised JSD between the student's and the teacher's
    next-token distributions over the full vocabulary, at the completion tokens.

    The teacher's forward runs in the training step, on this objective's rows only, and its logits are formed a chunk of
    tokens at a time from its final hidden states. The term hands the DARE probe its own logit gradient (the
    divergence's gradient depends on the whole distribution). The divergence uses its own temperature
    (`distillation_temperature`), not the rows' sampling temperatures.

    Args:
        take_rows (`Callable[[int, int], list[Row]]`): serves `n` rows (the student's samples) at a step; their
            `objective` is set to this objective's index here.
        teacher ([`~trl_trapo.teacher.Teacher`]): the frozen teacher: its final hidden states `(B, L, H_t)` and output
            layer `(n, H_t) -> (n, V)` form the full-vocabulary term; when it is partitioned across ranks (ZeRO-3) its
            forward is a collective: the full-vocabulary term then runs it in every micro-batch on every rank, on a
            one-token stand-in when the micro-batch has none of this objective's rows, so that every rank gathers the
            same parameters the same number of times.
        beta (`float`), temperature (`float`): the divergence (`distillation_beta`, `distillation_temperature`).
        weight (`float`): the static multiplier c_distill.
        estimator (`str`): "full" (the divergence over the vocabulary) or "sampled_token" (the reverse KL from the
            teacher's log-probability of each sampled token, `teacher_per_token_logps` of the rows; only rows sampled
            at `temperature` count, see [`~trl_trapo.losses.sampled_token_distillation_term`]).
        sampling_temperature (`float`): the configured sampling temperature (a row without its own was sampled at it).
        chunk_size (`int`): tokens per chunk of teacher logits.
        name (`str`): "distill".
        prompts ([`DistillationPrompts`], *optional*): reward-free prompts (`distillation_dataset`); when given, the
            rows are its fresh samples instead of `take_rows`' (pass `take_rows=None`), and its prompt position is
            part of this objective's checkpointed state.

    Raises:
        ValueError: if neither or both of `take_rows` and `prompts` are given.
    """

    NAME = "distill"  # the teacher's objective, in the metrics, the curriculum and the checkpoint
    WEIGHT_FIELD = "distillation_weight"
    DATA_FIELD = "distill"  # its reward-free prompts (`distillation_dataset`), when given
    ARGUMENT = "distillation_dataset"
    ARGUMENT_NOTE = " (with a teacher)"
    DATA_FLAGS = "distillation_dataset"
    DATA_HELP = (
        "Reward-free prompts (`prompt` column) for on-policy distillation from --teacher_model_name_or_path (needs "
        "it): Hub id, local file or directory."
    )
    SPLIT_HELP = "Split of the distillation prompts."
    STREAMING_FLAG = None
    HALF_OF = RLObjective.NAME  # it takes half of RL's share when the curriculum's phases are given as three numbers

    @classmethod
    def check_data(cls, dataset: Any, args: Any) -> None:
        """Its dataset's checks before any model loads ([`~trl_trapo.data.check_distillation_prompts`]; its weight is > 0)."""
        check_distillation_prompts(dataset, args)

    @classmethod
    def prepare_data(cls, dataset: Dataset | None, setup: DataSetup) -> Dataset | None:
        """Its prompts tokenized ([`~trl_trapo.data.prepare_distillation_prompts`]; refused without a teacher), or
        None without data or weight."""
        if dataset is None:
            return None
        return prepare_distillation_prompts(dataset, setup, getattr(setup.args, cls.WEIGHT_FIELD))

    @classmethod
    def pass_rows(cls, args: Any, dataset: Any, has_critic: bool) -> int | None:
        """Rows of one pass over `dataset`: one completion per reward-free prompt."""
        return len(dataset)

    @classmethod
    def run_rows(cls, args: Any, dataset: Any, has_critic: bool) -> int | float | None:
        """Rows of the whole run: one completion per reward-free prompt per epoch."""
        return cls.pass_rows(args, dataset, has_critic) * args.num_train_epochs

    def __init__(
        self,
        take_rows: Callable[[int, int], list[Row]] | None,
        teacher: Teacher,
        beta: float = 1.0,
        temperature: float = 1.0,
        weight: float = 1.0,
        chunk_size: int = 1024,
        estimator: str = "full",
        sampling_temperature: float = 1.0,
        name: str = "distill",
        prompts: DistillationPrompts | None = None,
    ):
        super().__init__(name, weight)
        if (take_rows is None) == (prompts is None):
            raise ValueError("DistillationObjective needs exactly one of `take_rows` and `prompts`.")
        self.teacher = teacher
        self.prompts = prompts
        self.take_rows = prompts.take if prompts is not None else take_rows
        self.beta, self.temperature, self.chunk_size = beta, temperature, chunk_size
        self.estimator, self.sampling_temperature = estimator, sampling_temperature
        self.excluded_rows = 0  # sampled-token estimator: rows left out (sampled at another temperature), cumulative

    @classmethod
    def from_config(
        cls,
        args,
        teacher: Teacher,
        take_rows: Callable[[int, int], list[Row]],
        prompts: Dataset | None = None,
        sampler: RolloutEngine | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> DistillationObjective:
        """The objective as [`~trl_trapo.TRAPOConfig`] sets it (`distillation_beta`, `distillation_temperature`,
        `distillation_weight`, `distillation_estimator`, `temperature`, `seed`): on the reward-free `prompts`
        (tokenized `distillation_dataset`, sampled by `sampler`; [`DistillationPrompts`]) when given, else on the
        student's samples `take_rows` serves.

        Args:
            args ([`~trl_trapo.TRAPOConfig`]): the run's configuration.
            teacher ([`~trl_trapo.teacher.Teacher`]): the teacher (also scores the prompts' samples for the
                sampled-token estimator).
            take_rows (`Callable[[int, int], list[Row]]`): the RL rollouts' rows (unused with `prompts`).
            prompts (`Dataset`, *optional*): tokenized reward-free prompts.
            sampler ([`~trl_trapo.rollout.RolloutEngine`], *optional*): samples the prompts' completions.
            rank (`int`), world_size (`int`): this process and the number of processes.
        """
        if prompts is not None:
            sampled_token = args.distillation_estimator == "sampled_token"
            prompts = DistillationPrompts(
                prompts,
                sampler,
                teacher if sampled_token else None,
                seed=args.seed,
                rank=rank,
                world_size=world_size,
                temperature=args.distillation_temperature,
            )
        return cls(
            None if prompts is not None else take_rows,
            teacher,
            beta=args.distillation_beta,
            temperature=args.distillation_temperature,
            weight=args.distillation_weight,
            estimator=args.distillation_estimator,
            sampling_temperature=args.temperature,
            prompts=prompts,
        )

    def take(self, n: int, step: int) -> list[Row]:
        rows = self.take_rows(n, step)
        for row in rows:
            row.objective = self.index
            if self.estimator == "sampled_token":
                sampled_at = self.sampling_temperature if row.temperature is None else row.temperature
                # the estimate is a KL only under samples from p_s at the divergence's temperature; demonstrations
                # put in by guidance were not sampled at all
                if abs(sampled_at - self.temperature) > 1e-6 or row.off_policy:
                    row.mask = torch.zeros_like(row.mask)
                    self.excluded_rows += 1
        return rows

    def logit_scale(self, inputs: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor | None:
        """The sampled-token estimator compares log-probabilities at the divergence's temperature."""
        if self.estimator == "sampled_token" and self.temperature != 1.0 and bool(rows.any()):
            return torch.where(rows, 1.0 / self.temperature, 1.0)
        return None

    def metrics(self) -> dict[str, float]:
        metrics = {"distill/excluded_rows": float(self.excluded_rows)} if self.estimator == "sampled_token" else {}
        if self.prompts is not None:  # this rank's count (like the other per-rank counters)
            metrics["distill/sampled_tokens"] = float(self.prompts.sampled_tokens)
        return metrics

    def state_dict(self) -> dict:
        state = {"excluded_rows": self.excluded_rows}
        if self.prompts is not None:
            state["prompts"] = self.prompts.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.excluded_rows = int(state.get("excluded_rows", 0))
        if self.prompts is not None and "prompts" in state:
            self.prompts.load_state_dict(state["prompts"])

    def loss(self, term: TermInputs) -> TermOutput:
        device = term.logits.device
        if not bool(term.rows.any()):
            if self.teacher.partitioned and self.estimator == "full":  # the other ranks may run it in this one
                stand_in = term.inputs["input_ids"][:1, :1]
                self.teacher.hidden(stand_in, torch.ones_like(stand_in))
            zero = torch.zeros((), device=device)
            return TermOutput(zero, zero)
        if self.estimator == "sampled_token":
            return sampled_token_distillation_term(
                term.per_token_logps,
                term.inputs["teacher_per_token_logps"],
                term.mask,
                term.context.counts[f"tokens_{self.name}"],
            )
        index = term.rows.nonzero().squeeze(-1)
        with torch.no_grad():
            hidden = self.teacher.hidden(term.inputs["input_ids"][index], term.inputs["attention_mask"][index])
        teacher_hidden = hidden[:, :-1][term.mask[index].bool()]  # (N_o, H_t), the counted positions' order
        return distillation_term(
            term.logits[term.tokens],
            teacher_hidden,
            self.teacher.head,
            term.context.counts[f"tokens_{self.name}"],
            self.beta,
            self.temperature,
            self.chunk_size,
            probe=term.context.probe,
        )


class DistillationPrompts:
    """Reward-free prompts for the distillation objective (`distillation_dataset`): each step's distillation rows are
    completions the live policy samples from them, fresh, in one batched call at the divergence's temperature.

    Pure distillation: nothing here is scored, so these rows never meet the reward functions, targeted exploration,
    self-imitation, guidance or the replay buffer (they are on-policy by construction: sampled by the weights being
    trained). Sampling at `distillation_temperature` makes the sampled-token estimator valid on every row. Prompts are
    drawn without replacement in epochs of one shuffled order shared by every rank (epoch `e`'s order is a
    permutation seeded by `seed + e`); at each step rank r takes its own `n` consecutive positions of it, so ranks
    never duplicate a prompt within an epoch.

    Args:
        dataset (`Dataset`): tokenized prompts (`prompt_ids`, `(P_i,)` each), at least one.
        sampler ([`~trl_trapo.rollout.RolloutEngine`]): samples with the live policy: `take` calls
            `sampler.sample(examples, 1, step, temperature)` (one completion per example at the policy version
            `step`, at the divergence's temperature); collective under ZeRO-3, so every rank calls `take` with the
            same `n` (the row allocator is identical on every rank).
        teacher ([`~trl_trapo.teacher.Teacher`], *optional*): given for the sampled-token estimator only: its
            log-probability (nats) of each sampled token ([`~trl_trapo.teacher.Teacher.round_logps`]) becomes the
            rows' `teacher_per_token_logps`.
        seed (`int`): the prompt order's seed.
        rank (`int`), world_size (`int`): this process and the number of processes.
        temperature (`float`): the divergence's temperature the rows were sampled at.

    Raises:
        ValueError: if `dataset` is empty.
    """

    def __init__(
        self,
        dataset: Dataset,
        sampler: RolloutEngine,
        teacher: Teacher | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        temperature: float = 1.0,
    ):
        if len(dataset) == 0:
            raise ValueError("`distillation_dataset` is empty: pass at least one prompt, or drop the argument.")
        self.dataset, self.sampler, self.teacher = dataset, sampler, teacher
        self.seed, self.rank, self.world_size, self.temperature = int(seed), int(rank), int(world_size), temperature
        self.position = 0  # prompts handed out so far, over every rank (checkpointed)
        self.sampled_tokens = 0  # completion tokens sampled on this rank (a metric)

    def indices(self, start: int, count: int) -> list[int]:
        """Dataset indices at positions `start ... start + count - 1` of the run's prompt order (epochs of shuffled
        orders, concatenated)."""
        size = len(self.dataset)
        out: list[int] = []
        while count > 0:
            epoch, offset = divmod(start, size)
            order = torch.randperm(size, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
            chunk = order[offset : offset + count]
            out += chunk
            start, count = start + len(chunk), count - len(chunk)
        return out

    def take(self, n: int, step: int) -> list[Row]:
        """`n` fresh distillation rows: `n` prompts of this rank, one completion each sampled now by the policy at
        version `step`; the row's mask counts every completion token (objective index set by the objective)."""
        start = self.position + self.rank * n
        self.position += n * self.world_size
        examples = [self.dataset[i] for i in self.indices(start, n)]
        sampled = self.sampler.sample(examples, 1, step, self.temperature)
        teacher = self.teacher.round_logps(sampled) if self.teacher is not None else None
        rows = []
        for i, completion in enumerate(sampled.completion_ids):
            prompt = torch.as_tensor(examples[i]["prompt_ids"], dtype=torch.long)
            p, c = prompt.numel(), completion.numel()
            mask = torch.zeros(p + c - 1)
            mask[p - 1 :] = 1.0
            extra = {}
            if teacher is not None:
                full = torch.zeros(p + c - 1)
                full[p - 1 :] = teacher[i].float()
                extra["teacher_per_token_logps"] = full
            rows.append(Row(RL, torch.cat([prompt, completion]), mask, temperature=float(self.temperature), **extra))
            self.sampled_tokens += c
        return rows

    def state_dict(self) -> dict:
        return {"position": self.position, "sampled_tokens": self.sampled_tokens}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state.get("position", 0))
        self.sampled_tokens = int(state.get("sampled_tokens", 0))


def count_keys(objectives: list[Objective]) -> tuple[str, ...]:
    """The keys of a step's global counts: `tokens_<name>` per objective, then each objective's `count_keys`."""
    return tuple(f"tokens_{o.name}" for o in objectives) + tuple(k for o in objectives for k in o.count_keys)


def step_counts(batches: list[dict[str, torch.Tensor]], objectives: list[Objective]) -> torch.Tensor:
    """This rank's counts of a step's micro-batches, float64 in the order of [`count_keys`]: the counted tokens of
    each objective, then each objective's own counts (sum them over ranks).

    Returns:
        `torch.Tensor`: shape `(len(count_keys(objectives)),)`.
    """
    local = torch.zeros(len(count_keys(objectives)), dtype=torch.float64)
    for batch in batches:
        token_counts = batch["mask"].sum(-1)
        position = len(objectives)
        for index in range(len(objectives)):
            local[index] += token_counts[batch["objective"] == index].sum()
        for index, objective in enumerate(objectives):
            values = objective.counts(batch, batch["objective"] == index)
            check_counts(objective, values)
            for value in values:
                local[position] += value
                position += 1
    return local


def check_counts(objective: Objective, values: Any) -> None:
    """Refuse what an objective's `counts` returned when it is not one value per declared `count_keys` (trial 8's
    OB06: `count_keys=("short_rows",)` with `counts()` returning `{}` left the count at 0 without a word; fewer values
    shift the next objectives' counts, a dict's keys were summed as values).

    Raises:
        ValueError: naming the objective, its `count_keys`, what `counts()` returned and the fix.
    """
    keys = tuple(objective.count_keys)
    if isinstance(values, (list, tuple)) and len(values) == len(keys):
        return
    got = f"{len(values)} value(s)" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
    raise ValueError(
        f"Objective '{objective.name}': count_keys={keys} declares {len(keys)} global count(s), but counts() "
        f"returned {got}: return a list of exactly {len(keys)} number(s) or scalar tensor(s), this micro-batch's "
        "contribution to each key in order (0 when it has none), or drop the keys it does not count from count_keys."
    )


@dataclass(frozen=True)
class ObjectiveSlots:
    """The run's objectives before they are built, in the order of their indices: the built-in three
    (`config.OBJECTIVES`), `distill` with a teacher, then the user's.

    Attributes:
        names (`tuple[str, ...]`): their names.
        has_data (`tuple[bool, ...]`): whether each has rows to train on.
        weights (`tuple[float, ...]`): their static weights c_o (the config's `*_weight` fields, the user's
            `Objective.weight`).
        halves (`dict[str, str]`): an objective that takes half of another's share when the curriculum's phases are
            given as three numbers (the teacher's takes half of RL's).
    """

    names: tuple[str, ...]
    has_data: tuple[bool, ...]
    weights: tuple[float, ...]
    halves: dict[str, str]


BUILT_IN: tuple[type[Objective], ...] = (PretrainingObjective, SFTObjective, RLObjective)
"""The built-in objectives, in the order of `config.OBJECTIVES` (their rows' `objective` is their index)."""
WITH_DATA: tuple[type[Objective], ...] = (*BUILT_IN, DistillationObjective)
"""The objectives whose data the trainer's dataset arguments give (each class's `ARGUMENT`), prepared in this order
by [`~trl_trapo.data.prepare_datasets`] (each class's `prepare_data`) into its `DATA_FIELD` of
[`~trl_trapo.data.PreparedData`], and whose static weight is its `WEIGHT_FIELD` of the config."""
PLANNING_ORDER: tuple[type[Objective], ...] = (RLObjective, SFTObjective, DistillationObjective, PretrainingObjective)
"""Whose data sizes the run when `max_steps` is not set: the first of these with data."""


def objective_names(with_teacher: bool, extra: list[str]) -> tuple[str, ...]:
    """The names of a run's objectives, in the order of their indices: the [`BUILT_IN`] ones, `distill` with a
    teacher, then the user's (`extra`, their names)."""
    return (*(cls.NAME for cls in BUILT_IN), *((DistillationObjective.NAME,) if with_teacher else ()), *extra)


def objective_slots(args: Any, data: Any, with_teacher: bool, extra: list[Objective]) -> ObjectiveSlots:
    """The [`ObjectiveSlots`] of a run: the [`BUILT_IN`] objectives (with data when their `DATA_FIELD` of
    `data`, a [`~trl_trapo.data.PreparedData`], is set), the teacher's with `with_teacher`, then the user's `extra`.
    Each built-in's static weight is its `WEIGHT_FIELD` of the config.

    Raises:
        ValueError: an objective of `extra` reuses a built-in name (or the teacher's with a teacher).
    """
    built_in = tuple(cls.NAME for cls in BUILT_IN)
    clash = [o.name for o in extra if o.name in built_in]
    if clash:
        raise ValueError(
            f"`objectives` may not reuse the built-in names {list(built_in)} (got {clash}): name it differently."
        )
    teacher = (DistillationObjective,) if with_teacher else ()
    if with_teacher and DistillationObjective.NAME in {o.name for o in extra}:
        raise ValueError("`objectives` may not use the name 'distill': the teacher's objective has it.")
    return ObjectiveSlots(
        names=objective_names(with_teacher, [o.name for o in extra]),
        has_data=(
            *(getattr(data, cls.DATA_FIELD) is not None for cls in BUILT_IN),
            *(True for _ in teacher),
            *(o.has_data for o in extra),
        ),
        weights=(*(getattr(args, cls.WEIGHT_FIELD) for cls in (*BUILT_IN, *teacher)), *(o.weight for o in extra)),
        halves={cls.NAME: cls.HALF_OF for cls in teacher},
    )


def planning_rows(args: Any, data: Any, names: tuple[str, ...], has_critic: bool) -> tuple[int, int | float] | None:
    """`(objective index, rows of the whole run)` of the dataset that sizes the run (see
    [`~trl_trapo.collator.plan_steps`]): the first objective of [`PLANNING_ORDER`] in the run whose dataset in `data`
    (a [`~trl_trapo.data.PreparedData`]) has a length; None when none has (a streaming pretraining dataset only)."""
    for cls in PLANNING_ORDER:
        dataset = getattr(data, cls.DATA_FIELD)
        if cls.NAME in names and dataset is not None:
            rows = cls.run_rows(args, dataset, has_critic)
            if rows is not None:
                return names.index(cls.NAME), rows
    return None


def epoch_rows(args: Any, data: Any, names: tuple[str, ...], has_critic: bool) -> tuple[int, int] | None:
    """`(objective index, rows of one pass)` of the dataset whose passes are the run's epochs: the one that sizes the
    run ([`planning_rows`]: the first objective of [`PLANNING_ORDER`] in the run whose dataset in `data` has a length),
    whether `max_steps` is set or not. `trainer.state.epoch` is the rows its objective was served so far, all ranks
    together, over these ([`~trl_trapo.callbacks.EpochCallback`]). None when no dataset has a length."""
    primary = planning_rows(args, data, names, has_critic)
    if primary is None:
        return None
    index = primary[0]
    sizing = next(cls for cls in PLANNING_ORDER if cls.NAME == names[index])
    return index, sizing.pass_rows(args, getattr(data, sizing.DATA_FIELD), has_critic)


def warn_epoch_passes(
    args: Any,
    data: Any,
    names: tuple[str, ...],
    shares: Sequence[float],
    planned_steps: int,
    primary: tuple[int, int | float] | None,
    has_critic: bool,
) -> str | None:
    """Say once, at construction, what `num_train_epochs` means in a run planned from it with several datasets.

    The run's length follows one dataset ([`planning_rows`]: RL prompts, else SFT rows, ...); the others are served at
    their curriculum shares for as many steps, so they are passed over more or fewer times than `num_train_epochs`.
    Nothing is said when `max_steps` or `total_episodes` sets the length, or when one built-in objective's dataset
    has a length.

    Args:
        args ([`TRAPOConfig`]): `num_train_epochs`, `max_steps`, `total_episodes`, the batch settings.
        data ([`~trl_trapo.data.PreparedData`]): the prepared datasets.
        names (`tuple[str, ...]`): the run's objective names, as `shares` is ordered.
        shares (`Sequence[float]`): the curriculum's time-averaged shares (what [`~trl_trapo.collator.plan_steps`] planned with).
        planned_steps (`int`): optimizer steps of the run.
        primary: `(objective index, rows of the whole run)` that sized the run ([`planning_rows`]).
        has_critic (`bool`): a value model (an RL prompt gives 1 completion, not `num_generations`).

    Returns:
        The warning's text, or None.
    """
    if args.max_steps > 0 or args.total_episodes is not None or primary is None:
        return None
    rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
    epochs = args.num_train_epochs
    index = primary[0]
    passes = []
    for cls in PLANNING_ORDER:
        dataset = getattr(data, cls.DATA_FIELD)
        if cls.NAME not in names or dataset is None or cls.NAME == names[index]:
            continue
        whole = cls.run_rows(args, dataset, has_critic)  # num_train_epochs passes
        share = shares[names.index(cls.NAME)]
        if not whole or share <= 0:  # streaming (no length), or no share
            continue
        served = planned_steps * rows_per_step * share
        passes.append(f"{cls.ARGUMENT} ({len(dataset):,} rows) ~{served * epochs / whole:.1f} times")
    if not passes:
        return None
    sizing = next(cls for cls in PLANNING_ORDER if cls.NAME == names[index])
    dataset = getattr(data, sizing.DATA_FIELD)
    unit = (
        f"{len(dataset):,} prompts x {1 if has_critic else args.num_generations} completions x num_ppo_epochs="
        f"{args.num_ppo_epochs}"
        if sizing is RLObjective
        else f"{len(dataset):,} rows"
    )
    message = (
        f"num_train_epochs={epochs:g} is measured on {sizing.ARGUMENT} ({unit}) at its mean share of each step's "
        f"{rows_per_step} rows ({shares[index]:.2f}): {planned_steps:,} optimizer steps. The other datasets are served "
        f"at their shares for as many steps, so they are passed over a different number of times: "
        + "; ".join(passes)
        + ". To fix the length yourself, set max_steps."
    )
    logger.warning(message)
    return message


def warn_step_over_pass(
    args: Any,
    data: Any,
    names: tuple[str, ...],
    shares: Sequence[float],
    planned_steps: int,
    primary: tuple[int, int | float] | None,
    has_critic: bool,
) -> str | None:
    """Say once, at construction, when one optimizer step takes more rows of the dataset that sizes the run
    ([`planning_rows`]: the RL prompts, else the SFT rows, ...) than the dataset holds (RL: prompts x completions).

    Each prompt (row) is then drawn several times within one update: trial 13's N08 (16 prompts,
    `per_device_train_batch_size=8`, `gradient_accumulation_steps=50`: 400 RL rows per update, each prompt rolled out
    ~6 times) trained one step without a word, where TRL's GRPOTrainer trains none (transformers: "There seems not to
    be a single sample in your epoch_iterator"). Said whatever sets the run's length. A step's RL rows are distinct
    trajectories (the replay buffer serves the least used first; `num_ppo_epochs` replays a round at later steps), so
    the bound is prompts x completions, not the `num_ppo_epochs`-fold pass the logged epoch counts ([`epoch_rows`]).

    Args:
        args ([`TRAPOConfig`]): the batch settings, `world_size`, `num_generations`, `num_ppo_epochs`.
        data ([`~trl_trapo.data.PreparedData`]): the prepared datasets.
        names (`tuple[str, ...]`): the run's objective names, as `shares` is ordered.
        shares (`Sequence[float]`): the curriculum's time-averaged shares of a step's rows.
        planned_steps (`int`): optimizer steps of the run.
        primary: `(objective index, rows of the whole run)` of the dataset that sizes the run ([`planning_rows`]).
        has_critic (`bool`): a value model (an RL prompt gives 1 completion, not `num_generations`).

    Returns:
        The warning's text, or None when a step takes at most the rows the dataset holds.
    """
    if primary is None:
        return None
    index = primary[0]
    sizing = next(cls for cls in PLANNING_ORDER if cls.NAME == names[index])
    dataset = getattr(data, sizing.DATA_FIELD)
    world = max(args.world_size, 1)
    batch, accumulation, share = args.per_device_train_batch_size, args.gradient_accumulation_steps, shares[index]
    rows_per_step = batch * accumulation * world
    taken = rows_per_step * share  # the sizing dataset's rows in one step, at its mean share
    rl = sizing is RLObjective
    group = (1 if has_critic else args.num_generations) if rl else 1
    held = len(dataset) * group
    if taken <= held:
        return None
    draws = taken / held
    steps = (
        f"per_device_train_batch_size={batch} x gradient_accumulation_steps={accumulation} x world size {world}"
        + (f", {taken:,.0f} of them for {sizing.ARGUMENT} at its mean share {share:.2f}" if share < 1 else "")
    )
    if rl:
        completions = "1 completion (a critic)" if has_critic else f"num_generations={group} completions"
        holds = f"{len(dataset):,} prompts x {completions} = {held:,} rows"
        what = (
            f"each prompt is rolled out ~{draws:.1f} times within one update (~{draws * group:.0f} completions of it)"
        )
        what += "" if has_critic else ", where TRL's GRPOTrainer would train no step at all"
        more = "prompts"
    else:
        holds = f"{len(dataset):,} rows"
        what = f"each row is trained ~{draws:.1f} times within one update"
        more = "rows"
    epoch = taken / sizing.pass_rows(args, dataset, has_critic)  # what the logged epoch counts ([`epoch_rows`])
    fits = math.floor(held / (batch * world * share))
    fix = (
        f"gradient_accumulation_steps={fits}"
        if fits >= 1
        else f"per_device_train_batch_size={max(math.floor(held / (world * share)), 1)} with "
        "gradient_accumulation_steps=1"
    )
    plural = "s" if planned_steps != 1 else ""
    message = (
        f"One optimizer step takes {rows_per_step:,} rows ({steps}), more than {sizing.ARGUMENT} holds ({holds}): "
        f"{what}. The run trains {planned_steps:,} optimizer step{plural}, each ~{epoch:.2f} epochs as the logged epoch "
        f"counts them. For each {'prompt' if rl else 'row'} at most once per update, use e.g. {fix}, or give "
        f"{sizing.ARGUMENT} more {more}."
    )
    logger.warning(message)
    return message


def checkpointed_objective_states(state: dict) -> dict[str, dict]:
    """The objectives' states of a checkpoint's `trapo/rank{r}.json`, keyed by name; a checkpoint written before
    objectives were named kept only the pretraining stream's, under its own key."""
    states = state.get("objectives")
    if states is None:
        return {PretrainingObjective.NAME: state.get("pretrain_stream") or {}}
    return states


def check_checkpoint_objectives(names: list[str] | tuple[str, ...], state: dict, source: str) -> None:
    """Refuse a checkpoint written by a run with other objectives than `names` (the run's, as [`objective_names`]
    orders them) beyond the built-in ones: an objective of the run it has no state for, or one it has state for that
    the run lacks. Called before any model loads when the trainer is given the checkpoint (`check_run`), and again by
    [`load_objective_states`].

    Args:
        names: the run's objective names, the built-in ones first.
        state (`dict`): the checkpoint's `trapo/rank{r}.json`, read from the file `source`.
        source (`str`): the file, as the error names it.

    Raises:
        CheckpointError: naming `source`, the objectives the run adds and those it lacks.
    """
    states = checkpointed_objective_states(state)  # this layout, or the one before names
    missing = [name for name in names[len(OBJECTIVES) :] if name not in states]
    unknown = sorted(set(states) - set(names))
    if missing or unknown:
        raise CheckpointError(
            f"{source}: the checkpoint was written by a run with other objectives (this run adds "
            f"{missing or 'none'} and lacks {unknown or 'none'}); resume with the same objectives, or start a new "
            "run from its weights (the checkpoint as --model_name_or_path / `model=`, without "
            "resume_from_checkpoint)."
        )


def load_objective_states(objectives: list[Objective], state: dict, source: str) -> None:
    """Restore each objective's state from a checkpoint's `trapo/rank{r}.json` (`state`, read from the file
    `source`), once every objective has checked that the checkpoint fits it: nothing is restored when one does not.

    Raises:
        CheckpointError: naming `source`, if the checkpoint was written by a run with other objectives (beyond the
            built-in ones), an objective's datasets changed ([`Objective.check_resume`]), or naming the objective, if
            its `load_state_dict` raises.
    """
    states = checkpointed_objective_states(state)  # this layout, or the one before names
    check_checkpoint_objectives([o.name for o in objectives], state, source)
    for objective in objectives:  # a pretraining stream missing or added, ...: datasets changed
        problem = objective.check_resume(states.get(objective.name))
        if problem is not None:
            raise CheckpointError(
                f"{source}: the checkpoint was made with a different set of datasets ({problem}); resume "
                "with the same datasets."
            )
    for objective in objectives:
        if objective.name in states:
            try:
                objective.load_state_dict(states[objective.name])
            except CheckpointError:
                raise
            except Exception as error:  # the objective's own code: name it, whatever it raised
                raise CheckpointError(
                    f"{source}: objective '{objective.name}' ({type(objective).__name__}).load_state_dict raised "
                    f"{type(error).__name__}: {error}, given the checkpoint's state for it: "
                    f"{json.dumps(states[objective.name])[:200]}. Fix: make load_state_dict read what state_dict "
                    "returns (keys it may lack: state.get(key, default))."
                ) from error


def check_objectives(objectives: list[Objective]) -> None:
    """Refuse a list of objectives the trainer cannot run, at construction.

    Raises:
        TypeError: if `objectives` is not a list of [`Objective`] instances, or one does not implement `take` and
            `loss`.
        ValueError: if two objectives share a name.
    """
    if not isinstance(objectives, (list, tuple)):
        raise TypeError(
            f"`objectives` must be a list of trl_trapo.objectives.Objective, got {type(objectives).__name__}: "
            "wrap it in a list."
        )
    seen: set[str] = set()
    for objective in objectives:
        if not isinstance(objective, Objective):
            raise TypeError(
                f"`objectives` entries must be trl_trapo.objectives.Objective instances, got {type(objective).__name__}."
            )
        unset = [field for field in ("name", "weight", "index") if not hasattr(objective, field)]
        if unset:  # Objective.__init__ sets all three
            raise TypeError(
                f"{type(objective).__name__} has no {', '.join(unset)}: its __init__ did not call "
                "Objective.__init__. Fix: call `super().__init__(name, weight)` first in "
                f"{type(objective).__name__}.__init__."
            )
        missing = [hook for hook in ("take", "loss") if getattr(type(objective), hook) is getattr(Objective, hook)]
        if missing:
            raise TypeError(f"Objective '{objective.name}' ({type(objective).__name__}) does not implement {missing}.")
        if objective.name in seen:
            raise ValueError(
                f"Two objectives are named '{objective.name}': names key the metrics, the curriculum and the "
                "checkpoint; give each a unique name."
            )
        seen.add(objective.name)


def setup_objective(objective: Objective, setup: ObjectiveSetup) -> None:
    """Run `objective.setup(setup)` and refuse an override that did not set the objective's index (its rows'
    `objective`), at construction.

    Raises:
        TypeError: naming the objective, if `objective.index` is not `setup.index` afterwards (an overriding `setup`
            that does not call `super().setup(setup)`).
    """
    objective.setup(setup)
    if objective.index != setup.index:
        raise TypeError(
            f"Objective '{objective.name}' ({type(objective).__name__}): after setup(), self.index is "
            f"{objective.index!r}, not {setup.index}: its setup() override did not call Objective.setup, which sets "
            f"the index its rows carry (Row(self.index, ...)). Fix: call `super().setup(setup)` in "
            f"{type(objective).__name__}.setup."
        )


def check_state_dict(objective: Objective) -> None:
    """Refuse an objective whose state cannot be checkpointed (it must be JSON), before training.

    Raises:
        TypeError: naming the objective, if `state_dict()` is not a JSON-serialisable dict.
    """
    state = objective.state_dict()
    try:
        if not isinstance(state, dict):
            raise TypeError(f"it is a {type(state).__name__}")
        json.dumps(state)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"Objective '{objective.name}': state_dict() must return a JSON-serialisable dict (it goes into the "
            f"checkpoint's rank{{r}}.json): {error}. Keep tensors out of it (lists of numbers are fine)."
        ) from error


def check_served_rows(
    objective: Objective, rows: list, n: int, vocab_size: int | None = None, context: int | None = None
) -> None:
    """Refuse what an objective's `take` served when it is not `n` rows of its own the policy can read.

    Args:
        objective ([`Objective`]): the objective that served `rows`.
        rows (`list[Row]`): what its `take(n, step)` returned.
        n (`int`): the rows asked for.
        vocab_size (`int`, *optional*): the policy's embedding rows (token ids must be in [0, vocab_size)).
        context (`int`, *optional*): the policy's positions (a row must not have more tokens).

    Raises:
        ValueError: naming the objective, the count or the row at fault: not `n` rows, not a `Row` with 1-D tensor
            `input_ids`, another objective's index, an empty row (0 tokens), a `mask` that is not target-aligned (L-1
            entries for L tokens), a token id outside the vocabulary, more tokens than the context, or a mask value
            other than 0 / 1.
    """
    if not isinstance(rows, list) or len(rows) != n:
        raise ValueError(
            f"Objective '{objective.name}': take({n}, step) returned "
            f"{len(rows) if isinstance(rows, list) else type(rows).__name__} rows; it must return a list of exactly "
            f"{n} Row objects."
        )
    for i, row in enumerate(rows):
        if not isinstance(row, Row) or not isinstance(row.input_ids, torch.Tensor) or row.input_ids.dim() != 1:
            raise ValueError(
                f"Objective '{objective.name}': take() row {i} is a {type(row).__name__} (input_ids "
                f"{type(getattr(row, 'input_ids', None)).__name__}); return trl_trapo.collator.Row objects with 1-D "
                "tensor input_ids."
            )
        if row.objective != objective.index:
            raise ValueError(
                f"Objective '{objective.name}': take() row {i} has objective={row.objective!r}, but this objective's "
                f"index is {objective.index}: build rows with Row(self.index, ...) (set by setup())."
            )
        tokens = row.input_ids.numel()
        if tokens == 0:  # was "a mask of 0 entries for 0 tokens; ... -1 entries", a fix that does not fit
            raise ValueError(
                f"Objective '{objective.name}': take() row {i} is empty (input_ids has 0 tokens); a row needs at "
                "least 2 tokens to train anything (entry t of its mask weights the prediction of token t+1). Fix: "
                "skip empty documents in take() (e.g. filter the dataset for rows with text) rather than return them."
            )
        mask = getattr(row.mask, "numel", lambda: None)()
        if mask != tokens - 1:
            raise ValueError(
                f"Objective '{objective.name}': take() row {i} has a mask of {mask} entries for {tokens} tokens; "
                f"Row.mask is target-aligned: {tokens - 1} entries, entry t for predicting token t+1 (1 = counts). "
                "Fix: build it from the tokens' mask as mask[1:]."
            )
        if context is not None and tokens > context:
            raise ValueError(
                f"Objective '{objective.name}': take() row {i} is {tokens} tokens, more than the policy's context of "
                f"{context} positions (ObjectiveSetup.max_positions): cut or drop longer rows in the objective."
            )
    if vocab_size is not None and rows:  # one reduction (one host sync) for all the rows
        ids = torch.cat([row.input_ids.reshape(-1).cpu() for row in rows])  # rows may sit on different devices
        outside = (ids < 0) | (ids >= vocab_size)
        if ids.numel() and bool(outside.any()):
            at = int(outside.nonzero()[0, 0])
            i = next(i for i, end in enumerate(itertools.accumulate(r.input_ids.numel() for r in rows)) if at < end)
            raise ValueError(
                f"Objective '{objective.name}': take() row {i} holds token id {int(ids[at])}, outside the policy's "
                f"vocabulary [0, {vocab_size}): tokenize with the policy's tokenizer."
            )
    if rows:  # trial 8's OB05: a mask of -5.0 trained as 1 (the losses read mask.bool()) and counted as -5
        masks = torch.cat([row.mask.reshape(-1).cpu() for row in rows])
        other = (masks != 0) & (masks != 1)
        if masks.numel() and bool(other.any()):
            at = int(other.nonzero()[0, 0])
            i = next(i for i, end in enumerate(itertools.accumulate(r.mask.numel() for r in rows)) if at < end)
            raise ValueError(
                f"Objective '{objective.name}': take() row {i} has a mask value of {float(masks[at])!r}; Row.mask "
                "holds 1 (the position counts) or 0 (it does not): the losses read it as a bool and the step's counts "
                "sum it. Fix: build it as 0/1 (e.g. `(mask != 0).float()`), and weight tokens inside your loss()."
            )


def row_logit_scales(
    objectives: Sequence[Objective], inputs: dict[str, torch.Tensor], rows: Sequence[torch.Tensor]
) -> torch.Tensor | None:
    """Each row's factor on its logits before the log-softmax: its objective's `logit_scale(inputs, rows)` at its rows
    (1 for an objective returning None), or None when every objective returns None.

    Args:
        objectives (`Sequence[Objective]`): the trainer's objectives, in index order.
        inputs (`dict`): the collated micro-batch.
        rows (`Sequence[torch.Tensor]`): `(B,)` bool per objective, its rows of the micro-batch.

    Returns:
        `torch.Tensor | None`: `(B,)`, on the rows' device.

    Raises:
        TypeError: naming the objective, the value got and the shape expected, for a result that is not a `(B,)`
            tensor (a `(3,)` tensor ended in torch's "index 3 is out of bounds for dimension 0 with size 3").
    """
    row_scale = None
    for objective, own in zip(objectives, rows):
        scale = objective.logit_scale(inputs, own)
        if scale is None:
            continue
        if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != tuple(own.shape):
            got = f"shape {tuple(scale.shape)}" if isinstance(scale, torch.Tensor) else type(scale).__name__
            raise TypeError(
                f"Objective '{objective.name}': logit_scale() returned {got}; it must be a tensor of shape (B,) = "
                f"{tuple(own.shape)}, one factor per row of the micro-batch (only its own rows are read: `rows`), or "
                "None (factor 1)."
            )
        scale = scale.to(own.device)  # e.g. built with torch.full(...) on the CPU in a GPU run
        row_scale = scale if row_scale is None else torch.where(own, scale, row_scale)
    return row_scale


def check_term(objective: Objective, term: Any, view: TermInputs) -> None:
    """Refuse a loss term of the wrong form, naming the objective: `view` is what its `loss` was given.

    Raises:
        TypeError: if `term` is not a [`TermOutput`] with a scalar tensor `loss`, or `logp_coef` is not `(B, T)`.
        ValueError: if, while the policy trains (`view.per_token_logps` requires grad), `loss` is nonzero and has no
            gradient (no `grad_fn`: detached, or computed under `torch.no_grad()`) on a micro-batch holding the
            objective's tokens: it would be logged as `loss/<name>` and train nothing (trial 9's PX89). A zero loss
            without gradient is how an objective skips a micro-batch; it is accepted.
    """
    batch_shape = tuple(view.mask.shape)
    if not isinstance(term, TermOutput) or not isinstance(term.loss, torch.Tensor) or term.loss.dim() != 0:
        shape = tuple(term.loss.shape) if isinstance(getattr(term, "loss", None), torch.Tensor) else None
        raise TypeError(
            f"Objective '{objective.name}': loss() must return a trl_trapo.losses.TermOutput whose `loss` is a scalar "
            f"tensor, got {type(term).__name__}"
            + (f" with a loss of shape {shape}" if shape is not None else "")
            + "."
        )
    if term.logp_coef is not None and tuple(term.logp_coef.shape) != batch_shape:
        raise TypeError(
            f"Objective '{objective.name}': TermOutput.logp_coef has shape {tuple(term.logp_coef.shape)}, the "
            f"micro-batch's target positions are {batch_shape} (B, T)."
        )
    # checked only on the rare path: a loss without gradient (the host syncs below never run for a trained term)
    if not term.loss.requires_grad and view.per_token_logps.requires_grad and bool(term.loss.detach() != 0):
        tokens = int(view.tokens.sum())
        if tokens:
            raise ValueError(
                f"Objective '{objective.name}': loss() returned {float(term.loss):.4g} without gradient (no grad_fn: "
                f"detached, computed under torch.no_grad(), or built from Python numbers) on a micro-batch with "
                f"{tokens} of its tokens: it would be logged as loss/{objective.name} and train nothing. Build the "
                "loss from term.per_token_logps or term.logits, keeping their graph (no .detach() / .item()); return "
                "a zero loss for a micro-batch the objective skips."
            )


__all__ = [
    "DistillationObjective",
    "LanguageModelingObjective",
    "Objective",
    "ObjectiveSetup",
    "RLObjective",
    "SFTObjective",
    "TermInputs",
    "check_objectives",
    "check_served_rows",
    "check_state_dict",
    "check_term",
    "count_keys",
    "row_logit_scales",
    "setup_objective",
    "step_counts",
]
