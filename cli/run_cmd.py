"""`kvsim run`: simulate one engine replica serving a workload and print a vLLM-style summary.

No `from __future__ import annotations` here: typer reads `run`'s ~50 annotations at every start,
and as strings each would be compiled and evaluated (twice) on every `kvsim run`; evaluated once
when the module is imported, they cost nothing per run.
"""

import json
from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli.errors import EMPTY_RESULT_EXIT, fail
from kvsim.cli.options import (
    Allocator,
    AsJson,
    BatchTimeout,
    BeamWidth,
    Burstiness,
    Concurrency,
    EnableChunkedPrefill,
    EnablePrefixCaching,
    EngineVersion,
    EngineCore,
    EngineCoreOpt,
    Goodput,
    Gpu,
    InputLen,
    KvCacheDtype,
    KvCacheDtypeOpt,
    MaxBatchSize,
    MaxModelLen,
    MaxNumBatchedTokens,
    MaxTokens,
    Model,
    N,
    NumRequests,
    OutputLen,
    PipelineParallel,
    PolicyName,
    Preemption,
    ProfilePath,
    QuantizationOpt,
    Rate,
    Reservation,
    RouterOpt,
    SloTpotP95,
    SloTtftP95,
    SwapSpace,
    ThinkTime,
    Workload,
    check_common,
    check_inputs_kept,
    check_slos,
    engine_options,
    parse_goodput,
    apply_engine_preset,
    refuse_irrelevant,
    workload_overrides,
)
from kvsim.cli.output import (
    RUN_FILES,
    LiveProgress,
    check_out_folder,
    configured_load,
    describe_run,
    format_summary,
    rejected_lines,
    request_columns,
    result_problems,
    run_staging,
    step_columns,
    stream_tables,
    write_outputs,
)
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.parallel import check_deployment
from kvsim.simcore.specs import EngineConfig


