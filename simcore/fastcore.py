"""The compiled engine core (simcore/csrc/engine.c) behind a prepared `Simulation`: the same run
as the Python engine in --exact-steps mode, for the configurations it supports, in C: continuous
batching (V0 / V1) over the paged allocator, prefix caching of shared prefixes included, one
replica or several behind either router, open-loop arrivals or a workload file's closed loop;
static / dynamic batching and Orca over contiguous reservations (csrc/batching.c), pipeline
stages (csrc/pipeline.c), and every token's time when the run keeps them (csrc/tokens.c,
--save-result);
multi-turn sessions (workloads.sessions: turns sent as answers come back, their blocks keyed by
the chained hashes computed here, `_sessions`), the CPU KV tier and the session-affinity and
prefix-aware routers (simcore/csrc/sessions.c and its hooks in engine.c).

Why: the Python engine spends ~100 us of interpreter time per step; a planner runs hundreds of
simulations and users replay day-long traces (issue 10). The Python engine stays the reference
and serves everything the core does not support (`unsupported` says why).

The C run is resumable: it stops whenever one of its output buffers (rows of requests that
left, step rows, arrival stamps) may not hold the next event's output, or when it needs the next
chunk of the workload; this module empties the buffers into the run's bounded stores
(RequestRecords, StepRecorder) and resumes it, so memory stays flat in request count. Runs of
decode steps that change nothing but the contexts come back as one step row (`num_steps` > 1),
as the Python engine's decode spans do. Inter-token gaps never cross: the core keeps them up to
the ITL store's cap and bins them past it as the store would (simcore.records.Samples), and
hands over the one or the other at the end.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

KV_REQ_ROW = 17  # engine.h
KV_STEP_ROW = 26
KV_COUNTS = 5  # engine.h: longs per replica from kv_engine_counts
_DONE, _FULL, _NEED_INPUT = 0, 1, 2  # kv_engine_run's answers (negative: errors)
_REJECT_MODEL_LEN = 1
_ROWS_CAP = 1 << 14  # output buffers (rows)
FOLD_STEPS = True  # step rows folded in C unless they must stream out (False: through Python; tests)
_PROGRESS_EVERY = 256  # simcore.lifecycle's


def record_step_rows(rows: np.ndarray, engines: list) -> None:
    """Hands each engine its step rows from the core's buffer (column 25: the engine's index;
    columns 21-24 reordered as the recorder takes its counts)."""
    if len(engines) == 1:
        engines[0].recorder.record_rows(rows[:, :21], rows[:, 21:25][:, [3, 0, 1, 2]])
        return
    for index, e in enumerate(engines):
        mine = rows[rows[:, 25] == index]
        if len(mine):
            e.recorder.record_rows(mine[:, :21], mine[:, 21:25][:, [3, 0, 1, 2]])
LONG_BYTES = ctypes.sizeof(ctypes.c_long)  # engine.h's `long`; _feed hands it int64 arrays


class _Config(ctypes.Structure):
    _fields_ = [(name, ctypes.c_long) for name in (
        "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks", "block_size",
        "watermark_blocks", "chunked_prefill", "hold_at", "kv_capacity", "kv_unit", "aggregate", "swap",
        "num_cpu_blocks", "num_replicas", "router", "clients", "prefix_caching", "itl_cap", "itl_block",
        "fold_steps", "step_cap", "step_chunk")] + [("swap_block_s", ctypes.c_double),
                                                     ("num_scheduler_steps", ctypes.c_long)]


_ROUTERS = {"round-robin": 0, "least-loaded": 1}  # engine.h KV_ROUTER_*
# the cache-aware routers (simcore.router; sessions.c's hooks in engine.c's pick), apart: a
# disaggregated run's pools take only the two above (fastcore_disagg)
_CACHE_ROUTERS = {"session-affinity": 4, "prefix-aware": 5}
_ALL_ROUTERS = {**_ROUTERS, **_CACHE_ROUTERS}
KV_TIER_COUNTS = 4  # sessions.h
_NO_HOLD = 1 << 62  # a router has no hold_arrivals (simcore.router): the workload never holds


_P = ctypes.POINTER(ctypes.c_double)


class _Outputs(ctypes.Structure):
    _fields_ = [
        ("req", _P), ("req_cap", ctypes.c_long), ("req_n", ctypes.c_long),
        ("step", _P), ("step_cap", ctypes.c_long), ("step_n", ctypes.c_long),
        ("arr", _P), ("arr_cap", ctypes.c_long), ("arr_n", ctypes.c_long),
        ("extrap", ctypes.c_long * 4),
        ("num_arrived", ctypes.c_long), ("num_done", ctypes.c_long), ("num_steps", ctypes.c_long),
        ("num_holds", ctypes.c_long),
    ]


class CoreUnavailable(Exception):
    """The C core cannot run this simulation (the reason is the message); `clean`: nothing was
    handed out (spilled rows), and the run's stores are as `prepare` left them."""

    clean = True


def _reset_stores(engines: list[Any]) -> None:
    """Fresh stores for the Python engine to run the simulation from the start (each engine
    makes its own, as the simulation made them): one request table for every replica."""
    from kvsim.simcore.records import RequestRecords

    old = engines[0].lifecycle.records
    records = RequestRecords(old.cap)  # one table for every replica, as simulate.prepare makes it
    records.num_replicas, records.spill = old.num_replicas, old.spill
    if old.attainment is not None:
        records.count_attainment(*old.attainment.key)
    for engine in engines:
        engine.fresh_stores(records)


