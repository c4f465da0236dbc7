# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The RL replay buffer (capacity, reuse cap, epoch order, age, state, the declared fields and model inputs it keeps),
the SFT pool, and the memory pool's checkpoint state in both layouts."""

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from datasets import Dataset

import trl_trapo
from trl_trapo.collator import ROW_FIELDS, Row, collate_rows
from trl_trapo.config import RL, SFT
from trl_trapo.memory import ReplayBuffer, SFTPool, Trajectory


def trajectory(tag, prompt_len=3, completion_len=4):
    """A trajectory whose tensors take exactly 8 * prompt_len + 8 * completion_len + 4 * 3 * completion_len bytes;
    its tag rides in `temperature`, a JSON extra that costs no bytes."""
    return Trajectory(
        prompt_ids=torch.arange(prompt_len, dtype=torch.long) + 100,  # 8 bytes per entry
        completion_ids=torch.arange(completion_len, dtype=torch.long) + 200,
        completion_mask=torch.ones(completion_len),  # float32: 4 bytes per entry
        old_per_token_logps=torch.full((completion_len,), -float(tag) - 1.0),
        advantages=torch.zeros(completion_len),
        temperature=float(tag),
    )


NBYTES = 8 * 3 + 8 * 4 + 4 * 4 + 4 * 4 + 4 * 4  # = 104 bytes for the default trajectory


def at_version(items, version):
    """`items`, stamped as sampled by policy version `version` (the optimizer step whose weights generated them)."""
    for item in items:
        item.version = version
    return items


def tags(items):
    return [int(item.temperature) for item in items]


def test_trajectory_nbytes_exact():
    assert trajectory(0).nbytes() == NBYTES == 104
    assert trajectory(0, prompt_len=1, completion_len=2).nbytes() == 8 + 16 + 8 + 8 + 8


# ---------------------------------------------------------------------------------------------------------------------
# Capacity and eviction
# ---------------------------------------------------------------------------------------------------------------------
def test_capacity_in_trajectories_evicts_oldest_first():
    buffer = ReplayBuffer(capacity=3, max_uses=1)
    buffer.add([trajectory(i) for i in range(2)])
    buffer.add(at_version([trajectory(i) for i in range(2, 5)], 1))
    assert len(buffer) == 3
    assert buffer.num_evicted == 2
    assert buffer.nbytes == 3 * NBYTES
    assert sorted(tags(buffer.sample(3, step=1))) == [2, 3, 4]


def test_capacity_in_bytes_is_exact():
    # room for exactly 2 trajectories (176 bytes); a third pushes the total to 264 > 176 and evicts the oldest
    buffer = ReplayBuffer(capacity=100, max_bytes=2 * NBYTES, max_uses=1)
    buffer.add([trajectory(0), trajectory(1)])
    assert len(buffer) == 2 and buffer.nbytes == 2 * NBYTES and buffer.num_evicted == 0
    buffer.add([trajectory(2)])
    assert len(buffer) == 2 and buffer.nbytes == 2 * NBYTES and buffer.num_evicted == 1
    assert sorted(tags(buffer.sample(2, step=0))) == [1, 2]
    # one byte less than two trajectories: only one fits
    tight = ReplayBuffer(capacity=100, max_bytes=2 * NBYTES - 1)
    tight.add([trajectory(0), trajectory(1)])
    assert len(tight) == 1 and tight.nbytes == NBYTES


def test_bigger_trajectories_evict_several_small_ones():
    buffer = ReplayBuffer(capacity=100, max_bytes=3 * NBYTES)
    buffer.add([trajectory(i) for i in range(3)])
    big = trajectory(9, prompt_len=3, completion_len=10)  # 24 + 80 + 40 + 40 + 40 = 224 bytes
    buffer.add(at_version([big], 1))
    # 3 * 104 + 224 = 536 > 312 -> evict #0 (432 left), #1 (328 > 312 left), #2 (224 left): only the big one remains
    assert buffer.nbytes == 224 and len(buffer) == 1 and buffer.num_evicted == 3


