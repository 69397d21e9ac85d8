"""Frozen, validated specs: the GPU, the model shape and the engine configuration.

Names and defaults of `EngineConfig` follow vLLM's engine arguments so that a vLLM user
can read a kvsim config without a glossary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from simcore.errors import ConfigError

GIB = 1024**3


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None or value <= 0:
            what = (
                "--" + name.replace("_", "-") if isinstance(obj, EngineConfig)
                else f"{type(obj).__name__}.{name}"
            )
            raise ConfigError(f"{what} must be positive, got {value!r}")


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """Datasheet figures of one GPU, enough to budget memory and price a roofline."""

    name: str
    memory_gib: float  # total device memory as torch reports it (GiB)
    bf16_tflops: float  # dense bf16 tensor-core peak (TFLOP/s)
    hbm_tbps: float  # HBM bandwidth (TB/s)
    interconnect_gbps: float  # GPU-to-GPU bandwidth per direction (NVLink, GB/s)
    pcie_gbps: float = 32.0  # host link per direction (GB/s), prices swap traffic

    def __post_init__(self) -> None:
        _positive(self, "memory_gib", "bf16_tflops", "hbm_tbps", "interconnect_gbps", "pcie_gbps")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer (grouped-query attention when kv heads < heads)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2  # bf16/fp16 weights and KV cache
    max_position_embeddings: int = 4096  # the model's own context limit
    gated_mlp: bool = True  # SwiGLU (gate+up+down) vs a plain two-matrix MLP (OPT)
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix

    def __post_init__(self) -> None:
        _positive(
            self, "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
            "head_dim", "intermediate_size", "vocab_size", "dtype_bytes",
            "max_position_embeddings",
        )
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(
                f"model {self.name}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        h = self.hidden_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        return attn + mlp + 2 * h  # two norms

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + head + self.num_layers * self.params_per_layer + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def kv_bytes_per_token(self, tensor_parallel_size: int = 1) -> int:
        """K and V of every layer for one token, on one GPU (KV heads are split by TP,
        and replicated when TP exceeds the number of KV heads, as vLLM does)."""
        kv_heads_per_gpu = max(1, self.num_kv_heads // tensor_parallel_size)
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim * self.dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PREEMPTION_MODES = ("recompute", "swap")
RESERVATIONS = ("max", "pow2", "oracle")
ROUTERS = ("round-robin", "least-loaded")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One engine replica's configuration, with vLLM's argument names and defaults.

    `max_num_batched_tokens=None` and `max_model_len=None` resolve as vLLM does: the model's
    context length for `max_model_len`, and 8192 tokens per step with chunked prefill (vLLM
    V1's default on large GPUs) or `max_model_len` without it (a whole prompt must fit a step).
    """

    block_size: int = 16  # tokens per KV block (power of two)
    gpu_memory_utilization: float = 0.90  # share of device memory the engine may use, (0, 1]
    max_num_seqs: int = 256  # most sequences in one step
    max_num_batched_tokens: int | None = None  # token budget of one step
    enable_chunked_prefill: bool = True  # split long prompts across steps
    enable_prefix_caching: bool = True  # reuse KV blocks of shared prompt prefixes (vLLM V1 default)
    swap_space: float = 4.0  # CPU swap pool per GPU (GiB)
    preemption_mode: str = "recompute"  # recompute | swap
    max_model_len: int | None = None  # longest prompt + output a request may have
    tensor_parallel_size: int = 1  # GPUs one replica is sharded over
    policy: str = "continuous"  # a registered policy (simcore.policies.registry)
    allocator: str = "paged"  # paged | contiguous; ignored by policies with one allocator
    reservation: str = "max"  # contiguous sizing: max | pow2 | oracle
    max_batch_size: int = 64  # static batching: requests per batch
    batch_timeout_s: float = 0.1  # static batching: longest wait for a full batch
    num_gpu_blocks_override: int | None = None  # vLLM's override of the profiled block count
    data_parallel_size: int = 1  # engine replicas, each on tensor_parallel_size GPUs
    router: str = "least-loaded"  # how requests are spread over replicas (simcore.router)

    def __post_init__(self) -> None:
        bs = self.block_size
        if not isinstance(bs, int) or bs <= 0 or bs & (bs - 1):
            raise ConfigError(f"--block-size must be a positive power of two, got {bs}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                "--gpu-memory-utilization must be in (0, 1], got "
                f"{self.gpu_memory_utilization}"
            )
        _positive(self, "max_num_seqs", "tensor_parallel_size", "max_batch_size", "data_parallel_size")
        tp = self.tensor_parallel_size
        if tp & (tp - 1):
            raise ConfigError(f"--tp must be a power of two, got {tp}")
        if self.max_num_batched_tokens is not None:
            _positive(self, "max_num_batched_tokens")
        if self.max_model_len is not None:
            _positive(self, "max_model_len")
        if self.num_gpu_blocks_override is not None:
            _positive(self, "num_gpu_blocks_override")
        if self.swap_space < 0:
            raise ConfigError(f"--swap-space must be >= 0 GiB, got {self.swap_space}")
        if self.batch_timeout_s < 0:
            raise ConfigError(f"--batch-timeout-s must be >= 0, got {self.batch_timeout_s}")
        for name, allowed in (
            ("preemption_mode", PREEMPTION_MODES),
            ("reservation", RESERVATIONS),
            ("router", ROUTERS),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )

    def resolved_max_model_len(self, model: ModelSpec) -> int:
        return self.max_model_len or model.max_position_embeddings

    def resolved_max_num_batched_tokens(self, model: ModelSpec) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.enable_chunked_prefill:
            return 8192
        return max(self.resolved_max_model_len(model), 2048)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


__all__ = ["GPUSpec", "ModelSpec", "EngineConfig", "GIB"]
