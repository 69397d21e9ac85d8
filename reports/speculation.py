"""Speculative decoding against the same run without it: speed-ups by metric (`kvsim run
--speculative-config ... --compare-no-spec`, benchmarks/spec_load_sweep.py)."""

from __future__ import annotations

from typing import Any

# (summary key, what a ratio > 1 means): latencies compare baseline / speculative, throughput
# speculative / baseline, so every ratio above 1 says speculation helped
LATENCY_KEYS = ("mean_tpot_ms", "median_tpot_ms", "p95_tpot_ms", "mean_itl_ms", "median_itl_ms",
                "mean_ttft_ms", "median_e2el_ms", "p95_e2el_ms")
THROUGHPUT_KEYS = ("output_throughput", "request_throughput")


def _ratio(num: Any, den: Any) -> float | None:
    if num is None or den is None or not den:
        return None
    return float(num) / float(den)


def speedup_vs(spec: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Speed-ups of a speculative run over its baseline (> 1: speculation is faster), and the
    baseline's own figures, so a report can show both."""
    out: dict[str, Any] = {}
    for key in LATENCY_KEYS:
        out[f"speedup_{key}"] = _ratio(base.get(key), spec.get(key))
    for key in THROUGHPUT_KEYS:
        out[f"speedup_{key}"] = _ratio(spec.get(key), base.get(key))
    out["baseline"] = {key: base.get(key) for key in (*LATENCY_KEYS, *THROUGHPUT_KEYS, "saturation")}
    return out
