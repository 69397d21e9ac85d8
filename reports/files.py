"""Writing results all or nothing: a new folder swapped in with one rename, or one file replaced.

    out/                <- kept, untouched, until the swap
    .out.kvsim-PID-XXXX <- every new file is written here first (a sibling, same filesystem)
    swap: renameat2(RENAME_EXCHANGE) on Linux: one rename, `out` is old or new, never a mix
          (elsewhere: out -> backup, new -> out, backup restored if the second rename fails)

Targets are checked (writable, not clashing with a folder, not a folder of someone else's files)
by `check_out_folder` / `check_out_file` before any simulation starts, so a bad `--out` never
costs the work; the checks create nothing. Folders missing above the target are made when the
write starts and removed again if it does not finish. A staging entry carries its writer's pid:
one left by a killed kvsim (SIGKILL runs no clean-up) is removed by the next write beside it.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import errno
import io
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from kvsim.simcore.errors import KvsimError

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h


def _umask() -> int:
    """The process umask (read by setting it and putting it back: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_mode(made: Path, like: Path, default: int) -> None:
    """`tempfile` makes owner-only (0600 / 0700) entries; give `made` the mode of the entry it
    replaces, or what a plain `open` / `mkdir` would give under the umask, so a result is as
    readable as any other file the user writes."""
    try:
        mode = like.stat().st_mode & 0o7777
    except OSError:
        mode = default & ~_umask()
    os.chmod(made, mode)


def _why(exc: OSError) -> str:
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "a part of the path is a file, not a folder"
    return exc.strerror or str(exc)


def _resolve(path: Path) -> Path:
    """`path` with links resolved; a symlink loop (RuntimeError from Path.resolve on 3.11) is the
    OSError ELOOP it is."""
    try:
        return path.resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, "a symlink loop", str(path)) from None


def _existing_ancestor(path: Path) -> Path:
    """The nearest folder at or above `path` that exists (a file there: NotADirectoryError)."""
    for candidate in [path, *path.parents]:
        if candidate.exists():
            if not candidate.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(candidate))
            return candidate
        if candidate.is_symlink():  # a dangling link: nothing can be made through it
            raise FileNotFoundError(errno.ENOENT, "a broken symlink", str(candidate))
    return Path(path.anchor or ".")


def _fresh_name(folder: Path, prefix: str) -> Path:
    """A path in `folder` no entry has (a random name: what `tempfile` would pick)."""
    return Path(folder) / f"{prefix}{secrets.token_hex(6)}"


def _probe(folder: Path) -> None:
    """Prove an entry can be made in `folder` (made and removed at once). The name is chosen
    before the folder is made, so an interrupt at any moment cannot leave it behind."""
    path = _fresh_name(folder, f".kvsim-probe-{os.getpid()}-")
    try:
        os.mkdir(path, 0o700)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(path)


# What a JSON file kvsim writes says about itself (run / plan / calibrate records, profiles).
_KVSIM_JSON_MARKS = (b'"kvsim_version"', b'"kvsim-profile"')
# The fixed names of every folder kvsim writes (run, run --find-max-rate, plan, report seed-table,
# report sweep; tests/test_reliability_round3.py checks each command's list is in here), so a
# folder one command wrote may be reused by another. Calibrated profiles are recognized by
# _PROFILE_NAME and their schema.
KVSIM_OUTPUT_NAMES = frozenset({
    "requests.csv", "steps.csv", "summary.json", "rates.csv", "max_rate.json",
    "plan.csv", "plan.json", "capacity.png", "plan.parquet",
    "seed-table.md", "seed-table.csv", "seed-table.html", "seed-table.png", "seed-table-kv.png",
    "seed-table-ttft.png", "heatmap-throughput.png", "heatmap-ttft-p95.png", "heatmap-tpot-p95.png",
    "heatmap-kv-waste.png", "throughput-latency.png", "sweep-report.html",
    "autoscale.png", "autoscale.html", "fleet.html", "plan.html", "disagg.html",
})
_PROFILE_NAME = re.compile(r".+-tp[0-9]+\.json")


