"""Per-step records, per-request tables and the summary (names follow `vllm bench serve`)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.simcore import quantiles
from kvsim.simcore.records import (
    FINISHED,
    REJECTED,
    SATURATION_BLOCK,
    RequestRecords,
    Samples,
    derived_latencies,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

    from kvsim.simcore.latency import StepLatencyModel
    from kvsim.simcore.step import MemorySnapshot, StepPlan

STEP_COLUMNS = (
    "start_s", "duration_s", "num_steps", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
    "num_running", "num_waiting", "num_swapped", "num_preempted", "num_swap_blocks",
    "kv_allocated", "kv_live", "kv_reserved_future", "kv_internal", "kv_stale", "kv_external",
    "kv_unshared",
)
# The step's cost by part (ms): GPU kernels, TP collectives, host/engine time (see simcore.latency);
# NaN when the recorder has no latency model. duration_s may add swap time on top of their sum.
# A span row holds the sums over its steps.
COST_COLUMNS = ("kernels_ms", "collectives_ms", "host_ms")
KV_KINDS = ("allocated", "live", "reserved_future", "internal", "stale", "external", "unshared")
# Step rows kept in memory (21 columns, 168 B a row: 21 MiB at the cap). Beyond it, adjacent rows
# are coalesced in pairs (counts weighted by num_steps, KV by duration, costs summed), so the
# table keeps covering the whole run at a coarser grain; `StepTotals` stay exact, and a caller
# that wants every row gets them through `spill` (steps.csv with --out).
STEP_ROWS_CAP = 1 << 17
_STEP_CHUNK = 1 << 14  # rows gathered in Python arrays before they become numpy columns
_PER_STEP = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_running", "num_waiting",
             "num_swapped", "num_preempted", "num_swap_blocks")  # a row's per-step values
_COLUMNS = STEP_COLUMNS + COST_COLUMNS  # a recorded row, in this order
_WIDTH = len(_COLUMNS)
_NO_COSTS = (math.nan, math.nan, math.nan)  # no latency model: costs unknown
# A row goes into the buffer as one `pack_into` of its values as native doubles (the bits
# `array("d").extend` wrote, at a third of its cost: that converts each value separately);
# room is added _ROOM_ROWS rows at a time.
_pack_row = struct.Struct(f"{_WIDTH}d").pack_into
_ROW_BYTES = 8 * _WIDTH
_ROOM_ROWS = 1 << 10
_ROOM = bytes(_ROOM_ROWS * _ROW_BYTES)
_KV_ALLOCATED, _KV_LIVE, _KV_INTERNAL, _KV_UNSHARED = (
    KV_KINDS.index(kind) for kind in ("allocated", "live", "internal", "unshared"))


def _add_in_order(totals: list[float], addends: np.ndarray) -> list[float]:
    """Each total plus its column of addends, added one row at a time in row order: the floats a
    `+=` per row would give (numpy's accumulate is sequential; its sum is pairwise, not)."""
    acc = np.empty((len(addends) + 1, len(totals)))
    acc[0] = totals
    acc[1:] = addends
    return [float(x) for x in np.add.accumulate(acc, axis=0)[-1]]


@dataclass
class StepTotals:
    """Running sums over every engine step, whatever the step table keeps: what the summary's
    step-weighted and time-weighted figures need."""

    num_steps: int = 0
    duration_s: float = 0.0
    seq_steps: int = 0  # sum over steps of the sequences scheduled
    running_s: float = 0.0  # sum over steps of requests running at its end x its duration
    max_running: int = 0  # most requests running at the end of a step
    # the regime's measures (reports.regime), kept when the recorder knows the KV capacity
    kv_allocated_max: int = 0  # most KV slots allocated at the end of a step
    kv_blocked_s: float = 0.0  # time in steps that ended KV-blocked (see reports.regime)
    num_preempted: int = 0
    kv_slot_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KV_KINDS, 0.0))  # sum kv * dt

    def add(self, other: StepTotals) -> None:
        """Sum another replica's totals into these."""
        self.num_steps += other.num_steps
        self.duration_s += other.duration_s
        self.seq_steps += other.seq_steps
        self.running_s += other.running_s
        self.max_running = max(self.max_running, other.max_running)
        self.kv_allocated_max = max(self.kv_allocated_max, other.kv_allocated_max)
        self.kv_blocked_s += other.kv_blocked_s
        self.num_preempted += other.num_preempted
        for kind, value in other.kv_slot_s.items():
            self.kv_slot_s[kind] += value

    @classmethod
    def from_frame(cls, steps: pd.DataFrame) -> StepTotals:
        """Totals of a step table whose rows are single steps (or spans, weighted by num_steps)."""
        totals = cls()
        if not len(steps):
            return totals
        dt = steps["duration_s"].to_numpy()
        counts = steps["num_steps"].to_numpy() if "num_steps" in steps else np.ones(len(steps), dtype=np.int64)
        totals.num_steps = int(counts.sum())
        totals.duration_s = float(dt.sum())
        totals.seq_steps = int(np.dot(steps["num_seqs"].to_numpy(), counts))
        totals.running_s = float(np.dot(steps["num_running"].to_numpy(), dt))
        for kind in KV_KINDS:
            totals.kv_slot_s[kind] = float(np.dot(steps[f"kv_{kind}"].to_numpy(), dt))
        return totals


