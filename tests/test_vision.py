# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Vision-language runs (trl_trapo/vision.py): images travel with their rows into every forward, and what cannot work
is refused before training.

The alignment tests use `AlignedLlava`, a tiny LLaVA whose every whole-sequence forward checks that the images it is
given are the images of its rows, in row order: each image is one flat colour whose red channel encodes an identity k,
and the text before each image says `#k`. A batch whose images were regrouped, shuffled, dropped or split from their
rows anywhere (grouping, micro-batching, replay, the SFT pool, self-imitation, evaluation) fails the assertion.
"""

from __future__ import annotations

import re

import pytest
import torch
from datasets import Dataset
from PIL import Image
from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.tasks import build_char_tokenizer, exact_match_reward


IMAGE_TOKEN = "<image>"
SIDE, PATCH = 28, 14  # 2 x 2 patches: 4 image tokens per image
TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_processor() -> LlavaProcessor:
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = TEMPLATE
    images = CLIPImageProcessor(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE})
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        chat_template=TEMPLATE,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )


def odd_length_reward(completions, **kwargs) -> list[float]:
    """1 for a completion of odd length: some completions of a group succeed, some fail (module level: the async
    producer imports it)."""
    return [float(len(str(c)) % 2) for c in completions]


def image(k: int) -> Image.Image:
    """A flat image whose red channel is 20 k: its identity."""
    return Image.new("RGB", (SIDE, SIDE), (20 * k, 90, 40))


class AlignedLlava(LlavaForConditionalGeneration):
    """Checks, in every whole-sequence forward, that image i of the batch is the image its row's text names (`#k`
    before each image placeholder), and records `(phase, images)` per call."""

    def forward(self, input_ids=None, attention_mask=None, pixel_values=None, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if input_ids is not None and (cache is None or cache.get_seq_length() == 0):
            masks = torch.ones_like(input_ids) if attention_mask is None else attention_mask
            named = []
            for ids, mask in zip(input_ids, masks):
                text = self.tokenizer.decode(ids[mask.bool()])
                named += [int(k) for k in re.findall(r"#(\d+)(?:<image>)+", text)]
            seen = [] if pixel_values is None else self.identities(pixel_values)
            assert seen == named, f"images {seen} given to rows that name {named}"
            phase = "generate" if self.generating else "train" if torch.is_grad_enabled() else "no_grad"
            self.calls.append((phase, len(seen)))
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values, **kwargs)

    def identities(self, pixel_values: torch.Tensor) -> list[int]:
        red = pixel_values[:, 0].float().mean(dim=(1, 2)) * self.std + self.mean  # undo the processor's normalisation
        return [round(float(v) * 255 / 20) for v in red]

    def generate(self, *args, **kwargs):
        self.generating = True
        try:
            return super().generate(*args, **kwargs)
        finally:
            self.generating = False


def build_model(processor, cls=AlignedLlava, seed: int = 0):
    tokenizer = processor.tokenizer
    config = LlavaConfig(
        text_config=dict(
            model_type="llama",
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=128,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        ),
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=SIDE,
            patch_size=PATCH,
            projection_dim=16,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    model = cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if cls is AlignedLlava:
        model.tokenizer, model.calls, model.generating = tokenizer, [], False
        model.mean = processor.image_processor.image_mean[0]
        model.std = processor.image_processor.image_std[0]
    return model


def content(ks: list[int], question: str) -> list[dict]:
    """A user turn naming each of its images before it: `#k<image>` ..., then the question."""
    parts = []
    for k in ks:
        parts += [{"type": "text", "text": f"#{k}"}, {"type": "image"}]
    return parts + [{"type": "text", "text": question}]


def datasets(n: int = 12):
    """Rows with 0, 1 and 2 images in turn (identities 1..), RL / SFT / pretraining / eval."""
    rl, sft, docs = [], [], []
    k = 1
    for i in range(n):
        ks = list(range(k, k + i % 3))
        k = k % 9 + i % 3 + 1
        answer = "ab"[i % 2]
        prompt = [{"role": "user", "content": content(ks, "q?")}]
        rl.append({"prompt": prompt, "images": [image(j) for j in ks], "answer": answer})
        sft.append({**rl[-1], "completion": [{"role": "assistant", "content": answer}]})
        docs.append({"text": "".join(f"#{j}{IMAGE_TOKEN}" for j in ks) + " a doc.", "images": [image(j) for j in ks]})
    rl, sft, docs = Dataset.from_list(rl), Dataset.from_list(sft).remove_columns("answer"), Dataset.from_list(docs)
    return rl, sft, docs


def vlm_config(tmp_path, **overrides) -> TRAPOConfig:
    settings = dict(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=8,
        num_generations=2,
        learning_rate=1e-3,
        response_length=3,
        max_prompt_length=48,
        sft_max_length=48,
        pretrain_max_length=48,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    return TRAPOConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def processor():
    return build_processor()


def test_images_reach_every_forward_with_their_rows(tmp_path, processor):
    """Grouping (2 completions per prompt), micro-batching and shuffling (2 mini-batches, 2 PPO epochs), replay reuse,
    SFT and pretraining rows with 0, 1 and 2 images, self-imitation and evaluation: every forward's images are its
    rows' (AlignedLlava asserts it), and each kind of forward sees images."""
    rl, sft, docs = datasets()
    model = build_model(processor)

    def odd_length(completions, **kwargs):  # some completions of a group succeed, some fail: self-imitation keeps some
        return [float(len(str(c)) % 2) for c in completions]

    trainer = TRAPOTrainer(
        model,
        reward_funcs=odd_length,
        args=vlm_config(
            tmp_path,
            num_mini_batches=2,
            num_ppo_epochs=2,
            self_imitation=True,
            self_imitation_min_reward=1.0,
            eval_strategy="steps",
            eval_steps=4,
        ),
        train_dataset=rl,
        sft_dataset=sft,
        pretrain_dataset=docs,
        eval_dataset={"prompts": rl.select(range(6)), "docs": docs.select(range(6)), "sft": sft.select(range(6))},
        processing_class=processor,
    )
    trainer.ref_model.tokenizer, trainer.ref_model.calls = processor.tokenizer, model.calls
    trainer.ref_model.mean, trainer.ref_model.std, trainer.ref_model.generating = model.mean, model.std, False
    trainer.train()
    with_images = {phase for phase, count in model.calls if count}
    assert with_images == {"generate", "no_grad", "train"}, model.calls
    logs = {key for log in trainer.state.log_history for key in log}
    assert {"eval_prompts_reward", "eval_docs_pretrain_loss", "eval_sft_sft_loss"} <= logs
    # image tokens are read, never predicted: a random model's losses are ~log(vocabulary), not the suppressed 1e9
    keys = ("loss/pretrain", "eval_docs_pretrain_loss")
    losses = [log[key] for log in trainer.state.log_history for key in keys if key in log]
    assert len(losses) >= 5 and all(0 < loss < 10 for loss in losses), losses
    served = [log["self_imitation/served"] for log in trainer.state.log_history if "self_imitation/served" in log]
    assert served[-1] > 0, served


