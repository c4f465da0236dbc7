"""Launched by `tests/test_distributed_jobs.py` under `accelerate launch` on 2 processes: the statistics a generation round
defines over the whole round, computed by each rank from its own share.

Each rank holds its share of one round (fixed, rank-specific scores; rank 1's share is larger and more spread out, so a
per-rank statistic differs from the round's). Every rank runs, through the collective path the trainer uses:

- `RolloutEngine.make_trajectories(..., across_ranks=True)` with `scale_rewards="batch"` (no critic), with a critic
  and `whiten_rewards` + `whiten_advantages`, and the same under `whiten_per_process=True` (TRL 1.12 PPO's);
- `TargetedExploration.observe` with accelerate's `gather_object`;
- the rollout metrics (`MetricsAccumulator.add_rollouts` then `collect`: `objective/scores`,
  `completions/clipped_ratio`, `rl/zero_variance_groups`, ...) and the adaptive KL controller's window
  (`RLSchedules.observe_rollouts` then `end_step`), the way the trainer reduces them.

It writes `<output_dir>/rank<r>.json` with its advantages and exploration state, and the one-process reference for
its rows: the same function run on the whole round at once (both shares concatenated) on one process.

    accelerate launch --multi_gpu --num_processes 2 tests/statistics_worker.py <output_dir>
"""

from __future__ import annotations

import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from conftest import finished_round

from trl_trapo import TRAPOConfig
from trl_trapo.distributed import end_process_group
from trl_trapo.exploration import TargetedExploration
from trl_trapo.metrics import MetricsAccumulator
from trl_trapo.rollout import RolloutEngine
from trl_trapo.schedules import RLSchedules


GROUP = 2
SCORES = {0: [0.0, 1.0, 0.0, 1.0], 1: [0.0, 4.0, -2.0, 3.0, 1.0, 5.0]}  # (B_r,) per rank, groups of 2
LENGTHS = {0: [3, 2, 4, 1], 1: [2, 5, 3, 3, 1, 4]}  # completion lengths
# exploration: rank 0's only group of "a" is flat at 0 (stuck if it were the whole round); rank 1's three groups of
# "a" carry signal and reach -1, so over the round "a" is 1/4 stuck at most and its flat group is not at the lowest
EXPLORE = {0: (["a", "a"], [0.0, 0.0]), 1: (["a"] * 6, [-1.0, 2.0, 0.0, 1.0, 3.0, -1.0])}


def share(rank: int) -> dict:
    g = torch.Generator().manual_seed(10 + rank)
    lengths = LENGTHS[rank]
    return dict(
        prompt_ids=[torch.tensor([5, 6])] * len(lengths),
        completion_ids=[torch.randint(4, 20, (n,), generator=g) for n in lengths],
        old_logps=[-torch.rand(n, generator=g) for n in lengths],
        values=[torch.randn(n, generator=g) for n in lengths],
        scores=torch.tensor(SCORES[rank]),
    )


def engine(args: TRAPOConfig, has_critic: bool, accelerator) -> RolloutEngine:
    return RolloutEngine(
        args, None, None, None, has_critic, "reward", "k1", lambda: 0.0, None, accelerator, None, [], 0
    )


def advantages(engine_: RolloutEngine, parts: dict, across_ranks: bool) -> list[list[float]]:
    trajectories = engine_.make_trajectories(
        parts["prompt_ids"],
        parts["completion_ids"],
        parts["old_logps"],
        None,
        parts["values"],
        parts["scores"],
        torch.zeros(len(parts["scores"]), dtype=torch.bool),
        GROUP,
        across_ranks=across_ranks,
    )
    return [t.advantages.tolist() for t in trajectories]


def union() -> dict:
    both = [share(0), share(1)]
    return {k: (torch.cat([b[k] for b in both]) if k == "scores" else both[0][k] + both[1][k]) for k in both[0]}


class OneProcess:
    """What `MetricsAccumulator.collect` reads of an accelerator, for one process."""

    device = torch.device("cpu")
    num_processes = 1

    @staticmethod
    def reduce(tensor, reduction="sum"):
        return tensor


