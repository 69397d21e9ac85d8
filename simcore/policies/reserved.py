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

from kvsim.simcore.block_pool import AllocStatus
from kvsim.simcore.contiguous import ContiguousAllocator, reservation_tokens
from kvsim.simcore.state import ReqState
from kvsim.simcore.step import MemorySnapshot, StepPlan


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
    """A policy's contiguous reservations and the KV breakdown they imply. Written by its policy.

    It counts live KV itself (tokens computed by the requests holding a running reservation),
    from the plans it is shown, so the breakdown needs no one else's state."""

    def __init__(self, allocator: ContiguousAllocator):
        self.allocator = allocator
        self.running_reserved = 0  # sum of reservations of unfinished requests that hold one
        self.running_final = 0  # sum of final_len of those requests
        self.stale = 0  # sum of reservations of finished requests that still hold theirs
        self.live = 0  # computed KV slots of unfinished requests holding a reservation
        self._held: dict[int, tuple[int, int]] = {}  # request id -> (reserved, final_len), unfinished
        self._stale: dict[int, int] = {}  # request id -> reserved, finished but still held

    def reserve(self, st: ReqState, num_tokens: int, final_len: int | None = None) -> bool:
        """First-fit reservation for a request being admitted (`final_len`: the KV it will write,
        if the admission caps its output); False (nothing changed) if no extent fits."""
        if not self.allocator.reserve(st.request_id, num_tokens):
            return False
        final = st.final_len if final_len is None else final_len
        self._held[st.request_id] = (num_tokens, final)
        self.running_reserved += num_tokens
        self.running_final += final
        return True

    def advance(self, plan: StepPlan) -> None:
        """The plan's tokens were computed: they are live KV now."""
        self.live += sum([num_new for _, num_new in plan.scheduled])

    def _drop_running(self, st: ReqState) -> int:
        reserved, final = self._held.pop(st.request_id)
        self.running_reserved -= reserved
        self.running_final -= final
        self.live -= st.num_computed_tokens
        return reserved

    def retire(self, st: ReqState) -> None:
        """The request finished but keeps its slot (static batching): its reservation turns stale."""
        reserved = self._drop_running(st)
        self._stale[st.request_id] = reserved
        self.stale += reserved

    def release(self, st: ReqState) -> None:
        """Return the request's extent to the allocator (finished, or stale until now)."""
        stale = self._stale.pop(st.request_id, None)
        if stale is None:
            self._drop_running(st)
        else:
            self.stale -= stale
        self.allocator.free(st.request_id)

    def snapshot(self, head_reservation: int) -> MemorySnapshot:
        """KV breakdown now; `head_reservation` is what the head of the queue needs (0: no queue)."""
        alloc = self.allocator
        allocated = alloc.num_reserved_tokens
        assert allocated == self.running_reserved + self.stale, "ledger out of step with allocator"
        live = self.live
        return MemorySnapshot(
            allocated=allocated,
            live=live,
            reserved_future=self.running_final - live,
            internal=self.running_reserved - self.running_final,
            stale=self.stale,
            external=alloc.external_fragmentation_tokens(head_reservation),
        )
