"""Continuous batching over a paged KV cache: vLLM (PagedAttention + iteration-level scheduling).

One token-budget loop per step, as in vLLM's scheduler: running requests first (one decode
token each, or their next prefill chunk), then, if nobody was preempted, swapped-out requests
and then waiting ones in arrival order while blocks, `max_num_seqs` and the budget allow.
When a running request cannot get a block, the newest running request is preempted
(recompute: drop its KV and prefill prompt + generated tokens again later; swap: copy its
blocks to the CPU pool over PCIe, and back before it runs again).

Simplifications: no prefix caching, no watermark, no priority scheduling; a swap that does
not fit the CPU pool falls back to recompute (vLLM V0 aborted the request instead).
"""

from __future__ import annotations

from simcore.block_pool import AllocStatus, PagedAllocator
from simcore.engine import Engine
from simcore.policies.base import MemorySnapshot, StepPlan
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
    ):
        self.engine = engine
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.swap = preemption_mode == "swap"

    # -- admission -------------------------------------------------------------------------
    def check(self, st: ReqState) -> str:
        eng, alloc = self.engine, self.allocator
        if st.num_prompt_tokens > eng.max_model_len:
            return f"prompt of {st.num_prompt_tokens} tokens exceeds max_model_len {eng.max_model_len}"
        if not self.enable_chunked_prefill and st.num_prompt_tokens > self.max_num_batched_tokens:
            return (
                f"prompt of {st.num_prompt_tokens} tokens exceeds max_num_batched_tokens "
                f"{self.max_num_batched_tokens} and chunked prefill is off"
            )
        if alloc.can_allocate(st.final_len) == AllocStatus.NEVER:
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
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(running) and budget > 0:
            st = running[i]
            num_new = min(st.num_tokens - st.num_computed_tokens, budget)
            scheduled = alloc.append_slots(st.request_id, num_new)
            while not scheduled:
                victim = running.pop()
                self._preempt(victim, plan)
                if victim is st:
                    break
                scheduled = alloc.append_slots(st.request_id, num_new)
            if not scheduled:
                break
            if num_new == 1 and st.num_generated:
                plan.add_decode(st, 1)
            else:
                plan.add_prefill(st, num_new)
            budget -= num_new
            i += 1
        if not plan.num_preempted:
            budget = self._swap_in(plan, budget, now)
            if not eng.swapped:
                self._admit_waiting(plan, budget, now)
        return plan if plan.scheduled else None

    def _swap_in(self, plan: StepPlan, budget: int, now: float) -> int:
        eng, alloc = self.engine, self.allocator
        while eng.swapped and budget > 0 and len(eng.running) < self.max_num_seqs:
            st = eng.swapped[0]
            if alloc.num_free_blocks < len(st.seq_ids) * (len(alloc.block_table(st.seq_id)) + 1):
                break
            plan.num_swap_blocks += alloc.swap_in(st.seq_ids)
            eng.swapped.popleft()
            st.status = RequestStatus.RUNNING
            eng.running.append(st)
            eng.live_tokens += st.num_computed_tokens
            num_new = min(st.num_tokens - st.num_computed_tokens, budget)
            ok = alloc.append_slots(st.request_id, num_new)
            assert ok, "swap-in reserved a block for the next token"
            if num_new == 1 and st.num_generated:
                plan.add_decode(st, 1)
            else:
                plan.add_prefill(st, num_new)
            budget -= num_new
        return budget

    def _admit_waiting(self, plan: StepPlan, budget: int, now: float) -> None:
        eng, alloc = self.engine, self.allocator
        waiting, running = eng.waiting, eng.running
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            st = waiting[0]
            num_new = st.num_tokens - st.num_computed_tokens
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget
            if not alloc.append_slots(st.request_id, num_new):
                break
            waiting.popleft()
            st.status = RequestStatus.RUNNING
            if st.first_scheduled_s < 0:
                st.first_scheduled_s = now
            running.append(st)
            plan.add_prefill(st, num_new)
            budget -= num_new

    def _preempt(self, st: ReqState, plan: StepPlan) -> None:
        eng, alloc = self.engine, self.allocator
        eng.live_tokens -= st.num_computed_tokens
        st.num_preemptions += 1
        plan.num_preempted += 1
        if self.swap and alloc.can_swap_out(st.seq_ids):
            plan.num_swap_blocks += alloc.swap_out(st.seq_ids)
            st.status = RequestStatus.SWAPPED
            eng.swapped.append(st)
        else:
            alloc.free(st.request_id)
            st.num_computed_tokens = 0
            st.status = RequestStatus.WAITING
            eng.waiting.appendleft(st)

    # -- commit ----------------------------------------------------------------------------
    def apply(self, plan: StepPlan, now: float) -> MemorySnapshot:
        eng, alloc = self.engine, self.allocator
        finished = eng.emit_tokens(plan, now)
        allocated = alloc.num_used_blocks * alloc.block_size
        mem = MemorySnapshot(allocated, eng.live_tokens, internal=allocated - eng.live_tokens)
        if finished:
            for st in finished:
                eng.live_tokens -= st.num_computed_tokens
                alloc.free(st.request_id)
                eng.finish(st, now)
            eng.running = [s for s in eng.running if s.status == RequestStatus.RUNNING]
        return mem
