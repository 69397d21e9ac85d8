"""Small fixtures shared by tests: a flat synthetic profile and a replay-a-list workload."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kvsim.simcore.catalog import MODELS
from kvsim.simcore.latency import parse_profile
from kvsim.simcore.request import Request


def flat_profile(model_name: str = "tiny", linear_ms: float = 1.0, overhead_ms: float = 0.0,
                 decode_ms: float = 0.0, tp: int = 1):
    """Every step costs overhead + layers * linear_ms (+ layers * decode_ms with decodes)."""
    model = MODELS[model_name]
    zero = 1e-12
    data = {
        "schema": "kvsim-profile", "schema_version": 1, "source": "roofline",
        "gpu": "synthetic", "model": model.name, "tensor_parallel_size": tp,  # no datasheet: flat times pass
        "model_shape": model.to_dict(), "dtype": "bf16", "provenance": {"generator": "tests"},
        "step_overhead_ms": overhead_ms,
        "linear": {"num_tokens": [1, 65536], "time_ms": [linear_ms, linear_ms]},
        "prefill_attention": {"chunk_tokens": [1, 65536], "context_tokens": [0, 65536],
                              "time_ms": [[zero, zero], [zero, zero]]},
        "decode_attention": {"16": {"batch_size": [1, 4096], "context_tokens": [0, 65536],
                                    "time_ms": [[decode_ms or zero] * 2, [decode_ms or zero] * 2]}},
        "lm_head": {"num_seqs": [1, 4096], "time_ms": [zero, zero]},
    }
    return parse_profile(data)


class ListWorkload:
    """Replays fixed requests at fixed arrival times (a test double for workloads/)."""

    name = "list"

    def __init__(self, requests: list[Request]):
        self.requests = sorted(requests, key=lambda r: r.arrival_s)
        self.num_requests = len(requests)

    def process(self, env, sink, seed: np.random.SeedSequence):
        for req in self.requests:
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            sink.submit(replace(req))

    def describe(self):
        return {"name": self.name, "num_requests": self.num_requests}


def req(i: int, at: float, prompt: int, output: int, **kw) -> Request:
    return Request(request_id=i, arrival_s=at, num_prompt_tokens=prompt, num_output_tokens=output, **kw)


TIME_TOL_S = 1e-9  # what the engines' equivalence tests allow between two runs' timestamps


def assert_same_value(a, b, key: str, context: str) -> None:
    """Two runs' summary values: ints and text exactly, floats to 1e-9 relative (NaN equals NaN)."""
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            assert a == b, f"{context}: {key} {a} != {b}"
        elif math.isnan(a) or math.isnan(b):
            assert math.isnan(a) and math.isnan(b), f"{context}: {key} {a} != {b}"
        else:
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), f"{context}: {key} {a} != {b}"
    else:
        assert a == b, f"{context}: {key} {a!r} != {b!r}"


def assert_same_requests(a, b, context: str) -> None:
    """Two runs' request tables: same columns, counts exactly, timestamps (`*_s`) within TIME_TOL_S."""
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if col.endswith("_s"):
            same = np.isclose(x, y, rtol=0.0, atol=TIME_TOL_S, equal_nan=True)
            assert same.all(), f"{context}: {col} differs for requests {np.flatnonzero(~same).tolist()}"
        else:
            assert (x == y).all(), f"{context}: {col} differs"


def assert_cores_agree(core, exact, context: str) -> None:
    """The compiled core's run against the Python reference's: which core ran each, request tables,
    pooled ITLs (in order), summaries, warnings, step totals and the number of steps the rows hold
    (the checks every equivalence test shares; each adds its own after)."""
    assert core.record["engine_core"] == "c" and exact.record["engine_core"] == "python", context
    assert_same_requests(core.requests, exact.requests, context)
    assert len(core.itl_s) == len(exact.itl_s), context
    assert np.allclose(core.itl_s, exact.itl_s, rtol=0.0, atol=TIME_TOL_S), context  # same order too
    assert core.summary.keys() == exact.summary.keys(), context
    for key in core.summary:
        assert_same_value(core.summary[key], exact.summary[key], key, context)
    assert core.warnings == exact.warnings, context
    ct, et = core.totals, exact.totals
    for name in ("num_steps", "seq_steps", "max_running", "kv_allocated_max", "num_preempted"):
        assert getattr(ct, name) == getattr(et, name), (context, name)
    for name in ("duration_s", "running_s", "kv_blocked_s"):
        assert_same_value(getattr(ct, name), getattr(et, name), name, context)
    assert core.steps["num_steps"].sum() == len(exact.steps), context


def random_requests(rng: np.random.Generator, max_model_len: int, max_requests: int = 40,
                    long_outputs: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival_s, prompt, output) of 1 to max_requests - 1 random requests for the equivalence
    tests: exponential gaps at one of three scales, a quarter of them 0 (simultaneous arrivals);
    lengths up to half the window, a tenth of the prompts longer (refused by max_model_len or
    clipped by it) and, with `long_outputs`, a tenth of the outputs max_model_len long."""
    mml = max_model_len
    num = int(rng.integers(1, max_requests))
    gaps = rng.exponential(float(rng.choice([0.0005, 0.002, 0.02])), size=num)
    gaps[rng.random(num) < 0.25] = 0.0  # simultaneous arrivals
    arrivals = np.cumsum(gaps) - gaps[0]
    prompt = rng.integers(1, mml // 2, size=num)
    output = rng.integers(1, mml // 2, size=num)
    long = rng.random(num) < 0.1  # refused (prompt > max_model_len) or clipped by it
    prompt[long] = rng.integers(mml // 2, mml + 8, size=int(long.sum()))
    if long_outputs:
        output[rng.random(num) < 0.1] = mml
    return arrivals, prompt, output


def invoke_cli(*args: str):
    """Run `kvsim ARGS` in-process (typer's runner; stderr kept apart)."""
    from typer.testing import CliRunner

    from kvsim.cli.main import app

    return CliRunner().invoke(app, list(args))


def assert_one_line_error(result, *needles: str, code: int = 2) -> None:
    """Bad input: exit `code`, one `kvsim: error:` line naming each needle, no traceback, no output."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and not result.stdout.strip(), (err, result.stdout)
    for needle in needles:
        assert needle in err, (needle, err)


def load_script(path, name: str):
    """Import a benchmarks/ script as a module for the length of a test module (a generator for a
    module-scoped fixture): dataclasses resolve its annotations through sys.modules."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)
