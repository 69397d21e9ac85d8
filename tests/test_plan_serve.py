"""A plan's answer says which kind of profile priced it and prints the `vllm serve` command of the
chosen deployment, with every option that decided the result."""

import shlex

from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.serve_command import vllm_serve_command
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.specs import EngineConfig

PLAN = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1,2", "--input-len", "256",
        "--output-len", "64", "--search-requests", "100", "--confirm-requests", "150", "--tolerance", "0.15",
        "--slo-ttft-p95-ms", "150", "--slo-tpot-p95-ms", "12", "--rate", "20"]


def test_serve_command_carries_every_deciding_option():
    config = EngineConfig(tensor_parallel_size=4, pipeline_parallel_size=2, block_size=32, gpu_memory_utilization=0.85,
                          max_num_seqs=128, kv_cache_dtype="fp8", quantization="fp8", enable_chunked_prefill=False,
                          enable_prefix_caching=False, max_model_len=4096)
    words = shlex.split(vllm_serve_command(get_model("llama3-70b"), get_gpu("H100-SXM-80GB"), config))
    assert words[:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3-70B"]
    pairs = dict(zip(words[3::1], words[4::1], strict=False))
    assert pairs["--tensor-parallel-size"] == "4" and pairs["--pipeline-parallel-size"] == "2"
    assert pairs["--block-size"] == "32" and pairs["--gpu-memory-utilization"] == "0.85"
    assert pairs["--max-num-seqs"] == "128" and pairs["--max-model-len"] == "4096"
    assert pairs["--max-num-batched-tokens"] == "4096"  # without chunked prefill: max_model_len, as vLLM resolves it
    assert pairs["--kv-cache-dtype"] == "fp8" and pairs["--quantization"] == "fp8"
    assert "--no-enable-chunked-prefill" in words and "--no-enable-prefix-caching" in words
    plain = vllm_serve_command(get_model("llama3-8b"), get_gpu("H100-SXM-80GB"), EngineConfig())
    assert "--max-num-batched-tokens 8192" in plain and "--max-model-len 8192" in plain and "fp8" not in plain


def test_plan_answer_names_the_profile_kind_and_prints_vllm_serve():
    result = CliRunner().invoke(app, PLAN)
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert "step times from a roofline profile" in text
    line = next(x for x in text.splitlines() if x.startswith("Serve it: "))
    assert "`vllm serve meta-llama/Meta-Llama-3-8B --tensor-parallel-size" in line


def test_serve_command_carries_a_speculative_config():
    from kvsim.simcore.speculative import parse_speculative_config

    spec = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    line = vllm_serve_command(get_model("llama3-8b"), get_gpu("H100-SXM-80GB"), EngineConfig(speculative_config=spec))
    words = shlex.split(line)
    assert words[words.index("--speculative-config") + 1] == '{"method":"ngram","num_speculative_tokens":3}'
