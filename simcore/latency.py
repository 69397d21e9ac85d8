"""Step latency from a profile: kernels + collectives + host/engine time, priced for a mixed step.

A profile (schema `kvsim-profile` v2, `profiles/<gpu>-<model>-tp<N>.json`; v1 still reads) holds,
for one GPU, model shape, dtype and tensor-parallel degree, times in milliseconds on one GPU:

    linear             one layer's GEMMs, norms, activation, residual     vs num_tokens
    prefill_attention  one layer, a prompt chunk over prior context       vs (chunk_tokens, context_tokens)
                       optional `occupancy` + `launch_floor_ms`: the table is then the chunk's time on a
                       full GPU, and the step's chunks share one launch whose CTAs fill the SMs in waves
    decode_attention   one layer, paged decode, per block size            vs (batch_size, context_tokens)
    lm_head            final norm + LM head + sampling, whole model       vs num_seqs
    collectives        per-call NCCL times vs message bytes: `all_reduce` (two per layer, of
                       num_tokens x hidden x dtype bytes), `send_recv` and `send_recv_inter_node`
                       (pipeline hand-offs inside a node and across nodes); optional
                       `all_reduce_by_engine`: per vLLM version whose all-reduce is not the table's
                       (V1's symmetric memory on Hopper), its own table, used by a `continuous` run;
                       v1's `collective` (one layer's all-reduces vs num_tokens) is still read
    host_overhead      the engine's CPU time on the step's critical path, in ms:
                       per_step + per_seq * sequences + per_prefill_step * [step has a prefill]
                       + per_prefill_token * prefill tokens; `host_overhead_by_policy` holds the
                       same per batching policy (the engine each one models); v1's
                       `step_overhead_ms[_by_policy]` reads as per_step alone; optional
                       hidden_per_step + hidden_per_seq * sequences: CPU work an engine with async
                       scheduling runs while the GPU executes, on the critical path only where it
                       outlasts the GPU (the host term then grows by the excess, see below)

A step costs  host + L * (linear(T) + attention + all_reduce(T)) + lm_head(S)  where T is the step's
batched tokens and S the sequences sampled; `step_breakdown_ms` returns (kernels, collectives, host).
With hidden terms (vLLM's async scheduling, profiles/host.py `vllm-v1-async`) the host term is
host + max(0, hidden - GPU), GPU = kernels + collectives: the step costs max(GPU, hidden) + host;
a step after an idle engine (`cold`, set by Engine.run) hides nothing: host + hidden.
A profile scaled per phase for an error band (profiles/uncertainty.py) also holds
`prefill_vs_decode_factor` f: a step with p prompt tokens of T costs that x (1 + (f - 1) p / T).
Tables are interpolated piecewise-linearly in log-log space after being made monotone; points outside
a table are extrapolated along the edge segment and counted.

`decode_span_times_s(num_seqs, context_sums)` prices a run of decode-only steps (same batch, the
contexts' sum given per step) in one call, a few numpy operations for the whole run; it equals `step_time_s(num_seqs, [], num_seqs,
context_sums[k], num_seqs)` for every k bit for bit (tests/test_latency.py), and counts
extrapolated steps as they would, so an engine may price a decode span without one Python call
per step. Pricing is memoised (what depends only on a step's shape, a table's row blend per batch
size): kept values are computed exactly as fresh ones, the memos are bounded (MEMO_ENTRIES).
Every step and span is priced by the same floating-point operations in the same order whichever
way it goes (a step's parts in one function, a short span's interpolation on Python floats):
tests/test_latency.py compares them bit for bit with the formulas written out plainly.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

import kvsim.simcore.userjson as userjson
from kvsim.simcore.errors import ProfileError
from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION, ENGINE_VERSIONS

SCHEMA = "kvsim-profile"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
SOURCES = ("measured", "roofline", "calibrated")
HOST_TERMS = ("per_step_ms", "per_seq_ms", "per_prefill_step_ms", "per_prefill_token_ms")
# ASYNC: CPU work an engine with async scheduling runs while the GPU executes (HostOverhead.hidden_ms)
HIDDEN_TERMS = ("hidden_per_step_ms", "hidden_per_seq_ms")
ABSURD_MS = 1e7  # no single table entry or host term may exceed ~3 hours
# a layer all-reduces its hidden states twice under Megatron TP (attention out, MLP out: Shoeybi et al.
# 2019, arXiv:1909.08053 sec. 3); a bound far past that keeps a hand-edited count from overflowing a step
MAX_CALLS_PER_LAYER = 64
# A profile's step times as priced for a prefill-only step over those of a decode-only step (1 unless
# profiles.uncertainty.scaled_profile scaled the phases apart: the stated errors of prefill and decode
# differ). A step with p prompt tokens of T is priced x 1 + (ratio - 1) * p / T.
PREFILL_RATIO_KEY = "prefill_vs_decode_factor"
POLICIES = ("static", "dynamic", "continuous")
# Bounds on the pricing memos (kept, never evicted; a key's result is the same computed or kept):
MEMO_ENTRIES = 65536  # small tuples keyed by a step's shape, a few MiB at most
ROW_MEMO_ENTRIES = 4096  # numpy rows for decode spans, keyed by batch size (~1 KiB each)
# Rows of up to this many values are interpolated on Python floats, longer ones by numpy (Table2D.row)
SHORT_ROW = 16
_THOUSAND = np.array(1000.0)  # ms per s, as a 0-d array for decode spans (see _span_terms)


def _monotone(values: list[float]) -> list[float]:
    """The running maximum from 0.0: max(best, v) step by step (accumulate calls it so)."""
    return list(accumulate(values, max, initial=0.0))[1:]


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -30.0


class Table1D:
    """y(x) on a sorted grid, log-log piecewise linear, monotone non-decreasing."""

    __slots__ = ("lx", "ly", "y", "lo", "hi", "_memo")

    def __init__(self, xs: list[float], ys: list[float]):
        self.lx = [math.log(x) for x in xs]
        self.y = _monotone(ys)  # the values interpolated (kept for scaled())
        self.ly = [_log(y) for y in self.y]
        self.lo, self.hi = xs[0], xs[-1]
        self._memo: dict[float, float] = {}

    def scaled(self, factor: float) -> Table1D:
        """This table with every value x `factor` (> 0): the very table built from values scaled
        before parsing, since rounding keeps order (monotone(v x f) = monotone(v) x f, bit for bit)."""
        new = object.__new__(Table1D)
        new.lx, new.lo, new.hi, new._memo = self.lx, self.lo, self.hi, {}
        new.y = [y * factor for y in self.y]
        new.ly = [_log(y) for y in new.y]
        return new

    def __call__(self, x: float) -> float:
        hit = self._memo.get(x)
        if hit is None:
            hit = self._memo[x] = self._eval(x) if x > 0 else 0.0
        return hit

    def outside(self, x: float) -> bool:
        return x > 0 and (x < self.lo or x > self.hi)

    def _eval(self, x: float) -> float:
        lx, ly = self.lx, self.ly
        if len(lx) == 1:
            return math.exp(ly[0]) * x / self.lo
        v = math.log(x)
        i = bisect_right(lx, v, 1, len(lx) - 1) - 1  # the edge segments extend outwards
        t = (v - lx[i]) / (lx[i + 1] - lx[i])
        return math.exp(ly[i] + t * (ly[i + 1] - ly[i]))


class Table2D:
    """z(a, b) on a grid: log-log in a, log1p in b (b may be 0), monotone in both.

    Steps price it with a (batch size, chunk length) from a small set and b (context) ever new,
    so what depends on a alone (its segment, weight and the two grid rows blended) is found once
    per a and kept, and each row's steps are subtracted once: the same floating-point operations
    on the same values as working them out per call, so a kept value never changes a result."""

    __slots__ = ("la", "lb", "z", "lz", "a_range", "b_range", "a_lo", "a_hi", "b_lo", "b_hi", "_dlb", "_dlz", "_by_a",
                 "_rows_by_a", "_np_inner")

    def __init__(self, a: list[float], b: list[float], z: list[list[float]]):
        self.la = [math.log(x) for x in a]
        self.lb = [math.log1p(x) for x in b]
        rows = [_monotone(row) for row in z]
        cols = [_monotone([rows[i][j] for i in range(len(a))]) for j in range(len(b))]
        self.z = [[cols[j][i] for j in range(len(b))] for i in range(len(a))]  # the values interpolated
        self.a_range, self.b_range = (a[0], a[-1]), (b[0], b[-1])
        self.a_lo, self.a_hi, self.b_lo, self.b_hi = a[0], a[-1], b[0], b[-1]
        n = len(self.lb)
        self._dlb = [self.lb[j + 1] - self.lb[j] for j in range(n - 1)]  # b segments' widths
        self._np_inner = np.asarray(self.lb[1:-1], dtype=np.float64)  # inner grid points, for row()
        self._set_values()

    def _set_values(self) -> None:
        """The logarithms of `z` and what depends on them (fresh memos)."""
        self.lz = [[_log(v) for v in row] for row in self.z]
        # each row's steps z[j + 1] - z[j]; the last 0.0 is z[j] - z[j] (only a one-point b grid reads it)
        self._dlz = [[hi - lo for lo, hi in zip(row, row[1:], strict=False)] + [0.0] for row in self.lz]
        self._by_a: dict[float, tuple] = {}  # a -> (s, top row, its steps, bottom row, its steps)
        self._rows_by_a: dict[float, tuple] = {}  # the same as numpy arrays, for row()

    def scaled(self, factor: float) -> Table2D:
        """This table with every value x `factor` (> 0): bit for bit the table built from values
        scaled before parsing (rows and columns made monotone commute with scaling, rounding keeps order)."""
        new = object.__new__(Table2D)
        for name in ("la", "lb", "a_range", "b_range", "a_lo", "a_hi", "b_lo", "b_hi", "_dlb", "_np_inner"):
            setattr(new, name, getattr(self, name))
        new.z = [[v * factor for v in row] for row in self.z]
        new._set_values()
        return new

    def outside(self, a: float, b: float) -> bool:
        return not (self.a_lo <= a <= self.a_hi and self.b_lo <= b <= self.b_hi)

    @staticmethod
    def _locate(grid: list[float], v: float) -> tuple[int, float]:
        if len(grid) == 1:
            return 0, 0.0
        i = min(max(bisect_right(grid, v) - 1, 0), len(grid) - 2)
        return i, (v - grid[i]) / (grid[i + 1] - grid[i])

    def _a_terms(self, a: float) -> tuple:
        """(weight s of the bottom row, top row, its steps, bottom row, its steps) at a > 0."""
        terms = self._by_a.get(a)
        if terms is None:
            i, s = self._locate(self.la, math.log(a))
            i1 = min(i + 1, len(self.lz) - 1)
            terms = (s, self.lz[i], self._dlz[i], self.lz[i1], self._dlz[i1])
            if len(self._by_a) < MEMO_ENTRIES:
                self._by_a[a] = terms
        return terms

    def __call__(self, a: float, b: float) -> float:
        if a <= 0:
            return 0.0
        terms = self._by_a.get(a)  # _a_terms' lookup, inline: most calls find it
        s, top_z, top_dz, bot_z, bot_dz = self._a_terms(a) if terms is None else terms
        v = math.log1p(b)
        lb = self.lb
        if len(lb) == 1:
            j, t = 0, 0.0
        else:  # bisect among the inner grid points: the edge segments extend outwards
            j = bisect_right(lb, v, 1, len(lb) - 1) - 1
            t = (v - lb[j]) / self._dlb[j]
        top = top_z[j] + t * top_dz[j]
        bot = bot_z[j] + t * bot_dz[j]
        return math.exp(top + s * (bot - top))

    def row(self, a: float, bs: np.ndarray) -> np.ndarray:
        """z(a, b) for many b at one a: the same arithmetic as __call__, vectorised over b. The
        logarithms and exponentials are libm's (math.log1p, math.exp, as __call__ and the C core
        use): numpy's SIMD ones differ from them in the last bit for a few per cent of values."""
        if a <= 0:
            return np.zeros(len(bs))
        # float64 whatever `bs` holds (integers are converted first, exactly)
        lbs = list(map(math.log1p, np.asarray(bs, dtype=np.float64).tolist()))
        if len(lbs) <= SHORT_ROW:
            return np.array(list(map(math.exp, self._exponents(a, lbs))))
        lb = np.array(lbs)
        s, segments, top0, bot0 = self._row_terms(a)
        if segments is None:  # one context point: the rows' only values
            top = np.full(len(lb), top0)
            bot = np.full(len(lb), bot0)
        else:
            j = self._np_inner.searchsorted(lb, side="right")  # = clip(searchsorted(grid, lb) - 1, 0, n - 2)
            lb_j, width, top_z, top_dz, bot_z, bot_dz = segments[:, j]  # one gather for all six
            t = (lb - lb_j) / width
            top = top_z + t * top_dz
            bot = bot_z + t * bot_dz
        return np.array(list(map(math.exp, (top + s * (bot - top)).tolist())))

    def _exponents(self, a: float, lbs: list[float]) -> list[float]:
        """row()'s interpolation in log space for a few log1p(b), on Python floats: the same
        IEEE operations on the same values as numpy's (so the same bits), without its set-up
        cost per call (~a microsecond, many times one value's arithmetic)."""
        s, top_z, top_dz, bot_z, bot_dz = self._a_terms(a)
        grid, widths, last = self.lb, self._dlb, len(self.lb) - 1
        if last == 0:  # one context point: the rows' only values
            return [top_z[0] + s * (bot_z[0] - top_z[0])] * len(lbs)
        out = []
        lo = hi = 0.0  # v in [lo, hi): v is in segment j (the outer segments extend to infinity)
        for v in lbs:
            if not lo <= v < hi:  # a span's contexts grow slowly: most stay in the last one's segment
                j = bisect_right(grid, v, 1, last) - 1  # the segment row()'s searchsorted finds
                lo = grid[j] if j else -math.inf
                hi = grid[j + 1] if j + 1 < last else math.inf
                g, w, tz, tdz, bz, bdz = grid[j], widths[j], top_z[j], top_dz[j], bot_z[j], bot_dz[j]
            t = (v - g) / w
            top = tz + t * tdz
            bot = bz + t * bdz
            out.append(top + s * (bot - top))
        return out

    def _row_terms(self, a: float) -> tuple[np.ndarray, np.ndarray | None, float, float]:
        """For row() at a > 0: s as a 0-d array (numpy multiplies arrays faster than by a Python
        float; the product is the same); per b segment j the column (lb[j], its width, top row,
        its step, bottom row, its step), None with a single context point; the rows' first values."""
        terms = self._rows_by_a.get(a)
        if terms is None:
            s, top_z, top_dz, bot_z, bot_dz = self._a_terms(a)
            m = len(self.lb) - 1
            segments = None if m == 0 else np.array(
                [self.lb[:m], self._dlb, top_z[:m], top_dz[:m], bot_z[:m], bot_dz[:m]], dtype=np.float64)
            terms = (np.array(s, dtype=np.float64), segments, top_z[0], bot_z[0])
            if len(self._rows_by_a) < ROW_MEMO_ENTRIES:
                self._rows_by_a[a] = terms
        return terms


