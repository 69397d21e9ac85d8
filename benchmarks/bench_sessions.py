"""What caching across turns, a CPU KV tier and prefix-aware routing buy on multi-turn chat.

Runs `kvsim run --json` (--engine-core auto: the compiled core, which runs sessions, the CPU tier
and both routers as the Python engine does; --engine-core python to time the reference) for
three comparisons on the `chat-sessions` workload, llama3-8b on H100-SXM-80GB, and prints one
table, with each run's wall time:

  1. prefix caching on / off, one replica, KV not binding
  2. GPU KV made tight (--gpu-memory-utilization), no CPU tier / 8 GiB / 64 GiB tier
  3. 4 replicas at 4x the load: round-robin, least-loaded, session-affinity, prefix-aware, with
     the default memory and with KV tight as in 2

    python benchmarks/bench_sessions.py [--rate 2] [--sessions 300] [--engine-core python] [--only "dp 4"]

Seconds per row in the compiled core, minutes in the Python one. Not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

BASE = ["kvsim", "run", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--workload", "chat-sessions", "--json"]
KEYS = ("prefix_cache_hit_rate", "cpu_prefix_cache_hit_rate", "median_ttft_ms", "p95_ttft_ms",
        "median_ttft_ms_first_turn", "median_ttft_ms_later_turns", "output_throughput")


def run(args: list[str]) -> tuple[dict, float, str]:
    """The run's summary, its wall time (the whole process) and the engine core that ran it."""
    start = time.perf_counter()
    out = subprocess.run(BASE + args, capture_output=True, text=True, check=True).stdout
    record = json.loads(out)
    return record["summary"], time.perf_counter() - start, record.get("record", {}).get("engine_core", "?")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=4.0, help="sessions per second (one replica)")
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--tight", type=float, default=0.24, help="--gpu-memory-utilization that makes KV bind")
    parser.add_argument("--engine-core", default="auto", choices=["auto", "c", "python"])
    parser.add_argument("--only", default="", help="run the rows whose label contains this")
    a = parser.parse_args()
    load = ["--engine-core", a.engine_core] + ["--rate", str(a.rate), "--num-requests", str(a.sessions)]
    tight = ["--gpu-memory-utilization", str(a.tight)]
    dp_load = ["--engine-core", a.engine_core, "--rate", str(4 * a.rate), "--num-requests", str(4 * a.sessions)]
    rows = [
        ("caching on", load),
        ("caching off", load + ["--no-enable-prefix-caching"]),
        (f"KV tight ({a.tight}), no CPU tier", load + tight),
        (f"KV tight ({a.tight}), CPU tier 8 GiB", load + tight + ["--kv-offloading-size", "8"]),
        (f"KV tight ({a.tight}), CPU tier 64 GiB", load + tight + ["--kv-offloading-size", "64"]),
    ] + [(f"dp 4, {r}", dp_load + ["--dp", "4", "--router", r])
         for r in ("round-robin", "least-loaded", "session-affinity", "prefix-aware")
    ] + [(f"dp 4, {r}, KV tight", dp_load + tight + ["--dp", "4", "--router", r])
         for r in ("round-robin", "least-loaded", "session-affinity", "prefix-aware")]
    print("| run | " + " | ".join(KEYS) + " | core | wall s |")
    print("|---|" + "---|" * (len(KEYS) + 2))
    for label, args in rows:
        if a.only not in label:
            continue
        s, wall, core = run(args)
        cells = [("-" if s.get(k) is None else f"{100 * s[k]:.1f}%" if "rate" in k else f"{s[k]:.1f}") for k in KEYS]
        print(f"| {label} | " + " | ".join(cells) + f" | {core} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
