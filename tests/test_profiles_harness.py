"""The torch harness: paged decode backends agree with dense attention; the CLI writes a
profile the latency model prices."""

import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from kvsim.profiles.harness_kernels import BACKENDS, check_backend, dense_attention, make_paged_kv  # noqa: E402
from kvsim.simcore.latency import StepLatencyModel, load_profile  # noqa: E402


def _imports(name: str) -> bool:
    module = {"flashinfer": "flashinfer", "vllm": "vllm", "flex": "torch.nn.attention.flex_attention"}.get(name)
    if module is None:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", BACKENDS)
def test_backend_matches_dense_attention(name):
    if not _imports(name):
        pytest.skip(f"{name} does not import here")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for block_size in (16, 32):
        assert check_backend(name, device, torch.float32, block_size) is None


def test_reference_agrees_on_scattered_blocks_and_gqa():
    from kvsim.profiles.harness_kernels import reference_backend

    gen = torch.Generator().manual_seed(7)
    p = make_paged_kv(3, 45, 8, 8, 2, 32, torch.float32, "cpu", gen, ragged=True)
    table = p.block_table.flatten().tolist()
    assert sorted(table) != table  # blocks really are scattered
    got = reference_backend(p)()
    assert torch.allclose(got, dense_attention(p), atol=1e-5)


def test_profile_cli_cpu_quick(tmp_path):
    from kvsim.cli.main import app

    out = tmp_path / "p.json"
    result = CliRunner().invoke(
        app, ["profile", "--device", "cpu", "--model", "tiny", "--quick", "--repeats", "2",
              "--warmup", "1", "--block-sizes", "16,32", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    prov = profile.data["provenance"]
    assert profile.source == "measured" and prov["label"] == "CPU"
    assert prov["decode_backend"] in BACKENDS and prov["torch_version"] == torch.__version__
    assert set(profile.data["decode_attention"]) == {"16", "32"}
    noise = prov["noise"]  # every point timed between two runs of the reference kernel
    assert noise["points"] == 5 + 3 * 2 + 2 * 3 * 3 + 3 and noise["reference_baseline_ms"] > 0
    assert len(noise["noisy_points"]) <= noise["points"]
    m = StepLatencyModel(profile.data)
    t = m.step_time_s(20, [(16, 0)], 4, 4 * 100, 5)
    assert 0 < t < 1.0
    # the measured profile drives a whole `kvsim run` and is recorded by its hash
    run = CliRunner().invoke(
        app, ["run", "--model", "tiny", "--profile", str(out), "--num-requests", "20", "--rate", "10",
              "--input-len", "64", "--output-len", "16", "--block-size", "32", "--json"],
    )
    assert run.exit_code == 0, run.stderr
    record = json.loads(run.stdout)["record"]["profile"]
    assert record["source"] == "measured" and record["sha256"] == profile.sha256


def test_missing_torch_is_one_clear_line(monkeypatch):
    import builtins

    from kvsim.cli.main import app

    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("no torch")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    result = CliRunner().invoke(app, ["profile", "--device", "cpu", "--model", "tiny", "--quick"])
    assert result.exit_code == 2
    assert "pip install '.[profile]'" in result.output
