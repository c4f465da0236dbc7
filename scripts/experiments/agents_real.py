# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Tool calling on a real model: SmolLM2-135M-Instruct with a calculator on GSM8K prompts, TRAPO's RL with `tools=`.

    python scripts/experiments/agents_real.py            # 20 steps of 16 prompts x 2 completions, offline
    python scripts/experiments/agents_real.py --quick    # a tiny random model with SmolLM2's tokenizer (seconds)

What it shows is the path, not accuracy: SmolLM2's chat template cannot express tools, so the tokenizer gets the
Hermes / Qwen2.5 ChatML tool format (`trl_trapo.agents.use_chatml_tool_template`); the prompts are the recipe's
conversational GSM8K prompts (`scripts/gsm8k_to_trl.py --conversational`, from
`examples/data/gsm8k/train_first1500.jsonl`) with one sentence added to the system hint saying that the calculator may
be called; the tool is `trl_trapo.tools.calculator`; the reward is `numeric_answer` (the number after the last `####`
of the assistant's turns). By default every step is RL only: no SFT or pretraining data is given, so all its rows are
RL rows: `--prompts` (16) prompts x `--num_generations` (2) completions = 32, trained in micro-batches of
`--micro_batch` (8) rows with gradient accumulation (one optimizer step, one rollout round of 32). A rollout makes at
most `--max_tool_calling_iterations` (2) rounds of calls, so at most 3 assistant turns; `--response_length` (256)
tokens is the budget of the whole rollout (a call is ~33 tokens, its result and the next turn's header ~22, a worked
answer ~85 to 160). The other settings are the CPU recipe's (`examples/recipes/gsm8k_smollm2_135m_cpu.yaml`,
`RECIPE_FIELDS`: learning rate 2e-5, temperature 0.7, KL 0.05, ...). The RL prompts are the first `--train_rows`
(1,000) problems.

