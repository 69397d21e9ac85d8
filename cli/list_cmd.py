"""`kvsim list models|gpus|profiles`: what the built-in catalog and the committed profiles hold."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from kvsim.simcore.catalog import GPU_SOURCES, GPUS, MODELS
from kvsim.simcore.specs import GIB


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
        rows = [[m.name, f"{m.num_params / 1e9:.1f}B", f"{m.num_active_params / 1e9:.1f}B",
                 f"{m.num_experts} top-{m.num_experts_per_tok}" if m.is_moe else "-",
                 str(m.num_layers), str(m.hidden_size),
                 f"{m.num_attention_heads}/{'MLA' if m.is_mla else m.num_kv_heads}", f"{m.max_position_embeddings:,}",
                 f"{m.kv_bytes_per_token() / 1024:.0f} KiB", f"{m.weight_bytes / GIB:.1f} GiB"]
                for m in MODELS.values()]
        typer.echo(_table(["model", "params", "active", "experts", "layers", "hidden", "heads/kv",
                           "context", "KV/token", "weights"], rows))
        typer.echo("KV/token and weights in the checkpoint's dtypes (bf16; deepseek-v3: FP8 weights); "
                   "--kv-cache-dtype fp8 halves KV/token, --quantization fp8 stores the linear layers in 1 byte. "
                   "MLA: one latent per token, not split by TP.")
    elif what is What.gpus:
        rows = [[g.name, f"{g.memory_gib:.1f} GiB", f"{g.bf16_tflops:g}",
                 f"{g.fp8_tflops:g}" if g.fp8_tflops else "none", f"{g.hbm_tbps:g}",
                 f"{g.interconnect_gbps:g}", f"{g.pcie_gbps:g}", str(g.gpus_per_node),
                 f"{g.internode_gbps:g}"] for g in GPUS.values()]
        typer.echo(_table(["gpu", "memory", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM TB/s", "NVLink GB/s",
                           "PCIe GB/s", "GPUs/node", "inter-node GB/s"], rows))
        typer.echo("TFLOP/s are dense (no sparsity); NVLink GB/s is per direction (AMD: Infinity Fabric, "
                   "L40S: PCIe). Sources:")
        for name in GPUS:
            typer.echo(f"  {name}: {GPU_SOURCES.get(name, 'user-defined')}")
    else:
        _list_profiles()


def _list_profiles() -> None:
    """Every committed profile with what it covers: GPU, model, weight and KV dtypes, TP, and
    whether it was measured, calibrated or priced from the datasheet (roofline)."""
    import json

    from kvsim.profiles import PROFILE_DIR

    rows = []
    for path in sorted(PROFILE_DIR.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("schema") != "kvsim-profile":
            continue
        base = "float32" if data.get("dtype") in ("float32", "fp32") else "bfloat16"
        rows.append([path.stem, str(data.get("gpu")), str(data.get("model")),
                     str(data.get("weight_dtype", base)), str(data.get("kv_cache_dtype", base)),
                     str(data.get("tensor_parallel_size")), "any", str(data.get("source"))])
    typer.echo(_table(["name", "gpu", "model", "weights", "kv cache", "tp", "pp", "source"], rows))
    typer.echo("Give a name to --profile (run, sweep, profile check/validate) or to `kvsim profile "
               "compare` from any folder.")
    typer.echo("Profiles are per layer, so every --pp reuses the TP profile. Any catalog (model, "
               "GPU, dtype, TP) without a file here runs on a roofline profile built in memory.")
