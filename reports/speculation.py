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


def crossing_rate(rows: list[dict[str, Any]], key: str = "speedup_mean_tpot_ms") -> float | None:
    """The rate at which a speed-up falls through 1, interpolated linearly between the two
    measured rates around it (None: it never does in `rows`, sorted by rate)."""
    for lo, hi in zip(rows, rows[1:], strict=False):
        a, b = lo.get(key), hi.get(key)
        if a is not None and b is not None and a >= 1.0 > b:
            return lo["rate"] + (a - 1.0) / (a - b) * (hi["rate"] - lo["rate"])
    return None


def load_sweep(model, gpu, config, workload_name: str, rates: list[float], num_requests: int, profile,
               seed: int = 0, draft_profile=None, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per rate: the run with `config` (which has a speculative config) and the same
    requests without it, their TPOT / ITL / throughput and the speed-ups."""
    from dataclasses import replace

    from kvsim.simcore.simulate import simulate
    from kvsim.workloads import load_workload

    plain = replace(config, speculative_config=None)
    rows = []
    for rate in rates:
        wl = load_workload(workload_name, {**(overrides or {}), "num_requests": num_requests, "rate": rate})
        spec = simulate(model, gpu, config, wl, profile, seed=seed, draft_profile=draft_profile).summary
        base = simulate(model, gpu, plain, wl, profile, seed=seed).summary
        rows.append({
            "rate": rate, "saturation": base.get("saturation"), "saturation_spec": spec.get("saturation"),
            "tpot_ms": base.get("mean_tpot_ms"), "tpot_spec_ms": spec.get("mean_tpot_ms"),
            "itl_spec_ms": spec.get("mean_itl_ms"), "ttft_ms": base.get("median_ttft_ms"),
            "ttft_spec_ms": spec.get("median_ttft_ms"),
            "acceptance_length": spec.get("spec_mean_acceptance_length"),
            "draft_share": spec.get("spec_draft_time_share"),
            **{k: v for k, v in speedup_vs(spec, base).items() if k != "baseline"},
        })
    return rows
