# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The pairwise feature matrix (`scripts/experiments/feature_matrix.py`, docs/feature_matrix.md; issue 40).

- Default suite: the script's plumbing through its command line — a cell that works (with what showed its feature
  running), a refusal by design, a hang (a 1-second limit), a worker that dies without a result, the page rendered
  between its markers and the results merged by cell; which cells `--only` / `--cells` select and what they refuse;
  what counts as a refusal (TRAPO's own `ValueError`) and what as a crash; and the committed page is what the
  committed results render to.
- `pytest -m slow` (9 min on 2 quiet cores, 25 on busy ones): every single-process cell, run. Each works or is
  refused (by design, or to fix: issue 40's list), except the crashes, hangs and inactive cells of today, listed by
  name in `KNOWN_FAILURES`: a new one fails, and so does a listed one that no longer happens (remove it from the
  list, re-run the script with `--render docs/feature_matrix.md`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))

import feature_matrix as fm  # noqa: E402
from result_blocks import page_of, read_block  # noqa: E402


# cell -> outcome, for every cell that today neither works nor is refused (crash, hang, inactive); empty: none
KNOWN_FAILURES: dict[str, str] = {}


def page_with_markers(tmp_path: Path) -> Path:
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n<!-- feature-matrix:start -->\nold\n<!-- feature-matrix:end -->\n\nAfter.\n")
    return page


def cells_of(path: Path) -> dict[str, dict]:
    return {fm.cell_name(tuple(c["features"])): c for c in json.loads(path.read_text())["cells"]}


def test_a_cell_a_refusal_and_a_hang_through_the_command_line(tmp_path):
    """One cheap cell that works (the teacher: `loss/distill` logged), a refusal issue 40 lets stay (tools with a
    rollout_func, refused at construction), each in its own process; the page's block rendered between its markers;
    then a cell past a 1-second limit is a hang, merged into the same file beside the others."""
    results, page = tmp_path / "results.json", page_with_markers(tmp_path)
    common = ["--output_json", str(results), "--work_dir", str(tmp_path / "runs")]
    fm.main(["--cells", "teacher,rollout_func+tools", "--jobs", "2", *common, "--render", str(page)])
    cells = cells_of(results)
    assert list(cells) == ["teacher", "tools+rollout_func"]  # page order, whatever order they were asked in
    teacher, both = cells["teacher"], cells["tools+rollout_func"]
    assert teacher["status"] == fm.WORKS and teacher["evidence"]["teacher"].startswith("loss/distill=")
    assert teacher["processes"] == 1 and teacher["commit"] and not teacher["vllm_stand_in"]
    assert both["status"] == fm.BY_DESIGN_REFUSED and "rollout_func was given too" in both["reason"]
    assert both["where"].startswith("trl_trapo/")
    assert (tmp_path / "runs" / "teacher" / "log.txt").exists()
    machine = json.loads(results.read_text())["machine"]
    assert machine["cpu_model"] and machine["torch"] and machine["trl"] and machine["git_commit"]

    text = page.read_text()
    assert text.startswith("# A page\n") and text.endswith("\nAfter.\n") and "\nold\n" not in text
    block = read_block(text, fm.BLOCK)
    assert block == fm.render_block(json.loads(results.read_text()))
    assert "| **teacher** | ✓ |" in block  # the diagonal cell
    assert "rollout_func was given too" in block and "**1** works" in block and "**1** refused (by design)" in block

    fm.main(["--cells", "lora", "--timeout", "1", *common])
    cells = cells_of(results)
    assert list(cells) == ["teacher", "tools+rollout_func", "lora"]  # merged: the others kept
    assert cells["lora"]["status"] == fm.HANG and "1 s" in cells["lora"]["reason"]


def test_a_worker_that_dies_without_a_result_is_a_crash(tmp_path, monkeypatch):
    monkeypatch.setattr(fm, "cell_command", lambda features, spec: [sys.executable, "-c", "print('boom'); exit(3)"])
    record = fm.launch_cell(("teacher",), tmp_path, timeout_s=60)
    assert record["status"] == fm.CRASH
    assert record["reason"].startswith("exit code 3 with 0 of 1 results") and "boom" in record["reason"]


def raised(function):
    try:
        function()
    except Exception as error:  # noqa: BLE001 - the test classifies it
        return error
    raise AssertionError("nothing raised")


def test_a_refusal_is_trapos_own_value_error_and_anything_else_a_crash(tmp_path):
    from trl_trapo import TRAPOConfig

    refusal = raised(lambda: TRAPOConfig(output_dir=str(tmp_path), async_rollouts=True, fewshot_mode=True))
    assert fm.is_refusal(refusal) and fm.where(refusal).startswith("trl_trapo/config.py:")
    assert not fm.is_refusal(raised(lambda: int("x")))  # a ValueError, not TRAPO's
    assert not fm.is_refusal(raised(lambda: TRAPOConfig(output_dir=str(tmp_path), no_such_field=1)))  # TypeError


def test_cells_selected_by_the_command_line():
    parse = fm.make_parser().parse_args
    assert fm.selected_cells(parse(["--only", "async,tools"])) == [("tools",), ("tools", "async"), ("async",)]
    assert fm.selected_cells(parse(["--cells", "async+tools, lora"])) == [("tools", "async"), ("lora",)]
    assert fm.selected_cells(parse(["--cells", ""])) == []
    involving = fm.selected_cells(parse(["--involving", "lora"]))
    assert len(involving) == sum(f.processes == 1 for f in fm.FEATURES.values()) and all(
        "lora" in c for c in involving
    )
    assert fm.selected_cells(parse(["--only", "tools,async,lora", "--involving", "async"])) == [
        ("tools", "async"),
        ("async",),
        ("async", "lora"),
    ]
    single = fm.selected_cells(parse([]))
    n = sum(f.processes == 1 for f in fm.FEATURES.values())
    assert len(single) == n + n * (n - 1) // 2 - 1  # every pair but vLLM server x colocate
    assert all(fm.processes_of(c) == 1 for c in single)
    both = fm.selected_cells(parse(["--two_process"]))
    m = len(fm.FEATURES)
    assert len(both) == m + m * (m - 1) // 2 - len(fm.SAME_AXIS)
    assert ("ddp", "zero3") not in both and ("zero3",) in both and ("tools", "ddp") in both
    for bad, message in (
        (["--cells", "tools+nope"], "unknown features \\['nope'\\]"),
        (["--cells", "ddp+zero3"], "a pair on one axis"),
        (["--cells", "tools+async+lora"], "not one feature or a pair"),
        (["--cells", "tools+tools"], "not one feature or a pair"),
    ):
        with pytest.raises(ValueError, match=message):
            fm.selected_cells(parse(bad))


def test_every_issue_40_exception_names_a_pair_of_known_features():
    for pair in [*fm.BY_DESIGN, *fm.SAME_AXIS]:
        assert len(pair) == 2 and pair <= set(fm.FEATURES), pair


def test_the_page_is_what_the_committed_results_render_to():
    data = json.loads(fm.RESULTS.read_text(encoding="utf-8"))
    page = page_of(fm.BLOCK)
    assert page == ROOT / "docs" / "feature_matrix.md"
    assert read_block(page.read_text(encoding="utf-8"), fm.BLOCK) == fm.render_block(data), (
        "docs/feature_matrix.md's matrix differs from docs/results/feature_matrix/results.json: run "
        "`python scripts/experiments/feature_matrix.py --cells '' --render docs/feature_matrix.md` (or the matrix "
        "itself), never edit it"
    )
    assert {fm.cell_name(tuple(c["features"])) for c in data["cells"]} >= {fm.cell_name(c) for c in fm.all_cells()}, (
        "the committed results lack single-process cells: run the whole matrix"
    )
    for cell in data["cells"]:
        assert cell["status"] in fm.OUTCOMES and cell["commit"], cell
        if cell["status"] == fm.WORKS:
            assert set(cell["evidence"]) == set(cell["features"]), cell


@pytest.mark.slow
def test_every_single_process_cell_works_or_is_refused(tmp_path):
    """The whole single-process matrix, run: every cell works or is refused, but for `KNOWN_FAILURES` exactly."""
    results = tmp_path / "results.json"
    fm.main(["--output_json", str(results), "--work_dir", str(tmp_path / "runs")])
    cells = cells_of(results)
    assert set(cells) == {fm.cell_name(c) for c in fm.all_cells()}
    failures = {
        name: cell["status"]
        for name, cell in cells.items()
        if cell["status"] not in (fm.WORKS, fm.BY_DESIGN_REFUSED, fm.TO_FIX_REFUSED)
    }
    details = {name: (cells[name].get("reason"), cells[name].get("where")) for name in failures}
    new = {name: details[name] for name in failures if KNOWN_FAILURES.get(name) != failures[name]}
    assert not new, f"cells that crash, hang or ignore a feature: {new}"
    gone = sorted(set(KNOWN_FAILURES) - set(failures))
    assert not gone, f"{gone} no longer fail: remove them from KNOWN_FAILURES and re-render docs/feature_matrix.md"


@pytest.mark.slow  # 60-270 s on 2 cores, quiet to busy: two DeepSpeed processes
@pytest.mark.distributed
def test_a_teacher_object_distills_into_a_policy_loaded_under_zero3(tmp_path):
    """teacher x ZeRO-3 (issue 40, note 6 of the page): the policy is loaded by path under ZeRO-3 (its output layer
    partitioned, 0 local rows), the teacher is an object built outside it (whole); the vocabulary check reads the
    whole shapes, so the cell trains 2 steps on 2 processes with `loss/distill` logged (it was refused, "the policy's
    0 rows"). tests/test_teacher.py checks the comparison itself in the default suite."""
    pytest.importorskip("deepspeed")
    results = tmp_path / "results.json"
    fm.main(["--cells", "teacher+zero3", "--output_json", str(results), "--work_dir", str(tmp_path / "runs")])
    cell = cells_of(results)["teacher+zero3"]
    assert cell["status"] == fm.WORKS, cell
    assert cell["processes"] == 2 and cell["evidence"]["teacher"].startswith("loss/distill=")
