"""N-gram (prompt lookup) speculative decoding: cheap drafts from the sequence's own tokens.

A sequence's last n tokens (n from `ngram_max` down to `ngram_min`) are looked up among its
prompt and output so far; the tokens that followed their most recent earlier occurrence are
the draft. The step verifies every drafted position in one forward pass (engine/sampling.py
has the exact acceptance rule), so a draft costs extra rows of a step, never extra steps.

When it pays: a decode step over few sequences is bound by reading the weights, so a few
more rows cost little; with many sequences decoding the step is bound by arithmetic and
drafts would slow everyone. The engine therefore gives drafts only the spare rows of a step
(`max_rows` minus the sequences decoding in it). Per sequence the draft length adapts: it
doubles after a fully accepted draft, drops to (accepted + 1) after a rejection, and a
sequence whose acceptance stays low stops drafting for `pause_tokens` tokens before trying
again with the shortest draft.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SpecConfig:
    mode: str = "ngram"  # "ngram" | "off": the default for requests that do not say
    min_k: int = 1  # draft length bounds
    max_k: int = 8
    ngram_min: int = 1
    ngram_max: int = 3
    max_rows: int = 16  # drafts use the rows of a step left after one per decoding sequence
    low_acceptance: float = 0.25  # below this (running mean) a sequence pauses drafting ...
    pause_tokens: int = 32  # ... for this many generated tokens

    def check(self) -> None:
        """Raise ValueError naming the first bad setting."""
        if self.mode not in ("off", "ngram"):
            raise ValueError(f"speculative must be 'off' or 'ngram', got {self.mode!r}")
        if not 1 <= self.min_k <= self.max_k:
            raise ValueError(f"draft length bounds need 1 <= min_k <= max_k, got {self.min_k}, {self.max_k}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"n-gram bounds need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")


class Drafter:
    """Prompt-lookup drafts for one sequence, with its adaptive draft length."""

    __slots__ = ("config", "k", "rate", "paused", "_index", "_indexed")

    def __init__(self, config: SpecConfig) -> None:
        self.config = config
        self.k = min(max(4, config.min_k), config.max_k)
        self.rate = 0.5  # running mean of the accepted fraction of a draft
        self.paused = 0  # tokens to go before drafting again
        # n -> {n-gram: position of the token that followed its most recent occurrence}
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(config.ngram_min, config.ngram_max + 1)}
        self._indexed = 0  # tokens whose n-grams are in the index as followers

    def propose(self, token_ids: list[int], limit: int) -> list[int]:
        """Up to min(k, limit) tokens that may come next; [] when nothing matches."""
        self._extend(token_ids)
        if self.paused or limit <= 0:
            return []
        k = min(self.k, limit)
        for n in range(self.config.ngram_max, self.config.ngram_min - 1, -1):
            pos = self._index[n].get(tuple(token_ids[-n:]))
            if pos is not None:
                return token_ids[pos : pos + k]
        return []

    def update(self, drafted: int, accepted: int, emitted: int) -> None:
        """After a step: `drafted` tokens were verified and `accepted` kept; `emitted` tokens were
        generated (pauses count down by generated tokens)."""
        cfg = self.config
        if not drafted:
            self.paused = max(0, self.paused - emitted)
            if not self.paused and self.rate < cfg.low_acceptance:
                self.rate, self.k = cfg.low_acceptance, cfg.min_k  # probe again, carefully
            return
        self.rate = 0.7 * self.rate + 0.3 * accepted / drafted
        self.k = min(cfg.max_k, 2 * self.k) if accepted == drafted else max(cfg.min_k, accepted + 1)
        if self.rate < cfg.low_acceptance:
            self.paused = cfg.pause_tokens

    def _extend(self, token_ids: list[int]) -> None:
        index, end = self._index, len(token_ids)
        for i in range(max(self._indexed, 1), end):  # token i follows the n-gram ending at i - 1
            for n, table in index.items():
                if i >= n:
                    table[tuple(token_ids[i - n : i])] = i
        self._indexed = end
