"""How wrong a profile's step times are expected to be, and what that does to an answer.

The model of the error: a step's time is kvsim's price x F, F = F_decode for a decode-only step,
F_prefill for a step of prompt tokens alone, and F_decode + (F_prefill - F_decode) p / T for a step
with p prompt tokens of T (StepLatencyModel.prefill_ratio prices it; both engine cores). Each phase's
F is log-normal with median 1 (point estimates are not moved), its width from a stated validation's
median |relative error| m of that phase: kvsim's step = measured x (1 -+ m) at the median row, so
|ln F| has median -ln(1 - m) on the side where kvsim is too fast (F > 1) and ln(1 + m) where it is
too slow (F < 1); each side is half a normal, sigma = that / 0.6745 (the median of |N(0, 1)|). Both
phases move with one standard normal z (errors fully correlated: the wider band), so a band's end
and a confidence's quantile are one z: F_phase(z) = exp(z sigma_phase,side).

* roofline, by TP (the smallest validated TP >= the profile's, else the largest) and phase:
    TP 2 / 4 / 8: issue 27 round 2 step-level check (Llama-2-70B on H100, default profiles, 56 batch
    runs): prefill / decode median |error| 14 / 16%, 23 / 19%, 37 / 44%, kvsim too fast on every row.
    TP 1: no step-level check; issue 27's end-to-end check of the default profiles against published
    vLLM H100 results and the vLLM paper, median 9% (worst 29%), for both phases.
* measured   m = 14.5% both phases: `kvsim profile validate` of the harness's CPU profile, whole-step
             median |error| 12.9% / 14.5% / 17.0% in three runs (profiles/README.md); no GPU-measured
             profile has been validated by this project.
* calibrated at a TP its rows covered: per phase, the median |leave-one-out error| of its prefill_ms /
             decode_ms residuals (`provenance.calibration.residuals`, profiles/calibrate.py); a phase
             without rows (or files without residuals) takes `loo_median_abs_error` (or the median of
             the per-TP medians of older files). At a TP without rows (kernels re-derived, host
             carried over): the roofline's at that TP.

An answer's band re-simulates the run at z = -1.645 and +1.645 (a profile with every table and host
term scaled by F_decode and prefill_vs_decode_factor = F_prefill / F_decode), so queueing reacts as
it would. `kvsim plan --confidence c` plans at z = Phi^-1(c): metrics only worsen as steps slow down
and F rises with z in both phases, so an answer that meets its SLO there meets it with probability
>= c under this model, and a higher confidence never picks fewer GPUs.
Known limits: the validation found kvsim too fast on every step-level row, but the band keeps its
median at kvsim's price (no point estimate is shifted), so it under-states how likely a slower truth
is (the median validated row sits at its 75th percentile, not its 50th); only the step-level rows
of one model and GPU (Llama-2-70B, H100) set the TP 2-8 widths of every roofline profile; errors
that differ by batch size are not separated.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, NamedTuple

from kvsim.simcore.latency import PREFILL_RATIO_KEY, Profile, parse_profile

ISSUE27_STEP_CHECK = ("issue 27 round 2 step-level check: Llama-2-70B on H100, default profiles, 56 batch runs, "
                      "median |error| prefill / decode 14/16% (TP 2), 23/19% (TP 4), 37/44% (TP 8), kvsim too fast "
                      "on every row")
ISSUE27_END_TO_END = ("issue 27: default profiles vs published vLLM H100 results and the vLLM paper, end to end "
                      "(median 9%, worst 29%); no step-level check at TP 1")
# roofline: TP -> (prefill, decode) median |relative error| of a step, and where it comes from
ROOFLINE_BY_TP = {1: (0.09, 0.09), 2: (0.14, 0.16), 4: (0.23, 0.19), 8: (0.37, 0.44)}
ROOFLINE_BASIS = {1: ISSUE27_END_TO_END, 2: ISSUE27_STEP_CHECK, 4: ISSUE27_STEP_CHECK, 8: ISSUE27_STEP_CHECK}
MEASURED_ERROR = 0.145
MEASURED_BASIS = "kvsim profile validate, CPU harness profile: whole-step median 12.9-17.0% (profiles/README.md)"
HALF_NORMAL_MEDIAN = 0.6745  # median of |N(0, 1)|
MAX_ERROR = 0.9  # a stated median error is capped here (at 1 the too-fast side's sigma is infinite)
INTERVAL = 0.90  # the band kvsim run prints: 5th to 95th percentile of the step-time factor
# headline metrics a band is given for (kvsim run's summary keys)
BAND_METRICS = ("mean_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p95_tpot_ms", "mean_itl_ms",
                "p95_e2el_ms", "request_throughput", "output_throughput", "full_batch_capacity")


class PhaseFactors(NamedTuple):
    """Step-time factors of a prefill-only and a decode-only step (a mixed step: in proportion)."""

    prefill: float
    decode: float

    def text(self) -> str:
        if self.prefill == self.decode:
            return f"x{self.decode:.2f}"
        return f"x{self.prefill:.2f} prefill / x{self.decode:.2f} decode"


def sigma_too_fast(m: float) -> float:
    """sigma of ln F on the side where kvsim is too fast (F > 1): median |ln F| = -ln(1 - m)."""
    return -math.log1p(-min(m, MAX_ERROR)) / HALF_NORMAL_MEDIAN


def sigma_too_slow(m: float) -> float:
    """sigma of ln F on the side where kvsim is too slow (F < 1): median |ln F| = ln(1 + m)."""
    return math.log1p(min(m, MAX_ERROR)) / HALF_NORMAL_MEDIAN


def _factor(m: float, z: float) -> float:
    if z == 0:
        return 1.0
    return math.exp(z * (sigma_too_fast(m) if z > 0 else sigma_too_slow(m)))


@dataclass(frozen=True, slots=True)
class StepTimeError:
    """A profile's expected step-time error: each phase's median |relative error| (see the module
    docstring for the distribution it implies)."""

    kind: str  # roofline | measured | calibrated
    prefill: float  # median |relative error| of a prefill step
    decode: float  # ... of a decode step
    basis: str  # where the numbers come from
    tp: int | None = None

    @property
    def median_abs_error(self) -> float:
        """The larger phase's (one number for a line of text)."""
        return max(self.prefill, self.decode)

    @property
    def sigma(self) -> float:
        """The largest of the four sides' sigmas (phase x side)."""
        return max(sigma_too_fast(self.prefill), sigma_too_fast(self.decode))

    def z_above(self, z: float, growth: float) -> float:
        """The smallest z' at which every phase's ln factor is at least `growth` above its value
        at z (inf when a phase has no stated error: it never moves)."""
        out = -math.inf
        for m in (self.prefill, self.decode):
            if m <= 0:
                return math.inf
            target = math.log(_factor(m, z)) + growth
            out = max(out, target / (sigma_too_fast(m) if target >= 0 else sigma_too_slow(m)))
        return out

    def factor(self, z: float) -> PhaseFactors:
        """The step-time factors at z standard deviations."""
        return PhaseFactors(_factor(self.prefill, z), _factor(self.decode, z))

    def factor_at_confidence(self, confidence: float) -> PhaseFactors:
        """The factors step times stay below with this probability (1.0 at 0.5)."""
        return self.factor(NormalDist().inv_cdf(confidence) if confidence != 0.5 else 0.0)

    def text(self) -> str:
        """'prefill 23% / decode 19%' (one number when they agree)."""
        if self.prefill == self.decode:
            return f"{100 * self.decode:.3g}%"
        return f"prefill {100 * self.prefill:.3g}% / decode {100 * self.decode:.3g}%"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tp": self.tp, "median_abs_error": self.median_abs_error,
                "median_abs_error_prefill": self.prefill, "median_abs_error_decode": self.decode,
                "sigma_log": {"prefill": [sigma_too_slow(self.prefill), sigma_too_fast(self.prefill)],
                              "decode": [sigma_too_slow(self.decode), sigma_too_fast(self.decode)]},
                "basis": self.basis}


