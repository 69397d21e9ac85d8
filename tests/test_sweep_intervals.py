"""95% intervals over few seeds: cut at what a metric can take (no -1,436.8 tok/s), said to be wide,
and shown under each mean in the sweep report's cells (one column per metric, not three), which
fit a 1280 px window in headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.sweep import cut_ends, summarize_points
from kvsim.reports.sweep_report import CUT, intervals, load_report
from kvsim.reports.sweep_runner import mean_ci95, t975
from tests.chromium import measure, render


def test_an_interval_is_cut_at_the_bounds_and_keeps_its_mean():
    # two seeds, 100 and 1,000 tok/s: t = 12.706, half-width 12.706 * 450 = 5,717.7 -> low -5,167.7
    mean, low, high = mean_ci95([100.0, 1000.0])
    assert mean == 550.0 and low == pytest.approx(550 - 12.706 * 450) and low < 0
    mean, low, high = mean_ci95([100.0, 1000.0], 0.0)
    assert (mean, low) == (550.0, 0.0) and high == pytest.approx(550 + 12.706 * 450)
    mean, low, high = mean_ci95([0.2, 0.9], 0.0, 1.0)  # a share: both ends cut
    assert (low, high) == (0.0, 1.0) and mean == pytest.approx(0.55)
    mean, low, high = mean_ci95([10.0, 10.5, 11.0, 10.2], 0.0)  # a tight one is left alone
    assert low == pytest.approx(10.425 - 3.182 * 0.4349329450233296 / 2) and low > 0
    assert t975(2) == 12.706 and t975(5) == 2.776 and t975(100) == 1.96


def test_summarize_points_cuts_below_zero_and_says_which_ends():
    rows = pd.DataFrame({
        "point": [0, 0], "seed": [0, 1], "output_throughput": [100.0, 1000.0], "p95_ttft_ms": [20.0, 21.0],
        "kv_waste_rate": [0.9, 0.95], "saturation": ["sustained", "sustained"]})
    cells = summarize_points(rows, [])
    row = cells.iloc[0]
    assert row["output_tok_s_ci95_low"] == 0.0 and row["kv_waste_ci95_high"] == 1.0
    assert row["ttft_p95_ms_ci95_low"] > 0  # 20.5 +- 6.35: not cut
    assert cut_ends("output_tok_s", row["output_tok_s"], row["output_tok_s_ci95_low"],
                    row["output_tok_s_ci95_high"]) == (True, False)
    assert cut_ends("kv_waste", row["kv_waste"], row["kv_waste_ci95_low"], row["kv_waste_ci95_high"]) == (False, True)
    assert cut_ends("ttft_p95_ms", row["ttft_p95_ms"], row["ttft_p95_ms_ci95_low"],
                    row["ttft_p95_ms_ci95_high"]) == (False, False)
    shown, below = intervals(cells, {})
    assert not [c for c in shown.columns if "ci95" in c]
    assert below["output_tok_s"][0] == f"(0{CUT}\u20136,267.7)"  # 550 + 12.706 x 450
    assert below["ttft_p95_ms"][0].startswith("(") and CUT not in below["ttft_p95_ms"][0]


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory) -> Path:
    """2 policies x 2 rates x 2 block sizes x seeds 0,1 at 60 requests: static batching is noisy
    between seeds, so its throughput interval reaches below zero before the cut."""
    tmp = tmp_path_factory.mktemp("seeds")
    runner = CliRunner()
    made = runner.invoke(app, ["sweep", "--policy", "static,continuous", "--block-size", "8,16", "--rate", "4,32",
                               "--num-requests", "60", "--seeds", "0,1", "--jobs", "1", "--out", str(tmp / "s.csv")])
    assert made.exit_code == 0, made.stderr
    assert "t = 12.71 for 2 seeds, so wide; cut at 0 and 100%" in made.stdout
    assert " to " in made.stdout  # a cut interval prints as (low to high), not as mean +-half
    drawn = runner.invoke(app, ["report", "sweep", str(tmp / "s.csv"), "--out", str(tmp / "rep")])
    assert drawn.exit_code == 0, drawn.stderr
    return tmp


def test_no_interval_of_the_report_reaches_below_zero(two_seeds: Path):
    cells = load_report(two_seeds / "s.csv").cells
    lows = [c for c in cells.columns if c.endswith("_ci95_low")]
    assert lows and (cells[lows].astype(float).fillna(0) >= 0).all().all()
    # without the cut at least one would have: the same values through the plain t interval
    rows = pd.read_csv(two_seeds / "s.csv")
    plain = [mean_ci95(g["output_throughput"].tolist())[1] for _, g in rows.groupby("point")]
    assert min(plain) < 0


def test_the_report_folds_intervals_into_the_mean_cells_and_fits_1280_px(two_seeds: Path, tmp_path: Path):
    page = two_seeds / "rep" / "sweep-report.html"
    dom, _ = render(page)
    table = re.search(r'<table class="sortable"[^>]*>(.*?)</table>', dom, re.S).group(1)
    heads = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", table.split("</thead>")[0])]
    assert "output_tok_s" in heads and not [h for h in heads if "ci95" in h]
    under = re.findall(r'<span class="ci">\(([^)]*)\)</span>', table)
    assert len(under) >= 8 and any(CUT in u for u in under)
    assert all(not u.startswith("-") for u in under)
    note = re.search(r'<p class="note">(Each cell: the mean over 2 seeds.*?)</p>', dom, re.S).group(1)
    assert "t = 12.71 for 2 seeds" in note and "6.35 x the gap" in note and f"{CUT} (" in note
    m = measure(page, tmp_path)
    cells = next(t for t in m["tables"] if t["cls"] == "sortable")
    assert m["page"] <= m["viewport"] == 1280
    assert cells["width"] <= cells["container"], cells  # no sideways scroll with two seeds
