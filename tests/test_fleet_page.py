"""The run pages of fleets whose replicas are not one fixed kind (reports/fleet_page.py): `kvsim run
--autoscale --out` writes autoscale.html, `kvsim run --fleet --out` writes fleet.html; both render in
headless Chromium with no console error, lead with the answer, and fit a 1280 px window."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.fleet_page import _mean_active, hourly_rows
from tests.chromium import console_errors, measure, render

DIURNAL = """name: diurnal-small
num_requests: 3000
arrival: {process: diurnal, mean_rate: 12.0, peak_to_trough: 4.0, period_s: 250, steps: 10}
prompt_len: {dist: lognormal, mean: 161, cv: 1.0}
output_len: {dist: lognormal, mean: 338, cv: 1.0}
"""
CONFIG = {"target": 24.0, "interval_s": 5.0, "warmup_s": 0.0, "model_load_gbps": 100.0,
          "scale_down_cooldown_s": 30.0, "ttft_slo_ms": 200, "tpot_slo_ms": 15, "price_usd_per_gpu_hour": 2.0}


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))


@pytest.fixture(scope="module")
def autoscaled(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("as")
    (tmp / "day.yaml").write_text(DIURNAL)
    result = CliRunner().invoke(app, ["run", "--workload", str(tmp / "day.yaml"), "--num-requests", "1200",
                                      "--autoscale", "--max-replicas", "3", "--provisioning-delay", "0",
                                      "--autoscale-config", json.dumps(CONFIG), "--out", str(tmp / "out")])
    assert result.exit_code == 0, result.stderr
    assert "autoscale.html" in result.stdout.splitlines()[-1]  # the "Wrote ..." line names it
    return tmp / "out"


def test_mean_active_replicas_is_time_weighted_over_the_hour():
    timeline = [[0.0, 1, 0, 0], [10.0, 3, 0, 0], [30.0, 2, 0, 1]]
    assert _mean_active(timeline, 0.0, 20.0) == pytest.approx((10 * 1 + 10 * 3) / 20)
    assert _mean_active(timeline, 20.0, 40.0) == pytest.approx((10 * 3 + 10 * 2) / 20)
    assert _mean_active(timeline, 5.0, 5.0) is None


def test_autoscale_page_leads_with_cost_and_attainment_against_static_fleets(autoscaled: Path, tmp_path: Path):
    fleet = json.loads((autoscaled / "summary.json").read_text())["autoscale"]
    page = autoscaled / "autoscale.html"
    dom, log = render(page)
    assert console_errors(log) == []
    answer = _text(re.search(r'<p class="answer">(.*?)</p>', dom, re.S).group(1))
    assert dom.index('class="answer"') < dom.index("<table")
    assert f"used {fleet['gpu_hours']:.2f} GPU-hours (${fleet['usd_per_day']:.2f}/day" in answer
    assert f"for {100 * fleet['attainment']:.1f}% of requests" in answer
    peak = fleet["static"][0]
    assert f"sized for the peak ({peak['replicas']} replicas)" in answer
    assert f"{100 * fleet['saving_vs_peak_fleet']:.0f}% fewer GPU-hours" in answer
    # one row per hour of the workload, its mean active replicas within the policy's bounds
    hourly = hourly_rows(fleet)
    assert len(hourly) == len(fleet["hourly"]) and hourly["requests"].sum() == 1200
    lo, hi = fleet["config"]["min_replicas"], fleet["config"]["max_replicas"]
    assert ((hourly["mean_active_replicas"] >= lo) & (hourly["mean_active_replicas"] <= hi)).all()
    assert hourly["mean_active_replicas"].max() > lo  # the fleet scaled up during the day
    tables = re.findall(r'<table class="sortable"[^>]*>.*?</table>', dom, re.S)
    cost, hours = tables[0], tables[1]
    assert _text(cost).count("static, sized for") == 2 and "autoscaled (1-3 replicas)" in _text(cost)
    assert len(re.findall(r"<tr", hours.split("<tbody>")[1])) == len(fleet["hourly"])
    assert dom.count('src="data:image/png;base64,') == 1
    m = measure(page, tmp_path)
    assert m["page"] <= m["viewport"] == 1280
    assert all(t["width"] <= (t["container"] or m["viewport"]) for t in m["tables"]), m["tables"]


def test_fleet_page_reports_each_gpu_group(tmp_path: Path):
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["run", "--model", "llama3-70b", "--fleet", "H100-SXM-80GB:4:2,H200-141GB:2:1",
                                      "--rate", "8", "--num-requests", "200", "--no-error-bars", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    page = out / "fleet.html"
    dom, log = render(page)
    assert console_errors(log) == []
    answer = _text(re.search(r'<p class="answer">(.*?)</p>', dom, re.S).group(1))
    assert "2 x TP4 H100-SXM-80GB + 1 x TP2 H200-141GB (10 GPUs, $32.00/h, $768/day) served 200 requests" in answer
    groups = re.search(r'<table class="sortable"[^>]*>.*?</table>', dom, re.S).group(0)
    rows = re.findall(r"<tr>(.*?)</tr>", groups.split("<tbody>")[1], re.S)
    assert len(rows) == 2
    requests = [int(re.findall(r'data-value="([^"]*)"', r)[3]) for r in rows]
    # the same split the text output prints, from the request table's replica column
    assert sum(requests) == 200
    for r, n in zip(rows, requests, strict=True):
        group = re.findall(r'data-value="([^"]*)"', r)[0]
        printed = re.search(rf"{re.escape(group)}:\s+(\d+) requests", result.stdout)
        assert printed and int(printed.group(1)) == n, (group, n)
    m = measure(page, tmp_path)
    assert m["page"] <= m["viewport"] and all(t["width"] <= (t["container"] or 1280) for t in m["tables"])


def test_a_plain_run_writes_no_page(tmp_path: Path):
    result = CliRunner().invoke(app, ["run", "--num-requests", "5", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["requests.csv", "steps.csv", "summary.json"]
    assert np.isfinite(json.loads((tmp_path / "p" / "summary.json").read_text())["output_throughput"])


def test_an_overloaded_fleet_says_so_in_its_answer(tmp_path: Path):
    """80 req/s on one H100 and one A100 (llama3-8b): the queue grows, and the page's answer is marked
    (60 sustained once vllm-v1's per-sequence host term became V1's measured one)."""
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["run", "--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1", "--rate", "80",
                                      "--num-requests", "1500", "--no-error-bars", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    doc = json.loads((out / "summary.json").read_text())
    assert doc["saturation"] == "overloaded"
    dom, log = render(out / "fleet.html")
    assert console_errors(log) == []
    answer = re.search(r'<p class="answer">(.*?)</p>', dom, re.S).group(1)
    mark = re.search(r'<span class="mark overloaded">([^<]*)</span>', answer)
    assert mark and f"{doc['offered_rate']:.2f} req/s offered" in mark.group(1)


def test_the_answer_names_the_worst_hour_and_a_missing_price():
    from kvsim.reports.fleet_page import autoscale_answer

    fleet = {"config": {"min_replicas": 1, "max_replicas": 4, "metric": "inflight", "target": 32.0},
             "slo": {"ttft_ms": 1000.0, "tpot_ms": 100.0}, "gpu_hours": 0.5, "usd_per_day": None, "attainment": 0.97,
             "hourly": [{"hour": 0, "requests": 10, "attainment": 1.0}, {"hour": 1, "requests": 30, "attainment": 0.9},
                        {"hour": 2, "requests": 0, "attainment": None}],
             "static": [{"sized_for": "the peak", "replicas": 3, "gpu_hours": 0.8, "usd_per_day": None,
                         "attainment": 1.0}], "saving_vs_peak_fleet": 1 - 0.5 / 0.8}
    text = autoscale_answer(fleet)
    assert "Worst hour: 90.0% (hour 1)." in text and "for 97.0% of requests" in text
    assert "no price" in text and "38% fewer GPU-hours than the peak fleet" in text
