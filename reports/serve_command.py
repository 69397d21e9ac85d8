"""The `vllm serve` command line of a deployment kvsim simulated, so a plan's answer can be run.

Every engine option that decides the result is written out, defaults included where vLLM's own
default differs by GPU or version (`--max-num-seqs`, `--max-num-batched-tokens`: recent vLLM picks
them per GPU in `EngineArgs.get_batch_defaults`, kvsim used the values shown). Flag names are
`vllm serve`'s (vllm/engine/arg_utils.py). Replicas are separate servers behind a load balancer (kvsim
modelled a least-loaded router in front of them).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from kvsim.simcore.batch_defaults import NUM_SCHEDULER_STEPS

V0_ERA = ("vllm-v0", "vllm-0.6")  # engine versions whose `vllm serve` has no `--no-enable-...` flags

# catalog name -> the Hugging Face checkpoint its shape comes from (simcore/catalog.py cites each)
HF_IDS = {
    "llama3-8b": "meta-llama/Meta-Llama-3-8B", "llama3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama2-7b": "meta-llama/Llama-2-7b-hf", "llama2-70b": "meta-llama/Llama-2-70b-hf",
    "mistral-7b": "mistralai/Mistral-7B-v0.1", "opt-13b": "facebook/opt-13b",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "llama3.1-8b": "meta-llama/Llama-3.1-8B", "llama3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama3.1-405b": "meta-llama/Llama-3.1-405B", "llama3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct", "qwen3-32b": "Qwen/Qwen3-32B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3", "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
}


def vllm_serve_command(model: Any, gpu: Any, config: Any) -> str:
    """`vllm serve MODEL --flag value ...` for one replica of `config` (an EngineConfig) serving
    `model` (a ModelSpec) on `gpu`; max_model_len and the step token budget as kvsim resolved them."""
    from kvsim.simcore.config import resolve

    resolved = resolve(config.resolve_model(model), gpu, config)
    e = resolved.engine
    args = ["vllm", "serve", HF_IDS.get(model.name, model.name),
            "--tensor-parallel-size", str(e.tensor_parallel_size)]
    if e.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(e.pipeline_parallel_size)]
    args += ["--block-size", str(e.block_size), "--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}",
             "--max-num-seqs", str(e.max_num_seqs), "--max-num-batched-tokens", str(resolved.max_num_batched_tokens),
             "--max-model-len", str(resolved.max_model_len)]
    if e.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", e.kv_cache_dtype]
    if e.quantization:
        args += ["--quantization", e.quantization]
    if e.engine_version in V0_ERA:
        # vLLM 0.5 / 0.6 spell them differently: `--enable-chunked-prefill [True|False]` (its default
        # depends on max_model_len) and a store_true `--enable-prefix-caching` (off by default), no
        # `--no-` forms (vllm/engine/arg_utils.py at v0.6.0, 32e7db25)
        args.append("--enable-chunked-prefill" if e.enable_chunked_prefill else "--enable-chunked-prefill=False")
        if e.enable_prefix_caching:
            args.append("--enable-prefix-caching")
    else:
        if not e.enable_chunked_prefill:
            args.append("--no-enable-chunked-prefill")
        if not e.enable_prefix_caching:
            args.append("--no-enable-prefix-caching")
    steps = NUM_SCHEDULER_STEPS.get(e.engine_version)
    if steps:  # vllm-0.6 was priced (and, without chunked prefill, scheduled) as multi-step: vLLM's default is 1
        args += ["--num-scheduler-steps", str(steps)]
    if getattr(e, "enable_expert_parallel", False):
        args.append("--enable-expert-parallel")
    spec = getattr(e, "speculative_config", None)
    if spec is not None:  # the keys vLLM reads; kvsim's acceptance rates describe the traffic, not the server
        keys = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
        for name in ("model", "draft_tensor_parallel_size"):
            if getattr(spec, name, None) is not None:
                keys[name] = HF_IDS.get(getattr(spec, name), getattr(spec, name)) if name == "model" else getattr(spec, name)
        args += ["--speculative-config", json.dumps(keys, separators=(",", ":"))]
    if e.preemption_mode == "swap":
        args += ["--swap-space", f"{e.swap_space:g}"]
    return shlex.join(args)
