"""Check the latency model against measured whole steps (`kvsim profile validate`).

The harness times each operator alone; the latency model adds them up. This runs a fixed set
of mixed steps as ONE timed region per step, with the harness's own kernels, and compares:

    measured  = host + collectives + L * layer(step) + lm_head(S)
    predicted = StepLatencyModel(profile).step_time_s(step)

`layer(step)` is one transformer layer at the profile's TP shard, run end to end: the linear
work over all T tokens, prefill attention for each chunk and paged decode over a scattered
block table (the harness's `_linear_layer`, `_prefill` and decode backend, back to back).
`lm_head(S)` is measured with the harness's `_lm_head`; the step overhead and the collective
are the profile's own numbers on both sides (neither is measured here), so the error is the
kernels' alone, also reported without them. torch is imported only when `validate` runs.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import statistics
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvsim.simcore.errors import DoesNotFitError, ProfileError
from kvsim.simcore.latency import Profile, StepLatencyModel
from kvsim.simcore.specs import ModelSpec

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
STEP_SETS = ("quick", "full")
MEMORY_HEADROOM = 0.9  # share of the free memory the largest step may use


@dataclass(frozen=True, slots=True)
class ValidationStep:
    """One step: prefill chunks, each the last chunk of its prompt (so it samples a token), and
    `num_decode_seqs` decodes that each attend to `decode_context` tokens."""

    kind: str  # decode | prefill | mixed
    prefill_chunks: tuple[tuple[int, int], ...]  # (chunk_tokens, prior_context_tokens)
    num_decode_seqs: int = 0
    decode_context: int = 0  # tokens per decoding sequence

    @property
    def num_tokens(self) -> int:
        return sum(c for c, _ in self.prefill_chunks) + self.num_decode_seqs

    @property
    def num_sampled(self) -> int:
        return len(self.prefill_chunks) + self.num_decode_seqs

    @property
    def max_seq_len(self) -> int:
        return max([c + p for c, p in self.prefill_chunks] + [self.decode_context])

    @property
    def label(self) -> str:
        parts = [f"prefill {c}" + (f" @ctx {p}" if p else "") for c, p in self.prefill_chunks]
        if self.num_decode_seqs:
            parts.append(f"{self.num_decode_seqs} decodes x {self.decode_context}")
        return " + ".join(parts)


def _decode(batch: int, context: int) -> ValidationStep:
    return ValidationStep("decode", (), batch, context)


def _prefill(chunk: int, context: int = 0) -> ValidationStep:
    return ValidationStep("prefill", ((chunk, context),))


def _mixed(chunk: int, context: int, batch: int, decode_context: int) -> ValidationStep:
    return ValidationStep("mixed", ((chunk, context),), batch, decode_context)


# Inside the harness's quick grid (tokens <= 256, chunks 16..256 over context <= 256, decode
# batch <= 16 over context <= 512, sampled <= 16), so a --quick profile prices them without
# extrapolating; chosen for the grid, never for their errors.
QUICK_STEPS = (
    _decode(1, 128), _decode(4, 512), _decode(8, 256), _decode(16, 128), _decode(16, 512),
    _prefill(32), _prefill(128), _prefill(256), _prefill(64, 256), _prefill(128, 128),
    _mixed(64, 0, 4, 128), _mixed(128, 0, 8, 256), _mixed(192, 64, 12, 512),
)
# Serving-sized steps inside the full grid (tokens <= 16384, chunks over context <= 32768,
# decode batch <= 1024 over context <= 32768).
FULL_STEPS = (
    *(_decode(b, c) for b in (1, 16, 64, 256) for c in (256, 2048, 8192)),
    _prefill(256), _prefill(1024), _prefill(4096), _prefill(512, 2048), _prefill(2048, 6144),
    _mixed(512, 0, 16, 1024), _mixed(512, 0, 64, 2048), _mixed(2048, 0, 128, 2048),
    _mixed(512, 1536, 32, 4096), _mixed(256, 1024, 256, 1024),
)


def steps_for(step_set: str, model: ModelSpec) -> tuple[list[ValidationStep], list[ValidationStep]]:
    """(steps to run, steps skipped because a sequence exceeds the model's context limit)."""
    if step_set not in STEP_SETS:
        raise ProfileError(f"--steps must be one of {', '.join(STEP_SETS)}, got {step_set!r}")
    steps = QUICK_STEPS if step_set == "quick" else FULL_STEPS
    keep = [s for s in steps if s.max_seq_len <= model.max_position_embeddings]
    return keep, [s for s in steps if s.max_seq_len > model.max_position_embeddings]


def default_step_set(profile: Profile) -> str:
    """quick for a profile measured on the harness's --quick grid, else full."""
    grid = profile.data.get("provenance", {}).get("grid", {})
    return "quick" if isinstance(grid, dict) and grid.get("quick") else "full"


def profile_device(profile: Profile) -> str:
    """The device a profile's tables describe: the harness records it; a roofline is a GPU."""
    if profile.source == "measured":
        return str(profile.data.get("provenance", {}).get("device", "cuda"))
    return "cuda"


def model_of(profile: Profile) -> ModelSpec:
    where = profile.path or profile.label
    shape = profile.data["model_shape"]
    try:
        return ModelSpec(**{"name": profile.data.get("model", "profile")} | shape)
    except TypeError as exc:
        raise ProfileError(f"{where}.model_shape: not a model shape ({exc})") from None


def step_bytes(model: ModelSpec, tp: int, step: ValidationStep, block_size: int, elem: int,
               gathered: bool = True) -> int:
    """Rough peak bytes of one step's tensors (one layer + LM head), as the harness builds them:
    weights, activations, a score matrix per prefill chunk (fp32, unfused CPU path), the paged
    cache and, for the reference backend (`gathered`), its gathered, GQA-expanded copy and scores."""
    heads, kv_heads = model.num_attention_heads // tp, max(1, model.num_kv_heads // tp)
    h, d, inter, t = model.hidden_size, model.head_dim, model.intermediate_size // tp, step.num_tokens
    qkv = (heads + 2 * kv_heads) * d
    up = (2 if model.gated_mlp else 1) * inter
    linear = (qkv * h + h * heads * d + up * h + h * inter + t * (6 * h + 2 * qkv + 2 * up)) * elem
    prefill = sum(
        heads * d * (c + 2 * (c + p)) * elem + 2 * heads * c * (c + p) * 4 for c, p in step.prefill_chunks
    )
    b = step.num_decode_seqs
    tokens = b * -(-step.decode_context // block_size) * block_size
    decode = 2 * (tokens + 8 * block_size) * kv_heads * d * elem if b else 0
    if gathered:
        decode += 2 * tokens * heads * d * elem + 2 * tokens * heads * 4
    vocab_shard = -(-model.vocab_size // tp)
    lm_head = vocab_shard * h * elem + 3 * step.num_sampled * model.vocab_size * 4
    return linear + prefill + decode + lm_head


def _available_bytes(torch, device: str) -> float:
    if device == "cuda":
        return float(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_fits(where: str, model: ModelSpec, tp: int, steps: list[ValidationStep], block_size: int,
               dtype_name: str, backend: str, device: str, available: float) -> None:
    """Refuse, in one line, a model shape whose largest step does not fit the device."""
    elem, gathered = DTYPE_BYTES[dtype_name], backend == "reference"
    need, worst = max((step_bytes(model, tp, s, block_size, elem, gathered), s.label) for s in steps)
    if need > MEMORY_HEADROOM * available:
        raise DoesNotFitError(
            f"{where}: model shape {model.name!r} is too large for {device}: one layer at TP {tp} "
            f"({dtype_name}) needs ~{need / 2**30:.1f} GiB for the step '{worst}' but only "
            f"{MEMORY_HEADROOM * available / 2**30:.1f} GiB is available"
        )


@dataclass(frozen=True, slots=True)
class Row:
    """One validated step; times in ms, ratio = predicted / measured."""

    kind: str
    step: str
    num_tokens: int
    prefill_chunks: list[list[int]]
    num_decode_seqs: int
    decode_context: int
    num_sampled: int
    layer_ms: float  # one layer, measured end to end
    layer_spread_ms: float  # p90 - p10 of its repeats
    lm_head_ms: float  # measured
    collective_ms: float  # the profile's, all layers
    overhead_ms: float  # the profile's
    measured_ms: float
    predicted_ms: float
    ratio: float
    kernels_ratio: float  # the same without the shared overhead and collective
    extrapolated: bool  # the latency model priced this step outside a profiled grid


def _rel_errors(rows: list[Row], kernels: bool) -> list[float]:
    return [abs((r.kernels_ratio if kernels else r.ratio) - 1.0) for r in rows]


def summarize(rows: list[Row]) -> dict[str, Any]:
    """Median and worst |predicted - measured| / measured, whole step and kernels only."""
    whole, kern = _rel_errors(rows, False), _rel_errors(rows, True)
    worst = max(range(len(rows)), key=lambda i: whole[i])
    worst_k = max(range(len(rows)), key=lambda i: kern[i])
    return {
        "num_steps": len(rows),
        "median_abs_rel_error": statistics.median(whole),
        "worst_abs_rel_error": whole[worst],
        "worst_step": rows[worst].step,
        "kernels_median_abs_rel_error": statistics.median(kern),
        "kernels_worst_abs_rel_error": kern[worst_k],
        "kernels_worst_step": rows[worst_k].step,
        "extrapolated_steps": sum(r.extrapolated for r in rows),
    }


@dataclass
class ValidateConfig:
    """What to validate and how (timing settings as in the harness)."""

    profile: Profile
    device: str | None = None  # None: the device the profile describes
    step_set: str | None = None  # None: default_step_set(profile)
    block_size: int | None = None  # None: 16 if the profile has it, else its smallest
    backend: str | None = None  # None: the profile's decode backend, else auto
    repeats: int = 10
    warmup: int = 3
    seed: int = 0


def _resolve(cfg: ValidateConfig) -> tuple[str, str, int, str, str]:
    """(device, step set, block size, dtype name, backend wanted), checked against the profile."""
    p, where = cfg.profile, cfg.profile.path or cfg.profile.label
    own = profile_device(p)
    device = cfg.device or own
    if device != own:
        what = f"was measured on {own}" if p.source == "measured" else f"is a roofline of {p.data['gpu']}"
        raise ProfileError(f"{where}: the profile {what}; validate it with --device {own}")
    sizes = sorted(int(k) for k in p.data["decode_attention"])
    block_size = cfg.block_size or (16 if 16 in sizes else sizes[0])
    if block_size not in sizes:
        raise ProfileError(f"{where}: no decode table for block size {block_size} (has {sizes})")
    dtype_name = p.data.get("dtype") or ("bfloat16" if device == "cuda" else "float32")
    if dtype_name not in DTYPE_BYTES:
        raise ProfileError(f"{where}.dtype: {dtype_name!r} is not one of {', '.join(DTYPE_BYTES)}")
    backend = cfg.backend or p.data.get("provenance", {}).get("decode_backend") or "auto"
    return device, cfg.step_set or default_step_set(p), block_size, dtype_name, backend


def validate_profile(cfg: ValidateConfig, progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    """Run every step of the set on the device and return rows, summary and provenance."""
    from kvsim.profiles.harness import HarnessConfig, Timer, require_torch

    device, step_set, block_size, dtype_name, wanted = _resolve(cfg)
    profile, where = cfg.profile, cfg.profile.path or cfg.profile.label
    model, tp = model_of(profile), int(profile.data["tensor_parallel_size"])
    if model.is_mla:
        raise ProfileError(f"{where}: {model.name} uses multi-head latent attention, which validation does not "
                           "run (no MLA kernels here)")
    steps, skipped = steps_for(step_set, model)
    if not steps:
        raise ProfileError(f"{where}: every {step_set} step exceeds the model's context limit")
    torch = require_torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise ProfileError("--device cuda: no CUDA device is visible to torch")
    from kvsim.profiles.harness_kernels import choose_backend

    hc = HarnessConfig(model=model, device=device, tp=tp, block_sizes=(block_size,), repeats=cfg.repeats,
                       warmup=cfg.warmup, dtype=dtype_name, backend=wanted, seed=cfg.seed)
    if device == "cpu" and hc.cpu_threads:
        torch.set_num_threads(hc.cpu_threads)  # as the harness: one thread unless told otherwise
    dtype = getattr(torch, dtype_name)
    backend, tried = choose_backend(device, dtype, block_size, wanted)
    if not backend:
        raise ProfileError(f"decode backend {wanted!r} does not work on {device}: {tried}")
    check_fits(where, model, tp, steps, block_size, dtype_name, backend, device, _available_bytes(torch, device))
    gens = (torch.Generator().manual_seed(cfg.seed + 1), torch.Generator(device=device).manual_seed(cfg.seed))
    timer = Timer(torch, device, cfg.warmup, cfg.repeats)
    latency = StepLatencyModel(profile.data, where)
    latency.set_block_size(block_size)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, step in enumerate(steps):
            rows.append(_measure_step(torch, hc, step, backend, dtype, gens, timer, latency))
            if progress:
                progress(step.label, i + 1)
    return {
        "schema": "kvsim-validation",
        "profile": {"path": profile.path, "label": profile.label, "sha256": profile.sha256,
                    "source": profile.source,
                    "measured_on": profile.data.get("provenance", {}).get("device_name")},
        "steps": step_set,
        "block_size": block_size,
        "rows": [asdict(r) for r in rows],
        "skipped_steps": [s.label for s in skipped],
        "summary": summarize(rows),
        "provenance": _provenance(torch, cfg, device, backend, tried, dtype_name),
    }


def _provenance(torch, cfg: ValidateConfig, device: str, backend: str, tried: dict, dtype_name: str) -> dict:
    from kvsim.profiles.harness import _device_name, _kvsim_version

    return {
        "kvsim_version": _kvsim_version(),
        "device": device,
        "device_name": _device_name(torch, device),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "decode_backend": backend,
        "backends_tried": tried,
        "prefill_backend": "torch scaled_dot_product_attention (causal_lower_right)",
        "dtype": dtype_name,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "timing": "CUDA events" if device == "cuda" else "time.perf_counter",
        "statistic": "median of repeats; layer_spread_ms = p90 - p10",
        "repeats": cfg.repeats,
        "warmup": cfg.warmup,
        "seed": cfg.seed,
        "scope": "one layer timed end to end x num_layers + LM head measured; "
                 "step overhead and collective taken from the profile",
    }


def _step_layer(torch, hc, step: ValidationStep, backend: str, dtype, gens) -> Callable[[], None]:
    """One layer of the step, built from the harness's kernels and run back to back."""
    from kvsim.profiles.harness import _linear_layer, _prefill, _shards
    from kvsim.profiles.harness_kernels import FACTORIES, make_paged_kv

    model, tp, dev = hc.model, hc.tp, hc.device
    layout_gen, gen = gens
    parts = [_linear_layer(torch, model, tp, step.num_tokens, dtype, dev, gen, layout_gen)]
    parts += [_prefill(torch, model, tp, c, p, dtype, dev, gen) for c, p in step.prefill_chunks]
    if step.num_decode_seqs:
        heads, kv_heads, _, d = _shards(model, tp)
        kv = make_paged_kv(step.num_decode_seqs, step.decode_context, hc.block_sizes[0], heads, kv_heads, d,
                           dtype, dev, layout_gen, tensor_generator=gen)
        parts.append(FACTORIES[backend](kv))

    def run() -> None:
        for part in parts:
            part()

    return run


def _measure_step(torch, hc, step: ValidationStep, backend: str, dtype, gens, timer, latency) -> Row:
    from kvsim.profiles.harness import _lm_head

    layer_ms, spread = timer(_step_layer(torch, hc, step, backend, dtype, gens))
    lm_ms = timer(_lm_head(torch, hc.model, hc.tp, step.num_sampled, dtype, hc.device, gens[1]))[0]
    if hc.device == "cuda":
        torch.cuda.empty_cache()
    layers, t = latency.num_layers, step.num_tokens
    before = latency.extrapolated.steps
    predicted = 1e3 * latency.step_time_s(
        t, list(step.prefill_chunks), step.num_decode_seqs, step.num_decode_seqs * step.decode_context,
        step.num_sampled,
    )
    _, coll_ms, overhead = latency.step_breakdown_ms(
        t, list(step.prefill_chunks), step.num_decode_seqs, step.num_decode_seqs * step.decode_context,
        step.num_sampled,
    )
    measured = overhead + coll_ms + layers * layer_ms + lm_ms
    kernels_pred, kernels_meas = predicted - overhead - coll_ms, measured - overhead - coll_ms
    assert math.isfinite(measured) and measured > 0, f"measured {measured} ms for {step.label}"
    return Row(
        kind=step.kind, step=step.label, num_tokens=t, prefill_chunks=[list(c) for c in step.prefill_chunks],
        num_decode_seqs=step.num_decode_seqs, decode_context=step.decode_context, num_sampled=step.num_sampled,
        layer_ms=layer_ms, layer_spread_ms=spread, lm_head_ms=lm_ms, collective_ms=coll_ms, overhead_ms=overhead,
        measured_ms=measured, predicted_ms=predicted, ratio=predicted / measured,
        kernels_ratio=kernels_pred / kernels_meas, extrapolated=latency.extrapolated.steps > before,
    )
