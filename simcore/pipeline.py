"""Pipeline-parallel step timing: stages busy on different micro-batches, as vLLM runs them.

With `pp` stages vLLM keeps up to `pp` scheduled batches in flight (its batch queue): stage s
works on one batch while stage s+1 works on the previous one. kvsim prices an engine step of
B sequences as one *round* of m = min(pp, B) equal micro-batches (B/m sequences, T/m tokens):

    t_s      = layers_s * (linear + attention + all-reduce)(micro-batch)      stage s's kernels
               + host (stage 0: the driver schedules and launches each micro-batch)
               + LM head and sampling (last stage)
    latency  = sum_s t_s + sum_s hand-off_s        one micro-batch through every stage
    round    = max(m * max_s t_s, latency)          the busiest stage runs all m micro-batches,
                                                    and no micro-batch starts its next token
                                                    before its previous one came back

so each sequence gets one token per round (ITL ~ round), and the engine finishes m micro-batches
per round (throughput ~ B / round). With one sequence (m = 1) a step is the full latency: a
pipeline adds latency and helps only with enough sequences to fill it. Sequences are split evenly
(vLLM's batches form as requests become free): the i-th scheduled entry of the step goes to
micro-batch i mod m, so decodes split by count and prompt chunks stay whole, dealt round-robin;
all are priced on the fullest micro-batch.

When each micro-batch leaves the last stage (`emit_offsets_ms`): the busiest stage paces the
stream, so consecutive micro-batches leave it max_s t_s apart, the last at the round's end:

    emit_j = round - (m - 1 - j) * max_s t_s        j = 0 .. m-1  (all > 0, since round >= m max_s t_s)

The engine stamps each scheduled entry's token (first token, ITL, and the finish of a request
that is done) at its micro-batch's exit time (`emit_times_s` -> `Lifecycle.emit`); the step's
KV, its record and the next step still wait for the round's end.

Hand-offs inside a node and across nodes are priced from the profile's `send_recv` and
`send_recv_inter_node` tables when it has them (TP > 1 profiles: `profiles/collectives.py`), else
from the same fits below (TP 1 profiles carry no collectives).

A hand-off sends the micro-batch's hidden states and residual (2 x tokens x hidden x 2 bytes,
vLLM's IntermediateTensors) to the next stage, priced by a fit of Vidur's measured H100 DGX
NCCL send/recv (`shared/data/measured/vidur_h100_dgx_send_recv.csv`, least squares on relative
error over per-size medians): inside a node (devices_per_node 2) 7.6 us + bytes / 357.5 GB/s,
median error 1.7%; across nodes (devices_per_node 1, one NIC per GPU) 19.1 us + bytes / 35.9 GB/s,
median error 2.6%. Other GPUs scale the bandwidth by their NVLink or NIC datasheet figure.
"""

from __future__ import annotations

import math

from kvsim.simcore.latency import StepLatencyModel
from kvsim.simcore.parallel import layer_partition, stage_crosses_node
from kvsim.simcore.specs import GPUSpec

# (latency ms, GB/s) of one send/recv, fitted on Vidur's H100 DGX measurements (module docstring)
INTRA_NODE_SEND_RECV = (0.00759, 357.5)  # NVLink4 / NVSwitch, H100 SXM (450 GB/s datasheet)
INTER_NODE_SEND_RECV = (0.01911, 35.9)  # one 400 Gb/s ConnectX-7 NIC per GPU (50 GB/s datasheet)
H100_NVLINK_GBPS, H100_NIC_GBPS = 450.0, 50.0
HANDOFF_TENSORS = 2  # hidden states + residual


def send_recv_ms(gpu: GPUSpec, nbytes: float, across_nodes: bool) -> float:
    """One stage hand-off of `nbytes`, inside a node (NVLink) or across nodes (the NIC)."""
    if across_nodes:
        latency, bw = INTER_NODE_SEND_RECV
        bw *= gpu.internode_gbps / H100_NIC_GBPS
    else:
        latency, bw = INTRA_NODE_SEND_RECV
        bw *= gpu.interconnect_gbps / H100_NVLINK_GBPS
    return latency + nbytes / (bw * 1e6)


def pipeline_round_ms(stage_ms: list[float], handoff_ms: list[float], num_microbatches: int) -> float:
    """A round of `num_microbatches` equal micro-batches through the stages (module docstring)."""
    latency = sum(stage_ms) + sum(handoff_ms)
    return max(num_microbatches * max(stage_ms), latency)


def emit_offsets_ms(stage_ms: list[float], handoff_ms: list[float], num_microbatches: int) -> list[float]:
    """When micro-batch j of a round leaves the last stage, from the round's start (docstring)."""
    round_ms = pipeline_round_ms(stage_ms, handoff_ms, num_microbatches)
    pace = max(stage_ms)
    return [round_ms - (num_microbatches - 1 - j) * pace for j in range(num_microbatches)]


