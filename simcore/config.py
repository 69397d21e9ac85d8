"""One resolved, validated configuration: model, GPU, engine options, the policy variant and
the memory plan, built once. `simulate()`, the sweep and the CLI all go through `resolve`, so
the Python API refuses exactly what `kvsim run` refuses.

Checks, in order: every numeric option is a finite number in its range; the policy variant
exists and reads every policy-specific option that was set (registry); vLLM's cross-field
rules (`vllm/config.py`, `SchedulerConfig._verify_args` and `ModelConfig` /
`_get_and_verify_max_len`); the memory plan (the model fits, one max_model_len request fits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from kvsim.simcore.errors import ConfigError
from kvsim.simcore.memory import MemoryPlan, plan_memory
from kvsim.simcore.policies import PolicySpec
from kvsim.simcore.policies.registry import select
from kvsim.simcore.specs import ENGINE_PRESETS, EngineConfig, GPUSpec, ModelSpec

_DEFAULTS = {f.name: f.default for f in fields(EngineConfig)}
_INT_OPTIONS = (
    "max_num_seqs", "tensor_parallel_size", "data_parallel_size", "max_batch_size",
    "pipeline_parallel_size",
)
_OPTIONAL_INT_OPTIONS = ("max_num_batched_tokens", "max_model_len", "num_gpu_blocks_override")

# vLLM refuses a swap space above 70% of the host's memory ("Too large swap space",
# `CacheConfig.verify_with_parallel_config`, vllm/config/cache.py) summed over a node's GPUs.
# kvsim does not know the host, so it takes the largest GPU server's: 2 TiB on an 8-GPU DGX
# H100/H200 (NVIDIA DGX H100 datasheet, "System memory 2TB").
HOST_MEMORY_GIB = 2048.0
MAX_SWAP_SPACE_GIB = 0.7 * HOST_MEMORY_GIB / 8  # 179.2 GiB per GPU
# The largest GPU clusters built hold ~200,000 GPUs (xAI Colossus, 2025); a deployment beyond
# that is not a capacity plan, and each replica is simulated, so memory grows with it.
MAX_NUM_GPUS = 200_000
# Every count is used in float64 arithmetic somewhere (memory, rates), exact only up to 2**53; a
# 400-digit integer would overflow float() itself (OverflowError, not a message).
MAX_OPTION_INT = 2**53
# A static batch's longest wait: the simulated clock's span limit (workloads.arrivals.MAX_SPAN_S, 1e9 s,
# where a float64 clock of seconds still resolves microseconds). 1e308 ran, and printed a 309-digit
# duration with an infinite TTFT.
MAX_BATCH_TIMEOUT_S = 1e9


def _short(value: Any) -> str:
    """A value for a message, a huge integer cut in the middle."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:18]}...{text[-18:]}"


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """Everything one run needs to know about the deployment, validated together."""

    model: ModelSpec
    gpu: GPUSpec
    engine: EngineConfig  # as given, with `allocator` set to the variant's
    policy: PolicySpec  # the registry entry the engine options select
    memory: MemoryPlan  # per replica; computed once, here
    max_model_len: int  # resolved as vLLM does (the model's context by default)
    max_num_batched_tokens: int  # resolved step token budget

    @property
    def swap_block_s(self) -> float:
        """Seconds to copy one KV block over the host link (swap out or in)."""
        return self.memory.kv_bytes_per_token * self.engine.block_size / (self.gpu.pcie_gbps * 1e9)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_numbers(config: EngineConfig) -> None:
    """Every numeric engine option is finite and in range (NaN passes `<` tests, so say it)."""
    u = config.gpu_memory_utilization
    if not _is_number(u) or not 0.0 < u <= 1.0:
        raise ConfigError(f"--gpu-memory-utilization must be a finite number in (0, 1], got {u!r}")
    for name in ("swap_space", "batch_timeout_s"):
        value = getattr(config, name)
        if not _is_number(value) or value < 0:
            raise ConfigError(f"{_flag(name)} must be a finite number >= 0, got {value!r}")
    if config.batch_timeout_s > MAX_BATCH_TIMEOUT_S:
        raise ConfigError(f"--batch-timeout-s must be at most {MAX_BATCH_TIMEOUT_S:g} s (where a float64 clock still "
                          f"resolves microseconds), got {config.batch_timeout_s:g}")
    if config.swap_space > MAX_SWAP_SPACE_GIB:
        raise ConfigError(
            f"--swap-space {config.swap_space:g} GiB per GPU is more than vLLM allows on a "
            f"{HOST_MEMORY_GIB:g} GiB, 8-GPU host (70% of its memory: {MAX_SWAP_SPACE_GIB:g} GiB per GPU)"
        )
    offload = config.kv_offloading_size
    if offload is not None:
        if not _is_number(offload) or offload <= 0:
            raise ConfigError(f"--kv-offloading-size must be a finite number of GiB > 0, got {offload!r}")
        per_gpu = offload / (config.tensor_parallel_size * config.pipeline_parallel_size)
        if per_gpu + config.swap_space > MAX_SWAP_SPACE_GIB:
            raise ConfigError(
                f"--kv-offloading-size {offload:g} GiB is {per_gpu:g} GiB per GPU which, with --swap-space "
                f"{config.swap_space:g}, is more host memory than a {HOST_MEMORY_GIB:g} GiB, 8-GPU host leaves "
                f"a GPU (70%: {MAX_SWAP_SPACE_GIB:g} GiB)")
    for name in _INT_OPTIONS:
        value = getattr(config, name)
        if not _is_int(value) or value < 1:
            raise ConfigError(f"{_flag(name)} must be an integer >= 1, got {_short(value)}")
        if value > MAX_OPTION_INT:
            raise ConfigError(f"{_flag(name)} must be at most {MAX_OPTION_INT:,}, got {_short(value)}")
    for name in _OPTIONAL_INT_OPTIONS:
        value = getattr(config, name)
        if value is not None and (not _is_int(value) or value < 1):
            raise ConfigError(f"{_flag(name)} must be an integer >= 1, got {_short(value)}")
        if value is not None and value > MAX_OPTION_INT:
            raise ConfigError(f"{_flag(name)} must be at most {MAX_OPTION_INT:,}, got {_short(value)}")
    if config.num_gpus > MAX_NUM_GPUS:
        raise ConfigError(
            f"--tp x --pp x --dp is {config.num_gpus:,} GPUs; kvsim plans deployments of at most "
            f"{MAX_NUM_GPUS:,} GPUs (the largest clusters built)"
        )