def test_an_image_column_with_a_tokenizer_is_refused(tmp_path, processor):
    rl, _, _ = datasets(3)
    tokenizer = build_char_tokenizer()
    from trl_trapo.tasks import build_tiny_model

    with pytest.raises(
        ValueError, match=r"`train_dataset` has an 'images' column, but `processing_class` is a tokenizer"
    ):
        TRAPOTrainer(
            build_tiny_model(tokenizer),
            reward_funcs=exact_match_reward,
            args=vlm_config(tmp_path),
            train_dataset=rl,
            processing_class=tokenizer,
        )


@pytest.mark.parametrize(
    "row, message",
    [
        (None, r"`train_dataset` row 1: entry 0 of 'images' is a str, not an image"),  # file names, not images
        ({"images": []}, r"`train_dataset` row 1: its messages and its 0 images do not match"),
        (
            {"images": [Image.new("RGB", (400, 400))]},
            r"`train_dataset` row 1: image 0 is 400x400 = 160000 pixels, over max_image_pixels=10000",
        ),
    ],
    ids=["not-an-image", "count-mismatch", "oversized"],
)
def test_bad_image_rows_are_refused_naming_the_row(tmp_path, processor, row, message):
    rl, _, _ = datasets(3)
    rows = rl.to_list()
    if row is None:  # every row's images given as file names (one column holds one type)
        dataset = Dataset.from_list([{**r, "images": [f"{k}.png" for k, _ in enumerate(r["images"])]} for r in rows])
    else:
        rows[1] = {**rows[1], **row}
        dataset = Dataset.from_list(rows, features=rl.features)
    with pytest.raises(ValueError, match=message):
        TRAPOTrainer(
            build_model(processor, LlavaForConditionalGeneration),
            reward_funcs=exact_match_reward,
            args=vlm_config(tmp_path, max_image_pixels=10_000),
            train_dataset=dataset,
            processing_class=processor,
        )


