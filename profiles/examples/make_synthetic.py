"""Write synthetic-h100-llama2-70b.csv: batch runs that kvsim itself priced from stated terms.

SYNTHETIC, NOT A MEASUREMENT. It exists to show the file format and to test that `kvsim calibrate`
recovers terms it can identify. Each row is `kvsim run --workload fixed-batch` on the default H100
Llama-2-70B roofline profile of its TP with the kernels and collectives as measured (scalars 1) and
the host terms below, rounded to 0.01 ms as a benchmark log would print them.

    python profiles/examples/make_synthetic.py
"""

from __future__ import annotations

import csv
from pathlib import Path

from kvsim.profiles import default_profile
from kvsim.profiles.calibrate import Measurement, calibrated_profile, price_all
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import parse_profile

TERMS = {"s_gemm": 1.0, "s_attn": 1.0, "s_coll": 1.0, "host_step": 3.0, "host_rank": 0.5, "host_seq": 0.2,
         "host_prefill_step": 2.0, "host_prefill_token": 0.002}
TPS = (2, 4)
SHAPES = [(b, p, o) for b in (1, 8, 32) for p, o in ((128, 32), (1024, 16))]
OUT = Path(__file__).with_name("synthetic-h100-llama2-70b.csv")


def main() -> None:
    gpu, model = get_gpu("H100-SXM-80GB"), get_model("llama2-70b")
    profiles = {tp: parse_profile(calibrated_profile(default_profile(gpu, model, tp), TERMS, tp, {})) for tp in TPS}
    rows = [Measurement(0, tp, b, p, o, {}) for tp in TPS for b, p, o in SHAPES]
    priced = price_all(model, gpu, rows, profiles.__getitem__)
    with OUT.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["tp", "batch_size", "input_len", "output_len", "prefill_ms", "decode_ms", "latency_ms"])
        for r, p in zip(rows, priced, strict=True):
            w.writerow([r.tp, r.batch_size, r.input_len, r.output_len,
                        *(f"{p.simulated[q]:.2f}" for q in ("prefill_ms", "decode_ms", "latency_ms"))])
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
