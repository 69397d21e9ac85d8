"""Issue 27, "every answer": each run, sweep row, plan answer and report names the engine version
it assumes (and the per-GPU defaults it filled), and every kind of run carries the model-error
band (disaggregated, fleet, autoscaled, speculative with --compare-no-spec, --find-max-rate on
request, kvsim sweep --error-bars)."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.profiles import default_profile
from kvsim.profiles.uncertainty import deployment_error, profile_error
from kvsim.simcore.batch_defaults import engine_assumptions, engine_text
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import parse_profile
from kvsim.simcore.specs import EngineConfig

RUN = ["run", "--model", "llama3-8b", "--num-requests", "40", "--rate", "8"]


def _json(args: list[str]) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _inside(bars: dict, summary: dict, keys=("p95_ttft_ms", "mean_tpot_ms", "output_throughput")) -> None:
    for key in keys:
        low, high = bars["metrics"][key]
        assert low <= summary[key] <= high, key
    assert bars["metrics"]["mean_tpot_ms"][1] > summary["mean_tpot_ms"]  # slower steps, slower tokens


def test_engine_text_names_the_version_and_the_defaults_it_filled():
    gpu, model = get_gpu("H100-SXM-80GB"), get_model("llama3-8b")
    plain = engine_assumptions(EngineConfig(), model, gpu, host_overhead_from="host_overhead_by_engine.vllm-v1")
    assert engine_text(plain) == ("vllm-v1 (default), max_num_seqs 256, max_num_batched_tokens 8192; "
                                  "host cost: the profile's vllm-v1 terms")
    filled = engine_assumptions(EngineConfig(engine_version="vllm-0.6", max_num_seqs=256), model, gpu,
                                {"max_num_seqs", "max_num_batched_tokens"}, "offline", given=True,
                                host_overhead_from="host_overhead")
    assert filled["usage_context"] == "offline" and filled["given"]
    assert engine_text(filled).startswith("vllm-0.6, max_num_seqs 256")
    assert "(vLLM's offline defaults on H100-SXM-80GB)" in engine_text(filled)
    assert "host_overhead (not per version)" in engine_text(filled)
    static = engine_assumptions(EngineConfig(policy="static"), model, gpu)
    assert static["engine_version"] is None and "no vLLM version" in engine_text(static)


def test_run_names_its_engine_in_text_json_and_summary_json(tmp_path):
    text = CliRunner().invoke(app, [*RUN, "--no-error-bars"]).stdout
    assert ("Engine: vllm-v1 (default), max_num_seqs 1024, max_num_batched_tokens 8192 (vLLM's server defaults on "
            "H100-SXM-80GB); host cost: the profile's vllm-v1 terms") in text.splitlines()
    doc = _json([*RUN, "--no-error-bars", "--engine-version", "vllm-0.6", "--out", str(tmp_path / "o")])
    assert doc["engine_version"] == "vllm-0.6"
    a = doc["engine_assumptions"]
    assert a["batch_defaults_filled"] == ["max_num_batched_tokens", "max_num_seqs"] and a["usage_context"] == "server"
    assert a["host_overhead_from"] == "host_overhead_by_engine.vllm-0.6"
    written = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert written["engine_version"] == "vllm-0.6" == written["record"]["config"]["engine_version"]
    assert _json([*RUN, "--no-error-bars", "--policy", "static"])["engine_version"] is None


def test_a_disaggregated_run_has_a_band_and_names_each_pools_engine():
    doc = _json([*RUN, "--prefill-replicas", "1", "--decode-replicas", "1", "--decode-max-num-seqs", "64"])
    _inside(doc["error_bars"], doc)
    assert doc["error_bars"]["metrics"]["p95_ttft_ms"][1] > doc["p95_ttft_ms"]
    pools = doc["engine_assumptions"]["pools"]
    assert pools["decode"]["max_num_seqs"] == 64 and pools["prefill"]["max_num_seqs"] == 1024  # vLLM V1 on H100
    assert doc["engine_version"] == "vllm-v1"
    text = CliRunner().invoke(app, [*RUN, "--prefill-replicas", "1", "--decode-replicas", "1"]).stdout
    assert "Engine (both pools): vllm-v1 (default)" in text and "Model error (90% band)" in text


def test_a_fleet_runs_page_names_its_engine(tmp_path):
    result = CliRunner().invoke(app, [*RUN, "--no-error-bars", "--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1",
                                      "--out", str(tmp_path / "f")])
    assert result.exit_code == 0, result.stderr
    page = (tmp_path / "f" / "fleet.html").read_text()
    assert ">Engine</th><td>vllm-v1 (default), max_num_seqs 1024" in page  # the first group's (an H100)
    groups = json.loads((tmp_path / "f" / "summary.json").read_text())["record"]["fleet"]
    assert [(g["max_num_seqs"], g["max_num_batched_tokens"]) for g in groups] == [(1024, 8192), (256, 2048)]


def test_a_fleet_run_has_a_band_from_its_least_certain_profile():
    doc = _json([*RUN, "--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1"])
    _inside(doc["error_bars"], doc)
    assert doc["engine_version"] == "vllm-v1"
    h100 = default_profile(get_gpu("H100-SXM-80GB"), get_model("llama3-8b"), 1)
    measured = parse_profile({**h100.data, "source": "measured"})  # a copy of another kind: the larger error wins
    assert profile_error(h100).median_abs_error == 0.09 and profile_error(measured).median_abs_error == 0.145
    worst = deployment_error([h100, measured])
    assert worst.kind == "measured" and worst.median_abs_error == 0.145 and "largest of 2 profiles" in worst.basis
    assert deployment_error([h100, h100]) == profile_error(h100)


def test_an_autoscaled_run_bands_its_gpu_hours():
    doc = _json(["run", "--num-requests", "60", "--rate", "6", "--autoscale", "--max-replicas", "2"])
    bars = doc["error_bars"]
    _inside(bars, doc)
    low, high = bars["also"]["gpu_hours"]
    assert low <= doc["autoscale"]["gpu_hours"] <= high


def test_compare_no_spec_bands_the_speed_up():
    doc = _json([*RUN, "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}', "--compare-no-spec"])
    ups = doc["error_bars"]["speculation_vs_none"]
    for key in ("speedup_mean_tpot_ms", "speedup_output_throughput"):
        low, high = ups[key]
        assert low <= doc["speculation_vs_none"][key] <= high


def test_find_max_rate_bands_only_when_asked():
    args = ["run", "--num-requests", "60", "--find-max-rate", "--slo-ttft-p95-ms", "60", "--rate", "10"]
    plain = _json(args)
    assert "skipped" in plain["error_bars"] and plain["engine_version"] == "vllm-v1"
    doc = _json([*args, "--error-bars"])
    low, high = doc["error_bars"]["max_sustainable_rate"]
    assert low <= doc["max_sustainable_rate"] <= high and low < high
    text = CliRunner().invoke(app, [*args, "--error-bars"]).stdout
    assert "Model error (90% band, roofline profile" in text


def test_sweep_error_bars_are_columns_only_when_asked(tmp_path):
    args = ["sweep", "--num-requests", "30", "--rate", "4", "--max-num-seqs", "32,64", "--jobs", "1"]
    result = CliRunner().invoke(app, [*args, "--error-bars", "--out", str(tmp_path / "s.csv")])
    assert result.exit_code == 0, result.stderr
    assert "engine vllm-v1 (default)" in result.stdout.splitlines()[0]
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert len(rows) == 2
    for row in rows:
        assert row["engine_version"] == "vllm-v1" and float(row["error_bars"]) == 0.9
        assert float(row["model_error_prefill"]) == float(row["model_error_decode"]) == 0.09  # TP 1: one error
        for key in ("p95_ttft_ms", "p95_tpot_ms", "output_throughput"):
            assert float(row[f"{key}_band_low"]) <= float(row[key]) <= float(row[f"{key}_band_high"])
        assert float(row["p95_tpot_ms_band_high"]) > float(row["p95_tpot_ms"])
    assert "[" in result.stdout.splitlines()[2]  # printed as value [low..high]
    doc = _json([*args])
    assert doc["engine_version"] == "vllm-v1"
    assert not any(k.endswith("_band_low") for k in doc["points"][0])
    report = CliRunner().invoke(app, ["report", "sweep", str(tmp_path / "s.csv"), "--out", str(tmp_path / "r")])
    assert report.exit_code == 0, report.stderr
    page = (tmp_path / "r" / "sweep-report.html").read_text()
    assert ">Engine</th><td>vllm-v1; vLLM" in page and "server step-limit defaults per GPU<" in page


@pytest.mark.parametrize("version", [None, "vllm-0.6"])
def test_plan_answers_name_the_engine(tmp_path, version):
    args = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1", "--rate", "4",
            "--search-requests", "60", "--confirm-requests", "80", "--slo-ttft-p95-ms", "500",
            "--out", str(tmp_path / "p"), *(["--engine-version", version] if version else [])]
    doc = _json(args)
    want = version or "vllm-v1"
    answer = doc["answers"][0]
    assert answer["engine_version"] == want == doc["engine_version"]
    words = ("vllm-v1 (default; vLLM's server defaults per GPU)" if version is None
             else "vllm-0.6 (vLLM's server defaults per GPU; multi-step: decode rounds of 10 steps)")
    assert f"[engine {words};" in answer["line"]
    assert {r["engine_version"] for r in csv.DictReader((tmp_path / "p" / "plan.csv").open())} == {want}


def test_the_attention_backend_a_version_ran_is_stated_and_modelled_where_the_profile_has_its_table(tmp_path):
    import json

    from kvsim.profiles.roofline import build_roofline_profile
    from kvsim.simcore.batch_defaults import prefill_attention_note
    from kvsim.simcore.catalog import get_gpu, get_model

    assert "not modelled" in prefill_attention_note("vllm-0.6", "H100-SXM-80GB", "roofline")  # no per-version table
    assert "not modelled" in prefill_attention_note("vllm-v0", "H200-141GB", "roofline")
    assert "not modelled" not in prefill_attention_note("vllm-v0", "H200-141GB", "roofline", "FlashAttention-2")
    assert "not modelled" not in prefill_attention_note("vllm-v1", "H100-SXM-80GB", "roofline")  # FA3 on Hopper
    assert "not modelled" not in prefill_attention_note("vllm-0.6", "A100-80GB", "roofline")  # FA2 everywhere
    assert prefill_attention_note("vllm-0.6", "H100-SXM-80GB", "calibrated") is None  # the user's own tables
    doc = build_roofline_profile(get_gpu("H100-SXM-80GB"), get_model("llama3-8b"), 1)
    (tmp_path / "with.json").write_text(json.dumps(doc))
    del doc["prefill_attention_by_engine"]  # as generated before per-version tables
    (tmp_path / "without.json").write_text(json.dumps(doc))
    for name, words in (("with", "prefill attention: FlashAttention-2"),
                        ("without", "prefill attention: FA3's curve, this version ran FA2 here (not modelled)")):
        args = [*RUN, "--no-error-bars", "--engine-version", "vllm-0.6", "--profile", str(tmp_path / f"{name}.json")]
        assert "FlashAttention-2" in _json(args)["engine_assumptions"]["prefill_attention"]
        text = CliRunner().invoke(app, args).stdout
        assert words in text and (name == "without") == ("not modelled" in text)


@pytest.mark.parametrize("flag", [["--engine-version", "vllm-0.6"], ["--confidence", "0.9"],
                                  ["--usage-context", "offline"]])
def test_plan_autoscale_refuses_what_it_would_ignore(flag):
    result = CliRunner().invoke(app, ["plan", "--autoscale", "--gpu", "H100", "--tp", "1", *flag])
    assert result.exit_code == 2 and f"{flag[0]} does not apply to plan --autoscale" in result.stderr
    assert result.stderr.count("\n") == 1 and not result.stdout


def test_a_disaggregated_plan_names_the_engine_of_each_answer():
    doc = _json(["plan", "--disagg", "on", "--rate", "4", "--gpu", "H100-SXM-80GB", "--tp", "1",
                 "--search-requests", "60", "--confirm-requests", "80", "--slo-ttft-p95-ms", "500"])
    assert doc["engine_version"] == "vllm-v1"
    assert doc["disagg"]["answers"] and all(a["engine_version"] == "vllm-v1" for a in doc["disagg"]["answers"])
