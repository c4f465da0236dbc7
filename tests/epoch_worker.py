"""Launched by `tests/test_epoch.py` under `accelerate launch` on 2 processes: `epoch` is a pass over the whole dataset
by all ranks together.

RL only, 8 prompts, 4 rows a rank a step (one prompt's 4 completions, each served once): 2 prompts a step over both
ranks, a pass every 4 steps; 6 steps with `save_strategy="epoch"`. Each rank writes `<output_dir>/rank<r>.json`: the
logged epochs, `state.epoch` and its prompt stream's state (this rank's shard of the prompts).

    accelerate launch --multi_gpu --num_processes 2 tests/epoch_worker.py <output_dir>
"""

from __future__ import annotations

import json
import os
import sys

from conftest import TINY_CONFIG

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.distributed import end_process_group
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite


def main(output_dir: str) -> None:
    tokenizer = build_char_tokenizer()
    suite = make_task_suite(seed=0, num_pretrain_docs=4, num_sft_per_task=2, num_rl_per_task=4, num_eval_per_task=1)
    settings = dict(
        TINY_CONFIG,
        max_steps=6,
        per_device_train_batch_size=4,
        num_generations=4,
        num_ppo_epochs=1,
        save_strategy="epoch",
    )
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(output_dir=output_dir, **settings),
        train_dataset=suite.rl_train.select(range(8)),
        processing_class=tokenizer,
    )
    trainer.train()
    rank = trainer.accelerator.process_index
    record = {
        "world_size": trainer.accelerator.num_processes,
        "epochs": [h["epoch"] for h in trainer.state.log_history if "loss" in h],
        "state_epoch": trainer.state.epoch,
        "prompt_sampler": trainer.memory_pool.prompt_sampler.state_dict(),
        "shard": len(trainer.memory_pool.prompt_sampler.epoch_order(0)),
    }
    with open(os.path.join(output_dir, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    end_process_group()  # without it a rank can abort at exit (gloo threads; see end_process_group)


if __name__ == "__main__":
    main(sys.argv[1])
