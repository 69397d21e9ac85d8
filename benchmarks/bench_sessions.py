"""What caching across turns, a CPU KV tier and prefix-aware routing buy on multi-turn chat.

Runs `kvsim run --json` (the Python engine: the compiled core refuses sessions) for three
comparisons on the `chat-sessions` workload, llama3-8b on H100-SXM-80GB, and prints one table:

  1. prefix caching on / off, one replica, KV not binding
  2. GPU KV made tight (--gpu-memory-utilization), no CPU tier / 8 GiB / 64 GiB tier
  3. 4 replicas at 4x the load: round-robin, least-loaded, session-affinity, prefix-aware, with
     the default memory and with KV tight as in 2

    python benchmarks/bench_sessions.py [--rate 2] [--sessions 300]

Slow (minutes): each row simulates every turn in Python. Not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

BASE = ["kvsim", "run", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--workload", "chat-sessions", "--json"]
KEYS = ("prefix_cache_hit_rate", "cpu_prefix_cache_hit_rate", "median_ttft_ms", "p95_ttft_ms",
        "median_ttft_ms_first_turn", "median_ttft_ms_later_turns", "output_throughput")


def run(args: list[str]) -> dict:
    out = subprocess.run(BASE + args, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["summary"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=4.0, help="sessions per second (one replica)")
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--tight", type=float, default=0.24, help="--gpu-memory-utilization that makes KV bind")
    a = parser.parse_args()
    load = ["--rate", str(a.rate), "--num-requests", str(a.sessions)]
    tight = ["--gpu-memory-utilization", str(a.tight)]
    dp_load = ["--rate", str(4 * a.rate), "--num-requests", str(4 * a.sessions)]
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
    print("| run | " + " | ".join(KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    for label, args in rows:
        s = run(args)
        cells = [("-" if s.get(k) is None else f"{100 * s[k]:.1f}%" if "rate" in k else f"{s[k]:.1f}") for k in KEYS]
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
