"""Write splitwise-h100-llama2-70b.csv: measured prefill and decode times of Llama-2-70B on DGX-H100
at TP 2, 4 and 8, from SplitwiseSim's performance data.

Source (MIT licence, Copyright (c) 2024 Pratyush Patel; see ATTRIBUTION.md):
github.com/Mutinifni/splitwise-sim (the artifact of Patel et al., "Splitwise: Efficient Generative
LLM Inference Using Phase Splitting", ISCA 2024) at commit 8f99e7dc9b407f4ce2488d03dd44c0b8b946dab0,
`data/perf_model.csv` (git blob 79d4e6880fd81658731d4643df9d5c275a813a6a): "profiling data from the
DGX-A100 and DGX-H100 machines" (its README), one row per run of a batch of `batch_size` requests of
`prompt_size` prompt tokens generating `token_size` tokens, with `prompt_time` (ms: the batch's
prompt phase, to its first tokens), `token_time` (ms: mean time per generated token) and `e2e_time`.

Kept: `model` llama2-70b, `hardware` h100-80gb (not the power-capped h100-80gb-pcap), every TP.
Per (tp, batch_size, prompt_size, token_size): `prefill_ms` = the median `prompt_time` and
`decode_ms` = the median `token_time` over the configuration's distinct runs (5 each; one block of
rows appears three times in the file and is counted once). Left out, and why:

* prompt + output past Llama-2's 4,096-token context (prompt 4,096 / 8,192, output 4,096 / 8,192):
  kvsim prices Llama-2-70B at its own context and refuses such rows;
* configurations whose median `e2e_time` is not `prompt_time + (token_size - 1) x token_time`
  within 2%: the run did not generate `token_size` tokens at that pace (outputs of 1,024+ tokens end
  at about half the time that implies; TP 2 at batch 64 takes 84 s end to end against 5.7 s), so
  the row does not describe the batch kvsim would price.

    python profiles/examples/convert_splitwise.py PATH/data/perf_model.csv
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SHA256 = "dbbe505d1d64fc4bd1ec03c50edf944643586de4f68a81e94cbd55dd5bdfbf41"  # perf_model.csv at 8f99e7d
OUT = Path(__file__).with_name("splitwise-h100-llama2-70b.csv")
CONTEXT = 4096  # Llama-2's max_position_embeddings
CONSISTENCY = 0.02


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("perf_model", type=Path, help="SplitwiseSim's data/perf_model.csv")
    args = parser.parse_args()
    blob = args.perf_model.read_bytes()
    if hashlib.sha256(blob).hexdigest() != SHA256:
        sys.exit(f"{args.perf_model}: not the perf_model.csv of splitwise-sim commit 8f99e7d (sha256 differs)")
    runs: dict[tuple[int, int, int, int], dict[tuple[str, str, str], int]] = defaultdict(dict)
    for line, r in enumerate(csv.DictReader(blob.decode("utf-8").splitlines()), start=2):
        if r["model"] == "llama2-70b" and r["hardware"] == "h100-80gb":
            key = (int(r["tensor_parallel"]), int(r["batch_size"]), int(r["prompt_size"]), int(r["token_size"]))
            runs[key].setdefault((r["prompt_time"], r["token_time"], r["e2e_time"]), line)  # distinct runs
    rows, dropped = [], []
    for (tp, b, p, o), distinct in sorted(runs.items()):
        prefill = statistics.median(float(t[0]) for t in distinct)
        decode = statistics.median(float(t[1]) for t in distinct)
        e2e = statistics.median(float(t[2]) for t in distinct)
        if p + o > CONTEXT:
            dropped.append(f"tp {tp} B {b} {p}+{o}: past the context")
        elif abs(e2e / (prefill + (o - 1) * decode) - 1) > CONSISTENCY:
            dropped.append(f"tp {tp} B {b} {p}+{o}: e2e {e2e:.0f} ms vs {prefill + (o - 1) * decode:.0f} implied")
        else:
            rows.append([tp, b, p, o, f"{prefill:.2f}", f"{decode:.2f}", len(distinct),
                         " ".join(map(str, sorted(distinct.values())))])
    with OUT.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["tp", "batch_size", "input_len", "output_len", "prefill_ms", "decode_ms", "runs", "source_lines"])
        w.writerows(rows)
    print(f"wrote {OUT} ({len(rows)} rows); left out {len(dropped)}:")
    for d in dropped:
        print("  ", d)


if __name__ == "__main__":
    main()
