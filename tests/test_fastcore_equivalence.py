"""The compiled engine core (simcore/csrc/engine.c) against the Python engine's reference mode
(--exact-steps), on a few hundred random small configurations it supports: continuous batching
over the paged allocator, vLLM V0 (no chunked prefill) and V1 (chunked), tiny caches that force
recompute preemption, simultaneous arrivals, prompts clipped or refused by max_model_len, by the
token budget or by the cache. Request-level results must match (token counts exactly,
timestamps within 1e-9 s), pooled ITLs likewise, summaries (integers exactly, floats to 1e-9
relative) and step totals; the core's step rows may cover several decode steps.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kvsim.profiles import default_profile
from kvsim.reports.regime import regime_of
from kvsim.simcore import ccore
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.simulate import prepare, simulate
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads import load_workload
from kvsim.workloads.arrivals import open_loop_process
from tests.helpers import TIME_TOL_S, assert_cores_agree, assert_same_value, random_requests

TINY = MODELS["tiny"]
H100 = GPUS["H100-SXM-80GB"]
NUM_CASES = 240

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


class ArraysWorkload:
    """Fixed requests (ids in arrival order) submitted as a workload file's are: one chunk of
    arrays, the open-loop process of workloads.arrivals."""

    name = "arrays"
    is_closed_loop = False

    def __init__(self, arrival_s, prompt, output, max_tokens=None):
        self.num_requests = len(arrival_s)
        self.chunk = SimpleNamespace(
            arrival_s=np.asarray(arrival_s, dtype=np.float64), num_prompt_tokens=np.asarray(prompt),
            num_output_tokens=np.asarray(output),
            max_tokens=np.asarray(output if max_tokens is None else max_tokens),
            n=np.ones(len(prompt), dtype=np.int64), beam_width=np.ones(len(prompt), dtype=np.int64),
            prefix_id=np.full(len(prompt), -1), num_prefix_tokens=np.zeros(len(prompt), dtype=np.int64),
            first_id=0)

    def iter_arrays(self, seed):
        yield self.chunk
        return {"generated": self.num_requests}

    def process(self, env, sink, seed):
        from kvsim.simcore.request import Request

        c = self.chunk
        requests = list(map(Request, range(self.num_requests), c.arrival_s.tolist(), c.num_prompt_tokens.tolist(),
                            c.num_output_tokens.tolist(), c.max_tokens.tolist()))
        yield from open_loop_process(env, sink, [(requests, c.arrival_s)])
        return {"generated": self.num_requests}

    def describe(self, stats=None):
        return {"name": self.name, "num_requests": self.num_requests, "generation": stats}


def _profile():
    return default_profile(H100, TINY, 1)  # measured tables: step times vary with batch and context


def _random_case(rng: np.random.Generator) -> tuple[EngineConfig, ArraysWorkload]:
    block_size = int(rng.choice([1, 2, 4, 8, 16]))
    mml = int(rng.choice([32, 64, 128]))
    chunked = bool(rng.random() < 0.5)
    max_num_seqs = int(rng.integers(1, 12))
    budget = int(rng.choice([mml, 8, 16, 24, 48])) if chunked else int(rng.choice([mml, 2 * mml]))  # V0: >= max_model_len
    min_blocks = -(-mml // block_size)
    if rng.random() < 0.5:  # a small cache half the time, so sequences get preempted
        blocks = min_blocks + int(rng.integers(0, 3 * min_blocks + 4))
    else:
        blocks = min_blocks * 40
    config = EngineConfig(
        block_size=block_size, max_model_len=mml, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs), enable_chunked_prefill=chunked,
        enable_prefix_caching=bool(rng.random() < 0.3),
        preemption_mode=str(rng.choice(["recompute", "swap"])), swap_space=float(rng.choice([0.0001, 0.001, 1.0])),
        num_gpu_blocks_override=blocks,
    )
    return config, ArraysWorkload(*random_requests(rng, mml))


def _compare(config: EngineConfig, workload, seed: int, context: str, model=TINY, profile=None, **extra):
    """Both cores on one run (`extra`: more arguments of simulate, e.g. draft_profile)."""
    profile = profile or _profile()
    core = simulate(model, H100, config, workload, profile, seed=seed, engine_core="c", **extra)
    exact = simulate(model, H100, config, workload, profile, seed=seed, exact_steps=True, **extra)
    assert_cores_agree(core, exact, context)
    for kind, value in exact.totals.kv_slot_s.items():
        assert_same_value(core.totals.kv_slot_s[kind], value, kind, context)
    steps, ref = core.steps, exact.steps
    for col in ("duration_s", "kernels_ms", "collectives_ms", "host_ms"):  # a row sums its steps
        assert steps[col].sum() == pytest.approx(ref[col].sum(), rel=1e-9), (context, col)
    # a row's counts and KV are those of its last step; its start that of its first
    last = np.cumsum(steps["num_steps"].to_numpy()) - 1
    for col in ("num_seqs", "num_running", "num_waiting", "num_preempted", *(c for c in ref if c.startswith("kv_"))):
        assert (steps[col].to_numpy() == ref[col].to_numpy()[last]).all(), (context, col)
    first = last - steps["num_steps"].to_numpy() + 1
    assert np.allclose(steps["start_s"].to_numpy(), ref["start_s"].to_numpy()[first], rtol=0, atol=TIME_TOL_S)
    assert core.record["workload"] == exact.record["workload"], context
    a, b = regime_of(core), regime_of(exact)  # from the step rows: a row's end state stands for its steps
    assert (a.label, a.peak_kv_use, a.num_preempted) == (b.label, b.peak_kv_use, b.num_preempted), context
    assert_same_value(a.kv_blocked_share, b.kv_blocked_share, "kv_blocked_share", context)
    return core, exact


@pytest.mark.parametrize("block", range(6))
def test_core_matches_the_python_reference(block):
    """NUM_CASES random configurations in 6 blocks (so a failure names a small range)."""
    per_block = NUM_CASES // 6
    preempted = rejected = spans = swapped = 0
    for case in range(block * per_block, (block + 1) * per_block):
        config, workload = _random_case(np.random.default_rng(case))
        core, _ = _compare(config, workload, seed=case, context=f"case {case}: {config}")
        preempted += core.totals.num_preempted
        swapped += int(core.steps["num_swap_blocks"].sum() > 0)
        rejected += core.summary["rejected"]
        spans += int((core.steps["num_steps"] > 1).sum())
    assert preempted and rejected and spans, "the random cases should preempt, refuse and aggregate"
    assert swapped, "and swap"


def test_peer_workload_file_matches():
    """The peer comparison's workload file (Azure conversation lengths, Poisson arrivals) on the
    70B model, V0 and V1, through the workload's own chunks."""
    from kvsim.workloads import load_workload

    model, gpu = MODELS["llama2-70b"], H100
    for chunked in (False, True):
        config = EngineConfig(tensor_parallel_size=4, max_num_seqs=128, max_num_batched_tokens=4096,
                              enable_chunked_prefill=chunked, enable_prefix_caching=False)
        workload = load_workload("benchmarks/peer-azure-conv.yaml", {"rate": 4, "num_requests": 300},
                                 max_model_len=config.resolved_max_model_len(model))
        _compare(config, workload, seed=1, context=f"peer chunked={chunked}", model=model,
                 profile=default_profile(gpu, model, 4))


