# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A Griffe extension that turns the docstrings' doc-builder cross-references into mkdocs-autorefs links.

The package's docstrings use the style of Hugging Face's doc builder:

- `` [`~trl_trapo.rollout.RolloutEngine`] ``: a full path, shown as its last part (`RolloutEngine`);
- `` [`trl_trapo.rollout.RolloutEngine`] ``: a full path, shown in full;
- `` [`RolloutEngine`] `` or `` [`RolloutEngine.finish`] ``: a name looked up from the docstring's own object outwards
  (its members, then its class's and module's names, imports included), as Python would read it there.

mkdocstrings does not read that style, so before a docstring is rendered each reference is rewritten:

- to an autorefs link `` [`RolloutEngine`][trl_trapo.rollout.RolloutEngine] `` (the canonical path: a name that
  `trl_trapo/__init__.py` re-exports points to where it is defined) when the target is public, so the API page that
  renders it is linked and `mkdocs build --strict` fails if no page renders it;
- to plain code (`` `_split_inputs` ``) when the target exists but is private (no API page renders it), or lives in
  another package (`transformers`, `torch`): checked by importing it;
- and an unknown target (a typo, a renamed or deleted object) is logged as a WARNING naming the object whose
  docstring holds it, which fails a strict build. It is left as written.

Used by `mkdocs.yml` (`mkdocstrings` → `python` → `options.extensions`).
"""

from __future__ import annotations

import importlib
import logging
import re
from typing import Any

import griffe


# a logger under "mkdocs.": its WARNINGs count in `mkdocs build --strict`
logger = logging.getLogger("mkdocs.plugins.trl_trapo.xrefs")

PACKAGE = "trl_trapo"
# `[`~a.b`]`, `[`a.b`]`, `[`a.b()`]`; not an existing Markdown link `[`a`](url)` or autorefs link `[`a`][id]`
REFERENCE = re.compile(r"\[`(?P<tilde>~)?(?P<path>[A-Za-z_][A-Za-z0-9_.]*)(?P<call>\(\))?`\](?![(\[])")
# where the docstrings' text is: a code block or an inline code span holding brackets is left alone
FENCE = re.compile(r"^\s*```")


def external_exists(path: str) -> bool:
    """Whether `path` (`package.module.Object.attr`) names an importable object outside this package."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for name in parts[split:]:
                target = getattr(target, name)
        except AttributeError:
            return False
        return True
    return False


def is_private(path: str) -> bool:
    """Whether some part of a dotted path starts with an underscore (`__init__`-style names excepted)."""
    return any(part.startswith("_") and not part.endswith("__") for part in path.split("."))


SECTION = re.compile(r"^(?P<indent>\s*)(Args|Arguments|Parameters|Keyword Args|Other Parameters):\s*$")
GROUPED = re.compile(r"^(?P<indent>\s+)(?P<names>\*{0,2}\w+(?:, \*{0,2}\w+)+)(?P<type> \([^)]*\))?:(?P<rest>.*)$")


def split_grouped_parameters(text: str) -> str:
    """`text` with each grouped parameter entry of an `Args:` section (`a, b (`int`): ...`, a style the docstrings
    use) split into one entry per name, as Google-style parsers read them: the first keeps the description, the
    others point to it."""
    out, section_indent = [], None
    for line in text.splitlines(keepends=True):
        header = SECTION.match(line)
        if header:
            section_indent = len(header["indent"])
        elif line.strip() and section_indent is not None and len(line) - len(line.lstrip()) <= section_indent:
            section_indent = None
        grouped = GROUPED.match(line.rstrip("\n")) if section_indent is not None else None
        if grouped and len(grouped["indent"]) > section_indent:
            first, *others = grouped["names"].split(", ")
            kind = grouped["type"] or ""
            out.append(f"{grouped['indent']}{first}{kind}:{grouped['rest']}\n")
            out += [f"{grouped['indent']}{name}{kind}: as `{first}`.\n" for name in others]
            continue
        out.append(line)
    return "".join(out)


