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

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.types import InvalidRequest, SamplingParams, TokenLogprob
from kernels import Backend
from kernels.row_sampling import draw, logprob_rows


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
                raise ValueError(
                    f"row {i}: temperature > 0 needs a numpy Generator as rng, got {type(row.rng).__name__}"
                )
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
        for j in np.flatnonzero(~np.isfinite(top)).tolist():
            _raise_bad_row(int(idx[j]), float(top[j]))
        # Subtract the max before dividing so a tiny temperature gives -inf, never inf - inf.
        scaled -= top[:, None]
        temps = np.repeat([rows[i].params.temperature for i in sampled], [counts[i] for i in sampled]).astype(
            np.float32
        )
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
            tokens = _verify_greedy(best[i], draft)
        else:
            p, rng = row.params, row.rng
            assert scaled is not None and rng is not None  # a sampled row: scaled above, its rng checked
            tokens = []
            for j in range(counts[i]):
                t = draw(scaled[off + j], p.top_k, p.top_p, p.min_p, rng.random())
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
        ks = [k for e in want if (k := rows[owners[e]].params.logprobs) is not None]  # all of want
        found = logprob_rows(logits[[emitted_rows[e] for e in want]], token_ids[want], max(ks))
        for e, lp in zip(want, token_logprobs(token_ids[want], ks, *found)):
            logprobs[e] = lp
    return SampleOutput(token_ids=token_ids, num_tokens=num_tokens, logprobs=logprobs)


def is_plain_greedy(p: SamplingParams) -> bool:
    """Whether a row's token is its raw logits' argmax and nothing else is read from them (no logprobs)."""
    return p.temperature == 0.0 and not _adjusts(p) and p.logprobs is None


def sample_greedy(top: np.ndarray, best: np.ndarray, rows: Sequence[SamplerRow]) -> SampleOutput:
    """`sample` for sequences whose params are all `is_plain_greedy`, from each logits row's argmax `top`
    and its logit `best` (what a backend's argmax_rows copies back instead of the logits).

    Raises ValueError, as `sample` would, when a row has no usable token."""
    starts = list(itertools.accumulate((1 + len(r.draft) for r in rows), initial=0))
    if top.shape != (starts[-1],) or best.shape != top.shape:
        raise ValueError(f"argmax of {top.shape} / {best.shape} rows, but the {len(rows)} sequences need {starts[-1]}")
    bad = np.isnan(best) | (best == -np.inf)
    if bad.any():
        j = int(np.argmax(bad))
        _raise_bad_row(j, float(best[j]))
    picks = top.tolist()
    emitted: list[int] = []
    num_tokens: list[int] = []
    for i, row in enumerate(rows):
        tokens = _verify_greedy(picks[starts[i] : starts[i + 1]], row.draft)
        emitted += tokens
        num_tokens.append(len(tokens))
    return SampleOutput(np.asarray(emitted, dtype=np.int64), num_tokens, [None] * len(emitted))


def is_single_draw(row: SamplerRow) -> bool:
    """Whether a row's token depends only on its logits, temperature, top-k/p and min-p, and one uniform when it
    samples: what a backend's sample_rows computes (no penalties, bias or draft; logprobs come from logprob_rows)."""
    return not row.draft and not _adjusts(row.params)


def draw_table(rows: Sequence[SamplerRow]) -> np.ndarray:
    """The sampling table (kernels/row_sampling.py) of `is_single_draw` rows: one draw from the rng of each
    row with temperature > 0, the draw `sample` would make for it."""
    return np.array(
        [
            (
                r.params.temperature,
                r.params.top_k,
                r.params.top_p,
                r.params.min_p,
                _draw(r) if r.params.temperature > 0.0 else 0.0,
            )
            for r in rows
        ],
        dtype=np.float64,
    )


def sample_on_backend(
    backend: Backend, logits: Any, rows: Sequence[SamplerRow]
) -> list[tuple[list[int], list[TokenLogprob] | None] | ValueError]:
    """`sample` of `is_single_draw` rows by the backend that holds their logits [R, V]: per row its token (and its
    logprobs when asked), or a ValueError when the row has no usable token. Only token ids and the logprobs
    asked for leave the backend. Every sampled row's draw is spent, whatever the outcome."""
    ids = backend.sample_rows(logits, draw_table(rows))
    want = [j for j, r in enumerate(rows) if r.params.logprobs is not None and ids[j] >= 0]
    found: dict[int, TokenLogprob] = {}
    if want:
        ks = [k for j in want if (k := rows[j].params.logprobs) is not None]  # all of want
        lps = token_logprobs(
            ids[want], ks, *backend.logprob_rows(logits, np.asarray(want, dtype=np.int64), ids[want], max(ks))
        )
        found = dict(zip(want, lps))
    return [
        ([t], [found[j]] if j in found else None)
        if t >= 0
        else ValueError(f"sampling failed: logits row {j} has no usable token (NaN, +inf, or every token at -inf)")
        for j, t in enumerate(ids.tolist())
    ]


def token_logprobs(
    tokens: np.ndarray, ks: list[int], chosen: np.ndarray, ids: np.ndarray, values: np.ndarray
) -> list[TokenLogprob]:
    """TokenLogprobs from what logprob_rows (a backend's, or kernels/row_sampling.py's) found for rows asking
    for ks[j] alternatives."""
    return [
        TokenLogprob(token_id=int(t), logprob=float(c), top=list(zip(i[:k].tolist(), v[:k].tolist())))
        for t, k, c, i, v in zip(tokens.tolist(), ks, chosen, ids, values)
    ]


def _verify_greedy(picks: list[int], draft: Sequence[int]) -> list[int]:
    """The drafts that equal the argmax of their row, then the argmax after the last of them."""
    n = 0
    while n < len(draft) and picks[n] == draft[n]:
        n += 1
    return list(draft[:n]) + [picks[n]]


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


def _draw(row: SamplerRow) -> float:
    """One uniform from the rng of a row that samples (temperature > 0: it has one)."""
    assert row.rng is not None, "a row with temperature > 0 needs an rng"
    return row.rng.random()
