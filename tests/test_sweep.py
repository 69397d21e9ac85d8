"""`kvsim sweep`: grid rows, infeasible points as rows, one-line errors, SLO column, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.sweep import cheapest_passing, parse_list
from kvsim.reports.sweep_table import read_table
from kvsim.simcore.errors import ConfigError

FAST = ["--num-requests", "30", "--rate", "10"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["sweep", *args])


def test_parse_list_values_and_errors():
    assert parse_list("--block-size", "8, 16,32", int) == [8, 16, 32]
    assert parse_list("--gpu-memory-utilization", "0.8,0.9", float) == [0.8, 0.9]
    for text in ("16,abc", "16,", "16,16"):
        with pytest.raises(ConfigError, match="--block-size"):
            parse_list("--block-size", text, int)


def test_two_by_two_grid_gives_four_rows_in_grid_order():
    result = invoke("--block-size", "8,16", "--gpu-memory-utilization", "0.8,0.9", *FAST, "--json")
    assert result.exit_code == 0, result.stderr
    points = json.loads(result.stdout)["points"]
    assert [(p["block_size"], p["gpu_mem_util"]) for p in points] == [(8, 0.8), (8, 0.9), (16, 0.8), (16, 0.9)]
    assert all(p["tp"] == 1 for p in points)
    tokens = [p["kv_cache_tokens"] for p in points]
    assert tokens[0] < tokens[1] and tokens[2] < tokens[3]  # more memory, more KV tokens
    for p in points:
        assert p["regime"] in ("memory-bound", "compute-bound (KV not binding)")
        assert p["output_tok_s"] > 0 and p["ttft_p95_ms"] >= p["ttft_p50_ms"]


def test_a_tp_that_does_not_fit_is_a_row_not_a_crash():
    result = invoke("--model", "llama3-70b", "--tp", "1,4", "--num-requests", "10", "--rate", "5", "--json")
    assert result.exit_code == 0, result.stderr
    first, second = json.loads(result.stdout)["points"]
    assert first["tp"] == 1 and first["regime"].startswith("does not fit: ")
    assert first["output_tok_s"] is None
    assert second["tp"] == 4 and second["output_tok_s"] > 0


@pytest.mark.parametrize("flag,value", [("--block-size", "16,abc"), ("--block-size", "12"),
                                        ("--policy", "static,fifo"), ("--tp", "1,3")])
def test_a_bad_list_value_exits_2_with_one_line_and_writes_nothing(tmp_path: Path, flag: str, value: str):
    out = tmp_path / "sweep.csv"
    result = invoke(flag, value, *FAST, "--out", str(out))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: ")
    assert result.stdout == "" and not tmp_path.joinpath("sweep.csv").exists()
    assert list(tmp_path.iterdir()) == []


def test_slo_column_and_cheapest_passing_point():
    ok = invoke("--max-num-seqs", "8,64", *FAST, "--slo-ttft-p95-ms", "1e9", "--slo-tpot-p95-ms", "1e9")
    assert ok.exit_code == 0, ok.stderr
    assert "meets_slo" in ok.stdout and "Cheapest passing point" in ok.stdout
    none = invoke("--max-num-seqs", "8,64", *FAST, "--slo-ttft-p95-ms", "0.001", "--json")
    doc = json.loads(none.stdout)
    assert [p["meets_slo"] for p in doc["points"]] == [False, False]
    assert doc["cheapest_passing"] is None


def test_cheapest_passing_prefers_fewer_gpus_then_throughput():
    frame = pd.DataFrame({"output_tok_s": [900.0, 500.0, 700.0, 100.0], "meets_slo": [True, True, True, False]})
    assert cheapest_passing(frame, [4, 2, 2, 1]) == 2


def test_same_seed_same_table_and_csv_written(tmp_path: Path):
    args = ["--block-size", "16,32", *FAST, "--seed", "5"]
    a, b = invoke(*args, "--out", str(tmp_path / "a.csv")), invoke(*args, "--out", str(tmp_path / "b.csv"))
    assert a.exit_code == 0 and b.exit_code == 0, a.stderr
    assert a.stdout == b.stdout
    ta, tb = (read_table(tmp_path / f"{x}.csv").drop(columns="wall_s") for x in "ab")
    pd.testing.assert_frame_equal(ta, tb)
    assert len(ta) == 2 and list(ta["block_size"]) == [16, 32] and (ta["seed"] == 5).all()


def test_a_sweep_where_no_point_fits_is_refused_before_any_run():
    result = invoke("--model", "llama3-70b", "--tp", "1,2", "--gpu", "A100-40GB", "--num-requests", "10",
                    "--rate", "5")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: no point of the sweep fits"), lines
