"""Reliability, round 5, by name: defects left by earlier sessions (n > 1 groups stalling both
engines, spans past float64's resolution, session labels, report sweep's intervals and
percentiles) and an adversarial pass over every subcommand. Each test is named after the case
it found; a bad input ends in one line on stderr and a non-zero exit before any work, with
nothing written. Same style as test_reliability_round4."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsim.simcore import ccore
from tests.helpers import assert_one_line_error, invoke_cli

TINY = ["--num-requests", "5", "--rate", "5", "--input-len", "64", "--output-len", "8", "--no-error-bars"]


invoke = invoke_cli


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


# --- adversarial pass -------------------------------------------------------------------------


def test_an_interrupted_sweep_ends_its_running_workers_instead_of_waiting_for_their_points():
    """Ctrl-C mid-sweep (--jobs 2): stop_workers read the pool's processes after `shutdown`, which
    sets them to None, so no worker was ended and "kvsim: interrupted" hung at exit until every
    running point finished (minutes). The workers are gone when it returns now."""
    import time

    from kvsim.reports.sweep_runner import process_pool, stop_workers

    pool = process_pool(2)
    for _ in range(3):
        pool.submit(time.sleep, 60)
    processes = list(pool._processes.values())
    assert processes and all(p.is_alive() for p in processes)
    stop_workers(pool)
    # Gone well before their 60 s points would end; polled, since under CI load the pool's own
    # manager thread may reap a worker between our terminate and our join.
    deadline = time.monotonic() + 20
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(p.is_alive() for p in processes)


def test_a_large_dp_prepares_the_compiled_core_once_per_replica(monkeypatch):
    """--dp 20000 took 58 s for 5 requests: every replica's config asked whether any of the dp
    replicas was pipelined (dp x dp). Now once per run (6 s at --dp 20000)."""
    from kvsim.simcore import fastcore

    calls = []
    real = fastcore._pipelined
    monkeypatch.setattr(fastcore, "_pipelined", lambda engines: calls.append(1) or real(engines))
    result = invoke("run", "--dp", "64", "--num-requests", "5", "--no-error-bars")
    assert result.exit_code == 0, result.stderr
    assert 0 < len(calls) <= 4, len(calls)


def _undecodable(tmp_path, name: bytes):
    import os

    return tmp_path / os.fsdecode(name)


def test_a_workload_file_named_in_non_utf8_bytes_sweeps_and_reports(tmp_path):
    """t\\xff.csv: the sweep's rows carried the name's surrogate and pandas (pyarrow strings)
    raised UnicodeEncodeError after every point ran; the report's HTML could not be written
    either. The name shows escaped (t\\udcff) and both finish."""
    trace = _undecodable(tmp_path, b"t\xff.csv")
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,10,10\n1,10,10\n")
    table = _undecodable(tmp_path, b"s\xff.csv")
    result = invoke("sweep", "--rate", "1,2", "--workload", str(trace), "--out", str(table))
    assert result.exit_code == 0, result.stderr
    assert "t\\udcff" in table.read_text(encoding="utf-8")
    report = _undecodable(tmp_path, b"r\xff")
    result = invoke("report", "sweep", str(table), "--out", str(report))
    assert result.exit_code == 0, result.stderr
    assert "s\\udcff.csv" in (report / "sweep-report.html").read_text(encoding="utf-8")


def test_parquet_tables_at_non_utf8_paths_are_written_and_read(tmp_path):
    """pyarrow cannot encode a path that is not UTF-8: `sweep --out s\\xff.parquet` and `plan --out`
    raised UnicodeEncodeError; they write (and read back) through a file handle now."""
    pytest.importorskip("pyarrow")
    table = _undecodable(tmp_path, b"q\xff.parquet")
    args = ("sweep", "--rate", "1,2", "--num-requests", "20", "--input-len", "64", "--output-len", "8")
    assert invoke(*args, "--out", str(table)).exit_code == 0
    assert invoke("report", "sweep", str(table), "--out", str(tmp_path / "r")).exit_code == 0
    out = _undecodable(tmp_path, b"plan\xff")
    result = invoke("plan", "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1", "--model", "llama3-8b",
                    "--search-requests", "60", "--confirm-requests", "60", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert (out / "plan.parquet").stat().st_size > 0


def test_a_workload_that_is_a_symlink_loop_is_named_as_one(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert_one_line_error(invoke("run", "--workload", str(tmp_path / "a")), "symbolic link to nothing")


def test_a_run_with_stderr_closed_still_prints_its_result():
    """`kvsim run 2>&-`: Python's sys.stderr is None, the progress bar's isatty() raised, and the
    run ended (exit 1, nothing said) before its result. Notes go nowhere now; the result prints."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "kvsim.cli.main", "run", *TINY], capture_output=False,
                          stdout=subprocess.PIPE, text=True, cwd=repo, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(repo)}, preexec_fn=lambda: os.close(2))
    assert done.returncode == 0
    assert "Serving Benchmark Result" in done.stdout and "Simulated in" in done.stdout


# --- adversarial pass over the session's new profile fields and calibration inputs (rel6) ------


