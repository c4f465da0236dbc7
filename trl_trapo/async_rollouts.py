# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts: a producer process samples and scores rounds while the trainer trains.

`TRAPOConfig(async_rollouts=True)` replaces the default rollout source by an [`AsyncRolloutSource`]. It has the
default source's prompts (the memory pool's RL prompt sampler) and temperatures (targeted exploration), but a round is
*asked for* before the replay buffer runs dry and sampled by a **producer**: a separate process (started with
`spawn`, so it has its own interpreter and its own torch threads: by default its share of the cores, waiting
passively, [`~trl_trapo.threads`]; `async_producer_threads` sets them) that holds a copy of the policy and runs the
run's rollout source on it: the class the synchronous path runs (the default source, the tool-calling loop of `tools` /
`environment_factory`, TRL's `rollout_func`), built there from its picklable settings
([`~trl_trapo.executor.SourceSpec`]) and fed the prompts and temperatures the trainer chose, with the behaviour
log-probs recorded while sampling; it then calls the reward functions on rounds the source did not score. The trainer takes finished rounds in order from a queue and finishes each itself
([`~trl_trapo.rollout.RolloutEngine.finish`]): reference and teacher log-probs, critic values, the missing-stop
penalty, guidance, advantages and every statistic over a round or across processes (collectives stay in the trainer).

**When a round is asked for.** Each optimizer step the trainer calls `prefetch(rows_needed, step, remaining)`, with
`remaining` the servings the replay buffer still holds (`ReplayBuffer.remaining_uses`). The source keeps asking for
rounds while the steps that the buffer and the rounds in flight can feed (`servings / rows_needed`) are at most
`max_staleness`: a round asked for at step `s` is then consumed at most `max_staleness` steps later, when the buffer
runs dry, so its **lag** (the step that consumes it minus the version of the weights that sampled it) is bounded. Its
trajectories are then served up to `num_ppo_epochs` times, as in synchronous training; `replay/age_mean` is their age
at each use. The decision depends only on the training state, never on timing; the producer's speed decides only how
long the trainer waits (`perf/rollout_wait_s`). With `max_staleness=0` nothing is asked for ahead: the producer then
samples while the trainer waits, as synchronous training does.

**Weights.** Before a round is asked for, the producer is sent the trained weights if `weight_sync_steps` steps have
passed since the last send: the trainable parameters only (a LoRA run sends its adapter), copied into shared memory
(`perf/weight_sync_s`). In the deterministic mode (`async_deterministic=True`, the default) weights and requests
travel in one FIFO queue, so every round is sampled with exactly the weights sent before it was asked for, with an RNG
seeded by `(seed, rank, round)`: a run does not depend on timing. In the free-running mode the weights travel on a
queue of their own and the producer takes the newest it has when it starts a round (fresher, not reproducible).
Under DeepSpeed ZeRO-3 (`weight_snapshots=True`) reading the weights is a gather every rank must enter together, so
they are taken on a schedule every rank reaches ([`~trl_trapo.callbacks.WeightSnapshotCallback`]: at the start of
training and every `weight_sync_steps` optimizer steps) and a round is sampled with the last snapshot, up to
`weight_sync_steps - 1` steps old; `prefetch` and `sample` never read the policy.

