# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Tool schemas as TRL's rows and chat templates take them: a list of JSON schemas (`{"type": "function",
"function": {"name": ..., "parameters": ...}}`, as transformers' `get_json_schema` writes them), or a JSON string of
one (TRL's SFT reads a row's `tools` cell either way). The check here serves a dataset's `tools` cells
(`trl_trapo.data`, `trl_trapo.agents`) and `TRAPOConfig.chat_template_kwargs["tools"]` (`trl_trapo.config`), which
TRAPO reads as every row's schemas.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def schema_name(schema: Any) -> str | None:
    """A tool schema's name: `{"type": "function", "function": {"name": ...}}` or `{"name": ...}`."""
    if not isinstance(schema, dict):
        return None
    function = schema.get("function") if isinstance(schema.get("function"), dict) else schema
    name = function.get("name")
    return name if isinstance(name, str) else None


def row_tool_names(tools_cell: Any, bad: Callable[[str, str, str], ValueError]) -> list[str] | None:
    """Check one row's `tools` cell (None, a list of JSON schemas, or a JSON string of one, as TRL's SFT reads it) and
    return its tool names (None: the row lists no tools).

    Args:
        tools_cell: the cell.
        bad: `bad(field, problem, fix)` -> the error naming the dataset and the row.

    Raises:
        ValueError: from `bad`: a string that does not parse as JSON, a cell that is not a list, an entry that is not
            a schema with a string `name` (e.g. a tool's name alone).
    """
    if isinstance(tools_cell, str) and tools_cell.strip():
        try:
            tools_cell = json.loads(tools_cell)
        except json.JSONDecodeError as error:
            raise bad(
                "`tools`",
                f"the JSON string does not parse ({error}): {tools_cell[:80]!r}",
                "Write the tool schemas as a JSON list (json.dumps of a list of schemas), or as the list itself.",
            ) from error
    elif isinstance(tools_cell, str):
        return None
    if not tools_cell:
        return None
    if not isinstance(tools_cell, list):
        raise bad(
            "`tools`",
            f"a {type(tools_cell).__name__} where a list of tool schemas belongs",
            'Give a list of JSON schemas ({"type": "function", "function": {"name": ..., "parameters": ...}}, '
            "as transformers' get_json_schema writes them), or None.",
        )
    names = [schema_name(schema) for schema in tools_cell]
    for index, (schema, name) in enumerate(zip(tools_cell, names)):
        if not isinstance(schema, dict):
            raise bad(
                f"`tools`[{index}]",
                f"the {type(schema).__name__} {str(schema)[:80]!r}, not a JSON schema",
                "Give each tool's schema (`transformers.utils.get_json_schema(function)` writes one), or pass the "
                "functions themselves as the trainer's `tools=`.",
            )
        if name is None:
            raise bad(
                f"`tools`[{index}]",
                "a tool schema without a string `name`",
                "Give each schema a name (transformers' get_json_schema(function) writes one).",
            )
    return names
