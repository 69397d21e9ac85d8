"""`kvsim profile`: measure a step-latency profile with real kernels; compare, check or validate profiles."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from typer._click.core import ParameterSource

from kvsim.simcore.errors import ConfigError


def _console(**kwargs):
    from rich.console import Console  # rich only when printing (keeps `kvsim run` start-up light)

    return Console(**kwargs)


def _table(**kwargs):
    from rich.table import Table

    return Table(**kwargs)


app = typer.Typer(
    help="Measure a step-latency profile with real kernels (torch); `compare` two profiles, `check` one against your measurements, `validate` its latency model on whole steps.",
    invoke_without_command=True,
    no_args_is_help=False,
)


class Device(StrEnum):
    cuda = "cuda"
    cpu = "cpu"


class Backend(StrEnum):
    auto = "auto"
    flashinfer = "flashinfer"
    vllm = "vllm"
    flex = "flex"
    reference = "reference"


def _block_sizes(text: str) -> tuple[int, ...]:
    from kvsim.simcore.specs import MAX_BLOCK_SIZE  # vLLM's largest; kvsim refuses larger everywhere else

    try:
        sizes = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"--block-sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(s <= 0 or s & (s - 1) or s > MAX_BLOCK_SIZE for s in sizes):
        raise ConfigError(f"--block-sizes must be powers of two from 1 to {MAX_BLOCK_SIZE}, got {text!r}")
    return sizes


@app.callback()
def profile(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Catalog model name or a HF config.json.")] = None,
    device: Annotated[Device, typer.Option(help="Device to measure on.")] = Device.cuda,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree (one layer's shard is measured).")] = 1,
    gpu: Annotated[str | None, typer.Option(help="Catalog GPU: names the profile, prices an unmeasured collective.")] = None,
    block_sizes: Annotated[str, typer.Option(help="KV block sizes for paged decode, e.g. 16,32.")] = "16",
    quick: Annotated[bool, typer.Option(help="Small grid for smoke runs.")] = False,
    out: Annotated[Path | None, typer.Option(help="Output JSON (default <gpu>-<model>-tp<N>.json).")] = None,
    repeats: Annotated[int, typer.Option(help="Timed repeats per grid point (median kept).")] = 10,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up calls per grid point.")] = 3,
    backend: Annotated[Backend, typer.Option(help="Paged decode backend; auto = first that works.")] = Backend.auto,
    dtype: Annotated[str, typer.Option(help="auto (bf16 on cuda, fp32 on cpu), bfloat16, float16, float32.")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed of the random tensors and block tables.")] = 0,
    quantization: Annotated[str | None, typer.Option(
        "--quantization", "-q",
        help="fp8: measure FP8 GEMMs (torch._scaled_mm, CUDA compute capability >= 8.9). [default: the checkpoint's own]",
    )] = None,
) -> None:
    """Measure one layer's kernels on the device present and write a schema-v1 profile."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        given = [f"--{name.replace('_', '-')}" for name in ctx.params
                 if ctx.get_parameter_source(name) != ParameterSource.DEFAULT]
        if given:  # options but no model: a mistake, not a request for help
            raise ConfigError(f"kvsim profile {given[0]} ...: --model is required to measure a profile")
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    from kvsim.simcore.catalog import get_gpu, get_model

    spec = get_model(model)
    if quantization is not None:
        if quantization != "fp8":
            raise ConfigError(f"--quantization must be fp8, got {quantization!r}")
        from dataclasses import replace

        spec = replace(spec, quantization="fp8")
    gpu_spec = get_gpu(gpu) if gpu else None
    if tp <= 0 or tp & (tp - 1) or spec.num_attention_heads % tp:
        raise ConfigError(f"--tp must be a power of two dividing {spec.num_attention_heads} heads, got {tp}")
    _check_timing_flags(repeats, warmup, seed)
    if dtype not in ("auto", "bfloat16", "float16", "float32"):
        raise ConfigError(f"--dtype must be auto, bfloat16, float16 or float32, got {dtype!r}")
    sizes = _block_sizes(block_sizes)
    if out is not None:  # before the minutes of measuring
        from kvsim.cli.options import check_inputs_kept
        from kvsim.cli.output import check_out_file

        check_inputs_kept(out, [model])
        check_out_file(out)
    from kvsim.profiles.harness import HarnessConfig, require_torch

    require_torch()
    cfg = HarnessConfig(
        model=spec, device=device.value, tp=tp, gpu=gpu_spec, block_sizes=sizes,
        quick=quick, repeats=repeats, warmup=warmup, dtype=dtype, backend=backend.value, seed=seed,
    )
    doc = _run_with_progress(cfg)
    from kvsim.simcore.latency import parse_profile

    parse_profile(doc, "measured profile")
    from kvsim.profiles.lookup import dtype_tag, profile_filename
    from kvsim.reports.files import write_file

    path = out or Path(profile_filename(doc["gpu"].replace(" ", "_"), spec.name, tp, dtype_tag(spec.weight_dtype)))
    write_file(path, lambda tmp: tmp.write_text(json.dumps(doc, indent=1) + "\n"))
    prov = doc["provenance"]
    typer.echo(
        f"wrote {path}: {prov['device_name']}, decode backend {prov['decode_backend']}, "
        f"{cfg.grid.num_points(len(cfg.block_sizes))} points x {repeats} repeats"
    )
    from kvsim.profiles.harness import noise_summary

    noise = noise_summary(prov.get("noise") or {})
    if noise:
        typer.echo(f"WARNING {noise}", err=True)


