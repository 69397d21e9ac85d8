"""`kvsim sweep`: simulate a grid of engine settings (x seeds) in parallel; one row per point.

    kvsim sweep --block-size 8,16,32 --gpu-memory-utilization 0.8,0.9 --rate 10,20 --out sweep.csv

Every cell runs with the same seeds, so every cell serves identical traffic. Rows go to --out as
each point finishes; --resume finishes a killed sweep; --executor ray runs on a Ray cluster.
"""

from __future__ import annotations

import json
import math
import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import pandas as pd

from kvsim.cli.options import (
    Allocator,
    AsJson,
    BatchTimeout,
    BeamWidth,
    Burstiness,
    EnableChunkedPrefill,
    EnablePrefixCaching,
    EngineVersion,
    InputLen,
    MaxBatchSize,
    MaxModelLen,
    MaxNumBatchedTokens,
    MaxTokens,
    N,
    NumRequests,
    OutputLen,
    PolicyName,
    Preemption,
    ProfilePath,
    Reservation,
    SloTargets,
    SwapSpace,
    ThinkTime,
    UsageContextOpt,
    Workload,
    apply_engine_preset,
    batch_default_fields,
    check_common,
    check_inputs_kept,
    check_sample_width,
    check_slos,
    engine_options,
    refuse_irrelevant,
    workload_overrides,
)
from kvsim.cli.output import check_out_file
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.specs import EngineConfig
from kvsim.simcore.userfiles import shown

LIST_HELP = "Comma-separated list to sweep."


class ExecutorName(str, Enum):
    local = "local"
    ray = "ray"


def _lists(policy, gpu, tp, dp, block_size, gpu_memory_utilization, max_num_seqs, rate, concurrency,
           pp=None, kv_cache_dtype=None, quantization=None) -> dict[str, list]:
    """The swept fields (SWEEPABLE names) -> values; tp is always a column (the models are
    plan_sweep's own argument)."""
    from kvsim.reports.sweep import check_distinct, parse_kv_cache_dtypes, parse_list

    lists: dict[str, list] = {}
    if policy is not None:
        lists["policy"] = parse_list("--policy", policy, str)
        known = [p.value for p in PolicyName]
        for value in lists["policy"]:
            if value not in known:
                raise ConfigError(f"--policy: {value!r} is not one of {', '.join(known)}")
    lists["gpu"] = parse_list("--gpu", gpu, str)
    lists["tensor_parallel_size"] = parse_list("--tp", tp, int) if tp is not None else [1]
    for name, flag, text, kind in (
        ("data_parallel_size", "--dp", dp, int),
        ("pipeline_parallel_size", "--pp", pp, int),
        ("block_size", "--block-size", block_size, int),
        ("gpu_memory_utilization", "--gpu-memory-utilization", gpu_memory_utilization, float),
        ("max_num_seqs", "--max-num-seqs", max_num_seqs, int),
        ("rate", "--rate", rate, float),
        ("concurrency", "--concurrency", concurrency, int),
    ):
        if text is not None:
            lists[name] = parse_list(flag, text, kind)
    if kv_cache_dtype is not None:  # "fp8,fp8_e4m3": one dtype twice
        lists["kv_cache_dtype"] = parse_kv_cache_dtypes(kv_cache_dtype)
    if quantization is not None:  # "none" is the unquantized checkpoint
        lists["quantization"] = [None if q.lower() == "none" else q for q in parse_list("--quantization", quantization, str)]
        check_distinct("--quantization", lists["quantization"], quantization)
    return lists


def _tier_lists(router: str | None, kv_offloading_size: str | None) -> dict[str, list]:
    """--router and --kv-offloading-size as swept lists ("0" or "none": no CPU tier)."""
    from kvsim.reports.sweep import check_distinct, parse_list
    from kvsim.simcore.specs import ROUTERS

    lists: dict[str, list] = {}
    if router is not None:
        lists["router"] = parse_list("--router", router, str)
        for value in lists["router"]:
            if value not in ROUTERS:
                raise ConfigError(f"--router: {value!r} is not one of {', '.join(ROUTERS)}")
    if kv_offloading_size is not None:
        sizes = parse_list("--kv-offloading-size", kv_offloading_size, str)
        try:
            lists["kv_offloading_size"] = [None if s.lower() in ("0", "none") else float(s) for s in sizes]
        except ValueError:
            raise ConfigError(f"--kv-offloading-size: give GiB numbers (or none), got {kv_offloading_size!r}") from None
        check_distinct("--kv-offloading-size", lists["kv_offloading_size"], kv_offloading_size)
    return lists


