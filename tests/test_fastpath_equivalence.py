"""The fast engine (decode spans as one event) against the reference mode (one event per step).

A few hundred random small configurations: every policy, paged and contiguous KV, preemption by
recompute and by swap, prefix caching, chunked prefill, n > 1 and beam search, data-parallel
replicas. Request-level results must match (token counts exactly, timestamps within 1e-9 s),
pooled ITLs likewise, and the summaries must be the same (integers exactly, floats to 1e-9).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.profiles import default_profile
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.simulate import simulate
from kvsim.simcore.specs import EngineConfig
from tests.helpers import TIME_TOL_S, ListWorkload, assert_same_requests, assert_same_value, req

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]
NUM_CASES = 240


def _profile():
    # The measured CPU profile of the tiny model: its tables vary with batch and context, so
    # step times differ from step to step (a flat profile would hide pricing mistakes).
    return default_profile(H100, TINY, 1)


def _random_case(rng: np.random.Generator) -> tuple[EngineConfig, list]:
    policy = str(rng.choice(["continuous", "continuous", "continuous", "orca", "dynamic", "static"]))
    block_size = int(rng.choice([1, 2, 4, 8, 16]))
    mml = int(rng.choice([32, 64, 128]))
    chunked = policy in ("continuous", "orca") and bool(rng.random() < 0.5)
    budget = mml if not chunked else int(rng.choice([mml, 8, 16, 24]))
    max_num_seqs = int(rng.integers(1, 12))
    fields = dict(
        block_size=block_size, max_model_len=mml, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs),
        data_parallel_size=int(rng.choice([1, 1, 1, 2, 3])),
        router=str(rng.choice(["least-loaded", "round-robin"])),
    )
    multi = prefix = False
    if policy == "continuous":  # vLLM: paged KV, preemption, prefix caching, n > 1 and beams
        prefix = bool(rng.random() < 0.4)
        multi = bool(rng.random() < 0.3)
        fields.update(
            enable_chunked_prefill=chunked, enable_prefix_caching=prefix,
            preemption_mode=str(rng.choice(["recompute", "swap"])),
            swap_space=float(rng.choice([0.0001, 0.001, 1.0])),
        )
        # a small cache half the time, so sequences get preempted
        min_blocks = -(-mml // block_size) * (4 if multi else 1)
        if rng.random() < 0.5:
            fields["num_gpu_blocks_override"] = min_blocks + int(rng.integers(0, 3 * min_blocks + 4))
        else:
            fields["num_gpu_blocks_override"] = min_blocks * 40
    elif policy == "orca":  # continuous batching over contiguous reservations
        fields.update(policy="continuous", allocator="contiguous", enable_chunked_prefill=chunked,
                      reservation=str(rng.choice(["max", "pow2", "oracle"])))
    elif policy == "static":
        fields.update(policy="static", max_batch_size=int(rng.integers(1, 6)),
                      batch_timeout_s=float(rng.choice([0.0, 0.001, 0.01])))
    else:
        fields["policy"] = policy
    config = EngineConfig(**fields)
    num = int(rng.integers(1, 25))
    gaps = rng.exponential(float(rng.choice([0.0005, 0.002, 0.02])), size=num)
    gaps[rng.random(num) < 0.2] = 0.0  # simultaneous arrivals
    arrivals = np.cumsum(gaps) - gaps[0]
    requests = []
    for i in range(num):
        prompt = int(rng.integers(1, mml // 2))
        output = int(rng.integers(1, mml // 2))
        kw = {}
        if multi and rng.random() < 0.5:
            if rng.random() < 0.5:
                kw["n"] = int(rng.integers(2, 4))
            else:
                kw["beam_width"] = int(rng.integers(2, 4))
        if prefix and rng.random() < 0.6:
            kw["prefix_id"] = int(rng.integers(0, 2))
            kw["num_prefix_tokens"] = min(prompt, 2 * block_size + 1)
        if policy in ("dynamic", "orca") and rng.random() < 0.3:
            kw["max_tokens"] = output + int(rng.integers(0, 8))
        requests.append(req(i, float(arrivals[i]), prompt, output, **kw))
    return config, requests


def _compare(config: EngineConfig, requests: list, seed: int, context: str):
    fast = simulate(TINY, H100, config, ListWorkload(requests), _profile(), seed=seed)
    exact = simulate(TINY, H100, config, ListWorkload(requests), _profile(), seed=seed, exact_steps=True)
    rf, re_ = fast.requests, exact.requests
    assert_same_requests(rf, re_, context)
    assert len(fast.itl_s) == len(exact.itl_s), context
    assert np.allclose(np.sort(fast.itl_s), np.sort(exact.itl_s), rtol=0.0, atol=TIME_TOL_S), context
    assert fast.summary.keys() == exact.summary.keys(), context
    for key in fast.summary:
        assert_same_value(fast.summary[key], exact.summary[key], key, context)
    assert (exact.steps["num_steps"] == 1).all()
    for col in ("duration_s", "kernels_ms", "collectives_ms", "host_ms"):  # span rows sum their steps
        assert fast.steps[col].sum() == pytest.approx(exact.steps[col].sum(), rel=1e-9), (context, col)
    assert fast.steps["num_steps"].sum() == len(exact.steps), context
    _same_steps(fast.steps, exact.steps, context)
    return fast, exact


# a step's own counts: a span row (num_steps > 1) has the same value in each of its steps
PER_STEP = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_running", "num_swapped",
            "num_preempted", "num_swap_blocks")


def _same_steps(fast, exact, context: str) -> None:
    """The fast step table, its rows expanded to one per step, against the reference's: every
    per-step count equal at every step; the KV columns (a row's are those after its last step)
    and start times (within TIME_TOL_S) equal at the rows' ends and starts. `num_waiting` too, except that a span
    whose queue was not empty keeps, for its earlier steps, the count after its last step
    (arrivals queue behind a head that waits anyway), which is at least theirs."""
    if "replica" in fast:  # replica by replica, each in step order
        for replica in exact["replica"].unique():
            _same_steps(fast[fast["replica"] == replica].drop(columns="replica"),
                        exact[exact["replica"] == replica].drop(columns="replica"), f"{context}, replica {replica}")
        return
    counts = fast["num_steps"].to_numpy()
    last = np.cumsum(counts) - 1
    for col in PER_STEP:
        same = np.repeat(fast[col].to_numpy(), counts) == exact[col].to_numpy()
        assert same.all(), f"{context}: steps.{col} differs at steps {np.flatnonzero(~same)[:5].tolist()}"
    waiting = np.repeat(fast["num_waiting"].to_numpy(), counts)
    assert (waiting >= exact["num_waiting"].to_numpy()).all(), f"{context}: num_waiting"
    for col in ("num_waiting", *(c for c in exact.columns if c.startswith("kv_"))):
        same = fast[col].to_numpy() == exact[col].to_numpy()[last]
        assert same.all(), f"{context}: steps.{col} differs at rows {np.flatnonzero(~same)[:5].tolist()}"
    starts = exact["start_s"].to_numpy()[last - counts + 1]
    assert np.allclose(fast["start_s"].to_numpy(), starts, rtol=0.0, atol=TIME_TOL_S), context


@pytest.mark.parametrize("block", range(8))
def test_fast_engine_matches_one_event_per_step(block):
    """NUM_CASES random configurations in 8 blocks (so a failure names a small range)."""
    per_block = NUM_CASES // 8
    spans = 0
    for case in range(block * per_block, (block + 1) * per_block):
        rng = np.random.default_rng(case)
        config, requests = _random_case(rng)
        fast, _ = _compare(config, requests, seed=case, context=f"case {case}: {config}")
        spans += int((fast.steps["num_steps"] > 1).sum())
    assert spans > 10, "the random cases should exercise decode spans"


def test_long_decode_spans_match_on_a_large_cache():
    """Long outputs on a roomy cache: spans of hundreds of steps, arrivals inside them."""
    config = EngineConfig(max_model_len=2048, max_num_seqs=16, enable_prefix_caching=False)
    rng = np.random.default_rng(7)
    requests = [req(i, 0.01 * i + float(rng.random()) * 0.005, int(rng.integers(1, 200)),
                    int(rng.integers(100, 900))) for i in range(40)]
    fast, exact = _compare(config, requests, seed=3, context="long spans")
    assert len(fast.steps) * 10 < len(exact.steps)


def test_slot_store_flags_and_allocator_counts_stay_in_step():
    """The lifecycle's `plain` flags (which requests a DecodeRun may take) equal their
    definition after every step, and a plain request's allocator token count equals its
    computed tokens (what the vectorised block arithmetic assumes)."""
    from kvsim.simcore.simulate import prepare

    checked = 0
    for case in range(60):
        config, requests = _random_case(np.random.default_rng(case))
        if config.policy != "continuous" or config.allocator == "contiguous":
            continue
        sim = prepare(TINY, H100, config, ListWorkload(requests), _profile(), seed=case)
        for engine in sim.engines:
            life, policy = engine.lifecycle, engine.policy
            end_step = policy.end_step

            def checking(plan, finished, queues, end_step=end_step, life=life, policy=policy, case=case):
                nonlocal checked
                store = life.store
                for st in [*life.running, *life.waiting, *life.swapped]:
                    req_ = st.request
                    plain = (req_.n == 1 and req_.beam_width == 1 and st.num_generated > 0
                             and st.num_tokens == st.num_computed_tokens + 1)
                    assert bool(store.plain[st.slot]) == plain, (case, st.request_id)
                    if plain and st in life.running:
                        assert policy.allocator.num_tokens(st.request_id) == st.num_computed_tokens
                        assert policy._seq_index[st.slot] == policy.allocator.seq_index(st.request_id)
                        checked += 1
                return end_step(plan, finished, queues)

            policy.end_step = checking
        sim.run()
    assert checked > 1000


@pytest.mark.parametrize("chunked", [True, False])
def test_arrival_exactly_on_a_step_boundary_inside_a_span(chunked):
    """An arrival at exactly the instant a decode step ends, in the middle of a span with an
    empty queue: the span wakes up, stops at that boundary, and the next step sees the new
    request, as with one event per step (same SimPy event order at that instant)."""
    config = EngineConfig(max_model_len=2048, max_num_seqs=8, enable_prefix_caching=False,
                          enable_chunked_prefill=chunked)
    alone = simulate(TINY, H100, config, ListWorkload([req(0, 0.0, 50, 400)]), _profile(), seed=1,
                     exact_steps=True)
    step_starts = alone.steps["start_s"].to_numpy()  # each one the exact clock value of a boundary
    for j in (2, 9, 57, 300):
        at = float(step_starts[j])
        requests = [req(0, 0.0, 50, 400), req(1, at, 30, 40)]
        fast, exact = _compare(config, requests, seed=1, context=f"arrival on boundary {j}")
        assert (fast.steps["num_steps"] > 1).any(), "a span was running when the request arrived"
        for result in (fast, exact):
            row = result.requests.set_index("request_id").loc[1]
            assert row["first_scheduled_s"] == at, (j, row["first_scheduled_s"], at)


def test_extrapolated_steps_counted_once_when_arrivals_cut_spans():
    """A profile whose decode table stops at 64 context tokens, so long decodes are priced
    outside it: the fast engine prices a span's K steps at once, but an arrival cuts it at
    k < K, and the unrun steps are priced again later. Only the steps that ran may be counted,
    so `extrapolated_steps` equals the reference's (one event per step)."""
    import copy

    from kvsim.simcore.latency import Profile, profile_hash

    data = copy.deepcopy(_profile().data)
    for table in data["decode_attention"].values():
        keep = [i for i, c in enumerate(table["context_tokens"]) if c <= 64]
        table["context_tokens"] = [table["context_tokens"][i] for i in keep]
        table["time_ms"] = [[row[i] for i in keep] for row in table["time_ms"]]
    profile = Profile(data, profile_hash(data))
    config = EngineConfig(max_model_len=2048, max_num_seqs=16, enable_prefix_caching=False)
    rng = np.random.default_rng(11)
    requests = [req(i, 0.004 * i + float(rng.random()) * 0.002, int(rng.integers(40, 120)),
                    int(rng.integers(100, 400))) for i in range(30)]
    fast = simulate(TINY, H100, config, ListWorkload(requests), profile, seed=5)
    exact = simulate(TINY, H100, config, ListWorkload(requests), profile, seed=5, exact_steps=True)
    assert (fast.steps["num_steps"] > 1).sum() > 5, "decode spans should run (and arrivals cut some)"
    assert 0 < exact.summary["extrapolated_steps"] < fast.steps["num_steps"].sum()
    assert fast.summary["extrapolated_steps"] == exact.summary["extrapolated_steps"]


def test_one_token_recompute_tail_among_decodes_is_no_span():
    """A request recomputing after a preemption whose last prompt chunk is one token (chunked
    prefill, budget 3) is scheduled as a decode (a tuple part, not a DecodeRun) beside plain
    decodes: the plan is all decodes, but no decode span (emit_span takes DecodeRuns only;
    the fast path asserted here, found by fuzzing the C core against it)."""
    config = EngineConfig(block_size=64, max_model_len=1024, max_num_seqs=3, max_num_batched_tokens=3,
                          enable_chunked_prefill=True, enable_prefix_caching=False, num_gpu_blocks_override=25)
    requests = [req(0, 0.0, 70, 1024), req(1, 0.0155224, 462, 479), req(2, 0.0155224, 58, 417)]
    _compare(config, requests, seed=0, context="one-token recompute tail")
