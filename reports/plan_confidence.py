"""The probability that a planned deployment meets its SLO, under its profile's stated step-time error.

profiles/uncertainty.py models the error of a profile as step-time factors (prefill and decode, each
log-normal with median 1) that all rise with one standard normal z. Metrics only worsen as steps
slow down, so a deployment meets the SLO exactly when z <= z*, the largest z at which its
confirmation run still passes, and P(meets SLO) = Phi(z*). z* is found by re-running the
deployment's confirmation (same replicas, target rate, requests and seed) with its step times at z,
bisecting z over [-3, +3]: the first run at +3 settles the common case (P > 99.8%) in one run,
otherwise BISECTIONS more runs pin z* to 6 / 2^BISECTIONS. The confirmation at the planning z (0,
or --confidence's) is a known pass, so the search starts above it.

Runs whose answer is already known are not made (the answer, the bisection's points and its
bounds are those of making every run):
* a re-run stops as soon as the requests that left prove a target missed (reports.capacity's
  early stop, honoured by both engine cores): only pass or fail is read from it;
* a point above the margin of a passing run is a known failure. When every duration of a run is
  a step time (or a gap between arrivals), scaling the step times by G is the same run at G times
  the arrival rate with every duration x G, so a time percentile at F x G is at least G times its
  value at F as long as latency does not fall as load rises (what a rate search assumes): a run
  passing at F with a target's value v and limit L bounds F* <= F x L / v. With the prefill and
  decode factors apart, z* is at most the z where both have grown by L / v from the passing run's
  (StepTimeError.z_above: a step slowed more than that only worsens the metrics). Not used where
  other durations enter (pipeline hand-offs, KV offloading or swapping over PCIe, batching timeouts).
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist
from typing import Any

Z_RANGE = 3.0  # search z* within +-3 (P from 0.13% to 99.87%)
BISECTIONS = 5  # runs after the first: z* to 6 / 32, P to about +-3 points near 50%
CAP_SLACK = 1e-9  # z above a margin's bound by less than this is still run (the bound's own rounding)


def _meets(a: Any, replicas: int, target: float, spec_confirm: Any, seed: int, slo: Any,
           factor: Any) -> tuple[bool, dict[str, Any]]:
    """Whether the deployment's confirmation passes with its profile's step times x `factor`
    (profiles.uncertainty.PhaseFactors), and its summary (that of a run stopped early once it
    provably fails)."""
    from kvsim.profiles.uncertainty import scaled_profile
    from kvsim.reports.capacity import rate_scaler, run_against

    c = a.candidate
    config = replace(c.config, data_parallel_size=replicas)
    profile = scaled_profile(a.profile, factor)  # (a draft model's steps are scaled as the target's)
    workload = rate_scaler(spec_confirm).at(target)
    summary = run_against(c.model, c.gpu, config, workload, profile, seed, slo, early_stop=True)
    return not slo.failures(summary), summary


def stretches_with_steps(config: Any) -> bool:
    """Whether every duration of a run of `config` is a step time or an arrival gap (see the
    module docstring): no pipeline hand-offs, KV offloading, swap preemption or batching timeout."""
    return (config.pipeline_parallel_size == 1 and config.kv_offloading_size is None
            and config.preemption_mode == "recompute" and config.policy == "continuous")


def slo_probability(a: Any, replicas: int, target: float, spec_confirm: Any, seed: int, slo: Any,
                    error: Any, planned_z: float = 0.0, planned: dict[str, Any] | None = None) -> dict[str, Any]:
    """{probability, low, high, runs}: P(meets SLO) of `replicas` replicas of assessment `a` at
    `target` req/s under `error` (profiles.uncertainty.StepTimeError), where a.profile already has
    its step times at z = `planned_z` (--confidence) and passed its confirmation there; `planned`:
    that confirmation's summary (its time percentiles bound z*, see the module docstring), None when
    not known or when the run's durations are not all step times (stretches_with_steps)."""
    from kvsim.profiles.uncertainty import PhaseFactors

    if error.sigma <= 0:
        return {"probability": 1.0, "low": 1.0, "high": 1.0, "runs": 0}
    at_plan = error.factor(planned_z)
    phi = NormalDist().cdf
    cap = math.inf  # z* <= cap: above it a point is a known failure
    runs = 0

    def bound(z: float, summary: dict[str, Any]) -> None:
        nonlocal cap
        for t in slo.targets:
            value = summary.get(t.key)
            if value is not None and value > 0 and math.isfinite(value):
                cap = min(cap, error.z_above(z, math.log(t.limit_ms / value)))

    def meets(z: float) -> bool:  # the step-time factor at z, relative to the planning profile's own
        nonlocal runs
        if z > cap + CAP_SLACK:
            return False
        runs += 1
        f = error.factor(z)  # relative to the planning profile's own
        passed, summary = _meets(a, replicas, target, spec_confirm, seed, slo,
                                 PhaseFactors(f.prefill / at_plan.prefill, f.decode / at_plan.decode))
        if passed and planned is not None:
            bound(z, summary)
        return passed

    if planned is not None:
        bound(planned_z, planned)
    lo, hi = planned_z, Z_RANGE
    if lo >= hi or meets(hi):
        return {"probability": phi(hi), "low": phi(hi), "high": 1.0, "runs": runs}
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return {"probability": phi((lo + hi) / 2), "low": phi(lo), "high": phi(hi), "runs": runs}
