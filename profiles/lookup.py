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
from kvsim.simcore.profile_match import (  # moved down so simulate() checks a profile's TP as the CLI does
    SHAPE_FIELDS,
    check_profile_matches,
    profile_dtypes,
    shape_mismatches,
)
from kvsim.simcore.profile_match import fp8_flags as _fp8
from kvsim.simcore.specs import GPUSpec, ModelSpec

PROFILE_DIR = Path(__file__).resolve().parent


def dtype_tag(weight_dtype: str = "bfloat16", kv_dtype: str = "bfloat16") -> str:
    return ("-fp8" if weight_dtype == "fp8" else "") + ("-kvfp8" if kv_dtype == "fp8" else "")


def profile_filename(gpu_name: str, model_name: str, tp: int, tag: str = "") -> str:
    return f"{gpu_name}-{model_name}{tag}-tp{tp}.json"


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


__all__ = ["PROFILE_DIR", "SHAPE_FIELDS", "check_profile_matches", "default_profile", "draft_profile",
           "dtype_tag", "find_profile_path", "load_named_profile", "profile_dtypes", "profile_filename",
           "resolve_profile_path", "shape_mismatches"]
