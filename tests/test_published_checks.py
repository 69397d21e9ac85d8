"""benchmarks/published_checks.py: its rows are well formed, their workload files load, and one
cheap row runs end to end (in-process CLI) with its ratio computed the way the table states it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.workloads import load_workload
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "published_checks.py"


@pytest.fixture(scope="module")
def pc():
    yield from load_script(SCRIPT, "published_checks")


def test_rows_are_well_formed(pc, tmp_path):
    ids = [row.id for row in pc.ROWS]
    assert len(ids) == len(set(ids))
    pc.write_workloads(str(tmp_path))
    for row in pc.ROWS:
        assert row.issue in (25, 26, 30) and row.source.startswith("https://")
        assert row.published_sign() in (1, -1), row.id  # every row states a direction
        if isinstance(row.published, tuple):
            assert row.published[0] < row.published[1]
        assert row.workload is None or row.workload in pc.WORKLOADS
        for which in ("base", "variant"):
            cmd = pc.command(row, which, str(tmp_path))
            assert cmd[:2] == ["kvsim", "run"] and cmd[-2:] == ["--json", "--no-error-bars"]
    for name in pc.WORKLOADS:
        wl = load_workload(str(tmp_path / f"{name}.yaml"), {"num_requests": 3})
        assert wl is not None


def test_list_prints_every_row_and_runs_nothing(pc, capsys):
    assert pc.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{row.id}: " in out for row in pc.ROWS)
    assert pc.main(["--rows", "S1,NOPE"]) == 2


def test_one_cheap_row_runs(pc, monkeypatch, tmp_path):
    runner = CliRunner()

    def in_process(cmd):  # the row's own commands, through the CLI without a subprocess
        result = runner.invoke(app, cmd[1:])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    monkeypatch.setattr(pc, "run_json", in_process)
    row = next(r for r in pc.ROWS if r.id == "S1")
    out = pc.run_row(row, str(tmp_path))
    assert out["variant"] > out["base"] > 0  # EAGLE at batch 1 raises output tokens/s
    assert out["kvsim"] == pytest.approx(out["variant"] / out["base"])
    assert out["direction_ok"] and out["error"] == pytest.approx(out["kvsim"] / row.published - 1)