def _declare(lib: ctypes.CDLL) -> None:
    if getattr(lib, "_kv_engine_declared", False):
        return
    lp = ctypes.POINTER(ctypes.c_long)
    lib.kv_engine_new.restype = ctypes.c_void_p
    lib.kv_engine_new.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p]
    lib.kv_engine_free.restype = None
    lib.kv_engine_free.argtypes = [ctypes.c_void_p]
    lib.kv_engine_feed.restype = ctypes.c_int
    lib.kv_engine_feed.argtypes = [ctypes.c_void_p, ctypes.c_long, _P, lp, lp, lp, lp, _P, lp, lp, ctypes.c_int]
    lib.kv_engine_feed_widths.restype = ctypes.c_int
    lib.kv_engine_feed_widths.argtypes = [ctypes.c_void_p, ctypes.c_long, lp]
    lib.kv_engine_run.restype = ctypes.c_int
    lib.kv_engine_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Outputs)]
    lib.kv_engine_counts.restype = None
    lib.kv_engine_counts.argtypes = [ctypes.c_void_p, lp]
    lib.kv_engine_steps.restype = ctypes.c_long
    lib.kv_engine_steps.argtypes = [ctypes.c_void_p, ctypes.c_long, lp, _P, _P]
    lib.kv_engine_itl.restype = ctypes.c_long
    lib.kv_engine_itl.argtypes = [ctypes.c_void_p, ctypes.c_long, _P, lp, lp, _P]
    lib.kv_engine_sessions.restype = ctypes.c_int
    lib.kv_engine_sessions.argtypes = [ctypes.c_void_p, ctypes.c_long, _P, ctypes.c_long, lp, lp, lp, lp, _P, lp, lp,
                                       ctypes.c_long, _P]
    lib.kv_engine_offload.restype = ctypes.c_int
    lib.kv_engine_offload.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_double, ctypes.c_long]
    lib.kv_engine_session_stats.restype = None
    lib.kv_engine_session_stats.argtypes = [ctypes.c_void_p, lp, ctypes.c_long, lp]
    lib.kv_engine_tier_counts.restype = None
    lib.kv_engine_tier_counts.argtypes = [ctypes.c_void_p, lp]
    lib.kv_engine_tier_wait.restype = None
    lib.kv_engine_tier_wait.argtypes = [ctypes.c_void_p, _P]
    lib.kv_engine_set_replica.restype = ctypes.c_int
    lib.kv_engine_set_replica.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.POINTER(_Config), ctypes.c_void_p]
    lib.kv_engine_autoscale.restype = ctypes.c_int
    lib.kv_engine_autoscale.argtypes = [ctypes.c_void_p, ctypes.c_void_p, _P]
    lib.kv_engine_fleet.restype = ctypes.c_long
    lib.kv_engine_fleet.argtypes = [ctypes.c_void_p, _P, lp, lp, _P]
    lib.kv_engine_spec.restype = ctypes.c_int
    lib.kv_engine_spec.argtypes = [ctypes.c_void_p, ctypes.POINTER(_SpecConfig), _P, ctypes.POINTER(ctypes.c_ulong),
                                   ctypes.c_void_p]
    lib.kv_engine_spec_stats.restype = None
    lib.kv_engine_spec_stats.argtypes = [ctypes.c_void_p, ctypes.c_long, lp, _P]
    lib.kv_engine_batching.restype = ctypes.c_int
    lib.kv_engine_batching.argtypes = [ctypes.c_void_p, ctypes.POINTER(_BatchConfig)]
    lib.kv_engine_pipeline.restype = ctypes.c_int
    lib.kv_engine_pipeline.argtypes = [ctypes.c_void_p, ctypes.c_long, lp, lp, ctypes.c_long, _P, _P]
    lib.kv_engine_tokens_on.restype = ctypes.c_int
    lib.kv_engine_tokens_on.argtypes = [ctypes.c_void_p]
    lib.kv_engine_tokens.restype = ctypes.c_long
    lib.kv_engine_tokens.argtypes = [ctypes.c_void_p, ctypes.c_long, lp, lp, lp, _P]
    lib._kv_engine_declared = True


def unsupported(sim: Any) -> str:
    """Why the C core cannot run this prepared simulation ("" when it can)."""
    from kvsim.simcore.engine import Engine
    from kvsim.simcore.policies.continuous import ContinuousPagedPolicy
    from kvsim.simcore.policies.continuous_v0 import VllmV0PagedPolicy
    from kvsim.simcore.policies.speculative import SpeculativePagedPolicy

    sessions = getattr(sim.workload, "is_session", False)
    engine_config = getattr(sim.config, "engine", None)
    tier_on = bool(getattr(engine_config, "kv_offloading_size", None))
    if tier_on and not sessions and getattr(sim.workload, "shared_prefix", None) is not None:
        # (the core keys a declared prefix's blocks by (prefix, index), a turn's by hash id: the
        # tier holds the latter only; a trace's prefix columns are refused when they arrive)
        return "the CPU KV tier (--kv-offloading-size) with declared shared prefixes"
    if (sessions or tier_on or getattr(engine_config, "router", "") in ("prefix-aware", "session-affinity")) and (
            getattr(sim, "fleet", None) is not None or getattr(sim, "autoscaler", None) is not None):
        return "sessions, the CPU KV tier or a cache-aware router on a heterogeneous fleet or with autoscaling"
    proxied = getattr(sim, "behind_proxy", False)  # a disaggregated run's pool: the proxy routes (fastcore_disagg)
    if sessions and (getattr(sim, "disagg", None) is not None or proxied):
        return "a multi-turn session workload on disaggregated prefill/decode"
    if sessions and any(e.lifecycle.token_times is not None for e in sim.replicas):
        return "per-request token times (--save-result) of a session workload"
    spec_reason = _speculative_unsupported(sim)
    if spec_reason:
        return spec_reason
    if (sessions or getattr(getattr(sim.config, "engine", None), "kv_offloading_size", None)) and (
            getattr(getattr(sim.config, "engine", None), "speculative_config", None) is not None):
        return "speculative decoding with sessions or the CPU KV tier"
    if getattr(sim, "disagg", None) is not None:  # both pools and the proxy: simcore.fastcore_disagg
        from kvsim.simcore import fastcore_disagg

        if any(e.lifecycle.token_times is not None for e in sim.replicas):
            return "per-request token times (--save-result) of a disaggregated run"

        return fastcore_disagg.unsupported(sim)
    from kvsim.simcore.router import Router

    engines = sim.replicas
    autoscaler = getattr(sim, "autoscaler", None)
    if autoscaler is not None:  # csrc/fleet.c: the autoscaler and its least-loaded router over the active replicas
        if sim.sink is not autoscaler or autoscaler.engines != engines:
            return "an autoscaler that does not route the run's replicas"
    elif len(engines) > 1 and not proxied and not (type(sim.sink) is Router and sim.sink.policy in _ALL_ROUTERS
                                                   and sim.sink.engines == engines):
        return "data parallelism behind a router the C core does not have"
    engine = engines[0]
    if any(type(e) is not Engine or e.lifecycle.num_arrived for e in engines) or (sim._env is not None and sim._env.now):
        return "the simulation already started"
    if any(type(_base(e.latency)).__name__ != "StepLatencyModel" for e in engines):
        return "a latency model the C core does not price"
    if _pipelined(engines):  # csrc/pipeline.c: simcore.pipeline's rounds
        if engine.spec_cost is not None or autoscaler is not None or getattr(sim, "fleet", None):
            return "pipeline parallelism with speculative decoding, an autoscaler or a fleet"
        if sessions or tier_on or (len(engines) > 1 and getattr(engine_config, "router", "") in _CACHE_ROUTERS):
            return "pipeline parallelism with sessions, the CPU KV tier or a cache-aware router"
        if _pp_max_tokens(engine) > _PP_MAX_TOKENS:
            return (f"pipeline parallelism with steps of up to {_pp_max_tokens(engine):,} tokens (the core "
                    f"takes the stage hand-offs' prices for at most {_PP_MAX_TOKENS:,})")
    if any((e.lifecycle.token_times is None) != (engine.lifecycle.token_times is None) for e in engines):
        return "per-request token times (--save-result) kept on some replicas only"
    if engine.lifecycle.token_times:
        return "per-request token times already recorded"
    policy = engine.policy
    if getattr(policy, "num_scheduler_steps", 1) > 1 and (
            _pipelined(engines) or autoscaler is not None or getattr(sim, "fleet", None) is not None or proxied):
        return "vLLM 0.6's multi-step rounds with pipeline parallelism, an autoscaler, a fleet or disaggregation"
    if type(policy) not in (ContinuousPagedPolicy, VllmV0PagedPolicy, SpeculativePagedPolicy) and not _batching(policy):
        return f"policy {policy.name} (the C core runs continuous batching, static and dynamic batching and Orca)"
    if _batching(policy) and (autoscaler is not None or getattr(sim, "fleet", None)):
        return f"policy {policy.name} behind an autoscaler or in a fleet"
    if any(type(e.policy) is not type(policy) for e in engines):
        return "replicas with different policies"
    workload = sim.workload
    if _batching(policy) and (sessions or tier_on or (len(engines) > 1 and getattr(engine_config, "router", "") in (
            "prefix-aware", "session-affinity"))):
        return f"sessions, the CPU KV tier or a cache-aware router with policy {policy.name}"
    if sessions:  # workloads.sessions: turns made in the core from the sessions' plans (_sessions)
        return _unavailable_core()
    if not hasattr(workload, "iter_arrays"):
        return "a workload that does not give its requests as arrays"
    if getattr(workload, "is_closed_loop", True) and getattr(getattr(workload, "arrival", None), "kind", "") != "closed_loop":
        # (simcore imports no workloads: the loop's kind, concurrency and per-request think_s, by name)
        return "a closed loop other than a workload file's clients (workloads.arrivals.ClosedLoop)"
    # what a workload file says of every request (a chunk that breaks it anyway stops the run)
    trace = getattr(workload, "trace", None)
    extras = getattr(trace, "extras", {}) if trace is not None else {}
    if tuple(getattr(getattr(workload, "beam_width", None), "values", (1,))) != (1,) or "beam_width" in extras:
        return "beam search"
    if tuple(getattr(getattr(workload, "n", None), "values", (1,))) != (1,) or "n" in extras:
        reason = _groups_unsupported(sim)  # csrc/seqgroup.c: parallel sampling on the plain paged policy
        if reason:
            return reason
    return _unavailable_core()


