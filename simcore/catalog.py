"""Built-in GPUs and model shapes, and a reader for a Hugging Face `config.json`.

GPU memory is what `torch.cuda.mem_get_info` reports (what vLLM budgets from), not the
marketing figure; compute and bandwidth are the vendors' dense datasheet peaks. FP8 peaks are
the datasheets' dense figures (half the "with sparsity" number): H100 SXM 1,979 TFLOP/s
(nvidia.com/en-us/data-center/h100, datasheet table), H200 1,979 TFLOP/s
(nvidia.com/en-us/data-center/h200); A100 (Ampere, compute capability 8.0) has no FP8 tensor
cores. Nodes are 8-GPU HGX/DGX boards; the inter-node link is one NIC per GPU: DGX H100/H200
have 8 x 400 Gb/s ConnectX-7 (50 GB/s per GPU), DGX A100 8 x 200 Gb/s ConnectX-6 HDR
(25 GB/s) (NVIDIA DGX H100/H200 and DGX A100 datasheets).
"""

from __future__ import annotations

import os
from pathlib import Path

from kvsim.simcore.errors import ConfigError
from kvsim.simcore.specs import GPUSpec, ModelSpec

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("H100-SXM-80GB", 79.19, 989.4, 3.35, 450.0, pcie_gbps=64.0, fp8_tflops=1978.9,
                internode_gbps=50.0),
        GPUSpec("H200-141GB", 139.8, 989.4, 4.8, 450.0, pcie_gbps=64.0, fp8_tflops=1978.9,
                internode_gbps=50.0),
        GPUSpec("A100-80GB", 79.15, 312.0, 2.039, 300.0, pcie_gbps=32.0, internode_gbps=25.0),
        GPUSpec("A100-40GB", 39.39, 312.0, 1.555, 300.0, pcie_gbps=32.0, internode_gbps=25.0),
        GPUSpec("H100-PCIe-80GB", 79.19, 756.0, 2.0, 300.0, pcie_gbps=64.0, fp8_tflops=1513.0,
                gpus_per_node=2, internode_gbps=64.0),
        GPUSpec("B200-180GB", 178.35, 2250.0, 7.68, 900.0, pcie_gbps=64.0, fp8_tflops=4500.0,
                internode_gbps=50.0),
        GPUSpec("GB200-NVL72", 184.1, 2500.0, 8.0, 900.0, pcie_gbps=64.0, fp8_tflops=5000.0,
                gpus_per_node=72, internode_gbps=50.0),
        GPUSpec("L40S-48GB", 44.52, 362.05, 0.864, 32.0, pcie_gbps=32.0, fp8_tflops=733.0,
                internode_gbps=25.0),
        GPUSpec("MI300X-192GB", 190.06, 1307.4, 5.3, 448.0, pcie_gbps=64.0, fp8_tflops=2614.9,
                internode_gbps=50.0),
        GPUSpec("MI325X-256GB", 253.41, 1307.4, 6.0, 448.0, pcie_gbps=64.0, fp8_tflops=2614.9,
                internode_gbps=50.0),
    )
}

