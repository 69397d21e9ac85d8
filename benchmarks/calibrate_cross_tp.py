"""Calibrate on one TP, predict the others: a synthetic check of what `kvsim calibrate` carries
across TPs (issue 27's "fitted on TP 4 alone, predicting TP 2 and TP 8").

SYNTHETIC: the "measurements" are kvsim's own prices with a host model the calibration does not
assume (the default profiles with the `vllm-v0` host terms of each TP, which fall slightly from TP 2
to TP 8, while calibrate's host_rank prior is the default `vllm-v1` growth). It measures only the
carrying-over, not kvsim against a real GPU.

    python benchmarks/calibrate_cross_tp.py [--fit-tp 4]
"""

from __future__ import annotations

import argparse
import copy

import numpy as np

from kvsim.profiles import default_profile
from kvsim.profiles.calibrate import Measurement, calibrated_profile, fit_rows, price_all, profile_params
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import parse_profile

GPU, MODEL = get_gpu("H100-SXM-80GB"), get_model("llama2-70b")
SHAPES = [(b, p, o) for b in (1, 8, 32) for p, o in ((128, 32), (1024, 16))]


def v0_truth(tp: int):
    doc = copy.deepcopy(default_profile(GPU, MODEL, tp).data)
    doc["host_overhead"] = doc["host_overhead_by_engine"]["vllm-v0"]
    del doc["host_overhead_by_engine"], doc["host_overhead_by_policy"]
    return parse_profile(doc, f"v0 truth tp{tp}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-tp", type=int, default=4)
    args = parser.parse_args()
    tps = (2, 4, 8)
    truths = {tp: v0_truth(tp) for tp in tps}
    rows = [Measurement(2 + i, tp, b, p, o, {}) for i, (tp, (b, p, o)) in enumerate((t, s) for t in tps for s in SHAPES)]
    measured = [Measurement(r.line, r.tp, r.batch_size, r.input_len, r.output_len, dict(p.simulated))
                for r, p in zip(rows, price_all(MODEL, GPU, rows, truths.__getitem__), strict=True)]
    fit_rows_ = [r for r in measured if r.tp == args.fit_tp]
    bases = {tp: default_profile(GPU, MODEL, tp) for tp in tps}
    fit = fit_rows(fit_rows_, price_all(MODEL, GPU, fit_rows_, bases.__getitem__),
                   profile_params(bases[args.fit_tp], args.fit_tp))
    print("fitted:", {k: round(v, 4) for k, v in fit.params.items()})
    calibrated = {tp: parse_profile(calibrated_profile(bases[tp], fit.params, tp, {})) for tp in tps}
    for label, profiles in (("default (vllm-v1 host)", bases), (f"calibrated on TP {args.fit_tp}", calibrated)):
        priced = price_all(MODEL, GPU, measured, profiles.__getitem__)
        for tp in tps:
            errs = {q: [] for q in ("prefill_ms", "decode_ms")}
            for r, p in zip(measured, priced, strict=True):
                if r.tp == tp:
                    for q in errs:
                        errs[q].append(abs(p.simulated[q] / r.measured[q] - 1))
            print(f"{label:>24}  TP {tp}: median |error| prefill {100 * np.median(errs['prefill_ms']):.1f}%, "
                  f"decode {100 * np.median(errs['decode_ms']):.1f}%")


if __name__ == "__main__":
    main()
