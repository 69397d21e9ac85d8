"""`kvsim list`: the catalog a user picks --model and --gpu from."""

from __future__ import annotations

from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore.catalog import GPUS, MODELS


def test_list_models_gpus_and_profiles():
    runner = CliRunner()
    models = runner.invoke(app, ["list", "models"])
    assert models.exit_code == 0
    assert all(name in models.stdout for name in MODELS)
    row = next(line for line in models.stdout.splitlines() if line.startswith("llama3-8b "))
    assert row.split()[:5] == ["llama3-8b", "8.0B", "8.0B", "-", "32"]
    mixtral = next(line for line in models.stdout.splitlines() if line.startswith("mixtral-8x7b "))
    assert mixtral.split()[:5] == ["mixtral-8x7b", "46.7B", "12.9B", "8", "top-2"]
    gpus = runner.invoke(app, ["list", "gpus"])
    assert gpus.exit_code == 0 and all(name in gpus.stdout for name in GPUS)
    a100 = next(line for line in gpus.stdout.splitlines() if line.startswith("A100-80GB "))
    assert a100.split()[4] == "none"  # no FP8 tensor cores
    profiles = runner.invoke(app, ["list", "profiles"])
    assert profiles.exit_code == 0
    assert "H100-SXM-80GB-llama3-70b-tp8 " in profiles.stdout
    assert "cpu-tiny-tp1 " in profiles.stdout and "measured" in profiles.stdout


def test_list_something_else_is_one_line_error():
    result = CliRunner().invoke(app, ["list", "tokenizers"])
    assert result.exit_code == 2
    assert result.stderr.startswith("kvsim: error: ") and result.stderr.count("\n") == 1
