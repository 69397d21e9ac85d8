"""The profiling harness: time one transformer layer's kernels with real tensors on the
device present, scale by the layer count, and write a schema-v1 profile (`source: measured`).

One code path for CUDA and CPU: only the timer differs (CUDA events vs perf_counter). torch is
imported when `measure_profile` runs, never by `kvsim run`.
"""

from __future__ import annotations

import datetime as _dt
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsim.simcore.errors import ProfileError
from kvsim.simcore.latency import SCHEMA, SCHEMA_VERSION
from kvsim.simcore.specs import GPUSpec, ModelSpec

INSTALL_HINT = "the profiling harness needs torch: pip install '.[profile]' in kvsim's source folder"


@dataclass(frozen=True, slots=True)
class Grid:
    """Grid points of every table the harness measures."""

    num_tokens: tuple[int, ...]
    chunk_tokens: tuple[int, ...]
    prefill_context: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    num_seqs: tuple[int, ...]

    def to_dict(self) -> dict[str, list[int]]:
        return {k: list(getattr(self, k)) for k in self.__slots__}

    def num_points(self, num_block_sizes: int) -> int:
        return (
            len(self.num_tokens) + len(self.chunk_tokens) * len(self.prefill_context)
            + num_block_sizes * len(self.decode_batch) * len(self.decode_context) + len(self.num_seqs)
        )


FULL_GRID = Grid(
    num_tokens=tuple(2**k for k in range(15)),  # 1 .. 16384
    chunk_tokens=tuple(2**k for k in range(4, 15)),  # 16 .. 16384
    prefill_context=(0, 512, 2048, 8192, 32768),
    decode_batch=tuple(2**k for k in range(11)),  # 1 .. 1024
    decode_context=(16, 64, 256, 1024, 4096, 16384, 32768),
    num_seqs=tuple(2**k for k in range(11)),
)
QUICK_GRID = Grid(
    num_tokens=(1, 4, 16, 64, 256),
    chunk_tokens=(16, 64, 256),
    prefill_context=(0, 256),
    decode_batch=(1, 4, 16),
    decode_context=(16, 128, 512),
    num_seqs=(1, 4, 16),
)


@dataclass
class HarnessConfig:
    """What to profile and how."""

    model: ModelSpec
    device: str = "cuda"  # cuda | cpu
    tp: int = 1
    gpu: GPUSpec | None = None  # prices the collective when it cannot be measured
    block_sizes: tuple[int, ...] = (16,)
    quick: bool = False
    repeats: int = 10
    warmup: int = 3
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu
    backend: str = "auto"
    seed: int = 0
    cpu_threads: int | None = 1  # torch threads on cpu (1 avoids oversubscription noise); None: torch's
    memory_fraction: float = 0.4  # largest KV cache one decode point may allocate, of free memory
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def grid(self) -> Grid:
        return QUICK_GRID if self.quick else FULL_GRID


def require_torch():
    try:
        import torch
    except ImportError:
        raise ProfileError(f"torch is not installed; {INSTALL_HINT}") from None
    return torch