class StepRecorder:
    """The step table, one row per step, or per decode span (`num_steps` > 1: its duration is the
    span's, its counts and KV the state at the end of its last step); cheap enough to call on
    every step. `totals` sums every step exactly, spans included. With a latency model it also
    records each step's cost breakdown (the model reuses the step it just priced). At most
    `cap` rows are kept (STEP_ROWS_CAP; older rows coalesced beyond it); `spill(columns)`, when
    set, receives every row at full resolution once the cap is passed (the kept ones first).

    Why it is cheap: a step is one `struct.pack_into` of its row (costs included) into a
    row-major buffer; the columns and the `totals` are worked out once per chunk of rows with
    numpy, the float sums added row by row in step order (`_add_in_order`), so they are the
    same bits as summing step by step."""

    def __init__(self, latency: StepLatencyModel | None = None, cap: int | None = None) -> None:
        self._rows = bytearray()  # rows not sealed yet: float64, row-major in _COLUMNS order
        self._num_rows = 0  # rows in `_rows`
        self._room = 0  # rows `_rows` has room for
        # span rows not in the totals yet: (row index among the pending rows, KV
        # allocated slot-seconds, internal slot-seconds, KV-blocked seconds), from its steps
        self._span_sums: list[tuple[int, float, float, float]] = []
        self._num_folded = 0  # pending rows already in `_totals`
        self._breakdown = latency.step_breakdown_ms if latency is not None else None
        self._totals = StepTotals()
        self.cap = STEP_ROWS_CAP if cap is None else cap
        self._kept: list[dict[str, np.ndarray]] = []  # sealed chunks, oldest first
        self._num_kept = 0
        self.coalesced = False  # some kept rows stand for several rows (the table is coarser)
        self._halvings = 0  # times the kept table was coalesced: a kept row is ~2**halvings rows
        self.streaming = False  # rows passed the cap and go to `spill` as they are sealed
        self.spill: Callable[[dict[str, np.ndarray]], None] | None = None
        self.kv_capacity = 0  # KV slots of the replica (0: unknown, no regime sums)
        self.kv_unit = 1  # smallest allocation (block size when paged)

    @property
    def totals(self) -> StepTotals:
        """Exact sums over every step recorded so far."""
        self._fold()
        return self._totals

    def record(
        self, start: float, dt: float, plan: StepPlan, mem: MemorySnapshot,
        num_running: int, num_waiting: int, num_swapped: int,
    ) -> None:
        n = self._num_rows
        if n == self._room:
            self._rows.extend(_ROOM)
            self._room += _ROOM_ROWS
        breakdown = self._breakdown
        num_tokens, num_decode_seqs = plan.num_tokens, plan.num_decode_seqs
        kernels_ms, coll_ms, host_ms = _NO_COSTS if breakdown is None else breakdown(
            num_tokens, plan.prefill_chunks, num_decode_seqs, plan.decode_context_tokens, plan.num_sampled)
        _pack_row(  # the values as separate arguments: a call with *args builds a tuple of them first
            self._rows, n * _ROW_BYTES,
            start, dt, 1, plan.num_scheduled, num_tokens - num_decode_seqs,
            num_decode_seqs, num_running, num_waiting, num_swapped, plan.num_preempted,
            plan.num_swap_blocks, mem.allocated, mem.live, mem.reserved_future, mem.internal,
            mem.stale, mem.external, mem.unshared or mem.allocated, kernels_ms, coll_ms, host_ms,
        )
        self._num_rows = n = n + 1
        if n == _STEP_CHUNK:
            self._seal()

    def record_span(
        self, start: float, durations: np.ndarray, plan: StepPlan, allocated: np.ndarray,
        internal: np.ndarray, num_running: int, num_waiting: int, num_swapped: int,
        costs_ms: tuple[float, float, float] = _NO_COSTS,
    ) -> None:
        """Steps of a decode span (all decodes of the same batch, nothing shared, reserved or
        stale): `allocated` / `internal` KV slots at the end of each step; `costs_ms` the
        span's (kernels, collectives, host) summed over its steps."""
        end_alloc, end_internal = int(allocated[-1]), int(internal[-1])
        blocked_s = 0.0  # allocations only grow within a span: none blocked unless the last step is
        if self.kv_capacity and (num_waiting or num_swapped) and end_alloc > self.kv_capacity - self.kv_unit:
            blocked_s = float(np.add.reduce(durations[allocated > self.kv_capacity - self.kv_unit]))
        n = self._num_rows
        self._span_sums.append((
            n, float(np.dot(allocated, durations)), float(np.dot(internal, durations)), blocked_s,
        ))
        if n == self._room:
            self._rows.extend(_ROOM)
            self._room += _ROOM_ROWS
        kernels_ms, coll_ms, host_ms = costs_ms
        _pack_row(  # np.add.reduce: ndarray.sum's own reduction, without its Python wrapper
            self._rows, n * _ROW_BYTES,
            start, float(np.add.reduce(durations)), len(durations), plan.num_scheduled, 0, plan.num_decode_seqs,
            num_running, num_waiting, num_swapped, 0, 0, end_alloc, end_alloc - end_internal, 0,
            end_internal, 0, 0, end_alloc, kernels_ms, coll_ms, host_ms,
        )
        self._num_rows = n = n + 1
        if n == _STEP_CHUNK:
            self._seal()

    def record_rows(self, rows: np.ndarray, spans: np.ndarray) -> None:
        """Many rows at once (a compiled engine core's steps): `rows` (n, 21) float64 in `_COLUMNS`
        order; `spans` (n, 4): for a row that covers several decode steps, 1 and its KV-allocated
        slot-seconds, internal slot-seconds and KV-blocked seconds summed over its steps (what
        `record_span` keeps), else 0 in the first column."""
        start, count = 0, len(rows)
        while start < count:
            n = self._num_rows
            end = min(count, start + _STEP_CHUNK - n)
            if n + end - start > self._room:
                grow = -(-(n + end - start - self._room) // _ROOM_ROWS) * _ROOM_ROWS
                self._rows.extend(bytes(grow * _ROW_BYTES))
                self._room += grow
            block = np.ascontiguousarray(rows[start:end], dtype=np.float64)
            self._rows[n * _ROW_BYTES:(n + end - start) * _ROW_BYTES] = block.tobytes()
            index = np.flatnonzero(spans[start:end, 0])
            if len(index):
                self._span_sums.extend(zip((index + n).tolist(), *spans[start + index, 1:].T.tolist(), strict=True))
            self._num_rows = n + end - start
            if self._num_rows == _STEP_CHUNK:
                self._seal()
            start = end

    def load_folded(self, rows: np.ndarray, totals: StepTotals, halvings: int, coalesced: bool,
                    streaming: bool) -> None:
        """Take the state of a fresh recorder's run that was folded elsewhere (the compiled core
        does `record_rows`, `_fold`, `_seal` and `_coalesce_pairs` on its rows in C, to the
        same floats): the kept rows (n, 21) in `_COLUMNS` order, at their grain, and the totals."""
        assert not self._num_rows and not self._kept and self.spill is None, "a fresh recorder, nothing spilled"
        if len(rows):
            rows = np.ascontiguousarray(rows, dtype=np.float64)
            self._kept = [{name: rows[:, i].copy() for i, name in enumerate(_COLUMNS)}]
        self._num_kept = len(rows)
        self._totals, self._halvings, self.coalesced, self.streaming = totals, halvings, coalesced, streaming

    def _fold(self) -> None:
        """Add the pending rows not yet in `_totals` to it: what `record` / `record_span` once
        summed on every call, in the same order (so the same floats)."""
        n = self._num_rows
        if n <= self._num_folded:
            return
        # a copy: no view may outlive this call, or the buffer could not grow again
        rows = np.frombuffer(self._rows, dtype=np.float64, count=n * _WIDTH).reshape(n, _WIDTH)[self._num_folded:].copy()
        first, self._num_folded = self._num_folded, n
        t = self._totals
        col = dict(zip(_COLUMNS, rows.T, strict=True))
        dt = col["duration_s"]
        steps = col["num_steps"].astype(np.int64)
        t.num_steps += int(steps.sum())
        t.seq_steps += int((col["num_seqs"].astype(np.int64) * steps).sum())
        t.max_running = max(t.max_running, int(col["num_running"].max()))
        t.kv_allocated_max = max(t.kv_allocated_max, int(col["kv_allocated"].max()))  # spans: at their end
        t.num_preempted += int(col["num_preempted"].astype(np.int64).sum())
        # one addend per row and sum (a step's kv x dt; a span's sums over its own steps)
        addends = np.empty((len(rows), 3 + len(KV_KINDS)))
        addends[:, 0] = dt
        addends[:, 1] = col["num_running"] * dt
        if self.kv_capacity:
            blocked = ((col["num_waiting"] > 0) | (col["num_swapped"] > 0)) & (
                (col["num_preempted"] > 0) | (self.kv_capacity - col["kv_allocated"] - col["kv_external"] < self.kv_unit))
            addends[:, 2] = np.where(blocked, dt, 0.0)  # adding 0.0 leaves a sum of durations as it was
        else:
            addends[:, 2] = 0.0
        for j, kind in enumerate(KV_KINDS, start=3):
            addends[:, j] = col[f"kv_{kind}"] * dt
        if self._span_sums:
            index, alloc_s, internal_s, blocked_s = (np.array(v) for v in zip(*self._span_sums, strict=True))
            self._span_sums.clear()
            index = index.astype(np.int64) - first
            addends[index, 2] = blocked_s
            addends[index, 3 + _KV_ALLOCATED] = alloc_s
            addends[index, 3 + _KV_LIVE] = alloc_s - internal_s
            addends[index, 3 + _KV_INTERNAL] = internal_s
            addends[index, 3 + _KV_UNSHARED] = alloc_s
        kv = t.kv_slot_s
        sums = _add_in_order([t.duration_s, t.running_s, t.kv_blocked_s, *(kv[kind] for kind in KV_KINDS)], addends)
        t.duration_s, t.running_s, t.kv_blocked_s = sums[:3]
        for kind, value in zip(KV_KINDS, sums[3:], strict=True):
            kv[kind] = value

    # -- the kept table ----------------------------------------------------------------------
    def _seal(self) -> None:
        """Pending rows become a numpy chunk; past the cap they are spilled and the kept table is
        coalesced."""
        self._fold()
        rows = np.frombuffer(self._rows, dtype=np.float64, count=self._num_rows * _WIDTH).reshape(-1, _WIDTH)
        # one array per column, each its own copy: a kept view of one column must not hold the others
        chunk = {name: rows[:, i].copy() for i, name in enumerate(_COLUMNS)}
        del rows
        self._num_rows = self._num_folded = 0  # the buffer's room is reused
        if not len(chunk["start_s"]):
            return
        if self.streaming and self.spill is not None:
            self.spill(self.table_columns(chunk))
        for _ in range(self._halvings):  # new rows at the grain of the kept ones
            chunk = _coalesce_pairs(chunk)
        self._kept.append(chunk)
        self._num_kept += len(chunk["start_s"])
        if self._num_kept <= self.cap:
            return
        if not self.streaming:
            self.streaming = True
            if self.spill is not None:  # the full-resolution rows so far, before any coalescing
                for kept in self._kept:
                    self.spill(self.table_columns(kept))
        kept, self._kept = self._kept, []
        merged = {name: np.concatenate([c.pop(name) for c in kept]) for name in _COLUMNS}  # a column at a time
        del kept
        while len(merged["start_s"]) > self.cap // 2 and len(merged["start_s"]) > 1:
            merged = _coalesce_pairs(merged)
            self._halvings += 1
        self._kept, self._num_kept, self.coalesced = [merged], len(merged["start_s"]), True

    def finalize(self) -> None:
        """Seal the last rows (the end of the run): spilled too when streaming."""
        self._seal()

    @staticmethod
    def table_columns(chunk: dict[str, np.ndarray], coalesced: bool = False) -> dict[str, np.ndarray]:
        """A chunk's columns as the table has them: times and costs float, counts int (the
        weighted means of coalesced rows stay float)."""
        return {name: values if name.endswith(("_s", "_ms")) or (coalesced and name != "num_steps")
                else values.astype(np.int64) for name, values in chunk.items()}

    def columns_kept(self) -> dict[str, np.ndarray]:
        """The kept rows (every row while under the cap) as the table's numpy columns."""
        self.finalize()
        if not self._kept:
            return {name: np.zeros(0, dtype=np.float64 if name.endswith(("_s", "_ms")) else np.int64)
                    for name in _COLUMNS}
        if len(self._kept) > 1:  # one chunk from now on
            self._kept = [{name: np.concatenate([c[name] for c in self._kept]) for name in _COLUMNS}]
        return self.table_columns(self._kept[0], self.coalesced)

    def frame(self) -> pd.DataFrame:
        """The kept rows as a DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.columns_kept(), copy=False)  # one block per dtype


def _coalesce_pairs(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows 2i and 2i+1 become one (an odd last row stays): start of the first, durations,
    steps and costs summed, per-step counts weighted by num_steps, KV by duration; so the
    step-weighted and time-weighted sums (`StepTotals.from_frame`) are unchanged."""
    n = len(rows["start_s"])
    even = n - n % 2
    a = {name: col[0:even:2] for name, col in rows.items()}
    b = {name: col[1:even:2] for name, col in rows.items()}
    steps = a["num_steps"] + b["num_steps"]
    dt = a["duration_s"] + b["duration_s"]
    out = {"start_s": a["start_s"], "duration_s": dt, "num_steps": steps}
    for name in _PER_STEP:
        out[name] = (a[name] * a["num_steps"] + b[name] * b["num_steps"]) / steps
    with np.errstate(invalid="ignore", divide="ignore"):
        for kind in KV_KINDS:
            name = f"kv_{kind}"
            mean = (a[name] * a["duration_s"] + b[name] * b["duration_s"]) / dt
            out[name] = np.where(dt > 0, mean, 0.5 * (a[name] + b[name]))
    for name in COST_COLUMNS:
        out[name] = a[name] + b[name]
    out = {name: out[name] for name in rows}  # the table's column order
    if n % 2:
        out = {name: np.append(col, rows[name][-1]) for name, col in out.items()}
    return out


def _stats(prefix: str, values_s: np.ndarray | Samples, out: dict[str, Any]) -> None:
    if isinstance(values_s, Samples):
        values_s.stats(prefix, out)
        return
    v = values_s[~np.isnan(values_s)] * 1000.0 if len(values_s) else values_s
    out[f"mean_{prefix}_ms"] = float(np.mean(v)) if len(v) else None
    median, pcts = quantiles.median_percentiles(v, (95, 99)) if len(v) else (None, (None, None))
    out[f"median_{prefix}_ms"] = median  # np.median's bits, no numpy.ma
    for p, value in zip((95, 99), pcts, strict=True):
        out[f"p{p}_{prefix}_ms"] = value


def kv_waste(totals: StepTotals) -> dict[str, Any]:
    """Time-weighted KV memory breakdown (DESIGN.md): shares of allocated slot-seconds."""
    kv = totals.kv_slot_s
    allocated = kv["allocated"]
    out: dict[str, Any] = {"kv_waste_rate": None}
    if allocated <= 0:
        return out
    out["kv_waste_rate"] = (allocated - kv["live"]) / allocated
    for col in ("live", "reserved_future", "internal", "stale", "external"):
        out[f"kv_{col}_share"] = kv[col] / allocated
    out["kv_mean_allocated_tokens"] = allocated / totals.duration_s
    unshared = kv["unshared"]
    out["kv_sharing_saved"] = 1.0 - allocated / unshared if unshared > allocated else 0.0
    return out


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, itl_s: np.ndarray | Samples,
              totals: StepTotals | None = None) -> dict[str, Any]:
    """The run's summary from its tables; step figures from `totals` (the recorder's exact sums
    over every step), or from the step table when none are given."""
    if totals is None:
        totals = StepTotals.from_frame(steps)
        totals.max_running = int(steps["num_running"].max()) if len(steps) else 0
    status = requests["status"].to_numpy()
    cols = {name: requests[name].to_numpy() for name in _SUMMARY_COLUMNS}
    return summarize_columns(status == "finished", status == "rejected", cols, itl_s, totals)


