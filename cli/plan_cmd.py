"""`kvsim plan`: the cheapest deployment that meets an SLO at a target rate (reports.plan).

    kvsim plan --model llama3-70b --workload azure-conv --rate 20 --slo-ttft-p95-ms 1000 --slo-tpot-p95-ms 60
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.cli.options import (
    AsJson,
    Burstiness,
    EngineVersion,
    Goodput,
    InputLen,
    OutputLen,
    SloTargets,
    SloTpotP95,
    SloTtftP95,
    UsageContextOpt,
    Workload,
    batch_default_fields,
    check_inputs_kept,
    parse_goodput,
)
from kvsim.cli.output import check_out_folder
from kvsim.simcore.errors import ConfigError

LIST = "Comma-separated list."
PLAN_FILES = ("plan.csv", "plan.json", "capacity.png", "plan.parquet", "plan.html")
MAX_TARGET_RATES = 100  # target rates of one plan
MIN_CONFIDENCE = 0.001  # --confidence from 0.1% to 99.9%: the normal quantiles of a stated step-time error
MAX_CANDIDATES = 1_000  # deployments one plan searches (the default grid is 4 GPUs x 4 TPs = 16)
MAX_RUN_REQUESTS = 10_000_000  # requests of one search or confirming run (the default is 600 / 2,000)


def _list(flag: str, text: str | None, kind: type, default: list) -> list:
    from kvsim.reports.sweep import parse_list

    return default if text is None else parse_list(flag, text, kind)


def _kv_cache_dtypes(text: str | None, default: list) -> list:
    """--kv-cache-dtype as a list; "fp8,fp8_e4m3" (one dtype in vLLM) refused."""
    from kvsim.reports.sweep import parse_kv_cache_dtypes

    return default if text is None else parse_kv_cache_dtypes(text)


def _routers(text: str | None) -> list[str] | None:
    """--router as a list (None: not given)."""
    return None if text is None else _list("--router", text, str, [])


def _quantizations(text: str | None, default: list) -> list:
    """--quantization as a list, "none" (any case) the checkpoint's own (None); one spelled twice refused."""
    from kvsim.reports.sweep import check_distinct

    values = [None if q.lower() == "none" else q for q in _list("--quantization", text, str, default)]
    check_distinct("--quantization", values, text or "")
    return values


def _bools(flag: str, text: str | None) -> list[bool] | None:
    if text is None:
        return None
    words = {"on": True, "true": True, "yes": True, "off": False, "false": False, "no": False}
    values = []
    for item in _list(flag, text, str, []):
        if item.lower() not in words:
            raise ConfigError(f"{flag}: {item!r} is not on or off")
        values.append(words[item.lower()])
    from kvsim.reports.sweep import check_distinct

    check_distinct(flag, ["on" if v else "off" for v in values], text)  # "on,true": one candidate twice
    return values


# what plan --autoscale reads (reports/autoscale_plan.py); every other option given is refused, not ignored
AUTOSCALE_OPTIONS = frozenset({
    "rate", "model", "gpu", "tp", "workload", "slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_targets", "price", "seed",
    "out", "as_json", "engine_version", "usage_context", "confidence", "autoscale", "attainment", "max_replicas",
    "provisioning_delay",
})


