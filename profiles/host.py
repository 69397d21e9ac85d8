"""Default host/engine overhead per batching policy: the CPU time on each step's critical path.

Terms (ms) follow `simcore.latency.HostOverhead`: per step, per scheduled sequence, per step with a
prefill, per prefill token. Every default is derived from a public measurement; profiles/README.md
gives the derivation term by term. Main source: Vidur's published vLLM CPU-overhead profile
(microsoft/vidur `data/profiling/a100/cpu_overheads.csv`, MIT licence; vLLM V0 on A100 hosts, medians
per step by batch size 8..64 and TP 1/2/4), fitted as intercept + slope per sequence at batch 8 and 64.
"""

from __future__ import annotations

from kvsim.simcore.latency import HostOverhead

# Vidur cpu_overheads.csv medians (ms), Llama-2-7B, at batch 8 and 64: (TP 1, TP 4).
# schedule + prepare_inputs + sampler_e2e = 1.346 / 3.485 (TP 1), 1.723 / 4.481 (TP 4)
SCHED_PREP_SAMPLE_TP1 = (1.04, 0.038)  # (intercept, per sequence) from (1.346, 3.485) at batch 8, 64
SCHED_PREP_SAMPLE_TPN = (1.33, 0.049)  # the same at TP 2..4 (driver broadcasts to workers): (1.723, 4.481)
# process_model_outputs (detokenise, build outputs): 0.624 / 4.108 at batch 8 / 64, TP 1.
OUTPUT_PROCESSING = (0.126, 0.062)
# Eager PyTorch launches one kernel at a time from Python: ~12 kernels per decoder layer (2 norms,
# QKV, rotary, attention, out-proj, 2 adds, gate/up, act, down, KV write) at ~5 us each (PyTorch
# "Accelerating PyTorch with CUDA Graphs", 2021: launch overhead of a few microseconds per kernel).
EAGER_LAUNCH_MS_PER_LAYER = 12 * 0.005
# HF generate's per-step Python (prepare_inputs_for_generation, logits processors, stopping
# criteria, cache update): the V0 sampler intercept above is the nearest measured equivalent.
HF_GENERATE_STEP_MS = 0.82


def _engine_loop(tp: int) -> tuple[float, float]:
    return SCHED_PREP_SAMPLE_TP1 if tp <= 1 else SCHED_PREP_SAMPLE_TPN


def default_host_overhead(policy: str, num_layers: int, tp: int) -> HostOverhead:
    """The default host model for the engine `policy` models, at this layer count and TP."""
    base, per_seq = _engine_loop(tp)
    if policy == "continuous":
        # vLLM: scheduler, input preparation and sampling stay on the engine loop's critical path;
        # output processing/detokenisation overlaps the GPU (v0.6.0 async output processor; V1 moves
        # it to another process) and CUDA graphs remove per-kernel launches in decode.
        return HostOverhead(per_step_ms=base, per_seq_ms=per_seq)
    if policy == "dynamic":
        # early TGI: the same loop work, plus output building on the critical path and eager launches
        return HostOverhead(
            per_step_ms=base + OUTPUT_PROCESSING[0] + EAGER_LAUNCH_MS_PER_LAYER * num_layers,
            per_seq_ms=per_seq + OUTPUT_PROCESSING[1],
        )
    if policy == "static":
        # HF generate / FasterTransformer-style loop: one padded batch tensor, no scheduler
        return HostOverhead(per_step_ms=HF_GENERATE_STEP_MS + EAGER_LAUNCH_MS_PER_LAYER * num_layers)
    raise ValueError(f"unknown policy {policy!r}")


def host_overhead_block(num_layers: int, tp: int) -> tuple[dict, dict]:
    """(host_overhead, host_overhead_by_policy) for a profile document."""
    by_policy = {
        p: {k: round(v, 4) for k, v in default_host_overhead(p, num_layers, tp).to_dict().items()}
        for p in ("static", "dynamic", "continuous")
    }
    return dict(by_policy["continuous"]), by_policy