def test_trajectory_larger_than_max_bytes_raises():
    buffer = ReplayBuffer(max_bytes=NBYTES - 1)
    with pytest.raises(ValueError, match="replay_max_bytes=103"):
        buffer.add([trajectory(0)])


def test_a_byte_budget_below_the_smallest_trajectory_is_refused_by_the_config(tmp_path):
    """`replay_max_bytes=10` was refused only by the first rollout round's `add` (trial 10's PY02); the config now
    refuses a budget below the smallest trajectory, whose size `MIN_TRAJECTORY_BYTES` is: one prompt and one
    completion token with the fields `rollout.py` gives every trajectory (stored raw: compressed it is larger)."""
    from trl_trapo import TRAPOConfig
    from trl_trapo.config import MIN_TRAJECTORY_BYTES
    from trl_trapo.memory.replay import compress_tensors

    smallest = Trajectory(
        prompt_ids=torch.tensor([5]),
        completion_ids=torch.tensor([7]),
        completion_mask=torch.zeros(1),  # rollout.py's masks, log-probs and advantages: torch.zeros (float32)
        old_per_token_logps=torch.zeros(1),
        advantages=torch.zeros(1),
    )
    assert smallest.nbytes() == MIN_TRAJECTORY_BYTES < len(compress_tensors(smallest.tensors()))
    buffer = ReplayBuffer(max_bytes=MIN_TRAJECTORY_BYTES)
    buffer.add([smallest])
    assert len(buffer) == 1
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", replay_max_bytes=10)
    message = str(raised.value)
    for needle in ["TRAPOConfig.replay_max_bytes=10 is invalid", f"takes {MIN_TRAJECTORY_BYTES} bytes", "or None"]:
        assert needle in message, (needle, message)
    TRAPOConfig(output_dir=str(tmp_path), report_to="none", replay_max_bytes=MIN_TRAJECTORY_BYTES)


# ---------------------------------------------------------------------------------------------------------------------
# Serving
# ---------------------------------------------------------------------------------------------------------------------
def test_never_serves_more_than_max_uses():
    buffer = ReplayBuffer(max_uses=2)
    buffer.add([trajectory(i) for i in range(3)])
    first, second = buffer.sample(3, step=0), buffer.sample(3, step=0)
    assert sorted(tags(first)) == sorted(tags(second)) == [0, 1, 2]
    assert [item.uses for item in first] == [1, 1, 1] and [item.uses for item in second] == [2, 2, 2]
    assert buffer.num_available(step=0) == 0
    with pytest.raises(ValueError, match="0 servable trajectories, 1 were requested"):
        buffer.sample(1, step=0)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n, k", [(6, 2), (8, 4), (9, 3)])
