"""Workload files: the named YAML catalog, strict parsing, and CLI overrides.

The schema is documented in workloads/README.md. Parsing is strict: an unknown field, a wrong
type or an out-of-range value is a WorkloadError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import math
import os
import reprlib
from pathlib import Path
from typing import Any

from kvsim.simcore.errors import WorkloadError
from kvsim.simcore.userfiles import is_special, read_text, shown
from kvsim.workloads.arrivals import (
    MAX_BURSTINESS,
    MAX_RATE,
    MIN_BURSTINESS,
    MIN_RATE,
    ArrivalProcess,
    BatchArrivals,
    ClosedLoop,
    FixedRateArrivals,
    GammaArrivals,
    PiecewiseRateArrivals,
    TraceArrivals,
    diurnal_schedule,
)
from kvsim.workloads.lengths import (
    Categorical,
    Empirical,
    Fixed,
    LengthDist,
    LogNormal,
    Normal,
    Uniform,
    Zipf,
)
from kvsim.workloads.sessions import SessionTrace, SessionWorkload
from kvsim.workloads.spec import SharedPrefix, WorkloadSpec
from kvsim.workloads.traces import MAX_INTEGER, Trace, TraceOptions, read_trace, window_rows

CATALOG_DIR = Path(__file__).resolve().parent
DATA_DIR = CATALOG_DIR / "data"
DEFAULT_WORKLOAD = "sharegpt"
TRACE_SUFFIXES = (".csv", ".jsonl", ".json")
YAML_SUFFIXES = (".yaml", ".yml")

TOP_FIELDS = (
    "name", "description", "num_requests", "arrival", "prompt_len", "output_len",
    "max_tokens", "n", "beam_width", "shared_prefix", "trace", "sessions", "first_prompt_len",
)  # fmt: skip
SESSION_FIELDS = ("num_sessions", "turns", "think_time_s", "think_time_dist")
ARRIVAL_FIELDS = {
    "poisson": ("rate",),
    "gamma": ("rate", "burstiness"),
    "fixed_rate": ("rate",),
    "batch": ("size", "interval_s"),
    "piecewise": ("schedule", "period_s"),
    "diurnal": ("mean_rate", "peak_to_trough", "period_s", "steps"),
    "closed_loop": ("concurrency", "think_time_s", "think_time_dist"),
    "trace": (),
}
LENGTH_FIELDS = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "lognormal": ("mean", "std", "cv"),
    "zipf": ("a", "high", "scale"),
    "empirical": ("trace", "column", "scale"),
}
TRACE_FIELDS = ("path", "window_s", "sample", "rescale_rate")
PREFIX_FIELDS = ("num_groups", "prefix_len", "fraction")
CHOICE_FIELDS = ("values", "weights")
OVERRIDE_KEYS = (
    "num_requests", "rate", "concurrency", "burstiness", "input_len", "output_len",
    "max_tokens", "n", "beam_width", "think_time_s",
)  # fmt: skip
_MISSING = object()
ZIPF_MAX_HIGH = 2**20  # ranks of a zipf length: its pmf is an array of this many floats (8 MiB)
DIURNAL_MAX_STEPS = 100_000  # constant-rate steps of one diurnal period (24 = hourly)


class _Fields:
    """A YAML mapping being read: every lookup names its dotted field, every leftover key is an error."""

    def __init__(self, file: str, where: str, data: Any, allowed: tuple[str, ...]) -> None:
        self.file, self.where = file, where
        if not isinstance(data, dict):
            if not where:
                raise WorkloadError(f"workload file {file}: expected a mapping of fields, got {type(data).__name__}")
            raise self.error(where, f"must be a mapping, got {_shown(data)}")
        unknown = [k for k in data if k not in allowed]
        if unknown:
            field = f"{where}.{unknown[0]}" if where else str(unknown[0])
            raise WorkloadError(
                f"workload file {file}: unknown field '{field}' (expected one of: {', '.join(allowed)})"
            )
        self.data = data

    def error(self, field: str, message: str) -> WorkloadError:
        return WorkloadError(f"workload file {self.file}: field '{field}' {message}")

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.data and self.data[key] is not None:
            return self.data[key]
        if default is _MISSING:
            raise self.error(self.path(key), "is required")
        return default

    def number(self, key: str, default: Any = _MISSING, *, integer: bool = False, minimum: float = 0.0,
               strict: bool = False, maximum: float = MAX_INTEGER) -> Any:  # fmt: skip
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        ok = _is_number(value) and math.isfinite(value) and (not integer or float(value).is_integer())
        ok = ok and (value > minimum if strict else value >= minimum)
        if not ok:
            kind = "an integer" if integer else "a number"
            raise self.error(self.path(key), f"must be {kind} {'>' if strict else '>='} {minimum:g}, got {_shown(value)}")
        if value > maximum:  # past 2**53 nothing is exact, and no workload is that large
            raise self.error(self.path(key), f"must be at most {maximum:,}, got {_shown(value)}")
        return int(value) if integer else float(value)

    def text(self, key: str, default: Any = _MISSING, choices: tuple[str, ...] = ()) -> Any:
        value = self.raw(key, default)
        if not isinstance(value, str) or (choices and value not in choices):
            expected = f"one of {', '.join(choices)}" if choices else "a string"
            raise self.error(self.path(key), f"must be {expected}, got {_shown(value)}")
        return value


_SHOWN = reprlib.Repr()  # a value quoted in an error stays short, even a YAML alias bomb
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxtuple = 2, 6, 6, 6
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 80, 80, 40


def _shown(value: Any) -> str:
    """`repr(value)`, cut to a readable length: YAML aliases can make a small file hold a value
    whose full repr would take gigabytes."""
    text = _SHOWN.repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kinded(file: str, where: str, data: Any, key: str, table: dict[str, tuple[str, ...]]) -> tuple[str, _Fields]:
    """Read a mapping whose `key` ('process' or 'dist') picks the allowed fields."""
    if not isinstance(data, dict):
        raise WorkloadError(f"workload file {file}: field '{where}' must be a mapping, got {_shown(data)}")
    kind = data.get(key)
    if not isinstance(kind, str) or kind not in table:  # (a list or mapping there is not hashable)
        known = {key, *(name for names in table.values() for name in names)}
        unknown = [k for k in data if k not in known]
        if unknown:  # `arrival: {kind: poisson}` is a misspelt key, not a missing one
            raise WorkloadError(
                f"workload file {file}: unknown field '{where}.{unknown[0]}' ('{where}.{key}' says which "
                f"kind: one of {', '.join(table)})"
            )
        raise WorkloadError(
            f"workload file {file}: field '{where}.{key}' must be one of {', '.join(table)}, got {_shown(kind)}"
        )
    return kind, _Fields(file, where, data, (key, *table[kind]))


def _bounded(f: _Fields, key: str, low: float, high: float, default: Any = _MISSING) -> float:
    """A positive number within [low, high] (workloads.arrivals says why), the field named."""
    value = f.number(key, default, strict=True, maximum=math.inf)
    if not low <= value <= high:
        raise f.error(f.path(key), f"must be from {low:g} to {high:g}, got {_shown(value)}")
    return value


def _arrival(file: str, data: Any) -> ArrivalProcess:
    kind, f = _kinded(file, "arrival", data, "process", ARRIVAL_FIELDS)
    if kind == "poisson":
        return GammaArrivals(_bounded(f, "rate", MIN_RATE, MAX_RATE))
    if kind == "gamma":
        return GammaArrivals(_bounded(f, "rate", MIN_RATE, MAX_RATE),
                             _bounded(f, "burstiness", MIN_BURSTINESS, MAX_BURSTINESS, 1.0))
    if kind == "fixed_rate":
        return FixedRateArrivals(_bounded(f, "rate", MIN_RATE, MAX_RATE))
    if kind == "batch":
        return BatchArrivals(f.number("size", 0, integer=True), f.number("interval_s", 0.0))
    if kind == "piecewise":
        steps = f.raw("schedule")
        pair = (list, tuple)
        if not isinstance(steps, list) or not all(
            isinstance(s, pair) and len(s) == 2 and all(_is_number(x) and math.isfinite(x) for x in s) for s in steps
        ):
            raise f.error("arrival.schedule", f"must be a list of [start_s, rate] pairs, got {_shown(steps)}")
        period = f.number("period_s", None, strict=True)
        return PiecewiseRateArrivals(tuple(float(s[0]) for s in steps), tuple(float(s[1]) for s in steps), period)
    if kind == "diurnal":
        return diurnal_schedule(
            f.number("mean_rate", strict=True),
            f.number("peak_to_trough", 1.0, minimum=1.0),
            f.number("period_s", strict=True),
            f.number("steps", 24, integer=True, minimum=2, maximum=DIURNAL_MAX_STEPS),
        )
    if kind == "closed_loop":
        return ClosedLoop(
            f.number("concurrency", integer=True, minimum=1),
            f.number("think_time_s", 0.0),
            f.text("think_time_dist", "fixed", ("fixed", "exponential")),
        )
    return TraceArrivals()


def _find_data(file: str, base: Path, where: str, ref: str) -> Path:
    """A trace path: relative to the workload file, else to the shipped workloads/data/."""
    for candidate in (base / ref, DATA_DIR / ref):
        if candidate.is_file():
            return candidate
    raise WorkloadError(f"workload file {file}: field '{where}' names {_shown(ref)}, which is not a file")


def _whole(value: Any) -> bool:
    """An int, or a float with no fraction (`1e3` parses as 1000.0)."""
    return _is_number(value) and math.isfinite(value) and float(value).is_integer()


def _length(file: str, base: Path, where: str, data: Any) -> LengthDist:
    if _whole(data):
        if not 1 <= data <= MAX_INTEGER:
            raise WorkloadError(
                f"workload file {file}: field '{where}' must be a length from 1 to {MAX_INTEGER:,}, got {_shown(data)}"
            )
        return Fixed(int(data))
    kind, f = _kinded(file, where, data, "dist", LENGTH_FIELDS)
    if kind == "fixed":
        return Fixed(f.number("value", integer=True, minimum=1))
    if kind == "uniform":
        return Uniform(f.number("low", integer=True, minimum=1), f.number("high", integer=True, minimum=1))
    if kind == "normal":
        return Normal(f.number("mean", strict=True), f.number("std"))
    if kind == "lognormal":
        mean = f.number("mean", strict=True)
        if ("std" in data) == ("cv" in data):
            raise f.error(where, "needs exactly one of 'std' or 'cv' (the spread of the lengths)")
        std = f.number("std", strict=True) if "std" in data else mean * f.number("cv", strict=True)
        return LogNormal(mean, std)
    if kind == "zipf":  # its pmf is tabulated over every rank, so the ranks are bounded
        high = f.number("high", integer=True, minimum=1, maximum=ZIPF_MAX_HIGH)
        return Zipf(f.number("a", strict=True), high, f.number("scale", 1.0, strict=True))
    ref = f.text("trace")
    column = f.text("column", choices=("prompt", "output"))
    trace = read_trace(_find_data(file, base, f"{where}.trace", ref))
    values = trace.num_prompt_tokens if column == "prompt" else trace.num_output_tokens
    return Empirical(values, f"{Path(ref).name}:{column}", f.number("scale", 1.0, strict=True))


def _choice(file: str, where: str, data: Any) -> Categorical:
    if _whole(data) and 1 <= data <= MAX_INTEGER:
        return Categorical((int(data),))
    if not isinstance(data, dict):  # `beam_width: 0` is a bad integer, not a missing mapping
        raise WorkloadError(
            f"workload file {file}: field '{where}' must be an integer from 1 to {MAX_INTEGER:,} "
            f"(or {{values: [...], weights: [...]}}), got {_shown(data)}"
        )
    f = _Fields(file, where, data, CHOICE_FIELDS)
    values, weights = f.raw("values"), f.raw("weights", [])
    if not isinstance(values, list) or not isinstance(weights, list):
        raise f.error(where, f"must be an integer or {{values: [...], weights: [...]}}, got {_shown(data)}")
    if not values or not all(_whole(v) and 1 <= v <= MAX_INTEGER for v in values):
        raise f.error(f"{where}.values", f"must be integers >= 1, got {_shown(values)}")
    if not all(_is_number(w) and math.isfinite(w) for w in weights):
        raise f.error(f"{where}.weights", f"must be finite numbers >= 0, got {_shown(weights)}")
    return Categorical(tuple(int(v) for v in values), tuple(float(w) for w in weights))


def _trace_section(file: str, base: Path, data: Any) -> tuple[Trace, TraceOptions]:
    f = _Fields(file, "trace", data, TRACE_FIELDS)
    trace = read_trace(_find_data(file, base, "trace.path", f.text("path")))
    window = f.raw("window_s", None)
    if window is not None and (
        not isinstance(window, list) or len(window) != 2 or not all(_is_number(x) for x in window)
    ):
        raise f.error("trace.window_s", f"must be [start_s, end_s], got {_shown(window)}")
    options = TraceOptions(
        window_s=None if window is None else (float(window[0]), float(window[1])),
        sample=f.text("sample", "head", ("head", "random")),
        rescale_rate=f.number("rescale_rate", None, strict=True),
    )
    return trace, options


def _prefix(file: str, data: Any) -> SharedPrefix | None:
    if data.get("shared_prefix") is None:
        return None
    p = _Fields(file, "shared_prefix", data["shared_prefix"], PREFIX_FIELDS)
    return SharedPrefix(
        p.number("num_groups", integer=True, minimum=1),
        p.number("prefix_len", integer=True, minimum=1),
        p.number("fraction", 1.0),
    )


def parse_sessions(path: Path, data: Any) -> SessionWorkload:
    """A multi-turn session workload (a file with a `sessions:` section)."""
    file = str(path)
    f = _Fields(file, "", data, TOP_FIELDS)
    for key in ("num_requests", "max_tokens", "n", "beam_width"):
        if data.get(key) is not None:
            raise f.error(key, "does not apply to a session workload (sessions.num_sessions counts its sessions)")
    s = _Fields(file, "sessions", data["sessions"], SESSION_FIELDS)
    base = path.parent
    trace = None
    if data.get("trace") is not None:
        t = _Fields(file, "trace", data["trace"], ("path",))
        trace = session_trace(read_trace(_find_data(file, base, "trace.path", t.text("path"))))
    arrival = _arrival(file, f.raw("arrival"))
    if not isinstance(arrival, (GammaArrivals, ClosedLoop, TraceArrivals)):
        raise f.error("arrival.process", "of a session workload must be poisson, gamma, closed_loop or trace "
                      "(it starts sessions; turns follow answers)")
    def dist(key: str) -> Any:
        return _length(file, base, key, f.raw(key)) if data.get(key) is not None or trace is None else None
    num_sessions = s.number("num_sessions", None, integer=True, minimum=1)
    if num_sessions is None:
        if trace is None:
            raise s.error("sessions.num_sessions", "is required (unless a session trace gives the sessions)")
        num_sessions = len(trace.sessions())
    return SessionWorkload(
        name=f.text("name", shown(path.stem)),
        description=f.text("description", ""),
        num_sessions=num_sessions,
        arrival=arrival,
        turns=_length(file, base, "sessions.turns", s.raw("turns")) if trace is None else None,
        prompt_len=dist("prompt_len"),
        first_prompt_len=_length(file, base, "first_prompt_len", data["first_prompt_len"])
        if data.get("first_prompt_len") is not None else None,
        output_len=dist("output_len"),
        think_time_s=s.number("think_time_s", 0.0),
        think_time_dist=s.text("think_time_dist", "exponential", ("fixed", "exponential")),
        shared_prefix=_prefix(file, data),
        trace=trace,
        source=file,
    )


def session_trace(trace: Trace) -> SessionTrace:
    """A kvsim trace with a session_id column, read as turns of sessions."""
    ids = trace.extras.get("session_id")
    if ids is None:
        raise WorkloadError(f"trace file {trace.source}: a session workload needs a session_id column")
    if (ids < 0).any():
        raise WorkloadError(f"trace file {trace.source}: every row of a session trace needs a session_id")
    # a turn's prompt is the conversation so far plus its new tokens (workloads.sessions): these
    # per-request columns have no meaning there and would otherwise be dropped without a word
    ignored = [column for column in trace.extras if column != "session_id"]
    if ignored:
        raise WorkloadError(f"trace file {trace.source}: column {ignored[0]!r} is not read in a session trace "
                            "(a turn's prompt is the conversation so far); leave it out")
    return SessionTrace(trace.source, ids, trace.arrival_s, trace.num_prompt_tokens, trace.num_output_tokens)


def parse_workload(path: Path, data: Any) -> WorkloadSpec | SessionWorkload:
    """Build a WorkloadSpec from a parsed YAML mapping; errors name `path` and the field."""
    file = str(path)
    f = _Fields(file, "", data, TOP_FIELDS)
    if data.get("sessions") is not None:
        return parse_sessions(path, data)
    if data.get("first_prompt_len") is not None:
        raise f.error("first_prompt_len", "applies only to a session workload (a `sessions:` section)")
    base = path.parent
    trace, options = _trace_section(file, base, data["trace"]) if data.get("trace") is not None else (None, TraceOptions())
    if trace is not None and ("prompt_len" in data or "output_len" in data):
        raise f.error("prompt_len", "cannot be combined with 'trace' (the trace gives the lengths)")
    if trace is None:
        prompt_len = _length(file, base, "prompt_len", f.raw("prompt_len"))
        output_len = _length(file, base, "output_len", f.raw("output_len"))
    else:
        prompt_len = output_len = None
    num_requests = f.number("num_requests", None, integer=True, minimum=1)
    if num_requests is None:
        if trace is None:
            raise f.error("num_requests", "is required (unless a trace gives the requests)")
        first, last = window_rows(trace, options)
        num_requests = last - first
    prefix = _prefix(file, data)
    if trace is not None and "session_id" in trace.extras:
        raise f.error("trace", "has a session_id column: replay it as sessions (add a `sessions:` section)")
    return WorkloadSpec(
        name=f.text("name", shown(path.stem)),
        description=f.text("description", ""),
        num_requests=num_requests,
        arrival=_arrival(file, f.raw("arrival")),
        prompt_len=prompt_len,
        output_len=output_len,
        trace=trace,
        trace_options=options,
        max_tokens=f.number("max_tokens", None, integer=True, minimum=1),
        n=_choice(file, "n", f.raw("n", 1)),
        beam_width=_choice(file, "beam_width", f.raw("beam_width", 1)),
        shared_prefix=prefix,
        source=file,
    )


def _read_yaml(path: Path) -> Any:
    import yaml  # here, not at the top: a trace file (.csv, .jsonl) workload needs no PyYAML (~0.04 s)

    from kvsim.workloads.yaml_loader import StrictLoader

    try:
        text = read_text(path, "workload file")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"workload file {path}: cannot read it ({exc.strerror if isinstance(exc, OSError) and exc.strerror else exc})") from None
    if not text.strip():
        raise WorkloadError(f"workload file {path} is empty")
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise WorkloadError(f"workload file {path}: invalid YAML{where} ({problem})") from None
    except RecursionError:
        raise WorkloadError(f"workload file {path}: invalid YAML (nested too deeply)") from None


def load_file(path: Path) -> WorkloadSpec:
    """A workload from a YAML file, or a trace file replayed as it is."""
    try:
        if path.suffix.lower() in TRACE_SUFFIXES:
            trace = read_trace(path)
            if "session_id" in trace.extras:  # turns of conversations, replayed as sessions
                sessions = session_trace(trace)
                return SessionWorkload(
                    name=shown(path.stem), num_sessions=len(sessions.sessions()), arrival=TraceArrivals(), turns=None,
                    prompt_len=None, output_len=None, trace=sessions,
                    description=f"session replay of {shown(path.name)}", source=str(path))
            return WorkloadSpec(
                name=shown(path.stem), num_requests=len(trace), arrival=TraceArrivals(), trace=trace,
                description=f"replay of {shown(path.name)}", source=str(path),
            )  # fmt: skip
        return parse_workload(path, _read_yaml(path))
    except WorkloadError as exc:
        message = str(exc)
        if "file " in message:
            raise
        raise WorkloadError(f"workload file {path}: {message}") from None


def catalog_names() -> list[str]:
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


def resolve(name_or_path: str) -> Path:
    """A catalog name (`seed-table`) or a file path (.yaml / .yml / .csv / .jsonl).

    A catalog name wins over a same-named entry of the current directory unless the path is
    explicit (`./sharegpt`, a slash, a file suffix): a stray file or folder must not change
    what a plain `--workload sharegpt` means."""
    path = Path(name_or_path)
    builtin = CATALOG_DIR / f"{name_or_path}.yaml"
    explicit = "/" in name_or_path or os.sep in name_or_path or path.suffix.lower() in (*YAML_SUFFIXES, *TRACE_SUFFIXES)
    if not explicit and name_or_path in catalog_names():
        return builtin
    if is_special(path):  # a FIFO, /dev/zero: it exists, it is no file to read
        raise WorkloadError(f"workload file {path} is not a regular file")
    if os.path.lexists(path) and not os.path.exists(path):  # not "unknown workload": the user named a file
        raise WorkloadError(f"workload file {path} is a symbolic link to nothing (a dangling link, or a loop)")
    if explicit or path.is_file():
        if path.is_dir():
            raise WorkloadError(f"workload file {path} is a folder, not a file")
        if not path.is_file():
            raise WorkloadError(f"workload file {path} does not exist")
        return path
    raise WorkloadError(
        f"unknown workload {name_or_path!r}; named workloads: {', '.join(catalog_names())} "
        "(or give a .yaml, .csv or .jsonl file)"
    )


def list_workloads() -> list[tuple[str, str]]:
    """(name, one-line description) of every workload in the catalog."""
    rows = []
    for name in catalog_names():
        data = _read_yaml(CATALOG_DIR / f"{name}.yaml")
        description = str(data.get("description", "")) if isinstance(data, dict) else ""
        rows.append((name, description.strip().splitlines()[0] if description.strip() else ""))
    return rows


def apply_overrides(spec: WorkloadSpec, overrides: dict[str, Any] | None) -> WorkloadSpec:
    """Apply CLI flags on top of a file's fields; a None value keeps the file's value."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(given) - set(OVERRIDE_KEYS))
    if unknown:
        raise WorkloadError(f"unknown workload override {unknown[0]!r} (known: {', '.join(OVERRIDE_KEYS)})")
    for key, value in given.items():
        _check_override(key, value)
    if "rate" in given and "concurrency" in given:
        raise WorkloadError("give either --rate (open loop) or --concurrency (closed loop), not both")
    if isinstance(spec, SessionWorkload):
        return _session_overrides(spec, given)
    if "burstiness" in given and "concurrency" in given:  # it would be dropped without a word
        raise WorkloadError("--burstiness shapes open-loop arrivals; a closed loop (--concurrency) has none")
    changes: dict[str, Any] = {}
    arrival = spec.arrival
    arrival, given = _rescale_schedule(arrival, given)
    if "rate" in given or "burstiness" in given:
        if "rate" not in given and not isinstance(arrival, GammaArrivals):
            raise WorkloadError(
                f"burstiness applies to Poisson/Gamma arrivals; workload {spec.name} uses "
                f"'{arrival.describe()['process']}' (also give a rate)"
            )
        rate = given.get("rate", getattr(arrival, "rate", None))
        keep = arrival.burstiness if isinstance(arrival, GammaArrivals) else 1.0
        arrival = GammaArrivals(float(rate), float(given.get("burstiness", keep)))
    if "concurrency" in given:
        think = arrival.think_time_s if isinstance(arrival, ClosedLoop) else 0.0
        dist = arrival.think_time_dist if isinstance(arrival, ClosedLoop) else "fixed"
        arrival = ClosedLoop(int(given["concurrency"]), think, dist)
    if "think_time_s" in given:
        if isinstance(arrival, ClosedLoop):
            arrival = dataclasses.replace(arrival, think_time_s=float(given["think_time_s"]))
        elif given["think_time_s"] != 0:
            raise WorkloadError(f"think time applies to a closed loop; workload {spec.name} is open loop (give a concurrency)")
    changes["arrival"] = arrival
    if "num_requests" in given:
        changes["num_requests"] = int(given["num_requests"])
    for key, dist_field, scale_field, trace_column in (
        ("input_len", "prompt_len", "prompt_scale", "num_prompt_tokens"),
        ("output_len", "output_len", "output_scale", "num_output_tokens"),
    ):
        if key not in given:
            continue
        target = float(given[key])
        if not target >= 1:
            raise WorkloadError(f"{key} must be >= 1, got {given[key]}")
        dist = getattr(spec, dist_field)
        if dist is not None:
            changes[dist_field] = dist.with_mean(target)
        else:  # a trace: scale its lengths so that their mean is the target
            assert spec.trace is not None
            changes[scale_field] = target / float(getattr(spec.trace, trace_column).mean())
    if "max_tokens" in given:
        changes["max_tokens"] = int(given["max_tokens"])
    for key in ("n", "beam_width"):
        if key in given:
            changes[key] = Categorical((int(given[key]),))
    return dataclasses.replace(spec, **changes)


