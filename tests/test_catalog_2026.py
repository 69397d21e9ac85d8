"""The 2026 catalog: Llama 3.1 / 3.3, Qwen2.5 / Qwen3 dense, DeepSeek-V3 (MLA, shared experts, first
dense layers), Qwen3-235B-A22B, and B200 / GB200 / H100 PCIe / L40S / MI300X / MI325X."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.profiles.roofline import (
    decode_attention_ms,
    linear_layer_ms,
    load_efficiency,
    prefill_attention_ms,
)
from kvsim.simcore.catalog import GPU_SOURCES, GPUS, get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.memory import plan_memory
from kvsim.simcore.specs import EngineConfig


def test_deepseek_v3_sizes_are_the_reports():
    """671B in all, 37B activated (DeepSeek-V3 technical report, arXiv:2412.19437), from the shape alone."""
    m = get_model("deepseek-v3")
    assert m.num_params == pytest.approx(671e9, rel=0.005)
    assert m.num_active_params == pytest.approx(37e9, rel=0.03)
    assert m.num_moe_layers == 58 and m.is_mla and m.quantization == "fp8"


def test_mla_cache_is_one_latent_per_token_on_every_rank():
    """vLLM caches kv_lora_rank + qk_rope_head_dim values per token per layer for MLA (one KV head),
    replicated across TP ranks: 61 x 576 x 2 bytes for DeepSeek-V3, at any TP."""
    m = get_model("deepseek-v3")
    assert m.kv_bytes_per_token(1) == m.kv_bytes_per_token(8) == 61 * 576 * 2
    gqa = get_model("llama3.1-70b")
    assert gqa.kv_bytes_per_token(8) == gqa.kv_bytes_per_token(1) // 8


def test_qwen3_235b_and_llama_405b_sizes():
    assert get_model("qwen3-235b-a22b").num_params == pytest.approx(235e9, rel=0.01)
    assert get_model("qwen3-235b-a22b").num_active_params == pytest.approx(22e9, rel=0.03)
    assert get_model("llama3.1-405b").num_params == pytest.approx(405e9, rel=0.01)
    assert get_model("qwen2.5-72b").num_params == pytest.approx(72.7e9, rel=0.01)
    assert get_model("qwen3-32b").num_params == pytest.approx(32.8e9, rel=0.01)


@pytest.mark.parametrize("name", ["llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "llama3.3-70b"])
def test_llama_31_serves_128k_by_default(name):
    m = get_model(name)
    assert m.max_position_embeddings == 131072
    assert EngineConfig().resolved_max_model_len(m) == 131072


def test_hf_aliases_resolve():
    assert get_model("meta-llama/Llama-3.3-70B-Instruct").name == "llama3.3-70b"
    assert get_model("deepseek-ai/DeepSeek-R1").name == "deepseek-v3"
    assert get_gpu("mi300x").name == "MI300X-192GB" and get_gpu("b200").name == "B200-180GB"


def test_a_deepseek_config_json_reads_as_mla(tmp_path):
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
           "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
           "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
           "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
           "max_position_embeddings": 163840, "torch_dtype": "bfloat16", "hidden_act": "silu",
           "num_nextn_predict_layers": 1,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    read = get_model(str(path))
    assert replace(read, name="deepseek-v3") == get_model("deepseek-v3")
    cfg["moe_layer_freq"] = 2  # dense layers between MoE layers: refused, not mis-sized
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="dense MLP layers between"):
        get_model(str(path))


def test_mla_decode_reads_the_cache_once_for_all_heads():
    """Absorbed MLA decode: doubling the heads doubles the FLOPs but not the cache bytes, so at
    batch 1 and a long context (memory-bound) the time barely moves; GQA's grows with its KV heads."""
    gpu, eff = get_gpu("H200"), load_efficiency()
    m = get_model("deepseek-v3")
    base = decode_attention_ms(gpu, m, 8, 1, 32768, 16, eff)
    more_heads = decode_attention_ms(gpu, replace(m, num_attention_heads=256, num_kv_heads=256), 8, 1, 32768, 16, eff)
    assert more_heads < 1.3 * base
    gqa = get_model("llama3.1-70b")
    assert decode_attention_ms(gpu, replace(gqa, num_kv_heads=64), 8, 1, 32768, 16, eff) > \
        3 * decode_attention_ms(gpu, gqa, 8, 1, 32768, 16, eff)  # 8x the bytes, less the fixed costs


