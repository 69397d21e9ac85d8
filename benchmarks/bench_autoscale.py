"""`kvsim plan --autoscale` and one autoscaled day: wall time with the autoscaled runs in the
compiled core (csrc/fleet.c, now) and in the Python engine (as before issue 29's core work).

`plan` runs `reports.autoscale_plan.plan_autoscale` in this process on a workload (the built-in
`diurnal`, a day compressed into one hour, by default) and times it twice: as kvsim runs it now
(every candidate in the compiled core) and with the autoscaled candidates forced onto the Python
engine (static candidates stay in C, as they were); both must give the same answer, and the
script checks it. `day` times one autoscaled run of a workload file in either core (a real 24 h
diurnal day at a production rate: benchmarks/day-24h.yaml); `--num-requests` cuts it short to
time the Python engine on a prefix and scale up.

Run: python benchmarks/bench_autoscale.py plan [--workload diurnal] [--skip-python]
     python benchmarks/bench_autoscale.py day --workload benchmarks/day-24h.yaml [--num-requests N] [--core c|python]
"""

from __future__ import annotations

import argparse
import time


def _setup(args):
    from kvsim.profiles import default_profile
    from kvsim.reports.prices import load_prices
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.specs import EngineConfig
    from kvsim.workloads import load_workload

    engine = EngineConfig(tensor_parallel_size=args.tp)
    model, gpu = get_model(args.model), get_gpu(args.gpu)
    model = engine.resolve_model(model)
    overrides = {} if args.num_requests is None else {"num_requests": args.num_requests}
    wl = load_workload(args.workload, overrides, max_model_len=engine.resolved_max_model_len(model))
    return model, gpu, engine, wl, default_profile(gpu, model, args.tp), load_prices().get(gpu.name)


def plan(args) -> None:
    import kvsim.simcore.simulate as simulate_module
    from kvsim.reports.autoscale_plan import hour_length, plan_autoscale
    from kvsim.simcore.autoscale import AutoscaleConfig

    model, gpu, engine, wl, profile, price = _setup(args)
    policy = AutoscaleConfig(min_replicas=1, max_replicas=args.max_replicas, provisioning_s=args.provisioning_delay)
    real = simulate_module.simulate
    cores: list[str] = []

    def counting(*a, **kw):
        result = real(*a, **kw)
        cores.append(("autoscale " if kw.get("autoscale") is not None else "static ") + result.record["engine_core"])
        return result

    def python_autoscale(*a, **kw):  # before: the compiled core refused autoscaling
        if kw.get("autoscale") is not None:
            kw["engine_core"] = "python"
        return counting(*a, **kw)

    answers = {}
    for label, patched in (("now (compiled core)", counting), ("before (autoscaled runs in Python)", python_autoscale)):
        if args.skip_python and patched is python_autoscale:
            continue
        simulate_module.simulate = patched
        cores.clear()
        started = time.perf_counter()
        try:
            found = plan_autoscale(model, gpu, engine, wl, profile, args.seed, args.attainment, args.ttft, args.tpot,
                                   args.max_replicas, policy, price, hour_length(wl))
        finally:
            simulate_module.simulate = real
        wall = time.perf_counter() - started
        answers[label] = found["answer"]
        counts = {c: cores.count(c) for c in sorted(set(cores))}
        print(f"{label}: {wall:.1f} s wall, {len(cores)} simulations {counts}; answer {found['answer']}")
    if len(answers) == 2:
        a, b = answers.values()
        print("same answer" if a == b else f"ANSWERS DIFFER: {a} vs {b}")


def day(args) -> None:
    from kvsim.simcore.autoscale import AutoscaleConfig
    from kvsim.simcore.config import resolve
    from kvsim.simcore.simulate import simulate

    model, gpu, engine, wl, profile, _ = _setup(args)
    policy = AutoscaleConfig(min_replicas=1, max_replicas=args.max_replicas, provisioning_s=args.provisioning_delay,
                             target=args.target)
    started = time.perf_counter()
    result = simulate(model, gpu, resolve(model, gpu, engine), wl, profile, seed=args.seed, autoscale=policy,
                      engine_core=args.core)
    wall = time.perf_counter() - started
    fleet = result.record["autoscale"]
    print(f"{int(wl.num_requests):,} requests, {result.summary['duration_s'] / 3600:.2f} simulated hours, core "
          f"{result.record['engine_core']}: {wall:.1f} s wall ({1e6 * wall / max(1, int(wl.num_requests)):.1f} us per "
          f"request); peak {fleet['peak_active_replicas']} / mean {fleet['mean_active_replicas']:.2f} active replicas, "
          f"{fleet['gpu_hours']:.1f} GPU-hours, {fleet['decisions']} decisions, {result.totals.num_steps:,} steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("plan", "day"))
    parser.add_argument("--workload", default="diurnal")
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--gpu", default="H100")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--num-requests", type=int)
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument("--provisioning-delay", type=float, default=120.0)
    parser.add_argument("--target", type=float, default=32.0)
    parser.add_argument("--attainment", type=float, default=0.99)
    parser.add_argument("--ttft", type=float, default=1000.0)
    parser.add_argument("--tpot", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--core", default="auto", choices=("auto", "c", "python"))
    parser.add_argument("--skip-python", action="store_true")
    args = parser.parse_args()
    plan(args) if args.what == "plan" else day(args)


if __name__ == "__main__":
    main()
