"""Profile schema validation and the interpolating step latency model."""

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.profiles.roofline import build_roofline_profile
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ProfileError
from kvsim.simcore.latency import StepLatencyModel, Table1D, Table2D, parse_profile

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
        (("host_overhead", "per_step_ms"), -1, False, "host_overhead.per_step_ms"),
        (("host_overhead", "per_seq_ms"), 1e300, False, "host_overhead.per_seq_ms"),
        (("host_overhead", "per_token"), 1.0, False, "unknown term 'per_token'"),
        (("host_overhead_by_policy",), {"orca": {}}, False, "unknown policy 'orca'"),
        (("host_overhead_by_policy", "static", "per_step_ms"), float("nan"), False,
         "host_overhead_by_policy.static.per_step_ms"),
        (("schema_version",), 3, False, "schema_version 3"),
        (("linear", "time_ms"), [0.0] * 28, False, "every timing is zero"),
        (("linear", "time_ms"), [1e-9] * 28, False, "faster than"),
        (("linear", "time_ms"), [1e300] * 28, False, "not a plausible kernel time"),
        (("collectives", "all_reduce", "time_ms"), "x", False, "collectives.all_reduce.time_ms"),
        (("source",), "guess", False, "source must be one of"),
    ],
)
def test_malformed_profile_names_the_field(path, value, delete, needle):
    with pytest.raises(ProfileError, match=None) as info:
        parse_profile(broken(path, value, delete), "p.json")
    assert needle in str(info.value)
    assert str(info.value).startswith("p.json")


def test_host_overhead_by_policy_and_fallback():
    by = DOC["host_overhead_by_policy"]
    for policy in ("static", "dynamic", "continuous"):
        assert StepLatencyModel(DOC, policy=policy).host.to_dict() == pytest.approx(by[policy])
    doc = broken(("host_overhead_by_policy",), delete=True)
    assert StepLatencyModel(doc, policy="static").host.to_dict() == pytest.approx(DOC["host_overhead"])


def test_host_overhead_by_engine_prices_continuous_steps_as_that_version():
    by = DOC["host_overhead_by_engine"]
    assert set(by) == {"vllm-v0", "vllm-0.6", "vllm-v1", "vllm-v1-async"}
    for version, terms in by.items():
        m = StepLatencyModel(DOC, policy="continuous", engine_version=version)
        assert m.host.to_dict() == pytest.approx(terms)
        assert m.host_source == f"host_overhead_by_engine.{version}"
    # other policies keep their own engine's terms whatever the version
    m = StepLatencyModel(DOC, policy="static", engine_version="vllm-v0")
    assert m.host.to_dict() == pytest.approx(DOC["host_overhead_by_policy"]["static"])
    # V0 pays Ray calls and synchronous output processing: dearer per step and per sequence than V1,
    # and multi-step scheduling (0.6) spreads the loop over 10 steps
    assert by["vllm-v0"]["per_step_ms"] > by["vllm-v1"]["per_step_ms"] > by["vllm-0.6"]["per_step_ms"]
    assert by["vllm-v0"]["per_seq_ms"] > by["vllm-v1"]["per_seq_ms"] > by["vllm-0.6"]["per_seq_ms"]
    # async scheduling (vLLM >= 0.14) keeps only the gap between two steps' kernels on the critical path
    assert by["vllm-v1-async"]["per_step_ms"] < by["vllm-v1"]["per_step_ms"] and by["vllm-v1-async"]["per_seq_ms"] == 0
    with pytest.raises(ProfileError, match="unknown engine version 'vllm-v9'"):
        parse_profile({**DOC, "host_overhead_by_engine": {"vllm-v9": {}}}, "p.json")


def test_v1_profile_still_reads_with_step_overhead_as_per_step_term():
    doc = copy.deepcopy(DOC)
    doc["schema_version"] = 1
    del doc["host_overhead"], doc["host_overhead_by_policy"], doc["collectives"]
    doc["step_overhead_ms"] = 2.0
    doc["step_overhead_ms_by_policy"] = {"static": 5.0}
    doc["collective"] = {"num_tokens": [1, 4096], "time_ms": [0.02, 0.2]}
    parse_profile(doc)
    assert StepLatencyModel(doc, policy="static").host.per_step_ms == 5.0
    m = StepLatencyModel(doc, policy="continuous")
    assert m.host.per_step_ms == 2.0 and m.host.per_seq_ms == 0.0
    assert m.collectives_ms(1, 1) == pytest.approx(m.num_layers * 0.02)


