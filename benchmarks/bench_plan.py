"""`kvsim plan` wall time: the README's plan example, whole process and by phase (issue 22).

The README's example (`kvsim plan --model llama3-70b --gpu H100-SXM-80GB,H200-141GB --workload
azure-conv --rate 20 --slo-ttft-p95-ms 1000 --slo-tpot-p95-ms 60`) runs `--repeats` times as a fresh process (wall
and child CPU seconds, min and median), then once in this process with each phase timed: the
rate searches (reports.plan.run_search, early-stopped runs included), the confirmation runs
(reports.plan.confirm) and the rest (imports aside), and how many simulations each engine core ran.

Run: python benchmarks/bench_plan.py [--repeats 3] [-- extra kvsim plan flags]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter

PLAN_ARGS = ["plan", "--model", "llama3-70b", "--gpu", "H100-SXM-80GB,H200-141GB", "--workload", "azure-conv", "--rate", "20",
             "--slo-ttft-p95-ms", "1000", "--slo-tpot-p95-ms", "60"]


def whole_process(args: list[str], repeats: int) -> None:
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kvsim.cli.main", *args], check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    print(f"whole process, {repeats} runs: wall min {min(walls):.2f} s median {statistics.median(walls):.2f} s; "
          f"CPU min {min(cpus):.2f} s median {statistics.median(cpus):.2f} s")


def by_phase(args: list[str]) -> None:
    import kvsim.reports.plan as plan_module
    import kvsim.simcore.simulate as simulate_module
    from kvsim.cli.main import main

    spent: Counter = Counter()
    cores: Counter = Counter()
    run_search, confirm, run = plan_module.run_search, plan_module.confirm, simulate_module.Simulation.run

    def timed(name, fn):
        def wrapper(*a, **k):
            started = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.process_time() - started
        return wrapper

    def counted_run(self, *a, **k):
        core = self.choose_core()[0]
        cores[core] += 1
        return run(self, *a, **k)

    plan_module.run_search, plan_module.confirm = timed("search", run_search), timed("confirm", confirm)
    simulate_module.Simulation.run = counted_run
    sys.argv = ["kvsim", *args, "--json"]
    started = time.process_time()
    try:
        main()
    except SystemExit:
        pass
    total = time.process_time() - started
    print(f"in process, CPU seconds (imports already done): {total:.2f} s; rate searches {spent['search']:.2f} s, "
          f"confirmation runs {spent['confirm']:.2f} s, the rest {total - spent['search'] - spent['confirm']:.2f} s; "
          f"simulations by engine core: {dict(cores)}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="more kvsim plan flags (after --)")
    ns = parser.parse_args()
    args = [*PLAN_ARGS, *ns.extra]
    print("kvsim " + " ".join(args))
    whole_process(args, ns.repeats)
    import io
    from contextlib import redirect_stdout

    with redirect_stdout(io.StringIO()):
        by_phase(args)


if __name__ == "__main__":
    main()
