"""Fit kvsim to a user's own measurements (`kvsim calibrate`) and check a profile against them
(`kvsim profile check`).

A measurements file has one row per batch run: `tp, batch_size, input_len, output_len` and at least one
of `prefill_ms` (the whole batch's prefill: until the last of its requests has its first token, what
`vllm bench latency --output-len 1` reports), `decode_ms` (mean time per output token after the
first), `latency_ms` (the whole batch, as `vllm bench latency` reports). kvsim prices a row exactly as

    kvsim run --workload fixed-batch --num-requests B --input-len P --output-len O \
        --max-num-seqs max(256, B) --tp N --profile PROFILE

would: B identical requests arrive at t = 0 and the engine schedules them (chunked prefill under the
default token budget); prefill_ms = the last first token (max TTFT), decode_ms = mean TPOT,
latency_ms = the makespan.

Because every request arrives at once, the schedule does not depend on step times, so each step's time is
linear in the calibrated parameters

    step_ms = s_gemm * (linear + LM head) + s_attn * attention + s_coll * collectives
              + host_step + host_rank * (tp - 1) + host_seq * seqs
              + host_prefill_step * [prefill] + host_prefill_token * prefill_tokens

and so is every row's prefill / decode / latency (sums of step times). The fit is least squares on relative
error with non-negative parameters and a faint pull (1e-8, relative) towards the profile's own values.

An engine that hides CPU work behind the GPU's step (`vllm-v1-async`: profiles/host.py, HostOverhead's
hidden terms) adds to a step only the excess of that work over the step, and all of it to the first step
after an idle engine. Batch rows cannot tell hidden work from the step it hides behind, so the hidden
terms are not fitted: the engine's default ones at the row's TP price every row, their excess (at the
profile's kernel times: with scalars freed, at scalars 1) is a known offset of each row, the visible
terms are fitted to the rest, and the calibrated profile carries both, saying so in its provenance.

What the rows cannot identify is not fitted. The three scalars are pinned at 1 unless freed
(`free_scalars`): kernels and collectives have independent evidence (the roofline is fitted to
measured operator timings, the collectives are measured NCCL tables), and freeing them against a few
end-to-end rows trades them off against the host terms (issue 27: fitted on one TP, the collectives
scalar fell to its floor while 24 us per prompt token moved into "host"). A term whose column is
zero in every row (prefill terms from decode-only rows, collectives at TP 1, host_rank from one TP)
or non-zero in one configuration only stays at the profile's value and is reported as not
identifiable (host_rank excepted: at one TP its sum with host_step is fitted and split as the
default engine's line splits it, `_prior_shaped_rank`); of terms the rows see only together (the design matrix loses no rank without each),
the first is fitted for all of them and the others are reported with its name; a file with fewer
distinct points (tp, batch, lengths, quantity) than free terms is refused. Leave-one-out leaves out every row of one
configuration, so repeated rows cannot vouch for each other.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.simcore.errors import KvsimError
from kvsim.simcore.latency import Profile, StepLatencyModel, parse_profile
from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION, ENGINE_PRESETS, EngineConfig, GPUSpec, ModelSpec

QUANTITIES = ("prefill_ms", "decode_ms", "latency_ms")
KEYS = ("tp", "batch_size", "input_len", "output_len")
PARAMS = ("s_gemm", "s_attn", "s_coll", "host_step", "host_rank", "host_seq", "host_prefill_step",
          "host_prefill_token")
PRIOR_WEIGHT = 1e-8
# Typical size of each parameter: the prior's pull is relative to max(|prior|, this).
TYPICAL = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.1, 1.0, 1e-3])
# Lower bounds: kernels and collectives at most 2x faster than the fitted roofline (already at
# 67-84% of datasheet peak for GEMMs, 64% for FlashAttention: faster would beat the datasheet);
# host terms >= 0.
LOWER = np.array([0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
MAX_ROWS = 10_000
SCALARS = ("s_gemm", "s_attn", "s_coll")  # pinned at 1 unless freed: they have measured evidence
# A free term is identifiable when dropping its (unit-norm) column lowers the rank of the relative
# design matrix; singular values below this share of the largest count as zero.
RANK_TOL = 1e-7


class MeasurementError(KvsimError):
    """A measurements file kvsim cannot use."""


@dataclass(frozen=True, slots=True)
class Measurement:
    line: int  # 1-based line in the file (header = 1)
    tp: int
    batch_size: int
    input_len: int
    output_len: int
    measured: dict[str, float]  # quantity -> ms, only those present


def _int(value: str, name: str, where: str) -> int:
    try:
        f = float(value)
    except ValueError:
        raise MeasurementError(f"{where}: {name} {value!r} is not a number") from None
    if not math.isfinite(f) or f != int(f) or f < 1:
        raise MeasurementError(f"{where}: {name} must be an integer >= 1, got {value!r}")
    return int(f)


def read_measurements(path: str | Path) -> tuple[list[Measurement], str]:
    """Rows of a measurements CSV and the file's sha256; MeasurementError names file, line, column."""
    path = Path(path)
    try:
        from kvsim.simcore.userfiles import read_bytes

        blob = read_bytes(path, "measurements file")
        text = blob.decode("utf-8-sig")
    except FileNotFoundError:
        raise MeasurementError(f"{path}: no such measurements file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MeasurementError(f"{path}: not a readable CSV file ({exc})") from None
    try:
        reader = csv.DictReader(text.splitlines())
        header = [h.strip() for h in (reader.fieldnames or [])]
        raw_rows = list(reader)
    except csv.Error as exc:
        raise MeasurementError(f"{path}: not a readable CSV file ({exc})") from None
    if not header:
        raise MeasurementError(f"{path}: is empty; it needs a header row: {', '.join(KEYS)} and one or more of "
                               f"{', '.join(QUANTITIES)}")
    if len(header) == 1 and header[0].count(";") >= len(KEYS) - 1:  # Excel's export where "," is a decimal mark
        raise MeasurementError(f"{path}: columns separated by ';'; kvsim reads comma-separated values")
    twice = [h for i, h in enumerate(header) if h and h in header[:i]]
    if twice:  # csv.DictReader would keep the last such column and drop the other silently
        raise MeasurementError(f"{path}: column {twice[0]!r} appears twice in the header")
    missing = [k for k in KEYS if k not in header]
    if missing:
        raise MeasurementError(f"{path}: missing column {missing[0]!r} (need {', '.join(KEYS)})")
    given = [q for q in QUANTITIES if q in header]
    if not given:
        raise MeasurementError(f"{path}: needs at least one of the columns {', '.join(QUANTITIES)}")
    if not raw_rows:
        raise MeasurementError(f"{path}: no measurement rows")
    if len(raw_rows) > MAX_ROWS:
        raise MeasurementError(f"{path}: {len(raw_rows)} rows; at most {MAX_ROWS} are accepted")
    rows = []
    for i, raw in enumerate(raw_rows, start=2):
        raw = {(k or "").strip(): (v or "").strip() if isinstance(v, str) else v for k, v in raw.items()}
        if None in raw or "" in raw and raw[""]:
            raise MeasurementError(f"{path}:{i}: more values than columns")
        if None in raw.values():  # csv.DictReader fills a short row's missing cells with None
            given_cells = sum(v is not None for v in raw.values())
            raise MeasurementError(f"{path}:{i}: fewer values than columns ({given_cells} of {len(header)})")
        where = f"{path}:{i}"
        keys = {k: _int(raw.get(k) or "", k, where) for k in KEYS}
        if keys["tp"] & (keys["tp"] - 1):
            raise MeasurementError(f"{where}: tp must be a power of two, got {keys['tp']}")
        measured = {}
        for q in given:
            v = raw.get(q) or ""
            if v == "":
                continue
            try:
                ms = float(v)
            except ValueError:
                raise MeasurementError(f"{where}: {q} {v!r} is not a number") from None
            if not math.isfinite(ms) or ms <= 0 or ms > 1e8:
                raise MeasurementError(f"{where}: {q} must be a positive, finite time in ms, got {v!r}")
            measured[q] = ms
        if not measured:
            raise MeasurementError(f"{where}: no value in {', '.join(given)}")
        if "decode_ms" in measured and keys["output_len"] < 2:
            raise MeasurementError(f"{where}: decode_ms needs output_len >= 2")
        rows.append(Measurement(i, measured=measured, **keys))
    return rows, hashlib.sha256(blob).hexdigest()


def check_rows_fit(rows: list[Measurement], model: ModelSpec, path: str | Path,
                   engine_version: str = DEFAULT_ENGINE_VERSION) -> None:
    """Every row must be a run the model can serve (prompt + output within its context, a batch one
    engine step can hold), checked before any row is priced: a batch past the step budget would be
    refused later by the engine configuration's checks, in the words of `kvsim run`'s flags."""
    context = model.max_position_embeddings
    for r in rows:
        if r.input_len + r.output_len > context:
            raise MeasurementError(
                f"{path}:{r.line}: input_len + output_len = {r.input_len + r.output_len:,} tokens is longer "
                f"than {model.name}'s context of {context:,}"
            )
        budget = batch_config(r.tp, r.batch_size, engine_version).resolved_max_num_batched_tokens(model)
        if r.batch_size > budget:  # vLLM requires max_num_seqs <= max_num_batched_tokens
            raise MeasurementError(
                f"{path}:{r.line}: batch_size {r.batch_size:,} is more sequences than one engine step "
                f"takes ({budget:,}, the step token budget, which vLLM requires max_num_seqs not to exceed); "
                "kvsim cannot price this batch run"
            )


@dataclass
class RowPricing:
    """One row priced by a simulated batch run: the simulated values and, per quantity, the
    linear features whose dot product with the parameters gives it (see the module docstring)."""

    simulated: dict[str, float]
    features: dict[str, np.ndarray] = field(default_factory=dict)
    offsets: dict[str, float] = field(default_factory=dict)  # hidden CPU work's excess (ms): not a parameter


def batch_config(tp: int, batch_size: int, engine_version: str = DEFAULT_ENGINE_VERSION) -> EngineConfig:
    """The engine a row ran on: the version's scheduler (V0 and 0.6 prefill a batch without
    chunking; simcore.specs.ENGINE_PRESETS) and its host terms where the profile has them."""
    return EngineConfig(tensor_parallel_size=tp, max_num_seqs=max(256, batch_size), engine_version=engine_version,
                        **ENGINE_PRESETS[engine_version])


def price_row(model: ModelSpec, gpu: GPUSpec, profile: Profile, row: Measurement,
              engine_version: str = DEFAULT_ENGINE_VERSION) -> RowPricing:
    """Simulate the row's batch with `profile` on that engine version; record each step's linear features."""
    from kvsim.simcore.simulate import prepare
    from kvsim.workloads import load_workload

    config = batch_config(row.tp, row.batch_size, engine_version)
    overrides = {"num_requests": row.batch_size, "input_len": row.input_len, "output_len": row.output_len}
    workload = load_workload("fixed-batch", overrides, max_model_len=config.resolved_max_model_len(model))
    sim = prepare(model, gpu, config, workload, profile, exact_steps=True)  # one step-table row per step
    latency: StepLatencyModel = sim.latency
    priced = latency.step_time_s
    feats: list[list[float]] = []

    def probe(num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens, num_sampled):
        g, a, c, host = latency.step_parts_ms(num_tokens, prefill_chunks, num_decode_seqs,
                                              decode_context_tokens, num_sampled)
        ptok = num_tokens - num_decode_seqs
        seqs = len(prefill_chunks) + num_decode_seqs
        hidden = host - latency.host.ms(seqs, ptok)  # ASYNC: the hidden work's excess (0 without it)
        feats.append([g, a, c, 1.0, row.tp - 1.0, seqs, 1.0 if ptok else 0.0, float(ptok), hidden])
        return priced(num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens, num_sampled)

    def span_probe(num_seqs, context_sums):
        for ctx in np.asarray(context_sums):
            g, a, c, host = latency.step_parts_ms(num_seqs, [], num_seqs, ctx, num_seqs)
            feats.append([g, a, c, 1.0, row.tp - 1.0, num_seqs, 0.0, 0.0, host - latency.host.ms(num_seqs, 0)])
        return priced_span(num_seqs, context_sums)

    priced_span = latency.decode_span_times_s
    latency.step_time_s = probe  # this run's model only
    latency.decode_span_times_s = span_probe
    result = sim.run()
    steps, requests = result.steps, result.requests
    ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
    cum = np.cumsum(np.asarray(feats), axis=0)
    assert len(cum) == len(ends), "one feature row per priced step"
    done = requests[requests["status"] == "finished"]
    if len(done) != row.batch_size:
        raise MeasurementError(
            f"line {row.line}: kvsim could not run {row.batch_size} requests of {row.input_len} + "
            f"{row.output_len} tokens at TP {row.tp} ({row.batch_size - len(done)} rejected)"
        )
    first = np.searchsorted(ends, done["first_token_s"].to_numpy() - 1e-12)
    last = np.searchsorted(ends, done["finish_s"].to_numpy() - 1e-12)
    out = RowPricing(simulated={
        "prefill_ms": 1e3 * float((done["first_token_s"] - done["arrival_s"]).max()),
        "latency_ms": 1e3 * float(done["finish_s"].max() - done["arrival_s"].min()),
    })
    totals = {"prefill_ms": cum[first.max()],  # the batch's prefill ends with its last first token
              "latency_ms": cum[last.max()]}
    if row.output_len >= 2:
        out.simulated["decode_ms"] = 1e3 * float(done["tpot_s"].mean())
        totals["decode_ms"] = ((cum[last] - cum[first]) / (row.output_len - 1)).mean(axis=0)
    for q, total in totals.items():  # the parameters' features, and the hidden work's offset
        out.features[q], out.offsets[q] = total[:len(PARAMS)], float(total[len(PARAMS)])
    return out


def default_rank_ms() -> float:
    """host_rank's prior: the default engine version's per-step cost per extra TP rank, the slope
    of profiles/host.py's model between the TPs it was measured at, 2 and 4 (the workers'
    synchronisation; past TP 4 that model holds its TP 4 terms, so a slope through TP 8 would
    average in a flat, unmeasured stretch). With rows at one TP it cannot be fitted, and a stack's
    host cost then carries over to other TPs with the default's growth rather than none."""
    from kvsim.profiles.host import MAX_MEASURED_TP, engine_host
    from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION

    return ((engine_host(DEFAULT_ENGINE_VERSION, MAX_MEASURED_TP)[0] - engine_host(DEFAULT_ENGINE_VERSION, 2)[0])
            / (MAX_MEASURED_TP - 2))


def default_host_line() -> tuple[float, float]:
    """(per-step ms, ms per extra rank): the default engine's host cost per step as the line
    host_step + host_rank * (tp - 1) through its TP 2 and TP 4 terms (profiles/host.py)."""
    from kvsim.profiles.host import MAX_MEASURED_TP, engine_host

    rank = default_rank_ms()
    return engine_host(DEFAULT_ENGINE_VERSION, MAX_MEASURED_TP)[0] - rank * (MAX_MEASURED_TP - 1), rank


def profile_params(profile: Profile, tp: int, engine_version: str = DEFAULT_ENGINE_VERSION) -> np.ndarray:
    """The parameters that reproduce `profile` itself at this TP (scales 1, its continuous host
    terms for the engine version, with host_rank at its prior and host_step what remains of the
    per-step term)."""
    host = StepLatencyModel(profile.data, policy="continuous", engine_version=engine_version).host
    rank = default_rank_ms()
    return np.array([1.0, 1.0, 1.0, max(host.per_step_ms - rank * (tp - 1), 0.0), rank, host.per_seq_ms,
                     host.per_prefill_step_ms, host.per_prefill_token_ms])


def _check_possible(x: np.ndarray, y: np.ndarray) -> None:
    if (y - x @ LOWER <= 0).any():
        raise MeasurementError(
            "a measured time is below what the GPU's datasheet allows for its kernels alone "
            "(under half the roofline); check the rows, --model, --gpu and the TP column"
        )


def _solve(x: np.ndarray, y: np.ndarray, prior: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Least squares on relative error with every parameter >= its LOWER bound and a faint pull
    towards `prior`; parameters where `free` is False stay at the prior."""
    _check_possible(x, y)
    y = y - x @ LOWER  # theta = LOWER + phi, phi >= 0
    return LOWER + _nnls(x, y, np.maximum(prior - LOWER, 0.0), free)


def _nnls(x: np.ndarray, y: np.ndarray, prior: np.ndarray, free: np.ndarray) -> np.ndarray:
    scale = np.maximum(np.abs(prior), TYPICAL)
    a = x / y[:, None]
    b = np.ones_like(y)
    active = free.copy()
    theta = prior.copy()
    for _ in range(len(prior) + 1):
        idx = np.flatnonzero(active)
        rhs = b - a[:, ~active] @ theta[~active] if (~active).any() else b
        aa = np.vstack([a[:, idx], math.sqrt(PRIOR_WEIGHT) * np.diag(1.0 / scale[idx])])
        bb = np.concatenate([rhs, math.sqrt(PRIOR_WEIGHT) * prior[idx] / scale[idx]])
        sol, *_ = np.linalg.lstsq(aa, bb, rcond=None)
        theta[idx] = sol
        negative = idx[sol < 0]
        if not len(negative):
            return theta
        theta[negative] = 0.0
        active[negative] = False
    return np.maximum(theta, 0.0)


@dataclass
class Fit:
    params: dict[str, float]
    rows: list[dict[str, Any]]  # per row and quantity: measured, fitted, loo, errors
    by_tp: dict[int, dict[str, float]]  # in-sample and leave-one-out median |error| per TP
    fitted: list[str] = field(default_factory=list)  # free terms the rows identify (fitted)
    pinned: list[str] = field(default_factory=list)  # scalars kept at 1 (measured evidence)
    unidentified: dict[str, str] = field(default_factory=dict)  # term -> why it kept the default
    on_bound: list[str] = field(default_factory=list)  # fitted terms that ended on their lower bound
    loo_median_abs_error: float = 0.0  # over every point: the calibrated profile's expected error

    def warnings(self) -> list[str]:
        out = [f"{name} is not identifiable from these rows ({why}); kept at the default profile's value"
               for name, why in self.unidentified.items()]
        out += [f"{name} sits on its lower bound ({LOWER[PARAMS.index(name)]:g}); the rows push it further"
                for name in self.on_bound]
        return out


def _design(rows: list[Measurement], priced: list[RowPricing]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """Features, measured ms and the offset (hidden work's excess, ms) of every measured point."""
    xs, ys, offsets, index = [], [], [], []
    for r, p in zip(rows, priced, strict=True):
        for q, ms in r.measured.items():
            xs.append(p.features[q])
            ys.append(ms)
            offsets.append(p.offsets.get(q, 0.0))
            index.append((r, q))
    return np.asarray(xs), np.asarray(ys), np.asarray(offsets, dtype=np.float64), index


def _key(r: Measurement) -> tuple[int, int, int, int]:
    return r.tp, r.batch_size, r.input_len, r.output_len


def check_free_scalars(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    bad = [n for n in names if n not in SCALARS]
    if bad:
        raise MeasurementError(f"--free: {bad[0]!r} is not a scalar kvsim can free; choose from {', '.join(SCALARS)}")
    return tuple(dict.fromkeys(names))


def free_terms(rows: list[Measurement], free_scalars: tuple[str, ...] = ()) -> np.ndarray:
    """Which parameters the fit may move: the host terms (host_rank only with two TPs or more) and
    the scalars the user freed."""
    free = np.array([name not in SCALARS or name in free_scalars for name in PARAMS])
    free[PARAMS.index("host_rank")] = len({r.tp for r in rows}) > 1
    return free


def check_enough_points(rows: list[Measurement], free_scalars: tuple[str, ...] = ()) -> np.ndarray:
    """The free terms; MeasurementError when fewer distinct points (tp, batch, lengths, quantity)
    than free terms were measured (one row, or the same row repeated, cannot fit a line)."""
    free = free_terms(rows, free_scalars)
    points = len({(_key(r), q) for r in rows for q in r.measured})
    if points < int(free.sum()):
        configs = len({_key(r) for r in rows})
        raise MeasurementError(
            f"{points} distinct measured point{'s' if points != 1 else ''} ({configs} distinct "
            f"tp/batch_size/input_len/output_len row{'s' if configs != 1 else ''}) cannot fit "
            f"{int(free.sum())} terms ({', '.join(n for n, f in zip(PARAMS, free, strict=True) if f)}); "
            "measure more batch sizes or lengths"
        )
    return free


def identifiable(x: np.ndarray, y: np.ndarray, free: np.ndarray, keys: list | None = None) -> dict[str, str]:
    """term -> why not, for every free term the rows cannot pin down: a column of zeros, one only
    one configuration (`keys`, per point) depends on (it would fit that row exactly and no other
    could vouch for it: leave-one-out cannot test it), or one the terms kept before it (in PARAMS
    order) already span. Of a set of terms only their joint effect is seen (e.g. host_seq and
    host_prefill_token when every row has input_len == output_len: both columns are batch x
    length), the first is fitted and carries that effect; the others keep the default and name it,
    so no identified combination is left unfitted."""
    a = x / y[:, None]
    why: dict[str, str] = {}
    cols = [j for j in np.flatnonzero(free)]
    for j in cols:
        if not np.any(a[:, j]):
            why[PARAMS[j]] = "no row depends on it"
        elif keys is not None and len({k for k, v in zip(keys, a[:, j], strict=True) if v}) < 2:
            why[PARAMS[j]] = "only one row depends on it"
    live = [j for j in cols if PARAMS[j] not in why]
    if not live:
        return why
    unit = a[:, live] / np.linalg.norm(a[:, live], axis=0)

    def rank(ks: list[int]) -> int:
        if not ks:
            return 0
        sv = np.linalg.svd(unit[:, ks], compute_uv=False)
        return int(np.sum(sv > RANK_TOL * sv[0])) if sv[0] > 0 else 0

    full = rank(list(range(len(live))))
    dependent = [k for k in range(len(live)) if rank([i for i in range(len(live)) if i != k]) == full]
    kept = [k for k in range(len(live)) if k not in dependent]
    for k in dependent:  # PARAMS order: keep a term when it adds what the kept ones do not span
        base = rank(kept)
        if rank(kept + [k]) > base:
            kept.append(k)
            continue
        partners = [PARAMS[live[m]] for m in kept if m in dependent
                    and rank([i for i in kept if i != m] + [k]) == base]  # interchangeable with k
        why[PARAMS[live[k]]] = (f"the rows cannot separate it from {', '.join(partners)}, fitted for "
                                f"{'both' if len(partners) == 1 else 'all of them'}"
                                if partners else "the rows cannot separate it from the other terms")
    return why


def _prior_shaped_rank(theta: np.ndarray, rows: list[Measurement]) -> np.ndarray:
    """Rows at one TP measure one fixed host cost per step, host_step + host_rank * (tp - 1), at that
    TP only; how it splits into a per-step and a per-rank part they cannot say. Keep the split of
    the default engine's line (`default_host_line`: per-step 1.29 + 0.14 ms per extra rank for
    vllm-v1, through its TP 2 and TP 4 terms): a stack whose fixed host cost per step is k times that
    line's at the measured TP pays k times its per-rank part too (the work that grows with the
    ranks driven: V0's Ray calls per worker, V1's shared-memory broadcast and barrier;
    profiles/host.py), rather than all the excess being TP-independent. Prices at the measured TP are
    unchanged; a calibrated profile written for another TP (`kvsim calibrate --tp`) carries the host
    cost over along that line, scaled."""
    tps = {r.tp for r in rows}
    if len(tps) != 1:
        return theta
    tp = tps.pop()
    step0, rank0 = default_host_line()
    line = step0 + rank0 * (tp - 1)
    i, j = PARAMS.index("host_step"), PARAMS.index("host_rank")
    total = theta[i] + theta[j] * (tp - 1)
    if line <= 0 or total <= 0:
        return theta
    out = theta.copy()
    out[j] = rank0 * total / line
    out[i] = total - out[j] * (tp - 1)
    return out


def fit_rows(rows: list[Measurement], priced: list[RowPricing], prior: np.ndarray,
             free_scalars: tuple[str, ...] = ()) -> Fit:
    """Fit the free, identifiable terms (see the module docstring); refuse too few distinct points."""
    x, measured, offset, index = _design(rows, priced)
    y = measured - offset  # what the parameters must explain (all of it but hidden work's excess)
    _check_possible(x, y)
    free = check_enough_points(rows, free_scalars)
    keys = [_key(r) for r, _ in index]
    unidentified = identifiable(x, y, free, keys)
    fit_free = free & np.array([name not in unidentified for name in PARAMS])
    theta = _prior_shaped_rank(_solve(x, y, prior, fit_free), rows)
    fitted = x @ theta + offset
    loo = np.empty_like(fitted)
    for key in dict.fromkeys(_key(r) for r, _ in index):  # leave one configuration (all its rows) out
        out = np.array([_key(ri) == key for ri, _ in index])
        held = [ri for ri in rows if _key(ri) != key]
        if out.all():
            loo[out] = fitted[out]
            continue
        held_free = fit_free.copy()
        if len({ri.tp for ri in held}) < 2:
            held_free[PARAMS.index("host_rank")] = False
        held_keys = [k for k, o in zip(keys, out, strict=True) if not o]
        held_free &= np.array([name not in identifiable(x[~out], y[~out], held_free, held_keys) for name in PARAMS])
        t = _prior_shaped_rank(_solve(x[~out], y[~out], prior, held_free), held)
        loo[out] = x[out] @ t + offset[out]
    table = []
    for (r, q), ms, f, lo in zip(index, measured, fitted, loo, strict=True):
        table.append({"line": r.line, "tp": r.tp, "batch_size": r.batch_size, "input_len": r.input_len,
                      "output_len": r.output_len, "quantity": q, "measured_ms": float(ms),
                      "fitted_ms": float(f), "error": float(f / ms - 1), "loo_ms": float(lo),
                      "loo_error": float(lo / ms - 1)})
    by_tp = {}
    for tp in sorted({r.tp for r in rows}):
        sub = [t for t in table if t["tp"] == tp]
        by_tp[tp] = {"points": len(sub),
                     "in_sample_median_abs_error": float(np.median([abs(t["error"]) for t in sub])),
                     "loo_median_abs_error": float(np.median([abs(t["loo_error"]) for t in sub]))}
    on_bound = [PARAMS[j] for j in np.flatnonzero(fit_free) if theta[j] <= LOWER[j] + 1e-12]
    return Fit({k: float(v) for k, v in zip(PARAMS, theta, strict=True)}, table, by_tp,
               fitted=[PARAMS[j] for j in np.flatnonzero(fit_free)],
               pinned=[n for n in SCALARS if n not in free_scalars], unidentified=unidentified,
               on_bound=on_bound,
               loo_median_abs_error=float(np.median([abs(t["loo_error"]) for t in table])))


def _scale(table: dict | None, factor: float, keys=("time_ms",)) -> None:
    if not table:
        return
    for key in keys:
        if key in table:
            z = table[key]
            table[key] = [[v * factor for v in row] for row in z] if z and isinstance(z[0], list) else [v * factor for v in z]


def hidden_terms(engine_version: str, tp: int) -> dict[str, Any] | None:
    """The hidden CPU work a calibrated profile of an engine that overlaps it carries (None for one
    that hides nothing): that engine's default at this TP, not fitted (see the module docstring)."""
    from kvsim.profiles.host import engine_hidden

    step, seq = engine_hidden(engine_version, tp)
    if step == 0.0 and seq == 0.0:
        return None
    return {"hidden_per_step_ms": step, "hidden_per_seq_ms": seq,
            "how": f"not fitted: {engine_version}'s default CPU work hidden behind the GPU's step at TP {tp} "
                   "(profiles/host.py engine_hidden); batch rows cannot separate it from the step it hides "
                   "behind. The fit priced every row with it (a step pays its excess over the GPU's step, the "
                   "first step after an idle engine all of it) and fitted the visible terms to the rest"}


def calibrated_profile(base: Profile, params: dict[str, float], tp: int, provenance: dict[str, Any],
                       engine_version: str = DEFAULT_ENGINE_VERSION) -> dict:
    """`base` (the default profile at this TP) with its kernel, attention and collective tables
    scaled and the fitted host terms; every policy uses those host terms. An engine that hides CPU
    work (`vllm-v1-async`) keeps its default hidden terms at this TP beside them (`hidden_terms`),
    stated in provenance.calibration."""
    doc = copy.deepcopy(base.data)
    _scale(doc["linear"], params["s_gemm"])
    _scale(doc["lm_head"], params["s_gemm"])
    _scale(doc["prefill_attention"], params["s_attn"])
    if "launch_floor_ms" in doc["prefill_attention"]:
        doc["prefill_attention"]["launch_floor_ms"] *= params["s_attn"]
    for table in doc["decode_attention"].values():
        _scale(table, params["s_attn"])
    if doc.get("collectives"):
        _scale(doc["collectives"].get("all_reduce"), params["s_coll"])
        for table in (doc["collectives"].get("all_reduce_by_engine") or {}).values():
            _scale(table, params["s_coll"])  # vLLM V1's symmetric-memory table, scaled as the base one
    _scale(doc.get("collective"), params["s_coll"])
    doc["schema_version"] = 2
    doc.pop("step_overhead_ms", None)
    doc.pop("step_overhead_ms_by_policy", None)
    doc.pop("host_overhead_by_policy", None)
    doc.pop("host_overhead_by_engine", None)  # the fitted terms describe the measured stack, whatever its version
    doc["host_overhead"] = {
        "per_step_ms": params["host_step"] + params["host_rank"] * (tp - 1),
        "per_seq_ms": params["host_seq"],
        "per_prefill_step_ms": params["host_prefill_step"],
        "per_prefill_token_ms": params["host_prefill_token"],
    }
    hidden = hidden_terms(engine_version, tp)
    if hidden is not None:  # ASYNC: the hidden work the fit priced the rows with
        doc["host_overhead"].update({k: hidden[k] for k in ("hidden_per_step_ms", "hidden_per_seq_ms")})
        provenance = {**provenance, "calibration": {**provenance.get("calibration", {}), "hidden_terms": hidden}}
    doc["source"] = "calibrated"
    doc["provenance"] = {**provenance, "base_profile": {"sha256": base.sha256, "source": base.source,
                                                         "path": base.path}}
    parse_profile(doc, f"calibrated {doc['gpu']} {doc['model']} tp{tp}")
    return doc


def price_all(model: ModelSpec, gpu: GPUSpec, rows: list[Measurement], profile_for, progress=None,
              engine_version: str = DEFAULT_ENGINE_VERSION) -> list[RowPricing]:
    """Price every row with `profile_for(tp)` on that engine version; `progress(label, n)` after each row."""
    out = []
    for n, row in enumerate(rows, start=1):
        out.append(price_row(model, gpu, profile_for(row.tp), row, engine_version))
        if progress is not None:
            progress(f"line {row.line}: B={row.batch_size} P={row.input_len} O={row.output_len} TP {row.tp}", n)
    return out


def check_rows(rows: list[Measurement], priced: list[RowPricing]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Per row and quantity: measured, kvsim's price and the error; the median |error| per quantity."""
    table = []
    for r, p in zip(rows, priced, strict=True):
        for q, ms in r.measured.items():
            table.append({"line": r.line, "tp": r.tp, "batch_size": r.batch_size, "input_len": r.input_len,
                          "output_len": r.output_len, "quantity": q, "measured_ms": ms,
                          "kvsim_ms": p.simulated[q], "error": p.simulated[q] / ms - 1})
    medians = {q: float(np.median([abs(t["error"]) for t in table if t["quantity"] == q]))
               for q in QUANTITIES if any(t["quantity"] == q for t in table)}
    medians["all"] = float(np.median([abs(t["error"]) for t in table]))
    return table, medians
