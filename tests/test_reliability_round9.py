"""Reliability, round 9: an adversarial pass over the full-batch capacity and its `overloaded`
verdict (fleets, disaggregation, prefix caching), the rate searches of `kvsim run
--find-max-rate` and `kvsim plan`, and vLLM 0.6's multi-step rounds in both cores. Each test is
named after the case it found. Same style as test_reliability_round8."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsim.simcore import ccore
from tests.helpers import assert_one_line_error, invoke_cli

invoke = invoke_cli
V06 = ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "8", "--num-requests", "5",
       "--rate", "5", "--engine-version", "vllm-0.6", "--no-error-bars"]


# --- vLLM 0.6's multi-step rounds ---------------------------------------------------------------


@pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")
def test_multi_step_rounds_with_some_requests_sampling_n_agree_in_both_cores():
    """A trace mixing n = 1 and n = 2 requests on vLLM 0.6's multi-step rounds: the Python engine
    rejects the groups (continuous_v0.check), the C core queued them and stopped ("the C engine
    core stopped with code -2", a traceback)."""
    from tests.test_fastcore_equivalence import _compare
    from tests.test_fastcore_seqgroups import _random_case

    config, workload = _random_case(np.random.default_rng(7003))
    config = dataclasses.replace(config, engine_version="vllm-0.6", enable_chunked_prefill=False, data_parallel_size=1,
                                 max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len))
    n = workload.chunk.n
    assert (n > 1).any() and (n == 1).any()
    core, _ = _compare(config, workload, seed=3, context="vllm-0.6 with n > 1")
    assert core.summary["rejected"] == int((n > 1).sum())


@pytest.mark.parametrize("flag", ["--n", "--beam-width"])
def test_multi_step_rounds_with_n_flag_refused_before_the_run(flag):
    """--n 2 / --beam-width 2 with vllm-0.6 (no chunked prefill): every request was rejected after
    the whole run, a benchmark table of zeros printed, then an error (the C core: a traceback)."""
    assert_one_line_error(invoke("run", *V06, flag, "2"), f"{flag} 2 with --engine-version vllm-0.6",
                          "one sequence per request")
    ok = invoke("run", *V06, flag, "2", "--enable-chunked-prefill")  # no rounds modelled there
    assert ok.exit_code == 0, ok.stderr


# --- the full-batch capacity ------------------------------------------------------------------


