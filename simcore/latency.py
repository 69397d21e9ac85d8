"""Step latency from a profile: interpolated per-operator tables priced for a mixed step.

A profile (schema `kvsim-profile` v1, `profiles/<gpu>-<model>-tp<N>.json`) holds, for one GPU,
model shape, dtype and tensor-parallel degree, times in milliseconds on one GPU:

    linear             one layer's GEMMs, norms, activation, residual     vs num_tokens
    prefill_attention  one layer, a prompt chunk over prior context       vs (chunk_tokens, context_tokens)
    decode_attention   one layer, paged decode, per block size            vs (batch_size, context_tokens)
    lm_head            final norm + LM head + sampling, whole model       vs num_seqs
    collective         one layer's tensor-parallel all-reduces (tp > 1)   vs num_tokens
    step_overhead_ms   fixed CPU scheduling / launch cost of every step (ms)
    step_overhead_ms_by_policy   optional {"static", "dynamic", "continuous"} -> ms: the same
                       cost for the engine each batching policy models (HF generate, early
                       TGI, vLLM); a policy missing here falls back to step_overhead_ms

A step costs   overhead + L * (linear(T) + sum_i prefill(c_i, ctx_i) + decode(B, ctx_mean)
+ collective(T)) + lm_head(S)   where T is the step's batched tokens, B the decoding sequences
and S the sequences sampled. Tables are interpolated piecewise-linearly in log-log space after
being made monotone; points outside a table are extrapolated along the edge segment and counted.
"""

from __future__ import annotations

import hashlib
import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simcore.errors import ProfileError

SCHEMA = "kvsim-profile"
SCHEMA_VERSION = 1
SOURCES = ("measured", "roofline")
POLICIES = ("static", "dynamic", "continuous")


def _monotone(values: list[float]) -> list[float]:
    out, best = [], 0.0
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -30.0


class Table1D:
    """y(x) on a sorted grid, log-log piecewise linear, monotone non-decreasing."""

    __slots__ = ("lx", "ly", "lo", "hi", "_memo")

    def __init__(self, xs: list[float], ys: list[float]):
        self.lx = [math.log(x) for x in xs]
        self.ly = [_log(y) for y in _monotone(ys)]
        self.lo, self.hi = xs[0], xs[-1]
        self._memo: dict[float, float] = {}

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
        i = min(max(bisect_right(lx, math.log(x)) - 1, 0), len(lx) - 2)
        t = (math.log(x) - lx[i]) / (lx[i + 1] - lx[i])
        return math.exp(ly[i] + t * (ly[i + 1] - ly[i]))


class Table2D:
    """z(a, b) on a grid: log-log in a, log1p in b (b may be 0), monotone in both."""

    __slots__ = ("la", "lb", "lz", "a_range", "b_range")

    def __init__(self, a: list[float], b: list[float], z: list[list[float]]):
        self.la = [math.log(x) for x in a]
        self.lb = [math.log1p(x) for x in b]
        rows = [_monotone(row) for row in z]
        cols = [_monotone([rows[i][j] for i in range(len(a))]) for j in range(len(b))]
        self.lz = [[_log(cols[j][i]) for j in range(len(b))] for i in range(len(a))]
        self.a_range, self.b_range = (a[0], a[-1]), (b[0], b[-1])

    def outside(self, a: float, b: float) -> bool:
        return not (self.a_range[0] <= a <= self.a_range[1] and self.b_range[0] <= b <= self.b_range[1])

    @staticmethod
    def _locate(grid: list[float], v: float) -> tuple[int, float]:
        if len(grid) == 1:
            return 0, 0.0
        i = min(max(bisect_right(grid, v) - 1, 0), len(grid) - 2)
        return i, (v - grid[i]) / (grid[i + 1] - grid[i])

    def __call__(self, a: float, b: float) -> float:
        if a <= 0:
            return 0.0
        i, s = self._locate(self.la, math.log(a))
        j, t = self._locate(self.lb, math.log1p(b))
        lz = self.lz
        i1 = min(i + 1, len(lz) - 1)
        j1 = min(j + 1, len(lz[0]) - 1)
        top = lz[i][j] + t * (lz[i][j1] - lz[i][j])
        bot = lz[i1][j] + t * (lz[i1][j1] - lz[i1][j])
        return math.exp(top + s * (bot - top))


@dataclass
class Profile:
    """A validated profile document plus its content hash."""

    data: dict[str, Any]
    sha256: str
    path: str | None = None

    @property
    def source(self) -> str:
        return self.data["source"]

    @property
    def label(self) -> str:
        d = self.data
        return f"{d['gpu']} {d['model']} tp{d['tensor_parallel_size']} ({d['source']})"


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
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ProfileError(f"{where}: {v!r} is not a finite number")
        if v < 0 or (positive and v == 0):
            raise ProfileError(f"{where}: {v!r} must be {'positive' if positive else '>= 0'}")
        out.append(float(v))
    return out


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


