# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Measuring one run of `scripts/experiments/compare_pipelines.py`: clocks, counters, held-out evaluation and
checkpoints.

`Recorder` keeps one run's timeline (the serial stages share one), `recorder_callback` drives it from a trainer's
callbacks, `measured` counts the tokens of a trainer's training forwards (and can run its learning-rate schedule on
time instead of steps), `make_evaluator` gives the held-out metrics (accuracy per split, pretraining-corpus loss).
"""

from __future__ import annotations

import time

from runlib import peak_rss_mb  # scripts/experiments is on sys.path


PROGRESS_PREFIX = "@@progress "  # the line a worker prints for the orchestrator's progress bar


class Stopwatch:
    """Accumulated time of a clock (`time.perf_counter` or `time.process_time`) over start/stop intervals."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.total = 0.0
        self.since: float | None = None

    def start(self) -> None:
        if self.since is None:
            self.since = self.clock()

    def stop(self) -> None:
        if self.since is not None:
            self.total += self.clock() - self.since
            self.since = None

    def read(self) -> float:
        return self.total + (self.clock() - self.since if self.since is not None else 0.0)


def count_tokens(inputs: dict) -> int:
    """Non-padding tokens of one training forward: prompt + completion (GRPO), else the attention mask."""
    if "prompt_mask" in inputs and "completion_mask" in inputs:
        return int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
    if "attention_mask" in inputs:
        return int(inputs["attention_mask"].sum())
    return int(inputs["input_ids"].numel())


class Recorder:
    """One run's clocks, counters and checkpoints. The serial stages share one recorder (one timeline).

    Args:
        evaluate: `model -> dict` of held-out metrics.
        unit: "steps" or "time": what the budget (and the checkpoint grid) counts.
        total: the budget in that unit (optimizer steps or seconds).
        eval_every: checkpoint spacing, a fraction of the budget.
    """

    def __init__(self, evaluate, unit: str, total: float, eval_every: float):
        self.evaluate_fn = evaluate
        self.unit = unit
        self.total = max(float(total), 1e-9)
        self.eval_every = eval_every
        self.wall = Stopwatch()
        self.cpu = Stopwatch(time.process_time)
        self.eval_s = 0.0
        self.generation_s = 0.0
        self.tokens = 0
        self.global_step = 0
        self.evaluating = False
        self.rows: list[dict] = []
        self.next_mark = 1
        self.stage_ends: list[dict] = []
        self._last_progress = -1

    def used(self) -> float:
        """Budget used so far, in its unit."""
        return self.global_step if self.unit == "steps" else self.wall.read()

    def checkpoint(self, model, stage: str, reason: str) -> None:
        """Evaluate `model` with the clocks stopped and record a row."""
        running = self.wall.since is not None
        self.wall.stop()
        self.cpu.stop()
        self.evaluating = True
        start = time.perf_counter()
        try:
            metrics = self.evaluate_fn(model)
        finally:
            self.evaluating = False
            self.eval_s += time.perf_counter() - start
        wall = self.wall.read()
        self.rows.append(
            {
                "stage": stage,
                "reason": reason,
                "step": self.global_step,
                "budget_fraction": min(self.used() / self.total, 1.0),
                "wall_s": wall,
                "cpu_s": self.cpu.read(),
                "eval_s": self.eval_s,
                "generation_s": self.generation_s,
                "generation_share": self.generation_s / wall if wall > 0 else 0.0,
                "tokens": self.tokens,
                "peak_rss_mb": peak_rss_mb(),
                **metrics,
            }
        )
        if running:
            self.wall.start()
            self.cpu.start()

    def due(self) -> bool:
        mark = self.next_mark * self.eval_every * self.total
        return self.next_mark * self.eval_every < 1 - 1e-9 and self.used() >= mark - 1e-9

    def maybe_checkpoint(self, model, stage: str) -> None:
        if self.due():
            self.checkpoint(model, stage, "grid")
            while self.due():  # a step larger than the spacing covers several marks
                self.next_mark += 1

    def progress(self) -> None:
        percent = int(100 * min(self.used() / self.total, 1.0))
        if percent != self._last_progress:
            self._last_progress = percent
            print(f"{PROGRESS_PREFIX}{percent}", flush=True)

    def instrument_generate(self, model) -> None:
        """Time `model.generate` during training (calls made while evaluating are not counted)."""
        if getattr(model, "_compare_timed", False):
            return
        original = model.generate

        def timed_generate(*args, **kwargs):
            if self.evaluating:
                return original(*args, **kwargs)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.generation_s += time.perf_counter() - start

        model.generate = timed_generate
        model._compare_timed = True