def plan(
    ctx: typer.Context,
    rate: Annotated[str | None, typer.Option(help=f"Target request rate(s) in req/s (required, except with --autoscale). {LIST}")] = None,
    model: Annotated[str, typer.Option(help=f"Catalog model(s) or Hugging Face config.json. {LIST}")] = "llama3-8b",
    gpu: Annotated[str | None, typer.Option(help=f"Candidate GPU(s). {LIST} [default: every catalog GPU]")] = None,
    workload: Workload = None,
    input_len: InputLen = None,
    output_len: OutputLen = None,
    burstiness: Burstiness = None,
    slo_ttft_p95_ms: SloTtftP95 = None,
    slo_tpot_p95_ms: SloTpotP95 = None,
    slo_targets: SloTargets = None,
    goodput: Goodput = None,
    tp: Annotated[str | None, typer.Option("--tp", help=f"Tensor-parallel sizes to try. {LIST} [default: 1,2,4,8]")] = None,
    block_size: Annotated[str | None, typer.Option(help=f"KV block sizes to try. {LIST} [default: 16]")] = None,
    gpu_memory_utilization: Annotated[str | None, typer.Option(help=f"Memory utilisations to try. {LIST} [default: 0.9]")] = None,
    max_num_seqs: Annotated[str | None, typer.Option(help=f"max_num_seqs values to try. {LIST} [default: the engine version's vLLM default on each GPU: 1024 on an H100 for vllm-v1, 256 for vllm-0.6; 256 for static / dynamic batching]")] = None,
    chunked_prefill: Annotated[str | None, typer.Option(help=f"Chunked prefill on and/or off. {LIST} [default: on]")] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option(help=f"KV-cache dtypes to try (auto, fp8). {LIST} [default: auto]")] = None,
    quantization: Annotated[str | None, typer.Option(help=f"Weight quantizations to try (none, fp8). {LIST} [default: none]")] = None,
    pp: Annotated[str | None, typer.Option("--pp", help=f"Pipeline-parallel sizes to try (stages across nodes). {LIST} [default: 1]")] = None,
    router: Annotated[str | None, typer.Option("--router", help=f"Routers to try over the replicas: round-robin, least-loaded, prefix-aware, session-affinity (each candidate is confirmed with its own). {LIST} [default: least-loaded]")] = None,
    kv_offloading_size: Annotated[str | None, typer.Option("--kv-offloading-size", help=f"CPU KV tier sizes to try, GiB per replica (none: no tier). {LIST} [default: none]")] = None,
    price: Annotated[list[str] | None, typer.Option(help="GPU=USD per GPU-hour (e.g. H100-SXM-80GB=3.5), or a YAML file of them; repeatable.")] = None,
    tolerance: Annotated[float, typer.Option(help="Relative width of each max-rate bracket.")] = 0.04,
    search_requests: Annotated[int, typer.Option(help="Requests per rate-search run.")] = 600,
    confirm_requests: Annotated[int, typer.Option(help="Requests per confirming multi-replica run.")] = 2000,
    confirm_top: Annotated[int, typer.Option(help="How many of the cheapest candidates to confirm with a full multi-replica run.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed for every run (every candidate serves the same requests).")] = 0,
    jobs: Annotated[int, typer.Option(help="Candidates searched at once, each in its own process.")] = 1,
    confidence: Annotated[float, typer.Option(help="Plan so that the SLO holds with this probability under the profile's stated step-time error (profiles/uncertainty.py): step times are scaled by its quantile, x1 at 0.5.")] = 0.5,
    engine_version: EngineVersion = None,
    usage_context: UsageContextOpt = None,
    out: Annotated[Path | None, typer.Option(help="Folder for plan.csv, plan.parquet (with pyarrow), plan.json and capacity.png.")] = None,
    as_json: AsJson = False,
    speculative_config: Annotated[str | None, typer.Option("--speculative-config", help="Speculative decoding to try, as vLLM's JSON (see kvsim run), or a JSON list of them, null for none: '[null, {\"method\": \"eagle\", \"num_speculative_tokens\": 3}]'.")] = None,
    disagg: Annotated[str, typer.Option(help="Disaggregated prefill/decode candidates: off (aggregated only), on (disaggregated only) or auto (both; says which is cheaper). Disaggregated runs use the Python engine: seconds per candidate.")] = "off",
    disagg_ratios: Annotated[str | None, typer.Option(help=f"Prefill:decode instance ratios of a disaggregated unit, e.g. 1:1,2:1. {LIST} [default: 1:1,2:1,1:2]")] = None,
    disagg_placement: Annotated[str | None, typer.Option(help="Where a disaggregated unit's pools sit: same-node or cross-node. [default: same-node when a unit fits in one node]")] = None,
    autoscale: Annotated[bool, typer.Option("--autoscale", help="Plan an autoscaling policy over the workload's day instead: the cheapest min/max replicas and target meeting --attainment (one --model, --gpu and --tp; reports/autoscale_plan.py).")] = False,
    attainment: Annotated[float, typer.Option(help="--autoscale: share of requests that must meet the TTFT and TPOT SLOs (--slo-ttft-p95-ms / --slo-tpot-p95-ms as per-request limits; 1000 / 100 ms without them).")] = 0.99,
    max_replicas: Annotated[int, typer.Option(help="--autoscale: most replicas tried.")] = 8,
    provisioning_delay: Annotated[float | None, typer.Option(help="--autoscale: seconds before a new replica's model starts loading. [default: 120]")] = None,
) -> None:
    """Find the cheapest deployment (GPU, TP, replicas, engine knobs) that meets the SLOs at the target rate."""
    from kvsim.reports.capacity import SLO
    from kvsim.reports.plan import default_dimensions
    from kvsim.reports.plan import plan as make_plan
    from kvsim.reports.prices import load_prices
    from kvsim.simcore.catalog import GPUS, get_gpu, get_model
    from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION, EngineConfig
    from kvsim.workloads import load_workload

    started = time.perf_counter()
    if autoscale and slo_targets:
        raise ConfigError("--slo does not apply with --autoscale (its SLOs are per-request limits: "
                          "--slo-ttft-p95-ms / --slo-tpot-p95-ms with --attainment)")
    if autoscale:  # what it would silently ignore is refused (it plans vLLM V1 at the profile's own step times)
        for flag, given in (("--engine-version", engine_version is not None), ("--usage-context", usage_context is not None),
                            ("--confidence", confidence != 0.5)):
            if given:
                raise ConfigError(f"{flag} does not apply to plan --autoscale yet (it plans {DEFAULT_ENGINE_VERSION} at "
                                  "the profile's step times)")
        ignored = [p for p in ctx.command.params if p.name not in AUTOSCALE_OPTIONS
                   and ctx.get_parameter_source(p.name).name != "DEFAULT"]
        if ignored:  # e.g. --input-len or --speculative-config: the plan ran the workload's day without them
            raise ConfigError(f"{ignored[0].opts[0]} does not apply to plan --autoscale yet (it plans the workload's "
                              f"own traffic on one --model, --gpu and --tp at {DEFAULT_ENGINE_VERSION}'s defaults)")
        _plan_autoscale(model, gpu, tp, workload, slo_ttft_p95_ms, slo_tpot_p95_ms, attainment, max_replicas,
                        provisioning_delay, price, seed, as_json, out, rate)
        return
    for flag, given in (("--attainment", attainment != 0.99), ("--max-replicas", max_replicas != 8),
                        ("--provisioning-delay", provisioning_delay is not None)):
        if given:
            raise ConfigError(f"{flag} applies only with --autoscale")
    if rate is None:
        raise ConfigError("--rate is required: the target request rate(s) in req/s (or plan a day with --autoscale)")
    goodput_ms = parse_goodput(goodput, ctx.args)
    from kvsim.reports.capacity import parse_slo_targets

    targets = parse_slo_targets(slo_targets, slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms)
    rates = _list("--rate", rate, float, [])
    if len(rates) > MAX_TARGET_RATES:  # each target is sized and confirmed with its own runs
        raise ConfigError(f"--rate: at most {MAX_TARGET_RATES} target rates in one plan, got {len(rates):,}")
    for r in rates:
        if not r > 0:
            raise ConfigError(f"--rate must be > 0 req/s, got {r:g}")
    models = [get_model(m) for m in _list("--model", model, str, [])]
    gpus = [get_gpu(g).name for g in _list("--gpu", gpu, str, list(GPUS))]
    if gpu is not None:
        from kvsim.reports.sweep import check_distinct

        check_distinct("--gpu", gpus, gpu)  # a catalog name in two cases: one GPU searched twice
    from kvsim.cli.options import check_seed

    check_seed(seed)
    from kvsim.reports.capacity import MIN_TOLERANCE

    if not MIN_TOLERANCE <= tolerance < 1:  # NaN fails too
        raise ConfigError(f"--tolerance must be from {MIN_TOLERANCE:g} to below 1, got {tolerance}")
    for flag, value in (("--search-requests", search_requests), ("--confirm-requests", confirm_requests)):
        if value < 50:
            raise ConfigError(f"{flag} must be >= 50 (a run needs a warm-up and a tail), got {value}")
        if value > MAX_RUN_REQUESTS:  # every candidate runs several searches of this many: bounded up front
            shown = str(value) if len(str(value)) <= 40 else f"{str(value)[:18]}...{str(value)[-18:]}"
            raise ConfigError(f"{flag} must be at most {MAX_RUN_REQUESTS:,} (each candidate runs several "
                              f"simulations of that many requests), got {shown}")
    if not 1 <= jobs <= 1024:  # one process each
        raise ConfigError(f"--jobs must be from 1 to 1024, got {jobs}")
    if confirm_top < 1:
        raise ConfigError(f"--confirm-top must be >= 1, got {confirm_top}")
    if not MIN_CONFIDENCE <= confidence <= 1 - MIN_CONFIDENCE:  # 1e-300 scaled step times past the datasheet
        raise ConfigError(f"--confidence must be from {MIN_CONFIDENCE:g} to {1 - MIN_CONFIDENCE:g} (a stated error "
                          f"says nothing about tails beyond), got {confidence:g}")
    if confidence != 0.5 and disagg != "off":  # its candidates are priced by reports.plan_disagg's own runs
        raise ConfigError("--confidence applies to aggregated candidates only, not with --disagg on or auto")
    from kvsim.simcore.specs import ENGINE_PRESETS, ENGINE_VERSIONS

    if engine_version is not None and engine_version not in ENGINE_VERSIONS:
        raise ConfigError(f"--engine-version must be one of {', '.join(ENGINE_VERSIONS)}, got {engine_version!r}")
    if disagg not in ("off", "on", "auto"):
        raise ConfigError(f"--disagg must be off, on or auto, got {disagg!r}")
    if disagg == "off" and (disagg_ratios is not None or disagg_placement is not None):
        raise ConfigError("--disagg-ratios / --disagg-placement apply only with --disagg on or auto")
    if disagg == "on" and out is not None:
        raise ConfigError("--out is not written with --disagg on yet: use --disagg auto (the disaggregated rows go "
                          "to plan.json)")
    if disagg == "on" and speculative_config is not None:  # its candidates would silently run without it
        raise ConfigError("--speculative-config is not modelled with disaggregated prefill/decode yet: plan it "
                          "with --disagg off or auto (the aggregated candidates)")
    if disagg == "on":  # knobs reports.plan_disagg's pools do not take: the answer was the same without them
        for flag, name in (("--block-size", "block_size"), ("--gpu-memory-utilization", "gpu_memory_utilization"),
                           ("--max-num-seqs", "max_num_seqs"), ("--chunked-prefill", "chunked_prefill"),
                           ("--pp", "pp"), ("--router", "router"), ("--kv-offloading-size", "kv_offloading_size")):
            if ctx.get_parameter_source(name).name != "DEFAULT":
                raise ConfigError(f"{flag} does not apply to disaggregated candidates yet (their pools run at the "
                                  "defaults): plan it with --disagg off or auto (the aggregated candidates)")
    if disagg_placement not in (None, "same-node", "cross-node"):
        raise ConfigError(f"--disagg-placement must be same-node or cross-node, got {disagg_placement!r}")
    from kvsim.reports import plan_disagg

    ratios = plan_disagg.parse_ratios(disagg_ratios)
    prices = load_prices(price)
    check_inputs_kept(out, [workload, *model.split(","), *(price or [])], PLAN_FILES)
    check_out_folder(out, PLAN_FILES)  # before any work
    dims = default_dimensions(
        gpus, _list("--tp", tp, int, [1, 2, 4, 8]),
        block_size=_list("--block-size", block_size, int, []),
        gpu_memory_utilization=_list("--gpu-memory-utilization", gpu_memory_utilization, float, []),
        max_num_seqs=_list("--max-num-seqs", max_num_seqs, int, []),
        enable_chunked_prefill=_bools("--chunked-prefill", chunked_prefill) or [],
        kv_cache_dtype=_kv_cache_dtypes(kv_cache_dtype, []),
        quantization=_quantizations(quantization, []),
        pipeline_parallel_size=_list("--pp", pp, int, []),
        speculative_config=_speculative(speculative_config, models),
        **_tier_lists(router, kv_offloading_size),
    )
    size = len(models) * math.prod(len(d.values) for d in dims)
    if size > MAX_CANDIDATES:  # each candidate is planned, bounded and searched with simulations
        raise ConfigError(f"the plan has {size:,} candidates (models x GPUs x the lists' lengths); at most "
                          f"{MAX_CANDIDATES:,}: narrow the lists")
    base = EngineConfig() if engine_version is None else EngineConfig(engine_version=engine_version,
                                                                         **ENGINE_PRESETS[engine_version])
    for d in dims[1:]:
        for v in d.values:  # bad values fail here, before any run
            EngineConfig(**{d.field: v})
    from kvsim.reports.plan import expand, refuse_unconfigurable
    from kvsim.simcore.batch_defaults import DEFAULT_USAGE_CONTEXT, multi_step_words

    fill = batch_default_fields(engine_version, usage_context, max_num_seqs=max_num_seqs, max_num_batched_tokens=None)
    batch = (fill, usage_context or DEFAULT_USAGE_CONTEXT) if fill else None  # per candidate GPU
    for m in models:  # a model no candidate can be configured for (e.g. --tp dividing none of its heads)
        refuse_unconfigurable(m, expand(m, dims, base, batch))
    max_len = min(base.resolved_max_model_len(m) for m in models)
    overrides = {"rate": max(rates), "num_requests": max(search_requests, confirm_requests),
                 "input_len": input_len, "output_len": output_len, "burstiness": burstiness}
    spec = _workload(load_workload, workload, overrides, max_len)
    _check_trace_prompts(spec, max_len, as_json)
    from kvsim.cli.options import check_router_workload

    check_router_workload(_routers(router), spec)
    if disagg != "off" and getattr(spec, "is_session", False):
        raise ConfigError(f"--disagg {disagg} does not plan session workloads ({spec.name}) yet: plan them "
                          "aggregated (--disagg off)")
    slo = SLO.of(targets, tuple(goodput_ms.items()))
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    unit = "sessions/s" if getattr(spec, "is_session", False) else "req/s"
    engine = _engine_context(base, engine_version is not None, fill, usage_context or DEFAULT_USAGE_CONTEXT)
    chunked_values = _bools("--chunked-prefill", chunked_prefill) or [base.enable_chunked_prefill]
    if disagg == "on":  # its pools run V1's scheduler (chunked prefill on)
        chunked_values = [True]
    engine["multi_step"] = multi_step_words(base.engine_version, chunked_values) or None
    import dataclasses

    from kvsim.cli.options import check_rounds_width

    check_rounds_width(spec, [dataclasses.replace(base, enable_chunked_prefill=c) for c in chunked_values])  # as run
    say(f"Planning {', '.join(m.name for m in models)} at {', '.join(f'{r:g}' for r in rates)} {unit} "
        f"with {slo.text()}; workload {spec.name}, seed {seed}, engine {_engine_words(engine)}")
    from kvsim.cli.output import LiveProgress

    if disagg == "on":  # disaggregated candidates only
        _plan_disagg(models, gpus, tp, base, ratios, spec, slo, prices, rates, seed, tolerance, search_requests,
                     confirm_requests, disagg_placement, kv_cache_dtype, quantization, None, out, as_json, started)
        return
    progress = LiveProgress("planning", None, "candidates searched")
    pool = None
    if jobs > 1:  # searches `jobs` at a time: the answer is the same, losers may be cut short differently
        from kvsim.reports.sweep_runner import process_pool

        pool = process_pool(jobs)  # workers die with this process (SIGKILL included)
    try:
        result = make_plan(models, dims, base, rates, spec, slo, prices, seed=seed, tolerance=tolerance,
                           search_requests=search_requests, confirm_requests=confirm_requests,
                           confirm_top=confirm_top, progress=progress.update, map_fn=pool.map if pool else map,
                           batch=jobs, profile_for=_profiles_at(confidence), batch_defaults=batch)
    except KeyboardInterrupt:
        if pool is not None:
            from kvsim.reports.sweep_runner import stop_workers

            stop_workers(pool)
        raise
    finally:
        progress.stop()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    from kvsim.profiles.uncertainty import ROOFLINE_BY_TP, roofline_error

    result.context["confidence"] = confidence
    result.context.update(engine)
    result.context["model_error"] = {  # what --confidence scaled a roofline profile's step times by, per TP
        "roofline": {str(tp): {**e.to_dict(), "step_time_factor": e.factor_at_confidence(confidence)._asdict()}
                     for tp in ROOFLINE_BY_TP for e in [roofline_error(tp)]}}
    _slo_probabilities(result, confidence, spec, confirm_requests, seed, slo)
    if disagg == "auto":
        _plan_disagg(models, gpus, tp, base, ratios, spec, slo, prices, rates, seed, tolerance, search_requests,
                     confirm_requests, disagg_placement, kv_cache_dtype, quantization, result, out, as_json, started)
        return
    wall = time.perf_counter() - started
    _emit(result, slo, prices, out, as_json, wall)


