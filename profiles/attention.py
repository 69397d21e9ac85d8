"""Which prefill attention kernel each vLLM version ran, and how fast it is next to the roofline's.

The roofline prices prefill attention with FlashAttention-3's measured H100 curve (profiles/roofline.py
FLASH_ATTENTION). vLLM runs FA3 on compute capability 9.0 (Hopper) only since vllm-project/vllm PR
#12093 (vLLM 0.7, January 2025: "if hopper default to FA3, otherwise stick to FA2"); vLLM 0.5 / 0.6
ran FlashAttention-2 there (vllm-flash-attn's `flash_attn_varlen_func`). On other GPUs every version
runs FA2 and the profile's one curve stands for all of them.

FA2's curve is FA3's times FA2's throughput over FA3's as both were measured side by side, on the same
H100 SXM5 at a locked 1830 MHz, in the FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608,
Fig. 5: forward, BF16, batch x seqlen = 16k tokens, hidden 2048; the bar labels are in
github.com/Dao-AILab/flash-attention assets/flash3_fp16_fwd.png, commit 7ef24848). The causal panels
are used (a prompt's own attention is causal): at head dim 128 FA2 reaches 0.654 of FA3 at 512 keys
and 0.544 at 16k. The non-causal panel at head dim 128 gives ratios within 0.03 of those
(FA3_PAPER_FIG5_NONCAUSAL, for tests), so the same ratio serves a chunk over cached context.
The ratio is interpolated linearly in log2(keys) between the measured lengths and held at the ends;
the head dim is the measured one nearest in log2 (64, 128, 256). Nothing here is fitted.
"""

from __future__ import annotations

import math

from kvsim.simcore.batch_defaults import HOPPER_PREFIXES  # where 0.5 / 0.6 and 0.7+ ran different kernels
from kvsim.simcore.specs import GPUSpec, ModelSpec

# The prefill backend each vLLM version ran on Hopper; the profile's base table is FA3's.
PREFILL_BACKEND_ON_HOPPER = {"vllm-v0": "FlashAttention-2", "vllm-0.6": "FlashAttention-2",
                             "vllm-v1": "FlashAttention-3", "vllm-v1-async": "FlashAttention-3"}
BASE_BACKEND = "FlashAttention-3"
FIG5_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# FA-3 paper Fig. 5 (b), (d), (f): forward with causal mask, TFLOP/s; head dim -> (FA2, FA3).
FA3_PAPER_FIG5_CAUSAL = {
    64: ((180, 229, 262, 284, 295, 299), (197, 265, 371, 420, 460, 473)),
    128: ((191, 260, 298, 319, 333, 335), (292, 423, 521, 579, 602, 616)),
    256: ((208, 251, 278, 293, 297, 298), (286, 427, 537, 612, 628, 642)),
}
# Fig. 5 (c): head dim 128 without the mask (a cross-check of the ratio, not priced).
FA3_PAPER_FIG5_NONCAUSAL = {128: ((309, 350, 362, 368, 370, 370), (467, 565, 625, 638, 646, 648))}


def is_hopper(gpu: GPUSpec | str) -> bool:
    name = gpu if isinstance(gpu, str) else gpu.name
    return name.startswith(HOPPER_PREFIXES)


def prefill_head_dim(model: ModelSpec) -> int:
    """The query-key width of a prefill attention head (MLA: nope + rope)."""
    return model.qk_nope_head_dim + model.qk_rope_head_dim if model.is_mla else model.head_dim


def fa2_over_fa3(keys: float, head_dim: int) -> float:
    """FA2's forward throughput over FA3's on the H100 at `keys` key tokens (Fig. 5, causal)."""
    dim = min(FA3_PAPER_FIG5_CAUSAL, key=lambda d: (abs(math.log2(d) - math.log2(max(head_dim, 1))), d))
    fa2, fa3 = FA3_PAPER_FIG5_CAUSAL[dim]
    ratios = [a / b for a, b in zip(fa2, fa3, strict=True)]
    x = math.log2(min(max(keys, FIG5_SEQLENS[0]), FIG5_SEQLENS[-1]))
    xs = [math.log2(s) for s in FIG5_SEQLENS]
    i = min(max(0, next(k for k in range(len(xs)) if xs[k] >= x) - 1), len(xs) - 2)
    t = (x - xs[i]) / (xs[i + 1] - xs[i])
    return ratios[i] + t * (ratios[i + 1] - ratios[i])


def prefill_attention_by_engine(gpu: GPUSpec, model: ModelSpec, chunks: list[int], contexts: list[int],
                                rnd=float) -> dict:
    """The profile's `prefill_attention_by_engine`: for each vLLM version whose prefill backend on
    this GPU is not the base table's, its backend and a time_scale per (chunk, context) cell that
    multiplies the base table (FA3 time / FA2 time's reciprocal at keys = context + chunk). Empty
    off Hopper."""
    if not is_hopper(gpu):
        return {}
    dim = prefill_head_dim(model)
    out = {}
    for version, backend in PREFILL_BACKEND_ON_HOPPER.items():
        if backend == BASE_BACKEND:
            continue
        scale = [[rnd(1.0 / fa2_over_fa3(c + p, dim)) for p in contexts] for c in chunks]
        out[version] = {"backend": backend, "time_scale": scale}
    return out