def recorder_callback(recorder: Recorder, stage: str, step_offset: int, stop_at_s: float | None, first: bool):
    """A `TrainerCallback` that drives `recorder` for one trainer (one serial stage, or the TRAPO run)."""
    from transformers import TrainerCallback

    class RecorderCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if first:
                recorder.checkpoint(model, stage, "initial")
            recorder.wall.start()
            recorder.cpu.start()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            recorder.global_step = step_offset + state.global_step
            recorder.maybe_checkpoint(model, stage)
            recorder.progress()
            if stop_at_s is not None and recorder.wall.read() >= stop_at_s:
                control.should_training_stop = True

        def on_train_end(self, args, state, control, model=None, **kwargs):
            recorder.wall.stop()
            recorder.cpu.stop()
            last = recorder.rows[-1] if recorder.rows else None
            if last is not None and last["step"] == recorder.global_step and last["stage"] == stage:
                last["reason"] = "stage_end"  # a grid checkpoint at the very last step: no second evaluation
            else:
                recorder.checkpoint(model, stage, "stage_end")
            recorder.stage_ends.append({"stage": stage, "step": recorder.global_step, "wall_s": recorder.wall.read()})

    return RecorderCallback()


def measured(trainer_cls, recorder: Recorder, time_fraction=None):
    """`trainer_cls` counting the tokens of its training forwards; with `time_fraction` (a `() -> [0, 1]`), its
    learning-rate schedule runs on the fraction of the time budget used instead of the fraction of steps."""

    def on_time(lr_lambda, num_training_steps):
        # the step-based multiplier evaluated at the step the elapsed time fraction corresponds to
        return lambda _: lr_lambda(min(int(time_fraction() * num_training_steps), num_training_steps))

    class Measured(trainer_cls):
        def compute_loss(self, model, inputs, *args, **kwargs):
            if model.training:
                recorder.tokens += count_tokens(inputs)
            return super().compute_loss(model, inputs, *args, **kwargs)

        def create_scheduler(self, num_training_steps, optimizer=None):
            scheduler = super().create_scheduler(num_training_steps, optimizer)
            if time_fraction is not None and hasattr(scheduler, "lr_lambdas"):
                scheduler.lr_lambdas = [on_time(fn, num_training_steps) for fn in scheduler.lr_lambdas]
            return scheduler

    Measured.__name__ = f"Measured{trainer_cls.__name__}"
    return Measured


def make_evaluator(setup):
    """`model -> metrics` for `setup` (a `compare_pipelines.Setup`): held-out accuracy (overall and per split) and
    held-out pretraining loss (nats/token)."""
    import torch

    from trl_trapo.evaluation import document_rows, nll_sum
    from trl_trapo.tasks import greedy_accuracy

    tokenizer, config = setup.tokenizer, setup.config
    rows = document_rows(list(setup.heldout_texts), tokenizer, config.pretrain_max_length)

    def evaluate(model) -> dict[str, float]:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                if setup.builtin:
                    accuracy = greedy_accuracy(model, tokenizer, setup.eval, max_new_tokens=config.response_length)
                else:
                    accuracy = greedy_reward(model, tokenizer, setup.eval, setup.reward_funcs, config)
                total, count = nll_sum(model, rows, tokenizer.pad_token_id, config.per_device_eval_batch_size)
        finally:
            model.train(was_training)
        return {**accuracy, "pretrain_loss": total / max(count, 1.0)}

    return evaluate


def greedy_reward(model, tokenizer, dataset, reward_funcs, config) -> dict[str, float]:
    """Mean greedy-decoding reward (weighted over `reward_funcs`) of held-out prompts, overall and per `split`."""
    import torch

    weights = config.reward_weights or [1.0] * len(reward_funcs)
    prompts = list(dataset["prompt"])
    texts_in = [
        p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    columns = {c: dataset[c] for c in dataset.column_names if c not in ("prompt", "completion")}
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    completions: list[str] = []
    try:
        for start in range(0, len(texts_in), config.per_device_eval_batch_size):
            batch = tokenizer(
                texts_in[start : start + config.per_device_eval_batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            ).to(next(model.parameters()).device)
            out = model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=config.response_length,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            completions += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    if not isinstance(prompts[0], str):
        completions = [[{"role": "assistant", "content": c}] for c in completions]
    scores = torch.zeros(len(prompts))
    for func, weight in zip(reward_funcs, weights):
        values = func(prompts=prompts, completions=completions, completion_ids=None, **columns)
        scores += weight * torch.tensor([float("nan") if v is None else v for v in values]).nan_to_num(0.0)
    metrics = {"accuracy": float(scores.mean())}
    for split in sorted(set(columns.get("split", []))):
        keep = torch.tensor([s == split for s in columns["split"]])
        metrics[f"accuracy_{split}"] = float(scores[keep].mean())
    return metrics