_GROUPS_REFUSED = ("parallel sampling (n > 1) with another policy than paged continuous batching, shared "
                   "prefixes with prefix caching, the CPU KV tier, pipeline parallelism, disaggregation or a fleet")


def _groups_unsupported(sim: Any) -> str:
    """Why the C core cannot run parallel sampling (n > 1) here ("" when it can): csrc/seqgroup.c
    models forked groups on the paged continuous policies (V0 and V1) where no block is ever
    cached (prefix caching on but no shared prefix declared is fine: nothing is hashed), without
    the CPU tier, speculative decoding, pipeline stages, disaggregation or a fleet."""
    from kvsim.simcore.policies.continuous import ContinuousPagedPolicy
    from kvsim.simcore.policies.continuous_v0 import VllmV0PagedPolicy

    engines = sim.replicas
    policy = engines[0].policy
    workload = sim.workload
    trace = getattr(workload, "trace", None)
    prefixes = getattr(workload, "shared_prefix", None) is not None or "prefix_id" in (
        getattr(trace, "extras", {}) if trace is not None else {})
    if (type(policy) not in (ContinuousPagedPolicy, VllmV0PagedPolicy) or (policy.enable_prefix_caching and prefixes)
            or getattr(policy, "host_tier", None) is not None or _pipelined(engines)
            or getattr(sim, "fleet", None) is not None or getattr(sim, "autoscaler", None) is not None
            or getattr(sim, "disagg", None) is not None or getattr(sim, "behind_proxy", False)
            or getattr(sim.workload, "is_session", False)):
        return _GROUPS_REFUSED
    return ""


def _unavailable_core() -> str:
    if LONG_BYTES != 8:  # e.g. Windows: _feed's int64 arrays would be read as 32-bit longs
        return f"a C long of {LONG_BYTES * 8} bits on this platform (the core counts in 64-bit longs)"
    from kvsim.simcore import ccore

    if ccore.library() is None:
        return f"the compiled core is unavailable ({ccore.unavailable_reason()})"
    return ""


_PP_MAX_TOKENS = 1 << 16  # micro-batch sizes whose hand-off prices Python hands the core (csrc/pipeline.c)


def _base(latency: Any) -> Any:
    """The step model a pipeline's rounds are built of (simcore.pipeline), or the model itself."""
    return latency.base if type(latency).__name__ == "PipelineLatency" else latency


def _pipelined(engines: list[Any]) -> bool:
    return any(type(e.latency).__name__ == "PipelineLatency" for e in engines)


def _pp_max_tokens(engine: Any) -> int:
    """The most tokens a step of this replica's policy computes (a bound on a micro-batch's)."""
    policy = engine.policy
    if hasattr(policy, "num_slots"):  # static batching: a padded prefill of every slot
        return policy.num_slots * policy.slot_tokens
    budget = getattr(policy, "max_num_batched_tokens", 0) or getattr(policy, "max_prefill_tokens", 0)
    return max(budget, policy.max_num_seqs)


