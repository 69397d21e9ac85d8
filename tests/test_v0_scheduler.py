"""vLLM V0's default scheduler (continuous + paged, --no-enable-chunked-prefill): prefill-only
steps first, whole prompts in FIFO order, the 1% block watermark; hand-computed timelines on a
flat profile (every step 2 ms)."""

from __future__ import annotations

from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.policies.continuous_v0 import VllmV0PagedPolicy
from kvsim.simcore.simulate import prepare
from kvsim.simcore.specs import EngineConfig
from tests.helpers import ListWorkload, flat_profile, req

TINY, H100 = MODELS["tiny"], GPUS["H100-SXM-80GB"]


def _run(requests, **config):
    sim = prepare(TINY, H100, EngineConfig(enable_chunked_prefill=False, **config),
                  ListWorkload(requests), flat_profile())
    assert isinstance(sim.engine.policy, VllmV0PagedPolicy)
    return sim.run()


def _ms(series):
    return [round(v * 1000, 6) for v in series]


def test_a_new_prompt_pauses_the_running_decodes_for_a_step():
    # [0, 2)  prefill r0 (4)                 r0 token 1 at 2
    # [2, 4)  prefill r1 (6) alone           r0 does not decode; r1 token 1 at 4
    # [4, 6)  decode r0, r1                  r1 ends (2 tokens) at 6
    # [6, 10) decode r0 twice                r0 ends (4 tokens) at 10
    # (the unified scheduler would decode r0 in [2, 4) and finish it at 8)
    result = _run([req(0, 0.0, 4, 4), req(1, 0.001, 6, 2)], block_size=4, max_model_len=32,
                  max_num_batched_tokens=32, max_num_seqs=4)
    assert result.steps["num_prefill_tokens"].tolist() == [4, 6, 0, 0, 0]
    assert result.steps["num_decode_tokens"].tolist() == [0, 0, 2, 1, 1]
    assert _ms(result.requests["first_token_s"]) == [2.0, 4.0]
    assert _ms(result.requests["finish_s"]) == [10.0, 6.0]


def test_whole_prompts_fifo_under_the_token_budget():
    # budget 10 tokens: r0 (6) fits step 1, r1 (6) does not fit the 4 left and r2 (3) waits
    # behind it (FIFO). Step 2 prefills r1 + r2 (9) while r0 waits; step 3 decodes all three.
    result = _run([req(0, 0.0, 6, 3), req(1, 0.0, 6, 2), req(2, 0.0, 3, 2)], block_size=4,
                  max_model_len=10, max_num_batched_tokens=10, max_num_seqs=3)
    assert result.steps["num_prefill_tokens"].tolist() == [6, 9, 0, 0]
    assert result.steps["num_decode_tokens"].tolist() == [0, 0, 3, 1]
    assert _ms(result.requests["first_token_s"]) == [2.0, 4.0, 4.0]
    assert _ms(result.requests["finish_s"]) == [8.0, 6.0, 6.0]


def test_admission_keeps_the_one_percent_watermark_free():
    # 100 blocks of 1 token: watermark int(0.01 x 100) = 1 block. r0 takes 50; r1 (50) would
    # leave 0 < 1 free, so it waits (without the watermark both would prefill at once and r1
    # would be preempted at r0's first decode). r0 decodes to its 3rd token at 6 ms and frees
    # its blocks; r1 prefills [6, 8) and decodes [8, 10).
    result = _run([req(0, 0.0, 50, 3), req(1, 0.0, 50, 2)], block_size=1, num_gpu_blocks_override=100,
                  max_model_len=100, max_num_batched_tokens=100, max_num_seqs=4)
    assert result.steps["num_prefill_tokens"].tolist() == [50, 0, 0, 50, 0]
    assert _ms(result.requests["first_token_s"]) == [2.0, 8.0]
    assert _ms(result.requests["finish_s"]) == [6.0, 10.0]
    assert result.summary["num_preemptions"] == 0
