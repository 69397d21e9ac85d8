"""The one entry point a notebook or the CLI calls: `simulate(...) -> Result`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.simcore.config import ResolvedConfig, resolve
from kvsim.simcore.engine import Engine
from kvsim.simcore.errors import ConfigError, KvsimError
from kvsim.simcore.latency import Profile, StepLatencyModel
from kvsim.simcore.memory import MemoryPlan
from kvsim.simcore.metrics import StepRecorder, StepTotals, judge_capacity, summarize_records
from kvsim.simcore.pipeline import PipelineLatency
from kvsim.simcore.policies import make_policy
from kvsim.simcore.profile_match import check_profile_tp
from kvsim.simcore.records import FINISHED, HIST_RELATIVE_WIDTH, RequestRecords, RunStopped, Samples
from kvsim.simcore.request import Workload
from kvsim.simcore.router import Router
from kvsim.simcore.specs import EngineConfig, GPUSpec, ModelSpec

if TYPE_CHECKING:
    import simpy

from kvsim import __version__ as KVSIM_VERSION  # noqa: E402 (simcore/_root/__init__.py, pyproject.toml)

ENGINE_CORES = ("auto", "c", "python")
AUTO_C = True  # whether --engine-core auto picks the compiled core where it applies


@dataclass
class Result:
    """Everything one run produced; `record` says how to reproduce it. The request and step
    tables are pandas frames built on first use from the compact records."""

    summary: dict[str, Any]
    records: RequestRecords  # every request that left, as columns (or running sums, beyond a cap)
    recorders: list[StepRecorder]  # the step table of each replica
    itl: Samples  # pooled inter-token latencies (exact, or binned beyond a cap)
    memory: MemoryPlan
    record: dict[str, Any]  # seed, config, model, gpu, workload, profile hash
    totals: StepTotals  # exact sums over every step of every replica
    wall_s: float = 0.0  # simulator wall time (not part of the deterministic result)
    warnings: list[str] = field(default_factory=list)
    # a disaggregated run (simcore.disagg): each recorder's (pool, instance), and the KV transfers
    step_labels: list[tuple[str, int]] | None = None
    transfers: Any = None
    _frames: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def itl_s(self) -> np.ndarray:
        """Every inter-token latency, pooled (only while the run kept them all: `itl.exact`)."""
        return self.itl.values()

    @property
    def requests(self):
        """One row per request, by id, with a `replica` column when there are several (only
        while `records.kept`: runs beyond the cap stream their rows to requests.csv instead)."""
        if "requests" not in self._frames:
            if not self.records.kept:
                raise KvsimError(f"more than {self.records.cap:,} requests: the request table is not kept in "
                                 "memory (its rows go to requests.csv with --out)")
            self._frames["requests"] = self.records.frame()
        return self._frames["requests"]

    def step_columns(self) -> dict[str, np.ndarray]:
        """The step table as numpy columns (no pandas), replica after replica."""
        tables = [r.columns_kept() for r in self.recorders]
        if len(tables) == 1:
            return tables[0]
        return {name: np.concatenate([t[name] for t in tables]) for name in tables[0]}

    @property
    def steps(self):
        """One row per step or decode span (`num_steps`), replica by replica."""
        if "steps" not in self._frames:
            self._frames["steps"] = steps_frame(self.recorders, self.step_labels)
        return self._frames["steps"]


def steps_frame(recorders: list[StepRecorder], labels: list[tuple[str, int]] | None = None):
    """The step tables of the replicas, one after the other, with `replica` first when > 1
    (with `labels`, a disaggregated run's: `pool` and `instance` first instead)."""
    frames = []
    for index, recorder in enumerate(recorders):
        steps = recorder.frame()
        if labels is not None:
            steps.insert(0, "instance", labels[index][1])
            steps.insert(0, "pool", labels[index][0])
        elif len(recorders) > 1:
            steps.insert(0, "replica", index)
        frames.append(steps)
    if len(frames) == 1:
        return frames[0]
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


@dataclass
class Simulation:
    """A wired-up run before it starts: the engine, its policy and allocator can be inspected
    (tests do) before `run()` and after it."""

    replicas: list[Engine]  # one per data-parallel replica (`engines` wires them to SimPy first)
    memory: MemoryPlan  # per replica
    latency: StepLatencyModel
    record: dict[str, Any]
    workload: Workload
    sink: Any  # what the workload sends requests to: the engine, or the router of the replicas
    config: ResolvedConfig | None = None
    warnings: list[str] = field(default_factory=list)
    started: float = 0.0
    engine_core: str = "auto"  # which engine runs it: auto, c (the compiled core) or python
    workload_seed: np.random.SeedSequence | None = None  # what the workload draws from
    progress: Callable[[int], None] | None = None
    autoscaler: Any = None  # simcore.autoscale.AutoscalingRouter (also the sink) when replicas come and go
    fleet: Any = None  # the groups of a heterogeneous fleet (prepare's `fleet`), None for one kind of replica
    _env: simpy.Environment | None = None
    _arrivals: simpy.Process | None = None

    @property
    def env(self) -> simpy.Environment:
        """The SimPy environment of the Python engine, wired on first use (the engines' step loops,
        then the workload's process, the order `prepare` always made them in): a run in the
        compiled core never imports SimPy."""
        if self._env is None:
            import simpy

            env = simpy.Environment()
            for engine in self.replicas:
                engine.env = engine.lifecycle.env = env
                env.process(engine.run())
            self._arrivals = env.process(self.workload.process(env, self.sink, self.workload_seed))
            if self.autoscaler is not None:  # after the workload: its decisions see the arrivals of their instant
                self.autoscaler.arrivals = self._arrivals
                env.process(self.autoscaler.process(env))
            self._env = env
        return self._env

    @property
    def arrivals(self) -> simpy.Process:
        """The workload's SimPy process; its value is the generation's stats."""
        self.env  # noqa: B018 (wires it)
        return self._arrivals

    @property
    def engines(self) -> list[Engine]:
        """The replicas' engines, wired to SimPy (driving or inspecting them by hand needs their
        environment); the compiled core reads `replicas` and never imports SimPy."""
        self.env  # noqa: B018 (wires it)
        return self.replicas

    @property
    def engine(self) -> Engine:
        """The first (with one replica, the only) engine."""
        return self.engines[0]

    def choose_core(self) -> tuple[str, str]:
        """(the core that runs it, why not the compiled one): the first registered core that
        supports this run (simcore.cores), or the one `engine_core` names (--exact-steps always
        means the Python reference)."""
        from kvsim.simcore import cores

        if self.engine_core == cores.PYTHON:
            return cores.PYTHON, "--engine-core python"
        if self.record["resolved"]["exact_steps"] and self.config.engine.pipeline_parallel_size == 1:
            if self.engine_core != "auto":
                raise ConfigError(f"--engine-core {self.engine_core} runs no --exact-steps: that is the "
                                  "Python engine, the reference")
            return cores.PYTHON, "--exact-steps"
        return cores.choose(self, self.engine_core, AUTO_C)

    def run(self, watch: tuple[int, Callable[[RequestRecords], Any]] | None = None) -> Result:
        """Run to the last request and collect the tables; raises if any request stalled.
        `watch`: (every, check) on the request records (`RequestRecords.watch`): a check that
        returns a value stops the run with `records.RunStopped` (its `engine_core` says which
        core ran), whichever core runs it, after the same requests."""
        from kvsim.simcore import cores

        engines, latency = self.replicas, self.latency
        core, why = self.choose_core()
        hooks = cores.Hooks(self.progress, watch)
        stats = None
        try:
            core, why, stats = cores.run_compiled(self, core, why, hooks)
            if core == cores.PYTHON:
                if self.engine_core == "auto":
                    _say_python_core_once(why)
                stats = cores.get(core).run(self, hooks)
        except RunStopped as stop:
            stop.engine_core = core
            raise
        stalled = sum(e.lifecycle.num_unfinished for e in engines)
        if stalled:  # a scheduling bug, never a user error: fail loudly rather than under-report
            raise RuntimeError(f"simulation stalled with {stalled} requests unfinished")
        records = engines[0].lifecycle.records
        records.finalize()
        for engine in engines:
            engine.recorder.finalize()
        itl = Samples.merged([e.lifecycle.itl for e in engines])
        totals = StepTotals()
        for engine in engines:
            totals.add(engine.recorder.totals)
        summary = summarize_records(records, itl, totals)
        models = list({id(e.latency): e.latency for e in engines}.values()) if self.fleet else [latency]
        summary["extrapolated_steps"] = sum(m.extrapolated.steps for m in models)  # the C core counts into `latency`
        counters: dict[str, int] = {}
        for engine in engines:
            for name, value in engine.policy.counters().items():
                counters[name] = counters.get(name, 0) + value
        if counters.get("prefix_query_tokens"):  # vLLM's "prefix cache hit rate", over prompts sharing a prefix
            summary["prefix_cache_hit_rate"] = counters["prefix_hit_tokens"] / counters["prefix_query_tokens"]
            if "offload_hit_tokens" in counters:  # the CPU tier's share: tokens loaded instead of recomputed
                summary["cpu_prefix_cache_hit_rate"] = counters["offload_hit_tokens"] / counters["prefix_query_tokens"]
            summary["prefix_cache_recomputed_tokens"] = (counters["prefix_query_tokens"] - counters["prefix_hit_tokens"]
                                                         - counters.get("offload_hit_tokens", 0))
            if len(engines) > 1:
                summary["prefix_cache_hit_rate_by_replica"] = [
                    round(c["prefix_hit_tokens"] / c["prefix_query_tokens"], 4) if c.get("prefix_query_tokens") else None
                    for c in (e.policy.counters() for e in engines)]
        for name in ("offload_loaded_blocks", "offload_stored_blocks", "offload_evicted_blocks"):
            if name in counters:
                summary[name] = counters[name]
        if "offload_stored_blocks" in counters:  # host-link traffic of the CPU tier, over every GPU of the run
            e = self.config.engine
            block_gib = (self.memory.kv_bytes_per_token * e.block_size * e.tensor_parallel_size
                         * e.pipeline_parallel_size) / 2**30
            summary["offload_stored_gib"] = counters["offload_stored_blocks"] * block_gib
            summary["offload_loaded_gib"] = counters["offload_loaded_blocks"] * block_gib
        if "offload_wait_s" in counters and records.kept:  # issue 25: where a CPU-tier run's TTFT goes
            summary["ttft_split_ms"] = ttft_split_ms(records.columns(), counters["offload_wait_s"])
        if engines[0].spec_cost is not None:
            summary.update(speculative_summary(counters, [e.spec_cost for e in engines]))
        warnings = list(self.warnings)
        extrapolated = sum(m.extrapolated.steps for m in models)  # a fleet: every group's model
        if extrapolated:
            tables = {name for m in models for name in m.extrapolated.tables}
            warnings.append(
                f"{extrapolated} of {totals.num_steps} steps needed values outside the "
                f"profiled grid ({', '.join(sorted(tables))})"
            )
        described = self.workload.describe() if stats is None else self.workload.describe(stats)
        turn_summary = getattr(self.workload, "turn_summary", None)  # sessions: TTFT by turn
        if turn_summary is not None:
            summary.update(turn_summary(stats))
        record = {**self.record, "workload": described, "resolution": {
            "itl": itl.resolution,
            "requests": "exact" if records.kept else (
                f"running sums and histograms, relative bin width {HIST_RELATIVE_WIDTH:.2g} "
                f"(more than {records.cap:,} requests)"),
            "steps": "every step" if not any(e.recorder.coalesced for e in engines) else (
                f"at most {engines[0].recorder.cap:,} rows per replica, adjacent rows coalesced"),
        }}
        if any(e.num_holds for e in engines):  # see Engine.hold_arrivals
            record["resolution"]["waiting"] = (
                f"arrivals held in the workload while {engines[0].hold_at:,} requests waited (timelines "
                "unchanged; steps' num_waiting counts only the requests inside the engine)")
        if len(engines) > 1:
            summary["num_replicas"] = len(engines)
        capacity = self._full_batch_capacity(records, counters, summary)
        if capacity is not None:  # req/s over the replicas; the batch it assumes, per replica
            summary["full_batch_capacity"], summary["full_batch_seqs"] = capacity["rate"], capacity["batch"]
            judge_capacity(summary, capacity["rate"])
        if self.autoscaler is not None:
            end_s = records.max_finish_s if records.num_left else 0.0  # counted as rows left: any run length
            record["autoscale"] = {"config": self.autoscaler.config.to_dict(), **self.autoscaler.finish(end_s)}
            if capacity is not None:  # the pool's ceiling against the traffic's peak (simcore.autoscale_capacity)
                from kvsim.simcore.autoscale_capacity import pool_check
                from kvsim.simcore.metrics import CAPACITY_MARGIN

                groups = capacity["groups"]
                figures, checks = pool_check(capacity["rate"], [g["rate"] for g in groups], [g["count"] for g in groups],
                                             [g["batch"] for g in groups], records.columns()["arrival_s"],
                                             self.autoscaler.config, CAPACITY_MARGIN)
                summary.update(figures)
                warnings += checks
            if self.fleet:  # each replica's hours (its group's price and GPUs make the fleet's $)
                record["autoscale"]["replica_hours"] = [r.paid_s / 3600.0 for r in self.autoscaler.replicas]
        record["engine_core"] = core
        if why:
            record["engine_core_reason"] = why
        return Result(summary, records, [e.recorder for e in engines], itl, self.memory, record, totals,
                      time.perf_counter() - self.started, warnings)


    def _full_batch_groups(self, records, counters: dict[str, int],
                           summary: dict[str, Any]) -> list[dict[str, Any]] | None:
        """simcore.full_batch's capacity of one replica of each of the run's groups (one group
        outside a --fleet), with its count of replicas ("count"), where its steady state describes
        the run: vLLM's paged continuous batching, one sequence per request, exact request rows;
        None otherwise. An autoscaled run's groups are its pool (max_replicas replicas). With
        pipeline stages the step is simcore.pipeline's round of micro-batches (one token per
        sequence per round); speculating, the run's spec-decode metrics (`speculative_summary`)
        say what a step verifies and emits."""
        from kvsim.simcore.full_batch import (
            computed_share,
            declared_shared,
            describes,
            first_admission_hits,
            full_batch_capacity,
            served_lengths,
        )

        cfg = self.config
        if cfg is None or not describes(cfg) or getattr(self.workload, "turn_summary", None) is not None:
            return None
        lengths = served_lengths(records)
        if lengths is None:
            return None
        prompts, outputs = lengths
        hits = first_admission_hits(counters.get("prefix_hit_tokens", 0) + counters.get("offload_hit_tokens", 0),
                                    len(prompts), self._readmissions(records))
        share = computed_share(hits, prompts)
        shared = declared_shared(self.workload, cfg.engine.block_size, hits / len(prompts))
        speculation = None
        if cfg.engine.speculative_config is not None:
            if not summary.get("spec_num_drafts"):
                return None
            speculation = (self.replicas[0].spec_cost, summary["spec_num_draft_tokens"] / summary["spec_num_drafts"],
                           summary["spec_mean_acceptance_length"])
        if self.fleet:  # each group's replicas at their own GPU's capacity (a fleet has no speculation or PP)
            groups, index = [], 0
            for group_cfg, _profile, count in self.fleet:
                one = full_batch_capacity(self.replicas[index].latency, group_cfg, group_cfg.memory.num_gpu_tokens,
                                          prompts, outputs, share, shared=shared)
                if one is None:
                    return None
                groups.append({**one, "count": count})
                index += count
            return groups
        one = full_batch_capacity(self.latency, cfg, self.memory.num_gpu_tokens, prompts, outputs, share,
                                  speculation=speculation, shared=shared)
        return None if one is None else [{**one, "count": len(self.replicas)}]

    def _full_batch_capacity(self, records, counters: dict[str, int], summary: dict[str, Any]) -> dict[str, Any] | None:
        """The run's replicas' full-batch capacity together ("rate", req/s), the first group's full
        batch ("batch") and each group's ("groups": _full_batch_groups'), or None where the
        capacity does not describe the run."""
        groups = self._full_batch_groups(records, counters, summary)
        return None if groups is None else {**self._pool_capacity(groups), "groups": groups}

    def _pool_capacity(self, groups: list[dict[str, Any]]) -> dict[str, Any]:
        """The replicas' capacity together (req/s) and the first group's full batch. Round-robin
        gives every replica the same share of the arrivals, whatever its speed: a fleet keeps up
        only while its slowest replica does; a load-aware router (and the autoscaler's, which
        sends each request to the least-loaded active replica) fills each."""
        if len(groups) == 1:
            return {**groups[0], "rate": groups[0]["rate"] * groups[0]["count"]}
        rates = [g["rate"] for g in groups for _ in range(g["count"])]
        if self.autoscaler is None and self.config.engine.router == "round-robin":
            return {**groups[0], "rate": min(rates) * len(rates)}
        return {**groups[0], "rate": sum(rates)}

    def _readmissions(self, records) -> int:
        """Admissions after the first of the finished requests: their recompute preemptions (a
        swapped-out request is swapped back in, not admitted; where the swap space is full vLLM
        recomputes instead, which these rows cannot tell: counted as none)."""
        from kvsim.simcore.records import FINISHED

        if self.config.engine.preemption_mode == "swap":
            return 0
        cols = records.columns()
        return int(cols["num_preemptions"][cols["status"] == FINISHED].sum(dtype=np.int64))


def speculative_summary(counters: dict[str, int], costs: list[Any]) -> dict[str, Any]:
    """vLLM's spec-decode metrics (`vllm/v1/spec_decode/metrics.py`): mean acceptance length =
    1 + accepted / drafts, draft acceptance rate = accepted / draft tokens, acceptance per
    position; plus the share of engine time spent drafting and in the target's passes, over
    every replica's pricer."""
    drafts, tokens = counters.get("spec_num_drafts", 0), counters.get("spec_num_draft_tokens", 0)
    accepted = counters.get("spec_num_accepted_tokens", 0)
    per_position = []
    i = 0
    while f"spec_drafted_at_{i}" in counters:
        n = counters[f"spec_drafted_at_{i}"]
        per_position.append(counters[f"spec_accepted_at_{i}"] / n if n else None)
        i += 1
    draft_ms = sum(c.draft_ms for c in costs)
    verify_ms = sum(c.verify_ms for c in costs)
    busy = verify_ms + draft_ms
    return {
        "spec_num_drafts": drafts, "spec_num_draft_tokens": tokens, "spec_num_accepted_tokens": accepted,
        "spec_mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "spec_draft_acceptance_rate": accepted / tokens if tokens else None,
        "spec_acceptance_per_position": per_position,
        "spec_draft_time_share": draft_ms / busy if busy else None,
        "spec_verify_time_share": verify_ms / busy if busy else None,
    }


_SAID_PYTHON_CORE = False


V1_ENGINES = ("vllm-v1", "vllm-v1-async")
# vLLM V1's scheduler preempts by recompute only; vLLM 0.8-0.10 ran its V0 engine when given
# --preemption-mode, and V0 left with 0.11 (vllm-project/vllm issue #18115, 2025-07-28).
V1_SWAP_WARNING = ("--preemption-mode swap with {version}: vLLM V1 preempts by recompute only (0.8-0.10 fell "
                   "back to the V0 engine for --preemption-mode; vLLM issue #18115), so no V1 release ran this; "
                   "kvsim swaps as V0 did, at V1's step costs (--engine-version vllm-v0 or vllm-0.6 for V0's)")


def _say_python_core_once(why: str) -> None:
    """One stderr line per process when the compiled core is missing from this install (not when a
    run merely needs the Python core): the user pays 20-80x and should know why."""
    global _SAID_PYTHON_CORE
    from kvsim.simcore import ccore

    if _SAID_PYTHON_CORE or ccore.library() is not None:
        return
    _SAID_PYTHON_CORE = True
    print(f"kvsim: note: the Python core runs ({ccore.unavailable_reason()}); it is {ccore.SLOWDOWN} than "
          "the compiled core: reinstall kvsim where a C compiler is available", file=sys.stderr)


def prepare(
    model: ModelSpec,
    gpu: GPUSpec,
    config: EngineConfig | ResolvedConfig,
    workload: Workload,
    profile: Profile,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    exact_steps: bool = False,
    stream: Callable[[str, dict[str, np.ndarray]], None] | None = None,
    engine_core: str = "auto",
    draft_profile: Profile | None = None,
    autoscale: Any = None,
    fleet: list[tuple[ResolvedConfig, Profile, int]] | None = None,
    attainment: tuple[float, float, float | None] | None = None,
) -> Simulation:
    """Validate the inputs (`config` as given, or already resolved by the caller) and wire the
    engine, policy and workload; nothing runs yet. `exact_steps` runs one event per engine step
    (the reference mode) instead of pricing unchanged decode spans as one event. `stream(table,
    columns)` receives the rows of "requests" or "steps" that the run cannot keep in memory
    (past the caps of simcore.records / simcore.metrics), so a caller can write them out.
    `draft_profile`: the draft model's profile (speculative decoding with method draft_model).
    `fleet`: a heterogeneous fleet (simcore/fleet.py): groups of (resolved config, profile, replicas),
    each replica priced and sized by its group, all behind one router; `config` and `profile` are
    the first group's. `attainment`: (hour_s, ttft_slo_ms, tpot_slo_ms or None): count SLO
    attainment per hour as requests leave (simcore.autoscale.run_attainment; any run length)."""
    started = time.perf_counter()
    if engine_core not in ENGINE_CORES:
        raise ConfigError(f"--engine-core must be one of {', '.join(ENGINE_CORES)}, got {engine_core!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"--seed must be an integer >= 0, got {seed!r}")
    check_span = getattr(workload, "check_span", None)  # a span float64 time resolves (workloads.arrivals)
    if check_span is not None:
        check_span()
    if isinstance(config, ResolvedConfig):
        assert config.model == config.engine.resolve_model(model) and config.gpu == gpu, (
            "resolved for another model or GPU")
        cfg = config
    else:
        cfg = resolve(model, gpu, config)
    config, memory, max_model_len = cfg.engine, cfg.memory, cfg.max_model_len
    check_profile_tp(profile, config.tensor_parallel_size)  # as `kvsim run --profile` (profiles.lookup)
    for group_cfg, group_profile, _ in fleet or ():
        check_profile_tp(group_profile, group_cfg.engine.tensor_parallel_size)
    latency = profile.latency_model(profile.path or "profile", policy=cfg.policy.overhead,
                                    engine_version=config.engine_version)  # built once per run
    host_source, host_terms = latency.host_source, latency.host.to_dict()
    warnings = []
    if not latency.set_block_size(config.block_size):
        warnings.append(
            f"profile has no decode table for block size {config.block_size}; using "
            f"{latency.decode_block_size}"
        )
    if (config.preemption_mode == "swap" and config.engine_version in V1_ENGINES
            and cfg.policy.name == "continuous" and cfg.policy.allocator == "paged"):
        warnings.append(V1_SWAP_WARNING.format(version=config.engine_version))
    if config.pipeline_parallel_size > 1:  # stages on different micro-batches (simcore.pipeline)
        latency = PipelineLatency(latency, gpu, config.tensor_parallel_size,
                                  config.pipeline_parallel_size, model.hidden_size, model.dtype_bytes)
        exact_steps = True  # a round is priced per step; decode spans price single-stage steps
    step_by_step = exact_steps  # the Python engine's steps, one event each
    if config.data_parallel_size > 1 and config.router == "prefix-aware":
        # its scores read each replica's KV use at an arrival; a decode span applies its steps' KV
        # only when it ends, so the router would see another state than step-by-step runs do
        # (the compiled core always steps one by one: it may still run it)
        step_by_step = True
    # an autoscaler on the kv metric reads each replica's KV use at its decisions; a decode span applies
    # its steps' KV only when it ends, so those replicas step one event per step (the record keeps what
    # was asked: the compiled core, which always steps so, still runs it)
    step_exactly = step_by_step or (autoscale is not None and autoscale.metric == "kv")
    spec_cost = _speculative_cost(cfg, latency, draft_profile)  # the first replica's; each has its own
    workload_seed, engine_seed = np.random.SeedSequence(seed).spawn(2)
    dp = config.data_parallel_size if autoscale is None else autoscale.max_replicas
    if fleet is not None:  # every replica's group: its resolved config, latency model and memory plan
        if spec_cost is not None or config.pipeline_parallel_size > 1:
            raise ConfigError("--fleet runs replicas of fixed groups: not with speculative decoding or --pp")
        groups = []
        for group_cfg, group_profile, count in fleet:
            group_latency = latency if group_cfg is cfg and group_profile is profile else \
                group_profile.latency_model(group_profile.path or "profile", policy=group_cfg.policy.overhead,
                                            engine_version=group_cfg.engine.engine_version)
            group_latency.set_block_size(group_cfg.engine.block_size)
            groups += [(group_cfg, group_latency)] * count
        dp = len(groups)
        if autoscale is not None and autoscale.max_replicas != dp:  # the pool is the fleet (simcore.autoscale)
            raise ConfigError(f"--autoscale over a --fleet scales its {dp} replicas: --max-replicas must be {dp} "
                              f"(or left out), got {autoscale.max_replicas}")
    else:
        groups = None
    policy_seeds = [engine_seed] if dp == 1 else engine_seed.spawn(dp)
    done_by_replica = [0] * dp

    def replica_progress(index: int) -> Callable[[int], None] | None:
        if progress is None:
            return None

        def report(num_done: int) -> None:
            done_by_replica[index] = num_done
            progress(sum(done_by_replica))

        return report

    records = RequestRecords()  # one table for every replica
    records.num_replicas = dp
    if attainment is not None:
        records.count_attainment(*attainment)
    if stream is not None:
        records.spill = lambda columns: stream("requests", columns)
    engines = []
    for index in range(dp):
        # each replica its own pricer: it keeps the breakdown of the step its recorder asks about next
        cost = spec_cost if index == 0 or spec_cost is None else spec_cost.fresh()
        r_cfg, r_latency = groups[index] if groups is not None else (cfg, latency)
        if index and type(r_latency) is PipelineLatency:  # its own rounds: the step its engine prices last
            r_latency = r_latency.fresh()
        engine = Engine(None, r_latency, r_cfg.max_model_len, r_cfg.swap_block_s, replica_progress(index),
                        step_exactly, cost)
        engine.attach(make_policy(r_cfg, np.random.default_rng(policy_seeds[index])))
        engine.lifecycle.records, engine.lifecycle.replica = records, index
        recorder = engine.recorder
        recorder.kv_capacity = r_cfg.memory.num_gpu_tokens  # the regime's sums (reports.regime)
        recorder.kv_unit = r_cfg.memory.block_size if r_cfg.policy.allocator == "paged" else 1
        if stream is not None:
            recorder.spill = _step_spill(stream, index if dp > 1 else None)
        engines.append(engine)
    autoscaler = None
    if autoscale is not None:  # max_replicas engines; the autoscaler decides which serve (simcore.autoscale)
        from kvsim.simcore.autoscale import AutoscalingRouter

        if config.data_parallel_size != 1:
            raise ConfigError("--autoscale sizes the replicas itself: give --min-replicas / --max-replicas, not --dp")
        if groups is None:
            cold, gpus = (autoscale.check_cold_start(memory.weights_bytes_per_gpu),
                          config.tensor_parallel_size * config.pipeline_parallel_size)
        else:  # a fleet: each replica's cold start loads its own GPU's weights; billed for its own GPUs
            cold = [autoscale.check_cold_start(g.memory.weights_bytes_per_gpu) for g, _ in groups]
            gpus = [g.engine.tensor_parallel_size * g.engine.pipeline_parallel_size for g, _ in groups]
        autoscaler = AutoscalingRouter(engines, autoscale, cold, gpus)
        sink = autoscaler
    else:
        sink = engines[0] if dp == 1 else Router(engines, config.router)
    record = {
        "kvsim_version": KVSIM_VERSION,
        "seed": seed,
        "model": model.to_dict(),
        "gpu": {"name": gpu.name, "memory_gib": gpu.memory_gib},
        "config": config.to_dict(),
        # what the options left open resolved to, and how the run stepped (same results either way)
        "resolved": {"max_model_len": max_model_len, "max_num_batched_tokens": cfg.max_num_batched_tokens,
                     "exact_steps": exact_steps},
        "policy": {"name": cfg.policy.name, "allocator": cfg.policy.allocator, "models": cfg.policy.models,
                   "scheduler": engines[0].policy.name},
        "profile": {
            "path": profile.path, "sha256": profile.sha256, "source": profile.source,
            "label": profile.label,
        },
        # which vLLM version the steps are priced and scheduled as, and the host terms used
        "engine": {"version": config.engine_version, "host_overhead_from": host_source,
                   "host_overhead_ms": host_terms},
        "memory": memory.to_dict(),
    }
    if fleet is not None:
        record["fleet"] = [{"gpu": g.gpu.name, "tp": g.engine.tensor_parallel_size, "replicas": n,
                            "kv_cache_tokens": g.memory.num_gpu_tokens, "max_num_seqs": g.engine.max_num_seqs,
                            "max_num_batched_tokens": g.engine.resolved_max_num_batched_tokens(g.model),
                            "profile": {"path": p.path, "sha256": p.sha256, "source": p.source, "label": p.label}}
                           for g, p, n in fleet]
    if draft_profile is not None and spec_cost is not None and spec_cost.draft is not None:
        record["draft_profile"] = {"path": draft_profile.path, "sha256": draft_profile.sha256,
                                   "source": draft_profile.source, "label": draft_profile.label}
    sim = Simulation(engines, memory, latency, record, workload, sink, cfg, warnings, started,
                     engine_core, workload_seed, progress, autoscaler)
    sim.fleet = fleet
    return sim


def _speculative_cost(cfg: ResolvedConfig, latency, draft_profile: Profile | None):
    """The pricer of a speculative engine's steps (None without --speculative-config)."""
    spec = cfg.engine.speculative_config
    if spec is None:
        return None
    from kvsim.simcore.speculative_cost import SpeculativeStepCost

    draft = None
    if spec.method == "draft_model":
        if draft_profile is None:
            raise ConfigError(f"--speculative-config method draft_model needs a profile of {spec.model} "
                              "(the draft is priced from its own profile)")
        draft = draft_profile.latency_model(draft_profile.path or "draft profile", policy=cfg.policy.overhead)
        draft.set_block_size(cfg.engine.block_size)
    return SpeculativeStepCost(latency, spec, cfg.model, draft)


def _step_spill(stream: Callable[[str, dict[str, np.ndarray]], None], replica: int | None):
    if replica is None:
        return lambda columns: stream("steps", columns)
    return lambda columns: stream("steps", {"replica": np.full(len(columns["start_s"]), replica), **columns})


def simulate(
    model: ModelSpec,
    gpu: GPUSpec,
    config: EngineConfig | ResolvedConfig,
    workload: Workload,
    profile: Profile,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    exact_steps: bool = False,
    stream: Callable[[str, dict[str, np.ndarray]], None] | None = None,
    engine_core: str = "auto",
    draft_profile: Profile | None = None,
    autoscale: Any = None,
    attainment: tuple[float, float, float | None] | None = None,
) -> Result:
    """Simulate one engine replica serving `workload`; deterministic for a given seed.
    `exact_steps=True`: one SimPy event per engine step (the reference the fast path equals).
    `engine_core`: "c" runs the compiled core (an error where it does not apply), "python" the
    Python engine, "auto" the core where it applies (the run's record says which ran, and why)."""
    return prepare(model, gpu, config, workload, profile, seed, progress, exact_steps, stream, engine_core,
                   draft_profile, autoscale, attainment=attainment).run()


def ttft_split_ms(cols: dict[str, np.ndarray], load_wait_s: float) -> dict[str, float]:
    """Mean time to first token of the finished requests split three ways (ms): waiting in the
    queue, waiting for KV loaded from the CPU tier (`load_wait_s`: their loads, start to ready,
    before they were first scheduled; a load queued on the host link counts from its start), and
    from first scheduled to first token (prefill, its chunks, and any preemption in between)."""

    done = cols["status"] == FINISHED
    n = int(done.sum())
    if not n:
        return {}
    waited = float(np.mean(cols["first_scheduled_s"][done] - cols["arrival_s"][done]))
    prefill = float(np.mean(cols["first_token_s"][done] - cols["first_scheduled_s"][done]))
    load = load_wait_s / n
    return {"queueing": (waited - load) * 1000, "load": load * 1000, "prefill": prefill * 1000}
