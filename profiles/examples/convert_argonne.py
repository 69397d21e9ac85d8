"""Write the argonne-h100-*.csv examples: real vLLM batch runs on H100 from LLM-Inference-Bench.

Source (BSD 3-Clause, Copyright (c) 2024, UChicago Argonne, LLC; see ATTRIBUTION.md):
github.com/argonne-lcf/LLM-Inference-Bench at commit ae7e7a41173badc99f7b59da1657a0172813e5e5,
`Plots/All_results.csv` (git blob 033e1125cf9545cd982cb8168e5ea5f0b586fb85) and
`Plots/Fig_21/all_results_TTFT.csv` (blob af8f8bff56b11f841749a501ade7f63f65077698).

Each `vLLM`, `Nvidia H100 GPU` row of All_results.csv is one run of the repository's copy of vLLM's
`benchmarks/benchmark_latency.py` (vLLM/H100/benchmark_throughput.py, driven by
vLLM/H100/run-throughput-bench.sh): `--input-len L --output-len L --batch-size B
--tensor-parallel-size N --dtype float16`, `ignore_eos`, its `Latency` the mean wall time (s) of
`llm.generate` over 30 iterations after 10 warm-up ones. So `latency_ms = 1000 * Latency`,
`input_len = output_len = L`, `tp = Num of Hardware`. The one H100 vLLM Llama-3-8B row of
all_results_TTFT.csv (`Output Length` 1, batch 16, 1,024 prompt tokens) is the batch's time to its
first tokens: `prefill_ms = 1000 * Latency`. Nothing else is derived; values are rounded to
0.01 ms.

    python profiles/examples/convert_argonne.py PATH/All_results.csv PATH/all_results_TTFT.csv
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
from pathlib import Path

SHA256 = {  # of the two source files at the commit above, so the conversion is of exactly that data
    "All_results.csv": "631a12e08c786ce2d4bdfdc0f67b93234360682cb4b36c93806270ddcfd58412",
    "all_results_TTFT.csv": "33046baa43ca27f8e5cff5dcf56d3167ceba7c74aac4171ceefd2a3ce0280341",
}
HERE = Path(__file__).parent
SETS = {  # output file -> source model name
    "argonne-h100-llama2-70b.csv": "meta-llama/Llama-2-70b-hf",
    "argonne-h100-llama3-8b.csv": "meta-llama/Meta-Llama-3-8B",
}
HEADER = ["tp", "batch_size", "input_len", "output_len", "prefill_ms", "latency_ms", "source_file", "source_line"]


def _read(path: Path, name: str) -> list[tuple[int, dict[str, str]]]:
    blob = path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != SHA256[name]:
        sys.exit(f"{path}: not the {name} of LLM-Inference-Bench commit ae7e7a4 (sha256 differs)")
    lines = blob.decode("utf-8").splitlines()
    out = []
    for n, row in enumerate(csv.DictReader(lines), start=2):
        if row.get("Framework") == "vLLM" and row.get("Hardware") == "Nvidia H100 GPU":
            out.append((n, {k.strip(): v.strip() for k, v in row.items() if k}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("all_results", type=Path, help="Plots/All_results.csv")
    parser.add_argument("ttft", type=Path, help="Plots/Fig_21/all_results_TTFT.csv")
    args = parser.parse_args()
    runs = _read(args.all_results, "All_results.csv")
    ttft = _read(args.ttft, "all_results_TTFT.csv")
    for out_name, model in SETS.items():
        rows = []
        for n, r in runs:
            if r["Model"] == model:
                length = int(r["Input Output Length"])
                rows.append([int(r["Num of Hardware"]), int(r["Batch Size"]), length, length, "",
                             f"{1e3 * float(r['Latency']):.2f}", "Plots/All_results.csv", n])
        for n, r in ttft:
            if r["Model"] == model:
                rows.append([int(r["Num of Hardware"]), int(r["Batch Size"]), int(r["Input Length"]),
                             int(r["Output Length"]), f"{1e3 * float(r['Latency']):.2f}", "",
                             "Plots/Fig_21/all_results_TTFT.csv", n])
        rows.sort(key=lambda row: (row[0], row[3] == 1, row[2], row[1]))
        with (HERE / out_name).open("w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(HEADER)
            w.writerows(rows)
        print(f"wrote {HERE / out_name} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