def test_mla_prefill_pays_for_up_projecting_its_context():
    gpu, m = get_gpu("H200"), get_model("deepseek-v3")
    plain = prefill_attention_ms(gpu, m, 8, 512, 0)
    with_context = prefill_attention_ms(gpu, m, 8, 512, 8192)
    assert with_context > 2 * plain


def test_first_dense_layers_weigh_in_the_linear_time():
    """DeepSeek's 3 dense layers of width 18,432 cost more at batch 1 than a routed layer's 8
    experts: the per-layer mean sits between the all-MoE and the all-dense figures."""
    gpu, eff, m = get_gpu("H200"), load_efficiency(), get_model("deepseek-v3")
    mean = linear_layer_ms(gpu, m, 8, 1, eff)
    all_moe = linear_layer_ms(gpu, replace(m, first_k_dense_replace=0), 8, 1, eff)
    assert mean != all_moe and abs(mean - all_moe) < 0.2 * all_moe


def test_deepseek_needs_more_than_eight_h100s_and_fits_eight_h200s():
    m = get_model("deepseek-v3")
    with pytest.raises(ConfigError):
        plan_memory(m, get_gpu("H100"), EngineConfig(tensor_parallel_size=8))
    plan = plan_memory(m, get_gpu("H200"), EngineConfig(tensor_parallel_size=8))
    assert plan.num_gpu_blocks > 0


def test_every_gpu_says_where_its_numbers_come_from():
    assert set(GPU_SOURCES) == set(GPUS)
    out = CliRunner().invoke(app, ["list", "gpus"]).stdout
    for name in ("B200-180GB", "GB200-NVL72", "L40S-48GB", "MI300X-192GB", "MI325X-256GB", "H100-PCIe-80GB"):
        assert f"  {name}: " in out
    assert "pull request 4002" in out  # B200's measured bandwidth and memory


@pytest.mark.parametrize(("model", "gpu", "tp"), [("deepseek-v3", "H200", 8), ("llama3.1-70b", "MI300X", 4),
                                                  ("qwen3-32b", "L40S", 2), ("llama3.1-405b", "B200", 8)])
