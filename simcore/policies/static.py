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

from simcore.block_pool import AllocStatus
from simcore.contiguous import ContiguousAllocator
from simcore.engine import Engine
from simcore.policies.base import MemorySnapshot, StepPlan
from simcore.policies.reserved import ReservationLedger, unsupported_sampling
from simcore.state import ReqState, RequestStatus

_EPS_S = 1e-9  # a timer that wakes the engine at the deadline must count as reaching it


class StaticPolicy:
    name = "static"

    def __init__(
        self, engine: Engine, allocator: ContiguousAllocator, max_batch_size: int,
        batch_timeout_s: float,
    ):
        self.engine = engine
        self.allocator = allocator
        self.ledger = ReservationLedger(allocator, engine)
        self.batch_timeout_s = batch_timeout_s
        self.slot_tokens = engine.max_model_len  # every slot reserves a full context window
        # a full batch: max_batch_size requests, or as many slots as the cache holds
        self.num_slots = max(1, min(max_batch_size, allocator.capacity_tokens // self.slot_tokens))
        self.batch: list[ReqState] = []  # the batch in flight, finished members included
        self.padded_len = 0  # longest prompt of the batch in flight
        self.num_decode_steps = 0  # decode steps the batch in flight has run

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

    def _deadline(self) -> float:
        return self.engine.waiting[0].request.arrival_s + self.batch_timeout_s

    def idle_timeout(self, now: float) -> float | None:
        if self.batch or not self.engine.waiting:
            return None
        return max(self._deadline() - now, 0.0)

    # -- scheduling ------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        if self.batch:
            return self._decode_plan()
        waiting = self.engine.waiting
        if not waiting:
            return None
        if len(waiting) < self.num_slots and now < self._deadline() - _EPS_S:
            return None
        return self._launch(now)

    def _launch(self, now: float) -> StepPlan:
        """Take up to a full batch from the queue, pad its prompts and prefill them together."""
        eng = self.engine
        waiting = eng.waiting
        batch = [waiting.popleft() for _ in range(min(self.num_slots, len(waiting)))]
        padded_len = max(st.num_prompt_tokens for st in batch)
        plan = StepPlan()
        for st in batch:
            # the padded sequence must fit its slot: FasterTransformer stops at max_seq_len
            st.num_output_target = max(1, min(st.num_output_target, self.slot_tokens - padded_len))
            ok = self.ledger.reserve(st, self.slot_tokens)
            assert ok, "an empty cache holds num_slots slots"
            st.padded_len = padded_len
            st.status = RequestStatus.RUNNING
            st.first_scheduled_s = now
            eng.running.append(st)
            plan.scheduled.append((st, st.num_prompt_tokens))
            plan.prefill_chunks.append((padded_len, 0))
        plan.num_tokens = len(batch) * padded_len
        plan.num_sampled = len(batch)
        self.batch = batch
        self.padded_len = padded_len
        self.num_decode_steps = 0
        return plan

    def _decode_plan(self) -> StepPlan:
        """Every slot decodes, finished or not; only unfinished sequences emit a token."""
        size = len(self.batch)
        plan = StepPlan(scheduled=[(st, 1) for st in self.engine.running])
        plan.num_tokens = size
        plan.num_decode_seqs = size
        plan.decode_context_tokens = size * (self.padded_len + self.num_decode_steps + 1)
        plan.num_sampled = size
        return plan

    # -- commit ----------------------------------------------------------------------------
    def apply(self, plan: StepPlan, now: float) -> MemorySnapshot:
        eng, ledger = self.engine, self.ledger
        finished = eng.emit_tokens(plan, now)
        mem = ledger.snapshot(self.slot_tokens if eng.waiting else 0)
        if plan.num_decode_seqs:
            self.num_decode_steps += 1
        if finished:
            eng.retire_finished(finished, now, ledger.retire)
        if not eng.running:  # the longest sequence ended: the whole batch lets go of its slots
            for st in self.batch:
                ledger.release(st, stale=True)
            self.batch = []
        return mem
