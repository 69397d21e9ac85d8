"""Reliability, round 9 (leftovers of round 8): one KV-cache dtype spelled two ways in a list, MTP
speculation on a model without MTP layers, `calibrate --out` keeping an earlier fit's profiles, the
Python API taking a profile made for another TP, and a calibrated async-engine profile that lost
its hidden CPU work. Each test failed before its fix. Same style as test_reliability_round8."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from kvsim.profiles import PROFILE_DIR, default_profile
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.specs import EngineConfig
from kvsim.simcore.speculative import parse_speculative_config
from tests.helpers import assert_one_line_error, invoke_cli

TINY_RUN = ["--num-requests", "5", "--rate", "5", "--input-len", "32", "--output-len", "4", "--no-error-bars"]
SWEEP = ["sweep", "--num-requests", "5", "--input-len", "32", "--output-len", "4", "--jobs", "1"]
H100, H200, TINY = GPUS["H100-SXM-80GB"], GPUS["H200-141GB"], MODELS["tiny"]
MTP = '{"method": "mtp", "num_speculative_tokens": 1}'
EXAMPLE = Path(__file__).resolve().parents[1] / "profiles" / "examples" / "synthetic-h100-llama2-70b.csv"

invoke = invoke_cli


def _workload():
    from kvsim.workloads import load_workload

    return load_workload("fixed-batch", {"num_requests": 4, "input_len": 32, "output_len": 4}, max_model_len=2048)


# --- 1. a KV-cache dtype spelled two ways -------------------------------------------------------


def test_sweep_refuses_fp8_and_fp8_e4m3_as_two_points():
    """`sweep --kv-cache-dtype fp8,fp8_e4m3` ran two points of one configuration: vLLM's "fp8" is
    fp8_e4m3 on CUDA (vllm/config/cache.py, CacheConfig.cache_dtype)."""
    result = invoke(*SWEEP, "--rate", "2", "--kv-cache-dtype", "fp8,fp8_e4m3")
    assert_one_line_error(result, "--kv-cache-dtype", "fp8_e4m3 is listed twice", "fp8 is fp8_e4m3")


@pytest.mark.parametrize("extra", [[], ["--disagg", "on"]])
def test_plan_refuses_fp8_and_fp8_e4m3_as_two_candidates(extra):
    result = invoke("plan", "--rate", "2", "--gpu", "H100-SXM-80GB", "--tp", "1",
                    "--kv-cache-dtype", "fp8_e4m3,auto,fp8", *extra)
    assert_one_line_error(result, "--kv-cache-dtype", "fp8_e4m3 is listed twice")


def test_distinct_kv_cache_dtypes_still_make_a_list():
    from kvsim.cli.sweep_cmd import _lists

    lists = _lists(None, "H100-SXM-80GB", None, None, None, None, None, None, None,
                   kv_cache_dtype="auto,fp8,fp8_e5m2")
    assert lists["kv_cache_dtype"] == ["auto", "fp8", "fp8_e5m2"]  # each as the user spelled it


# --- 2. MTP on a model without MTP layers -------------------------------------------------------


def test_run_refuses_mtp_on_a_model_without_mtp_layers():
    """`run --model llama3-8b --speculative-config '{"method": "mtp", ...}'` ran, priced as if Llama
    had DeepSeek's MTP module; vLLM finds no MTP layers in that checkpoint and refuses it."""
    result = invoke("run", *TINY_RUN, "--model", "llama3-8b", "--speculative-config", MTP)
    assert_one_line_error(result, "llama3-8b has no multi-token-prediction layers",
                          "draft_model, ngram, eagle, eagle3")


def test_sweep_refuses_mtp_on_a_model_without_mtp_layers():
    result = invoke(*SWEEP, "--rate", "2", "--model", "llama3-8b", "--speculative-config", f"[null, {MTP}]")
    assert_one_line_error(result, "llama3-8b has no multi-token-prediction layers")


def test_plan_refuses_mtp_on_a_model_without_mtp_layers():
    """A plan with `[null, mtp]` planned the null candidates and marked the MTP ones "unsupported"
    (or, with MTP alone, said so only after pruning): refused up front, naming the model."""
    result = invoke("plan", "--rate", "2", "--gpu", "H100-SXM-80GB", "--tp", "1", "--speculative-config",
                    f"[null, {MTP}]")
    assert_one_line_error(result, "llama3-8b has no multi-token-prediction layers")


