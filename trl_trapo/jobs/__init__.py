# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The jobs: what `trapo train | vlm | tools` and `examples/*.py` run, on top of the library (TRL keeps its jobs in
`trl/scripts/`). The library's core never imports this package (tests/test_layout.py).

- `trl_trapo.jobs.main`: the main job (`trapo train`, `examples/trapo.py`) and the argument parsing, loading and
  exit handling the other jobs share; also importable as `trl_trapo.cli`.
- `trl_trapo.jobs.vision`: the vision-language job (`trapo vlm`, `examples/trapo_vlm.py`).
- `trl_trapo.jobs.agent`: the tool-calling agent job (`trapo tools`, `examples/trapo_tools.py`).
- `trl_trapo.jobs.commands`: the `trapo` command.
- `trl_trapo.jobs.launcher`: what the jobs and the `trapo` command know about `accelerate launch` (its options, read
  from its own parser; which of them `trapo` passes on).
"""
