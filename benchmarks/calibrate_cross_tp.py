"""Calibrate on one TP, predict the others (issue 27's "fitted on TP 4 alone, predicting TP 2 and
TP 8"), on synthetic rows or on a real measurements file.

Without --measurements the rows are SYNTHETIC: kvsim's own prices with a host model the calibration
does not assume (the default profiles with the `vllm-v0` host terms of each TP, which fall slightly
from TP 2 to TP 8, while calibrate carries a one-TP host cost along the default `vllm-v1` line). That measures
only the carrying-over, not kvsim against a real GPU.

With --measurements FILE (e.g. profiles/examples/argonne-h100-llama3-8b.csv, real vLLM runs) it
prints, per TP, the default profiles' median and worst error on every measured quantity, then fits
the rows of --fit-tp alone (as `kvsim calibrate` would on that file cut to one TP) and prints the
same for the calibrated profiles at every TP, and, for batch-1 rows, the time per decode step.
Nothing here changes a default: the file is a check, only the calibrated profiles fit it.

    python benchmarks/calibrate_cross_tp.py [--fit-tp 4]
    python benchmarks/calibrate_cross_tp.py --measurements profiles/examples/argonne-h100-llama3-8b.csv \\
        --model llama3-8b --gpu H100 --engine-version vllm-v0 --fit-tp 2
"""

from __future__ import annotations

import argparse
import copy

import numpy as np

from kvsim.profiles import default_profile
from kvsim.profiles.calibrate import (
    QUANTITIES,
    Measurement,
    RowPricing,
    calibrated_profile,
    check_free_scalars,
    check_rows_fit,
    fit_rows,
    price_all,
    profile_params,
    read_measurements,
)
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import parse_profile
from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION, ENGINE_VERSIONS

SHAPES = [(b, p, o) for b in (1, 8, 32) for p, o in ((128, 32), (1024, 16))]


def v0_truth(gpu, model, tp: int):
    doc = copy.deepcopy(default_profile(gpu, model, tp).data)
    doc["host_overhead"] = doc["host_overhead_by_engine"]["vllm-v0"]
    del doc["host_overhead_by_engine"], doc["host_overhead_by_policy"]
    return parse_profile(doc, f"v0 truth tp{tp}")


def synthetic_rows(gpu, model, tps) -> list[Measurement]:
    truths = {tp: v0_truth(gpu, model, tp) for tp in tps}
    rows = [Measurement(2 + i, tp, b, p, o, {}) for i, (tp, (b, p, o)) in enumerate((t, s) for t in tps for s in SHAPES)]
    return [Measurement(r.line, r.tp, r.batch_size, r.input_len, r.output_len, dict(p.simulated))
            for r, p in zip(rows, price_all(model, gpu, rows, truths.__getitem__), strict=True)]


def error_lines(label: str, rows: list[Measurement], priced: list[RowPricing]) -> list[str]:
    """Per TP and measured quantity: median |error| and the worst (signed) error."""
    out = []
    for tp in sorted({r.tp for r in rows}):
        parts = []
        for q in QUANTITIES:
            errs = np.array([p.simulated[q] / r.measured[q] - 1 for r, p in zip(rows, priced, strict=True)
                             if r.tp == tp and q in r.measured])
            if len(errs):
                worst = errs[np.argmax(np.abs(errs))]
                parts.append(f"{q.removesuffix('_ms')} median {100 * np.median(np.abs(errs)):.1f}% "
                             f"worst {100 * worst:+.1f}% (n={len(errs)})")
        out.append(f"{label:>28}  TP {tp}: " + ", ".join(parts))
    return out


def batch1_lines(rows: list[Measurement], priced: list[RowPricing]) -> list[str]:
    """Batch-1 rows: ms per decode step, kvsim's against the measurement's (its decode_ms, or else
    its latency less kvsim's own prefill over output_len - 1 steps: only as good as kvsim's
    prefill, so the line says what share of each row that prefill is)."""
    out = []
    for tp in sorted({r.tp for r in rows}):
        pairs = [(r, p) for r, p in zip(rows, priced, strict=True) if r.tp == tp and r.batch_size == 1
                 and r.output_len >= 2 and ({"decode_ms", "latency_ms"} & set(r.measured))]
        if not pairs:
            continue
        meas = [r.measured["decode_ms"] if "decode_ms" in r.measured else
                (r.measured["latency_ms"] - p.simulated["prefill_ms"]) / (r.output_len - 1) for r, p in pairs]
        sim = [p.simulated["decode_ms"] for _, p in pairs]
        how = ("measured decode_ms" if all("decode_ms" in r.measured for r, _ in pairs) else
               f"from latency: kvsim's prefill {100 * max(p.simulated['prefill_ms'] / p.simulated['latency_ms'] for _, p in pairs):.1f}% of a row at most")
        out.append(f"{'batch-1 decode step':>28}  TP {tp}: measured {np.median(meas):.2f} ms, kvsim "
                   f"{np.median(sim):.2f} ms ({np.median(sim) - np.median(meas):+.2f} ms; medians of {len(pairs)} rows, {how})")
    return out


