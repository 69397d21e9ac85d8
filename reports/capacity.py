"""Max sustainable rate: the highest arrival rate at which one deployment still meets its SLOs.

The traffic keeps its shape and its seed; only the clock is rescaled. The requests are drawn
once (lengths, prefixes, the arrival pattern) and replayed with every arrival time multiplied
by `base_rate / rate`, so two rates differ only in how fast the same requests arrive (for
Poisson traffic this is exactly what `kvsim run --rate R` with the same seed draws).

The search runs on a fixed geometric grid of rates, r_k = (1 + tolerance)^k req/s, the same
for every deployment and SLO:

    bracket:  from a starting guess, double (or halve) until one rate passes and one fails
    bisect:   on the grid index between them, until the two are neighbours

so the answer r_lo passed and r_lo * (1 + tolerance) failed: the true boundary lies in
[r_lo, r_lo * (1 + tolerance)). Every run is kept and reused. Because the grid does not depend
on the deployment or the SLO, a pass/fail that is monotone in the rate gives an answer that
is monotone too: a looser SLO or a faster GPU never lands on a lower grid point.

A rate passes when the run was not overloaded (simcore.metrics.saturation) and every SLO held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from simcore.errors import ConfigError
from simcore.request import RequestSink

DEFAULT_TOLERANCE = 0.02  # relative width of the answer's bracket
GOODPUT_ATTAINMENT = 0.9  # share of requests that must meet every per-request SLO; DistServe
# (Zhong et al., OSDI 2024, section 2.2) sizes deployments for 90% SLO attainment
MAX_HALVINGS = 8  # below start / 2^8 a deployment "sustains nothing" (its SLO fails when idle)


@dataclass(frozen=True, slots=True)
class SLO:
    """What a run must meet; None / empty means that target is not asked for."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    goodput_ms: tuple[tuple[str, float], ...] = ()  # per-request SLOs (vLLM --goodput)
    goodput_attainment: float = GOODPUT_ATTAINMENT  # in (0, 1]

    def failures(self, summary: dict[str, Any]) -> list[str]:
        """Why a run fails (empty: it passes); the first reason is the binding one."""
        reasons = []
        if summary.get("saturation") == "overloaded":
            reasons.append(
                f"overloaded (completed {summary['completed_rate_warm']:.2f} of "
                f"{summary['offered_rate']:.2f} req/s offered)"
            )
        for key, limit, name in (("p95_ttft_ms", self.ttft_p95_ms, "TTFT p95"),
                                 ("p95_tpot_ms", self.tpot_p95_ms, "TPOT p95")):
            value = summary.get(key)
            if limit is not None and (value is None or value > limit):
                shown = "n/a" if value is None else f"{value:,.1f}"
                reasons.append(f"{name} {shown} ms > {limit:g} ms")
        if self.goodput_ms:
            share = summary.get("goodput_share") or 0.0
            if share < self.goodput_attainment:
                reasons.append(f"{100 * share:.1f}% of requests meet every per-request SLO "
                               f"< {100 * self.goodput_attainment:g}%")
        return reasons

    def describe(self) -> dict[str, Any]:
        return {"ttft_p95_ms": self.ttft_p95_ms, "tpot_p95_ms": self.tpot_p95_ms,
                "goodput_ms": dict(self.goodput_ms),
                "goodput_attainment": self.goodput_attainment if self.goodput_ms else None}

    def text(self) -> str:
        parts = [f"{name} <= {v:g} ms" for name, v in (("TTFT p95", self.ttft_p95_ms),
                                                         ("TPOT p95", self.tpot_p95_ms)) if v is not None]
        if self.goodput_ms:
            pairs = " ".join(f"{k}:{v:g}" for k, v in self.goodput_ms)
            parts.append(f"{100 * self.goodput_attainment:g}% of requests within {pairs} ms")
        return ", ".join(parts) or "no latency SLO (sustained load only)"


# -- the same requests at any rate ------------------------------------------------------------


