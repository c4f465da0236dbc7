# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The `trapo` console command, in the style of TRL's `trl sft ...` / `trl grpo ...`: one sub-command per job.

    trapo train [--ARGUMENT VALUE ...]   # the main job, as `examples/trapo.py` (trl_trapo.jobs.main)
    trapo vlm [--ARGUMENT VALUE ...]     # the vision-language job, as `examples/trapo_vlm.py` (trl_trapo.jobs.vision)
    trapo tools [--ARGUMENT VALUE ...]   # the agent (tool-calling) job, as `examples/trapo_tools.py` (trl_trapo.jobs.agent)
    trapo train --help                   # every argument of that job

Each sub-command takes exactly its example's arguments (the same parser: `--config recipe.yaml`, errors that suggest
the closest name) and runs the same `run` function. Without a launcher option it runs in this process, as
`python examples/trapo.py` does. With one it launches through `accelerate launch`, as `trl` does:
`--accelerate_config NAME_OR_PATH` (a file, or the name of a config TRL ships: `multi_gpu`, `zero2`, `fsdp2`, ...;
TRL's `resolve_accelerate_config_argument`), `--num_processes N`, or another option of `accelerate launch` that says
where to run (`--config_file`, `--main_process_port`, `--mixed_precision`, ...: [`LAUNCH_OPTIONS`]). Each process
then runs `python -m trl_trapo.jobs.commands <job> <the job's arguments>`.

Differences from `trl`: `trl` launches every run through `accelerate launch` (a child process even for one process)
and hands the launcher whatever its script's parser does not know, so a misspelt argument reaches accelerate's parser;
here a run without launcher options stays in this process, and only the launcher options of [`LAUNCH_OPTIONS`] go to
the launcher, so a misspelt job argument is the job's error, with its suggestion. Launcher options in a `--config`
recipe are not read (give them on the command line).
"""

from __future__ import annotations

import argparse
import base64
import importlib
import ipaddress
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import yaml

import trl_trapo
from trl_trapo.jobs.launcher import ACCELERATE_CONFIG, LAUNCH_OPTIONS, accelerate_launch_options, launcher_option_hint


@dataclass(frozen=True)
class Job:
    """One sub-command of `trapo`.

    Args:
        name (`str`): the sub-command.
        module (`str`): the module whose `run(argv, program)` is the job and whose `make_parser` parses its arguments.
        example (`str`): the example script that runs the same job.
        help (`str`): one line for `trapo --help`.
    """

    name: str
    module: str
    example: str
    help: str


JOBS = (
    Job(
        "train",
        "trl_trapo.jobs.main",
        "examples/trapo.py",
        "the main job: pretraining + SFT + RL in one loop, on your model and data or the built-in tiny task suite",
    ),
    Job(
        "vlm",
        "trl_trapo.jobs.vision",
        "examples/trapo_vlm.py",
        "the built-in vision-language job: a tiny LLaVA learns shapes and colours (pretraining + SFT + RL)",
    ),
    Job(
        "tools",
        "trl_trapo.jobs.agent",
        "examples/trapo_tools.py",
        "the built-in agent job: the tiny model learns to call a tool (pretraining + SFT + RL with tools=)",
    ),
)
"""The sub-commands, named as TRL users say it: `train` for the main job (`trapo train`, as `trl sft` trains), `vlm`
and `tools` as TRL names the capabilities (its `*_vlm.py` example scripts; `GRPOTrainer(tools=...)`) and as the
example scripts are named (`trapo_vlm.py`, `trapo_tools.py`)."""


def build_parser() -> argparse.ArgumentParser:
    """`trapo`'s parser: one sub-command per [`JOBS`] entry, each taking its job's arguments unparsed (the job parses
    them, `--help` included)."""
    parser = argparse.ArgumentParser(
        prog="trapo",
        allow_abbrev=False,
        description="TRAPO: pretraining, SFT and RL objectives in one TRL training loop.",
        epilog=(
            "`trapo <command> --help` lists the arguments of a job. Launching: without launcher options a job runs "
            "in this process; --num_processes N, --accelerate_config NAME_OR_PATH (a file, or a config TRL ships: "
            "multi_gpu, zero2, fsdp2, ...), --config_file, --multi_gpu, --main_process_port, --mixed_precision, "
            "--num_machines, --machine_rank, --main_process_ip or --gpu_ids start it through `accelerate launch`, as "
            "`trl` does."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {trl_trapo.__version__}")
    commands = parser.add_subparsers(
        title="commands", dest="command", metavar="{" + ",".join(j.name for j in JOBS) + "}"
    )
    for job in JOBS:
        commands.add_parser(job.name, help=job.help, add_help=False)
    return parser


TRL_COMMANDS = ("grpo", "sft")
"""TRL's training sub-commands (`trl grpo`, `trl sft`) whose job is `trapo train` here: one trainer takes the RL
prompts and the SFT rows together."""


def trl_command_error(command: str, names: Sequence[str]) -> str:
    """argparse's refusal of a TRL sub-command given to `trapo`, and what to type instead.

    Args:
        command: one of [`TRL_COMMANDS`].
        names: `trapo`'s sub-commands.

    Returns:
        `"trapo: error: argument ...: invalid choice: 'grpo' (choose from ...). TRL's ..."` (one line, for stderr).
    """
    choices = ", ".join(repr(name) for name in names)
    return (
        f"trapo: error: argument {{{','.join(names)}}}: invalid choice: {command!r} (choose from {choices}). "
        "TRL's `trl grpo` and `trl sft` are both `trapo train` here (RL prompts: --dataset_name; SFT rows: "
        "--sft_dataset_name; the built-in tasks when neither is given)."
    )


MODULE = "trl_trapo.jobs.commands"
"""This module's import name, which each launched process runs (`--module`): not `__name__`, which is `"__main__"`
under `python -m trl_trapo.jobs.commands`, a name `python -m` in the launched process cannot find."""


def split_launch_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate the launcher's options ([`LAUNCH_OPTIONS`]) from the job's arguments.

    Args:
        argv: the arguments after the sub-command.

    Returns:
        `(launch_args, job_args)`: the launcher's options with their values (`--flag=value` spelt `--flag value`,
        `--num-processes` spelt `--num_processes`, as accelerate's parser takes both), and everything else in its
        order.

    Raises:
        ValueError: a launcher option that takes a value is last, without one.
    """
    launch, job = [], []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token.partition("=")
        if name.startswith("--"):  # accelerate's parser takes `--num-processes` for `--num_processes` too
            name = "--" + name[2:].replace("-", "_")
        if name in LAUNCH_OPTIONS:
            launch.append(name)
            if eq:
                launch.append(value)
            elif LAUNCH_OPTIONS[name]:
                if i + 1 >= len(tokens):
                    raise ValueError(f"{name} needs a value, e.g. `{name} 2`.")
                launch.append(tokens[i + 1])
                i += 1
        else:
            job.append(token)
        i += 1
    return launch, job


def launch_namespace(job: Job, launch_args: Sequence[str], job_args: Sequence[str]) -> argparse.Namespace:
    """The `accelerate launch` arguments that start `job` in each process: the launcher's options (TRL's
    `--accelerate_config` resolved to `--config_file`), then `--module trl_trapo.jobs.commands <job> <job_args>`.

    Raises:
        ValueError: from [`check_job_args`]; from TRL's resolution, for an `--accelerate_config` that is neither a
            file nor a config TRL ships; from [`check_launch_namespace`].
    """
    from accelerate.commands.launch import launch_command_parser
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    check_job_args(job, job_args)
    resolved = resolve_accelerate_config_argument(list(launch_args))
    namespace = launch_command_parser().parse_args([*resolved, "--module", MODULE, job.name, *job_args])
    check_processes_start(job, namespace)
    check_launch_namespace(namespace)
    return namespace


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_processes_start(job: Job, namespace: argparse.Namespace) -> None:
    """Refuse, before the launch, `--num_processes N` (N > 1) that `accelerate launch` would run as one process: on a
    machine without a GPU, with neither `--multi_gpu` nor an accelerate config, accelerate's simple launcher starts
    one process (it turns on multi-process only when it sees several GPUs), which the job then refused ~20 s later,
    naming `accelerate launch` rather than the command typed (trial 11's C17). `--multi_gpu` is not added for the
    user: on the CPU it means DDP over gloo, each process slower than one alone, which the user should choose.

    Args:
        job: the sub-command, named in the fix.
        namespace: the `accelerate launch` arguments.

    Raises:
        ValueError: naming `--num_processes`, why one process would start, and the command with `--multi_gpu` (at
            most one process per CPU core, at least 2), or the command without `--num_processes`.
    """
    import torch

    processes = namespace.num_processes
    if (
        not isinstance(processes, int)
        or processes <= 1
        or namespace.multi_gpu
        or config_file_of(namespace) is not None  # the config's distributed_type decides
        or (namespace.num_machines or 1) > 1
        or torch.cuda.device_count() > 0
    ):
        return
    cores = cpu_cores()
    fewer = max(2, min(processes, cores))
    crowded = (
        f" (this machine has {cores} CPU core(s): more processes than cores share them, each far slower than one)"
        if fewer < processes
        else ""
    )
    raise ValueError(
        f"--num_processes={processes}: this machine has no GPU visible, and without --multi_gpu `accelerate launch` "
        "starts one process when it does not see several GPUs (the job would then refuse to run alone). On the CPU, "
        f"several processes need --multi_gpu (TRAPO then runs DDP over gloo). Fix: `trapo {job.name} "
        f"--multi_gpu --num_processes {fewer} ...`{crowded}, or leave --num_processes out to run one process."
    )


def check_job_args(job: Job, job_args: Sequence[str]) -> None:
    """Refuse, before a launch, an option of `accelerate launch` among the job's arguments that the job does not have
    and `trapo` does not pass on (`--dynamo_backend`): every launched process would refuse it, each with the message.
    Run in this process, the job's parser says the same.

    Raises:
        ValueError: naming the option, that it is `accelerate launch`'s, and where it goes
            (`trl_trapo.jobs.launcher.launcher_option_hint`).
    """
    options = accelerate_launch_options()
    candidates = {
        i: token.partition("=")
        for i, token in enumerate(job_args)
        if token.startswith("--") and token.partition("=")[0][2:].replace("-", "_") in options
    }
    if not candidates:  # the common case: the job's parser (a heavy import) is not needed
        return
    from trl_trapo.jobs.main import known_fields

    fields = set(known_fields(importlib.import_module(job.module).make_parser().dataclass_types))
    for i, (name, eq, value) in candidates.items():
        if name[2:].replace("-", "_") in fields:  # the job's own (`--gradient_accumulation_steps`, `--debug`)
            continue
        following = job_args[i + 1] if i + 1 < len(job_args) and not job_args[i + 1].startswith("--") else None
        hint = launcher_option_hint(name, value if eq else following, program=job.example)
        if hint:
            raise ValueError(f"{name}: unknown argument.{hint}")


LAUNCH_MINIMUMS = {"num_processes": 1, "num_machines": 1, "machine_rank": 0, "main_process_port": 0}
"""The smallest value accelerate can use for each numeric launcher option; its parser takes any integer and, for
`--num_processes 0`, starts one process anyway. `--main_process_port 0` asks accelerate for a free port (its
`get_free_port`), which only one machine can do: [`check_launch_namespace`] refuses it on several."""

LAUNCH_MAXIMUMS = {"main_process_port": 65535}
"""The largest value accelerate can use for each numeric launcher option: a TCP port above 65535 is accepted by its
parser and fails inside torch.distributed on several processes."""

CONFIG_SECTIONS = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}
"""Sections of an accelerate config whose keys `accelerate launch` reads as its options with this prefix
(`dynamo_config: {backend: ...}` is `--dynamo_backend`); the keys of its other sections are options as they are
(`deepspeed_config: {zero_stage: 3}` is `--zero_stage 3`), as accelerate's `_validate_launch_command` copies them."""


HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")  # `_`: names in /etc/hosts (containers) resolve
GPU_ID = re.compile(r"^(\d+|GPU-[0-9A-Fa-f-]+|MIG-[\w/-]+)$")  # what CUDA_VISIBLE_DEVICES takes: an index or a UUID


def is_host(value: str) -> bool:
    """Whether `value` is an IP address (v4 or v6) or a host name (RFC 1123: dot-separated labels of letters, digits
    and hyphens, underscores allowed as the system resolver allows them in /etc/hosts; an all-numeric last label only
    as an IPv4 address, so `999.1.1.1` is neither)."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        labels = value.rstrip(".").split(".")
        return 0 < len(value) <= 253 and all(HOST_LABEL.match(label) for label in labels) and not labels[-1].isdigit()


def config_file_of(namespace: argparse.Namespace) -> str | None:
    """The accelerate config file `accelerate launch` will read for `namespace`: `--config_file`, or accelerate's
    default config file when it exists (`accelerate config` writes it) and `--cpu` is not given; None for neither."""
    from accelerate.commands.config.config_args import default_config_file

    if namespace.config_file is not None:
        return namespace.config_file
    return None if namespace.cpu or not os.path.isfile(default_config_file) else default_config_file


def read_mapping(path: str) -> dict | None:
    """The YAML (or JSON) mapping in the file `path` as written, before accelerate fills in its defaults; None when
    the file is empty or holds only comments, `{}` when it cannot be read or holds no mapping."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if data is None or isinstance(data, dict) else {}