class DocBuilderXrefs(griffe.Extension):
    """Rewrites doc-builder references in every docstring of the package once it is loaded (see the module)."""

    package = PACKAGE  # the package whose docstrings are rewritten and whose objects are linked

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != self.package:
            return
        for obj in self._objects(pkg):
            if obj.docstring is not None:
                text = split_grouped_parameters(obj.docstring.value)
                obj.docstring.value = self.rewrite(obj, text) if "[`" in text else text

    def _objects(self, obj: griffe.Object):
        """`obj` and every object defined under it (aliases, i.e. imported names, are not walked)."""
        yield obj
        for member in obj.members.values():
            if not member.is_alias:
                yield from self._objects(member)

    def rewrite(self, obj: griffe.Object, text: str) -> str:
        """`text` (the docstring of `obj`) with every reference outside code blocks rewritten."""
        out, in_fence = [], False
        for line in text.splitlines(keepends=True):
            if FENCE.match(line):
                in_fence = not in_fence
            out.append(line if in_fence else REFERENCE.sub(lambda m: self.replace(obj, m), line))
        return "".join(out)

    def replace(self, obj: griffe.Object, match: re.Match) -> str:
        path, call = match["path"], match["call"] or ""
        title = (path.rsplit(".", 1)[-1] if match["tilde"] else path) + call
        target = self.resolve(obj, path)
        if target is None:
            logger.warning(
                "%s: the docstring's reference [`%s%s`] names nothing: no object %r in %s or in scope, and no "
                "importable one; fix the name (doc-builder style: [`~trl_trapo.module.Name`] or a name in scope)",
                obj.path,
                match["tilde"] or "",
                path + call,
                path,
                self.package,
            )
            return match[0]
        if target.startswith(self.package + ".") and not is_private(target):
            return f"[`{title}`][{self.anchor(obj.package, target)}]"
        return f"`{title}`"

    def anchor(self, package: griffe.Object, path: str) -> str:
        """The identifier to link for `path`: the object itself when the API pages render it (it has a docstring),
        else its nearest rendered parent (a dataclass field documented in its class's `Args:`, a module constant)."""
        obj = self.lookup(package, path.partition(".")[2])
        while obj is not None and not obj.is_module and not obj.docstring:
            obj = obj.parent
        return path if obj is None else obj.path

    def resolve(self, obj: griffe.Object, path: str) -> str | None:
        """The canonical path of what `path` names in `obj`'s docstring, or None if it names nothing."""
        head, _, rest = path.partition(".")
        if head == self.package:
            found = self.lookup(obj.package, rest) if rest else obj.package
        else:
            # a name in scope: the object's own members, then outwards (griffe follows imports to their paths)
            scope = obj if obj.is_class or obj.is_module else obj.parent
            try:
                start = scope.resolve(head)
            except (griffe.NameResolutionError, AttributeError):
                start = None
            if start is None:
                return path if external_exists(path) else None
            if not start.startswith(self.package + ".") and start != self.package:
                full = f"{start}.{rest}" if rest else start
                return full if external_exists(full) else None
            found = self.lookup(obj.package, start.partition(".")[2]) if "." in start else obj.package
            if found is not None and rest:
                found = self.lookup(found, rest)
        if found is None:
            return path if head != self.package and external_exists(path) else None
        try:
            return found.final_target.path if found.is_alias else found.path
        except griffe.AliasResolutionError:
            target = found.target_path
            return target if external_exists(target) else None

    @staticmethod
    def lookup(obj: griffe.Object, dotted: str) -> griffe.Object | None:
        """The member `dotted` (`a.b.c`) of `obj`, through aliases; None if a part is missing."""
        try:
            for name in dotted.split("."):
                if obj.is_alias:
                    obj = obj.final_target
                obj = obj.members[name]
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
        return obj
