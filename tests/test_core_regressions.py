"""Regressions found by reviewing and fuzzing the compiled engine core (simcore/csrc/engine.c)
against the Python engine (issue 10): each a case that once crashed, diverged or would have
run the core where it cannot be right. Kept small and fast; the broad equivalence sweep is
tests/test_fastcore_equivalence.py."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.profiles import default_profile
from kvsim.simcore import ccore, fastcore
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.simulate import prepare, simulate
from kvsim.simcore.specs import EngineConfig
from tests.test_fastcore_equivalence import ArraysWorkload

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]


def _workload(num: int = 5) -> ArraysWorkload:
    return ArraysWorkload(np.arange(num) * 0.01, np.full(num, 20), np.full(num, 10))


def test_a_32_bit_c_long_runs_the_python_engine(monkeypatch):
    """Where C's long is 32 bits (Windows), the int64 arrays the core is fed would be misread:
    auto runs Python and says why; --engine-core c refuses with that reason."""
    monkeypatch.setattr(fastcore, "LONG_BYTES", 4)
    config = EngineConfig(max_model_len=64, enable_prefix_caching=False)
    profile = default_profile(H100, TINY, 1)
    sim = prepare(TINY, H100, config, _workload(), profile)
    core, why = sim.choose_core()
    assert core == "python" and "32 bits" in why
    with pytest.raises(ConfigError, match="32 bits"):
        simulate(TINY, H100, config, _workload(), profile, engine_core="c")
    result = simulate(TINY, H100, config, _workload(), profile)
    assert result.record["engine_core"] == "python" and "32 bits" in result.record["engine_core_reason"]


@pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")
def test_output_buffers_too_small_for_one_event_are_an_error_not_a_spin():
    """kv_engine_run answers KV_FULL when an output buffer may not hold the next event's
    output; with every buffer empty and still too small that answer would come back forever
    (the caller empties nothing and resumes): it must be an error (KV_NOROOM) instead."""
    import ctypes

    lib = ccore.library()
    fastcore._declare(lib)
    config = EngineConfig(max_model_len=64, max_num_seqs=8, enable_prefix_caching=False)
    sim = prepare(TINY, H100, config, _workload(), default_profile(H100, TINY, 1))
    blob = ccore.pricing_blob(sim.latency)
    pricing = lib.kv_pricing_new(blob.ctypes.data_as(fastcore._P), len(blob))
    cfg = fastcore._Config(8, 2048, 64, 1000, 16, 0, 1, 65536, 16000, 16, 1)
    handle = lib.kv_engine_new(ctypes.byref(cfg), pricing)
    try:
        bufs = {name: np.zeros(width * 64) for name, width in
                (("req", fastcore.KV_REQ_ROW), ("step", fastcore.KV_STEP_ROW), ("arr", 1))}
        caps = {"req": 4, "step": 64, "arr": 64}  # room for 4 request rows: fewer than max_num_seqs + 1
        out = fastcore._Outputs()
        for name, buf in bufs.items():
            setattr(out, name, buf.ctypes.data_as(fastcore._P))
            setattr(out, f"{name}_cap", caps[name])
        assert lib.kv_engine_run(handle, ctypes.byref(out)) == -4  # KV_NOROOM, not KV_FULL (1)
    finally:
        lib.kv_engine_free(handle)
        lib.kv_pricing_free(pricing)