def _scaled_words(result) -> str:
    """': step times x1.34 prefill / x1.49 decode' for the answers' profiles (none at 50%)."""
    seen = []
    for answer in result.answers:
        e = (answer.get("slo_probability") or {}).get("model_error")
        if e is not None and e.get("step_time_factor") and (e["kind"], e["tp"]) not in [s[:2] for s in seen]:
            f = e["step_time_factor"]
            seen.append((e["kind"], e["tp"], f))
    if not seen or all(f["prefill"] == f["decode"] == 1.0 for *_, f in seen):
        return ""
    from kvsim.profiles.uncertainty import PhaseFactors

    return ": step times " + ", ".join(f"{PhaseFactors(**f).text()} ({kind} TP {tp})" for kind, tp, f in seen)


def _slo_probabilities(result, confidence: float, spec, confirm_requests: int, seed: int, slo) -> None:
    """Each answer's probability of meeting the SLO under its profile's stated error
    (reports/plan_confidence.py), as `slo_probability` on the answer; its runs are counted."""
    from statistics import NormalDist

    from kvsim.profiles.uncertainty import profile_error
    from kvsim.reports.plan import _cell_value, sized
    from kvsim.reports.plan_confidence import slo_probability, stretches_with_steps

    spec_confirm = sized(spec, confirm_requests)  # (a session workload keeps whole sessions)
    z = NormalDist().inv_cdf(confidence) if confidence != 0.5 else 0.0
    for answer in result.answers:
        best = answer["best"]
        if best is None:
            continue
        a = next(a for a in result.assessments[answer["model"]]
                 if a.profile is not None and all(best.get(k) == _cell_value(k, v) for k, v in a.candidate.values))
        error = profile_error(a.profile)
        planned = None  # the confirmation's percentiles, where they bound the search (plan_confidence)
        if str(best.get("confirmed", "")).startswith("yes") and stretches_with_steps(a.candidate.config):
            planned = {"p95_ttft_ms": best.get("ttft_p95_ms"), "p95_tpot_ms": best.get("tpot_p95_ms"),
                       **{t.key: best.get(t.column) for t in slo.percentile_ms}}
        p = slo_probability(a, best["replicas"], answer["target_rate"], spec_confirm, seed, slo, error, z, planned)
        result.num_runs += p["runs"]
        answer["slo_probability"] = {**p, "model_error": {**error.to_dict(), "text": error.text(),
                                                          "step_time_factor": error.factor(z)._asdict()}}


