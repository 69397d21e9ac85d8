"""The compiled engine core: simcore/csrc/*.c, built into the extension module kvsim.simcore._core
when kvsim is installed (setup.py), and loaded here with ctypes.

Plain C99 functions (module.c only gives the file a module init): no code is compiled or cached at
run time, so nothing outside the installed package is ever loaded as code. Where the install could
not build it (no compiler, KVSIM_NO_CORE set, a checkout run without `pip install`), `library()` is
None and `unavailable_reason()` says why; kvsim then runs the Python core (same results, 20-80x
slower) and says so once per run (simcore/simulate.py).

`pricing_blob(model)` marshals a StepLatencyModel for csrc/pricing.c; `CPricing` prices steps
through it from Python (tests compare it bit for bit with the model).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

CSRC_DIR = Path(__file__).resolve().parent / "csrc"
MODULE = "kvsim.simcore._core"
REASON_FILE = Path(__file__).resolve().parent / "_core_build.txt"  # setup.py writes it on a failed build
PRICING_ABI = 3  # csrc/pricing.h KV_PRICING_ABI
BLOB_MAGIC = 1802924141.0  # csrc/pricing.h KV_BLOB_MAGIC
KV_OUT_LINEAR, KV_OUT_PREFILL, KV_OUT_DECODE = 1, 2, 4  # csrc/pricing.h: tables extrapolated
SLOWDOWN = "20-80x slower"  # Python core vs C core per request, measured (benchmarks/README.md)

_LOCK = threading.Lock()  # one load per process
_STATE: tuple[Any, str | None] | None = None  # (CDLL or None, reason), once library() ran


def library():
    """The loaded core (a ctypes.CDLL with the pricing functions typed), or None; loaded at most
    once per process (threads wait for the first)."""
    global _STATE
    state = _STATE
    if state is None:
        with _LOCK:
            if _STATE is None:
                _STATE = _load()
            state = _STATE
    return state[0]


def unavailable_reason() -> str | None:
    """Why library() is None (it loads the library first if no one has); None when it loaded."""
    library()
    return _STATE[1]


def module_path() -> Path | None:
    """Where the installed extension module is, or None when this install has none."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.has_location:
        return None
    return Path(spec.origin)


def _load() -> tuple[Any, str | None]:
    """Load the installed extension: (CDLL, None) or (None, reason)."""
    path = module_path()
    if path is None:
        try:
            recorded = REASON_FILE.read_text(encoding="utf-8", errors="replace").strip()[:400]
        except OSError:
            recorded = ""
        return None, recorded or ("this kvsim has no compiled core (imported from a source tree that "
                                  "was not installed: `pip install .` builds it)")
    lib = _open(path)
    if lib is None:
        return None, f"{path} does not load as kvsim's compiled core (reinstall kvsim: `pip install .`)"
    return lib, None


def _open(path: Path):
    """The library at `path`, its pricing functions typed; None if it does not load or is not ours."""
    import ctypes

    try:
        lib = ctypes.CDLL(str(path))
        lib.kv_pricing_abi.restype = ctypes.c_long
        lib.kv_pricing_abi.argtypes = []
        if lib.kv_pricing_abi() != PRICING_ABI:
            return None
    except (OSError, AttributeError):
        return None
    c_long_p, c_double_p = ctypes.POINTER(ctypes.c_long), ctypes.POINTER(ctypes.c_double)
    lib.kv_pricing_new.restype = ctypes.c_void_p
    lib.kv_pricing_new.argtypes = [c_double_p, ctypes.c_long]
    lib.kv_pricing_free.restype = None
    lib.kv_pricing_free.argtypes = [ctypes.c_void_p]
    lib.kv_step_parts.restype = ctypes.c_int
    lib.kv_step_parts.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, c_long_p, c_long_p,
                                  ctypes.c_long, ctypes.c_long, ctypes.c_long, c_double_p, c_long_p]
    return lib


# --- pricing --------------------------------------------------------------------------------


def _table1d(t) -> list[float]:
    return [len(t.lx), t.lo, t.hi, *t.lx, *t.ly]


