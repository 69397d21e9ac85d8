"""Multi-turn sessions: prefix caching across turns, the CPU KV tier, prefix-aware routing."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.simcore import fastcore
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.errors import ConfigError, WorkloadError
from kvsim.simcore.prefix_hash import TokenStream, hash_block_tokens
from kvsim.simcore.simulate import prepare
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload
from kvsim.workloads.arrivals import ClosedLoop, TraceArrivals
from kvsim.workloads.lengths import Fixed
from kvsim.workloads.sessions import SessionTrace, SessionWorkload
from tests.helpers import ListWorkload, flat_profile, req

TINY, H100 = MODELS["tiny"], GPUS["H100-SXM-80GB"]


def traced(rows, think_s=5.0, **kw):
    """A session trace: rows of (session id, start s, new user tokens, output tokens)."""
    sid, start, new, out = (np.array(c) for c in zip(*rows, strict=True))
    trace = SessionTrace("test", sid.astype(np.int64), start.astype(float), new.astype(np.int64), out.astype(np.int64))
    return SessionWorkload("t", len(set(sid.tolist())), TraceArrivals(), None, None, None, think_time_s=think_s,
                           think_time_dist="fixed", trace=trace, **kw)


def test_block_hashes_chain_like_vllm_and_a_stream_extends_its_own_prefix():
    stream = TokenStream(3)
    first = stream.block_hashes(4, 2)
    assert first[1] == hash_block_tokens(first[0], stream.token_ids(4, 8))
    assert stream.block_hashes(4, 5)[:2] == first  # a longer turn starts with the same blocks
    other = TokenStream(5)
    assert other.block_hashes(4, 1) != first[:1]
    shared = [TokenStream(k, shared_key=0, shared_len=8) for k in (7, 9)]
    a, b = (s.block_hashes(4, 3) for s in shared)
    assert a[:2] == b[:2] and a[2] != b[2]  # the system prompt's blocks alike, then they differ


def test_turn_two_hits_exactly_the_blocks_turn_one_computed():
    # turn 1: 10 prompt tokens, 6 out -> 15 slots written (the last token is never fed back):
    # 3 full blocks of 4. Turn 2's prompt = 16 + 5 = 21 tokens: hits those 3 blocks, computes 9.
    wl = traced([(0, 0.0, 10, 6), (0, 0.0, 5, 2)])
    sim = prepare(TINY, H100, EngineConfig(block_size=4, max_model_len=64), wl, flat_profile())
    result = sim.run()
    prefills = [n for n in result.steps["num_prefill_tokens"].tolist() if n]
    assert prefills == [10, 9]
    assert result.summary["prefix_cache_hit_rate"] == 12 / (10 + 21)
    assert result.requests["num_prompt_tokens"].tolist() == [10, 21]
    assert result.record["engine_core"] == "c"  # the compiled core runs sessions (the same run: below)
    assert [row["count"] for row in result.summary["ttft_by_turn"]] == [1, 1]


def test_without_prefix_caching_turn_two_recomputes_the_conversation():
    wl = traced([(0, 0.0, 10, 6), (0, 0.0, 5, 2)])
    result = prepare(TINY, H100, EngineConfig(block_size=4, max_model_len=64, enable_prefix_caching=False),
                     wl, flat_profile()).run()
    assert [n for n in result.steps["num_prefill_tokens"].tolist() if n] == [10, 21]


def test_an_evicted_turn_is_loaded_back_from_the_cpu_tier_priced_as_pcie_transfer():
    # GPU: 7 blocks of 4. Session 0's turn 1 leaves 3 cached blocks; session 1's 27-token prompt
    # (7 blocks) evicts them all; they were written through to the CPU tier, so session 0's turn 2
    # loads 3 blocks over the host link (the engine is idle: it waits exactly the transfer).
    wl = traced([(0, 0.0, 12, 4), (1, 1.0, 27, 1), (0, 0.0, 4, 2)], think_s=10.0)
    config = EngineConfig(block_size=4, max_model_len=28, num_gpu_blocks_override=7, kv_offloading_size=0.01)
    sim = prepare(TINY, H100, config, wl, flat_profile(), exact_steps=True)
    result = sim.run()
    assert result.record["engine_core"] == "python"
    assert result.summary["offload_loaded_blocks"] == 3
    assert result.summary["cpu_prefix_cache_hit_rate"] == 12 / (12 + 27 + 20)
    turn2 = result.requests.iloc[-1]
    assert turn2["num_prompt_tokens"] == 20
    waited = turn2["first_scheduled_s"] - turn2["arrival_s"]
    assert waited == pytest.approx(3 * sim.config.swap_block_s, rel=1e-9)
    assert [n for n in result.steps["num_prefill_tokens"].tolist() if n][-1] == 20 - 12
    # TTFT split three ways: the load is turn 2's wait, the parts add up to the mean TTFT
    split = result.summary["ttft_split_ms"]
    assert split["load"] == pytest.approx(3 * sim.config.swap_block_s * 1000 / 3, rel=1e-9)
    assert split["queueing"] + split["load"] + split["prefill"] == pytest.approx(result.summary["mean_ttft_ms"], rel=1e-9)
    assert split["queueing"] == pytest.approx(0.0, abs=1e-9)  # idle engine: nobody queued
    _same_in_both_cores(config, wl, "evicted turn loaded back")


def test_without_the_cpu_tier_the_evicted_turn_is_recomputed():
    wl = traced([(0, 0.0, 12, 4), (1, 1.0, 27, 1), (0, 0.0, 4, 2)], think_s=10.0)
    config = EngineConfig(block_size=4, max_model_len=28, num_gpu_blocks_override=7)
    result = prepare(TINY, H100, config, wl, flat_profile()).run()
    assert "offload_loaded_blocks" not in result.summary
    assert [n for n in result.steps["num_prefill_tokens"].tolist() if n][-1] == 20


@pytest.mark.parametrize("router, replica", [("prefix-aware", 1), ("least-loaded", 0)])
def test_prefix_aware_router_sends_turn_two_to_turn_ones_replica_when_load_is_equal(router, replica):
    # session 1 starts while session 0 runs on replica 0, so it goes to replica 1; its turn 2
    # (request 2: session 0's longer answer ends later) arrives to idle replicas: prefix-aware
    # follows the cache, least-loaded takes the lowest index
    wl = traced([(0, 0.0, 40, 200), (1, 0.001, 40, 20), (0, 0.0, 8, 2), (1, 0.0, 8, 2)], think_s=5.0)
    config = EngineConfig(block_size=4, max_model_len=128, data_parallel_size=2, router=router)
    result = prepare(TINY, H100, config, wl, flat_profile(), exact_steps=True).run()
    _same_in_both_cores(config, wl, f"router {router}")
    replicas = dict(zip(result.requests["request_id"], result.requests["replica"], strict=True))
    assert replicas[1] == 1
    assert replicas[2] == replica
    if router == "prefix-aware":
        assert result.summary["prefix_cache_hit_rate_by_replica"][1] > 0


def test_session_affinity_keeps_a_conversation_on_one_replica():
    wl = traced([(0, 0.0, 40, 20), (1, 0.001, 40, 20), (0, 0.0, 8, 2), (1, 0.0, 8, 2)], think_s=5.0)
    config = EngineConfig(block_size=4, max_model_len=128, data_parallel_size=2, router="session-affinity")
    result = prepare(TINY, H100, config, wl, flat_profile()).run()
    replicas = dict(zip(result.requests["request_id"], result.requests["replica"], strict=True))
    assert (replicas[0], replicas[2]) == (0, 0) and (replicas[1], replicas[3]) == (1, 1)


def test_the_c_core_runs_sessions_the_cpu_tier_and_both_routers_but_not_the_tier_with_declared_prefixes():
    from kvsim.workloads.arrivals import GammaArrivals
    from kvsim.workloads.lengths import Uniform
    from kvsim.workloads.spec import SharedPrefix, WorkloadSpec
    from tests.test_fastcore_equivalence import ArraysWorkload

    plain = ArraysWorkload([0.0], [8], [2])
    sessions = traced([(0, 0.0, 10, 6)])
    for workload, fields in [(sessions, {}), (plain, {"kv_offloading_size": 1.0}),
                             (plain, {"data_parallel_size": 2, "router": "prefix-aware"}),
                             (sessions, {"data_parallel_size": 2, "router": "session-affinity", "kv_offloading_size": 1.0})]:
        sim = prepare(TINY, H100, EngineConfig(block_size=4, max_model_len=64, **fields), workload, flat_profile())
        assert fastcore.unsupported(sim) == ""
    prefixed = WorkloadSpec(name="p", num_requests=4, arrival=GammaArrivals(rate=10.0), prompt_len=Uniform(1, 20),
                            output_len=Uniform(1, 20), shared_prefix=SharedPrefix(num_groups=1, prefix_len=8, fraction=1.0))
    config = EngineConfig(block_size=4, max_model_len=64, kv_offloading_size=1.0)
    sim = prepare(TINY, H100, config, prefixed, flat_profile())
    assert "declared shared prefixes" in fastcore.unsupported(sim)
    with pytest.raises(ConfigError, match="declared shared prefixes"):
        prepare(TINY, H100, config, prefixed, flat_profile(), engine_core="c").run()


@pytest.mark.parametrize("fields", [{"kv_offloading_size": -1.0}, {"kv_offloading_size": float("nan")},
                                    {"kv_offloading_size": 1.0, "enable_chunked_prefill": False},
                                    {"kv_offloading_size": 1.0, "enable_prefix_caching": False},
                                    {"kv_offloading_size": 1.0, "preemption_mode": "swap"}])
def test_bad_offloading_sizes_are_refused(fields):
    with pytest.raises(ConfigError, match="kv-offloading-size"):
        prepare(TINY, H100, EngineConfig(max_model_len=64, **fields), ListWorkload([req(0, 0.0, 8, 2)]), flat_profile())


def test_catalog_session_workloads_run_and_report_ttft_by_turn():
    wl = load_workload("chat-sessions", {"num_requests": 3}, max_model_len=2048)
    result = prepare(TINY, H100, EngineConfig(max_model_len=2048), wl, flat_profile(), seed=1).run()
    assert result.summary["prefix_cache_hit_rate"] > 0
    assert result.record["workload"]["sessions"]["num_sessions"] == 3
    assert result.summary["ttft_by_turn"][0]["count"] == 3
    agent = load_workload("agent-sessions", {"num_requests": 2, "rate": 1.0})
    assert agent.shared_prefix.prefix_len == 2048 and agent.arrival.rate == 1.0
    with pytest.raises(WorkloadError, match="system prompt"):  # 2,048 system tokens leave no room
        load_workload("agent-sessions", None, max_model_len=2048)


def test_a_session_trace_file_replays_as_sessions(tmp_path):
    path = tmp_path / "sessions.csv"
    path.write_text("arrival_s,num_prompt_tokens,num_output_tokens,session_id\n"
                    "0.0,10,6,0\n0.5,20,3,1\n9.0,5,2,0\n")
    wl = load_workload(str(path))
    assert isinstance(wl, SessionWorkload) and wl.num_sessions == 2
    result = prepare(TINY, H100, EngineConfig(block_size=4, max_model_len=64), wl, flat_profile()).run()
    assert sorted(result.requests["num_prompt_tokens"].tolist()) == [10, 20, 21]


def test_a_turn_that_would_not_fit_ends_its_session():
    # 20 new + 20 out per turn, max_model_len 64: turn 2's prompt is 60 (its answer capped at 4),
    # turn 3's would be 84, so the session ends after two turns
    wl = SessionWorkload("t", 1, ClosedLoop(1), Fixed(5), Fixed(20), Fixed(20), max_model_len=64)
    result = prepare(TINY, H100, EngineConfig(block_size=4, max_model_len=64), wl, flat_profile()).run()
    assert result.record["workload"]["generation"]["ended_at_max_model_len"] == 1
    assert result.requests["num_prompt_tokens"].tolist() == [20, 60]
    assert result.requests["num_output_tokens"].tolist() == [20, 4]


def test_cli_runs_sessions_with_a_cpu_tier_and_sweeps_router_and_tier_size(tmp_path):
    import json

    from typer.testing import CliRunner

    from kvsim.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["run", "--model", "tiny", "--workload", "chat-sessions", "--num-requests", "4",
                                 "--kv-offloading-size", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["prefix_cache_hit_rate"] > 0 and "cpu_prefix_cache_hit_rate" in summary
    out = tmp_path / "sweep.csv"
    result = runner.invoke(app, ["sweep", "--model", "tiny", "--workload", "chat-sessions", "--num-requests", "4",
                                 "--dp", "2", "--router", "round-robin,prefix-aware", "--kv-offloading-size", "0,1",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    import pandas as pd

    table = pd.read_csv(out)
    assert sorted(set(table["router"])) == ["prefix-aware", "round-robin"] and table["kv_offloading_size"].isna().sum() == 2
    bad = runner.invoke(app, ["sweep", "--model", "tiny", "--router", "nearest"])
    assert bad.exit_code != 0 and "--router" in bad.output


@pytest.mark.parametrize("args, words", [
    (["plan", "--rate", "1", "--workload", "chat-sessions", "--gpu", "H100-SXM-80GB", "--tp", "1", "--disagg", "on"],
     "session"),  # (plan sizes sessions aggregated: tests/test_plan_sessions.py)
    # (run --find-max-rate on sessions searches sessions/s: tests/test_session_runs.py)
    (["run", "--model", "tiny", "--workload", "chat-sessions", "--max-tokens", "5"], "--max-tokens"),
    (["run", "--model", "tiny", "--kv-offloading-size", "-1"], "--kv-offloading-size"),
    (["run", "--model", "llama3-8b", "--prefill-replicas", "1", "--decode-replicas", "1", "--workload",
      "chat-sessions"], "disaggregated"),
    (["run", "--model", "llama3-8b", "--prefill-replicas", "1", "--decode-replicas", "1", "--kv-offloading-size",
      "4"], "disaggregated"),
])
def test_what_sessions_and_the_cpu_tier_do_not_take_is_one_error_line(args, words):
    from typer.testing import CliRunner

    from kvsim.cli.main import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and words in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("fields", [
    {"num_gpu_blocks_override": 160, "kv_offloading_size": 0.01},
    {"num_gpu_blocks_override": 160, "data_parallel_size": 2, "router": "prefix-aware"},
    {"data_parallel_size": 2, "router": "session-affinity"},
])
def test_decode_spans_give_the_step_by_step_results(fields):
    wl = load_workload("chat-sessions", {"num_requests": 12, "rate": 4.0}, max_model_len=2048)
    runs = [prepare(TINY, H100, EngineConfig(max_model_len=2048, **fields), wl, flat_profile(), seed=2,
                    exact_steps=exact).run() for exact in (False, True)]
    cols = ["request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "num_prompt_tokens"]
    assert runs[0].requests[cols].equals(runs[1].requests[cols])
    assert runs[0].summary["prefix_cache_hit_rate"] == runs[1].summary["prefix_cache_hit_rate"]
    if "kv_offloading_size" in fields:  # the CPU tier was used (and preemptions happened)
        assert runs[0].summary["cpu_prefix_cache_hit_rate"] > 0.3 and runs[0].summary["num_preemptions"] > 0


def test_the_cpu_tier_is_an_lru_of_block_hashes_written_through_once():
    from kvsim.simcore.kv_tier import HostKVTier

    tier = HostKVTier(3)
    tier.store(["a", "b", "c"])
    tier.touch(["a"])  # a lookup marks a used: b is now the least recently used
    tier.store(["c", "d"])  # c is held already (not copied again); d evicts b
    assert (tier.num_stored, tier.num_evicted) == (4, 1)
    assert "b" not in tier and tier.num_hits(["a", "c", "d"], 0) == 3
    assert tier.num_hits(["a", "b", "c"], 0) == 1  # a prefix stops at the first miss


# -- the compiled core against the Python reference (tests/test_fastcore_equivalence.py's checks) --

def _same_in_both_cores(config, workload, context, seed=0):
    """The C core's run is the Python engine's (--exact-steps): requests, ITLs, summary (TTFT by
    turn, hit rates per tier and replica, offload traffic), steps, the workload's record."""
    from kvsim.simcore import ccore
    from tests.test_fastcore_equivalence import _compare

    if ccore.library() is None:
        pytest.skip("no compiled core (no C compiler?)")
    return _compare(config, workload, seed=seed, context=context)


