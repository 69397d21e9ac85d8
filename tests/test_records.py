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


# -- request records: the same run with tiny caps ---------------------------------------------
def _overloaded_run(**config):
    """~600 requests of the tiny model, arriving faster than it serves them, with rejections."""
    from profiles import default_profile
    from simcore.catalog import GPUS, MODELS
    from simcore.simulate import simulate
    from simcore.specs import EngineConfig
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
    import simcore.records as records

    exact = _overloaded_run(data_parallel_size=dp)
    assert exact.records.kept and exact.itl.exact
    assert exact.record["resolution"] == {"itl": "exact", "requests": "exact", "steps": "every step"}
    monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 100)
    monkeypatch.setattr(records, "ITL_EXACT_CAP", 500)
    monkeypatch.setattr(records, "_ROW_CHUNK", 32)
    spilled = []
    import simcore.simulate as simulate_mod

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
    from simcore.records import _RAW

    assert sum(np.dtype(dtype).itemsize for _, dtype in _RAW.values()) <= 72


# -- step table: coalesced beyond its cap, totals exact ---------------------------------------
def test_a_coalesced_step_table_keeps_the_totals_and_the_regime(monkeypatch):
    import simcore.metrics as metrics
    from reports.regime import classify_regime, regime_of
    from simcore.metrics import StepTotals

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


# -- kvsim run --out: rows past the caps streamed into the staging folder -----------------------
RUN = ["run", "--model", "tiny", "--num-requests", "400", "--rate", "400", "--input-len", "32",
       "--output-len", "16", "--max-model-len", "128", "--seed", "5"]


def _invoke(*args):
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, list(args))


def _tiny_caps(monkeypatch):
    import simcore.metrics as metrics
    import simcore.records as records

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
    import simcore.records as records

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
    import simcore.records as records

    monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 100)
    result = _invoke(*RUN, "--goodput", "ttft:500")
    assert result.exit_code == 2 and "--goodput needs every request row" in result.stderr
    assert "Simulating" not in result.stdout
