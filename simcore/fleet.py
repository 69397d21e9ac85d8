"""Heterogeneous fleets: replicas of more than one GPU type or TP behind one router.

`--fleet H100-SXM-80GB:4:2,H200-141GB:2:1` is two TP-4 H100 replicas and one TP-2 H200 replica of
the same model: each replica has its own memory plan (its KV cache), its own latency profile (the
committed or roofline one for its GPU and TP) and its own price; the router (least-loaded by
default, which sends more work to faster replicas because their queues drain sooner) sees them all.
What operators run when a cluster mixes generations; runs in the Python core.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvsim.simcore.errors import ConfigError

MAX_GROUPS = 16
MAX_REPLICAS = 1024


def parse_fleet(text: str) -> list[tuple[str, int, int]]:
    """[(gpu name, tp, replicas), ...] from `GPU:TP:N,GPU:TP:N`; every malformed part named."""
    groups = []
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError("--fleet: give GPU:TP:REPLICAS groups, e.g. H100-SXM-80GB:4:2,H200-141GB:2:1")
    if len(parts) > MAX_GROUPS:
        raise ConfigError(f"--fleet: at most {MAX_GROUPS} groups, got {len(parts)}")
    for part in parts:
        fields = part.split(":")
        if len(fields) != 3:
            raise ConfigError(f"--fleet: {part!r} is not GPU:TP:REPLICAS (e.g. H100-SXM-80GB:4:2)")
        gpu, tp, n = fields
        try:
            tp_i, n_i = int(tp), int(n)
        except ValueError:
            raise ConfigError(f"--fleet: {part!r}: TP and REPLICAS must be whole numbers") from None
        if tp_i < 1 or n_i < 1:
            raise ConfigError(f"--fleet: {part!r}: TP and REPLICAS must be >= 1")
        groups.append((gpu.strip(), tp_i, n_i))
    if sum(n for _, _, n in groups) > MAX_REPLICAS:
        raise ConfigError(f"--fleet: at most {MAX_REPLICAS} replicas in all")
    return groups


def resolve_fleet(model, groups: list[tuple[str, int, int]], base, fill: frozenset[str] = frozenset(),
                  usage_context: str = "server") -> list[tuple[Any, Any, int]]:
    """[(ResolvedConfig, Profile, replicas), ...]: each group's config (base with its TP, one
    replica, and the step limits named in `fill` set to its engine version's defaults on the
    group's GPU, simcore.batch_defaults), checked as a single-GPU-type run is, and its default profile."""
    from kvsim.profiles import default_profile
    from kvsim.simcore.batch_defaults import apply_batch_defaults
    from kvsim.simcore.catalog import get_gpu
    from kvsim.simcore.config import resolve
    from kvsim.simcore.parallel import check_deployment

    out = []
    for gpu_name, tp, n in groups:
        gpu = get_gpu(gpu_name)
        config = replace(base, tensor_parallel_size=tp, data_parallel_size=1)
        stored = config.resolve_model(model)
        config = apply_batch_defaults(config, gpu, stored, fill, usage_context)
        check_deployment(stored, gpu, config)
        cfg = resolve(stored, gpu, config)
        out.append((cfg, default_profile(gpu, stored, tp, config.expert_parallel_size), n))
    return out


def fleet_cost_per_hour(fleet, prices: dict[str, float]) -> float | None:
    """$ per hour of the whole fleet, or None when a GPU has no price."""
    total = 0.0
    for cfg, _, n in fleet:
        price = prices.get(cfg.gpu.name)
        if price is None:
            return None
        total += n * cfg.engine.tensor_parallel_size * price
    return total


__all__ = ["fleet_cost_per_hour", "parse_fleet", "resolve_fleet"]
