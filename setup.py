"""Builds kvsim's compiled engine core at install time (`pip install .`, `python -m build`).

Everything else is declared in pyproject.toml. The core (simcore/csrc/*.c) becomes the extension
module kvsim.simcore._core, compiled with the interpreter's own compiler settings plus the flags
that keep C's floating point the IEEE operations Python does (no FMA contraction, no fast-math: the
equivalence tests compare both engines bit for bit). Where no compiler works, the install still
succeeds: the reason is written beside the package (kvsim/simcore/_core_build.txt) and every run
says once that the Python core runs instead, and why. Nothing is compiled at run time.
"""

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CSRC = "simcore/csrc"
REASON_FILE = "_core_build.txt"  # simcore/ccore.py reads it


class OptionalCoreBuild(build_ext):
    """build_ext that records why the core could not be built instead of failing the install."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure leaves a usable (slower) install
            self._record_failure(exc)

    def build_extension(self, ext):
        if os.environ.get("KVSIM_NO_CORE"):  # build a Python-only install on purpose (tests, debugging)
            self._record_failure(RuntimeError("KVSIM_NO_CORE was set when kvsim was installed"))
            return
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._record_failure(exc)
            return
        stale = self._reason_path()
        if stale.exists():
            stale.unlink()

    def _reason_path(self) -> Path:
        base = Path("simcore") if self.inplace else Path(self.build_lib) / "kvsim" / "simcore"
        return base / REASON_FILE

    def _record_failure(self, exc: BaseException) -> None:
        words = " ".join(str(exc).split()) or type(exc).__name__
        path = self._reason_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"the compiled core was not built when kvsim was installed: {words[:300]}\n")
        print(f"kvsim: warning: {path.read_text().strip()}")


setup(
    ext_modules=[
        Extension(
            "kvsim.simcore._core",
            sources=[f"{CSRC}/module.c", f"{CSRC}/engine.c", f"{CSRC}/pricing.c", f"{CSRC}/spec.c", f"{CSRC}/fleet.c",
                     f"{CSRC}/tokens.c", f"{CSRC}/sessions.c"],
            depends=[f"{CSRC}/engine.h", f"{CSRC}/pricing.h", f"{CSRC}/spec.h", f"{CSRC}/disagg.c",
                     f"{CSRC}/disagg.h", f"{CSRC}/fleet.h", f"{CSRC}/tokens.h", f"{CSRC}/sessions.h",
                     f"{CSRC}/batching.c", f"{CSRC}/batching.h",
                     f"{CSRC}/pipeline.c", f"{CSRC}/pipeline.h", f"{CSRC}/seqgroup.c"],  # disagg.c, batching.c, pipeline.c, seqgroup.c: #included by engine.c
            extra_compile_args=["-std=c99", "-O2", "-ffp-contract=off", "-fno-fast-math"],
            libraries=["m"],
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": OptionalCoreBuild},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
