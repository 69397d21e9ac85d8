"""`kvsim plan --disagg on|auto`: disaggregated prefill/decode candidates (simcore.disagg), searched
and priced like the aggregated ones (reports.plan), so a plan can say which layout is cheaper.

    candidates   a unit = P prefill instances of TP A + D decode instances of TP B on one GPU type,
                 for every A, B in --tp and every P:D in --disagg-ratios; both pools must fit
                 (memory) and their single-step bounds must not already miss the SLO (prefill
                 alone for TTFT at TP A, one decode step alone for TPOT at TP B)
    search       the max sustainable rate of ONE unit (reports.capacity's search),
                 cheapest GPUs per unit first; a unit that could not beat the cheapest deployment
                 found so far (aggregated ones included, with --disagg auto) even at one unit per
                 target is skipped, and a search stops as soon as the unit fails at the rate it
                 would need to win (its floor)
    size         units = ceil(target / unit rate), cost = units x (P A + D B) x $/GPU-hour
    confirm      the cheapest with one run of all its units' instances (units x P prefill and
                 units x D decode instances behind the proxy) at the target rate; when that fails,
                 one more instance in the pool the failure points at (TPOT: decode; TTFT: the pool
                 requests wait longer for, prefill queue or decode admission; overloaded: the
                 busier pool), up to two; if it still fails, the next cheapest (up to three)

Scaling by whole units keeps the searched P:D ratio; a deployment between two units' sizes (an
extra decode instance only) is not searched. Each run simulates in the compiled core where it
runs both pools (simcore.fastcore_disagg; else the Python engine, seconds per candidate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvsim.reports.capacity import SLO, Capacity, RateScaler, max_sustainable_rate, summary_with_goodput
from kvsim.reports.plan import Candidate, single_step_bounds, target_rows
from kvsim.simcore.errors import ConfigError, DoesNotFitError
from kvsim.simcore.specs import EngineConfig, GPUSpec, ModelSpec

DEFAULT_RATIOS = ((1, 1), (2, 1), (1, 2))
MAX_EXTRA_INSTANCES = 2  # instances added when a confirmation run fails, before giving up
MAX_CONFIRMS = 3  # candidates confirmed per target before the plan says none passed


@dataclass
class DisaggCandidate:
    model: ModelSpec
    gpu: GPUSpec
    prefill: EngineConfig  # data_parallel_size = P
    decode: EngineConfig  # data_parallel_size = D
    price: float | None = None
    status: str = "searched"
    reason: str = ""
    capacity: Capacity | None = None
    profiles: dict[str, Any] | None = None
    rate_ub: float = math.inf

    @property
    def gpus(self) -> int:
        return self.prefill.num_gpus + self.decode.num_gpus

    @property
    def label(self) -> str:
        p, d = self.prefill, self.decode
        return (f"{self.gpu.name} {p.data_parallel_size}xTP{p.tensor_parallel_size} prefill + "
                f"{d.data_parallel_size}xTP{d.tensor_parallel_size} decode")

    @property
    def r1(self) -> float:
        return self.capacity.max_rate if self.capacity is not None else 0.0

    def cost_per_hour(self, units: int) -> float:
        return units * self.gpus * (self.price or math.inf)


def parse_ratios(text: str | None) -> list[tuple[int, int]]:
    """"P:D,P:D" -> [(P, D), ...]."""
    if text is None:
        return list(DEFAULT_RATIOS)
    out: list[tuple[int, int]] = []
    for part in text.split(","):  # '' or '1:1,' is a mistake, as in every other list (cli.options)
        try:
            p, d = (int(x) for x in part.strip().split(":"))
        except ValueError:
            raise ConfigError(f"--disagg-ratios: expected P:D pairs such as 1:1,2:1, got {part.strip()!r}") from None
        if p < 1 or d < 1 or p > 16 or d > 16:
            raise ConfigError(f"--disagg-ratios: instance counts must be from 1 to 16, got {part.strip()!r}")
        if (p, d) in out:
            raise ConfigError(f"--disagg-ratios: {p}:{d} is listed twice")
        out.append((p, d))
    return out


def candidates(models: list[ModelSpec], gpus: list[GPUSpec], tps: list[int], ratios: list[tuple[int, int]],
               base: EngineConfig) -> list[DisaggCandidate]:
    out = []
    for model in models:
        for gpu in gpus:
            for a in tps:
                for b in tps:
                    for p, d in ratios:
                        out.append(DisaggCandidate(
                            model, gpu, replace(base, tensor_parallel_size=a, data_parallel_size=p),
                            replace(base, tensor_parallel_size=b, data_parallel_size=d)))
    return out


def assess(cands: list[DisaggCandidate], spec, take: int, slo: SLO, prices: dict[str, float], seed: int) -> None:
    """Memory, price and single-step pruning (no simulation), and a throughput bound per unit."""
    from kvsim.profiles import default_profile
    from kvsim.simcore.config import resolve
    from kvsim.simcore.parallel import check_deployment

    arrays, _ = RateScaler(spec, take).draw(np.random.SeedSequence(seed).spawn(2)[0])
    prompts = np.maximum(arrays.num_prompt_tokens, 1).astype(np.int64)
    outputs = arrays.num_output_tokens.astype(np.int64)
    bounds_memo: dict[tuple, Any] = {}
    profiles_memo: dict[tuple, Any] = {}
    for c in cands:
        c.price = prices.get(c.gpu.name)
        try:
            for cfg in (c.prefill, c.decode):
                check_deployment(c.prefill.resolve_model(c.model), c.gpu, cfg)
                resolve(c.model, c.gpu, cfg)
        except DoesNotFitError as exc:
            c.status, c.reason = "memory", str(exc)
            continue
        except ConfigError as exc:
            c.status, c.reason = "unsupported", str(exc)
            continue
        if c.price is None:
            c.status, c.reason = "no price", f"no price for {c.gpu.name}: give --price {c.gpu.name}=USD"
            continue
        model = c.prefill.resolve_model(c.model)
        c.profiles = {}
        for name, cfg in (("prefill", c.prefill), ("decode", c.decode)):
            key = (c.gpu.name, model.name, model.weight_dtype, model.kv_dtype, cfg.tensor_parallel_size)
            if key not in profiles_memo:
                profiles_memo[key] = default_profile(c.gpu, model, cfg.tensor_parallel_size)
            c.profiles[name] = profiles_memo[key]
        bounds, work = {}, {}
        for name, cfg in (("prefill", c.prefill), ("decode", c.decode)):
            key = (c.gpu.name, model.name, model.weight_dtype, model.kv_dtype, cfg.tensor_parallel_size, name)
            if key not in bounds_memo:
                one = Candidate(c.model, c.gpu, replace(cfg, data_parallel_size=1), ())
                # the latency bounds of the real requests; the rate bound of this pool's share of
                # the work: prompts and one sampled token (prefill), one recomputed prompt token
                # and the outputs (decode)
                share = (prompts, np.ones_like(outputs)) if name == "prefill" else (np.ones_like(prompts), outputs)
                bounds_memo[key] = (single_step_bounds(one, c.profiles[name], prompts, outputs),
                                    single_step_bounds(one, c.profiles[name], *share).rate_ub)
            bounds[name], work[name] = bounds_memo[key]
        pruned = _out_of_reach(c, bounds, slo)
        if pruned is not None:
            c.status, c.reason = pruned
        # every request passes through both pools: the slower pool's bound bounds the unit
        c.rate_ub = min(c.prefill.data_parallel_size * work["prefill"], c.decode.data_parallel_size * work["decode"])


def _out_of_reach(c: DisaggCandidate, bounds: dict[str, Any], slo: SLO) -> tuple[str, str] | None:
    """(status, reason) of the first SLO target an idle unit already misses at the target's own
    percentile, or None. TTFT is bounded by the prefill pool's prefill alone, TPOT by the decode
    pool's step, E2EL per request by both (prefill alone, then one decode step per further token;
    the KV transfer only adds), each percentile taken of the per-request bounds (reports.plan.Bounds.at)."""
    for target in slo.targets:
        if target.metric == "e2el":
            pre, dec = bounds["prefill"].per_request_s, bounds["decode"].per_request_s
            if not all(k in d for d, k in ((pre, "ttft"), (dec, "e2el"), (dec, "ttft"))):
                continue
            least = 1000 * float(np.percentile(pre["ttft"] + dec["e2el"] - dec["ttft"], target.percentile))
        else:
            pool = "prefill" if target.metric == "ttft" else "decode"
            least = bounds[pool].at(target)
        if least is None or least <= target.limit_ms:
            continue
        if target.metric == "ttft":
            return "prefill time", (f"prefilling each prompt alone at TP{c.prefill.tensor_parallel_size} already "
                                    f"gives {target.name} >= {least:,.0f} ms")
        if target.metric == "tpot":
            return "decode time", (f"one decode step alone at TP{c.decode.tensor_parallel_size} already takes "
                                   f"{least:,.1f} ms at p{target.name.split(' p')[1]} context")
        return "request time", (f"prefill at TP{c.prefill.tensor_parallel_size} and one decode step per token at "
                                f"TP{c.decode.tensor_parallel_size} alone already give {target.name} >= {least:,.0f} ms")
    return None


def run_disagg(c: DisaggCandidate, workload, seed: int, slo: SLO, placement: str | None,
               units: int = 1, extra: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """One run of `units` units of `c` (plus `extra` prefill and decode instances) serving
    `workload`; its summary with goodput."""
    from kvsim.simcore.disagg import prepare_disagg

    configs = {"prefill": replace(c.prefill, data_parallel_size=units * c.prefill.data_parallel_size + extra[0]),
               "decode": replace(c.decode, data_parallel_size=units * c.decode.data_parallel_size + extra[1])}
    sim = prepare_disagg(c.model, c.gpu, configs, workload, c.profiles, seed=seed, placement=placement)
    return summary_with_goodput(sim.run(), slo)


def search(cands: list[DisaggCandidate], spec, take: int, slo: SLO, seed: int, targets: list[float],
           tolerance: float, placement: str | None, best: dict[float, float]) -> int:
    """The max sustainable rate of one unit of each live candidate, fewest GPUs per unit first;
    `best` ($/hour per target, aggregated deployments' included) is lowered as units are found.
    Returns the number of runs."""
    scaler = RateScaler(spec, take)
    runs = 0
    cap = 2 * max(targets)
    for c in sorted((c for c in cands if c.status == "searched"), key=lambda c: (c.gpus, c.label)):
        unit = c.cost_per_hour(1)
        if all(unit > b for b in best.values()):
            c.status, c.reason = "cost bound", "one unit costs more than a deployment already found"
            continue
        # as reports.plan._floor: a target whose best costs less than one unit cannot be beaten by any
        # number of units (and floor(b / unit) = 0 there), so it sets no floor
        finite = [t / math.floor(b / unit + 1e-9) for t, b in best.items() if b < math.inf and b >= unit]
        floor = 0.0 if any(b == math.inf for b in best.values()) else min(finite) if finite else math.inf
        if floor > c.rate_ub:
            c.status, c.reason = "cost bound", (f"even at its throughput bound ({c.rate_ub:.1f} req/s per unit) it "
                                                "costs more than a deployment already found")
            continue

        def evaluate(rate: float, c=c) -> dict[str, Any]:
            return run_disagg(c, scaler.at(rate), seed, slo, placement)

        start = max(min(c.rate_ub, cap) * 0.3, floor, 1e-3)
        c.capacity = max_sustainable_rate(evaluate, slo, start, tolerance, cap, floor)
        runs += c.capacity.num_runs
        if c.capacity.below_floor:
            c.status, c.reason = "cost bound", (f"sustains under {c.capacity.below_floor:.2f} req/s per unit, so it "
                                                "costs more than a deployment already found")
        if c.r1 > 0:
            for t in targets:
                best[t] = min(best[t], c.cost_per_hour(math.ceil(t / c.r1)))
    return runs


def rows_for_target(cands: list[DisaggCandidate], target: float, spec_confirm, seed: int, slo: SLO,
                    placement: str | None, out_tokens: float) -> tuple[list[dict[str, Any]], int]:
    """One row per candidate, cheapest first. The cheapest is confirmed with a full run, which
    can add instances (so re-rank) or fail (so the next one is confirmed), up to MAX_CONFIRMS."""
    feasible = [c for c in cands if c.r1 > 0]
    rows_by: dict[int, dict[str, Any]] = {id(c): _row(c, target, math.ceil(target / c.r1)) for c in feasible}
    confirmed: set[int] = set()

    def key(c):
        row = rows_by[id(c)]
        return (row["confirmed"] == "no", row["usd_per_hour"], -c.r1 / c.gpus, c.label)

    runs = 0
    while len(confirmed) < MAX_CONFIRMS:
        todo = [c for c in sorted(feasible, key=key)[:1] if id(c) not in confirmed]
        if not todo:
            break
        c = todo[0]
        rows_by[id(c)], n = _confirm(c, math.ceil(target / c.r1), target, spec_confirm, seed, slo, placement)
        confirmed.add(id(c))
        runs += n
    ranked = [rows_by[id(c)] for c in sorted(feasible, key=key)]
    return target_rows(ranked, cands, lambda c: _row(c, target, None), target, out_tokens), runs


def _confirm(c: DisaggCandidate, units: int, target: float, spec_confirm, seed: int, slo: SLO,
             placement: str | None) -> tuple[dict[str, Any], int]:
    """Run the deployment at the target; when it fails, add one instance to the pool the failure
    points at (TTFT: prefill; TPOT: decode; overloaded: the busier pool), up to MAX_EXTRA
    instances, before giving up. Returns its row and the runs made."""
    wl = RateScaler(spec_confirm).at(target)
    extra = [0, 0]
    runs = 0
    while True:
        summary = run_disagg(c, wl, seed, slo, placement, units, tuple(extra))
        runs += 1
        reasons = slo.failures(summary)
        if not reasons or sum(extra) >= MAX_EXTRA_INSTANCES:
            break
        pools = summary.get("pools", {})
        if reasons[0].startswith("TPOT"):
            extra[1] += 1
        elif reasons[0].startswith("TTFT"):  # where requests wait: before prefill, or for decode admission
            prefill_wait = pools.get("prefill", {}).get("p95_queue_ms") or 0.0
            decode_wait = summary.get("kv_transfer", {}).get("p95_decode_wait_ms") or 0.0
            extra[0 if prefill_wait >= decode_wait else 1] += 1
        else:
            busy = {name: pools.get(name, {}).get("utilization") or 0.0 for name in ("prefill", "decode")}
            extra[0 if busy["prefill"] >= busy["decode"] else 1] += 1
    row = _row(c, target, units, tuple(extra))
    added = " and ".join(f"+{n} {name} instance{'s' if n > 1 else ''}"
                         for n, name in zip(extra, ("prefill", "decode"), strict=True) if n)
    row.update({"ttft_p95_ms": summary.get("p95_ttft_ms"), "tpot_p95_ms": summary.get("p95_tpot_ms"),
                "p99_itl_ms": summary.get("p99_itl_ms"),
                "transfer_p95_ms": summary.get("kv_transfer", {}).get("p95_transfer_ms"),
                "confirmed": "no" if reasons else ("yes" if not added else f"yes, {added}")})
    if reasons:
        row["status"] = f"confirmation failed ({row['deployment']}): {reasons[0]}"
    return row, runs


def _row(c: DisaggCandidate, target: float, units: int | None, extra: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    extra_gpus = extra[0] * c.prefill.tensor_parallel_size + extra[1] * c.decode.tensor_parallel_size
    row: dict[str, Any] = {
        "target_rate": target, "model": c.model.name, "layout": "disagg", "gpu": c.gpu.name,
        "prefill": f"{c.prefill.data_parallel_size}xTP{c.prefill.tensor_parallel_size}",
        "decode": f"{c.decode.data_parallel_size}xTP{c.decode.tensor_parallel_size}",
        "gpus_per_unit": c.gpus, "unit_max_rate": c.r1 or None,
        "max_rate_per_gpu": (c.r1 / c.gpus) if c.r1 else None,
        "units": units,
        "deployment": None if units is None else (
            f"{units * c.prefill.data_parallel_size + extra[0]}xTP{c.prefill.tensor_parallel_size} prefill + "
            f"{units * c.decode.data_parallel_size + extra[1]}xTP{c.decode.tensor_parallel_size} decode"),
        "gpus": None if units is None else units * c.gpus + extra_gpus,
        "usd_per_hour": None if units is None else c.cost_per_hour(units) + extra_gpus * (c.price or math.inf),
        "max_rate": None if units is None else units * c.r1,  # searched units only (extra instances not counted)
        "headroom": None if units is None else units * c.r1 / target - 1,
        "ttft_p95_ms": None, "tpot_p95_ms": None, "confirmed": "-",
        "status": "ok" if units is not None else c.status + (f": {c.reason}" if c.reason else ""),
        "capped": bool(c.capacity and c.capacity.at_least),
    }
    return row


def why_none(rows: list[dict[str, Any]]) -> str:
    """Why no row of a target passed: the first (cheapest) row's own reason (its confirmation
    failed, or it was pruned), and how many candidates there were."""
    reasons = [str(r["status"]) for r in rows if r.get("status") not in (None, "ok")]
    if not reasons:
        return "no candidate was searched"
    return f"{len(rows)} candidate(s), e.g. {reasons[0]}"


def comparison(agg_best: dict[str, Any] | None, disagg_best: dict[str, Any] | None) -> str:
    """Which layout is cheaper at the target, by how much, and goodput per GPU of each."""
    def ok(row):
        return row is not None and str(row.get("confirmed", "")).startswith("yes")

    if not ok(agg_best) and not ok(disagg_best):
        return "neither layout meets the SLO"
    if not ok(disagg_best):
        return "aggregated (no disaggregated candidate meets the SLO)"
    if not ok(agg_best):
        return "disaggregated (no aggregated candidate meets the SLO)"
    a, d = agg_best["usd_per_hour"], disagg_best["usd_per_hour"]
    per_gpu_a = agg_best["replica_max_rate"] * agg_best["replicas"] / agg_best["gpus"]
    per_gpu_d = disagg_best["max_rate_per_gpu"]
    if a == d:
        head = f"same cost, ${a:,.2f}/h either way"
    else:
        winner = "disaggregated" if d < a else "aggregated"
        head = f"{winner} is cheaper: ${min(a, d):,.2f}/h vs ${max(a, d):,.2f}/h ({100 * abs(a - d) / max(a, d):.0f}% less)"
    return (f"{head}; "
            f"one replica's / unit's max req/s per GPU at the SLO {per_gpu_d:.3f} disagg vs {per_gpu_a:.3f} agg; "
            f"${disagg_best['usd_per_m_output_tokens']:.2f} vs ${agg_best['usd_per_m_output_tokens']:.2f} per M output tokens")
