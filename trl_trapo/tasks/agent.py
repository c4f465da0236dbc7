# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The built-in agent task: multiplication the tiny model cannot compute and can solve by calling a tool.

| family | prompt → answer | SFT | RL | tool |
|---|---|---|---|---|
| `mul` | `"mul 347 28="` → `"9716"` (two integers of 2 or 3 digits) | traces | prompts + `multiply` | `multiply(a, b)` |

A 0.5M-parameter character-level model trained for minutes does not learn multi-digit multiplication: held-out
products are unseen strings of up to 6 digits. With the tool the task is two copies: the operands from the prompt
into the call's JSON arguments, the tool's result into the answer. A whole exchange, rendered by
[`~trl_trapo.agents.use_tool_chat_template`], is at most 114 characters (a test checks every rendered trace against
`MAX_TRACE_CHARACTERS` = 128, half of the tiny model's 256 positions):

    T:multiply(a,b)
    u:mul 347 238=
    a:<c>{"name":"multiply","arguments":{"a":347,"b":238}}</c></s>t:82586
    a:82586</s>

What ships ([`make_agent_task`]): SFT traces in TRL's conversational format (assistant `tool_calls`, `tool` messages,
a `tools` column of JSON schemas; trained with `assistant_only_loss=True`), RL prompts with an `answer` column, the
tool [`multiply`] (TRL's `tools=` contract: type hints and a Google-style docstring; it refuses arguments that are
not integers, so a call with bad arguments counts as a failed call), the reward [`final_answer_reward`] (exact match
of the final assistant message), and held-out evaluation prompts whose operand pairs occur in no trace and no RL
prompt (in either order). [`evaluate_agent`] runs greedy multi-turn rollouts through the same loop training uses
([`~trl_trapo.agents.ToolRolloutSource`]) with the tool, or with tools withheld, and measures accuracy and tool-call
validity. [`as_conversation`] turns the rows of the other built-in families (`trl_trapo.tasks`) into chat rows, so
that one `sft_dataset` with `assistant_only_loss=True` holds traces and demonstrations together.

Why a module of its own and not a family in `trl_trapo.tasks`: the families there are plain-text prompt → answer
pairs scored by one greedy `generate`; this one needs the tool-calling chat template, a tool, conversational data and
a multi-turn evaluation through `trl_trapo.agents`, which `trl_trapo.tasks` (imported by everything that builds the
tiny model) should not depend on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Dataset
from transformers import GenerationConfig, PreTrainedModel
from transformers.utils import get_json_schema

from ..agents import AgentSpec, GreedyTurnEngine, Rollout, greedy_tool_rollouts


