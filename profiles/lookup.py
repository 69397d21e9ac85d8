"""Which profile a run uses: the committed file for (GPU, model, TP), else a roofline."""

from __future__ import annotations

from pathlib import Path

from simcore.errors import ProfileError
from simcore.latency import Profile, load_profile, parse_profile
from simcore.specs import GPUSpec, ModelSpec

PROFILE_DIR = Path(__file__).resolve().parent
SHAPE_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
    "intermediate_size", "vocab_size",
)


def profile_filename(gpu_name: str, model_name: str, tp: int) -> str:
    return f"{gpu_name}-{model_name}-tp{tp}.json"


def find_profile_path(gpu_name: str, model_name: str, tp: int, directory: Path = PROFILE_DIR) -> Path | None:
    """The committed `profiles/<gpu>-<model>-tp<N>.json` (names matched case-insensitively)."""
    wanted = profile_filename(gpu_name, model_name, tp).lower()
    for path in sorted(directory.glob("*.json")):
        if path.name.lower() == wanted:
            return path
    return None


def shape_mismatches(profile: Profile, model: ModelSpec) -> list[str]:
    shape = profile.data.get("model_shape", {})
    return [
        f"{name} {shape.get(name)!r} != {getattr(model, name)!r}"
        for name in SHAPE_FIELDS
        if name in shape and shape[name] != getattr(model, name)
    ]


def check_profile_matches(profile: Profile, model: ModelSpec, tp: int, gpu: GPUSpec | None = None) -> None:
    """Raise ProfileError when a profile was made for another GPU, model shape or TP degree.
    A CPU profile (`gpu: cpu`, the harness on this machine) is accepted with any --gpu: it exists
    to exercise the measured path and its label says CPU."""
    where = profile.path or profile.label
    if gpu is not None:
        pgpu = str(profile.data.get("gpu", ""))
        if pgpu.lower() not in (gpu.name.lower(), "cpu"):
            raise ProfileError(f"{where}: profile is for GPU {pgpu!r}, but the run uses --gpu {gpu.name}")
    diffs = shape_mismatches(profile, model)
    if diffs:
        raise ProfileError(f"{where}: profile model shape differs from {model.name}: {'; '.join(diffs)}")
    ptp = profile.data.get("tensor_parallel_size")
    if ptp != tp:
        raise ProfileError(f"{where}: profile is for --tp {ptp}, but the run uses --tp {tp}")


def default_profile(gpu: GPUSpec, model: ModelSpec, tp: int) -> Profile:
    """The committed profile for this GPU, model and TP when it exists and matches the shape,
    else a roofline profile built in memory (its label says `roofline`)."""
    path = find_profile_path(gpu.name, model.name, tp)
    if path is not None:
        profile = load_profile(path)
        if not shape_mismatches(profile, model) and profile.data.get("tensor_parallel_size") == tp:
            return profile
    from profiles.roofline import build_roofline_profile

    return parse_profile(build_roofline_profile(gpu, model, tp), f"roofline {gpu.name} {model.name} tp{tp}")
