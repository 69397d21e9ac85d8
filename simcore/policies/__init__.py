"""Batching policies behind one protocol; `make_policy` picks one from an EngineConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simcore.block_pool import PagedAllocator
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
        allocator = PagedAllocator(memory.num_gpu_blocks, config.block_size, memory.num_cpu_blocks)
        return ContinuousPagedPolicy(
            engine, allocator, config.max_num_seqs, config.resolved_max_num_batched_tokens(model),
            config.enable_chunked_prefill, config.preemption_mode, rng,
        )
    raise ConfigError(
        f"--policy {config.policy} with --allocator {config.allocator} is not available yet"
    )
