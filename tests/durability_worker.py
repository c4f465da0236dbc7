# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A deterministic tiny TRAPO run (fp32, CPU, one thread) for tests/test_durability.py.

`build_trainer` is shared by the in-process runs of the tests; run as a script, it trains in a subprocess that the
test kills with SIGKILL once a checkpoint has been written:

    python tests/durability_worker.py OUTPUT_DIR VARIANT [STEP_SLEEP_SECONDS]
"""

from __future__ import annotations

import os
import sys
import time

import torch
from transformers import TrainerCallback


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

MAX_STEPS = 8
SAVE_STEPS = 2


class SlowSteps(TrainerCallback):
    """Sleeps after every optimizer step, so a test can kill the run between two checkpoints."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)
        return control


def build_trainer(output_dir: str, variant: str = "full", callbacks=None, **overrides):
    """The run of the durability tests.

    Variants: "full" — full-model training of all three objectives with the prioritised SFT pool and few-shot mode;
    "peft" — the same with a LoRA policy and the adapter bank (a snapshot every 2 steps); "async" — "full" with
    asynchronous rollouts (`max_staleness=2`) instead of few-shot mode; "async_sync3" — the same with the weights sent to
    the producer every 3 steps.
    """
    from conftest import TINY_CONFIG, TINY_SUITE  # tests/ is on sys.path: this script's folder, or pytest's
    from peft import LoraConfig

    from trl_trapo import TRAPOConfig, TRAPOTrainer
    from trl_trapo.experimental.fewshot import FewShotTRAPOTrainer
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, make_task_suite

    tokenizer = build_char_tokenizer()
    suite = make_task_suite(seed=0, **TINY_SUITE)
    values = dict(
        TINY_CONFIG,
        output_dir=output_dir,
        max_steps=MAX_STEPS,
        gradient_accumulation_steps=2,
        learning_rate=3e-3,
        save_strategy="steps",
        save_steps=SAVE_STEPS,
        num_ppo_epochs=2,
        kl_coef=0.05,
        weighting="dare",  # DARE's measured factors are part of the state that must survive (the default is static)
        dare_update_interval=3,
        sft_sampling="prioritized",
        sft_pool_max_bytes=10**7,
        fewshot_mode=True,
        dataloader_num_workers=0,
    )
    peft_config = None
    if variant.startswith("async"):  # asynchronous rollouts: rounds in flight at the checkpoint, producer weights
        values.update(fewshot_mode=False, async_rollouts=True, max_staleness=2)
        values.update(weight_sync_steps=3 if variant == "async_sync3" else 1)
    if variant == "peft":
        values.update(adapter_snapshot_steps=2, max_adapter_snapshots=2, learning_rate=2e-2)
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    values.update(overrides)
    torch.manual_seed(0)
    trainer_class = FewShotTRAPOTrainer if values["fewshot_mode"] else TRAPOTrainer  # few-shot mode: its own trainer
    return trainer_class(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=suite.reward_funcs,
        args=TRAPOConfig(**values),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    output_dir, variant = sys.argv[1], sys.argv[2]
    sleep = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    trainer = build_trainer(output_dir, variant, callbacks=[SlowSteps(sleep)] if sleep else None)
    trainer.train()
