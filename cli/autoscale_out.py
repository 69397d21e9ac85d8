"""`kvsim run --autoscale`: its options parsed, and the fleet section of its result (replicas over
time, SLO attainment per hour, GPU-hours and $), with static fleets sized for the peak and the
mean as the comparison an operator asks for. The simulation itself is simcore.autoscale."""

from __future__ import annotations

import math
from typing import Any

import kvsim.simcore.userjson as userjson
from kvsim.simcore.errors import ConfigError

DEFAULT_TTFT_SLO_MS = 1000.0  # attainment thresholds unless --autoscale-config or --slo-* say otherwise
DEFAULT_TPOT_SLO_MS = 100.0
# scale_up/down_cooldown_s are the HPA's scaleUp/scaleDown stabilization windows; the rate policies
# follow (simcore.autoscale's docstring)
_KEYS = {"metric", "target", "interval_s", "tolerance", "scale_up_cooldown_s", "scale_down_cooldown_s",
         "scale_up_percent", "scale_up_pods", "scale_up_period_s", "scale_down_percent", "scale_down_period_s",
         "model_load_gbps", "warmup_s", "ttft_slo_ms", "tpot_slo_ms", "price_usd_per_gpu_hour"}


def parse_autoscale(enabled: bool, min_replicas: int | None, max_replicas: int | None,
                    provisioning_delay: float | None, config_json: str | None):
    """(AutoscaleConfig or None, extras: SLO thresholds and price) from run's flags; every flag
    without --autoscale, and every unknown key, is an error."""
    from kvsim.simcore.autoscale import DEFAULT_PROVISIONING_S, AutoscaleConfig

    given = [name for name, value in (("--min-replicas", min_replicas), ("--max-replicas", max_replicas),
                                      ("--provisioning-delay", provisioning_delay),
                                      ("--autoscale-config", config_json)) if value is not None]
    if not enabled:
        if given:
            raise ConfigError(f"{given[0]} applies only with --autoscale")
        return None, {}
    extra: dict[str, Any] = {}
    if config_json is not None:
        try:
            extra = userjson.loads(config_json)  # a repeated key or a too-deep nesting: refused, not a traceback
        except ValueError as exc:
            raise ConfigError(f"--autoscale-config: not JSON ({exc})") from None
        if not isinstance(extra, dict):
            raise ConfigError("--autoscale-config must be a JSON object, e.g. '{\"metric\": \"kv\", \"target\": 70}'")
        unknown = sorted(set(extra) - _KEYS)
        if unknown:
            raise ConfigError(f"--autoscale-config: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
        for key, value in extra.items():
            if key != "metric" and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ConfigError(f"--autoscale-config: {key} must be a number, got {value!r}")
            if key != "metric" and isinstance(value, int) and abs(value) > 2**53:  # float() would overflow
                raise ConfigError(f"--autoscale-config: {key} must be a finite number, got {len(str(abs(value)))} digits")
    policy = {k: (float(v) if k != "metric" else v) for k, v in extra.items()
              if k not in ("ttft_slo_ms", "tpot_slo_ms", "price_usd_per_gpu_hour")}
    lo = 1 if min_replicas is None else min_replicas
    config = AutoscaleConfig(min_replicas=lo, max_replicas=max(lo, 4) if max_replicas is None else max_replicas,
                             provisioning_s=DEFAULT_PROVISIONING_S if provisioning_delay is None else provisioning_delay,
                             **policy)
    from kvsim.reports.prices import MAX_USD_PER_GPU_HOUR

    for key in ("ttft_slo_ms", "tpot_slo_ms", "price_usd_per_gpu_hour"):
        if key in extra and not (math.isfinite(extra[key]) and extra[key] > 0):
            raise ConfigError(f"--autoscale-config: {key} must be > 0, got {extra[key]!r}")
    if extra.get("price_usd_per_gpu_hour", 0) > MAX_USD_PER_GPU_HOUR:  # as --price
        raise ConfigError(f"--autoscale-config: price_usd_per_gpu_hour must be at most {MAX_USD_PER_GPU_HOUR:,.0f}, "
                          f"got {extra['price_usd_per_gpu_hour']!r}")
    return config, {k: float(extra[k]) for k in ("ttft_slo_ms", "tpot_slo_ms", "price_usd_per_gpu_hour") if k in extra}


def slo_of(extras: dict[str, Any], slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> tuple[float, float]:
    """The (TTFT, TPOT) thresholds attainment is judged against (--autoscale-config, --slo-*, defaults)."""
    return (extras.get("ttft_slo_ms", slo_ttft_ms or DEFAULT_TTFT_SLO_MS),
            extras.get("tpot_slo_ms", slo_tpot_ms or DEFAULT_TPOT_SLO_MS))


def attainment_key(extras: dict[str, Any], slo_ttft_ms: float | None, slo_tpot_ms: float | None,
                   workload) -> tuple[float, float, float]:
    """(hour_s, TTFT, TPOT) for simulate's `attainment=`: the run counts its hourly attainment as
    requests leave, so a day of millions of requests keeps no rows for it."""
    from kvsim.simcore.autoscale import hour_of_arrival

    return (hour_of_arrival(workload.describe().get("arrival", {})), *slo_of(extras, slo_ttft_ms, slo_tpot_ms))


def fleet_section(result, extras: dict[str, Any], slo_ttft_ms: float | None, slo_tpot_ms: float | None,
                  gpu_name: str) -> dict[str, Any]:
    """The run's fleet figures: its record's autoscale block plus attainment and cost."""
    from kvsim.reports.prices import BUILTIN_USD_PER_GPU_HOUR

    fleet = dict(result.record["autoscale"])
    if "peak_window_s" in result.summary:  # the pool's capacity and the traffic's peak (simcore.autoscale_capacity)
        from kvsim.simcore.autoscale_capacity import SUMMARY_KEYS

        fleet["capacity"] = {k: result.summary[k] for k in SUMMARY_KEYS if k in result.summary}
    ttft, tpot = slo_of(extras, slo_ttft_ms, slo_tpot_ms)
    fleet["slo"] = {"ttft_ms": ttft, "tpot_ms": tpot}
    fleet["hour_s"] = hour_s = hour_of(result)
    fleet.update(_attainment(result, ttft, tpot, hour_s))
    price = extras.get("price_usd_per_gpu_hour", BUILTIN_USD_PER_GPU_HOUR.get(gpu_name))
    duration = float(result.summary.get("duration_s") or 0.0)
    fleet["duration_s"] = duration
    fleet["usd_per_gpu_hour"] = price
    fleet["usd"] = None if price is None else price * fleet["gpu_hours"]
    fleet["usd_per_day"] = None if price is None or duration <= 0 else fleet["usd"] * 86400.0 / duration
    return fleet


def hour_of(result) -> float:
    """The length of an "hour" of the run's workload (simcore.autoscale.hour_of_arrival)."""
    from kvsim.simcore.autoscale import hour_of_arrival

    return hour_of_arrival(result.record["workload"].get("arrival", {}))


def _attainment(result, ttft_ms: float, tpot_ms: float, hour_s: float) -> dict[str, Any]:
    from kvsim.simcore.autoscale import run_attainment

    share, hours = run_attainment(result, ttft_ms, tpot_ms, hour_s)
    return {"attainment": share, "hourly": hours}


def static_row(result, replicas: int, gpus_per_replica: int, ttft_ms: float, tpot_ms: float,
               price: float | None, hour_s: float) -> dict[str, Any]:
    """A fixed fleet's figures on the same workload (paid for the whole run)."""

    duration = float(result.summary.get("duration_s") or 0.0)
    gpu_hours = replicas * gpus_per_replica * duration / 3600.0
    att = _attainment(result, ttft_ms, tpot_ms, hour_s)
    return {"replicas": replicas, "gpu_hours": gpu_hours, "attainment": att["attainment"],
            "hourly": att["hourly"], "usd": None if price is None else price * gpu_hours,
            "usd_per_day": None if price is None or duration <= 0 else price * gpu_hours * 86400.0 / duration}


def format_fleet(fleet: dict[str, Any]) -> str:
    """The text block printed after the summary."""
    usd = "n/a (no price: --autoscale-config '{\"price_usd_per_gpu_hour\": X}')" if fleet["usd"] is None \
        else f"{fleet['usd']:,.2f} (${fleet['usd_per_day']:,.0f}/day at this traffic pattern)"
    lines = [
        "--------------------Autoscaling-------------------",
        f"{'Replicas (min / mean / peak active):':<41}{fleet['config']['min_replicas']} / "
        f"{fleet['mean_active_replicas']:.2f} / {fleet['peak_active_replicas']}",
        f"{'Cold start per replica (s):':<41}{fleet['cold_start_s']:.1f}",
        f"{'GPU-hours:':<41}{fleet['gpu_hours']:.2f}",
        f"{'Cost ($):':<41}{usd}",
        f"{'SLO attainment (%):':<41}" + ("-" if fleet["attainment"] is None else f"{100 * fleet['attainment']:.1f}")
        + f"  (TTFT <= {fleet['slo']['ttft_ms']:g} ms, TPOT <= {fleet['slo']['tpot_ms']:g} ms)",
        "Hourly attainment (%):                   " + " ".join(
            "-" if h["attainment"] is None else f"{100 * h['attainment']:.0f}" for h in fleet["hourly"]),
    ]
    from kvsim.simcore.autoscale_capacity import capacity_lines

    lines += capacity_lines(fleet)
    for row in fleet.get("static", []):
        cost = "" if row["usd"] is None else f", ${row['usd_per_day']:,.0f}/day"
        label = f"Static fleet, {row['sized_for']} ({row['replicas']} replicas):"
        lines.append(f"{label:<41}{row['gpu_hours']:.2f} GPU-hours{cost}, attainment {100 * row['attainment']:.1f}%")
    peak = next((row for row in fleet.get("static", []) if row["sized_for"] == "the peak"), None)
    saving = fleet.get("saving_vs_peak_fleet")
    if peak is not None and saving is not None:
        unit = ("lower cost", "higher cost") if fleet.get("saving_basis") == "usd" else ("fewer GPU-hours", "more GPU-hours")
        verdict = f"{100 * saving:.0f}% {unit[0]}" if saving >= 0 else f"{-100 * saving:.0f}% {unit[1]}"
        lines.append(f"{'Autoscaling vs the static peak fleet:':<41}{verdict}, attainment "
                     f"{100 * (fleet['attainment'] or 0):.1f}% vs {100 * peak['attainment']:.1f}%")
    return "\n".join(lines)


def write_figure(fleet: dict[str, Any], path) -> None:
    """Replicas over time (active, and paid incl. starting/draining) above hourly attainment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = fleet["timeline"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    hours = [h for h in fleet["hourly"] if h["attainment"] is not None]
    ax2.bar([h["hour"] + 0.5 for h in hours], [100 * h["attainment"] for h in hours], width=0.8)
    scale = fleet["hour_s"]
    ax1.step([r[0] / scale for r in rows], [r[1] for r in rows], where="post", label="active")
    ax1.step([r[0] / scale for r in rows], [r[1] + r[2] + r[3] for r in rows], where="post", linestyle="--",
             label="paid (incl. starting, draining)")
    for row in fleet.get("static", []):
        ax1.axhline(row["replicas"], color="grey", linewidth=0.8, linestyle=":")
        ax1.annotate(f"static, {row['sized_for']}", (0, row["replicas"]), xycoords=("axes fraction", "data"),
                     xytext=(2, 2), textcoords="offset points", fontsize=7, color="#555")
    ax1.set_ylabel("replicas")
    ax1.legend(loc="upper left", fontsize=8)
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("SLO attainment (%)")
    ax2.set_xlabel(f"hours since start (an hour = {fleet['hour_s']:g} s of simulated time)")
    fig.suptitle(f"Autoscaling: {fleet['gpu_hours']:.1f} GPU-hours, attainment {100 * (fleet['attainment'] or 0):.1f}%")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["attainment_key", "fleet_section", "format_fleet", "parse_autoscale", "static_row", "write_figure"]
