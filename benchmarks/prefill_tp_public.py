"""kvsim's TP 4 / TP 8 prefill and all-reduce prices against an independent public H100 measurement.

Issue 27's prefill gap (kvsim's per-token prefill cost x1.18 / 1.51 / 1.93 too low at TP 2 / 4 / 8,
growing as (tp-1)/tp) looks like all-reduce traffic running at ~80 GB/s bus bandwidth in the
forward pass, ~3.4x slower than the isolated NCCL measurement kvsim prices. This checks that
reading against TokenWeave's published artifact (Gond, Kwatra, Ramjee, "TokenWeave: Efficient
Compute-Communication Overlap for Distributed LLM Inference", arXiv 2505.11329, MLSys 2026;
github.com/microsoft/tokenweave at f483d1c431f55734f38b1c039f3ca0e44f465d05, MIT licence), measured
on an 8x H100 DGX (NVSwitch):

* `artifact/csvs/figure_11a.csv` (8 GPUs) and `figure_11b.csv` (4 GPUs): Llama-3.3-70B, one prompt
  of 1k..64k tokens, one output token, through vLLM V1 (their fork of vLLM 87aaade, the 0.8.5 era;
  `artifact/figure_2_11/run.sh`: VLLM_USE_V1=1, batch 1, --output-len 1, --enforce-eager,
  chunked prefill with --max-num-batched-tokens 65536 so the prompt is one step, clocks locked,
  mean of 30 runs): ms per request for `baseline_multimem` (vLLM with PyTorch's NVLS multimem
  all-reduce) and `no_ar` (the same model with every all-reduce removed);
* `artifact/csvs/figure_5.csv`: one isolated all-reduce of tokens x 8192 bf16 on 8 GPUs, CUDA events,
  L2 flushed between calls, median of 100: `pytorch_dist_ar_us` (torch.distributed = NCCL) and
  `multimem_ar_us`.

kvsim's llama3-70b H100 profiles price the same one-step request as vllm-v1 (V1 since 0.11 sends
256 KiB-64 MiB all-reduces at TP 8 through PyTorch's symmetric-memory multimem kernel, priced from
this figure_5.csv's multimem column: profiles/symm_mem_allreduce.py; above 64 MiB, i.e. from 8,192
tokens, NCCL as in vLLM 0.11, not the multimem TokenWeave's baseline ran). Nothing here is fitted:
the published numbers only check kvsim.

    python benchmarks/prefill_tp_public.py
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.simcore.latency import StepLatencyModel

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
LAYERS = 80  # Llama-3.3-70B: 2 all-reduces per decoder layer -> 160 per forward
# figure_11a.csv / figure_11b.csv, Llama-3.3-70B-Instruct: prompt tokens -> (baseline_multimem, no_ar) ms
PREFILL_MS = {
    8: {1024: (53.661, 41.938), 2048: (94.227, 74.922), 4096: (179.483, 144.896), 8192: (356.023, 289.550),
        16384: (744.115, 610.219), 32768: (1639.863, 1371.359), 65536: (3917.741, 3338.340)},
    4: {1024: (82.166, 70.781), 2048: (150.607, 132.505), 4096: (295.198, 257.206), 8192: (609.612, 531.460),
        16384: (1288.280, 1130.387), 32768: (2880.842, 2546.314), 65536: (7063.837, 6333.144)},
}
# figure_5.csv, 8 GPUs, hidden 8192 bf16: tokens -> (torch.distributed NCCL, multimem) us per all-reduce
ALL_REDUCE_8_US = {64: (35.648, 16.512), 128: (55.520, 20.000), 256: (67.040, 28.416), 512: (94.496, 43.776),
                   1024: (137.216, 75.136), 2048: (219.456, 135.744), 4096: (348.064, 257.248),
                   8192: (646.240, 500.960), 16384: (1230.880, 985.984), 32768: (2405.184, 1956.928)}


def model(tp: int, engine_version: str = "vllm-v1") -> StepLatencyModel:
    """The profile priced as `engine_version` (vllm-v1, the default: V1's symmetric-memory all-reduce
    where the profile has it, profiles/symm_mem_allreduce.py)."""
    doc = json.loads((PROFILES / f"H100-SXM-80GB-llama3-70b-tp{tp}.json").read_text())
    return StepLatencyModel(doc, engine_version=engine_version)


def main() -> None:
    m8, m8_06 = model(8), model(8, "vllm-0.6")
    print("One all-reduce of tokens x 8192 bf16 on 8 H100s (us): kvsim's table as vllm-0.6 (vLLM's custom kernel below "
          "8 MiB, Vidur NCCL above, fit past 64 MiB) and as vllm-v1 (symmetric-memory multimem 256 KiB-64 MiB) vs "
          "TokenWeave's isolated NCCL and multimem")
    print("tokens    MiB  kvsim 0.6  kvsim v1    NCCL (0.6/NCCL)   multimem (v1/multimem)")
    for tokens, (nccl, mm) in ALL_REDUCE_8_US.items():
        nbytes = tokens * 8192 * 2
        k, v1 = 1e3 * m8_06.all_reduce(nbytes), 1e3 * m8.all_reduce(nbytes)
        print(f"{tokens:6d} {nbytes / 2**20:6.0f} {k:9.1f} {v1:9.1f} {nccl:7.1f}   ({k / nccl:.2f})      {mm:7.1f}"
              f"   ({v1 / mm:.2f})")
    print()
    print("One prompt, one output token, vLLM V1 eager (ms per request). kvsim = GEMM + attention + collectives + host;")
    print("'kvsim - coll' vs TokenWeave's no-all-reduce model; kvsim's collectives vs the in-forward all-reduce time")
    print("(baseline - no_ar) and, at TP 8, vs 160 isolated NCCL calls (what stock NCCL would add).")
    print("tp  tokens    kvsim  multimem   no_AR  kvsim-coll/no_AR  kvsim coll  in-forward AR  160 x NCCL")
    for tp, rows in PREFILL_MS.items():
        m = model(tp)
        for tokens, (base, no_ar) in rows.items():
            g, a, c, h = m.step_parts_ms(tokens, [(tokens, 0)], 0, 0, 1)
            total = g + a + c + h
            nccl = ALL_REDUCE_8_US.get(tokens, (None,))[0] if tp == 8 else None
            ring = f"{2 * LAYERS * nccl / 1e3:9.1f}" if nccl else "        -"
            print(f"{tp:2d} {tokens:7d} {total:8.1f} {base:8.1f} {no_ar:8.1f}        {(total - c) / no_ar:5.3f}"
                  f"       {c:7.1f}      {base - no_ar:7.1f}     {ring}")
    print("Per token at 2048 tokens, TP 4 / TP 8: kvsim "
          f"{1e3 * sum(model(4).step_parts_ms(2048, [(2048, 0)], 0, 0, 1)) / 2048:.1f} / "
          f"{1e3 * sum(m8.step_parts_ms(2048, [(2048, 0)], 0, 0, 1)) / 2048:.1f} us; TokenWeave multimem "
          f"{1e3 * PREFILL_MS[4][2048][0] / 2048:.1f} / {1e3 * PREFILL_MS[8][2048][0] / 2048:.1f} us, "
          f"with stock NCCL ~{1e3 * (PREFILL_MS[8][2048][1] + 0.16 * ALL_REDUCE_8_US[2048][0]) / 2048:.1f} us at TP 8.")


if __name__ == "__main__":
    main()
