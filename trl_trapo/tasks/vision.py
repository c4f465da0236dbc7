"""A built-in, offline, seeded visual task suite, a tiny LLaVA-style vision-language model and its processor.

The vision-language analogue of `trl_trapo.tasks`: every image is drawn in-process with PIL from a seed, the processor
wraps the character tokenizer of `tasks.build_char_tokenizer`, and the model is built from
`configs/tiny_llava.json`, so nothing is downloaded and everything runs on a fresh CPU machine without Hub access.

Images are 56×56 RGB on a white background with flat (not anti-aliased) shapes: `square`, `circle`, `triangle` in
`red`, `green`, `blue`, `yellow`, of side 18–24 pixels. The vision tower cuts an image into 4×4 patches of 14×14
pixels; every shape lies inside one 2×2 block of patches. A scene of one shape puts it on one of the 3×3 inner patch
corners, shifted by up to 2 pixels (3,888 scenes); a scene of 2–3 shapes puts them in distinct quadrants (4,320).

Task families (prompt text at most 27 characters, answers at most 8; `<image>` marks where an image goes):

| family | images | prompt → answer | SFT demonstrations | eval split |
|---|---|---|---|---|
| `colour` | 1 (one shape) | `"<image>colour of the square?"` → `"red"` | yes | `sft_tasks` |
| `count` | 1 (1–3 shapes) | `"<image>how many circles?"` → `"2"` | yes | `sft_tasks` |
| `same` | 2 (one shape each) | `"<image><image>same colour?"` → `"yes"` / `"no"` | yes | `sft_tasks` |
| `text` | 0 | `"2 red circles. colour?"` → `"red"` (also `shape?`, `count?`; counts 1–9) | yes | `sft_tasks` |
| `shape` | 1 (one shape) | `"<image>what shape is it?"` → `"circle"` | **no**, RL prompts only | `rl_only` |

Rows therefore carry 0, 1 or 2 images, and so do the batches of every dataset.

Why this design:

- Held-out images: the one-shape scenes are split once (balanced over colour × shape), the 2–3-shape scenes once
  (balanced over the count); every eval row and `eval_captions` document uses held-out scenes only and no training row
  (SFT, RL, pretraining) uses one, so no eval image is ever seen in training. The `text` family holds out up to a
  quarter of each answer's inputs the same way. Answers are balanced over eval rows and every prefix of a training
  pool, so a constant answer is no shortcut.
- The pretraining corpus captions training images in another surface form (`"<image>a red square."`,
  `"<image>2 blue circles."`) and never asks a question, so it binds what an image shows to the words the answers
  use without solving any prompt. A quarter of its documents are text only (captions without an image, shape facts).
- Shapes sit on the patch grid, so that a patch always sees the same part of a shape, and counted shapes are
  quadrant-sized, because the first version was too slow to learn: with shapes anywhere and 12–16-pixel counted
  shapes, 650 SFT steps left `shape` at 0.44 and `count` at 0.38 (chance 0.33). Trained on `count` alone, 8–12-pixel
  shapes one to a patch stayed at chance after 400 steps (the answer has to be read off 1–3 of 16 image tokens
  through attention), quadrant-sized ones were learnt in ~150.
- `shape` has no demonstrations (`rl_only_families=("shape",)` by default): the captions name the shape of every
  training image, the `colour` and `count` prompts name the shape of the image they show, and the `text` family's
  `shape?` questions teach one-word shape answers, so after SFT and pretraining the model answers `"what shape is
  it?"` with a shape or colour word and sampling finds the right one (measured below). Without RL it scores ~0.
- Sizes: the tiny model learns the SFT families on one CPU thread in ~3 minutes, at learning rate 1e-3 (3e-3 kept
  `shape` and `count` at chance: the vision path stops learning).

Measured (plain PyTorch loops, batch 32, AdamW, lr 1e-3 with 30 warm-up steps, greedy exact match on the held-out
`eval` at the defaults, seed 0; times are CPU seconds of one thread, 0.16–0.18 s a step of 32 rows):

| run (accuracies at CPU seconds) | 60 s | 120 s | 180 s | 300 s |
|---|---|---|---|---|
| SFT only, `rl_only_families=()`: count / shape | 0.33 / 0.33 | 0.52 / 0.42 | 0.75 / 0.58 | 0.69 / 0.67 |
| SFT + pretraining batches 1:1: `sft_tasks` / count | 0.62 / 0.33 | 0.80 / 0.63 | 0.97 / 0.94 | 0.98 / 0.94 |

(The machine was shared, so wall time ran 4–5× the CPU time; on a quieter moment the second run reached `sft_tasks`
0.98, count 0.92, after 1,003 steps and 180 CPU s: 3.5 minutes of wall time, setup and evaluations included.)
`colour` and `same` reach 1.0 within 60–120 s in both runs, `text` within 240 s; `shape` (no demonstrations) stays at
0.02–0.04, and the `eval_captions` loss falls from 4.58 to 0.10 nats a token. From the checkpoint of a repeat of the
second run (1,516 steps: `sft_tasks` 1.0, `shape` 0.04), on-policy group-relative REINFORCE on `rl_train` (8 prompts
× 8 samples at temperature 1, lr 5e-4, one step a round) with an SFT and a pretraining batch of 16 in the same step
raises `shape` from 0.04 to 0.79 in 60 s, 0.92 in 120 s and 1.0 in 240 s (528 steps) while every other family stays
at 1.0. RL alone raises `shape` too (0.44 in 60 s, 0.71 in 240 s) but unlearns the others (`colour` 1.0 → 0.25),
probably because a group that is all right has zero advantage, so nothing holds them in place.

Conventions (checked against TRL 1.16's `SFTTrainer` and `GRPOTrainer` in `tests/test_vision_tasks.py`):

- Every dataset has an `images` column holding a list of PIL images (`[]` on a text-only row) in the order of the
  image parts of the prompt (resp. of `"<image>"` in `text`). TRL accepts `image` (one image) or `images`; only
  `images` allows 0 or 2 images a row.
- Every message `content` is a list of parts (`{"type": "image"}` / `{"type": "text", "text": ...}`), text-only rows
  included: an Arrow column cannot mix string and list cells (Arrow stores `"text": None` in the image parts).
  Completions are `[{"role": "assistant", "content": answer}]`; the reward is `tasks.exact_match_reward`, which reads
  the `answer` column.
- The chat template ends every turn with the eos text `"</s>"` (as ChatML ends turns with `<|im_end|>`): TRL's
  vision collators append no eos to a conversational completion, so without it a model SFT-trained by TRL would never
  learn to stop. It uses `{{ '\\n' }}` instead of a literal newline because processors render with `trim_blocks`.
- TRL's `SFTTrainer` trains on `prompt`/`completion` rows with 0, 1 and 2 images in one batch as they are. On the
  `text`/`images` documents of `pretrain` it needs `remove_unused_columns=False`: for a vision dataset it keeps only
  `messages`, `prompt`, `completion`, `image(s)`, so `text` is dropped and the collator fails with "Unexpected input
  keys in examples: ['images']".
- TRL's `GRPOTrainer` (`remove_unused_columns=False` by default, so the reward gets `answer` and `task`) trains on
  rows with 1 and 2 images, but not on a batch that mixes text-only prompts with image prompts: it passes `None` as a
  text-only prompt's images and `LlavaProcessor` raises a `TypeError`. With TRL's own GRPO, train on
  `rl_train.filter(lambda images: len(images) > 0, input_columns="images")` (or on the text rows alone).
- Sampling must not emit `"<image>"` (the next forward pass would fail with "Image features and image tokens do not
  match"): TRL's GRPO suppresses it, and [`build_tiny_vlm`] puts it in `generation_config.suppress_tokens`.
- Token budget: a row is at most ~70 tokens once the processor has expanded its images (16 tokens each), so TRL's
  default `max_length=1024` truncates nothing; a row cut inside its image tokens would fail with the same error.
- Transformers' Qwen2-VL processor cannot be built without torchvision; LLaVA's can: `CLIPImageProcessorPil` is the
  PIL backend of `CLIPImageProcessor` and needs no torchvision.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import torch
from datasets import Dataset, Features, List, Value
from datasets import Image as ImageFeature
from PIL import Image, ImageDraw
from transformers import AutoConfig, AutoModelForImageTextToText, LlavaProcessor, PreTrainedModel, ProcessorMixin

from trl_trapo.tasks import EOS_TOKEN, _interleave, build_char_tokenizer, exact_match_reward


try:  # the PIL backend, named directly so that transformers does not warn about the missing torchvision
    from transformers import CLIPImageProcessorPil as _CLIPImageProcessor
except ImportError:  # pragma: no cover - older transformers: CLIPImageProcessor is the PIL implementation
    from transformers import CLIPImageProcessor as _CLIPImageProcessor


logger = logging.getLogger(__name__)

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 56  # pixels, square
PATCH_SIZE = 14  # pixels; the vision tower sees a 4×4 grid of patches
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # "<image>" tokens per image after the processor expands it

# "role: content</s>" lines, content either a string or a list of image/text parts; the generation prompt ends in
# "assistant: ". `{{ '\n' }}` rather than a literal newline: processors render templates with `trim_blocks`, which
# eats a newline that follows a block tag.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}" + IMAGE_TOKEN + "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '" + EOS_TOKEN + "\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

DEFAULT_VLM_CONFIG = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "tiny_llava.json")

BACKGROUND = (255, 255, 255)
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 0),
}
SHAPES = ("square", "circle", "triangle")
# Shapes are aligned with the vision tower's 14-pixel patches (see the module docstring).
SHAPE_SIZES = (18, 20, 22, 24)  # side of a shape, pixels
PATCH_CORNERS = (14, 28, 42)  # inner corners of the patch grid (x or y), where a scene's one shape is centred, pixels
SHAPE_SHIFTS = (-2, 0, 2)  # offsets of a shape from its corner or quadrant centre (x or y), pixels
QUADRANTS = ((14, 14), (42, 14), (14, 42), (42, 42))  # centres of the 2×2-patch quadrants, pixels
MAX_TEXT_COUNT = 9

FAMILIES = ("colour", "count", "same", "text", "shape")
SPLIT_SFT_TASKS = "sft_tasks"
SPLIT_RL_ONLY = "rl_only"


# ----------------------------------------------------------------------------------------------------------------
# Processor and model
# ----------------------------------------------------------------------------------------------------------------


def build_vlm_processor() -> LlavaProcessor:
    """Build the LLaVA processor of the tiny VLM in-process (no download, no torchvision).

    The tokenizer is [`~trl_trapo.tasks.build_char_tokenizer`] plus one special token, `"<image>"` (id 101), with
    [`VLM_CHAT_TEMPLATE`]; the image processor is CLIP's PIL backend at 56×56 pixels (resize the shortest edge to 56,
    centre-crop 56×56, rescale to [0, 1], normalise with CLIP's mean and std). The processor expands each `"<image>"`
    of a text into `NUM_IMAGE_TOKENS` (16) of them, one per 14×14 patch.

    Returns:
        `LlavaProcessor`: call it as `processor(text=..., images=..., return_tensors="pt")`; `pixel_values` has shape
        `(total number of images, 3, 56, 56)`. The tokenizer is `processor.tokenizer` (`padding_side="right"`).
        It survives `save_pretrained` / `AutoProcessor.from_pretrained` offline.
    """
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    image_processor = _CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=VLM_CHAT_TEMPLATE,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",  # drop CLIP's class token: 16 patch tokens per image
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
    )


def build_tiny_vlm(
    processor: ProcessorMixin, config_path: str | os.PathLike | None = None, seed: int = 0
) -> PreTrainedModel:
    """Build a small randomly initialised vision-language model from a JSON config (no download).

    The JSON holds `model_type` (`"llava"`), a `text_config` and a `vision_config` (each with its own `model_type`)
    and the top-level LLaVA fields. The text config's `vocab_size`, `pad_token_id`, `bos_token_id` and
    `eos_token_id` and the top-level `image_token_id` are overwritten from `processor`. Initialisation runs under
    `torch.manual_seed(seed)` inside `torch.random.fork_rng`, so the caller's global RNG state is left untouched and
    the same seed gives the same weights.

    Args:
        processor (`ProcessorMixin`): the processor whose tokenizer and image token the model uses, typically from
            [`build_vlm_processor`].
        config_path (`str | os.PathLike | None`): JSON config; defaults to the shipped
            `trl_trapo/configs/tiny_llava.json` (text side as `tiny_causal_lm.json`, a one-layer CLIP vision tower of
            width 64 over 14×14 patches of 56×56 images: 0.64 M parameters in all).

    Returns:
        `PreTrainedModel`: an fp32 `LlavaForConditionalGeneration` in train mode whose `generation_config` carries the
        tokenizer's pad/bos/eos ids. It takes `input_ids`, `attention_mask` and `pixel_values` (`(num_images, 3, 56,
        56)`, the images of the whole batch in order) and round-trips through `save_pretrained` / `from_pretrained`.

    Raises:
        FileNotFoundError: if `config_path` does not exist.
        ValueError: if the JSON has no `model_type` or `text_config`, the tokenizer lacks a pad or eos token, or the
            vision tower's image or patch size disagrees with the processor's (the number of image tokens would not
            match the number of image features).
    """
    config_path = DEFAULT_VLM_CONFIG if config_path is None else os.fspath(config_path)
    with open(config_path, encoding="utf-8") as handle:
        config_kwargs: dict[str, Any] = json.load(handle)
    model_type = config_kwargs.pop("model_type", None)
    if model_type is None:
        raise ValueError(f'{config_path} has no `model_type`; add e.g. `"model_type": "llava"`.')
    if "text_config" not in config_kwargs:
        raise ValueError(f"{config_path} has no `text_config`; a vision-language config needs one.")
    tokenizer = processor.tokenizer
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError("`processor.tokenizer` needs a pad and an eos token; build it with `build_vlm_processor()`.")
    config_kwargs = {key: value for key, value in config_kwargs.items() if not key.startswith("_")}
    config_kwargs["text_config"] = dict(
        config_kwargs["text_config"],
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config_kwargs["image_token_id"] = tokenizer.convert_tokens_to_ids(processor.image_token)
    vision = config_kwargs.get("vision_config", {})
    crop = getattr(processor.image_processor, "crop_size", None) or {}
    expected = {"image_size": crop.get("height"), "patch_size": getattr(processor, "patch_size", None)}
    for key, value in expected.items():
        if value is not None and key in vision and vision[key] != value:
            raise ValueError(
                f"{config_path}: vision_config.{key}={vision[key]} but the processor uses {value}; the number of "
                "image tokens the processor inserts would not match the number of image features."
            )
    config = AutoConfig.for_model(model_type, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    # a sampled "<image>" token has no image features behind it: the next forward pass that sees it fails with "Image
    # features and image tokens do not match" (TRL's GRPO suppresses it the same way)
    model.generation_config.suppress_tokens = [config.image_token_id]
    return model


# ----------------------------------------------------------------------------------------------------------------
# Scenes: what an image shows, and how it is drawn
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One flat shape: `kind` in `SHAPES`, `colour` in `COLOURS`, centre `(x, y)` and side `size`, in pixels."""

    kind: str
    colour: str
    x: int
    y: int
    size: int

    def box(self) -> tuple[int, int, int, int]:
        """Inclusive bounding box `(left, top, right, bottom)` in pixels."""
        left, top = self.x - self.size // 2, self.y - self.size // 2
        return left, top, left + self.size - 1, top + self.size - 1


@dataclass(frozen=True)
class Scene:
    """What one image shows: one or more shapes of the same kind and colour (a tuple of [`Shape`])."""

    shapes: tuple[Shape, ...]

    @property
    def kind(self) -> str:
        """The kind of every shape of the scene, e.g. `"square"`."""
        return self.shapes[0].kind

    @property
    def colour(self) -> str:
        """The colour of every shape of the scene, e.g. `"red"`."""
        return self.shapes[0].colour

    @property
    def count(self) -> int:
        """The number of shapes, 1–3."""
        return len(self.shapes)

    def caption(self) -> str:
        """`"a red square."` for one shape, `"2 red squares."` for several."""
        return _describe(self.count, self.colour, self.kind, article=True) + "."

    def render(self) -> Image.Image:
        """Draw the scene: a 56×56 RGB PIL image, white background, shapes filled with their exact colour."""
        image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
        draw = ImageDraw.Draw(image)
        for shape in self.shapes:
            left, top, right, bottom = shape.box()
            fill = COLOURS[shape.colour]
            if shape.kind == "square":
                draw.rectangle((left, top, right, bottom), fill=fill)
            elif shape.kind == "circle":
                draw.ellipse((left, top, right, bottom), fill=fill)
            else:  # an upright isosceles triangle
                draw.polygon(((shape.x, top), (right, bottom), (left, bottom)), fill=fill)
        return image


def _describe(count: int, colour: str, kind: str, article: bool = False) -> str:
    if count == 1:
        return f"{'a' if article else '1'} {colour} {kind}"
    return f"{count} {colour} {kind}s"


def single_scenes() -> list[Scene]:
    """Every scene of one shape, in a fixed order: 3,888 scenes.

    One shape of side 18, 20, 22 or 24 pixels centred on one of the 3×3 inner corners of the 14-pixel patch grid,
    shifted by -2, 0 or 2 pixels in x and in y: each shape lies inside one 2×2 block of patches.
    """
    scenes = []
    for colour in COLOURS:
        for kind in SHAPES:
            for size in SHAPE_SIZES:
                for y in PATCH_CORNERS:
                    for x in PATCH_CORNERS:
                        scenes += [
                            Scene((Shape(kind, colour, x + dx, y + dy, size),))
                            for dy in SHAPE_SHIFTS
                            for dx in SHAPE_SHIFTS
                        ]
    return scenes


def multi_scenes() -> list[Scene]:
    """Every scene of 2 or 3 shapes, in a fixed order: 4,320 scenes.

    2 or 3 shapes of one kind, colour and side (18, 20, 22 or 24 pixels), each centred on the centre of a different
    quadrant (a 2×2 block of patches), all shifted by the same -2, 0 or 2 pixels in x and in y.
    """
    subsets = [subset for n in (2, 3) for subset in combinations(range(len(QUADRANTS)), n)]
    return [
        Scene(tuple(Shape(kind, colour, QUADRANTS[i][0] + dx, QUADRANTS[i][1] + dy, size) for i in subset))
        for colour in COLOURS
        for kind in SHAPES
        for size in SHAPE_SIZES
        for dy in SHAPE_SHIFTS
        for dx in SHAPE_SHIFTS
        for subset in subsets
    ]


def _by_count(single: Sequence[Scene], multi: Sequence[Scene]) -> list[Scene]:
    """Round-robin over the scenes of 1, 2 and 3 shapes: the scenes of the `count` family, balanced over answers."""
    return _interleave([list(single), [s for s in multi if s.count == 2], [s for s in multi if s.count == 3]])


def _hold_out(
    items: Sequence[Any],
    key: Callable[[Any], Any],
    num_eval: int,
    rng: random.Random,
    what: str,
    max_fraction: float = 0.1,
) -> tuple[list[Any], list[Any]]:
    """Split `items` into `num_eval` held-out items and a training pool, both round-robin over the groups of `key`.

    As `tasks._split_inputs`: every prefix of either list is near-uniform over the groups, and at most
    `max_fraction` of a group is held out (all of a one-item group).

    Raises:
        ValueError: if `num_eval` is more than that rule allows.
    """
    shuffled = list(items)
    rng.shuffle(shuffled)
    groups_by_key: dict[Any, list[Any]] = {}
    for item in shuffled:
        groups_by_key.setdefault(key(item), []).append(item)
    groups = [groups_by_key[k] for k in sorted(groups_by_key, key=str)]
    rng.shuffle(groups)
    quotas = [1 if len(group) == 1 else int(len(group) * max_fraction) for group in groups]
    if num_eval > sum(quotas) or num_eval >= len(shuffled):
        raise ValueError(
            f"`num_eval_per_task` or `num_eval_captions` is too large for the {what} ({len(shuffled)} items, at most "
            f"{min(sum(quotas), len(shuffled) - 1)} can be held out); use a smaller value."
        )
    held_out = _interleave([group[:quota] for group, quota in zip(groups, quotas)])[:num_eval]
    held_out_set = set(held_out)
    pool = _interleave([[item for item in group if item not in held_out_set] for group in groups])
    return held_out, pool


# ----------------------------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    task: str
    scenes: tuple[Scene, ...]
    question: str
    answer: str


def _colour_row(scene: Scene) -> _Row:
    return _Row("colour", (scene,), f"colour of the {scene.kind}?", scene.colour)


def _shape_row(scene: Scene) -> _Row:
    return _Row("shape", (scene,), "what shape is it?", scene.kind)


def _count_row(scene: Scene) -> _Row:
    return _Row("count", (scene,), f"how many {scene.kind}s?", str(scene.count))


def _same_rows(scenes: Sequence[Scene], n: int, rng: random.Random) -> list[_Row]:
    """`n` two-image rows, alternately same colour ("yes") and different colours ("no")."""
    by_colour: dict[str, list[Scene]] = {}
    for scene in scenes:
        by_colour.setdefault(scene.colour, []).append(scene)
    rows = []
    for i in range(n):
        first = scenes[i % len(scenes)]
        same = i % 2 == 0
        candidates = (
            [s for s in by_colour[first.colour] if s != first]
            if same
            else [s for colour, group in by_colour.items() if colour != first.colour for s in group]
        )
        second = rng.choice(candidates)
        rows.append(_Row("same", (first, second), "same colour?", "yes" if same else "no"))
    return rows


TEXT_QUESTIONS = ("colour", "shape", "count")


def text_inputs() -> list[tuple[int, str, str, str]]:
    """Every input of the `text` family, `(count, colour, kind, question)`: 9 × 4 × 3 × 3 = 324 inputs."""
    return [
        (count, colour, kind, question)
        for count in range(1, MAX_TEXT_COUNT + 1)
        for colour in COLOURS
        for kind in SHAPES
        for question in TEXT_QUESTIONS
    ]


def _text_answer(x: tuple[int, str, str, str]) -> str:
    count, colour, kind, question = x
    return {"colour": colour, "shape": kind, "count": str(count)}[question]


def _text_row(x: tuple[int, str, str, str]) -> _Row:
    count, colour, kind, question = x
    return _Row("text", (), f"{_describe(count, colour, kind)}. {question}?", _text_answer(x))


def _prompt(row: _Row) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image", "text": None} for _ in row.scenes]
    parts.append({"type": "text", "text": row.question})
    return [{"role": "user", "content": parts}]


# ----------------------------------------------------------------------------------------------------------------
# Pretraining corpus
# ----------------------------------------------------------------------------------------------------------------

SHAPE_FACTS = (
    "a square has 4 sides.",
    "a triangle has 3 sides.",
    "a circle is round.",
    "red, green, blue and yellow are colours.",
    "square, circle and triangle are shapes.",
)


def _pretrain_document(rng: random.Random, single: Sequence[Scene], multi: Sequence[Scene]) -> tuple[str, list[Scene]]:
    """One document: 1–2 captioned training images (three quarters of documents) or 1–4 text-only sentences."""
    if rng.random() < 0.75:
        scenes = [rng.choice(single if rng.random() < 0.5 else multi) for _ in range(rng.randint(1, 2))]
        return " ".join(IMAGE_TOKEN + scene.caption() for scene in scenes), scenes
    sentences = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.3:
            sentences.append(rng.choice(SHAPE_FACTS))
        else:
            count, colour, kind = rng.randint(1, MAX_TEXT_COUNT), rng.choice(list(COLOURS)), rng.choice(SHAPES)
            sentences.append(f"there {'is' if count == 1 else 'are'} {_describe(count, colour, kind, article=True)}.")
    return " ".join(sentences), []


# ----------------------------------------------------------------------------------------------------------------
# The suite
# ----------------------------------------------------------------------------------------------------------------

_MESSAGE_PARTS = List({"type": Value("string"), "text": Value("string")})
_PROMPT = List({"role": Value("string"), "content": _MESSAGE_PARTS})
_COMPLETION = List({"role": Value("string"), "content": Value("string")})
_IMAGES = List(ImageFeature())


@dataclass
class VisualTaskSuite:
    """The datasets of the built-in visual task suite, in TRL's conversational vision-language formats.

    Every dataset has an `images` column: a list of PIL images (56×56 RGB), `[]` on a text-only row, in the order of
    the row's image parts / `"<image>"` tokens.

    Args:
        pretrain (`Dataset`): language-modelling corpus, columns `text` (one `"<image>"` per image, e.g.
            `"<image>a red square. <image>2 blue circles."`, or text only) and `images`.
        sft (`Dataset`): conversational prompt-completion demonstrations, columns `prompt` (`[{"role": "user",
            "content": [{"type": "image", "text": None}, ..., {"type": "text", "text": question}]}]`), `completion`
            (`[{"role": "assistant", "content": answer}]`) and `images`.
        rl_train (`Dataset`): conversational prompt-only RL data, columns `prompt`, `images`, `answer`, `task` and
            `demonstration` (the answer for families with SFT data, `""` for the RL-only ones: guidance's
            `demonstration_column`).
        eval (`Dataset`): held-out prompts, columns `prompt`, `images`, `answer`, `task`, `split` (`"sft_tasks"` or
            `"rl_only"`); ordered by family. No eval image occurs in any training row.
        eval_captions (`Dataset`): held-out captioned images, columns `text` (`"<image>2 red circles."`) and `images`
            (one held-out image each), to measure forgetting of the pretraining objective.
        reward_funcs (`list[Callable]`): reward functions with TRL's signature; `[exact_match_reward]`.
    """

    pretrain: Dataset
    sft: Dataset
    rl_train: Dataset
    eval: Dataset
    eval_captions: Dataset
    reward_funcs: list[Callable[..., list[float]]] = field(default_factory=list)


def make_visual_task_suite(
    seed: int = 0,
    *,
    num_pretrain_docs: int = 2000,
    num_sft_per_task: int = 1000,
    num_rl_per_task: int = 500,
    rl_only_fraction: float = 0.5,
    num_eval_per_task: int = 48,
    num_eval_captions: int = 48,
    rl_only_families: Sequence[str] = ("shape",),
) -> VisualTaskSuite:
    """Generate the seeded visual task suite (see the module docstring for the families and why).

    The one-shape scenes are split by colour × shape and the 2–3-shape scenes by count (at most a tenth of each group
    held out), the `text` inputs by answer (at most a quarter): the held-out scenes serve every eval row and
    `eval_captions`, the rest every SFT row, RL prompt and pretraining image (cycling through the pool, so a request
    larger than the pool repeats scenes). Rows of `sft` and `rl_train` are shuffled; `eval` is ordered by family.

    Args:
        seed (`int`): seed of every random choice; the same seed gives identical datasets (pixel for pixel).
        num_pretrain_docs (`int`): pretraining documents (a quarter of them text only).
        num_sft_per_task (`int`): SFT rows per family that has demonstrations.
        num_rl_per_task (`int`): RL prompts per family that has demonstrations.
        rl_only_fraction (`float`): fraction of `rl_train` rows from the RL-only families, in [0, 1) (as in
            [`~trl_trapo.tasks.make_task_suite`]).
        num_eval_per_task (`int`): held-out eval prompts per family; at most 78 (what the `text` family can hold
            out).
        num_eval_captions (`int`): held-out caption documents (alternately of one and of 2–3 shapes).
        rl_only_families (`Sequence[str]`): families with RL prompts and eval rows but no SFT demonstrations (split
            `"rl_only"`); `()` puts every family in SFT.

    Returns:
        `VisualTaskSuite`: `pretrain` (`text`, `images`), `sft` (`prompt`, `completion`, `images`), `rl_train`
        (`prompt`, `images`, `answer`, `task`, `demonstration`), `eval` (`prompt`, `images`, `answer`, `task`,
        `split`), `eval_captions` (`text`, `images`) and `reward_funcs == [exact_match_reward]`.

    Raises:
        ValueError: if a size is negative, `rl_only_fraction` is outside [0, 1), a name in `rl_only_families` is not a
            family or every family is named, or `num_eval_per_task` / `num_eval_captions` is more than the scenes can
            hold out.
    """
    sizes = {
        "num_pretrain_docs": num_pretrain_docs,
        "num_sft_per_task": num_sft_per_task,
        "num_rl_per_task": num_rl_per_task,
        "num_eval_per_task": num_eval_per_task,
        "num_eval_captions": num_eval_captions,
    }
    for name, value in sizes.items():
        if value < 0:
            raise ValueError(f"`{name}` must be >= 0, got {value}.")
    if not 0.0 <= rl_only_fraction < 1.0:
        raise ValueError(f"`rl_only_fraction` must be in [0, 1), got {rl_only_fraction}.")
    unknown = sorted(set(rl_only_families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"`rl_only_families` has unknown families {unknown}; the families are {list(FAMILIES)}.")
    if set(rl_only_families) >= set(FAMILIES):
        raise ValueError("`rl_only_families` names every family; at least one needs SFT demonstrations.")

    rng = random.Random(seed)
    combos = len(COLOURS) * len(SHAPES)
    num_single_eval = combos * math.ceil(max(num_eval_per_task, (num_eval_captions + 1) // 2) / combos)
    num_multi_eval = 2 * math.ceil(max(num_eval_per_task / 3, num_eval_captions / 4))
    eval_single, train_single = _hold_out(
        single_scenes(), lambda s: (s.colour, s.kind), num_single_eval, rng, "scenes of one shape"
    )
    eval_multi, train_multi = _hold_out(multi_scenes(), lambda s: s.count, num_multi_eval, rng, "scenes of 2–3 shapes")
    eval_counted, train_counted = _by_count(eval_single, eval_multi), _by_count(train_single, train_multi)
    # a quarter, not a tenth: each `text` answer has only 12–36 inputs
    eval_text, train_text = _hold_out(text_inputs(), _text_answer, num_eval_per_task, rng, "`text` family", 0.25)

    def rows(family: str, single: Sequence[Scene], counted: Sequence[Scene], texts: Sequence, n: int) -> list[_Row]:
        if n == 0:
            return []
        if family == "colour":
            # the pool is round-robin over colour × shape, so any prefix is balanced over colours
            return [_colour_row(single[i % len(single)]) for i in range(n)]
        if family == "shape":
            return [_shape_row(single[i % len(single)]) for i in range(n)]
        if family == "count":
            return [_count_row(counted[i % len(counted)]) for i in range(n)]
        if family == "same":
            return _same_rows(single, n, rng)
        return [_text_row(texts[i % len(texts)]) for i in range(n)]

    rl_only = set(rl_only_families)
    num_sft_families = len(FAMILIES) - len(rl_only)
    num_rl_only_per_task = round(
        rl_only_fraction * num_sft_families * num_rl_per_task / ((1.0 - rl_only_fraction) * max(len(rl_only), 1))
    )
    sft_rows: list[_Row] = []
    rl_rows: list[_Row] = []
    eval_rows: list[tuple[_Row, str]] = []
    for family in FAMILIES:
        split = SPLIT_RL_ONLY if family in rl_only else SPLIT_SFT_TASKS
        eval_rows += [(row, split) for row in rows(family, eval_single, eval_counted, eval_text, num_eval_per_task)]
        if family not in rl_only:
            sft_rows += rows(family, train_single, train_counted, train_text, num_sft_per_task)
        num_rl = num_rl_only_per_task if family in rl_only else num_rl_per_task
        rl_rows += rows(family, train_single, train_counted, train_text, num_rl)
    rng.shuffle(sft_rows)
    rng.shuffle(rl_rows)
    documents = [_pretrain_document(rng, train_single, train_multi) for _ in range(num_pretrain_docs)]
    caption_scenes = _interleave([eval_single, eval_multi])[:num_eval_captions]
    logger.debug(
        "Visual task suite (seed %d): %d pretraining documents, %d SFT rows, %d RL prompts, %d eval prompts.",
        seed,
        len(documents),
        len(sft_rows),
        len(rl_rows),
        len(eval_rows),
    )

    encoded: dict[Scene, dict[str, Any]] = {}

    def image(scene: Scene) -> dict[str, Any]:
        # a scene recurs in many rows: draw and PNG-encode it once (what `datasets` would otherwise do per row)
        if scene not in encoded:
            buffer = io.BytesIO()
            scene.render().save(buffer, format="PNG", compress_level=1)
            encoded[scene] = {"bytes": buffer.getvalue(), "path": None}
        return encoded[scene]

    def images(row: _Row) -> list[dict[str, Any]]:
        return [image(scene) for scene in row.scenes]

    return VisualTaskSuite(
        pretrain=Dataset.from_dict(
            {
                "text": [text for text, _ in documents],
                "images": [[image(scene) for scene in scenes] for _, scenes in documents],
            },
            features=Features({"text": Value("string"), "images": _IMAGES}),
        ),
        sft=Dataset.from_dict(
            {
                "prompt": [_prompt(row) for row in sft_rows],
                "completion": [[{"role": "assistant", "content": row.answer}] for row in sft_rows],
                "images": [images(row) for row in sft_rows],
            },
            features=Features({"prompt": _PROMPT, "completion": _COMPLETION, "images": _IMAGES}),
        ),
        rl_train=Dataset.from_dict(
            {
                "prompt": [_prompt(row) for row in rl_rows],
                "images": [images(row) for row in rl_rows],
                "answer": [row.answer for row in rl_rows],
                "task": [row.task for row in rl_rows],
                # what guidance may show (`demonstration_column="demonstration"`): a family without SFT data has no
                # demonstration either, so only exploration can move it
                "demonstration": ["" if row.task in rl_only else row.answer for row in rl_rows],
            },
            features=Features(
                {
                    "prompt": _PROMPT,
                    "images": _IMAGES,
                    "answer": Value("string"),
                    "task": Value("string"),
                    "demonstration": Value("string"),
                }
            ),
        ),
        eval=Dataset.from_dict(
            {
                "prompt": [_prompt(row) for row, _ in eval_rows],
                "images": [images(row) for row, _ in eval_rows],
                "answer": [row.answer for row, _ in eval_rows],
                "task": [row.task for row, _ in eval_rows],
                "split": [split for _, split in eval_rows],
            },
            features=Features(
                {
                    "prompt": _PROMPT,
                    "images": _IMAGES,
                    "answer": Value("string"),
                    "task": Value("string"),
                    "split": Value("string"),
                }
            ),
        ),
        eval_captions=Dataset.from_dict(
            {
                "text": [IMAGE_TOKEN + scene.caption() for scene in caption_scenes],
                "images": [[image(scene)] for scene in caption_scenes],
            },
            features=Features({"text": Value("string"), "images": _IMAGES}),
        ),
        reward_funcs=[exact_match_reward],
    )


# ----------------------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------------------


def _batch_inputs(processor: ProcessorMixin, texts: list[str], images: list[list], padding_side: str, device):
    flat = [image for row in images for image in row]
    inputs = processor(
        text=texts,
        images=flat or None,
        padding=True,
        padding_side=padding_side,
        return_tensors="pt",
        add_special_tokens=False,
    )
    return inputs.to(device)


@torch.no_grad()
def greedy_vlm_accuracy(
    model: PreTrainedModel,
    processor: ProcessorMixin,
    dataset: Dataset,
    batch_size: int = 32,
    max_new_tokens: int | None = None,
) -> dict[str, float]:
    """Greedy-decoding exact-match accuracy of a vision-language model on rows with `prompt`, `images` and `answer`.

    Conversational prompts are rendered with the processor's chat template (generation prompt added), left-padded,
    and the batch's images passed in row order (a batch may mix rows with 0, 1 and 2 images). Each completion is cut
    at the first eos and scored with [`~trl_trapo.tasks.exact_match_reward`]'s rule. The model's train/eval mode is
    restored.

    Args:
        model (`PreTrainedModel`): vision-language model with `generate`, e.g. from [`build_tiny_vlm`].
        processor (`ProcessorMixin`): its processor; its tokenizer needs a pad and an eos token.
        dataset (`Dataset`): rows with `prompt`, `images` and `answer`, optionally `split` and `task` (the suite's
            `eval`).
        batch_size (`int`): prompts per `generate` call.
        max_new_tokens (`int | None`): generation budget; defaults to the longest tokenized answer + 4.

    Returns:
        `dict[str, float]`: `"accuracy"` (in [0, 1]), `"accuracy_<split>"` for every `split` and
        `"accuracy_<task>"` for every `task` present.

    Raises:
        ValueError: if `dataset` lacks `prompt`, `images` or `answer`, is empty, or `batch_size < 1`.
    """
    for column in ("prompt", "images", "answer"):
        if column not in dataset.column_names:
            raise ValueError(f"`dataset` needs a `{column}` column; it has {dataset.column_names}.")
    if len(dataset) == 0:
        raise ValueError("`dataset` is empty.")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
    tokenizer = processor.tokenizer
    answers = [str(a) for a in dataset["answer"]]
    if max_new_tokens is None:
        max_new_tokens = max(len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers) + 4

    was_training = model.training
    device = next(model.parameters()).device
    correct: list[float] = []
    try:
        model.eval()
        for start in range(0, len(dataset), batch_size):
            batch = dataset[start : start + batch_size]
            prompts = [
                p
                if isinstance(p, str)
                else processor.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                for p in batch["prompt"]
            ]
            inputs = _batch_inputs(processor, prompts, batch["images"], "left", device)
            output_ids = model.generate(
                **inputs,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                suppress_tokens=[tokenizer.convert_tokens_to_ids(processor.image_token)],
            )
            texts = []
            for ids in output_ids[:, inputs["input_ids"].shape[1] :].tolist():  # (B, ≤ max_new_tokens)
                if tokenizer.eos_token_id in ids:
                    ids = ids[: ids.index(tokenizer.eos_token_id)]
                texts.append(tokenizer.decode(ids, skip_special_tokens=True))
            correct.extend(exact_match_reward(None, texts, answers[start : start + batch_size]))
    finally:
        model.train(was_training)

    metrics = {"accuracy": sum(correct) / len(correct)}
    for column in ("split", "task"):
        if column in dataset.column_names:
            values = dataset[column]
            for name in sorted(set(values)):
                scores = [c for c, v in zip(correct, values) if v == name]
                metrics[f"accuracy_{name}"] = sum(scores) / len(scores)
    return metrics


@torch.no_grad()
def caption_loss(model: PreTrainedModel, processor: ProcessorMixin, dataset: Dataset, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats per token) of `model` on documents with `text` and `images` columns.

    The loss counts every text token of a document (eos appended) after its first; the `"<image>"` tokens and padding
    are not predicted. On the suite's `eval_captions`, a rise of this loss during fine-tuning measures forgetting of
    the pretraining objective. The model's train/eval mode is restored.

    Args:
        model (`PreTrainedModel`): vision-language model, e.g. from [`build_tiny_vlm`].
        processor (`ProcessorMixin`): its processor.
        dataset (`Dataset`): rows with `text` (one `"<image>"` per image) and `images`.
        batch_size (`int`): documents per forward pass.

    Returns:
        `float`: the token-weighted mean loss, in nats.

    Raises:
        ValueError: if `dataset` lacks `text` or `images`, is empty, or `batch_size < 1`.
    """
    for column in ("text", "images"):
        if column not in dataset.column_names:
            raise ValueError(f"`dataset` needs a `{column}` column; it has {dataset.column_names}.")
    if len(dataset) == 0:
        raise ValueError("`dataset` is empty.")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
    tokenizer = processor.tokenizer
    image_token_id = tokenizer.convert_tokens_to_ids(processor.image_token)
    was_training = model.training
    device = next(model.parameters()).device
    total, count = 0.0, 0
    try:
        model.eval()
        for start in range(0, len(dataset), batch_size):
            batch = dataset[start : start + batch_size]
            texts = [text + tokenizer.eos_token for text in batch["text"]]
            inputs = _batch_inputs(processor, texts, batch["images"], "right", device)
            labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
            labels = labels.masked_fill(labels == image_token_id, -100)
            logits = model(**inputs).logits[:, :-1].float()  # (B, T - 1, V)
            targets = labels[:, 1:]
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction="sum"
            ).item()
            count += int((targets != -100).sum())
    finally:
        model.train(was_training)
    return total / max(count, 1)
