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
    cost.observe(1, 5.0)
    assert (cost(1), cost(5)) == (1.0, 2.0)


def test_step_cost_is_a_running_mean_per_row_count_and_interpolated_between():
    cost = StepCost()
    assert cost(3) == 1.0 + 2 * PRIOR_ROW_COST  # nothing measured: the prior, in one-row steps
    cost.observe(4, 0.020)
    per_row = 0.020 * PRIOR_ROW_COST / (1 + 3 * PRIOR_ROW_COST)  # the prior's slope at the one known count
    assert cost(1) == pytest.approx(0.020 - 3 * per_row) and cost(6) == pytest.approx(0.020 + 2 * per_row)
    cost.observe(1, 0.010)
    cost.observe(1, 0.020)  # a running mean: 0.010 + 0.2 * (0.020 - 0.010)
    assert cost(1) == pytest.approx(0.012)
    assert cost(2) == pytest.approx(0.012 + (0.020 - 0.012) / 3)  # between the counts seen
    assert cost(4) == 0.020


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
    for rows in (1, 17):
        cheap.cost.observe(rows, 0.010 + 0.0001 * rows)  # a GPU: a verify step costs about a decode step
        dear.cost.observe(rows, 0.014 * (1 + 0.65 * (rows - 1)))  # this CPU
    d = drafter_with_match(4)
    assert cheap.length(d, 1, 1.0, 16)[0] > 4 and dear.length(d, 1, 1.0, 16)[0] == 0
