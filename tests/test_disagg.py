"""Disaggregated prefill/decode (simcore.disagg): hand-computed timelines through both pools.

The flat test profile prices every step of the tiny model (2 layers) at 2 ms whatever it holds;
the tests give the KV link their own latency and bandwidth: 1 ms + 4 ms for one request's
64-token prompt (64 x 1024 bytes of KV at 16,384,000 B/s), so every instant below is exact.
"""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore import fastcore
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.disagg import (
    KvLink,
    LinkSpec,
    default_placement,
    kv_transfer_bytes_per_token,
    link_spec,
    prepare_disagg,
)
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.specs import EngineConfig
from tests.helpers import ListWorkload, flat_profile, req

TINY, H100 = MODELS["tiny"], GPUS["H100-SXM-80GB"]
STEP = 0.002  # every step: 2 layers x 1 ms
LINK = LinkSpec("same-node", 0.001, 64 * 1024 / 0.004, 1, 0.0)  # 1 ms + 4 ms per 64-token prompt


def disagg(requests, prefill=None, decode=None, link=LINK, **kw):
    configs = {"prefill": EngineConfig(**(prefill or {})), "decode": EngineConfig(**(decode or {}))}
    profiles = {"prefill": flat_profile(), "decode": flat_profile()}
    return prepare_disagg(TINY, H100, configs, ListWorkload(requests), profiles, link=link, **kw)


def test_one_request_through_both_pools_hand_computed():
    # prefill 0-2 ms; transfer 2-7 ms; the decode step that recomputes the last prompt token 7-9 ms
    # (first token); three decode steps to 15 ms
    assert kv_transfer_bytes_per_token(TINY, 1) == 1024
    sim = disagg([req(0, 0.0, 64, 4)])
    result = sim.run()
    row = result.requests.iloc[0]
    assert row["status"] == "finished"
    assert math.isclose(row["ttft_s"], 2 * STEP + 0.005, abs_tol=1e-12)  # includes transfer + first decode step
    assert math.isclose(row["e2el_s"], 2 * STEP + 0.005 + 3 * STEP, abs_tol=1e-12)
    t = result.transfers.columns()
    assert math.isclose(t["prefilled_s"][0], STEP) and math.isclose(t["start_s"][0], STEP)
    assert math.isclose(t["end_s"][0], STEP + 0.005, abs_tol=1e-12)
    assert t["nbytes"][0] == 64 * 1024
    # the prefill instance held the blocks until the transfer ended, then freed them all
    prefill, decode = sim.pools["prefill"].replicas[0], sim.pools["decode"].replicas[0]
    assert prefill.policy.allocator.num_used_blocks == 0 and prefill.policy.num_held == 0
    assert decode.policy.allocator.num_used_blocks == 0
    s = result.summary
    assert s["kv_transfer"]["num_transfers"] == 1 and math.isclose(s["kv_transfer"]["p50_transfer_ms"], 5.0)
    assert s["pools"]["prefill"]["num_steps"] == 1 and s["pools"]["decode"]["num_steps"] == 4
    assert set(result.steps["pool"]) == {"prefill", "decode"}
    assert result.record["engine_core"] == "python"


def test_two_concurrent_transfers_over_one_link_take_twice_as_long():
    # both prompts prefill in one step (0-2 ms) and start their transfers into the one decode
    # instance together: each gets half the bandwidth, so 1 ms + 2 x 4 ms
    result = disagg([req(0, 0.0, 64, 4), req(1, 0.0, 64, 4)]).run()
    t = result.transfers.columns()
    durations = t["end_s"] - t["start_s"]
    assert all(math.isclose(d, 0.001 + 0.008, abs_tol=1e-12) for d in durations)
    assert result.summary["kv_transfer"]["max_transfers_in_flight"] == 2
    # two decode instances: one link each, no sharing
    two = disagg([req(0, 0.0, 64, 4), req(1, 0.0, 64, 4)], decode={"data_parallel_size": 2}).run()
    t2 = two.transfers.columns()
    assert sorted(t2["decode_instance"].tolist()) == [0, 1]
    assert all(math.isclose(d, 0.005, abs_tol=1e-12) for d in t2["end_s"] - t2["start_s"])


