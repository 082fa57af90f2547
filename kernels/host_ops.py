"""Host-array ops that both CPU backends (kernels/numpy_backend.py, kernels/numba_backend.py) offer
unchanged: transfers, the KV cache, RoPE, picks over logits rows, the attention plan and the BLAS
tiles of a long prefill's attention.

Plain functions, which a backend class names as its methods (`rope = staticmethod(host_ops.rope)`),
and `Scratch`, the reused buffers the attention helpers fill: the backends compose these rather
than inherit one another's ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernels.attention_meta import AttentionMetadata
from kernels.huge_pages import zeroed_huge
from kernels.row_sampling import logprob_rows as _logprob_rows
from kernels.row_sampling import sample_rows as _sample_rows


# ---- transfers ---------------------------------------------------------------
def asarray(a: Any, dtype: Any = None) -> np.ndarray:
    """Host data -> backend array (no copy when already the right type)."""
    return np.asarray(a, dtype=dtype)


def to_numpy(a: Any) -> np.ndarray:
    return np.asarray(a)


def upload(dst: np.ndarray, src: np.ndarray) -> None:
    """Copy host data into a backend array of the same shape and dtype."""
    np.copyto(dst, src)


def synchronize() -> None:
    """Nothing to wait for on the CPU."""


# ---- KV cache ----------------------------------------------------------------
def empty_kv_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: Any = np.float32
) -> np.ndarray:
    """[num_blocks, block_size, Hkv, Dh], zero-filled so unread slots are always finite."""
    if min(num_blocks, block_size, num_kv_heads, head_dim) <= 0:
        raise ValueError(
            f"kv cache dims must be positive: num_blocks={num_blocks} block_size={block_size} "
            f"num_kv_heads={num_kv_heads} head_dim={head_dim}"
        )
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"the CPU backends keep the KV cache in float32, got dtype {np.dtype(dtype)}")
    return zeroed_huge((num_blocks, block_size, num_kv_heads, head_dim))


def write_kv(k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Scatter k, v [T, Hkv, Dh] into the caches at flat slots slot_mapping [T]."""
    nb, bs, hkv, dh = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"write_kv: k_cache {k_cache.shape} and v_cache {v_cache.shape} differ")
    T = slot_mapping.shape[0]
    if k.shape != (T, hkv, dh) or v.shape != (T, hkv, dh):
        raise ValueError(f"write_kv: k {k.shape} / v {v.shape} should be ({T}, {hkv}, {dh}) for {T} slots")
    if T and (slot_mapping.min() < 0 or slot_mapping.max() >= nb * bs):
        raise ValueError(
            f"write_kv: slot_mapping out of range [0, {nb * bs}): min {slot_mapping.min()} max {slot_mapping.max()}"
        )
    k_cache.reshape(nb * bs, hkv, dh)[slot_mapping] = k
    v_cache.reshape(nb * bs, hkv, dh)[slot_mapping] = v


