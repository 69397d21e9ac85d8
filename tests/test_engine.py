"""Exact timelines on tiny scenarios, preemption, rejection and determinism of the engine."""

from __future__ import annotations

import pytest

from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.simulate import simulate
from kvsim.simcore.specs import EngineConfig
from tests.helpers import ListWorkload, flat_profile, req

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]
STEP = 0.002  # flat profile: 2 layers x 1 ms, nothing else


def run(requests, **config):
    cfg = EngineConfig(**config)
    return simulate(TINY, H100, cfg, ListWorkload(requests), flat_profile())


def timeline(result):
    df = result.requests
    return [
        (int(r.request_id), round(r.first_token_s / STEP), round(r.finish_s / STEP), int(r.num_output_tokens))
        for r in df.itertuples()
    ]


def test_two_requests_exact_timeline():
    # step 1 [0, 2ms): r0 prefills 10 tokens -> first token at 1 step
    # r1 arrives at 1 ms and joins step 2: r0 decodes, r1 prefills -> r1's first token at 2 steps
    # step 3: both decode; r0 has 3 tokens, r1 has 2 -> both finish at 3 steps
    result = run([req(0, 0.0, 10, 3), req(1, 0.001, 5, 2)])
    assert timeline(result) == [(0, 1, 3, 3), (1, 2, 3, 2)]
    steps = result.steps
    assert steps["num_prefill_tokens"].tolist() == [10, 5, 0]
    assert steps["num_decode_tokens"].tolist() == [0, 1, 2]
    assert steps["start_s"].tolist() == pytest.approx([0.0, STEP, 2 * STEP])
    assert result.summary["mean_ttft_ms"] == pytest.approx((2.0 + 3.0) / 2)
    assert result.summary["mean_tpot_ms"] == pytest.approx(2.0)
    assert result.itl_s.tolist() == pytest.approx([STEP, STEP, STEP])


def test_chunked_prefill_splits_prompt_and_keeps_decodes_running():
    # budget 8 tokens/step: r0 (prompt 3) prefills in step 1; r1 (prompt 20) arrives at once and
    # takes the remaining 5 tokens of step 1, then 7 in step 2 (r0 decodes 1), then 7, then 1.
    result = run(
        [req(0, 0.0, 3, 4), req(1, 0.0, 20, 2)], max_num_batched_tokens=8, max_num_seqs=8,
        enable_chunked_prefill=True,
    )
    assert result.steps["num_prefill_tokens"].tolist()[:4] == [3 + 5, 7, 7, 1]
    assert result.steps["num_decode_tokens"].tolist()[:4] == [0, 1, 1, 1]
    assert timeline(result) == [(0, 1, 4, 4), (1, 4, 5, 2)]


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_step():
    result = run(
        [req(0, 0.0, 3, 2), req(1, 0.0, 20, 2)], max_num_batched_tokens=22, max_model_len=22, max_num_seqs=8,
        enable_chunked_prefill=False,
    )
    # 3 + 20 > 22: r1 cannot join step 1 and prefills whole in step 2, alone (vLLM V0's
    # scheduler: a step with prefills has no decodes), so r0's decode waits for step 3.
    assert result.steps["num_prefill_tokens"].tolist()[:3] == [3, 20, 0]
    assert result.steps["num_decode_tokens"].tolist()[:3] == [0, 0, 2]


def test_recompute_preemption_under_undersized_cache_makes_progress():
    # 8 blocks of 4 tokens = 32 slots; 6 requests needing 4 blocks each at the end.
    requests = [req(i, 0.0, 6, 10) for i in range(6)]
    result = run(requests, block_size=4, num_gpu_blocks_override=8, max_model_len=32)
    df = result.requests
    assert (df["status"] == "finished").all()
    assert (df["num_output_tokens"] == 10).all()
    assert result.summary["num_preemptions"] > 0
    assert (result.steps["kv_allocated"] <= 32).all()
    # paged waste bound: at most block_size - 1 unused slots per running sequence
    running = result.steps["num_seqs"]
    assert (result.steps["kv_allocated"] - result.steps["kv_live"] <= 3 * running).all()


def test_swap_preemption_moves_blocks_and_everyone_finishes():
    requests = [req(i, 0.0, 6, 10) for i in range(6)]
    result = run(
        requests, block_size=4, num_gpu_blocks_override=8, max_model_len=32,
        preemption_mode="swap", swap_space=0.001,
    )
    assert (result.requests["status"] == "finished").all()
    assert result.steps["num_swap_blocks"].sum() > 0
    assert result.summary["num_preemptions"] > 0


def test_swap_costs_pcie_time():
    kwargs = dict(block_size=4, num_gpu_blocks_override=8, max_model_len=32)
    requests = [req(i, 0.0, 6, 10) for i in range(6)]
    swap = run(requests, preemption_mode="swap", swap_space=0.001, **kwargs)
    swap_steps = swap.steps[swap.steps["num_swap_blocks"] > 0]
    block_bytes = TINY.kv_bytes_per_token() * 4
    expected = STEP + swap_steps["num_swap_blocks"] * block_bytes / (H100.pcie_gbps * 1e9)
    assert swap_steps["duration_s"].tolist() == pytest.approx(expected.tolist())


def test_requests_that_can_never_run_are_rejected_with_a_reason():
    result = run(
        [req(0, 0.0, 40, 2), req(1, 0.0, 4, 2)],
        block_size=4, num_gpu_blocks_override=8, max_model_len=32,
    )
    df = result.requests.set_index("request_id")
    assert df.loc[0, "status"] == "rejected" and "max_model_len" in df.loc[0, "reject_reason"]
    assert df.loc[1, "status"] == "finished"
    assert result.summary["rejected"] == 1 and result.summary["completed"] == 1


def test_output_is_truncated_at_max_model_len():
    result = run([req(0, 0.0, 10, 100)], max_model_len=16)
    assert result.requests.loc[0, "num_output_tokens"] == 6


def test_max_num_seqs_caps_the_running_batch():
    result = run([req(i, 0.0, 4, 5) for i in range(10)], max_num_seqs=3)
    assert result.steps["num_seqs"].max() == 3
    assert (result.requests["status"] == "finished").all()


def test_same_inputs_same_results():
    requests = [req(i, 0.0005 * i, 5 + i % 7, 3 + i % 5) for i in range(40)]
    a = run(requests, block_size=4, num_gpu_blocks_override=12, max_model_len=32)
    b = run(requests, block_size=4, num_gpu_blocks_override=12, max_model_len=32)
    assert a.requests.equals(b.requests)
    assert a.steps.equals(b.steps)
    assert a.summary == b.summary
