"""kvsim's simulator library: specs, memory, allocators, policies, latency model, engine.

Names are imported on first use (PEP 562), so `import simcore.catalog` (every CLI command does)
does not pay for pandas and SimPy; `kvsim run` starts faster.
"""

from importlib import import_module

_WHERE = {
    "GPUS": "catalog", "MODELS": "catalog", "get_gpu": "catalog", "get_model": "catalog",
    "ConfigError": "errors", "DoesNotFitError": "errors", "KvsimError": "errors",
    "ProfileError": "errors", "WorkloadError": "errors",
    "Profile": "latency", "StepLatencyModel": "latency", "load_profile": "latency",
    "parse_profile": "latency",
    "MemoryPlan": "memory", "plan_memory": "memory",
    "Request": "request",
    "Result": "simulate", "simulate": "simulate",
    "EngineConfig": "specs", "GPUSpec": "specs", "ModelSpec": "specs",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'simcore' has no attribute {name!r}")
    value = getattr(import_module(f"kvsim.simcore.{module}"), name)
    globals()[name] = value
    return value
