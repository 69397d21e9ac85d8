"""Turn every user mistake into one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import errno
import os
import sys

from typer import _click as click  # typer >= 0.29 vendors click (pinned in pyproject.toml)
from typer.core import TyperGroup
from typer.exceptions import Abort

from kvsim.cli.coercion import install
from kvsim.cli.main import INTERRUPTED_EXIT, interrupted
from kvsim.simcore.errors import KvsimError
from kvsim.simcore.userfiles import RefusedFile, RefusedFolder

# A path given on the command line or in a file that the OS refuses to look at: a user error.
_BAD_PATH = (errno.ENAMETOOLONG, errno.ELOOP)
# Standard output (or any file not written through reports.files) refused the bytes.
_CANNOT_WRITE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)
USER_ERROR_EXIT = 2  # bad input: refused before any work
EMPTY_RESULT_EXIT = 1  # the run finished but served nothing: its numbers mean nothing


def fail(message: str, code: int = USER_ERROR_EXIT) -> None:
    """Print one line to stderr and exit (2 for a user error)."""
    click.echo(f"kvsim: error: {message}", err=True)
    sys.exit(code)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what could not be written
    does not print a second error."""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 (the very write that failed)
        pass
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except Exception:  # noqa: BLE001 (no real file descriptor: a test runner's stdout)
        pass


def _usable_streams() -> None:
    """A path the user gave in bytes that are not UTF-8 (kept by Python as lone surrogates) is
    printed escaped, as stderr prints it, rather than ending a finished command with a
    UnicodeEncodeError: stdout is strict under most UTF-8 locales (en_US.UTF-8; the C locale
    already escapes). A closed stderr (`2>&-`: Python's sys.stderr is None) takes the notes and
    progress to /dev/null, rather than the first of them ending the run before its result."""
    if sys.stderr is None:
        try:
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
        except OSError:
            pass
    stream = sys.stdout
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (ValueError, OSError, AttributeError):  # a stream that cannot change: left as it is
            pass


class _Interrupted(BaseException):
    """A Ctrl-C carried past typer, which would turn it into a silent `Exit(130)`."""


class OneLineErrorsGroup(TyperGroup):
    """Root command group that reports usage and domain errors as one stderr line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        install(self)  # option values converted without importing pydantic where that is plain

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted() from None

    def main(self, *args, standalone_mode: bool = True, **kwargs):  # noqa: D401
        _usable_streams()
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except (_Interrupted, KeyboardInterrupt):
            interrupted()
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            sys.exit(0)
        except click.exceptions.UsageError as exc:
            # click's parser raises "Option '--x' requires an argument." without a context: no
            # command to name then (a "kvsim: " here read "kvsim: error: kvsim: Option ...")
            fail(f"{exc.ctx.command_path}: {exc.format_message()}" if exc.ctx else exc.format_message())
        except Abort:
            interrupted()
        except click.exceptions.ClickException as exc:
            fail(exc.format_message())
        except KvsimError as exc:
            fail(str(exc))
        except MemoryError as exc:  # the machine, not the input: one line, exit 1
            detail = str(exc).removeprefix("kvsim: ")
            fail(f"out of memory{': ' + detail if detail else ''} (fewer requests, or a machine with more memory)", 1)
        except BrokenPipeError:
            sys.exit(1)
        except (RefusedFile, RefusedFolder) as exc:  # a reader that did not word it: the file and the reason
            fail(f"{exc.filename}: {exc}")
        except OSError as exc:
            if exc.errno in _BAD_PATH:
                fail(f"{exc.filename}: {exc.strerror}")  # a path the user gave cannot even be looked at
            if exc.errno not in _CANNOT_WRITE:
                raise
            _drop_stdout()  # e.g. `kvsim run > /dev/full`: say it once, not again when Python exits
            fail(f"cannot write the output ({exc.strerror})")
        if rv == INTERRUPTED_EXIT:  # typer's Exit(130): a Ctrl-C while the command line was parsed
            interrupted()
        sys.exit(rv if isinstance(rv, int) else 0)