_SUMMARY_COLUMNS = ("arrival_s", "first_scheduled_s", "finish_s", "num_prompt_tokens", "num_output_tokens",
                    "num_preemptions", "ttft_s", "tpot_s", "e2el_s")


def summarize_records(records: RequestRecords, itl: Samples, totals: StepTotals) -> dict[str, Any]:
    """The run's summary straight from the request records: from every row while they are kept
    (the same numbers as `summarize` of the table), else from their running sums."""
    if not records.kept:
        return _summarize_bounded(records, itl, totals)
    raw = records.columns()
    ttft, e2el, tpot = derived_latencies(raw)
    cols = {
        "arrival_s": raw["arrival_s"], "first_scheduled_s": raw["first_scheduled_s"],
        "finish_s": raw["finish_s"], "num_prompt_tokens": raw["num_prompt_tokens"].astype(np.int64),
        "num_output_tokens": raw["num_positions"].astype(np.int64) * raw["n"],
        "num_preemptions": raw["num_preemptions"].astype(np.int64), "ttft_s": ttft, "tpot_s": tpot, "e2el_s": e2el,
    }
    return summarize_columns(raw["status"] == FINISHED, raw["status"] == REJECTED, cols, itl, totals)


def summarize_columns(finished: np.ndarray, rejected: np.ndarray, cols: dict[str, np.ndarray],
                      itl_s: np.ndarray | Samples, totals: StepTotals) -> dict[str, Any]:
    """The summary from per-request columns (`_SUMMARY_COLUMNS`) and the step totals."""
    num_done = int(finished.sum())
    out: dict[str, Any] = {
        "num_requests": int(len(finished)),
        "completed": num_done,
        "rejected": int(rejected.sum()),
    }
    makespan = float(cols["finish_s"][finished].max() - cols["arrival_s"].min()) if num_done else 0.0
    total_in = int(cols["num_prompt_tokens"][finished].sum())
    total_out = int(cols["num_output_tokens"][finished].sum())
    _totals(out, makespan, num_done, total_in, total_out)
    _stats("ttft", cols["ttft_s"][finished], out)
    _stats("tpot", cols["tpot_s"][finished], out)
    _stats("itl", itl_s, out)
    _stats("e2el", cols["e2el_s"][finished], out)
    out["num_preemptions"] = int(cols["num_preemptions"].sum())
    _step_figures(out, totals)
    out.update(saturation_columns(cols["arrival_s"], cols["first_scheduled_s"], cols["finish_s"], finished,
                                  _median_s(out)))
    return out


