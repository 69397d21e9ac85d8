"""`kvsim plan`: monotone answers, pruning that says which constraint binds, the CLI's outputs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.capacity import SLO, max_sustainable_rate, simulator
from kvsim.reports.plan import default_dimensions, plan
from kvsim.reports.prices import load_prices
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload
from tests.helpers import flat_profile
from tests.test_capacity import toy

FAST = {"search_requests": 100, "confirm_requests": 150, "tolerance": 0.15}


def small_workload():
    return load_workload("sharegpt", {"rate": 10, "input_len": 256, "output_len": 64, "num_requests": 150})


def run_plan(targets, slo, gpus=("H100-SXM-80GB", "A100-80GB"), tps=(1, 2), model="llama3-8b"):
    dims = default_dimensions(list(gpus), list(tps))
    return plan([get_model(model)], dims, EngineConfig(), list(targets), small_workload(), slo,
                load_prices(), **FAST)


def best_gpus(result) -> list[int | None]:
    return [a["best"]["gpus"] if a["best"] else None for a in result.answers]


def test_a_higher_target_never_needs_fewer_gpus():
    slo = SLO(ttft_p95_ms=150, tpot_p95_ms=12)
    result = run_plan([10, 30, 60, 90, 150], slo, gpus=("H100-SXM-80GB",))
    gpus = best_gpus(result)
    assert None not in gpus and gpus == sorted(gpus) and gpus[-1] > gpus[0]
    # across GPU types the plan minimises cost, which never falls as the target rises (GPU
    # counts need not rise: two cheap A100s can beat one H100 at a low rate and lose at a higher one)
    mixed = run_plan([10, 30, 60, 90], slo, tps=(2,))
    costs = [a["best"]["usd_per_hour"] for a in mixed.answers]
    assert costs == sorted(costs)


def test_a_looser_slo_never_needs_more_gpus():
    slos = [SLO(ttft_p95_ms=100, tpot_p95_ms=9), SLO(ttft_p95_ms=400, tpot_p95_ms=20)]
    gpus = [best_gpus(run_plan([90], slo, gpus=("H100-SXM-80GB",)))[0] for slo in slos]
    assert None not in gpus and gpus[1] < gpus[0]
    costs = [run_plan([60], slo, tps=(2,)).answers[0]["best"]["usd_per_hour"] for slo in slos]
    assert costs[1] <= costs[0]


def test_a_faster_gpu_with_the_same_memory_never_sustains_less():
    slo = SLO(ttft_p95_ms=10 + 500)
    model, gpu = get_model("tiny"), get_gpu("H100-SXM-80GB")
    config = EngineConfig(max_num_seqs=1, enable_prefix_caching=False)
    rates = [max_sustainable_rate(simulator(model, gpu, config, toy(), flat_profile(linear_ms=ms), 0, slo),
                                  slo, 5.0, 0.02).max_rate for ms in (6.0, 4.0)]
    assert rates == sorted(rates) and rates[0] < rates[-1]
    # catalog GPUs: H100 (79.19 GiB) is faster than A100-80GB (79.15 GiB) at the same TP
    from kvsim.profiles import default_profile

    slo, model, spec = SLO(ttft_p95_ms=150, tpot_p95_ms=15), get_model("llama3-8b"), small_workload()
    config = EngineConfig(tensor_parallel_size=2)
    r1 = {}
    for name in ("A100-80GB", "H100-SXM-80GB"):
        gpu = get_gpu(name)
        evaluate = simulator(model, gpu, config, spec, default_profile(gpu, model, 2), 0, slo)
        r1[name] = max_sustainable_rate(evaluate, slo, 20.0, 0.15).max_rate
    assert r1["H100-SXM-80GB"] >= r1["A100-80GB"] > 0


def test_when_nothing_meets_the_slo_it_says_which_constraint_binds():
    decode = run_plan([10], SLO(tpot_p95_ms=1.0), tps=(1,))
    assert decode.answers[0]["best"] is None and "decode time binds" in decode.answers[0]["why_none"]
    assert decode.num_runs == 0  # pruned by the single-step bound, nothing simulated
    prefill = run_plan([10], SLO(ttft_p95_ms=1.0), tps=(1,))
    assert "prefill time binds" in prefill.answers[0]["why_none"]
    memory = run_plan([10], SLO(ttft_p95_ms=1000), gpus=("A100-40GB",), tps=(1, 2), model="llama3-70b")
    assert "memory binds" in memory.answers[0]["why_none"] and "--tp 4 would fit" in memory.answers[0]["why_none"]


def test_prices_are_overridable_and_checked(tmp_path):
    assert load_prices(["H100-SXM-80GB=3.5"])["H100-SXM-80GB"] == 3.5
    f = tmp_path / "p.yaml"
    f.write_text("A100-40GB: 1.1\nh200: 5\n")
    prices = load_prices([str(f)])
    assert prices["A100-40GB"] == 1.1 and prices["H200-141GB"] == 5.0
    for bad in (["H100-SXM-80GB=-1"], ["B300=2"], ["H100-SXM-80GB=cheap"], [str(tmp_path / "none.yaml")]):
        with pytest.raises(ConfigError):
            load_prices(bad)


PLAN = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB,A100-80GB", "--tp", "1,2",
        "--input-len", "256", "--output-len", "64", "--search-requests", "100", "--confirm-requests", "150",
        "--tolerance", "0.15", "--slo-ttft-p95-ms", "150", "--slo-tpot-p95-ms", "12"]


def test_plan_cli_prints_a_ranked_table_and_an_answer_and_writes_files(tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, [*PLAN, "--rate", "20,60", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert "replicas x TP" in text and "$/M out tok" in text and text.count("Answer: ") == 2
    assert (out / "plan.csv").exists() and (out / "plan.json").exists() and (out / "capacity.png").exists()
    doc = json.loads((out / "plan.json").read_text())
    assert doc["answers"][0]["best"]["confirmed"].startswith("yes")


def test_plan_cli_json_is_only_json():
    result = CliRunner().invoke(app, [*PLAN, "--rate", "20", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["answers"][0]["best"]["gpus"] >= 1 and doc["prices_as_of"]


@pytest.mark.parametrize("args, needle", [
    (["--rate", "-1"], "--rate must be > 0"),
    (["--rate", "10", "--gpu", "B300"], "unknown GPU"),
    (["--rate", "10", "--price", "H100-SXM-80GB=x"], "price of H100-SXM-80GB"),
    (["--rate", "10", "--goodput", "ttft"], "KEY:VALUE"),
    (["--rate", "10", "--tp", "3"], "--tp must be a power of two"),
    (["--rate", "10", "--chunked-prefill", "maybe"], "on or off"),
    (["--rate", "10", "--search-requests", "5"], "--search-requests"),
    (["--rate", "10", "--workload", "nope"], "unknown workload"),
])
def test_plan_bad_input_is_one_line(args, needle):
    result = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1", *args])
    assert result.exit_code == 2, result.stdout
    assert needle in result.stderr and result.stderr.count("\n") == 1 and result.stdout == ""


def test_parallel_searches_give_the_same_answer():
    args = [*PLAN, "--rate", "30", "--json"]
    one = json.loads(CliRunner().invoke(app, args).stdout)["answers"][0]["best"]
    two = json.loads(CliRunner().invoke(app, [*args, "--jobs", "2"]).stdout)["answers"][0]["best"]
    assert {k: one[k] for k in ("gpu", "tp", "replicas", "max_rate")} == {k: two[k] for k in ("gpu", "tp", "replicas", "max_rate")}


def test_plan_searches_kv_dtype_quantization_and_pipeline_stages_and_counts_tp_x_pp_gpus():
    """FP8 and PP are plan dimensions: a replica costs TP x PP GPUs, and a GPU that cannot run a
    candidate (FP8 weights on an A100) is marked unsupported instead of stopping the plan."""
    dims = default_dimensions(["H100-SXM-80GB", "A100-80GB"], [1], kv_cache_dtype=["auto", "fp8"],
                              quantization=[None, "fp8"], pipeline_parallel_size=[1, 2])
    result = plan([get_model("llama3-8b")], dims, EngineConfig(), [10], small_workload(), SLO(tpot_p95_ms=200),
                  load_prices(), **FAST)
    table = result.table
    unsupported = table[table["status"].astype(str).str.startswith("unsupported")]
    assert set(unsupported["gpu"]) == {"A100-80GB"} and set(unsupported["quantization"]) == {"fp8"}
    assert len(unsupported) == 4  # 2 KV dtypes x 2 PP sizes
    ok = table[table["status"] == "ok"]
    assert len(ok) and (ok["gpus"] == ok["replicas"] * ok["tp"] * ok["pipeline_parallel_size"]).all()
    assert set(ok["kv_cache_dtype"]) == {"auto", "fp8"}
    best = result.answers[0]["best"]
    assert best["usd_per_hour"] == min(ok["usd_per_hour"])


def test_every_candidate_dropped_on_cost_really_costs_more_and_only_the_answer_is_confirmed():
    """The cheapest-first order only saves runs: a candidate stopped at its floor (or by its
    throughput bound), searched in full without a floor, needs at least the answer's cost."""
    import math

    from kvsim.reports.plan import SearchTask, run_search

    slo, target = SLO(ttft_p95_ms=150, tpot_p95_ms=12), 60
    result = run_plan([target], slo, tps=(1, 2))
    best = result.answers[0]["best"]
    dropped = [a for a in result.assessments["llama3-8b"] if a.status == "cost bound"]
    assert dropped, "nothing was dropped: the test would show nothing"
    for a in dropped:
        task = SearchTask(a.candidate, a.profile, small_workload(), FAST["search_requests"], 0, slo, 5.0,
                          FAST["tolerance"], 2 * target, 0.0)
        full = run_search(task)
        cost = math.inf if full.max_rate <= 0 else a.cost_per_hour(math.ceil(target / full.max_rate))
        assert cost >= best["usd_per_hour"], (a.candidate.label, full.max_rate)
    confirmed = result.table[result.table["confirmed"] != "-"]
    assert len(confirmed) == 1 and str(confirmed.iloc[0]["confirmed"]).startswith("yes")


