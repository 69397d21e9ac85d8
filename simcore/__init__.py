"""kvsim's simulator library: specs, memory, allocators, policies, latency model, engine."""

from simcore.catalog import GPUS, MODELS, get_gpu, get_model
from simcore.errors import ConfigError, DoesNotFitError, KvsimError, ProfileError, WorkloadError
from simcore.latency import Profile, StepLatencyModel, load_profile, parse_profile
from simcore.memory import MemoryPlan, plan_memory
from simcore.request import Request
from simcore.simulate import Result, simulate
from simcore.specs import EngineConfig, GPUSpec, ModelSpec

__all__ = [
    "GPUS", "MODELS", "ConfigError", "DoesNotFitError", "EngineConfig", "GPUSpec", "KvsimError",
    "MemoryPlan", "ModelSpec", "Profile", "ProfileError", "Request", "Result", "StepLatencyModel",
    "WorkloadError", "get_gpu", "get_model", "load_profile", "parse_profile", "plan_memory",
    "simulate",
]