def accelerate_config_of(namespace: argparse.Namespace):
    """The accelerate config `accelerate launch` will read for `namespace` ([`config_file_of`]), loaded as it loads it.

    Returns:
        accelerate's `ClusterConfig` / `SageMakerConfig`, or None when no config file applies.

    Raises:
        ValueError: naming `--config_file` and the fix, for a file that is no accelerate config (a training recipe
            given as `--config_file`: accelerate's "A `distributed_type` must be specified"), that is empty, or that
            accelerate cannot read.
    """
    from accelerate.commands.config.config_args import load_config_from_file

    from trl_trapo.jobs.main import ACCELERATE_CONFIG_KEYS

    shown = config_file_of(namespace)
    if shown is None:
        return None
    fix = (
        "Fix: pass a training recipe as --config, and an accelerate config (written by `accelerate config`) as "
        f"--config_file, or use {ACCELERATE_CONFIG} with a config TRL ships (multi_gpu, zero2, fsdp2, ...)."
    )
    if read_mapping(shown) is None:  # accelerate's text would be "'NoneType' object has no attribute 'get'"
        raise ValueError(
            f"--config_file={shown!r} is empty (or holds only comments): an accelerate config says at least its "
            f"`distributed_type`. Fix: write one with `accelerate config --config_file {shown}`, or use "
            f"{ACCELERATE_CONFIG} with a config TRL ships (multi_gpu, zero2, fsdp2, ...)."
        )
    try:
        return load_config_from_file(namespace.config_file)
    except Exception as error:  # accelerate's own: ValueError, TypeError (an unknown key), yaml's and json's errors
        keys = set(read_mapping(shown) or {})
        recipe = ""
        if keys and not keys & ACCELERATE_CONFIG_KEYS:
            recipe = (
                f" It has no `distributed_type`: it looks like a training recipe (its keys, e.g. "
                f"{', '.join(sorted(map(str, keys))[:3])}, are the job's arguments), which the job reads with --config."
            )
        raise ValueError(
            f"--config_file={shown!r} is not an accelerate config accelerate can read ({type(error).__name__}: "
            f"{error}).{recipe} {fix}"
        ) from error


