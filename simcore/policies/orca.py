"""Continuous batching over contiguous reservations: Orca (Yu et al., OSDI 2022).

The scheduling loop is the vLLM one (`continuous.py`): every step, running requests first
(one decode token, or their next prefill chunk), then waiting requests in arrival order
under the token budget and `max_num_seqs`. What differs is memory: a request reserves one
contiguous extent when it is admitted, sized by `reservation`, and keeps it until its last
token. The reservation covers every token the request writes, so nothing is ever preempted;
instead a request waits until a free extent large enough exists, and free memory split into
smaller extents is external fragmentation.

    reservation   max:    max_model_len              (Orca (Max) of the vLLM paper)
                  pow2:   prompt + next_pow2(output) (Orca (Pow2), knows an upper bound)
                  oracle: prompt + output            (Orca (Oracle), knows the output)

Refinements: Orca itself reserves `max_tokens` per request and batches whole prompts
(selective batching, no chunked prefill); the three sizes are the vLLM paper's variants
(Kwon et al., SOSP 2023, section 6.2), and chunked prefill follows `enable_chunked_prefill`
so the loop matches vLLM's (turn it off to be closer to Orca).

Simplifications: no prefix sharing, no preemption, first-fit placement, decode attention
priced with the same kernel table as paged decode.
"""

from __future__ import annotations

from kvsim.simcore.contiguous import ContiguousAllocator
from kvsim.simcore.policies.base import Queues
from kvsim.simcore.policies.reserved import (
    ReservationLedger,
    reservation_check,
    reservation_size,
)
from kvsim.simcore.state import ReqState
from kvsim.simcore.step import MemorySnapshot, StepPlan


class OrcaPolicy:
    name = "orca"

    def __init__(
        self, allocator: ContiguousAllocator, reservation: str, max_model_len: int,
        max_num_seqs: int, max_num_batched_tokens: int, enable_chunked_prefill: bool,
    ):
        self.allocator = allocator
        self.ledger = ReservationLedger(allocator)
        self.reservation = reservation
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill

    def _size(self, st: ReqState) -> int:
        return reservation_size(self.reservation, st, self.max_model_len)

    def check(self, st: ReqState) -> str:
        if not self.enable_chunked_prefill and st.num_prompt_tokens > self.max_num_batched_tokens:
            return (
                f"prompt of {st.num_prompt_tokens} tokens exceeds max_num_batched_tokens "
                f"{self.max_num_batched_tokens} and chunked prefill is off"
            )
        return reservation_check(st, self.allocator, self._size(st))

    def idle_timeout(self, queues: Queues, now: float) -> float | None:
        return None

    def counters(self) -> dict[str, int]:
        return {}

    # -- scheduling ------------------------------------------------------------------------
    def schedule(self, queues: Queues, now: float) -> StepPlan | None:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        for st in queues.running:
            if budget <= 0:
                break
            num_new = min(st.num_tokens - st.num_computed_tokens, budget)
            if num_new == 1 and st.num_generated:
                plan.add_decode(st, 1)
            else:
                plan.add_prefill(st, num_new)
            budget -= num_new
        self._admit_waiting(queues, plan, budget)
        return plan if plan.num_scheduled else None

    def _admit_waiting(self, queues: Queues, plan: StepPlan, budget: int) -> None:
        num_running = len(queues.running)
        for st in queues.waiting:
            if budget <= 0 or num_running >= self.max_num_seqs:
                break
            num_new = st.num_tokens
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget
            if not self.ledger.reserve(st, self._size(st)):
                break
            plan.admit(st)
            num_running += 1
            plan.add_prefill(st, num_new, 0)
            budget -= num_new

    # -- commit ----------------------------------------------------------------------------
    def end_step(self, plan: StepPlan, finished: list[ReqState], queues: Queues) -> MemorySnapshot:
        ledger = self.ledger
        ledger.advance(plan)
        mem = ledger.snapshot(self._size(queues.waiting[0]) if queues.waiting else 0)
        for st in finished:
            ledger.release(st)
        return mem
