"""vLLM 0.6's multi-step scheduling (the `vllm-0.6` preset's decode rounds, simcore/policies/
continuous_v0.py) in the compiled core (simcore/csrc/engine.c, hooks marked "ms:") against the
Python reference, request by request, on random small V0 configurations: tiny caches (the
round's lookahead preempts), swap and recompute, prefix caching, simultaneous arrivals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsim.simcore import ccore
from tests.test_fastcore_equivalence import _compare, _random_case

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")
NUM_CASES = 48


def _v06_case(case: int):
    config, workload = _random_case(np.random.default_rng(5000 + case))
    return dataclasses.replace(config, engine_version="vllm-0.6", enable_chunked_prefill=False,
                               max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len)), workload


@pytest.mark.parametrize("block", range(3))
def test_multi_step_rounds_match(block):
    per_block = NUM_CASES // 3
    preempted = 0
    for case in range(block * per_block, (block + 1) * per_block):
        config, workload = _v06_case(case)
        core, _ = _compare(config, workload, seed=case, context=f"case {case}: {config}")
        preempted += core.totals.num_preempted
    assert preempted, "the random cases should preempt"
