"""Printing a run like `vllm bench serve` does, and writing its files without partial output."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any


def _row(label: str, value: Any, fmt: str = ".2f") -> str:
    if value is None:
        return f"{label:<40} {'n/a':<10}"
    if isinstance(value, float):
        if 0 < abs(value) < 0.005:  # never print a real, tiny throughput as 0.00
            fmt = ".3g"
        return f"{label:<40} {value:<10{fmt}}"
    return f"{label:<40} {value:<10}"


def _section(title: str) -> str:
    return f"{title:-^50}"


def format_disagg(s: dict[str, Any]) -> str:
    """A disaggregated run's pools and KV transfers, after the client-side summary."""
    lines = []
    for name, pool in s.get("pools", {}).items():
        lines.append(_section(f"{name.capitalize()} pool ({pool['replicas']} x TP {pool['tp']})"))
        util = pool.get("utilization")
        lines.append(_row("GPU busy share (%):", None if util is None else 100 * util))
        if name == "prefill":
            lines.append(_row("Mean queueing before prefill (ms):", pool.get("mean_queue_ms")))
            lines.append(_row("P95 queueing before prefill (ms):", pool.get("p95_queue_ms")))
            lines.append(_row("Mean prefill time (ms):", pool.get("mean_prefill_ms")))
        lines.append(_row("Mean batch size (seqs/step):", pool.get("mean_batch_size")))
        lines.append(_row("Preemptions:", pool.get("num_preemptions")))
        if pool.get("kv_waste_rate") is not None:
            lines.append(_row("KV cache waste (%):", 100 * pool["kv_waste_rate"]))
        if pool.get("prefix_cache_hit_rate") is not None:
            lines.append(_row("Prefix cache hit rate (%):", 100 * pool["prefix_cache_hit_rate"]))
    t = s.get("kv_transfer", {})
    if t.get("num_transfers"):
        lines.append(_section("KV transfer"))
        lines.append(_row("Transfers:", t["num_transfers"]))
        lines.append(_row("Bytes moved (GiB):", t["bytes_moved"] / 2**30))
        for stat, label in (("mean", "Mean"), ("p50", "Median"), ("p95", "P95"), ("p99", "P99")):
            lines.append(_row(f"{label} transfer time (ms):", t.get(f"{stat}_transfer_ms")))
        # prefilled -> transfer start: the decode instance's next step boundary, and blocks there
        lines.append(_row("Mean wait for decode admission (ms):", t.get("mean_decode_wait_ms")))
        lines.append(_row("P95 wait for decode admission (ms):", t.get("p95_decode_wait_ms")))
        lines.append(_row("Mean KV hold on prefill side (ms):", t.get("mean_prefill_held_ms")))
        lines.append(_row("Mean KV held for transfer (GiB):", t.get("mean_kv_held_for_transfer_gib")))
        lines.append(_row("Max transfers in flight:", t.get("max_transfers_in_flight")))
    lines.append("=" * 50)
    return "\n".join(lines)