def test_link_shares_bandwidth_between_overlapping_transfers():
    import simpy

    env = simpy.Environment()
    link = KvLink(env, LinkSpec("same-node", 0.0, 100.0, 1, 0.0))  # 100 B/s
    done = {}
    link.start(0, 100.0, lambda: done.setdefault(0, env.now))
    env.run(until=0.5)  # 50 B sent alone
    link.start(1, 25.0, lambda: done.setdefault(1, env.now))
    env.run()
    # from 0.5 s both flow at 50 B/s: the 25 B one ends at 1.0 s, the rest (25 B) alone at 1.25 s
    assert math.isclose(done[1], 1.0) and math.isclose(done[0], 1.25)


def test_decode_admission_waits_for_blocks_and_the_kv_waits_on_the_prefill_side():
    # the decode cache has 6 blocks of 16: r0's prompt takes 4 (5 by its end), so r1's 4 wait
    # until r0 finishes at 15 ms; r1's KV stays on the prefill instance until then + its transfer
    sim = disagg([req(0, 0.0, 64, 4), req(1, 0.0, 64, 4)], decode={"num_gpu_blocks_override": 6, "max_model_len": 80})
    result = sim.run()
    t = result.transfers.columns()
    assert math.isclose(t["start_s"][0], STEP) and math.isclose(t["start_s"][1], 15 * 0.001, abs_tol=1e-12)
    assert math.isclose(t["end_s"][1], 0.015 + 0.005, abs_tol=1e-12)
    r1 = result.requests.set_index("request_id").loc[1]
    assert math.isclose(r1["ttft_s"], 0.020 + STEP, abs_tol=1e-12)
    k = result.summary["kv_transfer"]
    assert math.isclose(k["mean_decode_wait_ms"], (0 + 13) / 2) and math.isclose(k["mean_prefill_held_ms"], (5 + 18) / 2)
    assert result.summary["completed"] == 2
    assert sim.pools["prefill"].replicas[0].policy.allocator.num_used_blocks == 0


def test_held_kv_keeps_the_prefill_instance_from_new_prompts():
    # prefill cache: 5 blocks; r0 (4 blocks) is held while its transfer waits for the full decode
    # instance, so r1 (arriving at 1 ms) cannot prefill before r0's blocks are freed at 7 ms
    sim = disagg([req(0, 0.0, 64, 4), req(1, 0.001, 64, 4)], prefill={"num_gpu_blocks_override": 5, "max_model_len": 80})
    result = sim.run()
    rows = result.transfers.columns()
    assert math.isclose(rows["prefilled_s"][1], 0.007 + STEP, abs_tol=1e-12)


def test_prefix_aware_prefill_routing_follows_the_cached_prefix():
    # r0 (a 48-token shared prefix: 3 blocks of 16) prefills on instance 0 and leaves its blocks
    # cached there; at 20 ms r2 (no prefix) arrives first and takes instance 0 (least loaded, the
    # lowest index), then r1 (the same prefix): least-loaded sends it to the idle instance 1,
    # prefix-aware to instance 0 (2 x 3/4 for the prefix + its free KV + a queue score of 0 beats
    # instance 1's 0 + 1 + 1), where it computes only its last 16 tokens
    def requests():
        return [req(0, 0.0, 64, 4, prefix_id=7, num_prefix_tokens=48), req(2, 0.02, 64, 4),
                req(1, 0.02, 64, 4, prefix_id=7, num_prefix_tokens=48)]

    pools = {"enable_prefix_caching": True, "data_parallel_size": 2}
    picked = {}
    for router in ("least-loaded", "prefix-aware"):
        sim = disagg(requests(), prefill={**pools, "router": router}, engine_core="python")
        t = sim.run().transfers.columns()
        picked[router] = dict(zip(t["request_id"].tolist(), t["prefill_instance"].tolist(), strict=True))
    assert picked["least-loaded"] == {0: 0, 2: 0, 1: 1}
    assert picked["prefix-aware"] == {0: 0, 2: 0, 1: 0}
    assert sim.pools["prefill"].replicas[0].policy.prefix_hit_tokens == 48
    with pytest.raises(ConfigError, match="prefix-aware"):
        disagg(requests(), decode={"router": "prefix-aware"})


