"""Process start-up and per-run setup cost of the `kvsim` command (issue 10).

The peer target (10k requests in <= 0.8 s for the whole `kvsim run` process) includes the
interpreter, the imports and the setup before the first engine step, so they are measured
on their own here: each command runs as a fresh process, `--repeats` times, and the CPU
seconds of the finished child (getrusage, user + system) are reported as min and median
(CPU time is the steadier figure on a shared machine; wall time is printed for reference).

Run: python benchmarks/bench_startup.py [--repeats 7] [--peer] [--bytecode cached]
`--peer` adds the peer workload at 10k requests (benchmarks/bench_peer.py's arguments).
`--bytecode cached` runs with compiled byte code, as an installed kvsim has it (pip writes .pyc):
a private PYTHONPYCACHEPREFIX, filled by one untimed run of each command. The default runs as the
environment says; with PYTHONDONTWRITEBYTECODE=1 and a checkout without __pycache__, every run
compiles the ~10k lines of kvsim it imports (~0.5G instructions, a third of a short run).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_peer import PEER_ARGS  # noqa: E402  (the peer workload's flags, defined once)

KVSIM = [sys.executable, "-m", "kvsim.cli.main"]
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import numpy, simpy, yaml": [sys.executable, "-c", "import numpy, simpy, yaml"],
    "kvsim --help": [*KVSIM, "--help"],
    "kvsim run --help": [*KVSIM, "run", "--help"],
    "kvsim list models": [*KVSIM, "list", "models"],
    "kvsim run --num-requests 10": [*KVSIM, "run", "--num-requests", "10"],
    "kvsim run peer --num-requests 10": [*KVSIM, "run", *PEER_ARGS, "--num-requests", "10"],
}
PEER_10K = [*KVSIM, "run", *PEER_ARGS, "--num-requests", "10000"]


ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run_once(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one whole process."""
    env = ENV
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return usage.ru_utime + usage.ru_stime - cpu_before, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--peer", action="store_true", help="also time the peer workload at 10k requests")
    parser.add_argument("--bytecode", choices=("env", "cached"), default="env",
                        help="env: as the environment says; cached: compiled byte code, as installed")
    args = parser.parse_args()
    cases = dict(CASES)
    if args.peer:
        cases["kvsim run peer --num-requests 10000"] = PEER_10K
    if args.bytecode == "cached":
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="kvsim-bench-pyc-")
    print(f"byte code: {args.bytecode}")
    print(f"{'command':40s} {'cpu min':>8s} {'cpu med':>8s} {'wall min':>9s}")
    for name, cmd in cases.items():
        if args.bytecode == "cached":
            run_once(cmd)  # untimed: writes the byte code
        runs = [run_once(cmd) for _ in range(args.repeats)]
        cpu = [c for c, _ in runs]
        print(f"{name:40s} {min(cpu):8.3f} {statistics.median(cpu):8.3f} {min(w for _, w in runs):9.3f}", flush=True)


if __name__ == "__main__":
    main()
