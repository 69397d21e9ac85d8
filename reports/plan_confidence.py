"""The probability that a planned deployment meets its SLO, under its profile's stated step-time error.

profiles/uncertainty.py models the error of a profile as one log-normal factor F on every step time
(median 1, sigma from the profile's validation). Metrics only worsen as steps slow down, so a
deployment meets the SLO exactly when F <= F*, the largest factor at which its confirmation run
still passes, and P(meets SLO) = Phi(ln F* / sigma). F* is found by re-running the deployment's
confirmation (same replicas, target rate, requests and seed) with every step time scaled, bisecting
ln F over [-3 sigma, +3 sigma]: the first run at +3 sigma settles the common case (P > 99.8%) in one
run, otherwise BISECTIONS more runs pin F* to 6 sigma / 2^BISECTIONS. The confirmation at the
planning factor (x1, or --confidence's) is a known pass, so the search starts above it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist
from typing import Any

Z_RANGE = 3.0  # search F* within +-3 sigma (P from 0.13% to 99.87%)
BISECTIONS = 5  # runs after the first: F* to 6 sigma / 32, P to about +-3 points near 50%


def _meets(a: Any, replicas: int, target: float, spec_confirm: Any, seed: int, slo: Any, factor: float) -> bool:
    """Whether the deployment's confirmation passes with every step time of its profile x `factor`."""
    from kvsim.profiles import draft_profile
    from kvsim.profiles.uncertainty import scaled_profile
    from kvsim.reports.capacity import rate_scaler, summary_with_goodput
    from kvsim.simcore.simulate import simulate

    c = a.candidate
    config = replace(c.config, data_parallel_size=replicas)
    profile = scaled_profile(a.profile, factor)
    workload = rate_scaler(spec_confirm).at(target)
    result = simulate(c.model, c.gpu, config, workload, profile, seed=seed,
                      draft_profile=draft_profile(c.gpu, config, profile))  # a draft's steps scaled as the target's
    return not slo.failures(summary_with_goodput(result, slo, workload, seed))


def slo_probability(a: Any, replicas: int, target: float, spec_confirm: Any, seed: int, slo: Any,
                    sigma: float, planned_z: float = 0.0) -> dict[str, Any]:
    """{probability, low, high, runs}: P(meets SLO) of `replicas` replicas of assessment `a` at
    `target` req/s, where a.profile already has its step times at z = `planned_z` standard
    deviations (--confidence) and passed its confirmation there."""
    if sigma <= 0:
        return {"probability": 1.0, "low": 1.0, "high": 1.0, "runs": 0}
    phi = NormalDist().cdf

    def meets(z: float) -> bool:  # the step-time factor at z, relative to the planning profile's own
        return _meets(a, replicas, target, spec_confirm, seed, slo, math.exp((z - planned_z) * sigma))

    lo, hi, runs = planned_z, Z_RANGE, 1
    if lo >= hi or meets(hi):
        return {"probability": phi(hi), "low": phi(hi), "high": 1.0, "runs": runs}
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        runs += 1
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return {"probability": phi((lo + hi) / 2), "low": phi(lo), "high": phi(hi), "runs": runs}
