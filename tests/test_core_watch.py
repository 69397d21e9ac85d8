"""The C core honours a records watch (plan's early stop) within a step, not a buffer: it hands
its rows over up to the watch's next check (RequestRecords.rows_to_watch), so a run that a check
stops costs the C core about the rows before it, as it costs the Python core (issue 22)."""

from __future__ import annotations

import pytest

from kvsim.profiles import default_profile
from kvsim.reports.capacity import SLO, run_against
from kvsim.simcore import ccore
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


class _Counting:
    """The core library with kv_engine_run counting the request rows each call hands over."""

    def __init__(self, lib):
        self._lib, self.rows = lib, 0

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def kv_engine_run(self, handle, out_ref):
        rc = self._lib.kv_engine_run(handle, out_ref)
        self.rows = max(self.rows, out_ref._obj.num_done)
        return rc


def test_an_early_stopped_run_stops_the_core_near_the_check(monkeypatch):
    model, gpu = get_model("llama3-8b"), get_gpu("H100-SXM-80GB")
    config = EngineConfig(max_num_seqs=16)
    workload = load_workload("sharegpt", {"rate": 200, "input_len": 256, "output_len": 64, "num_requests": 4000})
    profile = default_profile(gpu, model, 1)
    from kvsim.simcore import fastcore

    fastcore._declare(ccore.library())  # argument types on the library itself, before it is wrapped
    lib = _Counting(ccore.library())
    monkeypatch.setattr(ccore, "library", lambda: lib)
    summary = run_against(model, gpu, config, workload, profile, seed=0, slo=SLO(ttft_p95_ms=50), early_stop=True)
    assert summary["early_stop"] and summary["engine_core"] == "c"
    stopped = summary["completed_so_far"]  # finished ones; the rows that left include the rejected
    assert stopped < 1000, "an overloaded run should be proven to fail early"
    # the core went at most a check's interval and a step's rows past the stop (was: its 16k-row buffer)
    assert 0 < lib.rows <= stopped + 4000 // 40 + 2 * 18, (lib.rows, stopped)
