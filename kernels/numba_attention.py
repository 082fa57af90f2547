"""Compiled paged attention for every sequence of a step in one call.

Each work item is (sequence, tile of query rows, kv head; all kv heads in the serial variant):
decode rows (one new token) and rows of a prefill chunk or a speculative verification (several
new tokens over a cached prefix) go through the same code, in float32 throughout.

An item of several rows copies the keys it can see into a transposed scratch K^T [Dh, W] and
V [L, Dh] (reading the cache through the block table once per kv head), then takes the tile's
query vectors (rows times the kv head's query heads) QT at a time through two small matrix
products on register tiles (`_attend_rows`): every loaded vector of keys or values feeds QT
independent FMAs.

An item of one row (decode) reads K and V rows in place from the cache instead (a copy would cost
as much as the row's whole attention). A step of a few decode rows cuts each row's keys into spans, an item
each with every head (`_spans`), and weighs the spans' outputs by their log-sum-exp (`_combine_spans`). Within
an item: LANES keys' scores at once, one accumulator each, reduced together by a transposing tree
(`simd_attention.vsum_lanes`); then the V rows of each group of LANES keys for every head while they are in
L1, each head asking for its share of the rows PREFETCH_KEYS keys ahead
(`_prefetch_head`). The softmax's exp is `exp32` (vectorized).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from kernels.numba_jit import JIT
from kernels.numba_math import exp32
from kernels.simd import LANES
from kernels.simd_attention import vfma_bcast, vfma_rows, vstore_rows, vsum_lanes
from kernels.simd_vectors import prefetch, vfma_s, vload, vscale, vstore, vzero_n

f32 = np.float32
ROW_TILE = 16  # query rows per work item of a prefill
QT = 16  # query vectors per register tile of a prefill's scores and P.V
# From this many row tiles on (a step of many decoding sequences) a work item takes a tile's kv heads
# together: a decode row then reads each of its K/V rows whole (all kv heads side by side) instead of
# a third of it per item. Fewer tiles keep an item per kv head, so that the threads have work.
TILES_TOGETHER = 16
# A step of fewer than TILES_TOGETHER decode rows splits each row's keys into up to SPLITS work items of at least
# SPLIT_KEYS keys (block multiples), each with every head: whole K/V rows front to back, which the prefetchers follow,
# where an item per kv head read a quarter of every row (1B heads, K/V from DRAM: docs/performance.md).
SPLITS = 4
SPLIT_KEYS = 64
# How far ahead of the keys it scores (or weighs) a decode row asks for their K (V) rows: the cache's old rows come
# from DRAM, and in order they kept one core's reads at ~8 GB/s.
PREFETCH_KEYS = 2 * LANES


@njit(**JIT)
def _gather(k_cache, v_cache, table, kvh, n_keys, kt, v):
    """kt [Dh, W] = kv head kvh's first n_keys keys, transposed (columns past them zero: the scores'
    last vector reads them), v [n_keys, Dh] = their values."""
    bs, Dh = k_cache.shape[1], k_cache.shape[3]
    for l in range(n_keys):
        blk = table[l // bs]
        off = l % bs
        for d in range(Dh):
            kt[d, l] = k_cache[blk, off, kvh, d]
            v[l, d] = v_cache[blk, off, kvh, d]
    kt[:, n_keys:] = 0.0


@njit(error_model="numpy", **JIT)  # no zero-division branches in the vectorized loops
def _attend_rows(qf, of, kt, v, qoffs, vis, nq, scale, s, soffs):
    """Query vectors j < nq (at qoffs[j] in the flat q and out; query j sees the first vis[j] keys,
    vis nondecreasing) against one kv head's gathered keys kt [Dh, W] and values v [L, Dh]:
    out = softmax(scale * q . K) @ V. s [nq, W] holds query j's scores at soffs[j]; qoffs and soffs
    run to a multiple of QT, the padding repeating the last query (same values to the same places).

    Two small matrix products on QT-query register tiles: scores a key vector (LANES keys of one
    head dim) times each tile query's value of that dim, broadcast; P.V a V slice times each query's
    probability of that key. Each loaded vector serves QT independent FMAs."""
    Dh, W = kt.shape
    ktf, vf, sf = kt.reshape(-1), v.reshape(-1), s.reshape(-1)
    full = Dh - Dh % LANES
    for j0 in range(0, nq, QT):
        j1 = min(j0 + QT, nq)
        tq, ts = qoffs[j0 : j0 + QT], soffs[j0 : j0 + QT]
        reach = vis[j1 - 1]  # the tile's last query sees the most keys
        for l0 in range(0, reach, LANES):
            acc = vzero_n(QT)
            for d in range(Dh):
                acc = vfma_bcast(vload(ktf, d * W + l0), qf, tq, d, acc)
            vstore_rows(sf, ts, l0, acc)
        for j in range(j0, j1):
            row = s[j]
            for l in range(vis[j]):
                row[l] *= scale
            _softmax(row, vis[j])
            for l in range(vis[j], reach):  # keys a query must not see weigh nothing in P.V
                row[l] = 0.0
        for c in range(0, full, LANES):
            acc = vzero_n(QT)
            for l in range(reach):
                acc = vfma_bcast(vload(vf, l * Dh + c), sf, ts, l, acc)
            vstore_rows(of, tq, c, acc)
        for j in range(j0, j1):
            for d in range(full, Dh):
                t = f32(0.0)
                for l in range(vis[j]):
                    t += s[j, l] * v[l, d]
                of[qoffs[j] + d] = t


@njit(error_model="numpy", **JIT)
def _softmax(s, n):
    """s[:n] = softmax(s[:n]) in place; returns log(sum(exp(s[:n]))) of the input, which weighs this softmax's
    output against another's over other keys (`_combine_spans`)."""
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
    return mx + np.log(total)


