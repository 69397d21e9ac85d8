"""A grid of engine configurations (x seeds): planning the points, and summarising their rows.

Every cell of the grid runs with the same seeds, so every cell sees identical traffic (the same
arrival times and lengths): differences between cells are the configuration's, not the draw's;
several seeds give each metric a mean and a 95% interval. A cell whose model does not fit
(DoesNotFitError) becomes a row saying so; any other bad value is a ConfigError raised before
anything runs. Running the points is `reports.sweep_runner`; the table they fill, `sweep_table`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvsim.reports.sweep_runner import Point, mean_ci95
from kvsim.simcore.errors import ConfigError, DoesNotFitError
from kvsim.simcore.specs import EngineConfig, GPUSpec, ModelSpec

if TYPE_CHECKING:  # pandas is imported where a table is made: `kvsim plan` and `run` use parse_list only
    import pandas as pd

# Swept dimension -> (flag, column name in the printed table); grid order is this order, the first
# varying slowest. The model, engine fields, the GPU, then the workload's load (rate or clients).
SWEEPABLE = {
    "model": ("--model", "model"),
    "policy": ("--policy", "policy"),
    "gpu": ("--gpu", "gpu"),
    "tensor_parallel_size": ("--tp", "tp"),
    "data_parallel_size": ("--dp", "dp"),
    "pipeline_parallel_size": ("--pp", "pp"),
    "kv_cache_dtype": ("--kv-cache-dtype", "kv_dtype"),
    "quantization": ("--quantization", "quant"),
    "block_size": ("--block-size", "block_size"),
    "gpu_memory_utilization": ("--gpu-memory-utilization", "gpu_mem_util"),
    "max_num_seqs": ("--max-num-seqs", "max_num_seqs"),
    "speculative_config": ("--speculative-config", "spec"),
    "router": ("--router", "router"),
    "kv_offloading_size": ("--kv-offloading-size", "cpu_kv_gib"),
    "rate": ("--rate", "rate"),
    "concurrency": ("--concurrency", "concurrency"),
}
WORKLOAD_DIMS = ("rate", "concurrency")
MAX_GRID_POINTS = 10_000  # points of one sweep: each is a simulation, and each is checked up front
# printed column -> column of the tidy row (the sweep table) it shows
METRIC_SOURCES = {
    "gpus": "gpus", "kv_cache_tokens": "kv_cache_tokens", "output_tok_s": "output_throughput",
    "ttft_p50_ms": "median_ttft_ms", "ttft_p95_ms": "p95_ttft_ms", "tpot_p50_ms": "median_tpot_ms",
    "tpot_p95_ms": "p95_tpot_ms", "kv_waste": "kv_waste_rate", "preemptions": "num_preemptions",
    "load": "saturation",  # sustained | overloaded | n/a (simcore.metrics.saturation)
    "regime": "regime",
}
METRIC_COLUMNS = tuple(METRIC_SOURCES)
INT_COLUMNS = ("gpus", "kv_cache_tokens", "preemptions")
CONFIG_METRICS = ("gpus", "kv_cache_tokens")
LABEL_METRICS = ("load", "regime")  # text; with several seeds, "mixed: ..." when they disagree
# the range every numeric metric lives in (a rate, a latency, a count: >= 0; a share: <= 1 too), where
# a 95% interval over few seeds is cut (reports.sweep_runner.mean_ci95)
METRIC_BOUNDS: dict[str, tuple[float | None, float | None]] = {"kv_waste": (0.0, 1.0)}
DEFAULT_BOUNDS = (0.0, None)


def _shown(text: str) -> str:
    """A list quoted in an error, cut to a readable length."""
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")


def parse_list(flag: str, text: str, kind: type) -> list:
    """'8,16,32' -> [8, 16, 32]; a malformed or repeated value is a ConfigError naming the flag."""
    values: list = []
    seen: set = set()  # a set, so that a long list is not quadratic to check
    for item in text.split(","):
        item = item.strip()
        try:
            value = kind(item)
        except ValueError:
            what = {int: "an integer", float: "a number", str: "a value"}[kind]
            raise ConfigError(f"{flag}: {item!r} is not {what} (in {_shown(text)})") from None
        if kind is str and not value:
            raise ConfigError(f"{flag}: empty value in {_shown(text)}")
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{flag}: {item!r} is not a finite number")
        if value in seen:
            raise ConfigError(f"{flag}: {item!r} is listed twice (in {_shown(text)})")
        seen.add(value)
        values.append(value)
    return values


def check_distinct(flag: str, values: Sequence[Any], text: str, note: str = "") -> None:
    """Values read from a list (`text`) that are one value spelled twice ("0,none", "4,4.0", "on,true",
    a GPU in two cases) would run the same point twice under two labels: refused as parse_list does.
    `note` says why two spellings are one value, where that is not plain."""
    for i, value in enumerate(values):
        if value in values[:i]:
            raise ConfigError(f"{flag}: {'none' if value is None else value} is listed twice "
                              f"(in {_shown(text)}{'; ' + note if note else ''})")


def parse_kv_cache_dtypes(text: str) -> list[str]:
    """--kv-cache-dtype as a list (sweep, plan), each as spelled; vLLM's two names of one dtype
    ("fp8" is fp8_e4m3: simcore.specs.KV_CACHE_DTYPE_ALIASES) refused as one value listed twice."""
    from kvsim.simcore.specs import KV_CACHE_DTYPE_ALIASES, canonical_kv_cache_dtype

    values = parse_list("--kv-cache-dtype", text, str)
    aliases = "; ".join(f"{a} is {b} in vLLM" for a, b in KV_CACHE_DTYPE_ALIASES.items())
    check_distinct("--kv-cache-dtype", [canonical_kv_cache_dtype(v) for v in values], text, aliases)
    return values


def expand_grid(lists: dict[str, Sequence[Any]], zipped: Sequence[Sequence[str]] = ()) -> list[dict[str, Any]]:
    """Every combination of the listed values, the first field varying slowest. Each group in
    `zipped` (e.g. ("model", "tensor_parallel_size")) varies together, value i with value i, at
    the place of its first field: `--zip model,tp` compares Mixtral on TP 2 with Llama on TP 4."""
    axes: list[tuple[list[str], list[tuple]]] = []
    placed: set[str] = set()
    for name in lists:
        if name in placed:
            continue
        group = next((list(g) for g in zipped if name in g), [name])
        group = [n for n in lists if n in group]  # grid order inside the group
        lengths = {len(lists[n]) for n in group}
        if len(lengths) > 1:
            raise ConfigError("--zip " + ",".join(SWEEPABLE[n][1] for n in group) + ": the lists must have "
                              "the same length, got " + ", ".join(f"{len(lists[n])}" for n in group))
        axes.append((group, list(zip(*(lists[n] for n in group), strict=True))))
        placed.update(group)
    size = math.prod(len(values) for _, values in axes)
    if size > MAX_GRID_POINTS:  # each point is checked and memory-planned before any runs
        raise ConfigError(f"the sweep has {size:,} points (the product of the lists' lengths); at most "
                          f"{MAX_GRID_POINTS:,} in one sweep: split it, or --zip lists that vary together")
    cells = []
    for combo in itertools.product(*(values for _, values in axes)):
        cell: dict[str, Any] = {}
        for (group, _), values in zip(axes, combo, strict=True):
            cell.update(zip(group, values, strict=True))
        cells.append({n: cell[n] for n in lists})
    return cells


def parse_zip(text: str | None, lists: dict[str, Sequence[Any]]) -> list[tuple[str, ...]]:
    """--zip model,tp[;...]: groups of swept dimensions (by flag or column name) that vary together."""
    if text is None:
        return []
    by_name = {}
    for key, (flag, col) in SWEEPABLE.items():
        by_name.update({flag.removeprefix("--"): key, col: key, key: key})
    groups, seen = [], set()
    for part in text.split(";"):
        group = []
        for item in parse_list("--zip", part, str):
            key = by_name.get(item.removeprefix("--"))
            if key is None:
                raise ConfigError(f"--zip: {item!r} is not a swept option ({', '.join(c for _, c in SWEEPABLE.values())})")
            if key not in lists:
                raise ConfigError(f"--zip: {item} is not given as a list")
            if key in seen:
                raise ConfigError(f"--zip: {item} is in two groups")
            seen.add(key)
            group.append(key)
        if len(group) < 2:
            raise ConfigError(f"--zip {part!r}: name at least two swept options to vary together")
        groups.append(tuple(group))
    return groups


def workload_columns(described: dict[str, Any]) -> dict[str, Any]:
    """The workload as flat row columns (name, load and lengths), from its description."""
    arrival = described.get("arrival") or {}
    prompt, output = described.get("prompt_len"), described.get("output_len")
    prompt, output = (x if isinstance(x, dict) else {} for x in (prompt, output))  # a trace's are text
    return {
        "workload": described.get("name"), "num_requests": described.get("num_requests"),
        "arrival": arrival.get("process"), "rate": arrival.get("rate"), "burstiness": arrival.get("burstiness"),
        "concurrency": arrival.get("concurrency"), "think_time_s": arrival.get("think_time_s"),
        "input_len": prompt.get("mean"), "output_len": output.get("mean"),
        "max_tokens": described.get("max_tokens"), "n": described.get("n"), "beam_width": described.get("beam_width"),
    }


@dataclass(frozen=True)
class SweepPlan:
    """Every point of a sweep (one per grid cell and seed) and the sweep's id."""

    points: list[Point]
    sweep_id: str
    swept: list[str]  # SWEEPABLE names given as lists, in grid order

    @property
    def num_cells(self) -> int:
        return len({p.options["point"] for p in self.points})


