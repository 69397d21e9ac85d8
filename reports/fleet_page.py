"""One HTML page for a run whose replicas are not one fixed kind: `kvsim run --autoscale --out DIR`
writes DIR/autoscale.html (replicas over time, SLO attainment per hour, GPU-hours and $/day against
static fleets sized for the peak and the mean), `kvsim run --fleet ... --out DIR` writes
DIR/fleet.html (what each GPU group served, at what latency and price). Results first: the answer,
then the tables and figure, then how the run was made. Everything comes from the run's own summary
document (summary.json) and request columns, so the page says nothing the files do not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.reports import html

OVERLOADED = "overloaded"  # simcore.metrics.saturation's label for a run whose queue grew


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _usd(x: float | None) -> str:
    return "n/a" if x is None else f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"


def _overload_note(document: dict[str, Any]) -> str:
    """A marked sentence when the run was overloaded (arrivals outpaced the fleet): its latencies
    then depend on how long the run lasted."""
    if document.get("saturation") != OVERLOADED:
        return ""
    offered, done = document.get("offered_rate"), document.get("completed_rate_warm")
    unit = "turns/s" if ((document.get("record") or {}).get("workload") or {}).get("sessions") else "req/s"
    rates = (f" ({offered:.2f} {unit} offered, {done:.2f} completed once warm)"
             if offered is not None and done is not None else "")
    return (f' <span class="mark overloaded">Overloaded{rates}:</span> the queue grew for as long as the '
            "load lasted, so its latencies grow with the run's length.")


def _capacity_note(fleet: dict[str, Any]) -> list[str]:
    """The pool's full-batch capacity against the traffic's peak (simcore.autoscale_capacity), as
    the text output's Autoscaling section says it; marked where the peak is above the ceiling."""
    from kvsim.simcore.autoscale_capacity import capacity_lines

    lines = capacity_lines(fleet)
    if not lines:
        return []
    over = fleet["capacity"].get("peak_above_capacity")
    text = "; ".join(" ".join(line.split()) for line in lines)
    mark = ' <span class="mark overloaded">The peak is above what the pool can serve.</span>' if over else ""
    return [f'<p class="note">{html.escape_text(text)}.{mark}</p>']


def _rounded(value: Any) -> Any:
    """A JSON-ready value with its floats cut to 4 significant digits (for reading, not recomputing:
    summary.json keeps them whole)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def _provenance(document: dict[str, Any], extra: dict[str, str]) -> str:
    record = document["record"]
    workload = record.get("workload", {})
    items = {
        "kvsim / seed": f"kvsim {html.escape_text(str(record.get('kvsim_version')))}, seed {record.get('seed')}",
        "Model": html.escape_text(str(record.get("model", {}).get("name", record.get("model")))),
        "Workload": html.escape_text(f"{workload.get('name', '?')}: {json.dumps(_rounded(workload.get('arrival', {})))}"),
        **extra,
        "Engine": html.escape_text(_engine(document)),  # issue 27: the vLLM version every answer assumes
        "Versions": ", ".join(f"{k} {v}" for k, v in html.versions().items()),
    }
    return '<h2 id="made">How this run was made</h2>' + html.meta_table(items)


def _engine(document: dict[str, Any]) -> str:
    """The engine the run assumed (simcore.batch_defaults.engine_text), or the version its record has."""
    from kvsim.simcore.batch_defaults import engine_text

    assumed = document.get("engine_assumptions")
    if assumed and "pools" not in assumed:
        return engine_text(assumed)
    return str(document.get("engine_version") or document["record"].get("config", {}).get("engine_version", "?"))


# -- autoscaled runs --------------------------------------------------------------------------------
def hourly_rows(fleet: dict[str, Any]) -> pd.DataFrame:
    """Per "hour" of the workload: its requests, the autoscaled fleet's mean active replicas
    (time-weighted over the hour, from the replica timeline) and each fleet's SLO attainment."""
    hour_s, end = float(fleet["hour_s"]), float(fleet.get("duration_s") or 0.0)
    timeline = fleet["timeline"]
    static = {row["sized_for"]: {h["hour"]: h["attainment"] for h in row["hourly"]} for row in fleet.get("static", [])}
    rows = []
    for h in fleet["hourly"]:
        lo, hi = h["hour"] * hour_s, min((h["hour"] + 1) * hour_s, max(end, h["hour"] * hour_s))
        row = {"hour": h["hour"], "from_s": lo, "to_s": (h["hour"] + 1) * hour_s, "requests": h["requests"],
               "mean_active_replicas": _mean_active(timeline, lo, hi), "attainment": h["attainment"]}
        for sized_for, hours in static.items():
            row[f"static {sized_for.removeprefix('the ')}: attainment"] = hours.get(h["hour"])
        rows.append(row)
    return pd.DataFrame(rows)


