"""Running many simulations at once: a local process pool or a Ray cluster, one tidy row each.

    rows = run_points(points, jobs=4, executor="local", on_result=lambda i, row: table.append(row))

A `Point` carries resolved objects (specs, loaded workload, loaded profile: all small and
picklable), so a worker needs no files and a Ray node needs only kvsim installed. Each point is
simulated with its own seed; the simulator is deterministic, so the executor, the number of jobs
and the finishing order change nothing but `wall_s`. Rows come back in completion order through
`on_result` (write them at once: a killed sweep loses no finished point) and in point order from
the return value.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsim.simcore.errors import ConfigError
from kvsim.simcore.specs import EngineConfig, GPUSpec, ModelSpec

# between a row's warnings in its `warnings` cell: a warning's own text may hold "; " (the V1 swap
# warning's clauses), which a "; " join split into fragments when the sweep printed them
WARNING_SEPARATOR = " | "

OnResult = Callable[[int, dict[str, Any]], None]


@dataclass(frozen=True)
class Point:
    """One simulation: what to run, and the option columns its row starts with."""

    model: ModelSpec
    gpu: GPUSpec
    config: EngineConfig
    workload: Any  # a workloads spec (has .describe() and .notes())
    profile: Any  # a loaded simcore.latency.Profile; None only when does_not_fit
    seed: int
    options: dict[str, Any] = field(default_factory=dict)  # column -> value, written first in the row
    does_not_fit: str = ""  # why the model does not fit ("" if it does): the row says so, nothing runs
    resolved: Any = None  # simcore.config.ResolvedConfig from planning the sweep: memory is planned once

    def point_id(self) -> str:
        """A stable id of everything that defines the result (not wall time): resume keys on it."""
        doc = {
            "options": self.options, "model": self.model.to_dict(), "gpu": self.gpu.name,
            "config": self.config.to_dict(), "workload": _without_source(self.workload.describe()),
            "profile": None if self.profile is None else self.profile.sha256, "seed": self.seed,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _without_source(described: dict[str, Any]) -> dict[str, Any]:
    """A workload's description minus the file path it was read from (same workload, any folder)."""
    return {k: v for k, v in described.items() if k != "source"}


def run_point(point: Point) -> dict[str, Any]:
    """Simulate one point (in whatever process calls it) and return its tidy row."""
    from kvsim.profiles import draft_profile
    from kvsim.reports.regime import regime_of
    from kvsim.simcore.simulate import KVSIM_VERSION, simulate

    started = time.perf_counter()
    row: dict[str, Any] = {**point.options, "seed": point.seed}
    if point.does_not_fit:
        row.update({"gpus": point.config.num_gpus,
                    "does_not_fit": point.does_not_fit, "regime": f"does not fit: {point.does_not_fit}"})
        row.update({"kvsim_version": KVSIM_VERSION, "wall_s": time.perf_counter() - started, "warnings": ""})
        return row
    config = point.resolved if point.resolved is not None else point.config
    result = simulate(point.model, point.gpu, config, point.workload, point.profile, seed=point.seed,
                      draft_profile=draft_profile(point.gpu, config, point.profile))
    regime = regime_of(result)
    record = result.record
    row.update({
        "profile_sha256": record["profile"]["sha256"], "profile_source": record["profile"]["source"],
        "gpus": point.config.num_gpus,
        "kv_cache_tokens": result.memory.num_gpu_tokens, "does_not_fit": "",
        "regime": regime.label, "peak_kv_use": regime.peak_kv_use, "kv_blocked_share": regime.kv_blocked_share,
    })
    row.update(result.summary)
    if getattr(point.workload, "is_session", False):  # its turns alone cannot show overload (reports.capacity)
        from kvsim.reports.capacity import judge_sessions

        judge_sessions(row, result, point.workload, point.seed)
        row["rate_unit"] = "sessions/s"  # its rate starts sessions (`kvsim report sweep` labels its axis so)
    if point.options.get("slo_percentiles"):  # targets beyond the summary's p95 / p99 (kvsim sweep --slo)
        from kvsim.reports.capacity import SLO, parse_slo_targets, summary_with_goodput

        slo = SLO.of(parse_slo_targets([point.options["slo_percentiles"]]))
        values = summary_with_goodput(result, slo)
        row.update({t.key: values[t.key] for t in slo.targets if values.get(t.key) is not None})
    if point.options.get("error_bars"):  # kvsim sweep --error-bars: two more runs (profiles/uncertainty.py)
        row.update(band_columns(point, config, result))
    row.update({"kvsim_version": record["kvsim_version"], "engine_core": record["engine_core"],
                "wall_s": time.perf_counter() - started, "warnings": WARNING_SEPARATOR.join(result.warnings)})
    return row


