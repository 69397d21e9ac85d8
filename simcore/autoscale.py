"""Autoscaling: replicas started and stopped during a run by a policy, with priced cold starts.

An operator's fleet follows its traffic through the day: a Kubernetes HPA (or KEDA, or Dynamo's
planner) reads a per-replica metric every `interval_s` and asks for

    desired = ceil(active x metric / target)            (the HPA algorithm, kubernetes.io docs,
                                                          "Horizontal Pod Autoscaling")

replicas, ignored while within `tolerance` (HPA's default 0.1) of the target, bounded by
[min_replicas, max_replicas]. That recommendation then goes through the HPA's `behavior` as the
controller applies it (kubernetes.io, "Horizontal Pod Autoscaling": "Stabilization window" and
"Default Behavior"; kubernetes/kubernetes pkg/controller/podautoscaler/horizontal.go,
stabilizeRecommendationWithBehaviors and convertDesiredReplicasWithBehaviorRate):

- stabilization: every raw recommendation is kept with its time; the count the HPA moves to is
  the current one (active + starting: the Deployment's spec.replicas) raised to the lowest
  recommendation of the last `scale_up_cooldown_s` (scaleUp.stabilizationWindowSeconds, default
  0: none) and lowered to the highest of the last `scale_down_cooldown_s` (scaleDown's, default
  300 s: "the highest recommendation for the last 300sec is used"). A recommendation counts while
  strictly younger than the window (the controller's `timestamp.After(cutoff)`). The two old
  knobs keep their names and defaults; they were cooldowns since the last change and are now
  these windows, measured from each recommendation.
- rate: scaling up goes at most to the larger of `ceil(start x (1 + scale_up_percent/100))` and
  `start + scale_up_pods` (default Percent 100 and Pods 4, selectPolicy Max), scaling down to
  no fewer than `int(start x (1 - scale_down_percent/100))` (default Percent 100: no limit), where
  `start` is the count at the beginning of the period (`scale_up_period_s` / `scale_down_period_s`,
  default 15 s: the current count less the replicas added, plus those removed, by changes
  strictly younger than the period).

Not as the HPA: no scale-down while a replica is starting (the HPA would delete the starting pod
first; with the default 300 s window a scale-down within a cold start of a scale-up cannot happen
anyway, as the window still holds the higher recommendation), and a starting replica is not in
the metric (the HPA treats a pod without metrics as 0 on a scale-up, at the target on a
scale-down).

A replica's life: off -> starting (provisioning delay: a node to come up, then the model to load:
weights / storage bandwidth, plus warm-up: torch.compile and CUDA graph capture) -> active (the
router sends it requests) -> draining (no new requests; it finishes what it holds) -> off. It is
paid from the moment it starts until it is off again. The run begins with `min_replicas` active.

Metrics: `inflight` (requests waiting, running or swapped per active replica: vLLM's
num_requests_waiting + num_requests_running, what KEDA scalers on vLLM read) or `kv` (KV cache use,
vLLM's gpu_cache_usage_perc, as a percentage).

The simulation holds `max_replicas` engines from the start; an off replica receives nothing and
takes no steps, so it costs no simulated time. Both cores run it (the compiled one in
csrc/fleet.c, bit for bit: tests/test_fleet_core.py).

Over a heterogeneous fleet (`--fleet A:TP:N,B:TP:M --autoscale`, simcore/fleet.py) the pool is the
fleet's replicas in the order the groups are given, and that order is the priority: one HPA over
the whole pool (its metric averaged over the active replicas of every group), replicas started
lowest index first (the first group fills before the next one is touched: cluster-autoscaler's
`priority` expander, which grows the node group of the highest user-given priority, kubernetes/
autoscaler cluster-autoscaler/FAQ.md "What are Expanders?") and drained highest index first (the
lowest-priority and, in this order, most recently started replicas: a ReplicaSet scales down its
newest pods first, KEP-2255, and `controller.kubernetes.io/pod-deletion-cost` steers it the same
way). `--min-replicas` are the first replicas of the first group. List the group that is cheapest
per token first to scale the cheapest capacity first; each replica's cold start loads its own
group's weights per GPU, and it is billed for its own GPUs (`replica_hours` in the record).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvsim.simcore.errors import ConfigError

if TYPE_CHECKING:
    import simpy

    from kvsim.simcore.engine import Engine
    from kvsim.simcore.request import Request

METRICS = ("inflight", "kv")
OFF, STARTING, ACTIVE, DRAINING = "off", "starting", "active", "draining"

# Cold-start defaults (stated, overridable):
# - provisioning: a GPU node from a cloud pool. Cluster autoscalers document node start-up in
#   minutes; 120 s is a middle value for a VM with GPU drivers preinstalled.
# - model load: the weights one GPU holds over 2 GB/s (a local NVMe SSD's sequential read; network
#   storage is slower, an in-memory cache faster): `--model-load-gbps`.
# - warm-up: vLLM's torch.compile and CUDA graph capture before it serves; its start-up logs report
#   graph capture of tens of seconds on large models: 30 s.
MIN_INTERVAL_S = 0.1  # an autoscaler deciding more often than this would be its own event storm
DEFAULT_PROVISIONING_S = 120.0
DEFAULT_MODEL_LOAD_GBPS = 2.0
DEFAULT_WARMUP_S = 30.0


# a replica that takes longer than a day to start is no autoscaling (and a cold start of 1e308 s
# would be printed as a 309-digit number)
MAX_PROVISIONING_S = 86400.0


def _what(field_name: str) -> str:
    """How the user gave a field: its flag (--provisioning-delay), or its key in --autoscale-config."""
    return "--provisioning-delay" if field_name == "provisioning_s" else f"--autoscale-config: {field_name}"


@dataclass(frozen=True)
class AutoscaleConfig:
    """The policy and its cold start (see the module docstring)."""

    min_replicas: int = 1
    max_replicas: int = 4
    metric: str = "inflight"
    target: float = 32.0  # inflight: requests per replica; kv: percent of the KV cache
    interval_s: float = 15.0  # HPA's default sync period
    tolerance: float = 0.1
    scale_up_cooldown_s: float = 0.0  # the scale-up stabilization window (HPA default 0)
    scale_down_cooldown_s: float = 300.0  # the scale-down stabilization window (HPA default 300 s)
    scale_up_percent: float = 100.0  # HPA default scaleUp policies: Percent 100 and Pods 4 per 15 s, Max
    scale_up_pods: float = 4
    scale_up_period_s: float = 15.0
    scale_down_percent: float = 100.0  # HPA default scaleDown policy: Percent 100 per 15 s
    scale_down_period_s: float = 15.0
    provisioning_s: float = DEFAULT_PROVISIONING_S
    model_load_gbps: float = DEFAULT_MODEL_LOAD_GBPS
    warmup_s: float = DEFAULT_WARMUP_S

    def __post_init__(self) -> None:
        if not (isinstance(self.min_replicas, int) and isinstance(self.max_replicas, int)) or self.min_replicas < 1:
            raise ConfigError(f"--min-replicas must be an integer >= 1, got {self.min_replicas!r}")
        if self.max_replicas < self.min_replicas or self.max_replicas > 1024:
            raise ConfigError(f"--max-replicas must be from --min-replicas ({self.min_replicas}) to 1024, "
                              f"got {self.max_replicas}")
        if self.metric not in METRICS:
            raise ConfigError(f"{_what('metric')} must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if not (math.isfinite(self.interval_s) and self.interval_s >= MIN_INTERVAL_S):
            raise ConfigError(f"--autoscale-config: interval_s must be a finite number >= {MIN_INTERVAL_S:g} s, "
                              f"got {self.interval_s!r}")
        for name, low in (("target", 0.0), ("model_load_gbps", 0.0)):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > low):
                raise ConfigError(f"{_what(name)} must be a finite number > {low:g}, got {value!r}")
        if self.metric == "kv" and self.target > 100:
            raise ConfigError(f"{_what('target')} for kv is a percentage (0, 100], got {self.target}")
        for name in ("tolerance", "scale_up_cooldown_s", "scale_down_cooldown_s", "provisioning_s", "warmup_s",
                     "scale_up_percent", "scale_up_pods"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{_what(name)} must be a finite number >= 0, got {value!r}")
            if name == "provisioning_s" and value > MAX_PROVISIONING_S:
                raise ConfigError(f"{_what(name)} must be at most {MAX_PROVISIONING_S:,.0f} s (a day), got {value:g}")
        if self.scale_up_pods != int(self.scale_up_pods) or self.scale_up_pods > 1024:
            raise ConfigError(f"--autoscale-config: scale_up_pods must be a whole number of replicas from 0 to 1024, "
                              f"got {self.scale_up_pods!r}")
        if not (math.isfinite(self.scale_down_percent) and 0 <= self.scale_down_percent <= 100):
            raise ConfigError(f"--autoscale-config: scale_down_percent must be from 0 to 100, got {self.scale_down_percent!r}")
        for name in ("scale_up_period_s", "scale_down_period_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"--autoscale-config: {name} must be a finite number > 0, got {value!r}")

    def cold_start_s(self, weights_bytes_per_gpu: int) -> float:
        """Seconds from the decision to start a replica to its first request."""
        return self.provisioning_s + weights_bytes_per_gpu / (self.model_load_gbps * 1e9) + self.warmup_s

    def check_cold_start(self, weights_bytes_per_gpu: int) -> float:
        """cold_start_s, refused past a day (MAX_PROVISIONING_S's reason): a warmup_s of 1e9 or a
        model_load_gbps of 1e-300 ran, and printed a cold start of a 300-digit number of seconds."""
        cold = self.cold_start_s(weights_bytes_per_gpu)
        if not cold <= MAX_PROVISIONING_S:
            raise ConfigError(
                f"--autoscale: a replica's cold start would take {cold:.3g} s ({self.provisioning_s:g} s provisioning, "
                f"{weights_bytes_per_gpu / 1e9:.3g} GB of weights per GPU at model_load_gbps {self.model_load_gbps:g}, "
                f"warmup_s {self.warmup_s:g}); at most {MAX_PROVISIONING_S:,.0f} s (a day)")
        return cold

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Replica:
    index: int
    state: str = OFF
    paid_since: float | None = None  # when it started (cold start included)
    paid_s: float = 0.0


@dataclass
class Timeline:
    """What the fleet did: one row per change (t, active, starting, draining) and decisions made."""

    rows: list[tuple[float, int, int, int]] = field(default_factory=list)
    decisions: int = 0


class AutoscalingRouter:
    """A RequestSink over `max_replicas` engines that routes (least-loaded) to the active ones only,
    and the autoscaler's process that starts and drains them."""

    def __init__(self, engines: list[Engine], config: AutoscaleConfig, cold_start_s: float | list[float],
                 gpus_per_replica: int | list[int]):
        """`cold_start_s`, `gpus_per_replica`: one for every replica, or one each (a fleet's groups)."""
        assert len(engines) == config.max_replicas
        if config.metric == "kv" and not hasattr(engines[0].policy.allocator, "num_used_blocks"):
            raise ConfigError(f"{_what('metric')} kv needs the paged KV cache (its block use is the metric)")
        n = len(engines)
        self.engines, self.config = engines, config
        self.cold_starts = [float(x) for x in cold_start_s] if isinstance(cold_start_s, list) else [cold_start_s] * n
        self.cold_start_s = max(self.cold_starts)  # the longest (all the same outside a fleet)
        self.gpus = list(gpus_per_replica) if isinstance(gpus_per_replica, list) else [gpus_per_replica] * n
        assert len(self.cold_starts) == len(self.gpus) == n
        self.replicas = [Replica(i) for i in range(len(engines))]
        self.timeline = Timeline()
        self._recommendations: deque[tuple[float, int]] = deque()  # (time, raw recommendation), oldest first
        self._events: deque[tuple[float, int]] = deque()  # (time, replicas added (> 0) or removed (< 0))
        for replica in self.replicas[: config.min_replicas]:
            replica.state, replica.paid_since = ACTIVE, 0.0
        self._record(0.0)

    # -- RequestSink ---------------------------------------------------------------------
    def _pick(self) -> Engine:
        active = [self.engines[r.index] for r in self.replicas if r.state == ACTIVE]
        return min(active, key=lambda e: e.load)  # ties: the lowest index, as simcore.router

    def submit(self, request: Request) -> simpy.Event:
        return self._pick().submit(request)

    def send(self, request: Request) -> None:
        self._pick().send(request)

    # -- the policy ----------------------------------------------------------------------
    def _count(self, state: str) -> int:
        return sum(r.state == state for r in self.replicas)

    def _record(self, now: float) -> None:
        row = (now, self._count(ACTIVE), self._count(STARTING), self._count(DRAINING))
        if not self.timeline.rows or self.timeline.rows[-1][1:] != row[1:]:
            self.timeline.rows.append(row)

    def metric(self) -> float:
        """The per-active-replica metric the policy compares with its target."""
        active = [self.engines[r.index] for r in self.replicas if r.state == ACTIVE]
        if self.config.metric == "inflight":
            return sum(e.load for e in active) / len(active)
        return 100.0 * sum(e.policy.allocator.num_used_blocks / e.policy.allocator.num_gpu_blocks
                           for e in active) / len(active)

    def desired(self) -> int:
        cfg = self.config
        active = self._count(ACTIVE)
        ratio = self.metric() / cfg.target
        if abs(ratio - 1.0) <= cfg.tolerance:
            want = active
        else:
            want = math.ceil(active * ratio)
        return max(cfg.min_replicas, min(cfg.max_replicas, want))

    def normalized(self, now: float, raw: int, current: int) -> int:
        """The HPA's behavior on a raw recommendation (module docstring): stabilized over its
        windows, then held to the rate its policies allow; `current` is active + starting. Records
        `raw` (the stabilization reads it at later decisions)."""
        cfg = self.config
        up_cut, down_cut = now - cfg.scale_up_cooldown_s, now - cfg.scale_down_cooldown_s
        up = down = raw
        for t, r in self._recommendations:
            if t > up_cut:
                up = min(up, r)
            if t > down_cut:
                down = max(down, r)
        want = current
        if want < up:
            want = up
        if want > down:
            want = down
        old = min(up_cut, down_cut)  # read at no later decision: the cutoffs only grow
        while self._recommendations and self._recommendations[0][0] <= old:
            self._recommendations.popleft()
        self._recommendations.append((now, raw))
        if want > current:
            start = current - self._changed(now - cfg.scale_up_period_s)
            limit = max(math.ceil(start * (1.0 + cfg.scale_up_percent / 100.0)), start + int(cfg.scale_up_pods))
            want = min(want, max(limit, current), cfg.max_replicas)
        elif want < current:
            start = current - self._changed(now - cfg.scale_down_period_s)
            limit = int(start * (1.0 - cfg.scale_down_percent / 100.0))
            want = max(want, min(limit, current), cfg.min_replicas)
        return want

    def _changed(self, cutoff: float) -> int:
        """Replicas added less those removed by the changes strictly after `cutoff`."""
        return sum(change for t, change in self._events if t > cutoff)

    def _scaled(self, now: float, change: int) -> None:
        old = now - max(self.config.scale_up_period_s, self.config.scale_down_period_s)
        while self._events and self._events[0][0] <= old:
            self._events.popleft()
        self._events.append((now, change))

    def process(self, env: simpy.Environment):
        """The autoscaler's loop (a SimPy process): decide every interval; replicas that drain are
        stopped by their own watcher process once empty."""
        cfg = self.config
        while True:
            yield env.timeout(cfg.interval_s)
            now = env.now
            serving = self._count(ACTIVE) + self._count(STARTING)
            want = self.normalized(now, self.desired(), serving)
            self.timeline.decisions += 1
            if want > serving:
                self._scaled(now, want - serving)
                for replica in self.replicas:
                    if serving >= want:
                        break
                    if replica.state == DRAINING:  # take it back: it is warm
                        replica.state = ACTIVE
                        serving += 1
                    elif replica.state == OFF:
                        replica.state, replica.paid_since = STARTING, now
                        env.process(self._start(env, replica))
                        serving += 1
            elif want < serving and self._count(STARTING) == 0:
                self._scaled(now, want - serving)
                for replica in reversed(self.replicas):
                    if self._count(ACTIVE) <= want:
                        break
                    if replica.state == ACTIVE:
                        replica.state = DRAINING
                        env.process(self._drain(env, replica))
            self._record(now)
            if self._done():
                return

    def _start(self, env: simpy.Environment, replica: Replica):
        yield env.timeout(self.cold_starts[replica.index])
        if replica.state == STARTING:
            replica.state = ACTIVE
            self._record(env.now)

    def _drain(self, env: simpy.Environment, replica: Replica):
        engine = self.engines[replica.index]
        while replica.state == DRAINING and engine.load:
            yield env.timeout(1.0)  # checked each simulated second: the bill rounds to that
        if replica.state == DRAINING:
            replica.state = OFF
            replica.paid_s += env.now - replica.paid_since
            replica.paid_since = None
            self._record(env.now)

    arrivals: Any = None  # the workload's SimPy process (Simulation.env sets it)

    def load_run(self, rows: list[tuple[float, int, int, int]], decisions: int,
                 replicas: list[tuple[str, float, float | None]]) -> None:
        """What another engine core's run of this autoscaler left (simcore/fastcore.py, from
        csrc/fleet.c), set by its owner: the timeline rows, the decisions made, and each
        replica's (state, seconds paid, start of its unpaid stretch or None); `finish` then
        summarises it as after a Python run."""
        assert len(replicas) == len(self.replicas)
        self.timeline = Timeline(list(rows), decisions)
        for replica, (state, paid_s, paid_since) in zip(self.replicas, replicas, strict=True):
            replica.state, replica.paid_s, replica.paid_since = state, paid_s, paid_since

    def _done(self) -> bool:
        """The workload has sent everything and the fleet holds nothing: stop deciding, so the
        simulation can end (its duration is its requests', not this loop's)."""
        return self.arrivals is not None and self.arrivals.processed and not any(e.load for e in self.engines)

    # -- results -------------------------------------------------------------------------
    def finish(self, end_s: float) -> dict[str, Any]:
        """Bill the replicas still up at the end of the run and summarise the fleet."""
        for replica in self.replicas:
            if replica.paid_since is not None:
                replica.paid_s += max(0.0, end_s - replica.paid_since)
                replica.paid_since = None
        self._record(end_s)
        if len(set(self.gpus)) == 1:
            gpu_s = sum(r.paid_s for r in self.replicas) * self.gpus[0]
        else:
            gpu_s = sum(r.paid_s * self.gpus[r.index] for r in self.replicas)
        rows = self.timeline.rows
        ends = [r[0] for r in rows[1:]] + [max(end_s, rows[-1][0])]
        active_s = sum((b - a[0]) * a[1] for a, b in zip(rows, ends, strict=True))
        return {
            "gpu_hours": gpu_s / 3600.0,
            "mean_active_replicas": active_s / end_s if end_s > 0 else float(rows[0][1]),
            "peak_active_replicas": max(r[1] for r in rows),
            "peak_paid_replicas": max(r[1] + r[2] + r[3] for r in rows),
            "cold_start_s": self.cold_start_s,
            "decisions": self.timeline.decisions,
            "timeline": [list(r) for r in rows],
        }


def hourly_attainment(arrival_s, ttft_s, tpot_s, ttft_slo_ms: float, tpot_slo_ms: float | None,
                      hour_s: float = 3600.0) -> list[dict[str, Any]]:
    """Per hour of arrival: requests, and the share meeting the TTFT SLO (and TPOT where given;
    a one-token answer has no TPOT and meets it). Rejected requests (no TTFT) miss. The same
    count as a run's records keep as rows leave (simcore.records.AttainmentTally)."""
    import numpy as np

    from kvsim.simcore.records import AttainmentTally

    tally = AttainmentTally(hour_s, ttft_slo_ms, tpot_slo_ms)
    tally.add(*(np.asarray(a, dtype=float) for a in (arrival_s, ttft_s, tpot_s)))
    return [{k: row[k] for k in ("hour", "requests", "attainment")} for row in tally.rows()]


def run_attainment(result, ttft_slo_ms: float, tpot_slo_ms: float | None,
                   hour_s: float) -> tuple[float | None, list[dict[str, Any]]]:
    """(share of a run's requests meeting the SLOs, or None without requests; the hourly rows).
    From the counts the run kept as its rows left (`attainment=` of simcore.simulate.prepare:
    any number of requests), else from its kept rows (at most simcore.records.REQUEST_ROWS_CAP)."""
    from kvsim.simcore.errors import KvsimError
    from kvsim.simcore.records import AttainmentTally, derived_latencies

    records = result.records
    tally = records.attainment
    if tally is None or not tally.matches(hour_s, ttft_slo_ms, tpot_slo_ms):
        if not records.kept:
            raise KvsimError(f"SLO attainment of a run of more than {records.cap:,} requests is counted while it "
                             "runs: give the SLOs and hour before it (simulate(..., attainment=...))")
        cols = records.columns()
        ttft, _, tpot = derived_latencies(cols)
        tally = AttainmentTally(hour_s, ttft_slo_ms, tpot_slo_ms)
        tally.add(cols["arrival_s"], ttft, tpot)
    hours = [{k: row[k] for k in ("hour", "requests", "attainment")} for row in tally.rows()]
    n, met = int(tally.requests.sum()), int(tally.met.sum())
    return (met / n if n else None), hours


def hour_of_arrival(arrival: dict[str, Any]) -> float:
    """The length of an "hour" of a workload, from its arrival's description: a scheduled (diurnal)
    day's period / steps (kvsim's `diurnal` compresses a day into one hour: 150 s), else 3600 s."""
    if arrival.get("period_s") and arrival.get("schedule"):
        return float(arrival["period_s"]) / len(arrival["schedule"])
    return 3600.0


__all__ = ["AutoscaleConfig", "AutoscalingRouter", "METRICS", "hour_of_arrival", "hourly_attainment",
           "run_attainment"]
