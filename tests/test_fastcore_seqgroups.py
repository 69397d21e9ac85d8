"""Parallel sampling (n > 1) in the compiled core (simcore/csrc/seqgroup.c) against the Python
engine's reference mode (--exact-steps): random small configurations where requests fork into
2-4 sequences sharing their prompt blocks (copy-on-write of a partly filled last block), V0 and
V1, tiny caches that force recompute and swap preemption of whole groups, one or two replicas.
Request tables, ITLs, summaries, step totals and rows must match as in
tests/test_fastcore_equivalence.py. Beam search stays in Python (refused here)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsim.simcore import ccore
from kvsim.simcore.simulate import prepare, simulate
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads.arrivals import open_loop_process
from tests.helpers import random_requests
from tests.test_fastcore_equivalence import H100, TINY, ArraysWorkload, _compare, _profile

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


class GroupsWorkload(ArraysWorkload):
    """ArraysWorkload with a width (n, or beam_width) per request."""

    def __init__(self, arrival_s, prompt, output, n, beam_width=None):
        super().__init__(arrival_s, prompt, output)
        self.chunk.n = np.asarray(n, dtype=np.int64)
        if beam_width is not None:
            self.chunk.beam_width = np.asarray(beam_width, dtype=np.int64)

    def process(self, env, sink, seed):
        from kvsim.simcore.request import Request

        c = self.chunk
        requests = [Request(i, a, p, o, m, n=w, beam_width=b) for i, (a, p, o, m, w, b) in enumerate(zip(
            c.arrival_s.tolist(), c.num_prompt_tokens.tolist(), c.num_output_tokens.tolist(),
            c.max_tokens.tolist(), c.n.tolist(), c.beam_width.tolist(), strict=True))]
        yield from open_loop_process(env, sink, [(requests, c.arrival_s)])
        return {"generated": self.num_requests}


def _random_case(rng: np.random.Generator) -> tuple[EngineConfig, GroupsWorkload]:
    block_size = int(rng.choice([1, 2, 4, 8, 16]))
    mml = int(rng.choice([32, 64, 128]))
    chunked = bool(rng.random() < 0.6)
    max_num_seqs = int(rng.integers(2, 16))
    budget = int(rng.choice([mml, 8, 16, 24, 48])) if chunked else int(rng.choice([mml, 2 * mml]))
    min_blocks = -(-mml // block_size)
    if rng.random() < 0.6:  # a small cache most of the time: groups get preempted (and refused)
        blocks = min_blocks + int(rng.integers(0, 5 * min_blocks + 4))
    else:
        blocks = min_blocks * 40
    config = EngineConfig(
        block_size=block_size, max_model_len=mml, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs), enable_chunked_prefill=chunked,
        enable_prefix_caching=bool(rng.random() < 0.5),  # on, as V1's default: no shared prefix, nothing cached
        preemption_mode=str(rng.choice(["recompute", "swap"])), swap_space=float(rng.choice([0.0001, 0.001, 1.0])),
        num_gpu_blocks_override=blocks,
    )
    if rng.random() < 0.3:
        config = dataclasses.replace(config, data_parallel_size=2,
                                     router=str(rng.choice(["round-robin", "least-loaded"])))
    arrivals, prompt, output = random_requests(rng, mml, max_requests=30)
    num = len(arrivals)
    n = np.where(rng.random(num) < 0.7, rng.integers(2, 5, size=num), 1)
    return config, GroupsWorkload(arrivals, prompt, output, n)


@pytest.mark.parametrize("block", range(4))
def test_parallel_sampling_matches_the_python_reference(block):
    """40 random configurations per block, with groups forked, preempted, swapped and refused."""
    preempted = swapped = rejected = 0
    for case in range(block * 40, (block + 1) * 40):
        config, workload = _random_case(np.random.default_rng(7000 + case))
        core, _ = _compare(config, workload, seed=case, context=f"n case {case}: {config}")
        assert (core.requests["n"].to_numpy() == workload.chunk.n).all() or core.summary["rejected"]
        preempted += core.totals.num_preempted
        swapped += int(core.steps["num_swap_blocks"].sum() > 0)
        rejected += core.summary["rejected"]
    assert preempted and swapped and rejected, "the cases should preempt, swap and refuse"


def test_beam_search_stays_in_python():
    """Beam search (its parents drawn from numpy's Generator) is refused with its reason; n > 1
    with shared prefixes and prefix caching too (csrc/seqgroup.c keeps block counts, not
    identities), not with prefix caching alone (nothing is cached then)."""
    from kvsim.simcore.errors import ConfigError
    from kvsim.workloads import load_workload

    config, _ = _random_case(np.random.default_rng(1))
    config = dataclasses.replace(config, data_parallel_size=1)
    beams = load_workload("sharegpt", {"rate": 50, "input_len": 8, "output_len": 8, "num_requests": 10, "beam_width": 2})
    sim = prepare(TINY, H100, config, beams, _profile())
    assert sim.choose_core()[0] == "python" and "beam search" in sim.choose_core()[1]
    with pytest.raises(ConfigError, match="beam search"):
        simulate(TINY, H100, config, beams, _profile(), engine_core="c")
    sampled = load_workload("sharegpt", {"rate": 50, "input_len": 8, "output_len": 8, "num_requests": 10, "n": 2})
    assert prepare(TINY, H100, config, sampled, _profile()).choose_core()[0] == "c"
    cached = dataclasses.replace(config, enable_prefix_caching=True)
    assert prepare(TINY, H100, cached, sampled, _profile()).choose_core()[0] == "c"
    prefixed = load_workload("shared-prefix", {"rate": 50, "num_requests": 10, "n": 2})
    core, reason = prepare(TINY, H100, cached, prefixed, _profile()).choose_core()
    assert core == "python" and "shared prefixes with prefix caching" in reason
