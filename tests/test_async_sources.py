# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The asynchronous producer runs the run's own rollout source (trl_trapo/executor.py): `async_rollouts=True` with
`tools=`, `environment_factory=` and TRL's `rollout_func` trains, with the asynchronous properties applied to the
multi-turn rows: the lag bound (`sample/staleness_max`), the decoupled correction (the producer's behaviour log-probs
as `sampler_per_token_logps`, `sampling/*` logged) and the environment mask (tool-output tokens masked in the rows the
trainer receives and trains on).

The tiny random model never writes a tool call, so its first turn is forced: [`ToolCallingModel`] (a subclass of the
tiny model's class, module level so the producer rebuilds it from its config) puts a logits processor in front of the
ones `generate` gets, which writes `add(1, 2)` as the first turn and `3` after the tool's result. Everything else (the
tool loop, the masks, the weights, the queues) is the library's, in the producer process.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch
from conftest import RecordingTRAPOTrainer, add, make_tiny_config, tool_tokenizer, trained_rows
from datasets import Dataset
from transformers import LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

from trl_trapo import TRAPOConfig
from trl_trapo.data import tokenize_prompt
from trl_trapo.rollout import generate
from trl_trapo.tasks import build_tiny_model


CALL = '<c>{"name":"add","arguments":{"a":1,"b":2}}</c>'
ANSWER = "3"
TOOL_OUTPUT = "=3;"  # what the rollout_func's "tool" writes (env_mask 0)
RL = 2  # the RL objective's index


class ForceCalls(LogitsProcessor):
    """Forces each row's assistant turn: `CALL` before any tool result, `ANSWER` after one, each ended by EOS."""

    def __init__(self):
        self.tok = tool_tokenizer()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        forced = torch.full_like(scores, torch.finfo(scores.dtype).min)
        for row in range(input_ids.shape[0]):
            text = self.tok.decode(input_ids[row])
            head, _, written = text.rpartition("\na:")
            target = ANSWER if "</s>t:" in head.split("\nu:")[-1] else CALL
            if target.startswith(written) and len(written) < len(target):
                token = self.tok.convert_tokens_to_ids(target[len(written)])
            else:
                token = self.tok.eos_token_id
            forced[row, token] = 0.0
        return forced


class ToolCallingModel(LlamaForCausalLM):
    """The tiny model, whose sampled turns are forced by [`ForceCalls`] (training forwards are the model's own)."""

    def generate(self, *args, logits_processor=None, **kwargs):
        processors = LogitsProcessorList([ForceCalls(), *(logits_processor or [])])
        return super().generate(*args, logits_processor=processors, **kwargs)


def tool_calling_model() -> ToolCallingModel:
    tiny = build_tiny_model(tool_tokenizer(), seed=0)
    model = ToolCallingModel(tiny.config)
    model.load_state_dict(tiny.state_dict())
    model.generation_config = tiny.generation_config
    return model


class Adder:
    """An environment whose `add` is the tool; its reward counts the calls it served (in the producer's process)."""

    def reset(self, **row) -> None:
        self.calls = 0

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.calls += 1
        return a + b


class RewardedAdder(Adder):
    def get_reward(self) -> float:
        return float(self.calls)


def answered(completions, **kwargs) -> list[float]:
    """1 when the last assistant message is `3`."""
    return [float(c[-1]["content"].strip() == ANSWER) for c in completions]


def one_turn_and_a_tool(prompts, trainer) -> dict:
    """A TRL-style `rollout_func`: one sampled turn with the trainer's model, then a tool's output (env_mask 0)."""
    tok, args = trainer.processing_class, trainer.args
    policy = trainer.accelerator.unwrap_model(trainer.model)
    prompt_ids = [tokenize_prompt(p, tok) for p in prompts]
    turns = generate(policy, prompt_ids, trainer.generation_config, trainer.padding_id, None, args.temperature)
    tool = tok.encode(TOOL_OUTPUT, add_special_tokens=False)
    out = {"prompt_ids": prompt_ids, "completion_ids": [], "logprobs": [], "env_mask": []}
    for turn, logps in zip(turns["completion_ids"], turns["old_per_token_logps"]):
        out["completion_ids"].append(turn.tolist() + tool)
        out["logprobs"].append(logps.tolist() + [0.0] * len(tool))
        out["env_mask"].append([1] * turn.numel() + [0] * len(tool))
    return out


def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(c)) / 10 for c in completions]


def prompts(n: int = 4) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"add 1 2={i}"}] for i in range(n)]})


def async_args(output_dir, **overrides) -> TRAPOConfig:
    """`TINY_CONFIG` sampled in a producer process one version behind at most, with room for a tool call, its result
    and an answer (prompts of up to 40 tokens, 64-token responses); then `overrides`."""
    settings = dict(max_prompt_length=40, response_length=64, async_rollouts=True, max_staleness=1)
    return make_tiny_config(output_dir, **{**settings, **overrides})


