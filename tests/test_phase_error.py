"""Error bars by TP and phase (profiles/uncertainty.py): a profile's stated error from its kind, TP
and phase; a profile scaled per phase prices a step with prompt tokens in proportion to them
(StepLatencyModel.prefill_ratio), the same bits in both engine cores (plain, pipelined and
speculative steps)."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest

from kvsim.profiles import default_profile
from kvsim.profiles.uncertainty import (
    ROOFLINE_BY_TP,
    PhaseFactors,
    profile_error,
    roofline_error,
    scaled_profile,
    sigma_too_fast,
    sigma_too_slow,
)
from kvsim.simcore import ccore
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import parse_profile

H100 = get_gpu("H100-SXM-80GB")
PROFILE = default_profile(H100, get_model("llama2-70b"), 4)
APART = PhaseFactors(1.7, 0.8)  # prefill slower, decode faster: every mixed step is in between
needs_core = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


def test_roofline_error_follows_its_tp_and_phase():
    """TP 2 / 4 / 8 from the step-level check, TP 1 from the end-to-end one; a TP between validated
    ones takes the next one up, past TP 8 TP 8's."""
    for tp, (prefill, decode) in ROOFLINE_BY_TP.items():
        err = profile_error(default_profile(H100, get_model("llama3-70b" if tp > 1 else "llama3-8b"), tp))
        assert (err.kind, err.tp, err.prefill, err.decode) == ("roofline", tp, prefill, decode)
        assert ("step-level check:" in err.basis) == (tp > 1)
    assert (roofline_error(3).prefill, roofline_error(3).decode) == ROOFLINE_BY_TP[4]
    assert (roofline_error(16).prefill, roofline_error(16).decode) == ROOFLINE_BY_TP[8]
    assert "validated at TP 8" in roofline_error(16).basis
    widths = [roofline_error(tp).factor(1.645) for tp in (1, 2, 4, 8)]
    assert all(a.decode < b.decode for a, b in zip(widths, widths[1:], strict=False))  # wider as TP grows


def test_the_band_is_wider_on_the_too_fast_side_and_its_median_is_kvsims_price():
    err = roofline_error(8)
    assert err.factor(0.0) == PhaseFactors(1.0, 1.0) == err.factor_at_confidence(0.5)
    low, high = err.factor(-0.6745), err.factor(0.6745)  # the quartiles: the validation's median rows
    assert high.decode == pytest.approx(1 / (1 - 0.44)) and low.decode == pytest.approx(1 / (1 + 0.44))
    assert high.prefill == pytest.approx(1 / (1 - 0.37)) and low.prefill == pytest.approx(1 / (1 + 0.37))
    assert sigma_too_fast(0.2) > sigma_too_slow(0.2)
    lo, hi = err.factor(-1.0), err.factor(1.0)
    assert hi.decode * lo.decode > 1.0  # asymmetric: not a mirror in log space
    # higher confidence: both phases slower (what keeps plan --confidence monotone)
    prev = PhaseFactors(0.0, 0.0)
    for c in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99):
        f = err.factor_at_confidence(c)
        assert f.prefill > prev.prefill and f.decode > prev.decode
        prev = f
    # z_above: the smallest z at which both phases grew by at least this much
    z = err.z_above(0.5, math.log(1.3))
    f0, f1 = err.factor(0.5), err.factor(z)
    assert min(f1.prefill / f0.prefill, f1.decode / f0.decode) == pytest.approx(1.3)


def test_a_calibrated_profile_states_each_phases_held_out_error():
    doc = copy.deepcopy(PROFILE.data)
    doc["source"] = "calibrated"
    residuals = ([{"quantity": "prefill_ms", "tp": 4, "loo_error": e} for e in (0.05, -0.07, 0.02)]
                 + [{"quantity": "decode_ms", "tp": 4, "loo_error": e} for e in (-0.01, 0.03)])
    doc["provenance"] = {"calibration": {"data_tps": [4], "rows": 5, "loo_median_abs_error": 0.03,
                                         "residuals": residuals}}
    err = profile_error(parse_profile(doc))
    assert (err.kind, err.prefill, err.decode) == ("calibrated", 0.05, 0.02)
    doc["provenance"]["calibration"]["residuals"] = residuals[:3]  # no decode rows: the overall median
    err = profile_error(parse_profile(doc))
    assert (err.prefill, err.decode) == (0.05, 0.03) and "no decode residuals" in err.basis
    del doc["provenance"]["calibration"]["residuals"]  # older files: one error for both
    err = profile_error(parse_profile(doc))
    assert (err.prefill, err.decode) == (0.03, 0.03) and "both phases" in err.basis
    doc["provenance"]["calibration"]["data_tps"] = [2]  # no rows at this TP: the roofline's at TP 4
    err = profile_error(parse_profile(doc))
    assert (err.kind, err.prefill, err.decode) == ("calibrated", *ROOFLINE_BY_TP[4])


