"""`kvsim plan` prints its table without pandas (reports.plan.table_records; pandas' import was
a third of a small plan's process): the records must be those pandas gives, cell for cell and
type for type, as plan.json shows them."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd

from kvsim.reports.capacity import SLO
from kvsim.reports.plan import PlanResult, default_dimensions, plan, table_records
from kvsim.reports.prices import load_prices
from kvsim.simcore.catalog import get_model
from kvsim.simcore.specs import EngineConfig
from tests.test_plan import FAST, small_workload


def _pandas_records(rows):
    frame = pd.DataFrame(rows)
    return [{k: (None if v is None or (not isinstance(v, str | dict | list) and pd.isna(v)) else v)
             for k, v in row.items()} for row in frame.astype(object).to_dict("records")]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)  # the same columns, in the same order
        for k in x:
            assert type(x[k]) is type(y[k]) and (x[k] == y[k] or (isinstance(x[k], float) and math.isnan(x[k]))), k


def test_records_are_pandas_records_on_every_kind_of_column():
    rows = [
        {"i": 1, "f": 1.5, "mix": 2, "gap": 5, "b": True, "bn": True, "s": "a", "sn": "x", "none": None,
         "npi": np.int64(3), "npf": np.float64(0.5), "nan": float("nan"), "d": {"k": 1}, "obj": "t"},
        {"i": 2, "f": 2.5, "mix": 2.5, "b": False, "bn": None, "s": "b", "sn": None, "none": None,
         "npi": np.int64(4), "npf": np.float64(1.5), "nan": 3, "d": {"k": 2}, "obj": 7, "late": 9},
    ]
    _same(table_records(rows), _pandas_records(rows))
    assert table_records([]) == _pandas_records([]) == []


def test_a_plans_records_are_its_tables():
    dims = default_dimensions(["H100-SXM-80GB", "A100-80GB"], [1, 2])
    result = plan([get_model("llama3-8b")], dims, EngineConfig(), [10, 40], small_workload(), SLO(tpot_p95_ms=60),
                  load_prices(), **FAST)
    assert isinstance(result, PlanResult) and result._table is None  # nothing made the table yet
    _same(result.records(), _pandas_records(result.rows))
    _same(result.records(), _pandas_records(result.table.to_dict("records")))


def test_the_printed_plan_does_not_import_pandas():
    code = ("import sys\nfrom kvsim.cli.main import main\nsys.argv = ['kvsim', 'plan', '--model', 'llama3-8b', "
            "'--gpu', 'H100-SXM-80GB', '--tp', '1', '--workload', 'azure-conv', '--search-requests', '100', "
            "'--confirm-requests', '150', '--rate', '5', '--slo-tpot-p95-ms', '60']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nprint('pandas' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "Answer:" in done.stdout, done.stderr[-500:]
    assert done.stderr.strip().splitlines()[-1] == "False"