def _rescale_schedule(arrival, given: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A scheduled (diurnal) arrival keeps its shape under --rate: the rate sets its mean, every step
    scaled alike, and is consumed here; with --burstiness (or another arrival) nothing changes."""
    if "rate" not in given or "burstiness" in given or not isinstance(arrival, PiecewiseRateArrivals):
        return arrival, given
    scale = float(given["rate"]) / arrival.mean_rate
    rescaled = dataclasses.replace(arrival, rates=tuple(r * scale for r in arrival.rates))
    return rescaled, {k: v for k, v in given.items() if k != "rate"}


def _session_overrides(spec: SessionWorkload, given: dict[str, Any]) -> SessionWorkload:
    """Overrides of a session workload: --num-requests counts sessions, --rate / --burstiness start
    them, --concurrency runs that many at once, --think-time-s is the think time between turns,
    --input-len / --output-len the mean new user tokens and answer tokens of a turn."""
    for key in ("max_tokens", "n", "beam_width"):
        if key in given:
            raise WorkloadError(f"--{key.replace('_', '-')} does not apply to a session workload")
    changes: dict[str, Any] = {}
    arrival = spec.arrival
    arrival, given = _rescale_schedule(arrival, given)
    if "rate" in given or "burstiness" in given:
        rate = given.get("rate", getattr(arrival, "rate", None))
        if rate is None:
            raise WorkloadError(f"--burstiness shapes session starts; workload {spec.name} needs a --rate too")
        keep = arrival.burstiness if isinstance(arrival, GammaArrivals) else 1.0
        arrival = GammaArrivals(float(rate), float(given.get("burstiness", keep)))
    if "concurrency" in given:
        arrival = ClosedLoop(int(given["concurrency"]))
    changes["arrival"] = arrival
    if "num_requests" in given:
        changes["num_sessions"] = int(given["num_requests"])
    if "think_time_s" in given:
        changes["think_time_s"] = float(given["think_time_s"])
    for key, name in (("input_len", "prompt_len"), ("output_len", "output_len")):
        if key in given:
            dist = getattr(spec, name)
            if dist is None:
                raise WorkloadError(f"--{key.replace('_', '-')} does not rescale a session trace")
            changes[name] = dist.with_mean(float(given[key]))
    return dataclasses.replace(spec, **changes)


# CLI override -> (integer?, lowest allowed, lowest excluded?); each is the flag `--key-with-dashes`.
_OVERRIDE_RANGES = {
    "num_requests": (True, 1, False), "rate": (False, 0, True), "concurrency": (True, 1, False),
    "burstiness": (False, 0, True), "input_len": (False, 1, False), "output_len": (False, 1, False),
    "max_tokens": (True, 1, False), "n": (True, 1, False), "beam_width": (True, 1, False),
    "think_time_s": (False, 0, False),
}


# Overrides with an upper bound too (workloads.arrivals says why): flag -> (lowest, highest), inclusive.
_OVERRIDE_LIMITS = {"rate": (MIN_RATE, MAX_RATE), "burstiness": (MIN_BURSTINESS, MAX_BURSTINESS)}


def _check_override(key: str, value: Any) -> None:
    """An override is a command-line flag: its error names the flag, not the workload field."""
    integer, lowest, strict = _OVERRIDE_RANGES[key]
    flag = f"--{key.replace('_', '-')}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
        # before any float(): a 400-digit integer overflows it
        raise WorkloadError(f"{flag} must be at most {MAX_INTEGER:,}, got {_shown(value)}")
    ok = _is_number(value) and math.isfinite(value) and (not integer or float(value).is_integer())
    ok = ok and (value > lowest if strict else value >= lowest)
    if not ok:
        kind = "an integer" if integer else "a finite number"
        raise WorkloadError(f"--{key.replace('_', '-')} must be {kind} {'>' if strict else '>='} {lowest}, got {value}")
    if key in _OVERRIDE_LIMITS:
        low, high = _OVERRIDE_LIMITS[key]
        if not low <= value <= high:
            raise WorkloadError(f"{flag} must be from {low:g} to {high:g}, got {value:g}")
    if value > MAX_INTEGER:  # past 2**53 counts are not exact (kvsim keeps them in float64 columns too)
        raise WorkloadError(f"{flag} must be at most {MAX_INTEGER:,}, got {value}")


def load_workload(
    name_or_path: str | None, overrides: dict[str, Any] | None = None, max_model_len: int | None = None,
    base: WorkloadSpec | None = None,
) -> WorkloadSpec:
    """The workload `kvsim run --workload` means: a catalog name or a file (or `base`, one built in
    code such as a `--dataset-name`), CLI overrides, then clipping."""
    if name_or_path is not None and not name_or_path.strip():  # not silently the default workload
        raise WorkloadError("--workload is empty; give a named workload (see `kvsim workloads`) or a file")
    spec = base if base is not None else load_file(resolve(name_or_path or DEFAULT_WORKLOAD))
    spec = apply_overrides(spec, overrides)
    if max_model_len is not None:
        for key, room in (("input_len", "one output token"), ("output_len", "a one-token prompt")):
            length = (overrides or {}).get(key)
            if length is not None and length >= max_model_len:  # every request would be clipped
                raise WorkloadError(
                    f"--{key.replace('_', '-')} {length} tokens leaves no room for {room} within "
                    f"max_model_len {max_model_len}"
                )
        spec = dataclasses.replace(spec, max_model_len=int(max_model_len))
    spec.check_span()
    return spec
