# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""mkdocs hooks of the documentation site (`mkdocs.yml` → `hooks`).

The Markdown files stay readable on GitHub as they are; these hooks make the same files a site:

- **API reference pages** are generated, one per module of `trl_trapo` (`reference/<module>.md`, holding
  `::: <module>`): the modules `mkdocs.yml`'s nav names under "API reference" keep their place, every other module is
  appended there under "Internals", so no module is left out. The docstrings' doc-builder cross-references are
  resolved by `scripts/docs/griffe_xrefs.py`.
- **The `TRAPOConfig` field table** (`<!-- trapo-config-fields -->` in a page) is generated from
  `dataclasses.fields(TRAPOConfig)` at build time: name, type, default and `metadata["help"]` of every field, TRAPO's
  own first, then those inherited from `transformers.TrainingArguments`.
- **The home page** is the repository's README.md: a page holding `<!-- include-readme -->` (`index.md`) is replaced
  by it, its links made relative to `docs/`.
- **Links that leave `docs/`** (`../examples/recipes/x.yaml` in a page, `examples/...` in the README) are checked
  (the file must exist) and the files they name are copied into the site under `repo/`, so the built site works
  offline and links nothing outside itself. A link to a directory gets a generated page listing its files.

A link that names no file, an anchor that names no heading and an unresolved reference are WARNINGs, which
`mkdocs build --strict` turns into a failed build (`tests/test_docs_site.py`).
"""

from __future__ import annotations

import dataclasses
import html
import importlib
import inspect
import logging
import os
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel


logger = logging.getLogger("mkdocs.plugins.trl_trapo.hooks")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "trl_trapo"
REFERENCE_DIR = "reference"
REPO_DIR = "repo"  # where files from outside docs/ land in the site
README_MARKER = "<!-- include-readme -->"
CONFIG_FIELDS_MARKER = "<!-- trapo-config-fields -->"
# an inline Markdown link or image: `[text](target)` / `![alt](target "title")`
LINK = re.compile(r"(?P<prefix>!?\[(?:[^\[\]]|\[[^\]]*\])*\]\()(?P<target><[^>]*>|[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
LINK_OR_CODE = re.compile(r"(?P<code>(`+)[^`]+?\2(?!`))|" + LINK.pattern)
FENCE = re.compile(r"^\s*(```|~~~)")
EXTERNAL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//|^#")


# =====================================================================================================================
# Modules and their reference pages
# =====================================================================================================================
def package_modules() -> list[str]:
    """Every module of the package, dotted (`trl_trapo.memory.replay`), sorted; packages by their `__init__`."""
    modules = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        elif parts[-1].startswith("_"):
            continue
        modules.append(".".join(parts))
    return modules


def reference_uri(module: str) -> str:
    return f"{REFERENCE_DIR}/{module}.md"


def reference_page(module: str) -> str:
    """A module's page; a package's lists what it exports (`__all__`), each linked to where it is defined, instead
    of rendering it a second time."""
    if not (ROOT / module.replace(".", "/") / "__init__.py").is_file():
        return f"::: {module}\n"
    package = importlib.import_module(module)
    if any(  # a package whose code is in its `__init__` (`trl_trapo.tasks`) is rendered as a module
        (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == module
        for value in vars(package).values()
    ):
        return f"::: {module}\n"
    lines = [f"::: {module}", "    options:", "      members: false", "", "Exports:", ""]
    for name in getattr(package, "__all__", []):
        defined_in = getattr(getattr(package, name), "__module__", module)
        lines.append(f"- [`{name}`][{defined_in}.{name}]")
    return "\n".join(lines) + "\n"


def _nav_uris(nav: Any) -> set[str]:
    """Every page path a nav (list of dicts / strings) names."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_uris(item) for item in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(_nav_uris(value) for value in nav.values()))
    return set()


def on_config(config, **kwargs):
    """Append the modules the nav does not name to its "API reference" section, under "Internals"."""
    named = _nav_uris(config["nav"])
    internals = [{f"{m}": reference_uri(m)} for m in package_modules() if reference_uri(m) not in named]
    for item in config["nav"]:
        if isinstance(item, dict) and "API reference" in item:
            item["API reference"].append({"Internals": internals})
            break
    else:
        raise ValueError("mkdocs.yml's nav needs an 'API reference' section for the generated module pages")
    return config


