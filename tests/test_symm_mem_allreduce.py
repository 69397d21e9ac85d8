"""vLLM V1's symmetric-memory all-reduce in the profiles (profiles/symm_mem_allreduce.py): which
all-reduce each message size uses, the TP 8 step it prices against vLLM 0.6's by hand, old profiles
left as they were (and the run saying so), scaling, and both cores on a TP 8 V1 run."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from kvsim.profiles import collectives, symm_mem_allreduce
from kvsim.profiles.roofline import build_roofline_profile
from kvsim.profiles.uncertainty import scaled_profile
from kvsim.simcore import ccore
from kvsim.simcore.batch_defaults import engine_assumptions, engine_text
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ProfileError
from kvsim.simcore.latency import StepLatencyModel, all_reduce_engine, parse_profile
from kvsim.simcore.specs import EngineConfig

H100, H200 = get_gpu("H100-SXM-80GB"), get_gpu("H200-141GB")
LLAMA3_70B = get_model("llama3-70b")
KIB, MIB = 1024, 1024 * 1024


def _ms(table: dict, nbytes: float) -> float:
    return dict(zip(table["bytes"], table["time_ms"], strict=True))[nbytes]


@pytest.fixture(scope="module")
def tp8_doc() -> dict:
    return build_roofline_profile(H100, LLAMA3_70B, 8)


def test_the_profile_says_which_all_reduce_each_size_uses(tp8_doc):
    by_engine = tp8_doc["collectives"]["all_reduce_by_engine"]
    assert sorted(by_engine) == ["vllm-v1", "vllm-v1-async"]  # V0-era presets: custom / NCCL only
    entry = by_engine["vllm-v1"]
    assert entry["dispatch"] == [  # all_reduce_utils.py at 00d618a, "9.0", world size 8
        {"below_bytes": 256 * KIB, "all_reduce": "vLLM custom all-reduce"},
        {"up_to_bytes": 64 * MIB, "all_reduce": "PyTorch symmetric memory (multimem_all_reduce_)"},
        {"all_reduce": "NCCL"}]
    base = tp8_doc["collectives"]["all_reduce"]
    for tokens, us in symm_mem_allreduce.TOKENWEAVE_FIG5_MULTIMEM_US[8].items():  # 1-64 MiB: TokenWeave's
        assert 1e3 * _ms(entry, tokens * 8192 * 2) == pytest.approx(us, abs=0.005)
    below = [(b, t) for b, t in zip(base["bytes"], base["time_ms"], strict=True) if b < 256 * KIB]
    above = [(b, t) for b, t in zip(base["bytes"], base["time_ms"], strict=True) if b > 64 * MIB + 16]
    assert below and above and all(_ms(entry, b) == t for b, t in below + above)  # custom / NCCL as before
    # at TP 2 / 4 the dispatch is written down but no cited timing prices it: the base table stands
    for tp, lo, hi, kernel in ((2, 8 * MIB, 64 * MIB, "two_shot"), (4, 8 * MIB, 32 * MIB, "multimem")):
        e = collectives.collectives_for(H100, tp)["all_reduce_by_engine"]["vllm-v1"]
        assert "bytes" not in e and "not modelled" in e["source"]
        assert (e["dispatch"][0]["below_bytes"], e["dispatch"][1]["up_to_bytes"]) == (lo, hi)
        assert kernel in e["dispatch"][1]["all_reduce"]


@pytest.mark.parametrize("name, tp", [("A100-80GB", 8), ("H100-PCIe-80GB", 2), ("B200-180GB", 8), ("GB200-NVL72", 4)])
def test_no_symmetric_memory_table_where_vllm_has_none_or_kvsim_has_no_timing(name, tp):
    assert "all_reduce_by_engine" not in collectives.collectives_for(get_gpu(name), tp)


def test_a_tp8_prefill_step_in_the_symm_mem_range_by_hand(tp8_doc):
    """256 tokens x 8192 x 2 B = 4 MiB per all-reduce, 80 layers x 2 calls: vllm-0.6 pays vLLM's
    custom kernel (sglang PR #2904, 45.0 us), vllm-v1 multimem (TokenWeave, 28.416 us); the logits
    gather (vocab x 2 B / 2 = 125 KiB, custom on both) is the same."""
    step = (256, [(256, 0)], 0, 0, 1)
    old, new = StepLatencyModel(tp8_doc, engine_version="vllm-0.6"), StepLatencyModel(tp8_doc)
    logits = LLAMA3_70B.vocab_size * 2 / 2
    assert old.all_reduce(logits) == new.all_reduce(logits)
    assert old.step_parts_ms(*step)[2] == pytest.approx(160 * 0.045 + old.all_reduce(logits), rel=1e-12)
    assert new.step_parts_ms(*step)[2] == pytest.approx(160 * 0.02842 + new.all_reduce(logits), rel=1e-12)
    assert old.step_parts_ms(*step)[2] - new.step_parts_ms(*step)[2] == pytest.approx(160 * (0.045 - 0.02842), rel=1e-9)
    for m in (old, new, StepLatencyModel(tp8_doc, engine_version="vllm-v1-async")):
        assert ccore.CPricing(m).step_parts_ms(*step) == m.step_parts_ms(*step)
    static = StepLatencyModel(tp8_doc, policy="static")  # not vLLM's continuous batching: no version, base table
    assert static.all_reduce(4 * MIB) == old.all_reduce(4 * MIB) == pytest.approx(0.045)


def test_an_old_profile_keeps_todays_price_and_the_run_says_so(tp8_doc):
    old_doc = copy.deepcopy(tp8_doc)
    del old_doc["collectives"]["all_reduce_by_engine"]
    v1 = StepLatencyModel(old_doc)
    assert v1.all_reduce_source is None and v1.all_reduce(4 * MIB) == pytest.approx(0.045)
    note = symm_mem_allreduce.missing_note(old_doc, H100, 8, "vllm-v1")
    assert "not modelled" in note and "256 KiB-64 MiB" in note
    assert symm_mem_allreduce.missing_note(old_doc, H100, 8, "vllm-0.6") is None
    assert symm_mem_allreduce.missing_note(tp8_doc, H100, 8, "vllm-v1") is None
    config = EngineConfig(tensor_parallel_size=8)
    assert "symmetric memory here (not modelled)" in engine_text(engine_assumptions(config, LLAMA3_70B, H100,
                                                                                    all_reduce=note))
    priced = all_reduce_engine(tp8_doc, "p", "continuous", "vllm-v1")[0]
    assert "TokenWeave" in priced and "all-reduce" not in engine_text(
        engine_assumptions(config, LLAMA3_70B, H100, all_reduce=priced))


def test_h200_carries_the_h100_timings():
    doc = build_roofline_profile(H200, LLAMA3_70B, 8)
    assert 1e3 * StepLatencyModel(doc).all_reduce(16 * MIB) == pytest.approx(75.136, abs=0.005)


def test_a_scaled_profile_scales_the_version_table(tp8_doc):
    profile = parse_profile(tp8_doc)
    scaled = scaled_profile(profile, 1.3)
    reparsed = StepLatencyModel(scaled.data)
    assert reparsed.all_reduce(4 * MIB) == pytest.approx(1.3 * 0.02842, rel=1e-12)
    with pytest.raises(ProfileError, match="all_reduce_by_engine"):
        bad = copy.deepcopy(tp8_doc)
        bad["collectives"]["all_reduce_by_engine"]["vllm-v9"] = bad["collectives"]["all_reduce_by_engine"]["vllm-v1"]
        parse_profile(bad)


@pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")
def test_both_cores_agree_on_a_random_tp8_v1_run(tp8_doc):
    from tests.test_fastcore_equivalence import ArraysWorkload, _compare

    rng = np.random.default_rng(8)
    n = 60
    arrival = np.sort(rng.uniform(0.0, 6.0, n))
    prompt = rng.integers(8, 3000, n)  # chunks of 8 .. 2048 tokens: 128 KiB .. 32 MiB all-reduces
    output = rng.integers(1, 40, n)
    config = EngineConfig(tensor_parallel_size=8, max_num_seqs=32, max_num_batched_tokens=2048)
    assert config.engine_version == "vllm-v1"
    profile = parse_profile(tp8_doc)
    core, exact = _compare(config, ArraysWorkload(arrival, prompt, output), seed=8, context="tp8 vllm-v1",
                           model=LLAMA3_70B, profile=profile)
    assert exact.steps["collectives_ms"].sum() > 0
