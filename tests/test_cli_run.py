"""`kvsim run` through the real typer app: outputs, determinism and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app

FAST = ["--num-requests", "40", "--rate", "20", "--model", "llama3-8b"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["run", *args])


def test_run_prints_kv_cache_size_and_a_vllm_style_summary():
    result = invoke(*FAST)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "GPU KV cache size: 445,776 tokens" in out
    assert "Maximum concurrency for 8,192 tokens per request" in out
    for label in ("Successful requests:", "Output token throughput (tok/s):", "P99 TTFT (ms):",
                  "Mean TPOT (ms):", "Median ITL (ms):", "P95 E2EL (ms):", "KV cache waste (%):"):
        assert label in out
    assert "Successful requests:                     40" in out
    # vllm bench serve's lines (vllm/benchmarks/serve.py), in its order
    vllm_lines = ["Successful requests:", "Failed requests:                         0",
                  "Request rate configured (RPS):           20.00", "Benchmark duration (s):",
                  "Total input tokens:", "Total generated tokens:", "Request throughput (req/s):",
                  "Output token throughput (tok/s):", "Total token throughput (tok/s):"]
    positions = [out.index(line) for line in vllm_lines]
    assert positions == sorted(positions)
    assert "Regime:                                  compute-bound (KV not binding)" in out


def test_a_cache_too_small_for_the_traffic_is_reported_memory_bound():
    # TP 2 leaves ~25k KV tokens; 128 clients of ~500-token requests need far more
    result = invoke("--model", "llama3-70b", "--tp", "2", "--workload", "seed-table",
                    "--concurrency", "128", "--num-requests", "120", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["regime"] == "memory-bound" and summary["num_preemptions"] > 0


def test_out_writes_three_files_with_seed_config_and_profile_hash(tmp_path: Path):
    out = tmp_path / "run"
    result = invoke(*FAST, "--seed", "7", "--block-size", "32", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "steps.csv", "summary.json"]
    doc = json.loads((out / "summary.json").read_text())
    assert doc["record"]["seed"] == 7
    assert doc["record"]["config"]["block_size"] == 32
    assert len(doc["record"]["profile"]["sha256"]) == 64
    assert doc["record"]["workload"]["name"] == "sharegpt"
    assert doc["summary"]["completed"] == 40
    requests = (out / "requests.csv").read_text().splitlines()
    assert len(requests) == 41 and requests[0].startswith("request_id,")


def test_json_prints_only_json_on_stdout():
    result = invoke(*FAST, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["summary"]["completed"] == 40
    assert "GPU KV cache size" in result.stderr


def test_same_seed_same_files_different_seed_different(tmp_path: Path):
    paths = []
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        assert invoke(*FAST, "--seed", seed, "--out", str(tmp_path / name)).exit_code == 0
        paths.append(tmp_path / name)
    a, b, c = ((p / "requests.csv").read_text() for p in paths)
    assert a == b
    assert a != c
    assert (paths[0] / "steps.csv").read_text() == (paths[1] / "steps.csv").read_text()


def test_user_supplied_profile_is_used_and_recorded(tmp_path: Path):
    profile = Path(__file__).resolve().parents[1] / "profiles" / "cpu-tiny-tp1.json"
    result = invoke("--model", "tiny", "--profile", str(profile), "--num-requests", "10",
                    "--rate", "5", "--input-len", "32", "--output-len", "16", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["record"]["profile"]["source"] == "measured"


def _bad_profile(tmp_path: Path) -> str:
    path = tmp_path / "bad.json"
    path.write_text('{"schema": "kvsim-profile", "schema_version": 1, "source": "roofline"}')
    return str(path)


def _bad_hf_config(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096}')
    return str(path)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["--gpu", "B300"], "unknown GPU 'B300'"),
        (["--block-size", "24"], "power of two"),
        (["--block-size", "0"], "power of two"),
        (["--gpu-memory-utilization", "1.5"], "(0, 1]"),
        (["--gpu-memory-utilization", "0"], "(0, 1]"),
        (["--model", "llama3-70b"], "--tp 2 would fit"),
        (["--input-len", "9000"], "--input-len 9000 tokens leaves no room for one output token within max_model_len"),
        (["--tp", "3"], "power of two"),
        (["--tp", "16", "--model", "tiny"], "must divide tiny's 4 attention heads"),
        (["--seed", "-1"], "--seed must be an integer >= 0"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be positive"),
        (["--policy", "continuous", "--max-batch-size", "8"], "--max-batch-size applies only"),
        (["--reservation", "pow2"], "--reservation applies only"),
        (["--policy", "static", "--reservation", "max"], "--reservation applies only"),
        (["--policy", "dynamic", "--allocator", "paged"], "--allocator applies only"),
        (["--policy", "static", "--preemption-mode", "swap"], "--preemption-mode applies only"),
        (["--rate", "5", "--concurrency", "4"], ""),
        (["--policy", "warp"], "warp"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args, needle):
    out = tmp_path / "out"
    result = invoke(*args, "--num-requests", "5", "--out", str(out))
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stderr.startswith("kvsim: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()  # no partial output


def test_does_not_fit_says_by_how_much(tmp_path: Path):
    result = invoke("--model", "llama3-70b", "--num-requests", "5")
    assert "by 62.9 GiB" in result.stderr


@pytest.mark.parametrize("kind", ["profile", "hf-config"])
def test_malformed_files_are_one_line_errors(tmp_path: Path, kind: str):
    out = tmp_path / "out"
    if kind == "profile":
        args = ["--profile", _bad_profile(tmp_path)]
    else:
        args = ["--model", _bad_hf_config(tmp_path)]
    result = invoke(*args, "--num-requests", "5", "--out", str(out))
    assert result.exit_code == 2
    assert result.stderr.startswith("kvsim: error: ") and result.stderr.count("\n") == 1
    assert not out.exists()


def test_profile_for_another_model_is_refused(tmp_path: Path):
    profile = Path(__file__).resolve().parents[1] / "profiles" / "cpu-tiny-tp1.json"
    result = invoke("--profile", str(profile), "--num-requests", "5")
    assert result.exit_code == 2 and "kvsim: error:" in result.stderr


def test_earlier_outputs_survive_a_failed_run(tmp_path: Path):
    out = tmp_path / "run"
    assert invoke(*FAST, "--out", str(out)).exit_code == 0
    before = (out / "summary.json").read_text()
    assert invoke(*FAST, "--block-size", "7", "--out", str(out)).exit_code == 2
    assert (out / "summary.json").read_text() == before


def test_hf_config_json_model(tmp_path: Path):
    cfg = {
        "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 1024,
        "max_position_embeddings": 2048, "hidden_act": "silu", "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    result = invoke("--model", str(path), "--num-requests", "5", "--rate", "5",
                    "--input-len", "64", "--output-len", "8", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["record"]["profile"]["source"] == "roofline"


def test_out_that_is_a_file_is_refused(tmp_path: Path):
    target = tmp_path / "taken"
    target.write_text("keep me")
    result = invoke(*FAST, "--out", str(target))
    assert result.exit_code == 2 and result.stderr.startswith("kvsim: error: --out")
    assert target.read_text() == "keep me"


def test_vllm_bench_serve_names_for_the_load_are_accepted():
    ours = invoke("--rate", "20", "--num-requests", "12", "--json")
    theirs = invoke("--request-rate", "20", "--num-prompts", "12", "--json")
    assert ours.exit_code == theirs.exit_code == 0, theirs.stderr
    assert json.loads(ours.stdout)["summary"] == json.loads(theirs.stdout)["summary"]
    closed = invoke("--max-concurrency", "3", "--num-prompts", "6", "--json")
    assert closed.exit_code == 0, closed.stderr
    assert json.loads(closed.stdout)["summary"]["max_concurrency"] == 3


def test_the_readme_shows_what_the_main_job_prints_now():
    """The quick start's sample output is the default run's, line for line (regenerate it when a
    change moves the numbers: `kvsim run --policy continuous --block-size 16`)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = readme.index("```\nSimulating: workload sharegpt")
    shown = readme[start + 4:readme.index("```", start + 4)].splitlines()
    result = invoke("--policy", "continuous", "--block-size", "16")
    assert result.exit_code == 0, result.stderr
    printed = [line.rstrip() for line in result.stdout.splitlines()]
    expected = [line for line in shown if not line.startswith(("...", "Simulated in"))]
    assert expected == [line for line in printed if line in expected], "README sample is stale"
    assert len(expected) > 30 and all(line in printed for line in expected)
