"""Decode-span arithmetic (simcore.span) against its per-request, per-step definition."""

from __future__ import annotations

import numpy as np

from kvsim.simcore.span import _new_block_bins, boundaries, context_sums, kv_slots, span_shape


def _blocks(tokens: np.ndarray, block_size: int) -> np.ndarray:
    return -(-tokens // block_size)


def test_span_shape_and_kv_slots_follow_step_by_step_blocks():
    """Blocks taken per step, where the span must stop for free blocks, and the unfilled slots of
    last blocks after each step equal what appending one token per request per step gives."""
    rng = np.random.default_rng(3)
    for _ in range(400):
        block_size = int(rng.choice([1, 2, 4, 8, 16, 32]))
        num_seqs = int(rng.integers(1, 40))
        computed = rng.integers(0, 300, num_seqs)
        remaining = rng.integers(2, 200, num_seqs)
        free = int(rng.integers(0, 60))
        shape = span_shape(computed, int(remaining.min()), block_size, free)
        k = shape.num_steps
        assert 1 <= k <= remaining.min()
        # after step 1 each request holds blocks for computed + 1 tokens; step j adds one token each
        after = [_blocks(computed + j, block_size).sum() for j in range(1, k + 1)]
        assert (shape.new_blocks_cum == np.array(after) - after[0]).all()
        if free >= 1 and k < remaining.min():  # stopped because one more step would leave no block free
            assert _blocks(computed + k + 1, block_size).sum() - after[0] > free - 1
        if free >= 1:
            assert shape.new_blocks_cum[-1] <= free - 1
        unfilled = [int(((-(computed + j)) % block_size).sum()) for j in range(1, k + 1)]
        given = span_shape(computed, int(remaining.min()), block_size, free, internal_first=unfilled[0])
        assert given.num_steps == k and (given.new_blocks_cum == shape.new_blocks_cum).all()
        shape.used_blocks = used = int(rng.integers(after[0], after[0] + 100))  # blocks in use after step 1
        for m in (k, k - 1):
            allocated, internal = kv_slots(shape, num_seqs, block_size, m)
            assert internal.tolist() == unfilled[:m]
            assert allocated.tolist() == [(used + a - after[0]) * block_size for a in after[:m]]


def test_context_sums_grow_by_the_batch_each_step():
    assert context_sums(100, 3, 4).tolist() == [100, 103, 106, 109]
    assert context_sums(7, 1, 1).tolist() == [7]


def test_cached_step_arrays_are_read_only_views():
    bins = _new_block_bins(4, 6)  # step 1: the empty bin 4; step k >= 2: (1 - k) % 4
    assert bins.tolist() == [4, 3, 2, 1, 0, 3]
    assert not bins.flags.writeable
    assert _new_block_bins(4, 5000)[-1] == (1 - 5000) % 4


def test_boundaries_add_durations_one_at_a_time():
    start, durations = 0.1, np.array([0.3, 0.7, 1e-17, 0.2])
    clock, expected = start, []
    for d in durations.tolist():
        clock += d
        expected.append(clock)
    assert boundaries(start, durations).tolist() == expected
