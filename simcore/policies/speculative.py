"""Continuous batching over a paged KV cache with speculative decoding: vLLM V1's scheduler
(`vllm/v1/core/sched/scheduler.py`) when `--speculative-config` is set.

Every step the drafter proposed k tokens for each running request at the end of the step before;
a decoding request is scheduled for its last sampled token plus those k draft tokens, 1 + k query
tokens that count against the token budget (`max_num_seqs` counts the request once), trimmed to
what the budget has left as vLLM trims `spec_token_ids`:

    computed c | last sampled t | drafts d1 .. dk         -> KV slots for c + 1 + k tokens
    target verifies: d1..da accepted, d(a+1) rejected     -> emits d1..da + its own token: a + 1
    computed c + 1 + a; the k - a rejected slots are freed  (vLLM rolls back num_computed_tokens
                                                            and keeps the blocks for the next step)

How many drafts are accepted is drawn from the policy's own seeded stream, one uniform per draft
position and step (`SpeculativeConfig.sample_accepted`). Prefill chunks are scheduled as in
`continuous.py`; a request that samples a token this step (a decode, a verify, a prompt's last
chunk) drafts for the next, which `simcore.speculative_cost` prices.

Simplifications: drafts are capped at the tokens the request still emits less one (vLLM drafts k
and drops the tokens past max_tokens), so a request's KV never exceeds prompt + output; no
decode spans (every step is planned, priced and emitted on its own); one sequence per request
(parallel sampling and beam search are refused); n-gram always finds k tokens to propose.
"""

from __future__ import annotations

import numpy as np

from kvsim.simcore.block_pool import PagedAllocator
from kvsim.simcore.policies.base import Queues
from kvsim.simcore.policies.continuous import ContinuousPagedPolicy
from kvsim.simcore.sampling import group_width
from kvsim.simcore.speculative import SpeculativeConfig
from kvsim.simcore.state import ReqState
from kvsim.simcore.step import MemorySnapshot, SpecStep, StepPlan