def test_host_model_terms_enter_the_step_as_stated():
    doc = copy.deepcopy(DOC)
    doc["host_overhead"] = {"per_step_ms": 1.0, "per_seq_ms": 0.5, "per_prefill_step_ms": 3.0,
                            "per_prefill_token_ms": 0.01}
    del doc["host_overhead_by_policy"], doc["host_overhead_by_engine"]
    m = StepLatencyModel(doc)
    assert m.step_breakdown_ms(8, [], 8, 800, 8)[2] == pytest.approx(1.0 + 8 * 0.5)
    assert m.step_breakdown_ms(108, [(100, 0)], 8, 800, 9)[2] == pytest.approx(1.0 + 9 * 0.5 + 3.0 + 100 * 0.01)


def test_breakdown_sums_to_step_time_and_collectives_grow_with_tp():
    m = StepLatencyModel(DOC)
    args = (600, [(512, 0)], 88, 88 * 700, 89)
    assert sum(m.step_breakdown_ms(*args)) == pytest.approx(1e3 * m.step_time_s(*args), rel=1e-12)
    m1 = StepLatencyModel(build_roofline_profile(get_gpu("H100-SXM-80GB"), get_model("llama3-8b"), 1))
    m8 = StepLatencyModel(build_roofline_profile(get_gpu("H100-SXM-80GB"), get_model("llama3-8b"), 8))
    assert m1.step_breakdown_ms(*args)[1] == 0.0
    # 2 all-reduces per layer of a few KB each: vLLM's custom all-reduce floor (~9-10 us at TP 8 on H100,
    # profiles/custom_allreduce.py) dominates
    small = m8.step_breakdown_ms(1, [], 1, 100, 1)[1] / (2 * m8.num_layers + 1)
    assert 0.008 < small < 0.012


def test_decode_span_equals_scalar_steps():
    import numpy as np

    for tp in (1, 4):
        m = StepLatencyModel(build_roofline_profile(get_gpu("H100-SXM-80GB"), get_model("llama3-8b"), tp))
        for bs in (1, 16, 128):
            m.set_block_size(bs)
            for n in (1, 3, 64, 700, 5000):
                sums = np.array([n * c + k for k, c in enumerate((1, 7, 100, 1000, 4097, 40000))], dtype=float)
                span = m.decode_span_times_s(n, sums)
                scalar = np.array([m.step_time_s(n, [], n, int(s), n) for s in sums])
                assert np.allclose(span, scalar, rtol=1e-12, atol=0)


def test_decode_tables_differ_by_block_size_for_a_stated_reason():
    m = StepLatencyModel(DOC)
    times = {}
    for bs in (1, 2, 4, 8, 16, 32, 64, 128):
        m.set_block_size(bs)
        times[bs] = m.decode(64, 4096)  # long contexts: the per-block cost dominates the padding
    assert all(times[a] > times[b] for a, b in zip((1, 2, 4, 8, 16, 32, 64), (2, 4, 8, 16, 32, 64, 128), strict=True))
    m.set_block_size(128)
    padded = m.decode(64, 128)
    m.set_block_size(16)
    assert padded > m.decode(64, 128)  # ragged lengths: ~64 padded rows per sequence at 128, ~8 at 16


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
    doc = copy.deepcopy(DOC)
    doc["decode_attention"] = {k: v for k, v in DOC["decode_attention"].items() if k in ("8", "16", "32")}
    m = StepLatencyModel(doc)
    assert m.set_block_size(32) is True and m.decode_block_size == 32
    assert m.set_block_size(64) is False and m.decode_block_size == 32


