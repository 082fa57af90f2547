"""Compiled paged attention for every sequence of a step in one call.

Each work item is (sequence, tile of query rows, kv head; all kv heads in the serial variant):
decode rows (one new token) and rows of a prefill chunk or a speculative verification (several
new tokens over a cached prefix) go through the same code. An item of several rows copies the keys it can see into a
transposed scratch K^T [Dh, L] and V [L, Dh] (reading the cache through the block table once),
then for each query row and each query head of the group: scores over the visible keys
(vectorized over keys), a float32 softmax, and the weighted sum of V rows (vectorized over Dh).
An item of one row (decode) reads K and V rows in place from the cache instead: the copy would
cost as much as the row's whole attention; it asks for the next cache block ahead (blocks are
scattered, the hardware prefetchers do not follow a block table). The softmax's exp is `exp32`
(vectorized).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from kernels.numba_jit import JIT
from kernels.numba_math import exp32
from kernels.simd import LANES, hsum, prefetch, vfma, vfma_s, vload, vstore, vzero

f32 = np.float32
ROW_TILE = 16  # query rows per work item of a prefill
# From this many row tiles on (a step of many decoding sequences) a work item takes a tile's kv heads
# together: a decode row then reads each of its K/V rows whole (all kv heads side by side) instead of
# a third of it per item. Fewer tiles keep an item per kv head, so that the threads have work.
TILES_TOGETHER = 16


@njit(**JIT)
def _gather(k_cache, v_cache, table, kvh, n_keys, kt, v):
    bs, Dh = k_cache.shape[1], k_cache.shape[3]
    for l in range(n_keys):
        blk = table[l // bs]
        off = l % bs
        for d in range(Dh):
            kt[d, l] = k_cache[blk, off, kvh, d]
            v[l, d] = v_cache[blk, off, kvh, d]


@njit(error_model="numpy", **JIT)  # no zero-division branches in the vectorized loops
def _attend_row(qrow, kt, v, n_keys, scale, s, out):
    """out [Dh] = softmax(scale * qrow . K[:n_keys]) @ V[:n_keys]."""
    Dh = qrow.shape[0]
    for l in range(n_keys):
        s[l] = 0.0
    for d in range(Dh):
        qd = qrow[d] * scale
        for l in range(n_keys):
            s[l] += qd * kt[d, l]
    _softmax(s, n_keys)
    for d in range(Dh):
        out[d] = 0.0
    for l in range(n_keys):
        p = s[l]
        for d in range(Dh):
            out[d] += p * v[l, d]


@njit(error_model="numpy", **JIT)
def _softmax(s, n):
    """s[:n] = softmax(s[:n]) in place."""
    mx = s[0]
    for l in range(1, n):
        mx = max(mx, s[l])
    total = f32(0.0)
    for l in range(n):
        e = exp32(s[l] - mx)
        s[l] = e
        total += e
    inv = f32(1.0) / total
    for l in range(n):
        s[l] *= inv


@njit(**JIT)
def _prefetch_block(cache, blk, kv0, nkv):
    """Ask for kv heads kv0 .. kv0 + nkv - 1 of cache block blk (blocks are scattered: the hardware
    prefetchers do not follow a block table; a decode row's next block then waits on DRAM)."""
    bs, Hkv, Dh = cache.shape[1], cache.shape[2], cache.shape[3]
    flat = cache.reshape(-1)
    for off in range(bs):
        base = ((blk * bs + off) * Hkv + kv0) * Dh
        for i in range(0, nkv * Dh, 16):
            prefetch(flat, base + i)


@njit(error_model="numpy", **JIT)
def _attend_in_place(q, k_cache, v_cache, table, kv0, G, n_keys, scale, s, out):
    """One query row: out [n, Dh] = softmax(scale * q [n, Dh] . K[:n_keys]) @ V[:n_keys] for n query
    heads in groups of G per kv head, from kv head kv0 on, reading K and V rows in place through the
    block table. s [n, n_keys]. In SIMD blocks: each score one vector dot product with a K row; each
    output vector of a head summed over the keys in a register, not in `out` (which the compiler must
    reload and store around every V row it might alias); a head dim past a multiple of LANES in scalars."""
    n, Dh = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    kf, vf = k_cache.reshape(-1), v_cache.reshape(-1)
    qf, of = q.reshape(-1), out.reshape(-1)
    full = Dh - Dh % LANES
    nb = (n_keys + bs - 1) // bs
    for bi in range(nb):
        blk = table[bi]
        if bi + 1 < nb:
            _prefetch_block(k_cache, table[bi + 1], kv0, n // G)
        for off in range(min(bs, n_keys - bi * bs)):
            row = (blk * bs + off) * Hkv + kv0
            for h in range(n):
                base = (row + h // G) * Dh
                acc = vzero()
                for c in range(0, full, LANES):
                    acc = vfma(vload(qf, h * Dh + c), vload(kf, base + c), acc)
                dot = hsum(acc)
                for d in range(full, Dh):
                    dot += qf[h * Dh + d] * kf[base + d]
                s[h, bi * bs + off] = dot * scale
    for h in range(n):
        _softmax(s[h], n_keys)
    for h in range(n):
        for c in range(0, full, LANES):
            acc = vzero()
            for bi in range(nb):
                blk = table[bi]
                for off in range(min(bs, n_keys - bi * bs)):
                    acc = vfma_s(vload(vf, ((blk * bs + off) * Hkv + kv0 + h // G) * Dh + c), s[h, bi * bs + off], acc)
            vstore(of, h * Dh + c, acc)
        for d in range(full, Dh):
            t = f32(0.0)
            for bi in range(nb):
                blk = table[bi]
                for off in range(min(bs, n_keys - bi * bs)):
                    t += s[h, bi * bs + off] * vf[((blk * bs + off) * Hkv + kv0 + h // G) * Dh + d]
            of[h * Dh + d] = t


@njit(**JIT)
def _tiles(query_start):
    """First work-item tile of each sequence ([B + 1], cumulative)."""
    B = query_start.shape[0] - 1
    tiles = np.empty(B + 1, dtype=np.int64)
    tiles[0] = 0
    for b in range(B):
        n = query_start[b + 1] - query_start[b]
        tiles[b + 1] = tiles[b] + (n + ROW_TILE - 1) // ROW_TILE
    return tiles


@njit(**JIT)
def _tile(q, k_cache, v_cache, query_start, context_lens, block_tables, scale, out, tiles, tile, kv0, kv1):
    """Row tile `tile` (of a sequence) for kv heads kv0..kv1-1 and their query heads."""
    Dh = q.shape[2]
    G = q.shape[1] // k_cache.shape[2]
    b = np.searchsorted(tiles, tile, side="right") - 1
    r0, r1 = query_start[b], query_start[b + 1]
    start = context_lens[b] - (r1 - r0)  # position of the sequence's first new row
    i0 = r0 + (tile - tiles[b]) * ROW_TILE
    i1 = min(r1, i0 + ROW_TILE)
    n_keys = start + (i1 - r0)  # keys visible to the tile's last row
    if i1 - i0 == 1:
        s = np.empty(((kv1 - kv0) * G, n_keys), dtype=np.float32)
        _attend_in_place(
            q[i0, kv0 * G : kv1 * G],
            k_cache,
            v_cache,
            block_tables[b],
            kv0,
            G,
            n_keys,
            scale,
            s,
            out[i0, kv0 * G : kv1 * G],
        )
        return
    kt = np.empty((Dh, n_keys), dtype=np.float32)
    v = np.empty((n_keys, Dh), dtype=np.float32)
    s = np.empty(n_keys, dtype=np.float32)
    for kvh in range(kv0, kv1):
        _gather(k_cache, v_cache, block_tables[b], kvh, n_keys, kt, v)
        for i in range(i0, i1):
            visible = start + (i - r0) + 1
            for g in range(G):
                h = kvh * G + g
                _attend_row(q[i, h], kt, v, visible, scale, s, out[i, h])


@njit(parallel=True, **JIT)
def paged_attention(q, k_cache, v_cache, query_start, context_lens, block_tables, scale, out):
    """q [T, H, Dh] -> out [T, H, Dh]: causal attention of each sequence's new rows over its paged context.

    Query row i of sequence b (n new rows, context c) sits at position c - n + i and sees keys 0..c-n+i.
    Work items: (row tile, kv head), or row tiles with all their kv heads from TILES_TOGETHER tiles on.
    """
    tiles = _tiles(query_start)
    Hkv = k_cache.shape[2]
    if tiles[-1] >= TILES_TOGETHER:  # many tiles: each reads its K/V rows whole, every kv head at once
        for tile in prange(tiles[-1]):
            _tile(q, k_cache, v_cache, query_start, context_lens, block_tables, scale, out, tiles, tile, 0, Hkv)
        return
    for item in prange(tiles[-1] * Hkv):
        kvh = item % Hkv
        _tile(
            q, k_cache, v_cache, query_start, context_lens, block_tables, scale, out, tiles, item // Hkv, kvh, kvh + 1
        )


@njit(**JIT)
def paged_attention_serial(q, k_cache, v_cache, query_start, context_lens, block_tables, scale, out):
    """`paged_attention` on the calling thread, for steps too small to pay for a parallel launch: a
    tile's kv heads together, so a decode row reads each cache block once, front to back."""
    tiles = _tiles(query_start)
    for tile in range(tiles[-1]):
        _tile(
            q, k_cache, v_cache, query_start, context_lens, block_tables, scale, out, tiles, tile, 0, k_cache.shape[2]
        )
