"""The continuous policies' shortcuts for per-step work give what the long way gives.

`ContinuousPagedPolicy.end_step` reports the unfilled slots of last blocks as
`allocated - the allocator's written GPU slots` when no block is shared (no forked request,
nothing in the prefix cache), instead of summing `(-computed) % block_size` per request.
That holds only if the running requests hold every used GPU block, each exactly
`blocks_for(its computed tokens)`; and `schedule`'s all-decode step takes its context tokens
from the same written-slot count, which holds only if the GPU's sequences are exactly the running
requests' (one each). Checked here before and after every step of random small runs (both
engine modes, preemption by recompute and swap, chunked prefill, prefix caching, n > 1).
"""

from __future__ import annotations

import numpy as np

from kvsim.simcore.simulate import prepare
from tests.helpers import ListWorkload
from tests.test_fastpath_equivalence import H100, TINY, _profile, _random_case


def _check_case(case: int, exact_steps: bool) -> tuple[int, int, int]:
    """Run one random case with every `schedule` and `end_step` checked; returns (steps
    checked, of which took the no-sharing shortcut, decode-only plans checked)."""
    config, requests = _random_case(np.random.default_rng(case))
    if config.policy != "continuous" or config.allocator == "contiguous":
        return 0, 0, 0
    sim = prepare(TINY, H100, config, ListWorkload(requests), _profile(), seed=case, exact_steps=exact_steps)
    checked = shortcut = decoded = 0
    for engine in sim.engines:
        life, policy = engine.lifecycle, engine.policy
        end_step, schedule = policy.end_step, policy.schedule

        def scheduling(queues, now, schedule=schedule, life=life, policy=policy):
            nonlocal decoded
            if not policy.groups.active:  # every running request has one sequence, on the GPU
                computed = sum(st.num_computed_tokens for st in life.running)
                assert policy.allocator.num_gpu_tokens == computed, (case, exact_steps)
            plan = schedule(queues, now)
            if plan is not None and plan.num_scheduled == plan.num_decode_seqs == plan.num_tokens:
                # a decode-only step: each sequence attends to its computed tokens + 1
                everyone = [*life.running, *life.swapped, *life.waiting]
                seqs = [(st, len(policy.groups.seq_ids(st))) for st in everyone]
                scheduled = {id(st) for st, _ in plan.scheduled}
                expect = sum(k * (st.num_computed_tokens + 1) for st, k in seqs if id(st) in scheduled)
                assert plan.decode_context_tokens == expect, (case, exact_steps)
                decoded += 1
            return plan

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
        policy.schedule = scheduling
    sim.run()
    return checked, shortcut, decoded


def test_scheduler_shortcuts_equal_the_per_request_sums():
    checked = shortcut = decoded = 0
    for case in range(80):
        for exact_steps in (False, True):
            c, s, d = _check_case(case, exact_steps)
            checked += c
            shortcut += s
            decoded += d
    assert shortcut > 500 and checked > shortcut and decoded > 500, (checked, shortcut, decoded)