def test_compiled_core_runs_the_hand_computed_timeline():
    # the first test's request through the compiled core (simcore/csrc/disagg.c; equivalence on
    # many cases: tests/test_disagg_core.py), and what it refuses, by name
    from kvsim.simcore import ccore
    from tests.test_fastcore_equivalence import ArraysWorkload

    if ccore.library() is None:
        pytest.skip("no compiled core")
    configs = {"prefill": EngineConfig(), "decode": EngineConfig()}
    profiles = {"prefill": flat_profile(), "decode": flat_profile()}
    sim = prepare_disagg(TINY, H100, configs, ArraysWorkload([0.0], [64], [4]), profiles, link=LINK)
    assert fastcore.unsupported(sim) == ""
    result = sim.run()
    assert result.record["engine_core"] == "c"
    row = result.requests.iloc[0]
    assert math.isclose(row["ttft_s"], 2 * STEP + 0.005, abs_tol=1e-12)
    assert math.isclose(row["e2el_s"], 2 * STEP + 0.005 + 3 * STEP, abs_tol=1e-12)
    assert math.isclose(result.transfers.columns()["end_s"][0], STEP + 0.005, abs_tol=1e-12)
    assert result.summary["pools"]["prefill"]["num_steps"] == 1 and result.summary["pools"]["decode"]["num_steps"] == 4
    sim = disagg([req(0, 0.0, 64, 4)])  # a workload that is not arrays: the Python engine runs it
    assert "prefill pool" in fastcore.unsupported(sim)
    with pytest.raises(ConfigError, match="cannot run"):
        disagg([req(0, 0.0, 64, 4)], engine_core="c").run()


def test_pools_must_share_block_size_and_run_v1():
    with pytest.raises(ConfigError, match="block-size"):
        disagg([req(0, 0.0, 64, 4)], decode={"block_size": 32})
    with pytest.raises(ConfigError, match="V1"):
        disagg([req(0, 0.0, 64, 4)], prefill={"enable_chunked_prefill": False})


def test_link_from_measured_fits_and_placement():
    same, cross = link_spec(H100, "same-node", 4, 4), link_spec(H100, "cross-node", 4, 4)
    assert same.streams == 4 and math.isclose(same.bytes_per_s, 4 * 357.5e9)
    assert math.isclose(cross.bytes_per_s, 4 * 35.9e9) and cross.latency_s > same.latency_s
    assert link_spec(H100, "same-node", 2, 8).streams == 2
    assert default_placement(H100, 4, 4) == "same-node" and default_placement(H100, 8, 4) == "cross-node"
    with pytest.raises(ConfigError, match="disagg-placement"):
        link_spec(H100, "moon", 1, 1)


def test_cli_disagg_run_cross_node_never_faster_than_same_node():
    runner = CliRunner()
    common = ["run", "--model", "llama3-8b", "--prefill-replicas", "1", "--prefill-tp", "1",
              "--decode-replicas", "1", "--decode-tp", "1", "--num-requests", "30", "--rate", "4",
              "--input-len", "2000", "--output-len", "50", "--json"]
    import json

    docs = {}
    for placement in ("same-node", "cross-node"):
        out = runner.invoke(app, [*common, "--disagg-placement", placement])
        assert out.exit_code == 0, out.output
        docs[placement] = json.loads(out.stdout)
    same, cross = (docs[p]["summary"] for p in ("same-node", "cross-node"))
    assert cross["kv_transfer"]["mean_transfer_ms"] > same["kv_transfer"]["mean_transfer_ms"]
    assert cross["mean_e2el_ms"] >= same["mean_e2el_ms"] and cross["mean_ttft_ms"] >= same["mean_ttft_ms"]
    assert docs["same-node"]["record"]["engine_core"] == "c"  # the compiled core runs it (test_disagg_core.py)
    assert docs["same-node"]["record"]["disagg"]["link"]["connector"] == "NixlConnector"


def test_cli_refuses_mixing_disagg_with_dp():
    runner = CliRunner()
    out = runner.invoke(app, ["run", "--prefill-replicas", "1", "--decode-replicas", "1", "--dp", "2"])
    assert out.exit_code != 0 and "kvsim: error:" in out.output and "Traceback" not in out.output


PLAN = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1", "--rate", "2",
        "--slo-tpot-p95-ms", "60", "--slo-ttft-p95-ms", "2000", "--disagg-ratios", "1:1", "--search-requests", "60",
        "--confirm-requests", "60", "--input-len", "500", "--output-len", "30", "--workload", "fixed-batch", "--json"]


