# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""TRAPOTrainer against TRL's own trainers on one objective at a time: step time, rollout throughput, peak memory.

    python scripts/benchmarks/benchmark_trainers.py         # 7.5M-parameter Llama, 4 runs (1 CPU thread each, 3-4 min)
    python scripts/benchmarks/benchmark_trainers.py --quick # tiny smoke run (~30 s; measures framework overhead only)
    python scripts/benchmarks/benchmark_trainers.py --steps 20 --batch_size 32 --seq_len 256 --output_json bench.json
    python scripts/benchmarks/benchmark_trainers.py --device cuda --threads 4 \
        --hidden_size 1024 --num_layers 12 --num_heads 16

Three comparisons and one joint run, seven runs, each in its own child process (so its peak memory is its own), one
after the other (`--comparisons` picks some):

1. **RL only**: `TRAPOTrainer(train_dataset=RL prompts)` (no pretraining or SFT data, no value model, so advantages
   are group-relative) against `trl.GRPOTrainer`. The GRPOConfig is derived from the TRAPOConfig by
   `compare_pipelines.stage_configs` (the mapping the pipeline comparison uses): `num_generations` equal, GRPO
   `max_completion_length` = TRAPO `response_length` = `--seq_len`, GRPO `beta` = TRAPO `kl_coef`, GRPO
   `num_iterations` = TRAPO `num_ppo_epochs` = 1, `epsilon` = `cliprange`, `loss_type`, `scale_rewards`, the sampling
   settings, and every shared `TrainingArguments` field (batch size, learning rate and schedule, AdamW, clipping,
   gradient checkpointing, seed, precision). Each optimizer step generates `--batch_size` completions
   (`--batch_size / --num_generations` prompts) and trains on them once. Both trainers generate with
   `min_new_tokens = --seq_len`, so every completion is exactly `--seq_len` tokens and both do the same work per step
   (with `--natural_lengths` completions stop at EOS instead; then each trainer's sampled lengths, and so its work,
   differ: the policies drift apart as they train, and the length reward shortens completions).
2. **SFT only**: `TRAPOTrainer(sft_dataset=...)` against `trl.SFTTrainer` (`completion_only_loss=True`,
   `max_length` = TRAPO `sft_max_length` = `--seq_len`, `packing=False`, same batch and optimizer).
3. **On-policy distillation only**: `TRAPOTrainer(teacher_model=..., distillation_dataset=prompts)` (no other data:
   only the `distill` objective) against `trl.DistillationTrainer` on the same student, teacher (a second model of the
   same architecture, initialised with `--seed + 1`), prompts, batch (`--batch_size` prompts, one completion each),
   completion length (`--seq_len` tokens, fixed as for RL), divergence (`beta` = TRAPO `distillation_beta` = 1.0,
   reverse KL; temperature 1.0 for sampling and the divergence) and optimizer; both run the teacher's forward in the
   training step and compute the full-vocabulary divergence chunked.
4. **Joint** (`distill_joint`, TRAPO only, for the teacher's share): pretraining + SFT + RL + distillation from the RL
   rollouts, a quarter of the rows each (`curriculum_mixtures`), same model, teacher and batch. Reported: the teacher's forward time as a share of the step time
   (generation excluded), for this run and for the two distillation-only runs.

The same for both sides of a comparison: the initial weights (a Llama built in-process from a config by
`trl_trapo.tasks.build_tiny_model` with `--seed`, saved once to a temporary directory that every run loads from its
path; nothing is downloaded), the character tokenizer (`build_char_tokenizer`, 101 tokens), the data and the reward
functions. RL prompts are the built-in task suite's (`make_task_suite(...).rl_train`, at most 9 tokens each), scored
with the suite's rewards (`exact_match_reward`, `length_reward`). SFT rows are prompt-completion pairs cut from the
suite's pretraining corpus, exactly `--seq_len` tokens each with the EOS the trainers append (a quarter prompt, three
quarters completion). Every child imports the same modules (TRL's trainers and TRAPO) and builds its data before its
trainer, so all runs start from the same memory.

Measured, per run, over the `--steps` optimizer steps that follow `--warmup` warm-up steps (excluded):

- **step time** (seconds, median over the measured steps). The timed region of one optimizer step is the interval
  between the Trainer's consecutive `on_step_end` callbacks (the first one starts at `on_train_begin`), which holds
  everything the trainer does for that step: drawing and collating the batch; for RL the rollout (generation, reward
  scoring, reference log-probs, advantages); the forward, backward, gradient clipping, optimizer and scheduler step;
  and logging when it is due. From it is subtracted **the time spent inside `generate` of the unwrapped policy**
  (`trainer.accelerator.unwrap_model(trainer.model).generate`, wrapped by [`GenerationMeter`]) in that interval.
  So the RL step time excludes token generation but keeps everything around it. TRAPO records its behaviour
  log-probs inside `generate` (a log-softmax per decoding step), so they count as its generation time. Both clocks
  are recorded: wall time (`time.perf_counter`; on CUDA the device is synchronised before each reading) and the
  process's CPU time (`time.process_time`, all threads). The headline uses `--clock`: CPU time on CPU (a machine
  shared with other jobs inflates wall time by however much the scheduler takes away, differently for each run),
  wall time on CUDA.
