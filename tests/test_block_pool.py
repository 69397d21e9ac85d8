"""PagedAllocator: a state machine with a shadow model of every token and block (prefix caching
included: a block's content hash is the labels it holds), plus exact tables."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.simcore.block_pool import AllocStatus, BlockPool, PagedAllocator

Key = tuple[str, int]  # ("gpu" | "cpu", block id): a physical block in the shadow model


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PagedMachine(RuleBasedStateMachine):
    """Each appended token gets a unique label; the model writes labels into the physical
    blocks the allocator hands out, so a block written while shared, a lost copy or a
    mixed-up swap shows up as a sequence whose blocks no longer spell its tokens."""

    @initialize(num_gpu=st.integers(1, 12), block_size=st.sampled_from([1, 2, 4]), num_cpu=st.integers(0, 8))
    def setup(self, num_gpu: int, block_size: int, num_cpu: int) -> None:
        self.alloc = PagedAllocator(num_gpu, block_size, num_cpu)
        self.bs = block_size
        self.tokens: dict[int, list[int]] = {}  # seq id -> logical token labels
        self.content: dict[Key, list[int]] = {}  # physical block -> labels written, by slot
        self.next_id = 0
        self.next_label = 0

    # -- model helpers -----------------------------------------------------------------
    def _pool_name(self, seq_id: int) -> str:
        return "cpu" if self.alloc.is_swapped(seq_id) else "gpu"

    def _table_refs(self) -> dict[Key, int]:
        refs: dict[Key, int] = {}
        for seq_id in self.tokens:
            pool = self._pool_name(seq_id)
            for block_id in self.alloc.block_table(seq_id):
                refs[(pool, block_id)] = refs.get((pool, block_id), 0) + 1
        return refs

    def _snapshot(self) -> tuple:
        a = self.alloc
        seqs = sorted((s, tuple(b.table), a.num_tokens(s), b.on_cpu) for s, b in a._seqs.items())
        refs = tuple(b.ref_cnt for b in a.gpu.blocks), tuple(b.ref_cnt for b in a.cpu.blocks)
        cache = tuple(a.gpu._evictable), tuple(sorted(a.cached.items()))  # LRU order included
        return seqs, tuple(a.gpu._free_ids), tuple(a.cpu._free_ids), refs, a.num_cow_copies, cache

    def _shared_contents(self) -> dict[Key, list[int]]:
        return {k: list(self.content[k]) for k, n in self._table_refs().items() if n > 1}

    def _gpu_seqs(self) -> list[int]:
        return sorted(s for s in self.tokens if not self.alloc.is_swapped(s))

    def _cpu_seqs(self) -> list[int]:
        return sorted(s for s in self.tokens if self.alloc.is_swapped(s))

    # -- rules -------------------------------------------------------------------------
    @rule(data=st.data(), num_new=st.integers(0, 20))
    def append_slots(self, data: st.DataObject, num_new: int) -> None:
        a, bs = self.alloc, self.bs
        seq_id = data.draw(st.sampled_from([None, *self._gpu_seqs()]), label="seq_id")
        if seq_id is None:
            seq_id, self.next_id = self.next_id, self.next_id + 1
        refs = self._table_refs()
        old_table = a.block_table(seq_id) if seq_id in self.tokens else []
        filled = len(self.tokens.get(seq_id, []))
        cow = bool(num_new and filled % bs and refs[("gpu", old_table[-1])] > 1)
        need = _ceil_div(filled + num_new, bs) - len(old_table) + cow
        assert a.num_blocks_needed(seq_id, num_new) == need
        num_free, num_cow = a.num_free_blocks, a.num_cow_copies
        before, shared = self._snapshot(), self._shared_contents()

        ok = a.append_slots(seq_id, num_new)
        assert ok == (need <= num_free)
        if not ok:
            assert self._snapshot() == before  # all or nothing
            return
        assert a.num_free_blocks == num_free - need
        assert a.num_cow_copies == num_cow + cow
        table = a.block_table(seq_id)
        kept = len(old_table) - cow
        assert table[:kept] == old_table[:kept]
        fresh = table[kept:]
        for block_id in fresh:
            assert refs.get(("gpu", block_id), 0) == 0, "handed out a block that was in use"
            self.content[("gpu", block_id)] = []
        if cow:
            assert table[kept] != old_table[-1]
            self.content[("gpu", table[kept])] = list(self.content[("gpu", old_table[-1])])
        labels = list(range(self.next_label, self.next_label + num_new))
        self.next_label += num_new
        seq_tokens = self.tokens.setdefault(seq_id, [])
        refs_after = self._table_refs()
        for pos, label in enumerate(labels, start=filled):
            key = ("gpu", table[pos // bs])
            assert refs_after[key] == 1, "wrote into a shared block"
            assert len(self.content[key]) == pos % bs
            self.content[key].append(label)
        seq_tokens.extend(labels)
        for key, written in shared.items():  # copy-on-write: shared blocks keep their contents
            assert self.content[key] == written

    @precondition(lambda self: any(not self.alloc.is_swapped(s) for s in self.tokens))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self._gpu_seqs()), label="parent")
        child, self.next_id = self.next_id, self.next_id + 1
        num_free = self.alloc.num_free_blocks
        self.alloc.fork(parent, child)
        assert self.alloc.block_table(child) == self.alloc.block_table(parent)
        assert self.alloc.num_free_blocks == num_free
        self.tokens[child] = list(self.tokens[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)), label="seq_id")
        pool_name = self._pool_name(seq_id)
        pool = self.alloc.cpu if pool_name == "cpu" else self.alloc.gpu
        refs = self._table_refs()
        table = self.alloc.block_table(seq_id)
        released = [b for b in table if refs[(pool_name, b)] == 1]
        cached = [b for b in released if pool.blocks[b].block_hash is not None]
        uncached = [b for b in released if pool.blocks[b].block_hash is None]
        num_free = pool.num_free
        self.alloc.free(seq_id)
        del self.tokens[seq_id]
        assert not self.alloc.has_seq(seq_id)
        assert pool.num_free == num_free + len(released)
        # released blocks go on the free stack last block first, so pop() returns table order;
        # cached ones stay cached, evictable, most recently freed last (the tail block first)
        assert pool._free_ids[len(pool._free_ids) - len(uncached) :] == uncached[::-1]
        assert list(pool._evictable)[len(pool._evictable) - len(cached) :] == cached[::-1]

    @rule()
    def free_unknown(self) -> None:
        before = self._snapshot()
        self.alloc.free(10_000)
        assert self._snapshot() == before

    def _swap(self, group: list[int], to_cpu: bool) -> None:
        a = self.alloc
        src_name, dst_name = ("gpu", "cpu") if to_cpu else ("cpu", "gpu")
        src, dst = (a.gpu, a.cpu) if to_cpu else (a.cpu, a.gpu)
        old_tables = {s: a.block_table(s) for s in group}
        distinct = {b for t in old_tables.values() for b in t}
        can = a.can_swap_out(group) if to_cpu else a.can_swap_in(group)
        assert can == (len(distinct) <= dst.num_free)
        if not can:
            return
        refs = self._table_refs()
        in_group: dict[int, int] = {}
        for t in old_tables.values():
            for b in t:
                in_group[b] = in_group.get(b, 0) + 1
        released = sum(1 for b, n in in_group.items() if refs[(src_name, b)] == n)
        src_free, dst_free = src.num_free, dst.num_free
        shared = self._shared_contents()

        copied = a.swap_out(group) if to_cpu else a.swap_in(group)
        assert copied == len(distinct)
        assert dst.num_free == dst_free - len(distinct) and src.num_free == src_free + released
        old_to_new: dict[int, int] = {}
        new_to_old: dict[int, int] = {}
        for s in group:
            assert a.is_swapped(s) == to_cpu
            new_table = a.block_table(s)
            assert len(new_table) == len(old_tables[s])
            for old, new in zip(old_tables[s], new_table, strict=True):
                # a bijection: blocks shared inside the group stay shared, no new sharing
                assert old_to_new.setdefault(old, new) == new
                assert new_to_old.setdefault(new, old) == old
        for old, new in old_to_new.items():
            assert refs.get((dst_name, new), 0) == 0, "swapped into a block that was in use"
            self.content[(dst_name, new)] = list(self.content[(src_name, old)])
        for key, written in shared.items():
            assert self.content[key] == written

    @precondition(lambda self: any(not self.alloc.is_swapped(s) for s in self.tokens))
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        group = data.draw(st.lists(st.sampled_from(self._gpu_seqs()), min_size=1, unique=True), label="group")
        self._swap(group, to_cpu=True)

    @precondition(lambda self: any(self.alloc.is_swapped(s) for s in self.tokens))
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        group = data.draw(st.lists(st.sampled_from(self._cpu_seqs()), min_size=1, unique=True), label="group")
        self._swap(group, to_cpu=False)

    # -- prefix caching: a full block is registered under its content (the labels it holds) --
    def _full_block_hashes(self, seq_id: int) -> list[tuple[int, ...]]:
        table = self.alloc.block_table(seq_id)
        return [tuple(self.content[("gpu", table[i])]) for i in range(len(self.tokens[seq_id]) // self.bs)]

    @precondition(lambda self: any(not self.alloc.is_swapped(s) for s in self.tokens))
    @rule(data=st.data())
    def cache_full_blocks(self, data: st.DataObject) -> None:
        a = self.alloc
        seq_id = data.draw(st.sampled_from(self._gpu_seqs()), label="seq_id")
        hashes = self._full_block_hashes(seq_id)
        before, free_before = dict(a.cached), a.num_free_blocks
        a.cache_full_blocks(seq_id, hashes)
        table = a.block_table(seq_id)
        expected = dict(before)
        for index, block_hash in enumerate(hashes):
            expected.setdefault(block_hash, table[index])  # the first block with a content wins
        assert a.cached == expected
        assert a.num_free_blocks == free_before  # caching takes nothing

    @precondition(lambda self: self.alloc.cached)
    @rule(data=st.data(), num_new=st.integers(0, 8))
    def allocate_with_cached_prefix(self, data: st.DataObject, num_new: int) -> None:
        """Look up then commit, as in vLLM: the hits and the new blocks in one call or nothing."""
        a, bs = self.alloc, self.bs
        hashes = data.draw(st.lists(st.sampled_from(sorted(a.cached)), unique=True, max_size=4), label="hashes")
        hits = [a.cached[h] for h in hashes]
        num_revived = sum(1 for b in hits if a.gpu.blocks[b].ref_cnt == 0)
        need = _ceil_div(len(hits) * bs + num_new, bs) - len(hits)
        refs, num_free, before = self._table_refs(), a.num_free_blocks, self._snapshot()
        seq_id, self.next_id = self.next_id, self.next_id + 1
        assert a.num_cached_prefix_blocks(hashes) == len(hashes) and self._snapshot() == before  # look-up only
        assert a.num_blocks_to_allocate(num_new, hashes) == num_revived + need and self._snapshot() == before
        ok = a.allocate_slots(seq_id, num_new, hashes)
        assert ok == (num_revived + need <= num_free)
        if not ok:
            assert self._snapshot() == before  # nothing taken, no block revived, LRU order kept
            return
        assert a.num_free_blocks == num_free - num_revived - need
        table = a.block_table(seq_id)
        assert table[: len(hits)] == hits
        for block_id in hits:
            assert a.gpu.blocks[block_id].ref_cnt == refs.get(("gpu", block_id), 0) + 1
        for block_id in table[len(hits) :]:
            assert refs.get(("gpu", block_id), 0) == 0, "handed out a block that was in use"
            self.content[("gpu", block_id)] = []
        labels = list(range(self.next_label, self.next_label + num_new))
        self.next_label += num_new
        for pos, label in enumerate(labels, start=len(hits) * bs):
            self.content[("gpu", table[pos // bs])].append(label)
        self.tokens[seq_id] = [t for h in hashes for t in h] + labels

    @rule(data=st.data())
    def can_allocate(self, data: st.DataObject) -> None:
        a = self.alloc
        num_tokens = data.draw(st.integers(0, (a.num_gpu_blocks + 2) * self.bs), label="num_tokens")
        need = _ceil_div(num_tokens, self.bs)
        status = a.can_allocate(num_tokens)
        assert (status == AllocStatus.NEVER) == (need > a.num_gpu_blocks)
        assert (status == AllocStatus.LATER) == (a.num_free_blocks < need <= a.num_gpu_blocks)

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def ref_counts_match_tables(self) -> None:
        a = self.alloc
        refs = self._table_refs()
        gpu_refs, cpu_refs = a.ref_counts_from_tables()
        assert gpu_refs == {b: n for (p, b), n in refs.items() if p == "gpu"}
        assert cpu_refs == {b: n for (p, b), n in refs.items() if p == "cpu"}
        for pool, pool_refs in ((a.gpu, gpu_refs), (a.cpu, cpu_refs)):
            assert len(pool.blocks) <= pool.num_blocks  # blocks are materialised lazily
            assert [b.ref_cnt for b in pool.blocks] == [pool_refs.get(i, 0) for i in range(len(pool.blocks))]
            assert pool.num_shared == sum(1 for n in pool_refs.values() if n > 1)  # kept, not counted

    @invariant()
    def free_plus_used_is_total_and_no_double_free(self) -> None:
        a = self.alloc
        gpu_refs, cpu_refs = a.ref_counts_from_tables()
        for pool, pool_refs in ((a.gpu, gpu_refs), (a.cpu, cpu_refs)):
            free_ids = pool._free_ids
            assert len(set(free_ids)) == len(free_ids)
            assert not set(free_ids) & set(pool_refs)  # a free block is in no table
            assert pool.num_free + len(pool_refs) == pool.num_blocks
            # the kept count agrees with the free structures
            assert pool.num_free == len(free_ids) + pool.num_blocks - len(pool.blocks) + len(pool._evictable)
        assert a.num_free_blocks + a.num_used_blocks == a.num_gpu_blocks
        assert a.num_used_blocks == len(gpu_refs)

    @invariant()
    def cached_blocks_keep_their_content(self) -> None:
        """A cached block holds exactly the content it is registered under until it is evicted;
        evictable means cached and unreferenced; the hash map and the blocks agree."""
        gpu = self.alloc.gpu
        for block_hash, block_id in gpu.cached_hash_to_block.items():
            assert gpu.blocks[block_id].block_hash == block_hash
            assert self.content[("gpu", block_id)] == list(block_hash)
        hashed = {b.block_id for b in gpu.blocks if b.block_hash is not None}
        assert hashed == set(gpu.cached_hash_to_block.values())
        assert set(gpu._evictable) == {b for b in hashed if gpu.blocks[b].ref_cnt == 0}
        assert not set(gpu._evictable) & set(gpu._free_ids)

    @invariant()
    def tables_spell_the_tokens(self) -> None:
        a = self.alloc
        assert set(a._seqs) == set(self.tokens)
        for seq_id, labels in self.tokens.items():
            table = a.block_table(seq_id)
            assert a.num_tokens(seq_id) == len(labels)
            assert len(table) == _ceil_div(len(labels), self.bs)
            pool = self._pool_name(seq_id)
            read = [self.content[(pool, table[i // self.bs])][i % self.bs] for i in range(len(labels))]
            assert read == labels

    @invariant()
    def gpu_token_count_is_the_sum_over_gpu_sequences(self) -> None:
        """`num_gpu_tokens` (kept, not summed) = written slots of the sequences on the GPU; with
        no block shared, used slots - it = the unfilled slots of last blocks."""
        a = self.alloc
        assert a.num_gpu_tokens == sum(len(self.tokens[s]) for s in self._gpu_seqs())
        if all(n == 1 for n in a.ref_counts_from_tables()[0].values()) and not a.cached:
            unfilled = sum(len(a.block_table(s)) * self.bs - len(self.tokens[s]) for s in self._gpu_seqs())
            assert a.num_used_blocks * self.bs - a.num_gpu_tokens == unfilled


PagedMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPagedMachine = PagedMachine.TestCase


# -- exact tables on tiny cases ---------------------------------------------------------------
def test_fork_then_append_copies_the_shared_last_block_once():
    a = PagedAllocator(num_gpu_blocks=4, block_size=4)
    assert a.append_slots(1, 6)  # t0..t3 | t4 t5 _ _
    assert a.block_table(1) == [0, 1]
    a.fork(1, 2)
    assert a.block_table(2) == [0, 1] and a.num_free_blocks == 2
    assert a.num_blocks_needed(1, 1) == 1  # the copy
    assert a.append_slots(1, 1)
    assert a.block_table(1) == [0, 2] and a.block_table(2) == [0, 1]
    assert a.num_cow_copies == 1
    assert [b.ref_cnt for b in a.gpu.blocks] == [2, 1, 1]  # block 3 never materialised
    assert a.append_slots(2, 1)  # block 1 is the child's alone now: no second copy
    assert a.block_table(2) == [0, 1] and a.num_cow_copies == 1
    assert a.append_slots(2, 2)  # fills block 1, opens block 3; block 0 (full, shared) is untouched
    assert a.block_table(2) == [0, 1, 3] and a.num_cow_copies == 1


def test_fork_at_a_block_boundary_needs_no_copy():
    a = PagedAllocator(num_gpu_blocks=3, block_size=2)
    assert a.append_slots(1, 4)
    a.fork(1, 2)
    assert a.num_blocks_needed(2, 1) == 1
    assert a.append_slots(2, 1)
    assert a.block_table(2) == [0, 1, 2] and a.num_cow_copies == 0


def test_free_returns_blocks_so_the_next_sequence_gets_the_same_table():
    # free() releases a table last block first onto a LIFO stack, so the freed table's
    # first block is on top: the next allocation reuses the freed blocks in table order.
    a = PagedAllocator(num_gpu_blocks=6, block_size=4)
    assert a.append_slots(1, 12) and a.append_slots(2, 4)
    assert a.block_table(1) == [0, 1, 2] and a.block_table(2) == [3]
    a.free(1)
    assert a.gpu._free_ids == [2, 1, 0]  # recycled ids; blocks 4 and 5 were never used
    assert a.num_free_blocks == 5
    assert a.append_slots(3, 5)
    assert a.block_table(3) == [0, 1]
    assert a.append_slots(3, 8)
    assert a.block_table(3) == [0, 1, 2, 4]


def test_shared_blocks_return_only_when_the_last_holder_frees():
    a = PagedAllocator(num_gpu_blocks=4, block_size=2)
    assert a.append_slots(1, 4)
    a.fork(1, 2)
    a.free(1)
    assert a.num_free_blocks == 2 and a.block_table(2) == [0, 1]
    a.free(2)
    assert a.num_free_blocks == 4
    a.free(2)  # unknown id: a no-op, not a double free
    assert a.num_free_blocks == 4


def test_append_is_all_or_nothing_and_keeps_an_empty_sequence():
    a = PagedAllocator(num_gpu_blocks=2, block_size=4)
    assert a.append_slots(1, 0) and a.block_table(1) == []
    assert not a.append_slots(1, 9)  # needs 3 blocks
    assert a.has_seq(1) and a.num_tokens(1) == 0  # the existing sequence survives
    assert not a.append_slots(2, 9)
    assert not a.has_seq(2)  # a sequence created by the failed call is not left behind
    assert a.num_free_blocks == 2


def test_can_allocate_never_later_ok():
    a = PagedAllocator(num_gpu_blocks=3, block_size=4)
    assert a.can_allocate(12) == AllocStatus.OK
    assert a.can_allocate(13) == AllocStatus.NEVER
    assert a.append_slots(1, 5)
    assert a.can_allocate(4) == AllocStatus.OK
    assert a.can_allocate(5) == AllocStatus.LATER
    assert a.can_allocate(0) == AllocStatus.OK


def test_swap_round_trip_keeps_sharing_inside_the_group():
    a = PagedAllocator(num_gpu_blocks=6, block_size=2, num_cpu_blocks=4)
    assert a.append_slots(1, 3)  # [0, 1]
    a.fork(1, 2)
    assert a.append_slots(2, 1)  # CoW: [0, 2]
    assert a.block_table(2) == [0, 2]
    assert a.can_swap_out([1, 2])
    assert a.swap_out([1, 2]) == 3  # blocks 0, 1, 2; block 0 copied once
    assert a.block_table(1) == [0, 1] and a.block_table(2) == [0, 2]  # CPU ids
    assert a.is_swapped(1) and a.num_free_blocks == 6 and a.cpu.num_free == 1
    assert a.append_slots(3, 6)  # the GPU is reused meanwhile, freed blocks first
    assert a.block_table(3) == [2, 0, 1]
    assert a.swap_in([2, 1]) == 3
    assert a.block_table(2) == [3, 4] and a.block_table(1) == [3, 5]  # still share their first block
    assert a.gpu.blocks[3].ref_cnt == 2 and a.cpu.num_free == 4


def test_swap_out_copies_a_block_shared_with_a_sequence_outside_the_group():
    a = PagedAllocator(num_gpu_blocks=2, block_size=2, num_cpu_blocks=2)
    assert a.append_slots(1, 4)
    a.fork(1, 2)
    assert a.swap_out([2]) == 2
    assert a.block_table(1) == [0, 1] and [b.ref_cnt for b in a.gpu.blocks] == [1, 1]
    assert not a.can_swap_in([2])  # the GPU is full: both copies cannot come back
    a.free(1)
    assert a.swap_in([2]) == 2 and a.block_table(2) == [0, 1]


def test_block_pool_hands_out_low_ids_first():
    pool = BlockPool(3)
    assert [pool.take(), pool.take()] == [0, 1]
    pool.decref(0)
    assert pool.take() == 0 and pool.num_free == 1


@settings(max_examples=60, deadline=None)
@given(data=st.data(), block_size=st.sampled_from([1, 2, 4, 16]), num_seqs=st.integers(1, 8))
def test_bulk_decode_appends_match_one_append_per_sequence(data, block_size, num_seqs):
    """append_decodes / append_runs (the vectorised decode step and span) hand out the same
    block ids, in the same order, as one append_slots per sequence; evictable cached blocks
    included (taken least recently freed first). The batch order is random (a running queue
    is not in row order), and rows are recycled (freed sequences' rows go to new ones)."""
    def build() -> PagedAllocator:
        a = PagedAllocator(num_blocks, block_size)
        a.allocate_slots(999, 3 * block_size)  # cached, then freed: evictable blocks
        a.cache_full_blocks(999, [("p", i) for i in range(3)])
        for seq_id in range(-3, 0):  # rows taken, then recycled out of order
            a.allocate_slots(seq_id, 1)
        for seq_id in (-2, -3, -1):
            a.free(seq_id)
        for seq_id in order:
            a.allocate_slots(seq_id, lengths[seq_id])
        a.free(999)
        return a

    lengths = data.draw(st.lists(st.integers(1, 40), min_size=num_seqs, max_size=num_seqs), label="lengths")
    rounds = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=6), label="rounds")
    order = data.draw(st.permutations(range(num_seqs)), label="order")  # the batch, in schedule order
    # exactly enough blocks for the end: the last appends evict the cached ones
    num_blocks = max(sum(_ceil_div(n + sum(rounds), block_size) for n in lengths) + 1,
                     3 + sum(_ceil_div(n, block_size) for n in lengths))
    one, bulk = build(), build()
    rows = np.array([bulk.seq_index(s) for s in order])
    for num_new in rounds:
        for seq_id in order:
            assert one.append_slots(seq_id, num_new)
        if num_new == 1:
            full = [bulk.seq_index(s) for s in order if bulk.num_tokens(s) % block_size == 0]
            bulk.append_decodes(rows, full)
        else:
            bulk.append_runs(rows, num_new)
        assert bulk.num_gpu_tokens == one.num_gpu_tokens == sum(one.num_tokens(s) for s in order)
        for seq_id in range(num_seqs):
            assert bulk.block_table(seq_id) == one.block_table(seq_id)
            assert bulk.num_tokens(seq_id) == one.num_tokens(seq_id)
        assert bulk.gpu._free_ids == one.gpu._free_ids and list(bulk.gpu._evictable) == list(one.gpu._evictable)
        assert bulk.cached == one.cached