def test_least_used_first_reproduces_ppo_epochs(seed, n, k):
    # one round of n trajectories, served n / k at a time for max_uses epochs: every trajectory is served once in each
    # epoch before any is served a second time
    buffer = ReplayBuffer(max_uses=3, seed=seed)
    buffer.add([trajectory(i) for i in range(n)])
    for epoch in range(3):
        served = []
        for _ in range(k):
            batch = buffer.sample(n // k, step=0)
            assert all(item.uses == epoch + 1 for item in batch)
            served += tags(batch)
        assert sorted(served) == list(range(n))
    assert buffer.num_available(step=0) == 0


def test_sampling_order_is_random_among_equals_but_seeded():
    def order(seed):
        buffer = ReplayBuffer(seed=seed)
        buffer.add([trajectory(i) for i in range(10)])
        return tags(buffer.sample(10, step=0))

    assert order(0) == order(0)
    assert len({tuple(order(seed)) for seed in range(5)}) > 1
    assert order(0) != list(range(10)) or order(1) != list(range(10))


def test_max_age():
    buffer = ReplayBuffer(max_age=2, max_uses=1)
    buffer.add([trajectory(0)])
    buffer.add(at_version([trajectory(1)], 1))
    assert buffer.num_available(step=2) == 2  # ages 2 and 1: both <= 2
    assert buffer.num_available(step=3) == 1  # trajectory 0 is now 3 steps old
    [item] = buffer.sample(1, step=3)
    assert tags([item]) == [1] and item.age == 2
    with pytest.raises(ValueError):
        buffer.sample(1, step=3)
    assert len(buffer) == 2  # too old to serve, but not evicted


def test_age_is_counted_in_policy_versions():
    """A trajectory's age is the serving step minus the version of the policy that sampled it, whenever it was added:
    a round sampled at version 5 and added at step 7 is 2 versions old, and one more step makes it too old."""
    buffer = ReplayBuffer(max_age=2, max_uses=2)
    buffer.add(at_version([trajectory(0)], 5))
    [item] = buffer.sample(1, step=7)
    assert (item.version, item.age) == (5, 2)
    assert buffer.metrics(step=7)["replay/age_mean"] == 2.0
    assert buffer.num_available(step=8) == 0


def test_checkpoints_with_births_load_as_versions():
    """Replay state written before versions existed names them `births` (the step a trajectory was added at, which
    was its version for the synchronous rollouts of the time)."""
    buffer = ReplayBuffer(max_uses=2)
    buffer.add(at_version([trajectory(0), trajectory(1)], 3))
    meta, tensors = buffer.state_dict()
    meta["births"] = meta.pop("versions")
    restored = ReplayBuffer(max_uses=2)
    restored.load_state_dict(meta, tensors)
    assert [(t.version, t.age) for t in restored.sample(2, step=4)] == [(3, 1), (3, 1)]
    assert restored.state_dict()[0]["versions"] == [3, 3]


def test_metrics():
    buffer = ReplayBuffer()
    assert buffer.metrics(step=0) == {
        "replay/size": 0.0,
        "replay/bytes": 0.0,
        "replay/reuse_mean": 0.0,
        "replay/age_mean": 0.0,
        "replay/compressed": 0.0,
    }
    buffer.add([trajectory(0), trajectory(1)])
    buffer.add(at_version([trajectory(2)], 2))
    buffer.sample(3, step=2)
    buffer.sample(1, step=2)
    # uses 1 + 1 + 1 + 1 = 4 over 3; ages at step 4: 4, 4, 2 -> 10 / 3
    assert buffer.metrics(step=4) == pytest.approx(
        {
            "replay/size": 3.0,
            "replay/bytes": 3.0 * NBYTES,
            "replay/reuse_mean": 4 / 3,
            "replay/age_mean": 10 / 3,
            "replay/compressed": 0.0,
        }
    )


@pytest.mark.parametrize("compress", [False, True])
def test_state_dict_round_trip_without_pickle(compress):
    from safetensors.torch import load as safetensors_load
    from safetensors.torch import save as safetensors_save

    buffer = ReplayBuffer(capacity=4, max_uses=3, seed=3, compress=compress)
    buffer.add(at_version([trajectory(i, completion_len=64) for i in range(6)], 1))  # evicts 0 and 1
    assert buffer.metrics(step=1)["replay/compressed"] == float(compress)
    buffer.sample(3, step=2)
    meta, tensors = buffer.state_dict()
    # the on-disk form: JSON bookkeeping + safetensors, no pickle anywhere
    meta = json.loads(json.dumps(meta))
    tensors = safetensors_load(safetensors_save(tensors))

    restored = ReplayBuffer(capacity=4, max_uses=3, seed=123, compress=compress)
    restored.load_state_dict(meta, tensors)
    for a, b in zip(restored._items.values(), buffer._items.values()):
        assert a["blob"] == b["blob"]  # compressed bytes are identical too
        assert a["extras"] == b["extras"]
        a, b = restored._tensors(a), buffer._tensors(b)
        assert a.keys() == b.keys()
        for key, value in a.items():
            assert torch.equal(value, b[key])
    assert len(restored) == 4 and restored.nbytes == buffer.nbytes and restored.num_evicted == 2
    assert restored.metrics(step=5) == buffer.metrics(step=5)
    # the continuation is identical (uses and the tie-breaking RNG are restored)
    for _ in range(3):
        expected, actual = buffer.sample(3, step=3), restored.sample(3, step=3)
        assert tags(actual) == tags(expected)
        assert [i.uses for i in actual] == [i.uses for i in expected]
    # adding after a restore keeps FIFO order
    restored.add(at_version([trajectory(10)], 4))
    assert restored.num_evicted == 3


# ---------------------------------------------------------------------------------------------------------------------
# Trajectory.to_row
# ---------------------------------------------------------------------------------------------------------------------
def test_trajectory_row_target_alignment():
    # P = 3 prompt tokens, C = 4 completion tokens -> 7 tokens, 6 targets; completion tokens are targets 2..5
    item = trajectory(0)
    item.completion_mask = torch.tensor([1.0, 1.0, 1.0, 0.0])  # last token after the stop token: not counted
    item.advantages = torch.tensor([0.5, 0.6, 0.7, 0.8])
    item.ref_per_token_logps = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    item.importance_weight = 0.5
    row = item.to_row()
    assert row.objective == RL
    assert row.input_ids.tolist() == [100, 101, 102, 200, 201, 202, 203]
    # target t predicts input_ids[t + 1]: target 2 predicts the first completion token (200)
    assert row.mask.tolist() == [0, 0, 1, 1, 1, 0]
    assert row.advantages.tolist() == pytest.approx([0, 0, 0.5, 0.6, 0.7, 0.8])
    assert row.ref_per_token_logps.tolist() == [0, 0, -1, -2, -3, -4]
    assert row.old_per_token_logps.tolist() == [0, 0, -1, -1, -1, -1]
    assert row.returns is None and row.old_values is None
    assert float(row.importance_weight) == 0.5
    assert float(trajectory(0).to_row().importance_weight) == 1.0


def test_trajectory_row_single_prompt_token():
    item = trajectory(0, prompt_len=1, completion_len=2)
    row = item.to_row()
    assert row.input_ids.numel() == 3 and row.mask.tolist() == [1, 1]


def test_served_trajectories_become_rows():
    buffer = ReplayBuffer()
    buffer.add([trajectory(0)])
    [served] = buffer.sample(1, step=0)
    row = served.to_row()
    assert row.input_ids.numel() == 7 and row.mask.numel() == 6


def round_trip(trajectories, compress: bool):
    """The trajectories served back by a buffer restored from another's state (JSON + safetensors bytes), in the
    order they were added."""
    from safetensors.torch import load as safetensors_load
    from safetensors.torch import save as safetensors_save

    buffer = ReplayBuffer(capacity=8, max_uses=1, seed=0, compress=compress)
    buffer.add(trajectories)
    assert buffer.metrics(step=0)["replay/compressed"] == float(compress)
    meta, tensors = buffer.state_dict()
    restored = ReplayBuffer(capacity=8, max_uses=1, seed=0, compress=compress)
    restored.load_state_dict(json.loads(json.dumps(meta)), safetensors_load(safetensors_save(tensors)))
    assert restored.nbytes == buffer.nbytes
    served = restored.sample(len(trajectories), step=0)
    return sorted(served, key=lambda t: int(t.prompt_ids[0]))


def declared_value(spec):
    """A value of a declared field that is not its default: `(40,)` for per-token fields."""
    if spec.per_token:
        return (torch.arange(40) % 7).to(spec.dtype)
    return {torch.bool: True, torch.long: 7}.get(spec.dtype, 0.375)


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("spec", [s for s in ROW_FIELDS if s.stored], ids=lambda s: s.name)
def test_every_stored_field_goes_through_the_buffer_to_the_batch(spec, compress):
    """Trajectory 0 sets the field away from its default; trajectory 1 leaves a per-row field at its default (a
    per-token field is set on both: a checkpoint needs a tensor field on every trajectory or none)."""
    required = {s.name: -torch.ones(40) for s in ROW_FIELDS if s.required}

    def value(i):
        return declared_value(spec) + i if spec.per_token else declared_value(spec) if i == 0 else spec.default

    items = [
        Trajectory(
            prompt_ids=torch.arange(3) + 10 * i,
            completion_ids=torch.arange(40) + 50,
            completion_mask=torch.ones(40),
            **{**required, spec.name: value(i)},
        )
        for i in range(2)
    ]
    served = round_trip(items, compress)
    for i, item in enumerate(served):
        if spec.per_token:
            assert torch.equal(getattr(item, spec.name), value(i))
        else:
            assert getattr(item, spec.name) == value(i) and type(getattr(item, spec.name)) is type(value(i))
    batch = collate_rows([t.to_row() for t in served] + [Row(SFT, torch.arange(5), torch.ones(4))], pad_token_id=0)
    column = batch[spec.name]  # (3, T) or (3,): the two RL rows, then an SFT row without the field
    assert column.dtype == spec.dtype
    for i in range(2):
        if spec.per_token:  # at the target positions P - 1 = 2 onwards
            assert torch.equal(column[i, 2:], value(i)) and not column[i, :2].any()
        else:
            assert column[i] == (0 if value(i) is None else value(i))
    assert not column[2].any() if spec.per_token else column[2] == (0 if spec.default is None else spec.default)


EXTRA_FIELD = 'RowField("teacher_logps", "token", torch.float32, help="distillation: the teacher\'s log-probs, nats"),'
CHECK_EXTRA_FIELD = """
import json, sys, torch
from safetensors.torch import load, save
import trl_trapo
from trl_trapo.collator import Row, collate_rows
from trl_trapo.memory import ReplayBuffer, Trajectory

assert trl_trapo.__file__.startswith(sys.argv[1]), trl_trapo.__file__  # the copy with the extra line

def make(i):
    return Trajectory(prompt_ids=torch.arange(3) + 10 * i, completion_ids=torch.arange(40) + 50,
                      completion_mask=torch.ones(40), old_per_token_logps=-torch.ones(40), advantages=torch.ones(40),
                      teacher_logps=-torch.arange(40.0) - i)

for compress in (False, True):
    buffer = ReplayBuffer(capacity=8, max_uses=2, seed=0, compress=compress)
    buffer.add([make(i) for i in range(3)])
    assert buffer.metrics(step=0)["replay/compressed"] == float(compress)
    assert buffer.nbytes == sum(make(i).nbytes() for i in range(3)) or compress
    first = buffer.sample(3, step=0)
    meta, tensors = buffer.state_dict()
    restored = ReplayBuffer(capacity=8, max_uses=2, seed=0, compress=compress)
    restored.load_state_dict(json.loads(json.dumps(meta)), load(save(tensors)))
    for served in (first, restored.sample(3, step=0)):
        for t in served:
            assert torch.equal(t.teacher_logps, -torch.arange(40.0) - int(t.prompt_ids[0]) // 10)
        rows = [t.to_row() for t in served] + [Row(1, torch.arange(5), torch.ones(4))]
        batch = collate_rows(rows, pad_token_id=0)
        for i, t in enumerate(served):
            assert torch.equal(batch["teacher_logps"][i, 2:], t.teacher_logps), batch["teacher_logps"]
            assert not batch["teacher_logps"][i, :2].any()
        assert not batch["teacher_logps"][3].any()
print("carried")
"""


def test_one_declaration_line_carries_a_new_per_token_field_everywhere(tmp_path):
    """Adding a per-token field is one line of `ROW_FIELDS`: in a copy of the package with only that line added, a
    trajectory's new tensor survives the replay buffer (plain, compressed, state_dict) and reaches the micro-batch.
    Any path that lists the fields by hand again (Trajectory, `to_row`, the buffer, collation) fails here."""
    copy = tmp_path / "trl_trapo"
    shutil.copytree(Path(trl_trapo.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    source = (copy / "collator.py").read_text()
    anchor = "ROW_FIELDS: tuple[RowField, ...] = (\n"
    assert source.count(anchor) == 1
    (copy / "collator.py").write_text(source.replace(anchor, anchor + "    " + EXTRA_FIELD + "\n"))
    result = subprocess.run(
        [sys.executable, "-c", CHECK_EXTRA_FIELD, str(copy)],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "carried" in result.stdout, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Model inputs
# ---------------------------------------------------------------------------------------------------------------------
def with_inputs(tag, inputs):
    item = trajectory(tag, completion_len=64)
    item.model_inputs = inputs
    return item


@pytest.mark.parametrize("compress", [False, True])
def test_model_inputs_go_through_the_buffer_and_its_checkpoint(compress):
    images = {
        "pixel_values": torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4),  # (images, ...)
        "image_grid_thw": torch.tensor([[1, 2, 2], [1, 1, 2]]),
    }
    other = {"pixel_values": torch.full((1, 3, 4), 0.5), "image_grid_thw": torch.tensor([[1, 1, 1]])}
    items = [
        with_inputs(0, images),
        with_inputs(1, {}),  # a text-only prompt among image prompts
        with_inputs(2, other),
        with_inputs(3, {"pixel_values": torch.zeros(0, 3, 4)}),  # no image, but the key
    ]
    assert items[0].nbytes() == trajectory(0, completion_len=64).nbytes() + 2 * 3 * 4 * 4 + 6 * 8
    served = sorted(round_trip(items, compress), key=lambda t: int(t.temperature))
    for original, item in zip(items, served):
        assert list(item.model_inputs) == sorted(original.model_inputs)
        for name, value in original.model_inputs.items():
            assert torch.equal(item.model_inputs[name], value) and item.model_inputs[name].dtype == value.dtype
    batch = collate_rows([t.to_row() for t in served], pad_token_id=0)
    assert torch.equal(
        batch["model_inputs"]["pixel_values"], torch.cat([images["pixel_values"], other["pixel_values"]])
    )
    assert batch["model_inputs"]["image_grid_thw"].tolist() == [[1, 2, 2], [1, 1, 2], [1, 1, 1]]


def test_replay_state_without_model_inputs_is_as_before():
    meta, tensors = round_trip_state([trajectory(0), trajectory(1)])
    assert "model_inputs" not in meta and not any("model_inputs" in key for key in tensors)


def round_trip_state(trajectories):
    buffer = ReplayBuffer(capacity=8, max_uses=1)
    buffer.add(trajectories)
    return buffer.state_dict()


def test_model_inputs_of_one_name_need_one_dtype_to_be_checkpointed():
    buffer = ReplayBuffer(capacity=8, max_uses=1)
    buffer.add([with_inputs(0, {"x": torch.zeros(1, 2)}), with_inputs(1, {"x": torch.zeros(1, 2).half()})])
    with pytest.raises(ValueError, match=r"Model input 'x' has dtypes \['torch.float16', 'torch.float32'\]"):
        buffer.state_dict()


# ---------------------------------------------------------------------------------------------------------------------
# SFTPool
# ---------------------------------------------------------------------------------------------------------------------
def sft_dataset(n=5):
    return Dataset.from_dict(
        {
            "input_ids": [[10 * i + j for j in range(3 + i % 2)] for i in range(n)],
            "completion_mask": [[0] + [1] * (2 + i % 2) for i in range(n)],
        }
    )


def test_sft_pool_rows():
    pool = SFTPool(sft_dataset(), seed=0)
    assert pool.take(0) == []
    rows = pool.take(5)
    assert all(r.objective == SFT for r in rows)
    # one epoch covers every row once; the target-aligned mask drops the first entry of completion_mask
    assert sorted(int(r.input_ids[0]) // 10 for r in rows) == [0, 1, 2, 3, 4]
    for r in rows:
        assert r.mask.numel() == r.input_ids.numel() - 1
        assert r.mask.tolist() == [1.0] * r.mask.numel()
        assert r.input_ids.dtype == torch.long and r.mask.dtype == torch.float32


def test_sft_pool_state_round_trip_and_shards():
    pool = SFTPool(sft_dataset(), seed=1)
    pool.take(3)
    restored = SFTPool(sft_dataset(), seed=1)
    restored.load_state_dict(pool.state_dict())
    assert [r.input_ids.tolist() for r in restored.take(6)] == [r.input_ids.tolist() for r in pool.take(6)]
    # two ranks see disjoint rows of the same epoch
    rank0, rank1 = SFTPool(sft_dataset(6), rank=0, world_size=2), SFTPool(sft_dataset(6), rank=1, world_size=2)
    first = Counter(int(r.input_ids[0]) for r in rank0.take(3) + rank1.take(3))
    assert sorted(first) == [0, 10, 20, 30, 40, 50] and set(first.values()) == {1}
