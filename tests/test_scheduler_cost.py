"""The continuous policies' shortcuts for per-step work give what the long way gives.

`ContinuousPagedPolicy.end_step` reports the unfilled slots of last blocks as
`allocated - computed tokens of the running requests` when no block is shared (no forked
request, nothing in the prefix cache), instead of summing `(-computed) % block_size` per request.
That holds only if the running requests hold every used GPU block, each exactly
`blocks_for(its computed tokens)`; checked here after every step of random small runs (both
engine modes, preemption by recompute and swap, chunked prefill, prefix caching, n > 1).
"""

from __future__ import annotations

import numpy as np

from simcore.simulate import prepare
from tests.helpers import ListWorkload
from tests.test_fastpath_equivalence import H100, TINY, _profile, _random_case


def _check_case(case: int, exact_steps: bool) -> tuple[int, int]:
    """Run one random case with every `end_step` checked; returns (steps checked, of which
    took the no-sharing shortcut)."""
    config, requests = _random_case(np.random.default_rng(case))
    if config.policy != "continuous" or config.allocator == "contiguous":
        return 0, 0
    sim = prepare(TINY, H100, config, ListWorkload(requests), _profile(), seed=case, exact_steps=exact_steps)
    checked = shortcut = 0
    for engine in sim.engines:
        life, policy = engine.lifecycle, engine.policy
        end_step = policy.end_step

        def checking(plan, finished, queues, end_step=end_step, life=life, policy=policy):
            nonlocal checked, shortcut
            alloc, groups = policy.allocator, policy.groups
            forked_before = bool(groups.active)
            mem = end_step(plan, finished, queues)
            if forked_before or groups.active:  # end_step forks and releases groups
                return mem
            no_sharing = not alloc.cached  # end_step may cache blocks; only evictions uncache them
            bs = alloc.block_size
            computed = [st.num_computed_tokens for st in life.running]
            assert mem.internal == sum((-c) % bs for c in computed), (case, exact_steps)
            assert mem.live == mem.allocated - mem.internal
            if no_sharing:  # the shortcut's premise: running requests hold all used blocks, no more
                assert mem.allocated == bs * sum(alloc.blocks_for(c) for c in computed), (case, exact_steps)
                shortcut += 1
            checked += 1
            return mem

        policy.end_step = checking
    sim.run()
    return checked, shortcut


def test_end_step_unfilled_slots_shortcut_equals_the_per_request_sum():
    checked = shortcut = 0
    for case in range(80):
        for exact_steps in (False, True):
            c, s = _check_case(case, exact_steps)
            checked += c
            shortcut += s
    assert shortcut > 500 and checked > shortcut, (checked, shortcut)
