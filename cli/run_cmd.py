"""`kvsim run`: simulate one engine replica serving a workload and print a vLLM-style summary."""

from __future__ import annotations

import json
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from cli.errors import fail
from cli.output import format_summary, write_outputs
from simcore.catalog import get_gpu, get_model
from simcore.errors import ConfigError
from simcore.specs import EngineConfig


class PolicyName(str, Enum):
    static = "static"
    dynamic = "dynamic"
    continuous = "continuous"


class AllocatorName(str, Enum):
    paged = "paged"
    contiguous = "contiguous"


class ReservationName(str, Enum):
    max = "max"
    pow2 = "pow2"
    oracle = "oracle"


class PreemptionMode(str, Enum):
    recompute = "recompute"
    swap = "swap"


def _refuse_irrelevant(policy: str, allocator: str | None, given: dict[str, object]) -> None:
    """Options that mean nothing for the chosen policy are refused, not ignored."""
    only_for = {
        "--max-batch-size": ("static",),
        "--batch-timeout-s": ("static",),
        "--allocator": ("continuous",),
        "--preemption-mode": ("continuous",),
        "--swap-space": ("continuous",),
        "--enable-chunked-prefill": ("continuous",),
    }
    for flag, policies in only_for.items():
        if given.get(flag) is not None and policy not in policies:
            raise ConfigError(f"{flag} applies only to --policy {'/'.join(policies)}, not {policy}")
    if given.get("--reservation") is not None and (policy != "continuous" or (allocator or "paged") == "paged"):
        raise ConfigError(
            "--reservation applies only to --policy continuous --allocator contiguous (Orca); "
            "static reserves max_model_len and dynamic prompt + max_tokens"
        )


def _progress_reporter(total: int | None):
    """A rich progress bar on a terminal, shown only once a run outlasts half a second."""
    if not total or not sys.stderr.isatty():
        return None, lambda: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), transient=True, console=None,
    )
    task = progress.add_task("simulating", total=total)
    started = time.perf_counter()
    state = {"live": False}

    def update(done: int) -> None:
        if not state["live"] and time.perf_counter() - started > 0.5:
            progress.start()
            state["live"] = True
        progress.update(task, completed=done)

    def stop() -> None:
        if state["live"]:
            progress.stop()

    return update, stop


