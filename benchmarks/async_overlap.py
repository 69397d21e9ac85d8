"""How `--engine-version vllm-v1-async` prices a decode step: max(GPU step, hidden CPU work) + the gap.

profiles/host.py prices vLLM >= 0.14 (async scheduling on by default) with the measured gap between
two steps' kernels on the critical path, and the engine's CPU work for step n+1 (scheduling, input
preparation, sampling bookkeeping: the `vllm-v1` terms, carried as the profile's hidden terms) run
while the GPU executes step n. Where the GPU's step is the longer the CPU work is hidden; where the
CPU's work is the longer it sets the pace (simcore.latency.HostOverhead.excess_ms). For each shipped
roofline profile this prints, per decode batch at a mean context of --context tokens: the GPU's
step (kernels + collectives), the hidden CPU work, the step as kvsim prices it, which of the two
bounds it, and what the step cost before the CPU-bound case was priced (GPU + gap alone); then the
smallest batch (of --batches) from which the CPU's work sets the pace. (The first step after an
idle engine pays its CPU work in full: nothing ran before it to hide it behind; not shown here.)

    python benchmarks/async_overlap.py [--gpu H100-SXM-80GB] [--context 1024]
"""

from __future__ import annotations

import argparse
import json

from kvsim.profiles.lookup import PROFILE_DIR
from kvsim.simcore.latency import StepLatencyModel

ASYNC = "vllm-v1-async"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H100-SXM-80GB")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512, 1024])
    args = parser.parse_args()
    print(f"{'profile':<34} {'batch':>5}  {'GPU step ms':>11}  {'hidden CPU ms':>13}  {'step ms':>8}  "
          f"{'bound':>5}  {'GPU + gap ms':>12}")
    for path in sorted(PROFILE_DIR.glob(f"{args.gpu}-*.json")):
        data = json.loads(path.read_text())
        if data.get("source") != "roofline":
            continue
        model = StepLatencyModel(data, policy="continuous", engine_version=ASYNC)
        host = model.host
        if model.hidden is None:
            print(f"{path.stem:<34} no hidden terms (regenerate the profiles: python -m profiles.generate)")
            continue
        exposed = []
        for b in args.batches:
            ctx = b * args.context
            step_ms = model.step_time_s(b, [], b, ctx, b) * 1000.0
            kernels, coll, _ = model.step_breakdown_ms(b, [], b, ctx, b)
            gpu = kernels + coll
            cpu = host.hidden_per_step_ms + host.hidden_per_seq_ms * b
            visible = host.ms(b, 0)
            bound = "CPU" if cpu > gpu else "GPU"
            print(f"{path.stem:<34} {b:>5}  {gpu:>11.2f}  {cpu:>13.2f}  {step_ms:>8.2f}  {bound:>5}  {gpu + visible:>12.2f}")
            if cpu > gpu:
                exposed.append(b)
        print(f"{path.stem:<34} CPU work sets the pace from batch: {min(exposed) if exposed else 'never'}")


if __name__ == "__main__":
    main()