def rl_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


def assert_masked_tool_output(trainer, output: str, policy_text: str) -> None:
    """Some trained RL row holds `output` (the environment's tokens) with mask 0 on each of its tokens, and
    `policy_text` (the policy's) with mask 1. `mask[j]` counts the prediction of token j + 1."""
    tok = tool_tokenizer()
    found = 0
    for input_ids, mask in trained_rows(trainer.seen_batches, RL):
        text = tok.decode(input_ids)
        if output not in text or policy_text not in text:
            continue
        ids = input_ids.tolist()
        out_ids = tok.encode(output, add_special_tokens=False)
        start = next(i for i in range(len(ids)) if ids[i : i + len(out_ids)] == out_ids)
        policy_ids = tok.encode(policy_text, add_special_tokens=False)
        policy_start = next(i for i in range(len(ids)) if ids[i : i + len(policy_ids)] == policy_ids)
        assert mask[start - 1 : start - 1 + len(out_ids)].eq(0).all(), text
        assert mask[policy_start - 1 : policy_start - 1 + len(policy_ids)].eq(1).all(), text
        found += 1
    assert found, "no trained RL row holds the tool's output"


@pytest.mark.parametrize("mode", ["tools", "environment_factory"])
@pytest.mark.slow
def test_async_tool_calling_trains_with_staleness_the_decoupled_correction_and_the_tool_mask(tmp_path, mode):
    tok = tool_tokenizer()
    agent = dict(tools=[add]) if mode == "tools" else dict(environment_factory=RewardedAdder)
    trainer = RecordingTRAPOTrainer(
        tool_calling_model(),
        reward_funcs=answered,
        args=async_args(tmp_path),
        train_dataset=prompts(),
        processing_class=tok,
        **agent,
    )
    source = trainer.rollout_source
    assert source.source.kind == "tools"  # the producer runs the tool-calling source
    try:  # one round straight from the producer: what the trainer receives
        source.prefetch(8, 0, [0, 0, 0, 0])  # asked for ahead, then kept whole by a checkpoint
        meta, tensors = source.checkpoint_state()
        sampled = source.sample(8, 0)
    finally:
        source.close()
    if mode == "tools":  # a resumed run consumes the same multi-turn round: masks, rendered prompts, rows
        resumed = RecordingTRAPOTrainer(
            tool_calling_model(),
            reward_funcs=answered,
            args=async_args(tmp_path / "resumed"),
            train_dataset=prompts(),
            processing_class=tok,
            **agent,
        ).rollout_source
        resumed.restore_checkpoint_state(json.loads(json.dumps(meta)), tensors)  # as the checkpoint file holds it
        again = resumed.sample(8, 0)
        for name in ("completion_ids", "completion_mask", "sampler_per_token_logps", "prompt_ids"):
            assert all(torch.equal(a, b) for a, b in zip(getattr(again, name), getattr(sampled, name))), name
        assert [e["prompt"] for e in again.examples] == [e["prompt"] for e in sampled.examples]
        assert torch.equal(again.scores, sampled.scores) and again.version == sampled.version
    texts = [tok.decode(c) for c in sampled.completion_ids]
    assert all(t.startswith(CALL) and "t:3" in t for t in texts), texts  # the tool ran, in the producer
    assert sampled.completion_mask is not None
    for mask, logps in zip(sampled.completion_mask, sampled.sampler_per_token_logps):
        assert 0 < mask.sum() < mask.numel()  # the policy's turns 1, the tool's output 0
        assert logps.isfinite().all() and bool((logps[mask == 0] == 0).all())
        assert bool((logps[mask == 1] <= 0).all())  # the producer's behaviour log-probs (decoupled: the sampler's)
    assert sampled.old_per_token_logps is None and sampled.version == 0
    # `answered` (1), plus the environment's `get_reward` (1 call) computed in the producer
    assert sampled.scores is not None and sampled.scores.eq(2.0 if mode == "environment_factory" else 1.0).all()

    trainer.train()
    logs = rl_logs(trainer)
    arrivals = [h for h in logs if "sample/staleness_max" in h]
    assert arrivals and max(h["sample/staleness_max"] for h in arrivals) <= 1
    assert all(h["tools/call_frequency"] == 1.0 for h in arrivals), arrivals  # tools/* from the producer
    assert any("sampling/importance_sampling_ratio/mean" in h for h in logs)  # the decoupled correction applied
    if mode == "environment_factory":  # the environment's reward, computed in the producer
        assert all(h["rewards/RewardedAdder/mean"] == 1.0 for h in arrivals)
    assert_masked_tool_output(trainer, "t:3", CALL)


