"""vLLM 0.6's multi-step scheduling granularity (the `vllm-0.6` preset; simcore/policies/
continuous_v0.py): decode rounds of 10 steps during which nothing is admitted, finished
sequences computed to the round's end, the round's lookahead slots asked for at its start."""

from __future__ import annotations

import dataclasses

import numpy as np

from kvsim.profiles import default_profile
from kvsim.simcore.batch_defaults import NUM_SCHEDULER_STEPS, num_scheduler_steps
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.simulate import simulate
from kvsim.simcore.specs import EngineConfig
from tests.helpers import ListWorkload, assert_same_requests, req
from tests.test_fastcore_equivalence import _random_case

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]
STEPS = NUM_SCHEDULER_STEPS["vllm-0.6"]


def _run(version: str, requests, **fields):
    fields = {"max_model_len": 256, "max_num_batched_tokens": 256, **fields}
    config = EngineConfig(engine_version=version, enable_chunked_prefill=False, enable_prefix_caching=False,
                          **fields)
    return simulate(TINY, H100, config, ListWorkload(requests), default_profile(H100, TINY, 1), seed=0,
                    engine_core="python", exact_steps=True)


def test_only_vllm_06_without_chunking_runs_rounds():
    assert num_scheduler_steps("vllm-0.6", chunked=False) == STEPS == 10
    assert num_scheduler_steps("vllm-0.6", chunked=True) == 1
    assert num_scheduler_steps("vllm-0.6", chunked=False, speculative=True) == 1
    assert {num_scheduler_steps(v, False) for v in ("vllm-v0", "vllm-v1", "vllm-v1-async")} == {1}


def test_a_request_arriving_mid_round_waits_for_its_end():
    """A runs alone; B arrives just after A's round started: under vllm-v0 B is prefilled at the
    next step, under vllm-0.6 only after A's 10-step round (its first scheduled step is the 11th
    after A's prefill, and its TTFT is that much longer)."""
    for version, first_step in (("vllm-v0", 3), ("vllm-0.6", 1 + STEPS + 1)):
        alone = _run(version, [req(0, 0.0, 16, 40)]).steps["start_s"].to_numpy()
        requests = [req(0, 0.0, 16, 40), req(1, float(alone[1] + alone[2]) / 2, 16, 8)]  # during A's first decode
        run = _run(version, requests)
        steps = run.steps
        starts = steps["start_s"].to_numpy()
        b = run.requests.set_index("request_id").loc[1]
        # B's prefill is the step that starts when B is first scheduled
        index = int(np.flatnonzero(np.isclose(starts, b["first_scheduled_s"], rtol=0, atol=1e-12))[0])
        assert index + 1 == first_step, version
        assert steps["num_decode_tokens"].iloc[1:index].eq(1).all(), version  # A's steps alone before it


def test_a_sequence_finishing_mid_round_is_computed_to_its_end():
    """A (3 tokens) and B (30 tokens) start a round together: A finishes at its third step, B's
    round still prices A's sequence until step 10, and C, waiting, is admitted only then."""
    requests = [req(0, 0.0, 16, 4), req(1, 0.0, 16, 30), req(2, 1e-6, 16, 5)]
    run = _run("vllm-0.6", requests, max_num_seqs=2)
    steps = run.steps
    decodes = steps["num_decode_tokens"].to_numpy()
    scheduled = steps["num_seqs"].to_numpy()
    # step 0: both prefills; steps 1..10: the round, 2 sequences priced throughout
    assert steps["num_prefill_tokens"].iloc[0] == 32
    assert (decodes[1:1 + STEPS] == 2).all()
    assert scheduled[1:1 + STEPS].tolist() == [2, 2, 2] + [1] * (STEPS - 3)  # A left after its 4th token
    c = run.requests.set_index("request_id").loc[2]
    round_end = steps["start_s"].iloc[1 + STEPS]
    assert c["first_scheduled_s"] == round_end  # C's prefill right after the round, not when A left
    v0 = _run("vllm-v0", requests, max_num_seqs=2)
    c0 = v0.requests.set_index("request_id").loc[2]
    assert c0["first_scheduled_s"] == v0.steps["start_s"].iloc[4]  # V0: right after A's last token


def test_lookahead_preempts_at_the_round_start():
    """Two requests of 8 + 8 tokens (4 blocks of 4 each at most) in a cache of 8 blocks: step by
    step they always fit, but a round's start asks each for 8 + 1 + 9 slots (5 blocks), so
    vllm-0.6 preempts the newer one (can_append_slots with lookahead) where vllm-v0 does not."""
    requests = [req(0, 0.0, 8, 8), req(1, 0.0, 8, 8)]
    fields = dict(block_size=4, num_gpu_blocks_override=8, max_num_seqs=4, max_model_len=32)
    assert _run("vllm-v0", requests, **fields).totals.num_preempted == 0
    assert _run("vllm-0.6", requests, **fields).totals.num_preempted > 0


def test_python_fast_path_matches_its_reference():
    """Decode spans stop at the round's end: the fast Python engine equals --exact-steps."""
    for case in range(12):
        config, workload = _random_case(np.random.default_rng(7000 + case))
        config = dataclasses.replace(config, engine_version="vllm-0.6", enable_chunked_prefill=False,
                                     max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len))
        profile = default_profile(H100, TINY, 1)
        fast = simulate(TINY, H100, config, workload, profile, seed=case, engine_core="python")
        exact = simulate(TINY, H100, config, workload, profile, seed=case, engine_core="python", exact_steps=True)
        assert_same_requests(fast.requests, exact.requests, f"case {case}")


def test_engine_line_names_the_rounds():
    from kvsim.simcore.batch_defaults import engine_assumptions, engine_text

    a = engine_assumptions(EngineConfig(engine_version="vllm-0.6", enable_chunked_prefill=False), TINY, H100)
    assert a["num_scheduler_steps"] == STEPS and "decode rounds of 10 steps" in engine_text(a)
    b = engine_assumptions(EngineConfig(engine_version="vllm-v1"), TINY, H100)
    assert "num_scheduler_steps" not in b and "rounds" not in engine_text(b)