def _profiles_at(confidence: float):
    """Each candidate's default profile with its step times at this confidence of its stated error."""
    from kvsim.profiles import default_profile
    from kvsim.profiles.uncertainty import profile_error, scaled_profile

    def profile_for(c):
        prof = default_profile(c.gpu, c.config.resolve_model(c.model), c.config.tensor_parallel_size)
        return scaled_profile(prof, profile_error(prof).factor_at_confidence(confidence))

    return profile_for
def _plan_disagg(models, gpus, tp, base, ratios, spec, slo, prices, rates, seed, tolerance, search_requests,
                 confirm_requests, placement, kv_cache_dtype, quantization, agg, out, as_json, started) -> None:
    """The disaggregated half of a plan (reports.plan_disagg), after the aggregated one (`agg`, or
    None with --disagg on); prints both and which layout is cheaper at each target."""
    import dataclasses
    import itertools

    import pandas as pd

    from kvsim.reports import plan_disagg as pd_plan
    from kvsim.reports.plan import mean_output_tokens, ms_text
    from kvsim.simcore.catalog import get_gpu

    kvs = _kv_cache_dtypes(kv_cache_dtype, ["auto"])
    quants = _quantizations(quantization, ["none"])
    cands = []
    for kv, q in itertools.product(kvs, quants):
        cands += pd_plan.candidates(models, [get_gpu(g) for g in gpus], _list("--tp", tp, int, [1, 2, 4, 8]), ratios,
                                    dataclasses.replace(base, kv_cache_dtype=kv, quantization=q))
    if len(cands) > MAX_CANDIDATES:
        raise ConfigError(f"the disaggregated plan has {len(cands):,} candidates; at most {MAX_CANDIDATES:,}: "
                          "narrow --gpu, --tp or --disagg-ratios")
    spec_confirm = dataclasses.replace(spec, num_requests=min(confirm_requests, int(spec.num_requests)))
    take = min(search_requests, int(spec_confirm.num_requests))
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    say(f"Disaggregated candidates: {len(cands)} (units of P prefill + D decode instances, ratios "
        f"{', '.join(f'{p}:{d}' for p, d in ratios)}); Python engine")
    pd_plan.assess(cands, spec_confirm, take, slo, prices, seed)
    agg_best = {}
    best = {t: math.inf for t in rates}
    if agg is not None:
        for answer in agg.answers:
            row = answer["best"]
            agg_best[(answer["model"], answer["target_rate"])] = row
            if row is not None:
                best[answer["target_rate"]] = min(best[answer["target_rate"]], row["usd_per_hour"])
    runs = pd_plan.search(cands, spec_confirm, take, slo, seed, rates, tolerance, placement, best)
    out_tokens = mean_output_tokens(spec_confirm, seed)
    rows, answers = [], []
    for model in models:
        mine = [c for c in cands if c.model.name == model.name]
        for target in rates:
            target_rows, n = pd_plan.rows_for_target(mine, target, spec_confirm, seed, slo, placement, out_tokens)
            runs += n
            rows += target_rows
            top = next((r for r in target_rows if str(r["confirmed"]).startswith("yes")), None)
            line = pd_plan.comparison(agg_best.get((model.name, target)), top) if agg is not None else None
            answers.append({"model": model.name, "target_rate": target, "best": top, "comparison": line,
                            "why_none": None if top else pd_plan.why_none(target_rows)})
    table = pd.DataFrame(rows)
    wall = time.perf_counter() - started
    if agg is not None:
        agg_table = agg.table.assign(layout="agg")
        agg.table = agg_table
    for answer in answers:  # issue 27: each answer names the engine version it assumes
        answer["engine_version"] = base.engine_version
    doc_disagg = {"answers": answers, "candidates": _records(table) if len(table) else [], "num_runs": runs,
                  "ratios": [f"{p}:{d}" for p, d in ratios], "placement": placement or "default"}
    if agg is not None:
        _emit(agg, slo, prices, out, as_json, wall, extra={"disagg": doc_disagg})
    elif as_json:
        typer.echo(json.dumps({"disagg": doc_disagg, "slo": slo.describe(), "engine_version": base.engine_version},
                              indent=2, default=str))
    if as_json:
        return
    for answer in answers:
        part = [r for r in rows if r["model"] == answer["model"] and r["target_rate"] == answer["target_rate"]]
        typer.echo(f"\n{answer['model']} at {answer['target_rate']:g} req/s, disaggregated")
        typer.echo(_disagg_table(part))
    typer.echo("")
    for answer in answers:
        b = answer["best"]
        head = f"{answer['model']} at {answer['target_rate']:g} req/s with {slo.text()}: "
        if b is None:
            typer.echo("Disaggregated: " + head + "no disaggregated candidate meets the SLO: " + answer["why_none"])
        else:
            typer.echo("Disaggregated: " + head + f"{b['deployment']} {b['gpu']} (units of {b['prefill']} prefill + "
                       f"{b['decode']} decode; {b['gpus']} GPUs), ${b['usd_per_hour']:,.2f}/h, sustains "
                       f"{'at least ' if b['capped'] else '~'}{b['max_rate']:.1f} req/s, "
                       f"${b['usd_per_m_output_tokens']:.2f} per M output tokens; confirmed {b['confirmed']} "
                       f"(TTFT p95 {ms_text(b['ttft_p95_ms'], ',.0f')} ms, TPOT p95 {ms_text(b['tpot_p95_ms'])} ms)")
        if answer["comparison"]:
            typer.echo(f"Layout at {answer['target_rate']:g} req/s: {answer['comparison']}")
    typer.echo(f"Disaggregated part: {runs} simulations; planned in {wall:.1f} s in all.")


