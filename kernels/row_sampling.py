"""One token from a row of logits at a given uniform: the host sampler's row semantics, shared by the engine's
sampler (engine/sampling.py) and the NumPy backend's `sample_rows` (the CuPy backend runs kernels/cuda/sample.cu).

A sampling table row holds, as float64: temperature (0: greedy), top_k (0: off), top_p, min_p, and the uniform u in
[0, 1) that the caller drew for the row from its sequence's generator (any value when greedy).
"""

from __future__ import annotations

import numpy as np

TABLE = ("temperature", "top_k", "top_p", "min_p", "u")  # the columns of a sampling table
_PICK_BLOCK = 1024  # inverse-CDF search: block sums first, then a cumsum inside one block
_NUCLEUS_CANDIDATES = 1024  # top-p: first try sorting only this many candidates
_SELECT_GROUP = 64  # k-th largest value: only the groups holding the top k are partitioned


def sample_rows(logits: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Each row's token (int64 [R]) from logits float32 [R, V] and a sampling table float64 [R, len(TABLE)];
    -1 for a row with no usable token: a NaN, every logit at -inf, or (when sampling) a logit of +inf."""
    out = np.full(logits.shape[0], -1, dtype=np.int64)
    for r, (temperature, top_k, top_p, min_p, u) in enumerate(table.tolist()):
        x = logits[r]
        top = x.max()  # NaN if any x is
        if np.isnan(top) or top == -np.inf or (top == np.inf and temperature != 0.0):
            continue
        if temperature == 0.0:
            out[r] = int(x.argmax())
            continue
        z = x - top
        if temperature != 1.0:
            with np.errstate(over="ignore"):
                z /= np.maximum(np.float32(temperature), np.finfo(np.float32).tiny)
        out[r] = draw(z, int(top_k), top_p, min_p, u)
    return out


def logprob_rows(logits: np.ndarray, tokens: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The log-softmax of each row of logits (float32 [W, V]) at its token (float64 [W]) and at its min(n, V)
    best tokens: ids (int64 [W, n], best first, ties by lower id) and their values (float64 [W, n])."""
    raw = np.array(logits, dtype=np.float32)  # a copy, turned into exp(raw - max) in place below
    W = raw.shape[0]
    chosen = raw[np.arange(W), tokens].astype(np.float64)
    best = [_best(row, n) for row in raw]
    ids = np.array([b[0] for b in best], dtype=np.int64).reshape(W, -1)
    values = np.array([b[1] for b in best], dtype=np.float64).reshape(W, -1)
    top = raw.max(axis=1)
    raw -= top[:, None]
    np.exp(raw, out=raw)
    lse = top.astype(np.float64) + np.log(raw.sum(axis=1).astype(np.float64))
    return chosen - lse, ids, values - lse[:, None]


def draw(z: np.ndarray, top_k: int, top_p: float, min_p: float, u: float) -> int:
    """One token from scaled logits z (float32, max exactly 0) after top-k, top-p and min-p, by inverse CDF at u in
    [0, 1).

    `ids` maps positions in `w` (unnormalized probabilities, max 1) back to token ids;
    None means w covers the whole vocabulary.
    """
    V = z.shape[0]
    ids: np.ndarray | None = None
    if 0 < top_k < V:
        # Ties with the k-th value are kept (HF/vLLM semantics), so the set is well defined.
        ids = np.flatnonzero(z >= kth_largest(z, top_k))
        w = np.exp(z[ids])
    else:
        w = np.exp(z)
    if top_p < 1.0:
        keep = _nucleus(w, top_p)
        ids = keep if ids is None else ids[keep]
        w = w[keep]
    if min_p > 0.0:
        keep = np.flatnonzero(w >= np.float32(min_p))  # w is prob / max prob; the top token has w == 1
        ids = keep if ids is None else ids[keep]
        w = w[keep]
    j = _pick(w, u)
    return j if ids is None else int(ids[j])


def _nucleus(w: np.ndarray, top_p: float) -> np.ndarray:
    """Positions (ascending) of the smallest set of largest w holding >= top_p of the mass.

    Only the cut-off value is needed, so this sorts values (not indices) of a candidate set:
    every w below (1 - top_p) * total / n together holds less than (1 - top_p) of the mass,
    so the nucleus lies among the rest. Ties at the cut-off go to the lower positions.
    """
    n = w.shape[0]
    total = float(w.sum())  # float32 pairwise summation: ~1e-7 relative, and twice as fast
    target = top_p * total
    cand = np.flatnonzero(w >= np.float32((1.0 - top_p) * total / n))
    wc = w[cand]
    if cand.shape[0] > _NUCLEUS_CANDIDATES:  # often the nucleus is far smaller: try the top ones
        kth = np.partition(wc, wc.shape[0] - _NUCLEUS_CANDIDATES)[wc.shape[0] - _NUCLEUS_CANDIDATES]
        top = wc >= kth
        if wc[top].sum(dtype=np.float64) >= target:
            cand, wc = cand[top], wc[top]
    desc = np.sort(wc)[::-1]
    cs = np.cumsum(desc, dtype=np.float64)
    count = min(int(np.searchsorted(cs, target, side="left")) + 1, desc.shape[0])
    cut = desc[count - 1]
    at_cut = wc == cut
    keep = (wc > cut) | (at_cut & (np.cumsum(at_cut) <= count - int(np.count_nonzero(wc > cut))))
    return cand[keep]


def kth_largest(x: np.ndarray, k: int) -> np.float32:
    """The k-th largest value of x (1 <= k <= len(x)) without partitioning all of x.

    x is split into column groups (x[j], x[j + m], x[j + 2m], ...). The k largest group
    maxima are k elements of x, so the k-th largest value v is at least the k-th largest
    group maximum b, and every element >= v lies in a group whose maximum is >= b.
    """
    n = x.shape[0]
    m = n // _SELECT_GROUP  # number of groups; reducing over axis 0 keeps the max vectorized
    if m < 4 * k:
        return np.partition(x, n - k)[n - k]
    cols = x[: m * _SELECT_GROUP].reshape(_SELECT_GROUP, m)
    gmax = cols.max(axis=0)
    cand = cols[:, gmax >= np.partition(gmax, m - k)[m - k]].ravel()
    if n > m * _SELECT_GROUP:
        cand = np.concatenate([cand, x[m * _SELECT_GROUP :]])
    return np.partition(cand, cand.shape[0] - k)[cand.shape[0] - k]


def _pick(w: np.ndarray, u: float) -> int:
    """Position j with probability w[j] / sum(w), by inverse CDF at u in [0, 1)."""
    n = w.shape[0]
    if n <= _PICK_BLOCK:
        cs = np.cumsum(w, dtype=np.float64)
        return _search(cs, u * cs[-1])
    # Two levels, so no cumsum over the whole vocabulary: find the block, then the token.
    nb = n // _PICK_BLOCK
    sums = w[: nb * _PICK_BLOCK].reshape(nb, _PICK_BLOCK).sum(axis=1)
    if n > nb * _PICK_BLOCK:
        sums = np.append(sums, w[nb * _PICK_BLOCK :].sum())
    cs = np.cumsum(sums, dtype=np.float64)
    target = u * cs[-1]
    b = _search(cs, target)
    start = b * _PICK_BLOCK
    inner = np.cumsum(w[start : start + _PICK_BLOCK], dtype=np.float64)
    return start + _search(inner, max(target - (cs[b - 1] if b else 0.0), 0.0))


def _search(cs: np.ndarray, target: float) -> int:
    """Index j with cs[j-1] <= target < cs[j] in a cumulative sum; never a zero-mass j."""
    j = int(np.searchsorted(cs, target, side="right"))
    if j >= cs.shape[0]:  # target reached the total through rounding: last position with mass
        j = int(np.searchsorted(cs, cs[-1], side="left"))
    return j


def _best(raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids and values of the k largest raw logits, best first, ties by lower id."""
    k = min(k, raw.shape[0])
    if k == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=raw.dtype)
    cand = np.flatnonzero(raw >= kth_largest(raw, k))
    cand = cand[np.lexsort((cand, -raw[cand]))[:k]]
    return cand, raw[cand]
