"""The engine version (--engine-version, or the default vllm-v1) fills unset step limits with vLLM's own per-GPU defaults (simcore/batch_defaults.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore.batch_defaults import batch_defaults, large_gpu
from kvsim.simcore.catalog import GPUS

H100, A100 = GPUS["H100-SXM-80GB"], GPUS["A100-80GB"]
RUN = ["run", "--model", "llama3-8b", "--workload", "fixed-batch", "--num-requests", "4", "--input-len", "128",
       "--output-len", "4", "--json", "--no-error-bars"]


def test_v1_defaults_follow_get_batch_defaults():
    # vLLM V1: >= 70 GiB and not an A100 -> 8192 / 16384 tokens, 1024 sequences; else 2048 / 8192, 256
    assert large_gpu(H100) and not large_gpu(A100)  # the A100-80GB has the memory but is excluded by name
    assert batch_defaults("vllm-v1", H100, 8192, True, "server") == (1024, 8192)
    assert batch_defaults("vllm-v1", H100, 8192, True, "offline") == (1024, 16384)
    assert batch_defaults("vllm-v1", A100, 8192, True, "server") == (256, 2048)
    assert batch_defaults("vllm-v1", A100, 8192, True, "offline") == (256, 8192)
    # without chunked prefill a whole prompt must fit the budget; the budget is at most seqs x max_model_len
    assert batch_defaults("vllm-v1", A100, 32768, False, "server") == (256, 32768)
    assert batch_defaults("vllm-v1", A100, 4, True, "server") == (256, 1024)
    # a given value is kept and the other derived from it as vLLM does
    assert batch_defaults("vllm-v1", H100, 8192, True, "server", max_num_batched_tokens=512) == (512, 512)
    assert batch_defaults("vllm-v1", H100, 1024, True, "server", max_num_seqs=2) == (2, 2048)
    # async scheduling's default (vLLM 0.14, PR #27614) left get_batch_defaults as it was
    for args in ((H100, 8192, True, "server"), (A100, 8192, True, "offline"), (A100, 32768, False, "server")):
        assert batch_defaults("vllm-v1-async", *args) == batch_defaults("vllm-v1", *args)


def test_v0_and_06_defaults_follow_their_scheduler_config():
    for gpu in (H100, A100):
        assert batch_defaults("vllm-v0", gpu, 4096, False) == (256, 4096)
        assert batch_defaults("vllm-v0", gpu, 1024, False) == (256, 2048)
        assert batch_defaults("vllm-v0", gpu, 4096, True) == (256, 512)
        assert batch_defaults("vllm-0.6", gpu, 4096, True) == (256, 4096)  # multi-step: no prompt chunking
    with pytest.raises(ValueError, match="unknown"):
        batch_defaults("vllm-v9", H100, 4096, True)


@pytest.mark.parametrize(("extra", "expected"), [
    ([], (1024, 8192)),  # no --engine-version: the default vllm-v1's, as `vllm serve` picks them
    (["--usage-context", "offline"], (1024, 16384)),
    (["--policy", "static"], (256, None)),  # vLLM's limits are continuous batching's only
    (["--engine-version", "vllm-v1"], (1024, 8192)),
    (["--engine-version", "vllm-v1", "--usage-context", "offline"], (1024, 16384)),
    (["--engine-version", "vllm-v1", "--max-num-seqs", "64"], (64, 8192)),
    (["--engine-version", "vllm-v0"], (256, 8192)),  # llama3-8b: max_model_len 8192, no chunked prefill
])
def test_run_records_the_filled_limits(extra, expected):
    result = CliRunner().invoke(app, [*RUN, "--gpu", "H100-SXM-80GB", *extra])
    assert result.exit_code == 0, result.stderr
    config = json.loads(result.stdout)["record"]["config"]
    assert (config["max_num_seqs"], config["max_num_batched_tokens"]) == expected


def test_usage_context_needs_a_known_name():
    for extra in (["--usage-context", "batch"], ["--engine-version", "vllm-v1", "--usage-context", "batch"]):
        result = CliRunner().invoke(app, [*RUN, "--gpu", "H100-SXM-80GB", *extra])
        assert result.exit_code != 0 and "must be one of server, offline" in result.stderr
        assert "Traceback" not in result.stderr and not result.stdout


def test_the_default_engine_fills_each_gpus_limits_and_names_them():
    result = CliRunner().invoke(app, [*RUN[:-2], "--gpu", "A100-80GB", "--no-error-bars"])
    assert result.exit_code == 0, result.stderr
    assert ("Engine: vllm-v1 (default), max_num_seqs 256, max_num_batched_tokens 2048 (vLLM's server defaults "
            "on A100-80GB)") in result.stdout



def test_plan_candidates_get_their_own_gpus_defaults():
    from kvsim.reports.plan import default_dimensions, expand
    from kvsim.simcore.catalog import MODELS
    from kvsim.simcore.specs import ENGINE_PRESETS, EngineConfig

    base = EngineConfig(engine_version="vllm-v1", **ENGINE_PRESETS["vllm-v1"])
    dims = default_dimensions(["H100-SXM-80GB", "A100-80GB"], [1])
    got = {c.gpu.name: (c.config.max_num_seqs, c.config.max_num_batched_tokens)
           for c in expand(MODELS["llama3-8b"], dims, base, (frozenset({"max_num_seqs", "max_num_batched_tokens"}), "server"))}
    assert got == {"H100-SXM-80GB": (1024, 8192), "A100-80GB": (256, 2048)}
    searched = default_dimensions(["A100-80GB"], [1], max_num_seqs=[64])  # a searched value is kept
    (c,) = expand(MODELS["llama3-8b"], searched, base, (frozenset({"max_num_batched_tokens"}), "server"))
    assert (c.config.max_num_seqs, c.config.max_num_batched_tokens) == (64, 2048)


def test_plan_serves_the_filled_limits():
    args = ["plan", "--model", "llama3-8b", "--gpu", "A100-80GB", "--tp", "1", "--input-len", "256",
            "--output-len", "32", "--search-requests", "60", "--confirm-requests", "80", "--tolerance", "0.15",
            "--slo-ttft-p95-ms", "400", "--slo-tpot-p95-ms", "40", "--rate", "5", "--json", "--engine-version", "vllm-v1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    best = json.loads(result.stdout)["answers"][0]["best"]
    assert "--max-num-seqs 256 --max-num-batched-tokens 2048" in best["vllm_serve"]
