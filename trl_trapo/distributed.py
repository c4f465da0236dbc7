# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""What TRAPO needs to run the same on 1 process, DDP, DeepSpeed ZeRO-2/3 and FSDP.

- `check_launch`: fail fast when accelerate sees another number of processes than were launched (on machines without
  an accelerator accelerate silently runs independent copies unless told to use gloo, see
  `TRAPOConfig._cpu_distributed_defaults`), when DeepSpeed was asked for and is off, or when `accelerate launch
  --num_processes 2` started one process only (`check_processes_started`).
- `any_rank`: a boolean OR over ranks, for decisions every rank must take together (a generation round gathers ZeRO-3
  weights, a collective); `max_over_ranks` the same with a number (the signal that stops a run, see `interrupts.py`).
- `check_world_environment`: refuses a `WORLD_SIZE` above 1 that no launcher set (no `MASTER_ADDR`): left over in a
  shell, it failed in accelerate with a fix (export `MASTER_ADDR`) that makes a lone process wait.
- `rendezvous_notice`: says once, when joining the process group has waited long, which processes it waits for and
  where those numbers came from (variables left over from a torchrun shell made a lone `python` wait 30 min in
  silence).
- `end_process_group`: an orderly end of the process groups before the interpreter exits (every gloo group's
  collectives finished, gloo's worker threads parked: no rank aborts at exit).
- `zero3_reference_copy`, `full_state_dict`, `load_full_state_dict`: a frozen reference made from a ZeRO-3-partitioned
  policy without a deep copy, and its state saved / restored parameter by parameter (never a whole gathered model);
  `cpu_copy`: one tensor's full CPU copy, gathered first when ZeRO-3 partitioned it (the asynchronous producer's
  weights).
