"""What a run keeps of its requests and latencies, in memory bounded by caps, not by run length.

    Samples        latency values (ITL, TTFT, TPOT, E2EL): every value while <= cap, so
                   percentiles are numpy's exactly; beyond the cap a log-spaced histogram
                   (bins of relative width 2**-14 ~ 6.1e-5), mean / min / max still exact.
    RequestRecords one row per request that left (finished or rejected), numpy column
                   chunks (~70 bytes a request, reject reasons as codes into a small table),
                   fed once per request by the lifecycle, never per token.

Why: a day-long trace or a 10M-request run must fit in a few hundred MB (issues 10 and 11);
the per-request objects (`ReqState`, its SimPy event) are dropped as soon as a request leaves.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from kvsim.simcore import quantiles

HIST_MANTISSA_BITS = 14  # histogram bins: 2**14 per power of two, relative width 2**-14 ~ 6.1e-5
HIST_RELATIVE_WIDTH = 2.0 ** -HIST_MANTISSA_BITS
_SHIFT = 52 - HIST_MANTISSA_BITS  # float64 bits >> _SHIFT: exponent and the top mantissa bits
# Values kept exactly before switching to the histogram. 2**22 ITLs is 32 MiB (a 10k-request run
# of ~300-token outputs stays exact); the histogram over 1e-4..1e3 s is ~3 MiB whatever the count.
ITL_EXACT_CAP = 1 << 22
_FLUSH = 1 << 16  # values buffered before they are binned (histogram mode)
_FLOAT64 = np.dtype(np.float64)  # native float64 (numpy's one instance of it)


class Samples:
    """Non-negative latency samples in seconds. Exact (every value, insertion order, in one
    growing buffer) while at most `cap` values; then a histogram keyed on the float's exponent
    and top mantissa bits, so a percentile is off by at most half a bin (relative 2**-15).
    Values are binned, and summed for the mean, in fixed blocks of `_FLUSH` by position in the
    sequence, so the summary depends on the values alone, not on how the caller batched them
    (`append` one value and `extend` one array, e.g. a step's ITLs, may mix): a decode span and
    its steps one by one (`--exact-steps`) give the same mean bit for bit."""

    __slots__ = ("cap", "count", "total", "min", "max", "append", "_buf", "_binned", "_hist",
                 "_key0", "_zeros")

    def __init__(self, cap: int | None = None) -> None:
        self.cap = ITL_EXACT_CAP if cap is None else cap  # values kept exactly at most; beyond: the histogram
        self.count = 0  # values binned (histogram mode only)
        self.total = 0.0  # their sum
        self.min = np.inf
        self.max = -np.inf
        self._buf = array("d")  # exact mode: every value; histogram mode: values not binned yet
        self.append = self._buf.append  # the per-value path: one C call; `settle` bounds it
        self._binned = False
        self._hist: np.ndarray | None = None  # counts by key - _key0
        self._key0 = 0
        self._zeros = 0  # exact zeros (outside the log bins)

    @property
    def exact(self) -> bool:
        """Every value is still kept (percentiles are numpy's)."""
        return not self._binned and len(self._buf) <= self.cap

    @property
    def resolution(self) -> str:
        """What the summary's percentiles came from, for the run's record."""
        self.settle(force=True)
        if not self._binned:
            return "exact"
        return f"histogram, relative bin width {HIST_RELATIVE_WIDTH:.2g} (more than {self.cap:,} values)"

    def __len__(self) -> int:
        return self.count + len(self._buf)

    def extend(self, values: np.ndarray) -> None:
        """Add an array of values (copied into the buffer; a float64 array's bytes as they are)."""
        if type(values) is not np.ndarray or values.dtype is not _FLOAT64:
            values = np.asarray(values, dtype=np.float64)
        self._buf.frombytes(memoryview(np.ascontiguousarray(values)).cast("B"))  # the bytes, not a copy of them
        if len(self._buf) > (_FLUSH if self._binned else self.cap):
            self._flush()

    def settle(self, force: bool = False) -> None:
        """Bin the buffer once it is past the cap (cheap to call once per finished request);
        `force`: also the last, partial block (when the run is over)."""
        if len(self._buf) > (_FLUSH if self._binned else self.cap) or (force and self._binned and len(self._buf)):
            self._flush(whole_blocks_only=not force)

    def _flush(self, whole_blocks_only: bool = True) -> None:
        """Bin the buffer's whole `_FLUSH` blocks (and with `whole_blocks_only=False` the partial
        one after them); what is left stays buffered, so blocks start at fixed positions."""
        n = len(self._buf)
        if whole_blocks_only:
            n -= n % _FLUSH
        values = np.frombuffer(self._buf, dtype=np.float64)[:n]
        self._binned = True
        self._bin_values(values)
        del values
        del self._buf[:n]  # same array object: the bound `append` stays valid

    def _bin_values(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.count += len(values)
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))
        for start in range(0, len(values), _FLUSH):  # one block at a time: same sums however batched
            block = values[start: start + _FLUSH]
            self.total += float(block.sum())
            self._bin(block)

    def _bin(self, values: np.ndarray) -> None:
        assert not (values < 0).any(), "latency samples are >= 0"
        zero = values == 0
        self._zeros += int(zero.sum())
        keys = values[~zero].view(np.int64) >> _SHIFT
        if len(keys):
            self._bin_counts(keys, None)

    def _bin_counts(self, keys: np.ndarray, weights: np.ndarray | None) -> None:
        lo, hi = int(keys.min()), int(keys.max())
        if self._hist is None:
            self._hist, self._key0 = np.zeros(hi - lo + 1, dtype=np.int64), lo
        elif lo < self._key0 or hi >= self._key0 + len(self._hist):
            new0 = min(lo, self._key0)
            grown = np.zeros(max(hi, self._key0 + len(self._hist) - 1) - new0 + 1, dtype=np.int64)
            grown[self._key0 - new0: self._key0 - new0 + len(self._hist)] = self._hist
            self._hist, self._key0 = grown, new0
        self._hist += np.bincount(keys - self._key0, weights, minlength=len(self._hist)).astype(np.int64)

    @classmethod
    def from_bins(cls, cap: int, count: int, total: float, lo: float, hi: float, zeros: int, key0: int,
                  counts: np.ndarray) -> Samples:
        """A store past its cap whose values were binned elsewhere (the compiled core bins them
        as `_bin_values` does: the same keys, block sums and extremes): `counts` by key from
        `key0`. As `settle(force=True)` leaves a store: every value binned."""
        out = cls(cap)
        out.load_bins(count, total, lo, hi, zeros, key0, counts)
        return out

    def load_bins(self, count: int, total: float, lo: float, hi: float, zeros: int, key0: int,
                  counts: np.ndarray) -> None:
        """This empty store becomes `from_bins`'s (another core binned the values)."""
        assert not len(self._buf) and not self._binned, "load_bins fills an empty store"
        self._binned = True
        self.count, self.total, self.min, self.max, self._zeros = count, total, lo, hi, zeros
        if len(counts):
            self._hist, self._key0 = np.asarray(counts, dtype=np.int64), key0

    @classmethod
    def merged(cls, stores: list[Samples]) -> Samples:
        """One store holding the values of several (replicas), in their order."""
        if len(stores) == 1:
            return stores[0]
        out = cls(stores[0].cap)
        for store in stores:
            store.settle(force=True)
            if not store._binned:
                out.extend(np.frombuffer(store._buf, dtype=np.float64))
            else:
                out._add_binned(store)
        out.settle(force=True)  # the run is over: its last partial block too
        return out

    def _add_binned(self, other: Samples) -> None:
        if not self._binned:  # switch to bins first, whatever the count
            self._flush(whole_blocks_only=False)
        self.count += other.count
        self.total += other.total
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self._zeros += other._zeros
        if other._hist is None:
            return
        keys = np.nonzero(other._hist)[0]
        self._bin_counts(keys + other._key0, other._hist[keys])

    def count_le(self, x: float) -> int:
        """How many values are <= x (exact while `exact`; beyond, to the bin x falls in)."""
        self.settle(force=True)
        if not self._binned:
            return int((np.frombuffer(self._buf, dtype=np.float64) <= x).sum())
        if x < 0:
            return 0
        if self._hist is None or x == 0:
            return self._zeros
        key = int(np.array([x], dtype=np.float64).view(np.int64)[0] >> _SHIFT) - self._key0
        return self._zeros + int(self._hist[: max(0, min(key + 1, len(self._hist)))].sum())

    def count_le_many(self, xs: np.ndarray) -> np.ndarray:
        """`count_le` of every x in `xs`, at once."""
        self.settle(force=True)
        xs = np.asarray(xs, dtype=np.float64)
        if not self._binned:
            return np.searchsorted(np.sort(np.frombuffer(self._buf, dtype=np.float64)), xs, side="right")
        if self._hist is None:
            return np.where(xs < 0, 0, self._zeros)
        cum = np.concatenate([[0], np.cumsum(self._hist)])
        keys = (xs.view(np.int64) >> _SHIFT) - self._key0
        out = self._zeros + cum[np.clip(keys + 1, 0, len(self._hist))]
        return np.where(xs < 0, 0, np.where(xs == 0, self._zeros, out))

    def values(self) -> np.ndarray:
        """Every value in insertion order (only while `exact`)."""
        self.settle(force=True)
        assert not self._binned, "values beyond the cap are binned; use stats()"
        return np.frombuffer(self._buf, dtype=np.float64).copy()

    def percentiles(self, qs: tuple[float, ...]) -> list[float]:
        """numpy's linear-interpolation percentiles (exact), or the same rule over bin midpoints."""
        self.settle(force=True)
        if not self._binned:
            return quantiles.percentiles(np.frombuffer(self._buf, dtype=np.float64), qs)  # np.percentile's bits
        cum = np.cumsum(self._hist) if self._hist is not None else np.zeros(1, dtype=np.int64)
        out = []
        for q in qs:
            rank = (self.count - 1) * q / 100.0
            lo_k, hi_k = int(np.floor(rank)), int(np.ceil(rank))
            a, b = self._order_stat(lo_k, cum), self._order_stat(hi_k, cum)
            out.append(a + (b - a) * (rank - lo_k))
        return out

    def _order_stat(self, k: int, cum: np.ndarray) -> float:
        """The k-th smallest value (0-based), as its bin's midpoint clamped to [min, max]."""
        if k < self._zeros:
            return 0.0
        index = int(np.searchsorted(cum, k - self._zeros, side="right"))
        key = np.array([index + self._key0, index + self._key0 + 1], dtype=np.int64) << _SHIFT
        lo, hi = key.view(np.float64)
        return float(min(max(0.5 * (lo + hi), self.min), self.max))

    def stats(self, prefix: str, out: dict[str, Any], scale: float = 1000.0) -> None:
        """mean/median/p95/p99 as `{stat}_{prefix}_ms` (None when empty), as the summary names them."""
        self.settle(force=True)
        keys = [f"{name}_{prefix}_ms" for name in ("mean", "median", "p95", "p99")]
        if not len(self):
            out.update(dict.fromkeys(keys, None))
            return
        if not self._binned:  # bit-identical to the pre-cap summary
            v = np.frombuffer(self._buf, dtype=np.float64) * scale
            mean, (median, (p95, p99)) = float(np.mean(v)), quantiles.median_percentiles(v, (95, 99))
            out.update(zip(keys, (mean, median, p95, p99), strict=True))  # numpy's bits, without numpy.ma
            return
        values = [self.total / self.count, *self.percentiles((50, 95, 99))]
        out.update(zip(keys, (float(v) * scale for v in values), strict=True))


# -- requests ----------------------------------------------------------------------------------
# Rows kept in memory (71 bytes each, 36 MiB at the cap); beyond it the summary comes from
# running sums and histograms, and the rows only go to the `spill` (requests.csv when --out).
# The end-of-run summary over kept rows needs ~5x their size in temporaries (derived latencies,
# masks, the saturation fit): 2**19 rows keeps that peak near 200 MiB (benchmarks/bench_memory.py).
REQUEST_ROWS_CAP = 1 << 19
_ROW_CHUNK = 1 << 14  # rows gathered in a Python array before they become numpy columns
SATURATION_BLOCK = 64  # arrivals per block of the saturation sums beyond the cap

FINISHED, REJECTED = 0, 1  # `status` codes of a kept row
STATUS_NAMES = ("finished", "rejected")
# name -> numpy dtype of the sealed column. While gathering, a row is float64 (every value is an
# integer below 2**53 or a time), one packed row per request; sealing casts each column.
_RAW = {
    "request_id": np.int64, "replica": np.int16, "status": np.int8,
    "reason": np.int32, "arrival_s": np.float64, "first_scheduled_s": np.float64,
    "first_token_s": np.float64, "finish_s": np.float64,
    "num_prompt_tokens": np.int32, "num_positions": np.int32, "max_tokens": np.int32,
    "n": np.int32, "beam_width": np.int32, "num_preemptions": np.int32,
}
_RAW_WIDTH = len(_RAW)
# one row as native float64 bytes: struct converts the 14 values ~3x faster than array.extend
# (same conversion to double), and the array takes the bytes in one copy
_pack_row = struct.Struct(f"{_RAW_WIDTH}d").pack
# the requests table, in this order (`replica` after request_id when there are replicas)
REQUEST_COLUMNS = (
    "request_id", "status", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
    "num_prompt_tokens", "num_output_tokens", "num_positions", "max_tokens", "n", "beam_width",
    "num_preemptions", "reject_reason", "ttft_s", "e2el_s", "tpot_s",
)


class RunStopped(Exception):
    """A records watch stopped the run (`RequestRecords.watch`); `value` is what its check
    returned. (Built from its args alone: SimPy re-raises a process's exception as a copy.)"""

    engine_core = ""  # which core ran, set by the simulation (simcore.simulate)

    @property
    def value(self) -> Any:
        return self.args[0]


def derived_latencies(cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ttft_s, e2el_s, tpot_s) of each row; NaN where not defined (rejected, one token)."""
    done = cols["status"] == FINISHED
    ttft = np.where(done, cols["first_token_s"] - cols["arrival_s"], np.nan)
    e2el = np.where(done, cols["finish_s"] - cols["arrival_s"], np.nan)
    positions = cols["num_positions"].astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (e2el - ttft) / (positions - 1)
    tpot = np.where(done & (positions > 1), tpot, np.nan)
    return ttft, e2el, tpot


class AttainmentTally:
    """SLO attainment per "hour" of arrival, counted as rows leave (autoscaling's day-scale figure,
    simcore.autoscale.run_attainment), so a day of millions of requests needs no kept rows: per
    hour the requests and those meeting TTFT <= `ttft_slo_ms` (and TPOT <= `tpot_slo_ms` when
    given; a one-token answer has no TPOT and meets it; a rejected request misses). Integer
    counts, so they do not depend on the order or batching of the rows: both engine cores, which
    hand over the same rows, give the same counts."""

    def __init__(self, hour_s: float, ttft_slo_ms: float, tpot_slo_ms: float | None) -> None:
        self.key = (float(hour_s), float(ttft_slo_ms), None if tpot_slo_ms is None else float(tpot_slo_ms))
        self.requests = np.zeros(0, dtype=np.int64)  # by hour
        self.met = np.zeros(0, dtype=np.int64)

    def matches(self, hour_s: float, ttft_slo_ms: float, tpot_slo_ms: float | None) -> bool:
        return self.key == (float(hour_s), float(ttft_slo_ms), None if tpot_slo_ms is None else float(tpot_slo_ms))

    def add(self, arrival_s: np.ndarray, ttft_s: np.ndarray, tpot_s: np.ndarray) -> None:
        """Count rows (their arrival, TTFT and TPOT, NaN where undefined)."""
        hour_s, ttft_ms, tpot_ms = self.key
        ok = np.nan_to_num(ttft_s, nan=np.inf) <= ttft_ms / 1e3
        if tpot_ms is not None:
            ok &= np.nan_to_num(tpot_s, nan=0.0) <= tpot_ms / 1e3
        hours = np.floor(np.asarray(arrival_s, dtype=float) / hour_s).astype(np.int64)
        if not len(hours):
            return
        n = max(len(self.requests), int(hours.max()) + 1)
        requests, met = np.bincount(hours, minlength=n), np.bincount(hours[ok], minlength=n)
        requests[: len(self.requests)] += self.requests
        met[: len(self.met)] += self.met
        self.requests, self.met = requests.astype(np.int64), met.astype(np.int64)

    def rows(self) -> list[dict[str, Any]]:
        """[{hour, requests, met, attainment (None without requests)}] from hour 0."""
        return [{"hour": h, "requests": int(n), "met": int(m), "attainment": (int(m) / int(n)) if n else None}
                for h, (n, m) in enumerate(zip(self.requests, self.met, strict=True))]


class RequestRecords:
    """Every request that left the engine(s): kept as numpy columns while at most `cap` rows,
    else folded into running sums and histograms (`Bounded`). Shared by the replicas of a run.
    `spill(columns)`, when set, receives every sealed chunk of rows once rows stop being all
    kept (the rows kept so far first), so a caller can stream them to disk."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = REQUEST_ROWS_CAP if cap is None else cap  # rows kept at most
        self._rows = array("d")  # rows not sealed yet, row-major in _RAW order
        self._add_row = self._rows.frombytes
        self._seal_len = _ROW_CHUNK * _RAW_WIDTH  # buffer length that seals a chunk
        self._chunks: list[dict[str, np.ndarray]] = []
        self._num_kept = 0
        self.kept = True  # every row is in `_chunks` (the table and exact percentiles exist)
        self.spill: Callable[[dict[str, np.ndarray]], None] | None = None
        self.reasons: dict[str, int] = {}  # reject reason -> code (index into reason_counts)
        self.reason_counts: list[int] = []
        self.num_arrived = 0
        self.num_left = 0
        self.max_arrival_gap_s = 0.0  # longest gap between consecutive arrivals
        self._last_arrival = np.nan
        self._block_start = array("d")  # arrival time of every SATURATION_BLOCK-th arrival
        self.bounded: Bounded | None = None  # the running sums, once rows stop being kept
        self.num_replicas = 1  # set by the simulation; > 1 adds the `replica` column
        self._watch: Callable[[RequestRecords], Any] | None = None
        self._watch_every = 0
        self._watch_at = 0  # num_left at which the watch runs next (0: never, as num_left >= 1 there)
        # counted over every row as it is sealed, kept or not (a day of millions of requests):
        self.attainment: AttainmentTally | None = None  # set by `count_attainment` before the run
        self.max_finish_s = np.nan  # the latest finish_s of any row (NaN: none)
        self.replica_requests = np.zeros(0, dtype=np.int64)  # rows by replica
        self.replica_positions = np.zeros(0, dtype=np.int64)  # num_positions summed by replica

    def count_attainment(self, hour_s: float, ttft_slo_ms: float, tpot_slo_ms: float | None) -> AttainmentTally:
        """Count SLO attainment per hour as rows leave (before any row has)."""
        assert not self.num_left, "count_attainment before the run"
        self.attainment = AttainmentTally(hour_s, ttft_slo_ms, tpot_slo_ms)
        return self.attainment

    def _count(self, chunk: dict[str, np.ndarray]) -> None:
        """The running counts every row feeds (see __init__)."""
        finish = chunk["finish_s"]
        if len(finish):
            latest = float(np.fmax.reduce(finish))  # NaN only if every value is
            if not np.isnan(latest):
                self.max_finish_s = latest if np.isnan(self.max_finish_s) else max(self.max_finish_s, latest)
        replica = chunk["replica"].astype(np.int64)
        n = max(len(self.replica_requests), int(replica.max()) + 1 if len(replica) else 0)
        requests = np.bincount(replica, minlength=n)
        positions = np.bincount(replica, weights=chunk["num_positions"].astype(np.float64), minlength=n)
        requests[: len(self.replica_requests)] += self.replica_requests
        positions[: len(self.replica_positions)] += self.replica_positions
        self.replica_requests, self.replica_positions = requests.astype(np.int64), positions.astype(np.int64)
        if self.attainment is not None:
            ttft, _, tpot = derived_latencies(chunk)
            self.attainment.add(chunk["arrival_s"], ttft, tpot)

    def watch(self, every: int, check: Callable[[RequestRecords], Any]) -> None:
        """Run `check(self)` each time `every` more requests have left (the `every`-th, the
        2`every`-th, ... row, counted from now); a value other than None stops the run: it is
        raised as RunStopped(value) out of the `leave` that added the row. Both engine cores add
        the same rows in the same order, so a check sees the same rows whichever core runs."""
        assert every >= 1
        self._watch, self._watch_every, self._watch_at = check, every, self.num_left + every

    def rows_to_watch(self) -> int | None:
        """Rows still to leave before the watch's next check (None: no watch). A core that hands
        rows over in batches (simcore/fastcore.py) sizes its batch to it, so that a watch stops
        it within a step of where it stops the one-by-one core, not a whole buffer later."""
        return max(1, self._watch_at - self.num_left) if self._watch is not None else None

    def _watched(self) -> None:
        self._watch_at += self._watch_every
        value = self._watch(self)
        if value is not None:
            raise RunStopped(value)

    # -- fed by the lifecycle (once per request) -------------------------------------------
    def arrive(self, now: float) -> None:
        if self.num_arrived % SATURATION_BLOCK == 0:
            self._block_start.append(now)
        self.num_arrived += 1
        gap = now - self._last_arrival
        if gap > self.max_arrival_gap_s:
            self.max_arrival_gap_s = gap
        self._last_arrival = now

    def arrive_many(self, times: np.ndarray) -> None:
        """`arrive(t)` for each time, in order (a compiled engine core's arrivals, in bulk)."""
        count = len(times)
        if not count:
            return
        first = (-self.num_arrived) % SATURATION_BLOCK  # index of the first arrival that starts a block
        if first < count:
            self._block_start.frombytes(np.ascontiguousarray(times[first::SATURATION_BLOCK], dtype=np.float64).tobytes())
        gaps = np.diff(times, prepend=self._last_arrival)  # NaN before the first arrival: never the largest
        gaps = gaps[~np.isnan(gaps)]
        if len(gaps) and float(gaps.max()) > self.max_arrival_gap_s:
            self.max_arrival_gap_s = float(gaps.max())
        self.num_arrived += count
        self._last_arrival = float(times[-1])

    def reason_code(self, reason: str) -> int:
        """The code of a reject reason, counting one more request refused for it (as `leave`)."""
        code = self.reasons.setdefault(reason, len(self.reasons))
        if code == len(self.reason_counts):
            self.reason_counts.append(0)
        self.reason_counts[code] += 1
        return code

    def leave_rows(self, rows: np.ndarray, before_seal: Callable[[int], None] | None = None) -> None:
        """`leave` for many requests at once: `rows` (n, 14) float64 in `_RAW` order, reject codes
        already set (`reason_code`). `before_seal(i)` is called before the chunk that ends at row i
        is sealed, so the caller can bring the arrivals up to that row first (as one by one)."""
        start, count = 0, len(rows)
        while start < count:
            room = (self._seal_len - len(self._rows)) // _RAW_WIDTH
            end = min(count, start + room)
            if self._watch_at > self.num_left:  # stop at the watched row, as one by one does
                end = min(end, start + self._watch_at - self.num_left)
            self._rows.frombytes(np.ascontiguousarray(rows[start:end], dtype=np.float64).tobytes())
            self.num_left += end - start
            if len(self._rows) >= self._seal_len:
                if before_seal is not None:
                    before_seal(end - 1)
                self._seal()
            if self.num_left == self._watch_at:
                if before_seal is not None:
                    before_seal(end - 1)  # the arrivals up to this row, as one by one
                self._watched()
            start = end

    def leave(self, st: Any, replica: int) -> None:
        """One finished or rejected request (a `ReqState`), copied out so the object can go."""
        req = st.request
        if st.reject_reason:
            status, code = REJECTED, self.reason_code(st.reject_reason)
        else:
            status, code = FINISHED, -1
        self._add_row(_pack_row(
            st.request_id, replica, status, code, req.arrival_s, st.first_scheduled_s,
            st.first_token_s, st.finish_s, st.num_prompt_tokens, st.num_generated,
            req.max_tokens, req.n, req.beam_width, st.num_preemptions,
        ))
        self.num_left += 1
        if len(self._rows) >= self._seal_len:
            self._seal()
        if self.num_left == self._watch_at:
            self._watched()

    def finalize(self) -> None:
        """Seal the last partial chunk (the end of the run)."""
        if len(self._rows):
            self._seal()

    def _seal(self) -> None:
        rows = np.frombuffer(self._rows, dtype=np.float64).reshape(-1, _RAW_WIDTH)
        chunk = {name: rows[:, i].astype(dtype) for i, (name, dtype) in enumerate(_RAW.items())}
        del rows
        del self._rows[:]  # same array object: the bound `_add_row` stays valid
        self._count(chunk)
        if self.kept:
            self._chunks.append(chunk)
            self._num_kept += len(chunk["request_id"])
            if self._num_kept <= self.cap:
                return
            self.kept = False
            self.bounded = Bounded(np.frombuffer(self._block_start, dtype=np.float64))
            chunks, self._chunks = self._chunks, []
        else:
            chunks = [chunk]
        for c in chunks:
            self.bounded.fold(c, np.frombuffer(self._block_start, dtype=np.float64))
            if self.spill is not None:
                self.spill(self.table_columns(c))

    # -- reading -----------------------------------------------------------------------------
    def reason_names(self) -> list[str]:
        return list(self.reasons)

    def columns(self) -> dict[str, np.ndarray]:
        """Every kept row's raw columns, by request id (only while `kept`)."""
        assert self.kept, "rows beyond the cap were not kept"
        self.finalize()
        if not self._chunks:
            return {name: np.zeros(0, dtype=dtype) for name, dtype in _RAW.items()}
        if len(self._chunks) > 1:  # one chunk from now on, joined a column at a time (no second copy)
            chunks, cols = self._chunks, {}
            for name in _RAW:
                cols[name] = np.concatenate([c.pop(name) for c in chunks])
            self._chunks = [cols]
        cols = self._chunks[0]
        ids = cols["request_id"]
        if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():
            order = np.argsort(ids, kind="stable")
            for name in _RAW:
                cols[name] = cols[name][order]
        return dict(cols)

    def table_columns(self, cols: dict[str, np.ndarray], replicas: bool | None = None) -> dict[str, np.ndarray]:
        """The requests table's columns (names, dtypes and order of the old per-object table)."""
        if replicas is None:
            replicas = self.num_replicas > 1
        ttft, e2el, tpot = derived_latencies(cols)
        positions = cols["num_positions"].astype(np.int64)
        reasons = np.array(["", *self.reasons], dtype=object)
        out = {"request_id": cols["request_id"]}
        if replicas:
            out["replica"] = cols["replica"].astype(np.int64)
        out.update({
            "status": np.array(STATUS_NAMES, dtype=object)[cols["status"]],
            "arrival_s": cols["arrival_s"], "first_scheduled_s": cols["first_scheduled_s"],
            "first_token_s": cols["first_token_s"], "finish_s": cols["finish_s"],
            "num_prompt_tokens": cols["num_prompt_tokens"].astype(np.int64),
            "num_output_tokens": positions * cols["n"], "num_positions": positions,
            "max_tokens": cols["max_tokens"].astype(np.int64), "n": cols["n"].astype(np.int64),
            "beam_width": cols["beam_width"].astype(np.int64),
            "num_preemptions": cols["num_preemptions"].astype(np.int64),
            "reject_reason": reasons[cols["reason"] + 1],
            "ttft_s": ttft, "e2el_s": e2el, "tpot_s": tpot,
        })
        return out

    def frame(self):
        """The requests table (pandas), one row per request by id (only while `kept`)."""
        import pandas as pd

        return pd.DataFrame(self.table_columns(self.columns()))


class Bounded:
    """Running sums over request rows no longer kept: counts, token totals, latency histograms,
    and the saturation measures by blocks of SATURATION_BLOCK arrivals."""

    def __init__(self, block_start: np.ndarray) -> None:
        self.completed = self.rejected = 0
        self.total_input_tokens = self.total_output_tokens = 0
        self.num_preemptions = 0
        self.min_arrival_s, self.max_finish_s = np.inf, -np.inf
        self.ttft, self.tpot, self.e2el = Samples(cap=0), Samples(cap=0), Samples(cap=0)
        self.finish = Samples(cap=0)  # finish times of finished requests (completed-in-window counts)
        # per block of arrivals: finished-or-not counts and the sums of a least-squares line of
        # queueing delay (w) on arrival time (t), over requests that were scheduled
        self.blocks = np.zeros((0, 5))  # n, sum t, sum w, sum t*t, sum t*w

    def fold(self, cols: dict[str, np.ndarray], block_start: np.ndarray) -> None:
        done = cols["status"] == FINISHED
        self.completed += int(done.sum())
        self.rejected += int((~done).sum())
        self.total_input_tokens += int(cols["num_prompt_tokens"][done].sum(dtype=np.int64))
        self.total_output_tokens += int((cols["num_positions"][done].astype(np.int64) * cols["n"][done]).sum())
        self.num_preemptions += int(cols["num_preemptions"].sum(dtype=np.int64))
        arrival = cols["arrival_s"]
        if len(arrival):
            self.min_arrival_s = min(self.min_arrival_s, float(arrival.min()))
        if done.any():
            self.max_finish_s = max(self.max_finish_s, float(cols["finish_s"][done].max()))
            self.finish.extend(cols["finish_s"][done])
        ttft, e2el, tpot = derived_latencies(cols)
        self.ttft.extend(ttft[done])
        self.e2el.extend(e2el[done])
        self.tpot.extend(tpot[~np.isnan(tpot)])
        wait = cols["first_scheduled_s"] - arrival
        known = cols["first_scheduled_s"] >= 0
        block = np.searchsorted(block_start, arrival, side="right") - 1
        if len(block_start) > len(self.blocks):
            grown = np.zeros((len(block_start), 5))
            grown[: len(self.blocks)] = self.blocks
            self.blocks = grown
        b, t, w = block[known], arrival[known], wait[known]
        for col, values in enumerate((np.ones_like(t), t, w, t * t, t * w)):
            np.add.at(self.blocks[:, col], b, values)
