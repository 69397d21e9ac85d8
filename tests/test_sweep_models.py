"""`kvsim sweep --model a,b`: models as a grid dimension (or zipped with TP), per-model answers,
resumable ids, reports grouped by model; every point validated and memory planned once, before
anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.sweep import expand_grid
from kvsim.reports.sweep_table import read_table
from kvsim.simcore.errors import ConfigError

SMALL = ["--num-requests", "16", "--rate", "4", "--jobs", "1"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["sweep", *args])


def test_expand_grid_zips_groups_in_place():
    lists = {"model": ["a", "b"], "tensor_parallel_size": [2, 4], "rate": [1.0, 2.0]}
    assert expand_grid(lists) == [dict(zip(lists, c, strict=True)) for c in
                                  [("a", 2, 1.0), ("a", 2, 2.0), ("a", 4, 1.0), ("a", 4, 2.0),
                                   ("b", 2, 1.0), ("b", 2, 2.0), ("b", 4, 1.0), ("b", 4, 2.0)]]
    zipped = expand_grid(lists, [("model", "tensor_parallel_size")])
    assert [(c["model"], c["tensor_parallel_size"], c["rate"]) for c in zipped] == [
        ("a", 2, 1.0), ("a", 2, 2.0), ("b", 4, 1.0), ("b", 4, 2.0)]
    with pytest.raises(ConfigError, match="same length"):
        expand_grid({"model": ["a", "b"], "tensor_parallel_size": [1, 2, 4]}, [("model", "tensor_parallel_size")])


def test_mixtral_on_two_gpus_vs_llama_70b_on_four_is_one_call():
    result = invoke("--model", "mixtral-8x7b,llama3-70b", "--tp", "2,4", "--zip", "model,tp", *SMALL,
                    "--slo-tpot-p95-ms", "1000", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    points = doc["points"]
    assert [(p["model"], p["tp"], p["gpus"]) for p in points] == [("mixtral-8x7b", 2, 2), ("llama3-70b", 4, 4)]
    assert all(p["output_tok_s"] > 0 for p in points)
    # one answer per model: models are compared side by side, not priced against each other
    assert set(doc["cheapest_passing"]) == {"mixtral-8x7b", "llama3-70b"}
    assert doc["cheapest_passing"]["llama3-70b"]["tp"] == 4


def test_each_model_row_equals_that_model_swept_alone():
    both = invoke("--model", "llama3-8b,mixtral-8x7b", "--tp", "1,2", *SMALL, "--json")
    assert both.exit_code == 0, both.stderr
    rows = json.loads(both.stdout)["points"]
    # the model varies slowest; llama3-8b fits one H100, Mixtral (93 GB of weights) does not
    assert [(r["model"], r["tp"]) for r in rows] == [("llama3-8b", 1), ("llama3-8b", 2),
                                                     ("mixtral-8x7b", 1), ("mixtral-8x7b", 2)]
    assert rows[2]["regime"].startswith("does not fit") and rows[3]["output_tok_s"] > 0
    for name, mine in (("llama3-8b", rows[:2]), ("mixtral-8x7b", rows[2:])):
        alone = invoke("--model", name, "--tp", "1,2", *SMALL, "--json")
        assert alone.exit_code == 0, alone.stderr
        theirs = json.loads(alone.stdout)["points"]
        for a, b in zip(mine, theirs, strict=True):
            assert {k: v for k, v in a.items() if k != "model"} == b
    single = json.loads(invoke("--model", "llama3-8b", "--tp", "1,2", *SMALL, "--json").stdout)
    assert "model" not in single["points"][0]  # one model: the table is as before


def test_model_sweep_resumes_and_its_report_has_a_panel_per_model(tmp_path: Path):
    args = ["--model", "llama3-8b,mixtral-8x7b", "--tp", "1,2", "--zip", "model,tp", "--block-size", "16,32",
            "--num-requests", "16", "--rate", "2,4", "--jobs", "1"]
    whole, part = tmp_path / "whole.csv", tmp_path / "part.csv"
    assert invoke(*args, "--out", str(whole)).exit_code == 0
    lines = whole.read_text().splitlines(keepends=True)
    assert len(lines) == 1 + 8
    part.write_text("".join(lines[:4]))  # as if killed after three points
    resumed = invoke(*args, "--out", str(part), "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    a, b = (read_table(p).drop(columns="wall_s") for p in (part, whole))
    pd.testing.assert_frame_equal(a, b)
    assert a["point_id"].is_unique and set(a["model"]) == {"llama3-8b", "mixtral-8x7b"}
    other = invoke(*[x if x != "llama3-8b,mixtral-8x7b" else "llama3-8b,qwen3-30b-a3b" for x in args],
                   "--out", str(part), "--resume")
    assert other.exit_code == 2 and "other options" in other.stderr

    from kvsim.reports.sweep_report import _facets, _held, load_report

    report = load_report(whole)
    assert "model" in report.varying and "tp" in report.varying
    titles = [name for name, _ in _facets(report)]
    assert titles == ["model=llama3-8b, tp=1", "model=mixtral-8x7b, tp=2"]
    assert "tp" not in _held(report, ("block_size", "gpu_mem_util"))  # fixed per panel, not held
    out = tmp_path / "report"
    r = CliRunner().invoke(app, ["report", "sweep", str(whole), "--out", str(out)])
    assert r.exit_code == 0, r.stderr
    assert (out / "heatmap-throughput.png").exists() and (out / "throughput-latency.png").exists()


@pytest.mark.parametrize("args", [
    ["--model", "llama3-8b,llama3-70b", "--tp", "1,2,4", "--zip", "model,tp"],  # unequal lengths
    ["--model", "llama3-8b,llama3-70b", "--zip", "model,tp"],  # tp not a list
    ["--model", "llama3-8b,llama3-8b"],
    ["--model", "llama3-8b,no-such-model"],
    ["--model", "llama3-8b,llama3-70b", "--zip", "model,colour"],
])
def test_bad_model_lists_exit_2_with_one_line(tmp_path: Path, args: list[str]):
    out = tmp_path / "s.csv"
    r = invoke(*args, *SMALL, "--out", str(out))
    assert r.exit_code == 2 and r.stderr.startswith("kvsim: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert r.stdout == "" and not out.exists()


def test_an_invalid_last_point_stops_the_sweep_before_any_point_runs(tmp_path: Path, monkeypatch):
    """vLLM refuses max_num_batched_tokens < max_num_seqs; here only the grid's last point breaks it."""
    import kvsim.reports.sweep_runner as runner

    ran = []
    monkeypatch.setattr(runner, "run_point", lambda p: ran.append(p) or {})
    out = tmp_path / "s.csv"
    r = invoke("--model", "llama3-8b,mixtral-8x7b", "--tp", "2", "--max-num-seqs", "64,256",
               "--max-num-batched-tokens", "128", "--enable-chunked-prefill", *SMALL, "--out", str(out))
    assert r.exit_code == 2, r.stderr
    assert r.stderr.startswith("kvsim: error: --max-num-batched-tokens (128) must be >= --max-num-seqs (256)")
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    assert ran == [] and not out.exists() and list(tmp_path.iterdir()) == []


def test_memory_is_planned_once_per_point(monkeypatch):
    import kvsim.simcore.config as config

    calls = []
    real = config.plan_memory
    monkeypatch.setattr(config, "plan_memory", lambda *a, **k: calls.append(a) or real(*a, **k))
    r = invoke("--block-size", "16,32", "--gpu-memory-utilization", "0.8,0.9", *SMALL)
    assert r.exit_code == 0, r.stderr
    assert len(calls) == 4
