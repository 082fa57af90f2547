"""How long a draft should be: expected tokens per unit of step time, from what this engine measured.

A draft of k tokens makes its sequence's step k rows longer and, if its first j tokens are
accepted, yields j more tokens. Two running estimates price that:

- `Acceptance`: how often a sequence's next token is the one its track predicts, by the track's
  match length (in powers of two) and by greedy or sampled. Every generated token of a drafting
  sequence is scored (engine/speculative.py), drafted or not, so a class of matches that stopped
  drafting is still watched and drafts again once it pays.
- `StepCost`: the time of a decode step by its number of rows, relative to a one-row step, learnt
  from the engine's own steps (interpolated between the counts seen, the prior's slope beyond
  them), or fixed by `SpecConfig.row_cost`. Extra rows cost whatever they cost on this
  machine, backend and activation mode: little on a GPU, about half a one-row step on a 2-core CPU.

`SpecPolicy.length` picks the k that maximizes the whole step's expected tokens per unit of time,
with drafts already given to the step's other sequences counted in: on a GPU drafts run long, on
a CPU only tracks that rarely fail are worth drafting, and with many sequences decoding hardly any.
"""

from __future__ import annotations

import bisect

from engine.acceptance import PRIOR, Acceptance
from engine.sequence import Sequence
from engine.speculative import Drafter, SpecConfig

__all__ = ["PRIOR", "PRIOR_ROW_COST", "Acceptance", "SpecPolicy", "StepCost"]

LEVEL_WEIGHT = 0.3  # how fast the one-row step time follows each step
SHAPE_WEIGHT = 0.1  # how fast a row count's relative time follows its steps
PRIOR_ROW_COST = 0.5  # an extra row's time relative to a one-row step, until measured


class StepCost:
    """A decode step's time by its rows, as `level * shape(rows)`: the shape (1 at one row) is what
    rows cost relative to each other, learnt slowly; the level, a one-row step's time now, follows
    every step quickly, so that a machine getting busier or quieter does not leave the row counts
    measured earlier stale against those measured now. A fixed `row_cost` measures nothing."""

    __slots__ = ("row_cost", "level", "_shape", "_known")

    def __init__(self, row_cost: float | None = None) -> None:
        self.row_cost = row_cost
        self.level = 0.0  # seconds of a one-row step now (0: nothing measured yet)
        self._shape: dict[int, float] = {1: 1.0}  # rows -> a step's time in one-row steps, where measured
        self._known: list[int] = [1]  # its keys, sorted

    def observe(self, rows: int, seconds: float) -> None:
        if self.row_cost is not None:
            return
        shape = self.shape(rows)
        if not self.level:
            self.level = seconds / shape
            return
        surprise = min(max(seconds / (self.level * shape), 0.5), 2.0)  # one stalled step moves little
        self.level *= 1.0 + LEVEL_WEIGHT * (surprise - 1.0)
        if rows != 1:
            if rows not in self._shape:
                bisect.insort(self._known, rows)
            self._shape[rows] = shape * (1.0 + SHAPE_WEIGHT * (surprise - 1.0))

    def shape(self, rows: int) -> float:
        """A step of `rows` rows' time in one-row steps: learnt where measured, interpolated between,
        the prior's slope beyond (or the fixed `row_cost`)."""
        if self.row_cost is not None:
            return 1.0 + self.row_cost * (rows - 1)
        shape, known = self._shape, self._known
        if rows in shape:
            return shape[rows]
        i = bisect.bisect(known, rows)  # known[0] == 1 <= rows
        if i < len(known):
            below, above = known[i - 1], known[i]
            return shape[below] + (shape[above] - shape[below]) * (rows - below) / (above - below)
        return shape[known[-1]] + PRIOR_ROW_COST * (rows - known[-1])


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
        best = tokens / self.cost.shape(rows)
        for j in range(1, limit + 1):
            run *= self.acceptance.p(drafter.greedy, drafter.match + j - 1)  # all of the first j accepted
            if run < 0.01:
                break  # what longer drafts could add is negligible
            gain += run
            rate = (tokens + gain) / self.cost.shape(rows + j)
            if rate > best:
                best, best_k, best_gain = rate, j, gain
        return best_k, best_gain

    def propose(self, decoding: list[Sequence], spec: SpecConfig, max_context: int) -> None:
        """Set the drafts of a step's decoding sequences, each as long as it pays for the whole step."""
        rows, tokens = len(decoding), float(len(decoding))  # the step's rows and expected tokens so far
        for seq in decoding:
            seq.draft = []
            if seq.drafter is None:
                continue
            params = seq.request.params
            limit = min(
                spec.max_k,
                spec.max_rows - rows,
                params.max_tokens - seq.num_output - 1,
                max_context - seq.num_tokens - 1,
            )
            k, gain = self.length(seq.drafter, rows, tokens, limit)
            draft = seq.drafter.draft(seq.token_ids, k)
            if draft and seq.matcher is not None:  # only grammar-valid drafts are scored
                draft = draft[: seq.matcher.validate_tokens(draft)]
            seq.draft = draft
            rows += len(draft)
            tokens += gain
