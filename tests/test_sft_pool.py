# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The prioritised SFT pool: sampling matches the priorities, importance weights, refresh, state, disk budget."""

import math
import os

import pytest
import torch
from datasets import Dataset

from trl_trapo.collator import StepContext, collate_rows
from trl_trapo.config import SFT
from trl_trapo.memory.sft_pool import PrioritizedSFTPool, SumMinTree, directory_nbytes, sft_priority_proxy


def sft_dataset(n=8):
    """Row i: tokens [10 i, 10 i + 1, ...] of length 3 + i % 3, completion = everything after the first token."""
    ids = [[10 * i + j for j in range(3 + i % 3)] for i in range(n)]
    return Dataset.from_dict({"input_ids": ids, "completion_mask": [[0] + [1] * (len(x) - 1) for x in ids]})


def make_pool(tmp_path, n=8, **kwargs):
    kwargs.setdefault("total_steps", 100)
    return PrioritizedSFTPool(sft_dataset(n), str(tmp_path / "pool"), **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# The sum tree
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 2, 5, 8, 13])
def test_sum_min_tree_totals_and_search(size):
    tree = SumMinTree(size)
    values = torch.arange(1, size + 1, dtype=torch.float64)
    tree.set_all(values)
    assert tree.total == pytest.approx(float(values.sum())) and tree.minimum == 1.0
    prefix = torch.cumsum(values, 0) - values  # leaf i covers [prefix_i, prefix_i + v_i)
    for i in range(size):
        targets = torch.tensor([float(prefix[i]), float(prefix[i] + values[i] - 1e-9)], dtype=torch.float64)
        assert tree.find(targets).tolist() == [i, i]
    # a batched update with a duplicate index: the last value wins; parents are recomputed exactly
    tree.set(torch.tensor([0, size - 1, 0]), torch.tensor([5.0, 0.5, 7.0]))
    values[size - 1] = 0.5
    values[0] = 7.0  # index 0 was given last (for one leaf, index 0 is also size - 1)
    assert tree.total == pytest.approx(float(values.sum())) and tree.minimum == float(values.min())
    assert torch.equal(tree.leaves(), values)