def test_auto_and_refusals():
    """--engine-core auto records which engine ran and why; c refuses what it cannot run."""
    from kvsim.simcore.errors import ConfigError

    config, workload = _random_case(np.random.default_rng(3))
    result = simulate(TINY, H100, config, workload, _profile(), engine_core="python")
    assert result.record["engine_core"] == "python" and result.record["engine_core_reason"] == "--engine-core python"
    beams = load_workload("sharegpt", {"rate": 50, "input_len": 8, "output_len": 8, "num_requests": 10, "beam_width": 2})
    sim = prepare(TINY, H100, config, beams, _profile())
    assert sim.choose_core()[0] == "python" and "beam search" in sim.choose_core()[1]
    with pytest.raises(ConfigError, match="beam search"):
        simulate(TINY, H100, config, beams, _profile(), engine_core="c")
    with pytest.raises(ConfigError, match="exact-steps"):
        simulate(TINY, H100, config, workload, _profile(), engine_core="c", exact_steps=True)
    with pytest.raises(ConfigError, match="engine-core"):
        simulate(TINY, H100, config, workload, _profile(), engine_core="fortran")


@pytest.mark.parametrize("dp", [1, 2])
def test_arrivals_at_step_ends(dp):
    """An arrival planned at the very instant a step ends: SimPy takes the two events in the order
    they were created (the arrival's timeout, made at the previous arrival, against the step's,
    made at its start), and so must the core (with two replicas, the least-loaded router then
    sees the step's finished requests gone, or not). Arrivals are moved onto step ends of the
    reference run one at a time (the run up to there stays the same)."""
    import dataclasses

    ties = 0
    for case in range(24):
        rng = np.random.default_rng(1000 + case)
        config, workload = _random_case(rng)
        if dp > 1:
            config = dataclasses.replace(config, data_parallel_size=dp, router="least-loaded")
        c = workload.chunk
        for _ in range(3):
            exact = simulate(TINY, H100, config, workload, _profile(), seed=case, exact_steps=True)
            steps = exact.steps
            ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
            arrivals = c.arrival_s
            later = np.flatnonzero(ends > arrivals[0])
            if not len(later) or len(arrivals) < 2:
                break
            end = float(ends[later[int(rng.integers(0, len(later)))]])
            i = int(np.searchsorted(arrivals, end))  # the arrival moved onto it, others keep their order
            i = min(max(i, 1), len(arrivals) - 1)
            previous = float(arrivals[i - 1])
            if previous >= end or previous + (end - previous) != end:  # its stamp would not be `end`
                continue
            arrivals = arrivals.copy()
            arrivals[i] = end
            arrivals[i + 1:] = np.maximum(arrivals[i + 1:], end)
            c.arrival_s = arrivals
            ties += 1
        _compare(config, workload, seed=case, context=f"tie case {case}")
    assert ties > 12


