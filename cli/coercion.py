"""Option values converted without pydantic where the conversion is plain (start-up cost).

typer 0.29 converts every option value, defaults included, through a pydantic TypeAdapter, and
importing pydantic costs about a tenth of a second: more than setting up and simulating a short
run. For the plain cases -- no value, a default already of the option's type, a string for a
`str` option, digits for an `int`, a decimal for a `float`, an enum choice, a path -- the value
typer's adapter would return is computed here. Anything else, and any value refused here, goes
through typer's own conversion, which returns what it always did or raises its usual error, so
every message stays the same. This leans on typer internals (`_runtime_param`, pinned typer
0.29 in pyproject.toml); tests/test_startup.py checks each plain case against typer's adapter.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any

from typer import _click as click  # typer >= 0.29 vendors click (pinned in pyproject.toml)
from typer._coercion import TypeDescriptor, build_runtime_param
from typer._param_types import coerce_cli_choice, coerce_cli_path

_NOT_PLAIN = object()
_INT = re.compile(r"[+-]?[0-9]{1,18}")  # well inside what pydantic and int() both read the same
_FLOAT = re.compile(r"[+-]?[0-9]{1,15}(\.[0-9]{1,15})?")  # both correctly rounded


class PlainCoercion:
    """Stands in for typer's RuntimeParam of one option: plain values here, the rest to typer."""

    __slots__ = ("descriptor", "_typer")

    def __init__(self, descriptor: TypeDescriptor):
        self.descriptor = descriptor
        self._typer = None  # typer's RuntimeParam (a pydantic TypeAdapter), built on first need

    def coerce(self, value: Any, param: click.Parameter, ctx: click.Context) -> Any:
        multiple = param.multiple or param.nargs == -1
        if value is None:  # as typer's RuntimeParam.coerce
            return () if multiple else None
        plain = self._plain(value, multiple, param, ctx)
        if plain is not _NOT_PLAIN:
            return plain
        if self._typer is None:
            self._typer = build_runtime_param(self.descriptor)
        return self._typer.coerce(value, param=param, ctx=ctx)

    def _plain(self, value: Any, multiple: bool, param: click.Parameter, ctx: click.Context) -> Any:
        annotation, info = self.descriptor.annotation, self.descriptor.parameter_info
        if info.parser is not None or self.descriptor.file_annotation is not None:
            return _NOT_PLAIN
        if multiple:
            plain_list = annotation == list[str] and isinstance(value, (list, tuple))
            return list(value) if plain_list and all(type(v) is str for v in value) else _NOT_PLAIN
        if annotation is str:
            return value if type(value) is str else _NOT_PLAIN
        if annotation is int or annotation is float:
            if info.min is not None or info.max is not None or type(value) not in (annotation, str):
                return _NOT_PLAIN
            if type(value) is annotation:
                return value
            return annotation(value) if (_INT if annotation is int else _FLOAT).fullmatch(value) else _NOT_PLAIN
        if isinstance(annotation, type) and issubclass(annotation, Enum):
            try:
                return coerce_cli_choice(value, choices=list(annotation), case_sensitive=info.case_sensitive, ctx=ctx)
            except ValueError:  # not a choice: typer words the error
                return _NOT_PLAIN
        if isinstance(annotation, type) and issubclass(annotation, Path) and info.path_type is None:
            if type(value) is not str or not value:
                return _NOT_PLAIN
            try:  # typer's path checks, on the Path pydantic would have made
                return coerce_cli_path(annotation(value), info, path_type=annotation, param=param, ctx=ctx)
            except click.exceptions.ClickException:  # e.g. must exist: typer raises it again, its own way
                return _NOT_PLAIN
        return _NOT_PLAIN


def install(command: click.Command, parent: click.Context | None = None) -> None:
    """Give every option of `command` and of its subcommands, --help included, a PlainCoercion.

    --help is made here rather than when the command first parses (click caches it on the
    command), with the help option names a context of the command would have."""
    ctx = click.Context(command, parent=parent, **command.context_settings)
    for param in [*command.params, command.get_help_option(ctx)]:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is not None and getattr(param, "_runtime_param", False) is None:
            param._runtime_param = PlainCoercion(descriptor)
    for sub in getattr(command, "commands", {}).values():
        install(sub, ctx)