def _json_run(*args: str) -> dict:
    import json

    result = invoke("run", "--json", "--no-error-bars", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


FLEET = ["--dataset-name", "random", "--random-input-len", "512", "--random-output-len", "128",
         "--fleet", "H100-SXM-80GB:1:1,A100-40GB:1:1"]


def test_a_round_robin_fleet_is_as_fast_as_its_slowest_replica():
    """Round-robin hands the A100 half the arrivals: the fleet overloads at 40 req/s (it completes
    ~32) while its capacity read 60.4 req/s, the groups' sum (right for a load-aware router)."""
    rr = _json_run(*FLEET, "--rate", "40", "--num-requests", "1500", "--router", "round-robin")
    assert rr["saturation"] == "overloaded"
    assert rr["full_batch_capacity"] <= 1.06 * rr["request_throughput"]
    least = _json_run(*FLEET, "--rate", "40", "--num-requests", "1500")
    assert least["saturation"] == "sustained" and least["full_batch_capacity"] > 1.4 * rr["full_batch_capacity"]


def test_a_disaggregated_prefill_pool_prefills_only_what_its_prefix_cache_misses():
    """Sonnet prompts sharing most of their tokens: the prefill pool sustains 40 req/s, yet the
    capacity priced every prompt token (20.2 req/s), half of what the run completed."""
    doc = _json_run("--prefill-replicas", "1", "--decode-replicas", "1", "--dataset-name", "sonnet",
                    "--sonnet-input-len", "2000", "--sonnet-prefix-len", "1800", "--sonnet-output-len", "20",
                    "--num-requests", "800", "--rate", "40")
    assert doc["saturation"] == "sustained" and doc["pools"]["prefill"]["prefix_cache_hit_rate"] > 0.5
    assert doc["full_batch_capacity"] >= doc["completed_rate_warm"]


# --- rate searches ----------------------------------------------------------------------------


def test_a_rate_search_started_far_above_the_answer_still_finds_it():
    """`kvsim run --find-max-rate --rate 1e9`: every run down to start / 256 was overloaded and
    the search said "No rate meets the SLO" for a replica that sustains ~150 req/s. An overload
    says the rate is too high, not that the deployment sustains nothing: it halves on."""
    from kvsim.reports.capacity import SLO, max_sustainable_rate
    from tests.test_capacity import known_max_rate, toy_evaluate

    slo = SLO(ttft_p95_ms=10 + 500)
    far = max_sustainable_rate(toy_evaluate(slo), slo, start_rate=1e6, tolerance=0.03)
    near = max_sustainable_rate(toy_evaluate(slo), slo, start_rate=3.0, tolerance=0.03)
    assert far.max_rate == near.max_rate > 0
    assert far.max_rate <= known_max_rate(0.5) < far.max_rate * 1.03


def test_a_rate_search_that_fails_when_idle_still_stops():
    """The other side: an SLO no load meets still ends at start / 256 (latency, not overload)."""
    from kvsim.reports.capacity import MAX_HALVINGS, SLO, max_sustainable_rate
    from tests.test_capacity import toy_evaluate

    slo = SLO(ttft_p95_ms=1.0)  # a step alone takes 10 ms
    found = max_sustainable_rate(toy_evaluate(slo), slo, start_rate=100.0, tolerance=0.03)
    assert found.max_rate == 0 and "TTFT p95" in found.binding
    assert min(p.rate for p in found.points) >= 100.0 / 2**MAX_HALVINGS / 1.03


def test_a_plan_whose_confirmations_all_fail_says_so():
    """90 replicas confirming 3,000 req/s with 300 requests cannot be judged: the table's row said
    "confirmation failed", the answer "nothing meets the SLO. no candidate was searched"."""
    import json

    result = invoke("plan", "--gpu", "H100-SXM-80GB", "--tp", "1", "--slo-tpot-p95-ms", "50", "--search-requests",
                    "300", "--confirm-requests", "300", "--rate", "3000", "--json")
    assert result.exit_code == 0, result.stderr
    answer = json.loads(result.stdout)["answers"][0]
    assert answer["best"] is None
    assert "no candidate was searched" not in answer["why_none"]
    assert "failed their confirming run" in answer["why_none"] and "run more requests" in answer["why_none"]
    assert "--confirm-requests: raise it" in answer["why_none"]


def test_plan_bounds_price_the_candidates_engine_version():
    """plan --engine-version vllm-v1-async: the single-step bounds were priced at vllm-v1's host
    cost, so one replica's "upper bound" (36.5 req/s) sat under the 43 req/s its search found, and
    a candidate could be cut as "cost bound" by a bound it beats (vllm-0.6 likewise)."""
    from kvsim.profiles import default_profile
    from kvsim.reports.capacity import SLO
    from kvsim.reports.plan import SearchTask, assess, default_dimensions, expand, run_search
    from kvsim.simcore.catalog import get_model
    from kvsim.simcore.specs import ENGINE_PRESETS, EngineConfig
    from kvsim.workloads import load_workload

    base = EngineConfig(engine_version="vllm-v1-async", **ENGINE_PRESETS["vllm-v1-async"])
    (c,) = expand(get_model("llama3-8b"), default_dimensions(["H100-SXM-80GB"], [1]), base)
    spec = load_workload("sharegpt", {"rate": 10, "num_requests": 600})
    (a,) = assess([c], spec, 600, SLO(), {"H100-SXM-80GB": 1.0}, 0,
                  lambda c: default_profile(c.gpu, c.config.resolve_model(c.model), 1))
    found = run_search(SearchTask(c, a.profile, spec, 600, 0, SLO(), 30.0, 0.04, 1e6, 0.0))
    assert 0 < found.max_rate <= a.bounds.rate_ub


def test_multi_step_rounds_compute_a_short_request_to_its_rounds_end():
    """vLLM 0.6, 4-token outputs: each request holds its slot for a 10-step round though it decodes
    3 tokens. The capacity counted 3 steps (302 req/s) and a run offered 300 that completes 274
    was `sustained`; priced by whole rounds it is 275.7 and the run is overloaded."""
    doc = _json_run("--engine-version", "vllm-0.6", "--dataset-name", "random", "--random-input-len", "128",
                    "--random-output-len", "4", "--rate", "300", "--num-requests", "6000")
    assert doc["full_batch_capacity"] <= 1.03 * doc["request_throughput"]
    assert doc["saturation"] == "overloaded" and doc["capacity_exceeded"] is True


# --- warnings ----------------------------------------------------------------------------------

SWAP = ["--preemption-mode", "swap", "--rate", "5", "--num-requests", "30", "--input-len", "32", "--output-len", "4"]


def test_a_sweep_prints_a_warning_with_semicolons_whole():
    """The V1 swap warning has clauses split by "; ", the separator of a sweep row's warnings: the
    sweep printed it as three WARNING lines, each a fragment."""
    result = invoke("sweep", *SWAP, "--jobs", "1")
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert len(lines) == 1 and "vLLM issue #18115), so no V1 release ran this; kvsim swaps as V0 did" in lines[0]


def test_a_disaggregated_run_says_each_warning_once():
    """Both pools carry the run's configuration warnings: each was printed (and in JSON) twice."""
    doc = _json_run(*SWAP, "--prefill-replicas", "1", "--decode-replicas", "1")
    assert len(doc["warnings"]) == len(set(doc["warnings"])) == 1


# --- the load verdict -----------------------------------------------------------------------------


def _trace_with_long_prompts(path) -> str:
    """2,000 requests at 10 req/s (an 8B H100 serves ~35), every third prompt past max_model_len."""
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(0.1, 2000))
    rows = [f"{a - t[0]:.6f},{9000 if i % 3 == 0 else 200},50" for i, a in enumerate(t)]
    path.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n" + "\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("bounded", [False, True])