def _plain_table2d(t: Table2D, a: float, b: float) -> float:
    """Table2D's interpolation written out plainly, nothing kept between calls: the reference
    the per-a memo and the precomputed row steps must equal bit for bit."""
    from bisect import bisect_right

    def locate(grid, v):
        if len(grid) == 1:
            return 0, 0.0
        i = min(max(bisect_right(grid, v) - 1, 0), len(grid) - 2)
        return i, (v - grid[i]) / (grid[i + 1] - grid[i])

    if a <= 0:
        return 0.0
    i, s = locate(t.la, math.log(a))
    j, u = locate(t.lb, math.log1p(b))
    lz = t.lz
    i1, j1 = min(i + 1, len(lz) - 1), min(j + 1, len(lz[0]) - 1)
    top = lz[i][j] + u * (lz[i][j1] - lz[i][j])
    bot = lz[i1][j] + u * (lz[i1][j1] - lz[i1][j])
    return math.exp(top + s * (bot - top))



def _plain_outside(t: Table2D, a: float, b: float, counter, name: str) -> bool:
    """Whether (a, b) lies outside the table's grid, noting `name` with the counter when it does."""
    (a_lo, a_hi), (b_lo, b_hi) = t.a_range, t.b_range
    outside = not (a_lo <= a <= a_hi and b_lo <= b <= b_hi)
    if outside and counter is not None:
        counter.note(name)
    return outside

def _plain_row(t: Table2D, a: float, bs):
    """Table2D.row written out plainly with numpy (the arithmetic decode spans were priced with),
    its logarithms and exponentials libm's (math's), as Table2D.__call__'s."""
    import numpy as np

    if a <= 0:
        return np.zeros(len(bs))
    from bisect import bisect_right

    la = t.la
    i = 0 if len(la) == 1 else min(max(bisect_right(la, math.log(a)) - 1, 0), len(la) - 2)
    s = 0.0 if len(la) == 1 else (math.log(a) - la[i]) / (la[i + 1] - la[i])
    i1 = min(i + 1, len(t.lz) - 1)
    lb = np.array([math.log1p(b) for b in np.asarray(bs, dtype=np.float64).tolist()])
    top_row, bot_row = np.asarray(t.lz[i]), np.asarray(t.lz[i1])
    if len(t.lb) == 1:
        top, bot = np.full(len(lb), top_row[0]), np.full(len(lb), bot_row[0])
    else:
        grid = np.asarray(t.lb)
        j = np.clip(np.searchsorted(grid, lb, side="right") - 1, 0, len(grid) - 2)
        u = (lb - grid[j]) / (grid[j + 1] - grid[j])
        top = top_row[j] + u * (top_row[j + 1] - top_row[j])
        bot = bot_row[j] + u * (bot_row[j + 1] - bot_row[j])
    return np.array([math.exp(x) for x in (top + s * (bot - top)).tolist()])


def _tables():
    dec = DOC["decode_attention"]["16"]
    pre = DOC["prefill_attention"]
    return [
        Table2D(dec["batch_size"], dec["context_tokens"], dec["time_ms"]),
        Table2D(pre["chunk_tokens"], pre["context_tokens"], pre["time_ms"]),
        Table2D([4.0], [0.0, 100.0, 1000.0], [[1.0, 2.0, 5.0]]),  # one batch size
        Table2D([1.0, 8.0, 64.0], [512.0], [[1.0], [2.0], [9.0]]),  # one context
        Table2D([2.0], [16.0], [[3.0]]),  # one point
    ]


@given(st.floats(-2.0, 1e5), st.floats(0.0, 1e7), st.floats(0.0, 1e7))
def test_table2d_memo_and_rows_equal_plain_interpolation_bit_for_bit(a, b1, b2):
    import numpy as np

    a = float(round(a)) if a > 1 else a  # integer batch sizes (the memo's usual keys) and fractions
    bs = np.array([b1, b2, 0.0, b1 + 1.0])
    for t in _tables():
        first, again = t(a, b1), t(a, b1)  # the second call reads the kept a-terms
        assert first == again == _plain_table2d(t, a, b1)
        assert t(a, b2) == _plain_table2d(t, a, b2)
        assert np.array_equal(t.row(a, bs), _plain_row(t, a, bs))
        assert np.array_equal(t.row(a, bs), t.row(a, bs))
        assert t.row(a, bs).tolist() == [t(a, b) for b in bs.tolist()]  # the scalar interpolation's bits


