# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""On-policy distillation from a real teacher: TRAPO's joint loop against TRL's `DistillationTrainer`, on GSM8K, with
SmolLM2-135M-Instruct as the teacher and a student cut from it.

    python scripts/experiments/distill_real.py                 # the two arms (~1 h on 2 CPU cores); resumes
    python scripts/experiments/distill_real.py --quick         # a tiny random teacher with SmolLM2's tokenizer
    python scripts/experiments/distill_real.py --write_docs  # the docs block from the committed results

The student is the teacher's first `--student_layers` (8) of its 30 decoder layers with their weights, the teacher's
embeddings, final norm and (tied) output layer: a student from random weights would write no usable text within a
CPU budget. Cut like this it writes none either at first (held-out loss ~20 nats/token against the teacher's 4.8):
both arms start from that student and have the same optimizer steps to repair it.

Arms (each in its own process; `--jobs 2` runs both at once with `cores / 2` torch threads each):

- `trapo`: `TRAPOTrainer` with the recipe `examples/recipes/gsm8k_smollm2_135m_cpu.yaml` (pretraining on English
  text + SFT on GSM8K solutions + RL with the `numeric_answer` reward) and the teacher as a fourth objective
  (`--teacher_model_name_or_path`): the teacher scores the student's own RL completions, DARE weights the term;
- `distill_trl`: TRL's `DistillationTrainer` on the same GSM8K prompts, with the same teacher, divergence
  (`beta` = `distillation_beta`, `temperature` = `distillation_temperature`, which TRL also samples at), optimizer,
  schedule, rows per step and completion length. It sees no reward, SFT or pretraining data: that is the method.

Both arms sample at `--temperature` (0.7, the recipe's: at 1.0 SmolLM2's completions turn to noise), and the
divergence is taken at that temperature, so the trained quantity is the same. Every step has
`per_device_train_batch_size` (4, half the recipe's: with 8 rows of 128-token generations a TRL step took 75–140 s on
the loaded 2-core machine) rows; TRAPO's are shared between its objectives by the curriculum.

Measured on held-out data at step 0 (the student; shared), `--points` evenly spaced steps and the end:

- divergence to the teacher on the first `--eval_rows` (50) GSM8K test problems, which no arm trains on: the
  student's greedy completion (up to `response_length` tokens) is scored by both models and the per-token reverse
  KL(student || teacher) — what both arms minimise (`distillation_beta` 1) — and forward KL(teacher || student) are
  averaged over its tokens (nats/token; `trl_trapo.losses.generalized_jsd` at the divergence's temperature); also the
  forward KL on the *teacher's* greedy completions (how well the student imitates the teacher's own answers);
- format compliance: the fraction of those completions ending with a parsable `#### N`; accuracy (no claim: an 8-layer
  SmolLM2 solves almost nothing);
- general-text loss: the held-out language-modelling loss (nats/token) on the first `--heldout_rows` (50) paragraphs
  of `examples/data/shakespeare/heldout.txt`. Caveat: TRAPO's pretraining corpus is the training part of the same
  text (the recipe's choice, see its header), so this measures what a pretraining term on the text you want to keep
  does, against a method that has none;
- training wall and CPU time (evaluations excluded), peak resident memory.

Caching as in `compare_real.py`: `<results_dir>/initial.json` and `<results_dir>/arms/<arm>.json` are written
atomically with a fingerprint of what defines them; a rerun skips what is cached. `results.json` and the docs block
(`--write_docs`) are rebuilt from the cache. Arguments this script does not know go to the main job's parser after
`--config <recipe>` (they reach the TRAPO arm; the TRL arm copies the settings it shares with it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # compare_real, pipeline_measure, result_blocks, runlib
sys.path.insert(0, str(HERE.parent))  # scripts/: gsm8k_to_trl, fetch_smollm2

import compare_real as real  # noqa: E402  (after the path set-up)
import runlib  # noqa: E402
from result_blocks import file_link, write_block_from_results  # noqa: E402


logger = logging.getLogger("distill_real")

RESULTS_DIR = ROOT / "docs" / "results" / "distill_real"
BLOCK = "distill-real-table"
ARMS = ("trapo", "distill_trl")
# the comparison's settings on top of the recipe (explicit command-line flags still win)
JOB = {
    "max_steps": 100,
    "per_device_train_batch_size": 4,
    "response_length": 128,
    "learning_rate": 1e-4,
    "distillation_temperature": 0.7,
    "distillation_beta": 1.0,
}
# `--quick`: a few tiny steps on the stand-in model
QUICK_JOB = {
    **real.QUICK_JOB,
    "max_steps": 2,
    "per_device_train_batch_size": 8,
    "distillation_temperature": 0.7,
    "distillation_beta": 1.0,
}
QUICK_EVAL = {"eval_rows": 4, "heldout_rows": 4}
# what the initial measurement depends on besides the models and the evaluation sizes
MEASURE_SETTINGS = (
    "model_name_or_path", "response_length", "distillation_temperature", "per_device_eval_batch_size",
    "pretrain_max_length",
)  # fmt: skip
# the fields TRL's DistillationConfig takes from the TRAPO configuration (everything else is its own default)
SHARED_FIELDS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "lr_scheduler_type",
    "warmup_steps", "weight_decay", "max_grad_norm", "max_steps", "seed", "bf16", "top_p", "top_k",
    "disable_dropout",
)  # fmt: skip


# =====================================================================================================================
# The student and the measures
# =====================================================================================================================
def make_student(teacher: str | Path, folder: Path, layers: int) -> Path:
    """Save the teacher's first `layers` decoder layers, with its embeddings, final norm and output layer, as a
    model of its own (`config.num_hidden_layers = layers`) with the teacher's tokenizer, atomically.

    Args:
        teacher: the teacher's folder (a Llama-style `AutoModelForCausalLM` with `model.layers`).
        folder: where the student goes; returned untouched when it already holds one cut from the same teacher to
            the same depth.
        layers: decoder layers kept, 1 <= layers <= the teacher's.

    Returns:
        `folder`.

    Raises:
        ValueError: if `layers` is outside [1, the teacher's layer count].
    """
    marker = folder / "student.json"
    wanted = {"teacher": str(Path(teacher).resolve()), "layers": layers}
    if runlib.read_json(marker) == wanted:
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(teacher, dtype="float32")
    total = model.config.num_hidden_layers
    if not 1 <= layers <= total:
        raise ValueError(f"--student_layers must be in [1, {total}] (the teacher's layers), got {layers}.")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".student-", dir=folder.parent))
    model.save_pretrained(staging)
    AutoTokenizer.from_pretrained(teacher).save_pretrained(staging)
    runlib.write_json_atomic(staging / "student.json", wanted)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    return folder


