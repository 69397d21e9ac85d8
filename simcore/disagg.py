"""Disaggregated prefill and decode: a prefill pool feeding a decode pool over a priced KV link,
behind the proxy vLLM's disaggregated-serving examples run (DESIGN.md: deployments grow by
composition; each pool is replicas of the ordinary engine with its own profile, memory plan and
options).

A request's path, as vLLM's P/D proxy (the NixlConnector "toy proxy",
tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, which examples/online_serving/
disaggregated_serving points to) and NixlConnector (vllm/distributed/kv_transfer/kv_connector/v1/
nixl_connector.py) run it:

  1. The proxy picks a prefill instance (--router: round-robin, least-loaded, or prefix-aware:
     the one holding most of the request's shared prefix, with free KV and a short queue, scored
     as simcore.router scores replicas for llm-d's precise prefix-cache-aware routing) and sends
     it the prompt with max_tokens 1 (kv_producer). The prefill instance queues, prefills
     (chunked under its own token budget) and samples one token, which the proxy drops.
  2. NixlConnector.request_finished returns delay_free_blocks: the prefill instance keeps the
     request's KV blocks after it finishes, until the consumer has read them.
  3. The proxy sends the request to a decode instance picked by the decode router (least-loaded:
     the instance with the fewest requests waiting, loading or running; the toy proxy cycles
     round-robin, which equals it for one decode instance). Its scheduler gives the
     request blocks for the whole prompt when it reaches the head of the queue and they fit, and
     the decode workers pull (NIXL READ) the KV from the prefill instance: the transfer starts
     then, at a step boundary of the decode instance (simcore.policies.continuous).
     No room on the decode instance: the request waits in the decode queue in arrival order (the
     queue stops at it, as vLLM's admission loop breaks on a failed allocation), and its KV waits
     in the prefill instance's memory, where it keeps blocks from new prefills. (vLLM frees them
     after VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s, if nobody reads them; a simulated run that
     long is already overloaded, so kvsim never drops them.) Nothing is recomputed on the decode side.
  4. The transfer ends: the prefill instance frees the blocks, and at its next step the decode
     instance admits the request with every prompt token but the last computed, computes that one
     (vLLM's scheduler recomputes the last prompt token to sample) and streams the first token.
     So the TTFT the client sees at the proxy = prefill queueing + prefill + waiting for decode
     blocks + transfer + the first decode step; later tokens come from decode steps only, which no
     prefill interrupts (the ITL gain).

The KV link (KvLink): bytes = prompt tokens x the KV of one token as the decode instance lays it
out (K and V, every layer, its TP ranks' heads, KV dtype; with TP above the KV-head count heads
are replicated and each rank reads its own copy). Time = a fixed latency + bytes at the link's
bandwidth, the link being the decode instance's ingress, shared equally by the transfers into it
at the same time (processor sharing: two equal transfers that start together take twice as long).
Bandwidth and latency: the least-squares fits of Vidur's measured H100 DGX NCCL send/recv
(shared/data/measured/vidur_h100_dgx_send_recv.csv; simcore.pipeline): inside a node 7.6 us +
bytes / 357.5 GB/s per GPU pair (NVLink/NVSwitch, what UCX's cuda_ipc transport moves NIXL's
READs over), across nodes 19.1 us + bytes / 35.9 GB/s per GPU (one 400 Gb/s ConnectX-7 NIC each,
GPUDirect RDMA: UCX's rc/ib transport), scaled to other GPUs by their datasheet NVLink / NIC
figures, times min(prefill TP, decode TP) GPUs moving their slices in parallel. NCCL's
send/recv and NIXL's RDMA READ move bytes over the same links; NIXL's per-request control path
(descriptor lists, the completion notification) is not in the fit, so short transfers are
priced optimistically. NixlConnector does not overlap the transfer with the prefill (it is not
layer-wise: `wait_for_layer_load` / `save_kv_layer` do nothing), and neither does kvsim.

Simplifications: the proxy's HTTP hops cost nothing; prefix caching applies to the prefill pool
only (a decode instance loads the whole prompt); one sequence per request (n = 1, no beam search);
both pools run vLLM V1's scheduler (continuous batching, paged KV, chunked prefill on) with the
same block size and KV dtype (NixlConnector's compatibility hash includes the cache dtype).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.simcore.errors import ConfigError, StalledError
from kvsim.simcore.metrics import StepTotals, judge_capacity, summarize_records
from kvsim.simcore.pipeline import H100_NIC_GBPS, H100_NVLINK_GBPS, INTER_NODE_SEND_RECV, INTRA_NODE_SEND_RECV
from kvsim.simcore.records import Samples
from kvsim.simcore.request import Request
from kvsim.simcore.simulate import Result, Simulation, prepare
from kvsim.simcore.specs import GPUSpec, ModelSpec
from kvsim.simcore.state import ReqState

if TYPE_CHECKING:
    import simpy

    from kvsim.simcore.engine import Engine

CONNECTOR = "NixlConnector"  # the KV connector modelled (module docstring)
STALLED = ("simulation stalled: requests are left that no instance can run (a decode instance's cache held by "
           "the KV of requests it loaded, queued behind one that no longer fits); give the decode pool more KV "
           "cache or fewer prefill instances per decode instance")
PLACEMENTS = ("same-node", "cross-node")


def default_placement(gpu: GPUSpec, num_prefill_gpus: int, num_decode_gpus: int) -> str:
    """Both pools in one NVLink domain when their GPUs fit in one node, else across nodes."""
    return "same-node" if num_prefill_gpus + num_decode_gpus <= gpu.gpus_per_node else "cross-node"


@dataclass(frozen=True)
class LinkSpec:
    """What one KV transfer costs alone: `latency_s + bytes / bytes_per_s`."""

    placement: str
    latency_s: float
    bytes_per_s: float  # every parallel stream of one transfer together
    streams: int  # GPU pairs moving slices at once: min(prefill TP, decode TP)
    per_gpu_gbps: float  # one stream's fitted bandwidth, GB/s

    def to_dict(self) -> dict[str, Any]:
        return {"connector": CONNECTOR, "placement": self.placement, "latency_us": self.latency_s * 1e6,
                "bandwidth_gbps": self.bytes_per_s / 1e9, "streams": self.streams,
                "per_gpu_gbps": self.per_gpu_gbps,
                "source": "fit of Vidur's measured H100 DGX NCCL send/recv (simcore.pipeline), "
                          "scaled by the GPU's datasheet NVLink / NIC bandwidth"}


def link_spec(gpu: GPUSpec, placement: str, prefill_tp: int, decode_tp: int) -> LinkSpec:
    """The link a transfer from a prefill instance to a decode instance crosses (module docstring)."""
    if placement not in PLACEMENTS:
        raise ConfigError(f"--disagg-placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if placement == "cross-node":
        latency_ms, gbps = INTER_NODE_SEND_RECV
        gbps *= gpu.internode_gbps / H100_NIC_GBPS
    else:
        latency_ms, gbps = INTRA_NODE_SEND_RECV
        gbps *= gpu.interconnect_gbps / H100_NVLINK_GBPS
    streams = min(prefill_tp, decode_tp)
    return LinkSpec(placement, latency_ms / 1e3, streams * gbps * 1e9, streams, gbps)


def kv_transfer_bytes_per_token(model: ModelSpec, decode_tp: int) -> int:
    """KV bytes one prompt token moves: what the decode instance's TP ranks hold of it, together
    (every KV head once when TP <= KV heads; replicated heads are read once per rank)."""
    return decode_tp * model.kv_bytes_per_token(decode_tp)


class KvLink:
    """One link shared by the transfers crossing it at once, equally (processor sharing): each
    transfer waits the link's latency, then its bytes flow at bandwidth / (transfers flowing)."""

    def __init__(self, env: simpy.Environment, spec: LinkSpec):
        self.env = env
        self.latency_s = spec.latency_s
        self.rate = spec.bytes_per_s
        self._flowing: dict[int, list] = {}  # key -> [bytes left, on_done]
        self._last = 0.0  # when the bytes left were last brought up to date
        self._generation = 0  # a rescheduled completion makes the older timeout stale
        self.max_flowing = 0

    @property
    def num_flowing(self) -> int:
        return len(self._flowing)

    def start(self, key: int, nbytes: float, on_done: Callable[[], None]) -> None:
        """Move `nbytes`; `on_done()` runs when the last byte has arrived."""
        timeout = self.env.timeout(self.latency_s)
        timeout.callbacks.append(lambda _event: self._join(key, float(nbytes), on_done))

    def _advance(self) -> None:
        now = self.env.now
        flowing = self._flowing
        if flowing and now > self._last:
            share = (now - self._last) * self.rate / len(flowing)
            for entry in flowing.values():
                entry[0] -= share
        self._last = now

    def _join(self, key: int, nbytes: float, on_done: Callable[[], None]) -> None:
        self._advance()
        self._flowing[key] = [nbytes, on_done]
        self.max_flowing = max(self.max_flowing, len(self._flowing))
        self._reschedule()

    def _reschedule(self) -> None:
        self._generation += 1
        if not self._flowing:
            return
        left = min(entry[0] for entry in self._flowing.values())
        generation = self._generation
        timeout = self.env.timeout(max(0.0, left) * len(self._flowing) / self.rate)
        timeout.callbacks.append(lambda _event: self._fire(generation))

    def _fire(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        flowing = self._flowing
        first = min(flowing, key=lambda k: flowing[k][0])
        # the transfer that ran out, and any other within rounding of it (a byte)
        done = [k for k, entry in flowing.items() if k == first or entry[0] <= 1.0]
        callbacks = [flowing.pop(k)[1] for k in done]
        self._reschedule()
        for on_done in callbacks:
            on_done()


@dataclass
class TransferLog:
    """One row per request handed from the prefill pool to the decode pool."""

    request_id: list[int] = field(default_factory=list)
    prefill_instance: list[int] = field(default_factory=list)
    decode_instance: list[int] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    nbytes: list[float] = field(default_factory=list)
    prefilled_s: list[float] = field(default_factory=list)  # prefill finished, request sent to decode
    start_s: list[float] = field(default_factory=list)  # decode blocks allocated, READ started
    end_s: list[float] = field(default_factory=list)  # last byte in; prefill blocks freed

    def columns(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(getattr(self, name)) for name in self.__dataclass_fields__}


def _pick(engines: list[Engine], policy: str, cursor: list[int]) -> int:
    if policy == "round-robin":
        index = cursor[0]
        cursor[0] = (index + 1) % len(engines)
        return index
    return min(range(len(engines)), key=lambda i: engines[i].load)


def _pick_by_prefix(engines: list[Engine], request: Request) -> int:
    """--router prefix-aware for the prefill pool: llm-d's precise prefix-cache-aware scoring as
    simcore.router scores replicas (share of the prompt's full blocks the instance holds cached,
    its free KV, its queue, weighted 2 : 1 : 1; the highest score, ties: the lowest index), on
    the blocks of the request's declared shared prefix; requests without one go least-loaded."""
    from kvsim.simcore.router import KV_WEIGHT, PREFIX_WEIGHT, QUEUE_WEIGHT

    queues = [len(e.lifecycle.waiting) for e in engines]
    low, high = min(queues), max(queues)
    best, best_score = 0, -1.0
    for index, (engine, queue) in enumerate(zip(engines, queues, strict=True)):
        policy = engine.policy
        alloc = policy.allocator
        kv_free = alloc.num_free_blocks / alloc.num_gpu_blocks
        num_blocks = request.num_prompt_tokens // alloc.block_size
        prefix = 0.0
        if num_blocks and policy.enable_prefix_caching:
            hashes = [(request.prefix_id, i) for i in range(request.num_prefix_tokens // alloc.block_size)]
            prefix = alloc.num_cached_prefix_blocks(hashes) / num_blocks
        queue_score = (high - queue) / (high - low) if high > low else 1.0
        score = PREFIX_WEIGHT * prefix + KV_WEIGHT * kv_free + QUEUE_WEIGHT * queue_score
        if score > best_score:
            best, best_score = index, score
    return best


class DisaggProxy:
    """The front end clients talk to (the workload's sink): routes each request through a prefill
    instance, a KV transfer and a decode instance (module docstring). The client's records (the
    arrival, every token, the finish, a rejection) are the decode pool's."""

    def __init__(self, prefill: list[Engine], decode: list[Engine], prefill_router: str, decode_router: str,
                 link: LinkSpec, bytes_per_token: int):
        self.prefill, self.decode = prefill, decode
        self.prefill_router, self.decode_router = prefill_router, decode_router
        self._cursors = ([0], [0])
        self.link = link
        self.bytes_per_token = bytes_per_token
        self.links: list[KvLink] = []  # one per decode instance (its ingress), made when wired
        self.log = TransferLog()
        self._pending: dict[int, tuple[int, int, int]] = {}  # request id -> (log row, prefill i, decode i)
        self.env: simpy.Environment | None = None

    def wire(self, env: simpy.Environment) -> None:
        self.env = env
        self.links = [KvLink(env, self.link) for _ in self.decode]
        for index, engine in enumerate(self.decode):
            engine.lifecycle.count_arrivals = False  # the proxy counts a client's arrival once
            engine.policy.remote_loader = lambda st, index=index: self._start_transfer(st, index)

    @property
    def in_flight(self) -> int:
        """Requests prefilled and not yet admitted by a decode instance."""
        return len(self._pending)

    # -- RequestSink ---------------------------------------------------------------------
    def submit(self, request: Request) -> simpy.Event:
        done = self.env.event()
        self._accept(request, done)
        return done

    def send(self, request: Request) -> None:
        self._accept(request, None)

    def _accept(self, request: Request, done: simpy.Event | None) -> None:
        now = request.arrival_s = self.env.now
        decode0 = self.decode[0]
        decode0.lifecycle.records.arrive(now)
        prefill_request = Request(request.request_id, now, request.num_prompt_tokens, 1, max_tokens=1,
                                  prefix_id=request.prefix_id, num_prefix_tokens=request.num_prefix_tokens,
                                  hold_kv=True)
        if self.prefill_router == "prefix-aware":
            p = _pick_by_prefix(self.prefill, request) if request.prefix_id is not None else _pick(
                self.prefill, "least-loaded", self._cursors[0])
        else:
            p = _pick(self.prefill, self.prefill_router, self._cursors[0])
        prefill = self.prefill[p]
        reason = self._reject_reason(request, prefill_request, prefill)
        if reason:
            life = decode0.lifecycle
            life.reject(life.arrive(request, now, done), reason)
            return
        prefill.submit(prefill_request).callbacks.append(lambda _event: self._prefilled(request, p, done))

    def _reject_reason(self, request: Request, prefill_request: Request, prefill: Engine) -> str:
        if request.n > 1 or request.beam_width > 1:
            return "disaggregated serving runs one sequence per request (n > 1 or beam search)"
        decode = self.decode[0]
        reason = decode.reject_reason(ReqState(request, None, decode.max_model_len))
        if reason:
            return reason
        reason = prefill.reject_reason(ReqState(prefill_request, None, prefill.max_model_len))
        return f"prefill instance: {reason}" if reason else ""

    def _prefilled(self, request: Request, p: int, done: simpy.Event | None) -> None:
        """The prefill instance finished the request (its KV stays there): hand it to a decode
        instance, whose scheduler starts the transfer when it has blocks for it."""
        d = _pick(self.decode, self.decode_router, self._cursors[1])
        log = self.log
        self._pending[request.request_id] = (len(log.request_id), p, d)
        log.request_id.append(request.request_id)
        log.prefill_instance.append(p)
        log.decode_instance.append(d)
        log.num_tokens.append(request.num_prompt_tokens)
        log.nbytes.append(float(request.num_prompt_tokens * self.bytes_per_token))
        log.prefilled_s.append(self.env.now)
        log.start_s.append(math.nan)
        log.end_s.append(math.nan)
        request.remote_prefill_tokens = request.num_prompt_tokens
        decode = self.decode[d]
        if done is None:
            decode.send(request, request.arrival_s)
        else:
            decode.submit(request, request.arrival_s).callbacks.append(lambda _event: done.succeed())

    def _start_transfer(self, st: ReqState, d: int) -> None:
        """Decode instance `d` allocated blocks for the request's prompt: its workers read it."""
        rid = st.request_id
        row = self._pending[rid][0]
        self.log.start_s[row] = self.env.now
        self.links[d].start(rid, self.log.nbytes[row], lambda: self._transferred(rid))

    def _transferred(self, rid: int) -> None:
        row, p, d = self._pending.pop(rid)
        self.log.end_s[row] = self.env.now
        prefill, decode = self.prefill[p], self.decode[d]
        prefill.policy.release_held(rid)  # the consumer's notification: the producer frees them
        prefill.wake()
        decode.policy.remote_loaded(rid)
        decode.wake()


def transfer_summary(log: TransferLog, makespan_s: float) -> dict[str, Any]:
    """Transfer time percentiles, waits, bytes moved and KV in flight, over every handed-over request."""
    cols = log.columns()
    out: dict[str, Any] = {"num_transfers": int(len(cols["request_id"]))}
    if not out["num_transfers"]:
        return out
    start, end, prefilled, nbytes = cols["start_s"], cols["end_s"], cols["prefilled_s"], cols["nbytes"]
    transfer_ms = (end - start) * 1e3
    wait_ms = (start - prefilled) * 1e3  # in the decode queue, KV held by the prefill instance
    held_ms = (end - prefilled) * 1e3
    for name, values in (("transfer", transfer_ms), ("decode_wait", wait_ms), ("prefill_held", held_ms)):
        out[f"mean_{name}_ms"] = float(values.mean())
        for q in (50, 95, 99):
            out[f"p{q}_{name}_ms"] = float(np.percentile(values, q))
    out["bytes_moved"] = float(nbytes.sum())
    out["mean_bytes_per_transfer"] = float(nbytes.mean())
    if makespan_s > 0:
        # time-averaged KV in flight: bytes held for a transfer (prefilled .. read), and moving
        out["mean_kv_held_for_transfer_gib"] = float((nbytes * (end - prefilled)).sum() / makespan_s / 2**30)
        out["mean_kv_moving_gib"] = float((nbytes * (end - start)).sum() / makespan_s / 2**30)
        out["mean_transfers_in_flight"] = float((end - start).sum() / makespan_s)
    times = np.concatenate([start, end])
    steps = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
    order = np.lexsort((steps, times))  # an end before a start at the same instant
    out["max_transfers_in_flight"] = int(np.cumsum(steps[order]).max())
    return out


# -- the deployment: two pools of ordinary engines behind the proxy ---------------------------

POOLS = ("prefill", "decode")


@dataclass
class DisaggSimulation(Simulation):
    """A prefill pool and a decode pool (each a prepared `Simulation` of its own configuration,
    profile and memory plan) behind a `DisaggProxy`. The compiled core runs it when it runs both
    pools (simcore.fastcore_disagg, csrc/disagg.c; the same run as the Python engine's
    --exact-steps, tests/test_disagg_core.py); else the Python engine does."""

    pools: dict[str, Simulation] = field(default_factory=dict)
    proxy: DisaggProxy | None = None

    @property
    def disagg(self) -> DisaggProxy | None:
        """What simcore.fastcore.unsupported looks for (then simcore.fastcore_disagg's checks)."""
        return self.proxy

    @property
    def env(self) -> simpy.Environment:
        if self._env is None:
            import simpy

            env = simpy.Environment()
            for engine in self.replicas:
                engine.env = engine.lifecycle.env = env
                env.process(engine.run())
            self.proxy.wire(env)
            self._arrivals = env.process(self.workload.process(env, self.proxy, self.workload_seed))
            self._env = env
        return self._env

    def run(self) -> Result:
        from kvsim.simcore import cores
        from kvsim.simcore.simulate import _say_python_core_once

        core, why = self.choose_core()
        stats = None
        # the compiled core (simcore.fastcore_disagg) where chosen; the Python engine below otherwise
        core, why, stats = cores.run_compiled(self, core, why, cores.Hooks(self.progress))
        if core == cores.PYTHON:
            if self.engine_core == "auto":
                _say_python_core_once(why)
            self.env.run()
            stats = self.arrivals.value
        engines = self.replicas
        if sum(e.lifecycle.num_unfinished for e in engines):
            raise StalledError(STALLED)
        prefill, decode = self.pools["prefill"], self.pools["decode"]
        pool_totals: dict[str, StepTotals] = {}
        for name, pool in self.pools.items():
            pool.replicas[0].lifecycle.records.finalize()
            totals = StepTotals()
            for engine in pool.replicas:
                engine.recorder.finalize()
                totals.add(engine.recorder.totals)
            pool_totals[name] = totals
        records = decode.replicas[0].lifecycle.records  # the client's view, at the proxy
        itl = Samples.merged([e.lifecycle.itl for e in decode.replicas])
        totals = StepTotals()
        totals.add(pool_totals["prefill"])
        totals.add(pool_totals["decode"])
        summary = summarize_records(records, itl, totals)
        extrapolated = prefill.latency.extrapolated.steps + decode.latency.extrapolated.steps
        summary["extrapolated_steps"] = extrapolated
        makespan = summary.get("duration_s") or 0.0
        summary["pools"] = {name: self._pool_summary(name, pool_totals[name], makespan) for name in POOLS}
        summary["kv_transfer"] = transfer_summary(self.proxy.log, makespan)
        summary["num_gpus"] = sum(p.config.engine.num_gpus for p in self.pools.values())
        capacity = self._full_batch_capacity(records)
        if capacity is not None:  # the slower pool's, req/s (simcore.full_batch)
            summary["full_batch_capacity"], summary["full_batch_seqs"] = capacity
            judge_capacity(summary, capacity[0])
        warnings = list(self.warnings)
        if extrapolated:
            warnings.append(f"{extrapolated} of {totals.num_steps} steps needed values outside the profiled grid")
        record = {**self.record, "workload": self.workload.describe() if stats is None else self.workload.describe(stats)}
        record["engine_core"] = core
        record["engine_core_reason"] = why
        recorders = [e.recorder for e in engines]
        labels = [(name, i) for name in POOLS for i in range(len(self.pools[name].replicas))]
        return Result(summary, records, recorders, itl, decode.memory, record, totals,
                      time.perf_counter() - self.started, warnings, step_labels=labels, transfers=self.proxy.log)

    def _full_batch_capacity(self, records) -> tuple[float, int] | None:
        """(req/s, decode batch) the pools sustain at full steps: the prefill pool's prompts per
        second (less its prefix-cache hits) and the decode pool's full-batch decode rate
        (simcore.full_batch), the lower of the two; None where it does not describe the run (no exact rows, speculation, n > 1)."""
        from kvsim.simcore.full_batch import (
            computed_share,
            full_batch_capacity,
            prefill_capacity,
            served_lengths,
        )

        pre, dec = self.pools["prefill"], self.pools["decode"]
        lengths = served_lengths(records)
        if lengths is None or any(p.config.engine.speculative_config is not None for p in (pre, dec)):
            return None
        prompts, outputs = lengths
        decode = full_batch_capacity(dec.latency, dec.config, dec.memory.num_gpu_tokens, prompts, outputs,
                                     decode_only=True)
        # the prefill pool computes only what its prefix cache missed (as simulate's share)
        counters = [e.policy.counters() for e in pre.replicas]
        hits = sum(c.get("prefix_hit_tokens", 0) + c.get("offload_hit_tokens", 0) for c in counters)
        share = computed_share(hits, prompts)
        prefill = prefill_capacity(pre.latency, pre.config, prompts, share)
        if decode is None or prefill is None:
            return None
        return (min(prefill * len(pre.replicas), decode["rate"] * len(dec.replicas)), decode["batch"])

    def _pool_summary(self, name: str, totals: StepTotals, makespan: float) -> dict[str, Any]:
        """Per-pool figures: busy share of its GPUs' time, queueing, batch, KV use and waste."""
        from kvsim.simcore.metrics import kv_waste

        pool = self.pools[name]
        cfg = pool.config.engine
        replicas = len(pool.replicas)
        out: dict[str, Any] = {
            "replicas": replicas, "tp": cfg.tensor_parallel_size, "num_gpus": cfg.num_gpus,
            "kv_cache_tokens_per_replica": pool.memory.num_gpu_tokens,
            "utilization": totals.duration_s / (replicas * makespan) if makespan > 0 else None,
            "num_steps": totals.num_steps,
            "mean_batch_size": totals.seq_steps / totals.num_steps if totals.num_steps else 0.0,
            "max_running": totals.max_running, "num_preemptions": totals.num_preempted,
        }
        out.update(kv_waste(totals))
        counters = [e.policy.counters() for e in pool.replicas]
        query = sum(c.get("prefix_query_tokens", 0) for c in counters)
        if query:  # vLLM's prefix cache hit rate, over the prompts that share a prefix
            out["prefix_cache_hit_rate"] = sum(c.get("prefix_hit_tokens", 0) for c in counters) / query
        if name == "prefill":
            raw = pool.replicas[0].lifecycle.records.columns() if pool.replicas[0].lifecycle.records.kept else None
            if raw is not None:
                ok = raw["status"] == 0 if "status" in raw else slice(None)
                queue_ms = (raw["first_scheduled_s"] - raw["arrival_s"])[ok] * 1e3
                prefill_ms = (raw["first_token_s"] - raw["first_scheduled_s"])[ok] * 1e3
                for label, values in (("queue", queue_ms), ("prefill", prefill_ms)):
                    if len(values):
                        out[f"mean_{label}_ms"] = float(values.mean())
                        out[f"p95_{label}_ms"] = float(np.percentile(values, 95))
        return out


def prepare_disagg(model: ModelSpec, gpu: GPUSpec, configs: dict[str, Any], workload: Any,
                   profiles: dict[str, Any], seed: int = 0, placement: str | None = None,
                   progress: Callable[[int], None] | None = None, exact_steps: bool = False,
                   engine_core: str = "auto", decode_router: str = "least-loaded",
                   link: LinkSpec | None = None) -> DisaggSimulation:
    """Wire a disaggregated deployment: `configs` and `profiles` by pool ("prefill", "decode");
    each config's data_parallel_size is its pool's instance count, its router the prefill
    router for "prefill"; `placement` None: same-node when both pools fit in one node. Nothing
    runs yet."""
    from kvsim.simcore.config import ResolvedConfig
    from kvsim.simcore.policies.continuous import ContinuousPagedPolicy

    for name in POOLS:
        cfg = configs[name].engine if isinstance(configs[name], ResolvedConfig) else configs[name]
        if cfg.enable_expert_parallel:  # each pool's DP ranks would be one EP group: not modelled
            raise ConfigError("--enable-expert-parallel does not apply to a disaggregated run yet")
        if cfg.pipeline_parallel_size != 1:
            raise ConfigError("pipeline parallelism does not apply to a disaggregated run yet")
        if getattr(cfg, "speculative_config", None) is not None:
            raise ConfigError("speculative decoding is not modelled with disaggregated prefill/decode yet")
        if getattr(cfg, "kv_offloading_size", None):
            raise ConfigError("--kv-offloading-size (a CPU KV tier) is not modelled with disaggregated prefill/decode yet")
        if cfg.router == "session-affinity" or (name == "decode" and cfg.router == "prefix-aware"):
            raise ConfigError(f"--router {cfg.router} is not modelled with disaggregated prefill/decode yet")
    if getattr(workload, "is_session", False):  # the proxy hands the prefill pool no token stream
        raise ConfigError(f"multi-turn session workloads ({workload.name}) are not modelled with disaggregated "
                          "prefill/decode yet")
    pools = {}
    for name in POOLS:
        pools[name] = prepare(model, gpu, configs[name], workload, profiles[name], seed,
                              progress if name == "decode" else None, exact_steps, None, "python")
        pools[name].behind_proxy = True  # the proxy routes to its instances (its own sink is unused)
        for engine in pools[name].replicas:
            if type(engine.policy) is not ContinuousPagedPolicy:
                raise ConfigError(f"the {name} pool must run vLLM V1's scheduler (continuous batching, paged KV, "
                                  f"chunked prefill on) to use a KV connector; it runs {engine.policy.name}")
    p, d = (pools[n].config for n in POOLS)
    assert isinstance(p, ResolvedConfig) and isinstance(d, ResolvedConfig)
    if p.model.kv_dtype_bytes != d.model.kv_dtype_bytes:
        raise ConfigError("both pools need the same KV cache dtype (NixlConnector moves the blocks as they are)")
    if p.engine.block_size != d.engine.block_size:
        raise ConfigError("both pools need the same --block-size")
    num_p, num_d = p.engine.num_gpus, d.engine.num_gpus
    placement = placement or default_placement(gpu, num_p, num_d)
    if link is None:  # (tests give their own)
        link = link_spec(gpu, placement, p.engine.tensor_parallel_size, d.engine.tensor_parallel_size)
    proxy = DisaggProxy(pools["prefill"].replicas, pools["decode"].replicas, p.engine.router, decode_router,
                        link, kv_transfer_bytes_per_token(d.model, d.engine.tensor_parallel_size))
    base = pools["decode"]
    record = {**base.record, "deployment": "disaggregated", "disagg": {
        "connector": CONNECTOR, "link": link.to_dict(), "num_gpus": num_p + num_d,
        "prefill_router": p.engine.router, "decode_router": decode_router,
        "kv_bytes_per_token": proxy.bytes_per_token,
        **{name: {"replicas": pools[name].config.engine.data_parallel_size,
                  "config": pools[name].record["config"], "profile": pools[name].record["profile"],
                  "memory": pools[name].record["memory"], "resolved": pools[name].record["resolved"]}
           for name in POOLS},
    }}
    sim = DisaggSimulation(
        pools["prefill"].replicas + pools["decode"].replicas, base.memory, base.latency, record, workload, proxy,
        base.config, list(dict.fromkeys([*pools["prefill"].warnings, *base.warnings])),  # each once: both pools
        pools["prefill"].started, engine_core,
        base.workload_seed, progress, pools=pools, proxy=proxy)
    return sim
