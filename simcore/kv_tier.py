"""A host-memory (CPU) KV tier behind one replica's GPU prefix cache: vLLM's native KV offloading
(`--kv-offloading-size GiB`, the OffloadingConnector with its CPU backend).

What vLLM does (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py,
`OffloadingConnectorScheduler`), and what kvsim keeps of it:

- Store, write-through: every full block a step computes is copied GPU -> CPU after the step
  (`_get_reqs_to_store`), keyed by its block hash; the CPU pool evicts least recently used
  blocks (vllm/v1/kv_offload, LRU manager). The copy runs on its own CUDA stream, device to
  host, beside the compute; kvsim does not charge it (it never delays a step).
- Load: when a waiting request's prefix continues past its GPU cache hit in the CPU pool
  (`get_num_new_matched_tokens`, which also touches the request's blocks), the scheduler
  allocates GPU blocks for those tokens and loads them asynchronously: the request waits
  (WAITING_FOR_REMOTE_KVS) while other requests keep stepping, then is scheduled with the
  loaded tokens counted as computed. kvsim prices the load at the replica's host link (blocks x
  bytes per block / PCIe bandwidth, per GPU of the replica in parallel, as swap is priced), one
  load after another on that link, overlapped with the engine's steps.
- Requests loading are looked at first at each step, in the order their loads started (vLLM puts
  the requests its scheduler skipped back at the front of the queue). A load starts only when the
  request's whole prompt fits beside what the loads already queued still need (a reserve kvsim
  adds: loads hold their blocks while they wait, and without it they could hold every block
  with nothing running to free one). vLLM V1 has no swap preemption: the tier needs recompute.
- A miss (neither tier) is recomputed by prefill, as without the tier.

`--kv-offloading-size` is the whole buffer of a replica, summed over its TP ranks (vLLM's
CacheConfig.kv_offloading_size docstring); each rank holds its share of every block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class HostKVTier:
    """LRU set of block hashes held in host memory, `num_blocks` at most."""

    def __init__(self, num_blocks: int):
        assert num_blocks > 0
        self.num_blocks = num_blocks
        self._lru: OrderedDict[Hashable, None] = OrderedDict()  # least recently used first
        self.num_stored = 0  # blocks copied in (offload traffic, device to host)
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: Hashable) -> bool:
        return block_hash in self._lru

    def store(self, block_hashes: Sequence[Hashable]) -> None:
        """Write-through of newly computed blocks: each is copied in once (a block already held is
        only marked used), evicting the least recently used when full."""
        lru = self._lru
        for block_hash in block_hashes:
            if block_hash in lru:
                lru.move_to_end(block_hash)
                continue
            if len(lru) >= self.num_blocks:
                lru.popitem(last=False)
                self.num_evicted += 1
            lru[block_hash] = None
            self.num_stored += 1

    def num_hits(self, block_hashes: Sequence[Hashable], start: int) -> int:
        """How many consecutive blocks from `start` are held. Changes nothing."""
        lru, hits = self._lru, 0
        for block_hash in block_hashes[start:]:
            if block_hash not in lru:
                break
            hits += 1
        return hits

    def touch(self, block_hashes: Sequence[Hashable]) -> None:
        """Mark held blocks most recently used (vLLM touches a request's blocks at lookup)."""
        lru = self._lru
        for block_hash in block_hashes:
            if block_hash in lru:
                lru.move_to_end(block_hash)