def _disagg_table(rows) -> str:
    head = ["#", "GPUs", "deployment", "GPU", "$/h", "max req/s", "req/s/GPU", "TTFT p95", "TPOT p95", "$/M out", "confirmed"]
    cells, rank = [], 0
    for r in rows:
        ok = r["units"] is not None
        rank += ok
        cells.append([
            str(rank) if ok else "-", _cell(r["gpus"], ".0f") if ok else "-",
            r["deployment"] if ok else f"unit {r['prefill']}P+{r['decode']}D", r["gpu"],
            _cell(r["usd_per_hour"], ",.2f"), _cell(r["max_rate"], ".1f") if ok else "-",
            _cell(r["max_rate_per_gpu"], ".3f"), _cell(r["ttft_p95_ms"], ",.0f"), _cell(r["tpot_p95_ms"], ".1f"),
            _cell(r.get("usd_per_m_output_tokens"), ".2f"), r["confirmed"] if ok else _clip(str(r["status"]), 110),
        ])
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() for c in cells]
    return "\n".join(lines)


def _tier_lists(router: str | None, kv_offloading_size: str | None) -> dict[str, list]:
    """--router and --kv-offloading-size as plan dimensions (kvsim sweep's parsing)."""
    from kvsim.cli.sweep_cmd import _tier_lists as lists

    return lists(router, kv_offloading_size)


