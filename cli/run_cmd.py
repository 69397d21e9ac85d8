"""`kvsim run`: simulate one engine replica serving a workload and print a vLLM-style summary.

No `from __future__ import annotations` here: typer reads `run`'s ~50 annotations at every start,
and as strings each would be compiled and evaluated (twice) on every `kvsim run`; evaluated once
when the module is imported, they cost nothing per run.
"""

import json
import math
from enum import Enum
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
    EngineCore,
    EngineCoreOpt,
    EngineVersion,
    Goodput,
    Gpu,
    InputLen,
    KvCacheDtype,
    KvCacheDtypeOpt,
    KvOffloadingSize,
    MaxBatchSize,
    MaxModelLen,
    MaxNumBatchedTokens,
    MaxTokens,
    Model,
    N,
    NumRequests,
    OutputLen,
    PipelineParallel,
    Placement,
    PolicyName,
    Preemption,
    ProfilePath,
    QuantizationOpt,
    Rate,
    Reservation,
    RouterOpt,
    SloTargets,
    SloTpotP95,
    SloTtftP95,
    SpeculativeConfigOpt,
    SwapSpace,
    ThinkTime,
    UsageContextOpt,
    Workload,
    apply_engine_preset,
    batch_default_fields,
    check_common,
    check_inputs_kept,
    check_router_workload,
    check_sample_width,
    check_slos,
    engine_options,
    parse_goodput,
    refuse_irrelevant,
    workload_overrides,
)
from kvsim.cli.output import (
    RUN_FAMILY,
    RUN_FILES,
    LiveProgress,
    check_out_folder,
    configured_load,
    describe_run,
    format_summary,
    rate_unit,
    rejected_lines,
    request_columns,
    result_problems,
    run_staging,
    step_columns,
    stream_tables,
    write_outputs,
)
from kvsim.simcore.batch_defaults import engine_text
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.parallel import check_deployment
from kvsim.simcore.specs import EngineConfig

SAVE_RESULT_MAX_REQUESTS = 100_000  # ~300 tokens each: ~240 MB of token times


class DatasetName(str, Enum):
    random = "random"
    sharegpt = "sharegpt"
    sonnet = "sonnet"


