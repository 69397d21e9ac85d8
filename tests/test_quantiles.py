"""kvsim.simcore.quantiles gives numpy's median and linear percentiles bit for bit (and never imports
numpy.ma, which is why it exists)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.simcore.quantiles import median, median_percentiles, percentiles

QS = (0, 1, 5, 25, 50, 75, 90, 95, 99, 99.9, 100)


def _same(a: float, b: float) -> bool:
    """Equal bits; any NaN equals any NaN (with several NaN payloads in the values, which one
    numpy returns depends on its partition's pivots; every output prints a NaN as NaN)."""
    return (np.isnan(a) and np.isnan(b)) or np.float64(a).tobytes() == np.float64(b).tobytes()


def _check(values: np.ndarray) -> None:
    with np.errstate(all="ignore"):  # numpy warns about inf - inf; the values are compared all the same
        _compare(np.asarray(values, dtype=np.float64))


def _compare(values: np.ndarray) -> None:
    kept = values.copy()
    assert _same(median(values), float(np.median(values)))
    assert all(_same(x, float(np.percentile(values, q))) for x, q in zip(percentiles(values, QS), QS, strict=True))
    assert all(_same(x, float(y)) for x, y in zip(percentiles(values, (95, 99)), np.percentile(values, (95, 99)),
                                                   strict=True))
    assert values.tobytes() == kept.tobytes()  # the input is not reordered


@pytest.mark.parametrize("values", [
    [3.0], [0.0], [-0.0], [2.5, 2.5], [1.0, 2.0], [-0.0, 0.0], [0.0, -0.0], [5.0, 1.0, 3.0],
    [1e-300, 1e300, 7.0, 7.0], list(range(10)), [0.1] * 7 + [0.2] * 3, [np.nan], [1.0, np.nan, 2.0],
    [np.nan, np.nan], [np.inf, 1.0], [-np.inf, 1.0, np.inf],
])
def test_small_and_edge_arrays(values):
    _check(np.array(values))


@pytest.mark.parametrize("seed", range(20))
def test_random_arrays_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    values = rng.lognormal(3, 1.5, n) * 1000.0
    values[rng.random(n) < 0.3] = values[0]  # many ties
    values[rng.random(n) < 0.05] = 0.0
    _check(values)
    _check(np.round(values))  # whole numbers: more ties
    if n > 2:
        values[int(rng.integers(n))] = np.nan
        _check(values)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=40))
def test_any_floats(values):
    _check(np.array(values))


def test_no_numpy_ma():
    code = ("import sys, numpy as np\n"
            "from simcore.quantiles import median, percentiles\n"
            "v = np.random.default_rng(0).random(101)\n"
            "median(v), median(v[:100]), percentiles(v, (50, 95, 99))\n"
            "print('numpy.ma' in sys.modules)\n")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


def test_median_and_percentiles_from_one_partition_are_numpys():
    """median_percentiles (a run's ITL summary: one selection over every gap) gives np.median's and
    np.percentile's bits, ties and odd / even counts included."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 10, 1001, 4096):
        v = np.round(rng.gamma(2.0, 20.0, n), 1 if n % 2 else 6)
        mid, pcts = median_percentiles(v, (95, 99, 0, 100))
        assert mid == float(np.median(v))
        assert pcts == [float(np.percentile(v, q)) for q in (95, 99, 0, 100)]