def config_options(data: dict) -> dict[str, tuple[str, object]]:
    """The values an accelerate config gives `accelerate launch`'s options, as its `_validate_launch_command` reads
    them: each top-level key, and each key of a section ([`CONFIG_SECTIONS`] for the prefixed ones).

    Args:
        data: the config file's mapping, as written ([`read_mapping`]).

    Returns:
        Option name (`num_processes`, `zero_stage`, `dynamo_backend`, ...) -> `(key, value)`, the key as the file
        spells it (`deepspeed_config.zero_stage`).
    """
    out: dict[str, tuple[str, object]] = {}
    for key, value in data.items():
        if not isinstance(value, dict):
            out[str(key)] = (str(key), value)
            continue
        prefix = CONFIG_SECTIONS.get(str(key), "")
        for inner, item in value.items():
            name = str(inner) if str(inner).startswith(prefix) else prefix + str(inner)
            out[name] = (f"{key}.{inner}", item)
    return out


def check_config_values(path: str, data: dict) -> None:
    """Refuse a value of the accelerate config `path` that `accelerate launch` would take as it is, where its parser
    converts the command-line option (`num_processes: two` reached its `>=` as text: "'>=' not supported between
    instances of 'str' and 'int'").

    Args:
        path: the config file, for the message.
        data: its mapping, as written ([`read_mapping`]).

    Raises:
        ValueError: naming the file, the key, the value and the fix, for a value of a numeric option (`type=int` or
            `type=float` in accelerate's launch parser) that is not a number.
    """
    actions = accelerate_launch_options()
    for name, (key, value) in config_options(data).items():
        kind = getattr(actions.get(name), "type", None)
        if kind not in (int, float) or value is None:
            continue
        numbers = (int,) if kind is int else (int, float)
        if isinstance(value, numbers) and not isinstance(value, bool):
            continue
        need = "a whole number" if kind is int else "a number"
        example = {"main_process_port": 29500}.get(name, 2 if kind is int else 1.0)
        try:
            kind(value)
            text = " It is text (quoted): accelerate does not convert a config's values."
        except (TypeError, ValueError):
            text = ""
        raise ValueError(
            f"--config_file={path!r}: {key}: {value!r} is not {need}, and `accelerate launch` reads it as its "
            f"--{name}.{text} Fix: write {need} in digits, without quotes (e.g. `{key.rsplit('.', 1)[-1]}: "
            f"{example}`), or give --{name} on the command line."
        )


