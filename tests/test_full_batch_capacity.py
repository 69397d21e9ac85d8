"""The full-batch capacity (simcore.full_batch): the step model's steady state at the engine's
fullest batch, against what the simulator itself completes when offered more, and the verdict it
settles (simcore.metrics.judge_capacity): a mild overload inside a 1,024-sequence batch shows no
queue and fills too slowly for the fill test, so a run of a few thousand requests was `sustained`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app

RUN = ["run", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--json", "--no-error-bars"]


def _summary(*args: str) -> dict:
    result = CliRunner().invoke(app, [*RUN, *args])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("args", [
    ("--rate", "40", "--num-requests", "10000"),  # V1 defaults: 1,024 sequences, the cache binds first
    ("--rate", "19", "--num-requests", "6000", "--engine-version", "vllm-v0"),  # 256 sequences, no chunked prefill
    ("--rate", "18", "--num-requests", "6000", "--gpu", "A100-80GB"),  # vLLM's A100 defaults: 256 / 2048
])
def test_the_capacity_is_what_the_simulator_completes_when_offered_more(args):
    doc = _summary(*args)
    assert doc["saturation"] == "overloaded"
    capacity = doc["full_batch_capacity"]
    # offered ~1.15x of it: the steady state is the same step model, so it lands on the simulated
    # rate (a short overloaded run completes a little more while its queue builds; V0's prompt
    # batches stall the decodes unevenly, a little less)
    assert 0.97 * doc["completed_rate_warm"] <= capacity <= 1.06 * doc["completed_rate_warm"]


def test_a_mild_overload_inside_the_batch_is_overloaded():
    doc = _summary("--rate", "36", "--num-requests", "2000")  # ~1.05x the ~34.5 req/s capacity
    assert doc["queue_wait_slope"] < 0.05 and not doc["still_filling"]  # neither older test sees it
    assert doc["in_system_slope"] < 0.25 * doc["offered_rate"]
    assert doc["saturation"] == "overloaded" and doc["capacity_exceeded"] is True
    assert doc["offered_rate"] > 1.03 * doc["full_batch_capacity"]
    text = CliRunner().invoke(app, [*RUN[:-2], "--rate", "36", "--num-requests", "2000", "--no-error-bars"]).stdout
    assert "OVERLOADED (offered more than the full-batch capacity" in text
    err = CliRunner().invoke(app, [*RUN[:-2], "--rate", "36", "--num-requests", "2000", "--no-error-bars"]).stderr
    capacity, seqs = doc["full_batch_capacity"], doc["full_batch_seqs"]
    assert (f"WARNING overloaded: {doc['offered_rate']:.2f} req/s offered, above the full-batch capacity "
            f"{capacity:.2f} ({seqs:,} sequences per step)") in err
    assert "Full-batch capacity, model (req/s):" in text


def test_a_load_under_the_capacity_stays_sustained():
    doc = _summary("--rate", "30", "--num-requests", "2000")
    assert doc["saturation"] == "sustained" and doc["capacity_exceeded"] is False
    assert doc["full_batch_capacity"] > 30
    # a replica more doubles it (the router spreads the load)
    two = _summary("--rate", "30", "--num-requests", "2000", "--dp", "2")
    assert two["full_batch_capacity"] == pytest.approx(2 * doc["full_batch_capacity"], rel=0.02)


def test_prefix_cache_hits_are_not_prefilled():
    """Shared prefixes hit the cache: the capacity prices only the prompt tokens computed."""
    off = _summary("--workload", "shared-prefix", "--num-requests", "400", "--rate", "5", "--no-enable-prefix-caching")
    on = _summary("--workload", "shared-prefix", "--num-requests", "400", "--rate", "5", "--enable-prefix-caching")
    assert on["prefix_cache_hit_rate"] > 0.3
    assert on["full_batch_capacity"] > 1.05 * off["full_batch_capacity"]


def test_both_cores_give_the_same_capacity():
    c = _summary("--rate", "36", "--num-requests", "800", "--engine-core", "c")
    py = _summary("--rate", "36", "--num-requests", "800", "--engine-core", "python")
    assert c["full_batch_capacity"] == py["full_batch_capacity"] and c["full_batch_seqs"] == py["full_batch_seqs"]
    assert c["saturation"] == py["saturation"]


def test_runs_it_does_not_describe_carry_no_capacity():
    assert "full_batch_capacity" not in _summary("--policy", "static", "--rate", "2", "--num-requests", "200")
    assert "full_batch_capacity" not in _summary("--rate", "2", "--num-requests", "200", "--n", "2")


def test_a_fleets_groups_add_up():
    """One H100 (V1 defaults 1,024 / 8,192) and one A100 (256 / 2,048) behind least-loaded."""
    h100 = _summary("--rate", "2", "--num-requests", "300")["full_batch_capacity"]
    a100 = _summary("--rate", "2", "--num-requests", "300", "--gpu", "A100-80GB")["full_batch_capacity"]
    result = CliRunner().invoke(app, ["run", "--model", "llama3-8b", "--json", "--no-error-bars", "--fleet",
                                      "H100-SXM-80GB:1:1,A100-80GB:1:1", "--rate", "2", "--num-requests", "300"])
    assert result.exit_code == 0, result.stderr
    fleet = json.loads(result.stdout)
    assert fleet["full_batch_capacity"] == pytest.approx(h100 + a100, rel=1e-9)  # the same requests


def test_pipeline_stages_run_rounds_of_micro_batches():
    """With --pp 2 a step is simcore.pipeline's round: the capacity lands on what the run completes."""
    over = _summary("--pp", "2", "--rate", "65", "--num-requests", "12000")
    assert over["saturation"] == "overloaded"
    assert 0.95 * over["completed_rate_warm"] <= over["full_batch_capacity"] <= 1.06 * over["completed_rate_warm"]