# =====================================================================================================================
# Links that leave docs/
# =====================================================================================================================
def _outside_code(text: str):
    """(is_code, chunk) pieces of a Markdown text: fenced blocks are code, the rest is prose."""
    chunk, in_fence, fence = [], False, ""
    for line in text.splitlines(keepends=True):
        match = FENCE.match(line)
        if match and (not in_fence or match.group(1) == fence):
            if not in_fence:
                yield False, "".join(chunk)
                chunk, in_fence, fence = [line], True, match.group(1)
            else:
                chunk.append(line)
                yield True, "".join(chunk)
                chunk, in_fence = [], False
            continue
        chunk.append(line)
    yield in_fence, "".join(chunk)


def rewrite_links(text: str, rewrite) -> str:
    """`text` with `rewrite(target) -> target` applied to every inline link outside code blocks and code spans."""
    out = []
    for is_code, chunk in _outside_code(text):
        if is_code:
            out.append(chunk)
            continue
        # a code span is matched as a whole (so `[a](b)` inside backticks is left alone); a link's text may hold one
        out.append(
            LINK_OR_CODE.sub(
                lambda m: (
                    m[0] if m["code"] else m["prefix"] + rewrite(m["target"].strip("<>")) + (m["title"] or "") + ")"
                ),
                chunk,
            )
        )
    return "".join(out)


def links(text: str) -> list[str]:
    """The inline link targets of a Markdown text, outside code."""
    found: list[str] = []
    rewrite_links(text, lambda target: found.append(target) or target)
    return found


class RepoFiles:
    """Files and directories outside docs/ that pages link to, copied into the site under `repo/`."""

    def __init__(self, docs_dir: Path):
        self.docs_dir = docs_dir
        self.files: set[str] = set()  # repository-relative paths
        self.directories: set[str] = set()  # repository-relative (outside docs/) or docs-relative (inside)

    def site_target(self, page_uri: str, target: str, *, from_root: bool = False) -> str | None:
        """The link target to use in the site for `target` written in the page `page_uri` (docs-relative), or None
        if it needs no change. `from_root`: the target is relative to the repository root (the README's links).
        Records what must be copied; an existing file is required (else a WARNING)."""
        if EXTERNAL.match(target):
            return None
        path, _, anchor = target.partition("#")
        anchor = f"#{anchor}" if anchor else ""
        base = ROOT if from_root else (self.docs_dir / page_uri).parent
        resolved = Path(os.path.normpath(base / path))
        if not resolved.exists():
            return None  # mkdocs' own validation reports it, with the page and the link
        if resolved == ROOT / "README.md":  # the site's home page
            return posixpath.relpath("index.md", posixpath.dirname(page_uri) or ".") + anchor
        if resolved.is_relative_to(self.docs_dir):
            docs_rel = resolved.relative_to(self.docs_dir).as_posix()
            if docs_rel == ".":
                docs_rel = "index.md"
            elif resolved.is_dir():
                self.directories.add(docs_rel)
                docs_rel = posixpath.join(docs_rel, "index.md")
            elif not from_root:
                return None
            return posixpath.relpath(docs_rel, posixpath.dirname(page_uri) or ".") + anchor
        if not resolved.is_relative_to(ROOT):
            logger.warning("%s links to %s, outside the repository", page_uri, target)
            return None
        repo_rel = resolved.relative_to(ROOT).as_posix()
        if resolved.is_dir():
            self.directories.add(f"{REPO_DIR}/{repo_rel}")
            repo_rel = posixpath.join(repo_rel, "index.md")
        else:
            self.files.add(repo_rel)
        return posixpath.relpath(f"{REPO_DIR}/{repo_rel}", posixpath.dirname(page_uri) or ".") + anchor


