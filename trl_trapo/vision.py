"""Vision-language rows: TRL's `images` / `image` column turned into token ids and model inputs by the processor.

A run is a vision-language (VLM) run when its `processing_class` is a processor (`transformers.ProcessorMixin`), as in
TRL's `SFTTrainer` and `GRPOTrainer`. Its rows follow TRL's conventions:

| objective | columns | what the processor gets |
|---|---|---|
| RL prompts, eval prompts | `prompt` (conversational; image parts `{"type": "image"}`) + `images` (list) or `image` | the prompt rendered by the processor's chat template with the generation prompt, and the row's images |
| SFT | `prompt` + `completion` (or `messages`) + `images` / `image` | the prompt, then the completion (no images in it) |
| pretraining, eval text | `text` with the processor's image token (e.g. `<image>`) once per image + `images` / `image` | the text and the images |

A conversational prompt whose user content is a plain string gets one image part per image before the text of its
first user message (TRL's `prepare_multimodal_messages`). A row without images (an empty list, or None) is a text row:
text rows and image rows mix freely in one dataset and one batch.

What the processor returns besides `input_ids` (`pixel_values`, `image_grid_thw`, `image_sizes`, ... whatever the
architecture needs) becomes the row's `model_inputs`: one tensor per name with a leading dimension over the row's
images (or patches), which [`~trl_trapo.collator.combine_model_inputs`] concatenates over the rows of a batch, in row
order, so the model matches them to the image tokens of `input_ids` in order. The image tokens themselves are in the
row's ids (the processor expands each placeholder), so lengths, masks and the context check count them.

Rows are processed once, when the trainer is built (the processed inputs are stored with the rows, as floats: mind
the memory for large image datasets; the built-in visual task's 56x56 images take 37 KiB a row). What is refused,
naming the row and the fix: an image column with a tokenizer instead of a processor, an entry of `images` that is not
an image, an image larger than `max_image_pixels`, a row whose number of image placeholders does not match its
images, an SFT completion that holds images, a row whose image tokens would be cut by `max_length`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


logger = logging.getLogger(__name__)

IMAGE_COLUMNS = ("images", "image")  # TRL's image columns: a list of images per row, or one image
# what the processor returns that TRAPO builds itself (ids and masks), not model inputs of the row
TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


def is_processor(processing_class: Any) -> bool:
    """Whether `processing_class` is a multimodal processor (`transformers.ProcessorMixin`), not a tokenizer."""
    from transformers import ProcessorMixin

    return isinstance(processing_class, ProcessorMixin)


def text_tokenizer(processing_class: Any):
    """The tokenizer of `processing_class`: the processor's `tokenizer`, or `processing_class` itself.

    Raises:
        ValueError: if a processor has no tokenizer.
    """
    if not is_processor(processing_class):
        return processing_class
    tokenizer = getattr(processing_class, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            f"`processing_class` is a {type(processing_class).__name__} without a tokenizer; TRAPO trains text "
            "completions: pass a processor that has one (e.g. `AutoProcessor.from_pretrained(model_id)`)."
        )
    return tokenizer


def model_context(model: Any) -> int | None:
    """The model's context in positions: `max_position_embeddings` of its config, or of its text config (a VLM's
    language model); None when unknown."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    context = getattr(config, "max_position_embeddings", None)
    if context is None and hasattr(config, "get_text_config"):
        context = getattr(config.get_text_config(), "max_position_embeddings", None)
    return context


def image_column(columns: Sequence[str], role: str) -> str | None:
    """The image column among `columns` (`images` or `image`), or None.

    Raises:
        ValueError: if both are present (which one holds the row's images would be a guess).
    """
    present = [c for c in IMAGE_COLUMNS if c in columns]
    if len(present) > 1:
        raise ValueError(
            f"`{role}` has both an 'images' and an 'image' column; keep one (`images`: a list per row, `image`: one)."
        )
    return present[0] if present else None


def check_no_images(columns: Sequence[str], role: str, processing_class: Any) -> None:
    """Refuse an image column when `processing_class` is a tokenizer: the images would be silently ignored.

    Raises:
        ValueError: naming the dataset, the column and the fix.
    """
    column = image_column(columns, role)
    if column is not None and not is_processor(processing_class):
        raise ValueError(
            f"`{role}` has an {column!r} column, but `processing_class` is a tokenizer "
            f"({type(processing_class).__name__}), which cannot read images: pass the model's processor (e.g. "
            "`AutoProcessor.from_pretrained(model_id)`), or drop the column to train on the text alone."
        )


