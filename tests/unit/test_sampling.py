"""Batched sampling: greedy, temperature, top-k/p, min-p, penalties, logit bias, seeds, logprobs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from scipy.stats import chisquare

from engine import sampling
from engine.sampling import SamplerRow, make_rng, sample
from engine.types import InvalidRequest, SamplingParams
from kernels import row_sampling

V = 49152  # the default model's vocabulary


def row(rng: np.random.Generator | None = None, prompt=(), output=(), draft=(), **params) -> SamplerRow:
    return SamplerRow(SamplingParams(**params), rng, list(prompt) + list(output), len(prompt), list(draft))


def draw_many(logits: np.ndarray, n: int, seed: int = 0, **params) -> np.ndarray:
    """n draws from one logits row: batches of rows sharing one rng draw one after another."""
    rng = make_rng(seed)
    out = []
    chunk = max(1, min(n, 2_000_000 // logits.shape[0]))
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        out.append(sample(np.tile(logits, (m, 1)), [row(rng, **params) for _ in range(m)]).token_ids)
    return np.concatenate(out)


def greedy(logits: np.ndarray, prompt=(), output=(), **params) -> int:
    return int(sample(logits[None, :], [row(None, prompt, output, temperature=0.0, **params)]).token_ids[0])


def fits(counts: np.ndarray, probs: np.ndarray) -> float:
    """The chi-square goodness-of-fit p-value of `counts` against the distribution `probs`."""
    return float(chisquare(counts, probs / probs.sum() * counts.sum()).pvalue)


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def nucleus_reference(logits: np.ndarray, top_p: float) -> set[int]:
    """Smallest set of most likely tokens with mass >= top_p, by a full float64 sort."""
    p = np.exp(log_softmax64(logits))
    order = np.argsort(-p, kind="stable")
    n = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
    return set(order[:n].tolist())


# --- greedy ------------------------------------------------------------------------------


def test_greedy_is_argmax_and_never_draws():
    gen = np.random.default_rng(1)
    logits = gen.standard_normal((6, V)).astype(np.float32)
    rngs = [make_rng(i) for i in range(6)]
    before = [copy.deepcopy(r.bit_generator.state) for r in rngs]
    rows = [row(r, temperature=0.0) for r in rngs]
    rows[2] = row(rngs[2], temperature=0.0, logit_bias={5: 0.0})  # the "adjusted" greedy path
    out = sample(logits, rows)
    assert out.token_ids.dtype == np.int64 and out.token_ids.shape == (6,)
    np.testing.assert_array_equal(out.token_ids, logits.argmax(axis=1))
    assert [r.bit_generator.state for r in rngs] == before
    assert out.logprobs == [None] * 6


def test_greedy_from_argmax_alone_matches_sample_with_drafts():
    """sample_greedy (a backend's argmax_rows instead of the logits) emits what sample does: drafts kept
    while they equal their row's argmax, then that argmax."""
    gen = np.random.default_rng(2)
    logits = gen.standard_normal((8, 300)).astype(np.float32)
    top = logits.argmax(axis=1)
    rows = [
        row(draft=[int(top[0]), int(top[1])], temperature=0.0),
        row(temperature=0.0),
        row(draft=[int(top[4]), (int(top[5]) + 1) % 300, 7], temperature=0.0),
    ]
    assert all(sampling.is_plain_greedy(r.params) for r in rows)
    want = sample(logits, rows)
    got = sampling.sample_greedy(top, logits.max(axis=1), rows)
    assert got.token_ids.tolist() == want.token_ids.tolist() == [*top[:3], top[3], top[4], top[5]]
    assert got.num_tokens == want.num_tokens == [3, 1, 2] and got.logprobs == [None] * 6
    assert not sampling.is_plain_greedy(SamplingParams(temperature=0.0, logprobs=0))
    assert not sampling.is_plain_greedy(SamplingParams(temperature=0.0, repetition_penalty=1.1))
    best = logits.max(axis=1)
    best[5] = -np.inf
    with pytest.raises(ValueError, match="row 5 has no usable token"):
        sampling.sample_greedy(top, best, rows)
    with pytest.raises(ValueError, match="need 8"):
        sampling.sample_greedy(top[:7], best[:7], rows)


def test_tiny_temperature_is_effectively_greedy_without_overflow():
    logits = np.random.default_rng(2).standard_normal((1, V)).astype(np.float32) * 20
    for t in (1e-6, 1e-30, 1e-45):
        assert sample(logits, [row(make_rng(0), temperature=t)]).token_ids[0] == logits[0].argmax()


# --- temperature -------------------------------------------------------------------------


def test_temperature_sampling_follows_softmax_of_scaled_logits():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], dtype=np.float32)
    n = 6000
    counts = np.bincount(draw_many(logits, n, seed=3, temperature=0.7), minlength=6)
    scaled = np.exp(log_softmax64(logits / 0.7))
    unscaled = np.exp(log_softmax64(logits))
    assert fits(counts, scaled) > 1e-6
    assert fits(counts, unscaled) < 1e-30  # the wrong temperature is far out


