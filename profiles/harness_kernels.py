"""Paged decode attention backends for the harness (imports torch; import only when profiling).

Every backend reads the same KV cache, laid out as vLLM and FlashInfer (NHD) do:

    k_cache, v_cache : [num_blocks, block_size, num_kv_heads, head_dim]
    block_table      : [batch, max_blocks_per_seq] int32, physical block ids scattered at random
    seq_lens         : [batch] int32, tokens each sequence attends to
    query            : [batch, num_heads, head_dim]  ->  output [batch, num_heads, head_dim]

`choose_backend` returns the first of flashinfer, vllm (its flash-attn paged kernel), flex
(torch FlexAttention with a paged block mask) and reference (gather by block table + SDPA)
that imports and agrees with dense attention on a small random case.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BACKENDS = ("flashinfer", "vllm", "flex", "reference")


@dataclass
class PagedKV:
    """One paged-decode problem: a random KV cache and a scattered block table."""

    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    scale: float

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[1]


def make_paged_kv(
    batch: int, context: int, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: str, generator: torch.Generator, ragged: bool = False,
    tensor_generator: torch.Generator | None = None,
) -> PagedKV:
    """Sequences of `context` tokens (or random lengths 1..context if ragged) whose blocks are a
    random permutation of the cache, with a few spare blocks so ids are not contiguous.
    `generator` (cpu) draws the layout; tensors are drawn on the device by `tensor_generator`
    (default: the cpu generator, then copied)."""
    if ragged:
        lens = torch.randint(1, context + 1, (batch,), generator=generator)
    else:
        lens = torch.full((batch,), context)
    blocks_per_seq = (lens + block_size - 1) // block_size
    max_blocks = int(blocks_per_seq.max())
    num_blocks = int(blocks_per_seq.sum()) + 8
    perm = torch.randperm(num_blocks, generator=generator)
    table = torch.zeros((batch, max_blocks), dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks_per_seq.tolist()):
        table[i, :n] = perm[start:start + n].to(torch.int32)
        start += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    tg = tensor_generator or generator
    where = tg.device

    def randn(*dims: int) -> torch.Tensor:
        return torch.randn(dims, generator=tg, device=where, dtype=dtype).to(device)

    k, v, q = randn(*shape), randn(*shape), randn(batch, num_heads, head_dim)
    return PagedKV(q, k, v, table.to(device), lens.to(torch.int32).to(device), 1.0 / math.sqrt(head_dim))


def dense_attention(p: PagedKV) -> torch.Tensor:
    """Ground truth: per sequence, its tokens gathered in order, plain softmax attention in fp32."""
    out = []
    groups = p.query.shape[1] // p.k_cache.shape[2]
    for i in range(p.query.shape[0]):
        n = int(p.seq_lens[i])
        blocks = p.block_table[i, : (n + p.block_size - 1) // p.block_size].long()
        k = p.k_cache[blocks].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)  # [n, H, D]
        v = p.v_cache[blocks].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)
        scores = torch.einsum("hd,nhd->hn", p.query[i].float(), k) * p.scale
        out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), v))
    return torch.stack(out)


def reference_backend(p: PagedKV) -> Callable[[], torch.Tensor]:
    """Gather each sequence's blocks by the block table, then masked SDPA (runs everywhere)."""
    b, heads, d = p.query.shape
    max_len = p.block_table.shape[1] * p.block_size
    pos = torch.arange(max_len, device=p.query.device)
    mask = (pos[None, :] < p.seq_lens[:, None]).view(b, 1, 1, max_len)
    table = p.block_table.long()
    q = p.query.unsqueeze(2)  # [B, H, 1, D]

    def run() -> torch.Tensor:
        k = p.k_cache[table].flatten(1, 2).transpose(1, 2)  # [B, KVH, L, D]
        v = p.v_cache[table].flatten(1, 2).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=p.scale, enable_gqa=True)
        return o.squeeze(2)

    return run


