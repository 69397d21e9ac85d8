"""Profile schema validation and the interpolating step latency model."""

import copy
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from profiles.roofline import build_roofline_profile
from simcore.catalog import get_gpu, get_model
from simcore.errors import ProfileError
from simcore.latency import StepLatencyModel, Table1D, Table2D, parse_profile

DOC = build_roofline_profile(get_gpu("H100-SXM-80GB"), get_model("llama3-8b"), 2)


def broken(path: tuple, value=None, delete: bool = False) -> dict:
    doc = copy.deepcopy(DOC)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "delete", "needle"),
    [
        (("linear",), None, True, "missing field 'linear'"),
        (("linear", "time_ms"), [1.0, 2.0], False, "linear: num_tokens and time_ms differ"),
        (("linear", "num_tokens"), [4, 2, 1], False, "linear.num_tokens: grid must be strictly increasing"),
        (("lm_head", "time_ms"), "fast", False, "lm_head.time_ms"),
        (("prefill_attention", "time_ms"), [[1.0]], False, "prefill_attention.time_ms"),
        (("decode_attention",), {"x": {}}, False, "decode_attention: block size 'x'"),
        (("model_shape", "num_layers"), None, True, "model_shape: missing field 'num_layers'"),
        (("tensor_parallel_size",), 0, False, "tensor_parallel_size"),
        (("step_overhead_ms",), -1, False, "step_overhead_ms"),
        (("step_overhead_ms_by_policy",), {"orca": 1.0}, False, "unknown policy 'orca'"),
        (("step_overhead_ms_by_policy", "static"), float("nan"), False, "step_overhead_ms_by_policy.static"),
        (("schema_version",), 2, False, "schema_version 2"),
        (("source",), "guess", False, "source must be one of"),
    ],
)
def test_malformed_profile_names_the_field(path, value, delete, needle):
    with pytest.raises(ProfileError, match=None) as info:
        parse_profile(broken(path, value, delete), "p.json")
    assert needle in str(info.value)
    assert str(info.value).startswith("p.json")


def test_overhead_by_policy_and_fallback():
    by = DOC["step_overhead_ms_by_policy"]
    for policy in ("static", "dynamic", "continuous"):
        assert StepLatencyModel(DOC, policy=policy).step_overhead_ms == by[policy]
    doc = broken(("step_overhead_ms_by_policy",), delete=True)
    assert StepLatencyModel(doc, policy="static").step_overhead_ms == DOC["step_overhead_ms"]
    with pytest.raises(ProfileError, match="unknown batching policy"):
        StepLatencyModel(DOC, policy="orca")
    # the overhead is the whole cost difference between policies
    a = StepLatencyModel(DOC, policy="static").step_time_s(8, [], 8, 8000, 8)
    b = StepLatencyModel(DOC, policy="continuous").step_time_s(8, [], 8, 8000, 8)
    assert math.isclose(a - b, (by["static"] - by["continuous"]) / 1e3, rel_tol=1e-9)


def test_interpolation_exact_at_grid_points():
    lin = DOC["linear"]
    table = Table1D(lin["num_tokens"], lin["time_ms"])
    for x, y in zip(lin["num_tokens"], lin["time_ms"], strict=True):
        assert math.isclose(table(x), y, rel_tol=1e-9)
    dec = DOC["decode_attention"]["16"]
    t2 = Table2D(dec["batch_size"], dec["context_tokens"], dec["time_ms"])
    for i, a in enumerate(dec["batch_size"]):
        for j, b in enumerate(dec["context_tokens"]):
            assert math.isclose(t2(a, b), dec["time_ms"][i][j], rel_tol=1e-9)


@given(st.lists(st.floats(0.001, 100.0), min_size=2, max_size=8), st.floats(1.0, 5000.0), st.floats(1.0, 5000.0))
def test_interpolation_monotone(ys, x1, x2):
    xs = [2.0**k for k in range(len(ys))]
    table = Table1D(xs, ys)  # noisy input: the table is made monotone first
    lo, hi = sorted((x1, x2))
    assert table(lo) <= table(hi) * (1 + 1e-12)


@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(0, 60000), st.integers(0, 60000))
def test_table2d_monotone_in_both(a1, a2, b1, b2):
    dec = DOC["prefill_attention"]
    t = Table2D(dec["chunk_tokens"], dec["context_tokens"], dec["time_ms"])
    (a1, a2), (b1, b2) = sorted((a1, a2)), sorted((b1, b2))
    assert t(a1, b1) <= t(a2, b2) * (1 + 1e-9)


def test_extrapolation_is_counted():
    m = StepLatencyModel(DOC)
    m.step_time_s(64, [], 64, 64 * 1000, 64)
    assert m.extrapolated.steps == 0
    m.step_time_s(40000, [(40000, 0)], 2000, 2000 * 100000, 2001)
    assert m.extrapolated.steps == 1
    assert {"linear", "prefill_attention", "decode_attention"} <= set(m.extrapolated.tables)


def test_set_block_size_picks_nearest():
    m = StepLatencyModel(DOC)
    assert m.set_block_size(32) is True and m.decode_block_size == 32
    assert m.set_block_size(64) is False and m.decode_block_size == 32
