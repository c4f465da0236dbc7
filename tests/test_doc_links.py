# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Every relative link of the README and the docs resolves, as GitHub resolves it, and the README's headline results
are what the linked pages say.

A link `[text](target)` (or an image) outside code, in `README.md`, `docs/**/*.md` or `examples/**/*.md`, whose target
is not a URL: its path (relative to the document) must exist, and its `#anchor` must be a heading of the target
Markdown file (GitHub's anchors: lower case, punctuation dropped, spaces to `-`, `-1`, `-2` for repeats). The site
build checks the same links with the same anchors (`mkdocs.yml` uses GitHub's slugs); this test needs no mkdocs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/**/*.md", "examples/**/*.md")
FENCE = re.compile(r"^\s*(```|~~~)")
# a code span, or an inline link / image whose text may hold code spans and one level of brackets
LINK_OR_CODE = re.compile(
    r"(?P<code>(`+)[^`]+?\2(?!`))|!?\[(?:[^\[\]]|\[[^\]]*\])*\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)"
)
EXTERNAL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")


def documents() -> list[Path]:
    return sorted({p for pattern in DOCUMENTS for p in ROOT.glob(pattern) if ".venv" not in p.parts})


def prose(text: str) -> str:
    """`text` without its fenced code blocks (each line kept, blanked, so line numbers stay)."""
    out, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match and (fence is None or match.group(1) == fence):
            fence = match.group(1) if fence is None else None
            out.append("")
            continue
        out.append("" if fence else line)
    return "\n".join(out)


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every inline link outside code."""
    found = []
    for number, line in enumerate(prose(text).splitlines(), 1):
        found += [(number, m["target"].strip("<>")) for m in LINK_OR_CODE.finditer(line) if m["target"]]
    return found


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file: its headings' (repeats numbered) and explicit `<a id/name>`s."""
    text = path.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    found = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    for line in prose(text).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(document: Path) -> list[str]:
    problems = []
    for line, target in links(document.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        where = f"{document.relative_to(ROOT)}:{line}: {target!r}"
        if not resolved.exists():
            problems.append(
                f"{where}: no file {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}"
            )
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading with the anchor #{anchor} in {resolved.relative_to(ROOT)}")
    return problems


def test_every_relative_link_resolves():
    problems = [problem for document in documents() for problem in broken_links(document)]
    assert not problems, "broken links (fix the path or the anchor):\n" + "\n".join(problems)


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words — here\n\n## Two words — here\n")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md#title) [ok](a.md#two-words--here-1) [`code` ok](a.md) `[in code](nope.md)`\n"
        "[no file](missing.md) [no anchor](a.md#nope) [web](https://example.com/x.md)\n"
        "```\n[in a block](nope.md)\n```\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        problems = broken_links(doc)
    finally:
        ROOT = saved
    assert len(problems) == 2, problems
    assert "missing.md" in problems[0] and "#nope" in problems[1]


def test_the_guides_a_new_user_looks_for_are_linked_from_the_readme():
    readme_targets = {target.partition("#")[0] for _, target in links((ROOT / "README.md").read_text())}
    for guide in ("agents.md", "distillation.md", "vision.md", "async.md", "writing_a_rollout_source.md"):
        assert f"docs/{guide}" in readme_targets, guide


@pytest.mark.parametrize("row", [r for r in (ROOT / "README.md").read_text().split("## Results")[1].splitlines()
                                 if r.startswith("| ") and "](docs/" in r])  # fmt: skip
def test_the_readme_headline_results_are_the_linked_pages_numbers(row):
    """The README quotes its results table from the results pages, whose tables are rendered from committed results
    files: every number of the TRAPO and comparison columns is in the page the row links."""
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    page = ROOT / re.search(r"\]\((docs/[^)#]+)", cells[-1]).group(1)
    text = page.read_text(encoding="utf-8")
    numbers = [n for cell in cells[1:3] for n in re.findall(r"\d[\d.,]*(?: ± \d[\d.,]*)?(?:[–-]\d[\d.,]*)?×?", cell)]
    assert numbers, row
    for number in numbers:
        assert number in text, f"README.md says {number!r} ({row}), which {page.relative_to(ROOT)} does not"