def test_decode_span_counts_extrapolation_as_step_by_step_pricing():
    import numpy as np

    dec = DOC["decode_attention"]["16"]
    b_max, a_max = dec["context_tokens"][-1], dec["batch_size"][-1]
    spans = [(8, 8 * np.arange(100, 110)),  # inside every grid
             (8, 8 * (b_max - 3) + 8 * np.arange(6)),  # leaves the context grid half way
             (2 * a_max, 2 * a_max * 100 + 2 * a_max * np.arange(4)),  # batch beyond the grid
             (60000, 60000 * 10 + 60000 * np.arange(3))]  # tokens beyond the linear grid too
    span, steps = StepLatencyModel(DOC), StepLatencyModel(DOC)
    for n, sums in spans:
        times = span.decode_span_times_s(n, sums)
        one_by_one = [steps.step_time_s(n, [], n, int(s), n) for s in sums]
        assert np.allclose(times, one_by_one, rtol=1e-12, atol=0)
        assert (span.extrapolated.steps, span.extrapolated.tables) == (steps.extrapolated.steps,
                                                                       steps.extrapolated.tables)
    assert span.extrapolated.tables.keys() == {"linear", "decode_attention"}
    assert 0 < span.extrapolated.steps < sum(len(s) for _, s in spans)


def test_pricing_memos_stay_bounded_and_change_no_result(monkeypatch):
    import numpy as np

    import kvsim.simcore.latency as latency

    shapes = [(n + c, [(c, 7 * n)] if c else [], n, n * (50 + 13 * n), n + (1 if c else 0))
              for n in range(1, 40) for c in (0, 3, 100)]
    free = StepLatencyModel(DOC)
    want = [(free.step_time_s(*s), free.step_breakdown_ms(*s)) for s in shapes]
    offsets = [np.arange(5), np.arange(latency.SHORT_ROW + 5)]  # rows on Python floats and by numpy
    want_spans = [free.decode_span_times_s(n, n * 300 + n * k) for n in range(1, 40) for k in offsets]
    monkeypatch.setattr(latency, "MEMO_ENTRIES", 5)
    monkeypatch.setattr(latency, "ROW_MEMO_ENTRIES", 3)
    capped = StepLatencyModel(DOC)
    got = [(capped.step_time_s(*s), capped.step_breakdown_ms(*s)) for s in shapes]
    got_spans = [capped.decode_span_times_s(n, n * 300 + n * k) for n in range(1, 40) for k in offsets]
    assert got == want and all(np.array_equal(a, b) for a, b in zip(got_spans, want_spans, strict=True))
    assert len(capped._fixed_memo) == 5 and len(capped._span_memo) == 5
    assert len(capped.decode._by_a) == 5 and len(capped.decode._rows_by_a) == 3
    assert (capped.extrapolated.steps, capped.extrapolated.tables) == (free.extrapolated.steps,
                                                                       free.extrapolated.tables)


# -- the pricing's fast paths against the pricing written out plainly ------------------------------
# StepLatencyModel prices a step in one function with memos, and a short decode span's
# interpolation on Python floats; these references are the same formulas with nothing kept and no
# shortcut (as priced before those were added), so every result must match them bit for bit.


def _plain_table1d(t: Table1D, x: float) -> float:
    if x <= 0:
        return 0.0
    lx, ly = t.lx, t.ly
    if len(lx) == 1:
        return math.exp(ly[0]) * x / t.lo
    from bisect import bisect_right

    i = min(max(bisect_right(lx, math.log(x)) - 1, 0), len(lx) - 2)
    u = (math.log(x) - lx[i]) / (lx[i + 1] - lx[i])
    return math.exp(ly[i] + u * (ly[i + 1] - ly[i]))


