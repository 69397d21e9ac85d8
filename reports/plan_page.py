"""plan.html, the page `kvsim plan --out DIR` writes beside plan.csv / plan.json / capacity.png.
Answer first (per model and target rate: the chosen deployment, its $/h, the SLO and what the
confirmation run measured against it, the profile kind the step times come from, the `vllm serve`
line to run), then the candidate table, the chart, and how the plan was made. Everything comes from
the plan document (plan.json) and the chart, so the page says nothing the files do not."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.reports import html
from kvsim.reports.plan import _KNOBS, PROFILE_KINDS

# a percentile column of a plan row beyond the two p95s (reports.capacity.Target.column)
_PERCENTILE_COLUMN = re.compile(r"^(ttft|tpot|itl|e2el)_p[0-9.]+_ms$")


def _money(x: Any) -> str:
    return "n/a" if x is None or pd.isna(x) else f"${float(x):,.2f}"


def _ms(x: Any) -> str:
    return "n/a" if x is None or pd.isna(x) else f"{float(x):,.0f}" if float(x) >= 100 else f"{float(x):.1f}"


def _ok(row: dict[str, Any]) -> bool:
    replicas = row.get("replicas")
    return replicas is not None and not pd.isna(replicas)


def deployment(row: dict[str, Any]) -> str:
    """5 x TP4 H100-SXM-80GB (a sized row) or TP4 H100-SXM-80GB (one ruled out before sizing)."""
    return (f"{int(row['replicas'])} x TP{row['tp']} {row['gpu']}" if _ok(row) else f"TP{row['tp']} {row['gpu']}")


def _knobs(row: dict[str, Any]) -> str:
    return " ".join(f"{k}={row[k]}" for k in _KNOBS if row.get(k) is not None and not pd.isna(row[k])) or "default"


def answer_block(answer: dict[str, Any], doc: dict[str, Any]) -> str:
    """One answer in words, then the `vllm serve` line; or why nothing met the SLO."""
    unit = doc.get("rate_unit", "req/s")
    slo = doc.get("slo_text", "")
    head = f"{answer['model']} at {answer['target_rate']:g} {unit}"
    best = answer.get("best")
    if best is None:
        return (f'<div class="answer"><p><b>Answer for {html.escape_text(head)}:</b> nothing meets '
                f"{html.escape_text(slo)}. {html.escape_text(str(answer.get('why_none') or ''))}</p></div>")
    kind = best.get("profile_source")
    bound = "under " if best.get("max_rate_bound") else "at least " if best.get("capped") else "~"
    measured = [f"TTFT p95 {_ms(best.get('ttft_p95_ms'))} ms", f"TPOT p95 {_ms(best.get('tpot_p95_ms'))} ms"]
    measured += [f"{c.split('_')[0].upper()} {c.split('_')[1]} {_ms(best[c])} ms" for c in best
                 if _PERCENTILE_COLUMN.match(c) and c not in ("ttft_p95_ms", "tpot_p95_ms") and best[c] is not None]
    conf = answer.get("confidence", doc.get("confidence", 0.5))
    parts = [
        f"<p><b>Answer for {html.escape_text(head)}:</b> <b>{html.escape_text(deployment(best))}</b> "
        f"({best['gpus']:g} GPU{'s' if best['gpus'] != 1 else ''}, <b>{_money(best['usd_per_hour'])}/h</b>, "
        f"{_money(best.get('usd_per_m_output_tokens'))} per M output tokens).</p>",
        f"<p>SLO: <b>{html.escape_text(slo)}</b>. A {best['replicas']}-replica run at {answer['target_rate']:g} {unit} "
        f"measured {html.escape_text(', '.join(measured))} (confirmed: {html.escape_text(str(best.get('confirmed')))}); "
        f"it sustains {bound}{best['max_rate']:.1f} {unit} "
        f"({'under ' if best.get('max_rate_bound') else ''}{100 * best['headroom']:+.0f}% headroom).</p>",
        f"<p>Step times from a <b>{html.escape_text(PROFILE_KINDS.get(kind, f'{kind} profile'))}</b>"
        f" (planned at {100 * conf:g}% confidence under the profiles' stated error).</p>",
    ]
    p = answer.get("slo_probability")
    if p is not None:
        parts.append(f"<p>Meets the SLO with probability {100 * p['probability']:.1f}% under the profile's stated "
                     f"error (median {html.escape_text(p['model_error'].get('text', ''))} per step).</p>")
    if best.get("vllm_serve"):
        lb = " behind a load balancer" if best["replicas"] > 1 else ""
        parts.append(f"<p>Serve it: {best['replicas']} replica{'s' if best['replicas'] > 1 else ''}{lb}, "
                     f"each</p><pre class=\"serve\"><code>{html.escape_text(best['vllm_serve'])}</code></pre>")
    return f'<div class="answer">{"".join(parts)}</div>'


def candidate_rows(doc: dict[str, Any], answer: dict[str, Any]) -> pd.DataFrame:
    """The candidates of one answer, ranked as the text table ranks them (sized rows by cost first,
    then those ruled out, with why)."""
    rows = [r for r in doc["candidates"]
            if r["model"] == answer["model"] and float(r["target_rate"]) == float(answer["target_rate"])]
    extra = sorted({c for r in rows for c in r if _PERCENTILE_COLUMN.match(c)} - {"ttft_p95_ms", "tpot_p95_ms"})
    out, rank = [], 0
    for r in rows:
        ok = _ok(r)
        rank += ok
        out.append({
            "rank": rank if ok else None, "deployment": deployment(r), "engine": _knobs(r),
            "gpus": int(r["gpus"]) if ok else None, "usd_per_hour": r.get("usd_per_hour") if ok else None,
            "max_rate": r.get("max_rate") if ok else None, "headroom": r.get("headroom") if ok else None,
            "ttft_p95_ms": r.get("ttft_p95_ms"), "tpot_p95_ms": r.get("tpot_p95_ms"),
            **{c: r.get(c) for c in extra},
            "usd_per_m_out": r.get("usd_per_m_output_tokens"), "confirmed": r.get("confirmed") if ok else None,
            "profile": r.get("profile_source"), "status": "" if r.get("status") == "ok" else str(r.get("status")),
        })
    return pd.DataFrame(out)


def _is_best(row: pd.Series, best: dict[str, Any] | None) -> bool:
    return best is not None and row["deployment"] == deployment(best) and row["engine"] == _knobs(best)


_DISAGG_COLUMNS = ("deployment", "prefill", "decode", "gpus", "usd_per_hour", "max_rate", "ttft_p95_ms",
                   "tpot_p95_ms", "confirmed", "status")


def disagg_section(disagg: dict[str, Any], unit: str) -> list[str]:
    """`--disagg auto`: which layout is cheaper at each target (plan.json's disagg.answers[].comparison),
    then the disaggregated candidates (prefill and decode pools per unit)."""
    out = ["<h2>Disaggregated prefill/decode layouts</h2>"]
    for a in disagg.get("answers", []):
        out.append(f"<p>At {a['target_rate']:g} {unit} for {html.escape_text(str(a['model']))}: "
                   f"<b>{html.escape_text(str(a.get('comparison', '')))}</b>.</p>")
    rows = [{c: (r.get(c) if c != "status" or r.get(c) != "ok" else "") for c in _DISAGG_COLUMNS}
            | {"deployment": r.get("deployment") or f"unit {r.get('prefill')}P+{r.get('decode')}D {r.get('gpu')}"}
            for r in disagg.get("candidates", [])]
    if rows:
        frame = pd.DataFrame(rows)
        classes = ["" if not r["status"] else "ruled" for r in rows]
        out.append(html.table(frame, {"usd_per_hour": _money, "max_rate": lambda v: f"{float(v):.1f}",
                                      "ttft_p95_ms": _ms, "tpot_p95_ms": _ms, "gpus": lambda v: f"{int(v)}"},
                              classes, key=["deployment"], wrap=["status"]))
    return out


def plan_page(doc: dict[str, Any], figure: Path | None) -> str:
    """The whole page of one plan (`doc`: plan.json; `figure`: capacity.png)."""
    unit = doc.get("rate_unit", "req/s")
    models = sorted({a["model"] for a in doc["answers"]})
    rates = ", ".join(sorted({f"{a['target_rate']:g}" for a in doc["answers"]}, key=float))
    body = [f"<h1>kvsim plan: {html.escape_text(', '.join(models))} at {rates} {unit}</h1>"]
    body += [answer_block(a, doc) for a in doc["answers"]]
    formats = {"usd_per_hour": _money, "usd_per_m_out": _money, "max_rate": lambda v: f"{float(v):.1f}",
               "headroom": lambda v: f"{100 * float(v):+.0f}%", "rank": lambda v: f"{int(v)}",
               "gpus": lambda v: f"{int(v)}"}
    for a in doc["answers"]:
        frame = candidate_rows(doc, a)
        if frame.empty:
            continue
        fmts = {**formats, **{c: _ms for c in frame.columns if c.endswith("_ms")}}
        classes = ["best" if _is_best(r, a.get("best")) else "" if r["status"] == "" else "ruled"
                   for _, r in frame.iterrows()]
        body += [f"<h2>Candidates for {html.escape_text(a['model'])} at {a['target_rate']:g} {unit}</h2>",
                 html.table(frame, fmts, classes, key=["deployment"], wrap=["status", "engine"]),
                 '<p class="note">Highlighted: the answer. Sized rows in the plan\'s order (cheapest first); '
                 "<i>max_rate</i> is replicas x one replica's highest sustained rate; the "
                 "latencies are the confirmation run's at the target rate. Greyed rows were ruled out before "
                 "sizing, for the reason in <i>status</i>.</p>"]
    if figure is not None:
        body += ["<h2>Capacity</h2>",
                 html.figure(figure, "Sustainable rate against GPUs for each candidate (n replicas x one replica's "
                                     "highest sustained rate); the target rate dashed.")]
    if isinstance(doc.get("disagg"), dict):
        body += disagg_section(doc["disagg"], unit)
    wl = doc.get("workload", {})
    engine = doc.get("engine", {})
    profiles = sorted({f"{r['gpu']} TP{r['tp']}: {r.get('profile_source')} sha256 {str(r.get('profile_sha256'))[:12]}"
                       for r in doc["candidates"] if r.get("profile_sha256")})
    meta = {
        "Workload": html.escape_text(f"{wl.get('name')}, {wl.get('num_requests')} requests, arrival "
                                     f"{wl.get('arrival', {}).get('process')}"),
        "SLO": html.escape_text(doc.get("slo_text", "")),
        "Search": html.escape_text(f"{doc.get('num_runs')} simulations; {doc.get('search_requests')} requests per search "
                                   f"run, {doc.get('confirm_requests')} per confirmation; rate within "
                                   f"{100 * doc.get('tolerance', 0):g}%; seed {doc.get('seed')}"),
        "Engine": html.escape_text(" ".join(f"{k}={v}" for k, v in engine.items() if v is not None)),
        "Prices": html.escape_text(f"as of {doc.get('prices_as_of')}: "
                                   + ", ".join(f"{g} ${p:g}" for g, p in doc.get("prices_usd_per_gpu_hour", {}).items())
                                   + f" per GPU-hour ({doc.get('price_source')})"),
        "Profiles": "<br>".join(html.escape_text(p) for p in profiles) or "none",
        "Versions": ", ".join(f"{k} {v}" for k, v in html.versions().items()),
    }
    body += ['<h2 id="made">How this was made</h2>', html.meta_table(meta)]
    return html.page("kvsim plan", body)


__all__ = ["candidate_rows", "deployment", "plan_page"]
