# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts (`async_rollouts=True`, trl_trapo/async_rollouts.py): a producer process samples and scores
rounds while the trainer trains.

- The lag of every round (consuming step minus the weights version that sampled it) stays within `max_staleness`, the
  producer runs ahead when allowed, and the metrics say so.
- A run does not depend on the producer's timing (deterministic mode): a slow reward gives the same weights.
- A late round is dropped (counted) or down-weighted; the log-probs go where `async_correction` says, and at lag 0 the
  producer's are the trainer's own.
- Failures reach the trainer: a reward function that raises in the producer, a producer that dies, a reward function
  that cannot be pickled (refused at construction), settings that do not combine.
- A LoRA run sends only the adapter.
Resuming after kill -9 is in tests/test_durability.py; two processes in tests/test_distributed_jobs.py.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
import torch
from conftest import make_tiny_trainer

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.async_rollouts import ProducerError, round_seed, trainable_state
from trl_trapo.rollout import completion_logps
from trl_trapo.tasks import build_tiny_model, exact_match_reward


TIMING_KEYS = ("perf/", "train_runtime", "train_samples_per_second", "train_steps_per_second", "eps", "step_time")


def slow_exact_match(**kwargs):
    """`exact_match_reward`, 0.3 s later (a remote verifier); module level, so the producer can import it."""
    time.sleep(0.3)
    return exact_match_reward(**kwargs)


def failing_reward(completions, **kwargs):
    raise ValueError("the verifier is down")


def state_reading_reward(completions, trainer_state, **kwargs):
    """Reads `TrainerState` fields besides `global_step`, as a TRL reward may (module level, for the producer)."""
    return [float(trainer_state.max_steps >= 0 and trainer_state.global_step >= 0)] * len(completions)


def async_trainer(tmp_path, tokenizer, suite, **overrides):
    values = dict(async_rollouts=True, max_staleness=2, max_steps=8, gradient_accumulation_steps=2)
    values.update(overrides)
    return make_tiny_trainer(tmp_path, tokenizer, suite, **values)


def logs_without_timing(trainer) -> list[dict]:
    return [
        {k: v for k, v in h.items() if not k.startswith(TIMING_KEYS)} for h in trainer.state.log_history if "loss" in h
    ]


@pytest.mark.parametrize("max_staleness", [0, 1, 4])
def test_lag_stays_within_max_staleness_and_the_producer_runs_ahead(tmp_path, tokenizer, suite, max_staleness):
    trainer = async_trainer(tmp_path, tokenizer, suite, max_staleness=max_staleness, max_steps=10)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    arrivals = [h for h in logs if "sample/staleness_max" in h]  # a log per step: the steps a round arrived
    lags = [h["sample/staleness_max"] for h in arrivals]
    assert 2 <= len(arrivals) < len(logs) and max(lags) <= max_staleness, lags
    if max_staleness > 0:  # rounds were asked for ahead: some arrived late by design
        assert max(lags) >= 1, lags
    assert all(h["sample/dropped_stale_total"] == 0 for h in logs)  # a state: in every log
    for key in ("sample/staleness_mean", "perf/rollout_wait_s", "perf/rollout_wait_share", "perf/producer_reward_s",
                "perf/producer_generate_s"):  # fmt: skip
        assert all(key in h for h in arrivals) and not any(key in h for h in logs if h not in arrivals), key
    assert any("perf/weight_sync_s" in h for h in logs)  # weights were sent after the first round
    assert 0 < arrivals[0]["perf/rollout_wait_s"]  # the first round is waited for (the producer starts)
    assert all(0 <= h["perf/rollout_wait_share"] <= 1 for h in arrivals)
    assert trainer.rollout_source.producer_pid is None  # stopped when train() returned


@pytest.mark.slow
def test_a_slow_reward_does_not_change_the_run(tmp_path, tokenizer, suite):
    """Deterministic mode: what is sampled depends on the training state, never on how fast the producer is."""
    fast = async_trainer(tmp_path / "fast", tokenizer, suite)
    fast.train()
    slow = async_trainer(tmp_path / "slow", tokenizer, suite)
    slow.rewards.funcs[0] = slow_exact_match  # same rewards, 0.3 s per call in the producer
    slow.train()
    assert logs_without_timing(fast) == logs_without_timing(slow)
    for (name, a), (_, b) in zip(fast.model.named_parameters(), slow.model.named_parameters()):
        assert torch.equal(a, b), name
    # the producer was slow indeed (timing-free: the sleep is a lower bound)
    assert max(h.get("perf/producer_reward_s", 0) for h in slow.state.log_history) >= 0.3
    assert max(h.get("perf/producer_reward_s", 0) for h in fast.state.log_history) < 0.3


