# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Multi-turn tool calling as a rollout source: TRL's `tools=` and `environment_factory=` contract on TRAPO.

A GRPOTrainer agent script moves over by changing the import and the config class:

- `tools=[f, ...]`: plain functions (sync or async) with type hints and a Google-style docstring; their JSON schemas
  come from transformers' `get_json_schema` and are rendered into each prompt by the chat template (`tools=`).
- `environment_factory=`: a class or zero-argument callable (one instance per rollout, pooled across rounds), or a
  dict `{name: factory}` chosen by the dataset's `environment` column. `reset(**row)` is called with the dataset row
  (without `environment` in dict mode) before each rollout; text it returns is appended to the prompt's last message.
  The instance's public methods are its tools; an optional `get_reward()` becomes an extra reward (weight 1, named
  after the class). Reward functions get `environments=` (one instance per completion).

The loop ([`ToolRolloutSource`]): each turn is one batched `RolloutEngine.sample` over the rollouts still running,
each row continuing from its token ids at its rollout's temperature (the round's: few-shot mode anneals it; its task
family's with `exploration=True`), through the run's sampler (transformers' `generate`, behaviour log-probs recorded
while sampling; or vLLM with `use_vllm=True`, whose turns the trainer computes the behaviour log-probs of, vLLM's own
going to the sampler/trainer mismatch correction); each turn is parsed with the tokenizer's `parse_response`; a turn's
tool calls run in the order written, each finishing before the next starts, and the rollouts' turns concurrently
([`ToolRunner`]; the first failure of each tool is logged once, with its exception and arguments; after SIGINT /
SIGTERM the calls still running are abandoned as failed calls, so that the graceful stop never waits on a hung
tool); the tool messages' tokens and the next generation prompt are appended **as token ids** (completion so far
+ tool suffix), never by re-tokenising decoded text (TRL issue #5224), with `completion_mask` 0 and behaviour log-prob
0 on them. A turn cut by
the length limit (no stop token at its end) runs none of its tool calls: transformers' parser reads a call whose
closing tag never came as complete, and no tool result can follow a turn that never ended; the rollout ends there
(counted in `tools/truncated_frequency`; the first one of a run logs a warning naming the limit). A tool result that
would push the completion past `response_length`, or the sequence to the model's context, is rolled back: the rollout
ends after the call the model wrote (counted in `tools/rollback_frequency`; the first one of a run logs a warning
naming the limit to raise). At most `max_tool_calling_iterations` rounds of tool calls run per rollout.

Image prompts (a vision-language run, as TRL's `GRPOTrainer` runs them): the processor renders each image prompt with
its tools ([`prompt_renderer`]) and the tool messages; each rollout keeps its row's model inputs (`pixel_values`, ...)
and every turn's `generate` gets them, as does its trajectory (the reference and training forwards read them).

Metrics (per round, averaged over the logging window): `tools/call_frequency` (tool calls per rollout, TRL's),
`tools/failure_frequency` (failed calls per call, 0 without calls, TRL's), `tools/rollback_frequency` (rollouts whose
tool results were rolled back, per rollout), `tools/truncated_frequency` (rollouts whose last turn was cut by the
length limit with a tool call in it, which did not run, per rollout), `tools/turns_mean` (assistant turns per
rollout). On several processes each is over the whole round, every rank's rollouts (the counts are summed over ranks
before dividing, as TRL gathers them), so every rank logs the same value.

Evaluation ([`GreedyToolRollouts`], which the trainer's `Evaluator` is given in a run with tools): each prompt-only
eval prompt is rolled out once, greedily, through this same loop ([`greedy_tool_rollouts`]), with fresh environment
instances, and scored as training scores a round; the `tools/*` metrics are reported as `eval_tools/*`.

Several processes: the ranks generate in lockstep. Their rollouts call tools a different number of times, but a
turn's generation is a collective under ZeRO-3 (the weights are gathered for it, and DeepSpeed's forward pre-hook
broadcasts while it re-records its parameter trace, which TRL invalidates after every generation) and FSDP (every
forward gathers). So every rank makes the same `engine.sample` calls: the loop goes on while any rank has a running
rollout, a turn is generated in calls of at most `generation_batch_size` rows while any rank has rows left (one tiny
all-reduce per call), a rank with none left generates a throwaway token meanwhile, and each call asks the engine for
`lockstep=True` generation (transformers' `synced_gpus` under ZeRO-3 / FSDP: the forwards go on until every rank is
done). Without it, a rank with more turns waited in its extra turn's gather for a rank that had moved on (a hang under
ZeRO-3, tests/test_distributed_jobs.py).

[`use_tool_chat_template`] gives the character-level tokenizer of `trl_trapo.tasks` a compact template that can
express tool calls (`<c>{"name":..,"arguments":..}</c>`), with a `response_template` that transformers'
`parse_response` (and TRL's `GRPOTrainer(tools=...)`) reads. [`use_chatml_tool_template`] does the same for a real
ChatML model whose own template has no tools (SmolLM2-Instruct): Hermes / Qwen2.5's `<tool_call>` format.

Shapes: `B` rollouts in a round, `group` consecutive ones per prompt, `P_i` prompt and `C_i` completion tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import inspect
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from transformers.utils import get_json_schema
from trl.chat_template_utils import add_response_schema, supports_tool_calling
from trl.data_utils import is_conversational, prepare_multimodal_messages

from .data import INTERNAL_COLUMNS, dataset_columns, eval_datasets, tokenize_prompt
from .rewards import EnvironmentRewardError, reward_value
from .sources import RolloutSource, SampledRound
from .tool_schemas import row_tool_names
from .vision import IMAGE_COLUMNS, as_tensors, image_column, is_processor, text_tokenizer


if TYPE_CHECKING:
    from datasets import Dataset

    from .exploration import TargetedExploration
    from .memory import MemoryPool
    from .rewards import RewardScorer
    from .rollout import RolloutEngine
    from .vision import ImageRows


logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------------------
# A compact tool-capable chat template for the character-level tokenizer
# ---------------------------------------------------------------------------------------------------------------------

# One character per token and 256 positions: every marker is short. `T:` lists the tools as `name(arg,...)`, `u:` /
# `s:` are user / system lines, an assistant turn is `a:` + text + one `<c>{json}</c>` per call + `</s>` (the EOS,
# which stops generation), a tool result is a `t:` line, and the generation prompt is `a:`. Prefix preserving: a turn
# renders the same whatever follows. The assistant's text, calls and `</s>` sit between `{% generation %}` and
# `{% endgeneration %}` (they render nothing): transformers' assistant mask, which `assistant_only_loss=True` trains on.
TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}T:{% for t in tools %}{% set f = t.function if t.function is defined else t %}"
    "{{ f.name }}({{ f.parameters.properties | list | join(',') }}){% if not loop.last %};{% endif %}{% endfor %}"
    "{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}a:{% generation %}{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}{% set f = c.function if c.function is defined else c %}"
    '<c>{"name":{{ f.name | tojson }},"arguments":'
    "{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson(separators=(',', ':')) }}"
    "{% endif %}}</c>{% endfor %}</s>{% endgeneration %}"
    "{%- elif m.role == 'tool' %}t:{{ m.content }}{{ '\\n' }}"
    "{%- else %}{{ m.role[0] }}:{{ m.content }}{{ '\\n' }}{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}a:{% endif %}"
)

# transformers' new-style response parser for TOOL_CHAT_TEMPLATE's assistant turns (`tokenizer.parse_response`)
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "a:",
    "fields": {
        "tool_calls": {
            "open": "<c>",
            "close_pattern": r"</c>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"</s>", "content": "text"},
    },
}


def tool_chat_template_with_images(image_token: str) -> str:
    """[`TOOL_CHAT_TEMPLATE`] for a vision-language processor: every message's content may also be a list of parts
    (TRL's `prepare_multimodal_messages` format, which a VLM's messages are in), an image part rendered as
    `image_token` and a text part as its text; a string content renders as in [`TOOL_CHAT_TEMPLATE`].

    Args:
        image_token (`str`): the processor's image placeholder (e.g. `"<image>"`), which it expands into the image's
            tokens.

    Returns:
        `str`: the Jinja chat template.
    """
    parts = (
        "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content or [] %}"
        "{% if p.type == 'image' %}" + image_token + "{% elif p.type == 'text' %}{{ p.text }}{% endif %}"
        "{% endfor %}{% endif %}"
    )
    return TOOL_CHAT_TEMPLATE.replace("{{ m.content or '' }}", parts).replace("{{ m.content }}", parts)


def use_tool_chat_template(tokenizer):
    """Give a tokenizer (the character-level one of `trl_trapo.tasks.build_char_tokenizer`) the compact tool-calling
    chat template [`TOOL_CHAT_TEMPLATE`] and its response parser [`TOOL_RESPONSE_TEMPLATE`]; given a processor (a
    vision-language run, e.g. `trl_trapo.tasks.vision.build_vlm_processor()`), the processor and its tokenizer both
    get [`tool_chat_template_with_images`] (the processor renders the image prompts, as in TRL) and the tokenizer the
    parser.

    A rendered exchange, `T:add(a,b)\\nu:add 2 3=\\na:<c>{"name":"add","arguments":{"a":2,"b":3}}</c></s>t:5\\na:5</s>`,
    is 79 characters: the built-in format keeps prompt + every turn within 128 of the tiny model's 256 positions.

    Args:
        tokenizer: a tokenizer whose EOS token is `</s>` (the template writes it as the end of an assistant turn), or
            a processor whose tokenizer is one.

    Returns:
        the same tokenizer (or processor), with `chat_template` and `response_template` set.

    Raises:
        ValueError: if the tokenizer's EOS token is not `</s>`, or a processor has no `image_token`.
    """
    if is_processor(tokenizer):
        processor = tokenizer
        image_token = getattr(processor, "image_token", None)
        if not isinstance(image_token, str):
            raise ValueError(
                f"use_tool_chat_template writes each image part as the processor's image token, but "
                f"{type(processor).__name__} has no `image_token`: give the processor a tool-calling chat template "
                "of its own."
            )
        use_tool_chat_template(text_tokenizer(processor))
        processor.chat_template = processor.tokenizer.chat_template = tool_chat_template_with_images(image_token)
        return processor
    if tokenizer.eos_token != "</s>":
        raise ValueError(
            f"use_tool_chat_template writes `</s>` as the end of an assistant turn, but this tokenizer's EOS token is "
            f"{tokenizer.eos_token!r}: use it with trl_trapo.tasks.build_char_tokenizer(), or give your tokenizer a "
            "tool-calling chat template of its own."
        )
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = copy.deepcopy(TOOL_RESPONSE_TEMPLATE)
    return tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# A tool-capable ChatML template for real models whose own template has no tool support (SmolLM2)
# ---------------------------------------------------------------------------------------------------------------------

