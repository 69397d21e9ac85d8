"""The host model of profiles/host.py against Vidur rows it was not derived from.

profiles/host.py takes its terms from Vidur's Llama-2-7B medians (batch 8 and 64) only. The same
published file (microsoft/vidur `data/profiling/a100/cpu_overheads.csv` at commit 0633efa, MIT
licence) also holds Llama-2-70B at TP 2 (batch 8..32) and TP 4 (batch 8..64), copied below. Each
row's phases are composed as each engine version composes them (vllm-v0: the loop + output
processing + Ray calls; vllm-v1: the loop + the barrier's excess over TP 1, 0.075 ms) and compared
with the version's per-step + per-sequence terms.

    python benchmarks/host_heldout.py
"""

from __future__ import annotations

import statistics

from kvsim.profiles.host import engine_host

TP1_BARRIER_MS = 0.075  # the Llama-2-7B TP 1 barrier medians (0.071-0.083): nothing to wait for
LLAMA2_70B = [  # (tp, batch, (schedule, prepare_inputs_e2e, sampler_e2e, process_model_outputs, barrier, ray_comm))
    (4, 8, (0.181, 0.375, 1.179, 0.787, 0.612, 3.054)),
    (4, 16, (0.313, 0.479, 1.27, 1.357, 0.721, 3.761)),
    (4, 24, (0.452, 0.612, 1.343, 1.895, 0.954, 4.391)),
    (4, 32, (0.52, 0.707, 1.418, 2.309, 0.828, 5.403)),
    (4, 40, (0.718, 0.881, 1.725, 2.971, 1.262, 6.443)),
    (4, 48, (0.924, 1.061, 2.036, 3.6, 1.887, 7.859)),
    (4, 56, (1.1, 1.273, 1.948, 4.259, 1.511, 8.496)),
    (4, 64, (1.23, 1.317, 1.948, 4.716, 0.956, 8.488)),
    (2, 8, (0.179, 0.386, 1.065, 0.77, 0.161, 2.627)),
    (2, 16, (0.283, 0.458, 1.108, 1.215, 0.12, 3.006)),
    (2, 24, (0.385, 0.573, 1.161, 1.752, 0.136, 3.934)),
    (2, 32, (0.502, 0.67, 1.346, 2.25, 0.149, 3.827)),
]


def main() -> None:
    errors: dict[str, list[float]] = {"vllm-v0": [], "vllm-v1": []}
    print("tp  batch  vllm-v0 measured / model ms   vllm-v1 measured / model ms")
    for tp, batch, (sched, prep, sample, outputs, barrier, ray) in LLAMA2_70B:
        loop = sched + prep + sample
        measured = {"vllm-v0": loop + outputs + ray, "vllm-v1": loop + max(barrier - TP1_BARRIER_MS, 0.0)}
        cells = []
        for version, value in measured.items():
            per_step, per_seq = engine_host(version, tp)
            model = per_step + per_seq * batch
            errors[version].append(model / value - 1)
            cells.append(f"{value:6.2f} / {model:6.2f}")
        print(f"{tp:>2}  {batch:>5}  {cells[0]:>28}   {cells[1]:>28}")
    for version, errs in errors.items():
        print(f"{version}: median |error| {100 * statistics.median(map(abs, errs)):.1f}%, "
              f"worst {100 * max(map(abs, errs)):.1f}% over {len(errs)} held-out rows")


if __name__ == "__main__":
    main()
