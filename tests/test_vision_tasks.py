"""Tests of the built-in visual task suite, its LLaVA processor and tiny VLM, and TRL's trainers on them (CPU,
offline, ~20 s)."""

from __future__ import annotations

import io
import re
from collections import Counter

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForImageTextToText, AutoProcessor

from trl_trapo.tasks import EOS_TOKEN, exact_match_reward
from trl_trapo.tasks.vision import (
    BACKGROUND,
    COLOURS,
    FAMILIES,
    IMAGE_SIZE,
    IMAGE_TOKEN,
    NUM_IMAGE_TOKENS,
    SPLIT_RL_ONLY,
    SPLIT_SFT_TASKS,
    build_tiny_vlm,
    build_vlm_processor,
    caption_loss,
    greedy_vlm_accuracy,
    make_visual_task_suite,
    multi_scenes,
    single_scenes,
)


SMALL = {
    "num_pretrain_docs": 40,
    "num_sft_per_task": 24,
    "num_rl_per_task": 12,
    "num_eval_per_task": 12,
    "num_eval_captions": 8,
}
COLOUR_OF_RGB = {rgb: name for name, rgb in COLOURS.items()}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one thread


@pytest.fixture(scope="module")
def suite():
    return make_visual_task_suite(seed=0, **SMALL)


@pytest.fixture(scope="module")
def processor():
    return build_vlm_processor()


def _question(prompt: list[dict]) -> str:
    return prompt[-1]["content"][-1]["text"]