def run(
    model: Annotated[str, typer.Option(help="Catalog model name or a Hugging Face config.json.")] = "llama3-8b",
    gpu: Annotated[str, typer.Option(help="Catalog GPU name (see `kvsim run --help`).")] = "H100-SXM-80GB",
    tp: Annotated[int, typer.Option("--tp", "--tensor-parallel-size", help="GPUs per replica.")] = 1,
    policy: Annotated[PolicyName, typer.Option(help="Batching policy.")] = PolicyName.continuous,
    allocator: Annotated[AllocatorName | None, typer.Option(help="KV allocation for continuous batching: paged (vLLM) or contiguous (Orca). [default: paged]")] = None,
    reservation: Annotated[ReservationName | None, typer.Option(help="Contiguous reservation size: max_model_len, next power of two of the output, or the true output. [default: max]")] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block (power of two).")] = 16,
    gpu_memory_utilization: Annotated[float, typer.Option(help="Share of GPU memory the engine may use, (0, 1].")] = 0.90,
    max_num_seqs: Annotated[int, typer.Option(help="Most sequences in one step.")] = 256,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="Token budget of one step. [default: 8192 with chunked prefill, else max_model_len]")] = None,
    enable_chunked_prefill: Annotated[bool | None, typer.Option("--enable-chunked-prefill/--no-enable-chunked-prefill", help="Split long prompts across steps. [default: on]")] = None,
    swap_space: Annotated[float | None, typer.Option(help="CPU swap space per GPU in GiB. [default: 4]")] = None,
    preemption_mode: Annotated[PreemptionMode | None, typer.Option(help="How a preempted sequence gives back its KV. [default: recompute]")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Longest prompt + output. [default: the model's]")] = None,
    max_batch_size: Annotated[int | None, typer.Option(help="Static batching: requests per batch. [default: 64]")] = None,
    batch_timeout_s: Annotated[float | None, typer.Option(help="Static batching: longest wait for a full batch. [default: 0.1]")] = None,
    workload: Annotated[str | None, typer.Option(help="Named workload (see `kvsim workloads`) or a YAML file. [default: sharegpt]")] = None,
    rate: Annotated[float | None, typer.Option(help="Open loop: request rate in req/s (Poisson unless --burstiness).")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Closed loop: number of concurrent clients.")] = None,
    num_requests: Annotated[int | None, typer.Option(help="Requests to simulate.")] = None,
    burstiness: Annotated[float | None, typer.Option(help="Gamma arrivals: 1 is Poisson, lower is burstier.")] = None,
    input_len: Annotated[int | None, typer.Option(help="Mean (or fixed) prompt length in tokens.")] = None,
    output_len: Annotated[int | None, typer.Option(help="Mean (or fixed) output length in tokens.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Fixed max_tokens cap per request (what reservations reserve).")] = None,
    n: Annotated[int | None, typer.Option("--n", help="Parallel samples per request.")] = None,
    beam_width: Annotated[int | None, typer.Option(help="Beam search width.")] = None,
    think_time_s: Annotated[float | None, typer.Option(help="Closed loop: seconds a client waits between a response and its next request.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for every random stream.")] = 0,
    profile: Annotated[Path | None, typer.Option(help="Latency profile JSON. [default: the committed profile for GPU/model/TP, else a roofline]")] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for requests.csv, steps.csv and summary.json.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead of a table.")] = False,
) -> None:
    """Simulate one engine replica serving a workload; print a `vllm bench serve`-style summary."""
    from profiles import check_profile_matches, default_profile
    from simcore.latency import load_profile
    from simcore.simulate import simulate
    from workloads import load_workload

    given = {
        "--max-batch-size": max_batch_size, "--batch-timeout-s": batch_timeout_s,
        "--allocator": allocator, "--preemption-mode": preemption_mode, "--swap-space": swap_space,
        "--enable-chunked-prefill": enable_chunked_prefill, "--reservation": reservation,
    }
    _refuse_irrelevant(policy.value, allocator.value if allocator else None, given)
    if seed < 0:
        raise ConfigError(f"--seed must be an integer >= 0, got {seed}")
    model_spec = get_model(model)
    gpu_spec = get_gpu(gpu)
    kwargs = {
        "block_size": block_size, "gpu_memory_utilization": gpu_memory_utilization,
        "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len, "tensor_parallel_size": tp, "policy": policy.value,
        "enable_chunked_prefill": enable_chunked_prefill, "swap_space": swap_space,
        "preemption_mode": preemption_mode.value if preemption_mode else None,
        "allocator": allocator.value if allocator else None,
        "reservation": reservation.value if reservation else None,
        "max_batch_size": max_batch_size, "batch_timeout_s": batch_timeout_s,
    }
    config = EngineConfig(**{k: v for k, v in kwargs.items() if v is not None})
    if max_model_len is not None and max_model_len > model_spec.max_position_embeddings:
        raise ConfigError(
            f"--max-model-len {max_model_len} exceeds {model_spec.name}'s context length "
            f"{model_spec.max_position_embeddings}"
        )
    overrides = {
        "num_requests": num_requests, "rate": rate, "concurrency": concurrency,
        "burstiness": burstiness, "input_len": input_len, "output_len": output_len,
        "max_tokens": max_tokens, "n": n, "beam_width": beam_width, "think_time_s": think_time_s,
    }
    wl = load_workload(workload, overrides, max_model_len=config.resolved_max_model_len(model_spec))
    if profile is not None:
        prof = load_profile(profile)
        check_profile_matches(prof, model_spec, tp)
    else:
        prof = default_profile(gpu_spec, model_spec, tp)

    from simcore.memory import plan_memory

    memory = plan_memory(model_spec, gpu_spec, config)
    say = (lambda m: typer.echo(m, err=True)) if as_json else typer.echo
    say(f"Profile: {prof.label} sha256:{prof.sha256[:12]}")
    say(memory.describe())
    update, stop = _progress_reporter(getattr(wl, "num_requests", None))
    try:
        result = simulate(model_spec, gpu_spec, config, wl, prof, seed=seed, progress=update)
    finally:
        stop()
    for note in wl.notes():
        typer.echo(f"NOTE {note}", err=True)
    for warning in result.warnings:
        typer.echo(f"WARNING {warning}", err=True)
    summary = {**result.summary}
    document = {"summary": summary, "record": result.record, "warnings": result.warnings}
    if out is not None:
        write_outputs(out, {
            "requests.csv": result.requests, "steps.csv": result.steps, "summary.json": document,
        })
    if as_json:
        typer.echo(json.dumps(document, indent=2, default=str))
    else:
        typer.echo(format_summary(summary))
        typer.echo(f"Simulated in {result.wall_s:.2f} s (seed {seed}).")
        if out is not None:
            typer.echo(f"Wrote {out}/requests.csv, steps.csv, summary.json")


__all__ = ["run", "fail"]