def format_summary(s: dict[str, Any], title: str = " Serving Benchmark Result ",
                   percentiles: tuple[float, ...] = (95.0, 99.0),
                   metrics: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el"), sessions: bool = False) -> str:
    """vLLM's result block (its labels, order and widths) and kvsim's Load and KV cache sections;
    `percentiles` and `metrics` as `--metric-percentiles` / `--percentile-metrics` chose them
    (the `p{P}_{metric}_ms` keys must be in `s`). `sessions`: a session workload, whose
    configured rate starts sessions and whose requests are turns (the labels say so)."""
    lines = [f"{title:=^50}"]
    lines.append(_row("Successful requests:", s["completed"]))
    lines.append(_row("Failed requests:", s.get("rejected", 0)))  # vLLM fails what it rejects (too long)
    if s.get("max_concurrency") is not None:
        lines.append(_row("Maximum request concurrency:", s["max_concurrency"]))
    if s.get("request_rate") is not None:
        label = "Session rate configured (sessions/s):" if sessions else "Request rate configured (RPS):"
        lines.append(_row(label, s["request_rate"]))
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
    ]
    if s.get("max_output_tokens_per_s") is not None:  # only when token times were kept (--save-result)
        lines.append(_row("Peak output token throughput (tok/s):", float(s["max_output_tokens_per_s"])))
    if s.get("max_concurrent_requests") is not None:
        lines.append(_row("Peak concurrent requests:", float(s["max_concurrent_requests"])))
    lines += [
        _row("Total token throughput (tok/s):", s["total_token_throughput"]),
    ]
    for key, name, title_ in (
        ("ttft", "TTFT", "Time to First Token"),
        ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
        ("itl", "ITL", "Inter-token Latency"),
        ("e2el", "E2EL", "End-to-end Latency"),
    ):
        if key not in metrics:
            continue
        lines.append(_section(title_))
        words = [str(int(p)) if int(p) == p else str(p) for p in percentiles]  # vLLM's P99 / P99.9
        for stat, label in (("mean", "Mean"), ("median", "Median"), *((f"p{w}", f"P{w}") for w in words)):
            lines.append(_row(f"{label} {name} (ms):", s.get(f"{stat}_{key}_ms")))
    lines.append(_section("Load"))
    lines.append(_row("Offered load:", _load_label(s)))
    unit = rate_unit(sessions)
    for key, label in (("offered_rate", f"Offered rate once warm ({unit}):"),
                       ("completed_rate_warm", f"Completed rate once warm ({unit}):"),
                       ("queue_wait_slope", "Queueing delay growth (s per s):"),
                       ("in_system_slope", "Requests in system growth (per s):"),
                       ("session_queue_slope", "  while sessions start (s per s):")):
        if s.get(key) is not None:
            lines.append(_row(label, s[key], ".3f" if key.endswith("_slope") else ".2f"))
    if s.get("full_batch_capacity"):
        lines.append(_row(f"Full-batch capacity, model ({unit}):", s["full_batch_capacity"], ".2f"))
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
    if s.get("cpu_prefix_cache_hit_rate") is not None:  # --kv-offloading-size
        # vLLM logs the connector's hits beside the GPU ones: "External prefix cache hit rate"
        lines.append(_row("External (CPU tier) prefix hit rate (%):", 100 * s["cpu_prefix_cache_hit_rate"]))
        lines.append(_row("CPU tier loaded / stored (GiB):",
                          f"{s.get('offload_loaded_gib', 0):.2f} / {s.get('offload_stored_gib', 0):.2f}", "s"))
        split = s.get("ttft_split_ms")
        if split:  # mean TTFT three ways (simcore.simulate.ttft_split_ms)
            lines.append(_row("Mean TTFT queue / load / prefill (ms):",
                              f"{split['queueing']:.2f} / {split['load']:.2f} / {split['prefill']:.2f}", "s"))
    if s.get("prefix_cache_hit_rate_by_replica"):
        lines.append(_row("  by replica (%):", ", ".join(
            "-" if r is None else f"{100 * r:.1f}" for r in s["prefix_cache_hit_rate_by_replica"])))
    if s.get("ttft_by_turn"):  # a session workload
        lines.append(_section("TTFT by turn"))
        for key, label in (("median_ttft_ms_first_turn", "Median TTFT, first turns (ms):"),
                           ("median_ttft_ms_later_turns", "Median TTFT, later turns (ms):")):
            if s.get(key) is not None:
                lines.append(_row(label, s[key]))
        for row in s["ttft_by_turn"]:
            lines.append(_row(f"  turn {row['turn']} (n={row['count']}) median / p99 (ms):",
                              f"{row['median_ms']:.2f} / {row['p99_ms']:.2f}", "s"))
    if s.get("kv_sharing_saved"):
        lines.append(_row("KV saved by block sharing (%):", 100 * s["kv_sharing_saved"]))
    if "spec_num_drafts" in s:
        lines += _speculation_lines(s)
    if s.get("error_bars"):
        lines += _error_bar_lines(s["error_bars"], percentiles, metrics)
    lines.append("=" * 50)
    return "\n".join(lines)


