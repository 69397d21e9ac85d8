"""The `kvsim` command: a thin typer layer over simcore, workloads, profiles and reports."""

from __future__ import annotations

from typing import Annotated

import typer

from cli import calibrate_cmd, list_cmd, plan_cmd, profile_cmd, report_cmd, run_cmd, sweep_cmd, workloads_cmd
from cli.errors import OneLineErrorsGroup

app = typer.Typer(
    name="kvsim",
    cls=OneLineErrorsGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Capacity-planning simulator for LLM serving: batching policies, paged KV cache, latency SLOs.",
)


def _version() -> str:
    """The installed package's version, else the source tree's (the same number, one bump)."""
    from importlib.metadata import PackageNotFoundError, version

    from simcore.simulate import KVSIM_VERSION

    try:
        return version("kvsim")
    except PackageNotFoundError:
        return KVSIM_VERSION


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvsim {_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the kvsim version and exit.",
    )] = False,
) -> None:
    """Capacity-planning simulator for LLM serving: batching policies, paged KV cache, latency SLOs."""


app.command("run", no_args_is_help=False, context_settings={"allow_extra_args": True})(run_cmd.run)
app.add_typer(profile_cmd.app, name="profile")
app.add_typer(workloads_cmd.app, name="workloads")
app.command("sweep")(sweep_cmd.sweep)
app.add_typer(report_cmd.app, name="report")
app.command("list")(list_cmd.list_catalog)
app.command("calibrate")(calibrate_cmd.calibrate)
app.command("plan", context_settings={"allow_extra_args": True})(plan_cmd.plan)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