def plan_sweep(
    models: ModelSpec | Sequence[ModelSpec], gpus: Sequence[GPUSpec], base: EngineConfig,
    lists: dict[str, Sequence[Any]], load_workload: Callable[[dict[str, Any], int], Any],
    profile_for: Callable[..., Any], seeds: Sequence[int], fixed: dict[str, Any],
    zipped: Sequence[Sequence[str]] = (),
    batch_defaults: tuple[frozenset[str], str] | None = None,
) -> SweepPlan:
    """Build and validate every point before anything runs: a bad value (vLLM's cross-field rules
    included) is a ConfigError for the whole sweep, a model that does not fit a cell is a point
    marked so. `fixed` are extra option columns (SLOs, profile). Several models are a dimension
    of the grid (the slowest-varying one), so a model column appears; one model keeps the table
    (and the point ids) as before. `batch_defaults` (fields, usage context): --engine-version's
    per-GPU step limits fill those fields at every point where they are not swept
    (simcore.batch_defaults)."""
    from kvsim.simcore.batch_defaults import apply_batch_defaults
    from kvsim.simcore.config import resolve

    models = [models] if isinstance(models, ModelSpec) else list(models)
    by_model = {m.name: m for m in models}
    if len(by_model) < len(models):
        raise ConfigError("--model: a model is listed twice")
    by_name = {g.name: g for g in gpus}
    grid_lists = {k: v for k, v in lists.items() if k not in ("gpu", "model")}
    grid_lists = {"gpu": [g.name for g in gpus], **grid_lists} if len(gpus) > 1 else grid_lists
    grid_lists = {"model": list(by_model), **grid_lists} if len(models) > 1 else grid_lists
    order = [k for k in SWEEPABLE if k in grid_lists]
    for group in zipped:
        for k in group:
            if k not in grid_lists:
                raise ConfigError(f"--zip: {SWEEPABLE[k][1]} is not given as a list of several values")
    cells = expand_grid({k: grid_lists[k] for k in order}, zipped)
    workloads: dict[tuple, Any] = {}
    points = []
    for index, values in enumerate(cells):
        model = by_model[values.get("model", models[0].name)]
        gpu = by_name[values.get("gpu", gpus[0].name)]
        engine = {k: v for k, v in values.items() if k not in ("model", "gpu", *WORKLOAD_DIMS)}
        load = {k: v for k, v in values.items() if k in WORKLOAD_DIMS}
        config = replace(base, **engine)  # re-runs EngineConfig validation
        if batch_defaults is not None:
            config = apply_batch_defaults(config, gpu, config.resolve_model(model), batch_defaults[0] - set(engine),
                                          batch_defaults[1])
        try:  # refuses what simulate() refuses, for every point before any runs; plans memory once
            resolved, reason = resolve(model, gpu, config), ""
        except DoesNotFitError as exc:
            resolved, reason = None, str(exc)
        except ConfigError as exc:
            if len(models) > 1 or len(gpus) > 1:  # say which point, when it is not obvious
                raise ConfigError(f"{exc} (point {model.name} on {gpu.name})") from None
            raise
        mml = config.resolved_max_model_len(model)
        key = (tuple(sorted(load.items())), mml)
        if key not in workloads:
            workloads[key] = load_workload(load, mml)
        workload = workloads[key]
        profile = None if reason else profile_for(gpu, config.tensor_parallel_size, config.resolve_model(model))
        options = {"point": index, "model": model.name, "gpu": gpu.name,
                   **workload_columns(workload.describe()), **config.to_dict(), **fixed}
        if "speculative_config" in grid_lists or config.speculative_config is not None:
            # one text cell (the point id keeps the whole config): "off" or method, k, acceptance
            options["speculative_config"] = config.speculative_config.label if config.speculative_config else "off"
        for seed in seeds:
            points.append(Point(model, gpu, config, workload, profile, seed, options, reason, resolved))
    if points and all(p.does_not_fit for p in points):  # nothing would run: bad input, not a table
        if len(points) == 1:
            raise DoesNotFitError(points[0].does_not_fit)
        raise DoesNotFitError(f"no point of the sweep fits; the first: {points[0].does_not_fit}")
    from kvsim.reports.sweep_table import sweep_id_of  # (it imports pandas)

    ids = [p.point_id() for p in points]
    sweep_id = sweep_id_of(ids)
    points = [replace(p, options={"point": p.options["point"], "point_id": pid, "sweep_id": sweep_id, **p.options})
              for p, pid in zip(points, ids, strict=True)]
    swept = [k for k in order if k in lists or k == "gpu" or (k == "model" and len(models) > 1)]
    return SweepPlan(points, sweep_id, swept)


