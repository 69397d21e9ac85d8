"""Batching policies behind one protocol; `make_policy` picks one from an EngineConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simcore.block_pool import PagedAllocator
from simcore.contiguous import ContiguousAllocator
from simcore.errors import ConfigError
from simcore.memory import MemoryPlan
from simcore.policies.base import MemorySnapshot, Policy, StepPlan
from simcore.specs import EngineConfig, ModelSpec

if TYPE_CHECKING:
    from simcore.engine import Engine

__all__ = ["MemorySnapshot", "Policy", "StepPlan", "make_policy"]


def make_policy(
    config: EngineConfig, model: ModelSpec, memory: MemoryPlan, engine: Engine,
    rng: np.random.Generator,
) -> Policy:
    from simcore.policies.continuous import ContinuousPagedPolicy

    if config.policy == "continuous" and config.allocator == "paged":
        if config.reservation != "max":
            raise ConfigError(
                "--reservation applies only to contiguous reservations (--allocator contiguous)"
            )
        allocator = PagedAllocator(memory.num_gpu_blocks, config.block_size, memory.num_cpu_blocks)
        return ContinuousPagedPolicy(
            engine, allocator, config.max_num_seqs, config.resolved_max_num_batched_tokens(model),
            config.enable_chunked_prefill, config.preemption_mode, rng,
            enable_prefix_caching=config.enable_prefix_caching,
        )
    return _make_reserving_policy(config, model, memory, engine)


def _make_reserving_policy(
    config: EngineConfig, model: ModelSpec, memory: MemoryPlan, engine: Engine
) -> Policy:
    """Policies over contiguous reservations: static, dynamic, and Orca (continuous)."""
    from simcore.policies.dynamic import DynamicPolicy
    from simcore.policies.orca import OrcaPolicy
    from simcore.policies.static import StaticPolicy

    if config.preemption_mode != "recompute":
        raise ConfigError(
            f"--preemption-mode {config.preemption_mode}: contiguous reservations cover the "
            "whole request, so nothing is preempted; use --allocator paged"
        )
    allocator = ContiguousAllocator(memory.num_gpu_tokens)
    if config.policy == "continuous":
        return OrcaPolicy(
            engine, allocator, config.reservation, config.max_num_seqs,
            config.resolved_max_num_batched_tokens(model), config.enable_chunked_prefill,
        )
    # static and dynamic always reserve contiguously; `allocator` keeps its default there
    if config.reservation != "max":
        sizes = {"static": "max_model_len per slot", "dynamic": "prompt + max_tokens per request"}
        raise ConfigError(
            f"--reservation {config.reservation} applies only to --policy continuous "
            f"--allocator contiguous; {config.policy} batching reserves {sizes[config.policy]}"
        )
    if config.policy == "static":
        return StaticPolicy(engine, allocator, config.max_batch_size, config.batch_timeout_s)
    return DynamicPolicy(
        engine, allocator, config.max_num_seqs, config.resolved_max_num_batched_tokens(model)
    )
