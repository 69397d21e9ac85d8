"""SLOs at any percentile (`--slo ttft:p99:800`): parsing, the early-stop proof for any q, the plan
and sweep carrying them, and p95 SLOs giving exactly the plan they gave before."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.capacity import SLO, Target, parse_slo_targets
from kvsim.simcore.errors import ConfigError
from tests.test_capacity import STEP_S, N, _toy_run

runner = CliRunner()


def test_parse_targets_and_shorthands():
    got = parse_slo_targets(["ttft:p99:800", "e2el:90:20000,itl:p99.9:40"], slo_tpot_p95_ms=50)
    assert [t.spec for t in got] == ["tpot:p95:50", "ttft:p99:800", "e2el:p90:20000", "itl:p99.9:40"]
    slo = SLO.of(got)
    assert slo.tpot_p95_ms == 50 and slo.ttft_p95_ms is None  # a p95 TPOT is the shorthand's field
    assert [t.key for t in slo.percentile_ms] == ["p99_ttft_ms", "p90_e2el_ms", "p99.9_itl_ms"]
    assert slo.text() == "TPOT p95 <= 50 ms, TTFT p99 <= 800 ms, E2EL p90 <= 20000 ms, ITL p99.9 <= 40 ms"
    # --slo ttft:p95:X is exactly --slo-ttft-p95-ms X
    assert SLO.of(parse_slo_targets(["ttft:p95:1000"])) == SLO(ttft_p95_ms=1000.0)


@pytest.mark.parametrize("bad, words", [
    (["ttft:p99"], "not METRIC:pPERCENTILE:MS"), (["ttfx:p99:5"], "unknown metric"),
    (["ttft:pxx:5"], "not a percentile"), (["ttft:p0:5"], "not in (0, 100]"), (["ttft:p101:5"], "not in (0, 100]"),
    (["ttft:p99:-1"], "finite number of ms > 0"), (["ttft:p99:inf"], "finite number of ms > 0"),
    (["ttft:p99:1", "ttft:99:2"], "given twice"),
])
def test_bad_targets_are_refused(bad, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_slo_targets(bad)
    with pytest.raises(ConfigError, match="given twice"):
        parse_slo_targets(["ttft:p95:5"], slo_ttft_p95_ms=5)


@pytest.mark.parametrize("q", [50.0, 90.0, 95.0, 99.0, 99.9, 100.0])
@pytest.mark.parametrize("n", [1, 2, 7, 100, 600, 601])
def test_exceedances_to_fail_is_exactly_numpys_rule(q, n):
    """With k of n values above the limit, numpy's percentile is above it whatever the values
    once k reaches the count the early stop waits for, and can still be below it one short of
    it (values far under the limit, the others just over); the count never falls as n grows."""
    target = Target("ttft", q, 1.0)
    need = target.exceedances_to_fail(n)
    for k in range(n + 1):
        far = np.concatenate([np.full(n - k, 0.5), np.full(k, 2.0)])
        close = np.concatenate([np.full(n - k, 0.0), np.full(k, 1.0 + 1e-9)])
        if k >= need:
            assert np.percentile(far, q) > 1.0 and np.percentile(close, q) > 1.0, (q, n, k, need)
        else:
            assert np.percentile(close, q) <= 1.0, (q, n, k, need)
    assert target.exceedances_to_fail(n + 1) >= need


def test_p95_count_is_the_one_the_planner_always_used():
    for n in (50, 600, 2000):
        assert Target("ttft", 95.0, 1.0).exceedances_to_fail(n) == n - int(np.floor(0.95 * (n - 1)))
    assert Target("ttft", 99.0, 1.0).exceedances_to_fail(600) == 7  # a p99 is lost after 7 slow requests


@pytest.mark.parametrize("rate", [9.5, 10.4, 11.0, 14.0])
@pytest.mark.parametrize("metric", ["ttft", "e2el"])
def test_early_stop_at_p99_only_stops_runs_that_fail(rate, metric):
    limit = STEP_S * 1000 + 500 + (100 if metric == "e2el" else 0)
    slo = SLO.of([Target(metric, 99.0, limit)])
    stopped, full = _toy_run(rate, slo, True), _toy_run(rate, slo, False)
    assert f"p99_{metric}_ms" in full
    assert bool(slo.failures(stopped)) == bool(slo.failures(full))
    if "early_stop" in stopped:
        key = f"p99_{metric}_ms"
        assert limit < stopped[key] <= full[key]
        assert stopped["completed_so_far"] < N
    if rate >= 14.0:
        assert "early_stop" in stopped


def test_a_percentile_the_summary_lacks_is_computed_for_the_search():
    slo = SLO.of([Target("ttft", 90.0, 1e9), Target("itl", 50.0, 1e9)])
    full = _toy_run(9.0, slo, False)
    assert full["p90_ttft_ms"] <= full["p95_ttft_ms"] and full["p50_itl_ms"] > 0
    assert not slo.failures(full)


PLAN = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1,2", "--rate", "4",
        "--input-len", "512", "--output-len", "64", "--search-requests", "120", "--confirm-requests", "200"]


def _plan_json(*slo: str) -> dict:
    result = runner.invoke(app, [*PLAN, *slo, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def test_a_p95_slo_spelled_with_slo_plans_exactly_as_the_shorthand():
    a = _plan_json("--slo-ttft-p95-ms", "200", "--slo-tpot-p95-ms", "20")
    b = _plan_json("--slo", "ttft:p95:200", "--slo", "tpot:p95:20")
    assert a == b
    assert a["candidates"][0]["slo"] == "ttft:p95:200 tpot:p95:20"
    assert a["answers"][0]["slo"]["ttft_p95_ms"] == 200


def test_a_p99_plan_records_its_slo_and_confirms_against_it():
    doc = _plan_json("--slo", "ttft:p99:200", "--slo", "tpot:p99:20")
    best = doc["answers"][0]["best"]
    assert best is not None and best["confirmed"].startswith("yes")
    assert best["slo"] == "ttft:p99:200 tpot:p99:20"
    assert 0 < best["ttft_p99_ms"] <= 200 and 0 < best["tpot_p99_ms"] <= 20
    assert doc["answers"][0]["slo"]["targets"] == ["ttft:p99:200", "tpot:p99:20"]
    assert "TTFT p99 <= 200 ms" in doc["answers"][0]["line"] and "TTFT p99 " in doc["answers"][0]["line"]
    text = runner.invoke(app, [*PLAN, "--slo", "ttft:p99:200", "--slo", "tpot:p99:20"])
    assert text.exit_code == 0 and "TTFT p99 ms" in text.stdout


def test_an_slo_out_of_reach_when_idle_is_pruned_at_its_percentile():
    doc = _plan_json("--slo", "ttft:p99:1")  # no prefill of 512 tokens takes 1 ms
    assert doc["answers"][0]["best"] is None
    assert "on an idle replica TTFT p99 is at least" in doc["answers"][0]["why_none"]
    assert all(c["status"].startswith(("prefill time", "memory")) for c in doc["candidates"])


@pytest.mark.parametrize("args, words", [
    (["--slo", "ttft:p99"], "--slo: 'ttft:p99' is not METRIC"),
    (["--slo", "ttft:p95:5", "--slo-ttft-p95-ms", "5"], "TTFT p95 is given twice"),
])
def test_plan_refuses_bad_slos_in_one_line(args, words):
    result = runner.invoke(app, [*PLAN, *args])
    assert result.exit_code != 0
    assert words in result.output and "Traceback" not in result.output


def test_run_takes_slo_only_for_the_rate_search():
    result = runner.invoke(app, ["run", "--num-requests", "50", "--slo", "ttft:p99:100"])
    assert result.exit_code != 0 and "--slo applies only with --find-max-rate" in result.output


def test_sweep_slo_at_p90_adds_its_column_and_judges_it():
    args = ["sweep", "--rate", "5,40", "--num-requests", "150", "--input-len", "512", "--output-len", "64",
            "--jobs", "1", "--json"]
    loose = runner.invoke(app, [*args, "--slo", "ttft:p90:100000"])
    tight = runner.invoke(app, [*args, "--slo", "ttft:p90:0.01"])
    for result in (loose, tight):
        assert result.exit_code == 0, result.output
    pl, pt = (json.loads(r.stdout[r.stdout.index("{"):])["points"] for r in (loose, tight))
    assert all(p["ttft_p90_ms"] is not None and p["ttft_p90_ms"] <= p["ttft_p95_ms"] for p in pl)
    assert not any(p["meets_slo"] for p in pt)
    assert [p["meets_slo"] for p in pl] == [p["load"] != "overloaded" for p in pl]


def test_report_sweep_judges_percentile_slos(tmp_path):
    """`kvsim report sweep --slo`: a p99 target is judged on the table's p99 columns (every run
    records them); the sweep's own --slo is the default; a percentile the table lacks is refused."""
    from kvsim.reports.sweep_report import load_report

    table = tmp_path / "t.csv"
    swept = runner.invoke(app, ["sweep", "--rate", "5,40", "--num-requests", "150", "--input-len", "512",
                                "--output-len", "64", "--jobs", "1", "--slo", "ttft:p90:100000", "--out", str(table)])
    assert swept.exit_code == 0, swept.output
    loose = runner.invoke(app, ["report", "sweep", str(table), "--slo", "ttft:p99:100000", "--out", str(tmp_path / "a")])
    tight = runner.invoke(app, ["report", "sweep", str(table), "--slo", "ttft:p99:0.01", "--out", str(tmp_path / "b")])
    for result in (loose, tight):
        assert result.exit_code == 0, result.output
    page = (tmp_path / "b" / "sweep-report.html").read_text()
    assert "TTFT p99 &lt;= 0.01 ms" in page or "TTFT p99 <= 0.01 ms" in page
    assert "No point meets the SLO (TTFT p99 &lt;= 0.01 ms)" in page
    assert "TTFT p99 &lt;= 100000 ms" in (tmp_path / "a" / "sweep-report.html").read_text() \
        or "TTFT p99 <= 100000 ms" in (tmp_path / "a" / "sweep-report.html").read_text()
    report = load_report(table, targets=parse_slo_targets(["ttft:p99:0.01"]))
    assert "ttft_p99_ms" in report.cells.columns and not report.cells["meets_slo"].any() and report.best is None
    default = load_report(table)  # the sweep's --slo ttft:p90:100000
    assert [t.spec for t in default.targets] == ["ttft:p90:100000"]
    assert list(default.cells["meets_slo"]) == [load != "overloaded" for load in default.cells["load"]]
    missing = runner.invoke(app, ["report", "sweep", str(table), "--slo", "tpot:p80:50", "--out", str(tmp_path / "c")])
    assert missing.exit_code != 0 and "no p80_tpot_ms values" in missing.output and "Traceback" not in missing.output
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("slo, status, words", [
    ("ttft:p99:1", "prefill time", "already gives TTFT p99 >= "),  # no prefill of 500 tokens takes 1 ms
    ("tpot:p50:0.5", "decode time", "ms at p50 context"),
    ("e2el:p90:5", "request time", "alone already give E2EL p90 >= "),  # 29 decode steps take far longer
])
def test_the_disaggregated_plan_prunes_at_the_slo_s_own_percentile(slo, status, words):
    args = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1", "--rate", "2", "--slo", slo,
            "--disagg", "on", "--disagg-ratios", "1:1,2:1", "--search-requests", "60", "--confirm-requests", "60",
            "--input-len", "500", "--output-len", "30", "--workload", "fixed-batch", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout[result.stdout.index("{"):])
    rows = doc["disagg"]["candidates"]
    assert rows and all(r["status"].startswith(f"{status}: ") and words in r["status"] for r in rows), rows
    assert doc["disagg"]["answers"][0]["best"] is None and doc["disagg"]["num_runs"] == 0  # nothing simulated
