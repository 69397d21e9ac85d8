"""Per-step records, per-request tables and the summary (names follow `vllm bench serve`)."""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from simcore.latency import StepLatencyModel
    from simcore.state import ReqState
    from simcore.step import MemorySnapshot, StepPlan

STEP_COLUMNS = (
    "start_s", "duration_s", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
    "num_running", "num_waiting", "num_swapped", "num_preempted", "num_swap_blocks",
    "kv_allocated", "kv_live", "kv_reserved_future", "kv_internal", "kv_stale", "kv_external",
    "kv_unshared",
)
# The step's cost by part (ms): GPU kernels, TP collectives, host/engine time (see simcore.latency);
# NaN when the recorder has no latency model. duration_s may add swap time on top of their sum.
COST_COLUMNS = ("kernels_ms", "collectives_ms", "host_ms")


class StepRecorder:
    """Column arrays, one value per step; cheap enough to call on every step. With a latency
    model it also records each step's cost breakdown (the model reuses the step it just priced)."""

    def __init__(self, latency: StepLatencyModel | None = None) -> None:
        self.columns = {name: array("d") for name in STEP_COLUMNS + COST_COLUMNS}
        self._appends = [self.columns[name].append for name in STEP_COLUMNS]
        self._cost_appends = [self.columns[name].append for name in COST_COLUMNS]
        self._breakdown = latency.step_breakdown_ms if latency is not None else None

    def record(
        self, start: float, dt: float, plan: StepPlan, mem: MemorySnapshot,
        num_running: int, num_waiting: int, num_swapped: int,
    ) -> None:
        values = (
            start, dt, len(plan.scheduled), plan.num_tokens - plan.num_decode_seqs,
            plan.num_decode_seqs, num_running, num_waiting, num_swapped, plan.num_preempted,
            plan.num_swap_blocks, mem.allocated, mem.live, mem.reserved_future, mem.internal,
            mem.stale, mem.external, mem.unshared or mem.allocated,
        )
        for append, value in zip(self._appends, values, strict=True):
            append(value)
        parts = (math.nan, math.nan, math.nan) if self._breakdown is None else self._breakdown(
            plan.num_tokens, plan.prefill_chunks, plan.num_decode_seqs, plan.decode_context_tokens,
            plan.num_sampled,
        )
        for append, value in zip(self._cost_appends, parts, strict=True):
            append(value)

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame({name: np.frombuffer(col, dtype=np.float64) if len(col) else np.zeros(0)
                           for name, col in self.columns.items()})
        int_cols = [c for c in STEP_COLUMNS if c not in ("start_s", "duration_s")]
        return df.astype({c: "int64" for c in int_cols})


def requests_frame(states: list[ReqState]) -> pd.DataFrame:
    rows = {
        "request_id": [s.request_id for s in states],
        "status": [s.status.name.lower() for s in states],
        "arrival_s": [s.request.arrival_s for s in states],
        "first_scheduled_s": [s.first_scheduled_s for s in states],
        "first_token_s": [s.first_token_s for s in states],
        "finish_s": [s.finish_s for s in states],
        "num_prompt_tokens": [s.num_prompt_tokens for s in states],
        "num_output_tokens": [s.num_generated * s.request.n for s in states],
        "num_positions": [s.num_generated for s in states],
        "max_tokens": [s.request.max_tokens for s in states],
        "n": [s.request.n for s in states],
        "beam_width": [s.request.beam_width for s in states],
        "num_preemptions": [s.num_preemptions for s in states],
        "reject_reason": [s.reject_reason for s in states],
    }
    df = pd.DataFrame(rows)
    done = df["status"] == "finished"
    nan = np.nan
    df["ttft_s"] = np.where(done, df["first_token_s"] - df["arrival_s"], nan)
    df["e2el_s"] = np.where(done, df["finish_s"] - df["arrival_s"], nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (df["e2el_s"] - df["ttft_s"]) / (df["num_positions"] - 1)
    df["tpot_s"] = np.where(done & (df["num_positions"] > 1), tpot, nan)
    return df


def _stats(prefix: str, values_s: np.ndarray, out: dict[str, Any]) -> None:
    v = values_s[~np.isnan(values_s)] * 1000.0 if len(values_s) else values_s
    for name, fn in (("mean", np.mean), ("median", np.median)):
        out[f"{name}_{prefix}_ms"] = float(fn(v)) if len(v) else None
    for p in (95, 99):
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(v, p)) if len(v) else None