def test_new_models_and_gpus_run_on_a_roofline(model, gpu, tp, tmp_path):
    result = CliRunner().invoke(app, ["run", "--model", model, "--gpu", gpu, "--tp", str(tp), "--num-requests", "40",
                                      "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["summary"]["completed"] == 40
    assert "roofline" in result.stderr


# --- expert parallelism ---------------------------------------------------------------------

def test_expert_parallel_shards_routed_experts_over_tp_times_dp():
    """DeepSeek-V3 at TP 1 does not fit an H200; with --enable-expert-parallel over 8 data-parallel
    ranks each GPU holds 1/8 of the routed experts and the rest whole: it fits, and its KV cache
    (MLA's latent is not split by TP) is larger than TP 8's."""
    m, gpu = get_model("deepseek-v3"), get_gpu("H200")
    with pytest.raises(ConfigError):
        plan_memory(m, gpu, EngineConfig(tensor_parallel_size=1, data_parallel_size=8))
    ep = plan_memory(m, gpu, EngineConfig(tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True))
    tp8 = plan_memory(m, gpu, EngineConfig(tensor_parallel_size=8))
    assert 8 * ep.num_gpu_tokens > 5 * tp8.num_gpu_tokens  # 8 replicas of its own cache vs one copy per rank
    routed = m.num_moe_layers * m.num_experts * m.expert_params  # FP8: one byte each
    assert ep.weights_bytes_per_gpu == pytest.approx(m.weight_bytes - routed * 7 / 8, rel=1e-6)


def test_expert_parallel_needs_an_moe_model_and_experts_that_divide():
    result = CliRunner().invoke(app, ["run", "--model", "llama3-8b", "--enable-expert-parallel", "--num-requests", "5"])
    assert result.exit_code != 0 and result.stderr.startswith("kvsim: error: ") and "mixture-of-experts" in result.stderr
    assert result.stderr.count("\n") == 1
    result = CliRunner().invoke(app, ["run", "--model", "mixtral-8x7b", "--gpu", "H100", "--tp", "4", "--dp", "3",
                                      "--enable-expert-parallel", "--num-requests", "5"])
    assert result.exit_code != 0 and "do not divide" in result.stderr


def test_load_imbalance_shrinks_with_batch_and_grows_with_the_group():
    from kvsim.profiles.roofline import ep_load_imbalance

    assert ep_load_imbalance(8 * 8, 8) > ep_load_imbalance(8 * 4096, 8) > 1.0
    assert ep_load_imbalance(4096 * 8, 64) > ep_load_imbalance(4096 * 8, 8)
    assert ep_load_imbalance(8, 256) <= 256


def test_an_expert_parallel_profile_says_so_and_drops_the_moe_all_reduce():
    from kvsim.profiles import default_profile

    m, gpu = get_model("deepseek-v3"), get_gpu("H200")
    plain, ep = default_profile(gpu, m, 8), default_profile(gpu, m, 8, 8)
    assert ep.data["expert_parallel_size"] == 8 and "ep8" in ep.label and "expert_parallel" in ep.data["provenance"]
    assert ep.data["collectives"]["all_reduce_calls_per_layer"] == 1
    assert plain.data["collectives"]["all_reduce_calls_per_layer"] == 2 and "expert_parallel_size" not in plain.data
    from kvsim.profiles.lookup import check_profile_matches
    from kvsim.simcore.errors import ProfileError

    with pytest.raises(ProfileError, match="expert-parallel size"):
        check_profile_matches(plain, m, 8, gpu, ep=8)


def test_dp_attention_with_expert_parallel_runs_end_to_end():
    result = CliRunner().invoke(app, ["run", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "1", "--dp", "8",
                                      "--enable-expert-parallel", "--num-requests", "80", "--rate", "8", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["summary"]["completed"] == 80 and doc["record"]["config"]["enable_expert_parallel"] is True


def test_plan_compares_h100_b200_and_mi300x(tmp_path):
    """Issue 28: `kvsim plan --model llama3.1-70b --gpu H100-SXM-80GB,B200,MI300X` prices all three (B200 and
    MI300X have dated built-in prices, reports/prices.py) and answers with one of them."""
    result = CliRunner().invoke(app, ["plan", "--model", "llama3.1-70b", "--gpu", "H100-SXM-80GB,B200,MI300X",
                                      "--rate", "6", "--slo-ttft-p95-ms", "2000", "--slo-tpot-p95-ms", "80",
                                      "--search-requests", "200", "--confirm-requests", "300"])
    assert result.exit_code == 0, result.stderr
    assert "no price" not in result.stdout
    for gpu in ("H100-SXM-80GB", "B200-180GB", "MI300X-192GB"):
        assert gpu in result.stdout
    assert "Answer:" in result.stdout


def test_llama_31_serves_32k_prompts():
    result = CliRunner().invoke(app, ["run", "--model", "llama3.1-70b", "--workload", "long-context", "--tp", "4",
                                      "--num-requests", "20", "--no-error-bars", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["summary"]["completed"] == 20 and doc["summary"]["total_input_tokens"] / 20 > 16000


def test_expert_parallel_across_two_nodes_prices_the_all_to_all_over_the_nic():
    from kvsim.profiles.roofline import ep_all_to_all_ms

    m, gpu = get_model("deepseek-v3"), get_gpu("H200")
    inside, across = ep_all_to_all_ms(gpu, m, 8, 4096, 8), ep_all_to_all_ms(gpu, m, 8, 4096, 16)
    assert across > 5 * inside  # bandwidth-bound at 4,096 tokens: the NIC (50 GB/s) vs NVLink (450 per direction)
    result = CliRunner().invoke(app, ["run", "--model", "deepseek-v3", "--gpu", "H200-141GB", "--tp", "8", "--dp", "2",
                                      "--enable-expert-parallel", "--num-requests", "50", "--no-error-bars"])
    assert result.exit_code == 0, result.stderr
    assert "tp8 ep16" in result.stdout
