"""Static batching, dynamic batching and Orca in the compiled core (simcore/csrc/batching.c)
against the Python engine's reference mode, as tests/test_fastcore_equivalence.py holds the
paged core: random small runs of each policy (tiny caches where reservations wait, first-fit
holes, batch timers that fire before a batch fills, prompts refused by the slot, the prefill
budget or the cache, one replica or two behind either router), then the seed table's closed
loops. Request tables, pooled ITLs, summaries, step totals and every step row must match."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.simcore import ccore
from kvsim.simcore.specs import EngineConfig
from tests.helpers import random_requests
from tests.test_fastcore_equivalence import ArraysWorkload, _compare

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")

POLICIES = ("static", "dynamic", "orca")


def _random_case(rng: np.random.Generator, policy: str) -> tuple[EngineConfig, ArraysWorkload]:
    mml = int(rng.choice([32, 64, 128]))
    blocks = int(rng.integers(mml // 16 + 1, 4 * mml // 16 + 8)) if rng.random() < 0.6 else 40 * mml // 16
    dp = int(rng.choice([1, 1, 2]))
    common = dict(max_model_len=mml, num_gpu_blocks_override=blocks, data_parallel_size=dp,
                  router=str(rng.choice(["round-robin", "least-loaded"])) if dp > 1 else "least-loaded")
    if policy == "static":
        config = EngineConfig(policy="static", max_batch_size=int(rng.integers(1, 12)),
                              batch_timeout_s=float(rng.choice([0.0, 0.0005, 0.005, 0.05])), **common)
    elif policy == "dynamic":
        config = EngineConfig(policy="dynamic", max_num_seqs=int(rng.integers(1, 12)),
                              max_num_batched_tokens=int(rng.choice([mml, 2 * mml, 48])), **common)
    else:
        chunked = bool(rng.random() < 0.5)
        budget = int(rng.choice([mml, 8, 16, 48])) if chunked else int(rng.choice([mml, 2 * mml]))
        seqs = int(rng.integers(1, 12))
        config = EngineConfig(policy="continuous", allocator="contiguous",
                              reservation=str(rng.choice(["max", "pow2", "oracle"])),
                              enable_chunked_prefill=chunked, max_num_seqs=seqs,
                              max_num_batched_tokens=max(budget, seqs), **common)
    arrivals, prompt, output = random_requests(rng, mml)
    num = len(arrivals)
    max_tokens = output + rng.integers(0, mml, size=num) * (rng.random(num) < 0.5)  # a client's cap
    return config, ArraysWorkload(arrivals, prompt, output, max_tokens)


def _same_rows(core, exact, context):
    a, b = core.steps, exact.steps
    assert len(a) == len(b) and (a["num_steps"] == 1).all(), context
    for col in a.columns:
        assert np.array_equal(a[col].to_numpy(), b[col].to_numpy(), equal_nan=True), (context, col)


@pytest.mark.parametrize("policy", POLICIES)
def test_core_matches_the_python_reference(policy):
    """40 random runs per policy: both cores, the same tables, counters and step rows."""
    rejected = replicas = waited = 0
    for case in range(40):
        seed = 3000 + 100 * POLICIES.index(policy) + case
        config, workload = _random_case(np.random.default_rng(seed), policy)
        core, exact = _compare(config, workload, seed=seed, context=f"case {seed}: {config}")
        _same_rows(core, exact, f"case {seed}")
        assert core.record["engine_core"] == "c"
        rejected += core.summary["rejected"]
        replicas += config.data_parallel_size > 1
        waited += int((core.steps["num_waiting"] > 0).any())
    assert rejected and replicas and waited, "the cases should refuse, route and queue"


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_seed_table_closed_loops(policy):
    """The seed table's setting (70B, TP 8, 64 clients, max_tokens 2048) on 150 requests."""
    from kvsim.profiles import default_profile
    from kvsim.reports.seed_table import POLICIES as SEED_POLICIES
    from kvsim.simcore.catalog import GPUS, MODELS
    from kvsim.workloads import load_workload

    model, gpu = MODELS["llama3-70b"], GPUS["H100-SXM-80GB"]
    config = EngineConfig(tensor_parallel_size=8, **SEED_POLICIES[policy])
    workload = load_workload("seed-table", {"num_requests": 150, "concurrency": 64, "max_tokens": 2048},
                             max_model_len=config.resolved_max_model_len(model))
    core, exact = _compare(config, workload, seed=0, context=f"seed-table {policy}", model=model,
                           profile=default_profile(gpu, model, 8))
    _same_rows(core, exact, policy)
