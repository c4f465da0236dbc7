"""Composition on 2 CPU processes: round statistics over every rank's share, on-policy distillation (DDP, ZeRO-3), a
TRL GRPO agent script (`tools=` / `environment_factory=`, ranks that run different numbers of turns), asynchronous
rollouts (a producer per rank; exact resume; ZeRO-3 weight snapshots) and a TRL GRPO vision-language script on each
backend: the ranks stay identical. Split from tests/test_distributed.py so that the default run's two xdist workers
share the two-process launches (`--dist loadfile` gives a file to one worker).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from two_processes import (
    BACKENDS,
    EVAL_CAP,
    JOB_ARGS,
    RANK_LOCAL_PREFIXES,
    RUNTIME_KEYS,
    check,
    launch,
    records,
)


pytestmark = pytest.mark.distributed


# ---------------------------------------------------------------------------------------------------------------------
# Statistics a generation round defines cover the whole round, every rank's share
# ---------------------------------------------------------------------------------------------------------------------
def test_round_statistics_cover_every_ranks_share(tmp_path):
    """`scale_rewards="batch"`, `whiten_rewards` / `whiten_advantages`, exploration's stuck fractions, the rollout
    metrics (`objective/scores`, `completions/clipped_ratio`, TRL GRPO's `reward_std`, ...) and the adaptive KL
    window, computed on 2 processes from each rank's share, equal the one-process computation over the whole round
    (fp32 rounding of a different summation order: 1e-5 for advantages, 1e-6 for metrics); `whiten_per_process`
    (PPOConfig's) equals each rank's share whitened alone."""
    check(launch("multi_gpu.yaml", "tests/statistics_worker.py", [str(tmp_path)], timeout=600))
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name in ("batch_std", "whiten", "whiten_per_process"):
            got, expected = record[name], record[f"{name}/reference"]
            assert len(got) == len(expected)
            for row, reference in zip(got, expected):
                assert row == pytest.approx(reference, abs=1e-5), (rank, name, got, expected)
        assert record["exploration"] == record["exploration/reference"]
        # float32 per-row sums added in another order: 1e-6
        assert record["metrics"] == pytest.approx(record["metrics/reference"], abs=1e-6), record["metrics"]
        assert record["kl_coef"] == pytest.approx(record["kl_coef/reference"], abs=1e-12)
        assert {"objective/scores", "completions/clipped_ratio", "rl/zero_variance_groups"} <= set(record["metrics"])
        # TRL GRPO's per-round keys: each round's shares merged over ranks (rank 1's std alone is not the round's)
        trl_keys = {"reward", "reward_std", "frac_reward_zero_std", "rewards/r/std", "num_tokens"}
        trl_keys |= {f"completions/{s}_length" for s in ("min", "max", "mean_terminated", "max_terminated")}
        assert trl_keys <= set(record["metrics"]), record["metrics"]
    # the per-rank computation would differ: rank 1's batch std alone is not the round's, and rank 0 alone would
    # heat family "a" where the round does not (what the old code did)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for name in ("batch_std", "whiten"):
        alone = [value for row in rank1[f"{name}/alone"] for value in row]
        reference = [value for row in rank1[f"{name}/reference"] for value in row]
        assert max(abs(a - b) for a, b in zip(alone, reference)) > 0.1, name
    assert rank0["exploration/alone"]["levels"] == {"a": 1} and rank0["exploration"]["levels"] == {}


# ---------------------------------------------------------------------------------------------------------------------
# On-policy distillation on two processes (issue 22)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend, prompts", [("ddp", False), ("zero3", True)])
@pytest.mark.slow
def test_distillation_on_two_processes_keeps_the_ranks_identical(tmp_path, backend, prompts):
    """The main job with a teacher under DDP (distilling on the RL rollouts), and under DeepSpeed ZeRO-3 with the
    teacher prepared like the reference policy (partitioned, frozen) and reward-free distillation prompts (each rank
    samples its own prompts in a collective generate): both ranks log the same `distill` weight, loss and DARE state
    (the probe's logit-gradient sums are all-reduced like the others') and end with the same weights."""
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, make_task_suite

    if backend != "ddp":
        pytest.importorskip("deepspeed")
    tokenizer = build_char_tokenizer()
    teacher = tmp_path / "teacher"
    build_tiny_model(tokenizer, seed=1).save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    output = tmp_path / "out"
    args = ["--max_steps", "4", "--logging_steps", "1", "--eval_strategy", "no", *EVAL_CAP, "--report_to", "none"]
    args += ["--weighting", "dare", "--dare_update_interval", "1"]  # DARE's probe sums (the default is static)
    args += ["--teacher_model_name_or_path", str(teacher), "--output_dir", str(output)]
    if prompts:
        path = tmp_path / "prompts.jsonl"
        rows = make_task_suite(seed=0).rl_train["prompt"][:40]
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows))
        args += ["--distillation_dataset_name", str(path)]
    check(launch(BACKENDS[backend][0], "tests/distributed_job.py", args))
    ranks = records(output)
    first, second = (r["log_history"] for r in ranks)
    assert len(first) == len(second) and ranks[0]["world_size"] == 2
    for a, b in zip(first, second):
        assert {k: v for k, v in a.items() if k not in RUNTIME_KEYS and not k.startswith(RANK_LOCAL_PREFIXES)} == {
            k: v for k, v in b.items() if k not in RUNTIME_KEYS and not k.startswith(RANK_LOCAL_PREFIXES)
        }
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]
    train_logs = [h for h in first if "loss" in h]
    assert all("weight/distill" in h and "dare/factor/distill" in h for h in train_logs)
    assert any("loss/distill" in h for h in train_logs)
    if prompts:  # the rows came from the reward-free prompts, sampled on both ranks
        assert train_logs[-1]["distill/sampled_tokens"] > 0


# ---------------------------------------------------------------------------------------------------------------------
# A TRL GRPO agent script (tools= / environment_factory=) on two processes
# ---------------------------------------------------------------------------------------------------------------------
TOOL_METRICS = ("tools/call_frequency", "tools/failure_frequency", "tools/rollback_frequency", "tools/turns_mean")


def round_wide(rounds: list[dict]) -> dict[str, float]:
    """TRL's tool metrics of one round from every rank's sums (`rounds`: one rank's record of the round each)."""
    total = {k: sum(r[k] for r in rounds) for k in ("rollouts", "calls", "failures", "rolled_back", "turns")}
    return {
        "tools/call_frequency": total["calls"] / total["rollouts"],
        "tools/failure_frequency": total["failures"] / total["calls"] if total["calls"] else 0.0,
        "tools/rollback_frequency": total["rolled_back"] / total["rollouts"],
        "tools/turns_mean": total["turns"] / total["rollouts"],
    }


@pytest.mark.parametrize(
    "backend, mode",
    [
        ("ddp", "tools"),
        # default-run sibling: test_a_grpo_agent_script_trains_on_two_processes[ddp-tools]
        pytest.param("ddp", "environment", marks=pytest.mark.slow),
        pytest.param("zero3", "tools", marks=pytest.mark.slow),  # ~50 s
    ],
)
@pytest.mark.slow
def test_a_grpo_agent_script_trains_on_two_processes(tmp_path, backend, mode):
    """A `GRPOTrainer(tools=...)` script with only the import changed (tests/distributed_tools_job.py: a sync, an
    async and a failing tool, or the same three as an environment with one instance per rollout) trains 4 steps on
    2 processes. The calls are forced and rank 1's rollouts make one more than rank 0's, so the ranks run different
    numbers of turns in every round (the model generates every turn): the job ends on both ranks (under ZeRO-3 it
    hung in the extra turn's weight gather before the turns were run in lockstep), with identical weights, changed by
    training; the tools ran (async results, failures counted as error results, not crashes); and the `tools/*`
    metrics are TRL's definitions over the whole round, every rank's rollouts, the same on both ranks
    (`tools/failure_frequency` was the mean of the ranks' own ratios), as is every other logged value."""
    if backend != "ddp":
        pytest.importorskip("deepspeed")
    config, distributed_type = BACKENDS[backend]
    check(launch(config, "tests/distributed_tools_job.py", ["--mode", mode, "--output_dir", str(tmp_path)], 300))
    ranks = records(tmp_path)
    tools = [json.loads((tmp_path / "ranks" / f"tools{r}.json").read_text()) for r in (0, 1)]
    for record in ranks:
        assert (record["world_size"], record["distributed_type"], record["global_step"]) == (2, distributed_type, 4)
    assert tools[0]["initial_digest"] == tools[1]["initial_digest"]
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"] != tools[0]["initial_digest"]

    # every step drew a round on both ranks; rank 1 ran more turns and calls than rank 0 in every round
    rounds = [t["rounds"] for t in tools]
    assert [r["step"] for r in rounds[0]] == [r["step"] for r in rounds[1]] == [0, 1, 2, 3]
    for mine, theirs in zip(*rounds):
        assert mine["rollouts"] == theirs["rollouts"] == 8
        assert mine["turns"] < theirs["turns"] and mine["calls"] < theirs["calls"], (mine, theirs)
    results: dict[str, list[str]] = {}
    for rank_rounds in rounds:
        for round_ in rank_rounds:
            for name, contents in round_["tool_messages"].items():
                results.setdefault(name, []).extend(contents)
    assert set(results) == {"multiply", "divide", "add"}
    assert results["multiply"] and all(c.isdigit() for c in results["multiply"])  # sync
    assert results["add"] and all(c.isdigit() for c in results["add"])  # async, rank 1's second call
    assert not any(round_["tool_messages"].get("add") for round_ in rounds[0])
    assert results["divide"] and set(results["divide"]) == {"error"}  # b=0: raised, returned as an error result
    assert sum(r["failures"] for rank_rounds in rounds for r in rank_rounds) >= len(results["divide"])

    # the logs agree on both ranks, key by key, value by value (the tool metrics included)
    first, second = (r["log_history"] for r in ranks)
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert {k: v for k, v in a.items() if k not in RUNTIME_KEYS} == {
            k: v for k, v in b.items() if k not in RUNTIME_KEYS
        }
    # each log (every 2 steps) averages its rounds' values, each over every rank's rollouts of the round
    logs = [h for h in first if "loss" in h]
    assert [h["step"] for h in logs] == [2, 4]
    distinguishes = False
    for log in logs:
        window = [(mine, theirs) for mine, theirs in zip(*rounds) if log["step"] - 2 <= mine["step"] < log["step"]]
        assert len(window) == 2
        for key in TOOL_METRICS:
            expected = sum(round_wide(pair)[key] for pair in window) / len(window)
            assert log[key] == pytest.approx(expected, abs=1e-12), (key, log[key], expected)
        per_rank_mean = sum(round_wide([r])["tools/failure_frequency"] for pair in window for r in pair) / 4
        distinguishes |= abs(per_rank_mean - log["tools/failure_frequency"]) > 1e-3
        assert log["tools/call_frequency"] > 0 and log["tools/failure_frequency"] > 0
        assert "rewards/answer_length/mean" in log
        if mode == "environment":  # the environment's get_reward, one instance per rollout
            assert log["rewards/Calculator/mean"] > 0
    assert distinguishes  # the mean of the ranks' own failure ratios would have differed

    # evaluation rolls the held-out prompts out through the tool loop on both ranks, in lockstep (it ended, also
    # with rank 1's shard empty), and reports the tool metrics over both ranks' rollouts, the same on each
    def measured(evaluations):  # without transformers' speed metrics: each rank times its own evaluation
        return {
            name: {k: v for k, v in metrics.items() if not k.endswith(("_runtime", "_per_second"))}
            for name, metrics in evaluations.items()
        }

    assert measured(tools[0]["eval"]) == measured(tools[1]["eval"])
    evaluations = tools[0]["eval"]
    assert evaluations["one"]["eval_tools/call_frequency"] == 1.0  # rank 0's one rollout, its forced call
    # rank 0's two rollouts call once each, rank 1's one twice (its extra `add`): 4 calls over 3 rollouts
    assert evaluations["three"]["eval_tools/call_frequency"] == pytest.approx(4 / 3)
    assert evaluations["three"]["eval_tools/turns_mean"] > evaluations["one"]["eval_tools/turns_mean"]


# ---------------------------------------------------------------------------------------------------------------------
# Asynchronous rollouts on two processes (issue 24): a producer per rank, identical ranks, exact resume
# ---------------------------------------------------------------------------------------------------------------------
ASYNC_ARGS = [*JOB_ARGS, "--async_rollouts", "--max_staleness", "2"]


def async_job_on_two_processes(output_dir: Path) -> list[dict]:
    """The built-in job with `--async_rollouts` on 2 processes; both ranks' records, checked to agree."""
    check(launch("multi_gpu.yaml", "tests/distributed_job.py", [*ASYNC_ARGS, "--output_dir", str(output_dir)]))
    ranks = records(output_dir)
    for a, b in zip(*(r["log_history"] for r in ranks)):
        timing = RUNTIME_KEYS | {k for k in a if k.startswith("perf/")}
        local = {k for k in a if k.startswith(RANK_LOCAL_PREFIXES)}
        assert {k: v for k, v in a.items() if k not in timing | local} == {
            k: v for k, v in b.items() if k not in timing | local
        }
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]
    return ranks


@pytest.mark.slow
def test_async_rollouts_on_two_processes_keep_the_ranks_identical(tmp_path):
    """The built-in job with `--async_rollouts` (a producer process per rank, rounds asked for ahead): both ranks end
    with the same weights and logs (timing metrics apart), and every round arrived within `max_staleness`."""
    ranks = async_job_on_two_processes(tmp_path)
    train_logs = [h for h in ranks[0]["log_history"] if "loss" in h]
    lags = [h["sample/staleness_max"] for h in train_logs if "sample/staleness_max" in h]  # logs with an arrival
    assert lags and max(lags) <= 2
    assert max(lags) >= 1  # rounds were asked for ahead
    for r in (0, 1):
        assert (tmp_path / "checkpoint-6" / "trapo" / f"rank{r}.complete.json").exists()


@pytest.mark.slow  # two 2-process jobs, ~90 s; the kill -9 resume of an async run is in tests/test_durability.py
def test_async_rollouts_on_two_processes_resume_exactly(tmp_path):
    """Resuming a 2-process async run from the middle (the rounds in flight kept in each rank's checkpoint) gives the
    uninterrupted run's weights on both ranks."""
    args = ASYNC_ARGS
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    ranks = async_job_on_two_processes(full)
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-6", resumed / "checkpoint-6")
    check(
        launch(
            "multi_gpu.yaml",
            "tests/distributed_job.py",
            [*args, "--output_dir", str(resumed), "--resume_from_checkpoint", str(resumed / "checkpoint-6")],
        )
    )
    again = records(resumed)
    assert again[0]["param_digest"] == again[1]["param_digest"] == ranks[0]["param_digest"]


@pytest.mark.slow  # ~50 s on an idle 2-core machine (minutes beside other jobs: DeepSpeed's start on CPU)
def test_async_rollouts_under_zero3_take_the_weights_on_a_schedule_every_rank_reaches(tmp_path):
    """Under ZeRO-3 reading the weights gathers the partitioned parameters (a collective), while each rank asks for
    rounds at its own steps: the producer's weights are snapshots every rank takes together, at the start of training
    and every `weight_sync_steps` optimizer steps (`WeightSnapshotCallback`), and a round is sampled with the last
    one. The run trains to the end on both ranks, with identical weights and logs, the snapshots exactly on the
    schedule (`perf/weight_sync_s` in the logs of steps 1, 2, 4, 6, 8 and no other) and every round within
    `max_staleness`. Refused at construction before this (issue 40)."""
    pytest.importorskip("deepspeed")
    steps, every = 8, 2
    args = ["--max_steps", str(steps), "--logging_steps", "1", "--eval_strategy", "no", *EVAL_CAP,
            "--async_rollouts", "--max_staleness", "2", "--weight_sync_steps", str(every),
            "--output_dir", str(tmp_path)]  # fmt: skip
    check(launch("deepspeed_zero3.yaml", "tests/distributed_job.py", args))
    ranks = records(tmp_path)
    assert [r["global_step"] for r in ranks] == [steps, steps]
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]
    for a, b in zip(*(r["log_history"] for r in ranks)):
        timing = RUNTIME_KEYS | {k for k in a if k.startswith("perf/")}
        local = {k for k in a if k.startswith(RANK_LOCAL_PREFIXES)}
        assert {k: v for k, v in a.items() if k not in timing | local} == {
            k: v for k, v in b.items() if k not in timing | local
        }
    train_logs = [h for h in ranks[0]["log_history"] if "loss" in h]
    assert [h["step"] for h in train_logs] == list(range(1, steps + 1))
    # the first log holds the snapshot of on_train_begin (and, if the first step trained RL rows, no other send)
    synced = [h["step"] for h in train_logs if "perf/weight_sync_s" in h]
    assert synced == [1, *range(every, steps + 1, every)], synced
    lags = [h["sample/staleness_max"] for h in train_logs if "sample/staleness_max" in h]
    assert len(lags) >= 2 and max(lags) <= 2, lags
    assert train_logs[-1]["sample/dropped_stale_total"] == 0
    assert any(h.get("loss/rl", 0) != 0 for h in train_logs)


@pytest.mark.slow  # two 2-process ZeRO-3 jobs, minutes on a loaded machine
def test_async_rollouts_under_zero3_resume_exactly_from_between_two_snapshots(tmp_path):
    """A checkpoint taken between two scheduled snapshots (step 4, `weight_sync_steps=3`: rounds are sampled with step
    3's weights until step 6) keeps that snapshot; the resumed run samples its rounds with it (`max_staleness=0`: each
    round is asked for when it is consumed, here at the last step), as the uninterrupted run did, and ends with the
    same weights on both ranks. Sampling with the resumed step's weights instead gives other weights."""
    pytest.importorskip("deepspeed")
    args = ["--max_steps", "6", "--logging_steps", "1", "--eval_strategy", "no", *EVAL_CAP,
            "--save_strategy", "steps", "--save_steps", "4", "--async_rollouts", "--max_staleness", "0",
            "--stale_rollouts", "downweight", "--weight_sync_steps", "3"]  # fmt: skip
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    check(launch("deepspeed_zero3.yaml", "tests/distributed_job.py", [*args, "--output_dir", str(full)]))
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-4", resumed / "checkpoint-4")
    resume = ["--output_dir", str(resumed), "--resume_from_checkpoint", str(resumed / "checkpoint-4")]
    check(launch("deepspeed_zero3.yaml", "tests/distributed_job.py", [*args, *resume]))
    first, again = records(full), records(resumed)
    logs = [h for h in first[0]["log_history"] if "loss" in h]
    assert "sample/staleness_max" in logs[-1]  # a round consumed after the checkpoint, before the next snapshot
    assert first[0]["param_digest"] == first[1]["param_digest"]
    assert again[0]["param_digest"] == again[1]["param_digest"] == first[0]["param_digest"]


# ---------------------------------------------------------------------------------------------------------------------
# A TRL GRPO vision-language script on two processes (issue 25)
# ---------------------------------------------------------------------------------------------------------------------
def check_vlm_job(output_dir: Path, distributed_type: str, steps: int) -> list[dict]:
    """The ranks of a tests/distributed_vlm_job.py run trained `steps` steps together: identical logs (with the RL
    loss) and weights, changed by training. Returns the ranks' `vlm<r>.json` records."""
    ranks = records(output_dir)
    vlm = [json.loads((output_dir / "ranks" / f"vlm{r}.json").read_text()) for r in (0, 1)]
    for record in ranks:
        assert (record["world_size"], record["distributed_type"]) == (2, distributed_type)
    first, second = (r["log_history"] for r in ranks)
    assert len(first) == len(second) and any("loss/rl" in h for h in first)
    for a, b in zip(first, second):
        assert {k: v for k, v in a.items() if k not in RUNTIME_KEYS and not k.startswith(RANK_LOCAL_PREFIXES)} == {
            k: v for k, v in b.items() if k not in RUNTIME_KEYS and not k.startswith(RANK_LOCAL_PREFIXES)
        }
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]
    assert vlm[0]["initial_digest"] == vlm[1]["initial_digest"] != vlm[0]["final_digest"] == vlm[1]["final_digest"]
    assert ranks[0]["global_step"] == steps
    return vlm


