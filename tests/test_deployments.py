"""FP8 weights and KV cache, mixture-of-experts models and pipeline-parallel layouts: what
they do to the memory plan, and what the hardware refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from simcore.catalog import get_gpu, get_model
from simcore.errors import ConfigError
from simcore.memory import plan_memory
from simcore.parallel import layer_partition, stage_crosses_node
from simcore.specs import GIB, EngineConfig

H100, A100 = get_gpu("H100-SXM-80GB"), get_gpu("A100-80GB")
L70, MIXTRAL, QWEN3 = get_model("llama3-70b"), get_model("mixtral-8x7b"), get_model("qwen3-30b-a3b")


def run(*args: str):
    return CliRunner().invoke(app, ["run", *args])


def test_fp8_kv_cache_holds_twice_the_tokens_on_llama3_70b_tp4():
    auto = plan_memory(L70, H100, EngineConfig(tensor_parallel_size=4))
    fp8 = plan_memory(L70, H100, EngineConfig(tensor_parallel_size=4, kv_cache_dtype="fp8"))
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    assert fp8.kv_budget_bytes == auto.kv_budget_bytes  # same memory, half the bytes per token
    assert 1.99 < fp8.num_gpu_tokens / auto.num_gpu_tokens < 2.01
    assert fp8.kv_cache_dtype == "fp8" and auto.kv_cache_dtype == "bfloat16"


def test_cli_prints_twice_the_kv_tokens_with_fp8_kv_cache():
    tokens = []
    for dtype in ("auto", "fp8"):
        result = run("--model", "llama3-70b", "--tp", "4", "--kv-cache-dtype", dtype,
                     "--num-requests", "10", "--rate", "5")
        assert result.exit_code == 0, result.stderr
        line = next(x for x in result.stdout.splitlines() if x.startswith("GPU KV cache size:"))
        tokens.append(int(line.split(":")[1].split()[0].replace(",", "")))
    assert 1.99 < tokens[1] / tokens[0] < 2.01


def test_fp8_weights_halve_the_linear_layers_but_not_embeddings():
    fp8 = EngineConfig(quantization="fp8").resolve_model(L70)
    linear = L70.num_layers * L70.linear_params_per_layer
    assert L70.weight_bytes - fp8.weight_bytes == linear  # one byte saved per linear weight
    assert 0.5 < fp8.weight_bytes / L70.weight_bytes < 0.53  # embeddings, head, norms stay bf16
    plan = plan_memory(L70, H100, EngineConfig(tensor_parallel_size=4, quantization="fp8"))
    assert plan.weight_dtype == "fp8"
    assert plan.weights_bytes_per_gpu == fp8.weight_bytes // 4


def test_a100_refuses_fp8_weights_with_one_line():
    result = run("--gpu", "A100-80GB", "--model", "llama3-70b", "--tp", "4", "--quantization", "fp8")
    assert result.exit_code == 2
    assert result.stderr.startswith("kvsim: error: A100-80GB has no FP8 tensor cores")
    assert result.stderr.count("\n") == 1
    # an FP8 KV cache is storage only, which vLLM supports on Ampere
    plan_memory(L70, A100, EngineConfig(tensor_parallel_size=4, kv_cache_dtype="fp8"))


def test_mixtral_memory_counts_every_expert():
    # Mistral AI, "Mixtral of experts" (2023-12-11): 46.7B parameters in all, 12.9B per token
    assert MIXTRAL.num_params == pytest.approx(46.7e9, rel=0.002)
    assert MIXTRAL.num_active_params == pytest.approx(12.9e9, rel=0.002)
    plan = plan_memory(MIXTRAL, H100, EngineConfig(tensor_parallel_size=2))
    assert plan.weights_bytes_per_gpu == MIXTRAL.num_params * 2 // 2
    assert 43 < plan.weights_bytes_per_gpu / GIB < 44
    with pytest.raises(ConfigError, match="--tp 2 would fit"):
        plan_memory(MIXTRAL, H100, EngineConfig(tensor_parallel_size=1))


def test_qwen3_moe_matches_its_model_card():
    # huggingface.co/Qwen/Qwen3-30B-A3B: 30.5B in total, 3.3B activated
    assert QWEN3.num_params == pytest.approx(30.5e9, rel=0.002)
    assert QWEN3.num_active_params == pytest.approx(3.3e9, rel=0.02)


def test_mixtral_runs_on_two_h100s():
    result = run("--model", "mixtral-8x7b", "--tp", "2", "--num-requests", "20", "--rate", "5", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["completed"] == 20


def test_tp_beyond_a_node_is_refused_with_the_pp_layout():
    result = run("--model", "llama3-70b", "--tp", "16")
    assert result.exit_code == 2
    assert "--tp 16 exceeds the 8 GPUs of one H100-SXM-80GB node" in result.stderr
    assert "use --tp 8 --pp 2" in result.stderr and result.stderr.count("\n") == 1


def test_layers_split_across_stages_as_vllm_does():
    assert layer_partition(80, 2) == [40, 40]
    assert layer_partition(32, 3) == [11, 11, 10]  # remainder goes before the last stage
    assert layer_partition(10, 4) == [2, 3, 3, 2]
    with pytest.raises(ConfigError, match="exceeds the model's 2 layers"):
        layer_partition(2, 4)


def test_stage_boundaries_inside_or_across_nodes():
    assert not stage_crosses_node(0, 4, 8)  # TP 4 x PP 2 fits one node
    assert stage_crosses_node(0, 8, 8)  # TP 8 x PP 2 spans two
    assert [stage_crosses_node(s, 4, 8) for s in range(3)] == [False, True, False]


def test_pipeline_stages_split_weights_and_kv():
    one = plan_memory(L70, H100, EngineConfig(tensor_parallel_size=8))
    two = plan_memory(L70, H100, EngineConfig(tensor_parallel_size=8, pipeline_parallel_size=2))
    assert two.layers_per_stage == (40, 40)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.weights_bytes_per_gpu < 0.55 * one.weights_bytes_per_gpu
    assert two.num_gpu_tokens > 2 * one.num_gpu_tokens  # half the layers, more free memory


def test_llama3_70b_tp8_pp2_runs_on_h100s():
    result = run("--model", "llama3-70b", "--tp", "8", "--pp", "2", "--num-requests", "20",
                 "--rate", "5")
    assert result.exit_code == 0, result.stderr
    assert "Pipeline: 2 stages x TP 8, layers 40/40" in result.stdout


def test_hf_config_reads_moe_fields_and_fp8_quantization(tmp_path: Path):
    cfg = {
        "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000,
        "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
        "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8"},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = get_model(str(path))
    assert (model.num_experts, model.num_experts_per_tok, model.moe_intermediate_size) == (8, 2, 14336)
    assert model.quantization == "fp8"
    assert model.num_params == MIXTRAL.num_params
    assert EngineConfig(quantization="fp8").resolve_model(model) is model
    cfg["quantization_config"] = {"quant_method": "awq"}
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"quant_method 'awq'\) is not supported"):
        get_model(str(path))


def test_unknown_kv_cache_dtype_is_a_usage_error():
    result = run("--kv-cache-dtype", "int4")
    assert result.exit_code == 2 and result.stderr.startswith("kvsim: error: ")
