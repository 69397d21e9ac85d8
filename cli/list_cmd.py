"""`kvsim list models|gpus|profiles`: what the built-in catalog and the committed profiles hold."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from simcore.catalog import GPUS, MODELS
from simcore.specs import GIB


class What(str, Enum):
    models = "models"
    gpus = "gpus"
    profiles = "profiles"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def list_catalog(what: Annotated[What, typer.Argument(help="models, gpus or profiles.")]) -> None:
    """List the catalog's models or GPUs, or the committed latency profiles."""
    if what is What.models:
        rows = [[m.name, f"{m.num_params / 1e9:.1f}B", str(m.num_layers), str(m.hidden_size),
                 f"{m.num_attention_heads}/{m.num_kv_heads}", f"{m.max_position_embeddings:,}",
                 f"{m.kv_bytes_per_token() / 1024:.0f} KiB", f"{m.weight_bytes / GIB:.1f} GiB"]
                for m in MODELS.values()]
        typer.echo(_table(["model", "params", "layers", "hidden", "heads/kv", "context",
                           "KV/token", "weights"], rows))
    elif what is What.gpus:
        rows = [[g.name, f"{g.memory_gib:.1f} GiB", f"{g.bf16_tflops:g}", f"{g.hbm_tbps:g}",
                 f"{g.interconnect_gbps:g}", f"{g.pcie_gbps:g}"] for g in GPUS.values()]
        typer.echo(_table(["gpu", "memory", "bf16 TFLOP/s", "HBM TB/s", "NVLink GB/s", "PCIe GB/s"], rows))
    else:
        import json

        from profiles import PROFILE_DIR

        rows = []
        for path in sorted(PROFILE_DIR.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if data.get("schema") != "kvsim-profile":
                continue
            rows.append([path.name, str(data.get("gpu")), str(data.get("model")),
                         str(data.get("tensor_parallel_size")), str(data.get("source"))])
        typer.echo(_table(["file", "gpu", "model", "tp", "source"], rows))
