# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Tools a policy may call (TRL's `tools=` contract: plain functions with type hints and a Google-style docstring).

[`calculator`] evaluates the arithmetic of GSM8K's worked solutions (its `<<48/2=24>>` annotations use only
`+ - * / ( )`, decimals and, once, `//`) without `eval`: the expression is parsed with `ast` and only number literals,
`+ - * / //`, unary signs, parentheses and bounded integer powers are evaluated, in exact rational arithmetic
(`fractions.Fraction`, so `0.1+0.2` is `0.3`). Anything else raises `ValueError` with a message saying what is
allowed; in the tool-calling loop a raising tool becomes an error result the model reads, counted in
`tools/failure_frequency`.
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction


MAX_EXPRESSION_CHARS = 200  # longer input is refused before parsing
MAX_EXPONENT = 100  # |n| of `x ** n`; 2**99999 would take the process's memory and time
MAX_DIGITS = 40  # digits of any intermediate numerator or denominator
SIGNIFICANT_DIGITS = 10  # of a non-integer result
# a comma between digits that starts a group of three (`1,000`): a thousands separator, not Python's tuple comma
THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
OPERATIONS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
ALLOWED = "numbers, + - * / // ** and parentheses"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / // ** and parentheses.

    Args:
        expression: The arithmetic expression to evaluate, e.g. '48/2 + 3*(4.5-1)'.

    Returns:
        The exact value: an integer as '24', otherwise rounded to 10 significant digits, e.g. '3.333333333'.

    Raises:
        ValueError: naming the problem and what is allowed, for input that is not a string, longer than
            MAX_EXPRESSION_CHARS, not an expression, or holds anything but number literals, the six operators, unary
            +/- and parentheses (names, calls, attributes, strings, comparisons, ...); for a division by zero, an
            exponent that is not an integer or exceeds MAX_EXPONENT in size, or a value with more than MAX_DIGITS
            digits. (transformers' `get_json_schema` leaves this section out of the tool's schema; the description,
            `Args` and `Returns` are what the model reads in its prompt.)
    """
    return format_number(evaluate(expression))


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression (see [`calculator`] for what is allowed).

    Args:
        expression: e.g. `"48/2 + 3*(4.5-1)"`; thousands separators between digits (`1,000`) are allowed.

    Returns:
        `Fraction`: the value.

    Raises:
        ValueError: as [`calculator`] documents.
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}: {expression!r}.")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(
            f"the expression is {len(expression)} characters long; at most {MAX_EXPRESSION_CHARS} are evaluated: "
            "split the computation into several calls."
        )
    text = THOUSANDS_SEPARATOR.sub("", expression.strip())
    if not text:
        raise ValueError(f"the expression is empty: write {ALLOWED}.")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression ({error.msg}): write {ALLOWED}.") from None
    return value_of(tree.body)


def value_of(node: ast.AST) -> Fraction:
    """The exact value of one node of a parsed expression (`ast.parse(..., mode="eval").body`), recursively.

    Raises:
        ValueError: for a node that is not a number, one of `+ - * / // **` or a unary sign, and for the bounds that
            [`calculator`] documents.
    """
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value)
        return bounded(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = value_of(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATIONS:
        left, right = value_of(node.left), value_of(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)) and right == 0:
            raise ValueError("division by zero.")
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1:
                raise ValueError(f"the exponent {format_number(right)} is not an integer.")
            if abs(right) > MAX_EXPONENT:
                raise ValueError(f"the exponent {right} is too large: at most {MAX_EXPONENT} in size.")
            if left == 0 and right < 0:
                raise ValueError("division by zero (0 to a negative power).")
            # refused before computing when the numerator or denominator (>= 2**size) would pass 2 ** (4 * MAX_DIGITS),
            # which is more than MAX_DIGITS digits
            size = max(abs(left.numerator), left.denominator).bit_length() - 1
            if size * abs(right) > 4 * MAX_DIGITS:
                raise ValueError(f"too large: numbers are limited to {MAX_DIGITS} digits.")
        return bounded(OPERATIONS[type(node.op)](left, right))
    raise ValueError(f"{describe(node)} is not allowed: write {ALLOWED}.")


def bounded(value: Fraction) -> Fraction:
    """`value`, if its numerator and denominator have at most MAX_DIGITS digits.

    Raises:
        ValueError: saying the limit, when they have more.
    """
    if len(str(abs(value.numerator))) > MAX_DIGITS or len(str(value.denominator)) > MAX_DIGITS:
        raise ValueError(f"too large: numbers are limited to {MAX_DIGITS} digits.")
    return value


def describe(node: ast.AST) -> str:
    """What a refused node is, in words (`a name 'os'`, `a function call`, `the operator %`)."""
    if isinstance(node, ast.Name):
        return f"a name ({node.id!r})"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.Attribute):
        return "an attribute"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    if isinstance(node, ast.Tuple):
        return "a comma (write numbers without separators, one expression per call)"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        symbol = {ast.BitXor: "^ (use ** for powers)", ast.Mod: "%"}.get(type(node.op))
        return f"the operator {symbol or type(node.op).__name__}"
    return f"an expression of type {type(node).__name__}"


def format_number(value: Fraction) -> str:
    """A value as the calculator writes it: `24`, `-3`, `0.2`, `3.333333333` (SIGNIFICANT_DIGITS digits)."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.{SIGNIFICANT_DIGITS}g}"
    return text if "e" in text else text.rstrip("0").rstrip(".")


__all__ = ["calculator", "evaluate", "format_number"]
