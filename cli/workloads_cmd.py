"""`kvsim workloads`: placeholder until the workload catalog lands (issue 5)."""

import typer

app = typer.Typer(help="List and inspect named workloads (work in progress).")