def _mean_active(timeline: list, lo: float, hi: float) -> float | None:
    """Time-weighted mean of the active replicas over [lo, hi) (timeline rows: time, active, ...;
    each holds until the next)."""
    if hi <= lo or not timeline:
        return None
    total = 0.0
    for k, row in enumerate(timeline):
        start = float(row[0])
        stop = float(timeline[k + 1][0]) if k + 1 < len(timeline) else float("inf")
        overlap = min(stop, hi) - max(start, lo)
        if overlap > 0:
            total += overlap * row[1]
    return total / (hi - lo)


def cost_rows(fleet: dict[str, Any]) -> pd.DataFrame:
    """The autoscaled fleet against the static ones, one row each."""
    rows = [{"fleet": f"autoscaled ({fleet['config']['min_replicas']}-{fleet['config']['max_replicas']} replicas)",
             "replicas": f"{fleet['mean_active_replicas']:.2f} mean, {fleet['peak_active_replicas']} peak",
             "gpu_hours": fleet["gpu_hours"], "usd": fleet["usd"], "usd_per_day": fleet["usd_per_day"],
             "attainment": fleet["attainment"]}]
    for row in fleet.get("static", []):
        rows.append({"fleet": f"static, sized for {row['sized_for']}", "replicas": str(row["replicas"]),
                     "gpu_hours": row["gpu_hours"], "usd": row["usd"], "usd_per_day": row["usd_per_day"],
                     "attainment": row["attainment"]})
    return pd.DataFrame(rows)


def autoscale_answer(fleet: dict[str, Any]) -> str:
    """The answer in words: cost per day and attainment, against the static peak and mean fleets."""
    cfg, slo = fleet["config"], fleet["slo"]
    per_day = (f"{_usd(fleet['usd_per_day'])}/day at this traffic pattern" if fleet["usd_per_day"] is not None
               else "no price (--autoscale-config '{\"price_usd_per_gpu_hour\": X}')")
    text = (f"Autoscaling between {cfg['min_replicas']} and {cfg['max_replicas']} replicas ({cfg['metric']} "
            f"target {cfg['target']:g}) used {fleet['gpu_hours']:.2f} GPU-hours ({per_day}) and met the SLO "
            f"(TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms) for {_pct(fleet['attainment'])} "
            "of requests.")
    known = [h for h in fleet["hourly"] if h["attainment"] is not None]
    if known:
        worst = min(known, key=lambda h: h["attainment"])
        text += (f" Worst hour: {_pct(worst['attainment'])} (hour {worst['hour']})." if worst["attainment"] < 1
                 else " Every hour: 100%.")
    for row in fleet.get("static", []):
        cost = f", {_usd(row['usd_per_day'])}/day" if row["usd_per_day"] is not None else ""
        text += (f" A static fleet sized for {row['sized_for']} ({row['replicas']} replicas): "
                 f"{row['gpu_hours']:.2f} GPU-hours{cost}, attainment {_pct(row['attainment'])}.")
    saving = fleet.get("saving_vs_peak_fleet")
    if saving is not None:
        text += (f" Autoscaling uses {100 * saving:.0f}% fewer GPU-hours than the peak fleet." if saving >= 0
                 else f" Autoscaling uses {-100 * saving:.0f}% more GPU-hours than the peak fleet.")
    return text


