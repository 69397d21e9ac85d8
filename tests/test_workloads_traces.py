"""Trace replay (Azure 2023, kvsim CSV / JSONL), its options, and every bad input the issue lists."""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import simpy
from typer.testing import CliRunner

from kvsim.simcore.errors import WorkloadError
from kvsim.workloads import load_workload
from kvsim.workloads.catalog import DATA_DIR
from kvsim.workloads.traces import TraceOptions, read_trace, select
from tests.test_workloads import FakeSink

AZURE = {name: DATA_DIR / f"AzureLLMInferenceTrace_{name}.csv" for name in ("code", "conv")}


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the shipped Azure traces ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["code", "conv"])
def test_azure_trace_replays_every_row_in_order(kind):
    rows = _csv_rows(AZURE[kind])
    env = simpy.Environment()
    sink = FakeSink(env, lambda r: 0.0)
    spec = load_workload(f"azure-{kind}")
    env.process(spec.process(env, sink, np.random.SeedSequence(0)))
    env.run()
    assert spec.num_requests == len(rows) == len(sink.submitted)
    assert [r.request_id for r in sink.submitted] == list(range(len(rows)))
    assert [r.num_prompt_tokens for r in sink.submitted] == [int(row["ContextTokens"]) for row in rows]
    assert [r.num_output_tokens for r in sink.submitted] == [int(row["GeneratedTokens"]) for row in rows]
    stamps = [datetime.fromisoformat(row["TIMESTAMP"][:26]) for row in rows]  # microseconds suffice
    expected = np.array([(s - stamps[0]).total_seconds() for s in stamps])
    replayed = np.array([r.arrival_s for r in sink.submitted])
    assert np.all(np.diff(replayed) >= 0)
    np.testing.assert_allclose(replayed, expected, atol=2e-6)
    assert spec.describe()["notes"] == []


def test_num_requests_takes_the_head_and_says_how_many_were_skipped():
    spec = load_workload("azure-conv", {"num_requests": 2000})
    requests, generation = spec.draw(0)
    rows = _csv_rows(AZURE["conv"])[:2000]
    assert [r.num_prompt_tokens for r in requests] == [int(row["ContextTokens"]) for row in rows]
    assert spec.notes() == ["skipped 17366 of 19366 trace rows: num_requests=2000 replays the first 2000"]
    assert spec.describe(generation)["generation"]["trace"]["rows_not_sampled"] == 17366
    assert spec.describe()["generation"] == {}  # the workload alone: nothing generated


def test_window_random_sample_and_rescale(tmp_path):
    path = _write(tmp_path, "w.yaml", f"""
name: windowed
arrival: {{process: trace}}
num_requests: 300
trace: {{path: {AZURE['conv']}, window_s: [600, 1800], sample: random, rescale_rate: 12.5}}
""")
    spec = load_workload(str(path))
    trace = read_trace(AZURE["conv"])
    inside = int(((trace.arrival_s >= 600) & (trace.arrival_s < 1800)).sum())
    requests, generation = spec.draw(4)
    times = np.array([r.arrival_s for r in requests])
    assert len(requests) == 300 and times[0] == 0.0 and np.all(np.diff(times) >= 0)
    assert (len(times) - 1) / times[-1] == pytest.approx(12.5, rel=1e-9)
    stats = spec.describe(generation)["generation"]["trace"]
    assert stats["rows_outside_window"] == len(trace) - inside
    assert stats["rows_not_sampled"] == inside - 300
    assert any("outside window_s" in note for note in spec.notes())
    assert requests == spec.sample_requests(4) and requests != spec.sample_requests(5)


@pytest.mark.parametrize("target", [0.5, 3.0, 40.0])
def test_rescaling_hits_the_target_rate(target):
    trace = read_trace(AZURE["code"])
    chosen = select(trace, TraceOptions(rescale_rate=target), 1000, np.random.default_rng(0))
    assert (1000 - 1) / chosen.arrival_s[-1] == pytest.approx(target, rel=1e-9)
    gaps = np.diff(chosen.arrival_s)
    original = np.diff(trace.arrival_s[:1000])
    np.testing.assert_allclose(gaps / gaps.sum(), original / original.sum(), rtol=1e-9, atol=1e-15)


