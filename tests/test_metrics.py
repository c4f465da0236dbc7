# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Every metric of the table in docs/metrics.md means what the table says: a metric nothing measured since the last log is
absent from that log (never 0), and a metric averaged over several steps is the mean over the steps that measured it.

Two runs that differ only in `logging_steps` (1 and 2) train identically; the run logging every step gives each
step's value (or its absence), and the run logging every second step must show, for each key, the mean over the
measuring steps of the pair (a sum for counts, the last value for state), and nothing when neither step measured it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from conftest import finished_round, tiny_critic
from peft import LoraConfig

from trl_trapo import TRAPOTrainer
from trl_trapo.experimental.fewshot import FewShotTRAPOTrainer
from trl_trapo.tasks import build_tiny_model, exact_match_reward


METRICS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def documented_keys() -> list[str]:
    """The keys of docs/metrics.md's "Logged metrics" table (first column, every backticked name)."""
    table = METRICS_PAGE.read_text(encoding="utf-8")
    keys = []
    for line in table.splitlines():
        if line.startswith("| `"):
            keys += re.findall(r"`([^`]+)`", line.split("|")[1])
    return keys


STEP_MEAN = ("loss/", "policy/", "val/ratio", "val/clipfrac_avg", "distill/divergence_avg", "clip_ratio/")  # forward
STEP_KEYS = ("entropy", "kl", "policy_loss")  # TRL GRPO's names of step metrics (whole keys, not prefixes)
ROLLOUT_MEAN = ("objective/", "completions/", "rewards/", "reward_calls", "rl/", "reward", "frac_reward_zero_std")
ROLLOUT_SUM = ("val/num_eos_tokens",)
STATE = (
    "weight/",
    "curriculum/",
    "dare/",
    "schedule/",
    "replay/",
    "sft_pool/",
    "fewshot/",
    "adapter_bank/",
    "exploration/",
    "self_imitation/",
    "distill/sampled_tokens",
    "episode",
    "train/nonfinite_steps",
    "lr",
    "learning_rate",
    "entropy_coef",
)
NOT_TRAINING = ("eval_", "eps", "grad_norm", "loss", "step_time")  # evaluation keys; wall-clock; the Trainer's own
# keys of features these scenarios do not run, with the test that checks what each logs
COVERED_ELSEWHERE = {
    "tools/call_frequency": "tests/test_agents.py (per-round values of scripted tool calls)",
    "tools/failure_frequency": "tests/test_agents.py (per-round values of scripted tool calls)",
    "tools/rollback_frequency": "tests/test_agents.py (per-round values of scripted tool calls)",
    "tools/truncated_frequency": "tests/test_agent_fixes.py (per-round values of scripted turns cut in a tool call)",
    "tools/turns_mean": "tests/test_agents.py (per-round values of scripted tool calls)",
    "completions/mean_env_length": "tests/test_env_mask.py (a source whose rounds carry environment tokens)",
    "self_imitation/searched": "tests/test_exploration.py (a round whose family is searched: the counts it logs)",
    "self_imitation/search_kept": "tests/test_exploration.py (a round whose family is searched: the counts it logs)",
    "sampling/sampling_logp_difference/mean": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/sampling_logp_difference/max": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/importance_sampling_ratio/min": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/importance_sampling_ratio/mean": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/importance_sampling_ratio/max": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/raw_importance_sampling_ratio/min": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/raw_importance_sampling_ratio/mean": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/raw_importance_sampling_ratio/max": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/importance_sampling_ratio/clipped_frac": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
    "sampling/importance_sampling_ratio/masked_frac": "tests/test_rollout_func.py (a rollout_func whose logprobs are off by a known gap)",
}
ASYNC = (
    "tests/test_async_rollouts.py (present exactly in the logs of steps a round arrived at, lag within max_staleness)"
)
COVERED_ELSEWHERE |= {
    key: ASYNC
    for key in (
        "sample/staleness_mean",
        "sample/staleness_max",
        "sample/dropped_stale_total",
        "perf/rollout_wait_s",
        "perf/rollout_wait_share",
        "perf/weight_sync_s",
        "perf/producer_generate_s",
        "perf/producer_reward_s",
    )
}


