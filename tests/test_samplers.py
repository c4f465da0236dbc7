# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The sampler stage (trl_trapo/samplers.py): per-row temperatures, `max_new_tokens` and images reach the engine that
samples, so the pairs once refused for a gap in the vLLM sampler train: tools / environments x vLLM, exploration x
vLLM, images x vLLM, rollout_func x vLLM, and the tool loop at exploration's and few-shot mode's temperatures.

vLLM needs a GPU and is not installed here: TRL's `VLLMGeneration` is replaced by the suite's stand-in
(`FakeVLLMGeneration`, tests/test_vllm_option.py), in server and colocate mode alike, and transformers' sampler is
made to fail, so every completion of these runs comes from the stand-in. `scripts/benchmarks/gpu_check.py` runs the
real vLLM (`--case vllm_tools`, `--case vllm_images`)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import add, tool_tokenizer
from datasets import Dataset
from test_agents import FirstPrompts, call, ids, make_source, prompts_dataset, tiny_args
from test_vllm_option import FakeVLLMGeneration
from transformers import AutoModelForCausalLM

import trl_trapo.samplers as samplers
from trl_trapo import TRAPOTrainer
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model


@pytest.fixture
def stand_in(monkeypatch):
    """Install `FakeVLLMGeneration` (or a subclass set later) for TRL's `VLLMGeneration`, and make transformers'
    sampler fail: whatever is sampled in the test was sampled by the stand-in."""
    import trl.generation.vllm_generation as vllm_generation

    import trl_trapo.rollout as rollout

    def install(cls=FakeVLLMGeneration):
        monkeypatch.setattr(rollout, "is_vllm_available", lambda: True)
        monkeypatch.setattr(vllm_generation, "VLLMGeneration", cls)
        cls.instances.clear()

    def refuse(*args, **kwargs):
        raise AssertionError("transformers' generate sampled a rollout; use_vllm=True should have")

    monkeypatch.setattr(samplers, "generate", refuse)
    install()
    return install


def saved(tmp_path, model, tokenizer):
    """The model and tokenizer saved and reloaded (vLLM loads the model from its directory)."""
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "model")


# ---------------------------------------------------------------------------------------------------------------------
# tools / environments x vLLM
# ---------------------------------------------------------------------------------------------------------------------
class ScriptedVLLM(FakeVLLMGeneration):
    """vLLM that calls `add` on a prompt (the random tiny model never would) and answers `ok` once a tool result is in
    the context; each token's log-prob is -1. Records each call's prompts like the stand-in."""

    tokenizer = None

    def generate(self, prompts, images, num_generations):
        self.calls.append((len(prompts), num_generations))
        self.requests.append(
            ([list(p) for p in prompts], num_generations, self.temperature, self.max_completion_length)
        )
        tok = ScriptedVLLM.tokenizer
        completions = []
        for prompt in prompts:
            text = "ok</s>" if "t:" in tok.decode(prompt) else call("add", '{"a":2,"b":3}') + "</s>"
            completions.append(ids(tok, text)[: self.max_completion_length])
        logprobs = [[[-1.0] for _ in c] for c in completions]
        return prompts, completions, logprobs, None


@pytest.mark.parametrize("mode", ["server", "colocate"])
def test_tools_sample_every_turn_through_vllm(tmp_path, stand_in, mode):
    """Every turn of the tool loop is sampled by vLLM, continuing from the conversation's token ids, with the budget
    the rollout has left as `max_tokens`; the trainer computes the behaviour log-probs and weighs vLLM's against them
    on the policy's tokens only."""
    tok = tool_tokenizer()
    ScriptedVLLM.tokenizer = tok
    stand_in(ScriptedVLLM)
    model = saved(tmp_path, build_tiny_model(tok, seed=0), tok)
    trainer = TRAPOTrainer(
        model,
        reward_funcs=lambda completions, **kw: [float(len(c[-1]["content"]) % 2) for c in completions],
        args=tiny_args(tmp_path, use_vllm=True, vllm_mode=mode, response_length=64, max_steps=1),
        train_dataset=prompts_dataset(),
        processing_class=tok,
        tools=[add],
    )
    trainer.train()
    (fake,) = ScriptedVLLM.instances
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/turns_mean"] == 2.0
    # one vLLM call per turn: the prompts, then each conversation with its tool result, as token ids
    first, second = fake.requests[0], fake.requests[1]
    assert len(fake.requests) == 2 and len(first[0]) == len(second[0]) == 8
    assert all(b[: len(a)] == a and "t:" in tok.decode(b[len(a) :]) for a, b in zip(first[0], second[0]))
    assert first[3] == 64 and second[3] < 64  # max_tokens: the whole budget, then what the first turn left
    assert fake.syncs == 1  # weights pushed once for the step, not per turn
    rows = trainer.replay.sample(8, step=1)
    for row in rows:
        mask = row.completion_mask.bool()
        assert not bool(mask.all())  # the tool result's tokens count in no loss
        assert row.sampler_log_ratio is not None and bool((row.sampler_log_ratio[~mask] == 0).all())
        assert bool((row.old_per_token_logps[mask] < 0).all())  # the trainer's, not the engine's -1
        assert not torch.allclose(row.old_per_token_logps[mask], torch.full((int(mask.sum()),), -1.0))


