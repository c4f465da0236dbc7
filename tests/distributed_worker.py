"""Launched by `tests/test_distributed.py` under `accelerate launch`: one DDP backward over fixed rank-specific rows.

Every rank builds its own rows (different objectives and token counts per rank: rank 0 has SFT rows and one RL row,
rank 1 no SFT row and three RL rows), all-reduces the per-objective counts exactly as `StepBuilder.build` (trl_trapo/steps.py)
does, and runs `compute_loss` + backward through the DDP-wrapped policy. Rank 0 writes the all-reduced gradient of
each RL loss aggregation to `<output_dir>/grads_<loss_type>.safetensors`; the test compares it with a one-process
gradient over the union of the rows.

    accelerate launch --multi_gpu --num_processes 2 tests/distributed_worker.py <output_dir>
"""

from __future__ import annotations

import os
import sys

import torch
from conftest import TINY_CONFIG  # tests/ is on sys.path: this script's folder, or pytest's

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import Row, StepContext, collate_rows
from trl_trapo.config import PRETRAIN, RL, SFT
from trl_trapo.distributed import end_process_group
from trl_trapo.memory import Trajectory
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite


LOSS_TYPES = ("dapo", "grpo", "dr_grpo")
WEIGHTS = (0.2, 0.3, 0.5)
COMPOSITION = {  # rank -> (pretrain lengths, SFT (prompt, completion) lengths, RL (prompt, completion) lengths)
    0: ((12, 9, 15), ((5, 4), (7, 2)), ((4, 5),)),
    1: ((10,), (), ((6, 3), (5, 6), (3, 2))),
}


def rank_rows(rank: int) -> list[Row]:
    """The fixed rows of `rank`; RL rows carry stale log-probs so that some ratios clip."""
    g = torch.Generator().manual_seed(100 + rank)
    pretrain, sft, rl = COMPOSITION[rank]
    rows = []
    for length in pretrain:
        rows.append(Row(PRETRAIN, torch.randint(4, 90, (length,), generator=g), torch.ones(length - 1)))
    for prompt_len, completion_len in sft:
        mask = torch.zeros(prompt_len + completion_len - 1)
        mask[prompt_len - 1 :] = 1
        rows.append(Row(SFT, torch.randint(4, 90, (prompt_len + completion_len,), generator=g), mask))
    for prompt_len, completion_len in rl:
        trajectory = Trajectory(
            prompt_ids=torch.randint(4, 90, (prompt_len,), generator=g),
            completion_ids=torch.randint(4, 90, (completion_len,), generator=g),
            completion_mask=torch.ones(completion_len),
            old_per_token_logps=-4.6 + 0.5 * torch.randn(completion_len, generator=g),
            ref_per_token_logps=-4.6 + 0.3 * torch.randn(completion_len, generator=g),
            advantages=torch.randn(1, generator=g).expand(completion_len).clone(),
        )
        rows.append(trajectory.to_row())
    for i, row in enumerate(rows):
        row.half = i % 2
    return rows


def local_counts(rows: list[Row]) -> torch.Tensor:
    """(tokens_pretrain, tokens_sft, tokens_rl, sequences_rl, micro_batches_rl) of rows forming one micro-batch."""
    counts = torch.zeros(5, dtype=torch.float64)
    for row in rows:
        n = float(row.mask.sum())
        counts[row.objective] += n
        counts[3] += float(row.objective == RL and n > 0)
    counts[4] = float(any(r.objective == RL for r in rows))
    return counts


def step_info(counts: torch.Tensor) -> StepContext:
    keys = ("tokens_pretrain", "tokens_sft", "tokens_rl", "sequences_rl", "micro_batches_rl")
    return StepContext(
        weights=WEIGHTS,
        counts=dict(zip(keys, counts.tolist())),
        probe=False,
        step=0,
        num_micro=1,
    )


def make_trainer(output_dir: str) -> TRAPOTrainer:
    tokenizer = build_char_tokenizer()
    suite = make_task_suite(seed=0, num_pretrain_docs=20, num_sft_per_task=5, num_rl_per_task=5, num_eval_per_task=2)
    # gradients only (no optimizer step, no logging): TINY_CONFIG's learning rate and logging steps do not matter
    args = TRAPOConfig(
        **{
            **TINY_CONFIG,
            "output_dir": output_dir,
            "max_steps": 1,
            "per_device_train_batch_size": 4,
            "num_generations": 2,
            "kl_coef": 0.1,
            "kl_penalty": "loss",
            "entropy_coef": 0.01,
        }
    )
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=args,
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )


def gradient(trainer: TRAPOTrainer, model, rows: list[dict], counts: torch.Tensor) -> dict[str, torch.Tensor]:
    trainer.model.zero_grad(set_to_none=True)
    batch = collate_rows(rows, trainer.processing_class.pad_token_id)
    loss = trainer.compute_loss(model, batch, num_items_in_batch=step_info(counts))
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def main(output_dir: str) -> None:
    trainer = make_trainer(output_dir)
    accelerator = trainer.accelerator
    assert accelerator.num_processes == 2, accelerator.num_processes
    model = accelerator.prepare_model(trainer.model)  # DDP: gradients averaged over ranks
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model)
    rows = rank_rows(accelerator.process_index)
    counts = accelerator.reduce(local_counts(rows), reduction="sum")  # as `steps.StepBuilder.build` does
    for loss_type in LOSS_TYPES:
        trainer.args.loss_type = loss_type
        grads = gradient(trainer, model, rows, counts)
        if accelerator.is_main_process:
            from safetensors.torch import save_file

            save_file(grads, os.path.join(output_dir, f"grads_{loss_type}.safetensors"))
    # wait for every rank, then destroy the process group: without it gloo's threads can still hold work at
    # interpreter exit and a rank aborts ("terminate called without an active exception", pytorch/pytorch#190489)
    end_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
