# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Image prompts with the turn drivers: `tools=`, `environment_factory=` and `rollout_func=` (issue 40).

Each test trains `AlignedLlava` (tests/test_vision.py): every whole-sequence forward asserts that the images it is
given are the ones its rows' text names (`#k` before each image), in row order, so a turn generated without its row's
images, or with another row's, fails there.

- tools: each turn's `generate` gets the row's images (the vision tower runs in every turn, on exactly the images of
  the rows still running), and the trajectories carry them into the reference and training forwards;
- environment_factory: `reset` gets the row's columns as TRL passes them (its images, not TRAPO's `model_inputs`),
  and its text is appended to a multimodal message as a text part;
- rollout_func: the function gets TRL's multimodal messages (the row's images inside its image parts), renders them
  with the processor and samples with the pixel values; the completions train with their rows' images; a returned
  prompt whose image tokens do not match its row's images is refused, naming the entry.

Turns are scripted on top of the real sampler (the tiny random model never calls a tool): `RolloutEngine.sample` runs
(transformers' `generate` with the rows' images), then its tokens are replaced by a tool call on the first turn and an
answer after a tool result.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from test_vision import build_model, build_processor, content, image, odd_length_reward, vlm_config

from trl_trapo import TRAPOTrainer
from trl_trapo.agents import use_tool_chat_template
from trl_trapo.sources import SampledRound


CALL = '<c>{"name":"look","arguments":{"x":1}}</c></s>'  # the scripted first turn (the compact template's call)
ANSWER = "ok</s>"  # the scripted turn after a tool result


def look(x: int) -> int:
    """Look again.

    Args:
        x: Anything.
    """
    return 7


class Lens:
    """An environment: `reset` records the columns it gets and appends `!` to the prompt; one tool."""

    resets: list[dict] = []

    def reset(self, **row) -> str:
        Lens.resets.append(row)
        return "!"

    def look(self, x: int) -> int:
        """Look.

        Args:
            x: Anything.
        """
        return 3

    def get_reward(self) -> float:
        return 1.0


def image_prompts(n: int = 4) -> Dataset:
    """Conversational RL prompts with 1 or 2 images each (identities 1..), the images named in the text."""
    rows = []
    for i in range(n):
        ks = [i + 1] if i % 2 == 0 else [i + 1, i + 2]
        rows.append({"prompt": [{"role": "user", "content": content(ks, "q?")}], "images": [image(k) for k in ks]})
    return Dataset.from_list(rows)


def tool_processor():
    return use_tool_chat_template(build_processor())


def vision_calls(model) -> list[int]:
    """A forward hook on the vision tower: the number of images of each of its calls (appended to the list returned)."""
    calls: list[int] = []
    model.model.vision_tower.register_forward_hook(lambda module, args, output: calls.append(int(args[0].shape[0])))
    return calls


def script_turns(trainer, tokenizer, turns: list[dict]) -> None:
    """Replace each sampled turn by the script's (a tool call first, an answer after a tool result), after the real
    `RolloutEngine.sample` ran with the rows' images. Records per call: the rows, their images and the vision tower's
    images during the call."""
    engine = trainer.rollouts
    real = engine.sample
    tower = vision_calls(trainer.model)

    def sample(examples, group, step, temperature, max_new_tokens=None, **kwargs):
        before = len(tower)
        real(examples, group, step, temperature, max_new_tokens=max_new_tokens, **kwargs)
        images = [e["model_inputs"]["pixel_values"].shape[0] if e.get("model_inputs") else 0 for e in examples]
        texts = [tokenizer.decode(e["prompt_ids"]) for e in examples]
        turns.append({"rows": len(examples), "images": sum(images), "tower": sum(tower[before:]), "texts": texts})
        completions = []
        for example in examples:
            text = tokenizer.decode(example["prompt_ids"])
            turn = ANSWER if "t:" in text else CALL
            completions.append(tokenizer(turn, add_special_tokens=False)["input_ids"][:max_new_tokens])
        return SampledRound(
            [{"prompt_ids": e["prompt_ids"]} for e in examples],
            completions,
            version=step,
            old_per_token_logps=[torch.full((len(c),), -0.5) for c in completions],
            prompt_ids=[e["prompt_ids"] for e in examples],
        )

    engine.sample = sample


