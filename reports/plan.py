"""`kvsim plan`: the cheapest deployment that meets an SLO at a target rate.

    candidates   every combination of the search dimensions (GPU, TP, block size, memory
                 utilisation, max_num_seqs, chunked prefill; a list, so a new engine option is
                 one more Dimension), one replica each
    prune        memory: the model does not fit (simcore.memory.plan_memory);
                 latency: alone on an idle replica a request already misses the SLO (prefill of
                 its prompt for TTFT, one decode step for TPOT, both for E2EL, at the SLO's
                 percentile: a lower bound no load can beat)
    search       the max sustainable rate r1 of ONE replica (reports.capacity), cheapest-looking
                 candidates first; a candidate whose throughput bound cannot beat the cheapest
                 found so far is skipped, and one that fails at the rate it would need to beat
                 it (its floor) stops there
    size         replicas = ceil(target / r1), cost = replicas x TP x $/GPU-hour
    confirm      the best (`confirm_top`) with a full run of all replicas behind the router at
                 the target rate (one more replica if that run fails; the next candidate if
                 that fails too)

Candidates that differ only in their router share one search (one replica routes nothing); the
confirmation runs each with its own router, so a router that needs more replicas ranks lower. A
session workload is planned in sessions/s (reports.capacity.SessionRateScaler).

r1 does not depend on the target, so one search serves every --rate, and a higher target never
needs fewer replicas of a candidate. Splitting traffic over n replicas behind a least-loaded
router is at least as good as one replica at 1/n of it (queues are pooled), which is what the
confirmation run checks rather than assumes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvsim.reports.capacity import (
    SLO,
    Capacity,
    floor_grid_rate,
    max_sustainable_rate,
    rate_scaler,
    run_against,
    summary_with_goodput,
)
from kvsim.simcore import quantiles
from kvsim.simcore.errors import ConfigError, DoesNotFitError
from kvsim.simcore.specs import EngineConfig, GPUSpec, ModelSpec

# Requests per search run. The run must outlast its warm-up and hold enough tail samples:
# 600 requests leave 480 judged after the 20% warm-up (simcore.metrics.saturation), 24 of them
# above the p95, and at the rates a 70B replica sustains (a few req/s) span several minutes of
# traffic, i.e. dozens of end-to-end latencies. The confirmation runs use more (CONFIRM_REQUESTS).
SEARCH_REQUESTS = 600
CONFIRM_REQUESTS = 2000
CONFIRM_TOP = 1  # candidates confirmed with a full multi-replica run: the answer (the next one
# steps up only if its confirmation fails); --confirm-top 2 also confirms the runner-up
MAX_EXTRA_REPLICAS = 2  # replicas added when a confirmation run fails, before giving up
PLAN_TOLERANCE = 0.04  # the rate search's bracket width for planning
GUESSED_STEP = 3  # first bracket move (grid steps) when the start is guessed from searched candidates


@dataclass(frozen=True, slots=True)
class Dimension:
    """One axis of the search space: an EngineConfig field (or "gpu") and its values."""

    name: str  # column name in the plan table
    field: str  # EngineConfig field, or "gpu"
    values: tuple


def default_dimensions(gpus: Iterable[str], tps: Iterable[int] = (1, 2, 4, 8), **engine: Iterable[Any]) -> list[Dimension]:
    """GPU x TP, plus any engine field given as a list (e.g. block_size=(16, 32))."""
    dims = [Dimension("gpu", "gpu", tuple(gpus)), Dimension("tp", "tensor_parallel_size", tuple(tps))]
    for name, values in engine.items():
        if values:
            dims.append(Dimension(name, name, tuple(values)))
    return dims


@dataclass(frozen=True, slots=True)
class Candidate:
    """One replica's configuration; `values` are the searched dimensions' values."""

    model: ModelSpec
    gpu: GPUSpec
    config: EngineConfig  # data_parallel_size = 1
    values: tuple[tuple[str, Any], ...]

    @property
    def gpus_per_replica(self) -> int:
        """TP x PP: what one replica costs in GPUs."""
        return self.config.tensor_parallel_size * self.config.pipeline_parallel_size

    @property
    def label(self) -> str:
        extra = [f"{k}={v}" for k, v in self.values if k not in ("gpu", "tp")]
        return " ".join([f"{self.gpu.name} TP{self.config.tensor_parallel_size}", *extra])


def expand(model: ModelSpec, dims: list[Dimension], base: EngineConfig,
           batch_defaults: tuple[frozenset[str], str] | None = None) -> list[Candidate]:
    """Every combination of the dimensions' values; `batch_defaults` (fields, usage context):
    --engine-version's per-GPU step limits fill those fields where they are not searched
    (simcore.batch_defaults)."""
    from kvsim.simcore.batch_defaults import apply_batch_defaults
    from kvsim.simcore.catalog import get_gpu

    out = []
    for combo in itertools.product(*(d.values for d in dims)):
        values = dict(zip((d.field for d in dims), combo, strict=True))
        gpu = get_gpu(values.pop("gpu"))
        config = replace(base, data_parallel_size=1, **values)
        if batch_defaults is not None:
            config = apply_batch_defaults(config, gpu, config.resolve_model(model), batch_defaults[0] - set(values),
                                          batch_defaults[1])
        out.append(Candidate(model, gpu, config, tuple(zip((d.name for d in dims), combo, strict=True))))
    return out


# -- bounds from single steps -------------------------------------------------------------------


def _unique(values: np.ndarray) -> list:
    """np.unique(values).tolist() without numpy.ma (np.unique imports it on its first call)."""
    return sorted(set(values.tolist()))


def _percentile(values: np.ndarray, q: float) -> float:
    """float(np.percentile(values, q)), bit for bit, without numpy.ma (simcore.quantiles)."""
    return quantiles.percentiles(np.asarray(values, dtype=np.float64), (q,))[0]


def _step_s(latency, prefill_tokens: int, context: int, num_decode: int, decode_context: int, sampled: int) -> float:
    """One step's time from the latency model (the one place that knows its signature)."""
    chunks = [(prefill_tokens, context)] if prefill_tokens else []
    return latency.step_time_s(prefill_tokens + num_decode, chunks, num_decode, decode_context, sampled)