Sampled before training, SmolLM2-135M-Instruct does not write `<tool_call>`; RL only reinforces calls it samples.
`--sft_traces N` adds N SFT rows per step on top of the RL rows (TRAPO's joint SFT, `assistant_only_loss=True`):
GSM8K solutions of the problems after `--train_rows` turned into tool-calling traces (`gsm8k_tool_trace`: each of
their first two calculator annotations becomes a call and its result), which teach the format while RL measures its
use; N must keep the step's rows a multiple of `--micro_batch` (e.g. 8).

Written to `--output` (default `docs/results/agents_real/results.json`; with `--quick` under `--work_dir`) and printed:
per step the tool metrics (`tools/call_frequency`, `tools/failure_frequency`, `tools/turns_mean`,
`tools/rollback_frequency`), the reward of the sampled completions, the step's wall and CPU time (rollout round,
reference log-probs and update; the round's wall time also apart), and a sample of its completions, decoded with their
tool turns (the first `--samples` rollouts of the step and up to `--samples` that called a tool); over the run: setup,
wall and CPU time, peak resident memory.

Cost, measured on this project's 2-core machine while another job loaded both cores, one torch thread: one step of 4
prompts x 2 (`--max_steps 1 --prompts 4 --micro_batch 4`) took 199 s wall / 105 s CPU (the tool-calling round 117 s
wall, its 8 completions 142 tokens on average), peak RSS 6.3 GB (10.4 GB with `--micro_batch 8`). Extrapolated, not
measured: a step of 32 rows costs about four times that, ~7 min of CPU, so the default 20 steps take ~2.5 h of CPU on
one thread (3-4 h wall on the loaded machine) — well over the issue's 45 min, which needs a GPU, an idle machine with
more threads, or fewer rows (`--prompts 8` halves it).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # compare_real, runlib
sys.path.insert(0, str(HERE.parent))  # scripts/: gsm8k_to_trl, fetch_smollm2

import runlib  # noqa: E402


RECIPE = ROOT / "examples" / "recipes" / "gsm8k_smollm2_135m_cpu.yaml"
DATA = ROOT / "examples" / "data" / "gsm8k" / "train_first1500.jsonl"
OUTPUT = ROOT / "docs" / "results" / "agents_real" / "results.json"
TOOL_HINT = " You may call the calculator tool for the arithmetic."
# what the run takes from the CPU recipe (its optimiser, schedule, sampling temperature, KL, prompt length, precision)
RECIPE_FIELDS = (
    "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "bf16",
    "activation_checkpointing", "max_prompt_length", "num_ppo_epochs", "temperature", "kl_coef",
)  # fmt: skip
TOOL_METRICS = ("tools/call_frequency", "tools/failure_frequency", "tools/turns_mean", "tools/rollback_frequency")
STEP_METRICS = (
    *TOOL_METRICS, "objective/scores", "completions/mean_length", "completions/mean_env_length", "loss/rl", "loss/sft",
)  # fmt: skip
QUICK = {"max_steps": 2, "prompts": 4, "response_length": 96, "train_rows": 32, "micro_batch": 4}
FULL = {"max_steps": 20, "prompts": 16, "response_length": 256, "train_rows": 1000, "micro_batch": 8}


# =====================================================================================================================
# Data, reward, timing
# =====================================================================================================================
def gsm8k_tool_prompts(rows: int | None = None) -> list[dict]:
    """The recipe's conversational GSM8K RL rows (`gsm8k_to_trl.py --conversational`: a system hint and the question,
    with GSM8K's reference `answer`), the system hint extended by [`TOOL_HINT`].

    Args:
        rows: the first `rows` problems of `train_first1500.jsonl` (None: all 1,500).

    Returns:
        `list[dict]`: `{"prompt": [system, user], "answer": str}` per problem, in the file's order.
    """
    from gsm8k_to_trl import convert, read_rows

    source = read_rows(str(DATA), None, "train")[:rows]
    out = []
    for row in convert(source, 0, 0, True)["rl/train"]:
        system, user = row["prompt"]
        out.append({"prompt": [{**system, "content": system["content"] + TOOL_HINT}, user], "answer": row["answer"]})
    return out


ANNOTATION = re.compile(r"<<([^<>=]*)=[^<>]*>>")  # GSM8K's calculator annotation `<<48/2=24>>`


def gsm8k_tool_trace(question: str, answer: str, system: str, max_calls: int = 2) -> list[dict]:
    """A GSM8K worked solution as a tool-calling conversation (TRL's `messages` format) for SFT on traces: the
    solution's text up to each of its first `max_calls` calculator annotations is an assistant turn that ends with a
    `calculator` call on the annotated expression; the calculator's result comes back as a tool message; the next turn
    goes on where the annotation was (GSM8K writes the result there); the rest of the solution, annotations removed,
    is the last turn. `Natalia sold 48/2 = <<48/2=24>>24 clips` becomes `Natalia sold 48/2 =` + call(`48/2`), tool
    `24`, then `24 clips ...`.

    Args:
        question: the problem.
        answer: GSM8K's solution with its annotations, ending in `#### N`.
        system: the system message (the prompts' system hint).
        max_calls: calls per trace at most (`max_tool_calling_iterations`: one call per turn).

    Returns:
        `list[dict]`: system, user, then assistant (with `tool_calls`) / tool pairs and a final assistant message.

    Raises:
        ValueError: if an annotated expression is one the calculator refuses (none of the bundled rows has one).
    """
    from gsm8k_to_trl import clean_solution

    from trl_trapo.tools import calculator

    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    position = 0
    for match in list(ANNOTATION.finditer(answer))[:max_calls]:
        expression = match.group(1).strip()
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        text = clean_solution(answer[position : match.start()])
        messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
        messages.append({"role": "tool", "name": "calculator", "content": calculator(expression)})
        position = match.end()
    messages.append({"role": "assistant", "content": clean_solution(answer[position:])})
    return messages


class RecordingReward:
    """`numeric_answer` as a reward function (TRL's contract) that also keeps every scored rollout: its structured
    completion (assistant and tool messages), its decoded token ids (special tokens kept, so the tool turns show),
    the reference answer and the reward, under the trainer's step.

    Args:
        tokenizer: the policy's tokenizer (decodes `completion_ids`).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.records: list[dict] = []
        self.__name__ = "numeric_answer"  # the metric's name: rewards/numeric_answer/mean

    def __call__(
        self, prompts, completions, answer, completion_ids, trainer_state=None, **kwargs
    ) -> list[float | None]:
        from trl_trapo.rewards import numeric_answer_reward

        rewards = numeric_answer_reward(completions, answer)
        # the optimizer step this round trains (the training log's `step`): one more than the steps already done
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        for prompt, messages, reference, ids, reward in zip(prompts, completions, answer, completion_ids, rewards):
            tool_messages = [m for m in messages if m.get("role") == "tool"]
            self.records.append(
                {
                    "step": step,
                    "question": prompt[-1]["content"],
                    "answer": reference.rsplit("####", 1)[-1].strip(),
                    "reward": reward,
                    "calls": len(tool_messages),
                    "failed_calls": sum(str(m.get("content", "")).startswith("{'error'") for m in tool_messages),
                    "assistant_turns": sum(m.get("role") == "assistant" for m in messages),
                    "text": self.tokenizer.decode(ids, skip_special_tokens=False),
                    "messages": messages,
                }
            )
        return rewards


def step_timer():
    """A `transformers.TrainerCallback` that records each optimizer step's wall and CPU time in its `steps` list:
    seconds since the previous step ended (or training began), so a step's rollout round, reference log-probs and
    update all count (CPU: the process's, all threads), and the wall time of the step's tool-calling round alone
    (`rollout_wall_s`: the source's `last_round_seconds`, when `source` is set and it sampled in that step)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []
            self.mark: tuple[float, float] | None = None
            self.source = None  # the trainer's rollout source, set once the trainer is built
            self.last_round: float | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.mark = (time.perf_counter(), time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            now = (time.perf_counter(), time.process_time())
            row = {"step": state.global_step, "wall_s": now[0] - self.mark[0], "cpu_s": now[1] - self.mark[1]}
            seconds = None if self.source is None else self.source.last_round_seconds
            if seconds is not None and seconds is not self.last_round:  # a round sampled in this step
                row["rollout_wall_s"] = self.last_round = seconds
            self.steps.append(row)
            self.mark = now

    return StepTimer()


# =====================================================================================================================
# The run
# =====================================================================================================================
def build_config(args, recipe: dict, output_dir: Path):
    """The run's `TRAPOConfig`: `RECIPE_FIELDS` from the recipe, the tool-calling settings from `args`."""
    from trl_trapo import TRAPOConfig

    settings = {key: recipe[key] for key in RECIPE_FIELDS if key in recipe}
    settings.update(
        output_dir=str(output_dir),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=step_rows(args) // args.micro_batch,
        # rows per generate call and per no-grad reference forward: 32 rows of ~550 tokens at once would hold 32 x 550
        # x 49,152 float32 logits (3.5 GB) and their log-softmax; 16 keeps the peak at the training micro-batch's
        local_rollout_forward_batch_size=min(16, args.prompts * args.num_generations),
        num_generations=args.num_generations,
        response_length=args.response_length,
        max_tool_calling_iterations=args.max_tool_calling_iterations,
        seed=args.seed,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    if args.learning_rate is not None:
        settings["learning_rate"] = args.learning_rate
    if args.temperature is not None:
        settings["temperature"] = args.temperature
    settings["warmup_steps"] = min(settings.get("warmup_steps", 0), max(args.max_steps // 5, 0))
    if args.sft_traces:
        # every step: --sft_traces SFT rows (assistant turns only) next to the RL rows, no pretraining (no data)
        sft = args.sft_traces / step_rows(args)
        settings.update(
            curriculum_mixtures=[0.0, sft, 1.0 - sft] * 3,
            assistant_only_loss=True,
            sft_max_length=args.sft_max_length,
        )
    return TRAPOConfig(**settings)


def step_rows(args) -> int:
    """Rows of one optimizer step: the RL rows (`--prompts` x `--num_generations`) and the `--sft_traces` rows."""
    return args.prompts * args.num_generations + args.sft_traces


def summarise_steps(log_history: list[dict], timings: list[dict]) -> list[dict]:
    """One entry per optimizer step: `STEP_METRICS` from the training log (absent when not measured), then the step's
    timings (`wall_s`, `cpu_s`, `rollout_wall_s`; see [`step_timer`])."""
    logged = {e["step"]: e for e in log_history if "train_runtime" not in e and "step" in e}
    return [
        {"step": t["step"], **{k: v for k, v in logged.get(t["step"], {}).items() if k in STEP_METRICS}, **t}
        for t in timings
    ]


def samples(records: list[dict], per_step: int) -> list[dict]:
    """Per step, its first `per_step` rollouts, and up to `per_step` more of those that called a tool."""
    out: list[dict] = []
    for step in sorted({r["step"] for r in records}):
        rows = [r for r in records if r["step"] == step]
        first = rows[:per_step]
        with_calls = [r for r in rows[per_step:] if r["calls"]][:per_step]
        out += first + with_calls
    return out


def run(args) -> dict[str, Any]:
    """Build the trainer, train, and gather the results (see the module docstring)."""
    import compare_real
    import torch
    import yaml
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import get_json_schema

    from trl_trapo import TRAPOTrainer
    from trl_trapo.agents import use_chatml_tool_template
    from trl_trapo.tools import calculator

    torch.set_num_threads(args.threads)
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    work = Path(args.work_dir).resolve()
    recipe = yaml.safe_load(RECIPE.read_text(encoding="utf-8")) or {}
    if args.model:
        model_path = args.model
    elif args.quick:
        model_path = str(compare_real.make_tiny_model(work / "tiny-smollm2"))
    else:
        model_path = compare_real.resolve_model(recipe)
    tokenizer = use_chatml_tool_template(AutoTokenizer.from_pretrained(model_path))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    dataset = Dataset.from_list(gsm8k_tool_prompts(args.train_rows))
    traces = None
    if args.sft_traces:  # from the problems after the RL prompts: none is both an RL prompt and a demonstration
        from gsm8k_to_trl import read_rows

        system = dataset[0]["prompt"][0]["content"]
        rows = read_rows(str(DATA), None, "train")[len(dataset) :][: args.sft_traces * args.max_steps]
        if not rows:
            raise SystemExit(
                f"--sft_traces needs GSM8K rows after the first --train_rows {args.train_rows}: lower it."
            )
        schema = [get_json_schema(calculator)]
        traces = Dataset.from_list(
            [
                {"messages": gsm8k_tool_trace(r["question"], r["answer"], system, args.max_tool_calling_iterations),
                 "tools": json.dumps(schema)}
                for r in rows
            ]
        )  # fmt: skip
    reward = RecordingReward(tokenizer)
    timer = step_timer()
    trainer = TRAPOTrainer(
        model,
        reward_funcs=reward,
        args=build_config(args, recipe, work / "run"),
        train_dataset=dataset,
        sft_dataset=traces,
        processing_class=tokenizer,
        tools=[calculator],
        callbacks=[timer],
    )
    reward.records.clear()  # the construction-time check's empty completions
    timer.source = trainer.rollout_source
    setup_s = time.perf_counter() - started_wall
    trainer.train()
    steps = summarise_steps(trainer.state.log_history, timer.steps)
    records = reward.records
    calls = sum(r["calls"] for r in records)

    def mean(key: str) -> float | None:
        values = [s[key] for s in steps if key in s]
        return statistics.fmean(values) if values else None

    return {
        "command": " ".join(["python scripts/experiments/agents_real.py", *args.argv]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": runlib.machine_line(),
        "threads": args.threads,
        "model": "tiny random Llama over SmolLM2's tokenizer (--quick)"
        if args.quick and not args.model
        else model_path,
        "settings": {
            "steps": args.max_steps,
            "prompts_per_step": args.prompts,
            "num_generations": args.num_generations,
            "rl_rows_per_step": args.prompts * args.num_generations,
            "sft_trace_rows_per_step": args.sft_traces,
            "micro_batch": args.micro_batch,
            "max_tool_calling_iterations": args.max_tool_calling_iterations,
            "response_length": args.response_length,
            "temperature": trainer.args.temperature,
            "learning_rate": trainer.args.learning_rate,
            "kl_coef": trainer.args.kl_coef,
            "system_hint": dataset[0]["prompt"][0]["content"],
        },
        "steps": steps,
        "totals": {
            "rollouts": len(records),
            "calls": calls,
            "failed_calls": sum(r["failed_calls"] for r in records),
            "rollouts_with_calls": sum(1 for r in records if r["calls"]),
            "rewarded": sum(1 for r in records if r["reward"] == 1.0),
            "call_frequency": mean("tools/call_frequency"),
            "failure_frequency": mean("tools/failure_frequency"),
            "turns_mean": mean("tools/turns_mean"),
            "rollback_frequency": mean("tools/rollback_frequency"),
            "reward_mean": mean("objective/scores"),
            "setup_s": setup_s,
            "train_wall_s": sum(s["wall_s"] for s in steps),
            "train_cpu_s": sum(s["cpu_s"] for s in steps),
            "wall_s": time.perf_counter() - started_wall,
            "cpu_s": time.process_time() - started_cpu,
            "peak_rss_mb": runlib.peak_rss_mb(),
        },
        "samples": samples(records, args.samples),
    }


def report(results: dict) -> str:
    """The results as text: a line per step, the totals, and the sampled completions."""

    def cell(value, digits=2):
        return "–" if value is None else f"{value:.{digits}f}"

    settings = results["settings"]
    lines = [
        f"{results['model']}: {settings['steps']} steps x {settings['rl_rows_per_step']} RL rows"
        + (f" + {settings['sft_trace_rows_per_step']} SFT trace rows" if settings["sft_trace_rows_per_step"] else ""),
        "step  calls/rollout  failed/call  turns  rolled back  reward  step wall / CPU s  rollout wall s",
    ]
    for s in results["steps"]:
        lines.append(
            f"{s['step']:>4}  {cell(s.get('tools/call_frequency')):>13}  "
            f"{cell(s.get('tools/failure_frequency')):>11}  "
            f"{cell(s.get('tools/turns_mean')):>5}  {cell(s.get('tools/rollback_frequency')):>11}  "
            f"{cell(s.get('objective/scores')):>6}  {s['wall_s']:>8.1f} / {s['cpu_s']:<8.1f}  "
            f"{cell(s.get('rollout_wall_s'), 1):>14}"
        )
    totals = results["totals"]
    lines.append(
        f"totals: {totals['calls']} calls ({totals['failed_calls']} failed) in {totals['rollouts_with_calls']} of "
        f"{totals['rollouts']} rollouts; {totals['rewarded']} rewarded; train {totals['train_wall_s'] / 60:.1f} min "
        f"wall / {totals['train_cpu_s'] / 60:.1f} min CPU, setup {totals['setup_s']:.0f} s, peak RSS "
        f"{totals['peak_rss_mb'] / 1024:.2f} GB"
    )
    for sample in results["samples"]:
        lines += [
            "",
            f"--- step {sample['step']}, answer {sample['answer']}, reward {sample['reward']}, "
            f"calls {sample['calls']} ({sample['failed_calls']} failed), assistant turns {sample['assistant_turns']}",
            f"Q: {sample['question']}",
            sample["text"],
        ]
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny random model with SmolLM2's tokenizer")
    parser.add_argument("--model", default=None, help="model folder (default: the recipe's SmolLM2, or --quick's)")
    parser.add_argument(
        "--max_steps", type=runlib.positive_int, default=None, help="optimizer steps (default 20; --quick 2)"
    )
    parser.add_argument(
        "--prompts", type=runlib.positive_int, default=None, help="prompts per step (default 16; --quick 4)"
    )
    parser.add_argument(
        "--num_generations", type=runlib.int_range(2), default=2, help="completions per prompt (>= 2: a group)"
    )
    parser.add_argument(
        "--max_tool_calling_iterations", type=runlib.positive_int, default=2, help="rounds of calls per rollout"
    )
    parser.add_argument(
        "--response_length",
        type=runlib.positive_int,
        default=None,
        help="token budget of a whole rollout (default 256; --quick 96)",
    )
    parser.add_argument(
        "--micro_batch",
        type=runlib.positive_int,
        default=None,
        help="rows per forward/backward (default 8; --quick 4); it must "
        "divide --prompts x --num_generations, the step's rows, which gradient accumulation gathers",
    )
    parser.add_argument(
        "--sft_traces",
        type=runlib.non_negative_int,
        default=0,
        help="SFT rows per step of GSM8K tool-calling traces (gsm8k_tool_trace) "
        "next to the RL rows, from the problems after --train_rows (default 0: RL only)",
    )
    parser.add_argument(
        "--sft_max_length",
        type=runlib.positive_int,
        default=768,
        help="tokens of a trace (system turn with tools ~260, question, solution; the longest of rows 1,000-1,160 is "
        "748)",
    )
    parser.add_argument(
        "--train_rows",
        type=runlib.positive_int,
        default=None,
        help="the first GSM8K rows, the RL prompts (default 1,000; --quick 32)",
    )
    parser.add_argument("--learning_rate", type=runlib.positive_float, default=None, help="default: the recipe's")
    parser.add_argument("--temperature", type=runlib.positive_float, default=None, help="default: the recipe's")
    parser.add_argument("--seed", type=runlib.seed_int, default=0)
    parser.add_argument(
        "--samples", type=runlib.non_negative_int, default=4, help="completions kept per step (and as many with calls)"
    )
    parser.add_argument("--threads", type=runlib.positive_int, default=1, help="torch threads")
    parser.add_argument("--work_dir", default="agents-real-output", help="the stand-in model and the trainer's folder")
    parser.add_argument("--output", default=None, help=f"results JSON (default {OUTPUT.relative_to(ROOT)}; --quick: "
                        "<work_dir>/results.json)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the measurement, write the results JSON atomically, print the report; returns the results."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    rows = step_rows(args)
    if rows % args.micro_batch:
        parser.error(
            f"argument --micro_batch: {args.micro_batch} is invalid: use a divisor of the step's {rows} rows "
            f"(--prompts {args.prompts} x --num_generations {args.num_generations} RL rows + --sft_traces "
            f"{args.sft_traces})."
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runlib.go_offline()
    results = run(args)
    output = Path(args.output) if args.output else (Path(args.work_dir) / "results.json" if args.quick else OUTPUT)
    runlib.write_json_atomic(output, results)
    print(report(results))
    print(f"\nwritten: {output}")
    return results


if __name__ == "__main__":
    main()