def _is_image(value: Any) -> bool:
    from PIL import Image

    return isinstance(value, Image.Image)


class ImageRows:
    """Turns rows with images into token ids and model inputs with a processor (see the module docstring).

    Args:
        processor (`transformers.ProcessorMixin`): the policy's processor; its `tokenizer` renders the text and its
            `image_token` (e.g. `"<image>"`) is the placeholder counted against the images.
        template_kwargs (`dict`, *optional*): extra arguments of `apply_chat_template`.
        max_image_pixels (`int`, *optional*): the largest image accepted, in pixels (width x height); None: no limit.

    Raises:
        ValueError: if `processor` is not a processor, or it has no `image_token`.
    """

    def __init__(self, processor, template_kwargs: Mapping | None = None, max_image_pixels: int | None = None):
        if not is_processor(processor):
            raise ValueError(f"ImageRows needs a processor (ProcessorMixin); got {type(processor).__name__}.")
        self.processor = processor
        self.tokenizer = text_tokenizer(processor)
        self.template_kwargs = dict(template_kwargs or {})
        self.max_image_pixels = max_image_pixels
        self.image_token = getattr(processor, "image_token", None)
        if self.image_token is None:
            raise ValueError(
                f"The processor {type(processor).__name__} has no `image_token`, so TRAPO cannot match a row's images "
                "to its text: use a vision-language processor (e.g. LLaVA's, Qwen2-VL's)."
            )

    # ---- one row ----------------------------------------------------------------------------------------------------
    def images_of(self, example: Mapping, column: str | None, role: str, row: int | str) -> list:
        """The row's images as a list (empty: a text row).

        Raises:
            ValueError: naming the row, for an entry that is not an image or an image over `max_image_pixels`.
        """
        if column is None:
            return []
        value = example.get(column)
        if value is None:
            return []
        images = list(value) if isinstance(value, (list, tuple)) else [value]
        for position, image in enumerate(images):
            if not _is_image(image):
                raise ValueError(
                    f"`{role}` row {row}: entry {position} of {column!r} is a {type(image).__name__}, not an image. "
                    "Give PIL images (`PIL.Image.open(path)`, or a `datasets.Image()` column)."
                )
            if self.max_image_pixels is not None and image.width * image.height > self.max_image_pixels:
                raise ValueError(
                    f"`{role}` row {row}: image {position} is {image.width}x{image.height} = "
                    f"{image.width * image.height} pixels, over max_image_pixels={self.max_image_pixels}. Resize "
                    "the images (e.g. `image.thumbnail((w, h))` in a `dataset.map`) or raise max_image_pixels."
                )
        return [image.convert("RGB") if image.mode != "RGB" else image for image in images]

    def _messages(self, messages: list, images: list, role: str, row: int | str) -> list:
        """TRL's `prepare_multimodal_messages`: image parts filled with the row's images (added before the first
        user text when the contents are plain strings).

        Raises:
            ValueError: naming the row, when the image parts and the images do not match.
        """
        from trl.data_utils import prepare_multimodal_messages

        try:
            return prepare_multimodal_messages(messages, images)
        except ValueError as error:
            raise ValueError(
                f"`{role}` row {row}: its messages and its {len(images)} images do not match ({error}). Give one "
                '`{"type": "image"}` part per image, or plain-string contents (the images then go before the first '
                "user text)."
            ) from error

    def encode(
        self, text: str, images: list, role: str, row: int | str, add_special_tokens: bool = False
    ) -> tuple[list[int], dict[str, np.ndarray]]:
        """`(input_ids, model_inputs)` of one text with its images (each placeholder expanded by the processor);
        `add_special_tokens` as in `tokenizer(text, add_special_tokens=...)` (a standard text prompt gets them, as
        [`~trl_trapo.data.tokenize_prompt`] does).

        Returns:
            `input_ids` (a list of L token ids, image tokens included) and `model_inputs` (name -> array with a
            leading dimension over the images or patches; empty for a text row).

        Raises:
            ValueError: naming the row, when the text's image placeholders do not match the number of images.
        """
        placeholders = text.count(self.image_token)
        if placeholders != len(images):
            raise ValueError(
                f"`{role}` row {row} has {len(images)} images but its text holds {placeholders} image placeholders "
                f"({self.image_token!r}): give one placeholder per image (a conversational row: one "
                '`{"type": "image"}` part per image), or fix the image column.'
            )
        if not images:
            ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
            return list(ids), {}
        encoded = self.processor(
            text=[text], images=images, return_tensors="np", add_special_tokens=add_special_tokens
        )
        ids = [int(t) for t in encoded["input_ids"][0]]
        inputs = {name: np.asarray(value) for name, value in encoded.items() if name not in TEXT_KEYS}
        return ids, inputs

    def prompt(self, example: Mapping, column: str | None, role: str, row: int | str, tools: list[dict] | None = None):
        """`(prompt_ids, model_inputs)` of an RL or eval prompt (conversational or text).

        Args:
            tools (`list[dict]`, *optional*): tool schemas the chat template renders into a conversational prompt
                (`apply_chat_template(tools=...)`, as TRL's `GRPOTrainer` renders a VLM's prompts with `tools=`).
        """
        images = self.images_of(example, column, role, row)
        prompt = example["prompt"]
        if not isinstance(prompt, list):
            return self.encode(str(prompt), images, role, row, add_special_tokens=True)
        text = self.processor.apply_chat_template(
            self._messages(prompt, images, role, row),
            tokenize=False,
            add_generation_prompt=True,
            **({**self.template_kwargs, "tools": tools} if tools else self.template_kwargs),
        )
        return self.encode(text, images, role, row)

    def sft(self, example: Mapping, column: str | None, role: str, row: int | str, assistant_only_loss: bool = False):
        """`(input_ids, completion_mask, model_inputs)` of an SFT row.

        - Prompt-completion rows: the prompt with its images, then the completion, which ends with EOS (appended
          unless the template ends the turn with it); the completion is trained (`assistant_only_loss` does not
          apply: TRL's vision collator refuses it for such rows).
        - `messages` rows (TRL's language-modeling form): the conversation rendered whole, whatever its last role,
          and every token trained but the image tokens, as TRL's `DataCollatorForVisionLanguageModeling` labels such
          a row (it trains the image tokens too; TRAPO never trains them, as in [`document_mask`]: they stand for the
          image, which the model reads and never writes). With `assistant_only_loss`, the processor's assistant mask
          (`return_assistant_tokens_mask=True`, as TRL's collator asks for it): every assistant turn.

        Raises:
            ValueError: naming the row, when the completion holds images, or (with `assistant_only_loss`) when the
                assistant mask of a `messages` row is all zeros (the template has no `{% generation %}` markers).
        """
        images = self.images_of(example, column, role, row)
        if "messages" in example and example.get("messages") is not None and "completion" not in example:
            messages = self._messages(list(example["messages"]), images, role, row)
            text = self.processor.apply_chat_template(messages, tokenize=False, **self.template_kwargs)
            ids, inputs = self.encode(text, images, role, row)
            image_id = self.image_token_id()
            mask = [0 if t == image_id else 1 for t in ids]
            if assistant_only_loss:
                assistant = self._assistant_mask(messages, images, ids, role, row)
                mask = [m * a for m, a in zip(mask, assistant, strict=True)]
            return ids, mask, inputs
        prompt, completion = example["prompt"], example["completion"]
        eos = self.tokenizer.eos_token_id
        if isinstance(prompt, list):
            full = self._messages(list(prompt) + list(completion), images, role, row)
            prompt_text = self.processor.apply_chat_template(
                full[: len(prompt)], tokenize=False, add_generation_prompt=True, **self.template_kwargs
            )
            whole = self.processor.apply_chat_template(full, tokenize=False, **self.template_kwargs)
            if not whole.startswith(prompt_text):
                raise ValueError(
                    f"`{role}` row {row}: the chat template renders the prompt differently alone and with the "
                    "completion, so the completion's tokens cannot be told apart; use a template whose generation "
                    "prompt is a prefix of the assistant turn."
                )
            completion_text = whole[len(prompt_text) :]
        else:
            prompt_text, completion_text = str(prompt), str(completion)
        if self.image_token in completion_text:
            raise ValueError(
                f"`{role}` row {row}: the completion holds an image placeholder; TRAPO trains text completions: put "
                "the images in the prompt."
            )
        prompt_ids, inputs = self.encode(prompt_text, images, role, row)
        completion_ids = list(self.tokenizer(completion_text, add_special_tokens=False)["input_ids"])
        if eos not in completion_ids:
            completion_ids.append(eos)
        return prompt_ids + completion_ids, [0] * len(prompt_ids) + [1] * len(completion_ids), inputs

    def _assistant_mask(self, messages: list, images: list, ids: list[int], role: str, row: int | str) -> list[int]:
        """The processor's assistant mask of a conversation whose ids are `ids` (1 on the assistant's tokens).

        Raises:
            ValueError: naming the row, when the mask is all zeros.
        """
        rendered = self.processor.apply_chat_template(
            messages,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            return_tensors="np",
            **self.template_kwargs,
        )
        if [int(t) for t in rendered["input_ids"][0]] != ids:  # pragma: no cover - the processor renders one text
            raise ValueError(f"`{role}` row {row}: the processor's assistant mask is not of the row's tokens.")
        mask = [int(m) for m in rendered["assistant_masks"][0]]
        if 1 not in mask:
            raise ValueError(
                f"assistant_only_loss=True: the chat template's assistant mask of `{role}` row {row} is all zeros "
                "(the processor's template has no `{% generation %}` markers, or the row no assistant turn). Put "
                "`{% generation %}...{% endgeneration %}` around the assistant's content and end-of-turn token, or set "
                "assistant_only_loss=False."
            )
        return mask

    def check_document(
        self, example: Mapping, column: str, role: str, row: int | str, max_length: int | None = None
    ) -> None:
        """Check a pretraining document before training: its images, one placeholder per image in its `text`, and,
        given `max_length`, that a row of that length keeps its image tokens whole (this runs the processor on the
        document's images: a row it would cut fails here, not hours into training when it is read).

        Raises:
            ValueError: naming the row, as [`images_of`], [`encode`] and [`cut`] do.
        """
        images = self.images_of(example, column, role, row)
        text = str(example.get("text") or "")
        if text.count(self.image_token) != len(images):
            raise ValueError(
                f"`{role}` row {row} has {len(images)} images but its text holds {text.count(self.image_token)} image "
                f"placeholders ({self.image_token!r}): write one {self.image_token!r} in the text where each image "
                "goes, or fix the image column."
            )
        if images and max_length is not None:
            ids, _ = self.document(text, images, role, row)
            self.cut(ids, max_length, role, row)

    def document(self, text: str, images: list, role: str, row: int | str):
        """`(input_ids, model_inputs)` of a pretraining document (its placeholders expanded), EOS appended."""
        ids, inputs = self.encode(text, images, role, row)
        return ids + [self.tokenizer.eos_token_id], inputs

    def image_token_id(self) -> int:
        """The id of the (expanded) image token."""
        return int(self.tokenizer.convert_tokens_to_ids(self.image_token))

    def document_mask(self, ids: Sequence[int]) -> torch.Tensor:
        """The target-aligned mask of a document row: `(L - 1,)` float, 1 on every next token but the image
        tokens (they stand for the image, which the model reads and never predicts: their logit is suppressed, see
        [`SuppressTokens`]), as TRL's vision collators set their labels to -100."""
        image_id = self.image_token_id()
        return torch.tensor([0.0 if int(t) == image_id else 1.0 for t in ids[1:]])

    def cut(self, ids: list[int], max_length: int, role: str, row: int | str) -> int:
        """How many of `ids` a row of at most `max_length` tokens keeps: all, or `max_length` when the cut leaves
        every image token whole.

        Raises:
            ValueError: naming the row, when `max_length` would cut the row's image tokens.
        """
        if len(ids) <= max_length:
            return len(ids)
        image_id = self.image_token_id()
        if image_id in ids[max_length:]:
            raise ValueError(
                f"`{role}` row {row} is {len(ids)} tokens long and its image tokens reach past {max_length} tokens; "
                "cutting them would separate the image from its tokens (the model would fail with 'Image features "
                "and image tokens do not match'). Raise the maximum length, or use smaller or fewer images."
            )
        return max_length


