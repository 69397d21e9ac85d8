"""`kvsim plan` on multi-turn session workloads (the session rate is what is scaled), and the
router and CPU KV tier as plan dimensions (issue 25)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.capacity import SessionRateScaler, planned_requests, rate_scaler
from kvsim.simcore.errors import ConfigError
from kvsim.workloads import load_workload

runner = CliRunner()


def _sessions(**over):
    return load_workload("chat-sessions", {"num_requests": 40, **over}, max_model_len=8192)


def test_a_session_rate_scales_only_the_session_starts():
    scaler = rate_scaler(_sessions())
    assert isinstance(scaler, SessionRateScaler) and scaler.base == 0.5 and scaler.unit == "sessions/s"
    seed = np.random.SeedSequence(0).spawn(2)[0]
    slow, fast = (scaler.at(r).draw(seed)[0] for r in (0.5, 2.0))
    assert len(fast) > len(slow) > 40  # a faster rate runs more sessions (to reach the steady state)...
    for a, b in zip(slow, fast, strict=False):  # ...the first of which are the same turns
        assert (a.num_prompt_tokens, a.num_output_tokens, a.session_id, a.turn) == (
            b.num_prompt_tokens, b.num_output_tokens, b.session_id, b.turn)
        assert b.arrival_s == pytest.approx(a.arrival_s / 4, rel=1e-12, abs=1e-12)  # ...starting 4x as often
    # and what each session does between its turns is drawn from the same streams at any rate
    slow_plans = list(scaler.at(0.5)._plans(seed))
    fast_plans = list(scaler.at(2.0)._plans(seed))[: len(slow_plans)]
    assert [p[1] for p in slow_plans] == [p[1] for p in fast_plans]  # (new tokens, output, think_s) per turn


def test_a_run_starts_sessions_over_several_lifetimes():
    """At r sessions/s about r x lifetime sessions are in flight: a run of fewer would never fill
    the server (measured: 70B TP4 judged fine at 8 sessions/s from 86 sessions, TTFT p95 64 s
    from 1,600)."""
    scaler = SessionRateScaler(_sessions(), take=20)
    lifetime = (scaler.turns_per_session - 1) * 20.0  # chat-sessions: 20 s think time
    assert scaler.lifetime_s == pytest.approx(lifetime)
    for rate in (0.1, 1.0, 8.0):
        assert scaler.at(rate).num_sessions >= min(3 * rate * lifetime, 50_000 / scaler.turns_per_session) - 1


def test_a_growing_queue_fails_a_session_run_even_when_turns_keep_pace():
    from kvsim.reports.capacity import SLO

    summary = {"saturation": "sustained", "session_queue_slope": 0.4, "sessions_overloaded": True}
    assert SLO().failures(summary)[0].startswith("overloaded (queueing delay grows 0.40 s per s while sessions start")


def test_the_early_stop_count_bounds_every_turn_a_run_can_send():
    wl = rate_scaler(_sessions()).at(1.0)
    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.simulate import simulate
    from kvsim.simcore.specs import EngineConfig

    model, gpu = get_model("llama3-8b"), get_gpu("H100-SXM-80GB")
    result = simulate(model, gpu, EngineConfig(), wl, default_profile(gpu, model, 1), seed=3)
    assert result.summary["num_requests"] == planned_requests(wl, 3)  # nothing rejected: every planned turn
    assert planned_requests(wl, 3) != wl.num_requests  # (the workload's own count is only the expected one)


def test_search_size_keeps_whole_sessions():
    scaler = SessionRateScaler(_sessions(), take=20)
    per = _sessions().num_requests / 40
    assert scaler.spec.num_sessions == int(np.ceil(20 / per))
    lengths = scaler.lengths(np.random.SeedSequence(0).spawn(2)[0])
    # a later turn's uncached part is its new user message: the conversation before it may be cached
    assert (lengths.uncached_prompts <= lengths.full_prompts).all() and lengths.requests_per_unit > 1


def test_a_closed_loop_of_sessions_is_refused_by_the_rate_search():
    with pytest.raises(ConfigError, match="open-loop"):
        rate_scaler(load_workload("chat-sessions", {"concurrency": 4}, max_model_len=8192))


SHORT = """name: short-sessions
description: "chat sessions with 1 s think times, a short lifetime keeps test runs small"
sessions: {num_sessions: 100, turns: {dist: fixed, value: 3}, think_time_s: 1.0, think_time_dist: fixed}
arrival: {process: poisson, rate: 1.0}
prompt_len: {dist: fixed, value: 64}
output_len: {dist: fixed, value: 32}
"""
PLAN = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1", "--slo-ttft-p95-ms", "500",
        "--search-requests", "60", "--confirm-requests", "100", "--json"]


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    path = tmp_path_factory.mktemp("wl") / "short-sessions.yaml"
    path.write_text(SHORT)
    return str(path)


def _plan(short: str, *args: str) -> dict:
    result = runner.invoke(app, [*PLAN, "--workload", short, *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def test_plan_sizes_a_session_workload_in_sessions_per_second(short):
    doc = _plan(short, "--rate", "1")
    answer = doc["answers"][0]
    assert doc["rate_unit"] == "sessions/s" and answer["unit"] == "sessions/s"
    best = answer["best"]
    assert best is not None and best["confirmed"].startswith("yes") and best["max_rate"] >= 1
    assert "sessions/s" in answer["line"] and "req/s" not in answer["line"].split(" with ")[0]
    assert doc["workload"]["sessions"]["num_sessions"] >= 1


def test_router_and_cpu_tier_are_plan_dimensions_and_routers_share_one_search(short):
    one = _plan(short, "--rate", "1")
    two = _plan(short, "--rate", "1", "--router", "round-robin,session-affinity", "--kv-offloading-size", "none,8")
    rows = two["candidates"]
    assert {r["router"] for r in rows} == {"round-robin", "session-affinity"}
    assert {r["kv_offloading_size"] for r in rows} == {None, 8.0}
    # the two routers of one tier size run one single-replica search: its rates are the same
    by = {(r["router"], r["kv_offloading_size"]): r for r in rows}
    for size in (None, 8.0):
        assert by[("round-robin", size)]["replica_max_rate"] == by[("session-affinity", size)]["replica_max_rate"]
    assert two["num_runs"] <= 2 * one["num_runs"] + 2  # two searches (tier sizes) and confirmations, not four


def test_plan_refuses_a_session_workload_for_disaggregated_candidates():
    result = runner.invoke(app, [*PLAN[:-1], "--workload", "chat-sessions", "--rate", "1", "--disagg", "auto"])
    assert result.exit_code != 0 and "session workloads" in result.output and "Traceback" not in result.output


def _overloaded_sessions(tmp_path, rate: float):
    """Sessions of 3 turns on one sequence at a time, each turn ~33 steps of 10 ms: ~3 turns/s served."""
    from kvsim.reports.sweep_runner import Point, run_point
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.specs import EngineConfig
    from tests.helpers import flat_profile

    path = tmp_path / "s.yaml"
    path.write_text(SHORT.replace("num_sessions: 100", "num_sessions: 60").replace("value: 64", "value: 16"))
    wl = load_workload(str(path), {"rate": rate}, max_model_len=2048)
    config = EngineConfig(max_num_seqs=1, enable_prefix_caching=False)
    return run_point(Point(get_model("tiny"), get_gpu("H100-SXM-80GB"), config, wl, flat_profile(linear_ms=5.0), 0))


def test_a_sweep_point_of_sessions_whose_queue_grows_is_overloaded(tmp_path):
    """15 turns/s offered to a server of ~3: TTFT p95 17 s, yet completed turns keep pace with
    offered ones (3.1 of 3.4 /s) and the whole run's queue slope is 0.02 s/s; while sessions
    start, the queue grows 1.6 s per s."""
    light, heavy = _overloaded_sessions(tmp_path, 0.3), _overloaded_sessions(tmp_path, 5.0)
    assert light["saturation"] == "sustained" and light["session_queue_slope"] < 0.05
    assert heavy["queue_wait_slope"] < 0.05 < heavy["session_queue_slope"]
    assert heavy["saturation"] == "overloaded"
