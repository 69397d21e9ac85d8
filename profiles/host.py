"""Default host/engine overhead per batching policy and engine version: the CPU time on each step's
critical path, and how it grows with the tensor-parallel ranks the engine drives.

Terms (ms) follow `simcore.latency.HostOverhead`: per step, per scheduled sequence, per step with a
prefill, per prefill token. Every default is derived from one public measurement; profiles/README.md
gives the derivation term by term. Source: Vidur's published CPU-overhead profile of its vLLM-style
engine (microsoft/vidur `data/profiling/a100/cpu_overheads.csv` at commit 0633efa, MIT licence;
Sarathi with `scheduler_type="vllm"`, TP workers as Ray actors, A100 hosts; median ms per step of
each engine phase, decode batches 8..64, Llama-2-7B at TP 1/2/4). Each phase's (intercept, slope
per sequence) is the line through its batch-8 and batch-64 medians at that TP (intercept rounded to
0.01 ms, slope to 0.001 ms as before). No TP 8 row was published, so past TP 4 each phase follows
its mechanism. Ray's driver-to-worker calls are one remote call per worker, each carrying the
step's batch (V0's `_run_workers`): linear in the worker count `tp - 1` through the TP 2 and TP 4
lines. Every other phase is work the driver does once, or each rank does for itself in parallel
(a V1 worker prepares its own inputs: vllm-project/vllm PR #9856, "All processes run
prepare_inputs"), and keeps its TP 4 line, the largest TP measured. (Until issue 27's second round
every phase was extrapolated linearly; that put V1's rank wait at +0.062 ms per sequence at TP 8,
three times TP 4's, from two points, and made TP 8 H100 serving of a 70B model slower than TP 4.
How the slowest of 8 ranks' parallel work compares with the slowest of 4 is not in any data we
know of; the TP 4 line is a floor if it only grows, and profiles/uncertainty.py's error covers the
rest.)

Which phases sit on the step's critical path is what distinguishes the engine versions:

* `vllm-v0`  vLLM V0 up to 0.5 as Vidur models it (vidur/entities/execution_time.py
             `_get_cpu_overhead`: schedule + sampler + prepare inputs + output processing + Ray
             driver-to-worker calls): output processing is synchronous, TP workers are Ray actors
             called once per step each. V0's prefill-first scheduler, no chunked prefill.
* `vllm-0.6` vLLM 0.6 with multi-step scheduling (`--num-scheduler-steps 10`, the setting of the
             v0.6.0 benchmarks, blog.vllm.ai 2024-09-05) and the async output processor (PR #7049):
             schedule, prepare inputs, sampler bookkeeping and the workers' synchronisation happen
             once per 10 steps; output processing overlaps the GPU; single-node TP uses the
             multiprocessing executor with a shared-memory broadcast instead of Ray. (Its
             scheduling in 10-step decode rounds: simcore/policies/continuous_v0.py.)
* `vllm-v1`  vLLM V1 (the default): scheduler, input preparation and sampling still once per step,
             output processing in another process (overlapped), the scheduler output broadcast to
             the workers over shared memory, each worker preparing its own inputs; the first
             collective of the step then waits for the slowest rank, which Vidur's
             POST_PREPARE_INPUTS_BARRIER measures (its excess over TP 1, where there is no one to
             wait for). Its per-step term is Vidur's loop (an upper bound: V1's measured CPU phases
             come to ~0.25 ms a step, but the sampler's kernels and the CUDA graph's launch, most of
             sampler_e2e's 0.82 ms likely, were not measured). Its per-sequence term is V1's own:
             vLLM 0.11.0's scheduler loop and model-runner CPU phases timed per running decode
             (V1_SEQ_PHASES_MS, benchmarks/measure_v1_scheduler.py, profiles/README.md), 0.0146 ms
             against the V0-style loop's 0.038; at TP > 1 the barrier's excess over TP 1 is added to
             both terms. This is vLLM 0.7 to 0.13, where scheduling is synchronous unless
             `--async-scheduling` is given (an experimental flag since PR #19970).
* `vllm-v1-async` vLLM V1 as shipped since v0.14.0 (release notes: "Async scheduling is now
             enabled by default", vllm-project/vllm PR #27614; excluded for pipeline parallelism and
             non-EAGLE/MTP speculative decoding in that release). The scheduler runs one step ahead
             of the GPU (PR #19970, after NanoFlow) and the model runner prepares step n+1's inputs
             and samples without waiting for step n (PR #23569, "full overlap of the cpu operations
             (including prepare_inputs) and the model forward pass"); outputs are still processed in
             another process. Schedule, input preparation, sampling bookkeeping and the ranks'
             synchronisation therefore run while the GPU executes the previous step, and only the
             gap between two steps' kernels stays on the critical path: 150-170 us at batch 256 with
             CUDA graphs, the one published measurement of it (PR #11133, an async V1 prototype on
             Llama-2-7B, against 5-6 ms without it, issue #10634), priced as ASYNC_GAP_MS per step
             and nothing per sequence. The CPU work it hides is the `vllm-v1` terms at the same TP,
             carried as `hidden_per_step_ms` / `hidden_per_seq_ms` (simcore.latency.HostOverhead):
             a step costs max(GPU step, hidden CPU work) + the gap, so where the CPU's work is the
             longer (small models at large batches) it is on the critical path: vLLM's
             `EngineCore.step_with_batch_queue` (vllm/v1/engine/core.py at 00080ee) schedules and
             launches step n+1, then blocks on step n, two batches in flight
             (`VllmConfig.max_concurrent_batches`, vllm/config/vllm.py at 6cf7b26). The first step
             after the engine idled is scheduled, then launched, with nothing in flight to hide its
             CPU work behind: it pays it in full (simcore.engine.Engine.run's `cold`).
"""

