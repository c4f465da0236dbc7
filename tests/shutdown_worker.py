"""Launched by `tests/test_distributed.py` under `accelerate launch`: what a rank holds when `end_process_group` returns.

Each rank starts an asynchronous all-reduce of a large tensor on a second gloo group that stays referenced until the
interpreter exits (as DeepSpeed's clone of the world group does under ZeRO-3) and drops its own references, so the
collective holds the tensor's last one. It then calls `trl_trapo.distributed.end_process_group` and writes
`<output_dir>/shutdown<rank>.json`: whether the tensor was released by then (`released`), and the gloo worker threads'
scheduler states (`worker_states`). A tensor still held there is released by a gloo worker thread while the
interpreter finalises, which needs the GIL: the SIGABRT at exit of pytorch/pytorch#190489.

    accelerate launch --multi_gpu --num_processes 2 tests/shutdown_worker.py <output_dir>
"""

from __future__ import annotations

import json
import os
import sys
import weakref

import torch
import torch.distributed as dist

from trl_trapo.distributed import end_process_group, gloo_worker_activity


NUMEL = 25_000_000  # 100 MB of float32: its all-reduce takes far longer than the world group's barrier


def main(output_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kept = dist.new_group()  # noqa: F841 (referenced until exit, as another library's group would be)
    tensor = torch.ones(NUMEL)
    released = weakref.ref(tensor)
    work = dist.all_reduce(tensor, group=kept, async_op=True)
    del tensor, work  # the collective in flight holds the last reference
    end_process_group()
    record = {
        "released": released() is None,
        "worker_states": sorted(state for state, _ in (gloo_worker_activity() or {}).values()),
    }
    with open(os.path.join(output_dir, f"shutdown{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main(sys.argv[1])
