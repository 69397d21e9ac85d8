"""Small fixtures shared by tests: a flat synthetic profile and a replay-a-list workload."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simcore.catalog import MODELS
from simcore.latency import parse_profile
from simcore.request import Request


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