def test_a_document_whose_placeholders_do_not_match_its_images_is_refused(tmp_path, processor):
    _, _, docs = datasets(3)
    rows = docs.to_list()
    rows[2]["text"] = "no placeholder here."
    with pytest.raises(
        ValueError, match=r"`pretrain_dataset` row 2 has 2 images but its text holds 0 image placeholders"
    ):
        TRAPOTrainer(
            build_model(processor, LlavaForConditionalGeneration),
            args=vlm_config(tmp_path),
            pretrain_dataset=Dataset.from_list(rows, features=docs.features),
            processing_class=processor,
        )


def test_cutting_image_tokens_is_refused(tmp_path, processor):
    _, sft, _ = datasets(3)
    with pytest.raises(
        ValueError, match=r"`sft_dataset` row 1 is \d+ tokens long and its image tokens reach past 10 tokens"
    ):
        TRAPOTrainer(
            build_model(processor, LlavaForConditionalGeneration),
            args=vlm_config(tmp_path, sft_max_length=10),
            sft_dataset=sft,
            processing_class=processor,
        )


def test_a_pretraining_document_whose_image_tokens_would_be_cut_is_refused_at_construction(tmp_path, processor):
    """Pretraining documents are read as training goes: a document that `pretrain_max_length` would cut through its
    image tokens failed only when it was reached (a fresh user's trial: step 7 of a run, row 399 of 400); SFT rows
    were refused at construction. Both are now."""
    _, _, docs = datasets(6)  # rows 2 and 5 have two images: their second reaches past 10 tokens
    with pytest.raises(
        ValueError, match=r"`pretrain_dataset` row 2 is \d+ tokens long and its image tokens reach past 10 tokens"
    ):
        TRAPOTrainer(
            build_model(processor, LlavaForConditionalGeneration),
            args=vlm_config(tmp_path, pretrain_max_length=10),
            pretrain_dataset=docs,
            processing_class=processor,
        )


@pytest.mark.parametrize(
    "overrides, extra, message",
    [
        (
            dict(use_vllm=True, vllm_mode="server", async_rollouts=True),
            {},
            r"use_vllm=True with async_rollouts=True, but the RL prompts have images",
        ),
        ({}, {"value_model": True}, r"A `value_model` was given, but the RL prompts have images"),
    ],
    ids=["async-vllm", "critic"],
)
def test_what_image_prompts_cannot_go_through_is_refused(tmp_path, processor, overrides, extra, message):
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    rl, _, _ = datasets(3)
    if extra.get("value_model"):
        tokenizer = processor.tokenizer
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        extra = {"value_model": AutoModelForSequenceClassification.from_config(config)}
    with pytest.raises(ValueError, match=message):
        TRAPOTrainer(
            build_model(processor, LlavaForConditionalGeneration),
            reward_funcs=exact_match_reward,
            args=vlm_config(tmp_path, **overrides),
            train_dataset=rl,
            processing_class=processor,
            **extra,
        )


