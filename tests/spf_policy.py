"""A toy policy to show what adding one takes: shortest-prompt-first admission over the paged
allocator (vLLM's loop otherwise). One module plus the registration line at the bottom; no
change to the CLI, reports or profiles."""

from __future__ import annotations

from kvsim.simcore.policies import PolicySpec, paged_allocator, register
from kvsim.simcore.policies.continuous import ContinuousPagedPolicy


class _ShortestFirst:
    """The policy's view of the queues: waiting ordered by tokens to prefill, then arrival."""

    def __init__(self, queues):
        self.running, self.swapped = queues.running, queues.swapped
        self.store, self.running_slots = queues.store, queues.running_slots  # running requests' counters
        self.waiting = sorted(queues.waiting, key=lambda st: (st.num_tokens, st.request_id))


class ShortestPromptFirstPolicy(ContinuousPagedPolicy):
    name = "spf"

    def schedule(self, queues, now):
        return super().schedule(_ShortestFirst(queues), now)


def _build(cfg, rng):
    e = cfg.engine
    return ShortestPromptFirstPolicy(paged_allocator(cfg), e.max_num_seqs, cfg.max_num_batched_tokens, True, "recompute", rng)


register(PolicySpec("spf", "paged", "toy: vLLM's loop, shortest waiting prompt admitted first", _build))