from __future__ import annotations

from kvsim.simcore.batch_defaults import NUM_SCHEDULER_STEPS
from kvsim.simcore.latency import HostOverhead
from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION, ENGINE_VERSIONS

# Vidur cpu_overheads.csv, Llama-2-7B, median ms per step at batch 8 and batch 64, per TP degree.
VIDUR_BATCHES = (8, 64)
VIDUR_MEDIANS = {  # phase -> TP -> (batch 8, batch 64)
    "schedule": {1: (0.165, 0.952), 2: (0.179, 1.147), 4: (0.183, 1.225)},
    "prepare_inputs_e2e": {1: (0.293, 1.163), 2: (0.381, 1.232), 4: (0.375, 1.296)},
    "sampler_e2e": {1: (0.888, 1.370), 2: (1.156, 1.774), 4: (1.165, 1.960)},
    "process_model_outputs": {1: (0.624, 4.108), 2: (0.679, 4.495), 4: (0.791, 4.669)},
    "post_prepare_inputs_barrier": {1: (0.078, 0.073), 2: (0.141, 0.150), 4: (0.622, 1.791)},
    "ray_comm_time": {1: (0.156, 0.455), 2: (3.063, 6.490), 4: (3.125, 8.342)},
}
MAX_MEASURED_TP = 4  # the largest TP of Vidur's published CPU-overhead rows
PER_WORKER_PHASES = ("ray_comm_time",)  # one remote call per worker per step: grows with the workers
LOOP = ("schedule", "prepare_inputs_e2e", "sampler_e2e")  # the engine loop's own work
# vLLM V1's CPU work per running decode per step (ms, the per-sequence slope of each phase's line),
# measured with vLLM 0.11.0's own V1 code by benchmarks/measure_v1_scheduler.py (--model-runner) on
# 2026-12-02: a KVM guest with 2 vCPUs, "Intel(R) Xeon(R) Processor" family 6 model 167 (Sapphire
# Rapids or later), medians over 200 steps at decode batches 8..1024 (profiles/README.md has the
# table). The host was shared with other jobs, so the figures are more likely high than low.
V1_SEQ_PHASES_MS = {
    "schedule": 0.0055,  # Scheduler.schedule(), mostly KVCacheManager.allocate_slots
    "update_from_output": 0.0021,  # Scheduler.update_from_output(), synchronous in the engine core
    "output_encode": 0.00013,  # msgpack encode of EngineCoreOutputs (the output thread)
    "update_states": 0.0006,  # GPUModelRunner._update_states (persistent batch)
    "prepare_inputs": 0.0008,  # GPUModelRunner._prepare_inputs (run by the CPU runner)
    "bookkeeping_sync": 0.0055,  # GPUModelRunner._bookkeeping_sync, the sampler's CPU bookkeeping
}
V1_SEQ_MS = sum(V1_SEQ_PHASES_MS.values())  # 0.0146 ms per sequence, in place of the LOOP's slope
# vLLM 0.6.0 benchmarks ran multi-step scheduling with --num-scheduler-steps 10 (blog.vllm.ai 2024-09-05).
MULTI_STEP = NUM_SCHEDULER_STEPS["vllm-0.6"]
# vLLM >= 0.14 (async scheduling): the GPU idles between two steps' kernels for 150-170 us at batch
# 256 with CUDA graphs (vllm-project/vllm PR #11133, async V1 prototype, Llama-2-7B); the midpoint.
ASYNC_GAP_MS = 0.16
# Eager PyTorch launches one kernel at a time from Python: ~12 kernels per decoder layer (2 norms,
# QKV, rotary, attention, out-proj, 2 adds, gate/up, act, down, KV write) at ~5 us each (PyTorch
# "Accelerating PyTorch with CUDA Graphs", 2021: launch overhead of a few microseconds per kernel).
EAGER_LAUNCH_MS_PER_LAYER = 12 * 0.005
# HF generate's per-step Python (prepare_inputs_for_generation, logits processors, stopping
# criteria, cache update): the V0 sampler intercept above is the nearest measured equivalent.
HF_GENERATE_STEP_MS = 0.82


