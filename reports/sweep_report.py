"""`kvsim report sweep TABLE`: pictures of a sweep table, as PNG files and one HTML page.

- Heatmaps of output throughput, TTFT p95, TPOT p95 and KV waste over block size x
  gpu_memory_utilization, one panel per model, policy and GPU that varies; cells that miss the SLO are hatched,
  the SLO boundary is a thick line between passing and failing cells, the best point a star.
- Throughput-latency curves: TTFT and TPOT at the percentiles the SLO names (p95 when it names none;
  other metrics it names get their own panel) against output throughput as the offered load
  (rate, or clients) rises, one line per model, policy and GPU that varies; the SLO limits dashed, the best point starred.

Other swept settings (TP, DP, max_num_seqs, and the load for the heatmaps) are held at the best
point's values; each figure says which. Several seeds: each cell is the mean (curves carry the
95% interval as error bars). The best point is the cheapest that meets the SLO (fewest GPUs, then
highest throughput), or without an SLO the highest throughput.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.reports.sweep import (
    METRIC_SOURCES,
    SWEEPABLE,
    add_slo,
    cheapest_passing,
    cut_ends,
    summarize_points,
)
from kvsim.simcore.errors import ConfigError

HEATMAPS = (  # (file stem, column, title, unit label, higher is better, scale)
    ("throughput", "output_tok_s", "Output throughput", "output tok/s", True, 1.0),
    ("ttft-p95", "ttft_p95_ms", "TTFT p95", "ms", False, 1.0),
    ("tpot-p95", "tpot_p95_ms", "TPOT p95", "ms", False, 1.0),
    ("kv-waste", "kv_waste", "KV cache waste", "% of allocated KV", False, 100.0),
)
FACETS = ("model", "policy", "gpu")
HEAT_AXES = ("block_size", "gpu_mem_util")
FILES = tuple(f"heatmap-{h[0]}.png" for h in HEATMAPS) + ("throughput-latency.png", "sweep-report.html")
LOADS = (("rate", "offered rate (req/s)"), ("concurrency", "clients"))


@dataclass
class SweepReport:
    """A sweep table summarised per grid cell, with what the figures need."""

    table: Path
    cells: pd.DataFrame  # one row per cell: swept values (short names), means, meets_slo
    varying: list[str]  # short names of the settings that take more than one value
    best: int | None  # row of `cells`
    slo: dict[str, float | None]  # ttft_p95_ms, tpot_p95_ms
    context: dict[str, Any]  # model, workload, seeds, versions, profiles
    targets: tuple = ()  # reports.capacity.Target: the SLO's targets beyond the two p95s (--slo)


def load_report(table: Path, slo_ttft_p95_ms: float | None = None, slo_tpot_p95_ms: float | None = None,
                targets: Sequence[Any] = ()) -> SweepReport:
    """Read a sweep table and summarise it; SLOs default to the ones the sweep was run with.
    `targets` (reports.capacity.Target, e.g. from --slo ttft:p99:800) are judged on the rows'
    own percentile columns (`p99_ttft_ms`): every run records p95 and p99; another percentile
    only if the sweep was run with that --slo."""
    from kvsim.reports.capacity import parse_slo_targets
    from kvsim.reports.sweep_table import read_table

    rows = read_table(table)
    if rows.empty:
        raise ConfigError(f"{table}: the sweep table has no rows")
    check_report_columns(table, rows.columns)
    check_one_sweep(table, rows)
    slo = {"ttft_p95_ms": slo_ttft_p95_ms, "tpot_p95_ms": slo_tpot_p95_ms}
    for key in slo:
        if slo[key] is None and f"slo_{key}" in rows.columns and rows[f"slo_{key}"].notna().any():
            slo[key] = float(rows[f"slo_{key}"].dropna().iloc[0])
    if not targets and "slo_percentiles" in rows.columns and rows["slo_percentiles"].notna().any():
        targets = parse_slo_targets(str(rows["slo_percentiles"].dropna().iloc[0]).split())  # the sweep's --slo
    targets = tuple(targets)
    for t in targets:
        if t.key in rows.columns:  # the sweep had that --slo (an empty TPOT / ITL column: nothing to miss)
            if rows[t.key].isna().all() and t.metric not in ("tpot", "itl"):
                raise ConfigError(f"{table}: no point of the sweep has a {t.key} value to judge the SLO {t.spec} on")
        else:
            raise ConfigError(f"{table}: the sweep table has no {t.key} values for the SLO {t.spec}: rerun "
                              f"`kvsim sweep` with --slo {t.spec} (every run records p95 and p99 only)")
    swept = [k for k in SWEEPABLE if k in rows.columns]
    cells = summarize_points(rows, swept, {t.column: t.key for t in targets} or None)
    varying = [SWEEPABLE[k][1] for k in swept if rows[k].nunique(dropna=False) > 1]
    if slo["ttft_p95_ms"] is not None or slo["tpot_p95_ms"] is not None or targets:
        cells = add_slo(cells, slo["ttft_p95_ms"], slo["tpot_p95_ms"], targets)
        best = cheapest_passing(cells, [0 if pd.isna(g) else int(g) for g in cells["gpus"]])
    else:
        ran = cells["output_tok_s"].astype(float)
        best = None if ran.isna().all() else int(ran.idxmax())
    return SweepReport(table, cells, varying, best, slo, _context(rows), targets)


# columns every `kvsim sweep` table has that the page reads (its context line, heatmaps, curves, answer)
REPORT_COLUMNS = ("model", "gpu", "tensor_parallel_size", "block_size", "gpu_memory_utilization", "profile_sha256",
                  "profile_source", *METRIC_SOURCES.values())


def check_report_columns(table: Path, columns: Sequence[str]) -> None:
    """A table cut or edited by hand that lacks a column the page reads, or half of an --error-bars
    band, is refused in one line naming it (it raised AttributeError / KeyError in the figures)."""
    have = set(columns)
    missing = [c for c in REPORT_COLUMNS if c not in have]
    for col in sorted(have):
        for end, other in (("_band_low", "_band_high"), ("_band_high", "_band_low")):
            if col.endswith(end) and col.removesuffix(end) + other not in have:
                missing.append(col.removesuffix(end) + other)
    if missing:
        raise ConfigError(f"{table}: the sweep table has no {missing[0]!r} column (a table cut or edited by hand? "
                          "`kvsim sweep --out` writes it)")


def check_one_sweep(table: Path, rows: pd.DataFrame) -> None:
    """Rows of two sweeps pasted into one table (two sweep_ids) were grouped by their point numbers:
    a rate-3 run became a second seed of the rate-1 point, and the page showed their mean and
    interval. A table holds one sweep (`--resume` refuses another's rows), each point and seed once."""
    if "sweep_id" in rows.columns:
        ids = pd.unique(rows["sweep_id"].dropna().astype(str))
        if len(ids) > 1:
            raise ConfigError(f"{table}: rows of {len(ids)} sweeps (sweep_id {ids[0]}, {ids[1]}, ...); a table holds "
                              "one sweep: report each table on its own")
    repeated = rows.duplicated(["point", "seed"])
    if repeated.any():
        first = rows[repeated].iloc[0]
        raise ConfigError(f"{table}: point {int(first['point'])} seed {int(first['seed'])} is in the table twice "
                          "(tables pasted together or edited?)")


def _context(rows: pd.DataFrame) -> dict[str, Any]:
    def values(col: str) -> str:
        if col not in rows.columns:
            return ""
        return ", ".join(str(v) for v in pd.unique(rows[col].dropna()))

    profiles = rows.dropna(subset=["profile_sha256"]) if "profile_sha256" in rows.columns else rows.iloc[:0]
    return {
        "model": values("model"), "workload": values("workload"), "num_requests": values("num_requests"),
        "seeds": sorted(int(s) for s in pd.unique(rows["seed"])), "kvsim_versions": values("kvsim_version"),
        "engine_versions": values("engine_version"), "usage_contexts": values("usage_context"),
        "profiles": sorted({f"{r.gpu} TP {r.tensor_parallel_size}: {r.profile_source} sha256 {str(r.profile_sha256)[:12]}"
                            for r in profiles.itertuples()}),
        "rate_unit": values("rate_unit") or "req/s",
        "num_points": len(rows), "wall_s": float(rows["wall_s"].sum()) if "wall_s" in rows.columns else None,
    }


# -- slicing --------------------------------------------------------------------------------
def _facets(report: SweepReport) -> list[tuple[str, pd.DataFrame]]:
    """(title, cells) per panel: one per model / policy / GPU combination that varies (the title
    also names what a panel fixes with them, e.g. the TP of `--zip model,tp`)."""
    keys = [k for k in FACETS if k in report.varying]
    if not keys:
        return [("", report.cells)]
    shown = keys + _paired(report)
    return [(", ".join(f"{k}={g[k].iloc[0]}" for k in shown), g)
            for _, g in report.cells.groupby(keys if len(keys) > 1 else keys[0], sort=False)]


def _paired(report: SweepReport) -> list[str]:
    """Varying settings that take one value per panel (swept with `--zip` alongside a facet)."""
    keys = [k for k in FACETS if k in report.varying]
    if not keys:
        return []
    groups = report.cells.groupby(keys, sort=False)
    return [k for k in report.varying if k not in FACETS and groups[k].nunique(dropna=False).max() <= 1]


def _anchor(report: SweepReport) -> pd.Series:
    return report.cells.iloc[report.best if report.best is not None else 0]


def _held(report: SweepReport, free: tuple[str, ...]) -> dict[str, Any]:
    """The settings a figure holds fixed (at the best point's values): every varying one not free,
    except those a panel fixes already (`_paired`: holding them would empty the other panels)."""
    anchor = _anchor(report)
    paired = _paired(report)
    return {k: anchor[k] for k in report.varying if k not in free and k not in FACETS and k not in paired}


def _slice(cells: pd.DataFrame, held: dict[str, Any]) -> pd.DataFrame:
    mask = np.ones(len(cells), dtype=bool)
    for k, v in held.items():
        mask &= (cells[k] == v).to_numpy() if not pd.isna(v) else cells[k].isna().to_numpy()
    return cells[mask]


def _held_text(held: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in held.items()) or "nothing else varies"


# -- heatmaps -------------------------------------------------------------------------------
OVERLOADED = "overloaded"  # the `load` column's value for a run whose queue grew (simcore.metrics.saturation)
SMALL_SPREAD = 0.05  # cells within 5% of each other: said in the caption, since colours barely differ


def _overloaded(cells: pd.DataFrame, xs: list, ys: list) -> np.ndarray:
    """Cells whose run was overloaded (arrivals outpaced the engine, the queue grew): their
    numbers depend on how long the run lasted, so they are marked, not coloured."""
    mask = np.full((len(ys), len(xs)), False)
    if "load" not in cells.columns:
        return mask
    for _, row in cells.iterrows():
        if row["block_size"] in xs and row["gpu_mem_util"] in ys and row["load"] == OVERLOADED:
            mask[ys.index(row["gpu_mem_util"]), xs.index(row["block_size"])] = True
    return mask


def colour_scale(spec: tuple, values: np.ndarray):
    """(norm, text) for a heatmap's colours from the values it colours (overloaded cells left
    out): KV waste on its whole 0-100% range; a latency spanning more than 20x on a log scale
    between its extremes (a slow policy would otherwise flatten every other cell into one colour);
    anything else linear from 0, so a 1% difference stays a 1% difference in colour. The text
    states the scale, the cells' range and, when they lie within SMALL_SPREAD, that."""
    from matplotlib.colors import LogNorm, Normalize

    _, _, _, unit, _, scale = spec
    finite = values[np.isfinite(values)]
    if not finite.size:
        return Normalize(0.0, 1.0), "no cell ran"
    lo, hi = float(finite.min()), float(finite.max())
    shown = f"cells span {_short(lo)} to {_short(hi)} {unit}"
    if scale == 100.0:
        norm, text = Normalize(0.0, 100.0), "colour: linear, 0 to 100%"
    elif unit == "ms" and lo > 0 and hi / lo > 20:
        norm, text = LogNorm(lo, hi), f"colour: log scale, {_short(lo)} to {_short(hi)} {unit}"
    else:
        norm, text = Normalize(0.0, hi if hi > 0 else 1.0), f"colour: linear, 0 to {_short(hi)} {unit}"
    spread = (hi - lo) / hi if hi > 0 else 0.0
    text += f"; {shown}"
    if finite.size > 1 and spread < SMALL_SPREAD:
        text += f" (all within {100 * spread:.1f}% of the largest: colours differ little by design)"
    return norm, text


def _short(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 1 else f"{v:.3g}"


def render_heatmap(report: SweepReport, spec: tuple, path: Path) -> str:
    """One metric over block size x utilisation, a panel per facet; returns the caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem, col, title, unit, higher_better, scale = spec
    held = _held(report, HEAT_AXES)
    facets = [(name, _slice(cells, held)) for name, cells in _facets(report)]
    xs = sorted(report.cells["block_size"].dropna().unique())
    ys = sorted(report.cells["gpu_mem_util"].dropna().unique())
    values = [_grid(cells, xs, ys, col, scale) for _, cells in facets]
    over = [_overloaded(cells, xs, ys) for _, cells in facets]
    coloured = [np.where(o, np.nan, v) for v, o in zip(values, over, strict=True)]
    norm, scale_text = colour_scale(spec, np.concatenate([c.ravel() for c in coloured] + [np.zeros(0)]))
    ncols = min(len(facets), 3)
    nrows = -(-len(facets) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(1.2 + 4.3 * ncols, 0.9 + 3.6 * nrows), squeeze=False)
    cmap = plt.get_cmap("viridis" if higher_better else "viridis_r").copy()
    cmap = cmap.with_extremes(bad="#d9d9d9")
    image = None
    for k, (ax, (name, cells), grid, shown, mask) in enumerate(
            zip(axes.flat, facets, values, coloured, over, strict=False)):
        image = ax.imshow(shown, origin="lower", cmap=cmap, norm=norm, aspect="auto")
        _annotate(ax, grid, cells, xs, ys, report, lambda v: cmap(norm(v)), mask)
        ax.set_xticks(range(len(xs)), [str(int(x)) for x in xs])
        ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
        ax.set_xlabel("block size (tokens per KV block)")
        if k % ncols == 0:
            ax.set_ylabel("gpu_memory_utilization\n(share of GPU memory)")
        ax.set_title(name or title)
    for ax in list(axes.flat)[len(facets):]:
        ax.set_visible(False)
    if image is not None:
        bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9)
        bar.set_label(f"{title} ({unit})\n{scale_text.split(';')[0]}", fontsize=9)
    _heat_legend(fig, report, any(o.any() for o in over))
    fig.suptitle(f"{title} ({unit}) over block size x gpu_memory_utilization; held: {_held_text(held)}",
                 fontsize=11)
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    lower = "higher is better" if higher_better else "lower is better"
    n_over = int(sum(o.sum() for o in over))
    marked = (f" Grey cross-hatched, value in brackets: overloaded ({n_over} cell{'s' if n_over != 1 else ''}: "
              "arrivals outpaced the engine and the queue grew, so the value depends on the run's length; "
              "not coloured and left out of the colour range)." if n_over else "")
    return (f"{title} ({unit}, {lower}) per block size and gpu_memory_utilization, one panel per "
            f"{' and '.join(k for k in FACETS if k in report.varying) or 'sweep'}; other settings held at "
            f"{_held_text(held)}. {scale_text[0].upper()}{scale_text[1:]}. Grey: the model does not fit."
            f"{marked} Hatched red: misses the SLO; thick line: SLO boundary; star: best point.")


def _grid(cells: pd.DataFrame, xs: list, ys: list, col: str, scale: float) -> np.ndarray:
    grid = np.full((len(ys), len(xs)), np.nan)
    for _, row in cells.iterrows():
        if row["block_size"] in xs and row["gpu_mem_util"] in ys and not pd.isna(row[col]):
            grid[ys.index(row["gpu_mem_util"]), xs.index(row["block_size"])] = float(row[col]) * scale
    return grid


def _annotate(ax, grid: np.ndarray, cells: pd.DataFrame, xs: list, ys: list, report: SweepReport, colour_of,
              over: np.ndarray) -> None:
    """Values in the cells, overloaded cells marked, hatching for SLO misses, the SLO boundary,
    the best point's star."""
    from matplotlib.patches import Rectangle

    passing = np.full(grid.shape, False)
    has_slo = "meets_slo" in cells.columns
    best_label = report.cells.index[report.best] if report.best is not None else None
    for idx, row in cells.iterrows():
        if row["block_size"] not in xs or row["gpu_mem_util"] not in ys:
            continue
        i, j = ys.index(row["gpu_mem_util"]), xs.index(row["block_size"])
        v = grid[i, j]
        number = "" if np.isnan(v) else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}")
        if over[i, j]:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#eeeeee", hatch="xx", edgecolor="#9a9a9a",
                                   linewidth=0))
            ax.text(j, i, f"overloaded\n({number})", ha="center", va="center", fontsize=9, color="#333",
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5))
        else:
            text = "does not\nfit" if np.isnan(v) else number
            ax.text(j, i, text, ha="center", va="center", fontsize=9,
                    color=_ink(colour_of(v)) if not np.isnan(v) else "#444")
        if has_slo:
            passing[i, j] = bool(row["meets_slo"])
            if not passing[i, j] and not over[i, j]:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#b22222",
                                       linewidth=0))
        if idx == best_label:
            ax.plot(j, i + 0.3, marker="*", markersize=18, color="#e6007e", markeredgecolor="white")
    if has_slo:
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if j + 1 < grid.shape[1] and passing[i, j] != passing[i, j + 1]:
                    ax.plot([j + 0.5, j + 0.5], [i - 0.5, i + 0.5], color="black", linewidth=3)
                if i + 1 < grid.shape[0] and passing[i, j] != passing[i + 1, j]:
                    ax.plot([j - 0.5, j + 0.5], [i + 0.5, i + 0.5], color="black", linewidth=3)


