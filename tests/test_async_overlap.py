"""`--engine-version vllm-v1-async`: a step costs max(GPU step, hidden CPU work) + the visible gap
(simcore.latency.HostOverhead's hidden terms), in both cores, spans, speculation, pipelines and
replicas included; a profile without hidden terms prices as before."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from kvsim.profiles.host import ASYNC_GAP_MS, engine_host
from kvsim.simcore import ccore
from kvsim.simcore.latency import StepLatencyModel, parse_profile
from kvsim.simcore.simulate import simulate
from kvsim.simcore.speculative import parse_speculative_config
from tests.helpers import assert_same_value
from tests.test_fastcore_equivalence import H100, TINY, _compare, _profile
from tests.test_fastcore_equivalence import _random_case as plain_case

ASYNC = "vllm-v1-async"


def _straddling_profile(per_step_ms: float = 0.05, per_seq_ms: float = 0.012):
    """The tiny model's profile with hidden CPU work that crosses its GPU step (~0.11 ms decode):
    shorter than the GPU's step at batch 1 to 5, longer past it, so runs switch between the two."""
    doc = copy.deepcopy(_profile().data)
    doc["host_overhead_by_engine"][ASYNC].update(hidden_per_step_ms=per_step_ms, hidden_per_seq_ms=per_seq_ms)
    return parse_profile(doc, "tiny-async")


def test_hidden_terms_are_the_v1_loop_at_each_tp():
    """The generated profiles carry vllm-v1's terms as the hidden work, the gap as the visible."""
    doc = _profile().data
    assert doc["host_overhead_by_engine"][ASYNC] == pytest.approx({
        "per_step_ms": ASYNC_GAP_MS, "per_seq_ms": 0.0, "per_prefill_step_ms": 0.0, "per_prefill_token_ms": 0.0,
        "hidden_per_step_ms": engine_host("vllm-v1", 1)[0], "hidden_per_seq_ms": engine_host("vllm-v1", 1)[1]})
    assert "hidden_per_step_ms" not in doc["host_overhead_by_engine"]["vllm-v1"]


def test_cpu_bound_steps_cost_the_cpu_time_gpu_bound_ones_the_gpu_time_plus_gap():
    """Hand-computed: hidden = 0.05 + 0.012 n ms against the GPU's kernels + collectives."""
    doc = _straddling_profile().data
    sync = StepLatencyModel(doc, engine_version="vllm-v1")  # the same GPU parts, its own host terms
    model = StepLatencyModel(doc, engine_version=ASYNC)
    seen = set()
    for n in (1, 2, 4, 8, 12, 32):
        kernels, coll, _ = sync.step_breakdown_ms(n, [], n, n * 40, n)
        gpu, cpu = kernels + coll, 0.05 + 0.012 * n
        ms = model.step_time_s(n, [], n, n * 40, n) * 1000.0
        if cpu > gpu:  # CPU-bound: the hidden work, then the gap
            assert ms == pytest.approx(cpu + ASYNC_GAP_MS, rel=1e-12)
        else:  # GPU-bound: the GPU's step, then the gap
            assert ms == pytest.approx(gpu + ASYNC_GAP_MS, rel=1e-12)
        seen.add(cpu > gpu)
        _, _, host = model.step_breakdown_ms(n, [], n, n * 40, n)
        assert host == pytest.approx(ASYNC_GAP_MS + max(0.0, cpu - gpu), rel=1e-12)
    assert seen == {True, False}, "the batches should straddle the crossover"


def test_decode_spans_price_each_step_as_a_single_step():
    """decode_span_times_s takes the max per step, as step_time_s (to 1e-12 relative, as without
    hidden work: numpy's exp), where the span crosses from GPU-bound to CPU-bound (short spans on
    Python floats, long ones by numpy)."""
    model = StepLatencyModel(_straddling_profile().data, engine_version=ASYNC)
    crossed = False
    for n, first, steps in ((4, 2, 8), (5, 2, 40), (6, 2500, 800), (6, 2785, 12)):  # batch 6 crosses near 2,790
        sums = np.arange(n * first, n * (first + steps), n)
        span = model.decode_span_times_s(n, sums)
        single = [model.step_time_s(n, [], n, int(s), n) for s in sums]
        assert span == pytest.approx(single, rel=1e-12, abs=0)
        excess = model.decode_span_excess_ms(n, sums)
        hosts = [model.step_breakdown_ms(n, [], n, int(s), n)[2] for s in sums]
        assert model.host.per_step_ms + excess == pytest.approx(hosts, rel=1e-9, abs=1e-15)
        crossed |= bool((excess > 0).any() and (excess == 0).any())
    assert crossed, "a span should cross over"