- **rollout throughput** (RL, completion tokens per second of generation time): the tokens of the sampled completions
  (per row up to and including the first EOS, or all generated tokens when there is none) summed over the measured
  steps, divided by the time inside `generate` over the same steps, on the same clock. `generated_positions` (rows x
  decoding steps, padding after EOS included) is recorded alongside.
- **peak memory** (MiB). On CPU, the peak resident set size of the run's process (`ru_maxrss`, read in the child
  after training with `compare_pipelines.peak_rss_mb`); `peak_rss_increase_mib` is its rise over the value just
  before the trainer was built (what the trainer and its training add to the imports and data all runs share). On
  CUDA, `torch.cuda.max_memory_allocated()` since just before the trainer was built.

Ratios are TRAPO / TRL. The targets for step time and memory are <= 1.1 (lower is better); the rollout-throughput
ratio is higher-is-better and has no target. Each run uses `--threads` torch threads (default 1: with several threads
on a busy machine, a thread that is descheduled stalls the others at every barrier, which makes step times vary
several-fold). The load average before and after each run is in its record. `--profile DIR` writes a cProfile of each
run's training loop (`<run>.prof`, and `<run>.txt` with the top functions by cumulative and by own time) for finding
where a ratio above 1.1 comes from; the profiler slows Python-heavy code, so profile and measure in separate runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "scripts", "experiments"))  # the serial pipeline's stage configurations

from compare_pipelines import stage_configs  # noqa: E402
from runlib import (  # noqa: E402
    go_offline,
    int_range,
    launch_worker,
    non_negative_float,
    peak_rss_mb,
    positive_int,
    read_json,
    seed_int,
    write_json_atomic,
)


RUNS = (
    ("rl", "trl"),
    ("rl", "trapo"),
    ("sft", "trl"),
    ("sft", "trapo"),
    ("distill", "trl"),
    ("distill", "trapo"),
    ("distill", "joint"),
)
"""(objective, trainer) of each run, in the order they are launched (`distill_joint`: TRAPO with all four objectives)."""

TRL_TRAINER = {"rl": "GRPOTrainer", "sft": "SFTTrainer", "distill": "DistillationTrainer"}

RATIOS = {
    # key: (objective, record field, target, lower is better)
    "rl_step_time": ("rl", "step_time_s", 1.1, True),
    "rl_rollout_throughput": ("rl", "rollout_tokens_per_s", None, False),
    "rl_peak_memory": ("rl", "peak_memory_mib", 1.1, True),
    "sft_step_time": ("sft", "step_time_s", 1.1, True),
    "sft_peak_memory": ("sft", "peak_memory_mib", 1.1, True),
    "distill_step_time": ("distill", "step_time_s", 1.1, True),
    "distill_peak_memory": ("distill", "peak_memory_mib", 1.1, True),
}
"""The headline ratios (TRAPO / TRL), with the record field each divides and its target. `step_time_s` and
`rollout_tokens_per_s` are measured on the `--clock` clock."""

DETAILS = {
    "rl_step_time_cpu": ("rl", "step_time_cpu_s"),
    "rl_step_time_wall": ("rl", "step_time_wall_s"),
    "rl_rollout_throughput_cpu": ("rl", "rollout_tokens_per_cpu_s"),
    "rl_rollout_throughput_wall": ("rl", "rollout_tokens_per_wall_s"),
    "rl_peak_rss_increase": ("rl", "peak_rss_increase_mib"),
    "sft_step_time_cpu": ("sft", "step_time_cpu_s"),
    "sft_step_time_wall": ("sft", "step_time_wall_s"),
    "sft_peak_rss_increase": ("sft", "peak_rss_increase_mib"),
    "distill_step_time_cpu": ("distill", "step_time_cpu_s"),
    "distill_step_time_wall": ("distill", "step_time_wall_s"),
    "distill_peak_rss_increase": ("distill", "peak_rss_increase_mib"),
    "distill_teacher_share": ("distill", "teacher_share"),
}
"""Further ratios (TRAPO / TRL) reported for information: both clocks, and the memory the trainers add."""