def _format_cell(column: str, value: Any) -> str:
    import pandas as pd  # here, not at module level: `kvsim run` never needs pandas to start

    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if column == "kv_cache_tokens":
        return f"{value:,.0f}"
    if column == "kv_waste":
        return f"{100 * value:.1f}%"
    if column == "meets_slo":
        return "yes" if value else "no"
    if column.endswith("_ms") or column == "output_tok_s":
        return f"{value:,.1f}"
    if column == "preemptions" and isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _with_interval(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Columns to print and their cells; a metric with a 95% interval prints as `mean ±half`, or as
    `mean (low to high)` when an end was cut at what the metric can take (a latency below 0); one
    with a model-error band (--error-bars) as `value [low..high]`."""
    import pandas as pd

    from kvsim.reports.sweep import cut_ends

    cols = [c for c in frame.columns if not c.endswith(("_ci95_low", "_ci95_high", "_band_low", "_band_high"))]
    cells = []
    for _, row in frame.iterrows():
        line = []
        for c in cols:
            text = _format_cell(c, row[c])
            low, high = row.get(f"{c}_ci95_low"), row.get(f"{c}_ci95_high")
            if text and low is not None and high is not None and not pd.isna(low) and not pd.isna(high):
                if any(cut_ends(c, row[c], low, high)):
                    text += f" ({_format_cell(c, low)} to {_format_cell(c, high)})"
                else:
                    text += " ±" + _format_cell(c, (high - low) / 2)
            low, high = row.get(f"{c}_band_low"), row.get(f"{c}_band_high")  # --error-bars: the model's 90% band
            if text and low is not None and high is not None and not pd.isna(low) and not pd.isna(high):
                text += f" [{_format_cell(c, low)}..{_format_cell(c, high)}]"
            line.append(text)
        cells.append(line)
    return cols, cells


def interval_note(n: int) -> str:
    """How to read the intervals over `n` seeds: Student-t, so wide over few (t = 12.71 for 2)."""
    from kvsim.reports.sweep_runner import t975

    wide = ", so wide" if n < 5 else ""
    return f"mean ±95% interval, Student-t: t = {t975(n):.2f} for {n} seeds{wide}; cut at 0 and 100%"


def format_table(frame) -> str:
    """A plain aligned table (numbers right, text left) that pipes and diffs cleanly."""
    cols, cells = _with_interval(frame)
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    left = {"model", "policy", "gpu", "regime", "meets_slo", "load", "seeds"}

    def line(values: list[str]) -> str:
        parts = [v.ljust(w) if c in left else v.rjust(w) for c, v, w in zip(cols, values, widths, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(cols)] + [line(r) for r in cells])


class _Progress:
    """Points done / total with an ETA: a rich bar on a terminal, else a line every 10 s."""

    def __init__(self, total: int, already: int = 0) -> None:
        self.total, self.done, self.started = total, already, time.perf_counter()
        self.first, self.last_line = already, self.started
        self.bar = None
        if sys.stderr.isatty() and total > already:
            from kvsim.cli.output import start_bar

            self.bar, self.task = start_bar("sweep points", total, already)

    def step(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        elif now - self.last_line >= 10 or (self.done == self.total and self.last_line > self.started):
            self.last_line = now
            rate = (self.done - self.first) / max(now - self.started, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("nan")
            typer.echo(f"sweep: {self.done}/{self.total} points, {now - self.started:.0f} s elapsed, "
                       f"ETA {eta:.0f} s", err=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _records(frame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN / NA -> null)."""
    import pandas as pd

    return [{k: (None if v is None or (not isinstance(v, str) and pd.isna(v)) else v)
             for k, v in row.items()} for row in frame.astype(object).to_dict("records")]


def sweep(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help=f"Catalog model(s) or Hugging Face config.json. {LIST_HELP}")] = "llama3-8b",
    gpu: Annotated[str, typer.Option(help=f"Catalog GPU: H100-SXM-80GB, H200-141GB, A100-80GB, A100-40GB. {LIST_HELP}")] = "H100-SXM-80GB",
    tp: Annotated[str | None, typer.Option("--tp", "--tensor-parallel-size", help=f"GPUs per replica. {LIST_HELP} [default: 1]")] = None,
    dp: Annotated[str | None, typer.Option("--dp", "--data-parallel-size", help=f"Engine replicas behind a router (GPUs = tp x pp x dp). {LIST_HELP} [default: 1]")] = None,
    pp: Annotated[str | None, typer.Option("--pp", "--pipeline-parallel-size", help=f"Pipeline stages per replica, each --tp GPUs. {LIST_HELP} [default: 1]")] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option("--kv-cache-dtype", help=f"KV cache storage: auto or fp8. {LIST_HELP} [default: auto]")] = None,
    quantization: Annotated[str | None, typer.Option("--quantization", "-q", help=f"Weights: none or fp8 (FP8 needs H100/H200). {LIST_HELP} [default: none]")] = None,
    router: Annotated[str | None, typer.Option("--router", help=f"How requests are spread over data-parallel replicas: round-robin, least-loaded, session-affinity, prefix-aware. {LIST_HELP} [default: least-loaded]")] = None,
    policy: Annotated[str | None, typer.Option(help=f"Batching policy: static, dynamic, continuous. {LIST_HELP} [default: continuous]")] = None,
    allocator: Allocator = None,
    reservation: Reservation = None,
    block_size: Annotated[str | None, typer.Option(help=f"Tokens per KV block (power of two). {LIST_HELP} [default: 16]")] = None,
    gpu_memory_utilization: Annotated[str | None, typer.Option(help=f"Share of GPU memory the engine may use. {LIST_HELP} [default: 0.9]")] = None,
    max_num_seqs: Annotated[str | None, typer.Option(help=f"Most sequences in one step. {LIST_HELP} [default: the engine version's vLLM default on each GPU: 1024 on an H100 for vllm-v1, 256 for vllm-0.6; 256 for static / dynamic batching]")] = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    enable_chunked_prefill: EnableChunkedPrefill = None,
    enable_prefix_caching: EnablePrefixCaching = None,
    engine_version: EngineVersion = None,
    usage_context: UsageContextOpt = None,
    error_bars: Annotated[bool, typer.Option("--error-bars", help="Also run every point with every step time at the 5th and 95th percentile of its profile's stated error (profiles/uncertainty.py): columns <metric>_band_low / _band_high for TTFT, TPOT and throughput (x3 the simulations, so off by default).")] = False,
    swap_space: SwapSpace = None,
    kv_offloading_size: Annotated[str | None, typer.Option("--kv-offloading-size", help=f"CPU KV tier of a replica in GiB (0 or none: no tier). {LIST_HELP} [default: none]")] = None,
    preemption_mode: Preemption = None,
    max_model_len: MaxModelLen = None,
    max_batch_size: MaxBatchSize = None,
    batch_timeout_s: BatchTimeout = None,
    workload: Workload = None,
    rate: Annotated[str | None, typer.Option("--rate", "--request-rate", help=f"Open loop: request rate in req/s. {LIST_HELP}")] = None,
    concurrency: Annotated[str | None, typer.Option("--concurrency", "--max-concurrency", help=f"Closed loop: concurrent clients. {LIST_HELP}")] = None,
    num_requests: NumRequests = None,
    burstiness: Burstiness = None,
    input_len: InputLen = None,
    output_len: OutputLen = None,
    max_tokens: MaxTokens = None,
    n: N = None,
    beam_width: BeamWidth = None,
    think_time_s: ThinkTime = None,
    zip_: Annotated[str | None, typer.Option("--zip", help="Swept options that vary together instead of as a grid, value i with value i (e.g. model,tp: each model at its own TP); ';' between groups.")] = None,
    seed: Annotated[int, typer.Option(help="Seed; every point uses it, so every point sees identical traffic.")] = 0,
    seeds: Annotated[str | None, typer.Option(help="Run every point with each of these seeds (e.g. 0,1,2) and print each metric's mean and 95% interval.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Run every point with K seeds: --seed, --seed+1, ...")] = None,
    profile: ProfilePath = None,
    slo_ttft_p95_ms: Annotated[float | None, typer.Option(help="SLO: p95 TTFT at most this many ms.")] = None,
    slo_tpot_p95_ms: Annotated[float | None, typer.Option(help="SLO: p95 TPOT at most this many ms.")] = None,
    slo_targets: SloTargets = None,
    out: Annotated[Path | None, typer.Option(help="Table that gets one row per point as each finishes (every option and metric): a .csv file, or .parquet (needs pyarrow; rows collect in a hidden .NAME.rows.csv beside it until the last point is in).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Finish the sweep in --out: run only its missing points.")] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Worker processes (local) or most tasks in flight (ray). [default: all cores]")] = None,
    executor: Annotated[ExecutorName, typer.Option(help="Where points run: local processes, or a Ray cluster (pip install '.[ray]' in kvsim's source folder).")] = ExecutorName.local,
    address: Annotated[str | None, typer.Option(help="Ray cluster: auto or HOST:PORT. [default: start a local Ray]")] = None,
    as_json: AsJson = False,
    speculative_config: Annotated[str | None, typer.Option("--speculative-config", help="Speculative decoding as vLLM's JSON (see kvsim run), or a JSON list of them to sweep, null for none: '[null, {\"method\": \"eagle\", \"num_speculative_tokens\": 3}]'.")] = None,
) -> None:
    """Simulate every combination of the listed settings (x seeds) in parallel; one row per point."""
    import numpy as np
    import pandas as pd

    from kvsim.reports.sweep import (
        SWEEPABLE,
        add_slo,
        check_distinct,
        parse_list,
        parse_zip,
        plan_sweep,
        summarize_points,
    )
    from kvsim.reports.sweep_runner import parse_seeds

    lists = _lists(policy, gpu, tp, dp, block_size, gpu_memory_utilization, max_num_seqs, rate, concurrency,
                   pp, kv_cache_dtype, quantization)
    fields, given = engine_options(
        allocator, reservation, max_num_batched_tokens, enable_chunked_prefill, swap_space,
        preemption_mode, max_model_len, max_batch_size, batch_timeout_s, enable_prefix_caching, engine_version=engine_version,
    )
    if speculative_config is not None:
        from kvsim.simcore.speculative import parse_speculative_configs

        specs = parse_speculative_configs(speculative_config)
        if len(specs) > 1:
            lists["speculative_config"] = specs
        elif specs[0] is not None:
            fields["speculative_config"] = specs[0]
        given = {**given, "--speculative-config": next((s for s in specs if s is not None), None)}
    lists.update(_tier_lists(router, kv_offloading_size))
    if router is not None and all(d == 1 for d in lists.get("data_parallel_size", [1])):
        # as `kvsim run` refuses it: every point would run the same (one replica), under each router's name
        raise ConfigError("--router applies only with --data-parallel-size > 1 (every point here has one replica)")
    if kv_offloading_size is not None:  # refused by policies that have no paged prefix cache
        given["--kv-offloading-size"] = kv_offloading_size
    for pol in lists.get("policy", ["continuous"]):
        refuse_irrelevant(pol, fields.get("allocator"), given)
        apply_engine_preset(fields, pol)  # every swept policy reads --engine-version (refused above otherwise)
    check_slos(slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms)
    from kvsim.reports.capacity import SLO, parse_slo_targets

    slo = SLO.of(parse_slo_targets(slo_targets, slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms))
    slo_ttft_p95_ms, slo_tpot_p95_ms = slo.ttft_p95_ms, slo.tpot_p95_ms  # --slo ttft:p95:X is the shorthand
    # other percentiles are computed by each point (a column only when asked: the point ids stay)
    slo_columns = {"slo_percentiles": " ".join(t.spec for t in slo.percentile_ms)} if slo.percentile_ms else {}
    if resume and out is None:
        raise ConfigError("--resume needs --out (the table to finish)")
    if address is not None and executor is not ExecutorName.ray:
        raise ConfigError("--address applies only with --executor ray")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    from kvsim.reports.sweep_runner import check_executor

    check_executor(executor.value, address)
    check_inputs_kept(out, [workload, profile, model])
    table = _table(out)
    check_out_file(out)  # before the work: a bad --out never costs the sweep
    model_specs = [get_model(m) for m in parse_list("--model", model, str)]
    gpu_specs = [get_gpu(g) for g in lists.pop("gpu")]
    check_distinct("--gpu", [g.name for g in gpu_specs], gpu)  # a catalog name in two cases: one GPU
    zipped = parse_zip(zip_, {**lists, "gpu": gpu_specs, "model": model_specs})
    for model_spec in model_specs:
        check_common(seed, max_model_len, model_spec)
    if seeds is not None and ctx.get_parameter_source("seed").name != "DEFAULT":  # it was dropped without a word
        raise ConfigError("give --seed or --seeds, not both (--seeds lists every seed; --seed starts --repeats)")
    seed_list = parse_seeds(seeds, repeats, seed)
    base = EngineConfig(**fields)
    from kvsim.simcore.config import check_numbers

    check_numbers(base)  # the options every point shares: finite and in range before any point runs
    overrides = workload_overrides(
        num_requests=num_requests, rate=None, concurrency=None, burstiness=burstiness,
        input_len=input_len, output_len=output_len, max_tokens=max_tokens, n=n,
        beam_width=beam_width, think_time_s=think_time_s,
    )
    fill = batch_default_fields(engine_version, usage_context, max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens)
    from kvsim.profiles.uncertainty import INTERVAL as BAND_INTERVAL
    from kvsim.simcore.batch_defaults import DEFAULT_USAGE_CONTEXT, multi_step_words

    plan = plan_sweep(
        model_specs, gpu_specs, base, lists, _workload_loader(workload, overrides),
        _profiles(profile, len(model_specs) * len(gpu_specs)), seed_list,
        {"profile": shown(str(profile)) if profile else "default", "slo_ttft_p95_ms": slo_ttft_p95_ms,
         "slo_tpot_p95_ms": slo_tpot_p95_ms, **slo_columns,
         # (columns only when asked: the point ids of other sweeps stay)
         **({"usage_context": usage_context or DEFAULT_USAGE_CONTEXT} if fill else {}),
         **({"error_bars": BAND_INTERVAL} if error_bars else {})}, zipped,
        batch_defaults=(fill, usage_context or DEFAULT_USAGE_CONTEXT) if fill else None,
    )
    from kvsim.cli.options import check_router_workload

    check_router_workload(lists.get("router"), plan.points[0].workload)
    for point in plan.points:  # a request no step can hold: refused before any point runs
        if not point.does_not_fit and point.resolved is not None:
            check_sample_width(point.workload, point.resolved, {"--n": n, "--beam-width": beam_width})
    rows = _run(plan, table, resume, jobs, executor.value, address)
    frame = summarize_points(pd.DataFrame(rows), plan.swept, {t.column: t.key for t in slo.percentile_ms})
    wl = plan.points[0].workload
    # the first point's requests (simcore.simulate's seed split), counted here so the lines do not
    # depend on which process ran the point
    generation = wl.generation_stats(np.random.SeedSequence(plan.points[0].seed).spawn(2)[0])
    for note in wl.notes(generation):
        typer.echo(f"NOTE {note}", err=True)
    warnings = wl.warnings(generation)
    if getattr(wl, "is_session", False):  # too few sessions for a point's own session rate (workloads.sessions)
        warnings += [w for p in plan.points for w in p.workload.warnings({}) if w not in warnings]
    for warning in dict.fromkeys(warnings):
        typer.echo(f"WARNING {warning}", err=True)
    for line in _warning_lines(rows, plan.swept):
        typer.echo(line, err=True)
    best: dict[str, int | None] | None = None  # model -> row of its cheapest passing point
    if slo.targets:
        frame = add_slo(frame, slo_ttft_p95_ms, slo_tpot_p95_ms, slo.percentile_ms)
        best = _cheapest_by_model(frame, [m.name for m in model_specs])
    _print(frame, best, SWEEPABLE, as_json, {
        "model": ", ".join(m.name for m in model_specs), "gpu": ", ".join(g.name for g in gpu_specs),
        "workload": wl.describe(generation),
        "engine_version": base.engine_version if "policy" in lists or base.policy == "continuous" else None,
        "engine_version_given": engine_version is not None,
        "multi_step": multi_step_words(base.engine_version, [base.enable_chunked_prefill]),
        "seeds": seed_list, "slo": {"ttft_p95_ms": slo_ttft_p95_ms, "tpot_p95_ms": slo_tpot_p95_ms,
                                    **({"targets": [t.spec for t in slo.targets]} if slo.percentile_ms else {})},
    }, out)


