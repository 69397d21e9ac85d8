"""GPU memory budget: how many KV blocks one engine replica gets (DESIGN.md, "Memory model").

    kv_budget  = gpu_memory * gpu_memory_utilization - weights_per_gpu - activation_reserve
    kv_bytes_per_token_per_gpu = 2 * layers * (kv_heads / tp) * head_dim * dtype_bytes
    num_blocks = floor(kv_budget / (block_size * kv_bytes_per_token_per_gpu))

The activation reserve stands in for vLLM's profiling run: the peak of one forward pass over
`max_num_batched_tokens` tokens plus the sampler's fp32 logits, and a fixed allowance for the
CUDA context, NCCL buffers and CUDA graphs that torch's allocator does not see.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcore.errors import ConfigError, DoesNotFitError
from simcore.specs import GIB, EngineConfig, GPUSpec, ModelSpec

NON_TORCH_RESERVE_BYTES = int(0.5 * GIB)  # CUDA context + NCCL + CUDA graphs (approximate)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """The resolved memory budget of one replica, per GPU."""

    weights_bytes_per_gpu: int
    activation_reserve_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int  # per GPU
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int  # swap pool
    max_model_len: int

    @property
    def num_gpu_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """Requests of `max_model_len` tokens that fit at once (vLLM prints the same)."""
        return self.num_gpu_tokens / self.max_model_len

    def describe(self) -> str:
        return (
            f"GPU KV cache size: {self.num_gpu_tokens:,} tokens\n"
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
            f"{self.max_concurrency:.2f}x"
        )

    def to_dict(self) -> dict:
        return {
            "weights_gib_per_gpu": self.weights_bytes_per_gpu / GIB,
            "activation_reserve_gib": self.activation_reserve_bytes / GIB,
            "kv_budget_gib": self.kv_budget_bytes / GIB,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_cpu_blocks": self.num_cpu_blocks,
            "num_gpu_tokens": self.num_gpu_tokens,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
        }


def activation_reserve_bytes(model: ModelSpec, config: EngineConfig) -> int:
    """Peak activations of one forward over the step's token budget, per GPU."""
    tp = config.tensor_parallel_size
    tokens = config.resolved_max_num_batched_tokens(model)
    per_token = 4 * model.hidden_size + 3 * model.intermediate_size // tp
    logits = config.max_num_seqs * (model.vocab_size // tp) * 4
    return tokens * per_token * model.dtype_bytes + logits + NON_TORCH_RESERVE_BYTES


def _kv_budget(model: ModelSpec, gpu: GPUSpec, config: EngineConfig, tp: int) -> int:
    usable = gpu.memory_bytes * config.gpu_memory_utilization
    weights = model.weight_bytes / tp
    from dataclasses import replace

    reserve = activation_reserve_bytes(model, replace(config, tensor_parallel_size=tp))
    return int(usable - weights - reserve)


def _smallest_fitting_tp(model: ModelSpec, gpu: GPUSpec, config: EngineConfig) -> int | None:
    tp = config.tensor_parallel_size * 2
    while tp <= 64:
        if _kv_budget(model, gpu, config, tp) > 0:
            return tp
        tp *= 2
    return None


def plan_memory(model: ModelSpec, gpu: GPUSpec, config: EngineConfig) -> MemoryPlan:
    """Budget KV blocks for one replica; raise DoesNotFitError saying by how much and what fits."""
    tp = config.tensor_parallel_size
    if model.num_attention_heads % tp:
        raise ConfigError(
            f"--tp {tp} must divide {model.name}'s {model.num_attention_heads} attention heads"
        )
    max_model_len = config.resolved_max_model_len(model)
    weights = model.weight_bytes // tp
    reserve = activation_reserve_bytes(model, config)
    budget = _kv_budget(model, gpu, config, tp)
    if budget <= 0:
        usable = gpu.memory_bytes * config.gpu_memory_utilization
        better = _smallest_fitting_tp(model, gpu, config)
        hint = f"--tp {better} would fit" if better else "no tensor-parallel size up to 64 fits"
        raise DoesNotFitError(
            f"{model.name} does not fit on {gpu.name} at TP {tp}: weights {weights / GIB:.1f} GiB "
            f"+ activations {reserve / GIB:.1f} GiB per GPU exceed the {usable / GIB:.1f} GiB "
            f"allowed by gpu_memory_utilization={config.gpu_memory_utilization} by "
            f"{-budget / GIB:.1f} GiB; {hint}"
        )
    per_token = model.kv_bytes_per_token(tp)
    block_bytes = per_token * config.block_size
    num_gpu_blocks = config.num_gpu_blocks_override or budget // block_bytes
    num_cpu_blocks = int(config.swap_space * GIB) // block_bytes
    plan = MemoryPlan(
        weights_bytes_per_gpu=weights,
        activation_reserve_bytes=reserve,
        kv_budget_bytes=budget,
        kv_bytes_per_token=per_token,
        block_size=config.block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_model_len=max_model_len,
    )
    if plan.num_gpu_tokens < max_model_len:
        raise DoesNotFitError(
            f"the model's max_model_len ({max_model_len:,}) is larger than the KV cache can hold "
            f"({plan.num_gpu_tokens:,} tokens); raise --gpu-memory-utilization, lower "
            f"--max-model-len, or use a larger --tp"
        )
    return plan
