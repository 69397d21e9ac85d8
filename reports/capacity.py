"""Max sustainable rate: the highest arrival rate at which one deployment still meets its SLOs.

The traffic keeps its shape and its seed; only the clock is rescaled. The requests are drawn
once (lengths, prefixes, the arrival pattern) and replayed with every arrival time multiplied
by `base_rate / rate`, so two rates differ only in how fast the same requests arrive (for
Poisson traffic this is exactly what `kvsim run --rate R` with the same seed draws).

The search runs on a fixed geometric grid of rates, r_k = (1 + tolerance)^k req/s, the same
for every deployment and SLO:

    bracket:  from a starting guess, move up (or down) until one rate passes and one fails
    narrow:   on the grid index between them, until the two are neighbours

Where each move goes is guided by the runs' margins (`SLO.margin`: the worst p95 / limit):
log(margin) is close to linear in log(rate) away from saturation, so the next rate is where
the last runs' line crosses the limit (a secant inside the bracket, extrapolation outside it,
at most a doubling or halving per move); without margins it doubles (halves) and bisects. A
guessed run that fails to halve the bracket is followed by a bisection. The guide changes only
which rates are run, never the answer's meaning: the answer r_lo passed and r_lo * (1 + tolerance) failed: the true boundary lies in
[r_lo, r_lo * (1 + tolerance)) (r_lo is the highest passing rate below the lowest failing
one, so noise that makes pass/fail non-monotone cannot put a failure under the answer). Every
run is kept and reused. Because the grid does not depend
on the deployment or the SLO, a pass/fail that is monotone in the rate gives an answer that
is monotone too: a looser SLO or a faster GPU never lands on a lower grid point.

A rate passes when the run was judged not overloaded (simcore.metrics.saturation: `sustained`;
`n/a`, a run too short to tell, fails) and every SLO held. SLOs are percentile targets of any
metric vLLM reports (TTFT, TPOT, ITL, E2EL) at any percentile (`Target`: --slo ttft:p99:800),
plus per-request goodput (vLLM's --goodput).

A multi-turn session workload is scaled in sessions/s (SessionRateScaler): only the session start
times are rescaled; each session's turns still wait for their answers plus their think times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvsim.simcore.errors import ConfigError
from kvsim.simcore.metrics import OVERLOAD_WAIT_SLOPE, p_word
from kvsim.simcore.request import RequestSink
from kvsim.workloads.sessions import STEADY_LIFETIMES

DEFAULT_TOLERANCE = 0.02  # relative width of the answer's bracket
GOODPUT_ATTAINMENT = 0.9  # share of requests that must meet every per-request SLO; DistServe
# (Zhong et al., OSDI 2024, section 2.2) sizes deployments for 90% SLO attainment
MAX_HALVINGS = 8  # below start / 2^8 a deployment "sustains nothing" (its SLO fails when idle)
# ... unless its lowest run was overloaded: that says the start was too high, not that it sustains
# nothing (`kvsim run --find-max-rate --rate 1e9` printed "No rate meets the SLO" at 6.7M req/s
# for a replica that sustains ~150); the search halves on, down to start / 2^40 at most
MAX_OVERLOADED_HALVINGS = 40
# Above start x 2^20 the search stops with "at least" that rate: a run too short to overload (a
# few requests), or no SLO to miss, would otherwise double the rate until it overflows.
MAX_DOUBLINGS = 20
# d ln(margin) / d ln(rate) assumed for a first move from a single run: the TTFT / TPOT p95 of
# the planner's 70B runs (README "Planning") rise 1.0-2.0x as fast as the rate below saturation.
# It only picks which rate to run next; every answer is still a passing grid rate whose
# neighbour above failed, so a wrong elasticity costs runs, never correctness.
ELASTICITY = 1.5

# The search steps on the grid (1 + tolerance)^k: below ~1e-16, 1 + tolerance rounds to 1 and the
# grid collapses (log(1 + tolerance) = 0: an infinite index). 1e-6 keeps every grid point distinct
# with room to spare; a bracket of one part in a million is already below a run's own noise.
MIN_TOLERANCE = 1e-6


SLO_METRICS = ("ttft", "tpot", "itl", "e2el")  # vllm bench serve's --percentile-metrics names
_METRIC_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


@dataclass(frozen=True, slots=True)
class Target:
    """One percentile SLO: the run's `percentile`-th percentile of `metric` at most `limit_ms`."""

    metric: str  # ttft | tpot | itl | e2el (vLLM's metric names)
    percentile: float  # in (0, 100]
    limit_ms: float

    @property
    def key(self) -> str:
        """The summary key holding the value (vLLM's `p{P}_{metric}_ms`)."""
        return f"p{p_word(self.percentile)}_{self.metric}_ms"

    @property
    def column(self) -> str:
        """The plan / sweep table column (`ttft_p99_ms`, as the p95 columns are named)."""
        return f"{self.metric}_p{p_word(self.percentile)}_ms"

    @property
    def name(self) -> str:
        return f"{_METRIC_WORDS[self.metric]} p{p_word(self.percentile)}"

    @property
    def spec(self) -> str:
        """The `--slo` spelling: ttft:p99:800."""
        return f"{self.metric}:p{p_word(self.percentile)}:{self.limit_ms:g}"

    def exceedances_to_fail(self, count: int) -> int:
        """How many of `count` values above the limit make numpy's (linear) percentile exceed it:
        the percentile interpolates between the sorted values at floor(v) and floor(v) + 1, v =
        (count - 1) q / 100, so it is above the limit once the value at floor(v) is, i.e. once
        count - floor(v) values are. This grows with count (by 0 or 1 per value, as q <= 100),
        so a count reached among the first requests of a run of `count` holds for the whole run.
        p95 of 600: 31 values; p99 of 600: 7; p50: 300."""
        return count - math.floor((count - 1) * (self.percentile / 100))