def _is_kvsim_file(path: Path) -> bool:
    """A regular file kvsim could have written under this name: a non-JSON output name, or a
    JSON file that carries kvsim's record (read with the profile cap: bounded)."""
    if not path.is_file():
        return False
    if path.suffix != ".json":
        return True
    from kvsim.simcore.userfiles import read_bytes

    try:
        data = read_bytes(path, "profile")
    except OSError:
        return False
    return any(mark in data for mark in _KVSIM_JSON_MARKS)


def holds_kvsim_result(folder: Path, names: Iterable[str]) -> bool:
    """`folder` holds a previous kvsim result: one of this write's `names`, or of any folder kvsim
    writes, written by kvsim (a JSON with kvsim's record), or a calibrated profile."""
    known = set(names) | KVSIM_OUTPUT_NAMES
    with os.scandir(folder) as entries:
        candidates = [e.name for e in entries if e.name in known or _PROFILE_NAME.fullmatch(e.name)]
    return any(_is_kvsim_file(folder / name) for name in sorted(candidates)[:16])  # a bounded look


def calibrated_profiles(folder: Path) -> tuple[str, ...]:
    """Names of the calibrated profiles in `folder` (`<...>-tp<N>.json` files kvsim wrote as such:
    its profile schema, source "calibrated"): an earlier `kvsim calibrate --out` of this folder,
    which a new fit replaces (`write_files`' `replaces`) so that no stale fit is read beside it.
    Anything else stays: the user's files, and measured or roofline profiles put there."""
    import json

    from kvsim.simcore.userfiles import read_bytes

    try:
        with os.scandir(folder) as entries:
            candidates = sorted(e.name for e in entries if _PROFILE_NAME.fullmatch(e.name) and e.is_file())
    except OSError:  # no folder yet
        return ()
    found = []
    for name in candidates:
        try:
            data = json.loads(read_bytes(folder / name, "profile"))
        except (OSError, ValueError):  # unreadable or not JSON: not kvsim's
            continue
        if isinstance(data, dict) and data.get("schema") == "kvsim-profile" and data.get("source") == "calibrated":
            found.append(name)
    return tuple(found)


def check_out_folder(out_dir: Path, names: Iterable[str], flag: str = "--out") -> Path:
    """Prove the swap can happen, creating nothing: the folder (or the nearest folder above it
    that exists) is writable, none of `names` is a folder there, and a folder that exists is
    empty or holds a previous kvsim result (one of `names`, written by kvsim). Returns the
    resolved folder."""
    try:  # even looking at a path can fail (a name too long, a symlink loop)
        return _check_out_folder(out_dir, tuple(names), flag)
    except OSError as exc:
        raise KvsimError(f"{flag} {out_dir}: cannot write there ({_why(exc)})") from None


