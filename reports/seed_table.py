"""The seed article's benchmark table rerun with kvsim: rows, a markdown report and a figure.

The article (shared/seed/README.md) gives no prompt/output lengths, GPU count or tensor
parallelism; the settings below are our assumptions and the report states each of them.
Nothing here is tuned to the article's figures: they are printed beside kvsim's, and the
"where kvsim disagrees" section is arithmetic on both plus a fixed paragraph on mechanisms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.reports.regime import BLOCKED_SHARE_THRESHOLD, MEMORY_BOUND, PEAK_KV_THRESHOLD, regime_of
from kvsim.simcore.specs import DEFAULT_ENGINE_VERSION

GPU = "H100-SXM-80GB"
MODEL = "llama3-70b"
WORKLOAD = "seed-table"
NODE_GPUS = 8  # "a single H100 node": we assume the usual 8-GPU HGX node

# The article's table: output tok/s, KV waste (share), TTFT p95 (ms); rows are its engines.
ARTICLE_FIGURES = {
    "static": (412.0, 0.748, 1840.0),
    "dynamic": (890.0, 0.521, 920.0),
    "continuous": (1850.0, 0.036, 310.0),
}
ARTICLE_ENGINES = {
    "static": "static batching (naive PyTorch)",
    "dynamic": "TGI early (dynamic batching)",
    "continuous": "vLLM (PagedAttention + continuous batching)",
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One column of assumptions the article leaves open."""

    name: str
    tp: int  # GPUs per replica (one replica per setting)
    clients: int  # closed-loop concurrency
    max_tokens: int | None  # what clients send; None: a reservation knows the true output
    why: str  # one line for the report


SETTINGS = (
    Setting("seed", 8, 64, None, "the article's 64 concurrent requests, one replica over the whole "
            "node, clients send no max_tokens (a reservation is sized by the true output)"),
    Setting("seed-cap", 8, 64, 2048, "the same, clients send max_tokens=2048 (what a reservation "
            "must assume when the output length is unknown)"),
    Setting("mem-bound", 4, 256, 2048, "half the node (TP 4), 256 clients, max_tokens=2048: a "
            "setting where reservations run out of KV memory"),
    Setting("kv-tight", 2, 64, 2048, "a quarter of the node (TP 2): the weights leave room for "
            "about 25k KV tokens, so KV memory binds for every policy, paging included"),
)
POLICIES: dict[str, dict[str, Any]] = {
    "static": dict(policy="static", max_batch_size=64, batch_timeout_s=0.1),
    "dynamic": dict(policy="dynamic"),
    "continuous": dict(policy="continuous", allocator="paged", block_size=16),
}


@dataclass
class SeedTableReport:
    """The rows of one reproduction and what is needed to reproduce it."""

    rows: pd.DataFrame  # one row per (setting, policy); deterministic for a seed
    num_requests: int
    seed: int
    kvsim_version: str
    profiles: dict[int, dict[str, str]]  # tp -> {"label", "source", "sha256"}
    max_model_len: int
    wall_s: float = 0.0  # not part of the deterministic result
    warnings: list[str] = field(default_factory=list)
    series: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (setting, policy) -> _series()


def run_point(setting: Setting, policy: str, num_requests: int, seed: int):
    """Simulate one (setting, policy) cell; returns the simulate() Result."""
    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.simulate import simulate
    from kvsim.simcore.specs import EngineConfig
    from kvsim.workloads import load_workload

    gpu, model = get_gpu(GPU), get_model(MODEL)
    config = EngineConfig(tensor_parallel_size=setting.tp, **POLICIES[policy])
    overrides = {"num_requests": num_requests, "concurrency": setting.clients, "max_tokens": setting.max_tokens}
    workload = load_workload(WORKLOAD, overrides, max_model_len=config.resolved_max_model_len(model))
    profile = default_profile(gpu, model, setting.tp)
    return simulate(model, gpu, config, workload, profile, seed=seed)


