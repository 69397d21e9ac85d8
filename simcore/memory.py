"""GPU memory budget: how many KV blocks one engine replica gets (DESIGN.md, "Memory model").

    kv_budget  = gpu_memory * gpu_memory_utilization - weights_per_gpu - activation_reserve
    kv_bytes_per_token_per_gpu = 2 * stage_layers * (kv_heads / tp) * head_dim * kv_dtype_bytes
    num_blocks = min over pipeline stages of floor(kv_budget / (block_size * kv_bytes_per_token_per_gpu))

Weights count every expert of an MoE model (all are resident), in FP8 (1 byte) for the linear
layers under `--quantization fp8`; `--kv-cache-dtype fp8` stores KV in 1 byte per element.

The activation reserve stands in for vLLM's profiling run: the peak of one forward pass over
`max_num_batched_tokens` tokens plus the sampler's fp32 logits, and a fixed allowance for the
CUDA context, NCCL buffers and CUDA graphs that torch's allocator does not see.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from kvsim.simcore.errors import ConfigError, DoesNotFitError
from kvsim.simcore.parallel import check_deployment, layer_partition
from kvsim.simcore.specs import GIB, EngineConfig, GPUSpec, ModelSpec

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
    layers_per_stage: tuple[int, ...] = ()  # pipeline stages' layer counts (one entry: no PP)
    weight_dtype: str = "bfloat16"  # linear-layer weights as stored: bfloat16 | float32 | fp8
    kv_cache_dtype: str = "bfloat16"  # KV cache as stored
    num_offload_blocks: int = 0  # CPU KV tier (--kv-offloading-size), blocks of one replica
    draft_weights_bytes_per_gpu: int = 0  # speculative decoding: the draft's weights (in weights_bytes_per_gpu)
    draft_kv_bytes_per_token: int = 0  # ... and its KV per token (in kv_bytes_per_token)

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
            "layers_per_stage": list(self.layers_per_stage),
            "weight_dtype": self.weight_dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            **({"draft_weights_gib_per_gpu": self.draft_weights_bytes_per_gpu / GIB,
                "draft_kv_bytes_per_token": self.draft_kv_bytes_per_token}
               if self.draft_weights_bytes_per_gpu or self.draft_kv_bytes_per_token else {}),
        }


def activation_reserve_bytes(model: ModelSpec, config: EngineConfig, last_stage: bool = True) -> int:
    """Peak activations of one forward over the step's token budget, per GPU. An MoE layer's
    fused-experts workspace holds top-k copies of each token (gate+up, activation, down);
    only the last pipeline stage computes the sampler's logits."""
    tp = config.tensor_parallel_size
    tokens = config.resolved_max_num_batched_tokens(model)
    h = model.hidden_size
    if model.is_moe:
        k = model.num_experts_per_tok
        per_token = 4 * h + k * (3 * model.moe_intermediate_size // tp + h)
        per_token += 3 * model.shared_expert_intermediate_size // tp
    else:
        per_token = 4 * h + 3 * model.intermediate_size // tp
    logits = config.max_num_seqs * (model.vocab_size // tp) * 4 if last_stage else 0
    return tokens * per_token * model.dtype_bytes + logits + NON_TORCH_RESERVE_BYTES


class _Stage(NamedTuple):
    """One pipeline stage's budget on each of its GPUs (a plain record: a NamedTuple is made
    at import for a quarter of a frozen dataclass's cost, and nothing outside reads it)."""

    num_layers: int
    weights_bytes: int
    reserve_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int


def _stages(model: ModelSpec, gpu: GPUSpec, config: EngineConfig) -> list[_Stage]:
    """Per-stage weights, activations and KV budget; weights are sharded over TP (vocab-
    parallel embedding and LM head included). The first stage holds the embedding, the last
    the final norm and LM head (a tied head is a separate copy once PP splits them)."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    usable = gpu.memory_bytes * config.gpu_memory_utilization
    parts = layer_partition(model.num_layers, pp)
    spec = config.speculative_config  # its draft shares the GPUs and the block table (pp == 1)
    draft_weights = spec.weight_bytes_per_gpu(model, tp) if spec is not None else 0
    draft_kv = spec.kv_bytes_per_token(model, tp) if spec is not None else 0
    stages = []
    for s, n in enumerate(parts):
        last = s == pp - 1
        weights = n * model.layer_weight_bytes
        if s == 0:
            weights += model.embedding_bytes
        if last:
            weights += model.hidden_size * model.dtype_bytes
            if pp > 1 or not model.tie_word_embeddings:
                weights += model.embedding_bytes
        ep = config.expert_parallel_size
        if ep > tp:  # routed experts over the TP x DP expert-parallel group, the rest over TP
            experts = int(n * model.routed_expert_bytes_per_layer)
            weights = (weights - experts) // tp + experts // ep
        else:
            weights //= tp
        weights += draft_weights
        reserve = activation_reserve_bytes(model, config, last_stage=last)
        stages.append(_Stage(n, weights, reserve, int(usable - weights - reserve),
                             model.kv_bytes_per_token(tp, n) + draft_kv))
    return stages


def _what_fits(model: ModelSpec, gpu: GPUSpec, config: EngineConfig) -> str:
    """The smallest larger layout (TP inside a node first, then PP stages) that fits."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    tried = [(t, pp) for t in (2 * tp, 4 * tp, 8 * tp, 16 * tp) if t <= gpu.gpus_per_node]
    tried += [(max(tp, gpu.gpus_per_node), p) for p in (2 * pp, 4 * pp, 8 * pp)]
    for t, p in tried:
        if p > model.num_layers or model.num_attention_heads % t:
            continue
        layout = replace(config, tensor_parallel_size=t, pipeline_parallel_size=p)
        if min(st.kv_budget_bytes for st in _stages(model, gpu, layout)) > 0:
            return f"--tp {t}" + (f" --pp {p}" if p > 1 else "") + " would fit"
    return "no layout up to 8 pipeline stages of a full node fits"


def plan_memory(model: ModelSpec, gpu: GPUSpec, config: EngineConfig) -> MemoryPlan:
    """Budget KV blocks for one replica; raise DoesNotFitError saying by how much and what fits.

    `--quantization` and `--kv-cache-dtype` from `config` are applied to `model` first. With
    pipeline parallelism every stage budgets its own layers' KV and, as in vLLM, the engine
    takes the smallest block count of all workers."""
    model = config.resolve_model(model)
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if model.num_attention_heads % tp:
        raise ConfigError(
            f"--tp {tp} must divide {model.name}'s {model.num_attention_heads} attention heads"
        )
    if config.speculative_config is not None:
        config.speculative_config.check_with(model, tp, pp)
    check_deployment(model, gpu, config)
    max_model_len = config.resolved_max_model_len(model)
    stages = _stages(model, gpu, config)
    spec = config.speculative_config
    worst = min(stages, key=lambda st: st.kv_budget_bytes)
    if worst.kv_budget_bytes <= 0:
        usable = gpu.memory_bytes * config.gpu_memory_utilization
        where = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "")
        raise DoesNotFitError(
            f"{model.name} does not fit on {gpu.name} at {where}: weights "
            f"{worst.weights_bytes / GIB:.1f} GiB + activations {worst.reserve_bytes / GIB:.1f} GiB "
            f"per GPU exceed the {usable / GIB:.1f} GiB allowed by gpu_memory_utilization="
            f"{config.gpu_memory_utilization} by {-worst.kv_budget_bytes / GIB:.1f} GiB; "
            f"{_what_fits(model, gpu, config)}"
        )
    blocks = [st.kv_budget_bytes // (st.kv_bytes_per_token * config.block_size) for st in stages]
    binding = stages[blocks.index(min(blocks))]
    block_bytes = binding.kv_bytes_per_token * config.block_size
    num_gpu_blocks = config.num_gpu_blocks_override or min(blocks)
    num_cpu_blocks = int(config.swap_space * GIB) // block_bytes
    # --kv-offloading-size is the replica's buffer over all its GPUs; each holds its share of a block
    offload_gib = config.kv_offloading_size or 0.0
    num_offload_blocks = int(offload_gib * GIB / (tp * pp)) // block_bytes
    plan = MemoryPlan(
        weights_bytes_per_gpu=max(st.weights_bytes for st in stages),
        activation_reserve_bytes=binding.reserve_bytes,
        kv_budget_bytes=binding.kv_budget_bytes,
        kv_bytes_per_token=binding.kv_bytes_per_token,
        block_size=config.block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_model_len=max_model_len,
        layers_per_stage=tuple(st.num_layers for st in stages),
        weight_dtype=model.weight_dtype,
        kv_cache_dtype=model.kv_dtype,
        num_offload_blocks=num_offload_blocks,
        draft_weights_bytes_per_gpu=spec.weight_bytes_per_gpu(model, tp) if spec else 0,
        draft_kv_bytes_per_token=spec.kv_bytes_per_token(model, tp) if spec else 0,
    )
    if plan.num_gpu_tokens < max_model_len:
        raise DoesNotFitError(
            f"the model's max_model_len ({max_model_len:,}) is larger than the KV cache can hold "
            f"({plan.num_gpu_tokens:,} tokens); raise --gpu-memory-utilization, lower "
            f"--max-model-len, use --kv-cache-dtype fp8, or use a larger --tp or --pp"
        )
    return plan