def _table2d(t) -> list[float]:
    return [len(t.la), len(t.lb), t.a_lo, t.a_hi, t.b_lo, t.b_hi, *t.la, *t.lb, *(z for row in t.lz for z in row)]


def pricing_blob(model):
    """`model` (a StepLatencyModel, its decode table chosen by set_block_size) as csrc/pricing.c
    reads it: a float64 numpy array (layout in pricing.c). The tables' logarithms are the
    model's own values, so C interpolates exactly the numbers Python does."""
    import numpy as np

    host = model.host
    blob = [BLOB_MAGIC, float(PRICING_ABI), float(model.num_layers),
            host.per_step_ms, host.per_seq_ms, host.per_prefill_step_ms, host.per_prefill_token_ms,
            model.prefill_ratio]
    coll = None
    if model.all_reduce is not None:
        coll = model.all_reduce
        blob += [1.0, model.calls_per_layer, model.token_bytes, model.logit_bytes]
    elif model.collective is not None:
        coll = model.collective
        blob += [2.0, 0.0, 0.0, 0.0]
    else:
        blob += [0.0, 0.0, 0.0, 0.0]
    occ = model.occupancy
    blob += [0.0] * 5 if occ is None else [1.0, occ.tile, occ.ctas, occ.sms, occ.floor_ms]
    blob += _table1d(model.linear) + _table1d(model.lm_head) + (_table1d(coll) if coll is not None else [])
    blob += _table2d(model.prefill) + _table2d(model.decode)
    blob += [host.hidden_per_step_ms, host.hidden_per_seq_ms]  # ASYNC (ABI 3)
    return np.array(blob, dtype=np.float64)


class CPricing:
    """A StepLatencyModel priced by the compiled core (for tests and measurements: the C engine
    holds its own kv_pricing). step_parts_ms counts extrapolations in `extrapolated` as the
    model's does."""

    def __init__(self, model):
        import ctypes

        from kvsim.simcore.latency import ExtrapolationCounter

        lib = library()
        if lib is None:
            raise RuntimeError(f"kvsim's compiled core is unavailable: {unavailable_reason()}")
        self._lib = lib
        blob = pricing_blob(model)
        self._ptr = lib.kv_pricing_new(blob.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), len(blob))
        if not self._ptr:
            raise ValueError("csrc/pricing.c refused the model's blob")
        self.extrapolated = ExtrapolationCounter()
        self._out = (ctypes.c_double * 4)()
        self._prefill_out = ctypes.c_long()
        self._c_long = ctypes.c_long

    def __del__(self):
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr:
            self._lib.kv_pricing_free(ptr)

    def parts(self, num_tokens: int, prefill_chunks: list[tuple[int, int]], num_decode_seqs: int,
              decode_context_tokens: int, num_sampled: int) -> tuple[tuple[float, float, float, float], int, int]:
        """(gemm, attention, collectives, host ms), the KV_OUT_* mask, prefill chunks outside their table."""
        n = len(prefill_chunks)
        tokens = (self._c_long * n)(*(c for c, _ in prefill_chunks))
        context = (self._c_long * n)(*(x for _, x in prefill_chunks))
        mask = self._lib.kv_step_parts(self._ptr, num_tokens, n, tokens, context, num_decode_seqs,
                                       decode_context_tokens, num_sampled, self._out, self._prefill_out)
        return tuple(self._out), mask, self._prefill_out.value

    def step_parts_ms(self, num_tokens: int, prefill_chunks: list[tuple[int, int]], num_decode_seqs: int,
                      decode_context_tokens: int, num_sampled: int) -> tuple[float, float, float, float]:
        """StepLatencyModel.step_parts_ms's value, and its counting into `extrapolated`."""
        parts, mask, prefill_out = self.parts(num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens,
                                              num_sampled)
        counter = self.extrapolated
        if mask & KV_OUT_LINEAR:
            counter.note("linear")
        for _ in range(prefill_out):
            counter.note("prefill_attention")
        if mask & KV_OUT_DECODE:
            counter.note("decode_attention")
        if mask:
            counter.steps += 1
        return parts
