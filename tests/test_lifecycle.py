"""The request lifecycle (one owner, guarded transitions), the engine/policy seam, and tests
that each kill one specific one-line mutation a review found uncaught."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import simpy

from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.contiguous import ContiguousAllocator
from kvsim.simcore.lifecycle import Lifecycle
from kvsim.simcore.router import Router
from kvsim.simcore.simulate import prepare
from kvsim.simcore.specs import EngineConfig
from kvsim.simcore.state import RequestStatus
from kvsim.simcore.step import StepPlan
from tests.helpers import ListWorkload, flat_profile, req

TINY, H100 = MODELS["tiny"], GPUS["H100-SXM-80GB"]
SIMCORE = Path(__file__).resolve().parent.parent / "simcore"


def _sim(requests, **config):
    return prepare(TINY, H100, EngineConfig(**config), ListWorkload(requests), flat_profile())


def _ms(values):
    return [round(v * 1000, 6) for v in values]


# -- the lifecycle refuses illegal moves ------------------------------------------------------
def _life():
    env = simpy.Environment()
    return Lifecycle(env, max_model_len=64)


def test_transitions_keep_timestamps_and_refuse_illegal_moves():
    life = _life()
    st = life.arrive(req(0, 0.0, 4, 3))
    life.enqueue(st)
    with pytest.raises(AssertionError, match="swap-in takes the head"):
        life.swap_in(st)  # a waiting request is not swapped out
    life.admit(st, now=1.0)
    assert st.status == RequestStatus.RUNNING and st.first_scheduled_s == 1.0
    with pytest.raises(AssertionError, match="illegal transition RUNNING -> RUNNING"):
        life.waiting.append(st)
        life.admit(st, now=2.0)  # admitted twice without a preemption in between
    life.waiting.clear()
    life.preempt(st, by_swap=False)
    assert list(life.waiting) == [st] and st.num_preemptions == 1 and st.num_computed_tokens == 0
    life.admit(st, now=5.0)
    assert st.first_scheduled_s == 1.0  # re-admission keeps the first scheduling time
    with pytest.raises(AssertionError, match="illegal transition"):
        life.reject(st, "too late")  # only a queued request can be rejected


def test_swapped_requests_count_as_load():
    life = _life()
    st = life.arrive(req(0, 0.0, 4, 3))
    life.enqueue(st)
    life.admit(st, now=0.0)
    life.preempt(st, by_swap=True)
    assert st.status == RequestStatus.SWAPPED and list(life.swapped) == [st]
    assert life.num_in_system == 1


# -- mutation: recompute-preempted request re-queued at the back; first_scheduled_s overwritten --
def test_three_request_preemption_order_timeline():
    """4 blocks of 4 tokens, steps of 2 ms, max_num_seqs 2. r0, r1 (prompt 4, 8 out) and r2
    (prompt 4, 2 out) arrive at 0; r2 waits for a sequence slot.

        [0, 2)    prefill r0 + r1 (1 block each)                 r2 waits
        [2, 10)   4 decodes: each takes a 2nd block at slot 5     cache full (4 blocks)
        [10, 12)  r0 needs a 3rd block: r1 (newest) preempted by recompute, to the FRONT
        [12, 16)  r0 decodes; r1 heads the queue and needs 3 blocks (9 tokens), 1 is free,
                  so r2 (1 block would do) waits behind it (FIFO)      r0 finishes at 16
        [16, 18)  r1 (9 tokens) and r2 (4) prefill together
        [18, 20)  r1 decodes; r2 needs a 2nd block, none free: r2 preempts itself
        [20, 22)  r1 decodes and finishes at 22; r2 (5 tokens, 2 blocks) waits for room
        [22, 24)  r2 re-prefills 5 tokens and finishes at 24
    Re-queueing r1 at the back would admit r2 at 12 ms; overwriting first_scheduled_s on
    re-admission would move r1's to 16 ms."""
    cfg = dict(block_size=4, num_gpu_blocks_override=4, max_model_len=16, max_num_seqs=2,
               max_num_batched_tokens=16)
    sim = _sim([req(0, 0.0, 4, 8), req(1, 0.0, 4, 8), req(2, 0.0, 4, 2)], **cfg)
    result = sim.run()
    df = result.requests
    assert _ms(df["first_scheduled_s"]) == [0.0, 0.0, 16.0]
    assert _ms(df["first_token_s"]) == [2.0, 2.0, 18.0]
    assert _ms(df["finish_s"]) == [16.0, 22.0, 24.0]
    assert df["num_preemptions"].tolist() == [0, 1, 1]
    steps = result.steps
    assert steps["num_prefill_tokens"].tolist() == [8, 0, 0, 0, 0, 0, 0, 0, 13, 0, 0, 5]
    assert steps["num_preempted"].tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    assert steps["num_waiting"].tolist() == [1, 1, 1, 1, 1, 2, 2, 2, 0, 1, 1, 0]


