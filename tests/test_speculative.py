"""Speculative decoding: config parsing, acceptance sampling, the block math under rejection,
hand-computed steps, the memory plan, and which core runs it (tests/test_fastcore_speculative.py
holds the two cores equal)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore import fastcore
from kvsim.simcore.block_pool import PagedAllocator
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.config import resolve
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.simulate import prepare, simulate
from kvsim.simcore.specs import EngineConfig
from kvsim.simcore.speculative import SpeculativeConfig, parse_speculative_config, rate_for_length
from tests.helpers import ListWorkload, flat_profile, req

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]
STEP_MS = 2.0  # flat profile: 2 layers x 1 ms; attention, LM head and collectives ~0


def spec(text: str) -> SpeculativeConfig:
    return parse_speculative_config(text)


def run(requests, speculative: str | None, seed: int = 0, **config):
    cfg = EngineConfig(speculative_config=spec(speculative) if speculative else None, **config)
    return simulate(TINY, H100, cfg, ListWorkload(requests), flat_profile(), seed=seed)


# -- the config ------------------------------------------------------------------------------------
def test_config_reads_vllm_keys_and_infers_the_method_as_vllm_does():
    s = spec('{"model": "llama3-8b", "num_speculative_tokens": 4, "acceptance_rate": 0.6}')
    assert s.method == "draft_model" and s.rates == (0.6,) * 4
    assert spec('{"model": "[ngram]", "num_speculative_tokens": 2}').method == "ngram"
    rates = spec('{"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rates": [0.9, 0.5, 0.1]}')
    assert rates.rates == (0.9, 0.5, 0.1)
    assert rates.mean_acceptance_length() == pytest.approx(1 + 0.9 + 0.45 + 0.045)


@pytest.mark.parametrize("text, message", [
    ('{"method": "medusa", "num_speculative_tokens": 2}', "method must be one of"),
    ('{"method": "eagle", "num_speculative_tokens": 0}', "integer from 1 to 64"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "acceptance_rates": [0.5]}', "has 1 entries"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 0.5, "acceptance_rates": [1, 1]}', "not both"),
    ('{"method": "draft_model", "model": "llama3-8b", "num_speculative_tokens": 2}', "no published acceptance"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "dataset": "gsm8k"}', "no published acceptance for eagle"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}', "vLLM key kvsim does not model"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "temperature": 0}', "unknown key"),
    ('[1, 2]', "JSON object"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": "high"}', r"a number in \[0, 1\]"),
])
def test_bad_configs_say_what_is_wrong(text, message):
    with pytest.raises(ConfigError, match=message):
        spec(text)


def test_published_default_reproduces_its_acceptance_length():
    # EAGLE-3 on MT-Bench: length 3.53 at k=7 (vLLM issue 26191); the constant rate gives it back
    s = spec('{"method": "eagle3", "num_speculative_tokens": 7}')
    assert s.mean_acceptance_length() == pytest.approx(3.53, abs=1e-9)
    assert rate_for_length(2.08, 4) == pytest.approx(s.__class__("eagle", 4).rates[0])


def test_sampled_acceptance_matches_the_rates_and_is_seeded():
    s = spec('{"method": "eagle", "num_speculative_tokens": 3, "acceptance_rates": [0.8, 0.5, 0.25]}')
    drafts = np.full(200_000, 3)
    a = s.sample_accepted(np.random.default_rng(1), drafts)
    assert (a >= 1).mean() == pytest.approx(0.8, abs=0.005)
    assert (a >= 2).mean() == pytest.approx(0.4, abs=0.005)
    assert (a >= 3).mean() == pytest.approx(0.1, abs=0.005)
    assert np.array_equal(a, s.sample_accepted(np.random.default_rng(1), drafts))
    capped = s.sample_accepted(np.random.default_rng(1), np.full(200_000, 1))
    assert capped.max() == 1  # never more than the drafts a sequence had


# -- the block math --------------------------------------------------------------------------------
def test_truncate_frees_the_rejected_tail_blocks():
    alloc = PagedAllocator(num_gpu_blocks=8, block_size=4)
    assert alloc.append_slots(7, 6)  # prompt: 2 blocks, 6 slots
    assert alloc.append_slots(7, 1 + 5)  # last sampled token + 5 drafts: 12 slots, 3 blocks
    assert len(alloc.block_table(7)) == 3 and alloc.num_free_blocks == 5
    assert alloc.truncate(7, 6 + 1 + 1) == 1  # one draft accepted: 8 slots = 2 blocks, 1 freed
    assert alloc.num_tokens(7) == 8 and len(alloc.block_table(7)) == 2 and alloc.num_free_blocks == 6
    assert alloc.truncate(7, 7) == 0  # inside the last block: nothing to free
    assert alloc.num_gpu_tokens == 7
    gpu_refs, _ = alloc.ref_counts_from_tables()
    assert alloc.num_used_blocks == len(gpu_refs) == 2


def _checking_end_step(sim):
    """Wrap the policy's end_step: after every step each running request holds exactly the
    blocks of its computed tokens, and the pool's counts agree with the block tables."""
    engine = sim.engine
    policy, life = engine.policy, engine.lifecycle
    alloc = policy.allocator
    original = policy.end_step
    seen = {"verifies": 0, "rejected": 0}

    def end_step(plan, finished, queues):
        mem = original(plan, finished, queues)
        for st in life.running:
            if st in finished:
                continue
            assert alloc.num_tokens(st.request_id) == st.num_computed_tokens
            assert len(alloc.block_table(st.request_id)) == alloc.blocks_for(st.num_computed_tokens)
            assert st.num_tokens - st.num_computed_tokens == 1  # a plain decode next (or a prompt chunk)
        gpu_refs, _ = alloc.ref_counts_from_tables()
        assert alloc.num_used_blocks == len(gpu_refs)
        assert alloc.num_gpu_tokens == sum(alloc.num_tokens(st.request_id) for st in life.running
                                           if alloc.has_seq(st.request_id))
        if plan.spec is not None:
            seen["verifies"] += len(plan.spec.verify)
            seen["rejected"] += sum(d - a for d, a in plan.spec.verify.values())
        return mem

    policy.end_step = end_step
    return seen


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_block_math_holds_under_rejection_and_preemption(preemption_mode):
    requests = [req(i, 0.0005 * i, 7 + 3 * i, 20 + 5 * i) for i in range(8)]
    cfg = EngineConfig(block_size=4, num_gpu_blocks_override=40, max_model_len=128, preemption_mode=preemption_mode,
                       speculative_config=spec('{"method": "eagle", "num_speculative_tokens": 4, "acceptance_rate": 0.5}'))
    sim = prepare(TINY, H100, cfg, ListWorkload(requests), flat_profile(), seed=3)
    seen = _checking_end_step(sim)
    result = sim.run()
    assert result.summary["completed"] == 8
    assert result.requests["num_output_tokens"].tolist() == [20 + 5 * i for i in range(8)]
    assert result.summary["num_preemptions"] > 0  # 40 blocks of 4 cannot hold all eight
    assert seen["verifies"] > 0 and seen["rejected"] > 0
    assert sim.engine.policy.allocator.num_free_blocks == 40  # everything back at the end