@pytest.mark.parametrize("vocab", [V, 50_001])  # whole blocks only, and a partial last block
def test_big_vocab_draws_follow_the_distribution_and_skip_zero_mass(vocab):
    ids = np.array([0, 3, 1023, 1024, 20_000, 30_001, vocab - 2, vocab - 1])
    logits = np.full(vocab, -np.inf, dtype=np.float32)
    logits[ids] = np.array([0.3, -0.2, 0.1, 0.5, -0.4, 0.0, 0.2, -0.1], dtype=np.float32)
    draws = draw_many(logits, 3000, seed=4, temperature=1.0)
    assert set(draws.tolist()) <= set(ids.tolist())
    counts = np.array([(draws == t).sum() for t in ids])
    assert fits(counts, np.exp(log_softmax64(logits[ids]))) > 1e-6


# --- top-k / top-p / min-p ---------------------------------------------------------------


def test_top_k_only_returns_the_k_best():
    gen = np.random.default_rng(5)
    logits = gen.standard_normal(V).astype(np.float32)
    best = gen.choice(V, 20, replace=False)
    logits[best] = 6.0 + gen.uniform(0, 0.5, 20).astype(np.float32)
    draws = draw_many(logits, 800, seed=5, temperature=1.5, top_k=20)
    assert set(draws.tolist()) == set(best.tolist())  # never outside, and not stuck on fewer


def test_top_k_keeps_ties_with_the_kth_value():
    logits = np.array([3.0, 2.0, 2.0, 1.0, 0.0], dtype=np.float32)
    draws = draw_many(logits, 600, seed=6, temperature=3.0, top_k=2)
    assert set(draws.tolist()) == {0, 1, 2}


