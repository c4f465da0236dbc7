# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Targeted exploration (`trl_trapo/exploration.py`).

- Zero-variance groups by hand (NaN = unscored; a group needs two scored completions for a verdict).
- The rule: a stuck family heats up one step per round to the ceiling (never past it), a family with signal cools
  down to the floor, families move independently, and each row of a round is sampled at its family's temperature.
- In training: with a reward that never varies, the families' temperatures rise round by round, every trajectory
  carries the temperature it was sampled at, and the training forward scores it at that temperature (the first PPO
  ratio stays 1); the state survives a checkpoint exactly (a resumed run ends where an uninterrupted one does).
- Search once heat has run out: a family still stuck in a round sampled at the ceiling has its groups sampled again
  1, 2, 4, ... times (up to `exploration_max_search`), from the next round on, until a round carries a signal; in
  training those extra completions reach self-imitation only (not the replay buffer), at the family's temperature.
- Bad settings fail at construction, naming the field.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import finished_round, make_tiny_config
from transformers import AutoModelForSequenceClassification

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.exploration import ALL_FAMILIES, TargetedExploration, zero_variance_groups
from trl_trapo.tasks import build_tiny_model


NAN = math.nan


def test_zero_variance_groups_by_hand():
    scores = torch.tensor([0.0, 0.0, 0.0, 1.0, 2.0, 2.0, NAN, 2.0, NAN, NAN, NAN, 3.0])
    # groups of 3: [0,0,0] flat; [1,2,2] signal; [NAN,2,NAN] one scored: no verdict; [NAN,NAN,3] no verdict
    assert zero_variance_groups(scores, 3).tolist() == [True, False, False, False]
    # groups of 2: [0,0] [0,1] [2,2] [NAN,2] [NAN,NAN] [NAN,3]
    assert zero_variance_groups(scores, 2).tolist() == [True, False, True, False, False, False]
    with pytest.raises(ValueError, match="do not form groups"):
        zero_variance_groups(scores, 5)


def test_stuck_families_heat_up_to_the_ceiling_and_cool_down_with_signal():
    explore = TargetedExploration(temperature=0.7, max_temperature=1.0, step=0.2)
    rows = [{"task": "a"}] * 4 + [{"task": "b"}] * 4  # two groups of 4
    flat_a = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0])  # a: no signal, b: signal
    seen = []
    for _ in range(3):
        explore.observe(finished_round(rows, flat_a, 4))
        seen.append((explore.temperature_of("a"), explore.temperature_of("b")))
    # a: 0.7 -> 0.9 -> 1.0 (the last step is cut at the ceiling) -> 1.0; b stays at the floor
    assert seen == [pytest.approx((0.9, 0.7)), pytest.approx((1.0, 0.7)), pytest.approx((1.0, 0.7))]
    # once a's groups carry a signal it cools one step per round, back to the floor
    signal = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    explore.observe(finished_round(rows, signal, 4))
    assert explore.temperature_of("a") == pytest.approx(0.9)
    explore.observe(finished_round(rows, signal, 4))
    explore.observe(finished_round(rows, signal, 4))
    assert explore.temperature_of("a") == pytest.approx(0.7) and explore.state_dict()["levels"] == {}
    # a family is stuck when at least half of its groups are flat: 1 of 2 is, 1 of 3 is not
    half = [{"task": "c"}] * 4
    explore.observe(finished_round(half, torch.tensor([0.0, 0.0, 1.0, 0.0]), 2))
    assert explore.temperature_of("c") == pytest.approx(0.9)
    explore.observe(finished_round([{"task": "c"}] * 6, torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 0.0]), 2))
    assert explore.temperature_of("c") == pytest.approx(0.7)
    # rows without a `task` form one family
    assert TargetedExploration.families([{"prompt": "x"}, {"task": 3}]) == [ALL_FAMILIES, "3"]