def test_budget_and_max_num_seqs_count_verify_tokens():
    requests = [req(i, 0.0, 5, 30) for i in range(6)]
    cfg = EngineConfig(max_num_batched_tokens=10, max_num_seqs=4,
                       speculative_config=spec('{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.7}'))
    sim = prepare(TINY, H100, cfg, ListWorkload(requests), flat_profile(), seed=0)
    policy = sim.engine.policy
    schedule, plans = policy.schedule, []

    def recording(queues, now):
        plan = schedule(queues, now)
        if plan is not None:
            plans.append((plan.num_tokens + plan.spec.num_draft_tokens, plan.num_scheduled, len(plan.spec.verify)))
        return plan

    policy.schedule = recording
    assert sim.run().summary["completed"] == 6
    assert max(tokens for tokens, _, _ in plans) == 10  # the budget binds, verify tokens included
    assert all(tokens <= 10 and seqs <= 4 for tokens, seqs, _ in plans)
    assert any(verifies == 2 and seqs == 3 for _, seqs, verifies in plans)  # 4 + 4 + a trimmed third


# -- hand-computed steps (flat profile: a step is 2 ms, a head layer 1 ms) ------------------------
def _head_layers() -> float:
    # tiny: h 256, 4 x 64 query, 2 x 64 KV, MLP 688; EAGLE's fc is 2h x h
    layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 688
    return 1 + 2 * 256 * 256 / layer