@pytest.mark.parametrize(("top_p", "allowed"), [(0.3, {0}), (0.6, {0, 1}), (0.7, {0, 1, 2}), (0.85, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_p, allowed):
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    logits = np.log(probs).astype(np.float32)
    draws = draw_many(logits, 1500, seed=7, temperature=1.0, top_p=top_p)
    assert set(draws.tolist()) == allowed
    kept = np.array(sorted(allowed))
    counts = np.bincount(draws, minlength=6)[kept]
    if len(kept) > 1:  # renormalized over the kept set
        assert fits(counts, probs[kept]) > 1e-6


def test_top_p_smallest_set_with_ties_takes_lower_ids():
    logits = np.full(V, -40.0, dtype=np.float32)
    logits[[7, 2, 5]] = 1.0  # three equally likely tokens share all the mass
    assert set(draw_many(logits, 300, seed=19, temperature=1.0, top_p=0.5).tolist()) == {2, 5}
    assert set(draw_many(logits, 300, seed=19, temperature=1.0, top_p=0.7).tolist()) == {2, 5, 7}


def test_top_p_big_vocab_small_nucleus_matches_full_sort():
    gen = np.random.default_rng(8)
    logits = gen.standard_normal(V).astype(np.float32)
    heavy = gen.choice(V, 12, replace=False)
    logits[heavy] = 9.0 + gen.uniform(0, 1, 12).astype(np.float32)
    p = np.exp(log_softmax64(logits))
    cs = np.cumsum(np.sort(p)[::-1])
    top_p = float((cs[5] + cs[6]) / 2)  # halfway between two cumulative sums: a 7-token nucleus
    allowed = nucleus_reference(logits, top_p)
    assert len(allowed) == 7
    draws = draw_many(logits, 700, seed=8, temperature=1.0, top_p=top_p)
    assert set(draws.tolist()) == allowed


def test_top_p_large_nucleus_matches_full_sort():
    # A flat distribution: the nucleus holds thousands of tokens, past the first candidate cut.
    gen = np.random.default_rng(9)
    logits = gen.permutation(np.linspace(0.0, -4.0, V)).astype(np.float32)
    allowed = nucleus_reference(logits, 0.5)
    assert len(allowed) > 4 * row_sampling._NUCLEUS_CANDIDATES
    draws = draw_many(logits, 400, seed=9, temperature=1.0, top_p=0.5)
    assert set(draws.tolist()) <= allowed
    rank = np.empty(V, dtype=np.int64)
    rank[np.argsort(-logits, kind="stable")] = np.arange(V)
    assert (rank[draws] >= row_sampling._NUCLEUS_CANDIDATES).mean() > 0.5  # not truncated to the cut


def test_min_p_drops_tokens_below_the_fraction_of_the_top():
    ratios = np.array([1.0, 0.5, 0.2, 0.09, 0.05, 0.01])
    logits = np.full(V, -30.0, dtype=np.float32)
    logits[:6] = np.log(ratios).astype(np.float32)
    draws = draw_many(logits, 800, seed=10, temperature=1.0, min_p=0.1)
    assert set(draws.tolist()) == {0, 1, 2}


def test_filters_apply_in_order_top_k_then_top_p_then_min_p():
    probs = np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05])
    logits = np.log(probs).astype(np.float32)
    # top_k=5 renormalizes {0..4} to .345 .230 .172 .138 .115, so top_p=0.7 stops at 3 tokens
    # (cumulative .747); over the full distribution it would need 4 (.3 .5 .65 .77).
    draws = draw_many(logits, 1000, seed=11, temperature=1.0, top_k=5, top_p=0.7)
    assert set(draws.tolist()) == {0, 1, 2}
    # top_p=0.6 keeps {0, 1, 2}; min_p=0.45 then keeps all three (.15/.3 = .5). The other
    # order (min-p first, renormalized) would let top-p stop at two tokens.
    draws = draw_many(logits, 1000, seed=11, temperature=1.0, top_p=0.6, min_p=0.45)
    assert set(draws.tolist()) == {0, 1, 2}
    draws = draw_many(logits, 1000, seed=11, temperature=1.0, top_k=5, top_p=0.8, min_p=0.45)
    assert set(draws.tolist()) == {0, 1, 2}  # top-p keeps {0..3}, min-p drops 3 (.4 < .45)


# --- penalties and logit bias (greedy flips built on purpose) ----------------------------


def two_tokens(a: float, b: float) -> np.ndarray:
    logits = np.full(16, -10.0, dtype=np.float32)
    logits[0], logits[1] = a, b
    return logits


def test_repetition_penalty_divides_positive_logits_over_prompt_and_output():
    # 2.0 / 1.25 = 1.6, whether token 0 is in the prompt, the output, or many times in both.
    for prompt, output in [([0], []), ([], [0]), ([0, 0, 0, 0], [0, 0, 0])]:
        assert greedy(two_tokens(2.0, 1.59), prompt, output, repetition_penalty=1.25) == 0
        assert greedy(two_tokens(2.0, 1.61), prompt, output, repetition_penalty=1.25) == 1
    assert greedy(two_tokens(2.0, 1.61), [5, 6], [7], repetition_penalty=1.25) == 0  # 0 not seen


def test_repetition_penalty_multiplies_negative_logits():
    # -1.0 * 1.25 = -1.25 (dividing would give -0.8 and keep token 0 on top).
    assert greedy(two_tokens(-1.0, -1.24), [], [0], repetition_penalty=1.25) == 1
    assert greedy(two_tokens(-1.0, -1.26), [], [0], repetition_penalty=1.25) == 0


def test_presence_penalty_counts_output_once_and_ignores_the_prompt():
    # 1.0 - 0.5 = 0.5 whether token 0 was generated once or three times.
    for output in ([0], [0, 0, 0]):
        assert greedy(two_tokens(1.0, 0.49), [], output, presence_penalty=0.5) == 0
        assert greedy(two_tokens(1.0, 0.51), [], output, presence_penalty=0.5) == 1
    assert greedy(two_tokens(1.0, 0.99), [0, 0], [], presence_penalty=0.5) == 0


