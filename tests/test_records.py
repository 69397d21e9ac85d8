"""Bounded-memory records (simcore.records): exact below the caps, bounded and close beyond."""

from __future__ import annotations

import numpy as np
import pytest

from simcore.records import HIST_RELATIVE_WIDTH, Samples


def _numpy_stats(v: np.ndarray) -> dict[str, float]:
    ms = v * 1000.0
    return {"mean_x_ms": float(np.mean(ms)), "median_x_ms": float(np.median(ms)),
            "p95_x_ms": float(np.percentile(ms, 95)), "p99_x_ms": float(np.percentile(ms, 99))}


def test_samples_below_the_cap_are_numpys_exactly_in_insertion_order():
    rng = np.random.default_rng(1)
    s = Samples(cap=1000)
    expected = []
    for i in range(50):
        if i % 3:
            x = float(rng.lognormal(-3, 1))
            s.append(x)
            expected.append(x)
        else:
            arr = rng.lognormal(-3, 1, size=7)
            s.extend(arr)
            expected.extend(arr.tolist())
    assert s.exact and s.resolution == "exact"
    assert s.values().tolist() == expected
    out: dict = {}
    s.stats("x", out)
    assert out == _numpy_stats(np.array(expected))


@pytest.mark.parametrize("cap", [0, 10, 999])
def test_samples_beyond_the_cap_are_binned_within_half_a_bin(cap):
    rng = np.random.default_rng(2)
    values = np.concatenate([rng.lognormal(-4, 1.5, size=3000), [0.0, 0.0], rng.uniform(0.01, 0.02, 500)])
    s = Samples(cap=cap)
    for chunk in np.array_split(values, 37):
        s.extend(chunk)
    s.append(0.5)
    values = np.append(values, 0.5)
    assert not s.exact and "histogram" in s.resolution
    with pytest.raises(AssertionError):
        s.values()
    out: dict = {}
    s.stats("x", out)
    want = _numpy_stats(values)
    assert out["mean_x_ms"] == pytest.approx(want["mean_x_ms"], rel=1e-12)
    for key in ("median_x_ms", "p95_x_ms", "p99_x_ms"):
        assert out[key] == pytest.approx(want[key], rel=HIST_RELATIVE_WIDTH)
    assert s.percentiles((0, 100)) == [0.0, float(values.max())]


def test_the_histogram_grows_both_ways_and_stays_small():
    s = Samples(cap=0)
    s.extend(np.array([1.0]))
    s.extend(np.array([1e-6, 1e3]))
    s.extend(np.full(100_000, 0.25))
    assert s._hist.nbytes < 8 * 40 * (1 << 14)  # ~30 binades, however many values
    assert s.percentiles((50,)) == [pytest.approx(0.25, rel=HIST_RELATIVE_WIDTH)]
    assert len(s) == 100_003


def test_merged_replicas_keep_order_while_exact_and_bin_beyond():
    a, b = Samples(cap=100), Samples(cap=100)
    a.extend(np.array([1.0, 2.0]))
    b.append(3.0)
    assert Samples.merged([a, b]).values().tolist() == [1.0, 2.0, 3.0]
    c = Samples(cap=1)
    c.extend(np.array([4.0, 5.0, 6.0]))
    m = Samples.merged([a, b, c])
    assert not m.exact and len(m) == 6 and m.total == 21.0
    assert m.percentiles((50,)) == [pytest.approx(3.5, rel=HIST_RELATIVE_WIDTH)]
