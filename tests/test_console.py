"""A readable console: the short log line (`console_metrics`), one progress bar during training, no warning on every
run, and `dare/*` / `curriculum/*` only for the objectives in the run. `trainer_state.json` keeps every metric."""

from __future__ import annotations

import ast
import re

import pytest
from transformers.generation import configuration_utils

from trl_trapo import TRAPOTrainer
from trl_trapo.callbacks import CONSOLE_EXCLUDED, CONSOLE_METRICS, console_view
from trl_trapo.tasks import build_tiny_model, exact_match_reward


SHORT_KEYS = {"loss", "grad_norm", "learning_rate", "epoch", "objective/scores", "objective/kl"}
SHORT_KEYS |= {f"{kind}/{o}" for kind in ("loss", "weight") for o in ("pretrain", "sft", "rl")}


def test_console_view_keeps_the_short_set_of_a_training_entry_only():
    entry = {
        "loss": 1.0,
        "grad_norm": 0.5,
        "learning_rate": 1e-3,
        "loss/sft": 2.0,
        "loss/policy_avg": 0.1,
        "weight/rl": 0.2,
        "objective/scores": 0.3,
        "objective/kl": 0.01,
        "objective/entropy": 3.0,
        "replay/size": 8.0,
        "dare/factor/rl": 1.0,
        "lr": 1e-3,
        "epoch": 0.5,
    }
    shown = console_view(entry)
    assert list(shown) == ["loss", "grad_norm", "learning_rate", "loss/sft", "weight/rl", "objective/scores"] + [
        "objective/kl",
        "epoch",
    ]
    assert len(entry) == 13  # the entry itself is not changed
    evaluation = {"eval_reward": 0.5, "eval_rewards/exact_match_reward": 0.5, "epoch": 1.0}
    assert console_view(evaluation) == evaluation  # not a training step: whole
    assert CONSOLE_EXCLUDED == ("loss/*_avg",) and "loss/*" in CONSOLE_METRICS


def printed_entries(text: str) -> list[dict]:
    """The log entries the console printed (`{'loss': '1.2', ...}`: each one a Python dict literal)."""
    return [ast.literal_eval(m) for m in re.findall(r"\{'[^{}]*\}", text)]


@pytest.mark.parametrize("disable_tqdm", [False, True], ids=["progress_bar", "printer"])
def test_the_console_shows_the_short_set_and_the_state_keeps_every_metric(
    tmp_path, tokenizer, suite, tiny_config, capsys, monkeypatch, disable_tqdm
):
    warnings = []  # transformers' "generation flags are not valid" (`warning_once`: recorded here on every call)
    monkeypatch.setattr(configuration_utils.logger, "warning_once", lambda message, *a, **k: warnings.append(message))
    trainer = TRAPOTrainer(  # the defaults: top_k=0, console_metrics="short"
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, max_steps=2, disable_tqdm=disable_tqdm, eval_strategy="steps", eval_steps=2),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        eval_dataset=suite.eval.select(range(4)),
        processing_class=tokenizer,
    )
    trainer.train()
    out, err = capsys.readouterr()
    steps = [entry for entry in printed_entries(out) if "loss" in entry]
    assert len(steps) == 2, out
    for entry in steps:
        assert set(entry) <= SHORT_KEYS and {"loss", "learning_rate", "weight/rl", "loss/pretrain"} <= set(entry)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    for entry in logged:  # every metric still logged (trainer_state.json, trackers)
        assert {"replay/size", "curriculum/rl", "dare/factor/rl", "lr", "episode", "policy/clipfrac_avg"} <= set(entry)
        assert len(entry) > 2 * len(SHORT_KEYS)
    assert any("eval_reward" in entry for entry in printed_entries(out))  # evaluation lines: whole
    assert "Rollouts, step" not in err  # one bar during training: no bar per rollout round
    assert not [w for w in warnings if "generation flags" in w], warnings


def test_console_metrics_all_prints_every_metric_and_the_rollout_bars(
    tmp_path, tokenizer, suite, tiny_trainer, capsys
):
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=1, console_metrics="all", disable_tqdm=False)
    trainer.train()
    out, err = capsys.readouterr()
    (entry,) = [e for e in printed_entries(out) if "loss" in e]
    assert {"replay/size", "curriculum/rl", "dare/factor/rl", "lr"} <= set(entry)
    assert "Rollouts, step 0" in err


def test_console_metrics_is_checked(tmp_path, tiny_config):
    with pytest.raises(ValueError, match=r"console_metrics='full' is invalid.*use one of 'short', 'all'"):
        tiny_config(tmp_path, console_metrics="full")


def test_every_literal_choice_is_checked_in_python(tmp_path, tiny_config):
    """The command line's argparse refuses a value outside a `Literal[...]` field's choices; Python did not."""
    with pytest.raises(ValueError, match=r"dare_mode='Dynamic' is invalid.*use one of 'dynamic', 'static'"):
        tiny_config(tmp_path, dare_mode="Dynamic")
    with pytest.raises(ValueError, match=r"stop_token='eot' is invalid.*use one of 'eos'"):
        tiny_config(tmp_path, stop_token="eot")
    assert tiny_config(tmp_path, stop_token=None).stop_token is None


def test_no_dare_or_curriculum_metrics_for_an_objective_without_data(tmp_path, tokenizer, suite, tiny_config):
    """RL prompts only (a GRPO script): `weight/*` of every objective, but `dare/*` and `curriculum/*` of RL only;
    with all three objectives the names are unchanged (tests/test_trainer.py)."""
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, max_steps=1),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    trainer.train()
    (entry,) = [h for h in trainer.state.log_history if "loss" in h]
    assert {
        "weight/pretrain",
        "weight/sft",
        "weight/rl",
        "curriculum/rl",
        "curriculum/phase",
        "dare/factor/rl",
    } <= set(entry)
    absent = {k for k in entry if k.startswith(("dare/", "curriculum/")) and k.endswith(("/pretrain", "/sft"))}
    assert not absent, absent