def test_frequency_penalty_scales_with_the_count():
    # 1.0 - 3 * 0.25 = 0.25
    assert greedy(two_tokens(1.0, 0.24), [0], [0, 2, 0, 0], frequency_penalty=0.25) == 0
    assert greedy(two_tokens(1.0, 0.26), [0], [0, 2, 0, 0], frequency_penalty=0.25) == 1
    # Both together over a count of 2: 1.0 - 0.5 - 2 * 0.25 = 0.0; negative penalties reward.
    assert greedy(two_tokens(1.0, 0.01), [], [0, 0], presence_penalty=0.5, frequency_penalty=0.25) == 1
    assert greedy(two_tokens(1.0, -0.01), [], [0, 0], presence_penalty=0.5, frequency_penalty=0.25) == 0
    assert greedy(two_tokens(1.0, 1.49), [], [0], presence_penalty=-0.5) == 0


def test_adjustments_apply_bias_then_repetition_then_presence():
    # bias first: (-1 + 4) / 2 = 1.5; the other order would give -1 * 2 + 4 = 2.0
    assert greedy(two_tokens(-1.0, 1.49), [0], [], logit_bias={0: 4.0}, repetition_penalty=2.0) == 0
    assert greedy(two_tokens(-1.0, 1.51), [0], [], logit_bias={0: 4.0}, repetition_penalty=2.0) == 1
    # repetition before presence: 2 / 2 - 0.5 = 0.5; the other order would give 0.75
    assert greedy(two_tokens(2.0, 0.49), [], [0], repetition_penalty=2.0, presence_penalty=0.5) == 0
    assert greedy(two_tokens(2.0, 0.51), [], [0], repetition_penalty=2.0, presence_penalty=0.5) == 1


def test_adjustments_also_apply_to_sampled_rows():
    logits = two_tokens(1.0, 0.9)
    out = sample(logits[None, :], [row(make_rng(0), [], [0], temperature=0.8, top_k=1, presence_penalty=0.5)])
    assert out.token_ids[0] == 1


def test_logit_bias_forces_and_bans_tokens():
    gen = np.random.default_rng(12)
    logits = gen.standard_normal(V).astype(np.float32)
    low = int(logits.argmin())
    assert set(draw_many(logits, 200, seed=12, temperature=1.0, logit_bias={low: 100.0}).tolist()) == {low}
    assert greedy(logits, logit_bias={low: 100.0}) == low

    peaked = two_tokens(3.0, 3.0)  # tokens 0 and 1 share nearly all the mass
    draws = draw_many(peaked, 1000, seed=13, temperature=1.0, logit_bias={0: -100.0})
    assert 0 not in draws.tolist() and (draws == 1).mean() > 0.9
    assert greedy(peaked, logit_bias={0: -100.0}) == 1


def test_input_logits_are_not_modified():
    gen = np.random.default_rng(14)
    logits = gen.standard_normal((3, V)).astype(np.float32)
    before = logits.copy()
    rows = [
        row(None, [1, 2], [3], temperature=0.0, repetition_penalty=1.3, logit_bias={9: 5.0}),
        row(make_rng(0), [1, 2], [3, 3], temperature=0.7, top_p=0.9, frequency_penalty=1.0, logprobs=2),
        row(make_rng(1), temperature=1.3, top_k=40),
    ]
    sample(logits, rows)
    np.testing.assert_array_equal(logits, before)


# --- seeds and batch independence --------------------------------------------------------


def test_make_rng_is_reproducible_per_seed_and_index():
    first = [make_rng(42, i).random(4).tolist() for i in range(3)]
    assert first == [make_rng(42, i).random(4).tolist() for i in range(3)]
    assert len({tuple(x) for x in first}) == 3  # each sample index its own stream
    assert make_rng(43, 0).random(4).tolist() != first[0]
    assert make_rng(-5).random(4).tolist() == make_rng(-5).random(4).tolist()
    assert make_rng(None).random(4).tolist() != make_rng(None).random(4).tolist()