def _num_image_parts(prompt: list[dict]) -> int:
    return sum(part["type"] == "image" for message in prompt for part in message["content"])


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def _components(mask: np.ndarray) -> list[np.ndarray]:
    """4-connected components of a boolean (H, W) mask, each as a boolean mask."""
    seen = np.zeros_like(mask)
    components = []
    for y, x in zip(*np.nonzero(mask)):
        if seen[y, x]:
            continue
        component = np.zeros_like(mask)
        stack = [(y, x)]
        seen[y, x] = True
        while stack:
            cy, cx = stack.pop()
            component[cy, cx] = True
            for ny, nx in ((cy - 1, cx), (cy + 1, cx), (cy, cx - 1), (cy, cx + 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        components.append(component)
    return components


def _read_image(image) -> tuple[str, str, int]:
    """(colour, shape, count) read back from the pixels alone: one flat colour, the shape from how much of its bounding
    box it fills (square 1, circle ~0.8, triangle ~0.5), the count from 4-connected components."""
    pixels = _pixels(image).astype(int)
    assert pixels.shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
    foreground = (pixels != np.array(BACKGROUND)).any(-1)
    colours = {tuple(int(v) for v in rgb) for rgb in pixels[foreground]}
    assert len(colours) == 1, f"expected one flat colour, got {colours}"
    (rgb,) = colours
    kinds = set()
    components = _components(foreground)
    for component in components:
        ys, xs = np.nonzero(component)
        fill = component.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
        kinds.add("square" if fill > 0.95 else "circle" if fill > 0.7 else "triangle")
    assert len(kinds) == 1, f"expected one kind of shape, got {kinds}"
    return COLOUR_OF_RGB[rgb], kinds.pop(), len(components)


def _expected_answer(row: dict) -> str:
    """The answer of a prompt re-derived from its images' pixels (visual families) or its text (`text`)."""
    question = _question(row["prompt"])
    images = row["images"]
    if not images:
        match = re.fullmatch(r"(\d) (\w+) (\w+?)s?\. (colour|shape|count)\?", question)
        assert match, question
        count, colour, kind, asked = match.groups()
        return {"colour": colour, "shape": kind, "count": count}[asked]
    read = [_read_image(image) for image in images]
    if question == "same colour?":
        assert len(images) == 2
        return "yes" if read[0][0] == read[1][0] else "no"
    assert len(images) == 1
    colour, kind, count = read[0]
    if question == "what shape is it?":
        assert count == 1
        return kind
    if question.startswith("colour of the "):
        assert count == 1 and question == f"colour of the {kind}?"
        return colour
    assert question == f"how many {kind}s?", question
    return str(count)


# ---------------------------------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------------------------------


def test_suite_columns_follow_trl_conventions(suite):
    assert suite.pretrain.column_names == ["text", "images"]
    assert suite.sft.column_names == ["prompt", "completion", "images"]
    assert suite.rl_train.column_names == ["prompt", "images", "answer", "task", "demonstration"]
    assert suite.eval.column_names == ["prompt", "images", "answer", "task", "split"]
    assert suite.eval_captions.column_names == ["text", "images"]
    assert suite.reward_funcs == [exact_match_reward]
    row = suite.sft[0]
    assert [message["role"] for message in row["prompt"]] == ["user"]
    assert row["completion"][0]["role"] == "assistant" and isinstance(row["completion"][0]["content"], str)
    # every family is in eval, with its split; the RL-only family has no SFT rows and no demonstrations
    assert Counter(suite.eval["task"]) == {family: SMALL["num_eval_per_task"] for family in FAMILIES}
    splits = dict(zip(suite.eval["task"], suite.eval["split"]))
    assert splits == {f: SPLIT_RL_ONLY if f == "shape" else SPLIT_SFT_TASKS for f in FAMILIES}
    assert "what shape is it?" not in {_question(p) for p in suite.sft["prompt"]}
    shape_rows = [d for t, d in zip(suite.rl_train["task"], suite.rl_train["demonstration"]) if t == "shape"]
    assert shape_rows and set(shape_rows) == {""}
    # 0, 1 and 2 images per row all occur in the SFT and RL data, and 0, 1 and 2 in pretraining
    for dataset in (suite.sft, suite.rl_train, suite.eval, suite.pretrain):
        assert {len(images) for images in dataset["images"]} == {0, 1, 2}


def test_prompts_and_answers_are_short(suite, processor):
    for dataset in (suite.rl_train, suite.eval):
        for prompt, answer in zip(dataset["prompt"], dataset["answer"]):
            assert len(_question(prompt)) <= 27 and 1 <= len(answer) <= 8
    # the longest rendered SFT row fits the text model's 256 positions with room to spare
    longest = max(
        len(
            processor(
                text=[processor.apply_chat_template(r["prompt"] + r["completion"], tokenize=False)],
                images=r["images"] or None,
            )["input_ids"][0]
        )
        for r in suite.sft
    )
    assert longest <= 96


def test_suite_is_deterministic_by_seed():
    first, second, other = (make_visual_task_suite(seed=seed, **SMALL) for seed in (0, 0, 1))
    for name in ("pretrain", "sft", "rl_train", "eval", "eval_captions"):
        a, b = getattr(first, name), getattr(second, name)
        assert a.remove_columns("images").to_list() == b.remove_columns("images").to_list()
        pixels_a = [[_pixels(image).tobytes() for image in row] for row in a["images"]]
        pixels_b = [[_pixels(image).tobytes() for image in row] for row in b["images"]]
        assert pixels_a == pixels_b
    assert first.sft.remove_columns("images").to_list() != other.sft.remove_columns("images").to_list()
    assert {_pixels(r[0]).tobytes() for r in first.eval["images"] if r} != {
        _pixels(r[0]).tobytes() for r in other.eval["images"] if r
    }


def test_held_out_images_and_inputs_are_never_trained_on(suite):
    def image_set(*datasets: Dataset) -> set[bytes]:
        return {_pixels(image).tobytes() for dataset in datasets for row in dataset["images"] for image in row}

    trained = image_set(suite.sft, suite.rl_train, suite.pretrain)
    held_out = image_set(suite.eval, suite.eval_captions)
    assert trained and held_out
    assert not trained & held_out
    # the text family's held-out prompts occur in no training row either
    eval_text = {_question(p) for p, t in zip(suite.eval["prompt"], suite.eval["task"]) if t == "text"}
    train_text = {_question(p) for p in suite.sft["prompt"]} | {_question(p) for p in suite.rl_train["prompt"]}
    assert eval_text and not eval_text & train_text
    # eval answers are balanced within each family
    for family in FAMILIES:
        answers = Counter(a for a, t in zip(suite.eval["answer"], suite.eval["task"]) if t == family)
        if family != "text":
            assert max(answers.values()) - min(answers.values()) <= 1, (family, answers)


def test_answers_match_the_pixels(suite):
    rows = list(suite.eval) + list(suite.rl_train)
    for row in rows:
        assert _expected_answer(row) == row["answer"], _question(row["prompt"])
    for row in suite.sft:
        assert _expected_answer(row) == row["completion"][0]["content"], _question(row["prompt"])


def test_captions_describe_their_images(suite):
    for dataset in (suite.pretrain, suite.eval_captions):
        for text, images in zip(dataset["text"], dataset["images"]):
            captions = re.findall(re.escape(IMAGE_TOKEN) + r"(a|\d) (\w+) (\w+?)s?\.", text)
            assert len(captions) == len(images) == text.count(IMAGE_TOKEN)
            for (count, colour, kind), image in zip(captions, images):
                assert _read_image(image) == (colour, kind, 1 if count == "a" else int(count))


def test_scene_spaces():
    singles, multis = single_scenes(), multi_scenes()
    assert len(singles) == len(set(singles)) == 3888
    assert len(multis) == len(set(multis)) == 4320
    images = {_pixels(scene.render()).tobytes() for scene in singles + multis}
    assert len(images) == len(singles) + len(multis)  # distinct scenes draw distinct images
    for scene in singles[::97] + multis[::97]:
        for shape in scene.shapes:
            left, top, right, bottom = shape.box()
            assert 0 <= left and right < IMAGE_SIZE and 0 <= top and bottom < IMAGE_SIZE


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_sft_per_task": -1},
        {"rl_only_fraction": 1.0},
        {"rl_only_families": ("nope",)},
        {"rl_only_families": FAMILIES},
        {"num_eval_per_task": 79},
    ],
)
def test_suite_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        make_visual_task_suite(seed=0, **{**SMALL, **kwargs})


