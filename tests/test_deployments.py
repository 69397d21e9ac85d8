"""FP8 weights and KV cache, mixture-of-experts models and pipeline-parallel layouts: what
they do to the memory plan, and what the hardware refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.memory import plan_memory
from kvsim.simcore.parallel import layer_partition, stage_crosses_node
from kvsim.simcore.specs import GIB, EngineConfig

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


# --- pricing: FP8, MoE, pipeline stages ------------------------------------------------------

def _latency(model, tp: int, gpu=H100):
    from kvsim.profiles import default_profile
    from kvsim.simcore.latency import StepLatencyModel

    return StepLatencyModel(default_profile(gpu, model, tp).data)


def test_fp8_kv_cache_sustains_a_higher_rate_when_memory_binds():
    out = {}
    for dtype in ("auto", "fp8"):
        result = run("--model", "llama3-70b", "--tp", "2", "--kv-cache-dtype", dtype, "--workload",
                     "seed-table", "--concurrency", "96", "--num-requests", "120", "--json")
        assert result.exit_code == 0, result.stderr
        out[dtype] = json.loads(result.stdout)["summary"]
    assert out["auto"]["regime"] == "memory-bound" and out["auto"]["num_preemptions"] > 0
    assert out["fp8"]["num_preemptions"] < out["auto"]["num_preemptions"]
    assert out["fp8"]["output_throughput"] > out["auto"]["output_throughput"]


def test_mixtral_batch1_decode_costs_far_less_than_a_dense_model_of_its_size():
    from kvsim.simcore.specs import ModelSpec

    dense = ModelSpec("dense-46.7b", 32, 4096, 32, 8, 128, 8 * 14336, 32000, max_position_embeddings=32768)
    assert dense.num_params == pytest.approx(MIXTRAL.num_params, rel=0.001)
    moe, big = _latency(MIXTRAL, 2), _latency(dense, 2)
    step = (1, [], 1, 512, 1)  # one sequence decoding at context 512
    assert moe.step_time_s(*step) < 0.5 * big.step_time_s(*step)
    # at a large batch every expert is touched: the MoE layer reads all its weights
    assert moe.linear(4096) > 0.2 * big.linear(4096)


def test_moe_decode_reads_only_the_experts_its_tokens_touch():
    from kvsim.profiles.roofline import experts_touched

    assert experts_touched(1, 8, 2) == pytest.approx(2.0)
    assert experts_touched(64, 8, 2) == pytest.approx(8.0, rel=1e-6)
    assert experts_touched(1, 128, 8) == pytest.approx(8.0)
    lat = _latency(MIXTRAL, 2)
    assert lat.linear(1) < lat.linear(8) < lat.linear(64)  # more experts touched, more bytes


def test_fp8_weights_make_gemms_cheaper_on_hopper():
    fp8 = EngineConfig(quantization="fp8", kv_cache_dtype="fp8").resolve_model(L70)
    bf16, q = _latency(L70, 4), _latency(fp8, 4)
    assert q.linear(1) < 0.75 * bf16.linear(1)  # batch 1: half the weight bytes
    assert q.linear(8192) < 0.85 * bf16.linear(8192)  # large batch: the FP8 tensor-core peak
    assert q.decode(64, 4096) < 0.65 * bf16.decode(64, 4096)  # half the KV bytes read


def test_pipeline_round_of_two_stages_by_hand():
    from kvsim.simcore.pipeline import pipeline_round_ms

    # stages 5 ms and 3 ms, one 1 ms hand-off: one micro-batch goes through in 5 + 1 + 3 = 9 ms;
    # two micro-batches keep both stages busy, the first stage is busiest: 2 x 5 = 10 ms
    assert pipeline_round_ms([5.0, 3.0], [1.0], 1) == 9.0
    assert pipeline_round_ms([5.0, 3.0], [1.0], 2) == 10.0
    # a slow hand-off makes the round latency-bound: 5 + 4 + 3 = 12 > 10
    assert pipeline_round_ms([5.0, 3.0], [4.0], 2) == 12.0


def _flow_shop(stage_ms, handoff_ms, m, rounds):
    """Brute force: m micro-batches cycle through the stages in order, each stage serves them
    first come first served, a micro-batch starts its next token when its last one is out.
    Returns emit[r][j], when micro-batch j's round-r token leaves the last stage."""
    free = [0.0] * len(stage_ms)
    ready = [0.0] * m
    emits = []
    for _ in range(rounds):
        row = []
        for j in range(m):
            t = ready[j]
            for s, ms in enumerate(stage_ms):
                end = max(t, free[s]) + ms
                free[s] = end
                t = end + (handoff_ms[s] if s < len(handoff_ms) else 0.0)
            ready[j] = end
            row.append(end)
        emits.append(row)
    return emits


