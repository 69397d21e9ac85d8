"""Frozen, validated specs: the GPU, the model shape and the engine configuration.

Names and defaults of `EngineConfig` follow vLLM's engine arguments so that a vLLM user
can read a kvsim config without a glossary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from kvsim.simcore.errors import ConfigError

if TYPE_CHECKING:
    from kvsim.simcore.speculative import SpeculativeConfig

GIB = 1024**3


_BOOL_FIELDS = ("enable_chunked_prefill", "enable_prefix_caching", "enable_expert_parallel")
_NUMBER_FIELDS = ("block_size", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "swap_space",
                  "kv_offloading_size", "max_model_len", "tensor_parallel_size", "max_batch_size", "batch_timeout_s",
                  "num_gpu_blocks_override", "data_parallel_size", "pipeline_parallel_size")
_TEXT_FIELDS = ("preemption_mode", "policy", "allocator", "reservation", "router", "kv_cache_dtype", "quantization",
                "engine_version")


def _check_types(config: Any) -> None:
    """An EngineConfig built in Python with a value of the wrong type ("0.9", "no", 1 for a name) is a
    ConfigError naming the option, as the CLI's would be: it raised TypeError or ValueError from a
    comparison, or ran ("no" is truthy)."""
    from numbers import Real

    for name in (*_BOOL_FIELDS, *_NUMBER_FIELDS, *_TEXT_FIELDS):
        value = getattr(config, name)
        if name in _BOOL_FIELDS:
            ok, kind = isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b", \
                "true or false"
        elif name in _NUMBER_FIELDS:
            ok, kind = value is None or (isinstance(value, Real) and not isinstance(value, bool)), "a number"
        else:
            ok, kind = value is None or isinstance(value, str), "a name"
        if not ok:
            text = repr(value)
            raise ConfigError(f"--{name.replace('_', '-')} must be {kind}, got {text if len(text) <= 40 else text[:37] + '...'}")


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
    """Datasheet figures of one GPU and the node it sits in, enough to budget memory and price
    a roofline. A node is `gpus_per_node` GPUs on NVLink; nodes talk over `internode_gbps`."""

    name: str
    memory_gib: float  # total device memory as torch reports it (GiB)
    bf16_tflops: float  # dense bf16 tensor-core peak (TFLOP/s)
    hbm_tbps: float  # HBM bandwidth (TB/s)
    interconnect_gbps: float  # GPU-to-GPU bandwidth per direction (NVLink, GB/s)
    pcie_gbps: float = 32.0  # host link per direction (GB/s), prices swap traffic
    fp8_tflops: float | None = None  # dense FP8 tensor-core peak (TFLOP/s); None: no FP8 units
    gpus_per_node: int = 8  # GPUs sharing one NVLink domain (HGX/DGX board)
    internode_gbps: float = 50.0  # one GPU's network link to other nodes, per direction (GB/s)

    def __post_init__(self) -> None:
        _positive(
            self, "memory_gib", "bf16_tflops", "hbm_tbps", "interconnect_gbps", "pcie_gbps",
            "gpus_per_node", "internode_gbps",
        )
        if self.fp8_tflops is not None:
            _positive(self, "fp8_tflops")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


QUANTIZATIONS = ("fp8",)  # vLLM --quantization methods kvsim can price (None: unquantized)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM --kv-cache-dtype choices
# Two names of one dtype: "CUDA 11.8+ supports fp8 (=fp8_e4m3) and fp8_e5m2. ROCm (AMD GPU) supports fp8
# (=fp8_e4m3)" (vllm/config/cache.py, CacheConfig.cache_dtype, vllm-project/vllm at 002f10e0).
KV_CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}


def canonical_kv_cache_dtype(name: str) -> str:
    """The one name of a --kv-cache-dtype vLLM spells two ways ("fp8" -> "fp8_e4m3")."""
    return KV_CACHE_DTYPE_ALIASES.get(name, name)



@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer (grouped-query attention when kv heads < heads),
    dense or mixture-of-experts, and the dtypes its weights and KV cache are stored in.

    MoE (`num_experts > 0`): every layer's MLP is `num_experts` SwiGLU experts of width
    `moe_intermediate_size`, of which a router picks `num_experts_per_tok` per token, plus
    optional always-on shared experts of total width `shared_expert_intermediate_size`.
    """

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
    num_experts: int = 0  # routed experts per MoE layer; 0: dense MLP
    num_experts_per_tok: int = 0  # experts the router picks per token (top-k)
    moe_intermediate_size: int = 0  # one routed expert's MLP width
    shared_expert_intermediate_size: int = 0  # total width of always-on shared experts
    quantization: str | None = None  # weight format: None (dtype_bytes) or "fp8" (vLLM's names)
    kv_cache_dtype: str = "auto"  # KV cache: "auto" (dtype_bytes) or an fp8 variant (1 byte)
    # Multi-head latent attention (DeepSeek-V2/V3; `kv_lora_rank > 0`): the cache holds one
    # compressed latent of kv_lora_rank plus one rope key of qk_rope_head_dim per token per layer,
    # shared by all heads (so not split by TP); queries go through a q_lora_rank bottleneck
    # (0: a plain projection), heads use qk_nope_head_dim + qk_rope_head_dim for scores and
    # v_head_dim for values. Field names are DeepSeek's config.json's.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    first_k_dense_replace: int = 0  # MoE models: the first k layers have a dense MLP (DeepSeek)
    # Multi-token-prediction modules the checkpoint carries (DeepSeek-V3's config.json field; 0: none):
    # what vLLM's speculative method "mtp" drafts with (simcore.speculative). Not in the served model's
    # step: vLLM loads them only as that draft.
    num_nextn_predict_layers: int = 0

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
        if self.num_experts:
            _positive(self, "num_experts", "num_experts_per_tok", "moe_intermediate_size")
            if self.num_experts_per_tok > self.num_experts:
                raise ConfigError(
                    f"model {self.name}: num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                    f"num_experts ({self.num_experts})"
                )
        if self.kv_lora_rank:
            _positive(self, "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        if self.first_k_dense_replace and not (self.num_experts and self.first_k_dense_replace < self.num_layers):
            raise ConfigError(
                f"model {self.name}: first_k_dense_replace ({self.first_k_dense_replace}) needs an MoE model with "
                f"more layers than that ({self.num_layers})"
            )
        n = self.num_nextn_predict_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"model {self.name}: num_nextn_predict_layers must be a whole number >= 0, got {n!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ConfigError(
                f"model {self.name}: quantization {self.quantization!r} is not supported; "
                f"kvsim prices {', '.join(QUANTIZATIONS)}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}"
            )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def weight_dtype_bytes(self) -> int:
        """Bytes per parameter of the quantized linear layers (FP8: 1)."""
        return 1 if self.quantization == "fp8" else self.dtype_bytes

    @property
    def kv_dtype_bytes(self) -> int:
        return 1 if self.kv_cache_dtype.startswith("fp8") else self.dtype_bytes

    @property
    def weight_dtype(self) -> str:
        return "fp8" if self.quantization == "fp8" else _DTYPE_NAMES.get(self.dtype_bytes, "bfloat16")

    @property
    def kv_dtype(self) -> str:
        return "fp8" if self.kv_dtype_bytes == 1 else _DTYPE_NAMES.get(self.dtype_bytes, "bfloat16")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def expert_params(self) -> int:
        """One routed expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def mla_latent_dim(self) -> int:
        """What an MLA cache holds per token per layer: the latent and the rope key (vLLM's MLA
        backends: head size kv_lora_rank + qk_rope_head_dim, one KV head)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def attention_params_per_layer(self) -> int:
        """Attention projections. MLA (DeepSeek-V3's modelling code): q_a (h x q_lora_rank) and
        q_b (q_lora_rank x heads*(nope+rope)), or one q_proj without a q bottleneck; kv_a
        (h x kv_lora_rank+rope), kv_b (kv_lora_rank x heads*(nope+v)), o (heads*v x h)."""
        h = self.hidden_size
        if not self.is_mla:
            return h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        heads, qk = self.num_attention_heads, self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (h * self.q_lora_rank + self.q_lora_rank * heads * qk) if self.q_lora_rank else h * heads * qk
        kv = h * self.mla_latent_dim + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * h

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense_replace if self.is_moe else 0

    @property
    def routed_expert_bytes_per_layer(self) -> float:
        """One MoE layer's routed experts (what expert parallelism shards), averaged over all
        layers as layer_weight_bytes is."""
        return self.num_moe_layers * self.num_experts * self.expert_params * self.weight_dtype_bytes / self.num_layers

    @property
    def dense_mlp_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size

    @property
    def moe_mlp_params(self) -> int:
        return self.num_experts * self.expert_params + 3 * self.hidden_size * self.shared_expert_intermediate_size

    @property
    def linear_params_per_layer(self) -> int:
        """The weights `--quantization fp8` stores in FP8 (vLLM's Fp8LinearMethod and
        Fp8MoEMethod): attention projections, MLP or experts. Norms, the MoE router, the
        embedding and the LM head stay in the model dtype. A model whose first layers are dense
        (first_k_dense_replace) gets the mean over its layers (memory is priced per layer)."""
        mlp = (self.num_moe_layers * self.moe_mlp_params
               + (self.num_layers - self.num_moe_layers) * self.dense_mlp_params) // self.num_layers
        return self.attention_params_per_layer + mlp

    @property
    def other_params_per_layer(self) -> int:
        """Two norms (MLA: plus its q_a and kv_a norms), plus the router of an MoE layer."""
        norms = 2 * self.hidden_size + (self.q_lora_rank + self.kv_lora_rank if self.is_mla else 0)
        return norms + self.hidden_size * self.num_experts * self.num_moe_layers // max(1, self.num_layers)

    @property
    def params_per_layer(self) -> int:
        return self.linear_params_per_layer + self.other_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.embedding_params + head + self.num_layers * self.params_per_layer + self.hidden_size

    @property
    def num_active_params(self) -> int:
        """Parameters one token passes through (MoE: the top-k experts, not all of them)."""
        if not self.is_moe:
            return self.num_params
        idle = (self.num_experts - self.num_experts_per_tok) * self.expert_params
        return self.num_params - self.num_moe_layers * idle

    @property
    def layer_weight_bytes(self) -> int:
        return (self.linear_params_per_layer * self.weight_dtype_bytes
                + self.other_params_per_layer * self.dtype_bytes)

    @property
    def embedding_bytes(self) -> int:
        return self.embedding_params * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        head = 0 if self.tie_word_embeddings else self.embedding_bytes
        return (self.embedding_bytes + head + self.num_layers * self.layer_weight_bytes
                + self.hidden_size * self.dtype_bytes)

    def kv_bytes_per_token(self, tensor_parallel_size: int = 1, num_layers: int | None = None) -> int:
        """K and V of every layer (or of `num_layers`, one pipeline stage's) for one token, on
        one GPU (KV heads are split by TP, and replicated when TP exceeds the number of KV
        heads, as vLLM does), in the KV cache dtype."""
        layers = self.num_layers if num_layers is None else num_layers
        if self.is_mla:  # one latent per token, every TP rank holds all of it (vLLM: 1 KV head)
            return layers * self.mla_latent_dim * self.kv_dtype_bytes
        kv_heads_per_gpu = max(1, self.num_kv_heads // tensor_parallel_size)
        return 2 * layers * kv_heads_per_gpu * self.head_dim * self.kv_dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        """All fields; the MoE and quantization ones only when set, so a dense bf16 model's
        record (and the profiles that embed it) reads as before they existed."""
        d = asdict(self)
        for name in _OPTIONAL_FIELDS:
            if d[name] == _DEFAULTS[name]:
                del d[name]
        return d


_OPTIONAL_FIELDS = (
    "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "quantization", "kv_cache_dtype", "kv_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim", "q_lora_rank", "first_k_dense_replace", "num_nextn_predict_layers",
)
_DEFAULTS = {f.name: f.default for f in fields(ModelSpec)}
_DTYPE_NAMES = {2: "bfloat16", 4: "float32"}


PREEMPTION_MODES = ("recompute", "swap")
# vLLM versions a continuous-batching run can be priced and scheduled as (profiles/host.py says
# what each one's host cost is, and why). A preset's scheduler defaults apply to the options the
# user did not set: V0 and 0.6 schedule prefill-first without chunked prefill and without prefix
# caching (their defaults; vLLM V0 `SchedulerConfig`), V1 chunks prompts and caches prefixes.
# `vllm-v1-async` is V1 as vLLM ships it since v0.14.0 (async scheduling on by default,
# vllm-project/vllm PR #27614): the same scheduler, its CPU work overlapped with the GPU's step.
ENGINE_VERSIONS = ("vllm-v0", "vllm-0.6", "vllm-v1", "vllm-v1-async")
DEFAULT_ENGINE_VERSION = "vllm-v1"
ENGINE_PRESETS = {
    "vllm-v0": {"enable_chunked_prefill": False, "enable_prefix_caching": False},
    "vllm-0.6": {"enable_chunked_prefill": False, "enable_prefix_caching": False},
    "vllm-v1": {"enable_chunked_prefill": True, "enable_prefix_caching": True},
    "vllm-v1-async": {"enable_chunked_prefill": True, "enable_prefix_caching": True},
}
RESERVATIONS = ("max", "pow2", "oracle")
ROUTERS = ("round-robin", "least-loaded", "prefix-aware", "session-affinity")


# vLLM's largest KV block (`BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]`, vllm/config/cache.py).
MAX_BLOCK_SIZE = 256


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
    # vLLM's CPU KV offloading buffer of a replica, summed over its GPUs (GiB); None: no CPU tier
    kv_offloading_size: float | None = None
    preemption_mode: str = "recompute"  # recompute | swap
    max_model_len: int | None = None  # longest prompt + output a request may have
    tensor_parallel_size: int = 1  # GPUs one replica is sharded over
    policy: str = "continuous"  # a registered policy (simcore.policies.registry)
    allocator: str = "paged"  # paged | contiguous; ignored by policies with one allocator
    reservation: str = "max"  # contiguous sizing: max | pow2 | oracle
    max_batch_size: int = 64  # static batching: requests per batch
    batch_timeout_s: float = 0.1  # static batching: longest wait for a full batch
    num_gpu_blocks_override: int | None = None  # vLLM's override of the profiled block count
    data_parallel_size: int = 1  # engine replicas, each on tensor x pipeline parallel GPUs
    router: str = "least-loaded"  # how requests are spread over replicas (simcore.router)
    pipeline_parallel_size: int = 1  # pipeline stages, each `tensor_parallel_size` GPUs
    kv_cache_dtype: str = "auto"  # auto (the model dtype) | fp8 | fp8_e4m3 | fp8_e5m2
    quantization: str | None = None  # weights: None (the checkpoint's own) | fp8
    enable_expert_parallel: bool = False  # MoE: experts sharded over all tp x dp GPUs (vLLM's flag)
    speculative_config: SpeculativeConfig | None = None  # vLLM's --speculative-config (simcore.speculative)
    engine_version: str = DEFAULT_ENGINE_VERSION  # the vLLM version a continuous step's host cost models

    def __post_init__(self) -> None:
        _check_types(self)
        if self.speculative_config is not None:
            from kvsim.simcore.speculative import SpeculativeConfig

            if not isinstance(self.speculative_config, SpeculativeConfig):
                raise ConfigError("--speculative-config must be parsed by simcore.speculative.parse_speculative_config")
        bs = self.block_size
        if not isinstance(bs, int) or bs <= 0 or bs & (bs - 1) or bs > MAX_BLOCK_SIZE:
            raise ConfigError(f"--block-size must be a power of two from 1 to {MAX_BLOCK_SIZE}, got {bs}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                "--gpu-memory-utilization must be in (0, 1], got "
                f"{self.gpu_memory_utilization}"
            )
        _positive(
            self, "max_num_seqs", "tensor_parallel_size", "max_batch_size", "data_parallel_size",
            "pipeline_parallel_size",
        )
        tp = self.tensor_parallel_size
        if tp & (tp - 1):
            raise ConfigError(f"--tp must be a power of two, got {tp}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}"
            )
        if self.engine_version not in ENGINE_VERSIONS:
            raise ConfigError(
                f"--engine-version must be one of {', '.join(ENGINE_VERSIONS)}, got {self.engine_version!r}"
            )
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ConfigError(
                f"--quantization {self.quantization!r} is not supported; kvsim prices "
                f"{', '.join(QUANTIZATIONS)} (or none)"
            )
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

    @property
    def expert_parallel_size(self) -> int:
        """GPUs one MoE layer's routed experts are spread over: TP x DP with --enable-expert-parallel
        (vLLM: the EP group spans the data-parallel ranks' tensor-parallel groups), else 1."""
        return self.tensor_parallel_size * self.data_parallel_size if self.enable_expert_parallel else 1

    @property
    def num_gpus(self) -> int:
        """GPUs the whole deployment uses: TP x PP x DP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def resolve_model(self, model: ModelSpec) -> ModelSpec:
        """The model as this engine stores it: `--quantization` and `--kv-cache-dtype` applied.
        A checkpoint that is already quantized keeps its format; asking for another one is an
        error, as in vLLM."""
        quantization = model.quantization
        if self.quantization is not None:
            if model.quantization not in (None, self.quantization):
                raise ConfigError(
                    f"{model.name} is a {model.quantization} checkpoint; it cannot be served with "
                    f"--quantization {self.quantization}"
                )
            quantization = self.quantization
        if quantization == model.quantization and self.kv_cache_dtype == model.kv_cache_dtype:
            return model
        return replace(model, quantization=quantization, kv_cache_dtype=self.kv_cache_dtype)

    def resolved_max_model_len(self, model: ModelSpec) -> int:
        return self.max_model_len or model.max_position_embeddings

    def resolved_max_num_batched_tokens(self, model: ModelSpec) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.enable_chunked_prefill:
            return 8192
        return max(self.resolved_max_model_len(model), 2048)

    def to_dict(self) -> dict[str, Any]:
        """Every field; `speculative_config` only when set (as its dict), so a run without it
        records what it always did."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        spec = d.pop("speculative_config")
        if spec is not None:
            d["speculative_config"] = spec.to_dict()
        return d


__all__ = ["GPUSpec", "ModelSpec", "EngineConfig", "GIB", "KV_CACHE_DTYPES", "KV_CACHE_DTYPE_ALIASES",
           "canonical_kv_cache_dtype", "QUANTIZATIONS", "ENGINE_VERSIONS",
           "DEFAULT_ENGINE_VERSION", "ENGINE_PRESETS"]