def test_speculative_steps_verify_and_draft_and_emit_the_acceptance_length():
    """Each decode step is the verify of 1 + d tokens plus the drafter's passes and emits the run's
    mean acceptance length per sequence: EAGLE k = 3 on 70B TP 4 serves ~13.8 req/s at its fullest
    batch, less than without speculation (17.0): at a full batch the drafts cost more than they save."""
    spec = '{"method": "eagle", "num_speculative_tokens": 3}'
    # offered ~1.15x, long enough for the batch to reach its limit (a verify step's time grows
    # with the batch nearly in proportion, so the fill is slow: 2,500 requests at 20 req/s end
    # while it still fills, and complete only 11.5 req/s)
    over = _summary("--model", "llama3-70b", "--tp", "4", "--rate", "16", "--num-requests", "8000",
                    "--speculative-config", spec)
    assert over["saturation"] == "overloaded"
    assert 0.97 * over["completed_rate_warm"] <= over["full_batch_capacity"] <= 1.06 * over["completed_rate_warm"]
    plain = _summary("--model", "llama3-70b", "--tp", "4", "--rate", "2", "--num-requests", "300")
    assert over["full_batch_capacity"] < plain["full_batch_capacity"]


def test_plan_does_not_promise_more_than_the_capacity():
    """The planner's TTFT-only answer for 60 req/s of 8B: before, one replica `sustained` ~36.9 req/s
    of a ~34.5 capacity (in-batch overload, no queue); now no replica is planned above it by more
    than the verdict's margin."""
    result = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1",
                                      "--rate", "60", "--slo-ttft-p95-ms", "1000", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    best = doc["answers"][0]["best"]
    one = _summary("--rate", "30", "--num-requests", "600")  # the search's own request count
    assert best["replicas"] == 2  # 60 req/s is not one H100's, nor was it (31 completed per s)
    assert best["replica_max_rate"] <= 1.03 * one["full_batch_capacity"] * 1.04  # + the search's grid step


def test_a_disaggregated_run_carries_its_slower_pools_capacity():
    """Prefill pool: prompts per second at full steps; decode pool: its full-batch decode rate. The
    azure-conv prompts (~1k tokens) make 70B's one TP 4 prefill instance the slower pool."""
    args = ["--model", "llama3-70b", "--prefill-replicas", "1", "--prefill-tp", "4", "--decode-replicas", "1",
            "--decode-tp", "4", "--workload", "azure-conv"]
    over = _summary(*args, "--rate", "14", "--num-requests", "3000")
    assert over["saturation"] == "overloaded"
    assert 0.97 * over["completed_rate_warm"] <= over["full_batch_capacity"] <= 1.08 * over["completed_rate_warm"]
    under = _summary(*args, "--rate", "8", "--num-requests", "1500")
    assert under["saturation"] == "sustained" and under["full_batch_capacity"] > 8


LONG_PROMPT = ("name: long-system-prompt\nnum_requests: 1000\narrival: {process: poisson, rate: 2.0}\n"
               "shared_prefix: {num_groups: 1, prefix_len: 4096, fraction: 1.0}\n"
               "prompt_len: {dist: lognormal, mean: 161, cv: 1.0}\noutput_len: {dist: lognormal, mean: 338, cv: 1.0}\n")


