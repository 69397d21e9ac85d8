"""Fit the roofline's linear-work efficiency factors on measured H100 operator timings.

Data: `shared/data/measured/vidur_h100_llama2-7b_mlp.csv` (Vidur's published H100 profile of
the Llama-2-7B layer, TP 1/2/4/8, MIT licence) and nothing else: other published measurements
are kept for checking kvsim's predictions. The fit is deterministic least squares on
log(predicted) - log(measured): a refining grid search (no random starts, no SciPy).

    GEMM (QKV, out-proj, gate+up, down):  t = floor_g + max(F / (peak c), B / (hbm b))
    elementwise kind k (norm/rope/act/add):  t = floor_e + B / (hbm e_k)

    python -m profiles.fit            # print the fit and the README table
    python -m profiles.fit --write    # also write efficiency_h100.json and the README table
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.profiles.roofline import EFFICIENCY_FILE, ELEMENTWISE_KINDS, Efficiency, linear_ops, op_ms
from kvsim.simcore.catalog import get_gpu
from kvsim.simcore.specs import ModelSpec

# profiles/data/ ships a copy (so a clone can refit); the project's shared folder is the origin
DATA = Path(__file__).resolve().parent / "data" / "vidur_h100_llama2-7b_mlp.csv"
if not DATA.exists():
    DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "measured" / DATA.name
README = Path(__file__).with_name("README.md")
OPS = (
    "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
    "mlp_up_proj", "mlp_act", "mlp_down_proj", "add",
)
TABLE_TOKENS = (1, 16, 128, 512, 2048, 4096)
BEGIN, END = "<!-- fit-table:begin -->", "<!-- fit-table:end -->"


def _data_path(path: Path | None) -> Path:
    for p in (path, DATA):
        if p is not None and p.exists():
            return p
    raise FileNotFoundError(f"measured H100 data not found at {DATA}")


def load_points(path: Path | None = None) -> tuple[pd.DataFrame, Path]:
    """One row per (operator, num_tokens, tp): the median of the measured medians, in ms,
    with the operator's flops and bytes at that shape."""
    path = _data_path(path)
    raw = pd.read_csv(path)
    first = raw.iloc[0]
    model = ModelSpec(
        "llama2-7b-csv", 32, int(first.n_embd), int(first.n_head), int(first.n_kv_head),
        int(first.n_embd) // int(first.n_head), int(first.n_expanded_embd), int(first.vocab_size),
        gated_mlp=bool(first.use_gated_mlp),
    )
    cols = {f"time_stats.{op}.median": op for op in OPS}
    grouped = raw.groupby(["num_tokens", "num_tensor_parallel_workers"])[list(cols)].median()
    rows = []
    for (tokens, tp), meas in grouped.iterrows():
        for op, kind, flops, nbytes in linear_ops(model, int(tp), int(tokens)):
            rows.append((op, kind, int(tokens), int(tp), flops, nbytes, float(meas[f"time_stats.{op}.median"])))
    df = pd.DataFrame(rows, columns=["op", "kind", "num_tokens", "tp", "flops", "bytes", "measured_ms"])
    return df[df.measured_ms > 0].reset_index(drop=True), path


def _refine(loss, lo: np.ndarray, hi: np.ndarray, n: int = 15, rounds: int = 8) -> np.ndarray:
    """Minimise loss(params[combos, dims]) -> [combos] over a box by a shrinking grid."""
    lo, hi = lo.astype(float), hi.astype(float)
    best = (lo + hi) / 2
    for _ in range(rounds):
        axes = [np.linspace(a, b, n) for a, b in zip(lo, hi, strict=True)]
        grid = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1)
        best = grid[int(np.argmin(loss(grid)))]
        span = (hi - lo) / 4
        lo, hi = np.maximum(lo, best - span), np.minimum(hi, best + span)
        lo, hi = np.minimum(lo, best), np.maximum(hi, best)
    return best


def fit(points: pd.DataFrame) -> Efficiency:
    gpu = get_gpu("H100-SXM-80GB")
    peak, hbm = gpu.bf16_tflops * 1e12, gpu.hbm_tbps * 1e12
    g = points[points.kind == "gemm"]
    fl, by, lm = g.flops.to_numpy(), g.bytes.to_numpy(), np.log(g.measured_ms.to_numpy())

    def gemm_loss(p: np.ndarray) -> np.ndarray:  # p: [log c, log b, floor_ms]
        c, b, f = np.exp(p[:, :1]), np.exp(p[:, 1:2]), p[:, 2:3]
        pred = f + 1e3 * np.maximum(fl / (peak * c), by / (hbm * b))
        return ((np.log(pred) - lm) ** 2).sum(axis=1)

    lc, lb, gf = _refine(gemm_loss, np.array([math.log(0.05), math.log(0.05), 0.0]), np.array([0.0, 0.0, 0.05]))
    e = points[points.kind != "gemm"]

    def best_kinds(floor: float) -> tuple[float, dict[str, float]]:
        total, effs = 0.0, {}
        for kind in ELEMENTWISE_KINDS:
            k = e[e.kind == kind]
            kb, km = k.bytes.to_numpy(), np.log(k.measured_ms.to_numpy())

            def kind_loss(p: np.ndarray, kb=kb, km=km) -> np.ndarray:
                pred = floor + 1e3 * kb / (hbm * np.exp(p[:, :1]))
                return ((np.log(pred) - km) ** 2).sum(axis=1)

            le = _refine(kind_loss, np.array([math.log(0.02)]), np.array([0.0]), n=41, rounds=6)[0]
            effs[kind] = math.exp(le)
            total += float(kind_loss(np.array([[le]]))[0])
        return total, effs

    ef = _refine(lambda p: np.array([best_kinds(float(x))[0] for x in p[:, 0]]),
                 np.array([0.0]), np.array([0.02]), n=9, rounds=6)[0]
    _, effs = best_kinds(float(ef))
    return Efficiency(
        compute=round(math.exp(lc), 4), bandwidth=round(math.exp(lb), 4), gemm_floor_ms=round(float(gf), 5),
        elementwise={k: round(v, 4) for k, v in effs.items()}, elementwise_floor_ms=round(float(ef), 5),
    )


