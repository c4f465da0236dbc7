# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The documentation site (`mkdocs.yml`, `scripts/docs/`): its hooks and Griffe extension, and the strict build.

- The docstrings' doc-builder references (`` [`~trl_trapo.x.Y`] ``, `` [`Y`] ``) all name an object, and the
  extension turns them into autorefs links (public), plain code (private, other packages) or a WARNING (unknown).
- The `TRAPOConfig` field table is every field of `dataclasses.fields(TRAPOConfig)`, with its type, default and help.
- `mkdocs build --strict` succeeds (marked `ci`: ~30-45 s on 2 cores), offline, with every module's reference page;
  a broken link, anchor or reference fails it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "docs"))

griffe = pytest.importorskip("griffe", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")

import griffe_xrefs  # noqa: E402
import hooks  # noqa: E402


XREF_LOGGER = "mkdocs.plugins.trl_trapo.xrefs"


def load(package: str, path: Path, caplog) -> griffe.Module:
    extension = griffe_xrefs.DocBuilderXrefs()
    extension.package = package
    with caplog.at_level(logging.WARNING, logger=XREF_LOGGER):
        return griffe.load(
            package, search_paths=[str(path)], extensions=griffe.load_extensions(extension), resolve_aliases=False
        )


def test_every_docstring_reference_of_the_package_names_an_object(caplog):
    pkg = load("trl_trapo", ROOT, caplog)
    unknown = [r.getMessage() for r in caplog.records if r.name == XREF_LOGGER]
    assert not unknown, "docstring references that name nothing:\n" + "\n".join(unknown)
    # they were rewritten: the trainer's config reference is an autorefs link now
    assert "[`TRAPOConfig`][trl_trapo.config.TRAPOConfig]" in pkg["trainer.TRAPOTrainer"].docstring.value


def test_references_become_links_code_or_a_warning(tmp_path, caplog):
    """A made-up package: each kind of reference, and an unknown one, which is a WARNING naming where it is."""
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text('"""Fake."""\nfrom .mod import Good\n')
    (tmp_path / "fakepkg" / "mod.py").write_text(
        textwrap.dedent(
            '''
            """A module."""


            class Good:
                """A class."""

                attr: int = 1

                def method(self):
                    """Calls [`helper`] and [`other`]."""


            def helper():
                """Helps."""


            def _private():
                """Private."""


            def f(x):
                """Uses [`~fakepkg.mod.Good`], [`fakepkg.Good`], [`Good.method`], [`Good.attr`], [`_private`],
                [`~transformers.TrainingArguments`], [`Missing`] and [`~fakepkg.mod.Gone`].

                Args:
                    x, y (`int`): two numbers.
                """
            '''
        )
    )
    pkg = load("fakepkg", tmp_path, caplog)
    text = pkg["mod.f"].docstring.value
    assert "[`Good`][fakepkg.mod.Good]" in text  # `~`: the last part shown, the canonical path linked
    assert "[`fakepkg.Good`][fakepkg.mod.Good]" in text  # a re-export links to where it is defined
    assert "[`Good.method`][fakepkg.mod.Good.method]" in text  # a name in scope
    assert "[`Good.attr`][fakepkg.mod.Good]" in text  # no docstring of its own: its class is what is rendered
    assert "`_private`" in text and "][fakepkg.mod._private]" not in text  # private: no page renders it
    assert "`TrainingArguments`" in text and "[transformers" not in text  # another package: checked by import
    assert "[`Missing`]" in text and "[`~fakepkg.mod.Gone`]" in text  # unknown: left as written...
    warnings = [r.getMessage() for r in caplog.records if r.name == XREF_LOGGER]
    assert len(warnings) == 3, warnings  # ... and a WARNING each (`other` in Good.method, `Missing`, `Gone`)
    assert any("fakepkg.mod.f" in w and "Missing" in w for w in warnings)
    assert any("fakepkg.mod.Good.method" in w and "other" in w for w in warnings)
    # the grouped parameter entry is split into one per name, as Google-style parsers read them
    assert "x (`int`): two numbers." in text and "y (`int`): as `x`." in text


def test_the_config_table_has_every_field_with_its_type_default_and_help():
    from trl_trapo import TRAPOConfig

    table = hooks.config_fields_table()
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `")}
    fields = [f for f in dataclasses.fields(TRAPOConfig) if not f.name.startswith("_")]
    assert set(rows) == {f.name for f in fields}
    for f in fields:
        name, kind, default, help_text = (cell.strip() for cell in rows[f.name].split(" | "))
        assert help_text.removesuffix(" |") == hooks.table_cell(f.metadata.get("help", "")), f.name
        assert kind == hooks.html_code(str(f.type)), f.name
        if f.default is not dataclasses.MISSING:
            assert default == hooks.html_code(repr(f.default)), f.name
    assert rows["learning_rate"].split(" | ")[2] == "<code>5e-05</code>"  # TRAPO's default, not TrainingArguments'
    assert hooks.table_cell("a `x | None` b | c") == "a <code>x &#124; None</code> b \\| c"


def test_links_outside_docs_are_copied_into_the_site(tmp_path):
    repo = hooks.RepoFiles(ROOT / "docs")
    assert repo.site_target("agents.md", "writing_a_rollout_source.md") is None  # inside docs/: mkdocs' own
    assert repo.site_target("migrating_from_ppo.md", "../examples/ppo_trl112_style.py") == (
        "repo/examples/ppo_trl112_style.py"
    )
    assert repo.site_target("results/pipeline.md", "../../README.md#quickstart") == "../index.md#quickstart"
    assert repo.site_target("index.md", "docs/results/vlm/", from_root=True) == "results/vlm/index.md"
    assert repo.files == {"examples/ppo_trl112_style.py"} and repo.directories == {"results/vlm"}
    assert hooks.links("a [`x`](y.md) `[not](a link)` ![i](p.png)\n```\n[no](z.md)\n```\n") == ["y.md", "p.png"]


@pytest.mark.ci
def test_the_site_builds_strictly_and_offline(tmp_path):
    """`mkdocs build --strict` as the README says: it succeeds, renders every module and the field table, and loads
    nothing from outside the site."""
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env["NO_MKDOCS_2_WARNING"] = "1"
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-6000:]
    for module in hooks.package_modules():
        assert (site / "reference" / module / "index.html").is_file(), module
    fields = (site / "reference" / "config_fields" / "index.html").read_text(encoding="utf-8")
    assert "response_length" in fields and "dare_probe_vocab" in fields
    trainer = (site / "reference" / "trl_trapo.trainer" / "index.html").read_text(encoding="utf-8")
    assert 'href="../trl_trapo.config/#trl_trapo.config.TRAPOConfig"' in trainer  # a docstring reference, linked
    assert "Quickstart" in (site / "index.html").read_text(encoding="utf-8")  # the README is the home page
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        assert 'src="http' not in html and "fonts.googleapis" not in html, page  # nothing fetched when viewed
