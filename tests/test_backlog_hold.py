"""An overloaded run holds arrivals back in the workload past a long queue (Engine.hold_arrivals):
memory stays bounded and every request's timeline is the one it has without holding."""

from __future__ import annotations

import numpy as np
import pytest

import kvsim.simcore.engine as engine_module
from kvsim.profiles import default_profile
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.simulate import prepare
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads.arrivals import GammaArrivals
from kvsim.workloads.lengths import Uniform
from kvsim.workloads.spec import WorkloadSpec

COLUMNS = ("request_id", "status", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
           "num_prompt_tokens", "num_output_tokens", "num_preemptions")


def _run(policy: str, hold_at: int, **config):
    """~800 requests arriving about three times faster than the tiny model serves them."""
    workload = WorkloadSpec(name="overload", num_requests=800, arrival=GammaArrivals(rate=4000.0),
                            prompt_len=Uniform(4, 60), output_len=Uniform(2, 40))
    cfg = EngineConfig(policy=policy, max_model_len=128, max_num_seqs=4, block_size=4, **config)
    gpu, model = GPUS["H100-SXM-80GB"], MODELS["tiny"]
    old = engine_module.HOLD_WAITING
    engine_module.HOLD_WAITING = hold_at
    try:
        sim = prepare(model, gpu, cfg, workload, default_profile(gpu, model, 1), seed=11,
                      engine_core="python")  # the Python engine holds; the C core runs nothing to watch
    finally:
        engine_module.HOLD_WAITING = old
    max_waiting = [0]
    life = sim.engine.lifecycle
    inner = life.begin_step

    def watch(plan, now):
        max_waiting[0] = max(max_waiting[0], len(life.waiting))
        inner(plan, now)

    life.begin_step = watch
    result = sim.run()
    return result, sim.engine.num_holds, max_waiting[0], sim.engine.hold_at


@pytest.mark.parametrize("policy,config", [
    ("continuous", {}),
    ("continuous", {"enable_chunked_prefill": False}),
    ("continuous", {"preemption_mode": "swap"}),
    ("static", {}),
    ("dynamic", {}),
    ("continuous", {"allocator": "contiguous"}),  # Orca
])
def test_holding_arrivals_keeps_every_timeline_and_bounds_the_queue(policy, config):
    free, holds_free, waiting_free, _ = _run(policy, 10**9, **config)
    held, holds, waiting_held, hold_at = _run(policy, 20, **config)
    assert holds_free == 0 and holds > 0, "the small threshold must hold the stream back"
    assert waiting_held <= hold_at < waiting_free, (waiting_free, waiting_held, hold_at)
    a = free.requests.sort_values("request_id", ignore_index=True)
    b = held.requests.sort_values("request_id", ignore_index=True)
    for col in COLUMNS:
        assert np.array_equal(a[col].to_numpy(), b[col].to_numpy()), col
    assert held.summary == free.summary
    assert "waiting" in held.record["resolution"] and "waiting" not in free.record["resolution"]