def _totals(out: dict[str, Any], makespan: float, num_done: int, total_in: int, total_out: int) -> None:
    out["duration_s"] = makespan
    out["total_input_tokens"] = total_in
    out["total_output_tokens"] = total_out
    rate = (lambda x: x / makespan) if makespan > 0 else (lambda x: None)
    out["request_throughput"] = rate(num_done)
    out["output_throughput"] = rate(total_out)
    out["total_token_throughput"] = rate(total_in + total_out)


def _step_figures(out: dict[str, Any], totals: StepTotals) -> None:
    out["num_steps"] = totals.num_steps
    out["mean_batch_size"] = totals.seq_steps / totals.num_steps if totals.num_steps else 0.0
    out["max_running"] = totals.max_running
    out.update(kv_waste(totals))


def _summarize_bounded(records: RequestRecords, itl: Samples, totals: StepTotals) -> dict[str, Any]:
    """The summary of a run whose rows were not all kept: counts and token totals exact, latency
    percentiles from histograms (relative error <= 2**-15), saturation by blocks of arrivals."""
    b = records.bounded
    out: dict[str, Any] = {"num_requests": records.num_left, "completed": b.completed, "rejected": b.rejected}
    makespan = b.max_finish_s - b.min_arrival_s if b.completed else 0.0
    _totals(out, float(makespan), b.completed, b.total_input_tokens, b.total_output_tokens)
    for name, samples in (("ttft", b.ttft), ("tpot", b.tpot), ("itl", itl), ("e2el", b.e2el)):
        samples.stats(name, out)
    out["num_preemptions"] = b.num_preemptions
    _step_figures(out, totals)
    out.update(_saturation_bounded(records, _median_s(out)))
    return out