# ---- RoPE ----------------------------------------------------------------------
def rope_cos_sin(inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 [T, len(inv_freq)] at angles positions[t] * inv_freq[j] (float32, as transformers)."""
    angles = np.asarray(positions).astype(np.float32)[:, None] * inv_freq[None, :]
    return np.cos(angles), np.sin(angles)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half (NeoX/HF) RoPE on x [T, H, Dh] with cos/sin [T, Dh//2]; in place, returns x."""
    if x.ndim != 3 or x.shape[2] % 2:
        raise ValueError(f"rope: x must be [T, H, Dh] with even Dh, got {x.shape}")
    half = x.shape[2] // 2
    if cos.shape != (x.shape[0], half) or sin.shape != cos.shape:
        raise ValueError(f"rope: cos {cos.shape} / sin {sin.shape} should be ({x.shape[0]}, {half})")
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    x1s = x1 * s
    t = x1 * c
    t -= x2 * s
    x2 *= c
    x2 += x1s
    x1[...] = t
    return x


# ---- logits rows -----------------------------------------------------------------
def argmax_rows(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[T, V] -> (int64 [T] first maximum per row, [T] its logit; NaN where the row has one)."""
    ids = np.argmax(logits, axis=-1)
    return ids, logits[np.arange(logits.shape[0]), ids]


def sample_rows(logits: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Each row's token (int64 [R], -1 where a row has no usable token) from logits [R, V] and a sampling
    table (kernels/row_sampling.py: temperature, top-k, top-p, min-p and the row's uniform)."""
    return _sample_rows(np.asarray(logits, dtype=np.float32), table)


def logprob_rows(
    logits: np.ndarray, rows: np.ndarray, tokens: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Log-softmax of logits rows `rows` at `tokens` and at their n best tokens (kernels/row_sampling.py)."""
    return _logprob_rows(np.asarray(logits, dtype=np.float32)[rows], tokens, n)


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> None:
    """Set logits [R, V] to -inf where bit (v % 32) of bitmask[r, v // 32] (int32 [R, W]) is 0, in place.

    Columns past 32 * W are disallowed too; bits past V are ignored."""
    R, V = logits.shape
    if bitmask.dtype != np.int32 or bitmask.ndim != 2 or bitmask.shape[0] != R:
        raise ValueError(f"apply_token_bitmask: bitmask must be int32 [{R}, W], got {bitmask.dtype} {bitmask.shape}")
    n = min(V, 32 * bitmask.shape[1])
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, count=n, bitorder="little")
    np.putmask(logits[:, :n], bits == 0, -np.inf)
    logits[:, n:] = -np.inf


# ---- attention ---------------------------------------------------------------------
@dataclass(slots=True)
class Scratch:
    """Reused float32 buffers by name (avoids page-faulting fresh megabytes every layer): one per
    thread that computes attention."""

    buffers: dict[str, np.ndarray] = field(default_factory=dict)

    def get(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 array of `shape` over the buffer named `key`, grown when too small."""
        n = int(np.prod(shape))
        buf = self.buffers.get(key)
        if buf is None or buf.size < n:
            buf = self.buffers[key] = np.empty(max(n, 1), dtype=np.float32)
        return buf[:n].reshape(shape)


# A decode group pads every sequence to its longest; split groups where padding would exceed 2x.
_DECODE_PAD_RATIO = 2


def attention_inputs(
    q_shape: tuple[int, ...], cache_shape: tuple[int, ...], meta: AttentionMetadata
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A step's attention metadata on the host, validated: (block tables, context lengths, query starts, query
    lengths); raises ValueError on metadata that does not fit."""
    T, H, Dh = q_shape
    nb, bs, Hkv, dh = cache_shape
    if dh != Dh or H % Hkv:
        raise ValueError(
            f"paged_attention: q {q_shape} does not fit cache {cache_shape} (Dh equal, H divisible by Hkv)"
        )
    qs, ctx = meta.host_query_start(), meta.host_context_lens()
    B = ctx.shape[0]
    if qs.shape != (B + 1,) or qs[-1] != T:
        raise ValueError(f"paged_attention: query_start {qs.tolist()} does not cover {T} query rows")
    q_lens = np.diff(qs)
    if np.any(q_lens < 1) or np.any(ctx < q_lens):
        raise ValueError(f"paged_attention: bad lengths, query_lens {q_lens.tolist()} context_lens {ctx.tolist()}")
    tables = np.asarray(meta.block_tables)
    if tables.shape[0] != B or tables.shape[1] * bs < ctx.max(initial=0):
        raise ValueError(f"paged_attention: block_tables {tables.shape} too small for context_lens up to {ctx.max()}")
    if tables.size and (tables.min() < 0 or tables.max() >= nb):
        raise ValueError(
            f"paged_attention: block_tables hold block ids outside [0, {nb}): min {tables.min()} max {tables.max()}"
        )
    return tables, ctx, qs, q_lens


def attention_plan(q_shape: tuple[int, ...], cache_shape: tuple[int, ...], meta: AttentionMetadata) -> tuple:
    """`attention_inputs` and how the reference runs them: (block tables, context lengths, query starts, decode
    groups [(sequences, blocks)], prefill sequences)."""
    tables, ctx, qs, q_lens = attention_inputs(q_shape, cache_shape, meta)
    bs = cache_shape[1]
    # Decodes: batched, padded to the longest in each group; a group is split where padding would exceed 2x.
    dec = np.flatnonzero(q_lens == 1)
    order = dec[np.argsort(-ctx[dec], kind="stable")]
    nblk = -(-ctx[order] // bs)
    groups, i = [], 0
    while i < order.size:
        j = i + 1
        while j < order.size and nblk[j] * _DECODE_PAD_RATIO >= nblk[i]:
            j += 1
        groups.append((order[i:j], int(nblk[i])))
        i = j
    return tables, ctx, qs, groups, np.flatnonzero(q_lens > 1)


@dataclass(slots=True)
class PrefillOperands:
    """A prefill's attention operands (`prefill_operands`): qh [Hkv, n * G, Dh] (scaled),
    kt [Hkv, Dh, c], vh [Hkv, c, Dh]; query row 0 sits at position `start` and is row `r0` of the step."""

    qh: np.ndarray
    kt: np.ndarray
    vh: np.ndarray
    G: int
    start: int
    r0: int

    def scores_shape(self, i0: int, i1: int) -> tuple[int, int, int]:
        """The scores of query rows i0 .. i1 - 1 over the keys the last of them sees."""
        return self.qh.shape[0], (i1 - i0) * self.G, self.start + i1


def prefill_operands(
    scratch: Scratch,
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    table: np.ndarray,
    c: int,
    r0: int,
    r1: int,
    scale: float,
) -> PrefillOperands:
    """A prefill's query rows per kv head and its context's K^T and V, contiguous per kv head (BLAS is
    ~3x slower on the strided per-head views), in `scratch`."""
    n = r1 - r0
    _, bs, Hkv, Dh = k_cache.shape
    G = q.shape[1] // Hkv
    nblk = -(-c // bs)
    bt = table[:nblk]
    k = np.take(k_cache, bt, axis=0, out=scratch.get("k", (nblk, bs, Hkv, Dh)), mode="clip").reshape(nblk * bs, Hkv, Dh)
    v = np.take(v_cache, bt, axis=0, out=scratch.get("v", (nblk, bs, Hkv, Dh)), mode="clip").reshape(nblk * bs, Hkv, Dh)
    kt = scratch.get("kt", (Hkv, Dh, c))
    np.copyto(kt, k[:c].transpose(1, 2, 0))
    vh = scratch.get("vh", (Hkv, c, Dh))
    np.copyto(vh, v[:c].transpose(1, 0, 2))
    # [n, H, Dh] -> [Hkv, n*G, Dh] so each kv head is one GEMM over all its query rows.
    qh = q[r0:r1].reshape(n, Hkv, G, Dh).transpose(1, 0, 2, 3).reshape(Hkv, n * G, Dh) * scale
    return PrefillOperands(qh, kt, vh, G, c - n, r0)


def prefill_tile(ops: PrefillOperands, i0: int, i1: int, out: np.ndarray, s: np.ndarray) -> None:
    """out[ops.r0 + i0 : ops.r0 + i1] = causal attention of the prefill's query rows i0 .. i1 - 1 (s: their
    scores' scratch, `ops.scores_shape(i0, i1)`). Tiles write disjoint rows: they may run side by side."""
    Hkv, _, Dh = ops.qh.shape
    G, start = ops.G, ops.start
    kend = start + i1  # keys this tile can see: [0, kend)
    s = np.matmul(ops.qh[:, i0 * G : i1 * G], ops.kt[:, :, :kend], out=s)
    lo = start + i0 + 1  # columns before lo are visible to every row of the tile
    if lo < kend:
        future = np.arange(lo, kend)[None, :] > (start + np.arange(i0, i1))[:, None]  # [rows, kend-lo]
        s4 = s.reshape(Hkv, i1 - i0, G, kend)[..., lo:]
        np.copyto(s4, -np.inf, where=future[None, :, None, :])
    softmax_unnormalized(s)
    denom = s.sum(axis=-1, keepdims=True)
    o = np.matmul(s, ops.vh[:, :kend])  # [Hkv, rows*G, Dh]
    o /= denom
    out[ops.r0 + i0 : ops.r0 + i1] = o.reshape(Hkv, i1 - i0, G, Dh).transpose(1, 0, 2, 3).reshape(i1 - i0, Hkv * G, Dh)


def softmax_unnormalized(s: np.ndarray) -> None:
    """In place: s <- exp(s - max(s)) along the last axis (rows always hold a finite entry)."""
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)


class CpuHostOps:
    """The host ops every CPU backend shares, as methods (the backends compose this, not each other)."""

    asarray = staticmethod(asarray)
    to_numpy = staticmethod(to_numpy)
    upload = staticmethod(upload)
    synchronize = staticmethod(synchronize)
    empty_kv_cache = staticmethod(empty_kv_cache)
    write_kv = staticmethod(write_kv)
    rope_cos_sin = staticmethod(rope_cos_sin)
    rope = staticmethod(rope)
    argmax_rows = staticmethod(argmax_rows)
    sample_rows = staticmethod(sample_rows)
    logprob_rows = staticmethod(logprob_rows)
    apply_token_bitmask = staticmethod(apply_token_bitmask)
