"""Pipeline parallelism in the compiled core (simcore/csrc/pipeline.c) against the Python engine
(simcore/pipeline.py's rounds; a pipelined run is always step by step): random small runs with 2
to 4 stages over each policy the core runs (continuous V0 / V1 with preemption, static and
dynamic batching, Orca), one replica or two, stages inside a node or across nodes; then the 70B
model over TP 4 x PP 2 on its measured tables. Request tables (every token leaving with its
micro-batch), pooled ITLs, summaries, step totals and every step row must match."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsim.simcore import ccore
from tests import test_fastcore_batching as batching
from tests import test_fastcore_equivalence as plain
from tests.test_fastcore_batching import _same_rows
from tests.test_fastcore_equivalence import _compare

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")

KINDS = ("continuous", "static", "dynamic", "orca")


@pytest.fixture(autouse=True)
def _reference_is_python(monkeypatch):
    """_compare's reference run (exact steps) on the Python engine: a pipelined run is step by step
    anyway, so --exact-steps alone does not send it there."""
    from kvsim.simcore.simulate import simulate

    def run(*args, exact_steps=False, **kw):
        if exact_steps:
            kw["engine_core"] = "python"
        return simulate(*args, exact_steps=exact_steps, **kw)

    monkeypatch.setattr(plain, "simulate", run)


@pytest.mark.parametrize("kind", KINDS)
def test_core_matches_the_python_reference(kind):
    """20 random runs per policy, each with 2 pipeline stages (the tiny model has two layers)."""
    for case in range(20):
        seed = 8000 + 100 * KINDS.index(kind) + case
        rng = np.random.default_rng(seed)
        if kind == "continuous":
            config, workload = plain._random_case(rng)
        else:
            config, workload = batching._random_case(rng, kind)
        config = dataclasses.replace(config, pipeline_parallel_size=2)  # the tiny model has 2 layers
        core, exact = _compare(config, workload, seed=seed, context=f"case {seed}: {config}")
        _same_rows(core, exact, f"case {seed}")


def test_tp4_pp2_on_measured_tables():
    """The 70B model, TP 4 x PP 2 (hand-offs priced from the profile's send/recv tables when it
    has them), 300 sharegpt requests."""
    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import MODELS
    from kvsim.simcore.specs import EngineConfig
    from kvsim.workloads import load_workload

    model = MODELS["llama3-70b"]
    for tp, pp in ((4, 2), (8, 2)):  # the second crosses nodes (16 GPUs)
        config = EngineConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp, max_num_seqs=64)
        workload = load_workload("sharegpt", {"num_requests": 300, "rate": 8.0},
                                 max_model_len=config.resolved_max_model_len(model))
        core, exact = _compare(config, workload, seed=4, context=f"70B tp{tp} pp{pp}", model=model,
                               profile=default_profile(plain.H100, model, tp))
        _same_rows(core, exact, f"tp{tp} pp{pp}")
