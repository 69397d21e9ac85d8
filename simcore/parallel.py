"""How one replica is laid out over GPUs and nodes, and what that layout allows.

    replica = pipeline_parallel_size stages x tensor_parallel_size GPUs
    stage s holds layers [start_s, start_s + n_s) on GPUs [s*tp, (s+1)*tp); a node holds
    gpus_per_node consecutive GPUs, so a stage boundary is inside a node or across nodes.

TP stays inside one node's NVLink domain (vLLM's recommended layout: TP within a node, PP
across nodes); a TP degree larger than a node is refused with the PP layout that fits.
"""

from __future__ import annotations

from kvsim.simcore.errors import ConfigError
from kvsim.simcore.specs import EngineConfig, GPUSpec, ModelSpec


def layer_partition(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, as vLLM's `get_pp_indices` splits them
    (vllm/distributed/utils.py): an even share each, and the remainder one layer each to the
    stages before the last (which also holds the final norm and LM head)."""
    if pp > num_layers:
        raise ConfigError(f"--pp {pp} exceeds the model's {num_layers} layers")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_crosses_node(stage: int, tp: int, gpus_per_node: int) -> bool:
    """Whether the hand-off from `stage` to `stage + 1` leaves the node (placement above)."""
    return (stage * tp) // gpus_per_node != ((stage + 1) * tp) // gpus_per_node


def check_deployment(model: ModelSpec, gpu: GPUSpec, config: EngineConfig) -> None:
    """Refuse layouts and formats the hardware cannot run, each with what would work."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if model.num_attention_heads % tp:
        raise ConfigError(
            f"--tp {tp} must divide {model.name}'s {model.num_attention_heads} attention heads"
        )
    if tp > gpu.gpus_per_node:
        nodes = tp // gpu.gpus_per_node
        raise ConfigError(
            f"--tp {tp} exceeds the {gpu.gpus_per_node} GPUs of one {gpu.name} node (tensor "
            f"parallelism needs NVLink); use --tp {gpu.gpus_per_node} --pp {nodes * pp} to span "
            f"{nodes * pp} nodes with pipeline parallelism"
        )
    if model.quantization == "fp8" and gpu.fp8_tflops is None:
        raise ConfigError(
            f"{gpu.name} has no FP8 tensor cores (FP8 GEMMs need Ada/Hopper), so kvsim cannot "
            "price --quantization fp8 there (vLLM's weight-only FP8 Marlin fallback is not "
            "modelled); use an H100 or H200, or serve the model unquantized"
        )
    if config.enable_expert_parallel:
        ep = config.expert_parallel_size
        if not model.is_moe:
            raise ConfigError(f"--enable-expert-parallel needs a mixture-of-experts model; {model.name} is dense")
        if model.num_experts % ep:
            raise ConfigError(f"--enable-expert-parallel: {model.name}'s {model.num_experts} experts do not divide "
                              f"over tp x dp = {ep} GPUs")
        if pp > 1:
            raise ConfigError("--enable-expert-parallel with --pp is not modelled (vLLM runs EP with TP and DP)")
    layer_partition(model.num_layers, pp)


__all__ = ["check_deployment", "layer_partition", "stage_crosses_node"]
