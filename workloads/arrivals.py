"""Arrival processes: when requests reach the engine.

Open-loop processes draw arrival times with numpy a chunk at a time (`iter_times`, so a run of a
billion requests never holds them all), then one SimPy process waits one timeout per distinct
arrival time and submits. `arrival_times(rng, n)` is the same stream in one chunk. A closed loop of N
clients cannot be precomputed: each client waits on the engine's completion event of its
previous request (then an optional think time) before it submits the next one.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kvsim.simcore.errors import WorkloadError
from kvsim.simcore.request import Request, RequestSink

if TYPE_CHECKING:  # annotations only: SimPy is imported by the Python engine (simcore.simulate)
    import simpy


# The rates and burstiness a run can mean. Below MIN_RATE, 1/rate (the mean gap in seconds)
# heads for overflow (inf from 5.6e-309: every gap infinite, and the run refused only after it
# ran); above it a run whose planned span passes MAX_SPAN_S is refused (`refuse_long_span`), and a
# near-idle one within it runs with the warning that the engine sat idle and the longest gap
# (tests/test_bad_input_audit.py). Above MAX_RATE (a billion requests a
# second) every arrival is the same instant anyway. A gamma gap of shape k falls below the
# smallest double, so it is exactly 0, with probability about (4.9e-324)**k: 0.47 at k = 0.001,
# 6e-4 at 0.01, 3e-7 at MIN_BURSTINESS (0.02), measured with numpy's gamma; below it the arrivals
# collapse to t = 0 while the run's header still says "gamma arrivals". MAX_BURSTINESS: gaps' CV
# 0.001, a fixed rate in all but name, and rate * burstiness stays far from overflow.
MIN_RATE, MAX_RATE = 1e-300, 1e9
MIN_BURSTINESS, MAX_BURSTINESS = 0.02, 1e6
# The longest run a workload may plan (arrivals and think times, before any service time): 1e9 s,
# about 31.7 years. The clock is a float64 of seconds (IEEE 754 binary64, 53-bit significand):
# below 2**30 s (1.07e9) its spacing is at most 2**-23 s (0.12 us), so a step of a few
# microseconds still reads to within a few percent; at 1e12 s it is 0.12 ms, and at 1e300 s no
# latency survives (a 1e-300 req/s run printed a median TTFT of 0.00 ms). Rates down to MIN_RATE
# stay legal for a few requests; what is refused is the span they plan.
MAX_SPAN_S = 1e9
SECONDS_PER_YEAR = 365.25 * 86400


def _positive(name: str, value: float) -> None:
    if not (value > 0 and np.isfinite(value)):
        raise WorkloadError(f"{name} must be a finite number > 0, got {value}")


def _within(name: str, value: float, low: float, high: float) -> None:
    _positive(name, value)
    if not low <= value <= high:
        raise WorkloadError(f"{name} must be from {low:g} to {high:g}, got {value:g}")


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """Gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)), as `vllm bench serve --burstiness`.

    burstiness 1 is a Poisson process; lower is burstier (CV of the gaps = 1/sqrt(burstiness)).
    The first request arrives at t=0 and gaps are never truncated."""

    rate: float  # > 0, requests per second
    burstiness: float = 1.0  # > 0
    kind: ClassVar[str] = "gamma"

    def __post_init__(self) -> None:
        _within("arrival rate", self.rate, MIN_RATE, MAX_RATE)
        _within("burstiness", self.burstiness, MIN_BURSTINESS, MAX_BURSTINESS)

    def arrival_times(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return _whole(self, rng, size)

    def iter_times(self, rng: np.random.Generator, total: int, chunk: int) -> Iterator[np.ndarray]:
        scale = 1.0 / (self.rate * self.burstiness)
        last = None
        for _, size in _chunks(total, chunk):
            if last is None:
                times = np.concatenate(([0.0], np.cumsum(rng.gamma(self.burstiness, scale, size=size - 1))))
            else:
                times = last + np.cumsum(rng.gamma(self.burstiness, scale, size=size))
            last = float(times[-1])
            yield times

    def describe(self) -> dict[str, Any]:
        name = "poisson" if self.burstiness == 1.0 else "gamma"
        return {"process": name, "rate": float(self.rate), "burstiness": float(self.burstiness)}


@dataclass(frozen=True, slots=True)
class FixedRateArrivals:
    """Evenly spaced arrivals, one every 1/rate seconds (no randomness)."""

    rate: float  # > 0
    kind: ClassVar[str] = "fixed_rate"

    def __post_init__(self) -> None:
        _within("arrival rate", self.rate, MIN_RATE, MAX_RATE)

    def arrival_times(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return _whole(self, rng, size)

    def iter_times(self, rng: np.random.Generator, total: int, chunk: int) -> Iterator[np.ndarray]:
        for start, size in _chunks(total, chunk):
            yield np.arange(start, start + size, dtype=np.float64) / self.rate

    def describe(self) -> dict[str, Any]:
        return {"process": self.kind, "rate": float(self.rate)}


@dataclass(frozen=True, slots=True)
class BatchArrivals:
    """Groups of `size` requests arriving together every `interval_s`; size 0 means all at t=0 (offline batch)."""

    size: int = 0  # >= 0; 0 = every request in one batch
    interval_s: float = 0.0  # >= 0
    kind: ClassVar[str] = "batch"

    def __post_init__(self) -> None:
        if self.size < 0 or self.interval_s < 0:
            raise WorkloadError(f"batch size and interval_s must be >= 0, got {self.size} and {self.interval_s}")
        if self.size > 0 and self.interval_s == 0:
            raise WorkloadError("batch arrivals with a size need interval_s > 0 (or leave size out for all at once)")

    def arrival_times(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return _whole(self, rng, size)

    def iter_times(self, rng: np.random.Generator, total: int, chunk: int) -> Iterator[np.ndarray]:
        for start, size in _chunks(total, chunk):
            if self.size == 0:
                yield np.zeros(size)
            else:
                yield (np.arange(start, start + size) // self.size) * float(self.interval_s)

    def describe(self) -> dict[str, Any]:
        return {"process": self.kind, "size": int(self.size), "interval_s": float(self.interval_s)}


@dataclass(frozen=True, slots=True)
class PiecewiseRateArrivals:
    """Poisson process whose rate is constant on each step of a schedule (e.g. a diurnal curve).

    Exact inversion: unit-rate Poisson epochs E_k are mapped through the inverse of the
    cumulative rate Lambda(t), which is piecewise linear. With `period_s` the schedule repeats;
    without it the last rate holds forever (so it must be > 0)."""

    starts_s: tuple[float, ...]  # strictly increasing, the first is 0
    rates: tuple[float, ...]  # >= 0 requests per second on [starts_s[i], starts_s[i+1])
    period_s: float | None = None  # > starts_s[-1] when given
    kind: ClassVar[str] = "piecewise"

    def __post_init__(self) -> None:
        starts = np.asarray(self.starts_s, dtype=np.float64)
        if len(starts) == 0 or len(starts) != len(self.rates):
            raise WorkloadError("a rate schedule needs one or more [start_s, rate] steps")
        if starts[0] != 0 or np.any(np.diff(starts) <= 0):
            raise WorkloadError(f"rate schedule start times must begin at 0 and increase, got {list(self.starts_s)}")
        if min(self.rates) < 0 or max(self.rates) <= 0:
            raise WorkloadError(f"rate schedule rates must be >= 0 with at least one > 0, got {list(self.rates)}")
        if self.period_s is None and self.rates[-1] <= 0:
            raise WorkloadError("the last rate of a non-repeating schedule must be > 0 (or give period_s)")
        if self.period_s is not None and not self.period_s > starts[-1]:
            raise WorkloadError(f"period_s ({self.period_s}) must be after the last step start ({starts[-1]})")

    @property
    def mean_rate(self) -> float:
        """Average rate over one period (or the final rate when the schedule does not repeat)."""
        if self.period_s is None:
            return float(self.rates[-1])
        ends = (*self.starts_s[1:], self.period_s)
        return float(sum(r * (e - s) for s, e, r in zip(self.starts_s, ends, self.rates, strict=True)) / self.period_s)

    def arrival_times(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return _whole(self, rng, size)

    def iter_times(self, rng: np.random.Generator, total: int, chunk: int) -> Iterator[np.ndarray]:
        last = 0.0  # the unit-rate epoch of the previous chunk's last arrival
        for _, size in _chunks(total, chunk):
            epochs = last + np.cumsum(rng.exponential(1.0, size=size))
            last = float(epochs[-1])
            yield self._times_of_epochs(epochs)

    def _times_of_epochs(self, epochs: np.ndarray) -> np.ndarray:
        size = len(epochs)
        starts = np.asarray(self.starts_s, dtype=np.float64)
        rates = np.asarray(self.rates, dtype=np.float64)
        ends = np.append(starts[1:], self.period_s if self.period_s is not None else np.inf)
        mass = np.where(rates > 0, rates * (ends - starts), 0.0)  # inf only for the open last step
        cum = np.concatenate(([0.0], np.cumsum(mass[:-1])))  # Lambda at each step's start
        offset = np.zeros(size)
        if self.period_s is not None:
            per_period = float(mass.sum())
            cycles = np.floor(epochs / per_period)
            epochs = epochs - cycles * per_period
            offset = cycles * self.period_s
        live = np.flatnonzero(rates > 0)  # steps with zero rate hold no arrivals
        step = live[np.searchsorted(cum[live], epochs, side="right") - 1]
        return offset + starts[step] + (epochs - cum[step]) / rates[step]

    def describe(self) -> dict[str, Any]:
        return {
            "process": self.kind,
            "schedule": [[float(s), float(r)] for s, r in zip(self.starts_s, self.rates, strict=True)],
            "period_s": self.period_s,
            "mean_rate": self.mean_rate,
        }


def _chunks(total: int, chunk: int) -> Iterator[tuple[int, int]]:
    """(first index, size) of each chunk of `total` items."""
    for start in range(0, total, chunk):
        yield start, min(chunk, total - start)


def _whole(process: OpenLoopArrivals, rng: np.random.Generator, size: int) -> np.ndarray:
    """All `size` arrival times at once: the chunked stream in one chunk."""
    return next(iter(process.iter_times(rng, size, max(size, 1))), np.zeros(0))


def diurnal_schedule(
    mean_rate: float, peak_to_trough: float, period_s: float, steps: int = 24
) -> PiecewiseRateArrivals:
    """A sinusoidal day (trough at the start) cut into `steps` constant-rate steps with the given mean."""
    _within("diurnal mean_rate", mean_rate, MIN_RATE, MAX_RATE)
    _positive("diurnal period_s", period_s)
    if peak_to_trough < 1 or steps < 2:
        raise WorkloadError(f"diurnal needs peak_to_trough >= 1 and steps >= 2, got {peak_to_trough} and {steps}")
    amplitude = (peak_to_trough - 1) / (peak_to_trough + 1)
    phase = 2 * np.pi * (np.arange(steps) + 0.5) / steps
    rates = mean_rate * (1 - amplitude * np.cos(phase))
    rates *= mean_rate / rates.mean()  # the mean of the discretised curve is exactly mean_rate
    starts = np.arange(steps) * (period_s / steps)
    return PiecewiseRateArrivals(tuple(starts.tolist()), tuple(rates.tolist()), float(period_s))


@dataclass(frozen=True, slots=True)
class TraceArrivals:
    """Arrival times read from a trace (see `workloads.traces`)."""

    kind: ClassVar[str] = "trace"

    def describe(self) -> dict[str, Any]:
        return {"process": self.kind}


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """N clients, each with at most one request in flight; after a response, think, then send the next."""

    concurrency: int  # >= 1
    think_time_s: float = 0.0  # >= 0, mean think time
    think_time_dist: str = "fixed"  # "fixed" or "exponential"
    kind: ClassVar[str] = "closed_loop"

    def __post_init__(self) -> None:
        if int(self.concurrency) != self.concurrency or self.concurrency < 1:
            raise WorkloadError(f"concurrency must be an integer >= 1, got {self.concurrency}")
        if not (self.think_time_s >= 0 and np.isfinite(self.think_time_s)):
            raise WorkloadError(f"think_time_s must be >= 0, got {self.think_time_s}")
        if self.think_time_dist not in ("fixed", "exponential"):
            raise WorkloadError(f"think_time_dist must be 'fixed' or 'exponential', got {self.think_time_dist!r}")

    def think_times(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.think_time_s == 0:
            return np.zeros(size)
        if self.think_time_dist == "exponential":
            return rng.exponential(self.think_time_s, size=size)
        return np.full(size, float(self.think_time_s))

    def describe(self) -> dict[str, Any]:
        return {
            "process": self.kind,
            "concurrency": int(self.concurrency),
            "think_time_s": float(self.think_time_s),
            "think_time_dist": self.think_time_dist,
        }


OpenLoopArrivals = GammaArrivals | FixedRateArrivals | BatchArrivals | PiecewiseRateArrivals
ArrivalProcess = OpenLoopArrivals | TraceArrivals | ClosedLoop


def planned_span_s(process: ArrivalProcess, count: int) -> float:
    """Seconds from the first to the last of `count` arrivals at the process's mean (a closed
    loop: each client's think times; a trace: 0, its rows are checked when read)."""
    count = int(count)
    if count <= 1:
        return 0.0
    if isinstance(process, (GammaArrivals, FixedRateArrivals)):
        return (count - 1) / float(process.rate)
    if isinstance(process, BatchArrivals):
        return float((count - 1) // process.size * process.interval_s) if process.size else 0.0
    if isinstance(process, PiecewiseRateArrivals):  # the count-th unit-rate epoch, mapped as arrivals are
        with np.errstate(over="ignore", invalid="ignore"):
            return float(process._times_of_epochs(np.array([float(count)]))[0])
    if isinstance(process, ClosedLoop):
        return float(process.think_time_s) * (count / int(process.concurrency))
    return 0.0


def refuse_long_span(name: str, span_s: float, what: str, fix: str = "raise the rate or lower the number of requests") -> None:
    """Refuse a workload whose planned span passes MAX_SPAN_S (float64 time would lose its latencies)."""
    if span_s <= MAX_SPAN_S:
        return
    years = span_s / SECONDS_PER_YEAR
    raise WorkloadError(
        f"workload {name}: {what} would span about {span_s:.3g} s ({years:.3g} years) of simulated time, past "
        f"kvsim's limit of {MAX_SPAN_S:g} s ({MAX_SPAN_S / SECONDS_PER_YEAR:.1f} years, where a float64 clock "
        f"still resolves microseconds); {fix}"
    )


def open_loop_process(
    env: simpy.Environment, sink: RequestSink, chunks: Iterable[tuple[list[Request], np.ndarray]]
) -> Generator[simpy.Event, Any, None]:
    """Submit each request at its planned time (seconds after the process starts), one chunk of
    (requests, arrival_s) at a time: one timeout per distinct time. Nothing waits for a
    request to finish, so a sink's `send` (no completion event) is used when it has one.

    A sink with `hold_arrivals` (one engine; see `Engine.hold_arrivals`) may hold the stream back
    while its queue is very long; held requests are submitted later with their planned times,
    so an overloaded run keeps one chunk of pending arrivals in memory, not its whole backlog."""
    start = env.now
    previous = start
    hold = getattr(sink, "hold_arrivals", None)
    send = getattr(sink, "send", sink.submit)  # an open loop never waits: no completion event
    late = False  # submitting what a hold delayed: planned times already past keep their stamp
    for requests, arrival_s in chunks:
        for request, at in zip(requests, (start + arrival_s).tolist(), strict=True):
            if at > previous:  # compare planned times, so same-time arrivals never cost a timeout
                if not (late and at <= env.now):
                    late = False
                    yield env.timeout(max(at - env.now, 0.0))
                previous = at
            if hold is not None and (drained := hold()) is not None:
                yield drained
                late = True
            if late:
                send(request, at)
            else:
                send(request)


def closed_loop_process(
    env: simpy.Environment,
    sink: RequestSink,
    requests: Iterator[tuple[Request, float]],
    concurrency: int,
) -> Generator[simpy.Event, Any, None]:
    """Run `concurrency` clients that share one stream of (request, think time), in id order,
    until it is exhausted."""

    def client() -> Generator[simpy.Event, Any, None]:
        for request, think in requests:  # shared iterator: whichever client is free takes the next
            yield sink.submit(request)
            if think > 0:
                yield env.timeout(think)

    clients = [env.process(client()) for _ in range(concurrency)]
    if clients:
        yield env.all_of(clients)
