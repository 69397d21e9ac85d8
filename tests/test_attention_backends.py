"""Prefill attention per vLLM version (profiles/attention.py): the FA2 curve is the FlashAttention-3
paper's measured FA2 / FA3 ratio on the roofline's FA3 curve, Hopper roofline profiles carry it
for vllm-v0 / vllm-0.6, and a version's backend changes a long prompt's price identically in both
cores."""

from __future__ import annotations

import copy

import pytest

from kvsim.profiles.attention import (
    FA3_PAPER_FIG5_CAUSAL,
    FA3_PAPER_FIG5_NONCAUSAL,
    FIG5_SEQLENS,
    fa2_over_fa3,
    prefill_attention_by_engine,
)
from kvsim.profiles.roofline import CHUNK_TOKENS, PREFILL_CONTEXT, build_roofline_profile
from kvsim.simcore import ccore
from kvsim.simcore.batch_defaults import engine_assumptions, engine_text
from kvsim.simcore.catalog import GPUS, get_model
from kvsim.simcore.errors import ProfileError
from kvsim.simcore.latency import StepLatencyModel, parse_profile
from kvsim.simcore.specs import EngineConfig

H100, A100 = GPUS["H100-SXM-80GB"], GPUS["A100-80GB"]
LLAMA3_8B = get_model("llama3-8b")


@pytest.fixture(scope="module")
def h100_doc():
    return build_roofline_profile(H100, LLAMA3_8B, 1)


def test_the_fa2_curve_is_the_papers_measured_ratio():
    # FA-3 paper Fig. 5 (d), head dim 128, causal: FA2 191 .. 335, FA3 292 .. 616 TFLOP/s
    assert FA3_PAPER_FIG5_CAUSAL[128] == ((191, 260, 298, 319, 333, 335), (292, 423, 521, 579, 602, 616))
    for dim, (fa2, fa3) in FA3_PAPER_FIG5_CAUSAL.items():
        for s, a, b in zip(FIG5_SEQLENS, fa2, fa3, strict=True):
            assert fa2_over_fa3(s, dim) == pytest.approx(a / b, rel=1e-12)
    assert fa2_over_fa3(100, 128) == fa2_over_fa3(512, 128) == pytest.approx(191 / 292)  # held at the ends
    assert fa2_over_fa3(65536, 128) == fa2_over_fa3(16384, 128) == pytest.approx(335 / 616)
    mid = fa2_over_fa3(2 ** 11.5, 128)  # halfway between 2k and 4k in log2
    assert mid == pytest.approx((298 / 521 + 319 / 579) / 2, rel=1e-12)
    assert fa2_over_fa3(4096, 96) == fa2_over_fa3(4096, 128)  # nearest measured head dim
    assert fa2_over_fa3(4096, 48) == fa2_over_fa3(4096, 64)
    # the paper's own summary: FA3 1.5-2.0x faster than FA2 in the forward pass
    assert all(1.5 <= 1 / fa2_over_fa3(s, 128) <= 2.0 for s in FIG5_SEQLENS)
    # without the mask the ratio is within 0.03 of the causal one at every length (why one ratio serves)
    fa2, fa3 = FA3_PAPER_FIG5_NONCAUSAL[128]
    assert all(abs(a / b - fa2_over_fa3(s, 128)) < 0.03 for s, a, b in zip(FIG5_SEQLENS, fa2, fa3, strict=True))


def test_hopper_roofline_profiles_carry_fa2_for_the_versions_that_ran_it(h100_doc):
    entries = h100_doc["prefill_attention_by_engine"]
    assert sorted(entries) == ["vllm-0.6", "vllm-v0"]  # vllm-v1 ran FA3: the base table
    for entry in entries.values():
        assert entry["backend"] == "FlashAttention-2"
        for i, c in enumerate(CHUNK_TOKENS):
            for j, p in enumerate(PREFILL_CONTEXT):
                assert entry["time_scale"][i][j] == pytest.approx(1 / fa2_over_fa3(c + p, 128), rel=1e-3)
    assert "prefill_attention_by_engine" not in build_roofline_profile(A100, LLAMA3_8B, 1)  # FA2 for all
    assert prefill_attention_by_engine(A100, LLAMA3_8B, CHUNK_TOKENS, PREFILL_CONTEXT) == {}


