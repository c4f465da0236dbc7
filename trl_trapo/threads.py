# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""How many CPU threads torch uses in each process of a run, chosen on purpose (`TRAPOConfig.torch_threads`).

torch starts every process with one intra-op thread per physical core of the machine, whatever else runs there.
`accelerate launch` and `torchrun` set `OMP_NUM_THREADS` for the processes they start (accelerate: physical cores ÷
processes per node on a CPU launch, 1 otherwise), but a script run with `python` keeps torch's default, and an async
run (`async_rollouts=True`) adds a producer process with threads of its own. OpenMP's threads spin while they wait for
each other (libgomp's default), so when another process takes one of the cores a team counts on, every parallel region
waits for the thread that was descheduled while its partners burn the other cores: on a 2-core machine with a busy
loop on one core, the main job's 30 steps trained in 138-308 s with torch's 2 threads against 10-21 s with one, and in
11 s with 2 threads that wait passively (`OMP_WAIT_POLICY=PASSIVE`; `scripts/benchmarks/benchmark_threads.py`,
docs/threads.md).

So, unless the user chose (`OMP_NUM_THREADS` / `MKL_NUM_THREADS` set, or `torch.set_num_threads` called), the trainer
sets its threads at construction ([`choose_torch_threads`]):

- **share** = max(1, usable cores ÷ processes this run starts on this node): the trainer processes of the node
  (`LOCAL_WORLD_SIZE`, set by torchrun and accelerate; 1 without a launcher) and, with `async_rollouts=True`, one
  producer per trainer process. Usable cores are the CPUs this process may run on (`os.sched_getaffinity`, so a
  container's or `taskset`'s limit counts), counted as physical cores (`psutil`: hyper-threads share a core's units).
- A process whose OpenMP threads **spin** while they wait (no `OMP_WAIT_POLICY=PASSIVE` in its environment) takes one
  thread less when the shares would fill every core, so that one core stays free for the rest of the machine; one
  that waits passively takes its full share. The wait policy is read by OpenMP when torch loads, so only a process
  whose environment has it from the start can have it: the example jobs set `OMP_WAIT_POLICY=PASSIVE` (unless it is
  set) before they import torch, and the producer process is started with it ([`passive_waiting_for_children`]);
  a script of the user's that builds a `TRAPOTrainer` keeps OpenMP's default unless its launcher sets it.
- The producer gets `async_producer_threads`, or by default the same share ([`ThreadChoice.producer_threads`]).

The choice is logged once per process (again only when it changes). `torch_threads=N` sets N threads in every
process of the run (the producer included, unless `async_producer_threads` is set); `torch_threads=0` leaves torch's
threads alone everywhere: the trainer keeps what it has (before this module, every job did), the producer gets torch's
default unless `async_producer_threads` is set (it used to get 1).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch


logger = logging.getLogger(__name__)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what torch reads for its intra-op threads
# what decides how OpenMP threads wait (libgomp reads the first two, LLVM's and Intel's OpenMP the last)
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


@dataclass(frozen=True)
class ThreadChoice:
    """What [`choose_torch_threads`] did in this process.

    Attributes:
        threads (`int`): torch's intra-op threads in this process after the call (`torch.get_num_threads()`).
        producer_threads (`int | None`): torch threads for the async producer process when `async_producer_threads`
            is not set: the producer's share when TRAPO chose, this process's threads when the user set them, None
            with `torch_threads=0` (the producer keeps torch's default).
        chosen (`bool`): True when this call set the threads (`torch_threads` None or N >= 1), False when it left
            them as they were.
        reason (`str`): one sentence for the log: what was decided and why.
    """

    threads: int
    producer_threads: int | None
    chosen: bool
    reason: str


_chosen_here: int | None = None  # the number this module last set in this process (recognised as ours, not the user's)
_logged: str | None = None  # the last reason logged (logged once, again only when it changes)


def usable_cores() -> int:
    """The physical cores this process may run on: its CPU affinity (`os.sched_getaffinity`; `os.cpu_count()` where
    the platform has none) divided by the hyper-threads per core (`psutil.cpu_count(logical=True)` /
    `psutil.cpu_count(logical=False)`), at least 1."""
    try:
        logical = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        logical = os.cpu_count() or 1
    try:
        import psutil  # a dependency of accelerate

        per_core = max(1, (psutil.cpu_count(logical=True) or 1) // (psutil.cpu_count(logical=False) or 1))
    except ImportError:
        per_core = 1
    return max(1, logical // per_core)


def torch_default_threads() -> int:
    """The intra-op threads torch gives a process when nothing sets them: `at::get_num_interop_threads()`'s default,
    which torch computes with the same function (`TaskThreadPoolBase::defaultNumThreads`, the machine's physical
    cores). If the inter-op threads were changed, it no longer is, and [`user_thread_setting`] errs on the side of
    leaving torch's threads alone."""
    return torch.get_num_interop_threads()


def user_thread_setting() -> str | None:
    """How the user set torch's threads in this process, or None if they did not.

    Returns:
        `"OMP_NUM_THREADS=4 is set"` (or `MKL_NUM_THREADS`) when the variable is set (launchers set it too),
        `"torch.set_num_threads(3) was called"` when torch's threads differ both from torch's default ([`torch_default_threads`])
        and from what this module set; None otherwise (a `torch.set_num_threads` call with torch's default number is
        indistinguishable from none).
    """
    for name in THREAD_VARIABLES:
        if os.environ.get(name, "").strip():
            return f"{name}={os.environ[name]} is set"
    current = torch.get_num_threads()
    if current not in (_chosen_here, torch_default_threads()):
        return f"torch.set_num_threads({current}) was called"
    return None


def waits_passively(environ: dict[str, str] | None = None) -> bool:
    """Whether OpenMP threads of a process with this environment (default: this process's) sleep while they wait:
    `OMP_WAIT_POLICY=PASSIVE`, or `GOMP_SPINCOUNT=0`. OpenMP reads them when torch loads; a change made later does
    not count, but cannot be seen here."""
    environ = os.environ if environ is None else environ
    return (
        environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"
        or environ.get("GOMP_SPINCOUNT", "").strip() == "0"
    )


def thread_share(cores: int, processes: int, spinning: bool) -> int:
    """Torch threads for one of `processes` processes on `cores` cores: max(1, cores // processes), one less for a
    process whose threads spin while they wait when the shares would fill every core (module docstring).

    Raises:
        ValueError: if `cores` or `processes` is below 1.
    """
    if cores < 1 or processes < 1:
        raise ValueError(
            f"thread_share needs cores >= 1 and processes >= 1, got cores={cores}, processes={processes}."
        )
    share = max(1, cores // processes)
    if spinning and share > 1 and share * processes >= cores:
        share -= 1
    return share


def local_trainer_processes() -> int:
    """Training processes on this node: `LOCAL_WORLD_SIZE` (torchrun, accelerate), 1 when it is not set."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else 1


def choose_torch_threads(setting: int | None, producers_per_process: int = 0) -> ThreadChoice:
    """Set this process's torch threads as `TRAPOConfig.torch_threads` says (module docstring) and log it once.

    Args:
        setting (`int | None`): `TRAPOConfig.torch_threads`. None: choose the share unless the user set the threads
            (`OMP_NUM_THREADS` / `MKL_NUM_THREADS`, `torch.set_num_threads`); 0: leave them alone; N >= 1: set N.
        producers_per_process (`int`): processes each trainer process starts that compute (1 with
            `async_rollouts=True`, else 0).

    Returns:
        A [`ThreadChoice`].

    Raises:
        ValueError: if `setting` is negative.
    """
    global _chosen_here, _logged
    if setting is not None and setting < 0:
        raise ValueError(f"torch_threads={setting}: use None (TRAPO chooses), 0 (torch's default) or N >= 1.")
    cores = usable_cores()
    processes = local_trainer_processes() * (1 + producers_per_process)
    producer_share = thread_share(cores, processes, spinning=False)  # the producer is started waiting passively
    user = user_thread_setting()
    if setting == 0:
        threads, producer, chosen = torch.get_num_threads(), None, False
        reason = f"torch_threads=0: torch's threads left as they are ({threads} in this process)."
    elif setting is not None:
        threads, producer, chosen = setting, setting, True
        reason = f"torch_threads={setting}: {setting} torch threads per process"
    elif user is not None:
        threads, producer, chosen = torch.get_num_threads(), torch.get_num_threads(), False
        reason = f"{user}: torch's threads left at {threads} in this process (torch_threads=N overrides it)."
    else:
        threads, producer, chosen = thread_share(cores, processes, not waits_passively()), producer_share, True
        if waits_passively():
            waiting = " (its OpenMP threads wait passively: OMP_WAIT_POLICY=PASSIVE)"
        elif threads < thread_share(cores, processes, spinning=False):
            waiting = (
                ", one core left free because its OpenMP threads spin while they wait (start python with "
                "OMP_WAIT_POLICY=PASSIVE to use it)"
            )
        else:
            waiting = ""
        reason = (
            f"{threads} torch thread(s) in this process: {cores} usable core(s) for {processes} process(es) of this "
            f"run on this node{waiting}. Set TRAPOConfig.torch_threads (0: torch's default) or OMP_NUM_THREADS to "
            "choose otherwise"
        )
    if chosen:
        if producers_per_process:
            reason += f"; the rollout producer: {producer}"
        reason += "."
        torch.set_num_threads(threads)
        _chosen_here = threads
    if reason != _logged:
        (logger.info if chosen else logger.debug)(reason)
        _logged = reason
    return ThreadChoice(threads=torch.get_num_threads(), producer_threads=producer, chosen=chosen, reason=reason)


@contextlib.contextmanager
def passive_waiting_for_children() -> Iterator[None]:
    """Within the block, processes started (`spawn` copies `os.environ`) get `OMP_WAIT_POLICY=PASSIVE`, unless the
    user set one of `WAIT_VARIABLES`; `os.environ` is restored when the block ends, also on error."""
    if any(os.environ.get(name, "").strip() for name in WAIT_VARIABLES):
        yield
        return
    previous = os.environ.get("OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("OMP_WAIT_POLICY", None)
        else:
            os.environ["OMP_WAIT_POLICY"] = previous


__all__ = [
    "ThreadChoice",
    "choose_torch_threads",
    "local_trainer_processes",
    "passive_waiting_for_children",
    "thread_share",
    "torch_default_threads",
    "usable_cores",
    "user_thread_setting",
    "waits_passively",
]