def test_acceptance_one_emits_k_plus_one_tokens_per_step():
    # prompt 10, 9 tokens out, k = 3, every draft accepted: the prefill step emits 1, then two
    # verify steps emit 4 each (the last one drafts only the 3 tokens still to come)
    result = run([req(0, 0.0, 10, 9)], '{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 1.0}')
    step_s = (STEP_MS + 0.002) / 1000  # + n-gram lookup, 2 us for the one sequence
    r = result.requests.iloc[0]
    assert r.first_token_s == pytest.approx(step_s)
    assert r.finish_s == pytest.approx(3 * step_s)
    assert result.itl_s.tolist() == pytest.approx([step_s, step_s])  # one gap per burst of 4
    assert result.summary["mean_tpot_ms"] == pytest.approx(2 * step_s * 1000 / 8)
    assert result.summary["spec_mean_acceptance_length"] == pytest.approx(4.0)
    assert len(result.steps) == 3


def test_acceptance_zero_is_slower_than_no_speculation_by_the_draft_cost():
    # every verify emits one token, and each step also pays the EAGLE head's 3 passes of
    # head_layers x 1 ms (verify of 4 tokens costs what a decode costs on a flat profile)
    plain = run([req(0, 0.0, 10, 9)], None)
    slow = run([req(0, 0.0, 10, 9)], '{"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.0}')
    assert plain.summary["mean_tpot_ms"] == pytest.approx(STEP_MS)
    assert slow.summary["mean_tpot_ms"] == pytest.approx(STEP_MS + 3 * _head_layers(), rel=1e-6)
    assert slow.summary["spec_mean_acceptance_length"] == 1.0
    assert slow.summary["spec_draft_time_share"] == pytest.approx(3 * _head_layers() / (STEP_MS + 3 * _head_layers()),
                                                                   rel=1e-3)  # the prefill step drafts too
    assert slow.record["engine_core"] == "python"


def test_a_verify_step_is_priced_as_a_mixed_step_with_its_query_tokens():
    # Llama-3-70B TP 4 (committed profile): prompt 100, then one verify of 1 + 3 tokens at context
    # 100, every draft accepted; written out from the profile's tables, nothing from the pricer
    from kvsim.profiles import default_profile

    model = MODELS["llama3-70b"]
    profile = default_profile(H100, model, 4)
    lat = profile.latency_model()
    cfg = EngineConfig(tensor_parallel_size=4, speculative_config=spec(
        '{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 1.0}'))
    result = simulate(model, H100, cfg, ListWorkload([req(0, 0.0, 100, 5)]), profile)
    layers, occ = model.num_layers, lat.occupancy
    attention = occ.floor_ms + lat.prefill(4, 100) / occ.share([(4, 100)])
    verify_ms = (lat.host.per_step_ms + lat.host.per_seq_ms + layers * lat.linear(4) + lat.lm_head(4)
                 + layers * attention + lat.collectives_ms(4, 4))
    steps = result.steps
    assert len(steps) == 2  # the prompt (1 token out), then one verify that emits the other 4
    assert steps["duration_s"].iloc[1] * 1000 == pytest.approx(verify_ms + 0.002, rel=1e-12)
    assert steps["num_decode_tokens"].iloc[1] == 1  # the step table counts the verifying sequence once


def test_same_seed_same_run_other_seed_other_acceptance():
    requests = [req(i, 0.001 * i, 12, 40) for i in range(5)]
    text = '{"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.6}'
    a, b = run(requests, text, seed=4), run(requests, text, seed=4)
    assert a.summary == b.summary
    assert a.requests["finish_s"].tolist() == b.requests["finish_s"].tolist()
    assert run(requests, text, seed=5).summary["spec_num_accepted_tokens"] != a.summary["spec_num_accepted_tokens"]


