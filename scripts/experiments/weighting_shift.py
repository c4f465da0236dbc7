# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The run-time pieces of the weighting benchmark's shift task (docs/weighting_benchmark.md, "The shift task";
issue 42): the wrong teacher's data, the callback that swaps it into a running job, and the two child-process workers
that `weighting_benchmark.py` launches (`--_wrong_teacher`: train and measure the wrong teacher; `--_shift`: one shift
cell). The shift cells themselves (their ids, settings, decision and report) live in `weighting_benchmark.py`.

**The wrong teacher** is T2's teacher (a run of the main job with its defaults) trained on RL prompts whose
`rl_only` answers (`lst`: the last letter) are shifted by one letter (`trl_trapo.tasks.successor`: `"b"` -> `"c"`):
a teacher that is confident on those prompts and wrong. `wrong_teacher_worker` measures both sides of that claim,
its greedy accuracy on the suite's held-out `lst` prompts against the shifted answers and against the true ones.

**The swap** (`TeacherSwapCallback`): when the run has finished `swap_step` optimizer steps, the wrong teacher's
weights are copied into the running teacher (`trainer.teacher_model`, in place, without gradients: it stays the
same frozen module the distillation objective and the rollout engine hold), so every step from `swap_step` on
(0-indexed) is built with the wrong teacher.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from runlib import write_json_atomic
from torch import nn
from transformers import TrainerCallback

from trl_trapo.tasks import TASK_FAMILIES, greedy_accuracy, successor


logger = logging.getLogger("weighting_shift")

RL_ONLY_FAMILIES = tuple(family.name for family in TASK_FAMILIES if not family.has_sft)  # ("lst",)


# =====================================================================================================================
# The wrong teacher's data
# =====================================================================================================================
def shift_answers(dataset, families: Sequence[str] = RL_ONLY_FAMILIES):
    """`dataset` with the `answer` of every row whose `task` is in `families` replaced by its alphabet successor
    (`trl_trapo.tasks.successor`: `"b"` -> `"c"`); other rows unchanged. A `datasets.Dataset.map`, so the rows'
    order and the other columns are kept.

    Args:
        dataset (`datasets.Dataset`): rows with `answer` and `task` (the suite's `rl_train` or `eval`).
        families: the families whose answers shift (default the suite's `rl_only` ones: `lst`).

    Returns:
        `datasets.Dataset`: a new dataset, as many rows.

    Raises:
        ValueError: if `dataset` lacks an `answer` or a `task` column, or (from `successor`) an answer of a shifted
            family has a letter without a successor.
    """
    for column in ("answer", "task"):
        if column not in dataset.column_names:
            raise ValueError(
                f"shift_answers: the dataset has no `{column}` column (it has {dataset.column_names}); pass the "
                "built-in suite's `rl_train` or `eval`, whose rows name their family in `task`."
            )
    shifted = frozenset(families)
    return dataset.map(
        lambda row: {"answer": successor(row["answer"]) if row["task"] in shifted else row["answer"]},
        desc="shifting the rl_only answers",
    )


def shifted_demonstrations(dataset, families: Sequence[str] = RL_ONLY_FAMILIES):
    """SFT demonstrations (`prompt`, `completion`) of `families`, one per distinct prompt of `dataset`, answered with
    the shifted answer: what the wrong teacher is given on top of the suite's SFT data when RL alone does not teach it
    the shifted answers (docs/weighting_benchmark.md's implementation note of the shift task).

    Args:
        dataset (`datasets.Dataset`): RL rows with `prompt`, `answer` (already shifted) and `task`.
        families: the families to demonstrate.

    Returns:
        `datasets.Dataset` with columns `prompt` and `completion`, in the order of the prompts' first rows.
    """
    from datasets import Dataset

    seen: dict[str, str] = {}
    for prompt, answer, task in zip(dataset["prompt"], dataset["answer"], dataset["task"]):
        if task in families:
            seen.setdefault(prompt, answer)
    return Dataset.from_dict({"prompt": list(seen), "completion": list(seen.values())})