def test_asking_for_more_rows_than_the_trace_has():
    with pytest.raises(WorkloadError, match="asked for 9000 requests but only 8819"):
        load_workload("azure-code", {"num_requests": 9000})


def test_trace_lengths_under_other_arrivals_and_clipping():
    spec = load_workload("azure-code", {"concurrency": 8, "num_requests": 500}, max_model_len=2048)
    requests, generation = spec.draw(0)
    fits = [r for r in requests if r.num_prompt_tokens <= 2048]
    assert all(r.num_prompt_tokens + r.num_output_tokens <= 2048 for r in fits)
    # a trace prompt longer than the context is kept whole, for the engine to reject (as vLLM does)
    clipped = spec.describe(generation)["generation"]["clipped"]
    assert clipped["prompt"] == 0
    assert clipped["prompt_over_max_model_len"] == len(requests) - len(fits) > 0
    assert load_workload("azure-conv", {"rate": 5.0}).describe()["arrival"]["process"] == "poisson"


# --- the kvsim formats ----------------------------------------------------------------------------


def test_kvsim_csv_and_jsonl_formats(tmp_path):
    csv_path = _write(tmp_path, "t.csv", (
        "arrival_s,num_prompt_tokens,num_output_tokens,max_tokens,n,prefix_id,num_prefix_tokens\n"
        "0.0,100,20,64,1,0,50\n0.5,200,30,64,2,,\n0.5,300,80,64,1,0,50\n"
    ))  # fmt: skip
    jsonl_path = _write(tmp_path, "t.jsonl", "\n".join(json.dumps(row) for row in [
        {"arrival_s": 0.0, "num_prompt_tokens": 100, "num_output_tokens": 20, "max_tokens": 64, "n": 1,
         "prefix_id": 0, "num_prefix_tokens": 50},
        {"arrival_s": 0.5, "num_prompt_tokens": 200, "num_output_tokens": 30, "max_tokens": 64, "n": 2},
        {"arrival_s": 0.5, "num_prompt_tokens": 300, "num_output_tokens": 80, "max_tokens": 64, "n": 1,
         "prefix_id": 0, "num_prefix_tokens": 50},
    ]) + "\n")  # fmt: skip
    for path in (csv_path, jsonl_path):
        spec = load_workload(str(path))
        requests, generation = spec.draw(0)
        assert [(r.arrival_s, r.num_prompt_tokens, r.num_output_tokens, r.max_tokens, r.n) for r in requests] == [
            (0.0, 100, 20, 64, 1), (0.5, 200, 30, 64, 2), (0.5, 300, 64, 64, 1),
        ]  # fmt: skip
        assert [(r.prefix_id, r.num_prefix_tokens) for r in requests] == [(0, 50), (None, 0), (0, 50)]
        assert spec.describe(generation)["generation"]["clipped"]["output_capped_by_max_tokens"] == 1


# --- bad inputs -----------------------------------------------------------------------------------