@pytest.mark.slow
def test_a_late_round_is_dropped_or_downweighted(tmp_path, tokenizer, suite):
    trainer = async_trainer(tmp_path / "drop", tokenizer, suite, max_staleness=1)
    source = trainer.rollout_source
    try:
        source.prefetch(8, 0, [0, 0, 0, 0])  # one round asked for at step 0 (weights of step 0) ...
        sampled = source.sample(8, 3)  # ... is consumed at step 3: 3 steps late, dropped; the next is asked for now
        assert sampled.version == 3 and source.dropped_total == 1
        assert trainer.metrics.dropped_stale_total == 1
    finally:
        source.close()
    trainer = async_trainer(tmp_path / "down", tokenizer, suite, max_staleness=1, stale_rollouts="downweight")
    source = trainer.rollout_source
    try:
        source.prefetch(8, 0, [0, 0, 0, 0])
        sampled = source.sample(8, 3)
        assert sampled.version == 0 and sampled.importance_weight == pytest.approx(2 / 4)
    finally:
        source.close()


@pytest.mark.parametrize("correction", ["decoupled", "behaviour"])
def test_log_probs_follow_async_correction_and_match_the_trainer_at_lag_0(tmp_path, tokenizer, suite, correction):
    trainer = async_trainer(tmp_path, tokenizer, suite, async_correction=correction)
    source = trainer.rollout_source
    try:
        sampled = source.sample(8, 0)
    finally:
        source.close()
    producer = sampled.sampler_per_token_logps if correction == "decoupled" else sampled.old_per_token_logps
    other = sampled.old_per_token_logps if correction == "decoupled" else sampled.sampler_per_token_logps
    assert producer is not None and other is None
    assert sampled.scores is not None and sampled.version == 0
    own = completion_logps(
        trainer.model, sampled.prompt_ids, sampled.completion_ids, trainer.padding_id, sampled.temperatures, 64
    )
    for a, b in zip(producer, own):  # the same weights, fp32: the same log-probs up to summation order
        torch.testing.assert_close(a, b.float(), atol=1e-5, rtol=0)


def test_a_failing_reward_in_the_producer_reaches_the_trainer(tmp_path, tokenizer, suite):
    trainer = async_trainer(tmp_path, tokenizer, suite)
    trainer.rewards.funcs[0] = failing_reward
    with pytest.raises(ProducerError, match="(?s)failing_reward.*the verifier is down"):
        trainer.rollout_source.sample(8, 0)
    assert trainer.rollout_source.producer_pid is None  # stopped


def test_the_producer_passes_rewards_a_trainer_state(tmp_path, tokenizer, suite):
    """The producer gave reward functions a stand-in with `global_step` only: a TRL reward reading another field of
    `TrainerState` (`max_steps`, `epoch`, ...) failed in async runs only (found with trial 8's RS03)."""
    trainer = async_trainer(tmp_path, tokenizer, suite)
    trainer.rewards.funcs[0] = state_reading_reward
    try:
        sampled = trainer.rollout_source.sample(8, 0)
    finally:
        trainer.rollout_source.close()
    assert sampled.scores is not None and bool((sampled.scores == 1.0).all())


def test_a_dead_producer_is_reported(tmp_path, tokenizer, suite):
    trainer = async_trainer(tmp_path, tokenizer, suite)
    source = trainer.rollout_source
    try:
        source.sample(8, 0)  # started
        os.kill(source.producer_pid, signal.SIGKILL)
        time.sleep(0.5)
        with pytest.raises(ProducerError, match="was killed by SIGKILL"):
            source.sample(8, 1)
    finally:
        source.close()