def nominal_rate(spec, arrays) -> float:
    """The mean arrival rate a workload is described at (what --rate sets)."""
    from workloads.arrivals import FixedRateArrivals, GammaArrivals, PiecewiseRateArrivals, TraceArrivals

    arrival = spec.arrival
    if isinstance(arrival, (GammaArrivals, FixedRateArrivals)):
        return float(arrival.rate)
    if isinstance(arrival, PiecewiseRateArrivals):
        return arrival.mean_rate
    if isinstance(arrival, TraceArrivals):
        rate = (arrays.stats.get("trace") or {}).get("replay_rate")
        if rate:
            return float(rate)
    raise ConfigError(
        f"workload {spec.name}: a rate search needs open-loop arrivals at a rate (Poisson, gamma, "
        f"fixed, piecewise or a trace with timestamps), not '{arrival.describe()['process']}'"
    )


class RateScaler:
    """One workload's requests drawn once per seed, replayed at any mean rate (see the module
    docstring). `at(rate)` is a `simcore.request.Workload`."""

    def __init__(self, spec, take: int | None = None):
        self.spec = spec
        self.take = take  # replay only this many: the first arrival times, lengths spread over all
        self._drawn: dict[tuple, tuple[Any, float]] = {}  # seed key -> (arrays, nominal rate)

    def draw(self, seed: np.random.SeedSequence):
        key = (seed.entropy, tuple(seed.spawn_key))
        if key not in self._drawn:
            arrays = self.spec.generate(seed)
            if arrays.arrival_s is None:
                raise ConfigError(f"workload {self.spec.name}: a rate search needs open-loop arrivals, "
                                  "not a closed loop of clients")
            self._drawn[key] = (self._subset(arrays), nominal_rate(self.spec, arrays))
        return self._drawn[key]

    def _subset(self, arrays):
        """`take` requests that stand for all of them: the arrival pattern's first `take` times
        (same process, same rate) with the lengths of requests spread evenly over the whole
        draw, so a short run sees the same mix of prompts and outputs as the long one (a trace's
        later rows can differ from its first ones)."""
        count = len(arrays.num_prompt_tokens)
        if self.take is None or self.take >= count:
            return arrays
        import dataclasses

        rows = np.linspace(0, count - 1, self.take).round().astype(np.int64)
        fields = ("num_prompt_tokens", "num_output_tokens", "max_tokens", "n", "beam_width", "prefix_id",
                  "num_prefix_tokens")
        return dataclasses.replace(arrays, arrival_s=arrays.arrival_s[:self.take],
                                   think_s=None, **{f: getattr(arrays, f)[rows] for f in fields})

    def at(self, rate: float) -> ScaledWorkload:
        if not (rate > 0 and math.isfinite(rate)):
            raise ConfigError(f"rate must be a finite number > 0, got {rate}")
        return ScaledWorkload(self, rate)


@dataclass
class ScaledWorkload:
    """The scaler's requests with arrival times scaled to `rate` req/s on average."""

    scaler: RateScaler
    rate: float
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.scaler.spec.name

    @property
    def num_requests(self) -> int:
        return int(self.scaler.take or self.scaler.spec.num_requests)

    def process(self, env, sink: RequestSink, seed: np.random.SeedSequence):
        from workloads.arrivals import open_loop_process

        arrays, base = self.scaler.draw(seed)
        yield from open_loop_process(env, sink, [(arrays.to_requests(), arrays.arrival_s * (base / self.rate))])
        return arrays.stats  # the whole draw's counts

    def notes(self, stats: dict[str, Any] | None = None) -> list[str]:
        return self.scaler.spec.notes(stats)

    def warnings(self, stats: dict[str, Any] | None = None) -> list[str]:
        return self.scaler.spec.warnings(stats)

    def describe(self, stats: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**self.scaler.spec.describe(stats), "rescaled_to_rate": self.rate}


# -- the search -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One run of the search: the rate, whether it passed and why not."""

    rate: float
    passed: bool
    reasons: tuple[str, ...]
    summary: dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Capacity:
    """The answer of one search. `max_rate` passed; `max_rate * (1 + tolerance)` failed (unless
    `at_least`, when the search stopped at `rate_cap` still passing); 0 if nothing passed."""

    max_rate: float
    tolerance: float
    points: tuple[RatePoint, ...]  # every run, by rate
    at_least: bool = False  # the ceiling was reached without a failure
    binding: str = ""  # why the first failing rate above max_rate failed
    below_floor: float = 0.0  # > 0: stopped early, the deployment sustains less than this

    @property
    def num_runs(self) -> int:
        return len(self.points)


def grid_rate(k: int, tolerance: float) -> float:
    return (1.0 + tolerance) ** k


