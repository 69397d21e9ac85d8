"""Static, dynamic and Orca policies: exact timelines, KV accounting and invariants on random runs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.contiguous import ContiguousAllocator
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.policies.dynamic import DynamicPolicy
from kvsim.simcore.simulate import prepare, simulate
from kvsim.simcore.specs import EngineConfig
from tests.helpers import ListWorkload, flat_profile, req

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]
STEP_MS = 2.0  # flat profile: 2 layers x 1 ms per step, whatever the batch
SMALL = dict(block_size=4, max_model_len=32)  # 32-token slots


def run(requests, **config):
    return simulate(TINY, H100, EngineConfig(**config), ListWorkload(requests), flat_profile())


def run_direct(requests, policy_factory=None, **config):
    """Run as simulate() does, keeping the engine, the policy and every plan it scheduled."""
    sim = prepare(TINY, H100, EngineConfig(**config), ListWorkload(requests), flat_profile())
    engine = sim.engine
    if policy_factory is not None:
        engine.attach(policy_factory(engine, sim.memory))
    policy = engine.policy
    plans = []
    schedule = policy.schedule

    def spy(queues, now):
        plan = schedule(queues, now)
        if plan is not None:
            plans.append((plan.num_tokens, list(plan.prefill_chunks), plan.num_decode_seqs,
                          plan.decode_context_tokens, plan.num_sampled))
        return plan

    policy.schedule = spy
    sim.run()
    return engine, policy, plans


def ms(result, column):
    return [round(v * 1000, 6) for v in result.requests[column]]


def kv(result, column):
    return result.steps[column].tolist()


# -- static --------------------------------------------------------------------------------
def test_static_waits_for_the_timeout_pads_and_holds_finished_slots():
    # r0 (prompt 4, 3 out) at 0 and r1 (prompt 8, 1 out) at 1 ms: the batch is not full (3), so it
    # launches at the 5 ms timeout: prefill 2 x 8 padded tokens [5, 7); r1 finishes at 7 ms but its
    # slot keeps decoding with r0 [7, 9), [9, 11). r2 arrives at 8 ms mid-batch and does not join;
    # the batch has ended at 11 ms, and r2's own timeout fires at 13 ms.
    result = run(
        [req(0, 0.0, 4, 3), req(1, 0.001, 8, 1), req(2, 0.008, 3, 2)],
        policy="static", max_batch_size=3, batch_timeout_s=0.005, num_gpu_blocks_override=24, **SMALL,
    )
    assert ms(result, "first_token_s") == [7.0, 7.0, 15.0]
    assert ms(result, "finish_s") == [11.0, 7.0, 17.0]
    assert ms(result, "ttft_s") == [7.0, 6.0, 7.0]
    assert [round(s * 1000, 6) for s in result.steps["start_s"]] == [5.0, 7.0, 9.0, 13.0, 15.0]
    assert kv(result, "num_prefill_tokens") == [16, 0, 0, 3, 0]
    assert kv(result, "num_decode_tokens") == [0, 2, 2, 0, 1]  # r1's finished slot still decodes
    assert kv(result, "num_seqs") == [2, 1, 1, 1, 1]
    assert kv(result, "kv_allocated") == [64, 64, 64, 32, 32]
    assert kv(result, "kv_live") == [12, 5, 6, 3, 4]
    assert kv(result, "kv_reserved_future") == [2, 1, 0, 1, 0]
    assert kv(result, "kv_internal") == [50, 26, 26, 28, 28]
    assert kv(result, "kv_stale") == [0, 32, 32, 0, 0]


def test_static_launches_a_full_batch_at_once_and_the_rest_wait_for_their_timeout():
    result = run(
        [req(i, 0.0, 4, 2) for i in range(3)],
        policy="static", max_batch_size=2, batch_timeout_s=1.0, num_gpu_blocks_override=24, **SMALL,
    )
    assert ms(result, "first_token_s") == [2.0, 2.0, 1002.0]
    assert ms(result, "finish_s") == [4.0, 4.0, 1004.0]


def test_static_batch_is_capped_by_the_slots_that_fit():
    # 96 tokens of KV hold three 32-token slots although max_batch_size is 8: that is a full batch
    result = run(
        [req(i, 0.0, 4, 2) for i in range(4)],
        policy="static", max_batch_size=8, batch_timeout_s=1.0, num_gpu_blocks_override=24, **SMALL,
    )
    assert ms(result, "first_token_s") == [2.0, 2.0, 2.0, 1002.0]
    assert result.steps["kv_allocated"].max() == 96


def test_static_decode_is_priced_on_the_padded_batch():
    _, _, plans = run_direct(
        [req(0, 0.0, 3, 3), req(1, 0.0, 7, 1)],
        policy="static", max_batch_size=2, batch_timeout_s=0.0, num_gpu_blocks_override=24, **SMALL,
    )
    # (num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens, num_sampled)
    assert plans == [
        (14, [(7, 0), (7, 0)], 0, 0, 2),
        (2, [], 2, 2 * (7 + 1), 2),
        (2, [], 2, 2 * (7 + 2), 2),
    ]


def test_static_truncates_an_output_that_would_overflow_its_padded_slot():
    # padded to 30 tokens in a 32-token slot: r0 (prompt 2) can emit only 2 tokens, not 10
    result = run(
        [req(0, 0.0, 2, 10), req(1, 0.0, 30, 1)],
        policy="static", max_batch_size=2, batch_timeout_s=0.0, num_gpu_blocks_override=24, **SMALL,
    )
    assert result.requests["num_output_tokens"].tolist() == [2, 1]


# -- dynamic -------------------------------------------------------------------------------
def test_dynamic_prefill_step_pauses_the_running_decodes():
    # step 1 [0, 2): prefill r0. r1 arrives at 1 ms; TGI decodes once after a prefill: step 2
    # [2, 4) decodes r0. Step 3 [4, 6) prefills r1 alone while r0 waits; then both decode.
    result = run(
        [req(0, 0.0, 4, 4), req(1, 0.001, 6, 2)],
        policy="dynamic", num_gpu_blocks_override=24, **SMALL,
    )
    assert kv(result, "num_prefill_tokens") == [4, 0, 6, 0, 0]
    assert kv(result, "num_decode_tokens") == [0, 1, 0, 2, 1]
    assert ms(result, "first_token_s") == [2.0, 6.0]
    assert ms(result, "finish_s") == [10.0, 8.0]
    # the same requests under vLLM-style continuous batching: r1 joins step 2 beside r0's decode
    paged = run([req(0, 0.0, 4, 4), req(1, 0.001, 6, 2)], num_gpu_blocks_override=24, **SMALL)
    assert ms(paged, "first_token_s") == [2.0, 4.0]


def test_dynamic_admits_only_while_reservations_fit():
    # 32 tokens of KV; each request reserves prompt 4 + max_tokens 12 = 16. r2 waits until r1
    # finishes at 4 ms and frees its reservation, then prefills alone [4, 6).
    requests = [req(0, 0.0, 4, 4, max_tokens=12), req(1, 0.0, 4, 2, max_tokens=12),
                req(2, 0.0, 4, 2, max_tokens=12)]
    result = run(requests, policy="dynamic", num_gpu_blocks_override=8, **SMALL)
    assert kv(result, "num_prefill_tokens") == [8, 0, 4, 0, 0]
    assert ms(result, "first_token_s") == [2.0, 2.0, 6.0]
    assert ms(result, "finish_s") == [10.0, 4.0, 8.0]
    assert kv(result, "kv_allocated") == [32, 32, 32, 32, 16]
    # step 1: live 4+4, to be written 3+1 more, never written (12 - 3) + (12 - 1) of the reservations
    assert (kv(result, "kv_live")[0], kv(result, "kv_reserved_future")[0], kv(result, "kv_internal")[0]) == (8, 4, 20)


def _tgi(engine, memory, ratio):
    return DynamicPolicy(ContiguousAllocator(memory.num_gpu_tokens), engine.max_model_len, 256, 2048,
                         waiting_served_ratio=ratio, max_waiting_tokens=3)


@pytest.mark.parametrize(("ratio", "r2_first_token_ms"), [(0.0, 6.0), (1.2, 8.0)])
def test_dynamic_waiting_served_ratio_holds_back_a_small_queue(ratio, r2_first_token_ms):
    # r0, r1 prefill [0, 2) and decode [2, 4). r2 (arrived at 1 ms) is 1 request < floor(2 x 1.2):
    # with TGI's ratio it waits until the queue has waited max_waiting_tokens = 3 decode steps.
    requests = [req(0, 0.0, 4, 10), req(1, 0.0, 4, 10), req(2, 0.001, 4, 2)]
    engine, _, _ = run_direct(requests, lambda e, m: _tgi(e, m, ratio), num_gpu_blocks_override=24, **SMALL)
    frame = engine.lifecycle.records.frame()
    assert round(frame.loc[2, "first_token_s"] * 1000, 6) == r2_first_token_ms


# -- Orca ----------------------------------------------------------------------------------
def test_orca_oracle_external_fragmentation_blocks_a_request_that_would_fit_in_total():
    # oracle reservations, first fit in 32 tokens: a [0, 8), b [8, 24), c [24, 32); d needs 12.
    # a and c finish at step 4: 16 tokens free in two extents of 8, so d waits for b (step 12).
    requests = [req(0, 0.0, 4, 4), req(1, 0.0, 4, 12), req(2, 0.0, 4, 4), req(3, 0.0, 4, 8)]
    result = run(requests, allocator="contiguous", reservation="oracle", num_gpu_blocks_override=8, **SMALL)
    assert ms(result, "first_token_s") == [2.0, 2.0, 2.0, 26.0]
    assert ms(result, "finish_s") == [8.0, 24.0, 8.0, 40.0]
    external = kv(result, "kv_external")
    assert external[:4] == [0, 0, 0, 0]
    assert external[4:12] == [16] * 8
    assert external[12:] == [0] * 8
    assert result.summary["num_preemptions"] == 0


@pytest.mark.parametrize(("reservation", "reserved"), [("max", 32), ("pow2", 5 + 8), ("oracle", 5 + 6)])
def test_orca_reservation_sizes(reservation, reserved):
    result = run([req(0, 0.0, 5, 6)], allocator="contiguous", reservation=reservation,
                 num_gpu_blocks_override=8, **SMALL)
    steps = result.steps
    assert (steps["kv_allocated"] == reserved).all()
    assert (steps["kv_internal"] == reserved - (5 + 6 - 1)).all()


# -- configuration -------------------------------------------------------------------------
@pytest.mark.parametrize("config", [
    dict(reservation="oracle"),  # reservation with paged
    dict(policy="static", reservation="pow2"),
    dict(policy="dynamic", reservation="oracle"),
    dict(allocator="contiguous", preemption_mode="swap"),
])
def test_combinations_that_make_no_sense_are_config_errors(config):
    with pytest.raises(ConfigError):
        run([req(0, 0.0, 4, 2)], **config)


def test_reservation_policies_reject_what_can_never_fit():
    cfg = dict(num_gpu_blocks_override=8, **SMALL)
    for policy, extra in (("static", {"batch_timeout_s": 0.0}), ("dynamic", {})):
        result = run([req(0, 0.0, 40, 2), req(1, 0.0, 4, 2), req(2, 0.0, 4, 2, n=2)], policy=policy,
                     **extra, **cfg)
        status = result.requests["status"].tolist()
        assert status == ["rejected", "finished", "rejected"]
        reasons = result.requests["reject_reason"].tolist()
        assert "max_model_len" in reasons[0] and "n=2" in reasons[2]


# -- invariants on random runs ---------------------------------------------------------------
POLICY_CONFIGS = [
    dict(policy="static", max_batch_size=3, batch_timeout_s=0.003),
    dict(policy="dynamic"),
    dict(allocator="contiguous", reservation="max"),
    dict(allocator="contiguous", reservation="pow2"),
    dict(allocator="contiguous", reservation="oracle", max_num_batched_tokens=16, max_num_seqs=16),
    dict(max_num_batched_tokens=16, max_num_seqs=16),
]

request_lists = hs.lists(
    hs.tuples(
        hs.floats(0.0, 0.02), hs.integers(1, 40), hs.integers(1, 40), hs.integers(0, 20),
    ),
    min_size=1, max_size=12,
)


@pytest.mark.parametrize("config", POLICY_CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=request_lists, num_blocks=hs.integers(8, 24))
def test_every_policy_finishes_or_rejects_within_capacity_and_returns_its_kv(config, rows, num_blocks):
    requests = [req(i, at, p, o, max_tokens=o + extra) for i, (at, p, o, extra) in enumerate(rows)]
    engine, policy, _ = run_direct(requests, num_gpu_blocks_override=num_blocks, **SMALL, **config)
    frame = engine.lifecycle.records.frame().sort_values("request_id", ignore_index=True)
    done = frame["status"] == "finished"
    assert (done | (frame["status"] == "rejected")).all()
    assert (frame.loc[~done, "reject_reason"] != "").all()
    assert (frame.loc[done, "num_output_tokens"] >= 1).all()
    if config.get("policy") != "static":  # static may cut outputs at its padded slot
        expected = [max(1, min(o, 32 - p)) for _, p, o, _ in rows]
        assert frame.loc[done, "num_output_tokens"].tolist() == [e for e, d in zip(expected, done, strict=True) if d]
    steps = engine.recorder.frame()
    capacity = num_blocks * 4
    assert (steps["kv_allocated"] <= capacity).all()
    parts = steps["kv_live"] + steps["kv_reserved_future"] + steps["kv_internal"] + steps["kv_stale"]
    assert (parts == steps["kv_allocated"]).all()
    for col in ("kv_live", "kv_reserved_future", "kv_internal", "kv_stale", "kv_external"):
        assert (steps[col] >= 0).all(), col
    assert (steps["kv_external"] <= capacity - steps["kv_allocated"]).all()
    life = engine.lifecycle
    assert not life.running and not life.waiting and not life.swapped
    if isinstance(policy.allocator, ContiguousAllocator):
        assert policy.allocator.num_reserved_tokens == 0
        assert policy.allocator.num_free_extents == 1
        ledger = policy.ledger
        assert (ledger.running_reserved, ledger.running_final, ledger.stale, ledger.live) == (0, 0, 0, 0)
    else:
        assert policy.allocator.num_used_blocks == 0