def test_every_family_can_be_in_sft():
    suite = make_visual_task_suite(seed=0, **SMALL, rl_only_families=())
    assert set(suite.eval["split"]) == {SPLIT_SFT_TASKS}
    assert "what shape is it?" in {_question(p) for p in suite.sft["prompt"]}
    assert "" not in set(suite.rl_train["demonstration"])


# ---------------------------------------------------------------------------------------------------------------
# Processor and model
# ---------------------------------------------------------------------------------------------------------------


def test_image_tokens_match_images_in_every_row(suite, processor):
    image_token_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    for name in ("pretrain", "sft", "rl_train", "eval", "eval_captions"):
        dataset = getattr(suite, name)
        if "text" in dataset.column_names:
            texts = list(dataset["text"])
        else:
            prompts = dataset["prompt"]
            assert [_num_image_parts(p) for p in prompts] == [len(images) for images in dataset["images"]]
            texts = [processor.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
        assert [text.count(IMAGE_TOKEN) for text in texts] == [len(images) for images in dataset["images"]]
        # expanded by the processor, a batch mixing 0, 1 and 2 images per row: 16 tokens per image, images in order
        images = list(dataset["images"])
        batch = processor(
            text=texts, images=[image for row in images for image in row] or None, padding=True, return_tensors="pt"
        )
        per_row = (batch["input_ids"] == image_token_id).sum(-1).tolist()
        assert per_row == [NUM_IMAGE_TOKENS * len(row) for row in images], name
        assert tuple(batch["pixel_values"].shape) == (sum(map(len, images)), 3, IMAGE_SIZE, IMAGE_SIZE)


def test_chat_template_ends_every_turn_with_eos(suite, processor):
    row = suite.sft[0]
    prompt = processor.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    full = processor.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
    answer = row["completion"][0]["content"]
    assert prompt.endswith(f"{EOS_TOKEN}\nassistant: ")
    assert full == prompt + answer + EOS_TOKEN + "\n"
    ids = processor.tokenizer(full[len(prompt) :], add_special_tokens=False)["input_ids"]
    assert processor.tokenizer.eos_token_id in ids  # one token, so TRL's SFT trains the model to stop
    assert exact_match_reward(None, [[{"role": "assistant", "content": full[len(prompt) :]}]], [answer]) == [1.0]


def test_processor_round_trips_through_save_pretrained(tmp_path, suite, processor):
    processor.save_pretrained(tmp_path)
    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert type(loaded) is type(processor)
    assert type(loaded.image_processor) is type(processor.image_processor)
    assert loaded.chat_template == processor.chat_template
    assert len(loaded.tokenizer) == len(processor.tokenizer)
    rows = [suite.eval[i] for i in range(len(suite.eval)) if len(suite.eval[i]["images"]) == 2][:1]
    rows += [suite.eval[0]]
    for row in rows:
        texts = [
            p.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
            for p in (processor, loaded)
        ]
        assert texts[0] == texts[1]
        a, b = (p(text=[texts[0]], images=row["images"] or None, return_tensors="pt") for p in (processor, loaded))
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_build_tiny_vlm_is_seeded_and_leaves_the_global_rng_alone(tmp_path, processor):
    state = torch.get_rng_state()
    first, second, other = (build_tiny_vlm(processor, seed=seed) for seed in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), state)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert any(not torch.equal(a, b) for a, b in zip(first.state_dict().values(), other.state_dict().values()))
    tokenizer = processor.tokenizer
    text_config = first.config.get_text_config()
    assert text_config.vocab_size == len(tokenizer)
    assert first.config.image_token_id == tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert first.generation_config.eos_token_id == tokenizer.eos_token_id
    assert first.generation_config.suppress_tokens == [first.config.image_token_id]
    assert sum(p.numel() for p in first.parameters()) < 1_000_000
    first.save_pretrained(tmp_path)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path)
    for (name, a), b in zip(first.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_build_tiny_vlm_rejects_a_vision_config_the_processor_does_not_match(tmp_path, processor):
    import json

    from trl_trapo.tasks.vision import DEFAULT_VLM_CONFIG

    with open(DEFAULT_VLM_CONFIG, encoding="utf-8") as handle:
        config = json.load(handle)
    config["vision_config"]["patch_size"] = 7
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="patch_size"):
        build_tiny_vlm(processor, path)