# ---------------------------------------------------------------------------------------------------------------------
# Sampling and importance weights
# ---------------------------------------------------------------------------------------------------------------------
def chi_square(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    expected = probabilities * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# chi-square critical values at p = 0.001 for 7 degrees of freedom
CHI2_7_P001 = 24.32


@pytest.mark.parametrize("batch", [1, 16])
def test_sampling_matches_the_priorities(tmp_path, batch):
    pool = make_pool(tmp_path, alpha=0.7, seed=3)
    proxies = torch.tensor([0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0])
    pool.update_priorities(torch.arange(8), proxies)
    expected = (proxies + pool.epsilon).double().pow(0.7)
    expected = expected / expected.sum()
    torch.testing.assert_close(pool.probabilities(), expected)
    counts = torch.zeros(8, dtype=torch.float64)
    for _ in range(16_000 // batch):
        counts += torch.bincount(pool.sample_indices(batch), minlength=8).double()
    assert chi_square(counts, expected) < CHI2_7_P001, (counts, expected * counts.sum())
    # and the sampler is not trivially uniform: the largest priority is drawn far more often than the smallest
    assert counts[7] > 5 * counts[0]


def test_importance_weights_by_hand(tmp_path):
    pool = make_pool(tmp_path, n=4, alpha=0.5, beta=0.4, total_steps=10)
    pool.update_priorities(torch.arange(4), torch.tensor([0.09, 0.24, 0.99, 0.49]))  # p = 0.1, 0.25, 1.0, 0.5
    p_alpha = torch.tensor([0.1, 0.25, 1.0, 0.5], dtype=torch.float64).sqrt()
    probabilities = p_alpha / p_alpha.sum()
    for step, beta in ((0, 0.4), (5, 0.7), (10, 1.0), (50, 1.0)):
        assert pool.beta_at(step) == pytest.approx(beta)
        raw = (4 * probabilities) ** (-beta)  # (N P(i))^-beta
        expected = raw / raw.max()
        torch.testing.assert_close(
            pool.importance_weights(torch.arange(4), step).double(), expected, atol=1e-6, rtol=0
        )
    # by hand at beta = 0.4: w_2 = (sqrt(0.1) / sqrt(1.0))^0.4 = 0.1^0.2
    assert float(pool.importance_weights(torch.tensor([2]), 0)) == pytest.approx(0.1**0.2, rel=1e-6)
    assert float(pool.importance_weights(torch.tensor([0]), 0)) == pytest.approx(1.0)


def test_rows_carry_pool_index_and_weight(tmp_path):
    pool = make_pool(tmp_path, alpha=1.0)
    pool.update_priorities(torch.arange(8), torch.linspace(0, 1, 8))
    rows = pool.take(5, step=0)
    assert len(rows) == 5
    for row in rows:
        assert row.objective == SFT
        source = pool.indices[row.pool_index]
        assert row.input_ids.tolist() == sft_dataset()[source]["input_ids"]
        expected = pool.importance_weights(torch.tensor([row.pool_index]), 0)
        assert float(row.importance_weight) == pytest.approx(float(expected))
    assert pool.take(0) == []


def test_new_rows_start_at_the_maximum_priority_and_priorities_refresh(tmp_path):
    pool = make_pool(tmp_path)
    assert torch.all(pool.priorities == 1.0 + pool.epsilon)  # unseen rows: the largest possible proxy
    torch.testing.assert_close(pool.probabilities(), torch.full((8,), 1 / 8, dtype=torch.float64))
    # reports are queued (possibly on an accelerator) and applied at the next draw
    pool.report(torch.tensor([0, 3, -1]), torch.tensor([0.2, 0.0, 0.9]))  # -1: not an SFT row, ignored
    assert pool.priorities[0] == 1.0 + pool.epsilon and len(pool._pending) == 1
    pool.take(1)
    assert pool._pending == []
    assert pool.priorities[0] == pytest.approx(0.2 + pool.epsilon)
    assert pool.priorities[3] == pytest.approx(pool.epsilon)
    assert pool.num_refreshed == 2
    # the last report of a row wins; a larger proxy raises the running maximum
    pool.update_priorities(torch.tensor([1, 1]), torch.tensor([0.3, 0.6]))
    assert pool.priorities[1] == pytest.approx(0.6 + pool.epsilon)
    assert pool.tree.leaves()[1] == pytest.approx((0.6 + pool.epsilon) ** pool.alpha)


def test_proxy_is_within_sqrt2_of_the_logit_gradient_norm():
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 11) * 3
    targets = torch.randint(0, 11, (4, 6))
    probs = logits.softmax(-1)
    p_y = probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    grad_norm = (probs - torch.nn.functional.one_hot(targets, 11)).norm(dim=-1)  # ||d CE / d logits||
    assert torch.all(grad_norm >= (1 - p_y) - 1e-6) and torch.all(grad_norm <= math.sqrt(2) * (1 - p_y) + 1e-6)
    mask = torch.ones(4, 6)
    mask[1, 3:] = 0
    mask[3] = 0
    proxy = sft_priority_proxy(p_y.log(), mask)
    expected = ((1 - p_y) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    torch.testing.assert_close(proxy, expected)
    assert proxy[3] == 0  # a row without counted tokens


# ---------------------------------------------------------------------------------------------------------------------
# State and disk
# ---------------------------------------------------------------------------------------------------------------------
def test_state_round_trip(tmp_path):
    pool = make_pool(tmp_path, alpha=0.6, seed=1)
    pool.update_priorities(torch.arange(8), torch.rand(8, generator=torch.Generator().manual_seed(0)))
    pool.take(3, step=4)
    meta, tensors = pool.state_dict(), pool.tensor_state()
    assert isinstance(meta["max_priority"], float)  # JSON-able bookkeeping; tensors go to safetensors
    restored = PrioritizedSFTPool(sft_dataset(), str(tmp_path / "other"), total_steps=100, seed=99)
    restored.load_state_dict(meta)
    restored.load_tensor_state(tensors)
    assert restored.indices == pool.indices
    torch.testing.assert_close(restored.probabilities(), pool.probabilities())
    for step in (5, 6):
        a, b = pool.take(4, step), restored.take(4, step)
        assert [r.pool_index for r in a] == [r.pool_index for r in b]
        assert [float(r.importance_weight) for r in a] == [float(r.importance_weight) for r in b]


def test_state_with_other_kept_rows_rewrites_the_disk_copy(tmp_path):
    full = make_pool(tmp_path, seed=0)
    capped_dir = tmp_path / "capped"
    capped = PrioritizedSFTPool(sft_dataset(), str(capped_dir), max_bytes=full.nbytes - 60, total_steps=100, seed=0)
    assert len(capped) < len(full)
    capped.load_state_dict(full.state_dict())
    capped.load_tensor_state(full.tensor_state())
    assert capped.indices == full.indices and len(capped.dataset) == len(full)
    assert capped.dataset[3]["input_ids"] == full.dataset[3]["input_ids"]


def test_corrupted_state_is_rejected(tmp_path):
    pool = make_pool(tmp_path)
    meta, tensors = pool.state_dict(), pool.tensor_state()
    other = make_pool(tmp_path / "b", n=7)
    with pytest.raises(ValueError, match="resume with the same dataset"):
        other.load_state_dict(meta, tensors)
    bad = dict(tensors, priorities=tensors["priorities"][:-1])
    with pytest.raises(ValueError, match="inconsistent"):
        pool.load_state_dict(meta, bad)
    with pytest.raises(ValueError, match="must come before"):
        make_pool(tmp_path / "c").load_tensor_state(tensors)


def test_disk_copy_is_memory_mapped_arrow_with_compact_types(tmp_path):
    pool = make_pool(tmp_path)
    assert os.path.isfile(tmp_path / "pool" / "dataset_info.json")
    assert pool.dataset.cache_files, "the pool must be read from its Arrow file on disk"
    assert str(pool.dataset.features["input_ids"].feature.dtype) == "int32"
    assert str(pool.dataset.features["completion_mask"].feature.dtype) == "int8"
    assert pool.nbytes == directory_nbytes(str(tmp_path / "pool"))


def test_byte_budget(tmp_path, caplog):
    full = make_pool(tmp_path / "full", seed=0)
    budget = full.nbytes - 60  # a few rows too many
    capped = PrioritizedSFTPool(sft_dataset(), str(tmp_path / "capped"), max_bytes=budget, total_steps=10, seed=0)
    assert 0 < len(capped) < len(full)
    assert capped.nbytes <= budget and directory_nbytes(str(tmp_path / "capped")) <= budget
    assert capped.indices == full.indices[: len(capped)]  # a prefix of the same seeded permutation
    assert "keeps" in caplog.text and "sft_pool_max_bytes" in caplog.text
    # the budget is shared by the ranks
    shard = PrioritizedSFTPool(
        sft_dataset(), str(tmp_path / "r1"), max_bytes=2 * budget, rank=1, world_size=2, total_steps=10
    )
    assert shard.nbytes <= budget
    with pytest.raises(ValueError, match="cannot hold a single row"):
        PrioritizedSFTPool(sft_dataset(), str(tmp_path / "tiny"), max_bytes=100, total_steps=10)


# ---------------------------------------------------------------------------------------------------------------------
# In the trainer
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def make_trainer(tiny_trainer):
    """Factory: the tiny trainer with the prioritised SFT pool (then `overrides`)."""

    def make(tmp_path, tokenizer, suite, **overrides):
        overrides = {"sft_sampling": "prioritized", "sft_pool_max_bytes": 10**7, **overrides}
        return tiny_trainer(tmp_path, tokenizer, suite, **overrides)

    return make


def test_importance_weight_multiplies_the_sft_loss(tmp_path, tokenizer, suite, make_trainer):
    trainer = make_trainer(tmp_path, tokenizer, suite)
    rows = trainer.memory_pool.take_sft(2, step=0)
    for row, weight in zip(rows, (0.25, 1.0)):
        row.importance_weight = weight
    tokens = float(sum(r.mask.sum() for r in rows))
    info = StepContext(
        weights=(0.0, 1.0, 0.0),
        counts={
            "tokens_pretrain": 0.0,
            "tokens_sft": tokens,
            "tokens_rl": 0.0,
            "sequences_rl": 0.0,
            "micro_batches_rl": 0.0,
        },
        probe=False,
        step=0,
        num_micro=1,
    )
    pad = tokenizer.pad_token_id
    loss = trainer.compute_loss(trainer.model, collate_rows(rows, pad), num_items_in_batch=info)
    with torch.no_grad():
        nll = []
        for row in rows:
            batch = collate_rows([row], pad)
            logits = trainer.model(input_ids=batch["input_ids"]).logits[:, :-1]
            logps = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
            nll.append(float(-(logps * batch["mask"]).sum()))
    torch.testing.assert_close(float(loss), (0.25 * nll[0] + 1.0 * nll[1]) / tokens, rtol=1e-5, atol=1e-6)


def test_training_refreshes_priorities_without_syncing_each_micro_batch(tmp_path, tokenizer, suite, make_trainer):
    trainer = make_trainer(tmp_path, tokenizer, suite, gradient_accumulation_steps=2, max_steps=3)
    pool = trainer.memory_pool.sft_pool
    assert isinstance(pool, PrioritizedSFTPool) and pool.directory == str(tmp_path / "sft_pool" / "rank0")
    reports = []
    original = pool.report

    def spy(index, proxies):  # the trainer hands over tensors, never Python numbers (no .item() per micro-batch)
        assert isinstance(index, torch.Tensor) and isinstance(proxies, torch.Tensor)
        reports.append(len(pool._pending))
        original(index, proxies)

    pool.report = spy
    initial = pool.priorities.clone()
    trainer.train()
    assert len(reports) == 6  # one per micro-batch
    assert pool.num_refreshed > 0
    assert not torch.equal(pool.priorities, initial)
    assert bool((pool.priorities < 1.0 + pool.epsilon).any())  # the model now predicts some completions
    log = next(h for h in trainer.state.log_history if "sft_pool/size" in h)
    assert log["sft_pool/size"] == len(pool) and 0 < log["sft_pool/is_weight_mean"] <= 1