def _none_to_miss(target: Target, summary: dict[str, Any]) -> bool:
    """A TPOT or ITL target of a run that finished requests but has no such value: every request
    gave one token, so none has a TPOT or ITL to miss (vLLM's goodput counts such a TPOT as 0,
    and its percentiles of no values print 0). It was judged missed ("TPOT p95 n/a ms > 30 ms"),
    so a prefill-only workload met no TPOT SLO at any rate."""
    return target.metric in ("tpot", "itl") and (summary.get("completed") or 0) > 0


@dataclass(frozen=True, slots=True)
class SLO:
    """What a run must meet; None / empty means that target is not asked for. `ttft_p95_ms` and
    `tpot_p95_ms` are the --slo-ttft-p95-ms / --slo-tpot-p95-ms shorthands; `percentile_ms` holds
    every other percentile target (--slo METRIC:pP:MS). `targets` is all of them, p95s first."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    goodput_ms: tuple[tuple[str, float], ...] = ()  # per-request SLOs (vLLM --goodput)
    goodput_attainment: float = GOODPUT_ATTAINMENT  # in (0, 1]
    percentile_ms: tuple[Target, ...] = ()

    @classmethod
    def of(cls, targets: Iterable[Target], goodput_ms: tuple[tuple[str, float], ...] = ()) -> SLO:
        """The SLO of a list of targets (a TTFT or TPOT p95 goes to its shorthand field)."""
        ttft = tpot = None
        rest = []
        for t in targets:
            if t.percentile == 95 and t.metric == "ttft" and ttft is None:
                ttft = t.limit_ms
            elif t.percentile == 95 and t.metric == "tpot" and tpot is None:
                tpot = t.limit_ms
            else:
                rest.append(t)
        return cls(ttft, tpot, tuple(goodput_ms), percentile_ms=tuple(rest))

    @property
    def targets(self) -> tuple[Target, ...]:
        short = [Target(m, 95.0, v) for m, v in (("ttft", self.ttft_p95_ms), ("tpot", self.tpot_p95_ms))
                 if v is not None]
        return (*short, *self.percentile_ms)

    def failures(self, summary: dict[str, Any]) -> list[str]:
        """Why a run fails (empty: it passes); the first reason is the binding one."""
        reasons = []
        if summary.get("saturation") == "n/a" and summary.get("still_filling"):
            reasons.append("load not judged (requests in the system still grew when arrivals ended, with "
                           "little queueing: overload or a slow fill): run more requests at this rate")
        elif summary.get("saturation") == "n/a":  # a rate cannot be called sustained if it was not judged
            reasons.append("load not judged (arrivals over before a typical request finished, or too few "
                           "of them): run more requests at this rate")
        if summary.get("sessions_overloaded"):  # judge_sessions: turns alone do not show it
            reasons.append(f"overloaded (queueing delay grows {summary['session_queue_slope']:.2f} s per s while "
                           "sessions start; their turns wait on answers, so turns alone do not show it)")
        elif summary.get("saturation") == "overloaded":
            # a session run's requests are its turns (judge_sessions / SessionWorkload.turn_summary keys)
            unit = "turns/s" if "session_queue_slope" in summary or "ttft_by_turn" in summary else "req/s"
            above = (f"; above the full-batch capacity {summary['full_batch_capacity']:.2f}"
                     if summary.get("capacity_exceeded") else "")
            reasons.append(
                f"overloaded (completed {summary['completed_rate_warm']:.2f} of "
                f"{summary['offered_rate']:.2f} {unit} offered{above})"
            )
        stopped = summary.get("early_stop")  # values are lower bounds; what was not proven is absent
        for target in self.targets:
            value, limit = summary.get(target.key), target.limit_ms
            if value is None and (stopped or _none_to_miss(target, summary)):
                continue
            if value is None or value > limit:
                shown = "n/a" if value is None else f"{'>= ' if stopped else ''}{value:,.1f}"
                reasons.append(f"{target.name} {shown} ms > {limit:g} ms" + (f" (run stopped: {stopped})" if stopped else ""))
        if self.goodput_ms and not (stopped and "goodput_share" not in summary):
            share = summary.get("goodput_share") or 0.0
            if share < self.goodput_attainment:
                reasons.append(f"{100 * share:.1f}% of requests meet every per-request SLO "
                               f"< {100 * self.goodput_attainment:g}%")
        return reasons

    def margin(self, summary: dict[str, Any]) -> float | None:
        """How far a run is from the boundary: the largest value / limit over the targets (> 1
        misses one); for goodput, the share missing every per-request SLO over the share allowed
        to. None without a latency target or a value. Guides the rate search (its next rate),
        never decides pass or fail."""
        ratios = []
        stopped = summary.get("early_stop")  # a stopped run: the proven ratios (lower bounds) only
        for target in self.targets:
            value = summary.get(target.key)
            if value is None and (stopped or _none_to_miss(target, summary)):
                continue
            if value is None or not math.isfinite(value):
                return None
            ratios.append(value / target.limit_ms)
        if self.goodput_ms and self.goodput_attainment < 1:
            share = summary.get("goodput_share")
            if share is None and stopped:
                return max(ratios) if ratios else None
            if share is None:
                return None
            ratios.append((1.0 - share) / (1.0 - self.goodput_attainment))
        return max(ratios) if ratios else None

    def describe(self) -> dict[str, Any]:
        out = {"ttft_p95_ms": self.ttft_p95_ms, "tpot_p95_ms": self.tpot_p95_ms,
               "goodput_ms": dict(self.goodput_ms),
               "goodput_attainment": self.goodput_attainment if self.goodput_ms else None}
        if self.percentile_ms:  # the full list, as --slo spells it (only when one is not a p95 shorthand)
            out["targets"] = [t.spec for t in self.targets]
        return out

    def spec(self) -> str:
        """The SLO as the command line spells it (a plan row's `slo` cell): ttft:p95:1000 tpot:p99:60,
        then `goodput ttft:500 >= 90%`; "" for none."""
        parts = [t.spec for t in self.targets]
        if self.goodput_ms:
            parts.append("goodput " + " ".join(f"{k}:{v:g}" for k, v in self.goodput_ms)
                         + f" >= {100 * self.goodput_attainment:g}%")
        return " ".join(parts)

    def text(self) -> str:
        parts = [f"{t.name} <= {t.limit_ms:g} ms" for t in self.targets]
        if self.goodput_ms:
            pairs = " ".join(f"{k}:{v:g}" for k, v in self.goodput_ms)
            parts.append(f"{100 * self.goodput_attainment:g}% of requests within {pairs} ms")
        return ", ".join(parts) or "no latency SLO (sustained load only)"


def parse_slo_targets(values: Iterable[str] | None, **shorthands: float | None) -> list[Target]:
    """`--slo ttft:p99:800 --slo e2el:p90:20000` -> Targets, after the p95 shorthands
    (`slo_ttft_p95_ms=...`, `slo_tpot_p95_ms=...`). METRIC is one of vLLM's percentile metrics
    (ttft, tpot, itl, e2el), the percentile pP or P in (0, 100], the limit a finite number of ms
    > 0; a target given twice (the same metric and percentile) is refused."""
    out: list[Target] = []
    for flag, limit in shorthands.items():
        if limit is None:
            continue
        if not (limit > 0 and limit != float("inf")):
            raise ConfigError(f"--{flag.replace('_', '-')} must be a finite number > 0, got {limit}")
        out.append(Target(flag.split("_")[1], 95.0, float(limit)))
    for text in values or []:
        for item in text.replace(",", " ").split():
            parts = item.split(":")
            if len(parts) != 3:
                raise ConfigError(f"--slo: {item!r} is not METRIC:pPERCENTILE:MS (e.g. ttft:p99:800)")
            metric, pct, number = parts
            if metric not in SLO_METRICS:
                raise ConfigError(f"--slo: unknown metric {metric!r} in {item!r}; use {', '.join(SLO_METRICS)}")
            try:
                q = float(pct[1:] if pct[:1] in ("p", "P") else pct)
            except ValueError:
                raise ConfigError(f"--slo: {pct!r} is not a percentile such as p99 (in {item!r})") from None
            if not 0 < q <= 100:
                raise ConfigError(f"--slo: percentile {pct} is not in (0, 100] (in {item!r})")
            try:
                limit = float(number)
            except ValueError:
                raise ConfigError(f"--slo: {number!r} is not a number of ms (in {item!r})") from None
            if not (limit > 0 and limit != float("inf")):
                raise ConfigError(f"--slo: the limit must be a finite number of ms > 0, got {number} (in {item!r})")
            out.append(Target(metric, q, limit))
    seen: set[tuple[str, float]] = set()
    for t in out:
        if (t.metric, t.percentile) in seen:
            raise ConfigError(f"--slo: {t.name} is given twice")
        seen.add((t.metric, t.percentile))
    return out


# -- the same requests at any rate ------------------------------------------------------------


def nominal_rate(spec, arrays) -> float:
    """The mean arrival rate a workload is described at (what --rate sets)."""
    from kvsim.workloads.arrivals import (
        FixedRateArrivals,
        GammaArrivals,
        PiecewiseRateArrivals,
        TraceArrivals,
    )

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

    unit = "req/s"

    def lengths(self, seed: np.random.SeedSequence) -> Lengths:
        """The requests' lengths for the planner's single-step bounds (reports.plan)."""
        arrays, _ = self.draw(seed)
        prompts = arrays.num_prompt_tokens - np.where(arrays.prefix_id >= 0, arrays.num_prefix_tokens, 0)
        return Lengths(arrays.num_prompt_tokens.astype(np.int64), np.maximum(prompts, 1).astype(np.int64),
                       arrays.num_output_tokens.astype(np.int64), 1.0,
                       float(np.mean(arrays.num_output_tokens * arrays.n)))


@dataclass(frozen=True, slots=True)
class Lengths:
    """What the planner's bounds need of a workload's requests: each one's whole prompt (what
    max_model_len refuses), the part of it no cache can serve (what prefill must compute at
    least), its output; requests per unit of rate (1 per request, turns per session), and
    output tokens per unit (what $ per M output tokens divides by)."""

    full_prompts: np.ndarray
    uncached_prompts: np.ndarray
    outputs: np.ndarray
    requests_per_unit: float
    output_tokens_per_unit: float


class SessionRateScaler:
    """A multi-turn session workload (workloads.sessions) at any session rate: the sessions are
    drawn once per seed (turns, lengths, think times, system prompts) and only their start times
    are scaled, by `base_rate / rate` (SessionWorkload.start_scale); inside a session each turn
    still waits for the previous answer plus its own think time, as real conversations do. The
    rate is in sessions/s, what the workload's --rate means. `take` requests (turns) become
    ceil(take / mean turns per session) sessions. `at(rate)` is a `simcore.request.Workload`."""

    unit = "sessions/s"
    # A run must reach the steady state: at a session rate r, about r x lifetime sessions are
    # in flight at once (lifetime >= (turns - 1) x think time), so a run of fewer sessions than
    # that measures a ramp that never fills the server. Each run starts sessions over at least
    # STEADY_LIFETIMES lifetimes (more sessions at higher rates), at most MAX_RUN_TURNS turns.
    STEADY_LIFETIMES = STEADY_LIFETIMES  # workloads.sessions
    MAX_RUN_TURNS = 50_000

    def __init__(self, spec, take: int | None = None):
        from kvsim.workloads.arrivals import GammaArrivals, TraceArrivals

        if isinstance(spec.arrival, GammaArrivals):
            self.base = float(spec.arrival.rate)
        elif isinstance(spec.arrival, TraceArrivals):
            starts = [start for start, _ in spec.trace.sessions()[: int(spec.num_sessions)]]
            span = max(starts) - min(starts) if starts else 0.0
            if len(starts) < 2 or span <= 0:
                raise ConfigError(f"workload {spec.name}: a rate search needs session start times that spread "
                                  "over time (the trace's sessions all start at once)")
            self.base = (len(starts) - 1) / span
        else:
            raise ConfigError(f"workload {spec.name}: a rate search needs sessions that start open-loop (Poisson, "
                              "gamma or a session trace's start times), not a closed loop of clients")
        import dataclasses

        sessions = int(spec.num_sessions)
        self.turns_per_session = spec.num_requests / sessions  # expected
        if take is not None:
            sessions = min(sessions, max(1, math.ceil(take / self.turns_per_session)))
        self.spec = dataclasses.replace(spec, num_sessions=sessions)
        think = float(np.mean(spec.trace.think_s)) if spec.trace is not None and spec.trace.think_s is not None \
            else float(spec.think_time_s)
        self.lifetime_s = max(self.turns_per_session - 1.0, 0.0) * think  # a lower bound: answers take time too
        self.most = None if spec.trace is None else len(spec.trace.sessions())

    def sessions_at(self, rate: float) -> int:
        """Sessions a run at `rate` starts: the scaler's, or enough to reach the steady state."""
        steady = math.ceil(self.STEADY_LIFETIMES * rate * self.lifetime_s)
        cap = max(1, int(self.MAX_RUN_TURNS / max(self.turns_per_session, 1.0)))
        n = max(int(self.spec.num_sessions), min(steady, cap))
        return n if self.most is None else min(n, self.most)

    def at(self, rate: float):
        import dataclasses

        if not (rate > 0 and math.isfinite(rate)):
            raise ConfigError(f"rate must be a finite number > 0, got {rate}")
        return dataclasses.replace(self.spec, num_sessions=self.sessions_at(rate), start_scale=self.base / rate)

    def lengths(self, seed: np.random.SeedSequence) -> Lengths:
        """Every turn the sessions would send. A turn's uncached part is its new user tokens (the
        conversation before it may all be cached; the first turn's system prompt too)."""
        turns = self.spec.draw(seed)[0]
        system = self.spec.shared_prefix.prefix_len if self.spec.shared_prefix is not None else 0
        full = np.array([r.num_prompt_tokens for r in turns], dtype=np.int64)
        outputs = np.array([r.num_output_tokens for r in turns], dtype=np.int64)
        uncached = full.copy()
        for i, r in enumerate(turns):
            if r.turn > 1:
                uncached[i] = full[i] - (full[i - 1] + outputs[i - 1])
            else:
                uncached[i] = full[i] - system
        sessions = max(1, len({r.session_id for r in turns}))
        return Lengths(full, np.maximum(uncached, 1), outputs, len(turns) / sessions,
                       float(outputs.sum()) / sessions)