def _line(points: tuple[float, float]) -> tuple[float, float]:
    """(intercept, slope per sequence) through the batch-8 and batch-64 medians, unrounded."""
    (b0, b1), (y0, y1) = VIDUR_BATCHES, points
    slope = (y1 - y0) / (b1 - b0)
    return y0 - b0 * slope, slope


def phase_line(phase: str, tp: int) -> tuple[float, float]:
    """A phase's (intercept, slope) at this TP: measured at TP 1, 2, 4; between them, and past
    TP 4 for the per-worker calls (PER_WORKER_PHASES), linear in the worker count tp - 1 through
    TP 2 and TP 4; past TP 4 every other phase keeps its TP 4 line (see the module docstring)."""
    by_tp = VIDUR_MEDIANS[phase]
    if tp in by_tp:
        return _line(by_tp[tp])
    if tp > MAX_MEASURED_TP and phase not in PER_WORKER_PHASES:
        return _line(by_tp[MAX_MEASURED_TP])
    (a2, s2), (a4, s4) = _line(by_tp[2]), _line(by_tp[4])
    w = tp - 1  # workers besides the driver; TP 2 has 1, TP 4 has 3
    return a2 + (a4 - a2) * (w - 1) / 2, s2 + (s4 - s2) * (w - 1) / 2


def _sum(phases: tuple[str, ...], tp: int) -> tuple[float, float]:
    lines = [phase_line(p, tp) for p in phases]
    return sum(a for a, _ in lines), sum(s for _, s in lines)


def _excess_over_tp1(phase: str, tp: int) -> tuple[float, float]:
    """What a phase costs beyond its TP 1 value (the timer's own cost where nothing is waited for)."""
    if tp <= 1:
        return 0.0, 0.0
    (a, s), (a1, s1) = phase_line(phase, tp), phase_line(phase, 1)
    return max(a - a1, 0.0), max(s - s1, 0.0)


def _rounded(intercept: float, slope: float) -> tuple[float, float]:
    return round(intercept, 2), round(slope, 3)