def run(
    ctx: typer.Context,
    model: Model = "llama3-8b",
    gpu: Gpu = "H100-SXM-80GB",
    tp: Annotated[int, typer.Option("--tp", "--tensor-parallel-size", help="GPUs per replica.")] = 1,
    pp: PipelineParallel = 1,
    dp: Annotated[int, typer.Option("--dp", "--data-parallel-size", help="Engine replicas behind a router (GPUs = tp x pp x dp).")] = 1,
    enable_expert_parallel: Annotated[bool, typer.Option("--enable-expert-parallel", help="MoE models: shard the routed experts over all tp x dp GPUs (vLLM's flag); all-to-all dispatch/combine priced from DeepEP's measured bandwidths.")] = False,
    kv_cache_dtype: KvCacheDtypeOpt = KvCacheDtype.auto,
    quantization: QuantizationOpt = None,
    router: RouterOpt = None,
    policy: Annotated[PolicyName, typer.Option(help="Batching policy.")] = PolicyName.continuous,
    allocator: Allocator = None,
    reservation: Reservation = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block (power of two).")] = 16,
    gpu_memory_utilization: Annotated[float, typer.Option(help="Share of GPU memory the engine may use, (0, 1].")] = 0.90,
    max_num_seqs: Annotated[int | None, typer.Option(help="Most sequences in one step. [default: the engine version's vLLM default on the GPU: 1024 on an H100 for vllm-v1, 256 for vllm-0.6; 256 for static / dynamic batching]")] = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    enable_chunked_prefill: EnableChunkedPrefill = None,
    enable_prefix_caching: EnablePrefixCaching = None,
    engine_version: EngineVersion = None,
    usage_context: UsageContextOpt = None,
    error_bars: Annotated[bool, typer.Option("--error-bars/--no-error-bars", help="Also run with every step time at the 5th and 95th percentile of the profile's stated error (profiles/uncertainty.py) and print each headline metric's 90% band.")] = True,
    swap_space: SwapSpace = None,
    kv_offloading_size: KvOffloadingSize = None,
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
    slo_targets: SloTargets = None,
    find_max_rate: Annotated[bool, typer.Option("--find-max-rate", help="Search the highest rate (same requests, rescaled arrivals) at which the run is sustained and meets the --slo-* / --goodput targets; --rate is where the search starts.")] = False,
    tolerance: Annotated[float, typer.Option(help="--find-max-rate: relative width of the answer's bracket.")] = 0.02,
    out: Annotated[Path | None, typer.Option(help="Folder for requests.csv, steps.csv and summary.json.")] = None,
    as_json: AsJson = False,
    exact_steps: Annotated[bool, typer.Option("--exact-steps", help="One simulation event per engine step (the reference mode; slower, same results).")] = False,
    engine_core: EngineCoreOpt = EngineCore.auto,
    autoscale: Annotated[bool, typer.Option("--autoscale", help="Start and drain replicas during the run (an HPA-like policy; simcore/autoscale.py); reports replicas over time, hourly SLO attainment, GPU-hours and $, against static fleets sized for the peak and the mean.")] = False,
    min_replicas: Annotated[int | None, typer.Option(help="--autoscale: replicas always up (and at the start). [default: 1]")] = None,
    max_replicas: Annotated[int | None, typer.Option(help="--autoscale: most replicas. [default: 4]")] = None,
    provisioning_delay: Annotated[float | None, typer.Option(help="--autoscale: seconds for a new replica's node to come up, before its model loads (weights / model_load_gbps) and warms up. [default: 120]")] = None,
    autoscale_config: Annotated[str | None, typer.Option(help="--autoscale: JSON with metric (inflight | kv), target, interval_s, tolerance, scale_up_cooldown_s and scale_down_cooldown_s (the HPA's scale-up / scale-down stabilization windows, 0 / 300 s), scale_up_percent, scale_up_pods, scale_up_period_s (100, 4, 15), scale_down_percent, scale_down_period_s (100, 15), model_load_gbps, warmup_s, ttft_slo_ms, tpot_slo_ms, price_usd_per_gpu_hour.")] = None,
    speculative_config: SpeculativeConfigOpt = None,
    compare_no_spec: Annotated[bool, typer.Option("--compare-no-spec", help="With --speculative-config: run the same requests again without speculation and report the speed-up (TPOT, ITL, throughput).")] = False,
    prefill_replicas: Annotated[int | None, typer.Option(help="Disaggregated prefill/decode: prefill instances (vLLM kv_producer); with --decode-replicas.")] = None,
    prefill_tp: Annotated[int | None, typer.Option(help="Disaggregated: GPUs per prefill instance. [default: --tp]")] = None,
    decode_replicas: Annotated[int | None, typer.Option(help="Disaggregated: decode instances (vLLM kv_consumer); with --prefill-replicas.")] = None,
    decode_tp: Annotated[int | None, typer.Option(help="Disaggregated: GPUs per decode instance. [default: --tp]")] = None,
    disagg_placement: Annotated[Placement | None, typer.Option(help="Disaggregated: where the pools sit, which prices the KV transfer (NVLink or one NIC per GPU). [default: same-node when all GPUs fit in one node]")] = None,
    prefill_profile: Annotated[Path | None, typer.Option(help="Disaggregated: the prefill pool's latency profile. [default: the committed one for its TP]")] = None,
    decode_profile: Annotated[Path | None, typer.Option(help="Disaggregated: the decode pool's latency profile. [default: the committed one for its TP]")] = None,
    prefill_max_num_batched_tokens: Annotated[int | None, typer.Option(help="Disaggregated: the prefill pool's step token budget. [default: --max-num-batched-tokens]")] = None,
    decode_max_num_seqs: Annotated[int | None, typer.Option(help="Disaggregated: the decode pool's --max-num-seqs. [default: --max-num-seqs]")] = None,
    dataset_name: Annotated[DatasetName | None, typer.Option("--dataset-name", help="vllm bench serve's datasets instead of --workload: random (uniform lengths, --random-*) or sharegpt (a ShareGPT JSON file, --dataset-path); every request at t=0 unless --request-rate / --max-concurrency, as vLLM's default --request-rate inf.", rich_help_panel="vllm bench serve")] = None,
    dataset_path: Annotated[Path | None, typer.Option("--dataset-path", help="--dataset-name sharegpt: the ShareGPT JSON file (list of {conversations: [{from, value}, ...]}); token counts estimated at 4 characters per token (1 per CJK character).", rich_help_panel="vllm bench serve")] = None,
    random_input_len: Annotated[int | None, typer.Option("--random-input-len", help="--dataset-name random: prompt length. [default: 1024]", rich_help_panel="vllm bench serve")] = None,
    random_output_len: Annotated[int | None, typer.Option("--random-output-len", help="--dataset-name random: output length. [default: 128]", rich_help_panel="vllm bench serve")] = None,
    random_range_ratio: Annotated[float | None, typer.Option("--random-range-ratio", help="--dataset-name random: lengths uniform in [L(1-r), L(1+r)], r in [0, 1). [default: 0]", rich_help_panel="vllm bench serve")] = None,
    sonnet_input_len: Annotated[int | None, typer.Option("--sonnet-input-len", help="--dataset-name sonnet: prompt length in tokens (estimated, 4 characters per token). [default: 550]", rich_help_panel="vllm bench serve")] = None,
    sonnet_output_len: Annotated[int | None, typer.Option("--sonnet-output-len", help="--dataset-name sonnet: output length. [default: 150]", rich_help_panel="vllm bench serve")] = None,
    sonnet_prefix_len: Annotated[int | None, typer.Option("--sonnet-prefix-len", help="--dataset-name sonnet: tokens of the head every prompt shares (a real shared prefix, cached). [default: 200]", rich_help_panel="vllm bench serve")] = None,
    metric_percentiles: Annotated[str | None, typer.Option("--metric-percentiles", help="Percentiles printed and in --json, e.g. 50,90,99. [default: 95,99]", rich_help_panel="vllm bench serve")] = None,
    percentile_metrics: Annotated[str | None, typer.Option("--percentile-metrics", help="Metrics whose statistics are printed: any of ttft,tpot,itl,e2el. [default: all four]", rich_help_panel="vllm bench serve")] = None,
    save_result: Annotated[bool, typer.Option("--save-result", help="Write vLLM's result JSON (flat keys and per-request arrays: ttfts, itls, input_lens, ...); records every token's time (at most 100,000 requests).", rich_help_panel="vllm bench serve")] = False,
    result_dir: Annotated[Path | None, typer.Option("--result-dir", help="--save-result: folder of the result file. [default: the current folder]", rich_help_panel="vllm bench serve")] = None,
    result_filename: Annotated[str | None, typer.Option("--result-filename", help="--save-result: file name. [default: kvsim-{rate}qps[-concurrency{N}]-{model}-{date}.json, vLLM's pattern]", rich_help_panel="vllm bench serve")] = None,
    fleet: Annotated[str | None, typer.Option("--fleet", help="A heterogeneous fleet behind one router: GPU:TP:REPLICAS groups, e.g. H100-SXM-80GB:4:2,H200-141GB:2:1; each replica with its own profile, KV cache and price (instead of --gpu / --tp / --dp).")] = None,
) -> None:
    """Simulate a deployment (one engine replica, or --dp replicas behind a router) serving a workload;
    print vLLM's KV cache size and a `vllm bench serve`-style summary."""
    from kvsim.profiles import check_profile_matches, default_profile, draft_profile, load_named_profile
    from kvsim.workloads import load_workload

    disagg = {name: value for name, value in (
        ("--prefill-replicas", prefill_replicas), ("--prefill-tp", prefill_tp), ("--decode-replicas", decode_replicas),
        ("--decode-tp", decode_tp), ("--disagg-placement", disagg_placement), ("--prefill-profile", prefill_profile),
        ("--decode-profile", decode_profile), ("--prefill-max-num-batched-tokens", prefill_max_num_batched_tokens),
        ("--decode-max-num-seqs", decode_max_num_seqs)) if value is not None}
    if fleet is not None:
        given_layout = [flag for flag, name in (("--gpu", "gpu"), ("--tp", "tp"), ("--dp", "dp"), ("--pp", "pp"),
                                                ("--profile", "profile"))
                        if ctx.get_parameter_source(name).name == "COMMANDLINE"]
        for flag, on in (("--find-max-rate", find_max_rate), ("--save-result", save_result),
                         ("--speculative-config", speculative_config is not None), ("disaggregation", bool(disagg))):
            if on:
                given_layout.append(flag)
        if given_layout:
            raise ConfigError(f"--fleet sets each group's GPU, TP and replicas itself: not with {given_layout[0]}")
    if disagg:
        _check_disagg(ctx, disagg, prefill_replicas, decode_replicas, dp, pp, profile, find_max_rate, policy)
        if save_result:
            raise ConfigError("--save-result does not apply to a disaggregated run yet")
        if speculative_config is not None:
            raise ConfigError("--speculative-config is not modelled with disaggregated prefill/decode yet")
        if autoscale:
            raise ConfigError("--autoscale does not apply to a disaggregated run yet (pools of fixed size)")
        for flag, value in (("--n", n), ("--beam-width", beam_width)):  # simcore.disagg rejects each request
            if value is not None and value > 1:
                raise ConfigError(f"{flag} {value}: disaggregated serving runs one sequence per request (no parallel "
                                  "sampling or beam search); every request would be rejected")
    fields, given = engine_options(
        allocator, reservation, max_num_batched_tokens, enable_chunked_prefill, swap_space,
        preemption_mode, max_model_len, max_batch_size, batch_timeout_s, enable_prefix_caching,
        kv_offloading_size, engine_version=engine_version,
    )
    from kvsim.simcore.speculative import parse_speculative_config

    spec = parse_speculative_config(speculative_config)
    if spec is not None:
        fields["speculative_config"] = spec
    elif compare_no_spec:
        raise ConfigError("--compare-no-spec applies only with --speculative-config")
    refuse_irrelevant(policy.value, fields.get("allocator"), {**given, "--speculative-config": spec})
    apply_engine_preset(fields, policy.value)
    goodput_ms = parse_goodput(goodput, ctx.args)
    check_slos(slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms)
    from kvsim.reports.capacity import MIN_TOLERANCE, parse_slo_targets

    targets = parse_slo_targets(slo_targets, slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms)
    if slo_targets and not find_max_rate:  # one run prints every percentile: --metric-percentiles
        raise ConfigError("--slo applies only with --find-max-rate (a single run prints any percentile with "
                          "--metric-percentiles)")

    if not MIN_TOLERANCE <= tolerance < 1:  # NaN fails too
        raise ConfigError(f"--tolerance must be from {MIN_TOLERANCE:g} to below 1, got {tolerance}")
    if not find_max_rate and ctx.get_parameter_source("tolerance").name == "COMMANDLINE":
        raise ConfigError("--tolerance applies only with --find-max-rate")  # it would be ignored
    from kvsim.cli.autoscale_out import parse_autoscale

    scaling, scaling_extras = parse_autoscale(autoscale, min_replicas, max_replicas, provisioning_delay,
                                              autoscale_config)
    if scaling is not None and dp != 1:
        raise ConfigError("--autoscale sizes the replicas itself: give --min-replicas / --max-replicas, not --dp")
    if scaling is not None and router is not None and router.value != "least-loaded":
        # (on a --fleet it was recorded and ignored: simcore.autoscale routes every request itself)
        raise ConfigError(f"--router {router.value} does not apply with --autoscale: the autoscaler sends each request "
                          "to the least-loaded active replica (simcore/autoscale.py)")
    model_spec = get_model(model)
    gpu_spec = get_gpu(gpu)
    check_common(seed, max_model_len, model_spec)
    if router is not None and dp == 1 and not disagg and fleet is None and scaling is None:
        raise ConfigError("--router applies only with --data-parallel-size > 1 (or to the prefill pool of a "
                          "disaggregated run)")
    if router is not None and disagg and prefill_replicas == 1:  # it was recorded as the prefill router, unused
        raise ConfigError("--router applies to a disaggregated run's prefill pool only with --prefill-replicas > 1 "
                          "(one prefill instance takes every request; the decode pool's router is least-loaded)")
    if router is not None:
        fields["router"] = router.value
    config = EngineConfig(
        block_size=block_size, gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=256 if max_num_seqs is None else max_num_seqs, tensor_parallel_size=tp, data_parallel_size=dp,
        pipeline_parallel_size=pp, kv_cache_dtype=kv_cache_dtype.value,
        quantization=quantization.value if quantization else None, policy=policy.value,
        enable_expert_parallel=enable_expert_parallel, **fields,
    )
    model_spec = config.resolve_model(model_spec)
    fill = batch_default_fields(engine_version, usage_context, max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens)
    from kvsim.simcore.batch_defaults import DEFAULT_USAGE_CONTEXT, apply_batch_defaults

    if fill and fleet is None:  # vLLM's per-GPU step limits for those not given (simcore/batch_defaults.py)
        config = apply_batch_defaults(config, gpu_spec, model_spec, fill, usage_context or DEFAULT_USAGE_CONTEXT)

    def assumed(cfg, gpu_, prof_=None, filled=fill):
        """What this run assumes of the engine (simcore.batch_defaults.engine_assumptions)."""
        return _assumed(cfg, model_spec, gpu_, prof_, filled, usage_context, engine_version is not None)

    from kvsim.simcore.config import resolve

    if scaling is not None and scaling.metric == "kv" and (config.policy != "continuous" or config.allocator != "paged"):
        # (simcore.autoscale refuses it too, but only once the replicas are built: after the header)
        raise ConfigError("--autoscale-config: metric kv needs the paged KV cache (its block use is the metric): "
                          "--policy continuous --allocator paged")
    fleet_groups = None
    if fleet is not None:  # each group checked and planned on its own GPU and TP (simcore/fleet.py)
        from kvsim.simcore.fleet import parse_fleet, resolve_fleet

        fleet_groups = resolve_fleet(get_model(model), parse_fleet(fleet), config, fill,
                                     usage_context or DEFAULT_USAGE_CONTEXT)
        model_spec, gpu_spec = fleet_groups[0][0].model, fleet_groups[0][0].gpu
        config = fleet_groups[0][0].engine
        resolved = fleet_groups[0][0]
        if scaling is not None:  # the pool is the fleet, in its order (simcore.autoscale)
            from dataclasses import replace

            total = sum(n for _, _, n in fleet_groups)
            if max_replicas is not None and max_replicas != total:
                raise ConfigError(f"--autoscale over a --fleet scales its {total} replicas: --max-replicas must be "
                                  f"{total} (or left out), got {max_replicas}")
            if scaling.min_replicas > total:
                raise ConfigError(f"--min-replicas ({scaling.min_replicas}) is more than the fleet's {total} replicas")
            scaling = replace(scaling, max_replicas=total)
    elif not disagg:  # (a disaggregated run checks and plans each pool: _run_disagg)
        check_deployment(model_spec, gpu_spec, config)  # FP8 on this GPU, TP inside a node: before pricing
        resolved = resolve(model_spec, gpu_spec, config)  # every check simulate() makes; memory planned once
    if scaling is not None:  # before the header, which prints the cold start (simcore.autoscale)
        for group in [g for g, _, _ in fleet_groups] if fleet_groups is not None else [resolved]:
            scaling.check_cold_start(group.memory.weights_bytes_per_gpu)
    overrides = workload_overrides(
        num_requests=num_requests, rate=rate, concurrency=concurrency, burstiness=burstiness,
        input_len=input_len, output_len=output_len, max_tokens=max_tokens, n=n,
        beam_width=beam_width, think_time_s=think_time_s,
    )
    from kvsim.cli.bench_result import parse_metrics, parse_percentiles

    percentiles, metrics = parse_percentiles(metric_percentiles), parse_metrics(percentile_metrics)
    if not save_result and (result_dir is not None or result_filename is not None):
        raise ConfigError("--result-dir / --result-filename apply only with --save-result")
    if save_result and find_max_rate:
        raise ConfigError("--save-result writes one run's result, not --find-max-rate's search")
    if find_max_rate:  # what the search would ignore (it ran the fixed deployment, printed its p95s only)
        printed = "its rows show the p95s; its SLO is --slo / --goodput"
        for flag, on, why in (
                ("--autoscale", autoscale, "yet"), ("--compare-no-spec", compare_no_spec, "yet"),
                ("--metric-percentiles", ctx.get_parameter_source("metric_percentiles").name == "COMMANDLINE", printed),
                ("--percentile-metrics", ctx.get_parameter_source("percentile_metrics").name == "COMMANDLINE", printed)):
            if on:
                raise ConfigError(f"{flag} does not apply to --find-max-rate's search" + (" yet" if why == "yet" else
                                                                                         f" ({why})"))
    base = _dataset(dataset_name, dataset_path, random_input_len, random_output_len, random_range_ratio,
                    workload, overrides, seed, config.resolved_max_model_len(model_spec),
                    (sonnet_input_len, sonnet_output_len, sonnet_prefix_len))
    wl = load_workload(workload, overrides, max_model_len=config.resolved_max_model_len(model_spec), base=base)
    if not disagg:  # a request no step can hold: refused before the run (a disaggregated run: its pools)
        check_sample_width(wl, resolved, {"--n": n, "--beam-width": beam_width})
    check_router_workload(router.value if router is not None else None, wl)
    result_file = None
    if save_result:
        result_file = _result_target(wl, model_spec, result_dir, result_filename, dp)
    if disagg:
        prof = None
    elif fleet_groups is not None:
        prof = fleet_groups[0][1]
    elif profile is not None:
        prof = load_named_profile(profile)
        check_profile_matches(prof, model_spec, tp, gpu_spec, ep=config.expert_parallel_size)
    else:
        prof = default_profile(gpu_spec, model_spec, tp, config.expert_parallel_size)
    draft_prof = draft_profile(gpu_spec, config)  # a draft_model is priced from its own profile

    from kvsim.reports.capacity import SLO

    slo = SLO.of(targets, tuple(goodput_ms.items()))
    from kvsim.simcore import records

    if goodput_ms and int(wl.num_requests) > records.REQUEST_ROWS_CAP:  # before any work
        raise ConfigError(f"--goodput needs every request row in memory; {int(wl.num_requests):,} requests "
                          f"exceed the {records.REQUEST_ROWS_CAP:,} kept (use --slo-ttft-p95-ms / --slo-tpot-p95-ms)")
    memory = None if disagg else resolved.memory
    out_files = (("rates.csv", "max_rate.json") if find_max_rate else
                 (*RUN_FILES, "autoscale.png", "autoscale.html") if autoscale else
                 (*RUN_FILES, "fleet.html") if fleet is not None else
                 (*RUN_FILES, "disagg.html") if disagg else RUN_FILES)
    check_inputs_kept(out, [workload, profile, model, dataset_path], out_files)
    if result_file is not None and out is not None:  # the folder's file replaced the result, said "Wrote" both
        import os

        clash = next((name for name in out_files if os.path.realpath(Path(out).expanduser() / name)
                      == os.path.realpath(result_file)), None)
        if clash is not None:
            raise ConfigError(f"--save-result {result_file}: --out {out} writes its own {clash} there; give another "
                              "--result-filename or --result-dir")
    check_out_folder(out, out_files)  # before any work
    if find_max_rate:
        kind = getattr(getattr(wl, "arrival", None), "kind", None)  # (refused by the search after its header)
        if kind in ("closed_loop", "batch"):
            what = "a closed loop of clients" if kind == "closed_loop" else "every request at t = 0 (batches)"
            raise ConfigError(f"workload {wl.name}: a rate search needs open-loop arrivals at a rate, not {what}; "
                              "give --rate" + (" and leave out --concurrency" if kind == "closed_loop" else ""))
        if engine_core is not EngineCore.auto:
            raise ConfigError("--engine-core applies to one run, not to --find-max-rate's search")
        explicit = ctx.get_parameter_source("error_bars").name == "COMMANDLINE"
        _find_max_rate(model_spec, gpu_spec, resolved, wl, prof, seed, slo, tolerance, out, as_json,
                       error_bars=error_bars and explicit, engine=assumed(config, gpu_spec, prof))
        return
    if disagg:  # (--find-max-rate was refused)
        _run_disagg(model_spec, gpu_spec, config, wl, seed, slo, out, as_json, exact_steps, engine_core,
                    prefill_replicas, decode_replicas, tp if prefill_tp is None else prefill_tp,
                    tp if decode_tp is None else decode_tp, disagg_placement,
                    prefill_profile, decode_profile, prefill_max_num_batched_tokens, decode_max_num_seqs,
                    percentiles, metrics, assumed=assumed, error_bars=error_bars)
        return
    if fleet_groups is not None:
        _run_fleet(model_spec, fleet_groups, wl, seed, slo, out, as_json, exact_steps, engine_core, percentiles,
                   metrics, scaling, scaling_extras, slo_ttft_p95_ms, slo_tpot_p95_ms, assumed=assumed,
                   error_bars=error_bars)
        return
    if engine_core is EngineCore.c:  # refuse before any output what the compiled core cannot run
        from kvsim.simcore.simulate import prepare

        prepare(model_spec, gpu_spec, resolved, wl, prof, seed=seed, exact_steps=exact_steps,
                engine_core="c", draft_profile=draft_prof).choose_core()
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    say(describe_run(wl.describe(), config.to_dict(), model_spec, gpu_spec.name))
    say(f"Profile: {prof.label} sha256:{prof.sha256[:12]}")
    engine = assumed(config, gpu_spec, prof)
    say(f"Engine: {engine_text(engine)}")
    say(memory.describe())
    if pp > 1:
        say(f"Pipeline: {pp} stages x TP {tp}, layers {'/'.join(map(str, memory.layers_per_stage))}")
    if dp > 1:
        layout = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "")
        say(f"Replicas: {dp} x {layout} ({config.num_gpus} GPUs), router {config.router}; "
            "KV cache is per replica")
    if spec is not None:
        say(f"Speculative decoding: {spec.method}, k={spec.num_speculative_tokens}, acceptance "
            f"{', '.join(f'{r:.3f}' for r in spec.rates)} per position ({spec.source}); expected length "
            f"{spec.mean_acceptance_length():.2f}; draft {memory.draft_weights_bytes_per_gpu / 2**30:.2f} GiB + "
            f"{memory.draft_kv_bytes_per_token} B/token of KV per GPU")
    counted = None  # (hour, TTFT, TPOT): hourly attainment counted as requests leave (any number of them)
    if scaling is not None:
        from kvsim.cli.autoscale_out import attainment_key

        counted = attainment_key(scaling_extras, slo_ttft_p95_ms, slo_tpot_p95_ms, wl)
        say(f"Autoscaling: {scaling.min_replicas}-{scaling.max_replicas} replicas of TP {tp}, metric {scaling.metric} "
            f"target {scaling.target:g}, every {scaling.interval_s:g} s; cold start {scaling.provisioning_s:g} s "
            f"provisioning + {memory.weights_bytes_per_gpu / 1e9 / scaling.model_load_gbps:.0f} s load + "
            f"{scaling.warmup_s:g} s warm-up")
    with run_staging(out) as staging:  # rows past the memory caps stream into it; swapped in at the end
        result, sim = _simulate(model_spec, gpu_spec, resolved, wl, prof, seed, exact_steps, staging,
                                engine_core.value, keep_tokens=save_result, draft_prof=draft_prof, autoscale=scaling,
                                attainment=counted)
        baseline = None
        if compare_no_spec:  # the same requests and seed, without speculation
            from dataclasses import replace

            plain = resolve(model_spec, gpu_spec, replace(config, speculative_config=None))
            baseline, _ = _simulate(model_spec, gpu_spec, plain, wl, prof, seed, exact_steps, None, engine_core.value)
        fleet = None
        if scaling is not None:
            fleet = _fleet(result, model_spec, gpu_spec, resolved, wl, prof, seed, scaling_extras,
                           slo_ttft_p95_ms, slo_tpot_p95_ms, counted, draft_prof)
        bands = None
        if error_bars:
            also = None if scaling is None else _autoscale_figures(scaling_extras, slo_ttft_p95_ms, slo_tpot_p95_ms,
                                                                   gpu_spec.name)
            bands = _error_bars(model_spec, gpu_spec, resolved, wl, prof, seed, exact_steps, engine_core.value,
                                result, percentiles, metrics, draft_prof, scaling, baseline,
                                plain if baseline is not None else None, also, counted)
        fatal = _report(result, wl, slo, seed, out, as_json, staging, sim=sim, percentiles=percentiles,
                        metrics=metrics, result_file=result_file, model_name=model_spec.name, baseline=baseline,
                        fleet=fleet, bands=bands, engine=engine)
    if fatal is not None:
        fail(fatal, EMPTY_RESULT_EXIT)


