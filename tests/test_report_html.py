"""`kvsim report sweep` and `kvsim report seed-table`: PNGs and a self-contained HTML page, rendered by
headless Chromium (the page must load with no console error, show every figure and every row, sort by
a column, lead with the answer, fit a 1280 px window or scroll with its key columns in view, lift the
constant settings above the table, round its numbers and mark overloaded cells)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.sweep_report import load_report
from kvsim.reports.sweep_table import read_table
from tests.chromium import console_errors, measure, render

# at 32 req/s static batching cannot keep up (its rows are `overloaded`), continuous can
GRID = ["--policy", "static,continuous", "--block-size", "8,16", "--gpu-memory-utilization", "0.8,0.9",
        "--rate", "4,32", "--num-requests", "60", "--slo-ttft-p95-ms", "500"]
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
    body = _cell_rows(dom)
    assert len(body) == 16  # 2 policies x 2 block sizes x 2 utilisations x 2 rates
    assert 'data-sortable-ready="1"' in dom  # the sorting script ran
    assert dom.count('class="best"') == 1
    shot = tmp_path / "page.png"
    render(page, screenshot=shot)
    assert shot.stat().st_size > 50_000  # the heatmaps are drawn, not a blank page


def test_clicking_a_header_sorts_the_rows(report_dir: Path):
    dom, log = render(report_dir / "sweep-report.html", "#sort=-output_tok_s")
    assert console_errors(log) == []
    cells = _cell_rows(dom)
    heads = _heads(dom)
    col = heads.index("output_tok_s")
    values = [float(re.findall(r'data-value="([^"]*)"', c)[col]) for c in cells]
    assert values == sorted(values, reverse=True) and values[0] > values[-1]


def _cell_table(dom: str) -> str:
    """The page's table of cells (the first sortable table; provenance comes after it)."""
    return re.search(r'<table class="sortable"[^>]*>(.*?)</table>', dom, re.S).group(1)


def _cell_rows(dom: str) -> list[str]:
    body = _cell_table(dom).split("<tbody>")[-1]
    return re.findall(r"<tr[^>]*>.*?</tr>", body, re.S)


