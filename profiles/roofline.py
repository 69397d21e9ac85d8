"""Price a GPU nobody has profiled from its datasheet: a roofline profile (schema v1).

Every kernel costs `launch_floor + max(flops / (peak * compute_eff), bytes / (hbm * bandwidth_eff))`.
The efficiency factors for linear work (GEMMs, norms, elementwise) are fitted by `profiles.fit`
on measured H100 operator timings (`efficiency_h100.json`); attention kernels and the LM head
reuse the GEMM factors (no attention timings are in the fit data, so prefill attention is
likely optimistic). The TP all-reduce is priced from the interconnect bandwidth plus an assumed
per-call latency. Such a profile is labelled `source: roofline` wherever it is used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simcore.latency import SCHEMA, SCHEMA_VERSION
from simcore.specs import GPUSpec, ModelSpec

EFFICIENCY_FILE = Path(__file__).with_name("efficiency_h100.json")
ELEMENTWISE_KINDS = ("norm", "rope", "act", "add")
ALLREDUCE_LATENCY_MS = 0.010  # assumed per-call NCCL latency on NVLink; not fitted, not measured
SAMPLING_KERNELS = 4  # temperature, softmax, top-p/top-k filter, multinomial draw
SAMPLING_PASSES = 4  # fp32 passes over the logits by those kernels

# Grids (issue 4): tokens 1..16384 log-spaced; chunk 1..16384 x context 0..32768;
# batch 1..1024 x context 1..32768 (small chunks and contexts are common: prompt tails).
NUM_TOKENS = sorted({round(2 ** (k / 2)) for k in range(0, 29)})
CHUNK_TOKENS = [2**k for k in range(0, 15)]
PREFILL_CONTEXT = [0] + [2**k for k in range(7, 16)]
DECODE_BATCH = [2**k for k in range(0, 11)]
DECODE_CONTEXT = [2**k for k in range(0, 16)]
NUM_SEQS = [2**k for k in range(0, 11)]

# Fixed CPU cost of one engine step (scheduling, input preparation, kernel launches,
# detokenisation), per batching policy: base + per_layer * num_layers, in ms. See README.
OVERHEAD_MS = {
    "static": (1.0, 0.10),  # HF generate: eager PyTorch, every kernel launched from Python
    "dynamic": (1.5, 0.05),  # early TGI: router + Python model server, custom kernels, no graphs
    "continuous": (1.5, 0.01),  # vLLM: CUDA graphs for decode, CPU scheduler on the critical path
}


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


def elementwise_ms(gpu: GPUSpec, eff: Efficiency, kind: str, nbytes: float) -> float:
    return eff.elementwise_floor_ms + 1e3 * nbytes / (gpu.hbm_tbps * 1e12 * eff.elementwise[kind])


def linear_ops(model: ModelSpec, tp: int, tokens: int) -> list[tuple[str, str, float, float]]:
    """One layer's linear work on one GPU: (operator, kind, flops, bytes). Kind is "gemm" or
    an elementwise kind. Operator names follow the measured data (Vidur's mlp.csv)."""
    t, h, b = tokens, model.hidden_size, model.dtype_bytes
    q, kv, inter = model.q_size // tp, max(1, model.num_kv_heads // tp) * model.head_dim, model.intermediate_size // tp

    def gemm(name: str, k: int, n: int) -> tuple[str, str, float, float]:
        return (name, "gemm", 2.0 * t * k * n, float(k * n + t * k + t * n) * b)

    up = (2 if model.gated_mlp else 1) * inter
    ops = [
        ("input_layernorm", "norm", 0.0, 2.0 * t * h * b),
        gemm("attn_pre_proj", h, q + 2 * kv),
        gemm("attn_post_proj", q, h),
        ("post_attention_layernorm", "norm", 0.0, 2.0 * t * h * b),
        gemm("mlp_up_proj", h, up),
        ("mlp_act", "act", 0.0, float(t * inter * (3 if model.gated_mlp else 2) * b)),
        gemm("mlp_down_proj", inter, h),
        ("add", "add", 0.0, 3.0 * t * h * b),
    ]
    if model.gated_mlp:  # Llama-style rotary embeddings; OPT has learned positions
        ops.insert(2, ("attn_rope", "rope", 0.0, 2.0 * t * (q + kv) * b))
    return ops


def op_ms(gpu: GPUSpec, eff: Efficiency, kind: str, flops: float, nbytes: float) -> float:
    return gemm_ms(gpu, eff, flops, nbytes) if kind == "gemm" else elementwise_ms(gpu, eff, kind, nbytes)


def linear_layer_ms(gpu: GPUSpec, model: ModelSpec, tp: int, tokens: int, eff: Efficiency) -> float:
    """All linear work of one layer: the ops above, a second residual add, and the KV write."""
    total = sum(op_ms(gpu, eff, kind, f, nb) for _, kind, f, nb in linear_ops(model, tp, tokens))
    kv = max(1, model.num_kv_heads // tp) * model.head_dim
    total += elementwise_ms(gpu, eff, "add", 3.0 * tokens * model.hidden_size * model.dtype_bytes)
    total += elementwise_ms(gpu, eff, "add", 2.0 * 2 * tokens * kv * model.dtype_bytes)  # cache write
    return total


def prefill_attention_ms(
    gpu: GPUSpec, model: ModelSpec, tp: int, chunk: int, context: int, eff: Efficiency
) -> float:
    """Causal attention of a `chunk` of new tokens over `context` prior tokens plus itself."""
    heads, kv_heads = model.num_attention_heads // tp, max(1, model.num_kv_heads // tp)
    d, b = model.head_dim, model.dtype_bytes
    attended = chunk * (context + (chunk + 1) / 2)  # query-key pairs under the causal mask
    flops = 4.0 * attended * heads * d
    nbytes = (2.0 * (context + chunk) * kv_heads + 2.0 * chunk * heads) * d * b
    return gemm_ms(gpu, eff, flops, nbytes)


def decode_attention_ms(
    gpu: GPUSpec, model: ModelSpec, tp: int, batch: int, context: float, block_size: int,
    eff: Efficiency,
) -> float:
    """Paged decode: each sequence reads its whole blocks, so the block size enters only
    through the last, partly filled block (context rounded up to a multiple of block_size)."""
    heads, kv_heads = model.num_attention_heads // tp, max(1, model.num_kv_heads // tp)
    d, b = model.head_dim, model.dtype_bytes
    read_tokens = math.ceil(context / block_size) * block_size
    flops = 4.0 * batch * context * heads * d
    nbytes = batch * (2.0 * read_tokens * kv_heads + 2.0 * heads) * d * b + batch * 4 * math.ceil(context / block_size)
    return gemm_ms(gpu, eff, flops, nbytes)


def allreduce_ms(gpu: GPUSpec, tp: int, nbytes: float) -> float:
    """Ring all-reduce: 2 (tp-1)/tp of the buffer crosses each link, plus a fixed latency."""
    if tp <= 1:
        return 0.0
    return ALLREDUCE_LATENCY_MS + 1e3 * 2.0 * (tp - 1) / tp * nbytes / (gpu.interconnect_gbps * 1e9)


def collective_ms(gpu: GPUSpec, model: ModelSpec, tp: int, tokens: int) -> float:
    """One layer's two all-reduces (after attention and after the MLP)."""
    return 2.0 * allreduce_ms(gpu, tp, tokens * model.hidden_size * model.dtype_bytes)


def lm_head_ms(gpu: GPUSpec, model: ModelSpec, tp: int, seqs: int, eff: Efficiency) -> float:
    """Final norm, vocab-sharded LM head, logits gather and sampling, for the whole model."""
    h, v, b = model.hidden_size, model.vocab_size, model.dtype_bytes
    vs = math.ceil(v / tp)
    total = elementwise_ms(gpu, eff, "norm", 2.0 * seqs * h * b)
    total += gemm_ms(gpu, eff, 2.0 * seqs * h * vs, float(h * vs + seqs * h + seqs * vs) * b)
    total += allreduce_ms(gpu, tp, seqs * vs * 4) / 2 if tp > 1 else 0.0  # all-gather ~ half
    total += SAMPLING_KERNELS * eff.elementwise_floor_ms
    total += 1e3 * SAMPLING_PASSES * seqs * v * 4 / (gpu.hbm_tbps * 1e12 * eff.elementwise["act"])
    return total


def step_overhead_by_policy(model: ModelSpec) -> dict[str, float]:
    return {p: round(base + per_layer * model.num_layers, 3) for p, (base, per_layer) in OVERHEAD_MS.items()}


def _r(x: float) -> float:
    return float(f"{x:.4g}")


def build_roofline_profile(
    gpu: GPUSpec,
    model: ModelSpec,
    tp: int,
    block_sizes: tuple[int, ...] = (8, 16, 32),
    efficiency: Efficiency | None = None,
) -> dict[str, Any]:
    """A schema-v1 profile document priced from the datasheet and the fitted efficiencies."""
    eff = efficiency or load_efficiency()
    overhead = step_overhead_by_policy(model)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "source": "roofline",
        "gpu": gpu.name,
        "model": model.name,
        "tensor_parallel_size": tp,
        "dtype": "bfloat16" if model.dtype_bytes == 2 else "float32",
        "model_shape": model.to_dict(),
        "step_overhead_ms": overhead["continuous"],
        "step_overhead_ms_by_policy": overhead,
        "linear": {
            "num_tokens": NUM_TOKENS,
            "time_ms": [_r(linear_layer_ms(gpu, model, tp, t, eff)) for t in NUM_TOKENS],
        },
        "prefill_attention": {
            "chunk_tokens": CHUNK_TOKENS,
            "context_tokens": PREFILL_CONTEXT,
            "time_ms": [
                [_r(prefill_attention_ms(gpu, model, tp, c, p, eff)) for p in PREFILL_CONTEXT]
                for c in CHUNK_TOKENS
            ],
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
            "allreduce_latency_ms": ALLREDUCE_LATENCY_MS,
            "collective": "priced from interconnect bandwidth (not measured)" if tp > 1 else "none (tp 1)",
        },
    }
    if tp > 1:
        doc["collective"] = {
            "num_tokens": NUM_TOKENS,
            "time_ms": [_r(collective_ms(gpu, model, tp, t)) for t in NUM_TOKENS],
        }
    return doc