# SmolLM2-Instruct's default system message: its own template writes it when the conversation has none
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Hermes / Qwen2.5's tool format on plain ChatML (`<|im_start|>role\n...<|im_end|>\n`):
# - with `tools=`, the system turn (the conversation's own system message, else `default_system`) is followed by a
#   `# Tools` section listing each tool's JSON schema inside `<tools></tools>` and showing the call format;
# - an assistant turn is its text, then one `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` per call
#   (separated from the text and from each other by a newline), then `<|im_end|>` (the EOS: generation stops there);
# - a tool result is a *user* turn `<tool_response>\n...\n</tool_response>`, one per tool message: Qwen2.5's choice and
#   that of Ollama's SmolLM2 template (which lists tools for all three sizes); SmolLM2 was trained on system / user /
#   assistant turns, and a `tool` role would be a header it never saw. One turn per message, so every message renders
#   the same whatever follows (prefix preserving for any conversation, not only assistant -> tool).
# Without tool calls, tool messages or `tools=` it renders exactly as SmolLM2's own template. Each assistant turn's
# text, calls and `<|im_end|>` (not the newline after it, which generation never samples) sit between
# `{% generation %}` and `{% endgeneration %}`: transformers' assistant mask, which `assistant_only_loss=True` trains.
CHATML_TOOL_CHAT_TEMPLATE = (
    "{%- set rest = messages %}{% set system = none %}"
    "{%- if messages and messages[0].role == 'system' %}{% set system = messages[0].content %}"
    "{% set rest = messages[1:] %}{% elif messages %}{% set system = @DEFAULT_SYSTEM@ %}{% endif %}"
    "{%- if system is not none or tools %}<|im_start|>system{{ '\\n' }}{{ system or '' }}"
    "{%- if tools %}{% if system %}{{ '\\n\\n' }}{% endif %}# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\nFor each function call, "
    "return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>{% endif %}<|im_end|>{{ \'\\n\' }}'
    "{% endif %}"
    "{%- for m in rest %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant{{ '\\n' }}{% generation %}{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}{% set f = c.function if c.function is defined else c %}"
    "{%- if m.content or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>{{ \'\\n\' }}{"name": {{ f.name | tojson }}, "arguments": '
    "{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ (f.arguments or {}) | tojson }}{% endif %}}"
    "{{ '\\n' }}</tool_call>{% endfor %}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{%- elif m.role == 'tool' %}<|im_start|>user{{ '\\n' }}<tool_response>{{ '\\n' }}{{ m.content }}{{ '\\n' }}"
    "</tool_response><|im_end|>{{ '\\n' }}"
    "{%- else %}<|im_start|>{{ m.role }}{{ '\\n' }}{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)

# transformers' response parser for CHATML_TOOL_CHAT_TEMPLATE's assistant turns (`tokenizer.parse_response`): the text
# before the first call is `content`, each `<tool_call>` holds one JSON object (TRL's Qwen3 parser, without `<think>`)
CHATML_TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\n?<tool_call>\s*",
            "close_pattern": r"\s*</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def chatml_tool_chat_template(default_system: str | None = SMOLLM2_DEFAULT_SYSTEM) -> str:
    """[`CHATML_TOOL_CHAT_TEMPLATE`] with the system message written when a conversation has none.

    Args:
        default_system: the model's default system message (SmolLM2-Instruct's by default; its own template writes
            it), or None to write no system turn unless the conversation has one or tools are given.

    Returns:
        `str`: the Jinja chat template.
    """
    literal = "none" if default_system is None else json.dumps(default_system)  # a JSON string is a Jinja literal
    return CHATML_TOOL_CHAT_TEMPLATE.replace("@DEFAULT_SYSTEM@", literal)


def use_chatml_tool_template(tokenizer, default_system: str | None = SMOLLM2_DEFAULT_SYSTEM):
    """Give a ChatML tokenizer whose chat template cannot express tools (SmolLM2-Instruct's) a tool-calling template,
    Hermes / Qwen2.5's format ([`CHATML_TOOL_CHAT_TEMPLATE`]), and its response parser
    ([`CHATML_TOOL_RESPONSE_TEMPLATE`]), so that `TRAPOTrainer(tools=...)` (and TRL's `GRPOTrainer(tools=...)`,
    `SFTTrainer` / `assistant_only_loss=True` on tool-calling traces) can use it.

    A rendered call and its result (after the system turn with the tools and the user's question):
    `<|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {"expression": "48/2"}}\\n</tool_call>`
    `<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n24\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n`.

    Args:
        tokenizer: a tokenizer with ChatML's `<|im_start|>` and `<|im_end|>` as single tokens and `<|im_end|>` as its
            EOS token (generation must stop at the end of an assistant turn).
        default_system: see [`chatml_tool_chat_template`].

    Returns:
        the same tokenizer, with `chat_template` and `response_template` set.

    Raises:
        ValueError: naming the token and the fix, if `<|im_start|>` or `<|im_end|>` is not one token of the
            vocabulary, or the EOS token is not `<|im_end|>`.
    """
    for marker in ("<|im_start|>", "<|im_end|>"):
        ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
        if len(ids) != 1 or tokenizer.convert_ids_to_tokens(ids[0]) != marker:
            raise ValueError(
                f"use_chatml_tool_template writes ChatML, but {marker!r} is not one token of this tokenizer (it "
                f"encodes to {len(ids)} tokens): use it with a ChatML model (SmolLM2, Qwen2.5, ...), or give your "
                "tokenizer a tool-calling chat template in its own format."
            )
    if tokenizer.eos_token != "<|im_end|>":
        raise ValueError(
            f"use_chatml_tool_template ends each assistant turn with <|im_end|>, but this tokenizer's EOS token is "
            f"{tokenizer.eos_token!r}, so generation would not stop there: set tokenizer.eos_token = '<|im_end|>' "
            "(and the model's generation_config.eos_token_id to its id) first."
        )
    tokenizer.chat_template = chatml_tool_chat_template(default_system)
    tokenizer.response_template = copy.deepcopy(CHATML_TOOL_RESPONSE_TEMPLATE)
    return tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# Tools and environments
# ---------------------------------------------------------------------------------------------------------------------


def tool_schema(tool: Callable, where: str = "tools", environment: str | None = None) -> dict:
    """The JSON schema of one tool, from its type hints and Google-style docstring (transformers' `get_json_schema`).

    Args:
        tool (`Callable`): the function, or an environment instance's bound method.
        where (`str`): where it was given, for messages (`"tools"`, `"environment_factory (Env)"`).
        environment (`str`, *optional*): the environment class's name when `tool` is one of its public methods
            (TRL makes every one other than `reset` and `get_reward` a tool): a method without a schema is then told
            how to stay a private helper.

    Raises:
        ValueError: naming the tool and the fix, if it is not callable, has a parameter a call can never fill
            ([`check_tool_parameters`]), or has no docstring / type hints that `get_json_schema` can read.
    """
    name = getattr(tool, "__name__", repr(tool))
    if not callable(tool):
        raise ValueError(f"{where}: {name} is not callable; pass plain functions (sync or async) as tools.")
    check_tool_parameters(tool, name, where)
    try:
        return get_json_schema(tool)
    except Exception as error:  # transformers' DocstringParsingException / TypeHintParsingException
        if isinstance(tool, functools.partial):  # trial 8's TL02: the hints and docstring are on tool.func
            inner = getattr(tool.func, "__name__", "f")
            raise ValueError(
                f"{where}: the tool functools.partial({inner}, ...) has no schema: transformers' `get_json_schema` "
                "reads a function's own signature and docstring, and a partial has neither (nor a name). Wrap it in "
                f"a `def` of the arguments the model fills, with type hints and a Google-style docstring, e.g. "
                f"`def {inner}_tool(x: float) -> float:` ... `return {inner}(x, <the fixed arguments>)`."
            ) from error
        if not (inspect.isfunction(tool) or inspect.ismethod(tool)):  # a callable instance, a builtin, ...
            raise ValueError(
                f"{where}: the tool {name} ({type(tool).__name__}) has no usable schema ({error}): transformers' "
                "`get_json_schema` reads plain functions and methods. Wrap it in a `def` with type hints on every "
                "argument and a Google-style docstring that calls it."
            ) from error
        if environment is not None:  # trial 12's N50: a helper method, never meant as a tool
            raise ValueError(
                f"{where}: `{name}` is a public method of the environment {environment}, so it is a tool the model "
                "may call (TRL's rule: every public method other than `reset` and `get_reward` is one), and as a "
                f"tool it has no usable schema ({error}). If it is a helper, not a tool, make it private: rename it "
                f"`_{name}` (and its uses). If it is a tool, give it type hints on every argument and a Google-style "
                "docstring with a description and an `Args:` entry per argument (transformers' `get_json_schema` "
                "reads them)."
            ) from error
        raise ValueError(
            f"{where}: the tool `{name}` has no usable schema ({error}). Give it type hints on every argument and a "
            "Google-style docstring with a description and an `Args:` entry per argument (transformers' "
            "`get_json_schema` reads them)."
        ) from error


def check_tool_parameters(tool: Callable, name: str, where: str) -> None:
    """Refuse a tool with a parameter no call can fill: a call passes the model's JSON arguments by name
    (`tool(**arguments)`, as in TRL), so `*args` and positional-only parameters (before `/`) never receive one, yet
    transformers' `get_json_schema` lists them (`*args` as one required argument `args`: every call failed with
    "got an unexpected keyword argument 'args'", trial 12's N01). Keyword-only parameters (after `*`) are filled by
    name and work. `**kwargs` works too (the call's arguments reach it by name), but `get_json_schema` lists it as
    one required argument named `kwargs`, which the model is then asked for: warned about, not refused.

    Raises:
        ValueError: naming the tool, the parameter and the fix.
    """
    try:
        parameters = list(inspect.signature(tool).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): `get_json_schema` refuses it next
        return
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            raise ValueError(
                f"{where}: the tool `{name}` takes `*{parameter.name}`, which a tool call can never fill: a call "
                f"passes its JSON arguments by name (`{name}(**arguments)`), while transformers' `get_json_schema` "
                f"describes `{parameter.name}` to the model as one required argument, so every call would fail. Use "
                "named parameters; for a number of values, one list parameter, e.g. `numbers: list[int]` (with an "
                "`Args:` entry for it in the docstring)."
            )
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ValueError(
                f"{where}: the tool `{name}` takes `{parameter.name}` as a positional-only parameter (before `/`), "
                f"which a tool call can never fill: a call passes its JSON arguments by name (`{name}(**arguments)`)."
                " Remove the `/` from its signature."
            )
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            logger.warning(
                "%s: the tool `%s` takes `**%s`: a call's arguments reach it by name, but transformers' "
                "`get_json_schema` describes `%s` to the model as one required argument, so a call that follows "
                "the schema passes `%s={'%s': ...}`. Name the parameters the model should fill.",
                where, name, parameter.name, parameter.name, parameter.name, parameter.name,
            )  # fmt: skip


def environment_methods(instance: Any) -> list[Callable]:
    """The tools of an environment instance: its public methods (listed on the class, so that properties are not
    evaluated), except `reset` and `get_reward`, bound to the instance."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]


def check_tool_names(tools: Sequence[Callable], where: str) -> None:
    """Refuse two tools of one name (a call could not say which one it means).

    Raises:
        ValueError: naming the duplicated name and where it comes from.
    """
    seen = set()
    for tool in tools:
        name = tool.__name__
        if name in seen:
            raise ValueError(
                f"{where}: two tools are named `{name}`, so a tool call could not say which one it means: rename one "
                "of them (the function's `__name__` is the tool's name)."
            )
        seen.add(name)


def environment_reward(environment_type: type) -> Callable:
    """A reward function (TRL's contract) that scores each rollout whose environment is exactly `environment_type` by
    its `get_reward()` (sync or async), and gives None (no reward) to the others; named after the class. An instance
    of a module-level class, so it pickles (by reference to `environment_type`) into an asynchronous producer."""
    if inspect.iscoroutinefunction(environment_type.get_reward):
        return AsyncEnvironmentReward(environment_type)
    return EnvironmentReward(environment_type)


class EnvironmentReward:
    """[`environment_reward`] of an environment class whose `get_reward` is sync: `__name__` is the class's name.

    Called as a reward function (`environments=`: one instance per rollout), it returns one value per rollout: its
    environment's `get_reward()` (a number, or None: no reward) for an instance of the class, None for the others.

    Raises:
        EnvironmentRewardError: naming the class and `get_reward()` (the user wrote no reward function), with the
            user's exception as the cause, if `get_reward()` raises; or naming the value, if it returns something that
            is not a finite number or None (a string, a list, ...).
    """

    def __init__(self, environment_type: type):
        self.environment_type = environment_type
        self.__name__ = self.__qualname__ = environment_type.__name__

    def __call__(self, environments, **kwargs):
        rewards = []
        for row, environment in enumerate(environments):
            if type(environment) is not self.environment_type:
                rewards.append(None)
                continue
            try:
                value = environment.get_reward()
            except Exception as error:
                raise self.raised(error, row, len(environments)) from error
            rewards.append(self.checked(value, row, len(environments)))
        return rewards

    def raised(self, error: Exception, row: int, rows: int) -> EnvironmentRewardError:
        """The error for a `get_reward()` that raised `error` on rollout `row` of `rows`."""
        return EnvironmentRewardError(
            f"environment {self.__name__}: get_reward() raised {type(error).__name__}: {error} (rollout {row} of "
            f"{rows}, after its last turn). Each rollout is scored by its environment's get_reward(), weight 1, as "
            "in TRL's GRPOTrainer, and an exception there stops training: return None from get_reward() for a "
            "rollout it cannot score (no reward for it), e.g. when the judge times out."
        )

    def checked(self, value: Any, row: int, rows: int) -> Any:
        """`value`, if it is a reward (a finite number, or None for no reward; [`~trl_trapo.rewards.reward_value`]).

        Raises:
            EnvironmentRewardError: naming the class, the value, its type and the rollout, otherwise.
        """
        number = reward_value(value)
        if number is not None and not math.isinf(number):
            return value
        return_value = repr(value)
        raise EnvironmentRewardError(
            f"environment {self.__name__}: get_reward() returned {return_value[:80]} ({type(value).__name__}) for "
            f"rollout {row} of {rows}: it must return one finite number (int, float or bool, as TRL's GRPOTrainer "
            "accepts) for its rollout, or None for no reward. Return e.g. `float(...)` of what it computes."
        )


class AsyncEnvironmentReward(EnvironmentReward):
    """[`environment_reward`] of an environment class whose `get_reward` is `async def` (awaited); raises as
    [`EnvironmentReward`]."""

    async def __call__(self, environments, **kwargs):
        rewards = []
        for row, environment in enumerate(environments):
            if type(environment) is not self.environment_type:
                rewards.append(None)
                continue
            try:
                value = await environment.get_reward()
            except Exception as error:
                raise self.raised(error, row, len(environments)) from error
            rewards.append(self.checked(value, row, len(environments)))
        return rewards


@dataclass
class AgentSpec:
    """The validated `tools=` / `environment_factory=` of one trainer: what every rollout may call.

    Build it with [`AgentSpec.build`]; the trainer does at construction, before anything slow.

    Attributes:
        tools (`list[Callable]`): the standalone tools.
        factories (`dict`): environment name -> factory; the single factory's name is None; empty without environments.
        multi (`bool`): dict mode (each row's `environment` column chooses its factory).
        schemas (`dict`): environment name (None without environments) -> the tool schemas rendered in its prompts.
        rewards (`list[Callable]`): one reward function per environment class with a `get_reward` method.
    """

    tools: list[Callable]
    factories: dict[str | None, Callable]
    multi: bool
    schemas: dict[str | None, list[dict]]
    rewards: list[Callable] = field(default_factory=list)

    @classmethod
    def build(cls, tools: Sequence[Callable] | None, environment_factory: Any) -> AgentSpec:
        """Check the tools and probe one instance of each environment.

        Raises:
            ValueError: naming the culprit and the fix, for a tool without type hints or docstring or with a
                parameter no call can fill (`*args`, positional-only; every such tool in one message), an
                environment's public method without hints or docstring (saying how to keep a helper private), two
                tools of one name, an environment factory that is not callable, or an instance without `reset`.
        """
        tools = list(tools or [])
        # every tool without a schema, in one message: a list of helpers was refused one per run
        tool_schemas, refused = [], []
        for tool in tools:
            try:
                tool_schemas.append(tool_schema(tool, "tools"))
            except ValueError as error:
                refused.append(error)
        if len(refused) == 1:
            raise refused[0]
        if refused:
            raise ValueError(
                f"tools: {len(refused)} tools have no schema the model could be shown, each with its fix:"
                + "".join(f"\n- {str(error).removeprefix('tools: ')}" for error in refused)
            ) from refused[0].__cause__
        check_tool_names(tools, "tools")
        multi = isinstance(environment_factory, Mapping)
        if environment_factory is None:
            factories = {}
        elif multi:
            if not environment_factory:
                raise ValueError("environment_factory={} names no environment: give {name: factory} or one factory.")
            factories = dict(environment_factory)
        else:
            factories = {None: environment_factory}
        schemas: dict[str | None, list[dict]] = {} if factories else {None: tool_schemas}
        rewards, rewarded = [], set()
        for name, factory in factories.items():
            where = "environment_factory" if name is None else f"environment_factory[{name!r}]"
            if not callable(factory):
                raise ValueError(f"{where}={factory!r} is not callable: pass a class or a zero-argument callable.")
            try:
                instance = factory()
            except Exception as error:
                raise RuntimeError(
                    f"{where}: calling {factory_name(factory)}() failed in TRAPOTrainer's construction-time check (one "
                    f"trial instance per factory, to read its tools) with {type(error).__name__}: {error}. The "
                    "factory must build an instance with no arguments."
                ) from error
            if not callable(getattr(type(instance), "reset", None)):
                raise ValueError(
                    f"{where}: {type(instance).__name__} has no `reset` method. Add `def reset(self, **row) -> str | "
                    "None` (called with the dataset row before each rollout; returned text is appended to the prompt)."
                )
            methods = environment_methods(instance)
            kind = type(instance).__name__
            method_schemas = [tool_schema(method, f"{where} ({kind})", environment=kind) for method in methods]
            check_tool_names(tools + methods, f"{where} ({kind}) with tools=")
            schemas[name] = tool_schemas + method_schemas
            if not schemas[name]:  # TRL 1.16 trains such a run as single-turn RL too, without a word
                logger.warning(
                    "%s: %s exposes no tool methods (public methods other than reset and get_reward) and tools= "
                    "is empty: the model has no tool to call, and each rollout is one completion (as in TRL's "
                    "GRPOTrainer). To give it tools, add a public method with type hints and a docstring, e.g. "
                    "`def add(self, a: int, b: int) -> int:`.",
                    where,
                    type(instance).__name__,
                )
            if callable(getattr(type(instance), "get_reward", None)) and type(instance) not in rewarded:
                rewarded.add(type(instance))
                rewards.append(environment_reward(type(instance)))
        return cls(tools=tools, factories=factories, multi=multi, schemas=schemas, rewards=rewards)

    def check_dataset(self, dataset: Dataset | None, max_steps: int) -> None:
        """Refuse data the environments cannot route or a run without a length.

        Raises:
            ValueError: dict mode without a `train_dataset` with an `environment` column, an `environment` value
                with no factory, or `environment_factory` without a `train_dataset` and without `max_steps`.
        """
        if dataset is None:
            if self.multi:
                raise ValueError(
                    "environment_factory is a dict, which needs a train_dataset with an `environment` column naming "
                    "each row's environment: pass one, or pass a single factory."
                )
            if self.factories and max_steps <= 0:
                raise ValueError(
                    f"environment_factory without a train_dataset (the environment's `reset` writes the prompt) needs "
                    f"max_steps > 0 to fix the run's length, got max_steps={max_steps}: set TRAPOConfig(max_steps=...)."
                )
            return
        if self.multi:
            if "environment" not in dataset.column_names:
                raise ValueError(
                    f"environment_factory is a dict ({sorted(self.factories)}), but train_dataset has no "
                    f"`environment` column (it has {dataset.column_names}): add one naming each row's environment."
                )
            unknown = sorted(set(map(str, dataset["environment"])) - set(self.factories))
            if unknown:
                raise ValueError(
                    f"train_dataset's `environment` column holds {unknown}, which environment_factory does not name "
                    f"(it has {sorted(self.factories)}): add a factory for each, or fix the column."
                )
        if "tools" in dataset.column_names:
            self.warn_row_tools_unimplemented(dataset)

    def check_eval_prompts(self, eval_dataset: Any) -> None:
        """Refuse held-out prompts the tool loop cannot roll out: evaluation renders each prompt-only eval set's
        prompts with the tools and runs their calls as training does ([`GreedyToolRollouts`]), which needs chat
        messages (a `prompt` column of them; plain text or tokenized `input_ids` cannot be rendered with tool schemas),
        and in dict mode an `environment` column naming a factory per row. Eval sets of `text` or demonstrations
        (losses) are not rolled out.

        Args:
            eval_dataset: a `Dataset`, a dict of them (each checked, named by its key), or None.

        Raises:
            ValueError: naming the eval set, the bad value and the fix.
        """
        from datasets import Dataset

        for label, dataset in eval_datasets(eval_dataset):
            if not isinstance(dataset, Dataset):  # not one TRAPO evaluates: refused by `check_eval_dataset`
                continue
            columns = set(dataset_columns(dataset) or [])
            if not columns & {"prompt", "input_ids"} or columns & {"text", "completion", "messages"}:
                continue  # evaluated by its loss
            if "prompt" not in columns or (len(dataset) and not is_conversational({"prompt": dataset[0]["prompt"]})):
                shown = "tokenized `input_ids`" if "prompt" not in columns else f"{dataset[0]['prompt']!r:.60}"
                raise ValueError(
                    f"`{label}` holds prompts the tool loop cannot render ({shown}, row 0): a run with tools / "
                    "environment_factory evaluates its prompts through the same multi-turn loop as training, with the "
                    "tool schemas rendered by the chat template, which needs chat messages. Give the eval set a "
                    "`prompt` column of messages, e.g. `[{'role': 'user', 'content': text}]` "
                    "(`trl_trapo.tasks.agent.as_conversation` converts a dataset of text prompts)."
                )
            if self.multi:
                if "environment" not in columns:
                    raise ValueError(
                        f"environment_factory is a dict ({sorted(self.factories)}), but `{label}` has no `environment` "
                        f"column (it has {sorted(columns)}): its prompts are rolled out with their environment, as "
                        "training's are. Add one naming each row's environment."
                    )
                unknown = sorted(set(map(str, dataset["environment"])) - set(self.factories))
                if unknown:
                    raise ValueError(
                        f"`{label}`'s `environment` column holds {unknown}, which environment_factory does not name "
                        f"(it has {sorted(self.factories)}): add a factory for each, or fix the column."
                    )

    def warn_row_tools_unimplemented(self, dataset: Dataset) -> None:
        """Warn when rows' `tools` cells offer the model a tool that no function of `tools=` or of the environments
        implements: a call to it would only get an error message back."""
        implemented = {
            (schema.get("function") if isinstance(schema.get("function"), dict) else schema).get("name")
            for schemas in self.schemas.values()
            for schema in schemas
        }

        def bad(field: str, problem: str, fix: str) -> ValueError:  # malformed cells are refused by check_row_cells
            return ValueError(f"train_dataset, {field}: {problem}. {fix}")

        missing: dict[str, list[int]] = {}
        for row, cell in enumerate(dataset["tools"]):
            try:
                names = row_tool_names(cell, bad) or []
            except ValueError:
                continue
            for name in names:
                if name not in implemented:
                    missing.setdefault(name, []).append(row)
        for name, rows in missing.items():
            logger.warning(
                "%d rows of `train_dataset` offer tool %r in their `tools` column (first at row %d), which no function "
                "of tools= or of the environments implements (they have %s): a call to it would fail. Add the "
                "function to tools=, or drop the schema.",
                len(rows), name, rows[0], sorted(n for n in implemented if n) or "none",
            )  # fmt: skip

    def environment_name(self, row: Mapping) -> str | None:
        """The factory a dataset row uses (its `environment` in dict mode, else the single one)."""
        return row["environment"] if self.multi else None

    def reset_kwargs(self, row: Mapping) -> dict:
        """The row as `reset` gets it: the dataset's own columns, as TRL passes them (not the columns TRAPO adds,
        `INTERNAL_COLUMNS` such as `prompt_ids`), without `environment` in dict mode (a control field)."""
        return {k: v for k, v in row.items() if k not in INTERNAL_COLUMNS and not (self.multi and k == "environment")}

    def preflight_kwargs(self, rows: list[dict]) -> dict | None:
        """The reward functions' extra keywords for the trainer's construction-time call on `rows`: `environments`,
        fresh instances `reset` with each row (None without environments).

        Raises:
            RuntimeError: naming the factory / class, saying it was the construction-time trial reset and the
                keywords `reset` got, with the user's exception as the cause, if a factory or a `reset` raises.
            TypeError: if a `reset` returns neither text nor None (`check_observation`).
        """
        if not self.factories:
            return None
        environments = []
        for row in rows:
            name = self.environment_name(row)
            factory = self.factories[name]
            where = "environment_factory" if name is None else f"environment_factory[{name!r}]"
            kwargs = self.reset_kwargs(row)
            try:
                environment = factory()
            except Exception as error:
                raise RuntimeError(
                    f"{where}: calling {factory_name(factory)}() failed in TRAPOTrainer's construction-time check (fresh "
                    f"instances for a trial reset) with {type(error).__name__}: {error}. The factory must build an "
                    "instance with no arguments."
                ) from error
            try:
                observation = environment.reset(**kwargs)
            except Exception as error:
                raise RuntimeError(
                    f"{where}: {type(environment).__name__}.reset(**row) raised {type(error).__name__}: {error}, in "
                    f"TRAPOTrainer's construction-time check (a trial reset of fresh instances with the first "
                    f"{len(rows)} dataset rows, before anything slow; training resets every rollout the same way). "
                    f"reset is called with the row's columns as keywords: {sorted(kwargs)}; accept them (or "
                    "`**kwargs`) and make reset work on those rows."
                ) from error
            check_observation(
                observation, environment, where=f"{where}, in TRAPOTrainer's construction-time trial reset"
            )
            environments.append(environment)
        return {"environments": environments}


def check_observation(observation: Any, environment: Any, where: str = "environment_factory") -> str | None:
    """What an environment's `reset` returned, as the text appended to the prompt's last message: a string, or None
    for nothing (TRL's contract, `reset(**row) -> str | None`).

    Raises:
        TypeError: naming the environment class, the type and value returned and the fix, for anything else (a number
            used to be appended as its `str()`; TRL fails on it with `TypeError` deep in its rollout).
    """
    if observation is None or isinstance(observation, str):
        return observation
    shown = repr(observation)
    raise TypeError(
        f"{where}: {type(environment).__name__}.reset(**row) returned {type(observation).__name__} "
        f"({shown[:60] + '...' if len(shown) > 60 else shown}); it must return the text to append to the prompt "
        "(str) or None for nothing. Return e.g. `str(value)` or an f-string."
    )


def factory_name(factory: Callable) -> str:
    """An environment factory's name for messages: the class's (or function's) name, else its repr."""
    return getattr(factory, "__name__", None) or repr(factory)


def check_agent_arguments(args, rollout_source: Any) -> None:
    """Refuse settings that cannot go with `tools` / `environment_factory`.

    Raises:
        ValueError: naming the setting and the fix, for a `rollout_source` (the tool loop is the source), or no
            stop token (`stop_token=None` without `stop_token_id`: no turn would end, every tool call would be cut
            off).
    """
    config = type(args).__name__
    if rollout_source is not None:
        raise ValueError(
            "tools / environment_factory build the tool-calling rollout source, but a rollout_source was given too: "
            "drop one of them (a source of your own runs its own tool loop)."
        )
    extra_stops = (args.generation_kwargs or {}).get("eos_token_id")  # what `rollout.stop_token_ids` also stops at
    if args.stop_token is None and args.stop_token_id is None and extra_stops in (None, [], ()):
        raise ValueError(
            f"{config}.stop_token=None without a stop_token_id: completions never stop early, so no assistant turn "
            "would end and every tool call would be cut off by the length limit (and never run). Set "
            "stop_token='eos' (the default) or stop_token_id."
        )


def placeholder_prompts(args) -> Dataset:
    """TRL's dataset for `environment_factory` without a `train_dataset`: rows with one empty user message (the
    environment's `reset` writes the prompt), one round's worth of prompts; `max_steps` sets the run's length."""
    from datasets import Dataset

    rows = max(1, math.ceil(args.per_device_train_batch_size / args.num_generations))
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * rows})


def prompt_renderer(processing_class, columns: Sequence[str] | None):
    """What renders the RL prompts' chat template, and so each turn's tool messages: the processor of a
    vision-language run whose RL prompts have an image column (`images` / `image`; it renders and expands the image
    prompts, as in TRL's `GRPOTrainer`), else the text tokenizer.

    Args:
        processing_class: the trainer's tokenizer or processor.
        columns (`Sequence[str]`, *optional*): the RL dataset's columns (None: unknown, e.g. no dataset).
    """
    if is_processor(processing_class) and any(c in (columns or ()) for c in IMAGE_COLUMNS):
        return processing_class
    return text_tokenizer(processing_class)


def check_chat_template(tokenizer, template_kwargs: Mapping | None = None, renderer=None) -> None:
    """Refuse a tokenizer that cannot express the loop, at construction: its chat template must render a tool call
    and a tool message (TRL's `supports_tool_calling`), the tool message's tokens must extend the conversation's
    (see [`tool_suffix_ids`]), and it must parse a response (`response_template` / `response_schema`; TRL's
    `add_response_schema` sets one for the templates it knows).

    Args:
        tokenizer: the policy's text tokenizer (it parses each turn).
        template_kwargs (`Mapping`, *optional*): `chat_template_kwargs`.
        renderer (*optional*): what renders the prompts and tool messages ([`prompt_renderer`]: a VLM run's
            processor); None: the tokenizer. Its chat template is the one checked.

    Raises:
        ValueError: naming what is missing and the fix (e.g. `trl_trapo.agents.use_chatml_tool_template`).
    """
    renderer = tokenizer if renderer is None else renderer
    if not supports_tool_calling(renderer) and is_processor(renderer):
        raise ValueError(
            f"The processor's chat template ({type(renderer).__name__}: it renders the image prompts and, after each "
            "tool call, the tool messages, as in TRL's GRPOTrainer) cannot express tool calls or image parts "
            "(rendering TRL's multimodal messages with an assistant tool call and a `tool` message loses one of "
            "them): give the processor a tool-calling template that reads image parts (for the tiny LLaVA of "
            "trl_trapo.tasks.vision: trl_trapo.agents.use_tool_chat_template(processor))."
        )
    if not supports_tool_calling(renderer):
        raise ValueError(
            "The tokenizer's chat template cannot express tool calls (rendering an assistant tool call and a `tool` "
            "message loses one of them): give it a tool-calling template (for a ChatML model such as SmolLM2: "
            "trl_trapo.agents.use_chatml_tool_template(tokenizer); for the character-level tokenizer of "
            "trl_trapo.tasks: trl_trapo.agents.use_tool_chat_template(tokenizer))."
        )
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError as error:
            raise ValueError(
                "The tokenizer has no `response_template` (transformers' parser of assistant turns, which finds the "
                "tool calls) and TRL knows none for its chat template: set `tokenizer.response_template` (see "
                "trl_trapo.agents.CHATML_TOOL_RESPONSE_TEMPLATE for an example)."
            ) from error
    tool_suffix_ids(renderer, [{"role": "tool", "name": "probe", "content": "probe"}], template_kwargs)


def tool_suffix_ids(tokenizer, tool_messages: list[dict], template_kwargs: Mapping | None = None) -> list[int]:
    """The token ids that follow an assistant turn that called tools: the tool messages and the generation prompt
    of the next assistant turn, as the chat template renders them.

    Computed as a difference of *token ids*: a short conversation ending with an assistant tool call (cut after its
    last EOS, where generation stopped) is rendered and tokenized with and without `tool_messages`; the result is
    what the second adds, and only when the first is a prefix of it. The loop appends these ids to the sampled ids
    as they are: nothing sampled is ever decoded and re-tokenized (TRL issue #5224).

    A processor (a vision-language run's, see [`prompt_renderer`]) renders the messages in TRL's multimodal format
    (`prepare_multimodal_messages`: every content a list of parts, as TRL's `GRPOTrainer` passes them to a VLM's
    processor) with its own chat template, and its tokenizer tokenizes the text (no special tokens added).

    Args:
        tokenizer: the policy's tokenizer, or a VLM run's processor.
        tool_messages (`list[dict]`): `{"role": "tool", "name": ..., "content": ...}` each.
        template_kwargs (`Mapping`, *optional*): extra `apply_chat_template` arguments (`chat_template_kwargs`).

    Returns:
        `list[int]`: the suffix.

    Raises:
        ValueError: if the template is not prefix preserving (adding a tool message changes the earlier tokens).
    """
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    kwargs = dict(template_kwargs or {})
    if is_processor(tokenizer):
        processor, tokenizer = tokenizer, tokenizer.tokenizer

        def render(messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
            text = processor.apply_chat_template(
                prepare_multimodal_messages(messages),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])

        before, after = render(head), render(head + list(tool_messages), add_generation_prompt=True)
    else:
        before = tokenizer.apply_chat_template(head, tokenize=True, return_dict=False, **kwargs)
        after = tokenizer.apply_chat_template(
            head + list(tool_messages), tokenize=True, return_dict=False, add_generation_prompt=True, **kwargs
        )
    ends = [i for i, t in enumerate(before) if t == tokenizer.eos_token_id]
    if ends:  # generation stops at the EOS; what the template writes after it belongs to the suffix
        before = before[: ends[-1] + 1]
    if list(after[: len(before)]) != list(before):
        raise ValueError(
            "The chat template is not prefix preserving: adding a `tool` message changes the tokens of the assistant "
            "turn before it, so tool results cannot be appended to the sampled tokens. Use a template that renders "
            "each turn the same whatever follows (TRL's `get_training_chat_template` makes one for known models)."
        )
    return list(after[len(before) :])


# ---------------------------------------------------------------------------------------------------------------------
# Running tool calls: in order within a turn, the turns of a round concurrently
# ---------------------------------------------------------------------------------------------------------------------

MAX_ARGUMENTS_CHARS = 500  # of a failed call's arguments in its warning
SLOW_TOOL_CALL_SECONDS = 60.0  # calls running longer are warned about, once per tool and round of calls
WAIT_POLL_SECONDS = 0.2  # how often a round of calls checks for a stop (SIGINT / SIGTERM) and for slow calls


class ToolTimeout(TimeoutError):
    """A tool call that did not return within `tool_timeout` seconds and was abandoned (its error result's message)."""


class ToolAbandoned(ToolTimeout):
    """A tool call abandoned, or never started, because the run is stopping (SIGINT / SIGTERM received): its error
    result's message. A [`ToolTimeout`]: the call failed for want of time, not by its own error."""


@dataclass
class RoundStop:
    """Whether the run stopped while a round of calls ran ([`ToolRunner.run`]): `reason` is set by the waiting
    thread, then `event` (an `asyncio.Event` of the tools' loop) is set in the loop, which wakes the calls' waits."""

    event: asyncio.Event
    reason: str | None = None


class ToolBaseException(RuntimeError):
    """A tool's exception that is not an `Exception` (`SystemExit` from `sys.exit()`, `KeyboardInterrupt`,
    `GeneratorExit`, an `asyncio.CancelledError` it raised itself, any other `BaseException` subclass), as what it is
    to the rollout: a failed call whose error result the model reads, counted in `tools/failure_frequency`, the run
    going on (docs/agents.md). Left as it was, it ended the tool's thread without an outcome (or stopped the tools'
    event loop, or escaped the round into the trainer) and the round waited forever (trial 12's N46, trial 16's N22).

    A `KeyboardInterrupt` raised by a tool is the tool's own (e.g. re-raised from a wrapped subprocess that was
    interrupted), not the user's Ctrl-C: Python delivers SIGINT to the main thread only, where the trainer's handler
    stops the run after the step; a tool runs in a thread of its own (sync) or on the tools' loop thread (async).

    Attributes:
        raised (`BaseException`): what the tool raised (also the error's `__cause__`, so that a warning's traceback
            shows the tool's line).
    """

    def __init__(self, raised: BaseException):
        self.raised = raised
        super().__init__(f"the tool {self.what}; the call failed, the run goes on")
        self.__cause__ = raised

    @property
    def what(self) -> str:
        """What the tool did, e.g. `called sys.exit(3) (SystemExit)` or `raised KeyboardInterrupt: interrupted (not an
        Exception)`."""
        if isinstance(self.raised, SystemExit):
            return f"called sys.exit({self.raised.code!r}) (SystemExit)"
        try:
            text = str(self.raised)
        except Exception:  # a broken __str__ must not cost the call its outcome
            text = ""
        return f"raised {type(self.raised).__name__}{': ' + text if text else ''} (not an Exception)"


def tool_error(raised: BaseException) -> Exception:
    """The exception a tool raised as the `Exception` its failed call carries: itself for an `Exception`, except
    `StopIteration` (which an asyncio future refuses: `set_exception` raised `TypeError` in the tools' loop and the
    call never got its outcome); a [`ToolBaseException`] wrapping anything else (`SystemExit`, `KeyboardInterrupt`,
    `GeneratorExit`, `asyncio.CancelledError`, ...)."""
    if isinstance(raised, StopIteration):  # as Python words it for a coroutine (PEP 479)
        error = RuntimeError(f"the tool raised {type(raised).__name__}; the call failed, the run goes on")
        error.__cause__ = raised
        return error
    return raised if isinstance(raised, Exception) else ToolBaseException(raised)


async def as_tool_outcome(coroutine: Any) -> Any:
    """Await an async tool's call with whatever it raises turned into an `Exception` ([`tool_error`]) inside the
    task: a task re-raises `SystemExit` and `KeyboardInterrupt` out of the event loop, which stopped the tools' loop
    thread and left the round waiting forever, and passes other `BaseException`s (`GeneratorExit`) up through the
    round into the trainer. `asyncio.CancelledError` goes through: it is the call's cancellation (a timeout, a stop);
    one the tool raised itself is told apart where the call is awaited ([`ToolRunner.settle`])."""
    try:
        return await coroutine
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as raised:
        raise tool_error(raised) from raised


def short_arguments(arguments: dict) -> str:
    """`repr(arguments)`, cut to MAX_ARGUMENTS_CHARS characters (the full length said) for a warning."""
    text = repr(arguments)
    if len(text) > MAX_ARGUMENTS_CHARS:
        text = f"{text[:MAX_ARGUMENTS_CHARS]}... ({len(text)} characters)"
    return text


@dataclass
class ToolCall:
    """One tool call of an assistant turn, as the loop runs it.

    Attributes:
        name (`str`): the tool's name as the model wrote it (`"unknown"` when it wrote none); the tool message's name.
        arguments (`dict`): keyword arguments of the call.
        tool (`Callable`, *optional*): what to call (sync or async); None: the call cannot run and fails with `error`
            (an unknown name, arguments that are not an object, an unparsable call: the model's errors).
        error (`str`, *optional*): why the call cannot run, when `tool` is None.
    """

    name: str
    arguments: dict = field(default_factory=dict)
    tool: Callable | None = None
    error: str | None = None


class ToolRunner:
    """Runs a round's tool calls: each turn's calls **in the order written**, each finishing before the next starts
    (an environment's methods are stateful: `store(7)` then `fetch()` must fetch 7), and the turns of different
    rollouts concurrently. Each turn is one coroutine on one long-lived event loop owned by a background thread
    (started at the first call, again after `close`): an async tool is awaited there, a sync one runs in a daemon
    thread of its own, at most `max_workers` of them at once.

    TRL 1.16's `GRPOTrainer` runs a turn's sync calls in order but gathers its async ones (`asyncio.gather`): two async
    calls of one turn run together there, one after the other here.

    The first failure of each tool (by name) is logged once as a warning with the exception, the call's arguments and
    the traceback; every failure is still an error result (`{"error": message}`) the model reads, counted in
    `tools/failure_frequency`. A call that cannot run (`ToolCall.tool` None: the model's error, not the tool's) is not
    warned about. A tool raising something that is not an `Exception` (`sys.exit()`, `KeyboardInterrupt`,
    `GeneratorExit`, ...) fails its call the same way, as a [`ToolBaseException`] naming it: every call gets an
    outcome, so a round never waits on a call that no longer runs.

    Calls still running after `slow_after` seconds are warned about once per tool and round (how many calls of the
    tool are running, the longest for how long, the first one's arguments). With `timeout`, a call that has not
    returned after `timeout` seconds is abandoned and fails with a timeout error result (a [`ToolTimeout`]): an async
    tool is cancelled; a sync tool cannot be stopped from outside, so its thread is left to finish on its own (a
    daemon thread: it does not hold up the process's exit) and no longer counts against `max_workers`; what it returns
    or does later is ignored.

    With `stopping`, a round's wait asks it every `WAIT_POLL_SECONDS`: once it gives a reason (the run received
    SIGINT / SIGTERM and stops after the optimizer step in progress), the calls still running are abandoned as above,
    and the calls not yet started are not run, each failing with an error result that says so (a [`ToolAbandoned`]);
    one warning counts them. So a graceful stop never waits on a hung tool: the round, the step and the checkpoint
    finish.

    Args:
        max_workers (`int`): sync tool calls running at once (calls beyond it wait for a free slot).
        timeout (`float`, *optional*): seconds a call may run before it is abandoned (`tool_timeout`); None: no limit
            (TRL's behaviour).
        slow_after (`float`, *optional*): seconds after which calls still running are warned about; None: the module's
            SLOW_TOOL_CALL_SECONDS (60), read when the runner is built.
        stopping (`Callable[[], str | None]`, *optional*): why the run is stopping (e.g. "the run is stopping (SIGTERM
            received)"), or None while it is not; called from the thread that runs a round
            ([`~trl_trapo.interrupts.SignalCatcher.stopping`] in a trainer). None: calls are always waited for.
    """

    def __init__(
        self,
        max_workers: int = 16,
        timeout: float | None = None,
        slow_after: float | None = None,
        stopping: Callable[[], str | None] | None = None,
    ):
        self.max_workers = max_workers
        self.timeout = timeout
        self.slow_after = SLOW_TOOL_CALL_SECONDS if slow_after is None else slow_after
        self.stopping = stopping
        self.slots: asyncio.Semaphore | None = None  # made with the loop (a semaphore binds to one loop)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.warned: set[str] = set()  # tools whose first failure was warned about
        self.running: dict[int, tuple[ToolCall, float]] = {}  # calls in progress (the loop's thread writes it)
        self.running_lock = threading.Lock()

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The runner's event loop, started in a daemon thread on first use (and after `close`: the trainer closes
        its rollout source when `train()` ends, and a later `train()` or round must still run tools)."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            self.slots = asyncio.Semaphore(self.max_workers)
            self.thread = threading.Thread(target=self.loop.run_forever, name="trl-trapo-tools-loop", daemon=True)
            self.thread.start()
        return self.loop

    def run(self, turns: Sequence[Sequence[ToolCall]]) -> list[list[tuple[Any, bool]]]:
        """Run every turn's calls, in order within a turn, the turns concurrently, and wait for all of them (or, once
        `stopping` gives a reason, abandon those still running).

        Args:
            turns (`Sequence[Sequence[ToolCall]]`): per assistant turn (one per rollout that called tools), its calls
                in the order the model wrote them.

        Returns:
            `list[list[tuple[Any, bool]]]`: per turn, per call, `(result, failed)`: the tool's return value, or
            `{"error": message}` with `failed=True` when the call could not run, the tool raised (its arguments
            not fitting included), it ran past `timeout`, or it was abandoned (or not started) because the run is
            stopping. Never raises for a tool's error.
        """
        if not any(turns):
            return [[] for _ in turns]
        loop = self.event_loop()
        stop = RoundStop(asyncio.Event())
        stop.reason = self.stopping() if self.stopping is not None else None  # already stopping: nothing starts
        futures = [asyncio.run_coroutine_threadsafe(self.run_turn(calls, stop), loop) for calls in turns]
        self.wait(futures, stop, loop)
        outcomes = [future.result() for future in futures]
        # warned here, in the caller's thread and in call order: the first failure of each tool, deterministically
        abandoned: dict[str, int] = {}
        for calls, turn_outcomes in zip(turns, outcomes):
            for tool_call, (_, _, error) in zip(calls, turn_outcomes):
                if isinstance(error, ToolAbandoned):  # one warning for them all, below
                    abandoned[tool_call.name] = abandoned.get(tool_call.name, 0) + 1
                elif error is not None and tool_call.name not in self.warned:
                    self.warned.add(tool_call.name)
                    # a timeout's traceback is the runner's, no help in finding the tool's line: the message says it
                    traceback = None if isinstance(error, ToolTimeout) else error
                    logger.warning(self.failure_message(tool_call, error), exc_info=traceback)
        if abandoned:
            logger.warning(self.abandoned_message(stop.reason, abandoned))
        return [[(result, failed) for result, failed, _ in turn_outcomes] for turn_outcomes in outcomes]

    def wait(self, futures: list, stop: RoundStop, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for the turns' futures; every `WAIT_POLL_SECONDS` meanwhile, warn about slow calls (once per tool in
        this round) and ask `stopping`: a reason stops the round (`stop.event` is set in the loop)."""
        warned_slow: set[str] = set()
        if stop.reason is not None:
            loop.call_soon_threadsafe(stop.event.set)
        pending = set(futures)
        while pending:
            _, pending = concurrent.futures.wait(pending, timeout=WAIT_POLL_SECONDS)
            if not pending:
                break
            if stop.reason is None and self.stopping is not None:
                reason = self.stopping()
                if reason is not None:
                    stop.reason = reason
                    loop.call_soon_threadsafe(stop.event.set)
            self.warn_slow(warned_slow)

    async def run_turn(self, calls: Sequence[ToolCall], stop: RoundStop) -> list[tuple[Any, bool, Exception | None]]:
        """One turn's calls, each awaited before the next starts: per call `(result, failed, exception)`, the
        exception the tool raised (a [`ToolTimeout`] for one abandoned, a [`ToolAbandoned`] for one abandoned or not
        started because the run is stopping; None when it returned, or when the call could not run)."""
        outcomes: list[tuple[Any, bool, Exception | None]] = []
        for tool_call in calls:
            if tool_call.tool is None:
                outcomes.append(({"error": tool_call.error}, True, None))
                continue
            key, started = id(tool_call), time.monotonic()
            try:
                if stop.reason is not None:
                    raise ToolAbandoned(f"not run: {stop.reason}")
                with self.running_lock:
                    self.running[key] = (tool_call, started)
                if inspect.iscoroutinefunction(tool_call.tool):
                    result = await self.settle(as_tool_outcome(tool_call.tool(**tool_call.arguments)), stop, started)
                else:
                    async with self.slots:
                        if stop.reason is not None:  # it waited for a slot meanwhile
                            raise ToolAbandoned(f"not run: {stop.reason}")
                        result = await self.settle(self.call_in_thread(tool_call), stop, started)
                outcomes.append((result, False, None))
            except Exception as error:  # the tool's error (or its arguments not fitting), a timeout: an error result
                outcomes.append(({"error": str(error)}, True, error))
            finally:
                with self.running_lock:
                    self.running.pop(key, None)
        return outcomes

    async def settle(self, awaitable: Any, stop: RoundStop, started: float) -> Any:
        """The call's result, or its exception; a [`ToolTimeout`] once it has run `timeout` seconds, a
        [`ToolAbandoned`] once the round stops (`stop.event`). Either way the call is abandoned: an async tool's task
        is cancelled (not waited for), a sync call's thread runs on, its outcome ignored."""
        call = asyncio.ensure_future(awaitable)
        stopped = asyncio.ensure_future(stop.event.wait())
        try:
            done, _ = await asyncio.wait({call, stopped}, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if call in done:
            if call.cancelled():  # not cancelled here: the async tool raised asyncio.CancelledError itself
                raise ToolBaseException(asyncio.CancelledError())
            return call.result()
        call.cancel()
        if stopped in done:
            raise ToolAbandoned(f"abandoned after {time.monotonic() - started:.0f} s: {stop.reason}")
        raise ToolTimeout(f"timed out: no result within tool_timeout={self.timeout:g} s, abandoned")

    @staticmethod
    def call_in_thread(tool_call: ToolCall) -> asyncio.Future:
        """Run a sync tool call in a daemon thread of its own; the returned future (of the running loop) gets its
        result or exception. Cancelling the future abandons the call: the thread runs on, its outcome ignored."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def settle(result: Any, error: Exception | None) -> None:
            if future.done():  # abandoned (timed out, or the run is stopping)
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def target() -> None:
            # every path delivers an outcome (trial 16's N22: a KeyboardInterrupt ended the thread without one and
            # the round waited forever); the default is replaced below unless converting the exception itself fails
            result, error = None, RuntimeError(f"the tool's thread ended without an outcome ({tool_call.name})")
            try:
                result, error = tool_call.tool(**tool_call.arguments), None
            except BaseException as raised:  # SystemExit, KeyboardInterrupt, ... too: a failed call, never a hang
                error = tool_error(raised)
            finally:
                try:
                    loop.call_soon_threadsafe(settle, result, error)
                except RuntimeError:  # the loop was closed meanwhile (`close` after an abandoned call): nobody waits
                    pass

        threading.Thread(target=target, name=f"trl-trapo-tool-{tool_call.name}", daemon=True).start()
        return future

    def warn_slow(self, warned: set[str]) -> None:
        """Warn about the tools with a call running for `slow_after` seconds or more, once per tool in a round
        (`warned`: the round's tools warned about so far): one warning per tool, however many of its calls run."""
        now = time.monotonic()
        with self.running_lock:
            running = list(self.running.values())
        slow = {c.name for c, started in running if now - started >= self.slow_after and c.name not in warned}
        for name in sorted(slow):
            warned.add(name)
            calls = sorted(((c, started) for c, started in running if c.name == name), key=lambda pair: pair[1])
            logger.warning(self.slow_message(name, [c for c, _ in calls], now - calls[0][1]))

    def slow_message(self, name: str, calls: list[ToolCall], seconds: float) -> str:
        """The warning for a tool whose calls are still running: how many, the longest for how long, the first one's
        arguments, and what bounds them (`tool_timeout`)."""
        if self.timeout is not None:
            limit = f"abandoned after tool_timeout={self.timeout:g} s"
        else:
            limit = "set tool_timeout (seconds) in TRAPOConfig to abandon calls that run longer (TRL has no limit)"
        arguments = short_arguments(calls[0].arguments)
        if len(calls) == 1:
            return (
                f"The tool `{name}` has been running for {seconds:.0f} s, called with the arguments {arguments}; the "
                f"round waits for it: {'it is ' + limit if self.timeout is not None else limit}."
            )
        return (
            f"{len(calls)} calls of `{name}` are still running, the longest for {seconds:.0f} s (the first was called "
            f"with the arguments {arguments}); the round waits for them: "
            f"{'they are ' + limit if self.timeout is not None else limit}."
        )

    @staticmethod
    def abandoned_message(reason: str | None, abandoned: dict[str, int]) -> str:
        """The one warning for a round stopped by a signal: the calls abandoned or not started, per tool."""
        counts = ", ".join(f"`{name}` x{count}" for name, count in sorted(abandoned.items()))
        return (
            f"{sum(abandoned.values())} tool call(s) were abandoned ({counts}): {reason}. Calls still running were "
            "not waited for (a sync tool's thread runs on, its result ignored) and calls not yet started were not "
            "run; each is a failed call (the model reads its error, counted in tools/failure_frequency), so that the "
            "round, the step and its checkpoint can finish."
        )

    @staticmethod
    def failure_message(tool_call: ToolCall, error: BaseException) -> str:
        """The warning for a tool's first failure: its name, the exception and the call's arguments."""
        arguments = short_arguments(tool_call.arguments)
        if isinstance(error, ToolTimeout):
            what = str(error)
        elif isinstance(error, ToolBaseException):  # named as raised: KeyboardInterrupt, sys.exit(3), ...
            what = error.what
        else:
            what = f"raised {type(error).__name__}: {error}"
        stop = ""
        if isinstance(error, ToolBaseException) and isinstance(error.raised, KeyboardInterrupt):
            stop = (
                " A KeyboardInterrupt raised by a tool (e.g. from a subprocess it wraps) is that call's failure, not "
                "a stop: Ctrl-C reaches the trainer's main thread, which finishes the step, saves and stops."
            )
        return (
            f"The tool `{tool_call.name}` {what}, called with the arguments {arguments}. The model reads {{'error': {str(error)!r}}} as the result and the call counts in "
            f"tools/failure_frequency; only the first failure of each tool is shown.{stop}"
        )

    def close(self) -> None:
        """Stop the event loop (it starts again at the next call); abandoned sync calls' threads run on."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
            self.loop = self.thread = self.slots = None


# ---------------------------------------------------------------------------------------------------------------------
# The source
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """One rollout's state while a round runs (token lists grow turn by turn)."""

    example: dict  # the dataset row (prompt with the reset text appended; `model_inputs`: the rendered prompt's)
    prompt_ids: list[int]
    tools: dict[str, Callable]  # name -> callable, what this rollout may call
    schemas: list[dict]
    environment: Any = None
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # the prompt's images as the processor gives
    # them (`pixel_values`, ...; empty for a text row): every turn's `generate` reads them, and the trajectory keeps them
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 sampled, 0 tool result / template glue
    logps: list[float] = field(default_factory=list)  # behaviour log-probs recorded while sampling (NaN: unknown,
    # the sampler recorded none: the trainer computes them), 0 on tool results
    sampler_logps: list[float] = field(default_factory=list)  # a separate engine's (vLLM's) log-probs, NaN: none
    temperature: float = 1.0  # every turn of the rollout is sampled at it (the round's; its family's with exploration)
    messages: list[dict] = field(default_factory=list)  # TRL's structured completion (assistant and tool messages)
    turns: int = 0
    calls: int = 0
    failures: int = 0
    rolled_back: bool = False  # its last tool results did not fit and were dropped (the rollout ended there)
    turn_ended: bool = True  # its last turn ended with a stop token (False: the length limit cut it)
    parse_error: str | None = None  # why the parser refused its last turn (None: parsed)
    truncated: bool = False  # its last turn was cut by the length limit with tool calls in it, which did not run


@functools.cache
def warn_no_tool_rounds() -> None:
    """Say, once per process (the trainer and evaluation each build a source), what `max_tool_calling_iterations=0`
    does: TRL's meaning (its loop runs no round, `trl.GRPOTrainer._tool_call_loop`), which nothing else shows."""
    logger.warning(
        "max_tool_calling_iterations=0: the tools are rendered in each prompt but no tool call is run, so each "
        "rollout is one assistant turn (as under TRL's GRPOTrainer). Set it to 1 or more to run the model's tool "
        "calls (None: no bound)."
    )


class ToolRolloutSource(RolloutSource):
    """A rollout source that runs TRL's multi-turn tool-calling loop with the live policy (module docstring).

    A round holds `ceil(rows_needed * num_mini_batches / group)` prompts from the memory pool, each `group` times in a
    row, as the default source's; each rollout gets its own environment instance (reused across rounds), `reset` with
    its row. The round is scored here, because reward functions read the environments (`environments=`) and the
    structured completions (assistant and tool messages, TRL's `completions`), and the instances are reset for the
    next round.

    Args:
        engine ([`~trl_trapo.rollout.RolloutEngine`]): samples each turn (`engine.sample(..., max_new_tokens=)`).
        dataset (`Dataset`): the RL rows (conversational `prompt`, and the reward columns).
        prompts ([`~trl_trapo.memory.MemoryPool`]): chooses each round's prompts (`select_prompts(n, step)`).
        spec ([`AgentSpec`]): the tools and environments.
        tokenizer: the policy's tokenizer (checked with [`check_chat_template`]).
        scorer ([`~trl_trapo.rewards.RewardScorer`]): the trainer's reward functions (environment rewards included).
        group (`int`): completions per prompt. num_mini_batches (`int`): optimizer steps a round feeds.
        temperature (`float`): the configured sampling temperature (the memory pool's `rollout_temperature` may
            change it per round: few-shot mode anneals it).
        response_length (`int`): the completion budget in tokens (tool results included).
        context (`int`, *optional*): the policy's positions; prompt + completion stays below it.
        max_iterations (`int`, *optional*): rounds of tool calls per rollout (`max_tool_calling_iterations`; None:
            unbounded, the budget still ends the rollout).
        log_metric (`Callable[[str, float], None]`): where the `tools/*` metrics go.
        template_kwargs (`dict`, *optional*): `chat_template_kwargs`.
        max_workers (`int`): sync tool calls running at once.
        sum_over_ranks (`Callable[[torch.Tensor], torch.Tensor]`, *optional*): sums a tensor over the data-parallel
            ranks (a collective; `trl_trapo.distributed.sum_over_ranks` bound to the trainer's accelerator). Given,
            the ranks generate in lockstep (`engine.sample(..., lockstep=True)`) and the `tools/*` metrics cover the
            whole round (module docstring); None: this process is the only one.
        generation_batch_size (`int`, *optional*): with `sum_over_ranks`, rows per `engine.sample` call
            (`local_rollout_forward_batch_size`: the engine then makes one `generate` call per `sample`); None: a
            turn's rows in one call.
        stop_token_ids (`Sequence[int]`, *optional*): the ids the engine stops a turn at (and cuts it after); a turn
            that does not end with one was cut by the length limit, and its tool calls are not run. None: the
            tokenizer's EOS.
        images ([`~trl_trapo.vision.ImageRows`], *optional*): a vision-language run's row builder. With it and an
            image column (`images` / `image`) in `dataset`, each prompt is rendered with its tools by the processor
            and its images expanded ([`prompt_renderer`], as TRL's `GRPOTrainer` renders a VLM's prompts), and the
            row's model inputs (`pixel_values`, ...) go to every turn's `generate` and into its trajectory (so the
            reference and training forwards read them); a text row among image rows has none.
        exploration ([`~trl_trapo.exploration.TargetedExploration`], *optional*): per-row temperatures by task
            family (`exploration=True`): every turn of a rollout is sampled at its family's.
        tool_timeout (`float`, *optional*): seconds a tool call may run before it is abandoned and fails
            (`tool_timeout`; [`ToolRunner`]); None: no limit.
        stopping (`Callable[[], str | None]`, *optional*): why the run is stopping (SIGINT / SIGTERM received), or
            None while it is not: once it gives a reason, the tool calls still running are abandoned and those not
            started are not run, as failed calls ([`ToolRunner`]). None: calls are always waited for.
        role (`str`): the dataset's argument name, for messages (`"train_dataset"`; evaluation's is its eval set's).

    Raises:
        ValueError: at construction, for a chat template that cannot express the loop ([`check_chat_template`]),
            prompts that are not conversational, or an empty `stop_token_ids`.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        dataset: Dataset,
        prompts: MemoryPool,
        spec: AgentSpec,
        tokenizer,
        scorer: RewardScorer,
        group: int,
        num_mini_batches: int,
        temperature: float,
        response_length: int,
        context: int | None,
        max_iterations: int | None,
        log_metric: Callable[[str, float], None],
        template_kwargs: dict | None = None,
        max_workers: int = 16,
        sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None,
        generation_batch_size: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        images: ImageRows | None = None,
        exploration: TargetedExploration | None = None,
        tool_timeout: float | None = None,
        stopping: Callable[[], str | None] | None = None,
        role: str = "train_dataset",
    ):
        self.role = role
        # a VLM run's image prompts are rendered (with their tools) by the processor, and so are the tool messages
        self.image_column = image_column(dataset.column_names, role) if images is not None else None
        self.images = images if self.image_column is not None else None
        self.renderer = self.images.processor if self.images is not None else tokenizer
        check_chat_template(tokenizer, template_kwargs, renderer=self.renderer)
        if stop_token_ids is not None and not list(stop_token_ids):
            raise ValueError(
                "stop_token_ids is empty: no assistant turn would end, so every tool call would be cut off by the "
                "length limit; give the ids generation stops at (None: the tokenizer's EOS)."
            )
        # (no rows: an evaluation shard of a rank that only takes part in the other ranks' turns)
        if len(dataset) and not is_conversational({"prompt": dataset[0]["prompt"]}):
            raise ValueError(
                "tools / environment_factory need conversational prompts (a `prompt` column of chat messages), so "
                "that the chat template can render the tool schemas and the tool messages; got a plain-text prompt."
            )
        self.engine, self.dataset, self.prompts, self.spec = engine, dataset, prompts, spec
        self.tokenizer, self.scorer = tokenizer, scorer
        self.group, self.num_mini_batches = int(group), int(num_mini_batches)
        self.temperature, self.response_length, self.context = float(temperature), int(response_length), context
        self.max_iterations = math.inf if max_iterations is None else int(max_iterations)
        if self.max_iterations == 0:
            warn_no_tool_rounds()
        self.log_metric = log_metric
        self.sum_over_ranks = sum_over_ranks
        self.generation_batch_size = generation_batch_size
        self.exploration = exploration
        self.template_kwargs = dict(template_kwargs or {})
        self.runner = ToolRunner(max_workers, timeout=tool_timeout, stopping=stopping)
        self.pool: dict[str | None, list[Any]] = {name: [] for name in spec.factories}
        self.last_round_seconds: float | None = None
        self.stop_token_ids = set([tokenizer.eos_token_id] if stop_token_ids is None else stop_token_ids)
        self.warned_rollback = False  # the first rolled-back tool result of the run is warned about, once
        self.warned_truncation = False  # and the first tool call cut off by the length limit

    # ---- one rollout's start ------------------------------------------------------------------------------------------
    def start(self, rows: list[dict], indices: Sequence[int] | None = None) -> list[Rollout]:
        """Each row's rollout: its environment instance (from the pool, created when the round needs more), `reset`
        with the row, the reset text appended to the last message, the prompt rendered with its tools (and, in a
        VLM run, its images: the row's `model_inputs` become those of this rendering).

        Args:
            rows (`list[dict]`): the round's dataset rows.
            indices (`Sequence[int]`, *optional*): each row's index in the dataset (for messages, and so that the
                rows of one prompt whose rendering is the same share one processor call and one set of tensors).
        """
        handed: dict[str | None, int] = {}
        rollouts = []
        rendered: dict[tuple, tuple[list[int], dict[str, torch.Tensor]]] = {}  # (index, prompt, tools) -> ids, inputs
        for position, row in enumerate(rows):
            row = dict(row)
            environment = None
            tools = list(self.spec.tools)
            if self.spec.factories:
                name = self.spec.environment_name(row)
                pool, index = self.pool[name], handed.get(name, 0)
                if index == len(pool):
                    pool.append(self.spec.factories[name]())
                handed[name] = index + 1
                environment = pool[index]
                observation = check_observation(environment.reset(**self.spec.reset_kwargs(row)), environment)
                tools += environment_methods(environment)
                if observation is not None:
                    prompt = list(row["prompt"])
                    content = prompt[-1]["content"]
                    if isinstance(content, list):  # a multimodal message's parts (TRL's rule): the text is a part
                        prompt[-1] = {**prompt[-1], "content": [*content, {"type": "text", "text": observation}]}
                    else:
                        prompt[-1] = {**prompt[-1], "content": content + observation}
                    row["prompt"] = prompt
            schemas = self.spec.schemas[self.spec.environment_name(row) if self.spec.factories else None]
            model_inputs: dict[str, torch.Tensor] = {}
            if self.images is None:
                prompt_ids = tokenize_prompt(
                    row["prompt"], self.tokenizer, {**self.template_kwargs, "tools": schemas or None}
                )
            else:
                index = None if indices is None else indices[position]
                key = (index, repr(row["prompt"]), json.dumps(schemas, sort_keys=True))
                if index is None or key not in rendered:
                    ids, inputs = self.images.prompt(
                        row, self.image_column, self.role, "?" if index is None else index, tools=schemas or None
                    )
                    rendered[key] = (ids, as_tensors(inputs))
                prompt_ids, model_inputs = rendered[key]
                row["model_inputs"] = model_inputs  # what the trajectory carries: this rendering's inputs
            rollouts.append(
                Rollout(
                    row,
                    list(prompt_ids),
                    {t.__name__: t for t in tools},
                    schemas,
                    environment=environment,
                    model_inputs=model_inputs,
                    temperature=self.temperature,
                )
            )
        return rollouts

    # ---- the loop -----------------------------------------------------------------------------------------------------
    def sample(self, rows_needed: int, step: int) -> SampledRound:
        """Run one round of the tool-calling loop (class docstring) and score it.

        Returns:
            [`~trl_trapo.sources.SampledRound`]: `B` completions (every turn, tool results and template glue
            included), `completion_mask` 0 on the tokens the policy did not sample, behaviour log-probs (0 there),
            prompt ids rendered with the tools, `scores` and `per_func`, version `step`.
        """
        start_time = time.perf_counter()
        num_prompts = max(math.ceil(rows_needed * self.num_mini_batches / self.group), 1)
        indices = self.prompts.select_prompts(num_prompts, step)
        rows = [self.dataset[i] for i in indices for _ in range(self.group)]
        # the round's temperature (few-shot mode anneals it), or each family's (targeted exploration, scaling the
        # round's), as the default source's: every turn of a rollout is sampled, and its trajectory trained, at its row's
        temperature = self.prompts.rollout_temperature(self.temperature)
        temperatures = self.exploration.row_temperatures(rows, temperature) if self.exploration is not None else None
        rollouts = self.start(rows, [i for i in indices for _ in range(self.group)])
        for k, rollout in enumerate(rollouts):
            rollout.temperature = float(temperature if temperatures is None else temperatures[k])
        self.run_turns(rollouts, step)
        examples = [r.example for r in rollouts]
        prompt_ids = [torch.tensor(r.prompt_ids, dtype=torch.long) for r in rollouts]
        completion_ids = [torch.tensor(r.completion_ids, dtype=torch.long) for r in rollouts]
        environments = [r.environment for r in rollouts] if self.spec.factories else None
        scores, per_func = self.scorer.score(
            examples,
            prompt_ids,
            completion_ids,
            completions=[r.messages for r in rollouts],
            extra_kwargs={"environments": environments} if environments is not None else None,
        )
        # the round's counts, every rank's (TRL's definitions are over the whole round: failures / calls is not the
        # mean of the ranks' ratios when their calls differ)
        counts = torch.tensor(
            [
                len(rollouts),
                sum(r.calls for r in rollouts),
                sum(r.failures for r in rollouts),
                sum(r.rolled_back for r in rollouts),
                sum(r.truncated for r in rollouts),
                sum(r.turns for r in rollouts),
            ],
            dtype=torch.float64,
        )
        if self.sum_over_ranks is not None:
            counts = self.sum_over_ranks(counts)
        total, calls, failures, rolled_back, truncated, turns = counts.tolist()
        self.log_metric("tools/call_frequency", calls / total)
        self.log_metric("tools/failure_frequency", failures / calls if calls else 0.0)
        self.log_metric("tools/rollback_frequency", rolled_back / total)
        self.log_metric("tools/truncated_frequency", truncated / total)
        self.log_metric("tools/turns_mean", turns / total)
        self.last_round_seconds = time.perf_counter() - start_time
        behaviour = [torch.tensor(r.logps, dtype=torch.float32) for r in rollouts]
        masks = [torch.tensor(r.mask, dtype=torch.long) for r in rollouts]
        recorded = not any(bool(lp.isnan().any()) for lp in behaviour)  # vLLM records none: the trainer's
        sampler = None  # a separate engine's log-probs (vLLM's), when it gave some for the policy's tokens
        if not recorded:
            sampler = [torch.tensor(r.sampler_logps, dtype=torch.float32) for r in rollouts]
            if not any(bool((~lp.isnan() & m.bool()).any()) for lp, m in zip(sampler, masks)):
                sampler = None
        return SampledRound(
            examples,
            completion_ids,
            version=step,
            group=self.group,
            old_per_token_logps=behaviour if recorded else None,
            temperatures=torch.tensor([r.temperature for r in rollouts], dtype=torch.float32),
            prompt_ids=prompt_ids,
            completion_mask=masks,
            scores=scores,
            per_func=per_func,
            sampler_per_token_logps=sampler,
        )

    def room(self, rollout: Rollout) -> int:
        """Tokens this rollout may still add: the completion budget, and the context (prompt + completion < it)."""
        left = self.response_length - len(rollout.completion_ids)
        if self.context is not None:
            left = min(left, self.context - 1 - len(rollout.prompt_ids) - len(rollout.completion_ids))
        return left

    def rollback_message(self, rollout: Rollout, suffix_length: int) -> str:
        """The warning for a rolled-back tool result: which limit it hit (the `response_length` budget or the
        model's context) and the setting that would make room.

        Args:
            rollout ([`Rollout`]): the rollout, before the result was appended.
            suffix_length (`int`): tokens of the tool messages + the next turn's generation prompt.

        Returns:
            `str`: the message.
        """
        prompt, completion = len(rollout.prompt_ids), len(rollout.completion_ids)
        budget_left = self.response_length - completion
        head = (
            f"A tool result of {suffix_length} tokens (the tool messages and the next turn's generation prompt) did "
            "not fit and was rolled back: the rollout ended after the call the model wrote, without the result or a "
            "next turn (counted in tools/rollback_frequency; warned once per run). "
        )
        if self.context is not None and self.context - 1 - prompt - completion < budget_left:
            return head + (
                f"The model's context of {self.context} positions is the limit: the prompt holds {prompt} tokens (the "
                f"tool schemas included) and the completion {completion}. Raising response_length cannot help: "
                "shorten the prompts (max_prompt_length bounds them, before the tool schemas are added) or the tool "
                "results, or use a model with a longer context."
            )
        return head + (
            f"response_length={self.response_length} is the limit (it covers every assistant turn and every tool "
            f"result of a rollout): {completion} tokens were already used. Raise TRAPOConfig.response_length above "
            f"{completion + suffix_length} (max_completion_length, GRPO's name, if that is the one you set), with room "
            "for the answer after the result."
        )

    def truncation_message(self, rollout: Rollout) -> str:
        """The warning for a turn cut by the length limit with tool calls in it: which limit cut it (the
        `response_length` budget, the model's context, or its generation batch's) and the setting that would make
        room.

        Args:
            rollout ([`Rollout`]): the rollout, with the cut turn appended.

        Returns:
            `str`: the message.
        """
        prompt, completion = len(rollout.prompt_ids), len(rollout.completion_ids)
        head = (
            "An assistant turn was cut by the length limit while it held a tool call: its calls were not run (the "
            "last one may be incomplete, and no tool result can follow a turn that never ended), and the rollout "
            "ended there (counted in tools/truncated_frequency; warned once per run). "
        )
        if self.response_length - completion <= 0:
            return head + (
                f"response_length={self.response_length} is the limit (it covers every assistant turn and every "
                f"tool result of a rollout) and the completion reached it. Raise TRAPOConfig.response_length "
                "(max_completion_length, GRPO's name, if that is the one you set), with room for the call, its result "
                "and the answer."
            )
        if self.context is not None and self.context - 1 - prompt - completion <= 0:
            return head + (
                f"The model's context of {self.context} positions is the limit: the prompt holds {prompt} tokens (the "
                f"tool schemas included) and the completion {completion}. Raising response_length cannot help: "
                "shorten the prompts (max_prompt_length bounds them, before the tool schemas are added) or the tool "
                "results, or use a model with a longer context."
            )
        return head + (
            f"The turn's generation batch was the limit: its rows generate together, as many new tokens as the "
            f"longest row leaves in the model's context of {self.context} positions (this rollout had used "
            f"{completion} of response_length={self.response_length} tokens). Shorten the prompts or the tool "
            "results, or use a model with a longer context."
        )

    def any_rank_has(self, items: list) -> bool:
        """Whether `items` is not empty here or (with `sum_over_ranks`, a collective) on any rank: the same answer on
        every rank."""
        if self.sum_over_ranks is None:
            return bool(items)
        return bool(self.sum_over_ranks(torch.tensor([float(bool(items))], dtype=torch.float64)).item() > 0)

    def run_turns(self, rollouts: list[Rollout], step: int) -> None:
        """Generate, call tools, append their results, generate again, until no rollout calls a tool, the budget is
        spent, or `max_iterations` rounds of calls ran; with `sum_over_ranks`, until that holds on every rank (a rank
        that is done meanwhile takes part in the others' turns, see [`generate_turn`]).

        A turn's calls run in the order written, the rollouts' turns concurrently ([`ToolRunner`]). A turn cut by the
        length limit (no stop token at its end) runs none of its calls and ends its rollout: its last call may be
        incomplete (transformers' parser reads an unclosed `<tool_call>` as a whole call), and no tool result can
        follow a turn that never ended; such rollouts are counted in `tools/truncated_frequency`."""
        active = [r for r in rollouts if self.room(r) > 0]
        iteration = 0
        while self.any_rank_has(active):
            self.generate_turn(active, step, rollouts[0] if rollouts else None)
            pending = []  # (rollout, its turn's calls) of the rollouts whose finished turn called tools
            for rollout in active:
                calls = self.parse_calls(rollout)
                if calls and not rollout.turn_ended:  # cut off by the length limit: never run
                    rollout.truncated = True
                    if not self.warned_truncation:
                        self.warned_truncation = True
                        logger.warning(self.truncation_message(rollout))
                elif calls:
                    pending.append((rollout, calls))
            if iteration >= self.max_iterations:
                break
            results = self.runner.run([calls for _, calls in pending])
            active = []
            for (rollout, calls), outcomes in zip(pending, results):
                tool_messages = []
                for tool_call, (result, failed) in zip(calls, outcomes):
                    rollout.calls += 1
                    rollout.failures += int(failed)
                    content = result if isinstance(result, list) else str(result)
                    tool_messages.append({"role": "tool", "name": tool_call.name, "content": content})
                suffix = tool_suffix_ids(self.renderer, tool_messages, self.template_kwargs)
                # a result that does not fit is rolled back: the rollout ends after the call the model wrote
                if len(suffix) >= self.room(rollout):
                    rollout.rolled_back = True
                    if not self.warned_rollback:
                        self.warned_rollback = True
                        logger.warning(self.rollback_message(rollout, len(suffix)))
                    continue
                rollout.completion_ids += suffix
                rollout.mask += [0] * len(suffix)
                rollout.logps += [0.0] * len(suffix)
                rollout.sampler_logps += [0.0] * len(suffix)
                rollout.messages += tool_messages
                active.append(rollout)
            iteration += 1

    def generate_turn(self, active: list[Rollout], step: int, first: Rollout | None) -> None:
        """One turn of the running rollouts: one batched `engine.sample` on one process; with `sum_over_ranks`, calls
        of at most `generation_batch_size` rows while any rank has rows left, and a throwaway token (from `first`'s
        prompt, this rank's first rollout; with none, an evaluation shard without rows, from the EOS token alone) in
        the calls this rank has no rows for, every call with `lockstep=True` (module docstring)."""
        if self.sum_over_ranks is None:
            self.sample_rows(active, step)
            return
        size = self.generation_batch_size or max(len(active), 1)
        chunks = [active[start : start + size] for start in range(0, len(active), size)]
        index = 0
        while self.any_rank_has(chunks[index:]):
            if index < len(chunks):
                self.sample_rows(chunks[index], step, lockstep=True)
            else:  # the others generate; this rank takes part in the collectives, and keeps nothing
                prompt = (  # its images too
                    {"prompt_ids": list(first.prompt_ids), "model_inputs": first.model_inputs}
                    if first is not None
                    else {"prompt_ids": [self.tokenizer.eos_token_id]}
                )
                self.engine.sample([prompt], 1, step, self.temperature, max_new_tokens=1, lockstep=True)
            index += 1

    def sample_rows(self, active: list[Rollout], step: int, lockstep: bool = False) -> None:
        """One `engine.sample` over `active` (`lockstep=True` passed on only when set: an engine of one process, e.g.
        evaluation's greedy one, need not know it), each row continuing from its prompt + completion ids; the new
        tokens (cut to each rollout's room) are appended with mask 1, their behaviour log-probs (NaN when the
        sampler recorded none: vLLM's are recomputed by the trainer) and the sampler's own (vLLM's; NaN: none). Each row
        is sampled at its rollout's temperature."""
        # every turn continues from the row's token ids with the row's images (a VLM prompt's image tokens need them:
        # its processed model inputs for transformers, its images column for vLLM, which processes them itself)
        contexts = [
            {
                "prompt_ids": r.prompt_ids + r.completion_ids,
                "model_inputs": r.model_inputs,
                **{c: r.example[c] for c in IMAGE_COLUMNS if r.example.get(c) is not None},
            }
            for r in active
        ]
        rooms = [self.room(r) for r in active]
        limit = max(rooms)
        if self.context is not None:  # no row may pass the context while the batch generates
            limit = min(limit, min(self.context - len(c["prompt_ids"]) for c in contexts))
        extra = {"lockstep": True} if lockstep else {}
        temperatures = [r.temperature for r in active]
        temperature = temperatures[0] if len(set(temperatures)) == 1 else temperatures
        sampled = self.engine.sample(contexts, 1, step, temperature, max_new_tokens=max(limit, 1), **extra)
        unknown = [None] * len(active)
        behaviour = sampled.old_per_token_logps or unknown
        own = sampled.sampler_per_token_logps or unknown
        for rollout, room, ids, logps, sampler_logps in zip(active, rooms, sampled.completion_ids, behaviour, own):
            ids = ids[:room]
            nan = [math.nan] * ids.numel()
            prefix = rollout.prompt_ids + rollout.completion_ids
            rollout.completion_ids += ids.tolist()
            rollout.mask += [1] * ids.numel()
            rollout.logps += nan if logps is None else logps[:room].tolist()
            rollout.sampler_logps += nan if sampler_logps is None else sampler_logps[:room].tolist()
            rollout.turns += 1
            rollout.turn_ended = ids.numel() > 0 and int(ids[-1]) in self.stop_token_ids
            message, rollout.parse_error = self.parse(ids.tolist(), prefix, rollout.schemas)
            rollout.messages.append(message)

    def parse(self, ids: list[int], prefix: list[int], schemas: list[dict]) -> tuple[dict, str | None]:
        """One assistant turn as a message (transformers' `parse_response`), and the parser's error: a turn it refuses
        (a malformed tool call) is kept as plain text, as TRL's `parse_response` keeps it."""
        try:
            message = self.tokenizer.parse_response(ids, prefix=prefix, tools=schemas or None)
            if message is None:
                raise ValueError("nothing parsed")
        except (ValueError, TypeError) as error:
            return {"role": "assistant", "content": self.tokenizer.decode(ids, skip_special_tokens=True)}, str(error)
        message = dict(message)
        message["content"] = message.get("content") or ""
        return message, None

    def parse_calls(self, rollout: Rollout) -> list[ToolCall]:
        """The last turn's tool calls, in the order written; an unknown name, malformed arguments, a call that is not
        a JSON object with a string `name`, or an unparsable turn becomes a call that cannot run and fails with an
        error result (counted in `tools/failure_frequency`)."""
        if rollout.parse_error is not None:  # the parser's own message is long; a compact one fits small budgets
            return [ToolCall("unknown", error="unparsable tool call")]
        calls = []
        for call in rollout.messages[-1].get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                # valid JSON the parser took for a call, but no call: `<c>"text"</c>`, `<c>7</c>`, `<c>{"name":3}</c>`
                calls.append(ToolCall("unknown", error="a tool call must be a JSON object with a string `name`"))
                continue
            name, arguments = function["name"], function.get("arguments", {})
            if name not in rollout.tools:
                calls.append(ToolCall(name, error=f"Tool {name} not found."))
            elif not isinstance(arguments, dict):
                calls.append(ToolCall(name, error=f"arguments must be a JSON object, got {arguments!r}"))
            else:
                calls.append(ToolCall(name, arguments, rollout.tools[name]))
        return calls

    def close(self, timeout: float | None = None) -> None:
        """Stop the tool threads and event loop (`timeout` is not used: the runner stops its threads at once)."""
        self.runner.close()


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation: greedy multi-turn rollouts through the same loop
# ---------------------------------------------------------------------------------------------------------------------


class GreedyTurnEngine:
    """The `sample` of [`~trl_trapo.rollout.RolloutEngine`] for evaluation's turns: greedy decoding with the model as
    it is (no weight sync, no vLLM), no behaviour log-probs (zeros), completions cut after a stop token, each row with
    its `model_inputs` (a VLM prompt's images).

    Args:
        model (`nn.Module`): the policy, unwrapped for generation and in eval mode (the caller's).
        generation_config (`GenerationConfig`): greedy settings (`do_sample=False`); each call sets `max_new_tokens`.
        pad_token_id (`int`): the id in padding positions.
        stop_token_ids (`Sequence[int]`): a turn is cut after the first of them.
        batch_size (`int`, *optional*): rows per `generate` call (all at once when None).
        synced_gpus (`Callable[[bool], bool | None]`, *optional*): `generate`'s `synced_gpus` given the call's
            `lockstep` ([`~trl_trapo.distributed.generation_synced_gpus`]); None: transformers decides.
    """

    def __init__(
        self,
        model: Any,
        generation_config: Any,
        pad_token_id: int,
        stop_token_ids: Sequence[int],
        batch_size: int | None = None,
        synced_gpus: Callable[[bool], bool | None] | None = None,
    ):
        self.model, self.generation_config, self.pad_token_id = model, generation_config, pad_token_id
        self.stop_token_ids, self.batch_size, self.synced_gpus = list(stop_token_ids), batch_size, synced_gpus

    def sample(self, examples, group, step, temperature, max_new_tokens=None, lockstep=False) -> SampledRound:
        """Continue every `examples[i]["prompt_ids"]` greedily for at most `max_new_tokens` tokens (`group` is 1,
        `temperature` is not read: greedy decoding has none).

        Returns:
            [`~trl_trapo.sources.SampledRound`]: `(C_i,)` completion ids cut after the stop token, zero log-probs.
        """
        from .samplers import generate
        from .vision import examples_model_inputs

        config = copy.deepcopy(self.generation_config)
        if max_new_tokens is not None:
            config.max_new_tokens = int(max_new_tokens)
        contexts = [list(e["prompt_ids"]) for e in examples]
        inputs = examples_model_inputs(examples)
        out = generate(
            self.model,
            contexts,
            config,
            self.pad_token_id,
            self.stop_token_ids,
            1.0,
            batch_size=self.batch_size,
            record_logps=False,
            synced_gpus=None if self.synced_gpus is None else self.synced_gpus(lockstep),
            model_inputs=inputs if any(inputs) else None,
        )
        return SampledRound(
            examples,
            out["completion_ids"],
            version=step,
            old_per_token_logps=out["old_per_token_logps"],
            prompt_ids=contexts,
        )


def greedy_tool_rollouts(
    engine: Any,
    dataset: Dataset,
    spec: AgentSpec,
    tokenizer,
    *,
    response_length: int,
    context: int | None,
    max_iterations: int | None,
    **settings: Any,
) -> list[Rollout]:
    """Roll every row of `dataset` out once through the training loop ([`ToolRolloutSource`]: its `start`, then
    `run_turns`): the prompt rendered with its tools (after the environment's `reset`, with a fresh instance per
    rollout), a turn of `engine`, the calls run, their results appended as token ids, the next turn. Nothing is
    scored. What evaluation runs ([`GreedyToolRollouts`], `trl_trapo.tasks.agent.evaluate_agent`) with a greedy
    engine ([`GreedyTurnEngine`]).

    Collective with `sum_over_ranks` in `settings`: every rank calls it, with or without rows.

    Args:
        engine: what samples each turn (`sample(examples, 1, 0, 1.0, max_new_tokens=..., [lockstep=True])`).
        dataset (`Dataset`): conversational `prompt` rows (may be empty).
        spec ([`AgentSpec`]): the tools and environments.
        tokenizer: the policy's tokenizer.
        response_length (`int`): the completion budget per rollout in tokens (tool results included).
        context (`int`, *optional*): the policy's positions.
        max_iterations (`int`, *optional*): rounds of tool calls per rollout (None: unbounded).
        **settings: [`ToolRolloutSource`]'s other keyword arguments (`template_kwargs`, `stop_token_ids`, `images`,
            `sum_over_ranks`, `generation_batch_size`, `tool_timeout`, `role`).

    Returns:
        `list[Rollout]`: one finished rollout per row, in order (`example`, `messages`, the token ids, the counts).

    Raises:
        ValueError: [`ToolRolloutSource`]'s construction checks (a chat template that cannot express the loop,
            prompts that are not chat messages).
    """
    source = ToolRolloutSource(
        engine,
        dataset,
        None,  # no prompt pool: the rows are given
        spec,
        tokenizer,
        None,  # not scored here
        group=1,
        num_mini_batches=1,
        temperature=1.0,
        response_length=response_length,
        context=context,
        max_iterations=max_iterations,
        log_metric=lambda name, value: None,  # the caller reports the rollouts' counts
        **settings,
    )
    try:
        rollouts = source.start([dataset[i] for i in range(len(dataset))], list(range(len(dataset))))
        source.run_turns(rollouts, step=0)
    finally:
        source.close()
    return rollouts


@dataclass
class GreedyToolRollouts:
    """Evaluation's rollouts in a run with `tools` / `environment_factory`: each eval prompt rolled out greedily
    through the training loop ([`greedy_tool_rollouts`] with a [`GreedyTurnEngine`]), with the run's tools,
    environments (fresh instances each call, `reset` with the row), budget, context, stop tokens and chat template
    arguments, as TRL's `GRPOTrainer` evaluates through its training generation path. Built by the trainer's assembly
    and given to the [`~trl_trapo.evaluation.Evaluator`].

    Attributes:
        spec ([`AgentSpec`]): the tools and environments.
        tokenizer: the policy's tokenizer (parses each turn).
        pad_token_id (`int`): the id in padding positions.
        stop_token_ids (`list[int]`): the ids a turn ends at.
        response_length (`int`): the completion budget per rollout, in tokens (tool results included).
        context (`int`, *optional*): the policy's positions.
        max_iterations (`int`, *optional*): `max_tool_calling_iterations`.
        template_kwargs (`dict`, *optional*): `chat_template_kwargs`.
        images ([`~trl_trapo.vision.ImageRows`], *optional*): a VLM run's row builder (image prompts rendered by the
            processor with their tools, every turn generating with the row's images).
        tool_timeout (`float`, *optional*): `tool_timeout`.
        batch_size (`int`, *optional*): rows per `generate` call (`per_device_eval_batch_size`).
        sum_over_ranks (`Callable`, *optional*): a sum over the ranks (several processes: the ranks' turns in lockstep,
            as in training; None on one).
        synced_gpus (`Callable[[bool, bool], bool | None]`, *optional*): `(gathered, lockstep) -> synced_gpus` of
            `generate` ([`~trl_trapo.distributed.generation_synced_gpus`] bound to the accelerator).
    """

    spec: AgentSpec
    tokenizer: Any
    pad_token_id: int
    stop_token_ids: list[int]
    response_length: int
    context: int | None
    max_iterations: int | None
    template_kwargs: dict | None = None
    images: ImageRows | None = None
    tool_timeout: float | None = None
    batch_size: int | None = None
    sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None
    synced_gpus: Callable[[bool, bool], bool | None] | None = None

    def check_dataset(self, eval_dataset: Any) -> None:
        """[`AgentSpec.check_eval_prompts`]: refuse prompt-only eval sets the loop cannot roll out."""
        self.spec.check_eval_prompts(eval_dataset)

    def __call__(
        self, policy: Any, dataset: Dataset, generation_config: Any, gathered: bool = True, role: str = "eval_dataset"
    ) -> list[Rollout]:
        """Roll out every row of `dataset` greedily (collective on several processes: every rank calls, with or
        without rows).

        Args:
            policy (`nn.Module`): the policy unwrapped for generation, in eval mode.
            dataset (`Dataset`): this rank's conversational `prompt` rows (tokenized ones may carry `prompt_ids` and
                `model_inputs`; the prompts are rendered again with their tools).
            generation_config (`GenerationConfig`): greedy settings.
            gathered (`bool`): whether the policy's ZeRO-3 weights are gathered (for `synced_gpus`).
            role (`str`): the eval set's name, for messages.

        Returns:
            `list[Rollout]`: one per row, in order.

        Raises:
            ValueError: as [`greedy_tool_rollouts`].
        """
        synced = None if self.synced_gpus is None else functools.partial(self.synced_gpus, gathered)
        engine = GreedyTurnEngine(
            policy, generation_config, self.pad_token_id, self.stop_token_ids, self.batch_size, synced
        )
        return greedy_tool_rollouts(
            engine,
            dataset,
            self.spec,
            self.tokenizer,
            response_length=self.response_length,
            context=self.context,
            max_iterations=self.max_iterations,
            template_kwargs=self.template_kwargs,
            stop_token_ids=self.stop_token_ids,
            images=self.images,
            sum_over_ranks=self.sum_over_ranks,
            generation_batch_size=self.batch_size,
            tool_timeout=self.tool_timeout,
            role=role,
        )


__all__ = [
    "CHATML_TOOL_CHAT_TEMPLATE",
    "CHATML_TOOL_RESPONSE_TEMPLATE",
    "SMOLLM2_DEFAULT_SYSTEM",
    "TOOL_CHAT_TEMPLATE",
    "TOOL_RESPONSE_TEMPLATE",
    "AgentSpec",
    "ToolAbandoned",
    "ToolBaseException",
    "GreedyToolRollouts",
    "GreedyTurnEngine",
    "ToolCall",
    "ToolRolloutSource",
    "ToolRunner",
    "ToolTimeout",
    "check_agent_arguments",
    "chatml_tool_chat_template",
    "check_chat_template",
    "greedy_tool_rollouts",
    "placeholder_prompts",
    "tool_suffix_ids",
    "use_chatml_tool_template",
    "use_tool_chat_template",
]