# the row's metrics a sweep's --error-bars bands: those its printed table shows (reports.sweep.BANDED)
SWEEP_BAND_METRICS = ("median_ttft_ms", "p95_ttft_ms", "median_tpot_ms", "p95_tpot_ms", "output_throughput",
                      "request_throughput")
_SCALED: dict[tuple[str, Any], Any] = {}  # (profile sha256, factors) -> scaled profile, per worker process


def band_columns(point: Point, config: Any, result: Any) -> dict[str, Any]:
    """The point again with every step time at each end of the 90% band of its profile's stated
    error: `<metric>_band_low` / `_band_high` over the three runs, and the error used."""
    from kvsim.profiles import draft_profile
    from kvsim.profiles.uncertainty import band, band_factors, profile_error, scaled_profile
    from kvsim.simcore.simulate import simulate

    err = profile_error(point.profile)
    summaries = [result.summary]
    for f in band_factors(err):
        key = (point.profile.sha256, f)
        if key not in _SCALED:
            if len(_SCALED) > 64:  # a sweep over many profiles: keep the worker's memory bounded
                _SCALED.clear()
            _SCALED[key] = scaled_profile(point.profile, f)
        draft = draft_profile(point.gpu, config, _SCALED[key])  # a draft_model's draft scaled alike
        summaries.append(simulate(point.model, point.gpu, config, point.workload, _SCALED[key], seed=point.seed,
                                  draft_profile=draft).summary)
    cols: dict[str, Any] = {"model_error_kind": err.kind, "model_error_median": err.median_abs_error,
                            "model_error_prefill": err.prefill, "model_error_decode": err.decode}
    for metric in SWEEP_BAND_METRICS:
        cols[f"{metric}_band_low"], cols[f"{metric}_band_high"] = band([s.get(metric) for s in summaries])
    return cols


def _run_indexed(item: tuple[int, Point]) -> tuple[int, dict[str, Any]]:
    index, point = item
    return index, run_point(point)


def default_jobs() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_points(
    points: Sequence[Point], jobs: int | None = None, executor: str = "local",
    on_result: OnResult | None = None, address: str | None = None,
) -> list[dict[str, Any]]:
    """Run every point; call `on_result(index, row)` as each finishes; rows in point order.

    executor "local": `jobs` worker processes (default all cores; 1 runs in this process).
    executor "ray": tasks on the Ray cluster at `address` ("auto", "HOST:PORT", or None to start a
    local instance); `jobs` caps the tasks in flight (default: no cap, the cluster decides).
    """
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    rows: list[dict[str, Any] | None] = [None] * len(points)

    def done(index: int, row: dict[str, Any]) -> None:
        rows[index] = row
        if on_result is not None:
            on_result(index, row)

    if executor == "local":
        _run_local(points, jobs or default_jobs(), done)
    elif executor == "ray":
        _run_ray(points, jobs, address, done)
    else:
        raise ConfigError(f"--executor: {executor!r} is not one of local, ray")
    assert all(r is not None for r in rows)
    return rows  # type: ignore[return-value]


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_WATCH_S = 0.5  # how often a worker checks that its parent is alive (the fallback of PDEATHSIG)
_JOIN_S = 5.0  # how long an interrupted sweep waits for a terminated worker to go


def _worker_init(parent_pid: int) -> None:
    """A pool worker exits when the process that started it dies, even by SIGKILL (which runs no
    clean-up, so the pool never tells its workers to stop): the kernel sends it SIGKILL
    (prctl PR_SET_PDEATHSIG, Linux), and a daemon thread that sees its parent change exits it
    too (other systems, or a parent that died before the prctl). Ctrl-C reaches the whole
    process group: the worker ignores it and the parent, which handles it, stops the pool."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler (cli.main) is for the parent: stop_workers
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog alone
        pass
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(_WATCH_S)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="kvsim-parent-watch", daemon=True).start()


def process_pool(max_workers: int):
    """A ProcessPoolExecutor whose workers die with this process and leave Ctrl-C to it."""
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=max_workers, initializer=_worker_init, initargs=(os.getpid(),))


def stop_workers(pool) -> None:
    """Interrupted: cancel what has not started and end the running workers now, rather than wait
    for their points (minutes each, maybe) in `shutdown`. Uses the executor's `_processes`
    (CPython's, present since 3.2), read before `shutdown`, which sets it to None: read after, no
    worker was ended and the interrupted sweep waited, at exit, for every running point.
    Without it the pool is only shut down."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        try:
            process.terminate()
        except (OSError, AttributeError):
            pass
    for process in processes:  # gone before the interpreter's exit joins the pool's threads
        try:
            process.join(_JOIN_S)
        except (OSError, AttributeError, AssertionError):
            pass


def _run_local(points: Sequence[Point], jobs: int, done: OnResult) -> None:
    """Points that cannot run (does_not_fit) never reach a worker; the rest go to the pool."""
    work = [(i, p) for i, p in enumerate(points) if not p.does_not_fit]
    for i, p in enumerate(points):
        if p.does_not_fit:
            done(i, run_point(p))
    if jobs == 1 or len(work) <= 1:
        for item in work:
            done(*_run_indexed(item))
        return
    from concurrent.futures import FIRST_COMPLETED, wait

    with process_pool(min(jobs, len(work))) as pool:
        pending = {pool.submit(_run_indexed, item) for item in work}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    done(*future.result())
        except BaseException as exc:
            for future in pending:
                future.cancel()
            if isinstance(exc, KeyboardInterrupt):
                stop_workers(pool)
            raise


def _run_ray(points: Sequence[Point], jobs: int | None, address: str | None, done: OnResult) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install '.[ray]' in kvsim's source folder") from None
    if not ray.is_initialized():
        _probe(address)
        try:
            if address is None:
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"--executor ray --address {address}: cannot start or reach Ray ({first})") from None
    task = ray.remote(num_cpus=1)(_run_indexed)
    cap = jobs or len(points)
    queue = list(enumerate(points))
    queue.reverse()
    pending: list[Any] = []
    while queue or pending:
        while queue and len(pending) < cap:
            pending.append(task.remote(queue.pop()))
        ready, pending = ray.wait(pending, num_returns=1)
        done(*ray.get(ready[0]))


