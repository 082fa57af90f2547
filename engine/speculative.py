"""N-gram (prompt lookup) speculative decoding: cheap drafts from the sequence's own tokens.

A sequence follows a *track*: an earlier position in its prompt or output whose preceding tokens
match the sequence's last tokens. When it has none, the most recent `CANDIDATES` occurrences of
its last two tokens are compared backward with its tail and the longest match becomes the track
(the most recent occurrence of its last token when no pair matches). The track is kept for as long
as the generated tokens go on matching it (prompt-lookup decoding's "stay on the track"): a copied
passage keeps its source instead of jumping to a shorter or merely more recent match. A draft is
the track's next tokens; the step verifies all of them in one forward pass (engine/sampling.py has
the exact acceptance rule), so a draft costs extra rows of a step, never extra steps.

Every generated token, drafted or not, is also scored against the track's prediction, by match
length: engine/spec_policy.py turns those hit rates and the measured cost of a step's rows into
each draft's length (none when drafting would not pay).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.acceptance import Acceptance

MAX_MATCH = 64  # match lengths are counted up to this
CANDIDATES = 32  # occurrences of the last two tokens compared when looking for a track


@dataclass(slots=True)
class SpecConfig:
    mode: str = "ngram"  # "ngram" | "off": the default for requests that do not say
    max_k: int = 16  # the longest draft
    max_rows: int = 32  # the most rows (tokens) a decode step may reach with drafts
    row_cost: float | None = None  # one more row's time relative to a one-row step; None: measured online

    def check(self) -> None:
        """Raise ValueError naming the first bad setting."""
        if self.mode not in ("off", "ngram"):
            raise ValueError(f"speculative must be 'off' or 'ngram', got {self.mode!r}")
        if self.max_k < 1 or self.max_rows < 1:
            raise ValueError(f"max_k and max_rows must be >= 1, got {self.max_k}, {self.max_rows}")
        if self.row_cost is not None and not self.row_cost >= 0:
            raise ValueError(f"row_cost must be None or >= 0, got {self.row_cost}")


class Drafter:
    """One sequence's track over its own tokens, and the scoring of its predictions."""

    __slots__ = ("prompt_len", "acceptance", "greedy", "src", "match", "_after_pair", "_after_token", "_seen")

    def __init__(self, prompt_len: int, acceptance: Acceptance | None = None, greedy: bool = True) -> None:
        self.prompt_len = prompt_len
        self.acceptance, self.greedy = acceptance, greedy  # where generated tokens are scored, and as what
        self.src: int | None = None  # the track: position of the token predicted to come next
        self.match = 0  # how many tokens before `src` equal the sequence's last tokens (up to MAX_MATCH)
        self._after_pair: dict[tuple[int, ...], list[int]] = {}  # two tokens -> positions that followed them
        self._after_token: dict[int, int] = {}  # a token -> the position that followed it last
        self._seen = 0  # tokens taken in

    def observe(self, token_ids: list[int]) -> None:
        """Take in the tokens appended since the last call: score the track's prediction of each
        generated one, follow the track while they match it, find a new one where it breaks."""
        src = self.src
        for i in range(self._seen, len(token_ids)):
            if src is not None:
                hit = token_ids[src] == token_ids[i]
                if self.acceptance is not None and i >= self.prompt_len:
                    self.acceptance.observe(self.greedy, self.match, hit)
                src = src + 1 if hit else None
                self.match = min(self.match + 1, MAX_MATCH) if hit else 0
            if i >= 1:
                self._after_token[token_ids[i - 1]] = i
            if i >= 2:
                self._after_pair.setdefault((token_ids[i - 2], token_ids[i - 1]), []).append(i)
        self._seen = len(token_ids)
        self.src = src if src is not None else self._lookup(token_ids)

    def draft(self, token_ids: list[int], k: int) -> list[int]:
        """The track's next k tokens (fewer where it reaches the end; [] without a track)."""
        return token_ids[self.src : self.src + k] if self.src is not None and k > 0 else []

    def _lookup(self, token_ids: list[int]) -> int | None:
        end = len(token_ids)
        best, self.match = None, 0
        for src in reversed(self._after_pair.get(tuple(token_ids[-2:]), [])[-CANDIDATES:]):
            m = 2
            while m < MAX_MATCH and m < src and token_ids[src - m - 1] == token_ids[end - m - 1]:
                m += 1
            if m > self.match:
                best, self.match = src, m
        if best is None and end and (best := self._after_token.get(token_ids[-1])) is not None:
            self.match = 1
        return best