def divergences(student, teacher, prompt_ids, completion_ids, temperature: float, batch_size: int) -> dict[str, Any]:
    """Per-token divergences between the student's and the teacher's next-token distributions on given completions.

    Each row `prompt_ids[i] + completion_ids[i]` is run through both models (no padding inside a row); at the
    positions that predict the completion's tokens the generalised JSD (`trl_trapo.losses.generalized_jsd`, GKD eq. 1)
    is taken with beta 1 (reverse KL(student || teacher)) and beta 0 (forward KL(teacher || student)), both
    distributions at `temperature`.

    Args:
        student, teacher: causal LMs over one vocabulary, in eval mode.
        prompt_ids: one list of token ids per row.
        completion_ids: the completion's token ids per row (rows with none are skipped).
        temperature: tau > 0 of both softmaxes.
        batch_size: rows per forward.

    Returns:
        `reverse_kl` / `forward_kl`: means over all completion tokens (nats/token); `per_row_reverse_kl` (nats/token
        per row, None for an empty completion); `tokens`.
    """
    import torch

    from trl_trapo.losses import generalized_jsd

    device = next(student.parameters()).device
    sums = {"reverse": 0.0, "forward": 0.0}
    per_row: list[float | None] = [None] * len(prompt_ids)
    tokens = 0
    rows = [i for i in range(len(prompt_ids)) if completion_ids[i]]
    for first in range(0, len(rows), batch_size):
        batch = rows[first : first + batch_size]
        seqs = [list(prompt_ids[i]) + list(completion_ids[i]) for i in batch]
        width = max(len(s) for s in seqs)
        input_ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
        with torch.no_grad():
            student_logits = student(input_ids=input_ids, attention_mask=mask).logits
            teacher_logits = teacher(input_ids=input_ids, attention_mask=mask).logits
            for row, i in enumerate(batch):
                start, count = len(prompt_ids[i]) - 1, len(completion_ids[i])
                s, t = student_logits[row, start : start + count], teacher_logits[row, start : start + count]
                reverse = generalized_jsd(s, t, beta=1.0, temperature=temperature)
                forward = generalized_jsd(s, t, beta=0.0, temperature=temperature)
                sums["reverse"] += reverse.sum().item()
                sums["forward"] += forward.sum().item()
                per_row[i] = reverse.mean().item()
                tokens += count
    n = max(tokens, 1)
    return {
        "reverse_kl": sums["reverse"] / n,
        "forward_kl": sums["forward"] / n,
        "per_row_reverse_kl": per_row,
        "tokens": tokens,
    }


