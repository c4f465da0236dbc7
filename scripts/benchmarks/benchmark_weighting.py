# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The weighting strategies' own cost per optimizer step (issue 42's secondary metric, "the weighting's own cost per
step": milliseconds per optimizer step of an arm against `static`, measured alone on a quiet machine).

Each strategy of `TRAPOConfig.weighting` (`dare`, `static`, `uncertainty`, `gradnorm`, `gac`) trains the main job's
built-in setup (`examples/trapo.py` without a model: the tiny model, the built-in task suite, `BUILTIN_DEFAULTS`,
64 rows per step) for `--steps` optimizer steps, in this process, on one torch thread, with evaluation off and every
other setting identical. The runs are interleaved (dare, static, ..., dare, static, ... for `--repeats` rounds), so
slow drift in the machine's load falls on every strategy alike. Two views:

1. **Whole step.** The process CPU seconds (`time.process_time`, all threads of this process) and wall seconds
   between the ends of consecutive optimizer steps (a `TrainerCallback.on_step_end`), i.e. everything a step does:
   rollouts, rewards, the forwards and backward, the optimizer. Reported: the median ms/step over the steps after
   `--warmup`, and its difference against `static` in the same round (median over the rounds, [min, max]); also the
   difference at the strategy's update steps alone, paired with `static`'s same step. This view sees what the
   strategy costs outside its own calls too (the forward's `output_hidden_states=True` at update steps, memory), but
   on the short runs here the rollouts are the same work only while the policies stay close: every strategy starts
   from the same weights and seed with all factors 1 until its first update, and a few steps later the sampled
   completions (their lengths) start to differ. Keep `--steps` small (30 by default) and read it with that in mind.
2. **The strategy's own work.** The CPU time spent inside the calls the trainer makes to its weighting
   (`trainer.dare`, a [`~trl_trapo.weighting.DARE`]): `step_weights` (the factors into loss weights, every step),
   `begin_step` (every step; resets the probe at update steps), `accumulate` (the split-half gradient probe
   `GradientProbe` at update steps: a log-sum-exp over the step's logits and two small products per objective) and
   `finish_step` (the probe's reduction, cosines and statistics, and the strategy's `update`). The script wraps
   those bound methods of the trainer's object; no library code is changed for the timing. DARE, GradNorm and GAC
   read the probe's statistics, uncertainty weighting reads only the losses but the probe runs for it as well: every
   adaptive strategy pays the same probe. Reported: the median own ms at an update step, the updates per 100 steps,
   the own ms per step amortised over the measured steps, and amortised at the main job's update interval
   (ceil(sqrt(1,000)) = 32 steps): own ms at an update step / 32 + own ms at another step.

The runs use `dare_update_interval` = `--update_interval` (5 by default, so that 30 steps hold several updates; the
main job's 1,000 steps update every 32). `static` never measures anything; its own work is `step_weights` and
`begin_step`.

    OMP_NUM_THREADS=1 python scripts/benchmarks/benchmark_weighting.py                     # 5 strategies x 3 rounds
    OMP_NUM_THREADS=1 python scripts/benchmarks/benchmark_weighting.py --steps 30 --repeats 5 --json cost.json
    OMP_NUM_THREADS=1 python scripts/benchmarks/benchmark_weighting.py --strategies dare static --repeats 2
    OMP_NUM_THREADS=1 python scripts/benchmarks/benchmark_weighting.py \
        --model_name_or_path models/SmolLM2-135M-Instruct --steps 10 --repeats 2   # a real model folder, same data

With `--model_name_or_path` the model and its tokenizer come from that folder (e.g. `scripts/fetch_smollm2.py`'s);
the data, rewards and hyper-parameters stay the built-in job's. Run it on an otherwise idle machine: the figures of a
shared one carry its load (the script prints the load average before and after).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict


os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402

from trl_trapo.weighting import WEIGHTINGS  # noqa: E402


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "experiments"))  # runlib
from runlib import int_range, non_negative_int, positive_int  # noqa: E402


JOB_STEPS = 1000  # the main job's max_steps (BUILTIN_DEFAULTS): its DARE update interval is ceil(sqrt(1000))
JOB_INTERVAL = math.ceil(math.sqrt(JOB_STEPS))
OWN_CALLS = ("step_weights", "begin_step", "accumulate", "finish_step")  # the trainer's calls to `trainer.dare`


def clocks() -> tuple[float, float]:
    """(process CPU seconds, wall seconds) now."""
    return time.process_time(), time.perf_counter()


class StepClock(TrainerCallback):
    """Records the clocks at the start of training and at the end of every optimizer step; stops after `steps`."""

    def __init__(self, steps: int):
        self.steps = steps
        self.marks: list[tuple[float, float]] = []  # marks[k]: after k optimizer steps

    def on_train_begin(self, args, state, control, **kwargs):
        self.marks = [clocks()]

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.append(clocks())
        if state.global_step >= self.steps:
            control.should_training_stop = True

    def step_seconds(self) -> tuple[list[float], list[float]]:
        """Per optimizer step (0-based), its CPU and wall seconds."""
        cpu = [b[0] - a[0] for a, b in zip(self.marks, self.marks[1:])]
        wall = [b[1] - a[1] for a, b in zip(self.marks, self.marks[1:])]
        return cpu, wall


class OwnWorkTimer:
    """Times the calls the trainer makes to its weighting (`trainer.dare`), per optimizer step, by wrapping the bound
    methods `step_weights`, `begin_step`, `accumulate`, `finish_step` of that object (and, inside `finish_step`, the
    strategy's own `update`, reported apart and not added twice).

    `step_weights` runs just before `begin_step(step)` when a step is built, so it is counted to that step;
    `accumulate` and `finish_step` to the step of the last `begin_step`.

    Args:
        dare ([`~trl_trapo.weighting.DARE`]): the trainer's weighting (`trainer.dare`).
    """

    def __init__(self, dare):
        self.cpu: dict[int, float] = defaultdict(float)  # step -> CPU seconds of the calls in OWN_CALLS
        self.parts: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # step -> call -> seconds
        self.calls: dict[str, int] = defaultdict(int)
        self.update_steps: list[int] = []  # steps whose `finish_step` ran (the strategy updated)
        self.step: int | None = None
        self.pending = 0.0  # `step_weights` seconds not yet given a step
        for name in OWN_CALLS:
            setattr(dare, name, self.wrap(getattr(dare, name), name))
        dare.engine.update = self.wrap(dare.engine.update, "update")

    def wrap(self, method, name: str):
        def timed(*args, **kwargs):
            start = time.process_time()
            result = method(*args, **kwargs)
            seconds = time.process_time() - start
            self.record(name, seconds, args)
            return result

        timed.__wrapped__ = method
        return timed

    def record(self, name: str, seconds: float, args: tuple) -> None:
        self.calls[name] += 1
        if name == "step_weights":
            self.pending += seconds
            return
        if name == "begin_step":
            self.step = int(args[0])
            seconds += self.pending
            self.parts[self.step]["step_weights"] += self.pending
            self.pending = 0.0
        if name == "finish_step":
            self.update_steps.append(self.step)
        self.parts[self.step][name] += seconds
        if name != "update":  # inside finish_step: already counted there
            self.cpu[self.step] += seconds


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def build_trainer(strategy: str, steps: int, update_interval: int, output_dir: str, model_name_or_path: str | None):
    """The main job's built-in trainer (`trl_trapo.jobs.main`) for `strategy`, `steps` steps, evaluation off; with
    `model_name_or_path`, that folder's model and tokenizer on the same data, rewards and hyper-parameters."""
    from trl_trapo import TRAPOTrainer
    from trl_trapo.jobs import main as job

    argv = [
        "--weighting", strategy,
        "--max_steps", str(steps),
        "--dare_update_interval", str(update_interval),
        "--eval_strategy", "no",
        "--logging_steps", str(steps),
        "--disable_tqdm", "true",
        "--output_dir", output_dir,
    ]  # fmt: skip
    script_args, training_args, model_args = job.parse_args(argv)  # built-in mode: BUILTIN_DEFAULTS fill the rest
    if model_name_or_path is None:
        trainer, _ = job.build_trainer(script_args, training_args, model_args)
        return trainer
    from transformers import AutoTokenizer

    inputs = job.build_inputs(script_args, training_args, model_args)  # the built-in data and rewards
    inputs = dataclasses.replace(inputs, tokenizer=AutoTokenizer.from_pretrained(model_name_or_path))
    return TRAPOTrainer(
        model=model_name_or_path,
        processing_class=inputs.tokenizer,
        reward_funcs=inputs.reward_funcs,
        args=training_args,
        train_dataset=inputs.train_dataset,
        pretrain_dataset=inputs.pretrain_dataset,
        sft_dataset=inputs.sft_dataset,
    )


def run_once(strategy: str, steps: int, update_interval: int, model_name_or_path: str | None) -> dict:
    """One training run of `strategy`; per optimizer step its whole-step and own-work seconds."""
    with tempfile.TemporaryDirectory(prefix="benchmark_weighting_") as output_dir:
        trainer = build_trainer(strategy, steps, update_interval, output_dir, model_name_or_path)
        trainer.remove_callback(PrinterCallback)  # stdout keeps the table only
        clock = StepClock(steps)
        trainer.add_callback(clock)
        own = OwnWorkTimer(trainer.dare)
        trainer.train()
    cpu, wall = clock.step_seconds()
    if len(cpu) < steps:
        raise RuntimeError(f"weighting={strategy!r}: {len(cpu)} optimizer steps ran, {steps} were asked for.")
    if own.calls["begin_step"] < steps:  # the hooks must see the trainer's calls, or the own-work view means nothing
        raise RuntimeError(
            f"weighting={strategy!r}: the timer saw {own.calls['begin_step']} calls to trainer.dare.begin_step in "
            f"{steps} steps: the trainer no longer calls the methods it wraps (OWN_CALLS)."
        )
    return {
        "cpu_s": cpu[:steps],
        "wall_s": wall[:steps],
        "own_cpu_s": [own.cpu.get(k, 0.0) for k in range(steps)],
        "own_parts_s": {k: dict(own.parts[k]) for k in range(steps) if k in own.parts},
        "update_steps": [k for k in own.update_steps if k is not None and k < steps],
        "update_interval": trainer.dare.update_interval,
    }


def summarise(runs: dict[str, list[dict]], warmup: int) -> dict[str, dict]:
    """Per strategy, the table's figures (milliseconds) from its runs, the differences paired with `static`'s run of
    the same round (and, at update steps, the same step)."""
    baseline = runs.get("static")
    out = {}
    for strategy, rounds in runs.items():
        per_round = []
        for index, run in enumerate(rounds):
            steps = range(warmup, len(run["cpu_s"]))
            interval = run["update_interval"]
            schedule = [k for k in steps if k > 0 and k % interval == 0]  # the update steps of an adaptive strategy
            others = [k for k in steps if k not in schedule]
            figures = {
                "cpu_ms": 1e3 * median([run["cpu_s"][k] for k in steps]),
                "wall_ms": 1e3 * median([run["wall_s"][k] for k in steps]),
                "own_update_ms": 1e3 * median([run["own_cpu_s"][k] for k in schedule]),
                "own_other_ms": 1e3 * median([run["own_cpu_s"][k] for k in others]),
                "own_amortised_ms": 1e3 * sum(run["own_cpu_s"][k] for k in steps) / len(steps),
                "updates_per_100": 100.0 * sum(1 for k in run["update_steps"] if k >= warmup) / len(steps),
            }
            figures["own_job_interval_ms"] = figures["own_update_ms"] / JOB_INTERVAL + figures["own_other_ms"]
            for call in (*OWN_CALLS, "update"):  # where the own work at an update step goes (`update`: in finish_step)
                parts = run["own_parts_s"]
                figures[f"own_update_ms/{call}"] = 1e3 * median([parts.get(k, {}).get(call, 0.0) for k in schedule])
            if baseline is not None and index < len(baseline):
                base = baseline[index]
                figures["delta_cpu_ms"] = figures["cpu_ms"] - 1e3 * median([base["cpu_s"][k] for k in steps])
                figures["delta_wall_ms"] = figures["wall_ms"] - 1e3 * median([base["wall_s"][k] for k in steps])
                figures["delta_update_cpu_ms"] = 1e3 * median([run["cpu_s"][k] - base["cpu_s"][k] for k in schedule])
            per_round.append(figures)
        keys = per_round[0].keys()
        summary = {key: median([f[key] for f in per_round]) for key in keys}
        for key in ("delta_cpu_ms", "delta_wall_ms", "delta_update_cpu_ms"):
            if key in keys:
                summary[f"{key}_range"] = [min(f[key] for f in per_round), max(f[key] for f in per_round)]
        summary["rounds"] = per_round
        out[strategy] = summary
    return out


def measure(
    strategies=WEIGHTINGS,
    steps: int = 30,
    repeats: int = 3,
    warmup: int = 5,
    update_interval: int = 5,
    model_name_or_path: str | None = None,
    log=print,
) -> dict:
    """Run every strategy `repeats` times, interleaved, and summarise (see the module docstring).

    Args:
        strategies (`Sequence[str]`): values of `TRAPOConfig.weighting`; `static` is added when missing (the
            differences are taken against it).
        steps (`int`): optimizer steps per run (> `warmup`).
        repeats (`int`): rounds; each runs every strategy once, in the order given.
        warmup (`int`): the first steps of a run, left out of every figure.
        update_interval (`int`): `dare_update_interval` of the runs.
        model_name_or_path (`str`, *optional*): a model folder instead of the built-in tiny model.
        log (`Callable[[str], None]`): where progress lines go.

    Returns:
        `dict`: `settings`, `summary` (strategy -> milliseconds: `cpu_ms`, `wall_ms` per step, `delta_cpu_ms` and
        `delta_wall_ms` against `static` with `*_range` [min, max] over rounds, `delta_update_cpu_ms` at update steps,
        `own_update_ms` (split by call in `own_update_ms/<call>`), `own_other_ms`, `updates_per_100`,
        `own_amortised_ms`, `own_job_interval_ms`, and the figures of each round in `rounds`), `runs` (per strategy, per round, the raw seconds per step).

    Raises:
        ValueError: for an unknown strategy or settings out of range, before anything runs.
    """
    strategies = list(dict.fromkeys(strategies))
    unknown = [s for s in strategies if s not in WEIGHTINGS]
    if unknown:
        raise ValueError(f"strategies={unknown!r}: not a weighting strategy; use some of {list(WEIGHTINGS)}.")
    if "static" not in strategies:
        strategies.append("static")
    for name, value, low in (("steps", steps, 2), ("repeats", repeats, 1), ("update_interval", update_interval, 1)):
        if value < low:
            raise ValueError(f"{name}={value}: use an integer >= {low}.")
    if not 0 <= warmup < steps - 1:
        raise ValueError(f"warmup={warmup}: use 0 <= warmup < steps - 1 = {steps - 1} (steps={steps}).")
    if model_name_or_path is not None and not os.path.isdir(model_name_or_path):
        raise ValueError(
            f"model_name_or_path={model_name_or_path!r} is not a folder: give a model folder (e.g. the one "
            "scripts/fetch_smollm2.py writes), or leave it out for the built-in tiny model."
        )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runs: dict[str, list[dict]] = {s: [] for s in strategies}
    try:
        for round_index in range(repeats):
            for strategy in strategies:
                start = clocks()
                runs[strategy].append(run_once(strategy, steps, update_interval, model_name_or_path))
                log(
                    f"round {round_index + 1}/{repeats} {strategy}: {time.process_time() - start[0]:.1f} CPU s, "
                    f"{time.perf_counter() - start[1]:.1f} s"
                )
    finally:
        torch.set_num_threads(threads)
    settings = dict(
        strategies=strategies,
        steps=steps,
        repeats=repeats,
        warmup=warmup,
        update_interval=update_interval,
        job_update_interval=JOB_INTERVAL,
        model_name_or_path=model_name_or_path,
        torch_threads=1,
    )
    return {"settings": settings, "summary": summarise(runs, warmup), "runs": runs}


def table(result: dict) -> str:
    """The summary as a Markdown table (milliseconds)."""

    def number(value, sign=False) -> str:
        return "–" if value is None or not math.isfinite(value) else (f"{value:+.1f}" if sign else f"{value:.1f}")

    def spread(summary, key) -> str:
        if key not in summary:
            return "–"
        low, high = summary[f"{key}_range"]
        return f"{number(summary[key], True)} [{number(low, True)}, {number(high, True)}]"

    def own(value) -> str:
        return "–" if not math.isfinite(value) else f"{value:.2f}"

    settings = result["settings"]
    lines = [
        "| strategy | whole step CPU ms/step | Δ vs `static` [min, max] | wall ms/step | Δ wall | Δ CPU at update "
        "steps | own ms at an update step | updates per 100 steps | own ms/step amortised | own ms/step at the job's "
        f"interval ({settings['job_update_interval']}) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for strategy, s in result["summary"].items():
        lines.append(
            f"| `{strategy}` | {number(s['cpu_ms'])} | {spread(s, 'delta_cpu_ms')} | {number(s['wall_ms'])} | "
            f"{spread(s, 'delta_wall_ms')} | {spread(s, 'delta_update_cpu_ms')} | {own(s['own_update_ms'])} | "
            f"{s['updates_per_100']:.1f} | {own(s['own_amortised_ms'])} | {own(s['own_job_interval_ms'])} |"
        )
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (counts refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="+", default=list(WEIGHTINGS), choices=WEIGHTINGS)
    parser.add_argument("--steps", type=int_range(2), default=30, help="optimizer steps per run, >= 2 (default 30)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--warmup", type=non_negative_int, default=5, help="first steps of a run left out, < --steps - 1 (default 5)"
    )
    parser.add_argument(
        "--update_interval", type=positive_int, default=5, help="dare_update_interval of the runs (default 5)"
    )
    parser.add_argument("--model_name_or_path", default=None, help="a model folder (default: the built-in tiny model)")
    parser.add_argument("--json", default=None, help="also write the result here (atomically)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.warmup >= args.steps - 1:  # a run needs timed steps after its warm-up
        parser.error(f"argument --warmup: {args.warmup} is invalid: use 0 to --steps - 2 = {args.steps - 2}.")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    before = load_average()
    log(f"load average before: {before}; torch threads 1; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    try:
        result = measure(
            args.strategies,
            args.steps,
            args.repeats,
            args.warmup,
            args.update_interval,
            args.model_name_or_path,
            log=log,
        )
    except ValueError as error:
        parser.error(str(error))
    result["settings"]["load_average_before"] = before
    result["settings"]["load_average_after"] = load_average()
    result["settings"]["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    result["settings"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log(f"load average after: {result['settings']['load_average_after']}")
    print(table(result))
    if args.json:
        from trl_trapo.jobs.main import write_json_atomic

        write_json_atomic(args.json, result)
    return result


if __name__ == "__main__":
    main()
