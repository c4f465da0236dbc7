# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The built-in vision-language task: a tiny VLM learns to read shapes and colours, jointly, in one loop.

Run it with no arguments and no network:

    python examples/trapo_vlm.py  # or: accelerate launch examples/trapo_vlm.py

It builds a tiny LLaVA (a CLIP vision tower and a small Llama, from `trl_trapo/configs/tiny_llava.json`) with a
processor assembled in-process, draws the visual task suite (56x56 images of squares, circles and triangles in four
colours: captions to pretrain on, demonstrations of "colour of the square?", "how many circles?", "same colour?" over
two images and text-only questions, RL prompts of every family with "what shape is it?" RL-only), and trains one
`TRAPOTrainer` on pretraining + SFT + RL. It evaluates before and after and writes `<output_dir>/eval_results.json`
(next to the model, its processor and `trainer_state.json`, as examples/trapo.py does):
greedy accuracy on held-out images (per split and family) and the loss of held-out captions (forgetting).
`--per_modality` weighs image rows and text rows as separate objectives. `--output_dir`, `--max_steps`, `--seed`,
`--task_seed` and every `TRAPOConfig` field are arguments (`python examples/trapo_vlm.py --help`); the job lives in
`trl_trapo.jobs.vision`, the task in `trl_trapo.tasks.vision`.
"""

import logging
import os
import sys


# before torch loads (OpenMP reads it then): threads that wait sleep instead of spinning, so that a core taken by
# another process does not stall every parallel region; set OMP_WAIT_POLICY yourself to choose (docs/threads.md)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from trl_trapo.jobs.main import exits_cleanly
from trl_trapo.jobs.vision import run


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with exits_cleanly():
        status = run()
    sys.exit(status)
