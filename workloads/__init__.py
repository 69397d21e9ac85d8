"""What arrives at the engine: arrival processes, length distributions, trace replay, named workloads.

`kvsim run` uses `load_workload(name_or_path, overrides, max_model_len)`; `kvsim workloads`
uses `list_workloads()`. See workloads/README.md for the YAML schema and the trace format.
"""

from kvsim.workloads.catalog import (
    DEFAULT_WORKLOAD,
    OVERRIDE_KEYS,
    apply_overrides,
    list_workloads,
    load_workload,
)
from kvsim.workloads.spec import WorkloadSpec

__all__ = [
    "DEFAULT_WORKLOAD",
    "OVERRIDE_KEYS",
    "WorkloadSpec",
    "apply_overrides",
    "list_workloads",
    "load_workload",
]
