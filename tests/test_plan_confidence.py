"""kvsim plan: each answer's probability of meeting the SLO under its profile's stated error."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

from typer.testing import CliRunner

import kvsim.reports.plan_confidence as pc
from kvsim.cli.main import app
from kvsim.profiles.uncertainty import StepTimeError, sigma_too_fast

ERROR = StepTimeError("roofline", 0.09, 0.09, "test")  # one error for both phases

PLAN = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1", "--input-len", "256",
        "--output-len", "64", "--search-requests", "100", "--confirm-requests", "150", "--tolerance", "0.15",
        "--slo-ttft-p95-ms", "150", "--slo-tpot-p95-ms", "12", "--rate", "20", "--json"]


def test_bisection_finds_the_largest_passing_factor(monkeypatch):
    sigma, z_star = sigma_too_fast(0.09), 0.8  # the deployment passes while step times are at most x exp(0.8 sigma)
    monkeypatch.setattr(pc, "_meets", lambda a, n, t, s, seed, slo, f: (math.log(f.decode) <= z_star * sigma + 1e-12, {}))
    p = pc.slo_probability(None, 1, 1.0, None, 0, None, ERROR)
    phi = NormalDist().cdf
    assert p["low"] <= phi(z_star) <= p["high"] and p["runs"] == 1 + pc.BISECTIONS
    assert abs(p["probability"] - phi(z_star)) < 0.02
    # planned at z = 1 (step times x exp(sigma)), where it passed: the factor is relative to that profile
    monkeypatch.setattr(pc, "_meets", lambda a, n, t, s, seed, slo, f: (math.log(f.decode) <= 0.5 * sigma + 1e-12, {}))
    p = pc.slo_probability(None, 1, 1.0, None, 0, None, ERROR, planned_z=1.0)
    assert p["low"] <= phi(1.5) <= p["high"]
    monkeypatch.setattr(pc, "_meets", lambda *args: (True, {}))  # passes even at +3 sigma: one run
    assert pc.slo_probability(None, 1, 1.0, None, 0, None, ERROR)["runs"] == 1


def test_a_passing_runs_margin_skips_only_points_known_to_fail(monkeypatch):
    """A run passing at factor F with TPOT p95 v bounds F* <= F x limit / v (plan_confidence's
    docstring): the points above are not run, and the answer is that of running every point."""
    from kvsim.reports.capacity import SLO

    slo = SLO(tpot_p95_ms=60.0)

    def fake(factor):  # TPOT p95 grows faster than the factor (queues lengthen): F* = 1.1
        tpot = 50.0 * factor * (factor / 1.1) ** 0.5 * 1.2 ** 0.5
        return tpot <= 60.0, {"p95_tpot_ms": tpot}

    made = []
    monkeypatch.setattr(pc, "_meets", lambda a, n, t, s, seed, slo, f: made.append(f.decode) or fake(f.decode))
    full = pc.slo_probability(None, 1, 1.0, None, 0, slo, ERROR)
    assert full["runs"] == len(made) == 1 + pc.BISECTIONS
    made.clear()
    bounded = pc.slo_probability(None, 1, 1.0, None, 0, slo, ERROR, planned=fake(1.0)[1])
    assert {k: bounded[k] for k in ("probability", "low", "high")} == {k: full[k] for k in ("probability", "low", "high")}
    assert bounded["runs"] == len(made) < full["runs"]
    assert all(f <= 60.0 / fake(1.0)[1]["p95_tpot_ms"] for f in made)  # nothing above the first margin was run


def test_early_stops_and_margins_leave_the_answer_as_every_full_run_gives(monkeypatch):
    """The re-runs stop once a failure is certain and skip points a margin rules out; with neither
    (every point run in full) the probability and its bounds are the same."""
    import kvsim.reports.capacity as capacity

    fast = json.loads(CliRunner().invoke(app, PLAN).stdout)["answers"][0]["slo_probability"]
    run_against = capacity.run_against
    monkeypatch.setattr(capacity, "run_against", lambda *a, early_stop=False: run_against(*a, early_stop=False))
    monkeypatch.setattr(pc, "stretches_with_steps", lambda config: False)
    full = json.loads(CliRunner().invoke(app, PLAN).stdout)["answers"][0]["slo_probability"]
    assert {k: fast[k] for k in ("probability", "low", "high")} == {k: full[k] for k in ("probability", "low", "high")}
    assert fast["runs"] < full["runs"]


def test_each_answer_carries_its_probability_and_a_confident_plan_is_at_least_that_likely():
    for confidence in (0.5, 0.9):
        result = CliRunner().invoke(app, [*PLAN, "--confidence", str(confidence)])
        assert result.exit_code == 0, result.stderr
        p = json.loads(result.stdout)["answers"][0]["slo_probability"]
        assert p["low"] <= p["probability"] <= p["high"] and 1 <= p["runs"] <= 1 + pc.BISECTIONS
        assert p["model_error"]["kind"] == "roofline"
        assert p["low"] >= confidence - 1e-9  # its confirmation passed at the planned quantile