def _heads(dom: str) -> list[str]:
    head = _cell_table(dom).split("<thead>")[-1].split("</thead>")[0]
    return [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", head)]


def _visible_text(fragment: str) -> str:
    return re.sub(r"<[^>]+>", " ", fragment)


def test_the_page_leads_with_the_answer_then_the_table(report_dir: Path):
    dom, _ = render(report_dir / "sweep-report.html")
    answer = dom.index('class="answer"')
    assert answer < dom.index("<table") < dom.index("<figure>") < dom.index('id="made"')
    text = _visible_text(re.search(r'<p class="answer">(.*?)</p>', dom, re.S).group(1))
    assert "Cheapest point meeting the SLO: policy=continuous" in text


def test_constant_settings_sit_in_a_line_above_the_table_and_the_varying_ones_are_its_keys(report_dir: Path):
    report = load_report(Path(str(report_dir).replace("elsewhere/reports/sweep-grid", "grid.csv")))
    dom, _ = render(report_dir / "sweep-report.html")
    line = re.search(r'<p class="constants">(.*?)</p>', dom, re.S).group(1)
    heads = _heads(dom)
    constant = [c for c in report.cells.columns if report.cells[c].nunique(dropna=False) == 1]
    assert "model" in constant and "gpu" in constant and "tp" in constant
    for col in constant:
        assert col not in heads and re.search(rf"\b{col}\b", _visible_text(line)), col
    # what varies comes first (max_num_seqs: static batching keeps 256, the default engine fills vLLM V1's 1024)
    assert heads[:5] == ["policy", "block_size", "gpu_mem_util", "max_num_seqs", "rate"]
    keys = re.findall(r'<th class="key[^"]*"[^>]*>(.*?)</th>', _cell_table(dom))
    assert [re.sub(r"<[^>]+>", "", k) for k in keys] == ["policy", "block_size", "gpu_mem_util", "max_num_seqs", "rate"]


def test_the_cell_table_fits_a_1280_px_window(report_dir: Path, tmp_path: Path):
    m = measure(report_dir / "sweep-report.html", tmp_path)
    assert m["viewport"] == 1280 and m["page"] <= m["viewport"]
    table = next(t for t in m["tables"] if t["cls"] == "sortable")
    assert table["width"] <= table["container"] <= m["viewport"], table
    assert all(img["right"] <= m["viewport"] for img in m["images"])


def test_numbers_are_rounded_to_what_they_mean(report_dir: Path):
    dom, _ = render(report_dir / "sweep-report.html")
    shown = _visible_text(_cell_table(dom))
    assert not re.search(r"\d\.\d{4,}", shown), re.findall(r"\S*\d\.\d{4,}\S*", shown)[:5]
    raw = re.findall(r'data-value="(\d+\.\d{5,})"', _cell_table(dom))
    assert raw  # the raw values are kept for sorting, only the text is rounded


def test_overloaded_cells_are_marked_not_coloured_like_the_others(report_dir: Path):
    report = load_report(Path(str(report_dir).replace("elsewhere/reports/sweep-grid", "grid.csv")))
    over = int((report.cells["load"] == "overloaded").sum())
    assert over > 0  # static batching at 32 req/s
    dom, _ = render(report_dir / "sweep-report.html")
    rows = _cell_rows(dom)
    marked = [r for r in rows if re.match(r'<tr class="[^"]*\boverloaded\b', r)]
    assert len(marked) == over and all("\u26a0 overloaded" in r for r in marked)
    assert all("overloaded" not in r for r in rows if r not in marked)
    assert f"{over} of 16 points ran overloaded" in _visible_text(dom)
    # the heatmaps say so (the throughput one holds the best point's rate, 32 req/s: static overloaded)
    caption = re.search(r"<figcaption>(Output throughput.*?)</figcaption>", dom, re.S).group(1)
    assert "overloaded (4 cells" in caption and "left out of the colour range" in caption


def test_heatmap_colour_scales_are_stated_and_start_at_a_baseline():
    import numpy as np

    from kvsim.reports.sweep_report import HEATMAPS, colour_scale

    throughput, ttft, _, waste = HEATMAPS
    norm, text = colour_scale(throughput, np.array([1563.7, 1575.9, np.nan]))
    assert norm.vmin == 0 and norm.vmax == pytest.approx(1575.9)
    assert "linear, 0 to 1,576" in text and "within 0.8% of the largest" in text
    norm, text = colour_scale(throughput, np.array([480.7, 1575.9]))
    assert norm.vmin == 0 and "within" not in text  # a wide spread needs no note
    norm, text = colour_scale(waste, np.array([0.7, 98.6]))
    assert (norm.vmin, norm.vmax) == (0, 100) and "0 to 100%" in text
    norm, text = colour_scale(ttft, np.array([14.1, 27988.8]))  # > 20x: log between the extremes
    assert type(norm).__name__ == "LogNorm" and "log scale, 14.1 to 27,989 ms" in text


def test_an_interval_past_a_log_axis_is_cut_and_said():
    import numpy as np
    import pandas as pd

    from kvsim.reports.sweep_report import SweepReport, clip_interval, render_curves

    low, high, cut_low, cut_high = clip_interval(np.array([-50.0, 5.0, np.nan]), np.array([30.0, 900.0, np.nan]),
                                                 1.0, 500.0)
    assert low.tolist()[:2] == [1.0, 5.0] and high.tolist()[:2] == [30.0, 500.0]
    assert cut_low.tolist() == [True, False, False] and cut_high.tolist() == [False, True, False]
    cells = pd.DataFrame({
        "rate": [1.0, 4.0, 16.0], "output_tok_s": [100.0, 390.0, 800.0], "ttft_p95_ms": [20.0, 45.0, 4000.0],
        "ttft_p95_ms_ci95_low": [-300.0, 40.0, 1000.0], "ttft_p95_ms_ci95_high": [400.0, 50.0, 9000.0],
        "tpot_p95_ms": [9.0, 9.5, 12.0], "tpot_p95_ms_ci95_low": [8.5, 9.0, 11.0],
        "tpot_p95_ms_ci95_high": [9.5, 10.0, 13.0], "load": ["sustained", "sustained", "overloaded"]})
    report = SweepReport(Path("t.csv"), cells, ["rate"], None, {"ttft_p95_ms": None, "tpot_p95_ms": None}, {})
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        caption = render_curves(report, Path(tmp) / "c.png")
    assert "2 interval ends ran past the axis" in caption and "Hollow: overloaded (1 point" in caption


def test_the_seed_table_page_leads_with_results_and_scrolls_with_its_keys_in_view(tmp_path: Path):
    out = tmp_path / "seed"
    made = CliRunner().invoke(app, ["report", "seed-table", "--num-requests", "20", "--out", str(out)])
    assert made.exit_code == 0, made.stderr
    page = out / "seed-table.html"
    dom, log = render(page)
    assert console_errors(log) == []
    assert dom.index("Answer:") < dom.index("<h2>Results</h2>") < dom.index("<h2>How this was run</h2>")
    assert dom.index("<h2>Results</h2>") < dom.index("<figure>")
    every = dom.split("Every row")[-1]
    assert not re.search(r"\d\.\d{5,}", _visible_text(re.sub(r'data-value="[^"]*"', "", every)))
    line = re.search(r'<p class="constants">(.*?)</p>', every, re.S).group(1)
    assert "seed" in line and "kvsim_version" in line and "num_requests" in line
    m = measure(page, tmp_path)
    assert m["page"] <= m["viewport"] == 1280
    results, every_row = [t for t in m["tables"] if "sortable" in t["cls"]][::2][:2]
    assert results["width"] <= results["container"]  # the results table fits
    assert every_row["keys"] == ["setting", "policy"]
    if every_row["width"] > every_row["container"]:  # a deliberate scroll container: the keys stay in view
        assert every_row["keys_visible_scrolled"] is True


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
