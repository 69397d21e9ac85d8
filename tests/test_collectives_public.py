"""kvsim's H100 all-reduce prices against TokenWeave's independent public measurement
(benchmarks/prefill_tp_public.py holds the numbers and their source): the Vidur-measured table from
8 MiB (vLLM's custom kernel below), and the fit past its largest message, stay within the spread of
two NCCL measurements, and the collectives of a one-prompt prefill step stay near what vLLM's forward
pass spent on them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvsim.profiles import custom_allreduce
from kvsim.profiles.roofline import build_roofline_profile
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import StepLatencyModel

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "prefill_tp_public.py"


@pytest.fixture(scope="module")
def pub():
    spec = importlib.util.spec_from_file_location("prefill_tp_public", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_h100_all_reduce_table_is_within_the_spread_of_an_independent_nccl_measurement(pub):
    # Vidur times back-to-back calls (an L2-warm buffer); TokenWeave flushes L2 between calls:
    # 2-16 MiB run 15-27% faster in Vidur's table. Past Vidur's 64 MiB the fit is 4-16% slower.
    # Below 8 MiB vLLM runs its custom kernel (profiles/custom_allreduce.py): between the two.
    # That is the table of every version before V1 0.11 (vllm-0.6 here); V1 0.11+ pays multimem
    # at 256 KiB-64 MiB (profiles/symm_mem_allreduce.py, priced from this very column) and NCCL above.
    m = pub.model(8, "vllm-0.6")
    v1 = StepLatencyModel(build_roofline_profile(get_gpu("H100-SXM-80GB"), get_model("llama3-70b"), 8))
    for tokens, (nccl_us, multimem_us) in pub.ALL_REDUCE_8_US.items():
        nbytes = tokens * 8192 * 2
        kvsim_us = 1e3 * m.all_reduce(nbytes)
        if nbytes <= 64 * 2**20:
            assert 1e3 * v1.all_reduce(nbytes) == pytest.approx(multimem_us, abs=0.005), tokens
        else:
            assert v1.all_reduce(nbytes) == pytest.approx(m.all_reduce(nbytes), rel=1e-6), tokens  # NCCL
        if nbytes < custom_allreduce.MAX_BYTES:
            assert multimem_us < kvsim_us < nccl_us, tokens
            continue
        assert 0.7 * nccl_us <= kvsim_us <= 1.25 * nccl_us, tokens
        assert kvsim_us > multimem_us, tokens  # kvsim prices NCCL, not the NVLS multimem kernel


def test_a_prefill_steps_collectives_are_near_what_vllms_forward_spent_on_all_reduce(pub):
    # In-forward all-reduce time (TokenWeave's model with all-reduces minus the one without) is at most
    # the isolated kernel's: no 3x in-forward slowdown for kvsim to miss. As vllm-v1 kvsim prices
    # multimem at TP 8 up to 64 MiB (1.0-1.2x here) and NCCL above and at TP 4 (1.0-1.7x), where the
    # measured forward used multimem.
    for tp, rows in pub.PREFILL_MS.items():
        m = pub.model(tp)
        for tokens, (with_ar, no_ar) in rows.items():
            if tokens > 16384:
                continue  # long prompts: attention dominates; not a collectives check
            coll = m.step_parts_ms(tokens, [(tokens, 0)], 0, 0, 1)[2]
            assert 0.9 * (with_ar - no_ar) <= coll <= 1.8 * (with_ar - no_ar), (tp, tokens)
