"""`kvsim workloads`: list the named workloads, and show one's statistics (optionally as a PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvsim.cli.output import check_out_file
from kvsim.simcore.errors import WorkloadError

if TYPE_CHECKING:  # `kvsim --help` imports this module; numpy is imported when a command runs
    import numpy as np

app = typer.Typer(
    help="List the named workloads; `kvsim workloads show NAME|FILE` prints one's statistics.",
    invoke_without_command=True,
    no_args_is_help=False,
)

PERCENTILES = (50, 90, 99)
SHOW_SAMPLE = 200_000  # requests drawn for the statistics: enough for p99, bounded memory


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    """List the named workloads (use them with `kvsim run --workload NAME`)."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from kvsim.workloads import DEFAULT_WORKLOAD, list_workloads

    table = Table("name", "description", box=None, pad_edge=False)
    for name, description in list_workloads():
        table.add_row(escape(name) + (" (default)" if name == DEFAULT_WORKLOAD else ""), escape(description))
    Console(soft_wrap=True, highlight=False).print(table)


def _length_row(label: str, values: np.ndarray) -> list[str]:
    import numpy as np

    return [label, f"{values.mean():.1f}", *(f"{np.percentile(values, q):.0f}" for q in PERCENTILES), f"{values.max()}"]


@app.command()
def show(
    workload: Annotated[str, typer.Argument(help="A named workload (see `kvsim workloads`) or a .yaml/.csv/.jsonl file.")],
    num_requests: Annotated[int | None, typer.Option(min=1, help="Requests to draw. [default: the workload's]")] = None,
    max_model_len: Annotated[int | None, typer.Option(min=2, max=2**31 - 1, help="Clip lengths as a model with this context would.")] = None,
    seed: Annotated[int, typer.Option(help="Seed, split as `kvsim run --seed` splits it.")] = 0,
    plot: Annotated[Path | None, typer.Option(help="Also draw arrival-rate and length histograms to this PNG.")] = None,
) -> None:
    """Print a workload's statistics: request count, arrival rate, prompt/output length percentiles."""
    import numpy as np
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from kvsim.workloads import load_workload

    if plot is not None and plot.suffix.lower() != ".png":
        raise WorkloadError(f"--plot writes a PNG; give a file name ending in .png, got {plot}")
    from kvsim.cli.options import check_seed

    check_seed(seed)
    spec = load_workload(workload, {"num_requests": num_requests}, max_model_len=max_model_len)
    check_out_file(plot, "--plot")
    workload_seed = np.random.SeedSequence(seed).spawn(2)[0]  # the split simcore.simulate uses
    requests, generation = spec.draw(workload_seed, limit=SHOW_SAMPLE)  # bounded for 1e9 requests
    sampled = len(requests) < spec.num_requests
    arrivals = np.array([r.arrival_s for r in requests])
    prompt = np.array([r.num_prompt_tokens for r in requests])
    output = np.array([r.num_output_tokens for r in requests])
    max_tokens = np.array([r.max_tokens for r in requests])

    console = Console(soft_wrap=True, highlight=False)
    title = f"[bold]{escape(spec.name)}[/bold]"
    console.print(f"{title}: {escape(spec.description)}" if spec.description else title)
    console.print(f"source: {spec.source}", markup=False)
    info = spec.describe()
    arrival = info["arrival"]
    console.print("arrival: " + ", ".join(f"{k}={v}" for k, v in arrival.items() if k != "schedule"))
    console.print(f"requests: {int(spec.num_requests):,}"
                  + (f" (statistics below from the first {len(requests):,})" if sampled else ""))
    if getattr(spec, "is_session", False):  # turns follow answers: only the session starts are planned
        console.print("turns: sent when the previous answer is back plus the think time; prompts below "
                      "grow with each turn (whole conversation resent)")
    if spec.is_closed_loop:
        console.print(f"rate: set by the engine (closed loop of {arrival['concurrency']} clients)")
    else:
        span = float(arrivals[-1] - arrivals[0])
        rate = f"{(len(arrivals) - 1) / span:.3f} req/s" if span > 0 else "all at once"
        console.print(f"rate: {rate} over {span:.1f} s")
    table = Table("tokens", "mean", *(f"p{q}" for q in PERCENTILES), "max", box=None, pad_edge=False)
    table.add_row(*_length_row("prompt", prompt))
    table.add_row(*_length_row("output", output))
    if not np.array_equal(max_tokens, output):
        table.add_row(*_length_row("max_tokens", max_tokens))
    console.print(table)
    extras = {k: info.get(k) for k in ("n", "beam_width", "shared_prefix", "sessions") if info.get(k) not in (1, None)}
    for key, value in extras.items():
        console.print(f"{key}: {value}", markup=False)
    for note in spec.notes(generation):
        console.print(f"note: {note}", markup=False)
    for warning in spec.warnings(generation):
        console.print(f"warning: {warning}", markup=False)
    if plot is not None:
        _plot(plot, spec.name, seed, arrivals if not spec.is_closed_loop else None, prompt, output)
        console.print(f"wrote {plot}", markup=False)


def _plot(path: Path, name: str, seed: int, arrivals: np.ndarray | None, prompt: np.ndarray,
          output: np.ndarray) -> None:
    """Arrival rate over time and the two length histograms, side by side; written whole or not at
    all (a temporary file renamed into place), with the seed and kvsim version in the title and
    in the PNG's Description."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ax = axes[0]
    span = float(arrivals[-1] - arrivals[0]) if arrivals is not None and len(arrivals) else 0.0
    if arrivals is None or span <= 0:
        what = "closed loop: arrivals follow completions" if arrivals is None else "all requests arrive at t=0"
        ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        bins = int(np.clip(len(arrivals) // 20, 10, 120))
        counts, edges = np.histogram(arrivals, bins=bins)
        ax.stairs(counts / np.diff(edges), edges, fill=True, alpha=0.7)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("arrival rate (req/s)")
        ax.set_title("arrivals")
    for ax, values, label in ((axes[1], prompt, "prompt tokens"), (axes[2], output, "output tokens")):
        ax.hist(values, bins=60, alpha=0.8)
        ax.axvline(np.median(values), color="k", lw=1, ls="--", label=f"median {np.median(values):.0f}")
        ax.set_xlabel(label)
        ax.set_ylabel("requests")
        ax.legend()
    fig.suptitle(f"workload {name} ({len(prompt)} requests, seed {seed})")
    fig.tight_layout()
    from kvsim.reports.files import write_file
    from kvsim.simcore.simulate import KVSIM_VERSION

    about = f"kvsim {KVSIM_VERSION}: workload {name}, {len(prompt)} requests, seed {seed}"
    try:
        write_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100,
                                                 metadata={"Software": None, "Description": about}))
    finally:
        plt.close(fig)
