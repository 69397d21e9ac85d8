"""`kvsim report ...`: build a report (markdown, CSV, figure) from simulations and write it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from simcore.errors import ConfigError

app = typer.Typer(no_args_is_help=True, help="Build reports: tables, figures and their markdown.")


def reference_dir() -> Path | None:
    """reports/reference/ of a source checkout (pyproject.toml beside the package), if writable."""
    import reports

    package = Path(reports.__file__).resolve().parent
    folder = package / "reference"
    in_checkout = (package.parent / "pyproject.toml").is_file()
    if in_checkout and folder.is_dir() and os.access(folder, os.W_OK):
        return folder
    return None


def _progress():
    """A rich progress bar over the report's runs, on a terminal only."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), transient=True, console=Console(stderr=True))
    task = progress.add_task("simulating", total=None)
    progress.start()
    return (lambda done, total: progress.update(task, completed=done, total=total)), progress.stop


@app.command("seed-table")
def seed_table(
    num_requests: Annotated[int, typer.Option(min=1, help="Requests per simulated run.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed; every run uses it, so policies see the same traffic.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Folder for seed-table.md/.csv/.png. [default: reports/reference in a checkout]")] = None,
) -> None:
    """Rerun the seed article's benchmark table (3 settings x 3 policies) and write the report."""
    from reports.seed_table import build_seed_table, markdown_table, write_seed_table

    if seed < 0:
        raise ConfigError(f"--seed must be an integer >= 0, got {seed}")
    out_dir = out if out is not None else reference_dir()
    if out_dir is None:
        raise ConfigError("no writable reports/reference folder here (not a source checkout); pass --out DIR")
    from cli.output import check_out_folder

    check_out_folder(out_dir, ("seed-table.md", "seed-table.csv", "seed-table.png"))
    update, stop = _progress()
    try:
        report = build_seed_table(num_requests, seed, progress=update)
    finally:
        stop()
    paths = write_seed_table(report, out_dir)
    typer.echo(markdown_table(report))
    typer.echo(f"Wrote {', '.join(str(p) for p in paths)} (simulated in {report.wall_s:.1f} s)", err=True)