@pytest.mark.slow
def test_a_grpo_vlm_script_trains_on_two_processes(tmp_path):
    """A `GRPOTrainer` VLM script with only the import changed (tests/distributed_vlm_job.py: the tiny LLaVA, prompts
    with 0, 1 and 2 images) trains 3 steps under DDP on 2 processes: each rank's share of the round carries its own
    images into every forward, and the ranks end with identical weights, changed by training, and identical logs."""
    check(launch("multi_gpu.yaml", "tests/distributed_vlm_job.py", ["--output_dir", str(tmp_path)], 300))
    check_vlm_job(tmp_path, "DistributedType.MULTI_CPU", 3)


@pytest.mark.parametrize(
    "config, options",
    [
        # transformers turns DDP's own unused-parameter search on when activation checkpointing is off: the zero term
        # over the vision encoder would mark its parameters ready twice ("post_layernorm.bias has been marked as
        # ready twice"); a rank with text-only micro-batches relies on DDP's search
        ("multi_gpu.yaml", ["--gradient_checkpointing", "false", "--dataset", "mixed"]),
        # ZeRO-1/2 reduce gradient buckets together: the zero term keeps a rank with text-only micro-batches in step
        ("deepspeed_zero2.yaml", ["--dataset", "mixed"]),
        # ZeRO-3 builds the LLaVA partitioned: its language model's class, first imported then, lost the kernels
        # `__init__` ("'LlamaAttention' object has no attribute '_kernel_funcs'" at the reference's first forward),
        # and the zero term cannot index partitioned parameters
        ("deepspeed_zero3.yaml", []),
    ],
    ids=["ddp-no-checkpointing", "zero2", "zero3"],
)
@pytest.mark.slow
def test_a_grpo_vlm_script_trains_on_each_backend(tmp_path, config, options):
    """The VLM script trains 2 steps on 2 processes under DDP without activation checkpointing, ZeRO-2 and ZeRO-3 (each
    ~15-25 s), the ranks agreeing on logs and weights; with `--dataset mixed` one rank's micro-batches have no image
    while the other rank's have."""
    args = ["--output_dir", str(tmp_path), "--max_steps", "2", *options]
    output = check(launch(config, "tests/distributed_vlm_job.py", args, 300))
    # the script does not end the process group: TRAPO's exit handler did, on both ranks (no gloo abort at exit)
    assert output.count("process group at exit: False") == 2, output[-3000:]
    distributed_type = "DistributedType.MULTI_CPU" if config == "multi_gpu.yaml" else "DistributedType.DEEPSPEED"
    vlm = check_vlm_job(tmp_path, distributed_type, 2)
    images = [record["images_per_micro_batch"] for record in vlm]
    if "mixed" in options:
        assert any((a == 0) != (b == 0) for a, b in zip(*images)), images
    else:  # ZeRO-3 gathers a module's parameters when it runs: every rank must run the vision encoder (docs/vision.md)
        assert all(n > 0 for rank in images for n in rank), images