def autoscale_page(document: dict[str, Any], figure: Path) -> str:
    """The page of an autoscaled run (`document`: the run's summary.json, with its "autoscale")."""
    fleet = document["autoscale"]
    record = document["record"]
    share = lambda v: _pct(None if pd.isna(v) else float(v))  # noqa: E731
    hourly = hourly_rows(fleet)
    formats = {c: share for c in hourly.columns if "attainment" in c}
    formats.update({"mean_active_replicas": lambda v: f"{float(v):.2f}", "from_s": lambda v: f"{float(v):g}",
                    "to_s": lambda v: f"{float(v):g}"})
    known = hourly["attainment"].dropna()
    worst = int(known.astype(float).idxmin()) if len(known) and known.min() < 1 else None
    classes = ["best" if i == worst else "" for i in range(len(hourly))]
    costs = cost_rows(fleet)
    cost_formats = {"gpu_hours": lambda v: f"{float(v):.2f}", "usd": _usd, "usd_per_day": _usd, "attainment": share}
    timeline = pd.DataFrame(fleet["timeline"], columns=["time_s", "active", "starting", "draining"])
    cfg = fleet["config"]
    gpu = record.get("gpu", {}).get("name", "?")
    tp = record.get("config", {}).get("tensor_parallel_size", 1)
    profile = record.get("profile", {})
    body = [
        f"<h1>kvsim autoscaled run: {html.escape_text(str(record.get('model', {}).get('name', '')))} on "
        f"{html.escape_text(str(gpu))} (TP {tp} per replica)</h1>",
        f'<p class="answer"><b>Answer.</b> {html.escape_text(autoscale_answer(fleet))}{_overload_note(document)}</p>',
        "<h2>Cost per day against static fleets</h2>",
        html.table(costs, cost_formats, key=["fleet"], lift_constants=False),
        f'<p class="note">$/day scales the run\'s cost to 24 h of the same pattern ({fleet["duration_s"]:,.0f} s '
        f"simulated; an \"hour\" of the workload is {fleet['hour_s']:g} s); a static fleet is paid for the "
        "whole run, the autoscaled one for every replica from its start request to the end of its drain.</p>",
        *_capacity_note(fleet),
        "<h2>SLO attainment per hour</h2>",
        html.table(hourly, formats, classes, key=["hour"], lift_constants=False),
        '<p class="note">Highlighted: the worst hour (if any missed). Attainment: share of the hour\'s requests (by arrival) '
        "meeting both SLO limits.</p>",
        "<h2>Replicas over time</h2>",
        html.figure(figure, "Top: active replicas (solid) and paid ones incl. starting and draining (dashed) over "
                            "the run, static fleets dotted; bottom: SLO attainment per hour of the workload."),
        f"<details><summary>Replica timeline ({len(timeline)} changes)</summary>"
        + html.table(timeline, {"time_s": lambda v: f"{float(v):,.1f}"}, key=["time_s"], lift_constants=False)
        + "</details>",
        _provenance(document, {
            "GPU / profile": html.escape_text(f"{gpu}, TP {tp}: {profile.get('label')} sha256 "
                                              f"{str(profile.get('sha256'))[:12]}"),
            "Autoscaler": html.code(json.dumps(_rounded(cfg))),
            "Cold start": f"{fleet['cold_start_s']:.1f} s per replica (provisioning {cfg['provisioning_s']:g} s, "
                          "then model load and warm-up)",
            "Price": "n/a" if fleet["usd_per_gpu_hour"] is None else f"${fleet['usd_per_gpu_hour']:g} per GPU-hour",
        }),
    ]
    return html.page("kvsim autoscaled run", body)


