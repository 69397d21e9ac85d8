"""A grid of engine configurations, one simulation per point, one table row per point.

Every point runs with the same seed, so every point sees identical traffic (the same arrival
times and lengths): differences between rows are the configuration's, not the draw's. A point
whose model does not fit (DoesNotFitError) becomes a row saying so; any other bad value is a
ConfigError raised before anything runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from reports.regime import regime_of
from simcore.errors import ConfigError, DoesNotFitError
from simcore.specs import EngineConfig, GPUSpec, ModelSpec

# EngineConfig field -> (flag, column name) of the options a sweep accepts as lists
SWEEPABLE = {
    "block_size": ("--block-size", "block_size"),
    "gpu_memory_utilization": ("--gpu-memory-utilization", "gpu_mem_util"),
    "max_num_seqs": ("--max-num-seqs", "max_num_seqs"),
    "tensor_parallel_size": ("--tp", "tp"),
    "data_parallel_size": ("--dp", "dp"),
    "policy": ("--policy", "policy"),
}
METRIC_COLUMNS = (
    "gpus", "kv_cache_tokens", "output_tok_s", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms",
    "kv_waste", "preemptions", "load", "regime",
)


def parse_list(flag: str, text: str, kind: type) -> list:
    """'8,16,32' -> [8, 16, 32]; a malformed or repeated value is a ConfigError naming the flag."""
    values = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = kind(item)
        except ValueError:
            what = {int: "an integer", float: "a number", str: "a value"}[kind]
            raise ConfigError(f"{flag}: {item!r} is not {what} (in {text!r})") from None
        if kind is str and not value:
            raise ConfigError(f"{flag}: empty value in {text!r}")
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{flag}: {item!r} is not a finite number")
        if value in values:
            raise ConfigError(f"{flag}: {item!r} is listed twice (in {text!r})")
        values.append(value)
    return values


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One configuration of the grid; `does_not_fit` is the reason it cannot run ("" if it can)."""

    values: dict[str, Any]  # EngineConfig field -> value, for the swept fields
    config: EngineConfig
    does_not_fit: str = ""


def expand_grid(lists: dict[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the listed values, the first field varying slowest."""
    names = list(lists)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(lists[n] for n in names))]


def check_config(model: ModelSpec, config: EngineConfig) -> None:
    """What simulate() would refuse for a point, checked before the sweep starts."""
    mml = config.resolved_max_model_len(model)
    if not config.enable_chunked_prefill and config.resolved_max_num_batched_tokens(model) < mml:
        raise ConfigError(
            f"--max-num-batched-tokens ({config.max_num_batched_tokens}) is smaller than "
            f"max_model_len ({mml}) with chunked prefill off; enable chunked prefill or raise it"
        )


def plan_points(model: ModelSpec, gpu: GPUSpec, base: EngineConfig, lists: dict[str, Sequence[Any]]) -> list[SweepPoint]:
    """Build and validate every point; ConfigError for a bad value, a marked row for a misfit."""
    from simcore.memory import plan_memory

    points = []
    for values in expand_grid(lists):
        config = replace(base, **values)  # re-runs EngineConfig validation
        check_config(model, config)
        try:
            plan_memory(model, gpu, config)
            reason = ""
        except DoesNotFitError as exc:
            reason = str(exc)
        points.append(SweepPoint(values, config, reason))
    return points


def _metrics(result) -> dict[str, Any]:
    s, config = result.summary, result.record["config"]
    return {
        "gpus": config["tensor_parallel_size"] * config["data_parallel_size"],
        "kv_cache_tokens": result.memory.num_gpu_tokens, "output_tok_s": s["output_throughput"],
        "ttft_p50_ms": s["median_ttft_ms"], "ttft_p95_ms": s["p95_ttft_ms"],
        "tpot_p50_ms": s["median_tpot_ms"], "tpot_p95_ms": s["p95_tpot_ms"],
        "kv_waste": s["kv_waste_rate"], "preemptions": s["num_preemptions"],
        "load": s["saturation"],  # sustained | overloaded | n/a (simcore.metrics.saturation)
        "regime": regime_of(result).label,
    }


def run_sweep(
    model: ModelSpec, gpu: GPUSpec, points: list[SweepPoint], workload, profile_for: Callable[[int], Any],
    seed: int, progress: Callable[[int], None] | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """Simulate every point that fits with the same seed; one row per point, in grid order."""
    from simcore.simulate import simulate

    rows, warnings = [], []
    for i, point in enumerate(points):
        row = {SWEEPABLE[k][1]: v for k, v in point.values.items()}
        if point.does_not_fit:
            row.update({c: None for c in METRIC_COLUMNS})
            row["regime"] = f"does not fit: {point.does_not_fit}"
        else:
            profile = profile_for(point.config.tensor_parallel_size)
            result = simulate(model, gpu, point.config, workload, profile, seed=seed)
            row.update(_metrics(result))
            label = ", ".join(f"{SWEEPABLE[k][1]}={v}" for k, v in point.values.items())
            warnings += [f"[{label}] {w}" for w in result.warnings]
        rows.append(row)
        if progress is not None:
            progress(i + 1)
    frame = pd.DataFrame(rows)
    return frame.astype({"gpus": "Int64", "kv_cache_tokens": "Int64", "preemptions": "Int64"}), warnings


def add_slo(frame: pd.DataFrame, ttft_p95_ms: float | None, tpot_p95_ms: float | None) -> pd.DataFrame:
    """A `meets_slo` column before `regime`: every given p95 target met (a point that did not run
    never meets it)."""
    ok = frame["output_tok_s"].notna()
    if "load" in frame.columns:  # an overloaded point's percentiles only grow with a longer run
        ok &= frame["load"].ne("overloaded")
    for col, limit in (("ttft_p95_ms", ttft_p95_ms), ("tpot_p95_ms", tpot_p95_ms)):
        if limit is not None:
            ok &= frame[col].astype(float).le(limit).fillna(False)
    frame = frame.copy()
    frame.insert(frame.columns.get_loc("regime"), "meets_slo", ok.astype(bool))
    return frame


def cheapest_passing(frame: pd.DataFrame, gpus_of: Sequence[int]) -> int | None:
    """Index of the passing point with the fewest GPUs (TP x DP), then the highest throughput."""
    passing = [i for i in range(len(frame)) if bool(frame["meets_slo"].iloc[i])]
    if not passing:
        return None
    return min(passing, key=lambda i: (gpus_of[i], -float(frame["output_tok_s"].iloc[i]), i))
