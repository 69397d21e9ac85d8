"""The engine cores' seam (simcore/cores): the registry picks a core, the C core's options are an
allow-list in each policy's registry entry (a new option is refused, never ignored), early stop is
a watch on the request records, and sweep / plan rows say which core ran."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pytest

from kvsim.simcore import ccore, cores
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.policies import variants
from kvsim.simcore.records import RequestRecords, RunStopped
from kvsim.simcore.simulate import prepare, simulate
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload
from tests.helpers import flat_profile

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]
needs_c = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


def _workload(n: int = 30):
    return load_workload("sharegpt", {"rate": 50, "input_len": 32, "output_len": 8, "num_requests": n})


@dataclass(frozen=True, slots=True)
class WithNewOption(EngineConfig):
    """EngineConfig as it will be once someone adds an option (say, speculative decoding) and
    forgets the C core: the Python engine would read it, the C core knows nothing of it."""

    num_speculative_tokens: int = 0


def test_registry_order_and_the_python_core_runs_everything():
    assert cores.names() == ["c", "python"]  # auto prefers the compiled core where it runs
    beams = load_workload("sharegpt", {"rate": 50, "input_len": 32, "output_len": 8, "num_requests": 30,
                                       "beam_width": 2})
    sim = prepare(TINY, H100, EngineConfig(max_model_len=128), beams, flat_profile())
    assert cores.get("python").supports(sim) == ""
    assert "beam search" in cores.get("c").supports(sim)


def test_every_option_a_core_honours_is_an_engine_option():
    names = {f.name for f in fields(EngineConfig)}
    for spec in variants():
        for core, options in spec.cores:
            assert core in cores.names() and options <= names, (spec.label, core, options - names)


@needs_c
def test_a_new_option_is_refused_by_the_c_core_never_ignored():
    """An option that is not on the C core's allow-list, set off its default, sends the run to
    the Python core with the option's name as the reason (and --engine-core c refuses it)."""
    base = {"max_model_len": 128, "max_num_seqs": 4}
    plain = simulate(TINY, H100, WithNewOption(**base), _workload(), flat_profile())
    assert plain.record["engine_core"] == "c"  # the new option at its default changes nothing
    result = simulate(TINY, H100, WithNewOption(**base, num_speculative_tokens=4), _workload(), flat_profile())
    assert result.record["engine_core"] == "python"
    assert "--num-speculative-tokens 4" in result.record["engine_core_reason"]
    with pytest.raises(ConfigError, match="--engine-core c cannot run this simulation: --num-speculative-tokens 4"):
        simulate(TINY, H100, WithNewOption(**base, num_speculative_tokens=4), _workload(), flat_profile(),
                 engine_core="c")


@needs_c
def test_options_off_the_allow_list_are_named():
    sim = prepare(TINY, H100, WithNewOption(max_model_len=128, num_speculative_tokens=2), _workload(), flat_profile())
    assert sim.choose_core()[0] == "python" and "--num-speculative-tokens 2" in sim.choose_core()[1]


def _rows(n: int, first: int = 0) -> np.ndarray:
    rows = np.zeros((n, 14))
    rows[:, 0] = np.arange(first, first + n)
    rows[:, 5] = rows[:, 6] = rows[:, 7] = rows[:, 4] = 1.0
    return rows


def test_the_records_watch_stops_at_the_same_row_one_by_one_or_in_bulk():
    """The C core hands rows over in buffers, the Python core one at a time: the watch sees the
    same rows either way (the every-th, 2 every-th, ...), and its value stops the run."""
    seen = {}
    for how in ("bulk", "single"):
        records = RequestRecords()
        counts = seen[how] = []

        def check(r, counts=counts):
            counts.append(r.num_left)
            return "stop" if r.num_left >= 21 else None

        records.watch(7, check)
        with pytest.raises(RunStopped) as stopped:
            if how == "bulk":
                records.leave_rows(_rows(5))
                records.leave_rows(_rows(40, 5))
            else:
                for i in range(45):
                    records.leave_rows(_rows(1, i))
        assert stopped.value.value == "stop" and records.num_left == 21
    assert seen["bulk"] == seen["single"] == [7, 14, 21]


@needs_c
def test_plan_rows_and_sweep_rows_record_the_engine_core():
    """`kvsim plan`'s candidates are searched, early stop included, by the C core; a sweep row
    says which core ran its point."""
    from kvsim.reports.capacity import SLO
    from kvsim.reports.plan import default_dimensions, plan
    from kvsim.reports.prices import load_prices
    from kvsim.reports.sweep_runner import Point, run_point
    from kvsim.simcore.catalog import get_model

    workload = load_workload("sharegpt", {"rate": 10, "input_len": 256, "output_len": 64, "num_requests": 150})
    result = plan([get_model("llama3-8b")], default_dimensions(["H100-SXM-80GB"], [1, 2]), EngineConfig(), [5.0],
                  workload, SLO(ttft_p95_ms=500, tpot_p95_ms=50), load_prices(),
                  search_requests=100, confirm_requests=150, tolerance=0.15)
    table = result.table
    searched = table[table["replica_max_rate"].notna()]
    assert len(searched) and (searched["engine_core"] == "c").all(), table[["status", "engine_core"]]
    point = Point(model=TINY, gpu=H100, config=EngineConfig(max_model_len=128), workload=_workload(),
                  profile=flat_profile(), seed=0)
    assert run_point(point)["engine_core"] == "c"