def _assumed(cfg, model_spec, gpu_spec, prof, filled, usage_context, given: bool) -> dict:
    """engine_assumptions of one engine configuration, with the profile field its host cost comes from."""
    from kvsim.simcore.batch_defaults import engine_assumptions

    host = backend = all_reduce = None
    if prof is not None and cfg.policy == "continuous":
        from kvsim.profiles.symm_mem_allreduce import missing_note
        from kvsim.simcore.latency import all_reduce_engine, host_overhead_source, prefill_attention_engine

        host = host_overhead_source(prof.data, prof.label, cfg.policy, cfg.engine_version)[1]
        backend = prefill_attention_engine(prof.data, prof.label, cfg.policy, cfg.engine_version)[0]
        all_reduce = all_reduce_engine(prof.data, prof.label, cfg.policy, cfg.engine_version)[0] or \
            missing_note(prof.data, gpu_spec, cfg.tensor_parallel_size, cfg.engine_version)
    return engine_assumptions(cfg, model_spec, gpu_spec, filled, usage_context, given, host,
                              prof.source if prof is not None else None, backend, all_reduce)


def _check_disagg(ctx, given, prefill_replicas, decode_replicas, dp, pp, profile, find_max_rate, policy) -> None:
    """Refuse, before any work, what a disaggregated run cannot take."""
    if prefill_replicas is None or decode_replicas is None:
        raise ConfigError("a disaggregated run needs both --prefill-replicas and --decode-replicas "
                          f"(given: {', '.join(given)})")
    for flag, value in (("--prefill-replicas", prefill_replicas), ("--decode-replicas", decode_replicas)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if dp != 1 or pp != 1:
        raise ConfigError("--dp / --pp do not apply to a disaggregated run: size each pool with "
                          "--prefill-replicas/--prefill-tp and --decode-replicas/--decode-tp")
    if profile is not None:
        raise ConfigError("--profile does not apply to a disaggregated run: use --prefill-profile / --decode-profile")
    if find_max_rate:
        raise ConfigError("--find-max-rate does not run disaggregated deployments yet")
    if policy.value != "continuous":
        raise ConfigError("a disaggregated run needs --policy continuous (vLLM V1 instances with a KV connector)")


def _run_fleet(model_spec, groups, wl, seed, slo, out, as_json, exact_steps, engine_core, percentiles, metrics,
               scaling=None, scaling_extras=None, slo_ttft_ms=None, slo_tpot_ms=None, assumed=None, error_bars=False):
    """`kvsim run --fleet ...`: replicas of several GPU types / TPs behind one router (simcore/fleet.py);
    with --autoscale, the fleet is the autoscaler's pool in its order (simcore.autoscale)."""
    from kvsim.reports.prices import load_prices
    from kvsim.simcore.fleet import fleet_cost_per_hour
    from kvsim.simcore.simulate import prepare

    first, profile, _ = groups[0]
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    desc = describe_run(wl.describe(), first.engine.to_dict(), model_spec, first.gpu.name)
    head, _, rest = desc.partition(f"{model_spec.name} on ")
    layout = " + ".join(f"{n} x TP{cfg.engine.tensor_parallel_size} {cfg.gpu.name}" for cfg, _, n in groups)
    say(f"{head}{model_spec.name} on a fleet of {layout};{rest.split(';', 1)[1]}" if ";" in rest else desc)
    for cfg, prof, count in groups:
        say(f"Fleet group: {count} x TP {cfg.engine.tensor_parallel_size} {cfg.gpu.name}; profile {prof.label} "
            f"sha256:{prof.sha256[:12]}; GPU KV cache size: {cfg.memory.num_gpu_tokens:,} tokens per replica; "
            f"max_num_seqs {cfg.engine.max_num_seqs}, max_num_batched_tokens "
            f"{cfg.engine.resolved_max_num_batched_tokens(cfg.model)}")
    # the first group's line; each group's own step limits (its GPU's defaults where not given) above
    engine = assumed(first.engine, first.gpu, profile) if assumed is not None else None
    if engine is not None:
        say(f"Engine: {engine_text(engine)}")
    prices = load_prices()
    usd = fleet_cost_per_hour(groups, prices)
    gpus = sum(n * cfg.engine.tensor_parallel_size for cfg, _, n in groups)
    say(f"Fleet: {sum(n for _, _, n in groups)} replicas, {gpus} GPUs, router {first.engine.router}"
        + (f", ${usd:,.2f}/h at built-in prices" if usd is not None else " (a GPU has no built-in price)"))
    counted = None  # (hour, TTFT, TPOT): hourly attainment counted as requests leave (any number of them)
    if scaling is not None:
        from kvsim.cli.autoscale_out import attainment_key

        counted = attainment_key(scaling_extras or {}, slo_ttft_ms, slo_tpot_ms, wl)
        say(f"Autoscaling: {scaling.min_replicas}-{scaling.max_replicas} replicas of the fleet, started in its order "
            f"(drained in reverse), metric {scaling.metric} target {scaling.target:g}, every {scaling.interval_s:g} s")
    with run_staging(out) as staging:
        progress = LiveProgress("simulating", int(wl.num_requests), "requests finished")
        try:
            sim = prepare(model_spec, first.gpu, first, wl, profile, seed=seed, progress=progress.update,
                          exact_steps=exact_steps, stream=stream_tables(staging), engine_core=engine_core.value,
                          fleet=groups, autoscale=scaling, attainment=counted)
            result = sim.run()
        finally:
            progress.stop()
        result.record["fleet_usd_per_hour"] = usd
        fleet = None
        if scaling is not None:
            fleet = _fleet_of_groups(result, model_spec, groups, wl, seed, scaling_extras, slo_ttft_ms, slo_tpot_ms,
                                     prices, counted)
        bands = None
        if error_bars:  # every group's profile scaled alike (profiles.uncertainty.deployment_error)
            from kvsim.profiles.uncertainty import deployment_error, scaled_profile

            def rerun(f):
                scaled = [(cfg, scaled_profile(p, f), n) for cfg, p, n in groups]
                return prepare(model_spec, first.gpu, first, wl, scaled[0][1], seed=seed, exact_steps=exact_steps,
                               engine_core=engine_core.value, fleet=scaled, autoscale=scaling,
                               attainment=counted).run()

            also = None if scaling is None else _autoscale_figures(scaling_extras, slo_ttft_ms, slo_tpot_ms, "")
            bands = _bands(deployment_error([p for _, p, _ in groups]), rerun, result, percentiles, metrics,
                           also=also)
        fatal = _report(result, wl, slo, seed, out, as_json, staging, sim=sim, percentiles=percentiles,
                        metrics=metrics, model_name=model_spec.name, extra=lambda summary: _fleet_lines(result),
                        fleet=fleet, bands=bands, engine=engine)
    if fatal is not None:
        fail(fatal, EMPTY_RESULT_EXIT)


def _prefix(groups, replicas: int) -> list:
    """The first `replicas` replicas of a fleet, in its order (a static fleet the autoscaler's
    priority would have kept up)."""
    out, left = [], replicas
    for cfg, prof, n in groups:
        if left <= 0:
            break
        out.append((cfg, prof, min(n, left)))
        left -= n
    return out


def _fleet_of_groups(result, model_spec, groups, wl, seed, extras, slo_ttft_ms, slo_tpot_ms, prices, counted=None):
    """An autoscaled fleet's section (as `_fleet` makes it for one GPU type): each replica billed for
    its own GPUs at its group's price (or --autoscale-config's one price), and static fleets of the
    first peak / mean replicas in the fleet's order run on the same workload."""
    from kvsim.cli.autoscale_out import fleet_section, static_row
    from kvsim.simcore.simulate import prepare

    fleet = fleet_section(result, extras, slo_ttft_ms, slo_tpot_ms, "")
    per_replica = [(cfg.engine.tensor_parallel_size * cfg.engine.pipeline_parallel_size,
                    extras.get("price_usd_per_gpu_hour", prices.get(cfg.gpu.name))) for cfg, _, n in groups for _ in range(n)]
    priced = all(price is not None for _, price in per_replica)
    duration = fleet["duration_s"]

    def usd(hours: list[float]) -> float | None:
        return sum(h * g * p for h, (g, p) in zip(hours, per_replica, strict=False)) if priced else None

    fleet["usd"] = usd(fleet["replica_hours"])
    fleet["usd_per_day"] = None if fleet["usd"] is None or duration <= 0 else fleet["usd"] * 86400.0 / duration
    sizes = {"the peak": fleet["peak_active_replicas"], "the mean": max(1, math.ceil(fleet["mean_active_replicas"]))}
    rows = []
    for sized_for, replicas in sizes.items():
        part = _prefix(groups, replicas)
        static = prepare(model_spec, part[0][0].gpu, part[0][0], wl, part[0][1], seed=seed, fleet=part,
                         attainment=counted).run()
        hours = float(static.summary.get("duration_s") or 0.0) / 3600.0
        gpus = sum(g for g, _ in per_replica[:replicas])
        row = static_row(static, replicas, 1, fleet["slo"]["ttft_ms"], fleet["slo"]["tpot_ms"], None, fleet["hour_s"])
        row["gpu_hours"] = gpus * hours
        row["usd"] = usd([hours] * replicas)
        static_s = float(static.summary.get("duration_s") or 0.0)
        row["usd_per_day"] = None if row["usd"] is None or static_s <= 0 else row["usd"] * 86400.0 / static_s
        rows.append({"sized_for": sized_for, **row})
    fleet["static"] = rows
    peak = rows[0]["usd"] if priced else rows[0]["gpu_hours"]
    mine = fleet["usd"] if priced else fleet["gpu_hours"]
    fleet["saving_vs_peak_fleet"] = None if not peak else 1.0 - mine / peak
    fleet["saving_basis"] = "usd" if priced else "gpu_hours"  # GPU-hours of different GPUs are not one price
    return fleet


def _fleet_lines(result) -> str:
    """Requests and output tokens each group served (from the request table's replica column)."""
    records = result.records  # counted by replica as rows left (any number of requests)
    lines = ["----------------------Fleet-----------------------"]
    start = 0
    for group in result.record["fleet"]:
        end = start + group["replicas"]
        label = f"{group['replicas']} x TP{group['tp']} {group['gpu']}:"
        lines.append(f"{label:<41}{int(records.replica_requests[start:end].sum())} requests, "
                     f"{int(records.replica_positions[start:end].sum()):,} output tokens")
        start += group["replicas"]
    usd = result.record.get("fleet_usd_per_hour")
    if usd is not None:
        label = "Fleet cost, every replica up ($/h):" if "autoscale" in result.record else "Fleet cost ($/h):"
        lines.append(f"{label:<41}{usd:,.2f}")
    return "\n".join(lines)


def _run_disagg(model_spec, gpu_spec, config, wl, seed, slo, out, as_json, exact_steps, engine_core,
                prefill_replicas, decode_replicas, prefill_tp, decode_tp, placement, prefill_profile,
                decode_profile, prefill_max_num_batched_tokens, decode_max_num_seqs, percentiles=(95.0, 99.0),
                metrics=("ttft", "tpot", "itl", "e2el"), assumed=None, error_bars=False) -> None:
    """`kvsim run --prefill-replicas N --decode-replicas M ...`: two pools behind vLLM's P/D proxy."""
    from dataclasses import replace

    from kvsim.cli.output import format_disagg
    from kvsim.profiles import check_profile_matches, default_profile, load_named_profile
    from kvsim.simcore.config import resolve
    from kvsim.simcore.disagg import prepare_disagg

    pools = {}
    for name, changes in (
        ("prefill", {"tensor_parallel_size": prefill_tp, "data_parallel_size": prefill_replicas,
                     **({"max_num_batched_tokens": prefill_max_num_batched_tokens}
                        if prefill_max_num_batched_tokens is not None else {})}),
        ("decode", {"tensor_parallel_size": decode_tp, "data_parallel_size": decode_replicas, "router": "least-loaded",
                    **({"max_num_seqs": decode_max_num_seqs} if decode_max_num_seqs is not None else {})}),
    ):
        try:
            pools[name] = replace(config, **changes)
        except ConfigError as exc:
            raise ConfigError(f"{name} pool: {exc} (--{name}-* options)") from None
    resolved, profiles = {}, {}
    for name, cfg in pools.items():
        try:
            check_deployment(model_spec, gpu_spec, cfg)
            resolved[name] = resolve(model_spec, gpu_spec, cfg)
        except ConfigError as exc:
            raise ConfigError(f"{name} pool: {exc}") from None
        path = prefill_profile if name == "prefill" else decode_profile
        if path is not None:
            profiles[name] = load_named_profile(path)
            check_profile_matches(profiles[name], model_spec, cfg.tensor_parallel_size, gpu_spec)
        else:
            profiles[name] = default_profile(gpu_spec, model_spec, cfg.tensor_parallel_size)
    check_inputs_kept(out, [prefill_profile, decode_profile], RUN_FILES)
    sim = prepare_disagg(model_spec, gpu_spec, resolved, wl, profiles, seed=seed,
                         placement=placement.value if placement is not None else None,
                         exact_steps=exact_steps, engine_core=engine_core.value)
    sim.choose_core()  # --engine-core c: refused before any output
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    info = sim.record["disagg"]
    import re

    layout = (f"on {info['num_gpus']} x {gpu_spec.name} (prefill {prefill_replicas} x TP {prefill_tp}, "
              f"decode {decode_replicas} x TP {decode_tp})")
    say(re.sub(r"on \d+ x \S+ \(TP [^)]*\)", lambda _m: layout,
               describe_run(wl.describe(), pools["decode"].to_dict(), model_spec, gpu_spec.name), count=1))
    link = info["link"]
    say(f"Disaggregated: prefill {prefill_replicas} x TP {prefill_tp} (kv_producer), decode {decode_replicas} x "
        f"TP {decode_tp} (kv_consumer), {info['num_gpus']} GPUs; {link['connector']} {link['placement']}: "
        f"{link['latency_us']:.1f} us + bytes / {link['bandwidth_gbps']:.1f} GB/s "
        f"({info['kv_bytes_per_token']:,} B of KV per prompt token)")
    for name in ("prefill", "decode"):
        say(f"{name.capitalize()} pool: profile {profiles[name].label} sha256:{profiles[name].sha256[:12]}; "
            + resolved[name].memory.describe().replace(chr(10), "; "))
    engines = {}
    if assumed is not None:  # a pool's own --prefill-max-num-batched-tokens / --decode-max-num-seqs is not a default
        own = {"prefill": {"max_num_batched_tokens"} if prefill_max_num_batched_tokens is not None else set(),
               "decode": {"max_num_seqs"} if decode_max_num_seqs is not None else set()}
        for name in ("prefill", "decode"):
            engines[name] = assumed(pools[name], gpu_spec, profiles[name])
            engines[name]["batch_defaults_filled"] = [f for f in engines[name]["batch_defaults_filled"]
                                                      if f not in own[name]]
        texts = {name: engine_text(a) for name, a in engines.items()}
        if texts["prefill"] == texts["decode"]:
            say(f"Engine (both pools): {texts['decode']}")
        else:
            for name, text in texts.items():
                say(f"Engine ({name} pool): {text}")
    with run_staging(out) as staging:
        result = sim.run()
        bands = None
        if error_bars:  # both pools' step times scaled alike; the KV transfer (link bandwidth) is not
            from kvsim.profiles.uncertainty import deployment_error, scaled_profile

            def rerun(f):
                return prepare_disagg(model_spec, gpu_spec, resolved, wl,
                                      {k: scaled_profile(p, f) for k, p in profiles.items()}, seed=seed,
                                      placement=placement.value if placement is not None else None,
                                      exact_steps=exact_steps, engine_core=engine_core.value).run()

            bands = _bands(deployment_error(list(profiles.values())), rerun, result, percentiles, metrics)
        engine = None
        if engines:
            engine = {"engine_version": engines["decode"]["engine_version"], "pools": engines}
        fatal = _report(result, wl, slo, seed, out, as_json, staging, percentiles=percentiles, metrics=metrics,
                        model_name=model_spec.name, extra=format_disagg, bands=bands, engine=engine)
    if fatal is not None:
        fail(fatal, EMPTY_RESULT_EXIT)


def _simulate(model_spec, gpu_spec, resolved, wl, prof, seed, exact_steps, staging, engine_core, keep_tokens=False,
              draft_prof=None, autoscale=None, attainment=None):
    """(result, the simulation); `keep_tokens` records every token's time (--save-result); `draft_prof`
    prices a draft_model's own passes; `staging` None: nothing streams (a --compare-no-spec baseline)."""
    from kvsim.simcore.simulate import prepare

    progress = LiveProgress("simulating", int(wl.num_requests), "requests finished")
    try:
        sim = prepare(model_spec, gpu_spec, resolved, wl, prof, seed=seed, progress=progress.update,
                      exact_steps=exact_steps, stream=stream_tables(staging) if staging is not None else None,
                      engine_core=engine_core, draft_profile=draft_prof, autoscale=autoscale, attainment=attainment)
        if keep_tokens:
            for engine in sim.replicas:
                engine.lifecycle.token_times = {}
        return sim.run(), sim
    finally:
        progress.stop()


def _error_bars(model_spec, gpu_spec, resolved, wl, prof, seed, exact_steps, engine_core, result,
                percentiles, metrics, draft_prof=None, autoscale=None, baseline=None, plain=None, also=None,
                attainment=None) -> dict:
    """The run again with every step time at the low and high end of the profile's stated error
    (profiles/uncertainty.py; a draft model's profile scaled alike); with `baseline` (the
    --compare-no-spec run, `plain` its configuration), the baseline too at each end, for the
    speed-ups' band."""
    from kvsim.profiles.uncertainty import profile_error, scaled_profile
    from kvsim.simcore.simulate import prepare

    def rerun(f):
        draft = scaled_profile(draft_prof, f) if draft_prof is not None else None
        return prepare(model_spec, gpu_spec, resolved, wl, scaled_profile(prof, f), seed=seed, exact_steps=exact_steps,
                       engine_core=engine_core, draft_profile=draft, autoscale=autoscale,
                       attainment=attainment).run()

    def rerun_baseline(f):
        return prepare(model_spec, gpu_spec, plain, wl, scaled_profile(prof, f), seed=seed, exact_steps=exact_steps,
                       engine_core=engine_core).run()

    return _bands(profile_error(prof), rerun, result, percentiles, metrics,
                  (baseline, rerun_baseline) if baseline is not None else None, also)


AUTOSCALE_BANDED = ("gpu_hours", "attainment", "mean_active_replicas", "peak_active_replicas")


def _autoscale_figures(extras, slo_ttft_ms, slo_tpot_ms, gpu_name: str = ""):
    """An autoscaled run's figures that its band covers (GPU-hours, SLO attainment, replicas)."""
    from kvsim.cli.autoscale_out import fleet_section

    def figures(result) -> dict:
        section = fleet_section(result, extras, slo_ttft_ms, slo_tpot_ms, gpu_name)
        return {k: section.get(k) for k in AUTOSCALE_BANDED}

    return figures


def _bands(err, rerun, result, percentiles, metrics, baseline=None, also=None) -> dict:
    """Each headline metric's [low, high] over `result` and `rerun(factor)` at the two ends of
    the 90% band of `err` (the throughputs, and mean / median / chosen percentiles of the chosen
    latency metrics); `baseline` (its result, its rerun): the speed-ups of speculation over it too,
    each end's speculative run against the baseline at the same factor; `also(result)` -> {name:
    value}: more figures banded alike (an autoscaled run's GPU-hours), under "also"."""
    from kvsim.cli.bench_result import metric_stats
    from kvsim.profiles.uncertainty import BAND_METRICS, INTERVAL, band, band_factors, factors_doc

    factors = band_factors(err)
    runs = [result, *(rerun(f) for f in factors)]
    values = [{**r.summary, **metric_stats(r, percentiles, metrics)} for r in runs]
    keys = [k for k in values[0] if k in BAND_METRICS or (k.endswith("_ms") and not k.startswith("std_")
                                                          and k.split("_")[1] in metrics)]
    doc = {"interval": INTERVAL, "step_time_factors": factors_doc(*factors), **err.to_dict(),
           "metrics": {k: band([v.get(k) for v in values]) for k in keys if values[0].get(k) is not None}}
    if baseline is not None:
        from kvsim.reports.speculation import speedup_vs

        base, rerun_base = baseline
        ups = [speedup_vs(result.summary, base.summary),
               *(speedup_vs(r.summary, rerun_base(f).summary) for r, f in zip(runs[1:], factors, strict=True))]
        doc["speculation_vs_none"] = {k: band([u.get(k) for u in ups]) for k in ups[0]
                                      if k.startswith("speedup_") and ups[0].get(k) is not None}
    if also is not None:
        extra = [also(r) for r in runs]
        doc["also"] = {k: band([e.get(k) for e in extra]) for k in extra[0] if extra[0].get(k) is not None}
    return doc


def _fleet(result, model_spec, gpu_spec, resolved, wl, prof, seed, extras, slo_ttft_ms, slo_tpot_ms, counted=None,
           draft_prof=None):
    """The autoscaled run's fleet section, and the same workload on static fleets sized for its peak
    and its mean (rounded up) active replicas (a draft_model's draft priced as in the run: `draft_prof`)."""
    from dataclasses import replace

    from kvsim.cli.autoscale_out import fleet_section, static_row
    from kvsim.simcore.config import resolve
    from kvsim.simcore.simulate import simulate

    fleet = fleet_section(result, extras, slo_ttft_ms, slo_tpot_ms, gpu_spec.name)
    gpus = resolved.engine.tensor_parallel_size * resolved.engine.pipeline_parallel_size
    sizes = {"the peak": fleet["peak_active_replicas"], "the mean": max(1, math.ceil(fleet["mean_active_replicas"]))}
    rows = []
    for sized_for, replicas in sizes.items():
        config = resolve(model_spec, gpu_spec, replace(resolved.engine, data_parallel_size=replicas))
        static = simulate(model_spec, gpu_spec, config, wl, prof, seed=seed, attainment=counted, draft_profile=draft_prof)
        rows.append({"sized_for": sized_for, **static_row(static, replicas, gpus, fleet["slo"]["ttft_ms"],
                                                          fleet["slo"]["tpot_ms"], fleet["usd_per_gpu_hour"],
                                                          fleet["hour_s"])})
    fleet["static"] = rows
    peak = rows[0]["gpu_hours"]
    fleet["saving_vs_peak_fleet"] = None if peak <= 0 else 1.0 - fleet["gpu_hours"] / peak
    return fleet


def _dataset(name, path, input_len, output_len, range_ratio, workload, overrides, seed, max_model_len,
             sonnet=(None, None, None)):
    """The workload `--dataset-name` builds (None without it); the flags it owns are taken out of
    `overrides` (vLLM maps --input-len / --output-len onto the dataset's own flags)."""
    from kvsim.workloads import datasets

    random_flags = {"--random-input-len": input_len, "--random-output-len": output_len,
                    "--random-range-ratio": range_ratio}
    sonnet_flags = dict(zip(("--sonnet-input-len", "--sonnet-output-len", "--sonnet-prefix-len"), sonnet, strict=True))
    if name is not DatasetName.sonnet:
        for flag, value in sonnet_flags.items():
            if value is not None:
                raise ConfigError(f"{flag} applies only with --dataset-name sonnet")
    if name is None:
        for flag, value in [*random_flags.items(), ("--dataset-path", path)]:
            if value is not None:
                raise ConfigError(f"{flag} applies only with --dataset-name")
        return None
    if workload is not None:
        raise ConfigError("give either --workload or --dataset-name, not both")
    num = overrides.pop("num_requests", None)  # 0 is a mistake, not "unset" (vLLM's 1,000)
    if num is None:
        num = datasets.DEFAULT_NUM_PROMPTS
    elif num < 1:
        raise ConfigError(f"--num-requests must be an integer >= 1, got {num}")
    if name is DatasetName.random:
        if path is not None:
            raise ConfigError("--dataset-path is for --dataset-name sharegpt; random draws its lengths")
        for flag, general, specific in (("input", overrides.get("input_len"), input_len),
                                        ("output", overrides.get("output_len"), output_len)):
            if general is not None and specific is not None:
                raise ConfigError(f"give --{flag}-len or --random-{flag}-len, not both")
        input_len = input_len if input_len is not None else overrides.pop("input_len", None)
        output_len = output_len if output_len is not None else overrides.pop("output_len", None)
        spec = datasets.random_dataset(
            num, datasets.RANDOM_INPUT_LEN if input_len is None else _whole(input_len, "--random-input-len"),
            datasets.RANDOM_OUTPUT_LEN if output_len is None else _whole(output_len, "--random-output-len"),
            0.0 if range_ratio is None else range_ratio)
        for flag, dist, room in (("--random-input-len", spec.prompt_len, "one output token"),
                                 ("--random-output-len", spec.output_len, "a one-token prompt")):
            shortest = getattr(dist, "low", getattr(dist, "value", 0))
            if shortest >= max_model_len:  # every request would be clipped: not the dataset asked for
                raise ConfigError(f"{flag}: {int(shortest)} tokens or more leave no room for {room} within "
                                  f"max_model_len {max_model_len}")
        return spec
    for flag, value in random_flags.items():
        if value is not None:
            raise ConfigError(f"{flag} applies only with --dataset-name random")
    if name is DatasetName.sonnet:
        return _sonnet(datasets, path, num, seed, overrides, sonnet_flags, max_model_len)
    if path is None:
        raise ConfigError("--dataset-name sharegpt needs --dataset-path (a ShareGPT JSON file)")
    if overrides.get("input_len") is not None:
        raise ConfigError("--input-len does not apply to --dataset-name sharegpt (its prompts give the lengths)")
    output = overrides.pop("output_len", None)
    return datasets.sharegpt_dataset(path, num, seed, None if output is None else _whole(output, "--output-len"))


def _sonnet(datasets, path, num, seed, overrides, flags, max_model_len):
    """--dataset-name sonnet (workloads.datasets.sonnet_dataset); --input-len / --output-len are
    vLLM's general names for --sonnet-input-len / --sonnet-output-len."""
    lens, given = {}, {}
    for kind, default in (("input", datasets.SONNET_INPUT_LEN), ("output", datasets.SONNET_OUTPUT_LEN)):
        general, specific = overrides.pop(f"{kind}_len", None), flags[f"--sonnet-{kind}-len"]
        if general is not None and specific is not None:
            raise ConfigError(f"give --{kind}-len or --sonnet-{kind}-len, not both")
        value = specific if specific is not None else general
        given[kind] = f"--sonnet-{kind}-len" if specific is not None or general is None else f"--{kind}-len"
        lens[kind] = default if value is None else _whole(value, given[kind])
    prefix = flags["--sonnet-prefix-len"]  # unset: vLLM's 200, or the whole prompt when that is shorter
    prefix = min(datasets.SONNET_PREFIX_LEN, lens["input"]) if prefix is None else prefix
    if lens["input"] >= max_model_len:
        raise ConfigError(f"{given['input']} {lens['input']} leaves no room for an output within max_model_len "
                          f"{max_model_len}")
    if lens["output"] >= max_model_len:  # every output would be clipped (as --random-output-len is refused)
        raise ConfigError(f"{given['output']} {lens['output']} leaves no room for a prompt within max_model_len "
                          f"{max_model_len}")
    return datasets.sonnet_dataset(path, num, seed, lens["input"], lens["output"], prefix)


def _whole(value, flag: str) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"{flag} must be a whole number of tokens, got {value}")
    return int(value)


