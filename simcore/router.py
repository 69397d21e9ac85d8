"""Data parallelism: several engine replicas behind one router (vLLM's --data-parallel-size).

Each replica is a full engine (its own KV cache, policy and step loop) on `tensor_parallel_size`
GPUs; the router hands every arriving request to one of them:

    round-robin       replicas in turn
    least-loaded      the replica with the fewest requests waiting, running or swapped
                      (ties: the lowest index), as a load balancer that sees queue lengths would
    session-affinity  a conversation's turns all go to the replica its first turn went to
                      (least-loaded); other requests least-loaded
    prefix-aware      llm-d's precise prefix-cache-aware scheduling: each replica is scored by
                      the share of the prompt's blocks it holds (GPU prefix cache, then its
                      CPU tier: a conversation turn's chained hashes, or the blocks of a
                      declared shared prefix as the paged policy caches them), its free KV
                      and its queue, weighted 2 : 1 : 1 as llm-d's guide configures
                      precise-prefix-cache-scorer, kv-cache-utilization-scorer and
                      queue-scorer (guides/precise-prefix-cache-aware); the highest score
                      wins (ties: the lowest index). Scores read the replicas' real caches, as
                      llm-d's index does from vLLM's KV events, without their delay.

The router is a RequestSink, so workloads (closed loops included) drive it like one engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.simcore.engine import Engine
from kvsim.simcore.request import Request
from kvsim.simcore.specs import ROUTERS

if TYPE_CHECKING:  # annotations only: SimPy is imported by the Python engine (simcore.simulate)
    import simpy


class Router:
    """Dispatches requests over replicas; deterministic for the same arrivals."""

    def __init__(self, engines: list[Engine], policy: str = "least-loaded"):
        assert engines and policy in ROUTERS
        self.engines = engines
        self.policy = policy
        self._next = 0  # round-robin cursor
        self._affinity: dict[int, Engine] = {}  # session id -> its replica (session-affinity)

    def _pick(self, request: Request) -> Engine:
        if self.policy == "round-robin":
            engine = self.engines[self._next]
            self._next = (self._next + 1) % len(self.engines)
            return engine
        if self.policy == "prefix-aware" and (request.tokens is not None or request.prefix_id is not None):
            return self._best_prefix(request)
        if self.policy == "session-affinity" and request.session_id >= 0:
            engine = self._affinity.get(request.session_id)
            if engine is None:
                engine = self._affinity[request.session_id] = min(self.engines, key=lambda e: e.load)
            return engine
        return min(self.engines, key=lambda e: e.load)

    def _best_prefix(self, request: Request) -> Engine:
        """The replica with the highest weighted score (module docstring)."""
        queues = [len(e.lifecycle.waiting) for e in self.engines]
        low, high = min(queues), max(queues)
        best, best_score = self.engines[0], -1.0
        for engine, queue in zip(self.engines, queues, strict=True):
            prefix, kv_free = prefix_share(engine, request)
            queue_score = (high - queue) / (high - low) if high > low else 1.0  # min-max, as queue-scorer
            score = PREFIX_WEIGHT * prefix + KV_WEIGHT * kv_free + QUEUE_WEIGHT * queue_score
            if score > best_score:
                best, best_score = engine, score
        return best

    def submit(self, request: Request) -> simpy.Event:
        return self._pick(request).submit(request)

    def send(self, request: Request) -> None:
        """`submit` without a completion event (an open loop never waits; see `Engine.send`)."""
        self._pick(request).send(request)


# llm-d guides/precise-prefix-cache-aware EndpointPickerConfig: precise-prefix-cache-scorer
# weight 2.0, kv-cache-utilization-scorer 1.0, queue-scorer 1.0, then max-score-picker
PREFIX_WEIGHT, KV_WEIGHT, QUEUE_WEIGHT = 2.0, 1.0, 1.0


def prefix_share(engine: Engine, request: Request) -> tuple[float, float]:
    """(share of the prompt's full blocks the replica holds as a prefix, GPU cache then CPU tier;
    share of its GPU KV blocks free, cached-but-unreferenced ones included as vLLM's usage counts
    them). A policy without a paged prefix cache holds nothing."""
    policy = engine.policy
    alloc = getattr(policy, "allocator", None)
    if not hasattr(alloc, "num_cached_prefix_blocks"):
        return 0.0, 0.0
    kv_free = alloc.num_free_blocks / alloc.num_gpu_blocks
    num_blocks = request.num_prompt_tokens // alloc.block_size
    if not num_blocks or not getattr(policy, "enable_prefix_caching", False):
        return 0.0, kv_free
    if request.tokens is not None:  # a conversation turn: its chained block hashes
        hashes = request.tokens.block_hashes(alloc.block_size, num_blocks)
    else:  # a declared shared prefix: block i of prefix p is cached as (p, i) (ContinuousPagedPolicy)
        hashes = [(request.prefix_id, i) for i in range(request.num_prefix_tokens // alloc.block_size)]
    hits = alloc.num_cached_prefix_blocks(hashes)
    tier = getattr(policy, "host_tier", None)
    if tier is not None:
        hits += tier.num_hits(hashes, hits)
    return hits / num_blocks, kv_free
