"""Automatic prefix caching on the paged cache: shared prompt prefixes are computed once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.simcore.block_pool import PagedAllocator
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.simulate import prepare, simulate
from kvsim.simcore.specs import EngineConfig
from tests.helpers import ListWorkload, flat_profile, req

TINY, H100 = MODELS["tiny"], GPUS["H100-SXM-80GB"]


def run(requests, **config):
    return simulate(TINY, H100, EngineConfig(**config), ListWorkload(requests), flat_profile())


def test_second_request_adopts_the_cached_prefix_and_computes_only_the_rest():
    # prefix of 10 tokens, block 4: blocks 0 and 1 (8 tokens) are cacheable. r0 prefills 12
    # tokens in step 1 and caches them; r1 (same prefix) arrives during step 1 and in step 2
    # adopts 8 tokens, computing only 12 - 8 = 4 (beside r0's decode).
    requests = [req(0, 0.0, 12, 3, prefix_id=7, num_prefix_tokens=10),
                req(1, 0.001, 12, 2, prefix_id=7, num_prefix_tokens=10)]
    result = run(requests, block_size=4, max_model_len=32)
    assert result.steps["num_prefill_tokens"].tolist()[:2] == [12, 4]
    assert result.summary["prefix_cache_hit_rate"] == 8 / 24
    # after step 2 r0 holds 4 blocks (12 tokens + its first decode) and r1 adds one block of
    # its own beside the two it shares with r0: 5 blocks, not 4 + 3
    assert result.steps["kv_allocated"].tolist()[1] == (4 + 1) * 4
    assert (result.steps["kv_live"] <= result.steps["kv_allocated"]).all()


def test_without_prefix_caching_every_request_computes_its_whole_prompt():
    requests = [req(0, 0.0, 12, 3, prefix_id=7, num_prefix_tokens=10),
                req(1, 0.001, 12, 2, prefix_id=7, num_prefix_tokens=10)]
    result = run(requests, block_size=4, max_model_len=32, enable_prefix_caching=False)
    assert result.steps["num_prefill_tokens"].tolist()[:2] == [12, 12]
    assert "prefix_cache_hit_rate" not in result.summary


def test_a_finished_prefix_stays_cached_until_its_blocks_are_needed():
    # r0 finishes long before r1 arrives: its prefix blocks are free but still cached.
    requests = [req(0, 0.0, 8, 1, prefix_id=1, num_prefix_tokens=8),
                req(1, 0.05, 9, 1, prefix_id=1, num_prefix_tokens=8)]
    result = run(requests, block_size=4, max_model_len=32)
    assert result.steps["num_prefill_tokens"].tolist() == [8, 1]
    assert result.steps["kv_allocated"].tolist() == [8, 12]


def test_cached_blocks_are_evicted_least_recently_freed_first_and_only_when_needed():
    alloc = PagedAllocator(num_gpu_blocks=4, block_size=2)
    hashes_a, hashes_b = [("a", 0), ("a", 1)], [("b", 0)]
    assert alloc.append_slots(1, 4)
    alloc.cache_full_blocks(1, hashes_a)
    assert alloc.append_slots(2, 2)
    alloc.cache_full_blocks(2, hashes_b)
    alloc.free(1)  # blocks 1, 0 become evictable (tail first), still cached
    alloc.free(2)
    assert alloc.num_free_blocks == 4 and alloc.num_cached_prefix_blocks(hashes_a) == 2
    assert alloc.append_slots(3, 2)  # the never-used block 3 first: nothing evicted
    assert alloc.num_cached_prefix_blocks(hashes_a) == 2 and alloc.num_cached_prefix_blocks(hashes_b) == 1
    assert alloc.append_slots(3, 2)  # evicts the least recently freed: a's tail block
    assert alloc.num_cached_prefix_blocks(hashes_a) == 1 and alloc.num_cached_prefix_blocks(hashes_b) == 1
    assert alloc.allocate_slots(4, 0, hashes_a[:1])  # a hit revives the block: no longer evictable
    assert alloc.num_free_blocks == 1
    alloc.free(4)
    alloc.free(3)
    assert alloc.num_free_blocks == 4


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4]),
    extra_blocks=st.integers(0, 10),
    mode=st.sampled_from(["recompute", "swap"]),
    rows=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 24), st.integers(1, 12), st.integers(0, 10)),
                  min_size=1, max_size=12),
)
def test_prefix_sharing_under_memory_pressure_drains_and_returns_every_block(block_size, extra_blocks, mode, rows):
    mml = 32
    cfg = EngineConfig(block_size=block_size, num_gpu_blocks_override=-(-mml // block_size) + extra_blocks,
                       max_model_len=mml, preemption_mode=mode, swap_space=0.0001, max_num_batched_tokens=8,
                       max_num_seqs=8)
    requests = [req(i, 0.001 * i, prefix + tail, out, prefix_id=group, num_prefix_tokens=prefix)
                for i, (group, tail, out, prefix) in enumerate(rows)]
    sim = prepare(TINY, H100, cfg, ListWorkload(requests), flat_profile())
    result = sim.run()
    assert set(result.requests["status"]) <= {"finished", "rejected"}
    steps = result.steps
    assert (steps["kv_allocated"] <= result.memory.num_gpu_tokens).all()
    assert (steps["kv_live"] <= steps["kv_allocated"]).all() and (steps["kv_internal"] >= 0).all()
    alloc = sim.engine.policy.allocator
    assert alloc.num_used_blocks == 0 and alloc.num_free_blocks == alloc.num_gpu_blocks