def test_the_api_refuses_mtp_on_a_model_without_mtp_layers_and_takes_it_on_deepseek():
    from kvsim.simcore.config import resolve

    config = EngineConfig(speculative_config=parse_speculative_config(MTP))
    with pytest.raises(ConfigError, match="tiny has no multi-token-prediction layers"):
        resolve(TINY, H100, config)
    deepseek = MODELS["deepseek-v3"]
    assert deepseek.num_nextn_predict_layers == 1  # huggingface.co/deepseek-ai/DeepSeek-V3 config.json
    resolve(deepseek, H200, replace(config, tensor_parallel_size=8))
    resolve(replace(TINY, num_nextn_predict_layers=1), H100, config)


def test_a_hf_config_says_whether_the_model_has_mtp_layers(tmp_path):
    from kvsim.simcore.catalog import get_model

    cfg = {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 688,
           "vocab_size": 1024, "num_key_value_heads": 2}
    for name, extra, layers in (("plain", {}, 0), ("mtp", {"num_nextn_predict_layers": 1}, 1),
                                ("qwen35", {"mtp_num_hidden_layers": 2}, 2)):
        path = tmp_path / name / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps({**cfg, **extra}))
        assert get_model(str(path)).num_nextn_predict_layers == layers
    path = tmp_path / "bad" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**cfg, "num_nextn_predict_layers": -1}))
    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        get_model(str(path))


# --- 3. calibrate --out keeps only this fit ----------------------------------------------------


def test_calibrate_out_holds_only_this_fits_profiles(tmp_path):
    """`calibrate --tp 2,4,8 --out d`, then `calibrate --tp 4 --out d`: d kept the first fit's TP 2
    and TP 8 profiles beside the second fit's TP 4. An earlier fit's profiles go; the user's own
    files (and a measured profile copied there) stay."""
    out = tmp_path / "d"
    args = ["calibrate", str(EXAMPLE), "--model", "llama2-70b", "--gpu", "H100", "--out", str(out)]
    assert invoke(*args, "--tp", "2,4,8").exit_code == 0
    (out / "notes.txt").write_text("mine")
    (out / "mine-tp2.json").write_text('{"not": "a kvsim profile"}')
    committed = "H100-SXM-80GB-llama3-8b-tp1.json"
    shutil.copy(PROFILE_DIR / committed, out / committed)
    result = invoke(*args, "--tp", "4")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "H100-SXM-80GB-llama2-70b-tp4.json", committed, "mine-tp2.json", "notes.txt"]
    assert (out / "mine-tp2.json").read_text() == '{"not": "a kvsim profile"}'


# --- 4. the Python API and a profile of another TP ---------------------------------------------


def test_simulate_refuses_a_profile_made_for_another_tp():
    """simulate(config at TP 2, profile of TP 1) priced TP 2 steps with TP 1 tables (no collectives,
    a whole model's GEMMs per GPU); `kvsim run --profile` refused it."""
    from kvsim.simcore.errors import ProfileError
    from kvsim.simcore.simulate import simulate

    profile = default_profile(H100, TINY, 1)
    with pytest.raises(ConfigError, match="profile is for --tp 1, but the run uses --tp 2") as caught:
        simulate(TINY, H100, EngineConfig(tensor_parallel_size=2), _workload(), profile)
    assert isinstance(caught.value, ProfileError)  # as the CLI's check raised it
    result = simulate(TINY, H100, EngineConfig(), _workload(), profile)
    assert result.summary["completed"] == 4


# --- 5. a calibrated vllm-v1-async profile keeps its hidden CPU work -----------------------------


