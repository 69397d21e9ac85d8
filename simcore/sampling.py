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

from simcore.block_pool import PagedAllocator
from simcore.state import ReqState

FIRST_CHILD_SEQ_ID = 1 << 40  # child sequence ids never collide with request ids


def group_width(st: ReqState) -> int:
    """Sequences the request runs once prefilled."""
    return max(st.request.n, st.request.beam_width)


class SequenceGroups:
    """Forks, beam reselection and KV accounting of multi-sequence requests (owned by a policy)."""

    def __init__(self, allocator: PagedAllocator, rng: np.random.Generator):
        self.allocator = allocator
        self.rng = rng
        self.active: dict[int, ReqState] = {}  # request id -> running multi-seq request
        self._next_seq_id = FIRST_CHILD_SEQ_ID
        self._beam_weights: dict[int, np.ndarray] = {}

    def num_blocks_for(self, st: ReqState) -> int:
        """Blocks the request needs at its longest: the prompt once, the outputs k times."""
        alloc, k = self.allocator, group_width(st)
        prompt_blocks = alloc.blocks_for(st.num_prompt_tokens)
        return prompt_blocks + k * (alloc.blocks_for(st.final_len) - prompt_blocks + 1)

    def fork(self, st: ReqState) -> None:
        """Called when the request's prefill completes: make k sequences sharing its blocks."""
        parent = st.seq_ids[0]
        for _ in range(group_width(st) - 1):
            child = self._new_seq_id()
            self.allocator.fork(parent, child)
            st.seq_ids.append(child)
        self.active[st.request_id] = st

    def reselect_beams(self, st: ReqState) -> None:
        """After a beam-search step: each new beam picks a parent; unpicked beams are freed."""
        k = len(st.seq_ids)
        weights = self._beam_weights.get(k)
        if weights is None:
            weights = 1.0 / np.arange(1, k + 1)
            weights = self._beam_weights[k] = weights / weights.sum()
        counts = np.bincount(self.rng.choice(k, size=k, p=weights), minlength=k)
        alloc, survivors = self.allocator, []
        for seq_id, count in zip(st.seq_ids, counts.tolist(), strict=True):
            for _ in range(count - 1):
                child = self._new_seq_id()
                alloc.fork(seq_id, child)
                survivors.append(child)
            if count:
                survivors.append(seq_id)
        for seq_id, count in zip(st.seq_ids, counts.tolist(), strict=True):
            if not count:
                alloc.free(seq_id)
        st.seq_ids = survivors

    def release(self, st: ReqState) -> None:
        """Free every sequence and forget the group (finish or recompute preemption)."""
        for seq_id in st.seq_ids:
            self.allocator.free(seq_id)
        st.seq_ids = [st.request_id]
        self.active.pop(st.request_id, None)

    def internal_and_saved(self) -> tuple[int, int]:
        """(unfilled slots of the groups' last blocks, slots that block sharing saves) over
        running groups; a last block shared by several samples is counted once."""
        alloc, bs = self.allocator, self.allocator.block_size
        internal = saved = 0
        for st in self.active.values():
            if alloc.is_swapped(st.seq_ids[0]):
                continue
            tables = [alloc.block_table(s) for s in st.seq_ids]
            distinct = {b for t in tables for b in t}
            last_blocks = {t[-1] for t in tables if t}
            internal += len(last_blocks) * ((-st.num_computed_tokens) % bs)
            saved += (sum(len(t) for t in tables) - len(distinct)) * bs
        return internal, saved

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id
