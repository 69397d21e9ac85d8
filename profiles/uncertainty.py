"""How wrong a profile's step times are expected to be, and what that does to an answer.

The model of the error is one factor on every step time of a run, log-normal: step_time x exp(e),
e ~ N(0, sigma). sigma comes from the profile's kind, from stated validations, as the median
|relative error| m of that validation: sigma = m / 0.6745 (the median of |N(0, sigma)|).

* roofline   m = 9%: issue 27's end-to-end check of the default profiles against published vLLM
             results on H100 and the vLLM paper (median 9%, worst 29%; run on the code before the
             engine versions of that issue, so it is the last stated validation, not a fresh one).
* measured   m = 14.5%: `kvsim profile validate` of the harness's CPU profile, whole-step median
             |error| 12.9% / 14.5% / 17.0% in three runs (profiles/README.md); no GPU-measured
             profile has been validated by this project.
* calibrated m = the calibration's own leave-one-out median |error|
             (`provenance.calibration.loo_median_abs_error`, or the per-TP medians of older files) at
             a TP the rows covered; at a TP without rows (kernels re-derived, host carried over) the
             roofline's m, since that profile is then a roofline with fitted host terms.

An answer's band re-simulates the run with every step time scaled by exp(-z sigma) and exp(+z sigma)
(a profile whose every table and host term is scaled), so queueing reacts as it would: near
saturation a slower step stretches TTFT far more than in proportion. `kvsim plan --confidence c`
plans with the step times scaled by exp(Phi^-1(c) sigma): a deployment that meets the SLO there
meets it with probability >= c under this error model (metrics only worsen as steps slow down).
Known limits: one factor for the whole run (errors that differ between prefill and decode, or
between TPs, are not separated), and validation errors that were biased (issue 27: kvsim too fast)
are treated as symmetric.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from kvsim.simcore.latency import Profile, parse_profile

MEDIAN_ABS_ERROR = {"roofline": 0.09, "measured": 0.145}
BASIS = {
    "roofline": "issue 27: default profiles vs published vLLM H100 results and the vLLM paper, end to end "
                "(median 9%, worst 29%)",
    "measured": "kvsim profile validate, CPU harness profile: whole-step median 12.9-17.0% (profiles/README.md)",
}
HALF_NORMAL_MEDIAN = 0.6745  # median of |N(0, 1)|
INTERVAL = 0.90  # the band kvsim run prints: 5th to 95th percentile of the step-time factor
# headline metrics a band is given for (kvsim run's summary keys)
BAND_METRICS = ("mean_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p95_tpot_ms", "mean_itl_ms",
                "p95_e2el_ms", "request_throughput", "output_throughput")


@dataclass(frozen=True, slots=True)
class StepTimeError:
    """A profile's expected step-time error: median |relative error| and the log-normal sigma."""

    kind: str  # roofline | measured | calibrated
    median_abs_error: float
    basis: str  # where the number comes from

    @property
    def sigma(self) -> float:
        return self.median_abs_error / HALF_NORMAL_MEDIAN

    def factor(self, z: float) -> float:
        """The step-time factor at z standard deviations."""
        return math.exp(z * self.sigma)

    def factor_at_confidence(self, confidence: float) -> float:
        """The factor step times stay below with this probability (1.0 at 0.5)."""
        return self.factor(NormalDist().inv_cdf(confidence)) if confidence != 0.5 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "median_abs_error": self.median_abs_error, "sigma_log": self.sigma,
                "basis": self.basis}


def profile_error(profile: Profile) -> StepTimeError:
    """The expected error of this profile's step times (see the module docstring)."""
    kind = profile.source
    if kind == "calibrated":
        cal = (profile.data.get("provenance") or {}).get("calibration") or {}
        tp = profile.data.get("tensor_parallel_size")
        if tp in (cal.get("data_tps") or []):
            loo = cal.get("loo_median_abs_error")
            if loo is None:  # files from before it was recorded: the median of the per-TP medians
                by_tp = cal.get("errors_by_tp") or {}
                values = sorted(v["loo_median_abs_error"] for v in by_tp.values() if "loo_median_abs_error" in v)
                loo = values[len(values) // 2] if values else None
            if loo is not None:
                return StepTimeError(kind, float(loo), "the calibration's leave-one-out median |error| "
                                                      f"({cal.get('rows', '?')} rows)")
        return StepTimeError(kind, MEDIAN_ABS_ERROR["roofline"],
                             "no calibration rows at this TP: the roofline's, " + BASIS["roofline"])
    return StepTimeError(kind, MEDIAN_ABS_ERROR[kind], BASIS[kind])


def deployment_error(profiles: list[Profile]) -> StepTimeError:
    """One step-time error for a run priced from several profiles (a disaggregated run's pools, a
    fleet's groups): the largest of theirs. The band scales every profile by the same factor, so
    the errors are treated as fully correlated (one model, one set of validations), which gives
    the wider band of the two extremes."""
    errors = [profile_error(p) for p in profiles]
    worst = max(errors, key=lambda e: e.sigma)
    if len({(e.kind, e.median_abs_error) for e in errors}) == 1:
        return worst
    return StepTimeError(worst.kind, worst.median_abs_error,
                         f"the largest of {len(errors)} profiles' stated errors: {worst.basis}")


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


def scaled_profile(profile: Profile, factor: float) -> Profile:
    """The profile with every step time (kernel tables, collectives, host terms) times `factor`:
    tables are interpolated in log space, so every priced step scales by it. Its latency models
    are the profile's own scaled (StepLatencyModel.scaled: the same numbers as parsing the scaled
    document, without parsing it again); a profile with none built yet, or a scaled document
    that validation could refuse, is parsed as any document is."""
    if factor == 1.0:
        return profile
    from kvsim.simcore.latency import ABSURD_MS, _check_absurd, profile_hash

    tables = [profile.data.get(key) for key in ("linear", "prefill_attention", "lm_head", "collective")]
    tables += list((profile.data.get("decode_attention") or {}).values())
    tables += list((profile.data.get("collectives") or {}).values())
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
    for key in ("host_overhead", "step_overhead_ms"):
        if key in doc:
            doc[key] = _scale_terms(doc[key], factor, peak)
    for key in ("host_overhead_by_policy", "host_overhead_by_engine", "step_overhead_ms_by_policy"):
        if isinstance(doc.get(key), dict):
            doc[key] = {k: _scale_terms(v, factor, peak) for k, v in doc[key].items()}
    label = f"{profile.path or profile.label} x {factor:.4g}"
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
        scaled._templates = {key: m.scaled(factor) for key, m in models.items() if key is not None}
        if None in models:
            scaled._unused_model = models[None].scaled(factor)
    else:
        scaled = parse_profile(doc, label)
    scaled.path = profile.path
    # what it was scaled by in all (a draft model's profile follows its target's: profiles.draft_profile)
    scaled.step_time_factor = getattr(profile, "step_time_factor", 1.0) * factor
    return scaled


def band(values: list[float]) -> list[float]:
    """[low, high] of a metric over the runs at the band's ends and the point estimate."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return [min(finite), max(finite)] if finite else [None, None]