@dataclass(frozen=True, slots=True)
class Bounds:
    """What no load can beat on one replica of a candidate."""

    ttft_p95_ms: float  # p95 over requests of prefilling each prompt alone
    tpot_p95_ms: float  # p95 over requests of one decode step alone at its prompt's context (/ k + 1 speculating)
    rate_ub: float  # req/s if every token were processed at the cheapest per-token cost (or the capacity's bound)
    # per request (s): what the percentiles above are taken of, for a target at any percentile
    per_request_s: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def at(self, target) -> float | None:
        """The lower bound of a percentile target's value (ms; reports.capacity.Target): each
        request's own lower bound, so any percentile of them bounds that percentile of the run
        (order statistics are monotone). None where no bound is known (ITL)."""
        if target.percentile == 95 and target.metric in ("ttft", "tpot"):
            return self.ttft_p95_ms if target.metric == "ttft" else self.tpot_p95_ms
        values = self.per_request_s.get(target.metric)
        if values is None or not len(values):
            return None
        return 1000 * _percentile(values, target.percentile)


def single_step_bounds(candidate: Candidate, profile, prompts: np.ndarray, outputs: np.ndarray) -> Bounds:
    from kvsim.simcore.config import resolve

    config, model = candidate.config, candidate.model
    resolved = resolve(model, candidate.gpu, config)
    # the profile's own model (built once, shared with its runs), priced as the candidate's engine
    # version as its runs are (host terms: vllm-v1-async hides them, vllm-0.6 spreads them over 10 steps)
    latency = profile.latency_model(profile.path or "profile", policy=resolved.policy.overhead,
                                    engine_version=config.engine_version)
    latency.set_block_size(config.block_size)
    budget = config.resolved_max_num_batched_tokens(model) if config.enable_chunked_prefill else int(prompts.max())
    ttft_by_len: dict[int, float] = {}
    for p in _unique(prompts):
        done, total = 0, 0.0
        while done < p:
            chunk = min(budget, p - done)
            total += _step_s(latency, chunk, done, 0, 0, 1 if done + chunk == p else 0)
            done += chunk
        ttft_by_len[p] = total
    ttft = np.array([ttft_by_len[p] for p in prompts.tolist()])
    decoding = outputs > 1
    ctx = prompts[decoding] if decoding.any() else prompts
    # speculative decoding emits up to k + 1 tokens per step (its steps cost at least a decode step)
    spec = config.speculative_config
    burst = 1 + spec.num_speculative_tokens if spec is not None else 1
    tpot_by_ctx = {c: _step_s(latency, 0, 0, 1, c + 1, 1) / burst for c in _unique(ctx)}
    tpot = np.array([tpot_by_ctx[c] for c in ctx.tolist()])
    sizes = [t for t in (256, 512, 1024, 2048, 4096, 8192, 16384) if t <= budget] or [budget]
    per_token = min(_step_s(latency, t, 0, 0, 0, 0) / t for t in sizes)
    throughput_ub = 1.0 / (float(np.mean(prompts + outputs)) * per_token)
    # KV: a request holds at least its prompt's KV through each of its decode steps, and a step
    # takes at least a one-sequence decode step, so the cache's token-seconds bound the rate
    step1 = min(tpot_by_ctx.values())
    kv_seconds = float(np.mean(prompts * np.maximum(outputs - 1, 0))) * step1
    kv_ub = resolved.memory.num_gpu_tokens / kv_seconds if kv_seconds > 0 else math.inf
    # a request's end-to-end time is at least its prefill alone plus its other tokens at one
    # decode step each (k + 1 tokens a step at best when speculating)
    step_at = {c: tpot_by_ctx.get(c) or _step_s(latency, 0, 0, 1, c + 1, 1) / burst for c in _unique(prompts)}
    per_out = np.array([step_at[c] for c in prompts.tolist()])
    e2el = ttft + np.maximum(outputs - 1, 0) * per_out
    return Bounds(1000 * _percentile(ttft, 95), 1000 * _percentile(tpot, 95),
                  min(throughput_ub, kv_ub, _capacity_bound(latency, resolved, prompts, outputs)),
                  {"ttft": ttft, "tpot": tpot, "e2el": e2el})


