"""Parallel and resumable sweeps: jobs and executors change nothing but wall time, a killed sweep
resumes to exactly the uninterrupted rows, seeds give intervals, a table of other options is refused."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.sweep_runner import mean_ci95, parse_seeds
from kvsim.reports.sweep_table import read_table
from kvsim.simcore.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
GRID = ["--block-size", "8,16", "--gpu-memory-utilization", "0.8,0.9", "--rate", "5,20", "--num-requests", "24"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["sweep", *args])


def rows_of(path: Path) -> pd.DataFrame:
    """The table without wall time (the only column allowed to differ between runs)."""
    return read_table(path).drop(columns=["wall_s"])


def bytes_without_wall_s(path: Path) -> list[list[str]]:
    """The file's cells as written, minus the wall_s column: what must be byte-identical."""
    import csv

    with path.open(newline="") as f:
        lines = list(csv.reader(f))
    drop = lines[0].index("wall_s")
    return [line[:drop] + line[drop + 1:] for line in lines]


def test_two_jobs_give_the_rows_of_one_job(tmp_path: Path):
    one = invoke(*GRID, "--jobs", "1", "--out", str(tmp_path / "one.csv"))
    two = invoke(*GRID, "--jobs", "2", "--out", str(tmp_path / "two.csv"))
    assert one.exit_code == 0 and two.exit_code == 0, one.stderr + two.stderr
    assert one.stdout == two.stdout
    a, b = rows_of(tmp_path / "one.csv"), rows_of(tmp_path / "two.csv")
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 8 and list(a["point"]) == list(range(8)) and a["point_id"].is_unique
    # a tidy row: every option, the metrics, seed, profile hash, version, wall time
    for col in ("model", "gpu", "workload", "rate", "block_size", "gpu_memory_utilization", "policy",
                "max_num_seqs", "seed", "profile_sha256", "kvsim_version", "output_throughput", "p95_ttft_ms",
                "p99_itl_ms", "kv_waste_rate", "regime", "sweep_id"):
        assert col in a.columns, col
    assert (read_table(tmp_path / "two.csv")["wall_s"] > 0).all()
    # the files themselves, not only their parsed rows: grid order, one column order
    assert bytes_without_wall_s(tmp_path / "one.csv") == bytes_without_wall_s(tmp_path / "two.csv")


# Enough requests that a point takes ~0.2 s in the compiled core: the kill must land between rows
# 3 and 8 even when the test machine is loaded (at 80 requests a point took ~10 ms).
KILLED_N = "20000"


