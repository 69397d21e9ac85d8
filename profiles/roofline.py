"""Price a GPU nobody has profiled from its datasheet: a roofline profile (schema v2).

Structured per operator, each a function of (gpu, model, tp, shape): `linear_ops` (one layer's GEMMs
and elementwise kernels), `prefill_attention_ms`, `decode_attention_ms`, `lm_head_ms`, plus the
collectives (`profiles.collectives`, measured NCCL) and the host model (`profiles.host`). A new
operator (FP8 GEMMs, MoE experts, pipeline hand-offs) is one more function and one more table.

Every kernel costs `launch_floor + max(flops / (peak * compute_eff), bytes / (hbm * bandwidth_eff))`.
The GEMM and elementwise factors are fitted by `profiles.fit` on measured H100 operator timings
(`efficiency_h100.json`). Prefill attention has its own efficiency (FlashAttention, cited in
FLASH_ATTENTION) and wave occupancy; paged decode attention pays a per-block cost (cited in
PAGED_BLOCK_OVERHEAD_TOKENS) and reads whole blocks. Such a profile is labelled `source: roofline`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.simcore.latency import SCHEMA, SCHEMA_VERSION
from kvsim.simcore.specs import GPUSpec, ModelSpec

EFFICIENCY_FILE = Path(__file__).with_name("efficiency_h100.json")
ELEMENTWISE_KINDS = ("norm", "rope", "act", "add")
SAMPLING_KERNELS = 4  # temperature, softmax, top-p/top-k filter, multinomial draw
SAMPLING_PASSES = 4  # fp32 passes over the logits by those kernels

# FlashAttention forward efficiency on the H100, e(S) = E_MAX * S / (S + S_HALF) of dense bf16 peak at
# key length S, fitted to FlashAttention-3's measured TFLOP/s at head dim 128 with the GPU filled
# (pytorch/benchmark PR #2391, B*S = 16k, 16 heads: 430, 517, 566, 590, 614, 621 TFLOP/s at
# S = 512..16384; 0.435 and 0.628 of 989 TFLOP/s at the ends give E_MAX 0.637, S_HALF 238 tokens).
# FlashAttention-2 reaches 50-73% of A100 peak (Dao 2023), so the same curve is used for the A100.
FLASH_ATTENTION = {"e_max": 0.637, "s_half": 238.0, "tile_tokens": 128}
# Streaming multiprocessors (NVIDIA datasheets: H100 SXM5 132, H200 132, A100 108).
NUM_SMS = {"H100-SXM-80GB": 132, "H200-141GB": 132, "A100-80GB": 108, "A100-40GB": 108}
# Paged decode reads each KV block through the block table: one table read and a new, dependent
# load per block and head. Kwon et al. (vLLM, SOSP 2023, sec. 7.1 / Fig. 18a) measured the paged
# kernel 20-26% slower than FasterTransformer's contiguous one at block size 16; charging that 23%
# as a per-block cost gives 0.23 x 16 = 3.68 token rows' worth of bandwidth per block, so a block of
# B tokens costs B + 3.68 rows: x4.7 at B = 1, x1.23 at 16, x1.03 at 128 (plus the unfilled rows
# of the last block, read and masked).
PAGED_BLOCK_OVERHEAD_TOKENS = 0.23 * 16
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)

# FP8 GEMMs (`--quantization fp8`): FP8 tensor-core peak (GPUSpec.fp8_tflops) at their own efficiency:
# 0.526 = the median of DeepGEMM's six large dense FP8 GEMMs (M = 4096: 1058, 990, 590, 1358, 1304,
# 1025 TFLOP/s, median 1041) on an H800, whose FP8 peak equals the H100 SXM's 1979 TFLOP/s
# (github.com/deepseek-ai/DeepGEMM README, "Normal GEMMs for dense models"). Weights and the
# activations they read are 1 byte; each GEMM input is quantized first (one elementwise pass,
# bf16 in, fp8 out), as vLLM's dynamic per-token/tensor FP8 does. Bandwidth efficiency and launch
# floor are the fitted bf16 ones (bytes are bytes).
FP8_COMPUTE_EFFICIENCY = 0.526
# MoE layers (vLLM fused_moe): a top-k router GEMM, then every expert that at least one token picked
# runs its gate/up and down GEMMs on the tokens routed to it. Routing assumption (stated, not
# measured): tokens pick experts uniformly at random (what the router's load-balancing loss aims
# for), so T tokens touch E * (1 - (1 - k/E)^T) distinct experts in expectation, and each touched
# expert gets T*k/touched tokens, padded to the kernel's row tile (vLLM moe_align_block_size pads
# every expert's tokens to BLOCK_SIZE_M; 16 is its smallest). With TP over experts every GPU holds
# a 1/tp slice of every expert, so imbalance between experts creates no straggler GPU; it costs
# only padding, charged on the expected count. Small batches are bandwidth-bound over the weights
# of the touched experts only (Mixtral at batch 1 reads 2 of 8 experts).
MOE_TILE_ROWS = 16

# Grids (issue 4): tokens 1..16384 log-spaced; chunk 1..16384 x context 0..32768;
# batch 1..1024 x context 1..32768 (small chunks and contexts are common: prompt tails).
NUM_TOKENS = sorted({round(2 ** (k / 2)) for k in range(0, 29)})
CHUNK_TOKENS = [2**k for k in range(0, 15)]
PREFILL_CONTEXT = [0] + [2**k for k in range(7, 16)]
DECODE_BATCH = [2**k for k in range(0, 11)]
DECODE_CONTEXT = [2**k for k in range(0, 16)]
NUM_SEQS = [2**k for k in range(0, 11)]


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Fitted roofline factors: GEMM compute/bandwidth efficiency and per-kernel floors."""

    compute: float  # share of dense bf16 peak a GEMM reaches, (0, 1]
    bandwidth: float  # share of HBM bandwidth a GEMM's weight/activation traffic reaches
    gemm_floor_ms: float  # fixed cost of one GEMM launch (ms)
    elementwise: dict[str, float]  # share of HBM bandwidth per elementwise kind
    elementwise_floor_ms: float  # fixed cost of one elementwise kernel (ms)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Efficiency:
        g, e = d["gemm"], d["elementwise"]
        return cls(
            compute=float(g["compute_efficiency"]),
            bandwidth=float(g["bandwidth_efficiency"]),
            gemm_floor_ms=float(g["launch_floor_ms"]),
            elementwise={k: float(e["bandwidth_efficiency"][k]) for k in ELEMENTWISE_KINDS},
            elementwise_floor_ms=float(e["launch_floor_ms"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gemm": {
                "compute_efficiency": self.compute,
                "bandwidth_efficiency": self.bandwidth,
                "launch_floor_ms": self.gemm_floor_ms,
            },
            "elementwise": {
                "bandwidth_efficiency": dict(self.elementwise),
                "launch_floor_ms": self.elementwise_floor_ms,
            },
        }


def load_efficiency(path: Path = EFFICIENCY_FILE) -> Efficiency:
    return Efficiency.from_dict(json.loads(path.read_text()))


def gemm_ms(gpu: GPUSpec, eff: Efficiency, flops: float, nbytes: float) -> float:
    compute_s = flops / (gpu.bf16_tflops * 1e12 * eff.compute)
    memory_s = nbytes / (gpu.hbm_tbps * 1e12 * eff.bandwidth)
    return eff.gemm_floor_ms + 1e3 * max(compute_s, memory_s)


def fp8_gemm_ms(gpu: GPUSpec, eff: Efficiency, flops: float, nbytes: float) -> float:
    assert gpu.fp8_tflops is not None, f"{gpu.name} has no FP8 tensor cores"
    compute_s = flops / (gpu.fp8_tflops * 1e12 * FP8_COMPUTE_EFFICIENCY)
    memory_s = nbytes / (gpu.hbm_tbps * 1e12 * eff.bandwidth)
    return eff.gemm_floor_ms + 1e3 * max(compute_s, memory_s)


def experts_touched(num_tokens: int, num_experts: int, top_k: int) -> float:
    """Expected distinct experts picked by `num_tokens` tokens choosing top-k of E uniformly."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def elementwise_ms(gpu: GPUSpec, eff: Efficiency, kind: str, nbytes: float) -> float:
    return eff.elementwise_floor_ms + 1e3 * nbytes / (gpu.hbm_tbps * 1e12 * eff.elementwise[kind])


def linear_ops(model: ModelSpec, tp: int, tokens: int, moe_layer: bool | None = None,
               ep: int = 1) -> list[tuple[str, str, float, float]]:
    """One layer's linear work on one GPU: (operator, kind, flops, bytes). Kind is "gemm", "gemm8"
    (an FP8 GEMM) or an elementwise kind. Operator names follow the measured data (Vidur's
    mlp.csv); an MoE layer's MLP is the router and the experts (`moe_ops`); `moe_layer` False
    gives a dense layer of an MoE model (DeepSeek's first_k_dense_replace layers)."""
    t, h, b = tokens, model.hidden_size, model.dtype_bytes
    q, kv, inter = model.q_size // tp, max(1, model.num_kv_heads // tp) * model.head_dim, model.intermediate_size // tp
    gemm = _gemm_maker(model, t)
    if model.is_mla:
        ops = [("input_layernorm", "norm", 0.0, 2.0 * t * h * b), *mla_projection_ops(model, tp, t),
               ("post_attention_layernorm", "norm", 0.0, 2.0 * t * h * b)]
    else:
        ops = [("input_layernorm", "norm", 0.0, 2.0 * t * h * b), *gemm("attn_pre_proj", h, q + 2 * kv),
               *gemm("attn_post_proj", q, h), ("post_attention_layernorm", "norm", 0.0, 2.0 * t * h * b)]
    if model.is_moe if moe_layer is None else moe_layer:
        ops += moe_ops(model, tp, t) if ep <= 1 else ep_moe_ops(model, tp, t, ep)
    else:
        up = (2 if model.gated_mlp else 1) * inter
        ops += [*gemm("mlp_up_proj", h, up),
                ("mlp_act", "act", 0.0, float(t * inter * (3 if model.gated_mlp else 2) * b)),
                *gemm("mlp_down_proj", inter, h)]
    ops.append(("add", "add", 0.0, 3.0 * t * h * b))
    if model.is_mla:  # rope on the rope parts only: each head's query slice and the one shared key
        rope = model.qk_rope_head_dim
        ops.insert(2, ("attn_rope", "rope", 0.0, 2.0 * t * (model.num_attention_heads // tp + 1) * rope * b))
    elif model.gated_mlp:  # Llama-style rotary embeddings; OPT has learned positions
        ops.insert(1 + (2 if model.quantization == "fp8" else 1), ("attn_rope", "rope", 0.0, 2.0 * t * (q + kv) * b))
    return ops


def mla_projection_ops(model: ModelSpec, tp: int, t: int) -> list[tuple[str, str, float, float]]:
    """MLA's projections on one GPU, as vLLM shards them (vllm/model_executor/models/deepseek_v2.py):
    q_a and kv_a replicated on every rank (ReplicatedLinear), q_b, kv_b column-parallel and o
    row-parallel over the heads. kv_b up-projects the latent to per-head K_nope and V: prefill runs
    it on the chunk's tokens; decode absorbs the same weights into the query and the output
    (W_UK, W_UV batched matmuls: the same FLOPs and weight bytes per token), so one GEMM prices
    both. The q_a / kv_a norms ride in elementwise `norm` ops."""
    h, b = model.hidden_size, model.dtype_bytes
    heads = max(1, model.num_attention_heads // tp)
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    gemm = _gemm_maker(model, t)
    ops: list[tuple[str, str, float, float]] = []
    if model.q_lora_rank:
        ops += [*gemm("attn_q_a_proj", h, model.q_lora_rank),
                ("attn_q_a_layernorm", "norm", 0.0, 2.0 * t * model.q_lora_rank * b),
                *gemm("attn_q_b_proj", model.q_lora_rank, heads * qk)]
    else:
        ops += gemm("attn_q_proj", h, heads * qk)
    ops += [*gemm("attn_kv_a_proj", h, model.mla_latent_dim),
            ("attn_kv_a_layernorm", "norm", 0.0, 2.0 * t * model.kv_lora_rank * b),
            *gemm("attn_kv_b_proj", model.kv_lora_rank, heads * (model.qk_nope_head_dim + model.v_head_dim)),
            *gemm("attn_post_proj", heads * model.v_head_dim, h)]
    return ops


def _gemm_maker(model: ModelSpec, t: int):
    """gemm(name, k, n[, rows, weight_sets]) -> the op list of one (possibly FP8) GEMM of `rows`
    token rows (default t) against `weight_sets` k x n weight matrices (experts) read once."""
    b = model.dtype_bytes
    fp8 = model.quantization == "fp8"

    def gemm(name: str, k: int, n: int, rows: float | None = None, weight_sets: float = 1.0):
        rows = t if rows is None else rows
        flops = 2.0 * rows * k * n
        if not fp8:
            return [(name, "gemm", flops, float(weight_sets * k * n + rows * k + rows * n) * b)]
        return [(f"{name}_quant", "act", 0.0, float(rows * k * (b + 1))),
                (name, "gemm8", flops, float(weight_sets * k * n + rows * k + rows * n * b))]

    return gemm


def moe_ops(model: ModelSpec, tp: int, t: int) -> list[tuple[str, str, float, float]]:
    """An MoE layer's MLP on one GPU under the routing assumption above (MOE_TILE_ROWS)."""
    h, b, k, e = model.hidden_size, model.dtype_bytes, model.num_experts_per_tok, model.num_experts
    inter = model.moe_intermediate_size // tp
    touched = experts_touched(t, e, k)
    per_expert = t * k / touched
    rows = touched * math.ceil(per_expert / MOE_TILE_ROWS) * MOE_TILE_ROWS
    gemm = _gemm_maker(model, t)
    ops = [("moe_router", "gemm", 2.0 * t * h * e, float(h * e + t * h + t * e) * b),
           ("moe_topk_align", "add", 0.0, float(t * e * 4 + t * k * 8)),
           *gemm("moe_up_proj", h, 2 * inter, rows, touched),
           ("moe_act", "act", 0.0, float(t * k * inter * 3 * b)),
           *gemm("moe_down_proj", inter, h, rows, touched),
           ("moe_sum", "add", 0.0, float(t * k * h * b + t * h * b))]
    return ops + _shared_expert_ops(model, tp, t, gemm)


def _shared_expert_ops(model: ModelSpec, tp: int, t: int, gemm) -> list[tuple[str, str, float, float]]:
    """Always-on shared experts, tensor-parallel in both the TP and the EP layout (as vLLM keeps them)."""
    shared = model.shared_expert_intermediate_size // tp
    if not shared:
        return []
    h, b = model.hidden_size, model.dtype_bytes
    return [*gemm("shared_up_proj", h, 2 * shared), ("shared_act", "act", 0.0, float(t * shared * 3 * b)),
            *gemm("shared_down_proj", shared, h)]


def ep_load_imbalance(pairs: float, ep: int) -> float:
    """Busiest GPU's share of `pairs` token-expert assignments over `ep` GPUs, relative to the mean,
    under uniform independent routing: the expected maximum of ep near-Poisson loads, mean +
    sqrt(2 ln ep) standard deviations (the Gaussian extreme-value estimate). Real routers are
    more skewed and vLLM's EPLB rebalances them; neither is modelled."""
    mean = pairs / ep
    if mean <= 0 or ep <= 1:
        return 1.0
    return min(float(ep), 1.0 + math.sqrt(2.0 * math.log(ep)) * math.sqrt((1.0 - 1.0 / ep) / mean))


def ep_moe_ops(model: ModelSpec, tp: int, t: int, ep: int) -> list[tuple[str, str, float, float]]:
    """An MoE layer's MLP on one GPU of an expert-parallel group of `ep` GPUs (vLLM's
    --enable-expert-parallel: E/ep whole experts per GPU, not a 1/tp slice of every expert). The
    group's ep/tp data-parallel ranks step together (vLLM runs DP+EP forward passes in lockstep,
    idle ranks with dummy batches); kvsim assumes each brings the same `t` tokens, so one GPU
    serves t x ep/tp x top-k / ep assignments on average, and the busiest GPU (ep_load_imbalance)
    sets the layer's time. Shared experts stay tensor-parallel, as vLLM's DeepSeek model keeps
    them."""
    h, b, k, e = model.hidden_size, model.dtype_bytes, model.num_experts_per_tok, model.num_experts
    inter, local = model.moe_intermediate_size, e / ep
    group_tokens = t * (ep / tp)
    pairs = group_tokens * k
    busiest = pairs / ep * ep_load_imbalance(pairs, ep)
    touched = local * (1.0 - (1.0 - k / e) ** group_tokens)
    rows = touched * math.ceil(busiest / max(touched, 1e-9) / MOE_TILE_ROWS) * MOE_TILE_ROWS
    gemm = _gemm_maker(model, t)
    ops = [("moe_router", "gemm", 2.0 * t * h * e, float(h * e + t * h + t * e) * b),
           ("moe_topk_align", "add", 0.0, float(t * e * 4 + t * k * 8)),
           *gemm("moe_up_proj", h, 2 * inter, rows, touched),
           ("moe_act", "act", 0.0, float(busiest * inter * 3 * b)),
           *gemm("moe_down_proj", inter, h, rows, touched),
           ("moe_sum", "add", 0.0, float(t * k * h * b + t * h * b))]
    return ops + _shared_expert_ops(model, tp, t, gemm)


# Expert-parallel all-to-all (MoE dispatch and combine), as DeepEP's normal kernels measure it
# (github.com/deepseek-ai/DeepEP, legacy README, H800 with CX7 400 Gb/s, DeepSeek-V3 setting: 4,096
# tokens, hidden 7,168, top-8, FP8 dispatch, BF16 combine): 153 / 158 GB/s over NVLink at EP 8
# (H800 NVLink: 200 GB/s per direction, so 0.77 of it) and 43 GB/s over RDMA at EP 16 (0.86 of the
# 50 GB/s NIC). Its low-latency kernels move 128 tokens in 77 us (dispatch) and 114 us (combine)
# at EP 8: bandwidth-bound too, so one floor (the NCCL latency measured on the H100) suffices.
EP_A2A_NVLINK_EFFICIENCY = 153.0 / 200.0
EP_A2A_RDMA_EFFICIENCY = 43.0 / 50.0
EP_A2A_FLOOR_MS = 0.030  # per dispatch or combine: the measured H100 NCCL latency floor (collectives_h100.json)


def ep_all_to_all_ms(gpu: GPUSpec, model: ModelSpec, tp: int, tokens: int, ep: int) -> float:
    """One MoE layer's dispatch + combine on one GPU of an `ep`-GPU group: each of its tokens
    (its TP group splits them) goes to top-k experts, FP8 out when the weights are FP8 (DeepEP's
    FP8 dispatch), the model dtype back; a GPU's own experts stay local (1/ep of them). Over NVLink
    inside a node, over the NIC once the group spans nodes."""
    if ep <= 1:
        return 0.0
    remote = (1.0 - 1.0 / ep) * tokens / tp * model.num_experts_per_tok * model.hidden_size
    out_bytes = remote * (1 if model.quantization == "fp8" else model.dtype_bytes)
    back_bytes = remote * model.dtype_bytes
    if ep <= gpu.gpus_per_node:
        bw = gpu.interconnect_gbps * 1e9 * EP_A2A_NVLINK_EFFICIENCY
    else:
        bw = gpu.internode_gbps * 1e9 * EP_A2A_RDMA_EFFICIENCY
    return 2 * EP_A2A_FLOOR_MS + 1e3 * (out_bytes + back_bytes) / bw


def op_ms(gpu: GPUSpec, eff: Efficiency, kind: str, flops: float, nbytes: float) -> float:
    if kind == "gemm":
        return gemm_ms(gpu, eff, flops, nbytes)
    if kind == "gemm8":
        return fp8_gemm_ms(gpu, eff, flops, nbytes)
    return elementwise_ms(gpu, eff, kind, nbytes)


def linear_layer_ms(gpu: GPUSpec, model: ModelSpec, tp: int, tokens: int, eff: Efficiency, ep: int = 1) -> float:
    """All linear work of one layer: the ops above, a second residual add, and the KV write. A model
    whose first layers are dense (DeepSeek's first_k_dense_replace) gets the mean over its layers
    (the latency model multiplies one layer's time by the layer count)."""
    total = sum(op_ms(gpu, eff, kind, f, nb) for _, kind, f, nb in linear_ops(model, tp, tokens, ep=ep))
    total += ep_all_to_all_ms(gpu, model, tp, tokens, ep)
    dense = model.num_layers - model.num_moe_layers if model.is_moe else 0
    if dense:
        dense_ms = sum(op_ms(gpu, eff, kind, f, nb) for _, kind, f, nb in linear_ops(model, tp, tokens, False))
        total = (total * model.num_moe_layers + dense_ms * dense) / model.num_layers
    total += elementwise_ms(gpu, eff, "add", 3.0 * tokens * model.hidden_size * model.dtype_bytes)
    kv_in_out = model.dtype_bytes + model.kv_dtype_bytes  # read the new K, V; write them to the cache
    if model.is_mla:  # one latent + rope key per token, written on every rank
        total += elementwise_ms(gpu, eff, "add", 1.0 * tokens * model.mla_latent_dim * kv_in_out)
    else:
        kv = max(1, model.num_kv_heads // tp) * model.head_dim
        total += elementwise_ms(gpu, eff, "add", 2.0 * tokens * kv * kv_in_out)  # cache write
    return total


def flash_efficiency(keys: float) -> float:
    fa = FLASH_ATTENTION
    return fa["e_max"] * keys / (keys + fa["s_half"])


def prefill_attention_ms(gpu: GPUSpec, model: ModelSpec, tp: int, chunk: int, context: int) -> float:
    """Causal attention of a `chunk` over `context` prior tokens plus itself, on a GPU that other
    chunks of the step keep full (no floor, no occupancy loss: the latency model adds both once per
    step from the profile's `occupancy`)."""
    heads = max(1, model.num_attention_heads // tp)
    attended = chunk * (context + (chunk + 1) / 2)  # query-key pairs under the causal mask
    if model.is_mla:
        # vLLM's MLA prefill is plain attention over up-projected heads (qk dim nope+rope, v dim
        # v_head_dim); the chunk's own K/V come from kv_b (a linear op), and a chunk with cached
        # context first up-projects that context's latents (vllm/v1/attention/backends/mla/common.py,
        # _compute_prefill_context): 2 x context x kv_lora_rank x heads x (nope + v) more FLOPs.
        qk, v = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
        flops = 2.0 * attended * heads * (qk + v)
        flops += 2.0 * context * model.kv_lora_rank * heads * (model.qk_nope_head_dim + v)
    else:
        flops = 4.0 * attended * heads * model.head_dim
    return 1e3 * flops / (gpu.bf16_tflops * 1e12 * flash_efficiency(context + chunk))


def decode_attention_ms(
    gpu: GPUSpec, model: ModelSpec, tp: int, batch: int, context: float, block_size: int,
    eff: Efficiency,
) -> float:
    """Paged decode: each sequence reads whole blocks through its block table, the last one
    padded (a batch's lengths are ragged: on average (B-1)/2B of a block is padding), and each
    block costs PAGED_BLOCK_OVERHEAD_TOKENS rows more (see above)."""
    heads, kv_heads = max(1, model.num_attention_heads // tp), max(1, model.num_kv_heads // tp)
    d, b, kvb = model.head_dim, model.dtype_bytes, model.kv_dtype_bytes  # FP8 KV: half the reads
    blocks = max(1.0, context / block_size + (block_size - 1) / (2 * block_size))
    rows = blocks * (block_size + PAGED_BLOCK_OVERHEAD_TOKENS)
    if model.is_mla:
        # Absorbed MLA decode (FlashMLA; vLLM's MLA decode backends): every head scores the query,
        # moved into latent space, against the one shared latent + rope key (kv_lora_rank + rope
        # wide) and sums values in the latent (kv_lora_rank wide): the cache is read once for all
        # heads, so decode attention is far less memory-bound than GQA's.
        latent = model.mla_latent_dim
        flops = 2.0 * batch * context * heads * (latent + model.kv_lora_rank)
        nbytes = batch * (rows * latent * kvb + heads * (latent + model.kv_lora_rank) * b) + batch * 4 * blocks
        return gemm_ms(gpu, eff, flops, nbytes)
    flops = 4.0 * batch * context * heads * d
    nbytes = batch * (2.0 * rows * kv_heads * kvb + 2.0 * heads * b) * d + batch * 4 * blocks
    return gemm_ms(gpu, eff, flops, nbytes)


def lm_head_ms(gpu: GPUSpec, model: ModelSpec, tp: int, seqs: int, eff: Efficiency) -> float:
    """Final norm, vocab-sharded LM head and sampling, for the whole model (the logits gather is
    a collective, priced by the latency model from the profile's all-reduce table)."""
    h, v, b = model.hidden_size, model.vocab_size, model.dtype_bytes
    vs = math.ceil(v / tp)
    total = elementwise_ms(gpu, eff, "norm", 2.0 * seqs * h * b)
    total += gemm_ms(gpu, eff, 2.0 * seqs * h * vs, float(h * vs + seqs * h + seqs * vs) * b)
    total += SAMPLING_KERNELS * eff.elementwise_floor_ms
    total += 1e3 * SAMPLING_PASSES * seqs * v * 4 / (gpu.hbm_tbps * 1e12 * eff.elementwise["act"])
    return total


def _r(x: float) -> float:
    return float(f"{x:.4g}")


def build_roofline_profile(
    gpu: GPUSpec,
    model: ModelSpec,
    tp: int,
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
    efficiency: Efficiency | None = None,
    ep: int = 1,
) -> dict[str, Any]:
    """A schema-v2 profile document priced from the datasheet and the fitted efficiencies;
    `ep` > 1: the MoE layers run expert-parallel over that many GPUs (ep_moe_ops)."""
    from kvsim.profiles.attention import prefill_attention_by_engine
    from kvsim.profiles.collectives import collectives_for
    from kvsim.profiles.host import host_overhead_block

    eff = efficiency or load_efficiency()
    host, host_by_policy, host_by_engine = host_overhead_block(model.num_layers, tp)
    collectives = collectives_for(gpu, tp)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "source": "roofline",
        "gpu": gpu.name,
        "model": model.name,
        "tensor_parallel_size": tp,
        "dtype": "bfloat16" if model.dtype_bytes == 2 else "float32",
        "model_shape": model.to_dict(),
        "host_overhead": host,
        "host_overhead_by_policy": host_by_policy,
        "host_overhead_by_engine": host_by_engine,
        "linear": {
            "num_tokens": NUM_TOKENS,
            "time_ms": [_r(linear_layer_ms(gpu, model, tp, t, eff, ep)) for t in NUM_TOKENS],
        },
        "prefill_attention": {
            "chunk_tokens": CHUNK_TOKENS,
            "context_tokens": PREFILL_CONTEXT,
            "time_ms": [
                [_r(prefill_attention_ms(gpu, model, tp, c, p)) for p in PREFILL_CONTEXT]
                for c in CHUNK_TOKENS
            ],
            "launch_floor_ms": eff.gemm_floor_ms,
            "occupancy": {
                "tile_tokens": FLASH_ATTENTION["tile_tokens"],
                "ctas_per_tile": max(1, model.num_attention_heads // tp),
                "num_sms": NUM_SMS.get(gpu.name, 108),
            },
        },
        "decode_attention": {
            str(bs): {
                "batch_size": DECODE_BATCH,
                "context_tokens": DECODE_CONTEXT,
                "time_ms": [
                    [_r(decode_attention_ms(gpu, model, tp, n, c, bs, eff)) for c in DECODE_CONTEXT]
                    for n in DECODE_BATCH
                ],
            }
            for bs in sorted(block_sizes)
        },
        "lm_head": {"num_seqs": NUM_SEQS, "time_ms": [_r(lm_head_ms(gpu, model, tp, s, eff)) for s in NUM_SEQS]},
        "provenance": {
            "generator": "profiles.roofline.build_roofline_profile",
            "gpu_spec": {
                "bf16_tflops": gpu.bf16_tflops, "hbm_tbps": gpu.hbm_tbps,
                "interconnect_gbps": gpu.interconnect_gbps,
            },
            "efficiency": eff.to_dict(),
            "efficiency_fitted_on": "H100 Llama-2-7B operator timings (profiles/efficiency_h100.json)",
            "prefill_attention": "FlashAttention-3 H100 efficiency curve + wave occupancy (profiles/README.md)",
            "decode_attention": f"paged: whole blocks + {PAGED_BLOCK_OVERHEAD_TOKENS:.2f} rows per block (vLLM paper)",
            "host_overhead": "defaults per policy and engine version from public measurements (profiles/host.py, README)",
            "collective": collectives["source"] if collectives else "none (tp 1)",
        },
    }
    by_engine = prefill_attention_by_engine(gpu, model, CHUNK_TOKENS, PREFILL_CONTEXT, _r)
    if by_engine:  # Hopper: vLLM 0.5 / 0.6 ran FlashAttention-2 there (profiles/attention.py)
        doc["prefill_attention_by_engine"] = by_engine
        doc["provenance"]["prefill_attention_by_engine"] = (
            "vllm-v0 / vllm-0.6 ran FlashAttention-2 on Hopper: the FA3 table x FA3 / FA2 forward throughput "
            "measured side by side (FlashAttention-3 paper Fig. 5, causal; profiles/attention.py)")
    if collectives:
        doc["collectives"] = collectives
    if ep > 1:
        doc["expert_parallel_size"] = ep
        if collectives:  # the MoE output needs no all-reduce: the combine all-to-all returns it
            doc["collectives"] = {**collectives, "all_reduce_calls_per_layer": 1}
        doc["provenance"]["expert_parallel"] = (
            f"EP {ep}: {model.num_experts // ep} whole experts per GPU, ep/tp = {ep // tp} data-parallel ranks "
            "assumed to bring equal batches, busiest GPU under uniform routing; dispatch/combine priced from "
            "DeepEP's measured bandwidths (profiles/roofline.py)")
    if model.quantization == "fp8" or model.kv_dtype == "fp8":
        doc["weight_dtype"], doc["kv_cache_dtype"] = model.weight_dtype, model.kv_dtype
        doc["provenance"]["fp8"] = (
            f"FP8 GEMMs at {gpu.fp8_tflops} TFLOP/s x {FP8_COMPUTE_EFFICIENCY} (DeepGEMM H800 median)"
            if model.quantization == "fp8" else "bf16 weights")
        doc["provenance"]["kv_cache"] = f"{model.kv_dtype} KV cache: decode attention reads {model.kv_dtype_bytes} byte(s) per element"
    if model.is_moe:
        doc["provenance"]["moe"] = (
            f"{model.num_experts} experts, top-{model.num_experts_per_tok}: uniform routing, expected distinct "
            f"experts touched, rows padded to {MOE_TILE_ROWS} (profiles/roofline.py)")
    return doc
