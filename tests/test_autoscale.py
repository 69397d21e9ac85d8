"""Autoscaling (simcore/autoscale.py, `kvsim run --autoscale`): replicas follow a diurnal load,
cold starts are paid and cost SLO attainment around the ramps, draining loses no request."""

from __future__ import annotations

import json
from collections import deque

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.profiles import default_profile
from kvsim.simcore import ccore
from kvsim.simcore.autoscale import AutoscaleConfig, hourly_attainment
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.records import derived_latencies
from kvsim.simcore.simulate import prepare
from kvsim.simcore.specs import EngineConfig

# mean_rate: high enough that one H100 misses the SLO at the peak, so a slow cold start shows (12
# req/s before vllm-v1's per-sequence host term became V1's measured 0.015 ms from Vidur's 0.038)
DIURNAL = """name: diurnal-small
num_requests: 3000
arrival: {process: diurnal, mean_rate: 16.0, peak_to_trough: 4.0, period_s: 250, steps: 10}
prompt_len: {dist: lognormal, mean: 161, cv: 1.0}
output_len: {dist: lognormal, mean: 338, cv: 1.0}
"""
FAST = {"target": 24.0, "interval_s": 5.0, "warmup_s": 0.0, "model_load_gbps": 100.0, "scale_down_cooldown_s": 30.0}


@pytest.fixture(scope="module")
def workload_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("wl") / "diurnal-small.yaml"
    path.write_text(DIURNAL)
    return path


def _run(workload_file, provisioning_s: float):
    from kvsim.workloads import load_workload

    model, gpu = get_model("llama3-8b"), get_gpu("H100")
    wl = load_workload(str(workload_file), {}, max_model_len=8192)
    scaling = AutoscaleConfig(min_replicas=1, max_replicas=4, provisioning_s=provisioning_s, **FAST)
    sim = prepare(model, gpu, EngineConfig(), wl, default_profile(gpu, model, 1), seed=3, autoscale=scaling)
    return sim, sim.run()


def _attainment(result) -> float:
    cols = result.records.columns()
    ttft, _, tpot = derived_latencies(cols)
    hours = hourly_attainment(cols["arrival_s"], ttft, tpot, 200.0, 15.0, 25.0)
    return sum(h["requests"] * h["attainment"] for h in hours) / sum(h["requests"] for h in hours)


@pytest.fixture(scope="module")
def quick_and_slow(workload_file):
    return _run(workload_file, 0.0), _run(workload_file, 150.0)


def test_replicas_follow_the_load_within_bounds_and_lose_no_request(quick_and_slow):
    (sim, result), _ = quick_and_slow
    fleet = result.record["autoscale"]
    assert result.summary["completed"] == 3000  # draining replicas finished what they held
    assert all(1 <= active <= 4 and active + starting + draining <= 4 for _, active, starting, draining in fleet["timeline"])
    assert fleet["peak_active_replicas"] > 1  # it scaled up for the peak ...
    assert fleet["timeline"][-1][1] < fleet["peak_active_replicas"]  # ... and back down after it
    assert 1.0 <= fleet["mean_active_replicas"] <= fleet["peak_active_replicas"]
    duration = result.summary["duration_s"]
    assert duration / 3600 <= fleet["gpu_hours"] <= 4 * duration / 3600 + 1e-9
    assert result.record["engine_core"] == ("c" if ccore.library() else "python")  # csrc/fleet.c autoscales


def test_a_longer_cold_start_lowers_attainment_around_the_ramp(quick_and_slow):
    (_, quick), (_, slow) = quick_and_slow
    assert slow.record["autoscale"]["cold_start_s"] > quick.record["autoscale"]["cold_start_s"] + 149
    assert _attainment(slow) < _attainment(quick) - 0.1


def test_the_same_seed_gives_the_same_fleet(workload_file, quick_and_slow):
    (_, first), _ = quick_and_slow
    _, again = _run(workload_file, 0.0)
    assert again.record["autoscale"]["timeline"] == first.record["autoscale"]["timeline"]
    assert again.summary == first.summary