def _warning_lines(rows: list[dict[str, Any]], swept: list[str]) -> list[str]:
    """Each distinct warning once (numbers aside), with how many points gave it and one of them."""
    import re

    from kvsim.reports.sweep import SWEEPABLE
    from kvsim.reports.sweep_runner import WARNING_SEPARATOR

    groups: dict[str, list[tuple[str, str]]] = {}
    for row in sorted(rows, key=lambda r: (r["point"], r["seed"])):
        text = row.get("warnings")
        if not isinstance(text, str) or not text:
            continue
        label = ", ".join([f"{SWEEPABLE[k][1]}={row[k]}" for k in swept] + [f"seed={row['seed']}"])
        for warning in text.split(WARNING_SEPARATOR):
            groups.setdefault(re.sub(r"\d[\d,.]*", "N", warning), []).append((label, warning))
    lines = []
    for items in groups.values():
        label, example = items[0]
        many = f"{len(items)} of {len(rows)} points, e.g. " if len(items) > 1 else ""
        lines.append(f"WARNING [{many}{label}] {example}")
    return lines


def _table(out: Path | None):
    from kvsim.reports.sweep_table import SweepTable

    return None if out is None else SweepTable(out)


def _run(plan, table, resume: bool, jobs: int | None, executor: str, address: str | None) -> list[dict[str, Any]]:
    """Run the points the table lacks (all without --resume), appending each row as it finishes;
    return every row of the sweep, the table's earlier ones included. The table is locked
    throughout (reports.sweep_table): a second sweep on it is refused."""
    try:  # the open inside: an interrupt as it returns still closes the table
        done_ids = table.open(plan.sweep_id, resume) if table is not None else set()
        return _run_locked(plan, table, done_ids, jobs, executor, address)
    finally:
        if table is not None:
            table.close()  # the lock goes; a table this sweep made and never wrote a row to goes too