def _error_bar_lines(bars: dict[str, Any], percentiles: tuple[float, ...], metrics: tuple[str, ...]) -> list[str]:
    """The band of each headline metric under the profile's stated step-time error: the mean and
    one percentile (the first chosen >= 90, else the last) of the chosen TTFT / TPOT / E2EL, and
    the output throughput."""
    from kvsim.profiles.uncertainty import factors_text

    pre, dec = bars["median_abs_error_prefill"], bars["median_abs_error_decode"]
    error = f"{100 * dec:.1f}%" if pre == dec else f"prefill {100 * pre:.1f}% / decode {100 * dec:.1f}%"
    tp = "" if bars.get("tp") is None else f" TP {bars['tp']}"
    lines = [_section(f"Model error ({100 * bars['interval']:.0f}% band)"),
             _row("Profile kind / median step error:", f"{bars['kind']}{tp} / {error}"),
             _row("Step times scaled by:", factors_text(bars["step_time_factors"]))]
    p = next((q for q in percentiles if q >= 90), percentiles[-1]) if percentiles else None
    word = None if p is None else (str(int(p)) if int(p) == p else str(p))
    keys = []
    for metric, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL")):
        if metric in metrics:
            keys.append((f"mean_{metric}_ms", f"Mean {name} (ms):"))
            if word is not None:
                keys.append((f"p{word}_{metric}_ms", f"P{word} {name} (ms):"))
    keys.append(("output_throughput", "Output token throughput (tok/s):"))
    keys.append(("full_batch_capacity", "Full-batch capacity, model (req/s):"))
    for key, label in keys:
        low, high = bars["metrics"].get(key, (None, None))
        if low is not None:
            lines.append(_row(label, f"{low:,.2f} .. {high:,.2f}"))
    for key, label in (("speedup_mean_tpot_ms", "Speed-up, mean TPOT (x):"),
                       ("speedup_output_throughput", "Speed-up, output throughput (x):")):
        low, high = (bars.get("speculation_vs_none") or {}).get(key, (None, None))
        if low is not None:  # --compare-no-spec: each end against the baseline at the same factor
            lines.append(_row(label, f"{low:.3f} .. {high:.3f}"))
    for key, label, fmt in (("gpu_hours", "GPU-hours:", ",.2f"), ("attainment", "SLO attainment (%):", ".1f"),
                            ("mean_active_replicas", "Mean active replicas:", ".2f")):
        low, high = (bars.get("also") or {}).get(key, (None, None))
        if low is not None:  # --autoscale
            scale = 100 if key == "attainment" else 1
            lines.append(_row(label, f"{scale * low:{fmt}} .. {scale * high:{fmt}}"))
    return lines


def configured_load(workload: dict[str, Any]) -> dict[str, Any]:
    """What `vllm bench serve` records of the load it was asked for: `request_rate` (req/s) for
    arrivals at a set rate, `max_concurrency` for a closed loop of clients; {} otherwise."""
    a = workload.get("arrival", {})
    if a.get("process") == "closed_loop":
        return {"max_concurrency": a["concurrency"]}
    rate = a.get("rate", a.get("mean_rate", (workload.get("trace") or {}).get("rescale_rate")))
    return {} if rate is None else {"request_rate": rate}


def _load_label(s: dict[str, Any]) -> str:
    verdict = s.get("saturation", "n/a")
    if verdict == "overloaded" and s.get("capacity_exceeded"):
        return "OVERLOADED (offered more than the full-batch capacity; throughput above is what it kept up with)"
    if verdict == "overloaded":
        return "OVERLOADED (throughput above is what it kept up with)"
    if verdict == "n/a" and s.get("still_filling"):
        return ("n/a (requests in the system still grew when arrivals ended, with little queueing: overload "
                "or a slow fill; run more requests)")
    if verdict == "n/a":
        return "n/a (no steady arrivals to judge, or they ended before a typical request finished)"
    return verdict


def write_outputs(out_dir: Path, files: dict[str, Any], staging: Any = None, replaces: tuple[str, ...] = ()) -> None:
    """Write DataFrames, and mappings of numpy columns named *.csv, as CSV (the same bytes) and
    anything else as JSON, all files or none (reports.files); a callable content is called for
    its table only if the file was not streamed already into `staging` (a
    `reports.files.Staging` opened before the run). `replaces`: an earlier result's files that go
    with this write though it does not write them (RUN_FAMILY)."""
    from kvsim.reports.files import write_csv, write_files

    def writer(content: Any):
        def write(path: Path) -> None:
            if path.name.endswith((".png", ".html")):  # a figure or a page: the callable writes it there
                content(path)
                return
            value = content() if callable(content) else content
            if hasattr(value, "to_csv"):
                value.to_csv(path, index=False)
            elif path.name.endswith(".csv") and isinstance(value, dict):
                write_csv(path, value)
            else:
                path.write_text(json.dumps(value, indent=2, default=str) + "\n")

        return write

    writers = {name: writer(content) for name, content in files.items()}
    if staging is not None:
        staging.commit(writers, replaces)
    else:
        write_files(out_dir, writers, replaces)


