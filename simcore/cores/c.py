"""The compiled core: simcore/csrc/engine.c, driven by simcore/fastcore.py (which feeds it the
workload in chunks and empties its output buffers into the run's stores).

It runs a simulation when two lists agree: the policy variant's registry entry names every
engine option set off its default among those the C core honours (`PolicySpec.cores`, an
allow-list: a new option is refused until it is listed, with an equivalence test), and the
driver supports the simulation's shape (`fastcore.unsupported`: one replica, open-loop arrays,
no shared prefixes with prefix caching, beam width 1 (n > 1 on the paged continuous policies:
csrc/seqgroup.c), the library loaded).
"""

from __future__ import annotations

from typing import Any

from kvsim.simcore.cores import CoreUnavailable, Hooks, refused_options


class CCore:
    name = "c"

    def supports(self, sim: Any) -> str:
        from kvsim.simcore import fastcore

        reason = fastcore.unsupported(sim)  # the simulation's shape first: its reasons are the most specific
        if reason:
            return reason
        if sim.config is None:
            return "a simulation without a resolved configuration"
        if sim.config.policy.core_options(self.name) is None:
            return (f"policy {sim.replicas[0].policy.name} (the C core runs continuous batching over the paged "
                    "allocator)")
        return refused_options(self.name, sim.config)

    def run(self, sim: Any, hooks: Hooks) -> Any:
        from kvsim.simcore import fastcore

        hooks.install(sim.replicas[0].lifecycle.records)
        try:
            return fastcore.run(sim, hooks.progress)
        except fastcore.CoreUnavailable as exc:
            raise CoreUnavailable(str(exc), exc.clean) from None