def test_plan_disagg_auto_lists_both_layouts_and_names_the_cheaper():
    import json

    out = CliRunner().invoke(app, [*PLAN, "--disagg", "auto"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    answer = doc["disagg"]["answers"][0]
    # one TP1 replica meets the SLO at 2 req/s; the smallest unit (1 prefill + 1 decode) costs twice that
    assert doc["answers"][0]["best"]["gpus"] == 1
    assert answer["comparison"].startswith("aggregated")
    row = doc["disagg"]["candidates"][0]
    assert row["layout"] == "disagg" and row["status"].startswith("cost bound")


def test_plan_disagg_on_searches_and_confirms_a_unit():
    import json

    out = CliRunner().invoke(app, [*PLAN, "--disagg", "on"])
    assert out.exit_code == 0, out.output
    best = json.loads(out.stdout)["disagg"]["answers"][0]["best"]
    assert best["prefill"] == "1xTP1" and best["decode"] == "1xTP1" and best["gpus"] == 2
    assert best["confirmed"].startswith("yes") and best["tpot_p95_ms"] <= 60


@pytest.mark.parametrize("args, message", [
    (["--disagg", "maybe"], "--disagg must be"),
    (["--disagg", "auto", "--disagg-ratios", "1-1"], "P:D"),
    (["--disagg-ratios", "1:1"], "apply only with --disagg"),
])
def test_plan_disagg_bad_input(args, message):
    base = [a for a in PLAN if a not in ("--disagg-ratios", "1:1")]
    out = CliRunner().invoke(app, [*base, *args])
    assert out.exit_code != 0 and message in out.output and "Traceback" not in out.output


def test_expert_parallel_is_refused_in_a_disaggregated_run():
    out = CliRunner().invoke(app, ["run", "--model", "mixtral-8x7b", "--tp", "2", "--prefill-replicas", "1",
                                   "--decode-replicas", "1", "--enable-expert-parallel", "--num-requests", "5"])
    assert out.exit_code != 0 and "expert-parallel" in out.output and "Traceback" not in out.output


def test_regime_is_judged_per_pool_against_its_own_cache():
    from kvsim.reports.regime import MEMORY_BOUND, regime_of

    # the decode cache (5 blocks) fills up while r1 waits for blocks; the prefill cache is large
    result = disagg([req(0, 0.0, 64, 4), req(1, 0.0, 64, 4)],
                    decode={"num_gpu_blocks_override": 5, "max_model_len": 80}).run()
    regime = regime_of(result)
    assert regime.label == MEMORY_BOUND and 0.5 < regime.peak_kv_use <= 1.0


def test_decode_spans_give_the_same_run_as_single_steps():
    # bursty traffic, small caches on both sides (held KV, decode preemptions): the fast path
    # (decode spans, cut at transfers) equals one event per step, request by request
    import numpy as np

    rng = np.random.default_rng(1)
    times = np.cumsum(rng.exponential(0.004, 150))
    requests = [req(i, float(t), int(p), int(o)) for i, (t, p, o) in
                enumerate(zip(times, rng.integers(5, 300, 150), rng.integers(1, 60, 150), strict=True))]

    def run(exact):
        configs = {"prefill": EngineConfig(data_parallel_size=2, num_gpu_blocks_override=60, max_model_len=400),
                   "decode": EngineConfig(num_gpu_blocks_override=80, max_model_len=400)}
        profiles = {"prefill": flat_profile(decode_ms=0.3), "decode": flat_profile(decode_ms=0.3)}
        return prepare_disagg(TINY, H100, configs, ListWorkload(requests), profiles, link=LINK,
                              exact_steps=exact).run()

    fast, exact = run(False), run(True)
    assert fast.summary["completed"] == 150 and fast.summary["num_preemptions"] > 0
    a, b = fast.requests.set_index("request_id"), exact.requests.set_index("request_id")
    assert (a[["ttft_s", "e2el_s"]] - b[["ttft_s", "e2el_s"]]).abs().to_numpy().max() < 1e-9
    assert fast.summary["num_steps"] == exact.summary["num_steps"]


@pytest.mark.parametrize("extra, message", [
    (["--autoscale"], "--autoscale"),
    (["--save-result"], "--save-result"),
    (["--find-max-rate"], "--find-max-rate"),
    (["--profile", "x.json"], "--prefill-profile"),
])
def test_cli_disagg_refuses_what_it_does_not_model(extra, message):
    out = CliRunner().invoke(app, ["run", "--prefill-replicas", "1", "--decode-replicas", "1", "--num-requests", "5",
                                   *extra])
    assert out.exit_code != 0 and message in out.output and "Traceback" not in out.output
