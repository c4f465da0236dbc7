# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Row allocation between objectives, micro-batch splitting, right-padded collation, and the declaration of the
fields rows carry (`ROW_FIELDS`) with the model-inputs slot."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_trapo.collator import (
    ROW_FIELDS,
    Row,
    RowAllocator,
    RowField,
    collate_rows,
    combine_model_inputs,
    left_pad,
    split_micro_batches,
)


# ---------------------------------------------------------------------------------------------------------------------
# RowAllocator
# ---------------------------------------------------------------------------------------------------------------------
def test_allocator_exact_shares():
    allocator = RowAllocator(3)
    # ideal 8 * (0.5, 0.25, 0.25) = (4, 2, 2)
    assert allocator.allocate(8, (0.5, 0.25, 0.25)) == [4, 2, 2]
    assert allocator.given == [4, 2, 2]


def test_allocator_running_deficit_by_hand():
    allocator = RowAllocator(3)
    shares = (0.5, 0.3, 0.2)
    # step 1: ideal (1, 0.6, 0.4); row 1 -> pretrain (deficit 1), row 2 -> sft (0.6 > 0.4 > 0)
    assert allocator.allocate(2, shares) == [1, 1, 0]
    # step 2: ideal (2, 1.2, 0.8), given (1, 1, 0): deficits (1, 0.2, 0.8) -> pretrain, then rl (0.8 > 0.2, 0)
    assert allocator.allocate(2, shares) == [1, 0, 1]
    # step 3: ideal (3, 1.8, 1.2), given (2, 1, 1): deficits (1, 0.8, 0.2) -> pretrain, then sft
    assert allocator.allocate(2, shares) == [1, 1, 0]
    assert allocator.given == [3, 2, 1]


def test_allocator_ties_go_to_lower_index():
    assert RowAllocator(3).allocate(1, (1 / 3, 1 / 3, 1 / 3)) == [1, 0, 0]
    assert RowAllocator(3).allocate(2, (0.0, 0.5, 0.5)) == [0, 1, 1]


def test_allocator_zero_share_gets_nothing_even_when_behind():
    allocator = RowAllocator(3)
    allocator.allocate(1, (0.5, 0.0, 0.5))  # rl is now 0.5 behind
    for _ in range(5):
        counts = allocator.allocate(3, (0.0, 1.0, 0.0))
        assert counts == [0, 3, 0]


def test_allocator_is_deterministic():
    steps = [(3, (0.7, 0.2, 0.1)), (1, (0.3, 0.5, 0.2)), (5, (0.1, 0.3, 0.6)), (2, (0.0, 0.4, 0.6))] * 3
    first, second = RowAllocator(3), RowAllocator(3)
    assert [first.allocate(r, s) for r, s in steps] == [second.allocate(r, s) for r, s in steps]


def test_allocator_tiny_steps_still_serve_small_shares():
    # one row per step, 10 % RL: RL must get every tenth row rather than never
    allocator = RowAllocator(3)
    counts = [0, 0, 0]
    for _ in range(100):
        for i, c in enumerate(allocator.allocate(1, (0.6, 0.3, 0.1))):
            counts[i] += c
    assert counts == [60, 30, 10]


SHARES = st.tuples(*[st.integers(0, 10)] * 3).filter(any).map(lambda w: tuple(x / sum(w) for x in w))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), SHARES), min_size=1, max_size=40))
def test_allocator_tracks_cumulative_shares_within_one_row(steps):
    allocator = RowAllocator(3)
    ideal, given = [0.0] * 3, [0] * 3
    for rows, shares in steps:
        counts = allocator.allocate(rows, shares)
        assert sum(counts) == rows
        assert all(c == 0 for c, s in zip(counts, shares) if s == 0)
        for i in range(3):
            ideal[i] += shares[i] * rows
            given[i] += counts[i]
            assert abs(given[i] - ideal[i]) < 1.0 + 1e-9, (ideal, given)


def test_allocator_state_round_trip():
    steps = [(3, (0.7, 0.2, 0.1)), (1, (0.3, 0.5, 0.2)), (5, (0.1, 0.3, 0.6))]
    original = RowAllocator(3)
    for r, s in steps:
        original.allocate(r, s)
    restored = RowAllocator(3)
    restored.load_state_dict(original.state_dict())
    assert restored.state_dict() == original.state_dict()
    later = [(1, (0.1, 0.3, 0.6))] * 7
    assert [original.allocate(r, s) for r, s in later] == [restored.allocate(r, s) for r, s in later]