def check_executor(executor: str, address: str | None) -> None:
    """Before any work: the executor exists, Ray is importable, and a given address answers."""
    if executor not in ("local", "ray"):
        raise ConfigError(f"--executor: {executor!r} is not one of local, ray")
    if executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install '.[ray]' in kvsim's source folder") from None
        _probe(address)


def _probe(address: str | None) -> None:
    """Fail in seconds, not after Ray's minutes of retries, when HOST:PORT does not answer."""
    import socket

    if address is None or address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--address {address!r}: give auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise ConfigError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc})") from None


# -- seeds ----------------------------------------------------------------------------------
# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (standard table, e.g. NIST/SEMATECH
# e-Handbook of Statistical Methods, section 1.3.6.7.2); beyond 30 the normal 1.96 is within 4%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


def t975(n: int) -> float:
    """The two-sided 95% Student-t multiplier for a mean over `n` >= 2 values (12.71 for 2: with two
    seeds an interval is the mean +- 6.35 x the gap between them, which is why it is wide)."""
    df = n - 1
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci95(values: Sequence[float], lower: float | None = None,
              upper: float | None = None) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% Student-t interval over seeds; NaNs dropped; one value
    (or none) gives an interval of NaN, since one draw says nothing about the spread.

    `lower` / `upper`: the least / greatest value the quantity can take (0 for a throughput, a latency,
    a count; 1 for a share). The t interval ignores them and, over few seeds, can reach below zero
    (-1,436.8 tok/s); since the true mean lies inside [lower, upper], cutting the interval there
    loses no coverage, so it is cut (the callers mark a cut end). The estimate stays the mean: an
    interval on the log scale would be one for the geometric mean instead, another quantity."""
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not xs:
        return math.nan, math.nan, math.nan
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return mean, math.nan, math.nan
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    half = t975(len(xs)) * math.sqrt(var / len(xs))
    low, high = mean - half, mean + half
    if lower is not None:
        low = max(low, lower)
    if upper is not None:
        high = min(high, upper)
    return mean, low, high


MAX_REPEATS = 10_000  # each repeat reruns every point; a 95% interval needs a handful, not millions


def parse_seeds(seeds: str | None, repeats: int | None, seed: int) -> list[int]:
    """--seeds 0,1,2 or --repeats K (seeds seed .. seed+K-1), else [seed]."""
    if seeds is not None and repeats is not None:
        raise ConfigError("give --seeds or --repeats, not both")
    if repeats is not None:
        if not 1 <= repeats <= MAX_REPEATS:
            raise ConfigError(f"--repeats must be from 1 to {MAX_REPEATS:,}, got {repeats}")
        if seed + repeats - 1 > 2**53:  # as cli.options.MAX_SEED: tables read seeds back through float64
            raise ConfigError(f"--seed {seed} --repeats {repeats} runs seeds up to {seed + repeats - 1:,}; seeds are "
                              f"integers up to {2**53:,}")
        return [seed + k for k in range(repeats)]
    if seeds is None:
        return [seed]
    from kvsim.reports.sweep import parse_list

    values = parse_list("--seeds", seeds, int)
    if len(values) > MAX_REPEATS:
        raise ConfigError(f"--seeds: at most {MAX_REPEATS:,} seeds, got {len(values):,}")
    for v in values:
        if v < 0:
            raise ConfigError(f"--seeds: {v} is negative; seeds are integers >= 0")
        if v > 2**53:  # as cli.options.MAX_SEED: tables read seeds back through float64
            raise ConfigError(f"--seeds: {str(v)[:18]}... is too large; seeds are integers up to {2**53:,}")
    return values
