"""NumPy backend: the reference ops and the product's CPU path (float32, OpenBLAS matmuls)."""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.attention_meta import AttentionMetadata
from kernels.row_sampling import logprob_rows, sample_rows
from kernels.weight import Weight

# Softmax scratch per prefill tile is bounded to about this many float32 scores.
_TILE_SCORES = 1 << 22
# A decode group pads every sequence to its longest; split groups where padding would exceed 2x.
_DECODE_PAD_RATIO = 2
# Prefill query tile: small enough that causally hidden keys are mostly skipped, big enough for GEMM.
_PREFILL_TILE_ROWS = 128
# Decode scores via one block-diagonal GEMM per sequence up to this many kv heads (see _decode_group).
_BLOCK_DIAG_MAX_KV_HEADS = 4


class NumpyBackend:
    """All ops on host numpy arrays in float32. Heavy work goes through np.matmul (BLAS).

    paged_attention reuses scratch buffers kept on the instance (sized by the largest batch seen),
    so use one instance per thread.
    """

    name = "numpy"
    xp = np
    kv_dtype = np.float32
    choice = ""  # get_backend says what it chose and why
    blas_threads: int | None = None  # None: as many as the engine's threads

    def __init__(self) -> None:
        self._scratch: dict[str, np.ndarray] = {}

    # ---- transfers -------------------------------------------------------
    def asarray(self, a: Any, dtype: Any = None) -> np.ndarray:
        """Host data -> backend array (no copy when already the right type)."""
        return np.asarray(a, dtype=dtype)

    def to_numpy(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    def upload(self, dst: np.ndarray, src: np.ndarray) -> None:
        """Copy host data into a backend array of the same shape and dtype."""
        np.copyto(dst, src)

    def synchronize(self) -> None:
        """Nothing to wait for on the CPU."""

    def empty_kv_cache(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: Any = np.float32) -> np.ndarray:
        """[num_blocks, block_size, Hkv, Dh], zero-filled so unread slots are always finite."""
        if min(num_blocks, block_size, num_kv_heads, head_dim) <= 0:
            raise ValueError(
                f"kv cache dims must be positive: num_blocks={num_blocks} block_size={block_size} "
                f"num_kv_heads={num_kv_heads} head_dim={head_dim}"
            )
        if np.dtype(dtype) != np.float32:
            raise ValueError(f"the numpy backend keeps the KV cache in float32, got dtype {np.dtype(dtype)}")
        return zeroed_huge((num_blocks, block_size, num_kv_heads, head_dim))

    def begin_step(self, rows: int | None = None) -> None:
        """Called at the start of every forward, on the thread that runs it; `rows`: the step's
        activation rows, when the caller will report its time to `end_step`."""

    def end_step(self, seconds: float) -> None:
        """The wall time of the step that `begin_step(rows)` began (backends that tune use it)."""

    # ---- weights --------------------------------------------------------
    def prepare_linear(self, w: Weight) -> np.ndarray:
        """A weight as `linear` takes it: dequantized, float32, input-major [K, N]."""
        return self.asarray(np.ascontiguousarray(w.dequantize().T))

    def prepare_embedding(self, w: Weight) -> np.ndarray:
        """An embedding table as `embedding` takes it: float32 [V, D]."""
        return self.asarray(w.dequantize())

    # ---- elementwise / norms --------------------------------------------
    def embedding(self, table: np.ndarray, ids: Any) -> np.ndarray:
        """table [V, D], ids [T] -> float32 [T, D]."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"embedding ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise ValueError(f"embedding ids out of range [0, {table.shape[0]}): min {ids.min()} max {ids.max()}")
        return np.take(table, ids, axis=0).astype(np.float32, copy=False)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """x [T, D] float32 -> x / sqrt(mean(x^2) + eps) * weight."""
        _check_2d("rms_norm", x, weight)
        ms = np.einsum("ij,ij->i", x, x)
        ms *= 1.0 / x.shape[1]
        ms += eps
        np.sqrt(ms, out=ms)
        out = x / ms[:, None]
        out *= weight
        return out

    def add_rms_norm(self, x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
        """Fused residual add: new_residual = x + residual; returns (rms_norm(new_residual), new_residual)."""
        if x.shape != residual.shape:
            raise ValueError(f"add_rms_norm: x {x.shape} and residual {residual.shape} differ")
        new_residual = x + residual
        return self.rms_norm(new_residual, weight, eps), new_residual

    def linear(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """x [T, K] @ weight [K, N] (+ bias [N]) -> [T, N].

        Weights are stored input-major ([K, N], C-contiguous): OpenBLAS streams them 10-25%
        faster than the [N, K] layout at the row counts of decoding.
        """
        if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[0]:
            raise ValueError(f"linear: x {x.shape} does not match weight {weight.shape} ([K, N], x [T, K])")
        if x.dtype != np.float32 or weight.dtype != np.float32:
            raise ValueError(f"linear: x and weight must be float32, got {x.dtype} and {weight.dtype}")
        out = np.matmul(x, weight)
        if bias is not None:
            if bias.shape != (weight.shape[1],):
                raise ValueError(f"linear: bias {bias.shape} should be ({weight.shape[1]},)")
            out += bias
        return out

    def rope_cos_sin(self, inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin float32 [T, len(inv_freq)] at angles positions[t] * inv_freq[j] (float32, as transformers)."""
        angles = np.asarray(positions).astype(np.float32)[:, None] * inv_freq[None, :]
        return np.cos(angles), np.sin(angles)

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
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

    def rope_write_kv(self, qkv: Any, cos: Any, sin: Any, num_heads: int, num_kv_heads: int,
                      k_cache: Any, v_cache: Any, slot_mapping: Any) -> Any:
        """qkv [T, (H + 2 Hkv) * Dh]: RoPE on q and k, k and v into the cache; returns q [T, H, Dh]."""
        T, Dh = qkv.shape[0], k_cache.shape[3]
        q_end, k_end = num_heads * Dh, (num_heads + num_kv_heads) * Dh
        q = self.rope(qkv[:, :q_end].reshape(T, num_heads, Dh), cos, sin)
        k = self.rope(qkv[:, q_end:k_end].reshape(T, num_kv_heads, Dh), cos, sin)
        self.write_kv(k_cache, v_cache, k, qkv[:, k_end:].reshape(T, num_kv_heads, Dh), slot_mapping)
        return q

    def silu_mul(self, gate_up: np.ndarray) -> np.ndarray:
        """gate_up [T, 2F] = [gate | up] -> silu(gate) * up [T, F]."""
        if gate_up.ndim != 2 or gate_up.shape[1] % 2:
            raise ValueError(f"silu_mul: gate_up must be [T, 2F], got {gate_up.shape}")
        f = gate_up.shape[1] // 2
        gate, up = gate_up[:, :f], gate_up[:, f:]
        # silu(g) = g / (1 + exp(-g)); exp overflows to inf for g < -88, giving the exact limit -0.
        out = np.negative(gate)
        with np.errstate(over="ignore"):
            np.exp(out, out=out)
        out += 1.0
        np.divide(gate, out, out=out)
        out *= up
        return out

    def argmax_rows(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[T, V] -> (int64 [T] first maximum per row, [T] its logit; NaN where the row has one)."""
        ids = np.argmax(logits, axis=-1)
        return ids, logits[np.arange(logits.shape[0]), ids]

    def sample_rows(self, logits: np.ndarray, table: np.ndarray) -> np.ndarray:
        """Each row's token (int64 [R], -1 where a row has no usable token) from logits [R, V] and a sampling
        table (kernels/row_sampling.py: temperature, top-k, top-p, min-p and the row's uniform)."""
        return sample_rows(np.asarray(logits, dtype=np.float32), table)

    def logprob_rows(self, logits: np.ndarray, rows: np.ndarray, tokens: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Log-softmax of logits rows `rows` at `tokens` and at their n best tokens (kernels/row_sampling.py)."""
        return logprob_rows(np.asarray(logits, dtype=np.float32)[rows], tokens, n)

    def apply_token_bitmask(self, logits: np.ndarray, bitmask: np.ndarray) -> None:
        """Set logits [R, V] to -inf where bit (v % 32) of bitmask[r, v // 32] (int32 [R, W]) is 0, in place."""
        apply_token_bitmask(logits, bitmask)

    # ---- KV cache + attention -------------------------------------------
    def write_kv(self, k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray) -> None:
        """Scatter k, v [T, Hkv, Dh] into the caches at flat slots slot_mapping [T]."""
        nb, bs, hkv, dh = k_cache.shape
        if v_cache.shape != k_cache.shape:
            raise ValueError(f"write_kv: k_cache {k_cache.shape} and v_cache {v_cache.shape} differ")
        T = slot_mapping.shape[0]
        if k.shape != (T, hkv, dh) or v.shape != (T, hkv, dh):
            raise ValueError(f"write_kv: k {k.shape} / v {v.shape} should be ({T}, {hkv}, {dh}) for {T} slots")
        if T and (slot_mapping.min() < 0 or slot_mapping.max() >= nb * bs):
            raise ValueError(f"write_kv: slot_mapping out of range [0, {nb * bs}): min {slot_mapping.min()} max {slot_mapping.max()}")
        k_cache.reshape(nb * bs, hkv, dh)[slot_mapping] = k
        v_cache.reshape(nb * bs, hkv, dh)[slot_mapping] = v

    def paged_attention(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, meta: AttentionMetadata, scale: float) -> np.ndarray:
        """Causal attention of each sequence's new queries over its whole paged context.

        q [T, H, Dh]; q head h reads kv head h // (H // Hkv). Query j of seq b's n new tokens sits at
        position context_lens[b] - n + j and sees positions <= that. Returns [T, H, Dh] float32.
        """
        if meta.plan is None:  # validate and plan once per step; every layer reuses it
            meta.plan = self._plan(q.shape, k_cache.shape, meta)
        tables, ctx, qs, decode_groups, prefills = meta.plan
        out = np.empty(q.shape, dtype=np.float32)
        for seqs, nblk in decode_groups:
            self._decode_group(q, k_cache, v_cache, tables, ctx, qs, seqs, nblk, scale, out)
        for b in prefills:
            self._prefill(q, k_cache, v_cache, tables[b], int(ctx[b]), int(qs[b]), int(qs[b + 1]), scale, out)
        return out

    @staticmethod
    def _plan(q_shape: tuple[int, ...], cache_shape: tuple[int, ...], meta: AttentionMetadata) -> tuple:
        T, H, Dh = q_shape
        nb, bs, Hkv, dh = cache_shape
        if dh != Dh or H % Hkv:
            raise ValueError(f"paged_attention: q {q_shape} does not fit cache {cache_shape} (Dh equal, H divisible by Hkv)")
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
            raise ValueError(f"paged_attention: block_tables hold block ids outside [0, {nb}): min {tables.min()} max {tables.max()}")
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

    def _buffer(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        """Reused scratch (avoids page-faulting fresh megabytes every layer)."""
        n = int(np.prod(shape))
        buf = self._scratch.get(key)
        if buf is None or buf.size < n:
            buf = self._scratch[key] = np.empty(max(n, 1), dtype=np.float32)
        return buf[:n].reshape(shape)

    def _decode_group(self, q, k_cache, v_cache, tables, ctx, qs, seqs, nblk, scale, out) -> None:
        B = seqs.size
        _, bs, Hkv, Dh = k_cache.shape
        H = q.shape[1]
        G = H // Hkv
        L = nblk * bs
        bt = tables[seqs, :nblk]
        k = np.take(k_cache, bt, axis=0, out=self._buffer("k", (B, nblk, bs, Hkv, Dh)), mode="clip")
        v = np.take(v_cache, bt, axis=0, out=self._buffer("v", (B, nblk, bs, Hkv, Dh)), mode="clip")
        rows = qs[seqs]
        q4 = q[rows].reshape(B, Hkv, G, Dh)
        q4 *= scale
        p = self._buffer("p", (B, H, L))
        if Hkv <= _BLOCK_DIAG_MAX_KV_HEADS:
            # One GEMM per sequence over all kv heads: [L, Hkv*Dh] @ block-diagonal [Hkv*Dh, H].
            # It does Hkv times the useful flops but beats Hkv thin GEMMs per sequence on small Hkv.
            qbd = self._buffer("qbd", (B, Hkv, Dh, Hkv, G))
            qbd.fill(0.0)
            for i in range(Hkv):
                qbd[:, i, :, i, :] = q4[:, i].transpose(0, 2, 1)
            s = np.matmul(k.reshape(B, L, Hkv * Dh), qbd.reshape(B, Hkv * Dh, H))  # [B, L, H]
            np.copyto(p, s.transpose(0, 2, 1))
        else:
            np.matmul(q4, k.reshape(B, L, Hkv, Dh).transpose(0, 2, 3, 1), out=p.reshape(B, Hkv, G, L))
        if ctx[seqs].min() < L:
            pad = np.arange(L)[None, :] >= ctx[seqs][:, None]
            np.copyto(p, -np.inf, where=pad[:, None, :])
        _softmax_unnormalized(p)
        denom = p.sum(axis=-1, keepdims=True)  # [B, H, 1]
        if Hkv <= _BLOCK_DIAG_MAX_KV_HEADS:
            o = np.matmul(p, v.reshape(B, L, Hkv * Dh)).reshape(B, Hkv, G, Hkv, Dh)  # [B, H, Hkv*Dh], keep diagonal
            o4 = np.empty((B, Hkv, G, Dh), dtype=np.float32)
            for i in range(Hkv):
                o4[:, i] = o[:, i, :, i, :]
        else:
            o4 = np.matmul(p.reshape(B, Hkv, G, L), v.reshape(B, L, Hkv, Dh).transpose(0, 2, 1, 3))
        o3 = o4.reshape(B, H, Dh)
        o3 /= denom
        out[rows] = o3

    def _prefill(self, q, k_cache, v_cache, table, c, r0, r1, scale, out) -> None:
        """One sequence with n > 1 new tokens over its c-token context, query rows tiled causally."""
        ops = self._prefill_operands(q, k_cache, v_cache, table, c, r0, r1, scale)
        tile = max(16, min(_PREFILL_TILE_ROWS, _TILE_SCORES // (q.shape[1] * c)))
        for i0 in range(0, r1 - r0, tile):
            i1 = min(r1 - r0, i0 + tile)
            prefill_tile(ops, i0, i1, out, self._buffer("s", ops.scores_shape(i0, i1)))

    def _prefill_operands(self, q, k_cache, v_cache, table, c, r0, r1, scale) -> PrefillOperands:
        """A prefill's query rows per kv head and its context's K^T and V, contiguous per kv head (BLAS is
        ~3x slower on the strided per-head views), in this instance's scratch."""
        n = r1 - r0
        _, bs, Hkv, Dh = k_cache.shape
        G = q.shape[1] // Hkv
        nblk = -(-c // bs)
        bt = table[:nblk]
        k = np.take(k_cache, bt, axis=0, out=self._buffer("k", (nblk, bs, Hkv, Dh)), mode="clip").reshape(nblk * bs, Hkv, Dh)
        v = np.take(v_cache, bt, axis=0, out=self._buffer("v", (nblk, bs, Hkv, Dh)), mode="clip").reshape(nblk * bs, Hkv, Dh)
        kt = self._buffer("kt", (Hkv, Dh, c))
        np.copyto(kt, k[:c].transpose(1, 2, 0))
        vh = self._buffer("vh", (Hkv, c, Dh))
        np.copyto(vh, v[:c].transpose(1, 0, 2))
        # [n, H, Dh] -> [Hkv, n*G, Dh] so each kv head is one GEMM over all its query rows.
        qh = q[r0:r1].reshape(n, Hkv, G, Dh).transpose(1, 0, 2, 3).reshape(Hkv, n * G, Dh) * scale
        return PrefillOperands(qh, kt, vh, G, c - n, r0)


def zeroed_huge(shape: tuple[int, ...]) -> np.ndarray:
    """A zero float32 array in anonymous memory that the OS backs with transparent huge pages where it
    can (`MADV_HUGEPAGE`; only 2 MiB stretches that get written take memory, as with `np.zeros`). A KV
    cache grows into fresh memory a few slots at a time: in 4 KiB pages every few tokens of every
    sequence took a page fault (32 sequences decoding: ~4 of a ~75 ms step went to faults)."""
    size = int(np.prod(shape)) * 4
    buf = mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buf, dtype=np.float32).reshape(shape)


@dataclass(slots=True)
class PrefillOperands:
    """A prefill's attention operands (`NumpyBackend._prefill_operands`): qh [Hkv, n * G, Dh] (scaled),
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
    _softmax_unnormalized(s)
    denom = s.sum(axis=-1, keepdims=True)
    o = np.matmul(s, ops.vh[:, :kend])  # [Hkv, rows*G, Dh]
    o /= denom
    out[ops.r0 + i0 : ops.r0 + i1] = o.reshape(Hkv, i1 - i0, G, Dh).transpose(1, 0, 2, 3).reshape(i1 - i0, Hkv * G, Dh)

def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> None:
    """Host logits [R, V] get -inf where their token's bit in bitmask (int32 [R, W]) is 0, in place.

    Columns past 32 * W are disallowed too; bits past V are ignored."""
    R, V = logits.shape
    if bitmask.dtype != np.int32 or bitmask.ndim != 2 or bitmask.shape[0] != R:
        raise ValueError(f"apply_token_bitmask: bitmask must be int32 [{R}, W], got {bitmask.dtype} {bitmask.shape}")
    n = min(V, 32 * bitmask.shape[1])
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, count=n, bitorder="little")
    np.putmask(logits[:, :n], bits == 0, -np.inf)
    logits[:, n:] = -np.inf


def _softmax_unnormalized(s: np.ndarray) -> None:
    """In place: s <- exp(s - max(s)) along the last axis (rows always hold a finite entry)."""
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)


def _check_2d(op: str, x: np.ndarray, weight: np.ndarray) -> None:
    d = weight.shape[0]
    if weight.ndim != 1 or weight.dtype != np.float32:
        raise ValueError(f"{op}: weight must be a 1-D float32 vector, got shape {weight.shape} dtype {weight.dtype}")
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"{op}: x must be [T, {d}] to match the weight, got {x.shape}")
    if x.dtype != np.float32:
        raise ValueError(f"{op}: x must be float32, got {x.dtype}")