def test_an_unpicklable_reward_is_refused_at_construction_by_name(tmp_path, tokenizer, suite):
    def local_reward(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="'local_reward' cannot be pickled.*module level"):
        make_tiny_trainer(
            tmp_path, tokenizer, suite, async_rollouts=True, train_dataset=suite.rl_train
        ).__class__(  # the same construction, with the local function as the reward
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=local_reward,
            args=TRAPOConfig(output_dir=str(tmp_path), report_to="none", async_rollouts=True, max_steps=2),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(max_staleness=-1), "max_staleness=-1"),
        (dict(weight_sync_steps=0), "weight_sync_steps=0"),
        (dict(async_producer_threads=0), "async_producer_threads=0"),
        (dict(async_correction="x"), "async_correction='x'"),
        (dict(stale_rollouts="x"), "stale_rollouts='x'"),
        (dict(vllm_importance_sampling_correction=False), "async_correction='decoupled'.*vllm_importance_sampling"),
        (dict(fewshot_mode=True), "fewshot_mode=True"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        TRAPOConfig(output_dir=str(tmp_path), async_rollouts=True, **overrides)


def test_async_settings_without_async_rollouts_are_warned_once(tmp_path, caplog):
    """`max_staleness=0, weight_sync_steps=3` without `async_rollouts` trained synchronously without a word (trial 7,
    A08): one warning at construction naming the settings and the fix, as `--lora_r` without `--use_peft` gets; not
    for the defaults, not with `async_rollouts=True`, not again for a copy of the config."""
    import dataclasses
    import logging

    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        config = TRAPOConfig(output_dir=str(tmp_path), max_staleness=0, weight_sync_steps=3)
        dataclasses.replace(config, max_steps=3)  # the trainer's and the job's copies
    found = [r.getMessage() for r in caplog.records if "async_rollouts is not" in r.getMessage()]
    assert found == [
        "max_staleness=0, weight_sync_steps=3 are set but TRAPOConfig.async_rollouts is not: they are ignored (rounds "
        "are sampled synchronously, in the training process). Set async_rollouts=True (--async_rollouts) to sample in "
        "a producer process with them, or drop them."
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        TRAPOConfig(output_dir=str(tmp_path))  # every async setting at its default
        TRAPOConfig(output_dir=str(tmp_path), weight_sync_steps=1)  # an explicit default counts as not given
        TRAPOConfig(output_dir=str(tmp_path), async_rollouts=True, max_staleness=0, weight_sync_steps=3)
    assert "async_rollouts is not" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="trl_trapo.config"):
        TRAPOConfig(output_dir=str(tmp_path), async_deterministic=False)
    assert "async_deterministic=False is set but TRAPOConfig.async_rollouts is not: it is ignored" in caplog.text


class OwnSource:
    """A rollout source object of the user's: it samples with what it holds, which a producer cannot rebuild."""

    def sample(self, rows_needed, step):
        raise AssertionError("never called")


def test_a_source_object_of_your_own_is_refused_and_an_unpicklable_rollout_func_is_named(tmp_path, tokenizer, suite):
    def rollout_func(prompts, trainer):
        raise AssertionError("never called")

    common = dict(
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(output_dir=str(tmp_path / "b"), report_to="none", async_rollouts=True, max_steps=2),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    with pytest.raises(ValueError, match="a rollout_source object of your own cannot be rebuilt there"):
        TRAPOTrainer(build_tiny_model(tokenizer, seed=0), rollout_source=OwnSource(), **common)
    # a rollout_func runs in the producer (tests/test_async_sources.py), but a local one cannot reach it: named
    with pytest.raises(ValueError, match="rollout_func 'rollout_func' cannot be pickled.*Define it at module level"):
        TRAPOTrainer(build_tiny_model(tokenizer, seed=0), rollout_func=rollout_func, **common)


def test_every_object_that_cannot_reach_the_producer_is_named_in_one_message(tmp_path, tokenizer, suite):
    """Trial 12's N49: `async_rollouts=True` with a lambda reward and a local `rollout_func` refused the reward, and
    after that fix the rollout_func: two runs to learn two problems. Now one message names both, each with its fix,
    refused at construction as before; a picklable reward beside them is not named."""

    def rollout_func(prompts, trainer):
        raise AssertionError("never called")

    args = TRAPOConfig(output_dir=str(tmp_path), report_to="none", async_rollouts=True, max_steps=2)
    with pytest.raises(ValueError) as info:
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=[exact_match_reward, lambda completions, **kwargs: [0.0] * len(completions)],
            args=args,
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
            rollout_func=rollout_func,
        )
    message = str(info.value)
    head, *items = message.split("\n- ")
    assert head.startswith("async_rollouts=True runs the reward functions and the rollout_func in a producer "), (
        message
    )
    assert "but 2 of them cannot reach it; fix each, or set async_rollouts=False:" in head, message
    assert len(items) == 2, message
    assert items[0].startswith("reward function '<lambda>' cannot be pickled (") and "Define it at module" in items[0]
    assert items[1].startswith("rollout_func 'rollout_func' cannot be pickled (") and "Define it at module" in items[1]
    assert "exact_match_reward" not in message
    assert isinstance(info.value.__cause__, Exception)  # the first pickling error, for TRAPO_DEBUG=1


def test_a_lora_run_sends_only_the_adapter(tokenizer):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_tiny_model(tokenizer, seed=0), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    state = trainable_state(model)
    assert state and all("lora_" in name for name in state)
    assert sum(v.numel() for v in state.values()) < sum(p.numel() for p in model.parameters()) / 10


def test_round_seeds_depend_only_on_seed_rank_and_round():
    assert round_seed(0, 0, 5) == round_seed(0, 0, 5)
    assert len({round_seed(0, 0, 5), round_seed(1, 0, 5), round_seed(0, 1, 5), round_seed(0, 0, 6)}) == 4


def test_steps_covered_follows_least_used_first_serving():
    """The forecast equals what a real replay buffer serves, rounds in flight added when it runs dry (as the trainer
    adds a round when fewer than `n` trajectories are servable)."""
    from trl_trapo.memory.replay import ReplayBuffer, steps_covered

    for n, first, rounds in [(3, 8, []), (3, 5, [4]), (2, 3, [4, 4]), (4, 3, [2, 2, 6])]:
        buffer = ReplayBuffer(max_uses=4)
        buffer.add(trajectories_for_test(first))
        buffer.sample(min(n, first), 0)  # some uses already
        forecast = steps_covered(buffer.use_counts(0), n, rounds, horizon=100)
        queue, steps = list(rounds), 0
        while True:
            while buffer.num_available(0) < n and queue:
                buffer.add(trajectories_for_test(queue.pop(0)))
            if buffer.num_available(0) < n:
                break
            buffer.sample(n, 0)
            steps += 1
        assert forecast == steps, (n, first, rounds)
    assert steps_covered([0, 0, 0, 0], 3, [], horizon=5) == 0
    assert steps_covered([100, 0, 0, 0], 1, [], horizon=5) == 6  # counted up to horizon + 1


def trajectories_for_test(n: int):
    from trl_trapo.memory.replay import Trajectory

    return [
        Trajectory(
            torch.tensor([1, 2]),
            torch.tensor([3]),
            torch.ones(1),
            old_per_token_logps=torch.zeros(1),
            advantages=torch.zeros(1),
        )
        for _ in range(n)
    ]


def test_free_running_mode_trains_with_the_newest_weights(tmp_path, tokenizer, suite):
    """`async_deterministic=False`: weights travel on their own queue and the producer takes the newest it has; the lag
    bound holds all the same (a round can only be fresher than in the deterministic mode)."""
    trainer = async_trainer(tmp_path, tokenizer, suite, async_deterministic=False, max_staleness=2, max_steps=10)
    trainer.train()
    lags = [h["sample/staleness_max"] for h in trainer.state.log_history if "sample/staleness_max" in h]
    assert len(lags) >= 2 and max(lags) <= 2
    assert any("perf/weight_sync_s" in h for h in trainer.state.log_history)


@pytest.mark.slow
def test_a_round_is_taken_before_the_buffer_runs_dry_when_it_would_be_late(tmp_path, tokenizer, suite):
    """When a step's RL rows shrink the buffer outlasts the forecast; the round asked for is then taken when one more
    step would make it later than `max_staleness` — nothing is dropped (the first measurement dropped 21 rounds a
    run at max_staleness 1 without this)."""
    trainer = async_trainer(tmp_path, tokenizer, suite, max_staleness=1)
    source = trainer.rollout_source
    try:
        source.prefetch(8, 0, [0, 0, 0, 0])  # asked for at step 0
        assert not source.round_due(0) and source.round_due(1)  # taken at step 1 at the latest
    finally:
        source.close()
    trainer = async_trainer(tmp_path / "run", tokenizer, suite, max_staleness=1, max_steps=12)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[-1]["sample/dropped_stale_total"] == 0
    assert max(h.get("sample/staleness_max", 0) for h in logs) == 1


def test_activation_checkpointing_on_does_not_stop_the_producer(tmp_path, tokenizer, suite):
    """`TRAPOConfig`'s default `activation_checkpointing=True` (the built-in job turns it off, a user's real-model run
    does not) installs `enable_input_require_grads`' closure on the policy; the producer's copy could not be pickled
    and the first round failed ("Can't pickle local object ... make_inputs_require_grads"). The copy drops what only
    training needs."""
    trainer = async_trainer(tmp_path, tokenizer, suite, activation_checkpointing=True, max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2
    assert any("sample/staleness_mean" in log for log in trainer.state.log_history)


def test_a_policy_with_transformers_capture_hooks_reaches_the_producer(tmp_path, tokenizer, suite):
    """transformers installs its output-capturing hooks (local closures) the first time a forward records hidden
    states; a policy that had such a forward (an evaluation, a probe, a user's own call) could not be pickled into the
    producer ("Can't pickle local object ... output_capturing_hook"). The producer now builds its copy from class,
    config and weights, with the policy's exact outputs and tied weights."""
    import pickle

    from trl_trapo.async_rollouts import PolicyBlueprint

    model = build_tiny_model(tokenizer, seed=0).eval()
    ids = torch.tensor([[1, 5, 7, 9]])
    expected = model(ids, output_hidden_states=True).logits  # installs the hooks
    with pytest.raises(Exception, match="pickle"):
        pickle.dumps(model)
    copy = pickle.loads(pickle.dumps(PolicyBlueprint.of(model))).build()
    torch.testing.assert_close(copy(ids).logits, expected, rtol=0, atol=0)
    tied = model.config.tie_word_embeddings
    assert (copy.get_output_embeddings().weight is copy.get_input_embeddings().weight) == tied

    trainer = async_trainer(tmp_path, tokenizer, suite, model=model, max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2
    assert any("sample/staleness_mean" in log for log in trainer.state.log_history)


GUARD_SCRIPT = (
    "from trl_trapo import TRAPOConfig, TRAPOTrainer\n"
    "from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite\n"
    "tokenizer = build_char_tokenizer()\n"
    "suite = make_task_suite(seed=0, num_pretrain_docs=8, num_sft_per_task=4, num_rl_per_task=4, "
    "num_eval_per_task=1)\n"
    "config = TRAPOConfig(output_dir={out!r}, max_steps=2, per_device_train_batch_size=8, report_to='none', "
    "save_strategy='no', activation_checkpointing=False, max_prompt_length=16, response_length=4, num_generations=4, "
    "async_rollouts=True, use_cpu=True)\n"
    "def build():\n"
    "    return TRAPOTrainer(build_tiny_model(tokenizer, seed=0), reward_funcs=exact_match_reward, args=config, "
    "train_dataset=suite.rl_train, processing_class=tokenizer)\n"
    "{main}"
)


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """`spawn` imports the main script in the producer; a script that trains at import started a second training
    there: 71 lines of tracebacks whose first message was multiprocessing's "bootstrapping phase" (naming
    `freeze_support()`), in a fresh user's trial. The trainer now refuses such a script when it is built, before
    anything is loaded or started: one error naming the script, its line and the guard to write."""
    import subprocess
    import sys

    from conftest import ROOT

    script = tmp_path / "no_guard.py"
    script.write_text(GUARD_SCRIPT.format(out=str(tmp_path / "out"), main="build().train()\n"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error"}
    completed = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output[-3000:]
    errors = [line for line in output.splitlines() if re.match(r"\w*Error\b", line)]
    assert errors == [errors[-1]] and errors[-1].startswith("ValueError: async_rollouts=True"), output[-3000:]
    assert f"({script}) again; this script builds the trainer as it runs (line 8)" in output, output[-3000:]
    assert 'if __name__ == "__main__":' in errors[-1] and "bootstrapping" not in output, output[-3000:]
    assert output.count("Traceback (most recent call last)") == 1, output  # one traceback, not one per process
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "main, refused",
    [
        ('if __name__ == "__main__":\n    print(type(build()).__name__)\n', False),
        ("def main():\n    build()\nif '__main__' == __name__:\n    main()\n", False),
        ("def main():\n    build()\nmain()\n", True),  # a main() called without the guard
    ],
    ids=["guarded", "main-guarded", "main-unguarded"],
)
def test_the_main_guard_check_reads_where_the_script_builds_the_trainer(tmp_path, monkeypatch, main, refused):
    """The check follows the call stack to the script's module level and reads whether that line sits under the
    guard (here the script runs in this process as `__main__`, as `python script.py` runs it)."""
    import runpy

    script = tmp_path / "script.py"
    script.write_text(GUARD_SCRIPT.format(out=str(tmp_path / "out"), main=main))
    monkeypatch.chdir(tmp_path)
    if refused:
        with pytest.raises(
            ValueError, match=r"script\.py\) again; this script builds the trainer as it runs \(line 10\)"
        ):
            runpy.run_path(str(script), run_name="__main__")
    else:
        runpy.run_path(str(script), run_name="__main__")


MAIN_REWARD = (
    "def my_reward(completions, **kwargs):\n"
    "    return [0.0] * len(completions)\n"
    "TRAPOTrainer(build_tiny_model(tokenizer, seed=0), reward_funcs=my_reward, args=config, "
    "train_dataset=suite.rl_train, processing_class=tokenizer)\n"
)


@pytest.mark.parametrize(
    "how, main, message",
    [
        ("stdin", 'if __name__ == "__main__":\n    build()\n', "this script has no file ('<stdin>'"),
        ("-c", MAIN_REWARD, "reward function 'my_reward' is defined in `__main__` of a session that has no script"),
    ],
    ids=["script-on-stdin", "reward-defined-in-python-c"],
)
def test_a_session_the_producer_cannot_rebuild_is_refused_at_construction(tmp_path, how, main, message):
    """`python - < s.py`, or a reward function defined in `python -c` (or a notebook): the producer, started with
    `spawn`, died at its start (it runs the file "<stdin>" again) or looking the function up in its own `__main__`,
    and the ProducerError blamed a missing `if __name__ == "__main__":` guard (a fresh user's trial). Now the trainer
    refuses at construction, saying what the producer cannot rebuild and the two fixes."""
    import subprocess
    import sys

    from conftest import ROOT

    code = GUARD_SCRIPT.format(out=str(tmp_path / "out"), main=main)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error"}
    command = [sys.executable, "-"] if how == "stdin" else [sys.executable, "-c", code]
    completed = subprocess.run(
        command, input=code if how == "stdin" else None, cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    errors = [line for line in output.splitlines() if re.match(r"\w*Error\b", line)]
    assert completed.returncode != 0 and errors, output[-3000:]
    assert errors[-1].startswith("ValueError: async_rollouts=True") and message in errors[-1], output[-3000:]
    assert "async_rollouts=False" in errors[-1] and "ProducerError" not in output


def test_only_what_pickles_by_reference_to_a_fileless_main_is_refused(monkeypatch, tmp_path):
    """Without a main script file a function of `__main__` (also inside a `functools.partial`) is refused; a
    function of an importable module is not, and neither is one of `__main__` when there is a script file."""
    import functools
    import types

    from trl_trapo.async_rollouts import check_picklable

    main = types.ModuleType("__main__")  # `python -c`: no __file__, no __spec__

    def my_reward(completions, **kwargs):
        return [0.0] * len(completions)

    my_reward.__module__, my_reward.__qualname__ = "__main__", "my_reward"
    main.my_reward = my_reward
    monkeypatch.setitem(sys.modules, "__main__", main)
    for func in (my_reward, functools.partial(my_reward, scale=2)):
        with pytest.raises(ValueError, match="is defined in `__main__` of a session that has no script file"):
            check_picklable([func])
    check_picklable([exact_match_reward, functools.partial(exact_match_reward)])
    script = tmp_path / "train.py"
    script.write_text("def my_reward(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    main.__file__ = str(script)  # `python train.py`: spawn runs it again, so its module-level functions exist
    check_picklable([my_reward])


@pytest.mark.parametrize(
    "source, hidden",
    [
        ('if __name__ == "__main__":\n    def local_tool(a): ...\n    class LocalEnv: ...\n', True),
        ("def build():\n    def local_tool(a): ...\n", True),
        ("def local_tool(a): ...\nclass LocalEnv: ...\n", False),
        ("try:\n    from x import local_tool, LocalEnv\nexcept ImportError:\n    pass\n", False),
        ('if True:\n    local_tool = LocalEnv = None\nif __name__ == "__main__":\n    pass\n', False),
    ],
    ids=["under-the-guard", "in-a-function", "module-level", "imported", "assigned-in-an-if"],
)
def test_a_tool_or_environment_defined_under_the_main_guard_is_refused_at_construction(
    monkeypatch, tmp_path, source, hidden
):
    """`python train.py` with a tool or environment class defined under `if __name__ == "__main__":` pickled (by
    reference to `__main__`) but the producer, which runs the script again as `__mp_main__` without that block, died
    looking it up, and the ProducerError said to add the guard the script had (trial 5: W01, W03). Now refused at
    construction by name; what the script defines at its module level passes."""
    import types

    from trl_trapo.async_rollouts import check_picklable

    def local_tool(a: int) -> int:
        return a

    class LocalEnv:
        pass

    main = types.ModuleType("__main__")
    script = tmp_path / "train.py"
    script.write_text(source)
    main.__file__ = str(script)
    for obj in (local_tool, LocalEnv):
        obj.__module__, obj.__qualname__ = "__main__", obj.__name__
        setattr(main, obj.__name__, obj)
    monkeypatch.setitem(sys.modules, "__main__", main)
    for what, obj in (("tool", local_tool), ("environment factory", LocalEnv)):
        if hidden:
            with pytest.raises(ValueError, match=rf"but {what} '{obj.__name__}' is defined in the main script \("):
                check_picklable([obj], what)
        else:
            check_picklable([obj], what)
    if hidden:  # an instance refers to its class by name too
        with pytest.raises(
            ValueError, match=r"define it at module level \(or in a module you import\), or set async_r"
        ):
            check_picklable([LocalEnv()], "environment factory")


@pytest.mark.slow
def test_the_job_exits_when_the_producer_is_far_ahead(tmp_path):
    """With a large `max_staleness` the producer is still writing rounds nobody reads when training ends; it ignores
    SIGTERM, so the `terminate` that used to follow the trainer's request to stop did nothing and the process hung
    after "Done" in multiprocessing's exit handler (a fresh user's run, 3 of 3 times). Now it is killed."""
    import subprocess
    import sys

    from conftest import ROOT

    command = [
        sys.executable, "examples/trapo.py", "--async_rollouts", "--max_staleness", "100", "--max_steps", "8",
        "--eval_strategy", "no", "--output_dir", str(tmp_path / "out"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "Done in" in completed.stdout
    # no queue thread is left inside torch at interpreter exit (trainer or producer: they share stderr)
    assert "terminate called" not in completed.stderr, completed.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------------------
# Weight snapshots on a schedule (DeepSpeed ZeRO-3, issue 40): the producer's weights are read only by the snapshots
# every rank takes together; a round is sampled with the last one. Two processes under ZeRO-3: tests/test_distributed_jobs.py
# ---------------------------------------------------------------------------------------------------------------------
def snapshot_source(trainer, reads: list):
    """An `AsyncRolloutSource(weight_snapshots=True)` on the parts of `trainer`'s own source, whose policy handle
    records every read of the policy (`reads`)."""
    from trl_trapo.async_rollouts import AsyncRolloutSource

    own = trainer.rollout_source

    def policy():
        reads.append(1)
        return trainer.model

    return AsyncRolloutSource(
        policy, own.dataset, own.prompts, own.scorer, own.tokenizer, own.generation_config, own.pad_token_id,
        own.stop_token_ids, own.args, group=own.group, num_mini_batches=own.num_mini_batches, rank=0, device="cpu",
        metrics=trainer.metrics, weight_snapshots=True,
    )  # fmt: skip


def train_a_step(model) -> dict[str, torch.Tensor]:
    """Move every weight a little (an optimizer step, as far as the producer can tell); the weights before it."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return before


def test_the_weight_snapshot_callback_runs_at_train_begin_and_every_weight_sync_steps():
    from types import SimpleNamespace

    from trl_trapo.callbacks import WeightSnapshotCallback

    calls = []
    callback = WeightSnapshotCallback(lambda step, first: calls.append((step, first)), every=2)
    callback.on_train_begin(None, SimpleNamespace(global_step=3), None)  # a resumed run starts at its step
    for step in range(4, 9):
        callback.on_step_end(None, SimpleNamespace(global_step=step), None)
    assert calls == [(3, True), (4, False), (6, False), (8, False)]


def test_rounds_are_sampled_with_the_last_scheduled_snapshot_and_never_read_the_policy(tmp_path, tokenizer, suite):
    """With `weight_snapshots` (ZeRO-3) only `take_weight_snapshot` reads the policy (a gather, every rank together);
    a round asked for with nothing in flight is sampled with the last snapshot, up to `weight_sync_steps - 1` steps
    old, and the producer's log-probs are those of the snapshot's weights, not of the live policy."""
    trainer = async_trainer(tmp_path, tokenizer, suite, weight_sync_steps=2, max_staleness=1)
    reads: list = []
    source = snapshot_source(trainer, reads)
    model = trainer.model
    try:
        source.take_weight_snapshot(0, first=True)  # on_train_begin
        assert len(reads) == 1
        at_0 = train_a_step(model)  # step 1 trained: the live policy is no longer the snapshot's
        sampled = source.sample(8, 1)  # nothing in flight: asked for now, with the snapshot of step 0
        assert sampled.version == 0 and len(reads) == 1  # 1 step old (weight_sync_steps - 1); the policy not read
        live = {n: p.detach().clone() for n, p in model.named_parameters()}
        with torch.no_grad():  # the producer sampled with step 0's weights
            for n, p in model.named_parameters():
                p.copy_(at_0[n])
            own = completion_logps(model, sampled.prompt_ids, sampled.completion_ids, trainer.padding_id,
                                   sampled.temperatures, 64)  # fmt: skip
            for n, p in model.named_parameters():
                p.copy_(live[n])
        for a, b in zip(sampled.sampler_per_token_logps, own):
            torch.testing.assert_close(a, b.float(), atol=1e-5, rtol=0)
        train_a_step(model)  # step 2 trained
        source.take_weight_snapshot(2)  # on_step_end of step 2 (2 % weight_sync_steps == 0)
        assert len(reads) == 2 and source.snapshot[0] == 2
        source.prefetch(8, 2, [0, 0, 0, 0])  # asks ahead (free of any read): the snapshot of step 2 goes first
        assert [r.version for r in source.pending] == [2] and len(reads) == 2
        train_a_step(model)  # step 3 trained, no snapshot (3 % 2 != 0)
        assert source.sample(8, 3).version == 2 and len(reads) == 2  # 1 step late, within max_staleness
        # a checkpoint keeps the last snapshot when it can be older than its step; a resumed run starts from it
        meta, tensors = source.checkpoint_state()
        assert meta["sent_version"] == 2
        kept = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith("producer_weights/")}
        assert kept and all(torch.equal(kept[n], source.snapshot[1][n]) for n in kept)
    finally:
        source.close()
    resumed = snapshot_source(trainer, reads)
    resumed.restore_checkpoint_state(meta, tensors)
    resumed.take_weight_snapshot(3, first=True)  # on_train_begin of the resumed run, at step 3
    assert resumed.snapshot[0] == 2
    assert all(torch.equal(resumed.snapshot[1][n], kept[n]) for n in kept)
    assert any(not torch.equal(p.detach(), kept[n]) for n, p in model.named_parameters() if n in kept)


@pytest.mark.slow
def test_a_script_that_fails_after_starting_the_producer_exits_with_its_error(tmp_path):
    """A user's script that raises after the producer started (rounds queued, nothing closed it): the interpreter's
    exit stops the producer (`atexit`), so the process ends with the error's status. It used to hang for ever in
    multiprocessing's exit handler, whose `terminate` the producer ignores (SIGTERM) before a `join` without a
    timeout."""
    import subprocess
    import sys

    from conftest import ROOT

    command = [sys.executable, "tests/async_exit_worker.py", str(tmp_path / "out"), "crash"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "producer started" in completed.stdout, completed.stderr[-3000:]
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert "RuntimeError: the user's script fails here" in completed.stderr
    assert "terminate called" not in completed.stderr, completed.stderr[-3000:]


def test_tensors_are_moved_to_shared_memory_by_the_sending_thread():
    """A queue's feeder thread must not copy tensors into shared memory (torch releases the GIL there, and a thread
    stopped inside it at interpreter exit aborts the process): `put_shared` shares every tensor of the message, at
    any depth, before the feeder sees it."""
    import queue as stdlib_queue
    from dataclasses import dataclass

    from trl_trapo.async_rollouts import put_shared

    @dataclass
    class Holder:
        tensors: list

    message = ("round", {"a": torch.zeros(3), "b": [torch.ones(2), Holder([torch.arange(4)])]}, 7)
    channel = stdlib_queue.Queue()
    put_shared(channel, message)
    sent = channel.get_nowait()
    assert sent is message
    tensors = [message[1]["a"], message[1]["b"][0], message[1]["b"][1].tensors[0]]
    assert all(t.is_shared() for t in tensors)
    assert [t.tolist() for t in tensors] == [[0.0, 0.0, 0.0], [1.0, 1.0], [0, 1, 2, 3]]  # values kept
