"""vLLM's default step limits per engine version, GPU and usage context (what `--engine-version` fills in).

`max_num_seqs` and `max_num_batched_tokens` are what vLLM picks when the user gives neither:

* `vllm-v1`, `vllm-v1-async` (vllm-project/vllm at 99d7eb5d, vllm/engine/arg_utils.py, `EngineArgs.get_batch_defaults`
  and `_set_default_max_num_seqs_and_batched_tokens_args`): a GPU with at least 70 GiB whose name
  does not contain "a100" (H100, H200, B200, MI300X; "setting large max_num_batched_tokens for A100
  reduces throughput", vLLM PR #17885) gets 8192 tokens for the OpenAI server and 16384 for the
  offline `LLM` class, and 1024 sequences for both; any other GPU gets 2048 / 8192 tokens and 256
  sequences. Then: without chunked prefill the budget is at least `max_model_len`; it is at most
  `max_num_seqs x max_model_len`; and `max_num_seqs` is at most the budget.
* `vllm-v0`, `vllm-0.6` (vLLM 0.5 / 0.6 `EngineArgs.max_num_seqs = 256` and `SchedulerConfig.__init__`):
  256 sequences on every GPU and context; the budget is `max(max_model_len, 2048)` without chunked
  prefill and 512 with it ("the best balance between ITL and TTFT on A100"), except that 0.6's
  multi-step scheduling (the `vllm-0.6` preset's `--num-scheduler-steps 10`) with chunked prefill
  keeps `max(max_model_len, 2048)` ("Multi-step Chunked-Prefill doesn't allow prompt-chunking").

The usage context is vLLM's `UsageContext`: `server` is OPENAI_API_SERVER (`vllm serve`, what a
served workload models), `offline` is LLM_CLASS (`LLM.generate`, `vllm bench throughput`).
"""

from __future__ import annotations

from dataclasses import replace

from kvsim.simcore.specs import EngineConfig, GPUSpec, ModelSpec

USAGE_CONTEXTS = ("server", "offline")
DEFAULT_USAGE_CONTEXT = "server"
LARGE_GPU_GIB = 70.0  # vLLM: device_memory >= 70 * GiB_bytes (and not an A100)
V1_TOKENS = {True: {"offline": 16384, "server": 8192}, False: {"offline": 8192, "server": 2048}}
V1_SEQS = {True: 1024, False: 256}
V0_SEQS = 256  # EngineArgs.max_num_seqs in vLLM 0.5 / 0.6
V0_CHUNKED_TOKENS = 512  # SchedulerConfig with chunked prefill, vLLM 0.5 / 0.6
V0_MIN_TOKENS = 2048  # SchedulerConfig without it: max(max_model_len, 2048)
FIELDS = ("max_num_seqs", "max_num_batched_tokens")
# vLLM 0.6.0's benchmarks ran multi-step scheduling with `--num-scheduler-steps 10` (blog.vllm.ai
# 2024-09-05): the `vllm-0.6` preset prices the host work once per 10 steps (profiles/host.py) and,
# without chunked prefill, schedules decode rounds of 10 steps (simcore/policies/continuous_v0.py)
NUM_SCHEDULER_STEPS = {"vllm-0.6": 10}


def num_scheduler_steps(engine_version: str, chunked: bool, speculative: bool = False) -> int:
    """Decode steps per scheduler call this version runs: 10 for `vllm-0.6` on V0's scheduler (no
    chunked prefill, no speculative decoding, which vLLM 0.6 refuses with multi-step), else 1.
    (vLLM 0.6's multi-step with chunked prefill runs prompts inside the round: not modelled.)"""
    if chunked or speculative:
        return 1
    return NUM_SCHEDULER_STEPS.get(engine_version, 1)


def large_gpu(gpu: GPUSpec) -> bool:
    """vLLM V1's test for its larger defaults: >= 70 GiB of device memory and not an A100."""
    return gpu.memory_gib >= LARGE_GPU_GIB and "a100" not in gpu.name.lower()


