"""vLLM's custom all-reduce: where vLLM uses it instead of NCCL, and its per-call price.

vLLM (every version kvsim's presets model, since PR #2192) sends a TP all-reduce through its own
one-shot / two-shot kernels over NVLink peer-to-peer memory when
  * the world size is 2, 4, 6 or 8 (`CustomAllreduce._SUPPORTED_WORLD_SIZES`),
  * the group is inside one host (`in_the_same_node_as`),
  * the GPUs are fully NVLink-connected (`is_fully_connected` / `full_nvlink`; world size 2 needs
    only P2P), and
  * the message is below `max_size` = 8 MiB (`CustomAllreduce(max_size=8192 * 1024)`; the test in
    `should_custom_ar` is `inp_size < self.max_size`)
(vllm-project/vllm, `vllm/distributed/device_communicators/custom_all_reduce.py` at v0.5.0 /
v0.6.0 and at 00d618a). It picks the custom kernel whenever it is eligible, faster than NCCL or not.
Since v0.11 (PR #24111, `VLLM_ALLREDUCE_USE_SYMM_MEM` on by default) Hopper at world size 8 caps it
at 256 KiB and hands 256 KiB-64 MiB to PyTorch symmetric-memory (multimem), Blackwell at 1-2 MiB
(`CUSTOM_ALL_REDUCE_MAX_SIZES`, `all_reduce_utils.py` at 00d618a): the V1 presets' own table for
that (`collectives.all_reduce_by_engine`) is profiles/symm_mem_allreduce.py's; this table stays the
one every other version pays.

Price: the `vllm` rows of sgl-project/sglang PR #2904 (H100 SXM, vLLM's kernel through
`vllm._custom_ops.all_reduce`, eager, float32 elements, host-timed over 5,000 back-to-back calls;
`sgl-kernel/tests/test_trt_reduce.py`, sglang 01fe99e). H100 / H200 (same NVLink 4) carry those
points as they are, 2 KiB-4 MiB; past 4 MiB a line latency + bytes / bandwidth through the three
points >= 1 MiB (the bandwidth-bound regime); below 2 KiB, and on other fully-connected GPUs, a
line through all six, its bandwidth scaled by the GPU's NVLink datasheet figure over the H100's
(the convention `profiles/collectives.py` uses for NCCL). Eager timings include the copy into the
registered buffer that CUDA-graph replay (decode) skips, so they are an upper bound there; at TP 4,
1-4 MiB they agree with PR #24111's CUDA-graph `ca_2stage` column within 15%.
"""

from __future__ import annotations

import numpy as np

from kvsim.simcore.specs import GPUSpec

MAX_BYTES = 8192 * 1024  # CustomAllreduce(max_size=8192 * 1024); custom when bytes < this
SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES
# Fully NVLink / NVSwitch-connected GPUs inside one host, and the largest TP group one host holds.
# HGX/DGX H100, H200, A100 (SXM4), B200 boards: 8 GPUs on NVSwitch. GB200 NVL72: a compute tray
# (one host) holds 4 GPUs, so TP 8 spans hosts and vLLM disables the custom kernel
# (`in_the_same_node_as`). Not here: H100 PCIe (NVLink bridges between pairs only; TP 2 would pass
# vLLM's P2P check, unpriced: no PCIe timings), L40S (no NVLink), MI300X / MI325X (vLLM's ROCm path
# has its own custom and quick all-reduce, `qr_comm`; no timings here).
FULLY_CONNECTED_HOST_GPUS = {"H100-SXM-80GB": 8, "H200-141GB": 8, "A100-80GB": 8, "A100-40GB": 8,
                             "B200-180GB": 8, "GB200-NVL72": 4}
H100_INTERCONNECT_GBPS = 450.0
# sgl-project/sglang PR #2904, "vllm" table: float32 elements -> per-call microseconds at TP 2 / 4 / 8
SGLANG_2904_ELEMENTS = (512, 4096, 32768, 262144, 524288, 1048576)
SGLANG_2904_US = {2: (9.5, 8.8, 8.7, 12.9, 17.7, 26.6),
                  4: (9.1, 8.5, 9.2, 20.6, 26.9, 40.2),
                  8: (10.1, 9.3, 11.8, 24.1, 30.4, 45.0)}
MEASURED_BYTES = tuple(4.0 * e for e in SGLANG_2904_ELEMENTS)
SOURCE = ("vLLM custom all-reduce below 8 MiB (vllm custom_all_reduce.py should_custom_ar, PR #2192): "
          "H100 per-call times from sgl-project/sglang PR #2904 (vllm rows, eager)")


def eligible(gpu: GPUSpec, tp: int) -> bool:
    """Whether vLLM runs TP `tp` all-reduces on this GPU through its custom kernel (below MAX_BYTES)."""
    return tp in SUPPORTED_WORLD_SIZES and tp <= FULLY_CONNECTED_HOST_GPUS.get(gpu.name, 0)


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(latency_ms, bytes per ms) minimising relative error of latency + bytes / bandwidth."""
    x = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    a = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    (lat, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
    return float(lat), float(1.0 / inv_bw)


def _points(tp: int) -> tuple[int, list[tuple[float, float]]]:
    """(measured world size used, [(bytes, ms)]): the nearest of 2 / 4 / 8 (6 -> 4 or 8: 8)."""
    n = min(SGLANG_2904_US, key=lambda k: (abs(k - tp), -k))
    return n, [(b, t / 1e3) for b, t in zip(MEASURED_BYTES, SGLANG_2904_US[n], strict=True)]


def custom_all_reduce_points(gpu: GPUSpec, tp: int, grid: list[float]) -> tuple[list[tuple[float, float]], str]:
    """(bytes, ms) points of the custom kernel on `grid` sizes below MAX_BYTES, plus one just under
    MAX_BYTES; and how they were got."""
    n, pts = _points(tp)
    sizes = sorted({b for b in grid if b < MAX_BYTES} | {MAX_BYTES - 16.0})
    scale = gpu.interconnect_gbps / H100_INTERCONNECT_GBPS
    lat_all, bw_all = _fit_line(pts)
    if scale == 1.0:  # H100 / H200: the measured points, lines outside them
        lat_big, bw_big = _fit_line([p for p in pts if p[0] >= 2**20])
        lo, hi = pts[0][0], pts[-1][0]
        out = [(b, lat_all + b / bw_all) for b in sizes if b < lo]
        out += pts + [(b, lat_big + b / bw_big) for b in sizes if b > hi]
        how = (f"{SOURCE} at {n} GPUs, measured 2 KiB-4 MiB; line past 4 MiB "
               f"({1e3 * lat_big:.1f} us + bytes / {bw_big / 1e6:.0f} GB/s)")
    else:
        out = [(b, lat_all + b / (bw_all * scale)) for b in sizes]
        how = (f"{SOURCE} at {n} GPUs as a line ({1e3 * lat_all:.1f} us + bytes / {bw_all / 1e6:.0f} GB/s), "
               f"bandwidth x {scale:.3g} ({gpu.interconnect_gbps:g} / {H100_INTERCONNECT_GBPS:g} GB/s NVLink)")
    return out, how
