"""The Python core: the SimPy reference engine (simcore/engine.py, lifecycle.py, policies/). It
runs every configuration; the others are measured against it (tests/test_fastcore_equivalence.py)."""

from __future__ import annotations

from typing import Any

from kvsim.simcore.cores import PYTHON, Hooks


class PythonCore:
    name = PYTHON

    def supports(self, sim: Any) -> str:
        return ""

    def run(self, sim: Any, hooks: Hooks) -> Any:
        """Step every replica's SimPy process to the end. (Progress is already wired: `prepare`
        gives each replica's lifecycle its share of the callback.)"""
        hooks.install(sim.replicas[0].lifecycle.records)  # one store shared by the replicas
        sim.env.run()
        return sim.arrivals.value  # what the workload's generation counted (None: it counts nothing)
