"""Writing a report's files all at once: every file or none, never a half-written report."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from simcore.errors import KvsimError


def write_files(out_dir: Path, writers: dict[str, Callable[[Path], None]]) -> list[Path]:
    """Call each writer on a path in a staging folder inside `out_dir`, then move the files into
    place; on any failure the staging folder is removed and earlier files are left untouched."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".kvsim-", dir=out_dir))
    except OSError as exc:
        raise KvsimError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
    try:
        for name, write in writers.items():
            write(staging / name)
        for name in writers:
            os.replace(staging / name, out_dir / name)
    except OSError as exc:
        raise KvsimError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out_dir / name for name in writers]