def run_staging(out_dir: Path | None, names: tuple[str, ...] = ("requests.csv", "steps.csv", "summary.json")):
    """The staging folder a run streams its tables into (a context manager; None without --out)."""
    if out_dir is None:
        return contextlib.nullcontext()
    from kvsim.reports.files import Staging

    return Staging(out_dir, names)


def request_columns(result: Any) -> dict[str, Any]:
    """requests.csv's columns without pandas: `result.requests`'s (simcore.simulate.Result), which
    raises the same error when the rows were not kept."""
    if not result.records.kept:
        return result.requests
    return result.records.table_columns(result.records.columns())


def step_columns(result: Any) -> dict[str, Any]:
    """steps.csv's columns without pandas: `result.steps`'s (simcore.simulate.steps_frame), a
    `replica` column first when there are several replicas."""
    import numpy as np

    tables = [recorder.columns_kept() for recorder in result.recorders]
    labels = getattr(result, "step_labels", None)
    if labels is not None:  # a disaggregated run: which pool and instance each row is from
        sizes = [len(next(iter(t.values()))) for t in tables]
        return {"pool": np.concatenate([np.full(n, pool, dtype=object) for n, (pool, _) in zip(sizes, labels, strict=True)]),
                "instance": np.concatenate([np.full(n, i, dtype=np.int64) for n, (_, i) in zip(sizes, labels, strict=True)]),
                **{name: np.concatenate([t[name] for t in tables]) for name in tables[0]}}
    if len(tables) == 1:
        return tables[0]
    replica = [np.full(len(next(iter(t.values()))), index, dtype=np.int64) for index, t in enumerate(tables)]
    return {"replica": np.concatenate(replica),
            **{name: np.concatenate([t[name] for t in tables]) for name in tables[0]}}


def stream_tables(staging: Any):
    """`stream` for simcore.simulate: rows of a table the run cannot keep go to <table>.csv."""
    if staging is None:
        return None
    return lambda table, columns: staging.append_csv(f"{table}.csv", columns)


RUN_FILES = ("requests.csv", "steps.csv", "summary.json")
# Every file some `kvsim run` writes into --out (a fleet's, a disaggregated or autoscaled run's page,
# --find-max-rate's search): a run replaces an earlier run's, so that a fleet.html of seed 0 is not
# left beside a one-GPU summary.json of seed 3
RUN_FAMILY = (*RUN_FILES, "fleet.html", "disagg.html", "autoscale.png", "autoscale.html", "rates.csv",
              "max_rate.json")


def check_out_folder(out: Path | None, names: tuple[str, ...] = RUN_FILES, flag: str = "--out") -> Path | None:
    """Create and prove writable an output folder before any work (run, report, plan)."""
    if out is None:
        return None
    from kvsim.reports.files import check_out_folder as check

    return check(out, names, flag)


def check_out_file(out: Path | None, flag: str = "--out") -> Path | None:
    """The same for a single output file (sweep's CSV)."""
    if out is None:
        return None
    from kvsim.reports.files import check_out_file as check

    return check(out, flag)


def rate_unit(sessions: bool) -> str:
    """The unit of a run's offered and completed rates: a session workload's requests are its turns."""
    return "turns/s" if sessions else "req/s"


def _arrival_text(workload: dict[str, Any]) -> str:
    a = workload.get("arrival", {})
    kind = a.get("process", "?")
    unit = "sessions/s" if workload.get("sessions") else "req/s"  # a session workload's arrivals start sessions
    if "start_time_scale" in workload and "rate" in a:  # a rate search's rescaled sessions (SessionRateScaler)
        a = {**a, "rate": a["rate"] / workload["start_time_scale"]}
    if kind in ("poisson", "fixed_rate"):
        return f"{kind} arrivals at {a['rate']:g} {unit}"
    if kind == "gamma":
        return f"gamma arrivals at {a['rate']:g} {unit} (burstiness {a['burstiness']:g})"
    if kind == "piecewise":
        return f"piecewise-rate arrivals, mean {a['mean_rate']:g} req/s"
    if kind == "batch":
        return "all at t=0" if not a.get("size") else f"batches of {a['size']} every {a['interval_s']:g} s"
    if kind == "closed_loop":
        think = f", think {a['think_time_s']:g} s" if a.get("think_time_s") else ""
        return f"closed loop of {a['concurrency']} clients{think}"
    if kind == "trace":
        trace = workload.get("trace") or {}
        rate = trace.get("rescale_rate")
        return "trace replay" + (f" rescaled to {rate:g} req/s" if rate else " at its own timestamps")
    return f"{kind} arrivals"


