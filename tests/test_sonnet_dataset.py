"""`--dataset-name sonnet` as `vllm bench serve` builds it (workloads.datasets.sonnet_dataset):
prompts of poem lines up to --sonnet-input-len behind a head of --sonnet-prefix-len that every
prompt shares, and that head cached as a real shared prefix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore.errors import WorkloadError
from kvsim.workloads.datasets import (
    SONNET_BASE_PROMPT,
    SONNET_FILE,
    estimate_tokens,
    sonnet_dataset,
)

runner = CliRunner()


def test_prompts_stay_within_the_input_length_behind_one_shared_head():
    spec = sonnet_dataset(None, 300, seed=0)
    t = spec.trace
    assert (t.num_prompt_tokens <= 550).all() and t.num_prompt_tokens.mean() > 0.9 * 550
    assert (t.num_output_tokens == 150).all()
    assert (t.extras["prefix_id"] == 0).all()
    head = set(t.extras["num_prefix_tokens"].tolist())
    lines = SONNET_FILE.read_text(encoding="utf-8").splitlines(keepends=True)
    avg = np.mean([estimate_tokens(line) for line in lines])
    base = estimate_tokens(SONNET_BASE_PROMPT)
    expected = estimate_tokens(SONNET_BASE_PROMPT + "".join(lines[:round((200 - base) / avg)]))
    assert head == {expected} and 180 <= expected <= 220  # vLLM's rule: round((200 - base) / avg) first lines


def test_the_draw_is_the_seeds():
    a, b, c = (sonnet_dataset(None, 50, seed=s).trace.num_prompt_tokens for s in (1, 1, 2))
    assert (a == b).all() and not (a == c).all()


def test_a_custom_file_and_lengths(tmp_path):
    poem = tmp_path / "poem.txt"
    poem.write_text("".join(f"line number {i} of a poem about caches\n" for i in range(40)))
    spec = sonnet_dataset(poem, 20, seed=0, input_len=120, output_len=7, prefix_len=40)
    assert (spec.trace.num_prompt_tokens <= 120).all() and (spec.trace.num_output_tokens == 7).all()
    assert 30 <= int(spec.trace.extras["num_prefix_tokens"][0]) <= 50


@pytest.mark.parametrize("kwargs, words", [
    ({"prefix_len": 600}, "at most --sonnet-input-len"),
    ({"input_len": 5, "prefix_len": 0}, "higher than the base prompt"),
    ({"output_len": 0}, "--sonnet-output-len must be an integer >= 1"),
])
def test_bad_lengths_are_refused(kwargs, words):
    with pytest.raises(WorkloadError, match=words):
        sonnet_dataset(None, 10, seed=0, **kwargs)


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(WorkloadError, match="no such file"):
        sonnet_dataset(tmp_path / "missing.txt", 10, seed=0)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(WorkloadError, match="no lines of text"):
        sonnet_dataset(empty, 10, seed=0)
    long_lines = tmp_path / "long.txt"
    long_lines.write_text("x" * 4000 + "\n")  # every line alone is over the input length
    with pytest.raises(WorkloadError, match="no prompt of at most"):
        sonnet_dataset(long_lines, 3, seed=0, prefix_len=0)


def _run(*args: str) -> dict:
    result = runner.invoke(app, ["run", "--dataset-name", "sonnet", "--num-prompts", "120", "--request-rate", "10",
                                 *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def test_the_shared_head_is_cached_as_a_prefix():
    cached, plain = _run(), _run("--no-enable-prefix-caching")
    share = 200 / 550  # the head's share of a prompt, less the last partial block
    assert share - 16 / 550 - 0.05 < cached["prefix_cache_hit_rate"] < share + 0.05
    assert cached["mean_ttft_ms"] < plain["mean_ttft_ms"]
    assert cached["total_input_tokens"] == plain["total_input_tokens"]


@pytest.mark.parametrize("args, words", [
    (["run", "--sonnet-input-len", "100"], "--sonnet-input-len applies only with --dataset-name sonnet"),
    (["run", "--dataset-name", "sonnet", "--input-len", "300", "--sonnet-input-len", "300"],
     "give --input-len or --sonnet-input-len, not both"),
    (["run", "--dataset-name", "sonnet", "--sonnet-prefix-len", "900"], "at most --sonnet-input-len"),
    (["run", "--dataset-name", "sonnet", "--dataset-path", "/nonexistent/sonnet.txt"], "no such file"),
])
def test_cli_refuses_in_one_line(args, words):
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and words in result.output and "Traceback" not in result.output


def test_input_len_is_vllms_general_name_for_the_sonnet_one():
    doc = _run("--input-len", "300", "--output-len", "20", "--num-prompts", "60")
    assert doc["total_output_tokens"] == 60 * 20
    assert doc["total_input_tokens"] <= 60 * 300
