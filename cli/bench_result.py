"""`vllm bench serve`'s result, from a kvsim run: its flat JSON keys, the percentiles and metrics it
was asked for (`--metric-percentiles`, `--percentile-metrics`), its peak figures and the
`--save-result` file with per-request arrays.

Key names and rules are vllm/benchmarks/serve.py's (`calculate_metrics`, `benchmark`, `main_async`):
`p{P}_{metric}_ms` with P printed as an integer when it is one; `std_*` numpy's population std;
peak output tokens per second = the most tokens stamped in one whole second counted from the first
request's start; peak concurrent requests = the most requests in flight at once over half-open
intervals [start, start + latency) (a departure at an instant goes before an arrival), successful
requests only. kvsim's start time is the request's arrival; times are simulated seconds.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.simcore.errors import ConfigError
from kvsim.simcore.metrics import metric_stats, p_word, per_request_rows  # noqa: F401  (this module's API too)

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (95.0, 99.0)  # kvsim prints P95 and P99 unless told (vLLM: 99 alone)


def parse_percentiles(text: str | None) -> tuple[float, ...]:
    """`--metric-percentiles 50,90,99` -> (50.0, 90.0, 99.0); each in [0, 100], none twice."""
    if text is None:
        return DEFAULT_PERCENTILES
    out: list[float] = []
    for part in text.split(","):
        try:
            p = float(part)
        except ValueError:
            raise ConfigError(f"--metric-percentiles: {part.strip()!r} is not a number (e.g. 50,90,99)") from None
        if not 0 <= p <= 100:
            raise ConfigError(f"--metric-percentiles: {part.strip()} is not a percentile in [0, 100]")
        if p in out:
            raise ConfigError(f"--metric-percentiles: {part.strip()} is given twice")
        out.append(p)
    return tuple(out)


def parse_metrics(text: str | None) -> tuple[str, ...]:
    """`--percentile-metrics ttft,tpot` -> ("ttft", "tpot"); kvsim's default is all four."""
    if text is None:
        return PERCENTILE_METRICS
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in PERCENTILE_METRICS:
            raise ConfigError(f"--percentile-metrics: unknown metric {name!r}; use {', '.join(PERCENTILE_METRICS)}")
    if len(set(names)) != len(names):
        raise ConfigError("--percentile-metrics: a metric is given twice")
    return tuple(names)


def peak_concurrency(result: Any) -> int | None:
    """The most successful requests in flight at once (vLLM's sweep over [start, end))."""
    rows = per_request_rows(result)
    if rows is None:
        return None
    start = np.sort(rows["arrival_s"][rows["done"]])
    end = np.sort(rows["finish_s"][rows["done"]])
    if not len(start):
        return 0
    in_flight = np.searchsorted(start, start, side="right") - np.searchsorted(end, start, side="right")
    return int(in_flight.max())


def token_times(sim: Any) -> dict[int, list[float]] | None:
    """Request id -> its token times, merged over the replicas (None when not recorded)."""
    logs = [e.lifecycle.token_times for e in sim.replicas]
    if any(log is None for log in logs):
        return None
    merged: dict[int, list[float]] = {}
    for log in logs:
        merged.update(log)
    return merged


def peak_output_throughput(times: dict[int, list[float]], rows: dict[str, np.ndarray]) -> float:
    """vLLM's max_output_tokens_per_s: tokens counted per whole second since the first start."""
    done = rows["done"]
    if not done.any():
        return 0.0
    t0 = float(rows["arrival_s"][done].min())
    stamps = np.concatenate([np.asarray(times.get(int(i), ()), dtype=np.float64) for i in rows["request_id"][done]])
    if not len(stamps):
        return 0.0
    buckets = np.floor(stamps - t0).astype(np.int64)
    return float(np.bincount(buckets[buckets >= 0]).max())