def _run_locked(plan, table, done_ids: set[str], jobs: int | None, executor: str,
                address: str | None) -> list[dict[str, Any]]:
    import pandas as pd

    from kvsim.reports.sweep_runner import run_points
    from kvsim.reports.sweep_table import read_table

    missing = [c for c in plan.swept if done_ids and c not in table.columns]
    if missing:  # the summary reads it from the earlier rows: refuse before running the rest
        raise ConfigError(f"--resume: {table.target} has no {missing[0]!r} column (edited by hand?)")
    todo = [p for p in plan.points if p.options["point_id"] not in done_ids]
    progress = _Progress(len(plan.points), len(plan.points) - len(todo))

    def on_result(_: int, row: dict[str, Any]) -> None:
        if table is not None:
            table.append(row)
        progress.step()

    try:
        new_rows = run_points(todo, jobs=jobs, executor=executor, on_result=on_result, address=address)
    finally:
        progress.stop()
    if table is not None:  # every point is in: grid order and one column order, whatever ran it
        ran = next((r for r in new_rows if not r.get("does_not_fit")), None)
        table.finish(list(ran) if ran is not None else None)
    if not done_ids:
        return new_rows
    earlier = read_table(table.target)
    earlier = earlier[earlier["point_id"].isin(done_ids)]
    return [{k: v for k, v in r.items() if not (not isinstance(v, str) and pd.isna(v))}
            for r in earlier.to_dict("records")] + new_rows