def test_asynchronous_rollouts_sample_each_row_with_its_own_images(tmp_path, processor):
    """`async_rollouts=True` with image prompts: the producer (its LLaVA copy built from class, config and weights:
    a pickled one carries transformers' output-capturing hooks, which cannot be pickled) samples each row with its
    row's images. At lag 0 the producer's log-probs are the trained policy's, so the trainer's recomputation with
    the rows' images matches them to float rounding; a row given another row's images would not."""
    rl, sft, docs = datasets()
    trainer = TRAPOTrainer(
        build_model(processor, LlavaForConditionalGeneration),
        reward_funcs=odd_length_reward,
        args=vlm_config(
            tmp_path, async_rollouts=True, max_staleness=0, max_steps=6, rl_weight=3.0, num_mini_batches=2
        ),
        train_dataset=rl.filter(lambda row: len(row["images"]) > 0),  # 1 and 2 images per prompt
        sft_dataset=sft,
        pretrain_dataset=docs,
        processing_class=processor,
    )
    trainer.train()
    logs = trainer.state.log_history
    differences = [
        log["sampling/sampling_logp_difference/max"] for log in logs if "sampling/sampling_logp_difference/max" in log
    ]
    assert len(differences) >= 2 and max(differences) < 1e-4, differences
    assert all(log["sample/staleness_max"] == 0 for log in logs if "sample/staleness_max" in log)


def test_freeze_vision_tower_trains_the_language_model_only(tmp_path, processor):
    rl, sft, docs = datasets(6)
    model = build_model(processor, LlavaForConditionalGeneration)
    tower = {n: p.detach().clone() for n, p in model.named_parameters() if "vision_tower" in n or "projector" in n}
    text = {n: p.detach().clone() for n, p in model.named_parameters() if "language_model" in n}
    trainer = TRAPOTrainer(
        model,
        args=vlm_config(tmp_path, freeze_vision_tower=True, max_steps=2),
        sft_dataset=sft,
        pretrain_dataset=docs,
        processing_class=processor,
    )
    trainer.train()
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in tower.items())
    assert any(not torch.equal(after[n], p) for n, p in text.items())


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], "all-linear"])
def test_freeze_vision_tower_keeps_lora_adapters_out_of_the_frozen_tower(tmp_path, processor, targets, caplog):
    """`freeze_vision_tower=True` with `LoraConfig(target_modules=["q_proj", "v_proj"])`, names the vision encoder's
    attention has too: adapters were put inside the frozen tower and trained there without a word (trial 8's VL03).
    They are now kept out (a copy of the config excludes the tower; the user's is unchanged), and the log says so."""
    import logging

    from peft import LoraConfig

    rl, sft, docs = datasets(6)
    peft_config = LoraConfig(r=4, target_modules=targets)
    with caplog.at_level(logging.INFO, logger="trl_trapo.vision"):
        trainer = TRAPOTrainer(
            build_model(processor, LlavaForConditionalGeneration),
            args=vlm_config(tmp_path, freeze_vision_tower=True, max_steps=1),
            sft_dataset=sft,
            pretrain_dataset=docs,
            processing_class=processor,
            peft_config=peft_config,
        )
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not [n for n in trainable if "vision_tower" in n or "projector" in n], trainable
    assert any("language_model" in n for n in trainable)
    assert peft_config.exclude_modules is None  # the user's config is not altered
    assert any("get no adapter" in r.getMessage() for r in caplog.records)


def test_freeze_vision_tower_on_a_text_model_is_refused(tmp_path):
    from trl_trapo.tasks import build_tiny_model

    tokenizer = build_char_tokenizer()
    _, sft, _ = datasets(3)
    with pytest.raises(ValueError, match=r"freeze_vision_tower=True, but LlamaForCausalLM has no submodule"):
        TRAPOTrainer(
            build_tiny_model(tokenizer),
            args=vlm_config(tmp_path, freeze_vision_tower=True),
            sft_dataset=sft.remove_columns("images"),
            processing_class=tokenizer,
        )


