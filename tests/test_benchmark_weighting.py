"""`scripts/benchmarks/benchmark_weighting.py`: the weighting strategies' cost per optimizer step (issue 42)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("scripts/benchmarks/benchmark_weighting.py")


@pytest.mark.slow
def test_a_tiny_measurement_reports_every_figure_and_sees_dares_own_work(bench):
    # 2 strategies x 1 round x 4 steps: steps 1-3 measured, step 2 an update step (interval 2)
    result = bench.measure(["dare", "static"], steps=4, repeats=1, warmup=1, update_interval=2, log=lambda line: None)
    summary = result["summary"]
    assert list(summary) == ["dare", "static"]
    for strategy, figures in summary.items():
        for key in (
            "cpu_ms",
            "wall_ms",
            "delta_cpu_ms",
            "delta_wall_ms",
            "delta_update_cpu_ms",
            "own_update_ms",
            "own_other_ms",
            "own_amortised_ms",
            "own_job_interval_ms",
            "updates_per_100",
        ):
            assert math.isfinite(figures[key]), (strategy, key, figures[key])
        assert figures["cpu_ms"] > 0 and figures["wall_ms"] > 0
        run = result["runs"][strategy][0]
        assert len(run["cpu_s"]) == len(run["own_cpu_s"]) == 4
    # the timing hooks saw the trainer's calls: DARE probed and updated at step 2, static did neither
    assert result["runs"]["dare"][0]["update_steps"] == [2]
    assert result["runs"]["static"][0]["update_steps"] == []
    assert {"accumulate", "finish_step", "update"} <= set(result["runs"]["dare"][0]["own_parts_s"][2])
    assert summary["dare"]["updates_per_100"] > 0 == summary["static"]["updates_per_100"]
    assert summary["static"]["own_update_ms"] < summary["dare"]["own_update_ms"]
    assert summary["dare"]["own_update_ms/accumulate"] > 0 == summary["static"]["own_update_ms/accumulate"]
    assert summary["static"]["delta_cpu_ms"] == 0.0  # against itself
    table = bench.table(result)
    assert "| `dare` |" in table and "| `static` |" in table
    json.dumps(result)  # what --json writes


def test_bad_settings_are_refused_before_any_run(bench):
    with pytest.raises(ValueError, match=r"strategies=\['dre'\].*use some of"):
        bench.measure(["dre"], log=lambda line: None)
    with pytest.raises(ValueError, match=r"warmup=5: use 0 <= warmup < steps - 1"):
        bench.measure(["dare"], steps=5, warmup=5, log=lambda line: None)
    with pytest.raises(ValueError, match=r"model_name_or_path='/nonexistent'.*fetch_smollm2"):
        bench.measure(["dare"], model_name_or_path="/nonexistent", log=lambda line: None)
