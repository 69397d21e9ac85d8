"""Data parallelism: several engine replicas behind one router (vLLM's --data-parallel-size).

Each replica is a full engine (its own KV cache, policy and step loop) on `tensor_parallel_size`
GPUs; the router hands every arriving request to one of them:

    round-robin   replicas in turn
    least-loaded  the replica with the fewest requests waiting, running or swapped
                  (ties: the lowest index), as a load balancer that sees queue lengths would

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

    def _pick(self) -> Engine:
        if self.policy == "round-robin":
            engine = self.engines[self._next]
            self._next = (self._next + 1) % len(self.engines)
            return engine
        return min(self.engines, key=lambda e: e.load)

    def submit(self, request: Request) -> simpy.Event:
        return self._pick().submit(request)

    def send(self, request: Request) -> None:
        """`submit` without a completion event (an open loop never waits; see `Engine.send`)."""
        self._pick().send(request)