def _speculation_lines(s: dict[str, Any]) -> list[str]:
    """vLLM's spec-decode metrics, and the speed-up over the run without speculation if it ran."""
    lines = [_section("Speculative decoding")]
    lines.append(_row("Drafts (verify steps):", s["spec_num_drafts"]))
    lines.append(_row("Mean acceptance length:", s.get("spec_mean_acceptance_length")))
    rate = s.get("spec_draft_acceptance_rate")
    lines.append(_row("Draft acceptance rate (%):", None if rate is None else 100 * rate))
    positions = [p for p in s.get("spec_acceptance_per_position", []) if p is not None]
    if positions:
        lines.append(_row("Acceptance per position:", ", ".join(f"{p:.3f}" for p in positions)))
    for key, label in (("spec_draft_time_share", "Drafting share of engine time (%):"),
                       ("spec_verify_time_share", "Target (verify) share (%):")):
        if s.get(key) is not None:
            lines.append(_row(label, 100 * s[key]))
    vs = s.get("speculation_vs_none")
    if vs:
        lines.append(_section("Speed-up vs no speculation"))
        for key, label in (("speedup_mean_tpot_ms", "Mean TPOT (x):"), ("speedup_median_tpot_ms", "Median TPOT (x):"),
                           ("speedup_p95_tpot_ms", "P95 TPOT (x):"), ("speedup_mean_itl_ms", "Mean ITL (x):"),
                           ("speedup_median_e2el_ms", "Median E2EL (x):"),
                           ("speedup_output_throughput", "Output throughput (x):")):
            lines.append(_row(label, vs.get(key), ".3f"))
        base = vs["baseline"]
        lines.append(_row("Mean TPOT without (ms):", base.get("mean_tpot_ms")))
        lines.append(_row("Saturation without:", base.get("saturation")))
    return lines


def describe_run(workload: dict[str, Any], config: dict[str, Any], model: Any, gpu: str) -> str:
    """One line saying what is simulated: workload, arrivals, requests, model and its dtypes,
    GPUs = TP x PP x DP, policy and the engine options that change what it does. `model` is the
    resolved `ModelSpec` (FP8 from --quantization, --kv-cache-dtype or the checkpoint itself)."""
    tp, pp, dp = config["tensor_parallel_size"], config.get("pipeline_parallel_size", 1), config["data_parallel_size"]
    layout = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "") + f" x DP {dp}"
    dtypes = [text for dtype, text in ((model.weight_dtype, "FP8 weights"), (model.kv_dtype, "FP8 KV cache"))
              if dtype == "fp8"]
    model_text = f"{model.name} ({', '.join(dtypes)})" if dtypes else model.name
    policy = config["policy"]
    if policy == "continuous":
        kv = "paged" if config["allocator"] == "paged" else f"contiguous/{config['reservation']}"
        extras = [f"{kv} KV", f"block {config['block_size']}"]
        if config.get("enable_chunked_prefill") is False:
            extras.append("no chunked prefill")
        if config.get("preemption_mode") == "swap":
            extras.append("swap preemption")
        if config.get("kv_offloading_size"):
            extras.append(f"CPU KV tier {config['kv_offloading_size']:g} GiB")
        spec = config.get("speculative_config")
        if spec:
            extras.append(f"speculative {spec['method']} k={spec['num_speculative_tokens']}")
        policy = f"{policy} ({', '.join(extras)})"
    elif policy == "static":
        policy = f"static (batch {config['max_batch_size']})"
    sessions = workload.get("sessions")
    count = (f"{int(sessions['num_sessions']):,} sessions (~{int(workload['num_requests']):,} turns)" if sessions
             else f"{int(workload['num_requests']):,} requests")
    return (
        f"Simulating: workload {workload.get('name')}, {count}, "
        f"{_arrival_text(workload)}; {model_text} on {tp * pp * dp} x {gpu} ({layout}); policy {policy}"
    )