# -- heterogeneous fleets ----------------------------------------------------------------------------
def group_rows(document: dict[str, Any], cols: dict[str, np.ndarray] | None, prices: dict[str, float],
               counts: tuple[np.ndarray, np.ndarray] | None = None) -> pd.DataFrame:
    """Per GPU group of a --fleet run: replicas, $/h, and what it served (requests, output tokens,
    TTFT / TPOT p95 of its finished requests), from the request table's replica column; a run past
    the kept rows (`cols` None) from `counts` (RequestRecords.replica_requests, replica_positions,
    counted as rows left), without the per-group p95s."""
    rows, start = [], 0
    finished = cols["status"] == "finished" if cols is not None else None
    total = len(cols["replica"]) if cols is not None else int(counts[0].sum())
    for group in document["record"]["fleet"]:
        end = start + group["replicas"]
        price = prices.get(group["gpu"])
        if cols is not None:
            mine = np.isin(cols["replica"], np.arange(start, end))
            done = mine & finished
            tpot = cols["tpot_s"][done]
            tpot = tpot[np.isfinite(tpot)]
            served, tokens = int(mine.sum()), int(cols["num_positions"][mine].sum())
            ttft_p95 = float(np.percentile(cols["ttft_s"][done], 95) * 1000) if done.any() else None
            tpot_p95 = float(np.percentile(tpot, 95) * 1000) if len(tpot) else None
        else:
            served, tokens = int(counts[0][start:end].sum()), int(counts[1][start:end].sum())
            ttft_p95 = tpot_p95 = None
        rows.append({
            "group": f"{group['replicas']} x TP{group['tp']} {group['gpu']}",
            "gpus": group["replicas"] * group["tp"],
            "usd_per_hour": None if price is None else price * group["replicas"] * group["tp"],
            "requests": served, "share": float(served) / max(1, total),
            "output_tokens": tokens, "ttft_p95_ms": ttft_p95, "tpot_p95_ms": tpot_p95,
            "kv_cache_tokens_per_replica": group["kv_cache_tokens"],
            "max_num_seqs": group.get("max_num_seqs"), "max_num_batched_tokens": group.get("max_num_batched_tokens"),
        })
        start = end
    return pd.DataFrame(rows)


def fleet_answer(document: dict[str, Any], groups: pd.DataFrame) -> str:
    usd = document["record"].get("fleet_usd_per_hour")
    cost = f"${usd:,.2f}/h, ${24 * usd:,.0f}/day" if usd is not None else "no built-in price for a GPU"
    layout = " + ".join(groups["group"])
    return (f"A fleet of {layout} ({int(groups['gpus'].sum())} GPUs, {cost}) served "
            f"{document.get('completed', 0):,} requests at {document.get('output_throughput', 0):,.0f} output tok/s: "
            f"TTFT p95 {document.get('p95_ttft_ms') or 0:,.0f} ms, TPOT p95 {document.get('p95_tpot_ms') or 0:,.1f} ms. "
            + "; ".join(f"{r.group} took {100 * r.share:.0f}% of the requests" for r in groups.itertuples()) + ".")


def fleet_page(document: dict[str, Any], groups: pd.DataFrame) -> str:
    """The page of a heterogeneous-fleet run (`document`: the run's summary.json)."""
    record = document["record"]
    formats = {"usd_per_hour": lambda v: f"${float(v):,.2f}", "share": lambda v: f"{100 * float(v):.1f}%",
               "ttft_p95_ms": lambda v: f"{float(v):,.1f}", "tpot_p95_ms": lambda v: f"{float(v):,.1f}"}
    whole = {k: document.get(k) for k in ("completed", "request_throughput", "output_throughput", "mean_ttft_ms",
                                          "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p95_tpot_ms",
                                          "p99_tpot_ms", "max_concurrent_requests", "saturation")}
    body = [
        f"<h1>kvsim fleet run: {html.escape_text(str(record.get('model', {}).get('name', '')))} on "
        f"{html.escape_text(' + '.join(groups['group']))}</h1>",
        f'<p class="answer"><b>Answer.</b> {html.escape_text(fleet_answer(document, groups))}'
        f"{_overload_note(document)}</p>",
        "<h2>Per GPU group</h2>",
        html.table(groups, formats, key=["group"], lift_constants=False),
        '<p class="note">One router (least-loaded) spreads the requests over every replica; each group runs '
        "its own profile and KV cache. Prices: built-in on-demand $/GPU-hour (reports/prices.py).</p>",
        "<h2>The whole fleet</h2>",
        html.table(pd.DataFrame([whole]), lift_constants=False),
        _provenance(document, {
            "Profiles": "<br>".join(html.escape_text(f"{g['replicas']} x TP{g['tp']} {g['gpu']}: {g['profile']['label']} "
                                                     f"sha256 {g['profile']['sha256'][:12]}")
                                    for g in record["fleet"]),
            "Router": html.escape_text(str(record.get("config", {}).get("router", "?"))),
        }),
    ]
    return html.page("kvsim fleet run", body)


__all__ = ["autoscale_page", "cost_rows", "fleet_page", "group_rows", "hourly_rows"]