# Where each GPU's figures come from (`kvsim list gpus` prints these). Rooflines from them are
# datasheet estimates, labelled "roofline" like every profile not measured on the GPU. Memory is
# what the runtime reports where that was published or measured; otherwise the binary datasheet
# capacity less the 1.0% the H100 runtime keeps (80 GiB -> 79.19 GiB), stated as such. Collectives
# of GPUs other than the H100 are the measured H100 NCCL tables scaled by interconnect bandwidth
# (profiles/collectives.py says so in each profile).
GPU_SOURCES: dict[str, str] = {
    "H100-SXM-80GB": "NVIDIA H100 datasheet (SXM); memory as torch reports it; NCCL timings measured (shared/data)",
    "H200-141GB": "NVIDIA H200 datasheet; memory as torch reports it",
    "A100-80GB": "NVIDIA A100 datasheet (SXM4); memory as torch reports it",
    "A100-40GB": "NVIDIA A100 datasheet (SXM4); memory as torch reports it",
    "H100-PCIe-80GB": "NVIDIA H100 PCIe datasheet: 756 / 1,513 dense bf16 / FP8 TFLOP/s, 2.0 TB/s HBM2e, NVLink "
                      "bridge 600 GB/s bidirectional between pairs (GPUs/node 2); TP beyond a pair goes over PCIe "
                      "Gen5 x16 (64 GB/s, priced as the inter-node link); memory as the SXM part's",
    "B200-180GB": "NVIDIA HGX B200 datasheet: 2.25 / 4.5 PFLOP/s dense bf16 / FP8, NVLink 5 1.8 TB/s bidirectional; "
                  "HBM 7.68 TB/s and 178.35 GiB from the driver's reported bus width and memory "
                  "(pytorch/ao pull request 4002, 2026-03); DGX B200 8 x 400 Gb/s ConnectX-7",
    "GB200-NVL72": "NVIDIA GB200 NVL72 datasheet, per GPU (rack figures / 72): 2.5 / 5 PFLOP/s dense bf16 / FP8, "
                   "8 TB/s, 186 GB HBM3e (less 1.0%); one NVLink 5 domain of 72 GPUs at 1.8 TB/s bidirectional",
    "L40S-48GB": "NVIDIA L40S datasheet: 362 / 733 dense bf16 / FP8 TFLOP/s (half the sparsity figures), 864 GB/s "
                 "GDDR6, 48 GB = 44.7 GiB less 0.4% (ECC reserve, an assumption); no NVLink: GPU-to-GPU over PCIe "
                 "Gen4 x16 (32 GB/s); one 200 Gb/s NIC per GPU assumed",
    "MI300X-192GB": "AMD Instinct MI300X datasheet: 1,307.4 / 2,614.9 dense bf16 / FP8 TFLOP/s, 5.3 TB/s HBM3, "
                    "192 GiB less 1.0%; Infinity Fabric 7 links x 64 GB/s per direction = 448 GB/s aggregate "
                    "(a ring over all 8 GPUs uses every link: TP 2 gets one link, so kvsim's TP 2 collectives are "
                    "optimistic); 8 x 400 Gb/s NICs per node assumed. Its roofline uses the H100-fitted kernel "
                    "efficiencies: ROCm kernels reaching a lower share of peak would make it slower than priced",
    "MI325X-256GB": "AMD Instinct MI325X datasheet: compute as MI300X, 6.0 TB/s HBM3E, 256 GiB less 1.0%; fabric as "
                    "MI300X",
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
        # Mixture-of-experts, from the Hugging Face config.json of each:
        # huggingface.co/mistralai/Mixtral-8x7B-v0.1 (8 experts, top-2, 46.7B parameters in
        # all, 12.9B active: Mistral AI, "Mixtral of experts", 2023-12-11) and
        # huggingface.co/Qwen/Qwen3-30B-A3B (128 experts of width 768, top-8; model card:
        # 30.5B in all, 3.3B activated).
        ModelSpec(
            "mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, max_position_embeddings=32768,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336,
        ),
        ModelSpec(
            "qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, max_position_embeddings=40960,
            num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
        ),
        # Llama 3.1 / 3.3 (huggingface.co/meta-llama/Llama-3.1-8B, -70B, -405B and Llama-3.3-70B-Instruct
        # config.json): 128k context through llama3 rope scaling (factor 8 over 8,192 original
        # positions), same shapes as Llama 3 otherwise; 405B: 126 layers of width 16,384, 128 heads.
        ModelSpec("llama3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, max_position_embeddings=131072),
        ModelSpec("llama3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, max_position_embeddings=131072),
        ModelSpec("llama3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256, max_position_embeddings=131072),
        ModelSpec("llama3.3-70b", 80, 8192, 64, 8, 128, 28672, 128256, max_position_embeddings=131072),
        # Qwen dense (huggingface.co/Qwen/Qwen2.5-72B-Instruct: 32,768 positions without YaRN;
        # Qwen/Qwen3-32B: head_dim 128 with 64 heads over a 5,120 hidden size, 40,960 positions).
        ModelSpec("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064, max_position_embeddings=32768),
        ModelSpec("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, max_position_embeddings=40960),
        # DeepSeek-V3 (huggingface.co/deepseek-ai/DeepSeek-V3 config.json; DeepSeek-AI, "DeepSeek-V3
        # Technical Report", arXiv:2412.19437): 61 layers, the first 3 dense (width 18,432), then 256
        # routed experts of width 2,048, top-8, plus 1 shared expert; MLA with kv_lora_rank 512,
        # rope 64, nope 128, v 128, q_lora_rank 1,536; an FP8 checkpoint (block-wise e4m3); one
        # multi-token-prediction module (num_nextn_predict_layers 1, the report's sec. 2.2).
        # 671B parameters, 37B active (the report; `kvsim list models` computes 671.0B / 37.6B).
        ModelSpec(
            "deepseek-v3", 61, 7168, 128, 128, 192, 18432, 129280, max_position_embeddings=163840,
            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
            shared_expert_intermediate_size=2048, quantization="fp8", kv_lora_rank=512, qk_rope_head_dim=64,
            qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536, first_k_dense_replace=3,
            num_nextn_predict_layers=1,
        ),
        # Qwen3-235B-A22B (huggingface.co/Qwen/Qwen3-235B-A22B): 94 layers, 128 experts of width
        # 1,536, top-8, GQA 64/4 heads of 128; 235B in all, 22B activated (model card).
        ModelSpec(
            "qwen3-235b-a22b", 94, 4096, 64, 4, 128, 12288, 151936, max_position_embeddings=40960,
            num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536,
        ),
        # A toy shape small enough to profile on a CPU in seconds (tests, smoke runs).
        ModelSpec("tiny", 2, 256, 4, 2, 64, 688, 1024, max_position_embeddings=2048),
        # Its MoE twin (8 experts of width 128, top-2): the harness's MoE path on a CPU.
        ModelSpec("tiny-moe", 2, 256, 4, 2, 64, 688, 1024, max_position_embeddings=2048,
                  num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128),
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
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b", "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral": "mixtral-8x7b", "qwen/qwen3-30b-a3b": "qwen3-30b-a3b",
    "meta-llama/llama-3.1-8b": "llama3.1-8b", "meta-llama/llama-3.1-8b-instruct": "llama3.1-8b",
    "meta-llama/llama-3.1-70b": "llama3.1-70b", "meta-llama/llama-3.1-70b-instruct": "llama3.1-70b",
    "meta-llama/llama-3.1-405b": "llama3.1-405b", "meta-llama/llama-3.1-405b-instruct": "llama3.1-405b",
    "meta-llama/llama-3.3-70b-instruct": "llama3.3-70b", "llama-3.1-8b": "llama3.1-8b",
    "llama-3.1-70b": "llama3.1-70b", "llama-3.1-405b": "llama3.1-405b", "llama-3.3-70b": "llama3.3-70b",
    "qwen/qwen2.5-72b-instruct": "qwen2.5-72b", "qwen/qwen2.5-72b": "qwen2.5-72b", "qwen/qwen3-32b": "qwen3-32b",
    "deepseek-ai/deepseek-v3": "deepseek-v3", "deepseek-ai/deepseek-r1": "deepseek-v3", "deepseek-r1": "deepseek-v3",
    "qwen/qwen3-235b-a22b": "qwen3-235b-a22b",
    "b200": "B200-180GB", "gb200": "GB200-NVL72", "h100-pcie": "H100-PCIe-80GB", "l40s": "L40S-48GB",
    "mi300x": "MI300X-192GB", "mi325x": "MI325X-256GB",
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
    """A catalog model by name, or a Hugging Face `config.json` (or a folder holding one).

    A catalog name (or alias, Hugging Face repo ids included) wins over a same-named folder of
    the current directory (`./llama3-8b/` must not change what a plain `kvsim run` means) unless
    the path is explicit: it starts with `./`, `../`, `/` or `~`, or names a .json file
    (`x/config.json`). Anything else with a slash that is no catalog name is a path."""
    path = Path(name_or_path).expanduser()
    explicit = name_or_path.startswith(("./", "../", "/", "~", f".{os.sep}", f"..{os.sep}")) or \
        name_or_path.endswith(".json") or name_or_path in (".", "..")
    if not explicit:
        try:
            return _lookup(name_or_path, MODELS, "model")
        except ConfigError:
            if not ("/" in name_or_path or os.sep in name_or_path or path.is_dir()):
                raise
    return model_from_hf_config(path)


# torch_dtype (or `dtype`, its newer name) -> bytes per weight and KV element. FP8 weights come
# from a `quantization_config` (`_quantization`); an fp8 torch_dtype itself is refused.
_HF_DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
}
_HF_INT_FIELDS = (
    ("hidden_size", "d_model", "n_embd"), ("num_attention_heads", "n_head"),
    ("num_hidden_layers", "n_layer"), ("intermediate_size", "ffn_dim", "n_inner"), ("vocab_size",),
)


def model_from_hf_config(path: Path) -> ModelSpec:
    """Read the transformer shape from a Hugging Face `config.json` (Llama, Mistral, OPT, Mixtral,
    Qwen-MoE...), with an FP8 `quantization_config` read as FP8 weights.

    Strict: a count that is not a whole number (`true`, `31.5`, `"32"`), an unknown dtype or a
    quantization other than fp8 is refused with the file and the field named, never coerced."""
    if path.is_dir():
        path = path / "config.json"
    try:
        from kvsim.simcore import userjson  # only a HF config file needs it
        from kvsim.simcore.userfiles import read_text

        cfg = userjson.loads(read_text(path, "model config", encoding="utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(f"model config {path}: no such file") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"model config {path}: not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model config {path}: expected a JSON object")
    quantization = _quantization(path, cfg)
    ints = {keys[0]: _hf_int(path, cfg, keys) for keys in _HF_INT_FIELDS}
    hidden, heads = ints["hidden_size"], ints["num_attention_heads"]
    kv_heads = _hf_int(path, cfg, ("num_key_value_heads",), default=heads)
    if heads % kv_heads:
        raise ConfigError(
            f"model config {path}: num_attention_heads ({heads}) must be a multiple of "
            f"num_key_value_heads ({kv_heads})"
        )
    mla = _mla_fields(path, cfg)
    if hidden % heads and "head_dim" not in cfg and not mla:
        raise ConfigError(
            f"model config {path}: hidden_size ({hidden}) is not a multiple of num_attention_heads "
            f"({heads}); give head_dim"
        )
    act = cfg.get("hidden_act", cfg.get("activation_function", "silu"))
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ConfigError(f"model config {path}: field 'tie_word_embeddings' must be true or false, got {tie!r}")
    name = cfg.get("_name_or_path") or (path.parent.name if path.name == "config.json" else path.stem) or "hf-model"
    return ModelSpec(
        name=str(name),
        num_layers=ints["num_hidden_layers"],
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=(mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] if mla
                  else _hf_int(path, cfg, ("head_dim",), default=hidden // heads)),
        intermediate_size=ints["intermediate_size"],
        vocab_size=ints["vocab_size"],
        dtype_bytes=_hf_dtype_bytes(path, cfg),
        max_position_embeddings=_hf_int(
            path, cfg, ("max_position_embeddings", "n_positions"), default=4096, minimum=2
        ),
        gated_mlp=act in ("silu", "swiglu", "gelu_pytorch_tanh") and "ffn_dim" not in cfg,
        tie_word_embeddings=tie,
        quantization=quantization,
        num_nextn_predict_layers=_mtp_layers(path, cfg),
        **_moe_fields(path, cfg),
        **mla,
    )


def _mtp_layers(path: Path, cfg: dict) -> int:
    """Multi-token-prediction modules the checkpoint carries, under the names vLLM reads for its
    "mtp" method (vllm/config/speculative.py, hf_config_override, at 002e77c1):
    `num_nextn_predict_layers` (DeepSeek-V3, GLM-4.5, MiMo, Qwen3-Next, ...) or
    `mtp_num_hidden_layers` (Qwen3.5); 0 when neither is given."""
    key = "num_nextn_predict_layers" if cfg.get("num_nextn_predict_layers") is not None else "mtp_num_hidden_layers"
    return _hf_int(path, cfg, (key,), default=0, minimum=0)


_HF_INT_MAX = 2**31 - 1  # every count is a tensor dimension or index; kernels index with int32


def _hf_int(path: Path, cfg: dict, keys: tuple[str, ...], default: int | None = None, minimum: int = 1) -> int:
    """The first of `keys` present, as a whole number >= minimum (JSON true / 31.5 / "32" refused)."""
    key = next((k for k in keys if k in cfg and cfg[k] is not None), None)
    if key is None:
        if default is None:
            raise ConfigError(f"model config {path}: missing field {keys[0]!r}")
        return default
    value = cfg[key]
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or not minimum <= value <= _HF_INT_MAX:
        raise ConfigError(
            f"model config {path}: field {key!r} must be a whole number from {minimum} to {_HF_INT_MAX:,}, got {value!r}"
        )
    return int(value)


def _hf_dtype_bytes(path: Path, cfg: dict) -> int:
    key = "torch_dtype" if "torch_dtype" in cfg else "dtype"
    value = cfg.get(key)
    if value is None:
        return 2  # no dtype: served as 16-bit, vLLM's dtype "auto" for an unlabelled checkpoint
    if not isinstance(value, str) or value.lower().removeprefix("torch.") not in _HF_DTYPE_BYTES:
        if isinstance(value, str) and "float8" in value.lower():
            raise ConfigError(
                f"model config {path}: {key} {value!r} is not a serving dtype; an FP8 checkpoint "
                "keeps torch_dtype bfloat16 and says quant_method fp8 in its quantization_config"
            )
        raise ConfigError(
            f"model config {path}: unknown {key} {value!r} "
            f"(known: {', '.join(sorted(_HF_DTYPE_BYTES))})"
        )
    return _HF_DTYPE_BYTES[value.lower().removeprefix("torch.")]


def _quantization(path: Path, cfg: dict) -> str | None:
    """An FP8 checkpoint (`quantization_config.quant_method: fp8`, as vLLM reads it) is served
    with FP8 linear layers; any other quantization is refused: sizing its weights from
    torch_dtype would be silently wrong."""
    quant = cfg.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
    if method == "fp8":
        return "fp8"
    raise ConfigError(
        f"model config {path}: quantization_config (quant_method {method!r}) is not supported; "
        "kvsim prices fp8 checkpoints only (or use the unquantized config)"
    )


def _moe_fields(path: Path, cfg: dict) -> dict:
    """Mixture-of-experts fields as ModelSpec keywords: Mixtral's `num_local_experts`, Qwen-MoE's
    `num_experts`, `num_experts_per_tok`, `moe_intermediate_size` (Mixtral: `intermediate_size`)
    and `shared_expert_intermediate_size`. Models mixing dense and MoE layers are refused."""
    key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k)), None)
    if key is None:
        given = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k) is not None), None)
        if given is not None and cfg.get("num_experts_per_tok"):  # 0 experts, yet 2 per token: not dense
            _hf_int(path, cfg, (given,))  # refused with the field named
        return {}
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("moe_layer_freq", 1) != 1:
        raise ConfigError(f"model config {path}: MoE models with dense MLP layers between MoE layers are not modelled")
    width = _hf_int(path, cfg, ("moe_intermediate_size", "intermediate_size"))
    shared = _hf_int(path, cfg, ("shared_expert_intermediate_size",), default=0, minimum=0)
    if not shared and cfg.get("n_shared_experts"):  # DeepSeek: n_shared_experts experts of the routed width
        shared = _hf_int(path, cfg, ("n_shared_experts",)) * width
    experts, per_token = _hf_int(path, cfg, (key,)), _hf_int(path, cfg, ("num_experts_per_tok",))
    if per_token > experts:
        raise ConfigError(f"model config {path}: num_experts_per_tok ({per_token}) is more than {key} ({experts})")
    fields = {
        "num_experts": experts,
        "num_experts_per_tok": per_token,
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": shared,
    }
    if cfg.get("first_k_dense_replace"):  # DeepSeek: the first k layers keep a dense MLP
        fields["first_k_dense_replace"] = _hf_int(path, cfg, ("first_k_dense_replace",))
    return fields


def _mla_fields(path: Path, cfg: dict) -> dict:
    """Multi-head latent attention (DeepSeek-V2/V3 config.json): a `kv_lora_rank` means the cache
    holds the compressed latent, not per-head K and V. q_lora_rank may be null (V2-Lite)."""
    if not cfg.get("kv_lora_rank"):
        return {}
    return {
        "kv_lora_rank": _hf_int(path, cfg, ("kv_lora_rank",)),
        "qk_rope_head_dim": _hf_int(path, cfg, ("qk_rope_head_dim",)),
        "qk_nope_head_dim": _hf_int(path, cfg, ("qk_nope_head_dim",)),
        "v_head_dim": _hf_int(path, cfg, ("v_head_dim",)),
        "q_lora_rank": _hf_int(path, cfg, ("q_lora_rank",), default=0, minimum=0),
    }