def rejected_lines(records: Any, limit: int = 3) -> list[str]:
    """'N of M requests rejected' plus the commonest reasons (numbers of one request folded), from
    a run's `RequestRecords` (its table of reasons and their counts)."""
    import re

    kinds: dict[str, list] = {}  # folded reason -> [count, first reason seen]
    for reason, count in zip(records.reasons, records.reason_counts, strict=True):
        entry = kinds.setdefault(re.sub(r"\d+", "N", reason, count=1), [0, reason])
        entry[0] += count
    num_rejected = sum(count for count, _ in kinds.values())
    if not num_rejected:
        return []
    ordered = sorted(kinds.items(), key=lambda item: -item[1][0])
    lines = [f"{num_rejected:,} of {records.num_left:,} requests rejected (not served):"]
    for kind, (count, example) in ordered[:limit]:
        lines.append(f"  {count:,} x {example}" + (" (and similar)" if count > 1 and kind != example else ""))
    if len(ordered) > limit:
        rest = sum(count for _, (count, _) in ordered[limit:])
        lines.append(f"  ... and {rest:,} more with {len(ordered) - limit} other reasons")
    return lines


IDLE_WARNING_SHARE = 0.01  # engine busy less than 1% of the makespan: throughput measures the arrivals


def result_problems(summary: dict[str, Any], records: Any, busy_s: float) -> tuple[list[str], str | None]:
    """(warnings, fatal): a run that served nothing or produced no throughput is fatal; an engine
    idle nearly all the time (`busy_s`: summed step durations), or a day-long gap between
    arrivals, is warned about."""
    completed = summary.get("completed", 0)
    if not completed:
        why = f": {next(iter(records.reasons))}" if records.reasons else ""
        return [], f"no request was served ({summary.get('rejected', 0)} of {summary['num_requests']} rejected{why})"
    if not summary.get("output_throughput"):
        return [], "the run produced zero output throughput (every request finished at the instant it arrived)"
    warnings = []
    duration = summary.get("duration_s") or 0.0
    if duration > 0 and busy_s / duration < IDLE_WARNING_SHARE:
        warnings.append(
            f"the engine was busy {100 * busy_s / duration:.2g}% of the {duration:,.0f} s makespan: "
            "throughput here measures the arrival rate, not the deployment's capacity"
        )
    gap = records.max_arrival_gap_s
    if gap > 86_400:
        shown = f"{gap:,.0f}" if gap < 1e15 else f"{gap:.3g}"  # not 300 digits for a 1e-300 req/s rate
        warnings.append(f"the longest gap between two arrivals is {shown} s (over a day)")
    return warnings, None


def start_bar(description: str, total: int, completed: int = 0):
    """A started rich bar on stderr (done / total, elapsed, ETA) and its task: one look for
    every long command."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), "ETA", TimeRemainingColumn(), transient=True, console=Console(stderr=True))
    task = bar.add_task(description, total=total, completed=completed)
    bar.start()
    return bar, task


class LiveProgress:
    """Work done / total with an ETA on stderr: a transient rich bar on a terminal (shown once the
    work outlasts half a second), else one plain line every `period_s` (logs, CI, pipes)."""

    def __init__(self, description: str, total: int | None, unit: str, period_s: float = 10.0) -> None:
        import sys
        import time

        self.description, self.total, self.unit, self.period_s = description, total, unit, period_s
        self._clock = time.perf_counter
        self.started = self.last_line = self._clock()
        self.done = 0
        self.tty = sys.stderr.isatty()
        self.bar = None

    def update(self, done: int, total: int | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        now = self._clock()
        if self.tty:
            self._bar_update(now)
        elif now - self.last_line >= self.period_s:
            self.last_line = now
            import typer

            typer.echo(self.line(now), err=True)

    def line(self, now: float) -> str:
        elapsed = now - self.started
        text = f"{self.description}: {self.done:,}"
        if self.total:
            text += f" of {self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%)"
        else:
            text += f" {self.unit}"
        text += f", {elapsed:,.0f} s elapsed"
        if self.total and self.done:
            text += f", ETA {elapsed * (self.total - self.done) / self.done:,.0f} s"
        return text

    def _bar_update(self, now: float) -> None:
        if self.bar is None:
            if now - self.started < 0.5:
                return
            self.bar, self.task = start_bar(self.description, self.total)
        self.bar.update(self.task, completed=self.done, total=self.total)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