# -- memory, the C core, the CLI -----------------------------------------------------------------
def test_draft_weights_and_kv_come_out_of_the_kv_plan():
    model = MODELS["llama3-70b"]
    plain = resolve(model, H100, EngineConfig(tensor_parallel_size=4)).memory
    eagle = resolve(model, H100, EngineConfig(tensor_parallel_size=4, speculative_config=spec(
        '{"method": "eagle", "num_speculative_tokens": 3}'))).memory
    draft = resolve(model, H100, EngineConfig(tensor_parallel_size=4, speculative_config=spec(
        '{"method": "draft_model", "model": "llama3-8b", "num_speculative_tokens": 3, "acceptance_rate": 0.7}'))).memory
    # EAGLE head: one 70B layer + a 2h x h fc, over TP 4; one more layer of KV per token
    head = model.layer_weight_bytes + 2 * model.hidden_size ** 2 * 2
    assert eagle.weights_bytes_per_gpu - plain.weights_bytes_per_gpu == head // 4
    assert eagle.kv_bytes_per_token == plain.kv_bytes_per_token * 81 // 80
    assert eagle.num_gpu_blocks < plain.num_gpu_blocks
    # a draft model: its weights over TP 4 and its own KV per token (Llama-3-8B: 32 layers, 2 KV heads per GPU)
    assert draft.draft_weights_bytes_per_gpu == MODELS["llama3-8b"].weight_bytes // 4
    assert draft.draft_kv_bytes_per_token == 2 * 32 * 2 * 128 * 2
    assert draft.num_gpu_blocks < eagle.num_gpu_blocks
    assert "draft_weights_gib_per_gpu" in draft.to_dict() and "draft_weights_gib_per_gpu" not in plain.to_dict()


def test_the_compiled_core_runs_speculation():
    from kvsim.workloads import load_workload

    cfg = EngineConfig(speculative_config=spec('{"method": "ngram", "num_speculative_tokens": 2}'))
    wl = load_workload("sharegpt", {"num_requests": 3, "rate": 1.0})
    sim = prepare(TINY, H100, cfg, wl, flat_profile(), seed=0)
    assert fastcore.unsupported(sim) == ""
    ran = prepare(TINY, H100, cfg, wl, flat_profile(), engine_core="c").run()
    assert ran.record["engine_core"] == "c" and ran.summary["spec_num_drafts"] > 0
    assert sim.run().summary == ran.summary  # auto picks the core: the same run
    replicas = prepare(TINY, H100, EngineConfig(data_parallel_size=2, speculative_config=cfg.speculative_config),
                       wl, flat_profile(), seed=0)
    assert fastcore.unsupported(replicas) == ""


def test_refused_combinations():
    s = spec('{"method": "eagle", "num_speculative_tokens": 2}')
    with pytest.raises(ConfigError, match="pipeline parallelism"):
        resolve(MODELS["llama3-70b"], H100, EngineConfig(tensor_parallel_size=4, pipeline_parallel_size=2,
                                                         speculative_config=s))
    with pytest.raises(ConfigError, match="chunked"):
        resolve(TINY, H100, EngineConfig(enable_chunked_prefill=False, speculative_config=s))
    with pytest.raises(ConfigError, match="applies only to"):
        resolve(TINY, H100, EngineConfig(policy="static", speculative_config=s))


def test_cli_reports_acceptance_and_speedup():
    result = CliRunner().invoke(app, [
        "run", "--model", "llama3-8b", "--num-requests", "12", "--rate", "2", "--input-len", "64",
        "--output-len", "32", "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 2}',
        "--compare-no-spec"])
    assert result.exit_code == 0, result.output
    assert "Mean acceptance length:" in result.output and "Speed-up vs no speculation" in result.output
    bad = CliRunner().invoke(app, ["run", "--num-requests", "2", "--speculative-config", "{"])
    assert bad.exit_code == 2 and "not valid JSON" in bad.output
    alone = CliRunner().invoke(app, ["run", "--num-requests", "2", "--compare-no-spec"])
    assert alone.exit_code == 2 and "only with --speculative-config" in alone.output