# A run offered more than 1.03x its full-batch capacity that falls behind is overloaded
# (simcore.metrics.judge_capacity), and the capacity came within 0.97-1.03x of what overloaded
# runs complete (benchmarks/README.md, "Full-batch capacity"): no rate above this share of it passes.
CAPACITY_BOUND = 1.1


def _capacity_bound(latency, resolved, prompts: np.ndarray, outputs: np.ndarray) -> float:
    """CAPACITY_BOUND x the full-batch capacity (simcore.full_batch) of one replica serving these
    requests, a much tighter bound than the per-token one where decode steps are memory-bound;
    inf where the capacity does not describe the candidate (speculation: its acceptance comes
    from a run; pipeline stages: priced by their rounds in a run) or nothing decodes."""
    from kvsim.simcore.full_batch import describes, full_batch_capacity

    e = resolved.engine
    if e.speculative_config is not None or e.pipeline_parallel_size > 1 or not describes(resolved):
        return math.inf
    one = full_batch_capacity(latency, resolved, resolved.memory.num_gpu_tokens, prompts, outputs)
    return math.inf if one is None else CAPACITY_BOUND * one["rate"]


# -- assessing candidates ---------------------------------------------------------------------


@dataclass
class Assessment:
    """What the planner learnt about one candidate."""

    candidate: Candidate
    price: float | None  # $/GPU-hour
    status: str  # searched | memory | prefill time | decode time | no price | cost bound
    reason: str = ""
    bounds: Bounds | None = None
    capacity: Capacity | None = None
    profile: Any = field(default=None, repr=False)

    @property
    def r1(self) -> float:
        return self.capacity.max_rate if self.capacity is not None else 0.0

    def cost_per_hour(self, replicas: int) -> float:
        return replicas * self.candidate.gpus_per_replica * (self.price or math.inf)

    def cost_lower_bound(self, target: float) -> float:
        assert self.bounds is not None
        return self.cost_per_hour(math.ceil(target / self.bounds.rate_ub))


@dataclass(frozen=True, slots=True)
class SearchTask:
    """Everything one rate search needs; plain data so an executor can ship it to a worker."""

    candidate: Candidate
    profile: Any
    spec: Any  # the workload at confirmation size
    take: int  # requests per search run (RateScaler.take)
    seed: int
    slo: SLO
    start_rate: float
    tolerance: float
    rate_cap: float
    rate_floor: float  # below this the candidate cannot be the cheapest: stop searching
    first_step: int | None = None  # grid steps of the first bracket move (None: a factor of 2)


def run_search(task: SearchTask) -> Capacity:
    """The max sustainable rate of one replica (module-level so process pools can call it)."""
    c, scaler = task.candidate, rate_scaler(task.spec, task.take)
    floor = floor_grid_rate(task.rate_floor, task.tolerance)

    def evaluate(rate: float) -> dict[str, Any]:
        # at or below the floor a failure ends the search whatever its numbers: stop it once certain
        return run_against(c.model, c.gpu, c.config, scaler.at(rate), task.profile, task.seed, task.slo,
                           early_stop=rate <= floor * (1 + 1e-12))

    return max_sustainable_rate(evaluate, task.slo, task.start_rate, task.tolerance, task.rate_cap,
                                task.rate_floor, task.first_step)


def assess(
    candidates: list[Candidate], spec, take: int, slo: SLO, prices: dict[str, float], seed: int,
    profile_for: Callable[[Candidate], Any],
) -> list[Assessment]:
    """Memory and single-step pruning; no simulation runs here."""
    from kvsim.simcore.config import resolve

    lengths = rate_scaler(spec, take).lengths(np.random.SeedSequence(seed).spawn(2)[0])
    full_prompts, prompts, outputs = lengths.full_prompts, lengths.uncached_prompts, lengths.outputs
    out = []
    for c in candidates:
        price = prices.get(c.gpu.name)
        try:
            resolved = resolve(c.model, c.gpu, c.config)
        except DoesNotFitError as exc:
            out.append(Assessment(c, price, "memory", str(exc)))
            continue
        except ConfigError as exc:  # a deployment this GPU cannot run (e.g. FP8 weights on an A100)
            out.append(Assessment(c, price, "unsupported", str(exc)))
            continue
        if price is None:
            out.append(Assessment(c, None, "no price", f"no price for {c.gpu.name}: give --price {c.gpu.name}=USD"))
            continue
        served = full_prompts <= resolved.max_model_len  # longer prompts are rejected (engine.reject_reason)
        if not served.any():
            out.append(Assessment(c, price, "rejected", f"every prompt is longer than max_model_len "
                                  f"{resolved.max_model_len}: vLLM rejects them all"))
            continue
        profile = profile_for(c)
        bounds = single_step_bounds(c, profile, prompts[served], outputs[served])  # SLOs count served requests
        if lengths.requests_per_unit != 1:  # sessions: the rate is sessions/s, each several requests
            bounds = replace(bounds, rate_ub=bounds.rate_ub / lengths.requests_per_unit)
        a = Assessment(c, price, "searched", bounds=bounds, profile=profile)
        for target in slo.targets:  # the first one no load can meet prunes it
            least = bounds.at(target)
            if least is None or least <= target.limit_ms:
                continue
            a.status, a.reason = PRUNED[target.metric], _pruned_reason(target, least)
            break
        out.append(a)
    return out


