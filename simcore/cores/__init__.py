"""The engine cores behind one seam: each says whether it runs a prepared simulation (and why
not) and runs it, filling the simulation's result stores (request records, ITL samples, step
recorders, extrapolation counts). `Simulation.run` picks one through this registry and never
touches a core's insides.

    python  the SimPy reference engine (simcore/engine.py): runs everything
    c       the compiled core (simcore/csrc/, driven by simcore/fastcore.py): the configurations
            its policy's registry entry allows (simcore/policies: `PolicySpec.cores`) and its
            driver supports (`fastcore.unsupported`)

Why a registry: a new core (or a second compiled one) is one module and one `register` line,
and a new engine option is refused by every core that does not list it (an allow-list), so no
option is ever silently ignored. Early stop (reports.capacity) is a watch on the request
records (`RequestRecords.watch`), which both cores fill row for row in the same order: a run
stops at the same request whichever core runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kvsim.simcore.errors import ConfigError

if TYPE_CHECKING:
    from kvsim.simcore.config import ResolvedConfig
    from kvsim.simcore.records import RequestRecords
    from kvsim.simcore.simulate import Simulation

PYTHON = "python"  # the reference: runs whatever no other core runs


class CoreUnavailable(Exception):
    """A core found out while running that it cannot run this simulation (the message says
    why). `clean`: nothing was handed out yet and the stores are as `prepare` left them, so
    another core may run it from the start."""

    def __init__(self, reason: str, clean: bool = True):
        super().__init__(reason)
        self.clean = clean


@dataclass(frozen=True, slots=True)
class Hooks:
    """What a run reports while it runs. `progress(num_done)`: every few hundred requests that
    left. `watch`: (every, check) installed on the request records by the core before its first
    request leaves (`RequestRecords.watch`): `check(records)` runs each time `every` more rows
    left, and a value other than None stops the run (`records.RunStopped` carries it)."""

    progress: Callable[[int], None] | None = None
    watch: tuple[int, Callable[[RequestRecords], Any]] | None = None

    def install(self, records: RequestRecords) -> None:
        if self.watch is not None:
            records.watch(*self.watch)


class Core(Protocol):
    """One engine implementation."""

    name: str

    def supports(self, sim: Simulation) -> str:
        """Why this core cannot run the prepared simulation ("" when it can)."""

    def run(self, sim: Simulation, hooks: Hooks) -> Any:
        """Run it to the end, filling its stores; return the workload generation's counts (or
        None). Raises CoreUnavailable when it finds out too late that it cannot run it."""


_CORES: dict[str, Core] = {}  # in preference order for --engine-core auto


def register(core: Core) -> Core:
    assert core.name not in _CORES, f"core {core.name} registered twice"
    _CORES[core.name] = core
    return core


def names() -> list[str]:
    _load()
    return list(_CORES)


def get(name: str) -> Core:
    _load()
    return _CORES[name]


def choose(sim: Simulation, wanted: str, auto_compiled: bool = True) -> tuple[str, str]:
    """(core name, why the preferred core does not run it: "" when it does). `wanted`: "auto"
    (the first registered core that supports the run; with `auto_compiled` False, the Python
    core) or a core's name (ConfigError when it cannot run the simulation)."""
    _load()
    if wanted != "auto":
        core = _CORES.get(wanted)
        if core is None:
            raise ConfigError(f"--engine-core must be one of auto, {', '.join(_CORES)}, got {wanted!r}")
        reason = core.supports(sim)
        if reason:
            raise ConfigError(f"--engine-core {wanted} cannot run this simulation: {reason}")
        return wanted, "" if wanted != PYTHON else f"--engine-core {PYTHON}"
    first_reason = ""
    for core in _CORES.values():
        reason = core.supports(sim)
        if not reason and core.name != PYTHON and not auto_compiled:
            reason = f"--engine-core auto runs the Python engine (the {core.name} core is opt-in: --engine-core {core.name})"
        if not reason:
            return core.name, first_reason
        first_reason = first_reason or reason
    raise AssertionError("the Python core runs every simulation")


def run_compiled(sim: Simulation, core: str, why: str, hooks: Hooks) -> tuple[str, str, Any]:
    """Runs `sim` on the chosen `core` unless it is the Python one: (core that ran or runs next,
    why not the compiled one, the run's counts or None). A compiled core that finds out too late
    that it cannot run it hands the run to the Python engine when nothing was recorded yet; when
    the user asked for that core, or rows were already out, that is a ConfigError."""
    if core == PYTHON:
        return core, why, None
    try:
        return core, why, get(core).run(sim, hooks)
    except CoreUnavailable as exc:
        if sim.engine_core == core:
            raise ConfigError(f"--engine-core {core} cannot run this simulation: {exc}") from None
        if not exc.clean:
            raise ConfigError(f"the compiled engine core stopped after rows were written out ({exc}); "
                              "run it with --engine-core python") from None
        return PYTHON, str(exc), None  # nothing was recorded yet: the Python engine runs it


def refused_options(core: str, cfg: ResolvedConfig) -> str:
    """The engine options set off their defaults that `core` does not honour for the policy
    variant `cfg` selects ("" when none): its registry entry lists what each compiled core
    honours (`PolicySpec.cores`), so an option added later is refused until someone lists it."""
    from dataclasses import MISSING, fields

    spec = cfg.policy
    honoured = spec.core_options(core)
    if honoured is None:
        return f"policy {spec.name} over the {spec.allocator} allocator (no {core} core for it)"
    refused = []
    for f in fields(cfg.engine):
        value = getattr(cfg.engine, f.name)
        if f.name not in honoured and (f.default is MISSING or value != f.default):
            refused.append(_OPTION_WORDS.get(f.name, f"--{f.name.replace('_', '-')} {value!r}"))
    return "" if not refused else f"{', '.join(refused)} (not implemented by the {core} core for {spec.label})"


# how a refused option reads in the reason (default: the flag and its value)
_OPTION_WORDS = {"data_parallel_size": "data parallelism (replicas behind a router)",
                 "pipeline_parallel_size": "pipeline parallelism"}


def _load() -> None:
    """Register the built-in cores (on first use: importing this package imports no core),
    the compiled one first: --engine-core auto prefers it where it runs."""
    if _CORES:
        return
    from kvsim.simcore.cores.c import CCore
    from kvsim.simcore.cores.python import PythonCore

    for core in (CCore(), PythonCore()):
        _CORES.setdefault(core.name, core)  # two threads loading at once register each core once