@dataclass
class Profile:
    """A validated profile document plus its content hash."""

    data: dict[str, Any]
    sha256: str
    path: str | None = None
    # The model `parse_profile` built to validate `data` (policy "continuous"), never priced with:
    # the first `latency_model` call for that policy takes it, so a run does not build the same
    # tables twice; later calls build their own. Not compared, printed or pickled.
    _unused_model: StepLatencyModel | None = field(default=None, init=False, repr=False, compare=False)

    # Models built once per (where, policy, engine version), copied for each simulation
    # (StepLatencyModel.fresh): a planner runs hundreds of simulations of one profile, and
    # parsing its tables cost more than a compiled-core run. Not compared, printed or pickled.
    _templates: dict[tuple, StepLatencyModel] = field(default_factory=dict, init=False, repr=False, compare=False)

    def latency_model(self, where: str = "profile", policy: str = "continuous",
                      engine_version: str = DEFAULT_ENGINE_VERSION) -> StepLatencyModel:
        """A fresh StepLatencyModel of this profile for one simulation (its steps priced as
        `engine_version` where the profile has that version's host terms)."""
        key = (where, policy, engine_version)
        template = self._templates.get(key)
        if template is None:
            model, self._unused_model = self._unused_model, None
            if model is None or model.policy != policy or model.engine_version != engine_version:
                model = StepLatencyModel(self.data, where, policy=policy, engine_version=engine_version)
            template = self._templates[key] = model
        return template.fresh()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_unused_model": None, "_templates": {}}

    @property
    def source(self) -> str:
        return self.data["source"]

    @property
    def label(self) -> str:
        d = self.data
        fp8 = [name for key, name in (("weight_dtype", "fp8"), ("kv_cache_dtype", "kv-fp8")) if d.get(key) == "fp8"]
        ep = f" ep{d['expert_parallel_size']}" if d.get("expert_parallel_size", 1) != 1 else ""
        return f"{d['gpu']} {' '.join([d['model'], *fp8])} tp{d['tensor_parallel_size']}{ep} ({d['source']})"