def agent_trainer(tmp_path, processor, **kwargs):
    model = build_model(processor)
    trainer = TRAPOTrainer(
        model,
        reward_funcs=odd_length_reward,
        args=vlm_config(tmp_path, max_steps=2, response_length=64, per_device_train_batch_size=4),
        train_dataset=image_prompts(),
        processing_class=processor,
        **kwargs,
    )
    trainer.ref_model.tokenizer, trainer.ref_model.calls = processor.tokenizer, model.calls
    trainer.ref_model.mean, trainer.ref_model.std, trainer.ref_model.generating = model.mean, model.std, False
    return trainer, model


def check_every_turn_saw_its_images(trainer, model, turns: list[dict]) -> None:
    # two turns per round (the call, then the answer after its result), each generating with every row's images
    assert len(turns) >= 2 and len(turns) % 2 == 0, turns
    for turn in turns:
        assert turn["images"] > 0 and turn["tower"] == turn["images"], turns
    assert max(log.get("tools/turns_mean", 0) for log in trainer.state.log_history) == 2
    # the trajectories keep the images: the reference (no_grad) and training forwards read them, aligned
    phases = {phase for phase, count in model.calls if count}
    assert {"generate", "no_grad", "train"} <= phases, model.calls


def test_images_reach_every_turn_of_a_tool_call_loop(tmp_path):
    """images x tools: each turn's generate reads the row's images (AlignedLlava asserts they are the row's); the
    vision tower runs in every turn on as many images as the running rows have; the training forward reads them."""
    processor = tool_processor()
    trainer, model = agent_trainer(tmp_path, processor, tools=[look])
    turns: list[dict] = []
    script_turns(trainer, processor.tokenizer, turns)
    trainer.train()
    check_every_turn_saw_its_images(trainer, model, turns)


def test_images_reach_every_turn_of_an_environment(tmp_path):
    """images x environment_factory: `reset` gets the row's columns as TRL passes them (`images`, not TRAPO's
    `model_inputs` or `prompt_ids`), its text is appended to the multimodal message as a text part, and every turn
    generates with the row's images."""
    processor = tool_processor()
    Lens.resets = []
    trainer, model = agent_trainer(tmp_path, processor, environment_factory=Lens)
    turns: list[dict] = []
    script_turns(trainer, processor.tokenizer, turns)
    trainer.train()
    check_every_turn_saw_its_images(trainer, model, turns)
    assert Lens.resets and all(set(row) == {"prompt", "images"} for row in Lens.resets), Lens.resets[0].keys()
    # the reset text, a text part after the question: rendered right after it
    assert all(text.endswith("q?!\na:") for text in turns[0]["texts"]), turns[0]["texts"]
    assert all(len(row["images"]) in (1, 2) for row in Lens.resets)
    rewards = [log["rewards/Lens/mean"] for log in trainer.state.log_history if "rewards/Lens/mean" in log]
    assert rewards and all(r == 1.0 for r in rewards)


def render_and_sample(received: list, drop_images: bool = False):
    """A `rollout_func` as a TRL user writes one for a VLM: render each prompt with the processor (which reads the
    images inside the messages), sample with the pixel values, return the ids."""

    def rollout_func(prompts, trainer):
        received.append(prompts)
        processor = trainer.processing_class
        policy = trainer.accelerator.unwrap_model(trainer.model)
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": None}
        for prompt in prompts:
            if drop_images:  # the text alone: the image parts rendered, their images not given
                prompt = [{**m, "content": [p for p in m["content"] if p["type"] == "text"]} for m in prompt]
            inputs = processor.apply_chat_template(
                [prompt], tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="pt"
            )
            with torch.no_grad():
                sequences = policy.generate(**inputs, max_new_tokens=3, do_sample=True)
            prompt_length = inputs["input_ids"].shape[1]
            out["prompt_ids"].append(inputs["input_ids"][0].tolist())
            out["completion_ids"].append(sequences[0, prompt_length:].tolist())
        return out

    return rollout_func


