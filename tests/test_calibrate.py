"""kvsim calibrate / profile check: recovery of known terms, round trip through kvsim run, bad files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.profiles import default_profile
from kvsim.profiles.calibrate import (
    PARAMS,
    SCALARS,
    Measurement,
    calibrated_profile,
    default_host_line,
    fit_rows,
    price_all,
    price_row,
    profile_params,
)
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import parse_profile

GPU, MODEL = get_gpu("H100-SXM-80GB"), get_model("llama2-70b")
TRUTH = {"s_gemm": 1.08, "s_attn": 1.6, "s_coll": 1.4, "host_step": 4.0, "host_rank": 1.2, "host_seq": 0.3,
         "host_prefill_step": 6.0, "host_prefill_token": 0.004}
SHAPES = [(b, p, o) for b in (1, 4, 16) for p, o in ((128, 16), (1024, 8))]


EXAMPLE = Path(__file__).resolve().parents[1] / "profiles" / "examples" / "synthetic-h100-llama2-70b.csv"
# the terms profiles/examples/synthetic-h100-llama2-70b.csv was generated with (its README)
EXAMPLE_TERMS = {"host_step": 3.0, "host_rank": 0.5, "host_seq": 0.2, "host_prefill_step": 2.0,
                 "host_prefill_token": 0.002}


def _truth_profiles(tps, truth=TRUTH):
    return {tp: parse_profile(calibrated_profile(default_profile(GPU, MODEL, tp), truth, tp, {})) for tp in tps}


def _synthetic_rows(tps, truth=TRUTH):
    """Measurements that kvsim itself generated with known terms."""
    rows = [Measurement(2 + i, tp, b, p, o, {}) for i, (tp, (b, p, o)) in
            enumerate((tp, s) for tp in tps for s in SHAPES)]
    priced = price_all(MODEL, GPU, rows, _truth_profiles(tps, truth).__getitem__)
    return [Measurement(r.line, r.tp, r.batch_size, r.input_len, r.output_len, dict(p.simulated))
            for r, p in zip(rows, priced, strict=True)]


def _write_csv(path: Path, rows) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tp", "batch_size", "input_len", "output_len", "prefill_ms", "decode_ms", "latency_ms"])
        for r in rows:
            w.writerow([r.tp, r.batch_size, r.input_len, r.output_len, *(r.measured[q] for q in
                        ("prefill_ms", "decode_ms", "latency_ms"))])
    return path


def test_pricing_features_reproduce_the_simulated_batch():
    prof = default_profile(GPU, MODEL, 4)
    theta = profile_params(prof, 4)
    for b, p, o in ((1, 128, 16), (16, 1024, 8)):
        priced = price_row(MODEL, GPU, prof, Measurement(2, 4, b, p, o, {}))
        for q, ms in priced.simulated.items():
            assert priced.features[q] @ theta == pytest.approx(ms, rel=1e-9)


def test_calibrate_recovers_known_terms_within_one_percent():
    rows = _synthetic_rows((2, 4, 8))
    bases = {tp: default_profile(GPU, MODEL, tp) for tp in (2, 4, 8)}
    priced = price_all(MODEL, GPU, rows, bases.__getitem__)
    fit = fit_rows(rows, priced, profile_params(bases[4], 4), free_scalars=SCALARS)  # every term freed
    for name in PARAMS:
        assert fit.params[name] == pytest.approx(TRUTH[name], rel=0.01), name
    assert all(e["loo_median_abs_error"] < 0.01 for e in fit.by_tp.values())
    assert fit.fitted == list(PARAMS) and not fit.pinned and not fit.unidentified


def test_by_default_the_measured_scalars_stay_at_one_and_the_host_terms_are_fitted():
    truth = {**TRUTH, "s_gemm": 1.0, "s_attn": 1.0, "s_coll": 1.0}
    rows = _synthetic_rows((2, 4), truth)
    bases = {tp: default_profile(GPU, MODEL, tp) for tp in (2, 4)}
    priced = price_all(MODEL, GPU, rows, bases.__getitem__)
    fit = fit_rows(rows, priced, profile_params(bases[4], 4))
    assert fit.pinned == list(SCALARS) and all(fit.params[n] == 1.0 for n in SCALARS)
    for name in ("host_step", "host_rank", "host_seq", "host_prefill_step", "host_prefill_token"):
        assert fit.params[name] == pytest.approx(truth[name], rel=0.01), name
    assert fit.loo_median_abs_error < 0.01


def test_terms_the_rows_cannot_see_are_reported_and_kept():
    rows = [Measurement(r.line, r.tp, r.batch_size, r.input_len, r.output_len, {"decode_ms": r.measured["decode_ms"]})
            for r in _synthetic_rows((4,))]
    base = default_profile(GPU, MODEL, 4)
    prior = profile_params(base, 4)
    fit = fit_rows(rows, price_all(MODEL, GPU, rows, lambda tp: base), prior)
    # decode-only rows at one TP say nothing about the prefill terms or host_rank (not free at all)
    assert set(fit.unidentified) == {"host_prefill_step", "host_prefill_token"}
    assert fit.params["host_prefill_token"] == prior[PARAMS.index("host_prefill_token")]
    assert "host_rank" not in fit.fitted and "not identifiable" in " ".join(fit.warnings())


@pytest.mark.parametrize("copies", [1, 6])
def test_one_row_or_identical_rows_are_refused_in_one_line(tmp_path, copies):
    path = tmp_path / "m.csv"
    path.write_text("tp,batch_size,input_len,output_len,prefill_ms,decode_ms,latency_ms\n"
                    + "4,8,512,64,400,30,2300\n" * copies)
    result = CliRunner().invoke(app, ["calibrate", str(path), "--model", "llama2-70b", "--gpu", "H100",
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.stderr.startswith("kvsim: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "3 distinct measured points (1 distinct tp/batch_size/input_len/output_len row) cannot fit 4 terms" \
        in result.stderr
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.json"))


def test_unknown_free_scalar_is_refused(tmp_path):
    result = CliRunner().invoke(app, ["calibrate", str(EXAMPLE), "--model", "llama2-70b", "--gpu", "H100",
                                      "--free", "s_host", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--free: 's_host' is not a scalar" in result.stderr


def test_the_shipped_example_calibrates(tmp_path):
    """profiles/examples/: synthetic rows (kvsim's own output from stated terms, not a measurement)."""
    result = CliRunner().invoke(app, ["calibrate", str(EXAMPLE), "--model", "llama2-70b", "--gpu", "H100",
                                      "--out", str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["pinned_scalars"] == list(SCALARS) and not doc["not_identifiable"]
    for name, value in EXAMPLE_TERMS.items():
        assert doc["fitted"][name] == pytest.approx(value, rel=0.02, abs=1e-4), name
    assert doc["loo_median_abs_error"] < 0.01


def test_calibrated_profiles_round_trip_through_kvsim_run(tmp_path):
    measured = _synthetic_rows((4,))
    path = _write_csv(tmp_path / "m.csv", measured)
    out = tmp_path / "cal"
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", str(path), "--model", "llama2-70b", "--gpu", "H100",
                                 "--tp", "2,4,8", "--free", "s_gemm,s_attn,s_coll", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "leave-one-out" in result.stdout and "TP" in result.stdout
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == [f"H100-SXM-80GB-llama2-70b-tp{t}.json" for t in (2, 4, 8)]
    doc = json.loads((out / names[1]).read_text())
    cal = doc["provenance"]["calibration"]
    assert doc["source"] == "calibrated" and len(cal["input_sha256"]) == 64
    assert cal["residuals"] and "4" in cal["errors_by_tp"]
    # one TP of data: the stack's per-step host cost (4 + 1.2 * 3 at TP 4) carries over to other TPs
    # along the default engine's line (host_rank cannot be fitted from one TP), scaled through it
    assert doc["host_overhead"]["per_step_ms"] == pytest.approx(7.6, rel=0.01)
    tp2 = json.loads((out / names[0]).read_text())
    tp8 = json.loads((out / names[2]).read_text())
    step0, rank0 = default_host_line()
    scale = doc["host_overhead"]["per_step_ms"] / (step0 + 3 * rank0)
    assert tp2["host_overhead"]["per_step_ms"] == pytest.approx(scale * (step0 + rank0))
    assert tp8["host_overhead"]["per_step_ms"] == pytest.approx(scale * (step0 + 7 * rank0))
    assert tp2["host_overhead"]["per_seq_ms"] == pytest.approx(doc["host_overhead"]["per_seq_ms"])
    assert tp2["collectives"]["all_reduce"]["time_ms"] != doc["collectives"]["all_reduce"]["time_ms"]
    row = measured[3]
    run = runner.invoke(app, ["run", "--model", "llama2-70b", "--gpu", "H100", "--tp", "4",
                              "--profile", str(out / names[1]), "--workload", "fixed-batch",
                              "--num-requests", str(row.batch_size), "--input-len", str(row.input_len),
                              "--output-len", str(row.output_len), "--json"])
    assert run.exit_code == 0, run.stderr
    summary = json.loads(run.stdout)["summary"]
    assert summary["mean_ttft_ms"] == pytest.approx(row.measured["prefill_ms"], rel=0.01)
    assert summary["mean_tpot_ms"] == pytest.approx(row.measured["decode_ms"], rel=0.01)
    assert "calibrated" in run.stderr


def test_profile_check_prints_rows_and_medians(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("tp,batch_size,input_len,output_len,prefill_ms,decode_ms\n4,1,128,16,30,25\n2,1,128,16,40,\n")
    result = CliRunner().invoke(app, ["profile", "check", str(path), "--profile",
                                      "profiles/H100-SXM-80GB-llama2-70b-tp4.json", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {r["quantity"] for r in doc["rows"]} == {"prefill_ms", "decode_ms"}
    assert doc["skipped_rows"] == 1
    for r in doc["rows"]:
        assert r["error"] == pytest.approx(r["kvsim_ms"] / r["measured_ms"] - 1)
    assert set(doc["median_abs_error"]) == {"prefill_ms", "decode_ms", "all"}


HEADER = "tp,batch_size,input_len,output_len,prefill_ms\n"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such measurements file"),
        ("", "is empty; it needs a header row"),
        ("tp,batch_size,input_len,output_len\n4,1,128,16\n", "at least one of the columns"),
        ("tp,batch_size,input_len\n4,1,128\n", "missing column 'output_len'"),
        (HEADER, "no measurement rows"),
        (HEADER + "4,1,128,16,abc\n", "prefill_ms 'abc' is not a number"),
        (HEADER + "4,1,128,16,-3\n", "prefill_ms must be a positive, finite time"),
        (HEADER + "4,1,128,16,nan\n", "prefill_ms must be a positive, finite time"),
        (HEADER + "4,0,128,16,10\n", "batch_size must be an integer >= 1"),
        (HEADER + "4,1.5,128,16,10\n", "batch_size must be an integer >= 1"),
        (HEADER + "4,1,128,16,\n", "no value in prefill_ms"),
        (HEADER + "4,1,128,16,10,99\n", "more values than columns"),
        ("tp,batch_size,input_len,output_len,decode_ms\n4,1,128,1,10\n", "decode_ms needs output_len >= 2"),
        (b"\xff\xfe\x00garbage", "not a readable CSV file"),
    ],
)
def test_malformed_measurement_files_are_refused_in_one_line(tmp_path, content, needle):
    path = tmp_path / "m.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    out = tmp_path / "cal"
    result = CliRunner().invoke(app, ["calibrate", str(path), "--model", "llama2-70b", "--gpu", "H100",
                                      "--out", str(out)])
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stderr.startswith("kvsim: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert needle in result.stderr
    assert not list(out.glob("*.json")) if out.exists() else True


def test_calibrate_bad_tp_list_is_refused(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text(HEADER + "4,1,128,16,10\n")
    result = CliRunner().invoke(app, ["calibrate", str(path), "--model", "llama2-70b", "--gpu", "H100",
                                      "--tp", "3", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--tp must list powers of two" in result.stderr


def test_decode_span_api_is_used_consistently_by_the_probe():
    # the calibration probe also records spans priced through decode_span_times_s
    prof = default_profile(GPU, MODEL, 2)
    from kvsim.simcore.latency import StepLatencyModel

    m = StepLatencyModel(prof.data)
    sums = np.array([100.0, 200.0, 300.0])
    assert np.allclose(m.decode_span_times_s(1, sums), [m.step_time_s(1, [], 1, int(s), 1) for s in sums],
                       rtol=1e-12, atol=0)


def test_impossible_times_and_unfit_tp_are_refused(tmp_path):
    path = tmp_path / "m.csv"
    # 65k prompt tokens of a 70B model in 5 ms (and smaller batches as fast: enough points to fit)
    path.write_text(HEADER + "".join(f"4,{b},1024,16,5\n" for b in (8, 16, 32, 64)))
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", str(path), "--model", "llama2-70b", "--gpu", "H100",
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "below what the GPU's datasheet allows" in result.stderr
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.json"))
    result = runner.invoke(app, ["calibrate", str(path), "--model", "llama2-70b", "--gpu", "H100",
                                 "--tp", "1", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "does not fit" in result.stderr
    assert result.stderr.count("\n") == 1


def test_rows_are_priced_on_the_engine_version_they_were_measured_on(tmp_path):
    from kvsim.profiles.calibrate import batch_config

    assert batch_config(4, 8, "vllm-v0").enable_chunked_prefill is False
    assert batch_config(4, 8).enable_chunked_prefill is True
    base = default_profile(GPU, MODEL, 4)
    row = Measurement(2, 4, 32, 1024, 16, {})
    v0, v1 = (price_row(MODEL, GPU, base, row, v) for v in ("vllm-v0", "vllm-v1"))
    assert v0.simulated["decode_ms"] > v1.simulated["decode_ms"]  # V0's host terms: Ray calls, outputs
    for version, priced in (("vllm-v0", v0), ("vllm-v1", v1)):  # the prior reproduces each engine
        theta = profile_params(base, 4, version)
        for q, ms in priced.simulated.items():
            assert priced.features[q] @ theta == pytest.approx(ms, rel=1e-9)
    result = CliRunner().invoke(app, ["calibrate", str(EXAMPLE), "--model", "llama2-70b", "--gpu", "H100",
                                      "--engine-version", "vllm-v0", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.stderr
    doc = json.loads((tmp_path / "o" / "H100-SXM-80GB-llama2-70b-tp4.json").read_text())
    assert doc["provenance"]["calibration"]["engine_version"] == "vllm-v0"
    bad = CliRunner().invoke(app, ["calibrate", str(EXAMPLE), "--model", "llama2-70b", "--gpu", "H100",
                                   "--engine-version", "v2", "--out", str(tmp_path / "p")])
    assert bad.exit_code == 2 and "--engine-version must be one of" in bad.stderr
