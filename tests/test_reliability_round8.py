"""Reliability, round 8: an adversarial pass over sweep tables read back (Parquet cells, seeds,
hand-edited columns), options that repeat one value or drop another, SIGTERM, numbers accepted
but meaningless, and the Python API's EngineConfig. Each test is named after the case it found;
a bad input ends in one line on stderr and a non-zero exit before any work, with nothing written.
Same style as test_reliability_round7."""

from __future__ import annotations

import csv
import math
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, invoke_cli
from tests.test_reliability_round3 import (
    alive,
    children_of,
    entries,
    kvsim_process,
    signal_run_out_new,
    wait_for,
)

TINY = ["--num-requests", "5", "--rate", "5", "--input-len", "32", "--output-len", "4", "--no-error-bars"]
SWEEP = ["sweep", "--num-requests", "5", "--input-len", "32", "--output-len", "4", "--jobs", "1"]

invoke = invoke_cli


# --- sweep tables read back -------------------------------------------------------------------


@pytest.fixture(scope="module")
def parquet_sweep(tmp_path_factory):
    pytest.importorskip("pyarrow")
    table = tmp_path_factory.mktemp("pq") / "s.parquet"
    result = invoke(*SWEEP, "--rate", "1,2", "--out", str(table))
    assert result.exit_code == 0, result.stderr
    return table


def _edit_parquet(src: Path, dst: Path, column: str, values) -> Path:
    import pandas as pd

    frame = pd.read_parquet(src)
    frame[column] = values
    frame.to_parquet(dst, index=False)
    return dst


