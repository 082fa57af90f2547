"""Draft lengths from acceptance and step costs (engine/spec_policy.py): the estimates, and the
decisions they lead to on given costs, deterministic (no timing)."""

from __future__ import annotations

import pytest

from engine.spec_policy import PRIOR, PRIOR_ROW_COST, Acceptance, SpecPolicy, StepCost
from engine.speculative import Drafter


def drafter_with_match(m: int, acceptance: Acceptance | None = None) -> Drafter:
    """A greedy sequence whose last m tokens match an earlier passage (its track)."""
    block = list(range(1000, 1001 + m))
    tokens = block + [7] + block[:m]
    d = Drafter(prompt_len=len(tokens), acceptance=acceptance)
    d.observe(tokens)
    assert d.match == min(m, 64)
    return d


def test_acceptance_starts_at_the_prior_and_follows_what_it_sees_by_match_class():
    a = Acceptance()
    assert [a.p(True, m) for m in (1, 2, 3, 4, 7, 8, 64, 1000)] == [PRIOR[i] for i in (0, 1, 1, 2, 2, 3, 6, 6)]
    for _ in range(200):
        a.observe(True, 5, False)
    assert a.p(True, 4) == a.p(True, 7) < 0.1  # one class
    assert a.p(True, 8) == PRIOR[3] and a.p(False, 5) == PRIOR[2]  # other classes, sampled apart
    for _ in range(200):
        a.observe(True, 5, True)
    assert a.p(True, 5) > 0.95  # old observations fade


def test_a_fixed_row_cost_is_linear_and_measures_nothing():
    cost = StepCost(row_cost=0.25)
    cost.observe(5, 5.0)
    assert (cost.shape(1), cost.shape(5), cost.level) == (1.0, 2.0, 0.0)


def test_step_cost_learns_the_shape_of_row_counts_and_follows_the_load_level():
    cost = StepCost()
    assert cost.shape(3) == 1.0 + 2 * PRIOR_ROW_COST  # nothing measured: the prior
    for _ in range(200):  # a one-row step takes 10 ms, a nine-row step 30 ms
        cost.observe(1, 0.010)
        cost.observe(9, 0.030)
    assert cost.shape(9) == pytest.approx(3.0, rel=0.02) and cost.level == pytest.approx(0.010, rel=0.02)
    assert cost.shape(5) == pytest.approx(2.0, rel=0.02)  # between the counts seen
    assert cost.shape(11) == pytest.approx(3.0 + 2 * PRIOR_ROW_COST, rel=0.02)  # beyond: the prior's slope
    for _ in range(20):  # the machine gets twice as busy while only nine-row steps run
        cost.observe(9, 0.060)
    assert cost.level > 0.015 and cost.shape(9) < 3.0 * 1.25  # mostly the level moves
    for _ in range(200):
        cost.observe(1, 0.020)
        cost.observe(9, 0.060)
    assert cost.shape(9) == pytest.approx(3.0, rel=0.02) and cost.level == pytest.approx(0.020, rel=0.02)
    shape = cost.shape(9)
    cost.observe(9, 10.0)  # one stalled step
    assert cost.shape(9) <= shape * 1.1


def test_no_track_no_draft():
    d = Drafter(prompt_len=3)
    d.observe([1, 2, 3])
    assert SpecPolicy(row_cost=0.0).length(d, rows=1, tokens=1.0, limit=16) == (0, 0.0)


def test_nearly_free_rows_draft_long_costly_rows_only_sure_tracks():
    gpu, cpu = SpecPolicy(row_cost=0.02), SpecPolicy(row_cost=0.65)
    short, long = drafter_with_match(1), drafter_with_match(64)
    assert gpu.length(short, 1, 1.0, 16)[0] > 0 and gpu.length(long, 1, 1.0, 16)[0] == 16
    assert cpu.length(short, 1, 1.0, 16)[0] == 0
    k, gain = cpu.length(long, 1, 1.0, 16)
    assert 0 < k < 16 and gain == pytest.approx(sum(PRIOR[6] ** j for j in range(1, k + 1)))
    # The same track in a step where 32 sequences decode: a CPU would slow all of them for one gain.
    assert cpu.length(long, 32, 32.0, 16)[0] == 0 and gpu.length(long, 32, 32.0, 16)[0] > 0


def test_tracks_seen_to_hold_get_longer_drafts():
    policy = SpecPolicy(row_cost=0.65)
    d = drafter_with_match(64, policy.acceptance)
    before = policy.length(d, 1, 1.0, 16)[0]
    for _ in range(100):
        policy.acceptance.observe(True, 64, True)
    assert before < 8 < policy.length(d, 1, 1.0, 16)[0]


def test_measured_step_times_decide():
    cheap, dear = SpecPolicy(), SpecPolicy()
    for _ in range(100):
        for rows in (1, 17):
            cheap.cost.observe(rows, 0.010 + 0.0001 * rows)  # a GPU: a verify step costs about a decode step
            dear.cost.observe(rows, 0.014 * (1 + 0.65 * (rows - 1)))  # this CPU
    d = drafter_with_match(2)
    assert cheap.length(d, 1, 1.0, 16)[0] > 1 and dear.length(d, 1, 1.0, 16)[0] == 0