def _random_sessions(rng):
    """A random small session workload: open loop (Poisson starts) or closed loop (clients, with
    or without pauses between sessions) or a trace; think times (some zero); system prompts shared
    by some sessions; turns that run into max_model_len."""
    from kvsim.workloads.arrivals import GammaArrivals
    from kvsim.workloads.lengths import Uniform
    from kvsim.workloads.spec import SharedPrefix
    from tests.test_fastcore_equivalence import _random_case

    config, _ = _random_case(rng)
    mml = config.max_model_len
    num = int(rng.integers(1, 12))
    kind = int(rng.integers(0, 3))
    think = float(rng.choice([0.0, 0.0005, 0.005]))
    prefix = SharedPrefix(num_groups=int(rng.integers(1, 3)), prefix_len=int(rng.integers(1, mml // 3)),
                          fraction=float(rng.choice([0.0, 0.5, 1.0]))) if rng.random() < 0.5 else None
    if kind == 2:
        rows = [(int(rng.integers(0, num)), float(rng.exponential(0.002)), int(rng.integers(1, mml // 3)),
                 int(rng.integers(1, mml // 3))) for _ in range(int(rng.integers(2, 24)))]
        rows.sort(key=lambda r: r[1])
        ids = sorted({r[0] for r in rows})
        rows = [(ids.index(r[0]), *r[1:]) for r in rows]
        wl = traced(rows, think_s=think, max_model_len=mml, shared_prefix=prefix)
    else:
        arrival = (GammaArrivals(rate=float(rng.choice([200.0, 2000.0, 20000.0]))) if kind == 0 else
                   ClosedLoop(int(rng.integers(1, 5)), float(rng.choice([0.0, 0.001])), str(rng.choice(["fixed", "exponential"]))))
        wl = SessionWorkload("s", num, arrival, Uniform(1, 5), Uniform(1, mml // 3), Uniform(1, mml // 3),
                             think_time_s=think, think_time_dist=str(rng.choice(["fixed", "exponential"])),
                             first_prompt_len=Uniform(1, mml // 2) if rng.random() < 0.3 else None,
                             shared_prefix=prefix, max_model_len=mml)
    return config, wl


@pytest.mark.parametrize("block", range(4))
def test_sessions_in_the_core_match_the_python_reference(block):
    """Random session runs on one replica, V0 and V1, prefix caching on and off, tiny caches that
    evict and preempt: turns sent when answers come back, chained block hashes adopted across turns."""
    import dataclasses

    hits = ended = 0
    for case in range(block * 12, (block + 1) * 12):
        rng = np.random.default_rng(9000 + case)
        config, wl = _random_sessions(rng)
        if rng.random() < 0.6:
            config = dataclasses.replace(config, enable_prefix_caching=True)
        core, _ = _same_in_both_cores(config, wl, f"sessions case {case}: {config}", seed=case)
        hits += bool(core.summary.get("prefix_cache_hit_rate"))
        ended += core.record["workload"]["generation"]["ended_at_max_model_len"]
    assert hits >= 3 and ended, "the cases should hit cached turns and end sessions at max_model_len"


@pytest.mark.parametrize("router", ["prefix-aware", "session-affinity", "least-loaded", "round-robin"])
def test_sessions_behind_each_router_match(router):
    """Sessions over 2 or 4 replicas behind each router, the prefix-aware one scoring the real caches."""
    import dataclasses

    for case in range(8):
        rng = np.random.default_rng(9500 + case)
        config, wl = _random_sessions(rng)
        config = dataclasses.replace(config, data_parallel_size=int(rng.choice([2, 4])), router=router,
                                     enable_prefix_caching=bool(rng.random() < 0.8))
        _same_in_both_cores(config, wl, f"{router} case {case}: {config}", seed=case)


@pytest.mark.parametrize("dp", [1, 2])
def test_the_cpu_tier_in_the_core_matches(dp):
    """The CPU tier (V1, prefix caching): write-through of computed blocks, LRU evictions, loads
    queued on each replica's host link while other requests step, an idle engine woken when its
    load is done; small GPU caches so turns are evicted and loaded back."""
    import dataclasses

    from kvsim.workloads.arrivals import GammaArrivals
    from kvsim.workloads.lengths import Uniform

    loaded = 0
    for case in range(10):
        rng = np.random.default_rng(9800 + case)
        config, wl = _random_sessions(rng)
        mml = config.max_model_len
        if case % 2:  # more sessions than the GPU cache holds, coming back after thinking
            wl = SessionWorkload("s", int(rng.integers(6, 16)), GammaArrivals(rate=float(rng.choice([500.0, 5000.0]))),
                                 Uniform(2, 5), Uniform(1, mml // 4), Uniform(1, mml // 4),
                                 think_time_s=float(rng.choice([0.002, 0.02])), max_model_len=mml)
        blocks = -(-mml // config.block_size)
        config = dataclasses.replace(config, enable_chunked_prefill=True, enable_prefix_caching=True,
                                     preemption_mode="recompute", max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_num_seqs),
                                     num_gpu_blocks_override=blocks + int(rng.integers(0, 2 * blocks)),
                                     kv_offloading_size=float(rng.choice([0.00002, 0.0001, 0.01])),
                                     data_parallel_size=dp, router=str(rng.choice(["prefix-aware", "least-loaded"])))
        core, _ = _same_in_both_cores(config, wl, f"tier dp {dp} case {case}: {config}", seed=case)
        loaded += core.summary.get("offload_loaded_blocks", 0) > 0
    assert loaded >= 3, "the cases should load turns back from the CPU tier"


def test_a_start_time_the_timeout_rounds_below_starts_the_session_in_both_cores():
    """Regression (fuzz): the open loop's starter waits `timeout(at - now)`, which lands on
    now + (at - now), here one ulp below `at`; the session starts then (the Python loop does not
    test `at > now` again), where the C core used to wait once more and start it one ulp late."""
    from tests.test_fastcore_equivalence import _random_case

    first, second = 0.0017722674047465881, 0.0038806673178451924
    assert first + (second - first) < second  # the rounding this case is about
    config, _ = _random_case(np.random.default_rng(0))
    wl = traced([(0, first, 20, 10), (1, second, 12, 6)], think_s=0.0005, max_model_len=config.max_model_len)
    core, exact = _same_in_both_cores(config, wl, "two traced starts")
    arrivals = core.requests["arrival_s"].to_numpy()
    assert np.array_equal(arrivals, exact.requests["arrival_s"].to_numpy())  # bit for bit
    assert arrivals[1] == first + (second - first)
