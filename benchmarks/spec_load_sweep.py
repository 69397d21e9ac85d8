"""Where speculative decoding pays: TPOT with and without it across request rates, and the rate
at which its speed-up crosses 1 (issue 26's "done when").

    python benchmarks/spec_load_sweep.py [--model llama3-70b --tp 4 --gpu H100-SXM-80GB]
        [--speculative-config '{"method": "eagle", "num_speculative_tokens": 3}']
        [--rates 0.5,1,2,4,8,12,16,20,24] [--num-requests 600] [--workload sharegpt]

Each rate runs the same requests (same seed) twice: with the speculative config and
without it (both in the compiled core where it is built, else the Python engine). Prints a markdown table and the crossing rate.
"""

from __future__ import annotations

import argparse
import time

from kvsim.profiles import default_profile
from kvsim.reports.speculation import crossing_rate, load_sweep
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.specs import EngineConfig
from kvsim.simcore.speculative import parse_speculative_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--gpu", default="H100-SXM-80GB")
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--speculative-config", default='{"method": "eagle", "num_speculative_tokens": 3}')
    parser.add_argument("--rates", default="0.5,1,2,4,8,12,16,20,24")
    parser.add_argument("--num-requests", type=int, default=600)
    parser.add_argument("--workload", default="sharegpt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, gpu = get_model(args.model), get_gpu(args.gpu)
    spec = parse_speculative_config(args.speculative_config)
    config = EngineConfig(tensor_parallel_size=args.tp, speculative_config=spec)
    profile = default_profile(gpu, model, args.tp)
    draft = default_profile(gpu, spec.draft_model_spec(), spec.draft_tp(args.tp)) if spec.method == "draft_model" else None
    started = time.perf_counter()
    rows = load_sweep(model, gpu, config, args.workload, [float(r) for r in args.rates.split(",")],
                      args.num_requests, profile, args.seed, draft)
    print(f"{args.model} TP {args.tp} on {args.gpu}, {args.workload}, {args.num_requests} requests per rate, "
          f"seed {args.seed}; speculative {args.speculative_config} (acceptance {spec.source})")
    print("| rate | TPOT off (ms) | TPOT on (ms) | TPOT speed-up | ITL on (ms) | TTFT p50 off / on (ms) "
          "| throughput x | acc. length | draft share | load off |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rate']:g} | {r['tpot_ms']:.1f} | {r['tpot_spec_ms']:.1f} | {r['speedup_mean_tpot_ms']:.2f} | "
              f"{r['itl_spec_ms']:.1f} | {r['ttft_ms']:.0f} / {r['ttft_spec_ms']:.0f} | "
              f"{r['speedup_output_throughput']:.2f} | {r['acceptance_length']:.2f} | {100 * r['draft_share']:.1f}% | "
              f"{r['saturation']} |")
    cross = crossing_rate(rows)
    print(f"TPOT speed-up crosses 1 at {cross:.2f} req/s" if cross is not None else "TPOT speed-up stays above 1 "
          "over these rates")
    print(f"wall {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
