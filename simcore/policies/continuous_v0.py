"""Continuous batching over a paged KV cache without chunked prefill: vLLM V0's default
scheduler (`vllm/core/scheduler.py`, `Scheduler._schedule_default`, with `_schedule_prefills`,
`_schedule_running` and `_schedule_swapped`; block admission from `vllm/core/block_manager.py`,
`can_allocate` with `watermark=0.01`).

Prefills and decodes never share a step, and prefills come first:

    swapped queue empty?  admit waiting prompts, FIFO, each whole (prompt + tokens generated
        before a recompute preemption) while  tokens <= max_num_batched_tokens - taken,
        sequences <= max_num_seqs (running ones counted), and
        free blocks - blocks needed >= watermark (1% of the cache); the first that does not
        fit stops admission (LATER).
    any prompt admitted?  the step is those prefills only; running requests wait a step.
    otherwise             a decode step of every running request (preempting from the tail of
        `running` when one cannot get a block, itself last), then, if nobody was preempted,
        swapped-out requests come back in FIFO order while they fit.

So while anything is swapped out no prompt is admitted, and a burst of arrivals stalls every
running decode for one prefill step each time prompts are admitted (the ITL spikes chunked
prefill was introduced to remove).

Simplifications: as in `continuous.py` (no priority scheduling, no `delay_factor`, a swap that
does not fit the CPU pool falls back to recompute); a request that could never pass the
watermark is rejected on arrival (vLLM V0 marks it FINISHED_IGNORED when it reaches the head).
"""

from __future__ import annotations

from kvsim.simcore.policies.base import Queues
from kvsim.simcore.policies.continuous import ContinuousPagedPolicy
from kvsim.simcore.sampling import group_width
from kvsim.simcore.state import ReqState
from kvsim.simcore.step import StepPlan

WATERMARK = 0.01  # vLLM V0 BlockSpaceManager(watermark=0.01): share of blocks admission keeps free


class VllmV0PagedPolicy(ContinuousPagedPolicy):
    name = "continuous-v0"  # --policy continuous --allocator paged --no-enable-chunked-prefill

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        assert not self.enable_chunked_prefill, "vLLM V0's default scheduler never chunks a prompt"
        self.watermark_blocks = int(WATERMARK * self.allocator.num_gpu_blocks)

    def check(self, st: ReqState) -> str:
        reason = super().check(st)
        if reason:
            return reason
        usable = self.allocator.num_gpu_blocks - self.watermark_blocks
        need = self.allocator.blocks_for(st.final_len)
        if group_width(st) == 1 and need > usable:
            return (
                f"needs {need} KV blocks but admission keeps a watermark of {self.watermark_blocks} "
                f"of the cache's {self.allocator.num_gpu_blocks} blocks free"
            )
        return ""

    def schedule(self, queues: Queues, now: float) -> StepPlan | None:
        plan = self._new_plan()
        if not queues.swapped and queues.waiting:
            self._schedule_prefills(queues, plan, self._num_seqs(queues.running))
            if plan.num_scheduled:
                return plan
        running, budget = self._plan_running(plan, queues, self.max_num_batched_tokens)
        if queues.swapped and not plan.num_preempted:
            self._swap_in(queues, plan, list(queues.running) if running is None else running, budget)
        return plan if plan.num_scheduled or plan.num_preempted else None

    def _schedule_prefills(self, queues: Queues, plan: StepPlan, num_seqs: int) -> None:
        """Whole waiting prompts in order while the budget, `max_num_seqs` (`num_seqs` running)
        and the blocks above the watermark allow."""
        alloc = self.allocator
        budget = self.max_num_batched_tokens
        for st in queues.waiting:
            num_tokens = st.num_tokens
            # the budget and sequence checks come first here (vLLM checks blocks first): each
            # refusal stops admission and changes nothing, so the order decides nothing
            if num_tokens > budget or num_seqs + group_width(st) > self.max_num_seqs:
                break
            hashes = self._prefix_hashes(st)
            hit_blocks = 0
            if hashes:
                hit_blocks = min(alloc.num_cached_prefix_blocks(hashes), (num_tokens - 1) // alloc.block_size)
                need = alloc.num_blocks_to_allocate(num_tokens - hit_blocks * alloc.block_size, hashes[:hit_blocks])
            else:
                need = alloc.blocks_for(num_tokens)
            if alloc.num_free_blocks - need < self.watermark_blocks:
                break  # AllocStatus.LATER
            num_cached = hit_blocks * alloc.block_size
            num_new = num_tokens - num_cached
            ok = alloc.allocate_slots(st.request_id, num_new, hashes[:hit_blocks])
            assert ok, "the watermark check left room"
            num_seqs += self._take_admitted(plan, st, num_new, num_cached, bool(hashes))
            budget -= num_tokens  # V0 counts the whole prompt against the budget
