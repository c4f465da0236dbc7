# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The built-in agent task: the tiny model learns to call a tool, jointly with pretraining and SFT, in one loop.

Run it with no arguments and no network:

    python examples/trapo_tools.py  # or: accelerate launch examples/trapo_tools.py

It builds the character-level tokenizer with a compact tool-calling chat template, the tiny model, the agent task
(multiplying two numbers of up to three digits, which the model cannot compute, with a `multiply` tool it can call),
the built-in suite's pretraining corpus and other families, and trains one `TRAPOTrainer` on pretraining + SFT on
tool-calling traces + RL with the tool. It evaluates before and after and writes `<output_dir>/eval_results.json`
(next to the model and `trainer_state.json`, as examples/trapo.py does):
accuracy with the tool against without it (the same model, the tool withheld), tool-call validity, the other
families' accuracy and the held-out pretraining loss. `--output_dir`, `--max_steps`, `--seed`, `--task_seed` and every
`TRAPOConfig` field are arguments (`python examples/trapo_tools.py --help`); the job itself lives in
`trl_trapo.jobs.agent` (its docstring lists the metrics), the task in `trl_trapo.tasks.agent`.
"""

import logging
import os
import sys


# before torch loads (OpenMP reads it then): threads that wait sleep instead of spinning, so that a core taken by
# another process does not stall every parallel region; set OMP_WAIT_POLICY yourself to choose (docs/threads.md)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from trl_trapo.jobs.agent import run
from trl_trapo.jobs.main import exits_cleanly


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # a bad value, path or dataset: one message and exit status 2 (TRAPO_DEBUG=1 shows the traceback); Ctrl-C /
    # SIGTERM during training: a checkpoint, one line saying how to resume, exit 130 / 143 (as examples/trapo.py)
    with exits_cleanly():
        status = run()
    sys.exit(status)
