# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A TRL `GRPOTrainer` vision-language script on TRAPO (only the import changed), with a per-rank record — for the
VLM tests of tests/test_distributed_jobs.py and tests/test_vision_job.py.

    accelerate launch --num_processes 2 tests/distributed_vlm_job.py --output_dir out
    python tests/distributed_vlm_job.py --output_dir out        # one process

Options: `--max_steps`, `--gradient_checkpointing true|false` (GRPOConfig's; on by default), `--dataset
mixed` (prompts alternately without and with images, in order: on 2 processes one rank's micro-batches have no image
while the other's have, the case where the vision encoder takes part on one rank only).

The script is what a GRPO user writes for a VLM: a model and its processor, a dataset in TRL's format (a
conversational `prompt` with image parts, an `images` column), a reward function, `GRPOConfig`. The tiny LLaVA and
its processor are built in-process (`trl_trapo.tasks.vision`; no Hub). Every rank writes
`<output_dir>/ranks/rank<r>.json` (`distributed_job.RankRecorder`: logs, final-weight digest) and
`<output_dir>/ranks/vlm<r>.json`: `initial_digest` and `final_digest` (SHA-256 of the full weights before and after,
ZeRO-3 partitions gathered) and `images_per_micro_batch` (the number of images of each micro-batch this rank trained).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os

import torch
from datasets import concatenate_datasets
from distributed_job import RankRecorder  # tests/ is the script's directory: on sys.path

from trl_trapo import TRAPOConfig as GRPOConfig  # was: from trl import GRPOConfig, GRPOTrainer
from trl_trapo import TRAPOTrainer as GRPOTrainer
from trl_trapo.distributed import full_state_dict
from trl_trapo.tasks.vision import build_tiny_vlm, build_vlm_processor, make_visual_task_suite


def colour_reward(completions, answer, **kwargs):
    """1 when the completion's first word is the answer (TRL's reward-function signature)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(t.strip().split("</s>")[0].strip() == a) for t, a in zip(texts, answer)]


def brevity(completions, **kwargs):
    """Shorter is better (varies within every group, so a random policy gets a gradient from the first step)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [-len(t) / 10 for t in texts]


def digest(model) -> str:
    """SHA-256 of the full weights (collective under ZeRO-3: every rank calls it)."""
    sha = hashlib.sha256()
    for name, value in sorted(full_state_dict(model).items()):
        sha.update(name.encode())
        sha.update(value.detach().cpu().float().numpy().tobytes())
    return sha.hexdigest()


class ImageCountingTrainer(GRPOTrainer):
    """Records the number of images of each micro-batch it trains on (the public `compute_loss` hook)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.images_per_micro_batch: list[int] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        pixel_values = inputs.get("model_inputs", {}).get("pixel_values")
        self.images_per_micro_batch.append(0 if pixel_values is None else len(pixel_values))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def mixed_prompts(rl_train):
    """16 prompts without an image and 16 with, alternately (sampled in order: `shuffle_dataset=False`)."""
    text = rl_train.filter(lambda row: not row["images"]).select(range(16))
    with_images = rl_train.filter(lambda row: bool(row["images"])).select(range(16))
    return concatenate_datasets([part.select([i]) for i in range(16) for part in (text, with_images)])


def main() -> None:
    # registered before the trainer, so it runs after TRAPO's exit handler (last in, first out): the script never
    # ends the process group itself, as a TRL script does not
    atexit.register(lambda: print(f"process group at exit: {torch.distributed.is_initialized()}", flush=True))
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=3)
    parser.add_argument(
        "--gradient_checkpointing", choices=["true", "false"], default="true", help="GRPOConfig's (default: on)"
    )
    parser.add_argument("--dataset", choices=["default", "mixed"], default="default")
    options = parser.parse_args()

    processor = build_vlm_processor()
    mixed = options.dataset == "mixed"
    suite = make_visual_task_suite(0, num_pretrain_docs=8, num_sft_per_task=8, num_rl_per_task=64 if mixed else 16)
    # prompts with 0, 1 and 2 images
    dataset = mixed_prompts(suite.rl_train) if mixed else suite.rl_train.select(range(32))
    config = GRPOConfig(
        output_dir=options.output_dir, max_steps=options.max_steps, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=6, max_prompt_length=80, logging_steps=1, beta=0.01,
        report_to="none", save_strategy="no", seed=0, disable_tqdm=True,
        gradient_checkpointing=options.gradient_checkpointing == "true", shuffle_dataset=not mixed,
    )  # fmt: skip
    # after the config, as a TRL script loads its model: under ZeRO-3 the config's DeepSpeed setup partitions it
    model = build_tiny_vlm(processor, seed=0)
    trainer = ImageCountingTrainer(
        model=model,
        reward_funcs=[colour_reward, brevity],
        args=config,
        train_dataset=dataset,
        processing_class=processor,
    )
    trainer.add_callback(RankRecorder(trainer))
    rank = trainer.accelerator.process_index
    initial = digest(trainer.accelerator.unwrap_model(trainer.model))
    trainer.train()
    final = digest(trainer.accelerator.unwrap_model(trainer.model))
    os.makedirs(os.path.join(options.output_dir, "ranks"), exist_ok=True)
    with open(os.path.join(options.output_dir, "ranks", f"vlm{rank}.json"), "w", encoding="utf-8") as handle:
        record = {"initial_digest": initial, "final_digest": final}
        json.dump({**record, "images_per_micro_batch": trainer.images_per_micro_batch}, handle)


if __name__ == "__main__":
    main()
