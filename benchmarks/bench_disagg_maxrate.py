"""Max sustainable request rate per GPU at a TPOT (and optional TTFT) SLO: aggregated replicas vs
disaggregated units (reports.capacity's search, the same requests for every layout). Checks the
direction of published aggregated-vs-disaggregated results, e.g. NVIDIA Dynamo's "single-node
tests show a 30% throughput/GPU improvement" for Llama 70B FP8 on H100 with vLLM at 3K ISL /
150 OSL (ai-dynamo/dynamo docs/architecture/architecture.md, "Disaggregated serving").

    python benchmarks/bench_disagg_maxrate.py --model llama3-70b --quantization fp8 \
        --input-len 3000 --output-len 150 --slo-tpot-p95-ms 40 --agg 2,4,8 \
        --disagg 2x2:1x4,1x4:1x4,1x2:1x2,2x2:2x2,1x2:3x2
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from kvsim.profiles import default_profile
from kvsim.reports.capacity import SLO, max_sustainable_rate, simulator
from kvsim.reports.plan_disagg import DisaggCandidate, run_disagg
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.config import resolve
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--gpu", default="H100-SXM-80GB")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--workload", default="fixed-batch")
    ap.add_argument("--input-len", type=int, default=3000)
    ap.add_argument("--output-len", type=int, default=150)
    ap.add_argument("--num-requests", type=int, default=600)
    ap.add_argument("--slo-tpot-p95-ms", type=float, default=40.0)
    ap.add_argument("--slo-ttft-p95-ms", type=float, default=None)
    ap.add_argument("--agg", default="2,4,8", help="TP sizes of the aggregated replicas")
    ap.add_argument("--disagg", default="2x2:1x4,1x4:1x4,1x2:1x2")
    ap.add_argument("--placement", default=None)
    ap.add_argument("--tolerance", type=float, default=0.04)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gpu = get_gpu(args.gpu)
    base = EngineConfig(quantization=args.quantization)
    model = get_model(args.model)
    resolved_model = base.resolve_model(model)
    wl = load_workload(args.workload, {"num_requests": args.num_requests, "rate": 1.0, "input_len": args.input_len,
                                       "output_len": args.output_len},
                       max_model_len=base.resolved_max_model_len(resolved_model))
    slo = SLO(args.slo_ttft_p95_ms, args.slo_tpot_p95_ms)
    print(f"{resolved_model.name} ({args.quantization or 'bf16'}) on {gpu.name}; {args.workload} {args.input_len} in / "
          f"{args.output_len} out, {args.num_requests} requests per run; SLO {slo.text()}")
    print(f"{'layout':<34} {'GPUs':>4} {'max req/s':>9} {'req/s/GPU':>9} {'TTFT p95':>9} {'TPOT p95':>9} "
          f"{'ITL p99':>8} {'runs':>4} {'wall s':>6}")

    def show(label, gpus, cap, wall):
        passed = [p for p in cap.points if p.passed and p.rate == cap.max_rate]
        s = passed[0].summary if passed else {}
        print(f"{label:<34} {gpus:>4} {cap.max_rate:>9.2f} {cap.max_rate / gpus:>9.3f} "
              f"{s.get('p95_ttft_ms') or 0:>9.0f} {s.get('p95_tpot_ms') or 0:>9.1f} {s.get('p99_itl_ms') or 0:>8.1f} "
              f"{cap.num_runs:>4} {wall:>6.1f}")

    for tp in map(int, args.agg.split(",")):
        cfg = replace(base, tensor_parallel_size=tp)
        started = time.perf_counter()
        cap = max_sustainable_rate(simulator(model, gpu, resolve(model, gpu, cfg), wl,
                                             default_profile(gpu, resolved_model, tp), args.seed, slo),
                                   slo, 1.0, args.tolerance)
        show(f"agg 1 x TP{tp}", tp, cap, time.perf_counter() - started)
    from kvsim.reports.capacity import RateScaler

    scaler = RateScaler(wl)
    for layout in args.disagg.split(","):
        (p, a), (d, b) = (map(int, part.split("x")) for part in layout.split(":"))
        c = DisaggCandidate(model, gpu, replace(base, tensor_parallel_size=a, data_parallel_size=p),
                            replace(base, tensor_parallel_size=b, data_parallel_size=d))
        c.profiles = {"prefill": default_profile(gpu, resolved_model, a), "decode": default_profile(gpu, resolved_model, b)}
        started = time.perf_counter()
        cap = max_sustainable_rate(lambda rate, c=c: run_disagg(c, scaler.at(rate), args.seed, slo, args.placement),
                                   slo, 1.0, args.tolerance)
        show(f"disagg {p}xTP{a} P + {d}xTP{b} D", c.gpus, cap, time.perf_counter() - started)


if __name__ == "__main__":
    main()