def _median_s(out: dict[str, Any]) -> float | None:
    """The run's median end-to-end latency in seconds (None: nothing finished)."""
    ms = out.get("median_e2el_ms")
    return None if ms is None else ms / 1000.0


# -- statistics at any percentile (`vllm bench serve --metric-percentiles`) -----------------


def p_word(p: float) -> str:
    """vLLM's spelling of a percentile in keys and labels: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def per_request_rows(result: Any) -> dict[str, np.ndarray] | None:
    """Every request's raw columns and derived latencies (None past the rows kept in memory)."""
    if not result.records.kept:
        return None
    cols = result.records.columns()
    ttft, e2el, tpot = derived_latencies(cols)
    return {**cols, "ttft_s": ttft, "e2el_s": e2el, "tpot_s": tpot, "done": cols["status"] == FINISHED}


def metric_stats(result: Any, qs: tuple[float, ...], metrics: tuple[str, ...]) -> dict[str, Any]:
    """mean / median / std / p{q} in ms of each metric (vLLM's keys, `p{P}_{metric}_ms`, P as
    vllm/benchmarks/serve.py prints it); std None where the values were binned (past the memory
    caps). Used by `vllm bench serve`'s result (cli.bench_result) and by SLOs at any percentile
    (reports.capacity)."""
    out: dict[str, Any] = {}
    rows = per_request_rows(result)
    for metric in metrics:
        keys = [f"mean_{metric}_ms", f"median_{metric}_ms", f"std_{metric}_ms", *(f"p{p_word(q)}_{metric}_ms" for q in qs)]
        samples = result.itl if metric == "itl" else (None if rows is not None else getattr(result.records.bounded, metric))
        if samples is not None and (metric != "itl" or not samples.exact):
            if not len(samples):
                out.update(dict.fromkeys(keys, None))
                continue
            stats: dict[str, Any] = {}
            samples.stats(metric, stats)
            values = [stats[f"mean_{metric}_ms"], *(v * 1000.0 for v in samples.percentiles((50.0, *qs)))]
            out.update(zip(keys, [values[0], values[1], None, *values[2:]], strict=True))
            continue
        if metric == "itl":
            v = samples.values() * 1000.0
        else:
            v = rows[f"{metric}_s"][rows["done"]]
            v = v[~np.isnan(v)] * 1000.0
        if not len(v):
            out.update(dict.fromkeys(keys, None))
            continue
        out.update(zip(keys, [float(np.mean(v)), quantiles.median(v), float(np.std(v)),
                              *quantiles.percentiles(v, qs)], strict=True))
    return out


