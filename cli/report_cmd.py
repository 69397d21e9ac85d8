"""`kvsim report ...`: build a report (markdown, CSV, figures, one HTML page) and write it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli.options import SloTargets, SloTpotP95, SloTtftP95, check_slos

app = typer.Typer(no_args_is_help=True, help="Build reports: tables, figures and their markdown.")


def reference_dir() -> Path | None:
    """reports/reference/ of a source checkout (pyproject.toml beside the package), if writable."""
    from kvsim import reports

    package = Path(reports.__file__).resolve().parent
    folder = package / "reference"
    in_checkout = (package.parent / "pyproject.toml").is_file()
    if in_checkout and folder.is_dir() and os.access(folder, os.W_OK):
        return folder
    return None


@app.command("seed-table")
def seed_table(
    num_requests: Annotated[int, typer.Option(min=1, help="Requests per simulated run.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed; every run uses it, so policies see the same traffic.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Folder for seed-table.md/.csv/.html and its PNGs. [default: reports/reference in a source checkout, else ./reports/seed-table in the current directory]")] = None,
) -> None:
    """Rerun the seed article's benchmark table (4 settings x 3 policies) and write the report."""
    from kvsim.cli.options import check_seed
    from kvsim.reports.seed_table import build_seed_table, markdown_table, write_seed_table

    check_seed(seed)
    out_dir = out if out is not None else (reference_dir() or Path.cwd() / "reports" / "seed-table")
    from kvsim.cli.output import check_out_folder
    from kvsim.reports.seed_table import FILES

    check_out_folder(out_dir, FILES)
    from kvsim.cli.output import LiveProgress

    progress = LiveProgress("simulating", None, "runs")
    try:
        report = build_seed_table(num_requests, seed, progress=progress.update)
    finally:
        progress.stop()
    paths = write_seed_table(report, out_dir)
    typer.echo(markdown_table(report))
    typer.echo(f"Wrote {', '.join(str(p) for p in paths)} (simulated in {report.wall_s:.1f} s)", err=True)


@app.command("sweep")
def sweep_report(
    table: Annotated[Path, typer.Argument(help="A table written by `kvsim sweep --out`.")],
    out: Annotated[Path | None, typer.Option(help="Folder for the PNGs and sweep-report.html. [default: ./reports/sweep-TABLE in the current directory]")] = None,
    slo_ttft_p95_ms: SloTtftP95 = None,
    slo_tpot_p95_ms: SloTpotP95 = None,
    slo_targets: SloTargets = None,
) -> None:
    """Draw a sweep table: heatmaps over block size x utilisation, throughput-latency curves, one HTML page."""
    from kvsim.reports.capacity import SLO, parse_slo_targets
    from kvsim.reports.sweep_report import load_report, write_sweep_report

    check_slos(slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms)
    slo = SLO.of(parse_slo_targets(slo_targets, slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms))
    from kvsim.cli.output import check_out_folder
    from kvsim.reports.sweep_report import FILES

    out_dir = out if out is not None else Path.cwd() / "reports" / f"sweep-{table.stem}"
    check_out_folder(out_dir, FILES)  # creates nothing; a bad --out is named before the table is read
    # a bad table: nothing created
    report = load_report(table, slo.ttft_p95_ms, slo.tpot_p95_ms, slo.percentile_ms)
    command = " ".join(["kvsim report sweep", str(table)] + (["--out", str(out)] if out else []) + [
        f"--{k.replace('_', '-')} {v:g}" for k, v in (("slo_ttft_p95_ms", slo_ttft_p95_ms),
                                                       ("slo_tpot_p95_ms", slo_tpot_p95_ms)) if v is not None]
        + [f"--slo {text}" for text in slo_targets or []])
    paths = write_sweep_report(report, out_dir, command)
    typer.echo(f"Wrote {len(paths)} file{'s' if len(paths) != 1 else ''} to {out_dir}: {', '.join(p.name for p in paths)}")
