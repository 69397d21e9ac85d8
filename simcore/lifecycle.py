"""The one owner of a request's life inside a replica: its queues, status, timestamps and
token counters. Nothing else writes them.

    arrive ──► WAITING ──admit──► RUNNING ──emit (last token)──► FINISHED
      │           ▲                 │  ▲
      └─reject─►  └──preempt (recompute, to the front)
      REJECTED                      └──preempt (swap) ──► SWAPPED ──swap_in──┘

A policy never calls these: it puts the transitions it chose into its `StepPlan`, and the
engine hands the plan here (`begin_step`) and then the step's outcome (`emit`, `finish`).
Every move is checked against `LEGAL_TRANSITIONS`, and a request admitted twice keeps its
first `first_scheduled_s`.

Token emission and per-request counters go through `emit` only. The counters of queued and
running requests live in numpy columns by slot (`SlotStore`), and `running_slots()` lists the
running requests' slots in `running` order, so a step of plain decodes (a `DecodeRun`) is a
few array operations, and a decode span (many steps as one event) a few more.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kvsim.simcore.records import RequestRecords, Samples
from kvsim.simcore.request import Request
from kvsim.simcore.state import LEGAL_TRANSITIONS, ReqState, RequestStatus, SlotStore
from kvsim.simcore.step import DecodeRun, StepPlan

if TYPE_CHECKING:  # annotations only: SimPy is imported by the Python engine (simcore.simulate)
    import simpy

_PROGRESS_EVERY = 256  # requests between progress callbacks
_ONE = np.ones((), dtype=np.int64)  # one token, as a 0-d array (see `_emit_run`)
_COUNTS: dict[int, np.ndarray] = {}  # small counts as 0-d arrays (`_count`)


def _count(k: int) -> np.ndarray:
    """`k` as a 0-d int64 array, kept for k < 4096 (a span's step count): numpy adds two arrays
    faster than an array and a Python int (the same sums)."""
    count = _COUNTS.get(k)
    if count is None:
        count = np.array(k, dtype=np.int64)
        count.flags.writeable = False  # shared: nobody may add to it in place
        if k < 4096:
            _COUNTS[k] = count
    return count


class Lifecycle:
    """Queues and per-request state of one replica; the policies read them (`Queues`)."""

    def __init__(
        self, env: simpy.Environment | None, max_model_len: int,
        progress: Callable[[int], None] | None = None,
    ):
        self.env = env
        self.max_model_len = max_model_len
        # requests that left (finished or rejected), as columns; shared by a run's replicas
        # (the simulation sets it and `replica`); the ReqState itself is dropped when it leaves
        self.records = RequestRecords()
        self.replica = 0
        self.num_arrived = 0
        self.waiting: deque[ReqState] = deque()  # FIFO; recompute-preempted go to the front
        self.running: list[ReqState] = []  # admission order; preemption takes the tail
        self.swapped: deque[ReqState] = deque()  # preempted by swap, FIFO
        # every gap between consecutive tokens, pooled: `_add_itls(array)` once per step;
        # exact up to a cap, then a histogram (simcore.records)
        self.itl = Samples()
        # request id -> the times of its tokens, when asked for (`vllm bench serve --save-result`'s
        # per-request ITLs and its peak output tokens per second); None: not kept (the default)
        self.token_times: dict[int, array] | None = None  # float64 arrays: 8 bytes a token
        self.store = SlotStore()  # counters of queued and running requests, by slot
        self._run_slots = np.zeros(64, dtype=np.int64)  # running[i].slot at i < len(running)
        self._run_slots_mv = memoryview(self._run_slots)  # the same, for scalar writes and shifts
        self.num_done = 0  # finished + rejected
        # False where the deployment's front end counts client arrivals itself (simcore.disagg: a
        # decode instance receives requests that arrived at the proxy earlier)
        self.count_arrivals = True
        self._progress = progress

    @property
    def num_in_system(self) -> int:
        """Requests waiting, running or swapped out: what a load balancer sees."""
        return len(self.waiting) + len(self.running) + len(self.swapped)

    @property
    def num_unfinished(self) -> int:
        """Requests that arrived and have not left (0 at the end of a run that did not stall)."""
        return self.num_arrived - self.num_done

    def _move(self, st: ReqState, to: RequestStatus) -> None:
        if (st.status, to) not in LEGAL_TRANSITIONS:
            raise AssertionError(f"request {st.request_id}: illegal transition {st.status.name} -> {to.name}")
        st.status = to

    # -- arrival -----------------------------------------------------------------------------
    def arrive(self, request: Request, arrival_s: float | None = None, done: simpy.Event | None = None) -> ReqState:
        """A new request, stamped with its arrival time (now, or the earlier time it was planned
        for when the workload held it back behind a long queue); not queued yet. `done`, when
        someone waits for the request, succeeds as it leaves."""
        now = request.arrival_s = self.env.now if arrival_s is None else arrival_s
        st = ReqState(request, done, self.max_model_len)
        self.num_arrived += 1
        if self.count_arrivals:
            self.records.arrive(now)
        return st

    def enqueue(self, st: ReqState) -> None:
        assert st.status == RequestStatus.WAITING and st.slot < 0, "a new request is queued once"
        self.store.attach(st)
        self.waiting.append(st)

    def running_slots(self) -> np.ndarray:
        """The slots of `running`, in its order (a view: valid until the queues change)."""
        return self._run_slots[: len(self.running)]

    def _run(self, st: ReqState) -> None:
        running = self.running
        if len(running) == len(self._run_slots):
            self._run_slots = np.concatenate([self._run_slots, np.zeros_like(self._run_slots)])
            self._run_slots_mv = memoryview(self._run_slots)
        self._run_slots_mv[len(running)] = st.slot
        running.append(st)

    def _unrun(self, st: ReqState) -> None:
        running = self.running
        if running[-1] is st:
            running.pop()
            return
        i = running.index(st)
        del running[i]
        slots = self._run_slots_mv  # a memoryview copies overlapping slices correctly, and fast
        slots[i : len(running)] = slots[i + 1 : len(running) + 1]

    def reject(self, st: ReqState, reason: str) -> None:
        assert reason, "a rejection needs a reason"
        self._move(st, RequestStatus.REJECTED)
        st.reject_reason = reason
        self._leave(st)
        self.itl.settle()

    # -- the transitions a plan asks for -----------------------------------------------------
    def begin_step(self, plan: StepPlan, now: float) -> None:
        """Apply the plan's preemptions, swap-ins and admissions, in that order."""
        for st, by_swap in plan.preempted:
            self.preempt(st, by_swap)
        for st in plan.swapped_in:
            self.swap_in(st)
        for st, num_cached, output_cap in plan.admitted:
            self.admit(st, now, num_cached, output_cap)

    def preempt(self, st: ReqState, by_swap: bool) -> None:
        """Take a running request off the GPU: by swap (its KV is kept on the CPU) to the back
        of `swapped`, or by recompute (its KV is dropped) to the front of `waiting`."""
        self._unrun(st)
        st.num_preemptions += 1
        if by_swap:
            self._move(st, RequestStatus.SWAPPED)
            self.swapped.append(st)
        else:
            self._move(st, RequestStatus.WAITING)
            st.num_computed_tokens = 0
            self.store.mark(st)
            self.waiting.appendleft(st)

    def swap_in(self, st: ReqState) -> None:
        assert self.swapped and self.swapped[0] is st, "swap-in takes the head of the swapped queue"
        self.swapped.popleft()
        self._move(st, RequestStatus.RUNNING)
        self._run(st)

    def admit(self, st: ReqState, now: float, num_cached_tokens: int = 0, output_cap: int = 0) -> None:
        """Start (or restart, after recompute) a waiting request; the head of the queue unless
        the policy orders the queue otherwise."""
        waiting = self.waiting
        if waiting and waiting[0] is st:
            waiting.popleft()
        else:
            waiting.remove(st)
        self._move(st, RequestStatus.RUNNING)
        assert st.num_computed_tokens == 0 and 0 <= num_cached_tokens < st.num_tokens
        st.num_computed_tokens = num_cached_tokens
        self.store.mark(st)
        if output_cap > 0:
            st.num_output_target = max(1, min(st.num_output_target, output_cap))
        if st.first_scheduled_s < 0:
            st.first_scheduled_s = now
        self._run(st)

    # -- the step's outcome ------------------------------------------------------------------
    def emit(self, plan: StepPlan, now: float, times_s: list[float] | None = None) -> list[ReqState]:
        """Advance every scheduled request; return those that produced their last token, and
        pool the step's inter-token gaps (in schedule order). Tokens are stamped `now`, or, with
        `times_s`, entry i (in schedule order) at `times_s[i]` (a pipeline's micro-batches each
        leave the last stage when they are done, not all at the round's end; simcore.pipeline)."""
        parts = plan.parts
        if times_s is None and len(parts) == 1 and type(parts[0]) is not tuple:  # a decode-only step
            finished: list[ReqState] = []
            self.itl.extend(self._emit_run(parts[0], now, finished))
            return finished
        store = self.store
        times = None if times_s is None else np.asarray(times_s, dtype=np.float64)
        k = 0  # entry index into `times`
        finished: list[ReqState] = []
        pieces: list[np.ndarray] = []  # ITLs, in order
        gaps: list[float] = []  # ITLs of single requests since the last DecodeRun
        # a single request's counters, read and written in its slot through the store's
        # memoryviews (what the ReqState properties do, without a property call per access)
        computed_mv, remaining_mv, last_mv = store.computed_mv, store.remaining_mv, store.last_token_mv
        for part in plan.parts:
            if type(part) is tuple:
                st, num_new = part
                t = now if times is None else float(times[k])
                k += 1
                slot = st.slot
                assert slot >= 0, "a queued or running request holds a store slot"
                computed_mv[slot] = computed = computed_mv[slot] + num_new
                remaining = remaining_mv[slot]
                generated = store.target_mv[slot] - remaining
                if computed == st.num_prompt_tokens + generated:  # == num_tokens: a token out
                    if self.token_times is not None:
                        self.token_times.setdefault(st.request_id, array("d")).append(t)
                    if generated:
                        gaps.append(t - last_mv[slot])
                    else:
                        st.first_token_s = t
                    last_mv[slot] = t
                    remaining_mv[slot] = remaining = remaining - 1  # num_tokens grows by one
                    if remaining <= 0:
                        finished.append(st)
                store.mark(st)
                continue
            num = len(part.slots)
            ts = now if times is None else times[k:k + num]
            k += num
            if gaps:
                pieces.append(np.array(gaps))
                gaps = []
            pieces.append(self._emit_run(part, ts, finished))
        assert times is None or k == len(times), "one emission time per scheduled entry"
        if gaps:
            pieces.append(np.array(gaps))
        if pieces:
            self._add_itls(pieces[0] if len(pieces) == 1 else np.concatenate(pieces))
        return finished

    def emit_spec(self, plan: StepPlan, now: float) -> list[ReqState]:
        """`emit` for a speculative-decoding step (plans with `spec`, single requests only): a
        verifying request keeps its accepted drafts (computed + 1 + accepted) and emits
        accepted + 1 tokens at once, stamped `now`; everything else as `emit`. One inter-token
        gap per burst, as `vllm bench serve` counts ITL (one per streamed chunk, whatever it
        holds: vllm/benchmarks/lib/endpoint_request_func.py), so ITL exceeds TPOT."""
        verify = plan.spec.verify
        store = self.store
        computed_mv, remaining_mv, last_mv = store.computed_mv, store.remaining_mv, store.last_token_mv
        finished: list[ReqState] = []
        gaps: list[float] = []
        for part in plan.parts:
            assert type(part) is tuple, "a speculative plan schedules single requests"
            st, num_new = part
            slot = st.slot
            remaining = remaining_mv[slot]
            generated = store.target_mv[slot] - remaining
            hit = verify.get(slot)
            if hit is None:
                computed_mv[slot] = computed = computed_mv[slot] + num_new
                emitted = 1 if computed == st.num_prompt_tokens + generated else 0
            else:
                computed_mv[slot] = computed_mv[slot] + 1 + hit[1]
                emitted = 1 + hit[1]
            if emitted:
                if self.token_times is not None:  # every token, the burst's sharing one time
                    self.token_times.setdefault(st.request_id, array("d")).extend([now] * emitted)
                if generated:
                    gaps.append(now - last_mv[slot])
                else:
                    st.first_token_s = now
                last_mv[slot] = now
                remaining_mv[slot] = remaining = remaining - emitted
                if remaining <= 0:
                    finished.append(st)
            store.mark(st)
        if gaps:
            self._add_itls(np.array(gaps))
        return finished

    def _emit_run(self, run: DecodeRun, ts: float | np.ndarray, finished: list[ReqState]) -> np.ndarray:
        """One token for every request of a run of plain decodes (num_tokens == num_computed_tokens
        + 1), stamped `ts`; appends those that emitted their last token to `finished` and returns
        the run's inter-token gaps. (Its scalars are 0-d arrays: numpy combines two arrays faster
        than an array and a Python number; the same values.)"""
        store = self.store
        slots = run.slots
        last = store.last_token
        ts = np.asarray(ts)
        if self.token_times is not None:
            self._log_tokens(slots, np.broadcast_to(ts, slots.shape))
        gaps = ts - last[slots]
        last[slots] = ts
        store.computed[slots] = run.computed + _ONE
        remaining = store.remaining[slots]
        remaining -= _ONE
        store.remaining[slots] = remaining
        done = (remaining < _ONE).nonzero()[0]  # emitted their last token
        if len(done):
            by_slot = store.by_slot
            finished.extend([by_slot[s] for s in slots[done].tolist()])
        return gaps

    def emit_span(self, plan: StepPlan, ends_s: np.ndarray) -> None:
        """Steps 1..m of a decode span (m = len(ends_s), step k ending at ends_s[k-1]): every
        request of a decode-only plan emits one token per step and none finishes. The same
        counters, timestamps and pooled ITLs, in the same order, as m calls of `emit`."""
        num_steps = len(ends_s)
        if not num_steps:
            return
        store = self.store
        parts = plan.parts
        slots = parts[0].slots if len(parts) == 1 else plan.decode_slots()
        assert len(slots) == plan.num_scheduled, "a decode span holds plain decodes only"
        # nobody finishes: the span is no longer than the fewest tokens a request has left
        # (simcore.span.span_shape), and these are its steps before the last
        num_seqs = len(slots)
        last = store.last_token
        # every request's gap in step 1 is ends_s[0] - its last token; in step k > 1, ends_s[k-1] - ends_s[k-2]
        if self.token_times is not None:
            for slot in slots.tolist():
                self.token_times.setdefault(int(store.rid[slot]), array("d")).extend(ends_s.tolist())
        gaps = np.empty(num_seqs * num_steps)
        np.subtract(ends_s[0], last[slots], out=gaps[:num_seqs])
        if num_steps > 1:
            gaps[num_seqs:] = (ends_s[1:] - ends_s[:-1]).repeat(num_seqs)
        self._add_itls(gaps)
        steps = _count(num_steps)
        for part in parts:  # the plan's last step starts from there
            part.computed = store.computed[part.slots] = part.computed + steps
        remaining = store.remaining[slots]
        remaining -= steps
        store.remaining[slots] = remaining
        last[slots] = ends_s[-1]

    def _log_tokens(self, slots: np.ndarray, times: np.ndarray) -> None:
        """One token each for the requests in `slots`, at `times` (only with `token_times` on)."""
        log, rid = self.token_times, self.store.rid
        for slot, t in zip(slots.tolist(), times.tolist(), strict=True):
            log.setdefault(int(rid[slot]), array("d")).append(t)

    def _add_itls(self, values: np.ndarray) -> None:
        """Pool one step's (or span's) inter-token gaps, float64, in emission order."""
        self.itl.extend(values)

    def finish(self, finished: list[ReqState], now: float | None) -> None:
        """Requests that produced their last token leave `running` (their KV is already back);
        each finishes at `now`, or (None) when its last token was produced (`emit` with per-entry times)."""
        if not finished:
            return
        for st in finished:
            self._move(st, RequestStatus.FINISHED)
            st.finish_s = st.last_token_s if now is None else now
            self._leave(st)
        self.itl.settle()
        self._drop_finished(finished)

    def _drop_finished(self, finished: list[ReqState]) -> None:
        """Take finished requests out of `running` and give back their slots."""
        store = self.store
        if len(finished) <= 8:
            for st in finished:
                self._unrun(st)
                store.detach(st)
            return
        kept = [s for s in self.running if s.status == RequestStatus.RUNNING]
        self.running = []
        for st in kept:
            self._run(st)
        for st in finished:
            store.detach(st)

    def _leave(self, st: ReqState) -> None:
        """The request's row goes to the records; nothing here keeps the object. (The caller
        settles the pooled ITLs once, so their buffer stays bounded.)"""
        if st.done is not None:  # its value is the request's state (a session reads its first-token time)
            st.done.succeed(st)
        self.records.leave(st, self.replica)
        self.num_done += 1
        if self._progress is not None and self.num_done % _PROGRESS_EVERY == 0:
            self._progress(self.num_done)
