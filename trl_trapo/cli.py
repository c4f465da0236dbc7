# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`trl_trapo.cli`, the main job's import path before the jobs moved into `trl_trapo.jobs` (scripts and the docs use
it: `from trl_trapo.cli import main, parse_args`). The name is the module `trl_trapo.jobs.main` itself, not a copy,
so patching `trl_trapo.cli.X` patches the job."""

import sys

from .jobs import main


sys.modules[__name__] = main