# ---------------------------------------------------------------------------------------------------------------------
# exploration x vLLM, exploration x tools, few-shot x tools
# ---------------------------------------------------------------------------------------------------------------------
def family_rows(n=8):
    """Text prompts of two task families, `a` and `b`, alternating."""
    tok = build_char_tokenizer()
    return tok, Dataset.from_dict(
        {"prompt": [f"q{i}=" for i in range(n)], "task": ["a", "b"] * (n // 2), "answer": ["1"] * n}
    )


def test_exploration_samples_each_family_at_its_temperature_on_vllm(tmp_path, stand_in):
    """exploration=True with vLLM: one call per distinct temperature, each family's prompts at its own, groups kept
    as vLLM's n; the trajectories are trained at the temperature they were sampled at."""
    tok, dataset = family_rows(2)  # a round of 2 prompts holds both
    model = saved(tmp_path, build_tiny_model(tok, seed=0), tok)
    trainer = TRAPOTrainer(
        model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=tiny_args(
            tmp_path, use_vllm=True, exploration=True, max_prompt_length=8, response_length=4, temperature=0.9
        ),
        train_dataset=dataset,
        processing_class=tok,
    )
    trainer.exploration.levels["b"] = 3  # family b is sampled 3 steps hotter
    hot = trainer.exploration.temperature_of("b")
    assert hot == pytest.approx(1.2)
    trainer.collect_rollouts(8, step=0)
    (fake,) = FakeVLLMGeneration.instances
    by_temperature = {round(t, 6): (prompts, n) for prompts, n, t, _, _ in fake.requests}
    assert set(by_temperature) == {0.9, 1.2}
    task_of = {tuple(trainer.rollout_source.dataset[i]["prompt_ids"]): trainer.rollout_source.dataset[i]["task"]
               for i in range(len(dataset))}  # fmt: skip
    for temperature, (prompts, n) in by_temperature.items():
        assert n == 4  # whole groups of one prompt: vLLM's n
        assert {task_of[tuple(p)] for p in prompts} == {"a" if temperature == 0.9 else "b"}
    # each trajectory's own temperature (None: the configured one)
    temperatures = sorted(round(t.temperature or 0.9, 6) for t in trainer.replay.sample(8, step=0))
    assert temperatures == [0.9] * 4 + [1.2] * 4


class RecordingEngine:
    """`RolloutEngine.sample` for the tool loop: every row answers `ok`; records each call's temperature argument."""

    def __init__(self, tok):
        self.tok, self.temperatures = tok, []

    def sample(self, examples, group, step, temperature, max_new_tokens=None):
        from trl_trapo.sources import SampledRound

        self.temperatures.append(temperature)
        turns = [ids(self.tok, "ok</s>") for _ in examples]
        return SampledRound(
            [{"prompt_ids": e["prompt_ids"]} for e in examples],
            turns,
            version=step,
            old_per_token_logps=[torch.full((len(t),), -0.5) for t in turns],
            prompt_ids=[e["prompt_ids"] for e in examples],
        )


def test_the_tool_loop_samples_each_row_at_its_family_temperature(tmp_path):
    """tools x exploration=True: every turn of a rollout is sampled at its family's temperature, and its trajectory
    is trained at it."""
    tok = tool_tokenizer()
    rows = prompts_dataset(2, task=["a", "b"], answer=["1"] * 2)  # a round of 2 prompts holds both families
    trainer = TRAPOTrainer(
        build_tiny_model(tok, seed=0),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=tiny_args(tmp_path, exploration=True, num_generations=2, per_device_train_batch_size=4, temperature=1.0),
        train_dataset=rows,
        processing_class=tok,
        tools=[add],
    )
    assert trainer.exploration is not None
    trainer.exploration.levels["b"] = 2
    engine = RecordingEngine(tok)
    trainer.rollout_source.engine = engine
    trainer.collect_rollouts(4, step=0)
    (temperatures,) = engine.temperatures  # one turn: nobody called a tool
    assert sorted(round(float(t), 6) for t in temperatures) == [1.0, 1.0, 1.2, 1.2]
    trained = sorted(round(t.temperature or 1.0, 6) for t in trainer.replay.sample(4, step=0))
    assert trained == [1.0, 1.0, 1.2, 1.2]


def test_the_tool_loop_samples_at_the_round_temperature_of_the_prompt_pool(tool_tok):
    """tools x few-shot: the round's temperature is the prompt pool's (`rollout_temperature`, which few-shot mode
    anneals), every turn is sampled at it and the round says so (its trajectories are trained at it)."""

    class AnnealedPrompts(FirstPrompts):
        def rollout_temperature(self, default):
            return 0.5 * default

    def script(context):
        return call("add", '{"a":1,"b":1}') + "</s>" if "t:" not in context else "ok</s>"

    source, engine, _ = make_source(tool_tok, script, tools=[add], temperature=0.8)
    source.prompts = AnnealedPrompts()
    seen = []
    sample = engine.sample

    def recording(examples, group, step, temperature, max_new_tokens=None):
        seen.append(temperature)
        return sample(examples, group, step, temperature, max_new_tokens)

    engine.sample = recording
    sampled = source.sample(4, step=3)
    assert len(seen) == 2 and all(math.isclose(float(t), 0.4) for t in seen)  # both turns
    assert torch.allclose(torch.as_tensor(sampled.temperatures), torch.full((4,), 0.4))


# ---------------------------------------------------------------------------------------------------------------------
# images x vLLM
# ---------------------------------------------------------------------------------------------------------------------
def test_images_reach_the_vllm_stand_in_forward(tmp_path, stand_in):
    """use_vllm=True with image prompts: each prompt's images go to vLLM (TRL's `images=`), and the stand-in's
    forward ran the vision tower on exactly those images while sampling."""
    from transformers import AutoModelForImageTextToText

    from trl_trapo.tasks.vision import build_tiny_vlm, build_vlm_processor, make_visual_task_suite

    processor = build_vlm_processor()
    suite = make_visual_task_suite(
        seed=0, num_pretrain_docs=4, num_sft_per_task=2, num_rl_per_task=4, num_eval_per_task=1, num_eval_captions=1
    )
    build_tiny_vlm(processor, seed=0).save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "model")
    tower = next(m for name, m in model.named_modules() if name.split(".")[-1] == "vision_tower")
    seen = []
    tower.register_forward_hook(lambda module, args, output: seen.append(args[0].detach().clone()))

    class Recording(FakeVLLMGeneration):
        def generate(self, prompts, images, num_generations):
            start = len(seen)
            out = super().generate(prompts, images, num_generations)
            self.forwards = getattr(self, "forwards", []) + [(images, seen[start:])]
            return out

    stand_in(Recording)
    rows = suite.rl_train.filter(lambda images: len(images) > 0, input_columns="images").select(range(4))
    trainer = TRAPOTrainer(
        model,
        reward_funcs=suite.reward_funcs,
        args=tiny_args(
            tmp_path,
            use_vllm=True,
            num_generations=2,
            per_device_train_batch_size=4,
            max_prompt_length=80,
            response_length=3,
        ),
        train_dataset=rows,
        processing_class=processor,
    )
    trainer.collect_rollouts(4, step=0)
    (fake,) = Recording.instances
    assert fake.forwards
    for images, forwards in fake.forwards:
        assert images is not None and all(i for i in images)
        expected = [processor.image_processor(images=row, return_tensors="pt")["pixel_values"] for row in images]
        tower_inputs = [f for f in forwards if f.shape[-1] == expected[0].shape[-1]]
        assert len(tower_inputs) >= len(images)  # the vision tower ran for every prompt
        for want in expected:  # and on that prompt's images
            assert any(f.shape == want.shape and torch.allclose(f, want.to(f.dtype)) for f in tower_inputs)
    assert all(t.model_inputs for t in trainer.replay.sample(4, step=0))  # trained with the images too


# ---------------------------------------------------------------------------------------------------------------------
# rollout_func x vLLM
# ---------------------------------------------------------------------------------------------------------------------
def test_a_rollout_func_samples_through_the_trainers_vllm_after_a_weight_sync(tmp_path, stand_in):
    """As TRL's GRPOTrainer: the weights are pushed before each call of the function (once per step), which samples
    through `trainer.vllm_generation`."""
    from trl_trapo.data import tokenize_prompt

    tok, dataset = family_rows()
    model = saved(tmp_path, build_tiny_model(tok, seed=0), tok)
    syncs_seen = []

    def rollout_func(prompts, trainer):
        generation = trainer.vllm_generation
        syncs_seen.append(generation.syncs)
        prompt_ids = [tokenize_prompt(p, tok) for p in prompts]
        _, completion_ids, logprobs, _ = generation.generate(prompts=prompt_ids, images=None, num_generations=1)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": [[lp[0] for lp in row] for row in logprobs],
        }

    trainer = TRAPOTrainer(
        model,
        reward_funcs=lambda completions, **kw: [float(len(c) % 2) for c in completions],
        args=tiny_args(tmp_path, use_vllm=True, max_prompt_length=8, response_length=4),
        train_dataset=dataset,
        processing_class=tok,
        rollout_func=rollout_func,
    )
    trainer.train()  # one round feeds both steps (replay)
    trainer.collect_rollouts(8, step=2)
    trainer.collect_rollouts(8, step=2)
    (fake,) = FakeVLLMGeneration.instances
    assert trainer.state.global_step == 2
    assert syncs_seen == [1, 2, 2]  # pushed before the first call of each step, not again within a step
    assert len(fake.calls) == 3 and trainer.vllm_generation is fake


