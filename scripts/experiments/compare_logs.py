# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Compare the per-step logs of two runs: the check a behaviour-preserving change (a redesign) must pass.

Run the main job before and after the change with the same arguments, then compare their `trainer_state.json`:

    python examples/trapo.py --output_dir /tmp/before --max_steps 200 --logging_steps 1 --report_to none
    # ... apply the change ...
    python examples/trapo.py --output_dir /tmp/after --max_steps 200 --logging_steps 1 --report_to none
    python scripts/experiments/compare_logs.py /tmp/before /tmp/after

It prints, per logged key, the worst absolute difference over the steps both runs logged, and exits 1 if a key of
`--keys` (default: `loss`, `weight/*`, `train_loss`) differs by more than `--tolerance` (default 0: bit-identical) or
is missing from one run. Wall-clock keys (`eps`, `*_runtime`, `*_per_second`) are skipped.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))  # runlib
from runlib import non_negative_float  # noqa: E402


TIMING = ("eps", "*runtime", "*per_second", "total_flos")


def load(path: str) -> dict[tuple[int, str], float]:
    """`{(step, key): value}` of the numeric entries of a run's `log_history` (a folder or its trainer_state.json)."""
    source = Path(path)
    if source.is_dir():
        source = source / "trainer_state.json"
    history = json.loads(source.read_text(encoding="utf-8"))["log_history"]
    out: dict[tuple[int, str], float] = {}
    for entry in history:
        step = int(entry.get("step", -1))
        for key, value in entry.items():
            if isinstance(value, (int, float)) and not any(fnmatch.fnmatch(key, p) for p in TIMING):
                out[(step, key)] = float(value)
    return out


def make_parser() -> argparse.ArgumentParser:
    """The command line (`--tolerance` refused below 0: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--keys", nargs="+", default=["loss", "weight/*", "train_loss"])
    parser.add_argument(
        "--tolerance", type=non_negative_float, default=0.0, help="largest |difference| allowed (default 0)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    before, after = load(args.before), load(args.after)
    keys = sorted({k for _, k in before} | {k for _, k in after})
    failed = False
    for key in keys:
        steps_b = {s for s, k in before if k == key}
        steps_a = {s for s, k in after if k == key}
        common = steps_b & steps_a
        worst = max((abs(before[(s, key)] - after[(s, key)]) for s in common), default=0.0)
        if any(math.isnan(before[(s, key)]) != math.isnan(after[(s, key)]) for s in common):
            worst = math.inf
        checked = any(fnmatch.fnmatch(key, p) for p in args.keys)
        missing = steps_b ^ steps_a
        bad = checked and (worst > args.tolerance or bool(missing))
        failed |= bad
        flag = "FAIL" if bad else ("ok" if checked else "")
        extra = f" (logged at {len(missing)} steps by one run only)" if missing else ""
        print(f"{key:40s} steps={len(common):4d} worst |diff|={worst:.3g}{extra} {flag}")
    print("identical" if not failed else "DIFFERENT", f"(checked: {' '.join(args.keys)}, tolerance {args.tolerance})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