AGENT_FAMILY = "mul"
AGENT_SPLIT = "agent"
MAX_TRACE_CHARACTERS = 128  # prompt + every turn of a rendered trace, in characters (`</s>` counts 4)
OPERAND_DIGITS = (2, 3)  # an operand has 2 or 3 digits, equally often


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Raises:
        TypeError: if an argument is not an integer (a bool is not one), so that a call with bad arguments fails.
    """
    for name, value in (("a", a), ("b", b)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    return a * b


AGENT_TOOLS: tuple[Callable, ...] = (multiply,)


def agent_prompt(a: int, b: int) -> str:
    """The user message of one problem, e.g. `"mul 347 238="`."""
    return f"{AGENT_FAMILY} {a} {b}="


def agent_trace(a: int, b: int) -> list[dict]:
    """The demonstration of one problem in TRL's conversational format: the user's question, the assistant's call of
    `multiply`, the tool's result and the assistant's final answer (the result, copied).

    Returns:
        `list[dict]`: four messages (`user`, `assistant` with `tool_calls`, `tool`, `assistant`).
    """
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
    return [
        {"role": "user", "content": agent_prompt(a, b)},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": str(multiply(a, b))},
        {"role": "assistant", "content": str(multiply(a, b))},
    ]


@dataclass
class AgentTask:
    """The datasets, tool and reward of the built-in agent task (module docstring).

    Args:
        sft (`Dataset`): traces: `messages` (four messages, see [`agent_trace`]) and `tools` (a JSON string of the
            tools' schemas, as TRL's `SFTTrainer` and `TRAPOTrainer` read it).
        rl_train (`Dataset`): RL prompts: `prompt` (one user message), `answer` (the product, text) and `task`.
        eval (`Dataset`): held-out prompts, the same columns plus `split` (`"agent"`); no operand pair of it occurs
            in `sft` or `rl_train`, in either order.
        tools (`list[Callable]`): `[multiply]`, for `tools=`.
        reward_funcs (`list[Callable]`): `[final_answer_reward]`.
    """

    sft: Dataset
    rl_train: Dataset
    eval: Dataset
    tools: list[Callable] = field(default_factory=lambda: list(AGENT_TOOLS))
    reward_funcs: list[Callable] = field(default_factory=list)


def make_agent_task(
    seed: int = 0,
    *,
    num_sft: int = 2000,
    num_rl: int = 1000,
    num_eval: int = 200,
    operand_digits: tuple[int, ...] = OPERAND_DIGITS,
) -> AgentTask:
    """Generate the seeded agent task (module docstring).

    Each operand first draws its number of digits uniformly from `operand_digits`, then a number of that many digits
    (no leading zero), so that answers of every length are common: the copy of the tool's result has to find where
    the result ends, not learn a fixed offset (with operands uniform in [10, 999], two thirds of the products have six
    digits, and a model trained on them copied six-digit results and got shorter ones wrong). The held-out pairs are
    drawn first; training pairs are drawn from the rest (neither `(a, b)` nor `(b, a)` of a held-out pair),
    independently for SFT traces and RL prompts.

    Args:
        seed (`int`): seed of every random choice; the same seed gives identical datasets.
        num_sft (`int`): SFT traces. num_rl (`int`): RL prompts. num_eval (`int`): held-out prompts.
        operand_digits (`tuple[int, ...]`): the numbers of digits an operand may have, each 1 to 3 (three keeps
            every rendered trace within `MAX_TRACE_CHARACTERS`).

    Returns:
        [`AgentTask`].

    Raises:
        ValueError: naming the argument, if a count is not a whole number >= 0, `num_eval` is 0, `operand_digits`
            is empty or holds something other than 1, 2 or 3, or the digits allow too few pairs to hold `num_eval`
            out (at most a quarter of them).
    """
    for name, value in (("num_sft", num_sft), ("num_rl", num_rl), ("num_eval", num_eval)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"make_agent_task: `{name}` must be a whole number >= 0, got {value!r}.")
    if num_eval == 0:
        raise ValueError("make_agent_task: `num_eval` must be >= 1 (the held-out prompts), got 0.")
    digits = tuple(operand_digits) if isinstance(operand_digits, (tuple, list)) else ()
    if not digits or any(d not in (1, 2, 3) or isinstance(d, bool) for d in digits):
        raise ValueError(
            f"make_agent_task: `operand_digits` must list digit counts of 1, 2 or 3, got {operand_digits!r} (longer "
            f"operands would make traces longer than {MAX_TRACE_CHARACTERS} characters)."
        )
    digits = tuple(sorted(set(digits)))
    numbers = sum(9 * 10 ** (d - 1) for d in digits)
    if num_eval > numbers * numbers // 4:
        raise ValueError(
            f"make_agent_task: `num_eval={num_eval}` holds out too much of the {numbers * numbers} pairs of "
            f"operand_digits={digits}: use num_eval <= {numbers * numbers // 4} or more digits."
        )
    rng = random.Random(seed)

    def operand() -> int:
        length = rng.choice(digits)
        return rng.randint(10 ** (length - 1) if length > 1 else 0, 10**length - 1)

    held_out: list[tuple[int, int]] = []
    excluded: set[tuple[int, int]] = set()
    while len(held_out) < num_eval:
        pair = (operand(), operand())
        if pair not in excluded:
            held_out.append(pair)
            excluded |= {pair, pair[::-1]}

    def training_pairs(n: int) -> list[tuple[int, int]]:
        pairs = []
        while len(pairs) < n:
            pair = (operand(), operand())
            if pair not in excluded:
                pairs.append(pair)
        return pairs

    schemas = json.dumps([get_json_schema(tool) for tool in AGENT_TOOLS])
    sft = Dataset.from_dict(
        {"messages": [agent_trace(a, b) for a, b in training_pairs(num_sft)], "tools": [schemas] * num_sft}
    )

    def prompts(pairs: Sequence[tuple[int, int]], split: str | None) -> Dataset:
        columns: dict[str, list] = {
            "prompt": [[{"role": "user", "content": agent_prompt(a, b)}] for a, b in pairs],
            "answer": [str(multiply(a, b)) for a, b in pairs],
            "task": [AGENT_FAMILY] * len(pairs),
        }
        if split is not None:
            columns["split"] = [split] * len(pairs)
        return Dataset.from_dict(columns)

    return AgentTask(
        sft=sft,
        rl_train=prompts(training_pairs(num_rl), None),
        eval=prompts(held_out, AGENT_SPLIT),
        reward_funcs=[final_answer_reward],
    )


def final_answer(completion: str | list[dict] | dict) -> str:
    """The text of a completion's final assistant message, stripped (`""` when it has none).

    Args:
        completion: TRL's structured completion (the assistant and tool messages of a rollout), one message, or
            plain text (returned stripped).

    Raises:
        TypeError: for anything else.
    """
    if isinstance(completion, str):
        return completion.strip()
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, list):
        raise TypeError(f"A completion must be text or a list of messages, got {type(completion).__name__}.")
    for message in reversed(completion):
        if message.get("role", "assistant") == "assistant":
            return str(message.get("content") or "").strip()
    return ""


def final_answer_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    """Exact match of each rollout's final assistant message with its answer (TRL's reward-function signature).

    Args:
        completions (`list`): per rollout, TRL's structured completion (assistant and tool messages) or text.
        answer (`list[str]`): the dataset's `answer` column.
        **kwargs: other columns and trainer extras; ignored.

    Returns:
        `list[float]`: 1.0 where the final assistant message, stripped, equals the answer, else 0.0.

    Raises:
        ValueError: if `completions` and `answer` differ in length.
    """
    if len(completions) != len(answer):
        raise ValueError(f"Got {len(completions)} completions but {len(answer)} answers; they must match one to one.")
    return [float(final_answer(c) == str(a).strip()) for c, a in zip(completions, answer)]


def as_conversation(dataset: Dataset) -> Dataset:
    """Rows of the built-in suite (`trl_trapo.tasks`) as chat rows, to train and evaluate next to the agent task.

    Prompt-completion rows (the suite's `sft`) become `messages` = [user prompt, assistant completion] with an empty
    `tools` cell (None), so they share one `sft_dataset` with the traces under `assistant_only_loss=True`; prompt-only
    rows (`rl_train`, `eval`) get `prompt` = [user message]. Other columns are kept.

    Raises:
        ValueError: if the dataset has no `prompt` column or its prompts are not text.
    """
    if "prompt" not in dataset.column_names:
        raise ValueError(f"as_conversation: the dataset needs a `prompt` column; it has {dataset.column_names}.")
    if len(dataset) and not isinstance(dataset[0]["prompt"], str):
        raise ValueError("as_conversation: the prompts are not text (already conversational?).")
    if "completion" in dataset.column_names:
        others = [c for c in dataset.column_names if c not in ("prompt", "completion")]
        rows = [
            {
                "messages": [{"role": "user", "content": p}, {"role": "assistant", "content": c}],
                "tools": None,
                **{k: dataset[i][k] for k in others},
            }
            for i, (p, c) in enumerate(zip(dataset["prompt"], dataset["completion"]))
        ]
        return Dataset.from_list(rows)
    return dataset.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})


def mixed_sft_dataset(datasets: Sequence[Dataset], seed: int = 0) -> Dataset:
    """One `sft_dataset` of agent traces and chat rows (e.g. [`as_conversation`] of the suite's demonstrations),
    shuffled with `seed`.

    `datasets.concatenate_datasets` refuses them (their `messages` have different fields: the traces' carry
    `tool_calls` and `name`); rebuilt from their rows, the schema is the union and absent fields are None, which the
    chat template renders as nothing.

    Raises:
        ValueError: if a dataset has no `messages` column.
    """
    rows: list[dict] = []
    for dataset in datasets:
        if "messages" not in dataset.column_names:
            raise ValueError(f"mixed_sft_dataset: every dataset needs `messages`; one has {dataset.column_names}.")
        rows += [{"messages": row["messages"], "tools": row.get("tools")} for row in dataset]
    return Dataset.from_list(rows).shuffle(seed=seed)


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation: greedy multi-turn rollouts through the training loop
# ---------------------------------------------------------------------------------------------------------------------


class GreedyEngine(GreedyTurnEngine):
    """The `sample` of [`~trl_trapo.rollout.RolloutEngine`] for evaluation: greedy decoding (`do_sample=False`) with
    the model as it is, no behaviour log-probs (zeros), completions cut after the EOS
    ([`~trl_trapo.agents.GreedyTurnEngine`] with the tokenizer's EOS and pad ids; the trainer's evaluation builds one
    from the run's generation settings).

    Args:
        model (`PreTrainedModel`): the policy (put in eval mode by the caller).
        tokenizer: its tokenizer (pad and EOS ids).
        batch_size (`int`, *optional*): contexts per `generate` call (all at once when None).
    """

    def __init__(self, model: PreTrainedModel, tokenizer, batch_size: int | None = None):
        config = GenerationConfig(
            do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        super().__init__(model, config, tokenizer.pad_token_id, [tokenizer.eos_token_id], batch_size)
        self.tokenizer = tokenizer


@torch.no_grad()
def evaluate_agent(
    model: PreTrainedModel,
    tokenizer,
    dataset: Dataset,
    tools: Sequence[Callable] = AGENT_TOOLS,
    *,
    response_length: int = 96,
    max_iterations: int = 2,
    batch_size: int | None = 256,
) -> dict[str, float]:
    """Greedy multi-turn accuracy and tool-call validity of `model` on conversational prompts with an `answer`.

    Each prompt is rendered with the schemas of `tools` (none when `tools` is empty: the tools are withheld, and a
    call the model still writes fails as an unknown tool) and rolled out greedily through the training loop,
    [`~trl_trapo.agents.ToolRolloutSource`] ([`~trl_trapo.agents.greedy_tool_rollouts`], which the trainer's
    evaluation of a tools run also uses): a turn, its tool calls run, their results appended as token ids, the
    next turn, at most `max_iterations` rounds of calls, `response_length` tokens in all (tool results included).
    The model's train/eval mode is restored.

    Args:
        model (`PreTrainedModel`): the policy.
        tokenizer: its tokenizer, with a tool-calling chat template and a response parser
            ([`~trl_trapo.agents.use_tool_chat_template`]).
        dataset (`Dataset`): `prompt` (chat messages) and `answer` rows, e.g. [`AgentTask.eval`].
        tools (`Sequence[Callable]`): the tools the model may call; `()` withholds them.
        response_length (`int`): completion budget per rollout, in tokens.
        max_iterations (`int`): rounds of tool calls per rollout (`max_tool_calling_iterations`).
        batch_size (`int`, *optional*): rollouts per `generate` call.

    Returns:
        `dict[str, float]`: `accuracy` (fraction of rollouts whose final assistant message equals the answer, in
        [0, 1]), `tool_call_validity` (fraction of tool calls that parse, name a tool of `tools` and run with their
        arguments: valid JSON, an object, integers; 0.0 without calls), `tool_calls_per_prompt` (mean) and
        `turns_per_prompt` (assistant turns, mean).

    Raises:
        ValueError: if `dataset` lacks `prompt` or `answer`, is empty, its prompts are not conversational, or the
            tokenizer cannot express tool calls (see [`~trl_trapo.agents.check_chat_template`]).
    """
    for column in ("prompt", "answer"):
        if column not in dataset.column_names:
            raise ValueError(f"evaluate_agent: `dataset` needs a `{column}` column; it has {dataset.column_names}.")
    if len(dataset) == 0:
        raise ValueError("evaluate_agent: `dataset` is empty.")
    was_training = model.training
    model.eval()
    try:
        rollouts = greedy_tool_rollouts(
            GreedyEngine(model, tokenizer, batch_size),
            dataset,
            AgentSpec.build(list(tools), None),
            tokenizer,
            response_length=response_length,
            context=getattr(model.config, "max_position_embeddings", None),
            max_iterations=max_iterations,
        )
    finally:
        model.train(was_training)
    return score_rollouts(rollouts)


def score_rollouts(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Accuracy and tool-call validity of finished rollouts (what [`evaluate_agent`] reports).

    Args:
        rollouts (`Sequence[Rollout]`): finished rollouts of [`~trl_trapo.agents.ToolRolloutSource`]; each row's
            `example["answer"]` is the reference, `messages` the structured completion, `calls` / `failures` /
            `turns` the loop's counts (a failed call: unparsable, an unknown tool, arguments that are not an object,
            or the tool raised).

    Returns:
        `dict[str, float]`: `accuracy` ([`final_answer_reward`] averaged), `tool_call_validity` (1 - failures /
        calls; 0.0 without calls), `tool_calls_per_prompt` and `turns_per_prompt` (means).

    Raises:
        ValueError: if `rollouts` is empty.
    """
    if not rollouts:
        raise ValueError("score_rollouts: no rollouts to score.")
    correct = final_answer_reward([r.messages for r in rollouts], [r.example["answer"] for r in rollouts])
    calls = sum(r.calls for r in rollouts)
    failures = sum(r.failures for r in rollouts)
    return {
        "accuracy": sum(correct) / len(correct),
        "tool_call_validity": (calls - failures) / calls if calls else 0.0,
        "tool_calls_per_prompt": calls / len(rollouts),
        "turns_per_prompt": sum(r.turns for r in rollouts) / len(rollouts),
    }


def rendered_trace(tokenizer, messages: list[dict], tools: str | list | None) -> str:
    """A trace as the chat template renders it (prompt and every turn), for the length check.

    Args:
        tokenizer: a tokenizer with a tool-calling chat template.
        messages (`list[dict]`): the trace.
        tools: the row's `tools` cell (a JSON string or a list of schemas) or None.

    Returns:
        `str`: the rendered text; `len()` of it is the length in characters.
    """
    schemas = json.loads(tools) if isinstance(tools, str) else tools
    return tokenizer.apply_chat_template(messages, tools=schemas or None, tokenize=False)


__all__ = [
    "AGENT_FAMILY",
    "AGENT_SPLIT",
    "AGENT_TOOLS",
    "MAX_TRACE_CHARACTERS",
    "OPERAND_DIGITS",
    "AgentTask",
    "GreedyEngine",
    "agent_prompt",
    "agent_trace",
    "as_conversation",
    "evaluate_agent",
    "final_answer",
    "final_answer_reward",
    "make_agent_task",
    "mixed_sft_dataset",
    "multiply",
    "rendered_trace",
    "score_rollouts",
]
