# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Generated blocks of the results pages: the text between `<!-- NAME:start -->` and `<!-- NAME:end -->` markers.

A script that measures something renders its block from its results file and writes it with `write_block` into the
page that holds it (`PAGES`: block name -> page under `docs/`); `write_block_from_results` is a script's whole
`--write_docs` (read the results file, render, write, say whether the page changed). `tests/test_result_pages.py`
checks with `read_block` that each page still holds exactly what the committed results render to, so a number edited
by hand fails the test.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
RESULTS_PAGES = ROOT / "docs" / "results"
# block name -> the page that holds it
PAGES = {
    "main-job-table": RESULTS_PAGES / "main_job.md",
    "pipeline-table": RESULTS_PAGES / "pipeline.md",
    "seed-grid-table": RESULTS_PAGES / "pipeline.md",
    "ablation-table": RESULTS_PAGES / "pipeline.md",
    "distill-grid-table": RESULTS_PAGES / "distillation.md",
    "distill-real-table": RESULTS_PAGES / "distillation.md",
    "real-model-speed": RESULTS_PAGES / "real_model.md",
    "real-smollm2-table": RESULTS_PAGES / "real_model.md",
    "guidance-real": RESULTS_PAGES / "real_model.md",
    "async-table": RESULTS_PAGES / "async.md",
    "vlm-table": RESULTS_PAGES / "vision.md",
    "feature-matrix": ROOT / "docs" / "feature_matrix.md",
    "weighting-results": ROOT / "docs" / "weighting_benchmark.md",
    "weighting-claim": ROOT / "README.md",
}


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {re.escape(name)}:start -->\n)(.*?)(<!-- {re.escape(name)}:end -->)", re.S)


def page_of(name: str) -> Path:
    """The page that holds the block `name`.

    Raises:
        KeyError: for a block no page holds (add it to `PAGES`).
    """
    if name not in PAGES:
        raise KeyError(f"no results page holds the block {name!r}; add it to PAGES in {__file__}")
    return PAGES[name]


def file_link(path: str, name: str) -> str:
    """A Markdown link to the repository file `path` (relative to the repository root, as shown) from the page that
    holds the block `name`: `[`docs/results/x/results.json`](x/results.json)` from `docs/results/x.md`."""
    target = os.path.relpath(ROOT / path, page_of(name).parent).replace(os.sep, "/")
    return f"[`{path}`]({target})"


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


def write_block(name: str, block: str, page: Path | None = None) -> bool:
    """Replace the `name` block of `page` (default: the results page that holds it, `page_of(name)`) by `block`.

    Returns:
        Whether the file changed.
    """
    page = page_of(name) if page is None else page
    text = page.read_text(encoding="utf-8")
    new = replace_block(text, name, block)
    if new != text:  # atomically: an interrupted write leaves the old page, never half of one
        partial = page.with_name(f".{page.name}.partial")
        partial.write_text(new, encoding="utf-8")
        os.replace(partial, page)
    return new != text


def write_block_from_results(
    name: str, render: Callable[[dict], str], results_path: str | Path, page: str | Path | None = None
) -> dict:
    """A script's `--write_docs`: render the `name` block from its results file, put it into `page` (default the
    results page that holds it, `page_of(name)`) and say whether it changed.

    Returns:
        The results file's contents.

    Raises:
        SystemExit: if there is no results file (run the script first).
    """
    results_path = Path(results_path)
    if not results_path.is_file():
        raise SystemExit(f"No {results_path}: run the comparison first.")
    results = json.loads(results_path.read_text(encoding="utf-8"))
    page = page_of(name) if page is None else Path(page)
    changed = write_block(name, render(results), page)
    shown = page.resolve().relative_to(ROOT) if page.resolve().is_relative_to(ROOT) else page
    print(f"{shown}: the {name} block {'updated' if changed else 'is already up to date'}")
    return results
