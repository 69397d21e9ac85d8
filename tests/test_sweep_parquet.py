"""`kvsim sweep --out x.parquet`: the same rows as the CSV table, resumable after a kill (rows
collect in a hidden CSV journal until the last point is in), and readable by `report sweep`."""

import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app

pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (pip install '.[parquet]')")
runner = CliRunner()
GRID = ["sweep", "--block-size", "16,32", "--rate", "5,10", "--num-requests", "30", "--jobs", "1"]


def _sweep(*args):
    r = runner.invoke(app, [*GRID, *args])
    assert r.exit_code == 0, r.output
    return r


def _same_rows(parquet, csv):
    a = pd.read_parquet(parquet).drop(columns="wall_s")
    b = pd.read_csv(csv, keep_default_na=False, na_values=["", "nan", "NaN"]).drop(columns="wall_s")
    assert list(a.columns) == list(b.columns) and len(a) == 4
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def test_parquet_table_equals_the_csv_one_and_resumes_after_a_kill(tmp_path):
    _sweep("--out", str(tmp_path / "x.csv"))
    _sweep("--out", str(tmp_path / "x.parquet"))
    assert not (tmp_path / ".x.parquet.rows.csv").exists()  # the journal goes once the table is written
    _same_rows(tmp_path / "x.parquet", tmp_path / "x.csv")
    again = runner.invoke(app, [*GRID, "--out", str(tmp_path / "x.parquet")])
    assert again.exit_code == 2 and "add --resume" in again.stderr
    # a sweep killed after two points: its journal holds their rows (the CSV table's first two)
    lines = (tmp_path / "x.csv").read_text().splitlines(keepends=True)
    (tmp_path / ".y.parquet.rows.csv").write_text("".join(lines[:3]))
    _sweep("--out", str(tmp_path / "y.parquet"), "--resume")
    assert not (tmp_path / ".y.parquet.rows.csv").exists()
    _same_rows(tmp_path / "y.parquet", tmp_path / "x.csv")
    # resuming a finished Parquet sweep runs nothing and keeps its rows
    shutil.copy(tmp_path / "y.parquet", tmp_path / "z.parquet")
    _sweep("--out", str(tmp_path / "z.parquet"), "--resume")
    _same_rows(tmp_path / "z.parquet", tmp_path / "x.csv")
    report = runner.invoke(app, ["report", "sweep", str(tmp_path / "x.parquet"), "--out", str(tmp_path / "rep")])
    assert report.exit_code == 0, report.output
    assert (tmp_path / "rep" / "sweep-report.html").exists()


def test_parquet_without_pyarrow_and_other_suffixes_are_one_line(tmp_path, monkeypatch):
    r = runner.invoke(app, [*GRID, "--out", str(tmp_path / "x.txt")])
    assert r.exit_code == 2 and "give a .csv or .parquet file" in r.stderr
    from kvsim.reports import sweep_table

    monkeypatch.setattr(sweep_table, "has_pyarrow", lambda: False)
    r = runner.invoke(app, [*GRID, "--out", str(tmp_path / "x.parquet")])
    assert r.exit_code == 2 and "needs pyarrow" in r.stderr and not (tmp_path / "x.parquet").exists()
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    monkeypatch.undo()
    r = runner.invoke(app, ["report", "sweep", str(bad)])
    assert r.exit_code == 2 and "not a readable Parquet table" in r.stderr
