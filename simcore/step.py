"""What one engine step is and what it leaves behind: the data passed between a policy, the
request lifecycle, the engine loop and the metrics. Below all four, so none imports upward.

A policy builds a `StepPlan`: the transitions it chose (preempt, swap in, admit) and the
tokens each scheduled request computes. The lifecycle applies the transitions, the engine
prices the step, the lifecycle emits tokens, and the policy answers with a `MemorySnapshot`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvsim.simcore.state import ReqState, SlotStore


class DecodeRun:
    """Consecutive one-sequence requests that each decode one token, as their `SlotStore`
    slots: the common case of a step, emitted in a few array operations (Lifecycle.emit)."""

    __slots__ = ("slots", "store", "computed")

    def __init__(self, slots: np.ndarray, store: SlotStore, computed: np.ndarray):
        self.slots = slots  # int64 slots, in schedule order
        self.store = store
        self.computed = computed  # their computed tokens before the step

    def states(self) -> list[ReqState]:
        by_slot = self.store.by_slot
        return [by_slot[s] for s in self.slots.tolist()]


@dataclass(slots=True)
class SpecStep:
    """The speculative part of a step (simcore.policies.speculative), written by the policy
    that plans it. Each verifying request computes its last sampled token plus `num_drafts`
    draft tokens (a chunk of 1 + num_drafts query tokens over its computed context); the plan
    counts it as one decode sequence, and the draft tokens only here. `accepted` (sampled when
    the step is planned, from the policy's seeded stream) is what the target will keep: the
    request then emits accepted + 1 tokens at once, and its rejected tail is freed."""

    verify: dict[int, tuple[int, int]] = field(default_factory=dict)  # slot -> (num_drafts, accepted)
    verify_chunks: list[tuple[int, int]] = field(default_factory=list)  # (1 + num_drafts, context before it)
    verify_context_tokens: int = 0  # sum over verifying requests of (computed + 1), in decode_context_tokens
    num_draft_tokens: int = 0  # sum of num_drafts: query tokens beyond the plan's num_tokens
    num_drafting: int = 0  # sequences that sample a token this step and draft for the next
    drafting_context_tokens: int = 0  # their contexts after this step's tokens, summed


@dataclass(slots=True)
class StepPlan:
    """One engine step: the transitions it starts with, who computes how many tokens, and what
    the step costs to run. Written by the policy that builds it; read-only afterwards.

    `parts` lists who computes what, in schedule order (the order tokens are emitted in):
    `(request, new tokens per sequence)` pairs, and `DecodeRun`s of plain decodes."""

    parts: list[tuple[ReqState, int] | DecodeRun] = field(default_factory=list)
    num_scheduled: int = 0  # requests in `parts`
    num_tokens: int = 0  # tokens the GEMMs run over (padded for static batching)
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)  # (chunk, prior context)
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0  # sum over decoding sequences of the context they attend to
    num_sampled: int = 0  # sequences that produce a token (LM head + sampling)
    num_preempted: int = 0
    num_swap_blocks: int = 0  # blocks copied over PCIe (swap out + swap in) before the step
    # transitions, applied by the lifecycle in this order before the step runs
    preempted: list[tuple[ReqState, bool]] = field(default_factory=list)  # (running request, by swap), newest first
    swapped_in: list[ReqState] = field(default_factory=list)  # from the head of `swapped`, in order
    admitted: list[tuple[ReqState, int, int]] = field(default_factory=list)  # (waiting request, cached tokens, output cap or 0)
    spec: SpecStep | None = None  # a speculative-decoding step's drafts and verifies (None: none)

    @property
    def scheduled(self) -> list[tuple[ReqState, int]]:
        """Every (request, new tokens per sequence), runs expanded (for rare paths and tests)."""
        out: list[tuple[ReqState, int]] = []
        for part in self.parts:
            if type(part) is tuple:
                out.append(part)
            else:
                out.extend((st, 1) for st in part.states())
        return out

    def add(self, st: ReqState, num_new: int) -> None:
        """Schedule `num_new` tokens per sequence for the request; the caller prices them."""
        self.parts.append((st, num_new))
        self.num_scheduled += 1

    def add_decode(self, st: ReqState, num_seqs: int) -> None:
        """One new token for each of the request's `num_seqs` sequences; each attends to the
        request's computed tokens plus the token it writes now."""
        self.parts.append((st, 1))
        self.num_scheduled += 1
        self.num_tokens += num_seqs
        self.num_decode_seqs += num_seqs
        self.decode_context_tokens += num_seqs * (st.num_computed_tokens + 1)
        self.num_sampled += num_seqs

    def add_decode_run(self, slots: np.ndarray, store: SlotStore, computed: np.ndarray,
                       context_tokens: int) -> None:
        """`add_decode(st, 1)` for each one-sequence request in `slots`, in order: `computed`
        their computed tokens, `context_tokens` the sum over them of computed + 1."""
        num = len(slots)
        self.parts.append(DecodeRun(slots, store, computed))
        self.num_scheduled += num
        self.num_tokens += num
        self.num_decode_seqs += num
        self.decode_context_tokens += context_tokens
        self.num_sampled += num

    def decode_slots(self) -> np.ndarray:
        """The slots of every DecodeRun, in order (a decode span's batch)."""
        runs = [part.slots for part in self.parts if type(part) is not tuple]
        return runs[0] if len(runs) == 1 else np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)

    def add_prefill(self, st: ReqState, num_new: int, num_computed: int | None = None) -> None:
        """A prompt chunk of `num_new` tokens after `num_computed` already computed ones (the
        request's own count unless it is admitted this step with a cached prefix)."""
        if num_computed is None:
            num_computed = st.num_computed_tokens
        self.parts.append((st, num_new))
        self.num_scheduled += 1
        self.num_tokens += num_new
        self.prefill_chunks.append((num_new, num_computed))
        if num_computed + num_new == st.num_tokens:
            self.num_sampled += 1

    def preempt(self, st: ReqState, by_swap: bool) -> None:
        self.preempted.append((st, by_swap))
        self.num_preempted += 1

    def admit(self, st: ReqState, num_cached_tokens: int = 0, output_cap: int = 0) -> None:
        """Take a waiting request; it starts with `num_cached_tokens` computed (prefix cache)
        and, if `output_cap` > 0, stops after that many output tokens (a static slot)."""
        self.admitted.append((st, num_cached_tokens, output_cap))


@dataclass(slots=True)
class MemorySnapshot:
    """KV memory at the end of a step, in token slots (DESIGN.md, "KV waste"). Reported by
    whoever holds the KV (the paged allocator's policy, or a reservation ledger)."""

    allocated: int  # slots the engine holds for sequences
    live: int  # slots holding computed KV of unfinished sequences
    reserved_future: int = 0  # slots a sequence will still fill
    internal: int = 0  # over-reservation / internal fragmentation: never filled
    stale: int = 0  # held by sequences that already finished (static batching)
    external: int = 0  # free but unusable by the queue because it is not contiguous
    unshared: int = 0  # what `allocated` would be without block sharing (0: no sharing)