- `restore_kernel_functions`: gives models built after DeepSpeed's `zero.Init` undid a kernelized class's `__init__`
  (a VLM's language model imported while ZeRO-3 built it) the kernel functions their `forward` reads.
- `register_ddp_comm_hook`: registers PyTorch's fp16 / bf16 / PowerSGD DDP communication hooks through accelerate's
  `DistributedDataParallelKwargs.register_comm_hook` on the model the Trainer wrapped (called by
  `callbacks.DDPCommHookCallback` at the start of training: the Trainer builds its `Accelerator` and its DDP kwargs
  itself, with no public way to pass a hook, so the hook is registered after preparation, before the first backward).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading

import torch
from accelerate.state import PartialState
from accelerate.utils import (
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    parse_flag_from_env,
)
from torch import nn


logger = logging.getLogger(__name__)

COMM_HOOKS = {
    "fp16": DDPCommunicationHookType.FP16,
    "bf16": DDPCommunicationHookType.BF16,
    "powersgd": DDPCommunicationHookType.POWER_SGD,
}


MULTI_PROCESS_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")  # torchrun / MPI


RENDEZVOUS_NOTICE_S = 30.0  # how long joining the process group waits before `rendezvous_notice` speaks (s)


@contextlib.contextmanager
def rendezvous_notice(after_s: float | None = None):
    """Around code that may join the process group (accelerate's `PartialState`, built by `TrainingArguments`):
    when the environment names a world of several processes and the join has not finished after `after_s` seconds,
    log once which processes it waits for, where those numbers came from, and the fix.

    torch's env:// rendezvous waits up to 30 minutes without a word for ranks that never come, e.g. when `WORLD_SIZE`,
    `RANK` and `MASTER_PORT` are left over from a torchrun or job-script shell and the script was started with plain
    `python` (trial 10's CX03). A launch where the other processes come late (another node still starting) sees
    the notice and goes on; nothing is stopped.

    Args:
        after_s: seconds before the notice (default `RENDEZVOUS_NOTICE_S`).
    """
    after_s = RENDEZVOUS_NOTICE_S if after_s is None else after_s
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        world = 1
    if world <= 1 or (torch.distributed.is_available() and torch.distributed.is_initialized()):
        yield
        return
    joined = threading.Event()

    def notice() -> None:
        if joined.wait(after_s):
            return
        env = {name: os.environ.get(name, "unset") for name in ("RANK", "MASTER_ADDR", "MASTER_PORT")}
        logger.warning(
            "Waiting %.0f s so far for the other processes of a run of WORLD_SIZE=%d (this one is RANK=%s; meeting at "
            "%s:%s), all from the environment; torch waits up to 30 minutes. If you did not start those processes "
            "(variables left over from a torchrun or job-script shell), stop this run and `unset WORLD_SIZE RANK "
            "LOCAL_RANK MASTER_ADDR MASTER_PORT`, or start every process with `accelerate launch --num_processes %d "
            "...`.",
            after_s,
            world,
            env["RANK"],
            env["MASTER_ADDR"],
            env["MASTER_PORT"],
            world,
        )

    watcher = threading.Thread(target=notice, name="trapo-rendezvous-notice", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        joined.set()


LEFTOVER_LAUNCH_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT")
"""The variables a launcher (torchrun, `accelerate launch`) sets for each process it starts, besides `MASTER_ADDR`:
the ones [`check_world_environment`] names when they are left over in a shell."""


def check_world_environment() -> None:
    """Refuse, before anything slow, a `WORLD_SIZE` above 1 that no launcher set: no process group already formed and
    no `MASTER_ADDR` (torchrun and `accelerate launch` set it, with `MASTER_PORT`, whenever they set `WORLD_SIZE`; a
    job script that sets `WORLD_SIZE` for `srun` must set it too, or torch's env:// rendezvous cannot start).

    Such a `WORLD_SIZE` is left over in the shell (trial 11's C05): on the CPU accelerate refused it with "Tried to
    launch on distributed with multinode, but `MASTER_ADDR` env was not set, please try exporting ...", and exporting
    `MASTER_ADDR` would make this lone process wait for ranks that never come (see [`rendezvous_notice`]); on a GPU
    the run failed in torch's rendezvous or at `check_launch` with a fix for another mistake. A process group the
    script formed itself, XLA, MPI (torch's MPI backend needs no `MASTER_ADDR`) and AzureML / SageMaker (whose
    environments DeepSpeed and accelerate read) are left alone. A `WORLD_SIZE` that is not a whole number is refused
    too (accelerate and this package read it with `int`).

    Raises:
        ValueError: naming the variables that are set and their values, and the fixes (`unset ...` to train in this
            process; a launcher for several).
    """
    raw = os.environ.get("WORLD_SIZE")
    if raw is None:
        return
    set_here = [name for name in LEFTOVER_LAUNCH_ENV if name in os.environ]
    shown = ", ".join(f"{name}={os.environ[name]!r}" for name in set_here)
    try:
        world = int(raw)
    except ValueError:
        raise ValueError(
            f"The environment variable WORLD_SIZE={raw!r} is not a whole number (set here: {shown}). It is the number "
            "of processes a launcher started (torchrun and `accelerate launch` set it). Fix: `unset "
            f"{' '.join(set_here)}` to train in this process, or launch several, e.g. `accelerate launch "
            "--num_processes 2 ...` / `trapo train --num_processes 2 ...`."
        ) from None
    if world <= 1 or os.environ.get("MASTER_ADDR"):
        return
    if torch.distributed.is_available() and (
        torch.distributed.is_initialized() or torch.distributed.is_mpi_available()
    ):
        return
    if "AZUREML_EXPERIMENT_ID" in os.environ or "SM_TRAINING_ENV" in os.environ:
        return
    from transformers.utils import is_torch_xla_available

    if is_torch_xla_available():
        return
    others = "the other process" if world == 2 else f"the {world - 1} others"
    raise ValueError(
        f"The environment says this process is one of {world} processes (set here: {shown}), but MASTER_ADDR, "
        "where they meet, is not set: no launcher started this process (torchrun and `accelerate launch` set "
        f"MASTER_ADDR and MASTER_PORT with WORLD_SIZE), so {others} will never come (exporting MASTER_ADDR would "
        "make this one wait for them). Fix: if these variables are left over in your shell, `unset "
        f"{' '.join(set_here)}` to train in this process; to train on {world} processes, start them with a launcher: "
        f"`accelerate launch --num_processes {world} script.py ...` or `trapo train --num_processes {world} ...` (on "
        "a machine without GPUs add `--multi_gpu`, docs/distributed.md)."
    )


def _launcher_num_processes(parent) -> str | None:
    """The `--num_processes` value on the launcher's command line, if it is there."""
    try:
        argv = parent.cmdline()
    except Exception:  # psutil.Error or a platform without it
        return None
    for i, arg in enumerate(argv):
        for flag in ("--num_processes", "--num-processes"):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def check_processes_started() -> None:
    """Raise if `accelerate launch` was asked for several processes but started only this one.

    Without `--multi_gpu` (or a config file with `distributed_type: MULTI_GPU`) on a machine without several GPUs,
    `accelerate launch --num_processes 2 script.py` runs the script once, as a single process: its "simple" launcher
    only exports `MASTER_ADDR` / `MASTER_PORT` (it sets them when asked for more than one process or machine) and no
    `WORLD_SIZE`. That is what is detected: a process started by accelerate's launcher (`ACCELERATE_DYNAMO_BACKEND` is
    set) with `MASTER_ADDR` but no world size, where `MASTER_ADDR` is not inherited from the launcher's own environment
    (a cluster script may export it for a one-process run). When the launcher's environment cannot be read, a warning
    is logged instead.

    Raises:
        ValueError: saying which flag to pass (`--multi_gpu`, or `--num_processes 1`); a ValueError like every other
            error about the user's input (the launch command is one).
    """
    env = os.environ
    if "ACCELERATE_DYNAMO_BACKEND" not in env or "MASTER_ADDR" not in env or any(k in env for k in MULTI_PROCESS_ENV):
        return
    import psutil

    parent, inherited, asked = None, None, None
    try:
        parent = psutil.Process(os.getppid())
        parent_env = parent.environ()
        inherited = (parent_env.get("MASTER_ADDR"), parent_env.get("MASTER_PORT")) == (
            env["MASTER_ADDR"],
            env.get("MASTER_PORT"),
        )
    except Exception as error:  # psutil.AccessDenied / NoSuchProcess, or no /proc
        logger.debug("Cannot read the launcher's environment: %s", error)
    if parent is not None:
        asked = _launcher_num_processes(parent)
    if inherited:
        return
    how_many = f"--num_processes {asked}" if asked else "several processes (or machines)"
    # accelerate refuses `--cpu` together with `--multi_gpu` ("You can only use one of ..."); `--multi_gpu` alone runs
    # its processes on the CPU when there is no GPU
    cpu = env.get("ACCELERATE_USE_CPU", "").lower() in ("true", "1", "yes")
    message = (
        f"`accelerate launch` was asked for {how_many} but started this process alone: without `--multi_gpu` (or a "
        "config file with `distributed_type: MULTI_GPU`) accelerate runs one process when it does not see several "
        f"GPUs. Pass `--multi_gpu`{' instead of `--cpu` (accelerate takes only one of them)' if cpu else ''}, e.g. "
        f"`accelerate launch --multi_gpu --num_processes {asked or 2} examples/trapo.py ...` (on a machine without "
        "GPUs TRAPO then runs DDP over gloo, on the CPU), or `--num_processes 1` for one process."
    )
    if inherited is None:  # could not tell whether MASTER_ADDR came from the launcher or from the user's environment
        logger.warning("%s (MASTER_ADDR=%s is set but not WORLD_SIZE.)", message, env["MASTER_ADDR"])
        return
    raise ValueError(message)


# accelerate's multi-process types that its `AcceleratorState` turns into FSDP when the launcher asks for it: an
# accelerator's (MULTI_GPU, MULTI_XPU, ...), never NO or MULTI_CPU (accelerate has no FSDP on the CPU)
FSDP_CAPABLE = frozenset(t for t in DistributedType if t.name.startswith("MULTI_") and t != DistributedType.MULTI_CPU)


def accelerator_distributed_type(state: PartialState) -> DistributedType:
    """The `distributed_type` the Trainer's `Accelerator` will have, read before it exists from the process state that
    `TrainingArguments` set up when the config was built (`TRAPOConfig.distributed_state`).

    As accelerate's `AcceleratorState.__init__` decides it (accelerate/state.py; the Trainer passes it no `cpu`, so
    only `ACCELERATE_USE_CPU` puts it on the CPU): DeepSpeed when the launcher asked for it (`ACCELERATE_USE_DEEPSPEED`)
    and `ACCELERATE_USE_CPU` is off, else FSDP when the launcher asked for it (`ACCELERATE_USE_FSDP`) and the process
    state is an accelerator's multi-process type (`FSDP_CAPABLE`), else the process state's own type. A state an
    `Accelerator` already turned (DeepSpeed, FSDP, XLA, Megatron-LM) keeps its type.

    Args:
        state (`accelerate.PartialState`): the process state (`TrainingArguments.distributed_state`).

    Returns:
        `accelerate.utils.DistributedType`.
    """
    kind = state.distributed_type
    if kind in (DistributedType.DEEPSPEED, DistributedType.FSDP, DistributedType.XLA, DistributedType.MEGATRON_LM):
        return kind
    on_cpu = parse_flag_from_env("ACCELERATE_USE_CPU")  # accelerate's `--cpu`
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and not on_cpu:
        return DistributedType.DEEPSPEED
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and kind in FSDP_CAPABLE:
        return DistributedType.FSDP
    return kind


def check_launch(state) -> None:
    """Raise if the process group does not match the launch.

    Called twice by `TRAPOTrainer`: first with the process state the config set up (`args.distributed_state`), before
    anything slow loads (`assembly.check_run`; the jobs call it before they build their data and models), then with
    the `Accelerator` the Trainer built. Every mismatch below is known from the process state already (FSDP and
    DeepSpeed as `accelerator_distributed_type` predicts them; the number of processes is the process group's).

    Args:
        state: an `accelerate.PartialState` (read as the `Accelerator` will turn it, `accelerator_distributed_type`),
            the `Accelerator` itself, or anything with its `distributed_type` and `num_processes`; `None` (no process
            state: SageMaker model parallelism) checks only that the launched processes started
            (`check_processes_started`).

    Raises:
        ValueError: if the launcher asked for FSDP or DeepSpeed and the run is not using it, if `WORLD_SIZE`
            processes were launched but accelerate sees another number, if several processes run without any data
            parallelism (the runs would be independent copies writing the same files), or if `accelerate launch` was
            asked for several processes and started one (`check_processes_started`). A ValueError, as every launch
            mistake of the user's: the main job prints it as one line and exits 2, without a traceback (trial 8's
            JC10; it was a RuntimeError, a `[rank0]` traceback and exit 1).
    """
    if state is None:
        check_processes_started()
        return
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    kind = accelerator_distributed_type(state) if isinstance(state, PartialState) else state.distributed_type
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and kind != DistributedType.FSDP:
        raise ValueError(
            f"The launcher asked for FSDP but the run uses {kind}: accelerate switches to FSDP only on GPU / XPU / "
            "NPU-like devices (its CPU multi-process mode has no FSDP). On CPU use DDP (`--multi_gpu`) or DeepSpeed "
            "(`DS_ACCELERATOR=cpu accelerate launch --use_deepspeed ...`)."
        )
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and kind != DistributedType.DEEPSPEED:
        raise ValueError(
            "The launcher asked for DeepSpeed but the run is not using it (accelerate's `--cpu` / `use_cpu=True` "
            "switches DeepSpeed off). On CPU run `DS_ACCELERATOR=cpu accelerate launch --use_deepspeed ...` without "
            "`--cpu`."
        )
    if (launched > 1 and state.num_processes != launched) or (state.num_processes > 1 and kind == DistributedType.NO):
        raise ValueError(
            f"{launched} processes were launched but accelerate sees {state.num_processes} ({kind}): they would "
            "train independently and overwrite each other's files. On a machine without GPUs pass `--use_cpu` (DDP "
            "over gloo) or, under DeepSpeed, `--ddp_backend gloo` (TRAPOConfig sets these itself when it sees the "
            "launch)."
        )
    check_processes_started()


def any_rank(accelerator, flag: bool) -> bool:
    """True on every rank if `flag` is true on any rank (one tiny all-reduce; free on one process)."""
    if accelerator.num_processes == 1:
        return bool(flag)
    value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(value, reduction="sum").item() > 0)


def sum_over_ranks(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over ranks, on the tensor's own device (collective; the tensor itself on one process)."""
    if accelerator.num_processes == 1:
        return tensor
    return accelerator.reduce(tensor.to(accelerator.device), reduction="sum").to(tensor.device)


def gather_across_ranks(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's `tensor` concatenated along dim 0 in rank order, the same on every rank (collective; the tensor
    itself on one process). Ranks may hold different numbers of rows; the result is on `tensor`'s device.

    Args:
        accelerator: the Trainer's `Accelerator`.
        tensor (`torch.Tensor`): `(n_r, ...)` on rank r; the trailing dimensions are the same on every rank.

    Returns:
        `torch.Tensor`: `(sum_r n_r, ...)`.
    """
    if accelerator.num_processes == 1:
        return tensor
    local = tensor.to(accelerator.device)
    sizes = accelerator.gather(torch.tensor([local.shape[0]], device=accelerator.device)).tolist()
    gathered = accelerator.gather(accelerator.pad_across_processes(local, dim=0))  # (world * max n_r, ...)
    parts = gathered.split(max(sizes)) if max(sizes) else [gathered[:0]] * len(sizes)
    return torch.cat([part[:n] for part, n in zip(parts, sizes)]).to(tensor.device)


def max_over_ranks(accelerator, value: int) -> int:
    """The largest of every rank's `value` (one tiny all-gather; free on one process). Collective: every rank must
    call it at the same point. Like `any_rank`, for a decision every rank takes together, with the value that decided
    it (e.g. which signal stopped the run)."""
    if accelerator.num_processes == 1:
        return int(value)
    gathered = accelerator.gather(torch.tensor([int(value)], dtype=torch.int64, device=accelerator.device))
    return int(gathered.max().item())


def _is_partitioned(param: torch.Tensor) -> bool:
    return hasattr(param, "ds_id")


def zero3_reference_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of a ZeRO-3-partitioned `PreTrainedModel`, built partitioned, filled parameter by parameter.

    `copy.deepcopy` of a partitioned model copies empty placeholders; this builds a fresh model of the same class
    from its config (transformers creates it under `deepspeed.zero.Init` while ZeRO-3 is configured) and copies each
    parameter while that one pair is gathered, so at most two full parameters are materialised at a time. Every rank
    must call it (gathering is collective).
    """
    import deepspeed

    reference = type(model)._from_config(model.config, dtype=next(model.parameters()).dtype)
    source = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in reference.named_parameters():
            with deepspeed.zero.GatheredParameters([source[name], param], modifier_rank=0):
                param.data.copy_(source[name].data)
        source_buffers = dict(model.named_buffers())
        for name, buffer in reference.named_buffers():
            if name in source_buffers:
                buffer.copy_(source_buffers[name])
    return reference.eval().requires_grad_(False)


KERNEL_FUNCS = "_kernel_funcs"  # where `kernels.use_kernelized_func` keeps an instance's kernel functions


def restore_kernel_functions(*models: nn.Module | None) -> int:
    """Give the modules of `models` the per-instance kernel functions their class's `forward` reads, where DeepSpeed's
    `zero.Init` left a class without the `__init__` that creates them.

    With the `kernels` package installed, transformers decorates attention classes (`LlamaAttention`,
    `Qwen2Attention`, ...) with `kernels.use_kernelized_func`, which replaces both `__init__` (each instance gets its
    own `_kernel_funcs`, one wrapper per kernel function) and `forward` (which reads them). `deepspeed.zero.Init`
    (0.19) patches the `__init__` of every `nn.Module` subclass, also of a class *defined* while it is active (through
    `__init_subclass__`, which runs before class decorators), and on exit puts back the `__init__` it saw then: the
    undecorated one. A model class first imported inside `zero.Init` — a LLaVA's language model, which
    `LlavaModel.__init__` builds with `AutoModel.from_config` while ZeRO-3 builds the VLM — keeps its kernelized
    `forward` but loses the `__init__` that feeds it. The policy built then is whole; every instance built later (a
    ZeRO-3 reference rebuilt from the config or loaded by id, a teacher or reward model of the same class) failed at
    its first forward: "'LlamaAttention' object has no attribute '_kernel_funcs'".

    A module whose class has whole instances among `models` (the policy's) but which has no kernel functions itself
    gets fresh wrappers of the same functions, as the decorator's `__init__` gives them: one new instance of each
    wrapper's class. Nothing else changes; without the `kernels` package, or when every module is whole, nothing
    happens. Call it on every model before its first forward.

    Args:
        *models (`nn.Module | None`): the models (None is skipped).

    Returns:
        `int`: the number of modules given their kernel functions (each repair is logged once per class).
    """
    wholes: dict[type, dict] = {}  # class -> the kernel functions of one whole instance
    modules = [module for model in models if model is not None for module in model.modules()]
    for module in modules:
        if isinstance(vars(module).get(KERNEL_FUNCS), dict):
            wholes.setdefault(type(module), vars(module)[KERNEL_FUNCS])
    repaired: dict[type, int] = {}
    for module in modules:
        funcs = wholes.get(type(module))
        if funcs is not None and KERNEL_FUNCS not in vars(module):
            vars(module)[KERNEL_FUNCS] = {name: type(func)() for name, func in funcs.items()}
            repaired[type(module)] = repaired.get(type(module), 0) + 1
    for cls, count in repaired.items():
        logger.info(
            "%d %s modules, built after DeepSpeed's zero.Init undid their class's kernels `__init__`, were given their "
            "kernel functions (%s).",
            count,
            cls.__name__,
            ", ".join(wholes[cls]),
        )
    return sum(repaired.values())


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy of `tensor`, whole: a ZeRO-3-partitioned parameter is gathered for the copy
    (`deepspeed.zero.GatheredParameters`, one parameter at a time) and released after it.

    Collective when `tensor` is partitioned: every rank must call it for the same parameter at the same point.
    """
    if not _is_partitioned(tensor):
        return tensor.detach().to("cpu", copy=True)
    import deepspeed

    with deepspeed.zero.GatheredParameters([tensor]):
        return tensor.data.detach().to("cpu", copy=True)


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of every state-dict entry of `module`, gathering ZeRO-3 partitions one parameter at a time.

    Collective under ZeRO-3: every rank must call it.
    """
    out = {}
    for name, value in module.state_dict(keep_vars=True).items():
        if _is_partitioned(value):
            import deepspeed

            with deepspeed.zero.GatheredParameters([value]):
                out[name] = value.data.detach().cpu().clone()
        else:
            out[name] = value.detach().cpu().clone()
    return out


def load_full_state_dict(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load full tensors (from `full_state_dict`) into `module`, ZeRO-3 partitions included; missing keys are kept.

    Collective under ZeRO-3: every rank must call it with the same keys.
    """
    with torch.no_grad():
        for name, target in module.state_dict(keep_vars=True).items():
            if name not in state:
                continue
            if _is_partitioned(target):
                import deepspeed

                with deepspeed.zero.GatheredParameters([target], modifier_rank=0):
                    target.data.copy_(state[name].to(target.dtype))
            else:
                target.data.copy_(state[name].to(target.device, target.dtype))


def generation_synced_gpus(accelerator, gathered: bool, lockstep: bool = False) -> bool | None:
    """`synced_gpus` for `generate`: False when the weights are local (no collective inside a forward, so ranks may
    generate different numbers of tokens and batches); None (transformers decides: True for ZeRO-3 / FSDP on several
    processes) when forwards gather weights and every rank must run them in lockstep.

    `lockstep=True` (every rank makes this `generate` call together, e.g. a turn of the tool-calling loop): None under
    ZeRO-3 even with the weights gathered. A generation context that follows another one without a training step in
    between (the loop's next turn) starts with DeepSpeed's parameter trace invalidated (TRL's `add_hooks` does it on
    leaving the context), and DeepSpeed's forward pre-hook broadcasts while it re-records the trace, in the first
    forwards: a rank that stops after one token while another goes on would wait in that broadcast forever."""
    from trl.distributed import DistributedBackend

    backend = DistributedBackend(accelerator)
    if backend.is_fsdp or (backend.is_zero3 and (not gathered or lockstep)):
        return None
    return False


def bf16_comm_hook_problem() -> str | None:
    """Why PyTorch's bf16 DDP communication hook cannot be registered with this torch, or None when it can.

    The condition is PyTorch's own (`DistributedDataParallel._check_comm_hook`, read at registration, i.e. at the start
    of training on every rank): a CUDA / ROCm build of torch with NCCL >= 2.10, or XPU with XCCL. It depends on the
    installed torch only, so a config can be refused at construction.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return "this torch has no torch.distributed"
    gpu_build = torch.version.cuda is not None or torch.version.hip is not None
    if gpu_build and dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10):
        return None
    if dist.is_xccl_available() and torch.xpu.is_available():
        return None
    if not gpu_build:
        return f"this torch ({torch.__version__}) is a CPU build, without NCCL, and no XPU with XCCL is available"
    if not dist.is_nccl_available():
        return f"this torch ({torch.__version__}) has no NCCL, and no XPU with XCCL is available"
    nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return f"this torch's NCCL is {nccl} (< 2.10), and no XPU with XCCL is available"


def register_ddp_comm_hook(model: nn.Module, name: str, powersgd_rank: int, powersgd_start_iter: int) -> None:
    """Register the DDP communication hook `name` ("fp16", "bf16" or "powersgd") on a DDP-wrapped `model`.

    A second call on the same wrapper does nothing (the hook is registered once; the wrapper remembers its name).
    """
    if getattr(model, "trapo_comm_hook", None) is not None:  # a second `train()` on the same wrapper
        return
    state_option = {}
    if name == "powersgd":
        state_option = {"matrix_approximation_rank": powersgd_rank, "start_powerSGD_iter": powersgd_start_iter}
        if torch.distributed.get_backend() == "gloo":
            logger.warning(
                "PowerSGD on gloo: its collectives run in future callbacks and can interleave with DDP's other "
                "collectives in a different order on different ranks (pytorch/pytorch#58467). Use one gradient "
                "bucket (--ddp_bucket_cap_mb larger than the gradients) and --ddp_find_unused_parameters false."
            )
    DistributedDataParallelKwargs(comm_hook=COMM_HOOKS[name], comm_state_option=state_option).register_comm_hook(model)
    model.trapo_comm_hook = name
    logger.info("Registered the DDP communication hook %r.", name)


def end_process_group() -> None:
    """End the process groups in order before the interpreter exits (a no-op without a process group).

    Call it once at the end of a multi-process script, after its last collective, on every rank. In this order:

    1. a barrier on every other gloo group this rank is in, in the order they were created (the same on every rank,
       so no two ranks wait on each other crosswise): DeepSpeed keeps its own clone of the world group
       (`deepspeed.utils.groups`), on which ZeRO-3 gathers and prefetches parameters asynchronously; the world
       group's barrier does not wait for those, and they could still be exchanging data when the process exits;
    2. a barrier on the default group, then `torch.distributed.destroy_process_group()`;
    3. a wait until gloo's worker threads are parked ([`wait_for_idle_gloo_workers`]).

    Why: a gloo worker thread that releases the last reference to a tensor Python owned needs the GIL; during
    interpreter finalisation it cannot take it, and the process aborts with SIGABRT, "terminate called without an
    active exception" (pytorch/pytorch#190489; an `atexit` fix in PyTorch itself, pytorch/pytorch#179291, was
    abandoned). Destroying a group joins its workers only once nothing references it, and groups other libraries
    keep stay referenced until the interpreter exits: DeepSpeed holds every ZeRO-3 model in a module-level list
    (`FWD_MODULE_STACK`), and its partitioned parameters hold the cloned group (`ds_process_group`). So the groups'
    collectives are finished first (1, 2), then the workers are given the time to drop what they hold (3): under
    load a worker can be descheduled between finishing a collective and releasing it, and the tests' ZeRO-3 jobs
    aborted at exit about once a loaded CI run.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    for group in gloo_subgroups():
        dist.barrier(group=group)
    dist.barrier()
    dist.destroy_process_group()
    if not wait_for_idle_gloo_workers():
        logger.debug("gloo's worker threads were still busy %.0f s after the process group ended", IDLE_WAIT_S)


_exit_registered = False
_unhandled_exception = False


def end_process_group_at_exit() -> None:
    """Run [`end_process_group`] when the interpreter exits normally, for scripts that do not call it themselves
    (a TRL script: `trainer.train()`, then the script's end). Called at the end of `TRAPOTrainer.train`, once
    training has finished on every rank ([`~trl_trapo.callbacks.EndProcessGroupAtExitCallback`]); registered once per
    process, a no-op without a process group of several.

    At exit it does nothing after an exception nobody caught (`sys.excepthook` ran): that rank's peers may wait for
    it in another collective, and a barrier would pair with it. Otherwise every rank reaches its exit handlers after
    the script's last collective, as `end_process_group` needs: a ZeRO-3 script whose ranks ended without it aborted
    at exit now and then (tests/test_distributed_jobs.py's VLM script under ZeRO-3, once in three runs of the default
    suite on 2026-12-05).
    """
    global _exit_registered
    if _exit_registered or not in_process_group_of_several():
        return
    _exit_registered = True
    previous_hook = sys.excepthook

    def note_unhandled(*exc_info) -> None:
        global _unhandled_exception
        _unhandled_exception = True
        previous_hook(*exc_info)

    sys.excepthook = note_unhandled

    def at_exit() -> None:
        if _unhandled_exception:
            return
        try:
            end_process_group()
        except Exception as error:  # a peer already gone: nothing left to wait for
            logger.debug("end_process_group at exit: %s", error)

    atexit.register(at_exit)


def in_process_group_of_several() -> bool:
    """Whether this process is one rank of an initialised `torch.distributed` process group of two or more."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")
"""Texts of gloo's error when another rank's process ended during a collective this rank waits in (torch raises it
as a `RuntimeError`, or its `DistError` subclasses)."""


def lost_peer(error: BaseException) -> bool:
    """Whether `error` is a collective failing because another rank's process ended (see [`PEER_LOST`]): that rank
    printed the cause; this rank's traceback only shows where it waited."""
    return isinstance(error, RuntimeError) and any(text in str(error) for text in PEER_LOST)


def exit_failed_rank(status: int) -> None:
    """End this process now, with exit status `status`, when it is one rank of a multi-process run; return otherwise
    (one process, or no process group yet: every rank fails alike there and exits normally).

    Call it on a rank that failed (a user error it reported, an exception), instead of [`end_process_group`]. The other
    ranks are waiting for it in a collective (the step's all-gather of rewards, DDP's parameter check at construction),
    or soon will be, and `end_process_group`'s barriers would make this rank wait for them in turn: the run hung until
    gloo's 30-minute timeout, or forever. Exiting at once lets the launcher (torchrun, under `accelerate launch`) see
    the failure and end the other ranks. stdout, stderr and the log handlers are flushed first; the interpreter's
    finalisation is skipped (`os._exit`), since a process group still alive at exit can abort it (SIGABRT, see
    [`end_process_group`]), which would replace `status`.

    Args:
        status: the exit status (nonzero: the launcher takes the first failed rank's as the run's).
    """
    import sys

    if not in_process_group_of_several():
        return
    logger.debug(
        "rank %d failed: exiting with status %d without waiting for the others", torch.distributed.get_rank(), status
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can be said on it
            pass
    os._exit(status)


def gloo_subgroups() -> list:
    """The gloo process groups other than the default one that this rank is a member of, in creation order.

    Read from torch's registry of groups (`torch.distributed.distributed_c10d._world.pg_map`, which
    `destroy_process_group` clears); torch has no public list of the groups a process created. Empty when that
    registry is not there (another torch), so [`end_process_group`] falls back to the default group's barrier.
    """
    import torch.distributed as dist

    registry = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", None)
    if not isinstance(registry, dict):
        return []
    world = dist.group.WORLD
    return [group for group in registry if group is not world and dist.get_backend(group) == "gloo"]


IDLE_WAIT_S = 10.0  # the most `wait_for_idle_gloo_workers` waits (s); parked workers are seen within ~40 ms
GLOO_WORKER_NAME = "pt_gloo_runloop"  # the name torch gives gloo's worker threads (ProcessGroupGloo::runLoop)


def gloo_worker_activity() -> dict[str, tuple[str, int]] | None:
    """Each gloo worker thread of this process: its scheduler state (`R` running, `S` sleeping, ...) and how many
    times it has been switched out, from `/proc/self/task` (Linux).

    Returns:
        `{thread id: (state, context switches)}`, or None where `/proc` is not there.
    """
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return None
    activity = {}
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/status", encoding="utf-8") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        if fields.get("Name", "").strip() != GLOO_WORKER_NAME:
            continue
        switches = sum(int(fields.get(key, "0")) for key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        activity[thread] = (fields.get("State", "?").strip()[:1], switches)
    return activity


def wait_for_idle_gloo_workers(timeout_s: float = IDLE_WAIT_S, interval_s: float = 0.02) -> bool:
    """Wait until every gloo worker thread of this process is parked: sleeping, and not switched in once during an
    interval in which this thread released the GIL (`time.sleep`), so a worker waiting for the GIL would have run.
    After [`end_process_group`]'s barriers no collective is left, so a parked worker waits for work that will not come
    and holds none.

    Args:
        timeout_s: the most to wait (s).
        interval_s: the interval between two looks at the threads (s).

    Returns:
        True once every worker is parked (at once without gloo workers, or without `/proc`), False on the timeout.
    """
    import time

    deadline = time.monotonic() + timeout_s
    previous = None
    while True:
        activity = gloo_worker_activity()
        if not activity:  # no gloo worker (or no /proc to look at them)
            return True
        if activity == previous and all(state == "S" for state, _ in activity.values()):
            return True
        if time.monotonic() >= deadline:
            return False
        previous = activity
        time.sleep(interval_s)


def reduce_replay_metrics(accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """`ReplayBuffer.metrics` over all ranks: `replay/size` and `replay/bytes` summed, the per-trajectory means
    (`replay/reuse_mean`, `replay/age_mean`, `replay/compressed`) weighted by each rank's size. Collective."""
    if accelerator.num_processes == 1:
        return metrics
    size = metrics["replay/size"]
    means = ("replay/reuse_mean", "replay/age_mean", "replay/compressed")
    local = torch.tensor([size, metrics["replay/bytes"], *(metrics[k] * size for k in means)], dtype=torch.float64).to(
        accelerator.device
    )
    total = accelerator.reduce(local, reduction="sum").cpu().tolist()
    out = {"replay/size": total[0], "replay/bytes": total[1]}
    out.update({k: (v / total[0] if total[0] else 0.0) for k, v in zip(means, total[2:])})
    return out


def reduce_named_means(accelerator, values: dict[str, list[float]]) -> dict[str, float]:
    """Mean of every named list over all ranks (names may differ across ranks, e.g. metrics a reward function logs
    with `log_metric`). Collective on several processes."""
    local = {name: (sum(v), len(v)) for name, v in values.items() if v}
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        merged: dict[str, list[float]] = {}
        for part in gather_object([local]):
            for name, (total, count) in part.items():
                merged.setdefault(name, [0.0, 0])
                merged[name][0] += total
                merged[name][1] += count
        local = merged
    return {name: total / count for name, (total, count) in sorted(local.items()) if count}