def test_calibrated_async_profile_carries_the_engines_hidden_terms(tmp_path):
    """`calibrate --engine-version vllm-v1-async` wrote host terms without hidden_per_step_ms /
    hidden_per_seq_ms: a run with the profile priced the CPU work vLLM overlaps with the GPU as
    if nothing were hidden (or lost it). Now: the fitted visible terms plus that engine's default
    hidden terms at each TP, said in the provenance; the fit priced rows with them."""
    from kvsim.profiles.host import engine_hidden

    out = tmp_path / "d"
    result = invoke("calibrate", str(EXAMPLE), "--model", "llama2-70b", "--gpu", "H100", "--tp", "2,8",
                    "--engine-version", "vllm-v1-async", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    for tp in (2, 8):
        doc = json.loads((out / f"H100-SXM-80GB-llama2-70b-tp{tp}.json").read_text())
        step, seq = engine_hidden("vllm-v1-async", tp)
        assert (step, seq) != (0.0, 0.0)
        assert doc["host_overhead"]["hidden_per_step_ms"] == step
        assert doc["host_overhead"]["hidden_per_seq_ms"] == seq
        hidden = doc["provenance"]["calibration"]["hidden_terms"]
        assert hidden["hidden_per_step_ms"] == step and "not fitted" in hidden["how"]
    # the profile prices the rows as the fit did: `profile check` on the fitted profile reproduces
    # the fitted values (the hidden work shows on the first step, which has nothing to hide behind)
    check = invoke("profile", "check", str(EXAMPLE), "--profile", str(out / "H100-SXM-80GB-llama2-70b-tp2.json"),
                   "--engine-version", "vllm-v1-async", "--json")
    assert check.exit_code == 0, check.stderr
    fit = json.loads((out / "H100-SXM-80GB-llama2-70b-tp2.json").read_text())["provenance"]["calibration"]
    fitted = {(r["line"], r["quantity"]): r["fitted_ms"] for r in fit["residuals"]}
    for row in json.loads(check.stdout)["rows"]:
        assert row["kvsim_ms"] == pytest.approx(fitted[(row["line"], row["quantity"])], rel=1e-6)


def test_calibrating_a_synchronous_engine_adds_no_hidden_terms(tmp_path):
    out = tmp_path / "d"
    result = invoke("calibrate", str(EXAMPLE), "--model", "llama2-70b", "--gpu", "H100", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    doc = json.loads((out / "H100-SXM-80GB-llama2-70b-tp2.json").read_text())
    assert "hidden_per_step_ms" not in doc["host_overhead"]
    assert "hidden_terms" not in doc["provenance"]["calibration"]


# --- the adversarial pass over calibrate and profile check -------------------------------------

HEADER = "tp,batch_size,input_len,output_len,prefill_ms,decode_ms,latency_ms\n"


@pytest.mark.parametrize("content, needle", [
    ("", "is empty; it needs a header row: tp, batch_size, input_len, output_len"),  # was: missing column 'tp'
    (HEADER + "2,1,128\n", ":2: fewer values than columns (3 of 7)"),  # was: output_len '' is not a number
    ("tp;batch_size;input_len;output_len;prefill_ms\n2;1;128;32;40\n",
     "columns separated by ';'; kvsim reads comma-separated values"),  # was: missing column 'tp'
])
@pytest.mark.parametrize("command", ["calibrate", "check"])
def test_malformed_measurements_say_what_is_wrong(tmp_path, content, needle, command):
    path = tmp_path / "m.csv"
    path.write_text(content)
    if command == "calibrate":
        result = invoke("calibrate", str(path), "--model", "llama2-70b", "--gpu", "H100", "--out", str(tmp_path / "o"))
    else:
        result = invoke("profile", "check", str(path), "--profile", "H100-SXM-80GB-llama2-70b-tp2")
    assert_one_line_error(result, needle)
    assert not (tmp_path / "o").exists()


def test_a_measurements_file_past_the_cap_is_named_as_one(tmp_path):
    """(was: "larger than the 16 MiB kvsim reads from a measurements")"""
    path = tmp_path / "m.csv"
    with path.open("w") as f:
        f.write(HEADER)
        f.truncate(17 << 20)
    result = invoke("calibrate", str(path), "--model", "llama2-70b", "--gpu", "H100", "--out", str(tmp_path / "o"))
    assert_one_line_error(result, "larger than the 16 MiB kvsim reads from a measurements file")


def test_calibrate_free_names_each_scalar_once(tmp_path):
    """`--free s_gemm,s_gemm` was read as `--free s_gemm`; a list option names a value once (round 8)."""
    result = invoke("calibrate", str(EXAMPLE), "--model", "llama2-70b", "--gpu", "H100", "--free", "s_gemm,s_gemm",
                    "--out", str(tmp_path / "o"))
    assert_one_line_error(result, "--free: 's_gemm' is listed twice")
    assert not (tmp_path / "o").exists()
