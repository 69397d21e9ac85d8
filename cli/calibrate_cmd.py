"""`kvsim calibrate`: fit kvsim's host terms and efficiency scalars to your own batch measurements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kvsim.simcore.errors import ConfigError


def _tps(text: str | None) -> list[int] | None:
    if text is None:
        return None
    from kvsim.reports.sweep import parse_list  # an empty item or a TP given twice is a mistake, as in sweep

    tps = sorted(parse_list("--tp", text, int))
    if not tps or any(t < 1 or t & (t - 1) for t in tps):
        raise ConfigError(f"--tp must list powers of two >= 1, got {text!r}")
    return tps


def _progress(total: int):
    """A live bar on a terminal; otherwise a line every 10 rows (and at the end) on stderr."""
    import sys

    if sys.stderr.isatty():
        from kvsim.cli.profile_cmd import _with_progress

        return lambda work: _with_progress("pricing rows", total, work)

    def report(label: str, n: int) -> None:
        if n % 10 == 0 or n == total:
            typer.echo(f"priced {n}/{total} rows", err=True)

    return lambda work: work(report)


def calibrate(
    measurements: Annotated[Path, typer.Argument(help="CSV: tp, batch_size, input_len, output_len and prefill_ms / decode_ms / latency_ms.")],
    model: Annotated[str, typer.Option(help="Catalog model name or a HF config.json.")],
    gpu: Annotated[str, typer.Option(help="Catalog GPU the measurements were taken on.")],
    out: Annotated[Path, typer.Option(help="Folder for one calibrated profile per TP (<gpu>-<model>-tp<N>.json); an earlier fit's calibrated profiles there are replaced, other files kept.")],
    tp: Annotated[str | None, typer.Option(help="TPs to write profiles for, e.g. 2,4,8 [default: the TPs in the data].")] = None,
    engine_version: Annotated[str | None, typer.Option(help="vLLM version the rows were measured on: vllm-v0, vllm-0.6, vllm-v1 or vllm-v1-async; its scheduler prices the rows and its default host terms are the fit's prior. [default: vllm-v1]")] = None,
    free: Annotated[str | None, typer.Option(help="Scalars to fit as well, e.g. s_gemm,s_attn,s_coll [default: none: kernels and collectives are measured, so they stay at 1].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fit as JSON.")] = False,
) -> None:
    """Fit host/engine terms (and, with --free, kernel, attention and collective scalars) to measured
    batch runs; say which terms the rows identify; print in-sample and leave-one-out error per TP;
    write one calibrated profile per TP."""
    from kvsim.cli.output import check_out_folder, write_outputs
    from kvsim.profiles import default_profile, profile_filename
    from kvsim.profiles.calibrate import (
        PARAMS,
        calibrated_profile,
        check_free_scalars,
        check_rows_fit,
        fit_rows,
        hidden_terms,
        price_all,
        profile_params,
        read_measurements,
    )
    from kvsim.simcore.catalog import get_gpu, get_model

    model_spec, gpu_spec = get_model(model), get_gpu(gpu)
    out_tps = _tps(tp)
    from kvsim.profiles.calibrate import MeasurementError
    from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION, ENGINE_VERSIONS

    version = engine_version or DEFAULT_ENGINE_VERSION
    if version not in ENGINE_VERSIONS:
        raise ConfigError(f"--engine-version must be one of {', '.join(ENGINE_VERSIONS)}, got {engine_version!r}")
    from kvsim.reports.sweep import parse_list

    # "s_gemm,s_gemm": one scalar named twice is a mistake, as in sweep
    free_scalars = check_free_scalars(parse_list("--free", free, str) if free is not None else [])
    rows, sha = read_measurements(measurements)
    check_rows_fit(rows, model_spec, measurements, version)
    data_tps = sorted({r.tp for r in rows})
    out_tps = out_tps or data_tps
    names = tuple(profile_filename(gpu_spec.name, model_spec.name, t) for t in out_tps)
    from kvsim.cli.options import check_inputs_kept

    check_inputs_kept(out, [measurements, model], names)
    folder = check_out_folder(out, names)
    from kvsim.profiles.calibrate import batch_config
    from kvsim.simcore.memory import plan_memory

    for t in sorted(set(out_tps) | set(data_tps)):  # a TP the model does not fit: refused before work
        plan_memory(model_spec, gpu_spec, batch_config(t, 1, version))
    from kvsim.profiles.calibrate import check_enough_points

    try:
        check_enough_points(rows, free_scalars)  # before any row is priced
    except MeasurementError as exc:
        raise MeasurementError(f"{measurements}: {exc}") from None
    bases = {t: default_profile(gpu_spec, model_spec, t) for t in sorted(set(out_tps) | set(data_tps))}
    priced = _progress(len(rows))(lambda report: price_all(model_spec, gpu_spec, rows, bases.__getitem__, report,
                                                                             version))
    base_tp = max(data_tps, key=lambda t: sum(r.tp == t for r in rows))  # the prior: the most measured TP's
    prior = profile_params(bases[base_tp], base_tp, version)
    try:
        fit = fit_rows(rows, priced, prior, free_scalars)
    except MeasurementError as exc:
        raise MeasurementError(f"{measurements}: {exc}") from None
    from kvsim.simcore.simulate import KVSIM_VERSION

    provenance = {
        "calibration": {
            "kvsim_version": KVSIM_VERSION,
            "input": str(measurements), "input_sha256": sha, "engine_version": version, "rows": len(rows), "data_tps": data_tps,
            "fitted": fit.params, "prior": dict(zip(PARAMS, map(float, prior), strict=True)),
            "errors_by_tp": {str(k): v for k, v in fit.by_tp.items()}, "residuals": fit.rows,
            "fitted_terms": fit.fitted, "pinned_scalars": fit.pinned,
            "not_identifiable": fit.unidentified, "on_bound": fit.on_bound,
            "loo_median_abs_error": fit.loo_median_abs_error,
            "pricing": "each row as kvsim run --workload fixed-batch --num-requests B --input-len P "
                       "--output-len O --max-num-seqs max(256,B): prefill_ms = the last first token "
                       "(the whole batch's prefill), decode_ms = mean TPOT, latency_ms = makespan",
            "method": "profiles/calibrate.py: non-negative least squares on relative error",
        },
    }
    docs = {name: calibrated_profile(bases[t], fit.params, t, provenance, version)
            for name, t in zip(names, out_tps, strict=True)}
    from kvsim.reports.files import calibrated_profiles

    earlier = tuple(n for n in calibrated_profiles(folder) if n not in docs)  # a stale fit is not left beside this one
    write_outputs(out, docs, replaces=earlier)
    for line in fit.warnings():
        typer.echo(f"kvsim: warning: {line}", err=True)
    if as_json:
        typer.echo(json.dumps({"fitted": fit.params, "errors_by_tp": fit.by_tp, "fitted_terms": fit.fitted,
                               "pinned_scalars": fit.pinned, "not_identifiable": fit.unidentified,
                               "on_bound": fit.on_bound, "loo_median_abs_error": fit.loo_median_abs_error,
                               "written": [str(out / n) for n in names],
                               "removed": [str(out / n) for n in earlier]}, indent=2))
        return
    typer.echo(f"Calibrated {model_spec.name} on {gpu_spec.name} from {len(rows)} rows of {measurements}")
    typer.echo("Terms: " + ", ".join(f"{k} {v:.4g}" for k, v in fit.params.items()))
    typer.echo(f"Fitted (identified by the rows): {', '.join(fit.fitted) or 'none'}")
    hidden = [(t, h) for t in out_tps if (h := hidden_terms(version, t)) is not None]
    if hidden:
        typer.echo(f"Hidden CPU work (not fitted: {version}'s defaults, priced into every row): " + ", ".join(
            f"TP {t} {h['hidden_per_step_ms']:.4g} ms/step + {h['hidden_per_seq_ms']:.4g} ms/seq" for t, h in hidden))
    if fit.pinned:
        typer.echo(f"Pinned at 1 (measured kernels / collectives; free with --free): {', '.join(fit.pinned)}")
    if fit.unidentified:
        typer.echo(f"Not identifiable from these rows (kept at the default): {', '.join(fit.unidentified)}")
    typer.echo(f"{'TP':>4} {'points':>7} {'in-sample median |err|':>24} {'leave-one-out median |err|':>28}")
    for t, e in fit.by_tp.items():
        typer.echo(f"{t:>4} {e['points']:>7} {e['in_sample_median_abs_error']:>24.1%} "
                   f"{e['loo_median_abs_error']:>28.1%}")
    for name, t in zip(names, out_tps, strict=True):
        note = "" if t in data_tps else " (no rows at this TP: host terms carried over, kernels re-derived)"
        typer.echo(f"Wrote {out / name}{note}")
    for name in earlier:
        typer.echo(f"Removed {out / name} (an earlier fit's)")


__all__ = ["calibrate"]