def parse_profile(data: Any, where: str = "profile") -> Profile:
    """Validate a profile document; raise ProfileError naming the file and field."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object")
    if data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: not a kvsim profile (schema {data.get('schema')!r})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(
            f"{where}: schema_version {data.get('schema_version')!r} is not supported "
            f"(this kvsim reads {SCHEMA_VERSION})"
        )
    if data.get("source") not in SOURCES:
        raise ProfileError(f"{where}: source must be one of {SOURCES}, got {data.get('source')!r}")
    for key in ("gpu", "model", "tensor_parallel_size", "model_shape", "step_overhead_ms"):
        _need(data, key, where)
    tp = data["tensor_parallel_size"]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp <= 0:
        raise ProfileError(f"{where}.tensor_parallel_size: expected a positive integer, got {tp!r}")
    if not isinstance(data["model_shape"], dict):
        raise ProfileError(f"{where}.model_shape: expected an object")
    StepLatencyModel(data, where)  # builds every table, so any malformed table fails here
    return Profile(data=data, sha256=profile_hash(data))


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not a readable JSON profile ({exc})") from None
    profile = parse_profile(data, str(path))
    profile.path = str(path)
    return profile


def _overhead_ms(data: dict, where: str, policy: str) -> float:
    """The fixed per-step cost for `policy`: its entry in step_overhead_ms_by_policy if the
    profile has one, else step_overhead_ms."""
    if policy not in POLICIES:
        raise ProfileError(f"{where}: unknown batching policy {policy!r}; known: {', '.join(POLICIES)}")
    overhead = _need(data, "step_overhead_ms", where)
    default = _numbers([overhead], f"{where}.step_overhead_ms", positive=False)[0]
    by_policy = data.get("step_overhead_ms_by_policy")
    if by_policy is None:
        return default
    if not isinstance(by_policy, dict):
        raise ProfileError(f"{where}.step_overhead_ms_by_policy: expected an object keyed by policy")
    for key, value in by_policy.items():
        if key not in POLICIES:
            raise ProfileError(
                f"{where}.step_overhead_ms_by_policy: unknown policy {key!r}; known: {', '.join(POLICIES)}"
            )
        _numbers([value], f"{where}.step_overhead_ms_by_policy.{key}", positive=False)
    return float(by_policy.get(policy, default))


@dataclass
class ExtrapolationCounter:
    """How many priced steps needed a value outside a profiled grid."""

    steps: int = 0
    tables: dict[str, int] = field(default_factory=dict)

    def note(self, table: str) -> None:
        self.tables[table] = self.tables.get(table, 0) + 1


class StepLatencyModel:
    """Prices one engine step from a profile; the engine never knows how it was measured."""

    def __init__(self, data: dict[str, Any], where: str = "profile", policy: str = "continuous"):
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: expected a JSON object")
        layers = _need(_need(data, "model_shape", where), "num_layers", f"{where}.model_shape")
        self.num_layers = int(_numbers([layers], f"{where}.model_shape.num_layers")[0])
        self.policy = policy
        self.step_overhead_ms = _overhead_ms(data, where, policy)
        self.linear = _table1d(_need(data, "linear", where), "num_tokens", f"{where}.linear")
        self.prefill = _table2d(
            _need(data, "prefill_attention", where), "chunk_tokens", "context_tokens",
            f"{where}.prefill_attention",
        )
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
            self.decode_by_block_size[bs] = _table2d(
                table, "batch_size", "context_tokens", f"{where}.decode_attention.{key}"
            )
        self.lm_head = _table1d(_need(data, "lm_head", where), "num_seqs", f"{where}.lm_head")
        coll = data.get("collective")
        self.collective = _table1d(coll, "num_tokens", f"{where}.collective") if coll else None
        self.extrapolated = ExtrapolationCounter()
        self.set_block_size(16)

    def set_block_size(self, block_size: int) -> bool:
        """Use the decode table of this block size, else the nearest one; True if exact."""
        sizes = sorted(self.decode_by_block_size)
        best = min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(block_size)), s))
        self.decode = self.decode_by_block_size[best]
        self.decode_block_size = best
        return best == block_size

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
        out = False
        per_layer = self.linear(num_tokens)
        if self.linear.outside(num_tokens):
            out = True
            self.extrapolated.note("linear")
        prefill = self.prefill
        for chunk, ctx in prefill_chunks:
            per_layer += prefill(chunk, ctx)
            if prefill.outside(chunk, ctx):
                out = True
                self.extrapolated.note("prefill_attention")
        if num_decode_seqs:
            mean_ctx = decode_context_tokens / num_decode_seqs
            per_layer += self.decode(num_decode_seqs, mean_ctx)
            if self.decode.outside(num_decode_seqs, mean_ctx):
                out = True
                self.extrapolated.note("decode_attention")
        if self.collective is not None:
            per_layer += self.collective(num_tokens)
        ms = self.step_overhead_ms + self.num_layers * per_layer + self.lm_head(num_sampled)
        if out:
            self.extrapolated.steps += 1
        return ms / 1000.0