def check_launch_namespace(namespace: argparse.Namespace) -> None:
    """Refuse launcher options `accelerate launch` would fail on late (a raw traceback) or silently ignore, checked as
    accelerate reads them: each option on the command line, else the accelerate config's value.

    Raises:
        ValueError: naming the option (or the config file and its key), the value and the fix, when `--config_file`
            names no file (accelerate raises `FileNotFoundError` inside the launch) or no accelerate config (see
            [`accelerate_config_of`]); a config value of a numeric option is not a number ([`check_config_values`]);
            a numeric option is below [`LAUNCH_MINIMUMS`] (`--num_processes 0` would run one process) or above
            [`LAUNCH_MAXIMUMS`] (`--main_process_port 99999`); `--main_process_port 0` (a free port) on several
            machines, where each would pick its own; `--machine_rank` is not below `--num_machines` (a rank no
            launch has); several machines without `--main_process_ip` (accelerate's `AssertionError`);
            `--main_process_ip` is neither an IP address nor a host name; `--gpu_ids` is not `all` or a
            comma-separated list of GPU indices (or UUIDs), which accelerate copies into `CUDA_VISIBLE_DEVICES`
            unread; `--mixed_precision fp8` without Transformer Engine or torchao (accelerate's `RuntimeError`);
            a launcher whose package is missing ([`check_launcher_package`]: `distributed_type: XLA` without
            torch_xla).
    """
    config_file = namespace.config_file
    if config_file is not None and not os.path.isfile(config_file):
        what = "a directory" if os.path.isdir(config_file) else "no such file"
        raise ValueError(
            f"--config_file={config_file!r}: {what}. Fix: give an accelerate config file (written by `accelerate "
            f"config`), or use {ACCELERATE_CONFIG} with a config TRL ships (multi_gpu, zero2, fsdp2, ...)."
        )
    config = accelerate_config_of(namespace)
    path = config_file_of(namespace)
    written = config_options(read_mapping(path) or {}) if config is not None and path is not None else {}
    if written:
        check_config_values(path, read_mapping(path) or {})

    def value_of(name: str):
        """The value `accelerate launch` uses for the option `name` (the command line's, else the config file's as
        written) and how the message names it."""
        given = getattr(namespace, name, None)
        if given is not None:
            return given, f"--{name}={given}"
        if name in written:
            key, value = written[name]
            return value, f"--config_file={path!r}: {key}: {value}"
        return None, f"--{name}"

    for name, minimum in LAUNCH_MINIMUMS.items():
        value, shown = value_of(name)
        if value is not None and value < minimum:
            raise ValueError(f"{shown}: use an integer >= {minimum}, or leave it out.")
    for name, maximum in LAUNCH_MAXIMUMS.items():
        value, shown = value_of(name)
        if value is not None and value > maximum:
            raise ValueError(f"{shown}: use an integer in {LAUNCH_MINIMUMS[name]}-{maximum}, or leave it out.")
    num_machines, machine_rank = value_of("num_machines")[0] or 1, value_of("machine_rank")[0] or 0
    if machine_rank >= num_machines:
        raise ValueError(
            f"--machine_rank={machine_rank}: must be < --num_machines ({num_machines}): machines are numbered 0 to "
            f"{num_machines - 1}. Fix: leave --machine_rank out on one machine; on several, give each its own rank."
        )
    main_process_ip = value_of("main_process_ip")[0]
    if num_machines > 1 and not main_process_ip:
        raise ValueError(
            f"--num_machines={num_machines} needs --main_process_ip (the address of machine 0) and --main_process_port"
            ", with --machine_rank on each machine (0 to num_machines - 1). Fix: give them, or leave --num_machines out "
            "to run on this machine."
        )
    port, shown = value_of("main_process_port")
    if num_machines > 1 and port == 0:
        raise ValueError(
            f"{shown}: 0 asks accelerate for a free port, which each of the {num_machines} machines would pick on its "
            "own, so they would not meet. Fix: give every machine the same port (e.g. 29500)."
        )
    if main_process_ip is not None and not is_host(str(main_process_ip)):
        raise ValueError(
            f"--main_process_ip={main_process_ip!r} is neither an IP address nor a host name. Fix: give the address of "
            "machine 0 (e.g. 10.0.0.1 or node0), or leave it out on one machine."
        )
    gpu_ids = value_of("gpu_ids")[0]
    if gpu_ids is not None and str(gpu_ids) != "all" and not all(GPU_ID.match(i) for i in str(gpu_ids).split(",")):
        raise ValueError(
            f"--gpu_ids={gpu_ids!r}: give GPU indices separated by commas (e.g. 0,1), or all. accelerate copies the "
            "value into CUDA_VISIBLE_DEVICES without reading it."
        )
    distributed_type = getattr(config, "distributed_type", None)
    uses_deepspeed = bool(namespace.use_deepspeed) or distributed_type == "DEEPSPEED"
    check_launcher_package(namespace, distributed_type, path, bool(getattr(config, "use_cpu", False)))
    check_named_files(value_of, uses_deepspeed, num_machines)
    warn_launch_resources(value_of)
    mixed_precision = value_of("mixed_precision")[0]
    if str(mixed_precision).lower() == "fp8":
        from accelerate.utils import is_fp8_available

        if not is_fp8_available():
            raise ValueError(
                "--mixed_precision=fp8 needs Transformer Engine or torchao, and neither is installed here. Fix: use "
                "bf16 (or no), or install one of them (`pip install torchao`)."
            )