def test_plan_progress_is_the_shared_live_progress_with_plain_lines_off_a_terminal(monkeypatch):
    import kvsim.cli.output

    monkeypatch.setattr(kvsim.cli.output.LiveProgress.__init__, "__defaults__", (0.0,))  # a line per update
    result = CliRunner().invoke(app, [*PLAN, "--rate", "20", "--json"])
    assert result.exit_code == 0, result.stderr
    lines = [x for x in result.stderr.splitlines() if x.startswith("planning: ")]
    assert lines and "candidates searched" in lines[-1] and "elapsed" in lines[-1]
    json.loads(result.stdout)  # stdout stays pure JSON


def test_plan_never_reports_a_capacity_its_confirmation_disproved(monkeypatch):
    """Issue 24: a confirmation that needed an extra replica showed that one replica fewer misses the
    target, so the reported capacity of n replicas is capped below target x n / (n - 1); a failed
    confirmation claims none. Forced here by making every confirmation add one replica."""
    import kvsim.reports.plan as plan_module

    real = plan_module.confirm

    def one_more(a, replicas, target, spec_confirm, seed, slo):
        n, summary, reasons = real(a, replicas + 1, target, spec_confirm, seed, slo)
        return n, summary, reasons

    monkeypatch.setattr(plan_module, "confirm", one_more)
    result = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1",
                                      "--rate", "30", "--slo-ttft-p95-ms", "1000", "--slo-tpot-p95-ms", "60",
                                      "--search-requests", "300", "--confirm-requests", "400", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = [r for r in doc["candidates"] if str(r.get("confirmed", "-")).startswith("yes")]
    assert rows
    for row in rows:
        n = row["replicas"]
        assert row["max_rate"] <= 30 * n / (n - 1) + 1e-9 and row["headroom"] <= 1 / (n - 1) + 1e-9
        assert "max_rate_bound" in row


def test_a_failed_confirmation_claims_no_capacity():
    from kvsim.reports.plan import _bound_by_confirmation

    row = {"max_rate": 50.0, "headroom": 0.5}
    _bound_by_confirmation(row, 30.0, 3, True, 2)
    assert row["max_rate"] is None and row["headroom"] is None
    row = {"max_rate": 50.0, "headroom": 50 / 30 - 1, "capped": True}
    _bound_by_confirmation(row, 30.0, 3, False, 1)
    assert row["max_rate"] == pytest.approx(45.0) and row["capped"] is False
    row = {"max_rate": 40.0, "headroom": 40 / 30 - 1}
    _bound_by_confirmation(row, 30.0, 3, False, 0)  # confirmed at once: the search's figure stands
    assert row["max_rate"] == 40.0
