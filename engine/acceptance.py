"""`Acceptance`: how often a drafting sequence's next token is the one its track predicts, by the track's
match length (in powers of two) and by greedy or sampled. The drafters score every generated token into it
(engine/speculative.py); the draft-length policy reads it (engine/spec_policy.py)."""

from __future__ import annotations

# Prior hit rates by match length (1, 2-3, 4-7, 8-15, 16-31, 32-63, 64+), as measured on greedy
# replies of the default model to a rewrite, a story and an explanation; PRIOR_WEIGHT observations' worth.
PRIOR = (0.2, 0.4, 0.65, 0.85, 0.95, 0.95, 0.95)
PRIOR_WEIGHT = 4.0
DECAY = 0.98  # per observation of a class: the last ~50 count


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
        hits = self._hits.get(key, 0.0) + PRIOR[key[1] - 1] * PRIOR_WEIGHT
        return hits / (self._trials.get(key, 0.0) + PRIOR_WEIGHT)


def _bucket(match: int) -> int:
    return min(match.bit_length(), len(PRIOR))
