"""vLLM V1's symmetric-memory all-reduce on Hopper: where vLLM uses it, and its per-call price.

Since v0.11.0 (vllm-project/vllm PR #24111, "Enable Torch Symmetric Memory All-Reduce By Default";
issue #26525: "v0.11.0 New default VLLM_ALLREDUCE_USE_SYMM_MEM=1", not so in v0.10.2) a TP group's
`CudaCommunicator` builds a `SymmMemCommunicator` next to the custom all-reduce, and when it is
enabled caps the custom kernel per compute capability and world size; `all_reduce` then tries the
custom kernel (`should_custom_ar`: bytes < its max_size), then symmetric memory
(`should_use_symm_mem`: bfloat16, bytes a multiple of 4, bytes <= its max_size), then NCCL
(vllm/distributed/device_communicators/cuda_communicator.py, custom_all_reduce.py and
all_reduce_utils.py at 00d618aab60448acdf3fac3e9c4e2e22d0c6c753). On compute capability 9.0
(H100 / H200):

    world size                   2          4          6          8
    custom kernel below          8 MiB      8 MiB      512 KiB    256 KiB   min(CUSTOM_ALL_REDUCE_MAX_SIZES, 8 MiB)
    symmetric memory up to       64 MiB     32 MiB     64 MiB     64 MiB    SYMM_MEM_ALL_REDUCE_MAX_SIZES
    symmetric-memory kernel      two-shot   multimem   multimem   multimem  SymmMemCommunicator._WORLD_SIZES_MULTIMEM

(`_WORLD_SIZES_MULTIMEM = {"9.0": [4, 6, 8], ...}` in symm_mem.py, vllm-project/vllm
00859a52088e757514a25dddd0214ccc89898a1c and every stored version seen; PR #20759's "6 and 8" text
predates it.) The communicator needs multicast (`handle.multicast_ptr != 0`: NVSwitch / NVLS), so
NVSwitch Hopper boards only (H100 SXM, H200; not H100 PCIe). Earlier versions (`vllm-v0`, `vllm-0.6`
and V1 before 0.11) had no such path: custom below 8 MiB, NCCL above (profiles/custom_allreduce.py).

Price: multimem all-reduce per call on an 8x H100 DGX from TokenWeave's artifact (Gond, Kwatra,
Ramjee, arXiv 2505.11329; github.com/microsoft/tokenweave f483d1c431f55734f38b1c039f3ca0e44f465d05,
`artifact/csvs/figure_5.csv`, column `multimem_ar_us`, made by `artifact/figure_5_6_7/bench.py`):
tokens x 8192 bf16 = 1-64 MiB, CUDA events, L2 flushed between calls, median of 100. It times the
NVLS multimem kernel in place on the symmetric buffer (TokenWeave's own `multimem_all_reduce`, the
same multimem.ld_reduce / multimem.st scheme as PyTorch's `multimem_all_reduce_`); vLLM's
`SymmMemCommunicator.all_reduce` also copies the input into that buffer and the result out, which
this price does not include. H200 (same NVLink 4 / NVSwitch) carries it as it is. Between the custom
kernel's cap and the first timing (256 KiB-1 MiB at TP 8) no multimem timing is at hand: the table
runs from the custom kernel's price at 256 KiB to multimem's at 1 MiB, log-log as kvsim reads every
table. No TP 2 / 4 / 6 timings of the symmetric-memory path above the custom cap were found, so those
sizes keep the profile's NCCL price there (the profile says so).
"""

from __future__ import annotations

import numpy as np

from kvsim.profiles import custom_allreduce
from kvsim.simcore.specs import GPUSpec