@pytest.mark.parametrize("column, values, needle", [
    ("p95_ttft_ms", [-5.0, -5.0], "row 1: p95_ttft_ms is '-5.0'"),
    ("p95_ttft_ms", [math.inf, 1.0], "row 1: p95_ttft_ms is 'inf'"),
    ("p95_ttft_ms", ["abc", "abc"], "row 1: p95_ttft_ms is 'abc'"),
    ("output_throughput", [1.0, 1e308], "row 2: output_throughput is '1e+308'"),
    ("point", [math.nan, 1.0], "row 1: point is ''"),
    ("seed", [-1, -1], "row 1: seed is '-1'"),
    ("rate", [True, False], "row 1: rate is 'True'"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_report_sweep_checks_a_parquet_tables_cells_as_a_csv_tables(parquet_sweep, tmp_path, column, values, needle):
    """`report sweep x.parquet`: a Parquet table's cells were never checked (only a CSV table's
    were, round 7): an infinite or 1e308 metric ended in matplotlib's "Axis limits cannot be NaN or
    Inf" / numpy's "arange: cannot compute length" tracebacks; a negative latency, a text metric,
    an empty point or a negative seed drew a page. One line naming the row and column now."""
    table = _edit_parquet(parquet_sweep, tmp_path / "t.parquet", column, values)
    out = tmp_path / "r"
    assert_one_line_error(invoke("report", "sweep", str(table), "--out", str(out)), f"t.parquet, {needle}")
    assert not out.exists()


def test_report_sweep_reads_numbers_a_parquet_table_stores_as_text(parquet_sweep, tmp_path):
    table = _edit_parquet(parquet_sweep, tmp_path / "t.parquet", "gpus", ["1", "1"])
    result = invoke("report", "sweep", str(table), "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_sweep_seeded_past_1e15_is_read_back(tmp_path, suffix):
    """Seeds up to 2**53 are allowed, but the table check took seeds only up to 1e15: `sweep
    --seed 2000000000000000 --out x.parquet` ran every point and then failed on its own journal
    (".x.parquet.rows.csv, line 2: seed is ...", the journal left behind, no table); as a CSV
    table, `report sweep` and `--resume` refused it."""
    pytest.importorskip("pyarrow")
    table = tmp_path / f"x{suffix}"
    result = invoke(*SWEEP, "--seed", "2000000000000000", "--out", str(table))
    assert result.exit_code == 0, result.stderr
    assert entries(tmp_path) == [table.name]
    report = invoke("report", "sweep", str(table), "--out", str(tmp_path / "r"))
    assert report.exit_code == 0, report.stderr
    again = invoke(*SWEEP, "--seed", "2000000000000000", "--out", str(table), "--resume")
    assert again.exit_code == 0, again.stderr


def test_repeats_past_the_largest_seed_are_refused():
    """`--seed 2**53 --repeats 2` ran seed 2**53 + 1, past what the table reads back exactly."""
    assert_one_line_error(invoke(*SWEEP, "--seed", str(2**53), "--repeats", "2"), "--repeats 2",
                          "integers up to 9,007,199,254,740,992")


def _edited_csv(src: Path, dst: Path, column: str, value: str) -> Path:
    rows = list(csv.reader(src.open()))
    i = rows[0].index(column)
    for row in rows[1:]:
        row[i] = value
    with dst.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    return dst


@pytest.fixture(scope="module")
def csv_sweep(tmp_path_factory):
    table = tmp_path_factory.mktemp("csv") / "s.csv"
    result = invoke(*SWEEP, "--rate", "1,2", "--block-size", "16,32", "--out", str(table))
    assert result.exit_code == 0, result.stderr
    return table


@pytest.mark.parametrize("column, value, needle", [
    ("wall_s", "abc", "wall_s is 'abc'"),
    ("wall_s", "-1", "wall_s is '-1'"),
    ("gpu_memory_utilization", "nan", "gpu_memory_utilization is 'nan'"),
    ("block_size", "", "block_size is ''"),
])
def test_report_sweep_refuses_a_hand_edited_wall_time_or_engine_option(csv_sweep, tmp_path, column, value, needle):
    """wall_s "abc" ended in "could not convert string to float: 'abcabcabcabc'" (a traceback), -1 or
    1e308 printed a negative or infinite sweep time; an empty block size or a NaN memory share drew
    heatmaps with a NaN axis and matplotlib's warnings on stderr."""
    table = _edited_csv(csv_sweep, tmp_path / "t.csv", column, value)
    out = tmp_path / "r"
    assert_one_line_error(invoke("report", "sweep", str(table), "--out", str(out)), f"line 2: {needle}")
    assert not out.exists()


def test_report_sweep_refuses_two_sweeps_pasted_into_one_table(csv_sweep, tmp_path):
    """Rows of `sweep --rate 1,2` and `sweep --rate 3,4` in one file: the page grouped them by point
    number, so each rate-3 run became a second seed of a rate-1 point (a mean and a 95% interval
    over two different loads); rows given twice were read as two seeds too."""
    other = tmp_path / "o.csv"
    assert invoke(*SWEEP, "--rate", "3,4", "--out", str(other)).exit_code == 0
    lines = csv_sweep.read_text().splitlines(keepends=True)
    pasted = tmp_path / "p.csv"
    pasted.write_text("".join(lines) + "".join(other.read_text().splitlines(keepends=True)[1:]))
    out = tmp_path / "r"
    assert_one_line_error(invoke("report", "sweep", str(pasted), "--out", str(out)), "rows of 2 sweeps")
    twice = tmp_path / "t.csv"
    twice.write_text("".join(lines) + "".join(lines[1:]))
    assert_one_line_error(invoke("report", "sweep", str(twice), "--out", str(out)), "point 0 seed 0 is in the table twice")
    assert not out.exists()


def test_a_report_replaces_an_earlier_reports_heatmaps(csv_sweep, tmp_path):
    """`report sweep A --out r` (block size x rate: four heatmaps), then `report sweep B --out r` (a
    rate sweep: no heatmap): r kept A's heatmaps beside B's page."""
    out = tmp_path / "r"
    assert invoke("report", "sweep", str(csv_sweep), "--out", str(out)).exit_code == 0
    assert len(list(out.glob("heatmap-*.png"))) == 4
    other = tmp_path / "o.csv"
    assert invoke(*SWEEP, "--rate", "3,4", "--out", str(other)).exit_code == 0
    result = invoke("report", "sweep", str(other), "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["sweep-report.html", "throughput-latency.png"]


def test_report_sweep_names_a_profile_hash_edited_into_a_number(csv_sweep, tmp_path):
    """profile_sha256 1e308 (a hash that is all digits reads as a number too): TypeError "'float'
    object is not subscriptable" while the page named the profiles."""
    table = _edited_csv(csv_sweep, tmp_path / "t.csv", "profile_sha256", "1e308")
    result = invoke("report", "sweep", str(table), "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.stderr
    assert "sha256 1e+308" in (tmp_path / "r" / "sweep-report.html").read_text()


def test_report_sweep_checks_the_column_of_a_percentile_written_with_an_exponent(tmp_path):
    """`sweep --slo ttft:p0.0000001:100` adds the column p1e-07_ttft_ms (vLLM's spelling, str of the
    float), which the table check's pattern (p99, p99.9) missed: "abc" there was read as a value
    and the page said "No point meets the SLO"."""
    table = tmp_path / "s.csv"
    result = invoke(*SWEEP, "--rate", "1,2", "--slo", "ttft:p0.0000001:100", "--out", str(table))
    assert result.exit_code == 0, result.stderr
    edited = _edited_csv(table, tmp_path / "t.csv", "p1e-07_ttft_ms", "abc")
    assert_one_line_error(invoke("report", "sweep", str(edited), "--out", str(tmp_path / "r")),
                          "line 2: p1e-07_ttft_ms is 'abc'")


def test_a_sweep_table_or_plot_behind_a_symlink_is_written_through_it(tmp_path):
    """`sweep --out link.csv`, link.csv -> real/s.csv: the table was opened through the link (an empty
    real/s.csv) and then renamed over the link itself, so the file the link names stayed empty and
    the link was gone. Written through the link now, as `>` writes (and `workloads show --plot`)."""
    (tmp_path / "real").mkdir()
    for name, target in (("link.csv", "s.csv"), ("link.png", "p.png")):
        (tmp_path / name).symlink_to(Path("real") / target)
    result = invoke(*SWEEP, "--rate", "1,2", "--out", str(tmp_path / "link.csv"))
    assert result.exit_code == 0, result.stderr
    assert invoke("workloads", "show", "sharegpt", "--plot", str(tmp_path / "link.png")).exit_code == 0
    assert (tmp_path / "link.csv").is_symlink() and (tmp_path / "link.png").is_symlink()
    assert len((tmp_path / "real" / "s.csv").read_text().splitlines()) == 3
    assert (tmp_path / "real" / "p.png").stat().st_size > 0


def test_a_jsonl_trace_saved_with_a_byte_order_mark_is_read(tmp_path):
    """A JSONL trace saved by an editor that writes a UTF-8 byte order mark (Windows Notepad):
    "line 1: invalid JSON (Unexpected UTF-8 BOM)", where the same rows as CSV, a workload YAML or
    a profile with the mark are read."""
    trace = tmp_path / "t.jsonl"
    rows = "".join(f'{{"arrival_s": {i / 4}, "num_prompt_tokens": 32, "num_output_tokens": 4}}\n' for i in range(4))
    trace.write_bytes(b"\xef\xbb\xbf" + rows.encode())
    result = invoke("run", "--workload", str(trace), "--no-error-bars")
    assert result.exit_code == 0, result.stderr
    assert "Successful requests:                     4" in result.stdout


# --- options that repeat one value, or drop one -----------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["sweep", "--kv-offloading-size", "0,none"], "--kv-offloading-size: none is listed twice"),
    (["sweep", "--kv-offloading-size", "4,4.0"], "--kv-offloading-size: 4.0 is listed twice"),
    (["sweep", "--quantization", "none,None"], "--quantization: none is listed twice"),
    (["sweep", "--gpu", "H100-SXM-80GB,h100-sxm-80gb"], "--gpu: H100-SXM-80GB is listed twice"),
    (["plan", "--rate", "2", "--chunked-prefill", "on,true"], "--chunked-prefill: on is listed twice"),
    (["plan", "--rate", "2", "--quantization", "none,NONE"], "--quantization: none is listed twice"),
    (["plan", "--rate", "2", "--gpu", "H100-SXM-80GB,h100-sxm-80gb"], "--gpu: H100-SXM-80GB is listed twice"),
    (["plan", "--rate", "2", "--kv-offloading-size", "0,none"], "--kv-offloading-size: none is listed twice"),
], ids=lambda v: " ".join(v[-2:]) if isinstance(v, list) else None)
def test_one_value_spelled_twice_in_a_list_is_refused(args, needle, tmp_path, monkeypatch):
    """parse_list refused "16,016", but a value spelled two ways ("0,none", "4,4.0", "on,true", a GPU
    in two cases) ran every point twice under two labels (the sweep's table, the plan's candidates)."""
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke(*args, "--num-requests" if args[0] == "sweep" else "--search-requests", "50"),
                          needle)
    assert entries(tmp_path) == []


def test_sweep_refuses_seed_with_seeds():
    """`sweep --seed 5 --seeds 0,1` ran seeds 0 and 1: --seed was dropped without a word."""
    assert_one_line_error(invoke(*SWEEP, "--seed", "5", "--seeds", "0,1"), "give --seed or --seeds, not both")


def test_router_with_one_prefill_instance_is_refused():
    """`run --prefill-replicas 1 --decode-replicas 2 --router round-robin`: recorded prefill_router
    round-robin over one prefill instance (nothing to route), as --router at --dp 1 is refused."""
    result = invoke("run", *TINY, "--prefill-replicas", "1", "--decode-replicas", "2", "--router", "round-robin")
    assert_one_line_error(result, "--router applies to a disaggregated run's prefill pool only with --prefill-replicas > 1")


# --- --out folders ----------------------------------------------------------------------------


def test_a_run_replaces_an_earlier_runs_pages_in_its_out_folder(tmp_path):
    """`run --fleet ... --out o`, then `run --seed 3 --out o`: o kept the fleet's fleet.html (seed 0,
    two GPU groups) beside the new one-GPU summary.json of seed 3, two runs' results in one folder;
    `--find-max-rate --out o` after it kept both runs' tables beside its search. A run's folder
    now holds that run's files (and the user's own, carried over)."""
    out = tmp_path / "o"
    result = invoke("run", *TINY, "--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    (out / "notes.txt").write_text("mine")
    assert invoke("run", *TINY, "--seed", "3", "--out", str(out)).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "requests.csv", "steps.csv", "summary.json"]
    assert invoke("run", *TINY, "--find-max-rate", "--out", str(out)).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["max_rate.json", "notes.txt", "rates.csv"]


def test_session_affinity_on_a_workload_without_sessions_is_refused():
    """`run --dp 2 --router session-affinity` on sharegpt: recorded router session-affinity, and every
    request went least-loaded (simcore.router pins only a session's turns): the figures were, to the
    bit, least-loaded's. Refused for run and sweep; a session workload still takes it."""
    args = ["--num-requests", "5", "--dp", "2", "--router"]
    needle = "--router session-affinity routes the turns of a session; workload sharegpt has no sessions"
    assert_one_line_error(invoke("run", *TINY, *args, "session-affinity"), needle)
    assert_one_line_error(invoke(*SWEEP, *args, "least-loaded,session-affinity"), needle)
    assert_one_line_error(invoke("plan", "--rate", "2", "--router", "least-loaded,session-affinity"), needle)
    result = invoke("run", "--workload", "chat-sessions", "--no-error-bars", *args, "session-affinity")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("name", ["summary.json", "requests.csv"])
def test_save_result_onto_a_file_of_its_own_out_folder_is_refused(tmp_path, name):
    """`run --save-result --result-dir o --result-filename summary.json --out o` printed "Wrote
    o/summary.json" for the vLLM result, which the run's own summary.json then replaced: the
    result file was lost. Refused before the run, nothing made."""
    out = tmp_path / "o"
    result = invoke("run", *TINY, "--save-result", "--result-dir", str(out), "--result-filename", name, "--out", str(out))
    assert_one_line_error(result, f"--out {out} writes its own {name} there")
    assert entries(tmp_path) == []


@pytest.mark.parametrize("policy", [["--policy", "static"], ["--policy", "dynamic"], ["--allocator", "contiguous"]],
                         ids=lambda p: p[1])
def test_samples_under_a_policy_of_one_sequence_per_request_are_refused_before_the_run(policy):
    """`run --policy static --n 2` (dynamic, Orca's contiguous reservations; --beam-width too):
    the whole run was simulated and printed, then "no request was served (8 of 8 rejected: ...
    modelled only by --policy continuous --allocator paged)"; a sweep wrote an empty row for the
    point. Refused before any work now, naming the flag."""
    for flag in ("--n", "--beam-width"):
        assert_one_line_error(invoke("run", *TINY, *policy, flag, "2"),
                              f"{flag} 2: parallel sampling and beam search are modelled only by --policy continuous")
    assert_one_line_error(invoke(*SWEEP, "--policy", "static,continuous", "--n", "2"), "--n 2: parallel sampling")


def test_find_max_rate_over_a_closed_loop_is_refused_before_its_header():
    """`run --find-max-rate --concurrency 3` (the closed-loop seed-table workload, --dataset-name
    sonnet's or offline-batch's requests all at t = 0) printed the search's header and engine line
    on stdout, then refused: a rate search needs open-loop arrivals."""
    for args in (["--concurrency", "3"], ["--workload", "seed-table"], ["--dataset-name", "sonnet"],
                 ["--workload", "offline-batch"]):
        result = invoke("run", "--num-requests", "8", "--find-max-rate", "--no-error-bars", *args)
        assert_one_line_error(result, "a rate search needs open-loop arrivals")
        assert result.stdout == ""


def test_a_plan_without_pyarrow_drops_an_earlier_plans_parquet_table(tmp_path, monkeypatch):
    """`plan --out o` with pyarrow, then again once pyarrow is gone: o kept the first plan's
    plan.parquet beside the second plan's plan.csv and plan.json."""
    pytest.importorskip("pyarrow")
    out = tmp_path / "o"
    args = ["plan", "--rate", "2", "--gpu", "H100-SXM-80GB", "--tp", "1", "--search-requests", "60",
            "--confirm-requests", "100", "--out", str(out)]
    assert invoke(*args).exit_code == 0 and (out / "plan.parquet").exists()
    import kvsim.cli.plan_cmd as plan_cmd

    monkeypatch.setattr(plan_cmd, "_has_pyarrow", lambda: False)
    result = invoke(*args, "--seed", "1")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["capacity.png", "plan.csv", "plan.html", "plan.json"]


# --- numbers accepted but meaningless ---------------------------------------------------------


def test_a_static_batch_timeout_past_the_clocks_span_is_refused():
    """`run --policy static --batch-timeout-s 1e308`: ran, and printed a 309-digit duration, an
    infinite TTFT and numpy overflow warnings."""
    for command in (["run", *TINY], [*SWEEP, "--rate", "1,2"]):
        assert_one_line_error(invoke(*command, "--policy", "static", "--batch-timeout-s", "1e308"),
                              "--batch-timeout-s must be at most 1e+09 s")


@pytest.mark.parametrize("config", ['{"warmup_s": 1e9}', '{"model_load_gbps": 1e-300}'])
@pytest.mark.parametrize("layout", [[], ["--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1"]], ids=["one-gpu", "fleet"])
def test_an_autoscaled_replicas_cold_start_past_a_day_is_refused(config, layout):
    """--provisioning-delay is bounded at a day (round 4: 1e308 printed a 309-digit cold start), but
    --autoscale-config's warmup_s 1e9 or model_load_gbps 1e-300 (weights / 1e-291 B/s) ran, and
    printed "cold start 120 s provisioning + 16060...(300 digits) s load"."""
    result = invoke("run", *layout, "--autoscale", "--workload", "diurnal", "--num-requests", "20", "--no-error-bars",
                    "--autoscale-config", config)
    assert_one_line_error(result, "--autoscale: a replica's cold start would take", "at most 86,400 s (a day)")


def test_engine_config_of_wrong_types_is_a_config_error():
    """The Python API: EngineConfig(gpu_memory_utilization="0.9") raised TypeError, ("no" for
    enable_chunked_prefill) ValueError deep in the engine, and block_size=True ran as 1."""
    from kvsim.simcore import ConfigError, EngineConfig

    for field, value, needle in (("gpu_memory_utilization", "0.9", "must be a number"),
                                 ("enable_chunked_prefill", "no", "must be true or false"),
                                 ("enable_prefix_caching", 0, "must be true or false"),
                                 ("block_size", True, "must be a number"), ("max_num_seqs", "8", "must be a number"),
                                 ("policy", 1, "must be a name")):
        with pytest.raises(ConfigError, match=f"--{field.replace('_', '-')} {needle}"):
            EngineConfig(**{field: value})
    import numpy as np

    assert EngineConfig(enable_chunked_prefill=np.bool_(False)).enable_chunked_prefill == np.bool_(False)


# --- SIGTERM ----------------------------------------------------------------------------------


def test_sigterm_of_run_out_new_leaves_nothing(tmp_path):
    """SIGTERM (kill, timeout, docker stop) of `run --out NEW`: Python's default ended it on the
    spot, silently, and left the staging folder `.NEW.kvsim-*`. Now it ends as a Ctrl-C does:
    one line, exit 143, nothing left."""
    returncode, err = signal_run_out_new(tmp_path, signal.SIGTERM)
    assert returncode == 143, (returncode, err)
    assert err.endswith("kvsim: terminated\n") and "Traceback" not in err, err
    assert entries(tmp_path) == []


def test_sigterm_of_a_sweep_ends_its_workers_and_leaves_no_table(tmp_path):
    """SIGTERM of `sweep --jobs 2 --out s.csv` before any point finished: no line, an empty s.csv
    and the lock file `.s.csv.lock` left behind. Now one line, exit 143, the workers ended, nothing left."""
    proc = kvsim_process("sweep", "--rate", "100,200", "--num-requests", "2000000", "--jobs", "2",
                         "--out", "s.csv", cwd=tmp_path)
    wait_for(lambda: len(children_of(proc.pid)) >= 2, 60, "the workers")
    workers = children_of(proc.pid)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.endswith("kvsim: terminated\n") and "Traceback" not in err, err
    wait_for(lambda: not any(alive(pid) for pid in workers), 10, "the workers to end")
    assert entries(tmp_path) == []