def _ink(rgba) -> str:
    """Black text on light cells, white on dark ones (relative luminance, ITU-R BT.709 weights)."""
    r, g, b = rgba[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def _heat_legend(fig, report: SweepReport, overloaded: bool = False) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Line2D([], [], marker="*", linestyle="", markersize=14, color="#e6007e", markeredgecolor="white",
                      label=_best_label(report)),
               Patch(facecolor="#d9d9d9", label="model does not fit")]
    if overloaded:
        handles.append(Patch(facecolor="#eeeeee", edgecolor="#9a9a9a", hatch="xx", label="overloaded (queue grows)"))
    if "meets_slo" in report.cells.columns:
        handles += [Patch(facecolor="white", edgecolor="#b22222", hatch="///", label=f"misses SLO ({_slo_text(report)})"),
                    Line2D([], [], color="black", linewidth=3, label="SLO boundary")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, -0.06))


def _slo_text(report: SweepReport) -> str:
    parts = []
    if report.slo["ttft_p95_ms"] is not None:
        parts.append(f"TTFT p95 <= {report.slo['ttft_p95_ms']:g} ms")
    if report.slo["tpot_p95_ms"] is not None:
        parts.append(f"TPOT p95 <= {report.slo['tpot_p95_ms']:g} ms")
    parts += [f"{t.name} <= {t.limit_ms:g} ms" for t in report.targets]
    return ", ".join(parts) or "no SLO"