class _PlainModel(StepLatencyModel):
    """StepLatencyModel with its pricing written out plainly (the reference for the fast paths)."""

    def _parts_ms(self, num_tokens, prefill_chunks, num_decode_seqs, decode_context_tokens, num_sampled, counter):
        layers = self.num_layers
        gemm = layers * _plain_table1d(self.linear, num_tokens) + _plain_table1d(self.lm_head, num_sampled)
        coll = 0.0
        if self.all_reduce is not None:
            coll = layers * self.calls_per_layer * _plain_table1d(self.all_reduce, num_tokens * self.token_bytes)
            if num_sampled:
                coll += _plain_table1d(self.all_reduce, num_sampled * self.logit_bytes / 2)
        elif self.collective is not None:
            coll = layers * _plain_table1d(self.collective, num_tokens)
        host = self.host.ms(len(prefill_chunks) + num_decode_seqs, num_tokens - num_decode_seqs)
        out = self.linear.outside(num_tokens)
        if out and counter is not None:
            counter.note("linear")
        ms = 0.0
        for chunk, ctx in prefill_chunks:
            ms += _plain_table2d(self.prefill, chunk, ctx)
            out = _plain_outside(self.prefill, chunk, ctx, counter, "prefill_attention") or out
        occ = self.occupancy
        if prefill_chunks and occ is not None:
            ctas = sum(math.ceil(c / occ.tile) for c, _ in prefill_chunks) * occ.ctas
            ms = occ.floor_ms + ms / (ctas / (math.ceil(ctas / occ.sms) * occ.sms))
        if num_decode_seqs:
            mean_ctx = decode_context_tokens / num_decode_seqs
            ms += _plain_table2d(self.decode, num_decode_seqs, mean_ctx)
            out = _plain_outside(self.decode, num_decode_seqs, mean_ctx, counter, "decode_attention") or out
        if out and counter is not None:
            counter.steps += 1
        return gemm, layers * ms, coll, host

    def step_time_s(self, *step):
        g, a, c, h = self._parts_ms(*step, self.extrapolated)
        return (h + g + a + c) / 1000.0

    def step_breakdown_ms(self, *step):
        g, a, c, h = self._parts_ms(*step, None)
        return g + a, c, h

    def decode_span_times_s(self, num_seqs, context_sums):
        import numpy as np

        mean_ctx = np.asarray(context_sums, dtype=np.float64) / np.array(float(num_seqs))
        gemm, attention, coll, host = self._parts_ms(num_seqs, [], num_seqs, 0, num_seqs, None)
        attention = self.num_layers * _plain_row(self.decode, num_seqs, mean_ctx)
        for total in np.asarray(context_sums).tolist():  # counted as step_time_s counts each step
            self._parts_ms(num_seqs, [], num_seqs, total, num_seqs, self.extrapolated)
        return (host + gemm + attention + coll) / 1000.0


def _profile_docs() -> dict[str, dict]:
    """One document of each kind the pricing reads differently: v2 roofline with collectives and
    prefill occupancy (TP 4), v2 without collectives (TP 1), v1 measured (no occupancy, no
    collectives), v1 with the per-layer `collective` table, and one-point / two-point grids."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "profiles"
    docs = {
        "v2-tp4": json.loads((root / "H100-SXM-80GB-llama2-70b-tp4.json").read_text()),
        "v2-tp1": json.loads((root / "H100-SXM-80GB-llama3-8b-tp1.json").read_text()),
        "v1-measured": json.loads((root / "cpu-tiny-tp1.json").read_text()),
    }
    v1 = copy.deepcopy(DOC)
    v1["schema_version"] = 1
    del v1["host_overhead"], v1["host_overhead_by_policy"], v1["collectives"]
    v1["step_overhead_ms"] = 2.0
    v1["collective"] = {"num_tokens": [1, 4096], "time_ms": [0.02, 0.2]}
    docs["v1-collective"] = v1
    small = copy.deepcopy(DOC)  # a decode table with one context point, a prefill table with two
    small["decode_attention"] = {"16": {"batch_size": [1, 64], "context_tokens": [512], "time_ms": [[0.01], [0.2]]}}
    pre = small["prefill_attention"]
    pre["context_tokens"] = pre["context_tokens"][:2]
    pre["time_ms"] = [row[:2] for row in pre["time_ms"]]
    for entry in small.get("prefill_attention_by_engine", {}).values():  # per-version scales on the same grid
        entry["time_scale"] = [row[:2] for row in entry["time_scale"]]
    docs["small-grids"] = small
    return docs


DOCS = _profile_docs()


def _near_edges(lo: int, hi: int, edges: list[int]) -> st.SearchStrategy[int]:
    """Any value, or one at or next to a grid's edge (where counting as outside starts)."""
    return st.one_of(st.integers(lo, hi), st.sampled_from([e + d for e in edges for d in (-1, 0, 1) if e + d >= lo]))


