"""ContiguousAllocator: first-fit invariants against a slot-by-slot model, fragmentation, sizing."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.simcore.block_pool import AllocStatus
from kvsim.simcore.contiguous import ContiguousAllocator, reservation_tokens
from kvsim.simcore.errors import ConfigError


def _free_runs(owner: list[int | None]) -> list[tuple[int, int]]:
    """Maximal runs of free slots (start, length) in a slot -> owner model."""
    runs: list[tuple[int, int]] = []
    for addr, who in enumerate(owner):
        if who is not None:
            continue
        if runs and runs[-1][0] + runs[-1][1] == addr:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((addr, 1))
    return runs


class ContiguousMachine(RuleBasedStateMachine):
    """Reserve and free at random; a list of slot owners is the reference model."""

    @initialize(capacity=st.integers(1, 40))
    def setup(self, capacity: int) -> None:
        self.alloc = ContiguousAllocator(capacity)
        self.owner: list[int | None] = [None] * capacity
        self.sizes: dict[int, int] = {}
        self.next_id = 0

    @rule(data=st.data())
    def reserve(self, data: st.DataObject) -> None:
        cap = self.alloc.capacity_tokens
        n = data.draw(st.integers(0, cap + 2), label="num_tokens")
        seq_id = self.next_id
        self.next_id += 1
        fits = [a for a in range(cap - n + 1) if all(w is None for w in self.owner[a : a + n])]
        status = self.alloc.can_reserve(n)
        before = (self.alloc.free_extents(), self.alloc.num_free_tokens)
        ok = self.alloc.reserve(seq_id, n)
        assert ok == (status == AllocStatus.OK)
        assert (status == AllocStatus.NEVER) == (n > cap)
        if not ok:
            assert not fits and not self.alloc.has_seq(seq_id)
            assert (self.alloc.free_extents(), self.alloc.num_free_tokens) == before
            return
        self.sizes[seq_id] = n
        assert self.alloc.reserved_tokens(seq_id) == n
        if n == 0:
            return
        start, length = self.alloc.extent(seq_id)
        assert length == n and start == fits[0]  # first fit: the lowest address that holds n
        for a in range(start, start + n):
            self.owner[a] = seq_id

    @precondition(lambda self: self.sizes)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.sizes)), label="seq_id")
        self.alloc.free(seq_id)
        del self.sizes[seq_id]
        self.owner = [None if w == seq_id else w for w in self.owner]
        assert not self.alloc.has_seq(seq_id)

    @rule()
    def free_unknown(self) -> None:
        before = self.alloc.free_extents()
        self.alloc.free(-1)
        assert self.alloc.free_extents() == before

    @invariant()
    def extents_tile_the_space(self) -> None:
        cap = self.alloc.capacity_tokens
        cover = [0] * cap
        for seq_id in self.sizes:
            start, n = self.alloc.extent(seq_id)
            for a in range(start, start + n):
                cover[a] += 1
                assert self.owner[a] == seq_id
        for start, n in self.alloc.free_extents():
            assert n > 0
            for a in range(start, start + n):
                cover[a] += 1
        assert cover == [1] * cap  # no overlap, nothing lost

    @invariant()
    def free_extents_are_maximal_runs(self) -> None:
        extents = self.alloc.free_extents()
        assert extents == _free_runs(self.owner)  # sorted, merged: no two extents touch
        for (s0, n0), (s1, _) in zip(extents, extents[1:], strict=False):
            assert s0 + n0 < s1

    @invariant()
    def counters_agree(self) -> None:
        a = self.alloc
        assert a.num_free_tokens + a.num_reserved_tokens == a.capacity_tokens
        assert a.num_reserved_tokens == sum(self.sizes.values())
        runs = _free_runs(self.owner)
        assert a.num_free_extents == len(runs)
        assert a.largest_free_extent == max((n for _, n in runs), default=0)
        for m in (0, 1, 3, 5):
            assert a.external_fragmentation_tokens(m) == sum(n for _, n in runs if n < m)


ContiguousMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestContiguousMachine = ContiguousMachine.TestCase


def test_external_fragmentation_scenario():
    alloc = ContiguousAllocator(10)
    assert alloc.reserve(1, 4) and alloc.reserve(2, 2) and alloc.reserve(3, 4)
    assert [alloc.extent(i) for i in (1, 2, 3)] == [(0, 4), (4, 2), (6, 4)]
    assert alloc.num_free_tokens == 0 and alloc.can_reserve(1) == AllocStatus.LATER
    alloc.free(1)
    alloc.free(3)
    assert alloc.num_free_tokens == 8
    assert alloc.largest_free_extent == 4 and alloc.num_free_extents == 2
    assert alloc.can_reserve(5) == AllocStatus.LATER  # 8 tokens free, none 5 in a row
    assert not alloc.reserve(4, 5) and not alloc.has_seq(4)
    assert alloc.external_fragmentation_tokens(5) == 8
    assert alloc.external_fragmentation_tokens(4) == 0
    assert alloc.external_fragmentation_tokens(0) == 0
    assert alloc.can_reserve(11) == AllocStatus.NEVER
    alloc.free(2)  # merges all three into one extent
    assert alloc.free_extents() == [(0, 10)]
    assert alloc.reserve(4, 5) and alloc.extent(4) == (0, 5)


def test_first_fit_takes_lowest_address_not_best_fit():
    alloc = ContiguousAllocator(12)
    for seq_id, n in enumerate((3, 1, 2, 6)):
        assert alloc.reserve(seq_id, n)
    alloc.free(0)  # hole of 3 at 0
    alloc.free(2)  # hole of 2 at 4
    assert alloc.free_extents() == [(0, 3), (4, 2)]
    assert alloc.reserve(9, 2) and alloc.extent(9) == (0, 2)  # best fit would pick address 4
    assert alloc.free_extents() == [(2, 1), (4, 2)]


@pytest.mark.parametrize(
    ("kind", "prompt", "output", "max_tokens", "expected"),
    [
        ("max", 100, 10, 50, 2048),
        ("max", 2000, 48, 48, 2048),
        ("pow2", 100, 10, 50, 116),  # 10 -> 16
        ("pow2", 100, 16, 50, 116),  # already a power of two
        ("pow2", 100, 17, 50, 132),  # 17 -> 32
        ("pow2", 100, 1, 1, 101),
        ("pow2", 1500, 600, 600, 2048),  # 600 -> 1024, capped at max_model_len
        ("oracle", 100, 10, 50, 110),
        ("oracle", 2000, 100, 100, 2048),  # capped
        ("max_tokens", 100, 10, 50, 150),
        ("max_tokens", 100, 10, 0, 110),  # never below the real output
    ],
)
def test_reservation_tokens(kind, prompt, output, max_tokens, expected):
    assert reservation_tokens(kind, prompt, output, max_tokens, 2048) == expected


def test_reservation_kinds_are_ordered():
    for prompt, output in ((1, 1), (7, 9), (300, 511), (300, 513)):
        sizes = [reservation_tokens(k, prompt, output, output, 2048) for k in ("oracle", "pow2", "max")]
        assert sizes == sorted(sizes) and sizes[0] == prompt + output


def test_unknown_reservation_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown reservation kind 'huge'"):
        reservation_tokens("huge", 10, 10, 10, 2048)