class PipelineLatency:
    """A StepLatencyModel for a replica of `pp` stages: the wrapped model prices one
    micro-batch's kernels, collectives and host time; this splits them over the stages."""

    def __init__(self, base: StepLatencyModel, gpu: GPUSpec, tp: int, pp: int, hidden_size: int,
                 dtype_bytes: int = 2):
        self.base = base
        self.pp = pp
        self.layers = layer_partition(base.num_layers, pp)
        self.crosses = [stage_crosses_node(s, tp, gpu.gpus_per_node) for s in range(pp - 1)]
        self.gpu = gpu
        self.token_bytes = HANDOFF_TENSORS * hidden_size * dtype_bytes
        self._last = (0.0, 0.0, 0.0)
        self._last_offsets_ms: list[float] = [0.0]

    def fresh(self) -> PipelineLatency:
        """The same stages over the same base model, for another replica: the breakdown and
        emission times of the step just priced are per replica (several replicas sharing one
        would read each other's steps)."""
        import copy

        other = copy.copy(self)
        other._last, other._last_offsets_ms = (0.0, 0.0, 0.0), [0.0]
        return other

    # the engine and the simulation read these from any latency model
    @property
    def extrapolated(self):
        return self.base.extrapolated

    @property
    def decode_block_size(self) -> int:
        return self.base.decode_block_size

    @property
    def num_layers(self) -> int:
        return self.base.num_layers

    def set_block_size(self, block_size: int) -> bool:
        return self.base.set_block_size(block_size)

    def stage_times_ms(self, num_tokens: float, prefill_chunks: list[tuple[int, int]],
                       num_decode_seqs: float, decode_context_tokens: float, num_sampled: float,
                       num_microbatches: int) -> tuple[list[float], list[float], tuple[float, float, float]]:
        """(stage times, hand-offs, (kernels, collectives, host) of the whole round) in ms."""
        m = num_microbatches
        chunks = prefill_chunks[::m]  # whole chunks, dealt round-robin; the first gets the most
        decodes = math.ceil(num_decode_seqs / m)
        tokens = max(1, sum(c for c, _ in chunks) + decodes)
        ctx = decode_context_tokens / m
        sampled = math.ceil(num_sampled / m) if num_sampled else 0
        g, a, c, h = self.base.step_parts_ms(tokens, chunks, decodes, ctx, sampled)
        head = self.base.lm_head(sampled)
        per_layer = (g - head + a + c) / self.base.num_layers
        stages = [n * per_layer for n in self.layers]
        stages[0] += h
        stages[-1] += head
        handoffs = [self.handoff_ms(tokens * self.token_bytes, x) for x in self.crosses]
        return stages, handoffs, (m * (g + a), m * c + sum(handoffs) * m, m * h)

    def handoff_ms(self, nbytes: float, across_nodes: bool) -> float:
        """One hand-off: the profile's measured table for this link if it has one, else the fit."""
        ms = self.base.send_recv_ms(nbytes, across_nodes)
        return send_recv_ms(self.gpu, nbytes, across_nodes) if ms is None else ms

    def step_time_s(self, num_tokens: int, prefill_chunks: list[tuple[int, int]],
                    num_decode_seqs: int, decode_context_tokens: int, num_sampled: int) -> float:
        num_seqs = max(1, len(prefill_chunks) + num_decode_seqs)
        m = min(self.pp, num_seqs)
        stages, handoffs, parts = self.stage_times_ms(
            num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens, num_sampled, m)
        round_ms = pipeline_round_ms(stages, handoffs, m)
        self._last_offsets_ms = emit_offsets_ms(stages, handoffs, m)
        kernels, coll, host = parts
        # the round's time, split in proportion to the work it holds (for steps.csv)
        total = kernels + coll + host
        self._last = tuple(x * round_ms / total for x in parts) if total > 0 else (round_ms, 0.0, 0.0)
        return round_ms / 1000.0

    def step_breakdown_ms(self, *args) -> tuple[float, float, float]:
        """(kernels, collectives + hand-offs, host) of the step just priced, scaled to its round."""
        return self._last

    def emit_times_s(self, start_s: float, num_entries: int) -> list[float]:
        """For the step just priced (starting at `start_s`): when each of its `num_entries`
        scheduled entries leaves the last stage (entry i rides micro-batch i mod m)."""
        offsets = self._last_offsets_ms
        m = len(offsets)
        return [start_s + offsets[i % m] / 1000.0 for i in range(num_entries)]


__all__ = ["PipelineLatency", "emit_offsets_ms", "pipeline_round_ms", "send_recv_ms"]
