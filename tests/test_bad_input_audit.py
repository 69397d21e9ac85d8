"""What the second bad-input audit fixed that is not a refusal: hostile but valid files stay fast
and bounded, YAML merge keys mean what YAML says, and a rate search with nothing to fail stops."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from kvsim.cli.main import app

GOOD_YAML = "num_requests: 10\narrival: {process: poisson, rate: 2}\nprompt_len: 10\noutput_len: 10\n"


def test_a_yaml_merge_key_is_read_and_a_key_beside_it_wins(tmp_path):
    from kvsim.workloads import load_workload

    path = tmp_path / "w.yaml"
    path.write_text("num_requests: 10\narrival:\n  <<: {process: poisson, rate: 2}\n  rate: 5\n"
                    "prompt_len: 10\noutput_len: 10\n")
    assert load_workload(str(path)).arrival.rate == 5.0


def test_an_error_quoting_a_yaml_alias_bomb_stays_one_short_line(tmp_path):
    bomb = "[" + ", ".join([f"&l0 [{', '.join(['x'] * 10)}]"]
                           + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]) + "]"
    path = tmp_path / "w.yaml"
    path.write_text(GOOD_YAML.replace("prompt_len: 10", f"prompt_len: {bomb}"))
    started = time.process_time()
    result = CliRunner().invoke(app, ["workloads", "show", str(path)])
    assert time.process_time() - started < 2.0
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and len(result.stderr) < 600, result.stderr


def test_workloads_show_of_a_very_long_name_is_fast(tmp_path):
    """rich's highlighter is quadratic in a line's length: 40k characters took ~50 s."""
    path = tmp_path / "w.yaml"
    path.write_text(GOOD_YAML + "name: " + "x" * 40_000 + "\n")
    started = time.process_time()
    result = CliRunner().invoke(app, ["workloads", "show", str(path)])
    assert result.exit_code == 0, result.stderr
    assert time.process_time() - started < 5.0


def test_a_huge_length_spread_is_clipped_with_a_warning_not_an_int64_overflow(tmp_path):
    """Draws of a normal with std 2**53 (the largest allowed) pass int64 range before rounding;
    they are held at 2**53 tokens, then clipped to max_model_len and counted, as any long draw."""
    path = tmp_path / "w.yaml"
    path.write_text(GOOD_YAML.replace("prompt_len: 10", "prompt_len: {dist: normal, mean: 10, std: 9007199254740992}"))
    result = CliRunner().invoke(app, ["run", "--workload", str(path), "--num-requests", "20"])
    assert result.exit_code in (0, 1), (result.stderr, result.exception)  # 1: nothing served is allowed
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "clipped" in result.stderr or "rejected" in result.stderr


def test_a_rate_search_with_nothing_to_fail_stops_at_its_ceiling():
    """Without an SLO a short run is sustained at any rate: the search used to double the rate
    until the float overflowed (a traceback after ~1000 runs); it now stops at start x 2^20."""
    from kvsim.reports.capacity import MAX_DOUBLINGS, SLO, max_sustainable_rate

    calls = []

    def evaluate(rate):
        calls.append(rate)
        return {"saturation": "sustained", "completed": 10}

    found = max_sustainable_rate(evaluate, SLO(None, None, ()), 1.0, 0.02)
    assert found.at_least and 2**MAX_DOUBLINGS * 0.9 <= found.max_rate <= 2**MAX_DOUBLINGS
    assert len(calls) < 100


def test_resuming_a_table_without_a_swept_column_is_refused_before_any_point_runs(tmp_path, monkeypatch):
    import csv

    import kvsim.reports.sweep_runner

    table = tmp_path / "t.csv"
    argv = ["sweep", "--num-requests", "20", "--block-size", "16,32", "--jobs", "1", "--out", str(table)]
    assert CliRunner().invoke(app, argv).exit_code == 0
    rows = list(csv.reader(table.open()))
    i = rows[0].index("block_size")
    with table.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([r[:i] + r[i + 1:] for r in rows[:2]])
    before = table.read_bytes()

    def refuse(*args, **kwargs):
        raise AssertionError("a point ran")

    monkeypatch.setattr(kvsim.reports.sweep_runner, "run_points", refuse)
    result = CliRunner().invoke(app, [*argv, "--resume"])
    assert result.exit_code == 2 and "'block_size' column" in result.stderr, (result.stderr, result.exception)
    assert table.read_bytes() == before


def test_a_full_stdout_is_one_line_and_exit_2_not_a_traceback():
    """`kvsim list models > /dev/full`: the write fails (ENOSPC); one line on stderr, and no second
    complaint from the interpreter's final flush. (A subprocess: only a real file descriptor fails.)"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not Path("/dev/full").exists():
        return
    repo = Path(__file__).resolve().parents[1]
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "kvsim.cli.main", "list", "models"], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=repo, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 2
    assert done.stderr.startswith("kvsim: error: cannot write the output") and done.stderr.count("\n") == 1, done.stderr


def test_an_absurd_rate_is_refused_for_its_span_and_a_long_gap_warning_is_short():
    """1e-300 req/s once ran and printed latencies a 1e300 s float64 clock cannot hold (median TTFT
    0.00 ms); its span is refused now (tests/test_reliability_round5.py). A legal near-idle rate
    still runs, its gap warning one short line."""
    result = CliRunner().invoke(app, ["run", "--num-requests", "10", "--rate", "1e-300"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "years" in result.stderr, result.stderr
    result = CliRunner().invoke(app, ["run", "--num-requests", "3", "--rate", "1e-6", "--no-error-bars"])
    line = next(x for x in result.stderr.splitlines() if "longest gap" in x)
    assert result.exit_code == 0 and "(over a day)" in line and len(line) < 120, line
