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