def test_vllm_generation_is_none_without_vllm(tmp_path):
    tok, dataset = family_rows()
    trainer = TRAPOTrainer(
        build_tiny_model(tok, seed=0),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=tiny_args(tmp_path, max_prompt_length=8, response_length=4),
        train_dataset=dataset,
        processing_class=tok,
    )
    assert trainer.vllm_generation is None


# ---------------------------------------------------------------------------------------------------------------------
# the vLLM server sampler on several processes
# ---------------------------------------------------------------------------------------------------------------------
class EchoVLLM:
    """A `VLLMGenerator`: each completion is `[temperature x 10, max_new_tokens, its prompt's first id]`; records
    each call."""

    tensor_parallel_size = 1
    mode = "server"

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, group, step, temperature=None, max_new_tokens=None, images=None):
        self.calls.append((len(prompt_ids), group, temperature, max_new_tokens))
        limit = -1 if max_new_tokens is None else max_new_tokens
        completions = [torch.tensor([round(temperature * 10), limit, p[0]]) for p in prompt_ids]
        return completions, [torch.full((3,), -1.0) for _ in prompt_ids]


def test_server_sampler_makes_every_ranks_calls_with_as_many_rows(monkeypatch):
    """Server mode gathers every rank's prompts in one request per call: this rank (temperature 1.0 only) also makes
    the other rank's call at 1.3, with throwaway copies of its first group, and the agreed (largest) max_tokens; it
    keeps its own rows, in order."""
    from types import SimpleNamespace

    import accelerate.utils

    other_rank = [[(2, [1.0, 1.3], 7)], [[1, 2]]]  # what the other rank contributes to each gather, in order
    gathers = []

    def gather_object(mine):
        gathers.append(mine)
        return mine + other_rank[len(gathers) - 1]

    monkeypatch.setattr(accelerate.utils, "gather_object", gather_object)
    vllm = EchoVLLM()
    sampler = samplers.VLLMServerSampler(vllm, SimpleNamespace(num_processes=2), [99], keep_sampler_logps=True)
    out = sampler.sample([[5], [5], [6], [6]], torch.tensor([1.0, 1.0, 1.0, 1.0]), group=2, step=0, max_new_tokens=4)
    assert vllm.calls == [(4, 2, 1.0, 7), (4, 2, 1.3, 7)]  # 2 prompts x n=2 each; the 1.3 call padded for the other
    assert [c.tolist() for c in out.completion_ids] == [[10, 7, 5], [10, 7, 5], [10, 7, 6], [10, 7, 6]]
    assert len(out.sampler_logps) == 4 and out.logps is None


