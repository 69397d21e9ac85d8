"""An engine whose step limit is above what it serves (vLLM V1's 1024 sequences on an H100, the default
engine's) queues inside its batch: no request waits to be scheduled, so the queueing-delay test
alone called such runs sustained (simcore.metrics.saturation)."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore.metrics import saturation_columns

RUN = ["run", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--json", "--no-error-bars"]


def _summary(*args: str) -> dict:
    result = CliRunner().invoke(app, [*RUN, *args])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_a_batch_that_grows_without_a_queue_is_not_called_sustained(monkeypatch):
    doc = _summary("--rate", "60", "--num-requests", "2000")
    assert doc["max_running"] > 900 and doc["queue_wait_slope"] < 0.05  # every arrival admitted
    assert doc["completed_rate_warm"] < 0.6 * doc["offered_rate"]
    assert doc["in_system_slope"] > 0.25 * doc["offered_rate"]
    # was "sustained"; the full-batch capacity (tests/test_full_batch_capacity.py) now calls it overloaded
    assert doc["saturation"] == "overloaded" and doc["capacity_exceeded"] is True
    # without that capacity (a run it does not describe), the fill test alone leaves it not judged
    import kvsim.simcore.simulate as simulate

    monkeypatch.setattr(simulate.Simulation, "_full_batch_capacity", lambda self, *a: None)
    doc = _summary("--rate", "60", "--num-requests", "2000")
    assert doc["saturation"] == "n/a" and doc["still_filling"] is True
    text = CliRunner().invoke(app, [*RUN[:-2], "--rate", "60", "--num-requests", "2000", "--no-error-bars"]).stdout
    assert "n/a (requests in the system still grew when arrivals ended, with little queueing" in text
    # the same load with vLLM 0.6's 256 sequences queues, and is overloaded as before
    assert _summary("--rate", "60", "--num-requests", "2000", "--max-num-seqs", "256")["saturation"] == "overloaded"
    # long enough to reach the 1024-sequence limit, the queue shows and the verdict is overload
    assert _summary("--rate", "40", "--num-requests", "10000")["saturation"] == "overloaded"


def test_a_steady_batch_is_still_sustained():
    doc = _summary("--rate", "30", "--num-requests", "2000")
    assert doc["saturation"] == "sustained" and doc["still_filling"] is False
    assert abs(doc["in_system_slope"]) < 0.1 * doc["offered_rate"]


def test_filling_up_at_the_start_does_not_count():
    """Requests that each live 5 s arriving at 10/s: the system fills to ~50 in the first 5 s, then
    stays; judged from one lifetime after the first arrival, the count is flat: sustained."""
    arrival = np.arange(400) / 10.0
    finish = arrival + 5.0
    out = saturation_columns(arrival, arrival.copy(), finish, np.ones(400, dtype=bool))
    assert out["saturation"] == "sustained" and abs(out["in_system_slope"]) < 0.1
    # each request 0.05 s longer than the one before (finishes 6.7/s): the count grows ~3.3 per s,
    # above a quarter of the rate, with no queueing delay: not judged, still filling
    slow = saturation_columns(arrival, arrival.copy(), arrival + 5.0 + 0.05 * np.arange(400), np.ones(400, dtype=bool))
    assert slow["saturation"] == "n/a" and slow["still_filling"] and slow["in_system_slope"] > 3.0
    # 0.02 s longer each (finishes 8.3/s, the count grows ~1.7 per s): within what a long tail of
    # lifetimes still filling up shows, so it stays sustained
    mild = saturation_columns(arrival, arrival.copy(), arrival + 5.0 + 0.02 * np.arange(400), np.ones(400, dtype=bool))
    assert mild["saturation"] == "sustained" and not mild["still_filling"]


def test_the_bounded_summary_gives_the_same_verdict(monkeypatch):
    import kvsim.simcore.records as records
    import kvsim.simcore.simulate as simulate

    monkeypatch.setattr(simulate.Simulation, "_full_batch_capacity", lambda self, *a: None)  # the fill test alone
    exact = _summary("--rate", "60", "--num-requests", "2000")
    monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 100)
    monkeypatch.setattr(records, "_ROW_CHUNK", 32)
    bounded = _summary("--rate", "60", "--num-requests", "2000")
    assert bounded["saturation"] == exact["saturation"] == "n/a" and bounded["still_filling"]
    assert bounded["in_system_slope"] > 0.25 * bounded["offered_rate"]