def test_same_seed_same_tokens_whatever_the_batch():
    gen = np.random.default_rng(15)
    steps = 12
    target_logits = [(gen.standard_normal(V) * 2.5).astype(np.float32) for _ in range(steps)]
    target = dict(temperature=0.9, top_p=0.9, min_p=0.01, logprobs=3, presence_penalty=0.3)

    def run(position: int, others: list[dict], seed_offset: int) -> tuple[list[int], list]:
        rows = [row(make_rng(100 + seed_offset + j), [4, 5], **kw) for j, kw in enumerate(others)]
        rows.insert(position, row(make_rng(7), [4, 5], **target))
        tokens, lps = [], []
        for s in range(steps):
            logits = (gen.standard_normal((len(rows), V)) * 2.5).astype(np.float32)
            logits[position] = target_logits[s]
            out = sample(logits, rows)
            for r, t in zip(rows, out.token_ids):
                r.token_ids.append(int(t))
            tokens.append(int(out.token_ids[position]))
            lps.append(out.logprobs[position])
        return tokens, lps

    alone = run(0, [], 0)
    assert len(set(alone[0])) > 1  # really sampling, not stuck on one token
    mixed = [
        dict(temperature=0.0),
        dict(temperature=1.2, top_k=50),
        dict(temperature=0.0, repetition_penalty=1.2),
        dict(temperature=0.5, logprobs=0),
    ]
    assert run(3, mixed, 0) == alone
    assert run(1, mixed[::-1], 50) == alone
    assert run(0, [dict(temperature=1.0)] * 7, 9) == alone


def test_different_seeds_give_different_samples():
    logits = (np.random.default_rng(16).standard_normal(V) * 0.5).astype(np.float32)
    assert (
        draw_many(logits, 20, seed=1, temperature=1.0).tolist()
        != draw_many(logits, 20, seed=2, temperature=1.0).tolist()
    )


def test_mixed_params_in_one_batch_match_each_row_alone():
    gen = np.random.default_rng(17)
    logits = gen.standard_normal((7, V)).astype(np.float32)
    logits[:, :10] += 4.0
    specs = [
        dict(temperature=0.0),
        dict(temperature=0.0, repetition_penalty=1.5, logprobs=2),
        dict(temperature=0.8, top_k=5),
        dict(temperature=1.0, top_p=0.5),
        dict(temperature=1.2, min_p=0.3, logprobs=4),
        dict(temperature=0.7, logit_bias={123: 100.0}),
        dict(temperature=1.0, top_k=8, top_p=0.7, min_p=0.05, frequency_penalty=0.4),
    ]
    prompt, output = [1, 2, 3], [4, 5, 4]
    together = sample(logits, [row(make_rng(i), prompt, output, **kw) for i, kw in enumerate(specs)])
    for i, kw in enumerate(specs):
        alone = sample(logits[i : i + 1], [row(make_rng(i), prompt, output, **kw)])
        assert together.token_ids[i] == alone.token_ids[0]
        assert together.logprobs[i] == alone.logprobs[0]
    t = together.token_ids
    assert t[0] == logits[0].argmax()
    assert t[2] in set(np.argsort(-logits[2])[:5].tolist())
    assert logits[4, t[4]] >= logits[4].max() + 1.2 * np.log(0.3)  # min-p on p^(1/T)
    assert t[5] == 123
    assert together.logprobs[0] is None and len(together.logprobs[4].top) == 4


# --- logprobs ----------------------------------------------------------------------------


def test_logprobs_are_the_raw_log_softmax_with_sorted_top_k():
    gen = np.random.default_rng(18)
    logits = (gen.standard_normal((4, V)) * 3).astype(np.float32)
    forced = int(logits[1].argmin())
    rows = [
        row(None, temperature=0.0, logprobs=5),
        row(make_rng(0), [7], [8], temperature=0.5, logprobs=20, logit_bias={forced: 100.0}, repetition_penalty=2.0),
        row(make_rng(1), temperature=1.0, top_p=0.9, logprobs=0),
        row(make_rng(2), temperature=1.0),
    ]
    out = sample(logits, rows)
    assert out.token_ids[1] == forced
    for i, k in [(0, 5), (1, 20), (2, 0)]:
        ref = log_softmax64(logits[i])
        lp = out.logprobs[i]
        assert lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(ref[lp.token_id], abs=1e-5)  # raw: bias/penalty/temperature not applied
        assert [t for t, _ in lp.top] == np.argsort(-ref, kind="stable")[:k].tolist()
        np.testing.assert_allclose([v for _, v in lp.top], ref[[t for t, _ in lp.top]], atol=1e-5)
        assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:]))
        assert isinstance(lp.logprob, float) and all(type(t) is int and type(v) is float for t, v in lp.top)
    assert out.logprobs[1].logprob < -5  # the forced token was unlikely under the raw model
    assert out.logprobs[3] is None


