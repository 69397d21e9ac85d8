"""`kvsim profile`: placeholder until the profiling harness lands (issue 4)."""

import typer

app = typer.Typer(help="Measure step-latency profiles (work in progress).")
