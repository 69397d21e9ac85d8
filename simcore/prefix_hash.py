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
its blocks chain to the previous turn's. H is Python's `hash` of a tuple of ints, which is
deterministic across processes (only str/bytes hashing is salted), so runs are reproducible;
vLLM's sha256 would give other numbers, not other matches.
"""

from __future__ import annotations

from collections.abc import Hashable

NONE_HASH = 0x6B7673696D  # the chain's seed (vLLM: init_none_hash, random unless PYTHONHASHSEED is set)
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing constant: spreads (key, position) over the id space
_VOCAB = 1 << 17  # synthetic ids stay below a typical vocabulary size (Llama 3: 128,256)


def hash_block_tokens(parent: Hashable | None, token_ids: tuple[int, ...], extra_keys: tuple | None = None) -> int:
    """vLLM's chained block hash: the parent's hash (NONE_HASH for block 0), the block's ids and extra keys."""
    return hash((NONE_HASH if parent is None else parent, token_ids, extra_keys))


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
        out = []
        for p in range(start, stop):
            k = self.shared_key if p < self.shared_len else self.key
            out.append(((k * _MIX + p * 0x2545F491) >> 7) % _VOCAB)
        return tuple(out)

    def block_hashes(self, block_size: int, num_blocks: int) -> list[int]:
        """Hashes of the first `num_blocks` full blocks (a new list)."""
        hashes = self._hashes.setdefault(block_size, [])
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None,
                                            self.token_ids(i * block_size, (i + 1) * block_size)))
        return hashes[:num_blocks]
