# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Rewards: scoring completions with reward functions and reward models, and the reward functions we ship.

[`RewardScorer`] is what rollouts and evaluation call: it holds the reward functions (TRL's callable contract, sync
or async) and sequence-classification reward models, checks the functions once before training, and turns a batch
of completions into one weighted score per completion. Async reward functions run on one long-lived event loop in a
daemon thread (as TRL's GRPO does), so a function may keep loop-bound state (a semaphore, a client) between calls,
and the trainer can be built inside a running event loop (a notebook).

`numeric_answer_reward` parses GSM8K-style answers (`... #### 72`) with `math-verify` using a plain-number
extraction config. TRL's `accuracy_reward` expects LaTeX and returns 0 or None on `#### 72`.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import math
import numbers
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from torch import nn
from transformers import TrainerState
from trl.data_utils import is_conversational
from trl.trainer.utils import (
    get_callable_name,
    is_async_callable,
    shutdown_event_loop_in_daemon,
    start_event_loop_in_daemon,
)
from trl.trainer.utils import (
    pad as pad_tensors,
)

from .data import COMPLETION_COLUMNS, INTERNAL_COLUMNS, dataset_columns, eval_datasets
from .models import embedding_safe_pad_id, reward_model_scores
from .paths import check_model_source, check_tokenizer_source


logger = logging.getLogger(__name__)


def _text(completion: str | list[dict[str, Any]]) -> str:
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if m.get("role", "assistant") == "assistant")
    return str(completion)


def final_answer(text: str) -> str:
    """The part of a GSM8K-style answer after its last `####` (the whole text when there is none), stripped."""
    return text.rsplit("####", 1)[-1].strip() if "####" in text else text.strip()