@njit(inline="always", **JIT)
def _prefetch_head(a, offs, k0, n_keys, h, G, Dh):
    """Ask the caches for query head h's share of keys k0 .. k0 + LANES - 1's rows of its kv head (keys from n_keys
    on have none): the 64-byte lines j, j + G, ... of the kv head's Dh floats, j = h mod G, so that the G heads
    of a kv head take its lines between them. Spread over the heads' loop: all at once, a group's lines overran
    the core's outstanding misses."""
    hd = (h // G) * Dh
    for c in range((h % G) * 16, Dh, G * 16):
        for key in range(k0, min(k0 + LANES, n_keys)):
            prefetch(a, offs[key] + hd + c)


@njit(error_model="numpy", **JIT)
def _attend_in_place(q, k_cache, v_cache, table, kv0, G, n_keys, scale, s, offs, out, lse):
    """One query row: out [n, Dh] = softmax(scale * q [n, Dh] . K[:n_keys]) @ V[:n_keys] for n query heads in
    groups of G per kv head, from kv head kv0 on, reading K and V rows in place through the block table; lse [n] the
    heads' log-sum-exp of the scaled scores. s [n, W], offs [W] (int64): W = n_keys rounded up to LANES. Scores LANES
    keys at a time: one accumulator per key (no chain of latencies), their sums reduced together by one transposing
    tree (`vsum_lanes`). Then each group of LANES keys' V rows serves every head while it is in L1, a head's output
    added up four vectors at a time (independent chains again). A head dim not a multiple of LANES: scalar loops."""
    n, Dh = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    kf, vf = k_cache.reshape(-1), v_cache.reshape(-1)
    qf, of, sf = q.reshape(-1), out.reshape(-1), s.reshape(-1)
    W = s.shape[1]
    for l in range(W):  # each key's row of kv head kv0 (K and V share the layout); the padding repeats the last
        key = min(l, n_keys - 1)
        offs[l] = ((table[key // bs] * bs + key % bs) * Hkv + kv0) * Dh
    if Dh % LANES == 0:
        for k0 in range(0, n_keys, LANES):
            group = offs[k0 : k0 + LANES]
            for h in range(n):
                _prefetch_head(kf, offs, k0 + PREFETCH_KEYS, n_keys, h, G, Dh)
                acc = vzero_n(LANES)
                for c in range(0, Dh, LANES):
                    acc = vfma_rows(vload(qf, h * Dh + c), kf, group, (h // G) * Dh + c, acc)
                vstore(sf, h * W + k0, vscale(vsum_lanes(acc), scale))
    else:
        for h in range(n):
            for l in range(n_keys):
                base = offs[l] + (h // G) * Dh
                dot = f32(0.0)
                for d in range(Dh):
                    dot += qf[h * Dh + d] * kf[base + d]
                sf[h * W + l] = dot * scale
    for h in range(n):
        lse[h] = _softmax(s[h], n_keys)
    wide = Dh - Dh % (4 * LANES)
    full = Dh - Dh % LANES
    of[:] = 0.0
    for k0 in range(0, n_keys, LANES):  # a group's V rows serve every head while they are in L1
        k1 = min(k0 + LANES, n_keys)
        for h in range(n):
            _prefetch_head(vf, offs, k0 + PREFETCH_KEYS, n_keys, h, G, Dh)
            hd = (h // G) * Dh
            for c in range(0, wide, 4 * LANES):
                o = h * Dh + c
                a0, a1, a2, a3 = vload(of, o), vload(of, o + LANES), vload(of, o + 2 * LANES), vload(of, o + 3 * LANES)
                for l in range(k0, k1):
                    p = sf[h * W + l]
                    base = offs[l] + hd + c
                    a0 = vfma_s(vload(vf, base), p, a0)
                    a1 = vfma_s(vload(vf, base + LANES), p, a1)
                    a2 = vfma_s(vload(vf, base + 2 * LANES), p, a2)
                    a3 = vfma_s(vload(vf, base + 3 * LANES), p, a3)
                vstore(of, o, a0)
                vstore(of, o + LANES, a1)
                vstore(of, o + 2 * LANES, a2)
                vstore(of, o + 3 * LANES, a3)
            for c in range(wide, full, LANES):
                acc = vload(of, h * Dh + c)
                for l in range(k0, k1):
                    acc = vfma_s(vload(vf, offs[l] + hd + c), sf[h * W + l], acc)
                vstore(of, h * Dh + c, acc)
            for d in range(full, Dh):
                t = of[h * Dh + d]
                for l in range(k0, k1):
                    t += sf[h * W + l] * vf[offs[l] + hd + d]
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
        width = (n_keys + LANES - 1) // LANES * LANES
        h0, h1 = kv0 * G, kv1 * G
        s, offs, lse = np.empty((h1 - h0, width), np.float32), np.empty(width, np.int64), np.empty(h1 - h0, np.float32)
        table = block_tables[b]
        _attend_in_place(q[i0, h0:h1], k_cache, v_cache, table, kv0, G, n_keys, scale, s, offs, out[i0, h0:h1], lse)
        return
    # Row stride of K^T and the scores: whole vectors, an odd number of them so that a column's values
    # (one per head dim, or per query) fall in different cache sets (a power-of-two stride keeps them
    # all in one: at 1024 or 2048 keys of context a chunk took 1.2-1.4x as long).
    W = (n_keys + LANES - 1) // LANES
    W = (W + 1 - W % 2) * LANES
    kt = np.empty((Dh, W), dtype=np.float32)
    v = np.empty((n_keys, Dh), dtype=np.float32)
    nq = (i1 - i0) * G  # query vectors of one kv head: the tile's rows times the group's heads
    padded = (nq + QT - 1) // QT * QT
    s = np.empty((nq, W), dtype=np.float32)
    qoffs = np.empty(padded, dtype=np.int64)
    soffs = np.empty(padded, dtype=np.int64)
    vis = np.empty(nq, dtype=np.int64)
    H = q.shape[1]
    for j in range(padded):  # query vector j is head j % G of the group at row i0 + j // G
        jj = min(j, nq - 1)
        soffs[j] = jj * W
        if j < nq:
            vis[j] = start + (i0 + jj // G - r0) + 1
    for kvh in range(kv0, kv1):
        _gather(k_cache, v_cache, block_tables[b], kvh, n_keys, kt, v)
        for j in range(padded):
            jj = min(j, nq - 1)
            qoffs[j] = ((i0 + jj // G) * H + kvh * G + jj % G) * Dh
        _attend_rows(q.reshape(-1), out.reshape(-1), kt, v, qoffs, vis, nq, scale, s, soffs)


@njit(**JIT)
def _spans(context_lens, bs):
    """Decode rows split over their keys: each sequence's keys a work item (a multiple of the block size bs, up to
    SPLITS of them) and each sequence's first item ([B + 1], cumulative)."""
    B = context_lens.shape[0]
    span = np.empty(B, dtype=np.int64)
    first = np.zeros(B + 1, dtype=np.int64)
    for b in range(B):
        c = context_lens[b]
        span[b] = -(-max(SPLIT_KEYS, -(-c // SPLITS)) // bs) * bs
        first[b + 1] = first[b] + -(-c // span[b])
    return span, first


@njit(**JIT)
def _span(q, k_cache, v_cache, context_lens, block_tables, scale, span, first, item, part, lse):
    """Work item `item` of `_spans`: its sequence's one query row against the item's keys, every head (whole K/V
    rows, front to back), normalized over those keys -> part[item] [H, Dh] and their log-sum-exp lse[item] [H]."""
    b = np.searchsorted(first, item, side="right") - 1
    k0 = (item - first[b]) * span[b]
    n_keys = min(span[b], context_lens[b] - k0)
    H = q.shape[1]
    width = (n_keys + LANES - 1) // LANES * LANES
    s, offs = np.empty((H, width), dtype=np.float32), np.empty(width, dtype=np.int64)
    table = block_tables[b, k0 // k_cache.shape[1] :]
    G = H // k_cache.shape[2]
    _attend_in_place(q[b], k_cache, v_cache, table, 0, G, n_keys, scale, s, offs, part[item], lse[item])


@njit(**JIT)
def _combine_spans(first, part, lse, out):
    """out[b] = each head's outputs over its sequence's spans, weighed by exp(lse): the softmax over all the keys."""
    Dh = part.shape[2]
    for b in range(first.shape[0] - 1):
        for h in range(part.shape[1]):
            top = lse[first[b], h]
            for i in range(first[b] + 1, first[b + 1]):
                top = max(top, lse[i, h])
            row = out[b, h]
            row[:] = 0.0
            total = f32(0.0)
            for i in range(first[b], first[b + 1]):
                w = exp32(lse[i, h] - top)
                total += w
                for d in range(Dh):
                    row[d] += w * part[i, h, d]
            inv = f32(1.0) / total
            for d in range(Dh):
                row[d] *= inv


@njit(parallel=True, **JIT)
def paged_attention(q, k_cache, v_cache, query_start, context_lens, block_tables, scale, out):
    """q [T, H, Dh] -> out [T, H, Dh]: causal attention of each sequence's new rows over its paged context.

    Query row i of sequence b (n new rows, context c) sits at position c - n + i and sees keys 0..c-n+i.
    Work items: with decode rows only (one new row a sequence) and fewer than TILES_TOGETHER of them, spans of a
    sequence's keys with all heads (`_spans`), then one pass that combines each sequence's spans; otherwise (row tile,
    kv head), or row tiles with all their kv heads from TILES_TOGETHER tiles on.
    """
    tiles = _tiles(query_start)
    Hkv = k_cache.shape[2]
    B = context_lens.shape[0]
    if q.shape[0] == B and B < TILES_TOGETHER:
        span, first = _spans(context_lens, k_cache.shape[1])
        part = np.empty((first[-1], q.shape[1], q.shape[2]), dtype=np.float32)
        lse = np.empty((first[-1], q.shape[1]), dtype=np.float32)
        for item in prange(first[-1]):
            _span(q, k_cache, v_cache, context_lens, block_tables, scale, span, first, item, part, lse)
        _combine_spans(first, part, lse, out)
        return
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