def _row(setting: Setting, policy: str, result) -> dict[str, Any]:
    s, req, totals = result.summary, result.requests, result.totals
    done = req[req["status"] == "finished"]
    regime = regime_of(result)
    article = ARTICLE_FIGURES[policy] if setting.name == "seed" else (None, None, None)
    return {
        "setting": setting.name, "policy": policy, "tp": setting.tp, "clients": setting.clients,
        "max_tokens": setting.max_tokens, "kv_tokens": result.memory.num_gpu_tokens,
        "completed": s["completed"], "mean_prompt_tokens": float(done["num_prompt_tokens"].mean()),
        "mean_output_tokens": float(done["num_output_tokens"].mean()),
        "output_tps": s["output_throughput"], "total_tps": s["total_token_throughput"],
        "kv_waste": s["kv_waste_rate"], "kv_future": s.get("kv_reserved_future_share", 0.0),
        "kv_internal": s.get("kv_internal_share", 0.0), "kv_stale": s.get("kv_stale_share", 0.0),
        "kv_external": s.get("kv_external_share", 0.0),
        "ttft_p95_ms": s["p95_ttft_ms"], "tpot_p95_ms": s["p95_tpot_ms"],
        "mean_running": totals.running_s / totals.duration_s,  # exact, whatever the step table keeps
        "peak_kv_use": regime.peak_kv_use, "kv_blocked_share": regime.kv_blocked_share,
        "preemptions": s["num_preemptions"], "regime": regime.label,
        "profile_source": result.record["profile"]["source"],
        "profile_sha256": result.record["profile"]["sha256"],  # whole: the CSV is the record
        "article_output_tps": article[0], "article_kv_waste": article[1], "article_ttft_p95_ms": article[2],
    }


def build_seed_table(num_requests: int = 1000, seed: int = 0, progress=None) -> SeedTableReport:
    """Run every setting x policy with the same seed (so each policy sees the same traffic)."""
    started = time.perf_counter()
    rows, profiles, warnings, series = [], {}, [], {}
    version, max_model_len = "", 0
    cells = [(st, pol) for st in SETTINGS for pol in POLICIES]
    if progress is not None:
        progress(0, len(cells))
    for i, (setting, policy) in enumerate(cells):
        result = run_point(setting, policy, num_requests, seed)
        rows.append(_row(setting, policy, result))
        p = result.record["profile"]
        profiles[setting.tp] = {"label": p["label"], "source": p["source"], "sha256": p["sha256"]}
        version, max_model_len = result.record["kvsim_version"], result.memory.max_model_len
        warnings += [f"{setting.name}/{policy}: {w}" for w in result.warnings]
        series[(setting.name, policy)] = _series(result)
        if progress is not None:
            progress(i + 1, len(cells))
    frame = pd.DataFrame(rows).astype({"max_tokens": "Int64"})
    return SeedTableReport(frame, num_requests, seed, version, profiles, max_model_len,
                           time.perf_counter() - started, warnings, series)


FILES = ("seed-table.md", "seed-table.csv", "seed-table.html", "seed-table.png", "seed-table-kv.png",
         "seed-table-ttft.png")
KV_PARTS = (  # step-table column, legend label (DESIGN.md "KV waste")
    ("kv_live", "live tokens"), ("kv_reserved_future", "reserved for future tokens"),
    ("kv_internal", "over-reserved / internal fragmentation"), ("kv_stale", "stale (finished, still held)"),
    ("kv_external", "external fragmentation (free, unusable)"),
)
MAX_POINTS = 400  # time bins per KV series: enough for the figure, small in memory