def rate_scaler(spec, take: int | None = None):
    """The scaler a rate search needs: sessions/s for a session workload, else req/s."""
    if getattr(spec, "is_session", False):
        return SessionRateScaler(spec, take)
    return RateScaler(spec, take)


def planned_requests(workload, seed: int) -> int:
    """An upper bound of the requests a run sends (what the early stop's counts need): the
    workload's count, or every turn its sessions plan (rejections only end sessions sooner)."""
    if getattr(workload, "is_session", False):
        return len(workload.draw(np.random.SeedSequence(seed).spawn(2)[0])[0])
    return int(workload.num_requests)


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

    @property
    def is_closed_loop(self) -> bool:
        return self.scaler.spec.is_closed_loop

    def process(self, env, sink: RequestSink, seed: np.random.SeedSequence):
        from kvsim.workloads.arrivals import open_loop_process

        arrays, base = self.scaler.draw(seed)
        yield from open_loop_process(env, sink, [(arrays.to_requests(), arrays.arrival_s * (base / self.rate))])
        return arrays.stats  # the whole draw's counts

    def iter_arrays(self, seed: np.random.SeedSequence):
        """The requests `process` submits, as one chunk of arrays (what simcore.fastcore feeds the
        compiled engine core); returns the draw's counts, as `process` does."""
        arrays, base = self.scaler.draw(seed)
        yield replace(arrays, arrival_s=arrays.arrival_s * (base / self.rate))
        return arrays.stats

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
    """Bracket then narrow on the rate grid (module docstring); `evaluate(rate)` runs the
    deployment at `rate` and returns its summary. Each grid rate is run at most once. A failure
    at or below `rate_floor` ends the search with `below_floor` (the caller does not care how
    much less than that the deployment sustains). `first_step` (grid steps) starts the bracket
    small when `start_rate` is a good guess and no SLO margin guides the next move."""
    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance must be in (0, 1), got {tolerance}")
    if not (start_rate > 0 and math.isfinite(start_rate)):
        raise ConfigError(f"start rate must be > 0, got {start_rate}")
    seen: dict[int, RatePoint] = {}
    margins: dict[int, float] = {}  # grid index -> log(margin), where the margin agrees with pass/fail

    def run(k: int) -> None:
        rate = grid_rate(k, tolerance)
        summary = evaluate(rate)
        reasons = slo.failures(summary)
        seen[k] = RatePoint(rate, not reasons, tuple(reasons), summary)
        m = slo.margin(summary)
        if m is not None and (m <= 1.0) == (not reasons):  # an overloaded run within the targets has none
            margins[k] = math.log(min(max(m, 1e-3), 1e3))

    def done(lo: int | None, at_least: bool = False) -> Capacity:
        points = tuple(seen[k] for k in sorted(seen))
        above = [seen[k] for k in sorted(seen) if lo is None or k > lo]
        binding = next((p.reasons[0] for p in above if not p.passed), "")
        return Capacity(0.0 if lo is None else grid_rate(lo, tolerance), tolerance, points, at_least, binding)

    per_step = math.log1p(tolerance)  # log-rate of one grid step
    doubling = max(1, math.ceil(math.log(2.0) / per_step))
    step = doubling if first_step is None else max(1, min(first_step, doubling))
    floor_k = grid_index(floor_grid_rate(rate_floor, tolerance), tolerance) if rate_floor > 0 else None
    top = grid_index(rate_cap or start_rate * 2**MAX_DOUBLINGS, tolerance)
    bottom = grid_index(start_rate / 2**MAX_HALVINGS, tolerance)
    deepest = grid_index(start_rate / 2**MAX_OVERLOADED_HALVINGS, tolerance)
    k = grid_index(start_rate, tolerance)
    if top is not None:
        k = min(k, top)
    guessed: int | None = None  # the bracket's width before a guessed run
    while True:
        run(k)
        failed = [j for j in seen if not seen[j].passed]
        hi = min(failed) if failed else None
        lo = max((j for j in seen if seen[j].passed and (hi is None or j < hi)), default=None)
        if hi is not None and floor_k is not None and hi <= floor_k:
            return replace(done(None), below_floor=grid_rate(hi, tolerance))
        if lo is not None and hi is not None:  # bracketed: narrow it
            if hi - lo == 1:
                return done(lo)
            if floor_k is not None and lo < floor_k < hi:
                k = floor_k  # first settle whether the answer can reach the floor at all
                continue
            # a guessed run that did not halve the bracket is followed by a plain halving, so
            # the bracket at least halves every two runs, as bisection's does every run
            stalled = guessed is not None and hi - lo > (guessed + 1) // 2
            guess = None if stalled else _crossing(margins, lo, hi)
            k = (lo + hi) // 2 if guess is None else min(max(round(guess), lo + 1), hi - 1)
            guessed = None if guess is None else hi - lo
        elif lo is not None:  # every run passed: go up
            if top is not None and lo >= top:
                return done(lo, at_least=True)
            guess = _extrapolate(margins, [j for j in sorted(seen) if seen[j].passed], per_step)
            if guess is None:
                k = lo + step
                step = min(2 * step, doubling)  # gallop: a good guess costs few runs, a bad one log2 more
            else:
                k = min(max(round(guess), lo + 1), lo + doubling)
            if top is not None:
                k = min(k, top)
        else:  # every run failed: go down
            guess = _extrapolate(margins, sorted(failed, reverse=True), per_step)
            if guess is None:
                k = hi - step
                step = min(2 * step, doubling)
            else:
                k = max(min(round(guess), hi - 1), hi - doubling)
            if floor_k is not None and k < floor_k:
                k = floor_k  # below the floor nothing matters: try it
            elif k < deepest or (k < bottom and not _overloaded(seen[hi].summary)):
                return done(None)


