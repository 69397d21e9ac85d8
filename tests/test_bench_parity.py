"""`vllm bench serve` parity: its datasets, result file, percentile flags, peak figures and flat
--json; committed profiles by bare name from any folder."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.workloads.datasets import estimate_tokens, random_dataset, sharegpt_dataset

runner = CliRunner()
SMALL = ["--num-prompts", "30"]


def invoke(*args):
    return runner.invoke(app, ["run", *args])


def test_random_dataset_lengths_follow_vllm_bounds():
    spec = random_dataset(500, 100, 10, 0.5)
    arrays = spec.generate(0)
    assert arrays.num_prompt_tokens.min() >= 50 and arrays.num_prompt_tokens.max() <= 150
    assert arrays.num_output_tokens.min() >= 5 and arrays.num_output_tokens.max() <= 15
    assert len(set(arrays.num_prompt_tokens.tolist())) > 50  # really spread, not fixed
    assert (arrays.arrival_s == 0).all()  # vLLM's default --request-rate inf
    fixed = random_dataset(10, 64, 8, 0.0).generate(0)
    assert set(fixed.num_prompt_tokens.tolist()) == {64} and set(fixed.num_output_tokens.tolist()) == {8}


def test_token_estimate():
    assert estimate_tokens("abcd" * 10) == 10
    assert estimate_tokens("a") == 1
    assert estimate_tokens("你好世界") == 4  # one per CJK character


def _sharegpt(tmp_path, entries):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(entries))
    return path


def test_sharegpt_dataset_reads_the_real_format(tmp_path):
    entries = [{"id": str(i), "conversations": [{"from": "human", "value": "x" * (40 + 4 * i)},
                                                {"from": "gpt", "value": "y" * (80 + 4 * i)}]} for i in range(20)]
    entries.append({"id": "short", "conversations": [{"from": "human", "value": "hi"}]})  # one turn: skipped
    entries.append({"id": "tiny", "conversations": [{"from": "human", "value": "abc"}, {"from": "gpt", "value": "y" * 99}]})
    path = _sharegpt(tmp_path, entries)
    spec = sharegpt_dataset(path, 20, seed=0)
    a = spec.generate(0)
    pairs = sorted(zip(a.num_prompt_tokens.tolist(), a.num_output_tokens.tolist(), strict=True))
    assert pairs == [(10 + i, 20 + i) for i in range(20)]  # every usable pair once; the tiny prompt left out
    assert sharegpt_dataset(path, 20, seed=1).generate(0).num_prompt_tokens.tolist() != a.num_prompt_tokens.tolist()
    assert set(sharegpt_dataset(path, 5, seed=0, output_len=7).generate(0).num_output_tokens.tolist()) == {7}


@pytest.mark.parametrize("content, words", [
    ("{", "not a readable JSON file"), ('{"a": 1}', "expected a JSON list"),
    ('[{"x": 1}]', "no \"conversations\" list"), ('[{"conversations": [{"value": 1}, {"value": "b"}]}]', "no text"),
])
def test_sharegpt_bad_files_are_one_line(tmp_path, content, words):
    path = tmp_path / "bad.json"
    path.write_text(content)
    r = invoke("--dataset-name", "sharegpt", "--dataset-path", str(path), *SMALL)
    assert r.exit_code == 2 and words in r.stderr and "Traceback" not in r.output


def test_sharegpt_run_at_a_rate(tmp_path):
    entries = [{"conversations": [{"from": "human", "value": "x" * (40 + 8 * i)}, {"from": "gpt", "value": "y" * (60 + 4 * i)}]}
               for i in range(50)]
    path = _sharegpt(tmp_path, entries)
    r = invoke("--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "40", "--request-rate", "5", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["completed"] == 40 and doc["request_rate"] == 5 and doc["num_prompts"] == 40
    assert doc["record"]["workload"]["arrival"]["process"] in ("poisson", "gamma")
    assert 10 * 40 <= doc["total_input_tokens"] <= 108 * 40  # the estimated prompt lengths, 10..107 tokens


def test_save_result_refuses_what_it_cannot_keep():
    r = invoke("--num-requests", "100001", "--save-result")
    assert r.exit_code == 2 and "at most 100,000" in r.stderr
    r = invoke("--num-requests", "10", "--n", "2", "--save-result")
    assert r.exit_code == 2 and "--n" in r.stderr


def test_sharegpt_too_few_usable(tmp_path):
    path = _sharegpt(tmp_path, [{"conversations": [{"from": "human", "value": "x" * 40}, {"from": "gpt", "value": "y" * 40}]}])
    r = invoke("--dataset-name", "sharegpt", "--dataset-path", str(path), *SMALL)
    assert r.exit_code == 2 and "only 1 of its 1 conversations are usable" in r.stderr


@pytest.mark.parametrize("args, words", [
    (["--random-input-len", "10"], "applies only with --dataset-name"),
    (["--dataset-name", "random", "--workload", "sharegpt"], "not both"),
    (["--dataset-name", "sharegpt"], "needs --dataset-path"),
    (["--dataset-name", "random", "--random-range-ratio", "1"], "[0, 1)"),
    (["--dataset-name", "random", "--input-len", "5", "--random-input-len", "6"], "not both"),
    (["--metric-percentiles", "50,abc"], "not a number"),
    (["--metric-percentiles", "101"], "[0, 100]"),
    (["--percentile-metrics", "ttft,foo"], "unknown metric"),
    (["--result-filename", "x.json"], "only with --save-result"),
])
def test_bad_flags(args, words, tmp_path):
    r = invoke(*args, *SMALL)
    assert r.exit_code == 2 and words in r.stderr and "Traceback" not in r.output


def test_save_result_writes_vllm_keys_and_per_request_arrays(tmp_path):
    r = invoke("--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "16",
               "--random-range-ratio", "0.5", "--num-prompts", "40", "--request-rate", "20",
               "--metric-percentiles", "50,90,99", "--save-result", "--result-dir", str(tmp_path / "res"),
               "--result-filename", "r.json")
    assert r.exit_code == 0, r.output
    assert "P90 TTFT (ms):" in r.stdout and "P95 TTFT" not in r.stdout
    assert "Peak output token throughput (tok/s):" in r.stdout and "Peak concurrent requests:" in r.stdout
    doc = json.loads((tmp_path / "res" / "r.json").read_text())
    for key in ("request_throughput", "output_throughput", "duration", "completed", "failed", "ttfts", "itls",
                "input_lens", "output_lens", "latencies", "start_times", "errors", "p90_ttft_ms", "std_itl_ms",
                "max_output_tokens_per_s", "max_concurrent_requests", "request_rate", "num_prompts"):
        assert key in doc, key
    assert doc["request_rate"] == 20 and doc["num_prompts"] == 40 and doc["completed"] == 40
    from kvsim.simcore import ccore

    assert doc["record"]["engine_core"] == ("c" if ccore.library() else "python")  # token times kept in C too
    assert len(doc["ttfts"]) == len(doc["itls"]) == 40
    # each request's ITLs number output_len - 1 and sum to its latency - TTFT
    for itl, n_out, lat, ttft in zip(doc["itls"], doc["output_lens"], doc["latencies"], doc["ttfts"], strict=True):
        assert len(itl) == n_out - 1
        assert abs(sum(itl) - (lat - ttft)) < 1e-9
    pooled = np.sort(np.concatenate([np.asarray(x) for x in doc["itls"]]))
    assert abs(np.mean(pooled) * 1000 - doc["mean_itl_ms"]) < 1e-6  # the same ITLs the summary pools
    assert abs(np.percentile(pooled, 90) * 1000 - doc["p90_itl_ms"]) < 1e-6
    # peak concurrency: the most requests in flight at once, recomputed by brute force
    starts = np.array(doc["start_times"])
    ends = starts + np.array(doc["latencies"])
    brute = max(int(((starts <= t) & (ends > t)).sum()) for t in starts)
    assert doc["max_concurrent_requests"] == brute
    # peak tokens per second: every token once, bucketed by whole seconds from the first start
    stamps = np.concatenate([[s + t] + list(s + t + np.cumsum(i)) for s, t, i in
                             zip(starts, doc["ttfts"], doc["itls"], strict=True)])
    assert len(stamps) == sum(doc["output_lens"])
    assert doc["max_output_tokens_per_s"] == np.bincount(np.floor(stamps - starts.min()).astype(int)).max()


def test_json_is_flat_and_percentile_metrics_select_sections():
    r = invoke("--num-requests", "20", "--json", "--metric-percentiles", "50,99.9")
    doc = json.loads(r.stdout)
    assert doc["p99.9_ttft_ms"] >= doc["p50_ttft_ms"] and doc["completed"] == 20 == doc["summary"]["completed"]
    assert doc["record"]["engine_core"] == "c" or doc["record"].get("engine_core_reason")
    text = invoke("--num-requests", "20", "--percentile-metrics", "ttft,e2el").stdout
    assert "Mean TTFT (ms):" in text and "Mean E2EL (ms):" in text and "Mean TPOT" not in text and "ITL" not in text


def test_committed_profile_by_bare_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke("--profile", "H100-SXM-80GB-llama3-70b-tp8", "--model", "llama3-70b", "--tp", "8", "--num-requests", "5")
    assert r.exit_code == 0, r.output
    assert "H100-SXM-80GB llama3-70b tp8" in r.stdout
    same = invoke("--profile", "h100-sxm-80gb-llama3-70b-tp8.json", "--model", "llama3-70b", "--tp", "8", "--num-requests", "5")
    assert same.exit_code == 0
    cmp = runner.invoke(app, ["profile", "compare", "H100-SXM-80GB-llama3-70b-tp8", "H200-141GB-llama3-70b-tp8"])
    assert cmp.exit_code == 0 and "median ratio B/A" in cmp.stdout
    missing = invoke("--profile", "no-such-profile", "--num-requests", "5")
    assert missing.exit_code == 2 and "kvsim list profiles" in missing.stderr
    folder = invoke("--profile", "sub/H100-SXM-80GB-llama3-70b-tp8", "--num-requests", "5")  # a path is only a file
    assert folder.exit_code == 2 and "no such profile" in folder.stderr


def test_save_result_under_a_path_that_cannot_be_a_folder_is_one_line(tmp_path):
    """--result-dir below a file (/dev/null/x): refused before the run, one line, nothing written."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = runner.invoke(app, ["run", "--num-requests", "5", "--save-result", "--result-dir", str(blocker / "x")])
    assert result.exit_code == 2 and result.stderr.startswith("kvsim: error: --result-dir")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