def kind(key: str) -> str:
    if key in ("val/ratio_var",):
        return "derived"
    if key in STEP_KEYS:
        return "step"
    for name, prefixes in (
        ("sum", ROLLOUT_SUM),
        ("step", STEP_MEAN),
        ("rollout", ROLLOUT_MEAN),
        ("state", STATE),
    ):
        if key.startswith(prefixes) or key in prefixes:
            return name
    return "other"


class CallCountingReward:
    """1 + exact match, and a `log_metric` value on every call (what a reward function reports through TRL's
    contract)."""

    __name__ = "exact_match_reward"

    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, completions, log_metric=None, **kwargs):
        self.calls += 1
        if log_metric is not None:
            log_metric("reward_calls", float(self.calls))
        # 1 + exact match: never 0, so a spurious 0.0 "for nothing measured" cannot pass for a real value
        return [1.0 + r for r in exact_match_reward(prompts=prompts, completions=completions, **kwargs)]


def run(tmp_path, tokenizer, suite, tiny_config, scenario: str, logging_steps: int) -> list[dict]:
    common = dict(max_steps=8, per_device_train_batch_size=4, num_ppo_epochs=4, entropy_coef=0.01, kl_coef=0.05)
    extra = {}
    if scenario == "default":  # guidance and exploration need groups (the extended scenario has a critic)
        # self-imitation counts exact matches (reward 2) of groups where another completion failed (reward 1)
        common.update(
            demonstration_column="answer", exploration=True, self_imitation=True, self_imitation_min_reward=2.0
        )
    if scenario == "distill":  # a teacher and reward-free prompts: the `distill` objective's keys
        from datasets import Dataset

        extra = dict(
            teacher_model=build_tiny_model(tokenizer, seed=1),
            distillation_dataset=Dataset.from_dict({"prompt": suite.rl_train["prompt"]}),
        )
        common.update(curriculum_mixtures=[{"pretrain": 0.25, "sft": 0.25, "rl": 0.25, "distill": 0.25}] * 3)
    if scenario == "extended":
        common.update(
            sft_sampling="prioritized",
            sft_pool_max_bytes=10**7,
            fewshot_mode=True,
            kl_target=1e6,
            kl_coef_range=[0.01, 0.1],
            rl_phase_learning_rate=5e-4,
            late_entropy_coef=0.005,
            adapter_snapshot_steps=2,
            num_generations=1,
            weighting="dare",  # the non-default weighting: its `dare/signal/*` keys (the default is static)
        )
        extra = dict(
            value_model=tiny_critic(tokenizer, max_position_embeddings=64),
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        )
    trainer_class = FewShotTRAPOTrainer if scenario == "extended" else TRAPOTrainer  # few-shot mode: its own trainer
    trainer = trainer_class(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=CallCountingReward(),
        args=tiny_config(tmp_path / f"{scenario}-{logging_steps}", logging_steps=logging_steps, **common),
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        pretrain_dataset=suite.pretrain,
        processing_class=tokenizer,
        **extra,
    )
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer, suite):
    from conftest import make_tiny_config

    root = tmp_path_factory.mktemp("metrics")
    out = {}
    for scenario in ("default", "extended", "distill"):
        every = run(root, tokenizer, suite, make_tiny_config, scenario, 1)
        pairs = run(root, tokenizer, suite, make_tiny_config, scenario, 2)
        out[scenario] = ({h["step"]: h for h in every}, {h["step"]: h for h in pairs})
    return out


def matching(key: str, logs: dict[int, dict]) -> set[str]:
    """The concrete keys a table key stands for (`<objective>`, `<function>`, `<prototype>` expanded)."""
    if "<" not in key:
        return {key}
    pattern = "[^/]+".join(re.escape(part) for part in re.split(r"<[a-z_]+>", key))
    return {k for log in logs.values() for k in log if re.fullmatch(pattern, k)}