def flat_result(summary: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """vLLM's flat result keys (what `--json` and `--save-result` put at the top level), from a
    kvsim summary plus `extra` (percentile stats, peaks, the run's settings)."""
    out = {
        "duration": summary["duration_s"], "completed": summary["completed"], "failed": summary.get("rejected", 0),
        "total_input_tokens": summary["total_input_tokens"], "total_output_tokens": summary["total_output_tokens"],
        "request_throughput": summary["request_throughput"], "request_goodput": summary.get("request_goodput"),
        "output_throughput": summary["output_throughput"],
        "total_token_throughput": summary["total_token_throughput"],
    }
    out.update(extra)
    return out


def per_request_arrays(result: Any, times: dict[int, list[float]] | None) -> dict[str, list]:
    """vLLM's per-request arrays, in request order: input_lens, output_lens, ttfts, itls (seconds
    between a request's tokens), latencies, start_times, errors ("" for a success). Tokens that
    arrive together (a speculative step's burst shares one time) are one streamed chunk, and
    `vllm bench serve` appends one ITL per chunk (vllm/benchmarks/lib/endpoint_request_func.py),
    so a burst adds one gap, not zeros: the same gaps the summary pools (Lifecycle.emit_spec)."""
    rows = per_request_rows(result)
    if rows is None:
        raise ConfigError("--save-result needs every request row in memory")
    order = np.argsort(rows["request_id"], kind="stable")
    reasons = result.records.reason_names()
    out: dict[str, list] = {k: [] for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies",
                                             "start_times", "errors")}
    for i in order.tolist():
        done = bool(rows["done"][i])
        rid = int(rows["request_id"][i])
        out["input_lens"].append(int(rows["num_prompt_tokens"][i]))
        out["output_lens"].append(int(rows["num_positions"][i]) * int(rows["n"][i]) if done else 0)
        out["ttfts"].append(float(rows["ttft_s"][i]) if done else 0.0)
        stamps = (times or {}).get(rid, [])
        out["itls"].append([b - a for a, b in zip(stamps, stamps[1:], strict=False) if b != a] if done else [])
        out["latencies"].append(float(rows["e2el_s"][i]) if done else 0.0)
        out["start_times"].append(float(rows["arrival_s"][i]))
        out["errors"].append("" if done else f"rejected: {reasons[int(rows['reason'][i])]}")
    return out


def result_path(result_dir: Path | None, result_filename: str | None, label: str, rate: Any,
                concurrency: int | None, model: str, now: datetime) -> Path:
    """vLLM's compute_result_filename: `{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json`
    unless --result-filename, inside --result-dir when given."""
    if result_filename is not None:
        name = result_filename
    else:
        conc = f"-concurrency{concurrency}" if concurrency is not None else ""
        name = f"{label}-{rate}qps{conc}-{model}-{now.strftime('%Y%m%d-%H%M%S')}.json"
    return Path(result_dir) / name if result_dir is not None else Path(name)


def check_result_target(path: Path) -> None:
    """Before any work: the result file's folder exists or can be made, the file is not a folder."""
    import os

    if path.is_dir():
        raise ConfigError(f"--result-filename {path}: is a folder")
    if os.path.lexists(path) and not _is_kvsim_result(path):  # e.g. --result-filename /etc/passwd: replaced whole
        raise ConfigError(f"--save-result {path}: exists and is not a kvsim result file; give another "
                          "--result-filename or remove it")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"--result-dir {parent}: not a folder")
    existing = parent.absolute()  # the nearest folder that exists must be a writable folder
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # mkdir would fail on it after the whole run
            raise ConfigError(f"--result-dir {parent}: {existing} is a symlink to nothing")
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--result-dir {parent}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--result-dir {parent}: {existing} is not writable")


def _is_kvsim_result(path: Path) -> bool:
    """A regular file that a previous --save-result wrote (its first keys say so): safe to replace."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return head.startswith(b'{"date": ') and b'"backend": "kvsim"' in head


def write_result(path: Path, document: dict[str, Any]) -> None:
    """The result file, written whole (a temporary file renamed into place)."""
    from kvsim.reports.files import write_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, lambda tmp: tmp.write_text(json.dumps(document, default=_jsonable) + "\n"))
    except OSError as exc:
        raise ConfigError(f"--save-result {path}: cannot write it ({exc.strerror or exc})") from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    return str(value)