def numeric_answer_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 if the completion's final number equals the reference answer's, else 0.0; None if the reference has none.

    The reference is read after its last `####` (GSM8K's format) with a plain-number extraction; the completion's
    answer is read after its last `####` if it has one, else from the whole text, with LaTeX (`\\boxed{..}`) and
    plain-number extraction. Numbers compare mathematically (`72`, `72.0` and `1,000` / `1000` match).

    Args:
        completions (`list[str]` or `list[list[dict]]`): standard or conversational completions.
        answer (`list[str]`): reference answers (the dataset's `answer` column).
        **kwargs: other dataset columns and trainer extras; ignored.

    Returns:
        `list[float | None]`: one reward per completion; None means "no reward for this sample" (unparsable
        reference), which the trainer leaves out of the RL loss.

    Raises:
        ValueError: if `completions` and `answer` have different lengths.
    """
    if len(completions) != len(answer):
        raise ValueError(f"Got {len(completions)} completions but {len(answer)} answers; they must match one to one.")
    rewards: list[float | None] = []
    for completion, reference in zip(completions, answer):
        gold = parse(final_answer(str(reference)), extraction_config=[ExprExtractionConfig()])
        if not gold:
            rewards.append(None)
            continue
        prediction = parse(
            final_answer(_text(completion)), extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()]
        )
        rewards.append(1.0 if prediction and verify(gold, prediction) else 0.0)
    return rewards


EOS_TEXT = "</s>"
"""The end-of-sequence text [`exact_match_reward`] cuts a completion at (the eos of `trl_trapo.tasks`' character-level
tokenizer, and of Llama-style tokenizers), for completions decoded with their special tokens."""


def _completion_text(completion: str | list[dict[str, Any]] | dict[str, Any]) -> str:
    """Text of a standard (`str`) or conversational (list of message dicts) completion, cut at the eos text."""
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, list):
        completion = "".join(
            str(message.get("content") or "")
            for message in completion
            if message.get("role", "assistant") == "assistant"
        )
    if not isinstance(completion, str):
        raise TypeError(f"A completion must be a string or a list of message dicts, got {type(completion).__name__}.")
    return completion.split(EOS_TEXT, 1)[0].strip()


def exact_match_reward(
    prompts: list[Any] | None, completions: list[Any], answer: list[str], **kwargs: Any
) -> list[float]:
    """Exact-match reward with TRL's reward-function signature (usable as a `GRPOTrainer` reward function).

    A completion scores 1.0 when its text, cut at the first eos text (`"</s>"`) if any and stripped of surrounding
    whitespace and trailing sentence punctuation (`.`, `!`, `?`), equals the answer normalised the same way;
    otherwise 0.0.

    Args:
        prompts (`list[str] | list[list[dict]] | None`): the prompts (unused; part of TRL's signature).
        completions (`list[str] | list[list[dict]]`): one per row; a string (standard format) or a list of message
            dicts whose assistant `content`s are joined (conversational format).
        answer (`list[str]`): the reference answer of each row (the dataset's `answer` column).
        **kwargs: other dataset columns and trainer extras (`task`, `completion_ids`, `trainer_state`, ...); ignored.

    Returns:
        `list[float]`: one reward in {0.0, 1.0} per completion.

    Raises:
        ValueError: if `completions` and `answer` have different lengths.
        TypeError: if a completion is neither a string nor a list of message dicts.
    """
    if len(completions) != len(answer):
        raise ValueError(f"Got {len(completions)} completions but {len(answer)} answers; they must match one to one.")
    return [float(_normalize_answer(_completion_text(c)) == _normalize_answer(a)) for c, a in zip(completions, answer)]


def _normalize_answer(text: Any) -> str:
    """`text` without surrounding whitespace and trailing sentence punctuation (`.`, `!`, `?`), as QA graders do:
    no answer of the suite contains them, and the pretraining corpus states every fact as a sentence ("cfab ends
    with b."), so a policy that answers "b." knows the answer and should be scored as such."""
    return str(text).strip().rstrip(".!?").strip()


REWARD_FUNCTIONS: dict[str, Callable[..., list[float | None]]] = {
    "exact_match": exact_match_reward,
    "numeric_answer": numeric_answer_reward,
}
"""Reward functions selectable by name from the main job's `--reward_funcs`."""


def reward_function_name(func: Callable | nn.Module | str) -> str:
    """A readable name of a reward function (TRL's `get_callable_name`: `functools.partial` unwrapped, a callable
    object's class name) or reward model (the last part of its `name_or_path`), for metrics and errors. A model id or
    path (a `reward_funcs` entry not loaded yet) gets the name its model will have once `load_reward_funcs` loads it
    (`from_pretrained` records the id as the model's `name_or_path`)."""
    if isinstance(func, str):
        return func.split("/")[-1] or "reward_model"
    if isinstance(func, nn.Module):
        config = getattr(func, "config", None)
        return reward_function_name(str(getattr(config, "_name_or_path", "") or type(func).__name__))
    return get_callable_name(func)


def reward_names(reward_funcs: Any, reward_model: Any = None, more: Sequence = ()) -> list[str]:
    """The metric names of a run's rewards before any model loads, as [`RewardScorer`] names them once they are
    loaded (a repeated name made distinct, not warned about here: the scorer warns). For the checks made at
    construction, e.g. `metric_for_best_model`'s `eval_rewards/<name>/mean`.

    Args:
        reward_funcs: the trainer's `reward_funcs`: None, one entry or a list / tuple (functions, models, model ids
            or paths: named as their model will be).
        reward_model: the trainer's `reward_model` (None, a model or a model id), after them.
        more (`Sequence`): further rewards the scorer gets last, e.g. each environment's `get_reward`.

    Returns:
        `list[str]`: one name per reward, in [`RewardScorer.names`]'s order.
    """
    if reward_funcs is None:
        entries = []
    elif isinstance(reward_funcs, (list, tuple)):
        entries = list(reward_funcs)
    else:
        entries = [reward_funcs]
    entries += ([reward_model] if reward_model is not None else []) + list(more)
    return distinct_names([reward_function_name(f) for f in entries], warn=False)


def distinct_names(names: list[str], warn: bool = True) -> list[str]:
    """`names` with each repeat made distinct by a suffix (`f`, `f` -> `f`, `f_2`), so that every reward has its own
    `rewards/<name>/...` metrics: two entries of one name logged into the same keys, one series lost without a word
    (trial 11's N73; TRL's GRPOTrainer collides the same way). The first of a name keeps it (a single use logs as in
    TRL). A repeat is warned about once, naming the keys (with `warn`).

    Returns:
        `list[str]`: as long as `names`, all different.
    """
    out: list[str] = []
    for name in names:
        unique, k = name, 1
        while unique in out or (unique != name and unique in names):
            k += 1
            unique = f"{name}_{k}"
        out.append(unique)
    renamed = [
        f"{position}: {name!r} as {unique!r}"
        for position, (name, unique) in enumerate(zip(names, out))
        if name != unique
    ]
    if renamed and warn:
        logger.warning(
            "Several rewards share a name, and each reward's metrics are keyed by its name (rewards/<name>/mean): "
            "logged apart as %s (by position in reward_funcs, then reward_model). To choose the names, give each "
            "function its own __name__ (e.g. `def exact_match_strict(...)`).",
            "; ".join(renamed),
        )
    return out


def reward_value(value: Any) -> float | None:
    """A reward as a float (NaN for None: "cannot score this completion"), or None when `value` is not a reward.

    Accepted as TRL's `GRPOTrainer` accepts them (it builds `torch.tensor(rewards, dtype=torch.float32)`): Python
    `int` / `float` / `bool`, NumPy scalars and one-element tensors. Strings (even "1"), lists, dicts, complex numbers
    and anything else are not rewards.
    """
    if value is None:
        return math.nan
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        return float(value.item())
    if isinstance(value, (bool, numbers.Real)):
        return float(value)
    kind = getattr(getattr(value, "dtype", None), "kind", None)  # NumPy scalars (np.bool_ is not numbers.Real)
    if kind is not None and kind in "biuf" and getattr(value, "ndim", 1) == 0:
        return float(value)
    return None


def reward_call_kwargs(
    columns: dict[str, Any],
    *,
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    trainer_state: TrainerState | None,
    log_metric: Callable[[str, float], None],
    log_extra: Callable[[str, list], None],
) -> dict[str, Any]:
    """The keyword arguments of one reward-function call, as TRL's `GRPOTrainer` passes them: `columns` (the rows'
    columns, one list entry per completion, and the run's extra keywords such as `environments`) and the keywords
    every call carries. Every call TRAPO makes is built here, and [`STANDARD_REWARD_KWARGS`] (the column names
    [`check_reward_columns`] refuses) is read off this signature, so a keyword added here is refused as a column name
    too (trial 16's N27: a `completion_ids` column was silently replaced by TRAPO's token ids).

    Args:
        columns (`dict[str, Any]`): column or extra keyword -> its values; none may be named like a keyword below
            ([`check_reward_columns`] refuses that first).
        prompts (`list`): `B` prompts (strings, or lists of messages).
        completions (`list`): `B` completions (strings, or lists of messages).
        completion_ids (`list[list[int]]`): `B` completions' token ids.
        trainer_state (`TrainerState`, *optional*): the trainer's state.
        log_metric, log_extra (`Callable`): where the function's own metrics and table columns go.

    Returns:
        `dict[str, Any]`: the call's keyword arguments.

    Raises:
        ValueError: if a key of `columns` is named like a keyword every call carries ([`check_reward_columns`]).
    """
    check_reward_columns(list(columns), "The reward function call's column", "rename it, e.g. to 'my_{column}'")
    standard = dict(
        prompts=prompts,
        completions=completions,
        completion_ids=completion_ids,
        trainer_state=trainer_state,
        log_metric=log_metric,
        log_extra=log_extra,
    )
    return {**columns, **standard}


STANDARD_REWARD_KWARGS = frozenset(
    name
    for name, parameter in inspect.signature(reward_call_kwargs).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
)
"""The keyword arguments every reward function call carries besides the dataset's columns ([`reward_call_kwargs`]'s
keyword-only parameters)."""

SKIPPED_COLUMNS = ("prompt", "completion", *INTERNAL_COLUMNS)
"""Row keys that are not passed to reward functions: `prompt` (passed as `prompts`), `completion` (as TRL skips it)
and the columns TRAPO adds. TRL also skips a `completion_ids` column and passes its own token ids under that name
without a word; TRAPO refuses such a column ([`RESERVED_REWARD_COLUMNS`])."""

RESERVED_REWARD_COLUMNS = STANDARD_REWARD_KWARGS
"""Names no column given to the reward functions may have: the keywords every call carries itself (a `completions`
column made Python's "got multiple values for keyword argument 'completions'"; `trainer_state` and `completion_ids`
columns were silently replaced by the trainer's values). TRL 1.16's `GRPOTrainer` does the same: a `completions` or
`prompts` column raises that `TypeError`, `completion_ids` / `trainer_state` / `log_metric` / `log_extra` columns are
replaced without a word."""


def check_reward_columns(columns: Sequence[str], where: str, fix: str, keywords: Sequence[str] = ()) -> None:
    """Refuse columns that would reach the reward functions under the name of a keyword every call carries
    ([`RESERVED_REWARD_COLUMNS`], and `keywords`: more keywords this run's calls carry, e.g. `environments`).

    Args:
        columns (`Sequence[str]`): the names of the columns (or row keys) given to the reward functions.
        where (`str`): what holds them, for the message (e.g. "`train_dataset` column").
        fix (`str`): how to rename a reserved one; `{column}` is replaced by its name.
        keywords (`Sequence[str]`): more reserved names.

    Raises:
        ValueError: naming the column (every one, with a rename each, when several clash), the reserved names and
            the fix.
    """
    reserved = RESERVED_REWARD_COLUMNS | set(keywords)
    clash = [c for c in columns if c in reserved]
    if len(clash) == 1:
        raise ValueError(
            f"{where} {clash[0]!r} is named like an argument TRAPO passes to every reward function "
            f"({', '.join(sorted(reserved))}): the reward functions would get TRAPO's value in place of yours (or "
            f"Python's 'got multiple values for keyword argument'). Rename it: {fix.format(column=clash[0])}."
        )
    if clash:  # every one named at once, a rename each
        raise ValueError(
            f"{where}s {', '.join(map(repr, clash))} are named like arguments TRAPO passes to every reward function "
            f"({', '.join(sorted(reserved))}): the reward functions would get TRAPO's values in place of yours (or "
            "Python's 'got multiple values for keyword argument'). Rename them:"
            + "".join(f"\n- {fix.format(column=column)}" for column in clash)
        )


def check_scored_columns(
    reward_funcs: Any, train_dataset: Any, eval_dataset: Any, environment_rewards: bool, environments: bool
) -> None:
    """Refuse, at construction (before anything loads), a column that reaches the reward functions under the name of a
    keyword every call carries ([`check_reward_columns`]): of `train_dataset` and of each evaluation set scored by the
    reward functions (prompt rows; those evaluated by loss are not scored). Only reward *functions* get columns: with
    reward models alone there is nothing to check.

    Args:
        reward_funcs: the trainer's `reward_funcs` argument (a function, a model, an id, or a list of them).
        train_dataset, eval_dataset: as given to the trainer (`eval_dataset` may be a dict of datasets).
        environment_rewards (`bool`): an environment's `get_reward` scores (a reward function too).
        environments (`bool`): the calls carry `environments` (an `environment_factory` run).

    Raises:
        ValueError: naming the dataset, the column, the reserved names and the fix.
    """
    entries = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    functions = any(callable(f) and not isinstance(f, (nn.Module, str)) for f in entries)
    if not (functions or environment_rewards):
        return
    scored = [("train_dataset", train_dataset)] if train_dataset is not None else []
    for label, dataset in eval_datasets(eval_dataset):
        columns = set(dataset_columns(dataset))
        if "prompt" in columns and not columns & {"text", "completion", "messages"}:  # as check_data_fits scores
            scored.append((label, dataset))
    for label, dataset in scored:
        check_reward_columns(
            dataset_columns(dataset),
            f"`{label}` column",
            "`dataset.rename_column('{column}', 'my_{column}')` (and read `my_{column}` in the reward function)",
            keywords=("environments",) if environments else (),
        )


def column_parameters_of(func: Callable) -> list[inspect.Parameter]:
    """The parameters of `func` that name a dataset column: not the keywords every call gets
    ([`STANDARD_REWARD_KWARGS`]) nor `*args` / `**kwargs`; [] when its signature cannot be read."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return []
    variadic = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    return [p for p in parameters if p.kind not in variadic and p.name not in STANDARD_REWARD_KWARGS]


def missing_arguments(func: Callable, kwargs: dict) -> list[str]:
    """The required column parameters of `func` ([`column_parameters_of`]: no default, passed by name) that `kwargs`
    does not give."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p.name for p in column_parameters_of(func) if p.kind in named and p.default is p.empty and p.name not in kwargs
    ]


class RewardFunctionError(RuntimeError):
    """A reward function raised; the message names the function, what it raised and how it is called (the
    original exception is the `__cause__`)."""


class EnvironmentRewardError(RewardFunctionError):
    """An environment's `get_reward()` raised (the user's exception is the `__cause__`) or returned something that is
    not a reward; the message names the environment class and its method, not a reward function: the user wrote
    none (`trl_trapo.agents.EnvironmentReward` raises it, and [`call_reward_function`] passes it on unchanged)."""


def completion_form_message(name: str, source: str, conversational: bool, cause: BaseException) -> str:
    """The message for a reward function that fails on the completions' form (strings for text prompts, lists of
    messages for conversational ones) and succeeds on the other form: the prompts' form decides the completions' form,
    as in TRL's `GRPOTrainer`. It starts with `reward function '<name>' raised`; the construction-time check says
    what called it ([`RewardScorer.preflight`])."""
    if conversational:
        given, wanted = "conversational (lists of messages), so completions are lists of messages", "strings"
        fix = (
            "give text prompts (strings), or a reward function that reads lists of messages "
            '(`completion[-1]["content"]`)'
        )
    else:
        given, wanted = (
            "text (strings), so completions are strings",
            'conversational completions (`completion[0]["content"]`)',
        )
        fix = (
            'give conversational prompts (`[{"role": "user", "content": ...}]`: trl.rewards\' think_format_reward, '
            "accuracy_reward and reasoning_accuracy_reward read only these), or a reward function that takes strings"
        )
    return (
        f"reward function '{name}' raised {type(cause).__name__}: {cause}. The prompts of {source} are {given}; "
        f"'{name}' expects {wanted} (it succeeds on those). Fix: {fix}."
    )


async def delivered(coroutine: Any) -> tuple[Any, BaseException | None]:
    """Await a reward coroutine on the scorer's loop and hand back `(value, None)`, or `(None, raised)` when it raises
    `KeyboardInterrupt` or `SystemExit`, for the caller to raise in its own thread.

    An asyncio task re-raises those two out of the event loop: the loop's thread ended, the call's future was never
    settled and `.result()` waited forever (an async reward or an environment's async `get_reward()` that raised
    `KeyboardInterrupt` hung the run). Every other exception travels through the future as usual."""
    try:
        return await coroutine, None
    except (KeyboardInterrupt, SystemExit) as raised:
        return None, raised


def call_reward_function(
    func: Callable, name: str, expected: int, kwargs: dict, loop=None, on_nan: Callable[[int], None] | None = None
) -> list[float]:
    """Call a TRL-contract reward function and check its output; None entries become NaN ("no reward"), and NaN
    entries stay NaN (TRL's `nansum` takes them as None too).

    Args:
        func (`Callable`): the reward function (sync or async).
        name (`str`): its name, for errors.
        expected (`int`): the number of completions.
        kwargs (`dict`): the call's keyword arguments. Each list among them is passed as a copy of its own, so a
            function that changes a list in place (`completions.clear()`, a sort) cannot change what the next
            function receives (TRL hands every function the same list objects; trial 10's DA06 blamed the next,
            innocent function).
        loop (`asyncio.AbstractEventLoop`, *optional*): the running loop async functions are scheduled on (required
            for an async function).
        on_nan (`Callable[[int], None]`, *optional*): called with the number of NaN rewards the function returned
            (not counting None, the documented abstention), when there are any; NaN usually means a failure (a
            judge's reply that did not parse), which the caller says ([`RewardScorer.score`]).

    Raises:
        RuntimeError: naming the function, if it raises.
        ValueError: naming the function, if it returns the wrong number of rewards, or a value that is not a number
            (see `reward_value`: the string "1" is refused, not read as 1.0; named with its type and row) or is
            infinite.
    """
    kwargs = {key: list(value) if isinstance(value, list) else value for key, value in kwargs.items()}
    try:
        if is_async_callable(func):
            if loop is None:
                raise RuntimeError("an async reward function needs the scorer's event loop")
            output, raised = asyncio.run_coroutine_threadsafe(delivered(func(**kwargs)), loop).result()
            if raised is not None:  # as a sync function's would: out of this call, in the caller's thread
                raise raised
        else:
            output = func(**kwargs)
    except EnvironmentRewardError:  # an environment's get_reward(): its message names the method already
        raise
    except Exception as error:  # re-raised with the function's name and the fix
        missing = missing_arguments(func, kwargs) if isinstance(error, TypeError) else []
        if missing:  # trial 8's JC22: TRL's accuracy_reward needs a `solution` column the data names `answer`
            columns = sorted(set(kwargs) - STANDARD_REWARD_KWARGS)
            raise RewardFunctionError(
                f"Reward function '{name}' needs the argument(s) {', '.join(repr(m) for m in missing)}, which "
                f"reward functions get from the dataset's columns, and the dataset has no such column (its other "
                f"columns: {columns}). Rename the column that holds it (in the data file, or "
                f"`dataset.rename_column('<your column>', {missing[0]!r})`), or wrap the function to read the column "
                f"you have. ({type(error).__name__}: {error})"
            ) from error
        raise RewardFunctionError(
            f"Reward function '{name}' raised {type(error).__name__}: {error}. Reward functions are called as "
            "func(prompts=..., completions=..., completion_ids=..., **dataset_columns, trainer_state=..., "
            "log_metric=..., log_extra=...) and must return one float (or None) per completion."
        ) from error
    if isinstance(output, (str, bytes, dict)) or not hasattr(output, "__iter__"):
        raise ValueError(
            f"Reward function '{name}' must return a list with one reward per completion (a number, or None for "
            f"'cannot score'), got a {type(output).__name__}: {output!r:.200}."
        )
    output = list(output)
    values = []
    for row, raw in enumerate(output):
        value = reward_value(raw)
        if value is None:
            prompts = kwargs.get("prompts") or []
            prompt = f" (prompt {str(prompts[row])[:60]!r})" if row < len(prompts) else ""
            raise ValueError(
                f"Reward function '{name}' returned {raw!r:.80} ({type(raw).__name__}) for completion {row} of "
                f"{expected}{prompt}: a reward must be a number (int, float or bool, as TRL's GRPOTrainer accepts) or "
                "None for 'cannot score'. Fix the function to return numbers, e.g. `float(...)` of what it parses."
            )
        values.append(value)
    if any(math.isinf(v) for v in values):
        raise ValueError(f"Reward function '{name}' returned an infinite reward; return finite numbers (or None).")
    if len(values) != expected:
        raise ValueError(
            f"Reward function '{name}' returned {len(values)} rewards for {expected} completions; it must return "
            "exactly one reward per completion (one per entry of `completions`: a function that ignores "
            "len(completions), e.g. returns a list of fixed length, is wrong for other batch sizes)."
        )
    nans = sum(raw is not None and math.isnan(value) for raw, value in zip(output, values))
    if nans and on_nan is not None:
        on_nan(nans)
    return values


def discard_metric(name: str, value: float) -> None:
    """A `log_metric` that drops what it is given (reward calls whose metrics describe no training rollout)."""


def discard_extra(column: str, values: list) -> None:
    """A `log_extra` that drops what it is given."""


class RewardScorer:
    """Scores completions with reward functions and reward models; one weighted score per completion.

    Args:
        funcs (`list`): reward functions (TRL's contract, sync or async) and sequence-classification reward models
            (`num_labels=1`, frozen), in the order of `weights`.
        processing_classes (`list`): one tokenizer per entry of `funcs` (None for functions).
        weights (`Sequence[float]`): one weight per entry; the score is sum_f w_f * r_f over the rewards that are
            not None (NaN when every reward of a completion is None: "no reward for this sample").
        tokenizer: the policy's tokenizer (decodes completions; reward models with the same vocabulary read the
            policy's token ids directly).
        batch_size (`int`): rows per reward-model forward.
        log_metric (`Callable[[str, float], None]`), log_extra (`Callable[[str, list], None]`): what a reward
            function's `log_metric` / `log_extra` arguments call.
        trainer_state (`Callable[[], Any]`): returns the Trainer's state, passed as `trainer_state` (a fresh
            `transformers.TrainerState`, step 0, where it returns None: before the `Trainer` exists).
    """

    def __init__(
        self,
        funcs: list,
        processing_classes: list,
        weights: Sequence[float],
        tokenizer,
        batch_size: int,
        log_metric: Callable[[str, float], None],
        log_extra: Callable[[str, list], None],
        trainer_state: Callable[[], Any],
    ):
        self.funcs = list(funcs)
        self.names = distinct_names([reward_function_name(f) for f in self.funcs])  # one metric key each
        self.processing_classes = list(processing_classes)
        self.weights = torch.tensor(list(weights), dtype=torch.float32)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.log_metric, self.log_extra, self.trainer_state = log_metric, log_extra, trainer_state
        self._same_vocabulary: dict[int, bool] = {}
        self.warned_nan: set[str] = set()  # the functions whose NaN rewards were warned about (once each)
        self.warned_unscored = False  # completions no function scored: warned about once
        self.loop = self._thread = None
        if any(not isinstance(f, nn.Module) and is_async_callable(f) for f in self.funcs):
            self._thread, self.loop, ready = start_event_loop_in_daemon(name="trl-trapo-rewards")
            ready.wait()
            atexit.register(shutdown_event_loop_in_daemon, self._thread, self.loop)

    def close(self) -> None:
        """Stop the async reward loop (if any)."""
        if self.loop is not None:
            shutdown_event_loop_in_daemon(self._thread, self.loop)
            self.loop = self._thread = None

    @property
    def has_functions(self) -> bool:
        """Whether a reward function (not a reward model) scores: only functions get the rows' columns."""
        return any(not isinstance(f, nn.Module) for f in self.funcs)

    def column_parameters(self) -> list[tuple[str, inspect.Parameter]]:
        """(reward function name, parameter) for each parameter that names a dataset column: not the keywords every
        call gets (`prompts`, `completions`, `trainer_state`, ...) nor `*args` / `**kwargs`. Reward models and
        functions whose signature cannot be read are left out."""
        found = []
        for func, name in zip(self.funcs, self.names):
            if not isinstance(func, nn.Module):
                found.extend((name, parameter) for parameter in column_parameters_of(func))
        return found

    def columns_read(self) -> dict[str, list[str]]:
        """Dataset column -> the names of the reward functions whose signature names it as a parameter (e.g.
        `numeric_answer(completions, answer, **kwargs)` reads `answer`; [`column_parameters`])."""
        columns: dict[str, list[str]] = {}
        for name, parameter in self.column_parameters():
            columns.setdefault(parameter.name, []).append(name)
        return columns

    def columns_required(self) -> dict[str, list[str]]:
        """The part of [`columns_read`] whose parameter has no default: column -> the reward functions that cannot be
        called without it (Python's "missing 1 required positional argument")."""
        required: dict[str, list[str]] = {}
        for name, parameter in self.column_parameters():
            if parameter.default is parameter.empty:
                required.setdefault(parameter.name, []).append(name)
        return required

    def reward_kwargs(
        self,
        examples: list[dict],
        prompts: list,
        completions: list,
        completion_ids: list[list[int]],
        log_metric: Callable[[str, float], None] | None = None,
        log_extra: Callable[[str, list], None] | None = None,
        extra_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The keyword arguments of a reward-function call on `B` completions ([`reward_call_kwargs`]): dataset
        columns (all but `SKIPPED_COLUMNS`: prompt / completion, as TRL, and the columns TRAPO added), `extra_kwargs`
        (the tool-calling source's `environments`), the trainer's state and `log_metric` / `log_extra` (default: the
        scorer's, i.e. the training metrics).

        Args:
            examples (`list[dict]`): `B` dataset rows.
            prompts, completions (`list`): `B` each, as the functions get them.
            completion_ids (`list[list[int]]`): `B` completions' token ids.

        Raises:
            ValueError: if a row has a key named like a keyword every call carries ([`check_reward_columns`]; the
                datasets are checked at construction, a rollout source's rounds when they arrive: this is the last
                line, for rows that reach the scorer another way).
        """
        # only functions get the rows' columns: a reward model's rows may hold any name (nothing reads it)
        keys = [k for k in examples[0] if k not in SKIPPED_COLUMNS] if self.has_functions else []
        check_reward_columns(
            keys,
            "The reward functions' rows' key",
            "the dataset column (`dataset.rename_column('{column}', 'my_{column}')`), or the key your rollout "
            "source's examples or rollout_func's output have",
            keywords=list(extra_kwargs or ()),
        )
        columns = {k: [e[k] for e in examples] for k in keys}
        # before the `Trainer` exists (the construction-time check) its state is what `Trainer.__init__` makes: a fresh
        # `TrainerState` at step 0, never None (TRL always passes one; a reward reading `global_step` was refused)
        state = self.trainer_state()
        return reward_call_kwargs(
            {**columns, **(extra_kwargs or {})},
            prompts=prompts,
            completions=completions,
            completion_ids=completion_ids,
            trainer_state=state if state is not None else TrainerState(),
            log_metric=log_metric or self.log_metric,
            log_extra=log_extra or self.log_extra,
        )

    def preflight(
        self,
        rows: list[dict],
        extra_kwargs: dict[str, Any] | None = None,
        source: str = "dataset",
        train_columns: list[str] | None = None,
    ) -> None:
        """Call every reward function once on dataset rows with empty completions, before training. What they log
        (`log_metric` / `log_extra`) is discarded: it describes no completion the policy made. `extra_kwargs`: more
        keywords, one list entry per row (the tool-calling source's `environments`). `source`: which dataset the rows
        are of, for the message (e.g. "`eval_dataset`"); `train_columns`: the RL prompts' columns, named next to the
        rows' own when a reward function fails on rows of another dataset (e.g. an eval set whose answer column is
        named differently).

        Raises:
            RuntimeError, ValueError: as `call_reward_function`, naming the function, the same type, its message
                prefixed with what this call is (the construction-time check, empty completions, the dataset), the
                original exception chained; the advice to accept an empty completion only when the function scores
                filled ones (each row's answer column, else "0": called again, unless the failure was an OSError). When several functions fail, every one is named in one message (the
                first one's type and exception).
        """
        prompts = [r["prompt"] for r in rows]
        conversational = is_conversational({"prompt": prompts[0]})
        no_ids = [[] for _ in rows]  # `completions` is each probe's own
        kwargs = self.reward_kwargs(rows, prompts, no_ids, no_ids, discard_metric, discard_extra, extra_kwargs)

        def probe(func, name, as_messages: bool, texts: list[str] | None = None) -> None:
            texts = texts or ["" for _ in rows]
            completions = [[{"role": "assistant", "content": t}] if as_messages else t for t in texts]
            call_reward_function(func, name, len(rows), {**kwargs, "completions": completions}, self.loop)

        # trial 14's C13 / C14: the advice on empty completions was added to every failure (a class's constructor, an
        # unreachable server); it belongs to a function that fails on the empty completion and scores a filled one
        filled = [str(next((r[c] for c in COMPLETION_COLUMNS if r.get(c) not in (None, "")), "0")) for r in rows]

        def fails_only_when_empty(func, name, error: BaseException | None) -> bool:
            """Whether `func` scores filled completions (each row's answer column, else "0"): its failure on the
            empty ones is theirs. Not tried after an OSError (the network, a file): a second call could wait for
            the same timeout, and the completion is not at fault."""
            for _ in range(20):
                if error is None or isinstance(error, OSError):
                    break
                error = error.__cause__ or error.__context__
            if error is not None:
                return False
            try:
                probe(func, name, conversational, filled)
            except Exception:
                return False
            return True

        failures = []  # (type, the function's part of the message, the exception to chain, a form message), each
        empties = []  # the functions that fail on empty completions only
        for func, name in zip(self.funcs, self.names):
            if isinstance(func, nn.Module):
                continue
            try:
                probe(func, name, conversational)
            except EnvironmentRewardError as error:  # no completion is involved: said without the functions' advice
                raise EnvironmentRewardError(
                    f"In TRAPOTrainer's construction-time check (each environment's get_reward() is called once on "
                    f"fresh instances reset with the first {len(rows)} row(s) of {source}, before any tool call and "
                    f"before anything slow), {error} get_reward() must also work on an environment no tool was "
                    "called on (return 0.0 or None there)."
                ) from (error.__cause__ or error)
            except (RewardFunctionError, ValueError) as error:
                cause = error.__cause__
                if isinstance(error, RewardFunctionError) and isinstance(
                    cause, (IndexError, KeyError, TypeError, AttributeError)
                ):
                    # trial 9's RW05: TRL's think_format_reward reads `completion[0]["content"]`; on text prompts the
                    # completions are strings and it fails at the index, which is no fault of the empty completion
                    try:
                        probe(func, name, not conversational)
                    except (RewardFunctionError, ValueError):
                        pass  # fails either way: the generic message below
                    else:
                        text = completion_form_message(name, source, conversational, cause)
                        failures.append((RewardFunctionError, text, cause, True))
                        continue
                failures.append((type(error), f"reward function '{name}' failed. {error}", cause or error, False))
                if fails_only_when_empty(func, name, error):
                    empties.append(name)
        if not failures:
            return
        columns = sorted(rows[0])
        hint = ""
        if train_columns is not None and set(columns) != set(train_columns):
            hint = (
                f" {source} has columns {columns}, the RL prompts (train_dataset) have {sorted(train_columns)}:"
                f" reward functions get the same keywords on both, so give {source} the reward columns, "
                "e.g. `.rename_column('solution', 'answer')`."
            )
        if source == "`train_dataset`" and "completion" in columns:  # trial 11's N60: SFT data in the RL slot
            hint += (
                " Its 'completion' column is not passed to reward functions (TRL's GRPOTrainer skips it too);"
                " if these rows are SFT demonstrations (TRL's SFTTrainer takes them as its train_dataset), "
                "pass them as `sft_dataset=`: `train_dataset` is the RL prompts."
            )
        empty = ""
        if empties:  # the functions' names only when some of several failures are about something else
            which = (
                "" if len(empties) == len(failures) else f" ({', '.join(repr(n) for n in empties)} scored filled ones)"
            )
            empty = f" A reward function must also accept an empty completion (return 0.0 or None for it){which}."
        check = "In TRAPOTrainer's construction-time check (each reward function is called on"
        rest = f"of {source} with empty completions, before anything slow)"
        kind, text, cause, form = failures[0]
        if len(failures) == 1:
            if form:  # the completions' form: its own fix
                raise kind(f"{check} rows {rest}, {text}") from cause
            raise kind(f"{check} the first {len(rows)} row(s) {rest}, {text}{hint}{empty}") from cause
        # every function that fails, in one message (trial 12's N49 sibling: one function was named per run)
        items = "".join(f"\n- {text}" for _, text, _, _ in failures)
        tail = "" if all(form for *_, form in failures) else f"{hint}{empty}".strip()
        tail = "\n" + tail if tail else ""
        raise kind(
            f"{check} the first {len(rows)} row(s) {rest}, {len(failures)} reward functions failed, each with its "
            f"error:{items}{tail}"
        ) from cause

    def score(
        self,
        examples: list[dict],
        prompt_ids: list[torch.Tensor],
        completion_ids: list[torch.Tensor],
        log_metric: Callable[[str, float], None] | None = None,
        log_extra: Callable[[str, list], None] | None = None,
        completions: list | None = None,
        extra_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Score `B` completions.

        Args:
            examples (`list[dict]`): one dataset row per completion (`prompt` and the reward columns).
            prompt_ids (`list[torch.Tensor]`): `(P_i,)` prompt token ids.
            completion_ids (`list[torch.Tensor]`): `(C_i,)` completion token ids.
            log_metric, log_extra (`Callable`, *optional*): where the reward functions' `log_metric` / `log_extra`
                go for this call (default: the scorer's, i.e. the training metrics). Evaluation passes its own, so
                what a function logs on held-out prompts never lands in a training log; `discard_metric` /
                `discard_extra` drop it.
            completions (`list`, *optional*): what reward functions get as `completions` (default: the decoded
                completions, one assistant message each for conversational prompts); the tool-calling source passes
                TRL's structured turns (assistant and tool messages).
            extra_kwargs (`dict`, *optional*): more reward-function keywords, one list entry per completion (the
                tool-calling source's `environments`).

        Returns:
            tuple `(scores, per_func)`: `(B,)` weighted scores (NaN = no reward) and `(B, F)` rewards per function.

        Logs a warning the first time each function returns NaN (naming it, how many of how many; NaN is taken as
        None, "no reward", as TRL takes it, but usually means the function failed), and the first time some but not
        all completions of a call get no reward from any function (TRL warns "All reward functions returned None"
        for such a sample; a round where none is scored is `RLSupply`'s to say).
        """
        prompts = [e["prompt"] for e in examples]
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        conversational = is_conversational({"prompt": prompts[0]})
        if completions is None:
            completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        per_func = torch.full((len(examples), len(self.funcs)), math.nan)
        ids = [c.tolist() for c in completion_ids]
        kwargs = self.reward_kwargs(examples, prompts, completions, ids, log_metric, log_extra, extra_kwargs)
        for i, (func, name, reward_tokenizer) in enumerate(zip(self.funcs, self.names, self.processing_classes)):
            if isinstance(func, nn.Module):
                per_func[:, i] = self._model_scores(func, reward_tokenizer, prompts, texts, prompt_ids, completion_ids)
            else:
                values = call_reward_function(
                    func,
                    name,
                    len(examples),
                    kwargs,
                    self.loop,
                    on_nan=lambda count, name=name: self._warn_nan(name, count, len(examples)),
                )
                per_func[:, i] = torch.tensor(values)
        valid = ~torch.isnan(per_func)
        weighted = torch.where(valid, per_func * self.weights, torch.zeros(()))
        scores = torch.where(valid.any(dim=1), weighted.sum(dim=1), torch.full((len(examples),), math.nan))
        unscored = int((~valid.any(dim=1)).sum()) if self.funcs else 0
        if 0 < unscored < len(examples) and not self.warned_unscored:
            self.warned_unscored = True
            logger.warning(
                "%d of %d completions got no reward from any reward function (%s returned None or NaN for each of "
                'them), so they are not trained on (TRL warns "All reward functions returned None" for such a '
                "sample). Make sure at least one reward function scores every completion; `rewards/<function>/"
                "unscored_frac` logs each function's share. (Warned once.)",
                unscored,
                len(examples),
                ", ".join(repr(n) for n in self.names),
            )
        return scores, per_func

    def _warn_nan(self, name: str, count: int, total: int) -> None:
        """Warn, the first time only, that reward function `name` returned NaN for `count` of `total` completions."""
        if name in self.warned_nan:
            return
        self.warned_nan.add(name)
        logger.warning(
            "Reward function '%s' returned NaN for %d of %d completions: NaN is treated as None, \"no reward for this "
            'sample" (as TRL treats it): the completion is scored by the other reward functions, or not trained on '
            "if none scores it. NaN usually means the function failed (e.g. a judge's reply that did not parse); "
            "return None to abstain on purpose. `rewards/%s/unscored_frac` logs the share it abstains on. (Warned "
            "once per function.)",
            name,
            count,
            total,
            name,
        )

    def _model_scores(self, model, tokenizer, prompts, texts, prompt_ids, completion_ids) -> torch.Tensor:
        same = self._same_vocabulary.get(id(tokenizer))
        if same is None:
            same = tokenizer is self.tokenizer or tokenizer.get_vocab() == self.tokenizer.get_vocab()
            self._same_vocabulary[id(tokenizer)] = same
        pad = embedding_safe_pad_id(tokenizer, model)  # never an id the reward model cannot embed
        if same:
            sequences = [torch.cat([p, c]) for p, c in zip(prompt_ids, completion_ids)]
            input_ids = pad_tensors(sequences, padding_value=pad)
            attention_mask = pad_tensors([torch.ones_like(s) for s in sequences], padding_value=0)
        else:
            if is_conversational({"prompt": prompts[0]}):
                full = [
                    tokenizer.apply_chat_template(p + [{"role": "assistant", "content": t}], tokenize=False)
                    for p, t in zip(prompts, texts)
                ]
            else:
                full = [p + t for p, t in zip(prompts, texts)]
            encoded = tokenizer(
                full, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
            )
            attention_mask = encoded["attention_mask"]
            input_ids = encoded["input_ids"].masked_fill(attention_mask == 0, pad)
        return reward_model_scores(model, input_ids, attention_mask, self.batch_size)


def check_reward_paths(reward_funcs: Any, reward_model: Any) -> None:
    """[`check_reward_checkpoint`] before anything loads, on each reward model given by local path (an entry of
    `reward_funcs`, or `reward_model`): its config only, no weights. A Hub id is checked when it loads.

    Raises:
        ValueError: from [`check_reward_checkpoint`], naming the argument.
    """
    entries = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    for given_as, entry in [*(("reward_funcs", e) for e in entries), ("reward_model", reward_model)]:
        if isinstance(entry, str) and os.path.isdir(os.path.expanduser(entry)):
            check_reward_checkpoint(os.path.expanduser(entry), given_as)


def check_reward_checkpoint(model_id: str, given_as: str = "reward_funcs") -> None:
    """Refuse a reward model id / path whose checkpoint is not a sequence-classification model: its config.json's
    `architectures` name only other heads (e.g. `LlamaForCausalLM`). Loaded with `AutoModelForSequenceClassification`
    (as TRL does), such a checkpoint gets a newly initialised `score` head, so its rewards would be random; transformers
    only lists the weight as MISSING in its load report. A checkpoint that does not record its architectures is
    accepted.

    Args:
        model_id (`str`): the id or path, as given.
        given_as (`str`): the argument that gave it (`reward_funcs` or `reward_model`), for the message.

    Raises:
        ValueError: naming the argument, the checkpoint's class and the fix.
    """
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_id)
    except (OSError, ValueError):  # loading it reports the problem, with the argument (`check_model_source`)
        return
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise ValueError(
            f"{given_as}={model_id!r} is a {architectures[0]} checkpoint (config.json's `architectures`), not a "
            "reward model: loaded as one, it gets a newly initialised score head, so its rewards would be random. "
            "Give a sequence-classification reward model (num_labels=1, trained to score completions), or a reward "
            "function (`reward_funcs`)."
        )


def load_reward_funcs(reward_funcs, reward_model, reward_processing_classes, tokenizer) -> tuple[list, list]:
    """The reward functions and models of a run, with one tokenizer each (None for functions).

    Args:
        reward_funcs: a reward function, a model id / path, a sequence-classification model, or a list (or tuple)
            of them.
        reward_model (`PreTrainedModel`, *optional*): a reward model given PPO-style; it comes last.
        reward_processing_classes: a tokenizer, or a list with one per reward (None entries reuse `tokenizer`).
        tokenizer: the policy's tokenizer.

    Returns:
        tuple `(funcs, processing_classes)`: models loaded (from ids) and frozen in eval mode.

    Raises:
        ValueError: if `reward_processing_classes` is a list of the wrong length; if a reward model given as a
            local folder has no tokenizer files and no tokenizer of its own is given (`paths.check_tokenizer_source`).
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if reward_funcs is None:
        reward_funcs = []
    elif not isinstance(reward_funcs, (list, tuple)):
        reward_funcs = [reward_funcs]
    reward_funcs = list(reward_funcs) + ([reward_model] if reward_model is not None else [])
    if not isinstance(reward_processing_classes, list):
        reward_processing_classes = [reward_processing_classes] * len(reward_funcs)
    if len(reward_processing_classes) != len(reward_funcs):
        raise ValueError(
            f"`reward_processing_classes` has {len(reward_processing_classes)} entries for {len(reward_funcs)} "
            "reward functions/models; give one per reward (None reuses the policy's tokenizer)."
        )
    funcs, processing_classes = [], []
    for index, (func, reward_tokenizer) in enumerate(zip(reward_funcs, reward_processing_classes)):
        if isinstance(func, str):
            check_model_source(func, "reward_funcs")
            given_as = (
                "reward_model" if reward_model is not None and index == len(reward_funcs) - 1 else "reward_funcs"
            )
            check_reward_checkpoint(func, given_as)
            if reward_tokenizer is None:  # loaded from the reward model's folder: one without tokenizer files is named
                check_tokenizer_source(
                    func, given_as, "Fix: pass its tokenizer as `reward_processing_classes` (one per reward)"
                )
            reward_tokenizer = reward_tokenizer or AutoTokenizer.from_pretrained(func)
            func = AutoModelForSequenceClassification.from_pretrained(func, num_labels=1)
        if isinstance(func, nn.Module):
            func.eval().requires_grad_(False)
            if reward_tokenizer is None:
                reward_tokenizer = tokenizer
            name = reward_function_name(func)
            if reward_tokenizer.pad_token_id is None:  # batches of several completions are padded (as TRL's GRPO)
                if reward_tokenizer.eos_token is None:
                    raise ValueError(
                        f"The tokenizer of reward model '{name}' has neither a pad nor an EOS token; set its "
                        "`pad_token` and pass it in `reward_processing_classes`."
                    )
                reward_tokenizer.pad_token = reward_tokenizer.eos_token
                logger.info("Reward model '%s': its tokenizer had no pad token; using its EOS token.", name)
            set_pad_token_id(func, reward_tokenizer.pad_token_id, f"reward model '{name}'")
        funcs.append(func)
        processing_classes.append(reward_tokenizer)
    return funcs, processing_classes


def set_pad_token_id(model: nn.Module, pad_token_id: int, what: str) -> None:
    """Give a sequence-classification model without `config.pad_token_id` its tokenizer's pad id, as TRL's GRPO does
    for reward models: transformers refuses batches of more than one row without it ("Cannot handle batch sizes > 1
    if no padding token is defined"). TRAPO reads the head at the last real token itself, so the id only needs to
    exist. The change is logged."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = pad_token_id
        logger.info("%s had no config.pad_token_id; set it to %d (its tokenizer's pad token).", what, pad_token_id)
