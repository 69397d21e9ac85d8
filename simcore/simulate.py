"""The one entry point a notebook or the CLI calls: `simulate(...) -> Result`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy

from simcore.engine import Engine
from simcore.errors import ConfigError
from simcore.latency import Profile, StepLatencyModel
from simcore.memory import MemoryPlan, plan_memory
from simcore.metrics import requests_frame, summarize
from simcore.policies import make_policy
from simcore.request import Workload
from simcore.specs import EngineConfig, GPUSpec, ModelSpec

KVSIM_VERSION = "0.1.0"


@dataclass
class Result:
    """Everything one run produced; `record` says how to reproduce it."""

    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    itl_s: np.ndarray
    memory: MemoryPlan
    record: dict[str, Any]  # seed, config, model, gpu, workload, profile hash
    wall_s: float = 0.0  # simulator wall time (not part of the deterministic result)
    warnings: list[str] = field(default_factory=list)


@dataclass
class Simulation:
    """A wired-up run before it starts: the engine, its policy and allocator can be inspected
    (tests do) before `run()` and after it."""

    env: simpy.Environment
    engine: Engine
    memory: MemoryPlan
    latency: StepLatencyModel
    record: dict[str, Any]
    workload: Workload
    warnings: list[str] = field(default_factory=list)
    started: float = 0.0

    def run(self) -> Result:
        """Run to the last request and collect the tables; raises if any request stalled."""
        engine, latency = self.engine, self.latency
        self.env.run()
        stalled = sum(1 for st in engine.states if not st.done.triggered)
        if stalled:  # a scheduling bug, never a user error: fail loudly rather than under-report
            raise RuntimeError(f"simulation stalled with {stalled} requests unfinished")
        requests = requests_frame(engine.states)
        steps = engine.recorder.frame()
        itl_s = np.frombuffer(engine.itl_s, dtype=np.float64).copy()
        summary = summarize(requests, steps, itl_s)
        summary["extrapolated_steps"] = latency.extrapolated.steps
        queried = getattr(engine.policy, "prefix_query_tokens", 0)
        if queried:  # vLLM's "prefix cache hit rate", over prompts that share a prefix
            summary["prefix_cache_hit_rate"] = engine.policy.prefix_hit_tokens / queried
        warnings = list(self.warnings)
        if latency.extrapolated.steps:
            warnings.append(
                f"{latency.extrapolated.steps} of {len(steps)} steps needed values outside the "
                f"profiled grid ({', '.join(sorted(latency.extrapolated.tables))})"
            )
        record = {**self.record, "workload": self.workload.describe()}
        return Result(summary, requests, steps, itl_s, self.memory, record,
                      time.perf_counter() - self.started, warnings)


def prepare(
    model: ModelSpec,
    gpu: GPUSpec,
    config: EngineConfig,
    workload: Workload,
    profile: Profile,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Simulation:
    """Validate the inputs and wire the engine, policy and workload; nothing runs yet."""
    started = time.perf_counter()
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"--seed must be an integer >= 0, got {seed!r}")
    memory = plan_memory(model, gpu, config)
    max_model_len = memory.max_model_len
    if not config.enable_chunked_prefill and config.resolved_max_num_batched_tokens(model) < max_model_len:
        raise ConfigError(
            f"--max-num-batched-tokens ({config.max_num_batched_tokens}) is smaller than "
            f"max_model_len ({max_model_len}) with chunked prefill off; enable chunked prefill "
            "or raise it"
        )
    latency = StepLatencyModel(profile.data, profile.path or "profile", policy=config.policy)
    warnings = []
    if not latency.set_block_size(config.block_size):
        warnings.append(
            f"profile has no decode table for block size {config.block_size}; using "
            f"{latency.decode_block_size}"
        )
    workload_seed, engine_seed = np.random.SeedSequence(seed).spawn(2)
    env = simpy.Environment()
    block_bytes = memory.kv_bytes_per_token * config.block_size
    engine = Engine(env, latency, max_model_len, block_bytes / (gpu.pcie_gbps * 1e9), progress)
    engine.attach(make_policy(config, model, memory, engine, np.random.default_rng(engine_seed)))
    env.process(workload.process(env, engine, workload_seed))
    env.process(engine.run())
    record = {
        "kvsim_version": KVSIM_VERSION,
        "seed": seed,
        "model": model.to_dict(),
        "gpu": {"name": gpu.name, "memory_gib": gpu.memory_gib},
        "config": config.to_dict(),
        "profile": {
            "path": profile.path, "sha256": profile.sha256, "source": profile.source,
            "label": profile.label,
        },
        "memory": memory.to_dict(),
    }
    return Simulation(env, engine, memory, latency, record, workload, warnings, started)


def simulate(
    model: ModelSpec,
    gpu: GPUSpec,
    config: EngineConfig,
    workload: Workload,
    profile: Profile,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Result:
    """Simulate one engine replica serving `workload`; deterministic for a given seed."""
    return prepare(model, gpu, config, workload, profile, seed, progress).run()
