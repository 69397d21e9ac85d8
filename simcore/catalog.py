"""Built-in GPUs and model shapes, and a reader for a Hugging Face `config.json`.

GPU memory is what `torch.cuda.mem_get_info` reports (what vLLM budgets from), not the
marketing figure; compute and bandwidth are the vendors' dense datasheet peaks.
"""

from __future__ import annotations

import json
from pathlib import Path

from simcore.errors import ConfigError
from simcore.specs import GPUSpec, ModelSpec

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("H100-SXM-80GB", 79.19, 989.4, 3.35, 450.0, pcie_gbps=64.0),
        GPUSpec("H200-141GB", 139.8, 989.4, 4.8, 450.0, pcie_gbps=64.0),
        GPUSpec("A100-80GB", 79.15, 312.0, 2.039, 300.0, pcie_gbps=32.0),
        GPUSpec("A100-40GB", 39.39, 312.0, 1.555, 300.0, pcie_gbps=32.0),
    )
}

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, max_position_embeddings=8192),
        ModelSpec("llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, max_position_embeddings=8192),
        ModelSpec("llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000, max_position_embeddings=4096),
        ModelSpec("llama2-70b", 80, 8192, 64, 8, 128, 28672, 32000, max_position_embeddings=4096),
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, max_position_embeddings=32768),
        ModelSpec(
            "opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, max_position_embeddings=2048,
            gated_mlp=False, tie_word_embeddings=True,
        ),
        # A toy shape small enough to profile on a CPU in seconds (tests, smoke runs).
        ModelSpec("tiny", 2, 256, 4, 2, 64, 688, 1024, max_position_embeddings=2048),
    )
}

# Names users type, mapped to catalog keys (case-insensitive lookup on top of these).
_ALIASES = {
    "h100": "H100-SXM-80GB", "h100-sxm": "H100-SXM-80GB", "h100-80gb": "H100-SXM-80GB",
    "h200": "H200-141GB", "a100": "A100-80GB", "a100-80g": "A100-80GB", "a100-40g": "A100-40GB",
    "meta-llama/meta-llama-3-8b": "llama3-8b", "llama-3-8b": "llama3-8b",
    "meta-llama/meta-llama-3-70b": "llama3-70b", "llama-3-70b": "llama3-70b",
    "meta-llama/llama-2-7b-hf": "llama2-7b", "llama-2-7b": "llama2-7b",
    "meta-llama/llama-2-70b-hf": "llama2-70b", "llama-2-70b": "llama2-70b",
    "mistralai/mistral-7b-v0.1": "mistral-7b", "facebook/opt-13b": "opt-13b",
}


def _lookup(name: str, table: dict, kind: str):
    by_lower = {k.lower(): v for k, v in table.items()}
    key = name.lower()
    key = _ALIASES.get(key, key).lower()
    if key in by_lower:
        return by_lower[key]
    raise ConfigError(f"unknown {kind} {name!r}; known: {', '.join(table)}")


