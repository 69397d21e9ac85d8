"""`kvsim report sweep`: PNGs and a self-contained HTML page, rendered by headless Chromium (the page
must load with no console error, show every figure and every row, and sort by a column)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from reports.sweep_table import read_table

GRID = ["--policy", "static,continuous", "--block-size", "8,16", "--gpu-memory-utilization", "0.8,0.9",
        "--rate", "4,16", "--num-requests", "20", "--slo-ttft-p95-ms", "500"]
FIGURES = ["heatmap-throughput.png", "heatmap-ttft-p95.png", "heatmap-tpot-p95.png", "heatmap-kv-waste.png",
           "throughput-latency.png"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def render(page: Path, fragment: str = "", screenshot: Path | None = None) -> tuple[str, str]:
    """(DOM after scripts ran, browser log) of a local page in headless Chromium."""
    browser = chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--enable-logging=stderr", "--v=0", "--window-size=1300,2400"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    done = subprocess.run(args + [page.as_uri() + fragment], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def console_errors(log: str) -> list[str]:
    """Lines where the page itself complained (a script error, a failed load), not the browser's
    own noise about D-Bus or GPUs."""
    return [line for line in log.splitlines()
            if "Uncaught" in line or ("CONSOLE" in line and ("ERROR" in line or "error" in line.lower()))
            or "net::ERR" in line]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sweep")
    runner = CliRunner()
    made = runner.invoke(app, ["sweep", *GRID, "--jobs", "2", "--out", str(tmp / "grid.csv")])
    assert made.exit_code == 0, made.stderr
    drawn = runner.invoke(app, ["report", "sweep", str(tmp / "grid.csv"), "--out", str(tmp / "report")])
    assert drawn.exit_code == 0, drawn.stderr
    return tmp / "report"


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


def test_report_defaults_to_reports_in_the_current_directory(tmp_path: Path, monkeypatch, report_dir: Path):
    table = report_dir.parent / "grid.csv"
    assert len(read_table(table)) == 16
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["report", "sweep", str(table)])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "reports" / "sweep-grid" / "sweep-report.html").is_file()


@pytest.mark.parametrize("content", ["", "a,b\n1,2\n", "\x00\x01garbage"])
def test_a_bad_table_is_one_line_exit_2_and_no_files(tmp_path: Path, content: str):
    table = tmp_path / "bad.csv"
    table.write_text(content)
    r = CliRunner().invoke(app, ["report", "sweep", str(table), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and r.stderr.startswith("kvsim: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "out").exists()
    missing = CliRunner().invoke(app, ["report", "sweep", str(tmp_path / "nope.csv")])
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1


def test_seed_table_page_renders_with_its_three_figures_and_every_row(tmp_path: Path):
    from reports.seed_table import POLICIES, SETTINGS, build_seed_table, write_seed_table

    write_seed_table(build_seed_table(num_requests=12, seed=0), tmp_path)
    dom, log = render(tmp_path / "seed-table.html")
    assert console_errors(log) == []
    assert dom.count("<figure>") == 3 and 'data-sortable-ready="1"' in dom
    last = dom.split("Every row")[-1]
    assert last.split("<tbody>")[1].split("</tbody>")[0].count("<tr") == len(SETTINGS) * len(POLICIES)