class SpeculativePagedPolicy(ContinuousPagedPolicy):
    name = "continuous-speculative"  # --policy continuous --speculative-config ...
    decode_span = None  # the engine plans every step (acceptance changes each request's pace)

    def __init__(self, allocator: PagedAllocator, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption_mode: str, spec: SpeculativeConfig, rng: np.random.Generator | None = None,
                 enable_prefix_caching: bool = False):
        rng = rng or np.random.default_rng(0)
        super().__init__(allocator, max_num_seqs, max_num_batched_tokens, True, preemption_mode, rng,
                         enable_prefix_caching=enable_prefix_caching)
        self.spec = spec
        self.accept_rng = rng.spawn(1)[0]  # acceptance draws only (the groups' stream stays unused)
        k = spec.num_speculative_tokens
        # totals for the summary (vLLM's spec-decode metrics): drafts = verify steps of a request
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_at = np.zeros(k, dtype=np.int64)  # drafts whose position i was accepted
        self.drafted_at = np.zeros(k, dtype=np.int64)  # drafts that had a position i

    def load_counts(self, num_drafts: int, num_draft_tokens: int, num_accepted_tokens: int,
                    accepted_at: list[int], drafted_at: list[int]) -> None:
        """The spec-decode counters of a run another core made of this replica (simcore/fastcore.py),
        set by their owner as Engine.load_counts sets the engine's: drafts, draft tokens, accepted
        tokens, and per draft position how many drafts had it and had it accepted."""
        k = self.spec.num_speculative_tokens
        assert len(accepted_at) == len(drafted_at) == k, "one count per draft position"
        self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens = num_drafts, num_draft_tokens, num_accepted_tokens
        self.accepted_at = np.array(accepted_at, dtype=np.int64)
        self.drafted_at = np.array(drafted_at, dtype=np.int64)

    def check(self, st: ReqState) -> str:
        if group_width(st) > 1:
            return "parallel sampling and beam search are not modelled with speculative decoding"
        return super().check(st)

    def counters(self) -> dict[str, int]:
        out = super().counters()
        out.update(spec_num_drafts=self.num_drafts, spec_num_draft_tokens=self.num_draft_tokens,
                   spec_num_accepted_tokens=self.num_accepted_tokens)
        for i in range(len(self.accepted_at)):
            out[f"spec_accepted_at_{i}"] = int(self.accepted_at[i])
            out[f"spec_drafted_at_{i}"] = int(self.drafted_at[i])
        return out

    # -- scheduling ------------------------------------------------------------------------
    def _new_plan(self) -> StepPlan:
        plan = super()._new_plan()
        plan.spec = SpecStep()
        return plan

    def schedule(self, queues: Queues, now: float) -> StepPlan | None:
        plan = super().schedule(queues, now)
        if plan is not None:
            self._draw_acceptance(plan)
        return plan

    def _plan_running(self, plan: StepPlan, queues: Queues, budget: int) -> tuple[list[ReqState], int]:
        running = list(queues.running)
        return running, self._schedule_running(plan, running, budget, queues)

    def _schedule_running(self, plan: StepPlan, running: list[ReqState], budget: int, queues: Queues) -> int:
        """Running requests in admission order: a decoding one verifies its drafts, any other
        takes its next prompt chunk; when one cannot get its slots, preempt from the tail
        (itself last). Returns the budget left."""
        alloc, k = self.allocator, self.spec.num_speculative_tokens
        i = 0
        while i < len(running) and budget > 0:
            st = running[i]
            computed, num_tokens, generated = st.num_computed_tokens, st.num_tokens, st.num_generated
            decoding = generated > 0 and num_tokens - computed == 1
            if decoding:  # last sampled token + drafts, no more than the request still emits
                num_drafts = max(0, min(k, st.num_output_target - generated - 1, budget - 1))
                num_new = 1 + num_drafts
            else:
                num_drafts, num_new = 0, min(num_tokens - computed, budget)
            scheduled = alloc.append_slots(st.request_id, num_new)
            while not scheduled:
                victim = running.pop()
                self._preempt(victim, plan)
                if victim is st:
                    break
                scheduled = alloc.append_slots(st.request_id, num_new)
            if not scheduled:
                break
            if num_drafts:
                self._add_verify(plan, st, num_drafts)
            else:
                self._add(plan, st, num_new, 1)
            budget -= num_new
            i += 1
        return budget

    def _add_verify(self, plan: StepPlan, st: ReqState, num_drafts: int) -> None:
        """A decode with drafts: one decode sequence in the plan's counts, its drafts in `spec`."""
        computed = st.num_computed_tokens
        plan.parts.append((st, 1 + num_drafts))
        plan.num_scheduled += 1
        plan.num_tokens += 1
        plan.num_decode_seqs += 1
        plan.decode_context_tokens += computed + 1
        plan.num_sampled += 1
        spec = plan.spec
        spec.verify[st.slot] = (num_drafts, 0)
        spec.verify_chunks.append((1 + num_drafts, computed))
        spec.verify_context_tokens += computed + 1
        spec.num_draft_tokens += num_drafts

    def _add(self, plan: StepPlan, st: ReqState, num_new: int, k: int, num_computed: int | None = None) -> None:
        super()._add(plan, st, num_new, k, num_computed)
        computed = st.num_computed_tokens if num_computed is None else num_computed
        if computed + num_new == st.num_tokens:  # it samples a token, so the drafter runs for it
            plan.spec.num_drafting += 1
            plan.spec.drafting_context_tokens += computed + num_new

    def _draw_acceptance(self, plan: StepPlan) -> None:
        """Sample every verify's accepted drafts (in schedule order) and count them."""
        spec = plan.spec
        if not spec.verify:
            return
        slots = list(spec.verify)
        drafts = np.array([spec.verify[s][0] for s in slots], dtype=np.int64)
        accepted = self.spec.sample_accepted(self.accept_rng, drafts)
        positions = np.arange(len(self.accepted_at))
        self.accepted_at += (accepted[:, None] > positions).sum(axis=0)
        self.drafted_at += (drafts[:, None] > positions).sum(axis=0)
        self.num_drafts += len(slots)
        self.num_draft_tokens += int(drafts.sum())
        self.num_accepted_tokens += int(accepted.sum())
        # verify_chunks are in the same order as `verify`; each drafts next from computed + 1 + accepted
        for s, d, a, (_, computed) in zip(slots, drafts.tolist(), accepted.tolist(), spec.verify_chunks, strict=True):
            spec.verify[s] = (d, a)
            spec.num_drafting += 1
            spec.drafting_context_tokens += computed + 1 + a

    # -- commit ----------------------------------------------------------------------------
    def end_step(self, plan: StepPlan, finished: list[ReqState], queues: Queues) -> MemorySnapshot:
        """Free each verify's rejected tail (its slots past the computed tokens), then as usual."""
        if plan.spec is not None and plan.spec.verify:
            by_slot, alloc = queues.store.by_slot, self.allocator
            for slot in plan.spec.verify:
                st = by_slot[slot]
                alloc.truncate(st.request_id, st.num_computed_tokens)
        return super().end_step(plan, finished, queues)

