"""How long a draft should be: expected tokens per unit of step time, from what this engine measured.

A draft of k tokens makes its sequence's step k rows longer and, if its first j tokens are
accepted, yields j more tokens. Two running estimates price that:

- `Acceptance`: how often a sequence's next token is the one its track predicts, by the track's
  match length (in powers of two) and by greedy or sampled. Every generated token of a drafting
  sequence is scored (engine/speculative.py), drafted or not, so a class of matches that stopped
  drafting is still watched and drafts again once it pays.
- `StepCost`: the time of a decode step by its number of rows, a running mean per row count
  measured from the engine's own steps (interpolated between the counts seen, the prior slope
  `row_cost` beyond them). Extra rows cost whatever they cost on this machine, backend and
  activation mode: a few percent of a step on a GPU, most of a step on a small CPU.

`SpecPolicy.length` picks the k that maximizes the whole step's expected tokens per unit of time,
with drafts already given to the step's other sequences counted in: on a GPU drafts run long, on
a CPU only tracks that rarely fail are worth drafting, and with many sequences decoding hardly any.
"""
from __future__ import annotations

import bisect

from engine.speculative import Drafter

# Prior hit rates by match length (1, 2-3, 4-7, 8-15, 16-31, 32-63, 64+), as measured on greedy
# replies of the default model to a rewrite, a story and an explanation; PRIOR_WEIGHT observations' worth.
PRIOR = (0.2, 0.4, 0.65, 0.85, 0.95, 0.95, 0.95)
PRIOR_WEIGHT = 4.0
DECAY = 0.98  # per observation of a class: the last ~50 count
COST_WEIGHT = 0.2  # a new step time's weight in its row count's running mean
PRIOR_ROW_COST = 0.5  # an extra row's time relative to a one-row step, until measured


class Acceptance:
    """Running hit rates of track predictions by (greedy, match length class)."""

    __slots__ = ("_hits", "_trials")

    def __init__(self) -> None:
        self._hits: dict[tuple[bool, int], float] = {}
        self._trials: dict[tuple[bool, int], float] = {}

    def observe(self, greedy: bool, match: int, hit: bool) -> None:
        key = (greedy, _bucket(match))
        self._hits[key] = self._hits.get(key, 0.0) * DECAY + hit
        self._trials[key] = self._trials.get(key, 0.0) * DECAY + 1.0

    def p(self, greedy: bool, match: int) -> float:
        """The chance that the token after a `match`-long match is the track's (match >= 1)."""
        key = (greedy, _bucket(match))
        return (self._hits.get(key, 0.0) + PRIOR[key[1] - 1] * PRIOR_WEIGHT) / (self._trials.get(key, 0.0) + PRIOR_WEIGHT)


class StepCost:
    """A decode step's time by its rows; a fixed `row_cost` (relative to a one-row step) measures nothing."""

    __slots__ = ("row_cost", "_mean", "_known")

    def __init__(self, row_cost: float | None = None) -> None:
        self.row_cost = row_cost
        self._mean: dict[int, float] = {}  # rows -> running mean of seconds
        self._known: list[int] = []  # its keys, sorted

    def observe(self, rows: int, seconds: float) -> None:
        if self.row_cost is None:
            old = self._mean.get(rows)
            if old is None:
                bisect.insort(self._known, rows)
                self._mean[rows] = seconds
            else:
                self._mean[rows] = old + COST_WEIGHT * (seconds - old)

    def __call__(self, rows: int) -> float:
        """The time of a step of `rows` rows (in seconds where measured, else in one-row steps)."""
        if self.row_cost is not None or not self._mean:
            return 1.0 + (PRIOR_ROW_COST if self.row_cost is None else self.row_cost) * (rows - 1)
        mean, known = self._mean, self._known
        if rows in mean:
            return mean[rows]
        i = bisect.bisect(known, rows)
        if 0 < i < len(known):
            below, above = known[i - 1], known[i]
            return mean[below] + (mean[above] - mean[below]) * (rows - below) / (above - below)
        edge = known[0] if i == 0 else known[-1]  # beyond the counts seen: the prior's slope, to their scale
        per_row = mean[edge] * PRIOR_ROW_COST / (1.0 + PRIOR_ROW_COST * (edge - 1))
        return max(mean[edge] + per_row * (rows - edge), 0.0)


class SpecPolicy:
    """The engine's draft-length decisions, from its measured acceptance and step costs."""

    __slots__ = ("acceptance", "cost")

    def __init__(self, row_cost: float | None = None) -> None:
        self.acceptance = Acceptance()
        self.cost = StepCost(row_cost)

    def length(self, drafter: Drafter, rows: int, tokens: float, limit: int) -> tuple[int, float]:
        """Draft length for `drafter`'s sequence in a step that has `rows` rows and is expected to
        yield `tokens` tokens so far (its own row and token included), at most `limit`: the k that
        maximizes (tokens + expected accepted drafts) / step time, and that expected gain."""
        if drafter.src is None or limit <= 0:
            return 0, 0.0
        best_k, best_gain, gain, run = 0, 0.0, 0.0, 1.0
        best = tokens / self.cost(rows)
        for j in range(1, limit + 1):
            run *= self.acceptance.p(drafter.greedy, drafter.match + j - 1)  # all of the first j accepted
            if run < 0.01:
                break  # what longer drafts could add is negligible
            gain += run
            rate = (tokens + gain) / self.cost(rows + j)
            if rate > best:
                best, best_k, best_gain = rate, j, gain
        return best_k, best_gain


def _bucket(match: int) -> int:
    return min(match.bit_length(), len(PRIOR))