@pytest.mark.slow
def test_async_rollout_func_trains_with_staleness_the_correction_and_env_mask(tmp_path):
    tok = tool_tokenizer()
    trainer = RecordingTRAPOTrainer(
        build_tiny_model(tok, seed=0),
        reward_funcs=length_reward,
        args=async_args(tmp_path, response_length=6),
        train_dataset=Dataset.from_dict({"prompt": [f"add 1 {i}=" for i in range(4)]}),
        processing_class=tok,
        rollout_func=one_turn_and_a_tool,
    )
    assert trainer.rollout_source.source.kind == "rollout_func"
    trainer.train()
    logs = rl_logs(trainer)
    arrivals = [h for h in logs if "sample/staleness_max" in h]
    assert arrivals and max(h["sample/staleness_max"] for h in arrivals) <= 1
    # the function's log-probs are the sampler's: corrected against the trainer's own
    assert any("sampling/importance_sampling_ratio/mean" in h for h in logs)
    found = 0
    for input_ids, mask in trained_rows(trainer.seen_batches, RL):
        ids = input_ids.tolist()
        out_ids = tok.encode(TOOL_OUTPUT, add_special_tokens=False)
        if ids[-len(out_ids) :] == out_ids:  # the tool's output ends every completion: mask 0 there
            assert mask[-len(out_ids) :].eq(0).all() and mask[-len(out_ids) - 1].eq(1)
            found += 1
    assert found


def test_tools_environment_factories_and_rollout_funcs_that_cannot_reach_the_producer_are_named(tmp_path):
    tok = tool_tokenizer()

    def local_tool(a: int) -> int:
        """A tool the producer cannot import.

        Args:
            a: Any integer.
        """
        return a

    class LocalEnvironment(Adder):
        pass

    common = dict(reward_funcs=answered, train_dataset=prompts(), processing_class=tok)
    for agent, message in (
        (dict(tools=[local_tool]), "tool 'local_tool' cannot be pickled"),
        (dict(environment_factory=LocalEnvironment), "environment factory 'LocalEnvironment' cannot be pickled"),
    ):
        with pytest.raises(ValueError, match=f"runs the .* in a producer process, but {message}.*module level"):
            RecordingTRAPOTrainer(tool_calling_model(), args=async_args(tmp_path), **agent, **common)


def test_a_checkpoint_refuses_rows_json_cannot_hold_naming_the_column():
    from trl_trapo.async_rollouts import check_json_rows

    check_json_rows([{"prompt": [{"role": "user", "content": "x"}], "prompt_ids": [1, 2], "calls": 1.0}])
    with pytest.raises(ValueError, match="column 'calls' holds a Tensor.*`.tolist\\(\\)`"):
        check_json_rows([{"prompt": "x", "calls": torch.tensor([1.0])}])


class HangingAdder(Adder):
    """An environment whose tool hangs (a network call without a timeout) after, on the run's first call, the cluster
    sends the trainer SIGTERM (once: `TRAPO_TEST_SIGTERM_MARKER` names the file that says it was sent)."""

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        marker = os.environ.get("TRAPO_TEST_SIGTERM_MARKER")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except (FileExistsError, TypeError):
            pass
        else:
            os.kill(os.getppid(), signal.SIGTERM)  # the producer's parent: the trainer's process
        time.sleep(60)
        return a + b


def test_sigterm_while_a_producers_tool_hangs_saves_the_checkpoint_and_stops(tmp_path, monkeypatch):
    """Trial 12's N07 with async_rollouts=True: the producer ignores SIGTERM and runs the tools, and the trainer's
    step (and its checkpoint's wait for the rounds in flight) waited on the hung calls. The trainer passes its stop on
    to the producer, whose tool calls are then abandoned: the step finishes, `checkpoint-1` is saved."""
    from trl_trapo.interrupts import TrainingInterrupted

    monkeypatch.setenv("TRAPO_TEST_SIGTERM_MARKER", str(tmp_path / "sigterm-sent"))  # the spawned producer's too

    def outside(signum, frame):
        raise AssertionError("SIGTERM reached the handler from before train()")

    previous = signal.signal(signal.SIGTERM, outside)
    try:
        trainer = RecordingTRAPOTrainer(
            tool_calling_model(),
            reward_funcs=answered,
            args=async_args(tmp_path / "run", max_steps=3),
            train_dataset=prompts(),
            processing_class=tool_tokenizer(),
            environment_factory=HangingAdder,
        )
        start = time.perf_counter()
        with pytest.raises(TrainingInterrupted) as stopped:
            trainer.train()
        seconds = time.perf_counter() - start
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seconds < 50, seconds  # not the tool's 60 s
    assert (tmp_path / "sigterm-sent").exists()
    assert stopped.value.interruption.step == 1 and os.path.isdir(stopped.value.interruption.checkpoint)
    logged = [h for h in trainer.state.log_history if "tools/failure_frequency" in h]
    assert logged and logged[0]["tools/failure_frequency"] == 1.0  # every call abandoned (or not run)
