"""Heterogeneous fleets and autoscaling in the compiled core (simcore/csrc/fleet.c) against the
Python engine's reference mode (--exact-steps): each replica of a fleet priced and sized by its own
group, and the autoscaler's decisions, cold starts and drains, on random small cases. Request
tables must match as in tests/test_fastcore_equivalence.py (token counts exactly, timestamps within
1e-9 s), pooled ITLs, summaries and step totals likewise, and the autoscaler's record (timeline,
decisions, GPU-hours) exactly."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kvsim.profiles import default_profile
from kvsim.simcore import ccore
from kvsim.simcore.autoscale import AutoscaleConfig
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.config import resolve
from kvsim.simcore.simulate import prepare
from kvsim.simcore.specs import EngineConfig
from tests.helpers import assert_cores_agree, assert_same_requests
from tests.test_fastcore_equivalence import ArraysWorkload, _bursty_arrivals, _random_case

TINY = MODELS["tiny"]
H100, H200 = GPUS["H100-SXM-80GB"], GPUS["H200-141GB"]

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


def _both(make, context: str):
    """Run the simulation `make(engine_core, exact_steps)` prepares in C and in the Python
    reference; assert they agree; return both results."""
    core = make("c", False).run()
    exact = make("python", True).run()
    assert_cores_agree(core, exact, context)
    assert core.record.get("autoscale") == exact.record.get("autoscale"), context
    return core, exact


def _groups(rng: np.random.Generator, config: EngineConfig) -> list:
    """Two groups of the tiny model: the case's config on H100s, and another cache size and
    batch limit on H200s (each its own roofline profile)."""
    mml = config.max_model_len
    min_blocks = -(-mml // config.block_size)
    other = dataclasses.replace(config, num_gpu_blocks_override=min_blocks + int(rng.integers(0, 6 * min_blocks)),
                                max_num_seqs=int(rng.integers(1, 12)))
    other = dataclasses.replace(other, max_num_batched_tokens=max(other.max_num_batched_tokens, other.max_num_seqs))
    return [(resolve(TINY, H100, config), default_profile(H100, TINY, 1), int(rng.integers(1, 3))),
            (resolve(TINY, H200, other), default_profile(H200, TINY, 1), int(rng.integers(1, 3)))]


@pytest.mark.parametrize("router", ["round-robin", "least-loaded"])
def test_heterogeneous_fleets_match(router):
    """A fleet: each replica its own KV cache, batch limits and step prices, behind either router;
    every request lands on the same replica with the same timeline in both cores."""
    used = set()
    for case in range(12):
        rng = np.random.default_rng(5000 + case)
        config, workload = _random_case(rng)
        if case % 3 == 2:
            num = 100
            mml = config.max_model_len
            workload = ArraysWorkload(_bursty_arrivals(rng, num, mean_gap_s=0.0005, zero_share=0.2),
                                      rng.integers(1, mml // 2, size=num), rng.integers(1, mml // 2, size=num))
        groups = _groups(rng, dataclasses.replace(config, router=router))

        def make(core, exact, groups=groups, workload=workload, case=case):
            return prepare(TINY, H100, groups[0][0], workload, groups[0][1], seed=case, fleet=groups,
                           engine_core=core, exact_steps=exact)

        core, _ = _both(make, f"fleet {router} case {case}")
        if core.records.kept and len(core.requests):
            used.update(core.requests["replica"].unique().tolist())
    assert len(used) >= 3, "the cases should reach replicas of both groups"


def _policy(rng: np.random.Generator, max_replicas: int) -> AutoscaleConfig:
    metric = str(rng.choice(["inflight", "kv"]))
    return AutoscaleConfig(
        min_replicas=int(rng.integers(1, max_replicas + 1)) if rng.random() < 0.3 else 1, max_replicas=max_replicas,
        metric=metric, target=float(rng.choice([1.0, 2.0, 4.0])) if metric == "inflight" else float(rng.choice([5.0, 20.0, 50.0])),
        interval_s=float(rng.choice([0.1, 0.15, 0.3])), tolerance=float(rng.choice([0.0, 0.1])),
        scale_up_cooldown_s=float(rng.choice([0.0, 0.2])), scale_down_cooldown_s=float(rng.choice([0.0, 0.3, 1.0])),
        provisioning_s=float(rng.choice([0.0, 0.05, 0.4])), model_load_gbps=1000.0, warmup_s=float(rng.choice([0.0, 0.1])),
        # the HPA's rate policies: its defaults (15 s periods, wider than these days) or tight ones that bind
        scale_up_percent=float(rng.choice([100.0, 50.0, 0.0])), scale_up_pods=int(rng.choice([4, 1, 0])),
        scale_up_period_s=float(rng.choice([15.0, 0.35])), scale_down_percent=float(rng.choice([100.0, 50.0, 34.0])),
        scale_down_period_s=float(rng.choice([15.0, 0.35])))


def _day(rng: np.random.Generator, mml: int) -> ArraysWorkload:
    """A busy stretch between two quiet ones (seconds long, so the autoscaler decides many times)."""
    quiet, busy = rng.exponential(0.05, size=30), rng.exponential(0.002, size=150)
    gaps = np.concatenate([quiet, busy, quiet[:20]])
    gaps[rng.random(len(gaps)) < 0.1] = 0.0
    arrivals = np.cumsum(gaps) - gaps[0]
    num = len(arrivals)
    return ArraysWorkload(arrivals, rng.integers(1, mml // 2, size=num), rng.integers(1, mml // 2, size=num))


@pytest.mark.parametrize("block", range(3))
def test_autoscaling_matches(block):
    """The HPA decision every interval, cold starts, drains (polled each second) and the router over
    the active replicas only: the same requests on the same replicas at the same times, the same
    timeline, decisions and bills."""
    scaled_up = drained = 0
    for case in range(8 * block, 8 * block + 8):
        rng = np.random.default_rng(6000 + case)
        config, _ = _random_case(rng)
        workload = _day(rng, config.max_model_len)
        policy = _policy(rng, int(rng.integers(1, 5)))
        cfg = resolve(TINY, H100, config)

        def make(core, exact, cfg=cfg, workload=workload, policy=policy, case=case):
            return prepare(TINY, H100, cfg, workload, default_profile(H100, TINY, 1), seed=case, autoscale=policy,
                           engine_core=core, exact_steps=exact)

        core, _ = _both(make, f"autoscale case {case} {policy}")
        rows = core.record["autoscale"]["timeline"]
        scaled_up += any(r[2] for r in rows)
        drained += any(r[3] for r in rows)
    assert scaled_up and drained, "the cases should start and drain replicas"


def test_autoscaling_a_closed_loop_matches():
    """Clients that wait for their answers behind an autoscaled pool: the autoscaler starts before
    them and stops once the last client is done."""
    from kvsim.workloads.arrivals import ClosedLoop
    from kvsim.workloads.lengths import Uniform
    from kvsim.workloads.spec import WorkloadSpec

    for case in range(4):
        rng = np.random.default_rng(7000 + case)
        config, _ = _random_case(rng)
        mml = config.max_model_len
        loop = ClosedLoop(concurrency=int(rng.integers(2, 16)), think_time_s=float(rng.choice([0.0, 0.01])),
                          think_time_dist="exponential")
        spec = WorkloadSpec(name="clients", num_requests=200, arrival=loop, prompt_len=Uniform(1, mml // 2),
                            output_len=Uniform(1, mml))
        policy = _policy(rng, 3)
        cfg = resolve(TINY, H100, config)

        def make(core, exact, cfg=cfg, spec=spec, policy=policy, case=case):
            return prepare(TINY, H100, cfg, spec, default_profile(H100, TINY, 1), seed=case, autoscale=policy,
                           engine_core=core, exact_steps=exact)

        _both(make, f"closed loop autoscale case {case}")


def test_a_hand_computed_scale_up_timeline_in_the_core():
    """tests/test_autoscale.py's timeline, by hand, in both cores. One replica gets 6 long requests
    at t = 1 s; the autoscaler (every 10 s, target 2 in flight) sees 6 at t = 10 and starts a
    second replica (max 2), which serves from 10 + cold start (5 s provisioning + weights / 1 GB/s +
    3 s warm-up). A request 1 s after that goes to the new, idle replica and is scheduled at once;
    one sent 1 s before it becomes active goes to the busy first replica."""
    from kvsim.simcore.memory import plan_memory
    from tests.helpers import flat_profile

    weights = plan_memory(TINY, H100, EngineConfig()).weights_bytes_per_gpu
    cold = 5.0 + weights / 1e9 + 3.0
    up = 10.0 + cold
    policy = AutoscaleConfig(min_replicas=1, max_replicas=2, target=2.0, interval_s=10.0, provisioning_s=5.0,
                             model_load_gbps=1.0, warmup_s=3.0, scale_down_cooldown_s=1e6)
    workload = ArraysWorkload([1.0] * 6 + [up - 1.0, up + 1.0], [8] * 8, [1500] * 6 + [4, 4])

    def make(core, exact):
        return prepare(TINY, H100, EngineConfig(), workload, flat_profile(linear_ms=10.0), autoscale=policy,
                       engine_core=core, exact_steps=exact)

    result, _ = _both(make, "hand-computed timeline")
    fleet = result.record["autoscale"]
    assert fleet["cold_start_s"] == pytest.approx(cold)
    assert fleet["timeline"][:3] == [[0.0, 1, 0, 0], [10.0, 1, 1, 0], [pytest.approx(up), 2, 0, 0]]
    by_id = {int(r.request_id): r for r in result.requests.itertuples()}
    assert by_id[6].replica == 0 and by_id[7].replica == 1
    assert by_id[7].first_scheduled_s == pytest.approx(up + 1.0)
    assert (result.requests["status"] == "finished").all()
    end = float(result.requests["finish_s"].max())
    assert fleet["gpu_hours"] == pytest.approx((end + (end - 10.0)) / 3600.0)


def test_draining_in_the_core_loses_no_request():
    """Scale-down drains: a draining replica takes no new request, finishes those it holds, and
    is billed until it is empty (to the next whole second of polling)."""
    rng = np.random.default_rng(11)
    arrivals = np.concatenate([np.linspace(0.0, 1.0, 200), np.linspace(3.0, 6.0, 20)])
    workload = ArraysWorkload(arrivals, rng.integers(8, 32, size=len(arrivals)), rng.integers(8, 64, size=len(arrivals)))
    policy = AutoscaleConfig(min_replicas=1, max_replicas=4, target=4.0, interval_s=0.2, provisioning_s=0.0,
                             model_load_gbps=1000.0, warmup_s=0.0, scale_down_cooldown_s=0.4)
    cfg = resolve(TINY, H100, EngineConfig(max_model_len=128))

    def make(core, exact):
        return prepare(TINY, H100, cfg, workload, default_profile(H100, TINY, 1), autoscale=policy,
                       engine_core=core, exact_steps=exact)

    result, _ = _both(make, "drain")
    rows = result.record["autoscale"]["timeline"]
    assert any(r[3] for r in rows) and rows[-1][3] == 0
    assert result.summary["completed"] == len(arrivals)


def test_autoscaling_a_fleet_matches_and_scales_groups_in_their_order():
    """`--fleet A,B --autoscale`: the pool is the fleet in its order (simcore.autoscale's docstring:
    cluster-autoscaler's priority expander). Six long requests on the one H100 replica; the HPA
    (target 3 in flight) wants 2 replicas and starts the first TP-2 H200 replica, never the second;
    its cold start loads its own weights per GPU (half the H100's at TP 2); the request after it is
    up goes to it. Both cores agree on every request and the bill of each replica."""
    from kvsim.simcore.fleet import resolve_fleet
    from tests.helpers import flat_profile

    groups = [(cfg, flat_profile(linear_ms=10.0, tp=cfg.engine.tensor_parallel_size), n)  # 20 ms steps
              for cfg, _, n in resolve_fleet(TINY, [("H100-SXM-80GB", 1, 1), ("H200-141GB", 2, 2)], EngineConfig())]
    policy = AutoscaleConfig(min_replicas=1, max_replicas=3, target=3.0, interval_s=10.0, provisioning_s=5.0,
                             model_load_gbps=0.001, warmup_s=0.0, scale_down_cooldown_s=1e6)
    cold = [policy.cold_start_s(g.memory.weights_bytes_per_gpu) for g, _, _ in groups]
    assert cold[1] < cold[0]  # TP 2: each GPU loads half the weights
    up = 10.0 + cold[1]
    workload = ArraysWorkload([1.0] * 6 + [up + 1.0], [8] * 7, [1500] * 6 + [4])

    def make(core, exact):
        return prepare(TINY, H100, groups[0][0], workload, groups[0][1], fleet=groups, autoscale=policy,
                       engine_core=core, exact_steps=exact)

    result, _ = _both(make, "fleet autoscale")
    fleet = result.record["autoscale"]
    assert fleet["timeline"][:3] == [[0.0, 1, 0, 0], [10.0, 1, 1, 0], [pytest.approx(up), 2, 0, 0]]
    by_id = {int(r.request_id): r for r in result.requests.itertuples()}
    assert by_id[6].replica == 1 and by_id[6].first_scheduled_s == pytest.approx(up + 1.0)
    end = float(result.requests["finish_s"].max())
    assert fleet["replica_hours"] == [pytest.approx(end / 3600), pytest.approx((end - 10.0) / 3600), 0.0]
    assert fleet["gpu_hours"] == pytest.approx((end + 2 * (end - 10.0)) / 3600)  # the H200 replica has 2 GPUs


def test_autoscaling_speculative_replicas_matches():
    """Speculative decoding (csrc/spec.c) on autoscaled replicas: each replica drafts from its own
    acceptance stream whether it is up from the start or started later."""
    from kvsim.simcore.speculative import parse_speculative_config

    for case in range(4):
        rng = np.random.default_rng(8000 + case)
        config, _ = _random_case(rng)
        spec = parse_speculative_config(json.dumps({"method": "eagle3", "num_speculative_tokens": int(rng.integers(1, 5)),
                                                    "acceptance_rate": float(rng.random())}))
        config = dataclasses.replace(config, enable_chunked_prefill=True, speculative_config=spec,
                                     max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_num_seqs))
        workload = _day(rng, config.max_model_len)
        policy = _policy(rng, 3)
        cfg = resolve(TINY, H100, config)

        def make(core, exact, cfg=cfg, workload=workload, policy=policy, case=case):
            return prepare(TINY, H100, cfg, workload, default_profile(H100, TINY, 1), seed=case, autoscale=policy,
                           engine_core=core, exact_steps=exact)

        core, exact = _both(make, f"speculative autoscale case {case}")
        assert core.summary["spec_num_accepted_tokens"] == exact.summary["spec_num_accepted_tokens"]


@pytest.mark.parametrize("metric", ["inflight", "kv"])
def test_the_python_fast_path_autoscales_as_the_reference(metric):
    """The Python engine's decode spans change no replica's load mid-span, but a span applies its KV
    only at its end: replicas behind a kv-metric autoscaler step one event per step, so both Python
    modes (and the compiled core) see the same KV use at every decision."""
    changed = 0
    for case in range(4):
        rng = np.random.default_rng(9000 + case)
        config, _ = _random_case(rng)
        workload = _day(rng, config.max_model_len)
        policy = dataclasses.replace(_policy(rng, 3), metric=metric, target=20.0 if metric == "kv" else 2.0)
        cfg = resolve(TINY, H100, config)
        fast, exact = (prepare(TINY, H100, cfg, workload, default_profile(H100, TINY, 1), seed=case, autoscale=policy,
                               engine_core="python", exact_steps=ex).run() for ex in (False, True))
        assert fast.record["autoscale"] == exact.record["autoscale"], case
        assert_same_requests(fast.requests, exact.requests, f"fast path {metric} case {case}")
        changed += len(fast.record["autoscale"]["timeline"]) > 1
    assert changed, "the cases should scale"


def test_the_hpa_default_behavior_by_hand_in_both_cores():
    """Kubernetes' default HPA behavior (kubernetes.io "Default Behavior": scale up by the larger of
    100% and 4 pods per 15 s, no scale-up window; scale down after a 300 s stabilization window),
    by hand. 40 long requests (2,000 steps of 20 ms: busy until ~41 s) on one replica; the HPA
    (every 5 s, target 4 in flight, max 8; 100 s cold starts) wants 40 / 4 = 10 -> 8 replicas.
    t = 5: 1 -> 5 (1 + 4 pods beats 2 x 1). t = 10, 15: the period still holds those 4 (start 1),
    no more. t = 20: the event at t = 5 is not strictly within (5, 20] -> start 5: limit max(10, 9),
    8 (max). The load ends at ~41 s; every later recommendation is 1, but the window keeps the
    highest of the last 300 s: the last 8 was at t = 40, so the scale-down to 1 comes at t = 340
    (excluded once exactly 300 s old). (The cooldowns this replaced started all 7 at t = 5 and
    drained them at 5 + 300 = 305 s, timed from the last change, not from the last high
    recommendation.)"""
    from tests.helpers import flat_profile

    policy = AutoscaleConfig(min_replicas=1, max_replicas=8, target=4.0, interval_s=5.0, provisioning_s=100.0,
                             model_load_gbps=1000.0, warmup_s=0.0)  # behavior: the defaults
    assert (policy.scale_down_cooldown_s, policy.scale_up_percent, policy.scale_up_pods, policy.scale_up_period_s) == \
        (300.0, 100.0, 4, 15.0)
    trickle = [7.0 + 10.0 * k for k in range(35)]  # short requests between decisions: the run goes on to 347 s
    workload = ArraysWorkload([1.0] * 40 + trickle, [8] * (40 + len(trickle)), [2000] * 40 + [2] * len(trickle))

    def make(core, exact):
        return prepare(TINY, H100, EngineConfig(), workload, flat_profile(linear_ms=10.0), autoscale=policy,
                       engine_core=core, exact_steps=exact)

    result, _ = _both(make, "HPA default behavior")
    fleet = result.record["autoscale"]
    cold = fleet["cold_start_s"]
    rows = fleet["timeline"]
    assert rows[:3] == [[0.0, 1, 0, 0], [5.0, 1, 4, 0], [20.0, 1, 7, 0]]
    busy_until = float(result.requests["finish_s"][result.requests["num_positions"] == 2000].max())
    assert 40.0 < busy_until < 45.0
    full = next(r for r in rows if r[1] == 8)
    assert full[0] == pytest.approx(20.0 + cold)
    after = rows[rows.index(full) + 1]
    assert after[:2] == [340.0, 1] and after[3] == 7  # down to 1 at once (scale-down policy: 100% per 15 s)
    assert rows[-1][1:] == [1, 0, 0] and all(r[0] == 340.0 for r in rows[rows.index(after):-1])
    assert (result.requests["status"] == "finished").all()
