"""Workloads: length distributions, arrival processes, the closed loop, overrides, clipping, determinism."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.simcore.errors import WorkloadError
from kvsim.simcore.request import Request
from kvsim.workloads import list_workloads, load_workload
from kvsim.workloads.arrivals import (
    BatchArrivals,
    ClosedLoop,
    FixedRateArrivals,
    GammaArrivals,
    PiecewiseRateArrivals,
    diurnal_schedule,
)
from kvsim.workloads.lengths import Categorical, Empirical, Fixed, LogNormal, Normal, Uniform, Zipf
from kvsim.workloads.spec import SharedPrefix, WorkloadSpec


class FakeSink:
    """Finishes each request `service_s(request)` seconds after it is submitted; records everything."""

    def __init__(self, env: simpy.Environment, service_s=lambda r: 1.0) -> None:
        self.env, self.service_s = env, service_s
        self.submitted: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.log: list[tuple[str, int, float]] = []

    def submit(self, request: Request) -> simpy.Event:
        request.arrival_s = self.env.now
        self.submitted.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.log.append(("submit", request.request_id, self.env.now))
        done = self.env.event()
        self.env.process(self._finish(request, done))
        return done

    def _finish(self, request: Request, done: simpy.Event):
        yield self.env.timeout(self.service_s(request))
        self.in_flight -= 1
        self.log.append(("done", request.request_id, self.env.now))
        done.succeed()


class CountingEnv(simpy.Environment):
    """Counts timeouts, to check that arrivals cost one timeout per distinct arrival time."""

    def __init__(self) -> None:
        super().__init__()
        self.num_timeouts = 0

    def timeout(self, delay, value=None):  # type: ignore[override]
        self.num_timeouts += 1
        return super().timeout(delay, value)


def _rng(seed: int = 7) -> np.random.Generator:
    return np.random.default_rng(seed)


def _spec(**kwargs) -> WorkloadSpec:
    base = dict(
        name="t", num_requests=200, arrival=GammaArrivals(5.0),
        prompt_len=LogNormal(161, 161), output_len=LogNormal(338, 338),
    )  # fmt: skip
    return WorkloadSpec(**{**base, **kwargs})


def _run(spec: WorkloadSpec, seed, sink_factory=FakeSink, env=None):
    env = env or simpy.Environment()
    sink = sink_factory(env)
    env.process(spec.process(env, sink, seed))
    env.run()
    return env, sink


# --- length distributions ------------------------------------------------------------------

EMPIRICAL_VALUES = np.array([3, 10, 10, 40, 250, 1000, 7])

DISTRIBUTIONS = [
    Fixed(100),
    Uniform(10, 500),
    Normal(1000, 150),
    LogNormal(161, 161),
    LogNormal(19, 9.5),
    Zipf(1.2, 1000, 3.0),
    Empirical(EMPIRICAL_VALUES, "test"),
]


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=lambda d: d.kind + str(round(d.mean)))
def test_distribution_sample_matches_its_mean_and_spread(dist):
    values = dist.sample(_rng(), 200_000)
    assert values.dtype == np.int64 and values.min() >= 1
    assert values.mean() == pytest.approx(dist.mean, rel=0.01, abs=0.05)
    assert values.std() == pytest.approx(dist.std, rel=0.03, abs=0.05)


def test_distribution_parameters_are_what_they_say():
    assert LogNormal(161, 161).mean == 161 and LogNormal(161, 161).std == 161
    assert Uniform(1, 6).mean == 3.5 and Uniform(1, 6).std == pytest.approx(np.std(np.arange(1, 7)))
    assert Empirical(EMPIRICAL_VALUES).mean == pytest.approx(EMPIRICAL_VALUES.mean())
    values = Uniform(5, 9).sample(_rng(), 10_000)
    assert set(np.unique(values)) == {5, 6, 7, 8, 9}


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=lambda d: d.kind + str(round(d.mean)))
def test_with_mean_moves_the_mean(dist):
    moved = dist.with_mean(400)
    assert moved.mean == pytest.approx(400, rel=0.01)
    assert moved.sample(_rng(), 100_000).mean() == pytest.approx(400, rel=0.02)


def test_categorical_frequencies():
    choice = Categorical((1, 2, 4), (0.5, 0.3, 0.2))
    values = choice.sample(_rng(), 100_000)
    for v, w in zip(choice.values, choice.weights, strict=True):
        assert (values == v).mean() == pytest.approx(w, abs=0.01)
    assert Categorical((3,)).sample(_rng(), 5).tolist() == [3] * 5


@pytest.mark.parametrize(
    "make",
    [lambda: Fixed(0), lambda: Uniform(5, 4), lambda: Normal(-1, 1), lambda: LogNormal(10, 0),
     lambda: Zipf(0, 10), lambda: Categorical((0,)), lambda: Categorical((1, 2), (1.0,))],
)  # fmt: skip
def test_bad_distribution_parameters(make):
    with pytest.raises(WorkloadError):
        make()


# --- arrival processes -----------------------------------------------------------------------


def test_gamma_burstiness_one_is_exponential_without_truncation():
    rate = 4.0
    times = GammaArrivals(rate, 1.0).arrival_times(_rng(), 200_001)
    assert times[0] == 0.0
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.02)
    for k in (0.5, 1.0, 3.0, 6.0):  # exponential tail at several points: nothing cut off
        assert (gaps > k / rate).mean() == pytest.approx(np.exp(-k), rel=0.05, abs=2e-4)
    assert gaps.max() > 10 / rate


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0])
def test_gamma_burstiness_sets_cv(burstiness):
    gaps = np.diff(GammaArrivals(2.0, burstiness).arrival_times(_rng(), 200_001))
    assert gaps.mean() == pytest.approx(0.5, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.03)


def test_fixed_rate_and_batch_times_are_exact():
    assert FixedRateArrivals(4.0).arrival_times(_rng(), 4).tolist() == [0.0, 0.25, 0.5, 0.75]
    assert BatchArrivals().arrival_times(_rng(), 3).tolist() == [0.0, 0.0, 0.0]
    assert BatchArrivals(2, 10.0).arrival_times(_rng(), 5).tolist() == [0.0, 0.0, 10.0, 10.0, 20.0]
    with pytest.raises(WorkloadError):
        BatchArrivals(2, 0.0)


def test_piecewise_rate_places_arrivals_by_the_schedule():
    arrivals = PiecewiseRateArrivals((0.0, 10.0, 15.0), (1.0, 0.0, 5.0), period_s=20.0)
    times = arrivals.arrival_times(_rng(), 60_000)
    assert np.all(np.diff(times) >= 0)
    phase = np.mod(times, 20.0)
    assert not np.any((phase >= 10.0) & (phase < 15.0))  # the zero-rate step holds nothing
    assert ((phase < 10).sum() / len(times)) == pytest.approx(10 / 35, rel=0.02)
    assert arrivals.mean_rate == pytest.approx(35 / 20)
    assert len(times) / times[-1] == pytest.approx(35 / 20, rel=0.02)


def test_piecewise_without_period_holds_the_last_rate():
    times = PiecewiseRateArrivals((0.0, 100.0), (0.5, 10.0)).arrival_times(_rng(), 20_000)
    late = times[times >= 100.0]
    assert (len(times) - len(late)) == pytest.approx(50, abs=25)
    assert (len(late) - 1) / (late[-1] - late[0]) == pytest.approx(10.0, rel=0.03)
    with pytest.raises(WorkloadError, match="last rate"):
        PiecewiseRateArrivals((0.0, 1.0), (1.0, 0.0))


def test_diurnal_schedule_has_the_mean_and_peak_to_trough():
    schedule = diurnal_schedule(2.0, 4.0, 3600.0, 24)
    assert schedule.mean_rate == pytest.approx(2.0)
    rates = np.array(schedule.rates)
    assert rates.max() / rates.min() == pytest.approx(4.0, rel=0.05)
    times = schedule.arrival_times(_rng(), 72_000)  # ten periods
    assert len(times) / times[-1] == pytest.approx(2.0, rel=0.02)


def test_open_loop_costs_one_timeout_per_distinct_arrival_time():
    spec = _spec(num_requests=1000, arrival=GammaArrivals(50.0))
    env, sink = _run(spec, 3, env=CountingEnv())
    sink_timeouts = len(sink.submitted)  # FakeSink uses one timeout per request to finish it
    assert env.num_timeouts - sink_timeouts == 999
    planned = [r.arrival_s for r in spec.sample_requests(3)]
    assert [r.arrival_s for r in sink.submitted] == pytest.approx(planned, abs=1e-9)
    env, sink = _run(dataclasses.replace(spec, arrival=BatchArrivals()), 3, env=CountingEnv())
    assert env.num_timeouts - len(sink.submitted) == 0
    assert [r.request_id for r in sink.submitted] == list(range(1000))


# --- closed loop -----------------------------------------------------------------------------


def test_closed_loop_exact_timeline_with_think_time():
    spec = _spec(num_requests=5, arrival=ClosedLoop(2, think_time_s=0.5), prompt_len=Fixed(10), output_len=Fixed(5))
    _, sink = _run(spec, 0)
    submits = [(rid, t) for kind, rid, t in sink.log if kind == "submit"]
    assert submits == [(0, 0.0), (1, 0.0), (2, 1.5), (3, 1.5), (4, 3.0)]


@pytest.mark.parametrize("concurrency", [1, 3, 16, 64])
def test_closed_loop_never_exceeds_concurrency(concurrency):
    spec = _spec(num_requests=300, arrival=ClosedLoop(concurrency, 0.2, "exponential"))
    _, sink = _run(spec, 11, lambda env: FakeSink(env, lambda r: 0.001 * r.num_output_tokens))
    assert sink.max_in_flight == min(concurrency, 300)
    assert [r.request_id for r in sink.submitted] == list(range(300))
    assert sink.in_flight == 0


def test_closed_loop_with_fewer_requests_than_clients():
    _, sink = _run(_spec(num_requests=3, arrival=ClosedLoop(64)), 0)
    assert len(sink.submitted) == 3 and sink.max_in_flight == 3


# --- determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n, _ in list_workloads()])
def test_same_seed_same_requests(name):
    spec = load_workload(name, {"num_requests": 300}, max_model_len=32768 if name == "long-context" else 8192)
    seed = np.random.SeedSequence(42)
    first = spec.sample_requests(seed)
    assert first == spec.sample_requests(np.random.SeedSequence(42))
    assert first == spec.sample_requests(seed)  # the seed is not consumed
    if getattr(spec, "is_session", False):  # --num-requests counts sessions; each sends its turns
        assert len({r.session_id for r in first}) == 300 and [r.request_id for r in first] == list(range(len(first)))
    else:
        assert len(first) == 300 and [r.request_id for r in first] == list(range(300))
    other = spec.sample_requests(np.random.SeedSequence(43))
    random_lengths = any(getattr(d, "kind", "") != "fixed" for d in (spec.prompt_len, spec.output_len))
    if spec.trace is None and random_lengths:  # fixed-batch: identical requests whatever the seed
        assert other != first


def test_process_submits_what_sample_requests_returns():
    spec = _spec(num_requests=50, shared_prefix=SharedPrefix(3, 100), n=Categorical((1, 2)))
    _, sink = _run(spec, np.random.SeedSequence(5))
    planned = spec.sample_requests(np.random.SeedSequence(5))
    assert [dataclasses.replace(r, arrival_s=0.0) for r in sink.submitted] == [
        dataclasses.replace(r, arrival_s=0.0) for r in planned
    ]


# --- clipping, max_tokens, prefixes, overrides -------------------------------------------------


def test_clipping_to_max_model_len_is_counted():
    spec = _spec(num_requests=2000, max_model_len=512)
    requests, generation = spec.draw(1)
    assert all(r.num_prompt_tokens <= 511 for r in requests)
    assert all(r.num_prompt_tokens + r.num_output_tokens <= 512 for r in requests)
    assert all(r.num_prompt_tokens + r.max_tokens <= 512 for r in requests)
    clipped = spec.describe(generation)["generation"]["clipped"]
    raw = _spec(num_requests=2000).generate(1)
    assert clipped["prompt"] == int((raw.num_prompt_tokens > 511).sum()) > 0
    assert clipped["output"] > 0
    assert any("clipped" in note for note in spec.describe(generation)["notes"])
    # the same counts from every way of generating, and none kept on the (frozen) spec
    assert spec.generation_stats(1) == spec.generate(1).stats == generation
    assert spec.draw(1, limit=10)[1] is None  # a sample that stopped early counted only its part
    assert not any("clipped" in note for note in spec.describe()["notes"])


@pytest.mark.parametrize("arrival", [GammaArrivals(5.0), ClosedLoop(4)])
def test_the_arrival_process_returns_the_generation_counts(arrival):
    spec = _spec(num_requests=300, max_model_len=512, arrival=arrival)
    env = simpy.Environment()
    process = env.process(spec.process(env, FakeSink(env), np.random.SeedSequence(1)))
    env.run()
    assert process.value == spec.generation_stats(np.random.SeedSequence(1))
    assert process.value["clipped"]["prompt"] > 0


def test_prompt_longer_than_max_model_len_is_an_error():
    with pytest.raises(WorkloadError, match="prompt of 600 tokens is longer than max_model_len 512"):
        _spec(prompt_len=Fixed(600), max_model_len=512)
    with pytest.raises(WorkloadError, match="--input-len 4096 tokens leaves no room for one output token within max_model_len 4096"):
        load_workload("sharegpt", {"input_len": 4096}, max_model_len=4096)
    with pytest.raises(WorkloadError, match="--output-len 4096 tokens leaves no room for a one-token prompt"):
        load_workload("sharegpt", {"output_len": 4096}, max_model_len=4096)
    with pytest.raises(WorkloadError, match="longer than max_model_len"):
        load_workload("shared-prefix", max_model_len=1024)
    # a 8k-32k prompt workload on an 8k model would clip every prompt: refused, not run
    with pytest.raises(WorkloadError, match="every prompt .at least 8192 tokens. is longer than max_model_len 8192"):
        load_workload("long-context", max_model_len=8192)


def test_fixed_max_tokens_caps_outputs():
    requests = _spec(num_requests=1000, max_tokens=200).sample_requests(2)
    assert all(r.max_tokens == 200 and r.num_output_tokens <= 200 for r in requests)
    requests = _spec(num_requests=1000).sample_requests(2)
    assert all(r.max_tokens == r.num_output_tokens for r in requests)


def test_shared_prefix_groups():
    spec = _spec(num_requests=2000, shared_prefix=SharedPrefix(4, 256, fraction=0.75))
    requests = spec.sample_requests(3)
    shared = [r for r in requests if r.prefix_id is not None]
    assert len(shared) / len(requests) == pytest.approx(0.75, abs=0.03)
    assert {r.prefix_id for r in shared} == {0, 1, 2, 3}
    assert all(r.num_prefix_tokens == 256 and r.num_prompt_tokens > 256 for r in shared)
    assert all(r.num_prefix_tokens == 0 for r in requests if r.prefix_id is None)


def test_overrides():
    wl = load_workload(None, {"rate": 7.0, "num_requests": 10})
    assert wl.name == "sharegpt" and wl.arrival == GammaArrivals(7.0, 1.0) and wl.num_requests == 10
    wl = load_workload("seed-table", {"rate": 3.0, "burstiness": 0.5})
    assert wl.arrival == GammaArrivals(3.0, 0.5)
    wl = load_workload("sharegpt", {"concurrency": 8})
    assert wl.arrival == ClosedLoop(8)
    wl = load_workload("seed-table", {"input_len": 1000, "output_len": 50, "n": 2, "beam_width": 3, "max_tokens": 64})
    assert wl.prompt_len.mean == 1000 and wl.output_len.mean == 50
    r = wl.sample_requests(0)[0]
    assert (r.n, r.beam_width, r.max_tokens) == (2, 3, 64)
    wl = load_workload("azure-conv", {"input_len": 500, "num_requests": 2000})
    prompts = np.array([r.num_prompt_tokens for r in wl.sample_requests(0)])
    assert wl.prompt_scale * wl.trace.num_prompt_tokens.mean() == pytest.approx(500)
    assert prompts.mean() < 1104  # the first 2000 rows average 1105 tokens before scaling
    wl = load_workload("seed-table", {"think_time_s": 2.5, "rate": None})
    assert wl.arrival == ClosedLoop(64, 2.5)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"rate": 1.0, "concurrency": 4}, "not both"),
        ({"burstiness": 0.5}, "burstiness applies"),
        ({"think_time_s": 1.0}, "think time applies"),
        ({"bogus": 1}, "unknown workload override"),
        ({"num_requests": 0}, "--num-requests must be an integer >= 1"),
    ],
)
def test_bad_overrides(overrides, match):
    name = "azure-code" if "burstiness" in overrides else "sharegpt"
    with pytest.raises(WorkloadError, match=match):
        load_workload(name, overrides)


def test_describe_is_json_serialisable():
    import json

    for name, _ in list_workloads():
        spec = load_workload(name, {"num_requests": 100}, max_model_len=32768 if name == "long-context" else 4096)
        spec.sample_requests(0)
        json.dumps(spec.describe())


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 200),
    mml=st.one_of(st.none(), st.integers(2, 4096)),
    cap=st.one_of(st.none(), st.integers(1, 2000)),
    prefix=st.one_of(st.none(), st.integers(1, 300)),
    arrival=st.sampled_from([GammaArrivals(3.0, 0.3), FixedRateArrivals(2.0), BatchArrivals(3, 1.0),
                             PiecewiseRateArrivals((0.0, 5.0), (0.0, 2.0), 10.0), ClosedLoop(4)]),
    seed=st.integers(0, 2**32),
)  # fmt: skip
def test_generated_requests_are_always_valid(count, mml, cap, prefix, arrival, seed):
    if mml is not None and prefix is not None and prefix >= mml:
        return  # an error by design, tested above
    spec = _spec(
        num_requests=count, arrival=arrival, max_model_len=mml, max_tokens=cap,
        shared_prefix=SharedPrefix(2, prefix, 0.5) if prefix else None,
    )  # fmt: skip
    requests = spec.sample_requests(seed)
    assert [r.request_id for r in requests] == list(range(count))
    assert all(np.diff([r.arrival_s for r in requests]) >= 0)
    for r in requests:
        assert r.num_prompt_tokens >= 1 and r.num_output_tokens >= 1
        assert r.max_tokens >= r.num_output_tokens
        assert 0 <= r.num_prefix_tokens <= r.num_prompt_tokens
        if mml is not None:
            assert r.num_prompt_tokens + r.max_tokens <= mml
        if cap is not None:
            assert r.max_tokens <= cap
