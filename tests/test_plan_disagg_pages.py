"""plan.html (`kvsim plan --out DIR`) and disagg.html (`kvsim run --prefill-replicas ... --out DIR`),
rendered by headless Chromium at 1280 px: no console error, the answer before the tables and the
figure, what the answer says matches the run's own JSON, nothing wider than the window."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from tests.chromium import console_errors, measure, render

PLAN = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB,H200-141GB", "--tp", "1,2", "--rate", "10",
        "--search-requests", "100", "--confirm-requests", "200", "--slo-ttft-p95-ms", "200", "--slo-tpot-p95-ms", "30"]
DISAGG = ["run", "--model", "llama3-70b", "--prefill-replicas", "2", "--prefill-tp", "2", "--decode-replicas", "1",
          "--decode-tp", "4", "--workload", "azure-conv", "--rate", "4", "--num-requests", "150"]


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)).replace("&amp;", "&").replace("&lt;", "<")


def _fits(page: Path, tmp: Path) -> dict:
    m = measure(page, tmp)
    assert m["viewport"] == 1280 and m["page"] <= m["viewport"], m
    for table in m["tables"]:
        if table["container"] is not None:
            assert table["width"] <= table["container"] <= m["viewport"], table
    assert all(img["right"] <= m["viewport"] for img in m.get("images", []))
    return m


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "p"
    done = CliRunner().invoke(app, [*PLAN, "--out", str(out)])
    assert done.exit_code == 0, done.stderr
    assert "plan.html" in done.stdout
    return out


def test_the_plan_page_leads_with_the_answer_and_its_serve_line(plan_dir: Path, tmp_path: Path):
    doc = json.loads((plan_dir / "plan.json").read_text())
    best = doc["answers"][0]["best"]
    dom, log = render(plan_dir / "plan.html")
    assert console_errors(log) == []
    answer = dom.index('class="answer"')
    assert answer < dom.index("<table") < dom.index("<figure>") < dom.index('id="made"')
    said = _text(re.search(r'<div class="answer">(.*?)</div>', dom, re.S).group(1))
    assert f"{best['replicas']} x TP{best['tp']} {best['gpu']}" in said
    assert f"${best['usd_per_hour']:,.2f}/h" in said
    assert "TTFT p95 <= 200 ms, TPOT p95 <= 30 ms" in said
    assert "roofline profile" in said and best["profile_source"] == "roofline"
    serve = re.search(r'<pre class="serve"><code>(.*?)</code></pre>', dom, re.S).group(1)
    assert serve == best["vllm_serve"] and serve.startswith("vllm serve meta-llama/")
    assert dom.index('<pre class="serve">') < dom.index("<table")
    # every candidate is a row, the answer's highlighted, the ruled-out ones greyed with their reason
    rows = re.findall(r"<tr( class=\"[^\"]*\")?><td", dom.split("<tbody>")[1].split("</tbody>")[0])
    assert len(rows) == len(doc["candidates"]) == 4
    assert [r for r in rows if "best" in r] == [' class="best"']
    ruled = [c for c in doc["candidates"] if c["status"] != "ok"]
    assert sum("ruled" in r for r in rows) == len(ruled) and ruled
    assert ruled[0]["status"][:40] in _text(dom)
    assert dom.count('src="data:image/png;base64,') == 1


def test_the_plan_page_fits_1280_px(plan_dir: Path, tmp_path: Path):
    m = _fits(plan_dir / "plan.html", tmp_path)
    assert m["tables"][0]["keys"] == ["deployment"]


def test_a_plan_that_finds_nothing_says_so_first(tmp_path: Path):
    out = tmp_path / "none"
    argv = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1", "--rate", "10",
            "--search-requests", "100", "--confirm-requests", "200", "--slo-ttft-p95-ms", "1"]  # nothing meets 1 ms
    done = CliRunner().invoke(app, [*argv, "--out", str(out)])
    assert (out / "plan.html").exists(), (done.exit_code, done.stderr)
    dom, log = render(out / "plan.html")
    assert console_errors(log) == []
    said = _text(re.search(r'<div class="answer">(.*?)</div>', dom, re.S).group(1))
    assert "nothing meets TTFT p95 <= 1 ms" in said and 'class="serve"' not in dom
    assert 'class="best"' not in dom


@pytest.fixture(scope="module")
def disagg_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("disagg") / "d"
    done = CliRunner().invoke(app, [*DISAGG, "--out", str(out)])
    assert done.exit_code == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["disagg.html", "requests.csv", "steps.csv", "summary.json"]
    return out


def test_the_disagg_page_shows_each_pool_and_the_transfers_from_the_summary(disagg_dir: Path):
    doc = json.loads((disagg_dir / "summary.json").read_text())
    dom, log = render(disagg_dir / "disagg.html")
    assert console_errors(log) == []
    assert dom.index('class="answer"') < dom.index("<h2>Per pool</h2>") < dom.index("<h2>KV transfer</h2>") \
        < dom.index("<figure>") < dom.index('id="made"')
    said = _text(re.search(r'<p class="answer">(.*?)</p>', dom, re.S).group(1))
    assert "prefill 2 x TP2 + decode 1 x TP4 (8 GPUs, $24.00/h)" in said  # built-in H100 price $3/GPU-hour
    assert f"served {doc['completed']:,} requests" in said
    t = doc["kv_transfer"]
    assert f"{t['num_transfers']:,} KV transfers" in said and f"{t['mean_transfer_ms']:.2f} ms on average" in said
    pools = dom.split("<h2>Per pool</h2>")[1].split("</table>")[0]
    cells = re.findall(r'<td[^>]*data-value="([^"]*)"', pools)
    for name, pool in doc["pools"].items():
        assert name in cells and f"{pool['replicas']} x TP{pool['tp']}" in cells
        assert repr(pool["utilization"]) in cells or str(pool["utilization"]) in cells
    transfer = dom.split("<h2>KV transfer</h2>")[1].split("</table>")[0]
    values = [float(v) for v in re.findall(r'data-value="([0-9.e+-]+)"', transfer)]
    assert t["p99_transfer_ms"] in values and t["p95_decode_wait_ms"] in values
    assert dom.count('src="data:image/png;base64,') == 1


def test_the_disagg_page_fits_1280_px(disagg_dir: Path, tmp_path: Path):
    m = _fits(disagg_dir / "disagg.html", tmp_path)
    assert m["tables"][0]["keys"] == ["pool"] and m["images"][0]["natural"] >= 1000


def test_plan_disagg_auto_at_two_rates_runs_and_its_page_compares_the_layouts(tmp_path: Path):
    """At 10 req/s the best aggregated deployment (1 GPU) costs less than one disaggregated unit (2 GPUs),
    at 40 req/s not: the unit's cost floor skips the first target instead of dividing by zero."""
    out = tmp_path / "pd"
    done = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1",
                                    "--rate", "10,40", "--search-requests", "100", "--confirm-requests", "200",
                                    "--slo-ttft-p95-ms", "500", "--disagg", "auto", "--out", str(out)])
    assert done.exit_code == 0, (done.stderr, done.exception)
    doc = json.loads((out / "plan.json").read_text())
    dom, log = render(out / "plan.html")
    assert console_errors(log) == []
    section = dom.split("<h2>Disaggregated prefill/decode layouts</h2>")[1]
    for answer in doc["disagg"]["answers"]:
        assert f"At {answer['target_rate']:g} req/s for llama3-8b: <b>{answer['comparison']}" in section
    rows = re.findall(r"<tr[^>]*><td", section.split("<tbody>")[1].split("</tbody>")[0])
    assert len(rows) == len(doc["disagg"]["candidates"]) > 0