class Timer:
    """Median and spread of a callable: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, torch, device: str, warmup: int, repeats: int):
        self.torch, self.cuda, self.warmup, self.repeats = torch, device == "cuda", warmup, repeats

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, float]:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        samples = []
        if self.cuda:
            torch.cuda.synchronize()
            for _ in range(self.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
        else:
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e3)
        samples.sort()
        lo, hi = samples[len(samples) // 10], samples[-1 - len(samples) // 10]
        return statistics.median(samples), hi - lo


NOISY_SPREAD = 0.25  # (p90 - p10) / median above this: the repeats of one point disagree
REFERENCE_DRIFT = 0.15  # the reference kernel timed >15% off its baseline: the machine's load changed
MAX_REMEASURE = 2  # extra attempts for a noisy point before it is marked in the profile


class NoiseGuard:
    """Times each grid point between two timings of a fixed reference kernel. A point whose repeats
    spread more than NOISY_SPREAD, or during which the reference drifted more than
    REFERENCE_DRIFT from its baseline (other load on the machine), is re-measured up to
    MAX_REMEASURE times; the cleanest attempt is kept, and one that is still noisy is listed
    in the profile's `provenance.noise.noisy_points`."""

    def __init__(self, timer: Callable[[Callable[[], Any]], tuple[float, float]], reference: Callable[[], Any],
                 reference_name: str = "reference") -> None:  # fmt: skip
        self.timer, self.reference, self.reference_name = timer, reference, reference_name
        self.baseline = statistics.median(timer(reference)[0] for _ in range(3))
        self.noisy: list[dict[str, Any]] = []
        self.num_remeasured = 0
        self.num_points = 0

    def _drift(self) -> float:
        return abs(self.timer(self.reference)[0] / self.baseline - 1) if self.baseline > 0 else 0.0

    def __call__(self, label: str, fn: Callable[[], Any]) -> tuple[float, float]:
        self.num_points += 1
        best = None
        for attempt in range(1 + MAX_REMEASURE):
            before = self._drift()
            med, spread = self.timer(fn)
            drift = max(before, self._drift())
            rel = spread / med if med > 0 else 0.0
            clean = rel <= NOISY_SPREAD and drift <= REFERENCE_DRIFT
            key = (not clean, rel + drift)
            if best is None or key < best[0]:
                best = (key, med, spread, rel, drift)
            if clean:
                break
            if attempt < MAX_REMEASURE:
                self.num_remeasured += 1
        (still_noisy, _), med, spread, rel, drift = best
        if still_noisy:
            self.noisy.append({"point": label, "spread_over_median": _r(rel), "reference_drift": _r(drift)})
        return med, spread

    def describe(self) -> dict[str, Any]:
        return {
            "reference_kernel": self.reference_name,
            "reference_baseline_ms": _r(self.baseline),
            "spread_threshold": NOISY_SPREAD,
            "drift_threshold": REFERENCE_DRIFT,
            "max_remeasure": MAX_REMEASURE,
            "points": self.num_points,
            "remeasured": self.num_remeasured,
            "noisy_points": self.noisy,
        }



def noise_summary(noise: dict[str, Any]) -> str | None:
    """One line for the user (from `provenance.noise`) when anything was re-measured or is still noisy."""
    noisy = noise.get("noisy_points") or []
    if not noise.get("remeasured") and not noisy:
        return None
    text = f"noisy measurements: {noise['remeasured']} re-measurements over {noise['points']} points"
    if noisy:
        text += (f"; {len(noisy)} points still noisy (spread > {noise['spread_threshold']:.0%} of the median, or "
                 f"the reference kernel off by > {noise['drift_threshold']:.0%}), marked in "
                 "provenance.noise.noisy_points; re-run on a quieter machine")
    return text


def _reference_kernel(torch, device: str, dtype, gen) -> tuple[Callable[[], Any], str]:
    """A fixed matmul whose time should not change during a run: a drift means other load."""
    n = 256 if device == "cpu" else 2048
    a = torch.randn((n, n), generator=gen, device=device, dtype=dtype)
    b = torch.randn((n, n), generator=gen, device=device, dtype=dtype)
    return (lambda: a @ b), f"{n}x{n}x{n} matmul ({str(dtype).removeprefix('torch.')})"


def _r(x: float) -> float:
    return float(f"{x:.4g}")


def _shards(model: ModelSpec, tp: int) -> tuple[int, int, int, int]:
    from kvsim.profiles.harness_linear import shards

    return shards(model, tp)


def _linear_layer(torch, model: ModelSpec, tp: int, tokens: int, dtype, device: str, gen, layout_gen) -> Callable[[], Any]:
    """One layer's linear work (dense, FP8 or MoE): `profiles.harness_linear.linear_layer`."""
    from kvsim.profiles.harness_linear import linear_layer

    return linear_layer(torch, model, tp, tokens, dtype, device, gen, layout_gen)


def _prefill(torch, model: ModelSpec, tp: int, chunk: int, context: int, dtype, device: str, gen):
    """Causal attention of a chunk over prior context (mask aligned bottom-right)."""
    from torch.nn.attention.bias import causal_lower_right

    heads, _, _, d = _shards(model, tp)
    total = context + chunk
    q = torch.randn((1, heads, chunk, d), generator=gen, device=device, dtype=dtype)
    k = torch.randn((1, heads, total, d), generator=gen, device=device, dtype=dtype)
    v = torch.randn((1, heads, total, d), generator=gen, device=device, dtype=dtype)
    bias = causal_lower_right(chunk, total)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if context == 0:
        return lambda: sdpa(q, k, v, is_causal=True)
    return lambda: sdpa(q, k, v, attn_mask=bias)


