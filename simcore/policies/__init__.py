"""Batching policies behind one protocol (`base.Policy`), each registered once (`registry`).

Importing this package registers the built-in policies; `make_policy` builds the one a
resolved configuration names. Registering imports no policy, allocator, numpy or SimPy (the
CLI's choice lists and `kvsim run --help` read the table); a policy's modules are imported
when it is built, and the re-exported classes on first use (PEP 562).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from kvsim.simcore.policies.registry import PolicySpec, lookup, policy_names, register, variants

if TYPE_CHECKING:
    import numpy as np

    from kvsim.simcore.block_pool import PagedAllocator
    from kvsim.simcore.config import ResolvedConfig
    from kvsim.simcore.contiguous import ContiguousAllocator
    from kvsim.simcore.policies.base import Policy, Queues
    from kvsim.simcore.step import MemorySnapshot, StepPlan

_LAZY = {
    "Policy": "kvsim.simcore.policies.base", "Queues": "kvsim.simcore.policies.base",
    "MemorySnapshot": "kvsim.simcore.step", "StepPlan": "kvsim.simcore.step",
}

__all__ = [
    "MemorySnapshot", "Policy", "PolicySpec", "Queues", "StepPlan", "lookup", "make_policy",
    "policy_names", "register", "variants",
]


def __getattr__(name: str):
    """The re-exported classes, imported on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvsim.simcore.policies' has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(module), name)
    return value


def make_policy(cfg: ResolvedConfig, rng: np.random.Generator) -> Policy:
    """A fresh policy (with its own allocator) for one replica."""
    return cfg.policy.build(cfg, rng)


def paged_allocator(cfg: ResolvedConfig) -> PagedAllocator:
    from kvsim.simcore.block_pool import PagedAllocator

    return PagedAllocator(cfg.memory.num_gpu_blocks, cfg.engine.block_size, cfg.memory.num_cpu_blocks)


def contiguous_allocator(cfg: ResolvedConfig) -> ContiguousAllocator:
    from kvsim.simcore.contiguous import ContiguousAllocator

    return ContiguousAllocator(cfg.memory.num_gpu_tokens)


def _continuous(cfg: ResolvedConfig, rng: np.random.Generator) -> Policy:
    """vLLM's unified token-budget scheduler, or V0's prefill-first one without chunked prefill."""
    from kvsim.simcore.batch_defaults import num_scheduler_steps
    from kvsim.simcore.policies.continuous import ContinuousPagedPolicy
    from kvsim.simcore.policies.continuous_v0 import VllmV0PagedPolicy

    e = cfg.engine
    if e.speculative_config is not None:  # V1's scheduler with draft tokens (config.resolve checked chunking)
        from kvsim.simcore.policies.speculative import SpeculativePagedPolicy

        policy = SpeculativePagedPolicy(
            paged_allocator(cfg), e.max_num_seqs, cfg.max_num_batched_tokens, e.preemption_mode,
            e.speculative_config, rng, enable_prefix_caching=e.enable_prefix_caching,
        )
    else:
        args = (paged_allocator(cfg), e.max_num_seqs, cfg.max_num_batched_tokens, e.enable_chunked_prefill,
                e.preemption_mode, rng)
        if e.enable_chunked_prefill:
            policy = ContinuousPagedPolicy(*args, enable_prefix_caching=e.enable_prefix_caching)
        else:  # (multi-step scheduling: vLLM 0.6's decode rounds, simcore.batch_defaults)
            policy = VllmV0PagedPolicy(*args, enable_prefix_caching=e.enable_prefix_caching,
                                       num_scheduler_steps=num_scheduler_steps(e.engine_version, False),
                                       max_model_len=cfg.max_model_len)
    if cfg.memory.num_offload_blocks:  # the CPU KV tier (simcore.kv_tier); V1 only (config refuses V0)
        from kvsim.simcore.kv_tier import HostKVTier

        policy.host_tier = HostKVTier(cfg.memory.num_offload_blocks)
        policy.load_block_s = cfg.swap_block_s  # one block over each GPU's host link, in parallel
    return policy


def _orca(cfg: ResolvedConfig, rng: np.random.Generator) -> Policy:
    from kvsim.simcore.policies.orca import OrcaPolicy

    e = cfg.engine
    return OrcaPolicy(
        contiguous_allocator(cfg), e.reservation, cfg.max_model_len, e.max_num_seqs,
        cfg.max_num_batched_tokens, e.enable_chunked_prefill,
    )