def test_a_rollout_func_gets_the_images_in_its_messages_and_trains_with_them(tmp_path):
    """images x rollout_func: the function gets TRL's multimodal messages, each image part holding its row's image
    (the processor renders and expands them; AlignedLlava checks the function's own generate too), and the rounds
    train with their rows' images."""
    processor = build_processor()
    received: list = []
    trainer, model = agent_trainer(tmp_path, processor, rollout_func=render_and_sample(received))
    tower = vision_calls(model)
    trainer.train()
    assert received and tower
    rows = {tuple(p["text"] for p in r["prompt"][0]["content"] if p["type"] == "text"): r for r in image_prompts()}
    for prompt in received[0]:
        parts = prompt[0]["content"]
        row = rows[tuple(p["text"] for p in parts if p["type"] == "text")]
        given = [p["image"] for p in parts if p["type"] == "image"]
        assert [im.tobytes() for im in given] == [im.tobytes() for im in row["images"]]
    phases = {phase for phase, count in model.calls if count}
    assert {"generate", "no_grad", "train"} <= phases, model.calls


def test_a_rollout_func_whose_prompts_lack_the_image_tokens_is_refused(tmp_path):
    """A function that renders the text without the images returns prompts with no image tokens: refused, naming
    the entry, not a shape error in the training forward."""
    processor = build_processor()
    trainer, _ = agent_trainer(tmp_path, processor, rollout_func=render_and_sample([], drop_images=True))
    with pytest.raises(ValueError, match=r"rollout_func's 'prompt_ids'\[0\] holds 0 image placeholder tokens"):
        trainer.train()


def test_a_processor_renders_the_tool_messages_as_its_tokenizer_does():
    """The tool messages' suffix through the processor (TRL's multimodal messages, every content a list of parts) is
    the same ids as through its tokenizer (string contents) with `use_tool_chat_template(processor)`."""
    from trl_trapo.agents import tool_suffix_ids

    processor = tool_processor()
    messages = [{"role": "tool", "name": "look", "content": "7"}]
    suffix = tool_suffix_ids(processor, messages)
    assert suffix == tool_suffix_ids(processor.tokenizer, messages)
    assert processor.tokenizer.decode(suffix) == "t:7\na:"


def test_a_rollout_func_with_text_image_prompts_is_refused_at_construction(tmp_path):
    """TRL passes a rollout_func the images inside its messages ("Multimodal training requires conversational
    prompts"): text prompts with images are refused when the trainer is built, naming the fix."""
    processor = build_processor()
    rows = [{"prompt": f"#{k}<image> q?", "images": [image(k)]} for k in (1, 2)]
    with pytest.raises(ValueError, match=r"rollout_func with image prompts: .* give conversational prompts"):
        TRAPOTrainer(
            build_model(processor),
            reward_funcs=odd_length_reward,
            args=vlm_config(tmp_path, max_steps=1),
            train_dataset=Dataset.from_list(rows),
            processing_class=processor,
            rollout_func=render_and_sample([]),
        )


def test_a_processor_whose_template_cannot_express_tools_is_refused_naming_it(tmp_path):
    """The processor renders image prompts and tool messages: its chat template is the one checked (its tokenizer's
    may express tools while its own does not), and the message names it and the fix."""
    processor = build_processor()
    use_tool_chat_template(processor.tokenizer)  # the tokenizer can express tools; the processor's template cannot
    with pytest.raises(ValueError, match=r"The processor's chat template \(LlavaProcessor.*use_tool_chat_template"):
        agent_trainer(tmp_path, processor, tools=[look])


