"""One engine replica as a SimPy process: one timeout per step, never one per token.

    loop: plan = policy.schedule(now)        (None -> sleep until an arrival or a timer)
          dt   = latency(plan) + swap time    (one env.timeout)
          policy.apply(plan, now)             (emit tokens, finish, free KV)
          record the step
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from simcore.latency import StepLatencyModel
from simcore.metrics import StepRecorder
from simcore.request import Request
from simcore.state import ReqState, RequestStatus

if TYPE_CHECKING:
    from simcore.policies.base import Policy, StepPlan


class Engine:
    """Queues, token bookkeeping and the step loop; the policy decides what runs."""

    def __init__(
        self,
        env: simpy.Environment,
        latency: StepLatencyModel,
        max_model_len: int,
        swap_block_s: float,
        progress: Callable[[int], None] | None = None,
    ):
        self.env = env
        self.latency = latency
        self.max_model_len = max_model_len
        self.swap_block_s = swap_block_s  # seconds to copy one block over PCIe
        self.policy: Policy | None = None  # set by attach()
        self.states: list[ReqState] = []  # every submitted request, in arrival order
        self.waiting: deque[ReqState] = deque()  # FIFO; recompute-preempted go to the front
        self.running: list[ReqState] = []  # admission order; preemption takes the tail
        self.swapped: deque[ReqState] = deque()  # preempted by swap, FIFO
        self.live_tokens = 0  # computed KV slots of running requests, written by apply/preempt
        self.num_done = 0
        self.itl_s = array("d")  # every gap between consecutive tokens, pooled
        self.recorder = StepRecorder(latency)  # records each step's kernels / collectives / host
        self._progress = progress
        self._wakeup: simpy.Event | None = None

    def attach(self, policy: Policy) -> None:
        self.policy = policy

    # -- RequestSink ---------------------------------------------------------------------
    def submit(self, request: Request) -> simpy.Event:
        request.arrival_s = self.env.now
        st = ReqState(request, self.env.event(), self.max_model_len)
        self.states.append(st)
        if st.num_prompt_tokens > self.max_model_len:  # vLLM answers 400 for these
            reason = f"prompt of {st.num_prompt_tokens} tokens exceeds max_model_len {self.max_model_len}"
        else:
            reason = self.policy.check(st)
        if reason:
            st.status = RequestStatus.REJECTED
            st.reject_reason = reason
            self._leave(st)
        else:
            self.waiting.append(st)
            if self._wakeup is not None and not self._wakeup.triggered:
                self._wakeup.succeed()
        return st.done

    # -- token bookkeeping (called by policies) --------------------------------------------
    def emit_tokens(self, plan: StepPlan, now: float) -> list[ReqState]:
        """Advance every scheduled request; return those that produced their last token."""
        itl = self.itl_s.append
        finished = []
        live = 0
        for st, num_new in plan.scheduled:
            st.num_computed_tokens += num_new
            if len(st.seq_ids) == 1:  # forked requests' KV is counted by their policy
                live += num_new
            if st.num_computed_tokens == st.num_tokens:
                if st.num_generated:
                    itl(now - st.last_token_s)
                else:
                    st.first_token_s = now
                st.last_token_s = now
                st.num_generated += 1
                st.num_tokens += 1
                if st.num_generated >= st.num_output_target:
                    finished.append(st)
        self.live_tokens += live
        return finished

    def retire_finished(
        self, finished: list[ReqState], now: float, release: Callable[[ReqState], None]
    ) -> None:
        """Finish requests that produced their last token; `release` hands back their KV (or,
        for static batching, marks it stale). Drops them from `running`."""
        for st in finished:
            if len(st.seq_ids) == 1:  # forked requests' KV is counted by their policy
                self.live_tokens -= st.num_computed_tokens
            release(st)
            self.finish(st, now)
        self.running = [s for s in self.running if s.status == RequestStatus.RUNNING]

    def finish(self, st: ReqState, now: float) -> None:
        st.status = RequestStatus.FINISHED
        st.finish_s = now
        self._leave(st)

    def _leave(self, st: ReqState) -> None:
        st.done.succeed()
        self.num_done += 1
        if self._progress is not None and self.num_done % 256 == 0:
            self._progress(self.num_done)

    # -- the step loop ---------------------------------------------------------------------
    def run(self):
        env, policy, latency, record = self.env, self.policy, self.latency, self.recorder.record
        while True:
            plan = policy.schedule(env.now)
            if plan is None:
                self._wakeup = env.event()
                timeout = policy.idle_timeout(env.now) if self.waiting else None
                if timeout is None:
                    yield self._wakeup
                else:
                    yield self._wakeup | env.timeout(timeout)
                self._wakeup = None
                continue
            start = env.now
            dt = latency.step_time_s(
                plan.num_tokens, plan.prefill_chunks, plan.num_decode_seqs,
                plan.decode_context_tokens, plan.num_sampled,
            ) + plan.num_swap_blocks * self.swap_block_s
            yield env.timeout(dt)
            mem = policy.apply(plan, env.now)
            record(start, dt, plan, mem, len(self.running), len(self.waiting), len(self.swapped))
