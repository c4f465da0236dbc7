# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The "speed on the real model" block of docs/results/real_model.md, rendered from the committed benchmark results.

Reads `docs/results/benchmarks/`:

- `smollm2_step.json` — `scripts/benchmarks/benchmark_step.py --model_dir <SmolLM2 folder>`: a TRAPO step (all three
  objectives, generation excluded) against a plain causal-LM step on the same tokens, and TRAPO's rollout generation
  against plain `model.generate` on the same prompts (process CPU time, one thread);
- `smollm2_profile_before.json` / `smollm2_profile_after.json` — `scripts/benchmarks/benchmark_smollm2.py --profile`
  before and after a change: step CPU time, peak RSS, time per phase and the top-10 functions by self time.

    python scripts/benchmarks/real_model_report.py                 # print the block
    python scripts/benchmarks/real_model_report.py --write_docs  # and write it between the page's markers

`tests/test_result_pages.py` checks that the page holds exactly what these files render to.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "benchmarks"
BLOCK = "real-model-speed"
STEP_TARGET, ROLLOUT_TARGET = 1.10, 0.95  # issue targets: step ratio <= 1.10, rollout ratio >= 0.95

sys.path.insert(0, str(ROOT / "scripts" / "experiments"))
from result_blocks import page_of, write_block  # noqa: E402


def load(name: str) -> dict:
    """A committed results file of `docs/results/benchmarks/`."""
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def top_functions(profile_text: str, n: int = 5) -> list[str]:
    """The `n` functions with the most self time from a pstats listing, as 'name  seconds'."""
    rows = []
    for line in profile_text.splitlines():
        match = re.match(r"\s*[\d/]+\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(.*)$", line)
        if match:
            name = match.group(2).strip()
            name = re.sub(r"^.*site-packages/", "", name)
            name = re.sub(r"^/.*?/trl_trapo/", "trl_trapo/", name)
            rows.append(f"`{name}` {float(match.group(1)):.1f} s")
    return rows[:n]


def render_block(step: dict, before: dict, after: dict) -> str:
    """The block (markdown) from the three results files."""
    machine = step["machine"]
    r = step["results"]
    b, a = before["results"]["trapo"], after["results"]["trapo"]
    same = b["loss"] == a["loss"]
    worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(b["loss"], a["loss"]))
    losses = "identical losses" if same else f"losses within a relative {worst:.1e}"
    step_ok = "met" if r["step_ratio"] <= STEP_TARGET else "not met"
    rollout_ok = "met" if r["rollout"]["ratio"] >= ROLLOUT_TARGET else "not met"
    lines = [
        f"Measured on {machine['date']} ({machine['cpu_model']}, {machine['cpu_count']} cores, load average "
        f"{r['load_average']:.1f}; torch {machine['torch']}, transformers {machine['transformers']}; clock: this "
        f"process's {'CPU' if r['clock'] == 'cpu' else 'wall'} time, one thread; code `{machine['git_commit']}`), "
        f"SmolLM2-135M-Instruct ({r['parameters'] / 1e6:.1f} M parameters, 49,152-token vocabulary):",
        "",
        "| quantity | TRAPO | plain | ratio | target |",
        "|---|---:|---:|---:|---|",
        f"| optimizer step, {r['rows_per_step']} rows of {r['sequence_length']} tokens (s, median) | "
        f"{r['trapo_step_s']:.1f} | {r['plain_step_s']:.1f} | {r['step_ratio']:.3f} | ≤ {STEP_TARGET}: {step_ok} |",
        f"| rollout generation (tokens/s) | {r['rollout']['trapo_tokens_per_s']:.1f} | "
        f"{r['rollout']['plain_tokens_per_s']:.1f} | {r['rollout']['ratio']:.3f} | ≥ {ROLLOUT_TARGET}: {rollout_ok} |",
        "",
        f"A TRAPO step (`{Path(before['command'].split()[2]).name} --profile`: {b['batch_size']} rows, "
        f"{b['num_generations']} completions of ≤ {b['response_length']} tokens per prompt, full fine-tuning) before "
        f"and after computing the output layer only at counted positions: "
        f"{sum(b['step_cpu_seconds']) / len(b['step_cpu_seconds']):.1f} → "
        f"{sum(a['step_cpu_seconds']) / len(a['step_cpu_seconds']):.1f} CPU-s per step, peak RSS "
        f"{b['peak_rss_mb']:,} → {a['peak_rss_mb']:,} MB, {losses}. Where the profiled step's "
        f"{a['profiled_step_cpu_seconds']:.1f} CPU-s go now: "
        + "; ".join(f"{label.strip()} {seconds:.1f} s" for label, seconds in a["profile_phases_seconds"].items())
        + ". Most self time: "
        + ", ".join(top_functions(a["profile_top10_by_self_time"]))
        + ".",
    ]
    return "\n".join(lines) + "\n"


def make_parser() -> argparse.ArgumentParser:
    """The command line (no numeric argument)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--write_docs", action="store_true", help="write the block between the markers of docs/results/real_model.md"
    )
    return parser


def main(argv: list[str] | None = None) -> str:
    args = make_parser().parse_args(argv)
    block = render_block(
        load("smollm2_step.json"), load("smollm2_profile_before.json"), load("smollm2_profile_after.json")
    )
    print(block)
    if args.write_docs:
        changed = write_block(BLOCK, block)
        print(
            f"{page_of(BLOCK).relative_to(ROOT)} {BLOCK}: {'updated' if changed else 'already up to date'}",
            file=sys.stderr,
        )
    return block


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