def test_profiles_without_hidden_terms_price_as_before():
    doc = copy.deepcopy(_profile().data)
    for key in ("hidden_per_step_ms", "hidden_per_seq_ms"):
        del doc["host_overhead_by_engine"][ASYNC][key]
    model = StepLatencyModel(doc, engine_version=ASYNC)
    assert model.hidden is None
    assert model.step_time_s(8, [], 8, 320, 8) * 1000 == pytest.approx(
        sum(model.step_breakdown_ms(8, [], 8, 320, 8)), rel=1e-12)
    assert "hidden_per_step_ms" not in model.host.to_dict()


needs_core = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


@needs_core
@pytest.mark.parametrize("block", range(2))
def test_both_cores_match_with_async_pricing(block):
    """Random runs (the plain equivalence test's cases, dp 1 and 2) priced as vllm-v1-async on a
    profile whose hidden work crosses the GPU step: the C core (spans included) against the
    Python reference, step by step."""
    profile = _straddling_profile()
    spans = cpu_bound = 0
    for case in range(block * 12, block * 12 + 12):
        config, workload = plain_case(np.random.default_rng(900 + case))
        config = dataclasses.replace(config, engine_version=ASYNC, data_parallel_size=1 + case % 2)
        core, exact = _compare(config, workload, seed=case, profile=profile, context=f"async case {case}: {config}")
        spans += int((core.steps["num_steps"] > 1).sum())
        cpu_bound += int((exact.steps["host_ms"] > ASYNC_GAP_MS + 1e-9).sum())
    assert spans and cpu_bound, "the cases should span and meet CPU-bound steps"


@needs_core
def test_python_spans_match_single_steps():
    """The Python engine's own decode spans against its single steps, async-priced."""
    profile = _straddling_profile()
    for case in range(6):
        config, workload = plain_case(np.random.default_rng(950 + case))
        config = dataclasses.replace(config, engine_version=ASYNC)
        spanned = simulate(TINY, H100, config, workload, profile, seed=case, engine_core="python")
        exact = simulate(TINY, H100, config, workload, profile, seed=case, exact_steps=True)
        assert spanned.summary.keys() == exact.summary.keys(), case
        for key in exact.summary:  # spans sum KV and times by numpy (as without hidden work)
            assert_same_value(spanned.summary[key], exact.summary[key], key, f"case {case}")
        for col in ("duration_s", "kernels_ms", "collectives_ms", "host_ms"):
            assert spanned.steps[col].sum() == pytest.approx(exact.steps[col].sum(), rel=1e-9), (case, col)


@needs_core
@pytest.mark.parametrize("method", ["eagle", "ngram", "draft_model"])
def test_speculative_steps_match(method):
    """A speculative step's hidden work against its verify + draft GPU time, in both cores."""
    # a verify + draft step is longer: more work to hide (a draft model's passes longer still)
    profile = _straddling_profile(0.2, 0.06) if method == "draft_model" else _straddling_profile(0.1, 0.03)
    spec = parse_speculative_config(f'{{"method": "{method}", "num_speculative_tokens": 3, "acceptance_rate": 0.6'
                                    + (', "model": "tiny"' if method == "draft_model" else "") + "}")
    cpu_bound = gpu_bound = 0
    for case in range(3):
        config, workload = plain_case(np.random.default_rng(970 + case))
        config = dataclasses.replace(config, engine_version=ASYNC, speculative_config=spec, enable_chunked_prefill=True,
                                     max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len),
                                     data_parallel_size=1 + case % 2)
        _, exact = _compare(config, workload, seed=case, profile=profile, context=f"spec {method} {case}",
                            draft_profile=profile if method == "draft_model" else None)
        cpu_bound += int((exact.steps["host_ms"] > ASYNC_GAP_MS + 1e-9).sum())
        gpu_bound += int((exact.steps["host_ms"] == ASYNC_GAP_MS).sum())
    assert cpu_bound and (gpu_bound or method == "ngram"), "some steps CPU-bound, some GPU-bound (n-gram: its host)"


@needs_core
def test_pipeline_steps_match(monkeypatch):
    """Two pipeline stages: each micro-batch priced with the max, in both cores."""
    from tests import test_fastcore_equivalence as plain

    def run(*args, exact_steps=False, **kw):  # the reference on the Python engine (as test_fastcore_pipeline)
        if exact_steps:
            kw["engine_core"] = "python"
        return simulate(*args, exact_steps=exact_steps, **kw)

    monkeypatch.setattr(plain, "simulate", run)
    profile = _straddling_profile()
    cpu_bound = 0
    for case in range(4):
        config, workload = plain_case(np.random.default_rng(990 + case))
        config = dataclasses.replace(config, engine_version=ASYNC, pipeline_parallel_size=2)
        _, exact = _compare(config, workload, seed=case, profile=profile, context=f"pp {case}")
        cpu_bound += int((exact.steps["host_ms"] > ASYNC_GAP_MS + 1e-9).sum())
    assert cpu_bound, "some micro-batches should be CPU-bound"