def main(output_dir: str) -> None:
    settings = {
        "batch_std": (dict(scale_rewards="batch"), False),
        "whiten": (dict(whiten_rewards=True, whiten_advantages=True), True),
        "whiten_per_process": (dict(whiten_rewards=True, whiten_advantages=True, whiten_per_process=True), True),
    }
    # every config before the Accelerator: building `TrainingArguments` resets accelerate's state
    configs = {
        name: TRAPOConfig(output_dir=output_dir, report_to="none", num_generations=GROUP, **overrides)
        for name, (overrides, _) in settings.items()
    }
    kl_args = TRAPOConfig(output_dir=output_dir, report_to="none", kl_target=0.5, kl_horizon=10.0)
    accelerator = Accelerator()
    rank = accelerator.process_index
    mine, whole = share(rank), union()
    offset = 0 if rank == 0 else len(SCORES[0])
    rows = slice(offset, offset + len(SCORES[rank]))
    out = {}
    for name, (_, critic) in settings.items():
        args = configs[name]
        out[name] = advantages(engine(args, critic, accelerator), mine, across_ranks=True)
        reference_parts = mine if args.whiten_per_process else whole
        reference = advantages(engine(args, critic, accelerator), reference_parts, across_ranks=False)
        out[f"{name}/reference"] = reference if args.whiten_per_process else reference[rows]
        out[f"{name}/alone"] = advantages(engine(args, critic, accelerator), mine, across_ranks=False)
    families, scores = EXPLORE[rank]
    explore = TargetedExploration(1.0, 1.5, 0.1, gather=gather_object)
    explore.observe(finished_round([{"task": f} for f in families], torch.tensor(scores), GROUP))
    alone = TargetedExploration(1.0, 1.5, 0.1)  # this rank's share as if it were the round
    alone.observe(finished_round([{"task": f} for f in families], torch.tensor(scores), GROUP))
    whole_round = TargetedExploration(1.0, 1.5, 0.1)
    whole_families, whole_scores = EXPLORE[0][0] + EXPLORE[1][0], EXPLORE[0][1] + EXPLORE[1][1]
    whole_round.observe(finished_round([{"task": f} for f in whole_families], torch.tensor(whole_scores), GROUP))
    out["exploration"] = explore.state_dict()
    out["exploration/alone"] = alone.state_dict()
    out["exploration/reference"] = whole_round.state_dict()
    # rollout metrics and the adaptive KL window, reduced as the trainer does, against one process on the whole round
    reduce = lambda tensor: accelerator.reduce(tensor.to(accelerator.device), "sum").cpu()  # noqa: E731
    for name, parts, world in (("", mine, accelerator), ("/reference", whole, None)):
        metrics = MetricsAccumulator(["r"])
        n = len(parts["scores"])
        ref = [lp - 0.1 * lp.numel() for lp in parts["old_logps"]]  # a per-row property, not a position in the share
        truncated = torch.tensor([c.numel() >= 4 for c in parts["completion_ids"]])
        batch = finished_round(
            [{}] * n,
            parts["scores"],
            GROUP,
            parts["completion_ids"],
            parts["old_logps"],
            ref,
            kl_estimator="k1",
            per_func=parts["scores"][:, None],
            is_truncated=truncated,
        )
        metrics.add_rollouts(batch)
        schedules = RLSchedules(kl_args, None)
        schedules.observe_rollouts(batch)
        if world is None:  # one process: nothing to reduce
            out[f"metrics{name}"] = metrics.collect(OneProcess(), 0.1)
            schedules.end_step(0, lambda tensor: tensor)
        else:
            out[f"metrics{name}"] = metrics.collect(accelerator, 0.1)
            schedules.end_step(0, reduce)
        out[f"kl_coef{name}"] = schedules.kl_coef()
    with open(os.path.join(output_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(out, handle)
    end_process_group()  # without it a rank can abort at exit (gloo threads; see end_process_group)


if __name__ == "__main__":
    main(sys.argv[1])