def _set_pipeline(lib, handle, engines) -> None:
    """Every replica's stages into the core: their layers, which hand-offs cross nodes, and the
    price of a hand-off by micro-batch tokens (PipelineLatency.handoff_ms itself, so the same bits)."""
    lat = engines[0].latency
    if any(e.latency.base is not lat.base or (e.latency.layers, e.latency.crosses) != (lat.layers, lat.crosses)
           for e in engines):
        raise CoreUnavailable("replicas with different pipelines")
    n = _pp_max_tokens(engines[0]) + 1
    tables = []
    for across in (False, True):
        table = np.zeros(n)
        if across in lat.crosses:
            table[1:] = [lat.handoff_ms(t * lat.token_bytes, across) for t in range(1, n)]
        tables.append(table)
    layers = np.array(lat.layers, dtype=np.int64)
    crosses = np.array([int(x) for x in lat.crosses] + [0], dtype=np.int64)
    lp = ctypes.POINTER(ctypes.c_long)
    rc = lib.kv_engine_pipeline(handle, lat.pp, layers.ctypes.data_as(lp), crosses.ctypes.data_as(lp), n,
                                tables[0].ctypes.data_as(_P), tables[1].ctypes.data_as(_P))
    if rc:
        raise MemoryError("kvsim: the C engine core could not set up its pipeline stages")


_BT_KINDS = {"StaticPolicy": 1, "DynamicPolicy": 2, "OrcaPolicy": 3}  # csrc/batching.h KV_BT_*
_RESERVATIONS = {"max": 0, "pow2": 1, "oracle": 2}  # KV_RES_*


def _batching(policy: Any) -> int:
    """csrc/batching.c's kind of a reservation policy (static, dynamic, Orca), or 0."""
    from kvsim.simcore.policies.dynamic import DynamicPolicy
    from kvsim.simcore.policies.orca import OrcaPolicy
    from kvsim.simcore.policies.static import StaticPolicy

    return _BT_KINDS[type(policy).__name__] if type(policy) in (StaticPolicy, DynamicPolicy, OrcaPolicy) else 0


class _BatchConfig(ctypes.Structure):  # csrc/batching.h kv_batch_config
    _fields_ = [(name, ctypes.c_long) for name in (
        "kind", "capacity", "num_slots", "slot_tokens", "max_prefill_tokens", "max_waiting_tokens", "reservation")] + [
        ("batch_timeout_s", ctypes.c_double), ("waiting_served_ratio", ctypes.c_double)]


def _batch_config(policy: Any) -> _BatchConfig:
    """The policy's parameters as csrc/batching.c reads them."""
    kind = _batching(policy)
    return _BatchConfig(
        kind, policy.allocator.capacity_tokens, getattr(policy, "num_slots", 0), getattr(policy, "slot_tokens", 0),
        getattr(policy, "max_prefill_tokens", 0), getattr(policy, "max_waiting_tokens", 0),
        _RESERVATIONS.get(getattr(policy, "reservation", "max"), 0), float(getattr(policy, "batch_timeout_s", 0.0)),
        float(getattr(policy, "waiting_served_ratio", 0.0)))


def _speculative_unsupported(sim: Any) -> str:
    """Why the core cannot run this run's speculative decoding ("" when it can, or there is none):
    csrc/spec.c draws acceptance from the policy's own numpy PCG64 stream, and prices a step as
    simcore.speculative_cost does (a head, n-gram lookup, or a draft model's own profile)."""
    engine_config = getattr(sim.config, "engine", None)
    spec = getattr(engine_config, "speculative_config", None)
    costs = [getattr(e, "spec_cost", None) for e in sim.replicas]
    if spec is None and all(c is None for c in costs):
        return ""
    if spec is None or any(c is None or c.spec is not spec for c in costs):
        return "speculative decoding on some replicas only"
    if spec.method not in _SPEC_METHODS:
        return f"speculative decoding with method {spec.method}"
    if spec.method == "draft_model" and type(costs[0].draft).__name__ != "StepLatencyModel":
        return "speculative decoding with a draft model that is not priced from a profile's tables"
    for e in sim.replicas:
        rng = getattr(e.policy, "accept_rng", None)
        if rng is None or rng.bit_generator.state.get("bit_generator") != "PCG64":
            return "speculative decoding with an acceptance stream other than numpy's PCG64"
    return ""


_SPEC_METHODS = {"eagle": 0, "eagle3": 0, "mtp": 0, "ngram": 1, "draft_model": 2}  # csrc/spec.h KV_SPEC_*


class _SpecConfig(ctypes.Structure):  # csrc/spec.h kv_spec_config
    _fields_ = [("k", ctypes.c_long), ("method", ctypes.c_long), ("head_layers", ctypes.c_double),
                ("ngram_ms_per_seq", ctypes.c_double)]


def _set_speculative(lib, handle, engines) -> Any:
    """Every replica's speculative decoding into the core (its acceptance stream where the
    policy's stands now); returns the draft model's kv_pricing to free after the run (or None)."""
    from kvsim.simcore import ccore
    from kvsim.simcore.speculative import NGRAM_HOST_MS_PER_SEQ

    cost = engines[0].spec_cost
    spec = cost.spec
    cfg = _SpecConfig(spec.num_speculative_tokens, _SPEC_METHODS[spec.method], float(cost.head_layers),
                      NGRAM_HOST_MS_PER_SEQ)
    rates = np.ascontiguousarray(spec.rates, dtype=np.float64)
    mask = (1 << 64) - 1
    words = []
    for e in engines:  # numpy PCG64's 128-bit state and increment, high word first
        st = e.policy.accept_rng.bit_generator.state["state"]
        words += [st["state"] >> 64, st["state"] & mask, st["inc"] >> 64, st["inc"] & mask]
    rng = (ctypes.c_ulong * len(words))(*words)
    draft = None
    if cost.draft is not None:
        blob = ccore.pricing_blob(cost.draft)
        draft = lib.kv_pricing_new(blob.ctypes.data_as(_P), len(blob))
        if not draft:
            raise RuntimeError("kvsim: csrc/pricing.c refused the draft model's blob")
    if lib.kv_engine_spec(handle, ctypes.byref(cfg), rates.ctypes.data_as(_P), rng, draft):
        if draft:
            lib.kv_pricing_free(draft)
        raise MemoryError("kvsim: the C engine core could not allocate its speculative-decoding state")
    return draft