def test_a_version_prices_prefill_with_its_backend(h100_doc):
    profile = parse_profile(h100_doc)
    v0, v1 = (profile.latency_model(engine_version=v) for v in ("vllm-v0", "vllm-v1"))
    assert (v0.prefill_backend, v1.prefill_backend) == ("FlashAttention-2", None)
    for chunk, context in ((8192, 0), (2048, 4096), (512, 0)):  # grid cells
        ratio = v0.prefill(chunk, context) / v1.prefill(chunk, context)
        assert ratio == pytest.approx(1 / fa2_over_fa3(chunk + context, 128), rel=2e-3)
    # other batching policies model other engines: the base table
    static = StepLatencyModel(h100_doc, policy="static", engine_version="vllm-v0")
    assert static.prefill_backend is None and static.prefill(8192, 0) == v1.prefill(8192, 0)


def test_per_version_tables_are_checked(h100_doc):
    bad = copy.deepcopy(h100_doc)
    bad["prefill_attention_by_engine"]["vllm-v9"] = bad["prefill_attention_by_engine"]["vllm-v0"]
    with pytest.raises(ProfileError, match="unknown engine version 'vllm-v9'"):
        parse_profile(bad)
    bad = copy.deepcopy(h100_doc)
    bad["prefill_attention_by_engine"]["vllm-0.6"]["time_scale"][3] = [1.0]
    with pytest.raises(ProfileError, match=r"vllm-0.6.time_scale\[3\]: expected 10 values"):
        parse_profile(bad)
    bad["prefill_attention_by_engine"]["vllm-0.6"]["time_scale"][3] = [-1.0] * 10
    with pytest.raises(ProfileError, match="time_scale"):
        parse_profile(bad)


def test_the_engine_line_names_the_backend_where_a_table_models_it():
    cfg = EngineConfig(engine_version="vllm-0.6")
    modelled = engine_assumptions(cfg, LLAMA3_8B, H100, profile_source="roofline", prefill_backend="FlashAttention-2")
    assert modelled["prefill_attention"].startswith("FlashAttention-2, the kernel vllm-0.6 ran on H100")
    line = engine_text(modelled)
    assert line.endswith("; prefill attention: FlashAttention-2") and "not modelled" not in line
    old = engine_assumptions(cfg, LLAMA3_8B, H100, profile_source="roofline")  # a profile without the tables
    assert "not modelled" in engine_text(old)
    v1 = engine_assumptions(EngineConfig(), LLAMA3_8B, H100, profile_source="roofline")
    assert "prefill attention" not in engine_text(v1)


@pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")
@pytest.mark.parametrize("version", ["vllm-v0", "vllm-0.6", "vllm-v1"])
def test_a_versions_backend_prices_long_prompts_alike_in_both_cores(h100_doc, version):
    """Long prompts (8k tokens) on llama3-8b / H100: both cores give the same requests for each
    version, and vllm-v0 / 0.6 (FA2) take longer to their first token than the same run on the
    profile without per-version tables (FA3 for every version); vllm-v1 is unchanged."""
    from tests.test_fastcore_equivalence import ArraysWorkload, _compare

    with_tables = parse_profile(h100_doc)
    without = copy.deepcopy(h100_doc)
    del without["prefill_attention_by_engine"]
    without = parse_profile(without)
    config = EngineConfig(engine_version=version, max_model_len=8192, max_num_batched_tokens=8192, max_num_seqs=8)
    workload = ArraysWorkload([0.0, 0.0, 0.05, 0.3, 0.31], [8000, 6000, 7900, 7000, 4096], [3, 4, 2, 5, 3])
    core, _ = _compare(config, workload, 0, version, model=LLAMA3_8B, profile=with_tables)
    fa3, _ = _compare(config, workload, 0, version, model=LLAMA3_8B, profile=without)
    ttft, ttft_fa3 = float(core.requests["ttft_s"].sum()), float(fa3.requests["ttft_s"].sum())
    if version == "vllm-v1":
        assert ttft == ttft_fa3
    else:
        assert ttft > 1.02 * ttft_fa3