def as_tensors(model_inputs: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
    """A row's stored model inputs (arrays, or nested lists as a `datasets.Dataset` returns them) as tensors; None
    and empty entries (a text row among image rows) are no input. Floats become float32, integers int64."""
    out = {}
    for name, value in (model_inputs or {}).items():
        if value is None:
            continue
        tensor = torch.as_tensor(np.asarray(value))
        if tensor.numel() == 0:
            continue
        out[name] = tensor.float() if tensor.is_floating_point() else tensor
    return out


def examples_model_inputs(examples: Sequence[Mapping], key: str = "model_inputs") -> list[dict[str, torch.Tensor]]:
    """Each example's stored model inputs (its `key` entry) as tensors ([`as_tensors`]), converted once per distinct
    example object: the `num_generations` rows of a group are one dict repeated, so they share one set of tensors
    (a memory that keeps several of them, e.g. self-imitation's successes, then keeps one copy).

    Returns:
        `list[dict[str, torch.Tensor]]`: one entry per example (empty for a row without inputs)."""
    converted: dict[int, dict[str, torch.Tensor]] = {}  # id(example) -> its tensors (`examples` keeps them alive)
    for example in examples:
        if id(example) not in converted:
            converted[id(example)] = as_tensors(example.get(key))
    return [converted[id(example)] for example in examples]


def is_vision_language_model(model: Any) -> bool:
    """Whether `model` (a model, or its config) is a vision-language model: its config has a `vision_config`, or its
    type is one transformers loads with `AutoModelForImageTextToText`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    config = getattr(model, "config", model)
    return (
        getattr(config, "vision_config", None) is not None
        or getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    )


def load_policy(model_id: str, model_init_kwargs: Mapping | None = None):
    """A policy loaded by id or path: a vision-language model with `AutoModelForImageTextToText` (as TRL's trainers
    do), anything else with `AutoModelForCausalLM`.

    Raises:
        ValueError: naming `model`, when transformers cannot read its config (an unknown `model_type`), as
            [`~trl_trapo.setup_checks.check_model_loading`] (checked before any weight loads), and for a keyword of
            `model_init_kwargs` the model's constructor refuses ([`~trl_trapo.setup_checks.unknown_model_keyword`]).
        OSError / ValueError: as `from_pretrained` raises them (no such model, no config).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from .setup_checks import check_model_loading, unknown_model_keyword

    kwargs = dict(model_init_kwargs or {})
    try:
        config = AutoConfig.from_pretrained(
            model_id, revision=kwargs.get("revision"), trust_remote_code=kwargs.get("trust_remote_code", False)
        )
    except (ValueError, KeyError) as error:  # e.g. a `model_type` this transformers does not know
        raise ValueError(
            f"model={model_id!r} (`--model_name_or_path`): transformers cannot read its config: {error}"
        ) from error
    check_model_loading(model_id, config, kwargs)
    auto = AutoModelForImageTextToText if is_vision_language_model(config) else AutoModelForCausalLM
    try:
        return auto.from_pretrained(model_id, **kwargs)
    except TypeError as error:  # a keyword the model's constructor refused: named, with the closest accepted one
        unknown = unknown_model_keyword(error, kwargs, config, model_id)
        if unknown is None:
            raise
        raise unknown from None


VISION_MODULES = ("vision_tower", "visual", "vision_model", "multi_modal_projector")  # how transformers names them


def freeze_vision_tower(model) -> int:
    """Freeze the vision encoder and multimodal projector of a VLM (`requires_grad=False` on every parameter of a
    submodule named as in `VISION_MODULES`); return the number of parameters frozen.

    Raises:
        ValueError: if the model has no such submodule (a text model, or an architecture that names it otherwise).
    """
    frozen = 0
    for name, module in model.named_modules():
        if name.split(".")[-1] in VISION_MODULES:
            for parameter in module.parameters():
                if parameter.requires_grad:
                    parameter.requires_grad_(False)
                    frozen += parameter.numel()
    if not any(name.split(".")[-1] in VISION_MODULES for name, _ in model.named_modules()):
        raise ValueError(
            f"freeze_vision_tower=True, but {type(model).__name__} has no submodule named one of {VISION_MODULES}: "
            "it is not a vision-language model TRAPO recognises. Set freeze_vision_tower=False, or freeze the "
            "encoder yourself (`module.requires_grad_(False)`) before building the trainer."
        )
    return frozen


def adapter_config_outside_frozen_tower(model, peft_config):
    """`peft_config` for a policy whose vision encoder `freeze_vision_tower` froze: `target_modules` such as
    `["q_proj", "v_proj"]` or `"all-linear"` also match the encoder's attention layers, whose adapters would train
    inside the frozen tower. Returns a copy of `peft_config` whose `exclude_modules` (PEFT's, a regex matched in full
    against module names) also excludes every module under a `VISION_MODULES` submodule, when the targets match one
    there (logged); otherwise `peft_config` itself. The user's object is not changed.
    """
    import copy
    import re

    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.constants import INCLUDE_LINEAR_LAYERS_SHORTHAND

    if not hasattr(peft_config, "exclude_modules"):
        return peft_config
    all_linear = peft_config.target_modules == INCLUDE_LINEAR_LAYERS_SHORTHAND
    inside = [
        name
        for name, module in model.named_modules()
        if any(part in VISION_MODULES for part in name.split(".")[:-1])
        and (isinstance(module, torch.nn.Linear) if all_linear else check_target_module_exists(peft_config, name))
    ]
    if not inside:
        return peft_config
    tower = r"(?:.*\.)?(?:" + "|".join(map(re.escape, VISION_MODULES)) + r")\..*"
    existing = peft_config.exclude_modules
    if isinstance(existing, str):  # PEFT: a string is a regex, a list names modules (or their last parts)
        parts = [existing]
    else:
        parts = [r"(?:.*\.)?" + re.escape(key) for key in existing or ()]
    config = copy.copy(peft_config)
    config.exclude_modules = "|".join(f"(?:{part})" for part in [*parts, tower])
    logger.info(
        "freeze_vision_tower=True: peft_config.target_modules=%r also matches %d module(s) of the frozen vision "
        "encoder (e.g. %s); they get no adapter (exclude_modules=%r on a copy of peft_config), so the encoder stays "
        "frozen and only the language model's adapters train.",
        peft_config.target_modules,
        len(inside),
        inside[0],
        config.exclude_modules,
    )
    return config


def row_images(examples: Sequence[Mapping]) -> list[list | None] | None:
    """Each row's images as TRL's `VLLMGeneration.generate` takes them: a list of PIL images per row (its `images`
    column, or `[image]`), None for a row without; None when no row has any."""
    images: list[list | None] = []
    for example in examples:
        value = next((example[c] for c in IMAGE_COLUMNS if example.get(c) is not None), None)
        listed = list(value) if isinstance(value, (list, tuple)) else ([value] if value is not None else [])
        images.append(listed or None)
    return images if any(i is not None for i in images) else None


def rows_have_images(dataset) -> bool:
    """Whether a prepared dataset (see `tokenize_prompt_dataset` / `tokenize_sft_dataset`) has a row with model
    inputs (a VLM row's images)."""
    if dataset is None or "model_inputs" not in (getattr(dataset, "column_names", None) or []):
        return False
    return any(bool(value) and any(v is not None for v in value.values()) for value in dataset["model_inputs"])


def check_vision_options(args, prompts_have_images: bool, has_critic: bool, reward_models: Sequence[str]) -> None:
    """Refuse, before training, what a VLM run's image prompts cannot go through.

    Args:
        args ([`TRAPOConfig`]): the configuration (read only).
        prompts_have_images (`bool`): whether some RL or distillation prompt has images.
        has_critic (`bool`): whether a `value_model` was given.
        reward_models (`Sequence[str]`): the names of the reward *models* (modules; reward functions are fine).

    Raises:
        ValueError: naming the option and the alternative: vLLM with `async_rollouts` (the producer passes no images
            to the server; synchronous vLLM rounds get each prompt's images), few-shot mode (it
            embeds prompts by their ids), a critic or a reward model (transformers has no value or score head that
            reads images; they would score the text alone). Tools, environments and a `rollout_func` take image
            prompts (each turn generates with its row's images, `agents.ToolRolloutSource`; the function gets them in
            its messages, `sources.RolloutFuncSource`).
    """
    if not prompts_have_images:
        return
    name = type(args).__name__
    if args.use_vllm and args.async_rollouts:
        raise ValueError(
            f"{name}.use_vllm=True with async_rollouts=True, but the RL prompts have images and the asynchronous "
            "producer sends prompt token ids alone to the vLLM server: set async_rollouts=False (the trainer then "
            "passes each prompt's images to vLLM), or use_vllm=False."
        )
    if getattr(args, "fewshot_mode", False):
        raise ValueError(
            f"{name}.fewshot_mode=True embeds prompts by their token ids only, but the RL prompts have images: set "
            "fewshot_mode=False."
        )
    if has_critic:
        raise ValueError(
            "A `value_model` was given, but the RL prompts have images and transformers has no value head that reads "
            "them (the critic would value the text alone): drop the value_model (group-relative advantages, "
            "num_generations >= 2)."
        )
    if reward_models:
        raise ValueError(
            f"Reward models {list(reward_models)} score text only, but the RL prompts have images (transformers has no "
            "sequence-classification head that reads them): score with reward functions (`reward_funcs=[callable]`, "
            "which receive every dataset column, the images included)."
        )


class SuppressTokens:
    """A forward hook on a model's output layer that gives `token_ids` a logit far below any other (-1e9; -600 in
    float16), so the policy never samples them and every log-probability of it — behaviour, reference, training,
    entropy — is over the same remaining vocabulary (the first PPO ratio stays exactly 1).

    A VLM run suppresses its image placeholder tokens: a completion holding one would read as an image without
    features ("Image features and image tokens do not match"). A module-level class, so the hook survives
    `copy.deepcopy` (the reference) and pickling (the asynchronous producer's copy).

    Args:
        token_ids (`Sequence[int]`): the vocabulary ids to suppress.
    """

    def __init__(self, token_ids: Sequence[int]):
        self.token_ids = sorted({int(t) for t in token_ids})

    def __call__(self, module, inputs, output):
        if not isinstance(output, torch.Tensor) or not self.token_ids:
            return output
        value = -1e9 if torch.finfo(output.dtype).max > 1e30 else -600.0
        index = torch.tensor(self.token_ids, device=output.device)
        return output.index_fill(-1, index, value)


def placeholder_token_ids(processor, model) -> list[int]:
    """The ids a VLM's completions must never hold: the processor's image (and video) token and the config's
    `image_token_id`, `video_token_id`, `vision_start_token_id`, `vision_end_token_id` where they exist."""
    tokenizer = text_tokenizer(processor)
    ids = set()
    for name in ("image_token", "video_token"):
        token = getattr(processor, name, None)
        if isinstance(token, str):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                ids.add(token_id)
    config = getattr(model, "config", None)
    for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            ids.add(value)
    return sorted(ids)


def suppress_placeholder_tokens(model, processor) -> list[int]:
    """Register [`SuppressTokens`] for [`placeholder_token_ids`] on the model's output layer; return the ids.

    Raises:
        ValueError: if the model has no output layer (`get_output_embeddings()` is None).
    """
    ids = placeholder_token_ids(processor, model)
    suppress_tokens(model, ids)
    return ids


def suppress_tokens(model, ids: Sequence[int]) -> None:
    """Register [`SuppressTokens`] for `ids` on the model's output layer (nothing for no ids).

    Raises:
        ValueError: if the model has no output layer (`get_output_embeddings()` is None).
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError(
            f"{type(model).__name__} has no output layer (`get_output_embeddings()` is None); TRAPO samples and "
            "trains next-token distributions: pass a model with a language-modelling head."
        )
    if ids:  # a second trainer on the same model adds a second hook: the same logits, harmless
        head.register_forward_hook(SuppressTokens(ids))


def restore_converted_weights(model, checkpoint_dir: str) -> bool:
    """Load a checkpoint's weights into `model` through `from_pretrained` when its file is in other key names than
    the model's own; return whether it did.

    transformers saves some architectures (LLaVA among them) in their original checkpoint layout
    (`save_pretrained(save_original_format=True)`, the default) and renames the keys back only in `from_pretrained`.
    The Trainer's resume loads the file with a plain `load_state_dict(strict=False)`, which then matches no key and
    leaves the model as it was built (it only warns): the run would go on from its initial weights. Loading a fresh
    copy with `from_pretrained` (key conversion included) and copying its weights in gives the checkpoint's model;
    the Trainer's own load afterwards matches nothing and changes nothing.

    Args:
        model: the policy as the Trainer holds it (not a PEFT model, nor a policy-and-critic wrapper: their files are
            the Trainer's own layout).
        checkpoint_dir (`str`): a `checkpoint-N` folder.

    Raises:
        ValueError: if the converted weights still do not match the model (naming the keys).
    """
    import json
    import os

    from safetensors import safe_open

    single = os.path.join(checkpoint_dir, "model.safetensors")
    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        with safe_open(single, framework="pt") as handle:
            keys = set(handle.keys())
    elif os.path.isfile(index):
        with open(index, encoding="utf-8") as handle:
            keys = set(json.load(handle)["weight_map"])
    else:
        return False
    own = model.state_dict()
    if keys <= set(own):
        return False  # the Trainer's load matches every key
    if not os.path.isfile(os.path.join(checkpoint_dir, "config.json")):
        # not written by save_pretrained (a policy-and-critic file has none): from_pretrained would build the class's
        # default configuration, transformers' default Llama of 32 layers x 4096, tens of GB (trial 8's RE01)
        unknown = sorted(keys - set(own))
        raise ValueError(
            f"The checkpoint {checkpoint_dir} holds weights the model does not have ({unknown[:3]}, ...) and no "
            "config.json to convert them with; it was not saved from this model."
        )
    dtype = next(model.parameters()).dtype
    fresh = type(model).from_pretrained(checkpoint_dir, dtype=dtype)
    state = fresh.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(
            f"The checkpoint {checkpoint_dir} does not hold the model's weights {missing[:5]} even after its keys are "
            "converted; it was not saved from this model."
        )
    with torch.no_grad():
        for name, value in own.items():
            value.copy_(state[name].to(value.device))
    return True


def vision_parameters(model) -> list:
    """The trainable parameters of a VLM's vision encoder and projector (submodules named as in `VISION_MODULES`).

    Under DDP every trainable parameter must take part in every backward, but a micro-batch of text rows leaves the
    vision encoder out of the graph, and some encoder parameters never take part at all (LLaVA reads CLIP's hidden
    states before its `post_layernorm`): "Expected to have finished reduction in the prior iteration ...". The
    trainer adds a zero-valued term over them to every micro-batch (an unused one's gradient is then 0, as
    `find_unused_parameters=True` would make it, without its cost or its conflict with activation checkpointing),
    when [`needs_every_parameter`] says the wrapped model needs it.
    """
    seen, out = set(), []
    for name, module in model.named_modules():
        if name.split(".")[-1] in VISION_MODULES:
            for parameter in module.parameters():
                if parameter.requires_grad and id(parameter) not in seen:
                    seen.add(id(parameter))
                    out.append(parameter)
    return out


def needs_every_parameter(model) -> bool:
    """Whether `model`, as the Trainer wrapped it for training, needs every trainable parameter in every backward on
    every rank, so that the trainer adds the zero term over [`vision_parameters`].

    - `DistributedDataParallel`: yes without `find_unused_parameters`. With it (transformers' choice when activation
      checkpointing is off) DDP searches the forward's graph itself and marks the parameters outside it ready when
      the forward ends; the zero term, added after the forward, would mark them a second time at the backward
      ("Parameter ... post_layernorm.bias has been marked as ready twice").
    - DeepSpeed ZeRO-1/2: yes: ranks reduce their gradient buckets together, and a rank whose micro-batch has no image
      would fill them with other parameters ("Received data size doesn't match expected size").
    - DeepSpeed ZeRO-3: no: a parameter is partitioned outside its module's forward (the term could not even read
      it: "index 0 is out of bounds for dimension 0 with size 0"), and ZeRO-3 reduces unused parameters itself.
    - Anything else (FSDP, one process wrapped by nothing): as before, yes when there are vision parameters.
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return not model.find_unused_parameters
    stage = getattr(model, "zero_optimization_stage", None)  # a DeepSpeedEngine's
    if callable(stage):
        return stage() < 3
    return True
