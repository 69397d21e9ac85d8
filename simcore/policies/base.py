"""The protocol every batching policy implements, and the read-only queues it chooses from.

A policy only chooses: from the queues (read-only) and its own allocator it returns the
step's plan, including the transitions it wants (`StepPlan.preempt/admit/swapped_in`); after
the step it frees, forks or keeps its own KV and reports it. It never writes a request's
status, queue position, timestamps or token counts (`simcore.lifecycle` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from kvsim.simcore.state import ReqState, SlotStore
from kvsim.simcore.step import MemorySnapshot, StepPlan

__all__ = ["MemorySnapshot", "Policy", "Queues", "StepPlan"]


class Queues(Protocol):
    """What a policy may see of a replica's requests; it must not mutate them."""

    @property
    def waiting(self) -> Sequence[ReqState]: ...  # FIFO; recompute-preempted at the front

    @property
    def running(self) -> Sequence[ReqState]: ...  # admission order

    @property
    def swapped(self) -> Sequence[ReqState]: ...  # preempted by swap, FIFO

    @property
    def store(self) -> SlotStore: ...  # counters of queued and running requests, by slot

    def running_slots(self) -> np.ndarray: ...  # slots of `running`, in its order


class Policy(Protocol):
    """A batching policy: admission checks, the step plan, and its own KV accounting."""

    name: str

    def check(self, st: ReqState) -> str:
        """Why this request can never run ("" if it can)."""
        ...

    def schedule(self, queues: Queues, now: float) -> StepPlan | None:
        """The next step, or None when there is nothing to run now."""
        ...

    def idle_timeout(self, queues: Queues, now: float) -> float | None:
        """While idle with requests queued, seconds until the policy wants to look again."""
        ...

    def end_step(self, plan: StepPlan, finished: list[ReqState], queues: Queues) -> MemorySnapshot:
        """The step ran and its tokens were emitted (`finished` produced their last one, and
        are still in `queues.running`). Fork, free or keep KV; return the KV memory as it
        stood at the end of the step, before finished requests let go of it."""
        ...

    def counters(self) -> dict[str, int]:
        """Policy-specific totals for the summary (summed over replicas), e.g. prefix-cache hits."""
        ...
