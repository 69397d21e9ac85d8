"""vLLM's custom all-reduce in the profiles' all-reduce tables (profiles/custom_allreduce.py): the
cited per-call times below 8 MiB on fully NVLink-connected GPUs, NCCL from 8 MiB and on every other
GPU, and a TP 4 decode step cheaper by the all-reduces' difference in both cores."""

from __future__ import annotations

import pytest

from kvsim.profiles import collectives, custom_allreduce
from kvsim.profiles.roofline import build_roofline_profile
from kvsim.simcore import ccore
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import StepLatencyModel

H100 = get_gpu("H100-SXM-80GB")
KIB, MIB = 1024, 1024 * 1024


def _ms(table: dict, nbytes: float) -> float:
    return dict(zip(table["bytes"], table["time_ms"], strict=True))[nbytes]


@pytest.fixture
def nccl_only(monkeypatch):
    """collectives_for as it was before vLLM's custom kernel was priced."""
    def build(gpu, tp):
        with monkeypatch.context() as m:
            m.setattr(custom_allreduce, "eligible", lambda *a: False)
            return collectives.collectives_for(gpu, tp)
    return build


@pytest.mark.parametrize("tp, us_16k", [(2, 8.8), (4, 8.5), (8, 9.3)])
def test_h100_prices_a_16_kib_all_reduce_at_vllms_custom_kernel(tp, us_16k):
    # sglang PR #2904, vllm rows: 4,096 float32 elements = 16 KiB
    block = collectives.collectives_for(H100, tp)
    assert 1e3 * _ms(block["all_reduce"], 16 * KIB) == pytest.approx(us_16k, abs=0.05)
    assert block["custom_all_reduce"]["below_bytes"] == 8 * MIB


def test_tp4_mid_sizes_agree_with_vllms_own_cuda_graph_benchmark():
    # vLLM PR #24111, H100 TP 4, ca_2stage (vLLM's kernel choice above 512 KiB at TP 4): 1 / 2 / 4 MiB
    table = collectives.collectives_for(H100, 4)["all_reduce"]
    for nbytes, us in ((1 * MIB, 18.0), (2 * MIB, 27.0), (4 * MIB, 43.0)):
        assert 0.85 * us <= 1e3 * _ms(table, nbytes) <= 1.15 * us, nbytes


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_nccl_from_8_mib_up(tp, nccl_only):
    new, old = collectives.collectives_for(H100, tp)["all_reduce"], nccl_only(H100, tp)["all_reduce"]
    above = [(b, t) for b, t in zip(old["bytes"], old["time_ms"], strict=True) if b > 8 * MIB]
    assert above and all(_ms(new, b) == t for b, t in above)
    assert all(b < 8 * MIB for b in new["bytes"][: new["bytes"].index(8 * MIB)])


@pytest.mark.parametrize("name, tp", [("H100-PCIe-80GB", 2), ("H100-PCIe-80GB", 4), ("L40S-48GB", 4),
                                      ("MI300X-192GB", 8), ("GB200-NVL72", 8), ("H100-SXM-80GB", 16)])
def test_gpus_vllm_gives_nccl_keep_the_nccl_table(name, tp, nccl_only):
    block = collectives.collectives_for(get_gpu(name), tp)
    assert "custom_all_reduce" not in block and block == nccl_only(get_gpu(name), tp)


def test_a_tp4_decode_step_is_cheaper_by_the_all_reduce_difference_in_both_cores(monkeypatch):
    model = get_model("llama2-70b")
    doc = build_roofline_profile(H100, model, 4)
    with monkeypatch.context() as m:
        m.setattr(custom_allreduce, "eligible", lambda *a: False)
        old_doc = build_roofline_profile(H100, model, 4)
    new, old = StepLatencyModel(doc), StepLatencyModel(old_doc)
    step = (1, [], 1, 512, 1)  # batch-1 decode: one token, 80 layers x 2 all-reduces of 16 KiB + the logits
    calls = 2 * model.num_layers
    expected = calls * (old.all_reduce(16 * KIB) - new.all_reduce(16 * KIB))
    expected += old.all_reduce(model.vocab_size) - new.all_reduce(model.vocab_size)  # logits: vocab x 2 B / 2
    assert 1e3 * expected / calls == pytest.approx(38.6 - 8.5, abs=0.5)  # Vidur NCCL vs custom, us per call
    saved = sum(old.step_parts_ms(*step)) - sum(new.step_parts_ms(*step))
    assert saved == pytest.approx(expected, rel=1e-9)
    for m in (new, old):
        assert ccore.CPricing(m).step_parts_ms(*step) == m.step_parts_ms(*step)
