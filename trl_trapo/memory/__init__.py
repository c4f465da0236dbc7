# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The mixed memory pool: where experience is kept so it can be reused instead of discarded.

| module | what |
|---|---|
| `replay.py` | the short-term RL replay buffer (`ReplayBuffer`) of `Trajectory` objects: FIFO, reuse cap, compression |
| `sft_pool.py` | the long-term SFT pool: uniform epochs (`SFTPool`) or prioritised replay from disk (`PrioritizedSFTPool`) |
| `adapter_bank.py` | the bank of PEFT adapter snapshots (`AdapterBank`): snapshot, load, rollback, Hub push |
| `successes.py` | self-imitation (`SuccessReplay`): the policy's rare RL successes, served back as SFT rows |
| `pool.py` | `MemoryPool`, what the trainer talks to for all but the replay buffer (and a `SampleSelector`: few-shot mode) |
"""

from .adapter_bank import AdapterBank
from .pool import MemoryPool, SampleSelector, build_sft_pool, memory_pool_state
from .replay import ReplayBuffer, Trajectory
from .sft_pool import PrioritizedSFTPool, SFTPool, SumMinTree, sft_priority_proxy
from .successes import SuccessReplay


__all__ = [
    "AdapterBank",
    "MemoryPool",
    "PrioritizedSFTPool",
    "ReplayBuffer",
    "SFTPool",
    "SampleSelector",
    "SuccessReplay",
    "SumMinTree",
    "Trajectory",
    "build_sft_pool",
    "memory_pool_state",
    "sft_priority_proxy",
]