def flex_backend(p: PagedKV) -> Callable[[], torch.Tensor]:
    """FlexAttention over the physical cache with a block mask built from the block table:
    batch b visits exactly its own blocks; the mask cuts the last block at seq_len."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    b, heads, d = p.query.shape
    num_blocks, bs, kvh, _ = p.k_cache.shape
    dev = p.query.device
    nblk = ((p.seq_lens + bs - 1) // bs).to(torch.int32)
    logical = torch.zeros(num_blocks, dtype=torch.int32, device=dev)
    owner = torch.full((num_blocks,), -1, dtype=torch.int32, device=dev)
    cols = torch.arange(p.block_table.shape[1], device=dev, dtype=torch.int32)
    valid = cols[None, :] < nblk[:, None]
    phys = p.block_table[valid].long()
    logical[phys] = cols.expand_as(p.block_table)[valid]
    owner[phys] = torch.arange(b, device=dev, dtype=torch.int32)[:, None].expand_as(p.block_table)[valid]
    seq_lens = p.seq_lens

    def mask_mod(bi, h, q_idx, kv_idx):
        blk = kv_idx // bs
        return (owner[blk] == bi) & (logical[blk] * bs + kv_idx % bs < seq_lens[bi])

    kv_indices = torch.zeros((b, 1, 1, num_blocks), dtype=torch.int32, device=dev)
    kv_indices[:, 0, 0, : p.block_table.shape[1]] = p.block_table  # the mask's KV blocks = cache blocks
    mask = BlockMask.from_kv_blocks(
        nblk.view(b, 1, 1), kv_indices,
        BLOCK_SIZE=(1, bs), mask_mod=mask_mod, seq_lengths=(1, num_blocks * bs),
    )
    k = p.k_cache.flatten(0, 1).transpose(0, 1).unsqueeze(0)  # [1, KVH, NB*BS, D], a view
    v = p.v_cache.flatten(0, 1).transpose(0, 1).unsqueeze(0)
    q = p.query.unsqueeze(2)
    fn = torch.compile(flex_attention, dynamic=True) if dev.type == "cuda" else flex_attention

    def run() -> torch.Tensor:
        return fn(q, k, v, block_mask=mask, scale=p.scale, enable_gqa=True).squeeze(2)

    return run


def vllm_backend(p: PagedKV) -> Callable[[], torch.Tensor]:
    """vLLM's paged flash-attention kernel (same [blocks, block_size, kv_heads, dim] layout)."""
    from vllm.vllm_flash_attn import flash_attn_with_kvcache  # type: ignore[import-not-found]

    q = p.query.unsqueeze(1)  # [B, 1, H, D]

    def run() -> torch.Tensor:
        return flash_attn_with_kvcache(
            q, p.k_cache, p.v_cache, cache_seqlens=p.seq_lens, block_table=p.block_table,
            softmax_scale=p.scale, causal=True,
        ).squeeze(1)

    return run


def flashinfer_backend(p: PagedKV) -> Callable[[], torch.Tensor]:
    """FlashInfer's batch decode over a paged KV cache in NHD layout."""
    import flashinfer  # type: ignore[import-not-found]

    b, heads, d = p.query.shape
    bs, kvh = p.block_size, p.k_cache.shape[2]
    dev = p.query.device
    nblk = (p.seq_lens + bs - 1) // bs
    indptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
    indptr[1:] = torch.cumsum(nblk, 0)
    cols = torch.arange(p.block_table.shape[1], device=dev)
    indices = p.block_table[cols[None, :] < nblk[:, None]].to(torch.int32)
    last = ((p.seq_lens - 1) % bs + 1).to(torch.int32)
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(
        indptr, indices, last, heads, kvh, d, bs, q_data_type=p.query.dtype, kv_data_type=p.k_cache.dtype,
        sm_scale=p.scale,
    )

    def run() -> torch.Tensor:
        return wrapper.run(p.query, (p.k_cache, p.v_cache))

    return run


FACTORIES: dict[str, Callable[[PagedKV], Callable[[], torch.Tensor]]] = {
    "flashinfer": flashinfer_backend,
    "vllm": vllm_backend,
    "flex": flex_backend,
    "reference": reference_backend,
}


def check_backend(name: str, device: str, dtype: torch.dtype, block_size: int = 16) -> str | None:
    """None if `name` imports and matches dense attention on a small ragged case, else why not."""
    gen = torch.Generator().manual_seed(1234)
    try:
        p = make_paged_kv(5, 70, block_size, 8, 2, 64, dtype, device, gen, ragged=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = FACTORIES[name](p)().float()
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable here"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
    err = float((got - dense_attention(p)).abs().max())
    return None if err <= tol else f"max abs error {err:.3g} > {tol}"


def choose_backend(device: str, dtype: torch.dtype, block_size: int, wanted: str = "auto") -> tuple[str, dict]:
    """The first backend (in preference order) that imports and passes the check.

    On CPU, auto skips flex: without torch.compile FlexAttention materialises every score of
    the whole cache (not a paged kernel), and compiled CPU flex recompiles per grid shape."""
    order = BACKENDS if wanted == "auto" else (wanted,)
    tried: dict[str, str] = {}
    for name in order:
        if wanted == "auto" and name == "flex" and device == "cpu":
            tried[name] = "skipped on cpu (uncompiled flex is not a paged kernel)"
            continue
        why = check_backend(name, device, dtype, block_size)
        if why is None:
            tried[name] = "ok"
            return name, tried
        tried[name] = why
    return "", tried
