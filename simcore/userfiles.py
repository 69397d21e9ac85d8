"""Every file kvsim reads on a user's behalf, read with a bound: a regular file, and not too big.

`open(path).read()` on `/dev/zero` (or a profile symlinked to it) reads until memory runs out, and
on a named pipe waits forever for a writer. `read_bytes` opens without blocking, checks with
`fstat` on the open descriptor (no window between the check and the read) that the file is a
regular one, and reads at most the cap of its kind plus one byte: a file past its cap is refused
before it costs the memory. The caps are far above any real file of the kind (the largest
committed profile is 93 KB, a Hugging Face config.json a few KB, the Azure conversation trace
0.7 MB) and far below what a machine cannot hold.
"""

from __future__ import annotations

import errno
import os
import stat

MiB = 1 << 20
CAPS = {
    "profile": 32 * MiB,  # a calibrated profile carries its per-row residuals (10,000 rows at most)
    "model config": 4 * MiB,
    "workload file": 4 * MiB,
    "price file": 4 * MiB,
    "measurements file": 16 * MiB,  # profiles/calibrate.py reads at most 10,000 rows
    "trace": 1024 * MiB,  # ~25M rows of arrival, prompt and output lengths
    "sweep table": 256 * MiB,
    "dataset": 2048 * MiB,  # --dataset-path: the ShareGPT JSON vllm bench serve reads is several hundred MB
}
_KINDS = {
    stat.S_IFDIR: "a folder", stat.S_IFIFO: "a named pipe", stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket",
}


class RefusedFolder(IsADirectoryError):
    """A folder where a file is read: an IsADirectoryError whose text is the reason alone."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(errno.EISDIR, "is a folder, not a file", os.fspath(path))

    def __str__(self) -> str:
        return "is a folder, not a file"


class RefusedFile(OSError):
    """A path that exists but is no file kvsim may read (not a regular file, or past its cap).
    An OSError, so each reader's `except OSError` words it with its own file and field; its text
    is the reason alone."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(errno.EINVAL, reason, os.fspath(path))
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= 10 * MiB else f"{n / MiB:.2g} MiB"


def read_bytes(path: str | os.PathLike[str], kind: str) -> bytes:
    """The bytes of the regular file `path`, at most CAPS[kind] of them; else RefusedFile (or the
    OSError the OS gave: FileNotFoundError, PermissionError...)."""
    cap = CAPS[kind]
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO: opened, not waited on
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = _KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
            if stat.S_ISDIR(st.st_mode):
                raise RefusedFolder(path)
            raise RefusedFile(path, f"not a regular file: {what}")
        if st.st_size > cap:
            raise RefusedFile(path, f"{_mib(st.st_size)} is larger than the {_mib(cap)} kvsim reads from a {kind}")
        with os.fdopen(fd, "rb", closefd=True) as handle:
            fd = -1
            data = handle.read(cap + 1)  # a file growing while read stops here too
        if len(data) > cap:
            raise RefusedFile(path, f"larger than the {_mib(cap)} kvsim reads from a {kind}")
        return data
    finally:
        if fd >= 0:
            os.close(fd)


def read_text(path: str | os.PathLike[str], kind: str, encoding: str = "utf-8") -> str:
    """`read_bytes` decoded (UnicodeDecodeError for bytes that are not `encoding`)."""
    return read_bytes(path, kind).decode(encoding)


def check_regular(path: str | os.PathLike[str], kind: str) -> os.stat_result:
    """Stat `path` (following links) and refuse what `read_bytes` would refuse, without reading:
    for readers that hand the path to a library (pandas)."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise RefusedFolder(path)
    if not stat.S_ISREG(st.st_mode):
        raise RefusedFile(path, f"not a regular file: {_KINDS.get(stat.S_IFMT(st.st_mode), 'a special file')}")
    if st.st_size > CAPS[kind]:
        raise RefusedFile(path, f"{_mib(st.st_size)} is larger than the {_mib(CAPS[kind])} kvsim reads from a {kind}")
    return st


def is_special(path: str | os.PathLike[str]) -> bool:
    """`path` exists (following links) and is neither a regular file nor a folder."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


__all__ = ["CAPS", "RefusedFile", "RefusedFolder", "check_regular", "is_special", "read_bytes", "read_text", "shown"]


def shown(text: str) -> str:
    """A file name as text that can be printed and written as UTF-8: bytes that are not UTF-8
    (which Python keeps in a path as lone surrogates) appear escaped, `t\\udcff.csv`. For names
    derived from a path (a workload's), never for the path that opens the file."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