# =====================================================================================================================
# The swap
# =====================================================================================================================
class TeacherSwapCallback(TrainerCallback):
    """Copies `state_dict` into the running teacher once the run has finished `swap_step` optimizer steps.

    The trainer builds each optimizer step's rows (its rollouts and their teacher scores) in `get_batch_samples`,
    before `on_step_begin`, so the swap happens at the end of step `swap_step` (`on_step_end` with
    `state.global_step == swap_step`; at `on_train_begin` for a run that starts there or later): every step from
    `swap_step` on (0-indexed) is built with the new teacher. Trajectories sampled before the swap and replayed after
    it (`num_ppo_epochs` > 1) keep the teacher scores they were sampled with.

    Args:
        teacher: returns the running teacher module (e.g. `lambda: trainer.accelerator.unwrap_model(
            trainer.teacher_model)`), read at each event, never stored.
        state_dict: the new teacher's parameters and buffers, by the running teacher's names (`model.state_dict()`
            of the wrong teacher).
        swap_step: optimizer steps after which to swap (>= 0).
        record: called once with the swap's record (`step`, `swap_step`, `max_abs_difference` between the teacher's
            parameters and `state_dict` after the copy (0.0), `changed_parameters`: how many differed before it).

    Attributes:
        swapped_at (`int` or None): the `state.global_step` of the swap; None before it.

    Raises:
        ValueError: at `on_train_begin`, before any step: if the run has no teacher, or `state_dict`'s names or
            shapes differ from the running teacher's; at construction, if `swap_step` is negative.
    """

    def __init__(
        self,
        teacher: Callable[[], nn.Module | None],
        state_dict: Mapping[str, torch.Tensor],
        swap_step: int,
        record: Callable[[dict], None] | None = None,
    ):
        if swap_step < 0:
            raise ValueError(f"TeacherSwapCallback: swap_step={swap_step} must be >= 0 (optimizer steps).")
        self.teacher, self.state_dict, self.swap_step, self.record = teacher, dict(state_dict), int(swap_step), record
        self.swapped_at: int | None = None

    def check(self) -> nn.Module:
        """The running teacher, after checking that `state_dict` fits it (names and shapes).

        Raises:
            ValueError: as the class says.
        """
        teacher = self.teacher()
        if teacher is None:
            raise ValueError(
                "TeacherSwapCallback: the run has no teacher to swap (trainer.teacher_model is None); give it one "
                "(--teacher_model_name_or_path)."
            )
        mine = {name: tuple(value.shape) for name, value in teacher.state_dict().items()}
        theirs = {name: tuple(value.shape) for name, value in self.state_dict.items()}
        if mine != theirs:
            differ = sorted(set(mine) ^ set(theirs)) or sorted(k for k in mine if mine[k] != theirs[k])
            raise ValueError(
                f"TeacherSwapCallback: the new teacher's weights do not fit the running teacher ({len(differ)} names "
                f"or shapes differ, e.g. {differ[0]!r}); train the wrong teacher with the running teacher's model "
                "configuration."
            )
        return teacher

    def swap(self, step: int) -> None:
        """Copy `state_dict` into the running teacher now (in place, no gradients) and record it."""
        teacher = self.check()
        with torch.no_grad():
            before = teacher.state_dict()
            changed = sum(
                not torch.equal(before[name], value.to(before[name])) for name, value in self.state_dict.items()
            )
            teacher.load_state_dict(self.state_dict)
            after = teacher.state_dict()
            difference = max(
                (float((after[name] - value.to(after[name])).abs().max()) for name, value in self.state_dict.items()
                 if value.is_floating_point() and value.numel()),
                default=0.0,
            )  # fmt: skip
        self.swapped_at = step
        logger.info("teacher swapped at step %d (%d of %d tensors changed)", step, changed, len(self.state_dict))
        if self.record is not None:
            self.record(
                {
                    "step": step,
                    "swap_step": self.swap_step,
                    "max_abs_difference": difference,
                    "changed_parameters": changed,
                    "parameters": len(self.state_dict),
                }
            )

    def on_train_begin(self, args, state, control, **kwargs):
        self.check()
        if self.swapped_at is None and state.global_step >= self.swap_step:
            self.swap(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.swapped_at is None and state.global_step >= self.swap_step:
            self.swap(state.global_step)


def load_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of the causal LM saved in `folder` (`AutoModelForCausalLM.from_pretrained`: safetensors)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder)).state_dict()


# =====================================================================================================================
# Workers (child processes of weighting_benchmark.py)
# =====================================================================================================================
def _spec(spec_path: str) -> dict[str, Any]:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    torch.set_num_threads(spec["threads"])
    return spec


