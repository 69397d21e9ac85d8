"""Every batching policy describes itself once, here: its name, the allocator it runs over,
the engine options it reads, whose per-step host overhead prices it, and how to build it.
The CLI, validation (`simcore.config`) and reports read this table; nothing else lists
policies.

A new policy is one module plus one `register(PolicySpec(...))` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.simcore.errors import ConfigError

if TYPE_CHECKING:  # annotations only: the table is read by `kvsim run --help`, which needs no numpy
    import numpy as np

    from kvsim.simcore.config import ResolvedConfig
    from kvsim.simcore.policies.base import Policy

# Engine options that only some policies read; every other EngineConfig field is common.
# A policy that does not list one refuses it (CLI: given at all; API: set to a non-default).
POLICY_OPTIONS = (
    "allocator", "reservation", "preemption_mode", "swap_space", "enable_chunked_prefill",
    "enable_prefix_caching", "max_batch_size", "batch_timeout_s", "speculative_config", "kv_offloading_size",
    "engine_version",
)
ALLOCATOR_KINDS = ("paged", "contiguous")


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One (policy, allocator) variant as the user selects it: `--policy name --allocator kind`."""

    name: str  # the --policy value
    allocator: str  # "paged" (block tables) or "contiguous" (reservations)
    models: str  # the system it models, one line (shown by `kvsim list` and in reports)
    build: Callable[[ResolvedConfig, np.random.Generator], Policy]
    options: frozenset[str] = frozenset()  # the POLICY_OPTIONS it reads
    overhead: str = "continuous"  # key of the host-overhead model that prices its steps
    # The compiled engine cores that run this variant, each with the EngineConfig fields it honours
    # (simcore.cores): an allow-list, so any other field set off its default makes that core refuse
    # the run with the field's name, and a field added to EngineConfig later is never silently
    # ignored. The Python core, the reference, honours every field and is not listed.
    cores: tuple[tuple[str, frozenset[str]], ...] = ()

    def core_options(self, core: str) -> frozenset[str] | None:
        """The EngineConfig fields `core` honours for this variant; None: it does not run it."""
        return next((options for name, options in self.cores if name == core), None)

    @property
    def label(self) -> str:
        """How to select it on the command line (the allocator only where it is a choice)."""
        if len(_BY_NAME.get(self.name, ())) > 1:
            return f"--policy {self.name} --allocator {self.allocator}"
        return f"--policy {self.name}"

    @property
    def paged(self) -> bool:
        return self.allocator == "paged"


_BY_NAME: dict[str, list[PolicySpec]] = {}  # name -> its variants, the default first


def register(spec: PolicySpec) -> PolicySpec:
    """Add a variant; the first one registered under a name is that name's default."""
    assert spec.allocator in ALLOCATOR_KINDS, spec.allocator
    assert spec.options <= set(POLICY_OPTIONS), spec.options - set(POLICY_OPTIONS)
    variants = _BY_NAME.setdefault(spec.name, [])
    assert all(v.allocator != spec.allocator for v in variants), f"{spec.name}/{spec.allocator} registered twice"
    variants.append(spec)
    return spec


def policy_names() -> list[str]:
    return list(_BY_NAME)


def variants() -> list[PolicySpec]:
    return [v for vs in _BY_NAME.values() for v in vs]


def lookup(name: str, allocator: str | None = None) -> PolicySpec:
    """The variant `--policy name [--allocator kind]` selects (None: the name's default)."""
    found = _BY_NAME.get(name)
    if not found:
        raise ConfigError(f"--policy must be one of {', '.join(_BY_NAME)}, got {name!r}")
    if allocator is None:
        return found[0]
    for spec in found:
        if spec.allocator == allocator:
            return spec
    if allocator not in ALLOCATOR_KINDS:
        raise ConfigError(f"--allocator must be one of {', '.join(ALLOCATOR_KINDS)}, got {allocator!r}")
    raise ConfigError(f"--policy {name} runs only over the {found[0].allocator} allocator, not {allocator}")


def select(name: str, allocator: str | None = None, given: set[str] | frozenset[str] = frozenset()) -> PolicySpec:
    """The variant `--policy name --allocator kind` selects, refusing the options in `given`
    (EngineConfig field names) that it does not read. `allocator=None`: the name's default;
    naming the default's own allocator is always allowed."""
    spec = lookup(name)
    if allocator is not None and allocator != spec.allocator:
        if "allocator" not in spec.options:
            check_options(spec, {"allocator"})
        spec = lookup(name, allocator)
    check_options(spec, set(given) - {"allocator"})
    return spec


def check_options(spec: PolicySpec, given: set[str]) -> None:
    """Refuse options (EngineConfig field names) that mean nothing for this variant."""
    for option in POLICY_OPTIONS:
        if option not in given or option in spec.options:
            continue
        flag = "--" + option.replace("_", "-")
        takers = [v.label for v in variants() if option in v.options]
        where = " or ".join(takers) if takers else "no policy"
        raise ConfigError(f"{flag} applies only to {where}, not {spec.label}")