def _workload_loader(workload: str | None, overrides: dict[str, Any]):
    """A cell's workload: --workload with the command's overrides and the cell's rate or clients."""
    from kvsim.workloads import load_workload

    def load(load_values: dict[str, Any], max_model_len: int):
        return load_workload(workload, {**overrides, **load_values}, max_model_len=max_model_len)

    return load


def _profiles(path: Path | None, num_pairs: int):
    """A loader per (model, GPU, TP, dtypes), each loaded once; --profile is one file for one
    model, GPU and TP."""
    from kvsim.profiles import check_profile_matches, default_profile, load_named_profile

    cache: dict[tuple[str, str, int, str, str], Any] = {}
    fixed = None
    if path is not None:
        if num_pairs > 1:
            raise ConfigError("--profile is one file for one model on one GPU; sweep --model and --gpu without --profile")
        fixed = load_named_profile(path)

    def profile_for(gpu_spec, tp_: int, model):
        """`model` as the point resolves it (--quantization / --kv-cache-dtype applied)."""
        key = (model.name, gpu_spec.name, tp_, model.weight_dtype, model.kv_dtype)
        if key not in cache:
            if fixed is not None:
                if {k[2:] for k in cache} - {key[2:]}:
                    raise ConfigError("--profile is one file for one TP and dtype; sweep --tp, "
                                      "--kv-cache-dtype or --quantization without --profile")
                check_profile_matches(fixed, model, tp_, gpu_spec)
                cache[key] = fixed
            else:
                cache[key] = default_profile(gpu_spec, model, tp_)
        return cache[key]

    return profile_for