_SHORT = {k: col for k, (_, col) in SWEEPABLE.items()}


def summarize_points(rows: pd.DataFrame, swept: Sequence[str], extra: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per grid cell in grid order: the swept values, then each metric's mean over seeds;
    with more than one seed, `<metric>_ci95_low/high` (95% Student-t interval, cut at the least and
    greatest value the metric can take: METRIC_BOUNDS) and `seeds`.
    `extra` (printed column -> row column) adds metrics after the p95s, e.g. an SLO's p99."""
    import pandas as pd

    sources = METRIC_SOURCES
    if extra:
        at = list(METRIC_SOURCES).index("tpot_p95_ms") + 1
        items = list(METRIC_SOURCES.items())
        sources = dict([*items[:at], *extra.items(), *items[at:]])
    out = []
    for _, group in rows.sort_values(["point", "seed"], kind="stable").groupby("point", sort=True):
        first = group.iloc[0]
        row: dict[str, Any] = {_SHORT[k]: _plain(first[k]) for k in swept}
        many = len(group) > 1
        for col, src in sources.items():
            if src not in group.columns:
                row[col] = None
                continue
            if col in LABEL_METRICS:
                labels = [str(x) for x in group[src]]
                row[col] = labels[0] if len(set(labels)) == 1 else "mixed: " + ", ".join(
                    f"{lab} x{labels.count(lab)}" for lab in sorted(set(labels)))
                continue
            mean, low, high = mean_ci95(pd.to_numeric(group[src], errors="coerce").tolist(),
                                        *METRIC_BOUNDS.get(col, DEFAULT_BOUNDS))
            row[col] = None if math.isnan(mean) else mean
            if col in CONFIG_METRICS:  # set by the configuration, the same for every seed
                row[col] = None if math.isnan(mean) else int(mean)
            elif many:
                row[f"{col}_ci95_low"] = None if math.isnan(low) else low
                row[f"{col}_ci95_high"] = None if math.isnan(high) else high
        for col, src in sources.items():  # --error-bars: the model's 90% band, its ends averaged over seeds
            if f"{src}_band_low" in group.columns:
                for end in ("low", "high"):
                    mean = pd.to_numeric(group[f"{src}_band_{end}"], errors="coerce").mean()
                    row[f"{col}_band_{end}"] = None if math.isnan(mean) else float(mean)
        if many:
            row["seeds"] = ",".join(str(int(s)) for s in group["seed"])
        out.append(row)
    frame = pd.DataFrame(out)
    if not any(f"{c}_ci95_low" in frame.columns for c in METRIC_COLUMNS):
        frame = frame.astype({c: "Int64" for c in INT_COLUMNS if c in frame.columns})
    else:
        frame = frame.astype({c: "Int64" for c in CONFIG_METRICS if c in frame.columns})
    return frame


def cut_ends(col: str, mean: Any, low: Any, high: Any) -> tuple[bool, bool]:
    """Which ends of `col`'s interval summarize_points cut at the metric's bounds (an end sitting on
    a bound the mean is not on: the t interval went past it)."""
    lower, upper = METRIC_BOUNDS.get(col, DEFAULT_BOUNDS)
    try:
        if any(v is None or math.isnan(float(v)) for v in (mean, low, high)):
            return False, False
    except (TypeError, ValueError):  # pandas' NA: no value
        return False, False
    return (lower is not None and float(low) <= lower < float(mean),
            upper is not None and float(high) >= upper > float(mean))


def _plain(value: Any) -> Any:
    """numpy scalars -> Python ones (JSON-ready)."""
    return value.item() if hasattr(value, "item") else value


def add_slo(frame: pd.DataFrame, ttft_p95_ms: float | None, tpot_p95_ms: float | None,
            others: Sequence[Any] = ()) -> pd.DataFrame:
    """A `meets_slo` column before `regime`: every given p95 target met, and every other
    percentile target (`others`: reports.capacity.Target, their columns from `summarize_points`'
    `extra`); a point that did not run never meets it."""
    ok = frame["output_tok_s"].notna()
    if "load" in frame.columns:  # an overloaded point's percentiles only grow with a longer run
        ok &= frame["load"].ne("overloaded")
    metrics = {"ttft_p95_ms": "ttft", "tpot_p95_ms": "tpot", **{t.column: t.metric for t in others}}
    for col, limit in (("ttft_p95_ms", ttft_p95_ms), ("tpot_p95_ms", tpot_p95_ms),
                       *((t.column, t.limit_ms) for t in others)):
        if limit is not None:
            values = frame[col].astype(float)
            met = values.le(limit)
            if metrics[col] in ("tpot", "itl"):  # a point that ran with no TPOT / ITL: every output one token,
                met |= values.isna()  # nothing to miss (reports.capacity._none_to_miss)
            ok &= met.fillna(False)
    frame = frame.copy()
    frame.insert(frame.columns.get_loc("regime"), "meets_slo", ok.astype(bool))
    return frame


def cheapest_passing(frame: pd.DataFrame, gpus_of: Sequence[int]) -> int | None:
    """Index of the passing point with the fewest GPUs (TP x DP), then the highest throughput."""
    passing = [i for i in range(len(frame)) if bool(frame["meets_slo"].iloc[i])]
    if not passing:
        return None
    return min(passing, key=lambda i: (gpus_of[i], -float(frame["output_tok_s"].iloc[i]), i))