PRUNED = {"ttft": "prefill time", "tpot": "decode time", "e2el": "request time"}  # status by metric


def _pruned_reason(target, least: float) -> str:
    """Why a target is out of reach on an idle replica (`least`: the bound, ms)."""
    pct = f"p{target.name.split(' p')[1]}"
    if target.metric == "ttft":
        return f"prefilling each prompt alone already gives {target.name} >= {least:,.0f} ms"
    if target.metric == "tpot":
        return f"one decode step alone already takes {least:,.1f} ms at {pct} context"
    return (f"prefill and one decode step per token alone already give {target.name} >= {least:,.0f} ms")


def _floor(a: Assessment, best: dict[float, float]) -> float:
    """The per-replica rate below which `a` costs more than the best found, for every target."""
    unit = a.cost_per_hour(1)
    floors = [t / math.floor(b / unit + 1e-9) for t, b in best.items() if b < math.inf and b >= unit]
    if any(b == math.inf for b in best.values()):
        return 0.0
    return min(floors) if floors else math.inf


def search_all(
    assessments: list[Assessment], spec, take: int, slo: SLO, seed: int, targets: list[float],
    tolerance: float, map_fn: Callable = map, batch: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Search r1 for every live candidate, cheapest-looking first, in batches handed to `map_fn`
    (builtin map, or an executor's map); skip what its bound says cannot win."""
    live = [a for a in assessments if a.status == "searched"]
    # candidates that differ only in their router run the same one-replica search (a router
    # spreads requests over replicas; one replica has none): search one, share its answer
    twins: dict[tuple, list[Assessment]] = {}
    for a in live:
        twins.setdefault(_search_key(a), []).append(a)
    pending = [group[0] for group in twins.values()]
    unit = "sessions/s" if getattr(spec, "is_session", False) else "req/s"
    best = {t: math.inf for t in targets}
    cap = 2 * max(targets)  # past twice the largest target, one replica is plenty: stop there
    done = 0
    if progress is not None:
        progress(0, len(live))
    while pending:
        found = [b.r1 / b.bounds.rate_ub for b in live if b.capacity is not None and b.r1 > 0]
        share = quantiles.median(np.asarray(found, dtype=np.float64)) if found else 0.5  # what share of its bound a replica reached
        # Cheapest-looking first (its cost if it reached `share` of its throughput bound): once
        # the likely winner is found, every other candidate only needs to show it cannot reach
        # the rate at which it would be cheaper (`_floor`), usually one run at that rate. The
        # order changes only how much is simulated: every skip is justified by a bound or a floor.
        pending.sort(key=lambda a: (_estimated_cost(a, share, targets), -a.bounds.rate_ub, a.candidate.label))
        group = []
        while pending and len(group) < batch:
            a = pending.pop(0)
            if all(a.cost_lower_bound(t) > best[t] for t in targets):
                for twin in twins[_search_key(a)]:
                    twin.status = "cost bound"
                    twin.reason = (f"even at its throughput bound ({a.bounds.rate_ub:.1f} {unit} per replica) it "
                                   f"costs more than a deployment already found")
                    done += 1
                continue
            group.append(a)
        tasks = []
        for a in group:
            floor = _floor(a, best)
            start = max(a.bounds.rate_ub * share, floor, 1e-3)  # below the floor nothing is worth a run
            tasks.append(SearchTask(a.candidate, a.profile, spec, take, seed, slo, start, tolerance, cap, floor,
                                    GUESSED_STEP if found else None))
        for first, capacity in zip(group, map_fn(run_search, tasks), strict=True):
            for a in twins[_search_key(first)]:
                a.capacity = capacity
                if capacity.below_floor:
                    a.status = "cost bound"
                    a.reason = (f"sustains under {capacity.below_floor:.2f} {unit} per replica, so it costs more "
                                "than a deployment already found")
                if capacity.max_rate > 0:
                    for t in targets:
                        best[t] = min(best[t], a.cost_per_hour(math.ceil(t / capacity.max_rate)))
                done += 1
            if progress is not None:
                progress(done, len(live))


def _search_key(a: Assessment) -> tuple:
    """What a one-replica search depends on: the candidate without its router."""
    c = a.candidate
    return (c.model.name, c.gpu.name, replace(c.config, router=EngineConfig().router),
            getattr(a.profile, "sha256", None) or id(a.profile))


def _estimated_cost(a: Assessment, share: float, targets: list[float]) -> float:
    """$/hour per req/s of target, summed over the targets, if one replica sustained `share` of
    its throughput bound."""
    rate = max(a.bounds.rate_ub * share, 1e-9)
    return sum(a.cost_per_hour(math.ceil(t / rate)) / t for t in targets)


# -- sizing, confirmation and the table --------------------------------------------------------


def confirm(a: Assessment, replicas: int, target: float, spec_confirm, seed: int, slo: SLO) -> tuple[int, dict, list[str]]:
    """Run `replicas` (then more, if needed) behind the router at the target rate."""
    from kvsim.profiles import draft_profile
    from kvsim.simcore.simulate import simulate

    c = a.candidate
    scaler = rate_scaler(spec_confirm)
    for extra in range(MAX_EXTRA_REPLICAS + 1):
        n = replicas + extra
        config = replace(c.config, data_parallel_size=n)
        workload = scaler.at(target)
        result = simulate(c.model, c.gpu, config, workload, a.profile, seed=seed,
                          draft_profile=draft_profile(c.gpu, config, a.profile))
        summary = {**summary_with_goodput(result, slo, workload, seed), "engine_core": result.record["engine_core"]}
        reasons = slo.failures(summary)
        if not reasons:
            return n, summary, []
    return n, summary, reasons


def mean_output_tokens(spec, seed: int) -> float:
    """Output tokens per unit of rate: per request, or per session of a session workload."""
    return rate_scaler(spec).lengths(np.random.SeedSequence(seed).spawn(2)[0]).output_tokens_per_unit


def rows_for_target(
    assessments: list[Assessment], target: float, spec_confirm, seed: int, slo: SLO, confirm_top: int,
    out_tokens: float,
) -> list[dict[str, Any]]:
    """One row per candidate for one target, ranked by cost. The cheapest `confirm_top` are
    confirmed with a full run; a confirmation can add replicas (so re-rank) or fail (so drop
    down), and confirming goes on until the top `confirm_top` are all confirmed."""
    feasible = [a for a in assessments if a.r1 > 0]
    replicas = {id(a): math.ceil(target / a.r1) for a in feasible}
    checked: dict[int, tuple[dict, list[str], int]] = {}

    def key(a: Assessment):
        failed = id(a) in checked and bool(checked[id(a)][1])
        n = replicas[id(a)]
        return (failed, a.cost_per_hour(n), -n * a.r1, a.candidate.label)

    while True:
        order = sorted(feasible, key=key)
        todo = [a for a in order[:confirm_top] if id(a) not in checked]
        if not todo:
            break
        a = todo[0]
        first = replicas[id(a)]
        n, summary, reasons = confirm(a, first, target, spec_confirm, seed, slo)
        replicas[id(a)] = n
        checked[id(a)] = (summary, reasons, n - first)
    ranked = []
    for a in sorted(feasible, key=key):
        row = _row(a, target, replicas[id(a)], slo)
        if id(a) in checked:
            summary, reasons, extra = checked[id(a)]
            row.update({t.column: summary.get(t.key) for t in slo.percentile_ms})
            row.update({"ttft_p95_ms": summary.get("p95_ttft_ms"), "tpot_p95_ms": summary.get("p95_tpot_ms"),
                        "confirmed": "no" if reasons else ("yes" if not extra else f"yes, +{extra} replica"),
                        "engine_core": _engine_cores(a, summary)})
            if reasons:
                row["status"] = f"confirmation failed with {replicas[id(a)]} replicas: {reasons[0]}"
            _bound_by_confirmation(row, target, replicas[id(a)], bool(reasons), extra,
                                   "sessions/s" if getattr(spec_confirm, "is_session", False) else "req/s")
        ranked.append(row)
    return target_rows(ranked, assessments, lambda a: _row(a, target, None, slo), target, out_tokens)


def target_rows(ranked: list[dict[str, Any]], searched: list[Any], unsized_row: Callable[[Any], dict[str, Any]],
                target: float, out_tokens: float) -> list[dict[str, Any]]:
    """One target's table (aggregated here, disaggregated in reports.plan_disagg): the sized rows
    in rank order, each with its $/M output tokens at the target, then a row for every candidate
    with no rate at the SLO (`r1` <= 0; `unsized_row` makes it), saying why."""
    for row in ranked:
        row["usd_per_m_output_tokens"] = row["usd_per_hour"] / (target * out_tokens * 3600 / 1e6)
    rows = list(ranked)
    for c in searched:
        if c.r1 <= 0:
            row = unsized_row(c)
            if c.status == "searched":
                row["status"] = f"no rate meets the SLO: {c.capacity.binding}" if c.capacity else "not searched"
            rows.append(row)
    return rows


def _bound_by_confirmation(row: dict[str, Any], target: float, n: int, failed: bool, extra: int,
                           unit: str = "req/s") -> None:
    """Never report a capacity the candidate's own confirmation disproved. The search's rate is one
    replica's, times n; a confirmation that needed extra replicas showed that n - 1 of them do not
    sustain the target, so n sustain less than target x n / (n - 1); one that failed at n showed even
    n do not, so no capacity is claimed at all."""
    if failed:
        row["max_rate"], row["headroom"] = None, None
    elif extra and n > 1 and row["max_rate"] is not None:
        bound = target * n / (n - 1)
        if row["max_rate"] > bound:
            row["max_rate"], row["headroom"], row["capped"] = bound, bound / target - 1, False
            row["max_rate_bound"] = f"below {bound:.3g} {unit}: {n - 1} replicas missed the target in confirmation"


def _row_label(row: dict[str, Any]) -> str:
    """A table row's candidate in words: `TP1 H100-SXM-80GB`."""
    return f"TP{row.get('tp')} {row.get('gpu')}"


def _cell_value(name: str, value: Any) -> Any:
    """A dimension's value as a table cell: a speculative config as its label, "off" for none."""
    if name != "speculative_config":
        return value
    return "off" if value is None else value.label


def _row(a: Assessment, target: float, replicas: int | None, slo: SLO) -> dict[str, Any]:
    c = a.candidate
    row: dict[str, Any] = {"target_rate": target, "model": c.model.name,
                           **{k: _cell_value(k, v) for k, v in c.values}}
    tp = c.gpus_per_replica
    if replicas is None:
        row.update({"replicas": None, "gpus": None, "usd_per_hour": None, "replica_max_rate": a.r1 or None,
                    "max_rate": None, "headroom": None, "status": a.status + (f": {a.reason}" if a.reason else "")})
    else:
        row.update({
            "replicas": replicas, "gpus": replicas * tp, "usd_per_hour": a.cost_per_hour(replicas),
            "replica_max_rate": a.r1, "max_rate": replicas * a.r1, "headroom": replicas * a.r1 / target - 1,
            "status": "ok", "vllm_serve": _serve_line(c),
        })
    row.update({"ttft_p95_ms": None, "tpot_p95_ms": None, **{t.column: None for t in slo.percentile_ms},
                "confirmed": "-", "slo": slo.spec(),
                "usd_per_gpu_hour": a.price, "capped": bool(a.capacity and a.capacity.at_least),
                # what priced its steps (none for a candidate pruned before pricing)
                "profile_source": a.profile.source if a.profile is not None else None,
                "profile_sha256": a.profile.sha256 if a.profile is not None else None,
                "engine_core": _engine_cores(a)})
    return row


def _engine_cores(a: Assessment, confirmation: dict[str, Any] | None = None) -> str | None:
    """The engine cores (simcore.cores) that ran the candidate's search and confirmation runs,
    e.g. "c" or "c+python"; None where nothing ran."""
    summaries = [p.summary for p in a.capacity.points] if a.capacity is not None else []
    if confirmation is not None:
        summaries.append(confirmation)
    cores = sorted({s["engine_core"] for s in summaries if s.get("engine_core")})
    return "+".join(cores) or None


def _serve_line(c: Candidate) -> str:
    """One replica's `vllm serve` command (reports.serve_command)."""
    from kvsim.reports.serve_command import vllm_serve_command

    return vllm_serve_command(c.model, c.gpu, c.config)


# what each profile kind's step times are, for the answer line (profiles/README.md)
PROFILE_KINDS = {
    "roofline": "roofline profile: datasheet peaks with fitted efficiencies, not measured on this GPU",
    "measured": "measured profile (kvsim profile on the GPU)",
    "calibrated": "calibrated profile (fitted to measurements of your engine)",
}


def binding_summary(assessments: list[Assessment], slo: SLO, rows: list[dict[str, Any]] = ()) -> str:
    """Why nothing passed, by constraint, and what would satisfy it (`rows`: the target's table,
    whose failed confirmations are a reason too)."""
    parts = []
    failed = [r for r in rows if str(r.get("status", "")).startswith("confirmation failed")]
    if failed:
        hint = (" (its requests are --confirm-requests: raise it)" if "run more requests" in failed[0]["status"]
                else "")
        parts.append(f"{len(failed)} candidate(s) failed their confirming run (e.g. "
                     f"{_row_label(failed[0])}: {failed[0]['status']}{hint})")
    by = {}
    for a in assessments:
        by.setdefault(a.status, []).append(a)
    if "memory" in by:
        parts.append(f"memory binds for {len(by['memory'])} candidate(s) (e.g. {by['memory'][0].reason})")
    bounded = [a for a in assessments if a.bounds is not None]
    for metric, status in PRUNED.items():
        if status not in by or not bounded:
            continue
        target = next((t for t in slo.targets if t.metric == metric and any(
            (a.bounds.at(t) or 0.0) > t.limit_ms for a in by[status])), None)
        if target is None:
            continue
        least = min(a.bounds.at(target) for a in bounded)
        if metric == "ttft":
            parts.append(f"prefill time binds: on an idle replica {target.name} is at least {least:,.0f} ms "
                         f"(a TTFT SLO of >= {least:,.0f} ms, a faster GPU or more TP would be needed)")
        elif metric == "tpot":
            parts.append(f"decode time binds: one decode step takes at least {least:,.1f} ms "
                         f"(a TPOT SLO of >= {least:,.1f} ms, a faster GPU or more TP would be needed)")
        else:
            parts.append(f"request time binds: on an idle replica {target.name} is at least {least:,.0f} ms "
                         f"(an E2EL SLO of >= {least:,.0f} ms, a faster GPU or more TP would be needed)")
    searched = [a for a in by.get("searched", []) if a.capacity is not None and a.r1 <= 0]
    if searched:
        parts.append("searched candidates fail even at low load: "
                     + "; ".join(f"{a.candidate.label}: {a.capacity.binding}" for a in searched[:3]))
    if "unsupported" in by:
        parts.append(f"{len(by['unsupported'])} candidate(s) cannot run on their GPU (e.g. {by['unsupported'][0].reason})")
    if "no price" in by:
        parts.append(f"{len(by['no price'])} candidate(s) have no price (--price GPU=USD)")
    return "; ".join(parts) or "no candidate was searched"


@dataclass
class PlanResult:
    """The plan table (one row per target x candidate) and how it was reached."""

    rows: list[dict[str, Any]]  # the table's rows, as plan() made them
    answers: list[dict[str, Any]]  # one per (model, target): the best row or why none
    assessments: dict[str, list[Assessment]]  # by model name
    num_runs: int
    context: dict[str, Any]
    _table: Any = field(default=None, repr=False)

    @property
    def table(self):
        """The rows as a pandas DataFrame, made on first use: pandas takes ~0.4 s to import, a
        third of a small plan's process, and the printed answer does not need it."""
        if self._table is None:
            import pandas as pd

            self._table = pd.DataFrame(self.rows)
        return self._table

    @table.setter
    def table(self, frame) -> None:
        self._table = frame

    def records(self) -> list[dict[str, Any]]:
        """The table's rows as `DataFrame.astype(object).to_dict("records")` gives them, missing
        values None; from the rows unless the table was made (or replaced)."""
        if self._table is not None:
            import pandas as pd

            return [{k: (None if v is None or (not isinstance(v, str | dict | list) and pd.isna(v)) else v)
                     for k, v in row.items()} for row in self._table.astype(object).to_dict("records")]
        return table_records(self.rows)


def _is_missing(v: Any) -> bool:
    """What pd.isna says of a plan row's cell: None or NaN."""
    return v is None or (isinstance(v, float | np.floating) and v != v)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool | np.bool_)


def table_records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`pandas.DataFrame(rows).astype(object).to_dict("records")` with missing values None,
    without pandas (tests/test_plan_records.py compares the two): columns in order of first
    appearance, a row's absent keys missing; a column of numbers is float64 in pandas, so all
    floats, when it holds a float or a missing value, else ints; NaN and None become None; other
    columns keep their values."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    absent = object()
    out = [dict.fromkeys(columns) for _ in rows]
    for k in columns:
        values = [row.get(k, absent) for row in rows]
        missing = [v is absent or _is_missing(v) for v in values]
        present = [v for v, m in zip(values, missing, strict=True) if not m]
        if present and all(_is_number(v) for v in present):
            as_float = any(missing) or any(isinstance(v, float | np.floating) for v in present)
            cast = float if as_float else int
        elif present and not any(missing) and all(isinstance(v, bool | np.bool_) for v in present):
            cast = bool
        else:
            cast = None
        for row, v, m in zip(out, values, missing, strict=True):
            row[k] = None if m else (cast(v) if cast is not None else v)
    return out


def refuse_unconfigurable(model: ModelSpec, candidates: list[Candidate]) -> None:
    """Raise the first candidate's ConfigError when every candidate is refused as configured (a
    --tp that divides none of the model's heads, FP8 on GPUs without it, ...): there is nothing
    to plan, and saying "nothing meets the SLO" would hide the input's mistake. Candidates that
    merely do not fit in memory are an answer (memory binds), not an error."""
    from kvsim.simcore.config import resolve

    first = None
    for c in candidates:
        try:
            resolve(c.model, c.gpu, c.config)
            return
        except DoesNotFitError:
            return
        except ConfigError as exc:
            first = first or exc
    if first is not None:
        raise ConfigError(str(first)) from None


def plan(
    models: list[ModelSpec], dims: list[Dimension], base: EngineConfig, targets: list[float], spec, slo: SLO,
    prices: dict[str, float], *, seed: int = 0, tolerance: float = PLAN_TOLERANCE,
    search_requests: int = SEARCH_REQUESTS, confirm_requests: int = CONFIRM_REQUESTS,
    confirm_top: int = CONFIRM_TOP, map_fn: Callable = map, batch: int = 1,
    profile_for: Callable[[Candidate], Any] | None = None, progress: Callable[[int, int], None] | None = None,
    batch_defaults: tuple[frozenset[str], str] | None = None,
) -> PlanResult:
    """Search, size and confirm (module docstring); deterministic for a given seed."""

    if profile_for is None:
        from kvsim.profiles import default_profile

        def profile_for(c: Candidate):
            return default_profile(c.gpu, c.config.resolve_model(c.model), c.config.tensor_parallel_size)

    spec_confirm = sized(spec, confirm_requests)
    take = min(search_requests, int(spec_confirm.num_requests))
    rows, answers, by_model, runs = [], [], {}, 0
    expanded = {model.name: expand(model, dims, base, batch_defaults) for model in models}
    for model in models:  # before any run: a model no candidate can even be configured for is bad input
        refuse_unconfigurable(model, expanded[model.name])
    for model in models:
        candidates = expanded[model.name]
        assessments = assess(candidates, spec_confirm, take, slo, prices, seed, profile_for)
        search_all(assessments, spec_confirm, take, slo, seed, targets, tolerance, map_fn, batch, progress)
        runs += sum(a.capacity.num_runs for a in assessments if a.capacity is not None)
        out_tokens = mean_output_tokens(spec_confirm, seed)
        for target in targets:
            target_rows = rows_for_target(assessments, target, spec_confirm, seed, slo, confirm_top, out_tokens)
            runs += sum(1 for r in target_rows if r["confirmed"] != "-")  # at least one run each
            rows += target_rows
            best = next((r for r in target_rows if str(r["confirmed"]).startswith("yes")), None)
            answers.append({"model": model.name, "target_rate": target, "best": best, "slo": slo.describe(),
                            **({"unit": "sessions/s"} if getattr(spec, "is_session", False) else {}),
                            "why_none": None if best else binding_summary(assessments, slo, target_rows)})
        by_model[model.name] = assessments
    from kvsim.simcore.simulate import KVSIM_VERSION

    context = {"kvsim_version": KVSIM_VERSION, "seed": seed, "slo": slo.describe(), "slo_text": slo.text(),
               "tolerance": tolerance, "search_requests": take, "confirm_requests": int(spec_confirm.num_requests),
               "rate_unit": "sessions/s" if getattr(spec, "is_session", False) else "req/s",
               "engine": base.to_dict(),  # every candidate's engine options, but for its own knobs
               "workload": spec.describe()}
    return PlanResult(rows, answers, by_model, runs, context)


def sized(spec, requests: int):
    """`spec` with at most `requests` requests: a session workload keeps whole sessions (about
    `requests` turns, at least one session)."""
    import dataclasses

    if getattr(spec, "is_session", False):
        per = spec.num_requests / int(spec.num_sessions)  # expected turns per session
        return dataclasses.replace(spec, num_sessions=max(1, min(int(spec.num_sessions), math.ceil(requests / per))))
    return dataclasses.replace(spec, num_requests=min(requests, int(spec.num_requests)))


def answer_line(answer: dict[str, Any], slo: SLO) -> str:
    best = answer["best"]
    unit = answer.get("unit", "req/s")
    head = f"{answer['model']} at {answer['target_rate']:g} {unit} with {slo.text()}: "
    if best is None:
        return head + "nothing meets the SLO. " + answer["why_none"]
    knobs = "".join(f", {k}={best[k]}" for k in best if k in _KNOBS)
    return (head + f"{best['replicas']} x TP{best['tp']} {best['gpu']}{knobs} ({best['gpus']} GPUs), "
            f"${best['usd_per_hour']:,.2f}/h, sustains "
            f"{'under ' if best.get('max_rate_bound') else 'at least ' if best.get('capped') else '~'}"
            f"{best['max_rate']:.1f} {unit} ({'under ' if best.get('max_rate_bound') else ''}"
            f"{100 * best['headroom']:+.0f}% headroom), ${best['usd_per_m_output_tokens']:.2f} per M output tokens; "
            f"confirmed by a {best['replicas']}-replica run at {answer['target_rate']:g} {unit} "
            f"(TTFT p95 {ms_text(best['ttft_p95_ms'], ',.0f')} ms, TPOT p95 {ms_text(best['tpot_p95_ms'])} ms"
            f"{_measured(best, slo)}); "
            f"step times from a "
            f"{PROFILE_KINDS.get(best.get('profile_source'), str(best.get('profile_source')) + ' profile')}")


def ms_text(value: float | None, fmt: str = ",.1f") -> str:
    """A latency for an answer line: n/a when the confirming run had none (no request gave a
    second token: no TPOT)."""
    return "n/a" if value is None or value != value else format(value, fmt)


def _measured(best: dict[str, Any], slo: SLO) -> str:
    """The confirmation's values of the targets beyond the two p95s the line always shows."""
    return "".join(f", {t.name} {best[t.column]:,.1f} ms" for t in slo.percentile_ms if best.get(t.column) is not None)


_KNOBS = ("block_size", "gpu_memory_utilization", "max_num_seqs", "enable_chunked_prefill", "kv_cache_dtype",
          "quantization", "pipeline_parallel_size", "speculative_config", "router", "kv_offloading_size")


def capacity_figure(result: PlanResult, path) -> None:
    """Sustainable rate vs GPUs for each searched candidate (n replicas x r1), targets dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(result.assessments)
    fig, axes = plt.subplots(1, len(models), figsize=(7.5 * len(models), 5), squeeze=False)
    targets = sorted({float(a["target_rate"]) for a in result.answers})
    unit = result.context.get("rate_unit", "req/s")  # sessions/s for a session workload
    for ax, model in zip(axes[0], models, strict=True):
        live = [a for a in result.assessments[model] if a.r1 > 0]
        max_gpus = 1
        for a in live:
            tp = a.candidate.gpus_per_replica
            n_max = max(1, math.ceil(max(targets) * 1.5 / a.r1))
            n = np.arange(1, n_max + 1)
            ax.plot(n * tp, n * a.r1, marker="o", markersize=3, label=a.candidate.label)
            max_gpus = max(max_gpus, n_max * tp)
        ok = result.table[(result.table["model"] == model) & result.table["confirmed"].astype(str).str.startswith("yes")]
        if len(ok):
            ax.scatter(ok["gpus"], ok["target_rate"], marker="*", s=160, color="black", zorder=5,
                       label="confirmed at target")
        for t in targets:
            ax.axhline(t, linestyle="--", color="grey", linewidth=1)
            ax.annotate(f"target {t:g} {unit}", (max_gpus, t), ha="right", va="bottom", fontsize=8, color="grey")
        ax.set_xlabel("GPUs (replicas x TP)")
        ax.set_ylabel(f"max sustainable rate ({unit}; replicas x one replica's)")
        ax.set_title(f"{model}: {result.context['slo_text']}", fontsize=10)
        ax.grid(alpha=0.3)
        if live:
            ax.legend(fontsize=8, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no candidate meets the SLO", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["Dimension", "default_dimensions", "plan", "PlanResult", "answer_line", "capacity_figure"]
