"""numpy's median and default ('linear') percentiles of a 1-D float64 array, bit for bit, without
importing numpy.ma.

`np.median` and `np.percentile` import numpy.ma on their first call (the median's NaN check and
`np.unique`'s mask test both ask `np.ma`), which costs more than summarising a short run
(~45M instructions). These do the same selection (`np.partition`) and the same floating-point
operations in the same order (numpy/lib/_function_base_impl.py: `_median`, `_quantile`,
`_get_indexes`, `_lerp`), so the results are identical, NaN included: any NaN in the values makes
every result NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def median(values: np.ndarray) -> float:
    """`float(np.median(values))` of a non-empty 1-D float64 array."""
    n = len(values)
    half = n // 2
    kth = [half] if n % 2 else [half - 1, half]
    part = np.partition(values, [*kth, n - 1])
    if np.isnan(part[-1]):
        return float(part[-1])
    return float(np.mean(part[kth[0]: half + 1]))  # numpy's own mean of the middle one or two


def percentiles(values: np.ndarray, qs: Iterable[float]) -> list[float]:
    """`[float(np.percentile(values, q)) for q in qs]` (method 'linear') of a non-empty 1-D
    float64 array; each q in [0, 100]."""
    return _select(values, qs, False)[1]


def median_percentiles(values: np.ndarray, qs: Iterable[float]) -> tuple[float, list[float]]:
    """`(median(values), percentiles(values, qs))` from one partition of the values (each
    position a partition fixes holds the same order statistic whichever others it fixes, so
    the results are those of the two calls): a run's ITL summary selects from every gap once."""
    return _select(values, qs, True)


def _select(values: np.ndarray, qs: Iterable[float], with_median: bool) -> tuple[float | None, list[float]]:
    n = len(values)
    points = []
    for q in qs:
        virtual = (n - 1) * (q / 100)  # numpy: true_divide(q, 100), then (n - 1) * quantiles
        if virtual >= n - 1:  # at or past the last value: numpy takes index -1 for both
            below = above = n - 1
            gamma = virtual - (-1)
        else:
            below = math.floor(virtual)
            above = below + 1
            gamma = virtual - below
        points.append((below, above, gamma))
    half = n // 2
    middle = ([half] if n % 2 else [half - 1, half]) if with_median else []
    kth = sorted({0, n - 1, *middle, *(i for below, above, _ in points for i in (below, above))})
    part = np.partition(values, kth)
    if np.isnan(part[-1]):
        return float(part[-1]) if with_median else None, [float(part[-1])] * len(points)
    out = []
    for below, above, gamma in points:
        a, b = float(part[below]), float(part[above])
        diff = b - a
        out.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)  # numpy's _lerp
    mid = float(np.mean(part[middle[0]: half + 1])) if with_median else None  # as median() takes it
    return mid, out


__all__ = ["median", "median_percentiles", "percentiles"]