class Measure:
    """The held-out measures of one student (see the module docstring).

    Args:
        tokenizer: the shared tokenizer.
        teacher_path: the teacher's folder (loaded once, frozen, in eval mode).
        problems: the evaluation problems (`compare_real.eval_problems`).
        texts: the held-out paragraphs (`compare_real.heldout_texts`).
        max_new_tokens: completion budget (tokens).
        temperature: the divergence's temperature.
        batch_size: rows per forward / generation batch.
        heldout_length: tokens per held-out row.
        teacher_completions: the teacher's greedy completion ids per problem (None: the measure makes them).
    """

    def __init__(self, tokenizer, teacher_path, problems, texts, max_new_tokens, temperature, batch_size,
                 heldout_length, teacher_completions=None):  # fmt: skip
        import torch
        from transformers import AutoModelForCausalLM

        self.tokenizer, self.problems, self.texts = tokenizer, problems, texts
        self.max_new_tokens, self.temperature, self.batch_size = max_new_tokens, temperature, batch_size
        self.heldout_length = heldout_length
        self.teacher = AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float32).eval()
        self.teacher.requires_grad_(False)
        if teacher_completions is None:
            teacher_completions = real.greedy_completions(
                self.teacher, tokenizer, [p["prompt"] for p in problems], max_new_tokens, batch_size
            )["completion_ids"]
        self.teacher_completions = teacher_completions

    def __call__(self, model) -> dict[str, Any]:
        """Measure `model` (put in eval mode for the measure, then back); returns the metrics and completions."""
        from trl_trapo.rewards import numeric_answer_reward

        was_training = model.training
        model.eval()
        try:
            start = time.perf_counter()
            generated = real.greedy_completions(
                model, self.tokenizer, [p["prompt"] for p in self.problems], self.max_new_tokens, self.batch_size
            )
            own = divergences(model, self.teacher, generated["prompt_ids"], generated["completion_ids"],
                              self.temperature, self.batch_size)  # fmt: skip
            on_teacher = divergences(model, self.teacher, generated["prompt_ids"], self.teacher_completions,
                                     self.temperature, self.batch_size)  # fmt: skip
            completions = generated["completions"]
            rewards = numeric_answer_reward(completions, [p["answer"] for p in self.problems])
            n = max(len(completions), 1)
            return {
                "reverse_kl": own["reverse_kl"],
                "forward_kl": own["forward_kl"],
                "per_problem_reverse_kl": own["per_row_reverse_kl"],
                "forward_kl_on_teacher_text": on_teacher["forward_kl"],
                "format": sum(real.ends_with_answer(c) for c in completions) / n,
                "accuracy": sum(1 for r in rewards if r == 1.0) / n,
                "mean_tokens": sum(generated["lengths"]) / n,
                "heldout_loss": real.heldout_loss(
                    model, self.tokenizer, self.texts, self.heldout_length, self.batch_size
                ),
                "completions": completions,
                "seconds": time.perf_counter() - start,
            }
        finally:
            model.train(was_training)


# =====================================================================================================================
# The tasks (one process each)
# =====================================================================================================================
def measure_for(spec: dict, config, tokenizer, teacher_completions=None) -> Measure:
    """The spec's `Measure`, with the configuration's lengths and the comparison's evaluation sizes."""
    return Measure(
        tokenizer,
        spec["teacher"],
        real.eval_problems(spec["eval_rows"]),
        real.heldout_texts(spec["heldout_rows"]),
        config.response_length,
        config.distillation_temperature,
        config.per_device_eval_batch_size,
        config.pretrain_max_length,
        teacher_completions,
    )