# -- goodput (`vllm bench serve --goodput`) ------------------------------------------------
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # the names vLLM's --goodput accepts


def goodput(requests: pd.DataFrame, slo_ms: dict[str, float], duration_s: float) -> dict[str, Any]:
    """Requests meeting every per-request SLO, as vLLM's `calculate_metrics` counts them
    (benchmarks/benchmark_serving.py): a finished request is good when each given metric is
    <= its SLO; TPOT of a one-token response counts as 0. `request_goodput` is good requests
    per second of the run; `goodput_share` is their share of every submitted request."""
    assert set(slo_ms) <= set(GOODPUT_METRICS)
    status = requests["status"].to_numpy()
    good = status == "finished"
    for name, limit_ms in slo_ms.items():
        values = requests[f"{name}_s"].to_numpy(dtype=np.float64)
        if name == "tpot":
            values = np.where(np.isnan(values), 0.0, values)
        with np.errstate(invalid="ignore"):
            good &= values * 1000.0 <= limit_ms
    num_good = int(good.sum())
    return {
        "goodput_slo_ms": dict(slo_ms),
        "good_requests": num_good,
        "request_goodput": num_good / duration_s if duration_s > 0 else None,
        "goodput_share": num_good / len(status) if len(status) else None,
    }


# -- saturation: was the offered load sustained? -------------------------------------------
WARMUP_SHARE = 0.2  # arrivals before this share of the run fill the engine; not judged
OVERLOAD_RATE_RATIO = 0.9  # completed / offered rate once warm below this ...
OVERLOAD_WAIT_SLOPE = 0.05  # ... and queueing delay growing faster than this (s per s): overloaded.
# An engine whose step limit is above what it serves (vLLM V1's 1024 sequences on an H100) admits
# every arrival and queues inside its batch: no request waits to be scheduled, the batch and each
# step's time grow instead. Its batch also grows while it fills up: t after the first arrival the
# count grows at rate x P(lifetime > t). Requests in the system still growing faster than
# FILL_GROWTH_SHARE x the offered rate past the median lifetime, while fewer than
# OVERLOAD_RATE_RATIO of the offered complete and without a queue, leave the run not judged ("still
# filling"): overload, or a slow approach to a large steady batch; only more requests tell. A
# steady engine's fill past its median lifetime grows at 0.1-0.2 x the rate on ShareGPT-like tails
# in runs of a few hundred requests (8B on one H100: 0.13 at 25 req/s and 300 requests, 0.16 for
# 70B TP 4 at 15 req/s and 1,000, both sustained on longer runs), so the share sits above that; an
# overload milder than ~1.3x the capacity (8B at 40 req/s: 0.16) is left to the queue, which
# shows once the step limit binds. (A later cut-off, e.g. the 95th percentile, hides overload
# itself: an overloaded run's lifetimes grow with it, and the window past them is empty.)
FILL_GROWTH_SHARE = 0.25
MIN_JUDGED_REQUESTS = 20  # fewer arrivals after warm-up than this: no verdict
# A "sustained" verdict needs a judged window that outlasts a typical request (median end-to-end
# latency): in a shorter one the requests are still in flight when arrivals stop, nothing had
# time to queue up or complete, and "sustained" would only say the run ended too soon. An
# "overloaded" verdict stands on its own evidence (a queue that grew while few completed).