def _cheapest_by_model(frame, models: list[str]) -> dict[str, int | None]:
    """Each model's cheapest passing point (fewest GPUs, then highest throughput): models are
    compared side by side, not against each other's cost."""
    import pandas as pd

    from kvsim.reports.sweep import cheapest_passing

    gpus = [int(g) if not pd.isna(g) else 0 for g in frame["gpus"]]
    if "model" not in frame.columns:
        return {models[0]: cheapest_passing(frame, gpus)}
    out = {}
    for name in models:
        rows = [i for i in range(len(frame)) if frame["model"].iloc[i] == name]
        part = frame.iloc[rows]
        found = cheapest_passing(part, [gpus[i] for i in rows])
        out[name] = None if found is None else rows[found]
    return out


def _print(frame, best: dict[str, int | None] | None, sweepable, as_json: bool, context: dict[str, Any],
           out: Path | None) -> None:
    slo = "meets_slo" in frame.columns
    several = "model" in frame.columns
    if as_json:
        doc = {**context, "points": _records(frame), "cheapest_passing": None}
        if best is not None:
            found = {m: (None if i is None else _records(frame.iloc[[i]])[0]) for m, i in best.items()}
            doc["cheapest_passing"] = found if several else next(iter(found.values()))
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    wl, seeds = context["workload"], context["seeds"]
    said = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))} ({interval_note(len(seeds))})"
    version = context.get("engine_version")
    engine = "" if version is None else f", engine {version}" + ("" if context.get("engine_version_given") else
                                                                 " (default)")
    if version is not None and context.get("multi_step"):  # vllm-0.6: whether its decode rounds are modelled
        engine += f" ({context['multi_step']})"
    typer.echo(f"Sweep: {context['model']} on {context['gpu']}, workload {wl.get('name')}{engine}, "
               f"{said}; every point serves the same requests")
    typer.echo(format_table(frame))
    if slo and best is not None:
        names = {col for _, col in sweepable.values()}
        for model_name, index in best.items():
            whose = f" for {model_name}" if several else ""
            if index is None:
                typer.echo(f"No point{whose} meets the SLO.")
                continue
            row = frame.iloc[index]
            swept = ", ".join(f"{col}={row[col]}" for col in frame.columns if col in names and col != "model")
            typer.echo(f"Cheapest passing point{whose} (fewest GPUs, then highest throughput): {swept} "
                       f"({row['output_tok_s']:,.1f} output tok/s)")
    if out is not None:
        typer.echo(f"Wrote {out}", err=True)