# ---------------------------------------------------------------------------------------------------------------------
# split_micro_batches
# ---------------------------------------------------------------------------------------------------------------------
def row(length, objective=0, tag=-1, **fields):
    """A row of `length` tokens; its tag rides in `pool_index`."""
    return Row(objective, torch.arange(length), torch.ones(length - 1), pool_index=tag, **fields)


def test_split_micro_batches_sizes_and_length_grouping():
    rows = [row(n, tag=i) for i, n in enumerate([3, 7, 5, 7, 2])]
    groups = split_micro_batches(rows, 2)
    # sorted longest first, stable among equals: 7 (#1), 7 (#3), 5 (#2), 3 (#0), 2 (#4); sizes 3 + 2
    assert [[r.pool_index for r in g] for g in groups] == [[1, 3, 2], [0, 4]]


def test_split_micro_batches_sizes_differ_by_at_most_one():
    rows = [row(n % 6 + 2) for n in range(11)]
    groups = split_micro_batches(rows, 4)
    assert [len(g) for g in groups] == [3, 3, 3, 2]
    assert sum(len(g) for g in groups) == 11


def test_split_micro_batches_fewer_rows_than_micro_batches():
    groups = split_micro_batches([row(4, tag=0), row(2, tag=1)], 4)
    assert [[r.pool_index for r in g] for g in groups] == [[0], [1], [], []]


# ---------------------------------------------------------------------------------------------------------------------
# collate_rows
# ---------------------------------------------------------------------------------------------------------------------
PAD = 99


def mixed_rows():
    pretrain = Row(0, torch.tensor([5, 6, 7, 8]), torch.ones(3))
    rl = Row(
        2,
        torch.tensor([10, 11, 12, 13, 14, 15]),
        torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]),
        advantages=torch.tensor([0.0, 0.5, 0.5, 0.5, 0.0]),
        old_per_token_logps=torch.tensor([0.0, -1.0, -2.0, -3.0, 0.0]),
        importance_weight=0.25,
        half=0,
    )
    sft = Row(1, torch.tensor([20, 21]), torch.tensor([1.0]))
    return [pretrain, rl, sft]


def test_collate_rows_shapes_and_right_padding():
    batch = collate_rows(mixed_rows(), PAD)
    assert batch["input_ids"].shape == (3, 6) and batch["input_ids"].dtype == torch.long
    assert batch["mask"].shape == (3, 5)
    assert batch["input_ids"].tolist() == [
        [5, 6, 7, 8, PAD, PAD],
        [10, 11, 12, 13, 14, 15],
        [20, 21, PAD, PAD, PAD, PAD],
    ]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6, [1, 1, 0, 0, 0, 0]]
    assert batch["mask"].tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [1, 0, 0, 0, 0]]
    assert batch["objective"].tolist() == [0, 2, 1]


def test_collate_rows_per_token_fields_only_on_rows_that_have_them():
    batch = collate_rows(mixed_rows(), PAD)
    assert set(batch) == {
        "input_ids",
        "attention_mask",
        "objective",
        "mask",
        "importance_weight",
        "half",
        "pool_index",
        "advantages",
        "old_per_token_logps",
    }  # fields no row has (returns, old_values, ref logps) are absent
    assert batch["advantages"].tolist() == [[0.0] * 5, [0.0, 0.5, 0.5, 0.5, 0.0], [0.0] * 5]
    assert batch["old_per_token_logps"].tolist() == [[0.0] * 5, [0.0, -1.0, -2.0, -3.0, 0.0], [0.0] * 5]
    # importance weight defaults to 1; half defaults to the row index parity unless given
    assert batch["importance_weight"].tolist() == [1.0, 0.25, 1.0]
    assert batch["half"].tolist() == [0, 0, 0]


def test_collate_rows_masks_come_from_lengths_not_pad_id():
    # a row whose real tokens equal the pad id (pad == eos) keeps them in the attention mask
    rows = [Row(1, torch.tensor([4, PAD, PAD]), torch.tensor([1.0, 1.0])), row(5)]
    batch = collate_rows(rows, PAD)
    assert batch["attention_mask"][0].tolist() == [1, 1, 1, 0, 0]
    assert batch["mask"][0].tolist() == [1, 1, 0, 0]
    assert batch["half"].tolist() == [0, 1]


