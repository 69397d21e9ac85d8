"""Time NCCL collectives per message size on local GPUs (imports torch; harness only).

`all_reduce` on `tp` GPUs and `send_recv` between two (the pipeline-parallel hand-off): the same
(GPUs, bytes) -> ms tables that `profiles.collectives` fits on Vidur's H100 measurements.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _one_call(op: str, rank: int, buf) -> None:
    if op == "all_reduce":
        dist.all_reduce(buf)
    elif rank == 0:
        dist.send(buf, 1)
    else:
        dist.recv(buf, 0)


def _worker(rank: int, world: int, sizes: list[int], dtype_name: str, warmup: int, repeats: int,
            out_path: str, port: int, op: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    dtype = getattr(torch, dtype_name)
    times = []
    for n in sizes:
        buf = torch.ones(n, dtype=dtype, device="cuda")
        for _ in range(warmup):
            _one_call(op, rank, buf)
        torch.cuda.synchronize()
        dist.barrier()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            _one_call(op, rank, buf)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        samples.sort()
        times.append(samples[len(samples) // 2])
    if rank == world - 1:  # the receiver's clock covers a send/recv end to end
        with open(out_path, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def _measure(op: str, world: int, sizes: list[int], dtype, warmup: int, repeats: int) -> list[float]:
    dtype_name = str(dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, f"{op}.json")
        port = 29500 + os.getpid() % 1000
        mp.spawn(_worker, args=(world, sizes, dtype_name, warmup, max(repeats, 5), out, port, op),
                 nprocs=world, join=True)
        with open(out) as f:
            return json.load(f)


def measure_allreduce(tp: int, sizes: list[int], dtype, warmup: int, repeats: int) -> list[float]:
    """Median ms of one all-reduce of each size (elements) on `tp` GPUs."""
    return _measure("all_reduce", tp, sizes, dtype, warmup, repeats)


def measure_send_recv(sizes: list[int], dtype, warmup: int, repeats: int) -> list[float]:
    """Median ms of one GPU 0 -> GPU 1 send of each size (elements)."""
    return _measure("send_recv", 2, sizes, dtype, warmup, repeats)
