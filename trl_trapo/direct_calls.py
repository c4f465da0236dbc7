# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`Trainer` methods a user calls directly to look at the data, as TRAPOTrainer serves them (its training batches are
built per objective in the step, so transformers' loss-collator batches do not exist): the eval and test rows as TRL's
`GRPOTrainer` serves them (lists of row dicts, its collator is `identity`), and `prediction_step` refused, naming what
to use. Bound as methods of [`~trl_trapo.trainer.TRAPOTrainer`]; they read its public attributes (`args`,
`processing_class`, `eval_dataset`, `accelerator`).
"""

from __future__ import annotations

from datasets import Dataset
from torch.utils.data import DataLoader
from trl.trainer.utils import identity

from .data import dataset_to_evaluate
from .vision import text_tokenizer


def get_eval_dataloader(self, eval_dataset: str | Dataset | None = None) -> DataLoader:
    """The eval rows, `per_device_eval_batch_size` at a time, each batch a list of the rows as dicts (the dataset's
    columns, untokenized), as TRL's `GRPOTrainer` serves them (its collator is `identity`), sharded over processes
    by accelerate. For looking at the data: TRAPO's `evaluate` does not use it (it tokenizes and batches each
    format itself, [`~trl_trapo.evaluation.Evaluator`]).

    Args:
        eval_dataset: a dataset; a key of the trainer's eval dict; None: the trainer's own.

    Raises:
        ValueError: as `evaluate` does (no eval dataset, an unknown key, a dataset TRAPO does not evaluate); when
            the trainer's own eval set is a dict and no key is given, naming the keys.
    """
    tokenizer, assistant_only_loss = text_tokenizer(self.processing_class), self.args.assistant_only_loss
    dataset = dataset_to_evaluate(eval_dataset, self.eval_dataset, tokenizer, assistant_only_loss)
    if isinstance(dataset, dict):
        raise ValueError(
            f"get_eval_dataloader(): the trainer's eval_dataset is a dict; name one of its keys {list(dataset)}, "
            f"e.g. get_eval_dataloader({next(iter(dataset))!r})."
        )
    return self.rows_dataloader(dataset)


def get_test_dataloader(self, test_dataset: Dataset) -> DataLoader:
    """`test_dataset`'s rows, batched as [`get_eval_dataloader`] batches them (lists of row dicts).

    Raises:
        ValueError: `test_dataset` is not a dataset TRAPO evaluates (checked as `evaluate` checks it).
    """
    tokenizer, assistant_only_loss = text_tokenizer(self.processing_class), self.args.assistant_only_loss
    return self.rows_dataloader(dataset_to_evaluate(test_dataset, None, tokenizer, assistant_only_loss))


def rows_dataloader(self, dataset: Dataset) -> DataLoader:
    """`dataset`'s rows in order, `per_device_eval_batch_size` per batch, each batch a list of row dicts (TRL's
    `identity` collator), prepared by accelerate (sharded over processes)."""
    loader = DataLoader(dataset, batch_size=self.args.per_device_eval_batch_size, shuffle=False, collate_fn=identity)
    return self.accelerator.prepare(loader)


def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys: list[str] | None = None):
    """Not supported: transformers' evaluation loop calls it with the loss collator's batches, which TRAPO does not
    have (see [`~trl_trapo.trainer.TRAPOTrainer.predict`]); TRAPO's `evaluate` computes its metrics without it.

    Raises:
        NotImplementedError: always, naming what to use instead.
    """
    raise NotImplementedError(
        "TRAPOTrainer has no `prediction_step`: use `trainer.evaluate(dataset)` for rewards and losses on held-out "
        "rows, or `trainer.generate_completions(dataset=dataset)` for the policy's greedy completions and their scores."
    )


def compute_loss_without_context(context) -> str:
    """The message of `TRAPOTrainer.compute_loss` called without the step's `StepContext` (e.g. on a batch of one's
    own, `trainer.compute_loss(model, {"input_ids": ...})`): why, and what to use instead."""
    return (
        "compute_loss needs the step's StepContext as `num_items_in_batch` (got "
        f"{type(context).__name__}): TRAPOTrainer builds each step's micro-batches, rows of every objective "
        "with their masks and weights, and their context in get_batch_samples, so it has no loss for a batch "
        "of your own. Fix: for the losses and rewards of held-out rows call trainer.evaluate(dataset); to add "
        "a loss term, write an objective (docs/seams.md, 'Adding an objective'); a subclass that overrides "
        "compute_loss passes on the `num_items_in_batch` it was given."
    )