def test_microbatches_leave_the_last_stage_one_pace_apart_by_hand():
    from kvsim.simcore.pipeline import emit_offsets_ms

    # [5, 3] ms stages, a 1 ms hand-off, two micro-batches: the 10 ms round's first micro-batch
    # is out 5 ms (one pass of the busiest stage) before the second, which ends the round
    assert emit_offsets_ms([5.0, 3.0], [1.0], 2) == [5.0, 10.0]
    assert emit_offsets_ms([5.0, 3.0], [1.0], 1) == [9.0]  # one micro-batch: its full latency
    assert emit_offsets_ms([5.0, 3.0], [4.0], 2) == [7.0, 12.0]  # latency-bound round of 12 ms
    assert emit_offsets_ms([2.0, 5.0, 3.0], [1.0, 1.0], 3) == [5.0, 10.0, 15.0]


@pytest.mark.parametrize(("stages", "handoffs", "m"), [
    ([5.0, 3.0], [1.0], 2), ([5.0, 3.0], [4.0], 2), ([2.0, 5.0, 3.0], [1.0, 1.0], 3),
    ([1.0, 1.0, 1.0, 4.0], [0.5, 0.5, 0.5], 4), ([3.0, 3.0], [0.2], 2),
])
def test_round_and_emit_offsets_match_a_brute_force_pipeline(stages, handoffs, m):
    from kvsim.simcore.pipeline import emit_offsets_ms, pipeline_round_ms

    emits = _flow_shop(stages, handoffs, m, rounds=30)
    last, before = emits[-1], emits[-2]
    assert last[-1] - before[-1] == pytest.approx(pipeline_round_ms(stages, handoffs, m))  # steady period
    offsets = emit_offsets_ms(stages, handoffs, m)
    assert [e - last[-1] for e in last] == pytest.approx([o - offsets[-1] for o in offsets])
    assert all(o > 0 for o in offsets)


def test_pipeline_latency_splits_a_flat_profile_into_two_stages():
    from kvsim.simcore.latency import StepLatencyModel
    from kvsim.simcore.pipeline import INTRA_NODE_SEND_RECV, PipelineLatency
    from tests.helpers import flat_profile

    tiny = get_model("tiny")
    base = StepLatencyModel(flat_profile(linear_ms=3.0, overhead_ms=2.0).data)
    pipe = PipelineLatency(base, H100, tp=1, pp=2, hidden_size=tiny.hidden_size)
    lat_ms, gbps = INTRA_NODE_SEND_RECV
    handoff = lat_ms + 1 * 2 * tiny.hidden_size * 2 / (gbps * 1e6)  # one token's hidden + residual
    # stage 0 = host 2 + one layer 3 = 5 ms; stage 1 = one layer 3 ms (+ a ~0 LM head)
    assert pipe.step_time_s(1, [], 1, 100, 1) * 1e3 == pytest.approx(5 + 3 + handoff, abs=1e-6)
    assert pipe.emit_times_s(1.0, 1) == pytest.approx([1.0 + (8 + handoff) / 1e3])
    assert pipe.step_time_s(2, [], 2, 200, 2) * 1e3 == pytest.approx(10.0, abs=1e-6)
    # two micro-batches of one sequence: the first leaves stage 1 one 5 ms stage-0 pass earlier
    assert pipe.emit_times_s(1.0, 3) == pytest.approx([1.005, 1.010, 1.005])