# -- mutation: paged decode context off by one ------------------------------------------------
def test_decode_attends_to_computed_tokens_plus_the_new_one():
    # one request, prompt 4, 3 out: prefill (4 tokens, no context), then decodes over 5 and 6
    sim = _sim([req(0, 0.0, 4, 3), req(1, 0.0, 2, 2)], block_size=4, max_model_len=32)
    policy, plans = sim.engine.policy, []
    schedule = policy.schedule

    def spy(queues, now):
        plan = schedule(queues, now)
        if plan is not None:
            plans.append((plan.prefill_chunks, plan.num_decode_seqs, plan.decode_context_tokens))
        return plan

    policy.schedule = spy
    sim.run()
    # step 1: both prefill; step 2: r0 decodes token 6 (context 4 + 1), r1 token 3 (2 + 1)
    assert plans == [([(4, 0), (2, 0)], 0, 0), ([], 2, 5 + 3), ([], 1, 6)]


# -- mutation: the least-loaded router ignoring swapped requests -------------------------------
def test_least_loaded_router_counts_swapped_requests():
    sim = _sim([], data_parallel_size=2, max_model_len=32, block_size=4)
    busy, idle = sim.engines
    life = busy.lifecycle
    st = life.arrive(req(100, 0.0, 4, 3))
    life.enqueue(st)
    life.admit(st, now=0.0)
    life.preempt(st, by_swap=True)  # replica 0 holds one swapped-out request, nothing else
    router = Router(sim.engines, "least-loaded")
    router.submit(req(0, 0.0, 4, 3))
    assert [e.lifecycle.num_arrived for e in sim.engines] == [1, 1]
    assert idle.lifecycle.waiting[0].request_id == 0


# -- mutation: a forked group needing one block fewer in the NEVER check ------------------------
@pytest.mark.parametrize(("num_blocks", "status"), [(6, "finished"), (5, "rejected")])
def test_forked_group_never_check_is_exact_at_the_boundary(num_blocks, status):
    # n=2, prompt 6 (2 blocks of 4, the last partly filled), 5 out: final length 10 (3 blocks).
    # Worst case: the prompt's 2 blocks once, then per sample its output blocks (3 - 2) plus a
    # copy of the shared partial block: 2 + 2 x (1 + 1) = 6 blocks.
    sim = _sim([req(0, 0.0, 6, 5, n=2)], block_size=4, num_gpu_blocks_override=num_blocks,
               max_model_len=16)
    df = sim.run().requests
    assert df["status"].tolist() == [status]
    if status == "rejected":
        assert "needs 6 KV blocks for 2 sequences but the cache has 5" in df.loc[0, "reject_reason"]