# Per grid point; the median of a few dozen repeats is stable, and a million would measure for days.
MAX_TIMING_CALLS = 10_000


def _check_timing_flags(repeats: int, warmup: int, seed: int) -> None:
    if not 1 <= repeats <= MAX_TIMING_CALLS:
        raise ConfigError(f"--repeats must be an integer from 1 to {MAX_TIMING_CALLS:,}, got {repeats}")
    if not 0 <= warmup <= MAX_TIMING_CALLS:
        raise ConfigError(f"--warmup must be an integer from 0 to {MAX_TIMING_CALLS:,}, got {warmup}")
    from kvsim.cli.options import check_seed

    check_seed(seed)


def _with_progress(description: str, total: int | None, work):
    """Run `work(report)` under a transient progress bar on stderr (a line every 10 s when stderr is
    not a terminal); `report(label, n)`."""
    import sys

    if not sys.stderr.isatty():
        from kvsim.cli.output import LiveProgress

        progress = LiveProgress(description, total, "points")
        return work(lambda label, n: progress.update(n))
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=_console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        return work(lambda label, n: bar.update(task, completed=n, description=label))


def _run_with_progress(cfg) -> dict:
    from kvsim.profiles.harness import measure_profile

    total = cfg.grid.num_points(len(cfg.block_sizes))
    return _with_progress("profiling", total, lambda report: measure_profile(cfg, report))