def prefill_slope_lines(rows: list[Measurement], priced: list[RowPricing]) -> list[str]:
    """Rows with prefill_ms: the cost per prompt token (slope of a line through prefill_ms against
    batch_size x input_len), measured over kvsim's: issue 27's "prefill per-token cost x1.18 / 1.51
    / 1.93 too low at TP 2 / 4 / 8"."""
    out = []
    for tp in sorted({r.tp for r in rows}):
        pairs = [(r, p) for r, p in zip(rows, priced, strict=True) if r.tp == tp and "prefill_ms" in r.measured]
        tokens = np.array([r.batch_size * r.input_len for r, _ in pairs], dtype=float)
        if len(set(tokens)) < 2:
            continue
        design = np.column_stack([np.ones_like(tokens), tokens])
        slope = [np.linalg.lstsq(design, np.array(v), rcond=None)[0][1] for v in
                 ([r.measured["prefill_ms"] for r, _ in pairs], [p.simulated["prefill_ms"] for _, p in pairs])]
        out.append(f"{'prefill per prompt token':>28}  TP {tp}: measured {1e3 * slope[0]:.1f} us, kvsim "
                   f"{1e3 * slope[1]:.1f} us (x{slope[0] / slope[1]:.2f}; {len(pairs)} rows)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-tp", type=int, default=4)
    parser.add_argument("--measurements", help="a measurements CSV (as kvsim calibrate reads) instead of synthetic rows")
    parser.add_argument("--model", default="llama2-70b")
    parser.add_argument("--gpu", default="H100-SXM-80GB")
    parser.add_argument("--engine-version", default=DEFAULT_ENGINE_VERSION, choices=ENGINE_VERSIONS,
                        help="the version the rows were measured on (prices them; its host terms are the prior)")
    parser.add_argument("--free", default="", help="scalars to fit as well, e.g. s_coll (default: none)")
    args = parser.parse_args()
    gpu, model, version = get_gpu(args.gpu), get_model(args.model), args.engine_version
    if args.measurements:
        measured, _ = read_measurements(args.measurements)
        check_rows_fit(measured, model, args.measurements, version)
    else:
        measured = synthetic_rows(gpu, model, (2, 4, 8))
    tps = sorted({r.tp for r in measured})
    if args.fit_tp not in tps:
        parser.error(f"--fit-tp {args.fit_tp}: no rows at that TP (the rows have TP {', '.join(map(str, tps))})")
    free = check_free_scalars([s.strip() for s in args.free.split(",") if s.strip()])
    bases = {tp: default_profile(gpu, model, tp) for tp in tps}
    priced = price_all(model, gpu, measured, bases.__getitem__, engine_version=version)
    fit_idx = [i for i, r in enumerate(measured) if r.tp == args.fit_tp]
    fit = fit_rows([measured[i] for i in fit_idx], [priced[i] for i in fit_idx],
                   profile_params(bases[args.fit_tp], args.fit_tp, version), free)
    print(f"{len(measured)} rows ({'real: ' + args.measurements if args.measurements else 'synthetic'}), "
          f"{model.name} on {gpu.name}, priced as {version}")
    print(f"fitted on TP {args.fit_tp} alone:", {k: round(v, 4) for k, v in fit.params.items()})
    for line in fit.warnings():
        print("  warning:", line)
    print(f"  leave-one-out within TP {args.fit_tp}: median |error| {100 * fit.loo_median_abs_error:.1f}%")
    calibrated = {tp: parse_profile(calibrated_profile(bases[tp], fit.params, tp, {})) for tp in tps}
    priced_cal = price_all(model, gpu, measured, calibrated.__getitem__, engine_version=version)
    for line in (error_lines(f"default ({version})", measured, priced)
                 + error_lines(f"calibrated on TP {args.fit_tp}", measured, priced_cal)
                 + batch1_lines(measured, priced) + prefill_slope_lines(measured, priced)):
        print(line)


if __name__ == "__main__":
    main()