_ctx = _near_edges(0, 100000, [0, 16, 256, 512, 32768])
_chunk = st.tuples(_near_edges(1, 40000, [1, 16, 256, 16384]), _ctx)
_step = st.tuples(st.lists(_chunk, max_size=4), _near_edges(0, 3000, [1, 16, 1024]), _ctx, st.booleans())
_span = st.tuples(_near_edges(1, 3000, [1, 16, 1024]), _ctx, st.integers(1, 40), st.integers(0, 3000))


@settings(deadline=None, max_examples=100)
@given(st.sampled_from(sorted(DOCS)), st.sampled_from([1, 16, 32, 128]),
       st.lists(st.one_of(_step, _span), min_size=1, max_size=12))
def test_step_and_span_pricing_equal_the_plain_formulas_bit_for_bit(kind, block_size, ops):
    """Random steps (decodes alone, with prompt chunks, chunks alone; inside and far outside the
    profiled grids) and decode spans (short and long): the same floats and the same counts of
    extrapolated steps and tables as the plain reference, and step_breakdown_ms the same whether
    it reuses the step just priced or prices it again."""
    import numpy as np

    fast, plain = StepLatencyModel(DOCS[kind]), _PlainModel(DOCS[kind])
    fast.set_block_size(block_size)
    plain.set_block_size(block_size)
    for op in ops:
        if len(op) == 4 and isinstance(op[0], list):
            chunks, decodes, ctx_per_seq, sample_chunk = op
            num_tokens = max(1, sum(c for c, _ in chunks) + decodes)
            step = (num_tokens, chunks, decodes, decodes * ctx_per_seq, decodes + (sample_chunk and bool(chunks)))
            assert fast.step_time_s(*step) == plain.step_time_s(*step)
            assert fast.step_breakdown_ms(*step) == plain.step_breakdown_ms(*step)
        else:
            num_seqs, ctx_per_seq, steps, drift = op
            sums = num_seqs * ctx_per_seq + num_seqs * np.arange(steps) + (np.arange(steps) * drift) % 7
            got, want = fast.decode_span_times_s(num_seqs, sums), plain.decode_span_times_s(num_seqs, sums)
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
            last = (num_seqs, [], num_seqs, int(sums[-1]), num_seqs)  # its last step, priced again for steps.csv
            assert fast.step_breakdown_ms(*last) == plain.step_breakdown_ms(*last)
    assert fast.extrapolated.steps == plain.extrapolated.steps
    assert list(fast.extrapolated.tables.items()) == list(plain.extrapolated.tables.items())


@settings(deadline=None, max_examples=60)
@given(st.sampled_from(["v2-tp4", "v2-tp1", "v1-measured"]), st.sampled_from([2, 3, 4]),
       st.lists(_step, min_size=1, max_size=8))
def test_pipeline_rounds_over_the_fast_pricing_equal_the_plain_one(kind, pp, steps):
    """kvsim.simcore.pipeline prices each micro-batch through the wrapped model (fractional context
    sums, a few chunks dealt round-robin): the same rounds, breakdowns and exit times."""
    from kvsim.simcore.pipeline import PipelineLatency

    gpu, hidden = get_gpu("H100-SXM-80GB"), 4096
    pp = min(pp, DOCS[kind]["model_shape"]["num_layers"])  # the measured CPU profile's model has 2 layers
    fast = PipelineLatency(StepLatencyModel(DOCS[kind]), gpu, 1, pp, hidden)
    plain = PipelineLatency(_PlainModel(DOCS[kind]), gpu, 1, pp, hidden)
    for chunks, decodes, ctx_per_seq, sample_chunk in steps:
        num_tokens = max(1, sum(c for c, _ in chunks) + decodes)
        step = (num_tokens, chunks, decodes, decodes * ctx_per_seq + decodes // 3,
                decodes + (sample_chunk and bool(chunks)))
        assert fast.step_time_s(*step) == plain.step_time_s(*step)
        assert fast.step_breakdown_ms(*step) == plain.step_breakdown_ms(*step)
        assert fast.emit_times_s(1.5, len(chunks) + decodes) == plain.emit_times_s(1.5, len(chunks) + decodes)
    assert (fast.extrapolated.steps, fast.extrapolated.tables) == (plain.extrapolated.steps,
                                                                   plain.extrapolated.tables)