def test_sweep_takes_speculation_as_a_dimension(tmp_path):
    out = tmp_path / "sweep.csv"
    result = CliRunner().invoke(app, [
        "sweep", "--model", "llama3-8b", "--num-requests", "20", "--rate", "4", "--input-len", "64",
        "--output-len", "48", "-j", "1", "--out", str(out), "--speculative-config",
        '[null, {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.9}]'])
    assert result.exit_code == 0, result.output
    import pandas as pd

    rows = pd.read_csv(out)
    assert rows["speculative_config"].tolist() == ["off", "eagle k=3 r=0.90"]
    off, on = rows["mean_tpot_ms"].tolist()
    assert on < off / 2  # 90% acceptance over 3 drafts: ~3.4 tokens a step
    assert rows["spec_mean_acceptance_length"].iloc[1] > 3
    dup = CliRunner().invoke(app, ["sweep", "--num-requests", "5", "--speculative-config", "[null, null]"])
    assert dup.exit_code == 2 and "listed twice" in dup.output


def test_plan_bounds_allow_k_plus_one_tokens_per_step():
    from kvsim.profiles import default_profile
    from kvsim.reports.plan import Candidate, single_step_bounds

    model = MODELS["llama3-8b"]
    profile = default_profile(H100, model, 1)
    prompts, outputs = np.array([100, 200]), np.array([50, 60])
    plain = single_step_bounds(Candidate(model, H100, EngineConfig(), ()), profile, prompts, outputs)
    eagle = single_step_bounds(Candidate(model, H100, EngineConfig(speculative_config=spec(
        '{"method": "eagle", "num_speculative_tokens": 3}')), ()), profile, prompts, outputs)
    assert eagle.tpot_p95_ms == pytest.approx(plain.tpot_p95_ms / 4)  # never prunes what speculation can reach
    assert eagle.ttft_p95_ms == pytest.approx(plain.ttft_p95_ms)


def test_crossing_rate_interpolates_where_the_speedup_falls_through_one():
    from kvsim.reports.speculation import crossing_rate, speedup_vs

    rows = [{"rate": 1.0, "speedup_mean_tpot_ms": 1.8}, {"rate": 10.0, "speedup_mean_tpot_ms": 1.2},
            {"rate": 20.0, "speedup_mean_tpot_ms": 0.8}]
    assert crossing_rate(rows) == pytest.approx(15.0)
    assert crossing_rate(rows[:2]) is None
    vs = speedup_vs({"mean_tpot_ms": 10.0, "output_throughput": 300.0}, {"mean_tpot_ms": 20.0, "output_throughput": 200.0})
    assert vs["speedup_mean_tpot_ms"] == 2.0 and vs["speedup_output_throughput"] == 1.5


def test_each_replica_records_its_own_step_costs():
    # two replicas price steps that interleave in time: each step row's cost parts add up to it
    requests = [req(i, 0.0003 * i, 10 + i, 12 + 2 * i) for i in range(8)]
    result = run(requests, '{"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.6}',
                 data_parallel_size=2)  # n-gram host time grows with the batch: steps differ in cost
    steps = result.steps
    assert set(steps["replica"]) == {0, 1}
    parts = steps["kernels_ms"] + steps["collectives_ms"] + steps["host_ms"]
    assert np.allclose(parts, steps["duration_s"] * 1000, rtol=1e-12, atol=0)
    assert 0 < result.summary["spec_draft_time_share"] < 1


def test_num_speculative_tokens_is_bounded():
    """k = 100,000 would run a step's sequential draft passes for hours: refused up front, one line."""
    result = CliRunner().invoke(app, ["run", "--num-requests", "5", "--speculative-config",
                                      '{"method": "eagle", "num_speculative_tokens": 100000}'])
    assert result.exit_code == 2 and "from 1 to 64" in result.stderr and result.stderr.count("\n") == 1


