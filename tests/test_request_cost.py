"""What every request pays once (issue 10): an open loop sends requests without a completion
event, the running list's slot column shifts without numpy temporaries, and a chunk of requests
is built in one call. Each cut must leave the run unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.lifecycle import Lifecycle
from kvsim.simcore.request import Request
from kvsim.simcore.simulate import prepare
from kvsim.simcore.specs import EngineConfig
from kvsim.workloads.arrivals import GammaArrivals
from kvsim.workloads.lengths import Categorical, Uniform
from kvsim.workloads.spec import RequestArrays, SharedPrefix, WorkloadSpec
from tests.helpers import flat_profile, req

TINY, H100 = MODELS["tiny"], GPUS["H100-SXM-80GB"]


class CountingEnv(simpy.Environment):
    """Counts the events scheduled (every one is processed once by `run`)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_scheduled = 0

    def schedule(self, event, priority=1, delay=0):
        self.num_scheduled += 1
        super().schedule(event, priority, delay)


def _open_loop(monkeypatch, waits: bool, dp: int = 1):
    """300 Poisson requests on the tiny model, queueing behind 8 slots. `waits`: every request
    is submitted with a completion event that something waits on (as a closed loop would)."""
    workload = WorkloadSpec(name="open", num_requests=300, arrival=GammaArrivals(rate=300.0),
                            prompt_len=Uniform(4, 60), output_len=Uniform(2, 40))
    cfg = EngineConfig(max_model_len=128, max_num_seqs=8, block_size=4, data_parallel_size=dp)
    monkeypatch.setattr(simpy, "Environment", CountingEnv)
    sim = prepare(TINY, H100, cfg, workload, flat_profile(), seed=3, engine_core="python")  # counts SimPy events
    env = sim.env
    assert isinstance(env, CountingEnv)
    finishes = []
    if waits:
        for engine in sim.engines:
            def send(request, arrival_s=None, submit=engine.submit):
                done = submit(request, arrival_s)
                done.callbacks.append(lambda _e, rid=request.request_id: finishes.append((rid, env.now)))

            engine.send = send
    return sim.run(), env.num_scheduled, finishes


@pytest.mark.parametrize("dp", [1, 2])
def test_an_open_loop_makes_no_completion_events_and_the_run_is_the_same(monkeypatch, dp):
    sent, sent_events, _ = _open_loop(monkeypatch, waits=False, dp=dp)
    waited, waited_events, finishes = _open_loop(monkeypatch, waits=True, dp=dp)
    assert sent.summary == waited.summary
    a, b = sent.requests, waited.requests
    assert a.equals(b)
    assert sent.steps.equals(waited.steps)
    # the waited run processes one completion event per request, each when its request left
    assert waited_events - sent_events == len(a) == 300
    left = dict(zip(a["request_id"], a["finish_s"], strict=True))
    assert all(left[rid] == now for rid, now in finishes) and len(finishes) == 300


def test_running_slots_follow_running_through_random_removals():
    rng = np.random.default_rng(5)
    life = Lifecycle(simpy.Environment(), max_model_len=4096)
    states = []
    for i in range(400):
        st = life.arrive(req(i, 0.0, 8, 4))
        life.enqueue(st)
        states.append(st)
    peak = 0
    for step in range(400):  # mostly admissions first (the column grows past 64), then mixed
        if life.waiting and (not life.running or rng.random() < (0.9 if step < 100 else 0.5)):
            life.admit(life.waiting[0], now=float(step))
        else:  # a random running request leaves (first, last or middle)
            st = life.running[int(rng.integers(len(life.running)))]
            life._unrun(st)
        assert life.running_slots().tolist() == [st.slot for st in life.running]
        peak = max(peak, len(life.running))
    assert peak > 64  # the slot column grew past its first size on the way


@pytest.mark.parametrize("first_id", [0, 1000])
def test_a_chunk_builds_the_same_requests_as_one_call_per_row(first_id):
    spec = WorkloadSpec(name="mixed", num_requests=50, arrival=GammaArrivals(rate=5.0),
                        prompt_len=Uniform(4, 60), output_len=Uniform(2, 40), max_tokens=30,
                        n=Categorical((1, 2)), shared_prefix=SharedPrefix(3, 8, 0.5))
    arrays = spec.generate(7)
    arrays.first_id = first_id
    built = arrays.to_requests()
    expected = [
        Request(first_id + i, float(arrays.arrival_s[i]), int(arrays.num_prompt_tokens[i]),
                int(arrays.num_output_tokens[i]), int(arrays.max_tokens[i]), int(arrays.n[i]),
                int(arrays.beam_width[i]), None if arrays.prefix_id[i] < 0 else int(arrays.prefix_id[i]),
                int(arrays.num_prefix_tokens[i]))
        for i in range(50)
    ]
    assert built == expected
    assert {r.prefix_id for r in built} > {None} and {r.n for r in built} == {1, 2}
    assert all(type(v) in (int, float, type(None)) for r in built for v in (r.arrival_s, r.prefix_id, r.n))


def test_closed_loop_arrays_have_no_arrival_column():
    arrays = RequestArrays(None, np.array([5, 6]), np.array([2, 3]), np.array([2, 3]), np.ones(2, int),
                           np.ones(2, int), np.array([-1, -1]), np.zeros(2, int), None, {}, first_id=4)
    assert [(r.request_id, r.arrival_s) for r in arrays.to_requests()] == [(4, 0.0), (5, 0.0)]


def test_a_request_row_keeps_every_value_exactly():
    """Rows are packed as float64 bytes: integers below 2**53 and times come back bit for bit."""
    from types import SimpleNamespace

    from kvsim.simcore.records import RequestRecords

    records = RequestRecords()
    times = (0.1 + 0.2, 1e-300, 123456.789012345, 7.0)
    request = SimpleNamespace(arrival_s=times[0], max_tokens=2**31 - 1, n=3, beam_width=2)
    done = SimpleNamespace(request=request, request_id=2**40 + 1, reject_reason="", first_scheduled_s=times[1],
                           first_token_s=times[2], finish_s=times[3], num_prompt_tokens=4097,
                           num_generated=65_000, num_preemptions=5)
    rejected = SimpleNamespace(**{**vars(done), "request_id": 3, "reject_reason": "too long"})
    records.leave(done, 1)
    records.leave(rejected, 0)
    cols = records.columns()
    assert cols["request_id"].tolist() == [3, 2**40 + 1] and cols["replica"].tolist() == [0, 1]
    assert cols["status"].tolist() == [1, 0] and cols["reason"].tolist() == [0, -1]
    assert cols["arrival_s"][1] == times[0] and cols["first_scheduled_s"][1] == times[1]
    assert cols["first_token_s"][1] == times[2] and cols["finish_s"][1] == times[3]
    assert [int(cols[k][1]) for k in ("num_prompt_tokens", "num_positions", "max_tokens", "n", "beam_width",
                                      "num_preemptions")] == [4097, 65_000, 2**31 - 1, 3, 2, 5]
    assert records.reason_names() == ["too long"]
