"""Bounded-memory records (simcore.records): exact below the caps, bounded and close beyond."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.simcore.records import HIST_RELATIVE_WIDTH, Samples


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


@pytest.mark.parametrize("seed", range(3))
def test_binned_summary_does_not_depend_on_how_values_were_batched(seed):
    """A decode span hands its ITLs over as one array, --exact-steps one step at a time: past
    the cap the mean (summed block by block at fixed positions), percentiles and counts must
    be the same bit for bit whichever way the same sequence arrived."""
    rng = np.random.default_rng(seed)
    values = rng.lognormal(-4.0, 1.0, 150_000)
    one_go, pieces = Samples(cap=1000), Samples(cap=1000)
    one_go.extend(values)
    i = 0
    while i < len(values):
        if rng.random() < 0.3:
            pieces.append(float(values[i]))
            i += 1
        else:
            k = int(rng.integers(1, 5000))
            pieces.extend(values[i: i + k])
            i += k
        pieces.settle()
    a, b = {}, {}
    one_go.stats("itl", a)
    pieces.stats("itl", b)
    assert a == b
    assert len(one_go) == len(pieces) == len(values)
    assert a["mean_itl_ms"] == pytest.approx(values.mean() * 1000.0, rel=1e-12)


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


# -- request records: the same run with tiny caps ---------------------------------------------
def _overloaded_run(**config):
    """~600 requests of the tiny model, arriving faster than it serves them, with rejections."""
    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import GPUS, MODELS
    from kvsim.simcore.simulate import simulate
    from kvsim.simcore.specs import EngineConfig
    from tests.helpers import ListWorkload, req

    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(0.002, size=600))
    prompts = rng.integers(1, 60, size=600)
    prompts[::50] = 200  # over max_model_len 128: rejected
    requests = [req(i, float(at), int(p), int(rng.integers(1, 40)))
                for i, (at, p) in enumerate(zip(arrivals, prompts, strict=True))]
    cfg = EngineConfig(max_model_len=128, max_num_seqs=8, block_size=4, **config)
    return simulate(MODELS["tiny"], GPUS["H100-SXM-80GB"], cfg, ListWorkload(requests),
                    default_profile(GPUS["H100-SXM-80GB"], MODELS["tiny"], 1), seed=3)


@pytest.mark.parametrize("dp", [1, 2])
def test_tiny_caps_give_a_bounded_summary_close_to_the_exact_one(monkeypatch, dp):
    import kvsim.simcore.records as records

    exact = _overloaded_run(data_parallel_size=dp)
    assert exact.records.kept and exact.itl.exact
    assert exact.record["resolution"] == {"itl": "exact", "requests": "exact", "steps": "every step"}
    monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 100)
    monkeypatch.setattr(records, "ITL_EXACT_CAP", 500)
    monkeypatch.setattr(records, "_ROW_CHUNK", 32)
    spilled = []
    import kvsim.simcore.simulate as simulate_mod

    real = simulate_mod.RequestRecords

    def spying(*args, **kw):
        store = real(*args, **kw)
        store.spill = spilled.append
        return store

    monkeypatch.setattr(simulate_mod, "RequestRecords", spying)
    bounded = _overloaded_run(data_parallel_size=dp)
    assert not bounded.records.kept and not bounded.itl.exact
    assert "histogram" in bounded.record["resolution"]["requests"]
    assert "histogram" in bounded.record["resolution"]["itl"]
    a, b = exact.summary, bounded.summary
    assert a["rejected"] == 12 and a["saturation"] == ("overloaded" if dp == 1 else "sustained")
    for key in ("num_requests", "completed", "rejected", "total_input_tokens", "total_output_tokens",
                "num_preemptions", "num_steps", "max_running", "saturation", "duration_s"):
        assert a[key] == b[key], key
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert b[f"mean_{metric}_ms"] == pytest.approx(a[f"mean_{metric}_ms"], rel=1e-9)
        for stat in ("median", "p95", "p99"):
            key = f"{stat}_{metric}_ms"
            assert b[key] == pytest.approx(a[key], rel=HIST_RELATIVE_WIDTH), key
    for key in ("offered_rate", "completed_rate_warm"):
        assert b[key] == pytest.approx(a[key], rel=0.15), key
    if dp == 1:
        assert b["queue_wait_slope"] > 0.05
    # every row went to the spill, once, with the table's columns and values
    import pandas as pd

    streamed = pd.concat([pd.DataFrame(c) for c in spilled]).sort_values("request_id", ignore_index=True)
    pd.testing.assert_frame_equal(streamed, exact.requests)


def test_request_rows_are_few_dozen_bytes():
    from kvsim.simcore.records import _RAW

    assert sum(np.dtype(dtype).itemsize for dtype in _RAW.values()) <= 72


# -- step table: coalesced beyond its cap, totals exact ---------------------------------------
def test_a_coalesced_step_table_keeps_the_totals_and_the_regime(monkeypatch):
    import kvsim.simcore.metrics as metrics
    from kvsim.reports.regime import classify_regime, regime_of
    from kvsim.simcore.metrics import StepTotals

    full = _overloaded_run()
    monkeypatch.setattr(metrics, "STEP_ROWS_CAP", 40)
    monkeypatch.setattr(metrics, "_STEP_CHUNK", 16)
    small = _overloaded_run()
    assert len(full.steps) > 200 and len(small.steps) <= 40
    assert small.record["resolution"]["steps"].startswith("at most 40 rows")
    assert full.record["resolution"]["steps"] == "every step"
    assert small.summary == full.summary | {"extrapolated_steps": small.summary["extrapolated_steps"]}
    a, b = StepTotals.from_frame(full.steps), StepTotals.from_frame(small.steps)
    assert b.num_steps == a.num_steps and b.seq_steps == pytest.approx(a.seq_steps, rel=1e-9)
    assert b.duration_s == pytest.approx(a.duration_s, rel=1e-12)
    for kind, value in a.kv_slot_s.items():
        assert b.kv_slot_s[kind] == pytest.approx(value, rel=1e-9), kind
    # time-weighted running requests (the seed table's mean running) from the recorder's sums
    assert small.totals.running_s == pytest.approx(a.running_s, rel=1e-12)
    assert full.totals.running_s == pytest.approx(a.running_s, rel=1e-12)
    for col in ("kernels_ms", "collectives_ms", "host_ms", "num_preempted"):
        weights = small.steps["num_steps"] if col == "num_preempted" else 1
        assert (small.steps[col] * weights).sum() == pytest.approx(full.steps[col].sum(), rel=1e-9), col
    # the regime from the recorder's sums is the step table's
    exact = regime_of(full)
    summed = regime_of(small)
    assert (summed.label, summed.num_preempted) == (exact.label, exact.num_preempted)
    assert summed.peak_kv_use == exact.peak_kv_use
    assert summed.kv_blocked_share == pytest.approx(exact.kv_blocked_share, rel=1e-9)
    blocked_run = classify_regime(full.steps, full.memory.num_gpu_tokens, True, full.memory.block_size)
    assert blocked_run == exact


# -- the recorder's totals: summed per chunk, the same floats as summing per step ------------------
def _reference_totals(calls, kv_capacity, kv_unit):
    """The step totals as a `+=` per recorded step or span gives them (the recorder's contract)."""
    from kvsim.simcore.metrics import StepTotals

    t = StepTotals()
    kv = t.kv_slot_s
    for kind, args in calls:
        if kind == "step":
            _, dt, plan, mem, running, waiting, swapped = args
            unshared = mem.unshared or mem.allocated
            t.max_running = max(t.max_running, running)
            t.kv_allocated_max = max(t.kv_allocated_max, mem.allocated)
            t.num_preempted += plan.num_preempted
            if (waiting or swapped) and (plan.num_preempted or kv_capacity - mem.allocated - mem.external < kv_unit):
                t.kv_blocked_s += dt
            t.num_steps += 1
            t.duration_s += dt
            t.seq_steps += plan.num_scheduled
            t.running_s += running * dt
            for name in ("allocated", "live", "reserved_future", "internal", "stale", "external"):
                kv[name] += getattr(mem, name) * dt
            kv["unshared"] += unshared * dt
        else:
            _, durations, plan, allocated, internal, running, waiting, swapped, _ = args
            duration = float(durations.sum())
            t.max_running = max(t.max_running, running)
            t.kv_allocated_max = max(t.kv_allocated_max, int(allocated[-1]))
            if waiting or swapped:
                t.kv_blocked_s += float(durations[allocated > kv_capacity - kv_unit].sum())
            t.num_steps += len(durations)
            t.duration_s += duration
            t.seq_steps += plan.num_scheduled * len(durations)
            t.running_s += running * duration
            alloc_s, internal_s = float(np.dot(allocated, durations)), float(np.dot(internal, durations))
            kv["allocated"] += alloc_s
            kv["live"] += alloc_s - internal_s
            kv["internal"] += internal_s
            kv["unshared"] += alloc_s
    return t


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recorder_totals_are_the_per_step_sums_bit_for_bit(monkeypatch, seed):
    import dataclasses

    import kvsim.simcore.metrics as metrics
    from kvsim.simcore.step import MemorySnapshot, StepPlan

    monkeypatch.setattr(metrics, "_STEP_CHUNK", 7)  # many chunks, spans on both sides of a seal
    rng = np.random.default_rng(seed)
    capacity, unit = 4000, 16
    rec = metrics.StepRecorder(cap=10)  # coalesced beyond 10 rows: the totals stay exact
    rec.kv_capacity, rec.kv_unit = capacity, unit
    calls, start = [], 0.0
    for i in range(300):
        running, waiting, swapped = (int(x) for x in rng.integers(0, 4, 3) * rng.integers(0, 2, 3))
        if rng.random() < 0.6:
            plan = StepPlan(num_scheduled=int(rng.integers(1, 9)), num_tokens=int(rng.integers(8, 500)),
                            num_decode_seqs=int(rng.integers(0, 8)), num_preempted=int(rng.integers(0, 3) // 2))
            alloc = int(rng.integers(capacity - 64, capacity + 1)) if rng.random() < 0.5 else int(rng.integers(0, capacity))
            mem = MemorySnapshot(allocated=alloc, live=alloc // 2, reserved_future=int(rng.integers(0, 50)),
                                 internal=int(rng.integers(0, 50)), stale=int(rng.integers(0, 5)),
                                 external=int(rng.integers(0, 20)), unshared=int(rng.integers(0, 2)) * (alloc + 7))
            dt = float(rng.exponential(0.02))
            args = (start, dt, plan, mem, running, waiting, swapped)
            rec.record(*args)
            calls.append(("step", args))
            start += dt
        else:
            n = int(rng.integers(1, 12))
            durations = rng.exponential(0.02, n)
            allocated = (int(rng.integers(capacity // 2, capacity)) + np.cumsum(rng.integers(0, 3, n)) * unit).astype(np.int64)
            internal = rng.integers(0, 40, n).astype(np.int64)
            plan = StepPlan(num_scheduled=int(rng.integers(1, 9)))
            plan = dataclasses.replace(plan, num_decode_seqs=plan.num_scheduled)
            args = (start, durations, plan, allocated, internal, running, waiting, swapped, (1.0, 0.5, 0.25))
            rec.record_span(*args)
            calls.append(("span", args))
            start += float(durations.sum())
        if i % 37 == 0:  # read mid-chunk: later rows still add on exactly
            assert rec.totals == _reference_totals(calls, capacity, unit)
    rec.finalize()
    expected = _reference_totals(calls, capacity, unit)
    assert expected.kv_blocked_s > 0 and expected.num_preempted > 0
    assert rec.totals == expected  # dataclass equality: every float bit for bit
    assert rec.coalesced and len(rec.frame()) <= 10


def test_kept_step_columns_hold_no_more_memory_than_their_rows(monkeypatch):
    """A kept (coalesced) column may be a view, but never of a block holding the other columns:
    the kept table's memory is its rows', whatever the chunking."""
    import kvsim.simcore.metrics as metrics
    from kvsim.simcore.step import MemorySnapshot, StepPlan

    monkeypatch.setattr(metrics, "_STEP_CHUNK", 64)
    rec = metrics.StepRecorder(cap=256)
    plan, mem = StepPlan(num_scheduled=4, num_tokens=4, num_decode_seqs=4), MemorySnapshot(allocated=64, live=60)
    for i in range(64 * 40):
        rec.record(0.01 * i, 0.01, plan, mem, 4, 0, 0)
    assert rec.coalesced and len(rec._kept) > 1
    owners = {}
    for chunk in rec._kept:
        for col in chunk.values():
            owner = col if col.base is None else col.base
            owners[id(owner)] = owner.nbytes
    kept_bytes = sum(col.nbytes for chunk in rec._kept for col in chunk.values())
    assert sum(owners.values()) <= 2 * kept_bytes


def test_recorded_rows_are_the_step_table_row_for_row(monkeypatch):
    import kvsim.simcore.metrics as metrics
    from kvsim.simcore.step import MemorySnapshot, StepPlan

    monkeypatch.setattr(metrics, "_STEP_CHUNK", 4)
    rec = metrics.StepRecorder()
    for i in range(10):
        plan = StepPlan(num_scheduled=i + 1, num_tokens=10 * i + 3, num_decode_seqs=i, num_preempted=i % 2,
                        num_swap_blocks=i % 3)
        mem = MemorySnapshot(allocated=100 + i, live=50 + i, reserved_future=i, internal=2 * i, stale=3, external=1)
        rec.record(0.5 * i, 0.25 + i, plan, mem, 7 + i, i % 4, i % 5)
    rec.record_span(5.0, np.array([0.5, 0.25]), StepPlan(num_scheduled=3, num_decode_seqs=3),
                    np.array([160, 176]), np.array([4, 6]), 3, 0, 0, (1.0, 2.0, 3.0))
    # numpy and float values in a row are written as the doubles they are
    rec.record(6.0, np.float64(0.5), StepPlan(num_scheduled=np.int64(2)), MemorySnapshot(allocated=8.0, live=np.int32(4)),
               1, 0, 0)
    steps = rec.frame()
    assert steps.iloc[11][["duration_s", "num_seqs", "kv_allocated", "kv_live"]].tolist() == [0.5, 2, 8, 4]
    steps = steps.iloc[:11]
    assert len(steps) == 11 and list(steps.columns) == [*metrics.STEP_COLUMNS, *metrics.COST_COLUMNS]
    row = steps.iloc[9].to_dict()
    assert all(np.isnan(row.pop(name)) for name in metrics.COST_COLUMNS)  # no latency model: costs unknown
    assert row == {
        "start_s": 4.5, "duration_s": 9.25, "num_steps": 1, "num_seqs": 10, "num_prefill_tokens": 84,
        "num_decode_tokens": 9, "num_running": 16, "num_waiting": 1, "num_swapped": 4, "num_preempted": 1,
        "num_swap_blocks": 0, "kv_allocated": 109, "kv_live": 59, "kv_reserved_future": 9, "kv_internal": 18,
        "kv_stale": 3, "kv_external": 1, "kv_unshared": 109}
    assert steps.iloc[10].to_dict() == {
        "start_s": 5.0, "duration_s": 0.75, "num_steps": 2, "num_seqs": 3, "num_prefill_tokens": 0,
        "num_decode_tokens": 3, "num_running": 3, "num_waiting": 0, "num_swapped": 0, "num_preempted": 0,
        "num_swap_blocks": 0, "kv_allocated": 176, "kv_live": 170, "kv_reserved_future": 0, "kv_internal": 6,
        "kv_stale": 0, "kv_external": 0, "kv_unshared": 176, "kernels_ms": 1.0, "collectives_ms": 2.0, "host_ms": 3.0}
    assert steps["num_steps"].dtype == np.int64 and steps["kv_live"].dtype == np.int64


def test_request_rows_come_back_with_their_values_and_dtypes(monkeypatch):
    from types import SimpleNamespace

    import kvsim.simcore.records as records

    monkeypatch.setattr(records, "_ROW_CHUNK", 3)
    store = records.RequestRecords()
    for i in (4, 0, 3, 1, 2):  # leave out of id order: the columns come back by id
        req = SimpleNamespace(arrival_s=0.125 * i, max_tokens=100 + i, n=1 + i % 2, beam_width=1)
        st = SimpleNamespace(request=req, reject_reason="too long" if i == 3 else "", request_id=i,
                             first_scheduled_s=1.0 + i, first_token_s=2.0 + i, finish_s=3.5 + i,
                             num_prompt_tokens=2**31 - 1 - i, num_generated=10 * i, num_preemptions=i % 3)
        store.leave(st, replica=i % 2)
    cols = store.columns()
    for name, dtype in records._RAW.items():
        assert cols[name].dtype == dtype, name
    assert cols["request_id"].tolist() == [0, 1, 2, 3, 4]
    assert cols["num_prompt_tokens"].tolist() == [2**31 - 1 - i for i in range(5)]
    assert cols["status"].tolist() == [0, 0, 0, 1, 0] and cols["reason"].tolist() == [-1, -1, -1, 0, -1]
    assert cols["finish_s"].tolist() == [3.5 + i for i in range(5)] and cols["replica"].tolist() == [0, 1, 0, 1, 0]
    assert cols["num_positions"].tolist() == [0, 10, 20, 30, 40] and cols["n"].tolist() == [1, 2, 1, 2, 1]
    assert store.reason_names() == ["too long"] and store.reason_counts == [1]


# -- kvsim run --out: rows past the caps streamed into the staging folder -----------------------
RUN = ["run", "--model", "tiny", "--num-requests", "400", "--rate", "400", "--input-len", "32",
       "--output-len", "16", "--max-model-len", "128", "--seed", "5"]


def _invoke(*args):
    from typer.testing import CliRunner

    from kvsim.cli.main import app

    return CliRunner().invoke(app, list(args))


def _tiny_caps(monkeypatch):
    import kvsim.simcore.metrics as metrics
    import kvsim.simcore.records as records

    monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 50)
    monkeypatch.setattr(records, "_ROW_CHUNK", 20)
    monkeypatch.setattr(metrics, "STEP_ROWS_CAP", 30)
    monkeypatch.setattr(metrics, "_STEP_CHUNK", 10)


def test_rows_past_the_caps_are_streamed_to_out_in_full(tmp_path, monkeypatch):
    import pandas as pd

    whole = tmp_path / "whole"
    assert _invoke(*RUN, "--out", str(whole)).exit_code == 0
    _tiny_caps(monkeypatch)
    streamed = tmp_path / "streamed"
    result = _invoke(*RUN, "--out", str(streamed), "--json")
    assert result.exit_code == 0, result.output
    a_req, b_req = pd.read_csv(whole / "requests.csv"), pd.read_csv(streamed / "requests.csv")
    assert len(b_req) == 400
    pd.testing.assert_frame_equal(b_req.sort_values("request_id", ignore_index=True), a_req)
    pd.testing.assert_frame_equal(pd.read_csv(streamed / "steps.csv"), pd.read_csv(whole / "steps.csv"))
    import json

    resolution = json.loads(result.stdout)["record"]["resolution"]
    assert resolution["requests"].startswith("running sums") and resolution["steps"].startswith("at most 30")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streamed", "whole"]  # no staging left


def test_a_run_that_fails_midway_leaves_the_old_folder_untouched(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert _invoke(*RUN, "--out", str(out)).exit_code == 0
    (out / "notes.txt").write_text("mine\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _tiny_caps(monkeypatch)
    import kvsim.simcore.records as records

    seal = records.RequestRecords._seal
    calls = []

    def failing_seal(self):  # the run dies after rows were streamed into the staging folder
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("simulated crash")
        seal(self)

    monkeypatch.setattr(records.RequestRecords, "_seal", failing_seal)
    result = _invoke(*RUN, "--seed", "6", "--out", str(out))
    assert result.exit_code != 0 and isinstance(result.exception, RuntimeError)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_goodput_past_the_request_cap_is_refused_before_the_work(monkeypatch):
    import kvsim.simcore.records as records

    monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 100)
    result = _invoke(*RUN, "--goodput", "ttft:500")
    assert result.exit_code == 2 and "--goodput needs every request row" in result.stderr
    assert "Simulating" not in result.stdout
