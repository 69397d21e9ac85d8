"""Turn every user mistake into one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import errno
import sys

from typer import _click as click  # typer >= 0.29 vendors click (pinned in pyproject.toml)
from typer.core import TyperGroup
from typer.exceptions import Abort

from cli.coercion import install
from simcore.errors import KvsimError

# A path given on the command line or in a file that the OS refuses to look at: a user error.
_BAD_PATH = (errno.ENAMETOOLONG, errno.ELOOP)
USER_ERROR_EXIT = 2  # bad input: refused before any work
EMPTY_RESULT_EXIT = 1  # the run finished but served nothing: its numbers mean nothing


def fail(message: str, code: int = USER_ERROR_EXIT) -> None:
    """Print one line to stderr and exit (2 for a user error)."""
    click.echo(f"kvsim: error: {message}", err=True)
    sys.exit(code)


class OneLineErrorsGroup(TyperGroup):
    """Root command group that reports usage and domain errors as one stderr line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        install(self)  # option values converted without importing pydantic where that is plain

    def main(self, *args, standalone_mode: bool = True, **kwargs):  # noqa: D401
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            sys.exit(0)
        except click.exceptions.UsageError as exc:
            cmd = exc.ctx.command_path if exc.ctx else "kvsim"
            fail(f"{cmd}: {exc.format_message()}")
        except Abort:
            click.echo("kvsim: aborted", err=True)
            sys.exit(130)
        except click.exceptions.ClickException as exc:
            fail(exc.format_message())
        except KvsimError as exc:
            fail(str(exc))
        except BrokenPipeError:
            sys.exit(1)
        except OSError as exc:
            if exc.errno not in _BAD_PATH:
                raise
            fail(f"{exc.filename}: {exc.strerror}")  # a path the user gave cannot even be looked at
        sys.exit(rv if isinstance(rv, int) else 0)
