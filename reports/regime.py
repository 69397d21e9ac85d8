"""Which regime a run was in: did KV memory bind, or was it compute / policy bound? (DESIGN.md:
"Reports must state which regime a setting is in".)

Measured from the per-step table of one run (`Result.steps`), nothing else:

    peak_kv_use      = max over steps of kv_allocated / capacity_tokens
    kv_blocked_share = sum(duration_s of KV-blocked steps) / sum(duration_s)

A step is KV-blocked when, at its end, work was queued (`num_waiting + num_swapped > 0`) and
either a sequence was preempted in it (a running request could not get a block) or the usable
free KV, `capacity - kv_allocated - kv_external`, was below one allocation unit (1 token for
contiguous reservations, `block_size` tokens for paged blocks). For contiguous reservations
`kv_external` is the free memory in extents too small for the head of the queue, so there the
test is exact: no free extent could hold the next request. For paged blocks the step table does
not record how many blocks the head needs, so only "no block free" counts: a lower bound.

    regime = "memory-bound"                    if peak_kv_use >= 0.95
                                               or kv_blocked_share >= 0.01
                                               or any preemption
             "compute-bound (KV not binding)"  otherwise

The 1% floor keeps a handful of end-of-step instants (the step table is taken before finished
requests free their KV) from labelling a run; both measures are reported beside the label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

MEMORY_BOUND = "memory-bound"
COMPUTE_BOUND = "compute-bound (KV not binding)"
PEAK_KV_THRESHOLD = 0.95  # peak kv_allocated / capacity at or above this: memory binds
BLOCKED_SHARE_THRESHOLD = 0.01  # time share of KV-blocked steps at or above this: memory binds


@dataclass(frozen=True, slots=True)
class Regime:
    """The regime label of one run and the two measures it was decided from."""

    label: str  # MEMORY_BOUND or COMPUTE_BOUND
    peak_kv_use: float  # max kv_allocated / capacity, in [0, 1]
    kv_blocked_share: float  # time-weighted share of KV-blocked steps, in [0, 1]
    num_preempted: int  # preemptions summed over steps


def classify_regime(steps: pd.DataFrame | dict, capacity_tokens: int, paged: bool, block_size: int) -> Regime:
    """Label one run from its step table, a DataFrame or a mapping of numpy columns (see the
    module docstring for the exact rule)."""
    allocated = np.asarray(steps["kv_allocated"])
    if len(allocated) == 0 or capacity_tokens <= 0:
        return Regime(COMPUTE_BOUND, 0.0, 0.0, 0)
    dt = np.asarray(steps["duration_s"])
    queued = (np.asarray(steps["num_waiting"]) + np.asarray(steps["num_swapped"])) > 0
    preempted = np.asarray(steps["num_preempted"]) > 0
    usable_free = capacity_tokens - allocated - np.asarray(steps["kv_external"])
    unit = block_size if paged else 1
    blocked = queued & (preempted | (usable_free < unit))
    total = float(dt.sum())
    share = float(np.dot(blocked, dt)) / total if total > 0 else float(blocked.any())
    peak = float(allocated.max()) / capacity_tokens
    num_preempted = int(np.asarray(steps["num_preempted"]).sum())
    bound = peak >= PEAK_KV_THRESHOLD or share >= BLOCKED_SHARE_THRESHOLD or num_preempted > 0
    return Regime(MEMORY_BOUND if bound else COMPUTE_BOUND, peak, share, num_preempted)


def regime_of(result) -> Regime:
    """The regime of a `simcore.simulate.Result`: from its step table, or, when that table was
    coalesced (a run longer than the step cap), from the same measures the recorder summed over
    every step (`StepTotals`: peak KV, KV-blocked time, preemptions)."""
    paged = result.record["policy"]["allocator"] == "paged"
    capacity = result.memory.num_gpu_tokens
    if getattr(result, "step_labels", None) is not None:  # disaggregated: each pool against its own cache
        return _pools_regime(result, paged)
    if any(r.coalesced for r in result.recorders):
        t = result.totals
        peak = t.kv_allocated_max / capacity if capacity > 0 else 0.0
        share = t.kv_blocked_s / t.duration_s if t.duration_s > 0 else 0.0
        bound = peak >= PEAK_KV_THRESHOLD or share >= BLOCKED_SHARE_THRESHOLD or t.num_preempted > 0
        return Regime(MEMORY_BOUND if bound else COMPUTE_BOUND, peak, share, t.num_preempted)
    return classify_regime(result.step_columns(), capacity, paged, result.memory.block_size)


def _pools_regime(result, paged: bool) -> Regime:
    """A disaggregated run (simcore.disagg): each pool's steps against its own KV capacity; the
    deployment is memory-bound when either pool is, and its peak is the fuller pool's."""
    regimes = []
    for pool in ("prefill", "decode"):
        memory = result.record["disagg"][pool]["memory"]
        tables = [r.columns_kept() for r, (name, _) in zip(result.recorders, result.step_labels, strict=True)
                  if name == pool]
        steps = {k: np.concatenate([t[k] for t in tables]) for k in tables[0]} if tables else {"kv_allocated": []}
        regimes.append(classify_regime(steps, memory["num_gpu_tokens"], paged, memory["block_size"]))
    worst = max(regimes, key=lambda r: (r.label == MEMORY_BOUND, r.peak_kv_use))
    return Regime(worst.label, worst.peak_kv_use, max(r.kv_blocked_share for r in regimes),
                  sum(r.num_preempted for r in regimes))
