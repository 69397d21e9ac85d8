"""`kvsim report sweep`: PNGs and a self-contained HTML page, rendered by headless Chromium (the page
must load with no console error, show every figure and every row, and sort by a column)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.sweep_table import read_table
from tests.chromium import console_errors, render

GRID = ["--policy", "static,continuous", "--block-size", "8,16", "--gpu-memory-utilization", "0.8,0.9",
        "--rate", "4,16", "--num-requests", "20", "--slo-ttft-p95-ms", "500"]
FIGURES = ["heatmap-throughput.png", "heatmap-ttft-p95.png", "heatmap-tpot-p95.png", "heatmap-kv-waste.png",
           "throughput-latency.png"]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    """A 16-point sweep drawn without --out, from another directory: the report lands in
    ./reports/sweep-TABLE of the current directory."""
    tmp = tmp_path_factory.mktemp("sweep")
    runner = CliRunner()
    made = runner.invoke(app, ["sweep", *GRID, "--jobs", "2", "--out", str(tmp / "grid.csv")])
    assert made.exit_code == 0, made.stderr
    assert len(read_table(tmp / "grid.csv")) == 16
    (tmp / "elsewhere").mkdir()
    before = os.getcwd()
    os.chdir(tmp / "elsewhere")
    try:
        drawn = runner.invoke(app, ["report", "sweep", str(tmp / "grid.csv")])
    finally:
        os.chdir(before)
    assert drawn.exit_code == 0, drawn.stderr
    return tmp / "elsewhere" / "reports" / "sweep-grid"


def test_report_writes_every_figure_and_one_self_contained_page(report_dir: Path):
    assert sorted(p.name for p in report_dir.iterdir()) == sorted(FIGURES + ["sweep-report.html"])
    for name in FIGURES:
        assert (report_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (report_dir / "sweep-report.html").read_text()
    assert text.count('src="data:image/png;base64,') == len(FIGURES)
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing to fetch
    for fact in ("kvsim report sweep", "kvsim 0.", "matplotlib", "TTFT p95 &lt;= 500 ms", "sha256"):
        assert fact in text


def test_report_page_renders_in_chromium_with_figures_rows_and_no_console_error(report_dir: Path, tmp_path: Path):
    page = report_dir / "sweep-report.html"
    dom, log = render(page)
    assert console_errors(log) == []
    assert dom.count("<figure>") == len(FIGURES)
    assert len(re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', dom)) == len(FIGURES)
    body = dom.split("<tbody>")[-1]
    assert body.count("<tr") == 16  # 2 policies x 2 block sizes x 2 utilisations x 2 rates
    assert 'data-sortable-ready="1"' in dom  # the sorting script ran
    assert dom.count('class="best"') == 1
    shot = tmp_path / "page.png"
    render(page, screenshot=shot)
    assert shot.stat().st_size > 50_000  # the heatmaps are drawn, not a blank page


def test_clicking_a_header_sorts_the_rows(report_dir: Path):
    dom, log = render(report_dir / "sweep-report.html", "#sort=-output_tok_s")
    assert console_errors(log) == []
    body = dom.split("<tbody>")[-1]
    cells = re.findall(r"<tr[^>]*>(.*?)</tr>", body)
    heads = re.findall(r"<th[^>]*>(.*?)</th>", dom.split("<thead>")[-1].split("</thead>")[0])
    col = heads.index("output_tok_s")
    values = [float(re.findall(r'data-value="([^"]*)"', c)[col]) for c in cells]
    assert values == sorted(values, reverse=True) and values[0] > values[-1]


@pytest.mark.parametrize("content", ["", "a,b\n1,2\n", "\x00\x01garbage"])
def test_a_bad_table_is_one_line_exit_2_and_no_files(tmp_path: Path, content: str):
    table = tmp_path / "bad.csv"
    table.write_text(content)
    r = CliRunner().invoke(app, ["report", "sweep", str(table), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and r.stderr.startswith("kvsim: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "out").exists()
    missing = CliRunner().invoke(app, ["report", "sweep", str(tmp_path / "nope.csv")])
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1



def test_the_console_check_catches_a_broken_page(tmp_path: Path):
    page = tmp_path / "broken.html"
    page.write_text('<html><body><script>console.error("boom"); notDefined();</script></body></html>')
    _, log = render(page)
    errors = console_errors(log)
    assert any("boom" in e for e in errors) and any("Uncaught ReferenceError" in e for e in errors)
