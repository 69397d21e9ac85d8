"""benchmarks/e2e_published.py: `--list` runs (nothing simulated), every row names its source and
where its number was read, maps its vLLM version to a real preset, and its workload file loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.workloads import load_workload
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "e2e_published.py"


@pytest.fixture(scope="module")
def e2e():
    yield from load_script(SCRIPT, "e2e_published")


def test_list_names_every_row_and_its_source(e2e, capsys):
    assert e2e.main(["--list"]) == 0
    out = capsys.readouterr().out
    for row in e2e.ROWS:
        assert f"{row.id}: {row.what}" in out
        assert f"source: {row.source} ({row.figure})" in out
        assert row.source.startswith("https://") and row.figure
    assert e2e.main(["--rows", "V1,NOPE"]) == 2


def test_rows_are_well_formed(e2e, tmp_path):
    ids = [row.id for row in e2e.ROWS]
    assert len(ids) == len(set(ids))
    e2e.write_workloads(str(tmp_path), e2e.WORKLOADS)
    for row in e2e.ROWS:
        assert row.engine in e2e.PRESETS and row.metric in e2e.METRICS and row.published > 0
        assert row.workload in e2e.WORKLOADS and "--engine-version" not in row.args
        matched = e2e.command(row, "matched", str(tmp_path))
        default = e2e.command(row, "default", str(tmp_path))
        assert matched[matched.index("--engine-version") + 1] == row.engine
        assert "--engine-version" not in default and default[-2:] == ["--json", "--no-error-bars"]
    for name in e2e.WORKLOADS:
        assert load_workload(str(tmp_path / f"{name}.yaml"), {"num_requests": 3}) is not None
