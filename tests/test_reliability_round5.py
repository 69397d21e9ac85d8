"""Reliability, round 5, by name: defects left by earlier sessions (n > 1 groups stalling both
engines, spans past float64's resolution, session labels, report sweep's intervals and
percentiles) and an adversarial pass over every subcommand. Each test is named after the case
it found; a bad input ends in one line on stderr and a non-zero exit before any work, with
nothing written. Same style as test_reliability_round4."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore import ccore

TINY = ["--num-requests", "5", "--rate", "5", "--input-len", "64", "--output-len", "8", "--no-error-bars"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_one_line_error(result, *needles: str, code: int = 2) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and not result.stdout.strip(), (err, result.stdout)
    for needle in needles:
        assert needle in err, (needle, err)


# --- n > 1: swapped-out groups --------------------------------------------------------------


@pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")
@pytest.mark.parametrize("case", [546, 1090])
def test_swapped_out_groups_no_longer_stall_both_engines(case):
    """Block 4, 48 GPU blocks, swap space 0.001 GiB, groups of 2-4 samples: two groups swapped out
    counted their extra sequences against max_num_seqs although they ran nothing, so neither
    could come back ("simulation stalled" in Python, KV_STALL in C). Every group here fits the
    cache alone (the ones that cannot are rejected at admission); both engines now finish, equal."""
    from tests.test_fastcore_equivalence import _compare
    from tests.test_fastcore_seqgroups import _random_case

    config, workload = _random_case(np.random.default_rng(case))
    config = dataclasses.replace(config, block_size=4, num_gpu_blocks_override=48, swap_space=0.001,
                                 data_parallel_size=1)
    core, _ = _compare(config, workload, seed=case, context=f"stall case {case}")
    assert core.summary["completed"] + core.summary["rejected"] == workload.num_requests
    assert int(core.steps["num_swap_blocks"].sum()) > 0, "the case must swap groups out"
    assert core.steps["num_seqs"].max() <= config.max_num_seqs, "a swapped-in group stays within max_num_seqs"


# --- spans past float64's resolution ----------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("run", "--num-requests", "10", "--rate", "1e-300"),
    ("run", "--num-requests", "2000", "--rate", "1e-6"),
    ("run", "--workload", "diurnal", "--num-requests", "10", "--rate", "1e-300"),
    ("run", "--workload", "chat-sessions", "--num-requests", "3", "--rate", "1e-12"),
    ("run", "--concurrency", "2", "--think-time-s", "1e12", "--num-requests", "10"),
])
def test_a_run_spanning_more_than_1e9_simulated_seconds_is_refused(args):
    """--rate 1e-300 ran and printed a median TTFT of 0.00 ms from a 1e300 s clock; now any
    workload whose planned arrivals (or think times) pass 1e9 s (31.7 years) is one line."""
    assert_one_line_error(invoke(*args), "years) of simulated time", "1e+09 s")


def test_a_trace_spanning_more_than_1e9_s_is_refused_unless_cut_or_rescaled(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,10,10\n1,10,10\n1e15,10,10\n")
    assert_one_line_error(invoke("run", "--workload", str(trace), "--no-error-bars"), "3 requests", "years")
    for cut in (("--num-requests", "2"), ("--rate", "1")):
        result = invoke("run", "--workload", str(trace), "--no-error-bars", *cut)
        assert result.exit_code == 0, result.stderr


def test_a_sweep_point_spanning_more_than_1e9_s_is_refused_before_any_point_runs(tmp_path):
    out = tmp_path / "s.csv"
    result = invoke("sweep", "--rate", "1,1e-300", "--num-requests", "10", "--out", str(out))
    assert_one_line_error(result, "1e-300 req/s")
    assert not out.exists() and not list(tmp_path.iterdir())


# --- session runs: rates of turns, not requests --------------------------------------------


def test_a_session_runs_offered_and_completed_rates_are_labelled_turns_and_its_rate_sessions():
    """A session run's configured rate starts sessions and its requests are turns: "Request rate
    configured (RPS): 0.50" was the session rate, and "Offered/Completed rate (req/s)" counted turns."""
    result = invoke("run", "--workload", "chat-sessions", "--num-requests", "12", "--no-error-bars")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "Session rate configured (sessions/s):    0.50" in out and "Request rate configured" not in out
    assert "Offered rate once warm (turns/s):" in out and "Completed rate once warm (turns/s):" in out
    assert "(req/s):" not in out.split("Load")[1]
    plain = invoke("run", "--num-requests", "200", "--rate", "20", "--input-len", "64", "--output-len", "8", "--no-error-bars")
    assert "Offered rate once warm (req/s):" in plain.stdout and "Request rate configured (RPS):" in plain.stdout


def test_an_overloaded_session_runs_failure_reason_counts_turns():
    from kvsim.reports.capacity import SLO

    reasons = SLO.of(()).failures({"saturation": "overloaded", "offered_rate": 3.0, "completed_rate_warm": 2.0,
                                      "ttft_by_turn": [{"turn": "1"}]})
    assert reasons == ["overloaded (completed 2.00 of 3.00 turns/s offered)"]


# --- report sweep: intervals in the answer, the SLO's percentile in the curves ----------------


@pytest.fixture(scope="module")
def seeded_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seeded")
    table = folder / "s.csv"
    result = invoke("sweep", "--rate", "5,10", "--num-requests", "40", "--input-len", "64", "--output-len", "16",
                    "--seeds", "0,1,2", "--jobs", "1", "--out", str(table))
    assert result.exit_code == 0, result.stderr
    return table


def test_the_report_sweep_answer_carries_the_95_percent_interval_of_a_seeded_sweep(seeded_sweep, tmp_path):
    """Several seeds: the table put each cell's 95% interval under it but the answer sentence
    gave the bare means, surer than the table."""
    from kvsim.reports.sweep_report import _best_sentence, load_report

    report = load_report(seeded_sweep)
    sentence = _best_sentence(report)
    row = report.cells.iloc[report.best]
    assert f"{row['ttft_p95_ms']:,.1f} ms [{row['ttft_p95_ms_ci95_low']:,.1f}\u2013" in sentence, sentence
    assert sentence.endswith("In brackets: 95% interval over 3 seeds."), sentence
    out = tmp_path / "r"
    assert invoke("report", "sweep", str(seeded_sweep), "--out", str(out)).exit_code == 0
    assert "In brackets: 95% interval over 3 seeds." in (out / "sweep-report.html").read_text()


def test_the_report_sweep_curves_draw_the_percentile_the_slo_names(seeded_sweep):
    """--slo ttft:p99:800 judged the answer on TTFT p99 while the curves drew TTFT p95 only."""
    from kvsim.reports.capacity import parse_slo_targets
    from kvsim.reports.sweep_report import curve_panels, load_report

    plain = load_report(seeded_sweep)
    assert curve_panels(plain) == [("ttft_p95_ms", "TTFT p95", None), ("tpot_p95_ms", "TPOT p95", None)]
    judged = load_report(seeded_sweep, targets=parse_slo_targets(["ttft:p99:800", "e2el:p99:9000"]))
    assert curve_panels(judged) == [("ttft_p99_ms", "TTFT p99", 800.0), ("tpot_p95_ms", "TPOT p95", None),
                                    ("e2el_p99_ms", "E2EL p99", 9000.0)]
