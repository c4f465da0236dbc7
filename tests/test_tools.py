# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`trl_trapo.tools.calculator`: GSM8K's arithmetic evaluated exactly, everything else refused with a ValueError that
says what is allowed (in the tool loop a raising tool is an error result, counted), and a schema a model can read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from transformers.utils import get_json_schema

from trl_trapo.tools import MAX_DIGITS, MAX_EXPONENT, calculator


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "expression, value",
    [
        ("48/2", "24"),  # an integer result has no decimal point
        ("48+24", "72"),
        ("12/60", "0.2"),
        ("0.1+0.2", "0.3"),  # exact: floats would give 0.30000000000000004
        ("10/3", "3.333333333"),  # 10 significant digits
        ("-(3-5)*2", "4"),
        ("2*(3+4)-1", "13"),
        (" 3.50 * 2 ", "7"),
        ("1,000*3", "3000"),  # a thousands separator
        ("7//2", "3"),  # floor division (one GSM8K annotation uses it)
        ("2**10", "1024"),
        ("2**-2", "0.25"),
        (f"2**{MAX_EXPONENT}", str(2**MAX_EXPONENT)),  # the largest exponent allowed
        ("1e3", "1000"),
    ],
)
def test_arithmetic_is_exact(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    "expression, message",
    [
        ("__import__('os')", "a function call is not allowed"),
        ("__import__('os').system('true')", "not allowed"),
        ("().__class__", "an attribute is not allowed"),
        ("x+1", re.escape("a name ('x') is not allowed")),
        ("abs(-1)", "a function call is not allowed"),
        ("'a'*3", "the constant 'a' is not allowed"),
        ("True+1", "the constant True is not allowed"),
        ("1,2", "a comma"),
        ("2^3", "use \\*\\* for powers"),
        ("5%2", "the operator % is not allowed"),
        ("[1][0]", "not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("2**99999", f"the exponent 99999 is too large: at most {MAX_EXPONENT}"),
        ("(2**100)**2", f"limited to {MAX_DIGITS} digits"),
        ("9" * (MAX_DIGITS + 1), f"limited to {MAX_DIGITS} digits"),
        ("2**0.5", "is not an integer"),
        ("1/0", "division by zero"),
        ("1//0", "division by zero"),
        ("1/(2-2)", "division by zero"),
        ("0**-1", "division by zero"),
        ("", "the expression is empty"),
        ("48 /", "not an arithmetic expression"),
        ("1" * 201, "at most 200 are evaluated"),
    ],
)
def test_everything_else_is_refused_with_a_message_saying_what_is_allowed(expression, message):
    with pytest.raises(ValueError, match=message):
        calculator(expression)


def test_a_non_string_is_refused():
    with pytest.raises(ValueError, match="expression must be a string, got int"):
        calculator(12)


def test_the_schema_is_what_the_model_reads():
    schema = get_json_schema(calculator)["function"]
    assert schema["name"] == "calculator"
    assert schema["parameters"]["required"] == ["expression"]
    assert schema["parameters"]["properties"]["expression"]["type"] == "string"
    assert "+ - * / // ** and parentheses" in schema["description"]
    assert "Raises" not in json.dumps(schema)  # transformers leaves that section out


def test_every_gsm8k_annotation_evaluates_to_its_recorded_result():
    """The calculator covers GSM8K's own calculator annotations (`<<48/2=24>>`) of the bundled training rows."""
    rows = [json.loads(line) for line in (ROOT / "examples/data/gsm8k/train_first1500.jsonl").read_text().splitlines()]
    annotations = [a for row in rows for a in re.findall(r"<<([^<>=]*)=([^<>]*)>>", row["answer"])]
    assert len(annotations) > 4000
    wrong = [(e, r) for e, r in annotations if abs(float(calculator(e)) - float(r)) > 0.01 * max(1.0, abs(float(r)))]
    assert wrong == [], wrong[:10]  # within GSM8K's own rounding of its recorded results