BAD_TRACES = [
    ("missing.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,10\n", r"missing column 'GeneratedTokens'"),
    ("nonnum.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,5\n"
     "2023-11-16 18:15:47.6,ten,5\n", r"line 3: ContextTokens is 'ten'"),
    ("negative.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,-5\n",
     r"line 2: GeneratedTokens is '-5', expected an integer >= 1"),
    ("unsorted.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,5\n"
     "2023-11-16 18:15:48.0,10,5\n2023-11-16 18:15:47.0,10,5\n", r"line 4: TIMESTAMP .* is earlier than"),
    ("badtime.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,5\nyesterday,10,5\n",
     r"line 3: cannot parse TIMESTAMP 'yesterday'"),
    ("empty.csv", "", r"is empty"),
    ("header.csv", "arrival_s,num_prompt_tokens,num_output_tokens\n", r"has a header but no rows"),
    ("kvsim.csv", "arrival_s,num_prompt_tokens\n0,5\n", r"missing column 'num_output_tokens'"),
    ("kvsim_unsorted.csv", "arrival_s,num_prompt_tokens,num_output_tokens\n1.0,5,5\n0.5,5,5\n",
     r"line 3: arrival_s '0.5' is earlier"),
    ("frac.csv", "arrival_s,num_prompt_tokens,num_output_tokens\n0,5.5,5\n", r"line 2: num_prompt_tokens is '5.5'"),
    ("bad.jsonl", '{"arrival_s": 0, "num_prompt_tokens": 5, "num_output_tokens": 5}\n{oops\n', r"line 2: invalid JSON"),
    ("gap.jsonl", '{"arrival_s": 0, "num_prompt_tokens": 5, "num_output_tokens": 5}\n\n'
     '{"arrival_s": 1, "num_prompt_tokens": 5}\n', r"line 3: num_output_tokens is ''"),
]  # fmt: skip


@pytest.mark.parametrize("name, text, match", BAD_TRACES, ids=[b[0] for b in BAD_TRACES])
def test_bad_trace_is_one_line_naming_file_and_row(tmp_path, name, text, match):
    path = _write(tmp_path, name, text)
    with pytest.raises(WorkloadError, match=match) as info:
        load_workload(str(path))
    assert name in str(info.value) and "\n" not in str(info.value)


BAD_YAML = [
    ("unknown.yaml", "name: x\nnum_requests: 5\nratee: 3\narrival: {process: poisson, rate: 1}\n"
     "prompt_len: 10\noutput_len: 10\n", r"unknown field 'ratee'"),
    ("nested.yaml", "num_requests: 5\narrival: {process: poisson, rat: 1}\nprompt_len: 10\noutput_len: 10\n",
     r"unknown field 'arrival.rat'"),
    ("dist.yaml", "num_requests: 5\narrival: {process: poisson, rate: 1}\n"
     "prompt_len: {dist: lognormal, mean: 10, sigma: 2}\noutput_len: 10\n", r"unknown field 'prompt_len.sigma'"),
    ("process.yaml", "num_requests: 5\narrival: {process: sometimes}\nprompt_len: 10\noutput_len: 10\n",
     r"field 'arrival.process' must be one of"),
    ("type.yaml", "num_requests: many\narrival: {process: poisson, rate: 1}\nprompt_len: 10\noutput_len: 10\n",
     r"field 'num_requests' must be an integer"),
    ("negrate.yaml", "num_requests: 5\narrival: {process: poisson, rate: -1}\nprompt_len: 10\noutput_len: 10\n",
     r"field 'arrival.rate' must be a number > 0"),
    ("missing.yaml", "num_requests: 5\narrival: {process: poisson, rate: 1}\nprompt_len: 10\n",
     r"field 'output_len' is required"),
    ("syntax.yaml", "num_requests: [5\n", r"invalid YAML at line"),
    ("empty.yaml", "", r"is empty"),
    ("trace.yaml", "arrival: {process: trace}\ntrace: {path: nowhere.csv}\n", r"field 'trace.path' names 'nowhere.csv'"),
    ("window.yaml", f"arrival: {{process: trace}}\ntrace: {{path: {AZURE['code']}, window_s: [99999, 100000]}}\n",
     r"holds no requests"),
]  # fmt: skip


@pytest.mark.parametrize("name, text, match", BAD_YAML, ids=[b[0] for b in BAD_YAML])
def test_bad_workload_file_is_one_line_naming_file_and_field(tmp_path, name, text, match):
    path = _write(tmp_path, name, text)
    with pytest.raises(WorkloadError, match=match) as info:
        load_workload(str(path))
    assert name in str(info.value) and "\n" not in str(info.value)


