"""`kvsim profile validate`: whole steps timed with the harness's kernels against the latency
model's prices; the step sets; refusals of a shape too big for the device or the wrong device."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.profiles.harness import FULL_GRID, QUICK_GRID
from kvsim.profiles.validate import FULL_STEPS, QUICK_STEPS
from kvsim.simcore.latency import StepLatencyModel, load_profile

TINY = Path(__file__).resolve().parent.parent / "profiles" / "cpu-tiny-tp1.json"


def _inside(steps, grid) -> bool:
    return all(
        s.num_tokens <= grid.num_tokens[-1] and s.num_sampled <= grid.num_seqs[-1]
        and all(grid.chunk_tokens[0] <= c <= grid.chunk_tokens[-1] and p <= grid.prefill_context[-1]
                for c, p in s.prefill_chunks)
        and (not s.num_decode_seqs or (s.num_decode_seqs <= grid.decode_batch[-1]
                                       and grid.decode_context[0] <= s.decode_context <= grid.decode_context[-1]))
        for s in steps
    )


def test_step_sets_cover_the_three_kinds_inside_their_grids():
    for steps, grid in ((QUICK_STEPS, QUICK_GRID), (FULL_STEPS, FULL_GRID)):
        assert {s.kind for s in steps} == {"decode", "prefill", "mixed"}
        assert any(p for s in steps for _, p in s.prefill_chunks)  # a chunk over prior context
        assert _inside(steps, grid)
    # a --quick profile prices every quick step without extrapolating
    model = StepLatencyModel(load_profile(TINY).data)
    for s in QUICK_STEPS:
        model.step_time_s(s.num_tokens, list(s.prefill_chunks), s.num_decode_seqs,
                          s.num_decode_seqs * s.decode_context, s.num_sampled)
    assert model.extrapolated.steps == 0


def test_importing_validate_does_not_import_torch():
    code = "import sys, cli.profile_cmd, profiles.validate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_validate_quick_on_cpu_writes_rows(tmp_path):
    pytest.importorskip("torch")
    import torch

    from kvsim.cli.main import app

    out = tmp_path / "v.json"
    result = CliRunner().invoke(
        app, ["profile", "validate", "--profile", str(TINY), "--device", "cpu", "--steps", "quick",
              "--repeats", "2", "--warmup", "1", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    for heading in ("measured ms", "predicted ms", "ratio", "median", "worst"):
        assert heading in result.stdout
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == len(QUICK_STEPS) and doc["skipped_steps"] == []
    assert [r["step"] for r in doc["rows"]] == [s.label for s in QUICK_STEPS]
    for r in doc["rows"]:
        for key in ("measured_ms", "predicted_ms", "layer_ms", "lm_head_ms", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["step"], key)
        assert r["ratio"] == pytest.approx(r["predicted_ms"] / r["measured_ms"])
    prov = doc["provenance"]
    assert prov["device"] == "cpu" and prov["torch_version"] == torch.__version__
    assert prov["decode_backend"] == "reference" and prov["date"]
    summary = doc["summary"]
    assert 0 <= summary["median_abs_rel_error"] <= summary["worst_abs_rel_error"]
    assert doc["profile"]["sha256"] == load_profile(TINY).sha256


def test_shape_too_large_for_the_device_is_one_line(tmp_path):
    pytest.importorskip("torch")
    from kvsim.cli.main import app

    data = json.loads(TINY.read_text())
    data["model_shape"] |= {"hidden_size": 2**20, "intermediate_size": 2**22}
    big = tmp_path / "big.json"
    big.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["profile", "validate", "--profile", str(big), "--device", "cpu"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "too large for cpu" in lines[0] and "GiB" in lines[0]


def test_profile_of_another_device_is_refused():
    from kvsim.cli.main import app

    result = CliRunner().invoke(app, ["profile", "validate", "--profile", str(TINY), "--device", "cuda"])
    assert result.exit_code == 2
    assert "validate it with --device cpu" in result.stderr
