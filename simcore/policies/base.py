"""What every batching policy hands the engine each step, and the protocol it implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from simcore.state import ReqState


@dataclass(slots=True)
class StepPlan:
    """One engine step: who computes how many tokens, and what the step costs to run."""

    scheduled: list[tuple[ReqState, int]] = field(default_factory=list)  # (request, new tokens per seq)
    num_tokens: int = 0  # tokens the GEMMs run over (padded for static batching)
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)  # (chunk, prior context)
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0  # sum over decoding sequences of the context they attend to
    num_sampled: int = 0  # sequences that produce a token (LM head + sampling)
    num_preempted: int = 0
    num_swap_blocks: int = 0  # blocks copied over PCIe (swap out + swap in) before the step

    def add_decode(self, st: ReqState, num_seqs: int) -> None:
        self.scheduled.append((st, 1))
        self.num_tokens += num_seqs
        self.num_decode_seqs += num_seqs
        self.decode_context_tokens += num_seqs * (st.num_computed_tokens + 1)
        self.num_sampled += num_seqs

    def add_prefill(self, st: ReqState, num_new: int) -> None:
        self.scheduled.append((st, num_new))
        self.num_tokens += num_new
        self.prefill_chunks.append((num_new, st.num_computed_tokens))
        if st.num_computed_tokens + num_new == st.num_tokens:
            self.num_sampled += 1


@dataclass(slots=True)
class MemorySnapshot:
    """KV memory at the end of a step, in token slots (DESIGN.md, "KV waste")."""

    allocated: int  # slots the engine holds for sequences
    live: int  # slots holding computed KV of unfinished sequences
    reserved_future: int = 0  # slots a sequence will still fill
    internal: int = 0  # over-reservation / internal fragmentation: never filled
    stale: int = 0  # held by sequences that already finished (static batching)
    external: int = 0  # free but unusable by the queue because it is not contiguous
    unshared: int = 0  # what `allocated` would be without block sharing (0: no sharing)


class Policy(Protocol):
    """A batching policy: decides each step, owns admission and KV accounting."""

    name: str

    def check(self, st: ReqState) -> str:
        """Why this request can never run ("" if it can)."""
        ...

    def schedule(self, now: float) -> StepPlan | None:
        """The next step, or None when there is nothing to run now."""
        ...

    def idle_timeout(self, now: float) -> float | None:
        """While idle with requests queued, seconds until the policy wants to look again."""
        ...

    def apply(self, plan: StepPlan, now: float) -> MemorySnapshot:
        """Commit a finished step: emit tokens, finish requests, free their KV. Returns the KV
        memory as it stood at the end of the step, before finished requests let go of it."""
        ...
