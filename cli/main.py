"""The `kvsim` command: a thin typer layer over simcore, workloads, profiles and reports.

Each command lives in its own module. `kvsim CMD ...` imports and registers only CMD's module
(start-up is part of every run's cost); `kvsim`, `kvsim --help`, an unknown command, and
`from cli.main import app` get every command. No `from __future__ import annotations`: typer
reads the root callback's annotations at every start (see cli/run_cmd.py).

Nothing but `sys` is imported at the top: the console script imports this module before `main`
runs, and a Ctrl-C must find `main`'s handler in place ("kvsim: interrupted", exit 130), even
during the imports of typer and the command (the first ~0.3 s).
"""

import sys

INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended
TERMINATED_EXIT = 143  # 128 + SIGTERM (kill, timeout, docker stop, a batch scheduler's end of job)
_TERMINATED: list[bool] = []  # set once SIGTERM arrived: the interrupt below is that signal's
_EXTRA_ARGS = {"allow_extra_args": True}
# name -> (module, attribute, add_typer? , app.command keywords), in registration order (= `kvsim --help`'s)
COMMANDS: dict[str, tuple[str, str, bool, dict]] = {
    "run": ("kvsim.cli.run_cmd", "run", False, {"no_args_is_help": False, "context_settings": _EXTRA_ARGS}),
    "profile": ("kvsim.cli.profile_cmd", "app", True, {}),
    "workloads": ("kvsim.cli.workloads_cmd", "app", True, {}),
    "sweep": ("kvsim.cli.sweep_cmd", "sweep", False, {}),
    "report": ("kvsim.cli.report_cmd", "app", True, {}),
    "list": ("kvsim.cli.list_cmd", "list_catalog", False, {}),
    "calibrate": ("kvsim.cli.calibrate_cmd", "calibrate", False, {}),
    "plan": ("kvsim.cli.plan_cmd", "plan", False, {"context_settings": _EXTRA_ARGS}),
}
HELP = "Capacity-planning simulator for LLM serving: batching policies, paged KV cache, latency SLOs."


def interrupted() -> None:
    """Ctrl-C: one line on stderr, exit 130 (SIGTERM: "terminated", 143). Output that could not be
    flushed is dropped."""
    try:
        sys.stderr.write("kvsim: terminated\n" if _TERMINATED else "kvsim: interrupted\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 (stderr closed: the exit code still says it)
        pass
    sys.exit(TERMINATED_EXIT if _TERMINATED else INTERRUPTED_EXIT)


def _on_sigterm(signum, frame) -> None:
    """SIGTERM ends the command as a Ctrl-C does, through the same clean-up (an --out staging
    folder, a sweep table's lock and unwritten table, a pool's workers); Python's default ended
    the process on the spot, silently, and left them behind."""
    for name in (__name__, "kvsim.cli.main"):  # (`python -m kvsim.cli.main`: this module twice, as __main__ too)
        module = sys.modules.get(name)
        if module is not None:
            module._TERMINATED.append(True)
    raise KeyboardInterrupt


def _handle_sigterm() -> None:
    import signal

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # one the parent set to ignore stays ignored
        signal.signal(signal.SIGTERM, _on_sigterm)


def _version() -> str:
    """The installed package's version, else the source tree's (the same number, one bump)."""
    from importlib.metadata import PackageNotFoundError, version

    from kvsim.simcore.simulate import KVSIM_VERSION

    try:
        return version("kvsim")
    except PackageNotFoundError:
        return KVSIM_VERSION


def _print_version(value: bool) -> None:
    import typer

    if value:
        typer.echo(f"kvsim {_version()}")
        raise typer.Exit(0)


def _root_callback():
    """The root callback, made on first use (its annotations need typer)."""
    from typing import Annotated

    import typer

    def _root(
        version: Annotated[bool, typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the kvsim version and exit.",
        )] = False,
    ) -> None:
        """Capacity-planning simulator for LLM serving: batching policies, paged KV cache, latency SLOs."""

    return _root


def build_app(names: list[str] | None = None):
    """The `kvsim` app (a typer.Typer) with the given commands (default: all of them)."""
    from importlib import import_module

    import typer

    from kvsim.cli.errors import OneLineErrorsGroup

    app = typer.Typer(
        name="kvsim", cls=OneLineErrorsGroup, no_args_is_help=True, add_completion=False,
        pretty_exceptions_enable=False, rich_markup_mode=None, help=HELP,
    )
    app.callback()(_root_callback())
    for name in COMMANDS if names is None else names:
        module, attribute, is_group, keywords = COMMANDS[name]
        target = getattr(import_module(module), attribute)
        if is_group:
            app.add_typer(target, name=name, **keywords)
        else:
            app.command(name, **keywords)(target)
    return app


def __getattr__(name: str):
    """`cli.main.app`: the whole app (for tests and embedding), built on first use."""
    if name != "app":
        raise AttributeError(f"module 'kvsim.cli.main' has no attribute {name!r}")
    app = globals()["app"] = build_app()
    return app


def main() -> None:
    """The console script: `kvsim CMD ...` imports and registers CMD alone. Anything else (no
    command, a root option first such as `kvsim --help run`, an unknown name) gets every command,
    so the root's help and its "No such command ... Did you mean" list them all. A Ctrl-C at any
    point, imports included, ends it with one line and exit code 130; a SIGTERM likewise, 143."""
    try:
        _handle_sigterm()
        command = sys.argv[1] if len(sys.argv) > 1 else None
        build_app([command] if command in COMMANDS else None)()
    except KeyboardInterrupt:
        interrupted()


if __name__ == "__main__":
    main()
