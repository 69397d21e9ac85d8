"""Contiguous KV reservations (Orca, static and dynamic batching): first fit over token addresses.

Each sequence reserves one extent of token slots up front and keeps it until freed. Because
extents cannot move or split, free memory fragments: a request can wait although the free
tokens, added up, would hold it (external fragmentation, which paging removes):

    address  0         4    6         10
             | a (4)   | b  | c (4)   |
    free a and c:
             | free 4  | b  | free 4  |   8 tokens free, largest extent 4 -> a request of 5 waits

Free extents are kept sorted by address, parallel lists `_free_starts` / `_free_lens`, and a
freed extent is merged with its neighbours, so no two free extents ever touch.
"""

from __future__ import annotations

from bisect import bisect_left

from kvsim.simcore.block_pool import AllocStatus
from kvsim.simcore.errors import ConfigError

RESERVATION_KINDS = ("max", "pow2", "oracle", "max_tokens")


class ContiguousAllocator:
    """A token-granular address space of `capacity_tokens` slots with first-fit placement."""

    def __init__(self, capacity_tokens: int):
        assert capacity_tokens > 0
        self._capacity = capacity_tokens
        self._free_starts: list[int] = [0]  # sorted start address of each free extent
        self._free_lens: list[int] = [capacity_tokens]  # its length, > 0; written with starts
        self._num_free = capacity_tokens  # sum of _free_lens
        self._seq_to_extent: dict[int, tuple[int, int]] = {}  # seq id -> (start, num_tokens)

    # -- sizes ---------------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self._capacity

    @property
    def num_free_tokens(self) -> int:
        return self._num_free

    @property
    def num_reserved_tokens(self) -> int:
        return self._capacity - self._num_free

    @property
    def largest_free_extent(self) -> int:
        return max(self._free_lens, default=0)

    @property
    def num_free_extents(self) -> int:
        return len(self._free_lens)

    def free_extents(self) -> list[tuple[int, int]]:
        """(start, num_tokens) of every free extent, by address."""
        return list(zip(self._free_starts, self._free_lens, strict=True))

    def has_seq(self, seq_id: int) -> bool:
        return seq_id in self._seq_to_extent

    def reserved_tokens(self, seq_id: int) -> int:
        return self._seq_to_extent[seq_id][1]

    def extent(self, seq_id: int) -> tuple[int, int]:
        """(start, num_tokens) of a sequence's reservation."""
        return self._seq_to_extent[seq_id]

    def external_fragmentation_tokens(self, min_request_tokens: int) -> int:
        """Free tokens in extents too small for a request of `min_request_tokens` (the smallest
        queued one): free memory the queue cannot use. 0 when nothing is queued (<= 0)."""
        if min_request_tokens <= 0:
            return 0
        return sum(n for n in self._free_lens if n < min_request_tokens)

    # -- allocation ----------------------------------------------------------------------
    def _first_fit(self, num_tokens: int) -> int:
        """Index of the lowest-address free extent holding `num_tokens`, or -1."""
        for i, n in enumerate(self._free_lens):
            if n >= num_tokens:
                return i
        return -1

    def can_reserve(self, num_tokens: int) -> AllocStatus:
        """NEVER if larger than the whole space, OK if one free extent holds it, else LATER."""
        if num_tokens > self._capacity:
            return AllocStatus.NEVER
        if num_tokens <= 0 or self._first_fit(num_tokens) >= 0:
            return AllocStatus.OK
        return AllocStatus.LATER

    def reserve(self, seq_id: int, num_tokens: int) -> bool:
        """Reserve `num_tokens` slots at the lowest-address extent that holds them.
        Returns False and changes nothing when no free extent is large enough."""
        assert seq_id not in self._seq_to_extent, "sequence already holds a reservation"
        assert num_tokens >= 0
        if num_tokens == 0:
            self._seq_to_extent[seq_id] = (0, 0)  # holds no address; free() ignores it
            return True
        i = self._first_fit(num_tokens)
        if i < 0:
            return False
        start = self._free_starts[i]
        if self._free_lens[i] == num_tokens:
            del self._free_starts[i]
            del self._free_lens[i]
        else:
            self._free_starts[i] = start + num_tokens
            self._free_lens[i] -= num_tokens
        self._num_free -= num_tokens
        self._seq_to_extent[seq_id] = (start, num_tokens)
        return True

    def free(self, seq_id: int) -> None:
        """Release a sequence's extent, merging it with free neighbours. Unknown ids: no-op."""
        extent = self._seq_to_extent.pop(seq_id, None)
        if extent is None or extent[1] == 0:
            return
        start, length = extent
        starts, lens = self._free_starts, self._free_lens
        i = bisect_left(starts, start)  # extents i-1 and i are the neighbours
        assert i == len(starts) or starts[i] >= start + length, "freed extent overlaps a free one"
        assert i == 0 or starts[i - 1] + lens[i - 1] <= start, "freed extent overlaps a free one"
        joins_left = i > 0 and starts[i - 1] + lens[i - 1] == start
        joins_right = i < len(starts) and start + length == starts[i]
        if joins_left and joins_right:
            lens[i - 1] += length + lens[i]
            del starts[i]
            del lens[i]
        elif joins_left:
            lens[i - 1] += length
        elif joins_right:
            starts[i] = start
            lens[i] += length
        else:
            starts.insert(i, start)
            lens.insert(i, length)
        self._num_free += length


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def reservation_tokens(
    kind: str, num_prompt_tokens: int, num_output_tokens: int, max_tokens: int, max_model_len: int
) -> int:
    """Tokens a contiguous allocator reserves for one request, capped at `max_model_len`.

    The Orca variants of the vLLM paper (Kwon et al., SOSP 2023, section 6.2):
      - "max":    max_model_len; the request may generate up to the model's limit.
      - "pow2":   prompt + the next power of two >= the real output (knows an upper bound).
      - "oracle": prompt + the real output (knows the output length exactly).
    Plus, for dynamic batching (DESIGN.md) which only knows the client's cap:
      - "max_tokens": prompt + max_tokens.
    Callers reject prompts of max_model_len tokens or more before reserving.
    """
    assert 1 <= num_prompt_tokens < max_model_len and 1 <= num_output_tokens
    if kind == "max":
        want = max_model_len
    elif kind == "pow2":
        want = num_prompt_tokens + _next_pow2(num_output_tokens)
    elif kind == "oracle":
        want = num_prompt_tokens + num_output_tokens
    elif kind == "max_tokens":
        want = num_prompt_tokens + max(max_tokens, num_output_tokens)
    else:
        raise ConfigError(
            f"unknown reservation kind {kind!r}; choose one of {', '.join(RESERVATION_KINDS)}"
        )
    return min(want, max_model_len)