def _bursty_arrivals(rng: np.random.Generator, num: int, mean_gap_s: float, zero_share: float) -> np.ndarray:
    """Poisson arrival times with about `zero_share` of them pulled back to t = 0 (a burst of
    simultaneous arrivals at the start), kept non-decreasing."""
    arrivals = np.cumsum(rng.exponential(mean_gap_s, size=num))
    arrivals[rng.random(num) < zero_share] = 0.0
    return np.maximum.accumulate(arrivals)


def test_held_arrivals_match(monkeypatch):
    """An overloaded run past the hold threshold (Engine.hold_arrivals): the workload waits for
    the queue to drain and then sends what it held with its planned times, in the core as in
    the reference (every timeline, the steps' queue lengths, the number of holds)."""
    import kvsim.simcore.engine as engine_module

    monkeypatch.setattr(engine_module, "HOLD_WAITING", 12)
    for case in range(12):
        rng = np.random.default_rng(500 + case)
        config, _ = _random_case(rng)
        num = 150
        arrivals = _bursty_arrivals(rng, num, mean_gap_s=0.0002, zero_share=0.2)
        mml = config.max_model_len
        workload = ArraysWorkload(arrivals, rng.integers(1, mml // 2, size=num), rng.integers(1, mml // 2, size=num))
        core, exact = _compare(config, workload, seed=case, context=f"hold case {case}")
        assert core.record["resolution"] == exact.record["resolution"]
        assert "waiting" in exact.record["resolution"], "the case should hold arrivals back"


def test_past_the_memory_caps(monkeypatch):
    """Rows past the caps of the bounded stores (tiny caps here): the streamed request rows (in
    the order requests left) and step totals, the histogram summaries and the saturation sums
    by block of arrivals are the reference's."""
    import kvsim.simcore.metrics as metrics
    import kvsim.simcore.records as records

    monkeypatch.setattr(records, "REQUEST_ROWS_CAP", 40)
    monkeypatch.setattr(records, "_ROW_CHUNK", 16)
    monkeypatch.setattr(records, "ITL_EXACT_CAP", 300)
    monkeypatch.setattr(records, "_FLUSH", 64)
    monkeypatch.setattr(metrics, "STEP_ROWS_CAP", 64)
    monkeypatch.setattr(metrics, "_STEP_CHUNK", 32)
    for case in range(4):
        rng = np.random.default_rng(700 + case)
        config, _ = _random_case(rng)
        num = 200
        arrivals = _bursty_arrivals(rng, num, mean_gap_s=0.002, zero_share=0.3)
        mml = config.max_model_len
        workload = ArraysWorkload(arrivals, rng.integers(1, mml // 2, size=num), rng.integers(1, mml, size=num))
        streams = {}
        for core in ("c", "python"):
            rows = streams[core] = {"requests": [], "steps": []}
            result = simulate(TINY, H100, config, workload, _profile(), seed=case, engine_core=core,
                              exact_steps=core == "python",
                              stream=lambda table, columns, rows=rows: rows[table].append(columns))
            streams[core + "_result"] = result
        c, p = streams["c_result"], streams["python_result"]
        assert not c.records.kept and c.record["resolution"] == p.record["resolution"], case
        for key in c.summary:
            assert_same_value(c.summary[key], p.summary[key], key, f"caps case {case}")
        a = {k: np.concatenate([chunk[k] for chunk in streams["c"]["requests"]]) for k in streams["c"]["requests"][0]}
        b = {k: np.concatenate([chunk[k] for chunk in streams["python"]["requests"]]) for k in a}
        for k in a:
            if k.endswith("_s"):
                assert np.allclose(a[k], b[k], rtol=0, atol=TIME_TOL_S, equal_nan=True), (case, k)
            else:
                assert (a[k] == b[k]).all(), (case, k)
        sa = {k: np.concatenate([chunk[k] for chunk in streams["c"]["steps"]]) for k in ("num_steps", "duration_s")}
        sb = {k: np.concatenate([chunk[k] for chunk in streams["python"]["steps"]]) for k in sa}
        assert sa["num_steps"].sum() == sb["num_steps"].sum() == p.totals.num_steps, case
        assert sa["duration_s"].sum() == pytest.approx(sb["duration_s"].sum(), rel=1e-9), case
        np.testing.assert_allclose(c.records.bounded.blocks, p.records.bounded.blocks, rtol=1e-9, atol=1e-12)


def test_cli_engine_core():
    """`kvsim run --engine-core`: c refuses an unsupported configuration in one line before any
    output (exit 2); the record says which engine ran."""
    import json

    from typer.testing import CliRunner

    from kvsim.cli.main import app

    args = ["run", "--num-requests", "20", "--rate", "5", "--input-len", "64", "--output-len", "8", "--json"]
    # (static batching with --n 2 is refused before an engine is chosen since round 8:
    # tests/test_reliability_round8.py, every request would be rejected)
    for extra, reason in ((["--exact-steps"], "exact-steps"), (["--beam-width", "2"], "beam search")):
        result = CliRunner().invoke(app, [*args, *extra, "--engine-core", "c"])
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert result.stderr.startswith("kvsim: error: --engine-core c") and reason in result.stderr
    ran = {}
    for core in ("c", "python", "auto"):
        result = CliRunner().invoke(app, [*args, "--engine-core", core])
        assert result.exit_code == 0, result.stderr
        ran[core] = json.loads(result.stdout)
    assert ran["c"]["record"]["engine_core"] == ran["auto"]["record"]["engine_core"] == "c"
    assert ran["python"]["record"]["engine_core_reason"] == "--engine-core python"
    assert ran["c"]["summary"]["completed"] == ran["python"]["summary"]["completed"] == 20


def test_rescaled_workloads_of_the_rate_search(monkeypatch):
    """--find-max-rate and `kvsim plan` replay one draw at many rates (reports.capacity's
    ScaledWorkload): the core runs them with the Python engine's results."""
    import kvsim.simcore.simulate as simulate_module
    from kvsim.reports.capacity import SLO, RateScaler, run_against
    from kvsim.workloads.arrivals import GammaArrivals
    from kvsim.workloads.lengths import Uniform
    from kvsim.workloads.spec import WorkloadSpec

    spec = WorkloadSpec(name="w", num_requests=150, arrival=GammaArrivals(rate=50.0),
                        prompt_len=Uniform(4, 60), output_len=Uniform(2, 40))
    config = EngineConfig(max_model_len=128, max_num_seqs=6, block_size=4, num_gpu_blocks_override=60)
    slo = SLO(ttft_p95_ms=50.0)
    scaler = RateScaler(spec)
    stopped = 0
    for rate in (20.0, 80.0, 400.0):
        for early_stop in (False, True):  # the early-stop watch stops both cores after the same request
            core = run_against(TINY, H100, config, scaler.at(rate), _profile(), 2, slo, early_stop=early_stop)
            monkeypatch.setattr(simulate_module, "AUTO_C", False)
            python = run_against(TINY, H100, config, scaler.at(rate), _profile(), 2, slo, early_stop=early_stop)
            monkeypatch.setattr(simulate_module, "AUTO_C", True)
            assert (core.pop("engine_core"), python.pop("engine_core")) == ("c", "python")
            assert core.keys() == python.keys()
            for key in core:
                assert_same_value(core[key], python[key], key, f"rate {rate}")
            stopped += "early_stop" in core
    assert stopped, "some run should have stopped early"
    sim = prepare(TINY, H100, config, scaler.at(50.0), _profile(), seed=2)
    assert sim.choose_core() == ("c", "")


def test_max_tokens_of_a_workload_file_reach_the_core():
    """`offline-batch` caps max_tokens at 1024 for outputs drawn around 338 tokens: each request's
    max_tokens (a column of the request table) is what the workload says, not its output length,
    in both engines."""
    workload = load_workload("offline-batch", {"num_requests": 60})
    config = EngineConfig(max_model_len=2048, max_num_seqs=32)
    core, exact = _compare(config, workload, seed=0, context="offline-batch")
    requests = core.requests
    assert (requests["max_tokens"] == 1024).all() and (requests["num_output_tokens"] != 1024).sum() > 50


def test_v0_watermark_on_a_cache_where_it_binds():
    """vLLM V0 keeps 1% of the blocks free at admission (continuous_v0.WATERMARK): on a cache of
    hundreds of blocks that is a few blocks, which decide admission whenever the cache is nearly
    full, and refuse on arrival a request that would need more than the rest. (The random cases
    above have caches under 100 blocks, where 1% rounds down to none.)"""
    rng = np.random.default_rng(11)
    num = 60
    prompt, output = rng.integers(40, 200, size=num), rng.integers(20, 120, size=num)
    prompt[7], output[7] = 900, 99  # needs all 250 blocks: past the watermark's 248, refused on arrival
    arrivals = np.sort(rng.uniform(0.0, 0.05, size=num))
    config = EngineConfig(block_size=4, max_model_len=1000, max_num_seqs=16, max_num_batched_tokens=1000,
                          enable_chunked_prefill=False, enable_prefix_caching=False, num_gpu_blocks_override=250)
    core, exact = _compare(config, ArraysWorkload(arrivals, prompt, output), seed=0, context="v0 watermark")
    reasons = exact.requests["reject_reason"]
    assert reasons[7].startswith("needs 250 KV blocks but admission keeps a watermark of 2") and (reasons == "").sum() == num - 1
    assert exact.totals.kv_allocated_max >= 240 and exact.totals.num_preempted  # the cache filled up


@pytest.mark.parametrize("dp,router", [(2, "round-robin"), (2, "least-loaded"), (4, "round-robin"),
                                       (4, "least-loaded")])
def test_replicas_behind_a_router_match(dp, router, monkeypatch):
    """--dp N behind either router (simcore.router): one event heap over the replicas' step loops
    and the arrivals, ties in SimPy's order, so every request lands on the same replica with the
    same timeline, each replica's ITLs and step rows are the reference's, and no replica holds
    arrivals back (a router has no hold, even past the threshold)."""
    import dataclasses

    import kvsim.simcore.engine as engine_module

    monkeypatch.setattr(engine_module, "HOLD_WAITING", 12)
    used = set()
    for case in range(16):
        rng = np.random.default_rng(3000 + case)
        config, workload = _random_case(rng)
        if case % 4 == 3:  # a burst past the hold threshold
            num = 120
            mml = config.max_model_len
            workload = ArraysWorkload(_bursty_arrivals(rng, num, mean_gap_s=0.0002, zero_share=0.2),
                                      rng.integers(1, mml // 2, size=num), rng.integers(1, mml // 2, size=num))
        config = dataclasses.replace(config, data_parallel_size=dp, router=router)
        core, exact = _compare(config, workload, seed=case, context=f"dp {dp} {router} case {case}")
        assert core.summary["num_replicas"] == dp and "waiting" not in core.record["resolution"]
        if core.records.kept and len(core.requests):
            used.update(core.requests["replica"].unique().tolist())
    assert used == set(range(dp)), "the cases should reach every replica"


@pytest.mark.parametrize("dp", [1, 2])
def test_closed_loop_clients_match(dp):
    """A workload file's closed loop (workloads.arrivals.closed_loop_process): N clients share one
    stream of requests, each submits, waits for its request to leave (finished or refused), thinks
    (fixed or exponential, or not at all) and takes the next. The core's clients start in order
    before anything at time 0 and take requests in the reference's order, so every timeline is
    the reference's; with two replicas the router spreads them."""
    import dataclasses

    from kvsim.workloads.arrivals import ClosedLoop
    from kvsim.workloads.lengths import Uniform
    from kvsim.workloads.spec import WorkloadSpec

    rejected = thought = 0
    for case in range(8):
        rng = np.random.default_rng(4000 + case)
        config, _ = _random_case(rng)
        mml = config.max_model_len
        think = float(rng.choice([0.0, 0.001, 0.01]))
        loop = ClosedLoop(concurrency=int(rng.integers(1, 12)), think_time_s=think,
                          think_time_dist=str(rng.choice(["fixed", "exponential"])))
        spec = WorkloadSpec(name="clients", num_requests=int(rng.integers(1, 40)), arrival=loop,
                            prompt_len=Uniform(1, mml + 4), output_len=Uniform(1, mml))
        config = dataclasses.replace(config, data_parallel_size=dp, router=str(rng.choice(["round-robin", "least-loaded"])))
        core, _ = _compare(config, spec, seed=case, context=f"closed loop dp {dp} case {case}")
        rejected += core.summary["rejected"]
        thought += think > 0
    assert rejected and thought, "the cases should refuse requests (their clients go on) and think"


def test_seed_table_runs_in_the_core():
    """The seed table's 64 clients (workloads/seed-table.yaml, a shorter run): the core's run is the
    reference's."""
    from kvsim.workloads import load_workload

    config = EngineConfig(max_num_seqs=32, max_num_batched_tokens=2048, enable_chunked_prefill=False)
    workload = load_workload("seed-table", {"num_requests": 200}, max_model_len=config.resolved_max_model_len(TINY))
    core, _ = _compare(config, workload, seed=5, context="seed-table")
    assert core.summary["completed"] == 200


def test_expert_parallel_replicas_match():
    """--enable-expert-parallel changes the memory plan and the step prices (an EP roofline),
    both resolved before either engine runs: the C core runs it, with the reference's results
    (simcore.policies lists the option among those the C core honours)."""
    import dataclasses

    moe = MODELS["tiny-moe"]
    config, workload = _random_case(np.random.default_rng(5))
    config = dataclasses.replace(config, data_parallel_size=2, enable_expert_parallel=True)
    _compare(config, workload, seed=5, context="expert parallel", model=moe,
             profile=default_profile(H100, moe, 1, 2))


@pytest.mark.parametrize("dp", [1, 2])
def test_prefix_caching_with_shared_prefixes_matches(dp):
    """Prefix caching with requests sharing system prompts (simcore.block_pool): hashed full
    blocks adopted at admission, registered as a prefill writes them, freed cached blocks
    evicted least recently freed first, recompute and swap preemption around them. The core's
    timelines, KV columns (shared blocks change what is live) and hit counts are the reference's."""
    import dataclasses

    from kvsim.workloads.arrivals import GammaArrivals
    from kvsim.workloads.lengths import Uniform
    from kvsim.workloads.spec import SharedPrefix, WorkloadSpec

    hit = 0
    for case in range(10):
        rng = np.random.default_rng(5000 + case)
        config, _ = _random_case(rng)
        mml = config.max_model_len
        config = dataclasses.replace(config, enable_prefix_caching=True, data_parallel_size=dp, router="least-loaded")
        prefix = SharedPrefix(num_groups=int(rng.integers(1, 4)), prefix_len=int(rng.integers(1, mml // 2)),
                              fraction=float(rng.choice([0.3, 0.8, 1.0])))
        spec = WorkloadSpec(name="prefixes", num_requests=int(rng.integers(10, 50)),
                            arrival=GammaArrivals(rate=float(rng.choice([50.0, 500.0, 5000.0]))),
                            prompt_len=Uniform(1, mml // 2), output_len=Uniform(1, mml // 2), shared_prefix=prefix,
                            max_model_len=mml)
        core, _ = _compare(config, spec, seed=case, context=f"prefix dp {dp} case {case}")
        hit += bool(core.summary.get("prefix_cache_hit_rate"))
    assert hit >= 5, "most cases should adopt cached blocks"


def test_shared_prefix_workload_file_matches():
    """workloads/shared-prefix.yaml (8 system prompts of 1024 tokens), a shorter run on the 8B
    model with prefix caching on, V0 and V1: in the core, with the reference's results."""
    from kvsim.workloads import load_workload

    model = MODELS["llama3-8b"]
    for chunked in (False, True):
        config = EngineConfig(max_model_len=4096, max_num_seqs=32, max_num_batched_tokens=4096,
                              enable_chunked_prefill=chunked, enable_prefix_caching=True, num_gpu_blocks_override=600)
        workload = load_workload("shared-prefix", {"num_requests": 120, "rate": 40},
                                 max_model_len=config.resolved_max_model_len(model))
        core, _ = _compare(config, workload, seed=3, context=f"shared-prefix chunked={chunked}", model=model,
                           profile=default_profile(H100, model, 1))
        assert core.summary["prefix_cache_hit_rate"] > 0.5


def test_pairwise_sum_is_numpys():
    """The core sums inter-token gaps a block at a time as numpy's add.reduce does (pairwise,
    eight accumulators), so a binned store's mean is the Python store's to the bit."""
    import ctypes

    lib = ccore.library()
    lib.kv_pairwise_sum.restype = ctypes.c_double
    lib.kv_pairwise_sum.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.c_long]
    rng = np.random.default_rng(9)
    for n in [*range(0, 140), 255, 256, 1000, 4097, 65536, 70001]:
        values = rng.exponential(0.02, size=n) * rng.choice([1e-3, 1.0, 1e3])
        assert lib.kv_pairwise_sum(values.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), n) == float(values.sum()), n


@pytest.mark.parametrize("dp", [1, 2])
def test_itls_past_the_cap_are_binned_in_the_core(dp, monkeypatch):
    """Past the ITL store's cap the core hands out no more gaps: it bins every one (keys, block
    sums, extremes, zeros) as simcore.records.Samples does, and the run's store is those bins,
    identical to the Python engine's (memory flat in request count)."""
    import dataclasses

    import kvsim.simcore.records as records

    monkeypatch.setattr(records, "ITL_EXACT_CAP", 500)
    monkeypatch.setattr(records, "_FLUSH", 64)
    for case in range(4):
        rng = np.random.default_rng(800 + case)
        config, _ = _random_case(rng)
        config = dataclasses.replace(config, data_parallel_size=dp)
        num = 150
        mml = config.max_model_len
        workload = ArraysWorkload(_bursty_arrivals(rng, num, mean_gap_s=0.002, zero_share=0.2),
                                  rng.integers(1, mml // 2, size=num), rng.integers(mml // 4, mml, size=num))
        core, exact = (simulate(TINY, H100, config, workload, _profile(), seed=case, engine_core=c, exact_steps=c == "python")
                       for c in ("c", "python"))
        a, b = core.itl, exact.itl
        assert not b.exact and len(a) == len(b) > 500, case
        a.settle(force=True)
        b.settle(force=True)
        assert (a.count, a.total, a.min, a.max, a._zeros) == (b.count, b.total, b.min, b.max, b._zeros), case
        ka, kb = np.flatnonzero(a._hist) + a._key0, np.flatnonzero(b._hist) + b._key0
        assert (ka == kb).all() and (a._hist[ka - a._key0] == b._hist[kb - b._key0]).all(), case
        for key in (k for k in core.summary if "itl" in k):  # mean, median, p95, p99: to the bit
            assert core.summary[key] == exact.summary[key], (case, key)


@pytest.mark.parametrize("dp", [1, 2])
def test_step_rows_folded_in_the_core(dp, monkeypatch):
    """The core folds its step rows as simcore.metrics.StepRecorder does (the totals' sums row by
    row, chunks sealed, the kept table halved past its cap): its step table and totals are, to
    the bit, those of the same rows folded in Python (fastcore.FOLD_STEPS off), small caps so
    that the table is coalesced several times."""
    import dataclasses

    import kvsim.simcore.metrics as metrics
    from kvsim.simcore import fastcore

    monkeypatch.setattr(metrics, "STEP_ROWS_CAP", 40)
    monkeypatch.setattr(metrics, "_STEP_CHUNK", 16)
    coalesced = 0
    for case in range(6):
        rng = np.random.default_rng(900 + case)
        config, workload = _random_case(rng)
        config = dataclasses.replace(config, data_parallel_size=dp)
        runs = []
        for fold in (True, False):
            monkeypatch.setattr(fastcore, "FOLD_STEPS", fold)
            runs.append(simulate(TINY, H100, config, workload, _profile(), seed=case, engine_core="c"))
        a, b = runs
        assert a.totals == b.totals, case
        ca, cb = a.step_columns(), b.step_columns()
        assert ca.keys() == cb.keys() and all(np.array_equal(ca[k], cb[k]) for k in ca), case
        assert a.record == b.record and a.summary == b.summary, case
        coalesced += any(r.coalesced for r in a.recorders)
    assert coalesced, "some cases should pass the cap"


@pytest.mark.parametrize("version", ["vllm-v0", "vllm-0.6"])
def test_engine_versions_match(version):
    """--engine-version selects the profile's host terms for the version (simcore.latency); the C core
    prices them from its pricing blob, with the reference's results (simcore.policies lists the
    option among those the core honours)."""
    import dataclasses

    config, workload = _random_case(np.random.default_rng(11))
    config = dataclasses.replace(config, engine_version=version)
    core, _ = _compare(config, workload, seed=11, context=version)
    assert core.record["engine"]["host_overhead_from"] == f"host_overhead_by_engine.{version}"
