"""Regressions found by reviewing and fuzzing the compiled engine core (simcore/csrc/engine.c)
against the Python engine (issue 10): each a case that once crashed, diverged or would have
run the core where it cannot be right. Kept small and fast; the broad equivalence sweep is
tests/test_fastcore_equivalence.py."""

from __future__ import annotations

import numpy as np
import pytest

from profiles import default_profile
from simcore import fastcore
from simcore.catalog import GPUS, MODELS
from simcore.errors import ConfigError
from simcore.simulate import prepare, simulate
from simcore.specs import EngineConfig
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
