"""Aggregated vs disaggregated prefill/decode on the same GPU count, across request rates: the
TTFT-up / ITL-down trade-off (simcore.disagg) as `vllm bench serve` would see it at the proxy.

    python benchmarks/bench_disagg.py --model llama3-70b --workload azure-conv --num-requests 2000 \
        --rates 2,4,8 --agg 4x2 --disagg 1x4:1x4

`--agg TPxDP`: one pool of DP replicas of TP GPUs; `--disagg PxA:DxB`: P prefill instances of TP A
and D decode instances of TP B. Same seed and requests for every run.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from kvsim.profiles import default_profile
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.config import resolve
from kvsim.simcore.disagg import prepare_disagg
from kvsim.simcore.simulate import prepare
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload

COLUMNS = ("mean_ttft_ms", "p95_ttft_ms", "mean_tpot_ms", "p95_tpot_ms", "p99_itl_ms", "mean_e2el_ms",
           "request_throughput", "output_throughput")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--gpu", default="H100-SXM-80GB")
    ap.add_argument("--workload", default="azure-conv")
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--input-len", type=int)
    ap.add_argument("--output-len", type=int)
    ap.add_argument("--rates", default="2,4,8")
    ap.add_argument("--agg", default="4x2")
    ap.add_argument("--disagg", default="1x4:1x4")
    ap.add_argument("--placement", default=None)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gpu = get_gpu(args.gpu)
    base = EngineConfig(quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype)
    model = base.resolve_model(get_model(args.model))
    tp, dp = map(int, args.agg.split("x"))
    (p, a), (d, b) = (map(int, part.split("x")) for part in args.disagg.split(":"))
    print(f"{model.name} on {args.gpu}; workload {args.workload} ({args.num_requests} requests); "
          f"agg TP{tp} x DP{dp} ({tp * dp} GPUs) vs disagg {p} x TP{a} prefill + {d} x TP{b} decode "
          f"({p * a + d * b} GPUs)")
    print(f"{'rate':>5} {'layout':>7} " + " ".join(f"{c:>18}" for c in COLUMNS) + f" {'wall_s':>7}")
    for rate in map(float, args.rates.split(",")):
        overrides = {"num_requests": args.num_requests, "rate": rate}
        if args.input_len:
            overrides["input_len"] = args.input_len
        if args.output_len:
            overrides["output_len"] = args.output_len
        wl = load_workload(args.workload, overrides, max_model_len=base.resolved_max_model_len(model))
        started = time.perf_counter()
        agg_cfg = replace(base, tensor_parallel_size=tp, data_parallel_size=dp)
        agg = prepare(model, gpu, resolve(model, gpu, agg_cfg), wl, default_profile(gpu, model, tp),
                      seed=args.seed).run()
        wall_agg = time.perf_counter() - started
        started = time.perf_counter()
        configs = {"prefill": resolve(model, gpu, replace(base, tensor_parallel_size=a, data_parallel_size=p)),
                   "decode": resolve(model, gpu, replace(base, tensor_parallel_size=b, data_parallel_size=d))}
        profiles = {"prefill": default_profile(gpu, model, a), "decode": default_profile(gpu, model, b)}
        dis = prepare_disagg(model, gpu, configs, wl, profiles, seed=args.seed, placement=args.placement).run()
        wall_dis = time.perf_counter() - started
        for label, result, wall in (("agg", agg, wall_agg), ("disagg", dis, wall_dis)):
            s = result.summary
            print(f"{rate:>5g} {label:>7} " + " ".join(f"{s.get(c) or 0:>18.1f}" for c in COLUMNS) + f" {wall:>7.1f}")
        k = dis.summary["kv_transfer"]
        pools = dis.summary["pools"]
        print(f"      transfer p50/p99 {k['p50_transfer_ms']:.2f}/{k['p99_transfer_ms']:.2f} ms, wait for decode "
              f"blocks mean {k['mean_decode_wait_ms']:.1f} ms; busy prefill {100 * pools['prefill']['utilization']:.0f}% "
              f"decode {100 * pools['decode']['utilization']:.0f}%")


if __name__ == "__main__":
    main()