def check_launcher_package(
    namespace: argparse.Namespace, distributed_type: object, path: str | None, config_cpu: bool = False
) -> None:
    """Refuse a launch whose accelerate launcher imports a package that is not installed, as accelerate's
    `launch_command` picks the launcher (DeepSpeed first, then TPU; neither with `--cpu`): `distributed_type: XLA` or
    `--tpu` runs `tpu_launcher`, which imports `torch_xla` (trial 10's CX02, a TPU config copied to a GPU machine:
    "No module named 'torch_xla'" as a traceback); `distributed_type: DEEPSPEED` or `--use_deepspeed` runs
    `deepspeed_launcher`, which needs `deepspeed`.

    Args:
        namespace: the `accelerate launch` arguments.
        distributed_type: the accelerate config's `distributed_type` (None without a config).
        path: the accelerate config file, for the message.
        config_cpu: the accelerate config's `use_cpu` (accelerate's `--cpu`).

    Raises:
        ValueError: naming the option (or the config file and its key), the missing package and the fix.
    """
    from accelerate.utils import is_deepspeed_available, is_torch_xla_available

    if namespace.cpu or config_cpu:
        return
    if namespace.use_deepspeed or distributed_type == "DEEPSPEED":
        kind, flag, package, available = "DEEPSPEED", "--use_deepspeed", "deepspeed", is_deepspeed_available()
    elif namespace.tpu or distributed_type == "XLA":
        kind, flag, package, available = "XLA", "--tpu", "torch_xla", is_torch_xla_available()
    else:
        return
    if available:
        return
    shown = f"--config_file={path!r}: distributed_type: {kind}" if distributed_type == kind else flag
    raise ValueError(
        f"{shown} launches through {package}, which is not installed here. Fix: install it (`pip install "
        f"{package}`) on a machine that runs it, or launch with a config written on this machine by `accelerate "
        "config` (e.g. distributed_type: MULTI_GPU or MULTI_CPU), or without --config_file."
    )