def _series(result) -> dict[str, Any]:
    """What the figures need from one run: the KV breakdown over time (time-weighted means in at
    most MAX_POINTS bins, as % of the KV cache) and the sorted TTFTs of finished requests."""
    import numpy as np

    steps, capacity = result.steps, max(1, result.memory.num_gpu_tokens)
    start, dt = steps["start_s"].to_numpy(), steps["duration_s"].to_numpy()
    t0, t1 = (float(start.min()), float((start + dt).max())) if len(steps) else (0.0, 1.0)
    edges = np.linspace(t0, t1, MAX_POINTS + 1)
    which = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, MAX_POINTS - 1)
    weight = np.bincount(which, weights=dt, minlength=MAX_POINTS)
    keep = weight > 0
    out: dict[str, Any] = {"t_s": ((edges[:-1] + edges[1:]) / 2)[keep], "capacity": capacity}
    for col, _ in KV_PARTS:
        total = np.bincount(which, weights=steps[col].to_numpy() * dt, minlength=MAX_POINTS)
        out[col] = 100.0 * total[keep] / weight[keep] / capacity
    done = result.requests[result.requests["status"] == "finished"]
    out["ttft_ms"] = np.sort(1000.0 * done["ttft_s"].to_numpy())
    return out


# -- markdown ------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "" if x is None or pd.isna(x) else f"{100 * x:.1f}%"


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "" if x is None or pd.isna(x) else format(x, fmt)


def command_line(report: SeedTableReport) -> str:
    return f"kvsim report seed-table --num-requests {report.num_requests} --seed {report.seed}"


