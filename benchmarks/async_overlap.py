"""Where `--engine-version vllm-v1-async` holds: the decode batches whose GPU step outlasts the CPU work it hides.

profiles/host.py prices vLLM >= 0.14 (async scheduling on by default) with only the measured gap
between two steps' kernels, on the grounds that the engine's CPU work for step n+1 (scheduling,
input preparation, sampling bookkeeping: the `vllm-v1` terms) runs while the GPU executes step n.
That holds while the GPU's step is the longer of the two; where the CPU's work is longer, the excess
is on the critical path and `vllm-v1-async` prices the step too fast. For each shipped roofline
profile this prints the GPU's decode step (kernels + collectives at a mean context of --context
tokens) against the `vllm-v1` CPU terms at the same TP, and the smallest batch (of --batches) at
which the CPU's work no longer fits under the GPU's step.

    python benchmarks/async_overlap.py [--gpu H100-SXM-80GB] [--context 1024]
"""

from __future__ import annotations

import argparse
import json

from kvsim.profiles.host import engine_host
from kvsim.profiles.lookup import PROFILE_DIR
from kvsim.simcore.latency import StepLatencyModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H100-SXM-80GB")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512, 1024])
    args = parser.parse_args()
    print(f"{'profile':<34} {'batch':>5}  {'GPU step ms':>11}  {'hidden CPU ms':>13}  hidden?")
    for path in sorted(PROFILE_DIR.glob(f"{args.gpu}-*.json")):
        data = json.loads(path.read_text())
        if data.get("source") != "roofline":
            continue
        model = StepLatencyModel(data, policy="continuous", engine_version="vllm-v1")
        per_step, per_seq = engine_host("vllm-v1", data["tensor_parallel_size"])
        exposed = []
        for b in args.batches:
            kernels, coll, _ = model.step_breakdown_ms(b, [], b, b * args.context, b)
            cpu = per_step + per_seq * b
            print(f"{path.stem:<34} {b:>5}  {kernels + coll:>11.2f}  {cpu:>13.2f}  {'yes' if cpu <= kernels + coll else 'NO'}")
            if cpu > kernels + coll:
                exposed.append(b)
        print(f"{path.stem:<34} CPU work exposed from batch: {min(exposed) if exposed else 'never'}")


if __name__ == "__main__":
    main()