def test_image_rows_as_objectives_of_their_own(tmp_path, processor):
    """Per-modality weights as configuration: image demonstrations and image documents as objectives of their own
    (`DemonstrationObjective`, `LanguageModelingObjective`), weighed by DARE apart from the text ones; their rows keep
    their images (AlignedLlava) and resume restores their samplers."""
    from trl_trapo import DemonstrationObjective, LanguageModelingObjective

    rl, sft, docs = datasets()
    with_image = [i for i in range(len(sft)) if sft[i]["images"]]
    text_only = [i for i in range(len(sft)) if not sft[i]["images"]]
    model = build_model(processor)
    objectives = [
        DemonstrationObjective("sft_image", sft.select(with_image)),
        LanguageModelingObjective("pretrain_image", docs.select(with_image)),
    ]
    trainer = TRAPOTrainer(
        model,
        args=vlm_config(
            tmp_path,
            max_steps=3,
            curriculum_boundaries=[],
            curriculum_mixtures=[{"pretrain": 0.25, "sft": 0.25, "sft_image": 0.25, "pretrain_image": 0.25}],
        ),
        sft_dataset=sft.select(text_only),
        pretrain_dataset=docs.select(text_only),
        objectives=objectives,
        processing_class=processor,
    )
    trainer.train()
    logs = {key for log in trainer.state.log_history for key in log}
    assert {"loss/sft_image", "loss/pretrain_image", "weight/sft_image", "dare/factor/sft_image"} <= logs, logs
    assert any(count for phase, count in model.calls if phase == "train")
    state = objectives[0].state_dict()
    assert state["sampler"]["position"] > 0