def engine_host(engine_version: str, tp: int) -> tuple[float, float]:
    """(per_step_ms, per_seq_ms) of a continuous-batching vLLM step of this version at this TP."""
    loop_a, loop_s = _sum(LOOP, tp)
    if engine_version == "vllm-v1":  # Vidur's loop per step, V1's measured phases per sequence
        sync_a, sync_s = _excess_over_tp1("post_prepare_inputs_barrier", tp)
        return _rounded(loop_a + sync_a, V1_SEQ_MS + sync_s)
    if engine_version == "vllm-v0":
        out_a, out_s = phase_line("process_model_outputs", tp)
        ray_a, ray_s = phase_line("ray_comm_time", tp) if tp > 1 else (0.0, 0.0)  # no Ray workers at TP 1
        return _rounded(loop_a + out_a + ray_a, loop_s + out_s + ray_s)
    if engine_version == "vllm-0.6":
        sync_a, sync_s = _excess_over_tp1("post_prepare_inputs_barrier", tp)
        return _rounded((loop_a + sync_a) / MULTI_STEP, (loop_s + sync_s) / MULTI_STEP)
    if engine_version == "vllm-v1-async":
        return ASYNC_GAP_MS, 0.0  # the vllm-v1 phases overlap the previous step's GPU work
    raise ValueError(f"unknown engine version {engine_version!r}; known: {', '.join(ENGINE_VERSIONS)}")


def engine_hidden(engine_version: str, tp: int) -> tuple[float, float]:
    """(hidden_per_step_ms, hidden_per_seq_ms): the CPU work a version runs while the GPU executes
    the previous step. `vllm-v1-async` hides what `vllm-v1` runs on the critical path (the same
    engine loop and rank wait, PRs #19970 / #23569); the other versions hide nothing."""
    if engine_version == "vllm-v1-async":
        return engine_host("vllm-v1", tp)
    return 0.0, 0.0


def _engine_loop(tp: int) -> tuple[float, float]:
    """The early-TGI (`dynamic`) loop keeps the TP 1 line at TP 1 and the TP 4 one elsewhere, as
    before engine versions existed (TGI's own multi-rank costs are not measured anywhere we know)."""
    return _rounded(*_sum(LOOP, 1 if tp <= 1 else 4))


def default_host_overhead(policy: str, num_layers: int, tp: int,
                          engine_version: str = DEFAULT_ENGINE_VERSION) -> HostOverhead:
    """The default host model for the engine `policy` models, at this layer count and TP;
    `engine_version` selects the vLLM version a `continuous` step is priced as."""
    if policy == "continuous":
        per_step, per_seq = engine_host(engine_version, tp)
        hidden_step, hidden_seq = engine_hidden(engine_version, tp)
        return HostOverhead(per_step_ms=per_step, per_seq_ms=per_seq, hidden_per_step_ms=hidden_step,
                            hidden_per_seq_ms=hidden_seq)
    base, per_seq = _engine_loop(tp)
    out_a, out_s = phase_line("process_model_outputs", 1)
    out = round(out_a, 3), round(out_s, 3)  # 0.126 + 0.062 per sequence, as before engine versions
    if policy == "dynamic":
        # early TGI: the same loop work, plus output building on the critical path and eager launches
        return HostOverhead(
            per_step_ms=base + out[0] + EAGER_LAUNCH_MS_PER_LAYER * num_layers,
            per_seq_ms=per_seq + out[1],
        )
    if policy == "static":
        # HF generate / FasterTransformer-style loop: one padded batch tensor, no scheduler
        return HostOverhead(per_step_ms=HF_GENERATE_STEP_MS + EAGER_LAUNCH_MS_PER_LAYER * num_layers)
    raise ValueError(f"unknown policy {policy!r}")


def _terms(h: HostOverhead) -> dict[str, float]:
    return {k: round(v, 4) for k, v in h.to_dict().items()}


def host_overhead_block(num_layers: int, tp: int) -> tuple[dict, dict, dict]:
    """(host_overhead, host_overhead_by_policy, host_overhead_by_engine) for a profile document;
    `continuous` and `host_overhead` are the default engine version's."""
    by_policy = {p: _terms(default_host_overhead(p, num_layers, tp)) for p in ("static", "dynamic", "continuous")}
    by_engine = {v: _terms(default_host_overhead("continuous", num_layers, tp, v)) for v in ENGINE_VERSIONS}
    return dict(by_policy["continuous"]), by_policy, by_engine