def test_only_groups_flat_at_the_lowest_score_count_as_stuck():
    """All-right groups (flat above the lowest score seen) are solved, not stuck: their family is not heated."""
    explore = TargetedExploration(temperature=1.0, max_temperature=1.5, step=0.1)
    # a 135M model on GSM8K: every completion scores 0 from the first round on -> stuck, heated
    explore.observe(finished_round([{"task": "gsm8k"}] * 4, torch.zeros(4), 2))
    assert explore.temperature_of("gsm8k") == pytest.approx(1.1)
    rows = [{"task": "solved"}] * 4 + [{"task": "stuck"}] * 4
    explore.observe(finished_round(rows, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 2))
    assert explore.temperature_of("solved") == pytest.approx(1.0)  # flat at 1 > 0: solved
    assert explore.temperature_of("stuck") == pytest.approx(1.1)
    # a new, lower score makes the old floor a solved level: flat at 0 is no longer stuck once -1 has been seen
    explore.observe(finished_round(rows, torch.tensor([-1.0, 0.5, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 2))
    assert explore.lowest_score == -1.0 and explore.temperature_of("stuck") == pytest.approx(1.0)
    # NaN (no reward) never sets the floor
    fresh = TargetedExploration(temperature=1.0, max_temperature=1.5, step=0.1)
    fresh.observe(finished_round([{"task": "t"}] * 2, torch.tensor([float("nan"), float("nan")]), 2))
    assert fresh.lowest_score is None and fresh.levels == {}


def test_with_one_completion_per_prompt_a_family_is_stuck_when_all_its_completions_score_the_floor():
    """A value_model's rounds have one completion per prompt (group 1): no groups to find flat, so the unit is the
    family's completions in the round (issue 40, exploration x critic). Stuck: at least one scored completion, every
    scored one at the lowest score seen; NaN (no reward) is no verdict; a family flat above the floor is solved."""
    explore = TargetedExploration(temperature=1.0, max_temperature=1.5, step=0.1)
    rows = [{"task": "a"}] * 3 + [{"task": "b"}] * 3
    explore.observe(finished_round(rows, torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0]), 1))
    assert (explore.temperature_of("a"), explore.temperature_of("b")) == pytest.approx((1.1, 1.0))
    explore.observe(finished_round(rows, torch.tensor([NAN, 0.0, NAN, 1.0, 1.0, 1.0]), 1))
    assert (explore.temperature_of("a"), explore.temperature_of("b")) == pytest.approx((1.2, 1.0))  # b: solved
    explore.observe(finished_round(rows, torch.tensor([NAN, NAN, NAN, 0.0, 0.0, 0.0]), 1))
    assert (explore.temperature_of("a"), explore.temperature_of("b")) == pytest.approx((1.1, 1.1))  # a: no verdict
    # under data parallelism the other ranks' completions of the family count too (one gathered record per row)
    other_rank = [("a", [1.0])]
    gathered = TargetedExploration(1.0, 1.5, 0.1, gather=lambda records: records + other_rank)
    gathered.observe(finished_round([{"task": "a"}] * 2, torch.tensor([0.0, 0.0]), 1))
    assert gathered.levels == {} and gathered.lowest_score == 0.0


def test_a_familys_boost_scales_the_rounds_own_temperature():
    """Few-shot mode anneals the round's temperature T(step); exploration's per-family boost is a factor on it
    (issue 40, exploration x few-shot): T(step) * temperature_of(f) / temperature. Without a round temperature of its
    own (or at the configured one) the rows get `temperature_of(f)` exactly, as before."""
    explore = TargetedExploration(temperature=0.8, max_temperature=1.2, step=0.2)
    explore.load_state_dict({"levels": {"hot": 1}})
    rows = [{"task": "cold"}, {"task": "hot"}]
    assert explore.row_temperatures(rows) == explore.row_temperatures(rows, 0.8) == [0.8, 0.8 + 0.2]
    assert explore.row_temperatures(rows, 0.4) == pytest.approx([0.4, 0.4 * 1.0 / 0.8])


def test_the_rule_reads_the_whole_round_through_gather():
    """Under data parallelism `observe` sees every rank's share (`gather`, simulated here with the other rank's
    records): this rank's only group is flat at 0, but over the round one group in four is stuck and the lowest score
    is -1, so the family cools (stays at the floor) instead of heating as this share alone would make it."""
    other_rank = [("a", [-1.0, 2.0]), ("a", [0.0, 1.0]), ("a", [3.0, -1.0])]
    explore = TargetedExploration(1.0, 1.5, 0.1, gather=lambda records: records + other_rank)
    explore.observe(finished_round([{"task": "a"}] * 2, torch.tensor([0.0, 0.0]), 2))
    assert explore.levels == {} and explore.lowest_score == -1.0
    alone = TargetedExploration(1.0, 1.5, 0.1)
    alone.observe(finished_round([{"task": "a"}] * 2, torch.tensor([0.0, 0.0]), 2))
    assert alone.levels == {"a": 1}