def markdown_table(report: SeedTableReport) -> str:
    """The results table: kvsim's figures with the article's beside them (seed setting only)."""
    lines = [
        "| setting | policy | regime | output tok/s | KV waste | future / internal / stale (+ external, free) "
        "| TTFT p95 ms | TPOT p95 ms | mean running | peak KV use | KV-blocked time | preemptions "
        "| article: tok/s, waste, TTFT p95 ms |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in report.rows.to_dict("records"):
        article = ""
        if not pd.isna(r["article_output_tps"]):
            article = (f"{_num(r['article_output_tps'])}, {_pct(r['article_kv_waste'])}, "
                       f"{_num(r['article_ttft_p95_ms'])}")
        split = " / ".join(_pct(r[k]) for k in ("kv_future", "kv_internal", "kv_stale", "kv_external"))
        lines.append(
            f"| {r['setting']} | {r['policy']} | {r['regime']} | {_num(r['output_tps'])} "
            f"| {_pct(r['kv_waste'])} | {split} | {_num(r['ttft_p95_ms'])} | {_num(r['tpot_p95_ms'], ',.1f')} "
            f"| {_num(r['mean_running'], '.1f')} | {_pct(r['peak_kv_use'])} | {_pct(r['kv_blocked_share'])} "
            f"| {r['preemptions']} | {article} |"
        )
    return "\n".join(lines)


def answer(report: SeedTableReport) -> str:
    """One sentence with the result, on the article's own setting (`seed`)."""
    def v(policy: str, col: str) -> float:
        return _cell(report.rows, "seed", policy, col)

    cont = v("continuous", "output_tps")
    return (f"**Answer:** on the article's setting (`seed`: TP 8, 64 clients) continuous batching serves "
            f"{_num(cont)} output tok/s, {cont / v('static', 'output_tps'):.1f}x static batching and "
            f"{cont / v('dynamic', 'output_tps'):.2f}x dynamic batching (article: "
            f"{ARTICLE_FIGURES['continuous'][0] / ARTICLE_FIGURES['static'][0]:.1f}x and "
            f"{ARTICLE_FIGURES['continuous'][0] / ARTICLE_FIGURES['dynamic'][0]:.2f}x), wasting "
            f"{_pct(v('continuous', 'kv_waste'))} of its KV cache against {_pct(v('static', 'kv_waste'))} "
            f"and {_pct(v('dynamic', 'kv_waste'))}.")


def _header(report: SeedTableReport) -> list[str]:
    lines = [
        "# The seed article's benchmark table, rerun with kvsim",
        "",
        f"- Command: `{command_line(report)}`",
        f"- kvsim {report.kvsim_version}, seed {report.seed}, {report.num_requests} requests per run; "
        "every run uses the same seed, so every policy of a setting sees the same requests.",
    ]
    for tp, p in sorted(report.profiles.items()):
        lines.append(f"- Profile TP {tp}: {p['label']}, source `{p['source']}`, sha256 `{p['sha256'][:12]}`")
    if any(p["source"] == "roofline" for p in report.profiles.values()):
        lines.append("- `roofline` profiles are datasheet estimates, not timings measured on an H100: "
                     "absolute throughput and latency are estimates.")
    return lines


def _assumptions(report: SeedTableReport) -> list[str]:
    """Every choice the article leaves open, stated."""
    lines = [
        "", "## Assumptions (the article gives none of these)", "",
        f"- Model `{MODEL}` (bf16), GPU `{GPU}`; \"a single H100 node\" is taken as {NODE_GPUS} GPUs. "
        "Each setting runs one engine replica; its TP is the number of GPUs it uses.",
        f"- Workload `{WORKLOAD}`: closed loop, no think time; prompt and output lengths lognormal with "
        "means 161 and 338 tokens (the vLLM paper's ShareGPT means) and cv 1.0 (our assumption); "
        "outputs run to their drawn length (ignore_eos), truncated at "
        f"max_model_len = {report.max_model_len:,} (the model's context length).",
    ]
    for s in SETTINGS:
        cap = "none" if s.max_tokens is None else f"{s.max_tokens:,}"
        lines.append(f"- Setting `{s.name}`: TP {s.tp}, {s.clients} clients, max_tokens {cap}: {s.why}.")
    lines += [
        "- Policies: `static` = max_batch_size 64, batch timeout 0.1 s, every slot reserves max_model_len "
        "(FasterTransformer); `dynamic` = early TGI (a prefill step of its own, admission while "
        "prompt + max_tokens fits, waiting_served_ratio 1.2, max_waiting_tokens 20); `continuous` = "
        "vLLM, paged KV, block size 16, recompute preemption; its steps are priced as "
        f"`{DEFAULT_ENGINE_VERSION}` (kvsim's default engine version: host cost and scheduler defaults; "
        "the other policies model no vLLM version).",
        "- Engine settings everywhere else: gpu_memory_utilization 0.90, max_num_seqs 256 (at most 64 "
        "clients, so vLLM V1's 1024 on an H100 would bind no more), chunked prefill on with "
        "max_num_batched_tokens 8192, swap_space 4 GiB.",
        "- Throughput is output tokens / makespan (first arrival to last completion), as "
        "`vllm bench serve` reports; KV waste is the time-weighted (allocated - live) / allocated.",
    ]
    return lines


def _regime_note() -> list[str]:
    return [
        "", "## Regime", "",
        f"A row is **memory-bound** when its peak KV use (max kv_allocated / capacity over steps) is at "
        f"least {PEAK_KV_THRESHOLD:.0%}, or requests waited for KV memory for at least "
        f"{BLOCKED_SHARE_THRESHOLD:.0%} of the run (\"KV-blocked time\": steps ending with work queued "
        "and no free extent / no free block able to take it, or with a preemption), or anything was "
        "preempted; otherwise it is **compute-bound (KV not binding)**. For paged KV the blocked time is "
        "a lower bound (the step table records free blocks, not what the queue's head needs). "
        "Exact rule: `reports/regime.py`.",
    ]


def _cell(rows: pd.DataFrame, setting: str, policy: str, col: str) -> float:
    hit = rows[(rows["setting"] == setting) & (rows["policy"] == policy)]
    return float(hit[col].iloc[0])


def _regime(rows: pd.DataFrame, setting: str, policy: str) -> str:
    hit = rows[(rows["setting"] == setting) & (rows["policy"] == policy)]
    return str(hit["regime"].iloc[0])


def disagreement_table(report: SeedTableReport) -> str:
    """Mechanical comparison on the `seed` setting: kvsim / article per metric, and the speedups."""
    rows = report.rows
    lines = ["| policy | metric | article | kvsim | kvsim / article |", "| --- | --- | ---: | ---: | ---: |"]
    for policy, (tps, waste, ttft) in ARTICLE_FIGURES.items():
        for name, ours, theirs, fmt in (
            ("output tok/s", _cell(rows, "seed", policy, "output_tps"), tps, _num),
            ("KV waste", _cell(rows, "seed", policy, "kv_waste"), waste, _pct),
            ("TTFT p95 ms", _cell(rows, "seed", policy, "ttft_p95_ms"), ttft, _num),
        ):
            lines.append(f"| {policy} | {name} | {fmt(theirs)} | {fmt(ours)} | {ours / theirs:.2f}x |")
    cont_a, cont_k = ARTICLE_FIGURES["continuous"][0], _cell(rows, "seed", "continuous", "output_tps")
    for base in ("static", "dynamic"):
        a = cont_a / ARTICLE_FIGURES[base][0]
        k = cont_k / _cell(rows, "seed", base, "output_tps")
        lines.append(f"| continuous / {base} | throughput speedup | {a:.2f}x | {k:.2f}x | {k / a:.2f}x |")
    return "\n".join(lines)


def _why(report: SeedTableReport) -> list[str]:
    """Fixed prose on mechanisms; every number in it is a measured value of this report."""
    r = report.rows

    def v(setting: str, policy: str, col: str) -> float:
        return _cell(r, setting, policy, col)

    mean_len = v("seed", "static", "mean_prompt_tokens") + v("seed", "static", "mean_output_tokens")
    mml = report.max_model_len
    dyn, dyn_cap = v("seed", "dynamic", "kv_waste"), v("seed-cap", "dynamic", "kv_waste")
    inside = "inside" if min(dyn, dyn_cap) <= ARTICLE_FIGURES["dynamic"][1] <= max(dyn, dyn_cap) else "outside"
    memory_bound = r[r["regime"] == MEMORY_BOUND]
    bound = ", ".join(f"{a}/{b}" for a, b in zip(memory_bound["setting"], memory_bound["policy"], strict=True))
    return [
        "",
        "Why, mechanically (the numbers are this run's; the article states no setup, so none of its "
        "figures can be checked one by one):",
        "",
        f"- **Static KV waste** ({_pct(v('seed', 'static', 'kv_waste'))}): each slot reserves max_model_len "
        f"= {mml:,} tokens for a request of {mean_len:,.0f} tokens on average, so most of a slot is never "
        f"written (internal {_pct(v('seed', 'static', 'kv_internal'))}) and finished requests keep theirs "
        f"until the batch's longest ends (stale {_pct(v('seed', 'static', 'kv_stale'))}). The article does "
        "not say how large its slots were; slots sized by a max_tokens would waste less.",
        f"- **Static TTFT p95** ({_num(v('seed', 'static', 'ttft_p95_ms'))} ms): with 64 closed-loop "
        "clients and batches of 64, a new request waits for the whole batch in flight, which lasts as "
        "long as its longest output; a long-tailed output distribution (cv 1.0, our assumption) makes "
        "that wait long. The article's lengths are unknown.",
        f"- **Dynamic KV waste** depends on what clients send: {_pct(dyn)} when the reservation is the "
        f"true output (`seed`) and {_pct(dyn_cap)} with max_tokens=2048 (`seed-cap`); the article's "
        f"52.1% (its max_tokens unknown) lies {inside} that span.",
        f"- **Continuous KV waste** ({_pct(v('seed', 'continuous', 'kv_waste'))}): only the unfilled last "
        f"block of each sequence (block 16, {mean_len:,.0f} tokens on average) is wasted; the article "
        "says < 4% and reports 3.6%.",
        f"- **Throughput** ({_num(v('seed', 'continuous', 'output_tps'))} tok/s for continuous at TP 8): "
        "absolute figures follow from our profile (a roofline estimate) and assumed lengths; the speedup "
        "ratios above are the comparable quantity.",
        f"- **Regimes**: {f'memory-bound rows: {bound}; every other row is compute-bound' if bound else 'no row is memory-bound'}. In a "
        "compute-bound row the gap between policies is scheduling (static batching's wait for the whole "
        "batch, dynamic batching's prefill steps that pause decodes and TGI's admission rule), not "
        "memory; in a memory-bound row it is also how many sequences the KV reservations let run at "
        "once (the mean running column).",
    ]


def render_markdown(report: SeedTableReport) -> str:
    """The whole report: the answer and the results first, then how they were made (provenance,
    assumptions, regime rule), then the disagreements with the article."""
    header = _header(report)
    lines = header[:1] + ["", answer(report), "", "## Results", "", markdown_table(report)]
    tokens = ", ".join(f"TP {s.tp}: {int(_cell(report.rows, s.name, 'continuous', 'kv_tokens')):,}"
                       for s in SETTINGS if s.name != "seed-cap")
    lines += ["", f"KV cache per replica (tokens, block 16): {tokens}. The article's figures are for "
              "its only setting and are shown on the `seed` rows."]
    lines += ["", "## How this was run", ""] + header[2:] + _assumptions(report)
    lines += _regime_note()
    lines += ["", "## Where kvsim disagrees with the article, and why", "", disagreement_table(report)]
    lines += _why(report)
    if report.warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in report.warnings]
    return "\n".join(lines) + "\n"