def test_model_runs_on_a_batch_mixing_0_1_and_2_images(suite, processor):
    model = build_tiny_vlm(processor)
    rows = {len(r["images"]): r for r in suite.sft}
    rows = [rows[0], rows[1], rows[2]]
    texts = [processor.apply_chat_template(r["prompt"] + r["completion"], tokenize=False) for r in rows]
    batch = processor(text=texts, images=[i for r in rows for i in r["images"]], padding=True, return_tensors="pt")
    out = model(**batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100))
    assert out.logits.shape[:2] == batch["input_ids"].shape
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.model.vision_tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0


def test_sampling_never_emits_the_image_token(suite, processor):
    # an untrained model samples each of its 102 tokens about equally: 640 draws would contain ~6 "<image>" tokens,
    # each of which breaks the next forward pass ("Image features and image tokens do not match")
    model = build_tiny_vlm(processor).eval()
    row = next(r for r in suite.rl_train if len(r["images"]) == 1)
    text = processor.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text] * 16, images=row["images"] * 16, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**inputs, do_sample=True, max_new_tokens=40, min_new_tokens=40)
    completions = out[:, inputs["input_ids"].shape[1] :]
    assert completions.numel() == 640
    assert not (completions == model.config.image_token_id).any()
    model(input_ids=out, pixel_values=inputs["pixel_values"])  # the sampled rows can be scored


