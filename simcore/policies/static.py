"""Static batching: FasterTransformer behind Triton's dynamic batcher, or HF `generate` on a batch.

A batch forms only when the previous one has ended: as soon as `max_batch_size` requests wait,
or `batch_timeout_s` after the oldest waiting request arrived (Triton's
`max_queue_delay_microseconds`). Prompts are left-padded to the batch's longest, and the
batch runs one prefill step over `batch * padded_len` tokens, then decode steps over every
slot until its longest sequence ends. A sequence that ends earlier returns its response at
its own last token (as a streaming server would) but its slot stays in the batch: its KV and
its padded compute are paid until the batch ends, and nothing joins in the meantime.

    slot  | pad | prompt | out ........ | never written .......... |  max_model_len
    slot  | prompt      | out ...| stale (finished, slot still held) |

KV: each slot reserves `max_model_len` tokens of contiguous memory, as FasterTransformer
preallocates `max_batch_size x max_seq_len` (and HF's StaticCache `max_cache_len`), so a
batch is capped at the slots that fit. Refinement of DESIGN.md: as in FasterTransformer a
sequence stops when the padded length reaches the slot (`padded_len + output <= max_model_len`),
so an output can end earlier than under the other policies when a long prompt pads a batch.

Simplifications: HF `generate` with its default DynamicCache grows the cache each step
instead of reserving it (less reservation waste, more allocator churn), and is not modelled
separately; a full batch waits for the slots that fit in memory, not `max_batch_size`, when
fewer fit; padding attends to padded context in decode (`batch x (padded_len + step)`).
"""

from __future__ import annotations

from kvsim.simcore.block_pool import AllocStatus
from kvsim.simcore.contiguous import ContiguousAllocator
from kvsim.simcore.policies.base import Queues
from kvsim.simcore.policies.reserved import ReservationLedger, unsupported_sampling
from kvsim.simcore.state import ReqState
from kvsim.simcore.step import MemorySnapshot, StepPlan

_EPS_S = 1e-9  # a timer that wakes the engine at the deadline must count as reaching it


class StaticPolicy:
    name = "static"

    def __init__(
        self, allocator: ContiguousAllocator, max_model_len: int, max_batch_size: int,
        batch_timeout_s: float,
    ):
        self.allocator = allocator
        self.ledger = ReservationLedger(allocator)
        self.batch_timeout_s = batch_timeout_s
        self.slot_tokens = max_model_len  # every slot reserves a full context window
        # a full batch: max_batch_size requests, or as many slots as the cache holds
        self.num_slots = max(1, min(max_batch_size, allocator.capacity_tokens // self.slot_tokens))
        self.batch: list[ReqState] = []  # the batch in flight, finished members included
        self.padded_len = 0  # longest prompt of the batch in flight
        self.num_decode_steps = 0  # decode steps the batch in flight has run
        self._num_unfinished = 0  # members of the batch in flight still generating

    def check(self, st: ReqState) -> str:
        reason = unsupported_sampling(st)
        if reason:
            return reason
        if self.allocator.can_reserve(self.slot_tokens) == AllocStatus.NEVER:
            return (
                f"a slot of max_model_len {self.slot_tokens} tokens exceeds the KV cache of "
                f"{self.allocator.capacity_tokens} tokens"
            )
        return ""

    def _deadline(self, queues: Queues) -> float:
        return queues.waiting[0].request.arrival_s + self.batch_timeout_s

    def idle_timeout(self, queues: Queues, now: float) -> float | None:
        if self.batch or not queues.waiting:
            return None
        return max(self._deadline(queues) - now, 0.0)

    def counters(self) -> dict[str, int]:
        return {}

    # -- scheduling ------------------------------------------------------------------------
    def schedule(self, queues: Queues, now: float) -> StepPlan | None:
        if self.batch:
            return self._decode_plan(queues)
        waiting = queues.waiting
        if not waiting:
            return None
        if len(waiting) < self.num_slots and now < self._deadline(queues) - _EPS_S:
            return None
        return self._launch(queues)

    def _launch(self, queues: Queues) -> StepPlan:
        """Take up to a full batch from the queue, pad its prompts and prefill them together."""
        waiting = queues.waiting
        batch = [waiting[i] for i in range(min(self.num_slots, len(waiting)))]
        padded_len = max(st.num_prompt_tokens for st in batch)
        # the padded sequence must fit its slot: FasterTransformer stops at max_seq_len
        output_cap = self.slot_tokens - padded_len
        plan = StepPlan()
        for st in batch:
            num_output = max(1, min(st.num_output_target, output_cap))
            ok = self.ledger.reserve(st, self.slot_tokens, st.num_prompt_tokens + num_output - 1)
            assert ok, "an empty cache holds num_slots slots"
            plan.admit(st, 0, max(1, output_cap))
            plan.add(st, st.num_prompt_tokens)
            plan.prefill_chunks.append((padded_len, 0))
        plan.num_tokens = len(batch) * padded_len
        plan.num_sampled = len(batch)
        self.batch = batch
        self._num_unfinished = len(batch)
        self.padded_len = padded_len
        self.num_decode_steps = 0
        return plan

    def _decode_plan(self, queues: Queues) -> StepPlan:
        """Every slot decodes, finished or not; only unfinished sequences emit a token."""
        size = len(self.batch)
        running = queues.running
        plan = StepPlan(parts=[(st, 1) for st in running], num_scheduled=len(running))
        plan.num_tokens = size
        plan.num_decode_seqs = size
        plan.decode_context_tokens = size * (self.padded_len + self.num_decode_steps + 1)
        plan.num_sampled = size
        return plan

    # -- commit ----------------------------------------------------------------------------
    def end_step(self, plan: StepPlan, finished: list[ReqState], queues: Queues) -> MemorySnapshot:
        ledger = self.ledger
        ledger.advance(plan)
        mem = ledger.snapshot(self.slot_tokens if queues.waiting else 0)
        if plan.num_decode_seqs:
            self.num_decode_steps += 1
        for st in finished:
            ledger.retire(st)
        self._num_unfinished -= len(finished)
        if not self._num_unfinished:  # the longest sequence ended: the batch lets go of its slots
            for st in self.batch:
                ledger.release(st)
            self.batch = []
        return mem