def test_a_family_stuck_at_the_ceiling_is_searched_with_doubling_repeats():
    """Heat first, volume when heat has run out: no search while the family warms up, then 1, 2, 4, then the cap 5
    extra samplings per group in consecutive stuck rounds at the ceiling; a round with signal stops the search (and
    cools the family as before); a family that is not stuck is never searched."""
    explore = TargetedExploration(temperature=1.0, max_temperature=1.2, step=0.1, max_search=5)
    rows = [{"task": "a"}] * 2 + [{"task": "b"}] * 2
    flat_a = torch.tensor([0.0, 0.0, 0.0, 1.0])  # a stuck, b has signal
    repeats = []
    for _ in range(6):
        explore.observe(finished_round(rows, flat_a, 2))
        repeats.append((explore.temperature_of("a"), explore.search_repeats("a"), explore.search_repeats("b")))
    # rounds 1-2 heat a to the ceiling (1.1, 1.2); round 3 is the first stuck one sampled at 1.2
    assert [r[1] for r in repeats] == [0, 0, 1, 2, 4, 5] and {r[2] for r in repeats} == {0}
    assert repeats[-1][0] == pytest.approx(1.2)
    assert explore.metrics(["a", "b"])["exploration/search/a"] == 5.0
    state = explore.state_dict()
    assert state["search_levels"] == {"a": explore.max_search_level} and explore.max_search_level == 4
    again = TargetedExploration(temperature=1.0, max_temperature=1.2, step=0.1, max_search=5)
    again.load_state_dict(state)
    assert again.state_dict() == state and again.search_repeats("a") == 5
    explore.observe(finished_round(rows, torch.tensor([0.0, 1.0, 0.0, 1.0]), 2))  # a signal: stop searching
    assert explore.search_repeats("a") == 0 and explore.temperature_of("a") == pytest.approx(1.1)
    # without search (max_search=0, or a checkpoint made before it) nothing is ever searched
    plain = TargetedExploration(temperature=1.0, max_temperature=1.2, step=0.1)
    for _ in range(6):
        plain.observe(finished_round(rows, flat_a, 2))
    assert plain.search_repeats("a") == 0 and "exploration/search/a" not in plain.metrics(["a"])
    with pytest.raises(ValueError, match="exploration_max_search=-1"):
        TargetedExploration(1.0, 1.2, 0.1, max_search=-1)


def first_of_each_pair(completions, **kwargs):
    """1 for the first completion of every pair, 0 for the second: every group of 2 has one success."""
    return [1.0 if i % 2 == 0 else 0.0 for i in range(len(completions))]


def test_search_samples_go_to_self_imitation_only(tmp_path, tokenizer, suite):
    """The round's groups of a family searched 2x are sampled again (2 x its rows, at its temperature, the ceiling),
    scored, and their stopped successes join self-imitation; the replay buffer does not see them."""
    config = make_tiny_config(
        tmp_path,
        exploration=True,
        self_imitation=True,
        num_generations=2,
        exploration_max_temperature=1.2,
        exploration_max_search=4,
        disable_tqdm=True,
    )
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=first_of_each_pair,
        args=config,
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    trainer.exploration.load_state_dict({"levels": {"lst": 2}, "lowest_score": 0.0, "search_levels": {"lst": 2}})
    rows = [r for r in suite.rl_train if r["task"] == "lst"][:1] + [r for r in suite.rl_train if r["task"] == "rev"][
        :1
    ]
    examples = [dict(r, prompt_ids=tokenizer(r["prompt"])["input_ids"]) for r in rows for _ in range(2)]
    calls = []
    sample = trainer.rollouts.sample

    def recording_sample(examples, group, step, temperature, **kwargs):
        calls.append(([e["task"] for e in examples], group, list(temperature)))
        sampled = sample(examples, group, step, temperature, **kwargs)
        eos = torch.tensor([tokenizer.eos_token_id])
        sampled.completion_ids = [torch.cat([c[:1], eos]) for c in sampled.completion_ids]  # all stopped
        return sampled

    trainer.rollouts.sample = recording_sample
    replay_before = len(trainer.replay)
    trainer.rl_supply.search_stuck_families(finished_round(examples, torch.zeros(4), 2), step=0)
    # lst (searched 2x) is sampled again twice, rev (not searched) not at all, in one call at lst's temperature
    assert calls == [(["lst"] * 4, 2, pytest.approx([1.2] * 4))]
    successes = trainer.memory_pool.successes
    assert len(successes) == 2 and len(trainer.replay) == replay_before  # one success per search group
    assert successes.metrics() == {
        "self_imitation/size": 2.0,
        "self_imitation/kept": 2.0,
        "self_imitation/served": 0.0,
        "self_imitation/searched": 4.0,
        "self_imitation/search_kept": 2.0,
    }
    assert trainer.exploration.metrics(["lst", "rev"])["exploration/search/lst"] == 2.0


