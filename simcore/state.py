"""Per-request simulation state. Read by the policies and the metrics; written only by
`simcore.lifecycle.Lifecycle`, through the transitions `LEGAL_TRANSITIONS` allows."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

from kvsim.simcore.request import Request

if TYPE_CHECKING:  # annotations only: SimPy is imported by the Python engine (simcore.simulate)
    import simpy


class RequestStatus(IntEnum):
    """Ordered so that `status >= FINISHED` means the request has left the engine."""

    WAITING = 0  # queued, or preempted by recompute (its KV was dropped)
    RUNNING = 1  # holds KV on the GPU and is scheduled every step
    SWAPPED = 2  # preempted by swap: its KV sits in the CPU pool
    FINISHED = 3  # produced its last token
    REJECTED = 4  # can never be served (reason in `reject_reason`)


_W, _R, _S = RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.SWAPPED
LEGAL_TRANSITIONS: frozenset[tuple[RequestStatus, RequestStatus]] = frozenset({
    (_W, _R),  # admitted
    (_R, _W),  # preempted by recompute (back to the front of the queue)
    (_R, _S),  # preempted by swap
    (_S, _R),  # swapped back in
    (_R, RequestStatus.FINISHED),  # produced its last token
    (_W, RequestStatus.REJECTED),  # refused on arrival
})


class SlotStore:
    """The token counters and last-token time of every admitted, unfinished request, as numpy
    columns indexed by the request's slot, so a step updates a whole batch in a few array
    operations (simcore.lifecycle) instead of one Python attribute write per token. A slot is
    taken when the request is queued and given back when it leaves; slots are reused.

    Output progress is kept as `remaining` (tokens still to emit: target - generated), not as
    tokens generated: a decode step lowers it and finds who finished with one comparison, and a
    decode span's length is bounded by its minimum, without reading `target` (tokens generated
    = target - remaining).

    Scalar access (a request on a rare path) goes through memoryviews (`*_mv`), which read and
    write Python ints / floats directly. Columns are replaced when the store grows: read them
    from the store each time, never keep a column or memoryview across an admission."""

    INT_COLUMNS = ("computed", "remaining", "target", "rid")
    FLOAT_COLUMNS = ("last_token",)
    BOOL_COLUMNS = ("simple", "plain")

    def __init__(self, capacity: int = 256):
        self.capacity = 0
        self.by_slot: list[ReqState | None] = []  # the request holding each slot
        self._free: list[int] = []  # released slots, reused last-released first
        self.simple = np.zeros(0, dtype=bool)  # n == 1 and no beam search: one sequence for life
        # simple, and its next step is one decode token: num_tokens == computed + 1, generated > 0
        # (kept by the lifecycle whenever it changes these counters outside a DecodeRun)
        self.plain = np.zeros(0, dtype=bool)
        for name in self.INT_COLUMNS:
            setattr(self, name, np.zeros(0, dtype=np.int64))
        self.last_token = np.zeros(0, dtype=np.float64)
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        for name in self.INT_COLUMNS + self.FLOAT_COLUMNS + self.BOOL_COLUMNS:
            column = getattr(self, name)
            grown = np.zeros(capacity, dtype=column.dtype)
            grown[:old] = column
            setattr(self, name, grown)
        self.computed_mv, self.remaining_mv = memoryview(self.computed), memoryview(self.remaining)
        self.target_mv, self.last_token_mv = memoryview(self.target), memoryview(self.last_token)
        self.rid_mv = memoryview(self.rid)
        self.simple_mv, self.plain_mv = memoryview(self.simple), memoryview(self.plain)
        self.by_slot.extend([None] * (capacity - old))
        self._free.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def attach(self, st: ReqState) -> None:
        """Move a newly queued request's counters into a free slot; they live there until
        `detach`. It has generated nothing yet, so it is not `plain`."""
        if not self._free:
            self._grow(2 * self.capacity)
        slot = self._free.pop()
        self.computed_mv[slot] = st._computed
        self.remaining_mv[slot] = st._target - st._generated
        self.target_mv[slot] = st._target
        self.last_token_mv[slot] = st._last_token_s
        self.rid_mv[slot] = st.request_id
        req = st.request
        self.simple_mv[slot] = req.n == 1 and req.beam_width == 1
        self.plain_mv[slot] = False
        self.by_slot[slot] = st
        st._store, st.slot = self, slot

    def mark(self, st: ReqState) -> None:
        """Recompute the request's `plain` flag after its counters changed one by one."""
        slot = st.slot
        generated = self.target_mv[slot] - self.remaining_mv[slot]
        self.plain_mv[slot] = (self.simple_mv[slot] and generated > 0
                               and st.num_prompt_tokens + generated == self.computed_mv[slot] + 1)

    def detach(self, st: ReqState) -> None:
        """Copy the request's counters back onto it and free its slot (it is leaving)."""
        slot = st.slot
        st._computed = self.computed_mv[slot]
        st._target = target = self.target_mv[slot]
        st._generated = target - self.remaining_mv[slot]
        st._last_token_s = self.last_token_mv[slot]
        st._store, st.slot = None, -1
        self.by_slot[slot] = None
        self._free.append(slot)