def _result_target(wl, model_spec, result_dir, result_filename, dp):
    """Where --save-result writes (vLLM's name pattern), checked before any work."""
    from datetime import datetime

    from kvsim.cli.bench_result import check_result_target, result_path

    arrival = wl.arrival.describe()
    concurrency = arrival.get("concurrency") if arrival.get("process") == "closed_loop" else None
    rate = arrival.get("rate", "inf" if arrival.get("process") == "batch" else arrival.get("mean_rate", "trace"))
    if any(tuple(getattr(getattr(wl, name, None), "values", (1,))) != (1,) for name in ("n", "beam_width")):
        raise ConfigError("--save-result records one sequence per request; not with --n or --beam-width")
    if int(wl.num_requests) > SAVE_RESULT_MAX_REQUESTS:  # every token's time is kept: 8 bytes a token
        raise ConfigError(f"--save-result keeps every token's time in memory: at most {SAVE_RESULT_MAX_REQUESTS:,} "
                          f"requests, got {int(wl.num_requests):,} (use --out for the per-request table)")
    path = result_path(result_dir, result_filename, "kvsim", rate, concurrency, model_spec.name, datetime.now())
    check_result_target(path)
    return path


def _report(result, wl, slo, seed: int, out: Path | None, as_json: bool, staging, sim=None,
            percentiles=(95.0, 99.0), metrics=("ttft", "tpot", "itl", "e2el"), result_file=None,
            model_name: str = "", extra=None, baseline=None, fleet=None, bands: dict | None = None,
            engine: dict | None = None) -> str | None:
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
    from kvsim.reports.capacity import summary_with_goodput
    from kvsim.reports.regime import regime_of

    regime = regime_of(result)
    # a session workload is judged as sweep and plan judge it (reports.capacity.judge_sessions)
    judged = summary_with_goodput(result, slo, wl, seed)
    if judged.get("sessions_overloaded"):
        typer.echo(f"WARNING overloaded: queueing delay grows {judged['session_queue_slope']:.2f} s per s while "
                   "sessions start (turns wait on their answers, so an overloaded server slows its own "
                   "arrivals and the completed rate keeps pace)", err=True)
    elif judged.get("saturation") == "overloaded":
        s = judged
        unit = rate_unit(bool(result.record["workload"].get("sessions")))
        if s.get("capacity_exceeded"):  # queued inside the batch: no queue to point at (simcore.full_batch)
            typer.echo(f"WARNING overloaded: {s['offered_rate']:.2f} {unit} offered, above the full-batch capacity "
                       f"{s['full_batch_capacity']:.2f} ({s['full_batch_seqs']:,} sequences per step); "
                       f"{s['completed_rate_warm']:.2f} completed once warm; the batch, then a queue, grows for "
                       "as long as the load lasts", err=True)
        else:
            typer.echo(f"WARNING overloaded: {s['offered_rate']:.2f} {unit} offered, {s['completed_rate_warm']:.2f} "
                       "completed once warm; the queue grows for as long as the load lasts", err=True)
    summary = {
        **configured_load(result.record["workload"]),
        **judged, "regime": regime.label, "peak_kv_use": regime.peak_kv_use,
        "kv_blocked_share": regime.kv_blocked_share,
    }
    if engine is not None:  # issue 27: every answer names the engine version it assumes
        summary["engine_version"] = engine.get("engine_version")
        summary["engine_assumptions"] = engine
    if bands is not None:
        summary["error_bars"] = bands
    if baseline is not None:
        from kvsim.reports.speculation import speedup_vs

        summary["speculation_vs_none"] = speedup_vs(result.summary, baseline.summary)
    from kvsim.cli import bench_result

    summary.update(bench_result.metric_stats(result, percentiles, metrics))
    summary["max_concurrent_requests"] = bench_result.peak_concurrency(result)
    times = bench_result.token_times(sim) if sim is not None else None
    if times is not None and result.records.kept:
        summary["max_output_tokens_per_s"] = bench_result.peak_output_throughput(times, bench_result.per_request_rows(result))
    load = configured_load(result.record["workload"])
    vllm = bench_result.flat_result(summary, {
        "num_prompts": result.record["workload"]["num_requests"], "model_id": model_name,
        "request_rate": load.get("request_rate", "inf"),  # vLLM writes "inf" when no rate paced the requests
        "burstiness": result.record["workload"]["arrival"].get("burstiness", 1.0),
        "max_concurrency": load.get("max_concurrency"),
        **{k: v for k, v in summary.items() if k.startswith(("mean_", "median_", "std_", "p")) and k.endswith("_ms")},
        "max_output_tokens_per_s": summary.get("max_output_tokens_per_s"),
        "max_concurrent_requests": summary["max_concurrent_requests"],
    })
    # vLLM's keys at the top level (jq .p99_ttft_ms), then kvsim's summary keys; "summary" keeps the
    # nested form earlier versions wrote
    document = {**vllm, **{k: v for k, v in summary.items() if k not in vllm},
                "summary": summary, "record": result.record, "warnings": result.warnings}
    if fatal is not None:  # served nothing, exit 1: an earlier run's --out folder or result file stays as it was
        out = result_file = None
    if result_file is not None:
        from datetime import datetime

        bench_result.write_result(result_file, {
            "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "kvsim", "label": "kvsim",
            "tokenizer_id": None, **document, **bench_result.per_request_arrays(result, times)})
    files = {"requests.csv": lambda: request_columns(result), "steps.csv": lambda: step_columns(result),
             "summary.json": document}
    if fleet is not None:
        from kvsim.cli.autoscale_out import format_fleet, write_figure

        document["autoscale"] = fleet
        files["autoscale.png"] = lambda path: write_figure(fleet, path)
        files["autoscale.html"] = lambda path: _autoscale_html(document, fleet, path)
    elif "fleet" in result.record and out is not None:  # a --fleet run: its page per GPU group
        files["fleet.html"] = lambda path: _fleet_html(document, result, path)
    elif "disagg" in result.record and out is not None:  # a disaggregated run: its page per pool
        files["disagg.html"] = lambda path: _disagg_html(document, result, path)
    if out is not None:
        write_outputs(out, files, staging, RUN_FAMILY)
    if as_json:
        typer.echo(json.dumps(document, indent=2, default=str))
    else:
        typer.echo(format_summary(summary, percentiles=percentiles, metrics=metrics,
                                  sessions=bool(result.record["workload"].get("sessions"))))
        if extra is not None:
            typer.echo(extra(summary))
        if fleet is not None:
            typer.echo(format_fleet(fleet))
        typer.echo(f"Simulated in {result.wall_s:.2f} s (seed {seed}).")
        if out is not None:
            typer.echo(f"Wrote {out}/{', '.join(files)}")
        if result_file is not None:
            typer.echo(f"Wrote {result_file}")
    return fatal


