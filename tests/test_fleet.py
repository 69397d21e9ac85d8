"""Heterogeneous fleets (simcore/fleet.py, `kvsim run --fleet`): replicas of several GPU types or TPs
behind one router, each with its own profile, KV cache and price."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.profiles import default_profile
from kvsim.simcore import ccore
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.config import resolve
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.fleet import fleet_cost_per_hour, parse_fleet, resolve_fleet
from kvsim.simcore.simulate import prepare, simulate
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload


def test_a_fleet_of_one_kind_is_the_same_run_as_dp():
    """Two H100 replicas given as a fleet run exactly as --dp 2 (same engines, router and requests),
    in the compiled core (csrc/fleet.c's per-replica configurations) as in the Python one."""
    model, gpu = get_model("llama3-8b"), get_gpu("H100")
    wl = load_workload("sharegpt", {"num_requests": 400, "rate": 30.0}, max_model_len=8192)
    groups = resolve_fleet(model, parse_fleet("H100-SXM-80GB:1:2"), EngineConfig())
    fleet = prepare(model, gpu, groups[0][0], wl, groups[0][1], seed=2, fleet=groups).run()
    dp = simulate(model, gpu, resolve(model, gpu, EngineConfig(data_parallel_size=2)), wl,
                  default_profile(gpu, model, 1), seed=2)
    assert fleet.requests.equals(dp.requests)
    assert fleet.record["engine_core"] == dp.record["engine_core"] == ("c" if ccore.library() else "python")
    python = prepare(model, gpu, groups[0][0], wl, groups[0][1], seed=2, fleet=groups, engine_core="python").run()
    # Python against C: bit for bit (a decode span cut by an arrival prices its steps as single steps do)
    assert python.requests.equals(dp.requests)


def test_each_replica_is_sized_and_priced_by_its_group():
    model = get_model("llama3-70b")
    groups = resolve_fleet(model, parse_fleet("H100-SXM-80GB:4:2,H200-141GB:2:1"), EngineConfig())
    wl = load_workload("sharegpt", {"num_requests": 300, "rate": 8.0}, max_model_len=8192)
    sim = prepare(model, groups[0][0].gpu, groups[0][0], wl, groups[0][1], seed=0, fleet=groups)
    result = sim.run()
    kv = [e.recorder.kv_capacity for e in sim.replicas]
    assert kv == [groups[0][0].memory.num_gpu_tokens] * 2 + [groups[1][0].memory.num_gpu_tokens]
    assert sim.replicas[0].latency is sim.replicas[1].latency is not sim.replicas[2].latency
    assert [g["gpu"] for g in result.record["fleet"]] == ["H100-SXM-80GB", "H200-141GB"]
    assert set(result.requests["replica"]) == {0, 1, 2} and result.summary["completed"] == 300
    assert fleet_cost_per_hour(groups, {"H100-SXM-80GB": 3.0, "H200-141GB": 4.0}) == pytest.approx(2 * 4 * 3 + 2 * 4)
    assert fleet_cost_per_hour(groups, {"H100-SXM-80GB": 3.0}) is None


@pytest.mark.parametrize(("text", "words"), [
    ("H100-SXM-80GB:4", "not GPU:TP:REPLICAS"), ("H100-SXM-80GB:four:2", "whole numbers"),
    ("H100-SXM-80GB:4:0", ">= 1"), ("", "give GPU:TP:REPLICAS")])
def test_malformed_fleets_are_refused(text, words):
    with pytest.raises(ConfigError, match=words):
        parse_fleet(text)


def test_a_group_that_does_not_fit_is_refused_before_any_run():
    with pytest.raises(ConfigError):
        resolve_fleet(get_model("llama3-70b"), parse_fleet("H100-SXM-80GB:1:2"), EngineConfig())


@pytest.mark.parametrize("extra", [["--gpu", "H200"], ["--tp", "2"], ["--dp", "2"],
                                   ["--autoscale", "--max-replicas", "3"], ["--autoscale", "--min-replicas", "3"]])
def test_fleet_cli_refuses_what_it_sets_itself(extra):
    result = CliRunner().invoke(app, ["run", "--fleet", "H100-SXM-80GB:1:2", "--num-requests", "5", *extra])
    assert result.exit_code != 0 and result.stderr.startswith("kvsim: error: ") and result.stderr.count("\n") == 1
    assert result.stdout == ""  # refused before anything is said or run


def test_fleet_cli_reports_each_group(tmp_path):
    result = CliRunner().invoke(app, ["run", "--model", "llama3-70b", "--fleet", "H100-SXM-80GB:4:2,H200-141GB:2:1",
                                      "--rate", "8", "--num-requests", "200", "--no-error-bars", "--out",
                                      str(tmp_path / "o")])
    assert result.exit_code == 0, result.stderr
    assert "on a fleet of 2 x TP4 H100-SXM-80GB + 1 x TP2 H200-141GB" in result.stdout
    assert "Fleet cost ($/h):                        32.00" in result.stdout
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert doc["record"]["fleet_usd_per_hour"] == 32.0 and len(doc["record"]["fleet"]) == 2
    assert doc["record"]["engine_core"] == ("c" if ccore.library() else "python")


def test_an_autoscaled_fleet_is_scaled_in_its_order_and_priced_per_group(tmp_path):
    """`--fleet A,B --autoscale`: the pool is the fleet (max replicas = its size), started in its
    order; each replica billed for its own GPUs at its group's price; static fleets of the first
    peak / mean replicas are the comparison, in $ (GPU-hours of different GPUs cost differently)."""
    day = tmp_path / "day.yaml"
    day.write_text("name: day\nnum_requests: 600\narrival: {process: diurnal, mean_rate: 12.0, peak_to_trough: 4.0, "
                   "period_s: 60, steps: 6}\nprompt_len: {dist: lognormal, mean: 161, cv: 1.0}\n"
                   "output_len: {dist: lognormal, mean: 338, cv: 1.0}\n")
    config = json.dumps({"target": 24, "interval_s": 5, "warmup_s": 0, "model_load_gbps": 100, "scale_down_cooldown_s": 30})
    result = CliRunner().invoke(app, ["run", "--model", "llama3-8b", "--fleet", "H100-SXM-80GB:1:2,A100-80GB:1:2",
                                      "--workload", str(day), "--autoscale", "--provisioning-delay", "0",
                                      "--autoscale-config", config, "--no-error-bars", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.stderr
    assert "Autoscaling: 1-4 replicas of the fleet, started in its order" in result.stdout
    assert "Fleet cost, every replica up ($/h):" in result.stdout  # what it pays is the Autoscaling block's
    fleet = json.loads((tmp_path / "o" / "summary.json").read_text())["autoscale"]
    assert fleet["config"]["max_replicas"] == 4 and len(fleet["replica_hours"]) == 4
    hours = fleet["replica_hours"]
    assert hours[0] == max(hours) > min(hours)  # the first H100 is up the whole run; not every replica was
    from kvsim.reports.prices import load_prices

    prices = load_prices()
    assert fleet["usd"] == pytest.approx(prices["H100-SXM-80GB"] * (hours[0] + hours[1])
                                         + prices["A100-80GB"] * (hours[2] + hours[3]))
    assert fleet["saving_basis"] == "usd" and [r["sized_for"] for r in fleet["static"]] == ["the peak", "the mean"]


def test_each_fleet_group_takes_its_own_gpus_step_limit_defaults():
    """The default engine fills vLLM V1's per-GPU limits on a fleet as on one GPU type: a one-kind
    fleet runs the limits --dp runs; an A100 group gets vLLM's A100 defaults beside an H100's."""
    base = ["run", "--num-requests", "30", "--rate", "10", "--no-error-bars"]
    mixed = CliRunner().invoke(app, [*base, "--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1"])
    assert mixed.exit_code == 0, mixed.stderr
    lines = [ln for ln in mixed.stdout.splitlines() if ln.startswith("Fleet group:")]
    assert lines[0].endswith("max_num_seqs 1024, max_num_batched_tokens 8192")
    assert lines[1].endswith("max_num_seqs 256, max_num_batched_tokens 2048")
    given = CliRunner().invoke(app, [*base, "--fleet", "H100-SXM-80GB:1:1,A100-80GB:1:1", "--max-num-seqs", "64"])
    assert all(ln.split("max_num_seqs ")[1].startswith("64,") for ln in given.stdout.splitlines()
               if ln.startswith("Fleet group:"))
    groups = resolve_fleet(get_model("llama3-8b"), parse_fleet("H100-SXM-80GB:1:2"), EngineConfig(),
                           frozenset({"max_num_seqs", "max_num_batched_tokens"}))
    assert groups[0][0].engine.max_num_seqs == 1024