def _edited_profile(tmp_path, edit, name="H100-SXM-80GB-llama3-8b-tp2.json"):
    """A shipped profile, hand-edited by `edit(doc)`, written under tmp_path."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "profiles" / name).read_text())
    edit(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


SPLITWISE = "profiles/examples/splitwise-h100-llama2-70b.csv"


def _examples(name):
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / name


def test_a_measurements_column_given_twice_is_refused(tmp_path):
    """A header `tp,...,prefill_ms,prefill_ms` (or `tp,tp,...`): csv.DictReader kept the last such
    column and dropped the other, so calibrate fitted and `profile check` priced whichever came last
    without a word. Now one line names the column, and calibrate writes nothing."""
    lines = _examples(SPLITWISE).read_text().splitlines()[:8]
    doubled = [lines[0].replace("prefill_ms", "prefill_ms,prefill_ms")]
    doubled += [",".join(c if i != 4 else f"{c},{c}" for i, c in enumerate(row.split(","))) for row in lines[1:]]
    data = tmp_path / "dup.csv"
    data.write_text("\n".join(doubled) + "\n")
    out = tmp_path / "out"
    assert_one_line_error(invoke("calibrate", str(data), "--model", "llama2-70b", "--gpu", "H100-SXM-80GB",
                                 "--out", str(out)), "'prefill_ms' appears twice")
    assert not out.exists()
    assert_one_line_error(invoke("profile", "check", str(data), "--profile", "H100-SXM-80GB-llama2-70b-tp2"),
                          "'prefill_ms' appears twice")


def test_profile_check_with_two_profiles_of_one_tp_is_refused(tmp_path):
    """`profile check --profile A --profile B` with A and B both TP 2 priced every TP-2 row with A
    and ignored B silently (swap them and the medians changed). Now refused, naming both."""
    other = _edited_profile(tmp_path, lambda d: None, "H100-SXM-80GB-llama2-70b-tp2.json")
    result = invoke("profile", "check", str(_examples(SPLITWISE)), "--profile", "H100-SXM-80GB-llama2-70b-tp2",
                    "--profile", str(other))
    assert_one_line_error(result, "are both TP 2", "one profile per TP")


def test_a_prefill_time_scale_past_the_kernel_bound_is_refused(tmp_path):
    """prefill_attention_by_engine.vllm-v0.time_scale hand-edited to 1e300: each factor was checked
    finite and positive but not the scaled table, so `run --engine-version vllm-v0` printed TTFTs of
    1e300 ms (and numpy overflow warnings) with exit 0. The scaled cells now obey the tables' bound."""
    def edit(doc):
        doc["prefill_attention_by_engine"]["vllm-v0"]["time_scale"][0][0] = 1e300

    path = _edited_profile(tmp_path, edit)
    for version in ("vllm-v0", "vllm-v1-async"):  # every entry is checked, whichever is picked
        assert_one_line_error(invoke("run", "--profile", str(path), "--tp", "2", "--engine-version", version, *TINY),
                              "prefill_attention_by_engine.vllm-v0.time_scale[0]", "not a plausible kernel time")


def test_an_absurd_all_reduce_call_count_is_refused(tmp_path):
    """collectives.all_reduce_calls_per_layer 1e300 (finite, >= 0) was accepted: every step cost
    ~1e300 ms, both cores printed such TTFTs with exit 0. Now one line (Megatron TP makes 2)."""
    path = _edited_profile(tmp_path, lambda d: d["collectives"].__setitem__("all_reduce_calls_per_layer", 1e300))
    assert_one_line_error(invoke("run", "--profile", str(path), "--tp", "2", *TINY),
                          "all_reduce_calls_per_layer", "not a plausible count")


@pytest.mark.parametrize("args", [("run", "--rate"), ("plan", "--disagg"), ("calibrate", "x.csv", "--tp")])
def test_an_option_missing_its_value_is_one_line_without_a_doubled_prefix(args):
    """`kvsim run --rate` printed "kvsim: error: kvsim: Option '--rate' requires an argument.":
    click raises that one without a context, and the handler named "kvsim" for it."""
    result = invoke(*args)
    assert_one_line_error(result, f"Option '{args[-1]}' requires an argument")
    assert "kvsim: error: kvsim:" not in result.stderr


@pytest.mark.parametrize("field, value, needle", [
    ("data_tps", 2, "data_tps: expected a list of integers"),
    ("residuals", 5, "residuals: expected a list of objects"),
    ("errors_by_tp", [1], "errors_by_tp: expected an object"),
    ("loo_median_abs_error", float("nan"), "loo_median_abs_error: nan is not a finite number"),
    ("loo_median_abs_error", -0.5, "must be >= 0"),
    ("residuals", [{"quantity": "decode_ms", "loo_error": "abc"}], "residuals[0].loo_error: 'abc'"),
    (None, "x", "provenance.calibration: expected an object"),
])
def test_a_hand_edited_calibration_record_is_refused_before_the_run(tmp_path, field, value, needle):
    """A calibrated profile whose provenance.calibration was hand-edited (data_tps 2, residuals 5,
    a loo_error 'abc', ...): the run printed its table, then error bars (on by default) read the
    record and died with a traceback (TypeError / ValueError / AttributeError), exit 1; a NaN
    error passed uncertainty's cap and failed on a NaN factor after the table. The record is now
    checked when the profile is read: one line, nothing printed."""
    def edit(doc):
        doc["source"] = "calibrated"
        cal = doc.setdefault("provenance", {}).setdefault("calibration", {"data_tps": [2], "rows": 3})
        if field is None:
            doc["provenance"]["calibration"] = value
        else:
            cal[field] = value

    path = _edited_profile(tmp_path, edit)
    result = invoke("run", "--profile", str(path), "--tp", "2", *TINY[:-1])  # error bars on
    assert_one_line_error(result, "provenance", needle)