def lst_accuracies(model, tokenizer, eval_dataset, families: Sequence[str] = RL_ONLY_FAMILIES) -> dict[str, Any]:
    """Greedy accuracy of `model` on the held-out prompts of `families`: `against_shifted` (the shifted answers),
    `against_true` (the true ones), both in [0, 1], and `prompts` (how many)."""
    held = eval_dataset.filter(lambda row: row["task"] in families)
    return {
        "against_shifted": greedy_accuracy(model, tokenizer, shift_answers(held, families))["accuracy"],
        "against_true": greedy_accuracy(model, tokenizer, held)["accuracy"],
        "prompts": len(held),
    }


def wrong_teacher_worker(spec_path: str) -> None:
    """Train the wrong teacher in this process and write `spec["result_path"]`.

    The spec (`weighting_benchmark.ensure_wrong_teacher`): `job_argv` (the teacher run's arguments of the main job,
    `--output_dir` the wrong teacher's folder), `shifted_sft` (add shifted `lst` demonstrations to the SFT data),
    `true_teacher` (T2's teacher's folder, measured the same way; None to skip), `threads`, `result_path`.
    The setup is the main job's (`compare_pipelines.build_setup`, no held-out pretraining documents), the RL prompts'
    `rl_only` answers shifted (`shift_answers`), trained by `TRAPOTrainer` with the job's configuration and saved
    into the folder; the result holds `lst_accuracies` of the saved model (and of the true teacher).
    """
    import compare_pipelines
    from datasets import concatenate_datasets
    from transformers import AutoModelForCausalLM

    from trl_trapo import TRAPOTrainer

    spec = _spec(spec_path)
    setup = compare_pipelines.build_setup(
        {"job_argv": spec["job_argv"], "quick": False, "job_extra": {}, "heldout_docs": 0}
    )
    if not setup.builtin:
        raise ValueError("The wrong teacher is built from the built-in task suite: drop --model_name_or_path.")
    rl = shift_answers(setup.rl)
    sft = setup.sft
    if spec["shifted_sft"]:
        sft = concatenate_datasets([sft, shifted_demonstrations(rl)])
    trainer = TRAPOTrainer(
        model=setup.model_factory(),
        reward_funcs=setup.reward_funcs,
        args=setup.config,
        train_dataset=rl,
        eval_dataset=setup.eval,
        pretrain_dataset=setup.pretrain,
        sft_dataset=sft,
        processing_class=setup.tokenizer,
    )
    trainer.train()
    trainer.save_model(setup.config.output_dir)
    result = {
        "wrong_teacher": lst_accuracies(
            AutoModelForCausalLM.from_pretrained(setup.config.output_dir), setup.tokenizer, setup.eval
        ),
        "rl_rows_shifted": sum(task in RL_ONLY_FAMILIES for task in rl["task"]),
        "sft_rows": len(sft),
    }
    if spec.get("true_teacher"):
        true = AutoModelForCausalLM.from_pretrained(spec["true_teacher"])
        result["true_teacher"] = lst_accuracies(true, setup.tokenizer, setup.eval)
    write_json_atomic(spec["result_path"], result)


def shift_worker(spec_path: str) -> None:
    """One shift cell in this process: `compare_pipelines.worker` (the T2 cell's run) with a `TeacherSwapCallback`
    that swaps in the wrong teacher (`spec["wrong_teacher"]`, a folder) after `spec["swap_fraction"]` of the job's
    `max_steps`, recording the swap in `spec["swap_record"]` (a JSON file).

    Raises:
        ValueError: if the spec names no wrong teacher (before the run).
    """
    import compare_pipelines

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    if not spec.get("wrong_teacher"):
        raise ValueError(f"{spec_path}: a shift cell's spec needs `wrong_teacher` (the wrong teacher's folder).")
    weights = load_weights(spec["wrong_teacher"])  # before the run: a missing folder fails at once
    record_path = spec["swap_record"]

    def callbacks(trainer) -> list:
        swap_step = int(trainer.args.max_steps * spec["swap_fraction"])
        return [
            TeacherSwapCallback(
                lambda: (
                    None if trainer.teacher_model is None else trainer.accelerator.unwrap_model(trainer.teacher_model)
                ),
                weights,
                swap_step,
                lambda record: write_json_atomic(record_path, {**record, "wrong_teacher": spec["wrong_teacher"]}),
            )
        ]

    compare_pipelines.worker(spec_path, extra_callbacks=callbacks)