LABELS = {
    "rl_step_time": "RL: step time excl. generation ({clock} s, median)",
    "rl_rollout_throughput": "RL: rollout throughput (completion tokens / {clock} s of generation)",
    "rl_peak_memory": "RL: {memory}",
    "sft_step_time": "SFT: step time ({clock} s, median)",
    "sft_peak_memory": "SFT: {memory}",
    "rl_step_time_cpu": "RL: step time excl. generation (CPU s, median)",
    "rl_step_time_wall": "RL: step time excl. generation (wall s, median)",
    "rl_rollout_throughput_cpu": "RL: rollout throughput (tokens / CPU s)",
    "rl_rollout_throughput_wall": "RL: rollout throughput (tokens / wall s)",
    "rl_peak_rss_increase": "RL: peak RSS increase over the pre-trainer RSS (MiB)",
    "sft_step_time_cpu": "SFT: step time (CPU s, median)",
    "sft_step_time_wall": "SFT: step time (wall s, median)",
    "sft_peak_rss_increase": "SFT: peak RSS increase over the pre-trainer RSS (MiB)",
    "distill_step_time": "Distillation: step time excl. generation ({clock} s, median)",
    "distill_peak_memory": "Distillation: {memory}",
    "distill_step_time_cpu": "Distillation: step time excl. generation (CPU s, median)",
    "distill_step_time_wall": "Distillation: step time excl. generation (wall s, median)",
    "distill_peak_rss_increase": "Distillation: peak RSS increase over the pre-trainer RSS (MiB)",
    "distill_teacher_share": "Distillation: teacher forward / step time excl. generation (CPU)",
}

DEFAULTS = {
    "hidden_size": 320,
    "intermediate_size": 864,
    "num_layers": 6,
    "num_heads": 5,
    "batch_size": 16,
    "num_generations": 4,
    "seq_len": 128,
    "steps": 8,
    "warmup": 2,
}
"""Defaults of the full run (about 7.5M parameters; every row up to 128 tokens; 16 rows per optimizer step)."""

QUICK_DEFAULTS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "batch_size": 4,
    "num_generations": 2,
    "seq_len": 16,
    "steps": 2,
    "warmup": 1,
}
"""Defaults of `--quick`: a smoke run (the numbers measure framework overhead only)."""


# =====================================================================================================================
# Model and data (built the same way in every run)
# =====================================================================================================================
def model_config(args: argparse.Namespace) -> dict[str, Any]:
    """The Llama config (a `build_tiny_model` JSON: sizes in units, positions in tokens) of the benchmarked model."""
    return {
        "model_type": "llama",
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads,
        "num_key_value_heads": args.num_heads,
        "max_position_embeddings": args.seq_len + 64,  # RL prompts are <= 9 tokens, SFT rows exactly seq_len
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "attention_dropout": 0.0,
        "use_cache": True,
    }


def save_model(args: argparse.Namespace, directory: str, seed: int | None = None) -> int:
    """Build the model in-process (`build_tiny_model`, seed `args.seed` unless `seed`) and save it with its tokenizer.

    Returns:
        `int`: the number of parameters (units).
    """
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model

    os.makedirs(directory, exist_ok=True)
    config_path = os.path.join(directory, "build_config.json")
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump(model_config(args), handle)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, config_path=config_path, seed=args.seed if seed is None else seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def rl_dataset(spec: dict):
    """The RL prompts (`prompt`, `answer`, `task`): the task suite's `rl_train`, 4x the prompts the run consumes."""
    from trl_trapo.tasks import make_task_suite

    suite = make_task_suite(seed=spec["seed"], num_pretrain_docs=0, num_sft_per_task=0)
    prompts_needed = spec["total_steps"] * spec["batch_size"] // spec["num_generations"]
    rows = min(len(suite.rl_train), max(4 * prompts_needed, 64))
    return suite.rl_train.select(range(rows)), list(suite.reward_funcs)


