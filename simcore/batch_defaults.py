"""vLLM's default step limits per engine version, GPU and usage context (what `--engine-version` fills in).

`max_num_seqs` and `max_num_batched_tokens` are what vLLM picks when the user gives neither:

* `vllm-v1` (vllm-project/vllm at 99d7eb5d, vllm/engine/arg_utils.py, `EngineArgs.get_batch_defaults`
  and `_set_default_max_num_seqs_and_batched_tokens_args`): a GPU with at least 70 GiB whose name
  does not contain "a100" (H100, H200, B200, MI300X; "setting large max_num_batched_tokens for A100
  reduces throughput", vLLM PR #17885) gets 8192 tokens for the OpenAI server and 16384 for the
  offline `LLM` class, and 1024 sequences for both; any other GPU gets 2048 / 8192 tokens and 256
  sequences. Then: without chunked prefill the budget is at least `max_model_len`; it is at most
  `max_num_seqs x max_model_len`; and `max_num_seqs` is at most the budget.
* `vllm-v0`, `vllm-0.6` (vLLM 0.5 / 0.6 `EngineArgs.max_num_seqs = 256` and `SchedulerConfig.__init__`):
  256 sequences on every GPU and context; the budget is `max(max_model_len, 2048)` without chunked
  prefill and 512 with it ("the best balance between ITL and TTFT on A100"), except that 0.6's
  multi-step scheduling (the `vllm-0.6` preset's `--num-scheduler-steps 10`) with chunked prefill
  keeps `max(max_model_len, 2048)` ("Multi-step Chunked-Prefill doesn't allow prompt-chunking").

The usage context is vLLM's `UsageContext`: `server` is OPENAI_API_SERVER (`vllm serve`, what a
served workload models), `offline` is LLM_CLASS (`LLM.generate`, `vllm bench throughput`).
"""

from __future__ import annotations

from dataclasses import replace

from kvsim.simcore.specs import EngineConfig, GPUSpec, ModelSpec

USAGE_CONTEXTS = ("server", "offline")
DEFAULT_USAGE_CONTEXT = "server"
LARGE_GPU_GIB = 70.0  # vLLM: device_memory >= 70 * GiB_bytes (and not an A100)
V1_TOKENS = {True: {"offline": 16384, "server": 8192}, False: {"offline": 8192, "server": 2048}}
V1_SEQS = {True: 1024, False: 256}
V0_SEQS = 256  # EngineArgs.max_num_seqs in vLLM 0.5 / 0.6
V0_CHUNKED_TOKENS = 512  # SchedulerConfig with chunked prefill, vLLM 0.5 / 0.6
V0_MIN_TOKENS = 2048  # SchedulerConfig without it: max(max_model_len, 2048)
FIELDS = ("max_num_seqs", "max_num_batched_tokens")


def large_gpu(gpu: GPUSpec) -> bool:
    """vLLM V1's test for its larger defaults: >= 70 GiB of device memory and not an A100."""
    return gpu.memory_gib >= LARGE_GPU_GIB and "a100" not in gpu.name.lower()


def batch_defaults(engine_version: str, gpu: GPUSpec, max_model_len: int, chunked: bool,
                   usage_context: str = DEFAULT_USAGE_CONTEXT, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM of this version picks on this GPU; either one
    the user gave is kept, and the other derived from it as vLLM derives it."""
    if usage_context not in USAGE_CONTEXTS:
        raise ValueError(f"unknown usage context {usage_context!r}; known: {', '.join(USAGE_CONTEXTS)}")
    if engine_version == "vllm-v1":
        big = large_gpu(gpu)
        seqs = V1_SEQS[big] if max_num_seqs is None else max_num_seqs
        tokens = max_num_batched_tokens
        if tokens is None:
            tokens = V1_TOKENS[big][usage_context]
            if not chunked:
                tokens = max(max_model_len, tokens)
            tokens = min(seqs * max_model_len, tokens)
        if max_num_seqs is None:
            seqs = min(seqs, tokens)
        return seqs, tokens
    if engine_version in ("vllm-v0", "vllm-0.6"):
        multi_step = engine_version == "vllm-0.6"
        tokens = max_num_batched_tokens
        if tokens is None:
            tokens = V0_CHUNKED_TOKENS if chunked and not multi_step else max(max_model_len, V0_MIN_TOKENS)
        return V0_SEQS if max_num_seqs is None else max_num_seqs, tokens
    raise ValueError(f"unknown engine version {engine_version!r}")


def apply_batch_defaults(config: EngineConfig, gpu: GPUSpec, model: ModelSpec, fill: frozenset[str] | set[str],
                         usage_context: str = DEFAULT_USAGE_CONTEXT) -> EngineConfig:
    """`config` with the fields named in `fill` (those the user left unset) set to the engine
    version's defaults on this GPU; the others as given."""
    fill = set(fill) & set(FIELDS)
    if not fill:
        return config
    seqs, tokens = batch_defaults(
        config.engine_version, gpu, config.resolved_max_model_len(model), config.enable_chunked_prefill,
        usage_context, None if "max_num_seqs" in fill else config.max_num_seqs,
        None if "max_num_batched_tokens" in fill else config.max_num_batched_tokens)
    values = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}
    return replace(config, **{k: values[k] for k in sorted(fill)})
