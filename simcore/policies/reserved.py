"""KV bookkeeping shared by the policies that reserve contiguous KV up front (static, dynamic, Orca).

A request reserves one extent when it is admitted and holds it until it leaves (or, in static
batching, until its whole batch ends). The breakdown of DESIGN.md ("KV waste") follows from
three running sums, so a step costs O(1) however many sequences run:

    reservation of one unfinished request:
        | live: computed KV | reserved_future: still to be written | internal: never written |
        0              num_computed_tokens                     final_len                 reserved
    reservation of a finished request whose slot is still held (static): all stale
"""

from __future__ import annotations

from simcore.block_pool import AllocStatus
from simcore.contiguous import ContiguousAllocator, reservation_tokens
from simcore.engine import Engine
from simcore.policies.base import MemorySnapshot
from simcore.state import ReqState


def reservation_size(kind: str, st: ReqState, max_model_len: int) -> int:
    """Tokens to reserve for `st` ("max", "pow2", "oracle" or "max_tokens"); always >= final_len."""
    if st.num_prompt_tokens >= max_model_len:  # the prompt fills the window: one token, no KV for it
        return max_model_len
    size = reservation_tokens(
        kind, st.num_prompt_tokens, st.num_output_target, st.request.max_tokens, max_model_len
    )
    assert size >= st.final_len, "a reservation must hold every token the request writes"
    return size


def unsupported_sampling(st: ReqState) -> str:
    """Reservation policies model one sequence per request; say so instead of guessing."""
    req = st.request
    if req.n > 1 or req.beam_width > 1:
        return (
            f"n={req.n}, beam_width={req.beam_width}: parallel sampling and beam search are "
            "modelled only by --policy continuous --allocator paged"
        )
    return ""


def reservation_check(st: ReqState, allocator: ContiguousAllocator, size: int) -> str:
    """Why a request can never run under a reservation policy ("" if it can)."""
    reason = unsupported_sampling(st)
    if reason:
        return reason
    if allocator.can_reserve(size) == AllocStatus.NEVER:
        return f"reserves {size} KV tokens but the cache holds {allocator.capacity_tokens}"
    return ""


class ReservationLedger:
    """A policy's contiguous reservations and the KV breakdown they imply. Written by its policy."""

    def __init__(self, allocator: ContiguousAllocator, engine: Engine):
        self.allocator = allocator
        self.engine = engine
        self.running_reserved = 0  # sum of reservations of unfinished requests that hold one
        self.running_final = 0  # sum of final_len of those requests
        self.stale = 0  # sum of reservations of finished requests that still hold theirs

    def reserve(self, st: ReqState, num_tokens: int) -> bool:
        """First-fit reservation for an admitted request; False (nothing changed) if no extent fits."""
        if not self.allocator.reserve(st.seq_id, num_tokens):
            return False
        st.reserved_tokens = num_tokens
        self.running_reserved += num_tokens
        self.running_final += st.final_len
        return True

    def retire(self, st: ReqState) -> None:
        """The request finished but keeps its slot (static batching): its reservation turns stale."""
        self.running_reserved -= st.reserved_tokens
        self.running_final -= st.final_len
        self.stale += st.reserved_tokens

    def release(self, st: ReqState, stale: bool = False) -> None:
        """Return the request's extent to the allocator (`stale`: it was retired before)."""
        if stale:
            self.stale -= st.reserved_tokens
        else:
            self.running_reserved -= st.reserved_tokens
            self.running_final -= st.final_len
        self.allocator.free(st.seq_id)

    def snapshot(self, head_reservation: int) -> MemorySnapshot:
        """KV breakdown now; `head_reservation` is what the head of the queue needs (0: no queue)."""
        alloc = self.allocator
        allocated = alloc.num_reserved_tokens
        assert allocated == self.running_reserved + self.stale, "ledger out of step with allocator"
        live = self.engine.live_tokens
        return MemorySnapshot(
            allocated=allocated,
            live=live,
            reserved_future=self.running_final - live,
            internal=self.running_reserved - self.running_final,
            stale=self.stale,
            external=alloc.external_fragmentation_tokens(head_reservation),
        )