# ---------------------------------------------------------------------------------------------------------------
# Evaluation helpers
# ---------------------------------------------------------------------------------------------------------------


class _OracleVLM(torch.nn.Module):
    """Answers from a lookup of a row's (unpadded) prompt ids and the pixels it was given: a row that got another row's
    images, or was padded on the wrong side, finds no answer."""

    def __init__(self, processor, rows: list[dict], wrong_tasks: set[str]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer = processor.tokenizer
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        self.answers = {}
        for row in rows:
            text = processor.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
            inputs = processor(text=[text], images=row["images"] or None, return_tensors="pt")
            key = self._key(inputs["input_ids"][0], inputs.get("pixel_values"))
            self.answers[key] = "wrong" if row["task"] in wrong_tasks else row["answer"]

    @staticmethod
    def _key(ids: torch.Tensor, pixel_values: torch.Tensor | None) -> tuple:
        pixels = b"" if pixel_values is None else pixel_values.mul(1000).round().to(torch.int32).numpy().tobytes()
        return tuple(ids.tolist()), pixels

    def generate(self, input_ids, attention_mask, pixel_values=None, max_new_tokens=8, **kwargs):
        assert (attention_mask[:, -1] == 1).all()  # left-padded
        assert kwargs["do_sample"] is False
        assert kwargs["suppress_tokens"] == [self.image_token_id]  # a sampled image token would break the next forward
        outputs, offset = [], 0
        for ids, mask in zip(input_ids, attention_mask):
            ids = ids[mask.bool()]
            num_images = int((ids == self.image_token_id).sum()) // NUM_IMAGE_TOKENS
            pixels = pixel_values[offset : offset + num_images] if num_images else None
            offset += num_images
            new = self.tokenizer(" " + self.answers[self._key(ids, pixels)], add_special_tokens=False)["input_ids"]
            new = (new + [self.tokenizer.eos_token_id] * max_new_tokens)[:max_new_tokens]
            outputs.append(torch.cat([input_ids.new_zeros(len(mask) - len(ids)), ids, torch.tensor(new)]))
        assert offset == (0 if pixel_values is None else pixel_values.shape[0])
        return torch.stack(outputs)


def test_greedy_vlm_accuracy_scores_each_row_with_its_own_images(suite, processor):
    rows = list(suite.eval)
    oracle = _OracleVLM(processor, rows, wrong_tasks={"shape"})
    metrics = greedy_vlm_accuracy(oracle, processor, suite.eval, batch_size=7)
    assert metrics["accuracy_sft_tasks"] == 1.0 and metrics["accuracy_rl_only"] == 0.0
    assert metrics["accuracy_shape"] == 0.0
    assert all(metrics[f"accuracy_{f}"] == 1.0 for f in FAMILIES if f != "shape")
    assert metrics["accuracy"] == pytest.approx(1 - 1 / len(FAMILIES))


def test_greedy_vlm_accuracy_and_caption_loss_run_on_the_tiny_vlm(suite, processor):
    model = build_tiny_vlm(processor)
    model.train()
    metrics = greedy_vlm_accuracy(model, processor, suite.eval.select(range(0, len(suite.eval), 6)))
    assert 0.0 <= metrics["accuracy"] <= 1.0 and model.training
    loss = caption_loss(model, processor, suite.eval_captions)
    # untrained: about ln(vocabulary size) per predicted token
    assert abs(loss - np.log(len(processor.tokenizer))) < 0.3
    with pytest.raises(ValueError):
        greedy_vlm_accuracy(model, processor, suite.pretrain)


# ---------------------------------------------------------------------------------------------------------------
# TRL's own trainers accept the processor and the datasets
# ---------------------------------------------------------------------------------------------------------------


def _mixed_rows(dataset: Dataset, per_count: int) -> Dataset:
    """`per_count` rows with 0, 1 and 2 images each, interleaved: any batch of 3 * per_count rows mixes them."""
    by_count: dict[int, list[int]] = {}
    for index, images in enumerate(dataset["images"]):
        by_count.setdefault(len(images), []).append(index)
    indices = [by_count[n][i] for i in range(per_count) for n in (0, 1, 2)]
    return dataset.select(indices)


def test_trl_trainers_accept_the_processor(tmp_path, suite, processor):
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    common = dict(
        max_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
    )
    model = build_tiny_vlm(processor)
    seen_images: list[int] = []
    model.model.vision_tower.register_forward_hook(lambda module, args, out: seen_images.append(args[0].shape[0]))

    # SFT on conversational prompt-completion rows with 0, 1 and 2 images in one batch of 6
    sft_rows = _mixed_rows(suite.sft, 2)
    args = SFTConfig(output_dir=str(tmp_path / "sft"), per_device_train_batch_size=6, **common)
    trainer = SFTTrainer(model=model, args=args, train_dataset=sft_rows, processing_class=processor)
    trainer.train()
    assert seen_images == [sum(len(images) for images in sft_rows["images"])]
    assert np.isfinite(trainer.state.log_history[0]["loss"])

    # SFT (language modelling) on image-text documents: TRL keeps a vision dataset's `text` column only with
    # remove_unused_columns=False
    seen_images.clear()
    docs = _mixed_rows(suite.pretrain, 2)
    args = SFTConfig(
        output_dir=str(tmp_path / "lm"), per_device_train_batch_size=6, remove_unused_columns=False, **common
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=docs, processing_class=processor)
    trainer.train()
    assert seen_images == [sum(len(images) for images in docs["images"])]

    # GRPO: prompts with 1 and 2 images x 2 generations, rewarded by the suite's reward on its `answer` column. (Not
    # with text-only prompts in the same batch: see test_trl_grpo_cannot_mix_text_only_prompts_with_llava.)
    calls = []

    def reward(prompts, completions, answer, task, **kwargs):
        calls.append((list(answer), list(task), list(completions)))
        return exact_match_reward(prompts, completions, answer)

    seen_images.clear()
    rl_rows = _mixed_rows(suite.rl_train, 2).filter(lambda images: len(images) > 0, input_columns="images")
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=8,
        num_generations=2,
        max_completion_length=6,
        **common,
    )
    trainer = GRPOTrainer(
        model=model, args=args, train_dataset=rl_rows, processing_class=processor, reward_funcs=[reward]
    )
    trainer.train()
    ((answers, tasks, completions),) = calls
    assert sorted(answers) == sorted(list(rl_rows["answer"]) * 2)
    assert sorted(tasks) == sorted(list(rl_rows["task"]) * 2)
    assert all(c[0]["role"] == "assistant" for c in completions)  # conversational completions
    assert seen_images and seen_images[0] == 2 * sum(len(images) for images in rl_rows["images"])


def test_trl_grpo_cannot_mix_text_only_prompts_with_llava(tmp_path, suite, processor):
    # TRL 1.16's GRPOTrainer passes `None` as the images of a text-only prompt of a batch that has images, which
    # LlavaProcessor (transformers 5.24) rejects: with TRL's own GRPO, train on image rows and text rows separately
    # (the suite's `rl_train` mixes them for TRAPO, which passes the batch's images as one flat list).
    from trl import GRPOConfig, GRPOTrainer

    rows = _mixed_rows(suite.rl_train, 1).filter(lambda images: len(images) < 2, input_columns="images")
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=2,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        gradient_checkpointing=False,
    )
    model = build_tiny_vlm(processor)
    trainer = GRPOTrainer(
        model=model, args=args, train_dataset=rows, processing_class=processor, reward_funcs=suite.reward_funcs
    )
    with pytest.raises(TypeError, match="NoneType"):
        trainer.train()