def grid_index(rate: float, tolerance: float) -> int:
    return int(math.floor(math.log(rate) / math.log1p(tolerance) + 1e-9))


def max_sustainable_rate(
    evaluate: Callable[[float], dict[str, Any]],
    slo: SLO,
    start_rate: float,
    tolerance: float = DEFAULT_TOLERANCE,
    rate_cap: float | None = None,
    rate_floor: float = 0.0,
    first_step: int | None = None,
) -> Capacity:
    """Bracket then bisect on the rate grid (module docstring); `evaluate(rate)` runs the
    deployment at `rate` and returns its summary. Each grid rate is run at most once. A failure
    at or below `rate_floor` ends the search with `below_floor` (the caller does not care how
    much less than that the deployment sustains). `first_step` (grid steps) starts the bracket
    small when `start_rate` is a good guess; the steps double up to a factor of 2 in rate."""
    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance must be in (0, 1), got {tolerance}")
    if not (start_rate > 0 and math.isfinite(start_rate)):
        raise ConfigError(f"start rate must be > 0, got {start_rate}")
    seen: dict[int, RatePoint] = {}

    def passes(k: int) -> bool:
        if k not in seen:
            rate = grid_rate(k, tolerance)
            summary = evaluate(rate)
            reasons = slo.failures(summary)
            seen[k] = RatePoint(rate, not reasons, tuple(reasons), summary)
        return seen[k].passed

    def done(lo: int | None, at_least: bool = False) -> Capacity:
        points = tuple(seen[k] for k in sorted(seen))
        above = [seen[k] for k in sorted(seen) if lo is None or k > lo]
        binding = next((p.reasons[0] for p in above if not p.passed), "")
        return Capacity(0.0 if lo is None else grid_rate(lo, tolerance), tolerance, points, at_least, binding)

    doubling = max(1, math.ceil(math.log(2.0) / math.log1p(tolerance)))
    step = doubling if first_step is None else max(1, min(first_step, doubling))
    floor_k = math.ceil(math.log(rate_floor) / math.log1p(tolerance) - 1e-9) if rate_floor > 0 else None
    k = grid_index(start_rate, tolerance)
    top = grid_index(rate_cap, tolerance) if rate_cap else None
    bottom = grid_index(start_rate / 2**MAX_HALVINGS, tolerance)
    if passes(k):
        lo = k
        while True:
            hi = lo + step
            step = min(2 * step, doubling)  # gallop: a good guess costs few runs, a bad one log2 more
            if top is not None and hi >= top:
                hi = top
                if hi <= lo:
                    return done(lo, at_least=True)
                if passes(hi):
                    return done(hi, at_least=True)
                break
            if not passes(hi):
                break
            lo = hi
    else:
        hi = k
        while True:
            lo = hi - step
            step = min(2 * step, doubling)
            if floor_k is not None and lo < floor_k:  # below the floor nothing matters: try it
                if floor_k >= hi or not passes(floor_k):
                    return replace(done(None), below_floor=grid_rate(min(hi, floor_k), tolerance))
                lo = floor_k
                break
            if lo < bottom:
                return done(None)
            if passes(lo):
                break
            hi = lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if floor_k is not None and lo < floor_k < hi:
            mid = floor_k  # first settle whether the answer can reach the floor at all
        if passes(mid):
            lo = mid
        else:
            hi = mid
            if floor_k is not None and hi <= floor_k:
                return replace(done(None), below_floor=grid_rate(hi, tolerance))
    return done(lo)


def summary_with_goodput(result, slo: SLO) -> dict[str, Any]:
    """A run's summary plus goodput against the SLO's per-request targets, if any."""
    from simcore.metrics import goodput

    summary = dict(result.summary)
    if slo.goodput_ms:
        summary.update(goodput(result.requests, dict(slo.goodput_ms), summary["duration_s"]))
    return summary


def simulator(model, gpu, config, spec, profile, seed: int, slo: SLO) -> Callable[[float], dict[str, Any]]:
    """`evaluate(rate)` for one deployment: simulate it serving `spec` rescaled to `rate`."""
    from simcore.simulate import simulate

    scaler = RateScaler(spec)

    def evaluate(rate: float) -> dict[str, Any]:
        return summary_with_goodput(simulate(model, gpu, config, scaler.at(rate), profile, seed=seed), slo)

    return evaluate
