"""`kvsim plan --autoscale`: the cheapest autoscaling policy that keeps SLO attainment over a day of
traffic at or above a goal, and the static fleet it is compared with.

Search (each candidate is one simulated day of the workload, same requests and seed):
1. the smallest static fleet whose attainment meets the goal (1, 2, ... up to the cap): the price
   of not autoscaling, and the largest fleet the policy needs;
2. for each metric target (requests in flight per replica: 8, 16, 32, 64), the smallest
   --min-replicas (1 up to that static size) that meets the goal with --max-replicas = the static
   size + 1 (headroom for cold starts); raising the floor only adds warm capacity, so the first
   pass is the cheapest floor for that target.
The answer is the passing candidate with the fewest GPU-hours (ties: the higher floor is not
preferred). Every candidate runs in the compiled core where it applies (autoscaling included:
csrc/fleet.c, the same runs as the Python engine's), so a day's search takes seconds to minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

TARGETS = (8.0, 16.0, 32.0, 64.0)


@dataclass
class Candidate:
    kind: str  # "static" or "autoscale"
    replicas: int  # static size, or max replicas
    min_replicas: int | None
    target: float | None
    gpu_hours: float
    attainment: float
    usd_per_day: float | None

    def row(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _attainment(result, ttft_ms: float, tpot_ms: float, hour_s: float) -> float:
    from kvsim.simcore.autoscale import run_attainment

    return run_attainment(result, ttft_ms, tpot_ms, hour_s)[0] or 0.0


def plan_autoscale(model, gpu, engine, workload, profile, seed: int, goal: float, ttft_ms: float, tpot_ms: float,
                   cap: int, base_policy, price: float | None, hour_s: float,
                   say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Search as the module docstring says; returns the candidates tried and the answer."""
    from kvsim.simcore.config import resolve
    from kvsim.simcore.simulate import simulate

    gpus = engine.tensor_parallel_size * engine.pipeline_parallel_size
    tried: list[Candidate] = []
    counted = (hour_s, ttft_ms, tpot_ms)  # each run counts its hourly attainment as requests leave (any day's size)

    def per_day(gpu_hours: float, duration_s: float) -> float | None:
        return None if price is None or duration_s <= 0 else price * gpu_hours * 86400.0 / duration_s

    static_size = None
    for n in range(1, cap + 1):
        result = simulate(model, gpu, resolve(model, gpu, replace(engine, data_parallel_size=n)), workload, profile,
                          seed=seed, attainment=counted)
        duration = float(result.summary.get("duration_s") or 0.0)
        gpu_hours = n * gpus * duration / 3600.0
        att = _attainment(result, ttft_ms, tpot_ms, hour_s)
        tried.append(Candidate("static", n, None, None, gpu_hours, att, per_day(gpu_hours, duration)))
        say(f"  static {n} replica(s): attainment {100 * att:.1f}%, {gpu_hours:.2f} GPU-hours")
        if att >= goal:
            static_size = n
            break
    if static_size is None:
        return {"tried": [c.row() for c in tried], "answer": None,
                "why": f"no static fleet up to {cap} replicas reaches {100 * goal:g}% attainment"}
    top = min(cap, static_size + 1)
    config = resolve(model, gpu, engine)
    for target in TARGETS:
        for low in range(1, static_size + 1):
            policy = replace(base_policy, min_replicas=low, max_replicas=max(low, top), target=target)
            result = simulate(model, gpu, config, workload, profile, seed=seed, autoscale=policy,
                              attainment=counted)
            fleet = result.record["autoscale"]
            duration = float(result.summary.get("duration_s") or 0.0)
            att = _attainment(result, ttft_ms, tpot_ms, hour_s)
            tried.append(Candidate("autoscale", policy.max_replicas, low, target, fleet["gpu_hours"], att,
                                   per_day(fleet["gpu_hours"], duration)))
            say(f"  autoscale target {target:g}, {low}-{policy.max_replicas} replicas: attainment {100 * att:.1f}%, "
                f"{fleet['gpu_hours']:.2f} GPU-hours")
            if att >= goal:
                break
    passing = [c for c in tried if c.attainment >= goal]
    answer = min(passing, key=lambda c: (c.gpu_hours, c.kind != "autoscale"))
    static = next(c for c in tried if c.kind == "static" and c.replicas == static_size)
    return {"tried": [c.row() for c in tried], "answer": answer.row(), "static": static.row(),
            "saving": None if static.gpu_hours <= 0 else 1.0 - answer.gpu_hours / static.gpu_hours}


def answer_lines(plan: dict[str, Any], goal: float) -> list[str]:
    """What `kvsim plan --autoscale` prints after its search."""
    if plan["answer"] is None:
        return [f"No answer: {plan['why']}."]
    a, s = plan["answer"], plan["static"]
    cost = "" if a["usd_per_day"] is None else f", ${a['usd_per_day']:,.0f}/day"
    lines = []
    if a["kind"] == "autoscale":
        lines.append(f"Cheapest at >= {100 * goal:g}% attainment: autoscale {a['min_replicas']}-{a['replicas']} replicas, "
                     f"target {a['target']:g} requests in flight per replica: {a['gpu_hours']:.2f} GPU-hours{cost}, "
                     f"attainment {100 * a['attainment']:.1f}%")
    else:
        lines.append(f"Cheapest at >= {100 * goal:g}% attainment: a static fleet of {a['replicas']} replicas "
                     f"({a['gpu_hours']:.2f} GPU-hours{cost}); no autoscaling policy tried was cheaper")
    static_cost = "" if s["usd_per_day"] is None else f", ${s['usd_per_day']:,.0f}/day"
    lines.append(f"Static fleet meeting it: {s['replicas']} replicas, {s['gpu_hours']:.2f} GPU-hours{static_cost} "
                 f"(autoscaling saves {100 * plan['saving']:.0f}%)" if plan["saving"] is not None and
                 a["kind"] == "autoscale" else f"Static fleet meeting it: {s['replicas']} replicas{static_cost}")
    return lines


def hour_length(workload) -> float:
    """The workload's "hour" for attainment bins (simcore.autoscale.hour_of_arrival)."""
    from kvsim.simcore.autoscale import hour_of_arrival

    return hour_of_arrival(workload.describe().get("arrival", {}))


__all__ = ["TARGETS", "answer_lines", "hour_length", "plan_autoscale"]
