"""Time one NCCL all-reduce per buffer size on `tp` local GPUs (imports torch; harness only)."""

from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, tp: int, sizes: list[int], dtype_name: str, warmup: int, repeats: int,
            out_path: str, port: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=tp)
    dtype = getattr(torch, dtype_name)
    times = []
    for n in sizes:
        buf = torch.ones(n, dtype=dtype, device="cuda")
        for _ in range(warmup):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(buf)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        samples.sort()
        times.append(samples[len(samples) // 2])
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def measure_allreduce(tp: int, sizes: list[int], dtype, warmup: int, repeats: int) -> list[float]:
    """Median ms of one all-reduce of each size (elements), measured on rank 0."""
    dtype_name = str(dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "allreduce.json")
        port = 29500 + os.getpid() % 1000
        mp.spawn(_worker, args=(tp, sizes, dtype_name, warmup, max(repeats, 5), out, port), nprocs=tp, join=True)
        with open(out) as f:
            return json.load(f)
