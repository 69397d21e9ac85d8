"""Error bars: each profile kind's stated step-time error, scaled profiles, `kvsim run`'s bands
and `kvsim plan --confidence`."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.profiles import default_profile
from kvsim.profiles.uncertainty import ROOFLINE_BY_TP, PhaseFactors, profile_error, scaled_profile
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import StepLatencyModel, parse_profile
from tests.test_plan import PLAN

PROFILE = default_profile(get_gpu("H100-SXM-80GB"), get_model("llama2-70b"), 4)
STEPS = [(1, [], 1, 300, 1), (64, [], 64, 64 * 900, 64), (512, [(512, 0)], 0, 0, 1),
         (300, [(200, 1000), (36, 0)], 64, 64 * 2000, 66), (20000, [(20000, 0)], 0, 0, 1)]


@pytest.mark.parametrize("engine_version", ["vllm-v0", "vllm-v1"])
def test_a_scaled_profile_scales_every_step_by_its_factor(engine_version):
    base = StepLatencyModel(PROFILE.data, engine_version=engine_version)
    for factor in (0.8, 1.25):
        scaled = StepLatencyModel(scaled_profile(PROFILE, factor).data, engine_version=engine_version)
        for step in STEPS:  # inside the tables, extrapolated (20k tokens), with and without prefill
            assert scaled.step_time_s(*step) == pytest.approx(factor * base.step_time_s(*step), rel=1e-9)
    assert scaled_profile(PROFILE, 1.0) is PROFILE


@pytest.mark.parametrize("engine_version", ["vllm-v0", "vllm-v1"])
def test_a_scaled_profiles_models_are_its_own_scaled_bit_for_bit(engine_version):
    """scaled_profile scales the profile's built models (StepLatencyModel.scaled) instead of parsing
    the scaled document: the same document, hash and prices, bit for bit, in both cores' form."""
    import numpy as np

    from kvsim.simcore.ccore import pricing_blob

    base = default_profile(get_gpu("H100-SXM-80GB"), get_model("llama2-70b"), 4)
    before = copy.deepcopy(base.data)
    base.latency_model(engine_version=engine_version)  # a model built: scaled_profile scales it
    for factor in (0.8, 1.25, 1.4918):
        fast = scaled_profile(base, factor)
        parsed = parse_profile(copy.deepcopy(fast.data), "scaled")
        assert fast.data == parsed.data and fast.sha256 == parsed.sha256
        for policy in ("continuous", "static"):
            a = fast.latency_model(policy=policy, engine_version=engine_version)
            b = parsed.latency_model(policy=policy, engine_version=engine_version)
            assert a.host == b.host
            for block_size in (16, 32):
                a.set_block_size(block_size), b.set_block_size(block_size)
                assert np.array_equal(pricing_blob(a), pricing_blob(b))  # what the C core prices from
                for step in STEPS:
                    assert a.step_time_s(*step) == b.step_time_s(*step)
                sums = np.arange(1000, 1100) * 40
                assert np.array_equal(a.decode_span_times_s(40, sums), b.decode_span_times_s(40, sums))
    assert base.data == before  # the profile scaled is left as it was
    # a scaled document that validation refuses is still refused
    with pytest.raises(Exception, match="plausible"):
        scaled_profile(base, 1e12)


def test_each_profile_kind_states_its_error():
    err = profile_error(PROFILE)  # roofline at TP 4: issue 27's step-level check, per phase
    assert err.kind == "roofline" and (err.prefill, err.decode) == ROOFLINE_BY_TP[4] == (0.23, 0.19)
    assert err.factor_at_confidence(0.5) == PhaseFactors(1.0, 1.0)
    assert all(f > 1.0 for f in err.factor_at_confidence(0.9))
    assert all(lo < 1.0 < hi for lo, hi in zip(err.factor(-1.0), err.factor(1.0), strict=True))
    doc = copy.deepcopy(PROFILE.data)
    doc["source"] = "calibrated"
    doc["provenance"] = {"calibration": {"data_tps": [4], "rows": 12, "loo_median_abs_error": 0.031}}
    cal = profile_error(parse_profile(doc))
    assert cal.kind == "calibrated" and cal.median_abs_error == 0.031
    doc["provenance"]["calibration"]["data_tps"] = [2]  # no rows at this TP: the roofline's error
    assert (profile_error(parse_profile(doc)).prefill, profile_error(parse_profile(doc)).decode) == (0.23, 0.19)


RUN = ["run", "--model", "llama3-8b", "--num-requests", "60", "--rate", "8", "--json"]


def test_run_reports_a_band_around_each_headline_metric():
    result = CliRunner().invoke(app, RUN)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    bars = summary["error_bars"]
    assert bars["kind"] == "roofline" and bars["interval"] == 0.9
    factors = bars["step_time_factors"]  # llama3-8b, TP 1: one error for both phases, wider above
    assert factors["prefill"] == factors["decode"]
    lo, hi = factors["decode"]
    assert lo < 1 < hi and lo * hi > 1.0 and bars["tp"] == 1
    for key in ("p95_ttft_ms", "mean_tpot_ms", "output_throughput"):
        low, high = bars["metrics"][key]
        assert low <= summary[key] <= high
    assert bars["metrics"]["p95_ttft_ms"][1] > summary["p95_ttft_ms"]  # slower steps, later first tokens
    text = CliRunner().invoke(app, RUN[:-1]).stdout
    assert "Model error (90% band)" in text and "P95 TTFT (ms):" in text.split("Model error")[1]
    assert "error_bars" not in json.loads(CliRunner().invoke(app, [*RUN, "--no-error-bars"]).stdout)["summary"]


def test_plan_at_higher_confidence_never_needs_fewer_gpus():
    docs = {}
    for conf in ("0.5", "0.9"):
        result = CliRunner().invoke(app, [*PLAN, "--rate", "40", "--json", "--confidence", conf])
        assert result.exit_code == 0, result.stderr
        docs[conf] = json.loads(result.stdout)
    gpus = {c: d["answers"][0]["best"]["gpus"] for c, d in docs.items()}
    assert gpus["0.9"] >= gpus["0.5"]
    assert docs["0.9"]["confidence"] == 0.9 and "at 90% confidence" in docs["0.9"]["answers"][0]["line"]
    for tp in ("1", "2", "4", "8"):
        assert min(docs["0.9"]["model_error"]["roofline"][tp]["step_time_factor"].values()) > 1.0
        assert set(docs["0.5"]["model_error"]["roofline"][tp]["step_time_factor"].values()) == {1.0}
    chosen = docs["0.9"]["answers"][0]["slo_probability"]["model_error"]
    assert chosen["step_time_factor"]["decode"] > 1.0 and "TP" in docs["0.9"]["answers"][0]["line"]


@pytest.mark.parametrize("value", ["0", "1", "1.5"])
def test_plan_bad_confidence_is_one_line(value):
    result = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1",
                                      "--rate", "10", "--confidence", value])
    assert result.exit_code == 2 and "--confidence must be from 0.001 to 0.999" in result.stderr
    assert result.stderr.count("\n") == 1