def test_a_vlm_run_resumes_bit_identically(tmp_path, processor):
    """Stopped at step 3 and resumed from its checkpoint, a run with image rows in the replay buffer, the SFT pool,
    the pretraining stream and self-imitation ends with the weights of an uninterrupted run: every image a checkpoint
    holds comes back to its row."""
    from transformers import TrainerCallback

    rl, sft, docs = datasets()

    def odd_length(completions, **kwargs):
        return [float(len(str(c)) % 2) for c in completions]

    def trainer(output_dir):
        return TRAPOTrainer(
            build_model(processor, LlavaForConditionalGeneration),
            reward_funcs=odd_length,
            args=vlm_config(
                output_dir,
                max_steps=6,
                save_strategy="steps",
                save_steps=3,
                self_imitation=True,
                self_imitation_min_reward=1.0,
                weighting="dare",  # DARE's factors resumed too (the default is static weights)
                dare_update_interval=2,
            ),
            train_dataset=rl,
            sft_dataset=sft,
            pretrain_dataset=docs,
            processing_class=processor,
        )

    class StopAfterThree(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 3

    full = trainer(tmp_path / "full")
    full.train()
    first = trainer(tmp_path / "first")
    first.add_callback(StopAfterThree())
    first.train()
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-3"))
    expected = full.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_the_policy_never_samples_an_image_placeholder(tmp_path, processor):
    """A policy that would put almost all its probability on `<image>` (a bias of 50 on its logit) samples other
    tokens: a completion holding a placeholder would read as an image without features ("Image features and image
    tokens do not match") in the next forward. The suppression is part of the policy everywhere, so the behaviour and
    the training log-probs agree (ratio 1 on the first, on-policy pass)."""
    rl, _, _ = datasets(6)
    model = build_model(processor, LlavaForConditionalGeneration)
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    head = model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[image_id] = 50.0
    model.lm_head = biased
    sampled = []

    def record(completions, completion_ids, **kwargs):  # every completion the policy sampled
        sampled.extend(list(ids) for ids in completion_ids)
        return [0.0] * len(completions)

    trainer = TRAPOTrainer(
        model,
        reward_funcs=record,
        args=vlm_config(tmp_path, max_steps=2, num_ppo_epochs=1, pretrain_weight=0.0, sft_weight=0.0),
        train_dataset=rl,
        processing_class=processor,
    )
    trainer.train()
    sampled = sampled[2:]  # the reward functions' check before training scores two dataset rows, no completion
    assert sampled and all(image_id not in ids for ids in sampled), sampled
    first = next(log for log in trainer.state.log_history if "val/ratio" in log)
    assert abs(first["val/ratio"] - 1.0) < 1e-5, first["val/ratio"]


def test_load_best_model_at_end_loads_the_best_vlm_checkpoint(tmp_path, processor):
    """`load_best_model_at_end` with a model transformers saves in its original key layout: the final weights are the
    best checkpoint's (the Trainer's own load matched no key and kept the last step's weights)."""
    _, sft, docs = datasets(6)
    trainer = TRAPOTrainer(
        build_model(processor, LlavaForConditionalGeneration),
        args=vlm_config(
            tmp_path,
            max_steps=4,
            eval_strategy="steps",
            eval_steps=1,
            save_strategy="steps",
            save_steps=1,
            load_best_model_at_end=True,
            metric_for_best_model="eval_sft_loss",
            greater_is_better=True,  # the highest loss: an early checkpoint, not the last step's weights
        ),
        sft_dataset=sft,
        pretrain_dataset=docs,
        eval_dataset=sft.select(range(3)),
        processing_class=processor,
    )
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and not best.endswith("checkpoint-4"), best
    expected = LlavaForConditionalGeneration.from_pretrained(best).state_dict()
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_lora_on_the_language_model_only(tmp_path, processor):
    """A `peft_config` whose `target_modules` name the language model's projections only (docs/vision.md): the
    adapters sit in the language model, the vision tower and projector stay as they were, and the run trains."""
    from peft import LoraConfig

    rl, sft, docs = datasets(6)
    model = build_model(processor, LlavaForConditionalGeneration)
    tower = {n: p.detach().clone() for n, p in model.named_parameters() if "vision_tower" in n or "projector" in n}
    trainer = TRAPOTrainer(
        model,
        reward_funcs=exact_match_reward,
        args=vlm_config(tmp_path, max_steps=2),
        train_dataset=rl,
        sft_dataset=sft,
        pretrain_dataset=docs,
        processing_class=processor,
        peft_config=LoraConfig(r=4, target_modules=r".*language_model.*\.(q_proj|v_proj)"),
    )
    trainer.train()
    adapters = [n for n, p in trainer.model.named_parameters() if "lora_" in n]
    assert adapters and all("language_model" in n for n in adapters)
    after = {n.replace("base_model.model.", ""): p for n, p in trainer.model.named_parameters()}
    assert all(torch.equal(after[n], p) for n, p in tower.items())


def test_preparing_image_rows_holds_few_rows_in_python_at_once(processor):
    """`datasets` turns each row's processor arrays into Python lists before Arrow stores them; written 1,000 rows at a
    time (its default) these rows peaked at 2.7x their stored size in Python objects (the built-in task's RL prompts:
    1.7x), and the allocator keeps such a peak resident for the whole run (benchmark_vlm: +100 MiB against
    GRPOTrainer). Image rows are written a few at a time: the peak is 0.15-0.22x here."""
    import tracemalloc

    from trl_trapo.data import tokenize_prompt_dataset, tokenize_sft_dataset
    from trl_trapo.vision import ImageRows

    n = 400
    prompt = [{"role": "user", "content": content([1], "q?")}]
    rl = Dataset.from_list([{"prompt": prompt, "images": [image(1 + i % 9)]} for i in range(n)])
    sft = rl.add_column("completion", [[{"role": "assistant", "content": "a"}]] * n)
    rows = ImageRows(processor)
    for name, prepare in (
        ("prompts", lambda: tokenize_prompt_dataset(rl, processor.tokenizer, 48, images=rows)),
        ("sft", lambda: tokenize_sft_dataset(sft, processor.tokenizer, 48, images=rows)),
    ):
        tracemalloc.start()
        try:
            prepared = prepare()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        stored = prepared.data.column("model_inputs").nbytes
        assert len(prepared) == n
        assert stored > 1_000_000, (name, stored)  # 400 x 3 x 28 x 28 float32: ~3.8 MB
        assert peak < 0.5 * stored, f"{name}: Python peak {peak / 2**20:.1f} MiB for {stored / 2**20:.1f} MiB stored"


def test_the_rows_of_one_prompt_share_its_model_input_tensors():
    """A group's rows are one example dict repeated: converted once, so whatever keeps several of them (self-imitation's
    successes, the checkpoint of that buffer) holds one copy of the prompt's `pixel_values`, not `num_generations`."""
    from trl_trapo.vision import examples_model_inputs

    first, second = ({"model_inputs": {"pixel_values": [[[float(k)] * 4] * 4] * 3}} for k in (1, 2))
    inputs = examples_model_inputs([first, first, first, second, second, {"prompt": "a text row"}])
    assert inputs[0] is inputs[1] is inputs[2] and inputs[3] is inputs[4] and inputs[0] is not inputs[3]
    assert inputs[0]["pixel_values"].shape == (3, 4, 4) and float(inputs[3]["pixel_values"][0, 0, 0]) == 2.0
    assert inputs[5] == {}


# TEMPLATE with `{% generation %}` markers around each assistant turn (for assistant_only_loss)
MARKED_TEMPLATE = (
    "{% macro body(message) %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endmacro %}"
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['role'] == 'assistant' %}{% generation %}{{ body(message) }}{% endgeneration %}"
    "{% else %}{{ body(message) }}{% endif %}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.mark.parametrize("assistant_only_loss", [False, True])
@pytest.mark.parametrize("last", ["assistant", "user"])
def test_a_vlm_messages_row_is_trls_conversation_every_text_token_trained(last, assistant_only_loss):
    """A `messages` row with images is TRL's language-modeling form, as `DataCollatorForVisionLanguageModeling` builds
    it: the conversation rendered whole by the processor, whatever its last role, every token trained (with
    assistant_only_loss, the processor's assistant mask); TRAPO leaves out the image tokens (the model reads them,
    never writes them; their logit is suppressed). TRAPO used to train the last assistant turn only and to refuse a
    row not ending with one (issue 37)."""
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from trl_trapo.data import tokenize_sft_dataset
    from trl_trapo.vision import ImageRows

    processor = build_processor()
    processor.chat_template = processor.tokenizer.chat_template = MARKED_TEMPLATE
    messages = [
        {"role": "user", "content": content([1], "q?")},
        {"role": "assistant", "content": [{"type": "text", "text": "ab"}]},
        {"role": last, "content": [{"type": "text", "text": "cd"}]},
    ]
    row = {"messages": messages, "images": [image(1)]}
    [ours] = tokenize_sft_dataset(
        Dataset.from_list([row]), processor.tokenizer, 256, images=ImageRows(processor),
        assistant_only_loss=assistant_only_loss,
    )  # fmt: skip
    collator = DataCollatorForVisionLanguageModeling(processor, assistant_only_loss=assistant_only_loss)
    theirs = collator([{"messages": messages, "images": [image(1)]}])
    assert ours["input_ids"] == theirs["input_ids"][0].tolist()
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    trained = [int(label != -100 and t != image_id) for t, label in zip(ours["input_ids"], theirs["labels"][0])]
    assert ours["completion_mask"] == trained
    learned = processor.tokenizer.decode([t for t, m in zip(ours["input_ids"], ours["completion_mask"]) if m])
    if assistant_only_loss:
        assert learned == ("ab\ncd\n" if last == "assistant" else "ab\n")
    else:
        assert sum(trained) == len(trained) - 4 and "q?" in learned  # all but the 4 image tokens
    assert ours["model_inputs"]["pixel_values"] is not None


def test_restoring_a_file_without_config_json_is_refused_not_built_at_the_class_default(tmp_path):
    """`restore_converted_weights` on a checkpoint whose keys do not match and that has no config.json (a
    policy-and-critic file): `from_pretrained` built transformers' default Llama (32 x 4096, 19 GB RSS in a minute,
    trial 8's RE01); now it is refused, naming keys the model does not have."""
    from safetensors.torch import save_file

    from trl_trapo.tasks import build_tiny_model
    from trl_trapo.vision import restore_converted_weights

    model = build_tiny_model(build_char_tokenizer(), seed=0)
    state = {f"policy.{name}": value.detach().clone().contiguous() for name, value in model.state_dict().items()}
    state.pop("policy.lm_head.weight", None)  # tied to the embeddings: saved once
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"holds weights the model does not have \(\['policy\..*no config\.json"):
        restore_converted_weights(model, str(tmp_path))