def run(
    ctx: typer.Context,
    model: Model = "llama3-8b",
    gpu: Gpu = "H100-SXM-80GB",
    tp: Annotated[int, typer.Option("--tp", "--tensor-parallel-size", help="GPUs per replica.")] = 1,
    pp: PipelineParallel = 1,
    dp: Annotated[int, typer.Option("--dp", "--data-parallel-size", help="Engine replicas behind a router (GPUs = tp x pp x dp).")] = 1,
    kv_cache_dtype: KvCacheDtypeOpt = KvCacheDtype.auto,
    quantization: QuantizationOpt = None,
    router: RouterOpt = None,
    policy: Annotated[PolicyName, typer.Option(help="Batching policy.")] = PolicyName.continuous,
    allocator: Allocator = None,
    reservation: Reservation = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block (power of two).")] = 16,
    gpu_memory_utilization: Annotated[float, typer.Option(help="Share of GPU memory the engine may use, (0, 1].")] = 0.90,
    max_num_seqs: Annotated[int, typer.Option(help="Most sequences in one step.")] = 256,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    enable_chunked_prefill: EnableChunkedPrefill = None,
    enable_prefix_caching: EnablePrefixCaching = None,
    engine_version: EngineVersion = None,
    error_bars: Annotated[bool, typer.Option("--error-bars/--no-error-bars", help="Also run with every step time at the 5th and 95th percentile of the profile's stated error (profiles/uncertainty.py) and print each headline metric's 90% band.")] = True,
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
    seed: Annotated[int, typer.Option(help="Seed for every random stream.")] = 0,
    profile: ProfilePath = None,
    goodput: Goodput = None,
    slo_ttft_p95_ms: SloTtftP95 = None,
    slo_tpot_p95_ms: SloTpotP95 = None,
    find_max_rate: Annotated[bool, typer.Option("--find-max-rate", help="Search the highest rate (same requests, rescaled arrivals) at which the run is sustained and meets the --slo-* / --goodput targets; --rate is where the search starts.")] = False,
    tolerance: Annotated[float, typer.Option(help="--find-max-rate: relative width of the answer's bracket.")] = 0.02,
    out: Annotated[Path | None, typer.Option(help="Folder for requests.csv, steps.csv and summary.json.")] = None,
    as_json: AsJson = False,
    exact_steps: Annotated[bool, typer.Option("--exact-steps", help="One simulation event per engine step (the reference mode; slower, same results).")] = False,
    engine_core: EngineCoreOpt = EngineCore.auto,
) -> None:
    """Simulate a deployment (one engine replica, or --dp replicas behind a router) serving a workload;
    print vLLM's KV cache size and a `vllm bench serve`-style summary."""
    from kvsim.profiles import check_profile_matches, default_profile
    from kvsim.simcore.latency import load_profile
    from kvsim.workloads import load_workload

    fields, given = engine_options(
        allocator, reservation, max_num_batched_tokens, enable_chunked_prefill, swap_space,
        preemption_mode, max_model_len, max_batch_size, batch_timeout_s, enable_prefix_caching, engine_version,
    )
    refuse_irrelevant(policy.value, fields.get("allocator"), given)
    apply_engine_preset(fields, policy.value)
    goodput_ms = parse_goodput(goodput, ctx.args)
    check_slos(slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms)
    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance must be in (0, 1), got {tolerance}")
    if not find_max_rate and ctx.get_parameter_source("tolerance").name == "COMMANDLINE":
        raise ConfigError("--tolerance applies only with --find-max-rate")  # it would be ignored
    model_spec = get_model(model)
    gpu_spec = get_gpu(gpu)
    check_common(seed, max_model_len, model_spec)
    if router is not None and dp == 1:
        raise ConfigError("--router applies only with --data-parallel-size > 1")
    if router is not None:
        fields["router"] = router.value
    config = EngineConfig(
        block_size=block_size, gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs, tensor_parallel_size=tp, data_parallel_size=dp,
        pipeline_parallel_size=pp, kv_cache_dtype=kv_cache_dtype.value,
        quantization=quantization.value if quantization else None, policy=policy.value, **fields,
    )
    model_spec = config.resolve_model(model_spec)
    check_deployment(model_spec, gpu_spec, config)  # FP8 on this GPU, TP inside a node: before pricing
    from kvsim.simcore.config import resolve

    resolved = resolve(model_spec, gpu_spec, config)  # every check simulate() makes; memory planned once
    overrides = workload_overrides(
        num_requests=num_requests, rate=rate, concurrency=concurrency, burstiness=burstiness,
        input_len=input_len, output_len=output_len, max_tokens=max_tokens, n=n,
        beam_width=beam_width, think_time_s=think_time_s,
    )
    wl = load_workload(workload, overrides, max_model_len=config.resolved_max_model_len(model_spec))
    if profile is not None:
        prof = load_profile(profile)
        check_profile_matches(prof, model_spec, tp, gpu_spec)
    else:
        prof = default_profile(gpu_spec, model_spec, tp)

    from kvsim.reports.capacity import SLO

    slo = SLO(slo_ttft_p95_ms, slo_tpot_p95_ms, tuple(goodput_ms.items()))
    from kvsim.simcore import records

    if goodput_ms and int(wl.num_requests) > records.REQUEST_ROWS_CAP:  # before any work
        raise ConfigError(f"--goodput needs every request row in memory; {int(wl.num_requests):,} requests "
                          f"exceed the {records.REQUEST_ROWS_CAP:,} kept (use --slo-ttft-p95-ms / --slo-tpot-p95-ms)")
    memory = resolved.memory
    out_files = ("rates.csv", "max_rate.json") if find_max_rate else RUN_FILES
    check_inputs_kept(out, [workload, profile, model], out_files)
    check_out_folder(out, out_files)  # before any work
    if find_max_rate:
        if engine_core is not EngineCore.auto:
            raise ConfigError("--engine-core applies to one run, not to --find-max-rate's search")
        _find_max_rate(model_spec, gpu_spec, resolved, wl, prof, seed, slo, tolerance, out, as_json)
        return
    if engine_core is EngineCore.c:  # refuse before any output what the compiled core cannot run
        from kvsim.simcore.simulate import prepare

        prepare(model_spec, gpu_spec, resolved, wl, prof, seed=seed, exact_steps=exact_steps,
                engine_core="c").choose_core()
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    say(describe_run(wl.describe(), config.to_dict(), model_spec, gpu_spec.name))
    say(f"Profile: {prof.label} sha256:{prof.sha256[:12]}")
    say(memory.describe())
    if pp > 1:
        say(f"Pipeline: {pp} stages x TP {tp}, layers {'/'.join(map(str, memory.layers_per_stage))}")
    if dp > 1:
        layout = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "")
        say(f"Replicas: {dp} x {layout} ({config.num_gpus} GPUs), router {config.router}; "
            "KV cache is per replica")
    with run_staging(out) as staging:  # rows past the memory caps stream into it; swapped in at the end
        result = _simulate(model_spec, gpu_spec, resolved, wl, prof, seed, exact_steps, staging, engine_core.value)
        bands = _error_bars(model_spec, gpu_spec, resolved, wl, prof, seed, exact_steps, engine_core.value,
                            result) if error_bars else None
        fatal = _report(result, wl, slo, seed, out, as_json, staging, bands)
    if fatal is not None:
        fail(fatal, EMPTY_RESULT_EXIT)