@pytest.mark.parametrize("key", documented_keys() + ["reward_calls"])
def test_readme_metric_is_absent_when_unmeasured_and_averaged_over_measuring_steps(runs, key):
    if key.startswith(NOT_TRAINING) and kind(key) == "other":
        pytest.skip(
            f"`{key}` is not a training metric TRAPO aggregates (evaluation, wall-clock rate, or the Trainer's)"
        )
    if key in COVERED_ELSEWHERE:
        pytest.skip(f"`{key}` is logged by a feature these scenarios do not run: {COVERED_ELSEWHERE[key]}")
    concrete = set()
    for scenario, (every, pairs) in runs.items():
        for name in matching(key, every):
            if any(name in log for log in every.values()):
                concrete.add(name)
            for step, log in pairs.items():
                values = [every[s][name] for s in (step - 1, step) if s in every and name in every[s]]
                for value in values:
                    assert math.isfinite(value), (scenario, name, step)
                if kind(name) == "state":  # the value at the log's step
                    assert (name in log) == (name in every[step]), (scenario, name, step)
                    if name in log:
                        assert log[name] == pytest.approx(every[step][name], rel=1e-6), (scenario, name, step)
                elif not values:
                    assert name not in log, f"{scenario}: `{name}` logged at step {step} with nothing measured"
                elif kind(name) == "sum":
                    assert log[name] == pytest.approx(sum(values), rel=1e-5), (scenario, name, step)
                elif kind(name) in ("step", "rollout"):
                    assert log[name] == pytest.approx(sum(values) / len(values), rel=1e-4, abs=1e-6), (
                        scenario,
                        name,
                        step,
                        values,
                    )
                else:
                    assert name in log, (scenario, name, step)
    assert concrete, f"`{key}` never appears in the training logs of any scenario"


def test_a_step_without_an_objectives_rows_does_not_log_its_loss(runs):
    every, _ = runs["default"]
    # 4 rows per step and the early mixture 70/20/10: some steps have no SFT or no RL row
    assert any("loss/sft" not in log for log in every.values())
    assert any("loss/rl" not in log for log in every.values())
    # num_ppo_epochs=4: a generation round serves several steps, the others log no rollout metric
    assert any("objective/scores" not in log for log in every.values())
    assert any("objective/scores" in log for log in every.values())


class SumAccelerator:
    """One process: `reduce` is the identity, as for a single rank."""

    device = "cpu"
    num_processes = 1

    @staticmethod
    def reduce(tensor, reduction="sum"):
        return tensor


def test_zero_variance_groups_are_counted_per_round_and_per_task():
    import torch

    from trl_trapo.metrics import MetricsAccumulator

    metrics = MetricsAccumulator([])
    metrics.track_tasks(["lst", "rev"])
    nan = float("nan")
    # 4 groups of 3: all 0 (flat), mixed, all 1 (flat), one scored + two None (fewer than 2 scores: not counted)
    scores = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.5, nan, nan])
    rows = [{"task": task} for task in ["lst"] * 3 + ["rev"] * 3 + ["rev"] * 3 + ["lst"] * 3]
    completions = [torch.tensor([1, 2])] * 12
    metrics.add_rollouts(finished_round(rows, scores, 3, completions))
    out = metrics.collect(SumAccelerator(), 0.0)
    assert out["rl/zero_variance_groups"] == pytest.approx(2 / 3)
    assert out["rl/zero_variance_groups/lst"] == pytest.approx(1.0)  # its other group had one score only
    assert out["rl/zero_variance_groups/rev"] == pytest.approx(0.5)
    # a critic (groups of one) has no groups: the metric is absent, not 0
    metrics.add_rollouts(finished_round(rows, scores, 1, completions))
    assert not any(key.startswith("rl/") for key in metrics.collect(SumAccelerator(), 0.0))


