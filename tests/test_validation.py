"""One validation for the Python API and the CLI: `simulate()` and `kvsim run` refuse the same
configurations with the same message (simcore.config.resolve), naming the flag to change."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.profiles import default_profile
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.simulate import simulate
from kvsim.simcore.specs import EngineConfig
from tests.helpers import ListWorkload, req

MODEL, GPU = "llama3-8b", "H100-SXM-80GB"
CLI_BASE = ["run", "--model", MODEL, "--gpu", GPU, "--num-requests", "5", "--rate", "5"]

# (EngineConfig fields, the same on the command line, a substring of the message both give)
CASES = [
    ({"swap_space": math.nan}, ["--swap-space", "nan"], "--swap-space must be a finite number >= 0, got nan"),
    ({"swap_space": math.inf}, ["--swap-space", "inf"], "--swap-space must be a finite number >= 0, got inf"),
    ({"swap_space": -1.0}, ["--swap-space", "-1"], "--swap-space must be"),
    ({"policy": "static", "batch_timeout_s": math.nan}, ["--policy", "static", "--batch-timeout-s", "nan"],
     "--batch-timeout-s must be a finite number >= 0, got nan"),
    ({"gpu_memory_utilization": math.nan}, ["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization must be"),
    ({"gpu_memory_utilization": 1.5}, ["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be"),
    ({"gpu_memory_utilization": 0.0}, ["--gpu-memory-utilization", "0"], "--gpu-memory-utilization must be"),
    ({"max_num_seqs": 0}, ["--max-num-seqs", "0"], "--max-num-seqs must be"),
    ({"max_num_batched_tokens": 64, "max_num_seqs": 128}, ["--max-num-batched-tokens", "64", "--max-num-seqs", "128"],
     "--max-num-batched-tokens (64) must be >= --max-num-seqs (128)"),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 1024},
     ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "1024"],
     "--max-num-batched-tokens (1024) is smaller than max_model_len (8192) with chunked prefill off"),
    ({"max_model_len": 100_000}, ["--max-model-len", "100000"], "--max-model-len 100000 exceeds llama3-8b's context length 8192"),
    ({"max_model_len": 1}, ["--max-model-len", "1"], "--max-model-len must leave room for one prompt and one output token"),
    ({"policy": "static", "swap_space": 8.0}, ["--policy", "static", "--swap-space", "8"], "--swap-space applies only to"),
    ({"policy": "dynamic", "max_batch_size": 8}, ["--policy", "dynamic", "--max-batch-size", "8"],
     "--max-batch-size applies only to --policy static"),
    ({"allocator": "contiguous", "preemption_mode": "swap"}, ["--allocator", "contiguous", "--preemption-mode", "swap"],
     "--preemption-mode applies only to --policy continuous --allocator paged"),
    ({"tensor_parallel_size": 3}, ["--tp", "3"], "--tp must be a power of two"),
]


@pytest.mark.parametrize(("fields", "flags", "message"), CASES, ids=[" ".join(c[1]) for c in CASES])
def test_api_and_cli_refuse_the_same_configurations(fields, flags, message):
    model, gpu = get_model(MODEL), get_gpu(GPU)
    with pytest.raises(ConfigError) as refused:
        config = EngineConfig(**fields)
        simulate(model, gpu, config, ListWorkload([req(0, 0.0, 8, 4)]), default_profile(gpu, model, 1))
    assert message in str(refused.value)
    result = CliRunner().invoke(app, [*CLI_BASE, *flags])
    assert result.exit_code == 2, result.stdout + result.stderr
    err = result.stderr.strip()
    assert err.startswith("kvsim: error: ") and "\n" not in err and "Traceback" not in err
    assert message in err, err
    assert not result.stdout  # nothing printed before the refusal


def test_a_valid_configuration_passes_both():
    model, gpu = get_model(MODEL), get_gpu(GPU)
    config = EngineConfig(max_num_batched_tokens=256, max_num_seqs=256, swap_space=0.0)
    result = simulate(model, gpu, config, ListWorkload([req(0, 0.0, 8, 4)]), default_profile(gpu, model, 1))
    assert result.summary["completed"] == 1
    cli = CliRunner().invoke(app, [*CLI_BASE, "--max-num-batched-tokens", "256", "--swap-space", "0"])
    assert cli.exit_code == 0, cli.stderr