def _collect_speculative(lib, handle, engines) -> None:
    """Each replica's spec-decode counters into its policy and its pricer's sums, through their
    owners' load methods (what the Python engine leaves there: simulate.speculative_summary reads them)."""
    k = engines[0].spec_cost.spec.num_speculative_tokens
    ints = (ctypes.c_long * (3 + 2 * k))()
    sums = (ctypes.c_double * 2)()
    for index, e in enumerate(engines):
        lib.kv_engine_spec_stats(handle, index, ints, sums)
        e.policy.load_counts(ints[0], ints[1], ints[2], ints[3:3 + k], ints[3 + k:3 + 2 * k])
        e.spec_cost.load_sums(sums[0], sums[1])


def run(sim: Any, progress=None) -> Any:
    """Run `sim` (prepared, not started, `unsupported(sim)` == "") in C, filling its engines'
    records, ITL samples, step recorders and the extrapolation counter; returns the workload
    generation's counts (what its SimPy process would have returned)."""
    from kvsim.simcore import ccore

    if getattr(sim, "disagg", None) is not None:
        from kvsim.simcore import fastcore_disagg

        return fastcore_disagg.run(sim, progress)
    lib = ccore.library()
    _declare(lib)
    engines = sim.replicas
    engine = engines[0]
    latency = sim.latency
    dp = len(engines)
    autoscaler = getattr(sim, "autoscaler", None)
    sessions = getattr(sim.workload, "is_session", False)
    clients = 0 if sessions else _clients(sim.workload)
    fold = FOLD_STEPS and all(e.recorder.spill is None for e in engines)  # else rows stream out: Python folds
    hold = engine.hold_at if dp == 1 and autoscaler is None else _NO_HOLD  # a router has no hold_arrivals
    router = _ALL_ROUTERS[sim.sink.policy] if dp > 1 and autoscaler is None else 0
    speculative = engine.spec_cost is not None  # every step its own row, as the Python engine plans them
    # every step its own row: speculative steps as the Python engine plans them, pipeline rounds (exact steps)
    each_step = speculative or _pipelined(engines)  # once, not per replica (dp x dp scans at a large --dp)
    configs = [_config(e, hold, dp, router, clients, fold, each_step) for e in engines]
    pricings: dict[int, int] = {}  # one kv_pricing per latency model (a fleet's groups each have theirs)
    handle = None
    draft = None
    try:
        for e in engines:  # (a pipeline's replicas each have their own rounds over one base model)
            if id(_base(e.latency)) not in pricings:
                blob = ccore.pricing_blob(_base(e.latency))
                pricings[id(_base(e.latency))] = lib.kv_pricing_new(blob.ctypes.data_as(_P), len(blob))
                if not pricings[id(_base(e.latency))]:
                    raise RuntimeError("kvsim: csrc/pricing.c refused the latency model's blob")
        handle = lib.kv_engine_new(ctypes.byref(configs[0]), pricings[id(_base(engine.latency))])
        if not handle:
            raise MemoryError("kvsim: the C engine core could not allocate its state")
        for index, e in enumerate(engines):  # a heterogeneous fleet: each replica its own sizes and prices
            if index and (bytes(configs[index]) != bytes(configs[0]) or _base(e.latency) is not _base(engine.latency)):
                if lib.kv_engine_set_replica(handle, index, ctypes.byref(configs[index]), pricings[id(_base(e.latency))]):
                    raise MemoryError("kvsim: the C engine core could not allocate a replica")
        if autoscaler is not None:
            _autoscale(lib, handle, autoscaler)
        nkeys = _sessions(lib, handle, sim) if sessions else 0
        tier = getattr(engine.policy, "host_tier", None)
        if tier is not None and lib.kv_engine_offload(handle, tier.num_blocks, float(engine.policy.load_block_s), nkeys):
            raise MemoryError("kvsim: the C engine core could not allocate the CPU KV tier")
        if speculative:
            draft = _set_speculative(lib, handle, engines)
        if _batching(engine.policy) and lib.kv_engine_batching(handle, ctypes.byref(_batch_config(engine.policy))):
            raise MemoryError("kvsim: the C engine core could not allocate its batching state")
        if _pipelined(engines):
            _set_pipeline(lib, handle, engines)
        tokens = engine.lifecycle.token_times is not None  # --save-result: csrc/tokens.c keeps them
        if tokens and lib.kv_engine_tokens_on(handle):
            raise MemoryError("kvsim: the C engine core could not allocate its token-time tables")
        stats = _drive(lib, handle, sim, engines, latency, progress, fold)
        if tokens:
            _collect_tokens(lib, handle, engines)
        if autoscaler is not None:
            _collect_fleet(lib, handle, autoscaler)
        if speculative:
            _collect_speculative(lib, handle, engines)
        return stats
    except CoreUnavailable as exc:
        # nothing went out to the caller yet
        exc.clean = engine.lifecycle.records.kept and not any(e.recorder.streaming for e in engines)
        if exc.clean:  # fresh stores, as prepare made them, so the Python engine can run it from the start
            _reset_stores(engines)
        raise
    finally:
        if handle:
            lib.kv_engine_free(handle)
        for pricing in pricings.values():
            if pricing:
                lib.kv_pricing_free(pricing)
        if draft:
            lib.kv_pricing_free(draft)


def _config(engine, hold: int, dp: int, router: int, clients: int, fold: bool, speculative: bool) -> _Config:
    """One replica's kv_engine_config (engine.h): its policy's limits, its KV cache and swap space."""
    from kvsim.simcore import metrics as metrics_module
    from kvsim.simcore import records as records_module

    policy, recorder = engine.policy, engine.recorder
    alloc = policy.allocator
    kind = _batching(policy)
    if kind:  # csrc/batching.c: its own allocator; the paged fields unused (one-token blocks, none)
        seqs = policy.num_slots if kind == 1 else policy.max_num_seqs
        budget = {1: 1, 2: getattr(policy, "max_prefill_tokens", 1), 3: getattr(policy, "max_num_batched_tokens", 1)}[kind]
        chunked = int(getattr(policy, "enable_chunked_prefill", False))
        return _Config(
            seqs, budget, engine.max_model_len, 0, 1, 0, chunked, hold, recorder.kv_capacity, recorder.kv_unit, 0, 0,
            0, dp, router, clients, 0, engine.lifecycle.itl.cap, records_module._FLUSH, int(fold), recorder.cap,
            metrics_module._STEP_CHUNK, engine.swap_block_s,
        )
    return _Config(
        policy.max_num_seqs, policy.max_num_batched_tokens, engine.max_model_len, alloc.num_gpu_blocks,
        alloc.block_size, getattr(policy, "watermark_blocks", 0), int(policy.enable_chunked_prefill),
        hold, recorder.kv_capacity, recorder.kv_unit, int(not speculative), int(policy.swap),
        alloc.cpu.num_blocks, dp, router, clients,
        int(policy.enable_prefix_caching), engine.lifecycle.itl.cap, records_module._FLUSH, int(fold),
        recorder.cap, metrics_module._STEP_CHUNK, engine.swap_block_s, getattr(policy, "num_scheduler_steps", 1),
    )


