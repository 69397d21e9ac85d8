"""Options shared by `kvsim run` and `kvsim sweep`, defined once (type, flag and help)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.simcore.errors import ConfigError
from kvsim.simcore.policies.registry import policy_names
from kvsim.simcore.specs import ModelSpec

PolicyName = Enum("PolicyName", {name: name for name in policy_names()}, type=str)  # the registry's


class AllocatorName(str, Enum):
    paged = "paged"
    contiguous = "contiguous"


class ReservationName(str, Enum):
    max = "max"
    pow2 = "pow2"
    oracle = "oracle"


class PreemptionMode(str, Enum):
    recompute = "recompute"
    swap = "swap"


class KvCacheDtype(str, Enum):
    auto = "auto"
    fp8 = "fp8"
    fp8_e4m3 = "fp8_e4m3"
    fp8_e5m2 = "fp8_e5m2"


class QuantizationName(str, Enum):
    fp8 = "fp8"


class EngineCore(str, Enum):
    auto = "auto"
    c = "c"
    python = "python"


class Placement(str, Enum):
    same_node = "same-node"
    cross_node = "cross-node"


class RouterName(str, Enum):
    round_robin = "round-robin"
    least_loaded = "least-loaded"
    prefix_aware = "prefix-aware"
    session_affinity = "session-affinity"


Model = Annotated[str, typer.Option(help="Catalog model name or a Hugging Face config.json.")]
Gpu = Annotated[str, typer.Option(help="Catalog GPU: H100-SXM-80GB, H200-141GB, A100-80GB, A100-40GB.")]
Allocator = Annotated[AllocatorName | None, typer.Option(help="KV allocation for continuous batching: paged (vLLM) or contiguous (Orca). [default: paged]")]
Reservation = Annotated[ReservationName | None, typer.Option(help="Orca reservation size: max_model_len, prompt + next power of two of the output, or prompt + the true output. [default: max]")]
MaxNumBatchedTokens = Annotated[int | None, typer.Option(help="Token budget of one step. [default: the engine version's vLLM default on the GPU: 8192 on an H100 for vllm-v1 (vllm serve); static / dynamic batching and --fleet groups: 8192 with chunked prefill, else max_model_len]")]
EnableChunkedPrefill = Annotated[bool | None, typer.Option("--enable-chunked-prefill/--no-enable-chunked-prefill", help="Split long prompts across steps. [default: on]")]
EnablePrefixCaching = Annotated[bool | None, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="Reuse KV blocks of shared prompt prefixes (vLLM V1's automatic prefix caching). [default: on]")]
EngineVersion = Annotated[str | None, typer.Option(help="vLLM version the engine's host cost and scheduler defaults model: vllm-v0 (Ray workers, synchronous output processing, no chunked prefill), vllm-0.6 (multi-step scheduling, 10 steps), vllm-v1 (0.7-0.13: synchronous scheduling), vllm-v1-async (0.14+: async scheduling hides the engine's CPU work behind the GPU's step). [default: vllm-v1]")]
UsageContextOpt = Annotated[str | None, typer.Option("--usage-context", help="Whose defaults fill an unset --max-num-seqs / --max-num-batched-tokens, the engine version's per GPU (simcore/batch_defaults.py): server (vllm serve) or offline (the LLM class, vllm bench throughput). [default: server]")]
SwapSpace = Annotated[float | None, typer.Option(help="CPU swap space per GPU in GiB. [default: 4]")]
KvOffloadingSize = Annotated[float | None, typer.Option("--kv-offloading-size", help="CPU KV tier of a replica in GiB, summed over its GPUs (vLLM's native KV offloading): prefix-cache blocks are written through to host memory (LRU) and loaded back over PCIe on a hit. [default: none]")]
Preemption = Annotated[PreemptionMode | None, typer.Option(help="How a preempted sequence gives back its KV. [default: recompute]")]
MaxModelLen = Annotated[int | None, typer.Option(help="Longest prompt + output. [default: the model's]")]
MaxBatchSize = Annotated[int | None, typer.Option(help="Static batching: requests per batch. [default: 64]")]
BatchTimeout = Annotated[float | None, typer.Option(help="Static batching: longest wait for a full batch. [default: 0.1]")]
Workload = Annotated[str | None, typer.Option(help="Named workload (see `kvsim workloads`), a YAML file, or a trace (.csv / .jsonl). [default: sharegpt]")]
Rate = Annotated[float | None, typer.Option("--rate", "--request-rate", help="Open loop: request rate in req/s (Poisson unless --burstiness).")]
Concurrency = Annotated[int | None, typer.Option("--concurrency", "--max-concurrency", help="Closed loop: number of concurrent clients (vllm bench serve's --max-concurrency at its default --request-rate inf).")]
NumRequests = Annotated[int | None, typer.Option("--num-requests", "--num-prompts", help="Requests to simulate.")]
Burstiness = Annotated[float | None, typer.Option(help="Gamma arrivals: 1 is Poisson, lower is burstier.")]
InputLen = Annotated[int | None, typer.Option(help="Mean (or fixed) prompt length in tokens.")]
OutputLen = Annotated[int | None, typer.Option(help="Mean (or fixed) output length in tokens.")]
MaxTokens = Annotated[int | None, typer.Option(help="Fixed max_tokens cap per request (what reservations reserve).")]
N = Annotated[int | None, typer.Option("--n", help="Parallel samples per request.")]
BeamWidth = Annotated[int | None, typer.Option(help="Beam search width.")]
ThinkTime = Annotated[float | None, typer.Option(help="Closed loop: seconds a client waits between a response and its next request.")]
ProfilePath = Annotated[Path | None, typer.Option("--profile", help="Latency profile: a JSON file, or a committed profile's name from `kvsim list profiles`. [default: the committed profile for GPU/model/TP, else a roofline]")]
EngineCoreOpt = Annotated[EngineCore, typer.Option("--engine-core", help="Which engine runs the simulation: c (the compiled core: nearly every configuration; beam search and a few combinations run in Python, the record says why), python (every configuration), or auto (c where it applies). Same results either way.")]
KvCacheDtypeOpt = Annotated[KvCacheDtype, typer.Option("--kv-cache-dtype", help="KV cache storage: auto (the model dtype) or fp8 (1 byte per element: twice the KV tokens).")]
QuantizationOpt = Annotated[QuantizationName | None, typer.Option("--quantization", "-q", help="Weight quantization: fp8 (FP8 linear layers, FP8 tensor-core GEMMs; Hopper only). [default: the checkpoint's own]")]
PipelineParallel = Annotated[int, typer.Option("--pp", "--pipeline-parallel-size", help="Pipeline stages per replica, each --tp GPUs; stages beyond a node talk over the inter-node link (GPUs = tp x pp x dp).")]
RouterOpt = Annotated[RouterName | None, typer.Option("--router", help="How requests are spread over data-parallel replicas: round-robin, least-loaded, session-affinity (a conversation stays on its first replica), prefix-aware (llm-d's precise prefix-cache scorer: cached prefix, free KV and queue, weighted 2:1:1). [default: least-loaded]")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
SpeculativeConfigOpt = Annotated[str | None, typer.Option("--speculative-config", help="Speculative decoding, as vLLM's JSON: {\"method\": \"eagle\" | \"eagle3\" | \"mtp\" | \"ngram\" | \"draft_model\", \"model\": ..., \"num_speculative_tokens\": k}, plus kvsim's \"acceptance_rate\" (per draft token, given the ones before were accepted) or \"acceptance_rates\" (one per position), else a published default for the method.")]
Goodput = Annotated[list[str] | None, typer.Option("--goodput", help="Per-request SLOs in ms as `vllm bench serve --goodput`: ttft:500 tpot:50 e2el:20000 (space- or comma-separated, or repeated); adds request_goodput.")]
SloTargets = Annotated[list[str] | None, typer.Option("--slo", help="SLO at any percentile: METRIC:pP:MS with METRIC ttft, tpot, itl or e2el (vllm bench serve's metric names), e.g. --slo ttft:p99:800 --slo tpot:p90:50; repeatable. --slo-ttft-p95-ms 800 is ttft:p95:800.")]
SloTtftP95 = Annotated[float | None, typer.Option(help="SLO: p95 TTFT at most this many ms.")]
SloTpotP95 = Annotated[float | None, typer.Option(help="SLO: p95 TPOT at most this many ms.")]

def refuse_irrelevant(policy: str, allocator: str | None, given: dict[str, object]) -> None:
    """Options that mean nothing for the chosen policy are refused, not ignored (the policy
    registry says which options each policy reads)."""
    from kvsim.simcore.policies.registry import select

    select(policy, allocator, {flag[2:].replace("-", "_") for flag, value in given.items() if value is not None})


def engine_options(
    allocator: AllocatorName | None, reservation: ReservationName | None,
    max_num_batched_tokens: int | None, enable_chunked_prefill: bool | None,
    swap_space: float | None, preemption_mode: PreemptionMode | None, max_model_len: int | None,
    max_batch_size: int | None, batch_timeout_s: float | None, enable_prefix_caching: bool | None,
    kv_offloading_size: float | None = None,
    engine_version: str | None = None,
) -> tuple[dict[str, Any], dict[str, object]]:
    """(EngineConfig fields that were given, flag -> value for `refuse_irrelevant`). With
    --engine-version, the version's scheduler defaults (simcore.specs.ENGINE_PRESETS) fill the
    options not given; an option given on the command line wins."""
    from kvsim.simcore.specs import ENGINE_VERSIONS

    if engine_version is not None and engine_version not in ENGINE_VERSIONS:
        raise ConfigError(f"--engine-version must be one of {', '.join(ENGINE_VERSIONS)}, got {engine_version!r}")
    fields = {"engine_version": engine_version,
        "enable_prefix_caching": enable_prefix_caching,
        "max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len,
        "enable_chunked_prefill": enable_chunked_prefill, "swap_space": swap_space,
        "preemption_mode": preemption_mode.value if preemption_mode else None,
        "allocator": allocator.value if allocator else None,
        "reservation": reservation.value if reservation else None,
        "max_batch_size": max_batch_size, "batch_timeout_s": batch_timeout_s,
        "kv_offloading_size": kv_offloading_size,
    }
    given = {
        "--max-batch-size": max_batch_size, "--batch-timeout-s": batch_timeout_s,
        "--allocator": allocator, "--preemption-mode": preemption_mode, "--swap-space": swap_space,
        "--enable-chunked-prefill": enable_chunked_prefill, "--reservation": reservation,
        "--enable-prefix-caching": enable_prefix_caching, "--kv-offloading-size": kv_offloading_size,
        "--engine-version": engine_version,
    }
    return {k: v for k, v in fields.items() if v is not None}, given


def apply_engine_preset(fields: dict[str, Any], policy: str) -> None:
    """Fill the options `policy` reads and the user left unset with --engine-version's
    scheduler defaults (simcore.specs.ENGINE_PRESETS); nothing without --engine-version."""
    from kvsim.simcore.policies.registry import select
    from kvsim.simcore.specs import ENGINE_PRESETS

    version = fields.get("engine_version")
    if version is None:
        return
    spec = select(policy, fields.get("allocator"))
    for name, value in ENGINE_PRESETS[version].items():
        if name in spec.options:
            fields.setdefault(name, value)


def batch_default_fields(engine_version: str | None, usage_context: str | None,
                         **given: int | None) -> frozenset[str]:
    """The step limits the engine version (--engine-version, or the default `vllm-v1`) fills per GPU
    (simcore.batch_defaults): those not given, as `vllm serve` picks them when its flags are left
    out (a --fleet's groups each on their own GPU)."""
    from kvsim.simcore.batch_defaults import USAGE_CONTEXTS

    if usage_context is not None and usage_context not in USAGE_CONTEXTS:
        raise ConfigError(f"--usage-context must be one of {', '.join(USAGE_CONTEXTS)}, got {usage_context!r}")
    return frozenset(name for name, value in given.items() if value is None)


def workload_overrides(
    *, num_requests: int | None, rate: float | None, concurrency: int | None,
    burstiness: float | None, input_len: int | None, output_len: int | None,
    max_tokens: int | None, n: int | None, beam_width: int | None, think_time_s: float | None,
) -> dict[str, Any]:
    """The workload fields a command line overrides (None: keep the workload's own); one
    keyword each, so `run` and `sweep` cannot pass different sets."""
    return {
        "num_requests": num_requests, "rate": rate, "concurrency": concurrency,
        "burstiness": burstiness, "input_len": input_len, "output_len": output_len,
        "max_tokens": max_tokens, "n": n, "beam_width": beam_width, "think_time_s": think_time_s,
    }


def check_common(seed: int, max_model_len: int | None, model: ModelSpec) -> None:
    """The checks that come before an engine configuration exists; everything about the engine
    (max_model_len against the model's context included) is `simcore.config.resolve`'s."""
    check_seed(seed)


MAX_SEED = 2**53  # seeds are written to CSV tables and read back through float64 (reports.sweep_table)


def check_seed(seed: int, flag: str = "--seed") -> None:
    """A seed is an integer from 0 to 2**53 (a 400-digit one would be recorded, and read back, wrong)."""
    if seed < 0:
        raise ConfigError(f"{flag} must be an integer >= 0, got {seed}")
    if seed > MAX_SEED:
        text = str(seed)
        raise ConfigError(f"{flag} must be at most {MAX_SEED:,}, got {text if len(text) <= 40 else text[:18] + '...' + text[-18:]}")


def parse_goodput(values: list[str] | None, extra_args: list[str] | None = None) -> dict[str, float]:
    """`--goodput ttft:500 tpot:50` -> {"ttft": 500.0, "tpot": 50.0} (ms), checked as vLLM's
    `check_goodput_args` does: names ttft, tpot, e2el; values >= 0. Pairs after the first may
    arrive as the command's extra arguments (click options take one value each)."""
    from kvsim.simcore.metrics import GOODPUT_METRICS

    items = [part for text in [*(values or []), *(extra_args or [])]
             for part in text.replace(",", " ").split()]
    if extra_args and not values:
        raise ConfigError(f"unexpected argument {extra_args[0]!r}")
    if values and not items:  # `--goodput ""` would silently mean no SLO at all
        raise ConfigError("--goodput: give KEY:VALUE pairs (e.g. ttft:500 tpot:50, in ms)")
    slo: dict[str, float] = {}
    for item in items:
        name, sep, number = item.partition(":")
        if not sep:
            raise ConfigError(f"--goodput: {item!r} is not KEY:VALUE (e.g. ttft:500 tpot:50, in ms)")
        if name not in GOODPUT_METRICS:
            raise ConfigError(f"--goodput: unknown metric {name!r}; use {', '.join(GOODPUT_METRICS)}")
        try:
            value = float(number)
        except ValueError:
            raise ConfigError(f"--goodput: {number!r} is not a number of ms (in {item!r})") from None
        if not value >= 0 or value == float("inf"):
            raise ConfigError(f"--goodput: {name} must be a finite number of ms >= 0, got {number}")
        if name in slo:
            raise ConfigError(f"--goodput: {name} is given twice")
        slo[name] = value
    return slo


def check_slos(**limits: float | None) -> None:
    """Percentile SLO flags (flag name -> value) must be positive numbers of ms."""
    for flag, limit in limits.items():
        if limit is not None and not (limit > 0 and limit != float("inf")):
            raise ConfigError(f"--{flag.replace('_', '-')} must be a finite number > 0, got {limit}")


def check_inputs_kept(out: Path | None, inputs: list[str | Path | None], names: tuple[str, ...] = (),
                      flag: str = "--out") -> None:
    """An output that would replace one of the command's own input files is refused: the input
    would be lost. `names` are the files written into the folder `out` (none: `out` is the file)."""
    if out is None:
        return
    import os

    out = Path(out).expanduser()
    # realpath, not Path.resolve: a symlink loop in a path makes resolve raise RuntimeError (3.11)
    targets = {os.path.realpath(out / name) for name in names} if names else {os.path.realpath(out)}
    for given in inputs:
        if given is not None and Path(given).expanduser().is_file() and os.path.realpath(Path(given).expanduser()) in targets:
            raise ConfigError(f"{flag} {out}: would overwrite the input file {given}")



def check_sample_width(wl: Any, resolved: Any, given: dict[str, int | None] | None = None) -> None:
    """A request runs max(n, beam_width) sequences at once; one wider than a step (max_num_seqs
    sequences, max_num_batched_tokens tokens) can never be scheduled, and the engine would
    reject every such request after the whole run. Refused here, before any work, naming the
    flag that set it (`given`: flag -> value) or the workload's field."""
    if getattr(resolved.engine, "speculative_config", None) is not None:  # the engine rejects each such request
        for flag, value in (given or {}).items():  # (simcore.policies.speculative); a flag sets every request's
            if value is not None and value > 1:
                raise ConfigError(f"{flag} {value} with --speculative-config: parallel sampling and beam search are "
                                  "not modelled with speculative decoding; every request would be rejected")
    widths = _sample_widths(wl)
    key = max(widths, key=widths.get)
    width = widths[key]
    what = _width_words(key, width, given)
    if width > 1 and not resolved.policy.paged:  # (simcore.policies.reserved.unsupported_sampling, after the run)
        raise ConfigError(f"{what}: parallel sampling and beam search are modelled only by --policy continuous "
                          f"--allocator paged, not {resolved.policy.label}; every request would be rejected")
    check_rounds_width(wl, [resolved.engine], widths, given)
    limit = min(resolved.engine.max_num_seqs, resolved.max_num_batched_tokens)
    if width <= limit:
        return
    bound = (f"--max-num-seqs {resolved.engine.max_num_seqs}" if limit == resolved.engine.max_num_seqs
             else f"--max-num-batched-tokens {resolved.max_num_batched_tokens}")
    raise ConfigError(f"{what} is wider than a step: each request runs {width} sequences at once, and a "
                      f"step holds at most {bound}; every request would be rejected")


def _sample_widths(wl: Any) -> dict[str, int]:
    """The widest n and beam_width of the workload's requests (its choices, or its trace's columns)."""
    widths = {key: max(getattr(getattr(wl, key, None), "values", None) or (1,)) for key in ("n", "beam_width")}
    trace = getattr(wl, "trace", None)
    for key in widths:
        column = getattr(trace, "extras", {}).get(key) if trace is not None else None
        if column is not None and len(column):
            widths[key] = max(widths[key], int(column.max()))
    return widths


def _width_words(key: str, width: int, given: dict[str, int | None] | None) -> str:
    flag = f"--{key.replace('_', '-')}"
    return f"{flag} {width}" if (given or {}).get(flag) is not None else f"the workload's {key} {width}"


def check_rounds_width(wl: Any, engines: list[Any], widths: dict[str, int] | None = None,
                       given: dict[str, int | None] | None = None) -> None:
    """Refuse a workload whose every request runs several sequences where every engine in
    `engines` (a run's, or each of a plan's candidates') schedules vLLM 0.6's multi-step decode
    rounds: simcore.policies.continuous_v0 rejects each such request (vLLM 0.6's multi-step
    output processor runs one sequence per request), so every request would be rejected."""
    widths = widths or _sample_widths(wl)
    key = max(widths, key=widths.get)
    width = widths[key]
    if width > 1 and engines and all(_multi_step_rounds(e) for e in engines) and _every_request_wide(wl):
        raise ConfigError(f"{_width_words(key, width, given)} with --engine-version {engines[0].engine_version}: "
                          "its multi-step decode rounds run one sequence per request (vLLM 0.6 refused parallel "
                          "sampling and beam search with --num-scheduler-steps); every request would be rejected")


def _every_request_wide(wl: Any) -> bool:
    """Whether every request of the workload runs several sequences (n or beam_width > 1 in each
    of its choices, or in each row of its trace)."""
    import numpy as np

    trace = getattr(wl, "trace", None)
    least = []
    for key in ("n", "beam_width"):
        column = getattr(trace, "extras", {}).get(key) if trace is not None else None
        if column is not None and len(column):
            least.append(np.asarray(column))
        else:
            least.append(min(getattr(getattr(wl, key, None), "values", None) or (1,)))
    return bool(np.all(np.maximum(*least) > 1))


def _multi_step_rounds(engine: Any) -> bool:
    """Whether the run schedules vLLM 0.6's multi-step decode rounds (simcore.batch_defaults)."""
    from kvsim.simcore.batch_defaults import num_scheduler_steps

    return num_scheduler_steps(engine.engine_version, engine.enable_chunked_prefill,
                               engine.speculative_config is not None) > 1


def check_router_workload(routers: str | list[str] | None, wl: Any) -> None:
    """session-affinity keeps a conversation's turns on one replica (simcore.router); a workload
    without sessions has none, and every request went least-loaded under the session-affinity name."""
    if routers is None:
        return
    if "session-affinity" in ([routers] if isinstance(routers, str) else routers) and not getattr(wl, "is_session", False):
        raise ConfigError(f"--router session-affinity routes the turns of a session; workload {wl.name} has no "
                          "sessions, so every request would go least-loaded (give a session workload, or another router)")
