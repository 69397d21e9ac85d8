"""The compiled core behind a prepared disaggregated simulation (simcore.disagg): both pools'
instances, the proxy and the KV links in C (simcore/csrc/disagg.c, in engine.c's event loop),
the same run as the Python engine's --exact-steps mode (tests/test_disagg_core.py).

Why: a planner prices dozens of disaggregated candidates (reports.plan_disagg) and each run of
the Python engine costs ~100 us of interpreter time per step of either pool.

As simcore.fastcore (whose buffers, workload feeding, ITL and step collection it reuses), with
two request tables: the prefill pool's (its instances' rows and arrival stamps) and the decode
pool's (the client's view: every arrival at the proxy, refusals included). The transfer log
comes back at the end into the proxy's TransferLog.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from kvsim.simcore import fastcore
from kvsim.simcore.fastcore import _P, KV_REQ_ROW, KV_STEP_ROW, CoreUnavailable

KV_DG_LOG_ROW = 8  # disagg.h
_STALL = -2  # engine.h KV_STALL: requests left that no instance can run
_ROUTERS = {**fastcore._ROUTERS, "prefix-aware": 2}  # disagg.h: KV_ROUTER_PREFIX_AWARE (the prefill pool's)


class _DisaggConfig(ctypes.Structure):
    _fields_ = [(name, ctypes.c_long) for name in (
        "num_prefill", "num_decode", "prefill_router", "decode_router", "bytes_per_token")] + [
        ("link_latency_s", ctypes.c_double), ("link_bytes_per_s", ctypes.c_double)]


def _declare(lib: ctypes.CDLL) -> None:
    fastcore._declare(lib)
    if getattr(lib, "_kv_disagg_declared", False):
        return
    cp = ctypes.POINTER(fastcore._Config)
    lib.kv_disagg_new.restype = ctypes.c_void_p
    lib.kv_disagg_new.argtypes = [cp, ctypes.c_void_p, cp, ctypes.c_void_p, ctypes.POINTER(_DisaggConfig)]
    lib.kv_disagg_stamps.restype = ctypes.c_long
    lib.kv_disagg_stamps.argtypes = [ctypes.c_void_p, _P]
    lib.kv_disagg_log.restype = ctypes.c_long
    lib.kv_disagg_log.argtypes = [ctypes.c_void_p, _P]
    lib.kv_disagg_counts.restype = None
    lib.kv_disagg_counts.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_long)]
    lib._kv_disagg_declared = True


def unsupported(sim: Any) -> str:
    """Why the C core cannot run this disaggregated simulation ("" when it can): each pool must be
    a simulation it runs (simcore.fastcore.unsupported, the policy's option allow-list), and the
    proxy's routers ones it has."""
    from kvsim.simcore.cores import refused_options

    if sim._env is not None:
        return "the simulation already started"
    proxy = sim.proxy
    for router in (proxy.prefill_router, proxy.decode_router):
        if router not in _ROUTERS or (router == "prefix-aware" and router == proxy.decode_router):
            return f"a disaggregated run's router {router}"
    for name, pool in sim.pools.items():
        reason = fastcore.unsupported(pool)  # (its `behind_proxy`: the proxy routes, in disagg.c, not its router)
        if not reason and pool.config is not None:
            if pool.config.policy.core_options("c") is None:
                reason = f"policy {pool.replicas[0].policy.name}"
            else:
                reason = refused_options("c", pool.config)
        if reason:
            return f"the {name} pool: {reason}"
    return ""


def _config(pool: Any, clients: int, fold: bool) -> fastcore._Config:
    from kvsim.simcore import metrics as metrics_module
    from kvsim.simcore import records as records_module

    engine = pool.replicas[0]
    policy, recorder = engine.policy, engine.recorder
    alloc = policy.allocator
    return fastcore._Config(
        policy.max_num_seqs, policy.max_num_batched_tokens, engine.max_model_len, alloc.num_gpu_blocks,
        alloc.block_size, getattr(policy, "watermark_blocks", 0), int(policy.enable_chunked_prefill),
        fastcore._NO_HOLD, recorder.kv_capacity, recorder.kv_unit, 1, int(policy.swap), alloc.cpu.num_blocks,
        len(pool.replicas), 0, clients, int(policy.enable_prefix_caching), engine.lifecycle.itl.cap,
        records_module._FLUSH, int(fold), recorder.cap, metrics_module._STEP_CHUNK, engine.swap_block_s,
    )


def run(sim: Any, progress=None) -> Any:
    """Run the disaggregated `sim` (prepared, not started, `unsupported(sim)` == "") in C, filling
    both pools' records, ITL samples and step recorders, the extrapolation counters and the
    proxy's transfer log; returns the workload generation's counts."""
    from kvsim.simcore import ccore

    lib = ccore.library()
    _declare(lib)
    prefill, decode = sim.pools["prefill"], sim.pools["decode"]
    engines = sim.replicas  # the prefill instances, then the decode ones
    clients = fastcore._clients(sim.workload)
    fold = fastcore.FOLD_STEPS and all(e.recorder.spill is None for e in engines)
    configs = [_config(pool, clients, fold) for pool in (prefill, decode)]
    proxy = sim.proxy
    dc = _DisaggConfig(len(prefill.replicas), len(decode.replicas), _ROUTERS[proxy.prefill_router],
                       _ROUTERS[proxy.decode_router], proxy.bytes_per_token, proxy.link.latency_s,
                       proxy.link.bytes_per_s)
    blobs = [ccore.pricing_blob(pool.latency) for pool in (prefill, decode)]
    pricings = [lib.kv_pricing_new(blob.ctypes.data_as(_P), len(blob)) for blob in blobs]
    handle = None
    try:
        if not all(pricings):
            raise RuntimeError("kvsim: csrc/pricing.c refused a latency model's blob")
        handle = lib.kv_disagg_new(ctypes.byref(configs[0]), pricings[0], ctypes.byref(configs[1]), pricings[1],
                                   ctypes.byref(dc))
        if not handle:
            raise MemoryError("kvsim: the C engine core could not allocate its state")
        return _drive(lib, handle, sim, progress, fold)
    except CoreUnavailable as exc:
        exc.clean = all(p.replicas[0].lifecycle.records.kept for p in (prefill, decode)) and not any(
            e.recorder.streaming for e in engines)
        if exc.clean:
            for pool in (prefill, decode):
                fastcore._reset_stores(pool.replicas)
        raise
    finally:
        if handle:
            lib.kv_engine_free(handle)
        for pricing in pricings:
            if pricing:
                lib.kv_pricing_free(pricing)


class _Stamps:
    """Arrival stamps handed to one request table only up to each of its rows' arrivals."""

    def __init__(self, records):
        self.records = records
        self.pending: list[np.ndarray] = []
        self.fed = records.num_arrived

    def upto(self, count: int) -> None:
        need = count - self.fed
        while need > 0 and self.pending:
            head = self.pending[0]
            take = min(need, len(head))
            self.records.arrive_many(head[:take])
            self.fed += take
            need -= take
            if take == len(head):
                self.pending.pop(0)
            else:
                self.pending[0] = head[take:]


def _drive(lib, handle, sim, progress, fold: bool) -> Any:
    prefill, decode = sim.pools["prefill"], sim.pools["decode"]
    engines = sim.replicas
    num_prefill = len(prefill.replicas)
    m = max(p.replicas[0].policy.max_num_seqs for p in (prefill, decode)) + 2
    req = np.empty((max(fastcore._ROWS_CAP, 4 * m), KV_REQ_ROW))
    step = np.empty((max(fastcore._ROWS_CAP, 4 + len(engines)), KV_STEP_ROW))
    arr = np.empty(max(fastcore._ROWS_CAP, 4))
    out = fastcore._Outputs()
    out.req, out.req_cap = req.ctypes.data_as(_P), len(req)
    out.step, out.step_cap = step.ctypes.data_as(_P), len(step)
    out.arr, out.arr_cap = arr.ctypes.data_as(_P), len(arr)
    tables = {"prefill": _Stamps(prefill.replicas[0].lifecycle.records),
              "decode": _Stamps(decode.replicas[0].lifecycle.records)}
    chunks = sim.workload.iter_arrays(sim.workload_seed)
    closed = bool(fastcore._clients(sim.workload))
    stats = None
    left = [0]  # decode rows (the client's requests) that left

    def flush() -> None:
        if out.arr_n:
            tables["decode"].pending.append(arr[:out.arr_n].copy())
            out.arr_n = 0
        n = lib.kv_disagg_stamps(handle, None)
        if n:
            stamps = np.empty(n)
            lib.kv_disagg_stamps(handle, stamps.ctypes.data_as(_P))
            tables["prefill"].pending.append(stamps)
        if out.req_n:
            rows = req[:out.req_n]
            is_prefill = rows[:, 1] < num_prefill
            for name, mine in (("prefill", rows[is_prefill]), ("decode", rows[~is_prefill])):
                if not len(mine):
                    continue
                table = tables[name]
                if name == "decode":
                    mine[:, 1] -= num_prefill
                    for i in np.flatnonzero(mine[:, 2]).tolist():  # refused at the proxy: the reasons, in order
                        mine[i, 3] = table.records.reason_code(_reason(sim.proxy, mine[i]))
                arrived = mine[:, 16]
                table.records.leave_rows(mine[:, :14], lambda i, t=table, a=arrived: t.upto(int(a[i])))
            if progress is not None:
                before = left[0]
                left[0] += int((~is_prefill).sum())
                every = fastcore._PROGRESS_EVERY
                for count in range((before // every + 1) * every, left[0] + 1, every):
                    progress(count)
            out.req_n = 0
        if out.step_n:
            fastcore.record_step_rows(step[:out.step_n], engines)
            out.step_n = 0

    while True:
        rc = lib.kv_engine_run(handle, ctypes.byref(out))
        if rc == fastcore._NEED_INPUT:
            try:
                chunk = next(chunks)
            except StopIteration as stop:
                stats = stop.value
                lib.kv_engine_feed(handle, 0, None, *([None] * 4), None, None, None, 1)
                continue
            fastcore._feed(lib, handle, chunk, closed)
            continue
        flush()
        if rc == fastcore._FULL:
            continue
        if rc == fastcore._DONE:
            break
        if rc == _STALL:
            from kvsim.simcore.disagg import STALLED
            from kvsim.simcore.errors import StalledError

            raise StalledError(STALLED)
        raise RuntimeError(f"kvsim: the C engine core stopped with code {rc}")
    tables["decode"].upto(out.num_arrived)
    tables["prefill"].upto(tables["prefill"].fed + sum(len(p) for p in tables["prefill"].pending))
    counts = (ctypes.c_long * 5)()
    lib.kv_disagg_counts(handle, counts)
    for pool, extrap in ((prefill, counts[:4]), (decode, out.extrap[:4])):
        latency = pool.latency
        for name, count in zip(("linear", "prefill_attention", "decode_attention"), extrap[1:], strict=True):
            if count:
                latency.extrapolated.tables[name] = latency.extrapolated.tables.get(name, 0) + count
        latency.extrapolated.steps += extrap[0]
    per = (ctypes.c_long * (fastcore.KV_COUNTS * len(engines)))()
    lib.kv_engine_counts(handle, per)
    k = fastcore.KV_COUNTS
    for index, e in enumerate(engines):  # each replica's counters, set by their owner
        e.load_counts(*per[k * index:k * (index + 1)])
    fastcore._collect_itls(lib, handle, engines)
    if fold:
        fastcore._collect_steps(lib, handle, engines)
    _collect_log(lib, handle, sim.proxy.log)
    return stats


def _collect_log(lib, handle, log) -> None:
    n = lib.kv_disagg_log(handle, None)
    rows = np.empty((n, KV_DG_LOG_ROW))
    if n:
        lib.kv_disagg_log(handle, rows.ctypes.data_as(_P))
    ints = rows[:, :4].astype(np.int64)
    log.request_id.extend(ints[:, 0].tolist())
    log.prefill_instance.extend(ints[:, 1].tolist())
    log.decode_instance.extend(ints[:, 2].tolist())
    log.num_tokens.extend(ints[:, 3].tolist())
    for column, name in zip(range(4, 8), ("nbytes", "prefilled_s", "start_s", "end_s"), strict=True):
        getattr(log, name).extend(rows[:, column].tolist())


def _reason(proxy, row: np.ndarray) -> str:
    """The refusal the proxy gives this request (its own checks, on stand-ins)."""
    from kvsim.simcore.request import Request

    request = Request(int(row[0]), float(row[4]), int(row[8]), int(row[15]), int(row[10]))
    prefill_request = Request(request.request_id, request.arrival_s, request.num_prompt_tokens, 1, max_tokens=1,
                              hold_kv=True)
    return proxy._reject_reason(request, prefill_request, proxy.prefill[0])
