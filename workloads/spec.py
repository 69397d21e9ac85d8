"""A runnable workload: an arrival process plus per-request lengths (drawn or replayed from a trace).

`WorkloadSpec` satisfies `simcore.request.Workload`. Generation draws every request's fields
up front with numpy from named streams of one seed, clips them to `max_model_len` (counting
what it clipped), then either replays fixed arrival times or runs a closed loop of clients.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from simcore.errors import WorkloadError
from simcore.request import Request, RequestSink
from workloads.arrivals import (
    ArrivalProcess,
    ClosedLoop,
    TraceArrivals,
    closed_loop_process,
    open_loop_process,
)
from workloads.lengths import Categorical, LengthDist
from workloads.traces import Trace, TraceOptions, select, window_rows

STREAMS = ("arrivals", "prompt", "output", "sampling", "prefix", "think", "trace")


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

    def to_requests(self) -> list[Request]:
        count = len(self.num_prompt_tokens)
        arrivals = self.arrival_s.tolist() if self.arrival_s is not None else [0.0] * count
        prefix_ids = [None if p < 0 else p for p in self.prefix_id.tolist()]
        return [
            Request(i, a, p, o, m, n, b, pid, k)
            for i, (a, p, o, m, n, b, pid, k) in enumerate(
                zip(
                    arrivals,
                    self.num_prompt_tokens.tolist(),
                    self.num_output_tokens.tolist(),
                    self.max_tokens.tolist(),
                    self.n.tolist(),
                    self.beam_width.tolist(),
                    prefix_ids,
                    self.num_prefix_tokens.tolist(),
                    strict=True,
                )
            )
        ]


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
    last_stats: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)  # written by each generation

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

    def _check_fits(self, max_model_len: int) -> None:
        prefix = self.shared_prefix.prefix_len if self.shared_prefix else 0
        fixed = self.prompt_len.mean if self.prompt_len is not None and self.prompt_len.std == 0 else None
        shortest = prefix + (fixed if fixed is not None else 0)
        if shortest >= max_model_len:
            raise WorkloadError(
                f"workload {self.name}: prompt of {int(shortest)} tokens is longer than max_model_len "
                f"{max_model_len} (a request needs room for at least one output token)"
            )

    @property
    def is_closed_loop(self) -> bool:
        return isinstance(self.arrival, ClosedLoop)

    # --- generation -------------------------------------------------------------------------

    def generate(self, seed: np.random.SeedSequence | int) -> RequestArrays:
        """Every request's fields, drawn from `seed`'s named streams; records clip counts in `last_stats`."""
        rng = streams(seed)
        count = int(self.num_requests)
        stats: dict[str, Any] = {}
        times = None
        extras: dict[str, np.ndarray] = {}
        if self.trace is not None:
            chosen = select(self.trace, self.trace_options, count, rng["trace"])
            stats["trace"] = chosen.stats
            prompt = _scaled(self.trace.num_prompt_tokens[chosen.rows], self.prompt_scale)
            output = _scaled(self.trace.num_output_tokens[chosen.rows], self.output_scale)
            extras = {name: column[chosen.rows] for name, column in self.trace.extras.items()}
            times = chosen.arrival_s if isinstance(self.arrival, TraceArrivals) else None
        else:
            assert self.prompt_len is not None and self.output_len is not None
            prompt = self.prompt_len.sample(rng["prompt"], count)
            output = self.output_len.sample(rng["output"], count)
        if times is None and not isinstance(self.arrival, (ClosedLoop, TraceArrivals)):
            times = self.arrival.arrival_times(rng["arrivals"], count)
        prefix_id, prefix_tokens = self._prefixes(rng["prefix"], count, extras)
        prompt = prompt + (prefix_tokens if "num_prefix_tokens" not in extras else 0)
        n = extras.get("n", None)
        beam = extras.get("beam_width", None)
        arrays = RequestArrays(
            arrival_s=times,
            num_prompt_tokens=prompt,
            num_output_tokens=output,
            max_tokens=extras.get("max_tokens", output),
            n=n if n is not None else self.n.sample(rng["sampling"], count),
            beam_width=beam if beam is not None else self.beam_width.sample(rng["sampling"], count),
            prefix_id=prefix_id,
            num_prefix_tokens=prefix_tokens,
            think_s=self.arrival.think_times(rng["think"], count) if isinstance(self.arrival, ClosedLoop) else None,
            stats=stats,
        )
        self._clip(arrays, "max_tokens" in extras and self.max_tokens is None)
        self.last_stats.clear()
        self.last_stats.update(stats)
        return arrays

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
        """Cap outputs by a fixed max_tokens, then fit prompt + output into max_model_len; count each."""
        clipped = {"prompt": 0, "output": 0, "output_capped_by_max_tokens": 0, "max_tokens": 0}
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
            clipped["prompt"] = int(over.sum())
            a.num_prompt_tokens = np.minimum(a.num_prompt_tokens, mml - 1)
            room = mml - a.num_prompt_tokens
            clipped["output"] = int((a.num_output_tokens > room).sum())
            a.num_output_tokens = np.minimum(a.num_output_tokens, room)
            clipped["max_tokens"] = int((a.max_tokens > room).sum())
            a.max_tokens = np.minimum(a.max_tokens, room)
        a.num_prefix_tokens = np.minimum(a.num_prefix_tokens, a.num_prompt_tokens)
        a.stats["clipped"] = clipped

    def sample_requests(self, seed: np.random.SeedSequence | int) -> list[Request]:
        """The requests as the process would submit them (arrival_s planned; 0 for a closed loop)."""
        return self.generate(seed).to_requests()

    def process(
        self, env: simpy.Environment, sink: RequestSink, seed: np.random.SeedSequence
    ) -> Generator[simpy.Event, Any, None]:
        """SimPy process: submit every request to `sink`, then return."""
        arrays = self.generate(seed)
        requests = arrays.to_requests()
        if isinstance(self.arrival, ClosedLoop):
            assert arrays.think_s is not None
            yield from closed_loop_process(env, sink, requests, self.arrival.concurrency, arrays.think_s)
        else:
            assert arrays.arrival_s is not None
            yield from open_loop_process(env, sink, requests, arrays.arrival_s)

    # --- reporting --------------------------------------------------------------------------

    def notes(self) -> list[str]:
        """Human-readable lines about rows left out by options and lengths clipped by the latest generation."""
        lines = [
            f"clipped {count} {what} lengths to fit max_model_len {self.max_model_len}"
            for what, count in (self.last_stats.get("clipped") or {}).items()
            if count and what in ("prompt", "output")
        ]
        capped = (self.last_stats.get("clipped") or {}).get("output_capped_by_max_tokens", 0)
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

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable parameters; `generation` holds the counts of the latest generate()."""
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
        out["notes"] = self.notes()
        out["generation"] = _jsonable(self.last_stats)
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