# -- every block back at the end, for real -----------------------------------------------------
@pytest.mark.parametrize("config", [
    dict(), dict(preemption_mode="swap", swap_space=0.0001), dict(policy="static"), dict(policy="dynamic"),
    dict(allocator="contiguous", reservation="oracle"),
], ids=["paged", "paged-swap", "static", "dynamic", "orca"])
def test_blocks_are_all_returned_at_the_end(config):
    """Under memory pressure (the cache fills up), every block / token slot is free again at the
    end and nothing is left in any queue."""
    requests = [req(i, 0.0002 * i, 6 + i % 5, 6 + i % 7, prefix_id=i % 2 if not config else None,
                    num_prefix_tokens=4 if not config else 0) for i in range(12)]
    sim = _sim(requests, block_size=4, num_gpu_blocks_override=8, max_model_len=32, **config)
    result = sim.run()
    assert result.steps["kv_allocated"].max() == 32, "the scenario must fill the cache"
    alloc = sim.engine.policy.allocator
    if isinstance(alloc, ContiguousAllocator):
        assert alloc.num_reserved_tokens == 0 and alloc.free_extents() == [(0, 32)]
        assert sim.engine.policy.ledger.live == 0
    else:
        assert alloc.num_used_blocks == 0 and alloc.num_free_blocks == alloc.num_gpu_blocks
        assert alloc.cpu.num_free == alloc.cpu.num_blocks
        gpu_refs, cpu_refs = alloc.ref_counts_from_tables()
        assert not gpu_refs and not cpu_refs
        assert all(b.ref_cnt == 0 for b in alloc.gpu.blocks)
        assert not sim.engine.policy.groups.active
    life = sim.engine.lifecycle
    assert not life.waiting and not life.running and not life.swapped
    assert (result.requests["status"] == "finished").all()


# -- the seam, as a structure ------------------------------------------------------------------
_OWNED = {
    "status", "num_tokens", "num_computed_tokens", "num_generated", "num_output_target",
    "first_scheduled_s", "first_token_s", "last_token_s", "finish_s", "num_preemptions",
    "reject_reason", "waiting", "running", "swapped",
}


_OTHER_OWNERS = {"self", "plan", "seq", "child"}  # own fields, a StepPlan, an allocator's _SeqBlocks


def _assigned_attributes(path: Path) -> set[str]:
    """Attributes assigned (or aug-assigned) on anything but an object that owns a field of
    the same name (`plan.num_tokens` is the step's, `seq.num_tokens` a block table's)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and not (isinstance(target.value, ast.Name) and target.value.id in _OTHER_OWNERS):
                found.add(target.attr)
    return found


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{a.name}" for a in node.names)
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_only_the_lifecycle_writes_request_state_and_queues():
    for path in sorted(SIMCORE.rglob("*.py")):
        if path.name == "lifecycle.py":
            continue
        written = _assigned_attributes(path) & _OWNED
        assert not written, f"{path.relative_to(SIMCORE)} writes {sorted(written)}"


def test_policies_never_import_the_engine_and_step_data_sits_below():
    for path in sorted((SIMCORE / "policies").glob("*.py")):
        imported = _imports(path)
        assert not {"kvsim.simcore.engine", "kvsim.simcore.lifecycle"} & imported, path.name
    engine = _imports(SIMCORE / "engine.py")
    assert {n for n in engine if n.startswith("kvsim.simcore.policies")} == {"kvsim.simcore.policies.base", "kvsim.simcore.policies.base.Policy"}
    assert "seq_ids" not in (SIMCORE / "engine.py").read_text()
    assert not any(n.startswith("kvsim.simcore.policies") for n in _imports(SIMCORE / "metrics.py"))
    assert not any(n.startswith(("kvsim.simcore.policies", "kvsim.simcore.engine")) for n in _imports(SIMCORE / "step.py"))


def test_a_plan_only_describes_transitions():
    life = _life()
    st = life.arrive(req(0, 0.0, 4, 3))
    life.enqueue(st)
    plan = StepPlan()
    plan.admit(st, 0)
    plan.add_prefill(st, 4, 0)
    assert st.status == RequestStatus.WAITING and list(life.waiting) == [st]  # nothing moved yet
    life.begin_step(plan, now=0.5)
    assert st.status == RequestStatus.RUNNING and life.running == [st] and st.first_scheduled_s == 0.5
