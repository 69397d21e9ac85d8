"""An autoscaled pool's ceiling against its traffic: what an operator checks before trusting an HPA.

However the autoscaler behaves, the pool cannot serve more than `max_replicas` replicas at their
full-batch capacity (simcore.full_batch: the step model's steady state at the fullest batch). So

- the traffic's peak offered rate above that ceiling is an overload no policy fixes: the pool
  needs ceil(peak / per-replica capacity) replicas at the peak;
- an `inflight` target above the full batch N (the sequences a replica runs at once) lets each
  replica hold up to target x (1 + tolerance) requests before the HPA asks for more: all but N of
  them wait in the replica's own queue (vLLM's num_requests_waiting, which the metric counts:
  simcore.autoscale.AutoscalingRouter.metric), so their TTFT grows before the pool does.

The peak is the most arrivals in one of the run's PEAK_WINDOW_S bins (aligned at the run's start,
as the HPA's sync ticks are; the last, partial bin left out), or in interval_s bins where the
HPA decides less often than that. Why a minute and not the HPA's 15 s sync: a scale-up only
serves after a cold start of minutes (simcore.autoscale's defaults: 120 s provisioning, then load
and warm-up), so a burst shorter than a minute is met by the replicas' queues whatever the HPA
does; and on Poisson arrivals a 15 s bin's count is noisy (at 36 req/s, 540 +- 23 arrivals, the
largest of a run's bins 10-15% above the rate), a 60 s bin half as noisy. A request rate an HPA
reads through Prometheus is itself a rate() over a minute or more ("the range should be at least
4x the scrape interval ... round this up to 60s for a 1m rate", robustperception.io/what-range-
should-i-use-with-rate).
Nothing here changes a decision of the autoscaler: the figures are read off the finished run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

PEAK_WINDOW_S = 60.0
# a run's summary keys of these figures (pool_check's, and simcore.simulate's full batch N)
SUMMARY_KEYS = ("full_batch_capacity", "full_batch_seqs", "full_batch_capacity_per_replica",
                "full_batch_capacity_by_group", "full_batch_seqs_by_group", "peak_offered_rate", "peak_window_s",
                "replicas_for_peak", "peak_above_capacity")


def peak_window_s(interval_s: float) -> float:
    """The bin the peak is counted over: a minute, or the HPA's interval where that is longer."""
    return max(PEAK_WINDOW_S, float(interval_s))


def peak_offered_rate(arrival_s: np.ndarray, window_s: float) -> float | None:
    """The most arrivals in one complete `window_s` bin from t = 0, per second; a run whose
    arrivals span less than one bin: its mean rate over that span; None with under two arrivals."""
    t = np.sort(np.asarray(arrival_s, dtype=np.float64))
    if len(t) < 2 or not t[-1] > t[0]:
        return None
    complete = int(t[-1] // window_s)  # bins [k w, (k + 1) w) that end at or before the last arrival
    if complete == 0:
        return (len(t) - 1) / float(t[-1] - t[0])
    counts = np.bincount((t[t < complete * window_s] // window_s).astype(np.int64), minlength=complete)
    return float(counts.max()) / window_s


def pool_check(ceiling: float, per_replica: list[float], counts: list[int], seqs: list[int],
               arrival_s: np.ndarray, config, margin: float) -> tuple[dict[str, Any], list[str]]:
    """(figures, warnings) of an autoscaled pool: `ceiling` its full-batch capacity (req/s, its
    max_replicas together), `per_replica` that of one replica of each group, `counts` its
    replicas, `seqs` its full batch N; `config` the
    AutoscaleConfig; `margin` the capacity's allowance for its approximations (the peak must pass
    ceiling x (1 + margin) to warn: simcore.metrics.CAPACITY_MARGIN)."""
    window = peak_window_s(config.interval_s)
    peak = peak_offered_rate(arrival_s, window)
    figures: dict[str, Any] = {"full_batch_capacity": ceiling, "peak_offered_rate": peak, "peak_window_s": window}
    if len(per_replica) == 1:
        figures["full_batch_capacity_per_replica"] = per_replica[0]
        if peak is not None:
            figures["replicas_for_peak"] = math.ceil(peak / per_replica[0])
    else:
        figures["full_batch_capacity_by_group"] = list(per_replica)
        figures["full_batch_seqs_by_group"] = list(seqs)
    figures["peak_above_capacity"] = above = peak is not None and peak > ceiling * (1.0 + margin)
    warnings = []
    if above:
        pool = f"--max-replicas {counts[0]}" if len(counts) == 1 else f"the fleet's {sum(counts)} replicas"
        if len(per_replica) == 1:
            needs = f"the peak needs {figures['replicas_for_peak']} replicas"
        else:  # the pool grows in group order: more replicas would be of its last group
            more = math.ceil((peak - ceiling) / per_replica[-1])
            needs = f"the peak needs {more} more replica(s) of the last group ({per_replica[-1]:.2f} req/s each)"
        warnings.append(
            f"autoscaling: peak offered rate {peak:.2f} req/s (busiest {window:g} s) is above the pool's full-batch "
            f"capacity {ceiling:.2f} req/s ({pool}); {needs}")
    n = min(seqs)
    if config.metric == "inflight" and config.target > n:
        warnings.append(
            f"autoscaling: the inflight target {config.target:g} per replica is above the full batch of {n:,} "
            f"sequences a replica runs at once: up to {config.target * (1 + config.tolerance) - n:,.0f} requests "
            "per replica wait in its queue before the HPA scales up")
    return figures, warnings


def capacity_lines(fleet: dict[str, Any]) -> list[str]:
    """The text lines of a run's pool capacity and traffic peak (`fleet`: its record's autoscale
    block, whose "capacity" pool_check's figures fill), for its Autoscaling section and page."""
    cap = fleet.get("capacity")
    if cap is None:
        return []
    replicas = fleet["config"]["max_replicas"]
    each = cap.get("full_batch_capacity_per_replica")
    if each is not None:
        per = f"{each:.2f} ({cap['full_batch_seqs']:,} sequences)"
    else:  # a fleet: each group's, in its order
        per = " / ".join(f"{r:.2f} ({n:,} sequences)" for r, n in zip(cap["full_batch_capacity_by_group"],
                                                                     cap["full_batch_seqs_by_group"], strict=True))
    lines = [f"{'Full-batch capacity per replica (req/s):':<41}{per}; {replicas} replicas: "
             f"{cap['full_batch_capacity']:.2f}"]
    if cap.get("peak_offered_rate") is not None:
        n = cap.get("replicas_for_peak")
        needs = "" if n is None else f" (needs {n} replica{'s' if n != 1 else ''})"
        label = f"Peak offered rate, busiest {cap['peak_window_s']:g} s (req/s):"
        lines.append(f"{label:<41}{cap['peak_offered_rate']:.2f}{needs}")
    return lines


__all__ = ["PEAK_WINDOW_S", "SUMMARY_KEYS", "capacity_lines", "peak_offered_rate", "peak_window_s", "pool_check"]
