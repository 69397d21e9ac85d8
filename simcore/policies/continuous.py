"""Continuous batching over a paged KV cache: vLLM (PagedAttention + iteration-level scheduling).

One token-budget loop per step, as in vLLM's scheduler: running requests first (one decode
token each, or their next prefill chunk), then, if nobody was preempted, swapped-out requests
and then waiting ones in arrival order while blocks, `max_num_seqs` and the budget allow.
When a running request cannot get a block, the newest running request is preempted
(recompute: drop its KV and prefill prompt + generated tokens again later; swap: copy its
blocks to the CPU pool over PCIe, and back before it runs again).

Requests with `n > 1` or beam search fork after their prefill and share blocks
(simcore.sampling); `max_num_seqs` and the token budget count their sequences.

With prefix caching on, a waiting request first adopts the cached full blocks of its shared
prefix (simcore.block_pool) and computes only the rest of its prompt.

Simplifications: no watermark, no priority scheduling; a swap that does
not fit the CPU pool falls back to recompute (vLLM V0 aborted the request instead); a
multi-sequence request preempted by recompute re-prefills one sequence and forks again.
"""

from __future__ import annotations

import numpy as np

from simcore.block_pool import AllocStatus, PagedAllocator
from simcore.engine import Engine
from simcore.policies.base import MemorySnapshot, StepPlan
from simcore.sampling import SequenceGroups, group_width
from simcore.state import ReqState, RequestStatus