_AUTOSCALE_DOUBLES = ("target", "interval_s", "tolerance", "scale_up_cooldown_s", "scale_down_cooldown_s",
                      "scale_up_percent", "scale_up_pods", "scale_up_period_s", "scale_down_percent",
                      "scale_down_period_s")  # AutoscaleConfig's fields, in fleet.h's order


class _AutoscaleConfig(ctypes.Structure):  # csrc/fleet.h kv_autoscale_config
    _fields_ = [("min_replicas", ctypes.c_long), ("metric", ctypes.c_long)] + [
        (name, ctypes.c_double) for name in _AUTOSCALE_DOUBLES]


_METRICS = {"inflight": 0, "kv": 1}  # fleet.h KV_METRIC_*
_STATES = ("off", "starting", "active", "draining")  # fleet.h KV_REP_* (simcore.autoscale's names)


def _autoscale(lib, handle, autoscaler) -> None:
    """Hand the core the policy and each replica's cold start (csrc/fleet.c runs it)."""
    c = autoscaler.config
    cfg = _AutoscaleConfig(c.min_replicas, _METRICS[c.metric], *(float(getattr(c, name)) for name in _AUTOSCALE_DOUBLES))
    cold = np.ascontiguousarray(autoscaler.cold_starts, dtype=np.float64)
    if lib.kv_engine_autoscale(handle, ctypes.byref(cfg), cold.ctypes.data_as(_P)):
        raise MemoryError("kvsim: the C engine core could not set up the autoscaler")


def _collect_fleet(lib, handle, autoscaler) -> None:
    """The autoscaler's timeline, decisions and bills as the core left them, handed to the Python
    AutoscalingRouter (whose `finish` summarises them as after a Python run)."""
    n = len(autoscaler.replicas)
    decisions = ctypes.c_long()
    state = (ctypes.c_long * n)()
    paid = (ctypes.c_double * (2 * n))()
    count = lib.kv_engine_fleet(handle, None, ctypes.byref(decisions), state, paid)
    rows = np.empty((count, 4))
    lib.kv_engine_fleet(handle, rows.ctypes.data_as(_P), None, None, None)
    autoscaler.load_run([(t, int(a), int(s), int(d)) for t, a, s, d in rows.tolist()], decisions.value,
                        [(_STATES[state[i]], paid[2 * i], None if paid[2 * i + 1] < 0 else paid[2 * i + 1])
                         for i in range(n)])


def _clients(workload: Any) -> int:
    """The closed loop's clients (those that get a request), or 0 for an open loop."""
    if not getattr(workload, "is_closed_loop", False):
        return 0
    return min(int(workload.arrival.concurrency), int(workload.num_requests))