def test_handoffs_across_nodes_are_priced_over_the_nic_not_nvlink():
    from kvsim.simcore.pipeline import send_recv_ms

    nbytes = 64 * 2**20
    inside, across = send_recv_ms(H100, nbytes, False), send_recv_ms(H100, nbytes, True)
    assert 0.15 < inside < 0.25  # measured 0.193 ms (Vidur H100 DGX, devices_per_node 2)
    assert 1.6 < across < 2.1  # measured 1.871 ms (devices_per_node 1: two nodes)
    assert send_recv_ms(A100, nbytes, True) > 1.8 * across  # 200 Gb/s NICs


def test_profiles_split_send_recv_inside_and_across_nodes():
    """Vidur's send/recv rows are fitted apart (devices_per_node 2: one node; 1: two nodes); TP > 1
    profiles carry both tables and pipeline hand-offs use the one of their link."""
    from kvsim.profiles.collectives import collectives_for, load_fit
    from kvsim.profiles.roofline import build_roofline_profile
    from kvsim.simcore.latency import StepLatencyModel
    from kvsim.simcore.pipeline import INTER_NODE_SEND_RECV, INTRA_NODE_SEND_RECV, PipelineLatency

    fit = load_fit()["send_recv"]
    assert set(fit) == {"intra_node", "inter_node"}
    for key, (lat_ms, gbps) in (("intra_node", INTRA_NODE_SEND_RECV), ("inter_node", INTER_NODE_SEND_RECV)):
        assert fit[key]["latency_ms"] == pytest.approx(lat_ms, rel=0.01)  # simcore's constants are this fit
        assert fit[key]["bandwidth_gbps"] == pytest.approx(gbps, rel=0.01)
        assert fit[key]["median_abs_rel_error"] < 0.05
    block = collectives_for(H100, 8)
    nbytes = 64 * 2**20
    doc = build_roofline_profile(H100, L70, 8)
    assert doc["collectives"]["send_recv_inter_node"] == block["send_recv_inter_node"]
    base = StepLatencyModel(doc)
    inside, across = base.send_recv_ms(nbytes), base.send_recv_ms(nbytes, across_nodes=True)
    assert 0.15 < inside < 0.25 and 1.6 < across < 2.1  # measured 0.19 / 1.87 ms, not one mixed line
    pipe = PipelineLatency(base, H100, 8, 2, 8192)
    assert pipe.crosses == [True]  # TP 8 x PP 2: the stages sit on two nodes
    assert pipe.handoff_ms(nbytes, True) == across and pipe.handoff_ms(nbytes, False) == inside
    a100 = collectives_for(A100, 8)
    assert "25 / 50 GB/s" in a100["send_recv_source"]  # DGX A100: 200 Gb/s NICs, half the bandwidth


def test_pp2_decode_step_at_batch_one_is_slower_than_tp_alone():
    from kvsim.simcore.pipeline import PipelineLatency

    base = _latency(L70, 8)
    pipe = PipelineLatency(_latency(L70, 8), H100, 8, 2, 8192)
    one = base.step_time_s(1, [], 1, 1024, 1)
    assert pipe.step_time_s(1, [], 1, 1024, 1) > one  # a pipeline adds hand-offs, not speed
    # 256 sequences: two micro-batches of 128 overlap; per-token throughput beats TP 8 alone
    assert pipe.step_time_s(256, [], 256, 256 * 1024, 256) < 1.2 * base.step_time_s(256, [], 256, 256 * 1024, 256)


