#!/bin/bash
# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
# The cost check of a redesign (issues 39, 40): the main job and benchmark_trainers.py, 3 times each, on one checkout.
# Run it for the commit before and the commit after, side by side (one torch thread each, so 2 cores hold both):
#
#   git worktree add /tmp/before <commit>
#   bash scripts/benchmarks/cost_check.sh /tmp/before /tmp/cost/before &
#   bash scripts/benchmarks/cost_check.sh "$PWD" /tmp/cost/after; wait
#
# Each rep writes OUT/mainN.time (GNU time: wall s, user s, sys s, peak RSS kB) and OUT/benchN.json (the benchmark's
# records). Compare CPU time (user + sys), which a shared machine inflates less than wall time, rep by rep.
set -euo pipefail
TREE=$(cd "$1" && pwd); OUT=$2; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$TREE OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
cd "$TREE"
for r in 1 2 3; do
  /usr/bin/time -f "%e wall %U user %S sys %M maxrss_kb" -o "$OUT/main$r.time" \
    python examples/trapo.py --output_dir "$OUT/main$r" --report_to none > "$OUT/main$r.log" 2>&1
  /usr/bin/time -f "%e wall %U user %S sys %M maxrss_kb" -o "$OUT/bench$r.time" \
    python scripts/benchmarks/benchmark_trainers.py --output_json "$OUT/bench$r.json" > "$OUT/bench$r.log" 2>&1
done