KIB, MIB = 1024, 1024 * 1024
VERSIONS = ("vllm-v1", "vllm-v1-async")  # V1 since 0.11.0 (PR #24111); vllm-v1-async is 0.14.0+
HOPPER_NVSWITCH_GPUS = ("H100-SXM-80GB", "H200-141GB")  # compute capability 9.0 on NVSwitch (multicast)
# all_reduce_utils.py at 00d618a, "9.0" rows: world size -> bytes
CUSTOM_ALL_REDUCE_MAX_SIZES_SM90 = {2: 64 * MIB, 4: 32 * MIB, 6: MIB // 2, 8: MIB // 4}
SYMM_MEM_ALL_REDUCE_MAX_SIZES_SM90 = {2: 64 * MIB, 4: 32 * MIB, 6: 64 * MIB, 8: 64 * MIB}
MULTIMEM_WORLD_SIZES_SM90 = (4, 6, 8)  # symm_mem.py _WORLD_SIZES_MULTIMEM["9.0"]; two-shot otherwise
# TokenWeave figure_5.csv (8 GPUs, hidden 8192, bf16): tokens -> multimem_ar_us, up to vLLM's 64 MiB cap
TOKENWEAVE_FIG5_HIDDEN = 8192
TOKENWEAVE_FIG5_MULTIMEM_US = {8: {64: 16.512, 128: 20.000, 256: 28.416, 512: 43.776, 1024: 75.136,
                                   2048: 135.744, 4096: 257.248}}
SOURCE = ("NVLS multimem all-reduce (the scheme of PyTorch's multimem_all_reduce_), 8x H100 DGX per-call "
          "times from TokenWeave (microsoft/tokenweave f483d1c, artifact/csvs/figure_5.csv multimem_ar_us; "
          "kernel in place, vLLM's copy into and out of the symmetric buffer not included)")
EDGE = 16.0  # bytes: the table's step between two kernels (custom_allreduce's MAX_BYTES - 16 likewise)


def uses_symm_mem(gpu: GPUSpec, tp: int) -> bool:
    """Whether vLLM V1 (0.11+) runs some TP `tp` all-reduces on this GPU through symmetric memory."""
    return (gpu.name in HOPPER_NVSWITCH_GPUS and tp in SYMM_MEM_ALL_REDUCE_MAX_SIZES_SM90
            and custom_allreduce.eligible(gpu, tp))


def priced(gpu: GPUSpec, tp: int) -> bool:
    """Whether a profile prices that path (cited timings at this TP)."""
    return uses_symm_mem(gpu, tp) and tp in TOKENWEAVE_FIG5_MULTIMEM_US


def dispatch(tp: int) -> list[dict]:
    """Which all-reduce vLLM V1 runs at each message size on an NVSwitch Hopper host, in order."""
    custom = min(CUSTOM_ALL_REDUCE_MAX_SIZES_SM90[tp], custom_allreduce.MAX_BYTES)
    kernel = "multimem_all_reduce_" if tp in MULTIMEM_WORLD_SIZES_SM90 else "two_shot_all_reduce_"
    return [{"below_bytes": custom, "all_reduce": "vLLM custom all-reduce"},
            {"up_to_bytes": SYMM_MEM_ALL_REDUCE_MAX_SIZES_SM90[tp],
             "all_reduce": f"PyTorch symmetric memory ({kernel})"},
            {"all_reduce": "NCCL"}]


def _at(table: dict, nbytes: float) -> float:
    """`table` read at `nbytes`, log-log between its points as kvsim interpolates it."""
    lb, lt = np.log(np.array(table["bytes"], float)), np.log(np.array(table["time_ms"], float))
    return float(np.exp(np.interp(np.log(nbytes), lb, lt)))


def version_table(tp: int, base: dict) -> dict:
    """The all-reduce table vLLM V1 pays at TP `tp`: `base` (custom kernel, then NCCL) below the
    custom cap and above symmetric memory's, the multimem timings between."""
    custom, top = min(CUSTOM_ALL_REDUCE_MAX_SIZES_SM90[tp], custom_allreduce.MAX_BYTES), SYMM_MEM_ALL_REDUCE_MAX_SIZES_SM90[tp]
    mm = [(t * TOKENWEAVE_FIG5_HIDDEN * 2.0, us / 1e3) for t, us in TOKENWEAVE_FIG5_MULTIMEM_US[tp].items()]
    pts = [(b, t) for b, t in zip(base["bytes"], base["time_ms"], strict=True) if b < custom]
    pts += [(float(custom), _at(base, custom))] + [p for p in mm if custom < p[0] <= top]
    pts += [(top + EDGE, _at(base, top + EDGE))]
    pts += [(b, t) for b, t in zip(base["bytes"], base["time_ms"], strict=True) if b > top + EDGE]
    return {"bytes": [round(b) for b, _ in pts], "time_ms": [round(t, 5) for _, t in pts]}


def all_reduce_by_engine(gpu: GPUSpec, tp: int, base: dict) -> dict:
    """The profile's `collectives.all_reduce_by_engine`: per V1 version, which all-reduce each size
    uses and, where timings exist, the table it is priced from (else `base` stands, said so)."""
    if not uses_symm_mem(gpu, tp):
        return {}
    entry: dict = {"dispatch": dispatch(tp)}
    if priced(gpu, tp):
        table = version_table(tp, base)
        lo = dispatch(tp)[0]["below_bytes"]
        entry.update(table)
        entry["source"] = (f"vLLM >= 0.11 on {gpu.name} at TP {tp}: custom kernel below {lo // KIB} KiB (profile's "
                           f"table), symmetric memory to {SYMM_MEM_ALL_REDUCE_MAX_SIZES_SM90[tp] // MIB} MiB: "
                           f"{SOURCE}, measured 1-64 MiB, joined to the custom price at {lo // KIB} KiB; NCCL above")
    else:
        entry["source"] = (f"vLLM >= 0.11 on {gpu.name} at TP {tp} uses symmetric memory "
                           f"{dispatch(tp)[0]['below_bytes'] // KIB} KiB-{SYMM_MEM_ALL_REDUCE_MAX_SIZES_SM90[tp] // MIB} "
                           "MiB; no cited timing at this TP: priced from the profile's all_reduce table (not modelled)")
    return {version: dict(entry) for version in VERSIONS}


def missing_note(profile: dict, gpu: GPUSpec, tp: int, engine_version: str) -> str | None:
    """What a run says when its profile has no symmetric-memory table where vLLM V1 would use one
    and a profile generated now prices it (one generated before this module): None elsewhere."""
    coll = profile.get("collectives")
    if engine_version not in VERSIONS or not priced(gpu, tp) or not isinstance(coll, dict):
        return None
    if "all_reduce" not in coll or "all_reduce_by_engine" in coll:
        return None
    lo, hi = dispatch(tp)[0]["below_bytes"], SYMM_MEM_ALL_REDUCE_MAX_SIZES_SM90[tp]
    return (f"vLLM >= 0.11 runs {lo // KIB} KiB-{hi // MIB} MiB all-reduces on {gpu.name} at TP {tp} through "
            "symmetric memory; this profile has no table for it (generated before profiles/symm_mem_allreduce.py): "
            "custom / NCCL prices there, an upper bound (not modelled)")
