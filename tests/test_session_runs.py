"""`kvsim run` / `kvsim sweep` on session workloads: one overload judge for run, sweep and plan,
a warning when too few sessions reach the steady state, and --find-max-rate in sessions/s
(issue 25)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.workloads import load_workload

runner = CliRunner()

# 3 turns of 16 new / 32 answer tokens, 1 s think times: a session lasts ~2 s, so runs stay small.
# On llama3-8b / H100 with one sequence at a time a turn takes ~0.25 s: ~4 turns/s served.
SHORT = """name: short-sessions
description: "chat sessions with 1 s think times, a short lifetime keeps test runs small"
sessions: {num_sessions: 60, turns: {dist: fixed, value: 3}, think_time_s: 1.0, think_time_dist: fixed}
arrival: {process: poisson, rate: 1.0}
prompt_len: {dist: fixed, value: 16}
output_len: {dist: fixed, value: 32}
"""
RUN = ["run", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--max-num-seqs", "1"]


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    path = tmp_path_factory.mktemp("wl") / "short-sessions.yaml"
    path.write_text(SHORT)
    return str(path)


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def test_run_calls_a_session_run_overloaded_when_its_queue_grows_while_sessions_start(short, tmp_path):
    """At 5 sessions/s (15 turns/s offered to ~4 served) completed turns keep pace with offered
    ones (3.9 of 4.2 /s once warm) and the whole run's queue slope is 0.02 s/s (< 0.05): the
    turn judge says sustained. While sessions start the queue grows ~1.2 s per s."""
    heavy = runner.invoke(app, [*RUN, "--workload", short, "--rate", "5", "--json", "--out", str(tmp_path)])
    doc = _json(heavy)
    assert doc["queue_wait_slope"] < 0.05 < doc["session_queue_slope"]
    assert doc["saturation"] == "overloaded" and doc["summary"]["saturation"] == "overloaded"
    assert doc["sessions_overloaded"] is True
    assert "queueing delay grows" in heavy.stderr and "while sessions start" in heavy.stderr
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["saturation"] == "overloaded"
    text = runner.invoke(app, [*RUN, "--workload", short, "--rate", "5"])
    assert "OVERLOADED" in text.stdout and "while sessions start (s per s):" in text.stdout
    light = _json(runner.invoke(app, [*RUN, "--workload", short, "--rate", "0.3", "--json"]))
    assert light["saturation"] == "sustained" and light["sessions_overloaded"] is False
    assert light["session_queue_slope"] < 0.05


def test_too_few_sessions_for_the_steady_state_warn_with_the_count_needed():
    # chat-sessions: 3.51 turns, 20 s think time: a session lasts >= 50.2 s; at 8 sessions/s a
    # run needs about 3 x 8 x 50.2 = 1,205 sessions
    few = load_workload("chat-sessions", {"num_requests": 300, "rate": 8}, max_model_len=8192)
    (line,) = [w for w in few.warnings({}) if "steady state" in w]
    assert "300 sessions at 8 sessions/s" in line and "1,205 sessions are needed" in line
    enough = load_workload("chat-sessions", {"num_requests": 1205, "rate": 8}, max_model_len=8192)
    assert not [w for w in enough.warnings({}) if "steady state" in w]
    slow = load_workload("chat-sessions", {"num_requests": 300, "rate": 0.5}, max_model_len=8192)
    assert not [w for w in slow.warnings({}) if "steady state" in w]
    closed = load_workload("chat-sessions", {"num_requests": 30, "concurrency": 8}, max_model_len=8192)
    assert closed.steady_sessions() is None  # a closed loop has no session rate


def test_run_and_sweep_warn_when_too_few_sessions_start(short, tmp_path):
    # at 20 sessions/s a ~2 s session needs 3 x 20 x 2 = 120 sessions; 60 start
    ran = runner.invoke(app, [*RUN, "--max-num-seqs", "64", "--workload", short, "--rate", "20", "--num-requests",
                              "60", "--json"])
    assert ran.exit_code == 0, ran.output
    assert "WARNING 60 sessions at 20 sessions/s" in ran.stderr and "120 sessions are needed" in ran.stderr
    ok = runner.invoke(app, [*RUN, "--workload", short, "--rate", "1", "--json"])
    assert ok.exit_code == 0 and "steady state" not in ok.stderr
    swept = runner.invoke(app, ["sweep", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--workload", short,
                                "--rate", "1,20", "--json", "--out", str(tmp_path / "t.csv")])
    assert swept.exit_code == 0, swept.output
    lines = [x for x in swept.stderr.splitlines() if "steady state" in x]
    assert len(lines) == 1 and "at 20 sessions/s" in lines[0]  # the point that is short, once
    # the sweep report's load axis is the session rate
    from kvsim.reports.sweep_report import _load_axis, load_report

    assert _load_axis(load_report(tmp_path / "t.csv")) == ("rate", "offered rate (sessions/s)")


def test_find_max_rate_searches_sessions_per_second(short):
    result = runner.invoke(app, [*RUN, "--workload", short, "--rate", "1", "--find-max-rate",
                                 "--slo-ttft-p95-ms", "2000", "--tolerance", "0.1"])
    assert result.exit_code == 0, result.output
    assert "sessions per run" in result.stdout
    assert "req/s" not in result.stdout
    found = [x for x in result.stdout.splitlines() if x.startswith("Max sustainable rate:")]
    assert found and "sessions/s" in found[0]
    doc = _json(runner.invoke(app, [*RUN, "--workload", short, "--rate", "1", "--find-max-rate",
                                    "--slo-ttft-p95-ms", "2000", "--tolerance", "0.1", "--json"]))
    assert doc["unit"] == "sessions/s" and 0.5 < doc["max_sustainable_rate"] < 3
    # a rate that fails on the session judge says why
    assert any("while sessions start" in r["why_not"] or "TTFT" in r["why_not"] for r in doc["runs"] if not r["passed"])


def test_find_max_rate_refuses_a_closed_loop_of_sessions(short):
    result = runner.invoke(app, [*RUN, "--workload", short, "--concurrency", "4", "--find-max-rate",
                                 "--slo-ttft-p95-ms", "2000"])
    assert result.exit_code != 0 and "closed loop" in result.output and "Traceback" not in result.output


def test_plan_chart_of_a_session_plan_is_in_sessions_per_second(short, tmp_path, monkeypatch):
    import matplotlib.axes

    labels: list[str] = []
    original = matplotlib.axes.Axes.set_ylabel
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel",
                        lambda self, text, *a, **k: (labels.append(text), original(self, text, *a, **k))[1])
    result = runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1",
                                 "--slo-ttft-p95-ms", "500", "--search-requests", "60", "--confirm-requests", "100",
                                 "--workload", short, "--rate", "1", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / "capacity.png").is_file()
    assert labels and all("sessions/s" in x and "req/s" not in x for x in labels), labels