def test_the_hpa_rule():
    """desired = ceil(active x metric / target), unchanged within the tolerance, clamped."""
    from kvsim.simcore.autoscale import AutoscalingRouter

    class Fake:
        def __init__(self, load):
            self.load = load

    def router(loads, **kw):
        r = AutoscalingRouter.__new__(AutoscalingRouter)
        r.engines = [Fake(x) for x in loads]
        r.config = AutoscaleConfig(min_replicas=1, max_replicas=8, target=10.0, **kw)
        from kvsim.simcore.autoscale import ACTIVE, Replica

        r.replicas = [Replica(i, ACTIVE) for i in range(len(loads))]
        return r

    assert router([30, 30]).desired() == 6
    assert router([10.5, 10.5]).desired() == 2  # within 10%: stay
    assert router([0, 0]).desired() == 1
    assert router([200, 200]).desired() == 8


def test_the_hpa_behavior_by_hand():
    """AutoscalingRouter.normalized, the HPA's behavior, on raw recommendations by hand (kubernetes
    horizontal.go): the knobs keep their names, scale_up/down_cooldown_s now the stabilization
    windows, and the rate policies per period."""
    from kvsim.simcore.autoscale import AutoscalingRouter

    def hpa(**kw):
        r = AutoscalingRouter.__new__(AutoscalingRouter)
        r.config = AutoscaleConfig(min_replicas=1, max_replicas=20, **kw)
        r._recommendations, r._events = deque(), deque()
        return r

    down = hpa(scale_down_cooldown_s=60.0)  # scale-down window 60 s: the highest of the last 60 s
    assert [down.normalized(t, raw, 6) for t, raw in ((0.0, 6), (15.0, 2), (30.0, 3), (45.0, 1))] == [6, 6, 6, 6]
    assert down.normalized(60.0, 1, 6) == 3  # (0, 60] holds 2, 3, 1 and now 1: the 6 at t = 0 is out
    assert down.normalized(75.0, 1, 3) == 3 and down.normalized(90.0, 1, 3) == 1
    up = hpa(scale_up_cooldown_s=30.0)  # scale-up window 30 s: the lowest of the last 30 s
    assert [up.normalized(t, raw, 2) for t, raw in ((0.0, 2), (15.0, 9), (30.0, 9))] == [2, 2, 6]
    # ... and at t = 30 the rate held 9 to 2 + 4 pods (> 2 x 100%) per 15 s; the next period allows doubling
    up._scaled(30.0, 4)
    assert up.normalized(45.0, 9, 6) == 9  # start 6: max(12, 10), the 9 wanted
    rate = hpa(scale_up_percent=50.0, scale_up_pods=1, scale_up_period_s=60.0, scale_down_percent=50.0,
               scale_down_period_s=60.0, scale_down_cooldown_s=0.0)
    assert rate.normalized(0.0, 20, 4) == 6  # ceil(4 x 1.5) beats 4 + 1
    rate._scaled(0.0, 2)
    assert rate.normalized(30.0, 20, 6) == 6  # the period still holds those 2: start 4
    assert rate.normalized(60.0, 20, 6) == 9  # period over: ceil(6 x 1.5)
    rate._scaled(60.0, 3)
    assert rate.normalized(61.0, 1, 9) == 3  # down 50% of the period's start (6: 9 less the 3 added)


@pytest.mark.parametrize(("args", "words"), [
    (["--min-replicas", "2"], "applies only with --autoscale"),
    (["--autoscale", "--dp", "2"], "not --dp"),
    (["--autoscale", "--min-replicas", "3", "--max-replicas", "2"], "--max-replicas"),
    (["--autoscale", "--autoscale-config", "{bad"], "not JSON"),
    (["--autoscale", "--autoscale-config", '{"colour": 1}'], "unknown key 'colour'"),
    (["--autoscale", "--autoscale-config", '{"metric": "gpu"}'], "--autoscale-config: metric"),
    (["--autoscale", "--provisioning-delay", "-1"], "--provisioning-delay"),
])
def test_bad_autoscale_flags_are_one_line(args, words):
    result = CliRunner().invoke(app, ["run", "--num-requests", "10", *args])
    assert result.exit_code != 0 and result.stderr.startswith("kvsim: error: ") and words in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1


def test_autoscale_config_validates():
    with pytest.raises(ConfigError):
        AutoscaleConfig(target=0)
    with pytest.raises(ConfigError):
        AutoscaleConfig(metric="kv", target=150)