def test_a_rank_with_nothing_to_search_samples_as_many_rows_as_the_others(tmp_path, tokenizer, suite, monkeypatch):
    """Under data parallelism every rank samples and scores the same number of search rows (generation and reward
    models in lockstep): a rank whose round has no searched family, while another rank searches 4 rows (simulated
    through `max_over_ranks`), samples 4 rows of its own round's groups, at their families' temperatures."""
    import trl_trapo.rl_supply as supply_module

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=first_of_each_pair,
        args=make_tiny_config(tmp_path, exploration=True, self_imitation=True, num_generations=2, disable_tqdm=True),
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    rows = [r for r in suite.rl_train if r["task"] == "rev"][:3]
    examples = [dict(r, prompt_ids=tokenizer(r["prompt"])["input_ids"]) for r in rows for _ in range(2)]
    calls = []
    sample = trainer.rollouts.sample

    def recording_sample(examples, group, step, temperature, **kwargs):
        calls.append(([e["prompt"] for e in examples], list(temperature)))
        return sample(examples, group, step, temperature, **kwargs)

    trainer.rollouts.sample = recording_sample
    monkeypatch.setattr(supply_module, "max_over_ranks", lambda accelerator, value: max(value, 4))
    trainer.rl_supply.search_stuck_families(finished_round(examples, torch.zeros(6), 2), step=0)
    assert calls == [([rows[0]["prompt"]] * 2 + [rows[1]["prompt"]] * 2, pytest.approx([1.0] * 4))]
    assert trainer.memory_pool.successes.searched == 4
    monkeypatch.setattr(supply_module, "max_over_ranks", lambda accelerator, value: value)
    trainer.rl_supply.search_stuck_families(
        finished_round(examples, torch.zeros(6), 2), step=0
    )  # no rank searches: no call
    assert len(calls) == 1


def test_each_row_of_a_round_gets_its_familys_temperature():
    explore = TargetedExploration(temperature=1.0, max_temperature=1.3, step=0.1)
    explore.load_state_dict({"levels": {"hot": 2}})
    rows = [{"task": t} for t in ("cold", "cold", "hot", "hot", "new", "new", "hot", "hot")]
    assert explore.row_temperatures(rows) == pytest.approx([1.0, 1.0, 1.2, 1.2, 1.0, 1.0, 1.2, 1.2])
    assert explore.metrics(["cold", "hot"]) == pytest.approx(
        {"exploration/temperature/cold": 1.0, "exploration/temperature/hot": 1.2, "exploration/temperature": 1.1}
    )
    assert explore.metrics(None) == pytest.approx({"exploration/temperature": 1.0})


def test_bad_settings_fail_at_construction(tmp_path, tokenizer, suite):
    with pytest.raises(ValueError, match="exploration_max_temperature=0.5"):
        TRAPOConfig(output_dir=str(tmp_path), temperature=0.7, exploration_max_temperature=0.5)
    with pytest.raises(ValueError, match="exploration_temperature_step=0"):
        TRAPOConfig(output_dir=str(tmp_path), exploration_temperature_step=0.0)
    with pytest.raises(ValueError, match="exploration_max_search=-2.*integer >= 0"):
        TRAPOConfig(output_dir=str(tmp_path), exploration_max_search=-2)
    with pytest.raises(ValueError, match="max_temperature=1.0 must exceed temperature=1.0"):
        TargetedExploration(1.0, 1.0, 0.1)


def no_reward(completions, **kwargs):
    """0 for everything: every group is flat, so the family stays stuck."""
    return [0.0] * len(completions)


