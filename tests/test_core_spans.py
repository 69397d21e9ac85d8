"""The C core's decode spans (engine.c span_run: runs of pure-decode steps ended in closed
form) against the Python engine's one event per step, where a span must stop: a request
finishing, the free blocks running out mid-run (recompute and swap preemption), arrivals and
other replicas' steps landing inside a run, block sizes whose boundaries fall on different
steps for each request. Request tables, ITLs, step totals and rows as in
tests/test_fastcore_equivalence.py."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.simcore import ccore
from kvsim.simcore.specs import EngineConfig
from tests.test_fastcore_equivalence import ArraysWorkload, _compare

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_long_decode_runs_on_a_tight_cache(chunked, mode, block_size):
    """Long outputs on a cache that runs out mid-run: spans stop at the step whose appends do
    not fit (the scheduler preempts there), at each finish and at each arrival."""
    rng = np.random.default_rng(block_size * 10 + chunked * 2 + (mode == "swap"))
    num = 24
    arrivals = np.cumsum(rng.exponential(0.05, size=num)) - 0.05
    arrivals[0] = 0.0
    prompt = rng.integers(1, 40, size=num)
    output = rng.integers(20, 200, size=num)
    min_blocks = -(-256 // block_size)
    config = EngineConfig(
        block_size=block_size, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256,
        enable_chunked_prefill=chunked, enable_prefix_caching=False, preemption_mode=mode,
        swap_space=0.001, num_gpu_blocks_override=min_blocks + min_blocks // 2,
    )
    core, _ = _compare(config, ArraysWorkload(arrivals, prompt, output), seed=1,
                       context=f"{block_size} {mode} chunked={chunked}")
    assert core.totals.num_preempted > 0, "the cache should run out mid-run"
    assert (core.steps["num_steps"] > 4).any(), "and decode runs should be long enough to span"


def test_spans_between_replicas_steps():
    """Two replicas: one's span stops where the other's step ends first (one event heap)."""
    rng = np.random.default_rng(7)
    num = 40
    arrivals = np.sort(rng.uniform(0, 1.0, size=num))
    config = EngineConfig(block_size=8, max_model_len=256, max_num_seqs=6, max_num_batched_tokens=256,
                          enable_chunked_prefill=False, enable_prefix_caching=False, data_parallel_size=2)
    core, _ = _compare(config, ArraysWorkload(arrivals, rng.integers(1, 64, size=num), rng.integers(30, 150, size=num)),
                       seed=2, context="dp 2")
    assert (core.steps["num_steps"] > 4).any()