def _simulate(model_spec, gpu_spec, resolved, wl, prof, seed, exact_steps, staging, engine_core):
    from kvsim.simcore.simulate import simulate

    progress = LiveProgress("simulating", int(wl.num_requests), "requests finished")
    try:
        return simulate(model_spec, gpu_spec, resolved, wl, prof, seed=seed, progress=progress.update,
                        exact_steps=exact_steps, stream=stream_tables(staging), engine_core=engine_core)
    finally:
        progress.stop()


def _error_bars(model_spec, gpu_spec, resolved, wl, prof, seed, exact_steps, engine_core, result) -> dict:
    """The run again with every step time at the low and high end of the profile's stated error
    (profiles/uncertainty.py): each headline metric's [low, high] over the three runs."""
    from kvsim.profiles.uncertainty import BAND_METRICS, INTERVAL, band, profile_error, scaled_profile
    from statistics import NormalDist

    from kvsim.simcore.simulate import simulate

    err = profile_error(prof)
    z = NormalDist().inv_cdf(0.5 + INTERVAL / 2)
    factors = (err.factor(-z), err.factor(z))
    runs = [simulate(model_spec, gpu_spec, resolved, wl, scaled_profile(prof, f), seed=seed,
                     exact_steps=exact_steps, engine_core=engine_core).summary for f in factors]
    return {"interval": INTERVAL, "step_time_factors": list(factors), **err.to_dict(),
            "metrics": {k: band([result.summary.get(k), *(r.get(k) for r in runs)])
                        for k in BAND_METRICS if result.summary.get(k) is not None}}


def _report(result, wl, slo, seed: int, out: Path | None, as_json: bool, staging, bands: dict | None = None) -> str | None:
    """Print (and write) a finished run; returns the fatal reason of a run that served nothing."""
    generation = result.record["workload"]["generation"]  # what generating the requests counted
    for note in wl.notes(generation):
        typer.echo(f"NOTE {note}", err=True)
    for warning in wl.warnings(generation):
        typer.echo(f"WARNING {warning}", err=True)
    problems, fatal = result_problems(result.summary, result.records, result.totals.duration_s)
    for warning in [*result.warnings, *problems]:
        typer.echo(f"WARNING {warning}", err=True)
    for line in rejected_lines(result.records):
        typer.echo(line, err=True)
    if result.summary.get("saturation") == "overloaded":
        s = result.summary
        typer.echo(f"WARNING overloaded: {s['offered_rate']:.2f} req/s offered, {s['completed_rate_warm']:.2f} "
                   "completed once warm; the queue grows for as long as the load lasts", err=True)
    from kvsim.reports.capacity import summary_with_goodput
    from kvsim.reports.regime import regime_of

    regime = regime_of(result)
    summary = {
        **configured_load(result.record["workload"]),
        **summary_with_goodput(result, slo), "regime": regime.label, "peak_kv_use": regime.peak_kv_use,
        "kv_blocked_share": regime.kv_blocked_share,
    }
    if bands is not None:
        summary["error_bars"] = bands
    document = {"summary": summary, "record": result.record, "warnings": result.warnings}
    if out is not None:
        write_outputs(out, {
            "requests.csv": lambda: request_columns(result), "steps.csv": lambda: step_columns(result),
            "summary.json": document,
        }, staging)
    if as_json:
        typer.echo(json.dumps(document, indent=2, default=str))
    else:
        typer.echo(format_summary(summary))
        typer.echo(f"Simulated in {result.wall_s:.2f} s (seed {seed}).")
        if out is not None:
            typer.echo(f"Wrote {out}/requests.csv, steps.csv, summary.json")
    return fatal


