"""A runnable workload: an arrival process plus per-request lengths (drawn or replayed from a trace).

`WorkloadSpec` satisfies `simcore.request.Workload`. Generation draws the requests' fields with
numpy from named streams of one seed, a chunk of requests at a time (memory does not grow with
`num_requests`), clips drawn lengths to `max_model_len` (counting what it clipped), then either
replays fixed arrival times or runs a closed loop of clients.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.simcore.errors import WorkloadError
from kvsim.simcore.request import Request, RequestSink
from kvsim.workloads.arrivals import (
    ArrivalProcess,
    ClosedLoop,
    TraceArrivals,
    closed_loop_process,
    open_loop_process,
    planned_span_s,
    refuse_long_span,
)
from kvsim.workloads.lengths import Categorical, LengthDist
from kvsim.workloads.traces import Trace, TraceOptions, select, window_rows

if TYPE_CHECKING:  # annotations only: SimPy is imported by the Python engine (simcore.simulate)
    import simpy

LOUD_CLIP_SHARE = 0.10  # clipping 10%+ of the requests is a warning, not a note
CHUNK = 65_536  # requests generated at a time: memory stays flat in num_requests
CLIP_KEYS = ("prompt", "output", "output_capped_by_max_tokens", "max_tokens", "prompt_over_max_model_len")
STREAMS = ("arrivals", "prompt", "output", "sampling", "prefix", "think", "trace")

GenerationStats = dict[str, Any]  # one generation's counts: {"clipped": {CLIP_KEYS...}, "trace": {...}}


def streams(seed: np.random.SeedSequence | int) -> dict[str, np.random.Generator]:
    """One generator per named stream: the seed's first children, derived without mutating the seed
    (so `sample_requests(seed)` and `process(..., seed)` draw identical requests)."""
    if not isinstance(seed, np.random.SeedSequence):
        seed = np.random.SeedSequence(seed)
    return {
        name: np.random.default_rng(
            np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, i), pool_size=seed.pool_size)
        )
        for i, name in enumerate(STREAMS)
    }


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """A fraction of requests start with one of `num_groups` system prompts of `prefix_len` tokens.

    The prompt-length distribution describes the part after the shared prefix."""

    num_groups: int  # >= 1
    prefix_len: int  # >= 1 tokens
    fraction: float = 1.0  # in [0, 1], share of requests that carry a prefix

    def __post_init__(self) -> None:
        if self.num_groups < 1 or self.prefix_len < 1 or not 0 <= self.fraction <= 1:
            raise WorkloadError(
                "shared_prefix needs num_groups >= 1, prefix_len >= 1 and 0 <= fraction <= 1, got "
                f"{self.num_groups}, {self.prefix_len}, {self.fraction}"
            )

    def describe(self) -> dict[str, Any]:
        return {"num_groups": self.num_groups, "prefix_len": self.prefix_len, "fraction": self.fraction}


@dataclass(slots=True)
class RequestArrays:
    """Every request's fields as arrays (index = request id); `arrival_s` is None for a closed loop."""

    arrival_s: np.ndarray | None
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    max_tokens: np.ndarray
    n: np.ndarray
    beam_width: np.ndarray
    prefix_id: np.ndarray  # -1 = no shared prefix
    num_prefix_tokens: np.ndarray
    think_s: np.ndarray | None
    stats: dict[str, Any]
    first_id: int = 0  # request id of row 0 (chunks of one generation number their rows on)

    @classmethod
    def concat(cls, parts: list[RequestArrays], stats: dict[str, Any]) -> RequestArrays:
        def join(name: str) -> np.ndarray | None:
            arrays = [getattr(p, name) for p in parts]
            return None if arrays[0] is None else np.concatenate(arrays)

        names = ("arrival_s", "num_prompt_tokens", "num_output_tokens", "max_tokens", "n", "beam_width",
                 "prefix_id", "num_prefix_tokens", "think_s")
        return cls(**{name: join(name) for name in names}, stats=stats)

    def to_requests(self) -> list[Request]:
        count = len(self.num_prompt_tokens)
        arrivals = self.arrival_s.tolist() if self.arrival_s is not None else [0.0] * count
        prefix_ids = [None if p < 0 else p for p in self.prefix_id.tolist()]
        columns = (
            arrivals, self.num_prompt_tokens.tolist(), self.num_output_tokens.tolist(), self.max_tokens.tolist(),
            self.n.tolist(), self.beam_width.tolist(), prefix_ids, self.num_prefix_tokens.tolist(),
        )
        assert all(len(c) == count for c in columns), "one value per request in every column"
        # map calls the class with each row's fields directly (no tuple per row to unpack)
        return list(map(Request, range(self.first_id, self.first_id + count), *columns))