def _check_out_folder(out_dir: Path, names: tuple[str, ...], flag: str) -> Path:
    path = Path(out_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise KvsimError(f"{flag} {out_dir}: exists and is not a folder")
    resolved = _resolve(path)
    cwd = _resolve(Path.cwd())
    if resolved == cwd or resolved in cwd.parents:
        raise KvsimError(
            f"{flag} {out_dir}: give a folder of its own (kvsim replaces the whole folder), "
            "not the current directory or one above it"
        )
    for name in names:
        if (resolved / name).is_dir() and not (resolved / name).is_symlink():
            raise KvsimError(f"{flag} {out_dir}: {name} there is a folder; kvsim would have to replace it")
    if resolved.is_dir():
        with os.scandir(resolved) as entries:
            foreign = next(entries, None) is not None and not holds_kvsim_result(resolved, names)
        if foreign:
            raise KvsimError(
                f"{flag} {out_dir}: a folder that holds other files and no kvsim result; kvsim replaces "
                "the whole folder, so give a new or empty folder (or one a previous run wrote)"
            )
    try:
        if resolved.is_dir():
            _probe(resolved)  # a file inside
            _probe(resolved.parent)  # the sibling staging folder
        else:
            _probe(_existing_ancestor(resolved.parent))
    except OSError as exc:
        raise KvsimError(f"{flag} {out_dir}: cannot write there ({_why(exc)})") from None
    return resolved


def check_out_file(path: Path, flag: str = "--out") -> Path:
    """Create the parent folder if needed and prove a file can be written and renamed into place."""
    try:  # even looking at a path can fail (a name too long, a symlink loop)
        return _check_out_file(path, flag)
    except OSError as exc:
        raise KvsimError(f"{flag} {path}: cannot write there ({_why(exc)})") from None


def _check_out_file(path: Path, flag: str) -> Path:
    target = Path(path).expanduser()
    if target.is_dir():
        raise KvsimError(f"{flag} {path}: is a folder; give a file name")
    from kvsim.simcore.userfiles import is_special

    if is_special(target):  # a FIFO would block the write forever, a device would swallow it
        raise KvsimError(f"{flag} {path}: exists and is not a regular file")
    _resolve(target)  # a symlink loop: refused here, as the OS would refuse the write
    try:
        _probe(_existing_ancestor(target.parent))  # creates nothing that stays
    except OSError as exc:
        raise KvsimError(f"{flag} {path}: cannot write there ({_why(exc)})") from None
    if target.exists() and not os.access(target, os.W_OK) and not os.access(target.parent, os.W_OK):
        raise KvsimError(f"{flag} {path}: not writable")
    return target


def _staging_prefix(name: str) -> str:
    """The name start of this process's staging entries beside `name`."""
    return f".{name}.kvsim-{os.getpid()}-"


_STAGING = re.compile(r"\.(?P<name>.+)\.kvsim-(?P<pid>[0-9]+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's live process
        return True
    return True


def remove_stale(folder: Path, name: str) -> None:
    """Remove the staging entries of `name` in `folder` whose writer is gone (a kvsim killed by
    SIGKILL, or a machine that lost power, leaves them). Entries of live processes, and any
    name kvsim did not make, are left alone."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        found = _STAGING.match(entry.name)
        if found is None or found["name"] != name or int(found["pid"]) == os.getpid() or _alive(int(found["pid"])):
            continue
        path = Path(folder) / entry.name
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def missing_parents(folder: Path) -> list[Path]:
    """`folder` and the folders above it that do not exist yet, deepest first: what `make_parents`
    makes, and what `remove_made` removes (if still empty) when the write does not happen. Known
    before anything is made, so an interrupt between two mkdirs cannot leave one behind."""
    missing = []
    for candidate in [folder, *folder.parents]:
        if candidate.is_dir():
            break
        missing.append(candidate)
    return missing


def make_parents(folder: Path, missing: list[Path] | None = None) -> list[Path]:
    """Create `folder` and the folders missing above it; returns them, deepest first."""
    missing = missing_parents(folder) if missing is None else missing
    for candidate in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another writer
            candidate.mkdir()
    return missing


def remove_made(made: list[Path]) -> None:
    """Remove folders `make_parents` made, if still empty."""
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()


def write_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Write one file through a temporary sibling and `os.replace` (atomic on POSIX); a symlink is
    written through, as `>` would (the replace had put a file in place of the link)."""
    target = Path(path)
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    made = missing_parents(target.parent)
    tmp = _fresh_name(target.parent, _staging_prefix(target.name))
    done = False
    try:
        try:
            make_parents(target.parent, made)
            remove_stale(target.parent, target.name)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            raise KvsimError(f"cannot write {target}: {_why(exc)}") from None
        write(Path(tmp))
        give_mode(Path(tmp), target, 0o666)
        os.replace(tmp, target)
        done = True
    except OSError as exc:
        raise KvsimError(f"cannot write {target}: {_why(exc)}; nothing was written") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if not done:
            remove_made(made)
    return target


def write_files(out_dir: Path, writers: dict[str, Callable[[Path], None]], replaces: Iterable[str] = ()) -> list[Path]:
    """Call each writer on a path in a new sibling folder, carry over the other entries of the old
    folder (but those named in `replaces`), then swap the new folder in with one rename. On any
    failure the old folder is left exactly as it was and the new one is removed."""
    with Staging(out_dir, writers) as staging:
        return staging.commit(writers, replaces)


def csv_cells(values: Any, quote: bool = True) -> list[Any]:
    """One column's cells as pandas' `DataFrame.to_csv` (na_rep "", no float_format) writes them
    (pandas.core.indexes.base.get_values_for_csv, then csv.writer, QUOTE_MINIMAL): float64 by
    Python's repr, the shortest round-trip string, which is the text of numpy's `astype(str)` that
    pandas calls (tests/test_outputs.py), other floats by `astype(str)`, NaN blank; integers and
    booleans as `str` writes them; strings (quoted as csv.writer quotes them, unless `quote` is
    False), None and NaN blank. Other dtypes (dates, complex) are not needed here: ValueError."""
    import numpy as np

    values = np.asarray(values)
    kind = values.dtype.kind
    if kind == "f":
        cells = list(map(repr, values.tolist())) if values.dtype == np.float64 else values.astype(str).tolist()
        for i in np.flatnonzero(np.isnan(values)).tolist():
            cells[i] = ""
        return cells
    if kind in "iub":
        return list(map(str, values.tolist()))
    if kind in "OU":
        cells = ["" if v is None or (isinstance(v, float) and v != v) else v for v in values.tolist()]
        if not quote:
            return cells
        quoted = {v: _csv_field(v) for v in set(cells)}  # few distinct values (status, reasons)
        return [quoted[v] for v in cells]
    raise ValueError(f"no CSV cells for dtype {values.dtype}")


def _csv_writer(handle: Any) -> Any:
    """pandas' csv.writer for `to_csv` (pandas.io.formats.csvs.CSVFormatter)."""
    return csv.writer(handle, lineterminator=os.linesep, quoting=csv.QUOTE_MINIMAL)


def _csv_field(value: Any) -> str:
    """`value` as csv.writer writes it in a row of several fields (quoted when it holds a comma,
    a quote or a line end), asked of csv.writer itself."""
    buffer = io.StringIO()
    _csv_writer(buffer).writerow([value, ""])
    return buffer.getvalue()[: -1 - len(os.linesep)]  # less the empty last field and the line end


def write_csv(path: Path, columns: Mapping[str, Any], append: bool = False) -> None:
    """Write (or append, without the header) equal-length columns as CSV, byte for byte what
    `pandas.DataFrame(columns).to_csv(path, index=False)` writes, without importing pandas
    (~0.5 s, more than a small run's whole start-up). Each cell is formatted once (`csv_cells`)
    and rows are joined with "," (4x faster than csv.writer's per-cell checks); a one-column
    table goes through csv.writer, which quotes a row's lone empty cell."""
    if len(columns) < 2:
        with open(path, "a" if append else "w", encoding="utf-8", newline="") as handle:
            writer = _csv_writer(handle)
            if not append:
                writer.writerow(list(columns))
            writer.writerows(zip(*[csv_cells(v, quote=False) for v in columns.values()], strict=True))
        return
    cells = [csv_cells(values) for values in columns.values()]
    with open(path, "a" if append else "w", encoding="utf-8", newline="") as handle:
        if not append:
            handle.write(",".join(_csv_field(str(name)) for name in columns) + os.linesep)
        rows = map(",".join, zip(*cells, strict=True))
        for chunk in iter(lambda: list(islice(rows, 1 << 16)), []):
            handle.write(os.linesep.join(chunk) + os.linesep)


class Staging:
    """The new folder of one all-or-nothing write, opened before the work so that files can be
    written into it as the work goes (`append_csv`: rows streamed by a long run). `commit`
    writes the remaining files, carries over the old folder's other entries and swaps the new
    folder in; leaving the `with` block without a commit (an error, an interrupt) removes it
    and leaves the old folder untouched."""

    def __init__(self, out_dir: Path, names: Iterable[str]) -> None:
        self.out_dir = out_dir
        self.target = check_out_folder(out_dir, names)  # creates nothing
        self.made = missing_parents(self.target.parent)  # made on entry, removed if nothing is swapped in
        self.path = _fresh_name(self.target.parent, _staging_prefix(self.target.name))
        self.committed = False
        self.written: set[str] = set()  # files already complete or being streamed here

    def __enter__(self) -> Staging:
        """Make the staging folder (and the folders missing above it). Everything is named before
        it is made, so an interrupt at any moment here leaves nothing behind either."""
        try:
            make_parents(self.target.parent, self.made)
            remove_stale(self.target.parent, self.target.name)
            os.mkdir(self.path, 0o700)
            give_mode(self.path, self.target, 0o777)
        except BaseException as exc:
            self.__exit__(None, None, None)
            if isinstance(exc, OSError):
                raise KvsimError(f"cannot write to {self.out_dir}: {_why(exc)}") from None
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        shutil.rmtree(self.path, ignore_errors=True)  # after a commit: the old folder
        if not self.committed:
            remove_made(self.made)

    def append_csv(self, name: str, columns: dict) -> None:
        """Append rows (a mapping of equal-length columns) to `name`, with the header first."""
        first = name not in self.written
        self.written.add(name)
        try:
            write_csv(self.path / name, columns, append=not first)
        except OSError as exc:
            raise KvsimError(f"cannot write to {self.out_dir}: {_why(exc)}; nothing was written") from None

    def commit(self, writers: dict[str, Callable[[Path], None]], replaces: Iterable[str] = ()) -> list[Path]:
        """Write the files not streamed yet, then swap the folder in (see `write_files`); the old
        folder's entries named in `replaces` (an earlier result's files this one does not write)
        are not carried over."""
        target, staging = self.target, self.path
        moved: list[str] = []
        names = set(writers) | self.written
        try:
            for name, write in writers.items():
                if name not in self.written:
                    write(staging / name)
            moved = _carry_over(target, staging, names | set(replaces))
            _swap(staging, target)
            self.committed = True
        except OSError as exc:
            for name in moved:  # folders carried over by rename go back
                with contextlib.suppress(OSError):
                    os.rename(staging / name, target / name)
            raise KvsimError(f"cannot write to {self.out_dir}: {_why(exc)}; nothing was written") from None
        return [target / name for name in dict.fromkeys([*writers, *sorted(self.written)])]


def _carry_over(old: Path, new: Path, written: set[str]) -> list[str]:
    """Entries of the old folder that this write does not replace: files hard-linked (copied
    across filesystems), folders renamed (returned, so a failed swap can move them back)."""
    moved = []
    if not old.is_dir():
        return moved
    for entry in os.scandir(old):
        if entry.name in written:
            continue
        src, dst = old / entry.name, new / entry.name
        if entry.is_dir(follow_symlinks=False):
            os.rename(src, dst)
            moved.append(entry.name)
        elif entry.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
    return moved


def _swap(new: Path, target: Path) -> None:
    """Put `new` at `target`; afterwards `new` holds the old folder (or nothing)."""
    if not target.exists():
        os.rename(new, target)
        return
    if _exchange(new, target):
        return
    backup = _fresh_name(target.parent, _staging_prefix(target.name) + "old-")
    os.rename(target, backup)
    try:
        os.rename(new, target)
    except OSError:
        os.rename(backup, target)
        raise
    os.rename(backup, new)  # removed by the caller with the staging folder


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2); False where the call is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False  # the filesystem or kernel cannot exchange: fall back to two renames
    raise OSError(err, os.strerror(err))
