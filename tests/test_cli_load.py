"""`kvsim run`: goodput as `vllm bench serve --goodput`, the overload verdict, --find-max-rate."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app

SMALL = ["--model", "llama3-8b", "--input-len", "256", "--output-len", "64"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["run", *args])


def test_goodput_pairs_follow_one_flag_as_in_vllm():
    result = invoke(*SMALL, "--rate", "5", "--num-requests", "60", "--goodput", "ttft:500", "tpot:50", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["goodput_slo_ms"] == {"ttft": 500.0, "tpot": 50.0}
    assert summary["good_requests"] <= summary["completed"]
    assert summary["request_goodput"] == pytest.approx(summary["good_requests"] / summary["duration_s"])
    text = invoke(*SMALL, "--rate", "5", "--num-requests", "60", "--goodput", "ttft:500,e2el:20000")
    assert "Request goodput (req/s):" in text.stdout and "Requests meeting every SLO (%):" in text.stdout


@pytest.mark.parametrize("args, needle", [
    (["--goodput", "ttft=500"], "KEY:VALUE"),
    (["--goodput", "itl:5"], "unknown metric 'itl'"),
    (["--goodput", "ttft:-1"], ">= 0"),
    (["--goodput", "ttft:1", "ttft:2"], "given twice"),
    (["stray:1"], "unexpected argument"),
    (["--slo-ttft-p95-ms", "0"], "--slo-ttft-p95-ms must be"),
    (["--find-max-rate", "--tolerance", "1.5"], "--tolerance"),
])
def test_bad_slo_input_is_one_line(args, needle):
    result = invoke(*SMALL, "--num-requests", "10", *args)
    assert result.exit_code == 2
    assert needle in result.stderr and result.stderr.count("\n") == 1 and result.stdout == ""


def test_an_overloaded_run_is_labelled_in_text_and_json():
    # one H100 serves Llama-3-8B at a few hundred req/s of these; 4000 req/s it cannot
    args = [*SMALL, "--rate", "4000", "--num-requests", "1500"]
    text = invoke(*args)
    assert text.exit_code == 0
    assert "OVERLOADED" in text.stdout and "WARNING overloaded" in text.stderr
    summary = json.loads(invoke(*args, "--json").stdout)["summary"]
    assert summary["saturation"] == "overloaded"
    assert summary["completed_rate_warm"] < 0.9 * summary["offered_rate"]
    calm = json.loads(invoke(*SMALL, "--rate", "5", "--num-requests", "200", "--json").stdout)["summary"]
    assert calm["saturation"] == "sustained"


def test_find_max_rate_prints_runs_and_an_answer(tmp_path):
    out = tmp_path / "mr"
    result = invoke(*SMALL, "--rate", "20", "--num-requests", "150", "--find-max-rate",
                    "--slo-tpot-p95-ms", "20", "--tolerance", "0.1", "--json", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    rate = doc["max_sustainable_rate"]
    passed = [r["rate"] for r in doc["runs"] if r["passed"]]
    failed = [r["rate"] for r in doc["runs"] if not r["passed"]]
    assert rate == max(passed) and min(f for f in failed if f > rate) == pytest.approx(rate * 1.1)
    assert (out / "rates.csv").exists() and (out / "max_rate.json").exists()
    record = json.loads((out / "max_rate.json").read_text())["record"]  # what every result records
    assert record["kvsim_version"] and record["seed"] == 0 and len(record["profile"]["sha256"]) == 64
    assert record["model"]["num_layers"] > 0 and record["config"]["block_size"] == 16