def test_what_a_reward_function_logs_during_evaluation_never_reaches_a_training_log(tmp_path, tokenizer, suite):
    """A metric that is 1.0 on eval prompts and 0.0 on training prompts: the training logs show 0.0 only, the
    evaluation reports 1.0 as `eval_<name>`, and the sample table (`generate_completions`) logs nowhere."""
    from trl_trapo import TRAPOConfig

    eval_prompts = set(suite.eval["prompt"])

    def reward(prompts, completions, log_metric, log_extra, **kwargs):
        log_metric("on_eval_prompts", float(all(p in eval_prompts for p in prompts)))
        log_extra("seen", list(prompts))
        return exact_match_reward(prompts=prompts, completions=completions, **kwargs)

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        args=TRAPOConfig(
            output_dir=str(tmp_path),
            max_steps=3,
            per_device_train_batch_size=8,
            logging_steps=1,
            eval_strategy="steps",
            eval_steps=1,
            report_to="none",
            save_strategy="no",
            activation_checkpointing=False,
            max_prompt_length=16,
            response_length=4,
            num_generations=4,
        ),
        train_dataset=suite.rl_train,
        eval_dataset=suite.eval,
        processing_class=tokenizer,
    )
    trainer.generate_completions()
    trainer.train()
    training = [log for log in trainer.state.log_history if "loss" in log]
    evaluations = [log for log in trainer.state.log_history if "eval_reward" in log]
    assert len(training) == 3 and len(evaluations) == 3
    logged = [log["on_eval_prompts"] for log in training if "on_eval_prompts" in log]  # steps that generated
    assert logged and all(value == 0.0 for value in logged)
    assert all(log["eval_on_eval_prompts"] == 1.0 for log in evaluations)
    # the last evaluation ran after the last training log: nothing of it waits in the training accumulator
    assert not trainer.metrics.reward_metrics and not trainer.metrics.extra_columns


def test_an_objectives_metrics_are_logged_as_floats_or_refused_by_name():
    """Trial 12's N33: a custom objective whose `metrics()` returned `torch.tensor(n)` put a tensor into the log; the
    first checkpoint's save then failed inside transformers ("Object of type Tensor is not JSON serializable") after
    the model shards were written, naming neither the objective nor `metrics()`. One-element numbers are converted;
    anything else is refused naming the objective and the key."""
    import json

    import numpy
    import torch

    from trl_trapo.metrics import objective_metrics

    class Scripted:
        name = "short"

        def __init__(self, values):
            self.values = values

        def metrics(self):
            return self.values

    got = objective_metrics(Scripted({"short/served": torch.tensor(3), "short/a": numpy.float32(0.5), "short/b": 2}))
    assert got == {"short/served": 3.0, "short/a": 0.5, "short/b": 2.0}
    assert all(type(v) is float for v in got.values()) and json.dumps(got)
    for bad, needle in [
        (torch.ones(2), "metrics()['short/x'] is a Tensor of shape (2,)"),
        ("many", "metrics()['short/x'] is a str"),
        (None, "metrics()['short/x'] is a NoneType"),
    ]:
        with pytest.raises(TypeError) as raised:
            objective_metrics(Scripted({"short/x": bad}))
        assert "Objective 'short'" in str(raised.value) and needle in str(raised.value), str(raised.value)
    with pytest.raises(TypeError, match=r"Objective 'short': metrics\(\) returned a list"):
        objective_metrics(Scripted([1.0]))


# ---------------------------------------------------------------------------------------------------------------------
# TRL 1.16 GRPOTrainer's keys, with its definitions (trial 13's N01; the same script under TRL: tests/test_grpo.py)
# ---------------------------------------------------------------------------------------------------------------------
class OneRank(SumAccelerator):
    """One process, with `gather` (the step extremes gather each step's value of every rank)."""

    @staticmethod
    def gather(tensor):
        return tensor


def trl_round(rewards, group, lengths, truncated, per_func):
    """TRL 1.16 `GRPOTrainer`'s per-round metrics, as its `_generate_and_score_completions` and
    `_generate_single_turn` compute them (`scale_rewards="group"`), on one process."""
    import torch
    from trl.trainer.utils import nanstd

    std_rewards = nanstd(rewards.view(-1, group), dim=1).repeat_interleave(group, dim=0)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    terminated = lengths[~truncated]
    if len(terminated) == 0:
        terminated = torch.zeros(1)
    out = {
        "reward": torch.nanmean(rewards).item(),
        "reward_std": nanstd(rewards).item(),
        "frac_reward_zero_std": is_std_zero.float().mean().item(),
        "completions/min_length": lengths.float().min().item(),
        "completions/max_length": lengths.float().max().item(),
        "completions/mean_terminated_length": terminated.float().mean().item(),
        "completions/min_terminated_length": terminated.float().min().item(),
        "completions/max_terminated_length": terminated.float().max().item(),
    }
    for i, name in enumerate(("f", "g")):
        out[f"rewards/{name}/std"] = nanstd(per_func[:, i]).item()
    return out