def _pool_state(pool: BlockPool) -> tuple:
    return (list(pool.ref_cnt), list(pool._free_ids), list(pool._evictable), dict(pool.cached_hash_to_block),
            [b.block_hash for b in pool.blocks], pool.num_free,
            len(pool._free_ids) + pool.num_blocks - len(pool.blocks) + len(pool._evictable))


@settings(max_examples=80, deadline=None)
@given(num_blocks=st.integers(1, 40), ops=st.lists(st.tuples(st.sampled_from("tTdDci"), st.integers(0, 10**6)),
                                                     max_size=60))
def test_bulk_pool_ops_match_one_call_per_block(num_blocks, ops):
    """take_many / decref_all (one pass over flat per-id state) leave the pool exactly as one
    take / decref per block would: same ids in the same order, ref counts, free stack, LRU
    order of the evictable cached blocks and evictions."""
    bulk, one = BlockPool(num_blocks), BlockPool(num_blocks)
    held: list[int] = []  # one entry per reference, like block tables
    next_hash = 0
    for op, r in ops:
        if op in "tT" and bulk.num_free:
            count = 1 + r % bulk.num_free if op == "T" else 1
            ids = bulk.take_many(count)
            assert ids == [one.take() for _ in range(count)]
            held += ids
        elif op in "dD" and held:  # release distinct held references, as one table's
            picked = list(dict.fromkeys(held[r % len(held):][: 1 + r % 7]))
            bulk.decref_all(picked)
            for block_id in picked:
                one.decref(block_id)
                held.remove(block_id)
        elif op == "c" and held:
            block_id = held[r % len(held)]
            bulk.cache(block_id, ("h", next_hash))
            one.cache(block_id, ("h", next_hash))
            next_hash += 1
        elif op == "i" and (bulk._evictable or held):
            hashes = sorted(bulk.cached_hash_to_block)
            if hashes:  # touch a cached block (revives it if evictable)
                block_id = bulk.cached_hash_to_block[hashes[r % len(hashes)]]
                bulk.touch(block_id)
                one.touch(block_id)
                held.append(block_id)
        assert _pool_state(bulk) == _pool_state(one)
    assert sorted(b for b, n in enumerate(bulk.ref_cnt) for _ in range(n)) == sorted(held)


def test_blocks_view_reads_snapshots_of_the_pool_state():
    pool = BlockPool(4)
    a, b = pool.take_many(2)
    pool.cache(b, "h")
    assert len(pool.blocks) == 2  # block 2 and 3 never materialised
    assert pool.blocks[a].ref_cnt == 1 and pool.blocks[b].block_hash == "h" and pool.blocks[-1].block_id == b
    assert [blk.block_id for blk in pool.blocks] == [0, 1] and pool.blocks[1:] == [pool.blocks[1]]
    snapshot = pool.blocks[b]
    pool.decref(b)
    assert snapshot.ref_cnt == 1 and pool.blocks[b].ref_cnt == 0 and list(pool._evictable) == [b]
    assert pool.block_hash(b) == "h" and pool.block_hash(a) is None
    for bad in (2, -3):
        try:
            pool.blocks[bad]
        except IndexError:
            continue
        raise AssertionError(f"blocks[{bad}] should not exist")
