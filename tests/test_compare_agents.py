# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/experiments/compare_agents.py`: the relay's step split, and the `--quick` run of the whole harness (base,
TRAPO, TRL's SFTTrainer -> GRPOTrainer with the tool), reused on a second call."""

import json
import os
import sys

import pytest


SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "experiments")
sys.path.insert(0, SCRIPTS)

import compare_agents  # noqa: E402
from compare_pipelines import time_averaged_mixture  # noqa: E402


def test_the_relay_splits_the_steps_as_trapos_sft_and_rl_shares():
    from trl_trapo.jobs import agent as agent_job

    _, config = agent_job.parse_args(["--max_steps", "400"])
    sft, rl = compare_agents.relay_steps(config)
    assert sft + rl == 400 and sft > rl > 0  # the default curriculum gives SFT more rows than RL on average
    _, sft_share, rl_share = time_averaged_mixture(config, (True, True, True))
    assert sft / 400 == pytest.approx(sft_share / (sft_share + rl_share), abs=1 / 400)


@pytest.mark.slow
def test_quick_run_measures_both_arms_from_one_base_and_reuses_them(tmp_path, caplog):
    out = tmp_path / "compare"
    payload = compare_agents.main(["--quick", "--output_dir", str(out)])
    assert json.loads((out / "results.json").read_text())["table"] == payload["table"]
    runs = {run["arm"]: run for run in payload["runs"]}
    assert set(runs) == {"base", "trapo", "serial"} and payload["seeds"] == [0]
    budget = payload["budget"]
    assert runs["trapo"]["steps"] == budget["agent_steps"] == 4
    stages = runs["serial"]["stages"]
    assert [s["stage"] for s in stages] == ["sft", "rl"]
    assert [s["steps"] for s in stages] == [budget["relay_sft_steps"], budget["relay_rl_steps"]]
    assert sum(s["steps"] for s in stages) == runs["serial"]["steps"] == 4  # the same optimizer steps
    for run in runs.values():
        metrics = run["metrics"]
        assert {"agent_accuracy_with_tool", "agent_accuracy_without_tool", "agent_tool_call_validity"} <= set(metrics)
        assert {"other_accuracy_lst", "other_accuracy_rev", "heldout_loss"} <= set(metrics)  # plain prompts
    # both arms start from the base: their held-out loss moved away from it, each its own way
    base_loss = runs["base"]["metrics"]["heldout_loss"]
    assert runs["trapo"]["metrics"]["heldout_loss"] != base_loss != runs["serial"]["metrics"]["heldout_loss"]
    assert payload["summary"]["trapo"]["heldout_loss_change"]["mean"] == pytest.approx(
        runs["trapo"]["metrics"]["heldout_loss"] - base_loss
    )
    assert payload["table"].count("\n") == 4  # header, rule, three runs
    # a second call reuses every run (same code, same settings)
    with caplog.at_level("INFO", logger="compare_agents"):
        again = compare_agents.main(["--quick", "--output_dir", str(out)])
    assert sum("reused" in r.getMessage() for r in caplog.records) == 3
    assert again["table"] == payload["table"]


def test_a_misspelt_option_of_the_script_is_named_as_one(tmp_path, capsys):
    """Unknown arguments go to the agent job (examples/trapo_tools.py): `--qiuck` (for `--quick`) was the job's ValueError (a traceback naming the
    job's closest names only). Now it is a usage error naming the closest of the script's and the job's."""
    for typo, close in (("--qiuck", "--quick (this script)"), ("--max_step", "--max_steps")):
        with pytest.raises(SystemExit) as exit_:
            compare_agents.main([typo, "--output_dir", str(tmp_path / "out")])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2
        assert (
            f"{typo}: neither this script nor the agent job (examples/trapo_tools.py) takes it. Did you mean {close}?"
            in err
        ), err
    assert not (tmp_path / "out").exists()
