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
from conftest import finished_round
from peft import LoraConfig
from transformers import AutoModelForSequenceClassification, LlamaConfig

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


STEP_MEAN = ("loss/", "policy/", "val/ratio", "val/clipfrac_avg", "distill/divergence_avg")  # by a step's forward
ROLLOUT_MEAN = ("objective/", "completions/", "rewards/", "reward_calls", "rl/")  # measured by generation rounds
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
)
NOT_TRAINING = ("eval_", "eps", "grad_norm", "loss")  # evaluation keys; wall-clock rate; the Trainer's own
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
        )
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            num_labels=1,
            pad_token_id=tokenizer.pad_token_id,
        )
        extra = dict(
            value_model=AutoModelForSequenceClassification.from_config(config),
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
