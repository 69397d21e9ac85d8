"""Dynamic batching: early Hugging Face TGI (router-side continuous batching, reserved KV).

Requests join the running batch at iteration level, but not in the same step as its decodes:
TGI's router prefills the new requests as a batch of their own while the running batch waits,
then concatenates the two and decodes. A request is admitted only while its reservation,
`prompt + max_tokens` tokens, fits the KV budget; it leaves (and frees its reservation) at its
last token. Otherwise every step decodes every running request.

    step:   prefill new (decodes paused) | decode all | decode all | ... | prefill new | ...

Refinements of DESIGN.md from a closer reading of TGI's router (`router/src/infer.rs`,
`queue.rs`, defaults of v0.9-v1.x):
  - after every prefill step the batch decodes at least once before others may join;
  - while a batch runs, waiting requests join only if at least
    `floor(running * waiting_served_ratio)` of them can be admitted (default 1.2), or once
    the queue has waited `max_waiting_tokens` decode steps (default 20); an idle engine
    admits at once. Pass `waiting_served_ratio=0` for the plain DESIGN.md definition;
  - one prefill step takes at most `max_prefill_tokens` prompt tokens (TGI's
    `max_batch_prefill_tokens`; here `max_num_batched_tokens`), so a longer prompt is rejected;
  - the queue is served in order: the first request that does not fit stops admission.

Simplifications: TGI budgets reservations as a sum (`max_batch_total_tokens`), we place them
first-fit in one contiguous space, which adds external fragmentation TGI's padded tensors
also had but in another form; decodes are priced unpadded (TGI's flash-attention models).
"""

from __future__ import annotations

import math

from kvsim.simcore.contiguous import ContiguousAllocator
from kvsim.simcore.policies.base import Queues
from kvsim.simcore.policies.reserved import (
    ReservationLedger,
    reservation_check,
    reservation_size,
)
from kvsim.simcore.state import ReqState
from kvsim.simcore.step import MemorySnapshot, StepPlan

WAITING_SERVED_RATIO = 1.2  # TGI --waiting-served-ratio default
MAX_WAITING_TOKENS = 20  # TGI --max-waiting-tokens default (decode steps a queue may wait)


class DynamicPolicy:
    name = "dynamic"

    def __init__(
        self, allocator: ContiguousAllocator, max_model_len: int, max_num_seqs: int,
        max_prefill_tokens: int, waiting_served_ratio: float = WAITING_SERVED_RATIO,
        max_waiting_tokens: int = MAX_WAITING_TOKENS,
    ):
        self.allocator = allocator
        self.ledger = ReservationLedger(allocator)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting_served_ratio = waiting_served_ratio
        self.max_waiting_tokens = max_waiting_tokens
        self.waiting_steps = 0  # decode steps since the last prefill (TGI's waiting_tokens)
        self.just_prefilled = False  # the last step was a prefill: decode before admitting again

    def _size(self, st: ReqState) -> int:
        return reservation_size("max_tokens", st, self.max_model_len)

    def check(self, st: ReqState) -> str:
        if st.num_prompt_tokens > self.max_prefill_tokens:
            return (
                f"prompt of {st.num_prompt_tokens} tokens exceeds the prefill budget "
                f"max_num_batched_tokens {self.max_prefill_tokens}"
            )
        return reservation_check(st, self.allocator, self._size(st))

    def idle_timeout(self, queues: Queues, now: float) -> float | None:
        return None

    def counters(self) -> dict[str, int]:
        return {}

    # -- scheduling ------------------------------------------------------------------------
    def schedule(self, queues: Queues, now: float) -> StepPlan | None:
        running, waiting = queues.running, queues.waiting
        if running and self.just_prefilled:
            return self._decode_plan(running)
        if waiting:
            if not running or self.waiting_steps >= self.max_waiting_tokens:
                min_size = 1
            else:
                min_size = max(1, math.floor(len(running) * self.waiting_served_ratio))
            plan = self._admit(queues, min_size)
            if plan is not None:
                return plan
        return self._decode_plan(running) if running else None

    def _admit(self, queues: Queues, min_size: int) -> StepPlan | None:
        """A prefill-only step for the queue's head, if at least `min_size` requests fit."""
        ledger, waiting = self.ledger, queues.waiting
        if len(waiting) < min_size:
            return None
        room = self.max_num_seqs - len(queues.running)
        chosen: list[ReqState] = []
        num_tokens = 0
        for st in waiting:
            if len(chosen) >= room or num_tokens + st.num_prompt_tokens > self.max_prefill_tokens:
                break
            if not ledger.reserve(st, self._size(st)):
                break
            chosen.append(st)
            num_tokens += st.num_prompt_tokens
        if len(chosen) < min_size:
            for st in chosen:
                ledger.release(st)
            return None
        plan = StepPlan()
        for st in chosen:
            plan.admit(st)
            plan.add_prefill(st, st.num_prompt_tokens, 0)
        return plan

    @staticmethod
    def _decode_plan(running) -> StepPlan:
        plan = StepPlan()
        for st in running:
            plan.add_decode(st, 1)
        return plan

    # -- commit ----------------------------------------------------------------------------
    def end_step(self, plan: StepPlan, finished: list[ReqState], queues: Queues) -> MemorySnapshot:
        ledger = self.ledger
        ledger.advance(plan)
        mem = ledger.snapshot(self._size(queues.waiting[0]) if queues.waiting else 0)
        if plan.num_decode_seqs:
            self.waiting_steps += 1
            self.just_prefilled = False
        else:
            self.waiting_steps = 1
            self.just_prefilled = True
        for st in finished:
            ledger.release(st)
        return mem
