"""`kvsim sweep`: simulate a grid of engine settings and print one row per point.

    kvsim sweep --block-size 8,16,32 --gpu-memory-utilization 0.8,0.9 --rate 20

Every point runs with the same --seed, so every point serves identical traffic.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer

from cli.options import (
    Allocator,
    AsJson,
    BatchTimeout,
    BeamWidth,
    Burstiness,
    Concurrency,
    EnableChunkedPrefill,
    EnablePrefixCaching,
    Gpu,
    InputLen,
    MaxBatchSize,
    MaxModelLen,
    MaxNumBatchedTokens,
    MaxTokens,
    Model,
    N,
    NumRequests,
    OutputLen,
    PolicyName,
    Preemption,
    ProfilePath,
    Rate,
    Reservation,
    RouterOpt,
    SwapSpace,
    ThinkTime,
    Workload,
    check_common,
    engine_options,
    refuse_irrelevant,
    workload_overrides,
)
from simcore.catalog import get_gpu, get_model
from simcore.errors import ConfigError
from simcore.specs import EngineConfig

LIST_HELP = "Comma-separated list to sweep."


def _lists(policy, tp, dp, block_size, gpu_memory_utilization, max_num_seqs) -> dict[str, list]:
    """The swept EngineConfig fields in grid order (first varies slowest); tp is always a column."""
    from reports.sweep import parse_list

    lists: dict[str, list] = {}
    if policy is not None:
        lists["policy"] = parse_list("--policy", policy, str)
        known = [p.value for p in PolicyName]
        for value in lists["policy"]:
            if value not in known:
                raise ConfigError(f"--policy: {value!r} is not one of {', '.join(known)}")
    lists["tensor_parallel_size"] = parse_list("--tp", tp, int) if tp is not None else [1]
    if dp is not None:
        lists["data_parallel_size"] = parse_list("--dp", dp, int)
    for name, flag, text, kind in (
        ("block_size", "--block-size", block_size, int),
        ("gpu_memory_utilization", "--gpu-memory-utilization", gpu_memory_utilization, float),
        ("max_num_seqs", "--max-num-seqs", max_num_seqs, int),
    ):
        if text is not None:
            lists[name] = parse_list(flag, text, kind)
    return lists


def _format_cell(column: str, value: Any) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if column == "kv_cache_tokens":
        return f"{int(value):,}"
    if column == "kv_waste":
        return f"{100 * value:.1f}%"
    if column == "meets_slo":
        return "yes" if value else "no"
    if column.endswith("_ms") or column == "output_tok_s":
        return f"{value:,.1f}"
    return str(value)


def format_table(frame) -> str:
    """A plain aligned table (numbers right, text left) that pipes and diffs cleanly."""
    cols = list(frame.columns)
    cells = [[_format_cell(c, v) for c, v in zip(cols, row, strict=True)] for row in frame.itertuples(index=False)]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    left = {"policy", "regime", "meets_slo", "load"}

    def line(values: list[str]) -> str:
        parts = [v.ljust(w) if c in left else v.rjust(w) for c, v, w in zip(cols, values, widths, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(cols)] + [line(r) for r in cells])


def _progress(total: int):
    if not sys.stderr.isatty():
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), transient=True, console=Console(stderr=True))
    task = progress.add_task("sweep points", total=total)
    progress.start()
    return (lambda done: progress.update(task, completed=done)), progress.stop


def _records(frame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN / NA -> null)."""
    return [{k: (None if v is None or (not isinstance(v, str) and pd.isna(v)) else v)
             for k, v in row.items()} for row in frame.astype(object).to_dict("records")]