def test_a_round_logs_trl_grpos_keys_with_trls_definitions():
    """Two rounds with known rewards and lengths, one log: each of TRL GRPOTrainer's per-round keys is the value its
    code computes for each round (`trl_round`), averaged over the rounds as its `log` averages (NaN left out), and
    `num_tokens` counts every prompt and policy token since the start. Before: none of these keys was logged."""
    import dataclasses

    import torch

    from trl_trapo.metrics import MetricsAccumulator

    nan = float("nan")

    def make_round(rewards, lengths, truncated, per_func, penalty=0.0):
        n = len(rewards)
        rewards, truncated = torch.tensor(rewards), torch.tensor(truncated)
        batch = finished_round(
            [{}] * n,
            rewards - penalty * truncated.float(),  # the scores TRAPO trains on carry the missing-stop penalty
            2,
            [torch.arange(4, 4 + k) for k in lengths],
            per_func=torch.tensor(per_func),
            is_truncated=truncated,
        )
        return dataclasses.replace(batch, rewards=rewards, prompt_ids=[torch.tensor([5, 6, 7, 8])] * n)

    # groups of 2: (1, 1) flat, (0, 1), (0.5, unscored): one score, its std is NaN, not 0; no stop in rows 1 and 3
    first = make_round(
        [1.0, 1.0, 0.0, 1.0, 0.5, nan],
        [3, 5, 2, 7, 4, 4],
        [False, True, False, True, False, False],
        [[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.5, 0.0], [nan, nan]],
        penalty=0.5,
    )
    # both groups flat; nothing stopped (TRL logs 0 for the terminated lengths); `g` scored nothing (its std: NaN)
    second = make_round(
        [2.0, 2.0, 3.0, 3.0], [6, 6, 1, 2], [True] * 4, [[2.0, nan], [2.0, nan], [3.0, nan], [3.0, nan]]
    )
    metrics = MetricsAccumulator(["f", "g"])
    metrics.add_rollouts(first)
    metrics.add_rollouts(second)
    out = metrics.collect(OneRank(), 0.0)
    by_hand = {
        "reward": (0.7 + 2.5) / 2,  # before the penalty: TRL has none
        "reward_std": (math.sqrt(0.8 / 4) + math.sqrt(1.0 / 3)) / 2,
        "frac_reward_zero_std": (2 / 6 + 1.0) / 2,
        "completions/min_length": (2 + 1) / 2,
        "completions/max_length": (7 + 6) / 2,
        "completions/mean_terminated_length": (3.25 + 0.0) / 2,
        "completions/min_terminated_length": (2 + 0.0) / 2,
        "completions/max_terminated_length": (4 + 0.0) / 2,
        "rewards/f/std": (math.sqrt(0.8 / 4) + math.sqrt(1.0 / 3)) / 2,
        "rewards/g/std": 0.0,  # the second round's NaN is left out, as TRL's `log` leaves it out
        "num_tokens": 6 * 4 + 25 + 4 * 4 + 15,
    }
    assert {key: out.get(key) for key in by_hand} == pytest.approx(by_hand, abs=1e-9)
    # the same definitions as TRL's code, round by round
    for batch in (first, second):
        alone = MetricsAccumulator(["f", "g"])
        alone.add_rollouts(batch)
        got = alone.collect(OneRank(), 0.0)
        lengths = torch.tensor([float(c.numel()) for c in batch.completion_ids])
        expected = trl_round(batch.rewards, 2, lengths, batch.is_truncated, batch.per_func)
        assert {k: got.get(k, nan) for k in expected} == pytest.approx(expected, abs=1e-6, nan_ok=True)
    # `num_tokens` is cumulative: the next log adds its round to the run's count
    metrics.add_rollouts(second)
    assert metrics.collect(OneRank(), 0.0)["num_tokens"] == 80 + 31
    # scale_rewards="batch": TRL asks whether the whole round's std is 0 (the same flag for each completion)
    batch_scaled = MetricsAccumulator(["f", "g"], scale_rewards="batch")
    batch_scaled.add_rollouts(second)  # its groups are flat, the round is not
    flat = make_round([1.0] * 4, [1] * 4, [False] * 4, [[1.0, 1.0]] * 4)
    batch_scaled.add_rollouts(flat)
    assert batch_scaled.collect(OneRank(), 0.0)["frac_reward_zero_std"] == pytest.approx((0.0 + 1.0) / 2)
    # groups of one (a critic): no group-relative advantage, no `frac_reward_zero_std`
    critic = MetricsAccumulator(["f", "g"])
    critic.add_rollouts(dataclasses.replace(second, group=1))
    assert "frac_reward_zero_std" not in critic.collect(OneRank(), 0.0)


