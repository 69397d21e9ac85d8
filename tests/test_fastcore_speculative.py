"""Speculative decoding in the compiled core (simcore/csrc/spec.c) against the Python engine's
reference mode, as tests/test_fastcore_equivalence.py holds the plain core: random small runs
with every method (EAGLE / EAGLE-3 / MTP heads, n-gram, a draft model), k from 1 to 6, acceptance
0, 1, fractional or per position, tiny caches that preempt (recompute and swap), one replica or
two behind either router. Request tables, pooled ITLs, summaries (the spec-decode counters and
time shares included), step totals and step rows must match."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kvsim.simcore import ccore, fastcore
from kvsim.simcore.specs import EngineConfig
from kvsim.simcore.speculative import parse_speculative_config
from tests.helpers import random_requests
from tests.test_fastcore_equivalence import H100, TINY, ArraysWorkload, _compare, _profile

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")

METHODS = ("eagle", "eagle3", "mtp", "ngram", "draft_model")
TINY_MTP = dataclasses.replace(TINY, num_nextn_predict_layers=1)  # mtp drafts with the model's own MTP layers


def model_for(method: str):
    """The tiny model, with one MTP module where the method needs it (simcore.speculative)."""
    return TINY_MTP if method == "mtp" else TINY
NUM_CASES = 90


def _speculative(rng: np.random.Generator, method: str) -> str:
    k = int(rng.integers(1, 7))
    spec = {"method": method, "num_speculative_tokens": k}
    if method == "draft_model":
        spec["model"] = "tiny"  # shares its vocabulary with itself; priced from its own profile
    pick = rng.random()
    if pick < 0.15:
        spec["acceptance_rate"] = 0.0
    elif pick < 0.3:
        spec["acceptance_rate"] = 1.0
    elif pick < 0.5:
        spec["acceptance_rates"] = [float(r) for r in rng.random(k)]
    elif pick < 0.85 or method == "draft_model":
        spec["acceptance_rate"] = float(rng.random())
    # else: the method's published default (draft_model has none)
    return json.dumps(spec)


def _random_case(rng: np.random.Generator, method: str) -> tuple[EngineConfig, ArraysWorkload, str]:
    block_size = int(rng.choice([1, 2, 4, 8, 16]))
    mml = int(rng.choice([32, 64, 128]))
    max_num_seqs = int(rng.integers(1, 12))
    budget = int(rng.choice([mml, 4, 8, 16, 24, 48]))
    min_blocks = -(-mml // block_size)
    blocks = min_blocks + int(rng.integers(0, 3 * min_blocks + 4)) if rng.random() < 0.5 else min_blocks * 40
    text = _speculative(rng, method)
    dp = int(rng.choice([1, 1, 2]))
    config = EngineConfig(
        block_size=block_size, max_model_len=mml, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs), enable_chunked_prefill=True,
        enable_prefix_caching=bool(rng.random() < 0.3),
        preemption_mode=str(rng.choice(["recompute", "swap"])), swap_space=float(rng.choice([0.0001, 0.001, 1.0])),
        num_gpu_blocks_override=blocks, data_parallel_size=dp,
        router=str(rng.choice(["round-robin", "least-loaded"])) if dp > 1 else "round-robin",
        speculative_config=parse_speculative_config(text),
    )
    return config, ArraysWorkload(*random_requests(rng, mml)), text


@pytest.mark.parametrize("method", METHODS)
def test_core_matches_the_python_reference(method):
    """NUM_CASES / 5 random runs per method: both cores, the same tables and counters."""
    preempted = accepted = drafts = replicas = 0
    draft = _profile() if method == "draft_model" else None
    for case in range(NUM_CASES // len(METHODS)):
        seed = 7000 + 100 * METHODS.index(method) + case
        config, workload, text = _random_case(np.random.default_rng(seed), method)
        core, exact = _compare(config, workload, seed=seed, context=f"case {seed}: {text} {config}",
                               model=model_for(method), draft_profile=draft)
        for name in ("spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens"):
            assert core.summary[name] == exact.summary[name], (seed, name)
        assert core.summary["spec_acceptance_per_position"] == exact.summary["spec_acceptance_per_position"], seed
        preempted += core.totals.num_preempted
        drafts += core.summary["spec_num_draft_tokens"]
        accepted += core.summary["spec_num_accepted_tokens"]
        replicas += config.data_parallel_size > 1
    assert preempted and drafts and accepted and replicas, "the cases should preempt, draft, accept, route"


def test_more_requests_and_the_step_rows():
    """A longer run (400 requests, KV pressure) on the 8B model's measured tables: every step row,
    one per step in both cores, the same (prices, counts, KV)."""
    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import MODELS
    from kvsim.workloads import load_workload

    model = MODELS["llama3-8b"]
    spec = parse_speculative_config('{"method": "eagle3", "num_speculative_tokens": 4}')
    config = EngineConfig(max_num_seqs=64, num_gpu_blocks_override=600, speculative_config=spec)
    workload = load_workload("sharegpt", {"num_requests": 400, "rate": 40.0},
                             max_model_len=config.resolved_max_model_len(model))
    core, exact = _compare(config, workload, seed=3, context="8B eagle3", model=model,
                           profile=default_profile(H100, model, 1))
    assert core.totals.num_preempted > 0
    a, b = core.steps, exact.steps
    assert len(a) == len(b) and (a["num_steps"] == 1).all()
    for col in a.columns:
        assert np.array_equal(a[col].to_numpy(), b[col].to_numpy()), col


def test_the_core_runs_speculation_and_says_why_not_when_it_cannot():
    config, workload, _ = _random_case(np.random.default_rng(5), "eagle")
    from kvsim.simcore.simulate import prepare

    sim = prepare(TINY, H100, config, workload, _profile(), seed=0)
    assert fastcore.unsupported(sim) == "" and sim.choose_core()[0] == "c"
    # a stream other than PCG64 cannot be replayed in C: the Python engine runs it
    for engine in sim.replicas:
        engine.policy.accept_rng = np.random.Generator(np.random.MT19937(0))
    assert "PCG64" in fastcore.unsupported(sim)
    one = dataclasses.replace(config, data_parallel_size=1)
    result = prepare(TINY, H100, one, workload, _profile(), seed=0).run()
    assert result.record["engine_core"] == "c" and result.summary["spec_num_drafts"] > 0


@pytest.mark.parametrize("dp", [1, 2])
def test_shared_prefixes_with_prefix_caching_match(dp):
    """Speculation over cached shared prefixes: a verify's rejected tail is freed past the prefix
    blocks (block_pool decref), evictions and hits as in the reference."""
    from kvsim.workloads.arrivals import GammaArrivals
    from kvsim.workloads.lengths import Uniform
    from kvsim.workloads.spec import SharedPrefix, WorkloadSpec

    hit = 0
    for case in range(8):
        rng = np.random.default_rng(9000 + case)
        method = METHODS[case % 4]
        config, _, text = _random_case(rng, method)
        mml = config.max_model_len
        config = dataclasses.replace(config, enable_prefix_caching=True, data_parallel_size=dp, router="least-loaded")
        prefix = SharedPrefix(num_groups=int(rng.integers(1, 4)), prefix_len=int(rng.integers(1, mml // 2)),
                              fraction=float(rng.choice([0.3, 0.8, 1.0])))
        workload = WorkloadSpec(name="prefixes", num_requests=int(rng.integers(10, 50)),
                                arrival=GammaArrivals(rate=float(rng.choice([50.0, 500.0, 5000.0]))),
                                prompt_len=Uniform(1, mml // 2), output_len=Uniform(1, mml // 2),
                                shared_prefix=prefix, max_model_len=mml)
        core, _ = _compare(config, workload, seed=case, context=f"prefix dp {dp} case {case}: {text}",
                           model=model_for(method))
        hit += bool(core.summary.get("prefix_cache_hit_rate"))
    assert hit >= 4, "most cases should adopt cached blocks"


def test_a_recomputing_requests_one_token_chunk_does_not_draft():
    """Regression (fuzz, case 901 at seed 1): a request preempted by recompute that gets a one-token
    chunk (the budget's last token) is priced as a decode but samples nothing, so the drafter does
    not run for it; the C core counted it among the drafting sequences (one more in the EAGLE-3
    head's passes) and its step cost more."""
    config, workload, text = _random_case(np.random.default_rng(901), "eagle3")
    core, _ = _compare(config, workload, seed=1, context=f"case 901 seed 1: {text}")
    assert core.totals.num_preempted > 0