class ContinuousPagedPolicy:
    name = "continuous"

    def __init__(
        self,
        engine: Engine,
        allocator: PagedAllocator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        preemption_mode: str,
        rng: np.random.Generator | None = None,
        enable_prefix_caching: bool = False,
    ):
        self.engine = engine
        self.enable_prefix_caching = enable_prefix_caching
        self._filling_prefix: list[ReqState] = []  # planned requests writing shared-prefix blocks
        self.prefix_query_tokens = 0  # prompt tokens of admitted requests that share a prefix
        self.prefix_hit_tokens = 0  # of those, tokens adopted from the prefix cache
        self.groups = SequenceGroups(allocator, rng or np.random.default_rng(0))
        self._scheduled_groups: list[tuple[ReqState, int]] = []  # multi-seq requests planned
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.swap = preemption_mode == "swap"

    # -- admission -------------------------------------------------------------------------
    def check(self, st: ReqState) -> str:
        alloc = self.allocator
        if not self.enable_chunked_prefill and st.num_prompt_tokens > self.max_num_batched_tokens:
            return (
                f"prompt of {st.num_prompt_tokens} tokens exceeds max_num_batched_tokens "
                f"{self.max_num_batched_tokens} and chunked prefill is off"
            )
        width = group_width(st)
        if width > min(self.max_num_seqs, self.max_num_batched_tokens):
            return (
                f"runs {width} sequences but a step takes at most max_num_seqs={self.max_num_seqs} "
                f"sequences and max_num_batched_tokens={self.max_num_batched_tokens} tokens"
            )
        if width > 1:
            need = self.groups.num_blocks_for(st)
            if need > alloc.num_gpu_blocks:
                return f"needs {need} KV blocks for {group_width(st)} sequences but the cache has {alloc.num_gpu_blocks}"
        elif alloc.can_allocate(st.final_len) == AllocStatus.NEVER:
            return (
                f"needs {alloc.blocks_for(st.final_len)} KV blocks but the cache has "
                f"{alloc.num_gpu_blocks}"
            )
        return ""

    def idle_timeout(self, now: float) -> float | None:
        return None

    # -- scheduling ------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        eng, alloc = self.engine, self.allocator
        running = eng.running
        plan = StepPlan()
        self._scheduled_groups = []
        self._filling_prefix = []
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(running) and budget > 0:
            st = running[i]
            k = len(st.seq_ids)
            if k == 1:
                num_new = min(st.num_tokens - st.num_computed_tokens, budget)
                scheduled = alloc.append_slots(st.seq_ids[0], num_new)
            else:
                num_new = 1  # a forked request only decodes
                if k > budget:
                    break
                scheduled = self._grow_group(st)
            while not scheduled:
                victim = running.pop()
                self._preempt(victim, plan)
                if victim is st:
                    break
                scheduled = alloc.append_slots(st.seq_ids[0], num_new) if k == 1 else self._grow_group(st)
            if not scheduled:
                break
            self._add(plan, st, num_new)
            budget -= num_new * k
            i += 1
        if not plan.num_preempted:
            budget = self._swap_in(plan, budget, now)
            if not eng.swapped:
                self._admit_waiting(plan, budget, now)
        return plan if plan.scheduled else None

    def _grow_group(self, st: ReqState) -> bool:
        """One decode slot for every sequence of a forked request, all or nothing."""
        alloc = self.allocator
        need = sum(alloc.num_blocks_needed(s, 1) for s in st.seq_ids)
        if need > alloc.num_free_blocks:
            return False
        for seq_id in st.seq_ids:
            alloc.append_slots(seq_id, 1)
        return True

    def _add(self, plan: StepPlan, st: ReqState, num_new: int) -> None:
        if num_new == 1 and st.num_generated:
            plan.add_decode(st, len(st.seq_ids))
        else:
            plan.add_prefill(st, num_new)
            if self.enable_prefix_caching and st.num_computed_tokens < st.request.num_prefix_tokens:
                self._filling_prefix.append(st)
        if group_width(st) > 1:
            self._scheduled_groups.append((st, num_new))

    def _prefix_hashes(self, st: ReqState) -> list[tuple[int, int]]:
        """Content keys of the request's full blocks inside its shared prefix (none if caching
        is off or the request shares nothing): block i of prefix p is (p, i)."""
        req = st.request
        if not self.enable_prefix_caching or req.prefix_id is None or len(st.seq_ids) > 1:
            return []
        return [(req.prefix_id, i) for i in range(req.num_prefix_tokens // self.allocator.block_size)]

    def _num_seqs(self) -> int:
        extra = sum(len(st.seq_ids) - 1 for st in self.groups.active.values())
        return len(self.engine.running) + extra

    def _swap_in(self, plan: StepPlan, budget: int, now: float) -> int:
        eng, alloc = self.engine, self.allocator
        while eng.swapped and budget > 0 and self._num_seqs() < self.max_num_seqs:
            st = eng.swapped[0]
            k = len(st.seq_ids)
            if k == 1:  # exactly the blocks it will hold after this step's tokens
                num_new = min(st.num_tokens - st.num_computed_tokens, budget)
                need = alloc.blocks_for(st.num_computed_tokens + num_new)
            else:  # its blocks, plus a new or copied-on-write block per sequence
                need = len(alloc.distinct_blocks(st.seq_ids)) + 2 * k
                if not eng.running:
                    need = min(need, alloc.num_gpu_blocks)
            if alloc.num_free_blocks < need or k > budget:
                break
            plan.num_swap_blocks += alloc.swap_in(st.seq_ids)
            eng.swapped.popleft()
            st.status = RequestStatus.RUNNING
            eng.running.append(st)
            if k == 1:
                eng.live_tokens += st.num_computed_tokens
                num_new = min(st.num_tokens - st.num_computed_tokens, budget)
                ok = alloc.append_slots(st.seq_ids[0], num_new)
            else:
                num_new = 1
                ok = self._grow_group(st)
            assert ok, "swap-in checked room for the next token"
            self._add(plan, st, num_new)
            budget -= num_new * k
        return budget

    def _admit_waiting(self, plan: StepPlan, budget: int, now: float) -> None:
        eng, alloc = self.engine, self.allocator
        waiting, running = eng.waiting, eng.running
        num_seqs = self._num_seqs()
        while waiting and budget > 0 and num_seqs + group_width(waiting[0]) <= self.max_num_seqs:
            st = waiting[0]
            hashes = self._prefix_hashes(st)
            hit_blocks = 0
            if hashes:  # adopt the cached prefix; at least one prompt token is still computed
                hit_blocks = min(alloc.num_cached_prefix_blocks(hashes), (st.num_tokens - 1) // alloc.block_size)
                if hit_blocks:
                    alloc.adopt_cached(st.seq_ids[0], hashes[:hit_blocks])
                    st.num_computed_tokens = hit_blocks * alloc.block_size
                    eng.live_tokens += st.num_computed_tokens
            num_new = st.num_tokens - st.num_computed_tokens
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    num_new = 0
                num_new = min(num_new, budget)
            if not num_new or not alloc.append_slots(st.seq_ids[0], num_new):
                if hit_blocks:  # undo the adoption: the blocks go back to the cache
                    eng.live_tokens -= st.num_computed_tokens
                    alloc.free(st.seq_ids[0])
                    st.num_computed_tokens = 0
                break
            self.prefix_query_tokens += st.num_tokens if hashes else 0
            self.prefix_hit_tokens += hit_blocks * alloc.block_size
            waiting.popleft()
            st.status = RequestStatus.RUNNING
            if st.first_scheduled_s < 0:
                st.first_scheduled_s = now
            running.append(st)
            num_seqs += group_width(st)
            self._add(plan, st, num_new)
            budget -= num_new

    def _preempt(self, st: ReqState, plan: StepPlan) -> None:
        eng, alloc = self.engine, self.allocator
        if len(st.seq_ids) == 1:
            eng.live_tokens -= st.num_computed_tokens
        st.num_preemptions += 1
        plan.num_preempted += 1
        if self.swap and alloc.can_swap_out(st.seq_ids):
            plan.num_swap_blocks += alloc.swap_out(st.seq_ids)
            st.status = RequestStatus.SWAPPED
            eng.swapped.append(st)
        else:
            self._release(st)
            st.num_computed_tokens = 0
            st.status = RequestStatus.WAITING
            eng.waiting.appendleft(st)

    # -- commit ----------------------------------------------------------------------------
    def _release(self, st: ReqState) -> None:
        if len(st.seq_ids) == 1:
            self.allocator.free(st.seq_ids[0])
        else:
            self.groups.release(st)

    def apply(self, plan: StepPlan, now: float) -> MemorySnapshot:
        eng, alloc, groups = self.engine, self.allocator, self.groups
        emitting = [
            st for st, num_new in self._scheduled_groups
            if st.num_computed_tokens + num_new == st.num_tokens
        ]
        finished = eng.emit_tokens(plan, now)
        for st in emitting:
            if st.num_generated >= st.num_output_target:
                continue
            if len(st.seq_ids) == 1:
                eng.live_tokens -= st.num_computed_tokens  # now counted by the group
                groups.fork(st)
            elif st.request.beam_width > 1:
                groups.reselect_beams(st)
        for st in self._filling_prefix:
            if st.status == RequestStatus.RUNNING and len(st.seq_ids) == 1:
                alloc.cache_full_blocks(st.seq_ids[0], self._prefix_hashes(st))
        bs = alloc.block_size
        allocated = alloc.num_used_blocks * bs
        # Only last blocks can be partly filled, and those are never shared across requests,
        # so live = allocated - unfilled slots of last blocks (right even when prefixes are shared).
        internal, saved = groups.internal_and_saved() if groups.active else (0, 0)
        internal += sum([(-st.num_computed_tokens) % bs for st in eng.running if len(st.seq_ids) == 1])
        mem = MemorySnapshot(allocated, allocated - internal, internal=internal, unshared=allocated + saved)
        if finished:
            eng.retire_finished(finished, now, self._release)
        return mem