class ReqState:
    """One request inside an engine.

    Token arithmetic follows vLLM: `num_tokens` = prompt + tokens generated so far, and
    `num_computed_tokens` catches up to it. A step that makes them equal emits a token:

        prompt p0..p4 | out o0 o1        num_tokens = 7
        computed: p0..p4 o0              num_computed_tokens = 6 -> next step computes o1

    While admitted, the counters live in the lifecycle's `SlotStore` (slot `slot`); the
    attributes below read and write them there, and the request keeps no copy until it leaves.
    """

    __slots__ = (
        "request", "request_id", "status", "num_prompt_tokens",
        "_target", "_computed", "_generated",
        "first_scheduled_s", "first_token_s", "_last_token_s", "finish_s", "num_preemptions",
        "reject_reason", "done", "slot", "_store",
    )

    def __init__(self, request: Request, done: simpy.Event | None, max_model_len: int):
        self.request = request
        self.request_id = request.request_id
        self.status = _W
        self.num_prompt_tokens = prompt = request.num_prompt_tokens
        self.slot = -1  # no SlotStore slot until queued
        self._store: SlotStore | None = None
        # vLLM stops a sequence at max_model_len (finish reason "length").
        self._target = max(1, min(request.num_output_tokens, max_model_len - prompt))
        self._computed = 0  # tokens whose KV is written, <= num_tokens
        self._generated = 0  # output tokens emitted so far
        self.first_scheduled_s = -1.0  # first admission; kept across preemptions
        self.first_token_s = -1.0
        self._last_token_s = -1.0
        self.finish_s = -1.0
        self.num_preemptions = 0
        self.reject_reason = ""
        self.done = done  # succeeds when the request leaves (finished or rejected); None: nobody waits

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is written, <= num_tokens."""
        return self._computed if self.slot < 0 else self._store.computed_mv[self.slot]

    @num_computed_tokens.setter
    def num_computed_tokens(self, value) -> None:
        if self.slot < 0:
            self._computed = value
        else:
            self._store.computed_mv[self.slot] = value

    @property
    def num_tokens(self) -> int:
        """Prompt + output tokens so far; grows by one per emitted token."""
        return self.num_prompt_tokens + self.num_generated

    @property
    def num_generated(self) -> int:
        """Output tokens emitted so far."""
        slot = self.slot
        if slot < 0:
            return self._generated
        store = self._store
        return store.target_mv[slot] - store.remaining_mv[slot]

    @num_generated.setter
    def num_generated(self, value) -> None:
        if self.slot < 0:
            self._generated = value
        else:
            self._store.remaining_mv[self.slot] = self._store.target_mv[self.slot] - value

    @property
    def num_output_target(self) -> int:
        """Output tokens the request will emit (vLLM stops at max_model_len)."""
        return self._target if self.slot < 0 else self._store.target_mv[self.slot]

    @num_output_target.setter
    def num_output_target(self, value) -> None:
        slot = self.slot
        if slot < 0:
            self._target = value
        else:  # tokens generated stay as they are
            store = self._store
            store.remaining_mv[slot] += value - store.target_mv[slot]
            store.target_mv[slot] = value

    @property
    def last_token_s(self) -> float:
        """When the request emitted its latest token."""
        return self._last_token_s if self.slot < 0 else self._store.last_token_mv[self.slot]

    @last_token_s.setter
    def last_token_s(self, value) -> None:
        if self.slot < 0:
            self._last_token_s = value
        else:
            self._store.last_token_mv[self.slot] = value

    @property
    def final_len(self) -> int:
        """Prompt + every output token the request will have written as KV."""
        return self.num_prompt_tokens + self.num_output_target - 1