def batch_defaults(engine_version: str, gpu: GPUSpec, max_model_len: int, chunked: bool,
                   usage_context: str = DEFAULT_USAGE_CONTEXT, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM of this version picks on this GPU; either one
    the user gave is kept, and the other derived from it as vLLM derives it."""
    if usage_context not in USAGE_CONTEXTS:
        raise ValueError(f"unknown usage context {usage_context!r}; known: {', '.join(USAGE_CONTEXTS)}")
    if engine_version in ("vllm-v1", "vllm-v1-async"):  # async scheduling (PR #27614) left these as they were
        big = large_gpu(gpu)
        seqs = V1_SEQS[big] if max_num_seqs is None else max_num_seqs
        tokens = max_num_batched_tokens
        if tokens is None:
            tokens = V1_TOKENS[big][usage_context]
            if not chunked:
                tokens = max(max_model_len, tokens)
            tokens = min(seqs * max_model_len, tokens)
        if max_num_seqs is None:
            seqs = min(seqs, tokens)
        return seqs, tokens
    if engine_version in ("vllm-v0", "vllm-0.6"):
        multi_step = engine_version == "vllm-0.6"
        tokens = max_num_batched_tokens
        if tokens is None:
            tokens = V0_CHUNKED_TOKENS if chunked and not multi_step else max(max_model_len, V0_MIN_TOKENS)
        return V0_SEQS if max_num_seqs is None else max_num_seqs, tokens
    raise ValueError(f"unknown engine version {engine_version!r}")


def apply_batch_defaults(config: EngineConfig, gpu: GPUSpec, model: ModelSpec, fill: frozenset[str] | set[str],
                         usage_context: str = DEFAULT_USAGE_CONTEXT) -> EngineConfig:
    """`config` with the fields named in `fill` (those the user left unset) set to the engine
    version's defaults on this GPU; the others as given."""
    fill = set(fill) & set(FIELDS)
    if not fill or config.policy != "continuous":  # vLLM's limits; static / dynamic batching keep kvsim's
        return config
    seqs, tokens = batch_defaults(
        config.engine_version, gpu, config.resolved_max_model_len(model), config.enable_chunked_prefill,
        usage_context, None if "max_num_seqs" in fill else config.max_num_seqs,
        None if "max_num_batched_tokens" in fill else config.max_num_batched_tokens)
    values = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}
    return replace(config, **{k: values[k] for k in sorted(fill)})


# Prefill attention of a roofline profile follows FlashAttention-3's measured H100 curve
# (profiles/roofline.py FLASH_ATTENTION). vLLM picks FA3 on compute capability 9.0 (Hopper) only
# since vllm-project/vllm PR #12093 (January 2025, vLLM 0.7: "if hopper default to FA3, otherwise
# stick to FA2"); vLLM 0.5 / 0.6 ran FlashAttention-2 there. Roofline profiles of Hopper GPUs carry
# that per version (`prefill_attention_by_engine`: profiles/attention.py, from the FlashAttention-3
# paper's side-by-side FA2 / FA3 measurements); one generated before they did is priced with FA3's
# curve for every version, and a run says so.
HOPPER_PREFIXES = ("H100", "H200")
FA2_ERA_VERSIONS = ("vllm-v0", "vllm-0.6")


def prefill_attention_note(engine_version: str, gpu_name: str, profile_source: str | None,
                           backend: str | None = None) -> str | None:
    """What a roofline profile's prefill attention assumes of the attention backend: `backend`, the
    kernel the profile's per-version table for this version models (None: its one table; a
    calibrated profile keeps the roofline's per-version scales on its fitted table); and where that
    one table is not the backend this vLLM version ran (None for other measured / calibrated
    profiles: their own)."""
    if backend is not None:
        return f"{backend}, the kernel {engine_version} ran on {gpu_name} (per-version table, profiles/attention.py)"
    if profile_source != "roofline":
        return None
    if engine_version in FA2_ERA_VERSIONS and gpu_name.startswith(HOPPER_PREFIXES):
        return ("FlashAttention-3's curve, but vLLM 0.5 / 0.6 ran FlashAttention-2 on Hopper (FA3 is 1.5-2.0x "
                "faster, Shah et al. 2024) and this profile has no per-version table: prefill attention "
                "priced too fast, not modelled")
    return "FlashAttention-3 curve (profiles/roofline.py)"