def _too_short(window_s: float, median_e2el_s: float | None) -> bool:
    return median_e2el_s is not None and window_s < median_e2el_s


def saturation(requests: pd.DataFrame) -> dict[str, Any]:
    """Whether the engine kept up with the arrivals, from the per-request columns only.

    Once warm (after the first WARMUP_SHARE of arrivals, up to the last arrival), a sustained
    load completes requests as fast as they arrive and its queueing delay (arrival to first
    schedule) stays flat. An engine that serves mu req/s while lam > mu arrive falls behind:
    request i starts at ~i/mu, so its queueing delay grows as t * (lam/mu - 1) and the completed
    rate is mu = lam / (lam/mu). A run is `overloaded` when both show it (completed/offered below
    OVERLOAD_RATE_RATIO and a delay slope above OVERLOAD_WAIT_SLOPE, i.e. lam/mu > ~1.05-1.1);
    requiring both keeps a burst at the end of a stable run, or a slow drain of a long-latency
    backlog, from being called overload. An engine that admits every arrival shows no queueing
    delay: its backlog is the batch itself. While the requests in the system (arrived, not
    finished; `in_system_slope`, per second, judged from one median lifetime after the first
    arrival, before which a steady engine still fills up) grow faster than FILL_GROWTH_SHARE of the
    offered rate without a queue, the run is `n/a` with `still_filling` True: overload or a slow
    approach to a steady state, which only more requests can tell apart. All arrivals at one
    instant (offline batch), too few arrivals give `n/a`, and so does a run that did not show
    overload but whose judged window was shorter than its median request's end-to-end latency (a burst over before its requests could
    finish: nothing had time to queue up, so "sustained" would claim what was not seen). A rejected
    request leaves as it arrives: the offered rate and the requests in the system count the accepted
    ones, and a run that accepted none once warm is `n/a`."""
    return saturation_columns(
        requests["arrival_s"].to_numpy(dtype=np.float64), requests["first_scheduled_s"].to_numpy(dtype=np.float64),
        requests["finish_s"].to_numpy(dtype=np.float64), requests["status"].to_numpy() == "finished",
    )


def saturation_columns(arrival_s: np.ndarray, first_scheduled_s: np.ndarray, finish_s: np.ndarray,
                       finished: np.ndarray, median_e2el_s: float | None = None) -> dict[str, Any]:
    """`saturation` from the columns it reads (rows in request-id order); `median_e2el_s`: the
    run's median end-to-end latency (None: computed from the columns)."""
    arrival = arrival_s
    out: dict[str, Any] = {"saturation": "n/a", "offered_rate": None, "completed_rate_warm": None,
                           "queue_wait_slope": None, "in_system_slope": None, "still_filling": False,
                           "capacity_exceeded": False}
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    first = int(len(arrival) * WARMUP_SHARE)
    if len(arrival) - first < MIN_JUDGED_REQUESTS:
        return out
    start, end = float(arrival[first]), float(arrival[-1])
    if median_e2el_s is None and finished.any():
        median_e2el_s = quantiles.median(finish_s[finished] - arrival_s[finished])
    if end <= start:
        return out
    window = end - start
    finish = finish_s
    # the load the engine took: a rejected request (a prompt past max_model_len, ...) leaves as it
    # arrives, so it is neither offered work nor a request still in the system (counted there, a
    # third of a trace rejected read as a fill growing at a third of the rate: `n/a` at any rate)
    accepted = finished[order]
    offered = (int(accepted[first:].sum()) - 1) / window
    if offered <= 0:  # nothing accepted once warm: no verdict
        return out
    with np.errstate(invalid="ignore"):
        completed = int((finished & (finish > start) & (finish <= end)).sum()) / window
    wait = (first_scheduled_s - arrival_s)[order][first:]
    t = arrival[first:]
    known = first_scheduled_s[order][first:] >= 0  # never scheduled (rejected): no queueing delay
    slope = float(np.polyfit(t[known], wait[known], 1)[0]) if known.sum() >= 2 and np.ptp(t[known]) > 0 else 0.0
    finished_at = np.sort(finish[finished])
    accepted_before = np.cumsum(accepted) - accepted  # accepted arrivals before each arrival
    in_system = accepted_before[first:] - np.searchsorted(finished_at, t, side="right")
    n_slope = _in_system_slope(t, in_system.astype(np.float64), float(arrival[0]), median_e2el_s)
    return _verdict(out, offered, completed, slope, n_slope, window, median_e2el_s)