def _autoscale_html(document: dict, fleet: dict, path: Path) -> None:
    """autoscale.html: the page of reports.fleet_page, with the figure drawn for it."""
    import tempfile

    from kvsim.cli.autoscale_out import write_figure
    from kvsim.reports.fleet_page import autoscale_page

    with tempfile.TemporaryDirectory(prefix="kvsim-page-") as tmp:
        png = Path(tmp) / "autoscale.png"
        write_figure(fleet, png)
        path.write_text(autoscale_page(document, png))


def _fleet_html(document: dict, result, path: Path) -> None:
    """fleet.html: what each GPU group of a --fleet run served (reports.fleet_page)."""
    from kvsim.reports.fleet_page import fleet_page, group_rows
    from kvsim.reports.prices import load_prices

    records = result.records  # past the kept rows: the per-replica counts (no per-group p95s)
    cols = request_columns(result) if records.kept else None
    counts = (records.replica_requests, records.replica_positions)
    path.write_text(fleet_page(document, group_rows(document, cols, load_prices(), counts)))


def _disagg_html(document: dict, result, path: Path) -> None:
    """disagg.html: each pool's figures and the KV transfers of a disaggregated run (reports.disagg_page)."""
    import tempfile

    from kvsim.reports.disagg_page import disagg_page
    from kvsim.reports.prices import load_prices

    with tempfile.TemporaryDirectory(prefix="kvsim-page-") as tmp:
        path.write_text(disagg_page(document, step_columns(result), load_prices(), Path(tmp)))


