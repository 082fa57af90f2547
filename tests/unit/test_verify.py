"""Draft verification in the sampler: greedy exactness, the accept/reject rule under sampling,
penalties that count earlier drafts, and the seeded coupling with plain decoding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chisquare

from engine.sampling import SamplerRow, make_rng, sample
from engine.types import SamplingParams


def row(rng, history=(1, 2, 3), prompt_len=3, draft=(), **params) -> SamplerRow:
    return SamplerRow(SamplingParams(**params), rng, list(history), prompt_len, list(draft))


def test_greedy_accepts_the_matching_prefix_then_emits_the_argmax():
    V = 10
    logits = np.full((4, V), -1.0, dtype=np.float32)
    for j, best in enumerate([3, 5, 7, 9]):
        logits[j, best] = 2.0
    cases = {(3, 5, 7): [3, 5, 7, 9], (3, 5, 1): [3, 5, 7], (4, 5, 7): [3], (3, 6, 7): [3, 5]}
    for draft, want in cases.items():
        out = sample(logits, [row(None, draft=draft, temperature=0.0)])
        assert out.token_ids.tolist() == want and out.num_tokens == [len(want)]


def test_each_sequence_uses_only_its_own_rows():
    V = 8
    logits = np.full((5, V), -1.0, dtype=np.float32)
    logits[[0, 1, 2, 3, 4], [2, 4, 6, 1, 0]] = 3.0  # seq A rows 0-2, seq B rows 3-4
    out = sample(logits, [row(None, draft=(2, 4), temperature=0.0), row(None, draft=(5,), temperature=0.0)])
    assert out.num_tokens == [3, 1]
    assert out.token_ids.tolist() == [2, 4, 6, 1]


def test_penalties_see_earlier_drafts_as_if_accepted():
    V = 6
    logits = np.zeros((3, V), dtype=np.float32)
    logits[:, 4] = 1.0  # token 4 leads everywhere ...
    logits[:, 2] = 0.5
    # ... but once drafted it is penalised at the rows after it (presence penalty 2).
    out = sample(logits, [row(None, draft=(4, 4), temperature=0.0, presence_penalty=2.0)])
    assert out.token_ids.tolist() == [4, 2]
    plain = sample(logits, [row(None, draft=(4, 4), temperature=0.0)])
    assert plain.token_ids.tolist() == [4, 4, 4]


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1.0),
        dict(temperature=0.7, top_k=5),
        dict(temperature=1.3, top_p=0.8, min_p=0.02),
        dict(temperature=1.0, frequency_penalty=1.5, repetition_penalty=1.2, logit_bias={3: 2.0}),
    ],
)
def test_seeded_verification_emits_what_plain_decoding_would(params):
    """Whatever the draft, a seeded sequence emits the tokens one-at-a-time sampling gives."""
    gen = np.random.default_rng(5)
    V, k = 12, 4
    for trial in range(40):
        logits = (gen.standard_normal((k + 1, V)) * 1.5).astype(np.float32)
        draft = gen.integers(0, V, k).tolist()
        if trial % 2:  # half the drafts follow the likely path, so long acceptances happen too
            draft = logits.argmax(axis=1)[:k].tolist()
        rng = make_rng(trial)
        out = sample(logits, [row(rng, draft=draft, **params)])
        emitted = out.token_ids.tolist()
        ref_rng, history = make_rng(trial), [1, 2, 3]
        for j, token in enumerate(emitted):
            one = sample(logits[j : j + 1], [row(ref_rng, history=list(history), **params)])
            assert one.token_ids.tolist() == [token]
            history.append(token)
        n = len(emitted)
        assert emitted[: n - 1] == draft[: n - 1]
        assert n == k + 1 or emitted[-1] != draft[n - 1]
        assert rng.bit_generator.state == ref_rng.bit_generator.state  # one uniform per emitted token


def test_draft_acceptance_keeps_the_distribution():
    """First emitted token ~ p whatever the draft (accept x with p(x), else p without x); and after
    an accepted draft the next token ~ the next row's p. Chi-square tests, false failure < 1e-6 each."""
    V, N = 5, 20_000
    first = np.array([1.2, 0.4, 0.0, -0.3, 0.9], dtype=np.float32)
    second = np.array([-0.5, 0.8, 0.3, 0.0, 1.0], dtype=np.float32)
    p1 = np.exp(first - first.max())
    p1 /= p1.sum()
    p2 = np.exp(second - second.max())
    p2 /= p2.sum()
    draft = 4  # a likely but not the likeliest token: both acceptances and rejections are common
    logits = np.tile(np.stack([first, second]), (N, 1))
    out = sample(logits, [row(make_rng(1000 + i), draft=[draft], temperature=1.0) for i in range(N)])
    tokens = out.token_ids.tolist()
    firsts, after_accept, pos = [], [], 0
    for n in out.num_tokens:
        firsts.append(tokens[pos])
        if n == 2:
            after_accept.append(tokens[pos + 1])
        pos += n
    for seen, p in ((firsts, p1), (after_accept, p2)):
        counts = np.bincount(seen, minlength=V)
        expected = p / p.sum(dtype=np.float64) * len(seen)
        assert expected.min() > 100  # the chi-square approximation holds comfortably
        fit = chisquare(counts, expected)
        assert fit.pvalue > 1e-6, (
            f"chi-square {fit.statistic:.1f}: counts {counts.tolist()} vs {expected.round().tolist()}"
        )
    assert abs(len(after_accept) / N - p1[draft]) < 6 * math.sqrt(p1[draft] * (1 - p1[draft]) / N)


def test_logprobs_come_per_emitted_token():
    V = 7
    logits = np.random.default_rng(3).standard_normal((3, V)).astype(np.float32)
    draft = logits.argmax(axis=1)[:2].tolist()
    out = sample(logits, [row(None, draft=draft, temperature=0.0, logprobs=2)])
    assert out.num_tokens == [3] and len(out.logprobs) == 3
    for j, lp in enumerate(out.logprobs):
        x = logits[j].astype(np.float64)
        want = x - x.max() - np.log(np.exp(x - x.max()).sum())
        assert lp.token_id == out.token_ids[j]
        assert lp.logprob == pytest.approx(want[lp.token_id], abs=1e-5)
        assert [t for t, _ in lp.top] == np.argsort(-x)[:2].tolist()
