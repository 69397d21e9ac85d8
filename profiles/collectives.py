"""Collective costs from measured NCCL timings: fit and tables for profiles (`python -m profiles.collectives`).

Data: `shared/data/measured/vidur_h100_dgx_all_reduce.csv` and `..._send_recv.csv` (Vidur's published
H100 DGX profiles, NVSwitch, 2/4/8 GPUs; MIT licence, attribution in `shared/data/measured/`). Per GPU
count n we keep the median time of each message size, and fit

    all_reduce(bytes) = latency_n + 2 (n-1)/n * bytes / busbw_n        (ring: busbw is NCCL's "bus bandwidth")
    send_recv(bytes)  = latency + bytes / bw          (inside one node and across two nodes, apart)

by least squares on relative error. The measured (n, bytes) table goes into H100 profiles as it is,
extended past the largest measured message by the fit. Other GPUs get the fit with the bus bandwidth
scaled by their NVLink datasheet figure over the H100's (same latency floor: an assumption, labelled
`scaled from H100 by interconnect datasheet` in the profile).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.profiles import custom_allreduce, symm_mem_allreduce
from kvsim.simcore.specs import GPUSpec

FIT_FILE = Path(__file__).with_name("collectives_h100.json")
# profiles/data/ ships copies of the files (so a clone can refit); the project's shared folder is the origin
DATA_DIRS = (Path(__file__).resolve().parent / "data", Path(__file__).resolve().parents[2] / "shared" / "data" / "measured")
H100 = "H100-SXM-80GB"
H100_INTERCONNECT_GBPS = 450.0  # catalog figure for H100 SXM NVLink4 per direction
# Vidur's send/recv rows are two GPUs either in one node (devices_per_node 2: NVLink) or in two
# nodes (devices_per_node 1: the inter-node network), as its own predictor reads them
# (microsoft/vidur, vidur/execution_time_predictor/sklearn_execution_time_predictor.py,
# `_load_send_recv_df`: devices_per_node = 1 if the replica spans nodes else 2). Fitted apart.
SEND_RECV_ROWS = {"intra_node": 2, "inter_node": 1}
# DGX H100 inter-node link per GPU: one 400 Gb/s ConnectX-7 NIC = 50 GB/s (NVIDIA DGX H100
# datasheet; `GPUSpec.internode_gbps`); other GPUs' inter-node tables scale by theirs over this.
H100_INTERNODE_GBPS = 50.0
# Message sizes of a profile table: 1 KiB .. 4 GiB (x2 per point), covers 1..16384 tokens x 8192 x 2 B.
GRID_BYTES = [2.0**k for k in range(10, 33)]


def _data(name: str) -> Path:
    for d in DATA_DIRS:
        if (d / name).exists():
            return d / name
    raise FileNotFoundError(f"measured data {name} not found in {', '.join(map(str, DATA_DIRS))}")


def _medians(path: Path, column: str, devices_per_node: int | None = None) -> dict[int, list[tuple[float, float]]]:
    """Per GPU count, (size, median of the per-call medians); only rows with `devices_per_node`
    GPUs of the pair per node when given (send/recv: 2 = one node, 1 = two nodes)."""
    import pandas as pd

    raw = pd.read_csv(path)
    if devices_per_node is not None:
        raw = raw[raw["devices_per_node"] == devices_per_node]
    grouped = raw.groupby(["num_workers", "size"])[f"time_stats.{column}.median"].median()
    out: dict[int, list[tuple[float, float]]] = {}
    for (n, size), ms in grouped.items():
        out.setdefault(int(n), []).append((float(size), float(ms)))
    return out


def _fit_line(points: list[tuple[float, float]], factor: float) -> tuple[float, float]:
    """(latency_ms, bandwidth GB/s) minimising relative error of latency + factor*bytes/bw."""
    x = np.array([p[0] for p in points]) * factor
    y = np.array([p[1] for p in points])
    a = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    (lat, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
    return float(lat), float(1.0 / inv_bw / 1e6)  # bytes/ms -> GB/s


def fit() -> dict[str, Any]:
    ar_path, sr_path = _data("vidur_h100_dgx_all_reduce.csv"), _data("vidur_h100_dgx_send_recv.csv")
    ar = _medians(ar_path, "all_reduce")
    doc: dict[str, Any] = {"all_reduce": {}, "send_recv": {}}
    for n, pts in sorted(ar.items()):
        lat, bw = _fit_line(pts, 2.0 * (n - 1) / n)
        rel = [abs(lat + 2.0 * (n - 1) / n * b / (bw * 1e6) - t) / t for b, t in pts]
        doc["all_reduce"][str(n)] = {
            "latency_ms": round(lat, 5), "bus_bandwidth_gbps": round(bw, 1),
            "median_abs_rel_error": round(float(np.median(rel)), 4),
            "bytes": [p[0] for p in pts], "time_ms": [p[1] for p in pts],
        }
    for where, per_node in SEND_RECV_ROWS.items():
        pts = _medians(sr_path, "send_recv", per_node)[2]
        lat, bw = _fit_line(pts, 1.0)
        rel = [abs(lat + b / (bw * 1e6) - t) / t for b, t in pts]
        doc["send_recv"][where] = {
            "devices_per_node": per_node,
            "latency_ms": round(lat, 5), "bandwidth_gbps": round(bw, 1),
            "median_abs_rel_error": round(float(np.median(rel)), 4),
            "bytes": [p[0] for p in pts], "time_ms": [p[1] for p in pts],
        }
    doc["fit"] = {
        "data": [f"shared/data/measured/{ar_path.name}", f"shared/data/measured/{sr_path.name}"],
        "data_sha256": [hashlib.sha256(p.read_bytes()).hexdigest() for p in (ar_path, sr_path)],
        "data_source": "Vidur (microsoft/vidur) H100 DGX network profiles, MIT licence",
        "model": "all_reduce = latency + 2(n-1)/n bytes/busbw; send_recv = latency + bytes/bw; "
                 "least squares on relative error over per-size medians",
    }
    return doc


def load_fit(path: Path = FIT_FILE) -> dict[str, Any]:
    return json.loads(path.read_text())


def _nearest(table: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
    ns = sorted(int(k) for k in table)
    best = min(ns, key=lambda k: (abs(k - n), k))
    return best, table[str(best)]


def _binned(entry: dict[str, Any]) -> list[tuple[float, float]]:
    """The measured sizes in octaves (x2 bins): median size and median time of each bin."""
    bins: dict[int, list[tuple[float, float]]] = {}
    for b, t in zip(entry["bytes"], entry["time_ms"], strict=True):
        bins.setdefault(int(np.floor(np.log2(b))), []).append((b, t))
    return [(float(np.median([p[0] for p in v])), float(np.median([p[1] for p in v]))) for _, v in sorted(bins.items())]


def _table(entry: dict[str, Any], factor: float, scale: float, measured: bool) -> dict[str, list]:
    """(bytes, ms) table: the measured medians per octave where measured, the fit elsewhere;
    `scale` multiplies the bandwidth (other GPUs)."""
    lat, bw = entry["latency_ms"], entry.get("bus_bandwidth_gbps", entry.get("bandwidth_gbps"))

    def model(b: float) -> float:
        return lat + factor * b / (bw * scale * 1e6)

    pts = _binned(entry) if measured else []
    lo = pts[0][0] if pts else float("inf")
    hi = pts[-1][0] if pts else 0.0
    pts += [(b, model(b)) for b in GRID_BYTES if not measured or b < lo / 2 or b > 2 * hi]
    pts.sort()
    return {"bytes": [round(b) for b, _ in pts], "time_ms": [round(t, 5) for _, t in pts]}


def collectives_for(gpu: GPUSpec, tp: int, fit_doc: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The profile's `collectives` block for `tp` GPUs of this kind (None at tp 1)."""
    if tp <= 1:
        return None
    doc = fit_doc or load_fit()
    n, ar = _nearest(doc["all_reduce"], tp)
    intra, inter = doc["send_recv"]["intra_node"], doc["send_recv"]["inter_node"]
    measured = gpu.interconnect_gbps == H100_INTERCONNECT_GBPS and n == tp
    scale = gpu.interconnect_gbps / H100_INTERCONNECT_GBPS
    if gpu.name == H100 and n == tp:
        how = f"measured H100 DGX NCCL all-reduce at {tp} GPUs (Vidur), fit beyond the largest message"
    elif measured:
        how = (f"measured H100 DGX NCCL table at {tp} GPUs: {gpu.name} has the same NVLink bandwidth "
               f"({gpu.interconnect_gbps:g} GB/s); not measured on this GPU")
    else:
        how = (f"scaled from H100 by interconnect datasheet: H100 fit at {n} GPUs, bus bandwidth x "
               f"{scale:.3g} ({gpu.interconnect_gbps:g} / {H100_INTERCONNECT_GBPS:g} GB/s), same latency floor")
    net_scale = gpu.internode_gbps / H100_INTERNODE_GBPS
    all_reduce = _table(ar, 2.0 * (tp - 1) / tp, scale, measured)
    custom = None
    if custom_allreduce.eligible(gpu, tp):  # vLLM's own kernel below 8 MiB (profiles/custom_allreduce.py)
        all_reduce, custom = _with_custom(all_reduce, gpu, tp)
    block = {
        "all_reduce": all_reduce,
        "send_recv": _table(intra, 1.0, scale, gpu.interconnect_gbps == H100_INTERCONNECT_GBPS),
        "send_recv_inter_node": _table(inter, 1.0, net_scale, gpu.internode_gbps == H100_INTERNODE_GBPS),
        "all_reduce_calls_per_layer": 2,
        "source": how,
        "send_recv_source": _send_recv_how(gpu, scale, net_scale),
        "fit": {"all_reduce_latency_ms": ar["latency_ms"], "bus_bandwidth_gbps": round(ar["bus_bandwidth_gbps"] * scale, 1),
                "send_recv_latency_ms": intra["latency_ms"],
                "send_recv_bandwidth_gbps": round(intra["bandwidth_gbps"] * scale, 1),
                "send_recv_inter_node_latency_ms": inter["latency_ms"],
                "send_recv_inter_node_bandwidth_gbps": round(inter["bandwidth_gbps"] * net_scale, 1)},
    }
    if custom is not None:
        block["custom_all_reduce"] = custom
    by_engine = symm_mem_allreduce.all_reduce_by_engine(gpu, tp, all_reduce)
    if by_engine:  # vLLM V1 (0.11+) on NVSwitch Hopper: symmetric memory between the custom kernel and NCCL
        block["all_reduce_by_engine"] = by_engine
    return block


