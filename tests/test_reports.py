"""The seed-table report (rows, regimes, markdown, files) and the regime rule on tiny step tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.regime import COMPUTE_BOUND, MEMORY_BOUND, classify_regime
from kvsim.reports.seed_table import ARTICLE_FIGURES, POLICIES, SETTINGS, build_seed_table, render_markdown


@pytest.fixture(scope="module")
def report():
    return build_seed_table(num_requests=60, seed=0)


def _steps(**cols) -> pd.DataFrame:
    n = len(cols["kv_allocated"])
    base = {"duration_s": [1.0] * n, "num_waiting": [0] * n, "num_swapped": [0] * n,
            "num_preempted": [0] * n, "kv_external": [0] * n}
    return pd.DataFrame({**base, **cols})


def test_regime_peak_use_alone_makes_a_run_memory_bound():
    r = classify_regime(_steps(kv_allocated=[10, 95, 20]), capacity_tokens=100, paged=True, block_size=16)
    assert (r.label, r.peak_kv_use, r.kv_blocked_share) == (MEMORY_BOUND, 0.95, 0.0)
    r = classify_regime(_steps(kv_allocated=[10, 94, 20]), capacity_tokens=100, paged=True, block_size=16)
    assert r.label == COMPUTE_BOUND


def test_regime_contiguous_blocked_when_queue_waits_and_no_usable_extent():
    # step 2: 40 free tokens, all in extents too small for the queue's head -> blocked
    steps = _steps(kv_allocated=[50, 60, 60, 60], kv_external=[0, 40, 0, 0],
                   num_waiting=[0, 3, 3, 0], duration_s=[1.0, 1.0, 2.0, 6.0])
    r = classify_regime(steps, capacity_tokens=100, paged=False, block_size=16)
    assert r.kv_blocked_share == pytest.approx(0.1)
    assert r.label == MEMORY_BOUND


def test_regime_paged_counts_no_free_block_and_preemptions_only_with_work_queued():
    steps = _steps(kv_allocated=[90, 90, 90, 90], num_waiting=[0, 1, 1, 0], num_preempted=[0, 0, 1, 0])
    r = classify_regime(steps, capacity_tokens=100, paged=True, block_size=16)
    assert r.kv_blocked_share == pytest.approx(0.5)  # 10 free < one block while queued, twice
    assert r.num_preempted == 1 and r.label == MEMORY_BOUND
    free = classify_regime(_steps(kv_allocated=[50, 50], num_waiting=[2, 2]), 100, paged=True, block_size=16)
    assert (free.label, free.kv_blocked_share) == (COMPUTE_BOUND, 0.0)


def test_seed_table_has_every_setting_by_three_policies_with_regimes(report):
    rows = report.rows
    assert len(rows) == 3 * len(SETTINGS)
    assert set(zip(rows["setting"], rows["policy"], strict=True)) == {
        (s.name, p) for s in SETTINGS for p in POLICIES
    }
    assert set(rows["regime"]) <= {MEMORY_BOUND, COMPUTE_BOUND}
    assert (rows["completed"] == 60).all()
    # structural: static slots of max_model_len fill the TP-4 cache (59 x 8192 of 485,728 tokens)
    static_mem = rows[(rows["setting"] == "mem-bound") & (rows["policy"] == "static")].iloc[0]
    assert static_mem["regime"] == MEMORY_BOUND and static_mem["peak_kv_use"] >= 0.95
    # at TP 2 about 25k KV tokens remain: paging runs far more sequences than reservations
    tight = rows[rows["setting"] == "kv-tight"].set_index("policy")
    assert tight.loc["continuous", "mean_running"] > tight.loc["dynamic", "mean_running"]
    assert tight.loc["continuous", "output_tps"] > tight.loc["dynamic", "output_tps"]
    assert rows["article_output_tps"].notna().sum() == 3  # the article's figures on the seed rows only


def test_markdown_states_assumptions_article_figures_and_provenance(report):
    text = render_markdown(report)
    for figure in ("412", "74.8%", "1,840", "890", "52.1%", "920", "1,850", "3.6%", "310"):
        assert figure in text
    for fact in ("H100-SXM-80GB", "8 GPUs", "TP 8", "TP 4", "max_tokens", "cv 1.0", "max_model_len",
                 "kvsim report seed-table --num-requests 60 --seed 0", "roofline"):
        assert fact in text
    for p in report.profiles.values():
        assert p["sha256"][:12] in text
    assert "## Where kvsim disagrees with the article, and why" in text
    assert MEMORY_BOUND in text and COMPUTE_BOUND in text


def test_disagreement_ratios_are_arithmetic_on_both_tables(report):
    text = render_markdown(report)
    rows = report.rows
    ours = rows[(rows["setting"] == "seed") & (rows["policy"] == "continuous")]["output_tps"].iloc[0]
    theirs = ARTICLE_FIGURES["continuous"][0]
    assert f"| continuous | output tok/s | 1,850 | {ours:,.0f} | {ours / theirs:.2f}x |" in text


def test_cli_outside_a_checkout_writes_md_csv_html_pngs_to_reports_here(monkeypatch, tmp_path: Path):
    """As after a plain `pip install .` (no reference folder): the report goes to ./reports/seed-table;
    the page renders in headless Chromium with its three figures, every row and no console error."""
    import kvsim.cli.report_cmd
    from tests.chromium import console_errors, render

    monkeypatch.setattr(kvsim.cli.report_cmd, "reference_dir", lambda: None)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["report", "seed-table", "--num-requests", "20"])
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "reports" / "seed-table"
    assert sorted(p.name for p in out.iterdir()) == [
        "seed-table-kv.png", "seed-table-ttft.png", "seed-table.csv", "seed-table.html", "seed-table.md",
        "seed-table.png"]
    assert (out / "seed-table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv = pd.read_csv(out / "seed-table.csv")
    assert len(csv) == 3 * len(SETTINGS) and (csv["num_requests"] == 20).all() and "regime" in csv.columns
    assert "| setting | policy | regime |" in result.stdout
    assert "--num-requests 20 --seed 0" in (out / "seed-table.md").read_text()
    page = (out / "seed-table.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3 and "## " not in page
    dom, log = render(out / "seed-table.html")
    assert console_errors(log) == []
    assert dom.count("<figure>") == 3 and 'data-sortable-ready="1"' in dom
    rows = dom.split("Every row")[-1].split("<tbody>")[1].split("</tbody>")[0]
    assert rows.count("<tr") == len(SETTINGS) * len(POLICIES)


def test_the_committed_reference_report_names_the_profiles_kvsim_uses_now():
    """reports/reference/ is rerun whenever a profile it uses changes (its sha256 is in the report)."""
    import re

    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import get_gpu, get_model

    reference = Path(__file__).resolve().parents[1] / "reports" / "reference"
    markdown = (reference / "seed-table.md").read_text()
    recorded = dict(re.findall(r"Profile TP (\d+): .*sha256 `([0-9a-f]{12})`", markdown))
    model, gpu = get_model("llama3-70b"), get_gpu("H100-SXM-80GB")
    current = {str(tp): default_profile(gpu, model, tp).sha256[:12] for tp in {s.tp for s in SETTINGS}}
    assert recorded == current, "regenerate it: kvsim report seed-table --num-requests 1000 --seed 0"
    table = pd.read_csv(reference / "seed-table.csv")
    whole = {default_profile(gpu, model, tp).sha256 for tp in {s.tp for s in SETTINGS}}
    assert set(table["profile_sha256"]) == whole  # the whole sha256 in the CSV, a prefix in the text