def select_policy(config: EngineConfig) -> PolicySpec:
    """The registry variant the options select; options it does not read must keep their
    defaults (the CLI refuses them whenever they are given)."""
    allocator = None if config.allocator == _DEFAULTS["allocator"] else config.allocator
    set_options = {name for name, default in _DEFAULTS.items() if getattr(config, name) != default}
    return select(config.policy, allocator, set_options)


_CHUNKED_OFF = tuple(v for v, preset in ENGINE_PRESETS.items() if not preset["enable_chunked_prefill"])


def check_vllm_rules(model: ModelSpec, config: EngineConfig) -> tuple[int, int]:
    """vLLM's cross-field rules; returns the resolved (max_model_len, max_num_batched_tokens)."""
    context = model.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > context:
        # vLLM refuses unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (or rope scaling lengthens the
        # context); kvsim models neither, so it refuses too.
        raise ConfigError(
            f"--max-model-len {config.max_model_len} exceeds {model.name}'s context length {context}"
        )
    max_model_len = config.resolved_max_model_len(model)
    if max_model_len < 2:
        raise ConfigError(
            f"--max-model-len must leave room for one prompt and one output token (>= 2), got {max_model_len}"
        )
    budget = config.resolved_max_num_batched_tokens(model)
    if budget < config.max_num_seqs:
        raise ConfigError(
            f"--max-num-batched-tokens ({budget}) must be >= --max-num-seqs ({config.max_num_seqs}), "
            "as vLLM requires"
        )
    if config.speculative_config is not None and not config.enable_chunked_prefill:
        # (off by a preset, the message said "drop --no-enable-chunked-prefill", a flag nobody gave)
        off = (f"--engine-version {config.engine_version} turns it off: give --enable-chunked-prefill (plan: "
               "--chunked-prefill on) or a V1 engine version" if config.engine_version in _CHUNKED_OFF else
               "drop --no-enable-chunked-prefill (plan: --chunked-prefill on)")
        raise ConfigError(f"--speculative-config runs on vLLM V1's scheduler, which kvsim models with chunked "
                          f"prefill on; {off}")
    if not config.enable_chunked_prefill and budget < max_model_len:
        raise ConfigError(
            f"--max-num-batched-tokens ({budget}) is smaller than max_model_len ({max_model_len}) "
            "with chunked prefill off; enable chunked prefill or raise it"
        )
    if config.kv_offloading_size is not None and not (config.enable_chunked_prefill and config.enable_prefix_caching):
        raise ConfigError(
            "--kv-offloading-size needs chunked prefill and prefix caching on (kvsim models vLLM V1's "
            "offloading connector, which looks blocks up by their prefix-cache hashes)")
    if config.kv_offloading_size is not None and config.preemption_mode == "swap":
        raise ConfigError(
            "--kv-offloading-size needs --preemption-mode recompute (vLLM V1, whose offloading connector "
            "kvsim models, has no swap preemption)")
    return max_model_len, budget


def resolve(model: ModelSpec, gpu: GPUSpec, config: EngineConfig) -> ResolvedConfig:
    """Validate the whole configuration and plan memory once; ConfigError (or DoesNotFitError)
    with a message naming the flag to change."""
    check_numbers(config)
    model = config.resolve_model(model)  # --quantization / --kv-cache-dtype applied
    spec = select_policy(config)
    max_model_len, budget = check_vllm_rules(model, config)
    memory = plan_memory(model, gpu, config)
    engine = config if config.allocator == spec.allocator else replace(config, allocator=spec.allocator)
    return ResolvedConfig(model, gpu, engine, spec, memory, max_model_len, budget)
