"""`kvsim list`: the catalog a user picks --model and --gpu from."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app
from simcore.catalog import GPUS, MODELS


def test_list_models_gpus_and_profiles():
    runner = CliRunner()
    models = runner.invoke(app, ["list", "models"])
    assert models.exit_code == 0
    assert all(name in models.stdout for name in MODELS)
    assert "llama3-8b   8.0B    32" in models.stdout
    gpus = runner.invoke(app, ["list", "gpus"])
    assert gpus.exit_code == 0 and all(name in gpus.stdout for name in GPUS)
    profiles = runner.invoke(app, ["list", "profiles"])
    assert profiles.exit_code == 0
    assert "H100-SXM-80GB-llama3-70b-tp8.json" in profiles.stdout
    assert "cpu-tiny-tp1.json" in profiles.stdout and "measured" in profiles.stdout


def test_list_something_else_is_one_line_error():
    result = CliRunner().invoke(app, ["list", "tokenizers"])
    assert result.exit_code == 2
    assert result.stderr.startswith("kvsim: error: ") and result.stderr.count("\n") == 1