STEPS = [(64, [], 64, 64 * 900, 64), (512, [(512, 0)], 0, 0, 1), (300, [(236, 1000)], 64, 64 * 2000, 65),
         (20000, [(20000, 0)], 0, 0, 1), (1, [(1, 5)], 0, 0, 1)]


@pytest.mark.parametrize("engine_version", ["vllm-v0", "vllm-v1"])
def test_a_step_is_priced_in_proportion_to_its_prompt_tokens(engine_version):
    base = PROFILE.latency_model(engine_version=engine_version)
    PROFILE.latency_model(engine_version=engine_version)  # built: scaled_profile scales the model itself
    fast = scaled_profile(PROFILE, APART)
    parsed = parse_profile(copy.deepcopy(fast.data), "scaled")
    assert fast.sha256 == parsed.sha256 and fast.step_time_factor == APART
    a = fast.latency_model(engine_version=engine_version)
    b = parsed.latency_model(engine_version=engine_version)
    assert np.array_equal(ccore.pricing_blob(a), ccore.pricing_blob(b))
    for num_tokens, chunks, decodes, ctx, sampled in STEPS:
        share = (num_tokens - decodes) / num_tokens
        expect = APART.decode + (APART.prefill - APART.decode) * share
        t = a.step_time_s(num_tokens, chunks, decodes, ctx, sampled)
        assert t == b.step_time_s(num_tokens, chunks, decodes, ctx, sampled)
        assert t == pytest.approx(expect * base.step_time_s(num_tokens, chunks, decodes, ctx, sampled), rel=1e-9)
        if ccore.library() is not None:  # the C core's parts, bit for bit
            assert tuple(ccore.CPricing(a).step_parts_ms(num_tokens, chunks, decodes, ctx, sampled)) == \
                a.step_parts_ms(num_tokens, chunks, decodes, ctx, sampled)
    sums = np.arange(1000, 1040) * 40  # a decode span: the decode factor alone
    assert np.allclose(a.decode_span_times_s(40, sums), APART.decode * base.decode_span_times_s(40, sums), rtol=1e-12)
    twice = scaled_profile(scaled_profile(PROFILE, PhaseFactors(1.2, 0.9)), PhaseFactors(1.5, 2.0))
    assert twice.step_time_factor == pytest.approx(PhaseFactors(1.8, 1.8))  # the phases' products
    c = twice.latency_model(engine_version=engine_version)
    for step in STEPS:
        assert c.step_time_s(*step) == pytest.approx(1.8 * base.step_time_s(*step), rel=1e-9)
    with pytest.raises(Exception, match="prefill_vs_decode_factor"):
        parse_profile({**PROFILE.data, "prefill_vs_decode_factor": -1.0})


@needs_core
def test_both_cores_match_with_the_phases_apart(monkeypatch):
    """Random small runs (plain V0 / V1, pipelined, speculative with a head and a draft model) on a
    profile scaled per phase: the equivalence suites' comparisons, unchanged."""
    from tests import test_fastcore_equivalence as plain
    from tests import test_fastcore_speculative as spec

    profile = scaled_profile(plain._profile(), APART)
    for seed in range(9100, 9108):
        config, workload = plain._random_case(np.random.default_rng(seed))
        plain._compare(config, workload, seed=seed, context=f"case {seed}", profile=profile)
    for seed, method in ((9200, "eagle"), (9201, "mtp"), (9202, "draft_model"), (9203, "draft_model")):
        config, workload, text = spec._random_case(np.random.default_rng(seed), method)
        draft = profile if method == "draft_model" else None
        plain._compare(config, workload, seed=seed, context=f"case {seed}: {text}", profile=profile,
                       model=spec.model_for(method), draft_profile=draft)
    from kvsim.simcore.simulate import simulate

    def run(*args, exact_steps=False, **kw):  # a pipelined run's reference is the Python engine
        if exact_steps:
            kw["engine_core"] = "python"
        return simulate(*args, exact_steps=exact_steps, **kw)

    monkeypatch.setattr(plain, "simulate", run)
    for seed in range(9300, 9304):
        config, workload = plain._random_case(np.random.default_rng(seed))
        config = dataclasses.replace(config, pipeline_parallel_size=2)
        plain._compare(config, workload, seed=seed, context=f"case {seed} pp 2", profile=profile)
