"""The full-batch capacity (simcore/full_batch.py) against what the simulator completes when offered more.

For each deployment: a short run gives the model's capacity C; the same deployment is then offered
1.15 x C with enough requests to overload it, and its completed rate once warm (what an overloaded
engine keeps up with) is compared with C. The ratio C / completed is the steady state's error as a
capacity; simcore.metrics.CAPACITY_MARGIN must stay above its low side, or runs that keep up could
be called overloaded.

    python benchmarks/full_batch_capacity.py            # ~1-2 min on 2 shared cores
    python benchmarks/full_batch_capacity.py prefix     # only the rows whose label has "prefix"
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

LONG_PROMPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "long-system-prompt.yaml")
KVSIM = shutil.which("kvsim", path=os.path.dirname(sys.executable)) or "kvsim"  # this venv's

CASES = [  # (label, kvsim run options, requests)
    ("8B, H100, V1 (1,024 seqs)", [], 10000),
    ("8B, H100, vllm-v1-async", ["--engine-version", "vllm-v1-async"], 10000),
    ("8B, H100, vllm-v0 (256 seqs, no chunked prefill)", ["--engine-version", "vllm-v0"], 6000),
    ("8B, H100, vllm-0.6 (10-step decode rounds)", ["--engine-version", "vllm-0.6"], 6000),
    ("8B, H100, vllm-0.6, 128 in / 4 out", ["--engine-version", "vllm-0.6", "--dataset-name", "random",
                                             "--random-input-len", "128", "--random-output-len", "4"], 20000),
    ("8B, A100-80GB (256 / 2048)", ["--gpu", "A100-80GB"], 6000),
    ("70B, 4 x H100 TP 4", ["--model", "llama3-70b", "--tp", "4"], 10000),
    ("8B, H100, DP 2", ["--dp", "2"], 20000),
    ("8B, H100, alpaca", ["--workload", "alpaca"], 20000),
    ("8B, 2 x H100 PP 2", ["--pp", "2"], 12000),
    ("8B fleet: 1 x H100 + 1 x A100-80GB", ["--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1"], 12000),
    ("70B, 4 x H100 TP 4, EAGLE k = 3", ["--model", "llama3-70b", "--tp", "4", "--speculative-config",
                                         '{"method": "eagle", "num_speculative_tokens": 3}'], 8000),
    ("8B, H100, shared-prefix (8 x 1,024-token system prompts)", ["--workload", "shared-prefix"], 8000),
    ("8B, H100, shared-prefix, 50% memory", ["--workload", "shared-prefix", "--gpu-memory-utilization", "0.5"], 8000),
    ("8B, H100, shared-prefix, 25% memory", ["--workload", "shared-prefix", "--gpu-memory-utilization", "0.25"], 8000),
    ("8B, H100, shared-prefix, 23% memory (~9 sequences: some prefixes not in use)",
     ["--workload", "shared-prefix", "--gpu-memory-utilization", "0.23"], 8000),
    ("8B, H100, one 4,096-token shared prefix (benchmarks/long-system-prompt.yaml)", ["--workload", LONG_PROMPT], 8000),
    ("8B, H100, one 4,096-token shared prefix, 25% memory",
     ["--workload", LONG_PROMPT, "--gpu-memory-utilization", "0.25"], 8000),
    ("70B disaggregated, 1 x TP 4 prefill + 1 x TP 4 decode, azure-conv",
     ["--model", "llama3-70b", "--prefill-replicas", "1", "--prefill-tp", "4", "--decode-replicas", "1",
      "--decode-tp", "4", "--workload", "azure-conv"], 4000),
]


def summary(options: list[str], rate: float, requests: int) -> dict:
    cmd = [KVSIM, "run", *options, "--rate", f"{rate:.3f}",
           "--num-requests", str(requests), "--json", "--no-error-bars"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    print("| deployment | capacity (req/s) | offered | completed once warm | capacity / completed | verdict |")
    print("|---|---|---|---|---|---|")
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    for label, options, requests in (case for case in CASES if only in case[0]):
        guess = summary(options, 1.0, 300)["full_batch_capacity"]
        over = summary(options, 1.15 * guess, requests)
        capacity = over["full_batch_capacity"]  # of the overloaded run's own requests
        done = over["completed_rate_warm"]
        print(f"| {label} | {capacity:.2f} | {over['offered_rate']:.2f} | {done:.2f} | "
              f"{capacity / done:.3f} | {over['saturation']} |")


if __name__ == "__main__":
    main()
