"""Read request traces (Azure LLM inference 2023 CSV, kvsim CSV / JSONL) and select rows to replay.

Every problem with a file is a WorkloadError naming the file and the line (line 1 of a CSV is
its header). Nothing is dropped silently: rows left out by a window or by sampling are counted
in `Selection.stats` and reported by the workload's `describe()`.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

import kvsim.simcore.userjson as userjson
from kvsim.simcore.errors import WorkloadError
from kvsim.simcore.userfiles import CAPS, is_special, read_bytes

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
KVSIM_COLUMNS = ("arrival_s", "num_prompt_tokens", "num_output_tokens")
MAX_INTEGER = 2**53  # cells are parsed as float64, which holds integers exactly up to here
# session_id: the rows are turns of conversations (workloads.sessions), num_prompt_tokens then
# counting each turn's new user tokens only
KVSIM_OPTIONAL = ("max_tokens", "n", "beam_width", "prefix_id", "num_prefix_tokens", "session_id")
_MIN_VALUE = {"max_tokens": 1, "n": 1, "beam_width": 1, "prefix_id": 0, "num_prefix_tokens": 0, "session_id": 0}
_BLANK = {"max_tokens": 0, "n": 1, "beam_width": 1, "prefix_id": -1, "num_prefix_tokens": 0,
          "session_id": -1}  # max_tokens 0 = the output


@dataclass(frozen=True, slots=True)
class Trace:
    """A validated trace: per-row arrays, sorted by arrival time, times relative to the first row."""

    source: str  # the file, for messages
    format: str  # "azure" or "kvsim"
    arrival_s: np.ndarray = field(repr=False, compare=False)  # float64, non-decreasing, arrival_s[0] == 0
    num_prompt_tokens: np.ndarray = field(repr=False, compare=False)  # int64 >= 1
    num_output_tokens: np.ndarray = field(repr=False, compare=False)  # int64 >= 1
    extras: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)  # optional columns

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace file; cached per (path, size, mtime) because sweeps reload it."""
    p = Path(path)
    if is_special(p):  # a FIFO or /dev/zero: it exists, and is no file to read
        raise WorkloadError(f"trace file {p} is not a regular file")
    if not p.is_file():
        raise WorkloadError(f"trace file {p} does not exist")
    st = p.stat()
    if st.st_size > CAPS["trace"]:
        raise WorkloadError(f"trace file {p}: {st.st_size / 2**20:,.0f} MiB is larger than the "
                            f"{CAPS['trace'] >> 20:,} MiB kvsim reads from a trace")
    return _read_trace_cached(str(p.resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _read_trace_cached(path: str, size: int, mtime_ns: int) -> Trace:
    if size == 0:
        raise WorkloadError(f"trace file {path} is empty")
    try:
        data = read_bytes(path, "trace")  # bounded: a file swapped for a device after the stat above
        trace = None if path.endswith((".jsonl", ".json")) else _read_plain_csv(path, data)
        if trace is not None:
            return trace
        frame, lines = _read_jsonl(path, data) if path.endswith((".jsonl", ".json")) else _read_csv(path, data)
    except OSError as exc:  # unreadable (permissions), or gone while reading
        raise WorkloadError(f"trace file {path}: cannot read it ({exc.strerror or exc})") from None
    if len(frame) == 0:
        raise WorkloadError(f"trace file {path} has a header but no rows")
    return _frozen(_validate(path, frame, lines))


def _frozen(trace: Trace) -> Trace:
    for array in (trace.arrival_s, trace.num_prompt_tokens, trace.num_output_tokens, *trace.extras.values()):
        array.flags.writeable = False  # shared through the cache
    return trace


_ISO_STAMPS = re.compile(r"(?:[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?\n)+")
_NS_PER_S = 1_000_000_000
_MAX_DIGITS = 16  # 2**53 has 16 digits; longer cells (leading zeros) are left to pandas
_COMMA, _NEWLINE, _ZERO = ord(","), ord("\n"), ord("0")
# One plain ISO 8601 stamp, `2023-11-16 18:15:46[.6805900]`, character by character (_ISO_STAMPS' line)
_STAMP_DIGITS = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18)
_STAMP_PUNCTUATION = {4: b"-", 7: b"-", 10: b" T", 13: b":", 16: b":"}


def _read_plain_csv(path: str, data: bytes | None = None) -> Trace | None:
    """A plain CSV trace read without pandas, else None (then `_read_csv` reads it and words any error).

    Importing pandas costs more than generating and simulating a short run (the peer workload's
    lengths come from the Azure trace), so the common file is read here: ASCII, no quotes, lines
    ending in LF or CRLF, no blank lines, every row as wide as the header, every cell of a column
    kvsim reads a whole number up to 2**53 (>= 1 for lengths), TIMESTAMP cells plain
    ISO 8601 (`2023-11-16 18:15:46.6805900`), rows sorted, no optional kvsim column. The Trace is
    the one `_validate` builds from pandas, value for value (seconds as pandas' `total_seconds`).
    The cells are located and parsed as numpy arrays over the file's bytes: a Python string per
    cell cost more than the rest of a short run's setup.
    """
    if data is None:
        data = read_bytes(path, "trace")
    data = data.replace(b"\r\n", b"\n")
    if not data.isascii() or b'"' in data or b"\r" in data:
        return None
    first, _, body = data.partition(b"\n")
    header = [name.strip() for name in first.decode("ascii").split(",")]
    width, columns = len(header), set(header)
    is_azure = bool(columns & set(AZURE_COLUMNS))
    required = AZURE_COLUMNS if is_azure else KVSIM_COLUMNS
    if len(columns) != width or not columns.issuperset(required) or columns & set(KVSIM_OPTIONAL):
        return None  # duplicate or missing columns, or optional columns (may hold blanks): pandas path
    raw = np.frombuffer(body if body.endswith(b"\n") else body + b"\n", np.uint8)
    ends = np.flatnonzero((raw == _COMMA) | (raw == _NEWLINE))  # where each cell ends
    num_rows = int(np.count_nonzero(raw[ends] == _NEWLINE))
    if num_rows == 0 or len(ends) != num_rows * width:
        return None
    separators = raw[ends].reshape(num_rows, width)  # each row: width - 1 commas, then its newline
    if (separators[:, :-1] != _COMMA).any() or (separators[:, -1] != _NEWLINE).any():
        return None
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    cell = {name: (starts[i::width], ends[i::width]) for i, name in enumerate(header) if name in required}
    time_col, prompt_col, output_col = required
    numbers = {}
    for name in (prompt_col, output_col) if is_azure else required:
        numbers[name] = _plain_integers(raw, *cell[name])
        if numbers[name] is None or numbers[name].max() > MAX_INTEGER:
            return None
    if numbers[prompt_col].min() < 1 or numbers[output_col].min() < 1:
        return None
    if is_azure:
        arrival = _plain_timestamps(raw, *cell[time_col])
        if arrival is None:
            return None
    else:
        arrival = numbers[time_col].astype(np.float64)
    if (np.diff(arrival) < 0).any():
        return None
    return _frozen(Trace(
        source=path, format="azure" if is_azure else "kvsim", arrival_s=arrival - arrival[0],
        num_prompt_tokens=numbers[prompt_col], num_output_tokens=numbers[output_col],
    ))  # fmt: skip


def _plain_integers(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """The cells `raw[starts:ends]` as int64 when each is 1 to 16 ASCII digits, else None.

    Horner's rule over the digit places, left to right (value * 10 + digit while a cell has
    places left): one pass of whole-column operations per place, exactly the integer the text
    spells (16 digits stay below 2**63)."""
    lengths = ends - starts
    if lengths.min() < 1 or lengths.max() > _MAX_DIGITS:  # an empty cell, or leading zeros past 16 digits
        return None
    last = len(raw) - 1
    value = np.zeros(len(starts), dtype=np.int64)
    for place in range(int(lengths.max())):
        inside = lengths > place
        digit = raw[np.minimum(starts + place, last)] - np.uint8(_ZERO)  # below "0" wraps past 9
        if ((digit > 9) & inside).any():
            return None
        value = np.where(inside, value * 10 + digit, value)
    return value


def _plain_timestamps(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """Seconds since the first stamp, computed as `_timestamps` does (pandas' total_seconds: whole
    seconds + remaining nanoseconds / 1e9); None unless every stamp is plain ISO 8601 and a real
    date and time (numpy's datetime64 refuses month 13, Feb 29 of a common year, hour 24, second
    60 ...: the pandas path says which line)."""
    stamps = _stamp_table(raw, starts, ends)
    if stamps is None:
        return None

    def number(first: int, last: int) -> np.ndarray:  # the digits in columns first..last
        value = stamps[:, first].astype(np.int64) - _ZERO
        for column in range(first + 1, last + 1):
            value = value * 10 + stamps[:, column] - _ZERO
        return value

    years, months, days = number(0, 3), number(5, 6), number(8, 9)
    hours, minutes, seconds = number(11, 12), number(14, 15), number(17, 18)
    if years.min() < 1678 or years.max() > 2261:  # numpy's datetime64[ns] wraps outside
        return None
    leap = (years % 4 == 0) & ((years % 100 != 0) | (years % 400 == 0))
    month_days = _MONTH_DAYS[np.clip(months, 1, 12)] + (leap & (months == 2))
    if ((months < 1) | (months > 12) | (days < 1) | (days > month_days)).any() or (
        hours.max() > 23 or minutes.max() > 59 or seconds.max() > 59
    ):
        return None
    fraction_ns = np.zeros(len(stamps), dtype=np.int64)
    for column in range(20, stamps.shape[1]):  # the fraction's digits; NUL pads a shorter stamp
        digit = stamps[:, column].astype(np.int64) - _ZERO
        fraction_ns += np.where(digit >= 0, digit, 0) * 10 ** (28 - column)
    ns = (_days_since_epoch(years, months, days) * 86_400 + hours * 3600 + minutes * 60 + seconds) * _NS_PER_S
    ns += fraction_ns  # numpy's datetime64[ns] of the same text, exactly (integers throughout)
    ticks = ns - ns[0]
    if (np.abs(ticks) > 2**53).any():  # pandas nudges results off whole seconds there
        return None
    whole, fraction = np.divmod(ticks, _NS_PER_S)
    return whole + fraction / _NS_PER_S


_MONTH_DAYS = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


def _days_since_epoch(years: np.ndarray, months: np.ndarray, days: np.ndarray) -> np.ndarray:
    """Days from 1970-01-01 to each proleptic Gregorian date (H. Hinnant, "chrono-Compatible
    Low-Level Date Algorithms", days_from_civil; years here are >= 1678, so no negative eras)."""
    y = years - (months <= 2)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * ((months + 9) % 12) + 2) // 5 + days - 1  # March 1st is day 0
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def _stamp_table(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """The stamps as a rows x characters uint8 table (shorter ones padded with NUL, which numpy's
    bytes ignore), or None unless each is `YYYY-MM-DD[ T]HH:MM:SS[.fraction of 1-9 digits]`.

    Stamps of one width (a whole trace, usually) are checked position by position; mixed widths
    go through the `_ISO_STAMPS` pattern."""
    lengths = ends - starts
    width = int(lengths.max())
    if lengths.min() == width:
        if not (width == 19 or 21 <= width <= 29):
            return None
        stamps = np.lib.stride_tricks.sliding_window_view(raw, width)[starts]  # row i: raw[starts[i]:][:width]
        digits = [*_STAMP_DIGITS, *range(20, width)]  # the fraction's digits after its "."
        punctuation = {**_STAMP_PUNCTUATION, **({19: b"."} if width > 19 else {})}
        if (stamps[:, digits] - np.uint8(_ZERO) > 9).any():
            return None
        for column, allowed in punctuation.items():
            found = stamps[:, column]
            ok = found == allowed[0]
            for other in allowed[1:]:
                ok |= found == other
            if not ok.all():
                return None
        return stamps
    text = raw.tobytes().decode("ascii")
    strings = [text[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
    if _ISO_STAMPS.fullmatch("\n".join(strings) + "\n") is None:
        return None
    return np.array(strings, dtype=f"S{width}").view(np.uint8).reshape(len(strings), width)


def _check_header(path: str, data: bytes) -> None:
    """A column named twice is refused: pandas would rename the second (`x.1`) and the trace
    would silently be read from the first."""
    import csv

    first = data.split(b"\n", 1)[0].decode("utf-8-sig", errors="replace").rstrip("\r")
    try:
        names = next(csv.reader([first]), [])
    except csv.Error:
        return  # pandas words what is wrong with it
    seen: set[str] = set()
    for name in (n.strip() for n in names):
        if name in seen and name:
            raise WorkloadError(f"trace file {path}, line 1: column {name!r} is given twice")
        seen.add(name)


def _read_csv(path: str, data: bytes | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    import io

    import pandas as pd

    if data is None:
        data = read_bytes(path, "trace")
    _check_header(path, data)
    try:
        with warnings.catch_warnings():  # a row longer than the header: pandas warns, we refuse
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False, skipinitialspace=True,
                                index_col=False, encoding="utf-8")
    except pd.errors.EmptyDataError:
        raise WorkloadError(f"trace file {path} is empty") from None
    except (pd.errors.ParserError, pd.errors.ParserWarning, UnicodeDecodeError) as exc:
        raise WorkloadError(f"trace file {path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    return frame, np.arange(len(frame)) + 2  # line 1 is the header


def _read_jsonl(path: str, data: bytes | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    import pandas as pd

    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    if data is None:
        data = read_bytes(path, "trace")
    try:  # lines as a text-mode file splits them (universal newlines)
        text_lines = data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"trace file {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, text in enumerate(text_lines, start=1):
        if not text.strip():
            continue
        try:
            row = userjson.loads(text)
        except ValueError as exc:  # JSONDecodeError, a key given twice, nesting too deep
            raise WorkloadError(f"trace file {path}, line {number}: invalid JSON ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(row, dict):
            raise WorkloadError(f"trace file {path}, line {number}: expected a JSON object per line")
        rows.append(row)
        lines.append(number)
    if not rows:
        raise WorkloadError(f"trace file {path} is empty")
    frame = pd.DataFrame(rows)
    for name in frame.columns:
        frame[name] = frame[name].map(_jsonl_cell)
    return frame, np.asarray(lines)


def _jsonl_cell(value: Any) -> Any:
    """A row without the key is as bad as a missing CSV cell; JSON `true` is not the number 1."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"  # refused as not a number, and named as written
    return value


def _validate(path: str, frame: pd.DataFrame, lines: np.ndarray) -> Trace:
    columns = set(frame.columns)
    is_azure = bool(columns & set(AZURE_COLUMNS))
    required = AZURE_COLUMNS if is_azure else KVSIM_COLUMNS
    missing = [c for c in required if c not in columns]
    if missing:
        kind = "an Azure trace" if is_azure else "a kvsim trace"
        raise WorkloadError(
            f"trace file {path}: missing column {', '.join(repr(c) for c in missing)} "
            f"({kind} needs {', '.join(required)}; found {', '.join(frame.columns)})"
        )
    if is_azure:
        time_col, prompt_col, output_col = AZURE_COLUMNS
        arrival = _timestamps(path, frame[time_col], lines)
    else:
        time_col, prompt_col, output_col = KVSIM_COLUMNS
        arrival = _seconds(path, frame[time_col], lines)
    _check_sorted(path, frame[time_col], arrival, lines, time_col)
    extras = {}
    if not is_azure:
        extras = {
            c: _integers(path, frame[c], lines, c, _MIN_VALUE[c], _BLANK[c]) for c in KVSIM_OPTIONAL if c in columns
        }
    return Trace(
        source=path,
        format="azure" if is_azure else "kvsim",
        arrival_s=arrival - arrival[0],
        num_prompt_tokens=_integers(path, frame[prompt_col], lines, prompt_col, 1),
        num_output_tokens=_integers(path, frame[output_col], lines, output_col, 1),
        extras=extras,
    )


def _first_bad(bad: np.ndarray) -> int | None:
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else None


def _integers(
    path: str, column: pd.Series, lines: np.ndarray, name: str, minimum: int, blank: int | None = None
) -> np.ndarray:
    """Whole numbers >= minimum; an empty cell becomes `blank` when the column is optional."""
    import pandas as pd

    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    if blank is not None:
        values[column.astype(str).str.strip().to_numpy() == ""] = blank
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values != np.floor(values)) | ((values < minimum) & (values != blank))
        bad |= values > MAX_INTEGER
    row = _first_bad(bad)
    if row is not None:
        limit = f"from {minimum} to {MAX_INTEGER:,}" if values[row] > MAX_INTEGER else f">= {minimum}"
        raise WorkloadError(
            f"trace file {path}, line {lines[row]}: {name} is {column.iloc[row]!r}, expected an integer {limit}"
        )
    return values.astype(np.int64)


def _seconds(path: str, column: pd.Series, lines: np.ndarray) -> np.ndarray:
    import pandas as pd

    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    row = _first_bad(~np.isfinite(values) | (values < 0))
    if row is not None:
        raise WorkloadError(
            f"trace file {path}, line {lines[row]}: arrival_s is {column.iloc[row]!r}, expected seconds >= 0"
        )
    return values


def _timestamps(path: str, column: pd.Series, lines: np.ndarray) -> np.ndarray:
    import pandas as pd

    stamps = pd.to_datetime(column.astype(str), format="ISO8601", errors="coerce")
    row = _first_bad(stamps.isna().to_numpy())
    if row is not None:
        raise WorkloadError(
            f"trace file {path}, line {lines[row]}: cannot parse TIMESTAMP {column.iloc[row]!r} "
            "(expected e.g. 2023-11-16 18:15:46.6805900)"
        )
    return (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy(dtype=np.float64)


def _check_sorted(path: str, column: pd.Series, times: np.ndarray, lines: np.ndarray, name: str) -> None:
    row = _first_bad(np.diff(times) < 0)
    if row is not None:
        raise WorkloadError(
            f"trace file {path}, line {lines[row + 1]}: {name} {column.iloc[row + 1]!r} is earlier than the "
            f"previous row's {column.iloc[row]!r}; traces must be sorted by time"
        )


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How to cut a trace: a time window, how to pick N rows from it, and an optional new rate."""

    window_s: tuple[float, float] | None = None  # [start, end) seconds after the trace's first row
    sample: str = "head"  # "head": the first N rows of the window; "random": N rows drawn uniformly, in order
    rescale_rate: float | None = None  # stretch/squeeze time so the mean gap is 1/rescale_rate

    def __post_init__(self) -> None:
        if self.window_s is not None:
            start, end = self.window_s
            if not (0 <= start < end):
                raise WorkloadError(f"trace window_s must be [start, end] with 0 <= start < end, got {list(self.window_s)}")
        if self.sample not in ("head", "random"):
            raise WorkloadError(f"trace sample must be 'head' or 'random', got {self.sample!r}")
        from kvsim.workloads.arrivals import MAX_RATE, MIN_RATE

        if self.rescale_rate is not None and not (self.rescale_rate > 0 and np.isfinite(self.rescale_rate)):
            raise WorkloadError(f"trace rescale_rate must be > 0, got {self.rescale_rate}")
        if self.rescale_rate is not None and not MIN_RATE <= self.rescale_rate <= MAX_RATE:
            raise WorkloadError(
                f"trace rescale_rate must be from {MIN_RATE:g} to {MAX_RATE:g} req/s, got {self.rescale_rate:g}"
            )

    def describe(self) -> dict[str, Any]:
        return {
            "window_s": None if self.window_s is None else [float(x) for x in self.window_s],
            "sample": self.sample,
            "rescale_rate": self.rescale_rate,
        }


def window_rows(trace: Trace, options: TraceOptions) -> tuple[int, int]:
    """Row range [first, last) of the trace inside the window."""
    if options.window_s is None:
        return 0, len(trace)
    start, end = options.window_s
    first = int(np.searchsorted(trace.arrival_s, start, side="left"))
    last = int(np.searchsorted(trace.arrival_s, end, side="left"))
    if last <= first:
        raise WorkloadError(
            f"trace {trace.source}: window_s [{start}, {end}) holds no requests "
            f"(the trace spans 0 to {trace.duration_s:.1f} s)"
        )
    return first, last


@dataclass(frozen=True, slots=True)
class Selection:
    """The rows to replay, their replay times (first at 0) and what was left out."""

    rows: np.ndarray  # int64 row indices into the trace, increasing
    arrival_s: np.ndarray  # float64, replay time of each selected row
    stats: dict[str, Any]


def select(trace: Trace, options: TraceOptions, num_requests: int, rng: np.random.Generator) -> Selection:
    """Window, then pick `num_requests` rows (head or uniform sample), then shift to 0 and rescale."""
    first, last = window_rows(trace, options)
    available = last - first
    if num_requests > available:
        raise WorkloadError(
            f"trace {trace.source}: asked for {num_requests} requests but "
            f"{'the window holds' if options.window_s else 'it has'} only {available}"
        )
    if options.sample == "random" and num_requests < available:
        rows = first + np.sort(rng.choice(available, size=num_requests, replace=False))
    else:
        rows = np.arange(first, first + num_requests)
    times = trace.arrival_s[rows] - trace.arrival_s[rows[0]]
    span = float(times[-1])
    observed_rate = (num_requests - 1) / span if span > 0 else None
    if options.rescale_rate is not None:
        if observed_rate is None:
            raise WorkloadError(
                f"trace {trace.source}: cannot rescale to {options.rescale_rate} req/s: "
                "the selected rows need at least two different timestamps"
            )
        times = times * (observed_rate / options.rescale_rate)
    stats = {
        "rows_total": len(trace),
        "rows_outside_window": len(trace) - available,
        "rows_not_sampled": available - num_requests,
        "rows_used": int(num_requests),
        "observed_rate": observed_rate,
        "replay_rate": options.rescale_rate if options.rescale_rate is not None else observed_rate,
    }
    return Selection(rows=rows, arrival_s=times, stats=stats)
