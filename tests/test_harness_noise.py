"""The harness's noise guard: noisy points are re-measured, the cleanest attempt kept, and points
that stay noisy (wide spread across repeats, or a drifting reference kernel) marked and reported."""

from __future__ import annotations

from kvsim.profiles.harness import MAX_REMEASURE, NoiseGuard, noise_summary

REF, POINT = "ref", "point"


class ScriptedTimer:
    """Returns (median, spread) from scripts per callable; logs every call."""

    def __init__(self, ref: list[float], point: list[tuple[float, float]]):
        self.ref, self.point, self.calls = list(ref), list(point), []

    def __call__(self, fn):
        self.calls.append(fn())
        if fn() == REF:
            return (self.ref.pop(0) if len(self.ref) > 1 else self.ref[0]), 0.0
        return self.point.pop(0)


def guard(ref, point):
    timer = ScriptedTimer(ref, point)
    return NoiseGuard(timer, lambda: REF, "scripted"), timer


def test_a_quiet_point_is_measured_once():
    g, timer = guard([1.0], [(2.0, 0.1)])
    assert g("p", lambda: POINT) == (2.0, 0.1)
    assert timer.calls.count(POINT) == 1 and g.describe()["noisy_points"] == [] and g.num_remeasured == 0
    assert noise_summary(g.describe()) is None


def test_a_wide_spread_is_remeasured_and_the_clean_attempt_kept():
    g, timer = guard([1.0], [(2.0, 1.5), (2.1, 0.2)])
    assert g("p", lambda: POINT) == (2.1, 0.2)
    assert timer.calls.count(POINT) == 2 and g.num_remeasured == 1 and not g.noisy
    assert "1 re-measurements over 1 points" in noise_summary(g.describe())


def test_a_drifting_reference_marks_the_point_after_retries():
    # baseline 1.0 ms (three timings), then the reference runs 40% slow around every attempt
    g, timer = guard([1.0, 1.0, 1.0, 1.4], [(2.0, 0.1)] * (1 + MAX_REMEASURE))
    med, _ = g("decode 1x16", lambda: POINT)
    assert med == 2.0 and timer.calls.count(POINT) == 1 + MAX_REMEASURE
    (mark,) = g.describe()["noisy_points"]
    assert mark["point"] == "decode 1x16" and mark["reference_drift"] == 0.4
    assert "1 points still noisy" in noise_summary(g.describe())


def test_always_noisy_keeps_the_least_noisy_attempt():
    g, _ = guard([1.0], [(2.0, 1.8), (2.0, 1.0), (2.0, 1.6)])
    assert g("p", lambda: POINT) == (2.0, 1.0)
    assert g.describe()["noisy_points"][0]["spread_over_median"] == 0.5