def profile_hash(data: dict[str, Any]) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _need(d: dict, key: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ProfileError(f"{where}: missing field {key!r}")
    return d[key]


def _numbers(values: Any, where: str, positive: bool = True) -> list[float]:
    if not isinstance(values, list) or not values:
        raise ProfileError(f"{where}: expected a non-empty list of numbers")
    if all(type(v) is float or type(v) is int for v in values):  # JSON numbers: checked in bulk
        try:
            out = [float(v) for v in values]
        except OverflowError:
            out = None  # (an int too large for a float: refused one by one below)
        # a finite sum has no NaN or infinity among values >= 0 (one too large for the sum: below)
        if out is not None and math.isfinite(sum(out)) and (min(out) > 0 if positive else min(out) >= 0):
            return out
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
            raise ProfileError(f"{where}: {_shown(v)} is not a finite number")
        if v < 0 or (positive and v == 0):
            raise ProfileError(f"{where}: {v!r} must be {'positive' if positive else '>= 0'}")
        out.append(float(v))
    return out


def _finite(v: int | float) -> bool:
    """A JSON number a float holds: finite, and an integer no larger than float64's range (math.isfinite
    raises OverflowError on a 400-digit integer, which userjson reads)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _shown(v: Any) -> str:
    """A value quoted in an error, cut to a readable length (a 400-digit number)."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _grid(values: Any, where: str, positive: bool = True) -> list[float]:
    xs = _numbers(values, where, positive)
    if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
        raise ProfileError(f"{where}: grid must be strictly increasing")
    return xs


def _table1d(d: dict, x_key: str, where: str) -> Table1D:
    xs = _grid(_need(d, x_key, where), f"{where}.{x_key}")
    ys = _numbers(_need(d, "time_ms", where), f"{where}.time_ms", positive=False)
    if len(xs) != len(ys):
        raise ProfileError(f"{where}: {x_key} and time_ms differ in length")
    return Table1D(xs, ys)


def _table2d(d: dict, a_key: str, b_key: str, where: str) -> Table2D:
    a = _grid(_need(d, a_key, where), f"{where}.{a_key}")
    b = _grid(_need(d, b_key, where), f"{where}.{b_key}", positive=False)
    z = _need(d, "time_ms", where)
    if not isinstance(z, list) or len(z) != len(a):
        raise ProfileError(f"{where}.time_ms: expected {len(a)} rows (one per {a_key})")
    rows = []
    for i, row in enumerate(z):
        row = _numbers(row, f"{where}.time_ms[{i}]", positive=False)
        if len(row) != len(b):
            raise ProfileError(f"{where}.time_ms[{i}]: expected {len(b)} values (one per {b_key})")
        rows.append(row)
    return Table2D(a, b, rows)


def _prefill_ratio(data: dict, where: str) -> float:
    """PREFILL_RATIO_KEY's value: a positive finite number, 1.0 when absent."""
    value = data.get(PREFILL_RATIO_KEY, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or not value > 0:
        raise ProfileError(f"{where}.{PREFILL_RATIO_KEY}: expected a positive number, got {_shown(value)}")
    return float(value)


def _error_value(v: Any, where: str, signed: bool = False) -> float:
    """A recorded relative error: finite (error bars cap it at profiles.uncertainty.MAX_ERROR, but a
    NaN passed the cap and priced every step as NaN); a median |error| is >= 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ProfileError(f"{where}: {v!r} is not a finite number")
    if v < 0 and not signed:
        raise ProfileError(f"{where}: {v!r} must be >= 0 (a median |error|)")
    return float(v)


def check_calibration_record(data: dict, where: str) -> None:
    """A calibrated profile's provenance.calibration, as error bars read it (profiles/uncertainty.py):
    the TPs that had rows, the leave-one-out errors. Checked when the profile is read, so a
    hand-edited record is one line before a run, not a traceback after its table."""
    prov = data.get("provenance")
    if prov is None:
        return
    if not isinstance(prov, dict):
        raise ProfileError(f"{where}.provenance: expected an object")
    cal = prov.get("calibration")
    if cal is None:
        return
    key = f"{where}.provenance.calibration"
    if not isinstance(cal, dict):
        raise ProfileError(f"{key}: expected an object")
    tps = cal.get("data_tps")
    if tps is not None and (not isinstance(tps, list)
                            or any(isinstance(t, bool) or not isinstance(t, int) for t in tps)):
        raise ProfileError(f"{key}.data_tps: expected a list of integers, got {tps!r}")
    if cal.get("loo_median_abs_error") is not None:
        _error_value(cal["loo_median_abs_error"], f"{key}.loo_median_abs_error")
    by_tp = cal.get("errors_by_tp")
    if by_tp is not None:
        if not isinstance(by_tp, dict) or not all(isinstance(v, dict) for v in by_tp.values()):
            raise ProfileError(f"{key}.errors_by_tp: expected an object of objects keyed by TP")
        for tp, v in by_tp.items():
            if v.get("loo_median_abs_error") is not None:
                _error_value(v["loo_median_abs_error"], f"{key}.errors_by_tp.{tp}.loo_median_abs_error")
    residuals = cal.get("residuals")
    if residuals is not None:
        if not isinstance(residuals, list) or not all(isinstance(r, dict) for r in residuals):
            raise ProfileError(f"{key}.residuals: expected a list of objects")
        for i, r in enumerate(residuals):
            if r.get("loo_error") is not None:
                _error_value(r["loo_error"], f"{key}.residuals[{i}].loo_error", signed=True)


def _check_absurd(data: dict, where: str) -> None:
    """Refuse timings no GPU could produce: a linear table that is all zero, or one layer's GEMMs
    at the largest token count more than 10x faster than the GPU's datasheet peak allows."""
    linear = data["linear"]
    times = linear["time_ms"]
    if max(times) <= 0:
        raise ProfileError(f"{where}.linear.time_ms: every timing is zero; not a real profile")
    from kvsim.simcore.catalog import GPUS  # the datasheet; simcore-internal

    gpu = next((g for g in GPUS.values() if g.name.lower() == str(data.get("gpu", "")).lower()), None)
    shape = data.get("model_shape", {})
    if gpu is None or not all(k in shape for k in ("hidden_size", "intermediate_size", "num_attention_heads")):
        return
    tp = data["tensor_parallel_size"]
    h, inter = float(shape["hidden_size"]), float(shape["intermediate_size"])
    tokens = float(linear["num_tokens"][-1])
    flops = 2.0 * tokens * (2.0 * h * h + 2.0 * h * inter) / tp  # a lower bound: QKV >= Q, MLP >= up+down
    floor_ms = 1e3 * flops / (gpu.bf16_tflops * 1e12)
    if times[-1] < 0.1 * floor_ms:
        raise ProfileError(
            f"{where}.linear: {times[-1]:.3g} ms for {tokens:.0f} tokens is over 10x faster than "
            f"{gpu.name}'s datasheet peak allows ({floor_ms:.3g} ms); not a real profile"
        )


# model_shape's integer fields (simcore.specs.ModelSpec), those that must be > 0 first; the profile
# prices from hidden_size, intermediate_size, vocab_size, dtype_bytes and num_layers (float products)
SHAPE_POSITIVE = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "dtype_bytes", "max_position_embeddings")
SHAPE_COUNTS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
                "first_k_dense_replace")