def _speculative(text: str | None, models: list) -> list:
    """--speculative-config as a plan dimension (empty: not searched); a method one of the models
    cannot use (mtp without MTP layers) is refused, not planned as "unsupported" candidates."""
    if text is None:
        return []
    from kvsim.simcore.speculative import parse_speculative_configs

    configs = parse_speculative_configs(text)
    for config in configs:
        for m in models:
            if config is not None:
                config.check_model(m)
    return configs


def _workload(load_workload, name: str | None, overrides: dict[str, Any], max_len: int):
    """The workload with enough requests for the longest run (a trace: at most its rows)."""
    import dataclasses

    from kvsim.workloads.traces import window_rows

    want = overrides.pop("num_requests")
    spec = load_workload(name, overrides, max_model_len=max_len)
    if getattr(spec, "is_session", False):  # --rate is sessions/s; enough whole sessions for `want` turns
        from kvsim.reports.capacity import rate_scaler
        from kvsim.reports.plan import sized

        if spec.trace is None:  # drawn sessions: as many as the runs need, whatever the file's count
            per = spec.num_requests / int(spec.num_sessions)
            spec = dataclasses.replace(spec, num_sessions=max(1, math.ceil(want / per)))
        spec = sized(spec, want)
        rate_scaler(spec)  # refuses what a rate search cannot rescale (a closed loop), before any work
        return spec
    if spec.trace is not None:
        first, last = window_rows(spec.trace, spec.trace_options)
        want = min(want, last - first)
    return dataclasses.replace(spec, num_requests=want)


def _check_trace_prompts(spec, max_len: int, as_json: bool) -> None:
    """Trace prompts longer than max_model_len are rejected by every deployment (as vLLM rejects
    them, and as `kvsim run` reports them): all of them is no workload to plan for; some of them
    is a warning, and the plan sizes for the requests that are served."""
    if spec.trace is None or getattr(spec, "is_session", False):
        return
    from kvsim.workloads.traces import window_rows

    first, last = window_rows(spec.trace, spec.trace_options)
    prompts = spec.trace.num_prompt_tokens[first:last]
    over = int((prompts > max_len).sum())
    if over and over == len(prompts):
        raise ConfigError(f"--workload {spec.source}: every one of its {over:,} requests has a prompt longer than "
                          f"max_model_len {max_len} (the longest {int(prompts.max()):,} tokens); vLLM rejects them "
                          "all, so no deployment serves this workload")
    if over:
        typer.echo(f"WARNING {over:,} of {len(prompts):,} trace rows have prompts longer than max_model_len "
                   f"{max_len}; every deployment rejects them, as vLLM does; the plan sizes for the rest", err=True)