**vLLM server** (`use_vllm=True, vllm_mode="server"`). The producer holds no copy of the policy: it sends each
round's prompts (token ids) to the server through TRL's `VLLMClient` ([`sample_from_server`]: one request per prompt
with `n` = its group, concurrently, each seeded from the round's seed), cuts the completions after the stop token and
calls the reward functions. The trainer pushes the weights to the server itself ([`~trl_trapo.rollout.VLLMGenerator`]
`.push_weights`, TRL's `VLLMGeneration.sync_weights`: every parameter, LoRA merged, over NCCL) when the producer
starts and every `weight_sync_steps` steps, and sends the producer only the version number. The server's log-probs
are another engine's, so they always reach the trainer as `sampler_per_token_logps` (the trainer recomputes PPO's
old log-probs; `async_correction="behaviour"` is refused with vLLM). In the deterministic mode a push must not change
the weights under a round being sampled: before pushing, the trainer waits until the producer has finished every
round asked for (`perf/rollout_wait_s`). This gives up part of the overlap: with `weight_sync_steps=1` the producer
can run at most about one optimizer step ahead; `weight_sync_steps=k` lets it run ahead between pushes. Rounds are
seeded but vLLM's sampling is reproducible only as far as its kernels are batch-invariant. In the free-running mode the
weights are pushed whenever due, also while a round is being sampled (such a round is stamped with the version the
producer knew when it started it, so its lag is an upper bound). One training process only; a checkpoint's older
producer weights (`weight_sync_steps > 1`) are not restored, the server gets the resumed step's.

**Staleness.** The forecast errs when a step's RL rows change (the curriculum, DARE): when they shrink, the buffer
lasts longer than forecast, so the trainer also takes a round *before* the buffer runs dry when one step more would
make it later than `max_staleness` (`round_due`; its trajectories join what the buffer still holds, served least used
first). A round whose lag still exceeds `max_staleness` (e.g. weights older than `max_staleness` because
`weight_sync_steps` is larger) is dropped and counted (`sample/dropped_stale_total`), or with
`stale_rollouts="downweight"` trained with its loss weighted by `(max_staleness + 1) / (lag + 1)`. The correction of
the gap between the producer's policy and the trained one is `async_correction`: "decoupled" returns the producer's
log-probs as `sampler_per_token_logps` (the trainer recomputes the proximal log-probs and weights the loss by the
truncated ratio, `vllm_importance_sampling_*`; AReaL, huggingface.co/papers/2505.24298 eq. 5), "behaviour" as PPO's
old log-probs (the clipped ratio against the sampling policy is the only correction).

**Checkpoints.** `checkpoint_state` first waits for the rounds in flight and keeps them, finished, in the checkpoint, with
the round counter, the last weights version sent and, when that version is older than the checkpoint's step
(`weight_sync_steps > 1`), those weights (under ZeRO-3: the last snapshot): a resumed run consumes exactly the rounds
an uninterrupted one would, and in the deterministic mode trains to the same parameters.

Metrics (TRL's names where TRL has them): `sample/staleness_mean`, `sample/staleness_max` (lag of the rounds that
arrived, in optimizer steps), `sample/dropped_stale_total` (rounds dropped since the start of the run),
`perf/rollout_wait_s` (seconds the trainer waited for rounds in the logging window), `perf/weight_sync_s` (seconds
spent sending weights), `perf/rollout_wait_share` (waited share of the window's wall time), `perf/producer_generate_s`
and `perf/producer_reward_s` (the producer's seconds per round).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import copy
import dataclasses
import hashlib
import inspect
import logging
import math
import os
import pickle
import pickletools
import queue
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn
from transformers import TrainerState

from .config import DEFAULT_MAX_STALENESS
from .distributed import cpu_copy
from .executor import (
    ProducerAccelerator,
    ProducerTrainer,
    RequestedPrompts,
    SourceContext,
    SourceSpec,
    producer_engine,
)
from .interrupts import ignore_stop_signals
from .memory.replay import steps_covered
from .sources import RolloutSource, SampledRound
from .threads import passive_waiting_for_children


logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # how often a waiting side checks that the other is alive


class ProducerError(RuntimeError):
    """The producer process failed (its traceback is in the message) or died."""


def check_picklable(funcs: list, what: str = "reward function") -> None:
    """Refuse, by name, what cannot reach a producer process (it is started with `spawn`, so it gets pickled copies).

    Raises:
        ValueError: naming the object and the fix, if `pickle.dumps` fails on it (a lambda, a local function, an
            object holding a lock or an open connection); naming each, with its fix, when several cannot
            ([`refuse_unpicklable`]).
    """
    refuse_unpicklable([(what, funcs)])


@dataclass
class Unpicklable:
    """Why one object cannot reach the producer ([`unpicklable`]): `problem` names it and says why (a sentence), `fix`
    says what to do, `imported` whether the producer would import it by name (an object of `__main__`), `error` is
    `pickle`'s exception (None when pickling worked but the producer could not look the object up)."""

    what: str
    problem: str
    fix: str
    imported: bool
    error: BaseException | None = None


def unpicklable(funcs: list, what: str = "reward function") -> list[Unpicklable]:
    """The objects of `funcs` (one kind, `what`: "reward function", "tool", "environment factory", "rollout_func")
    that cannot reach a producer process started with `spawn`, each with why and its fix; [] when all can. Modules
    (reward models) are rebuilt from their weights, not pickled: never listed."""
    from .rewards import reward_function_name

    found = []
    for func in funcs:
        if isinstance(func, nn.Module):
            continue
        name = reward_function_name(func)
        try:
            data = pickle.dumps(func)
        except Exception as error:  # pickle raises PicklingError, AttributeError, TypeError ...
            found.append(
                Unpicklable(
                    what,
                    f"{what} {name!r} cannot be pickled ({type(error).__name__}: {error}).",
                    "Define it at module level (a `def` or an instance of a module-level class, importable by the "
                    "producer)",
                    imported=False,
                    error=error,
                )
            )
            continue
        hidden = main_names_hidden_from_spawn(data) if main_importable_by_spawn() else []
        if hidden:
            # `spawn` runs the main script again as `__mp_main__`, without its `if __name__ == "__main__":` block
            found.append(
                Unpicklable(
                    what,
                    f"{what} {name!r} is defined in the main script ({sys.modules['__main__'].__file__}) only under "
                    f'`if __name__ == "__main__":` or inside a function ({hidden[0]!r} is not defined at its module '
                    "level), where the producer cannot import it.",
                    "Fix: define it at module level (or in a module you import)",
                    imported=True,
                )
            )
        elif not main_importable_by_spawn() and pickle_references_main(data):
            # pickled by reference to `__main__`, which a spawned process rebuilds only by running the main script:
            # there is none, so the producer would die looking it up (and blame a missing `__main__` guard)
            found.append(
                Unpicklable(
                    what,
                    f"{what} {name!r} is defined in `__main__` of a session that has no script file (`python -c`, a "
                    "notebook, an interactive session), so that process cannot import it.",
                    "Fix: define it in a module (e.g. `my_rewards.py`, then `from my_rewards import ...`)",
                    imported=True,
                )
            )
    return found


def refuse_unpicklable(groups: Sequence[tuple[str, list]]) -> None:
    """Refuse, in one message, every object of `groups` (`(what, objects)` pairs: the reward functions, then the
    source's parts, [`~trl_trapo.executor.SourceSpec.picklable_parts`]) that cannot reach the producer process: a run
    with a lambda reward and a local `rollout_func` learns of both at once (trial 12's N49), not one per run.

    Raises:
        ValueError: for one such object, naming it, why and the fix; for several, one line and fix each. Chained
            from the first one's pickling error, if it had one.
    """
    found = [problem for what, objects in groups for problem in unpicklable(list(objects), what)]
    if not found:
        return
    first_error = next((problem.error for problem in found if problem.error is not None), None)

    def plural(what: str) -> str:  # "the rollout_func": a run has one
        return what if what == "rollout_func" else what[:-1] + "ies" if what.endswith("y") else what + "s"

    if len(found) == 1:
        (one,) = found
        how = ", which imports them by name," if one.imported else ","
        raise ValueError(
            f"async_rollouts=True runs the {plural(one.what)} in a producer process{how} but {one.problem} {one.fix}, "
            "or set async_rollouts=False."
        ) from first_error
    kinds = [f"the {kind}" for kind in dict.fromkeys(plural(problem.what) for problem in found)]
    kinds_text = kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + f" and {kinds[-1]}"
    raise ValueError(
        f"async_rollouts=True runs {kinds_text} in a producer process, which gets pickled copies of them (a "
        f"function is imported there by name), but {len(found)} of them cannot reach it; fix each, or set "
        "async_rollouts=False:" + "".join(f"\n- {problem.problem} {problem.fix}." for problem in found)
    ) from first_error


def main_importable_by_spawn() -> bool:
    """Whether a process started with `spawn` rebuilds this session's `__main__` module: run as `python -m module`
    (imported by name) or `python script.py` (run from its file). Not for `python -c`, a notebook or an interactive
    session (no file: `spawn` skips it) nor a script fed on stdin (`python - < s.py`: its file `<stdin>` does not
    exist). Mirrors `multiprocessing.spawn.get_preparation_data`."""
    main = sys.modules.get("__main__")
    if main is None:
        return False
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    return bool(path) and os.path.isfile(path)


def pickle_references_main(data: bytes) -> bool:
    """Whether the pickle `data` refers to an object of the `__main__` module by name (a function or class defined
    there, also inside a `functools.partial` or as an instance's class): it is then looked up when unpickled."""
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name == "GLOBAL" and isinstance(arg, str) and arg.split(" ", 1)[0] == "__main__":  # protocols 0-3
            return True
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE") and arg == "__main__":  # STACK_GLOBAL's module
            return True
    return False


def main_names_hidden_from_spawn(data: bytes) -> list[str]:
    """The names of `__main__` the pickle `data` refers to that a process started with `spawn` will not find: `spawn`
    runs the main script again as `__mp_main__`, without its `if __name__ == "__main__":` block, so a function or
    class defined only there (W01, W03 of trial 5) is missing in the producer. Read from the main script's source:
    the names bound at its module level (`def`, `class`, assignments, imports, also inside other `if` / `try` /
    `with` blocks) outside a main guard. Empty when the script cannot be read or parsed (the producer still names
    what it could not import)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    wanted, previous = [], None
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name == "GLOBAL" and isinstance(arg, str) and arg.split(" ", 1)[0] == "__main__":  # protocols 0-3
            wanted.append(arg.split(" ", 1)[1])
        elif opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            if previous == "__main__":  # STACK_GLOBAL: the module, then the qualified name
                wanted.append(arg)
            previous = arg
        elif opcode.name != "MEMOIZE":  # the module's string is memoized before the name is pushed
            previous = None
    if not wanted or not path:
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    defined = set()

    def bind(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If) and not _is_main_guard(node.test):
                bind(node.body + node.orelse)
            elif isinstance(node, (ast.Try, ast.With, ast.For, ast.While)):
                handlers = [h for t in getattr(node, "handlers", []) for h in t.body]
                bind(node.body + handlers + getattr(node, "orelse", []) + getattr(node, "finalbody", []))

    bind(tree.body)
    return [name for name in wanted if name.split(".", 1)[0] not in defined]


def _is_main_guard(test: ast.expr) -> bool:
    """Whether an `if` test reads `__name__ == "__main__"` (either way round)."""
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and {ast.unparse(test.left), ast.unparse(test.comparators[0])} == {"__name__", "'__main__'"}
    )


def check_main_guard() -> None:
    """Refuse, before anything is loaded, a main script that builds an asynchronous trainer as it runs, outside `if
    __name__ == "__main__":`. The producer is started with `spawn`, which imports the main script again: the import
    would build and train a second trainer inside the producer, which fails with multiprocessing's "bootstrapping
    phase" error (whose first lines name `freeze_support()`) and dozens of lines of tracebacks.

    Looks for the frame of the main script's module level in the call stack (none: the trainer is built from an
    imported module's function called later, `python -c`, a notebook) and, in the script's source, for an `if
    __name__ == "__main__":` block around its current line. A script fed on standard input (`python - < s.py`, whose
    file `<stdin>` the producer cannot run again) is refused too.

    Raises:
        ValueError: naming the script, the line and the fix; or saying that a script on standard input has no file.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path and not main_importable_by_spawn():  # `python - < script.py`: `spawn` runs the file "<stdin>" again
        raise ValueError(
            f"async_rollouts=True samples in a producer process started with `spawn`, which runs the main script "
            f"again from its file, but this script has no file ({path!r}: fed on standard input, `python - < "
            "script.py`), so the producer would die at its start. Fix: save the script and run it as `python "
            'script.py` (with the training under `if __name__ == "__main__":`), or set async_rollouts=False.'
        )
    if main is None or not path or not os.path.isfile(path):
        return  # `python -c`, a notebook, an interactive session: `spawn` imports no script
    frame = inspect.currentframe()
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:
        return
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return  # the runtime check in `AsyncRolloutSource._start` still names the guard
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            if node.body[0].lineno <= line <= node.body[-1].end_lineno:
                return
    raise ValueError(
        f"async_rollouts=True samples in a producer process started with `spawn`, which imports the main script "
        f"({path}) again; this script builds the trainer as it runs (line {line}), outside `if __name__ == "
        '"__main__":`, so that import would build and train a second trainer inside the producer. Fix: put the code '
        'that builds and trains the trainer under `if __name__ == "__main__":` (docs/async.md), or set '
        "async_rollouts=False."
    )


def round_seed(seed: int, rank: int, index: int) -> int:
    """The sampling seed of round `index` of rank `rank` (deterministic mode): a function of the three numbers only."""
    digest = hashlib.sha256(f"trl-trapo-round:{seed}:{rank}:{index}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


@dataclass
class ProducerSpec:
    """Everything the producer process builds itself from (pickled once, when it starts).

    `model` is the policy's [`PolicyBlueprint`] (a transformers or PEFT model) or a CPU copy of it (eval mode, any
    other module), None when a vLLM server samples (`server`); `suppress_token_ids` are suppressed in a rebuilt copy
    (a VLM's image placeholders); `funcs`,
    `processing_classes`, `weights` are the reward functions / models, their tokenizers and weights as the trainer's
    [`~trl_trapo.rewards.RewardScorer`] has them; `num_threads` are the producer's torch threads (None: torch's
    default, or `OMP_NUM_THREADS` inherited from the trainer's environment).
    """

    model: PolicyBlueprint | nn.Module | None
    tokenizer: Any
    generation_config: Any
    pad_token_id: int
    stop_token_ids: list[int]
    batch_size: int
    funcs: list
    processing_classes: list
    weights: list[float]
    reward_batch_size: int
    device: str
    num_threads: int | None
    version: int
    deterministic: bool
    server: VLLMServerSpec | None = None
    suppress_token_ids: list[int] = field(default_factory=list)
    args: Any = None  # the run's TRAPOConfig (read only): the producer's engine and a rollout_func read it
    rank: int = 0
    source: SourceSpec | None = None  # the rollout source the producer builds and runs (trl_trapo/executor.py)


@dataclass
class VLLMServerSpec:
    """How the producer samples through a vLLM server (`use_vllm=True, vllm_mode="server"`).

    `sampling` holds `VLLMClient.generate`'s keyword arguments other than the prompts, `n` and `temperature`
    (`top_p`, `top_k`, `max_tokens`, `logprobs=0`, `generation_kwargs` with the stop tokens); `client_factory(url,
    timeout)` returns the client (TRL's `VLLMClient` by default, [`open_vllm_client`]); `model` names the policy in
    messages; at most `max_concurrency` requests are in flight at once (TRL's client pools 64 connections).
    """

    url: str
    timeout: float
    model: str
    sampling: dict
    client_factory: Callable[[str, float], Any]
    max_concurrency: int = 64


def open_vllm_client(url: str, timeout: float):
    """TRL's `VLLMClient` at `url`, after waiting up to `timeout` seconds for the server (the producer's client: HTTP
    only, it never joins the weight-transfer group)."""
    from trl.generation.vllm_client import VLLMClient

    return VLLMClient(base_url=url, connection_timeout=timeout)


def unit_seed(seed: int, unit: int) -> int:
    """The vLLM seed of request `unit` of a round seeded `seed` (vLLM seeds the `n` completions of a request
    `seed, seed + 1, ...`; distinct requests get unrelated seeds, so equal prompts never draw equal completions)."""
    digest = hashlib.sha256(f"trl-trapo-request:{seed}:{unit}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def sample_from_server(
    client, server: VLLMServerSpec, prompt_ids: list[list[int]], temperatures: list[float], group: int, seed: int,
    stop_token_ids: list[int],
) -> dict:  # fmt: skip
    """Sample one completion per row through the vLLM server: one request per prompt with `n` = its `group` rows
    when they share a temperature (vLLM takes one temperature per request), else one request per row; requests go
    concurrently (vLLM batches them), each with its own seed from the round's.

    Returns:
        dict like [`~trl_trapo.rollout.generate`]'s: `completion_ids` cut after their stop token, `old_per_token_logps`
        the server's log-probs of them (nats, vLLM's `processed_logprobs`: after temperature and top-k / top-p),
        `seconds`.

    Raises:
        VLLMServerError: naming `vllm_server_base_url`, when the server does not answer.
        RuntimeError: when the server returns no log-probs.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .rollout import (
        VLLMServerError,
        cut_after_stop,
        sampled_token_logps,
        unreachable_errors,
        vllm_server_unreachable,
    )

    start = time.perf_counter()
    units: list[tuple[list[int], float]] = []  # (rows, temperature): the rows share one prompt and one temperature
    for first in range(0, len(prompt_ids), group):
        rows = [r for r in range(first, min(first + group, len(prompt_ids))) if prompt_ids[r] == prompt_ids[first]]
        if len(rows) == group and len({temperatures[r] for r in rows}) == 1:
            units.append((rows, temperatures[first]))
        else:
            units.extend(([r], temperatures[r]) for r in range(first, min(first + group, len(prompt_ids))))

    def send(k: int) -> dict:
        rows, temperature = units[k]
        kwargs = dict(server.sampling)
        kwargs["generation_kwargs"] = {**kwargs.get("generation_kwargs", {}), "seed": unit_seed(seed, k)}
        return client.generate(prompts=[prompt_ids[rows[0]]], n=len(rows), temperature=float(temperature), **kwargs)

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(server.max_concurrency, len(units)))) as executor:
            outputs = list(executor.map(send, range(len(units))))
    except unreachable_errors() as error:
        raise VLLMServerError(
            vllm_server_unreachable(server.url, server.timeout, server.model, "from the rollout producer", error)
        ) from error
    completion_ids: list[torch.Tensor | None] = [None] * len(prompt_ids)
    logps: list[torch.Tensor | None] = [None] * len(prompt_ids)
    for (rows, _), output in zip(units, outputs):
        if output["logprobs"] is None:
            raise RuntimeError(
                f"The vLLM server at {server.url} returned no log-probs; the asynchronous producer needs them (the "
                "sampler/trainer mismatch correction). Serve with `trl vllm-serve` (it sets `--logprobs-mode "
                "processed_logprobs --max-logprobs -1`)."
            )
        for row, ids, lp in zip(rows, output["completion_ids"], sampled_token_logps(output["logprobs"])):
            cut = cut_after_stop(torch.tensor(list(ids), dtype=torch.long), stop_token_ids)
            completion_ids[row], logps[row] = cut, lp[: cut.numel()]
    return {"completion_ids": completion_ids, "old_per_token_logps": logps, "seconds": time.perf_counter() - start}


@dataclass
class Request:
    """One round asked for: dataset indices of its prompts, each repeated `group` times, and per-row temperatures."""

    index: int  # the round's number on this rank, from 0
    indices: list[int]
    group: int
    temperatures: list[float]
    seed: int
    step: int  # the optimizer step that asked for it
    version: int  # the weights version sent before it (the deterministic mode samples with exactly these)
    rows_needed: int = 0  # the RL rows of the step that asked for it (what the source's `sample` is called with)


@dataclass
class Produced:
    """A round as the producer returns it (CPU tensors): what the rollout source's `sample` returned, scored."""

    index: int
    version: int  # the weights version that sampled it
    completion_ids: list[torch.Tensor]
    logps: list[torch.Tensor] | None  # (C_i,) each: see `logps_kind`
    scores: torch.Tensor
    per_func: torch.Tensor
    generate_seconds: float
    reward_seconds: float
    reward_metrics: dict[str, list[float]] = field(default_factory=dict)
    logps_kind: str = "behaviour"  # "behaviour": the producer's copy recorded them while sampling; "sampler": another
    # engine's (a rollout_func's `logprobs`); ignored when `logps` is None
    completion_mask: list[torch.Tensor] | None = None  # (C_i,) each, 0 on the environment's tokens; None: all 1
    prompt_ids: list[torch.Tensor] | None = None  # (P_i,) each as the source rendered them (tools); None: the rows'
    examples: list[dict] | None = None  # the rows as the source returned them, when it changed them (an
    # environment's observation, a rollout_func's extra columns); None: the requested rows
    temperatures: list[float] | None = None  # (B,) each row's; None: the request's


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters (`requires_grad`), detached CPU copies, by name: what a weight sync sends (a PEFT
    model's adapter only). Under ZeRO-3 each partitioned parameter is gathered for its copy
    ([`~trl_trapo.distributed.cpu_copy`]): a collective, so every rank calls it together (the weight snapshots'
    schedule, [`AsyncRolloutSource.take_weight_snapshot`])."""
    return {n: cpu_copy(p) for n, p in model.named_parameters() if p.requires_grad}


@dataclass
class PolicyBlueprint:
    """The producer's sampling copy of a transformers policy, as class + config + weights, built in the producer.

    A pickled module carries its forward hooks, and transformers installs local closures as hooks the first time a
    forward records outputs (`output_hidden_states`; a LLaVA's vision tower at every image forward): such a policy
    cannot be pickled ("Can't pickle local object ... output_capturing_hook"), and a copy that dropped them would
    lose the hidden states the model reads. Built fresh in the producer, the model installs its own hooks when it
    needs them. Training-only hooks (activation checkpointing, input embeddings requiring grad) are not rebuilt.

    `model_class(config)` builds the model (for a PEFT policy: its base model, then `get_peft_model(...,
    peft_config, adapter_name)`); `state` holds every tensor of the policy's `state_dict()` as a detached CPU copy,
    tensors that shared storage (tied embeddings) still sharing it; they are assigned with their own dtypes.
    """

    model_class: type
    config: Any
    state: dict[str, torch.Tensor]
    peft_config: Any = None
    adapter_name: str = "default"

    @staticmethod
    def parts(policy: nn.Module) -> tuple[nn.Module, Any, str] | None:
        """`(base model, peft_config, adapter_name)` of a policy a blueprint can describe (a `PreTrainedModel`, not
        quantized, or a `PeftModel` with one adapter over one; `peft_config` None without PEFT), else None."""
        from transformers import PreTrainedModel

        peft_config, adapter_name, base = None, "default", policy
        try:
            from peft import PeftModel
        except ImportError:  # pragma: no cover - peft is a dependency
            PeftModel = ()
        if isinstance(policy, PeftModel):
            if len(policy.peft_config) != 1:
                return None
            adapter_name, peft_config = next(iter(policy.peft_config.items()))
            base = policy.get_base_model()
        if not isinstance(base, PreTrainedModel) or getattr(base.config, "quantization_config", None) is not None:
            return None
        return base, peft_config, adapter_name

    @classmethod
    def of(cls, policy: nn.Module) -> PolicyBlueprint | None:
        """The blueprint of `policy` (see [`parts`]), or None for any other module (the producer then gets a pickled
        copy). Under ZeRO-3 each partitioned parameter is gathered for its copy, one at a time: a collective, so
        every rank calls it together."""
        described = cls.parts(policy)
        if described is None:
            return None
        base, peft_config, adapter_name = described
        copies: dict[tuple, torch.Tensor] = {}  # by storage: tied tensors stay one tensor
        state = {}
        for name, tensor in policy.state_dict(keep_vars=True).items():
            if hasattr(tensor, "ds_id"):  # a ZeRO-3 partition (a placeholder): tied names share the parameter
                key = ("zero3", id(tensor))
                if key not in copies:
                    copies[key] = cpu_copy(tensor)
            else:
                key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                       tensor.stride())  # fmt: skip
                if key not in copies or not tensor.numel():
                    copies[key] = tensor.detach().to("cpu", copy=True)
            state[name] = copies[key]
        return cls(type(base), copy.deepcopy(base.config), state, copy.deepcopy(peft_config), adapter_name)

    def build(self) -> nn.Module:
        """The policy, in eval mode, on the CPU.

        Raises:
            RuntimeError: if the built model's tensors do not match `state` by name (missing or unexpected keys).
        """
        try:
            from transformers.initialization import no_init_weights
        except ImportError:  # transformers < 5: random initialisation, then overwritten (slower, same result)
            no_init_weights = contextlib.nullcontext

        with no_init_weights():  # every parameter is assigned from `state` below
            model = self.model_class(self.config)
        if self.peft_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, copy.deepcopy(self.peft_config), adapter_name=self.adapter_name)
        model.load_state_dict(self.state, strict=True, assign=True)
        tie = getattr(model, "tie_weights", None)
        if callable(tie):
            tie()
        return model.eval()


def _load_weights_into_state(target: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    """Copy `state` (parameters by name, as [`trainable_state`] sends them) into a blueprint's `target` tensors, in
    place (a tied tensor is updated under all its names)."""
    with torch.no_grad():
        for name, value in state.items():
            target[name].copy_(value.to(target[name].dtype))


def _load_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))


def abandoned_by_trainer(abandon) -> Callable[[], str | None] | None:
    """The producer's `stopping` (a tool-calling source's, [`~trl_trapo.agents.ToolRunner`]): a reason once the
    trainer has set `abandon` (a `multiprocessing` event; None: never)."""
    if abandon is None:
        return None
    return lambda: "the trainer is stopping (SIGINT / SIGTERM received)" if abandon.is_set() else None


def producer_main(spec: ProducerSpec, requests, weights_queue, results, stop=None, abandon=None) -> None:
    """The producer process: build the model, the reward scorer and the run's rollout source (`spec.source`, the
    class the synchronous path runs, trl_trapo/executor.py), then serve requests until `None` arrives.

    Messages in: `("weights", version, state)` and `("round", Request, rows)` on `requests` (`rows`: the dataset row of
    each of the request's prompts; in the free-running mode the weights come on `weights_queue`; with a vLLM server
    `state` is None: the trainer pushed the weights to the server, the message only says which version it holds).
    Messages out on `results`: `("round", Produced)` or `("error", index, traceback, summary)` (`summary`: a complete
    message for the user, or None).

    A round is the source's `sample(request.rows_needed, request.step)` on the request's prompts and temperatures
    ([`~trl_trapo.executor.RequestedPrompts`]), its engine's generator and torch's seeded with the round's seed, scored
    here by the reward functions when the source did not score it. With a vLLM server, the default source's round is
    sampled through the server ([`sample_from_server`]) instead.
    The process ignores SIGINT / SIGTERM / SIGHUP (`interrupts.ignore_stop_signals`: the trainer decides when it
    stops, its checkpoint waits for the rounds in flight; a closed terminal signals the whole process group) and exits
    when the trainer's process is gone. Once `abandon` (an event) is set, the trainer is stopping
    on SIGINT / SIGTERM: the tool-calling source abandons its tool calls still running (and runs none not started),
    so that the rounds the trainer's last step and checkpoint wait for arrive.

    Stopping ([`ProducerProcess.shutdown`]): once `stop` (an event) is set, the rounds and weights still queued are
    read and skipped, not sampled, up to `None`. The process then waits for its results queue's feeder thread to
    hand over what it holds (the trainer reads it while it waits) before it exits: a thread left running while the
    interpreter shuts down is stopped where it stands, and one inside torch's copy into shared memory (which runs
    without the GIL) aborts the process with "terminate called without an active exception". Tensors are moved to
    shared memory by the thread that sends them ([`share_in_this_thread`]) for the same reason.
    """
    from .rewards import RewardScorer, discard_extra
    from .rollout import VLLMServerError, unreachable_errors, vllm_server_unreachable

    ignore_stop_signals()  # SIGINT / SIGTERM / SIGHUP: the trainer's to act on (interrupts.py)
    parent = os.getppid()
    index = -1
    scorer = source = None
    try:
        if spec.num_threads is not None:
            torch.set_num_threads(spec.num_threads)
        model = client = None
        if spec.server is None:
            if isinstance(spec.model, PolicyBlueprint):
                model = spec.model.build()
                if spec.suppress_token_ids:  # the policy's hook is not in a rebuilt copy
                    from .vision import suppress_tokens

                    suppress_tokens(model, spec.suppress_token_ids)
            else:  # a pickled copy keeps the policy's (picklable) hooks
                model = spec.model
            model = model.to(spec.device).eval()
        else:
            server = spec.server
            try:
                client = server.client_factory(server.url, server.timeout)
            except unreachable_errors() as error:
                raise VLLMServerError(
                    vllm_server_unreachable(
                        server.url, server.timeout, server.model, "from the rollout producer", error
                    )
                ) from error
        version = spec.version
        collected: dict[str, list[float]] = {}
        state_snapshot = {"global_step": 0}

        def log_metric(name: str, value: float) -> None:
            collected.setdefault(name, []).append(float(value))

        scorer = RewardScorer(
            spec.funcs,
            spec.processing_classes,
            spec.weights,
            spec.tokenizer,
            spec.reward_batch_size,
            log_metric,
            discard_extra,
            # what a reward function gets as `trainer_state` in the producer: a `TrainerState` (every field TRL's
            # has, as in the training process) at the step that asked for the round
            lambda: TrainerState(**state_snapshot),
        )
        requested = RequestedPrompts(spec.source.first_row)
        engine = trainer_view = None
        if client is None:  # the run's rollout source, built on the producer's copy of the policy
            accelerator = ProducerAccelerator(spec.device, spec.rank)
            engine = producer_engine(spec.args, model, spec.tokenizer, scorer, spec.generation_config,
                                     spec.stop_token_ids, spec.pad_token_id, accelerator)  # fmt: skip
            trainer_view = ProducerTrainer(model, spec.tokenizer, spec.args, accelerator, spec.generation_config,
                                           spec.pad_token_id)  # fmt: skip
            context = SourceContext(engine, requested, requested, requested, scorer, spec.tokenizer, log_metric,
                                    trainer_view=trainer_view, stopping=abandoned_by_trainer(abandon))  # fmt: skip
            source = spec.source.build(context)
        while True:
            try:
                message = requests.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if os.getppid() != parent:  # the trainer is gone: nobody reads what is still in the pipe
                    results.cancel_join_thread()  # (exit would wait for it forever: an orphan process)
                    return
                continue
            if message is None:  # the trainer stops: it reads what is still queued while this process exits
                break
            if stop is not None and stop.is_set():  # stopping: what is still queued is read, not acted on
                continue
            if message[0] == "weights":
                _, version, state = message
                if state is not None:
                    _load_weights(model, state)
                continue
            _, request, rows = message
            index = request.index
            if not spec.deterministic:  # free-running: the newest weights received so far
                while True:
                    try:
                        _, version, state = weights_queue.get_nowait()
                    except queue.Empty:
                        break
                    if state is not None:
                        _load_weights(model, state)
            collected = {}
            state_snapshot = {"global_step": request.step}
            start = time.perf_counter()
            if client is not None:
                examples = [row for row in rows for _ in range(request.group)]
                prompt_ids = [list(e["prompt_ids"]) for e in examples]
                generated = sample_from_server(
                    client, spec.server, prompt_ids, request.temperatures, request.group, request.seed,
                    spec.stop_token_ids,
                )  # fmt: skip
                sampled = SampledRound(
                    examples,
                    generated["completion_ids"],
                    version=request.step,
                    group=request.group,
                    old_per_token_logps=generated["old_per_token_logps"],
                    temperatures=request.temperatures,
                    prompt_ids=[torch.tensor(p, dtype=torch.long) for p in prompt_ids],
                )
            else:
                requested.serve(request.indices, rows, request.temperatures)
                trainer_view.state.global_step = request.step
                engine.generator.manual_seed(request.seed)  # the round's seed: the run does not depend on timing
                torch.manual_seed(request.seed)  # (and what a rollout_func or a tool draws)
                sampled = source.sample(request.rows_needed, request.step)
            generate_seconds = time.perf_counter() - start
            start = time.perf_counter()
            scores, per_func = sampled.scores, sampled.per_func
            if scores is None:  # the reward functions, as the trainer's `finish` calls them
                prompt_ids = sampled.prompt_ids
                if prompt_ids is None:
                    prompt_ids = [torch.as_tensor(e["prompt_ids"], dtype=torch.long) for e in sampled.examples]
                scores, per_func = scorer.score(sampled.examples, prompt_ids, sampled.completion_ids, log_metric)
            if per_func is None:
                per_func = torch.full((len(sampled.examples), len(scorer.names)), math.nan)
            logps, kind = sampled.old_per_token_logps, "behaviour"
            if logps is None and sampled.sampler_per_token_logps is not None:
                logps, kind = sampled.sampler_per_token_logps, "sampler"
            temperatures = sampled.temperatures
            if temperatures is not None:
                temperatures = [float(t) for t in torch.as_tensor(temperatures, dtype=torch.float32).flatten()]
                if len(temperatures) == 1:
                    temperatures = temperatures * len(sampled.examples)
            changed = client is None and spec.source.kind != "default"
            put_shared(
                results,
                (
                    "round",
                    Produced(
                        request.index,
                        version,
                        sampled.completion_ids,
                        logps,
                        torch.as_tensor(scores, dtype=torch.float32),
                        torch.as_tensor(per_func, dtype=torch.float32),
                        generate_seconds,
                        time.perf_counter() - start,
                        collected,
                        logps_kind=kind,
                        completion_mask=sampled.completion_mask,
                        prompt_ids=sampled.prompt_ids if changed else None,
                        examples=sampled.examples if changed else None,
                        temperatures=temperatures,
                    ),
                ),
            )
    except BaseException as error:  # noqa: BLE001 - everything reaches the trainer, which raises it there
        summary = str(error) if isinstance(error, VLLMServerError) else None
        results.put(("error", index, traceback.format_exc(), summary))
    finally:
        if source is not None:
            source.close()
        if scorer is not None:
            scorer.close()
    # `None` arrived: hand over what the feeder thread still holds (the trainer reads until this process has exited)
    # and wait for the thread, so that no thread runs while the interpreter shuts down
    results.close()
    results.join_thread()


def share_in_this_thread(message: Any) -> Any:
    """Move every CPU tensor of `message` (inside tuples, lists, dicts and dataclasses) to shared memory, in place, in
    the calling thread; returns `message`.

    A `torch.multiprocessing` queue pickles what it is given in its feeder thread, and pickling a tensor that is not
    yet in shared memory copies it there with the GIL released: if the interpreter shuts down meanwhile, that thread
    is stopped inside torch and the process aborts ("terminate called without an active exception"). Shared first,
    a tensor is pickled as a handle (no copy, nothing released)."""
    if isinstance(message, torch.Tensor):
        if message.device.type == "cpu":
            message.share_memory_()
    elif isinstance(message, (list, tuple)):
        for item in message:
            share_in_this_thread(item)
    elif isinstance(message, dict):
        for item in message.values():
            share_in_this_thread(item)
    elif dataclasses.is_dataclass(message) and not isinstance(message, type):
        for item in dataclasses.fields(message):
            share_in_this_thread(getattr(message, item.name))
    return message


def put_shared(channel, message: Any) -> None:
    """`channel.put(message)` (a `torch.multiprocessing` queue) with its tensors moved to shared memory by the caller's
    thread first ([`share_in_this_thread`])."""
    channel.put(share_in_this_thread(message))


def without_training_hooks(model) -> None:
    """Turn off what only training needs on a sampling copy of the policy: activation checkpointing and the hook
    that makes input embeddings require grad (`enable_input_require_grads`, which PEFT and activation checkpointing
    install: a local closure, so a model holding it cannot be pickled into the producer process)."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            if getattr(module, "is_gradient_checkpointing", False):
                module.gradient_checkpointing_disable()
            module.disable_input_require_grads()


def producer_exit(exitcode: int | None) -> str:
    """How the producer process ended, for an error message: an error it raised (its traceback is printed above by
    the process), or the signal that killed it."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        likely = " (out of memory, or killed by hand?)" if name == "SIGKILL" else ""
        return f"was killed by {name}{likely}"
    return (
        f"exited with code {exitcode} after an error (its traceback is printed above; the producer is started with "
        '`spawn`, which imports the main script again without its `if __name__ == "__main__":` block: a reward, '
        "tool or environment it cannot find there must be defined at module level, or in a module)"
    )


class ProducerProcess:
    """One producer process with its queues and stop event, and its shutdown, on `close` and at interpreter exit.

    Whatever the run does, the process and the queue threads it started are gone when the interpreter shuts down:
    `start` registers [`shutdown`] with `atexit` (after `multiprocessing`'s own exit handler, so it runs first: that
    handler's `terminate` does not stop a producer, which ignores SIGTERM, and its `join` then waited forever, e.g.
    after an exception that skipped `close`); `shutdown` unregisters it.

    Args:
        context: the `multiprocessing` context (`spawn`).
        target (`Callable`): the process's function, called with `(*args, requests, weights, results, stop,
            abandon)`; `abandon` (an event) is set when the trainer stops on SIGINT / SIGTERM: the tool calls the
            producer runs are then abandoned (`AsyncRolloutSource.stopping`).
        args (`tuple`): its first arguments.
        name (`str`): the process's name.
    """

    def __init__(self, context, target: Callable, args: tuple, name: str):
        self.requests, self.weights, self.results = context.Queue(), context.Queue(), context.Queue()
        self.stop, self.abandon = context.Event(), context.Event()
        self.process = context.Process(
            target=target,
            args=(*args, self.requests, self.weights, self.results, self.stop, self.abandon),
            name=name,
            daemon=True,
        )
        self.stopped = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> None:
        """Start the process (pickles its arguments here).

        Raises:
            Exception: what `Process.start` raised (its queues are closed first).
        """
        try:
            with passive_waiting_for_children():  # its OpenMP threads sleep while they wait (threads.py)
                self.process.start()
        except Exception:
            self.stopped = True
            for channel in (self.requests, self.weights, self.results):
                channel.close()
            raise
        atexit.register(self.shutdown)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the process, then the queues' feeder threads of this process. Idempotent.

        Sets `stop` and sends `None`: the producer skips the rounds still queued (a round it is sampling is finished)
        and exits once its results are handed over; they are read here and dropped. After `timeout` seconds it is
        killed (it ignores SIGTERM; a hung reward call would keep it forever), with a warning. Then what is left in
        this process's own queues is read, so that their feeder threads can write their last messages, and the
        threads are joined: none is left running at interpreter exit (see [`producer_main`]).
        """
        if self.stopped:
            return
        self.stopped = True
        atexit.unregister(self.shutdown)
        process = self.process
        self.stop.set()
        self.requests.put(None)
        deadline = time.monotonic() + timeout
        while process.is_alive() and time.monotonic() < deadline:
            try:  # the rounds it still hands over: its feeder thread must finish before it exits
                self.results.get(timeout=0.1)
            except queue.Empty:
                pass
            except Exception as error:  # noqa: BLE001 - a dropped round that cannot be read is dropped all the same
                logger.debug("Dropped a producer message that could not be read: %r", error)
        process.join(timeout=max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            logger.warning(
                "The rollout producer process (pid %s) did not stop within %.0f s (a reward function, tool or round "
                "still running?): killed.", process.pid, timeout
            )  # fmt: skip
            process.kill()
            process.join(timeout=5)
        clean = process.exitcode == 0  # it read every message up to `None`; else it may have died half-way through one
        for channel in (self.requests, self.weights, self.results):
            if clean:
                while True:  # what it did not read (the free-running mode's last weights): the feeder can finish
                    try:
                        channel.get(timeout=0.05)
                    except queue.Empty:
                        break
                    except Exception:  # noqa: BLE001 - it only has to leave the pipe
                        continue
            else:  # nobody will read the rest: a feeder blocked on a full pipe is not waited for (it blocks in a
                channel.cancel_join_thread()  # write, outside torch: tensors were shared by `put_shared`)
            channel.close()
            if clean:
                channel.join_thread()


class AsyncRolloutSource(RolloutSource):
    """The asynchronous rollout source (module docstring): rounds asked for ahead and sampled by a producer process.

    Args:
        policy (`Callable[[], nn.Module]`): returns the trained policy, unwrapped (copied when the producer starts,
            read at every weight sync).
        dataset (`Dataset`): the tokenized RL prompts (`prompt_ids` and the reward columns).
        prompts ([`~trl_trapo.memory.MemoryPool`]): chooses each round's prompts (`select_prompts(n, step)`) and its
            temperature (`rollout_temperature(default)`), when the round is asked for.
        scorer ([`~trl_trapo.rewards.RewardScorer`]): the trainer's reward functions, copied into the producer.
        tokenizer: the policy's tokenizer (the reward functions decode with it).
        generation_config (`GenerationConfig`), pad_token_id (`int`), stop_token_ids (`list[int]`): sampling, as the
            trainer's rollout engine samples.
        args ([`~trl_trapo.TRAPOConfig`]): `max_staleness`, `weight_sync_steps`, `stale_rollouts`,
            `async_correction`, `async_deterministic`, `async_producer_threads`, `seed`, `temperature`,
            `local_rollout_forward_batch_size` (read only).
        group (`int`): completions per prompt (1 with a critic, else `num_generations`).
        num_mini_batches (`int`): optimizer steps a round feeds (a round holds `rows_needed * num_mini_batches` rows).
        rank (`int`): this process's rank (seeds).
        device (`str`): where the producer samples (the trainer's device).
        metrics: the trainer's [`~trl_trapo.metrics.MetricsAccumulator`] (`add_async_round`, `add_async_wait`,
            `add_weight_sync`, `add_dropped_stale`, `log_metric`).
        exploration ([`~trl_trapo.exploration.TargetedExploration`], *optional*): per-row temperatures by family.
        vllm ([`~trl_trapo.rollout.VLLMGenerator`], *optional*): with `use_vllm=True, vllm_mode="server"`, the
            trainer's connection to the vLLM server: the producer then samples through the server (no copy of the
            policy) and the weights are pushed to the server with `vllm.push_weights()` (module docstring).
        suppress_token_ids (`Sequence[int]`, *optional*): vocabulary ids the policy never samples (a VLM's image
            placeholders, [`~trl_trapo.vision.SuppressTokens`]): suppressed again in the producer's rebuilt copy,
            which has none of the policy's forward hooks.
        producer_threads (`int`, *optional*): the producer's torch threads when `async_producer_threads` is None
            (the trainer's [`~trl_trapo.threads.ThreadChoice.producer_threads`]); None: torch's default.
        source ([`~trl_trapo.executor.SourceSpec`], *optional*): the rollout source the producer builds and runs
            (the default source, the tool-calling source of `tools` / `environment_factory`, TRL's `rollout_func`);
            None: the default source. With a vLLM server only the default source.
        weight_snapshots (`bool`): the producer's weights are read only by [`take_weight_snapshot`], which the
            trainer calls on a schedule every rank reaches ([`~trl_trapo.callbacks.WeightSnapshotCallback`]: at
            `on_train_begin` and every `weight_sync_steps` optimizer steps); `prefetch` and `sample` then send the
            last snapshot and never read the policy. Under DeepSpeed ZeRO-3, where reading the weights gathers the
            partitioned parameters (a collective), while each rank asks for rounds at its own steps.
        stopping (`Callable[[], str | None]`, *optional*): why the run is stopping (the trainer's SIGINT / SIGTERM
            catcher), or None while it is not. While this process waits for a round (a step's, or a checkpoint's wait
            for the rounds in flight), a reason is passed on to the producer (its `abandon` event): its tool-calling
            source abandons the tool calls still running, so that a hung tool does not hold up the stop. None: never.

    Raises:
        ValueError: naming each object, if reward functions, tools, environment factories or the `rollout_func`
            cannot be pickled (all of them in one message, see [`refuse_unpicklable`]), or a source other than the
            default one is given with a vLLM server.
    """

    def __init__(
        self,
        policy: Callable[[], nn.Module],
        dataset,
        prompts,
        scorer,
        tokenizer,
        generation_config,
        pad_token_id: int,
        stop_token_ids: list[int],
        args,
        group: int,
        num_mini_batches: int,
        rank: int,
        device: str,
        metrics,
        exploration=None,
        vllm=None,
        suppress_token_ids: Sequence[int] = (),
        producer_threads: int | None = None,
        source: SourceSpec | None = None,
        weight_snapshots: bool = False,
        stopping: Callable[[], str | None] | None = None,
    ):
        if source is None:
            source = SourceSpec("default", group, num_mini_batches, float(args.temperature))
        # every object that cannot reach the producer, named in one message
        refuse_unpicklable([("reward function", list(scorer.funcs)), *source.picklable_parts()])
        if vllm is not None and source.kind != "default":
            raise ValueError(
                f"async_rollouts=True with the vLLM server samples the default rollout source's rounds through the "
                f"server, not a {source.kind} source's: set use_vllm=False (the producer then runs it with "
                "transformers' generate), or async_rollouts=False."
            )
        self.source = source
        self.producer_threads = (
            args.async_producer_threads if args.async_producer_threads is not None else producer_threads
        )
        self.suppress_token_ids = [int(t) for t in suppress_token_ids]
        self.policy = policy
        self.dataset = dataset
        self.prompts = prompts
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.generation_config = generation_config
        self.pad_token_id = int(pad_token_id)
        self.stop_token_ids = list(stop_token_ids)
        self.args = args
        self.group = int(group)
        self.num_mini_batches = int(num_mini_batches)
        self.rank = int(rank)
        self.device = str(device)
        self.metrics = metrics
        self.exploration = exploration
        self.vllm = vllm
        self.max_staleness = DEFAULT_MAX_STALENESS if args.max_staleness is None else int(args.max_staleness)
        self.pending: deque[Request] = deque()  # asked for, in order
        self.ready: dict[int, Produced] = {}  # finished, by round index, not yet consumed
        self.next_index = 0  # the next round's number
        self.sent_version: int | None = None  # the weights version the producer has (None: not started)
        self.sent_state: dict[str, torch.Tensor] | None = None  # kept when weight_sync_steps > 1 (checkpoints)
        self.dropped_total = 0
        self._restored_weights: tuple[int, dict[str, torch.Tensor]] | None = None
        self._producer: ProducerProcess | None = None
        self._process = self._requests = self._weights = self._results = None
        self.weight_snapshots = bool(weight_snapshots)
        self.stopping = stopping
        # with weight_snapshots: the last scheduled snapshot (version, trainable weights), what the next round asked
        # for is sampled with; and the producer's first copy (the whole policy, taken at the start of training)
        self.snapshot: tuple[int, dict[str, torch.Tensor]] | None = None
        self._blueprint: PolicyBlueprint | None = None

    @property
    def producer_pid(self) -> int | None:
        """The producer process's id while it runs, else None."""
        return self._process.pid if self._process is not None else None

    def take_weight_snapshot(self, step: int, first: bool = False) -> None:
        """Take the weights the producer will sample with (`weight_snapshots=True`): the trainable parameters at
        optimizer step `step` (version `step`) and, when `first` (the start of training), also the whole policy, the
        producer's first copy ([`PolicyBlueprint`]). A round asked for afterwards is sampled with the last snapshot.

        Collective under ZeRO-3 (each partitioned parameter is gathered for its copy, one at a time,
        `deepspeed.zero.GatheredParameters`): every rank calls it at the same step, from
        [`~trl_trapo.callbacks.WeightSnapshotCallback`]. On a resumed run whose checkpoint kept an older snapshot
        (`weight_sync_steps > 1`), the first call keeps that one, as the uninterrupted run would have it.
        `perf/weight_sync_s` counts the seconds.

        Raises:
            ValueError: if the policy is neither a transformers model nor a PEFT model with one adapter over one
                (only those are rebuilt in the producer from gathered weights).
        """
        start = time.perf_counter()
        live = self.policy()
        if first:
            blueprint = PolicyBlueprint.of(live)
            if blueprint is None:
                raise ValueError(
                    f"async_rollouts=True under DeepSpeed ZeRO-3 rebuilds the policy in the producer from its gathered "
                    f"weights, which needs a transformers model (or a PEFT model with one adapter over one), not a "
                    f"{type(live).__name__}. Use ZeRO-2 or DDP, or async_rollouts=False."
                )
            self._blueprint = blueprint
            if self._restored_weights is not None:  # the checkpoint's snapshot, older than its step
                self.snapshot, self._restored_weights = self._restored_weights, None
            else:
                names = [n for n, p in live.named_parameters() if p.requires_grad]
                self.snapshot = (int(step), {name: blueprint.state[name] for name in names})
        else:
            self.snapshot = (int(step), trainable_state(live))
        self.metrics.add_weight_sync(time.perf_counter() - start)

    def _last_snapshot(self) -> tuple[int, dict[str, torch.Tensor]]:
        """The last scheduled snapshot (`weight_snapshots=True`): `(version, trainable weights)`."""
        if self.snapshot is None:
            raise RuntimeError(
                "AsyncRolloutSource(weight_snapshots=True) samples with the weights take_weight_snapshot takes at the "
                "start of training and on its schedule (WeightSnapshotCallback), and none was taken: register the "
                "callback (the trainer does), or build the source without weight_snapshots."
            )
        return self.snapshot

    # ---- the producer process -------------------------------------------------------------------------------------
    def _server_spec(self) -> VLLMServerSpec:
        from .rollout import vllm_generation_kwargs, vllm_server_url

        args = self.args
        return VLLMServerSpec(
            url=vllm_server_url(args),
            timeout=float(args.vllm_server_timeout),
            model=getattr(self.vllm, "model_name", ""),
            sampling=dict(
                top_p=args.top_p,
                top_k=args.top_k,
                max_tokens=args.response_length,
                logprobs=0,  # the sampled token's log-prob
                generation_kwargs=vllm_generation_kwargs(args, self.tokenizer),
            ),
            client_factory=open_vllm_client,
        )

    def _start(self, step: int) -> None:
        context = mp.get_context("spawn")
        version = step
        policy = server = None
        if self.vllm is not None:
            # the server holds whatever it was last sent (or loaded): it gets this step's weights before any round
            if self._restored_weights is not None:
                logger.info("vLLM server producer: the checkpoint's older producer weights (version %d) are not "
                            "restored; the server samples with this step's.", self._restored_weights[0])  # fmt: skip
                self._restored_weights = None
            self._push(step)
            server = self._server_spec()
        elif self.weight_snapshots:  # the copy taken at the start of training, with the last scheduled weights
            version, state = self._last_snapshot()
            if self._blueprint is None:
                raise RuntimeError(
                    "AsyncRolloutSource(weight_snapshots=True) starts a producer from the copy of the policy taken "
                    "by take_weight_snapshot(step, first=True) at the start of training, and it was used by an "
                    "earlier producer: call it again (WeightSnapshotCallback.on_train_begin does)."
                )
            policy, self._blueprint = self._blueprint, None  # the producer keeps it; a later start takes a new one
            _load_weights_into_state(policy.state, state)
        else:
            live = self.policy()
            policy = PolicyBlueprint.of(live)
            if policy is None:  # not a transformers model: a pickled copy, without training-only hooks
                policy = copy.deepcopy(live).to("cpu").eval()
                without_training_hooks(policy)  # sampling needs neither, and their closures cannot be pickled
            if self._restored_weights is not None:  # the checkpoint's producer weights (older than its step)
                version, state = self._restored_weights
                if isinstance(policy, PolicyBlueprint):
                    _load_weights_into_state(policy.state, state)
                else:
                    _load_weights(policy, state)
                self._restored_weights = None
        spec = ProducerSpec(
            model=policy,
            tokenizer=self.tokenizer,
            generation_config=self.generation_config,
            pad_token_id=self.pad_token_id,
            stop_token_ids=self.stop_token_ids,
            batch_size=self.args.local_rollout_forward_batch_size,
            funcs=list(self.scorer.funcs),
            processing_classes=list(self.scorer.processing_classes),
            weights=[float(w) for w in self.scorer.weights],
            reward_batch_size=self.scorer.batch_size,
            device=self.device,
            num_threads=self.producer_threads,
            version=version,
            deterministic=self.args.async_deterministic,
            server=server,
            suppress_token_ids=self.suppress_token_ids,
            args=self.args,
            rank=self.rank,
            source=self.source,
        )
        producer = ProducerProcess(context, producer_main, (spec,), name=f"trl-trapo-producer-rank{self.rank}")
        try:
            producer.start()  # `spawn` pickles the spec here
        except Exception as error:
            if isinstance(error, RuntimeError) and "bootstrapping phase" in str(error):
                # multiprocessing's own check: we are a spawned producer importing a script that trains at import
                raise ProducerError(
                    "A rollout producer process is importing the script that started it and training from there: "
                    "the producer is started with `spawn`, which imports the main script, so the code that builds "
                    'and trains the TRAPOTrainer must sit under `if __name__ == "__main__":`.'
                ) from error
            raise ProducerError(
                f"The rollout producer process (rank {self.rank}) could not be started: what it is sent (a copy of "
                f"the policy, the tokenizer, the reward functions) cannot be pickled ({type(error).__name__}: "
                f"{error}). Define reward functions at module level, or set async_rollouts=False."
            ) from error
        self._producer = producer
        self._process, self._requests, self._weights, self._results = (
            producer.process,
            producer.requests,
            producer.weights,
            producer.results,
        )
        self.sent_version = version
        if self.weight_snapshots:
            pass  # a checkpoint keeps the last snapshot (`checkpoint_state`)
        elif self.args.weight_sync_steps > 1 and isinstance(policy, PolicyBlueprint):
            names = [n for n, p in live.named_parameters() if p.requires_grad]  # as a weight sync sends them
            self.sent_state = {name: policy.state[name].clone() for name in names}
        elif self.args.weight_sync_steps > 1 and policy is not None:
            self.sent_state = trainable_state(policy)
        for request in self.pending:  # asked for before a `close` and not received: asked for again, in order
            if request.index not in self.ready:
                self._send(request)

    def _sync_weights(self, step: int, force: bool = False) -> None:
        """Send the trainable weights if `weight_sync_steps` steps have passed since the last send (with
        `weight_snapshots`: the last scheduled snapshot, if the producer does not have it yet; never reads the
        policy)."""
        if self._process is None:
            self._start(step)
        if self.weight_snapshots:
            version, state = self._last_snapshot()
            if version > self.sent_version:
                channel = self._requests if self.args.async_deterministic else self._weights
                put_shared(channel, ("weights", version, state))
                self.sent_version = version
            return
        if step <= self.sent_version or (not force and step - self.sent_version < self.args.weight_sync_steps):
            return
        channel = self._requests if self.args.async_deterministic else self._weights
        if self.vllm is not None:
            if self.args.async_deterministic:
                # no round may be sampled partly with the old weights and partly with the new: the push waits until
                # the producer has finished every round asked for before (counted as `perf/rollout_wait_s`)
                for request in self.pending:
                    if request.index not in self.ready:
                        self._receive_silently(request.index)
            self._push(step)
            channel.put(("weights", step, None))  # the server holds `step`'s weights (stamps the next rounds)
            self.sent_version = step
            return
        start = time.perf_counter()
        state = trainable_state(self.policy())
        put_shared(channel, ("weights", step, state))
        self.sent_version = step
        if self.args.weight_sync_steps > 1:
            self.sent_state = state
        self.metrics.add_weight_sync(time.perf_counter() - start)

    def _push(self, step: int) -> None:
        """Push the trained weights to the vLLM server (from the trainer's process; `perf/weight_sync_s`)."""
        start = time.perf_counter()
        self.vllm.push_weights()
        logger.debug("Pushed the weights of step %d to the vLLM server.", step)
        self.metrics.add_weight_sync(time.perf_counter() - start)

    def _ask(self, rows_needed: int, step: int, sync: bool = False) -> None:
        """Ask the producer for one round (prompts and temperatures chosen now); `sync`: send the weights first even
        if `weight_sync_steps` have not passed."""
        self._sync_weights(step, force=sync)
        num_prompts = max(math.ceil(rows_needed * self.num_mini_batches / self.group), 1)
        indices = [int(i) for i in self.prompts.select_prompts(num_prompts, step)]
        temperature = self.prompts.rollout_temperature(self.args.temperature)
        examples = self._examples(indices)
        if self.exploration is not None:
            temperatures = [float(t) for t in self.exploration.row_temperatures(examples)]
        else:
            temperatures = [float(temperature)] * len(examples)
        index = self.next_index
        self.next_index += 1
        request = Request(
            index, indices, self.group, temperatures, round_seed(self.args.seed, self.rank, index), step,
            self.sent_version, rows_needed,
        )  # fmt: skip
        self.pending.append(request)
        self._send(request)

    def _examples(self, indices: list[int]) -> list[dict]:
        return [example for example in (self.dataset[i] for i in indices) for _ in range(self.group)]

    def _send(self, request: Request) -> None:
        """Send the request with its prompts' rows (one per prompt: the producer repeats them `group` times)."""
        from .rollout import prompt_model_inputs

        rows = [self.dataset[i] for i in request.indices]
        if self.vllm is not None and prompt_model_inputs(rows) is not None:
            raise ValueError(
                "The RL prompts carry model inputs (a `model_inputs` column), which TRAPO does not pass to vLLM "
                "yet: set use_vllm=False (rollouts then use transformers' generate, which gets them)."
            )
        put_shared(self._requests, ("round", request, rows))

    def _receive(self, index: int, training: bool = True) -> Produced:
        """Wait for round `index` (rounds arrive in order); the seconds waited count as `perf/rollout_wait_s` when
        `training` (a checkpoint's wait does not)."""
        start = time.perf_counter()
        while index not in self.ready:
            self._pass_on_stop()
            try:
                message = self._results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if not self._process.is_alive():
                    raise ProducerError(
                        f"The rollout producer process (rank {self.rank}) {producer_exit(self._process.exitcode)} "
                        f"while round {index} was being sampled. Fix what it says, then rerun (or resume from the "
                        "last checkpoint, if any); with async_rollouts=False rounds are sampled in the trainer."
                    ) from None
                continue
            if message[0] == "error":
                self.close()
                if len(message) > 3 and message[3]:  # a complete message (the vLLM server does not answer)
                    where = f"on round {message[1]}" if message[1] >= 0 else "while starting"
                    raise ProducerError(
                        f"The rollout producer process (rank {self.rank}) failed {where}: {message[3]}"
                    )
                raise ProducerError(
                    f"The rollout producer process (rank {self.rank}) failed on round {message[1]}:\n{message[2]}"
                    "A reward function that fails there fails as it would in the trainer; a function or class that "
                    "cannot be imported by a fresh process (defined in `python -c`, or only under the main script's "
                    "`if __name__ == '__main__':` block) fails here too: define it at module level, or in a module."
                )
            produced: Produced = message[1]
            self.ready[produced.index] = produced
        if training:
            self.metrics.add_async_wait(time.perf_counter() - start)
        return self.ready.pop(index)

    # ---- the rollout-source contract ------------------------------------------------------------------------------
    def prefetch(self, rows_needed: int, step: int, use_counts: list[int]) -> None:
        """Ask for rounds while the steps the replay buffer (`use_counts`: its servable trajectories by uses, see
        [`~trl_trapo.memory.ReplayBuffer.use_counts`]) and the rounds in flight can feed at `rows_needed` RL rows a
        step, plus the age of the weights a round would be sampled with, are at most `max_staleness` (module
        docstring). Called by the trainer whenever it takes RL rows; not a collective. In the free-running mode it
        also sends the weights every `weight_sync_steps` steps."""
        if rows_needed <= 0 or self.max_staleness == 0:
            return
        if self._process is not None and not self.args.async_deterministic:
            self._sync_weights(step)
        while True:
            rounds = [len(r.indices) * r.group for r in self.pending]
            covered = steps_covered(use_counts, rows_needed, rounds, self.max_staleness)
            # the weights a round asked for now is sampled with: this step's if a sync is due, else the last sent
            # (with weight_snapshots: the last scheduled snapshot)
            if self.weight_snapshots:
                behind = step - self._last_snapshot()[0]
            else:
                due = self.sent_version is None or step - self.sent_version >= self.args.weight_sync_steps
                behind = 0 if due else step - self.sent_version
            if covered + behind > self.max_staleness:
                return
            self._ask(rows_needed, step)

    def round_due(self, step: int) -> bool:
        """Whether the oldest round asked for must be consumed at `step`: one step more and it would be later than
        `max_staleness` (the forecast of when the buffer runs dry errs when a step's RL rows shrink). Its lag is
        counted from the weights version sent before it was asked for (in the free-running mode the producer may use
        newer ones: the bound then holds a fortiori). Not a collective; the trainer agrees across ranks."""
        return bool(self.pending) and step - self.pending[0].version >= self.max_staleness

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        """The next round in order (asked for now if none is in flight; waits for the producer if it is not ready).

        Returns:
            [`~trl_trapo.sources.SampledRound`]: with the producer's scores, its log-probs (as
            `sampler_per_token_logps` or `old_per_token_logps`, per `async_correction`), the version of the weights
            that sampled it, and with `stale_rollouts="downweight"` the loss weight of a late round.

        Raises:
            ProducerError: if the producer failed (its traceback in the message) or died.
        """
        while True:
            if not self.pending:  # nothing asked for ahead: asked for now, with the current weights
                self._ask(rows_needed, step, sync=True)
            request = self.pending.popleft()
            produced = self._receive(request.index)
            lag = step - produced.version
            weight = 1.0
            if lag > self.max_staleness:
                if self.args.stale_rollouts == "drop":
                    self.dropped_total += 1
                    self.metrics.set_dropped_stale_total(self.dropped_total)
                    logger.info("Dropped round %d: %d steps late (max_staleness=%d).", request.index, lag,
                                self.max_staleness)  # fmt: skip
                    continue
                weight = (self.max_staleness + 1) / (lag + 1)
            self.metrics.add_async_round(lag, produced.generate_seconds, produced.reward_seconds)
            for name, values in produced.reward_metrics.items():
                for value in values:
                    self.metrics.log_metric(name, value)
            examples = produced.examples if produced.examples is not None else self._examples(request.indices)
            prompt_ids = produced.prompt_ids
            if prompt_ids is None:
                prompt_ids = [torch.as_tensor(e["prompt_ids"], dtype=torch.long) for e in examples]
            logps = None if produced.logps is None else [lp.float() for lp in produced.logps]
            # vLLM's and a rollout_func's log-probs are another engine's: always the sampler's (the config refuses
            # "behaviour" with vLLM); the producer copy's go where async_correction says
            decoupled = (
                self.args.async_correction == "decoupled" or self.vllm is not None or produced.logps_kind == "sampler"
            )
            temperatures = request.temperatures if produced.temperatures is None else produced.temperatures
            return SampledRound(
                examples,
                produced.completion_ids,
                version=produced.version,
                group=request.group,
                old_per_token_logps=None if decoupled else logps,
                sampler_per_token_logps=logps if decoupled else None,
                temperatures=torch.tensor(temperatures),
                prompt_ids=prompt_ids,
                completion_mask=produced.completion_mask,
                scores=produced.scores,
                per_func=produced.per_func,
                importance_weight=weight,
            )

    def close(self, timeout: float | None = None) -> None:
        """Stop the producer (rounds in flight are lost: `checkpoint_state` keeps them first). Idempotent.

        Args:
            timeout (`float`, *optional*): seconds the producer gets to finish what it is doing (a round, a reward
                call) and exit (None: 10); then it is killed (it ignores SIGTERM, so `terminate` would not stop it). A
                second Ctrl-C passes a short one.
        """
        producer, self._producer = self._producer, None
        if producer is None:
            return
        self._process = self._requests = self._weights = self._results = None
        try:
            producer.shutdown(10.0 if timeout is None else timeout)
        finally:
            self.sent_version = None  # the next producer starts with the weights of its step

    # ---- checkpoints ----------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """Wait for the rounds in flight, then everything a resumed run needs: JSON metadata and flat tensors.

        The finished rounds not yet consumed are kept whole (requests, completions, log-probs, scores), so a resumed
        run consumes exactly the rounds an uninterrupted one would; the producer's weights are kept when they are
        older than the trained ones (`weight_sync_steps > 1`)."""
        for request in self.pending:
            if request.index not in self.ready:
                self._receive_silently(request.index)
        meta = {
            "format": 1,
            "next_index": self.next_index,
            "sent_version": self.sent_version,
            "dropped_total": self.dropped_total,
            "pending": [],
        }
        tensors: dict[str, torch.Tensor] = {}
        for request in self.pending:
            produced = self.ready[request.index]
            key = f"round{request.index}"
            check_json_rows(produced.examples)
            meta["pending"].append(
                {
                    "request": dataclasses.asdict(request),
                    "version": produced.version,
                    "generate_seconds": produced.generate_seconds,
                    "reward_seconds": produced.reward_seconds,
                    "reward_metrics": produced.reward_metrics,
                    "lengths": [int(c.numel()) for c in produced.completion_ids],
                    "logps_kind": produced.logps_kind if produced.logps is not None else None,
                    "temperatures": produced.temperatures,
                    "examples": produced.examples,  # rows the source changed (JSON: text datasets' rows)
                    "prompt_lengths": (
                        None if produced.prompt_ids is None else [int(p.numel()) for p in produced.prompt_ids]
                    ),
                }
            )
            tensors[f"{key}/completion_ids"] = _flat(produced.completion_ids, torch.long)
            if produced.logps is not None:
                tensors[f"{key}/logps"] = _flat(produced.logps, torch.float32)
            if produced.completion_mask is not None:
                tensors[f"{key}/completion_mask"] = _flat(produced.completion_mask, torch.float32)
            if produced.prompt_ids is not None:
                tensors[f"{key}/prompt_ids"] = _flat(produced.prompt_ids, torch.long)
            tensors[f"{key}/scores"] = produced.scores.float().contiguous()
            tensors[f"{key}/per_func"] = produced.per_func.float().contiguous()
        if self.weight_snapshots and self.snapshot is not None:
            # the weights the next round asked for is sampled with: the last snapshot (kept when it can be older
            # than the checkpoint's step; a resumed run's first snapshot takes it, `take_weight_snapshot`)
            meta["sent_version"] = self.snapshot[0]
            if self.args.weight_sync_steps > 1:
                for name, value in self.snapshot[1].items():
                    tensors[f"producer_weights/{name}"] = value.contiguous()
        elif self.sent_state is not None and self.sent_version is not None and self.sent_state:
            for name, value in self.sent_state.items():
                tensors[f"producer_weights/{name}"] = value.contiguous()
        return meta, tensors

    def _pass_on_stop(self) -> None:
        """Once `stopping` gives a reason, tell the producer (its `abandon` event): its tool calls still running are
        abandoned, and those not started are not run, so the rounds waited for arrive (trial 12's N07)."""
        producer = self._producer
        if producer is not None and self.stopping is not None and not producer.abandon.is_set():
            if self.stopping() is not None:
                producer.abandon.set()

    def _receive_silently(self, index: int) -> None:
        """Wait for a round without counting the wait as the trainer's (a checkpoint waits, not training)."""
        self.ready[index] = self._receive(index, training=False)

    def restore_checkpoint_state(self, meta: dict | None, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what `checkpoint_state` returned (before the producer starts: it starts with the restored weights).

        Raises:
            ValueError: if `meta` is None: the checkpoint was written without this source's state (a run with
                `async_rollouts=False`).
        """
        if meta is None:
            raise ValueError(
                f"the checkpoint was written without {type(self).__name__}'s state (a run with another rollout source, "
                "e.g. async_rollouts=False); resume with the same one."
            )
        self.close()
        self.next_index = int(meta["next_index"])
        self.dropped_total = int(meta["dropped_total"])
        self.metrics.set_dropped_stale_total(self.dropped_total)
        self.pending.clear()
        self.ready.clear()
        for entry in meta["pending"]:
            request = Request(**entry["request"])
            key = f"round{request.index}"
            lengths = entry["lengths"]
            self.pending.append(request)
            logps = tensors.get(f"{key}/logps")
            mask = tensors.get(f"{key}/completion_mask")
            prompt_ids = tensors.get(f"{key}/prompt_ids")
            self.ready[request.index] = Produced(
                request.index,
                int(entry["version"]),
                list(torch.split(tensors[f"{key}/completion_ids"], lengths)),
                None if logps is None else list(torch.split(logps, lengths)),
                tensors[f"{key}/scores"],
                tensors[f"{key}/per_func"],
                float(entry["generate_seconds"]),
                float(entry["reward_seconds"]),
                {k: list(v) for k, v in entry["reward_metrics"].items()},
                logps_kind=entry.get("logps_kind") or "behaviour",
                completion_mask=None if mask is None else list(torch.split(mask, lengths)),
                prompt_ids=None if prompt_ids is None else list(torch.split(prompt_ids, entry["prompt_lengths"])),
                examples=entry.get("examples"),
                temperatures=entry.get("temperatures"),
            )
        weights = {k[len("producer_weights/") :]: v for k, v in tensors.items() if k.startswith("producer_weights/")}
        sent = meta.get("sent_version")
        # the producer starts (at the next round asked for) with the weights it had: the saved ones when they are
        # older than the checkpoint, else the checkpoint's own
        self.sent_version = None if sent is None else int(sent)
        self._restored_weights = (int(sent), weights) if weights and sent is not None else None


def check_json_rows(rows: list[dict] | None) -> None:
    """Refuse, naming the column, rows a checkpoint's JSON metadata cannot hold (a round in flight is kept whole, with
    the rows its source returned: an environment's observation, a `rollout_func`'s extra columns).

    Raises:
        ValueError: naming the column and its value's type, if a value is not JSON (lists, dicts, strings, numbers,
            booleans, None).
    """
    import json

    for row in rows or []:
        for column, value in row.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as error:
                raise ValueError(
                    f"A checkpoint keeps the asynchronous rounds in flight with their rows, but column {column!r} "
                    f"holds a {type(value).__name__}, which JSON cannot store ({error}). Return plain values from the "
                    "rollout_func (`.tolist()` for tensors and arrays), or set async_rollouts=False."
                ) from error


def _flat(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat([p.to(dtype).reshape(-1) for p in parts]) if parts else torch.zeros(0, dtype=dtype)


__all__ = [
    "AsyncRolloutSource",
    "ProducerError",
    "VLLMServerSpec",
    "check_main_guard",
    "check_picklable",
    "main_importable_by_spawn",
    "open_vllm_client",
    "refuse_unpicklable",
    "round_seed",
    "sample_from_server",
    "trainable_state",
]
