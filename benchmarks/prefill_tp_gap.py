"""Where issue 27's prefill gap at TP 2 / 4 / 8 is not: the terms that do not shrink with TP, sized.

Issue 27 (second round) measured kvsim's prefill cost per prompt token x1.18 / 1.51 / 1.93 too low
for Llama-2-70B on H100 at TP 2 / 4 / 8, with the linear kernels within 3% of measured operator
timings. This prints kvsim's per-token prefill cost and its parts (GEMM-like kernels, attention,
collectives, host) at large batches, the gap those ratios imply in microseconds per token, and the
size of every TP-invariant term vLLM runs that the roofline does not price yet:

* the vocab-parallel embedding's all-reduce: one all-reduce of tokens x hidden per step on top of
  the two per layer (vllm/model_executor/layers/vocab_parallel_embedding.py, VocabParallelEmbedding
  .forward: masked lookup, then tensor_model_parallel_all_reduce), priced from the same measured
  NCCL table at the same message size;
* the embedding lookup (read one row per token, write tokens x hidden) and the final RMSNorm, which
  LlamaModel.forward applies to every token's hidden state before the logits pick the last ones
  (kvsim's lm_head table prices it per sampled sequence): elementwise passes priced at the fitted
  norm efficiency;
* rotary embedding, per-layer RMSNorms and residual adds are already priced over the full hidden
  size on every rank (profiles/roofline.py linear_ops), so they are not listed.

The ratios are the issue's; nothing is fitted to them: they only size the gap the terms are
compared with.

    python benchmarks/prefill_tp_gap.py
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.profiles.roofline import elementwise_ms, load_efficiency
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.latency import StepLatencyModel

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
ISSUE_RATIO = {2: 1.18, 4: 1.51, 8: 1.93}  # measured / kvsim prefill cost per token (issue 27)
SHAPES = ((8, 512), (16, 1024), (4, 2048))  # (prompts, tokens each): large-batch prefill steps


def main() -> None:
    gpu, model, eff = GPUS["H100-SXM-80GB"], MODELS["llama2-70b"], load_efficiency()
    h, b = model.hidden_size, model.dtype_bytes
    print("tp  kvsim us/token (gemm + attn + coll + host)   gap us/token   gap/((tp-1)/tp)   "
          "missing TP-invariant terms us/token (embed AR, embed, final norm) = share of gap")
    for tp, ratio in ISSUE_RATIO.items():
        m = StepLatencyModel(json.loads((PROFILES / f"{gpu.name}-{model.name}-tp{tp}.json").read_text()))
        parts, tokens = [0.0] * 4, 0
        for n, length in SHAPES:
            t = n * length
            for i, v in enumerate(m.step_parts_ms(t, [(length, 0)] * n, 0, 0, n)):
                parts[i] += v
            tokens += t
        per = [1e3 * p / tokens for p in parts]  # us per token
        total = sum(per)
        gap = (ratio - 1) * total
        t = 16384  # a 16k-token step: the messages of the shapes above
        embed_ar = 1e3 * m.all_reduce(t * h * b) / t
        embed = 1e3 * elementwise_ms(gpu, eff, "add", 2.0 * t * h * b) / t
        final_norm = 1e3 * elementwise_ms(gpu, eff, "norm", 2.0 * t * h * b) / t
        missing = embed_ar + embed + final_norm
        print(f"{tp:>2}  {total:6.1f} ({per[0]:5.1f} + {per[1]:4.1f} + {per[2]:4.1f} + {per[3]:4.2f})"
              f"          {gap:6.1f}         {gap / ((tp - 1) / tp):6.1f}          "
              f"{embed_ar:.3f} + {embed:.3f} + {final_norm:.3f} = {missing:.3f} ({100 * missing / gap:.2f}%)")
    print("The gap per token scales as (tp-1)/tp (the last-but-one column is nearly constant): the "
          "signature of ring all-reduce traffic, 2(n-1)/n x bytes per rank; the priced all-reduce "
          "itself is the 'coll' part.")


if __name__ == "__main__":
    main()
