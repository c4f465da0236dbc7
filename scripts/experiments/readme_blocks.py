# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Generated blocks of the README: the text between `<!-- NAME:start -->` and `<!-- NAME:end -->` markers.

A script that measures something renders its README block from its results file and writes it with
`replace_block`; `tests/test_readme_results.py` checks with `read_block` that the README still holds exactly what the
committed results render to, so a number edited by hand fails the test.
"""

from __future__ import annotations

import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {re.escape(name)}:start -->\n)(.*?)(<!-- {re.escape(name)}:end -->)", re.S)


def read_block(text: str, name: str) -> str:
    """The text between the `name` markers of `text` (the marker lines excluded).

    Raises:
        ValueError: if `text` does not hold exactly one `<!-- name:start -->` ... `<!-- name:end -->` pair.
    """
    matches = _pattern(name).findall(text)
    if len(matches) != 1:
        raise ValueError(
            f"expected one `<!-- {name}:start -->` ... `<!-- {name}:end -->` pair, found {len(matches)}; "
            "put the markers on lines of their own around the generated block."
        )
    return matches[0][1]


def replace_block(text: str, name: str, block: str) -> str:
    """`text` with the block between the `name` markers replaced by `block` (a newline is added if it lacks one).

    Raises:
        ValueError: as `read_block`.
    """
    read_block(text, name)  # exactly one pair
    block = block if block.endswith("\n") else block + "\n"
    return _pattern(name).sub(lambda m: m.group(1) + block + m.group(3), text)


def write_readme_block(name: str, block: str, readme: Path = README) -> bool:
    """Replace the `name` block of `readme` (default: the repository's README.md) by `block`.

    Returns:
        Whether the file changed.
    """
    text = readme.read_text(encoding="utf-8")
    new = replace_block(text, name, block)
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text