def test_running_sequences_hold_a_shared_prefix_once(tmp_path):
    """One 4,096-token system prompt at 25% memory (24,112 KV tokens): every running sequence
    references the prompt's blocks, so the cache holds ~60 sequences, not 24,112 / ~4,400 = 5
    (capacity 1.56 req/s before, while an overloaded run completes ~5.6)."""
    spec = tmp_path / "long.yaml"
    spec.write_text(LONG_PROMPT)
    over = _summary("--workload", str(spec), "--gpu-memory-utilization", "0.25", "--rate", "7", "--num-requests", "3000")
    assert over["saturation"] == "overloaded"
    assert over["full_batch_seqs"] > 40
    # what the steady state leaves out: the overloaded cache's recompute preemptions (benchmarks/README.md)
    assert 0.97 * over["completed_rate_warm"] <= over["full_batch_capacity"] <= 1.1 * over["completed_rate_warm"]


def test_a_preempted_requests_prefix_hits_count_once(monkeypatch):
    """A request preempted by recompute is admitted again and hits its prefix again; the prefill
    share counted every admission's hits against the prompts once (below zero, clamped: no prefill
    priced at all). Each request's prompt is its 1,024 shared tokens plus ~161 computed ones."""
    import kvsim.simcore.full_batch as fb

    seen = []
    real = fb.full_batch_capacity
    monkeypatch.setattr(fb, "full_batch_capacity", lambda *a, **k: seen.append(a[5]) or real(*a, **k))
    doc = _summary("--workload", "shared-prefix", "--gpu-memory-utilization", "0.25", "--rate", "9.7",
                   "--num-requests", "3000")
    assert doc["num_preemptions"] > 3000  # every request readmitted once on average, at least
    (share,) = seen
    assert 0.1 < share < 0.2


def test_hits_per_admission_times_one_admission_per_request():
    from kvsim.simcore.full_batch import SharedPrefix, cache_batch, first_admission_hits

    assert first_admission_hits(3000, 2, 1) == 2000 and first_admission_hits(0, 0, 0) == 0.0
    # 10 sequences of 100 tokens, 60 of them a shared prefix held once: 40 each + 60
    assert cache_batch(460, 100, SharedPrefix(60.0, 60)) == 10 and cache_batch(460, 100, None) == 4
    # 8 prefixes, 2 sequences: ~1.9 of them in use (8 (1 - (7/8)^2) = 1.875), not all 8
    assert SharedPrefix(60.0, 60, 8).held_once(2) == pytest.approx(1.875 * 60)


def test_a_small_batch_holds_only_the_prefixes_it_uses():
    """shared-prefix at 23% memory (11,136 KV tokens): ~9 sequences run, drawing ~5.5 of the 8
    system prompts; held as all 8 (8,192 tokens) the cache left room for 7 (capacity 2.35 req/s
    before, 2.96 completed)."""
    over = _summary("--workload", "shared-prefix", "--gpu-memory-utilization", "0.23", "--rate", "3.8",
                    "--num-requests", "3000")
    assert over["saturation"] == "overloaded" and over["full_batch_seqs"] >= 9
    # (N of 9 or 10 moves it ~10%: the batch's mean context is this run's requests')
    assert 0.95 * over["completed_rate_warm"] <= over["full_batch_capacity"] <= 1.1 * over["completed_rate_warm"]


def test_plan_refuses_a_workload_every_request_of_which_rounds_reject(tmp_path):
    """vLLM 0.6's decode rounds run one sequence per request: a plan on a workload whose every
    request samples n = 2 ended "load not judged"; refused up front, as `kvsim run` refuses it."""
    spec = tmp_path / "n2.yaml"
    spec.write_text("name: n2\nnum_requests: 20\narrival: {process: poisson, rate: 4.0}\n"
                    "prompt_len: {dist: fixed, value: 64}\noutput_len: {dist: fixed, value: 8}\nn: 2\n")
    result = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--rate", "5",
                                      "--workload", str(spec), "--engine-version", "vllm-0.6",
                                      "--slo-tpot-p95-ms", "200"])
    assert result.exit_code != 0 and not result.stdout
    assert result.stderr.strip().count("\n") == 0
    assert "the workload's n 2 with --engine-version vllm-0.6" in result.stderr
