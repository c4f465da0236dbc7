"""`scripts/benchmarks/benchmark_trainers.py`: TRAPO against GRPOTrainer / SFTTrainer, one child process per
trainer."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("scripts/benchmarks/benchmark_trainers.py")


def test_generation_meter_counts_completion_tokens_up_to_the_first_eos(bench):
    eos = 1

    class FakeModel:
        def generate(self, input_ids, **kwargs):
            completion = torch.tensor([[5, 6, eos, 0], [5, 6, 7, 8], [eos, 0, 0, 0]])
            return torch.cat([input_ids, completion], dim=1)

    model = FakeModel()
    meter = bench.GenerationMeter(eos, lambda: None)
    meter.instrument(model)
    model.generate(input_ids=torch.zeros(3, 2, dtype=torch.long))
    wall_s, cpu_s, tokens, positions, calls = meter.snapshot()
    assert (tokens, positions, calls) == (3 + 4 + 1, 12, 1)
    assert wall_s >= 0 and cpu_s >= 0


@pytest.mark.ci  # > 10 CPU-s; `.ci/run` runs it (`pytest -m ci`)
def test_quick_run_reports_every_ratio_and_a_record_per_trainer(bench, tmp_path):
    output = tmp_path / "bench.json"
    result = bench.main(["--quick", "--output_json", str(output)])
    assert json.loads(output.read_text()) == json.loads(json.dumps(result))  # the JSON holds what main returned

    ratios = result["ratios"]
    for key in (
        "rl_step_time",
        "rl_rollout_throughput",
        "rl_peak_memory",
        "sft_step_time",
        "sft_peak_memory",
        "distill_step_time",
        "distill_peak_memory",
    ):
        assert math.isfinite(ratios[key]) and ratios[key] > 0, (key, ratios[key])

    records = result["records"]
    names = ("rl_trapo", "rl_trl", "sft_trapo", "sft_trl", "distill_trapo", "distill_trl", "distill_joint")
    assert set(records) == set(names)
    assert [records[name]["trainer"] for name in names] == [
        "TRAPOTrainer",
        "GRPOTrainer",
        "TRAPOTrainer",
        "SFTTrainer",
        "TRAPOTrainer",
        "DistillationTrainer",
        "TRAPOTrainer",
    ]
    # the teacher ran in every distillation step, of both trainers and of the joint run
    for name in ("distill_trapo", "distill_trl", "distill_joint"):
        assert 0 < records[name]["teacher_share"] < 1, name
    settings = result["settings"]
    for name, record in records.items():
        assert len(record["steps"]) == settings["warmup"] + settings["steps"], name
        assert record["step_time_s"] > 0 and record["peak_memory_mib"] > 0, name
        if record["objective"] == "rl" or name in ("distill_trapo", "distill_trl"):
            # every measured step generated once, batch_size completions of exactly seq_len tokens
            measured = record["steps"][settings["warmup"] :]
            assert [s["generate_calls"] for s in measured] == [1] * settings["steps"], name
            assert [s["tokens"] for s in measured] == [settings["batch_size"] * settings["seq_len"]] * len(measured)
            assert record["rollout_tokens_per_s"] > 0, name
        elif record["objective"] == "sft":
            assert all(s["generate_calls"] == 0 for s in record["steps"]), name