# -- figure --------------------------------------------------------------------------------
def render_figure(report: SeedTableReport, path: Path) -> None:
    """Throughput, KV waste and TTFT p95 per policy: one bar per setting, the article's beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, policies = report.rows, list(POLICIES)
    panels = (("output tok/s", "output_tps", 0, 1.0), ("KV waste (%)", "kv_waste", 1, 100.0),
              ("TTFT p95 (ms, log)", "ttft_p95_ms", 2, 1.0))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    width = 0.8 / (len(SETTINGS) + 1)
    for ax, (title, col, idx, scale) in zip(axes, panels, strict=True):
        for j, s in enumerate(SETTINGS):
            vals = [scale * _cell(rows, s.name, p, col) for p in policies]
            bars = ax.bar([i + j * width for i in range(len(policies))], vals, width, label=f"kvsim {s.name}")
            for bar, p in zip(bars, policies, strict=True):
                if _regime(rows, s.name, p) == MEMORY_BOUND:
                    bar.set_hatch("//")
        art = [scale * ARTICLE_FIGURES[p][idx] for p in policies]
        ax.bar([i + len(SETTINGS) * width for i in range(len(policies))], art, width, color="black",
               label="article")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(policies))], policies)
        ax.set_title(title)
        ax.set_ylabel(title)
        ax.set_xlabel("batching policy")
        if col == "ttft_p95_ms":
            ax.set_yscale("log")
    axes[0].legend(fontsize=8, title="hatched: memory-bound", title_fontsize=8)
    fig.suptitle(f"Seed table: {MODEL} on {GPU}, kvsim (seed {report.seed}, "
                 f"{report.num_requests} requests) vs the article")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def render_kv_figure(report: SeedTableReport, path: Path) -> None:
    """KV memory over time, stacked by what it holds, one panel per setting (row) and policy (column)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(POLICIES)
    fig, axes = plt.subplots(len(SETTINGS), len(policies), figsize=(14, 2.6 * len(SETTINGS)), squeeze=False,
                             sharey=True)
    colours = ("#2b8a3e", "#74b816", "#f08c00", "#c92a2a", "#868e96")
    for r, setting in enumerate(SETTINGS):
        for c, policy in enumerate(policies):
            ax, data = axes[r][c], report.series.get((setting.name, policy))
            if data is None:
                ax.set_visible(False)
                continue
            ax.stackplot(data["t_s"], *[data[col] for col, _ in KV_PARTS], colors=colours,
                         labels=[label for _, label in KV_PARTS], linewidth=0)
            ax.set_ylim(0, 100)
            ax.set_xlim(float(data["t_s"].min()) if len(data["t_s"]) else 0, None)
            ax.set_title(f"{setting.name} / {policy} ({_regime(report.rows, setting.name, policy)})", fontsize=9)
            if c == 0:
                ax.set_ylabel("% of KV cache")
            if r == len(SETTINGS) - 1:
                ax.set_xlabel("simulated time (s)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(KV_PARTS), fontsize=9, frameon=False)
    fig.suptitle(f"KV cache over time by what it holds (seed {report.seed}, {report.num_requests} requests); "
                 "white: free", fontsize=11)
    fig.tight_layout(rect=(0, 0.035, 1, 0.98))
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def render_ttft_cdf(report: SeedTableReport, path: Path) -> None:
    """TTFT CDF per policy, one panel per setting (log time axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(SETTINGS), figsize=(15, 3.8), sharey=True)
    for ax, setting in zip(axes, SETTINGS, strict=True):
        for policy in POLICIES:
            data = report.series.get((setting.name, policy))
            if data is None or not len(data["ttft_ms"]):
                continue
            ttft = np.maximum(data["ttft_ms"], 1e-3)
            ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (ms, log scale)")
        ax.set_title(f"{setting.name}: TP {setting.tp}, {setting.clients} clients", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("share of requests with TTFT <= x")
    axes[0].legend(title="policy", fontsize=9)
    fig.suptitle(f"TTFT distribution per policy (seed {report.seed}, {report.num_requests} requests per run)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def render_html(report: SeedTableReport, pngs: dict[str, Path]) -> str:
    """The markdown report as one self-contained page, with the three figures and the CSV rows."""
    from kvsim.reports import html

    captions = {
        "seed-table.png": "Output throughput, KV waste and TTFT p95 per policy, one bar per setting and the "
                          "article's figures in black; hatched bars are memory-bound runs.",
        "seed-table-kv.png": "KV cache over simulated time, stacked by what it holds (live tokens, reserved for "
                             "future tokens, over-reservation / internal fragmentation, stale, external "
                             "fragmentation) as % of the cache; one panel per setting and policy.",
        "seed-table-ttft.png": "TTFT cumulative distribution per policy (finished requests), one panel per setting.",
    }
    text = render_markdown(report)
    results, _, rest = text.partition("\n## How this was run")  # the answer and results first, then the rest
    body = [html.markdown(results, key_columns=2), "<h2>Figures</h2>"]
    body += [html.figure(path, captions[name]) for name, path in pngs.items()]
    body.append(html.markdown("## How this was run" + rest))
    meta = {"Versions": ", ".join(f"{k} {v}" for k, v in html.versions().items())}
    rows = csv_frame(report)
    rows = rows.assign(profile_sha256=rows["profile_sha256"].str[:12])  # as the text names it; whole in the CSV
    shares = {c: (lambda x: f"{100 * float(x):.1f}%") for c in rows.columns
              if c in ("kv_waste", "kv_future", "kv_internal", "kv_stale", "kv_external", "peak_kv_use",
                       "kv_blocked_share", "article_kv_waste")}
    body += ["<h2>Every row (click a header to sort; seed-table.csv has them unrounded)</h2>",
             html.table(rows, shares, key=["setting", "policy"], wrap=["regime"]), html.meta_table(meta)]
    return html.page("kvsim: the seed article's benchmark table", body)


def csv_frame(report: SeedTableReport) -> pd.DataFrame:
    """The rows as written to seed-table.csv (with the run's seed and version on each row)."""
    return report.rows.assign(seed=report.seed, num_requests=report.num_requests,
                              kvsim_version=report.kvsim_version)


def write_seed_table(report: SeedTableReport, out_dir: Path) -> list[Path]:
    """seed-table.md/.csv/.html and its three PNGs in `out_dir`, all or none."""
    import tempfile

    from kvsim.reports.files import write_files

    text = render_markdown(report)
    with tempfile.TemporaryDirectory(prefix="kvsim-report-") as tmp:
        pngs = {name: Path(tmp) / name for name in ("seed-table.png", "seed-table-kv.png", "seed-table-ttft.png")}
        render_figure(report, pngs["seed-table.png"])
        render_kv_figure(report, pngs["seed-table-kv.png"])
        render_ttft_cdf(report, pngs["seed-table-ttft.png"])
        page = render_html(report, pngs)
        writers = {name: (lambda dst, src=src: dst.write_bytes(src.read_bytes())) for name, src in pngs.items()}
        writers.update({
            "seed-table.md": lambda p: p.write_text(text),
            "seed-table.csv": lambda p: csv_frame(report).to_csv(p, index=False, float_format="%.6g"),
            "seed-table.html": lambda p: p.write_text(page),
        })
        return write_files(out_dir, writers)