def _drive(lib, handle, sim, engines, latency, progress, fold: bool) -> Any:
    engine = engines[0]
    dp = len(engines)
    m = max(getattr(e.policy, "max_num_seqs", 0) or getattr(e.policy, "num_slots", 0) for e in engines) + 2
    req = np.empty((max(_ROWS_CAP, 4 * m), KV_REQ_ROW))
    step = np.empty((max(_ROWS_CAP, 4 + dp), KV_STEP_ROW))
    arr = np.empty(max(_ROWS_CAP, 4))
    out = _Outputs()
    out.req, out.req_cap = req.ctypes.data_as(_P), len(req)
    out.step, out.step_cap = step.ctypes.data_as(_P), len(step)
    out.arr, out.arr_cap = arr.ctypes.data_as(_P), len(arr)
    records = engine.lifecycle.records
    pending_arrivals: list[np.ndarray] = []  # stamps handed to the records only up to each row's arrivals
    state = {"fed": records.num_arrived}
    sessions = getattr(sim.workload, "is_session", False)
    chunks = iter(()) if sessions else sim.workload.iter_arrays(sim.workload_seed)
    closed = bool(_clients(sim.workload))
    stats = None
    ttft: tuple[list, list] = ([], [])  # sessions: (request id, TTFT) of each answered turn, as they left
    tier = getattr(engine.policy, "host_tier", None) is not None
    groups = not sessions and not _groups_unsupported(sim)  # n > 1 runs here (csrc/seqgroup.c)

    def arrive_upto(count: int) -> None:
        """Hand the records the arrival stamps up to the `count`-th arrival."""
        need = count - state["fed"]
        while need > 0 and pending_arrivals:
            head = pending_arrivals[0]
            take = min(need, len(head))
            records.arrive_many(head[:take])
            state["fed"] += take
            need -= take
            if take == len(head):
                pending_arrivals.pop(0)
            else:
                pending_arrivals[0] = head[take:]

    def flush() -> None:
        if out.arr_n:
            pending_arrivals.append(arr[:out.arr_n].copy())
            out.arr_n = 0
        if out.req_n:
            rows = req[:out.req_n]
            for i in np.flatnonzero(rows[:, 2]).tolist():  # rejected: their reasons, in order
                rows[i, 3] = records.reason_code(_reason(engines[int(rows[i, 1])], rows[i]))
            arrived = rows[:, 16]
            if sessions:
                answered = rows[rows[:, 2] == 0]
                ttft[0].extend(answered[:, 0].astype(np.int64).tolist())
                ttft[1].extend((answered[:, 6] - answered[:, 4]).tolist())
            records.leave_rows(rows[:, :14], lambda i: arrive_upto(int(arrived[i])))
            if progress is not None:  # as the lifecycle reports: at every _PROGRESS_EVERY-th request that left
                before = out.num_done - out.req_n
                for count in range((before // _PROGRESS_EVERY + 1) * _PROGRESS_EVERY, out.num_done + 1, _PROGRESS_EVERY):
                    progress(count)
            out.req_n = 0
        if out.step_n:
            rows = step[:out.step_n]
            record_step_rows(rows, engines)
            out.step_n = 0

    while True:
        # a watch (plan's early stop) checks every few rows: the core returns once the rows up to
        # its next check are out (at most one event's rows, m, past them), not when the buffer fills
        left = records.rows_to_watch()
        out.req_cap = len(req) if left is None else min(len(req), left + m)
        rc = lib.kv_engine_run(handle, ctypes.byref(out))
        if rc == _NEED_INPUT:
            try:
                chunk = next(chunks)
            except StopIteration as stop:
                stats = stop.value
                lib.kv_engine_feed(handle, 0, None, *([None] * 4), None, None, None, 1)
                continue
            _feed(lib, handle, chunk, closed, tier, groups)
            continue
        flush()
        if rc == _FULL:
            continue
        if rc == _DONE:
            break
        raise RuntimeError(f"kvsim: the C engine core stopped with code {rc}")
    arrive_upto(out.num_arrived)
    latency.extrapolated.add(out.extrap[0], dict(zip(("linear", "prefill_attention", "decode_attention"),
                                                     out.extrap[1:], strict=True)))
    counts = (ctypes.c_long * (KV_COUNTS * dp))()
    lib.kv_engine_counts(handle, counts)
    for index, e in enumerate(engines):  # each replica's counters, set by their owner
        e.load_counts(*counts[KV_COUNTS * index:KV_COUNTS * (index + 1)])
    if tier:
        offload = (ctypes.c_long * (KV_TIER_COUNTS * dp))()
        lib.kv_engine_tier_counts(handle, offload)
        for index, e in enumerate(engines):
            (e.policy.offload_hit_tokens, e.policy.offload_loaded_blocks, e.policy.host_tier.num_stored,
             e.policy.host_tier.num_evicted) = offload[KV_TIER_COUNTS * index:KV_TIER_COUNTS * (index + 1)]
        waited = (ctypes.c_double * dp)()
        lib.kv_engine_tier_wait(handle, waited)
        for index, e in enumerate(engines):
            e.policy.offload_wait_s = waited[index]
    if sessions:
        stats = _session_stats(lib, handle, ttft)
    _collect_itls(lib, handle, engines)
    if fold:
        _collect_steps(lib, handle, engines)
    if stats is None:  # the generator ended without a final NEED_INPUT (never: kept for safety)
        for _ in chunks:
            pass
    return stats


def _collect_steps(lib, handle, engines) -> None:
    """Each replica's step table as the core folded it (simcore.metrics.StepRecorder's totals,
    kept rows and coalescing, in C): no step row crossed to Python during the run."""
    from kvsim.simcore.metrics import KV_KINDS, StepTotals

    ints = (ctypes.c_long * 8)()
    sums = (ctypes.c_double * (3 + len(KV_KINDS)))()
    for index, engine in enumerate(engines):
        n = lib.kv_engine_steps(handle, index, ints, sums, None)
        rows = np.empty((n, 21))
        lib.kv_engine_steps(handle, index, ints, sums, rows.ctypes.data_as(_P))
        totals = StepTotals(num_steps=ints[0], duration_s=sums[0], seq_steps=ints[1], running_s=sums[1],
                            max_running=ints[2], kv_allocated_max=ints[3], kv_blocked_s=sums[2], num_preempted=ints[4],
                            kv_slot_s=dict(zip(KV_KINDS, sums[3:], strict=True)))
        engine.recorder.load_folded(rows, totals, ints[5], bool(ints[6]), bool(ints[7]))


def _collect_itls(lib, handle, engines) -> None:
    """Each replica's inter-token gaps into its ITL store (simcore.records.Samples): every gap,
    in emission order, while there are at most the store's cap; past it the core kept none and
    binned every one as the store would, and the store becomes those bins. So a run of any length
    keeps a histogram, not its gaps, and Python never touches a gap one by one."""
    stats = (ctypes.c_double * 5)()
    key0 = ctypes.c_long()
    for index, engine in enumerate(engines):
        life = engine.lifecycle
        n = lib.kv_engine_itl(handle, index, stats, ctypes.byref(key0), None, None)
        count = int(stats[0])
        if count <= life.itl.cap:
            values = np.empty(count)
            lib.kv_engine_itl(handle, index, stats, ctypes.byref(key0), None, values.ctypes.data_as(_P))
            life.itl.extend(values)
            continue
        counts = np.zeros(n, dtype=np.int64)
        lib.kv_engine_itl(handle, index, stats, ctypes.byref(key0), counts.ctypes.data_as(ctypes.POINTER(ctypes.c_long)), None)
        life.itl.load_bins(count, stats[1], stats[2], stats[3], int(stats[4]), key0.value, counts)


def _collect_tokens(lib, handle, engines) -> None:
    """Each replica's per-request token times (csrc/tokens.c) into its Lifecycle.token_times, as
    the Python engine fills it: request id -> every token's time, an array("d")."""
    from array import array

    total = ctypes.c_long()
    lp = ctypes.POINTER(ctypes.c_long)
    for index, engine in enumerate(engines):
        n = lib.kv_engine_tokens(handle, index, ctypes.byref(total), None, None, None)
        ids, counts = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        times = np.empty(total.value)
        lib.kv_engine_tokens(handle, index, None, ids.ctypes.data_as(lp), counts.ctypes.data_as(lp),
                             times.ctypes.data_as(_P))
        log = engine.lifecycle.token_times
        ends = np.cumsum(counts).tolist()
        raw = memoryview(times).cast("B")  # (no copy of the whole table)
        start = 0
        for rid, end in zip(ids.tolist(), ends, strict=True):
            stamps = log[rid] = array("d")
            stamps.frombytes(raw[8 * start:8 * end])
            start = end
        del raw, times


def _feed(lib, handle, chunk, closed: bool, tier: bool = False, groups: bool = False) -> None:
    """Hand the core the workload's next chunk (kv_engine_feed copies it: nothing to keep alive);
    `groups`: requests with n > 1 may come (csrc/seqgroup.c)."""
    n = len(chunk.num_prompt_tokens)
    if (chunk.beam_width != 1).any():
        raise CoreUnavailable("beam search")
    wide = bool((chunk.n != 1).any())
    if wide and not groups:
        raise CoreUnavailable(_GROUPS_REFUSED)
    if wide and (np.asarray(chunk.prefix_id) >= 0).any():  # (blocks that may be cached: _groups_unsupported)
        raise CoreUnavailable(_GROUPS_REFUSED)
    if tier and (np.asarray(chunk.prefix_id) >= 0).any():
        raise CoreUnavailable("the CPU KV tier (--kv-offloading-size) with declared shared prefixes")
    at = None if closed else np.ascontiguousarray(chunk.arrival_s, dtype=np.float64)
    think = np.ascontiguousarray(chunk.think_s, dtype=np.float64) if closed else None
    ids = np.arange(chunk.first_id, chunk.first_id + n, dtype=np.int64)
    prompt = np.ascontiguousarray(chunk.num_prompt_tokens, dtype=np.int64)
    output = np.ascontiguousarray(chunk.num_output_tokens, dtype=np.int64)
    max_tokens = np.where(chunk.max_tokens > 0, chunk.max_tokens, chunk.num_output_tokens).astype(np.int64)
    prefix_id = np.ascontiguousarray(chunk.prefix_id, dtype=np.int64)  # -1: none (Request.prefix_id None)
    prefix_tokens = np.ascontiguousarray(chunk.num_prefix_tokens, dtype=np.int64)
    lp = ctypes.POINTER(ctypes.c_long)
    rc = lib.kv_engine_feed(handle, n, None if at is None else at.ctypes.data_as(_P),
                            *(a.ctypes.data_as(lp) for a in (ids, prompt, output, max_tokens)),
                            None if think is None else think.ctypes.data_as(_P),
                            *(a.ctypes.data_as(lp) for a in (prefix_id, prefix_tokens)), 0)
    if not rc and wide:
        widths = np.ascontiguousarray(chunk.n, dtype=np.int64)
        rc = lib.kv_engine_feed_widths(handle, n, widths.ctypes.data_as(lp))
    if rc:
        raise MemoryError("kvsim: the C engine core could not take the workload's next chunk")


def _reason(engine, row: np.ndarray) -> str:
    """The reject reason the Python engine gives this request (its own checks, on a stand-in)."""
    from kvsim.simcore.request import Request
    from kvsim.simcore.state import ReqState

    request = Request(int(row[0]), float(row[4]), int(row[8]), int(row[15]), int(row[10]), n=int(row[11]))
    return engine.reject_reason(ReqState(request, None, engine.max_model_len))


def _sessions(lib, handle, sim) -> int:
    """Hand the core a session workload's plans (workloads.sessions.SessionWorkload.process draws
    them from the same streams): per session, in start order, its start time (open loop), system
    prompt length and turns (new user tokens, answer, think time), and with prefix caching the
    dense ids of its blocks' chained hashes (simcore.prefix_hash, as the Python policies hash them:
    equal ids, equal hashes) up to the longest turn it can send; the closed loop's pauses between
    sessions, drawn in order. Returns the number of distinct block ids."""
    from kvsim.simcore.prefix_hash import TokenStream

    wl = sim.workload
    policy = sim.replicas[0].policy
    bs = policy.allocator.block_size
    pc = bool(policy.enable_prefix_caching)
    mml = wl.max_model_len
    starts, system, turn_off, new, out, think, key_off, keys = [], [], [0], [], [], [], [0], []
    ids: dict[int, int] = {}
    closed = wl.is_closed_loop
    for start, turns, group, length, index in wl._plans(sim.workload_seed):
        assert index == len(system)
        starts.append(0.0 if start is None else float(start))
        system.append(int(length))
        context = longest = int(length)
        for n_new, n_out, t in turns:
            new.append(int(n_new))
            out.append(int(n_out))
            think.append(float(t))
            prompt = context + int(n_new)
            if mml is not None and prompt >= mml:
                break  # the session ends here (later turns are never sent)
            answer = int(n_out) if mml is None else min(int(n_out), mml - prompt)
            longest = max(longest, prompt + answer)
            context = prompt + answer
        new.extend([0] * (len(turns) - (len(new) - turn_off[-1])))  # turns past the end: never read
        out.extend([0] * (len(new) - len(out)))
        think.extend([0.0] * (len(new) - len(think)))
        turn_off.append(len(new))
        if pc:
            stream = TokenStream(2 * index + 1, 2 * group if group >= 0 else None, length)
            keys.extend(ids.setdefault(h, len(ids)) for h in stream.block_hashes(bs, longest // bs))
            key_off.append(len(keys))
    n = len(system)
    between = None
    if closed and wl.arrival.think_time_s > 0:
        from kvsim.workloads.spec import streams

        rng = streams(sim.workload_seed)["sampling"]
        between = np.array([float(wl.arrival.think_times(rng, 1)[0]) for _ in range(n)], dtype=np.float64)
    lp = ctypes.POINTER(ctypes.c_long)

    def longs(values):
        return np.ascontiguousarray(values, dtype=np.int64)

    arrays = {name: longs(v) for name, v in (("system", system), ("turn_off", turn_off), ("new", new), ("out", out),
                                              ("key_off", key_off), ("keys", keys or [0]))}
    start_arr = np.ascontiguousarray(starts, dtype=np.float64)
    think_arr = np.ascontiguousarray(think or [0.0], dtype=np.float64)
    rc = lib.kv_engine_sessions(
        handle, n, None if closed else start_arr.ctypes.data_as(_P),
        min(int(wl.arrival.concurrency), n) if closed else 0,
        *(arrays[k].ctypes.data_as(lp) for k in ("system", "turn_off", "new", "out")), think_arr.ctypes.data_as(_P),
        arrays["key_off"].ctypes.data_as(lp) if pc else None, arrays["keys"].ctypes.data_as(lp) if pc else None,
        -1 if mml is None else int(mml), None if between is None else between.ctypes.data_as(_P))
    if rc:
        raise MemoryError("kvsim: the C engine core could not take the sessions")
    return len(ids)


def _session_stats(lib, handle, ttft: tuple[list, list]) -> dict[str, Any]:
    """What SessionWorkload.process returns: sessions started, turns sent, refused, ended at
    max_model_len, and each answered turn's TTFT by turn number, in the order they were answered."""
    counts = (ctypes.c_long * 4)()
    ids = ttft[0]
    n = (max(ids) + 1) if ids else 0
    turn_of = np.zeros(max(n, 1), dtype=np.int64)
    lib.kv_engine_session_stats(handle, counts, n, turn_of.ctypes.data_as(ctypes.POINTER(ctypes.c_long)))
    by_turn: dict[int, list[float]] = {}
    for request_id, value in zip(ids, ttft[1], strict=True):
        by_turn.setdefault(int(turn_of[request_id]), []).append(value)
    return {"sessions": counts[0], "turns": counts[1], "rejected": counts[2], "ended_at_max_model_len": counts[3],
            "ttft_s_by_turn": by_turn}