def _overloaded(summary: dict[str, Any]) -> bool:
    """Whether a run was judged overloaded (too many arrivals), not short of an SLO or unjudged."""
    return summary.get("saturation") == "overloaded" or bool(summary.get("sessions_overloaded"))


def _crossing(margins: dict[int, float], lo: int, hi: int) -> float | None:
    """Where log(margin) crosses 0 between the bracket's ends (a secant), or None."""
    if lo in margins and hi in margins and margins[hi] > margins[lo]:
        return lo + (hi - lo) * (0.0 - margins[lo]) / (margins[hi] - margins[lo])
    return None


def _extrapolate(margins: dict[int, float], side: list[int], per_step: float) -> float | None:
    """Where log(margin) reaches 0 beyond the runs on one side of the boundary (`side`, nearest
    to it last): the slope of its last two runs when they rise with the rate, else the typical
    elasticity (ELASTICITY); None without a margin."""
    if not side or side[-1] not in margins:
        return None
    k = side[-1]
    slope = ELASTICITY * per_step
    if len(side) > 1 and side[-2] in margins:
        j = side[-2]
        measured = (margins[k] - margins[j]) / (k - j)
        if measured > 0.25 * slope:
            slope = measured
    return k - margins[k] / slope


def session_queue_slope(result, workload, seed: int) -> float | None:
    """How fast turns' queueing delay grows (s per s) while sessions are still starting, or None.

    A session's next turn waits for its answer, so an overloaded server slows its own arrivals:
    completed turns keep pace with offered ones, and once starts end the sessions drain as a
    closed loop. What overload does show is the queue growing while sessions keep starting
    faster than they finish; the fit skips the first WARMUP_SHARE of that window, as
    simcore.metrics.saturation does."""
    from kvsim.simcore.metrics import MIN_JUDGED_REQUESTS, WARMUP_SHARE

    if not getattr(workload, "is_session", False) or not result.records.kept:
        return None
    starts = [r.arrival_s for r in workload.draw(np.random.SeedSequence(seed).spawn(2)[0])[0] if r.turn == 1]
    if not starts:
        return None
    last = max(starts)
    cols = result.records.columns()
    arrival, scheduled = cols["arrival_s"], cols["first_scheduled_s"]
    window = (scheduled >= 0) & (arrival >= WARMUP_SHARE * last) & (arrival <= last)
    if window.sum() < MIN_JUDGED_REQUESTS or np.ptp(arrival[window]) <= 0:
        return None
    return float(np.polyfit(arrival[window], (scheduled - arrival)[window], 1)[0])


