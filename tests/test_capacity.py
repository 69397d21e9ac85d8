"""Max-sustainable-rate search: exact to its tolerance on a case whose answer is known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.reports.capacity import SLO, RateScaler, grid_rate, max_sustainable_rate, simulator
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.metrics import goodput, saturation
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads.arrivals import ClosedLoop, FixedRateArrivals
from kvsim.workloads.lengths import Fixed
from kvsim.workloads.spec import WorkloadSpec
from tests.helpers import flat_profile

STEP_S = 0.010  # flat profile: 2 layers x 5 ms, whatever the batch
OUTPUT = 10  # tokens per request: 1 prefill step + 9 decode steps
N = 200


def toy(n: int = N) -> WorkloadSpec:
    return WorkloadSpec(name="toy", num_requests=n, arrival=FixedRateArrivals(10.0),
                        prompt_len=Fixed(16), output_len=Fixed(OUTPUT))


def toy_evaluate(slo: SLO):
    model, gpu = get_model("tiny"), get_gpu("H100-SXM-80GB")
    config = EngineConfig(max_num_seqs=1, enable_prefix_caching=False)
    return simulator(model, gpu, config, toy(), flat_profile(linear_ms=5.0), 0, slo)


def known_max_rate(margin_s: float) -> float:
    """One request at a time, each OUTPUT steps: service S = OUTPUT * STEP_S. Arrivals every
    1/lam. Above 1/S the server never idles and request i waits i * (S - 1/lam), so
    TTFT_i = STEP_S + i * (S - 1/lam); numpy's p95 of i = 0..N-1 sits at i = 0.95 (N - 1).
    TTFT p95 <= STEP_S + margin  <=>  lam <= 1 / (S - margin / (0.95 (N - 1)))."""
    service = OUTPUT * STEP_S
    return 1.0 / (service - margin_s / (0.95 * (N - 1)))


@pytest.mark.parametrize("tolerance", [0.01, 0.03])
def test_max_rate_is_exact_to_its_tolerance_on_a_hand_computed_queue(tolerance):
    margin_ms = 500.0
    slo = SLO(ttft_p95_ms=STEP_S * 1000 + margin_ms)
    answer = known_max_rate(margin_ms / 1000)  # 10.27 req/s, 2.7% above the service rate 10
    found = max_sustainable_rate(toy_evaluate(slo), slo, start_rate=3.0, tolerance=tolerance)
    assert found.max_rate <= answer < found.max_rate * (1 + tolerance)
    assert not found.at_least and "TTFT p95" in found.binding
    rates = [p.rate for p in found.points]
    assert len(rates) == len(set(rates)) and len(rates) <= 12  # every rate run once


def test_the_search_does_not_depend_on_where_it_starts():
    slo = SLO(ttft_p95_ms=STEP_S * 1000 + 500)
    a = max_sustainable_rate(toy_evaluate(slo), slo, start_rate=1.0, tolerance=0.02)
    b = max_sustainable_rate(toy_evaluate(slo), slo, start_rate=40.0, tolerance=0.02)
    assert a.max_rate == b.max_rate


def test_a_looser_slo_never_sustains_less():
    rates = []
    for margin in (50.0, 200.0, 800.0):
        slo = SLO(ttft_p95_ms=STEP_S * 1000 + margin)
        rates.append(max_sustainable_rate(toy_evaluate(slo), slo, start_rate=5.0, tolerance=0.02).max_rate)
    assert rates == sorted(rates)


def test_an_slo_no_rate_meets_sustains_nothing_and_says_why():
    slo = SLO(tpot_p95_ms=5.0)  # every decode step takes 10 ms
    found = max_sustainable_rate(toy_evaluate(slo), slo, start_rate=5.0, tolerance=0.05)
    assert found.max_rate == 0.0 and "TPOT p95" in found.binding


def test_synthetic_monotone_predicate_lands_on_the_grid_point_below_the_boundary():
    calls = []

    def evaluate(rate):
        calls.append(rate)
        return {"p95_ttft_ms": 100.0 if rate <= 7.3 else 1e6}

    found = max_sustainable_rate(evaluate, SLO(ttft_p95_ms=200), start_rate=1.0, tolerance=0.02)
    assert found.max_rate <= 7.3 < found.max_rate * 1.02
    assert found.max_rate == pytest.approx(grid_rate(100, 0.02))  # 1.02^100 = 7.24


def test_rate_cap_stops_the_search_as_at_least():
    found = max_sustainable_rate(lambda r: {"p95_ttft_ms": 1.0}, SLO(ttft_p95_ms=2), 1.0, 0.05, rate_cap=30.0)
    assert found.at_least and found.max_rate <= 30.0


def test_rescaled_workload_keeps_the_requests_and_scales_the_clock():
    scaler = RateScaler(toy())
    seed = np.random.SeedSequence(0)
    arrays, base = scaler.draw(seed)
    assert base == 10.0 and np.allclose(arrays.arrival_s[:3], [0.0, 0.1, 0.2])
    closed = WorkloadSpec(name="c", num_requests=5, arrival=ClosedLoop(2), prompt_len=Fixed(4), output_len=Fixed(4))
    with pytest.raises(ConfigError, match="open-loop"):
        RateScaler(closed).draw(seed)


def test_overloaded_and_sustained_runs_are_labelled():
    slo = SLO()
    evaluate = toy_evaluate(slo)
    assert evaluate(8.0)["saturation"] == "sustained"
    over = evaluate(15.0)  # 1.5x the service rate
    assert over["saturation"] == "overloaded"
    assert over["completed_rate_warm"] == pytest.approx(10.0, rel=0.02)
    assert over["queue_wait_slope"] == pytest.approx(0.5, rel=0.05)  # lam / mu - 1


def test_goodput_counts_requests_meeting_every_slo_as_vllm_does():
    import pandas as pd

    requests = pd.DataFrame({
        "status": ["finished", "finished", "finished", "rejected"],
        "ttft_s": [0.1, 0.6, 0.2, np.nan], "tpot_s": [0.04, 0.01, np.nan, np.nan],
        "e2el_s": [1.0, 1.0, 0.2, np.nan],
    })
    out = goodput(requests, {"ttft": 500, "tpot": 50}, duration_s=2.0)
    # row 1 misses TTFT; row 2 has one token (TPOT counts as 0); row 3 was rejected
    assert out["good_requests"] == 2 and out["request_goodput"] == 1.0 and out["goodput_share"] == 0.5


def test_saturation_needs_steady_arrivals():
    import pandas as pd

    batch = pd.DataFrame({"arrival_s": np.zeros(50), "first_scheduled_s": np.arange(50.0),
                          "finish_s": np.arange(50.0) + 1, "status": ["finished"] * 50})
    assert saturation(batch)["saturation"] == "n/a"


def test_margin_guided_search_finds_the_bisection_answer_in_fewer_runs():
    """A smooth p95 (elasticity 1.7, boundary 7.3 req/s) and a step with the same boundary (no
    useful margin: 100 ms or 1e6 ms) land on the same grid point; the guided search needs fewer runs."""
    slo = SLO(ttft_p95_ms=100.0)
    smooth, step = [], []

    def smooth_eval(rate):
        smooth.append(rate)
        return {"p95_ttft_ms": 100.0 * (rate / 7.3) ** 1.7}

    def step_eval(rate):
        step.append(rate)
        return {"p95_ttft_ms": 50.0 if rate <= 7.3 else 1e6}

    guided = max_sustainable_rate(smooth_eval, slo, start_rate=1.0, tolerance=0.02)
    blind = max_sustainable_rate(step_eval, slo, start_rate=1.0, tolerance=0.02)
    assert guided.max_rate == blind.max_rate == pytest.approx(grid_rate(100, 0.02))
    assert len(smooth) <= 5 < len(step)
    assert len(set(smooth)) == len(smooth)


def test_margin_is_the_worst_ratio_and_none_without_a_value():
    slo = SLO(ttft_p95_ms=200, tpot_p95_ms=50)
    assert slo.margin({"p95_ttft_ms": 100.0, "p95_tpot_ms": 60.0}) == pytest.approx(1.2)
    assert slo.margin({"p95_ttft_ms": 100.0}) is None
    assert SLO().margin({"p95_ttft_ms": 1.0}) is None
    goodput = SLO(goodput_ms=(("ttft", 500.0),))  # 90% must meet it: 5% missing is half the allowance
    assert goodput.margin({"goodput_share": 0.95}) == pytest.approx(0.5)


def _toy_run(rate: float, slo: SLO, early_stop: bool, n: int = N):
    from kvsim.reports.capacity import run_against

    model, gpu = get_model("tiny"), get_gpu("H100-SXM-80GB")
    config = EngineConfig(max_num_seqs=1, enable_prefix_caching=False)
    return run_against(model, gpu, config, RateScaler(toy(n)).at(rate), flat_profile(linear_ms=5.0), 0, slo,
                       early_stop=early_stop)


def test_a_run_that_is_not_stopped_is_the_plain_run():
    slo = SLO(ttft_p95_ms=1e9, tpot_p95_ms=1e9)
    watched, plain = _toy_run(9.0, slo, True), _toy_run(9.0, slo, False)
    assert "early_stop" not in watched
    assert {k: v for k, v in watched.items() if "wall" not in k} == {k: v for k, v in plain.items() if "wall" not in k}


@pytest.mark.parametrize("rate", [9.5, 10.2, 10.4, 11.0, 14.0])
def test_early_stop_only_ever_stops_a_run_that_fails_and_its_p95_is_a_lower_bound(rate):
    slo = SLO(ttft_p95_ms=STEP_S * 1000 + 500)  # the hand-computed boundary is 10.27 req/s
    stopped, full = _toy_run(rate, slo, True), _toy_run(rate, slo, False)
    assert bool(slo.failures(stopped)) == bool(slo.failures(full))
    if "early_stop" in stopped:
        assert slo.failures(full) and stopped["completed_so_far"] < N
        assert slo.ttft_p95_ms < stopped["p95_ttft_ms"] <= full["p95_ttft_ms"]
        assert "run stopped" in slo.failures(stopped)[0]
    if rate >= 11.0:  # far past the boundary the proof comes early: most of the run is skipped
        assert stopped["completed_so_far"] < N / 2


@pytest.mark.parametrize("rate", [9.5, 11.0, 14.0])
def test_early_stop_on_goodput_agrees_with_the_full_run(rate):
    slo = SLO(goodput_ms=(("ttft", STEP_S * 1000 + 300.0), ("tpot", 50.0)))
    stopped, full = _toy_run(rate, slo, True), _toy_run(rate, slo, False)
    assert bool(slo.failures(stopped)) == bool(slo.failures(full))
    if "early_stop" in stopped:
        assert stopped["goodput_share"] >= full["goodput_share"]  # an upper bound, already too low
        assert stopped["goodput_share"] < slo.goodput_attainment
    if rate >= 14.0:
        assert "early_stop" in stopped


def test_rejected_requests_do_not_hide_an_overload():
    """Rejected requests were never scheduled: they have no queueing delay and must not pull the
    delay trend down (they once entered the fit as a wait of -1 - arrival)."""
    from kvsim.simcore.metrics import saturation_columns

    arrival = np.linspace(0.0, 100.0, 1000)
    rejected = np.arange(1000) % 2 == 1
    first_scheduled = np.where(rejected, -1.0, arrival * 1.5)  # scheduled ones wait 0.5 s per s more
    finished = ~rejected
    finish = np.where(rejected, -1.0, arrival * 1.5 + 1.0)
    out = saturation_columns(arrival, first_scheduled, finish, finished)
    assert out["queue_wait_slope"] == pytest.approx(0.5)
    assert out["saturation"] == "overloaded"


def test_a_burst_over_before_its_requests_finish_is_not_called_sustained():
    """200 requests arriving in half a second, all admitted at once and each taking ~5 s: no
    queue had time to form, so the run cannot say the rate is sustained (it once said so, and
    --find-max-rate with 200 requests answered 10x the rate 1,000 requests found). The same
    burst spread over 50 s is judged. A clear overload stays overloaded however short."""
    from kvsim.reports.capacity import SLO
    from kvsim.simcore.metrics import saturation_columns

    arrival = np.linspace(0.0, 0.5, 200)
    first = arrival.copy()
    finish = arrival + 5.0
    done = np.ones(200, dtype=bool)
    short = saturation_columns(arrival, first, finish, done)
    assert short["saturation"] == "n/a"
    assert any("load not judged" in r for r in SLO().failures(short))
    spread = saturation_columns(arrival * 100, first * 100, finish * 100 - 495.0, done)
    assert spread["saturation"] == "sustained" and not SLO().failures(spread)
    # a queue growing 10 s per s while few complete: overloaded, even in a 0.5 s window
    queued = saturation_columns(arrival, arrival * 11, arrival * 11 + 5.0, done)
    assert queued["saturation"] == "overloaded"