def band_factors(err: StepTimeError) -> tuple[PhaseFactors, PhaseFactors]:
    """The factors at the two ends of the INTERVAL band (z = -+1.645)."""
    z = NormalDist().inv_cdf(0.5 + INTERVAL / 2)
    return err.factor(-z), err.factor(z)


def factors_doc(low: PhaseFactors, high: PhaseFactors) -> dict[str, list[float]]:
    """{"prefill": [low, high], "decode": [low, high]} (a band's `step_time_factors`)."""
    return {"prefill": [low.prefill, high.prefill], "decode": [low.decode, high.decode]}


def factors_text(factors: dict[str, list[float]]) -> str:
    """'x0.65 .. x1.67', or per phase when they differ: 'prefill x0.60 .. x1.89, decode x0.65 .. x1.67'."""
    pre, dec = factors["prefill"], factors["decode"]
    if pre == dec:
        return f"x{dec[0]:.2f} .. x{dec[1]:.2f}"
    return f"prefill x{pre[0]:.2f} .. x{pre[1]:.2f}, decode x{dec[0]:.2f} .. x{dec[1]:.2f}"


def roofline_error(tp: int | None, kind: str = "roofline", prefix: str = "") -> StepTimeError:
    """The roofline's stated error at this TP: the smallest validated TP at or above it, else the
    largest (errors grew with TP in every validation: a larger TP is at least that wrong)."""
    tps = sorted(ROOFLINE_BY_TP)
    at = next((t for t in tps if tp is not None and t >= tp), tps[-1]) if tp is not None else tps[0]
    prefill, decode = ROOFLINE_BY_TP[at]
    note = "" if at == tp else f" (validated at TP {at}, the profile is TP {tp})"
    return StepTimeError(kind, prefill, decode, prefix + ROOFLINE_BASIS[at] + note, tp)