def exploring_trainer(output_dir, tokenizer, suite, value_model=None, **overrides):
    """RL only (every step has a generation round), one family (no `task` column), a reward that never varies."""
    config = make_tiny_config(
        output_dir,
        exploration=True,
        temperature=0.8,
        exploration_temperature_step=0.1,
        exploration_max_temperature=1.2,
        num_ppo_epochs=1,
        disable_tqdm=True,
        **overrides,
    )
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=no_reward,
        args=config,
        train_dataset=suite.rl_train.remove_columns("task"),
        processing_class=tokenizer,
        value_model=value_model,
    )


def stamped_temperatures(trainer) -> list[set]:
    """A list that gets, each time the trainer adds a round to its replay buffer, the set of the sampling temperatures
    its trajectories carry (None: the configured one), rounded to 6 digits."""
    stamped = []
    add = trainer.replay.add

    def recording_add(trajectories):
        stamped.append({None if t.temperature is None else round(t.temperature, 6) for t in trajectories})
        return add(trajectories)

    trainer.replay.add = recording_add
    return stamped


def test_training_heats_a_stuck_family_and_trains_each_row_at_its_temperature(tmp_path, tokenizer, suite):
    trainer = exploring_trainer(tmp_path, tokenizer, suite, max_steps=3)
    stamped = stamped_temperatures(trainer)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "exploration/temperature" in entry]
    # one round per step, every group flat: the temperature rises one step per round, from 0.8
    assert [entry["exploration/temperature"] for entry in logs] == pytest.approx([0.9, 1.0, 1.1])
    # each round is scored in training at the temperature it was sampled at, so the first PPO ratio is 1: the mean
    # of (log ratio)^2 / 2 is fp32 rounding (~1e-13 measured; per-token log-prob errors ~1e-6 nats). Scored at the
    # configured 0.8 instead, the hotter rounds give 4e-4 and 4e-3.
    approx_kl = [entry["policy/approxkl_avg"] for entry in trainer.state.log_history if "val/ratio" in entry]
    assert len(approx_kl) == 3 and max(approx_kl) < 1e-8, approx_kl
    # ... because each trajectory carries its sampling temperature (None: the configured one, 0.8)
    assert stamped == [{None}, {0.9}, {1.0}]


def test_with_a_critic_a_stuck_family_heats_and_each_row_trains_at_its_temperature(tmp_path, tokenizer, suite):
    """Exploration with a value_model (PPO, one completion per prompt; refused before issue 40): with a reward that
    never varies every round is stuck, so the temperature rises one step per round, each trajectory carries the
    temperature it was sampled at and is scored at it in training (the first PPO ratio stays 1), and the critic
    trains (`loss/value_avg`). There is no search: it re-samples groups."""
    config = build_tiny_model(tokenizer).config
    config.num_labels = 1  # a critic: a sequence-classification model with one output
    value_model = AutoModelForSequenceClassification.from_config(config)
    trainer = exploring_trainer(tmp_path, tokenizer, suite, max_steps=3, value_model=value_model)
    assert trainer.exploration is not None and trainer.exploration.max_search == 0
    stamped = stamped_temperatures(trainer)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "exploration/temperature" in entry]
    assert [entry["exploration/temperature"] for entry in logs] == pytest.approx([0.9, 1.0, 1.1])
    assert stamped == [{None}, {0.9}, {1.0}]
    approx_kl = [entry["policy/approxkl_avg"] for entry in trainer.state.log_history if "val/ratio" in entry]
    assert len(approx_kl) == 3 and max(approx_kl) < 1e-8, approx_kl
    assert all("loss/value_avg" in entry for entry in trainer.state.log_history if "val/ratio" in entry)


def test_exploration_state_survives_resume_exactly(tmp_path, tokenizer, suite):
    settings = dict(max_steps=4, save_strategy="steps", save_steps=2)
    whole = exploring_trainer(tmp_path / "whole", tokenizer, suite, **settings)
    whole.train()
    assert whole.exploration.state_dict() == {
        "levels": {ALL_FAMILIES: 4},
        "lowest_score": 0.0,
        "search_levels": {},  # RL only: no self-imitation, so no search
    }  # 0.8 + 4 x 0.1 = the ceiling
    resumed = exploring_trainer(tmp_path / "resumed", tokenizer, suite, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    # without the saved levels the resumed run would restart at 0.8 and end 2 steps cooler (level 2)
    assert resumed.exploration.state_dict() == whole.exploration.state_dict()
