"""One transformer layer's linear work for the harness (imports torch; import only when profiling):
dense GEMMs in the model dtype, FP8 GEMMs through `torch._scaled_mm`, and an MoE layer's experts.

FP8 (`--quantization fp8`) follows vLLM's Fp8LinearMethod / Fp8MoEMethod with per-tensor scales:
each weight matrix (each expert's, for MoE) is stored in float8_e4m3fn with one scale; each GEMM
input is quantized on the fly with one dynamic per-tensor scale (max |x| / 448, vLLM's
`scaled_fp8_quant` without a static input scale), and the product comes back in the model dtype.
The quantization pass is inside the timed layer, as it is on the GPU. `torch._scaled_mm` needs FP8
tensor cores on CUDA: compute capability >= 8.9 (Ada, Hopper); `fp8_support` says why not otherwise.

MoE: the router GEMM (model dtype, as vLLM leaves the gate unquantized), softmax + top-k, then the
experts grouped per expert: tokens gathered in expert order, each expert's gate/up GEMM, SiLU x up,
down GEMM on its own rows, scaled by the routing weight and summed back per token. How many tokens
each expert gets is the roofline's load assumption, not the random router's pick: T tokens x top-k
land on round(E (1 - (1 - k/E)^T)) distinct experts (uniform routing, `profiles.roofline.experts_touched`),
split as evenly as integers allow (`moe_token_counts`). The experts run as a loop of torch GEMMs,
not vLLM's fused Triton kernel, and no rows are padded; the profile's provenance says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kvsim.simcore.specs import ModelSpec

E4M3_MAX = 448.0  # largest finite float8_e4m3fn value
FP8_MIN_CAPABILITY = (8, 9)  # CUDA compute capability with FP8 tensor cores (Ada 8.9, Hopper 9.0)


def fp8_support(device: str) -> str | None:
    """None when FP8 GEMMs can be measured on `device`, else a sentence saying why not."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn"
    if device != "cuda":
        return (f"--device {device} has no FP8 tensor cores; FP8 GEMMs are measured on a CUDA GPU of compute "
                f"capability >= {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} (Ada, Hopper)")
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < FP8_MIN_CAPABILITY:
        return (f"{torch.cuda.get_device_name(0)} is compute capability {major}.{minor}; FP8 GEMMs "
                f"(torch._scaled_mm) need >= {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} (Ada, Hopper)")
    return None


def _scale(t: torch.Tensor) -> torch.Tensor:
    return (t.abs().max().float() / E4M3_MAX).clamp(min=1e-12)


