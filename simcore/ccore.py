"""The compiled engine core: simcore/csrc/*.c built with the system C compiler on first use.

Plain C99 without Python.h, loaded with ctypes, so no build step at install time and no wheel per
Python version: the first simulation that wants it compiles every `csrc/*.c` into one shared
library (`$CC`, else `cc`, `gcc` or `clang` on PATH, flags FLAGS: no FMA contraction, no
fast-math, so C's arithmetic is the same IEEE operations as Python's) and caches it under
`$KVSIM_CACHE_DIR`, else `$XDG_CACHE_HOME/kvsim`, else `~/.cache/kvsim` (a private temp dir when
that is not writable), named by a hash of the sources, flags, compiler and platform. A library is
written under a temp name and renamed into place, so parallel sweep workers compiling at once each
load a whole file. Without a compiler, or when compiling fails, `library()` is None and
`unavailable_reason()` says why: kvsim then runs the Python engine (same results, slower).

`pricing_blob(model)` marshals a StepLatencyModel for csrc/pricing.c; `CPricing` prices steps
through it from Python (tests compare it bit for bit with the model).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

CSRC_DIR = Path(__file__).resolve().parent / "csrc"
FLAGS = ("-O2", "-fPIC", "-shared", "-std=c99", "-ffp-contract=off", "-fno-fast-math")
LIBS = ("-lm",)  # libm's log/log1p/exp: the ones Python's math module calls, hence the same bits
COMPILERS = ("cc", "gcc", "clang")
COMPILE_TIMEOUT_S = 60.0
PRICING_ABI = 1  # csrc/pricing.h KV_PRICING_ABI
BLOB_MAGIC = 1802924141.0  # csrc/pricing.h KV_BLOB_MAGIC
KV_OUT_LINEAR, KV_OUT_PREFILL, KV_OUT_DECODE = 1, 2, 4  # csrc/pricing.h: tables extrapolated

_LOCK = threading.Lock()  # one build per process; other processes are handled by the rename
_STATE: tuple[Any, str | None] | None = None  # (CDLL or None, reason), once library() ran


def library():
    """The loaded core (a ctypes.CDLL with the pricing functions typed), or None; built at most once
    per process (threads wait for the first) and once per machine (the cache)."""
    global _STATE
    state = _STATE
    if state is None:
        with _LOCK:
            if _STATE is None:
                _STATE = _load()
            state = _STATE
    return state[0]


def unavailable_reason() -> str | None:
    """Why library() is None (it builds the library first if no one has); None when it loaded."""
    library()
    return _STATE[1]


def find_compiler() -> tuple[list[str] | None, str | None]:
    """(the compiler command, None), or (None, why there is none): `$CC` (it may carry arguments,
    e.g. `ccache gcc`), else the first of COMPILERS on PATH."""
    import shlex
    import shutil

    cc = os.environ.get("CC", "").strip()
    if cc:
        try:
            argv = shlex.split(cc)
        except ValueError as exc:
            return None, f"CC={cc!r} is not a command ({exc})"
        exe = shutil.which(argv[0]) if argv else None
        if exe is None:
            return None, f"CC={cc!r}: no such compiler"
        return [exe, *argv[1:]], None
    for name in COMPILERS:
        exe = shutil.which(name)
        if exe is not None:
            return [exe], None
    return None, f"no C compiler found (set CC, or put one of {', '.join(COMPILERS)} on PATH)"


def cache_dir() -> Path:
    """Where compiled libraries are kept (see the module docstring); may not exist yet."""
    explicit = os.environ.get("KVSIM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "kvsim"


def _load(src_dir: Path = CSRC_DIR) -> tuple[Any, str | None]:
    """Find or build the library for `src_dir`, load it: (CDLL, None) or (None, reason)."""
    import subprocess

    try:
        sources = sorted(src_dir.glob("*.c"))
        if not sources:
            return None, f"no C sources in {src_dir} (an install without simcore/csrc)"
        cc, reason = find_compiler()
        if cc is None:
            return None, reason
        name = f"kvsim_core-{_key(src_dir, cc)}{'.dll' if sys.platform == 'win32' else '.so'}"
        home = cache_dir()
        target = home / name if (home / name).is_file() else None  # a cache that may be read-only
        if target is None:
            where = _writable(home)
            target = where / name if where is not None and (where / name).is_file() else None
        if target is not None:
            lib = _open(target)
            if lib is not None:
                return lib, None  # otherwise unusable (a crash left it half written?): build it again
        where = _writable(home)
        if where is None:
            return None, f"no writable cache directory ({home}, nor a private one under the temp dir)"
        reason = _compile(cc, sources, where / name)
        if reason is not None:
            return None, reason
        lib = _open(where / name)
        if lib is None:
            return None, f"{where / name} was compiled but does not load as kvsim's core"
        return lib, None
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot build the compiled core: {exc}"


def _key(src_dir: Path, cc: list[str]) -> str:
    """sha256 (first 20 hex digits) of the sources (*.c, *.h), flags, compiler and its version, and
    the platform: a change of any of them builds a new library next to the old."""
    import hashlib
    import subprocess

    h = hashlib.sha256(b"kvsim ccore 1\0")
    version = subprocess.run([*cc, "--version"], capture_output=True, timeout=COMPILE_TIMEOUT_S)
    for part in (*FLAGS, *LIBS, "\0", *cc, "\0", sys.platform, os.uname().machine if hasattr(os, "uname") else ""):
        h.update(part.encode() + b"\0")
    h.update(version.stdout + version.stderr + b"\0")
    for path in sorted([*src_dir.glob("*.c"), *src_dir.glob("*.h")]):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def _writable(home: Path) -> Path | None:
    """`home` if it can be created and written, else a directory of this user's own under the temp
    dir (refused if someone else owns it or may write to it: it will hold code we load)."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK | os.X_OK):
            return home
    except OSError:
        pass
    import tempfile

    uid = os.getuid() if hasattr(os, "getuid") else 0
    private = Path(tempfile.gettempdir()) / f"kvsim-cache-{uid}"
    try:
        private.mkdir(mode=0o700, exist_ok=True)
        st = private.stat()
    except OSError:
        return None
    if hasattr(os, "getuid") and (st.st_uid != uid or st.st_mode & 0o022):
        return None
    return private


def _compile(cc: list[str], sources: list[Path], target: Path) -> str | None:
    """Compile into a temp file beside `target`, then rename it into place: None, or why not."""
    import secrets
    import subprocess

    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    cmd = [*cc, *FLAGS, "-o", str(tmp), *map(str, sources), *LIBS]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if proc.returncode != 0:
            lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
            detail = "; ".join(lines[:3]) or f"exit status {proc.returncode}"
            return f"compiling simcore/csrc with {cc[0]} failed: {detail}"
        os.replace(tmp, target)  # atomic: a racing process loads its own whole file or ours
        return None
    except subprocess.TimeoutExpired:
        return f"compiling simcore/csrc with {cc[0]} took over {COMPILE_TIMEOUT_S:.0f} s"
    finally:
        if tmp.exists():
            tmp.unlink()


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
            host.per_step_ms, host.per_seq_ms, host.per_prefill_step_ms, host.per_prefill_token_ms]
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
    return np.array(blob, dtype=np.float64)


class CPricing:
    """A StepLatencyModel priced by the compiled core (for tests and measurements: the C engine
    holds its own kv_pricing). step_parts_ms counts extrapolations in `extrapolated` as the
    model's does."""

    def __init__(self, model):
        import ctypes

        from simcore.latency import ExtrapolationCounter

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