def test_collate_rows_errors():
    with pytest.raises(ValueError, match="at least one row"):
        collate_rows([], PAD)
    bad = Row(0, torch.tensor([1, 2, 3]), torch.ones(3))
    with pytest.raises(ValueError, match="Row 1: mask has 3 entries for 3 tokens"):
        collate_rows([row(4), bad], PAD)


def test_collate_rows_keys_and_dtypes_of_every_declared_field():
    # one RL row sets every field away from its default, one pretraining row sets none
    fields = {spec.name: torch.arange(5.0) if spec.per_token else 1 for spec in ROW_FIELDS}
    batch = collate_rows([Row(2, torch.arange(6), torch.ones(5), **fields), row(3)], PAD)
    assert list(batch) == ["input_ids", "attention_mask", "objective", "mask", "half"] + [s.name for s in ROW_FIELDS]
    for spec in ROW_FIELDS:
        column = batch[spec.name]
        assert column.dtype == spec.dtype and column.shape == ((2, 5) if spec.per_token else (2,))
        if spec.per_token:
            assert column[0].tolist() == [0, 1, 2, 3, 4] and column[1].tolist() == [0] * 5
        else:
            assert column[0] == 1 and column[1] == (0 if spec.default is None else spec.default)


def test_row_field_declarations_are_checked():
    with pytest.raises(ValueError, match="kind must be 'token' or 'row'"):
        RowField("x", "tokens", torch.float32)
    with pytest.raises(ValueError, match="per-token field has no default"):
        RowField("x", "token", torch.float32, default=0.0)
    with pytest.raises(ValueError, match="needs `stored=True`"):
        RowField("x", "row", torch.long, stored=False, required=True)


# ---------------------------------------------------------------------------------------------------------------------
# Model inputs
# ---------------------------------------------------------------------------------------------------------------------
def test_model_inputs_concatenate_along_dim_0_in_row_order():
    # rows with 2, 0 and 1 "images" of (3, 2) values each, and one grid line per image
    images = [torch.arange(12.0).view(2, 3, 2), None, torch.full((1, 3, 2), -1.0)]
    rows = [
        row(4, objective=2, model_inputs={"pixel_values": images[0], "image_grid_thw": torch.tensor([[1, 1, 1]] * 2)}),
        row(3),
        row(5, objective=2, model_inputs={"pixel_values": images[2], "image_grid_thw": torch.tensor([[1, 2, 1]])}),
    ]
    batch = collate_rows(rows, PAD)
    assert list(batch["model_inputs"]) == ["pixel_values", "image_grid_thw"]
    assert torch.equal(batch["model_inputs"]["pixel_values"], torch.cat([images[0], images[2]]))
    assert batch["model_inputs"]["image_grid_thw"].tolist() == [[1, 1, 1], [1, 1, 1], [1, 2, 1]]
    assert "model_inputs" not in collate_rows([row(3), row(4)], PAD)  # no row has any: the key is absent
    assert combine_model_inputs([None, {}]) == {}


def test_model_inputs_that_cannot_be_combined_are_refused():
    def inputs(value):
        return {"pixel_values": value}

    with pytest.raises(ValueError, match=r"'pixel_values': row 0 has torch.float32 of shape \(1, 3\), row 2 has "):
        combine_model_inputs([inputs(torch.zeros(1, 3)), None, inputs(torch.zeros(1, 4))])
    with pytest.raises(ValueError, match="row 1 has torch.float16"):
        combine_model_inputs([inputs(torch.zeros(1, 3)), inputs(torch.zeros(2, 3, dtype=torch.float16))])
    with pytest.raises(ValueError, match="row 0 must be a tensor with a leading dimension .* got a 0-dim tensor"):
        combine_model_inputs([inputs(torch.tensor(1.0))])
    with pytest.raises(ValueError, match="got list"):
        collate_rows([row(3, model_inputs=inputs([1.0, 2.0]))], PAD)


def test_left_pad():
    input_ids, attention_mask = left_pad([[1, 2, 3], torch.tensor([4])], pad_token_id=0)
    assert input_ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