def test_engine_with_two_stages_follows_the_hand_computed_timeline():
    from kvsim.simcore.pipeline import INTRA_NODE_SEND_RECV
    from kvsim.simcore.simulate import simulate
    from tests.helpers import ListWorkload, flat_profile, req

    tiny = get_model("tiny")
    lat_ms, gbps = INTRA_NODE_SEND_RECV

    def handoff(tokens: int) -> float:
        return lat_ms + tokens * 2 * tiny.hidden_size * 2 / (gbps * 1e6)

    config = EngineConfig(pipeline_parallel_size=2, enable_prefix_caching=False)
    result = simulate(tiny, H100, config, ListWorkload([req(0, 0.0, 4, 3)]),
                      flat_profile(linear_ms=3.0, overhead_ms=2.0))
    # one sequence: every step is one micro-batch through both stages, 5 + hand-off + 3 ms
    expected_ms = (8 + handoff(4)) + 2 * (8 + handoff(1))
    assert result.requests["e2el_s"].iloc[0] * 1e3 == pytest.approx(expected_ms, abs=1e-6)


def test_sweep_takes_pp_kv_dtype_and_quantization_and_counts_gpus():
    result = CliRunner().invoke(app, ["sweep", "--model", "llama3-8b", "--pp", "1,2", "--kv-cache-dtype",
                                      "auto,fp8", "--quantization", "none,fp8", "--num-requests", "10",
                                      "--rate", "5", "--jobs", "1", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = doc["points"]
    assert len(rows) == 8
    by = {(r["pp"], r["kv_dtype"], r["quant"]): r for r in rows}
    assert by[(2, "auto", None)]["gpus"] == 2 and by[(1, "auto", None)]["gpus"] == 1
    assert 1.99 < by[(1, "fp8", None)]["kv_cache_tokens"] / by[(1, "auto", None)]["kv_cache_tokens"] < 2.01


def _pp_run(monkeypatch=None):
    from kvsim.simcore.simulate import simulate
    from tests.helpers import ListWorkload, flat_profile, req

    if monkeypatch is not None:  # every token at the round's end, as before per-micro-batch emission
        from kvsim.simcore.pipeline import PipelineLatency

        monkeypatch.delattr(PipelineLatency, "emit_times_s")
    requests = [req(i, 0.004 * i, 8 + i % 5, 6 + i % 4) for i in range(12)]
    cfg = EngineConfig(max_model_len=128, block_size=4, pipeline_parallel_size=2)
    profile = flat_profile(linear_ms=3.0, overhead_ms=2.0)
    return simulate(get_model("tiny"), H100, cfg, ListWorkload(requests), profile, seed=0)


def test_pipeline_micro_batches_emit_when_they_leave_the_last_stage(monkeypatch):
    """With two stages a step's first micro-batch leaves the pipeline one stage-pass before the
    round ends: its tokens (first tokens, ITLs, the finish) are stamped then, not at the step's end."""
    result = _pp_run()
    done = result.requests
    steps = result.steps
    ends = set((steps["start_s"] + steps["duration_s"]).round(12))
    first = done["first_token_s"].round(12)
    assert (~first.isin(ends)).any(), "some first tokens leave before their step ends"
    assert (done["first_token_s"] >= done["first_scheduled_s"]).all()
    assert (done["finish_s"] >= done["first_token_s"]).all()
    round_end = _pp_run(monkeypatch)  # the same schedule, every token at the round's end
    assert result.summary["num_steps"] == round_end.summary["num_steps"]
    assert result.summary["total_output_tokens"] == round_end.summary["total_output_tokens"]
    assert (done["first_token_s"] <= round_end.requests["first_token_s"]).all()
    assert result.summary["mean_ttft_ms"] < round_end.summary["mean_ttft_ms"]
    assert (done["finish_s"] <= round_end.requests["finish_s"]).all()