def sweep(
    model: Model = "llama3-8b",
    gpu: Gpu = "H100-SXM-80GB",
    tp: Annotated[str | None, typer.Option("--tp", "--tensor-parallel-size", help=f"GPUs per replica. {LIST_HELP} [default: 1]")] = None,
    dp: Annotated[str | None, typer.Option("--dp", "--data-parallel-size", help=f"Engine replicas behind a router (GPUs = tp x dp). {LIST_HELP} [default: 1]")] = None,
    router: RouterOpt = None,
    policy: Annotated[str | None, typer.Option(help=f"Batching policy: static, dynamic, continuous. {LIST_HELP} [default: continuous]")] = None,
    allocator: Allocator = None,
    reservation: Reservation = None,
    block_size: Annotated[str | None, typer.Option(help=f"Tokens per KV block (power of two). {LIST_HELP} [default: 16]")] = None,
    gpu_memory_utilization: Annotated[str | None, typer.Option(help=f"Share of GPU memory the engine may use. {LIST_HELP} [default: 0.9]")] = None,
    max_num_seqs: Annotated[str | None, typer.Option(help=f"Most sequences in one step. {LIST_HELP} [default: 256]")] = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    enable_chunked_prefill: EnableChunkedPrefill = None,
    enable_prefix_caching: EnablePrefixCaching = None,
    swap_space: SwapSpace = None,
    preemption_mode: Preemption = None,
    max_model_len: MaxModelLen = None,
    max_batch_size: MaxBatchSize = None,
    batch_timeout_s: BatchTimeout = None,
    workload: Workload = None,
    rate: Rate = None,
    concurrency: Concurrency = None,
    num_requests: NumRequests = None,
    burstiness: Burstiness = None,
    input_len: InputLen = None,
    output_len: OutputLen = None,
    max_tokens: MaxTokens = None,
    n: N = None,
    beam_width: BeamWidth = None,
    think_time_s: ThinkTime = None,
    seed: Annotated[int, typer.Option(help="Seed; every point uses it, so every point sees identical traffic.")] = 0,
    profile: ProfilePath = None,
    slo_ttft_p95_ms: Annotated[float | None, typer.Option(help="SLO: p95 TTFT at most this many ms.")] = None,
    slo_tpot_p95_ms: Annotated[float | None, typer.Option(help="SLO: p95 TPOT at most this many ms.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the table to this CSV file.")] = None,
    as_json: AsJson = False,
) -> None:
    """Simulate every combination of the listed engine settings; print one row per point."""
    from reports.sweep import SWEEPABLE, add_slo, cheapest_passing, plan_points, run_sweep

    lists = _lists(policy, tp, dp, block_size, gpu_memory_utilization, max_num_seqs)
    fields, given = engine_options(
        allocator, reservation, max_num_batched_tokens, enable_chunked_prefill, swap_space,
        preemption_mode, max_model_len, max_batch_size, batch_timeout_s, enable_prefix_caching,
    )
    for pol in lists.get("policy", ["continuous"]):
        refuse_irrelevant(pol, fields.get("allocator"), given)
    for flag, limit in (("--slo-ttft-p95-ms", slo_ttft_p95_ms), ("--slo-tpot-p95-ms", slo_tpot_p95_ms)):
        if limit is not None and not limit > 0:
            raise ConfigError(f"{flag} must be > 0, got {limit}")
    if out is not None and out.suffix.lower() != ".csv":
        raise ConfigError(f"--out {out}: give a .csv file")
    model_spec, gpu_spec = get_model(model), get_gpu(gpu)
    check_common(seed, max_model_len, model_spec)
    if router is not None:
        fields["router"] = router.value
    base = EngineConfig(**fields)
    points = plan_points(model_spec, gpu_spec, base, lists)
    wl = _workload(workload, base, model_spec, workload_overrides(
        num_requests=num_requests, rate=rate, concurrency=concurrency, burstiness=burstiness,
        input_len=input_len, output_len=output_len, max_tokens=max_tokens, n=n,
        beam_width=beam_width, think_time_s=think_time_s,
    ))
    profile_for = _profiles(profile, gpu_spec, model_spec, [p.config.tensor_parallel_size for p in points if not p.does_not_fit])

    update, stop = _progress(len(points))
    try:
        frame, warnings = run_sweep(model_spec, gpu_spec, points, wl, profile_for, seed, update)
    finally:
        stop()
    for note in wl.notes():
        typer.echo(f"NOTE {note}", err=True)
    for warning in warnings:
        typer.echo(f"WARNING {warning}", err=True)
    best = None
    if slo_ttft_p95_ms is not None or slo_tpot_p95_ms is not None:
        frame = add_slo(frame, slo_ttft_p95_ms, slo_tpot_p95_ms)
        best = cheapest_passing(
            frame, [p.config.tensor_parallel_size * p.config.data_parallel_size for p in points]
        )
    if out is not None:
        from reports.files import write_files

        write_files(out.parent, {out.name: lambda p: frame.to_csv(p, index=False)})
    _print(frame, best, SWEEPABLE, as_json, {
        "model": model_spec.name, "gpu": gpu_spec.name, "workload": wl.describe(), "seed": seed,
        "slo": {"ttft_p95_ms": slo_ttft_p95_ms, "tpot_p95_ms": slo_tpot_p95_ms},
    }, out)


def _workload(workload, base: EngineConfig, model_spec, overrides: dict[str, Any]):
    from workloads import load_workload

    return load_workload(workload, overrides, max_model_len=base.resolved_max_model_len(model_spec))


def _profiles(path: Path | None, gpu_spec, model_spec, tps: list[int]):
    """A loader per TP (each loaded once); --profile is one file, so it allows one TP only."""
    from profiles import check_profile_matches, default_profile
    from simcore.latency import load_profile

    if path is not None:
        if len(set(tps)) > 1:
            raise ConfigError("--profile is one file for one TP; sweep --tp without --profile")
        fixed = load_profile(path)
        for tp_ in set(tps):
            check_profile_matches(fixed, model_spec, tp_)
        return lambda tp_: fixed
    loaded = {tp_: default_profile(gpu_spec, model_spec, tp_) for tp_ in sorted(set(tps))}
    return loaded.__getitem__


def _print(frame, best: int | None, sweepable, as_json: bool, context: dict[str, Any], out: Path | None) -> None:
    slo = "meets_slo" in frame.columns
    if as_json:
        doc = {**context, "points": _records(frame), "cheapest_passing": None}
        if best is not None:
            doc["cheapest_passing"] = _records(frame.iloc[[best]])[0]
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    wl = context["workload"]
    typer.echo(f"Sweep: {context['model']} on {context['gpu']}, workload {wl.get('name')}, "
               f"seed {context['seed']} (every point serves the same requests)")
    typer.echo(format_table(frame))
    if slo:
        if best is None:
            typer.echo("No point meets the SLO.")
        else:
            row = frame.iloc[best]
            names = {col for _, col in sweepable.values()}
            swept = ", ".join(f"{col}={row[col]}" for col in frame.columns if col in names)
            typer.echo(f"Cheapest passing point (fewest GPUs, then highest throughput): {swept} "
                       f"({row['output_tok_s']:,.1f} output tok/s)")
    if out is not None:
        typer.echo(f"Wrote {out}", err=True)
