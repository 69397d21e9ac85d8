"""Wall time of a 64-point sweep with --jobs 1 and --jobs 2 (and more if given), and whether the
rows are equal (they must be, except wall_s).

    python benchmarks/bench_sweep_jobs.py [--num-requests 200] [--jobs 1,2]

Each run is a fresh `kvsim sweep` process (imports included), on an otherwise idle machine if the
figures are to mean anything: check `uptime` first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GRID = ["--block-size", "8,16,32,64", "--gpu-memory-utilization", "0.7,0.8,0.9,0.95", "--rate", "5,10,20,40"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--jobs", default="1,2")
    args = parser.parse_args()
    from kvsim.reports.sweep_table import read_table

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs: list[tuple[int, float, object]] = []  # (jobs, wall s, rows)
    with tempfile.TemporaryDirectory() as tmp:
        for k, jobs in enumerate(int(j) for j in args.jobs.split(",")):
            out = Path(tmp) / f"run{k}.csv"
            cmd = [sys.executable, "-m", "kvsim.cli.main", "sweep", *GRID, "--num-requests", str(args.num_requests),
                   "--jobs", str(jobs), "--out", str(out)]
            started = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - started
            rows = read_table(out).drop(columns=["wall_s"])
            runs.append((jobs, wall, rows))
            print(f"--jobs {jobs}: {len(rows)} points in {wall:.1f} s wall; rows equal to the first run's: "
                  f"{rows.equals(runs[0][2])}")
    for jobs in sorted({j for j, _, _ in runs}):
        walls = sorted(w for j, w, _ in runs if j == jobs)
        print(f"--jobs {jobs}: median {walls[len(walls) // 2]:.1f} s over {len(walls)} run(s)")
    load = os.getloadavg()
    print(f"load average now (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
