# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What the jobs and the `trapo` command know about the launcher (`accelerate launch`): which of its options `trapo`
hands on ([`LAUNCH_OPTIONS`]), every option it has (read from accelerate's own parser, [`accelerate_launch_options`]),
and the message for a launcher option given to a job ([`launcher_option_hint`]).

A module of its own because both sides need it: `trl_trapo.jobs.commands` (the `trapo` command, which imports the jobs
only when it runs one) splits the launcher's options from the job's arguments, and `trl_trapo.jobs.main` (every job's
parsing) names a launcher option found among a job's arguments or in a `--config` recipe. It imports nothing heavy at
import time: `trapo --help` stays fast.
"""

from __future__ import annotations

import argparse
import functools


ACCELERATE_CONFIG = "--accelerate_config"  # TRL's name; resolved to accelerate's `--config_file`

LAUNCH_OPTIONS = {
    ACCELERATE_CONFIG: True,
    "--num_processes": True,
    "--config_file": True,
    "--multi_gpu": False,
    "--num_machines": True,
    "--machine_rank": True,
    "--main_process_ip": True,
    "--main_process_port": True,
    "--mixed_precision": True,
    "--gpu_ids": True,
}
"""The options a `trapo` sub-command hands to `accelerate launch` -> whether each takes a value: TRL's
`--accelerate_config` and the options of `accelerate launch` that say where and on how many processes to run; the rest
of a launch (DeepSpeed, FSDP, ...) is what the config file says. No argument of the jobs is spelt like one of these.
Without a GPU, accelerate starts several processes only for a multi-process config (`--multi_gpu`, or
`--accelerate_config multi_gpu`), and then with `--mixed_precision no`."""


@functools.cache
def accelerate_launch_options() -> dict[str, argparse.Action]:
    """Every option of `accelerate launch`, from accelerate's own parser (`launch_command_parser`), so the list is the
    installed accelerate's.

    Returns:
        Option name without `--`, hyphens spelt as underscores (`num_processes`, `dynamo_backend`, ...) -> its argparse
        action (its `dest`, `type`, `nargs`). `--help` is left out.
    """
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    return {
        option[2:].replace("-", "_"): action
        for action in parser._actions  # noqa: SLF001 (argparse has no public list of a parser's actions)
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def launcher_option_hint(name: str, value: object = None, program: str = "examples/trapo.py") -> str:
    """For an unknown job argument (or `--config` recipe key) that is an option of `accelerate launch`, what it is and
    where it goes; `""` for any other name.

    Args:
        name: the name, with or without leading dashes; hyphens count as underscores.
        value: its value, shown in the fix (None: shown as `...`).
        program: the job's example script, which the `accelerate launch` fix names.

    Returns:
        `" --x is an option of the launcher ... Fix: ..."`: for an option `trapo` hands on ([`LAUNCH_OPTIONS`]), give
        it to `trapo` or `accelerate launch` on the command line, or in an accelerate config; for any other, in an
        accelerate config (`--config_file`) or on `accelerate launch`'s command line, as `trapo` does not pass it.
    """
    name = name.lstrip("-").replace("-", "_")
    if name not in accelerate_launch_options():
        return ""
    option = f"--{name}"
    given = option if accelerate_launch_options()[name].nargs == 0 else f"{option} {'...' if value is None else value}"
    launch = f"`accelerate launch {given} {program} ...`"
    config = "an accelerate config (`accelerate config` writes one) given as --config_file FILE"
    if option in LAUNCH_OPTIONS:
        where = f"`trapo` ({given}) or {launch}" + ("" if name == "config_file" else f", or {config}")
        return (
            f" {option} is an option of the launcher (`accelerate launch`), not of the job. Fix: give it to {where}."
        )
    return (
        f" {option} is an option of `accelerate launch` (the launcher), not of the job, and `trapo` does not pass it "
        f"on. Fix: set it in {config}, or run {launch}."
    )
