"""Block hashes of a request's tokens, chained as vLLM v1 computes them, over synthetic token ids.

vLLM's automatic prefix caching keys a full KV block by its content and everything before it
(`vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`):

    hash(block i) = H((hash(block i-1) or NONE_HASH, tuple(token ids of block i), extra_keys))

so two sequences share block i's hash exactly when their first (i+1) * block_size tokens are
equal. A request's hashes are computed once and extended as it decodes (`Request.block_hashes`,
`request_block_hasher`), and full blocks are registered in the cache as they are computed,
output blocks included, which is how a conversation's next turn finds its previous answer.

kvsim has no text, so each conversation gets a synthetic token stream (`TokenStream`): the id
at position p is a function of the stream's key and p, and positions below `shared_len` come
from a shared stream (a system prompt many sessions start with). Every turn of a session reads
the same stream (its prompt is the previous turn's prompt and answer, then new user tokens), so
its blocks chain to the previous turn's. H is Python's `hash` of a tuple of ints (no extra keys
is an empty tuple, not None: hash(None) follows None's address before Python 3.12), which is
deterministic across processes (only str/bytes hashing is salted); only which hashes are equal
matters to a run (the compiled core keys blocks by ids numbered in first-seen order), and
vLLM's sha256 would give other numbers, not other matches.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

NONE_HASH = 0x6B7673696D  # the chain's seed (vLLM: init_none_hash, random unless PYTHONHASHSEED is set)
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing constant: spreads (key, position) over the id space
_STEP = 0x2545F491  # spreads positions
_VOCAB = 1 << 17  # synthetic ids stay below a typical vocabulary size (Llama 3: 128,256)
_WRAP = 1 << 64


def hash_block_tokens(parent: Hashable | None, token_ids: tuple[int, ...], extra_keys: tuple | None = None) -> int:
    """vLLM's chained block hash: the parent's hash (NONE_HASH for block 0), the block's ids and extra keys."""
    return hash((NONE_HASH if parent is None else parent, token_ids, () if extra_keys is None else extra_keys))


class TokenStream:
    """The synthetic token ids of one conversation and the chained hashes of its full blocks.

    `key` names the conversation; the first `shared_len` positions come from `shared_key`'s
    stream instead (a system prompt shared by many sessions), so sessions with the same shared
    prefix hash its blocks alike. Hashes are cached per block size and extended on demand, so a
    session's turns hash each block once, as vLLM hashes each request's blocks once.
    """

    __slots__ = ("key", "shared_key", "shared_len", "_hashes")

    def __init__(self, key: int, shared_key: int | None = None, shared_len: int = 0):
        self.key = int(key)
        self.shared_key = shared_key
        self.shared_len = int(shared_len) if shared_key is not None else 0
        self._hashes: dict[int, list[int]] = {}  # block size -> hashes of blocks 0, 1, ...

    def token_ids(self, start: int, stop: int) -> tuple[int, ...]:
        """The ids at positions start..stop-1."""
        return tuple(self._ids(start, stop).tolist())

    def _ids(self, start: int, stop: int) -> np.ndarray:
        """`token_ids` as an array: ((k * _MIX + p * _STEP) >> 7) % _VOCAB is bits 7..23 of the
        sum, which its value modulo 2**64 (uint64 arithmetic, wrapping) already holds."""
        p = np.arange(start, stop, dtype=np.uint64)
        keys = np.full(len(p), self.key % _WRAP, dtype=np.uint64)
        if self.shared_len > start:
            keys[: min(self.shared_len, stop) - start] = self.shared_key % _WRAP
        with np.errstate(over="ignore"):
            mixed = keys * np.uint64(_MIX) + p * np.uint64(_STEP)
        return (mixed >> np.uint64(7)) & np.uint64(_VOCAB - 1)

    def block_hashes(self, block_size: int, num_blocks: int) -> list[int]:
        """Hashes of the first `num_blocks` full blocks (a new list)."""
        hashes = self._hashes.setdefault(block_size, [])
        if len(hashes) < num_blocks:
            first = len(hashes)
            ids = self._ids(first * block_size, num_blocks * block_size).reshape(-1, block_size).tolist()
            for row in ids:
                hashes.append(hash_block_tokens(hashes[-1] if hashes else None, tuple(row)))
        return hashes[:num_blocks]