def _start(out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "kvsim.cli.main", "sweep", *GRID, "--num-requests", KILLED_N, "--jobs", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def test_a_killed_sweep_resumes_to_exactly_the_uninterrupted_rows(tmp_path: Path):
    killed = tmp_path / "killed.csv"
    proc = _start(killed)
    deadline = time.monotonic() + 60
    while _lines(killed) < 1 + 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    got = _lines(killed) - 1
    assert 3 <= got < 8, f"the kill came too late ({got} rows)"
    with killed.open("a") as f:  # as if killed in the middle of writing a row
        f.write("99,half-written")
    resumed = invoke(*GRID, "--num-requests", KILLED_N, "--jobs", "2", "--out", str(killed), "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    whole = invoke(*GRID, "--num-requests", KILLED_N, "--jobs", "2", "--out", str(tmp_path / "whole.csv"))
    assert whole.exit_code == 0, whole.stderr
    assert resumed.stdout == whole.stdout
    pd.testing.assert_frame_equal(rows_of(killed), rows_of(tmp_path / "whole.csv"))
    assert bytes_without_wall_s(killed) == bytes_without_wall_s(tmp_path / "whole.csv")
    # resuming a finished sweep runs nothing and changes nothing
    before = killed.read_text()
    again = invoke(*GRID, "--num-requests", KILLED_N, "--out", str(killed), "--resume")
    assert again.exit_code == 0 and killed.read_text() == before


def test_resume_refuses_a_table_made_with_other_options(tmp_path: Path):
    out = tmp_path / "t.csv"
    assert invoke("--block-size", "8,16", "--num-requests", "10", "--rate", "5", "--out", str(out)).exit_code == 0
    before = out.read_text()
    for args in (["--block-size", "8,16", "--num-requests", "11", "--rate", "5"],
                 ["--block-size", "8,32", "--num-requests", "10", "--rate", "5"]):
        r = invoke(*args, "--out", str(out), "--resume")
        assert r.exit_code == 2 and "other options" in r.stderr and r.stderr.count("\n") == 1
    again = invoke("--block-size", "8,16", "--num-requests", "10", "--rate", "5", "--out", str(out))
    assert again.exit_code == 2 and "--resume" in again.stderr
    assert out.read_text() == before


def test_seeds_give_means_and_95_percent_intervals(tmp_path: Path):
    out = tmp_path / "s.csv"
    r = invoke("--block-size", "16,32", "--rate", "10", "--num-requests", "30", "--seeds", "0,1,2",
               "--out", str(out), "--json")
    assert r.exit_code == 0, r.stderr
    rows, doc = read_table(out), json.loads(r.stdout)
    assert len(rows) == 6 and sorted(set(rows["seed"])) == [0, 1, 2]
    assert doc["seeds"] == [0, 1, 2] and len(doc["points"]) == 2
    first = doc["points"][0]
    per_seed = rows[rows["point"] == 0]["p95_ttft_ms"].tolist()
    mean, low, high = mean_ci95(per_seed)
    assert first["ttft_p95_ms"] == pytest.approx(mean)
    assert (first["ttft_p95_ms_ci95_low"], first["ttft_p95_ms_ci95_high"]) == (pytest.approx(low), pytest.approx(high))
    assert low < mean < high and first["seeds"] == "0,1,2"
    assert "±" in invoke("--rate", "10", "--num-requests", "20", "--repeats", "2").stdout


def test_mean_ci95_uses_student_t():
    mean, low, high = mean_ci95([1.0, 2.0, 3.0])  # s = 1, n = 3, t(0.975, 2) = 4.303
    assert mean == 2.0 and high - mean == pytest.approx(4.303 / 3 ** 0.5)
    assert mean_ci95([5.0])[0] == 5.0 and pd.isna(mean_ci95([5.0])[1])
    assert parse_seeds(None, 3, 7) == [7, 8, 9] and parse_seeds("4,2", None, 0) == [4, 2]
    for seeds, repeats in (("1,1", None), ("0", 2), (None, 0), ("-1", None)):
        with pytest.raises(ConfigError):
            parse_seeds(seeds, repeats, 0)


def test_ray_executor_gives_the_local_rows(tmp_path: Path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install '.[ray]')")
    # gpu_memory_utilization 0.15 does not fit llama3-8b: rows of another shape, which Ray may finish first
    grid = ["--block-size", "8,16", "--rate", "5,20", "--num-requests", "20", "--seeds", "0,1",
            "--gpu-memory-utilization", "0.15,0.9"]
    local = invoke(*grid, "--jobs", "2", "--out", str(tmp_path / "local.csv"))
    assert local.exit_code == 0, local.stderr
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        remote = invoke(*grid, "--executor", "ray", "--out", str(tmp_path / "ray.csv"))
    finally:
        ray.shutdown()
    assert remote.exit_code == 0, remote.stderr
    assert remote.stdout == local.stdout
    pd.testing.assert_frame_equal(rows_of(tmp_path / "ray.csv"), rows_of(tmp_path / "local.csv"))
    assert bytes_without_wall_s(tmp_path / "ray.csv") == bytes_without_wall_s(tmp_path / "local.csv")


def test_bad_sweep_options_exit_2_before_anything_runs(tmp_path: Path):
    out = tmp_path / "x.csv"
    for args in (["--resume"], ["--address", "auto"], ["--jobs", "0"], ["--seeds", "0,x"],
                 ["--seeds", "0", "--repeats", "2"], ["--rate", "5,abc"], ["--gpu", "H100-SXM-80GB,B300"],
                 ["--executor", "ray", "--address", "127.0.0.1:1"], ["--executor", "ray", "--address", "nowhere"]):
        r = invoke("--num-requests", "5", *args, *(["--out", str(out)] if args != ["--resume"] else []))
        assert r.exit_code == 2 and r.stderr.startswith("kvsim: error: ") and r.stderr.count("\n") == 1, (args, r.stderr)
        assert not out.exists()
    if importlib.util.find_spec("ray") is None:
        r = invoke("--num-requests", "5", "--executor", "ray", "--out", str(out))
        assert r.exit_code == 2 and "pip install '.[ray]'" in r.stderr and not out.exists()
