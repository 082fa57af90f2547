"""Batched sampling and draft verification: each sequence owns 1 + len(draft) consecutive rows
of a [R, V] logits matrix and its own params.

Per row, in this order: logit_bias -> repetition penalty (HF: over prompt + output) ->
presence/frequency penalties (OpenAI: over output) -> greedy argmax when temperature == 0,
otherwise /temperature -> top-k -> top-p -> min-p -> one draw from the sequence's rng.
Row j of a sequence scores the token after its drafted tokens draft[:j], which count as if
accepted (penalties see them). Logprobs are the log-softmax of the logits as given (a grammar
mask already applied, nothing else), as in vLLM.

Verification (speculative decoding): row j is sampled exactly as if the drafts before it had
been generated; draft[j] is accepted when that sample equals it, else the sample is emitted
and the rest of the draft is dropped; after a fully accepted draft the last row gives one
more token. For a drafted token x this accepts with probability p(x) and, on rejection, emits
a token drawn from p with x removed and renormalised: the rejection rule of speculative
sampling for a draft that is a single proposed token, coupled so that every emitted token
costs exactly one uniform from the rng. A seeded sequence therefore emits the same tokens
with or without drafts, whatever they were.

A sequence's result depends only on its own logits, params, history and rng, never on the
rest of the batch; greedy sequences never touch their rng.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.types import InvalidRequest, SamplingParams, TokenLogprob

_PICK_BLOCK = 1024  # inverse-CDF search: block sums first, then a cumsum inside one block
_NUCLEUS_CANDIDATES = 1024  # top-p: first try sorting only this many candidates
_SELECT_GROUP = 64  # k-th largest value: only the groups holding the top k are partitioned


@dataclass(slots=True)
class SamplerRow:
    """One sequence to sample this step. Its params were validated at admission."""

    params: SamplingParams
    rng: np.random.Generator | None  # from make_rng(); may be None for greedy rows, which never draw
    token_ids: list[int]  # the sequence's own prompt + output (read for penalties, never changed)
    prompt_len: int
    draft: Sequence[int] = ()  # proposed next tokens: scored by rows 1..len(draft)


@dataclass(slots=True)
class SampleOutput:
    token_ids: np.ndarray  # int64, every sequence's emitted tokens one after another
    num_tokens: list[int]  # per sequence: accepted drafts + 1
    logprobs: list[TokenLogprob | None]  # per emitted token; None where params.logprobs is None


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
    """Emit 1 + (accepted drafts) tokens per sequence from `logits` (float32 [R, V]).

    `logits` is not modified. Raises ValueError for bad logits (wrong shape, NaN, nothing
    allowed) before the first draw, so a failed call has advanced no rng and the batch can
    be retried sequence by sequence with the same result for the good ones.
    """
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.dtype.kind != "f" or logits.shape[1] == 0:
        raise ValueError(f"logits must be a 2-D float array [rows, vocab], got {logits.dtype} {logits.shape}")
    counts = [1 + len(r.draft) for r in rows]
    starts = np.cumsum([0] + counts).tolist()
    if logits.shape[0] != starts[-1]:
        raise ValueError(f"logits has {logits.shape[0]} rows but the {len(rows)} sequences need {starts[-1]}")
    if logits.dtype != np.float32:
        logits = logits.astype(np.float32)

    plain: list[int] = []  # greedy on the raw rows: one vectorized argmax
    adjusted: list[int] = []  # greedy after bias/penalties
    sampled: list[int] = []
    for i, row in enumerate(rows):
        p = row.params
        if p.temperature > 0.0:
            if not isinstance(row.rng, np.random.Generator):
                raise ValueError(f"row {i}: temperature > 0 needs a numpy Generator as rng, got {type(row.rng).__name__}")
            sampled.append(i)
        elif _adjusts(p):
            adjusted.append(i)
        else:
            plain.append(i)

    # 1. Every row's scores and every check, before any draw.
    best: dict[int, list[int]] = {}  # greedy sequence -> argmax per row
    if plain:
        if len(plain) == len(rows):
            idx = None
            top = logits.argmax(axis=1)
            chosen = logits[np.arange(logits.shape[0]), top]
        else:
            idx = _row_index(plain, starts)
            top = logits[idx].argmax(axis=1)
            chosen = logits[idx, top]
        bad = np.isnan(chosen) | (chosen == -np.inf)
        if bad.any():
            j = int(np.argmax(bad))
            _raise_bad_row(j if idx is None else int(idx[j]), float(chosen[j]))
        top, off = top.tolist(), 0
        for i in plain:
            if idx is None:
                best[i] = top[starts[i] : starts[i + 1]]
            else:
                best[i] = top[off : off + counts[i]]
                off += counts[i]
    for i in adjusted:
        x = logits[starts[i] : starts[i + 1]].copy()
        _adjust_rows(x, rows[i])
        picks = x.argmax(axis=1)
        best[i] = picks.tolist()
        chosen = x[np.arange(counts[i]), picks]
        bad = np.isnan(chosen) | (chosen == -np.inf)
        if bad.any():
            _raise_bad_row(starts[i] + int(np.argmax(bad)), float(chosen[bad][0]))

    scaled = None
    if sampled:
        idx = _row_index(sampled, starts)
        scaled = logits[idx]  # fancy indexing copies: adjustments never touch the caller's array
        off = 0
        for i in sampled:
            if _adjusts(rows[i].params):
                _adjust_rows(scaled[off : off + counts[i]], rows[i])
            off += counts[i]
        top = scaled.max(axis=1)
        for j in np.flatnonzero(~np.isfinite(top)):
            _raise_bad_row(int(idx[j]), float(top[j]))
        # Subtract the max before dividing so a tiny temperature gives -inf, never inf - inf.
        scaled -= top[:, None]
        temps = np.repeat([rows[i].params.temperature for i in sampled], [counts[i] for i in sampled]).astype(np.float32)
        if (temps != 1.0).any():
            with np.errstate(over="ignore"):
                scaled /= np.maximum(temps, np.finfo(np.float32).tiny)[:, None]

    # 2. Draws and verification, sequence by sequence.
    emitted: list[int] = []
    num_tokens: list[int] = []
    emitted_rows: list[int] = []
    off = 0
    for i, row in enumerate(rows):
        draft = row.draft
        if i in best:
            picks = best[i]
            n = 0
            while n < len(draft) and picks[n] == draft[n]:
                n += 1
            tokens = list(draft[:n]) + [picks[n]]
        else:
            p, rng = row.params, row.rng
            tokens = []
            for j in range(counts[i]):
                t = _draw(scaled[off + j], p, rng)
                tokens.append(t)
                if j == len(draft) or t != draft[j]:
                    break
            off += counts[i]
        emitted += tokens
        num_tokens.append(len(tokens))
        emitted_rows += range(starts[i], starts[i] + len(tokens))
    token_ids = np.asarray(emitted, dtype=np.int64)

    logprobs: list[TokenLogprob | None] = [None] * len(emitted)
    owners = [i for i, n in enumerate(num_tokens) for _ in range(n)]  # emitted token -> its sequence
    want = [e for e, i in enumerate(owners) if rows[i].params.logprobs is not None]
    if want:
        raw = logits[[emitted_rows[e] for e in want]]  # a copy, turned into exp(raw - max) in place below
        chosen = raw[np.arange(len(want)), token_ids[want]].astype(np.float64)
        alts = [_best(raw[j], rows[owners[e]].params.logprobs) for j, e in enumerate(want)]
        top = raw.max(axis=1)
        raw -= top[:, None]
        np.exp(raw, out=raw)
        lse = top.astype(np.float64) + np.log(raw.sum(axis=1).astype(np.float64))
        for j, e in enumerate(want):
            ids, vals = alts[j]
            logprobs[e] = TokenLogprob(
                token_id=int(token_ids[e]),
                logprob=float(chosen[j] - lse[j]),
                top=[(int(t), float(v - lse[j])) for t, v in zip(ids, vals.astype(np.float64))],
            )
    return SampleOutput(token_ids=token_ids, num_tokens=num_tokens, logprobs=logprobs)


def _row_index(seqs: list[int], starts: list[int]) -> np.ndarray:
    """The logits rows of sequences `seqs`, in order."""
    return np.concatenate([np.arange(starts[i], starts[i + 1]) for i in seqs])


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _adjusts(p: SamplingParams) -> bool:
    return bool(p.logit_bias) or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _adjust_rows(x: np.ndarray, row: SamplerRow) -> None:
    """logit_bias, then the repetition penalty, then presence/frequency penalties, in place.

    Row j of x sees the sequence's tokens plus draft[:j] as its history."""
    p = row.params
    if p.logit_bias:
        ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
        x[:, ids] += np.fromiter(p.logit_bias.values(), dtype=np.float32, count=len(p.logit_bias))
    penalize = p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
    if not penalize:
        return
    history = np.asarray(row.token_ids, dtype=np.int64)
    draft = np.asarray(row.draft, dtype=np.int64)
    for j in range(x.shape[0]):
        seen = np.concatenate([history, draft[:j]]) if j else history
        out = seen[row.prompt_len :]
        if p.repetition_penalty != 1.0:
            # Repeated ids are harmless: every copy writes the same value computed from the original.
            v = x[j, seen]
            x[j, seen] = np.where(v > 0, v / np.float32(p.repetition_penalty), v * np.float32(p.repetition_penalty))
        if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and out.size:
            ids, counts = np.unique(out, return_counts=True)
            x[j, ids] -= (p.presence_penalty + p.frequency_penalty * counts).astype(np.float32)


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
