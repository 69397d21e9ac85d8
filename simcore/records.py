"""What a run keeps of its requests and latencies, in memory bounded by caps, not by run length.

    Samples        latency values (ITL, TTFT, TPOT, E2EL): every value while <= cap, so
                   percentiles are numpy's exactly; beyond the cap a log-spaced histogram
                   (bins of relative width 2**-14 ~ 6.1e-5), mean / min / max still exact.
    RequestRecords one row per request that left (finished or rejected), numpy column
                   chunks (~60 bytes a request, reject reasons as codes into a small table),
                   fed once per request by the lifecycle, never per token.

Why: a day-long trace or a 10M-request run must fit in a few hundred MB (issues 10 and 11);
the per-request objects (`ReqState`, its SimPy event) are dropped as soon as a request leaves.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

HIST_MANTISSA_BITS = 14  # histogram bins: 2**14 per power of two, relative width 2**-14 ~ 6.1e-5
HIST_RELATIVE_WIDTH = 2.0 ** -HIST_MANTISSA_BITS
_SHIFT = 52 - HIST_MANTISSA_BITS  # float64 bits >> _SHIFT: exponent and the top mantissa bits
# Values kept exactly before switching to the histogram. 2**22 ITLs is 32 MiB (a 10k-request run
# of ~300-token outputs stays exact); the histogram over 1e-4..1e3 s is ~3 MiB whatever the count.
ITL_EXACT_CAP = 1 << 22
_FLUSH = 1 << 16  # scalar appends buffered before they join the chunks


class Samples:
    """Non-negative latency samples in seconds. Exact (every value, insertion order) while at
    most `cap` values; then a histogram keyed on the float's exponent and top mantissa bits, so
    a percentile is off by at most half a bin (relative 2**-15) and the mean is exact up to
    summation order. `append` (one value) and `extend` (one array, e.g. a step's ITLs) may mix."""

    __slots__ = ("cap", "count", "total", "min", "max", "append", "_buf", "_chunks", "_hist",
                 "_key0", "_zeros")

    def __init__(self, cap: int = ITL_EXACT_CAP) -> None:
        self.cap = cap  # values kept exactly at most; beyond: the histogram
        self.count = 0  # values seen (buffered ones excluded until the next flush)
        self.total = 0.0  # their sum
        self.min = np.inf
        self.max = -np.inf
        self._buf = array("d")
        self.append = self._buf.append  # the per-value path: one C call; `settle` bounds it
        self._chunks: list[np.ndarray] | None = []  # None once the histogram took over
        self._hist: np.ndarray | None = None  # counts by key - _key0
        self._key0 = 0
        self._zeros = 0  # exact zeros (outside the log bins)

    @property
    def exact(self) -> bool:
        """Every value is still kept (percentiles are numpy's)."""
        return self._chunks is not None and self.count + len(self._buf) <= self.cap

    @property
    def resolution(self) -> str:
        """What the summary's percentiles came from, for the run's record."""
        self.settle(force=True)
        if self._chunks is not None:
            return "exact"
        return f"histogram, relative bin width {HIST_RELATIVE_WIDTH:.2g} (more than {self.cap:,} values)"

    def __len__(self) -> int:
        return self.count + len(self._buf)

    def extend(self, values: np.ndarray) -> None:
        """Add an array of values (copied)."""
        if len(self._buf):
            self._flush()
        if len(values):
            self._add(np.array(values, dtype=np.float64, copy=True))

    def settle(self, force: bool = False) -> None:
        """Move buffered single values into the store (cheap; called once per finished request)."""
        if len(self._buf) >= _FLUSH or (force and len(self._buf)):
            self._flush()

    def _flush(self) -> None:
        values = np.frombuffer(self._buf, dtype=np.float64).copy()
        del self._buf[:]  # same array object: the bound `append` stays valid
        self._add(values)

    def _add(self, values: np.ndarray) -> None:
        self.count += len(values)
        self.total += float(values.sum())
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))
        if self._chunks is not None:
            self._chunks.append(values)
            if self.count <= self.cap:
                return
            values = np.concatenate(self._chunks)
            self._chunks = None
        self._bin(values)

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
    def merged(cls, stores: list[Samples]) -> Samples:
        """One store holding the values of several (replicas), in their order."""
        if len(stores) == 1:
            return stores[0]
        out = cls(stores[0].cap)
        for store in stores:
            store.settle(force=True)
            if store._chunks is not None:
                for chunk in store._chunks:
                    out._add(chunk)
                continue
            out._add_binned(store)
        return out

    def _add_binned(self, other: Samples) -> None:
        if self._chunks is not None:  # switch to bins first, whatever the count
            values = np.concatenate(self._chunks) if self._chunks else np.zeros(0)
            self._chunks = None
            self._bin(values)
        self.count += other.count
        self.total += other.total
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self._zeros += other._zeros
        if other._hist is None:
            return
        keys = np.nonzero(other._hist)[0]
        self._bin_counts(keys + other._key0, other._hist[keys])

    def values(self) -> np.ndarray:
        """Every value in insertion order (only while `exact`)."""
        self.settle(force=True)
        assert self._chunks is not None, "values beyond the cap are binned; use stats()"
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0)

    def percentiles(self, qs: tuple[float, ...]) -> list[float]:
        """numpy's linear-interpolation percentiles (exact), or the same rule over bin midpoints."""
        self.settle(force=True)
        if self._chunks is not None:
            v = self.values()
            return [float(x) for x in np.percentile(v, qs)]
        counts = self._hist
        cum = np.cumsum(counts)
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
        if self._chunks is not None:  # bit-identical to the pre-cap summary
            v = self.values() * scale
            mean, (median, p95, p99) = float(np.mean(v)), np.percentile(v, (50, 95, 99))
            out.update(zip(keys, (mean, float(median), float(p95), float(p99)), strict=True))
            return
        values = [self.total / self.count, *self.percentiles((50, 95, 99))]
        out.update(zip(keys, (float(v) * scale for v in values), strict=True))