GenerationChunks = Generator[RequestArrays, None, GenerationStats]


def drain(chunks: GenerationChunks, each: Callable[[RequestArrays], Any]) -> GenerationStats:
    """Hand every chunk to `each` and return the generation's counts (the generator's value)."""
    while True:
        try:
            each(next(chunks))
        except StopIteration as stop:
            return stop.value


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Traffic described by a workload file (or built in code); see workloads/README.md for the fields."""

    name: str
    num_requests: int  # >= 1; for a trace, rows replayed
    arrival: ArrivalProcess
    prompt_len: LengthDist | None = None  # None: lengths come from `trace`
    output_len: LengthDist | None = None
    trace: Trace | None = None
    trace_options: TraceOptions = TraceOptions()
    prompt_scale: float = 1.0  # multiplies a trace's prompt lengths (set by an input_len override)
    output_scale: float = 1.0
    max_tokens: int | None = None  # None: max_tokens = the true output; else a fixed cap per request
    n: Categorical = Categorical((1,))
    beam_width: Categorical = Categorical((1,))
    shared_prefix: SharedPrefix | None = None
    max_model_len: int | None = None  # clip lengths to this context window
    description: str = ""
    source: str = ""  # the file it came from

    def __post_init__(self) -> None:
        if int(self.num_requests) != self.num_requests or self.num_requests < 1:
            raise WorkloadError(f"workload {self.name}: num_requests must be an integer >= 1, got {self.num_requests}")
        if self.trace is None and (self.prompt_len is None or self.output_len is None):
            raise WorkloadError(f"workload {self.name}: give prompt_len and output_len, or a trace")
        if isinstance(self.arrival, TraceArrivals) and self.trace is None:
            raise WorkloadError(f"workload {self.name}: arrival process 'trace' needs a trace")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise WorkloadError(f"workload {self.name}: max_tokens must be >= 1, got {self.max_tokens}")
        if self.trace is not None:
            first, last = window_rows(self.trace, self.trace_options)
            if self.num_requests > last - first:
                raise WorkloadError(
                    f"trace {self.trace.source}: asked for {self.num_requests} requests but only "
                    f"{last - first} are available{' in the window' if self.trace_options.window_s else ''}"
                )
        if self.max_model_len is not None:
            self._check_fits(self.max_model_len)

    def check_span(self) -> None:
        """Refuse planned arrivals past arrivals.MAX_SPAN_S; a trace's replayed rows (the first
        `num_requests` of the window, or the whole window when sampled at random) as rescaled.
        Called on the workload a run gets (after overrides: a file's own span may be cut)."""
        count = int(self.num_requests)
        rate = getattr(self.arrival, "rate", None) or getattr(self.arrival, "mean_rate", None)
        span = planned_span_s(self.arrival, count)
        if self.trace is not None and isinstance(self.arrival, TraceArrivals):
            rate = self.trace_options.rescale_rate
            if rate is not None:
                span = (count - 1) / rate
            else:
                first, last = window_rows(self.trace, self.trace_options)
                end = first + count - 1 if self.trace_options.sample == "head" else last - 1
                span = float(self.trace.arrival_s[end] - self.trace.arrival_s[first])
        if self.is_closed_loop:
            refuse_long_span(self.name, span, f"{count:,} requests with {self.arrival.think_time_s:g} s think times "
                             f"over {self.arrival.concurrency} clients", "shorten the think time or lower the number of requests")
        refuse_long_span(self.name, span,
                         f"{count:,} requests" + (f" at {rate:g} req/s" if rate else f" ({self.arrival.kind} arrivals)"))

    def _check_fits(self, max_model_len: int) -> None:
        """Refuse a workload whose every prompt would have to be clipped (e.g. `long-context`, 8k-32k
        prompts, on an 8k model): what would run is not that workload."""
        prefix = self.shared_prefix.prefix_len if self.shared_prefix else 0
        dist = self.prompt_len
        if dist is None:
            return
        lowest = dist.mean if dist.std == 0 else getattr(dist, "low", 0)
        shortest = prefix + lowest
        if shortest >= max_model_len:
            what = f"prompt of {int(shortest)} tokens" if dist.std == 0 else f"every prompt (at least {int(shortest)} tokens)"
            raise WorkloadError(
                f"workload {self.name}: {what} is longer than max_model_len {max_model_len} (a request "
                "needs room for at least one output token); choose a model with a longer context, or --input-len"
            )

    @property
    def is_closed_loop(self) -> bool:
        return isinstance(self.arrival, ClosedLoop)

    # --- generation -------------------------------------------------------------------------

    def iter_arrays(self, seed: np.random.SeedSequence | int, chunk: int = CHUNK) -> GenerationChunks:
        """Every request's fields, `chunk` requests at a time, drawn from `seed`'s named streams, so
        memory stays bounded however many requests there are. The generator returns (StopIteration's
        value) the counts of the whole generation: clipped lengths, trace rows (`GenerationStats`)."""
        rng = streams(seed)
        count = int(self.num_requests)
        stats: dict[str, Any] = {"clipped": dict.fromkeys(CLIP_KEYS, 0)}
        chosen = None
        if self.trace is not None:
            chosen = select(self.trace, self.trace_options, count, rng["trace"])
            stats["trace"] = chosen.stats
        times = None
        if chosen is None or not isinstance(self.arrival, TraceArrivals):
            if not isinstance(self.arrival, (ClosedLoop, TraceArrivals)):
                times = self.arrival.iter_times(rng["arrivals"], count, chunk)
        for start in range(0, count, chunk):
            size = min(chunk, count - start)
            arrays = self._chunk(rng, start, size, chosen, times)
            for key, value in arrays.stats.pop("clipped").items():
                stats["clipped"][key] += value
            yield arrays
        return stats

    def _chunk(self, rng: dict[str, np.random.Generator], start: int, size: int, chosen: Any,
               times: Iterator[np.ndarray] | None) -> RequestArrays:  # fmt: skip
        extras: dict[str, np.ndarray] = {}
        arrival_s = next(times) if times is not None else None
        if chosen is not None:
            assert self.trace is not None
            rows = chosen.rows[start:start + size]
            prompt = _scaled(self.trace.num_prompt_tokens[rows], self.prompt_scale)
            output = _scaled(self.trace.num_output_tokens[rows], self.output_scale)
            extras = {name: column[rows] for name, column in self.trace.extras.items()}
            if isinstance(self.arrival, TraceArrivals):
                arrival_s = chosen.arrival_s[start:start + size]
        else:
            assert self.prompt_len is not None and self.output_len is not None
            prompt = self.prompt_len.sample(rng["prompt"], size)
            output = self.output_len.sample(rng["output"], size)
        prefix_id, prefix_tokens = self._prefixes(rng["prefix"], size, extras)
        prompt = prompt + (prefix_tokens if "num_prefix_tokens" not in extras else 0)
        n = extras.get("n", None)
        beam = extras.get("beam_width", None)
        arrays = RequestArrays(
            arrival_s=arrival_s,
            num_prompt_tokens=prompt,
            num_output_tokens=output,
            max_tokens=extras.get("max_tokens", output),
            n=n if n is not None else self.n.sample(rng["sampling"], size),
            beam_width=beam if beam is not None else self.beam_width.sample(rng["sampling"], size),
            prefix_id=prefix_id,
            num_prefix_tokens=prefix_tokens,
            think_s=self.arrival.think_times(rng["think"], size) if isinstance(self.arrival, ClosedLoop) else None,
            stats={},
            first_id=start,
        )
        self._clip(arrays, "max_tokens" in extras and self.max_tokens is None)
        return arrays

    def generate(self, seed: np.random.SeedSequence | int) -> RequestArrays:
        """Every request's fields in one set of arrays (small workloads and tests); the same
        requests as `iter_arrays` and `process` draw; `.stats` holds the generation's counts."""
        parts: list[RequestArrays] = []
        stats = drain(self.iter_arrays(seed), parts.append)
        return RequestArrays.concat(parts, stats)

    def generation_stats(self, seed: np.random.SeedSequence | int) -> GenerationStats:
        """The counts a generation from `seed` would return, without keeping its requests."""
        return drain(self.iter_arrays(seed), lambda _: None)

    def _prefixes(
        self, rng: np.random.Generator, count: int, extras: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        if "prefix_id" in extras or "num_prefix_tokens" in extras:
            ids = extras.get("prefix_id", np.full(count, -1, dtype=np.int64))
            tokens = extras.get("num_prefix_tokens", np.zeros(count, dtype=np.int64))
            return ids, np.where(ids >= 0, tokens, 0)
        if self.shared_prefix is None:
            return np.full(count, -1, dtype=np.int64), np.zeros(count, dtype=np.int64)
        sp = self.shared_prefix
        group = rng.integers(0, sp.num_groups, size=count)
        shared = rng.random(count) < sp.fraction
        return np.where(shared, group, -1), np.where(shared, sp.prefix_len, 0).astype(np.int64)

    def _clip(self, a: RequestArrays, trace_max_tokens: bool) -> None:
        """Cap outputs by a fixed max_tokens, then fit prompt + output into max_model_len; count each.

        A trace row's prompt is never shortened: a prompt longer than max_model_len is sent as it
        is and the engine rejects it, as vLLM does (drawn prompts are clipped to the context)."""
        clipped = dict.fromkeys(CLIP_KEYS, 0)
        if self.max_tokens is not None and not trace_max_tokens:
            over = a.num_output_tokens > self.max_tokens
            clipped["output_capped_by_max_tokens"] = int(over.sum())
            a.num_output_tokens = np.minimum(a.num_output_tokens, self.max_tokens)
            a.max_tokens = np.full_like(a.num_output_tokens, self.max_tokens)
        elif not trace_max_tokens:
            a.max_tokens = a.num_output_tokens
        else:
            a.max_tokens = np.where(a.max_tokens > 0, a.max_tokens, a.num_output_tokens)  # blank cell: 0
            over = a.num_output_tokens > a.max_tokens
            clipped["output_capped_by_max_tokens"] = int(over.sum())
            a.num_output_tokens = np.minimum(a.num_output_tokens, a.max_tokens)
        mml = self.max_model_len
        if mml is not None:
            over = a.num_prompt_tokens > mml - 1
            if self.trace is not None:
                clipped["prompt_over_max_model_len"] = int((a.num_prompt_tokens > mml).sum())
            else:
                clipped["prompt"] = int(over.sum())
                a.num_prompt_tokens = np.minimum(a.num_prompt_tokens, mml - 1)
            room = np.maximum(mml - a.num_prompt_tokens, 1)
            fits = a.num_prompt_tokens <= mml  # rows the engine will reject keep their lengths
            clipped["output"] = int(((a.num_output_tokens > room) & fits).sum())
            a.num_output_tokens = np.where(fits, np.minimum(a.num_output_tokens, room), a.num_output_tokens)
            clipped["max_tokens"] = int(((a.max_tokens > room) & fits).sum())
            a.max_tokens = np.where(fits, np.minimum(a.max_tokens, room), a.max_tokens)
        a.num_prefix_tokens = np.minimum(a.num_prefix_tokens, a.num_prompt_tokens)
        a.stats["clipped"] = clipped

    def sample_requests(self, seed: np.random.SeedSequence | int, limit: int | None = None) -> list[Request]:
        """The requests as the process would submit them (arrival_s planned; 0 for a closed loop);
        with `limit`, only the first `limit` (what `kvsim workloads show` samples)."""
        return self.draw(seed, limit)[0]

    def draw(
        self, seed: np.random.SeedSequence | int, limit: int | None = None
    ) -> tuple[list[Request], GenerationStats | None]:
        """`sample_requests`, plus the whole generation's counts (None when `limit` stopped it early)."""
        out: list[Request] = []
        chunks = self.iter_arrays(seed, min(CHUNK, limit or CHUNK))
        try:
            while limit is None or limit >= self.num_requests or len(out) < limit:
                out.extend(next(chunks).to_requests())
        except StopIteration as stop:
            return out[:limit], stop.value
        return out[:limit], None

    def process(
        self, env: simpy.Environment, sink: RequestSink, seed: np.random.SeedSequence
    ) -> Generator[simpy.Event, Any, GenerationStats]:
        """SimPy process: submit every request to `sink`, a chunk of requests at a time, then return
        the generation's counts (the process event's value)."""
        done: list[GenerationStats] = []

        def chunks() -> Iterator[RequestArrays]:
            done.append((yield from self.iter_arrays(seed)))

        if isinstance(self.arrival, ClosedLoop):
            stream = (pair for arrays in chunks() for pair in zip(
                arrays.to_requests(), arrays.think_s.tolist(), strict=True))  # fmt: skip
            clients = min(self.arrival.concurrency, int(self.num_requests))
            yield from closed_loop_process(env, sink, stream, clients)
        else:
            yield from open_loop_process(env, sink, ((a.to_requests(), a.arrival_s) for a in chunks()))
        assert done, "the arrival process returned before the workload's last request"
        return done[0]

    # --- reporting --------------------------------------------------------------------------

    def warnings(self, stats: GenerationStats | None = None) -> list[str]:
        """Loud lines about a generation (`stats`, as `process`/`iter_arrays` return them): clipping
        that changed a large share of the traffic (LOUD_CLIP_SHARE or more), and trace prompts the
        engine will reject."""
        clipped = (stats or {}).get("clipped") or {}
        total = int(self.num_requests)
        lines = [
            f"clipped {count:,} of {total:,} {what} lengths ({100 * count / total:.0f}%) to fit "
            f"max_model_len {self.max_model_len}: the traffic simulated is not the workload's"
            for what in ("prompt", "output")
            if (count := clipped.get(what, 0)) and count >= LOUD_CLIP_SHARE * total
        ]
        over = clipped.get("prompt_over_max_model_len", 0)
        if over:
            lines.append(
                f"{over:,} trace rows have prompts longer than max_model_len {self.max_model_len}; "
                "they are sent whole and rejected, as vLLM rejects them"
            )
        return lines

    def notes(self, stats: GenerationStats | None = None) -> list[str]:
        """Human-readable lines about rows left out by options and, given a generation's `stats`,
        lengths it clipped (those not loud enough for `warnings`)."""
        total = int(self.num_requests)
        clipped = (stats or {}).get("clipped") or {}
        lines = [
            f"clipped {count} {what} lengths to fit max_model_len {self.max_model_len}"
            for what, count in clipped.items()
            if count and what in ("prompt", "output") and count < LOUD_CLIP_SHARE * total
        ]
        capped = clipped.get("output_capped_by_max_tokens", 0)
        if capped:
            lines.append(f"capped {capped} outputs at max_tokens")
        if self.trace is None:
            return lines
        first, last = window_rows(self.trace, self.trace_options)
        total, available = len(self.trace), last - first
        if available < total:
            w = self.trace_options.window_s
            lines.append(f"skipped {total - available} of {total} trace rows outside window_s [{w[0]}, {w[1]}) s")
        if self.num_requests < available:
            how = "the first" if self.trace_options.sample == "head" else "a uniform random sample of"
            lines.append(
                f"skipped {available - self.num_requests} of {available} trace rows: "
                f"num_requests={self.num_requests} replays {how} {self.num_requests}"
            )
        return lines

    def describe(self, stats: GenerationStats | None = None) -> dict[str, Any]:
        """JSON-serialisable parameters; `generation` holds a generation's counts when given (a
        run's record), else {} (the workload alone, e.g. a sweep point's id)."""
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "num_requests": int(self.num_requests),
            "arrival": self.arrival.describe(),
            "prompt_len": self.prompt_len.describe() if self.prompt_len is not None else "trace",
            "output_len": self.output_len.describe() if self.output_len is not None else "trace",
            "max_tokens": self.max_tokens,
            "n": self.n.describe(),
            "beam_width": self.beam_width.describe(),
            "shared_prefix": self.shared_prefix.describe() if self.shared_prefix else None,
            "max_model_len": self.max_model_len,
        }
        if self.trace is not None:
            out["trace"] = {
                "path": self.trace.source,
                "format": self.trace.format,
                "rows": len(self.trace),
                **self.trace_options.describe(),
                "prompt_scale": self.prompt_scale,
                "output_scale": self.output_scale,
            }
        out["notes"] = self.notes(stats)
        out["generation"] = _jsonable(stats or {})
        return out


def _scaled(values: np.ndarray, scale: float) -> np.ndarray:
    if scale == 1.0:
        return values.astype(np.int64)
    return np.maximum(np.rint(values * scale), 1).astype(np.int64)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value