COLUMNS = [("rank", "#"), ("gpus", "GPUs"), ("layout", "replicas x TP"), ("gpu", "GPU"), ("knobs", "engine"),
           ("usd_per_hour", "$/h"), ("max_rate", "max req/s"), ("headroom", "headroom"),
           ("ttft_p95_ms", "TTFT p95 ms"), ("tpot_p95_ms", "TPOT p95 ms"), ("usd_per_m", "$/M out tok"),
           ("confirmed", "confirmed")]


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _clip(text: str, width: int) -> str:
    """One table cell: cut to `width` with a visible mark (the whole text is in --json / plan.json)."""
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def _text_table(rows, slo=None, unit: str = "req/s") -> str:
    from kvsim.reports.plan import _KNOBS

    extra = list(slo.percentile_ms) if slo is not None else []  # targets beyond the two p95 columns
    columns = [*COLUMNS[:6], ("max_rate", f"max {unit}"), *COLUMNS[7:10], *((t.column, f"{t.name} ms") for t in extra),
               *COLUMNS[10:]]
    lines, cells = [], []
    rank = 0
    for r in rows:
        ok = r["replicas"] is not None and not (isinstance(r["replicas"], float) and math.isnan(r["replicas"]))
        if ok:
            rank += 1
        knobs = " ".join(f"{k}={r[k]}" for k in _KNOBS if k in r and r[k] is not None and r[k] == r[k])
        cells.append([
            str(rank) if ok else "-", _cell(r["gpus"], ".0f") if ok else "-",
            f"{int(r['replicas'])} x TP{r['tp']}" if ok else f"TP{r['tp']}", r["gpu"], knobs or "default",
            _cell(r["usd_per_hour"], ",.2f"),
            ("<" if r.get("max_rate_bound") else "") + (_cell(r["max_rate"], ".1f") + ("+" if r.get("capped") else ""))
            if ok and r["max_rate"] is not None else "-",
            _cell(100 * r["headroom"], "+.0f") + "%" if ok and r["headroom"] is not None else "-",
            _cell(r["ttft_p95_ms"], ",.0f"), _cell(r["tpot_p95_ms"], ".1f"),
            *(_cell(r.get(t.column), ",.1f") for t in extra),
            _cell(r.get("usd_per_m_output_tokens"), ".2f"),
            r["confirmed"] if ok else _clip(str(r["status"]), 110),
        ])
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, (_, h) in enumerate(columns)]
    lines.append("  ".join(h.ljust(w) for (_, h), w in zip(columns, widths, strict=True)).rstrip())
    for c in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _records(frame) -> list[dict[str, Any]]:
    import pandas as pd

    return [{k: (None if v is None or (not isinstance(v, str | dict | list) and pd.isna(v)) else v)
             for k, v in row.items()} for row in frame.astype(object).to_dict("records")]


def _emit(result, slo, prices: dict[str, float], out: Path | None, as_json: bool, wall: float,
          extra: dict[str, Any] | None = None) -> None:
    from kvsim.reports.plan import answer_line
    from kvsim.reports.prices import PRICE_SOURCE, PRICES_AS_OF

    version = result.context.get("engine_version")
    if version is not None:  # every candidate's row says it (plan.csv)
        for row in result.rows:
            row.setdefault("engine_version", version)
        if result._table is not None and "engine_version" not in result._table.columns:  # a table made already
            result.table = result._table.assign(engine_version=version)
    records = result.records()  # without pandas (its import is a third of a small plan's process)
    unit = result.context.get("rate_unit", "req/s")
    conf = result.context.get("confidence", 0.5)
    engine = f"engine {_engine_words(result.context)}; " if version is not None else ""
    note = f" [{engine}at {100 * conf:g}% confidence under the profiles' stated error{_scaled_words(result)}]"
    doc = {
        "answers": [{**a, "confidence": conf, "engine_version": version, "line": answer_line(a, slo) + note}
                    for a in result.answers],
        # no wall time here: the same command and seed write the same plan.json (it is printed instead)
        "candidates": records, "num_runs": result.num_runs,
        "prices_usd_per_gpu_hour": prices, "prices_as_of": PRICES_AS_OF, "price_source": PRICE_SOURCE,
        **result.context, **(extra or {}),
    }
    if out is not None:
        _write(out, result.table, doc, result)
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    for answer in result.answers:
        part = [r for r in records if r["model"] == answer["model"] and r["target_rate"] == answer["target_rate"]]
        typer.echo(f"\n{answer['model']} at {answer['target_rate']:g} {unit}")
        typer.echo(_text_table(part, slo, unit))
    typer.echo("")
    for answer, shown in zip(result.answers, doc["answers"], strict=True):
        typer.echo("Answer: " + shown["line"])
        best = answer["best"]
        p = answer.get("slo_probability")
        if p is not None:
            e = p["model_error"]
            typer.echo(f"Meets the SLO with probability {_percent(p['probability'])} under the profile's stated "
                       f"error ({e['kind']} TP {e['tp']}: median {e['text']} per step; between "
                       f"{_percent(p['low'])} and {_percent(p['high'])}, {p['runs']} re-runs of the confirmation)")
        if best is not None and best.get("vllm_serve"):
            typer.echo(f"Serve it: {best['replicas']} x `{best['vllm_serve']}`"
                       + (" behind a load balancer" if best["replicas"] > 1 else ""))
    typer.echo(f"Planned in {wall:.1f} s ({result.num_runs} simulations; max {unit} = replicas x one replica's "
               f"max sustainable rate, within {100 * result.context['tolerance']:g}%; prices as of {PRICES_AS_OF}).")
    if out is not None:
        typer.echo(f"Wrote {out}/plan.csv, plan.json, capacity.png" + (", plan.parquet" if _has_pyarrow() else "")
                   + ", plan.html")