def judge_sessions(summary: dict[str, Any], result, workload, seed: int | None) -> dict[str, Any]:
    """`summary` (changed in place and returned) with the session judge's verdict: for a session
    workload, `session_queue_slope` and `sessions_overloaded`, and a run its turns alone call
    `sustained` is `overloaded` when its queue grew while sessions started (session_queue_slope:
    an overloaded server slows its own arrivals). One judge for run, sweep and plan."""
    slope = None if seed is None else session_queue_slope(result, workload, seed)
    if slope is not None:
        summary["session_queue_slope"] = slope
        summary["sessions_overloaded"] = slope > OVERLOAD_WAIT_SLOPE
        if summary["sessions_overloaded"] and summary.get("saturation") == "sustained":
            summary["saturation"] = "overloaded"
    return summary


def summary_with_goodput(result, slo: SLO, workload=None, seed: int | None = None) -> dict[str, Any]:
    """A run's summary plus goodput against the SLO's per-request targets, if any, the
    percentiles the SLO names, and for a session workload (with its seed) whether its queue grew
    while sessions started (`session_queue_slope`, `sessions_overloaded`)."""
    from kvsim.simcore.metrics import goodput

    summary = judge_sessions(dict(result.summary), result, workload, seed)
    missing = [t for t in slo.targets if t.key not in summary]  # the summary has p95 and p99
    if missing:
        from kvsim.simcore.metrics import metric_stats

        for metric in dict.fromkeys(t.metric for t in missing):
            qs = tuple(t.percentile for t in missing if t.metric == metric)
            stats = metric_stats(result, qs, (metric,))
            summary.update({t.key: stats[t.key] for t in missing if t.metric == metric})
    if slo.goodput_ms:
        summary.update(goodput(result.requests, dict(slo.goodput_ms), summary["duration_s"]))
    return summary