def sft_dataset(spec: dict):
    """Prompt-completion rows of exactly `seq_len - 1` characters (= tokens: the tokenizer is character-level; the
    trainers append EOS), cut from the task suite's pretraining corpus: 4x the rows the run consumes."""
    from datasets import Dataset

    from trl_trapo.tasks import make_task_suite

    chars = spec["seq_len"] - 1
    rows = max(4 * spec["total_steps"] * spec["batch_size"], 64)
    docs = max(rows * chars // 40, 100)  # documents average ~80 characters
    suite = make_task_suite(seed=spec["seed"], num_pretrain_docs=docs, num_sft_per_task=0, num_rl_per_task=0)
    stream = "\n".join(suite.pretrain["text"])
    while len(stream) < rows * chars:
        stream = stream + "\n" + stream
    cut = max(chars // 4, 1)
    pieces = [stream[i * chars : (i + 1) * chars] for i in range(rows)]
    return Dataset.from_dict({"prompt": [p[:cut] for p in pieces], "completion": [p[cut:] for p in pieces]})


def distillation_prompts(spec: dict):
    """Reward-free prompts (`prompt` only) for the distillation runs: the RL prompts without their answers; and, for
    the joint run, the RL prompts with rewards and the SFT rows as well."""
    from datasets import Dataset

    dataset, reward_funcs = rl_dataset({**spec, "num_generations": 1})
    return Dataset.from_dict({"prompt": dataset["prompt"]}), dataset, reward_funcs


def trapo_config(spec: dict, output_dir: str):
    """The TRAPOConfig of a run (RL-only or SFT-only); the TRL config of the same comparison is derived from it."""
    from trl_trapo import TRAPOConfig

    common = dict(
        output_dir=output_dir,
        max_steps=spec["total_steps"],
        per_device_train_batch_size=spec["batch_size"],
        gradient_accumulation_steps=1,
        logging_steps=spec["logging_steps"],
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        seed=spec["seed"],
        use_cpu=spec["device"] == "cpu",
        dataloader_num_workers=0,
    )
    # the sampling and RL settings of the RL run, which the distillation runs share
    rollouts = dict(
        num_generations=spec["num_generations"],
        response_length=spec["seq_len"],
        max_prompt_length=32,
        kl_coef=spec["kl_coef"],
        num_ppo_epochs=1,
        num_mini_batches=1,
        temperature=1.0,
        # fixed lengths: TRAPO never stops early with stop_token=None (no logits processor changes what it
        # samples); GRPOTrainer gets min_new_tokens (see fixed_length_kwargs)
        stop_token="eos" if spec["natural_lengths"] else None,
    )
    if spec["objective"] == "rl":
        return TRAPOConfig(**common, **rollouts)
    if spec["objective"] == "distill":
        return TRAPOConfig(
            **common,
            **rollouts,
            sft_max_length=spec["seq_len"],
            pretrain_max_length=spec["seq_len"],
            distillation_beta=1.0,
            distillation_temperature=1.0,
            # the joint run: a quarter of the rows for each objective, in every step
            **(
                {"curriculum_mixtures": [dict.fromkeys(("pretrain", "sft", "rl", "distill"), 0.25)] * 3}
                if spec["trainer"] == "joint"
                else {}
            ),
        )
    return TRAPOConfig(**common, sft_max_length=spec["seq_len"])


def distillation_config(spec: dict, config, workdir: str):
    """TRL's `DistillationConfig` with the TRAPOConfig's batch, lengths, sampling, divergence and optimizer (and the
    gradient checkpointing `stage_configs` derives for the other TRL trainers)."""
    from trl import DistillationConfig

    reference = trl_config({**spec, "objective": "rl"}, config, workdir)
    shared = (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "learning_rate",
        "lr_scheduler_type",
        "warmup_steps",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "max_grad_norm",
        "max_steps",
        "seed",
        "bf16",
        "fp16",
        "gradient_checkpointing",
        "logging_steps",
        "use_cpu",
    )
    return DistillationConfig(
        output_dir=os.path.join(workdir, "trl"),
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        max_completion_length=spec["seq_len"],
        temperature=config.distillation_temperature,
        beta=config.distillation_beta,
        generation_kwargs=fixed_length_kwargs(spec),
        **{name: getattr(reference, name) for name in shared},
    )


def fixed_length_kwargs(spec: dict) -> dict | None:
    """Generation kwargs of GRPOTrainer: `min_new_tokens = seq_len` (tokens), so that every completion is exactly
    `seq_len` tokens long (TRAPO runs with `stop_token=None` to the same effect) and both trainers do the same work
    per step; None with `--natural_lengths`."""
    return None if spec["natural_lengths"] else {"min_new_tokens": spec["seq_len"]}


def trl_config(spec: dict, config, workdir: str):
    """The GRPOConfig (RL) or SFTConfig (SFT) that `compare_pipelines.stage_configs` derives from `config`, plus the
    RL generation kwargs (`stage_configs` does not copy them)."""
    from types import SimpleNamespace

    steps = [0, 0, 0]
    steps[2 if spec["objective"] == "rl" else 1] = spec["total_steps"]
    configs = stage_configs(SimpleNamespace(config=config), steps, {"budget": "steps"}, workdir)
    if spec["objective"] == "sft":
        return configs[1]
    configs[2].generation_kwargs = fixed_length_kwargs(spec)
    return configs[2]


# =====================================================================================================================
# Measuring one run (child process)
# =====================================================================================================================
class GenerationMeter:
    """Measures `generate` of one model: wall and CPU seconds inside it and the tokens it produced.

    `instrument(model)` replaces `model.generate` (an instance attribute, so the trainer's own calls on the unwrapped
    policy go through it) with a wrapper that adds, per call: the wall seconds (`time.perf_counter`; on CUDA the device
    is synchronised before the clock stops) to `wall_s`, the CPU seconds of the process (`time.process_time`, all
    threads) to `cpu_s`, the completion tokens — per row up to and including the first EOS, else every generated
    token — to `tokens`, rows x decoding steps (padding after EOS included) to `positions`, and 1 to `calls`.
    (`pipeline_measure.Recorder.instrument_generate` times wall seconds only; this benchmark also needs CPU time
    and token counts.)

    Args:
        eos_token_id (`int`, *optional*): the token that ends a completion; None: completions never stop early, every
            generated position is a token.
        synchronize (`Callable[[], None]`): waits for the device (`torch.cuda.synchronize`, or a no-op on CPU).
    """

    def __init__(self, eos_token_id: int | None, synchronize):
        self.eos_token_id = eos_token_id
        self.synchronize = synchronize
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.tokens = 0
        self.positions = 0
        self.calls = 0

    def snapshot(self) -> tuple[float, float, int, int, int]:
        """`(wall_s, cpu_s, tokens, positions, calls)` so far (seconds, seconds, tokens, tokens, calls)."""
        return (self.wall_s, self.cpu_s, self.tokens, self.positions, self.calls)

    def instrument(self, model) -> None:
        """Wrap `model.generate` (see the class docstring)."""
        import torch

        original = model.generate

        def measured_generate(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                output = original(*args, **kwargs)
                input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
                sequences = output.sequences if hasattr(output, "sequences") else output
                completion = sequences[:, input_ids.shape[1] :]
                if self.eos_token_id is None:
                    self.tokens += completion.numel()
                else:
                    is_eos = completion == self.eos_token_id
                    lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, completion.shape[1])
                    self.tokens += int(lengths.sum())
                self.positions += completion.numel()
                self.calls += 1
                return output
            finally:
                self.synchronize()
                self.wall_s += time.perf_counter() - wall
                self.cpu_s += time.process_time() - cpu

        model.generate = measured_generate


class ModuleClock:
    """CPU seconds inside the teacher's decoder body (its forward to the final hidden states), one total per optimizer
    step.

    `instrument(model)` hooks the forward of `model.get_decoder()`: both trainers run the teacher through it in the
    training step, and both then form the teacher's logits inside their chunked divergence (TRL from the output
    layer's weight inside its kernel, TRAPO through the output layer a chunk at a time), which is loss time, not
    counted here. `mark_step()` closes the current step's total into `cpu_s`.
    """

    def __init__(self, synchronize):
        self.synchronize = synchronize
        self.current = 0.0
        self.cpu_s: list[float] = []
        self.started: list[float] = []

    def instrument(self, model) -> None:
        decoder = model.get_decoder()
        decoder.register_forward_pre_hook(lambda *_: self.started.append(time.process_time()))
        decoder.register_forward_hook(self._stop)

    def _stop(self, *_):
        start = self.started.pop()
        self.synchronize()
        self.current += time.process_time() - start

    def mark_step(self) -> None:
        self.cpu_s.append(self.current)
        self.current = 0.0


def make_step_timer(meter: GenerationMeter, synchronize, clock: ModuleClock | None = None):
    """A `TrainerCallback` recording, per optimizer step (the interval between consecutive `on_step_end` calls, the
    first one starting at `on_train_begin`): `wall_s` / `cpu_s` (seconds of wall clock / process CPU time), the part
    of each inside `generate` (`generation_wall_s`, `generation_cpu_s`), their differences (`step_wall_s`,
    `step_cpu_s`), and the `tokens`, `positions` and `generate_calls` of that step's generation (see
    [`GenerationMeter`])."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps: list[dict[str, float]] = []
            self.last = (0.0, 0.0)
            self.mark = meter.snapshot()

        def _clocks(self) -> tuple[float, float]:
            synchronize()
            return time.perf_counter(), time.process_time()

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = self._clocks()
            self.mark = meter.snapshot()

        def on_step_end(self, args, state, control, **kwargs):
            now = self._clocks()
            snapshot = meter.snapshot()
            wall, cpu = now[0] - self.last[0], now[1] - self.last[1]
            generation_wall, generation_cpu = snapshot[0] - self.mark[0], snapshot[1] - self.mark[1]
            self.steps.append(
                {
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "generation_wall_s": generation_wall,
                    "generation_cpu_s": generation_cpu,
                    "step_wall_s": wall - generation_wall,
                    "step_cpu_s": cpu - generation_cpu,
                    "tokens": snapshot[2] - self.mark[2],
                    "positions": snapshot[3] - self.mark[3],
                    "generate_calls": snapshot[4] - self.mark[4],
                }
            )
            self.last, self.mark = now, snapshot
            if clock is not None:
                clock.mark_step()

    return StepTimer()


def build_trainer(spec: dict, tokenizer, callbacks: list):
    """The run's trainer (`TRAPOTrainer`, `GRPOTrainer` or `SFTTrainer`), loading the saved model from its path."""
    from trl import GRPOTrainer, SFTTrainer

    from trl_trapo import TRAPOTrainer

    workdir = spec["workdir"]
    config = trapo_config(spec, os.path.join(workdir, "trapo"))
    if spec["objective"] == "distill":
        from trl import DistillationTrainer

        prompts, rl_prompts, reward_funcs = spec["_data"]
        if spec["trainer"] == "trl":
            return DistillationTrainer(
                model=spec["model_dir"],
                teacher_model=spec["teacher_dir"],
                args=distillation_config(spec, config, workdir),
                train_dataset=prompts,
                processing_class=tokenizer,
                callbacks=callbacks,
            )
        if spec["trainer"] == "trapo":
            return TRAPOTrainer(
                spec["model_dir"],
                args=config,
                processing_class=tokenizer,
                teacher_model=spec["teacher_dir"],
                distillation_dataset=prompts,
                callbacks=callbacks,
            )
        sft = sft_dataset(spec)  # the joint run: every objective, distillation on the RL rollouts
        pretrain = sft.map(lambda row: {"text": row["prompt"] + row["completion"]}, remove_columns=sft.column_names)
        return TRAPOTrainer(
            spec["model_dir"],
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=rl_prompts,
            sft_dataset=sft,
            pretrain_dataset=pretrain,
            processing_class=tokenizer,
            teacher_model=spec["teacher_dir"],
            callbacks=callbacks,
        )
    if spec["objective"] == "rl":
        dataset, reward_funcs = spec["_data"]
        if spec["trainer"] == "trapo":
            return TRAPOTrainer(
                spec["model_dir"],
                reward_funcs=reward_funcs,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=callbacks,
            )
        return GRPOTrainer(
            model=spec["model_dir"],
            reward_funcs=reward_funcs,
            args=trl_config(spec, config, workdir),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    dataset = spec["_data"]
    if spec["trainer"] == "trapo":
        return TRAPOTrainer(
            spec["model_dir"], args=config, sft_dataset=dataset, processing_class=tokenizer, callbacks=callbacks
        )
    return SFTTrainer(
        model=spec["model_dir"],
        args=trl_config(spec, config, workdir),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def worker(spec_path: str) -> None:
    """Run one (objective, trainer) in this process and write its record (JSON) to `spec["result_path"]`."""
    import logging

    import torch

    # every run imports the same modules, whichever trainer it uses, so they start from the same memory
    import trl  # noqa: F401
    from trl import GRPOTrainer, SFTTrainer  # noqa: F401

    import trl_trapo  # noqa: F401
    from trl_trapo.tasks import build_char_tokenizer

    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(spec["threads"])
    cuda = spec["device"] == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    load_start = os.getloadavg()
    tokenizer = build_char_tokenizer()
    data = {"rl": rl_dataset, "sft": sft_dataset, "distill": distillation_prompts}[spec["objective"]]
    spec["_data"] = data(spec)

    rss_before = peak_rss_mb()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    # TRAPO's fixed-length runs never stop early (stop_token=None): every position counts
    never_stops = spec["trainer"] != "trl" and spec["objective"] != "sft" and not spec["natural_lengths"]
    meter = GenerationMeter(None if never_stops else tokenizer.eos_token_id, synchronize)
    teacher_clock = ModuleClock(synchronize) if spec["objective"] == "distill" else None
    timer = make_step_timer(meter, synchronize, teacher_clock)
    started = time.perf_counter()
    trainer = build_trainer(spec, tokenizer, [timer])
    build_s = time.perf_counter() - started
    policy = trainer.accelerator.unwrap_model(trainer.model)
    meter.instrument(policy)
    if teacher_clock is not None:
        teacher_clock.instrument(trainer.accelerator.unwrap_model(trainer.teacher_model))

    profiler = None
    if spec["profile_dir"]:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    started = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - started
    if profiler is not None:
        profiler.disable()
        write_profile(profiler, spec["profile_dir"], spec["name"])

    measured = timer.steps[spec["warmup"] :]
    if len(measured) != spec["steps"]:
        raise RuntimeError(f"{spec['name']}: expected {spec['steps']} measured steps, got {len(measured)}.")
    peak_rss = peak_rss_mb()
    clock = spec["clock"]
    record = {
        "name": spec["name"],
        "objective": spec["objective"],
        "trainer": TRL_TRAINER[spec["objective"]] if spec["trainer"] == "trl" else "TRAPOTrainer",
        "clock": clock,
        "step_time_wall_s": statistics.median(s["step_wall_s"] for s in measured),
        "step_time_cpu_s": statistics.median(s["step_cpu_s"] for s in measured),
        "peak_rss_mib": peak_rss,
        "rss_before_trainer_mib": rss_before,
        "peak_rss_increase_mib": peak_rss - rss_before,
        "peak_memory_mib": peak_rss,
        "build_s": build_s,
        "train_s": train_s,
        "gradient_checkpointing": bool(getattr(policy, "is_gradient_checkpointing", False)),
        "steps": timer.steps,
        "warmup": spec["warmup"],
        "threads": spec["threads"],
        "device": spec["device"],
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    record["step_time_s"] = record[f"step_time_{clock}_s"]
    if cuda:
        record["cuda_max_memory_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        record["peak_memory_mib"] = record["cuda_max_memory_allocated_mib"]
    if teacher_clock is not None:  # the teacher's forward time over the measured steps' time (generation excluded)
        teacher_cpu = sum(teacher_clock.cpu_s[spec["warmup"] :])
        record["teacher_cpu_s"] = teacher_cpu
        record["teacher_share"] = teacher_cpu / max(sum(s["step_cpu_s"] for s in measured), 1e-12)
    if spec["objective"] in ("rl", "distill"):
        tokens = sum(s["tokens"] for s in measured)
        for name in ("wall", "cpu"):
            seconds = sum(s[f"generation_{name}_s"] for s in measured)
            record[f"generation_{name}_s"] = seconds
            record[f"rollout_tokens_per_{name}_s"] = tokens / seconds if seconds > 0 else math.nan
        record.update(
            completion_tokens=tokens,
            generated_positions=sum(s["positions"] for s in measured),
            generate_calls=sum(s["generate_calls"] for s in measured),
            rollout_tokens_per_s=record[f"rollout_tokens_per_{clock}_s"],
        )
    write_json_atomic(spec["result_path"], record)


def write_profile(profiler, directory: str, name: str) -> None:
    """Save `profiler`'s stats to `<directory>/<name>.prof` and the top 40 functions by cumulative and by own time
    (seconds) to `<directory>/<name>.txt`."""
    import io
    import pstats

    os.makedirs(directory, exist_ok=True)
    profiler.dump_stats(os.path.join(directory, f"{name}.prof"))
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(40)
    with open(os.path.join(directory, f"{name}.txt"), "w", encoding="utf-8") as handle:
        handle.write(text.getvalue())


# =====================================================================================================================
# Orchestration (parent process)
# =====================================================================================================================
def launch(spec: dict) -> dict:
    """Run one spec in a child process (this file with `--_worker`) and return its record; on failure raise
    `runlib.ChildFailed` with the tail of the child's log."""
    launch_worker(
        __file__,
        spec,
        os.path.join(spec["workdir"], "spec.json"),
        threads=spec["threads"],
        extra_env={"PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore")},
        log_path=os.path.join(spec["workdir"], "log.txt"),
        name=f"Run {spec['name']}",
        tail_chars=4000,
    )
    return read_json(spec["result_path"])


def compute_ratios(records: dict[str, dict]) -> dict[str, float]:
    """TRAPO / TRL (dimensionless) for every entry of `RATIOS` and `DETAILS` whose comparison ran, from the records
    named `<objective>_<trainer>`."""
    ratios = {}
    for key, (objective, field_name, *_) in {**RATIOS, **DETAILS}.items():
        if f"{objective}_trapo" not in records:
            continue
        trapo, trl = records[f"{objective}_trapo"][field_name], records[f"{objective}_trl"][field_name]
        ratios[key] = trapo / trl if trl else math.nan
    return ratios


def format_table(records: dict[str, dict], ratios: dict[str, float]) -> str:
    """A Markdown table: each measured quantity for TRAPO and TRL (absolute, with units), the ratio and its target
    (headline rows first, then the rows for information)."""
    first = next(iter(records.values()))
    clock = first["clock"]
    memory = "peak CUDA memory (MiB)" if first["device"] == "cuda" else "peak RSS (MiB)"
    lines = ["| quantity | TRAPO | TRL | TRAPO / TRL | target |", "|---|---:|---:|---:|---|"]
    for key, (objective, field_name, *rest) in {**RATIOS, **DETAILS}.items():
        if key not in ratios:
            continue
        if not rest and field_name.endswith(f"_{clock}_s"):
            continue  # the headline row already shows it
        trapo, trl = records[f"{objective}_trapo"][field_name], records[f"{objective}_trl"][field_name]
        if not rest:
            verdict = "info"
        elif rest[0] is None:
            verdict = "higher is better"
        else:
            target, lower = rest
            ok = ratios[key] <= target if lower else ratios[key] >= target
            verdict = f"{'<=' if lower else '>='} {target}: {'met' if ok else 'NOT met'}"
        label = LABELS[key].format(clock="CPU" if clock == "cpu" else "wall", memory=memory)
        lines.append(f"| {label} | {trapo:.4g} | {trl:.4g} | {ratios[key]:.3f} | {verdict} |")
    if "distill_joint" in records:
        joint = records["distill_joint"]
        lines.append(
            f"| Joint TRAPO step (all four objectives): teacher forward / step time excl. generation (CPU) | "
            f"{joint['teacher_share']:.4g} | – | – | info |"
        )
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    """The command line (sizes in units, lengths in tokens)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and batch, 1 + 2 steps: a smoke run")
    for name, kind, help_text in (
        ("hidden_size", positive_int, "model hidden size"),
        ("intermediate_size", positive_int, "MLP size"),
        ("num_layers", positive_int, "decoder layers"),
        ("num_heads", positive_int, "attention heads (= key/value heads; must divide --hidden_size)"),
        ("batch_size", positive_int, "rows (completions for RL) per optimizer step"),
        ("num_generations", int_range(2), "RL completions per prompt, >= 2 (must divide --batch_size)"),
        ("seq_len", int_range(8), "RL: completion length (response_length = max_completion_length); SFT: tokens per "
         "row; >= 8"),
        ("steps", positive_int, "measured optimizer steps per run"),
        ("warmup", positive_int, "warm-up optimizer steps per run, excluded from the medians"),
    ):  # fmt: skip
        parser.add_argument(f"--{name}", type=kind, default=None, help=f"{help_text} (default {DEFAULTS[name]}; "
                            f"--quick {QUICK_DEFAULTS[name]})")  # fmt: skip
    parser.add_argument(
        "--natural_lengths",
        action="store_true",
        help="let RL completions stop at EOS (default: min_new_tokens = --seq_len, so both trainers generate and "
        "train on exactly --seq_len completion tokens per row)",
    )
    parser.add_argument("--kl_coef", type=non_negative_float, default=0.05, help="TRAPO kl_coef = GRPO beta")
    parser.add_argument(
        "--logging_steps", type=positive_int, default=10, help="Trainer logging interval (both trainers)"
    )
    parser.add_argument("--seed", type=seed_int, default=0, help="model initialisation, data and trainer seed")
    parser.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads per run (default 1: stable on a shared machine)"
    )
    parser.add_argument(
        "--clock",
        default=None,
        choices=("cpu", "wall"),
        help="clock of the headline step time and rollout throughput: process CPU time or wall time (default: cpu "
        "on CPU, wall on CUDA); both are recorded",
    )
    parser.add_argument(
        "--comparisons",
        default="rl,sft,distill",
        help="comma-separated comparisons to run: rl, sft, distill (distill includes the joint run)",
    )
    parser.add_argument("--output_json", default=None, help="also write the records and ratios to this JSON file")
    parser.add_argument("--profile", default=None, metavar="DIR", help="write a cProfile of each run to DIR")
    parser.add_argument("--work_dir", default=None, help="model, specs and logs (default: a temporary directory)")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def resolve_defaults(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill unset options from `QUICK_DEFAULTS` (`--quick`) or `DEFAULTS`, and check the values valid only together
    (each alone is `make_parser`'s range type).

    Raises:
        SystemExit: `parser.error` (status 2) for settings that do not fit together, or unknown `--comparisons`.
    """
    defaults = QUICK_DEFAULTS if args.quick else DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.clock is None:
        args.clock = "wall" if args.device == "cuda" else "cpu"
    if args.batch_size % args.num_generations:
        parser.error(
            f"argument --num_generations: {args.num_generations} is invalid: use a divisor of --batch_size="
            f"{args.batch_size}."
        )
    if args.hidden_size % args.num_heads:
        parser.error(
            f"argument --num_heads: {args.num_heads} is invalid: use a divisor of --hidden_size={args.hidden_size}."
        )
    comparisons = [c for c in args.comparisons.split(",") if c]
    unknown = sorted(set(comparisons) - set(TRL_TRAINER))
    if unknown or not comparisons:
        parser.error(
            f"argument --comparisons: {args.comparisons!r} is invalid: choose among {sorted(TRL_TRAINER)}, "
            "comma-separated."
        )
    args.comparisons = ",".join(c for c in TRL_TRAINER if c in comparisons)
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the four runs, print the table and return (and with `--output_json`, write) the results: `records`
    (one per run, named `<objective>_<trainer>`), `ratios` (TRAPO / TRL), `targets`, `settings` and `total_s`."""
    parser = make_parser()
    args = parser.parse_args(argv)
    if args._worker:
        worker(args._worker)
        return {}
    args = resolve_defaults(args, parser)
    go_offline()
    started = time.perf_counter()
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="benchmark-trainers-")
    model_dir = os.path.join(work_dir, "model")
    parameters = save_model(args, model_dir)
    teacher_dir = os.path.join(work_dir, "teacher")
    if "distill" in args.comparisons:
        save_model(args, teacher_dir, seed=args.seed + 1)
    settings = {
        key: getattr(args, key)
        for key in (
            *DEFAULTS,
            "kl_coef",
            "natural_lengths",
            "logging_steps",
            "seed",
            "device",
            "threads",
            "clock",
            "quick",
            "comparisons",
        )
    }
    settings["parameters"] = parameters
    print(
        f"Model: Llama, {parameters / 1e6:.2f}M parameters; batch {args.batch_size}, seq_len {args.seq_len}, "
        f"{args.warmup} warm-up + {args.steps} measured steps per run; {args.threads} threads on {args.device}.",
        flush=True,
    )
    records: dict[str, dict] = {}
    try:
        for objective, trainer in RUNS:
            if objective not in args.comparisons.split(","):
                continue
            name = f"{objective}_{trainer}"
            run_dir = os.path.join(work_dir, name)
            spec = {
                "name": name,
                "objective": objective,
                "trainer": trainer,
                "model_dir": model_dir,
                "teacher_dir": teacher_dir,
                "workdir": run_dir,
                "result_path": os.path.join(run_dir, "result.json"),
                "total_steps": args.warmup + args.steps,
                "profile_dir": os.path.abspath(args.profile) if args.profile else None,
                **{key: settings[key] for key in settings if key not in ("parameters", "quick", "comparisons")},
                "seq_len": args.seq_len,
            }
            run_started = time.perf_counter()
            records[name] = launch(spec)
            print(
                f"  {name}: step {records[name]['step_time_s']:.4f} s, peak {records[name]['peak_memory_mib']:.0f} "
                f"MiB ({time.perf_counter() - run_started:.0f} s)",
                flush=True,
            )
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    ratios = compute_ratios(records)
    result = {
        "settings": settings,
        "records": records,
        "ratios": ratios,
        "targets": {
            key: {"target": t, "lower_is_better": lower} for key, (_, _, t, lower) in RATIOS.items() if key in ratios
        },
        "clock": args.clock,
        "total_s": time.perf_counter() - started,
    }
    print()
    print(format_table(records, ratios))
    print(f"\nTotal {result['total_s']:.0f} s.")
    if args.output_json:
        write_json_atomic(args.output_json, result, sort_keys=False, newline=False)
    return result


if __name__ == "__main__":
    main()