def test_the_cli_reports_the_fleet_against_static_ones(workload_file, tmp_path):
    out = tmp_path / "as"
    config = json.dumps({**FAST, "ttft_slo_ms": 200, "tpot_slo_ms": 15, "price_usd_per_gpu_hour": 2.0})
    result = CliRunner().invoke(app, ["run", "--workload", str(workload_file), "--num-requests", "1200", "--autoscale",
                                      "--max-replicas", "3", "--provisioning-delay", "0", "--autoscale-config", config,
                                      "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "Autoscaling" in result.stdout and "Static fleet, the peak" in result.stdout
    assert "Autoscaling vs the static peak fleet:" in result.stdout
    doc = json.loads((out / "summary.json").read_text())
    fleet = doc["autoscale"]
    assert fleet["hour_s"] == 25.0 and len(fleet["hourly"]) >= 4
    assert [row["sized_for"] for row in fleet["static"]] == ["the peak", "the mean"]
    assert fleet["usd"] == pytest.approx(2.0 * fleet["gpu_hours"])
    assert (out / "autoscale.png").stat().st_size > 5000


def test_plan_autoscale_finds_a_policy_no_dearer_than_the_static_fleet(tmp_path):
    """`kvsim plan --autoscale`: the answer meets the attainment goal and costs no more GPU-hours than the
    smallest static fleet that meets it (which is always a candidate)."""
    path = tmp_path / "day.yaml"
    path.write_text(DIURNAL.replace("num_requests: 3000", "num_requests: 900").replace("period_s: 250", "period_s: 80"))
    result = CliRunner().invoke(app, ["plan", "--autoscale", "--model", "llama3-8b", "--gpu", "H100", "--tp", "1",
                                      "--workload", str(path), "--slo-ttft-p95-ms", "200", "--slo-tpot-p95-ms", "15",
                                      "--attainment", "0.9", "--max-replicas", "3", "--provisioning-delay", "0",
                                      "--json"])
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    answer, static = plan["answer"], plan["static"]
    assert answer["attainment"] >= 0.9 and static["attainment"] >= 0.9
    assert answer["gpu_hours"] <= static["gpu_hours"] + 1e-12
    assert {row["kind"] for row in plan["tried"]} == {"static", "autoscale"}


def test_plan_autoscale_needs_one_deployment():
    result = CliRunner().invoke(app, ["plan", "--autoscale", "--gpu", "H100,H200", "--tp", "1"])
    assert result.exit_code != 0 and "exactly one --gpu" in result.stderr
    result = CliRunner().invoke(app, ["plan", "--attainment", "0.9", "--rate", "2"])
    assert result.exit_code != 0 and "applies only with --autoscale" in result.stderr


def test_rate_scales_a_diurnal_day_and_keeps_its_shape():
    """--rate on a scheduled workload sets the day's mean rate; the curve (peak / trough 4) stays."""
    from kvsim.workloads import load_workload

    day = load_workload("diurnal", {"rate": 8.0}, max_model_len=8192).describe()["arrival"]
    assert day["process"] == "piecewise" and day["mean_rate"] == pytest.approx(8.0)
    rates = [r for _, r in day["schedule"]]
    base = [r for _, r in load_workload("diurnal", {}, max_model_len=8192).describe()["arrival"]["schedule"]]
    assert max(rates) / min(rates) == pytest.approx(max(base) / min(base))
    gamma = load_workload("diurnal", {"rate": 8.0, "burstiness": 0.5}, max_model_len=8192).describe()["arrival"]
    assert gamma["process"] == "gamma"  # with a burstiness the user asks for Gamma arrivals, as before


def test_a_hand_computed_scale_up_timeline():
    """Trigger, provisioning, load, warm-up and the first request served, by hand. One replica gets 6
    long requests at t = 1 s; the autoscaler (every 10 s, target 2 in flight) sees 6 at t = 10 and
    starts a second replica (max 2). It serves from 10 + cold start, cold start = 5 s provisioning +
    weights / 1 GB/s + 3 s warm-up. A request at 1 s after that goes to the new, idle replica and is
    scheduled at once; one sent 1 s before it becomes active goes to the busy first replica."""
    from kvsim.simcore.catalog import GPUS, MODELS
    from kvsim.simcore.memory import plan_memory
    from tests.helpers import ListWorkload, flat_profile, req

    tiny, h100 = MODELS["tiny"], GPUS["H100-SXM-80GB"]
    weights = plan_memory(tiny, h100, EngineConfig()).weights_bytes_per_gpu
    cold = 5.0 + weights / 1e9 + 3.0
    up = 10.0 + cold
    policy = AutoscaleConfig(min_replicas=1, max_replicas=2, target=2.0, interval_s=10.0, provisioning_s=5.0,
                             model_load_gbps=1.0, warmup_s=3.0, scale_down_cooldown_s=1e6)
    requests = [req(i, 1.0, 8, 1500) for i in range(6)]  # 1,500 steps of 20 ms each: busy until t = 31
    requests += [req(6, up - 1.0, 8, 4), req(7, up + 1.0, 8, 4)]
    sim = prepare(tiny, h100, EngineConfig(), ListWorkload(requests), flat_profile(linear_ms=10.0), autoscale=policy)
    result = sim.run()
    fleet = result.record["autoscale"]
    assert fleet["cold_start_s"] == pytest.approx(cold)
    assert fleet["timeline"][:3] == [[0.0, 1, 0, 0], [10.0, 1, 1, 0], [pytest.approx(up), 2, 0, 0]]
    rows = result.requests
    by_id = {int(r.request_id): r for r in rows.itertuples()}
    assert by_id[6].replica == 0 and by_id[7].replica == 1
    assert by_id[7].first_scheduled_s == pytest.approx(up + 1.0)
    assert (rows["status"] == "finished").all()
    # paid: replica 0 for the whole run, replica 1 from its start (t = 10) to the end
    end = float(rows["finish_s"].max())
    assert fleet["gpu_hours"] == pytest.approx((end + (end - 10.0)) / 3600.0)


def test_an_autoscaler_interval_of_1e_300_is_refused():
    result = CliRunner().invoke(app, ["run", "--num-requests", "5", "--autoscale", "--autoscale-config",
                                      '{"interval_s": 1e-300}'])
    assert result.exit_code == 2 and "interval_s must be" in result.stderr and result.stderr.count("\n") == 1


def test_a_day_past_the_kept_rows_is_planned_and_run_as_with_them(tmp_path, monkeypatch):
    """A day of more requests than the rows kept in memory (a tiny cap here; 2**19 really) counts its
    hourly attainment as requests leave: `plan --autoscale` gives the same answer and `run
    --autoscale` the same Autoscaling block (attainment, hourly, static fleets) as with every row
    kept. (Both refused such a day before.)"""
    import kvsim.simcore.records as records

    path = tmp_path / "day.yaml"
    path.write_text(DIURNAL.replace("num_requests: 3000", "num_requests: 900").replace("period_s: 250", "period_s: 80"))
    plan = ["plan", "--autoscale", "--model", "llama3-8b", "--gpu", "H100", "--tp", "1", "--workload", str(path),
            "--slo-ttft-p95-ms", "200", "--slo-tpot-p95-ms", "15", "--attainment", "0.9", "--max-replicas", "3",
            "--provisioning-delay", "0", "--json"]
    run = ["run", "--workload", str(path), "--autoscale", "--max-replicas", "3", "--provisioning-delay", "0",
           "--no-error-bars", "--autoscale-config", json.dumps({**FAST, "ttft_slo_ms": 50, "tpot_slo_ms": 9})]
    outputs = []
    for capped in (False, True):
        if capped:
            monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 200)
            monkeypatch.setattr(records, "_ROW_CHUNK", 64)
        planned = CliRunner().invoke(app, plan)
        assert planned.exit_code == 0, planned.stderr
        ran = CliRunner().invoke(app, run)
        assert ran.exit_code == 0, ran.stderr
        block = ran.stdout[ran.stdout.index("Autoscaling---"): ran.stdout.index("Simulated in")]
        # the pool's full-batch capacity needs every finished request's lengths (simcore.full_batch): kept rows only
        block = "\n".join(line for line in block.splitlines()
                          if not line.startswith(("Full-batch capacity per replica", "Peak offered rate")))
        outputs.append((json.loads(planned.stdout), block))
    assert outputs[0] == outputs[1]
    assert "Hourly attainment" in outputs[1][1] and outputs[1][0]["answer"] is not None
    assert "SLO attainment (%):                      100.0" not in outputs[1][1], "some requests should miss"
