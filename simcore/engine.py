"""One engine replica as a SimPy process: one timeout per step, never one per token.

    loop: plan = policy.schedule(queues, now)     (None -> sleep until an arrival or a timer)
          lifecycle.begin_step(plan)               (preempt, swap in, admit)
          dt   = latency(plan) + swap time         (one env.timeout)
          finished = lifecycle.emit(plan)          (tokens, timestamps, counters)
          mem  = policy.end_step(plan, finished)   (the policy frees / forks / keeps its KV)
          lifecycle.finish(finished); record the step

The engine asks, prices, waits and hands over; it owns neither the request state (the
lifecycle does) nor the KV (the policy's allocator does).

Decode spans (simcore.span): when the policy says its plan would repeat unchanged for K steps
(`decode_span`), the engine prices all K at once and waits once, to the end of step K, or to
the first step boundary after an arrival that could change the next plan. Steps 1..k-1 are
applied in bulk (`extend_span`, `emit_span`, one step-table row) and step k like any other
step. `exact_steps=True` keeps one event per step, the reference the fast path is tested
against (tests/test_fastpath_equivalence.py).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np

from kvsim.simcore.latency import StepLatencyModel
from kvsim.simcore.lifecycle import Lifecycle
from kvsim.simcore.metrics import StepRecorder
from kvsim.simcore.policies.base import Policy
from kvsim.simcore.records import RequestRecords, Samples
from kvsim.simcore.request import Request
from kvsim.simcore.span import (
    SpanShape,
    boundaries,
    context_sums,
    decode_step_fixed_ms,
    delay_to,
    kv_slots,
)
from kvsim.simcore.step import StepPlan

if TYPE_CHECKING:  # annotations only: SimPy is imported by the Python engine (simcore.simulate)
    import simpy

    from kvsim.simcore.speculative_cost import SpeculativeStepCost

HOLD_WAITING = 65_536  # waiting requests past which an open-loop workload holds new arrivals back


class Engine:
    """The step loop of one replica and its RequestSink."""

    def __init__(
        self,
        env: simpy.Environment | None,  # set by the Simulation when the Python engine runs
        latency: StepLatencyModel,
        max_model_len: int,
        swap_block_s: float,
        progress: Callable[[int], None] | None = None,
        exact_steps: bool = False,
        spec_cost: SpeculativeStepCost | None = None,
    ):
        self.env = env
        self.exact_steps = exact_steps  # one event per step, never a decode span
        self.latency = latency
        self.max_model_len = max_model_len
        self.swap_block_s = swap_block_s  # seconds to copy one block over PCIe
        self.lifecycle = Lifecycle(env, max_model_len, progress)
        self.policy: Policy | None = None  # set by attach()
        # prices the steps of a speculative-decoding policy (plans with `spec`); None: none
        self.spec_cost = spec_cost
        self.recorder = StepRecorder(spec_cost or latency)  # records each step's kernels / collectives / host
        self._wakeup: simpy.Event | None = None
        self._drained: simpy.Event | None = None  # fires when a held-back workload may go on
        self.hold_at = HOLD_WAITING
        self.num_holds = 0  # times the workload was held back (reported in the run's record)

    def attach(self, policy: Policy) -> None:
        self.policy = policy
        # FCFS policies look at most this many waiting requests per step; holding starts at four
        # times it and ends at two, so a held request could never have been admitted earlier.
        reach = max(getattr(policy, "max_num_seqs", 0) or 0, getattr(policy, "num_slots", 0) or 0)
        self.hold_at = max(HOLD_WAITING, 4 * reach)

    # -- what another engine core deposits here (simcore/cores: each core fills the same stores) --
    def load_counts(self, num_arrived: int, num_done: int, num_holds: int, prefix_query_tokens: int,
                    prefix_hit_tokens: int) -> None:
        """The counters of a run another core made of this replica (simcore/fastcore.py), set
        by their owner: requests arrived and left, holds, prefix-cache tokens asked and hit."""
        self.lifecycle.num_arrived, self.lifecycle.num_done = num_arrived, num_done
        self.num_holds = num_holds
        self.policy.prefix_query_tokens, self.policy.prefix_hit_tokens = prefix_query_tokens, prefix_hit_tokens

    def fresh_stores(self, records: RequestRecords) -> None:
        """Empty result stores as the simulation made them (their caps, spills and KV
        settings kept), `records` the run's shared request table: another core gave up after
        starting (simcore.cores.CoreUnavailable) and this engine runs the simulation anew."""
        self.lifecycle.records, self.lifecycle.itl = records, Samples()
        old = self.recorder
        self.recorder = StepRecorder(self.spec_cost or self.latency, old.cap)
        self.recorder.kv_capacity, self.recorder.kv_unit, self.recorder.spill = old.kv_capacity, old.kv_unit, old.spill

    def hold_arrivals(self) -> simpy.Event | None:
        """Backpressure for an overloaded run: None while fewer than the hold threshold wait;
        past it, an event that fires once half of them have been admitted. The workload then
        submits what it held, in order, with the arrival times it planned (`submit(request,
        arrival_s)`): requests that deep in a FCFS queue could not have been scheduled sooner,
        so every request's timeline is the same as without holding, and memory stays bounded
        (a held request is a row of the workload's chunk, not a ReqState)."""
        if len(self.lifecycle.waiting) < self.hold_at:
            return None
        if self._drained is None:
            self._drained = self.env.event()
            self.num_holds += 1
        return self._drained

    def wake(self) -> None:
        """Let an idle step loop look again: something outside it changed what it may schedule
        (disaggregated serving: a KV transfer into or out of this instance ended)."""
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.triggered:
            wakeup.succeed()

    @property
    def load(self) -> int:
        """Requests waiting, running or swapped out (what a least-loaded router compares)."""
        return self.lifecycle.num_in_system

    # -- RequestSink ---------------------------------------------------------------------
    def submit(self, request: Request, arrival_s: float | None = None) -> simpy.Event:
        """Queue (or reject) the request; the event succeeds when it leaves (a closed-loop client
        waits on it)."""
        done = self.env.event()
        self._accept(request, arrival_s, done)
        return done

    def send(self, request: Request, arrival_s: float | None = None) -> None:
        """`submit` for a caller that never waits (an open loop): no completion event is made, so
        none is scheduled and processed when the request leaves (an event nobody waits on
        changes nothing: the others keep their times and order)."""
        self._accept(request, arrival_s, None)

    def _accept(self, request: Request, arrival_s: float | None, done: simpy.Event | None) -> None:
        life = self.lifecycle
        st = life.arrive(request, arrival_s, done)
        reason = self.reject_reason(st)
        if reason:
            life.reject(st, reason)
        else:
            life.enqueue(st)
            wakeup = self._wakeup
            if wakeup is not None and not wakeup.triggered:
                wakeup.succeed()

    def reject_reason(self, st) -> str:
        """Why the engine refuses this request on arrival ("" if it does not)."""
        if st.num_prompt_tokens > self.max_model_len:  # vLLM answers 400 for these
            return f"prompt of {st.num_prompt_tokens} tokens exceeds max_model_len {self.max_model_len}"
        return self.policy.check(st)

    # -- the step loop ---------------------------------------------------------------------
    def run(self):
        env, policy, latency, record = self.env, self.policy, self.latency, self.recorder.record
        life = self.lifecycle
        span_of = None if self.exact_steps else getattr(policy, "decode_span", None)
        # pipeline parallelism: micro-batches leave the last stage at different times in a step
        emit_times = getattr(latency, "emit_times_s", None)
        # ASYNC (vllm-v1-async): CPU work hidden behind the GPU's previous step; the first step after
        # the engine idled has none before it, so its CPU work is on the path (`cold`, see _cold_parts)
        pricer = getattr(latency, "base", latency)  # a pipeline's stages are priced by its base model
        overlaps = getattr(pricer, "hidden", None) is not None
        cold = overlaps  # the engine starts idle
        while True:
            plan = policy.schedule(life, env.now)
            if plan is not None and not plan.num_scheduled and plan.num_preempted:
                # preemptions alone: the only running request could not grow while blocks of requests
                # that do not run (KV loading, or kept for a transfer: simcore.disagg) fill the cache.
                # They apply and nothing runs until something changes (vLLM's busy loop would
                # recompute it meanwhile, and be preempted again)
                life.begin_step(plan, env.now)
                if getattr(policy, "host_tier", None) is not None:
                    # with the CPU tier, look again at once: the loads are looked at first, and one
                    # whose KV is in may fit in what the preempted request let go (else a queue
                    # headed by that request waits for blocks the loads hold, with nothing running)
                    continue
                plan = None
            if plan is None:
                cold = overlaps
                self._wakeup = env.event()
                timeout = policy.idle_timeout(life, env.now) if life.waiting else None
                if timeout is None:
                    yield self._wakeup
                else:
                    yield _first_of(env, self._wakeup, env.timeout(timeout))
                self._wakeup = None
                continue
            start = env.now
            life.begin_step(plan, start)
            if self._drained is not None and len(life.waiting) <= self.hold_at // 2:
                self._drained.succeed()
                self._drained = None
            shape = span_of(plan, life) if span_of is not None and not cold else None
            cold_parts = None
            if shape is not None:
                sums, durations, ends = self._span_times(plan, shape, start)
                k = shape.num_steps
                end = float(ends[-1])
                num_waiting = len(life.waiting)
                if num_waiting:  # its head cannot be admitted before the span ends; arrivals queue behind it
                    yield env.timeout(delay_to(start, end))
                else:  # an arrival is planned for at the first step boundary at or after it
                    wakeup = self._wakeup = env.event()
                    yield _first_of(env, wakeup, env.timeout(delay_to(start, end)))
                    self._wakeup = None
                    if wakeup.triggered and env.now < end:
                        k = int(ends.searchsorted(env.now, side="left")) + 1
                        if ends[k - 1] > env.now:
                            yield env.timeout(delay_to(env.now, float(ends[k - 1])))
                latency.count_decode_span(plan.num_decode_seqs, sums[:k])  # only the steps that ran
                # an arrival cut the span at step k < K: step k finishes nobody, so its tokens are
                # emitted in bulk with steps 1..k-1 (stamped now, as a single step would stamp them)
                emitted = 1 < k < shape.num_steps and emit_times is None
                start, dt = self._apply_span(plan, shape, start, durations, ends, k, num_waiting,
                                             env.now if emitted else None)
                if emitted:
                    mem = policy.end_step(plan, [], life)
                    record(start, dt, plan, mem, len(life.running), len(life.waiting), len(life.swapped))
                    continue
            elif plan.spec is not None:  # speculative decoding: verify + draft, tokens in bursts
                if cold:
                    pricer.cold = True
                dt = self.spec_cost.step_time_s(plan) + plan.num_swap_blocks * self.swap_block_s
                if cold:
                    cold, cold_parts = False, self._cold_parts(plan, pricer)
                yield env.timeout(dt)
            else:
                if cold:
                    pricer.cold = True
                dt = latency.step_time_s(
                    plan.num_tokens, plan.prefill_chunks, plan.num_decode_seqs,
                    plan.decode_context_tokens, plan.num_sampled,
                ) + plan.num_swap_blocks * self.swap_block_s
                if cold:
                    cold, cold_parts = False, self._cold_parts(plan, pricer)
                yield env.timeout(dt)
            times = None  # pipeline: each token (and finish) when its micro-batch leaves the last stage
            if emit_times is not None:
                times = emit_times(start + plan.num_swap_blocks * self.swap_block_s, plan.num_scheduled)
            if plan.spec is None:
                finished = life.emit(plan, env.now, times)
            else:
                finished = life.emit_spec(plan, env.now)
            mem = policy.end_step(plan, finished, life)
            if finished:
                life.finish(finished, env.now if times is None else None)
            if cold_parts is None:
                record(start, dt, plan, mem, len(life.running), len(life.waiting), len(life.swapped))
            else:
                self._record_cold(cold_parts, start, dt, plan, mem)

    def _cold_parts(self, plan: StepPlan, pricer) -> tuple[float, float, float]:
        """ASYNC: the (kernels, collectives, host) of the step just priced after an idle engine,
        read now (replicas share a pricer, which keeps only the last step it priced); the pricer
        prices the next steps with their CPU work hidden again."""
        parts = self.recorder._breakdown(plan.num_tokens, plan.prefill_chunks, plan.num_decode_seqs,
                                         plan.decode_context_tokens, plan.num_sampled)
        pricer.cold = False
        return parts

    def _record_cold(self, parts: tuple[float, float, float], start: float, dt: float, plan: StepPlan, mem) -> None:
        """ASYNC: record a step priced after an idle engine with the breakdown it was priced with."""
        life, recorder = self.lifecycle, self.recorder
        breakdown, recorder._breakdown = recorder._breakdown, lambda *_shape: parts
        try:
            recorder.record(start, dt, plan, mem, len(life.running), len(life.waiting), len(life.swapped))
        finally:
            recorder._breakdown = breakdown

    def _span_times(self, plan: StepPlan, shape: SpanShape,
                    start: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Context sums, durations and end times of steps 1..K of a decode span starting at
        `start`. Priced without counting extrapolation: an arrival may cut the span, and the
        steps it did not run are priced again later (the caller counts those that ran)."""
        num_seqs = plan.num_decode_seqs
        sums = context_sums(plan.decode_context_tokens, num_seqs, shape.num_steps)
        durations = self.latency.decode_span_times_s(num_seqs, sums, count=False)
        return sums, durations, boundaries(start, durations)

    def _apply_span(self, plan: StepPlan, shape: SpanShape, start: float, durations: np.ndarray,
                    ends: np.ndarray, k: int, num_waiting: int, emit_at: float | None = None) -> tuple[float, float]:
        """Steps 1..k of a decode span were waited out: apply steps 1..k-1 in bulk (KV, tokens,
        one step-table row) and advance `plan` to step k, which the caller finishes like a
        single step; returns step k's start and duration. `num_waiting`: the queue's length
        when the span started. `emit_at` (k > 1, step k finishes nobody): step k's tokens are
        emitted here too, stamped `emit_at` (the clock at its end), in the same order."""
        life = self.lifecycle
        self.policy.extend_span(plan, k)
        if k > 1:
            n = k - 1
            num_seqs = plan.num_decode_seqs
            if emit_at is None:
                life.emit_span(plan, ends[:n])
            else:
                emit_ends = ends[:k]
                if ends[n] != emit_at:  # the clock landed one ulp late (delay_to)
                    emit_ends = emit_ends.copy()
                    emit_ends[n] = emit_at
                life.emit_span(plan, emit_ends)
            allocated, internal = kv_slots(shape, num_seqs, self.policy.allocator.block_size, n)
            coll_ms, host_ms = decode_step_fixed_ms(self.latency, num_seqs)
            span_durations = durations[:n]
            span_ms = float(np.add.reduce(span_durations)) * 1000.0  # ndarray.sum without its wrapper
            costs = (span_ms - n * (coll_ms + host_ms), n * coll_ms, n * host_ms)
            if getattr(self.latency, "hidden", None) is not None:  # ASYNC: the steps' hidden CPU work past their GPU time
                sums = context_sums(plan.decode_context_tokens, num_seqs, n)
                excess = float(np.add.reduce(self.latency.decode_span_excess_ms(num_seqs, sums)))
                costs = (costs[0] - excess, costs[1], costs[2] + excess)
            self.recorder.record_span(start, span_durations, plan, allocated, internal, len(life.running),
                                      self._waiting_at(num_waiting, float(ends[n - 1])), len(life.swapped), costs)
            start = float(ends[n - 1])
            # the plan now describes step k: every sequence attends to n more tokens
            plan.decode_context_tokens += n * num_seqs
        return start, float(durations[k - 1])

    def _waiting_at(self, num_waiting: int, t: float) -> int:
        """Requests waiting at the end of a span's step that ended at `t`, as a step-by-step run
        records it: the `num_waiting` of the span's start and those that arrived by `t` (a
        span that started with an empty queue ends at the first boundary after an arrival, so
        none did; one with a waiting head may have arrivals queued behind it, at the tail)."""
        waiting = self.lifecycle.waiting
        new = len(waiting) - num_waiting
        if not num_waiting or not new:
            return num_waiting
        return num_waiting + sum(1 for st in islice(reversed(waiting), new) if st.request.arrival_s <= t)


def _first_of(env: simpy.Environment, a: simpy.Event, b: simpy.Event) -> simpy.Event:
    """An event that succeeds once `a` or `b` has been processed: `a | b` without building a
    Condition, and with the same event hops (a or b processed, then this one), so events at
    the same instant are processed in the same order."""
    first = env.event()

    def fire(_event: simpy.Event) -> None:
        if not first.triggered:
            first.succeed()

    a.callbacks.append(fire)
    b.callbacks.append(fire)
    return first