def test_saved_itls_are_one_gap_per_burst(tmp_path):
    """--save-result's per-request itls count a speculative step's burst once (one streamed chunk in
    vLLM's client), as the summary's pooled ITLs do: no zero gaps inside a burst."""
    import json

    result = CliRunner().invoke(app, [
        "run", "--num-requests", "10", "--rate", "5", "--input-len", "32", "--output-len", "24",
        "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.8}',
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json"])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    itls = [np.asarray(x) for x in doc["itls"]]
    assert all((x > 0).all() for x in itls)
    assert sum(len(x) for x in itls) < sum(n - 1 for n in doc["output_lens"])  # bursts: fewer gaps than tokens
    for x, lat, ttft in zip(itls, doc["latencies"], doc["ttfts"], strict=True):
        assert abs(x.sum() - (lat - ttft)) < 1e-9
    pooled = np.concatenate(itls)
    assert abs(pooled.mean() * 1000 - doc["mean_itl_ms"]) < 1e-6  # the gaps the summary pools


DRAFT = '{"method": "draft_model", "model": "llama3-8b", "num_speculative_tokens": 3, "acceptance_rate": 0.7}'


COMMON = ["--model", "llama3-70b", "--tp", "4", "--gpu", "H100-SXM-80GB", "--input-len", "64", "--output-len", "32"]


# A draft_model config is priced from the draft's own profile wherever runs are made
# (profiles.draft_profile): --find-max-rate, a sweep dimension and a plan dimension, in the compiled core.
def test_draft_model_in_the_rate_search():
    import json

    found = CliRunner().invoke(app, ["run", *COMMON, "--num-requests", "40", "--rate", "2", "--slo-tpot-p95-ms", "40",
                                     "--find-max-rate", "--tolerance", "0.2", "--speculative-config", DRAFT, "--json"])
    assert found.exit_code == 0, found.output
    doc = json.loads(found.stdout)
    assert doc["max_sustainable_rate"] > 0 and {r["engine_core"] for r in doc["runs"]} == {"c"}


def test_draft_model_as_a_sweep_dimension(tmp_path):
    import pandas as pd

    out = tmp_path / "sweep.csv"
    swept = CliRunner().invoke(app, ["sweep", *COMMON, "--num-requests", "30", "--rate", "4", "-j", "1", "--out",
                                     str(out), "--speculative-config", f"[null, {DRAFT}]"])
    assert swept.exit_code == 0, swept.output
    rows = pd.read_csv(out)
    assert rows["engine_core"].tolist() == ["c", "c"]
    off, on = rows["mean_tpot_ms"].tolist()
    assert on < off and rows["spec_mean_acceptance_length"].iloc[1] > 1.5


def test_draft_model_as_a_plan_dimension(tmp_path):
    import json

    planned = CliRunner().invoke(app, ["plan", *COMMON, "--rate", "2", "--slo-tpot-p95-ms", "40", "--search-requests",
                                       "60", "--confirm-requests", "60", "--speculative-config", f"[null, {DRAFT}]",
                                       "--out", str(tmp_path / "plan")])
    assert planned.exit_code == 0, planned.output
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    labels = {c.get("speculative_config") for c in plan["candidates"]}
    assert any(label and label.startswith("draft_model llama3-8b k=3") for label in labels), labels
    assert {c["engine_core"] for c in plan["candidates"] if c.get("engine_core")} == {"c"}


def test_a_draft_profile_follows_its_targets_scaling():
    """A plan at a confidence (or its SLO probability's re-runs) scales the target's step times:
    the draft model's are scaled by the same factor, nothing else gets a draft profile."""
    from kvsim.profiles import default_profile, draft_profile
    from kvsim.profiles.uncertainty import scaled_profile

    model, gpu = MODELS["llama3-70b"], H100
    config = EngineConfig(tensor_parallel_size=4, speculative_config=spec(DRAFT))
    target = default_profile(gpu, model, 4)
    plain = draft_profile(gpu, config, target)
    assert plain.data == default_profile(gpu, MODELS["llama3-8b"], 4).data
    slow = draft_profile(gpu, config, scaled_profile(target, 1.5))
    assert slow.step_time_factor == 1.5 and slow.data == scaled_profile(plain, 1.5).data
    assert draft_profile(gpu, EngineConfig(speculative_config=spec('{"method": "eagle", "num_speculative_tokens": 2}'))) is None