def make_gemm(fp8: bool, out_dtype: torch.dtype) -> Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """make(weight [n, k]) -> (x [t, k] -> x @ weight.T [t, n]): in the model dtype, or FP8 with
    per-tensor scales (the weight quantized once here, the input at every call)."""
    if not fp8:
        return lambda w: (lambda x: x @ w.T)
    e4m3 = torch.float8_e4m3fn

    def make(w: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        w_scale = _scale(w)
        wq = (w / w_scale).to(e4m3)  # [n, k] row-major: wq.t() is the column-major operand cuBLASLt wants

        def gemm(x: torch.Tensor) -> torch.Tensor:
            x_scale = _scale(x)
            xq = (x / x_scale).clamp(-E4M3_MAX, E4M3_MAX).to(e4m3)
            return torch._scaled_mm(xq, wq.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=out_dtype)

        return gemm

    return make


def shards(model: ModelSpec, tp: int) -> tuple[int, int, int, int]:
    """(heads, kv heads, dense MLP width, head dim) on one GPU of a TP group."""
    heads = model.num_attention_heads // tp
    kv_heads = max(1, model.num_kv_heads // tp)
    return heads, kv_heads, model.intermediate_size // tp, model.head_dim


def moe_token_counts(num_tokens: int, num_experts: int, top_k: int) -> list[int]:
    """Tokens routed to each touched expert under the roofline's uniform-routing assumption."""
    from kvsim.profiles.roofline import experts_touched

    assignments = num_tokens * top_k
    touched = min(num_experts, assignments, max(top_k, round(experts_touched(num_tokens, num_experts, top_k))))
    base, extra = divmod(assignments, touched)
    return [base + (1 if e < extra else 0) for e in range(touched)]


def moe_topk_ids(num_tokens: int, num_experts: int, top_k: int) -> torch.Tensor:
    """[T, k] expert ids with `moe_token_counts` per expert and k distinct experts per token:
    assignment a = token * k + slot goes to expert a mod touched."""
    touched = len(moe_token_counts(num_tokens, num_experts, top_k))
    return (torch.arange(num_tokens * top_k) % touched).view(num_tokens, top_k)


def _moe_mlp(model: ModelSpec, tp: int, tokens: int, dtype, device: str, w, gemm_of) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MoE MLP on one GPU: router, top-k, experts grouped per expert, shared experts."""
    h, e, k = model.hidden_size, model.num_experts, model.num_experts_per_tok
    inter = model.moe_intermediate_size // tp
    w_router = w(e, h)
    ups = [gemm_of(w(2 * inter, h)) for _ in range(e)]  # every expert is resident, as on the GPU
    downs = [gemm_of(w(h, inter)) for _ in range(e)]
    ids = moe_topk_ids(tokens, e, k).flatten()
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=e).tolist()
    bounds = [(i, lo, lo + n) for i, (lo, n) in enumerate(zip([sum(counts[:j]) for j in range(e)], counts,
                                                                strict=True)) if n]
    order_d, token_of = order.to(device), (order // k).to(device)
    shared = model.shared_expert_intermediate_size // tp
    shared_up = gemm_of(w(2 * shared, h)) if shared else None
    shared_down = gemm_of(w(h, shared)) if shared else None

    def run(x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax((x @ w_router.T).float(), dim=-1)
        topk_w, _ = torch.topk(probs, k, dim=-1)  # the router's own pick is computed, dispatch follows `ids`
        rows = x[token_of]
        out = torch.empty_like(rows)
        for i, lo, hi in bounds:
            g, u = ups[i](rows[lo:hi]).chunk(2, dim=-1)
            out[lo:hi] = downs[i](F.silu(g) * u)
        out = out * topk_w.flatten()[order_d].to(out.dtype)[:, None]
        y = torch.zeros_like(x).index_add_(0, token_of, out)
        if shared_up is not None:
            g, u = shared_up(x).chunk(2, dim=-1)
            y = y + shared_down(F.silu(g) * u)
        return y

    return run


def linear_layer(torch_mod, model: ModelSpec, tp: int, tokens: int, dtype, device: str, gen, layout_gen) -> Callable[[], Any]:
    """One layer's linear work at the TP-sharded shape: norms, QKV, rope, out-proj, residual
    adds, the MLP (dense, or the MoE router and experts), and the KV-cache write; GEMMs in FP8
    when the model is quantized (`--quantization fp8`)."""
    heads, kv_heads, inter, d = shards(model, tp)
    h = model.hidden_size
    gemm_of = make_gemm(model.quantization == "fp8", dtype)

    def w(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype) * 0.02

    x, res = w(tokens, h), w(tokens, h)
    qkv_proj, o_proj = gemm_of(w((heads + 2 * kv_heads) * d, h)), gemm_of(w(h, heads * d))
    if model.is_moe:
        mlp = _moe_mlp(model, tp, tokens, dtype, device, w, gemm_of)
    else:
        up_proj = gemm_of(w((2 if model.gated_mlp else 1) * inter, h))
        down_proj = gemm_of(w(h, inter))

        def mlp(y2):
            up = up_proj(y2)
            if model.gated_mlp:
                g, u = up.chunk(2, dim=-1)
                return down_proj(F.silu(g) * u)
            return down_proj(F.relu(up))
    norm_w = torch.ones(h, device=device, dtype=dtype)
    cos, sin = w(tokens, 1, d // 2), w(tokens, 1, d // 2)
    cache = torch.zeros((tokens + 16, 2, kv_heads, d), device=device, dtype=dtype)
    slots = torch.randperm(tokens + 16, generator=layout_gen)[:tokens].to(device)

    def rope(t):
        a, b = t[..., : d // 2], t[..., d // 2:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    def run():
        y = F.rms_norm(x + res, (h,), norm_w, 1e-5)
        qkv = qkv_proj(y)
        q, k, v = qkv.split((heads * d, kv_heads * d, kv_heads * d), dim=-1)
        if model.gated_mlp:
            q, k = rope(q.view(tokens, heads, d)), rope(k.view(tokens, kv_heads, d))
        cache[slots, 0] = k.reshape(tokens, kv_heads, d)
        cache[slots, 1] = v.reshape(tokens, kv_heads, d)
        o = o_proj(q.reshape(tokens, heads * d))
        y2 = F.rms_norm(o + y, (h,), norm_w, 1e-5)
        return mlp(y2) + y2

    return run
