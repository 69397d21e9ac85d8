"""An autoscaled run's full-batch capacity (simcore.autoscale_capacity): per replica and the pool's
ceiling in its summary, the traffic's peak against that ceiling, and the warnings an operator
needs (a peak above what --max-replicas can serve; an inflight target above the full batch)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.profiles import default_profile
from kvsim.simcore import ccore
from kvsim.simcore.autoscale import AutoscaleConfig
from kvsim.simcore.autoscale_capacity import peak_offered_rate, peak_window_s, pool_check
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.specs import EngineConfig

# a compressed day's first hours at 200 req/s mean (about 81 req/s then): above two H100 replicas
# of llama3-8b (about 34 req/s each), not above three
OVER = ["run", "--workload", "diurnal", "--rate", "200", "--num-requests", "12000", "--autoscale",
        "--max-replicas", "2", "--provisioning-delay", "60"]


def test_peak_counts_complete_bins_from_zero():
    # bins [0, 60) and [60, 120) are complete (last arrival 125 s); [120, 180) is partial, left out
    assert peak_offered_rate(np.array([0.5, 1.0, 1.5, 61.0, 62.0, 125.0]), 60.0) == 3 / 60.0
    assert peak_offered_rate(np.array([10.0, 12.0, 14.0]), 60.0) == 2 / 4.0  # shorter than a bin: its mean rate
    assert peak_offered_rate(np.array([3.0]), 60.0) is None
    assert peak_window_s(15.0) == 60.0 and peak_window_s(90.0) == 90.0


def test_pool_check_warnings():
    cfg = AutoscaleConfig(min_replicas=1, max_replicas=2, target=32.0)
    arrivals = np.arange(0.0, 120.0, 1 / 81.0)  # 81 req/s for two minutes
    figures, warnings = pool_check(68.0, [34.0], [2], [875], arrivals, cfg, 0.03)
    assert figures["full_batch_capacity_per_replica"] == 34.0 and figures["replicas_for_peak"] == 3
    assert figures["peak_above_capacity"] and len(warnings) == 1
    assert "81.00 req/s" in warnings[0] and "68.00 req/s" in warnings[0] and "needs 3 replicas" in warnings[0]
    fine, quiet = pool_check(68.0, [34.0], [2], [875], np.arange(0.0, 120.0, 1 / 30.0), cfg, 0.03)
    assert quiet == [] and not fine["peak_above_capacity"] and fine["replicas_for_peak"] == 1
    deep = AutoscaleConfig(min_replicas=1, max_replicas=2, target=2000.0)  # 2,200 held (tolerance 0.1), 875 run
    _, warned = pool_check(68.0, [34.0], [2], [875], np.arange(0.0, 120.0, 1 / 30.0), deep, 0.03)
    assert len(warned) == 1 and "target 2000" in warned[0] and "875" in warned[0] and "1,325" in warned[0]
    kv = AutoscaleConfig(min_replicas=1, max_replicas=2, metric="kv", target=80.0)  # a percentage: no batch check
    assert pool_check(68.0, [34.0], [2], [875], np.arange(0.0, 120.0, 1 / 30.0), kv, 0.03)[1] == []


@pytest.fixture(scope="module")
def over_run():
    result = CliRunner().invoke(app, [*OVER, "--json"])
    assert result.exit_code == 0, result.output
    return result


def test_overloaded_pool_reports_and_warns(over_run):
    doc = json.loads(over_run.stdout[over_run.stdout.index("{"):])
    per = doc["full_batch_capacity_per_replica"]
    assert 20.0 < per < 60.0 and doc["full_batch_capacity"] == pytest.approx(2 * per, rel=1e-12)
    assert doc["peak_window_s"] == 60.0 and doc["peak_offered_rate"] > doc["full_batch_capacity"]
    assert doc["replicas_for_peak"] == int(np.ceil(doc["peak_offered_rate"] / per)) >= 3
    assert doc["autoscale"]["capacity"]["full_batch_seqs"] == doc["full_batch_seqs"] > 0  # the section's copy
    line = next(w for w in doc["warnings"] if w.startswith("autoscaling: peak offered rate"))
    assert f"{doc['peak_offered_rate']:.2f}" in line and f"{doc['full_batch_capacity']:.2f}" in line
    assert f"needs {doc['replicas_for_peak']} replicas" in line
    assert "WARNING autoscaling: peak offered rate" in over_run.stderr


def test_text_section_and_page(tmp_path):
    result = CliRunner().invoke(app, [*OVER, "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "Full-batch capacity per replica (req/s):" in result.stdout
    assert "Peak offered rate, busiest 60 s (req/s):" in result.stdout and "(needs 3 replicas)" in result.stdout
    page = (tmp_path / "o" / "autoscale.html").read_text()
    assert "Full-batch capacity per replica" in page and "The peak is above what the pool can serve." in page


@pytest.mark.skipif(not ccore.library(), reason="no compiled core")
def test_cores_agree_on_the_capacity():
    from kvsim.simcore.simulate import prepare
    from kvsim.workloads import load_workload

    model, gpu = get_model("llama3-8b"), get_gpu("H100")
    wl = load_workload("diurnal", {"rate": 200.0, "num_requests": 3000}, max_model_len=8192)
    scaling = AutoscaleConfig(min_replicas=1, max_replicas=2, provisioning_s=60.0, target=2000.0)
    runs = [prepare(model, gpu, EngineConfig(), wl, default_profile(gpu, model, 1), seed=1, autoscale=scaling,
                    engine_core=core).run() for core in ("python", "c")]
    assert [r.record["engine_core"] for r in runs] == ["python", "c"]
    keys = ("full_batch_capacity", "full_batch_capacity_per_replica", "full_batch_seqs", "peak_offered_rate")
    assert [{k: r.summary[k] for k in keys} for r in runs][0] == {k: runs[1].summary[k] for k in keys}
    assert runs[0].warnings == runs[1].warnings and any("inflight target 2000" in w for w in runs[0].warnings)


def test_an_autoscaled_fleet_reports_each_group():
    result = CliRunner().invoke(app, ["run", "--workload", "diurnal", "--rate", "200", "--num-requests", "3000",
                                      "--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1", "--autoscale",
                                      "--provisioning-delay", "60", "--no-error-bars", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout[result.stdout.index("{"):])
    h100, a100 = doc["full_batch_capacity_by_group"]
    assert h100 > a100 > 0 and doc["full_batch_capacity"] == pytest.approx(h100 + a100, rel=1e-12)
    assert len(doc["full_batch_seqs_by_group"]) == 2 and "full_batch_capacity_per_replica" not in doc
    line = next(w for w in doc["warnings"] if w.startswith("autoscaling: peak offered rate"))
    assert "the fleet's 2 replicas" in line and f"{a100:.2f} req/s each" in line
