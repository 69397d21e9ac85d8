"""disagg.html, the page `kvsim run --prefill-replicas N --decode-replicas M ... --out DIR` writes:
a disaggregated run (simcore.disagg: a prefill pool and a decode pool behind vLLM's P/D proxy, KV
moved between them). Results first: the answer (what the layout served, at what latency and price,
which pool is the busier, what the KV transfer cost), then each pool's figures, the transfer
statistics, a figure of both pools over time, and how the run was made. Everything comes from the
run's summary document (summary.json) and its step table, so the page says nothing the files do not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.reports import html
from kvsim.reports.fleet_page import _overload_note, _provenance

_STATS = (("mean", "mean"), ("p50", "p50"), ("p95", "p95"), ("p99", "p99"))
_TRANSFER_ROWS = (("transfer", "KV transfer (bytes over the link)"),
                  ("decode_wait", "wait for decode admission (prefilled -> transfer starts)"),
                  ("prefill_held", "KV held on the prefill side (prefilled -> transfer done)"))


def _usd_per_hour(document: dict[str, Any], prices: dict[str, float]) -> float | None:
    price = prices.get(document["record"].get("gpu", {}).get("name"))
    gpus = document.get("num_gpus") or document["record"]["disagg"].get("num_gpus")
    return None if price is None or gpus is None else price * gpus


def pool_rows(document: dict[str, Any]) -> pd.DataFrame:
    """One row per pool: its layout and what it did (busy share, batch, queueing, KV)."""
    rows = []
    for name, pool in document.get("pools", {}).items():
        rows.append({
            "pool": name, "layout": f"{pool['replicas']} x TP{pool['tp']}", "gpus": pool["num_gpus"],
            "busy_share": pool.get("utilization"), "mean_batch_seqs": pool.get("mean_batch_size"),
            "max_running": pool.get("max_running"), "steps": pool.get("num_steps"),
            "preemptions": pool.get("num_preemptions"), "kv_waste": pool.get("kv_waste_rate"),
            "kv_cache_tokens_per_replica": pool.get("kv_cache_tokens_per_replica"),
            "mean_queue_ms": pool.get("mean_queue_ms"), "p95_queue_ms": pool.get("p95_queue_ms"),
            "mean_prefill_ms": pool.get("mean_prefill_ms"), "p95_prefill_ms": pool.get("p95_prefill_ms"),
        })
    return pd.DataFrame(rows)


def transfer_rows(document: dict[str, Any]) -> pd.DataFrame:
    """Per-request KV transfer times, mean and percentiles (ms)."""
    t = document.get("kv_transfer", {})
    return pd.DataFrame([{"what": label, **{col: t.get(f"{stat}_{key}_ms") for stat, col in _STATS}}
                         for key, label in _TRANSFER_ROWS])


def _busier(pools: pd.DataFrame) -> str:
    """How busy each pool was, without reading more into it: an instance steps whenever one of its
    requests is being worked on, so a decode pool near 100% is not by itself a full one."""
    if len(pools) < 2 or pools["busy_share"].isna().any():
        return ""
    busy = pools.set_index("pool")["busy_share"].astype(float)
    return (" Busy (stepping) share of the run: " + ", ".join(f"{name} {100 * v:.1f}%" for name, v in busy.items())
            + "; a pool steps whenever one of its requests is in work, so see its batch size and KV use before "
              "calling it full.")


def disagg_answer(document: dict[str, Any], pools: pd.DataFrame, usd_per_hour: float | None) -> str:
    """The answer in words: layout, price, what it served, the busier pool, what the transfer cost."""
    info = document["record"]["disagg"]
    link = info["link"]
    cost = f"${usd_per_hour:,.2f}/h" if usd_per_hour is not None else "no built-in price for this GPU"
    layout = " + ".join(f"{r.pool} {r.layout}" for r in pools.itertuples())
    text = (f"{layout} ({info['num_gpus']} GPUs, {cost}) served {document.get('completed', 0):,} requests at "
            f"{document.get('output_throughput', 0):,.0f} output tok/s: TTFT p95 {document.get('p95_ttft_ms') or 0:,.0f} ms, "
            f"TPOT p95 {document.get('p95_tpot_ms') or 0:,.1f} ms, ITL p99 {document.get('p99_itl_ms') or 0:,.1f} ms.")
    text += _busier(pools)
    t = document.get("kv_transfer", {})
    if t.get("num_transfers"):
        text += (f" {t['num_transfers']:,} KV transfers over {link['connector']} ({link['placement']}, "
                 f"{link['bandwidth_gbps']:,.0f} GB/s) took {t['mean_transfer_ms']:.2f} ms on average "
                 f"(p99 {t['p99_transfer_ms']:.2f} ms); the wait for decode admission before them, "
                 f"{t['mean_decode_wait_ms']:.1f} ms on average.")
    return text


def pools_figure(steps: dict[str, np.ndarray], pools: pd.DataFrame, path: Path) -> bool:
    """Sequences per step and KV in use (share of the instance's cache) over time, one colour per
    pool and a line per instance; False (nothing drawn) without kept step rows."""
    if not steps or "pool" not in steps or len(steps["pool"]) == 0:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capacity = {r.pool: r.kv_cache_tokens_per_replica for r in pools.itertuples()}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    for colour, name in zip(("#3b6fd4", "#d4763b"), ("prefill", "decode"), strict=True):
        mine = steps["pool"] == name
        for k, instance in enumerate(np.unique(steps["instance"][mine])):
            rows = mine & (steps["instance"] == instance)
            order = np.argsort(steps["start_s"][rows], kind="stable")
            x = steps["start_s"][rows][order]
            stride = max(1, len(x) // 4000)  # a readable line, not every step
            label = name if k == 0 else None
            top.step(x[::stride], steps["num_seqs"][rows][order][::stride], where="post", color=colour,
                     alpha=0.8, label=label, linewidth=0.9)
            if capacity.get(name):
                bottom.step(x[::stride], 100 * steps["kv_allocated"][rows][order][::stride] / capacity[name],
                            where="post", color=colour, alpha=0.8, label=label, linewidth=0.9)
    top.set_ylabel("sequences per step")
    bottom.set_ylabel("KV cache in use (%)")
    bottom.set_xlabel("simulated time (s)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle("Prefill and decode pools over the run (a line per instance)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return True


def disagg_page(document: dict[str, Any], steps: dict[str, np.ndarray], prices: dict[str, float],
                figure_dir: Path) -> str:
    """The page of a disaggregated run (`document`: the run's summary.json; `steps`: steps.csv's
    columns; the figure is drawn in `figure_dir`, a scratch folder)."""
    record = document["record"]
    info = record["disagg"]
    pools = pool_rows(document)
    usd = _usd_per_hour(document, prices)
    share = lambda v: f"{100 * float(v):.1f}%"  # noqa: E731
    ms = lambda v: f"{float(v):,.1f}" if float(v) >= 1 else f"{float(v):.3f}"  # noqa: E731
    formats = {"busy_share": share, "kv_waste": share, "mean_batch_seqs": lambda v: f"{float(v):.2f}",
               **{c: ms for c in pools.columns if c.endswith("_ms")}}
    transfers = transfer_rows(document)
    t = document.get("kv_transfer", {})
    link = info["link"]
    png = figure_dir / "disagg-pools.png"
    drawn = pools_figure(steps, pools, png)
    whole = {k: document.get(k) for k in ("completed", "request_throughput", "output_throughput", "mean_ttft_ms",
                                          "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p95_tpot_ms", "p99_itl_ms",
                                          "max_concurrent_requests", "saturation")}
    body = [
        f"<h1>kvsim disaggregated run: {html.escape_text(str(record.get('model', {}).get('name', '')))} on "
        f"{info['num_gpus']} x {html.escape_text(str(record.get('gpu', {}).get('name', '?')))}</h1>",
        f'<p class="answer"><b>Answer.</b> {html.escape_text(disagg_answer(document, pools, usd))}'
        f"{_overload_note(document)}</p>",
        "<h2>Per pool</h2>",
        html.table(pools, formats, key=["pool"], lift_constants=False),
        '<p class="note">busy_share: the share of the run each instance spent stepping (mean over the pool\'s '
        "instances); queue and prefill times: from a request's arrival at the prefill pool to its first step there, "
        "and its prefill's length. The decode pool receives each request's KV and generates its tokens.</p>",
        "<h2>KV transfer</h2>",
        html.table(transfers, {c: ms for _, c in _STATS}, key=["what"], lift_constants=False,
                   wrap=["what"]),
        f'<p class="note">{t.get("num_transfers", 0):,} transfers, {t.get("bytes_moved", 0) / 2**30:,.2f} GiB moved '
        f"({t.get('mean_bytes_per_transfer', 0) / 2**20:,.1f} MiB each on average, {info['kv_bytes_per_token']:,} B "
        f"per prompt token), at most {t.get('max_transfers_in_flight', 0)} in flight; "
        f"{t.get('mean_kv_held_for_transfer_gib', 0):.3f} GiB of KV held for transfers on average. Link: "
        f"{html.escape_text(str(link['connector']))} {html.escape_text(str(link['placement']))}, "
        f"{link['latency_us']:.1f} us + bytes / {link['bandwidth_gbps']:,.1f} GB/s "
        f"({html.escape_text(str(link.get('source', '')))}).</p>",
    ]
    if drawn:
        body += ["<h2>Both pools over time</h2>",
                 html.figure(png, "Top: sequences in each step of each instance (blue: prefill, orange: decode); "
                                  "bottom: KV cache in use as a share of the instance's cache.")]
    body += [
        "<h2>The whole run (client side)</h2>",
        html.table(pd.DataFrame([whole]), lift_constants=False),
        _provenance(document, {
            "Pools": "<br>".join(html.escape_text(
                f"{name}: {info[name]['replicas']} x TP{info[name]['config']['tensor_parallel_size']}, "
                f"{info[name]['profile']['label']} sha256 {info[name]['profile']['sha256'][:12]}")
                for name in ("prefill", "decode")),
            "Routers": html.escape_text(f"prefill {info.get('prefill_router')}, decode {info.get('decode_router')}"),
            "Price": "n/a" if usd is None else f"${usd / info['num_gpus']:g} per GPU-hour (reports/prices.py)",
        }),
    ]
    return html.page("kvsim disaggregated run", body)


__all__ = ["disagg_answer", "disagg_page", "pool_rows", "transfer_rows"]