@given(st.lists(st.floats(0.0, 1e7), max_size=40), st.floats(0.5, 5000.0))
def test_short_rows_on_python_floats_equal_numpy_rows_bit_for_bit(bs, a):
    """Table2D.row interpolates up to SHORT_ROW values on Python floats, more with numpy: the
    same bits either way, on every grid shape (one batch size, one context point, one point)."""
    import numpy as np

    import kvsim.simcore.latency as latency

    bs = np.array(bs, dtype=np.float64)
    a = float(round(a)) if a > 1 else a
    for t in _tables():
        python_row = np.array([math.exp(x) for x in t._exponents(a, [math.log1p(b) for b in bs.tolist()])])
        saved, latency.SHORT_ROW = latency.SHORT_ROW, -1
        try:
            numpy_row = t.row(a, bs)
        finally:
            latency.SHORT_ROW = saved
        assert python_row.tobytes() == numpy_row.tobytes() == _plain_row(t, a, bs).tobytes()
        if len(bs) <= latency.SHORT_ROW:
            assert t.row(a, bs).tobytes() == python_row.tobytes()


def test_rows_through_grid_points_take_the_segment_above_as_the_scalar_pricing_does():
    """A context exactly on a grid point belongs to the segment that starts there (bisect_right,
    as Table2D.__call__ and csrc/pricing.c price single steps): a decode span's row must break the
    tie the same way, on Python floats (short rows) and with numpy (long ones), as the plain
    formula (side="right") does, bit for bit. Hypothesis' random contexts never land on a grid point."""
    import numpy as np

    import kvsim.simcore.latency as latency

    dec = DOC["decode_attention"]["16"]
    pre = DOC["prefill_attention"]
    grids = [(dec["batch_size"], dec["context_tokens"], dec["time_ms"]),
             (pre["chunk_tokens"], pre["context_tokens"], pre["time_ms"])]
    for a_grid, b_grid, z in grids:
        t = Table2D(a_grid, b_grid, z)
        for a in [*a_grid, *(x + 1.0 for x in a_grid)]:
            for g in b_grid[1:-1]:  # inner points: where one segment ends and the next begins
                short = np.array([g - 1.0, g, g + 1.0])  # a span's contexts, climbing through g
                assert t.row(a, short).tobytes() == _plain_row(t, a, short).tobytes(), (a, g)
            long = np.array([b + d for b in b_grid[1:-1] for d in (-1.0, 0.0, 1.0)])
            assert len(long) > latency.SHORT_ROW
            assert t.row(a, long).tobytes() == _plain_row(t, a, long).tobytes(), a
            assert np.allclose(t.row(a, long), [t(a, b) for b in long], rtol=1e-12, atol=0), a


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize(("gpu", "model", "tp"), [("H100", "llama3-8b", 1), ("A100-80GB", "llama2-70b", 4)])
def test_every_decode_span_step_is_priced_as_its_single_step(gpu, model, tp, hidden):
    """decode_span_times_s (short and long spans, numpy rows) gives each step step_time_s's bits:
    a span cut by an arrival is priced from it in Python, step by step in the C core. With numpy's
    SIMD exp / log1p the row differed from math's in the last bit for a few per cent of contexts."""
    import numpy as np

    from kvsim.profiles import default_profile
    from kvsim.simcore.span import context_sums

    data = copy.deepcopy(default_profile(get_gpu(gpu), get_model(model), tp).data)
    if hidden:  # ASYNC: CPU work hidden behind the GPU, its excess added to the host time
        data["host_overhead"].update(hidden_per_step_ms=3.0, hidden_per_seq_ms=0.02)
        data.pop("host_overhead_by_engine", None)
        data.pop("host_overhead_by_policy", None)
    lat = StepLatencyModel(data)
    assert (lat.hidden is not None) == hidden
    rng = np.random.default_rng(2)
    for _ in range(150):
        n = int(rng.integers(1, 257))
        steps = int(rng.choice([int(rng.integers(1, 17)), int(rng.integers(17, 80))]))
        sums = context_sums(int(rng.integers(n, n * 8000)), n, steps)
        span = lat.decode_span_times_s(n, sums, count=False).tolist()
        assert span == [lat.step_time_s(n, [], n, int(s), n) for s in sums.tolist()], (n, int(sums[0]), steps)