FIND_MAX_RATE_NO_BAND = ("each end would be a whole search, x3 the time: add --error-bars, or plan with "
                         "`kvsim plan --confidence`")


def _find_max_rate(model_spec, gpu_spec, config, wl, prof, seed, slo, tolerance, out, as_json, error_bars=False,
                   engine=None) -> None:
    """`kvsim run --find-max-rate`: the rate search of reports.capacity on this deployment; with
    an explicit --error-bars, the search again at each end of the profile's stated error."""
    from kvsim.reports.capacity import max_sustainable_rate, simulator
    from kvsim.simcore.simulate import KVSIM_VERSION

    start = getattr(wl.arrival, "rate", None) or getattr(wl.arrival, "mean_rate", None) or 1.0
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    # a session workload's rate is its session rate: only session starts are rescaled, each turn
    # still waits on its answer (reports.capacity.SessionRateScaler, which refuses a closed loop)
    sessions = getattr(wl, "is_session", False)
    unit = "sessions/s" if sessions else "req/s"
    per_run = (f"{int(wl.num_sessions):,} sessions per run, more at higher rates to reach the steady state"
               if sessions else f"{wl.num_requests} requests per run")
    say(f"Searching the highest sustained rate meeting {slo.text()} (tolerance {100 * tolerance:g}%, "
        f"{per_run}, seed {seed})")
    if engine is not None:
        say(f"Engine: {engine_text(engine)}")
    found = max_sustainable_rate(simulator(model_spec, gpu_spec, config, wl, prof, seed, slo), slo, start, tolerance)
    bars = {"skipped": FIND_MAX_RATE_NO_BAND}
    if error_bars:
        from kvsim.profiles.uncertainty import (
            INTERVAL,
            band_factors,
            factors_doc,
            profile_error,
            scaled_profile,
        )

        err = profile_error(prof)
        factors = band_factors(err)
        ends = [max_sustainable_rate(simulator(model_spec, gpu_spec, config, wl, scaled_profile(prof, f),
                                               seed, slo), slo, start, tolerance) for f in factors]
        rates = [found.max_rate, *(e.max_rate for e in ends)]
        bars = {"interval": INTERVAL, "step_time_factors": factors_doc(*factors), **err.to_dict(),
                "max_sustainable_rate": [min(rates), max(rates)], "at_least": [e.at_least for e in ends],
                "num_runs": sum(e.num_runs for e in ends)}
    rows = [{
        "rate": p.rate, "passed": p.passed, "saturation": p.summary.get("saturation"),
        "p95_ttft_ms": p.summary.get("p95_ttft_ms"), "p95_tpot_ms": p.summary.get("p95_tpot_ms"),
        **{t.key: p.summary.get(t.key) for t in slo.percentile_ms},
        "request_goodput": p.summary.get("request_goodput"), "why_not": "; ".join(p.reasons),
        "engine_core": p.summary.get("engine_core"),
    } for p in found.points]
    document = {
        "max_sustainable_rate": found.max_rate, "unit": unit, "tolerance": tolerance, "at_least": found.at_least,
        "binding": found.binding, "slo": slo.describe(), "num_runs": found.num_runs, "runs": rows,
        "error_bars": bars, **({"engine_version": engine.get("engine_version"), "engine_assumptions": engine}
                               if engine is not None else {}),
        "record": {"kvsim_version": KVSIM_VERSION, "seed": seed, "model": model_spec.to_dict(),  # as summary.json's
                   "gpu": {"name": gpu_spec.name, "memory_gib": gpu_spec.memory_gib},
                   "config": config.engine.to_dict(),
                   "profile": {"path": prof.path, "sha256": prof.sha256, "source": prof.source, "label": prof.label},
                   "workload": wl.describe()},
    }
    if out is not None:
        import pandas as pd

        write_outputs(out, {"rates.csv": pd.DataFrame(rows), "max_rate.json": document}, replaces=RUN_FAMILY)
    if as_json:
        typer.echo(json.dumps(document, indent=2, default=str))
        return
    for row in rows:
        mark = "pass" if row["passed"] else "fail"
        ttft, tpot = row["p95_ttft_ms"], row["p95_tpot_ms"]
        typer.echo(f"  {row['rate']:9.3f} {unit}  {mark}  TTFT p95 {'n/a' if ttft is None else f'{ttft:,.0f}'} ms  "
                   f"TPOT p95 {'n/a' if tpot is None else f'{tpot:,.1f}'} ms  "
                   + "".join(f"{t.name} {'-' if row[t.key] is None else f'{row[t.key]:,.1f}'} ms  "
                             for t in slo.percentile_ms) + row["why_not"])
    if found.max_rate == 0:
        typer.echo(f"No rate meets the SLO: {found.binding}")
    elif found.at_least:
        typer.echo(f"Max sustainable rate: at least {found.max_rate:.3f} {unit} (search ceiling reached)")
    else:
        typer.echo(f"Max sustainable rate: {found.max_rate:.3f} {unit} (fails at "
                   f"{found.max_rate * (1 + tolerance):.3f}: {found.binding}); {found.num_runs} runs")
    if "skipped" in bars:
        typer.echo(f"Model error: no band ({bars['skipped']})")
    else:
        from kvsim.profiles.uncertainty import factors_text

        lo, hi = bars["max_sustainable_rate"]
        typer.echo(f"Model error ({100 * bars['interval']:.0f}% band, {bars['kind']} profile, step times "
                   f"{factors_text(bars['step_time_factors'])}): max sustainable rate "
                   f"{lo:.3f} .. {hi:.3f} {unit}" + (" (a search reached its ceiling)" if any(bars["at_least"]) else "")
                   + f"; {bars['num_runs']} more runs")


__all__ = ["run"]