def get_gpu(name: str) -> GPUSpec:
    return _lookup(name, GPUS, "GPU")


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a Hugging Face `config.json` (or a folder holding one)."""
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or path.is_dir():
        return model_from_hf_config(path)
    return _lookup(name_or_path, MODELS, "model")


# torch_dtype (or `dtype`, its newer name) -> bytes per weight and KV element. An fp8 dtype or a
# `quantization_config` is refused by `_refuse_quantized` until FP8 weights and KV are modelled.
_HF_DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
}
_HF_INT_FIELDS = (
    ("hidden_size", "d_model", "n_embd"), ("num_attention_heads", "n_head"),
    ("num_hidden_layers", "n_layer"), ("intermediate_size", "ffn_dim", "n_inner"), ("vocab_size",),
)


def model_from_hf_config(path: Path) -> ModelSpec:
    """Read the transformer shape from a Hugging Face `config.json` (Llama, Mistral, OPT...).

    Strict: a count that is not a whole number (`true`, `31.5`, `"32"`), an unknown dtype or a
    quantized checkpoint is refused with the file and the field named, never coerced."""
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"model config {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model config {path}: not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model config {path}: expected a JSON object")
    _refuse_quantized(path, cfg)
    ints = {keys[0]: _hf_int(path, cfg, keys) for keys in _HF_INT_FIELDS}
    hidden, heads = ints["hidden_size"], ints["num_attention_heads"]
    kv_heads = _hf_int(path, cfg, ("num_key_value_heads",), default=heads)
    if heads % kv_heads:
        raise ConfigError(
            f"model config {path}: num_attention_heads ({heads}) must be a multiple of "
            f"num_key_value_heads ({kv_heads})"
        )
    if hidden % heads and "head_dim" not in cfg:
        raise ConfigError(
            f"model config {path}: hidden_size ({hidden}) is not a multiple of num_attention_heads "
            f"({heads}); give head_dim"
        )
    act = cfg.get("hidden_act", cfg.get("activation_function", "silu"))
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ConfigError(f"model config {path}: field 'tie_word_embeddings' must be true or false, got {tie!r}")
    name = cfg.get("_name_or_path") or path.parent.name or "hf-model"
    return ModelSpec(
        name=str(name),
        num_layers=ints["num_hidden_layers"],
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_hf_int(path, cfg, ("head_dim",), default=hidden // heads),
        intermediate_size=ints["intermediate_size"],
        vocab_size=ints["vocab_size"],
        dtype_bytes=_hf_dtype_bytes(path, cfg),
        max_position_embeddings=_hf_int(
            path, cfg, ("max_position_embeddings", "n_positions"), default=4096, minimum=2
        ),
        gated_mlp=act in ("silu", "swiglu", "gelu_pytorch_tanh") and "ffn_dim" not in cfg,
        tie_word_embeddings=tie,
    )


def _hf_int(path: Path, cfg: dict, keys: tuple[str, ...], default: int | None = None, minimum: int = 1) -> int:
    """The first of `keys` present, as a whole number >= minimum (JSON true / 31.5 / "32" refused)."""
    key = next((k for k in keys if k in cfg and cfg[k] is not None), None)
    if key is None:
        if default is None:
            raise ConfigError(f"model config {path}: missing field {keys[0]!r}")
        return default
    value = cfg[key]
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < minimum:
        raise ConfigError(f"model config {path}: field {key!r} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def _hf_dtype_bytes(path: Path, cfg: dict) -> int:
    key = "torch_dtype" if "torch_dtype" in cfg else "dtype"
    value = cfg.get(key)
    if value is None:
        return 2  # no dtype: served as 16-bit, vLLM's dtype "auto" for an unlabelled checkpoint
    if not isinstance(value, str) or value.lower().removeprefix("torch.") not in _HF_DTYPE_BYTES:
        if isinstance(value, str) and "float8" in value.lower():
            raise ConfigError(
                f"model config {path}: {key} {value!r} is an FP8 checkpoint; kvsim does not model "
                "FP8 weights yet (use a bf16/fp16 config of the same model)"
            )
        raise ConfigError(
            f"model config {path}: unknown {key} {value!r} "
            f"(known: {', '.join(sorted(_HF_DTYPE_BYTES))})"
        )
    return _HF_DTYPE_BYTES[value.lower().removeprefix("torch.")]


def _refuse_quantized(path: Path, cfg: dict) -> None:
    """A quantized checkpoint's weights are not `torch_dtype`-sized; sizing them as if they were
    would be silently wrong, so refuse (the one place to change when quantization is modelled)."""
    quant = cfg.get("quantization_config")
    if quant is None:
        return
    method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
    raise ConfigError(
        f"model config {path}: quantization_config (quant_method {method!r}) is not supported yet; "
        "kvsim sizes weights and KV cache from torch_dtype (use the unquantized config)"
    )