def _dynamic(cfg: ResolvedConfig, rng: np.random.Generator) -> Policy:
    from kvsim.simcore.policies.dynamic import DynamicPolicy

    return DynamicPolicy(
        contiguous_allocator(cfg), cfg.max_model_len, cfg.engine.max_num_seqs, cfg.max_num_batched_tokens,
    )


def _static(cfg: ResolvedConfig, rng: np.random.Generator) -> Policy:
    from kvsim.simcore.policies.static import StaticPolicy

    e = cfg.engine
    return StaticPolicy(contiguous_allocator(cfg), cfg.max_model_len, e.max_batch_size, e.batch_timeout_s)


_CONTINUOUS = {"allocator", "enable_chunked_prefill", "engine_version"}  # steps priced as a vLLM version
# Every EngineConfig field the compiled core (simcore/csrc/engine.c through simcore.fastcore) honours
# for vLLM's continuous batching over the paged allocator, each checked against the Python engine by
# tests/test_fastcore_equivalence.py. Fields that only shape the memory plan or the step prices
# (resolved before either core runs: gpu_memory_utilization, kv_cache_dtype, quantization,
# tensor_parallel_size, enable_expert_parallel) are honoured by both. Listing a field is a claim backed by an equivalence test.
C_CORE_CONTINUOUS_PAGED = frozenset({
    "policy", "allocator", "block_size", "gpu_memory_utilization", "num_gpu_blocks_override",
    "kv_cache_dtype", "quantization", "tensor_parallel_size", "enable_expert_parallel", "max_num_seqs",
    "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill", "enable_prefix_caching",
    "preemption_mode", "swap_space", "data_parallel_size", "router",
    "kv_offloading_size",  # the CPU KV tier (simcore/csrc/sessions.c; tests/test_sessions.py)
    "speculative_config",  # eagle / eagle3 / mtp / ngram / draft_model: csrc/spec.c (tests/test_fastcore_speculative.py)
    "engine_version",  # only selects the profile's host terms, which the core reads from the pricing blob
    "pipeline_parallel_size",  # csrc/pipeline.c's rounds (tests/test_fastcore_pipeline.py)
})
# The reservation policies in the compiled core (simcore/csrc/batching.c), each checked against the
# Python engine by tests/test_fastcore_batching.py: the memory plan's fields, one replica or several
# behind round-robin / least-loaded, and the options each policy reads (a policy ignores the
# common options it does not read, e.g. static batching's max_num_seqs, in both cores alike).
_C_CORE_RESERVED = frozenset({
    "policy", "allocator", "block_size", "gpu_memory_utilization", "num_gpu_blocks_override", "kv_cache_dtype",
    "quantization", "tensor_parallel_size", "enable_expert_parallel", "max_model_len", "data_parallel_size",
    "router", "max_num_seqs", "max_num_batched_tokens", "pipeline_parallel_size",
})
register(PolicySpec(
    "static", "contiguous", "FasterTransformer / HF generate: fixed batches, padded, max_model_len slots",
    _static, frozenset({"max_batch_size", "batch_timeout_s"}), overhead="static",
    cores=(("c", _C_CORE_RESERVED | {"max_batch_size", "batch_timeout_s"}),),
))
register(PolicySpec(
    "dynamic", "contiguous", "early TGI: prefill-only join steps, prompt + max_tokens reservations",
    _dynamic, overhead="dynamic", cores=(("c", _C_CORE_RESERVED),),
))
register(PolicySpec(
    "continuous", "paged", "vLLM: iteration-level scheduling over a paged KV cache",
    _continuous,
    frozenset(_CONTINUOUS | {"preemption_mode", "swap_space", "enable_prefix_caching", "speculative_config",
                             "kv_offloading_size"}),
    cores=(("c", C_CORE_CONTINUOUS_PAGED),),
))
register(PolicySpec(
    "continuous", "contiguous", "Orca: iteration-level scheduling over contiguous reservations",
    _orca, frozenset(_CONTINUOUS | {"reservation"}),
    cores=(("c", _C_CORE_RESERVED | {"enable_chunked_prefill", "reservation", "engine_version"}),),
))
