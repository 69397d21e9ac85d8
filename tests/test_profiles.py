"""Roofline generator, the efficiency fit, committed profiles, lookup and `profile compare`."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.profiles import check_profile_matches, default_profile, find_profile_path
from kvsim.profiles.generate import COMMITTED_GPUS, MODEL_NAMES, TPS, fits
from kvsim.profiles.lookup import PROFILE_DIR, dtype_tag, profile_dtypes
from kvsim.profiles.roofline import (
    EFFICIENCY_FILE,
    build_roofline_profile,
    decode_attention_ms,
    linear_layer_ms,
    load_efficiency,
)
from kvsim.simcore.catalog import GPUS, get_gpu, get_model
from kvsim.simcore.errors import ProfileError
from kvsim.simcore.latency import StepLatencyModel, load_profile, parse_profile

H100, L8 = get_gpu("H100-SXM-80GB"), get_model("llama3-8b")


def test_roofline_profile_is_valid_and_sane():
    doc = build_roofline_profile(H100, get_model("llama3-70b"), 4)
    profile = parse_profile(doc)
    assert profile.source == "roofline" and "roofline" in profile.label
    m = StepLatencyModel(doc)
    by_batch = [m.step_time_s(b, [], b, b * 1024, b) for b in (1, 8, 64, 256)]
    by_ctx = [m.step_time_s(32, [], 32, 32 * c, 32) for c in (128, 1024, 8192)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    assert by_ctx == sorted(by_ctx) and by_ctx[0] < by_ctx[-1]
    assert m.extrapolated.steps == 0


def test_tp4_linear_faster_than_tp1():
    eff = load_efficiency()
    for tokens in (1, 128, 4096):
        assert linear_layer_ms(H100, L8, 4, tokens, eff) < linear_layer_ms(H100, L8, 1, tokens, eff)


def test_block_size_costs_per_block_and_padding():
    eff = load_efficiency()
    aligned = [decode_attention_ms(H100, L8, 1, 64, 4096, bs, eff) for bs in (8, 16, 32)]
    assert aligned == sorted(aligned, reverse=True)  # fewer blocks, fewer per-block costs
    # the per-block cost is the vLLM paper's 20-26% paging overhead at block size 16
    base = replace(eff, gemm_floor_ms=0.0)
    at16 = decode_attention_ms(H100, L8, 1, 64, 4096, 16, base)
    ideal = decode_attention_ms(H100, L8, 1, 64, 4096, 1 << 20, base) * 4096 / (1 << 20)
    assert 1.15 < at16 / ideal < 1.3
    short = [decode_attention_ms(H100, L8, 1, 64, 100, bs, eff) for bs in (32, 128)]
    assert short[1] > short[0]  # the padded last block of 128 is read and masked


def test_collectives_carry_the_measured_h100_table():
    from kvsim.profiles.collectives import collectives_for, load_fit

    fit = load_fit()
    for n, bw in (("2", (250, 320)), ("4", (330, 420)), ("8", (300, 380))):
        e = fit["all_reduce"][n]
        assert 0.01 < e["latency_ms"] < 0.045 and bw[0] < e["bus_bandwidth_gbps"] < bw[1]
        assert e["median_abs_rel_error"] < 0.1
    h100 = collectives_for(H100, 8)
    nccl = [t for b, t in zip(h100["all_reduce"]["bytes"], h100["all_reduce"]["time_ms"], strict=True) if b > 2**23]
    assert "measured" in h100["source"] and nccl[0] > 0.02  # below 8 MiB: vLLM's custom kernel (custom_allreduce.py)
    a100 = collectives_for(get_gpu("A100-80GB"), 8)
    assert "scaled from H100 by interconnect datasheet" in a100["source"]
    big = 2.0**31
    t_h = [t for b, t in zip(h100["all_reduce"]["bytes"], h100["all_reduce"]["time_ms"], strict=True) if b == big][0]
    t_a = [t for b, t in zip(a100["all_reduce"]["bytes"], a100["all_reduce"]["time_ms"], strict=True) if b == big][0]
    assert t_a / t_h == pytest.approx(450 / 300, rel=0.02)
    assert "send_recv" in h100 and collectives_for(H100, 1) is None


def test_fit_reproduces_measured_csv_within_reported_error():
    fit = pytest.importorskip("kvsim.profiles.fit")
    try:
        points, _ = fit.load_points()
    except FileNotFoundError:
        pytest.skip("measured H100 data not present")
    stored = json.loads(EFFICIENCY_FILE.read_text())
    pred = fit.predict(points, load_efficiency())
    summary = fit.error_summary(pred)
    assert summary["median_abs_rel_error"] <= stored["fit"]["median_abs_rel_error"] + 1e-4
    assert summary["worst_abs_rel_error"] <= stored["fit"]["worst_abs_rel_error"] + 1e-4
    assert summary["median_abs_rel_error"] < 0.15  # the factors do describe the data
    for op, errs in summary["per_operator"].items():
        assert errs["median_abs_rel_error"] <= stored["fit"]["per_operator"][op]["median_abs_rel_error"] + 1e-4


def test_committed_profiles_cover_the_catalog_and_parse():
    for gpu in (GPUS[name] for name in COMMITTED_GPUS):
        for name in MODEL_NAMES:
            for tp in TPS:
                path = find_profile_path(gpu.name, name, tp)
                assert (path is not None) == fits(gpu, get_model(name), tp), (gpu.name, name, tp)
                if path is not None:
                    assert path.stat().st_size < 40_000
    for path in PROFILE_DIR.glob("*.json"):
        if path.name in (EFFICIENCY_FILE.name, "collectives_h100.json"):
            continue
        profile = load_profile(path)
        d = profile.data
        tag = dtype_tag(*profile_dtypes(profile))
        assert path.name == f"{d['gpu']}-{d['model']}{tag}-tp{d['tensor_parallel_size']}.json"


def test_committed_fp8_and_moe_profiles_and_run_finds_them():
    """The FP8 / MoE combinations the README promises have files, labelled roofline, with provenance,
    and `kvsim run` of that deployment uses the file (not an in-memory build)."""
    for gpu in ("H100-SXM-80GB", "H200-141GB"):
        for tp in (2, 4, 8):
            for tag in ("-fp8", "-kvfp8", "-fp8-kvfp8"):
                path = find_profile_path(gpu, "llama3-70b", tp, tag=tag)
                assert path is not None, (gpu, tp, tag)
                d = load_profile(path).data
                assert d["source"] == "roofline" and "fp8" in d["provenance"]
        assert find_profile_path(gpu, "mixtral-8x7b", 2) is not None
        assert find_profile_path(gpu, "qwen3-30b-a3b", 1) is not None
    moe = load_profile(find_profile_path("H100-SXM-80GB", "mixtral-8x7b", 2)).data
    assert "moe" in moe["provenance"] and moe["model_shape"]["num_experts"] == 8
    assert find_profile_path("A100-80GB", "llama3-70b", 4, tag="-fp8") is None  # no FP8 tensor cores
    from kvsim.cli.main import app

    result = CliRunner().invoke(app, ["run", "--model", "llama3-70b", "--tp", "4", "--quantization", "fp8",
                                      "--kv-cache-dtype", "fp8", "--num-requests", "3", "--json"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)["record"]["profile"]
    assert Path(record["path"]).name == "H100-SXM-80GB-llama3-70b-fp8-kvfp8-tp4.json"
    assert record["source"] == "roofline" and "fp8 kv-fp8" in record["label"]


def test_readme_coverage_table_is_generated_from_the_files():
    from kvsim.profiles.generate import README, TABLE_BEGIN, TABLE_END, coverage_table

    text = README.read_text()
    block = text[text.index(TABLE_BEGIN) + len(TABLE_BEGIN):text.index(TABLE_END)].strip()
    assert block == coverage_table(PROFILE_DIR), "run `python -m profiles.generate --readme`"
    assert "| mixtral-8x7b | fp8 | fp8 | roofline |" in block and "| tiny | fp32 | fp32 | measured |" in block


def test_committed_roofline_matches_generator():
    path = find_profile_path("h200-141gb", "llama3-8b", 1)
    assert path is not None
    assert json.loads(path.read_text()) == json.loads(json.dumps(build_roofline_profile(get_gpu("H200-141GB"), L8, 1)))


def test_default_profile_file_or_roofline_in_memory():
    p = default_profile(H100, L8, 2)
    assert p.path and Path(p.path).name == "H100-SXM-80GB-llama3-8b-tp2.json"
    odd = replace(L8, name="my-model")
    q = default_profile(H100, odd, 2)
    assert q.path is None and q.source == "roofline" and "roofline" in q.label
    cpu = default_profile(H100, get_model("tiny"), 1)  # no H100 tiny file: roofline
    assert cpu.source == "roofline"


def test_check_profile_matches():
    p = default_profile(H100, L8, 2)
    check_profile_matches(p, L8, 2)
    with pytest.raises(ProfileError, match="--tp 2, but the run uses --tp 4"):
        check_profile_matches(p, L8, 4)
    with pytest.raises(ProfileError, match="num_layers 32 != 80"):
        check_profile_matches(p, get_model("llama3-70b"), 2)


def test_compare_command_prints_ratios():
    from kvsim.cli.main import app

    a = PROFILE_DIR / "H100-SXM-80GB-llama3-8b-tp1.json"
    b = PROFILE_DIR / "A100-80GB-llama3-8b-tp1.json"
    result = CliRunner().invoke(app, ["profile", "compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "median ratio B/A" in result.output and "worst ratio B/A" in result.output
    assert "decode" in result.output and "prefill" in result.output and "mixed" in result.output
    med = float(result.output.split("median ratio B/A:")[1].split()[0])
    assert med > 1.2  # an A100 is slower than an H100 on every step of this grid
    same = CliRunner().invoke(app, ["profile", "compare", str(a), str(a)])
    assert "median ratio B/A: 1.000" in same.output


def test_compare_missing_file_is_one_line_error():
    from kvsim.cli.main import app

    result = CliRunner().invoke(app, ["profile", "compare", "nope.json", "nope.json"])
    assert result.exit_code == 2
    assert "nope.json: no such profile" in result.output


def test_profile_for_another_gpu_is_refused(tmp_path):
    from kvsim.cli.main import app

    path = tmp_path / "a100.json"
    path.write_text(json.dumps(build_roofline_profile(get_gpu("A100-80GB"), L8, 1)))
    p = load_profile(path)
    check_profile_matches(p, L8, 1, get_gpu("A100-80GB"))
    with pytest.raises(ProfileError, match="profile is for GPU 'A100-80GB', but the run uses --gpu H100"):
        check_profile_matches(p, L8, 1, H100)
    result = CliRunner().invoke(app, ["run", "--model", "llama3-8b", "--gpu", "H100", "--profile", str(path),
                                      "--num-requests", "3"])
    assert result.exit_code == 2 and "profile is for GPU" in result.stderr
    assert result.stderr.count("\n") == 1


def test_steps_csv_has_the_cost_breakdown(tmp_path):
    from kvsim.cli.main import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", "llama3-8b", "--tp", "2", "--num-requests", "20",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    import pandas as pd

    steps = pd.read_csv(out / "steps.csv")
    for col in ("kernels_ms", "collectives_ms", "host_ms"):
        assert (steps[col] > 0).all(), col
    total = steps.kernels_ms + steps.collectives_ms + steps.host_ms
    assert (abs(total - 1e3 * steps.duration_s) < 1e-6 * total + 1e-9).all()