def test_a_rank_without_rows_takes_part_in_a_turn_with_its_first_rows_images():
    """Several processes generate in lockstep: a rank whose rollouts are done generates a throwaway token from its
    first rollout's prompt meanwhile, and that prompt's image tokens need its images."""
    from trl_trapo.agents import AgentSpec, ToolRolloutSource
    from trl_trapo.vision import ImageRows

    processor = tool_processor()
    dataset = image_prompts(2)
    sampled = []

    class Recording:
        def sample(self, examples, group, step, temperature, max_new_tokens=None, **kwargs):
            sampled.append(examples)
            return SampledRound(examples, [[0] for _ in examples], version=step, old_per_token_logps=[[-1.0]])

    other_ranks = iter([1.0, 0.0])  # another rank has rows for one call, then none
    source = ToolRolloutSource(
        Recording(),
        dataset,
        prompts=None,
        spec=AgentSpec.build([look], None),
        tokenizer=processor.tokenizer,
        scorer=None,
        group=1,
        num_mini_batches=1,
        temperature=1.0,
        response_length=8,
        context=128,
        max_iterations=1,
        log_metric=lambda name, value: None,
        sum_over_ranks=lambda tensor: tensor + next(other_ranks),
        images=ImageRows(processor),
    )
    first = source.start([dataset[1]], [1])[0]
    source.generate_turn([], step=0, first=first)
    (throwaway,) = sampled[0]
    assert throwaway["prompt_ids"] == first.prompt_ids
    assert throwaway["model_inputs"]["pixel_values"].shape[0] == 2  # the row's two images


def test_evaluating_a_tools_run_rolls_the_image_prompts_out_with_their_images_in_every_turn(tmp_path, monkeypatch):
    """images x tools at evaluation (trial 12's N42): `evaluate()` renders each image prompt with its tools through
    the processor and rolls it out through the tool loop; every turn's greedy `generate` reads the row's images
    (AlignedLlava asserts they are the row's, the vision tower runs on exactly the running rows' images), the call
    runs and the `eval_tools/*` metrics count it."""
    from trl_trapo.agents import GreedyTurnEngine

    processor = tool_processor()
    trainer, model = agent_trainer(tmp_path, processor, tools=[look])
    tokenizer, tower, turns = processor.tokenizer, vision_calls(model), []
    real = GreedyTurnEngine.sample

    def sample(self, examples, group, step, temperature, max_new_tokens=None, **kwargs):
        before = len(tower)
        real(self, examples, group, step, temperature, max_new_tokens=max_new_tokens, **kwargs)
        images = [e["model_inputs"]["pixel_values"].shape[0] if e.get("model_inputs") else 0 for e in examples]
        texts = [tokenizer.decode(e["prompt_ids"]) for e in examples]
        turns.append({"images": sum(images), "tower": sum(tower[before:]), "texts": texts})
        completions = [
            tokenizer(ANSWER if "t:" in text else CALL, add_special_tokens=False)["input_ids"][:max_new_tokens]
            for text in texts
        ]
        return SampledRound(examples, completions, version=step, prompt_ids=[e["prompt_ids"] for e in examples])

    monkeypatch.setattr(GreedyTurnEngine, "sample", sample)
    metrics = trainer.evaluate(image_prompts())
    assert len(turns) == 2, turns  # the call, then the answer after its result
    for turn in turns:
        assert turn["images"] == 6 and turn["tower"] == 6, turns  # 1 + 2 + 1 + 2 images, every turn
    assert all(text.startswith("T:look(x)\n") for text in turns[0]["texts"]), turns[0]["texts"]
    assert all("t:7\na:" in text for text in turns[1]["texts"]), turns[1]["texts"]
    assert metrics["eval_tools/call_frequency"] == 1.0 and metrics["eval_tools/turns_mean"] == 2.0
