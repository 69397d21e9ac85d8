"""vLLM-style paged KV-cache allocator: fixed-size blocks, ref counts, block tables, CoW, swap.

A sequence's block table maps its logical blocks to physical ones; slots are allocated as
tokens are written (on demand), so only the last block can hold unused slots:

    tokens   t0 .. t15 | t16 .. t31 | t32 t33 _ _ ... _
    table    [  b7     ,   b2       ,  b9            ]   -> 3 blocks, 14 unused slots in b9

`fork` shares every block (ref_cnt + 1); the first append to a shared, partly filled last
block copies it first (copy-on-write), so a shared block is never written. Swap moves a
group of sequences' blocks to a CPU pool (shared blocks copied once) and back.

Prefix caching (vLLM's automatic prefix caching): a full block whose content is known by a
hash (here: block i of a shared system prompt) is registered under it; a later sequence
starting with the same content adopts the block instead of computing it. A cached block
whose last holder lets go stays cached but counts as free ("evictable"); it is evicted, least
recently freed first, only when no uncached free block is left. As in vLLM v1
(`KVCacheManager.get_computed_blocks` then `allocate_slots`), admission looks up the cached
prefix without side effects (`num_cached_prefix_blocks`), then takes the hits and the new
blocks in one all-or-nothing call (`allocate_slots`). The pool that evicts owns the hash map
(vLLM's `BlockPool.cached_block_hash_to_block`), so eviction calls nobody back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

_ONE = np.ones((), dtype=np.int64)  # a 0-d array: numpy combines two arrays faster than an array and an int


class AllocStatus(IntEnum):
    """Admission answer: OK now, LATER when memory frees up, NEVER (bigger than the cache)."""

    OK = 0
    LATER = 1
    NEVER = 2


@dataclass(frozen=True, slots=True)
class Block:
    """One block's state as read from its pool (`BlockPool.blocks[block_id]`): a snapshot; the
    pool keeps the live state in flat per-id containers."""

    block_id: int  # index into its pool
    ref_cnt: int = 0  # number of block tables holding it
    block_hash: Hashable | None = None  # content key while cached


class _BlockView(Sequence[Block]):
    """`BlockPool.blocks`: the materialised blocks (index == block id) as `Block` snapshots,
    for tests and inspection; the pool itself never goes through it."""

    __slots__ = ("_pool",)

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool

    def __len__(self) -> int:
        return len(self._pool.ref_cnt)

    def __getitem__(self, block_id):
        if isinstance(block_id, slice):
            return [self[i] for i in range(*block_id.indices(len(self)))]
        ref_cnt = self._pool.ref_cnt
        if block_id < 0:
            block_id += len(ref_cnt)
        if not 0 <= block_id < len(ref_cnt):
            raise IndexError(block_id)
        return Block(block_id, ref_cnt[block_id], self._pool._hash_of.get(block_id))


class BlockPool:
    """A fixed number of blocks with an O(1) free stack (pop / append at the end).

    Per-block state is flat, indexed by block id: `ref_cnt` (a list of ints) and `_hash_of`
    (the cached ones only), so freeing a sequence's table or taking a run of blocks touches
    one list slot per block, not a `Block` object's attributes (a request frees ~80 blocks).
    Ids are materialised on first use (0, 1, 2, ... in order), so a pool of millions of blocks
    (a small model on a large GPU) costs nothing until it fills; `_free_ids` holds the
    recycled ids, reused last-freed first.
    """

    def __init__(self, num_blocks: int):
        self._num_blocks = num_blocks  # fixed capacity
        # number of block tables holding each materialised block (index == block id, so
        # len(ref_cnt) blocks were handed out at least once); written only by BlockPool
        self.ref_cnt: list[int] = []
        self._hash_of: dict[int, Hashable] = {}  # block id -> content hash, while cached
        self._free_ids: list[int] = []  # recycled uncached ids; never-used ids are implicit
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free but cached, LRU first
        self.cached_hash_to_block: dict[Hashable, int] = {}  # content hash -> block id, while cached
        self.blocks = _BlockView(self)  # read-only view of the materialised blocks
        # free blocks (recycled + never used + evictable), kept as a count because schedulers
        # read it several times a step; written only by BlockPool
        self.num_free = num_blocks
        # blocks held by more than one table (forks, shared cached prefixes): while 0, every
        # held block has ref_cnt 1, so freeing a table needs no look at its counts
        self.num_shared = 0

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def block_hash(self, block_id: int) -> Hashable | None:
        """The content hash a block is cached under, None if it is not cached."""
        return self._hash_of.get(block_id)

    def _evict(self) -> int:
        """The least recently freed cached block, its content forgotten (it is being reused)."""
        assert self._evictable, "pool exhausted"
        block_id = self._evictable.popitem(last=False)[0]
        del self.cached_hash_to_block[self._hash_of.pop(block_id)]
        return block_id

    def take(self) -> int:
        """A free block, held once: the last recycled id, else a never-used one, else the
        least recently freed cached block (evicted)."""
        ref_cnt = self.ref_cnt
        self.num_free -= 1
        if self._free_ids:
            block_id = self._free_ids.pop()
            assert ref_cnt[block_id] == 0, "free block still referenced"
        elif len(ref_cnt) < self._num_blocks:
            ref_cnt.append(1)
            return len(ref_cnt) - 1
        else:
            block_id = self._evict()
        ref_cnt[block_id] = 1
        return block_id

    def take_many(self, count: int) -> list[int]:
        """`count` blocks, as `count` calls of `take` would hand them out (same ids, order):
        recycled ids last freed first, then never-used ids, then evicted cached blocks."""
        free_ids, ref_cnt = self._free_ids, self.ref_cnt
        self.num_free -= count
        if count == 1 and free_ids:  # a decode step's one new block, mostly: `take`'s recycled path
            block_id = free_ids.pop()
            assert not ref_cnt[block_id], "free block still referenced"
            ref_cnt[block_id] = 1
            return [block_id]
        num_recycled = min(count, len(free_ids))
        start = len(free_ids) - num_recycled
        ids = free_ids[start:]
        del free_ids[start:]
        ids.reverse()
        # (a recycled id is free: only a count that reached 0 puts it on the stack)
        for block_id in ids:
            ref_cnt[block_id] = 1
        if num_recycled < count:
            num_fresh = min(count - num_recycled, self._num_blocks - len(ref_cnt))
            ids.extend(range(len(ref_cnt), len(ref_cnt) + num_fresh))
            ref_cnt.extend([1] * num_fresh)
            for _ in range(count - len(ids)):
                block_id = self._evict()
                ref_cnt[block_id] = 1
                ids.append(block_id)
        return ids

    def decref_all(self, block_ids: list[int]) -> None:
        """`decref` each block, in order (a freed sequence's table: one pass, no calls)."""
        free_ids, evictable = self._free_ids, self._evictable
        if not self.num_shared and (not self._hash_of or self._hash_of.keys().isdisjoint(block_ids)):
            # the common case, every block held once (nothing is shared) and none cached: all
            # go on the free stack, in order
            ref_cnt = self.ref_cnt
            for block_id in block_ids:
                ref_cnt[block_id] = 0
            free_ids.extend(block_ids)
            self.num_free += len(block_ids)
            return
        num_free_before = len(free_ids) + len(evictable)
        ref_cnt, release, hash_of = self.ref_cnt, free_ids.append, self._hash_of
        for block_id in block_ids:
            left = ref_cnt[block_id] - 1
            ref_cnt[block_id] = left
            if left <= 0:
                assert left == 0, "double free"
                if block_id in hash_of:
                    evictable[block_id] = None
                else:
                    release(block_id)
            elif left == 1:
                self.num_shared -= 1
        self.num_free += len(free_ids) + len(evictable) - num_free_before

    def cache(self, block_id: int, block_hash: Hashable) -> None:
        """Register a full, held block under its content hash (the first block with it wins)."""
        assert self.ref_cnt[block_id] > 0, "only a held block can be registered"
        if block_id not in self._hash_of and block_hash not in self.cached_hash_to_block:
            self._hash_of[block_id] = block_hash
            self.cached_hash_to_block[block_hash] = block_id

    def touch(self, block_id: int) -> None:
        """Take a reference to a cached block, reviving it if it was evictable."""
        held = self.ref_cnt[block_id]
        if held == 0:
            del self._evictable[block_id]
            self.num_free -= 1
        elif held == 1:
            self.num_shared += 1
        self.ref_cnt[block_id] = held + 1

    def incref(self, block_id: int) -> None:
        held = self.ref_cnt[block_id]
        assert held > 0, "incref on a free block"
        if held == 1:
            self.num_shared += 1
        self.ref_cnt[block_id] = held + 1

    def decref(self, block_id: int) -> None:
        left = self.ref_cnt[block_id] - 1
        assert left >= 0, "double free"
        self.ref_cnt[block_id] = left
        if left == 1:
            self.num_shared -= 1
        elif left == 0:
            self.num_free += 1
            if block_id in self._hash_of:
                self._evictable[block_id] = None
            else:
                self._free_ids.append(block_id)


class _SeqBlocks:
    """One sequence's block table; its token count is the allocator's `_ntok[idx]`."""

    __slots__ = ("table", "idx", "on_cpu")

    def __init__(self, idx: int) -> None:
        self.table: list[int] = []  # physical block ids, GPU or CPU pool per `on_cpu`
        self.idx = idx  # row of the allocator's token counts
        self.on_cpu = False  # True while swapped out


class PagedAllocator:
    """Paged KV cache of one replica: a GPU pool, a CPU swap pool, and block tables."""

    def __init__(self, num_gpu_blocks: int, block_size: int, num_cpu_blocks: int = 0):
        assert num_gpu_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.gpu = BlockPool(num_gpu_blocks)
        self.cpu = BlockPool(num_cpu_blocks)
        self._seqs: dict[int, _SeqBlocks] = {}
        # slots written (computed tokens) per sequence, <= len(table) * block_size; a numpy
        # column by sequence index so a decode step updates a batch at once (`append_decodes`)
        self._ntok = np.zeros(0, dtype=np.int64)
        self._nt = memoryview(self._ntok)  # scalar access to _ntok (Python ints)
        self._free_idx: list[int] = []
        self._seq_of_row: list[_SeqBlocks | None] = []  # the live sequence at each row of _ntok
        # slots written over every sequence on the GPU (a shared block counted per sequence):
        # with nothing shared, used blocks * block_size - this = unfilled slots of last blocks
        self.num_gpu_tokens = 0
        self.num_cow_copies = 0  # blocks copied on write, for reporting

    def _new_seq(self, seq_id: int) -> _SeqBlocks:
        if not self._free_idx:
            old = len(self._ntok)
            grown = np.zeros(max(64, 2 * old), dtype=np.int64)
            grown[:old] = self._ntok
            self._ntok, self._nt = grown, memoryview(grown)
            self._free_idx.extend(range(len(grown) - 1, old - 1, -1))
            self._seq_of_row.extend([None] * (len(grown) - old))
        seq = self._seqs[seq_id] = _SeqBlocks(self._free_idx.pop())
        self._nt[seq.idx] = 0
        self._seq_of_row[seq.idx] = seq
        return seq

    def _drop_seq(self, seq_id: int) -> _SeqBlocks:
        seq = self._seqs.pop(seq_id)
        self._free_idx.append(seq.idx)
        self._seq_of_row[seq.idx] = None
        return seq

    def seq_index(self, seq_id: int) -> int:
        """The sequence's row in the token counts, fixed while it lives (`append_decodes`)."""
        return self._seqs[seq_id].idx

    # -- prefix caching ------------------------------------------------------------------
    @property
    def cached(self) -> dict[Hashable, int]:
        """Content hash -> GPU block id of every cached block (owned by the GPU pool)."""
        return self.gpu.cached_hash_to_block

    def num_cached_prefix_blocks(self, block_hashes: list[Hashable]) -> int:
        """How many leading blocks of this content are cached (computed KV to adopt). Changes
        nothing."""
        hits = 0
        cached = self.gpu.cached_hash_to_block
        for block_hash in block_hashes:
            if block_hash not in cached:
                break
            hits += 1
        return hits

    def num_blocks_to_allocate(self, num_new_tokens: int, cached_hashes: list[Hashable] = ()) -> int:
        """Free blocks `allocate_slots(_, num_new_tokens, cached_hashes)` would take: the new
        ones plus cached hits it revives from the evictable pool. Changes nothing."""
        gpu = self.gpu
        hits = [gpu.cached_hash_to_block[h] for h in cached_hashes]
        num_revived = sum(1 for block_id in hits if gpu.ref_cnt[block_id] == 0)
        return num_revived + self.blocks_for(len(hits) * self.block_size + num_new_tokens) - len(hits)

    def allocate_slots(self, seq_id: int, num_new_tokens: int, cached_hashes: list[Hashable] = ()) -> bool:
        """Start a new sequence: adopt the cached blocks named by `cached_hashes` (their tokens
        count as computed), then `num_new_tokens` slots after them. All or nothing: returns
        False and changes nothing (LRU order included) if the GPU pool is short.

            [ cached b3 | cached b8 | new ... new ]
              touched: revived if evictable      taken from the free pool
        """
        assert seq_id not in self._seqs, "allocate_slots starts a new sequence"
        gpu = self.gpu
        if not cached_hashes:  # nothing to adopt (the common admission): new blocks only
            num_new_blocks = -(-num_new_tokens // self.block_size)
            if num_new_blocks > gpu.num_free:
                return False
            seq = self._new_seq(seq_id)
            seq.table = gpu.take_many(num_new_blocks)
            self._nt[seq.idx] = num_new_tokens
            self.num_gpu_tokens += num_new_tokens
            return True
        if self.num_blocks_to_allocate(num_new_tokens, cached_hashes) > gpu.num_free:
            return False
        hits = [gpu.cached_hash_to_block[h] for h in cached_hashes]
        num_cached_tokens = len(hits) * self.block_size
        num_new_blocks = self.blocks_for(num_cached_tokens + num_new_tokens) - len(hits)
        seq = self._new_seq(seq_id)
        for block_id in hits:
            gpu.touch(block_id)
            seq.table.append(block_id)
        seq.table.extend(gpu.take_many(num_new_blocks))
        self._nt[seq.idx] = num_cached_tokens + num_new_tokens
        self.num_gpu_tokens += num_cached_tokens + num_new_tokens
        return True

    def cache_full_blocks(self, seq_id: int, block_hashes: list[Hashable]) -> None:
        """Register the sequence's full blocks whose content these hashes name (first wins)."""
        seq = self._seqs[seq_id]
        assert not seq.on_cpu, "only blocks on the GPU are cached"
        full = min(len(block_hashes), self._nt[seq.idx] // self.block_size, len(seq.table))
        for index in range(full):
            self.gpu.cache(seq.table[index], block_hashes[index])

    # -- sizes ---------------------------------------------------------------------------
    @property
    def num_gpu_blocks(self) -> int:
        return self.gpu.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.gpu.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.gpu.num_blocks - self.gpu.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def has_seq(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def num_tokens(self, seq_id: int) -> int:
        return self._nt[self._seqs[seq_id].idx]

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._seqs[seq_id].table)

    def is_swapped(self, seq_id: int) -> bool:
        return self._seqs[seq_id].on_cpu

    # -- allocation ----------------------------------------------------------------------
    def can_allocate(self, num_tokens: int) -> AllocStatus:
        """Could a new sequence of `num_tokens` ever fit, and does it fit now?"""
        need = self.blocks_for(num_tokens)
        if need > self.gpu.num_blocks:
            return AllocStatus.NEVER
        return AllocStatus.OK if need <= self.gpu.num_free else AllocStatus.LATER

    def num_blocks_needed(self, seq_id: int, num_new_tokens: int) -> int:
        """Free blocks `append_slots(seq_id, num_new_tokens)` would take, copy-on-write included."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            return self.blocks_for(num_new_tokens)
        bs = self.block_size
        filled = self._nt[seq.idx]
        need = -(-(filled + num_new_tokens) // bs) - len(seq.table)
        if num_new_tokens and filled % bs and self.gpu.ref_cnt[seq.table[-1]] > 1:
            need += 1
        return need

    def append_slots(self, seq_id: int, num_new_tokens: int) -> bool:
        """Grow a sequence (created on first use) by `num_new_tokens` written slots.
        All or nothing: returns False and changes nothing if the GPU pool is short."""
        seq = self._seqs.get(seq_id)
        created = seq is None
        if seq is None:
            seq = self._new_seq(seq_id)
        assert not seq.on_cpu, "append to a swapped-out sequence"
        bs = self.block_size
        filled = self._nt[seq.idx]
        new_total = filled + num_new_tokens
        # Fast path: the last block has room and is not shared (a decode step, mostly).
        if filled % bs and new_total <= len(seq.table) * bs:
            if self.gpu.ref_cnt[seq.table[-1]] == 1:
                self._nt[seq.idx] = new_total
                self.num_gpu_tokens += num_new_tokens
                return True
        need = self.num_blocks_needed(seq_id, num_new_tokens)
        if need > self.gpu.num_free:
            if created:  # an existing sequence, even an empty one, stays
                self._drop_seq(seq_id)
            return False
        gpu = self.gpu
        if num_new_tokens and filled % bs and gpu.ref_cnt[seq.table[-1]] > 1:
            shared = seq.table[-1]
            seq.table[-1] = gpu.take()  # copy-on-write: the copy is ours, the original stays
            gpu.decref(shared)
            self.num_cow_copies += 1
        seq.table.extend(gpu.take_many(-(-new_total // bs) - len(seq.table)))
        self._nt[seq.idx] = new_total
        self.num_gpu_tokens += num_new_tokens
        return True

    def append_decodes(self, indices: np.ndarray, full_rows: list[int]) -> None:
        """One decode slot for each sequence at `indices` (rows from `seq_index`): unshared,
        on the GPU, and `full_rows` exactly the rows of those whose last block is full, in the
        order step-by-step `append_slots(seq_id, 1)` calls would take their new blocks. The
        caller checked that they fit. One `take_many` for the step's new blocks, handed out in
        that order: the same block ids and counts as one `append_slots` per sequence."""
        self._ntok[indices] += _ONE
        self.num_gpu_tokens += len(indices)
        if full_rows:
            seq_of_row = self._seq_of_row
            for row, block_id in zip(full_rows, self.gpu.take_many(len(full_rows)), strict=True):
                seq_of_row[row].table.append(block_id)

    def append_runs(self, indices: np.ndarray, num_new_tokens: int) -> None:
        """`append_slots(seq_id, num_new_tokens)` for each sequence, in order: unshared, on the
        GPU, at rows `indices` (from `seq_index`), each holding at least one slot; the caller
        checked that their blocks fit."""
        filled = self._ntok[indices]
        new_total = filled + num_new_tokens
        bs = self.block_size
        # blocks_for(new_total) - blocks_for(filled) = (filled - 1 + n) // bs - (filled - 1) // bs
        # for filled >= 1, i.e. ((filled - 1) % bs + n) // bs
        new_blocks = ((filled - _ONE) % bs + num_new_tokens) // bs
        self._ntok[indices] = new_total
        self.num_gpu_tokens += num_new_tokens * len(indices)
        grows = new_blocks.nonzero()[0]
        if not len(grows):
            return
        # one take for all: the sequences' runs of ids follow each other, in order
        counts = new_blocks[grows].tolist()
        taken = self.gpu.take_many(sum(counts))
        seq_of_row, start = self._seq_of_row, 0
        for row, count in zip(indices[grows].tolist(), counts, strict=True):
            end = start + count
            seq_of_row[row].table += taken[start:end]
            start = end

    def truncate(self, seq_id: int, num_tokens: int) -> int:
        """Shrink a GPU sequence to its first `num_tokens` written slots (speculative decoding:
        the rejected drafts' slots); blocks past blocks_for(num_tokens) go back to the pool, the
        last first. Returns the blocks freed.

            written  t0 .. t15 | t16 t17 d1 d2 | d3 _ _ _     truncate to 18 -> 2 blocks, 1 freed
        """
        seq = self._seqs[seq_id]
        assert not seq.on_cpu, "truncate a swapped-out sequence"
        filled = self._nt[seq.idx]
        assert 0 <= num_tokens <= filled, "truncate only drops written slots"
        keep = self.blocks_for(num_tokens)
        dropped = seq.table[keep:]
        if dropped:
            del seq.table[keep:]
            self.gpu.decref_all(dropped[::-1])
        self._nt[seq.idx] = num_tokens
        self.num_gpu_tokens -= filled - num_tokens
        return len(dropped)

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (parallel sampling, beam search)."""
        parent = self._seqs[parent_id]
        assert child_id not in self._seqs and not parent.on_cpu
        child = self._new_seq(child_id)
        child.table = list(parent.table)
        self._nt[child.idx] = self._nt[parent.idx]
        self.num_gpu_tokens += self._nt[parent.idx]
        for block_id in child.table:
            self.gpu.incref(block_id)

    def free(self, seq_id: int) -> None:
        """Drop a sequence; its blocks return to their pool in reverse order when unshared."""
        if seq_id not in self._seqs:
            return
        seq = self._drop_seq(seq_id)
        if seq.on_cpu:
            self.cpu.decref_all(seq.table[::-1])
        else:
            self.num_gpu_tokens -= self._nt[seq.idx]
            self.gpu.decref_all(seq.table[::-1])

    # -- swapping ------------------------------------------------------------------------
    def distinct_blocks(self, seq_ids: list[int]) -> list[int]:
        """Blocks of a group of sequences, each once (shared blocks are copied once)."""
        seen: dict[int, None] = {}
        for seq_id in seq_ids:
            for block_id in self._seqs[seq_id].table:
                seen[block_id] = None
        return list(seen)

    def can_swap_out(self, seq_ids: list[int]) -> bool:
        return len(self.distinct_blocks(seq_ids)) <= self.cpu.num_free

    def can_swap_in(self, seq_ids: list[int]) -> bool:
        return len(self.distinct_blocks(seq_ids)) <= self.gpu.num_free

    def _move(self, seq_ids: list[int], src: BlockPool, dst: BlockPool, to_cpu: bool) -> int:
        mapping: dict[int, int] = {}
        for seq_id in seq_ids:
            seq = self._seqs[seq_id]
            assert seq.on_cpu != to_cpu
            new_table = []
            for block_id in seq.table:
                if block_id in mapping:
                    dst.incref(mapping[block_id])
                else:
                    mapping[block_id] = dst.take()
                new_table.append(mapping[block_id])
                src.decref(block_id)
            seq.table = new_table
            seq.on_cpu = to_cpu
            self.num_gpu_tokens += -self._nt[seq.idx] if to_cpu else self._nt[seq.idx]
        return len(mapping)

    def swap_out(self, seq_ids: list[int]) -> int:
        """Move a group's blocks to the CPU pool; returns the number of blocks copied."""
        assert self.can_swap_out(seq_ids)
        return self._move(seq_ids, self.gpu, self.cpu, to_cpu=True)

    def swap_in(self, seq_ids: list[int]) -> int:
        """Move a swapped-out group back to the GPU pool; returns blocks copied."""
        assert self.can_swap_in(seq_ids)
        return self._move(seq_ids, self.cpu, self.gpu, to_cpu=False)

    # -- accounting ----------------------------------------------------------------------
    def ref_counts_from_tables(self) -> tuple[dict[int, int], dict[int, int]]:
        """(GPU, CPU) block id -> number of tables referencing it; for invariant checks."""
        gpu: dict[int, int] = {}
        cpu: dict[int, int] = {}
        for seq in self._seqs.values():
            target = cpu if seq.on_cpu else gpu
            for block_id in seq.table:
                target[block_id] = target.get(block_id, 0) + 1
        return gpu, cpu