def kv_waste(steps: pd.DataFrame) -> dict[str, Any]:
    """Time-weighted KV memory breakdown (DESIGN.md): shares of allocated slot-seconds."""
    dt = steps["duration_s"].to_numpy()
    allocated = float(np.dot(steps["kv_allocated"].to_numpy(), dt))
    out: dict[str, Any] = {"kv_waste_rate": None}
    if allocated <= 0:
        return out
    live = float(np.dot(steps["kv_live"].to_numpy(), dt))
    out["kv_waste_rate"] = (allocated - live) / allocated
    for col in ("live", "reserved_future", "internal", "stale"):
        out[f"kv_{col}_share"] = float(np.dot(steps[f"kv_{col}"].to_numpy(), dt)) / allocated
    out["kv_external_share"] = float(np.dot(steps["kv_external"].to_numpy(), dt)) / allocated
    out["kv_mean_allocated_tokens"] = allocated / float(dt.sum())
    unshared = float(np.dot(steps["kv_unshared"].to_numpy(), dt))
    out["kv_sharing_saved"] = 1.0 - allocated / unshared if unshared > allocated else 0.0
    return out


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, itl_s: np.ndarray) -> dict[str, Any]:
    done = requests[requests["status"] == "finished"]
    out: dict[str, Any] = {
        "num_requests": int(len(requests)),
        "completed": int(len(done)),
        "rejected": int((requests["status"] == "rejected").sum()),
    }
    if len(done):
        makespan = float(done["finish_s"].max() - requests["arrival_s"].min())
    else:
        makespan = 0.0
    out["duration_s"] = makespan
    total_in = int(done["num_prompt_tokens"].sum())
    total_out = int(done["num_output_tokens"].sum())
    out["total_input_tokens"] = total_in
    out["total_output_tokens"] = total_out
    rate = (lambda x: x / makespan) if makespan > 0 else (lambda x: None)
    out["request_throughput"] = rate(len(done))
    out["output_throughput"] = rate(total_out)
    out["total_token_throughput"] = rate(total_in + total_out)
    _stats("ttft", done["ttft_s"].to_numpy(), out)
    _stats("tpot", done["tpot_s"].to_numpy(), out)
    _stats("itl", itl_s, out)
    _stats("e2el", done["e2el_s"].to_numpy(), out)
    out["num_preemptions"] = int(requests["num_preemptions"].sum())
    out["num_steps"] = int(len(steps))
    out["mean_batch_size"] = float(steps["num_seqs"].mean()) if len(steps) else 0.0
    out["max_running"] = int(steps["num_running"].max()) if len(steps) else 0
    out.update(kv_waste(steps))
    out.update(saturation(requests))
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
OVERLOAD_WAIT_SLOPE = 0.05  # ... and queueing delay growing faster than this (s per s): overloaded
MIN_JUDGED_REQUESTS = 20  # fewer arrivals after warm-up than this: no verdict


def saturation(requests: pd.DataFrame) -> dict[str, Any]:
    """Whether the engine kept up with the arrivals, from the per-request columns only.

    Once warm (after the first WARMUP_SHARE of arrivals, up to the last arrival), a sustained
    load completes requests as fast as they arrive and its queueing delay (arrival to first
    schedule) stays flat. An engine that serves mu req/s while lam > mu arrive falls behind:
    request i starts at ~i/mu, so its queueing delay grows as t * (lam/mu - 1) and the completed
    rate is mu = lam / (lam/mu). A run is `overloaded` when both show it (completed/offered below
    OVERLOAD_RATE_RATIO and a delay slope above OVERLOAD_WAIT_SLOPE, i.e. lam/mu > ~1.05-1.1);
    requiring both keeps a burst at the end of a stable run, or a slow drain of a long-latency
    backlog, from being called overload. All arrivals at one instant (offline batch) or too few
    arrivals give `n/a`."""
    arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
    out: dict[str, Any] = {"saturation": "n/a", "offered_rate": None, "completed_rate_warm": None,
                           "queue_wait_slope": None}
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    first = int(len(arrival) * WARMUP_SHARE)
    if len(arrival) - first < MIN_JUDGED_REQUESTS:
        return out
    start, end = float(arrival[first]), float(arrival[-1])
    if end <= start:
        return out
    window = end - start
    finish = requests["finish_s"].to_numpy(dtype=np.float64)
    finished = requests["status"].to_numpy() == "finished"
    offered = (len(arrival) - 1 - first) / window
    with np.errstate(invalid="ignore"):
        completed = int((finished & (finish > start) & (finish <= end)).sum()) / window
    wait = (requests["first_scheduled_s"].to_numpy(dtype=np.float64) - requests["arrival_s"].to_numpy())[order][first:]
    t = arrival[first:]
    known = ~np.isnan(wait)
    slope = float(np.polyfit(t[known], wait[known], 1)[0]) if known.sum() >= 2 and np.ptp(t[known]) > 0 else 0.0
    overloaded = completed < OVERLOAD_RATE_RATIO * offered and slope > OVERLOAD_WAIT_SLOPE
    out.update({
        "saturation": "overloaded" if overloaded else "sustained",
        "offered_rate": offered, "completed_rate_warm": completed, "queue_wait_slope": slope,
    })
    return out