def readme_for_site() -> str:
    """README.md with its links made relative to docs/index.md (`docs/x.md` → `x.md`, others → `repo/...`)."""
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _directory_listing(uri: str, directory: Path) -> str:
    entries = sorted(directory.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    lines = [f"# `{uri}`", "", "Files of this folder:", ""]
    for entry in entries:
        name = entry.name + ("/" if entry.is_dir() else "")
        target = f"{entry.name}/index.md" if entry.is_dir() else entry.name
        lines.append(f"- [`{name}`]({target})")
    return "\n".join(lines) + "\n"


_repo_files: RepoFiles | None = None


def on_files(files: Files, config, **kwargs) -> Files:
    """Add the generated reference pages, the files outside docs/ that pages link to, and directory listings."""
    global _repo_files
    for module in package_modules():
        files.append(File.generated(config, reference_uri(module), content=reference_page(module)))

    docs_dir = Path(config["docs_dir"]).resolve()
    repo = _repo_files = RepoFiles(docs_dir)
    # the README's links (it is the home page) and every page's, repeated for Markdown files copied from outside
    pending = [("index.md", readme_for_site(), True)]
    pending += [
        (f.src_uri, Path(f.abs_src_path).read_text(encoding="utf-8"), False)
        for f in files.documentation_pages()
        if f.abs_src_path
    ]
    seen_md: set[str] = set()
    while pending:
        uri, text, from_root = pending.pop()
        for target in links(text):
            repo.site_target(uri, target, from_root=from_root)
        for repo_rel in sorted(repo.files - seen_md):
            if repo_rel.endswith(".md"):
                seen_md.add(repo_rel)
                pending.append((f"{REPO_DIR}/{repo_rel}", (ROOT / repo_rel).read_text(encoding="utf-8"), False))
    for repo_rel in sorted(repo.files):
        files.append(File.generated(config, f"{REPO_DIR}/{repo_rel}", abs_src_path=str(ROOT / repo_rel)))
    # a listing page for each linked directory and the directories under it
    listed = set()
    for uri in sorted(repo.directories):
        top = ROOT / uri.removeprefix(f"{REPO_DIR}/") if uri.startswith(f"{REPO_DIR}/") else docs_dir / uri
        for directory in [top, *sorted(p for p in top.rglob("*") if p.is_dir())]:
            sub = posixpath.join(uri, directory.relative_to(top).as_posix()).removesuffix("/.")
            if sub in listed:
                continue
            listed.add(sub)
            listing = posixpath.join(sub, "index.md")
            if files.get_file_from_path(listing) is None:
                page = _directory_listing(sub, directory)
                files.append(File.generated(config, listing, content=page, inclusion=InclusionLevel.NOT_IN_NAV))
            if sub.startswith(f"{REPO_DIR}/"):
                for entry in directory.iterdir():
                    rel = f"{sub}/{entry.name}"
                    if entry.is_file() and files.get_file_from_path(rel) is None:
                        files.append(File.generated(config, rel, abs_src_path=str(entry)))
    for f in files:
        if f.src_uri.startswith(f"{REPO_DIR}/") and f.is_documentation_page():
            f.inclusion = InclusionLevel.NOT_IN_NAV
    return files


# =====================================================================================================================
# Page Markdown: the home page, the config table, links that leave docs/
# =====================================================================================================================
def html_code(text: str) -> str:
    """Inline code for a table cell: HTML, because a `|` inside a Markdown code span would end the cell (and `\\|`
    would show its backslash)."""
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"


def table_cell(text: str) -> str:
    """Text for a Markdown table cell: one line, argparse's `%%` shown as `%`, code spans as HTML, other pipes
    escaped."""
    text = " ".join(str(text).replace("%%", "%").split())
    pieces = re.split(r"(`[^`]+`)", text)
    return "".join(html_code(p[1:-1]) if i % 2 else p.replace("|", "\\|") for i, p in enumerate(pieces))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    return html_code(repr(value))


def config_fields_table() -> str:
    """The table of every `TRAPOConfig` field, from `dataclasses.fields` (see the module docstring)."""
    from transformers import TrainingArguments

    from trl_trapo import TRAPOConfig

    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {name for name in vars(TRAPOConfig).get("__annotations__", {})}
    rows = {True: [], False: []}
    for f in dataclasses.fields(TRAPOConfig):
        if f.name.startswith("_"):
            continue
        help_text = f.metadata.get("help", "")
        row = f"| `{f.name}` | {html_code(str(f.type))} | {_default(f)} | {table_cell(help_text)} |"
        rows[f.name in own or f.name not in inherited].append(row)
    header = "| field | type | default | description |\n|---|---|---|---|\n"
    return (
        f"## TRAPO's fields ({len(rows[True])})\n\n"
        "Defined or given another default by `TRAPOConfig` (or TRL's config base it extends).\n\n"
        + header
        + "\n".join(rows[True])
        + f"\n\n## Inherited from `transformers.TrainingArguments` ({len(rows[False])})\n\n"
        "With the defaults `TRAPOConfig` gives them.\n\n" + header + "\n".join(rows[False]) + "\n"
    )


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    uri = page.file.src_uri
    from_root = False
    if README_MARKER in markdown:  # the whole page is the README (the rest is for readers of docs/ on GitHub)
        markdown = readme_for_site()
        from_root = True
    if CONFIG_FIELDS_MARKER in markdown:
        markdown = markdown.replace(CONFIG_FIELDS_MARKER, config_fields_table())
    if _repo_files is not None:

        def rewrite(target: str) -> str:
            new = _repo_files.site_target(uri, target, from_root=from_root)
            return target if new is None else new

        markdown = rewrite_links(markdown, rewrite)
    return markdown