def is_inline_deepspeed_config(value: str) -> bool:
    """Whether `value` is a DeepSpeed config written inline, as accelerate's `HfDeepSpeedConfig` also reads its
    `deepspeed_config_file`: JSON text, or base64-encoded JSON."""
    try:
        json.loads(value)
    except ValueError:
        try:
            json.loads(base64.urlsafe_b64decode(value).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return False
    return True


def check_named_files(value_of: Callable[[str], tuple[object, str]], uses_deepspeed: bool, num_machines: int) -> None:
    """Refuse a launcher option (or accelerate config key) that names a file which does not exist, where accelerate
    reads it only after the launch: `deepspeed_config_file` (read in each process, by `HfDeepSpeedConfig`: "Expected a
    string path to an existing deepspeed config ..." after DeepSpeed's start, trial 9's CL08), `deepspeed_hostfile`
    (DeepSpeed's multi-machine launcher) and `mpirun_hostfile` (mpirun). Relative paths are read from the current
    directory, as the launched processes and launchers read them.

    Args:
        value_of: the option's value as `accelerate launch` takes it (the command line's, else the config's) and how
            the message names it ([`check_launch_namespace`]).
        uses_deepspeed: whether the launch runs DeepSpeed (`distributed_type: DEEPSPEED` or `--use_deepspeed`): the
            DeepSpeed keys are read only then.
        num_machines: the launch's machines (`deepspeed_hostfile` is read only for more than one).

    Raises:
        ValueError: naming the option (or the config file and its key), the missing path and the fix.
    """
    read = {
        "deepspeed_config_file": uses_deepspeed,
        "deepspeed_hostfile": uses_deepspeed and num_machines > 1,
        "mpirun_hostfile": True,
    }
    for name, used in read.items():
        value, shown = value_of(name)
        if not used or value is None or os.path.isfile(str(value)):
            continue
        if name == "deepspeed_config_file" and is_inline_deepspeed_config(str(value)):
            continue
        where = (
            ""
            if os.path.isabs(str(value))
            else f" (a relative path is read from the current directory, {os.getcwd()})"
        )
        what = "a directory" if os.path.isdir(str(value)) else "no such file"
        raise ValueError(
            f"{shown}: {what}{where}; accelerate would read it only after the launch. Fix: give the path of an "
            f"existing file as {name}, or leave {name} out."
        )


def warn_launch_resources(value_of: Callable[[str], tuple[object, str]]) -> None:
    """Warn, before the launch, when the launch asks for hardware this machine does not have (it still runs, so it is
    not refused): `--gpu_ids` without a visible GPU (the run uses the CPU; trial 9's CM16), and more processes than
    GPUs, or on a machine without GPUs more processes than CPU cores (TRL's `multi_gpu` config, `num_processes: 8`,
    started 8 gloo processes on 2 cores; trial 9's CD07).

    Args:
        value_of: the option's value as `accelerate launch` takes it (the command line's, else the config's) and how
            the message names it ([`check_launch_namespace`]).
    """
    import torch

    log = logging.getLogger(__name__)
    gpus = torch.cuda.device_count()
    cores = cpu_cores()
    gpu_ids, shown = value_of("gpu_ids")
    if gpu_ids is not None and str(gpu_ids) != "all" and gpus == 0:  # `all`: whatever there is (TRL's configs)
        log.warning(
            "%s is set, but no GPU is visible here (torch.cuda.device_count() is 0), so the run uses the CPU.", shown
        )
    processes, shown = value_of("num_processes")
    if not isinstance(processes, int) or processes <= 1:
        return
    if gpus and processes > gpus:
        log.warning(
            "%s starts %d processes, and this machine has %d GPU(s) visible: processes would share a GPU or find "
            "none. Fix: --num_processes %d (one per GPU).",
            shown,
            processes,
            gpus,
            gpus,
        )
    elif not gpus and processes > cores:
        log.warning(
            "%s starts %d processes, and this machine has no GPU visible and %d CPU core(s): the %d processes share "
            "the cores, each far slower than one (a config written for %d GPUs?). Fix: --num_processes %d (or fewer).",
            shown,
            processes,
            cores,
            processes,
            processes,
            cores,
        )


LAUNCHER_ERRORS = (ValueError, AssertionError, RuntimeError, OSError, TypeError)
"""What `accelerate launch` raises, before it starts a process, for options and config values it refuses (its own
checks are `assert`s, `ValueError`s and `RuntimeError`s; `ConnectionError` for a port in use): the command prints the
text as one error. Errors inside the launched processes come back as `CalledProcessError` (one process) or torch's
`ChildFailedError` (several), with the process's exit status."""


def run_here(job: Job, job_args: Sequence[str]) -> int:
    """Run `job` in this process, as its example script does (logging at INFO, or at the job's explicit `--log_level`
    once parsed; interrupts and the process group handled by `trl_trapo.jobs.main.exits_cleanly`).

    Returns:
        The job's exit status (0, or 2 after a user error).

    Raises:
        SystemExit: for `--help`, a malformed command line or an interrupt, as the example script exits.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from trl_trapo.jobs.main import exits_cleanly

    run = importlib.import_module(job.module).run
    with exits_cleanly():
        status = run(list(job_args), program=f"trapo {job.name}")
    return status


def main(argv: Sequence[str] | None = None, launch: Callable[[argparse.Namespace], object] | None = None) -> int:
    """The `trapo` command.

    Args:
        argv: the arguments without the program name (default `sys.argv[1:]`).
        launch: runs the `accelerate launch` arguments (default accelerate's `launch_command`); a test passes its own.

    Returns:
        The exit status: 0 after `trapo` alone (its help) or a complete job, 2 after a user error (an argument
        before the command, a launcher option or accelerate config `accelerate launch` would refuse, or the job's);
        after a launch, the exit status of a process that failed.
    """
    # before torch loads (OpenMP reads it then), as the example scripts do: waiting threads sleep (docs/threads.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # `trapo --max_steps 2 train`; `trapo --version` prints the version (argparse's version action)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        names = [j.name for j in JOBS]
        command = next((token for token in argv if token in names), None)
        if command is None:
            fix = f"write the command first: `trapo {{{','.join(names)}}} {' '.join(argv)}`"
        else:
            rest = list(argv)
            rest.remove(command)
            fix = f"write `trapo {command} {' '.join(rest)}`"
        print(
            f"trapo: error: {argv[0]} comes before the command; the job's arguments and the launcher's options follow "
            f"it. Fix: {fix}.",
            file=sys.stderr,
        )
        return 2
    if argv and argv[0] in TRL_COMMANDS:  # `trapo grpo ...`: TRL's habit, one line more than argparse's refusal
        parser.print_usage(sys.stderr)
        print(trl_command_error(argv[0], [j.name for j in JOBS]), file=sys.stderr)
        return 2
    args, _ = parser.parse_known_args(argv[:1])
    if args.command is None:
        parser.print_help()
        return 0
    job = next(j for j in JOBS if j.name == args.command)
    try:
        launch_args, job_args = split_launch_args(argv[1:])
        namespace = launch_namespace(job, launch_args, job_args) if launch_args else None
    except ValueError as error:
        print(f"trapo {job.name}: error: {error}", file=sys.stderr)
        return 2
    if namespace is None:
        return run_here(job, job_args)
    if launch is None:
        from accelerate.commands.launch import launch_command as launch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch(namespace)
    except subprocess.CalledProcessError as error:  # one process: accelerate's launcher raises its exit status
        return error.returncode
    except ChildFailedError as error:  # several: each process printed its own error; torch's table adds nothing
        rank, failure = error.get_first_failure()
        logging.getLogger(__name__).debug("process %d failed: %s", rank, failure)
        return failure.exitcode if isinstance(failure.exitcode, int) and failure.exitcode > 0 else 1
    except LAUNCHER_ERRORS as error:  # accelerate refused an option or config value before starting a process
        print(f"trapo {job.name}: error: `accelerate launch` refused the launch: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