@app.command("compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="First profile (the baseline): a JSON file or a name from `kvsim list profiles`.")],
    b: Annotated[Path, typer.Argument(help="Second profile: a file or a name.")],
    policy: Annotated[str, typer.Option(help="Batching policy whose step overhead is used.")] = "continuous",
    block_size: Annotated[int, typer.Option(help="KV block size of the decode table.")] = 16,
) -> None:
    """Price a common grid of steps with both profiles: times and ratio B/A, median and worst."""
    from kvsim.profiles.compare import compare
    from kvsim.profiles.lookup import load_named_profile
    from kvsim.simcore.latency import POLICIES
    from kvsim.simcore.specs import EngineConfig

    EngineConfig(block_size=block_size)  # a block size vLLM has, else one line naming --block-size
    if policy not in POLICIES:
        raise ConfigError(f"--policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    pa, pb = load_named_profile(a), load_named_profile(b)
    rows, summary = compare(pa, pb, policy, block_size)
    table = _table(title=f"A = {pa.label}\nB = {pb.label}")
    for col in ("kind", "step", "A ms", "B ms", "B/A"):
        table.add_column(col, justify="left" if col in ("kind", "step") else "right")
    for step, ta, tb, ratio in rows:
        table.add_row(step.kind, step.label, f"{ta:.3f}", f"{tb:.3f}", f"{ratio:.3f}")
    console = _console(width=120)
    console.print(table)
    console.print(
        f"median ratio B/A: {summary['median_ratio']:.3f}   worst ratio B/A: {summary['worst_ratio']:.3f}   "
        f"steps outside grid: A {summary['extrapolated_a']}, B {summary['extrapolated_b']}"
    )


class StepSet(StrEnum):
    quick = "quick"
    full = "full"


@app.command("validate")
def validate_cmd(
    profile_path: Annotated[Path, typer.Option("--profile", help="Profile (a JSON file or a name from `kvsim list profiles`) whose latency model is checked.")],
    device: Annotated[Device | None, typer.Option(help="Device to run the steps on (default: the profile's).")] = None,
    steps: Annotated[StepSet | None, typer.Option(
        help="Step set (profiles/validate.py); default quick for a --quick profile, else full.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write rows, summary and provenance as JSON.")] = None,
    block_size: Annotated[int | None, typer.Option(help="KV block size (default 16 if profiled).")] = None,
    backend: Annotated[Backend | None, typer.Option(
        help="Paged decode backend (default: the one the profile was measured with).")] = None,
    repeats: Annotated[int, typer.Option(help="Timed repeats per step (median kept).")] = 10,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up calls per step.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the random tensors and block tables.")] = 0,
) -> None:
    """Time whole mixed steps with real kernels and compare them with the latency model's prices."""
    from kvsim.profiles.lookup import load_named_profile
    from kvsim.profiles.validate import ValidateConfig

    _check_timing_flags(repeats, warmup, seed)
    if block_size is not None:
        from kvsim.simcore.specs import EngineConfig

        EngineConfig(block_size=block_size)  # a power of two vLLM has, else a ConfigError naming --block-size
    if out is not None:
        from kvsim.cli.options import check_inputs_kept
        from kvsim.cli.output import check_out_file

        check_inputs_kept(out, [profile_path])
        check_out_file(out)
    cfg = ValidateConfig(
        profile=load_named_profile(profile_path), device=device.value if device else None,
        step_set=steps.value if steps else None, block_size=block_size,
        backend=backend.value if backend else None, repeats=repeats, warmup=warmup, seed=seed,
    )
    result = _validate_with_progress(cfg)
    if out is not None:
        from kvsim.reports.files import write_file

        write_file(out, lambda tmp: tmp.write_text(json.dumps(result, indent=1) + "\n"))
    _print_validation(result, out)


def _validate_with_progress(cfg) -> dict:
    from kvsim.profiles.validate import validate_profile

    return _with_progress("validating", None, lambda report: validate_profile(cfg, report))


def _print_validation(result: dict, out: Path | None) -> None:
    prov, s = result["provenance"], result["summary"]
    table = _table(title=(
        f"{result['profile']['label']} vs whole steps on {prov['device_name']}\n"
        f"{result['steps']} steps, block size {result['block_size']}, backend {prov['decode_backend']}, "
        f"ratio = predicted / measured"
    ))
    for col in ("kind", "step", "measured ms", "predicted ms", "ratio", "kernels ratio"):
        table.add_column(col, justify="left" if col in ("kind", "step") else "right")
    for r in result["rows"]:
        mark = " *" if r["extrapolated"] else ""
        table.add_row(r["kind"], r["step"] + mark, f"{r['measured_ms']:.3f}", f"{r['predicted_ms']:.3f}",
                      f"{r['ratio']:.3f}", f"{r['kernels_ratio']:.3f}")
    console = _console(width=120)
    console.print(table)
    console.print(
        f"|error| whole step: median {100 * s['median_abs_rel_error']:.1f}%, worst "
        f"{100 * s['worst_abs_rel_error']:.1f}% ({s['worst_step']})\n"
        f"|error| kernels only (without the profile's overhead and collective, shared by both): median "
        f"{100 * s['kernels_median_abs_rel_error']:.1f}%, worst {100 * s['kernels_worst_abs_rel_error']:.1f}% "
        f"({s['kernels_worst_step']})"
    )
    measured_on = result["profile"]["measured_on"]
    if measured_on and measured_on != prov["device_name"]:
        console.print(f"note: the profile was measured on {measured_on}, the steps ran on {prov['device_name']}")
    if s["extrapolated_steps"]:
        console.print(f"* priced outside the profile's grid: {s['extrapolated_steps']} steps")
    if result["skipped_steps"]:
        console.print(f"skipped (beyond the model's context limit): {'; '.join(result['skipped_steps'])}")
    if out is not None:
        console.print(f"wrote {out}")


@app.command("check")
def check_cmd(
    measurements: Annotated[Path, typer.Argument(help="CSV: tp, batch_size, input_len, output_len and prefill_ms / decode_ms / latency_ms.")],
    profile_paths: Annotated[list[Path], typer.Option("--profile", help="Profile: a JSON file or a name from `kvsim list profiles` (repeat for several TPs); rows go to the profile of their TP.")],
    model: Annotated[str | None, typer.Option(help="Catalog model or HF config.json [default: the profile's model].")] = None,
    engine_version: Annotated[str | None, typer.Option(help="vLLM version the rows were measured on (its scheduler and, where the profile has them, its host terms). [default: vllm-v1]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows and medians as JSON.")] = False,
) -> None:
    """Price every row of a measurements file with a profile (as `kvsim calibrate` does: a batch of
    B requests at t = 0) and print per-row and median errors."""
    from kvsim.profiles.calibrate import check_rows, check_rows_fit, price_all, read_measurements
    from kvsim.profiles.lookup import check_profile_matches, load_named_profile
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION, ENGINE_VERSIONS

    version = engine_version or DEFAULT_ENGINE_VERSION
    if version not in ENGINE_VERSIONS:
        raise ConfigError(f"--engine-version must be one of {', '.join(ENGINE_VERSIONS)}, got {engine_version!r}")
    rows, _ = read_measurements(measurements)
    by_tp, given = {}, {}
    for path in profile_paths:
        p = load_named_profile(path)
        tp = p.data["tensor_parallel_size"]
        if tp in by_tp:  # rows go to the profile of their TP: a second one would be ignored
            raise ConfigError(f"--profile: {given[tp]} and {path} are both TP {tp}; give one profile per TP")
        by_tp[tp], given[tp] = p, path
    first = next(iter(by_tp.values()))
    model_spec = get_model(model or first.data["model"])
    gpu_spec = get_gpu(first.data["gpu"])
    for t, p in by_tp.items():
        check_profile_matches(p, model_spec, t, gpu_spec)
    check_rows_fit(rows, model_spec, measurements, version)
    usable = [r for r in rows if r.tp in by_tp]
    skipped = len(rows) - len(usable)
    if not usable:
        raise ConfigError(f"{measurements}: no row has a TP of the profiles given ({', '.join(map(str, sorted(by_tp)))})")
    from kvsim.cli.calibrate_cmd import _progress

    priced = _progress(len(usable))(lambda report: price_all(model_spec, gpu_spec, usable, by_tp.__getitem__, report,
                                                             version))
    table, medians = check_rows(usable, priced)
    if as_json:
        typer.echo(json.dumps({"rows": table, "median_abs_error": medians, "skipped_rows": skipped}, indent=2))
        return
    out = _table(title=f"{measurements} priced by {', '.join(p.label for p in by_tp.values())}")
    for col in ("line", "tp", "B", "in", "out", "quantity", "measured ms", "kvsim ms", "error"):
        out.add_column(col, justify="right")
    for t in table:
        out.add_row(str(t["line"]), str(t["tp"]), str(t["batch_size"]), str(t["input_len"]), str(t["output_len"]),
                    t["quantity"], f"{t['measured_ms']:.2f}", f"{t['kvsim_ms']:.2f}", f"{t['error']:+.1%}")
    _console(width=120).print(out)
    typer.echo("median |error|: " + ", ".join(f"{q} {v:.1%}" for q, v in medians.items()))
    if skipped:
        typer.echo(f"skipped {skipped} rows whose TP has no profile here", err=True)
