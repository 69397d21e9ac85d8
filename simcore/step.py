"""What one engine step is and what it leaves behind: the data passed between a policy, the
request lifecycle, the engine loop and the metrics. Below all four, so none imports upward.

A policy builds a `StepPlan`: the transitions it chose (preempt, swap in, admit) and the
tokens each scheduled request computes. The lifecycle applies the transitions, the engine
prices the step, the lifecycle emits tokens, and the policy answers with a `MemorySnapshot`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simcore.state import ReqState


@dataclass(slots=True)
class StepPlan:
    """One engine step: the transitions it starts with, who computes how many tokens, and what
    the step costs to run. Written by the policy that builds it; read-only afterwards."""

    scheduled: list[tuple[ReqState, int]] = field(default_factory=list)  # (request, new tokens per seq)
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

    def add_decode(self, st: ReqState, num_seqs: int) -> None:
        """One new token for each of the request's `num_seqs` sequences; each attends to the
        request's computed tokens plus the token it writes now."""
        self.scheduled.append((st, 1))
        self.num_tokens += num_seqs
        self.num_decode_seqs += num_seqs
        self.decode_context_tokens += num_seqs * (st.num_computed_tokens + 1)
        self.num_sampled += num_seqs

    def add_prefill(self, st: ReqState, num_new: int, num_computed: int | None = None) -> None:
        """A prompt chunk of `num_new` tokens after `num_computed` already computed ones (the
        request's own count unless it is admitted this step with a cached prefix)."""
        if num_computed is None:
            num_computed = st.num_computed_tokens
        self.scheduled.append((st, num_new))
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
