"""Whether a profile was made for the run it prices: the GPU, the model's shape, the TP degree, the
expert-parallel size and FP8 or not. `kvsim run --profile` checks all of it (profiles.lookup
re-exports these); `simulate()` checks the TP degree (a profile's tables are per GPU of its TP
group: another TP prices the wrong GEMM shards and collectives)."""

from __future__ import annotations

from kvsim.simcore.errors import ConfigError, ProfileError
from kvsim.simcore.latency import Profile
from kvsim.simcore.specs import GPUSpec, ModelSpec

SHAPE_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
    "intermediate_size", "vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "q_lora_rank", "first_k_dense_replace",
)


class ProfileMismatchError(ProfileError, ConfigError):
    """A profile made for another GPU, model shape, TP degree or dtype than the run's: a profile
    problem to the CLI, a configuration one to the Python API's callers (both catch it)."""


def profile_dtypes(profile: Profile) -> tuple[str, str]:
    """(weight dtype, KV cache dtype) a profile was made for."""
    d = profile.data
    base = "float32" if d.get("dtype") in ("float32", "fp32") else "bfloat16"
    return d.get("weight_dtype", base), d.get("kv_cache_dtype", base)


def fp8_flags(weight_dtype: str, kv_dtype: str) -> tuple[bool, bool]:
    """What a profile must agree on: FP8 or not (a CPU profile's fp32 stands in for bf16)."""
    return weight_dtype == "fp8", kv_dtype == "fp8"


def shape_mismatches(profile: Profile, model: ModelSpec) -> list[str]:
    shape = profile.data.get("model_shape", {})
    return [
        f"{name} {shape.get(name)!r} != {getattr(model, name)!r}"
        for name in SHAPE_FIELDS
        if name in shape and shape[name] != getattr(model, name)
    ]


def check_profile_tp(profile: Profile, tp: int) -> None:
    """ProfileMismatchError when the profile was made at another TP degree than `tp`."""
    ptp = profile.data.get("tensor_parallel_size")
    if ptp != tp:
        where = profile.path or profile.label
        raise ProfileMismatchError(f"{where}: profile is for --tp {ptp}, but the run uses --tp {tp}")


def check_profile_matches(profile: Profile, model: ModelSpec, tp: int, gpu: GPUSpec | None = None,
                          ep: int | None = None) -> None:
    """Raise ProfileMismatchError when a profile was made for another GPU, model shape or TP degree.
    A CPU profile (`gpu: cpu`, the harness on this machine) is accepted with any --gpu: it exists
    to exercise the measured path and its label says CPU."""
    where = profile.path or profile.label
    if gpu is not None:
        pgpu = str(profile.data.get("gpu", ""))
        if pgpu.lower() not in (gpu.name.lower(), "cpu"):
            raise ProfileMismatchError(f"{where}: profile is for GPU {pgpu!r}, but the run uses --gpu {gpu.name}")
    diffs = shape_mismatches(profile, model)
    if ep is not None and int(profile.data.get("expert_parallel_size", 1)) != ep:
        raise ProfileMismatchError(
            f"{where}: profile is for expert-parallel size {profile.data.get('expert_parallel_size', 1)}, "
            f"but the run uses {ep} (tp x dp with --enable-expert-parallel, else 1)")
    if diffs:
        raise ProfileMismatchError(f"{where}: profile model shape differs from {model.name}: {'; '.join(diffs)}")
    check_profile_tp(profile, tp)
    weight, kv = profile_dtypes(profile)
    if fp8_flags(weight, kv) != fp8_flags(model.weight_dtype, model.kv_dtype):
        raise ProfileMismatchError(
            f"{where}: profile is for {weight} weights and a {kv} KV cache, but the run uses "
            f"{model.weight_dtype} weights and a {model.kv_dtype} KV cache"
        )
