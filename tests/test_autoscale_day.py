"""A day of any size under the autoscaler (issue 29): hourly SLO attainment, each replica's
requests and the run's end are counted as request rows leave (simcore.records.RequestRecords:
AttainmentTally, replica_requests, max_finish_s), so a run past the kept-row cap (tiny caps
here) reports them without its rows, the same in both engine cores and the same as counted from
kept rows."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.profiles import default_profile
from kvsim.simcore import ccore
from kvsim.simcore.autoscale import hourly_attainment, run_attainment
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.config import resolve
from kvsim.simcore.records import AttainmentTally, derived_latencies
from kvsim.simcore.simulate import prepare
from tests.helpers import assert_same_requests, assert_same_value
from tests.test_fastcore_equivalence import _random_case
from tests.test_fleet_core import _day, _policy

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]
pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


def test_a_tally_counts_as_the_rows_do():
    """By hand: hours of 10 s; TTFT <= 100 ms and TPOT <= 20 ms; a rejected request (no TTFT)
    misses, a one-token answer (no TPOT) meets TPOT; an hour without requests has no attainment."""
    arrival = np.array([1.0, 2.0, 9.99, 10.0, 35.0])
    ttft = np.array([0.05, 0.2, np.nan, 0.1, 0.01])
    tpot = np.array([0.01, 0.01, np.nan, np.nan, 0.03])
    tally = AttainmentTally(10.0, 100.0, 20.0)
    tally.add(arrival[:2], ttft[:2], tpot[:2])  # in two batches: the counts add up
    tally.add(arrival[2:], ttft[2:], tpot[2:])
    assert [(r["requests"], r["met"]) for r in tally.rows()] == [(3, 1), (1, 1), (0, 0), (1, 0)]
    assert [r["attainment"] for r in tally.rows()] == [1 / 3, 1.0, None, 0.0]
    assert hourly_attainment(arrival, ttft, tpot, 100.0, 20.0, 10.0) == [
        {"hour": 0, "requests": 3, "attainment": 1 / 3}, {"hour": 1, "requests": 1, "attainment": 1.0},
        {"hour": 2, "requests": 0, "attainment": None}, {"hour": 3, "requests": 1, "attainment": 0.0}]


def test_past_the_row_cap_both_cores_count_the_same_day(monkeypatch):
    """Autoscaled days whose rows are not kept (cap 40, chunks of 16): the C core and the Python
    reference give the same hourly counts, autoscale record, per-replica counts and summary, and
    the counts equal those of the same run with every row kept."""
    import kvsim.simcore.records as records

    key = (0.25, 30.0, 5.0)  # "hours" of 0.25 s over a day of a few seconds
    kept_runs = {}
    for capped in (False, True):
        if capped:
            monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 40)
            monkeypatch.setattr(records, "_ROW_CHUNK", 16)
        for case in range(4):
            rng = np.random.default_rng(6100 + case)
            config, _ = _random_case(rng)
            workload = _day(rng, config.max_model_len)
            policy = _policy(rng, int(rng.integers(2, 5)))
            cfg = resolve(TINY, H100, config)
            runs = [prepare(TINY, H100, cfg, workload, default_profile(H100, TINY, 1), seed=case, autoscale=policy,
                            engine_core=core, exact_steps=core == "python", attainment=key).run()
                    for core in ("c", "python")]
            c, p = runs
            assert c.record["engine_core"] == "c" and p.record["engine_core"] == "python"
            assert c.records.kept is p.records.kept is (not capped), case
            context = f"case {case} capped {capped}"
            assert c.record["autoscale"] == p.record["autoscale"], context
            for key_ in c.summary:
                assert_same_value(c.summary[key_], p.summary[key_], key_, context)
            for name in ("requests", "met"):
                assert (getattr(c.records.attainment, name) == getattr(p.records.attainment, name)).all(), context
            assert (c.records.replica_requests == p.records.replica_requests).all(), context
            assert (c.records.replica_positions == p.records.replica_positions).all(), context
            assert c.records.max_finish_s == p.records.max_finish_s, context
            assert run_attainment(c, *key[1:], key[0]) == run_attainment(p, *key[1:], key[0]), context
            if not capped:
                assert_same_requests(c.requests, p.requests, context)
                kept_runs[case] = c
                cols = c.records.columns()  # the counts are those of the kept rows
                ttft, _, tpot = derived_latencies(cols)
                assert [(r["hour"], r["requests"], r["attainment"]) for r in c.records.attainment.rows()] == [
                    (r["hour"], r["requests"], r["attainment"]) for r in
                    hourly_attainment(cols["arrival_s"], ttft, tpot, key[1], key[2], key[0])], context
                assert c.records.max_finish_s == float(np.nanmax(cols["finish_s"])), context
                assert (c.records.replica_requests == np.bincount(cols["replica"].astype(np.int64),
                                                                  minlength=len(c.records.replica_requests))).all()
            else:  # past the cap: the same figures as with every row kept
                kept = kept_runs[case]
                assert c.record["autoscale"] == kept.record["autoscale"], context
                assert run_attainment(c, *key[1:], key[0]) == run_attainment(kept, *key[1:], key[0]), context
                assert len(c.records.attainment.rows()) > 1, "the day should span several hours"
                with pytest.raises(Exception, match="counted while it runs"):  # other SLOs: rows are gone
                    run_attainment(c, 1.0, None, key[0])


def test_a_fleet_past_the_row_cap_reports_its_groups(tmp_path, monkeypatch):
    """`run --fleet ... --out` past the kept rows (tiny cap): the Fleet lines and fleet.html's per-group
    requests and output tokens come from the per-replica counts, equal to those of the kept run."""
    import re

    from typer.testing import CliRunner

    import kvsim.simcore.records as records
    from kvsim.cli.main import app

    path = tmp_path / "day.yaml"
    path.write_text("name: d\nnum_requests: 600\narrival: {process: poisson, rate: 20.0}\n"
                    "prompt_len: {dist: lognormal, mean: 161, cv: 1.0}\noutput_len: {dist: lognormal, mean: 100, cv: 1.0}\n")
    outputs = []
    for capped in (False, True):
        if capped:
            monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 100)
            monkeypatch.setattr(records, "_ROW_CHUNK", 32)
        out = tmp_path / f"out{int(capped)}"
        ran = CliRunner().invoke(app, ["run", "--workload", str(path), "--fleet", "H100:1:1,H200:1:2", "--out", str(out),
                                       "--no-error-bars"])
        assert ran.exit_code == 0, ran.stderr
        lines = ran.stdout[ran.stdout.index("Fleet---"): ran.stdout.index("Simulated in")]
        page = (out / "fleet.html").read_text()
        served = re.findall(r"([0-9.]+%)", page[page.index("Per GPU group"): page.index("The whole fleet")])
        outputs.append((lines, served))
    assert outputs[0] == outputs[1] and "requests" in outputs[1][0] and len(outputs[1][1]) == 2