def test_colocate_sampler_groups_rows_by_temperature_alone():
    """One colocated engine per rank: no gathering; one call per distinct temperature, a group split over
    temperatures samples its rows one by one, and the rows come back in order."""
    from types import SimpleNamespace

    vllm = EchoVLLM()
    vllm.tensor_parallel_size = 1
    sampler = samplers.VLLMColocateSampler(vllm, SimpleNamespace(num_processes=2), [], keep_sampler_logps=False)
    out = sampler.sample([[1], [1], [2], [2]], torch.tensor([0.5, 0.5, 0.5, 0.9]), group=2, step=0)
    assert vllm.calls == [(3, 1, 0.5, None), (1, 1, 0.9, None)]  # group 2 broken (its temperatures differ): n=1
    assert [c.tolist() for c in out.completion_ids] == [[5, -1, 1], [5, -1, 1], [5, -1, 2], [9, -1, 2]]
    assert out.sampler_logps is None


def test_vllm_refuses_model_inputs_it_cannot_take():
    """Rows with processed model inputs but no images: vLLM takes images only, so the round is refused naming the fix
    rather than sampled without the inputs."""
    from types import SimpleNamespace

    sampler = samplers.VLLMColocateSampler(EchoVLLM(), SimpleNamespace(num_processes=1), [], keep_sampler_logps=False)
    with pytest.raises(ValueError, match="without images .* set use_vllm=False"):
        sampler.sample([[1]], torch.tensor([1.0]), 1, 0, model_inputs=[{"pixel_values": torch.zeros(1, 3)}])
