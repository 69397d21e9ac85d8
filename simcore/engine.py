"""One engine replica as a SimPy process: one timeout per step, never one per token.

    loop: plan = policy.schedule(queues, now)     (None -> sleep until an arrival or a timer)
          lifecycle.begin_step(plan)               (preempt, swap in, admit)
          dt   = latency(plan) + swap time         (one env.timeout)
          finished = lifecycle.emit(plan)          (tokens, timestamps, counters)
          mem  = policy.end_step(plan, finished)   (the policy frees / forks / keeps its KV)
          lifecycle.finish(finished); record the step

The engine asks, prices, waits and hands over; it owns neither the request state (the
lifecycle does) nor the KV (the policy's allocator does).
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from simcore.latency import StepLatencyModel
from simcore.lifecycle import Lifecycle
from simcore.metrics import StepRecorder
from simcore.policies.base import Policy
from simcore.request import Request
from simcore.state import ReqState


class Engine:
    """The step loop of one replica and its RequestSink."""

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
        self.lifecycle = Lifecycle(env, max_model_len, progress)
        self.policy: Policy | None = None  # set by attach()
        self.recorder = StepRecorder(latency)  # records each step's kernels / collectives / host
        self._wakeup: simpy.Event | None = None

    def attach(self, policy: Policy) -> None:
        self.policy = policy

    @property
    def states(self) -> list[ReqState]:
        """Every submitted request, in arrival order."""
        return self.lifecycle.states

    @property
    def load(self) -> int:
        """Requests waiting, running or swapped out (what a least-loaded router compares)."""
        return self.lifecycle.num_in_system

    # -- RequestSink ---------------------------------------------------------------------
    def submit(self, request: Request) -> simpy.Event:
        life = self.lifecycle
        st = life.arrive(request)
        if st.num_prompt_tokens > self.max_model_len:  # vLLM answers 400 for these
            reason = f"prompt of {st.num_prompt_tokens} tokens exceeds max_model_len {self.max_model_len}"
        else:
            reason = self.policy.check(st)
        if reason:
            life.reject(st, reason)
        else:
            life.enqueue(st)
            if self._wakeup is not None and not self._wakeup.triggered:
                self._wakeup.succeed()
        return st.done

    # -- the step loop ---------------------------------------------------------------------
    def run(self):
        env, policy, latency, record = self.env, self.policy, self.latency, self.recorder.record
        life = self.lifecycle
        while True:
            plan = policy.schedule(life, env.now)
            if plan is None:
                self._wakeup = env.event()
                timeout = policy.idle_timeout(life, env.now) if life.waiting else None
                if timeout is None:
                    yield self._wakeup
                else:
                    yield self._wakeup | env.timeout(timeout)
                self._wakeup = None
                continue
            start = env.now
            life.begin_step(plan, start)
            dt = latency.step_time_s(
                plan.num_tokens, plan.prefill_chunks, plan.num_decode_seqs,
                plan.decode_context_tokens, plan.num_sampled,
            ) + plan.num_swap_blocks * self.swap_block_s
            yield env.timeout(dt)
            finished = life.emit(plan, env.now)
            mem = policy.end_step(plan, finished, life)
            life.finish(finished, env.now)
            record(start, dt, plan, mem, len(life.running), len(life.waiting), len(life.swapped))