def _with_custom(nccl: dict[str, list], gpu: GPUSpec, tp: int) -> tuple[dict[str, list], dict[str, Any]]:
    """The all-reduce table as vLLM runs it: its custom kernel below `custom_allreduce.MAX_BYTES`,
    NCCL from there (a point at MAX_BYTES read off the NCCL table, log-log as kvsim interpolates it)."""
    pts, how = custom_allreduce.custom_all_reduce_points(gpu, tp, GRID_BYTES)
    cut = float(custom_allreduce.MAX_BYTES)
    lb, lt = np.log(np.array(nccl["bytes"], float)), np.log(np.array(nccl["time_ms"], float))
    at_cut = float(np.exp(np.interp(np.log(cut), lb, lt)))
    pts += [(cut, at_cut)] + [(b, t) for b, t in zip(nccl["bytes"], nccl["time_ms"], strict=True) if b > cut]
    table = {"bytes": [round(b) for b, _ in pts], "time_ms": [round(t, 5) for _, t in pts]}
    return table, {"below_bytes": custom_allreduce.MAX_BYTES, "source": how}


def _send_recv_how(gpu: GPUSpec, scale: float, net_scale: float) -> str:
    inside = ("measured H100 DGX send/recv inside a node (Vidur, devices_per_node 2)" if scale == 1 else
              f"H100 DGX in-node send/recv fit, bandwidth x {scale:.3g} ({gpu.name} NVLink datasheet)")
    across = ("measured H100 DGX send/recv across two nodes (Vidur, devices_per_node 1)" if net_scale == 1 else
              f"H100 DGX inter-node send/recv fit, bandwidth x {net_scale:.3g} ({gpu.internode_gbps:g} / "
              f"{H100_INTERNODE_GBPS:g} GB/s per-GPU NIC, datasheet)")
    return f"send_recv: {inside}; send_recv_inter_node: {across}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {FIT_FILE.name}")
    args = parser.parse_args()
    doc = fit()
    for kind in ("all_reduce", "send_recv"):  # all_reduce per GPU count; send_recv intra_node / inter_node
        for n, e in doc[kind].items():
            bw = e.get("bus_bandwidth_gbps", e.get("bandwidth_gbps"))
            print(f"{kind} n={n}: latency {1e3 * e['latency_ms']:.1f} us, bandwidth {bw:.0f} GB/s, "
                  f"median |error| {e['median_abs_rel_error']:.1%} over {len(e['bytes'])} sizes")
    if args.write:
        FIT_FILE.write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
