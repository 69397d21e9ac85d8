"""The harness's FP8 and MoE paths on a CPU: routing counts follow the roofline's assumption, the
grouped experts and the FP8 GEMM compute what they claim, FP8 is refused without FP8 tensor cores,
and a quick-grid profile of a tiny MoE model (FP8 path forced on, real CPU timings) drives a run."""

import json
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

import kvsim.profiles.harness_linear as hl  # noqa: E402
from kvsim.profiles.roofline import experts_touched  # noqa: E402
from kvsim.simcore.catalog import get_model  # noqa: E402
from kvsim.simcore.errors import ProfileError  # noqa: E402
from kvsim.simcore.latency import load_profile  # noqa: E402

TINY_MOE = get_model("tiny-moe")


@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 8, 2), (3, 8, 2), (16, 8, 2), (1, 128, 8),
                                                         (5, 128, 8), (64, 128, 8), (4096, 128, 8)])
def test_moe_token_counts_follow_the_roofline_assumption(tokens, experts, top_k):
    counts = hl.moe_token_counts(tokens, experts, top_k)
    assert sum(counts) == tokens * top_k
    assert len(counts) == min(experts, tokens * top_k, max(top_k, round(experts_touched(tokens, experts, top_k))))
    assert max(counts) - min(counts) <= 1  # no expert is a straggler: imbalance is the roofline's (none)
    ids = hl.moe_topk_ids(tokens, experts, top_k)
    assert ids.shape == (tokens, top_k)
    assert all(len(set(row)) == top_k for row in ids.tolist())  # k distinct experts per token
    assert torch.bincount(ids.flatten()).tolist() == counts


def test_batch_one_touches_top_k_experts_only():
    assert hl.moe_token_counts(1, 8, 2) == [1, 1]  # Mixtral at batch 1 reads 2 of 8 experts
    assert len(hl.moe_token_counts(1000, 8, 2)) == 8


def test_grouped_experts_equal_a_per_token_reference():
    """The MoE MLP as timed computes sum_j w_j * expert_j(x) per token, for the assumed routing."""
    gen = torch.Generator().manual_seed(3)
    made = []

    def w(*shape):
        t = torch.randn(shape, generator=gen) * 0.1
        made.append(t)
        return t

    model = replace(TINY_MOE, shared_expert_intermediate_size=64)
    tokens = 7
    run = hl._moe_mlp(model, 1, tokens, torch.float32, "cpu", w, hl.make_gemm(False, torch.float32))
    x = torch.randn((tokens, model.hidden_size), generator=gen)
    got = run(x)
    router, e = made[0], model.num_experts
    ups, downs, (s_up, s_down) = made[1:1 + e], made[1 + e:1 + 2 * e], made[1 + 2 * e:]
    weights = torch.topk(torch.softmax(x @ router.T, -1), model.num_experts_per_tok, -1).values
    ids = hl.moe_topk_ids(tokens, e, model.num_experts_per_tok)

    def mlp(v, up, down):
        g, u = (v @ up.T).chunk(2, -1)
        return (torch.nn.functional.silu(g) * u) @ down.T

    want = torch.stack([
        sum(weights[t, j] * mlp(x[t], ups[int(ids[t, j])], downs[int(ids[t, j])])
            for j in range(model.num_experts_per_tok)) + mlp(x[t], s_up, s_down)
        for t in range(tokens)
    ])
    assert torch.allclose(got, want, atol=1e-5)


def test_fp8_gemm_is_a_scaled_e4m3_product():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn((5, 64), generator=gen), torch.randn((48, 64), generator=gen)
    got = hl.make_gemm(True, torch.float32)(w)(x)
    want = x @ w.T
    assert got.shape == want.shape and got.dtype == torch.float32
    err = float((got - want).norm() / want.norm())
    assert 1e-4 < err < 0.1  # really quantized (not the fp32 product), and still the same product


def test_fp8_refused_below_compute_capability_8_9(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    why = hl.fp8_support("cuda")
    assert "A100" in why and "8.0" in why and ">= 8.9" in why
    assert "no FP8 tensor cores" in hl.fp8_support("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert hl.fp8_support("cuda") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert hl.fp8_support("cuda") is None


def test_measure_profile_refuses_fp8_before_touching_the_device(monkeypatch):
    from kvsim.profiles.harness import HarnessConfig, measure_profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    cfg = HarnessConfig(model=replace(get_model("llama3-8b"), quantization="fp8"), device="cuda", quick=True)
    with pytest.raises(ProfileError, match="compute capability 8.0; FP8 GEMMs"):
        measure_profile(cfg)


def test_profile_cli_refuses_fp8_on_cpu_in_one_line():
    from kvsim.cli.main import app

    result = CliRunner().invoke(app, ["profile", "--device", "cpu", "--model", "tiny", "--quick", "-q", "fp8"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "no FP8 tensor cores" in result.stderr


def test_quick_fp8_moe_profile_on_cpu_records_what_was_measured(tmp_path, monkeypatch):
    """FP8 capability forced on (torch._scaled_mm runs on this CPU): the shapes flow through
    every expert, the profile says fp8 + MoE, and `kvsim run` accepts it for tiny-moe fp8."""
    from kvsim.cli.main import app

    monkeypatch.setattr(hl, "fp8_support", lambda device: None)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["profile", "--device", "cpu", "--model", "tiny-moe", "-q", "fp8", "--quick",
                                      "--repeats", "2", "--warmup", "1"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "cpu-tiny-moe-fp8-tp1.json"  # the default name carries the dtype tag lookup reads
    profile = load_profile(out)
    d = profile.data
    assert d["source"] == "measured" and d["weight_dtype"] == "fp8" and d["model_shape"]["quantization"] == "fp8"
    moe = d["provenance"]["moe"]
    assert moe["experts"] == 8 and moe["top_k"] == 2
    assert moe["experts_touched"] == [len(hl.moe_token_counts(t, 8, 2)) for t in d["linear"]["num_tokens"]]
    assert "_scaled_mm" in d["provenance"]["fp8"]
    assert all(t > 0 for t in d["linear"]["time_ms"])
    run = CliRunner().invoke(app, ["run", "--model", "tiny-moe", "--quantization", "fp8", "--profile", str(out),
                                   "--num-requests", "10", "--rate", "10", "--input-len", "32", "--output-len", "8",
                                   "--json"])
    assert run.exit_code == 0, run.stderr
    assert json.loads(run.stdout)["record"]["profile"]["sha256"] == profile.sha256
    bf16 = CliRunner().invoke(app, ["run", "--model", "tiny-moe", "--profile", str(out), "--num-requests", "5"])
    assert bf16.exit_code == 2 and "fp8 weights" in bf16.stderr  # a run without fp8 refuses the fp8 profile
