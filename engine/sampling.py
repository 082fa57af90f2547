"""Batched sampling: one token per row of a [B, V] logits matrix, each row with its own params.

Per row, in this order: logit_bias -> repetition penalty (HF: over prompt + output) ->
presence/frequency penalties (OpenAI: over output) -> greedy argmax when temperature == 0,
otherwise /temperature -> top-k -> top-p -> min-p -> one draw from the row's rng.
Logprobs are the log-softmax of the raw logits (before any of the above), as in vLLM.

A row's result depends only on its own logits, params and rng, never on the rest of the
batch; greedy rows never touch their rng and every sampled row draws exactly one uniform.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.types import InvalidRequest, SamplingParams, TokenLogprob

_PICK_BLOCK = 1024  # inverse-CDF search: block sums first, then a cumsum inside one block
_NUCLEUS_CANDIDATES = 1024  # top-p: first try sorting only this many candidates
_SELECT_GROUP = 64  # k-th largest value: only the groups holding the top k are partitioned


@dataclass(slots=True)
class SamplerRow:
    """One sequence to sample this step."""

    params: SamplingParams
    rng: np.random.Generator | None  # from make_rng(); may be None for greedy rows, which never draw
    prompt_ids: np.ndarray  # for the repetition penalty (prompt + output)
    output_ids: list[int]  # generated so far, for all three penalties


@dataclass(slots=True)
class SampleOutput:
    token_ids: np.ndarray  # [B] int64
    logprobs: list[TokenLogprob | None]  # per row; None where params.logprobs is None


def make_rng(seed: int | None, index: int = 0) -> np.random.Generator:
    """The generator for sample `index` of a request: fresh entropy when seed is None.

    Seeded generators come from SeedSequence(seed, spawn_key=(index,)): the samples of one
    request are independent streams and no two (seed, index) pairs share one. Negative
    seeds are taken modulo 2**64.
    """
    if not (_is_int(index) and index >= 0):
        raise ValueError(f"sample index must be an int >= 0, got {index!r}")
    if seed is None:
        return np.random.default_rng()
    if not _is_int(seed):
        raise InvalidRequest(f"seed must be an integer, got {seed!r}", param="seed")
    seq = np.random.SeedSequence(int(seed) % 2**64, spawn_key=(int(index),))
    return np.random.Generator(np.random.PCG64(seq))


def sample(logits: np.ndarray, rows: Sequence[SamplerRow]) -> SampleOutput:
    """Pick one token per row of `logits` (float32 [B, V]) following that row's params.

    `logits` is not modified. Raises InvalidRequest for a bad sampling parameter and
    ValueError for bad logits (wrong shape, NaN, nothing allowed) or out-of-range token ids;
    every check runs before the first draw, so a failed call has advanced no row's rng and
    the batch can be retried row by row with the same result for the good rows.
    """
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.dtype.kind != "f" or logits.shape[1] == 0:
        raise ValueError(f"logits must be a 2-D float array [batch, vocab], got {logits.dtype} {logits.shape}")
    if logits.shape[0] != len(rows):
        raise ValueError(f"logits has {logits.shape[0]} rows but {len(rows)} sampler rows were given")
    if logits.dtype != np.float32:
        logits = logits.astype(np.float32)
    B, V = logits.shape
    token_ids = np.empty(B, dtype=np.int64)

    plain_greedy: list[int] = []  # argmax of the raw row, vectorized over the batch
    adjusted_greedy: list[int] = []  # argmax after bias/penalties
    sampled: list[int] = []
    for i, row in enumerate(rows):
        p = row.params
        _check_params(p, V, i)
        if p.temperature > 0.0:
            if not isinstance(row.rng, np.random.Generator):
                raise ValueError(f"row {i}: temperature > 0 needs a numpy Generator as rng, got {type(row.rng).__name__}")
            sampled.append(i)
        elif _adjusts(p):
            adjusted_greedy.append(i)
        else:
            plain_greedy.append(i)

    if plain_greedy:
        if len(plain_greedy) == B:
            token_ids[:] = logits.argmax(axis=1)
        else:
            token_ids[plain_greedy] = logits[plain_greedy].argmax(axis=1)
        chosen = logits[plain_greedy, token_ids[plain_greedy]]
        bad = np.isnan(chosen) | (chosen == -np.inf)
        if bad.any():
            _raise_bad_row(plain_greedy[int(np.argmax(bad))], float(chosen[bad][0]))

    for i in adjusted_greedy:
        x = logits[i].copy()
        _apply_adjustments(x, rows[i], i)
        tok = int(x.argmax())
        if math.isnan(x[tok]) or x[tok] == -np.inf:
            _raise_bad_row(i, float(x[tok]))
        token_ids[i] = tok

    if sampled:
        x = logits[sampled]  # fancy indexing copies: adjustments never touch the caller's array
        for j, i in enumerate(sampled):
            if _adjusts(rows[i].params):
                _apply_adjustments(x[j], rows[i], i)
        top = x.max(axis=1)
        for j in np.flatnonzero(~np.isfinite(top)):
            _raise_bad_row(sampled[j], float(top[j]))
        # Subtract the max before dividing so a tiny temperature gives -inf, never inf - inf.
        x -= top[:, None]
        temps = np.array([rows[i].params.temperature for i in sampled], dtype=np.float32)
        if (temps != 1.0).any():
            with np.errstate(over="ignore"):
                x /= np.maximum(temps, np.finfo(np.float32).tiny)[:, None]
        for j, i in enumerate(sampled):
            token_ids[i] = _draw(x[j], rows[i].params, rows[i].rng)

    logprobs: list[TokenLogprob | None] = [None] * B
    want = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    if want:
        raw = logits[want]  # a copy, turned into exp(raw - max) in place below
        chosen = raw[np.arange(len(want)), token_ids[want]].astype(np.float64)
        best = [_best(raw[j], rows[i].params.logprobs) for j, i in enumerate(want)]
        top = raw.max(axis=1)
        raw -= top[:, None]
        np.exp(raw, out=raw)
        lse = top.astype(np.float64) + np.log(raw.sum(axis=1).astype(np.float64))
        for j, i in enumerate(want):
            ids, vals = best[j]
            logprobs[i] = TokenLogprob(
                token_id=int(token_ids[i]),
                logprob=float(chosen[j] - lse[j]),
                top=[(int(t), float(v - lse[j])) for t, v in zip(ids, vals.astype(np.float64))],
            )
    return SampleOutput(token_ids=token_ids, logprobs=logprobs)


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


# The checks the sampling math relies on (SamplingParams.validate is the full set).
_CHECKS: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("temperature", "must be a finite number >= 0", lambda v: _is_real(v) and v >= 0),
    ("top_k", "must be an int >= 0", lambda v: _is_int(v) and v >= 0),
    ("top_p", "must be a number in (0, 1]", lambda v: _is_real(v) and 0 < v <= 1),
    ("min_p", "must be a number in [0, 1]", lambda v: _is_real(v) and 0 <= v <= 1),
    ("repetition_penalty", "must be a finite number > 0", lambda v: _is_real(v) and v > 0),
    ("presence_penalty", "must be a finite number", _is_real),
    ("frequency_penalty", "must be a finite number", _is_real),
    ("logprobs", "must be None or an int >= 0", lambda v: v is None or (_is_int(v) and v >= 0)),
)


def _check_params(p: SamplingParams, V: int, i: int) -> None:
    for name, why, ok in _CHECKS:
        if not ok(getattr(p, name)):
            raise InvalidRequest(f"row {i}: {name} {why}, got {getattr(p, name)!r}", param=name)
    if not isinstance(p.logit_bias, dict):
        raise InvalidRequest(f"row {i}: logit_bias must be a dict of token id -> bias", param="logit_bias")
    for tok, bias in p.logit_bias.items():
        if not (_is_int(tok) and 0 <= tok < V):
            raise InvalidRequest(f"row {i}: logit_bias token id {tok!r} is not an int in [0, {V})", param="logit_bias")
        if not _is_real(bias):
            raise InvalidRequest(f"row {i}: logit_bias value for token {tok} must be a finite number, got {bias!r}", param="logit_bias")


def _adjusts(p: SamplingParams) -> bool:
    return bool(p.logit_bias) or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _apply_adjustments(x: np.ndarray, row: SamplerRow, i: int) -> None:
    """logit_bias, then the repetition penalty, then presence/frequency penalties, in place."""
    p = row.params
    V = x.shape[0]
    if p.logit_bias:
        ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
        x[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float32, count=len(p.logit_bias))
    out = _token_ids(row.output_ids, V, i, "output_ids")
    if p.repetition_penalty != 1.0:
        # Repeated ids are harmless: every copy writes the same value computed from the original.
        ids = np.concatenate([_token_ids(row.prompt_ids, V, i, "prompt_ids"), out])
        v = x[ids]
        x[ids] = np.where(v > 0, v / np.float32(p.repetition_penalty), v * np.float32(p.repetition_penalty))
    if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and out.size:
        ids, counts = np.unique(out, return_counts=True)
        x[ids] -= (p.presence_penalty + p.frequency_penalty * counts).astype(np.float32)


def _token_ids(ids: Sequence[int] | np.ndarray, V: int, i: int, what: str) -> np.ndarray:
    a = np.asarray(ids)
    if a.size == 0:
        return np.empty(0, dtype=np.int64)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise ValueError(f"row {i}: {what} must be a 1-D sequence of ints, got {a.dtype} {a.shape}")
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= V:
        raise ValueError(f"row {i}: {what} holds token id {lo if lo < 0 else hi}, outside [0, {V})")
    return a.astype(np.int64, copy=False)


def _raise_bad_row(i: int, value: float) -> None:
    raise ValueError(f"logits row {i} has no usable token (best logit is {value}: NaN, +inf, or every token at -inf)")


def _draw(z: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """One token from scaled logits z (max exactly 0) after top-k, top-p and min-p.

    `ids` maps positions in `w` (unnormalized probabilities, max 1) back to token ids;
    None means w covers the whole vocabulary.
    """
    V = z.shape[0]
    ids: np.ndarray | None = None
    if 0 < p.top_k < V:
        # Ties with the k-th value are kept (HF/vLLM semantics), so the set is well defined.
        ids = np.flatnonzero(z >= _kth_largest(z, p.top_k))
        w = np.exp(z[ids])
    else:
        w = np.exp(z)
    if p.top_p < 1.0:
        keep = _nucleus(w, p.top_p)
        ids = keep if ids is None else ids[keep]
        w = w[keep]
    if p.min_p > 0.0:
        keep = np.flatnonzero(w >= np.float32(p.min_p))  # w is prob / max prob; the top token has w == 1
        ids = keep if ids is None else ids[keep]
        w = w[keep]
    j = _pick(w, rng.random())
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


def _kth_largest(x: np.ndarray, k: int) -> np.float32:
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
    cand = np.flatnonzero(raw >= _kth_largest(raw, k))
    cand = cand[np.lexsort((cand, -raw[cand]))[:k]]
    return cand, raw[cand]