MAX_SHAPE_INT = 2**31 - 1  # past any model's dimension; keeps the float products it enters finite
MAX_PARALLEL = 65536  # GPUs one profile's TP or EP degree may name


def _check_header(data: dict, where: str) -> None:
    """The fields around the tables, as the run reads them: the GPU and model are names (a label
    joins them), TP / EP degrees and the model shape's sizes are integers in range (the shape's
    sizes enter float products: a 400-digit one overflowed, a string or an infinite dtype_bytes
    reached float() or the pricing). One line naming the field, before any table is built."""
    for key in ("gpu", "model"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise ProfileError(f"{where}.{key}: expected a name, got {_shown(data[key])}")
    for key in ("tensor_parallel_size", "expert_parallel_size"):
        v = data.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_PARALLEL:
            raise ProfileError(f"{where}.{key}: expected a positive integer up to {MAX_PARALLEL}, got {_shown(v)}")
    shape = data["model_shape"]
    if not isinstance(shape, dict):
        raise ProfileError(f"{where}.model_shape: expected an object")
    for key in SHAPE_POSITIVE + SHAPE_COUNTS:
        if key not in shape:
            continue
        v, least = shape[key], 1 if key in SHAPE_POSITIVE else 0
        if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= MAX_SHAPE_INT:
            raise ProfileError(f"{where}.model_shape.{key}: expected an integer from {least} to {MAX_SHAPE_INT:,}, "
                               f"got {_shown(v)}")


def parse_profile(data: Any, where: str = "profile") -> Profile:
    """Validate a profile document; raise ProfileError naming the file and field."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object")
    if data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: not a kvsim profile (schema {data.get('schema')!r})")
    if data.get("schema_version") not in READABLE_VERSIONS:
        raise ProfileError(
            f"{where}: schema_version {data.get('schema_version')!r} is not supported "
            f"(this kvsim reads {', '.join(map(str, READABLE_VERSIONS))})"
        )
    if data.get("source") not in SOURCES:
        raise ProfileError(f"{where}: source must be one of {SOURCES}, got {data.get('source')!r}")
    for key in ("gpu", "model", "tensor_parallel_size", "model_shape"):
        _need(data, key, where)
    if data["schema_version"] == 1:
        _need(data, "step_overhead_ms", where)
    else:
        _need(data, "host_overhead", where)
    _check_header(data, where)
    # builds every table and reads every policy's host model (host_overhead checks them all,
    # whichever it picks; the tables are the same for each), so anything malformed fails here
    model = StepLatencyModel(data, where)
    _check_absurd(data, where)
    if data["source"] == "calibrated":
        check_calibration_record(data, where)
    profile = Profile(data=data, sha256=profile_hash(data))
    profile._unused_model = model
    return profile


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        from kvsim.simcore.userfiles import read_text

        data = userjson.loads(read_text(path, "profile", encoding="utf-8-sig"))  # a BOM (Windows editors) is allowed
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise ProfileError(f"{path}: not a readable JSON profile ({exc})") from None
    profile = parse_profile(data, str(path))
    profile.path = str(path)
    return profile


@dataclass(frozen=True, slots=True)
class HostOverhead:
    """The engine's CPU time on a step's critical path (ms); see the module docstring."""

    per_step_ms: float = 0.0  # every step: schedule, prepare inputs, launch, sample bookkeeping
    per_seq_ms: float = 0.0  # each scheduled sequence (decode or prefill chunk)
    per_prefill_step_ms: float = 0.0  # once in a step that holds any prefill chunk
    per_prefill_token_ms: float = 0.0  # each prompt token computed in the step

    # ASYNC: CPU work run while the GPU executes the previous step (async scheduling): on the
    # critical path only where it outlasts the GPU's step (StepLatencyModel._parts_ms)
    hidden_per_step_ms: float = 0.0
    hidden_per_seq_ms: float = 0.0

    def ms(self, num_seqs: int, num_prefill_tokens: int) -> float:
        ms = self.per_step_ms + self.per_seq_ms * num_seqs
        if num_prefill_tokens:
            ms += self.per_prefill_step_ms + self.per_prefill_token_ms * num_prefill_tokens
        return ms

    @property
    def overlaps(self) -> bool:
        """Whether any CPU work is hidden behind the GPU (async scheduling)."""
        return self.hidden_per_step_ms != 0.0 or self.hidden_per_seq_ms != 0.0

    def excess_ms(self, num_seqs: int, gpu_ms: float) -> float:
        """The hidden CPU work's excess over the GPU's step (0 while the GPU's step is longer):
        the step then costs max(GPU, hidden) + the visible host terms."""
        excess = (self.hidden_per_step_ms + self.hidden_per_seq_ms * num_seqs) - gpu_ms
        return excess if excess > 0.0 else 0.0

    def to_dict(self) -> dict[str, float]:
        terms = {k: getattr(self, k) for k in HOST_TERMS}
        if self.overlaps:
            terms.update({k: getattr(self, k) for k in HIDDEN_TERMS})
        return terms


def _host_terms(value: Any, where: str) -> HostOverhead:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: expected an object with {', '.join(HOST_TERMS)}")
    unknown = sorted(set(value) - set(HOST_TERMS) - set(HIDDEN_TERMS))
    if unknown:
        raise ProfileError(f"{where}: unknown term {unknown[0]!r}; known: {', '.join(HOST_TERMS + HIDDEN_TERMS)}")
    terms = {}
    for key in HOST_TERMS + HIDDEN_TERMS:
        v = _numbers([value.get(key, 0.0)], f"{where}.{key}", positive=False)[0]
        if v > ABSURD_MS:
            raise ProfileError(f"{where}.{key}: {v:g} ms is not a plausible host cost")
        terms[key] = v
    return HostOverhead(**terms)


def host_overhead(data: dict, where: str, policy: str, engine_version: str | None = None) -> HostOverhead:
    """The host model for `policy`: for `continuous` run as `engine_version`, its entry in
    host_overhead_by_engine when the profile has one; else the policy's entry in
    host_overhead_by_policy if any, else host_overhead (v1: step_overhead_ms[_by_policy] as the
    per-step term alone). A measured or calibrated profile without per-engine terms keeps its own."""
    return host_overhead_source(data, where, policy, engine_version)[0]


def host_overhead_source(data: dict, where: str, policy: str,
                         engine_version: str | None = None) -> tuple[HostOverhead, str]:
    """host_overhead and the profile field it came from (what a run records)."""
    if policy not in POLICIES:
        raise ProfileError(f"{where}: unknown batching policy {policy!r}; known: {', '.join(POLICIES)}")
    v1 = data.get("schema_version") == 1
    base_key, by_key = (
        ("step_overhead_ms", "step_overhead_ms_by_policy") if v1 else ("host_overhead", "host_overhead_by_policy")
    )
    wrap = (lambda v: {"per_step_ms": v}) if v1 else (lambda v: v)
    default = _host_terms(wrap(_need(data, base_key, where)), f"{where}.{base_key}")
    chosen, source = default, base_key
    by_policy = data.get(by_key)
    if by_policy is not None:
        if not isinstance(by_policy, dict):
            raise ProfileError(f"{where}.{by_key}: expected an object keyed by policy")
        for key, value in by_policy.items():
            if key not in POLICIES:
                raise ProfileError(f"{where}.{by_key}: unknown policy {key!r}; known: {', '.join(POLICIES)}")
            terms = _host_terms(wrap(value), f"{where}.{by_key}.{key}")
            if key == policy:
                chosen, source = terms, f"{by_key}.{key}"
    by_engine = data.get("host_overhead_by_engine")
    if by_engine is not None and not v1:
        if not isinstance(by_engine, dict):
            raise ProfileError(f"{where}.host_overhead_by_engine: expected an object keyed by engine version")
        for key, value in by_engine.items():
            if key not in ENGINE_VERSIONS:
                raise ProfileError(f"{where}.host_overhead_by_engine: unknown engine version {key!r}; "
                                   f"known: {', '.join(ENGINE_VERSIONS)}")
            terms = _host_terms(value, f"{where}.host_overhead_by_engine.{key}")
            if policy == "continuous" and key == engine_version:
                chosen, source = terms, f"host_overhead_by_engine.{key}"
    return chosen, source


def prefill_attention_engine(data: dict, where: str, policy: str,
                             engine_version: str | None = None) -> tuple[str | None, list[list[float]] | None]:
    """The attention backend a `continuous` run as `engine_version` prices prefill with, and the
    time_scale that turns the profile's prefill_attention table into it: its entry in
    `prefill_attention_by_engine` (a roofline's per-version kernels: profiles/attention.py) when
    the profile has one, else (None, None): the table as it is. Every entry is checked, whichever
    is picked. The scale is dimensionless, so a profile scaled as a whole (calibration, error
    bars) scales every version's prefill with it."""
    by_engine = data.get("prefill_attention_by_engine")
    if by_engine is None:
        return None, None
    key = f"{where}.prefill_attention_by_engine"
    if not isinstance(by_engine, dict):
        raise ProfileError(f"{key}: expected an object keyed by engine version")
    pre = data.get("prefill_attention") if isinstance(data.get("prefill_attention"), dict) else {}
    rows, cols = len(pre.get("chunk_tokens") or []), len(pre.get("context_tokens") or [])
    chosen: tuple[str | None, list[list[float]] | None] = (None, None)
    for version, entry in by_engine.items():
        if version not in ENGINE_VERSIONS:
            raise ProfileError(f"{key}: unknown engine version {version!r}; known: {', '.join(ENGINE_VERSIONS)}")
        if not isinstance(entry, dict) or not isinstance(entry.get("backend"), str):
            raise ProfileError(f"{key}.{version}: expected an object with a backend name and a time_scale")
        z = entry.get("time_scale")
        if not isinstance(z, list) or len(z) != rows:
            raise ProfileError(f"{key}.{version}.time_scale: expected {rows} rows (one per chunk_tokens)")
        scale = []
        times = pre.get("time_ms") if isinstance(pre.get("time_ms"), list) else []
        for i, row in enumerate(z):
            row = _numbers(row, f"{key}.{version}.time_scale[{i}]")
            if len(row) != cols:
                raise ProfileError(f"{key}.{version}.time_scale[{i}]: expected {cols} values (one per context_tokens)")
            base = times[i] if i < len(times) and isinstance(times[i], list) else []
            for s, t in zip(row, base, strict=False):  # the scaled table obeys the tables' own bound
                if isinstance(t, (int, float)) and not isinstance(t, bool) and s * t > ABSURD_MS:
                    raise ProfileError(f"{key}.{version}.time_scale[{i}]: {s:g} x {t:g} ms is not a plausible "
                                       "kernel time")
            scale.append(row)
        if policy == "continuous" and version == engine_version:
            chosen = (entry["backend"], scale)
    return chosen


def all_reduce_engine(data: dict, where: str, policy: str,
                      engine_version: str | None = None) -> tuple[str | None, dict | None]:
    """What a `continuous` run as `engine_version` pays for a TP all-reduce, per message size:
    the source line of its entry in `collectives.all_reduce_by_engine` (vLLM V1's symmetric-memory
    path on Hopper: profiles/symm_mem_allreduce.py) and the table that entry prices it from (None:
    the profile's `all_reduce` table, also for an entry without timings). (None, None) when the
    profile has no entry for it. Every entry is checked, whichever is picked."""
    coll = data.get("collectives")
    by_engine = coll.get("all_reduce_by_engine") if isinstance(coll, dict) else None
    if by_engine is None:
        return None, None
    key = f"{where}.collectives.all_reduce_by_engine"
    if not isinstance(by_engine, dict):
        raise ProfileError(f"{key}: expected an object keyed by engine version")
    chosen: tuple[str | None, dict | None] = (None, None)
    for version, entry in by_engine.items():
        if version not in ENGINE_VERSIONS:
            raise ProfileError(f"{key}: unknown engine version {version!r}; known: {', '.join(ENGINE_VERSIONS)}")
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
            raise ProfileError(f"{key}.{version}: expected an object with a source line (and bytes / time_ms "
                               "where priced)")
        table = None
        if "bytes" in entry or "time_ms" in entry:
            _check_table_values(entry, f"{key}.{version}")
            _table1d(entry, "bytes", f"{key}.{version}")
            table = entry
        if policy == "continuous" and version == engine_version:
            chosen = (entry["source"], table)
    return chosen


def _scaled_rows(table: dict, scale: list[list[float]], factor: float = 1.0) -> dict:
    """`table` (prefill_attention) with time_ms x factor, then x scale cell by cell: the order
    parsing a profile scaled by `factor` as a whole prices it in."""
    z = table["time_ms"]
    if factor != 1.0:
        z = [[v * factor for v in row] for row in z]
    return {**table, "time_ms": [[v * s for v, s in zip(row, srow, strict=True)] for row, srow in zip(z, scale, strict=True)]}


@dataclass
class ExtrapolationCounter:
    """How many priced steps needed a value outside a profiled grid."""

    steps: int = 0
    tables: dict[str, int] = field(default_factory=dict)

    def note(self, table: str) -> None:
        self.tables[table] = self.tables.get(table, 0) + 1

    def add(self, steps: int, tables: dict[str, int]) -> None:
        """Counts another core made (simcore/fastcore.py): `steps` more steps, and per table
        its count (tables counted 0 are not added, as note() never adds them)."""
        self.steps += steps
        for table, count in tables.items():
            if count:
                self.tables[table] = self.tables.get(table, 0) + count


def _check_table_values(table: dict, where: str) -> None:
    z = table.get("time_ms") if isinstance(table, dict) else None
    try:  # a table of numbers all at most ABSURD_MS (NaN compares false: looked at one by one)
        if isinstance(z, list) and max(max(row) if isinstance(row, list) else row for row in z) <= ABSURD_MS:
            return
    except (TypeError, ValueError):  # not all numbers, an empty row: one by one, as parsing reports them
        pass
    flat = [v for row in z for v in (row if isinstance(row, list) else [row])] if isinstance(z, list) else []
    for v in flat:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > ABSURD_MS:
            raise ProfileError(f"{where}.time_ms: {v:g} ms is not a plausible kernel time")


class PrefillOccupancy:
    """A varlen prefill-attention launch: each chunk of c tokens gives `ctas_per_tile * ceil(c /
    tile_tokens)` thread blocks, which run on `num_sms` SMs in waves; the last wave's idle SMs are
    the loss (FlashAttention-2, Dao 2023, sec. 3.2: parallelism over batch, heads and sequence)."""

    __slots__ = ("tile", "ctas", "sms", "floor_ms")

    def __init__(self, d: dict, floor_ms: float, where: str):
        vals = [_numbers([_need(d, k, where)], f"{where}.{k}")[0] for k in ("tile_tokens", "ctas_per_tile", "num_sms")]
        self.tile, self.ctas, self.sms = vals
        self.floor_ms = floor_ms

    def share(self, chunks: list[tuple[int, int]]) -> float:
        tiles = 0
        for c, _ in chunks:
            tiles += math.ceil(c / self.tile)
        ctas = tiles * self.ctas
        return ctas / (math.ceil(ctas / self.sms) * self.sms)


class StepLatencyModel:
    """Prices one engine step from a profile; the engine never knows how it was measured."""

    def __init__(self, data: dict[str, Any], where: str = "profile", policy: str = "continuous",
                 engine_version: str = DEFAULT_ENGINE_VERSION):
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: expected a JSON object")
        shape = _need(data, "model_shape", where)
        layers = _need(shape, "num_layers", f"{where}.model_shape")
        self.num_layers = int(_numbers([layers], f"{where}.model_shape.num_layers")[0])
        self.policy, self.engine_version = policy, engine_version
        self.prefill_ratio = _prefill_ratio(data, where)
        self.host, self.host_source = host_overhead_source(data, where, policy, engine_version)
        self.hidden = self.host if self.host.overlaps else None  # ASYNC: CPU work overlapped with the GPU
        # ASYNC: the step being priced follows an idle engine: no GPU step before it to hide its CPU work
        # behind (vLLM's step_with_batch_queue schedules it, then launches it); set by Engine.run
        self.cold = False
        self.step_overhead_ms = self.host.per_step_ms  # v1 name, kept for readers of the old field
        for key in ("linear", "prefill_attention", "lm_head"):
            _check_table_values(data.get(key), f"{where}.{key}")
        self.linear = _table1d(_need(data, "linear", where), "num_tokens", f"{where}.linear")
        pre = _need(data, "prefill_attention", where)
        self.prefill = _table2d(pre, "chunk_tokens", "context_tokens", f"{where}.prefill_attention")
        self.prefill_backend, self._prefill_scale = prefill_attention_engine(data, where, policy, engine_version)
        self._prefill_table = pre if self._prefill_scale is not None else None  # kept for scaled()
        if self._prefill_scale is not None:  # this version's kernel: the base table x its time_scale
            self.prefill = _table2d(_scaled_rows(pre, self._prefill_scale), "chunk_tokens", "context_tokens",
                                    f"{where}.prefill_attention")
        self.occupancy: PrefillOccupancy | None = None
        if isinstance(pre, dict) and "occupancy" in pre:
            floor = _numbers([pre.get("launch_floor_ms", 0.0)], f"{where}.prefill_attention.launch_floor_ms", False)[0]
            self.occupancy = PrefillOccupancy(pre["occupancy"], floor, f"{where}.prefill_attention.occupancy")
        decode = _need(data, "decode_attention", where)
        if not isinstance(decode, dict) or not decode:
            raise ProfileError(f"{where}.decode_attention: expected tables keyed by block size")
        self.decode_by_block_size: dict[int, Table2D] = {}
        for key, table in decode.items():
            try:
                bs = int(key)
            except ValueError:
                raise ProfileError(f"{where}.decode_attention: block size {key!r} is not an integer") from None
            if bs <= 0:
                raise ProfileError(f"{where}.decode_attention: block size {key!r} must be positive")
            _check_table_values(table, f"{where}.decode_attention.{key}")
            self.decode_by_block_size[bs] = _table2d(
                table, "batch_size", "context_tokens", f"{where}.decode_attention.{key}"
            )
        self.lm_head = _table1d(_need(data, "lm_head", where), "num_seqs", f"{where}.lm_head")
        self._init_collectives(data, shape, where)
        self.extrapolated = ExtrapolationCounter()
        self._last_key: tuple | None = None
        self._last_chunks: list[tuple[int, int]] = []
        self._last_parts = (0.0, 0.0, 0.0)
        self._fixed_memo: dict[tuple, tuple[float, float, float, bool]] = {}
        self._span_memo: dict[int, tuple] = {}
        self.set_block_size(16)

    def _init_collectives(self, data: dict, shape: dict, where: str) -> None:
        """v2: per-call all-reduce vs bytes; v1: one layer's all-reduces vs tokens."""
        self.collective = None  # v1 per-layer table
        self.all_reduce_source: str | None = None  # collectives.all_reduce_by_engine's line for this version
        self.all_reduce: Table1D | None = None
        self.send_recv: Table1D | None = None  # one hand-off between two GPUs of a node
        self.send_recv_inter_node: Table1D | None = None  # ... between GPUs of two nodes
        coll = data.get("collectives")
        if coll:
            where = f"{where}.collectives"
            if not isinstance(coll, dict):
                raise ProfileError(f"{where}: expected an object")
            if "all_reduce" in coll:
                _check_table_values(coll["all_reduce"], f"{where}.all_reduce")
                self.all_reduce = _table1d(coll["all_reduce"], "bytes", f"{where}.all_reduce")
            # this version's all-reduce where it is not the profile's table (vLLM V1's symmetric memory)
            self.all_reduce_source, version_table = all_reduce_engine(data, where[:-12], self.policy,
                                                                      self.engine_version)
            if version_table is not None and self.all_reduce is not None:
                self.all_reduce = _table1d(version_table, "bytes", f"{where}.all_reduce_by_engine.{self.engine_version}")
            for key in ("send_recv", "send_recv_inter_node"):
                if key in coll:
                    _check_table_values(coll[key], f"{where}.{key}")
                    setattr(self, key, _table1d(coll[key], "bytes", f"{where}.{key}"))
            calls = coll.get("all_reduce_calls_per_layer", 2)
            self.calls_per_layer = _numbers([calls], f"{where}.all_reduce_calls_per_layer", positive=False)[0]
            if self.calls_per_layer > MAX_CALLS_PER_LAYER:
                raise ProfileError(f"{where}.all_reduce_calls_per_layer: {self.calls_per_layer:g} is not a plausible "
                                   f"count (Megatron TP makes 2 per layer; at most {MAX_CALLS_PER_LAYER} accepted)")
            dtype_bytes = float(shape.get("dtype_bytes", 2))
            self.token_bytes = float(_need(shape, "hidden_size", f"{where[:-12]}.model_shape")) * dtype_bytes
            self.logit_bytes = float(shape.get("vocab_size", 0)) * dtype_bytes
        elif data.get("collective"):
            self.collective = _table1d(data["collective"], "num_tokens", f"{where}.collective")
        self._coll_memo: dict[tuple[int, int], float] = {}

    def scaled(self, factor: float, prefill_factor: float | None = None) -> StepLatencyModel:
        """A fresh model with every step time x `factor` (> 0): every table, collective and host
        term scaled, exactly the model parsed from a profile whose values were all scaled
        (profiles.uncertainty.scaled_profile) without parsing or validating it again.
        `prefill_factor`: a step of prompt tokens alone x that instead, a mixed step in proportion
        to its prompt tokens (PREFILL_RATIO_KEY; the ratio compounds with the model's own)."""
        new = self.fresh()
        if prefill_factor is not None:
            new.prefill_ratio = self.prefill_ratio * (prefill_factor / factor)
        h = self.host
        new.host = HostOverhead(h.per_step_ms * factor, h.per_seq_ms * factor, h.per_prefill_step_ms * factor,
                                h.per_prefill_token_ms * factor, h.hidden_per_step_ms * factor,
                                h.hidden_per_seq_ms * factor)
        new.hidden = new.host if new.host.overlaps else None
        new.step_overhead_ms = new.host.per_step_ms
        for name in ("linear", "lm_head", "prefill", "collective", "all_reduce", "send_recv", "send_recv_inter_node"):
            table = getattr(self, name)
            if table is not None:
                setattr(new, name, table.scaled(factor))
        if self._prefill_scale is not None:  # scaled, then x the version's time_scale, as parsing the scaled profile
            new.prefill = _table2d(_scaled_rows(self._prefill_table, self._prefill_scale, factor),
                                   "chunk_tokens", "context_tokens", "prefill_attention")
            new._prefill_table = {**self._prefill_table,
                                  "time_ms": [[v * factor for v in row] for row in self._prefill_table["time_ms"]]}
        if self.occupancy is not None:
            new.occupancy = copy.copy(self.occupancy)
            new.occupancy.floor_ms = self.occupancy.floor_ms * factor
        new.decode_by_block_size = {bs: t.scaled(factor) for bs, t in self.decode_by_block_size.items()}
        new.decode = new.decode_by_block_size[self.decode_block_size]
        return new

    def fresh(self) -> StepLatencyModel:
        """A copy for another simulation: the same tables (read-only; their memos are pure), its
        own extrapolation counter, memos and decode-table choice."""
        new = copy.copy(self)
        new.extrapolated = ExtrapolationCounter()
        new._last_key, new._last_chunks, new._last_parts = None, [], (0.0, 0.0, 0.0)
        new._fixed_memo, new._span_memo, new._coll_memo = {}, {}, {}
        new.cold = False
        return new

    def set_block_size(self, block_size: int) -> bool:
        """Use the decode table of this block size, else the nearest one; True if exact."""
        sizes = sorted(self.decode_by_block_size)
        best = min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(block_size)), s))
        self.decode = self.decode_by_block_size[best]
        self.decode_block_size = best
        self._last_key = None  # the cached breakdown was priced with another table
        return best == block_size

    def collectives_ms(self, num_tokens: int, num_sampled: int) -> float:
        """The step's TP collectives: per layer, all-reduces of the hidden states; once, the
        logits gather (an all-gather moves half an all-reduce's bytes)."""
        key = (num_tokens, num_sampled)
        hit = self._coll_memo.get(key)
        if hit is not None:
            return hit
        ms = 0.0
        if self.all_reduce is not None:
            ms = self.num_layers * self.calls_per_layer * self.all_reduce(num_tokens * self.token_bytes)
            if num_sampled:
                ms += self.all_reduce(num_sampled * self.logit_bytes / 2)
        elif self.collective is not None:
            ms = self.num_layers * self.collective(num_tokens)
        if len(self._coll_memo) < 65536:
            self._coll_memo[key] = ms
        return ms

    def send_recv_ms(self, nbytes: float, across_nodes: bool = False) -> float | None:
        """One point-to-point hand-off (pipeline stages) inside a node or across two nodes;
        None when the profile has no such table (TP 1 profiles have no collectives)."""
        table = self.send_recv_inter_node if across_nodes else self.send_recv
        return table(nbytes) if table is not None else None

    def fixed_parts_ms(self, num_tokens: int, num_decode_seqs: int, num_prefill_chunks: int,
                       num_sampled: int) -> tuple[float, float, float, bool]:
        """(GEMM-like kernels, collectives, host) ms of a step and whether its linear table was
        extrapolated: everything but attention, which alone depends on the contexts. Kept per
        step shape: the same few shapes recur (a decode batch at each size) step after step."""
        key = (num_tokens, num_decode_seqs, num_prefill_chunks, num_sampled)
        hit = self._fixed_memo.get(key)
        if hit is None:
            hit = (self.num_layers * self.linear(num_tokens) + self.lm_head(num_sampled),
                   self.collectives_ms(num_tokens, num_sampled),
                   self.host.ms(num_prefill_chunks + num_decode_seqs, num_tokens - num_decode_seqs),
                   self.linear.outside(num_tokens))
            if len(self._fixed_memo) < MEMO_ENTRIES:
                self._fixed_memo[key] = hit
        return hit

    def _parts_ms(self, num_tokens: int, prefill_chunks: list[tuple[int, int]], num_decode_seqs: int,
                  decode_context_tokens: int, num_sampled: int,
                  counter: ExtrapolationCounter | None) -> tuple[float, float, float, float]:
        """step_parts_ms, counting extrapolated tables and steps in `counter` (None: not at all).
        Written out in one function (the fixed parts' memo read here, the tables called
        directly): every step of a simulation comes through here, most of them a decode batch
        alone or with one prompt chunk, and Python charges for each call on the way."""
        num_chunks = len(prefill_chunks)
        fixed = self._fixed_memo.get((num_tokens, num_decode_seqs, num_chunks, num_sampled))
        if fixed is None:
            fixed = self.fixed_parts_ms(num_tokens, num_decode_seqs, num_chunks, num_sampled)
        gemm, coll, host, out = fixed
        if out and counter is not None:
            counter.note("linear")
        ms = 0.0
        if num_chunks:
            prefill = self.prefill
            for chunk, ctx in prefill_chunks:
                ms += prefill(chunk, ctx)
                if prefill.outside(chunk, ctx):
                    out = True
                    if counter is not None:
                        counter.note("prefill_attention")
            if self.occupancy is not None:
                ms = self.occupancy.floor_ms + ms / self.occupancy.share(prefill_chunks)
        if num_decode_seqs:
            mean_ctx = decode_context_tokens / num_decode_seqs
            decode = self.decode
            ms += decode(num_decode_seqs, mean_ctx)
            if decode.outside(num_decode_seqs, mean_ctx):
                out = True
                if counter is not None:
                    counter.note("decode_attention")
        if out and counter is not None:
            counter.steps += 1
        a = self.num_layers * ms
        if self.hidden is not None:  # ASYNC: the hidden CPU work's excess over the GPU's step
            host = host + self.excess_ms(num_chunks + num_decode_seqs, gemm + a + coll)
        r = self.prefill_ratio
        if r != 1.0 and num_tokens > num_decode_seqs:  # a step with prompt tokens: see _prefill_ratio
            m = 1.0 + (r - 1.0) * ((num_tokens - num_decode_seqs) / num_tokens)
            return gemm * m, a * m, coll * m, host * m
        return gemm, a, coll, host

    def step_parts_ms(
        self, num_tokens: int, prefill_chunks: list[tuple[int, int]], num_decode_seqs: int,
        decode_context_tokens: int, num_sampled: int,
    ) -> tuple[float, float, float, float]:
        """(GEMM-like kernels: linear + LM head, attention kernels, collectives, host) in ms."""
        return self._parts_ms(num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens, num_sampled,
                              self.extrapolated)

    def step_breakdown_ms(
        self, num_tokens: int, prefill_chunks: list[tuple[int, int]], num_decode_seqs: int,
        decode_context_tokens: int, num_sampled: int,
    ) -> tuple[float, float, float]:
        """(kernels, collectives, host) in ms; the step just priced by step_time_s is reused.
        Pricing a step here again (the last of a decode span) counts no extrapolation."""
        key = (num_tokens, num_decode_seqs, decode_context_tokens, num_sampled)
        if key == self._last_key and prefill_chunks == self._last_chunks:
            return self._last_parts
        g, a, c, h = self._parts_ms(num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens,
                                    num_sampled, None)
        return g + a, c, h

    def step_time_s(
        self,
        num_tokens: int,
        prefill_chunks: list[tuple[int, int]],
        num_decode_seqs: int,
        decode_context_tokens: int,
        num_sampled: int,
    ) -> float:
        """Seconds for one step: `prefill_chunks` are (chunk_tokens, prior_context_tokens);
        decodes are `num_decode_seqs` sequences attending to `decode_context_tokens` in all."""
        g, a, c, h = self._parts_ms(num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens,
                                    num_sampled, self.extrapolated)
        self._last_key = (num_tokens, num_decode_seqs, decode_context_tokens, num_sampled)
        self._last_chunks = list(prefill_chunks)
        self._last_parts = (g + a, c, h)
        return (h + g + a + c) / 1000.0

    def decode_span_times_s(self, num_seqs: int, context_sums: np.ndarray, count: bool = True) -> np.ndarray:
        """Seconds of each decode-only step of a span: `num_seqs` sequences, their context sum
        per step in `context_sums`; equal to step_time_s per step bit for bit, and its
        extrapolated steps counted per step and per table exactly as step_time_s counts them.
        `count=False`: nothing counted (a span that may be cut short counts the steps it ran
        with count_decode_span)."""
        if num_seqs <= 0:
            raise ValueError("decode_span_times_s needs num_seqs >= 1")
        n, layers, fixed, coll, linear_out, floats = self._span_terms(num_seqs)
        mean_ctx = np.true_divide(context_sums, n)  # each sum converted to float64, then divided
        if count:
            self._count_span(num_seqs, mean_ctx, linear_out)
        attention = self.decode.row(num_seqs, mean_ctx)
        if self.hidden is not None:  # ASYNC: each step max(GPU, hidden) + host, as _parts_ms
            gemm, coll_ms, host, _ = self.fixed_parts_ms(num_seqs, num_seqs, 0, num_seqs)
            a = layers * attention
            h = host + self._span_excess(num_seqs, gemm, a, coll_ms)
            return (h + gemm + a + coll_ms) / _THOUSAND
        if len(attention) > SHORT_ROW:
            return (fixed + layers * attention + coll) / _THOUSAND
        # a short span: the same operations on Python floats (IEEE, as numpy's), fewer numpy calls
        fixed, layers, coll = floats
        return np.array([(fixed + layers * a + coll) / 1000.0 for a in attention.tolist()])

    def excess_ms(self, num_seqs: int, gpu_ms: float) -> float:
        """ASYNC: HostOverhead.excess_ms over the GPU's step, or, after an idle engine
        (`cold`), the whole hidden work (nothing ran before it to hide it behind)."""
        return self.hidden.excess_ms(num_seqs, 0.0 if self.cold else gpu_ms)

    def _span_excess(self, num_seqs: int, gemm: float, a: np.ndarray, coll: float) -> np.ndarray:
        """ASYNC: HostOverhead.excess_ms of each step of a decode span (L * attention in `a`)."""
        h = self.hidden
        excess = (h.hidden_per_step_ms + h.hidden_per_seq_ms * num_seqs) - (gemm + a + coll)
        return np.where(excess > 0.0, excess, 0.0)

    def decode_span_excess_ms(self, num_seqs: int, context_sums: np.ndarray) -> np.ndarray:
        """ASYNC: the host time each step of a decode span adds over its visible host terms
        (what a step table's host column holds beyond decode_step_fixed_ms's host)."""
        gemm, coll, _, _ = self.fixed_parts_ms(num_seqs, num_seqs, 0, num_seqs)
        a = np.array(self.num_layers, dtype=np.float64) * self.decode.row(num_seqs, np.true_divide(context_sums, num_seqs))
        return self._span_excess(num_seqs, gemm, a, coll)

    def count_decode_span(self, num_seqs: int, context_sums: np.ndarray) -> None:
        """Count the extrapolated steps of decode-only steps priced with count=False, as
        decode_span_times_s would have counted them. `context_sums` grow step by step, so the
        first and last steps' mean contexts bound the others: when both, the batch size and
        the GEMM tokens are inside the tables (the usual case), nothing is counted."""
        n, _, _, _, linear_out, _ = self._span_terms(num_seqs)
        if not linear_out:
            dec = self.decode
            (a_lo, a_hi), (b_lo, b_hi) = dec.a_range, dec.b_range
            # int / int rounds once, as numpy's float64 division of these exact integers does
            if (a_lo <= num_seqs <= a_hi and b_lo <= int(context_sums[0]) / num_seqs
                    and int(context_sums[-1]) / num_seqs <= b_hi):
                return
        self._count_span(num_seqs, np.true_divide(context_sums, n), linear_out)

    def _span_terms(self, num_seqs: int) -> tuple:
        """A decode span's scalars as 0-d arrays (numpy combines two arrays several times faster
        than an array and a Python number; the values and so the results are the same): the
        batch size, the layer count, host + GEMM-like ms, collectives ms; whether the linear
        table was extrapolated; and the last three as Python floats (a short span's arithmetic)."""
        terms = self._span_memo.get(num_seqs)
        if terms is None:
            gemm, coll, host, linear_out = self.fixed_parts_ms(num_seqs, num_seqs, 0, num_seqs)
            floats = (host + gemm, float(self.num_layers), coll)
            terms = (*(np.array(x, dtype=np.float64) for x in (num_seqs, self.num_layers, host + gemm, coll)),
                     linear_out, floats)
            if len(self._span_memo) < MEMO_ENTRIES:
                self._span_memo[num_seqs] = terms
        return terms

    def _count_span(self, num_seqs: int, mean_ctx: np.ndarray, linear_out: bool) -> None:
        """Count a decode span's extrapolated steps as step_time_s would, step by step."""
        steps = len(mean_ctx)
        dec = self.decode
        (a_lo, a_hi), (b_lo, b_hi) = dec.a_range, dec.b_range
        if not a_lo <= num_seqs <= a_hi:
            dec_out = steps
        else:
            ctx = mean_ctx.tolist()  # a span is short: Python's min/max beat numpy's set-up here
            inside = not ctx or (min(ctx) >= b_lo and max(ctx) <= b_hi)
            dec_out = 0 if inside else int(np.count_nonzero((mean_ctx < b_lo) | (mean_ctx > b_hi)))
        counter = self.extrapolated
        if linear_out:
            counter.tables["linear"] = counter.tables.get("linear", 0) + steps
            counter.steps += steps
        elif dec_out:
            counter.steps += dec_out
        if dec_out:
            counter.tables["decode_attention"] = counter.tables.get("decode_attention", 0) + dec_out