def engine_assumptions(config: EngineConfig, model: ModelSpec, gpu: GPUSpec, fill: frozenset[str] | set[str] = frozenset(),
                       usage_context: str | None = None, given: bool = False,
                       host_overhead_from: str | None = None, profile_source: str | None = None,
                       prefill_backend: str | None = None, all_reduce: str | None = None) -> dict:
    """What a run assumes of the engine it models (issue 27: every answer names it): the vLLM
    version (None for a policy that is not vLLM's continuous batching, which no version prices),
    whether the user chose it, the usage context and the step limits its per-GPU defaults filled,
    the resolved limits, the profile field the host cost came from, and `all_reduce`: what the
    profile prices this version's TP all-reduce with where that is not its one table, or says it
    cannot (vLLM V1's symmetric memory on Hopper: profiles/symm_mem_allreduce.py)."""
    if config.policy != "continuous":
        return {"engine_version": None, "policy": config.policy}
    return {
        "engine_version": config.engine_version, "given": bool(given),
        "usage_context": (usage_context or DEFAULT_USAGE_CONTEXT) if fill else None,
        "batch_defaults_filled": sorted(set(fill) & set(FIELDS)), "gpu": gpu.name,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.resolved_max_num_batched_tokens(model),
        **({"host_overhead_from": host_overhead_from} if host_overhead_from else {}),
        **({"prefill_attention": note} if (note := prefill_attention_note(config.engine_version, gpu.name,
                                                                          profile_source, prefill_backend)) else {}),
        **({"all_reduce": all_reduce} if all_reduce else {}),
        **_multi_step(config),
    }


def _multi_step(config: EngineConfig) -> dict:
    """A multi-step version's steps per scheduler call, and whether its decode rounds are modelled
    (V0's scheduler) or only their host cost (chunked prefill, speculative decoding)."""
    steps = NUM_SCHEDULER_STEPS.get(config.engine_version)
    if not steps:
        return {}
    rounds = num_scheduler_steps(config.engine_version, config.enable_chunked_prefill,
                                 config.speculative_config is not None) > 1
    return {"num_scheduler_steps": steps, "multi_step_rounds": rounds}


def multi_step_words(engine_version: str, chunked: list[bool]) -> str:
    """What a multi-step version's runs model, for a header over runs with these chunked-prefill
    settings: `multi-step: decode rounds of 10 steps`, or the host cost only where chunked prefill
    is on (vLLM 0.6 ran prompts inside the round there: not modelled); "" for other versions."""
    steps = NUM_SCHEDULER_STEPS.get(engine_version)
    if not steps:
        return ""
    if not any(chunked):
        return f"multi-step: decode rounds of {steps} steps"
    if all(chunked):
        return f"multi-step: {steps}-step host cost only, no rounds with chunked prefill"
    return f"multi-step: decode rounds of {steps} steps without chunked prefill, the host cost only with it"


def engine_text(a: dict) -> str:
    """One line of `engine_assumptions`: `vllm-v1 (default), max_num_seqs 256, max_num_batched_tokens
    8192; host cost: the profile's vllm-v1 terms`, naming vLLM's per-GPU defaults where
    --engine-version filled them."""
    if a.get("engine_version") is None:
        return f"policy {a.get('policy')}, no vLLM version (--engine-version prices continuous batching only)"
    filled = a.get("batch_defaults_filled") or []
    limits = f"max_num_seqs {a['max_num_seqs']}, max_num_batched_tokens {a['max_num_batched_tokens']}"
    if filled:
        which = "" if len(filled) == len(FIELDS) else f"{filled[0]}: "
        plural = "s" if len(filled) > 1 else ""
        limits += f" ({which}vLLM's {a['usage_context']} default{plural} on {a['gpu']})"
    version = a["engine_version"] + ("" if a.get("given") else " (default)")
    source, host = a.get("host_overhead_from"), ""
    if source:  # a measured or calibrated profile without per-version terms keeps its own host cost
        by_version = source == f"host_overhead_by_engine.{a['engine_version']}"
        host = f"; host cost: the profile's {a['engine_version']} terms" if by_version else \
            f"; host cost: the profile's {source} (not per version)"
    attention = a.get("prefill_attention") or ""
    if "not modelled" in attention:
        attention = "; prefill attention: FA3's curve, this version ran FA2 here (not modelled)"
    elif "per-version table" in attention:  # the kernel this version ran, where it is not the profile's base
        attention = f"; prefill attention: {attention.split(',')[0]}"
    else:
        attention = ""
    # a profile without the symmetric-memory table this version runs: say so (its all-reduces cost more)
    coll = "; all-reduce: custom / NCCL prices, this version uses symmetric memory here (not modelled)" \
        if "not modelled" in (a.get("all_reduce") or "") else ""
    steps = a.get("num_scheduler_steps")  # (before the host cost: the line's last clauses are read as they are)
    multi = "" if not steps else f"; multi-step: decode rounds of {steps} steps" if a.get("multi_step_rounds") \
        else f"; multi-step: {steps}-step host cost only, no rounds with chunked prefill"
    return f"{version}, {limits}{multi}{host}{attention}{coll}"
