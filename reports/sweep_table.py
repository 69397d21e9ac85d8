"""The sweep's output table: a CSV that grows one row per finished point, and can be resumed;
or a Parquet file (`--out x.parquet`, needs pyarrow), whose rows grow in a hidden CSV journal beside
it (`.x.parquet.rows.csv`, the same append-and-fsync file) and become the Parquet file, written
atomically, once every point is in; `--resume` reads the journal, or the finished Parquet file.

Each row is appended, flushed and fsynced as its point finishes, so a killed sweep keeps every
point it finished (at most the row being written is cut short; resuming drops that tail). Rows
carry `point_id` (what the point is) and `sweep_id` (what the whole sweep is: every point of it);
resuming reads the ids back, refuses a table whose `sweep_id` differs (a table made with other
options), and runs only the points whose ids are missing. Rows are in finishing order while the
sweep runs; once every point is in, `finish` rewrites the table in grid order (`point`, then
`seed`) with one column order, so a sweep writes the same file whatever its `--jobs`, executor or
interruptions (only `wall_s` differs).

One sweep writes a table at a time: `open` takes an exclusive `flock` on a lock file beside it
(`.NAME.lock`, removed by `close`) and holds it until the sweep ends, so a second sweep on the
same `--out` is refused at once instead of mixing its rows in or losing them; a temporary file
is named uniquely (pid and random), never by a fixed name another writer could share.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import math
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.simcore.errors import ConfigError, KvsimError


def sweep_id_of(point_ids: Iterable[str]) -> str:
    """The id of a whole sweep: its set of point ids (so any other option or grid differs)."""
    return hashlib.sha256("\n".join(sorted(point_ids)).encode()).hexdigest()[:16]


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, float):
        return repr(value)  # round-trips exactly
    # a file name that is not UTF-8 (a workload path's undecodable bytes, as surrogates) is written
    # escaped (t\udcff.csv): the table stays UTF-8 and readable
    return str(value).replace("\r", " ").replace("\n", " ").encode("utf-8", "backslashreplace").decode("utf-8")


def _line(values: list[Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(v) for v in values])
    return buf.getvalue()


def has_pyarrow() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyarrow") is not None


class SweepTable:
    """Append-only CSV of sweep rows. `open()` first; then `append(row)` per finished point.
    `target` is the file the user named; `path` the CSV the rows are appended to (the same file,
    or a Parquet target's journal)."""

    def __init__(self, path: Path) -> None:
        suffix = path.suffix.lower()
        if suffix not in (".csv", ".parquet"):
            raise ConfigError(f"--out {path}: give a .csv or .parquet file")
        if suffix == ".parquet" and not has_pyarrow():
            raise ConfigError(f"--out {path}: writing Parquet needs pyarrow (pip install pyarrow), or give a .csv file")
        if path.is_symlink():  # the table goes where the link points, as `>` writes through it; the link stays
            path = Path(os.path.realpath(path))  # (the rows went through it and the finished table over it)
        self.target = path
        self.parquet = suffix == ".parquet"
        self.path = path.with_name(f".{path.name}.rows.csv") if self.parquet else path
        self.columns: list[str] = []  # the header as written; grows (file rewritten) if a row adds keys
        self._lock_fd = -1
        self._lock_path = path.with_name(f".{path.name}.lock")
        self._created: list[Path] = []  # what `open` made (the table, folders): removed if the sweep adds no row
        self._rows = 0

    def open(self, sweep_id: str, resume: bool) -> set[str]:
        """Lock and start the table (or, with resume, check it and return the point ids it
        already holds). Call `close` when the sweep ends, however it ends."""
        try:
            return self._open(sweep_id, resume)
        except OSError as exc:
            self.close()
            raise KvsimError(f"cannot write to {self.path}: {exc.strerror or exc}") from None
        except BaseException:
            self.close()
            raise

    def _open(self, sweep_id: str, resume: bool) -> set[str]:
        self._make_parents()
        self._lock()  # before the existence checks: they and the creation are one step for other sweeps
        from kvsim.reports.files import remove_stale

        remove_stale(self.path.parent, self.path.name)  # temporary files of a sweep killed mid-rewrite
        exists = self.path.exists() and self.path.stat().st_size > 0
        if self.parquet and self.target.exists():
            if not resume:
                raise ConfigError(f"--out {self.target} exists; add --resume to finish that sweep, or remove it")
            if not exists:  # a finished sweep: its rows become the journal again
                self._created.insert(0, self.path)  # removed again if they are refused below
                self._journal_from_parquet()
                exists = True
        if exists and not resume:
            raise ConfigError(f"--out {self.target} exists (its rows so far: {self.path}); add --resume to finish "
                              "that sweep, or remove it" if self.parquet else
                              f"--out {self.path} exists; add --resume to finish that sweep, or remove it")
        if not exists:
            if not self.path.exists():
                self._created.insert(0, self.path)  # named first: an interrupt after the open still removes it
            with open(self.path, "w"):
                pass
            return set()
        try:
            rows = self._read_rows()  # checked before the partial line is cut: a wrong file stays as it was
        except ConfigError as exc:
            if self.path not in self._created:
                raise
            # the journal was made from the user's Parquet file just now: name that file, not the journal
            raise ConfigError(str(exc).replace(str(self.path), f"{self.target} (its rows as CSV)")) from None
        self._drop_partial_line()
        other = {r.get("sweep_id") for r in rows} - {sweep_id}
        if other:
            raise ConfigError(
                f"--resume: {self.path} was made by a sweep with other options or another grid "
                f"(sweep_id {sorted(o or '?' for o in other)[0]}, this sweep is {sweep_id}); "
                "give the same options or another --out"
            )
        self._rows = len(rows)
        return {r["point_id"] for r in rows}

    def _make_parents(self) -> None:
        from kvsim.reports.files import make_parents, missing_parents

        missing = missing_parents(self.path.parent)
        self._created += missing  # deepest first (the table, if made, goes before them)
        make_parents(self.path.parent, missing)

    def _lock(self) -> None:
        """Hold an exclusive lock on `.NAME.lock` for the life of the sweep; another sweep (another
        process) on the same table is refused with a clear line."""
        import fcntl

        while True:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            self._lock_fd = fd  # from here `close` releases it (and removes the file only if it held it)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._lock_fd = -1
                os.close(fd)
                raise ConfigError(
                    f"--out {self.target}: another kvsim sweep is writing this table now; wait for it to "
                    "finish (then --resume), or give another --out"
                ) from None
            try:  # the holder before us may have removed the file after we opened it: lock the one there now
                same = os.path.samestat(os.fstat(fd), os.stat(self._lock_path))
            except FileNotFoundError:
                same = False
            if same:
                return
            self._lock_fd = -1
            os.close(fd)

    def close(self) -> None:
        """Release the table: a table (and folders) this sweep created but never wrote a row to
        is removed, so a refused or interrupted sweep leaves nothing; then the lock goes."""
        if self._lock_fd < 0:
            return
        import fcntl

        fd, self._lock_fd = self._lock_fd, -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held already (a no-op), or free: ours to remove
        except OSError:  # another sweep holds it (we were interrupted before locking): leave its file
            os.close(fd)
            return
        if self._rows == 0:
            for made in self._created:
                with contextlib.suppress(OSError):
                    made.rmdir() if made.is_dir() else made.unlink()
        with contextlib.suppress(OSError):
            os.unlink(self._lock_path)  # while still holding it: a waiting opener sees a new file
        os.close(fd)

    def _journal_from_parquet(self) -> None:
        """Write a finished Parquet table's rows as the CSV journal (cells as `_cell` writes them)."""
        frame = _read_parquet(self.target, "--resume: ")
        columns = [str(c) for c in frame.columns]
        self._replace_with(columns, ([None if _missing(v) else (v.item() if hasattr(v, "item") else v) for v in row]
                                     for row in frame.itertuples(index=False, name=None)))

    def _drop_partial_line(self) -> None:
        """A kill mid-write leaves a last line without its newline: cut it off."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def _read_rows(self) -> list[dict[str, str]]:
        """The complete rows (a last line without its newline is the cut-short row: left out)."""
        from kvsim.simcore.userfiles import read_bytes

        try:
            text = read_bytes(self.path, "sweep table").decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--resume: {self.path} is not a kvsim sweep table ({exc})") from None
        text = text[: text.rfind("\n") + 1]
        try:
            lines = list(csv.reader(io.StringIO(text, newline="")))
        except csv.Error as exc:
            raise ConfigError(f"--resume: {self.path} is not a kvsim sweep table ({exc})") from None
        self.columns = lines[0] if lines else []
        if self.columns and not {"point", "seed", "point_id", "sweep_id"} <= set(self.columns):
            raise ConfigError(f"--resume: {self.path} is not a kvsim sweep table (no point / seed / point_id / sweep_id)")
        check_rows(self.path, self.columns, lines[1:], "--resume: ")
        return [dict(zip(self.columns, line, strict=True)) for line in lines[1:]]

    def append(self, row: dict[str, Any]) -> None:
        """Write one row now (flushed and fsynced), widening the header first if it has new keys."""
        try:
            new = [k for k in row if k not in self.columns]
            if new:
                self._widen(self.columns + new)
            with self.path.open("a", newline="") as f:
                f.write(_line([row.get(c) for c in self.columns]))
                f.flush()
                os.fsync(f.fileno())
            self._rows += 1
        except OSError as exc:
            raise KvsimError(f"cannot write to {self.path}: {exc.strerror or exc}") from None

    def finish(self, column_order: list[str] | None = None) -> None:
        """Rewrite the complete table in grid order, columns in `column_order` (those it names
        first, the rest as they are), atomically: a temporary sibling renamed over the table."""
        try:
            with self.path.open(newline="", encoding="utf-8-sig") as f:  # a BOM a user's editor added
                lines = list(csv.reader(f))
            if not lines:
                return
            header, body = lines[0], lines[1:]
            at = {name: i for i, name in enumerate(header)}
            first = [c for c in (column_order or []) if c in at]
            columns = first + [c for c in header if c not in set(first)]
            body = [r + [""] * (len(header) - len(r)) for r in body]
            if "point_id" in at:  # a row given twice (a table edited, or two writers of old): kept once
                body = list({r[at["point_id"]]: r for r in reversed(body)}.values())[::-1]  # the first of each
            body.sort(key=lambda r: (int(r[at["point"]]), int(r[at["seed"]])))
            self._replace_with(columns, ([r[at[c]] for c in columns] for r in body))
            self.columns = columns
            if self.parquet:
                self._write_parquet()
        except OSError as exc:
            raise KvsimError(f"cannot write to {self.target}: {exc.strerror or exc}") from None

    def _write_parquet(self) -> None:
        """The complete journal as the Parquet target (a temporary sibling renamed over it), then
        the journal goes: the Parquet file now holds every row."""
        frame = read_table(self.path)
        tmp = self.target.with_name(f".{self.target.name}.kvsim-{os.getpid()}-{secrets.token_hex(6)}")
        try:
            with open(tmp, "wb") as f:  # a handle, not the path: pyarrow cannot encode a non-UTF-8 name
                frame.to_parquet(f, index=False)
            os.replace(tmp, self.target)
        finally:
            tmp.unlink(missing_ok=True)
        self.path.unlink(missing_ok=True)

    def _widen(self, columns: list[str]) -> None:
        """Rewrite the file under a wider header (rare: the first rows did not run, or resuming)."""
        rows = []
        if self.columns:
            with self.path.open(newline="", encoding="utf-8-sig") as f:
                rows = list(csv.reader(f))[1:]
        self._replace_with(columns, (r + [None] * (len(columns) - len(r)) for r in rows))
        self.columns = columns

    def _replace_with(self, columns: list[str], rows: Iterable[list[Any]]) -> None:
        """Write header and rows to a temporary sibling, fsync, rename it over the table; on a
        failure the table is as it was and the sibling is removed."""
        tmp = self.path.with_name(f".{self.path.name}.kvsim-{os.getpid()}-{secrets.token_hex(6)}")  # a unique name
        try:
            with open(tmp, "x", newline="") as f:
                f.write(_line(columns))
                for r in rows:
                    f.write(_line(r))
                f.flush()
                os.fsync(f.fileno())
            from kvsim.reports.files import give_mode

            give_mode(tmp, self.path, 0o666)  # mkstemp-like 0600 would make the table private
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)


# Columns the reports compute with (config and metrics): a cell there is empty or a number.
NUMERIC_COLUMNS = (
    "point", "seed", "block_size", "gpu_memory_utilization", "max_num_seqs", "tensor_parallel_size",
    "data_parallel_size", "pipeline_parallel_size", "rate", "concurrency", "gpus", "kv_cache_tokens",
    "output_throughput", "median_ttft_ms", "p95_ttft_ms", "median_tpot_ms", "p95_tpot_ms", "kv_waste_rate",
    "num_preemptions", "slo_ttft_p95_ms", "slo_tpot_p95_ms", "wall_s",
)
# The engine options every point records (the heatmaps' axes): a cell there is never empty.
REQUIRED_COLUMNS = ("point", "seed", "block_size", "gpu_memory_utilization", "max_num_seqs", "tensor_parallel_size",
                    "data_parallel_size", "pipeline_parallel_size")
# The largest seed: cli.options.MAX_SEED (seeds go through float64 here, exact up to 2**53).
MAX_TABLE_SEED = 2**53


# a cell's largest magnitude: past any rate, count or latency a run records (spans end at 1e9 s = 1e12 ms)
MAX_CELL = 1e15
# vLLM's percentile spelling (simcore.metrics.p_word: str of a float), so "p1e-07" for --slo ttft:p0.0000001
_PERCENTILE_COLUMN = re.compile(r"p\d+(\.\d+)?(e[+-]?\d+)?_(ttft|tpot|itl|e2el)_ms")


def _numeric(name: str) -> bool:
    """A column the reports compute with: NUMERIC_COLUMNS, the percentiles an --slo adds
    (p99_ttft_ms), and the ends of an --error-bars band (p95_ttft_ms_band_low)."""
    base = name.removesuffix("_band_low").removesuffix("_band_high")
    return base in NUMERIC_COLUMNS or bool(_PERCENTILE_COLUMN.fullmatch(base))


def check_rows(path: Path, header: list[str], rows: list[list[str]], prefix: str = "", where_name: str = "line",
               first: int = 2) -> None:
    """A table edited or cut short by hand is refused with its line named, before any work: a
    column named twice, a row with more or fewer cells than the header, a point or seed that is
    not a whole number, an engine option left empty, or text where the reports need a number.
    `where_name` / `first`: how a row is named (a CSV's line 2, a Parquet table's row 1)."""
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise ConfigError(f"{prefix}{path}: column {name!r} is given twice")
        seen.add(name)
    where = {name: i for i, name in enumerate(header) if _numeric(name)}
    for number, row in enumerate(rows, start=first):
        if len(row) != len(header):
            raise ConfigError(f"{prefix}{path}, {where_name} {number}: {len(row)} cells, the header has "
                              f"{len(header)} (a table cut short or edited?)")
        for name, i in where.items():
            cell = row[i].strip()
            required = name in REQUIRED_COLUMNS
            if not cell and not required:
                continue
            try:
                value = float(cell)
            except ValueError:
                value = math.nan
            whole = name not in ("point", "seed") or (math.isfinite(value) and value.is_integer() and value >= 0)
            high = MAX_TABLE_SEED if name == "seed" else MAX_CELL
            # NaN is written for a metric with no value; a negative, an infinity or a number past MAX_CELL no
            # run writes (rates, sizes, latencies, counts: the figures raised on them after the table was read)
            if not whole or (cell.lower() != "nan" or required if math.isnan(value) else not 0 <= value <= high):
                kind = "a whole number >= 0" if name in ("point", "seed") else f"a number from 0 to {high:g}"
                shown = cell if len(cell) <= 40 else cell[:37] + "..."
                raise ConfigError(f"{prefix}{path}, {where_name} {number}: {name} is {shown!r}, expected {kind}")


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _read_parquet(path: Path, prefix: str = "") -> pd.DataFrame:
    if not has_pyarrow():
        raise ConfigError(f"{prefix}{path}: reading Parquet needs pyarrow (pip install pyarrow)")
    from kvsim.simcore.userfiles import check_regular

    try:
        check_regular(path, "sweep table")  # a FIFO or /dev/zero: refused before pyarrow reads it
        with open(path, "rb") as f:  # a handle, not the path: pyarrow cannot encode a non-UTF-8 name
            frame = pd.read_parquet(f)
    except FileNotFoundError:
        raise ConfigError(f"{prefix}{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{prefix}{path}: cannot read the table ({exc.strerror or str(exc).splitlines()[0]})") from None
    except Exception as exc:  # noqa: BLE001 - pyarrow raises its own errors for a file that is not Parquet
        raise ConfigError(f"{prefix}{path}: not a readable Parquet table ({str(exc).splitlines()[0][:200]})") from None
    if not {"point", "point_id", "seed", "sweep_id"} <= set(frame.columns):
        raise ConfigError(f"{prefix}{path}: not a kvsim sweep table (no point / point_id / seed / sweep_id columns)")
    # the cells a CSV table's are checked as (a negative, infinite or text metric drew nonsense or raised)
    header = [str(c) for c in frame.columns]
    check_rows(path, header, [[_cell(v.item() if hasattr(v, "item") else v) for v in row]
                              for row in frame.itertuples(index=False, name=None)], prefix, "row", 1)
    for name in header:  # numbers stored as text (a cell of "4"): numbers, as a CSV table reads them
        if _numeric(name) and not pd.api.types.is_numeric_dtype(frame[name]):
            frame[name] = pd.to_numeric(frame[name])
    return frame


def read_table(path: Path) -> pd.DataFrame:
    """A sweep table (CSV, or Parquet) as a DataFrame in grid order (then by seed)."""
    if Path(path).suffix.lower() == ".parquet":
        frame = _read_parquet(Path(path))
        return frame.sort_values(["point", "seed"], kind="stable").reset_index(drop=True)
    from kvsim.simcore.userfiles import check_regular

    try:
        check_regular(path, "sweep table")  # a FIFO or /dev/zero: refused before pandas or csv reads it
        with open(path, encoding="utf-8-sig", newline="") as f:
            lines = list(csv.reader(f))
        if lines:
            check_rows(path, lines[0], lines[1:])
        # "n/a" is a value here (a run's `load` that could not be judged), not a missing one
        frame = pd.read_csv(path, encoding="utf-8-sig", keep_default_na=False, na_values=["", "nan", "NaN"])
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{path}: not a readable CSV table ({str(exc).splitlines()[0]})") from None
    except OSError as exc:  # a folder, no permission
        raise ConfigError(f"{path}: cannot read the table ({exc.strerror or exc})") from None
    if not {"point", "point_id", "seed"} <= set(frame.columns):
        raise ConfigError(f"{path}: not a kvsim sweep table (no point / point_id / seed columns)")
    return frame.sort_values(["point", "seed"], kind="stable").reset_index(drop=True)