def _calibrated_error(profile: Profile, tp: int | None) -> StepTimeError:
    cal = (profile.data.get("provenance") or {}).get("calibration") or {}
    if tp not in (cal.get("data_tps") or []):
        return roofline_error(tp, "calibrated", "no calibration rows at this TP: the roofline's, ")
    loo = cal.get("loo_median_abs_error")
    if loo is None:  # files from before it was recorded: the median of the per-TP medians
        by_tp = cal.get("errors_by_tp") or {}
        values = sorted(v["loo_median_abs_error"] for v in by_tp.values() if "loo_median_abs_error" in v)
        loo = values[len(values) // 2] if values else None
    phases: dict[str, float | None] = {}
    for phase in ("prefill", "decode"):
        errors = sorted(abs(float(r["loo_error"])) for r in cal.get("residuals") or []
                        if isinstance(r, dict) and r.get("quantity") == f"{phase}_ms" and r.get("loo_error") is not None)
        phases[phase] = (errors[len(errors) // 2] if len(errors) % 2 else
                         (errors[len(errors) // 2 - 1] + errors[len(errors) // 2]) / 2) if errors else None
    if loo is None and phases["prefill"] is None and phases["decode"] is None:
        return roofline_error(tp, "calibrated", "no leave-one-out error recorded: the roofline's, ")
    fallback = loo if loo is not None else next(v for v in phases.values() if v is not None)
    missing = [p for p, v in phases.items() if v is None]
    basis = (f"the calibration's leave-one-out median |error| ({cal.get('rows', '?')} rows)"
             + ("" if not missing else f"; no {' / '.join(missing)} residuals: the overall median for "
                + ("both phases" if len(missing) == 2 else "it")))
    return StepTimeError("calibrated", float(phases["prefill"] if phases["prefill"] is not None else fallback),
                         float(phases["decode"] if phases["decode"] is not None else fallback), basis, tp)


def profile_error(profile: Profile) -> StepTimeError:
    """The expected error of this profile's step times (see the module docstring)."""
    kind = profile.source
    tp = profile.data.get("tensor_parallel_size")
    if kind == "calibrated":
        return _calibrated_error(profile, tp)
    if kind == "measured":
        return StepTimeError(kind, MEASURED_ERROR, MEASURED_ERROR, MEASURED_BASIS, tp)
    return roofline_error(tp)


def deployment_error(profiles: list[Profile]) -> StepTimeError:
    """One step-time error for a run priced from several profiles (a disaggregated run's pools, a
    fleet's groups): per phase the largest of theirs. The band scales every profile by the same
    factors, so the errors are treated as fully correlated (one model, one set of validations),
    which gives the wider band of the two extremes."""
    errors = [profile_error(p) for p in profiles]
    if len({(e.kind, e.prefill, e.decode) for e in errors}) == 1:
        return errors[0]
    pre = max(errors, key=lambda e: e.prefill)
    dec = max(errors, key=lambda e: e.decode)
    basis = (f"the largest of {len(errors)} profiles' stated errors per phase: "
             + (pre.basis if pre is dec else f"prefill: {pre.basis}; decode: {dec.basis}"))
    return StepTimeError(dec.kind, pre.prefill, dec.decode, basis, dec.tp)


def _scale_table(table: Any, factor: float, peak: list[float]) -> None:
    if not isinstance(table, dict) or "time_ms" not in table:
        return
    z = table["time_ms"]
    if z and isinstance(z[0], list):
        table["time_ms"] = [[v * factor for v in row] for row in z]
        peak.append(max((max(row, default=0.0) for row in table["time_ms"]), default=0.0))
    else:
        table["time_ms"] = [v * factor for v in z]
        peak.append(max(table["time_ms"], default=0.0))


def _scale_terms(terms: Any, factor: float, peak: list[float]) -> Any:
    if isinstance(terms, dict):
        out = {k: v * factor for k, v in terms.items()}
        peak.extend(out.values())
        return out
    peak.append(terms * factor)
    return terms * factor  # v1's step_overhead_ms


def scaled_profile(profile: Profile, factor: float | PhaseFactors) -> Profile:
    """The profile with every step time (kernel tables, collectives, host terms) times `factor`:
    tables are interpolated in log space, so every priced step scales by it. PhaseFactors: every
    time x its decode factor, and `prefill_vs_decode_factor` x prefill / decode (a step with
    prompt tokens priced in proportion to them, StepLatencyModel.prefill_ratio). Its latency models
    are the profile's own scaled (StepLatencyModel.scaled: the same numbers as parsing the scaled
    document, without parsing it again); a profile with none built yet, or a scaled document
    that validation could refuse, is parsed as any document is."""
    prefill = None
    if isinstance(factor, PhaseFactors):
        if factor.prefill != factor.decode:
            prefill = factor.prefill
        factor = factor.decode
    if factor == 1.0 and prefill is None:
        return profile
    from kvsim.simcore.latency import ABSURD_MS, _check_absurd, profile_hash

    tables = [profile.data.get(key) for key in ("linear", "prefill_attention", "lm_head", "collective")]
    tables += list((profile.data.get("decode_attention") or {}).values())
    tables += list((profile.data.get("collectives") or {}).values())
    tables += list(((profile.data.get("collectives") or {}).get("all_reduce_by_engine") or {}).values())
    # the tables' value lists are replaced by scaled ones below: deepcopy leaves them (read, never written)
    keep = {id(t["time_ms"]): t["time_ms"] for t in tables if isinstance(t, dict) and isinstance(t.get("time_ms"), list)}
    doc = copy.deepcopy(profile.data, memo=keep)
    peak: list[float] = []  # every scaled value's maximum per table / term: parsing refuses > ABSURD_MS
    for key in ("linear", "prefill_attention", "lm_head", "collective"):
        _scale_table(doc.get(key), factor, peak)
    pre = doc.get("prefill_attention")
    if isinstance(pre, dict) and "launch_floor_ms" in pre:
        pre["launch_floor_ms"] *= factor
    for table in (doc.get("decode_attention") or {}).values():
        _scale_table(table, factor, peak)
    for table in (doc.get("collectives") or {}).values():
        _scale_table(table, factor, peak)
    for table in ((doc.get("collectives") or {}).get("all_reduce_by_engine") or {}).values():
        _scale_table(table, factor, peak)  # a version's own all-reduce table (entries without one: skipped)
    for key in ("host_overhead", "step_overhead_ms"):
        if key in doc:
            doc[key] = _scale_terms(doc[key], factor, peak)
    for key in ("host_overhead_by_policy", "host_overhead_by_engine", "step_overhead_ms_by_policy"):
        if isinstance(doc.get(key), dict):
            doc[key] = {k: _scale_terms(v, factor, peak) for k, v in doc[key].items()}
    if prefill is not None:  # the model's own ratio times this one's (StepLatencyModel.scaled's arithmetic)
        doc[PREFILL_RATIO_KEY] = float(profile.data.get(PREFILL_RATIO_KEY, 1.0)) * (prefill / factor)
    label = f"{profile.path or profile.label} x {factor:.4g}" + ("" if prefill is None else f" (prefill x {prefill:.4g})")
    models = {**profile._templates}
    if profile._unused_model is not None:
        models[None] = profile._unused_model
    fast = bool(models) and 0.0 < factor < math.inf and max(peak, default=0.0) <= ABSURD_MS
    if fast:
        try:
            _check_absurd(doc, label)  # the one check whose answer scaling can change (a table too fast)
        except Exception:
            fast = False
    if fast:
        scaled = Profile(data=doc, sha256=profile_hash(doc))
        scaled._templates = {key: m.scaled(factor, prefill) for key, m in models.items() if key is not None}
        if None in models:
            scaled._unused_model = models[None].scaled(factor, prefill)
    else:
        scaled = parse_profile(doc, label)
    scaled.path = profile.path
    # what it was scaled by in all (a draft model's profile follows its target's: profiles.draft_profile)
    before = getattr(profile, "step_time_factor", PhaseFactors(1.0, 1.0))
    if not isinstance(before, PhaseFactors):
        before = PhaseFactors(before, before)
    total = PhaseFactors(before.prefill * (factor if prefill is None else prefill), before.decode * factor)
    scaled.step_time_factor = total.decode if total.prefill == total.decode else total
    return scaled


def band(values: list[float]) -> list[float]:
    """[low, high] of a metric over the runs at the band's ends and the point estimate."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return [min(finite), max(finite)] if finite else [None, None]
