"""Random paged-attention cases shared by the NumPy tests and the CuPy parity tests.

Each case keeps dense K/V per sequence next to the same data scattered into a paged cache
through shuffled (non-contiguous) block tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.attention_meta import build_attention_metadata


@dataclass(slots=True)
class AttnCase:
    q: np.ndarray  # [T, H, Dh]
    k_new: np.ndarray  # [T, Hkv, Dh], this step's keys
    v_new: np.ndarray
    k_dense: list[np.ndarray]  # per seq [ctx, Hkv, Dh], whole context (prefix + new)
    v_dense: list[np.ndarray]
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    k_cache: np.ndarray  # prefix already written, new tokens not yet
    v_cache: np.ndarray
    block_size: int

    def meta(self, backend=None):
        return build_attention_metadata(self.query_lens, self.context_lens, self.block_tables, self.block_size, backend)


def make_case(
    rng: np.random.Generator,
    seqs: list[tuple[int, int]],
    heads: int = 9,
    kv_heads: int = 3,
    head_dim: int = 64,
    block_size: int = 16,
    spare_blocks: int = 7,
) -> AttnCase:
    """seqs: (new tokens, context len) per sequence. Blocks are handed out in shuffled order so
    each sequence's table is non-contiguous; the cache's unused slots hold large garbage so any read
    past a context shows up in the result."""
    need = [-(-c // block_size) for _, c in seqs]
    num_blocks = sum(need) + spare_blocks
    ids = rng.permutation(num_blocks).tolist()
    tables, at = [], 0
    for n_blk in need:
        tables.append(ids[at : at + n_blk])
        at += n_blk
    cache_shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = (rng.standard_normal(cache_shape) * 50).astype(np.float32)
    v_cache = (rng.standard_normal(cache_shape) * 50).astype(np.float32)
    k_dense, v_dense, k_new, v_new, q = [], [], [], [], []
    for (n, c), table in zip(seqs, tables):
        kd = rng.standard_normal((c, kv_heads, head_dim)).astype(np.float32)
        vd = rng.standard_normal((c, kv_heads, head_dim)).astype(np.float32)
        for p in range(c - n):  # cached prefix, written the slow obvious way
            k_cache[table[p // block_size], p % block_size] = kd[p]
            v_cache[table[p // block_size], p % block_size] = vd[p]
        k_dense.append(kd)
        v_dense.append(vd)
        k_new.append(kd[c - n :])
        v_new.append(vd[c - n :])
        q.append(rng.standard_normal((n, heads, head_dim)).astype(np.float32))
    return AttnCase(
        q=np.concatenate(q),
        k_new=np.concatenate(k_new),
        v_new=np.concatenate(v_new),
        k_dense=k_dense,
        v_dense=v_dense,
        query_lens=[n for n, _ in seqs],
        context_lens=[c for _, c in seqs],
        block_tables=tables,
        k_cache=k_cache,
        v_cache=v_cache,
        block_size=block_size,
    )


# (name, [(new tokens, context len), ...], heads, kv_heads)
ATTENTION_CASES = [
    ("decode_varied_context", [(1, 1), (1, 17), (1, 40), (1, 100), (1, 16), (1, 33)], 9, 3),
    ("decode_long_and_short", [(1, 300), (1, 2), (1, 150), (1, 31)], 9, 3),
    ("prefill_no_prefix", [(37, 37)], 9, 3),
    ("prefill_two_seqs_no_prefix", [(5, 5), (20, 20)], 9, 3),
    ("prefill_chunk_with_prefix", [(20, 70)], 9, 3),
    ("prefill_chunk_block_aligned_prefix", [(16, 48)], 9, 3),
    ("mixed_prefill_and_decode", [(1, 50), (12, 12), (1, 3), (9, 41), (1, 64)], 9, 3),
    ("mha", [(1, 23), (7, 30)], 4, 4),
    ("mha_many_kv_heads", [(1, 23), (1, 50), (7, 30)], 6, 6),
    ("mqa", [(1, 23), (7, 30)], 8, 1),
    ("gqa_group4", [(1, 45), (6, 6), (3, 19)], 8, 2),
]
