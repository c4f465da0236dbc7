# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The RL objective's supply chain (`trl_trapo/rl_supply.py`): the rollout source, the replay buffer and the
orchestration between them, owned by `RLSupply`, not by the trainer.

- The RL objective's rows come from its supply, which never calls back into the trainer: a trainer whose public
  `collect_rollouts` refuses still serves them.
- Its checkpoint state keeps the keys TRAPO's checkpoints have always had, and restores into a fresh supply.
- The builders refuse what cannot work and switch exploration off where it cannot run.
"""

from __future__ import annotations

import pytest
from conftest import make_tiny_config, make_tiny_trainer

from trl_trapo.config import RL
from trl_trapo.rl_supply import build_exploration, build_successes


def test_the_rl_objective_is_served_by_its_supply_without_the_trainer(tmp_path, tokenizer, suite, monkeypatch):
    trainer = make_tiny_trainer(tmp_path, tokenizer, suite)

    def refuse(*args, **kwargs):
        raise AssertionError("the RL objective called back into the trainer")

    monkeypatch.setattr(trainer, "collect_rollouts", refuse)
    monkeypatch.setattr(trainer, "process_rollouts", refuse)
    rows = trainer.objectives[RL].take(4, 0)
    assert len(rows) == 4 and all(row.objective == RL for row in rows)
    assert trainer.rl_supply.episode > 0 and trainer.state.episode == trainer.rl_supply.episode
    assert len(trainer.replay) > 0 and trainer.replay is trainer.rl_supply.replay


def test_the_supply_checkpoints_under_the_old_keys_and_restores(tmp_path, tokenizer, suite):
    trainer = make_tiny_trainer(tmp_path / "a", tokenizer, suite, exploration=True)
    trainer.rl_supply.take_rows(4, 0)
    meta, tensors = trainer.rl_supply.state_dict()
    # the keys `trapo/rank{r}.json` has had since before the supply existed (no source state: no `rollout_source`),
    # and `num_tokens` (TRL GRPO's cumulative token count, this rank's)
    assert set(meta) == {"episode", "num_tokens", "replay", "exploration"}
    assert meta["num_tokens"] == trainer.metrics.tokens_seen > 0
    assert not any(key.startswith("rollout_source/") for key in tensors)
    fresh = make_tiny_trainer(tmp_path / "b", tokenizer, suite, exploration=True)
    fresh.rl_supply.load_state_dict({k: v for k, v in meta.items() if k != "num_tokens"}, tensors)
    assert fresh.metrics.tokens_seen == 0  # a checkpoint from before `num_tokens` was logged: counted from here
    fresh.rl_supply.load_state_dict(meta, tensors)
    assert fresh.rl_supply.episode == trainer.rl_supply.episode
    assert fresh.metrics.tokens_seen == trainer.metrics.tokens_seen
    assert len(fresh.replay) == len(trainer.replay)
    assert fresh.exploration.state_dict() == trainer.exploration.state_dict()


def test_the_builders_refuse_or_switch_off(tmp_path):
    config = make_tiny_config(tmp_path, self_imitation=True)
    with pytest.raises(ValueError, match=r"self_imitation=True serves RL's successes.*RL True, SFT False"):
        build_successes(config, rl_active=True, sft_active=False)
    assert build_successes(make_tiny_config(tmp_path, self_imitation=None), True, False) is None
    auto = make_tiny_config(tmp_path, exploration=None)
    assert build_exploration(auto, True, has_critic=True, own_source=False, world_size=1, with_successes=True) is None
    assert build_exploration(auto, True, has_critic=False, own_source=True, world_size=1, with_successes=True) is None
    explore = build_exploration(auto, True, has_critic=False, own_source=False, world_size=1, with_successes=False)
    assert explore is not None and explore.max_search == 0  # the search feeds self-imitation only
