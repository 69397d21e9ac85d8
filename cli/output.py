"""Printing a run like `vllm bench serve` does, and writing its files without partial output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _row(label: str, value: Any, fmt: str = ".2f") -> str:
    if value is None:
        return f"{label:<40} {'n/a':<10}"
    if isinstance(value, float):
        return f"{label:<40} {value:<10{fmt}}"
    return f"{label:<40} {value:<10}"


def _section(title: str) -> str:
    return f"{title:-^50}"


def format_summary(s: dict[str, Any], title: str = " Serving Benchmark Result ") -> str:
    lines = [f"{title:=^50}"]
    lines.append(_row("Successful requests:", s["completed"]))
    if s.get("rejected"):
        lines.append(_row("Rejected requests:", s["rejected"]))
    lines += [
        _row("Benchmark duration (s):", s["duration_s"]),
        _row("Total input tokens:", s["total_input_tokens"]),
        _row("Total generated tokens:", s["total_output_tokens"]),
        _row("Request throughput (req/s):", s["request_throughput"]),
    ]
    if s.get("goodput_slo_ms") is not None:
        lines.append(_row("Request goodput (req/s):", s.get("request_goodput")))
        share = s.get("goodput_share")
        lines.append(_row("Requests meeting every SLO (%):", None if share is None else 100 * share))
        lines.append(_row("Goodput SLOs (ms):", " ".join(f"{k}:{v:g}" for k, v in s["goodput_slo_ms"].items())))
    lines += [
        _row("Output token throughput (tok/s):", s["output_throughput"]),
        _row("Total Token throughput (tok/s):", s["total_token_throughput"]),
    ]
    for key, name, title_ in (
        ("ttft", "TTFT", "Time to First Token"),
        ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
        ("itl", "ITL", "Inter-token Latency"),
        ("e2el", "E2EL", "End-to-end Latency"),
    ):
        lines.append(_section(title_))
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p95", "P95"), ("p99", "P99")):
            lines.append(_row(f"{label} {name} (ms):", s.get(f"{stat}_{key}_ms")))
    lines.append(_section("Load"))
    lines.append(_row("Offered load:", _load_label(s)))
    for key, label in (("offered_rate", "Offered rate once warm (req/s):"),
                       ("completed_rate_warm", "Completed rate once warm (req/s):"),
                       ("queue_wait_slope", "Queueing delay growth (s per s):")):
        if s.get(key) is not None:
            lines.append(_row(label, s[key], ".3f" if key == "queue_wait_slope" else ".2f"))
    lines.append(_section("KV cache"))
    if "regime" in s:
        lines.append(_row("Regime:", s["regime"]))
        lines.append(_row("Peak KV cache use (%):", 100 * s["peak_kv_use"]))
    lines.append(_row("Preemptions:", s["num_preemptions"]))
    waste = s.get("kv_waste_rate")
    lines.append(_row("KV cache waste (%):", None if waste is None else 100 * waste))
    for key, label in (
        ("kv_reserved_future_share", "  reserved for future (%):"),
        ("kv_internal_share", "  over-reserved / internal frag. (%):"),
        ("kv_stale_share", "  stale, finished but held (%):"),
        ("kv_external_share", "  external fragmentation (%):"),
    ):
        if s.get(key):
            lines.append(_row(label, 100 * s[key]))
    if s.get("prefix_cache_hit_rate") is not None:
        lines.append(_row("Prefix cache hit rate (%):", 100 * s["prefix_cache_hit_rate"]))
    if s.get("kv_sharing_saved"):
        lines.append(_row("KV saved by block sharing (%):", 100 * s["kv_sharing_saved"]))
    lines.append("=" * 50)
    return "\n".join(lines)


def _load_label(s: dict[str, Any]) -> str:
    verdict = s.get("saturation", "n/a")
    if verdict == "overloaded":
        return "OVERLOADED (throughput above is what it kept up with)"
    if verdict == "n/a":
        return "n/a (no steady arrivals to judge)"
    return verdict


def write_outputs(out_dir: Path, files: dict[str, Any]) -> None:
    """Write DataFrames as CSV and anything else as JSON, all files or none (reports.files)."""
    from reports.files import write_files

    def writer(content: Any):
        if hasattr(content, "to_csv"):
            return lambda path: content.to_csv(path, index=False)
        return lambda path: path.write_text(json.dumps(content, indent=2, default=str) + "\n")

    write_files(out_dir, {name: writer(content) for name, content in files.items()})
