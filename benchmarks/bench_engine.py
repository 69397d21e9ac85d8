"""Simulator speed: 10,000 ShareGPT-like requests on Llama-3-8B / one H100.

Prints simulated requests and output tokens per wall second and peak memory. The rate is
chosen so that about 110 sequences run at once (20 req/s: 107.7 mean on main 40fde03) (the script prints the mean it got).
Run: python benchmarks/bench_engine.py [--rate 20] [--num-requests 10000] [--policy continuous] [--exact-steps]
     [--engine-core auto|c|python]
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

from kvsim.profiles import default_profile
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.simulate import simulate
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--policy", default="continuous")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-steps", action="store_true", help="time the one-event-per-step reference mode")
    parser.add_argument("--tracemalloc", action="store_true", help="also trace Python heap peak (slower)")
    parser.add_argument("--engine-core", choices=("auto", "c", "python"), default="auto",
                        help="which engine runs (kvsim run --engine-core): python times the Python engine")
    args = parser.parse_args()

    model, gpu = get_model("llama3-8b"), get_gpu("H100-SXM-80GB")
    config = EngineConfig(policy=args.policy)
    workload = load_workload("sharegpt", {"rate": args.rate, "num_requests": args.num_requests},
                             max_model_len=config.resolved_max_model_len(model))
    profile = default_profile(gpu, model, 1)
    if args.tracemalloc:
        tracemalloc.start()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started, cpu_started = time.perf_counter(), time.process_time()
    result = simulate(model, gpu, config, workload, profile, seed=args.seed, exact_steps=args.exact_steps,
                      engine_core=args.engine_core)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s = result.summary
    print(f"requests: {s['completed']:,} completed, {s['total_output_tokens']:,} output tokens, "
          f"{s['num_steps']:,} steps")
    steps = result.steps
    mean_running = float((steps["num_running"] * steps["num_steps"]).sum() / steps["num_steps"].sum())
    print(f"mean running sequences per step: {mean_running:.1f} "
          f"(max {s['max_running']})")
    print(f"wall: {wall:.2f} s (CPU {cpu:.2f} s){' [exact steps]' if args.exact_steps else ''}, "
          f"engine core: {result.record['engine_core']}")
    print(f"simulated requests / wall s: {s['completed'] / wall:,.0f}")
    print(f"simulated output tokens / wall s: {s['total_output_tokens'] / wall:,.0f}")
    print(f"peak RSS: {rss_peak / 1024:.0f} MiB (before the run: {rss_before / 1024:.0f} MiB)")
    if args.tracemalloc:
        print(f"peak Python heap during the run: {tracemalloc.get_traced_memory()[1] / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
