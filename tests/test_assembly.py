# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The assembly module (issue 39): the construction steps that need no trainer take what they need as arguments and
return what they build — the checks before anything slow loads, the rollout source — and stay short."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from trl_trapo import TRAPOTrainer, assembly
from trl_trapo.assembly import RunChecks, SourceParts, build_rollout_source, check_run
from trl_trapo.metrics import MetricsAccumulator
from trl_trapo.sources import SyncRolloutSource


MAX_CONSTRUCTION_LINES = 80  # issue 39: no construction function over 80 lines
INIT_LINES_CAP = 559  # a ratchet towards issue 39's 150 lines: lower it as steps move out of `__init__`


def function_lengths(source: str) -> dict[str, int]:
    tree = ast.parse(textwrap.dedent(source))
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def test_the_assembly_functions_are_short_and_the_constructor_shrinks():
    long = {n: k for n, k in function_lengths(inspect.getsource(assembly)).items() if k > MAX_CONSTRUCTION_LINES}
    assert not long, long
    init = function_lengths(inspect.getsource(TRAPOTrainer.__init__))["__init__"]
    assert init <= INIT_LINES_CAP, f"TRAPOTrainer.__init__ has {init} lines (cap {INIT_LINES_CAP})"


def arguments(tokenizer, model=None) -> dict:
    return dict(model=model if model is not None else "model-id", reward_funcs=None, processing_class=tokenizer)


def test_check_run_returns_what_it_found(tmp_path, tokenizer, suite, tiny_config):
    args = tiny_config(tmp_path)
    common = dict(
        train_dataset=suite.rl_train,
        eval_dataset=None,
        pretrain_dataset=None,
        sft_dataset=suite.sft,
        distillation_dataset=None,
        rollout_source=None,
        tools=None,
        environment_factory=None,
        reward_funcs=None,
        reward_model=None,
    )
    checked = check_run(args, arguments(tokenizer), rollout_func=None, **common)
    assert isinstance(checked, RunChecks)
    assert checked.agent is None and checked.verified_checkpoint is None and not checked.own_source
    assert checked.train_dataset is suite.rl_train  # the user's dataset, untouched
    assert checked.thread_choice.producer_threads >= 0
    assert check_run(args, arguments(tokenizer), rollout_func=lambda prompts, trainer: {}, **common).own_source
    # the argument type checks run first, by name
    with pytest.raises(TypeError, match="processing_class"):
        check_run(args, dict(model="model-id", processing_class=42), rollout_func=None, **common)


def parts(**overrides) -> SourceParts:
    """Placeholders for what a source is built from: the refusals below touch none of them."""
    fields = {f.name: None for f in SourceParts.__dataclass_fields__.values()}
    return SourceParts(**{**fields, "metrics": MetricsAccumulator([]), "zero3": False, **overrides})


def test_build_rollout_source_refuses_before_building_anything(tmp_path, tiny_config):
    args = tiny_config(tmp_path)
    choice = dict(rollout_source=None, agent=None, has_critic=False, exploration=None)
    with pytest.raises(ValueError, match="rollout_func was given but there are no RL prompts"):
        build_rollout_source(args, parts(), rollout_func=lambda p: {}, own_source=True, active_rl=False, **choice)
    async_args = tiny_config(tmp_path, async_rollouts=True)
    with pytest.raises(ValueError, match="a rollout_source object of your own cannot be rebuilt there"):
        build_rollout_source(
            async_args, parts(), rollout_func=None, own_source=True, active_rl=True, **{**choice, "rollout_source": 1}
        )
    with pytest.raises(ValueError, match="not available under DeepSpeed ZeRO-3"):
        build_rollout_source(
            async_args, parts(zero3=True), rollout_func=None, own_source=False, active_rl=True, **choice
        )


def test_build_rollout_source_defaults_to_the_sync_source(tmp_path, tiny_config):
    args = tiny_config(tmp_path)
    choice = dict(rollout_source=None, rollout_func=None, agent=None, own_source=False, exploration=None)
    source = build_rollout_source(args, parts(), active_rl=False, has_critic=False, **choice)
    assert isinstance(source, SyncRolloutSource)