@pytest.mark.parametrize("core", ["python", "c"])
def test_first_step_after_idle_pays_its_cpu_work(core):
    """An engine woken from idle has no GPU step to hide its first step's CPU work behind (vLLM's
    step_with_batch_queue schedules it, then launches it): that step costs gap + hidden + GPU;
    the steps after it max(GPU, hidden) + gap. Two requests 1 s apart: both first steps are cold."""
    if core == "c" and ccore.library() is None:
        pytest.skip("no compiled core")
    from kvsim.simcore.specs import EngineConfig
    from tests.test_fastcore_equivalence import ArraysWorkload

    profile = _straddling_profile(0.05, 0.03)  # hidden 0.08 ms at batch 1: under the GPU's decode step
    config = EngineConfig(block_size=16, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64,
                          enable_chunked_prefill=True, enable_prefix_caching=False, engine_version=ASYNC,
                          num_gpu_blocks_override=100)
    workload = ArraysWorkload(np.array([0.0, 1.0]), np.array([10, 10]), np.array([3, 3]))
    kw = {"engine_core": "c"} if core == "c" else {"exact_steps": True}
    result = simulate(TINY, H100, config, workload, profile, seed=0, **kw)
    steps = result.steps
    if core == "c":
        assert result.record["engine_core"] == "c" and (steps["num_steps"] == 1).all()
    sync = StepLatencyModel(profile.data, engine_version="vllm-v1")  # the GPU's parts
    gpu_prefill = sum(sync.step_breakdown_ms(10, [(10, 0)], 0, 0, 1)[:2])
    hidden = 0.05 + 0.03
    durations = (steps["duration_s"].to_numpy() * 1000.0).tolist()
    assert len(durations) == 6  # prefill + 2 decodes, twice
    for first in (0, 3):
        assert durations[first] == pytest.approx(ASYNC_GAP_MS + hidden + gpu_prefill, rel=1e-12)
        for k, ctx in ((1, 11), (2, 12)):
            gpu = sum(sync.step_breakdown_ms(1, [], 1, ctx, 1)[:2])
            assert gpu > hidden
            assert durations[first + k] == pytest.approx(gpu + ASYNC_GAP_MS, rel=1e-12)


@needs_core
def test_orca_reservations_match():
    """Continuous batching over contiguous reservations (Orca), async-priced, in both cores."""
    from tests import test_fastcore_batching as batching

    profile = _straddling_profile()
    for case in range(4):
        config, workload = batching._random_case(np.random.default_rng(1000 + case), "orca")
        config = dataclasses.replace(config, engine_version=ASYNC)
        _compare(config, workload, seed=case, profile=profile, context=f"orca {case}")


@needs_core
def test_autoscaled_replicas_match():
    """Replicas started, drained and woken by the autoscaler (each one's first step after idle
    priced cold), async-priced, in both cores."""
    from kvsim.simcore.config import resolve
    from kvsim.simcore.simulate import prepare
    from tests.test_fleet_core import _both, _day, _policy

    profile = _straddling_profile()
    scaled_up = 0
    for case in (6000, 6001, 6002, 6005):  # seeds of tests/test_fleet_core.py's cases; 3 of them scale up
        rng = np.random.default_rng(case)
        config, _ = plain_case(rng)
        workload = _day(rng, config.max_model_len)
        policy = _policy(rng, int(rng.integers(1, 5)))
        cfg = resolve(TINY, H100, dataclasses.replace(config, engine_version=ASYNC))

        def make(core, exact, cfg=cfg, workload=workload, policy=policy, case=case):
            return prepare(TINY, H100, cfg, workload, profile, seed=case, autoscale=policy, engine_core=core,
                           exact_steps=exact)

        core, _ = _both(make, f"async autoscale case {case}")
        scaled_up += any(r[2] for r in core.record["autoscale"]["timeline"])
    assert scaled_up, "some cases should start replicas"


@needs_core
def test_disaggregated_pools_match():
    """Prefill and decode pools (each instance's first step after idle priced cold), async-priced."""
    from kvsim.simcore.errors import StalledError
    from tests.test_disagg_core import _random_case as disagg_case
    from tests.test_disagg_core import compare

    profiles = {"prefill": _straddling_profile(), "decode": _straddling_profile()}
    ran = 0
    for case in range(6):
        configs, workload, link = disagg_case(np.random.default_rng(case))
        configs = {k: dataclasses.replace(c, engine_version=ASYNC) for k, c in configs.items()}
        try:
            compare(TINY, configs, workload, profiles, seed=case, link=link, context=f"async disagg {case}")
        except StalledError:  # a tiny decode cache (tests/test_disagg_core.py's STALLS)
            continue
        ran += 1
    assert ran >= 4
