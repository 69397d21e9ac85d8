"""Which profile a run uses: the committed file for (GPU, model, dtypes, TP), else a roofline.

Files are `<gpu>-<model>[-fp8][-kvfp8]-tp<N>.json`: `-fp8` for FP8 weights (`--quantization
fp8`), `-kvfp8` for an FP8 KV cache (its decode attention reads half the bytes). A profile
without `weight_dtype` / `kv_cache_dtype` fields is one of the model's own dtype.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvsim.simcore.errors import ProfileError
from kvsim.simcore.latency import Profile, load_profile, parse_profile
from kvsim.simcore.specs import GPUSpec, ModelSpec

PROFILE_DIR = Path(__file__).resolve().parent
SHAPE_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
    "intermediate_size", "vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "q_lora_rank", "first_k_dense_replace",
)


def dtype_tag(weight_dtype: str = "bfloat16", kv_dtype: str = "bfloat16") -> str:
    return ("-fp8" if weight_dtype == "fp8" else "") + ("-kvfp8" if kv_dtype == "fp8" else "")


def profile_filename(gpu_name: str, model_name: str, tp: int, tag: str = "") -> str:
    return f"{gpu_name}-{model_name}{tag}-tp{tp}.json"


def profile_dtypes(profile: Profile) -> tuple[str, str]:
    """(weight dtype, KV cache dtype) a profile was made for."""
    d = profile.data
    base = "float32" if d.get("dtype") in ("float32", "fp32") else "bfloat16"
    return d.get("weight_dtype", base), d.get("kv_cache_dtype", base)


def _fp8(weight_dtype: str, kv_dtype: str) -> tuple[bool, bool]:
    """What a profile must agree on: FP8 or not (a CPU profile's fp32 stands in for bf16)."""
    return weight_dtype == "fp8", kv_dtype == "fp8"


def find_profile_path(
    gpu_name: str, model_name: str, tp: int, directory: Path = PROFILE_DIR, tag: str = ""
) -> Path | None:
    """The committed `profiles/<gpu>-<model><tag>-tp<N>.json` (matched case-insensitively; the
    first in name order if several match). Names are compared as strings (a Path per file, as
    a glob makes, cost more than the rest of the lookup)."""
    return find_committed(profile_filename(gpu_name, model_name, tp, tag), directory)


def resolve_profile_path(value: str | Path) -> Path:
    """What `--profile VALUE` names: a file path as given when it exists, else a committed
    profile by the bare name `kvsim list profiles` prints (with or without `.json`, any case), so
    `--profile H100-SXM-80GB-llama3-70b-tp8` works from any folder once kvsim is installed. A path
    with a folder in it is only ever a file; an existing file of the bare name wins over the
    committed one (the user's own file, as the shell would read it)."""
    path = Path(value).expanduser()
    if path.exists() or len(path.parts) != 1 or str(value) in (".", ".."):
        return path
    name = path.name if path.name.lower().endswith(".json") else f"{path.name}.json"
    found = find_committed(name)
    if found is None:
        raise ProfileError(f"{value}: no such profile (neither a file nor a committed profile name; "
                           "`kvsim list profiles` lists the names)")
    return found


def find_committed(name: str, directory: Path = PROFILE_DIR) -> Path | None:
    """The committed profile file called `name` (case-insensitive), or None."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    found = sorted(n for n in names if n.lower() == name.lower() and n.endswith(".json"))
    return Path(directory) / found[0] if found else None


def load_named_profile(value: str | Path) -> Profile:
    """`--profile VALUE` loaded: a file, or a committed profile's bare name (resolve_profile_path)."""
    return load_profile(resolve_profile_path(value))


def shape_mismatches(profile: Profile, model: ModelSpec) -> list[str]:
    shape = profile.data.get("model_shape", {})
    return [
        f"{name} {shape.get(name)!r} != {getattr(model, name)!r}"
        for name in SHAPE_FIELDS
        if name in shape and shape[name] != getattr(model, name)
    ]


def check_profile_matches(profile: Profile, model: ModelSpec, tp: int, gpu: GPUSpec | None = None,
                          ep: int | None = None) -> None:
    """Raise ProfileError when a profile was made for another GPU, model shape or TP degree.
    A CPU profile (`gpu: cpu`, the harness on this machine) is accepted with any --gpu: it exists
    to exercise the measured path and its label says CPU."""
    where = profile.path or profile.label
    if gpu is not None:
        pgpu = str(profile.data.get("gpu", ""))
        if pgpu.lower() not in (gpu.name.lower(), "cpu"):
            raise ProfileError(f"{where}: profile is for GPU {pgpu!r}, but the run uses --gpu {gpu.name}")
    diffs = shape_mismatches(profile, model)
    if ep is not None and int(profile.data.get("expert_parallel_size", 1)) != ep:
        raise ProfileError(f"{where}: profile is for expert-parallel size {profile.data.get('expert_parallel_size', 1)}, "
                           f"but the run uses {ep} (tp x dp with --enable-expert-parallel, else 1)")
    if diffs:
        raise ProfileError(f"{where}: profile model shape differs from {model.name}: {'; '.join(diffs)}")
    ptp = profile.data.get("tensor_parallel_size")
    if ptp != tp:
        raise ProfileError(f"{where}: profile is for --tp {ptp}, but the run uses --tp {tp}")
    weight, kv = profile_dtypes(profile)
    if _fp8(weight, kv) != _fp8(model.weight_dtype, model.kv_dtype):
        raise ProfileError(
            f"{where}: profile is for {weight} weights and a {kv} KV cache, but the run uses "
            f"{model.weight_dtype} weights and a {model.kv_dtype} KV cache"
        )


def draft_profile(gpu: GPUSpec, config, like: Profile | None = None) -> Profile | None:
    """The draft model's profile for a run whose speculative config is a draft_model (None for any
    other run): its committed or roofline profile at the draft's TP, on the target's GPU, as
    `kvsim run` prices it; with its step times scaled as the target's profile `like` was
    (profiles.uncertainty.scaled_profile: a plan at a confidence, its SLO probability's re-runs).
    `config`: an EngineConfig or a ResolvedConfig."""
    engine = getattr(config, "engine", config)
    spec = engine.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    draft = default_profile(gpu, spec.draft_model_spec(), spec.draft_tp(engine.tensor_parallel_size))
    factor = getattr(like, "step_time_factor", 1.0)
    if factor != 1.0:
        from kvsim.profiles.uncertainty import scaled_profile

        draft = scaled_profile(draft, factor)
    return draft


def default_profile(gpu: GPUSpec, model: ModelSpec, tp: int, ep: int = 1) -> Profile:
    """The committed profile for this GPU, model, dtypes and TP when it exists and matches,
    else a roofline profile built in memory (its label says `roofline`). Expert parallelism
    (`ep` > 1) always gets a roofline: no committed file is expert-parallel."""
    path = find_profile_path(gpu.name, model.name, tp, tag=dtype_tag(model.weight_dtype, model.kv_dtype))
    if path is not None and ep <= 1:
        profile = load_profile(path)
        if (not shape_mismatches(profile, model) and profile.data.get("tensor_parallel_size") == tp
                and _fp8(*profile_dtypes(profile)) == _fp8(model.weight_dtype, model.kv_dtype)):
            return profile
    from kvsim.profiles.roofline import build_roofline_profile

    tag = dtype_tag(model.weight_dtype, model.kv_dtype) + (f" ep{ep}" if ep > 1 else "")
    return parse_profile(build_roofline_profile(gpu, model, tp, ep=ep), f"roofline {gpu.name} {model.name}{tag} tp{tp}")
