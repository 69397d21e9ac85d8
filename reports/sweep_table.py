"""The sweep's output table: a CSV that grows one row per finished point, and can be resumed.

Each row is appended, flushed and fsynced as its point finishes, so a killed sweep keeps every
point it finished (at most the row being written is cut short; resuming drops that tail). Rows
carry `point_id` (what the point is) and `sweep_id` (what the whole sweep is: every point of it);
resuming reads the ids back, refuses a table whose `sweep_id` differs (a table made with other
options), and runs only the points whose ids are missing. Rows are in finishing order while the
sweep runs; once every point is in, `finish` rewrites the table in grid order (`point`, then
`seed`) with one column order, so a sweep writes the same file whatever its `--jobs`, executor or
interruptions (only `wall_s` differs).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from simcore.errors import ConfigError, KvsimError


def sweep_id_of(point_ids: Iterable[str]) -> str:
    """The id of a whole sweep: its set of point ids (so any other option or grid differs)."""
    return hashlib.sha256("\n".join(sorted(point_ids)).encode()).hexdigest()[:16]


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, float):
        return repr(value)  # round-trips exactly
    return str(value).replace("\r", " ").replace("\n", " ")


def _line(values: list[Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(v) for v in values])
    return buf.getvalue()


class SweepTable:
    """Append-only CSV of sweep rows. `open()` first; then `append(row)` per finished point."""

    def __init__(self, path: Path) -> None:
        if path.suffix.lower() != ".csv":
            raise ConfigError(f"--out {path}: give a .csv file")
        self.path = path
        self.columns: list[str] = []  # the header as written; grows (file rewritten) if a row adds keys

    def open(self, sweep_id: str, resume: bool) -> set[str]:
        """Start the table (or, with resume, check it and return the point ids it already holds)."""
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume:
            raise ConfigError(f"--out {self.path} exists; add --resume to finish that sweep, or remove it")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not exists:
                self.path.write_text("")
                return set()
            self._drop_partial_line()
            rows = self._read_rows()
        except OSError as exc:
            raise KvsimError(f"cannot write to {self.path}: {exc.strerror or exc}") from None
        other = {r.get("sweep_id") for r in rows} - {sweep_id}
        if other:
            raise ConfigError(
                f"--resume: {self.path} was made by a sweep with other options or another grid "
                f"(sweep_id {sorted(o or '?' for o in other)[0]}, this sweep is {sweep_id}); "
                "give the same options or another --out"
            )
        return {r["point_id"] for r in rows}

    def _drop_partial_line(self) -> None:
        """A kill mid-write leaves a last line without its newline: cut it off."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def _read_rows(self) -> list[dict[str, str]]:
        with self.path.open(newline="") as f:
            reader = csv.DictReader(f)
            self.columns = list(reader.fieldnames or [])
            rows = list(reader)
        if self.columns and not {"point_id", "sweep_id"} <= set(self.columns):
            raise ConfigError(f"--resume: {self.path} is not a kvsim sweep table (no point_id / sweep_id)")
        return rows

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
        except OSError as exc:
            raise KvsimError(f"cannot write to {self.path}: {exc.strerror or exc}") from None

    def finish(self, column_order: list[str] | None = None) -> None:
        """Rewrite the complete table in grid order, columns in `column_order` (those it names
        first, the rest as they are), atomically: a temporary sibling renamed over the table."""
        try:
            with self.path.open(newline="") as f:
                lines = list(csv.reader(f))
            if not lines:
                return
            header, body = lines[0], lines[1:]
            at = {name: i for i, name in enumerate(header)}
            first = [c for c in (column_order or []) if c in at]
            columns = first + [c for c in header if c not in set(first)]
            body = [r + [""] * (len(header) - len(r)) for r in body]
            body.sort(key=lambda r: (int(r[at["point"]]), int(r[at["seed"]])))
            self._replace_with(columns, ([r[at[c]] for c in columns] for r in body))
        except OSError as exc:
            raise KvsimError(f"cannot write to {self.path}: {exc.strerror or exc}") from None
        self.columns = columns

    def _widen(self, columns: list[str]) -> None:
        """Rewrite the file under a wider header (rare: the first rows did not run, or resuming)."""
        rows = []
        if self.columns:
            with self.path.open(newline="") as f:
                rows = list(csv.reader(f))[1:]
        self._replace_with(columns, (r + [None] * (len(columns) - len(r)) for r in rows))
        self.columns = columns

    def _replace_with(self, columns: list[str], rows: Iterable[list[Any]]) -> None:
        """Write header and rows to a temporary sibling, fsync, rename it over the table; on a
        failure the table is as it was and the sibling is removed."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            with tmp.open("w", newline="") as f:
                f.write(_line(columns))
                for r in rows:
                    f.write(_line(r))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)


def read_table(path: Path) -> pd.DataFrame:
    """A sweep table as a DataFrame in grid order (then by seed)."""
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable CSV table ({str(exc).splitlines()[0]})") from None
    except OSError as exc:  # a folder, no permission
        raise ConfigError(f"{path}: cannot read the table ({exc.strerror or exc})") from None
    if not {"point", "point_id", "seed"} <= set(frame.columns):
        raise ConfigError(f"{path}: not a kvsim sweep table (no point / point_id / seed columns)")
    return frame.sort_values(["point", "seed"], kind="stable").reset_index(drop=True)