def predict(points: pd.DataFrame, eff: Efficiency) -> pd.DataFrame:
    gpu = get_gpu("H100-SXM-80GB")
    out = points.copy()
    out["predicted_ms"] = [op_ms(gpu, eff, k, f, b) for k, f, b in zip(out.kind, out.flops, out.bytes, strict=True)]
    out["rel_error"] = out.predicted_ms / out.measured_ms - 1.0
    return out


def error_summary(pred: pd.DataFrame) -> dict[str, Any]:
    err = pred.rel_error.abs()
    per_op = pred.assign(abs_err=err).groupby("op").abs_err.agg(["median", "max"])
    return {
        "median_abs_rel_error": round(float(err.median()), 4),
        "worst_abs_rel_error": round(float(err.max()), 4),
        "per_operator": {
            op: {"median_abs_rel_error": round(float(r["median"]), 4), "worst_abs_rel_error": round(float(r["max"]), 4)}
            for op, r in per_op.iterrows()
        },
    }


def markdown_table(pred: pd.DataFrame) -> str:
    lines = []
    for tp in (1, 8):
        sub = pred[(pred.tp == tp) & pred.num_tokens.isin(TABLE_TOKENS)].set_index(["op", "num_tokens"])
        lines.append(f"Predicted / measured ms, one layer, TP {tp}:\n")
        lines.append("| operator | " + " | ".join(f"T={t}" for t in TABLE_TOKENS) + " |")
        lines.append("| --- |" + " --- |" * len(TABLE_TOKENS))
        for op in OPS:
            cells = []
            for t in TABLE_TOKENS:
                r = sub.loc[(op, t)] if (op, t) in sub.index else None
                cells.append("-" if r is None else f"{r.predicted_ms:.3f} / {r.measured_ms:.3f}")
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
        lines.append("")
    s = error_summary(pred)
    lines.append("Absolute relative error over every token count (1..4096) and TP (1, 2, 4, 8):\n")
    lines.append("| operator | median | worst |")
    lines.append("| --- | --- | --- |")
    for op in OPS:
        r = s["per_operator"][op]
        lines.append(f"| {op} | {r['median_abs_rel_error']:.1%} | {r['worst_abs_rel_error']:.1%} |")
    lines.append(f"| **all** | **{s['median_abs_rel_error']:.1%}** | **{s['worst_abs_rel_error']:.1%}** |")
    return "\n".join(lines)


def efficiency_document(eff: Efficiency, pred: pd.DataFrame, path: Path) -> dict[str, Any]:
    doc = eff.to_dict()
    doc["fit"] = {
        "data": "shared/data/measured/vidur_h100_llama2-7b_mlp.csv",
        "data_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "data_source": "Vidur (microsoft/vidur) H100 Llama-2-7B mlp.csv, MIT licence",
        "gpu_spec": "H100-SXM-80GB catalog datasheet (989.4 TFLOP/s bf16, 3.35 TB/s)",
        "points": int(len(pred)),
        "method": "least squares on log(pred/measured), refining grid search (deterministic)",
        "model": {
            "gemm": "floor + max(flops/(peak*compute), bytes/(hbm*bandwidth))",
            "elementwise": "floor + bytes/(hbm*efficiency[kind])",
        },
        **error_summary(pred),
    }
    return doc


def replace_readme_table(table: str, readme: Path = README) -> None:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: markers {BEGIN} / {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="the measured CSV")
    parser.add_argument("--write", action="store_true", help="write efficiency_h100.json and the README table")
    args = parser.parse_args()
    points, path = load_points(args.data)
    eff = fit(points)
    pred = predict(points, eff)
    table = markdown_table(pred)
    print(json.dumps(eff.to_dict(), indent=2))
    print(table)
    if args.write:
        EFFICIENCY_FILE.write_text(json.dumps(efficiency_document(eff, pred, path), indent=2) + "\n")
        if README.exists():
            replace_readme_table(table)


if __name__ == "__main__":
    main()