def test_rejected_requests_leave_the_system_as_they_arrive(tmp_path, monkeypatch, bounded):
    """A third of the trace rejected (prompts past max_model_len): the rejected rows counted as
    requests in the system forever, a fill growing at a third of the rate, so a light load was
    `n/a` ("still filling") and --find-max-rate said no rate meets the SLO, even 1 req/s."""
    import kvsim.simcore.records as records

    if bounded:  # past the kept rows: the verdict from block sums
        monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 100)
    doc = _json_run("--workload", _trace_with_long_prompts(tmp_path / "t.csv"))
    assert doc["rejected"] == 667 and doc["saturation"] == "sustained" and not doc["still_filling"]
    assert doc["offered_rate"] == pytest.approx(doc["completed_rate_warm"], rel=0.05)  # the accepted load
    if not bounded:
        found = invoke("run", "--workload", str(tmp_path / "t.csv"), "--no-error-bars", "--find-max-rate")
        assert found.exit_code == 0 and "Max sustainable rate:" in found.stdout, found.stdout


def test_a_run_that_served_nothing_is_not_called_sustained(tmp_path):
    """Every request rejected (a sweep prints the point's row anyway): its load read `sustained`."""
    import json

    rows = [f"{0.2 * i:.3f},9000,8" for i in range(100)]
    (tmp_path / "t.csv").write_text("arrival_s,num_prompt_tokens,num_output_tokens\n" + "\n".join(rows) + "\n")
    result = invoke("sweep", "--workload", str(tmp_path / "t.csv"), "--jobs", "1", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    (row,) = doc["points"]
    assert row["output_tok_s"] in (None, 0, 0.0) and row["load"] == "n/a"


def test_a_workload_whose_every_request_samples_n_is_refused_on_multi_step_rounds(tmp_path):
    """A workload file with n: 2 on vllm-0.6: every request rejected after the run (a table of
    zeros, then an error); refused before it, as --n 2 is."""
    spec = tmp_path / "n2.yaml"
    spec.write_text("name: n2\nnum_requests: 20\narrival: {process: poisson, rate: 4.0}\n"
                    "prompt_len: {dist: fixed, value: 64}\noutput_len: {dist: fixed, value: 8}\nn: 2\n")
    assert_one_line_error(invoke("run", "--workload", str(spec), "--engine-version", "vllm-0.6", "--no-error-bars"),
                          "the workload's n 2 with --engine-version vllm-0.6")


def test_a_disaggregated_plan_that_finds_nothing_says_why():
    """The aggregated answer names what binds; the disaggregated one said only "no disaggregated
    candidate meets the SLO" (JSON: no reason at all)."""
    import json

    args = ["plan", "--gpu", "H100-SXM-80GB", "--tp", "1", "--disagg", "on", "--disagg-ratios", "1:1",
            "--rate", "5", "--slo-tpot-p95-ms", "1"]
    text = invoke(*args)
    assert text.exit_code == 0, text.stderr
    assert "no disaggregated candidate meets the SLO: 1 candidate(s), e.g. decode time: one decode step" in text.stdout
    doc = json.loads(invoke(*args, "--json").stdout)
    assert "decode time" in doc["disagg"]["answers"][0]["why_none"]


def test_sweep_and_plan_say_whether_vllm_06_rounds_are_modelled():
    """`kvsim run` says "multi-step: 10-step host cost only, no rounds with chunked prefill"; a sweep
    or plan on vllm-0.6 said only "engine vllm-0.6" (rounds or not)."""
    tiny = ["--rate", "5", "--num-requests", "30", "--input-len", "32", "--output-len", "4", "--jobs", "1"]
    on = invoke("sweep", "--engine-version", "vllm-0.6", "--enable-chunked-prefill", *tiny)
    off = invoke("sweep", "--engine-version", "vllm-0.6", *tiny)
    assert "engine vllm-0.6 (multi-step: 10-step host cost only, no rounds with chunked prefill)" in on.stdout
    assert "engine vllm-0.6 (multi-step: decode rounds of 10 steps)" in off.stdout
    plan = invoke("plan", "--gpu", "H100-SXM-80GB", "--tp", "1", "--rate", "5", "--slo-tpot-p95-ms", "50",
                  "--engine-version", "vllm-0.6", "--chunked-prefill", "on,off", "--search-requests", "200",
                  "--confirm-requests", "300")
    assert plan.exit_code == 0, plan.stderr
    assert "multi-step: decode rounds of 10 steps without chunked prefill, the host cost only with it" in plan.stdout


def test_a_prefill_only_workload_has_a_capacity(tmp_path):
    """Every output one token: no request decodes and the capacity was None, so 85 req/s of
    512-token prompts (the engine completes 78) was `sustained` and --find-max-rate answered
    82.8 req/s. The engine only prefills: its capacity is its prompts per second at full steps."""
    spec = tmp_path / "o1.yaml"
    spec.write_text("name: o1\nnum_requests: 1000\narrival: {process: poisson, rate: 4.0}\n"
                    "prompt_len: {dist: fixed, value: 512}\noutput_len: {dist: fixed, value: 1}\n")
    doc = _json_run("--workload", str(spec), "--rate", "85", "--num-requests", "6000")
    assert doc["full_batch_capacity"] == pytest.approx(doc["request_throughput"], rel=0.03)
    assert doc["saturation"] == "overloaded" and doc["capacity_exceeded"] is True


def test_a_vllm_06_serve_command_runs_multi_step_scheduling():
    """A plan on vllm-0.6 priced 10-step multi-step scheduling (and its decode rounds), but its
    `vllm serve` line left out --num-scheduler-steps, whose vLLM 0.6 default is 1."""
    from kvsim.reports.serve_command import vllm_serve_command
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.specs import ENGINE_PRESETS, EngineConfig

    model, gpu = get_model("llama3-8b"), get_gpu("H100-SXM-80GB")
    v06 = EngineConfig(engine_version="vllm-0.6", **ENGINE_PRESETS["vllm-0.6"])
    assert "--num-scheduler-steps 10" in vllm_serve_command(model, gpu, v06)
    assert "--num-scheduler-steps" not in vllm_serve_command(model, gpu, EngineConfig())


def test_a_v0_era_serve_command_uses_that_version_s_flags():
    """vLLM 0.5 / 0.6 had no `--no-enable-chunked-prefill` / `--no-enable-prefix-caching` (argparse
    would stop the server), took chunked prefill as `--enable-chunked-prefill [True|False]` and
    defaulted it off below 32K context: a chunked vllm-0.6 plan's serve line left the flag out and ran
    without it, and an unchunked one did not start."""
    import shlex

    from kvsim.reports.serve_command import vllm_serve_command
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.specs import ENGINE_PRESETS, EngineConfig

    model, gpu = get_model("llama3-8b"), get_gpu("H100-SXM-80GB")
    for version in ("vllm-v0", "vllm-0.6"):
        preset = {**ENGINE_PRESETS[version], "engine_version": version}
        on = shlex.split(vllm_serve_command(model, gpu, EngineConfig(**{**preset, "enable_chunked_prefill": True})))
        off = shlex.split(vllm_serve_command(model, gpu, EngineConfig(**{**preset, "enable_chunked_prefill": False})))
        assert "--enable-chunked-prefill" in on and "--enable-chunked-prefill=False" in off
        assert not any(w.startswith("--no-") for w in on + off)
    v1 = shlex.split(vllm_serve_command(model, gpu, EngineConfig(enable_chunked_prefill=False)))
    assert "--no-enable-chunked-prefill" in v1