def simulator(model, gpu, config, spec, profile, seed: int, slo: SLO) -> Callable[[float], dict[str, Any]]:
    """`evaluate(rate)` for one deployment: simulate it serving `spec` rescaled to `rate`."""
    scaler = rate_scaler(spec)

    def evaluate(rate: float) -> dict[str, Any]:
        return run_against(model, gpu, config, scaler.at(rate), profile, seed, slo, early_stop=False)

    return evaluate


def floor_grid_rate(rate_floor: float, tolerance: float) -> float:
    """The grid rate a search runs for `rate_floor` (the first at or above it); 0 without one.
    A failure at or below it ends the search (`below_floor`), so a run there that is going to
    fail may stop as soon as that is certain: its numbers are never used."""
    if rate_floor <= 0:
        return 0.0
    return grid_rate(math.ceil(math.log(rate_floor) / math.log1p(tolerance) - 1e-9), tolerance)


# -- stopping a run once it provably fails -------------------------------------------------------

PROVABLE = ("ttft", "tpot", "e2el")  # one value per request row: a run can stop on them
CHECKS_PER_RUN = 40  # a run is tested each time 1/40 of its requests (at least 10) have left


def run_against(model, gpu, config, workload, profile, seed: int, slo: SLO, early_stop: bool = False) -> dict[str, Any]:
    """One run's summary (with goodput, and `engine_core`: the core that ran it) for the rate
    search. With `early_stop` the run ends as soon as the requests that already left prove a
    target missed: numpy's q-th percentile of N values exceeds a limit once N - floor((N - 1) q
    / 100) of them do (Target.exceedances_to_fail; that count only grows with N, so the run's
    own request count bounds it: a p99 of 600 is lost after 7 slow requests), and the
    goodput share falls short once more requests missed a per-request SLO than the attainment
    allows. The test runs each time 1/CHECKS_PER_RUN of the requests (at least 10) have left,
    as a watch on the request records that either engine core honours (simcore.cores), so a
    run stops after the same requests whichever core runs it. A stopped run's summary has
    `early_stop` (why) and lower bounds for the percentiles it proved too high; a run that is not
    stopped is the very run `simulate()` makes (the watch only reads the records)."""
    from kvsim.profiles import draft_profile
    from kvsim.simcore.records import RunStopped
    from kvsim.simcore.simulate import prepare

    sim = prepare(model, gpu, config, workload, profile, seed=seed, draft_profile=draft_profile(gpu, config, profile))
    total = planned_requests(workload, seed) if early_stop else int(workload.num_requests)
    records = sim.replicas[0].lifecycle.records
    if early_stop and not any(t.metric in PROVABLE for t in slo.targets) and not slo.goodput_ms:
        early_stop = False
    watch = None
    if early_stop and total <= records.cap:
        def check(records) -> dict[str, Any] | None:
            return None if records.num_left >= total else _proven_failure(records, total, slo)

        watch = (max(10, total // CHECKS_PER_RUN), check)
    try:
        result = sim.run(watch)
    except RunStopped as stop:
        return {**stop.value, "engine_core": stop.engine_core}
    return {**summary_with_goodput(result, slo, workload, seed), "engine_core": result.record["engine_core"]}


def _proven_failure(records, total: int, slo: SLO) -> dict[str, Any] | None:
    """A summary saying why the run already fails, from the rows that left, or None. A
    percentile target fails for certain once `Target.exceedances_to_fail(total)` requests are
    above its limit (31 of 600 for a p95, 7 for a p99): with N <= total values at the end, fewer
    are needed. ITL targets are not proven early (one value per token, not per request row)."""
    from kvsim.simcore.records import FINISHED, derived_latencies

    cols = records.columns()
    ttft, e2el, tpot = derived_latencies(cols)
    finished = cols["status"] == FINISHED
    summary: dict[str, Any] = {"early_stop": "", "completed_so_far": int(finished.sum()), "num_requests": total}
    per_request = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
    for target in slo.targets:
        if target.metric not in PROVABLE:
            continue
        values, limit = per_request[target.metric], target.limit_ms
        need = target.exceedances_to_fail(total)  # values above the limit that fix numpy's percentile above it
        ms = values[finished & ~np.isnan(values)] * 1000.0
        over = np.sort(ms[ms > limit])
        if len(over) >= need:
            summary[target.key] = float(over[-need])  # the need-th largest seen: a lower bound of the percentile
            summary["early_stop"] = summary["early_stop"] or (
                f"{len(over)} of {total} requests already above {limit:g} ms ({target.key})")
    if slo.goodput_ms:
        good = finished.copy()
        for name, limit_ms in slo.goodput_ms:
            values = {"ttft": ttft, "tpot": np.where(np.isnan(tpot), 0.0, tpot), "e2el": e2el}[name]
            with np.errstate(invalid="ignore"):
                good &= values * 1000.0 <= limit_ms
        bad = len(good) - int(good.sum())
        if bad > total * (1.0 - slo.goodput_attainment):
            summary["goodput_share"] = (total - bad) / total  # an upper bound
            summary["early_stop"] = summary["early_stop"] or (
                f"{bad} of {total} requests already miss a per-request SLO")
    return summary if summary["early_stop"] else None