def _lm_head(torch, model: ModelSpec, tp: int, seqs: int, dtype, device: str, gen):
    """Final norm, the vocab-sharded LM head, and temperature + softmax + multinomial sampling
    over the full vocabulary (as after the logits gather)."""
    F = torch.nn.functional
    h, vs = model.hidden_size, -(-model.vocab_size // tp)
    x = torch.randn((seqs, h), generator=gen, device=device, dtype=dtype)
    w = torch.randn((vs, h), generator=gen, device=device, dtype=dtype) * 0.02
    norm_w = torch.ones(h, device=device, dtype=dtype)
    full = torch.randn((seqs, model.vocab_size), generator=gen, device=device)
    sample_gen = torch.Generator(device=device).manual_seed(0)

    def run():
        logits = (F.rms_norm(x, (h,), norm_w, 1e-5) @ w.T).float()
        full[:, :vs] = logits
        probs = torch.softmax(full / 0.8, dim=-1)
        return torch.multinomial(probs, 1, generator=sample_gen)

    return run


def _collective(torch, cfg: HarnessConfig, grid: Grid, dtype) -> tuple[dict | None, str]:
    """The profile's `collectives` block: NCCL all-reduce per call vs message bytes when tp GPUs
    are visible (the same (GPUs, bytes) table the H100 profiles carry), else the measured H100 table
    scaled by the `--gpu`'s interconnect datasheet (`profiles.collectives`)."""
    if cfg.tp <= 1:
        return None, "none (tp 1)"
    from kvsim.profiles.collectives import collectives_for
    from kvsim.simcore.catalog import get_gpu

    gpu = cfg.gpu or get_gpu("H100-SXM-80GB")
    block = collectives_for(gpu, cfg.tp)
    if cfg.device == "cuda" and torch.cuda.device_count() >= cfg.tp:
        from kvsim.profiles.harness_nccl import measure_allreduce

        elem = torch.tensor([], dtype=dtype).element_size()
        sizes = sorted({t * cfg.model.hidden_size for t in grid.num_tokens})
        times = measure_allreduce(cfg.tp, sizes, dtype, cfg.warmup, cfg.repeats)
        block["all_reduce"] = {"bytes": [n * elem for n in sizes], "time_ms": [_r(t) for t in times]}
        block["source"] = f"measured with NCCL on {cfg.tp} GPUs (per call, vs message bytes)"
        block.pop("all_reduce_by_engine", None)  # the roofline's per-version tables do not describe this one
        from kvsim.profiles.harness_nccl import measure_send_recv

        sr = measure_send_recv(sizes, dtype, cfg.warmup, cfg.repeats)
        block["send_recv"] = {"bytes": [n * elem for n in sizes], "time_ms": [_r(t) for t in sr]}
    return block, block["source"]


def _kv_budget_bytes(torch, cfg: HarnessConfig) -> float:
    if cfg.device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return cfg.memory_fraction * free
    return 1.0 * 1024**3


def measure_profile(cfg: HarnessConfig, progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    """Run every grid point and return the profile document. `progress(label, n)` is called
    after each point (n = points done)."""
    if cfg.model.is_mla:  # refused before torch loads: the harness times GQA paged attention only
        raise ProfileError(f"{cfg.model.name} uses multi-head latent attention, which the harness does not "
                           "time (no MLA kernels here); its profile is the roofline (kvsim run prices it)")
    torch = require_torch()
    model, tp, grid, dev = cfg.model, cfg.tp, cfg.grid, cfg.device
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ProfileError("--device cuda: no CUDA device is visible to torch")
    if model.quantization == "fp8":
        from kvsim.profiles.harness_linear import fp8_support

        why = fp8_support(cfg.device)
        if why:
            raise ProfileError(f"--quantization fp8 cannot be measured here: {why}; "
                               "kvsim prices FP8 from the roofline instead (profiles/README.md)")
    from kvsim.profiles.harness_kernels import FACTORIES, choose_backend, make_paged_kv

    dtype_name = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if cfg.device == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    if dev == "cpu" and cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    heads, kv_heads, _, d = _shards(model, tp)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)  # tensors, drawn on the device
    layout_gen = torch.Generator().manual_seed(cfg.seed + 1)  # block tables and slots (cpu)
    reference, reference_name = _reference_kernel(torch, dev, dtype, torch.Generator(device=dev).manual_seed(cfg.seed))
    guard = NoiseGuard(Timer(torch, dev, cfg.warmup, cfg.repeats), reference, reference_name)
    backend, tried = choose_backend(dev, dtype, cfg.block_sizes[0], cfg.backend)
    if not backend:
        raise ProfileError(f"no paged-attention backend works on {dev}: {tried}")
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(label, done)

    def table1d(key: str, xs, make) -> dict[str, Any]:
        times, spread = [], []
        for x in xs:
            med, spr = guard(f"{key} {x}", make(x))
            times.append(_r(med))
            spread.append(_r(spr))
            tick(f"{key} {x}")
        return {key: list(xs), "time_ms": times, "spread_ms": spread}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        linear = table1d("num_tokens", grid.num_tokens,
                         lambda t: _linear_layer(torch, model, tp, t, dtype, dev, gen, layout_gen))
        prefill: dict[str, Any] = {
            "chunk_tokens": list(grid.chunk_tokens), "context_tokens": list(grid.prefill_context),
            "time_ms": [], "spread_ms": [],
        }
        for c in grid.chunk_tokens:
            row, srow = [], []
            for p in grid.prefill_context:
                med, spr = guard(f"prefill {c}x{p}", _prefill(torch, model, tp, c, p, dtype, dev, gen))
                row.append(_r(med))
                srow.append(_r(spr))
                tick(f"prefill {c}x{p}")
            prefill["time_ms"].append(row)
            prefill["spread_ms"].append(srow)
        decode, scaled = _decode_tables(torch, cfg, grid, dtype, backend, FACTORIES, make_paged_kv,
                                        guard, (layout_gen, gen), tick, heads, kv_heads, d)
        lm_head = table1d("num_seqs", grid.num_seqs, lambda s: _lm_head(torch, model, tp, s, dtype, dev, gen))
    collective, coll_note = _collective(torch, cfg, grid, dtype)
    doc = _document(torch, cfg, grid, dtype_name, backend, tried, linear, prefill, decode, lm_head,
                    collective, coll_note, scaled)
    doc["provenance"]["noise"] = guard.describe()
    return doc


def _decode_tables(torch, cfg, grid, dtype, backend, factories, make_paged_kv, timer, gen, tick,
                   heads, kv_heads, d):
    """Paged decode per block size; points whose KV cache exceeds the memory budget are scaled
    from the largest measured point of that block size by KV tokens (listed in provenance)."""
    budget = _kv_budget_bytes(torch, cfg)
    per_token = 2 * kv_heads * d * torch.tensor([], dtype=dtype).element_size()
    tables, scaled = {}, []
    for bs in cfg.block_sizes:
        rows, srows, largest = [], [], None
        for b in grid.decode_batch:
            row, srow = [], []
            for ctx in grid.decode_context:
                tokens = b * (-(-ctx // bs)) * bs
                if tokens * per_token * (2 if backend == "reference" else 1) > budget and largest:
                    med = largest[1] * tokens / largest[0]
                    row.append(_r(med))
                    srow.append(0.0)
                    scaled.append([bs, b, ctx])
                    tick(f"decode bs{bs} {b}x{ctx} (scaled)")
                    continue
                p = make_paged_kv(b, ctx, bs, heads, kv_heads, d, dtype, cfg.device, gen[0], tensor_generator=gen[1])
                med, spr = timer(f"decode bs{bs} {b}x{ctx}", factories[backend](p))
                del p
                if largest is None or tokens >= largest[0]:
                    largest = (tokens, med)
                row.append(_r(med))
                srow.append(_r(spr))
                tick(f"decode bs{bs} {b}x{ctx}")
            rows.append(row)
            srows.append(srow)
        tables[str(bs)] = {
            "batch_size": list(grid.decode_batch), "context_tokens": list(grid.decode_context),
            "time_ms": rows, "spread_ms": srows,
        }
    return tables, scaled


def _kvsim_version() -> str:
    """The kvsim that measured (a profile is a result: it records what made it)."""
    from kvsim.simcore.simulate import KVSIM_VERSION

    return KVSIM_VERSION


def _device_name(torch, device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _document(torch, cfg, grid, dtype_name, backend, tried, linear, prefill, decode, lm_head,
              collective, coll_note, scaled) -> dict[str, Any]:
    from kvsim.profiles.host import host_overhead_block

    model = cfg.model
    host, host_by_policy, host_by_engine = host_overhead_block(model.num_layers, cfg.tp)
    gpu_name = cfg.gpu.name if cfg.gpu else ("cpu" if cfg.device == "cpu" else _device_name(torch, "cuda"))
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "source": "measured",
        "gpu": gpu_name,
        "model": model.name,
        "tensor_parallel_size": cfg.tp,
        "dtype": dtype_name,
        "model_shape": model.to_dict(),
        "host_overhead": host,
        "host_overhead_by_policy": host_by_policy,
        "host_overhead_by_engine": host_by_engine,
        "linear": linear,
        "prefill_attention": prefill,
        "decode_attention": decode,
        "lm_head": lm_head,
        "provenance": {
            "kvsim_version": _kvsim_version(),
            "device": cfg.device,
            "device_name": _device_name(torch, cfg.device),
            "label": "CPU" if cfg.device == "cpu" else "GPU",
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "driver": _driver(torch) if cfg.device == "cuda" else None,
            "decode_backend": backend,
            "backends_tried": tried,
            "prefill_backend": "torch scaled_dot_product_attention (causal_lower_right)",
            "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "grid": grid.to_dict() | {"block_sizes": list(cfg.block_sizes), "quick": cfg.quick},
            "repeats": cfg.repeats,
            "warmup": cfg.warmup,
            "seed": cfg.seed,
            "timing": "CUDA events" if cfg.device == "cuda" else "time.perf_counter",
            "statistic": "median of repeats; spread_ms = p90 - p10",
            "scope": "one layer measured, priced x num_layers by the latency model",
            "collective": coll_note,
            "scaled_decode_points": scaled,
            "host_overhead": "defaults per policy (profiles/host.py, README), not measured by the harness",
        },
    }
    if collective is not None:
        doc["collectives"] = collective
    doc.update(_what_was_measured(cfg, dtype_name, doc["provenance"]))
    return doc


def _what_was_measured(cfg, dtype_name: str, prov: dict[str, Any]) -> dict[str, Any]:
    """Weight dtype and MoE provenance: the fields lookup matches on, and how they were timed."""
    model, fields = cfg.model, {}
    if model.quantization == "fp8":
        fields = {"weight_dtype": "fp8", "kv_cache_dtype": dtype_name}
        prov["fp8"] = ("FP8 GEMMs measured with torch._scaled_mm: float8_e4m3fn weights (one scale per "
                       "tensor, per expert for MoE) and inputs (dynamic per-tensor scale, quantized inside the "
                       f"timed layer), {dtype_name} out; router, norms, attention and KV cache in {dtype_name}")
    if model.is_moe:
        from kvsim.profiles.harness_linear import moe_token_counts

        k, e = model.num_experts_per_tok, model.num_experts
        prov["moe"] = {
            "experts": e, "top_k": k, "moe_intermediate_size": model.moe_intermediate_size,
            "routing": ("uniform-routing load assumption of profiles/roofline.py: T tokens touch "
                        "round(E (1 - (1 - k/E)^T)) experts, T*k rows split evenly among them"),
            "kernel": "router GEMM + softmax/top-k, then a torch GEMM loop grouped per expert (gate/up, "
                      "SiLU, down), weighted index_add back; not vLLM's fused Triton kernel, rows not padded",
            "experts_touched": [len(moe_token_counts(t, e, k)) for t in cfg.grid.num_tokens],
        }
    return fields


def _driver(torch) -> str | None:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None