def _engine_context(base, given: bool, fill, usage_context: str) -> dict[str, Any]:
    """What every candidate assumes of the engine (issue 27): plan.json's keys."""
    return {"engine_version": base.engine_version, "engine_version_given": given,
            "usage_context": usage_context if fill else None, "batch_defaults_filled": sorted(fill)}


def _engine_words(c: dict[str, Any]) -> str:
    """`vllm-v1 (default; vLLM's server defaults per GPU)`, or `vllm-0.6 (vLLM's server defaults per
    GPU)` where --engine-version named it; the step limits the version filled are named."""
    default = "" if c.get("engine_version_given") else "default"
    filled = f"vLLM's {c['usage_context']} defaults per GPU" if c.get("batch_defaults_filled") else ""
    words = "; ".join(w for w in (default, filled, c.get("multi_step")) if w)
    return c["engine_version"] + (f" ({words})" if words else "")


def _percent(p: float) -> str:
    return f"{100 * p:.1f}%" if 0.001 < p < 0.999 else f"{100 * p:.2f}%"


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _write_parquet(table, path: Path) -> None:
    with open(path, "wb") as f:  # a handle, not the path: pyarrow cannot encode a non-UTF-8 name
        table.to_parquet(f, index=False)


def _write(out: Path, table, doc: dict[str, Any], result) -> None:
    import tempfile

    from kvsim.reports.files import write_files
    from kvsim.reports.plan import capacity_figure
    from kvsim.reports.plan_page import plan_page

    with tempfile.TemporaryDirectory(prefix="kvsim-plan-") as tmp:
        png = Path(tmp) / "capacity.png"  # drawn once: the file and plan.html's figure
        capacity_figure(result, png)
        page = plan_page(json.loads(json.dumps(doc, default=str)), png)  # the page reads what plan.json holds
        writers = {
            "plan.csv": lambda p: table.to_csv(p, index=False),
            "plan.json": lambda p: p.write_text(json.dumps(doc, indent=2, default=str) + "\n"),
            "capacity.png": lambda p: p.write_bytes(png.read_bytes()),
            "plan.html": lambda p: p.write_text(page),
        }
        if _has_pyarrow():
            writers["plan.parquet"] = lambda p: _write_parquet(table, p)
        write_files(out, writers, PLAN_FILES)  # (an earlier plan's plan.parquet goes with it when pyarrow is gone)


__all__ = ["plan"]


def _plan_autoscale(model, gpu, tp, workload, slo_ttft_ms, slo_tpot_ms, attainment, cap, provisioning, price, seed,
                    as_json, out, rate) -> None:
    """`kvsim plan --autoscale`: reports.autoscale_plan on one model, GPU and TP."""
    from kvsim.profiles import default_profile
    from kvsim.reports.autoscale_plan import answer_lines, hour_length, plan_autoscale
    from kvsim.reports.prices import load_prices
    from kvsim.simcore.autoscale import DEFAULT_PROVISIONING_S, AutoscaleConfig
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.parallel import check_deployment
    from kvsim.simcore.specs import EngineConfig
    from kvsim.workloads import load_workload

    for flag, value in (("--model", model), ("--gpu", gpu), ("--tp", tp)):
        if value is None or "," in value:
            raise ConfigError(f"--autoscale plans one deployment: give exactly one {flag}")
    if rate is not None:
        raise ConfigError("--autoscale plans over the workload's own day: --rate does not apply")
    if out is not None:
        raise ConfigError("--out is not written by plan --autoscale yet; use --json")
    if not 0 < attainment <= 1:
        raise ConfigError(f"--attainment must be in (0, 1], got {attainment}")
    if not 1 <= cap <= 64:
        raise ConfigError(f"--max-replicas must be from 1 to 64, got {cap}")
    try:
        tp_n = int(tp)
    except ValueError:
        raise ConfigError(f"--tp must be an integer, got {tp!r}") from None
    model_spec, gpu_spec = get_model(model), get_gpu(gpu)
    engine = EngineConfig(tensor_parallel_size=tp_n)
    model_spec = engine.resolve_model(model_spec)
    check_deployment(model_spec, gpu_spec, engine)
    policy = AutoscaleConfig(min_replicas=1, max_replicas=cap,
                             provisioning_s=DEFAULT_PROVISIONING_S if provisioning is None else provisioning)
    wl = load_workload(workload or "diurnal", {}, max_model_len=engine.resolved_max_model_len(model_spec))
    prices = load_prices(price)
    profile = default_profile(gpu_spec, model_spec, tp_n)
    ttft, tpot = slo_ttft_ms or 1000.0, slo_tpot_ms or 100.0
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    say(f"Planning autoscaling for {model_spec.name} on {gpu_spec.name} TP {tp_n} (engine {engine.engine_version}, "
        f"default) over workload {wl.name}: attainment "
        f">= {100 * attainment:g}% of requests with TTFT <= {ttft:g} ms and TPOT <= {tpot:g} ms; cold start "
        f"{policy.provisioning_s:g} s + load + {policy.warmup_s:g} s warm-up")
    found = plan_autoscale(model_spec, gpu_spec, engine, wl, profile, seed, attainment, ttft, tpot, cap, policy,
                           prices.get(gpu_spec.name), hour_length(wl), say)
    if as_json:
        typer.echo(json.dumps({**found, "goal": attainment, "slo": {"ttft_ms": ttft, "tpot_ms": tpot},
                               "engine_version": engine.engine_version}, indent=2))
        return
    for line in answer_lines(found, attainment):
        typer.echo(line)