def test_restore_kernel_functions_gives_a_module_its_own_kernel_functions_back():
    """What ZeRO-3 leaves a model built after it undid a kernelized class's `__init__` (attention modules without
    `_kernel_funcs`, simulated here on one process) fails at its forward; restored from a whole model of the same
    classes it computes what the whole one computes, each module with wrappers of its own; a second call changes
    nothing."""
    pytest.importorskip("kernels")
    from trl_trapo.distributed import KERNEL_FUNCS, restore_kernel_functions
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    whole, damaged = build_tiny_model(tokenizer, seed=0), build_tiny_model(tokenizer, seed=0)
    attention = [module for module in damaged.modules() if KERNEL_FUNCS in vars(module)]
    assert attention  # transformers' Llama attention is kernelized when `kernels` is installed
    for module in attention:
        del vars(module)[KERNEL_FUNCS]
    ids = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(AttributeError, match="_kernel_funcs"):
        damaged(ids)
    assert restore_kernel_functions(whole, None, damaged) == len(attention)
    torch.testing.assert_close(damaged(ids).logits, whole(ids).logits, rtol=0, atol=0)
    wrappers = [f for m in [*whole.modules(), *damaged.modules()] for f in vars(m).get(KERNEL_FUNCS, {}).values()]
    assert len({id(f) for f in wrappers}) == len(wrappers) == 2 * len(attention)
    assert restore_kernel_functions(whole, damaged) == 0
