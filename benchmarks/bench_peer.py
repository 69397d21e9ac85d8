"""Simulator speed against the Python peer (issue 10): the whole `kvsim run` process, timed.

Workload of the peer comparison: Llama-2-70B, TP 4, H100, Azure 2023 conversation trace
lengths (benchmarks/peer-azure-conv.yaml), Poisson 4 req/s, `--max-num-seqs 128
--max-num-batched-tokens 4096`, chunked prefill and prefix caching off. Each size runs as a
fresh process pinned to one core (`taskset -c 0` when present); wall time and peak RSS cover
the whole process (imports included), peak RSS and CPU seconds from getrusage of the finished
child (CPU time is the steadier figure on a shared machine; us / step is CPU per engine step).

Run: python benchmarks/bench_peer.py [--sizes 1000 10000 100000 1000000] [--repeats 3] [--exact-steps]
     [--engine-core auto|c|python] [--dp N [--router round-robin|least-loaded]]
`--dp N` runs N replicas behind the router at N times the rate (each replica sees the peer's load),
so its us / request compares with one replica's (issue 22: at most 2x).
Targets (issue 10): 10k <= 0.8 s, 1M <= 60 s, peak RSS <= 300 MiB at 1M, cost linear in requests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = Path(__file__).resolve().parent / "peer-azure-conv.yaml"
PEER_ARGS = [
    "--model", "llama2-70b", "--tp", "4", "--gpu", "H100-SXM-80GB",
    "--workload", str(WORKLOAD), "--rate", "4",
    "--max-num-seqs", "128", "--max-num-batched-tokens", "4096",
    "--no-enable-chunked-prefill", "--no-enable-prefix-caching", "--json",
    "--no-error-bars",  # one simulation, as the peer runs (kvsim run's default 90% band adds two)
]


def run_once(num_requests: int, extra: list[str], timeout_s: float, dp: int = 1) -> dict:
    """One whole `kvsim run` process: wall seconds, peak RSS (MiB), engine steps."""
    args = list(PEER_ARGS)
    args[args.index("--rate") + 1] = str(4 * dp)
    cmd = [sys.executable, "-m", "kvsim.cli.main", "run", *args, "--num-requests", str(num_requests), *extra]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu_before = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime - cpu_before
    if proc.returncode != 0:
        raise SystemExit(f"kvsim run failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    summary = json.loads(proc.stdout)["summary"]
    # ru_maxrss of children is the max over all children so far: only a new maximum is exact,
    # so sizes run in increasing order and the first repeat of each size is the one to trust.
    return {"wall_s": wall, "cpu_s": cpu, "rss_mib": max(peak, before) / 1024, "rss_exact": peak > before,
            "steps": summary["num_steps"], "completed": summary["completed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3, help="runs per size; the median is reported")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up on one run after this")
    parser.add_argument("--exact-steps", action="store_true", help="time the one-event-per-step reference mode")
    parser.add_argument("--engine-core", choices=("auto", "c", "python"), default="auto",
                        help="which engine runs (kvsim run --engine-core): python times the Python engine")
    parser.add_argument("--dp", type=int, default=1, help="replicas behind the router, at --dp times the rate")
    parser.add_argument("--router", choices=("round-robin", "least-loaded"), default="least-loaded")
    args = parser.parse_args()
    extra = (["--exact-steps"] if args.exact_steps else []) + ["--engine-core", args.engine_core]
    if args.dp > 1:
        extra += ["--dp", str(args.dp), "--router", args.router]
    load = os.getloadavg()[0]
    print(f"load average before: {load:.2f} on {os.cpu_count()} cores; pinned: {bool(shutil.which('taskset'))}")
    print("| requests | wall (median) | wall (all runs) | CPU (median) | peak RSS | engine steps | us / step | us / request |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sorted(args.sizes):
        runs = []
        for _ in range(args.repeats):
            try:
                runs.append(run_once(size, extra, args.timeout_s, args.dp))
            except subprocess.TimeoutExpired:
                print(f"| {size:,} | > {args.timeout_s:.0f} s (timed out) | | | | | |", flush=True)
                break
        if not runs:
            continue
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        rss = max(r["rss_mib"] for r in runs)
        steps = runs[0]["steps"]
        walls = ", ".join(f"{r['wall_s']:.2f}" for r in runs)
        print(f"| {size:,} | {wall:.2f} s | {walls} | {cpu:.2f} s | {rss:.0f} MiB | {steps:,} | {cpu / steps * 1e6:.1f} "
              f"| {cpu / size * 1e6:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