def test_logprobs_top_k_breaks_ties_by_lower_id():
    logits = np.zeros((1, 300), dtype=np.float32)
    logits[0, [250, 40, 7]] = 1.0
    lp = sample(logits, [row(None, temperature=0.0, logprobs=4)]).logprobs[0]
    assert [t for t, _ in lp.top] == [7, 40, 250, 0]
    assert lp.token_id == 7


@pytest.mark.parametrize("n", [1, 63, 64, 1000, 49152, 50_001])
def test_kth_largest_matches_partition(n):
    gen = np.random.default_rng(n)
    x = gen.integers(-50, 50, n).astype(np.float32)  # many ties
    for k in {1, 2, 5, 20, 100, n}:
        if k <= n:
            assert row_sampling.kth_largest(x, k) == np.sort(x)[::-1][k - 1]


# --- bad input ---------------------------------------------------------------------------


def test_bad_logits_give_clear_errors():
    ok = [row(None, temperature=0.0)]
    with pytest.raises(ValueError, match="2-D float"):
        sample(np.zeros(V, dtype=np.float32), ok)
    with pytest.raises(ValueError, match="2-D float"):
        sample(np.zeros((1, V), dtype=np.int64), ok)
    with pytest.raises(ValueError, match="has 2 rows but the 1 sequences need 1"):
        sample(np.zeros((2, V), dtype=np.float32), ok)
    nan = np.zeros((2, V), dtype=np.float32)
    nan[1, 17] = np.nan
    for r in (row(None, temperature=0.0), row(make_rng(0), temperature=1.0)):
        with pytest.raises(ValueError, match="logits row 1"):
            sample(nan, [row(None, temperature=0.0), r])
    banned = np.full((1, 8), -np.inf, dtype=np.float32)
    for r in (
        row(None, temperature=0.0),
        row(make_rng(0), temperature=1.0),
        row(None, temperature=0.0, logit_bias={1: 5.0}),
    ):
        with pytest.raises(ValueError, match="no usable token"):
            sample(banned, [r])


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=None), "top_p"),
        (dict(min_p=1.5), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(presence_penalty=float("inf")), "presence_penalty"),
        (dict(logprobs=-1), "logprobs"),
        (dict(logit_bias={V: 1.0}), "logit_bias"),
        (dict(logit_bias={"5": 1.0}), "logit_bias"),
        (dict(logit_bias={5: float("nan")}), "logit_bias"),
    ],
)
def test_bad_params_raise_invalid_request_naming_the_field(params, param):
    # The engine checks params once, at admission; the sampler relies on that check.
    with pytest.raises(InvalidRequest, match=param) as err:
        SamplingParams(**params).validate(V)
    assert err.value.param == param


def test_bad_rows_give_clear_errors():
    logits = np.zeros((1, V), dtype=np.float32)
    with pytest.raises(ValueError, match="needs a numpy Generator"):
        sample(logits, [row(None, temperature=0.7)])
    with pytest.raises(InvalidRequest, match="seed must be an integer") as err:
        make_rng("42")
    assert err.value.param == "seed"
    with pytest.raises(ValueError, match="sample index"):
        make_rng(1, -1)


def test_a_failed_batch_advances_no_rng():
    logits = np.random.default_rng(20).standard_normal((3, V)).astype(np.float32)
    logits[2, 5] = np.nan
    rngs = [make_rng(1), make_rng(2), make_rng(3)]
    before = [copy.deepcopy(r.bit_generator.state) for r in rngs]
    with pytest.raises(ValueError, match="logits row 2"):
        sample(logits, [row(r, temperature=1.0) for r in rngs])
    assert [r.bit_generator.state for r in rngs] == before
    # Retried alone, the good rows sample exactly as a fresh generator with their seed would.
    good = sample(logits[:2], [row(r, temperature=1.0) for r in rngs[:2]]).token_ids
    assert good.tolist() == sample(logits[:2], [row(make_rng(s), temperature=1.0) for s in (1, 2)]).token_ids.tolist()
