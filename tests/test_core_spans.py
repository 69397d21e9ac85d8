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


class PrefixArraysWorkload(ArraysWorkload):
    """ArraysWorkload with declared shared prefixes (prefix_id >= 0: its first
    num_prefix_tokens are the same for every request of that id), for both cores."""

    def __init__(self, arrival_s, prompt, output, prefix_id, num_prefix_tokens):
        super().__init__(arrival_s, prompt, output)
        self.chunk.prefix_id = np.asarray(prefix_id)
        self.chunk.num_prefix_tokens = np.asarray(num_prefix_tokens, dtype=np.int64)

    def process(self, env, sink, seed):
        from kvsim.simcore.request import Request
        from kvsim.workloads.arrivals import open_loop_process

        c = self.chunk
        requests = [Request(i, float(c.arrival_s[i]), int(c.num_prompt_tokens[i]), int(c.num_output_tokens[i]),
                            int(c.max_tokens[i]), prefix_id=int(c.prefix_id[i]) if c.prefix_id[i] >= 0 else None,
                            num_prefix_tokens=int(c.num_prefix_tokens[i]))
                    for i in range(self.num_requests)]
        yield from open_loop_process(env, sink, [(requests, c.arrival_s)])
        return {"generated": self.num_requests}


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_spans_with_prefix_caching_and_nothing_cached(chunked, mode, block_size):
    """Prefix caching on (vLLM V1's default) with no shared prefix: no block is ever cached, so
    allocation is that of no caching and spans run (engine.c span_setup); the tight cache makes
    them stop for preemption as in test_long_decode_runs_on_a_tight_cache."""
    rng = np.random.default_rng(block_size * 10 + chunked * 2 + (mode == "swap") + 100)
    num = 24
    arrivals = np.cumsum(rng.exponential(0.05, size=num)) - 0.05
    arrivals[0] = 0.0
    min_blocks = -(-256 // block_size)
    config = EngineConfig(
        block_size=block_size, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256,
        enable_chunked_prefill=chunked, enable_prefix_caching=True, preemption_mode=mode,
        swap_space=0.001, num_gpu_blocks_override=min_blocks + min_blocks // 2,
    )
    work = ArraysWorkload(arrivals, rng.integers(1, 40, size=num), rng.integers(20, 200, size=num))
    core, _ = _compare(config, work, seed=1, context=f"pc {block_size} {mode} chunked={chunked}")
    assert core.totals.num_preempted > 0, "the cache should run out mid-run"
    assert (core.steps["num_steps"] > 4).any()


@pytest.mark.parametrize("block_size", [4, 16])
def test_shared_prefixes_keep_spans_aside(block_size):
    """Shared prefixes, some requests without one: once a block is cached (or a running request
    has prefix blocks) spans stand aside, and the core still matches step by step."""
    rng = np.random.default_rng(block_size + 200)
    num = 30
    arrivals = np.sort(rng.uniform(0, 1.5, size=num))
    prompt = rng.integers(40, 90, size=num)
    prefix_id = np.where(rng.random(num) < 0.5, rng.integers(0, 3, size=num), -1)
    config = EngineConfig(block_size=block_size, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256,
                          enable_chunked_prefill=True, enable_prefix_caching=True,
                          num_gpu_blocks_override=2 * (-(-256 // block_size)))
    work = PrefixArraysWorkload(arrivals, prompt, rng.integers(20, 150, size=num), prefix_id,
                            np.where(prefix_id >= 0, 32, 0))
    core, _ = _compare(config, work, seed=3, context=f"prefixes {block_size}")
    assert (core.steps["num_steps"] > 4).any()


def test_prefix_caching_without_prefixes_is_no_caching():
    """What the spans with prefix caching rely on: with no shared prefix nothing is ever cached,
    so a run with caching on is the run with it off, request for request and step for step, in
    the C core (spans in both) and in the Python engine."""
    from kvsim.simcore.simulate import simulate
    from tests.test_fastcore_equivalence import H100, TINY, _profile

    rng = np.random.default_rng(5)
    num = 40
    work = ArraysWorkload(np.sort(rng.uniform(0, 1.0, size=num)), rng.integers(1, 64, size=num),
                          rng.integers(30, 300, size=num))
    for core in ("c", "python"):
        runs = {}
        for pc in (False, True):
            config = EngineConfig(block_size=8, max_model_len=512, max_num_seqs=16, max_num_batched_tokens=512,
                                  enable_chunked_prefill=True, enable_prefix_caching=pc,
                                  num_gpu_blocks_override=160)
            runs[pc] = simulate(TINY, H100, config, work, _profile(), seed=1, engine_core=core)
        assert runs[True].requests.equals(runs[False].requests), core
        assert runs[True].steps.equals(runs[False].steps), core
        assert runs[True].totals.num_preempted > 0, "a tight cache: spans stop for preemption"