def _find_max_rate(model_spec, gpu_spec, config, wl, prof, seed, slo, tolerance, out, as_json) -> None:
    """`kvsim run --find-max-rate`: the rate search of reports.capacity on this deployment."""
    from kvsim.reports.capacity import max_sustainable_rate, simulator
    from kvsim.simcore.simulate import KVSIM_VERSION

    start = getattr(wl.arrival, "rate", None) or getattr(wl.arrival, "mean_rate", None) or 1.0
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    say(f"Searching the highest sustained rate meeting {slo.text()} (tolerance {100 * tolerance:g}%, "
        f"{wl.num_requests} requests per run, seed {seed})")
    found = max_sustainable_rate(simulator(model_spec, gpu_spec, config, wl, prof, seed, slo), slo, start, tolerance)
    rows = [{
        "rate": p.rate, "passed": p.passed, "saturation": p.summary.get("saturation"),
        "p95_ttft_ms": p.summary.get("p95_ttft_ms"), "p95_tpot_ms": p.summary.get("p95_tpot_ms"),
        "request_goodput": p.summary.get("request_goodput"), "why_not": "; ".join(p.reasons),
    } for p in found.points]
    document = {
        "max_sustainable_rate": found.max_rate, "tolerance": tolerance, "at_least": found.at_least,
        "binding": found.binding, "slo": slo.describe(), "num_runs": found.num_runs, "runs": rows,
        "record": {"kvsim_version": KVSIM_VERSION, "seed": seed, "model": model_spec.to_dict(),  # as summary.json's
                   "gpu": {"name": gpu_spec.name, "memory_gib": gpu_spec.memory_gib},
                   "config": config.engine.to_dict(),
                   "profile": {"path": prof.path, "sha256": prof.sha256, "source": prof.source, "label": prof.label},
                   "workload": wl.describe()},
    }
    if out is not None:
        import pandas as pd

        write_outputs(out, {"rates.csv": pd.DataFrame(rows), "max_rate.json": document})
    if as_json:
        typer.echo(json.dumps(document, indent=2, default=str))
        return
    for row in rows:
        mark = "pass" if row["passed"] else "fail"
        ttft, tpot = row["p95_ttft_ms"], row["p95_tpot_ms"]
        typer.echo(f"  {row['rate']:9.3f} req/s  {mark}  TTFT p95 {ttft if ttft is None else f'{ttft:,.0f}'} ms  "
                   f"TPOT p95 {tpot if tpot is None else f'{tpot:,.1f}'} ms  {row['why_not']}")
    if found.max_rate == 0:
        typer.echo(f"No rate meets the SLO: {found.binding}")
    elif found.at_least:
        typer.echo(f"Max sustainable rate: at least {found.max_rate:.3f} req/s (search ceiling reached)")
    else:
        typer.echo(f"Max sustainable rate: {found.max_rate:.3f} req/s (fails at "
                   f"{found.max_rate * (1 + tolerance):.3f}: {found.binding}); {found.num_runs} runs")


__all__ = ["run"]