def test_empirical_lengths_from_a_trace(tmp_path):
    path = _write(tmp_path, "emp.yaml", """
num_requests: 20000
arrival: {process: poisson, rate: 3}
prompt_len: {dist: empirical, trace: AzureLLMInferenceTrace_conv.csv, column: prompt}
output_len: {dist: empirical, trace: AzureLLMInferenceTrace_conv.csv, column: output}
""")
    prompts = np.array([r.num_prompt_tokens for r in load_workload(str(path)).sample_requests(0)])
    observed = read_trace(AZURE["conv"]).num_prompt_tokens
    assert set(np.unique(prompts)) <= set(np.unique(observed))
    assert prompts.mean() == pytest.approx(observed.mean(), rel=0.03)


# --- through the CLI --------------------------------------------------------------------------------


def _app():
    try:
        from kvsim.cli.main import app
    except ImportError:  # the root app imports commands other sessions are still writing
        import typer

        from kvsim.cli import workloads_cmd
        from kvsim.cli.errors import OneLineErrorsGroup

        app = typer.Typer(cls=OneLineErrorsGroup, pretty_exceptions_enable=False)
        app.add_typer(workloads_cmd.app, name="workloads")
    return app


@pytest.mark.parametrize("name, text, match", BAD_TRACES[:6] + BAD_YAML[:1], ids=[b[0] for b in BAD_TRACES[:6] + BAD_YAML[:1]])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, name, text, match):
    path = _write(tmp_path, name, text)
    result = CliRunner().invoke(_app(), ["workloads", "show", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("kvsim: error: ") and result.stderr.count("\n") == 1
    assert name in result.stderr


def test_cli_lists_and_shows(tmp_path):
    runner = CliRunner()
    listed = runner.invoke(_app(), ["workloads"])
    assert listed.exit_code == 0
    for name in ("seed-table", "sharegpt", "alpaca", "azure-code", "azure-conv", "long-context", "shared-prefix"):
        assert name in listed.stdout
    shown = runner.invoke(_app(), ["workloads", "show", "azure-conv", "--num-requests", "2000"])
    assert shown.exit_code == 0, shown.stderr
    assert "requests: 2,000" in shown.stdout and "p99" in shown.stdout
    assert "skipped 17366 of 19366 trace rows" in shown.stdout
    png = tmp_path / "seed.png"
    shown = runner.invoke(_app(), ["workloads", "show", "seed-table", "--plot", str(png)])
    assert shown.exit_code == 0, shown.stderr
    assert "closed loop of 64 clients" in shown.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = runner.invoke(_app(), ["workloads", "show", "no-such-workload"])
    assert missing.exit_code == 2 and "unknown workload 'no-such-workload'" in missing.stderr


@pytest.mark.parametrize(
    "text, match",
    [
        ("- just\n- a list\n", "expected a mapping of fields"),
        ("num_requests: 5\narrival: {process: piecewise, schedule: [[0, fast]]}\nprompt_len: 10\noutput_len: 10\n",
         "field 'arrival.schedule' must be a list of"),
        ("num_requests: 5\narrival: {process: poisson, rate: 1}\nprompt_len: 10\noutput_len: 10\n"
         "n: {values: [1, 2], weights: [1]}\n", "choice weights"),
        ("num_requests: 5\narrival: {process: trace}\nprompt_len: 10\noutput_len: 10\n", "needs a trace"),
        ("num_requests: 5\narrival: {process: poisson, rate: 1}\nprompt_len: {dist: lognormal, mean: 5}\n"
         "output_len: 10\n", "exactly one of 'std' or 'cv'"),
    ],
)  # fmt: skip
def test_more_bad_workload_files(tmp_path, text, match):
    path = _write(tmp_path, "more.yaml", text)
    with pytest.raises(WorkloadError, match=match) as info:
        load_workload(str(path))
    assert "more.yaml" in str(info.value) and "\n" not in str(info.value)