def _verdict(out: dict[str, Any], offered: float, completed: float, slope: float, n_slope: float,
             window: float, median_e2el_s: float | None) -> dict[str, Any]:
    """`overloaded`, `sustained` or `n/a` (see `saturation`), with the measures it stands on."""
    overloaded = completed < OVERLOAD_RATE_RATIO * offered and slope > OVERLOAD_WAIT_SLOPE
    filling = (not overloaded and completed < OVERLOAD_RATE_RATIO * offered
               and n_slope > FILL_GROWTH_SHARE * offered)
    if not overloaded and not filling and _too_short(window, median_e2el_s):
        return out
    out.update({
        "saturation": "n/a" if filling else "overloaded" if overloaded else "sustained",
        "offered_rate": offered, "completed_rate_warm": completed, "queue_wait_slope": slope,
        "in_system_slope": n_slope, "still_filling": filling,
    })
    return out


# A run offered more than the engine's full-batch capacity (simcore.full_batch: the step model's
# steady state at its fullest batch) cannot keep up however long it runs. CAPACITY_MARGIN allows
# for that steady state's approximations: on 8B / 70B runs on H100 / A100, V0 and V1 schedulers,
# DP 2, the capacity was 0.99-1.11x the completed rate of the same deployment run 1.3-2x over it
# (benchmarks/README.md, "Full-batch capacity"); CAPACITY_LAG the share of the offered rate a run
# must fall behind by as well, so a wrong capacity cannot overturn a run that kept up.
CAPACITY_MARGIN = 0.03
CAPACITY_LAG = 0.97


def judge_capacity(summary: dict[str, Any], capacity_rate: float) -> None:
    """Call a judged run `overloaded` (in place; `capacity_exceeded` True) when its warm offered
    rate is above `capacity_rate` x (1 + CAPACITY_MARGIN) and it completed under CAPACITY_LAG of
    it: a mild overload inside a large batch that the queue and the fill test leave `sustained`
    or `n/a` (still filling). Runs not judged for other reasons (too short, too few) stay n/a."""
    offered, completed = summary.get("offered_rate"), summary.get("completed_rate_warm")
    judged = summary.get("saturation") == "sustained" or summary.get("still_filling")
    summary["capacity_exceeded"] = bool(
        judged and offered is not None and completed is not None
        and offered > capacity_rate * (1.0 + CAPACITY_MARGIN) and completed < CAPACITY_LAG * offered)
    if summary["capacity_exceeded"]:
        summary["saturation"], summary["still_filling"] = "overloaded", False


def _in_system_slope(t: np.ndarray, count: np.ndarray, first_arrival_s: float, median_e2el_s: float | None) -> float:
    """Least-squares growth (per s) of the requests in the system, sampled at arrival times `t`,
    over those at least one median lifetime after the first arrival (most of a steady engine's fill
    is over); 0 (no evidence: the queue alone judges) with fewer than two."""
    if median_e2el_s is None:
        return 0.0
    keep = t >= first_arrival_s + median_e2el_s
    if keep.sum() < 2 or np.ptp(t[keep]) <= 0:
        return 0.0
    return float(np.polyfit(t[keep], count[keep], 1)[0])


def _saturation_bounded(records: RequestRecords, median_e2el_s: float | None) -> dict[str, Any]:
    """`saturation` from block sums (rows not kept): the warm window starts at the first block
    of SATURATION_BLOCK arrivals at or after the warm-up share; requests never scheduled
    (rejected) are left out of the delay line."""
    b = records.bounded
    out: dict[str, Any] = {"saturation": "n/a", "offered_rate": None, "completed_rate_warm": None,
                           "queue_wait_slope": None, "in_system_slope": None, "still_filling": False,
                           "capacity_exceeded": False}
    starts = np.frombuffer(records._block_start, dtype=np.float64)
    n = records.num_left
    first_block = -(-int(n * WARMUP_SHARE) // SATURATION_BLOCK)
    first = first_block * SATURATION_BLOCK
    if n - first < MIN_JUDGED_REQUESTS or first_block >= len(starts):
        return out
    start, end = float(starts[first_block]), float(records._last_arrival)
    if end <= start:
        return out
    window = end - start
    cnt, st, sw, stt, stw = b.blocks[first_block:].sum(axis=0)
    offered = float(cnt - 1) / window  # the accepted arrivals (scheduled ones: a rejected request leaves at once)
    if offered <= 0:
        return out
    completed = (b.finish.count_le(end) - b.finish.count_le(start)) / window
    denom = cnt * stt - st * st
    slope = float((cnt * stw - st * sw) / denom) if cnt >= 2 and denom > 0 else 0.0
    # requests in the system at each block's first arrival: the accepted arrivals before it less the finishes
    block_t = starts[first_block:]
    accepted = np.zeros(len(starts))
    accepted[:min(len(starts), len(b.blocks))] = b.blocks[:len(starts), 0]
    accepted_before = (np.cumsum(accepted) - accepted)[first_block:]
    in_system = accepted_before - b.finish.count_le_many(block_t)
    n_slope = _in_system_slope(block_t, in_system.astype(np.float64), float(starts[0]), median_e2el_s)
    return _verdict(out, offered, completed, slope, n_slope, window, median_e2el_s)