def evaluation_callback(measure: Measure, points: list[int], rows: list, clock: dict):
    """A `TrainerCallback` measuring the model at the optimizer steps in `points` (appended to `rows` with the step
    and the training clocks so far); the measure's own time is kept off `clock` (`wall`, `cpu`: training only)."""
    from transformers import TrainerCallback

    class Evaluate(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.setdefault("started", (time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step not in points:
                return
            wall, cpu = time.perf_counter(), time.process_time()
            start_wall, start_cpu = clock["started"]
            clock["wall"] = wall - start_wall - clock.get("eval_wall", 0.0)
            clock["cpu"] = cpu - start_cpu - clock.get("eval_cpu", 0.0)
            row = measure(model)
            row.update(step=state.global_step, train_wall_s=clock["wall"], train_cpu_s=clock["cpu"])
            rows.append(row)
            clock["eval_wall"] = clock.get("eval_wall", 0.0) + time.perf_counter() - wall
            clock["eval_cpu"] = clock.get("eval_cpu", 0.0) + time.process_time() - cpu

    return Evaluate()


def run_initial(spec: dict) -> dict:
    """Measure the untrained student (and record the teacher's own format and held-out loss)."""
    from transformers import AutoModelForCausalLM

    _, config, _, inputs = real.load_job(spec)
    measure = measure_for(spec, config, inputs.tokenizer)
    student = AutoModelForCausalLM.from_pretrained(spec["student"])
    result = measure(student)
    teacher_text = real.greedy_completions(
        measure.teacher, inputs.tokenizer, [p["prompt"] for p in measure.problems], config.response_length,
        config.per_device_eval_batch_size,
    )  # fmt: skip
    return {
        "arm": "initial",
        "points": [{**result, "step": 0}],
        "teacher": {
            "format": sum(real.ends_with_answer(c) for c in teacher_text["completions"]) / len(measure.problems),
            "heldout_loss": real.heldout_loss(
                measure.teacher,
                inputs.tokenizer,
                measure.texts,
                config.pretrain_max_length,
                config.per_device_eval_batch_size,
            ),  # fmt: skip
            "completion_ids": measure.teacher_completions,
            "completions": teacher_text["completions"],
        },
    }


def run_arm(spec: dict) -> dict:
    """Train one arm from the student, measuring it at the spec's points; returns the arm's result."""
    import copy

    import torch
    from trl import DistillationConfig, DistillationTrainer

    from trl_trapo import TRAPOTrainer

    _, config, _, inputs = real.load_job(spec)
    initial = runlib.read_json(spec["initial_cache"])
    measure = measure_for(spec, config, inputs.tokenizer, initial["teacher"]["completion_ids"])
    steps = int(config.max_steps)
    points = sorted({max(1, round(steps * (k + 1) / spec["points"])) for k in range(spec["points"])})
    rows: list = []
    clock: dict = {}
    callback = evaluation_callback(measure, points, rows, clock)
    if spec["name"] == "trapo":
        config = dataclasses.replace(config, model_init_kwargs=inputs.model_init_kwargs)
        trainer = TRAPOTrainer(
            model=inputs.model,
            reward_funcs=inputs.reward_funcs,
            args=config,
            train_dataset=inputs.train_dataset,
            pretrain_dataset=inputs.pretrain_dataset,
            sft_dataset=inputs.sft_dataset,
            processing_class=inputs.tokenizer,
            callbacks=[callback],
        )
    else:
        args = DistillationConfig(
            output_dir=os.path.join(spec["run_dir"], "distill"),
            report_to="none",
            save_strategy="no",
            eval_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            use_cpu=not torch.cuda.is_available(),
            max_completion_length=config.response_length,
            temperature=config.distillation_temperature,
            beta=config.distillation_beta,
            # TRL's configs checkpoint activations by default; the TRAPO arm's setting, so both do the same work
            gradient_checkpointing=config.activation_checkpointing,
            **{name: getattr(config, name) for name in SHARED_FIELDS},
        )
        trainer = DistillationTrainer(
            model=spec["student"],
            teacher_model=spec["teacher"],
            args=args,
            train_dataset=inputs.train_dataset.select_columns(["prompt"]),
            processing_class=copy.deepcopy(inputs.tokenizer),
            callbacks=[callback],
        )
    trainer.train()
    history = [{k: v for k, v in entry.items() if isinstance(v, (int, float))} for entry in trainer.state.log_history]
    return {
        "arm": spec["name"],
        "points": rows,
        "steps": trainer.state.global_step,
        "train_wall_s": clock.get("wall"),
        "train_cpu_s": clock.get("cpu"),
        "peak_rss_mb": runlib.peak_rss_mb(),
        "config": {k: getattr(config, k, None) for k in (*SHARED_FIELDS, *JOB)},
        "log_history": history,
    }


def worker(spec: dict) -> None:
    """Run one task in this process and write its cache file."""
    import torch

    torch.set_num_threads(spec["threads"])
    started = time.perf_counter()
    result = run_initial(spec) if spec["name"] == "initial" else run_arm(spec)
    result.update(
        fingerprint=spec["fingerprint"],
        job_argv=spec["display_argv"],
        threads=spec["threads"],
        wall_total_s=time.perf_counter() - started,
        loadavg_end=os.getloadavg(),
        finished=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    runlib.write_json_atomic(spec["cache"], result)


# =====================================================================================================================
# Orchestration and the report
# =====================================================================================================================
def make_parser() -> argparse.ArgumentParser:
    """The command line (unknown arguments go to the main job's parser)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default=str(real.RECIPE), help="the TRAPO recipe (YAML) the arms are built from")
    parser.add_argument("--results_dir", default=None, help=f"cache and results (default {RESULTS_DIR})")
    parser.add_argument("--work_dir", default="distill-real-output", help="data, student, trainer outputs and logs")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS, help="the arms to run")
    parser.add_argument(
        "--student_layers",
        type=runlib.positive_int,
        default=8,
        help="decoder layers of the teacher kept (at most the teacher's)",
    )
    parser.add_argument(
        "--eval_rows", type=runlib.int_range(2), default=None, help="GSM8K test problems measured, >= 2 (default 50)"
    )
    parser.add_argument(
        "--heldout_rows", type=runlib.positive_int, default=None, help="held-out paragraphs (default 50)"
    )
    parser.add_argument(
        "--points", type=runlib.positive_int, default=2, help="measurements during training (the last: the end)"
    )
    parser.add_argument("--jobs", type=runlib.positive_int, default=2, help="tasks at a time, each its own process")
    parser.add_argument(
        "--threads", type=runlib.positive_int, default=None, help="torch threads per task (default cores / jobs)"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny random teacher, a few steps: a smoke run")
    parser.add_argument("--write_docs", action="store_true", help="only render the docs block from results")
    parser.add_argument("--page", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def task_specs(args, passthrough: list[str], argv: list[str]) -> list[dict]:
    """The initial measurement and one spec per arm."""
    work = Path(args.work_dir).resolve()
    results = Path(args.results_dir).resolve()
    recipe_path = Path(args.recipe).resolve()
    recipe = real.read_recipe(recipe_path)
    teacher = str(real.make_tiny_model(work / "tiny-smollm2")) if args.quick else real.resolve_model(recipe)
    student = str(make_student(teacher, work / "student", 1 if args.quick else args.student_layers))
    data = real.prepare_data(work, train_rows=real.QUICK_TRAIN_ROWS if args.quick else None)
    job = {k: v for k, v in (QUICK_JOB if args.quick else JOB).items() if f"--{k}" not in passthrough}
    evals = {"eval_rows": args.eval_rows, "heldout_rows": args.heldout_rows, "points": args.points}
    relocated = {
        key: str(data / Path(recipe[key]).name)
        for key in ("dataset_name", "sft_dataset_name", "pretrain_dataset_name")
        if recipe.get(key)
    }
    specs = []
    for name in ("initial", *args.arms):
        run_dir = work / "runs" / name
        overrides = {"model_name_or_path": student, "teacher_model_name_or_path": teacher, **relocated, **job}
        overrides.update(output_dir=str(run_dir), overwrite_output_dir=True, report_to="none", save_strategy="no")
        overrides.update(logging_steps=1, disable_tqdm=True)
        defining = {"recipe": recipe, "passthrough": passthrough, "job": job, "eval": evals, "arm": name,
                    "layers": args.student_layers, "quick": args.quick}  # fmt: skip
        if name == "initial":  # the untrained student's measure depends on the models, lengths and sizes only
            defining["recipe"] = {k: recipe.get(k) for k in MEASURE_SETTINGS}
            defining["job"] = {k: v for k, v in job.items() if k in MEASURE_SETTINGS}
        specs.append(
            {
                "name": name,
                "job_argv": real.job_argv(recipe_path, overrides, passthrough),
                "display_argv": real.job_argv(Path(args.recipe), job, passthrough),
                "teacher": teacher,
                "student": student,
                "run_dir": str(run_dir),
                "cache": str(results / ("initial.json" if name == "initial" else f"arms/{name}.json")),
                "initial_cache": str(results / "initial.json"),
                "fingerprint": real.fingerprint(defining),
                "threads": args.threads,
                **evals,
            }
        )
    return specs


def run_tasks(specs: list[dict], jobs: int, log_dir: Path) -> list[str]:
    """Run the specs whose cache is missing or stale: the initial measurement first (the arms read the teacher's
    completions from it), then the arms `jobs` at a time. Returns the names of the tasks that ran."""

    def stale(spec):
        cached = runlib.read_json(spec["cache"])
        return cached is None or cached.get("fingerprint") != spec["fingerprint"]

    todo = [s for s in specs if stale(s)]
    for spec in todo:
        if spec["name"] == "initial":
            real.launch(spec, log_dir, Path(__file__).resolve())
    arms = [s for s in todo if s["name"] != "initial"]
    runlib.map_jobs(lambda s: real.launch(s, log_dir, Path(__file__).resolve()), arms, jobs)
    return [s["name"] for s in todo]


def summarize(initial: dict | None, arms: dict[str, dict], meta: dict) -> dict:
    """`results.json`: per arm its measured points (step 0 = the initial student), times and memory, the teacher's
    own figures, and the paired per-problem difference of the final reverse KL (TRAPO − TRL)."""
    drop = ("completions", "per_problem_reverse_kl")
    out: dict[str, Any] = {"meta": meta, "teacher": None, "arms": {}, "pending": [a for a in ARMS if a not in arms]}
    start = None
    if initial:
        start = {k: v for k, v in initial["points"][0].items() if k not in drop}
        out["teacher"] = {k: initial["teacher"][k] for k in ("format", "heldout_loss")}
        out["initial"] = start
    for name, arm in arms.items():
        points = [start] if start else []
        points += [{k: v for k, v in p.items() if k not in drop} for p in arm["points"]]
        step_cpu = [e.get("train_cpu_s") for e in arm["points"]]
        out["arms"][name] = {
            "points": points,
            "steps": arm["steps"],
            "train_wall_s": arm["train_wall_s"],
            "train_cpu_s": arm["train_cpu_s"],
            "peak_rss_mb": arm["peak_rss_mb"],
            "wall_total_s": arm["wall_total_s"],
            "config": arm["config"],
            "checkpoint_cpu_s": step_cpu,
            "final_completions": arm["points"][-1]["completions"][:3] if arm["points"] else [],
        }
    if all(a in arms and arms[a]["points"] for a in ARMS):
        a = arms["trapo"]["points"][-1]["per_problem_reverse_kl"]
        b = arms["distill_trl"]["points"][-1]["per_problem_reverse_kl"]
        pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
        if len(pairs) >= 2:
            interval = runlib.paired_interval([x - y for x, y in pairs], confidence=0.95, distribution="normal")
            out["paired_reverse_kl"] = {
                "n": interval["n"], "difference": interval["mean"], "low": interval["low"], "high": interval["high"],
                "method": "per-problem mean reverse KL on each arm's own greedy completion, TRAPO − TRL; "
                "normal approximation of the mean paired difference",
            }  # fmt: skip
    return out


def render_block(results: dict) -> str:
    """The docs block for this comparison, from `results.json`."""
    meta, teacher, initial = results["meta"], results.get("teacher"), results.get("initial")
    lines = [
        f"Measured by `{meta['command']}` ({file_link(meta['results_file'], BLOCK)}), finished "
        f"{meta['date']} on {meta['machine']}; {meta['versions']}, commit `{meta['git_commit']}`; the two arms ran "
        f"at the same time, {meta['threads']} torch thread(s) each, on a machine shared with other jobs.",
        "",
    ]
    if initial and teacher:
        lines += [
            f"Teacher ({meta['teacher']}): ends with `#### N` {teacher['format']:.2f}, general-text loss "
            f"{teacher['heldout_loss']:.2f} nats/token. Student before training (its first "
            f"{meta['student_layers']} layers): reverse KL to the teacher {initial['reverse_kl']:.2f} nats/token, "
            f"format {initial['format']:.2f}, general-text loss {initial['heldout_loss']:.2f}.",
            "",
        ]
    lines += [
        "| arm | step | reverse KL to teacher (nats/token) | forward KL | forward KL on teacher's text | ends with "
        "`#### N` | general-text loss (nats/token) | train wall / CPU (min) | peak RSS (GB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = {"trapo": "TRAPO (joint + teacher)", "distill_trl": "TRL `DistillationTrainer`"}
    for name, arm in results["arms"].items():
        for p in arm["points"][1:]:
            last = p is arm["points"][-1]
            clock = f"{real.minutes(p['train_wall_s'])} / {real.minutes(p['train_cpu_s'])}"
            lines.append(
                f"| {names[name]} | {p['step']} | {p['reverse_kl']:.3f} | {p['forward_kl']:.3f} | "
                f"{p['forward_kl_on_teacher_text']:.3f} | {p['format']:.2f} | {p['heldout_loss']:.3f} | {clock} | "
                + (f"{arm['peak_rss_mb'] / 1024:.1f} |" if last else "|")
            )
    paired = results.get("paired_reverse_kl")
    if paired:
        lines += [
            "",
            f"Final reverse KL, TRAPO − TRL per problem ({paired['n']} problems): {paired['difference']:+.3f} "
            f"nats/token (95 % CI {paired['low']:+.3f} to {paired['high']:+.3f}).",
        ]
    if results["pending"]:
        lines += [
            "",
            f"Not measured yet: {', '.join(results['pending'])} (rerun the command; finished arms are cached).",
        ]
    return "\n".join(lines) + "\n"


def write_results(args, argv: list[str], ran: list[str]) -> dict:
    """Rebuild `results.json` from the cache."""
    results_dir = Path(args.results_dir)
    initial = runlib.read_json(results_dir / "initial.json")
    arms = {n: runlib.read_json(results_dir / "arms" / f"{n}.json") for n in ARMS}
    arms = {n: a for n, a in arms.items() if a is not None}
    previous = runlib.read_json(results_dir / "results.json") or {}
    try:
        results_file = str((results_dir / "results.json").resolve().relative_to(ROOT))
    except ValueError:
        results_file = str(results_dir / "results.json")
    finished = [a["finished"] for a in arms.values()] + ([initial["finished"]] if initial else [])
    meta = {
        "command": " ".join(["python scripts/experiments/distill_real.py", *real.reproducing_argv(argv)]),
        "results_file": results_file,
        "date": max(finished + [""])[:10],
        "machine": runlib.machine_line(),
        "versions": runlib.versions_line(),
        "git_commit": runlib.git("rev-parse", "--short", "HEAD"),
        "threads": args.threads,
        "teacher": "a tiny random model (--quick)" if args.quick else "SmolLM2-135M-Instruct",
        "student_layers": 1 if args.quick else args.student_layers,
        "tasks_run_now": ran,
    }
    if not ran and previous.get("meta"):
        meta = previous["meta"]
    summary = summarize(initial, arms, meta)
    runlib.write_json_atomic(results_dir / "results.json", summary)
    return summary


def main(argv: list[str] | None = None) -> dict:
    """Run (or resume) the comparison or the quick smoke run; returns the summary written."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    args, passthrough = parser.parse_known_args(argv)
    if args._worker:
        worker(runlib.read_json(args._worker))
        return {}
    # the main job's options, before a model is fetched or a run starts (its values: the runs' own parse)
    runlib.check_job_arguments(parser, passthrough, [runlib.main_job()])
    for key, value in (QUICK_EVAL if args.quick else {"eval_rows": 50, "heldout_rows": 50}).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.results_dir is None:
        args.results_dir = str(Path(args.work_dir) / "quick-results") if args.quick else str(RESULTS_DIR)
    if args.threads is None:
        args.threads = max((os.cpu_count() or 1) // max(args.jobs, 1), 1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.write_docs:
        return write_block_from_results(BLOCK, render_block, Path(args.results_dir) / "results.json", args.page)
    runlib.go_offline()
    with contextlib.redirect_stdout(sys.stderr):
        specs = task_specs(args, passthrough, argv)
    ran = run_tasks(specs, args.jobs, Path(args.work_dir) / "logs")
    summary = write_results(args, argv, ran)
    print(render_block(summary))
    return summary


if __name__ == "__main__":
    main()