def _best_label(report: SweepReport) -> str:
    if "meets_slo" in report.cells.columns:
        return "best: cheapest point meeting the SLO" if report.best is not None else "no point meets the SLO"
    return "best: highest throughput"


# -- throughput-latency curves ----------------------------------------------------------------
def _load_axis(report: SweepReport) -> tuple[str, str] | None:
    for col, label in LOADS:
        if col in report.varying:
            if col == "rate" and report.context.get("rate_unit") == "sessions/s":  # a session workload
                label = "offered rate (sessions/s)"
            return col, label
    return None


def clip_interval(low: np.ndarray, high: np.ndarray, bottom: float, top: float):
    """(low, high, clipped_low, clipped_high): an interval cut at the axis' limits, with which ends
    were cut (a Student-t interval over few seeds can reach below zero, which a log axis cannot
    draw: matplotlib would run the bar off the axis)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    cut_low, cut_high = ~(low >= bottom), ~(high <= top)  # NaN-safe: a missing bound is not cut
    cut_low &= ~np.isnan(low)
    cut_high &= ~np.isnan(high)
    return np.where(cut_low, bottom, low), np.where(cut_high, top, high), cut_low, cut_high


def curve_panels(report: SweepReport) -> list[tuple[str, str, float | None]]:
    """(column, title, SLO limit or None) per throughput-latency panel: TTFT and TPOT at each
    percentile the SLO names for them (p95 when it names none), then any other metric the SLO
    names (--slo e2el:p90:...), so the figure shows the percentile the answer was judged on."""
    from kvsim.reports.capacity import Target

    named = [Target(m, 95.0, v) for m, v in (("ttft", report.slo["ttft_p95_ms"]), ("tpot", report.slo["tpot_p95_ms"]))
             if v is not None] + list(report.targets)
    panels: list[tuple[str, str, float | None]] = []
    for metric in ("ttft", "tpot", "itl", "e2el"):
        mine = [t for t in named if t.metric == metric]
        if not mine and metric in ("ttft", "tpot"):
            mine = [Target(metric, 95.0, float("nan"))]
        for t in mine:
            if t.column in report.cells.columns and (t.column, t.name, None) not in panels:
                panels.append((t.column, t.name, None if math.isnan(t.limit_ms) else t.limit_ms))
    return panels


def render_curves(report: SweepReport, path: Path) -> str | None:
    """Latency (the percentiles `curve_panels` names) vs output throughput over the load, a line
    per facet; None if the load was not swept. The axes fit the points (and the SLO); error bars
    are cut at the axes and a cut end carries a triangle; overloaded points are drawn hollow."""
    load = _load_axis(report)
    if load is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load_col, load_label = load
    held = _held(report, (load_col,))
    panels = curve_panels(report)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    axes = axes[0]
    best = _anchor(report) if report.best is not None else None
    cols = tuple(col for col, _, _ in panels)
    bars: dict[str, list] = {c: [] for c in cols}
    n_over = 0
    for name, cells in _facets(report):
        cells = _slice(cells, held).sort_values(load_col)
        cells = cells[cells["output_tok_s"].notna()]
        if cells.empty:
            continue
        over = (cells["load"] == OVERLOADED).to_numpy() if "load" in cells.columns else np.zeros(len(cells), bool)
        n_over += int(over.sum())
        for ax, col in zip(axes, cols, strict=True):
            x, y = cells["output_tok_s"].astype(float).to_numpy(), cells[col].astype(float).to_numpy()
            line, = ax.plot(x, y, marker="o", label=name or "sweep")
            if over.any():
                ax.plot(x[over], y[over], marker="o", linestyle="", markersize=11, markerfacecolor="white",
                        markeredgecolor=line.get_color(), markeredgewidth=2, zorder=4)
            if f"{col}_ci95_low" in cells.columns:
                bars[col].append((x, y, cells[f"{col}_ci95_low"].astype(float).to_numpy(),
                                  cells[f"{col}_ci95_high"].astype(float).to_numpy(), line.get_color()))
            for _, row in cells.iterrows():
                if row[col] is None or pd.isna(row[col]):  # no value (a TPOT of one-token outputs): no label
                    continue
                ax.annotate(f"{row[load_col]:g}", (row["output_tok_s"], row[col]), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color="#555")
    n_cut = 0
    for ax, (col, title, limit) in zip(axes, panels, strict=True):
        if limit is not None:
            ax.axhline(limit, color="#b22222", linestyle="--", label=f"SLO {title} <= {limit:g} ms")
        if (best is not None and best[load_col] in set(_slice(report.cells, held)[load_col])
                and not (best[col] is None or pd.isna(best[col]))):
            ax.plot(best["output_tok_s"], best[col], marker="*", markersize=18, color="#e6007e",
                    markeredgecolor="white", linestyle="", label=_best_label(report), zorder=5)
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(f"{title} (ms)")
        shown = report.cells[col].dropna().astype(float)
        points = [v for v in shown] + ([limit] if limit is not None else [])
        if len(shown) and shown.min() > 0 and shown.max() / shown.min() > 10:
            ax.set_yscale("log")  # the axis fits the points; an interval past it is cut below
            ax.set_ylim(min(points) / 2, max(points) * 2)
        elif points:  # linear: the axis holds the intervals too, down to 0 (a latency is never below)
            ends = [v for _, _, low, high, _ in bars[col] for v in (*low, *high) if np.isfinite(v)]
            lo, hi = max(0.0, min(points + ends)), max(points + ends)
            pad = 0.05 * (hi - lo) if hi > lo else 0.05 * max(hi, 1.0)
            ax.set_ylim(max(0.0, lo - pad), hi + pad)
        bottom, top = ax.get_ylim()
        for x, y, low, high, colour in bars[col]:
            low, high, cut_low, cut_high = clip_interval(low, high, bottom, top)
            ok = ~np.isnan(low) & ~np.isnan(high)
            ax.errorbar(x[ok], y[ok], yerr=np.vstack([y[ok] - low[ok], high[ok] - y[ok]]), fmt="none",
                        ecolor=colour, capsize=3)
            for cut, edge, marker in ((cut_low, bottom, "v"), (cut_high, top, "^")):
                if cut.any():
                    n_cut += int(cut.sum())
                    ax.plot(x[cut], np.full(int(cut.sum()), edge), marker=marker, linestyle="", color=colour,
                            markersize=9, clip_on=False, zorder=6)
        ax.set_ylim(bottom, top)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{title} vs throughput (point labels: {load_label})")
        handles, labels = ax.get_legend_handles_labels()
        from matplotlib.lines import Line2D

        if n_over:
            handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="white", markeredgecolor="#555",
                                  markersize=9, markeredgewidth=2))
            labels.append("overloaded (queue grows)")
        if n_cut:
            handles.append(Line2D([], [], marker="v", linestyle="", color="#555", markersize=8))
            labels.append("interval runs past the axis (cut)")
        ax.legend(handles, labels, fontsize=8)
    fig.suptitle(f"Throughput-latency as the {load_label} rises; held: {_held_text(held)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    notes = ""
    if n_over:
        notes += (f" Hollow: overloaded ({n_over} point{'s' if n_over != 1 else ''}: arrivals outpaced the engine, "
                  "its latencies grow with the run's length).")
    if n_cut:
        notes += (f" {n_cut} interval end{'s' if n_cut != 1 else ''} ran past the axis (a 95% interval over few seeds "
                  "is wide): cut at the axis and marked with a triangle.")
    names = [title for _, title, _ in panels]
    return (f"{', '.join(names[:-1])} and {names[-1]} (ms) against output throughput (tok/s) as the {load_label} "
            f"rises (each point labelled with it), one line per "
            f"{' and '.join(k for k in FACETS if k in report.varying) or 'sweep'}; held: {_held_text(held)}. "
            f"Dashed: SLO limit; star: best point; error bars: 95% interval over seeds (if several).{notes}")


# -- page -----------------------------------------------------------------------------------
def _formats() -> dict[str, Any]:
    def num(fmt: str):
        return lambda v: format(float(v), fmt)

    out: dict[str, Any] = {c: num(",.1f") for c in ("output_tok_s", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms",
                                                    "tpot_p95_ms")}
    out["gpu_mem_util"] = lambda v: f"{float(v):g}"
    out.update({"kv_waste": lambda v: f"{100 * float(v):.1f}%", "kv_cache_tokens": num(",.0f"),
                "meets_slo": lambda v: "yes" if v else "no", "gpus": num(".0f")})
    return out


CUT = "\u2020"  # marks an interval end cut at what the metric can take


def intervals(cells: pd.DataFrame, formats: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """(the cells without their `_ci95_low/high` and `_band_low/high` columns, column -> the text under
    each row's value): a mean's 95% interval over seeds, "(low-high)", and the model-error band of
    --error-bars, "model low..high", go under it in the same cell, so neither triples the table's
    width; an interval end cut at the metric's bound (a latency's 0) carries CUT."""
    from kvsim.reports import html

    def given(*values: Any) -> bool:
        return not any(v is None or pd.isna(v) for v in values)

    below: dict[str, list[str]] = {}
    for col in cells.columns:
        has_ci, has_band = f"{col}_ci95_low" in cells.columns, f"{col}_band_low" in cells.columns
        if not (has_ci or has_band):
            continue
        fmt = formats.get(col, html.number)
        texts = []
        for i in range(len(cells)):
            mean, parts = cells[col].iloc[i], []
            if has_ci:
                low, high = cells[f"{col}_ci95_low"].iloc[i], cells[f"{col}_ci95_high"].iloc[i]
                if given(mean, low, high) and float(low) != float(high):  # equal: every seed gave this value
                    cut_low, cut_high = cut_ends(col, mean, low, high)
                    parts.append(f"({fmt(low)}{CUT if cut_low else ''}\u2013{fmt(high)}{CUT if cut_high else ''})")
            if has_band:
                low, high = cells[f"{col}_band_low"].iloc[i], cells[f"{col}_band_high"].iloc[i]
                if given(mean, low, high):
                    parts.append(f"model {fmt(low)}..{fmt(high)}")
            texts.append(" ".join(parts))
        below[col] = texts
    return cells[[c for c in cells.columns
                  if not c.endswith(("_ci95_low", "_ci95_high", "_band_low", "_band_high"))]], below


def _interval_note(report: SweepReport, below: dict[str, list[str]]) -> str:
    """The note under a table with intervals: what they are, how wide few seeds make them, the cuts."""
    from kvsim.reports.sweep_runner import t975

    n = len(report.context["seeds"])
    band = any("model " in t for texts in below.values() for t in texts)
    band_text = (" Under a value, \"model low..high\": its 90% band under the profile's stated error "
                 "(--error-bars).") if band else ""
    if n < 2:
        return f'<p class="note">{band_text.strip()}</p>'
    text = (f"Each cell: the mean over {n} seeds, its 95% Student-t interval under it (t = {t975(n):.2f} for "
            f"{n} seeds")
    if n == 2:
        text += ": the interval spans the mean \u00b1 6.35 x the gap between the two seeds' values, so it is wide; "
        text += "more seeds narrow it (t = 2.78 for 5)"
    elif n < 5:
        text += ", wide with so few seeds"
    text += "); no interval: every seed gave the same value."
    cut = sum(t.count(CUT) for texts in below.values() for t in texts)
    if cut:
        text += (f" {CUT} ({cut} end{'s' if cut != 1 else ''}): the t interval ran past what the quantity can take "
                 "(below 0, or a share above 100%) and is cut there; the true mean lies in that range, so the "
                 "cut interval covers it as often.")
    return f'<p class="note">{text}{band_text}</p>'


def render_html(report: SweepReport, figures: list[tuple[Path, str]], command: str) -> str:
    """Results first: the answer (best point), every cell (what varies as key columns, what does
    not in a line above), the figures; then how the table was made."""
    from kvsim.reports import html

    ctx = report.context
    meta = {
        "Command": html.code(command),
        "Table": html.code(str(report.table)) + f" ({ctx['num_points']} rows, made by kvsim {ctx['kvsim_versions']})",
        "Model / workload": f"{ctx['model']}; workload {ctx['workload']}, {ctx['num_requests']} requests per point",
        "Seeds": ", ".join(map(str, ctx["seeds"])) + (" (cells show the mean, its 95% interval under it)"
                                                       if len(ctx["seeds"]) > 1 else ""),
        "Swept": ", ".join(f"{k} ({report.cells[k].nunique()} values)" for k in report.varying) or "nothing",
        "SLO": html.escape_text(_slo_text(report)),
        # issue 27: which vLLM version the steps are priced as (and whose per-GPU defaults filled the limits)
        "Engine": html.escape_text((ctx.get("engine_versions") or "not recorded (a table from before engine versions)")
                                   + (f"; vLLM's {ctx['usage_contexts']} step-limit defaults per GPU"
                                      if ctx.get("usage_contexts") else "")),
        "Profiles": "<br>".join(ctx["profiles"]) or "none ran",
        "Versions": ", ".join(f"{k} {v}" for k, v in html.versions().items()),
    }
    if report.best is not None:
        best = _best_sentence(report)
    elif "meets_slo" in report.cells.columns and report.cells["output_tok_s"].notna().any():
        best = f"No point meets the SLO ({_slo_text(report)})."
    else:
        best = "No point ran."
    over = int((report.cells["load"] == OVERLOADED).sum()) if "load" in report.cells.columns else 0
    warn = (f' <span class="mark">{over} of {len(report.cells)} points ran overloaded</span> (arrivals outpaced '
            "the engine, the queue grew): they never meet an SLO, and their latencies grow with the run's "
            "length; marked grey in the table and figures." if over else "")
    body = [f"<h1>kvsim sweep report: {html.code(report.table.name)}</h1>",
            f'<p class="answer"><b>Answer.</b> {html.escape_text(best)}{warn}</p>',
            f'<p class="note">{html.escape_text(ctx["model"])}, workload {html.escape_text(ctx["workload"])}, '
            f"{html.escape_text(_slo_text(report))}; how it was made: <a href=\"#made\">below</a>.</p>"]
    classes = [" ".join(c for c in ("best" if i == report.best else "",
                                    OVERLOADED if over and report.cells["load"].iloc[i] == OVERLOADED else "") if c)
               for i in range(len(report.cells))]
    formats = _formats()
    if over:
        formats["load"] = lambda v: f"\u26a0 {v}" if v == OVERLOADED else str(v)
    shown, below = intervals(report.cells, formats)
    body += ["<h2>Every cell (click a header to sort)</h2>",
             html.table(shown, formats, classes, key=report.varying, below=below,
                        wrap=[c for c in ("load", "regime") if c in shown.columns]),
             _interval_note(report, below) if below else "",
             "<h2>Figures</h2>"]
    body += [html.figure(png, caption) for png, caption in figures]
    if not figures:
        body.append("<p>No figure: neither block size x utilisation nor the load was swept.</p>")
    body += ['<h2 id="made">How this was made</h2>', html.meta_table(meta)]
    return html.page(f"kvsim sweep report: {report.table.name}", body)


def _best_sentence(report: SweepReport) -> str:
    """The answer: the best point's settings and figures, each with what the table puts under it
    (its 95% interval over seeds, the model-error band of --error-bars), so the answer is as sure
    as the table and no surer."""
    row = report.cells.iloc[report.best]
    settings = ", ".join(f"{k}={row[k]}" for k in report.varying)
    what = _best_label(report).removeprefix("best: ")
    seeds = len(report.context["seeds"])

    def figure(col: str, unit: str, scale: float = 1.0, fmt: str = ",.1f") -> str:
        def num(v: Any) -> str:
            return f"{scale * float(v):{fmt}}"

        if row[col] is None or pd.isna(row[col]):  # e.g. TPOT where every request gave one token
            return "n/a"
        text = f"{num(row[col])}{unit}"
        extra = []
        low, high = row.get(f"{col}_ci95_low"), row.get(f"{col}_ci95_high")
        if not any(v is None or pd.isna(v) for v in (low, high)) and float(low) != float(high):
            cut_low, cut_high = cut_ends(col, row[col], low, high)
            extra.append(f"{num(low)}{CUT if cut_low else ''}\u2013{num(high)}{CUT if cut_high else ''}")
            kinds.add(f"95% interval over {seeds} seeds")
            if cut_low or cut_high:
                kinds.add(f"{CUT} cut at what the quantity can take")
        low, high = row.get(f"{col}_band_low"), row.get(f"{col}_band_high")
        if not any(v is None or pd.isna(v) for v in (low, high)):
            extra.append(f"model {num(low)}..{num(high)}")
            kinds.add("model low..high: the 90% band under the profile's stated error")
        return text + (f" [{'; '.join(extra)}]" if extra else "")

    kinds: set[str] = set()
    text = (f"{what[0].upper()}{what[1:]}: {settings or 'the only point'}: {figure('output_tok_s', ' output tok/s')}, "
            f"TTFT p95 {figure('ttft_p95_ms', ' ms')}, TPOT p95 {figure('tpot_p95_ms', ' ms')}, "
            + "".join(f"{t.name} {figure(t.column, ' ms')}, " for t in report.targets
                      if t.percentile != 95 or t.metric not in ("ttft", "tpot")
                      if row.get(t.column) is not None and not pd.isna(row.get(t.column)))
            + f"KV waste {figure('kv_waste', '%', 100.0)}, {row['gpus']} GPU(s).")
    return text + (f" In brackets: {'; '.join(sorted(kinds))}." if kinds else "")


def write_sweep_report(report: SweepReport, out_dir: Path, command: str) -> list[Path]:
    """PNG per figure and sweep-report.html (figures embedded) in `out_dir`, all or none."""
    import tempfile

    from kvsim.reports.files import write_files

    with tempfile.TemporaryDirectory(prefix="kvsim-report-") as tmp:
        pngs: dict[str, tuple[Path, str]] = {}
        if {"block_size", "gpu_mem_util"} & set(report.varying):
            for spec in HEATMAPS:
                path = Path(tmp) / f"heatmap-{spec[0]}.png"
                pngs[path.name] = (path, render_heatmap(report, spec, path))
        curves = Path(tmp) / "throughput-latency.png"
        caption = render_curves(report, curves)
        if caption is not None:
            pngs[curves.name] = (curves, caption)
        page = render_html(report, list(pngs.values()), command)
        writers = {name: (lambda dst, src=src: dst.write_bytes(src.read_bytes())) for name, (src, _) in pngs.items()}
        writers["sweep-report.html"] = lambda dst: dst.write_text(page)
        return write_files(out_dir, writers, FILES)  # an earlier report's heatmaps go with its page