def test_clip_ratios_are_trls_regions_and_their_extremes_are_averaged_over_steps():
    """`clip_ratio/*` (TRL GRPOTrainer's): low = ratio < 1 - eps with a negative advantage, high = ratio > 1 + eps with a
    positive one, region = either (the tokens PPO's clip cuts: `policy/clipfrac_avg`'s); the per-row least low /
    most high fraction is each step's extreme over its micro-batches, averaged over the steps. Rows without a counted
    token take no part; under truncated importance sampling (no clip) none is logged."""
    import torch

    from trl_trapo.losses import RLTermCounts, clip_ratio_stats, clipped_policy_loss, rl_term
    from trl_trapo.metrics import MetricsAccumulator

    # row 0: negative advantage, one ratio below 0.8 of 3 counted tokens (1.3 is above 1.2 but its advantage is
    # negative); row 1: positive advantage, two of 3 above 1.2; row 2 has no counted token (its 0.1 must not count)
    ratio = torch.tensor([[0.7, 1.0, 1.3, 5.0], [0.7, 1.25, 1.3, 5.0], [0.1, 0.1, 0.1, 0.1]])
    advantages = torch.tensor([[-1.0], [1.0], [-1.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    stats = clip_ratio_stats(ratio, advantages, mask, 6.0, 0.2)
    assert {k: float(v) for k, v in stats.items()} == pytest.approx(
        {
            "clip_ratio/low_mean": 1 / 6,
            "clip_ratio/high_mean": 2 / 6,
            "clip_ratio/region_mean": 3 / 6,
            "clip_ratio/low_min": 0.0,  # row 1 has no low-clipped token
            "clip_ratio/high_max": 2 / 3,
        }
    )
    logps = torch.log(ratio)
    clipped = clipped_policy_loss(logps, torch.zeros_like(logps), advantages, 0.2).is_clipped
    assert float((clipped.float() * mask).sum() / 6) == pytest.approx(float(stats["clip_ratio/region_mean"]))
    # an empty row does not pull the least fraction to 0; no counted row at all: +inf / -inf (nothing measured)
    alone = clip_ratio_stats(ratio[[0, 2]], advantages[[0, 2]], mask[[0, 2]], 3.0, 0.2)
    assert float(alone["clip_ratio/low_min"]) == pytest.approx(1 / 3)
    empty = clip_ratio_stats(ratio[[2]], advantages[[2]], mask[[2]], 1.0, 0.2)
    assert (float(empty["clip_ratio/low_min"]), float(empty["clip_ratio/high_max"])) == (math.inf, -math.inf)
    # the loss reports them with the clipped surrogate only
    counts = RLTermCounts(6.0, 2.0, 1.0, 6.0)
    common = dict(loss_type="grpo", response_length=4, cliprange=0.2, importance_weights=torch.ones(3))
    term = rl_term(logps, torch.zeros_like(logps), advantages.expand(3, 4), mask, counts, **common)
    assert float(term.stats["clip_ratio/high_max"]) == pytest.approx(2 / 3)
    capped = rl_term(logps, torch.zeros_like(logps), advantages.expand(3, 4), mask, counts, **common,
                     importance_sampling_cap=2.0)  # fmt: skip
    assert not any(key.startswith("clip_ratio/") for key in capped.stats)
    # the accumulator: each step's extreme over its micro-batches, averaged over the steps that measured one
    metrics = MetricsAccumulator([])
    for step in ([(0.5, 0.25), (0.25, 0.75)], [(0.0, 0.5)], [(math.inf, -math.inf)]):  # the last: nothing counted
        for low_min, high_max in step:
            metrics.add("clip_ratio/low_min", torch.tensor(low_min))
            metrics.add("clip_ratio/high_max", torch.tensor(high_max))
        metrics.add("clip_ratio/low_mean", torch.tensor(0.1))
        metrics.end_step()
    out = metrics.collect(OneRank(), 0.0)
    assert out["clip_ratio/low_min"] == pytest.approx((0.25 + 0.0) / 2)
    assert out["clip_ratio/high_max"] == pytest.approx((0.75 + 0.5) / 2)
    assert out["clip_ratio/low_mean"] == pytest.approx(0.1)
    assert "clip_ratio/low_min" not in metrics.collect(OneRank(), 0.0)  # nothing since the last log


def test_policy_loss_and_entropy_coef_are_logged_with_an_entropy_bonus_only():
    """TRL GRPOTrainer logs `policy_loss` (its loss before the entropy bonus, the KL term included) and `entropy_coef`
    only when it has an entropy bonus; so do we: `policy_loss` - coef * mean entropy is the term as optimised."""
    import torch

    from trl_trapo import TRAPOConfig
    from trl_trapo.losses import RLTermCounts, aggregate_rl_loss, rl_term
    from trl_trapo.schedules import RLSchedules

    generator = torch.Generator().manual_seed(0)
    logps, old = -torch.rand(2, 3, generator=generator), -torch.rand(2, 3, generator=generator)
    advantages, kl = torch.tensor([[1.0] * 3, [-1.0] * 3]), torch.rand(2, 3, generator=generator)
    entropy, mask = torch.rand(2, 3, generator=generator), torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    common = dict(loss_type="grpo", response_length=3, cliprange=0.2, importance_weights=torch.ones(2))
    common |= dict(kl=kl, kl_coef_in_loss=0.1, entropy=entropy)
    counts = RLTermCounts(5.0, 2.0, 1.0, 5.0)
    bonus = rl_term(logps, old, advantages, mask, counts, **common, entropy_coef=0.05)
    entropy_term = aggregate_rl_loss(entropy, mask, "grpo", 5.0, 2.0, 3, 1.0)
    assert float(bonus.stats["policy_loss"] - 0.05 * entropy_term) == pytest.approx(float(bonus.value), abs=1e-6)
    assert float(bonus.stats["policy_loss"]) != pytest.approx(float(bonus.stats["loss/policy_avg"]))  # KL included
    assert "policy_loss" not in rl_term(logps, old, advantages, mask, counts, **common, entropy_coef=0.0).stats
    config = dict(output_dir="unused", report_to="none")
    assert RLSchedules(TRAPOConfig(**config, entropy_coef=0.01), None).metrics(0)["entropy_coef"] == 0.01
    assert "entropy_coef" not in RLSchedules(TRAPOConfig(**config), None).metrics(0)


def test_step_time_is_a_steps_host_time_averaged_over_ranks():
    """TRL GRPOTrainer's `step_time`: host seconds of one optimizer step's work (from building its rows to its last
    backward), averaged over the steps of a log and over ranks (their sum would grow with the number of ranks); a
    step's extremes are taken over every rank's."""
    import time

    import torch

    from trl_trapo.metrics import MetricsAccumulator

    class TwoEqualRanks(OneRank):
        """Two processes whose ranks hold the same values: `reduce` sums them, `gather` stacks them."""

        num_processes = 2

        @staticmethod
        def reduce(tensor, reduction="sum"):
            return tensor * 2

        @staticmethod
        def gather(tensor):
            return torch.cat([tensor, tensor])

    metrics = MetricsAccumulator([])
    for pause in (0.2, 0.4):
        metrics.start_step()
        time.sleep(pause)
        metrics.add("clip_ratio/high_max", torch.tensor(pause))
        metrics.end_step()
    metrics.end_step()  # a step nothing started (a hand-driven accumulator): no time, nor any extreme
    out = metrics.collect(TwoEqualRanks(), 0.0)
    assert 0.3 <= out["step_time"] < 0.55  # the mean of 0.2 s and 0.4 s (and scheduling), not twice it (0.6 s)
    assert out["clip_ratio/high_max"] == pytest.approx(0.3)
