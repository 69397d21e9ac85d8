"""Multi-sequence requests on a paged cache: parallel sampling (`n > 1`) and beam search.

After the prompt is prefilled once, the request forks into k sequences that share every
prompt block (ref counts); each then appends its own tokens, copying a shared, partly filled
last block on its first write (copy-on-write):

    prompt blocks  [b0 b1 b2*]        * partly filled, shared by all k samples
    sample 0       [b0 b1 b2 ] + own blocks     (first writer copies b2 -> b7)
    sample 1       [b0 b1 b7 ] + own blocks

Beam search keeps `beam_width` sequences; after every step each new beam picks a parent among
the current beams and the unpicked ones are freed, so beams share long common prefixes. Which
parents win is stochastic here: a new beam picks the beam of rank r with probability
proportional to 1 / (r + 1) (better-ranked beams spawn more children). That choice is a model
assumption, and the memory saved by sharing depends on it.
"""

from __future__ import annotations

import numpy as np

from kvsim.simcore.block_pool import PagedAllocator
from kvsim.simcore.state import ReqState

FIRST_CHILD_SEQ_ID = 1 << 40  # child sequence ids never collide with request ids


def group_width(st: ReqState) -> int:
    """Sequences the request runs once prefilled."""
    return max(st.request.n, st.request.beam_width)


class SequenceGroups:
    """Forks, beam reselection and KV accounting of multi-sequence requests (owned by a policy).

    A request's sequences live here, not on the request: a request that has not forked (or
    was released by recompute) has one sequence whose id is its request id."""

    def __init__(self, allocator: PagedAllocator, rng: np.random.Generator):
        self.allocator = allocator
        self.rng = rng
        self.active: dict[int, ReqState] = {}  # request id -> forked request (running or swapped)
        self._seq_ids: dict[int, list[int]] = {}  # request id -> its sequence ids, forked only
        self._next_seq_id = FIRST_CHILD_SEQ_ID
        self._beam_weights: dict[int, np.ndarray] = {}

    def is_forked(self, st: ReqState) -> bool:
        return st.request_id in self._seq_ids

    def seq_ids(self, st: ReqState) -> list[int]:
        """The allocator ids of the request's live sequences (do not mutate)."""
        return self._seq_ids.get(st.request_id) or [st.request_id]

    def num_extra_seqs(self) -> int:
        """Sequences beyond the first of every forked request on the GPU. A swapped-out group
        runs nothing, so it takes no `max_num_seqs` room (vLLM's budget counts running sequences
        only); counting it kept two swapped groups from ever coming back."""
        alloc = self.allocator
        return sum([len(ids) - 1 for ids in self._seq_ids.values() if not alloc.is_swapped(ids[0])])

    def num_blocks_for(self, st: ReqState) -> int:
        """Blocks the request needs at its longest: the prompt once, the outputs k times."""
        alloc, k = self.allocator, group_width(st)
        prompt_blocks = alloc.blocks_for(st.num_prompt_tokens)
        return prompt_blocks + k * (alloc.blocks_for(st.final_len) - prompt_blocks + 1)

    def fork(self, st: ReqState) -> None:
        """Called when the request's prefill completes: make k sequences sharing its blocks."""
        parent = st.request_id
        seq_ids = [parent]
        for _ in range(group_width(st) - 1):
            child = self._new_seq_id()
            self.allocator.fork(parent, child)
            seq_ids.append(child)
        self._seq_ids[parent] = seq_ids
        self.active[parent] = st

    def reselect_beams(self, st: ReqState) -> None:
        """After a beam-search step: each new beam picks a parent; unpicked beams are freed."""
        seq_ids = self._seq_ids[st.request_id]
        k = len(seq_ids)
        weights = self._beam_weights.get(k)
        if weights is None:
            weights = 1.0 / np.arange(1, k + 1)
            weights = self._beam_weights[k] = weights / weights.sum()
        counts = np.bincount(self.rng.choice(k, size=k, p=weights), minlength=k)
        alloc, survivors = self.allocator, []
        for seq_id, count in zip(seq_ids, counts.tolist(), strict=True):
            for _ in range(count - 1):
                child = self._new_seq_id()
                alloc.fork(seq_id, child)
                survivors.append(child)
            if count:
                survivors.append(seq_id)
        for seq_id, count in zip(seq_ids, counts.tolist(), strict=True):
            if not count:
                alloc.free(seq_id)
        self._seq_ids[st.request_id] = survivors

    def release(self, st: ReqState) -> None:
        """Free every sequence and forget the group (finish or recompute preemption)."""
        for seq_id in self.seq_ids(st):
            self.allocator.free(seq_id)
        self._seq_ids.pop(st.request_id, None)
        self.active.pop(st.request_id, None)

    def internal_and_saved(self) -> tuple[int, int]:
        """(unfilled slots of the groups' last blocks, slots that block sharing saves) over
        running groups; a last block shared by several samples is counted once."""
        alloc, bs = self.allocator, self.allocator.block_size
        internal = saved = 0
        for request_id, st in self.active.items():
            seq_ids = self._seq_ids[request_id]
            if alloc.is_swapped(seq_ids[0]):
                continue
            tables = [alloc.block_table(s) for s in seq_ids]
            distinct = {b for t in tables for b in t}
            last_blocks = {t[-1] for t in tables if t}
            internal += len(last_blocks) * ((-st.num_computed_tokens) % bs)
            saved += (sum(len(t) for t in tables) - len(distinct)) * bs
        return internal, saved

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id
